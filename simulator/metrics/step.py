"""Step metrics from the event log: step time, throughput, MFU/HFU, pipeline bubble, communication ratio and
exposed communication per parallelism kind. Pure functions of the log's op and flow columns (`StepRows`), in
numpy, without a DataFrame: a run whose timeline is not written never builds one (nor imports pandas). Sums
that pandas' groupby made are made as it makes them (`grouped_sums`), so the figures stay the same to the bit."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from math import isfinite
from typing import TYPE_CHECKING

import numpy as np

from simulator.metrics.events import COLLECTIVE_KIND, COMPUTE_KIND
from simulator.metrics.intervals import covered, uncovered
from simulator.parallel.folding import ranks_stood_for
from simulator.program.ops import (
    BACKWARD_CATEGORY,
    COMM_CATEGORIES,
    COMPUTE_STREAM,
    FORWARD_CATEGORY,
    HOST_CATEGORY,
    OPTIMIZER_CATEGORY,
    PIPELINE_CATEGORIES,
    RECOMPUTE_CATEGORY,
    WEIGHT_GRAD_CATEGORY,
    Category,
)
from simulator.schedules.base import stage_action_counts
from simulator.schedules.timing import simulate_schedule

if TYPE_CHECKING:
    from simulator.metrics.events import EventLog
    from simulator.schedules.base import ActionKind, Schedule

STAGE_WORK_CATEGORIES: tuple[Category, ...] = (*PIPELINE_CATEGORIES, "tp", "cp", "ep")
"""What keeps a stage busy inside an action: its kernels and the blocking TP/CP/EP collectives between them."""
STAGE_COLLECTIVE_CATEGORIES: tuple[Category, ...] = ("tp", "cp")
"""Collectives that are a stage's own work wherever they run: the compute stream waits for them."""
TRACED_COMPUTE_CATEGORY: Category = "compute"
"""A replayed trace's kernels: compute on whichever of the trace's streams they ran."""
COMPUTE_CATEGORIES: tuple[Category, ...] = (*PIPELINE_CATEGORIES, OPTIMIZER_CATEGORY, TRACED_COMPUTE_CATEGORY)
"""What counts as compute when communication is exposed: every kernel, a pipeline pass's, the optimizer's or a
traced one, where `stream_compute` counts it."""
SIDE_STREAM_COMPUTE = "side-stream kernel"
"""The category `communication_metrics` gives a built program's kernels off the compute stream (FSDP's copy-in
on `fsdp_copy_in`): the compute stream waits for them, as the bubble counts it."""
OP_COLUMNS = ("kind", "rank", "stream", "category", "chunk", "start_s", "end_s", "flops", "key")
"""The op rows' columns the step metrics read."""


@dataclass(frozen=True)
class StepRows:
    """What the step metrics read off a run's log: ``ops``, the op rows (compute and collective) in recording
    order, the OP_COLUMNS of the timeline (text columns as object arrays), and ``flows``, the flow rows' ``key``,
    ``src`` and ``bytes`` in flow order."""

    ops: Mapping[str, np.ndarray]
    flows: Mapping[str, np.ndarray]
    weights: Mapping[int, int] | None = None
    """How many ranks each rank with ops stands for, where a run folded by classes of unequal size simulates
    them (parallel/folding.py `rank_weights`): the means over ranks weigh each by it. None: every rank weighs
    the same (the plain mean, to the bit)."""

    @classmethod
    def of(cls, log: EventLog, weights: Mapping[int, int] | None = None) -> StepRows:
        return cls(log.op_columns(OP_COLUMNS), log.flow_columns(("key", "src", "bytes")), weights)

    def of_ranks(self, ranks: Collection[int]) -> StepRows:
        """The op rows of ``ranks`` alone (the flows unchanged)."""
        mine = np.isin(self.ops["rank"], np.fromiter(ranks, dtype=np.int64))
        return StepRows({name: column[mine] for name, column in self.ops.items()}, self.flows, self.weights)

    def weights_of(self, ranks: np.ndarray) -> np.ndarray | None:
        """The weights of ``ranks`` (None where every rank weighs the same)."""
        if self.weights is None:
            return None
        return np.fromiter(map(self.weights.__getitem__, ranks.tolist()), dtype=np.float64, count=len(ranks))

    def ranks_weight(self) -> float:
        """How many ranks the ranks with ops stand for: their count, or their weights' sum."""
        return float(ranks_stood_for(np.unique(self.ops["rank"]).tolist(), self.weights))


