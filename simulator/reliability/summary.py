"""job_summary.json: ETTR, goodput (healthy-equivalent steps per second, and tokens per second where the model
has tokens: null, n/a, for synthetic stage costs), interruptions by cause and where
the time went, as means with 95% intervals over replications, beside the inputs that explain them (step,
checkpoint and restart costs, the failure model's expected counts, Young's and Daly's intervals)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from simulator.config.loader import LoadedScenario
from simulator.config.reliability import Effect
from simulator.reliability.checkpoint import SegmentCosts
from simulator.reliability.elastic import ElasticSizes
from simulator.reliability.events import STORAGE_REASONS, TIERS
from simulator.reliability.job import JobPlan, ReplicationTotals, rate_sum
from simulator.reliability.states import ClusterState
from simulator.reliability.stats import daly_interval, mean_interval, young_interval
from simulator.reliability.two_level import two_level_optimum
from simulator.units import counted, durations_alike, expected_count, format_duration
from simulator.workload.memory_plan import GIB

TIME_PARTS = ("productive_s", "slow_steps_s", "lost_work_s", "checkpoint_stall_s", "checkpoint_slowdown_s",
              "restart_s", "maintenance_s")

WAITING_WARNING_SHARE = 0.05
"""Warn when the mean time a job's restarts wait for spare or repaired hosts exceeds this share of the horizon:
ETTR then falls by about that much for a cause that more spares or elasticity mostly remove, and nothing else in
the table says why."""


def checkpoint_cost_s(costs: SegmentCosts) -> float:
    """Time one checkpoint costs in steady state, the C of Young's and Daly's formulas: a checkpoint cycle
    less its steps' time. Sync: the write. Async: the snapshot plus the background write's slowdown, and the
    wait for the write when it outlasts the interval's steps (a 10 s write with a 0.6 s snapshot every 1.2 s step
    costs 10 + 0.6 - 1.2 = 9.4 s a checkpoint, not the snapshot and its slowdown share)."""
    return costs.cycle.period_s - costs.interval_steps * costs.step_s


def expected_interruptions(plan: JobPlan, counts: list[int]) -> tuple[float, dict]:
    """Unexpected interruptions the failure model expects over the horizon (all units in use), and per class
    its figures with the failures it expects in the horizon (`expected_in_horizon`: units x rate x horizon, the
    one place that count is made; the rate `JobPlan.failure_rate_s`, 1 / (MTBF + repair) for a `degrade`
    or `straggle` unit and an interrupting one with no spare at hand, a `replace` unit's there per unit,
    `JobPlan.unit_rates_s`, out while any failure of its hosts is in repair) and the part of them that interrupts
    (`interrupting_units`, the units whose failures interrupt, a share of a unit counted as that share
    (cuts.py), x rate x horizon:
    `expected_interruptions`; a `degrade` unit that leaves some GPU without a route interrupts);
    `expected_slowdowns` reads the rest back. A `rack` or `nvswitch_tray` class on GB200 NVL72 racks with spare
    racks has `spare_units` too: the spares' units, drawn beside the cluster's (idle or standing in for a rack),
    not in `units` nor the expected counts."""
    per_class: dict[str, dict[str, Any]] = {}
    for index, (klass, units, shares) in enumerate(zip(plan.classes, counts, plan.interrupting, strict=True)):
        interrupting = sum(shares)
        rates = plan.unit_rates_s(index)
        if rates is None:
            in_horizon = units * plan.failure_rate_s(klass) * plan.horizon_s
            interrupted = interrupting * plan.failure_rate_s(klass) * plan.horizon_s
        else:
            in_horizon = math.fsum(rates) * plan.horizon_s
            interrupted = math.fsum(share * rate for share, rate in zip(shares, rates, strict=True)) * plan.horizon_s
        per_class[klass.name] = {
            "label": klass.label, "unit": klass.unit, "units": units, "effect": klass.effect,
            "distribution": klass.distribution, "shape": klass.shape, "slowdown": klass.slowdown,
            "rate_per_unit_per_h": klass.rate_per_unit_s * 3600,
            "repair_s": klass.repair_s, "expected_in_horizon": in_horizon, "interrupting_units": interrupting,
            "expected_interruptions": interrupted,
        }
        if spare := plan.spare_units(klass):
            per_class[klass.name]["spare_units"] = spare
    return sum(entry["expected_interruptions"] for entry in per_class.values()), per_class


def expected_slowdowns(failure_model: dict) -> float:
    """Failures a job's model expects over the horizon that only slow it (those of its `degrade` and `straggle`
    classes that do not interrupt), from its per-class figures (`expected_interruptions`, job_summary.json's
    `failure_model`): no restart, so no part of M, but time lost all the same."""
    return sum(entry["expected_in_horizon"] - entry["expected_interruptions"] for entry in failure_model.values()
               if not Effect(entry["effect"]).interrupts)


def no_failure_text(plan: JobPlan, counts: list[int]) -> str:
    """What a job without expected interruptions expects: "no failure", or, where its classes do fail but only
    degrade or straggle, "no failure that interrupts the job (its classes only degrade or straggle: 2.07
    expected over the horizon, slower steps but no restart)"."""
    slowdowns = expected_slowdowns(expected_interruptions(plan, counts)[1])
    if slowdowns > 0:
        return (f"no failure that interrupts the job (its classes only degrade or straggle: "
                f"{expected_count(slowdowns)} expected over the horizon, slower steps but no restart)")
    return "no failure"


