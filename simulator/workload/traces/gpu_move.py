"""A trace moved to another GPU (`workload.traced_gpu`): each traced compute op's duration scaled by how much
faster the traced GPU runs what bounds the op than the cluster's GPU does.

An op's class comes from its name, once, through model.py's KERNEL_KINDS (the one table of name patterns):
matrix multiplies are bound by the tensor cores, attention kernels by their own calibrated rate, elementwise,
norm, softmax, reduction, optimizer and copy kernels (and memcpy / memset) by HBM bandwidth. A kernel of no
known kind keeps the ratio of the dense bf16 peaks and is counted. Each class's rate on a GPU is its calibrated
plateau (catalog/kernels.yaml through workload/calibrated.py), so moving an H100 trace to an H200 (the same
bf16 peak, 1.43x the HBM bandwidth) speeds up its memory-bound kernels and not its GEMMs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from simulator.catalog.gpus import GPUSpec
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.traces.model import kernel_kind

KernelClass = Literal["matmul", "attention", "memory-bound", "unknown"]
KERNEL_CLASSES: Mapping[str, KernelClass] = MappingProxyType({
    "matmul": "matmul", "attention": "attention", "elementwise": "memory-bound", "memory": "memory-bound",
    "": "unknown"})
"""model.py kernel_kind -> the class whose rate bounds the kernel."""
BOUNDS: Mapping[KernelClass, tuple[str, str]] = MappingProxyType({
    "matmul": ("dense bf16 peak x calibrated matmul plateau (achievable x sustained clock)", "FLOP/s"),
    "attention": ("dense bf16 peak x calibrated attention plateau (the forward table's highest fraction)", "FLOP/s"),
    "memory-bound": ("HBM bandwidth x calibrated memory fraction", "B/s"),
    "unknown": ("dense bf16 peak", "FLOP/s"),
})
"""What bounds each class, and the unit of that rate."""
PEAK_PRECISION = "bf16"
"""The precision of the dense peaks that bound matrix multiplies, attention and unknown kernels."""


def kernel_class(name: str) -> KernelClass:
    """The class of a traced compute op, by its name."""
    return KERNEL_CLASSES[kernel_kind(name)]


def bounding_rates(gpu: GPUSpec) -> dict[KernelClass, float]:
    """Per class, the rate that bounds its kernels on ``gpu`` (FLOP/s or B/s: BOUNDS), at the calibrated
    plateaus of ``gpu`` (the roofline's defaults for a GPU kernels.yaml lacks)."""
    efficiency = calibrated_efficiency(gpu.name)
    peak = gpu.peak(PEAK_PRECISION)
    attention = max((fraction for _, fraction in efficiency.attention_forward), default=efficiency.attention_peak)
    return {"matmul": peak * efficiency.matmul_peak, "attention": peak * attention,
            "memory-bound": gpu.hbm_bandwidth * efficiency.memory_peak, "unknown": peak}


@dataclass(frozen=True)
class GpuMove:
    """The factor on each traced compute op's duration: `compute_scale`, times, where the trace was taken on the
    GPU ``traced`` and replays on ``cluster``, its class's rate on the traced GPU (``traced_rates``) over that on
    the cluster's (``cluster_rates``); no rates where the trace does not move."""

    compute_scale: float
    traced: str = ""
    cluster: str = ""
    traced_rates: Mapping[KernelClass, float] = field(default_factory=lambda: MappingProxyType({}))
    cluster_rates: Mapping[KernelClass, float] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def between(cls, compute_scale: float, traced: GPUSpec | None, cluster: GPUSpec) -> GpuMove:
        """The move from ``traced`` (None: the trace stays where it is) to ``cluster``."""
        if traced is None:
            return cls(compute_scale)
        return cls(compute_scale, traced.name, cluster.name, MappingProxyType(bounding_rates(traced)),
                   MappingProxyType(bounding_rates(cluster)))

    def ratio(self, kind: KernelClass) -> float:
        """The factor the move puts on the durations of ``kind``'s ops (1 where the trace does not move)."""
        if not self.traced_rates:
            return 1.0
        return self.traced_rates[kind] / self.cluster_rates[kind]

    def factor(self, name: str) -> float:
        """The factor on the traced duration of the compute op ``name``."""
        if not self.traced_rates:
            return self.compute_scale
        return self.compute_scale * self.ratio(kernel_class(name))

    def details(self, names: Iterable[str]) -> dict:
        """The summary's account of the move over the traced compute ops ``names``: per class the ops counted,
        what bounds them, that rate on each GPU (in ``rate_unit``) and their ratio, traced over cluster: the
        factor on the class's durations before `compute_scale`."""
        counts = Counter(kernel_class(name) for name in names)
        return {"from": self.traced, "to": self.cluster,
                "classes": {kind: {"ops": counts.get(kind, 0), "bound": bound, "rate_unit": unit,
                                   "traced_gpu_rate": self.traced_rates[kind],
                                   "cluster_gpu_rate": self.cluster_rates[kind], "duration_ratio": self.ratio(kind)}
                            for kind, (bound, unit) in BOUNDS.items()}}
