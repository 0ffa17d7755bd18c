"""A trace moved to another GPU (`workload.traced_gpu`): each traced compute op's duration scaled by how much
faster the traced GPU runs what bounds the op than the cluster's GPU does.

An op's class comes from its name, once, through model.py's KERNEL_KINDS (the one table of name patterns):
matrix multiplies are bound by the tensor cores at their precision, attention kernels by their pass's calibrated
rate at their key length, elementwise, norm, softmax, reduction, optimizer and copy kernels (and memcpy /
memset) by HBM bandwidth. A kernel of no known kind keeps the ratio of the dense bf16 peaks and is counted. Each
rate on a GPU is the roofline's calibrated plateau (catalog/kernels.yaml through workload/calibrated.py), so
moving an H100 trace to an H200 (the same bf16 peak, 1.43x the HBM bandwidth) speeds up its memory-bound kernels
and not its GEMMs. The roofline runs every kernel, whatever bounds it, for its time at the bounding rate plus
its GPU's ramp for the kernel's kind (launch and tail loss, `Efficiency.ramp`, read from kernels.yaml as the
modelled step reads it: `GpuMove.ramps`): a kernel's time within the traced GPU's ramp does not move by the
rate, and becomes the cluster GPU's ramp. The tile factor, the other small-size term, is one function of a
GEMM's smallest side with the same half size on every catalogued GPU, so it cancels in the ratio. Wave
quantization (kernels.yaml `gemm.waves`: the A100's) does not: a GEMM moved to or from such a GPU whose launching
matrix multiply records its shape takes the ratio of the two GPUs' plateaus for that shape, waves included
(roofline.matmul_plateau, the modelled step's); one of no recorded shape, the plateaus' (docs/traces.md).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from types import MappingProxyType
from typing import Literal, NamedTuple

from simulator.catalog.gpus import GPUS, GPUSpec
from simulator.config.training_options import MathPrecision
from simulator.errors import ScenarioError
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.roofline import DEFAULT_RAMP_S, attention_plateau, matmul_plateau
from simulator.workload.traces.model import GEMM_PRECISIONS, GemmShape, TracedOp, kernel_kind
from simulator.workload.transformer import KernelKind

KernelClass = Literal["matmul", "attention", "memory-bound", "unknown"]
KERNEL_CLASSES: Mapping[str, KernelClass] = MappingProxyType({
    "matmul": "matmul", "attention": "attention", "elementwise": "memory-bound", "memory": "memory-bound",
    "": "unknown"})
"""model.py kernel_kind -> the class whose rate bounds the kernel."""
BOUNDS: Mapping[KernelClass, tuple[str, str]] = MappingProxyType({
    "matmul": ("dense peak x calibrated matmul plateau (achievable x sustained clock), at the GEMM's precision",
               "FLOP/s"),
    "attention": ("dense bf16 peak x calibrated attention plateau of the kernel's pass at its key length",
                  "FLOP/s"),
    "memory-bound": ("HBM bandwidth x calibrated memory fraction", "B/s"),
    "unknown": ("dense bf16 peak", "FLOP/s"),
})
"""What bounds each class, and the unit of that rate."""
RAMP_KINDS: Mapping[KernelClass, KernelKind | None] = MappingProxyType({
    "matmul": "matmul", "attention": "attention", "memory-bound": "elementwise", "unknown": None})
"""The roofline's kernel kind whose ramp each class takes (None: a kernel of no known kind, the unmeasured
default)."""
PEAK_PRECISION: MathPrecision = "bf16"
"""The precision of the dense peaks that bound attention, unknown kernels and GEMMs of no told precision (the
roofline runs attention at bf16 under fp8 too)."""
TF32_NAME = re.compile(r"tf32|tensorop_s1688gemm(?!_b?f16)", re.I)
"""A GEMM kernel doing tensor-core TF32 math on fp32 inputs, by its name (xmma's f32f32_tf32f32, cuBLAS's
sm80_xmma_gemm_tf32..., or CUTLASS's tensorop_s1688gemm with no _f16/_bf16 input suffix: the m16n8k8 tensor-core
MMA on fp32 inputs, which cuBLAS often picks on A100 under allow_tf32): an fp32 matmul under allow_tf32 launches
one."""
GEMM_NAME_PRECISIONS: tuple[tuple[MathPrecision, re.Pattern[str]], ...] = (
    ("fp8", re.compile(r"e4m3|e5m2", re.I)), ("tf32", TF32_NAME), ("fp32", re.compile(r"sgemm|f32f32_f32f32", re.I)))
"""A GEMM kernel's precision by its name, where its launching op tells none: fp8 by its element types, tf32 by
its math, fp32 by cuBLAS's SIMT sgemm and xmma's f32 inputs with f32 math (bf16 kernels accumulate in f32,
bf16f32)."""
BACKWARD = re.compile(r"bprop|bwd|backward|cutlassB", re.I)
"""An attention kernel of the backward pass, by name (cuDNN's sdpa ..._bprop, FlashAttention's ..._bwd_...,
PyTorch's memory-efficient fmha_cutlassB; the forward's fmha_cutlassF)."""
AttentionPass = Literal["", "forward", "backward"]
KeySource = Literal["", "trace", "assumed"]


class Bound(NamedTuple):
    """What bounds one traced compute op: its class and the ``precision`` of the peak (a matrix multiply's own,
    else bf16); for an attention kernel its ``attention_pass`` and the ``key_length`` its rates are read at,
    from the launching op's recorded shapes (``key_source`` 'trace') or, where the trace tells none, the longest
    that both GPUs' tables of that pass measure ('assumed'); for a GEMM moved to or from a GPU whose GEMMs run
    in waves, its recorded (batch, m, n, k) ``gemm`` (() where not recorded, or neither GPU has waves)."""

    kind: KernelClass
    precision: MathPrecision = "bf16"
    attention_pass: AttentionPass = ""
    key_length: int = 0
    key_source: KeySource = ""
    gemm: GemmShape = ()


def kernel_class(name: str) -> KernelClass:
    """The class of a traced compute op, by its name."""
    return KERNEL_CLASSES[kernel_kind(name)]


def told_precision(op: TracedOp) -> MathPrecision | None:
    """The precision a GEMM kernel's launching op tells by its `Input type`, fp32 inputs running tf32 math where
    the kernel's name says tf32; None where it tells none. The one reading of both the GPU move and
    `recost_gemms`."""
    told = GEMM_PRECISIONS.get(op.dtype.lower())
    if told == "fp32" and TF32_NAME.search(op.name):
        return "tf32"
    return told


def gemm_precision(op: TracedOp) -> MathPrecision:
    """The precision of a GEMM kernel: as its launching op tells it (`told_precision`), else its name, else
    bf16."""
    told = told_precision(op)
    if told is not None:
        return told
    return next((precision for precision, pattern in GEMM_NAME_PRECISIONS if pattern.search(op.name)), PEAK_PRECISION)


def common_key_length(traced: GPUSpec, cluster: GPUSpec, backward: bool) -> int:
    """The longest key length that both GPUs' attention tables of the pass measure (a GPU without a table
    imposes none; 0 where neither has one)."""
    ends = [table[-1][0] for gpu in (traced, cluster)
            if (table := _table(gpu, backward))]
    return int(min(ends)) if ends else 0


def _table(gpu: GPUSpec, backward: bool) -> tuple[tuple[float, float], ...]:
    efficiency = calibrated_efficiency(gpu.name)
    return efficiency.attention_backward if backward else efficiency.attention_forward


def quantizes_waves(gpu: GPUSpec) -> bool:
    """Whether ``gpu``'s GEMM kernels run one thread block per tile in waves (kernels.yaml `gemm.waves`)."""
    return calibrated_efficiency(gpu.name).wave_sms > 0