def steps_holding_write(costs: SegmentCosts) -> int:
    """The fewest whole steps between checkpoints that train at least as long as the checkpoint's write lasts
    (an async write's steps slowed by it take 1 + sigma times longer: k step (1 + sigma) >= W, `SegmentCosts.cycle`'s
    test; sync steps run at their own speed, sigma 0). A checkpoint falls at a step's end, so the write's
    W / (1 + sigma) rounds up: 3.19 steps is 4. Below it an async checkpoint waits for the previous write at each
    trigger, and a sync job stalls for each write longer than it trains (`write_wait_warning`)."""
    steps = max(1, math.ceil(costs.write_s / (costs.step_s * (1.0 + costs.slowdown))))
    while steps > 1 and costs.write_s <= (steps - 1) * costs.step_s * (1.0 + costs.slowdown):
        steps -= 1
    return steps


def write_floor_steps(costs: SegmentCosts) -> int:
    """The fewest whole steps between async checkpoints within which the background write ends
    (`steps_holding_write`); 0 for sync, whose write stalls the training and so never waits."""
    return steps_holding_write(costs) if costs.mode == "async" else 0


def young_daly_cost_s(costs: SegmentCosts) -> float:
    """The checkpoint cost C Young's and Daly's intervals take: `checkpoint_cost_s` at the scenario's interval,
    or, async, at the write floor (`write_floor_steps`) where that interval is shorter: the snapshot and the
    write's slowdown share. The cost at an interval the write outlasts (W + S - k t) holds only below the floor,
    never at the interval the formulas give for it: with it a study's Young and Daly moved with its shortest
    interval."""
    return checkpoint_cost_s(replace(costs, interval_steps=max(costs.interval_steps, write_floor_steps(costs))))


def formula_intervals(costs: SegmentCosts, mtbf_s: float) -> tuple[float, float]:
    """Young's sqrt(2 C M) and Daly's interval as the formulas give them for system MTBF ``mtbf_s`` and the cost
    C of the intervals they pick (`young_daly_cost_s`), before the write floor: the figures a reader checks by
    hand (x 2 the 405B job's failure rates: sqrt(2 x 7.26 ms x 5,567 s) = 8.99 s, floored to its 10.18 s step)."""
    cost = young_daly_cost_s(costs)
    return young_interval(cost, mtbf_s), daly_interval(cost, mtbf_s)


def young_daly_intervals(costs: SegmentCosts, mtbf_s: float) -> tuple[float, float]:
    """Young's and Daly's intervals (`formula_intervals`), each at least the write floor in whole steps
    (`write_floor_steps`: 32.47 s of write is 4 steps of 10.18 s, 40.70 s, where 3 steps wait 1.9 s a checkpoint
    for it)."""
    floor = write_floor_steps(costs) * costs.step_s
    young, daly = formula_intervals(costs, mtbf_s)
    return max(floor, young), max(floor, daly)


