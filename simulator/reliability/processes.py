"""Failure processes: the arrivals of every component class over a job's horizon, drawn up front.

Each unit (slot) of a class fails as a renewal process: a failed unit is replaced by a new one, whose time
to failure starts afresh. The job starts on a cluster in service, not on new hardware: each process is in
equilibrium at t = 0, its first failure a forward-recurrence time after the start, so a class expects exactly
units x rate x horizon failures over any horizon, whatever its distribution (the rate read from a table of a
running cluster is what the job meets). Exponential times make the class a Poisson process of rate units x
rate per unit, drawn as a Poisson count with uniform times and units; Weibull times (shape k, scale chosen so
that the mean is the MTBF) are drawn per unit and summed while they stay inside the horizon, the first one
as U x L with U uniform and L the length-biased Weibull, (L / scale)^k ~ Gamma(1 + 1/k). Repair times are
drawn per arrival (fixed or exponential with the class's mean). A unit repaired in place (a `degrade` or
`straggle` unit, a GB200 rack or NVSwitch tray: `FailureClass.repaired_in_place`) does not fail while in
repair: its renewal runs on its time up and restarts at the repair's end (up ~ the law above, then the repair),
so it fails units x horizon / (MTBF + repair) times in the long run; the others' failures belong to slots, which
a spare fills at once. Everything comes from one seeded generator, in class order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.reliability.components import FailureClass


@dataclass(frozen=True)
class Arrivals:
    """Failures over a horizon sorted by time: time (s), class index, unit index, repair time (s)."""

    time_s: np.ndarray
    klass: np.ndarray
    unit: np.ndarray
    repair_s: np.ndarray

    def __len__(self) -> int:
        return len(self.time_s)


def _renewal_times(rng: np.random.Generator, klass: FailureClass, units: int, horizon_s: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Failure times and unit indices of ``units`` renewal processes up to ``horizon_s``."""
    mean = 1.0 / klass.rate_per_unit_s
    if klass.distribution == "exponential":
        count = rng.poisson(units * horizon_s / mean)
        return rng.uniform(0.0, horizon_s, count), rng.integers(0, units, count)
    shape = klass.shape
    scale = mean / math.gamma(1.0 + 1.0 / shape)
    times: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    clock = rng.uniform(0.0, 1.0, units) * scale * rng.gamma(1.0 + 1.0 / shape, 1.0, units) ** (1.0 / shape)
    alive = np.arange(units)
    while alive.size:
        alive = alive[clock[alive] < horizon_s]
        times.append(clock[alive].copy())
        owners.append(alive)
        clock[alive] += scale * rng.weibull(shape, alive.size)
    return np.concatenate(times), np.concatenate(owners)


def _after_repairs(up_times: np.ndarray, owners: np.ndarray, repair: np.ndarray, horizon_s: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Failures of units repaired in place: ``up_times`` count each unit's time up only, so each failure comes
    that long plus the unit's earlier repairs after the start; those past ``horizon_s`` are dropped."""
    order = np.lexsort((up_times, owners))
    up_times, owners, repair = up_times[order], owners[order], repair[order]
    repaired = np.cumsum(repair) - repair
    first = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
    starts = np.repeat(first, np.diff(np.r_[first, owners.size]))
    times = up_times + (repaired - repaired[starts])
    inside = times < horizon_s
    return times[inside], owners[inside], repair[inside]


def draw_arrivals(rng: np.random.Generator, classes: tuple[FailureClass, ...], units: list[int],
                  horizon_s: float) -> Arrivals:
    """Every class's failures over ``horizon_s``; ``units[i]`` is how many units class i counts."""
    parts = []
    for index, (klass, count) in enumerate(zip(classes, units)):
        if count == 0:
            continue
        times, owners = _renewal_times(rng, klass, count, horizon_s)
        if klass.repair_distribution == "exponential" and klass.repair_s > 0:
            repair = rng.exponential(klass.repair_s, times.size)
        else:
            repair = np.full(times.size, klass.repair_s)
        if klass.repaired_in_place:
            times, owners, repair = _after_repairs(times, owners, repair, horizon_s)
        parts.append((times, np.full(times.size, index), owners, repair))
    if not parts:
        empty = np.zeros(0)
        return Arrivals(empty, empty.astype(int), empty.astype(int), empty)
    times, klass_index, owners, repair = (np.concatenate(column) for column in zip(*parts))
    order = np.argsort(times, kind="stable")
    return Arrivals(times[order], klass_index[order], owners[order], repair[order])
