"""Kernel durations from a roofline with efficiency curves: max(compute time, memory time) at achieved rates.

duration = max(flops / (peak * eff_compute), hbm_bytes / (hbm_bandwidth * eff_memory)), where each efficiency is
a plateau value times saturating factors x / (x + x_half) in the kernel's size, so small kernels run further
below peak than large ones. The parameters live in ``Efficiency`` so a calibration can replace them as data;
docs/cost-model.md gives the sources of the defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache
from operator import attrgetter
from typing import assert_never

from simulator.catalog.gpus import GPUSpec
from simulator.config.training_options import MathPrecision, Precision
from simulator.errors import ScenarioError
from simulator.workload.transformer import MEASURED_KERNELS, Kernel, KernelKind, MemoryKind

DEFAULT_RAMP_S = 2e-6
"""A kernel's launch and tail seconds where no kernel timing of its kind on its GPU was fitted (kernels.yaml
`default-ramp`): not measured."""


@dataclass(frozen=True)
class Efficiency:
    """Plateau efficiencies and half-saturation sizes of the roofline's efficiency curves.

    matmul_peak: fraction of tensor peak a very large GEMM reaches; matmul_half_dim: smallest GEMM dimension at
    which the tile factor is 1/2. attention_peak / attention_half_len: the same for the attention core in the key
    length. elementwise_peak: fraction of the CUDA-core fp32 peak for elementwise FLOPs. memory_peak: fraction of
    HBM bandwidth a streaming kernel reaches. matmul_ramp / attention_ramp / elementwise_ramp: launch and
    tail-wave loss in seconds of a kernel of that kind (`ramp`), whatever bounds it; the rate is the plateau rate
    times t / (t + ramp), t the time at the plateau rate, so every kernel takes t + ramp.
    attention_forward / attention_backward: measured (key length, fraction of peak) points of the causal flash-
    attention kernel (masked blocks skipped), ascending; when given they replace attention_peak and
    attention_half_len for that pass (log-linear in the key length between points, the end values beyond them).
    wave_sms / wave_tiles: a GPU whose GEMM kernels launch one thread block per output tile in waves over its SMs
    (see wave_efficiency); 0 / () when its kernels are persistent and split the last wave. measured_memory: (kind,
    forward, backward) fractions of HBM bandwidth that kernels of a measured family (Kernel.memory_kind, one of
    MEASURED_KERNELS) reach in their forward and backward passes; a family not listed streams at memory_peak.
    """

    matmul_peak: float = 0.80
    matmul_half_dim: float = 64.0
    attention_peak: float = 0.65
    attention_half_len: float = 256.0
    elementwise_peak: float = 0.5
    memory_peak: float = 0.85
    matmul_ramp: float = DEFAULT_RAMP_S
    attention_ramp: float = DEFAULT_RAMP_S
    elementwise_ramp: float = DEFAULT_RAMP_S
    attention_forward: tuple[tuple[float, float], ...] = ()
    attention_backward: tuple[tuple[float, float], ...] = ()
    wave_sms: int = 0
    wave_tiles: tuple[tuple[int, int], ...] = ()
    measured_memory: tuple[tuple[MemoryKind, float, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("matmul_peak", "attention_peak", "elementwise_peak", "memory_peak"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ScenarioError(f"{name} {value} is outside (0, 1]", field=f"efficiency.{name}", allowed="(0, 1]")
        for kind, *fractions in self.measured_memory:
            if kind not in MEASURED_KERNELS or any(not 0.0 < value <= 1.0 for value in fractions):
                raise ScenarioError(f"measured_memory {kind!r} {fractions} is not a known kind with fractions in "
                                    "(0, 1]", field=f"efficiency.measured_memory.{kind}",
                                    allowed=f"{', '.join(MEASURED_KERNELS)}; fractions in (0, 1]")
        for name in ("matmul_half_dim", "attention_half_len", "matmul_ramp", "attention_ramp", "elementwise_ramp"):
            if getattr(self, name) < 0.0:
                raise ScenarioError(f"{name} must be >= 0", field=f"efficiency.{name}", allowed=">= 0")
        for name in ("attention_forward", "attention_backward"):
            points = getattr(self, name)
            if any(not 0.0 < fraction <= 1.0 or length <= 0 for length, fraction in points) or \
                    [length for length, _ in points] != sorted({length for length, _ in points}):
                raise ScenarioError(f"{name} needs ascending key lengths with fractions in (0, 1]",
                                    field=f"efficiency.{name}", allowed="(length > 0, fraction in (0, 1]) pairs")

    def ramp(self, kind: KernelKind) -> float:
        """Launch and tail seconds a kernel of ``kind`` takes beyond its time at its plateau rate, compute- or
        memory-bound: the one reading of both the modelled step and a trace moved to another GPU."""
        if kind == "matmul":
            return self.matmul_ramp
        if kind == "attention":
            return self.attention_ramp
        if kind == "elementwise":
            return self.elementwise_ramp
        assert_never(kind)

    def memory_fraction(self, kernel: Kernel) -> float:
        """Plateau fraction of HBM bandwidth ``kernel``'s traffic reaches: the measured figure of its kernel
        family and pass when there is one, memory_peak otherwise."""
        for kind, forward, backward in self.measured_memory:
            if kind == kernel.memory_kind:
                return backward if kernel.backward else forward
        return self.memory_peak


def _saturation(size: float, half: float) -> float:
    """x / (x + x_half): 1/2 at ``half``, tending to 1; a size of 0 (not known) or a half of 0 gives 1."""
    if half == 0.0 or size <= 0.0:
        return 1.0
    return size / (size + half)


def log_interpolate(points: tuple[tuple[float, float], ...], length: float) -> float:
    """The value at ``length`` of measured (length, value) points, ascending: linear in log2(length) between
    points, the end values outside."""
    if length <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if length <= x1:
            share = (math.log2(length) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + share * (y1 - y0)
    return points[-1][1]


def compute_precision(kernel: Kernel, precision: MathPrecision) -> MathPrecision:
    """Precision whose peak bounds ``kernel``: elementwise math runs on fp32 CUDA cores, attention in bf16 under fp8."""
    if kernel.kind == "elementwise":
        return "fp32"
    if kernel.kind == "attention" and precision == "fp8":
        return "bf16"
    return precision


def wave_efficiency(output: tuple[float, ...], tiles: tuple[tuple[int, int], ...], sms: int) -> float:
    """Share of the thread-block slots a GEMM's output fills (NVIDIA, Matrix Multiplication Background User's
    Guide, "Tile Quantization" and "Wave Quantization"): the output of ``batch`` x ``rows`` x ``columns`` is cut
    into tiles, edge tiles computed whole, and the tiles run in waves of one per SM, the last wave partly idle.
    The library picks the tile that wastes least; 1 when the output or the tiles are not known."""
    if not output or not tiles or sms <= 0:
        return 1.0
    batch, rows, columns = output
    best = 0.0
    for tile_rows, tile_columns in tiles:
        count = batch * math.ceil(rows / tile_rows) * math.ceil(columns / tile_columns)
        best = max(best, batch * rows * columns / (math.ceil(count / sms) * sms * tile_rows * tile_columns))
    return best


def attention_plateau(efficiency: Efficiency, key_length: float, backward: bool) -> float:
    """Compute efficiency of the attention core at ``key_length`` (0: not known) before launch/tail losses: the
    pass's measured table, log-interpolated, where there is one, else attention_peak by the saturation curve."""
    table = efficiency.attention_backward if backward else efficiency.attention_forward
    if table and key_length > 0:
        return log_interpolate(table, key_length)
    return efficiency.attention_peak * _saturation(key_length, efficiency.attention_half_len)


