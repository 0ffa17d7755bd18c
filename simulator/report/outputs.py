"""A run's output folder as the plots read it (summary.json + timeline.parquet), the rank -> pipeline stage
map of its layout and the virtual stages a pipeline rank holds, and the pipeline actions of a rank:
consecutive ops of one micro-batch merged into one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.errors import InputError
from simulator.metrics.events import FLOW_KIND
from simulator.metrics.step import STAGE_WORK_CATEGORIES
from simulator.parallel.passes import Pass
from simulator.program.ops import BACKWARD_CATEGORY, COMPUTE_STREAM, PIPELINE_CATEGORIES
from simulator.report.layout_names import run_layout
from simulator.report.run_folder import checked_manifest, outdir_error, read_parquet_table
from simulator.schedules.base import rank_stages

REQUIRED_SUMMARY_KEYS = ("layout", "bubble_fraction", "memory_per_stage", "memory_capacity_gib")
REQUIRED_TIMELINE_COLUMNS = ("kind", "rank", "stream", "name", "category", "microbatch", "start_s", "end_s")
GAP_TOLERANCE_S = 1e-9
"""Two ops closer than this (one nanosecond) count as back to back: the clock adds durations in floating point."""


@dataclass(frozen=True)
class RunOutputs:
    """The summary dict and the timeline DataFrame of one run."""

    summary: dict
    timeline: pd.DataFrame


def load_run_outputs(out_dir: Path) -> RunOutputs:
    """Read a run's folder; a missing folder, manifest or file, files of another run (report/run_folder.py),
    unreadable content or missing keys is a ScenarioError on the field OUTDIR."""
    out_dir = Path(out_dir)
    checked_manifest(out_dir, ("summary.json", "timeline.parquet"))
    summary_path, timeline_path = out_dir / "summary.json", out_dir / "timeline.parquet"
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise outdir_error(out_dir, f"summary.json is not readable JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise outdir_error(out_dir, "summary.json is not a JSON object")
    missing = [key for key in REQUIRED_SUMMARY_KEYS if key not in summary]
    if missing and "trace" in summary:
        raise outdir_error(out_dir, "a replayed trace's run has no pipeline layout or memory to plot (its "
                                    "timeline is in trace.json, for Perfetto)",
                           "the folder of a modelled training step (a scenario with a model)")
    if missing and "parameter_server" in summary:
        raise outdir_error(out_dir, "a parameter-server run has no pipeline stages or memory timeline to plot (its "
                                    "workers and server GPUs are in trace.json, for Perfetto)",
                           "the folder of a training step of collectives (not parallelism.strategy: "
                           "parameter_server)")
    if missing == ["memory_per_stage"] and "memory_per_stage_gib" in summary:
        raise outdir_error(out_dir, "summary.json was written by an earlier trainsim (memory_per_stage_gib, now "
                                    "memory_per_stage)", "a run folder of this version: run the scenario again")
    if missing:
        raise outdir_error(out_dir, f"summary.json has no {', '.join(missing)} (not a training-step run?)")
    timeline = read_parquet_table(timeline_path, out_dir)
    absent = [column for column in REQUIRED_TIMELINE_COLUMNS if column not in timeline.columns]
    if absent:
        raise outdir_error(out_dir, f"timeline.parquet has no column {', '.join(absent)}")
    return RunOutputs(summary, timeline)


def save_figure(figure, path: Path, dpi: int = 120) -> None:
    """Write a matplotlib Figure to ``path`` (format from the suffix), creating the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi, bbox_inches="tight")


def run_name(summary: dict) -> str:
    """What a run's charts are titled by: its scenario's file name (the summary holds the path as given,
    absolute for a bundled scenario run by name, which filled half a title), else 'training step'."""
    return Path(summary["scenario"]).name if summary.get("scenario") else "training step"


def stage_of(summary: dict, rank: int) -> int:
    """The pipeline stage ``rank`` belongs to."""
    return run_layout(summary).coords(rank)["pp"]


def held_stages(summary: dict, pp_rank: int) -> list[int]:
    """The virtual stages pipeline rank ``pp_rank`` holds, chunk 0 first, under the run's placement: one
    without interleaving, r, r + p, ... looped, r and 2p - 1 - r in the V."""
    layout = summary["layout"]
    return rank_stages(pp_rank, int(layout["pp"]), int(layout.get("virtual_stages", 1)),
                       layout.get("placement", "loop"))


def rank_and_stages(summary: dict, rank: int) -> str:
    """A rank named with the pipeline stages it holds: "rank 2 (stage 1)", "rank 1 (stages 1, 6)"."""
    stages = held_stages(summary, stage_of(summary, rank))
    return f"rank {rank} (stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))})"


def stage_first_ranks(summary: dict) -> list[int]:
    """For each pipeline stage, its rank with tp = cp = dp = 0."""
    layout = run_layout(summary)
    return [layout.rank_of(pp=stage) for stage in range(layout.pp)]