WRITE_NEAR_MTBF_SHARE = 0.5
"""Warn that Young and Daly do not apply when an async write floor F reaches this share of the system MTBF M.
Renewal argument: after each restart the k-th checkpoint is safe only once its write ends, so with exponential
failures the work a failure-to-failure cycle keeps is T sum_k exp(-t_k / M). At or above the floor the writes
end at k T + W: T exp(-W / M) / (exp(T / M) - 1), which falls with T, so the floor is best; below it every
checkpoint waits for the previous write and they end near T + k W: T exp(-T / M) / (exp(W / M) - 1), which
rises with T up to T = M. So once F > M the optimum leaves the floor for about M, below it (W = 1,000 s,
M = 10 min: 599.9 s 7.69% ETTR against 6.66% at the floor), and Young's and Daly's first-order waste
(C / T + T / 2M) no longer describes the curve well before that: the first checkpoint after a restart needs
T + W >= 2F failure-free, which at F = M / 2 happens only 1 / e of the time. Warn from M / 2, before the
crossing, and let the study answer."""


YOUNG_ETTR_SHORTFALL = 0.01
"""Warn that Young's interval does not apply to a sync checkpoint when it keeps at least this share less ETTR
than Daly's by the renewal ETTR of exponential failures, T e^(-R/M) / (M (e^((T+C)/M) - 1)) (docs/reliability.md;
R cancels in the ratio). Young's sqrt(2 C M) is first order in C / M and too long as C grows, while Daly's stays
within 0.02% of that formula's optimum up to C = M: the shortfall is 1% near C = M / 6, 5% near M / 2 (the 405B
job writing at 1 GB/s, C = 0.58 M: Young 12,026 s against Daly 8,086 s, 6.0% less)."""


def _log_expm1(x: float) -> float:
    """log(e^x - 1) for x > 0, without overflow where e^x would."""
    return x + math.log(-math.expm1(-x))


def young_shortfall(cost_s: float, mtbf_s: float) -> float:
    """The share of ETTR that Young's interval keeps less than Daly's by the renewal ETTR (YOUNG_ETTR_SHORTFALL)."""
    young, daly = young_interval(cost_s, mtbf_s), daly_interval(cost_s, mtbf_s)
    kept = math.log(young / daly) + _log_expm1((daly + cost_s) / mtbf_s) - _log_expm1((young + cost_s) / mtbf_s)
    return -math.expm1(kept)


def young_daly_warning(costs: SegmentCosts, mtbf_s: float | None, horizon_s: float | None = None) -> str | None:
    """A warning when Young's or Daly's interval is no optimum for the system MTBF ``mtbf_s``: async, when the write
    floor (`write_floor_steps`) reaches WRITE_NEAR_MTBF_SHARE of it (both intervals stop at the floor); sync, when
    the checkpoint costs so much of it that Young's first-order interval keeps YOUNG_ETTR_SHORTFALL less than
    Daly's; None otherwise, and where the write outlasts the horizon ``horizon_s``: then no interval applies
    (`simulate.write_past_horizon` says so; this one said 'Daly's applies')."""
    if mtbf_s is None or (horizon_s is not None and costs.write_s >= horizon_s):
        return None
    if costs.mode == "sync":
        return _sync_young_warning(young_daly_cost_s(costs), mtbf_s)
    steps = write_floor_steps(costs)
    floor = steps * costs.step_s
    if not steps or floor < WRITE_NEAR_MTBF_SHARE * mtbf_s:
        return None
    return (f"the async checkpoint write needs {counted(steps, 'step')} ({format_duration(floor)}) to end, "
            f"{floor / mtbf_s:.2g} x the system MTBF ({format_duration(mtbf_s)}; from {WRITE_NEAR_MTBF_SHARE:g} x "
            "warns): Young's and Daly's intervals (first-order in the write over the MTBF) do not apply, and "
            "shorter intervals that wait for the write can do better (about the MTBF once the write outlasts it): "
            "the optimum is a study's (`trainsim study checkpoint-interval`)")


NO_PROGRESS_ETTR = 0.05
"""Warn that the job makes little or no progress where the renewal ETTR of exponential failures, T e^(-R/M) /
(M (e^(T/M) - 1)) for interval T, restart R and system MTBF M (the checkpoint's own cost left out, which only
lowers it), is below this share. Its restart factor e^(-R/M) alone reaches it at R = 3 M, its interval factor
(T/M) / (e^(T/M) - 1) alone at T = 4.5 M; below both R = M and T = M the product stays above 21%, so each warning
has a restart or an interval at least the MTBF to name (gpu mtbf 400 min on 16 GPUs, M = 25 min, a 10 min restart
and a 30 min interval: 34.7% by the formula, no warning)."""