def grouped_sums(labels: list, values: list[float]) -> dict:
    """The sum of ``values`` per label, as pandas' groupby sum adds them in its Cython kernel
    (pandas/_libs/groupby.pyx, group_sum): in row order, with Kahan's compensation, skipping NaN (a label with
    only NaN sums to 0.0) and dropping a compensation that an infinity or an overflow made non-finite, so that
    a summary figure first taken from a groupby is unchanged to the last bit. (pandas 3.1 adds labels already in
    sorted order and free of NaN with numpy's pairwise `add.reduceat` instead, which can differ in the last bits.)"""
    sums: dict = {}
    compensation: dict = {}
    for label, value in zip(labels, values):
        if value != value:
            sums.setdefault(label, 0.0)
            continue
        total = sums.get(label, 0.0)
        corrected = value - compensation.get(label, 0.0)
        updated = total + corrected
        error = updated - total - corrected
        compensation[label] = error if isfinite(error) else 0.0
        sums[label] = updated
    return sums


def _rank_arrays(ops: Mapping[str, np.ndarray]) -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per rank, per category, the (starts, ends) of its intervals in recording order; ranks ascending and each
    rank's categories in sorted order."""
    categories = sorted(set(ops["category"].tolist()))
    code = {category: index for index, category in enumerate(categories)}
    codes = np.fromiter(map(code.__getitem__, ops["category"].tolist()), dtype=np.int64, count=len(ops["category"]))
    order = np.lexsort((codes, ops["rank"]))
    ranks, codes = ops["rank"][order], codes[order]
    bounds = np.flatnonzero((np.diff(ranks) != 0) | (np.diff(codes) != 0)) + 1
    result: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for rows in np.split(order, bounds) if len(order) else []:
        first = rows[0]
        result.setdefault(int(ops["rank"][first]), {})[ops["category"][first]] = (
            ops["start_s"][rows], ops["end_s"][rows])
    return result


def _cat(arrays: dict[str, tuple[np.ndarray, np.ndarray]], categories) -> tuple[np.ndarray, np.ndarray]:
    parts = [arrays[c] for c in categories if c in arrays]
    if not parts:
        return np.empty(0), np.empty(0)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


@dataclass(frozen=True)
class Bubble:
    """A pipelined step's bubble: ``fraction``, the mean over ranks of the compute stream's idle share of its
    replica's pipeline window (`replica_windows_s`), and ``seconds``, the mean over ranks of that idle time."""

    fraction: float
    seconds: float


