"""The first-order optimum of two checkpoint levels: in-memory snapshots every T1 beside storage checkpoints every T2.

Benoit, Cavelan, Le Fevre, Robert and Sun, "Towards Optimal Multi-Level Checkpointing" (IEEE Transactions on
Computers 66(7), 2017), after Di, Robert, Vivien and Cappello, "Optimization of Multi-level Checkpoint Model for
Large Scale HPC Applications" (IPDPS 2014): with nested levels the waste per unit of work is, to first order, the
sum over the levels of each level's checkpoint cost over its period and its failures' rate times half its period,
minimised by each level's Young interval (an overhead of sum sqrt(2 lambda_l C_l)). Here level 1 is the snapshot,
cost C1 (its stall), and level 2 the storage checkpoint, cost C2 (`summary.young_daly_cost_s`), which the job takes
in place of the snapshot due with it, so it adds C2 - C1. A failure the memory tier recovers (MTBF M1: every host it
takes out has a copy on a host left, or it takes none) loses T1 / 2 on average, one that needs storage (MTBF M2:
some host and all its peers out) T2 / 2:

    H(T1, T2) = C1 / T1 + (C2 - C1) / T2 + T1 / (2 M1) + T2 / (2 M2),  T1 = sqrt(2 C1 M1),  T2 = sqrt(2 (C2 - C1) M2)

T2 is at least the async write floor (`summary.write_floor_steps`). H is convex in each, so where T1 comes out at
least T2 (or C2 <= C1: a storage checkpoint costs no more than the snapshot it replaces) the best nested pattern has
T1 = T2: storage alone at Young's sqrt(2 C2 M), M the MTBF of every interrupting failure, and the tier buys nothing
to first order. The rates are the healthy state's (every host in use), as M's are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.config.reliability import Effect
from simulator.reliability.checkpoint import snapshot_survives
from simulator.reliability.job import JobPlan
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
    (`checkpoint.snapshot_survives`) needs storage; a process restart takes no host."""
    memory = storage = 0.0
    for klass, blast in zip(plan.classes, plan.blast, strict=True):
        if not klass.effect.interrupts:
            continue
        for hosts in blast:
            lost = () if klass.effect is Effect.RESTART else hosts
            if snapshot_survives(lost, plan.hosts, plan.memory_replicas):
                memory += klass.rate_per_unit_s
            else:
                storage += klass.rate_per_unit_s
    return memory, storage


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
    t1 = math.inf if m1 is None else young_interval(memory_stall_s, m1)
    if m2 is None:
        t2 = math.inf
    elif storage_cost_s > memory_stall_s:
        t2 = max(floor_s, young_interval(storage_cost_s - memory_stall_s, m2))
    else:  # a storage checkpoint costs no more than the snapshot it takes the place of
        t2 = 0.0
    if t1 >= t2:
        storage_alone = max(floor_s, young_interval(storage_cost_s, 1.0 / (memory_rate + storage_rate)))
        return TwoLevelOptimum(m1, m2, None, storage_alone)
    return TwoLevelOptimum(m1, m2, t1, None if math.isinf(t2) else t2)
