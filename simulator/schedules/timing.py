"""An exact, dependency-driven "ideal executor" of pipeline schedules: fixed durations, optional fixed P2P delay.

Used as the closed-form reference for tests and quick studies (the SimPy engine runs schedules for real).
Dependencies, with s the virtual stage an action's chunk holds under the placement and S = p v stages:
F(mb, s) needs F(mb, s - 1); the input-grad backward (B or BW) of (mb, s) needs that of (mb, s + 1), or
F(mb, S - 1) on the last stage, and its own forward; W needs its own B. Each rank runs its list in order; an
action starts when its rank is free and its dependencies are done (plus ``p2p`` when a dependency ran on another
rank). The two halves of an overlapped slot run back to back, each when its own input is there.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import SimulationError
from simulator.schedules.base import Action, Placement, Schedule, rank_stages

_Key = tuple[str, int, int]  # (kind, micro-batch, virtual stage)


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


def simulate_schedule(schedule: Schedule, f: float, b: float, w: float = 0.0, p2p: float = 0.0,
                      v: int | None = None, placement: Placement = "loop") -> ScheduleTiming:
    """Run ``schedule`` with per-stage durations f (forward), b (input grad) and w (weight grad); BW lasts b + w.
    ``placement`` says which virtual stage each chunk of a rank holds (see schedules.base.rank_stages).

    With v chunks per rank (inferred from the largest chunk index when not given) every chunk action lasts 1/v of
    its per-stage duration. Bubble fraction is the mean over ranks of idle time / makespan. Peak in-flight counts,
    per rank, the forwards (chunks) whose input-grad backward has not finished.
    """
    for value, name in ((f, "f"), (b, "b"), (w, "w"), (p2p, "p2p")):
        if value < 0:
            raise ValueError(f"duration {name} must be >= 0, got {value}")
    p = len(schedule)
    if v is None:
        v = 1 + max((a.chunk for rank in schedule for a in rank), default=0)
    durations = {"F": f / v, "B": b / v, "W": w / v, "BW": (b + w) / v}
    stages = [rank_stages(r, p, v, placement) for r in range(p)]
    owner = {stage: r for r in range(p) for stage in stages[r]}
    grad_kind = {(a.microbatch, stages[r][a.chunk]): a.kind for r, rank in enumerate(schedule) for a in rank
                 if a.kind in ("B", "BW")}
    last_stage = p * v - 1

    def dependencies(action: Action, rank: int) -> list[_Key]:
        stage = stages[rank][action.chunk]
        mb = action.microbatch
        if action.kind == "F":
            return [("F", mb, stage - 1)] if stage > 0 else []
        if action.kind == "W":
            return [("B", mb, stage)]
        own_forward: _Key = ("F", mb, stage)
        if stage == last_stage:
            return [own_forward]
        return [own_forward, (grad_kind.get((mb, stage + 1), "B"), mb, stage + 1)]

    finished: dict[_Key, float] = {}
    timelines: list[list[TimedAction]] = [[] for _ in range(p)]
    next_index = [0] * p
    free_at = [0.0] * p
    progressed = True
    while progressed:
        progressed = False
        for rank in range(p):
            actions = schedule[rank]
            while next_index[rank] < len(actions):
                action = actions[next_index[rank]]
                deps = dependencies(action, rank)
                if any(dep not in finished for dep in deps):
                    break
                start = free_at[rank]
                for dep in deps:
                    delay = p2p if owner[dep[2]] != rank else 0.0
                    start = max(start, finished[dep] + delay)
                end = start + durations[action.kind]
                finished[(action.kind, action.microbatch, stages[rank][action.chunk])] = end
                timelines[rank].append(TimedAction(action, start, end))
                free_at[rank] = end
                next_index[rank] += 1
                progressed = True
    stuck = [rank for rank in range(p) if next_index[rank] < len(schedule[rank])]
    if stuck:
        waits = "; ".join(f"rank {r} at {schedule[r][next_index[r]]}" for r in stuck)
        raise SimulationError(f"pipeline schedule deadlocks: no action can start ({waits})")
    return _summarise(schedule, timelines)


def _summarise(schedule: Schedule, timelines: list[list[TimedAction]]) -> ScheduleTiming:
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
    kept = kept_for_w if kept_for_w is not None else [0.0] * len(chunk_weight)
    held = peak = 0.0
    for action in actions:
        if action.kind == "F":
            held += chunk_weight[action.chunk]
        elif action.kind == "B":
            held += kept[action.chunk] - chunk_weight[action.chunk]
        elif action.kind == "BW":
            held -= chunk_weight[action.chunk]
        else:
            held -= kept[action.chunk]
        peak = max(peak, held)
    return peak
