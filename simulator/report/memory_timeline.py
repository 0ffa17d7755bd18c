"""Memory of a rank over the step: its stage's static memory (parameters, gradients, optimizer state, buffers)
plus one micro-batch's activations for every micro-batch in flight, from the timeline's forward and backward
ops; and a figure of it against the GPU's capacity.

A micro-batch enters when its first forward op on the rank starts and leaves when its last backward op
(category backward: the full B or the input-grad Bi) ends; after a Bi it keeps what its deferred W needs
(the summary's `weight_grad_per_virtual_stage_gib`) until that W ends. With interleaving (v > 1 chunks per rank)
the same holds per virtual stage: its activations (the summary's `activation_per_virtual_stage_gib`) enter
with the micro-batch's first forward op on that chunk and leave with its last backward op there, recompute ops
in between or not.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from simulator.program.ops import BACKWARD_CATEGORY, FORWARD_CATEGORY, WEIGHT_GRAD_CATEGORY
from simulator.report.outputs import (
    compute_stream_work,
    input_grad_ops,
    pipeline_actions,
    rank_and_stages,
    refuse_ranks_without_ops,
    run_name,
    stage_of,
    stage_representatives,
    time_unit,
)
from simulator.units import format_memory

GIB = 2.0**30
STATIC_PARTS = ("params", "grads", "optimizer", "buffers")
CYCLE = [f"C{index}" for index in range(10)]
"""Matplotlib's default colour cycle, by name."""


def _stage_entry(summary: dict, stage: int) -> dict:
    for entry in summary["memory_per_stage"]:
        if int(entry["stage"]) == stage:
            return entry
    raise ValueError(f"summary has no memory entry for pipeline stage {stage}")


