"""The first-order optimum of two checkpoint levels: in-memory snapshots every T1 beside storage checkpoints every T2.

Benoit, Cavelan, Le Fevre, Robert and Sun, "Towards Optimal Multi-Level Checkpointing" (IEEE Transactions on
Computers 66(7), 2017; compare Di, Bouguerra, Bautista-Gomez and Cappello, "Optimization of Multi-level Checkpoint
Model for Large Scale HPC Applications", IPDPS 2014): the pattern is nested, a storage checkpoint every W and n - 1
snapshots between (T1 = W / n, T2 = W, n a whole number: each storage checkpoint starts the snapshots' count
over). Level 1 is the snapshot, cost C1 (its stall), level 2 the storage checkpoint, cost C2
(`summary.young_daly_cost_s`), taken in place of the snapshot due with it. A failure the memory tier recovers
(MTBF M1: every host it takes out has a copy on a host left, or it takes none) loses T1 / 2 on average, one that
needs storage (MTBF M2: some host and all its peers out) T2 / 2, so the first-order waste of a pattern is

    H_n(W) = (C2 + (n - 1) C1) / W + W / (2 n M1) + W / (2 M2),  W_n = sqrt(2 (C2 + (n - 1) C1) / (1 / (n M1) + 1 / M2))

W at least the async write floor (`summary.write_floor_steps`). The job takes the n of least H_n(W_n); n = 1 is
storage alone at Young's sqrt(2 C2 M), M the MTBF of every interrupting failure: the tier buys nothing to first
order (always so where C2 <= C1). Over real n, H_n(W_n) is least at n* = sqrt((C2 - C1) M2 / (C1 M1)), each
level's own Young interval (T1 = sqrt(2 C1 M1), T2 = sqrt(2 (C2 - C1) M2)); it and H_n at the floor are convex in
n, so the whole numbers up to the larger of their minimisers hold the best. Without failures that need storage the
optimum is snapshots alone at sqrt(2 C1 M1) where C1 < C2 (n without bound). The rates are the healthy state's
(every host in use), each unit failing at its class's own rate while the job trains, as M's are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.config.reliability import Effect
from simulator.reliability.checkpoint import snapshot_survives
from simulator.reliability.job import JobPlan, rate_sum
from simulator.reliability.stats import young_interval


@dataclass(frozen=True)
class TwoLevelOptimum:
    """The MTBF of the interruptions each tier recovers (None: there are none) and the two intervals that minimise
    the first-order waste: ``memory_interval_s`` None where the tier buys nothing (storage alone is best),
    ``storage_interval_s`` None where no failure needs storage (as long as the job)."""

    memory_mtbf_s: float | None
    storage_mtbf_s: float | None
    memory_interval_s: float | None
    storage_interval_s: float | None


def tier_failure_rates(plan: JobPlan) -> tuple[float, float]:
    """The rates (per second) of the interrupting failures the in-memory tier recovers and of those that need the
    storage checkpoint, with every host in use: a unit whose failure takes out some host and all its peers
    (`checkpoint.snapshot_survives`) needs storage; a process restart takes no host. Each unit counts the share
    of its failures that interrupt (`JobPlan.interrupting`: a `degrade` unit that cuts a GPU off takes its blast
    radius, as `replace`). Each at its rate while the job trains, as M's (`JobPlan.training_rates_s`), summed as
    M's (`rate_sum`): where every failure needs one tier, its MTBF is M to the last digit."""
    memory: list[list[float]] = []
    storage: list[list[float]] = []
    for klass, blast, rates in zip(plan.classes, plan.blast, plan.training_rates_s(), strict=True):
        memory.append([])
        storage.append([])
        for hosts, rate in zip(blast, rates, strict=True):
            lost = () if klass.effect is Effect.RESTART else hosts
            (memory if snapshot_survives(lost, plan.hosts, plan.memory_replicas) else storage)[-1].append(rate)
    return rate_sum(memory), rate_sum(storage)


def two_level_optimum(plan: JobPlan, memory_stall_s: float, storage_cost_s: float, floor_s: float
                      ) -> TwoLevelOptimum | None:
    """The two-level optimum (module docstring) of a job with an in-memory tier, for the snapshot's stall C1, the
    storage checkpoint's cost C2 and the async write floor in its healthy state; None without that tier or
    without failures that interrupt the job."""
    if not plan.memory_replicas:
        return None
    memory_rate, storage_rate = tier_failure_rates(plan)
    if not memory_rate + storage_rate:
        return None
    m1 = 1.0 / memory_rate if memory_rate else None
    m2 = 1.0 / storage_rate if storage_rate else None
    if m1 is not None and m2 is None and memory_stall_s < storage_cost_s:
        return TwoLevelOptimum(m1, None, young_interval(memory_stall_s, m1), None)
    snapshots, storage_interval = best_nesting(memory_stall_s, storage_cost_s, memory_rate, storage_rate, floor_s)
    if snapshots == 1:
        return TwoLevelOptimum(m1, m2, None, storage_interval)
    return TwoLevelOptimum(m1, m2, storage_interval / snapshots, storage_interval)


def best_nesting(c1: float, c2: float, rate1: float, rate2: float, floor_s: float) -> tuple[int, float]:
    """The whole number n of in-memory intervals per storage interval and the storage interval W (at least
    floor_s) of least first-order waste H_n(W) (module docstring), for the snapshot's stall c1, the storage
    checkpoint's cost c2 and the failure rates each tier recovers (rate2 > 0 where c2 > c1)."""
    def waste(n: int) -> tuple[float, float]:
        cost, rate = c2 + (n - 1) * c1, rate1 / n + rate2
        interval = max(floor_s, math.sqrt(2.0 * cost / rate))
        return cost / interval + interval * rate / 2.0, interval

    relaxed = math.sqrt((c2 - c1) * rate1 / (c1 * rate2)) if c2 > c1 and c1 > 0 else 1.0
    at_floor = floor_s * math.sqrt(rate1 / (2.0 * c1)) if c1 > 0 else 1.0
    candidates = range(1, math.ceil(max(relaxed, at_floor, 1.0)) + 1)
    snapshots = min(candidates, key=lambda n: waste(n)[0])
    return snapshots, waste(snapshots)[1]