def matmul_plateau(efficiency: Efficiency, size_dim: float, output: tuple[float, ...]) -> float:
    """Compute efficiency of a GEMM before launch/tail losses: matmul_peak times the tile factor of its smallest
    side ``size_dim`` and the wave efficiency of its (batch, rows, columns) ``output`` (each 1 where not known);
    the modelled step's and a moved trace's GEMMs alike."""
    return (efficiency.matmul_peak * _saturation(size_dim, efficiency.matmul_half_dim)
            * wave_efficiency(output, efficiency.wave_tiles, efficiency.wave_sms))


def _plateau(kernel: Kernel, efficiency: Efficiency) -> float:
    """Compute efficiency of ``kernel`` before launch/tail losses: the kind's plateau times its size factors."""
    if kernel.kind == "matmul":
        return matmul_plateau(efficiency, kernel.size_dim, kernel.output)
    if kernel.kind == "attention":
        return attention_plateau(efficiency, kernel.size_dim, kernel.backward)
    if kernel.kind == "elementwise":
        return efficiency.elementwise_peak
    assert_never(kernel.kind)


def compute_efficiency(kernel: Kernel, peak: float, efficiency: Efficiency) -> float:
    """Fraction of ``peak`` FLOP/s ``kernel`` reaches: plateau x t / (t + ramp), t its time at the plateau and
    ramp its kind's."""
    plateau = _plateau(kernel, efficiency)
    return plateau * _saturation(kernel.flops / (peak * plateau), efficiency.ramp(kernel.kind))