def gemm_plateau(gpu: GPUSpec, precision: MathPrecision, shape: GemmShape) -> float:
    """The roofline's compute plateau on ``gpu`` of a GEMM of (batch, m, n, k) ``shape`` at ``precision``: its tile
    factor and waves over ``gpu``'s SMs, as the modelled step runs a GEMM of that output (roofline.matmul_plateau);
    the plateau of a very large GEMM where the shape is not known (())."""
    efficiency = calibrated_efficiency(gpu.name, precision)
    if not shape:
        return efficiency.matmul_peak
    batch, m, n, k = shape
    return matmul_plateau(efficiency, min(m, n, k), (batch, m, n))


@cache
def bounding_rate(gpu: GPUSpec, bound: Bound, where: str) -> float:
    """The rate that bounds ``bound``'s kernels on ``gpu`` (FLOP/s or B/s: BOUNDS), at its calibrated plateau
    (the roofline's defaults for a GPU kernels.yaml lacks), a GEMM's for its shape where the bound has one; GEMMs
    of a precision ``gpu`` has no peak for (fp8 on an A100) are refused at ``where``."""
    if bound.kind == "matmul":
        if bound.precision not in gpu.peak_flops:
            raise ScenarioError(f"GPU {gpu.name!r} has no {bound.precision} peak for the trace's {bound.precision} "
                                "GEMM kernels", field=where, allowed="a GPU with one: " + ", ".join(
                                    name for name, spec in GPUS.items() if bound.precision in spec.peak_flops))
        return gpu.peak(bound.precision) * gemm_plateau(gpu, bound.precision, bound.gemm)
    efficiency = calibrated_efficiency(gpu.name)
    if bound.kind == "attention":
        return gpu.peak(PEAK_PRECISION) * attention_plateau(efficiency, bound.key_length,
                                                            bound.attention_pass == "backward")
    if bound.kind == "memory-bound":
        return gpu.hbm_bandwidth * efficiency.memory_peak
    return gpu.peak(PEAK_PRECISION)