def restart_s(plan: JobPlan, healthy: SegmentCosts) -> float:
    """One restart into the healthy state: detection, rescheduling, launch, the storage checkpoint's load and the
    warm-up steps."""
    return plan.detection_s + plan.reschedule_s + plan.launch_s + healthy.load_s + healthy.warmup_s


def renewal_ettr(interval_s: float, restart: float, mtbf_s: float) -> float:
    """The renewal ETTR of exponential failures for an interval, a restart and a system MTBF (NO_PROGRESS_ETTR)."""
    ratio = interval_s / mtbf_s
    return math.exp(-restart / mtbf_s - _log_expm1(ratio)) * ratio if ratio > 0 else math.exp(-restart / mtbf_s)


def no_progress_warning(plan: JobPlan, healthy: SegmentCosts, mtbf_s: float | None) -> str | None:
    """A warning when the renewal ETTR for the system MTBF ``mtbf_s`` is below NO_PROGRESS_ETTR (`no_progress_text`):
    one restart (`restart_s`) and the interval between saves, the in-memory tier's where the job has one, with
    Young's interval sqrt(2 C M) for that tier's cost C. None without failures that interrupt the job. An interval
    at least the horizon writes no checkpoint by choice (a baseline; `interval_past_horizon` says so), so only the
    restart is weighed then."""
    if mtbf_s is None:
        return None
    memory = bool(healthy.memory_interval_steps)
    steps = healthy.memory_interval_steps if memory else healthy.interval_steps
    interval = steps * healthy.step_s
    cost = healthy.memory_stall_s if memory else young_daly_cost_s(healthy)
    weighed = interval if memory or interval < plan.horizon_s else 0.0
    return no_progress_text(restart_s(plan, healthy), interval, weighed, memory, mtbf_s,
                            young_interval(cost, mtbf_s))


def no_progress_text(restart: float, interval_s: float, weighed_s: float, memory: bool, mtbf_s: float,
                     young_s: float | None, unsimulated: bool = False) -> str | None:
    """The warning of a renewal ETTR below NO_PROGRESS_ETTR for a ``restart``, an interval ``interval_s`` between
    saves (weighed as ``weighed_s``: 0 where it writes no checkpoint) of the in-memory tier where ``memory``, and
    the system MTBF ``mtbf_s``, naming each cause at least the MTBF: the restart (failures come before the job is
    back: are the mtbf units right?), or the interval (failures come before it saves its work: Young's interval
    ``young_s`` is the one to be near, named where it is known); None above it. `no_progress_warning` gives it of a
    job's healthy step; `trainsim validate` of what it knows without the step (``unsimulated``: a restart without
    its checkpoint load and warm-up, the least interval the run can weigh, an MTBF at least the job's, so an ETTR
    at most the run's; `simulate.unsimulated_no_progress`)."""
    ettr = renewal_ettr(weighed_s, restart, mtbf_s)
    if ettr >= NO_PROGRESS_ETTR:
        return None
    causes = []
    if restart >= mtbf_s:
        what = "one restart before its checkpoint load" if unsimulated else "one restart with its checkpoint load"
        causes.append(f"{what} ({format_duration(restart)}) outlasts it, so failures come before the job is back "
                      "(are the faults.components' mtbf units right, h not s?)")
    if weighed_s >= mtbf_s:
        what = "the in-memory snapshot interval" if memory else "the checkpoint interval"
        field = "checkpoint.memory.interval" if memory else "checkpoint.interval"
        young = "" if young_s is None else f"{format_duration(young_s)}; "
        causes.append(f"{what} ({format_duration(interval_s)}) is {interval_s / mtbf_s:.3g} x it, so failures come "
                      f"before the job saves its work: the interval should be near Young's sqrt(2 C M) ({young}"
                      f"{field})")
    system, about = ("at most", "at most") if unsimulated else ("", "about")
    return (f"the system MTBF is {system + ' ' if system else ''}{format_duration(mtbf_s)}: {'; and '.join(causes)}; "
            f"the job makes little or no progress (ETTR {about} {ettr:.1%} by the renewal formula, below "
            f"{NO_PROGRESS_ETTR:.0%} warns)")


