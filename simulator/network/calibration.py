"""Per-link-class efficiency: the fraction of line rate NCCL achieves on each kind of link (protocol overhead).

`calibrated` is fitted to measured nccl-tests figures:
- nvlink: the cluster's GPU, its NCCL ring all-reduce busbw on 8 GPUs over the line rate per direction
  (catalog/kernels.yaml `nvlink`, source nccl-nvlink): A100 230/300, H100 and H200 370/450, B200 695/900. The
  NVLink generation sets it (NVLink 4 carries more of its line rate than NVLink 3), so it is the GPU's, not one
  figure for every NVLink.
- infiniband: one NDR 400 Gb/s NIC achieves 46-48 GB/s of 50 GB/s -> 47/50 (NVIDIA/nccl-tests#290).
- ethernet, pcie, c2c: no measured figure in the reference set; assumed like InfiniBand (RoCE), ~80% for PCIe,
  and the GPU's NVLink for NVLink-C2C. `FIXED` marks each class measured or assumed.
`ideal` is line rate everywhere, as the textbook closed forms and the seed chapters compute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import get_args

from simulator.catalog.calibration import nvlink_efficiency
from simulator.config.link_classes import EfficiencyProfile, LinkClass
from simulator.errors import ScenarioError


@dataclass(frozen=True)
class LinkEfficiency:
    """A link class's calibrated fraction of line rate, whether a kernel-level benchmark measured it, and where it
    comes from (the measurement, or why the value is assumed)."""

    fraction: float
    measured: bool
    source: str


FIXED: Mapping[LinkClass, LinkEfficiency] = {
    "infiniband": LinkEfficiency(47.0 / 50.0, True, "nccl-tests on one NDR 400 Gb/s NIC: 46-48 of 50 GB/s "
                                                     "(NVIDIA/nccl-tests#290)"),
    "ethernet": LinkEfficiency(47.0 / 50.0, False, "InfiniBand's figure, held for RoCE: no Ethernet measurement"),
    "pcie": LinkEfficiency(0.80, False, "~80% of line rate: no PCIe measurement"),
}
"""The classes whose calibrated efficiency does not depend on the GPU (c2c takes the GPU's NVLink figure,
assumed too)."""
PROFILES: tuple[EfficiencyProfile, ...] = get_args(EfficiencyProfile)


def calibrated(gpu_model: str) -> dict[LinkClass, float]:
    """The calibrated efficiency of every link class on a cluster of ``gpu_model`` GPUs."""
    nvlink = nvlink_efficiency(gpu_model)
    return {"nvlink": nvlink, **{link_class: fixed.fraction for link_class, fixed in FIXED.items()}, "c2c": nvlink}


def resolve_efficiency(setting: str | Mapping[LinkClass, float], gpu_model: str,
                       field: str = "network.efficiency") -> dict[LinkClass, float]:
    """Turn a profile name or a per-class mapping (over the calibrated defaults of ``gpu_model``) into a full
    mapping. The schema has checked a scenario's classes and fractions at load; a name comes from `trainsim
    collective`'s `--efficiency` too."""
    defaults = calibrated(gpu_model)
    if isinstance(setting, str):
        if setting not in PROFILES:
            raise ScenarioError(f"unknown efficiency profile {setting!r}", field=field,
                                allowed=", ".join(PROFILES) + ", or a mapping link class -> fraction")
        return defaults if setting == "calibrated" else {name: 1.0 for name in defaults}
    return {**defaults, **{link_class: float(value) for link_class, value in setting.items()}}