@dataclass(frozen=True)
class GpuMove:
    """Moves each traced compute op's duration from the GPU ``traced`` to ``cluster`` (None: the trace does not
    move) and multiplies it by `compute_scale`."""

    compute_scale: float
    traced: GPUSpec | None = None
    cluster: GPUSpec | None = None

    @cached_property
    def _waves(self) -> bool:
        """Whether either GPU of the move runs its GEMMs in waves, so a GEMM's ratio depends on its shape."""
        if self.traced is None or self.cluster is None:
            return False
        return quantizes_waves(self.traced) or quantizes_waves(self.cluster)

    def ramps(self, kind: KernelClass) -> tuple[float, float]:
        """The launch and tail time of a kernel of class ``kind`` on the traced GPU and on the cluster's: each GPU's
        calibrated ramp of the class's kernel kind (`Efficiency.ramp`, the one the modelled step runs that kind
        with; kernels.yaml `<gemm|attention|memory>.ramp_time_s`), the unmeasured default for a kernel of unknown
        kind. (0, 0) where the trace does not move."""
        if self.traced is None or self.cluster is None:
            return 0.0, 0.0
        ramp_kind = RAMP_KINDS[kind]
        if ramp_kind is None:
            return DEFAULT_RAMP_S, DEFAULT_RAMP_S
        return (calibrated_efficiency(self.traced.name).ramp(ramp_kind),
                calibrated_efficiency(self.cluster.name).ramp(ramp_kind))

    def bound(self, op: TracedOp) -> Bound:
        """What bounds the traced compute op ``op``."""
        kind = kernel_class(op.name)
        if kind == "matmul":
            return Bound(kind, gemm_precision(op), gemm=op.gemm if self._waves else ())
        if kind == "attention" and self.traced is not None and self.cluster is not None:
            backward = bool(BACKWARD.search(op.name))
            attention_pass: AttentionPass = "backward" if backward else "forward"
            if op.key_length:
                return Bound(kind, attention_pass=attention_pass, key_length=op.key_length, key_source="trace")
            return Bound(kind, attention_pass=attention_pass, key_source="assumed",
                         key_length=common_key_length(self.traced, self.cluster, backward))
        return Bound(kind)

    def ratio(self, bound: Bound) -> float:
        """The factor the move puts on the durations of ``bound``'s ops beyond the ramp, traced rate over cluster
        rate (1 where the trace does not move)."""
        if self.traced is None or self.cluster is None:
            return 1.0
        return (bounding_rate(self.traced, bound, "workload.traced_gpu")
                / bounding_rate(self.cluster, bound, "cluster.gpu_model"))

    def duration(self, op: TracedOp) -> float:
        """The replayed duration of the traced compute op ``op``: moved, then times `compute_scale`. The roofline
        runs every kernel for its time at its bounding rate plus its GPU's ramp, so a kernel's time beyond the
        traced GPU's ramp moves by the ratio and the ramp becomes the cluster GPU's; a kernel within the ramp is
        all launch and tail, scaled by the two ramps. An op that ran on the host (TracedOp.host) does not move."""
        if self.traced is None or op.host:
            return op.duration_s * self.compute_scale
        bound = self.bound(op)
        ramp, cluster_ramp = self.ramps(bound.kind)
        if ramp and op.duration_s <= ramp:
            return op.duration_s * cluster_ramp / ramp * self.compute_scale
        return (cluster_ramp + (op.duration_s - ramp) * self.ratio(bound)) * self.compute_scale

    def details(self, ops: Iterable[TracedOp]) -> dict:
        """The summary's account of the move over the traced compute ops ``ops`` (host ops, which do not move,
        left out): the two GPUs' ramps; per class the ops counted, those within the traced GPU's ramp,
        what bounds them and the unit of that rate, and per distinct bound (a GEMM precision and, to or from an
        A100, its recorded shape; an attention pass and key length) its ops, its rate on each GPU and their
        ratio, traced over cluster: the factor on the durations beyond the ramp, before `compute_scale`."""
        assert self.traced is not None and self.cluster is not None
        ops = [op for op in ops if not op.host]
        bounds_of_ops = [self.bound(op) for op in ops]
        counts = Counter(bounds_of_ops)
        classes: dict[str, dict] = {}
        for kind, (text, unit) in BOUNDS.items():
            bounds = sorted(bound for bound in counts if bound.kind == kind)
            ramp, cluster_ramp = self.ramps(kind)
            classes[kind] = {"ops": sum(counts[bound] for bound in bounds), "bound": text, "rate_unit": unit,
                             "ramp_time_s": {"from": ramp, "to": cluster_ramp},
                             "ops_within_ramp": sum(1 for op, bound in zip(ops, bounds_of_ops, strict=True)
                                                    if bound.kind == kind and op.duration_s <= ramp),
                             "rates": [self._rates(bound, counts[bound]) for bound in bounds]}
        return {"from": self.traced.name, "to": self.cluster.name, "classes": classes}

    def _rates(self, bound: Bound, ops: int) -> dict:
        assert self.traced is not None and self.cluster is not None
        told: dict[str, object] = {}
        if bound.kind == "matmul":
            told = {"precision": bound.precision, **({"shape": list(bound.gemm)} if bound.gemm else {})}
        elif bound.kind == "attention":
            told = {"pass": bound.attention_pass, "key_length": bound.key_length, "key_length_from": bound.key_source}
        return {**told, "ops": ops, "traced_gpu_rate": bounding_rate(self.traced, bound, "workload.traced_gpu"),
                "cluster_gpu_rate": bounding_rate(self.cluster, bound, "cluster.gpu_model"),
                "duration_ratio": self.ratio(bound)}
