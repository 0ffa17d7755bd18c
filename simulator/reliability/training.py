"""Training between interruptions, advanced in whole segments: steps, checkpoint triggers, stalls and
background writes, computed in closed form between two events of the job process (never a step at a time).

A cycle is `interval_steps` steps followed by a trigger. Sync: the trigger stalls training for the write and
the checkpoint completes at the end of the stall. Async: the trigger waits for the previous write if it is
still running, stalls for the snapshot, then the write runs for `write_s` in the background while steps take
(1 + slowdown) times longer; the checkpoint completes when its write does. A failure loses the work since the
trigger of the last *completed* checkpoint, and any checkpoint still being written. Whole identical cycles
are jumped arithmetically (their checkpoints logged as arrays), so a segment costs O(1) Python work.

In-memory tier: a snapshot is taken when `memory_interval_steps` steps have passed since the last trigger of
either tier (a storage trigger takes its place where both fall due); training stalls for it, and it is complete at
the stall's end. A failure rolls back to the newest in-memory snapshot when the job says the lost hosts' copies
survive on peers and it is newer than the last completed storage checkpoint; else to that checkpoint (an in-memory
restore keeps the storage checkpoint: the work kept between the two is lost too if a later failure falls back to
it). Cycles are not jumped with an in-memory tier: each snapshot costs O(1) Python work.

Slow-step time: training time (`wall`, which only grows) is one axis on which failures cut out the lost
spans. A segment in a slower state than healthy records its span and each cause's share of it that is extra
time (together 1 - healthy-equivalent step / step, split by attribution.py); at the end each cause gets its
shares of the kept part. A state faster per token than healthy has no shares: its kept time is productive.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from simulator.reliability.checkpoint import SegmentCosts
from simulator.reliability.events import JobEvents, StorageReason, Tier

StallKind = Literal["write", "wait", "snapshot", "memory"]
"""What a checkpoint stall is: a sync write, the wait for an async write still running, an async write's
snapshot to host memory, or an in-memory tier's snapshot."""

EPS = 1e-6
"""Time tolerance (s): events closer than this coincide."""
STEP_EPS = 1e-9


class Mark(NamedTuple):
    """Progress at a checkpoint trigger: steps, training wall time, healthy-equivalent time; its time (a
    NamedTuple: one is made per trigger, and it is the clock's hottest allocation)."""

    steps: float
    wall: float
    equiv: float
    time: float