def memory_efficiency(hbm_bytes: float, bandwidth: float, plateau: float, ramp: float) -> float:
    """Fraction of HBM ``bandwidth`` a kernel moving ``hbm_bytes`` reaches at ``plateau`` with launch and tail
    time ``ramp`` (its kind's, as on the compute side)."""
    streaming_time = hbm_bytes / (bandwidth * plateau)
    return plateau * _saturation(streaming_time, ramp)


def roofline_times(
    kernel: Kernel, gpu: GPUSpec, precision: MathPrecision, efficiency: Efficiency = Efficiency()
) -> tuple[float, float]:
    """(compute seconds, HBM seconds) of ``kernel`` at achieved rates; its duration is the larger."""
    compute_time = 0.0
    if kernel.flops > 0:
        peak = gpu.peak(compute_precision(kernel, precision))
        compute_time = kernel.flops / (peak * compute_efficiency(kernel, peak, efficiency))
    memory_time = 0.0
    if kernel.hbm_bytes > 0:
        bandwidth = gpu.hbm_bandwidth
        fraction = efficiency.memory_fraction(kernel)
        memory_time = kernel.hbm_bytes / (bandwidth * memory_efficiency(kernel.hbm_bytes, bandwidth, fraction,
                                                                        efficiency.ramp(kernel.kind)))
    return compute_time, memory_time


def kernel_duration(kernel: Kernel, gpu: GPUSpec, precision: MathPrecision, efficiency: Efficiency = Efficiency()
                    ) -> float:
    """Seconds ``kernel`` takes on ``gpu`` at ``precision``: the slower of its compute and its HBM traffic."""
    return max(roofline_times(kernel, gpu, precision, efficiency))


def kernels_duration(
    kernels: tuple[Kernel, ...], gpu: GPUSpec, precision: Precision, efficiency: Efficiency = Efficiency()
) -> float:
    """Seconds a sequence of kernels takes back to back on one stream (each shape costed once, `roofline_table`)."""
    return sum(max(times) for times in map(roofline_table(gpu, precision, efficiency).times, kernels))


def sm_bound_duration(
    kernels: tuple[Kernel, ...], gpu: GPUSpec, precision: Precision, efficiency: Efficiency = Efficiency()
) -> float:
    """Seconds of ``kernels_duration`` spent in the kernels whose compute, not their HBM traffic, sets their
    duration: the part that slows while communication kernels hold SMs (engine/contention.py)."""
    times = map(roofline_table(gpu, precision, efficiency).times, kernels)
    return sum(compute for compute, memory in times if compute >= memory)


_kernel_shape = attrgetter(*(f.name for f in fields(Kernel) if f.name not in ("name", "weights")))
"""What `roofline_times` reads of a kernel: every field but its name and its weight count."""


class RooflineTable:
    """`roofline_times` on one GPU at one precision and efficiency, each kernel shape costed once: a layout
    search builds thousands of steps whose layers run the same kernels (and an MoE rank's experts of equal load
    the same GEMMs) again. The times are the same floats `roofline_times` gives."""

    def __init__(self, gpu: GPUSpec, precision: Precision, efficiency: Efficiency):
        self.gpu, self.precision, self.efficiency = gpu, precision, efficiency
        self._times: dict[tuple, tuple[float, float]] = {}

    def times(self, kernel: Kernel) -> tuple[float, float]:
        """(compute seconds, HBM seconds) of ``kernel``."""
        shape = _kernel_shape(kernel)
        found = self._times.get(shape)
        if found is None:
            found = self._times[shape] = roofline_times(kernel, self.gpu, self.precision, self.efficiency)
        return found


@lru_cache(maxsize=16)
def roofline_table(gpu: GPUSpec, precision: Precision, efficiency: Efficiency) -> RooflineTable:
    """The one `RooflineTable` of this GPU, precision and efficiency in the process."""
    return RooflineTable(gpu, precision, efficiency)