def pipeline_bubble(rows: StepRows, replicas: Mapping[int, int] | None = None) -> Bubble:
    """The compute stream's idle time in each rank's pipeline window, from 0 to the end of the last
    forward/backward op of any rank of its data-parallel replica (`replica_windows_s`), so pipeline fill, drain
    and the waits inside the replica's own schedule count, and the optimizer, the data-parallel tail and a wait
    for a slower replica do not (that wait is `communication_metrics`' ``peer_wait_s``): with uniform stages the
    fraction is (p-1)/(m+p-1) for 1F1B, and at pp = 1 a replica's window is its own passes. TP and CP
    collectives count as busy on whichever stream they run: they are part of a stage's work, and the compute
    stream's waits for the ones on their own streams (tp_comm_overlap's last chunks, the sequence-parallel
    re-gathers, the CP ring) are the stage's exposed communication, not bubble. The seconds are the fraction
    times the longest replica's window less, for a rank whose replica's window ends before it, its idle share
    times the difference: the mean of each rank's idle share times its own window, written so that where every
    replica ends together it is the fraction times the window, the float operations and so the bytes of
    summary.json those of a single window's."""
    ops = rows.ops
    windows = replica_windows_s(rows, replicas)
    if not windows or max(windows.values()) <= 0:
        return Bubble(0.0, 0.0)
    ranks_with_ops, inverse = np.unique(ops["rank"], return_inverse=True)
    row_window = np.fromiter(map(windows.__getitem__, ranks_with_ops.tolist()), dtype=np.float64,
                             count=len(ranks_with_ops))[inverse]
    work = _stage_work(ops) & (ops["start_s"] < row_window)
    order = np.argsort(ops["rank"][work], kind="stable")
    ranks = ops["rank"][work][order]
    if not len(ranks):
        return Bubble(0.0, 0.0)
    starts, ends = ops["start_s"][work][order], np.minimum(ops["end_s"][work], row_window[work])[order]
    bounds = np.flatnonzero(np.diff(ranks)) + 1
    firsts = ranks[np.append(0, bounds)]
    spans = np.fromiter(map(windows.__getitem__, firsts.tolist()), dtype=np.float64, count=len(firsts))
    idle = np.clip([1.0 - covered(s, e) / window
                    for s, e, window in zip(np.split(starts, bounds), np.split(ends, bounds), spans)], 0.0, None)
    weights = rows.weights_of(firsts)
    fraction = _mean(idle.tolist(), weights)
    longest = max(windows.values())
    return Bubble(fraction, fraction * longest - _mean((idle * (longest - spans)).tolist(), weights))


def replica_windows_s(rows: StepRows, replicas: Mapping[int, int] | None = None) -> dict[int, float]:
    """Per rank with ops, the end of its replica's pipeline window: the last end of a forward/backward/recompute
    op of any rank of its data-parallel replica (``replicas``: rank -> replica; None: one replica, so every rank
    has the step's window, up to the last such op of any rank), 0 for a replica without such ops. A replica
    ahead of a slower one (a straggler's) ends its window before the step's."""
    ops = rows.ops
    ranks, inverse = np.unique(ops["rank"], return_inverse=True)
    passes = np.isin(ops["category"], PIPELINE_CATEGORIES)
    last = np.full(len(ranks), -np.inf)
    np.maximum.at(last, inverse[passes], ops["end_s"][passes])
    ends: dict[int, float] = {}
    for rank, end in zip(ranks.tolist(), last.tolist()):
        replica = 0 if replicas is None else replicas[rank]
        ends[replica] = max(ends.get(replica, end), end)
    return {rank: max(ends[0 if replicas is None else replicas[rank]], 0.0) for rank in ranks.tolist()}


def last_replicas_ranks(rows: StepRows, replicas: Mapping[int, int] | None = None) -> frozenset[int]:
    """The ranks of the data-parallel replicas (``replicas``: rank -> replica) whose pipeline window ends last
    (`replica_windows_s`): those the other replicas' ranks wait for after their own windows end."""
    windows = replica_windows_s(rows, replicas)
    last = max(windows.values(), default=0.0)
    return frozenset(rank for rank, end in windows.items() if end == last)


def _stage_work(ops: Mapping[str, np.ndarray]) -> np.ndarray:
    """Which op rows keep a stage busy, as `pipeline_bubble` counts them: its passes and the other stage work on
    the compute stream, and the TP/CP collectives on any stream."""
    stage_work = np.isin(ops["category"], STAGE_WORK_CATEGORIES)
    return stage_work & ((ops["stream"] == COMPUTE_STREAM) | np.isin(ops["category"], STAGE_COLLECTIVE_CATEGORIES))


