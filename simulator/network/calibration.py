"""Per-link-class efficiency: the fraction of line rate NCCL achieves on each kind of link (protocol overhead).

`calibrated` is fitted to measured nccl-tests figures (hardware.md in the project's reference data):
- nvlink: 8x A100 SXM all_reduce busbw ~230 GB/s at 8 GiB on 300 GB/s per direction -> 230/300.
- infiniband: one NDR 400 Gb/s NIC achieves 46-48 GB/s of 50 GB/s -> 47/50.
- ethernet, pcie, c2c: no measured figure in the reference set; assumed like InfiniBand (RoCE) and ~80% for PCIe.
`ideal` is line rate everywhere, as the textbook closed forms and the seed chapters compute.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from simulator.config.link_classes import LinkClass
from simulator.errors import ScenarioError

CALIBRATED: Mapping[LinkClass, float] = MappingProxyType({
    "nvlink": 230.0 / 300.0,
    "infiniband": 47.0 / 50.0,
    "ethernet": 47.0 / 50.0,
    "pcie": 0.80,
    "c2c": 230.0 / 300.0,
})
IDEAL = MappingProxyType({name: 1.0 for name in CALIBRATED})
PROFILES: dict[str, Mapping[LinkClass, float]] = {"calibrated": CALIBRATED, "ideal": IDEAL}


def resolve_efficiency(setting: str | Mapping[LinkClass, float], field: str = "network.efficiency"
                       ) -> dict[LinkClass, float]:
    """Turn a profile name or a per-class mapping (over the calibrated defaults) into a full mapping. The
    schema has checked a scenario's classes and fractions at load; a name comes from `trainsim collective`'s
    `--efficiency` too."""
    if isinstance(setting, str):
        if setting not in PROFILES:
            raise ScenarioError(f"unknown efficiency profile {setting!r}", field=field,
                                allowed=", ".join(PROFILES) + ", or a mapping link class -> fraction")
        return dict(PROFILES[setting])
    return {**CALIBRATED, **{link_class: float(value) for link_class, value in setting.items()}}