class CheckpointClock:
    """Progress, checkpoints and the time they cost, for one replication."""

    def __init__(self, events: JobEvents) -> None:
        self.events = events
        self.steps = 0.0
        self.wall = 0.0
        self.equiv = 0.0
        self.lost_wall = 0.0
        self.lost_equiv = 0.0
        self.stall_s = 0.0
        self.slow_s = 0.0
        self.since = 0.0
        self.mark = Mark(0.0, 0.0, 0.0, 0.0)
        self.stall_end: float | None = None
        self.stall_kind: StallKind | None = None
        self.stall_mark: Mark | None = None
        self.write_end: float | None = None
        self.write_start = 0.0
        self.write_mark: Mark | None = None
        self.stop_mark: Mark | None = None
        self.stop_written = 0.0
        self.written = 0
        """Storage checkpoints completed (periodic and at planned stops): those its event log holds."""
        self.slow_spans: list[tuple[float, float, tuple[tuple[str, float], ...]]] = []
        self.lost_spans: list[tuple[float, float]] = []
        self.since_memory = 0.0
        self.memory_mark: Mark | None = None
        self.lost_since_mark: list[tuple[float, float, float]] = []
        """Spans of the training time (start, end, healthy-equivalent time) lost since the storage checkpoint
        by in-memory restores: a fall-back to it loses only the rest."""
        self.restored_from: Tier = "storage"
        """The tier the last roll-back restored from: `storage` or `memory`."""
        self.storage_because: StorageReason = "newer"
        """Why the last roll-back to storage did not restore from memory (read where `restored_from` is storage)."""

    def advance(self, t: float, t_end: float, c: SegmentCosts, shares: tuple[tuple[str, float], ...] = ()) -> None:
        """Train from ``t`` to ``t_end`` in one cluster state, slower than healthy by ``shares``: each cause's
        part of its training time that is extra time."""
        start = self.wall
        self._advance(t, t_end, c)
        if shares and self.wall > start:
            self.slow_spans.append((start, self.wall, shares))

    def _advance(self, t: float, t_end: float, c: SegmentCosts) -> None:
        limit = t_end - EPS
        while t < limit:
            if self.stall_end is not None:
                end = min(self.stall_end, t_end)
                self.stall_s += end - t
                t = end
                if t >= self.stall_end - EPS:
                    self._stall_done(t, c)
                continue
            if self.since <= STEP_EPS and not c.memory_interval_steps and (
                    (c.mode == "sync" and self.write_end is None)
                    or (c.mode == "async" and self.write_end is not None and self.write_start == t)):
                t = self._jump_cycles(t, t_end, c)
                if t >= limit:
                    break
            t = self._train(t, t_end, c)

    def _train(self, t: float, t_end: float, c: SegmentCosts) -> float:
        """Train until the next trigger, the end of a background write or ``t_end``. Reaching the trigger
        adds exactly the steps left, and the counts are whole there: rounding in times never leaves a sliver of
        a step behind (77,726.99999999999 steps in a checkpoint row before). A state with fewer steps per
        interval (a duration interval in a slower state) can find its trigger overdue: it comes at the end of
        the step in flight, as a checkpoint holds whole steps (before, at once: a checkpoint of 441,275.1085
        steps, and every later row with that fraction)."""
        write_end = self.write_end
        writing = write_end is not None and write_end > t
        step_wall = c.step_s * (1.0 + c.slowdown) if writing else c.step_s
        in_flight = max(math.ceil(self.steps - STEP_EPS) - self.steps, 0.0)
        remaining = max(c.interval_steps - self.since, in_flight)
        if c.memory_interval_steps:
            remaining = min(remaining, max(c.memory_interval_steps - self.since_memory, in_flight))
        trigger = t + remaining * step_wall
        stop = min(t_end, write_end) if writing and write_end is not None else t_end
        triggered = trigger <= stop
        if triggered:
            stop, steps = trigger, remaining
        else:
            steps = min((stop - t) / step_wall, remaining)
        self.steps += steps
        self.since += steps
        self.since_memory += steps
        if triggered:
            self.steps, self.since, self.since_memory = map(float, map(round, (self.steps, self.since,
                                                                              self.since_memory)))
        self.wall += steps * c.step_s
        self.equiv += steps * c.equivalent_step_s
        if writing:
            self.slow_s += steps * c.step_s * c.slowdown
        if write_end is not None and stop >= write_end - EPS:
            self._write_done()
        if self.since >= c.interval_steps - STEP_EPS:
            self._trigger(stop, c)
        elif c.memory_interval_steps and self.since_memory >= c.memory_interval_steps - STEP_EPS:
            self.since_memory = 0.0
            self._stall(stop + c.memory_stall_s, "memory", self._progress(stop))
        return stop

    def _trigger(self, t: float, c: SegmentCosts) -> None:
        self.since = 0.0
        self.since_memory = 0.0
        mark = self._progress(t)
        if c.mode == "sync":
            self._stall(t + c.stall_s, "write", mark)
        elif self.write_end is not None:
            self._stall(self.write_end, "wait", mark)
        else:
            self._stall(t + c.stall_s, "snapshot", mark)

    def _progress(self, t: float) -> Mark:
        """The progress made so far, as a mark at time ``t``."""
        return Mark(self.steps, self.wall, self.equiv, t)

    def _after_cycles(self, cycles: int, t: float, c: SegmentCosts) -> Mark:
        """The progress at the trigger that ends the ``cycles``-th whole cycle from ``t``."""
        k, cycle = c.interval_steps, c.cycle
        return Mark(self.steps + cycles * k, self.wall + cycles * k * c.step_s,
                    self.equiv + cycles * k * c.equivalent_step_s, t + (cycles - 1) * cycle.period_s + cycle.train_s)

    def _stall(self, end: float, kind: StallKind, mark: Mark) -> None:
        self.stall_end, self.stall_kind, self.stall_mark = end, kind, mark

    def _stall_done(self, t: float, c: SegmentCosts) -> None:
        kind, mark = self.stall_kind, self.stall_mark
        assert mark is not None
        self.stall_end, self.stall_mark = None, None
        if kind == "write":
            self._complete(mark, t)
        elif kind == "memory":
            self.memory_mark = mark
            self.events.add("checkpoint", mark.time, t, step=mark.steps, tier="memory")
        elif kind == "wait":
            self._write_done()
            self._stall(t + c.stall_s, "snapshot", mark)
        else:
            self.write_start, self.write_end, self.write_mark = t, t + c.write_s, mark

    def _write_done(self) -> None:
        assert self.write_mark is not None and self.write_end is not None
        self._complete(self.write_mark, self.write_end)
        self.write_end, self.write_mark = None, None

    def _complete(self, mark: Mark, t: float) -> None:
        self.mark = mark
        self.lost_since_mark = []
        self.written += 1
        self.events.add("checkpoint", mark.time, t, step=mark.steps, tier="storage")

    def _jump_cycles(self, t: float, t_end: float, c: SegmentCosts) -> float:
        """Jump the whole cycles that fit before ``t_end``; return the time after them."""
        k = c.interval_steps
        train, stall, slow, period = c.cycle
        cycles = math.floor((t_end - t) / period + STEP_EPS)
        if cycles < 1:
            return t
        last = self._after_cycles(cycles, t, c)
        if c.mode == "sync":
            self.events.add_checkpoints(t + train, t + period, self.steps + k, period, k, cycles)
            self.written += cycles
            self.mark = last
        else:
            assert self.write_mark is not None
            first = self.write_mark
            self._complete(first, t + c.write_s)
            self.events.add_checkpoints(t + train, t + period + c.write_s, self.steps + k, period, k, cycles - 1)
            self.written += cycles - 1
            if cycles > 1:
                self.mark = self._after_cycles(cycles - 1, t, c)
            self.write_mark = last
            self.write_start = t + cycles * period
            self.write_end = self.write_start + c.write_s
        self.steps, self.wall, self.equiv = last.steps, last.wall, last.equiv
        self.stall_s += cycles * stall
        self.slow_s += cycles * slow
        return t + cycles * period

    def _roll_back(self, to: Mark) -> float:
        """Count the training since ``to`` as lost, resume from its steps and make it the last completed
        checkpoint at the training time reached (later losses count from here); return the work lost (s).
        Spans that in-memory restores already lost since it are not lost again."""
        lost, lost_equiv = self.wall - to.wall, self.equiv - to.equiv
        start = to.wall
        for span_start, span_end, span_equiv in self.lost_since_mark:
            lost -= span_end - span_start
            lost_equiv -= span_equiv
            if self.slow_spans:
                self.lost_spans.append((start, span_start))
            start = span_end
        self.lost_wall += lost
        if self.slow_spans:
            self.lost_spans.append((start, self.wall))
        self.lost_equiv += lost_equiv
        self.steps = to.steps
        self.mark = to._replace(wall=self.wall, equiv=self.equiv)
        self.lost_since_mark, self.memory_mark, self.restored_from = [], None, "storage"
        return lost

    def _restore_memory(self, to: Mark) -> float:
        """Count the training since the in-memory snapshot ``to`` as lost and resume from its steps, the storage
        checkpoint kept (`lost_since_mark` records the span); return the work lost (s)."""
        lost, lost_equiv = self.wall - to.wall, self.equiv - to.equiv
        self.lost_wall += lost
        self.lost_equiv += lost_equiv
        if self.slow_spans:
            self.lost_spans.append((to.wall, self.wall))
        self.lost_since_mark.append((to.wall, self.wall, lost_equiv))
        self.steps = to.steps
        self.memory_mark = to._replace(wall=self.wall, equiv=self.equiv)
        self.restored_from = "memory"
        return lost

    def _finish_write_ended_in_snapshot(self, t: float) -> None:
        """Complete a background write that ended by ``t`` during an in-memory snapshot's stall, which holds
        its completion back: a failure (`fail`) or a planned stop (`stop_cleanly`) inside it keeps that checkpoint."""
        if self.stall_kind == "memory" and self.write_end is not None and self.write_end <= t:
            self._write_done()

    def fail(self, t: float, memory_survives: bool = False) -> float:
        """A failure at ``t``: roll back to the newest in-memory snapshot where ``memory_survives`` (every lost
        host has a peer left) and it is newer than the last completed checkpoint, else to that checkpoint, noting
        why (`storage_because`); return the work lost (s)."""
        self._finish_write_ended_in_snapshot(t)
        marks: tuple[tuple[Mark | None, Tier], ...] = (
            (self.stall_mark, "memory" if self.stall_kind == "memory" else "storage"), (self.write_mark, "storage"),
            (self.stop_mark, "storage"))
        for mark, tier in marks:
            if mark is not None:
                self.events.add("checkpoint_lost", mark.time, t, step=mark.steps, tier=tier)
        memory = self.memory_mark
        newer = memory is not None and memory.steps > self.mark.steps
        if memory_survives and memory is not None and newer:
            lost = self._restore_memory(memory)
        else:
            lost = self._roll_back(self.mark)
            self.storage_because = "copies_lost" if newer else "newer"
        # The storage tier keeps its clock across a memory restore: its checkpoint and the steps since it hold.
        self.since = self.steps - self.mark.steps
        self.since_memory = 0.0
        self.stall_end, self.stall_mark, self.stall_kind = None, None, None
        self.write_end, self.write_mark = None, None
        self.stop_mark = None
        return lost

    def stop_cleanly(self, t: float, written: float, c: SegmentCosts) -> None:
        """A planned stop at ``t``: training ends (a checkpoint in flight is superseded) and the job writes a
        checkpoint of its whole steps, complete at ``written`` (`settle_stop`; its time is the maintenance's),
        or none where they are the last completed checkpoint's. A failure before then loses it (`fail`), as it
        does any checkpoint being written. The step in flight is cut: a checkpoint holds whole steps (the
        optimizer updates at a step's end), so its part trained is lost work once the checkpoint is complete
        (it was saved as a fraction of a step)."""
        self._finish_write_ended_in_snapshot(t)
        self.stall_end, self.stall_mark, self.stall_kind = None, None, None
        self.write_end, self.write_mark = None, None
        self.since = 0.0
        self.since_memory = 0.0
        whole = float(math.floor(self.steps + STEP_EPS))
        cut = max(self.steps - whole, 0.0)
        kept = Mark(whole, self.wall - cut * c.step_s, self.equiv - cut * c.equivalent_step_s, t)
        if whole == self.mark.steps:
            self._roll_back(kept)
        else:
            self.stop_mark, self.stop_written = kept, written

    @property
    def saved(self) -> bool:
        """Whether the last completed checkpoint holds every step trained: none since it was loaded (a restart
        rolls back to it) or written. One being written does not count: it is not durable until it completes."""
        return self.steps == self.mark.steps

    @property
    def stopping(self) -> bool:
        """Whether a planned stop's checkpoint is still being written."""
        return self.stop_mark is not None

    def settle_stop(self, t: float) -> None:
        """Complete the planned stop's checkpoint once its write has ended by ``t``."""
        if self.stop_mark is not None and t >= self.stop_written - EPS:
            self._complete(self.stop_mark, self.stop_written)
            self._roll_back(self.stop_mark)
            self.stop_mark = None

    def slow_by_cause(self) -> dict[str, float]:
        """Extra time of the kept steps in slower states, per cause (s)."""
        totals: dict[str, float] = {}
        lost, first = sorted(self.lost_spans), 0
        for start, end, shares in self.slow_spans:
            while first < len(lost) and lost[first][1] <= start:
                first += 1
            kept = end - start
            for lost_start, lost_end in lost[first:]:
                if lost_start >= end:
                    break
                kept -= min(end, lost_end) - max(start, lost_start)
            for cause, share in shares:
                totals[cause] = totals.get(cause, 0.0) + kept * share
        return totals