PASS_ACTIONS: dict[Category, int] = {FORWARD_CATEGORY: 0, BACKWARD_CATEGORY: 1, RECOMPUTE_CATEGORY: 1,
                                     WEIGHT_GRAD_CATEGORY: 2}
"""Which of a stage's pass times each pass's ops count in, as an index into (forward, backward, weight grad): the
recompute runs in the backward (B or BW), a fused BW's weight gradients are `backward` ops, a split W's are
`weight_grad` ops."""


def stage_action_seconds(rows: StepRows, counts: Sequence[Mapping[ActionKind, int]]) -> list[list[float]]:
    """Each virtual stage's F, B and W action seconds in this run, as three lists in stage order, from its ranks'
    busy time on it (the union of its stage work, `_stage_work`, the bubble's busy time) split between forward,
    backward and weight-grad as the time of its passes' ops is; the mean over the ranks holding the stage
    (weighed by `StepRows.weights`). ``counts`` gives the stage's actions of each kind (`stage_action_counts`):
    F is the forward time over its F actions, W the weight-grad time over its W actions, and B the backward
    time less its BW actions' weight gradients (W each) over its B and BW actions, so that a stage mixing BW
    with B and W (zb-h1, DualPipeV) gives B only the input-grad part; a BW lasts B + W."""
    ops = rows.ops
    work = _stage_work(ops) & (ops["chunk"] >= 0)
    action = np.fromiter((PASS_ACTIONS.get(category, -1) for category in ops["category"][work].tolist()),
                         dtype=np.int64, count=int(work.sum()))
    ranks, chunks = ops["rank"][work], ops["chunk"][work]
    starts, ends = ops["start_s"][work], ops["end_s"][work]
    order = np.lexsort((chunks, ranks))
    bounds = np.flatnonzero((np.diff(ranks[order]) != 0) | (np.diff(chunks[order]) != 0)) + 1
    held: dict[int, list[tuple[int, list[float]]]] = {}
    for group in np.split(order, bounds) if len(order) else []:
        busy = covered(starts[group], ends[group])
        passes = group[action[group] >= 0]
        pass_s = np.bincount(action[passes], weights=ends[passes] - starts[passes], minlength=3)
        total = float(pass_s.sum())
        split = [busy * float(share) / total for share in pass_s] if total > 0 else [busy, 0.0, 0.0]
        held.setdefault(int(chunks[group[0]]), []).append((int(ranks[group[0]]), split))
    seconds: list[list[float]] = [[0.0] * len(counts) for _ in range(3)]
    for stage, entries in held.items():
        weights = rows.weights_of(np.array([rank for rank, _ in entries], dtype=np.int64))
        forward, backward, weight = (_mean([split[kind] for _, split in entries], weights) for kind in range(3))
        count = counts[stage]
        per_weight = weight / count["W"] if count["W"] else 0.0
        seconds[0][stage] = forward / max(count["F"], 1)
        seconds[1][stage] = (backward - count["BW"] * per_weight) / max(count["B"] + count["BW"], 1)
        seconds[2][stage] = per_weight
    return seconds


@dataclass(frozen=True, slots=True)
class ScheduleBubble:
    """The bubble of the schedule alone (`schedule_bubble`) beside what it would be at uniform stages, and each
    pipeline rank's busy seconds in it: the closed forms ((p-1)/(m+p-1) for 1F1B, (p-1)/(m v+p-1) interleaved)
    hold at uniform stages, so a slower stage (a model's head) is what lifts ``fraction`` above
    ``uniform_fraction``, and ``stage_busy_s`` says which."""

    fraction: float
    uniform_fraction: float
    stage_busy_s: tuple[float, ...]