def _sync_young_warning(cost_s: float, mtbf_s: float) -> str | None:
    """The sync case of `young_daly_warning`."""
    if cost_s <= 0:
        return None
    shortfall = young_shortfall(cost_s, mtbf_s)
    if shortfall < YOUNG_ETTR_SHORTFALL:
        return None
    young, daly = young_interval(cost_s, mtbf_s), daly_interval(cost_s, mtbf_s)
    alike = durations_alike([young, daly])
    return (f"the sync checkpoint costs {format_duration(cost_s)} of training, {cost_s / mtbf_s:.2g} x the system "
            f"MTBF ({format_duration(mtbf_s)}): Young's interval ({alike(young)}, first-order in that "
            f"ratio) does not apply: it is {young / daly:.3g} x Daly's ({alike(daly)}) and keeps "
            f"{shortfall:.1%} less ETTR by the renewal formula (from {YOUNG_ETTR_SHORTFALL:.0%} warns); Daly's "
            "applies (checkpoint.interval)")


def write_wait_warning(costs: SegmentCosts, horizon_s: float | None = None) -> str | None:
    """A warning when the interval trains for less time than the checkpoint's write lasts (`steps_holding_write`),
    sync or async alike: async, each checkpoint waits for the previous write, which the cost per checkpoint shows
    against that at the floor; sync, the job stalls for each write longer than it trains between them (a 987.8 s
    write every 601.6 s runs at ETTR 36.9%), and about half of each cycle still at the fewest steps
    that hold the write, so only a longer interval or an async write is the remedy there. None when the interval
    holds its write, and where the write outlasts the horizon ``horizon_s``: then no interval holds it
    (`simulate.write_past_horizon` says so)."""
    steps = steps_holding_write(costs)
    if costs.interval_steps >= steps or (horizon_s is not None and costs.write_s >= horizon_s):
        return None
    trained = costs.interval_steps * costs.step_s
    short = (f"{costs.mode} checkpoints every {counted(costs.interval_steps, 'step')} ({format_duration(trained)}) "
             f"do not hold their write of {format_duration(costs.write_s)}")
    fewest = f"{steps:,}, {format_duration(steps * costs.step_s)}"
    if costs.mode == "sync":
        held_share = costs.write_s / (steps * costs.step_s + costs.write_s)
        return (f"{short}: training stalls for each write longer than it trains between them, "
                f"{costs.write_s / costs.cycle.period_s:.0%} of each checkpoint cycle, and still {held_share:.0%} at "
                f"the fewest steps that hold it ({fewest}) (a longer checkpoint.interval, or checkpoint.mode: async)")
    short += f" (the fewest that do: {fewest})"
    waiting = checkpoint_cost_s(costs)
    holding = checkpoint_cost_s(replace(costs, interval_steps=steps))
    return (f"{short}: each checkpoint waits for the previous write and costs {format_duration(waiting)} of "
            f"training, against {format_duration(holding)} from {counted(steps, 'step')} (checkpoint.interval)")


MEMORY_STALL_SHARE = 0.1
"""The share of the training between in-memory snapshots that their stall may take before the job warns."""


def memory_stall_warning(costs: SegmentCosts) -> str | None:
    """A warning when each in-memory snapshot's stall is at least MEMORY_STALL_SHARE of the training between
    snapshots (a slow `checkpoint.memory.bandwidth` or many replicas: 500 s every 552 s ran at ETTR 32% without a
    word); None without the tier or below that share."""
    if not costs.memory_interval_steps:
        return None
    between = costs.memory_interval_steps * costs.step_s
    if costs.memory_stall_s < MEMORY_STALL_SHARE * between:
        return None
    return (f"each in-memory snapshot stalls training {format_duration(costs.memory_stall_s)}, "
            f"{costs.memory_stall_s / between:.0%} of the {format_duration(between)} trained between snapshots "
            f"(checkpoint.memory.interval, replicas and bandwidth)")


MEMORY_NEAR_STORAGE_SHARE = 0.9
"""Warn when the in-memory interval is at least this share of the storage one: each storage checkpoint restarts
the snapshots' count, so one snapshot falls between two storage checkpoints, less than a tenth of the storage
interval before the next, and the tier saves little of the work a failure loses."""


def memory_near_storage_warning(costs: SegmentCosts) -> str | None:
    """A warning when the in-memory interval, in the state's steps, is at least MEMORY_NEAR_STORAGE_SHARE of the
    storage one (not shorter at all is refused); None without the tier or below that share."""
    memory, storage = costs.memory_interval_steps, costs.interval_steps
    if not memory or memory < MEMORY_NEAR_STORAGE_SHARE * storage:
        return None
    return (f"in-memory snapshots every {counted(memory, 'step')} ({format_duration(memory * costs.step_s)}) are "
            f"{memory / storage:.0%} of the storage interval ({counted(storage, 'step')}; from "
            f"{MEMORY_NEAR_STORAGE_SHARE:.0%} warns): each storage checkpoint restarts their count, so one snapshot "
            "falls between two storage checkpoints and the tier buys little; a shorter checkpoint.memory.interval "
            "(the two-level optimum, job_summary.json's memory_checkpoint.two_level)")