def simulated_ranks(timeline: pd.DataFrame) -> list[int]:
    """Ranks with ops of their own in the timeline; ranks folded into a representative have only flows."""
    rows = timeline[(timeline["rank"] >= 0) & (timeline["kind"] != FLOW_KIND)]
    return sorted(int(r) for r in rows["rank"].unique())


def refuse_ranks_without_ops(ranks, timeline: pd.DataFrame, field: str) -> None:
    """A rank folded into an equivalent one (or left out of a per-stage timeline) has no ops of its own: its
    Gantt row would be drawn idle from start to end, its memory curve as its stage's static memory alone."""
    simulated = simulated_ranks(timeline)
    present = set(simulated)
    missing = [rank for rank in ranks if rank not in present]
    if missing:
        shown = ", ".join(map(str, simulated[:16])) + (", ..." if len(simulated) > 16 else "")
        raise InputError(f"rank {missing[0]} has no ops in this run's timeline (folded into an equivalent rank, "
                         f"or not kept by run.timeline)", field=field,
                         allowed=f"a simulated rank: {shown}; or rerun with run.fold: false")


def stage_representatives(timeline: pd.DataFrame, summary: dict) -> list[int]:
    """For each pipeline stage, the rank whose ops stand for it: its tp = cp = dp = 0 rank, or where that was
    folded away, the lowest simulated rank of the stage."""
    present = simulated_ranks(timeline)
    chosen = []
    for stage, first in enumerate(stage_first_ranks(summary)):
        if first not in present:
            first = min((r for r in present if stage_of(summary, r) == stage), default=first)
        chosen.append(first)
    return chosen


def compute_stream_work(timeline: pd.DataFrame, rank: int) -> pd.DataFrame:
    """The ops that keep ``rank``'s compute stream busy (kernels and blocking TP/CP collectives), by start."""
    rows = timeline[(timeline["rank"] == rank) & (timeline["stream"] == COMPUTE_STREAM)
                    & (timeline["kind"] != FLOW_KIND) & timeline["category"].isin(STAGE_WORK_CATEGORIES)]
    return rows.sort_values(["start_s", "end_s"], kind="stable")


def pipeline_actions(work: pd.DataFrame) -> pd.DataFrame:
    """Merge a rank's compute-stream ops (from compute_stream_work) into actions: a run of ops of one category,
    micro-batch and virtual stage with no idle gap in between (TP/CP collectives of the action fill its gaps).
    Columns: name (of its first op), category, microbatch, chunk (-1 in timelines written before it existed),
    start_s, end_s."""
    starts, ends = work["start_s"].to_numpy(), work["end_s"].to_numpy()
    previous_end = np.maximum.accumulate(ends)
    idle_before = np.zeros(len(work), dtype=bool)
    idle_before[1:] = starts[1:] > previous_end[:-1] + GAP_TOLERANCE_S
    gaps_so_far = np.cumsum(idle_before)
    is_kernel = work["category"].isin(PIPELINE_CATEGORIES).to_numpy()
    kernels = pd.DataFrame({"name": work["name"].to_numpy()[is_kernel],
                            "category": work["category"].to_numpy()[is_kernel],
                            "microbatch": work["microbatch"].to_numpy()[is_kernel],
                            "chunk": work["chunk"].to_numpy()[is_kernel] if "chunk" in work else -1,
                            "start_s": starts[is_kernel], "end_s": ends[is_kernel],
                            "gaps": gaps_so_far[is_kernel]})
    if kernels.empty:
        return kernels.drop(columns="gaps")
    changed = ((kernels["category"] != kernels["category"].shift())
               | (kernels["microbatch"] != kernels["microbatch"].shift())
               | (kernels["chunk"] != kernels["chunk"].shift())
               | (kernels["gaps"] != kernels["gaps"].shift()))
    action_id = changed.cumsum()
    actions = kernels.groupby(action_id, sort=True).agg(name=("name", "first"), category=("category", "first"),
                                                          microbatch=("microbatch", "first"),
                                                          chunk=("chunk", "first"), start_s=("start_s", "min"),
                                                          end_s=("end_s", "max"))
    return actions.reset_index(drop=True)


def input_grad_ops(work: pd.DataFrame) -> pd.Series:
    """Which rows are input-gradient-only backwards (a zero-bubble schedule's B, named by its pass)."""
    return (work["category"] == BACKWARD_CATEGORY) & work["name"].str.startswith(Pass.BACKWARD_INPUT.op_prefix)


def time_unit(span_s: float) -> tuple[float, str]:
    """(factor, unit) to show times of a chart spanning ``span_s`` seconds: ms below 2 s, s above."""
    return (1.0, "s") if span_s >= 2.0 else (1e3, "ms")