def schedule_bubble(rows: StepRows, schedule: Schedule) -> ScheduleBubble:
    """The bubble of the schedule alone: `schedules.timing.simulate_schedule`'s, running ``schedule`` (its p,
    m, v and placement) with each virtual stage's F, B and W seconds of this run (`stage_action_seconds`) and no
    wait besides the schedule's: no hand-off time, no exposed communication, no straggler; `pipeline_bubble`'s
    fraction less it is the waits' share of the pipeline window. The same schedule run again at uniform stages
    (`_uniform_stages`) gives the closed forms' figure ((p-1)/(m+p-1) for 1F1B, (p-1)/(m v+p-1) interleaved):
    the ideal executor runs in microseconds, no second simulation of the step."""
    chunks = 1 + max((action.chunk for actions in schedule for action in actions), default=0)
    counts = stage_action_counts(schedule, chunks)
    seconds = stage_action_seconds(rows, counts)
    forward, backward, weight = seconds
    timing = simulate_schedule(schedule, forward, backward, weight, v=chunks)
    forward, backward, weight = _uniform_stages(seconds, counts)
    uniform = simulate_schedule(schedule, forward, backward, weight, v=chunks)
    return ScheduleBubble(timing.bubble_fraction, uniform.bubble_fraction,
                          tuple(timing.makespan - idle for idle in timing.idle_per_rank))


def _uniform_stages(seconds: list[list[float]], counts: Sequence[Mapping[ActionKind, int]]) -> list[list[float]]:
    """Each virtual stage's F, B and W seconds made uniform: the stages' mean of each where every stage runs
    the same actions (1F1B, interleaved: the closed forms exactly), else each stage's own scaled so that its
    actions take the stages' mean time, keeping its split between them (zb-h1's last stage runs whole
    backwards, BW, and so has no W of its own to average)."""
    if all(count == counts[0] for count in counts):
        return [[sum(kind) / len(kind)] * len(kind) for kind in seconds]
    totals = [forward * count["F"] + backward * (count["B"] + count["BW"]) + weight * (count["W"] + count["BW"])
              for forward, backward, weight, count in zip(*seconds, counts, strict=True)]
    scales = [sum(totals) / len(totals) / total if total > 0 else 0.0 for total in totals]
    return [[time * scale for time, scale in zip(kind, scales, strict=True)] for kind in seconds]


def optimizer_s(rows: StepRows) -> float:
    """Mean over the ranks with ops of their optimizer-step time."""
    ops = rows.ops
    ranks = rows.ranks_weight()
    steps = ops["category"] == OPTIMIZER_CATEGORY
    return float(_weighted_sum(rows, steps, ops["end_s"][steps] - ops["start_s"][steps])) / ranks if ranks else 0.0


def executed_flops(rows: StepRows) -> float:
    """The FLOPs of every compute op (each counted for the ranks its rank stands for, `StepRows.weights`)."""
    compute = rows.ops["kind"] == COMPUTE_KIND
    return float(_weighted_sum(rows, compute, rows.ops["flops"][compute]))


def _weighted_sum(rows: StepRows, chosen: np.ndarray, values: np.ndarray) -> float:
    """The sum of ``values`` (of the op rows ``chosen``), each weighed by its rank's weight where ranks weigh
    unlike."""
    weights = rows.weights_of(rows.ops["rank"][chosen])
    return float(np.sum(values if weights is None else values * weights))


def stream_compute(ops: Mapping[str, np.ndarray]) -> np.ndarray:
    """Which op rows are compute for the exposed communication and the wait: a built program's kernels on the
    compute stream, as `pipeline_bubble` counts them (not FSDP's copy-in kernels on their own stream, which the
    compute stream waits for), and a replayed trace's kernels on any stream."""
    built = np.isin(ops["category"], COMPUTE_CATEGORIES) & (ops["stream"] == COMPUTE_STREAM)
    return built | (ops["category"] == TRACED_COMPUTE_CATEGORY)