def idle_memory_tier_warning(loaded: LoadedScenario, states: dict[ClusterState, SegmentCosts]) -> str | None:
    """A warning, located at `checkpoint.memory.interval`, naming the cluster states the job met (up to three)
    whose in-memory interval in their own steps is not shorter than the storage one: each storage checkpoint
    restarts the snapshots' count, so the tier took none there and a failure in them rolled back to storage.
    The healthy state's is refused at load (`simulate._refuse_unused_memory_tier`); the others' steps are known
    only once the job meets them (a slower or shrunk state turns an interval given as a duration into other
    steps, and one in steps into another duration), so they are told after the run. None where there is none."""
    idle = sorted(state for state, costs in states.items() if costs.memory_tier_idle)
    if not idle:
        return None
    shown = "; ".join(f"{counted(state.replicas, 'replica')}{', ' + state.describe() if state.describe() else ''}: "
                      f"{counted(states[state].memory_interval_steps, 'step')} against "
                      f"{states[state].interval_steps:,}" for state in idle[:3])
    more = f"; {len(idle) - 3:,} more" if len(idle) > 3 else ""
    return str(loaded.error(("checkpoint", "memory", "interval"),
                            f"in {counted(len(idle), 'cluster state')} the job met, the in-memory interval is not "
                            f"shorter than the storage one in that state's steps ({shown}{more}): each storage "
                            "checkpoint restarts the snapshots' count, so the tier took no snapshot there",
                            "both intervals in one unit (durations, or steps), shorter by more than a step"))


def optimum_intervals(plan: JobPlan, counts: list[int], healthy: SegmentCosts
                      ) -> tuple[float | None, float | None, float | None]:
    """The job's system MTBF M (`training_mtbf_s`) and Young's and Daly's intervals for M and the healthy step's
    checkpoint costs (`young_daly_intervals`); all None without failures that interrupt the job
    (`no_failure_text`)."""
    expected, _ = expected_interruptions(plan, counts)
    if not expected:
        return None, None, None
    mtbf = training_mtbf_s(plan)
    return mtbf, *young_daly_intervals(healthy, mtbf)


def training_mtbf_s(plan: JobPlan) -> float:
    """The mean time between the interruptions the job meets while it trains, the M a checkpoint interval faces:
    1 / the sum of every unit's rate then (`JobPlan.training_rates_s`). A unit whose failure interrupts is up
    while the job trains, so most fail at their class's own rate, whatever the repair time (at full size: a
    shrunk job meets fewer); the horizon's count (`expected_interruptions`) takes a unit's time out with no
    spare at hand instead, as a unit whose host is in repair fails no more (32 GPUs of MTBF 200 h on 4 DGX
    hosts, 1 d repairs, no spare: M = 200 h / 32 = 6.25 h, not 200 h x 1.96 / 32 = 12.25 h). At least one class
    interrupts the job."""
    return 1.0 / rate_sum(plan.training_rates_s())


def replica_figures(loaded: LoadedScenario, sizes: ElasticSizes, totals: list[ReplicationTotals]) -> dict:
    """The replica counts the job may run on (ascending) and the smaller ones it skips because its step does not
    fit in GPU memory there (the peak memory per GPU each needs against the GPU's, GiB), its batch and regrow
    policies, how often it shrank and grew back, the restarts it took only to grow back (those that did, those
    a failure cut short) and their time, and its running time (the horizon less restarts and maintenance) on
    each count it met, the layout's first."""
    met = sorted({size for t in totals for size in t.running_by_replicas_s}, reverse=True)
    restart = loaded.scenario.restart
    return {"sizes": list(sizes.sizes),
            "out_of_memory_gib": sizes.out_of_memory_gib(),
            "memory_capacity_gib": sizes.capacity_bytes / GIB if sizes.out_of_memory else None,
            "elastic_batch": restart.elastic_batch, "regrow": restart.regrow,
            "shrinks": mean_interval([t.shrinks for t in totals]),
            "regrows": mean_interval([t.regrows for t in totals]),
            "regrow_restarts": mean_interval([t.regrow_restarts for t in totals]),
            "regrow_restarts_cut_short": mean_interval([t.regrow_restarts_cut_short for t in totals]),
            "regrow_restart_s": mean_interval([t.regrow_restart_s for t in totals]),
            "running_s": {str(size): mean_interval([t.running_by_replicas_s.get(size, 0.0) for t in totals])
                          for size in met}}


