"""An exact, dependency-driven "ideal executor" of pipeline schedules: fixed durations, optional fixed P2P delay.

Used as the closed-form reference for tests and quick studies, as the layout search's pipeline term with each
virtual stage's own durations (sweep/layouts.py) and for a run's `schedule_bubble_fraction` with its own pass times
(metrics/step.py); the SimPy engine runs schedules for real.
Dependencies, with s the virtual stage an action's chunk holds under the placement and S = p v stages:
F(mb, s) needs F(mb, s - 1); the input-grad backward (B or BW) of (mb, s) needs that of (mb, s + 1), or
F(mb, S - 1) on the last stage, and its own forward; W needs its own B. Each rank runs its list in order; an
action starts when its rank is free and its dependencies are done (plus ``p2p`` when a dependency ran on another
rank). The two halves of an overlapped slot run back to back, each when its own input is there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from simulator.errors import SimulationError
from simulator.schedules.base import (
    PLACEMENT_NAMES,
    Action,
    ActionKind,
    Placement,
    RankActions,
    placement_of,
    rank_stages,
)

_Key = tuple[ActionKind, int, int]  # (kind, micro-batch, virtual stage)
Durations = float | Sequence[float]
"""A duration per pipeline stage (split over its chunks), or one per virtual stage."""


class ScheduleDeadlock(SimulationError):
    """A schedule that cannot finish: no rank's next action can start. ``stuck_ranks``: the ranks with actions
    left, in rank order; ``waits``: for each of them, its next action, the rank that must first run an action
    that one waits for, and that action (the first of its dependencies not run)."""

    def __init__(self, message: str, stuck_ranks: tuple[int, ...], waits: tuple[tuple[Action, int, Action], ...]):
        super().__init__(message, stuck_ranks, waits)  # all in args, so that a process pool's pickle rebuilds it
        self.message = message
        self.stuck_ranks = stuck_ranks
        self.waits = waits

    def __str__(self) -> str:
        return self.message

    def cycle(self) -> tuple[int, ...]:
        """The ranks of the wait cycle that the first stuck rank's chain of waits reaches (each rank waiting for
        the next, the last for the first), from its lowest rank: ranks outside it only wait on it. Empty where
        the chain reaches a rank that never runs the action awaited (a table that validate_schedule refuses)."""
        waits_for = {rank: waited for rank, (_, waited, _) in zip(self.stuck_ranks, self.waits, strict=True)}
        chain: list[int] = []
        rank = self.stuck_ranks[0]
        while rank in waits_for and rank not in chain:
            chain.append(rank)
            rank = waits_for[rank]
        if rank not in chain:
            return ()
        loop = chain[chain.index(rank):]
        lowest = loop.index(min(loop))
        return tuple(loop[lowest:] + loop[:lowest])


@dataclass(frozen=True, slots=True)
class TimedAction:
    """One action with the time it ran, in the same unit as the durations given."""

    action: Action
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class ScheduleTiming:
    """What the ideal executor found: per-rank timelines, makespan, idle time, bubble and peak activations."""

    timeline: tuple[tuple[TimedAction, ...], ...]
    makespan: float
    idle_per_rank: tuple[float, ...]
    bubble_fraction: float
    peak_in_flight: tuple[int, ...]


def simulate_schedule(schedule: RankActions, f: Durations, b: Durations, w: Durations = 0.0, p2p: float = 0.0,
                      v: int | None = None, placement: Placement | None = None) -> ScheduleTiming:
    """Run ``schedule`` with durations f (forward), b (input grad) and w (weight grad); BW lasts b + w.
    ``placement`` says which virtual stage each chunk of a rank holds (see schedules.base.rank_stages); left out,
    the schedule's own (`Schedule.placement`: 'v' for zbv and dualpipev as built, 'loop' for a plain list).

    A number is one pipeline stage's duration: with v chunks per rank (inferred from the largest chunk index when
    not given) every chunk action lasts 1/v of it. A sequence gives each virtual stage's own duration (p v of
    them, in stage order), so stages may differ, as a model's first and last stages do. Bubble fraction is the
    mean over ranks of idle time / makespan. Peak in-flight counts, per rank, the forwards (chunks) whose
    input-grad backward has not finished.
    """
    if p2p < 0:
        raise ValueError(f"duration p2p must be >= 0, got {p2p}")
    p = len(schedule)
    if v is None:
        v = 1 + max((a.chunk for rank in schedule for a in rank), default=0)
    f_s, b_s, w_s = (_per_stage(value, name, p, v) for value, name in ((f, "f"), (b, "b"), (w, "w")))
    order = schedule_order(schedule, v, placement)
    starts, ends = execute(order, f_s, b_s, w_s, p2p)
    timelines: list[list[TimedAction]] = [[] for _ in range(p)]
    for index, action in enumerate(order.actions):
        timelines[order.ranks[index]].append(TimedAction(action, starts[index], ends[index]))
    return _summarise(schedule, timelines)


def _per_stage(value: Durations, name: str, p: int, v: int) -> list[float]:
    """Each virtual stage's action duration from a stage's duration (split over its v chunks) or a list of
    them; ValueError where one is negative or the list is not one per virtual stage."""
    durations = [value / v] * (p * v) if isinstance(value, int | float) else list(value)
    if len(durations) != p * v:
        raise ValueError(f"{name} gives {len(durations)} durations; the schedule has {p * v} virtual stages")
    if any(duration < 0 for duration in durations):
        raise ValueError(f"duration {name} must be >= 0, got {min(durations)}")
    return durations


@dataclass(frozen=True, slots=True)
class ScheduleOrder:
    """A schedule compiled for the ideal executor: its actions in an order in which each comes after its
    dependencies and after the actions before it on its rank. Which action may start first depends only on
    which have finished, never on when, so one order serves every set of durations (a layout search times the
    same schedule shape with many)."""

    actions: tuple[Action, ...]
    ranks: tuple[int, ...]
    """The rank each action runs on."""
    kinds: tuple[int, ...]
    """Each action's kind as an index into (F, B, W, BW)."""
    stages: tuple[int, ...]
    """The virtual stage each action's chunk holds."""
    dependencies: tuple[tuple[tuple[int, bool], ...], ...]
    """Per action: (index of an action it waits for, whether that one ran on another rank)."""
    p: int
    last: tuple[int, ...]
    """Each rank's last action's index (-1 for a rank without actions)."""