def communication_metrics(rows: StepRows, step_time_s: float, windows_s: Mapping[int, float] | None = None,
                          stages: Mapping[int, int] | None = None) -> dict:
    """comm_ratio (mean over ranks of time with any communication in flight / step time), exposed
    communication per kind (mean over ranks of communication time not overlapped by compute, `stream_compute`),
    ``exposed_union_s``, the mean over ranks of the time some communication is exposed (every kind counted
    once, at most the sum of the kinds), ``wait_s``, the mean over ranks of the compute stream's idle time
    in the step (the exposed communication and the time with neither compute nor communication: a bubble, a
    wait for a slower rank or for FSDP's copy-in), and ``host_s``, the part of that idle time with a replayed
    trace's host op in flight and no communication (host gaps, a CPU-only profile's ops), and, given each rank's
    pipeline window's end ``windows_s`` (`replica_windows_s`), ``peer_wait_s``, the mean over ranks of the idle
    time after it with neither compute nor communication of the rank's own in flight, up to the last end of an op
    of the ranks of its pipeline stage (``stages``: rank -> stage; None: one stage): a rank done with its passes,
    DP tail or optimizer step that waits for slower ranks of its stage (their DP collectives slowed by a faulted
    link, a straggler's replica still in its passes), and ``stage_tail_wait_s``, the same after that end until the
    step's: a wait for stages whose DP tail and optimizer step end later (a replica's window ends at its last
    backward, stage 0's in 1F1B, so stage 0's tail comes after it while the other stages ran theirs during the
    drain). Neither the bubble (up to the window) nor exposed communication (a transfer of the rank's own) holds
    them; 0 without ``windows_s``, seconds."""
    side = np.isin(rows.ops["category"], COMPUTE_CATEGORIES) & ~stream_compute(rows.ops)
    arrays = _rank_arrays({**rows.ops, "category": np.where(side, SIDE_STREAM_COMPUTE, rows.ops["category"])})
    weights = rows.weights_of(np.fromiter(arrays, dtype=np.int64, count=len(arrays)))
    ratios: list[float] = []
    waits: list[float] = []
    hosts: list[float] = []
    unions: list[float] = []
    peer_waits: list[float] = []
    stage_tail_waits: list[float] = []
    stage_ends: dict[int, float] = {}
    for rank, per_category in arrays.items() if windows_s is not None else ():
        stage = 0 if stages is None else stages[rank]
        last = max(float(ends.max()) for _, ends in per_category.values() if len(ends))
        stage_ends[stage] = max(stage_ends.get(stage, last), last)
    exposed: dict[str, list[float]] = {kind: [] for kind in COMM_CATEGORIES}
    totals: dict[str, list[float]] = {kind: [] for kind in COMM_CATEGORIES}
    for rank, per_category in arrays.items():
        cs, ce = _cat(per_category, COMPUTE_CATEGORIES)
        all_s, all_e = _cat(per_category, COMM_CATEGORIES)
        ratios.append(covered(all_s, all_e) / step_time_s if step_time_s > 0 else 0.0)
        waits.append(max(step_time_s - covered(cs, ce), 0.0))
        hs, he = _cat(per_category, (HOST_CATEGORY,))
        hosts.append(uncovered(hs, he, np.concatenate((cs, all_s)), np.concatenate((ce, all_e))) if len(hs) else 0.0)
        unions.append(uncovered(all_s, all_e, cs, ce))
        busy_s, busy_e = np.concatenate((cs, all_s)), np.concatenate((ce, all_e))
        window_s = None if windows_s is None else windows_s[rank]
        if window_s is not None and window_s < step_time_s:
            stage_end = min(max(stage_ends[0 if stages is None else stages[rank]], window_s), step_time_s)
            peer_waits.append(uncovered(np.array([window_s]), np.array([stage_end]), busy_s, busy_e))
            stage_tail_waits.append(uncovered(np.array([stage_end]), np.array([step_time_s]), busy_s, busy_e))
        else:
            peer_waits.append(0.0)
            stage_tail_waits.append(0.0)
        for kind in COMM_CATEGORIES:
            ks, ke = _cat(per_category, (kind,))
            totals[kind].append(covered(ks, ke))
            exposed[kind].append(uncovered(ks, ke, cs, ce))
    return {
        "comm_ratio": _mean(ratios, weights),
        "exposed_comm_s": {kind: _mean(exposed[kind], weights) for kind in COMM_CATEGORIES},
        "comm_s": {kind: _mean(totals[kind], weights) for kind in COMM_CATEGORIES},
        "exposed_union_s": _mean(unions, weights),
        "wait_s": _mean(waits, weights),
        "host_s": _mean(hosts, weights),
        "peer_wait_s": _mean(peer_waits, weights),
        "stage_tail_wait_s": _mean(stage_tail_waits, weights),
    }


