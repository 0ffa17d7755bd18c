"""`trainsim gpus`: the GPU catalog as the simulation uses it, so a user comparing generations sees what each
GPU's figures are and where they come from before reading a step time: the peaks MFU is measured against, the
HBM and NVLink, the board power that bounds a step's energy, and the kernel efficiencies of kernels.yaml with
their sources. Two GPUs whose efficiencies come
from different kinds of measurement (a short benchmark at the boost clock scaled by a sustained-clock ratio, a
steady run at the power limit) differ by the sources as much as by the silicon; the table shows it."""

from __future__ import annotations

from simulator.catalog.calibration import kernel_data, nvlink_line_rate
from simulator.catalog.gpus import BOARD_POWER_SOURCES, GPUS, GPUSpec
from simulator.units import format_bandwidth, four_digits
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.memory_plan import GIB
from simulator.workload.roofline import attention_plateau

ATTENTION_KEYS = 8192
"""The key length at which the table quotes the causal flash-attention efficiencies (a common training length)."""


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def _tflops(spec: GPUSpec, precision: str) -> str:
    peak = spec.peak_flops.get(precision)
    return "-" if peak is None else four_digits(peak / 1e12)


def _row(name: str) -> dict[str, str]:
    """One GPU's figures as the table prints them."""
    spec = GPUS[name]
    efficiency = calibrated_efficiency(name)
    return {
        "GPU": name,
        "BF16 TFLOP/s": _tflops(spec, "bf16"),
        "FP8 TFLOP/s": _tflops(spec, "fp8"),
        "HBM": f"{spec.hbm_bytes / GIB:.1f} GiB",
        "HBM bandwidth": format_bandwidth(spec.hbm_bandwidth),
        "NVLink per direction": format_bandwidth(nvlink_line_rate(name)),
        "board power": f"{spec.board_power_w:,.0f} W",
        "large GEMM": _percent(efficiency.matmul_peak),
        f"attention {ATTENTION_KEYS // 1024}k fwd / bwd":
            f"{_percent(attention_plateau(efficiency, ATTENTION_KEYS, backward=False))} / "
            f"{_percent(attention_plateau(efficiency, ATTENTION_KEYS, backward=True))}",
        "HBM streaming": _percent(efficiency.memory_peak),
    }


def _sources(name: str) -> dict[str, str]:
    """The kernels.yaml source keys behind a GPU's efficiencies: the GEMM's (with the clock ratio's where the GEMM
    figure is at the boost clock), the attention table's and the HBM stream's."""
    entry = kernel_data()["gpus"][name]
    clock = entry["clock"]
    gemm = entry["gemm"]["source"]
    if float(clock["sustained_ratio"]) != 1.0:
        gemm = f"{gemm} x clock {float(clock['sustained_ratio']):.3f} ({clock['source']})"
    return {"GEMM": gemm, "attention": entry["attention"]["source"], "HBM": entry["memory"]["source"]}


def gpu_table() -> str:
    """Every catalog GPU, one row each, columns aligned, then the sources of each row's efficiencies."""
    rows = [_row(name) for name in GPUS]
    columns = list(rows[0])
    widths = {column: max(len(column), *(len(row[column]) for row in rows)) for column in columns}
    lines = ["GPUs in the catalog (peaks dense; efficiencies are fractions of peak that kernels.yaml's kernel-level "
             "sources give, the GEMM's at the sustained clock)",
             "  ".join(column.ljust(widths[column]) for column in columns)]
    lines += ["  ".join(row[column].ljust(widths[column]) for column in columns).rstrip() for row in rows]
    lines.append("sources (`trainsim gpus NAME` prints their citations):")
    for name in GPUS:
        lines.append(f"  {name}: " + "; ".join(f"{what} {key}" for what, key in _sources(name).items()))
    return "\n".join(lines)


def gpu_detail(name: str) -> str:
    """One GPU: its row as `key: value` lines, then the full citation of every source its efficiencies and its board
    power name."""
    lines = [f"{key}: {value}" for key, value in _row(name).items()]
    citations = kernel_data()["sources"]
    keys = sorted({key for value in _sources(name).values() for key in value.replace("(", " ").replace(")", " ")
                   .split() if key in citations})
    lines.append("sources:")
    lines += [f"  {key}: {' '.join(str(citations[key]).split())}" for key in keys]
    lines.append(f"  board power: {BOARD_POWER_SOURCES[name]}")
    return "\n".join(lines)