def job_summary(loaded: LoadedScenario, plan: JobPlan, counts: list[int], totals: list[ReplicationTotals],
                healthy: SegmentCosts, size: float, states: dict[ClusterState, SegmentCosts], gpu_model: str) -> dict:
    """The job_summary.json dict (the replica sizes read from the plan, which carries them once; ``gpu_model``
    the cluster's GPUs as the catalog names them)."""
    scenario = loaded.scenario
    horizon = plan.horizon_s
    expected, per_class = expected_interruptions(plan, counts)
    mtbf, young, daly = optimum_intervals(plan, counts, healthy)
    young_formula, daly_formula = (None, None) if mtbf is None else formula_intervals(healthy, mtbf)
    cost = checkpoint_cost_s(healthy)
    for name, entry in per_class.items():
        if entry["effect"] in (Effect.DEGRADE, Effect.STRAGGLE):
            entry["simulated_slowdowns"] = mean_interval([t.slowdowns.get(name, 0) for t in totals])
    causes = sorted({name for t in totals for name in t.interruptions} | set(per_class))
    lost = [value for t in totals for value in t.lost_per_failure_s]
    restart = restart_s(plan, healthy)
    tokens = healthy.tokens_per_step or None  # a model without tokens: its token figures are n/a (null)
    return {
        "scenario": loaded.source,
        "seed": scenario.run.seed,
        "horizon_s": horizon,
        "replications": len(totals),
        "hosts": plan.hosts,
        "gpu_model": gpu_model,
        "spare_hosts": plan.spares,
        "elastic": plan.elastic,
        "step_time_s": healthy.step_s,
        "tokens_per_step": tokens,
        "ideal_tokens_per_s": tokens / healthy.step_s if tokens else None,
        "ideal_steps_per_s": 1.0 / healthy.step_s,
        "checkpoint": {
            "mode": healthy.mode, "size_bytes": size, "interval_steps": healthy.interval_steps,
            "interval_s": healthy.interval_steps * healthy.step_s, "write_s": healthy.write_s,
            "stall_s": healthy.stall_s, "slowdown": healthy.slowdown, "cost_s": cost, "load_s": healthy.load_s,
        },
        "restart": {"detection_s": plan.detection_s, "reschedule_and_launch_s": plan.reschedule_s + plan.launch_s,
                    "load_s": healthy.load_s, "warmup_s": healthy.warmup_s, "total_s": restart},
        "failure_model": per_class,
        "expected_unexpected_interruptions": expected,
        "mtbf_s": mtbf,
        "young_interval_s": young,
        "daly_interval_s": daly,
        "young_formula_s": young_formula,
        "daly_formula_s": daly_formula,
        "young_daly_cost_s": young_daly_cost_s(healthy),
        "write_floor_steps": write_floor_steps(healthy),
        "write_floor_s": write_floor_steps(healthy) * healthy.step_s,
        "ettr": {**mean_interval([t.productive_s / horizon for t in totals], bounds=(0.0, 1.0)),
                 "by_replication": [t.productive_s / horizon for t in totals]},
        "goodput_tokens_per_s": mean_interval([t.equivalent_steps * tokens / horizon for t in totals]) if tokens
        else None,
        "goodput_steps_per_s": mean_interval([t.equivalent_steps / horizon for t in totals]),
        "interruptions": {
            "unexpected": mean_interval([sum(t.interruptions.values()) for t in totals]),
            "planned": mean_interval([t.planned for t in totals]),
            "by_cause": {name: mean_interval([t.interruptions.get(name, 0) for t in totals]) for name in causes},
        },
        "checkpoints_written": mean_interval([t.checkpoints_written for t in totals]),
        "time_s": {part: mean_interval([getattr(t, part) for t in totals]) for part in TIME_PARTS},
        "restart_waiting_for_hosts_s": mean_interval([t.waiting_for_hosts_s for t in totals]),
        "slow_steps_by_cause_s": {name: mean_interval([t.slow_by_cause_s.get(name, 0.0) for t in totals])
                                  for name in sorted({name for t in totals for name in t.slow_by_cause_s})},
        "lost_work_per_failure_s": mean_interval(lost),
        "replicas": replica_figures(loaded, plan.sizes, totals),
        **memory_tier_figures(loaded, plan, healthy, totals),
        "states": [{"replicas": state.replicas, "spines_down": state.spines_down,
                    "links_down": [list(pair) for pair in state.links_down],
                    "slow_gpus": {str(gpu): factor for gpu, factor in state.slow_gpus},
                    "nvswitch_trays_down": dict(state.nvswitch_trays_down), "step_time_s": c.step_s,
                    "tokens_per_step": c.tokens_per_step if tokens else None}
                   for state, c in sorted(states.items())],
    }


