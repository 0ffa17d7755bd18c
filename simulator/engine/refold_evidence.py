"""Which refolds the runs stopped before them show will fall out of step, and the proof of it from the run that
keeps pace.

A run stopped at a hand-off instance out of step (`LockstepWatch`) tells when each copy of that instance ended.
A refold whose classes hold two copies that ended apart there, both ends of each in one class (one
representative's copies), will most likely fall out of step at that instance too: the stopped run is the unfolded
run up to the first of those ends, and stays close to it after. Close is not proof (what waits on the copies that
ended first, as the TP gather of a received gradient, goes on at once unfolded and later in the stopped run), so
such a refold is not given up but deferred (`predicted_apart`): the next refold runs first. Where one keeps pace,
its run is the unfolded run, in which each copy ends when its class's representative does; a deferred refold
whose class-mates' copies end apart there by more than three times the lockstep check's rounding (`CERTAIN`) could
not have kept pace, and is given up unrun (`refuted`). One that this does not refute still runs, in the order it
was proposed. The fold that stands kept pace in its own run either way; it is the one the refolds run in order
would give except where a refold put off would have ended the tries (simulation.py `_refolded`).

On the SC21 76.1B step (1,024 A100, TP 8 x PP 4 x DP 32, NCCL's double binary trees over the 32 replicas for every
gradient bucket) the stage fold stops at stage 3's last hand-off, 'recv bwd mb27', while the stage's last
gradient buckets reduce across the replicas: each replica's copy meets the trees' load of its host's place in
them, so the copies end in five groups, the two roots (replicas 0 and 31, each the other tree's leaf) first, then
the hosts of height 1 to 4 in one tree, 852.1, 855.2, 858.4 and 861.5 us later. The hosts' places in the tree
pipeline the same bytes to them at other times; the route classes by the loads the copies meet see the same
bytes and part the roots alone, and run they stop at the same instance (the heights' copies 3.1 us apart each);
the classes by place in the trees part all five, keep pace, and refute the loads' classes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.engine.lockstep import IN_STEP, OutOfStep
from simulator.metrics.events import EventLog
from simulator.parallel.folding import RankClasses
from simulator.parallel.layout import Layout
from simulator.program.ops import CollectiveOp, Op
from simulator.units import format_seconds

CERTAIN = 3 * IN_STEP
"""How far apart (relative to the later end) two representatives' ends must be for the copies they stand for to
have ended apart: a copy kept in pace ends within `IN_STEP` of its representative."""


@dataclass(frozen=True)
class StoppedHandOff:
    """A hand-off instance a run stopped at (``found``, with each copy's end there), named as every program of
    the step names it: its lowest rank's op's name, micro-batch and chunk."""

    found: OutOfStep
    name: str
    microbatch: int
    chunk: int


def stopped_hand_off(ops: Sequence[Op], found: OutOfStep) -> StoppedHandOff | None:
    """``found`` as a `StoppedHandOff` of the run of ``ops``, None where it is not a hand-off that stopped a
    run with its copies' ends told."""
    if not found.hand_off or found.stopped_at_s is None or not found.ends or not found.members:
        return None
    members = set(found.members)
    first = min((op for op in ops if op.id in members), key=lambda op: op.rank)
    return StoppedHandOff(found, first.name, first.microbatch, first.chunk)


def predicted_apart(classes: RankClasses, layout: Layout, known: Sequence[StoppedHandOff]) -> bool:
    """Whether a refold by ``classes`` holds two copies of a stopped hand-off in ``known`` that ended apart in the
    run stopped there (so that its run will most likely stop there too)."""
    return any(_class_apart(classes, layout, stopped.found.ends, IN_STEP) for stopped in known)


def refuted(classes: RankClasses, layout: Layout, known: Sequence[StoppedHandOff], kept: RankClasses,
            kept_ops: Sequence[Op], log: EventLog) -> str:
    """Why a refold by ``classes`` could not have kept pace ('' where the run that kept pace does not show it):
    in that run (by ``kept``, of ``kept_ops``, logged in ``log``: the unfolded run), two copies of a stopped
    hand-off in ``known`` of one class of ``classes`` ended apart by more than `CERTAIN`, each copy at its
    ``kept`` class's representative's end."""
    position = _positions(layout)
    kept_of = np.array(kept.of_position, dtype=np.int64)
    for stopped in known:
        ends = _representative_ends(stopped, kept_ops, kept_of, position, log)
        copies = [copy for copy, _ in stopped.found.ends]
        kept_classes = [tuple(kept_of[position[np.array(copy, dtype=np.int64)]].tolist()) for copy in copies]
        if not all(key in ends for key in kept_classes):
            continue
        apart = _class_apart(classes, layout, [(copy, ends[key]) for copy, key in zip(copies, kept_classes)],
                             CERTAIN)
        if apart:
            return f"{stopped.found.op} {stopped.name!r} (micro-batch {stopped.microbatch}): {apart}"
    return ""


def _representative_ends(stopped: StoppedHandOff, ops: Sequence[Op], kept_of: np.ndarray, position: np.ndarray,
                         log: EventLog) -> dict[tuple[int, ...], float]:
    """When each representative's copy of ``stopped`` ended in the run logged in ``log`` (its program's ``ops``),
    by the classes of the copy's ends (``kept_of`` by ``position``): the last of its flows from its group."""
    codes, keys = log.flow_keys()
    code_of = {key: code for code, key in enumerate(keys)}
    found = log.flow_columns(("src", "end_s"))
    src, end = found["src"], found["end_s"]
    ends: dict[tuple[int, ...], float] = {}
    for op in ops:
        if not (isinstance(op, CollectiveOp) and op.op == "send_recv" and op.name == stopped.name
                and op.microbatch == stopped.microbatch and op.chunk == stopped.chunk):
            continue
        rows = (codes == code_of.get(op.key, -1)) & np.isin(src, np.array(op.group, dtype=np.int64))
        if rows.any():
            ends[tuple(kept_of[position[np.array(op.group, dtype=np.int64)]].tolist())] = float(end[rows].max())
    return ends


def _class_apart(classes: RankClasses, layout: Layout, ends: Iterable[tuple[tuple[int, ...], float]],
                 relative: float) -> str:
    """Two copies (of ``ends``: each copy and when it ended) of one class of ``classes`` (both ends of each)
    that ended further apart than ``relative`` of the later end, said; '' where none did."""
    position = _positions(layout)
    of_position = np.array(classes.of_position, dtype=np.int64)
    by_class: dict[tuple[int, ...], list[tuple[float, tuple[int, ...]]]] = {}
    for copy, ended in ends:
        by_class.setdefault(tuple(of_position[position[np.array(copy, dtype=np.int64)]].tolist()), []).append(
            (ended, copy))
    for timed in by_class.values():
        (first, first_copy), (last, last_copy) = min(timed), max(timed)
        if last - first > relative * last:
            return (f"its copies over GPUs {list(first_copy)} and {list(last_copy)}, one representative's in this "
                    f"refold, end {format_seconds(last - first)} apart")
    return ""


def _positions(layout: Layout) -> np.ndarray:
    """Each rank's position in its pipeline stage (`RankClasses.of_position`'s index)."""
    position = np.empty(layout.world, dtype=np.int64)
    for stage in range(layout.pp):
        ranks = layout.stage_ranks(stage)
        position[np.array(ranks, dtype=np.int64)] = np.arange(len(ranks))
    return position