_KINDS: tuple[str, ...] = ("F", "B", "W", "BW")


def schedule_order(schedule: RankActions, v: int, placement: Placement | None = None) -> ScheduleOrder:
    """``schedule`` (v chunks per rank, ``placement``; left out, the schedule's own, `placement_of`) compiled for
    `execute`; ScheduleDeadlock where it deadlocks."""
    placement = placement_of(schedule) if placement is None else placement
    p = len(schedule)
    stages = [rank_stages(r, p, v, placement) for r in range(p)]
    owner = {stage: r for r in range(p) for stage in stages[r]}
    grad_kind = {(a.microbatch, stages[r][a.chunk]): a.kind for r, rank in enumerate(schedule) for a in rank
                 if a.kind in ("B", "BW")}
    last_stage = p * v - 1

    def dependencies(action: Action, stage: int) -> list[_Key]:
        mb = action.microbatch
        if action.kind == "F":
            return [("F", mb, stage - 1)] if stage > 0 else []
        if action.kind == "W":
            return [("B", mb, stage)]
        own_forward: _Key = ("F", mb, stage)
        if stage == last_stage:
            return [own_forward]
        return [own_forward, (grad_kind.get((mb, stage + 1), "B"), mb, stage + 1)]

    index_of: dict[_Key, int] = {}
    actions: list[Action] = []
    ranks: list[int] = []
    kinds: list[int] = []
    action_stages: list[int] = []
    waits: list[tuple[tuple[int, bool], ...]] = []
    last = [-1] * p
    next_index = [0] * p
    progressed = True
    while progressed:
        progressed = False
        for rank in range(p):
            rank_actions = schedule[rank]
            while next_index[rank] < len(rank_actions):
                action = rank_actions[next_index[rank]]
                stage = stages[rank][action.chunk]
                deps = dependencies(action, stage)
                if any(dep not in index_of for dep in deps):
                    break
                waits.append(tuple((index_of[dep], owner[dep[2]] != rank) for dep in deps))
                index_of[(action.kind, action.microbatch, stage)] = last[rank] = len(actions)
                actions.append(action)
                ranks.append(rank)
                kinds.append(_KINDS.index(action.kind))
                action_stages.append(stage)
                next_index[rank] += 1
                progressed = True
    stuck = tuple(rank for rank in range(p) if next_index[rank] < len(schedule[rank]))
    if stuck:
        blocked = "; ".join(f"rank {r} at {schedule[r][next_index[r]]}" for r in stuck)
        awaited: list[tuple[Action, int, Action]] = []
        for r in stuck:
            action = schedule[r][next_index[r]]
            kind, mb, stage = next(dep for dep in dependencies(action, stages[r][action.chunk])
                                   if dep not in index_of)
            awaited.append((action, owner[stage], Action(kind, mb, stages[owner[stage]].index(stage))))
        # naming the placement: a V table deadlocks in the loop one
        raise ScheduleDeadlock(f"pipeline schedule deadlocks in the {PLACEMENT_NAMES[placement]} placement: no "
                               f"action can start ({blocked})", stuck, tuple(awaited))
    return ScheduleOrder(tuple(actions), tuple(ranks), tuple(kinds), tuple(action_stages), tuple(waits), p,
                         tuple(last))


