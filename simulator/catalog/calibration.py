"""The kernel data file kernels.yaml, read once: per GPU the kernel-level measurements (GEMM and attention
microbenchmarks, HBM streaming, sustained clocks, kernel families), NCCL's channel counts, NVLink and NVLS
efficiencies and the TP-overlap settings, each naming its source; no end-to-end training table is used.

This module only reads: the models that take the figures build their own types from it (the roofline's
`Efficiency`, `TPOverlap`, `SmShare`: workload/calibrated.py), so the catalog imports none of them.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import MappingProxyType

import yaml

KERNELS_FILE = Path(__file__).with_name("kernels.yaml")


@cache
def kernel_data() -> MappingProxyType:
    """The parsed kernels.yaml: ``sources`` (key -> citation) and ``gpus`` (name -> entry); read by libyaml's
    safe loader where PyYAML has it (a tenth of the pure-Python parser's 20 ms, the same data)."""
    return MappingProxyType(yaml.load(KERNELS_FILE.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def network_channels_per_nic() -> int:
    """Channels NCCL runs through each NIC a collective drives across hosts (collectives/channels.py)."""
    return int(kernel_data()["nccl"]["network_channels_per_nic"])


def max_channels() -> int:
    """NCCL's channel cap (MAXCHANNELS): no collective runs on more channels."""
    return int(kernel_data()["nccl"]["max_channels"])


def nvlink_efficiency(gpu_name: str) -> float:
    """The fraction of its NVLink line rate NCCL's ring all-reduce reaches on ``gpu_name`` (kernels.yaml
    ``nvlink``: measured busbw over line rate per direction)."""
    entry = kernel_data()["gpus"][gpu_name]["nvlink"]
    return float(entry["busbw_gbps"]) / float(entry["line_rate_gbps"])


def nvlink_line_rate(gpu_name: str) -> float:
    """The NVLink bandwidth per direction, in bytes/s, of the generation of ``gpu_name`` (kernels.yaml ``nvlink``'s
    line rate: 300 GB/s on A100, 450 on H100 and H200, 900 on B200 and GB200)."""
    return float(kernel_data()["gpus"][gpu_name]["nvlink"]["line_rate_gbps"]) * 1e9


def nvls_efficiency(gpu_name: str) -> float | None:
    """The fraction of the ring's NVLink bandwidth NVLS's in-switch reduction reaches on ``gpu_name`` (kernels.yaml
    ``nvls``, NCCL's tuner); None for a GPU without NVLink SHARP."""
    entry = kernel_data()["gpus"][gpu_name].get("nvls")
    return None if entry is None else float(entry["efficiency"])
