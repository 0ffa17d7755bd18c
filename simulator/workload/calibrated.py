"""The cost models' calibrated figures per GPU, built from the kernel data the catalog reads (catalog/kernels.yaml).

The roofline's `Efficiency` per precision: GEMM and attention plateaus are the measured fractions of peak times the
sustained-to-boost clock ratio (the attention ones for the causal mask training runs), the memory plateau is the
measured fraction of HBM bandwidth, and each kernel kind's launch and tail time (ramp) is its section's; GPUs
missing from the file keep the defaults. `TPOverlap`: the chunks and SMs of Megatron/TE's TP overlap. `SmShare`:
the SMs and NCCL channels of SM contention (engine/contention.py).
"""

from __future__ import annotations

from functools import cache

from simulator.catalog.calibration import kernel_data, network_channels_per_nic
from simulator.config.schema import SmContention
from simulator.config.training_options import Precision
from simulator.errors import ScenarioError
from simulator.parallel.overlap import TPOverlap
from simulator.program.contention import SmShare
from simulator.workload.roofline import Efficiency, log_interpolate
from simulator.workload.transformer import MEASURED_KERNELS


def _points(lengths: list, values: list) -> tuple[tuple[float, float], ...]:
    return tuple((float(length), float(value)) for length, value in zip(lengths, values))


def _fractions(points: tuple[tuple[float, float], ...], peak: float, ratio: float) -> tuple[tuple[float, float], ...]:
    """TFLOP/s points as fractions of the table's ``peak`` at the sustained clock ``ratio``."""
    return tuple((length, min(1.0, tflops / peak * ratio)) for length, tflops in points)


def causal_backward_tflops(attention: dict) -> tuple[tuple[float, float], ...]:
    """The causal attention backward's (key length, TFLOP/s) points of a kernels.yaml ``attention`` entry: its
    measured ``backward_tflops``, or, where only a backward without the mask was measured
    (``backward_non_causal_tflops``), that times the causal / non-causal ratio ``causal_backward``'s source
    measured on the same kernel, both log-linear in the key length, at every length either table has."""
    if "backward_tflops" in attention:
        return _points(attention["seq_len"], attention["backward_tflops"])
    non_causal = _points(attention["seq_len"], attention["backward_non_causal_tflops"])
    measured = attention["causal_backward"]
    ratios = tuple((float(length), float(causal) / float(plain)) for length, causal, plain
                   in zip(measured["seq_len"], measured["causal_tflops"], measured["non_causal_tflops"]))
    lengths = sorted({length for length, _ in non_causal + ratios})
    return tuple((length, log_interpolate(non_causal, length) * log_interpolate(ratios, length))
                 for length in lengths)


@cache
def calibrated_efficiency(gpu_name: str, precision: Precision = "bf16") -> Efficiency:
    """The roofline efficiencies of ``gpu_name`` at ``precision`` from kernels.yaml (defaults when absent)."""
    entry = kernel_data()["gpus"].get(gpu_name)
    if entry is None:
        return Efficiency()
    ratio = float(entry["clock"]["sustained_ratio"])
    gemm, attention = entry["gemm"], entry["attention"]
    peak = float(attention["table_peak_tflops"])
    achievable = gemm["achievable"]
    matmul = float(achievable.get(precision, achievable["bf16"]))
    waves = gemm.get("waves")
    return Efficiency(
        matmul_peak=matmul * ratio,
        matmul_half_dim=float(gemm["half_dim"]),
        memory_peak=float(entry["memory"]["fraction"]),
        matmul_ramp=float(gemm["ramp_time_s"]),
        attention_ramp=float(attention["ramp_time_s"]),
        elementwise_ramp=float(entry["memory"]["ramp_time_s"]),
        attention_forward=_fractions(_points(attention["seq_len"], attention["forward_tflops"]), peak, ratio),
        attention_backward=_fractions(causal_backward_tflops(attention), peak, ratio),
        wave_sms=int(entry["sms"]) if waves else 0,
        wave_tiles=tuple((int(rows), int(columns)) for rows, columns in waves["tiles"]) if waves else (),
        measured_memory=tuple((kind, float(entry[kind]["forward"]), float(entry[kind]["backward"]))
                              for kind in MEASURED_KERNELS if kind in entry),
    )


def tp_overlap() -> TPOverlap:
    """Megatron/TE TP overlap, one setting for every GPU (kernels.yaml's `tp_comm_overlap`): the pipelined
    reduce-scatter's chunks, whether the ring exchange aggregates two chunks per step, and the SMs the
    userbuffers kernels hold, ring exchange, pipelined and bulk (engine/contention.py slows the GEMMs beside
    them)."""
    config = kernel_data()["tp_comm_overlap"]
    return TPOverlap(chunks=int(config["chunks"]), aggregate=bool(config["aggregate"]),
                     all_gather_sms=int(config["all_gather_sms"]),
                     reduce_scatter_sms=int(config["reduce_scatter_sms"]),
                     bulk_all_gather_sms=int(config["bulk_all_gather_sms"]),
                     bulk_reduce_scatter_sms=int(config["bulk_reduce_scatter_sms"]))


def contention_share(sm_contention: SmContention, gpu_name: str) -> SmShare | None:
    """What slows compute beside communication kernels under ``collectives.sm_contention`` (None: nothing)."""
    return sm_share(gpu_name) if sm_contention == "nccl" else None


def sm_share(gpu_name: str) -> SmShare:
    """``gpu_name``'s SMs and the channels NCCL launches per kind of collective; a GPU kernels.yaml lacks is an
    error (rather than contention silently off)."""
    data = kernel_data()
    entry = data["gpus"].get(gpu_name)
    if entry is None:
        raise ScenarioError(f"GPU {gpu_name!r} has no SM count in simulator/catalog/kernels.yaml",
                            field="collectives.sm_contention",
                            allowed=f"none, or a GPU of {', '.join(data['gpus'])}")
    nccl = data["nccl"]
    cap = int(nccl["max_channels"])
    measured = entry.get("sm_contention")
    return SmShare(sms=int(entry["sms"]),
                   nvlink_channels=min(cap, int(nccl["channels_per_nvlink"]) * int(entry["nvlinks"])),
                   pcie_channels=int(nccl["pcie_channels"]),
                   network_channels=network_channels_per_nic(),
                   nvls_channels=int(entry["nvls_channels"]), max_channels=cap,
                   measured=tuple((int(held), float(rate)) for held, rate in
                                  zip(measured["held_sms"], measured["rate"])) if measured else ())
