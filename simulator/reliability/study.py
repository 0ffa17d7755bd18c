"""Purpose-built job studies: ETTR and goodput against the checkpoint interval (optionally for several
failure-rate multipliers), with Young's and Daly's intervals beside the simulated optimum.

Every point reruns the job simulation of the scenario with one override; the step times are simulated once
(states.py caches them) and every point uses the same seeds, so all points see the same failure arrivals
(common random numbers: differences between points are not drowned in replication noise). The simulated
optimum is the best grid point, refined by fitting ETTR(T) = a - b / T - c T (the first-order waste of a
checkpoint every T: cost b / T, lost work c T) to the grid: T* = sqrt(b / c) when the fit is concave.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.config.loader import LoadedScenario, OptionSetting, load_scenario
from simulator.errors import InputError
from simulator.reliability.simulate import prepare_job, simulate_job
from simulator.reliability.summary import optimum_intervals
from simulator.units import format_duration, parse_duration


@dataclass(frozen=True)
class StudyPoint:
    """One job simulation of a study: its interval and rate multiplier, and what it gave."""

    interval_s: float
    multiplier: float
    summary: dict

    def row(self) -> dict:
        s = self.summary
        return {"rate_multiplier": self.multiplier, "interval_s": self.interval_s,
                "interval_steps": s["checkpoint"]["interval_steps"], "ettr": s["ettr"]["mean"],
                "ettr_ci95_low": s["ettr"]["ci95_low"], "ettr_ci95_high": s["ettr"]["ci95_high"],
                "goodput_tokens_per_s": (s["goodput_tokens_per_s"] or {}).get("mean"),
                "goodput_steps_per_s": s["goodput_steps_per_s"]["mean"],
                "interruptions": s["interruptions"]["unexpected"]["mean"], "mtbf_s": s["mtbf_s"],
                "young_interval_s": s["young_interval_s"], "daly_interval_s": s["daly_interval_s"]}


def parse_list(text: str, parse, option: str, example: str) -> list[float]:
    """A comma list of positive values (durations or numbers) from the command line."""
    try:
        values = [parse(part.strip()) for part in text.split(",") if part.strip()]
    except (InputError, ValueError):
        raise InputError(f"cannot read {text!r}", field=option, allowed=example) from None
    if not values or any(not 0 < value < math.inf for value in values):
        raise InputError(f"{text!r} needs positive, finite values", field=option, allowed=example)
    return values


def parse_intervals(text: str) -> list[float]:
    return parse_list(text, parse_duration, "--intervals", "durations with units, e.g. 5min,10min,30min,1h")


def parse_multipliers(text: str) -> list[float]:
    return parse_list(text, float, "--multipliers", "numbers, e.g. 0.5,1,2,4")


DEFAULT_GRID_FACTORS = tuple(2.0 ** (k / 2) for k in range(-4, 5))
"""A checkpoint-interval study without `--intervals` tries the job's Daly interval times these: nine points in
ratios of sqrt 2 from 1/4 to 4 times it, wide enough for the optimum of a job whose failures are not
exponential (Weibull 0.5 with a 1 h restart: 1.38 times Daly, tests/test_reliability_study.py) and for the fit."""


@dataclass(frozen=True)
class IntervalGrid:
    """The default intervals of a checkpoint-interval study: Daly's interval of the job as the scenario gives it,
    its healthy step, and the distinct whole numbers of steps nearest Daly x DEFAULT_GRID_FACTORS (at least one),
    ascending, with their durations."""

    daly_s: float
    step_s: float
    steps: tuple[int, ...]

    @property
    def intervals_s(self) -> list[float]:
        return [steps * self.step_s for steps in self.steps]


def default_grid(loaded: LoadedScenario, force: bool = False,
                 on_healthy_step: Callable[[dict], None] | None = None) -> IntervalGrid:
    """The intervals a checkpoint-interval study runs without `--intervals`, around the job's own Daly interval
    (its checkpoint cost at the scenario's interval, its failure rates as written); refused, at `--intervals`,
    for a job without failures, which has none. ``on_healthy_step`` gets the healthy step's summary once it is
    simulated."""
    job = prepare_job(loaded, force=force)
    if on_healthy_step is not None:
        on_healthy_step(job.step_summary)
    _, _, daly = optimum_intervals(job.plan, job.counts, job.healthy)
    if daly is None:
        raise InputError("the job expects no failure, so it has no Daly interval to build the default grid "
                         "around", field="--intervals", allowed="durations with units, e.g. 5min,10min,30min,1h")
    step = job.healthy.step_s
    steps = sorted({max(1, round(daly * factor / step)) for factor in DEFAULT_GRID_FACTORS})
    return IntervalGrid(daly, step, tuple(steps))


def fitted_optimum(intervals: list[float], ettr: list[float]) -> float | None:
    """T* of the least-squares fit ETTR = a - b / T - c T, when b and c come out positive."""
    if len(intervals) < 3:
        return None
    t = np.asarray(intervals, dtype=float)
    design = np.column_stack([np.ones_like(t), -1.0 / t, -t])
    (_, b, c), *_ = np.linalg.lstsq(design, np.asarray(ettr, dtype=float), rcond=None)
    if b <= 0 or c <= 0:
        return None
    return math.sqrt(b / c)


def curve_summary(points: list[StudyPoint]) -> dict:
    """Best grid point, fitted optimum, Young and Daly of one multiplier's interval curve."""
    points = sorted(points, key=lambda p: p.interval_s)
    best = max(points, key=lambda p: p.summary["ettr"]["mean"])
    first = points[0].summary
    return {
        "rate_multiplier": points[0].multiplier,
        "mtbf_s": first["mtbf_s"],
        "checkpoint_cost_s": first["checkpoint"]["cost_s"],
        "restart_s": first["restart"]["total_s"],
        "young_interval_s": first["young_interval_s"],
        "daly_interval_s": first["daly_interval_s"],
        "best_interval_s": best.interval_s,
        "best_ettr": best.summary["ettr"]["mean"],
        "fitted_optimum_s": fitted_optimum([p.interval_s for p in points],
                                           [p.summary["ettr"]["mean"] for p in points]),
        "points": [p.row() for p in points],
    }


def run_study(scenario: str | Path, overrides: list[str], intervals: list[float],
              multipliers: list[float], force: bool = False,
              on_healthy_step: Callable[[dict], None] | None = None,
              progress: Callable[[int, int], None] | None = None) -> dict:
    """Simulate every (multiplier, interval) point; one curve summary per multiplier. A multiplier scales the
    scenario's own failure rates, its `faults.rate_multiplier` included (x 1 is the scenario as written).
    Without intervals, each multiplier has one point at the scenario's own interval (a checkpoint-interval
    study passes `default_grid`'s). ``force`` runs points
    beyond the job-event and scale limits (degraded or straggling states that would be unfolded steps past
    them). ``on_healthy_step`` gets the healthy step's summary once, before the first point's job is simulated
    (the points change no step): `trainsim study` prints its warnings then. ``progress(done, total)`` hears
    of each point simulated."""
    own = load_scenario(scenario, overrides).scenario.faults.rate_multiplier
    curves: list[dict] = []
    at: list[float | None] = [*intervals] if intervals else [None]
    for multiplier in multipliers:
        points: list[StudyPoint] = []
        for interval in at:
            settings = [OptionSetting("--multipliers", ("faults", "rate_multiplier"), own * multiplier,
                                      f"x {multiplier:g}")]
            if interval is not None:
                settings.append(OptionSetting("--intervals", ("checkpoint", "interval"), f"{interval!r} s",
                                              format_duration(interval)))
            summary = job_summary_of(load_scenario(scenario, overrides, tuple(settings)), force,
                                     None if curves or points else on_healthy_step)
            points.append(StudyPoint(summary["checkpoint"]["interval_s"], multiplier, summary))
            if progress is not None:
                progress(len(curves) * len(at) + len(points), len(multipliers) * len(at))
        curves.append(curve_summary(points))
    return {"scenario": str(scenario), "overrides": list(overrides), "curves": curves}


def job_summary_of(loaded: LoadedScenario, force: bool = False,
                   on_healthy_step: Callable[[dict], None] | None = None) -> dict:
    """job_summary.json's dict of one study point (simulate_job's ``on_healthy_step`` passed on)."""
    if loaded.scenario.run.horizon is None:
        raise loaded.error(("run", "horizon"), "a job study needs a horizon", "run.horizon: e.g. '54 d'")
    return simulate_job(loaded, force=force, on_healthy_step=on_healthy_step).summary


def write_study(out_dir: Path, study: dict) -> list[str]:
    """study.json (every curve with its points) and study.csv (one row per point), written as one run folder
    with a manifest (report/run_folder.py): a chart `trainsim plot goodput` saved into an earlier study's
    folder is removed with that study's files; returns the names written, manifest last."""
    import pandas as pd

    from simulator.report.run_folder import trainsim_version, write_run_folder
    from simulator.report.tables import csv_text
    from simulator.report.writers import write_summary

    def write(stage: Path) -> None:
        rows = [point for curve in study["curves"] for point in curve["points"]]
        (stage / "study.csv").write_bytes(csv_text(pd.DataFrame(rows)).encode())
        write_summary(study, stage / "study.json")

    identity = {"scenario": study["scenario"], "overrides": study["overrides"], "trainsim_version": trainsim_version()}
    return write_run_folder(out_dir, identity, write)
