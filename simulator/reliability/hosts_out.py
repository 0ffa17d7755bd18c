"""The hosts out of a job at a random moment, as the closed forms take them: what the one spare pool must cover
for the job to train. Every class that takes hosts draws on that pool: a `degrade` unit that cuts hosts off is down
on its own (r / (M + r) of the time, repaired in place), and the hosts `replace` failures sent to repair are in
flight as in an M/G/infinity queue, a Poisson count of failures, mean rate x repair per unit (an approximation: a
unit whose host is out, or a job that waits, brings no failure meanwhile)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

Pmf = np.ndarray
"""Chances of 0, 1, ..., `spares` hosts out (the tail beyond the pool is left out: the job does not train there)."""


def convolve(left: Pmf, right: Pmf) -> Pmf:
    """The pmf of the sum of two independent counts, up to the length of ``left``."""
    return np.convolve(left, right)[:len(left)]


def cut_units(down: float, hosts: int, units: int, spares: int) -> Pmf:
    """Hosts out of ``units`` units, each down with chance ``down`` on its own and cutting ``hosts`` off (a unit
    cutting none off blocks the job, which waits for its repair: it counts as beyond the pool)."""
    pmf = np.zeros(spares + 1)
    if down == 0.0:
        pmf[0] = 1.0
        return pmf
    for j in range(min(units, spares // hosts if hosts else 0) + 1):
        pmf[j * hosts] = math.exp(math.lgamma(units + 1) - math.lgamma(j + 1) - math.lgamma(units - j + 1)
                                  + j * math.log(down) + (units - j) * math.log1p(-down))
    return pmf


def repairs_in_flight(batches: dict[int, float], spares: int) -> Pmf:
    """Hosts out for `replace` repairs: per batch size (hosts a failure takes), a Poisson count of failures in
    repair with mean ``batches[size]``."""
    pmf = np.zeros(spares + 1)
    pmf[0] = 1.0
    for size, mean in sorted(batches.items()):
        part = np.zeros(spares + 1)
        chance = math.exp(-mean)
        for count in range(spares // size + 1):
            part[count * size] = chance
            chance *= mean / (count + 1)
        pmf = convolve(pmf, part)
    return pmf


def covered(cutting: Counter[tuple[float, int]], batches: dict[int, float], spares: int) -> float:
    """The chance that the pool of ``spares`` covers every host out: the units down of ``cutting`` ((down
    chance, hosts cut) -> units) and the ``batches`` of repairs in flight. A pool larger than the hosts that can
    be out (every cutting unit down, the repairs' count 40 standard deviations past its mean) is taken at that
    size: what lies beyond has no chance a float holds."""
    mean = math.fsum(size * count for size, count in batches.items())
    spread = math.sqrt(math.fsum(size * size * count for size, count in batches.items()))
    most = sum(units * hosts for (_, hosts), units in cutting.items()) + math.ceil(
        mean + 40.0 * spread + 40.0 * max(batches, default=0))
    spares = min(spares, most)
    pmf = repairs_in_flight(batches, spares)
    for (down, hosts), units in sorted(cutting.items()):
        pmf = convolve(pmf, cut_units(down, hosts, units, spares))
    return math.fsum(pmf)
