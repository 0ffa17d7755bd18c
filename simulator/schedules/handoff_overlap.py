"""Which actions of a pipeline schedule may run while one of their rank's hand-offs is in flight.

A program built from a schedule (parallel/program.py) runs each rank's actions in order on its compute stream;
a hand-off (the P2P transfer of a forward's activation to the next stage, or of a backward's gradient to the
one before) starts once its producing action has finished, its sends to one peer in the order they are issued,
and its receiving action waits for it. Receives are posted on an asynchronous stream with no other wait, so
nothing else orders a hand-off: an action runs beside it unless a chain of those waits puts the action before
its producer or after its receiver (engine/ordering.py answers the same on the built program). The scale
estimate counts the copies of the TP collectives that the hand-offs join to the simulated ones from this
(scale.py `_tp_beside_pipeline`): with one micro-batch the stages run one after the other and no action runs
beside a hand-off; with more, all but the first stage's first forward and last backward do under 1F1B.

Actions are ordered by vector clocks, one entry per pipeline rank, filled in one pass over the schedule:
O(actions x ranks), about 1 s of CPU for 1F1B over 16 ranks and 2,048 micro-batches (65,536 actions), worked out
once per schedule shape (`named_beside_handoffs`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from simulator.schedules.base import Placement, Schedule, rank_stages, stage_rank
from simulator.schedules.registry import build_schedule, schedule_placement


class _Handoff(NamedTuple):
    """A P2P hand-off: its producing and receiving actions, each as (rank, index in the rank's actions)."""

    producer: tuple[int, int]
    receiver: tuple[int, int]


def beside_handoffs(schedule: Schedule, v: int, placement: Placement) -> list[list[bool]]:
    """Per pipeline rank of ``schedule`` (``v`` chunks a rank, placed by ``placement``), for each of its actions,
    whether a hand-off that the rank sends or receives may be in flight while it runs. A hand-off between
    chunks on one rank is free (no transfer) and counts for none."""
    p = len(schedule)
    handoffs = _handoffs(schedule, p, v, placement)
    clocks = _clocks(schedule, handoffs)
    starts = np.cumsum([0] + [len(actions) for actions in schedule])
    table = np.concatenate(clocks) if clocks else np.zeros((0, p), dtype=np.int64)
    receivers = _receivers_in_send_order(handoffs)
    producer = np.array([starts[rank] + index for (rank, index), _ in handoffs], dtype=np.int64)
    receiver_rank = np.array([rank for rank, _ in receivers], dtype=np.int64)
    receiver_index = np.array([index for _, index in receivers], dtype=np.int64)
    ends = {"producer": np.array([rank for (rank, _), _ in handoffs], dtype=np.int64),
            "receiver": np.array([receiver.receiver[0] for receiver in handoffs], dtype=np.int64)}
    flags = []
    for rank, actions in enumerate(schedule):
        touching = (ends["producer"] == rank) | (ends["receiver"] == rank)
        after = table[producer[touching], rank]  # the rank's last action before each hand-off starts
        before = np.zeros(touching.sum(), dtype=np.int64)  # and its first one after the hand-off has ended
        for other in range(p):
            chosen = receiver_rank[touching] == other
            before[chosen] = np.searchsorted(clocks[rank][:, other], receiver_index[touching][chosen])
        spans = after + 1 < before
        marks = np.zeros(len(actions) + 1, dtype=np.int64)
        np.add.at(marks, after[spans] + 1, 1)
        np.add.at(marks, before[spans], -1)
        flags.append((np.cumsum(marks[:-1]) > 0).tolist())
    return flags


@lru_cache(maxsize=64)
def named_beside_handoffs(name: str, p: int, m: int, v: int) -> tuple[tuple[bool, ...], ...]:
    """`beside_handoffs` of the named schedule ``name`` for p ranks, m micro-batches and v chunks a rank, worked
    out once: the scale estimate asks it of every layout a search weighs."""
    flags = beside_handoffs(build_schedule(name, p, m, v), v, schedule_placement(name))
    return tuple(map(tuple, flags))


def _handoffs(schedule: Schedule, p: int, v: int, placement: Placement) -> list[_Handoff]:
    """The P2P hand-offs of ``schedule``: each forward's activation to the next virtual stage and each input
    gradient (a B or BW action's) to the one before, where the two stages sit on different ranks; in the order of
    their producers on each rank."""
    where: dict[tuple[str, int, int], tuple[int, int]] = {}
    for rank, actions in enumerate(schedule):
        stages = rank_stages(rank, p, v, placement)
        for index, action in enumerate(actions):
            if action.kind != "W":
                where[("F" if action.kind == "F" else "B", action.microbatch, stages[action.chunk])] = (rank, index)
    last = p * v - 1
    handoffs = []
    for (kind, microbatch, stage), producer in sorted(where.items(), key=lambda item: item[1]):
        target = stage + 1 if kind == "F" else stage - 1
        if 0 <= target <= last and stage_rank(target, p, placement) != producer[0]:
            handoffs.append(_Handoff(producer, where[(kind, microbatch, target)]))
    return handoffs


def _clocks(schedule: Schedule, handoffs: list[_Handoff]) -> list[np.ndarray]:
    """Per rank, the vector clock of each of its actions (a row): for each rank the index of its last action
    that happens before the action's end (the action's own index on its rank; -1 where none), through the
    ranks' action order and the hand-offs (a receiving action after its producer). A row changes from the one
    before only at a receiving action, so the rows between receives are filled as one block."""
    p = len(schedule)
    waits = {handoff.receiver: handoff.producer for handoff in handoffs}
    clocks = [np.full((len(actions), p), -1, dtype=np.int64) for actions in schedule]
    done = [0] * p
    current = [np.full(p, -1, dtype=np.int64) for _ in schedule]
    progressed = True
    while progressed:
        progressed = False
        for rank, actions in enumerate(schedule):
            while done[rank] < len(actions):
                producer = waits.get((rank, done[rank]))
                if producer is not None:
                    if done[producer[0]] <= producer[1]:
                        break
                    np.maximum(current[rank], clocks[producer[0]][producer[1]], out=current[rank])
                stop = next((index for index in range(done[rank] + 1, len(actions)) if (rank, index) in waits),
                            len(actions))
                block = clocks[rank][done[rank]:stop]
                block[:] = current[rank]
                block[:, rank] = np.arange(done[rank], stop)
                current[rank][rank] = stop - 1
                done[rank] = stop
                progressed = True
    if any(count < len(actions) for count, actions in zip(done, schedule, strict=True)):
        raise ValueError("the schedule's hand-offs wait on one another in a cycle")
    return clocks


def _receivers_in_send_order(handoffs: list[_Handoff]) -> list[tuple[int, int]]:
    """For each hand-off, the earliest receiving action that waits for it to have ended: its own, or that of a
    later hand-off between the same two ranks, which leaves only after it (sends to one peer in issue order)."""
    earliest: dict[tuple[int, int], tuple[int, int]] = {}
    receivers: list[tuple[int, int]] = [(0, 0)] * len(handoffs)
    for position in reversed(range(len(handoffs))):
        handoff = handoffs[position]
        pair = (handoff.producer[0], handoff.receiver[0])
        known = earliest.get(pair)
        receiver = handoff.receiver if known is None or handoff.receiver[1] <= known[1] else known
        earliest[pair] = receivers[position] = receiver
    return receivers