def idle_after_last_op_s(rows: StepRows, step_time_s: float) -> float:
    """The mean over ranks of the time from a rank's last op's end to the end of the step, seconds: 0 where
    every rank works to the end, a parameter-server worker's idle time after its last iteration where it
    finishes before the slowest (async, ssp)."""
    ranks, inverse = np.unique(rows.ops["rank"], return_inverse=True)
    last = np.full(len(ranks), -np.inf)
    np.maximum.at(last, inverse, rows.ops["end_s"])
    return _mean(np.maximum(step_time_s - last, 0.0).tolist(), rows.weights_of(ranks))


def _mean(values: list[float], weights: np.ndarray | None = None) -> float:
    """The mean over ranks (weighed by ``weights`` where ranks weigh unlike), 0 where no rank has ops."""
    if not values:
        return 0.0
    return float(np.mean(values) if weights is None else np.average(values, weights=weights))


def traffic_bytes(rows: StepRows, correction: Mapping[str, float] | None = None) -> dict:
    """Bytes a GPU sends per step for each kind of communication, mean over the simulated ranks: flows sent by
    a rank that has ops (folded peers and mirrors are the same traffic again), matched to their collective's
    category, plus the ``correction`` per category (a folded run's groups' members' mean beyond the simulated
    ranks' own share, less the load flows carry beyond the bytes sent: engine/plans.py `traffic_correction`).
    A sum within float noise of a whole number of bytes is taken as that number before the mean
    (SUM_NOISE_REL: 12 MiB per GPU read 12582911.999999998)."""
    ops, flows = rows.ops, rows.flows
    collectives = ops["kind"] == COLLECTIVE_KIND
    categories = dict(zip(ops["key"][collectives].tolist(), ops["category"][collectives].tolist()))
    ranks = np.unique(ops["rank"])
    if len(ranks) == 0:
        return {kind: 0.0 for kind in COMM_CATEGORIES}
    sent = np.isin(flows["src"], ranks)
    sent_bytes = flows["bytes"][sent]
    weights = rows.weights_of(flows["src"][sent])
    sums = grouped_sums(list(map(categories.get, flows["key"][sent].tolist(), repeat(""))),
                        (sent_bytes if weights is None else sent_bytes * weights).tolist())
    for kind, extra in (correction or {}).items():
        if extra:
            sums[kind] = sums.get(kind, 0.0) + extra
    weight = rows.ranks_weight()
    return {kind: _whole_if_noise(sums.get(kind, 0.0)) / weight for kind in COMM_CATEGORIES}


SUM_NOISE_REL = 1e-12
"""A sum of bytes this close to a whole number, relatively, is that number: summing the flows' shares of a
message (NVLS's n/p, a split over channels) and a folded run's corrections leaves a few ulps of float noise
(100663295.99999998 for 96 MiB, 2e-16), while a mean of told bytes that is truly fractional (34.8 MiB in all:
a fraction of 5e-9) is kept."""


def _whole_if_noise(total: float) -> float:
    """``total``, as the whole number it is within SUM_NOISE_REL of, if any: it moves a sum by at most
    SUM_NOISE_REL of it (half a byte at 5e11 bytes), so a real half byte of a sum below that (100.5) is kept."""
    whole = round(total)
    return float(whole) if abs(total - whole) <= SUM_NOISE_REL * abs(total) else float(total)
