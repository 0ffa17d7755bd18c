"""Purpose-built job studies: ETTR and goodput against the checkpoint interval, or the in-memory tier's
(`memory-interval`), optionally for several failure-rate multipliers, with Young's and Daly's intervals (and the
two-level optimum, with an in-memory tier) beside the simulated optimum.

Every point reruns the job simulation of the scenario with one override; the step times are simulated once
(states.py caches them) and every point uses the same seeds, so all points see the same failure arrivals
(common random numbers: differences between points are not drowned in replication noise). The simulated
optimum is the best grid point, refined by fitting ETTR(T) = a - b / T - c T (the first-order waste of a
checkpoint every T: cost b / T, lost work c T) to the grid points that hold an async write (below them each
checkpoint waits for it and the form does not hold): T* = sqrt(b / c) when the fit is concave and T* holds it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.config.loader import LoadedScenario, OptionSetting, load_scenario
from simulator.config.reliability import parse_interval
from simulator.config.yaml_source import FieldPath, dotted
from simulator.errors import InputError
from simulator.reliability.checkpoint import NO_SNAPSHOT_TAKEN, interval_steps, takes_no_snapshot
from simulator.reliability.simulate import (
    PreparedJob,
    job_event_limit,
    job_event_parts,
    memory_period_s,
    prepare_job,
    refuse_long_job,
    simulate_job,
)
from simulator.reliability.stats import mean_interval
from simulator.reliability.summary import (
    expected_slowdowns,
    no_failure_text,
    optimum_intervals,
    two_level_figures,
    write_floor_steps,
    young_daly_intervals,
)
from simulator.sweep.options import StudyName
from simulator.units import counted, format_count, format_duration, parse_duration

STORAGE_INTERVAL: FieldPath = ("checkpoint", "interval")
MEMORY_INTERVAL: FieldPath = ("checkpoint", "memory", "interval")
STUDY_FIELDS: dict[StudyName, FieldPath] = {"checkpoint-interval": STORAGE_INTERVAL,
                                            "memory-interval": MEMORY_INTERVAL, "mtbf": STORAGE_INTERVAL}
"""The interval each study's `--intervals` sets (its points' x), one per study of `sweep.options.STUDIES`."""


def refuse_sets_on_varied_field(loaded: LoadedScenario, study: StudyName) -> None:
    """A `--set` of the interval the study's points set (`STUDY_FIELDS`: the field, a section holding it or a
    field under it) refused at the `--set`, naming `--intervals`: every point writes over it, and the study's
    records kept it as if it applied. Only for a study whose points set the interval: a checkpoint-interval or
    memory-interval study on its default grid or `--intervals`, an mtbf study with `--intervals` (without, its
    points run at the scenario's interval, which the `--set` gives)."""
    field = STUDY_FIELDS[study]
    for override in loaded.overrides:
        if override.at_flag and override.overlaps(field):
            raise override.error(f"the {study} study sets {dotted(field)} at every point", dotted(override.path),
                                 f"a field the study does not vary; for {dotted(field)}: --intervals")


def varied_interval(summary: dict, varies: FieldPath) -> tuple[float, int]:
    """A point's interval in seconds and whole steps as its job ran it: the storage tier's (job_summary.json's
    `checkpoint`) or the in-memory tier's (`memory_checkpoint`)."""
    figures = summary["memory_checkpoint" if varies == MEMORY_INTERVAL else "checkpoint"]
    return figures["interval_s"], figures["interval_steps"]


def interval_steps_of(job: PreparedJob, varies: FieldPath) -> int:
    """The whole steps of the interval ``varies`` in a prepared job's healthy state."""
    return job.healthy.memory_interval_steps if varies == MEMORY_INTERVAL else job.healthy.interval_steps


def refuse_no_memory_tier(loaded: LoadedScenario, study: StudyName) -> None:
    """Refuse a study that varies the in-memory interval of a scenario without that tier, at `checkpoint`: setting
    the interval alone would make one, with default copies and bandwidth the user never chose."""
    if STUDY_FIELDS[study] == MEMORY_INTERVAL and loaded.scenario.checkpoint.memory is None:
        raise loaded.error(("checkpoint",), f"a {study} study varies checkpoint.memory.interval, and the scenario has "
                           "no in-memory tier", "checkpoint.memory: {interval: ..., replicas: ..., bandwidth: ...}")


@dataclass(frozen=True)
class StudyPoint:
    """One job simulation of a study: its interval and rate multiplier, what it gave, and the job's warning that
    its restarts mostly waited for hosts (`summary.waiting_warning`; None where they did not)."""

    interval_s: float
    multiplier: float
    summary: dict
    waiting: str | None
    varies: FieldPath = STORAGE_INTERVAL
    ettrs: tuple[float, ...] = ()
    """Each replication's ETTR (`JobResult.ettr_by_replication`), paired across points by their shared seeds."""

    def row(self) -> dict:
        """The point as a row of the study's table: each rate's mean over the replications, ETTR's and goodput's
        with their 95% intervals (job_summary.json's; goodput had none, so its chart had no band), and whether
        the healthy step is out of memory (`oom`: the row's figures are invalid); the GPU-hours and cost per million
        tokens trained (metrics/resources.py; the cost null without `costs.gpu_hour_price`)."""
        s = self.summary
        tokens, resources = s["goodput_tokens_per_s"] or {}, s.get("resources") or {}
        return {"rate_multiplier": self.multiplier, "interval_s": self.interval_s,
                "interval_steps": varied_interval(s, self.varies)[1], "ettr": s["ettr"]["mean"],
                "ettr_ci95_low": s["ettr"]["ci95_low"], "ettr_ci95_high": s["ettr"]["ci95_high"],
                "goodput_tokens_per_s": tokens.get("mean"),
                "goodput_tokens_per_s_ci95_low": tokens.get("ci95_low"),
                "goodput_tokens_per_s_ci95_high": tokens.get("ci95_high"),
                "goodput_steps_per_s": s["goodput_steps_per_s"]["mean"],
                "goodput_steps_per_s_ci95_low": s["goodput_steps_per_s"]["ci95_low"],
                "goodput_steps_per_s_ci95_high": s["goodput_steps_per_s"]["ci95_high"],
                "interruptions": s["interruptions"]["unexpected"]["mean"],
                "restart_waiting_for_hosts_s": s["restart_waiting_for_hosts_s"]["mean"], "mtbf_s": s["mtbf_s"],
                "young_interval_s": s["young_interval_s"], "daly_interval_s": s["daly_interval_s"],
                "young_formula_s": s["young_formula_s"], "daly_formula_s": s["daly_formula_s"],
                "gpu_hours_per_million_tokens": resources.get("gpu_hours_per_million_tokens"),
                "cost_per_million_tokens": resources.get("cost_per_million_tokens"), "oom": s["oom"]}


def parse_list(text: str, parse, option: str, example: str) -> list:
    """A comma list of distinct positive values (durations, numbers, or a number of steps as text: '10 steps')
    from the command line; an empty item is refused, as `trainsim search --tp 4,,8` and `trainsim collective
    --sizes 1MiB,,2MiB` refuse it."""
    if text.strip() and any(not part.strip() for part in text.split(",")):
        raise InputError(f"{text!r} has an empty item between commas", field=option, allowed=example)
    values = []
    for part in (part.strip() for part in text.split(",") if part.strip()):
        try:
            values.append(parse(part))
        except InputError as exc:  # says why: '5' read 'cannot read', where the unit was all it lacked
            raise exc.rebuilt(field=option, allowed=example) from None
        except ValueError:
            raise InputError(f"{part!r} is not a number", field=option, allowed=example) from None
    if not values or any(not 0 < value < math.inf for value in values if not isinstance(value, str)):
        raise InputError(f"{text!r} needs positive, finite values", field=option, allowed=example)
    twice = next((value for index, value in enumerate(values) if value in values[:index]), None)
    if twice is not None:  # the same point simulated twice, a duplicate row in the curve and its fit
        shown = twice if isinstance(twice, str) else f"{twice:g}{' s' if parse is _interval else ''}"
        raise InputError(f"{text!r} gives {shown} twice", field=option,
                         allowed=f"distinct values, {example}")
    return values


INTERVALS_ALLOWED = "durations with units or whole steps, e.g. 5min,10min,30min,1h or 10steps,20steps"


def parse_intervals(text: str) -> list[float | str]:
    """``--intervals``: comma-separated positive durations, in seconds, or numbers of steps, as text that
    `checkpoint.interval` reads ('10 steps')."""
    return parse_list(text, _interval, "--intervals", INTERVALS_ALLOWED)


def _interval(part: str) -> float | str:
    """One `--intervals` item: a duration in seconds, or 'N steps' as `checkpoint.interval` takes it (the
    option took durations only, where the scenario's field takes either)."""
    if not re.search(r"steps?\s*$", part, re.IGNORECASE):
        return parse_duration(part)
    try:
        return f"{parse_interval(part)} steps"
    except ValueError as exc:
        raise InputError(str(exc).split(" (allowed: ")[0]) from None


def parse_multipliers(text: str) -> list[float]:
    """``--multipliers``: comma-separated positive numbers."""
    return parse_list(text, float, "--multipliers", "numbers, e.g. 0.5,1,2,4")


DEFAULT_MULTIPLIERS: dict[StudyName, tuple[float, ...]] = {"checkpoint-interval": (1.0,),
                                                           "memory-interval": (1.0,), "mtbf": (0.5, 1.0, 2.0)}
"""The failure-rate multipliers a study runs without `--multipliers`: the scenario's own rate, and for an `mtbf`
study, whose variable they are, half and twice it too (one rate alone ran one point and drew it against the
checkpoint interval)."""


def require_horizon(loaded: LoadedScenario) -> None:
    """Refuse a job study of a scenario without `run.horizon`, at that field."""
    if loaded.scenario.run.horizon is None:
        raise loaded.error(("run", "horizon"), "a job study needs a horizon", "run.horizon: e.g. '54 d'")


DEFAULT_GRID_FACTORS = tuple(2.0 ** (k / 2) for k in range(-4, 5))
"""A checkpoint-interval study without `--intervals` tries the job's Daly interval times these: nine points in
ratios of sqrt 2 from 1/4 to 4 times it, wide enough for the optimum of a job whose failures are not
exponential (Weibull 0.5 with a 1 h restart: 1.38 times Daly, tests/test_reliability_study.py) and for the fit."""


@dataclass(frozen=True)
class IntervalGrid:
    """The default intervals of a checkpoint-interval study: Daly's interval of the job at ``rate_multiplier``
    (the geometric mean of the study's multipliers), its healthy step, the distinct whole numbers of steps nearest
    Daly x DEFAULT_GRID_FACTORS, none below the floor (the write floor, `summary.write_floor_steps`, of an async
    checkpoint; one step), ascending, with their durations; how many factors came out below the floor (raised to
    it) and how many past the horizon (left out: a job would write no checkpoint); and, where some came out
    below an async write floor, the one point below it that shows the cliff there (``cliff_steps``, the longest
    of those: its checkpoints wait for the write; the others below it only waited longer). A memory-interval
    study's (`memory_grid`) is built the same way around ``centre``, the two-level optimum's in-memory interval,
    leaving out, and counting in ``past_storage``, the points not below the storage interval (refused: no
    snapshot would be taken). A checkpoint-interval study's of a job with an in-memory tier leaves out, and counts
    in ``under_memory``, the points not longer than the tier's interval, ``memory_steps`` (refused likewise)."""

    centre_s: float
    step_s: float
    steps: tuple[int, ...]
    clamped: int
    past_horizon: int
    rate_multiplier: float = 1.0
    floor_steps: int = 1
    cliff_steps: int | None = None
    centre: str = "Daly's"
    past_storage: int = 0
    memory_steps: int = 0
    under_memory: int = 0

    @property
    def intervals_s(self) -> list[float]:
        return [steps * self.step_s for steps in self.steps]


def default_grid(loaded: LoadedScenario, force: bool = False,
                 on_healthy_step: Callable[[dict], None] | None = None,
                 multipliers: Sequence[float] = (1.0,)) -> IntervalGrid:
    """The intervals a checkpoint-interval study runs without `--intervals`, around the job's own Daly interval
    (`summary.young_daly_intervals`, its failure rates as written times the geometric mean of
    ``multipliers``: the study's curves, whose Daly intervals go as 1 / sqrt(multiplier), then straddle it),
    those past the horizon left out (`IntervalGrid` says which it keeps); refused, at `--intervals`, for a job
    without failures that interrupt it, which has none (`summary.no_failure_text` says which), and for one whose
    every point is past the horizon. ``on_healthy_step`` gets the healthy step's summary once it is simulated."""
    require_horizon(loaded)
    job = prepare_job(loaded, force=force)
    if on_healthy_step is not None:
        on_healthy_step(job.step_summary)
    mtbf, _, _ = optimum_intervals(job.plan, job.counts, job.healthy)
    centre = math.exp(sum(math.log(multiplier) for multiplier in multipliers) / len(multipliers))
    daly = None if mtbf is None else young_daly_intervals(job.healthy, mtbf / centre)[1]
    if daly is None:
        raise InputError(f"the job expects {no_failure_text(job.plan, job.counts)}, so it has no Daly interval to "
                         "build the default grid around", field="--intervals", allowed=INTERVALS_ALLOWED)
    step, horizon, write = job.healthy.step_s, job.plan.horizon_s, job.healthy.write_s
    floor = max(1, write_floor_steps(job.healthy))
    nearest = [round(daly * factor / step) for factor in DEFAULT_GRID_FACTORS]
    below = sum(n < floor for n in nearest)
    cliff = max((n for n in nearest if 1 <= n < floor), default=None)
    candidates = [max(floor, n) for n in nearest] + ([] if cliff is None else [cliff])
    writes = [n * step + write < horizon for n in candidates]  # the first write ends within the horizon
    past = writes[:len(nearest)].count(False)
    memory = job.healthy.memory_interval_steps or 0
    under_memory = sum(takes_no_snapshot(memory, n) for n, written
                       in zip(candidates[:len(nearest)], writes[:len(nearest)], strict=True) if written)
    steps = sorted({n for n, written in zip(candidates, writes, strict=True)
                    if written and not takes_no_snapshot(memory, n)})
    if not steps and under_memory:
        shown = _memory_interval_shown(loaded)
        raise InputError(f"Daly's interval ({format_duration(daly)}) x {max(DEFAULT_GRID_FACTORS):g} is not longer "
                         f"than checkpoint.memory.interval ({shown}), so every default point would be refused",
                         field="--intervals", allowed=f"intervals longer than {shown}")
    if not steps:
        raise InputError(f"Daly's interval ({format_duration(daly)}) x {min(DEFAULT_GRID_FACTORS):g} is longer "
                         f"than run.horizon ({format_duration(horizon)}): failures are too rare in the horizon for "
                         "checkpoints to matter", field="--intervals",
                         allowed=f"durations under {format_duration(horizon)}, e.g. "
                                 + ",".join(format_duration(horizon * share) for share in (0.125, 0.25, 0.5)))
    return IntervalGrid(daly, step, tuple(steps), below, past, centre, floor,
                        cliff if cliff in steps else None, memory_steps=memory, under_memory=under_memory)


def _memory_interval_shown(loaded: LoadedScenario) -> str:
    """`checkpoint.memory.interval` as a message names it: whole steps, or a duration in the project's format."""
    memory = loaded.scenario.checkpoint.memory
    assert memory is not None
    return counted(memory.interval, "step") if isinstance(memory.interval, int) else format_duration(memory.interval)


def refuse_under_memory_tier(base: LoadedScenario, intervals: Sequence[float | str], job: PreparedJob) -> None:
    """Refuse, at `--intervals`, a point not longer than the scenario's in-memory interval in whole steps of
    ``job``'s (the base scenario's) healthy step: each storage checkpoint restarts the snapshots' count, so the
    tier would take none and the point's scenario is refused (it was, blamed on the `--set` of the tier and
    naming the point as '113.1617 s'). Refused rather than left out, as two points of the same steps are."""
    memory, tier = job.healthy.memory_interval_steps or 0, base.scenario.checkpoint.memory
    if not memory or tier is None:
        return
    step = format_duration(job.healthy.step_s)
    for interval in intervals:
        steps = interval_steps(parse_interval(interval) if isinstance(interval, str) else interval, job.healthy.step_s)
        if not takes_no_snapshot(memory, steps):
            continue
        point = counted(steps, "step") if isinstance(interval, str) else format_duration(interval)
        limit = _memory_interval_shown(base)
        allowed = f"intervals longer than {limit}"
        if isinstance(interval, str) and not isinstance(tier.interval, int):  # compared in steps: say how many
            limit += f" = {counted(memory, 'step')} of {step}"
        elif not isinstance(interval, str) and isinstance(tier.interval, int):
            point += f" = {counted(steps, 'step')} of {step}"
        raise InputError(f"{point} is not longer than checkpoint.memory.interval ({limit}): {NO_SNAPSHOT_TAKEN}",
                         field="--intervals", allowed=allowed)


def memory_grid(loaded: LoadedScenario, force: bool = False,
                on_healthy_step: Callable[[dict], None] | None = None,
                multipliers: Sequence[float] = (1.0,)) -> IntervalGrid:
    """The in-memory intervals a memory-interval study runs without `--intervals`: whole steps nearest the
    two-level optimum's (two_level.py, which goes as 1 / sqrt(multiplier), taken at the geometric mean of
    ``multipliers``) times DEFAULT_GRID_FACTORS, at least a step, below the storage interval and ending within the
    horizon; refused, at `checkpoint` without the tier, and at `--intervals` where the optimum has no in-memory
    interval (no failure interrupts the job, or the tier buys nothing to first order) or every point is left
    out."""
    require_horizon(loaded)
    refuse_no_memory_tier(loaded, "memory-interval")
    job = prepare_job(loaded, force=force)
    if on_healthy_step is not None:
        on_healthy_step(job.step_summary)
    optimum = two_level_figures(job.plan, job.healthy)
    if optimum is None or optimum["memory_interval_s"] is None:
        why = (f"expects {no_failure_text(job.plan, job.counts)}" if optimum is None else
               "is best with storage alone to first order (the in-memory tier buys nothing: "
               "job_summary.json's memory_checkpoint.two_level)")
        raise InputError(f"the job {why}, so it has no two-level in-memory interval to build the default grid around",
                         field="--intervals", allowed=INTERVALS_ALLOWED)
    centre = math.exp(sum(math.log(multiplier) for multiplier in multipliers) / len(multipliers))
    memory = optimum["memory_interval_s"] / math.sqrt(centre)
    step, horizon, storage = job.healthy.step_s, job.plan.horizon_s, job.healthy.interval_steps
    nearest = [max(1, round(memory * factor / step)) for factor in DEFAULT_GRID_FACTORS]
    past_storage = sum(n >= storage for n in nearest)
    past = sum(n < storage and n * step >= horizon for n in nearest)
    steps = sorted({n for n in nearest if n < storage and n * step < horizon})
    if not steps:
        raise InputError(f"the two-level in-memory interval ({format_duration(memory)}) x "
                         f"{min(DEFAULT_GRID_FACTORS):g} is not below the storage interval "
                         f"({counted(storage, 'step')}) or the horizon", field="--intervals",
                         allowed=f"intervals below {counted(storage, 'step')}, {INTERVALS_ALLOWED}")
    return IntervalGrid(memory, step, tuple(steps), sum(round(memory * f / step) < 1 for f in DEFAULT_GRID_FACTORS),
                        past, centre, centre="the two-level in-memory optimum", past_storage=past_storage)


def fitted_optimum(intervals: list[float], ettr: list[float], floor_s: float = 0.0) -> float | None:
    """T* of the least-squares fit ETTR = a - b / T - c T to the points at or above ``floor_s`` (the async write
    floor, `summary.write_floor_steps`: below it each checkpoint waits for the write, ETTR goes as T / (W + S),
    and the form does not hold), when b and c come out positive and T* is not below the floor; else None (the
    best point then says more: the floor, or below it where the write nears the MTBF)."""
    kept = [(t, value) for t, value in zip(intervals, ettr, strict=True) if t >= floor_s * (1 - 1e-12)]
    if len(kept) < 3:
        return None
    t = np.asarray([t for t, _ in kept], dtype=float)
    design = np.column_stack([np.ones_like(t), -1.0 / t, -t])
    (_, b, c), *_ = np.linalg.lstsq(design, np.asarray([value for _, value in kept], dtype=float), rcond=None)
    if b <= 0 or c <= 0 or math.sqrt(b / c) < floor_s:
        return None
    return math.sqrt(b / c)


def curve_is_flat(ettr: list[float], best_ci95_low: float | None) -> bool:
    """Whether a curve of several intervals is flat within its confidence intervals: every point's mean ETTR lies
    inside the best point's 95% interval, so no interval tried is told apart from the best (a study of 4
    replications whose points differ by 0.01% against intervals of +-2% named one "best" without comment)."""
    return len(ettr) > 1 and best_ci95_low is not None and min(ettr) >= best_ci95_low


def paired_differences(points: list[StudyPoint], best: StudyPoint) -> list[dict]:
    """The best point's ETTR less each of its neighbours' on the interval grid (``points`` in interval order), as
    the mean of the per-replication differences and its 95% interval: every point runs the same seeds, so the
    replications pair, and the paired interval is far narrower than the points' own, which overlap on a curve
    near its optimum (the 70B job's 211 s, 295.5 s and 419 s, 10 replications). An interval above 0 tells the
    best apart from that neighbour; one holding 0 does not. Empty without the per-replication values or with one
    replication."""
    at = points.index(best)
    found = []
    for neighbour in (points[at - 1] if at > 0 else None, points[at + 1] if at + 1 < len(points) else None):
        if neighbour is None or len(best.ettrs) < 2 or len(neighbour.ettrs) != len(best.ettrs):
            continue
        difference = mean_interval([b - n for b, n in zip(best.ettrs, neighbour.ettrs, strict=True)],
                                   bounds=(-1.0, 1.0))
        found.append({"interval_s": neighbour.interval_s, "ettr_difference": difference["mean"],
                      "ci95_low": difference["ci95_low"], "ci95_high": difference["ci95_high"],
                      "told_apart": difference["ci95_low"] is not None and difference["ci95_low"] > 0})
    return found


def copies_lost(summary: dict) -> float | None:
    """The restores a replication of a job found no in-memory copy for (job_summary.json's
    `memory_checkpoint.storage_because.copies_lost` mean); None without the tier."""
    memory = summary.get("memory_checkpoint")
    return None if memory is None else memory["storage_because"]["copies_lost"]["mean"]


def curve_summary(points: list[StudyPoint]) -> dict:
    """Best grid point, whether the curve is flat (`curve_is_flat`), fitted optimum, Young and Daly of one
    multiplier's interval curve, whether its healthy step is out of memory (`oom`: its figures are invalid), and
    the warning of its point whose restarts waited longest for hosts among those
    that warned of it (None where none did: the wait is much alike from point to point, so one is told, not
    each)."""
    points = sorted(points, key=lambda p: p.interval_s)
    best = max(points, key=lambda p: p.summary["ettr"]["mean"])
    first = points[0].summary
    warned = [p for p in points if p.waiting is not None]
    waited = max(warned, key=lambda p: p.summary["restart_waiting_for_hosts_s"]["mean"], default=None)
    return {
        "rate_multiplier": points[0].multiplier,
        "replications": first["replications"],
        "oom": first["oom"],
        "mtbf_s": first["mtbf_s"],
        "horizon_s": first["horizon_s"],
        "expected_slowdowns": expected_slowdowns(first["failure_model"]),
        "checkpoint_cost_s": first["checkpoint"]["cost_s"],
        "restart_s": first["restart"]["total_s"],
        "young_interval_s": first["young_interval_s"],
        "daly_interval_s": first["daly_interval_s"],
        "young_formula_s": first["young_formula_s"],
        "daly_formula_s": first["daly_formula_s"],
        "young_daly_cost_s": first["young_daly_cost_s"],
        "two_level": (first.get("memory_checkpoint") or {}).get("two_level"),
        "best_copies_lost": copies_lost(best.summary),
        "write_floor_steps": first["write_floor_steps"],
        "write_floor_s": first["write_floor_s"],
        "best_interval_s": best.interval_s,
        "best_ettr": best.summary["ettr"]["mean"],
        "flat": curve_is_flat([p.summary["ettr"]["mean"] for p in points], best.summary["ettr"]["ci95_low"]),
        "best_against_neighbours": paired_differences(points, best),
        "fitted_optimum_s": fitted_optimum([p.interval_s for p in points],
                                           [p.summary["ettr"]["mean"] for p in points], first["write_floor_s"]),
        "points": [{**p.row(), "ettrs": list(p.ettrs)} for p in points],
        "warnings": [] if waited is None or waited.waiting is None else [waited.waiting],
        "warnings_interval_s": None if waited is None else waited.interval_s,
    }


def run_study(scenario: str | Path, overrides: list[str], intervals: Sequence[float | str],
              multipliers: list[float], force: bool = False,
              on_healthy_step: Callable[[dict], None] | None = None,
              on_point_warnings: Callable[[list[dict]], None] | None = None,
              on_scenario_warnings: Callable[[list[str]], None] | None = None,
              progress: Callable[[int, int], None] | None = None, workers: int = 0,
              states_progress: Callable[[int, int], None] | None = None,
              states_sharing: Callable[[int], None] | None = None,
              foresight_progress: Callable[[int, int], None] | None = None,
              workers_warning: Callable[[str], None] | None = None,
              study: StudyName = "checkpoint-interval") -> dict:
    """Simulate every (multiplier, interval) point; one curve summary per multiplier. The intervals set the field
    ``study`` varies (`STUDY_FIELDS`: a `memory-interval` study's, refused without the tier, the in-memory one). A
    multiplier scales the scenario's own failure rates, its `faults.rate_multiplier` included (x 1 is the scenario
    as written). Without intervals, each multiplier has one point at the scenario's own interval (a
    checkpoint-interval study passes `default_grid`'s, a memory-interval one `default_grid`'s of that tier). Every
    point is checked, and checked against the job-event limit, before any runs (`refuse_long_study`); ``force`` runs
    points beyond it and beyond the scale limits (degraded or straggling states that would be unfolded steps past
    them). Then, before the first point's job is simulated, ``on_healthy_step`` gets the healthy step's summary once
    (the points change no step), ``on_scenario_warnings`` the warnings every point gives alike
    (`PreparedJob.scenario_wide`: a failure preset measured on another system) and ``on_point_warnings`` the others
    each point gives before it runs (`point_warnings`: an interval that writes no checkpoint), which `trainsim
    study` prints, and study.json keeps as `scenario_warnings` and `point_warnings`. ``progress(done, total)``
    hears of each point simulated. The points run one after another in this process, so each simulates its
    cluster states ahead on the other cores as `trainsim run` does (at most ``workers`` processes where not 0;
    ``foresight_progress`` hears of each replication of the pass that foresees them, ``states_progress`` of each
    state, ``states_sharing`` how many workers share those left, ``workers_warning`` of a worker that ended early
    or was not forked), unless this process is itself a worker; a later point finds the states an earlier one
    simulated (the points change no step; the state cache holds `states.CACHE_BYTES`, ~4,000 states of a 64-GPU
    job)."""
    base = load_scenario(scenario, overrides)
    require_horizon(base)
    refuse_no_memory_tier(base, study)
    varies = STUDY_FIELDS[study]
    if intervals:
        refuse_sets_on_varied_field(base, study)
    if intervals and study == "checkpoint-interval" and base.scenario.checkpoint.memory is not None:
        refuse_under_memory_tier(base, intervals, prepare_job(base, force=force))
    own = base.scenario.faults.rate_multiplier
    at: list[float | str | None] = [*intervals] if intervals else [None]
    grid = [[(multiplier, study_point_scenario(scenario, overrides, own * multiplier, multiplier, interval, varies))
             for interval in at] for multiplier in multipliers]
    points = [point for row in grid for point in row]
    jobs = [prepare_job(loaded, force=force) for _, loaded in points]
    if intervals:
        for first in range(0, len(jobs), len(at)):  # each multiplier's points
            refuse_same_steps(intervals, jobs[first:first + len(at)], varies)
    refuse_long_study(base, points, jobs, force)
    if on_healthy_step is not None:
        on_healthy_step(jobs[0].step_summary)
    scenario_wide = list(jobs[0].scenario_wide)
    if on_scenario_warnings is not None:
        on_scenario_warnings(scenario_wide)
    warned = point_warnings(points, jobs, varies)
    if on_point_warnings is not None:
        on_point_warnings(warned)
    curves: list[dict] = []
    for row in grid:
        done: list[StudyPoint] = []
        for multiplier, loaded in row:
            finished = len(curves) * len(at) + len(done)
            result = simulate_job(loaded, force=force, workers=workers, states_progress=states_progress,
                                  states_sharing=states_sharing,
                                  foresight_progress=foresight_progress, workers_warning=workers_warning,
                                  progress=_points_shown(progress, finished, len(points)))
            done.append(StudyPoint(varied_interval(result.summary, varies)[0], multiplier, result.summary,
                                   result.waiting, varies, result.ettr_by_replication))
            if progress is not None:
                progress(finished + 1, len(points))
        curves.append(curve_summary(done))
    return {"scenario": str(scenario), "overrides": list(overrides), "study": study, "varies": ".".join(varies),
            "scenario_warnings": scenario_wide, "point_warnings": warned, "curves": curves}


def refuse_same_steps(intervals: Sequence[float | str], jobs: list[PreparedJob],
                      varies: FieldPath = STORAGE_INTERVAL) -> None:
    """Refuse two intervals that round to the same whole number of steps (`--intervals 600s,10steps` on a 60 s
    step, or 10s,20s both raised to one step): a job checkpoints after whole steps, so both would be one point
    simulated twice, a duplicate in the curve and its fit, as the same value given twice is (`parse_list`
    refuses that). ``jobs``: one multiplier's points, in the order of ``intervals``; ``varies``, the interval they
    set."""
    first: dict[int, float | str] = {}
    for interval, job in zip(intervals, jobs, strict=True):
        steps = interval_steps_of(job, varies)
        if steps in first:
            raise InputError(f"{_interval_shown(first[steps])} and {_interval_shown(interval)} both run a checkpoint "
                             f"every {counted(steps, 'step')} (steps of {format_duration(job.healthy.step_s)}): the "
                             "same point twice", field="--intervals",
                             allowed=f"values distinct in whole steps, {INTERVALS_ALLOWED}")
        first[steps] = interval


def _interval_shown(interval: float | str) -> str:
    """A study interval as an error names it: '10 steps' as given, a duration in seconds ('100 s', as `parse_list`
    names a value given twice)."""
    return interval if isinstance(interval, str) else f"{interval:g} s"


def _points_shown(progress: Callable[[int, int], None] | None, finished: int, total: int
                  ) -> Callable[[int, int], None] | None:
    """A point's replication progress that shows the study's points instead (``finished`` of ``total``), so
    that the bar goes back to counting points once the point's states ahead are done; it stayed on the last
    phase ('foreseeing cluster states: 4/4 replications') while the point's replications ran."""
    if progress is None:
        return None
    return lambda _done, _replications: progress(finished, total)


def point_warnings(points: list[tuple[float, LoadedScenario]], jobs: list[PreparedJob],
                   varies: FieldPath = STORAGE_INTERVAL) -> list[dict]:
    """The warnings each study point gives before it runs (`PreparedJob.warnings`), with its rate multiplier and
    the interval ``varies`` it runs (in whole steps), in the study's order; a warning its multiplier's earlier
    point gave word for word (`summary.young_daly_warning`, the same at every interval) only there; none of the
    job's scenario-wide ones (`PreparedJob.scenario_wide`), which are no point's."""
    told: set[tuple[float, str]] = set()
    warned = []
    for (multiplier, _), job in zip(points, jobs, strict=True):
        for warning in job.warnings:
            if warning not in job.scenario_wide and (multiplier, warning) not in told:
                told.add((multiplier, warning))
                warned.append({"rate_multiplier": multiplier,
                               "interval_s": interval_steps_of(job, varies) * job.healthy.step_s, "warning": warning})
    return warned


def study_point_scenario(scenario: str | Path, overrides: list[str], rate_multiplier: float, multiplier: float,
                         interval: float | str | None, varies: FieldPath = STORAGE_INTERVAL) -> LoadedScenario:
    """The scenario of one study point: ``rate_multiplier`` (the scenario's own times ``multiplier``, which
    `--multipliers` names) and, where given, the interval ``varies`` (`--intervals`: seconds, or a number of
    steps as text)."""
    settings = [OptionSetting("--multipliers", ("faults", "rate_multiplier"), rate_multiplier, f"x {multiplier:g}")]
    if isinstance(interval, str):
        settings.append(OptionSetting("--intervals", varies, interval, interval))
    elif interval is not None:
        settings.append(OptionSetting("--intervals", varies, f"{interval!r} s", format_duration(interval)))
    return load_scenario(scenario, overrides, tuple(settings))


def refuse_long_study(base: LoadedScenario, points: list[tuple[float, LoadedScenario]], jobs: list[PreparedJob],
                      force: bool) -> None:
    """Refuse a study whose points (``jobs``: each one's checks and healthy step) would pass the job-event limit
    (`simulate.refuse_long_job`'s, the forced one with ``force``), once, before any point runs (its shortest
    intervals, a checkpoint every step on the 405B job, came last only in the default grid's order; a refusal
    there followed minutes of other points), naming how many replications every point fits in. A point over the
    limit at one replication is refused as that job is (its failures or maintenance, which the study does not
    set)."""
    events: list[float] = []
    labels: list[str] = []
    for (multiplier, loaded), job in zip(points, jobs, strict=True):
        steps, step = job.healthy.interval_steps, job.healthy.step_s
        period = job.healthy.cycle.period_s
        parts, _ = job_event_parts(loaded, job.model, job.counts, period, memory_period_s(job.healthy))
        events.append(sum(parts.values()))
        labels.append(f"a checkpoint every {counted(steps, 'step')} ({format_duration(steps * step)}) at rate "
                      f"x {multiplier:g}")
        if events[-1] > job_event_limit(force):
            refuse_long_job(loaded, job.model, job.counts, period, force=force,
                            memory_period=memory_period_s(job.healthy))
    replications, limit = base.scenario.run.replications, job_event_limit(force)
    worst = max(events)
    if worst * replications <= limit:
        return
    over = sum(count * replications > limit for count in events)
    changes = (f"at most {int(limit // worst):,} run.replications (every point then fits), or --intervals or "
               f"--multipliers without the {counted(over, 'point')} over it")
    beyond = "the most even --force runs" if force else "the job-event limit"
    raise base.error(("run", "replications"), f"{over} of the study's {counted(len(points), 'point')} would each "
                     f"handle more than {format_count(limit)} events over {counted(replications, 'replication')}, "
                     f"{beyond} (the most, {labels[events.index(worst)]}: ~{format_count(worst * replications)})",
                     changes if force else f"{changes}; or pass --force")


def write_study(out_dir: Path, study: dict) -> list[str]:
    """study.json (every curve with its points) and study.csv (one row per point, without the per-replication
    `ettrs`, which study.json holds), written as one run folder with a manifest (report/run_folder.py): a chart
    `trainsim plot goodput` saved into an earlier study's folder is removed with that study's files; returns the
    names written, manifest last."""
    import pandas as pd

    from simulator.report.run_folder import STUDY_FOLDER, trainsim_version, write_run_folder
    from simulator.report.tables import csv_text
    from simulator.report.writers import write_summary

    def write(stage: Path) -> None:
        rows = [{key: value for key, value in point.items() if key != "ettrs"}
                for curve in study["curves"] for point in curve["points"]]
        (stage / "study.csv").write_bytes(csv_text(pd.DataFrame(rows)).encode())
        write_summary(study, stage / "study.json")

    identity = {"scenario": study["scenario"], "overrides": study["overrides"], "trainsim_version": trainsim_version()}
    return write_run_folder(out_dir, identity, write, STUDY_FOLDER)