def _allocations(work: pd.DataFrame, entry: dict, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """When activations enter (positive bytes) and leave (negative) the rank: a micro-batch's, or with v > 1
    one virtual stage's of one micro-batch, from its first forward op's start to its last backward op's end."""
    per_microbatch = float(entry["activation_per_microbatch_gib"]) * GIB
    sizes = entry["activation_per_virtual_stage_gib"]
    if chunks == 1:
        keys = ["microbatch"]
    elif "chunk" in work and bool((work["chunk"] >= 0).all()):
        keys = ["microbatch", "chunk"]
    else:
        return _allocations_by_action(work, per_microbatch / chunks)
    forward = work[work["category"] == FORWARD_CATEGORY].groupby(keys)["start_s"].min()
    backward = work[work["category"] == BACKWARD_CATEGORY].groupby(keys)["end_s"].max()

    def unit(held: pd.Series) -> np.ndarray:
        if chunks == 1:
            return np.full(len(held), per_microbatch)
        return np.array([float(sizes[str(int(chunk))]) * GIB for chunk in held.index.get_level_values("chunk")])

    return (np.concatenate([forward.to_numpy(), backward.to_numpy()]),
            np.concatenate([unit(forward), -unit(backward)]))


def _allocations_by_action(work: pd.DataFrame, unit: float) -> tuple[np.ndarray, np.ndarray]:
    """A timeline written before the `chunk` column: each merged forward action brings in, and each merged
    backward action takes out, 1/v of a micro-batch (exact without recompute, which splits a backward)."""
    actions = pipeline_actions(work)
    actions = actions[actions["category"].isin((FORWARD_CATEGORY, BACKWARD_CATEGORY))]
    sign = np.where(actions["category"] == FORWARD_CATEGORY, 1.0, -1.0)
    return np.where(sign > 0, actions["start_s"], actions["end_s"]), sign * unit


def _weight_grad_holds(work: pd.DataFrame, entry: dict) -> tuple[np.ndarray, np.ndarray]:
    """What a deferred W keeps (the summary's ``weight_grad_per_virtual_stage_gib``): held from the end of its
    micro-batch's input-grad backward (Bi) on that virtual stage to the end of its W."""
    sizes = entry.get("weight_grad_per_virtual_stage_gib")
    if not sizes or "chunk" not in work:
        return np.empty(0), np.empty(0)
    keys = ["microbatch", "chunk"]
    input_grad = work[input_grad_ops(work)]
    held = pd.concat([input_grad.groupby(keys)["end_s"].max().rename("from"),
                      work[work["category"] == WEIGHT_GRAD_CATEGORY].groupby(keys)["end_s"].max().rename("to")],
                     axis=1, join="inner")
    size = np.array([float(sizes[str(int(chunk))]) * GIB for chunk in held.index.get_level_values("chunk")])
    return np.concatenate([held["from"].to_numpy(), held["to"].to_numpy()]), np.concatenate([size, -size])


def memory_timeline(timeline: pd.DataFrame, summary: dict, rank: int) -> pd.DataFrame:
    """Bytes in use on ``rank`` as a step function: columns time_s, bytes; each row holds from its time until
    the next row's. Frees at a moment are applied before allocations at the same moment. A rank without ops
    of its own (folded) is refused: its curve would be its stage's static memory alone."""
    refuse_ranks_without_ops([rank], timeline, "rank")
    return _rank_memory(timeline, summary, rank)


def _rank_memory(timeline: pd.DataFrame, summary: dict, rank: int) -> pd.DataFrame:
    """memory_timeline for a rank already known to have ops of its own."""
    entry = _stage_entry(summary, stage_of(summary, rank))
    static = sum(float(entry[f"{part}_gib"]) for part in STATIC_PARTS) * GIB
    chunks = max(int(summary["layout"].get("virtual_stages", 1)), 1)
    work = compute_stream_work(timeline, rank)
    times, deltas = _allocations(work, entry, chunks)
    held_times, held_deltas = _weight_grad_holds(work, entry)
    times, deltas = np.concatenate([times, held_times]), np.concatenate([deltas, held_deltas])
    order = np.lexsort((deltas, times))
    times, level = times[order], static + np.cumsum(deltas[order])
    end = float(timeline["end_s"].max()) if len(timeline) else 0.0
    frame = pd.DataFrame({"time_s": np.concatenate([[0.0], times, [max(end, times.max(initial=0.0))]]),
                          "bytes": np.concatenate([[static], level, [level[-1] if len(level) else static]])})
    return frame.groupby("time_s", as_index=False, sort=True).last()


def memory_figure(timeline: pd.DataFrame, summary: dict, ranks=None) -> Figure:
    """GiB in use over time on ``ranks`` (default: one simulated rank per pipeline stage), with the GPU's
    memory capacity as a dashed line. Given ``ranks`` must have ops of their own (not folded)."""
    if ranks is None:
        ranks = stage_representatives(timeline, summary)
    else:
        ranks = [int(r) for r in ranks]
        refuse_ranks_without_ops(ranks, timeline, "ranks")
    curves = [(rank, _rank_memory(timeline, summary, rank)) for rank in ranks]
    span = max((float(curve["time_s"].max()) for _, curve in curves), default=0.0)
    scale, unit = time_unit(span)
    figure = Figure(figsize=(11, 5), layout="constrained")
    ax = figure.add_subplot()
    for (rank, curve), colour in zip(curves, _curve_colours(len(curves))):
        peak = curve["bytes"].max() / GIB
        ax.step(curve["time_s"] * scale, curve["bytes"] / GIB, where="post", color=colour,
                label=f"{rank_and_stages(summary, rank)}, peak {format_memory(peak)}")
    capacity = float(summary["memory_capacity_gib"])
    top = max([capacity] + [curve["bytes"].max() / GIB for _, curve in curves])
    ax.axhline(capacity, color="#C44E52", linestyle="--", label=f"capacity {capacity:.1f} GiB")
    ax.set_xlim(0, span * scale if span > 0 else 1)
    ax.set_ylim(0, top * 1.08 if top > 0 else 1)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("memory in use (GiB)")
    ax.set_title(f"{run_name(summary)}: memory per rank\n(static state + activations of "
                 f"in-flight micro-batches{_buffers_note(summary, ranks)})")
    ax.grid(color="#DDDDDD", linewidth=0.5)
    # Beside the axes (the title, on two lines, stays above them): inside, it hid the curves of the later
    # stages, which sit low and run to the right end (16 stages: half the plot).
    figure.legend(loc="outside right upper", fontsize=8, frameon=False)
    return figure


def _buffers_note(summary: dict, ranks: list[int]) -> str:
    """Under FSDP or ZeRO-3, whose buffers (the summary's ``buffers_gib``: the unsharded parameters, gradient
    accumulators, the largest transient) the program allocates at their first gather or backward, that the curves
    draw them from the step's start: the summary says how large they grow, not when
    (llama3-70b-torchtitan-pp-fsdp's 24.9 GiB sat under its curve from t = 0, before any gather or gradient)."""
    layout = summary.get("layout") or {}
    if "fsdp" not in layout and int(layout.get("zero_stage", 0)) != 3:
        return ""
    largest = max(float(_stage_entry(summary, stage_of(summary, rank))["buffers_gib"]) for rank in ranks)
    if largest <= 0:
        return ""
    return f";\nworking buffers, up to {format_memory(largest)}, drawn from t = 0, though allocated at first use"


def _curve_colours(count: int) -> list:
    """A colour per curve: matplotlib's ten-colour cycle, or beyond ten curves (16 pipeline stages) a sweep of
    viridis in curve order, where the cycle would give two stages one colour in the legend."""
    if count <= len(CYCLE):
        return CYCLE[:count]
    return [tuple(colour) for colour in colormaps["viridis"](np.linspace(0.0, 0.9, count))]
