"""Gantt chart of a training step: one row per pipeline stage (or rank) showing its forward, backward,
weight-grad and recompute actions with their micro-batch numbers, blocking TP/CP communication and EP
all-to-alls, the communication that overlaps compute (TP/CP off the compute stream, PP, DP/ZeRO) in a thin lane
under the row, and the idle time (pipeline bubbles)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from simulator.metrics.events import FLOW_KIND
from simulator.metrics.intervals import merge
from simulator.metrics.summary import IDLE_WITHOUT_PIPELINE
from simulator.program.ops import (
    BACKWARD_CATEGORY,
    COMPUTE_STREAM,
    FORWARD_CATEGORY,
    OPTIMIZER_CATEGORY,
    PIPELINE_CATEGORIES,
    RECOMPUTE_CATEGORY,
    WEIGHT_GRAD_CATEGORY,
    Category,
    PipelineCategory,
)
from simulator.report.fault_marks import FaultKind, FaultMark, fault_marks, slowdown_notes
from simulator.report.layout_names import layout_name, schedule_name, stands_for
from simulator.report.outputs import (
    compute_stream_work,
    held_stages,
    input_grad_ops,
    pipeline_actions,
    run_name,
    simulated_ranks,
    stage_of,
    stage_representatives,
    time_unit,
)
from simulator.sweep.options import GANTT_ROWS, GanttRows


class Bar(StrEnum):
    """The kinds of bar the chart draws (a collection's gid is 'kind:row'), in legend order."""

    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_INPUT = "backward_input"
    WEIGHT_GRAD = "weight_grad"
    RECOMPUTE = "recompute"
    OPTIMIZER = "optimizer"
    TP_CP = "tp_cp"
    TP_CP_OVERLAPPED = "tp_cp_overlapped"
    EP = "ep"
    PP = "pp"
    DP = "dp"
    OTHER_COMM = "other_comm"
    IDLE = "idle"


BAR_CLASSES: dict[Bar, tuple[str, str]] = {
    Bar.FORWARD: ("forward (F)", "#4C72B0"),
    Bar.BACKWARD: ("full backward (BW)", "#DD8452"),
    Bar.BACKWARD_INPUT: ("input-grad backward (B)", "#F2C14E"),
    Bar.WEIGHT_GRAD: ("weight-grad (W)", "#55A868"),
    Bar.RECOMPUTE: ("recompute (R)", "#8172B3"),
    Bar.OPTIMIZER: ("optimizer", "#937860"),
    Bar.TP_CP: ("TP/CP collective (blocking)", "#C44E52"),
    Bar.TP_CP_OVERLAPPED: ("TP/CP collective (overlapped)", "#69B825"),
    Bar.EP: ("EP all-to-all", "#A6761D"),
    Bar.PP: ("PP send/recv", "#DA8BC3"),
    Bar.DP: ("DP/ZeRO collective", "#2A9D8F"),
    Bar.OTHER_COMM: ("other communication", "#64B5CD"),
    Bar.IDLE: ("idle (bubble)", "#E3E3E3"),
}
"""Legend entry and colour of each kind of bar; one fixed colour per kind so charts compare side by side."""

PASS_BARS: dict[PipelineCategory, Bar] = {FORWARD_CATEGORY: Bar.FORWARD, BACKWARD_CATEGORY: Bar.BACKWARD,
                                          WEIGHT_GRAD_CATEGORY: Bar.WEIGHT_GRAD, RECOMPUTE_CATEGORY: Bar.RECOMPUTE}
"""The bar of a merged pipeline action, by its category (an input-grad-only backward gets BACKWARD_INPUT)."""
OP_BARS: dict[Category, Bar] = {"tp": Bar.TP_CP, "cp": Bar.TP_CP, "ep": Bar.EP, "pp": Bar.PP, "dp": Bar.DP,
                                OPTIMIZER_CATEGORY: Bar.OPTIMIZER, "comm": Bar.OTHER_COMM}
"""The bar of any other op of a training step, by its category, on the compute stream; a replayed trace's
kernels and host gaps (`compute`, `host`) have none: `plot` refuses such runs before drawing."""
OVERLAPPED_BARS: dict[Bar, Bar] = {Bar.TP_CP: Bar.TP_CP_OVERLAPPED}
"""The bar of an op off the compute stream where its category's bar says it blocks: TP/CP collectives run beside
the GEMMs (`tp_comm_overlap`), sequence-parallel re-gathers and the CP ring overlap compute, which the red of
blocking ones would deny."""
ACTION_BARS = (Bar.FORWARD, Bar.BACKWARD, Bar.BACKWARD_INPUT, Bar.WEIGHT_GRAD, Bar.RECOMPUTE)
"""Bars of the pipeline actions, on the main lane."""
COMMUNICATION_CLASSES = (Bar.TP_CP, Bar.TP_CP_OVERLAPPED, Bar.EP, Bar.PP, Bar.DP, Bar.OTHER_COMM)
"""Drawn with a hairline edge of their own colour so that ops far shorter than a pixel still show; actions
get a white edge so that back-to-back actions of one kind stay apart."""

CHUNK_SHADES = {Bar.FORWARD: ("#4C72B0", "#8FB3E0", "#27466E", "#B9CFEA"),
                Bar.BACKWARD: ("#DD8452", "#F2B68F", "#9E5224", "#F8D5BD"),
                Bar.BACKWARD_INPUT: ("#F2C14E", "#F8DC96", "#B8901F", "#FBEBC4"),
                Bar.WEIGHT_GRAD: ("#55A868", "#9BD0A8", "#2F6E3E", "#C7E6CE")}
"""Colours of the forward, backward, input-grad and weight-grad passes of chunk 0, 1, 2, 3 of an interleaved
or V schedule (chunk c uses shade c mod 4, and from chunk 4 on a hatch: CHUNK_HATCHES); one chunk keeps the
BAR_CLASSES colours."""
CHUNK_HATCHES = ("//", "..", "\\\\", "xx", "oo", "--", "||", "++", "**")
"""Hatches over the shades from chunk 4 on: chunk c >= 4 draws hatch c // 4 - 1 (mod their count; each round
past the last repeats its pattern once more, which matplotlib draws denser), so that every chunk of a rank looks
apart (v = 5 drew chunk 4 as chunk 0)."""
BACKWARD_PASS = (BACKWARD_CATEGORY, RECOMPUTE_CATEGORY)
"""Categories merged into one backward pass of a micro-batch: recompute runs block by block just before the
block's backward, so drawn apart they would be hairlines; the pass draws its recompute time as one bar first."""
MAIN_LANE = (-0.38, 0.56)
"""(offset from the row centre, height) of the compute-stream lane."""
COMM_STRIP = (MAIN_LANE[0] + 0.7 * MAIN_LANE[1], 0.3 * MAIN_LANE[1])
"""(offset, height) of blocking collectives on the compute stream: the bottom of the main lane, so the action
they belong to keeps its colour above them."""
SIDE_LANE = (0.22, 0.16)
"""(offset, height) of the thin lane under it for communication on other streams."""
MAX_LABELS = 4000
LABEL_FONT_PT = 7.0


def _bar_class(category: pd.Series, on_compute: np.ndarray) -> pd.Series:
    """The bar of non-pipeline ops, from their category (OP_BARS) and, for those not ``on_compute``, whether they
    overlap it (OVERLAPPED_BARS); a category without one is refused, not drawn as some other kind."""
    unknown = sorted(set(category) - set(OP_BARS))
    if unknown:
        raise ValueError(f"no Gantt bar for op category {', '.join(map(repr, unknown))} (a training step's ops "
                         f"have {', '.join(map(repr, OP_BARS))})")
    bars = category.map(OP_BARS)
    return bars.where(on_compute, bars.replace(OVERLAPPED_BARS))


def _action_class(actions: pd.DataFrame) -> pd.Series:
    """The bar of merged pipeline actions (PASS_BARS); input-grad-only backwards (named by their pass) get
    their own."""
    return actions["category"].map(PASS_BARS).where(~input_grad_ops(actions), Bar.BACKWARD_INPUT)


def pipeline_passes(actions: pd.DataFrame, virtual_stages: int, stages: list[int] | None = None) -> pd.DataFrame:
    """Merge a rank's consecutive recompute and backward actions of one micro-batch into one backward pass
    (recompute_s: the recompute time inside it) and number each pass's chunk: the position of its virtual
    stage (the timeline's chunk column) in ``stages``, the rank's stages chunk 0 first, when both are there;
    otherwise a micro-batch's forwards on a rank run chunk 0, 1, ... in order, its backwards chunk v-1 down to 0
    (the data dependencies force it), and its weight gradients in its backwards' order (every built-in
    schedule runs them so)."""
    if actions.empty:
        return actions.assign(recompute_s=pd.Series(dtype=float), chunk=pd.Series(dtype=int))
    durations = actions["end_s"] - actions["start_s"]
    in_pass = actions["category"].isin(BACKWARD_PASS)
    starts_pass = ~(in_pass & in_pass.shift(fill_value=False)
                    & (actions["microbatch"] == actions["microbatch"].shift())
                    & (actions["chunk"] == actions["chunk"].shift()))
    grouped = actions.assign(recompute_s=durations.where(actions["category"] == RECOMPUTE_CATEGORY, 0.0),
                             pass_id=starts_pass.cumsum())
    passes = grouped.groupby("pass_id", sort=True).agg(
        name=("name", "last"), category=("category", "last"), microbatch=("microbatch", "first"),
        start_s=("start_s", "min"), end_s=("end_s", "max"), recompute_s=("recompute_s", "sum"),
        stage=("chunk", "first"))
    passes = passes.reset_index(drop=True)
    kind = passes["category"].where(passes["category"] != RECOMPUTE_CATEGORY, BACKWARD_CATEGORY)
    passes["category"] = kind
    chunk_of_stage = passes["stage"].map({stage: chunk for chunk, stage in enumerate(stages or [])})
    if stages is not None and chunk_of_stage.notna().all():
        passes["chunk"] = chunk_of_stage.astype(int)
        return passes.drop(columns="stage")
    seen = passes.groupby([kind, passes["microbatch"]]).cumcount()
    backward = kind.isin((BACKWARD_CATEGORY, WEIGHT_GRAD_CATEGORY))
    passes["chunk"] = seen.where(~backward, virtual_stages - 1 - seen).clip(lower=0) if virtual_stages > 1 else 0
    return passes.drop(columns="stage")


class ChunkLook(NamedTuple):
    """How an interleaved or V chunk's pass is drawn: its shade and its hatch ('' for none)."""

    colour: str
    hatch: str


def _chunk_look(kind: Bar, chunk: int, virtual_stages: int) -> ChunkLook | None:
    """The shade and hatch of an interleaved or V chunk's pass, one of its own for every chunk (None: the
    kind's own colour)."""
    shades = CHUNK_SHADES.get(kind)
    if not shades or virtual_stages <= 1:
        return None
    shade, rest = chunk % len(shades), chunk // len(shades)
    if not rest:
        return ChunkLook(shades[shade], "")
    hatch, repeats = CHUNK_HATCHES[(rest - 1) % len(CHUNK_HATCHES)], 1 + (rest - 1) // len(CHUNK_HATCHES)
    return ChunkLook(shades[shade], hatch * repeats)


def _row_ranks(timeline: pd.DataFrame, summary: dict, by: GanttRows, ranks) -> tuple[list[int], list[str]]:
    """The rank drawn in each row and the row's label; a rank holding several virtual stages (interleaved or V
    placement) is labelled by rank with its stages, chunk 0 first ("rank 1: stages 1, 6"). Where a fold by
    classes of unequal size makes one row stand for more GPUs than another (the summary's `rank_weights`), each
    label says how many ("rank 0 (stage 0, stands for 152 GPUs)"): drawn alike, the rows are not alike. A
    straggler's row says its factor ("rank 8 (stage 1, x1.3 slower)"): its wider bars are the fault's."""
    if by not in GANTT_ROWS:
        raise ValueError(f"by must be one of {', '.join(GANTT_ROWS)}, not {by!r}")
    if ranks is not None:
        chosen = [int(r) for r in ranks]
    else:
        chosen = stage_representatives(timeline, summary) if by == "stage" else simulated_ranks(timeline)
    pp_ranks = [stage_of(summary, r) for r in chosen]
    weights = {int(rank): weight for rank, weight in summary.get("rank_weights", {}).items()}
    slowed = slowdown_notes(summary)
    stood = [", ".join(([stands_for(weights[r])] if r in weights else []) + ([slowed[r]] if r in slowed else []))
             for r in chosen]
    if int(summary["layout"].get("virtual_stages", 1)) > 1:
        labels = [f"rank {r}: stages {', '.join(map(str, held_stages(summary, s)))}" + (f" ({w})" if w else "")
                  for r, s, w in zip(chosen, pp_ranks, stood)]
    elif by == "stage":
        labels = [f"stage {s} (rank {r}{', ' + w if w else ''})" for r, s, w in zip(chosen, pp_ranks, stood)]
    else:
        labels = [f"rank {r} (stage {s}{', ' + w if w else ''})" for r, s, w in zip(chosen, pp_ranks, stood)]
    return chosen, labels


def _idle(busy_starts: np.ndarray, busy_ends: np.ndarray, window: float) -> tuple[np.ndarray, np.ndarray]:
    """The gaps of [0, window] not covered by the busy intervals."""
    s, e = merge(busy_starts, np.minimum(busy_ends, window))
    edges_start = np.concatenate([[0.0], e])
    edges_end = np.concatenate([s, [window]])
    keep = edges_end > edges_start
    return edges_start[keep], edges_end[keep]


def _draw(ax, row: int, kind: Bar, starts: np.ndarray, ends: np.ndarray, lane: tuple[float, float],
          scale: float, zorder: float, shown: tuple[float, float], look: ChunkLook | None = None) -> bool:
    """One broken_barh call: the bars of one kind in one row that reach into the ``shown`` (start, end) window,
    in the kind's colour or a chunk's ``look``; the collection's gid is 'kind:row'. Returns whether it drew any
    (the legend lists only what is visible)."""
    widths = (ends - starts) * scale
    keep = (widths > 0) & (ends > shown[0]) & (starts < shown[1])
    if not keep.any():
        return False
    spans = np.column_stack([starts[keep] * scale, widths[keep]])
    colour = look.colour if look else BAR_CLASSES[kind][1]
    edge = colour if kind in COMMUNICATION_CLASSES else "white" if kind != Bar.IDLE else "none"
    ax.broken_barh(spans, (row + lane[0], lane[1]), facecolors=colour, edgecolor=edge, linewidth=0.4,
                   zorder=zorder, gid=f"{kind}:{row}", hatch=look.hatch if look and look.hatch else None)
    return True


def _label_actions(ax, row: int, actions: pd.DataFrame, scale: float, min_width: float, budget: int) -> int:
    """Micro-batch numbers centred on the actions wide enough to hold them; returns how many were written."""
    text = actions["microbatch"].astype(str)
    wide = (actions["end_s"] - actions["start_s"]) * scale >= min_width * text.str.len().clip(lower=2)
    written = 0
    for start, end, label in zip(actions.loc[wide, "start_s"], actions.loc[wide, "end_s"], text[wide]):
        if written >= budget:
            break
        ax.text((start + end) / 2 * scale, row + MAIN_LANE[0] + MAIN_LANE[1] / 2, label, ha="center",
                va="center", fontsize=LABEL_FONT_PT, color="white", zorder=5, clip_on=True)
        written += 1
    return written


def _draw_row(ax, row: int, rank_ops: pd.DataFrame, rank: int, window: float, scale: float,
              virtual_stages: int, stages: list[int], shown: tuple[float, float]
              ) -> tuple[pd.DataFrame, set[tuple[Bar, int]]]:
    """Draw one rank's idle time, merged actions and communication in row ``row``, the bars that reach into the
    ``shown`` window; returns the actions and the (kind, chunk) pairs drawn (chunk -1 where the kind has one
    colour)."""
    work = compute_stream_work(rank_ops, rank)
    actions = pipeline_passes(pipeline_actions(work), virtual_stages, stages)
    classes = _action_class(actions) if len(actions) else pd.Series(dtype=object)
    drawn: set[tuple[Bar, int]] = set()

    def draw(kind: Bar, starts: np.ndarray, ends: np.ndarray, lane: tuple[float, float], zorder: float,
             chunk: int = -1) -> None:
        look = _chunk_look(kind, chunk, virtual_stages) if chunk >= 0 else None
        if _draw(ax, row, kind, starts, ends, lane, scale, zorder, shown, look=look):
            drawn.add((kind, chunk if look else -1))

    draw(Bar.IDLE, *_idle(work["start_s"].to_numpy(), work["end_s"].to_numpy(), window), MAIN_LANE, 1)
    for kind in ACTION_BARS:
        chosen = actions[classes == kind] if len(actions) else actions
        for chunk, part in chosen.groupby("chunk") if len(chosen) else ():
            draw(kind, part["start_s"].to_numpy(), part["end_s"].to_numpy(), MAIN_LANE, 2, int(str(chunk)))
    recomputing = actions[actions["recompute_s"] > 0] if len(actions) else actions
    draw(Bar.RECOMPUTE, recomputing["start_s"].to_numpy(),
         (recomputing["start_s"] + recomputing["recompute_s"]).to_numpy(), MAIN_LANE, 2.5)
    others = rank_ops[~rank_ops["category"].isin(PIPELINE_CATEGORIES)]
    on_compute = (others["stream"] == COMPUTE_STREAM).to_numpy()
    other_class = _bar_class(others["category"], on_compute).to_numpy()
    for kind in (Bar.OPTIMIZER, *COMMUNICATION_CLASSES):
        on_lane = COMM_STRIP if kind in COMMUNICATION_CLASSES else MAIN_LANE
        for lane, mask, z in ((on_lane, on_compute, 3), (SIDE_LANE, ~on_compute, 2)):
            chosen = others[(other_class == kind) & mask]
            draw(kind, chosen["start_s"].to_numpy(), chosen["end_s"].to_numpy(), lane, z)
    return actions, drawn


LineStyle = Literal["--", ":"]
FAULT_LINES: dict[FaultKind, tuple[str, LineStyle]] = {"link down": ("#D62728", "--"),
                                                       "link degraded": ("#FF7F0E", ":")}
"""Colour and line style of each kind of fault line."""
SHOWN_FAULT_NAMES = 3
"""A legend entry names the links of up to this many faults of its kind, and counts more."""


def _draw_faults(ax, marks: list[FaultMark], scale: float, unit: str, shown: tuple[float, float]) -> list[Line2D]:
    """A vertical line at each fault in the ``shown`` window (gid 'fault:KIND'), and one legend entry per kind
    drawn, naming what it struck and when ("link down: leaf0.r0-spine0 at 5 ms")."""
    handles = []
    for kind, (colour, style) in FAULT_LINES.items():
        visible = [mark for mark in marks if mark.kind == kind and shown[0] <= mark.at_s <= shown[1]]
        for mark in visible:
            ax.axvline(mark.at_s * scale, color=colour, linestyle=style, linewidth=1.2, zorder=6, gid=f"fault:{kind}")
        if not visible:
            continue
        named = [f"{mark.what} at {mark.at_s * scale:.4g} {unit}" for mark in visible[:SHOWN_FAULT_NAMES]]
        more = len(visible) - len(named)
        handles.append(Line2D([], [], color=colour, linestyle=style, linewidth=1.2,
                              label=f"{kind}: {', '.join(named)}" + (f" and {more} more" if more else "")))
    return handles


WINDOW_RULE = "0 <= START < END"
"""What a zoom window (start, end) must satisfy, in seconds from the step's start (`window_problem`)."""


def window_problem(low: float, high: float) -> str | None:
    """What breaks `WINDOW_RULE` in the window (``low``, ``high``), None when nothing does."""
    if not low < high:
        return "START is not before END"
    if low < 0:
        return "START is before the step begins"
    return None


def gantt_figure(timeline: pd.DataFrame, summary: dict, *, by: GanttRows = "stage", ranks=None,
                 max_rows: int = 64, window: tuple[float, float] | None = None) -> Figure:
    """A Gantt chart of the step: rows are pipeline stages (their tp=cp=dp=0 rank) or the given ``ranks``,
    bars are forward and backward passes labelled with their micro-batch (one shade per chunk when
    interleaved; a pass's recompute as its own bar at its start), idle time within the pipeline window is grey,
    ``window`` (start, end) in seconds zooms in (only the bars that reach into it are drawn), the legend lists
    what is visible and the title gives the run's bubble fraction; a link fault in the window is a
    vertical line with its own legend entry, and a straggler's row label gives its factor."""
    rows, labels = _row_ranks(timeline, summary, by, ranks)
    total_rows = len(rows)
    rows, labels = rows[:max_rows], labels[:max_rows]
    ops = timeline[timeline["rank"].isin(rows) & (timeline["kind"] != FLOW_KIND)]
    pipeline_ops = timeline.loc[timeline["category"].isin(PIPELINE_CATEGORIES), "end_s"]
    pipeline_end = float(pipeline_ops.max()) if len(pipeline_ops) else 0.0
    full_span = max(float(ops["end_s"].max()) if len(ops) else 0.0, pipeline_end)
    if window is None and full_span <= 0:
        raise ValueError("every op of the timeline ends at 0 s: no time to draw")
    low, high = window if window is not None else (0.0, full_span)
    problem = window_problem(low, high)
    if problem:
        raise ValueError(f"window {low}:{high}: {problem} ({WINDOW_RULE})")
    span = high - low
    scale, unit = time_unit(span)
    virtual_stages = int(summary["layout"].get("virtual_stages", 1))

    figure = Figure(figsize=(13, 1.6 + 0.5 * len(rows)), layout="constrained")
    ax = figure.add_subplot()
    axes_width_pt = 13 * 72 * 0.85
    min_label_width = span * scale * 0.62 * LABEL_FONT_PT / axes_width_pt
    labels_left = MAX_LABELS
    by_rank = dict(tuple(ops.groupby("rank", sort=False)))
    empty = ops.iloc[:0]
    used: set[tuple[Bar, int]] = set()
    for row, rank in enumerate(rows):
        actions, drawn = _draw_row(ax, row, by_rank.get(rank, empty), rank, pipeline_end, scale, virtual_stages,
                                   held_stages(summary, stage_of(summary, rank)), (low, high))
        visible = actions[(actions["end_s"] > low) & (actions["start_s"] < high)] if len(actions) else actions
        labels_left -= _label_actions(ax, row, visible, scale, min_label_width, labels_left)
        used |= drawn

    ax.set_yticks(range(len(rows)), labels)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(low * scale, (low + span * 1.005) * scale if span > 0 else 1)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", color="#BBBBBB", linewidth=0.5, zorder=0)
    ax.set_axisbelow(True)
    info = summary["layout"]
    shown = f" (first {len(rows)} of {total_rows} rows)" if total_rows > len(rows) else ""
    chunks = f", {virtual_stages} chunks per rank" if virtual_stages > 1 and not schedule_name(summary) else ""
    pipelined = int(info.get("pp", 1)) > 1
    idle = "bubble" if pipelined else IDLE_WITHOUT_PIPELINE
    ax.set_title(f"{run_name(summary)}: {layout_name(summary)}, {info.get('microbatches', '?')} "
                 f"micro-batches{chunks} — {idle} "
                 f"{100 * summary['bubble_fraction']:.1f}%{shown}")
    faults = _draw_faults(ax, fault_marks(summary), scale, unit, (low, high))
    figure.legend(handles=[*_legend(used, virtual_stages, pipelined), *faults], loc="outside lower center",
                  ncol=6, fontsize=8, frameon=False)
    return figure


def _legend(used: set[tuple[Bar, int]], virtual_stages: int, pipelined: bool) -> list[Patch]:
    """One entry per kind of bar visible (``used``: (kind, chunk) pairs, chunk -1 for a kind of one colour);
    with interleaving, one per chunk visible for forward and backward passes. Idle time is a bubble only where
    there is a pipeline; with one stage the compute stream waits for gathers and the like."""
    handles = []
    for kind, (label, colour) in BAR_CLASSES.items():
        chunks = sorted(chunk for drawn, chunk in used if drawn == kind)
        if not chunks:
            continue
        if chunks != [-1]:
            looks = [(chunk, _chunk_look(kind, chunk, virtual_stages)) for chunk in chunks]
            handles += [Patch(facecolor=look.colour, hatch=look.hatch, edgecolor="white", linewidth=0.4,
                              label=f"{label} chunk {chunk}") for chunk, look in looks if look]
        else:
            handles.append(Patch(facecolor=colour, label=label if pipelined or kind != Bar.IDLE else "idle"))
    return handles