def memory_tier_figures(loaded: LoadedScenario, plan: JobPlan, healthy: SegmentCosts,
                        totals: list[ReplicationTotals]) -> dict:
    """The in-memory checkpoint tier's figures, under `memory_checkpoint`: its interval, peer copies, snapshot
    stall and restore load in the healthy state, the restarts after a failure that loaded each tier (those from
    storage by why, `StorageReason`), and the first-order two-level optimum (`two_level_figures`); nothing
    without that tier, whose job's summary has no `memory_checkpoint` key."""
    memory = loaded.scenario.checkpoint.memory
    if memory is None:
        return {}
    return {"memory_checkpoint": {
        "interval_steps": healthy.memory_interval_steps,
        "interval_s": healthy.memory_interval_steps * healthy.step_s, "replicas": memory.replicas,
        "stall_s": healthy.memory_stall_s, "load_s": healthy.memory_load_s,
        "restores": {tier: mean_interval([t.restores.get(tier, 0) for t in totals]) for tier in TIERS},
        "storage_because": {reason: mean_interval([t.storage_because.get(reason, 0) for t in totals])
                            for reason in STORAGE_REASONS},
        "two_level": two_level_figures(plan, healthy),
    }}


def two_level_figures(plan: JobPlan, healthy: SegmentCosts) -> dict | None:
    """The two-level optimum (two_level.py) of the healthy state's snapshot stall, storage cost C and write floor:
    each tier's MTBF and interval (null: no failure that tier recovers; a null memory interval: the tier buys
    nothing, storage alone; a null storage one: no failure needs storage); None without interrupting failures."""
    optimum = two_level_optimum(plan, healthy.memory_stall_s, young_daly_cost_s(healthy),
                                write_floor_steps(healthy) * healthy.step_s)
    if optimum is None:
        return None
    return {"memory_mtbf_s": optimum.memory_mtbf_s, "storage_mtbf_s": optimum.storage_mtbf_s,
            "memory_interval_s": optimum.memory_interval_s, "storage_interval_s": optimum.storage_interval_s}


def waiting_warning(summary: dict, min_replicas: int | None = None) -> str | None:
    """A warning when the job's restarts spent more than WAITING_WARNING_SHARE of the horizon waiting for hosts,
    naming the figure and the knobs that cut it (`restart.spares`, and `restart.elastic` for a job that is not;
    an elastic one waits only below its smallest size, which the warning names, and which a lower
    `restart.min_replicas` lowers where that size is ``min_replicas``, not one memory or EP sets); None below
    it."""
    waiting, horizon = summary["restart_waiting_for_hosts_s"]["mean"], summary["horizon_s"]
    if waiting <= WAITING_WARNING_SHARE * horizon:
        return None
    restarts = summary["time_s"]["restart_s"]["mean"]
    smallest = summary["replicas"]["sizes"][0]
    if not summary["elastic"]:
        knobs = "more spares or restart.elastic: true cut it"
    elif min_replicas is not None and min_replicas == smallest > 1:
        knobs = (f"more spares or a lower restart.min_replicas cut it (the elastic job waits below its smallest "
                 f"size, its restart.min_replicas, {counted(smallest, 'replica')})")
    else:
        knobs = f"more spares cut it (the elastic job waits below its smallest size, {counted(smallest, 'replica')})"
    return (f"restarts waited {format_duration(waiting)} per replication for spare or repaired hosts, "
            f"{waiting / horizon:.1%} of the horizon ({waiting / restarts:.0%} of the restart time; over "
            f"{WAITING_WARNING_SHARE:.0%} warns): the spare pool is too small (restart.spares: "
            f"{summary['spare_hosts']:,}); {knobs}")
