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

Actions are ordered by vector clocks, one entry per pipeline rank, filled in one pass over the schedule's actions
in dependency order (schedules/timing.py `schedule_order`, whose cross-rank waits are the hand-offs); a rank's
clock changes only at a receiving action, so each rank's rows are stored between receives and expanded once:
O(actions x ranks) memory, worked out once per schedule shape (`named_beside_handoffs`).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simulator.schedules.base import Placement, RankActions
from simulator.schedules.registry import build_schedule
from simulator.schedules.timing import schedule_order


@dataclass(frozen=True, slots=True)
class _Handoffs:
    """The P2P hand-offs of a schedule, in the order of their producers on each rank: the producing and
    receiving actions' ranks and indices in their rank's actions."""

    producer_rank: np.ndarray
    producer_index: np.ndarray
    receiver_rank: np.ndarray
    receiver_index: np.ndarray


def beside_handoffs(schedule: RankActions, v: int, placement: Placement) -> list[list[bool]]:
    """Per pipeline rank of ``schedule`` (``v`` chunks a rank, placed by ``placement``), for each of its actions,
    whether a hand-off that the rank sends or receives may be in flight while it runs. A hand-off between
    chunks on one rank is free (no transfer) and counts for none."""
    p = len(schedule)
    clocks, handoffs = _clocks(schedule, v, placement)
    starts = np.cumsum([0] + [len(actions) for actions in schedule])
    table = np.concatenate(clocks) if clocks else np.zeros((0, p), dtype=np.int32)
    receiver_rank, receiver_index = _receivers_in_send_order(handoffs)
    producer = starts[handoffs.producer_rank] + handoffs.producer_index
    flags = []
    for rank, actions in enumerate(schedule):
        touching = (handoffs.producer_rank == rank) | (handoffs.receiver_rank == rank)
        last_before = table[producer[touching], rank].astype(np.int64)  # the rank's last action before each
        first_after = np.zeros(touching.sum(), dtype=np.int64)  # hand-off, and its first one after it has ended
        for other in range(p):
            chosen = receiver_rank[touching] == other
            first_after[chosen] = np.searchsorted(clocks[rank][:, other], receiver_index[touching][chosen])
        spans = last_before + 1 < first_after
        marks = np.zeros(len(actions) + 1, dtype=np.int64)
        np.add.at(marks, last_before[spans] + 1, 1)
        np.add.at(marks, first_after[spans], -1)
        flags.append((np.cumsum(marks[:-1]) > 0).tolist())
    return flags


@lru_cache(maxsize=64)
def named_beside_handoffs(name: str, p: int, m: int, v: int) -> tuple[tuple[bool, ...], ...]:
    """`beside_handoffs` of the named schedule ``name`` for p ranks, m micro-batches and v chunks a rank, worked
    out once: the scale estimate asks it of every layout a search weighs."""
    schedule = build_schedule(name, p, m, v)
    flags = beside_handoffs(schedule, v, schedule.placement)
    return tuple(map(tuple, flags))


def _clocks(schedule: RankActions, v: int, placement: Placement) -> tuple[list[np.ndarray], _Handoffs]:
    """Per rank, the vector clock of each of its actions (a row): for each rank the index of its last action
    that happens before the action's end (the action's own index on its rank; -1 where none), through the
    ranks' action order and the hand-offs (a receiving action after its producer); and the hand-offs."""
    order = schedule_order(schedule, v, placement)
    p = order.p
    index_on_rank = np.zeros(len(order.actions), dtype=np.int64)
    counts = [0] * p
    rows: list[list[np.ndarray]] = [[np.full(p, -1, dtype=np.int32)] for _ in range(p)]
    row_starts: list[list[int]] = [[0] for _ in range(p)]
    handoffs: list[tuple[int, int, int, int]] = []
    for position, (rank, waits) in enumerate(zip(order.ranks, order.dependencies, strict=True)):
        index = index_on_rank[position] = counts[rank]
        counts[rank] += 1
        for dependency, crosses in waits:
            if not crosses:
                continue
            source, source_index = order.ranks[dependency], int(index_on_rank[dependency])
            handoffs.append((source, source_index, rank, index))
            seen = rows[source][bisect_right(row_starts[source], source_index) - 1].copy()
            seen[source] = source_index
            if row_starts[rank][-1] != index:
                rows[rank].append(rows[rank][-1].copy())
                row_starts[rank].append(index)
            np.maximum(rows[rank][-1], seen, out=rows[rank][-1])
    clocks = []
    for rank in range(p):
        lengths = np.diff([*row_starts[rank], counts[rank]])
        clock = np.repeat(np.array(rows[rank], dtype=np.int32), lengths, axis=0)
        clock[:, rank] = np.arange(counts[rank], dtype=np.int32)
        clocks.append(clock)
    table = np.array(sorted(handoffs), dtype=np.int64).reshape(-1, 4)
    return clocks, _Handoffs(*table.T)


def _receivers_in_send_order(handoffs: _Handoffs) -> tuple[np.ndarray, np.ndarray]:
    """For each hand-off, the earliest receiving action that waits for it to have ended (its rank and index): its
    own, or that of a later hand-off between the same two ranks, which leaves only after it (sends to one peer
    in issue order)."""
    earliest: dict[tuple[int, int], int] = {}
    count = len(handoffs.producer_rank)
    receiver_index = np.zeros(count, dtype=np.int64)
    for position in reversed(range(count)):
        pair = (int(handoffs.producer_rank[position]), int(handoffs.receiver_rank[position]))
        own = int(handoffs.receiver_index[position])
        earliest[pair] = receiver_index[position] = min(own, earliest.get(pair, own))
    return handoffs.receiver_rank, receiver_index