def execute(order: ScheduleOrder, f: list[float], b: list[float], w: list[float],
            p2p: float = 0.0, slower: dict[int, float] | None = None,
            whole: list[float] | None = None) -> tuple[list[float], list[float]]:
    """(start, end) of every action of ``order``, each virtual stage's forward, input-grad and weight-grad
    actions lasting ``f``, ``b`` and ``w`` of it (BW ``whole``, by default the sum of the two), a dependency on
    another rank's action arriving ``p2p`` after it ends (``slower``: after the actions it holds, by their index
    in ``order``, that long): each action starts when its rank is free and its dependencies have arrived."""
    durations = (f, b, w, whole if whole is not None else [grad + weight for grad, weight in zip(b, w, strict=True)])
    hops = slower or {}
    starts: list[float] = []
    ends: list[float] = []
    free_at = [0.0] * order.p
    for rank, kind, stage, deps in zip(order.ranks, order.kinds, order.stages, order.dependencies, strict=True):
        start = free_at[rank]
        for dep, crosses in deps:
            arrival = ends[dep] + hops.get(dep, p2p) if crosses else ends[dep]
            if arrival > start:
                start = arrival
        end = start + durations[kind][stage]
        starts.append(start)
        ends.append(end)
        free_at[rank] = end
    return starts, ends


def _summarise(schedule: RankActions, timelines: list[list[TimedAction]]) -> ScheduleTiming:
    makespan = max((t.end for rank in timelines for t in rank), default=0.0)
    idle = tuple(makespan - sum(t.end - t.start for t in rank) for rank in timelines)
    bubble = sum(idle) / (len(idle) * makespan) if makespan > 0 else 0.0
    return ScheduleTiming(
        timeline=tuple(tuple(rank) for rank in timelines),
        makespan=makespan,
        idle_per_rank=idle,
        bubble_fraction=bubble,
        peak_in_flight=tuple(peak_in_flight(actions) for actions in schedule),
    )


def peak_in_flight(actions: list[Action]) -> int:
    """Most forwards (chunks) one rank holds at once whose input-grad backward (B or BW) has not finished."""
    held = peak = 0
    for action in actions:
        if action.kind == "F":
            held += 1
            peak = max(peak, held)
        elif action.kind in ("B", "BW"):
            held -= 1
    return peak


def peak_held_weight(actions: list[Action], chunk_weight: list[float],
                     kept_for_w: list[float] | None = None) -> float:
    """Largest sum of ``chunk_weight[chunk]`` over the forwards one rank holds at once (as peak_in_flight
    counts them): the peak activation bytes when chunks keep different amounts, as Llama 3's embedding-only
    first chunk and head-only last chunk do. With ``kept_for_w``, walking the order, an input-grad backward
    (B) frees its chunk's activations but keeps ``kept_for_w[chunk]`` (its weight GEMMs' inputs and output
    gradients) until its W; a whole backward (BW) frees everything at once."""
    return max((after for _, _, after in _held_walk(actions, chunk_weight, kept_for_w)), default=0.0)


def transient_excess(actions: list[Action], chunk_weight: list[float], kept_for_w: list[float] | None,
                     transient: list[float]) -> float:
    """What a pass's ``transient[chunk]`` (bytes held on top while it runs one layer: the layer that recompute
    rematerializes) adds to `peak_held_weight`. A forward holds it over the chunk's last layer, when the rest
    of the chunk's activations are stored: at its end; a backward (B or BW) over the chunk's first layer
    backward, when nothing is freed yet: at its start. Later in a B, each layer's backward frees the layer's
    recomputed activations but what its W needs (more than the layer input the recompute stored), so the B's
    end, where `peak_held_weight` counts it, holds more than any moment of the B before. So it adds the whole
    transient where the peak comes after a forward (1F1B and every schedule without deferred W's) and nothing
    where a B's deferred W's set the peak above every forward's end plus its transient."""
    peak = peak_held_weight(actions, chunk_weight, kept_for_w)
    excess = 0.0
    for action, before, after in _held_walk(actions, chunk_weight, kept_for_w):
        if action.kind == "F":
            excess = max(excess, transient[action.chunk] - (peak - after))
        elif action.kind in ("B", "BW"):
            excess = max(excess, transient[action.chunk] - (peak - before))
    return excess


def _held_walk(actions: list[Action], chunk_weight: list[float], kept_for_w: list[float] | None
               ) -> Iterator[tuple[Action, float, float]]:
    """Each action of the order with the weight held before and after it (`peak_held_weight`'s walk)."""
    kept = kept_for_w if kept_for_w is not None else [0.0] * len(chunk_weight)
    held = 0.0
    for action in actions:
        before = held
        if action.kind == "F":
            held += chunk_weight[action.chunk]
        elif action.kind == "B":
            held += kept[action.chunk] - chunk_weight[action.chunk]
        elif action.kind == "BW":
            held -= chunk_weight[action.chunk]
        else:
            held -= kept[action.chunk]
        yield action, before, held
