"""A job simulation over a horizon: the scenario's cluster, failure model, checkpoint and restart costs,
the engine's step time per cluster state, and `run.replications` SimPy job processes with independent,
seeded failures (replication r draws from `numpy.random.default_rng([run.seed, r])`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, NoReturn

import numpy as np
import simpy

from simulator.collector import collector_paused
from simulator.config.loader import LoadedScenario
from simulator.config.locate import located
from simulator.config.reliability import UNIT_KINDS, Effect, ElasticBatch
from simulator.config.schema import TraceWorkload
from simulator.config.yaml_source import FieldPath
from simulator.engine.fold_policy import (
    EVERY_RANK_A_CLASS,
    EVERY_RANK_NEAR,
    link_fault_blocker,
    straggler_blocker,
)
from simulator.engine.stepping import run_all
from simulator.errors import ScenarioError, StepAborted
from simulator.reliability.ahead import (
    AHEAD_MIN_STATES,
    LONG_AHEAD_S,
    MAX_AHEAD_S,
    STRAGGLER_FORESIGHT_S,
    Foreseen,
    LinkStateSizes,
    cores,
    link_state_s,
    simulate_ahead,
    simulate_known,
    slow_states,
    states_ahead,
    states_foreseen,
    time_ahead,
    with_links_down,
)
from simulator.reliability.blast import ClusterUnits, cluster_units
from simulator.reliability.checkpoint import (
    NO_SNAPSHOT_TAKEN,
    SegmentCosts,
    StepState,
    checkpoint_bytes,
    segment_costs,
    takes_no_snapshot,
)
from simulator.reliability.components import FailureClass, FailureModel, failure_model, preset_system_warning
from simulator.reliability.cuts import interrupting_shares, training_shares
from simulator.reliability.elastic import (
    ElasticSizes,
    allowed_sizes,
    elastic_sizes,
    one_size_warning,
    trace_replicas,
    trace_sizes,
)
from simulator.reliability.events import JobEvents
from simulator.reliability.job import JobPlan, JobProcess, ReplicationTotals, rate_sum, spare_rack_names
from simulator.reliability.processes import Arrivals, draw_arrivals
from simulator.reliability.states import (
    ClusterState,
    Degradation,
    LinksFollowRacks,
    StepStates,
    nvls_forced,
    state_guard,
    step_key,
)
from simulator.reliability.summary import (
    idle_memory_tier_warning,
    job_summary,
    memory_near_storage_warning,
    memory_stall_warning,
    no_progress_text,
    no_progress_warning,
    optimum_intervals,
    waiting_warning,
    write_wait_warning,
    young_daly_warning,
)
from simulator.scale import ScaleEstimate, sized_topology
from simulator.topology.graph import both_ways
from simulator.units import (
    counted,
    decimal_sizes_apart,
    format_bandwidth,
    format_count,
    format_decimal_size,
    format_duration,
    texts_apart,
)
from simulator.workload.training import microbatch_count, resolve_model

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from simulator.faults.step import StepFaultPlan
    from simulator.parallel.layout import Layout
    from simulator.program.step import StepProgram
    from simulator.simulation import PreparedStep
    from simulator.topology.graph import Topology


@dataclass(frozen=True)
class JobResult:
    """A finished job simulation: job_summary.json's dict, the event log, the healthy step's summary (summary.json:
    its warnings and then the job's) and the job's warnings: those known before it runs (an interval that lets
    no checkpoint finish, `interval_past_horizon`), then ``waiting`` where its restarts mostly waited for hosts
    (`summary.waiting_warning`), ``idle_memory`` where some state met took no in-memory snapshot and
    ``split_evenly`` where a sub-state of the slow-step split was refused, which `trainsim run` prints once the
    job is simulated. The event table is built
    on first use (a study that reads only the summary never builds it)."""

    summary: dict
    log: JobEvents
    step_summary: dict
    warnings: tuple[str, ...]
    waiting: str | None
    idle_memory: str | None = None
    """The cluster states met where the in-memory tier took no snapshot (`summary.idle_memory_tier_warning`)."""
    split_evenly: str | None = None
    """The cluster states whose slow-step time split evenly between their causes, a sub-state refused
    (`split_evenly_warning`)."""
    ettr_by_replication: tuple[float, ...] = ()
    """Each replication's ETTR, in order: a study pairs its points' replications, which share their seeds."""

    @cached_property
    def table(self) -> pa.Table:
        """The rows of job_events.parquet as an Arrow table."""
        return self.log.table()

    @cached_property
    def events(self) -> pd.DataFrame:
        """The rows of job_events.parquet as a DataFrame (`kind` categorical)."""
        return self.table.to_pandas()


def _checkpoint_size(loaded: LoadedScenario) -> float:
    """The checkpoint's bytes, refused where nothing gives them (synthetic stage costs or a replayed trace, which
    have no parameter count, without `checkpoint.size`) and where the storage could never hold it, at the field
    the user set: the checkpoint's `size` or `bytes_per_param` (a typo in a size is likelier than in the store's), else
    `storage.capacity` (a huge checkpoint.size was blamed on the default capacity). Both sizes read in decimal
    units, as the fields are given ('6.48 TB'), with the digits it takes to tell them apart (`decimal_sizes_apart`)."""
    scenario = loaded.scenario
    if scenario.checkpoint.size is None and scenario.model is not None and scenario.model.synthetic is not None:
        raise ScenarioError("a synthetic model has no parameter count to size the checkpoint from",
                            field="checkpoint", allowed="checkpoint.size: e.g. '6.48 TB'")
    if scenario.checkpoint.size is None and isinstance(scenario.workload, TraceWorkload):
        raise loaded.error(("checkpoint", "size"), "a replayed trace has no parameter count to size the checkpoint "
                           "from (workload.model_flops_per_token is not read as one)", "a size such as '810 GB'")
    params = 0.0 if scenario.checkpoint.size is not None else float(resolve_model(scenario).num_params())
    size, capacity = checkpoint_bytes(scenario, params), scenario.storage.capacity
    if size <= capacity:
        return size
    own = ("checkpoint", "size") if scenario.checkpoint.size is not None else ("checkpoint", "bytes_per_param")
    field = own if loaded.gave(own) else ("storage", "capacity")
    size_text, capacity_text = decimal_sizes_apart(size, capacity)
    raise loaded.error(field, f"a {size_text} checkpoint is larger than the storage ({capacity_text})",
                       f"a checkpoint of at most {capacity_text}, or a storage.capacity of at least {size_text}")


MAX_JOB_EVENTS = 20_000_000
"""Refuse job simulations expected to handle more failure arrivals, maintenance windows and checkpoints than
this over all replications (about two minutes and 3 GiB; the bundled 54-day Llama 3 job has ~1.6 M, nearly
all of them checkpoints), unless forced."""
MAX_FORCED_JOB_EVENTS = 10**12
"""Refuse job simulations expected to handle more events than this even when forced: at the rate of
MAX_JOB_EVENTS, 50,000 times its two minutes and 3 GiB (about 70 days and 150 TiB). Beyond about 9.2e18
failures in one replication numpy cannot even draw their count (a rate of 1e300 per second was its traceback)."""


MAX_SPARES_PER_HOST = 10
"""Refuse more spare hosts than this many per host of the job: a pool that large never runs dry already, and spares
of GB200 racks are built as racks and NVSwitch trays that draw failures (`spares: 100000000`, a slip of the keys,
built millions of them instead of answering)."""


def job_event_limit(force: bool) -> int:
    """The most events a job simulation may handle over all its replications: MAX_JOB_EVENTS, or
    MAX_FORCED_JOB_EVENTS with ``force``."""
    return MAX_FORCED_JOB_EVENTS if force else MAX_JOB_EVENTS


def job_event_parts(loaded: LoadedScenario, model: FailureModel, counts: list[int], checkpoint_period_s: float | None,
                    memory_period_s: float | None = None) -> tuple[dict[FieldPath, float], list[float]]:
    """The events one replication is expected to handle, by the field that carries each part (failures drawn,
    maintenance windows, checkpoints written where ``checkpoint_period_s`` is given and in-memory snapshots where
    ``memory_period_s`` is), and the failures per class."""
    horizon = loaded.scenario.run.horizon or 0.0
    per_class = [units * klass.rate_per_unit_s * horizon for klass, units in zip(model.classes, counts)]
    parts = {("faults",): sum(per_class),
             ("faults", "maintenance", "every"): horizon / model.maintenance.every_s if model.maintenance else 0.0}
    if checkpoint_period_s is not None:
        parts[("checkpoint", "interval")] = horizon / checkpoint_period_s
    if memory_period_s is not None:
        parts[("checkpoint", "memory", "interval")] = horizon / memory_period_s
    return parts, per_class


def memory_period_s(costs: SegmentCosts) -> float | None:
    """The time per in-memory snapshot in a state: each storage cycle (`Cycle.period_s`) takes one every
    `memory_interval_steps` steps short of its storage checkpoint, which restarts their count, with their
    stalls (memory every 5 min and storage every 10 min: one a cycle, not the two of the memory interval
    alone); None without that tier or where no snapshot comes round."""
    if not costs.memory_interval_steps:
        return None
    snapshots = (costs.interval_steps - 1) // costs.memory_interval_steps
    if snapshots == 0:
        return None
    return (costs.cycle.period_s + snapshots * costs.memory_stall_s) / snapshots


def refuse_long_job(loaded: LoadedScenario, model: FailureModel, counts: list[int], checkpoint_period_s: float | None,
                    *, force: bool, memory_period: float | None = None) -> None:
    """Refuse a job whose expected events (failures drawn, maintenance windows, checkpoints written) over
    every replication pass MAX_JOB_EVENTS (MAX_FORCED_JOB_EVENTS when ``force``), before any is drawn, naming
    the part that dominates and the field the user set that carries it (`_blamed_for_events`; a per-GPU MTBF of
    one second on 32 GPUs draws 28 million failures per 10-day replication). ``checkpoint_period_s`` is the
    healthy cycle's time between checkpoints, the checkpoint's own time included (`Cycle.period_s`); None where
    the step is not simulated (`trainsim validate`), which counts the failures and maintenance windows alone;
    ``memory_period`` that of the in-memory snapshots."""
    replications = loaded.scenario.run.replications
    parts, per_class = job_event_parts(loaded, model, counts, checkpoint_period_s, memory_period)
    total = sum(parts.values()) * replications
    limit = job_event_limit(force)
    if total <= limit:
        return
    names = {("faults",): "failures", ("faults", "maintenance", "every"): "maintenance windows",
             ("checkpoint", "interval"): "checkpoints", ("checkpoint", "memory", "interval"): "in-memory snapshots"}
    dominant = max(parts, key=lambda path: parts[path])
    if dominant == ("faults",):
        dominant = ("faults", "components", model.classes[per_class.index(max(per_class))].name)
    field = _blamed_for_events(loaded, dominant, total / replications <= limit)
    listed = ", ".join(f"{format_count(parts[path] * replications)} {names[path]}" for path in parts)
    intervals = "checkpoint.interval" + (", checkpoint.memory.interval" if memory_period is not None else "")
    changes = (f"lower failure rates, a longer {intervals} or faults.maintenance.every, fewer "
               "run.replications or a shorter run.horizon")
    beyond = "even --force runs at most" if force else "limit"
    raise loaded.error(field, f"the job would handle ~{format_count(total)} events over "
                       f"{counted(replications, 'replication')} ({listed}; {beyond} {format_count(limit)})",
                       changes if force else f"{changes}; or pass --force")


def _blamed_for_events(loaded: LoadedScenario, dominant: FieldPath, one_replication_fits: bool) -> FieldPath:
    """The field a refusal of too many job events names, one the user set: `run.replications` where a single
    replication would be within the limit; else the largest part's own field where the scenario gives it
    (`faults.rate_multiplier`, which scales every class, before the failure class that dominates;
    `faults.maintenance.every`; `checkpoint.interval`); else `run.horizon`, which multiplies every part (a
    horizon of 1e300 s was blamed on the default checkpoint interval)."""
    if one_replication_fits:
        return ("run", "replications")
    if dominant[:2] == ("faults", "components") and loaded.gave(("faults", "rate_multiplier")):
        return ("faults", "rate_multiplier")
    for path in (dominant, ("faults", "preset")) if dominant[:2] == ("faults", "components") else (dominant,):
        if loaded.gave(path):
            return path
    return ("run", "horizon")


def _refuse_unfolded_steps(loaded: LoadedScenario, model: FailureModel, topology: Topology,
                           sizes: LinkStateSizes, activity: Callable[[str], None] | None) -> PreparedStep | None:
    """Refuse a job whose steps would be simulated unfolded beyond the limits a plain run has
    (`scale.unfolded_beyond_limits`): each of its degraded or straggling states (its healthy step, folded or
    not, was sized as `trainsim run` sizes it, `scale.sized_topology`): states with links down (leaf switches,
    cables, NICs that `degrade`) are sized by the classes `fold_policy.link_fault_step` folds them by
    (`_refuse_unfolded_link_states`, by ``sizes``, the job's `ahead.LinkStateSizes`), states with NVSwitch trays
    down too (their rack's NVLink links degraded from the start, or down with every tray, which fold by the
    rack's hosts), and straggler states unfold where the engine's folding rule says so (each distinct set of
    stages slowed is a state). 16,384 GPUs unfolded are ~45 million ops + flows and ~37 GiB per step (the docs'
    leaf-switch example met ~75 leaves per replication of the 405B job, its throttling example thousands of
    straggler states, and both ran for hours without a word). ``activity`` hears the tray states' checks.

    The straggler states are asked of the healthy step, built here once and
    returned for the job to run: a fold check that unfolds it (other than its plan's, which refuses it as the
    job's step) unfolds every state for the same reason; else `fold_policy.straggler_blocker` answers, and where
    its answer is that the slow replica's traffic shares links with the others' (`Unfolding.shares_links`) the
    states refold with every mirror kept, sized so (`_refuse_straggler_refold`)."""
    from simulator.program.unfolding import Unfolding
    from simulator.scale import unfolded_beyond_limits
    from simulator.simulation import prepare_training, step_faults

    scenario = loaded.scenario
    linked = [klass for klass in model.classes if klass.effect is Effect.DEGRADE and klass.unit != "spine_switch"]
    nvlink = [klass for klass in linked if klass.unit == "nvswitch_tray"]
    straggling = [klass for klass in model.classes if klass.effect is Effect.STRAGGLE]
    if not (linked or straggling):
        return None
    estimate = unfolded_beyond_limits(loaded, topology.num_gpus, topology)
    if estimate is None:
        if straggling and scenario.run.fold:
            _refuse_straggler_refold(loaded, straggling[0], topology)
        return None
    limits = f"{estimate.describe()}; {estimate.beyond()}"
    klass = (nvlink or linked or straggling)[0]

    def refuse(why: str, culprit: FailureClass = klass) -> NoReturn:
        """Refuse the states of class ``culprit`` (by default the first that degrades links, else straggles)."""
        problem = "degrades the cluster" if linked else "slows a pipeline stage"
        restart = "effect: replace (the job restarts without the unit), " if linked else ""
        raise loaded.error(_class_field(loaded, culprit), f"a {culprit.name} failure {problem}, and each such state "
                           f"is simulated as an unfolded step ({why}): {limits}",
                           f"{restart}a smaller cluster, or --force")

    if linked:
        _refuse_unfolded_link_states(loaded, topology, linked, bool(straggling), refuse, sizes, activity)
        return None
    refuse_healthy = state_guard(loaded, topology, None)

    def guard(unfolding: Unfolding) -> None:
        """A fold check that unfolds the healthy step unfolds every straggler state; the plan's refuses the
        job's step itself, as a fold by classes beyond the limits does."""
        if unfolding.check not in ("plan", "classes"):
            refuse(unfolding.reason)
        refuse_healthy(unfolding)

    faults = step_faults(loaded, topology)
    healthy = prepare_training(loaded, topology, faults, guard)
    why, every_mirror = _straggler_refold(loaded, topology, healthy, faults, klass.slowdown)
    if why:
        refuse(why)
    _refuse_straggler_refold(loaded, klass, topology, every_mirror)
    return healthy


def _refuse_unfolded_link_states(loaded: LoadedScenario, topology: Topology, linked: Sequence[FailureClass],
                                 straggling: bool, refuse: Callable[..., NoReturn], sizes: LinkStateSizes,
                                 activity: Callable[[str], None] | None) -> None:
    """Refuse, with ``refuse`` (why), a job whose states with links down (classes ``linked``, `degrade`) would
    pass the scale limits, sized by the classes `fold_policy.link_fault_step` folds them by
    (``sizes``, `ahead.LinkStateSizes`: from the layout and the cluster, no step built) for the unit of each
    class whose links down leave the most ranks, each refusal of their size naming the class of that unit (it
    named the first class that degrades links, whichever gave the size): refused where a fold is known up front
    to be refused (`fold_policy.link_fault_blocker` of the scenario's own `faults.step`: the analytic model, its
    stragglers or links failing mid-step; a straggle class beside, ``straggling``), where those classes are every
    rank (every host near the links down: a job under one leaf group), or where the fold itself would pass the
    limits; the states a job foresees are sized again, by the largest (`_told_time_ahead`). A state with NVSwitch
    trays down is sized unfolded, so refused, where its fold is given up (`first_tray_fold_blocker`, asked for
    each count of trays down up to the first): before, each was sized by its fold, and a job passed that met
    states of 4 or more trays down unfolded, refused mid-job after simulating those of 1-3. Tray states are
    sized by trays down on every rack at once (`_every_racks_tray_links`: every rank near, the step unfolded, on
    more than one rack): before, by one rack's, and a job passed that was refused mid-job with a tray down on
    each of two racks. A state whose fold a check refuses or that falls out of step at run time is unfolded, and
    refused when the job meets it where the unfolded step passes the limits (at 16,384 GPUs ~66 million ops +
    flows and ~55 GiB), unless ``force``: the estimate is no promise. A leaf_switch class on the 16,384-GPU job
    was refused up front although its states fold. ``activity``: `first_tray_fold_blocker`'s."""
    from simulator.engine.fold_policy import fold_faults
    from simulator.simulation import step_faults

    blocker = link_fault_blocker(fold_faults(step_faults(loaded, topology), topology), loaded.scenario.network.model)
    if blocker or straggling:
        refuse(blocker or "link faults beside a straggle class, whose states with both are not folded")
    world = sizes.size(None).topology.num_gpus
    units = cluster_units(topology)
    trays = next((klass for klass in linked if klass.unit == "nvswitch_tray"), None)
    unfolding = first_tray_fold_blocker(loaded, units, activity) if trays is not None and units.nvswitch_trays \
        else None
    if trays is not None and unfolding is not None:
        down, blocker = unfolding
        refuse(f"{down} of a rack's {units.nvswitch_trays} NVSwitch trays down: {blocker}", trays)
    downs = [(index, units.links(klass.unit, unit))
             for index, klass in enumerate(linked) for unit in range(units.count(klass.unit))]
    if trays is not None:
        downs.append((linked.index(trays), _every_racks_tray_links(units)))
    ranks, largest = max(((sizes.count(None, down), index) for index, down in downs),
                         key=lambda counted_class: counted_class[0])
    if ranks >= world:
        refuse(EVERY_RANK_NEAR, linked[largest])
    estimator = sizes.estimator(None)
    _refuse_folded_link_state(loaded, loaded, topology, world, linked[largest], ranks,
                              None if estimator is None else estimator(ranks), "each such state")


def _every_racks_tray_links(units: ClusterUnits) -> tuple[tuple[str, str], ...]:
    """The links a tray down on every rack degrades: the worst tray state a job can meet (trays fail on any
    rack), whose hosts are every host of the racks."""
    return tuple(link for unit in units.first_trays() for link in units.links("nvswitch_tray", unit))


TRAY_FOLDS_ACTIVITY = "checking NVSwitch tray states' folds"


def first_tray_fold_blocker(loaded: LoadedScenario, units: ClusterUnits,
                            activity: Callable[[str], None] | None = None) -> tuple[int, str] | None:
    """The fewest of a rack's NVSwitch trays down (k = 1 .. all) whose step does not fold, with why
    (`tray_fold_blocker`), or None where every count folds: stopped at the first, each check builds the cluster
    and the step (an 8-rack, 18-tray job took 13 s for every count). ``activity`` hears `TRAY_FOLDS_ACTIVITY`
    meanwhile, then ''. Under forced NVLS a rack with every tray down has no step
    (`StepStates._bare_rack_under_nvls`), so no fold to check."""
    if activity is not None:
        activity(TRAY_FOLDS_ACTIVITY)
    try:
        with_a_step = units.nvswitch_trays - 1 if nvls_forced(loaded.scenario) else units.nvswitch_trays
        for down in range(1, with_a_step + 1):
            blocker = tray_fold_blocker(loaded, units, down)
            if blocker is not None:
                return down, blocker
        return None
    finally:
        if activity is not None:
            activity("")


def tray_fold_blocker(loaded: LoadedScenario, units: ClusterUnits, down: int) -> str | None:
    """Why the step with ``down`` of a rack's NVSwitch trays down (on the first rack) does not fold, or None
    where it folds or has no step: its fold is made as the state's step makes it (`prepare_training` of the
    scenario with the trays' link faults added, on a cluster of its own, the links down with every tray taken
    down first as `FaultHooks` takes them: before, 9 down was checked with its links up and passed), stopped
    where it would be built unfolded; a lone rack with every tray down has no route, so no fold. The trays'
    links degraded to (T - k) / T change `auto`'s choices, so a fold may pass with 1-3 trays down and not with 4
    or more (a tree's inner ranks and leaves meeting another collective's traffic)."""
    from simulator.config.faults import StepFaults
    from simulator.engine.faults import FaultHooks
    from simulator.program.unfolding import Unfolding
    from simulator.reliability.perturbed import with_step_faults
    from simulator.reliability.states import nvswitch_tray_faults
    from simulator.simulation import prepare_training, step_faults
    from simulator.topology.loader import scenario_topology

    class Unfolds(Exception):
        """The fold checked is given up (its reason the argument)."""

    def unfolds(unfolding: Unfolding) -> None:
        if unfolding.ranks is None:  # a fold by classes is still a fold
            raise Unfolds(unfolding.reason)

    own: StepFaults = loaded.scenario.faults.step
    topology = scenario_topology(loaded)
    links = own.links + nvswitch_tray_faults(topology, ((units.nodes["nvswitch_tray"][0], down),))
    state = with_step_faults(loaded, own.model_copy(update={"links": links}))
    try:
        hooks = FaultHooks(topology, step_faults(state, topology))
        prepare_training(state, topology, hooks.plan, unfolds)
    except Unfolds as unfolded:
        return str(unfolded)
    except StepAborted:
        pass
    return None


def _refuse_folded_link_state(loaded: LoadedScenario, sized: LoadedScenario, topology: Topology, world: int,
                              klass: FailureClass, ranks: int, folded: ScaleEstimate | None, which: str) -> None:
    """Refuse ``loaded``'s job whose state with links down of class ``klass`` (``which``: 'each such state', or
    the largest foreseen), folded by the hosts near them onto ``ranks`` ranks (`rank_classes.LinkFaultRanks`) as
    ``folded`` estimates it (`scale.classed_estimate`), passes the scale limits; where those are every rank of
    the ``world`` (the job's GPUs on the state's cluster, ``sized`` built as ``topology``: a shrunk one's), the
    unfolded step's estimate. At the class's field."""
    from simulator.scale import unfolded_beyond_limits

    if ranks >= world:
        estimate, how = unfolded_beyond_limits(sized, world, topology), f"unfolded ({EVERY_RANK_NEAR})"
    else:
        estimate, how = folded, "folded by the hosts near its links down"
    if estimate is not None and estimate.over_limits():
        raise loaded.error(_class_field(loaded, klass), f"a {klass.name} failure degrades the cluster, and {which} "
                           f"is simulated {how}: {estimate.describe()}; {estimate.beyond()}",
                           "effect: replace (the job restarts without the unit), a smaller cluster, or --force")


def _class_field(loaded: LoadedScenario, klass: FailureClass) -> FieldPath:
    """The field of failure class ``klass``: its `faults.components` entry, or `faults` for a preset's."""
    return ("faults", "components", klass.name) if klass.name in loaded.scenario.faults.components else ("faults",)


def _trace_step(loaded: LoadedScenario, topology: Topology, *, force: bool) -> tuple[PreparedStep, ElasticSizes]:
    """A replayed trace's job: its healthy step built (not yet run) and refused as `refuse_trace_step` says (idle
    GPUs, its sizes, then its size: before, a large trace was replayed whole before the idle-GPU refusal), before
    the job's checks that need no step (`check_job`), as `trainsim validate` makes them: run made them first, and a
    job both of whose refusals applied met a different first error in each. The healthy step, for the job to run,
    and the job's sizes."""
    from simulator.simulation import prepare_training, step_faults

    guard = None if force else state_guard(loaded, topology, None)
    healthy = prepare_training(loaded, topology, step_faults(loaded, topology), guard)
    sizes = refuse_trace_step(loaded, topology, healthy.step.program, force=force)
    assert sizes is not None  # a job has a horizon
    return healthy, sizes


def _refuse_unfolded_trace_states(loaded: LoadedScenario, model: FailureModel, topology: Topology,
                                  program: StepProgram) -> None:
    """Refuse a replayed trace's job where the states of a class that straggles or degrades links would pass the
    scale limits: a trace has no layout to fold stragglers or link faults by (`fold_policy.fold_with_faults`),
    so each such state replays every copy that `workload.dp` adds, unfolded."""
    from simulator.scale import refuse_large_trace

    unfolding = [klass for klass in model.classes if klass.effect is Effect.STRAGGLE
                 or (klass.effect is Effect.DEGRADE and klass.unit != "spine_switch")]
    if unfolding:
        klass = unfolding[0]
        field = ("faults", "components", klass.name) if klass.name in loaded.scenario.faults.components else ("faults",)
        refuse_large_trace(loaded, topology.num_gpus, program, unfolded_by=(field, f"a {klass.name} failure's states"))


def _slow_replica_classes(loaded: LoadedScenario, gpus: int) -> tuple[Layout, int]:
    """The job's layout and how many classes of ranks a straggler state's slow replica parts each stage into
    (`fold_policy.straggler_step`: one for each combination of sharing or not the slow GPU's TP, CP and DP
    coordinates)."""
    from simulator.workload.training import pipeline_depth, resolve_layout

    layout = located(loaded, lambda: resolve_layout(loaded.scenario, gpus, pipeline_depth(loaded.scenario)))
    return layout, 2 ** sum(1 for degree in (layout.tp, layout.cp, layout.dp) if degree > 1)


def _straggler_refold(loaded: LoadedScenario, topology: Topology, healthy: PreparedStep, faults: StepFaultPlan,
                      factor: float) -> tuple[str, bool]:
    """Why the job's straggler states (a slowdown of ``factor``) unfold, by the engine's folding rule asked of the
    ``healthy`` step under the scenario's own ``faults`` (`fold_policy.straggler_blocker`), or '' where they refold
    by the slow replica's classes; and whether that refold keeps every mirror (the slow replica's traffic shares
    links with the others', `Unfolding.shares_links`). Classes of one rank each unfold the states
    (`EVERY_RANK_A_CLASS`)."""
    unfolding = located(loaded, lambda: straggler_blocker(healthy.step, healthy.build, healthy.plans,
                                                          healthy.settings.mode, faults, factor))
    if unfolding is not None and not unfolding.shares_links:
        return unfolding.reason, False
    if _every_rank_a_class(loaded, topology.num_gpus):
        return EVERY_RANK_A_CLASS, False
    return "", unfolding is not None


def _every_rank_a_class(loaded: LoadedScenario, gpus: int) -> bool:
    """Whether the slow replica's classes hold one rank each (every degree but PP at most 2), so that
    `fold_policy.straggler_step` runs each straggler state unfolded rather than refolded."""
    layout, classes = _slow_replica_classes(loaded, gpus)
    return layout.pp * classes >= layout.world


def _refuse_straggler_refold(loaded: LoadedScenario, klass: FailureClass, topology: Topology,
                             every_mirror: bool = False) -> None:
    """Refuse, before the healthy step runs, a job whose straggler states of class ``klass`` fold and would each
    simulate a refold beyond the limits a plain run has: a state slows one GPU of the first replica in each stage
    its unit's GPUs serve, and its step is refolded by the slow replica's classes (`_slow_replica_classes`), the
    folded estimate scaled by those ranks (`scale.refold_estimate`). Where those classes are every rank the state
    runs unfolded, and the unfolded estimate (`_refuse_unfolded_steps`) is the one that holds: the linear refold
    overstates it (TP 2, CP 2, PP 4, DP 2: ~14,528 ops + flows against 10,880 unfolded). ``every_mirror``: the
    slow replica's traffic shares links with the other replicas', so the refold keeps every mirror and is
    estimated with every copy of its collectives (`scale.every_mirror_refold`). The refusal names the class, what
    its unit slows and the limit passed, its value against it."""
    from simulator.scale import estimate_scale, every_mirror_refold, refold_estimate, scenario_hosts, scenario_table

    scenario = loaded.scenario
    gpus = topology.num_gpus
    folded = located(loaded, lambda: estimate_scale(scenario, gpus, scenario_hosts(loaded), topology,
                                                    table=scenario_table(loaded)))
    if folded is None or not folded.folded or _every_rank_a_class(loaded, gpus):
        return
    layout, classes = _slow_replica_classes(loaded, gpus)
    refold = (located(loaded, lambda: every_mirror_refold(loaded, gpus, layout.pp * classes, topology)) if every_mirror
              else refold_estimate(folded, gpus, layout.pp * classes))
    if refold is not None and refold.over_limits():
        name, unit = klass.name, klass.unit.replace("_", " ")
        slowed = ("one GPU of a pipeline stage" if klass.unit == "gpu" else
                  f"a {unit}'s GPUs (a state: one GPU of each pipeline stage they serve)")
        field = ("faults", "components", name) if name in scenario.faults.components else ("faults",)
        raise loaded.error(field, f"a {name} failure slows {slowed}, and each such state is "
                           f"simulated refolded by the slow GPU's classes ({layout.pp} stages x {classes}"
                           f"{EVERY_MIRROR if every_mirror else ''}): {refold.describe()}; {refold.beyond()}",
                           f"{ANALYTIC_STRAGGLERS if every_mirror else ''}a smaller cluster, or --force")


EVERY_MIRROR = ", every mirror kept: the slow replica's traffic shares links with the other replicas'"
"""How a straggler state's refold is simulated where the slow replica's traffic shares links with the others'
(`Unfolding.shares_links`, `fold_policy.straggler_step`)."""
ANALYTIC_STRAGGLERS = ("network.model: analytic (each collective alone: the slow replica meets no other's traffic, "
                       "so its states keep no mirror), ")
"""The cut a refusal or warning of straggler states that keep every mirror names first."""


_STRAGGLER_FOLDS: dict[tuple[str, bool], tuple[str, bool]] = {}
"""Per step (`states.step_key`) and `run.fold` (which the key leaves out), why its straggler states unfold ('' where
they refold) and whether their refold keeps every mirror (`sized_straggler_states`; the engine's rule reads which
ranks are slowed, not by how much:
`fold_policy.refaulted`): a study's points share the healthy step, which the process's state cache keeps, so
each would otherwise build it again to ask."""


def sized_straggler_states(loaded: LoadedScenario, model: FailureModel, topology: Topology,
                           prepared: PreparedStep | None, sizes: LinkStateSizes, force: bool) -> PreparedStep | None:
    """Set on ``sizes`` how many ranks a straggler state's step simulates (`LinkStateSizes.straggler_ranks`),
    for the estimate of its CPU time that the job tells as it meets each one and up front (`_told_straggler_time`):
    every rank where the engine's folding rule unfolds such a step (`fold_policy.straggler_blocker`, asked of
    the healthy step ``prepared``, built here where the job's checks did not, and returned for the job to run:
    `run.fold: false`, a healthy step that unfolds, classes of one rank each), or the one rank per class that
    `fold_policy.straggler_step` simulates, with every mirror kept where on the flow model the slow replica's
    traffic shares links with the others' (`LinkStateSizes.straggler_every_mirror`: a straggling GPU on the
    2,048-GPU Llama 3 70B job, 16 ranks, estimated 1.9 s of CPU a state against 3.2 min unfolded). Nothing for a
    job without a straggle class, or a trace."""
    from simulator.simulation import prepare_training, step_faults

    straggling = [klass for klass in model.classes if klass.effect is Effect.STRAGGLE]
    layout = sizes.size(None).layout
    if not straggling or layout is None:
        return prepared
    key = step_key(loaded), loaded.scenario.run.fold
    if key not in _STRAGGLER_FOLDS:
        if not loaded.scenario.run.fold:
            _STRAGGLER_FOLDS[key] = "run.fold: false", False
        else:
            faults = step_faults(loaded, topology)
            if prepared is None:
                prepared = prepare_training(loaded, topology, faults,
                                            None if force else state_guard(loaded, topology, None))
            why = prepared.step.off_reason or ("" if prepared.step.program.folded else "the healthy step unfolds")
            _STRAGGLER_FOLDS[key] = ((why, False) if why
                                     else _straggler_refold(loaded, topology, prepared, faults, straggling[0].slowdown))
    why, every_mirror = _STRAGGLER_FOLDS[key]
    unfolds = bool(why)
    classes = layout.pp * _slow_replica_classes(loaded, topology.num_gpus)[1]
    sizes.straggler_ranks = layout.world if unfolds else classes
    sizes.straggler_why = why
    sizes.straggler_folded, sizes.straggler_every_mirror = not unfolds, every_mirror
    sizes.straggler_each = (f"unfolded onto {{ranks:,}} ranks ({why})" if unfolds
                            else "folded by the slow GPU's classes onto {ranks:,} ranks"
                            + (EVERY_MIRROR if every_mirror else ""))
    return prepared


def _check_inputs(loaded: LoadedScenario, hosts: int) -> None:
    """Refuse a job of a list of collectives, which is no training step, and more in-memory copies than the job
    has peer hosts (each host's copies go to other hosts in use). A spare pool larger than the job is a pool that
    never runs dry unless more hosts than it holds are out at once, taken up to `MAX_SPARES_PER_HOST` per host."""
    scenario = loaded.scenario
    spares = scenario.restart.spares
    if spares > MAX_SPARES_PER_HOST * hosts:
        raise ScenarioError(f"{spares:,} spare hosts for a job on {counted(hosts, 'host')}", field="restart.spares",
                            allowed=f"0 to {MAX_SPARES_PER_HOST * hosts:,} ({MAX_SPARES_PER_HOST} per host: a pool "
                            "that large never runs dry)")
    if scenario.model is None and not isinstance(scenario.workload, TraceWorkload):
        raise ScenarioError("a job simulation needs a training step, which a list of collectives is not",
                            field="run.horizon", allowed="a model section (preset, dimensions or synthetic stage "
                            "costs), a replayed trace (workload.trace), or no run.horizon")
    memory = scenario.checkpoint.memory
    storage = scenario.checkpoint.interval
    if memory is not None and isinstance(memory.interval, int) == isinstance(storage, int) \
            and takes_no_snapshot(memory.interval, storage):  # in one unit, no step time is needed to compare them
        in_steps = isinstance(storage, int)
        memory_text, storage_text = ((counted(memory.interval, "step"), counted(storage, "step")) if in_steps
                                     else texts_apart([memory.interval, storage], format_duration))
        problem, allowed = _unused_memory_tier(memory_text, storage_text, in_steps=in_steps)
        raise ScenarioError(problem, field="checkpoint.memory.interval", allowed=allowed)
    if memory is not None and memory.replicas >= hosts:
        raise ScenarioError(f"{memory.replicas:,} copies on other hosts for a job on {counted(hosts, 'host')}",
                            field="checkpoint.memory.replicas",
                            allowed=f"1 to {hosts - 1:,}" if hosts > 1 else "no in-memory tier on a one-host job")


def refuse_trace_step(loaded: LoadedScenario, topology: Topology, program: StepProgram, *,
                      force: bool) -> ElasticSizes | None:
    """A replayed trace's step once built (its size is its files', known once read), refused as `trainsim
    validate` and `run` both refuse it, in one order: a job's where its ranks leave GPUs idle
    (`_refuse_idle_gpus`), then one whose `min_replicas` or smaller sizes it cannot run (`_trace_job_sizes`),
    then, unless ``force``, any whose ops pass the scale limits (`scale.refuse_large_trace`). Validate checked
    the size first, run the idle GPUs: a job both too large and leaving GPUs idle met a different first error in
    each. The job's sizes (None for a step without a horizon)."""
    from simulator.scale import refuse_large_trace

    sizes = None
    if loaded.scenario.run.horizon is not None and isinstance(loaded.scenario.workload, TraceWorkload):
        _refuse_idle_gpus(loaded, program.world, topology)
        sizes = _trace_job_sizes(loaded, topology, program)
    if not force:
        refuse_large_trace(loaded, topology.num_gpus, program)
    return sizes


def _trace_job_sizes(loaded: LoadedScenario, topology: Topology, program: StepProgram) -> ElasticSizes:
    """A replayed trace's job's sizes as its trace tells its replicas (`elastic.trace_sizes`, each smaller one's
    cluster built). Only `run` checked them, once the job was prepared: `validate` passed a `min_replicas` above
    the traced job's replicas (dp left out) that `run` refused."""
    trace = _trace_details(program)
    return trace_sizes(loaded, topology, trace_replicas(trace["dp"], trace["traced_dp"]),
                       trace["traced_dp"])


def _trace_details(program: StepProgram) -> dict:
    """A replayed trace's step's summary entry `trace` (its `dp` and the traced job's `traced_dp` among them)."""
    trace = program.details["trace"]
    assert isinstance(trace, dict)
    return trace


def one_size_warning_of(loaded: LoadedScenario, topology: Topology, program: StepProgram) -> tuple[str, ...]:
    """`elastic.one_size_warning` of a replayed trace's job (none for a step without a horizon), which `trainsim
    validate` and `run` both give."""
    if loaded.scenario.run.horizon is None:
        return ()
    trace = _trace_details(program)
    warning = one_size_warning(loaded, topology.num_hosts, trace_replicas(trace["dp"], trace["traced_dp"]),
                               trace["traced_dp"])
    return () if warning is None else (warning,)


def _refuse_idle_gpus(loaded: LoadedScenario, ranks: int, topology: Topology) -> None:
    """Refuse a replayed trace's job whose ``ranks`` (the traced ranks and `workload.dp`'s copies, known once the
    trace is read) leave GPUs of the cluster idle: the failures of their hosts would interrupt a job that does
    not run there."""
    if ranks < topology.num_gpus:
        raise loaded.error(("cluster",), f"the trace's job runs {counted(ranks, 'rank')}, and the cluster has "
                           f"{topology.num_gpus:,} GPUs: the idle ones' failures would interrupt it",
                           f"a cluster of {counted(ranks, 'GPU')}, or a workload.dp that fills it")


def _check_units(loaded: LoadedScenario, model: FailureModel, units: ClusterUnits) -> None:
    """Refuse a class of `faults.components` whose unit the cluster does not have (a NIC, switch or cable on a
    single DGX host): it would fail nowhere, silently. The preset's classes are meant for any cluster and are
    left to count no units."""
    present = [kind for kind in UNIT_KINDS if units.count(kind)]
    for klass in model.classes:
        if klass.name in loaded.scenario.faults.components and not units.count(klass.unit):
            raise ScenarioError(f"class {klass.name!r} fails per {klass.unit}, and this cluster has no "
                                f"{klass.unit}", field=f"faults.components.{klass.name}",
                                allowed=f"a class whose unit the cluster has: {', '.join(present)}")


@dataclass(frozen=True)
class JobChecks:
    """What the checks of a job's sections resolved: its failure model, checkpoint size, the cluster's units
    and the replica counts it runs on (ascending, the layout's DP last; those skipped for memory)."""

    model: FailureModel
    checkpoint_bytes: float
    units: ClusterUnits
    sizes: ElasticSizes


def check_job(loaded: LoadedScenario, topology: Topology,
              sizes_progress: Callable[[int, int], None] | None = None) -> JobChecks:
    """The checks of a job's sections that need no step (in-memory copies against the hosts, an elastic job's sizes,
    ``sizes_progress(done, total)`` hearing of each smaller one checked, the failure classes and their units on
    the cluster, the checkpoint against the storage), located. `trainsim validate` runs them too."""
    located(loaded, lambda: _check_inputs(loaded, topology.num_hosts))
    sizes = elastic_sizes(loaded, topology, sizes_progress)
    model = located(loaded, lambda: failure_model(loaded.scenario.faults))
    units = cluster_units(topology)
    located(loaded, lambda: _check_units(loaded, model, units))
    size = located(loaded, lambda: _checkpoint_size(loaded))
    return JobChecks(model, size, units, sizes)


def refuse_short_horizon(loaded: LoadedScenario, step_s: float, step: str) -> None:
    """Refuse a horizon shorter than one step of ``step_s`` seconds (``step``: that time as the refusal says it:
    the simulated step's for `trainsim run`, a lower bound of it for `trainsim validate`)."""
    horizon = loaded.scenario.run.horizon
    if horizon is not None and horizon < step_s:
        raise loaded.error(("run", "horizon"), f"the horizon is shorter than one step ({step})", "a longer duration")


def _end_past(end: float, horizon: float) -> str:
    """A time at or past the horizon, as `format_duration` writes it, with how far past where that reads as the
    horizon does ('2 d (1.25 s past it)')."""
    shown = format_duration(end)
    if shown != format_duration(horizon):
        return shown
    return f"{shown} ({format_duration(end - horizon)} past it)" if end > horizon else f"{shown} (at it)"


def interval_past_horizon(loaded: LoadedScenario, healthy: SegmentCosts | None) -> str | None:
    """A warning, located at `checkpoint.interval` (or the `--set` or `study --intervals` that set it), when the
    interval the user set lets no checkpoint finish within the horizon: the job writes none, and every failure
    rolls back to its start or its last maintenance stop ('30 d' meant as '30 min' ran without a word and gave
    ETTR 86.8% instead of 99.0%). A job that never checkpoints is a fair baseline to weigh checkpoints against, so
    it runs. With the ``healthy`` state's costs (`trainsim run`) the first write ends at the earliest after the
    interval in whole healthy steps and the write (an interval equal to the horizon, or one rounding up to it,
    writes none either); without them (`trainsim validate`, before any step) a duration interval is judged
    alone. The default interval past a shorter horizon asked for no checkpoint and is left alone."""
    horizon, interval = loaded.scenario.run.horizon, loaded.scenario.checkpoint.interval
    if horizon is None or not loaded.gave(("checkpoint", "interval")):
        return None
    if healthy is not None and healthy.write_s >= horizon:
        return None  # no interval lets a write finish: `write_past_horizon` names the storage
    if healthy is None:
        if isinstance(interval, int) or interval < horizon:
            return None
        interval_s, write_s = float(interval), 0.0
    else:
        interval_s = healthy.interval_steps * healthy.step_s
        write_s = healthy.write_s
        first_s = interval_s + write_s
        if first_s < horizon:
            return None
    if isinstance(interval, int):
        assert healthy is not None  # validate, without the step, left an interval in steps alone above
        every, longer = f"{counted(interval, 'step')} ({format_duration(healthy.step_s)} each)", interval_s > horizon
        until = format_duration(horizon)
    else:
        (every, until), longer = texts_apart([interval, horizon], format_duration), interval > horizon
    if longer:
        why = f"is longer than run.horizon ({until})"
    elif healthy is None:
        why = f"finishes no write before run.horizon ({until})"
    else:
        why = (f"finishes no write before run.horizon ({until}): its first, after "
               f"{counted(healthy.interval_steps, 'step')} and a {format_duration(write_s)} write, would end at "
               f"{_end_past(first_s, horizon)}")
    most = ""
    if healthy is not None and (steps := math.ceil((horizon - write_s) / healthy.step_s) - 1) >= 1:
        most = f"at most {counted(steps, 'step')} (about {format_duration(steps * healthy.step_s)})"
    return str(loaded.error(("checkpoint", "interval"), f"a checkpoint every {every} {why}: the job writes none, "
                            "and each failure loses the work since its start or the last maintenance stop",
                            f"{most or f'a duration under {format_duration(horizon)}'} for checkpoints to be "
                            "written"))


def write_past_horizon(loaded: LoadedScenario, healthy: SegmentCosts, step: StepState, nic_count: str,
                       size: float) -> str | None:
    """A warning when one checkpoint write (of ``size`` bytes) in the ``healthy`` state (of step ``step``) outlasts
    the horizon: no interval lets a checkpoint finish, so the job writes none whatever `checkpoint.interval` says.
    It is located at the bandwidth that sets the write: `storage.write` (the store's), `cluster.nic_bandwidth`
    where the hosts' NICs (that and ``nic_count``, the topology's NICs-per-host field) are below
    `storage.host_write`, else `storage.host_write`; it names the rate or size that would let one finish."""
    horizon = loaded.scenario.run.horizon
    if horizon is None or healthy.write_s < horizon:
        return None
    storage = loaded.scenario.storage
    rate = size / healthy.write_s
    bound = ""
    if math.isclose(rate, storage.write, rel_tol=1e-9):
        path: FieldPath = ("storage", "write")
    elif 0 < step.host_network_bandwidth < storage.host_write:
        path = ("cluster", "nic_bandwidth")
        bound = (f": the hosts' NICs bound it, {step.hosts:,} x {format_bandwidth(step.host_network_bandwidth)}, "
                 f"below storage.host_write's {format_bandwidth(storage.host_write)} a host")
    else:
        path = ("storage", "host_write")
    faster = f"a write rate above {format_bandwidth(size / horizon)}"
    if bound:
        needed = size / horizon
        fields = [f"more cluster.nic_bandwidth x cluster.{nic_count}",
                  *(["a higher storage.host_write"] if needed / step.hosts > storage.host_write else []),
                  *(["a higher storage.write"] if needed > storage.write else [])]
        faster += f", {format_bandwidth(needed / step.hosts)} a host ({' and '.join(fields)})"
    return str(loaded.error(path, f"one checkpoint write takes {format_duration(healthy.write_s)} "
                            f"({format_decimal_size(size)} at {format_bandwidth(rate)}{bound}), longer than "
                            f"run.horizon ({format_duration(horizon)}): no checkpoint.interval lets a checkpoint "
                            "finish, so the job writes none, and each failure loses the work since its start or "
                            "the last maintenance stop",
                            f"{faster}, or a checkpoint.size under {format_decimal_size(rate * horizon)}"))


def _nic_count_field(topology: Topology) -> str:
    """The topology's field for NICs per host: an NVL72 rack's compute tray, else a cluster's node."""
    return "nics_per_tray" if "nics_per_tray" in topology.params else "nics_per_node"


def fixed_size_warning(loaded: LoadedScenario, sizes: ElasticSizes) -> str | None:
    """A warning for an elastic job left with no size but its layout's DP by its layout and batch (not by
    memory: a job none of whose smaller sizes fits is refused, `_checked_sizes`): it would run as a job of fixed
    size without a word. Located at the field that leaves it so and naming the nearest size that would shrink:
    `restart.min_replicas` where a lower bound would leave one (keep_global's 512 micro-batches on 64 replicas
    split whole over none of 48 to 63, and over 32; with keep_global's batch or EP counted), else `parallelism.ep`
    (EP 4 on DP 4 splits no smaller size's ranks). keep_global's batch alone never leaves a job without a smaller
    size: it splits whole over one replica. The job still runs. A replayed trace's sizes turn on its traced ranks
    (`elastic.trace_sizes`), not on these fields: `elastic.one_size_warning` warns of one that has no smaller
    size."""
    scenario = loaded.scenario
    restart, parallelism = scenario.restart, scenario.parallelism
    dp = sizes.sizes[-1]
    if (not restart.elastic or isinstance(scenario.workload, TraceWorkload) or len(sizes.sizes) > 1
            or sizes.out_of_memory or dp == 1):
        return None
    smallest = restart.min_replicas or 1
    kept = dp * located(loaded, lambda: microbatch_count(scenario, dp))
    keeps_global = restart.elastic_batch is ElasticBatch.KEEP_GLOBAL
    unbounded = allowed_sizes(dp, parallelism.cp, parallelism.ep, 1, kept if keeps_global else None)[:-1]
    per_replica = allowed_sizes(dp, parallelism.cp, parallelism.ep, smallest)[:-1] if keeps_global else ()
    low = smallest if smallest < dp else 1
    span = f"{low} to {dp - 1}" if low < dp - 1 else f"{low}"
    never = f"the elastic job never shrinks below its {counted(dp, 'replica')}: it runs as a job of fixed size"
    keep_per_replica = ""
    if per_replica:
        nearest = counted(per_replica[-1], "replica")
        keep_per_replica = f"elastic_batch: keep_per_replica, with which it shrinks to {nearest}"
    if loaded.gave(("restart", "min_replicas")) and unbounded:
        why = (_unsplit(dp, parallelism.cp, parallelism.ep, smallest, kept if keeps_global else None, span)
               if smallest < dp else "the layout's own data parallelism")
        allowed = f"at most {unbounded[-1]}, the nearest size it would shrink to"
        return str(loaded.error(("restart", "min_replicas"), f"min_replicas {smallest}: {why}; {never}",
                                f"{allowed}; or {keep_per_replica}" if keep_per_replica else allowed))
    return str(loaded.error(("parallelism", "ep"), f"EP {parallelism.ep} divides the DP x CP ranks of none of "
                            f"{span} replicas; {never}", "an EP that divides a smaller size's DP x CP ranks, or "
                            "restart.elastic: false"))


def _unsplit(dp: int, cp: int, ep: int, smallest: int, kept: int | None, span: str) -> str:
    """Why no size from ``smallest`` to ``dp`` - 1 (``span``) is allowed: the kept global batch of ``kept``
    micro-batches splits whole over none, EP divides the DP x CP ranks of none, or each fails one or the other."""
    batch = f"keep_global's {kept} micro-batches split whole over none of {span} replicas"
    experts = f"EP {ep} divides the DP x CP ranks of none of {span} replicas"
    if kept is None or not allowed_sizes(dp, cp, ep, smallest)[:-1]:
        return experts
    if not allowed_sizes(dp, cp, 1, smallest, kept)[:-1]:
        return batch
    return f"of {span} replicas, those over which keep_global's {kept} micro-batches split whole have DP x CP ranks " \
           f"EP {ep} does not divide"


@dataclass(frozen=True)
class ValidatedJob:
    """What `validate_job` found: the job's sizes and its no-progress warning where what validate knows without
    the step already gives it (`unsimulated_no_progress`)."""

    sizes: ElasticSizes
    no_progress: str | None


def validate_job(loaded: LoadedScenario, topology: Topology, step_floor_s: float,
                 trace_sizes: ElasticSizes | None, *, force: bool = False,
                 sizes_progress: Callable[[int, int], None] | None = None) -> ValidatedJob:
    """What `trainsim validate` checks of a job without simulating its step, refusing as `trainsim run` does:
    the checks that need no step (check_job); the horizon against ``step_floor_s``, a lower bound of the step
    time (preflight.step_floor: a horizon shorter than it is shorter than the step); and the job-event limit
    on the failures and maintenance windows, whose counts need no step (the checkpoints' need its time; with
    ``force``, the limit --force keeps). A replayed trace's job that leaves GPUs idle was refused before, with its
    step (`refuse_trace_step`, whose sizes it gives as ``trace_sizes``: the validator's `Verdict.trace_sizes`, None
    for a job without a trace; required, so that no caller falls back to `check_job`'s by leaving it out). The
    job's sizes, for validate to name those skipped for memory: a trace's its ``trace_sizes``, as `prepare_job`
    takes them (validate took `check_job`'s, the replicas alone, its trace not read yet). ``sizes_progress``:
    check_job's."""
    checks = check_job(loaded, topology, sizes_progress)
    refuse_short_horizon(loaded, step_floor_s, f"at least {step_floor_s:.6g} s, the kernels of its busiest GPU "
                         "stream alone")
    counts = [checks.units.count(klass.unit) for klass in checks.model.classes]
    refuse_long_job(loaded, checks.model, counts, None, force=force)
    sizes = checks.sizes if trace_sizes is None else trace_sizes
    return ValidatedJob(sizes, unsimulated_no_progress(loaded, topology, checks, step_floor_s))


def unsimulated_no_progress(loaded: LoadedScenario, topology: Topology, checks: JobChecks,
                            step_floor_s: float) -> str | None:
    """The no-progress warning (`summary.no_progress_text`) of what is known before the step is simulated, given
    only where the run is sure to give it: the restart without its checkpoint load and warm-up steps (detection,
    rescheduling, launch), the least interval the run can weigh (`_least_weighed_interval`), and an MTBF at least
    the run's: each unit's rate times the share of its failures that interrupt the job, where a `degrade` unit's
    rate is 1 / (MTBF + repair), the least `JobPlan.training_rates_s` gives it (its spare pool's odds, or its share
    of time training, only raise it). Each of these moves the renewal ETTR up, so validate's is at most the
    run's."""
    scenario = loaded.scenario
    classes = checks.model.classes
    shares = interrupting_shares(topology, checks.units, classes, _own_links_down(loaded, topology),
                                 nvls_forced(scenario))
    rates = [tuple(share * (klass.failure_rate_s(False) if klass.effect is Effect.DEGRADE
                            else klass.rate_per_unit_s) for share in unit_shares)
             for klass, unit_shares in zip(classes, shares, strict=True)]
    total = rate_sum(rates)
    if total <= 0:
        return None
    memory = scenario.checkpoint.memory
    given = memory.interval if memory is not None else scenario.checkpoint.interval
    interval = given * step_floor_s if isinstance(given, int) else given
    weighed = _least_weighed_interval(loaded, given, step_floor_s)
    restart = scenario.restart.detection + scenario.restart.reschedule + scenario.restart.launch
    return no_progress_text(restart, interval, weighed, memory is not None, 1.0 / total, None, unsimulated=True)


def _least_weighed_interval(loaded: LoadedScenario, given: float | int, step_floor_s: float) -> float:
    """The least interval the run can weigh in its renewal ETTR (`summary.no_progress_warning`) for the interval
    ``given`` (the in-memory tier's where the job has one), knowing only that its step s is at least
    ``step_floor_s`` and at most the horizon H (`refuse_short_horizon`). N steps are N s, at least N x the floor.
    A duration d runs as max(1, round(d / s)) whole steps (`checkpoint.interval_steps`), as little as 2d/3 (s
    just over 2d/3 rounds d to one step), so at least max(floor, 2d/3). The run weighs the in-memory tier's
    always, the storage checkpoint's only where it is under H (at or past it, it writes none: 0): only a duration
    d under H/2 surely is, at most 2d (s up to 2d rounds it to k >= 1 steps, k s <= d + s/2) or s itself (s over
    2d: one step), except a step of H exactly; there the run's warm-up, at least one step of H, costs it more
    ETTR than the interval weighed here (x e^(-H/M) against (T/M) / (e^(T/M) - 1) >= e^(-T/M), T <= H), so a
    job without warm-up steps weighs 0. An interval in steps has no upper bound without one on the step: 0."""
    least = given * step_floor_s if isinstance(given, int) else max(step_floor_s, 2.0 * given / 3.0)
    scenario = loaded.scenario
    if scenario.checkpoint.memory is not None:
        return least
    horizon = scenario.run.horizon
    assert horizon is not None
    surely_under = not isinstance(given, int) and given < horizon / 2.0 and scenario.restart.warmup_steps >= 1
    return least if surely_under else 0.0


@dataclass(frozen=True)
class PreparedJob:
    """A job checked and its healthy step simulated, before any replication: its plan, failure model and unit
    counts per class, the healthy state's costs, the checkpoint's bytes, the costs of the states met so far
    (None for one without a route; the replications add theirs), the healthy step's summary, the job's
    warnings known before it runs (`elastic.one_size_warning`, `fixed_size_warning`, `interval_past_horizon`,
    `write_past_horizon`, `summary.write_wait_warning`, `summary.young_daly_warning`) and the cluster's GPU model
    as the catalog names it."""

    plan: JobPlan
    model: FailureModel
    counts: list[int]
    healthy: SegmentCosts
    checkpoint_bytes: float
    cost_cache: dict[ClusterState, SegmentCosts | None]
    step_summary: dict
    warnings: tuple[str, ...]
    gpu_model: str
    states: StepStates
    link_sizes: LinkStateSizes
    """The sizes of its states with links down, those its checks built kept for its forecast."""
    step_costs: Callable[[StepState | None], SegmentCosts | None]
    """The costs of a state with a step (None: one without a route), as ``plan.costs`` works them out."""
    scenario_wide: tuple[str, ...] = ()
    """Those of ``warnings`` that turn on neither the checkpoint intervals nor the failure rates (the job's one
    size, `fixed_size_warning`, `preset_warning`): every study point gives them word for word, so a study gives
    them once, of no point."""


@collector_paused()
def prepare_job(loaded: LoadedScenario, *, force: bool = False,
                sizes_progress: Callable[[int, int], None] | None = None, merge_rotations: bool = True,
                activity: Callable[[str], None] | None = None) -> PreparedJob:
    """A job's checks, its healthy step (cached for the process: a study's points share it) and plan, the garbage
    collector paused; refused as `simulate_job` says, except for the job-event limit, which needs the interval
    the job runs. Its cluster and healthy step are refused first as `trainsim run` refuses the step alone
    (`scale.sized_topology`: the layout, then the cluster's size and the step's estimate, folded as the job runs
    it): the estimate of an unfolded step named the job's size for a layout that could never be built, and the
    GB200 job's step folded onto 2 ranks at 56 racks (~20.3 M events) ran for minutes unchecked.
    ``sizes_progress``: check_job's; ``merge_rotations``: `StepStates`'; ``activity`` hears that the healthy step
    is being simulated (`healthy_step_activity`; a replayed trace's is simulated before) and the NVSwitch tray
    states' fold checks (`first_tray_fold_blocker`)."""
    scenario = loaded.scenario
    horizon = scenario.run.horizon
    if horizon is None:
        raise ScenarioError("no job horizon", field="run.horizon", allowed="a duration such as '54 d'")
    topology = sized_topology(loaded, force)
    traced = _trace_step(loaded, topology, force=force) if isinstance(scenario.workload, TraceWorkload) else None
    checks = check_job(loaded, topology, sizes_progress)
    model, size, units = checks.model, checks.checkpoint_bytes, checks.units
    link_sizes = LinkStateSizes(loaded, topology)
    sizes = checks.sizes
    shrinking: tuple[str, ...] = ()
    if traced is not None:
        step, sizes = traced
        prepared: PreparedStep | None = step
        shrinking = one_size_warning_of(loaded, topology, step.step.program)
        if not force:
            _refuse_unfolded_trace_states(loaded, model, topology, step.step.program)
    else:
        simulating = healthy_step_activity(topology.num_gpus)
        if activity is not None:
            activity(simulating)
        prepared = None if force else _refuse_unfolded_steps(loaded, model, topology, link_sizes, activity)
        prepared = sized_straggler_states(loaded, model, topology, prepared, link_sizes, force)
        if activity is not None:  # the tray states' checks may have said something else meanwhile
            activity(simulating)
    states = StepStates(loaded, topology, force=force, healthy=prepared, merge_rotations=merge_rotations)
    if activity is not None:
        activity("")
    refuse_short_horizon(loaded, states.healthy_step.step_s, f"{states.healthy_step.step_s:.6g} s")
    cost_cache: dict[ClusterState, SegmentCosts | None] = {}

    def step_costs(step: StepState | None) -> SegmentCosts | None:
        return None if step is None else segment_costs(step, states.healthy_step, size, scenario.checkpoint,
                                                       scenario.storage, scenario.restart)

    def costs(state: ClusterState) -> SegmentCosts | None:
        if state not in cost_cache:
            cost_cache[state] = step_costs(states(state))
        return cost_cache[state]

    def degradation(index: int, unit: int) -> Degradation:
        """What unit ``unit`` of class ``index`` does to the cluster while degraded or straggling."""
        klass = model.classes[index]
        if klass.effect is Effect.STRAGGLE:
            gpus = units.gpus[klass.unit][unit]
            return Degradation(gpus=tuple(sorted(gpus)), slowdown=klass.slowdown)
        if klass.unit == "spine_switch":
            return Degradation(spine=unit)
        if klass.unit == "nvswitch_tray":
            rack, tray = units.tray_place(unit)
            return Degradation(nvswitch_tray=(plan.rack_names[rack], tray))
        return Degradation(links=units.links(klass.unit, unit))

    racks = tuple(zip((units.nodes["nvswitch_tray"][unit] for unit in units.first_trays()), units.blast["rack"]))
    spare_racks = spare_rack_names(scenario.restart.spares, racks)
    plan = JobPlan(horizon_s=horizon, classes=model.classes,
                   blast=tuple(units.blast[klass.unit] for klass in model.classes), maintenance=model.maintenance,
                   hosts=topology.num_hosts, replicas=states.healthy.replicas, spares=scenario.restart.spares,
                   elastic=scenario.restart.elastic, sizes=sizes, regrow=scenario.restart.regrow,
                   detection_s=scenario.restart.detection, reschedule_s=scenario.restart.reschedule,
                   launch_s=scenario.restart.launch, costs=costs, degradation=degradation, state_of=states.state_of,
                   interrupting=interrupting_shares(topology, units, model.classes, _own_links_down(loaded, topology),
                                                    nvls_forced(scenario)),
                   trains=training_shares(units, model.classes),
                   memory_replicas=memory.replicas if (memory := scenario.checkpoint.memory) is not None else 0,
                   racks=racks, follow_links=LinksFollowRacks(topology, racks) if racks else None,
                   spare_racks=spare_racks, nvswitch_trays=units.nvswitch_trays)
    counts = [units.count(klass.unit) for klass in model.classes]
    healthy = costs(states.healthy)
    assert healthy is not None
    _refuse_unused_memory_tier(loaded, healthy)
    mtbf, _, _ = optimum_intervals(plan, counts, healthy)
    fixed, preset = fixed_size_warning(loaded, checks.sizes), preset_warning(loaded, topology)
    warnings = (fixed, interval_past_horizon(loaded, healthy),
                write_past_horizon(loaded, healthy, states.healthy_step, _nic_count_field(topology), size),
                write_wait_warning(healthy, horizon),
                young_daly_warning(healthy, mtbf, horizon), no_progress_warning(plan, healthy, mtbf),
                memory_stall_warning(healthy),
                memory_near_storage_warning(healthy), preset)
    scenario_wide = (*shrinking, *(warning for warning in (fixed, preset) if warning is not None))
    return PreparedJob(plan, model, counts, healthy, size, cost_cache, states.healthy_summary,
                       (*shrinking, *(warning for warning in warnings if warning is not None)), topology.gpu_model,
                       states, link_sizes, step_costs, scenario_wide)


def preset_warning(loaded: LoadedScenario, topology: Topology) -> str | None:
    """A warning at `faults.preset` where its table was seen on another GPU or host size than the cluster's
    (`components.preset_system_warning`)."""
    found = preset_system_warning(loaded.scenario.faults, topology.gpu_model,
                                  topology.num_gpus // max(topology.num_hosts, 1))
    return None if found is None else str(loaded.error(("faults", "preset"), *found))


def healthy_step_activity(gpus: int) -> str:
    """What a job's progress line names while its healthy step is simulated, before any replication runs, with
    the cluster's GPU count: the step takes minutes on a large cluster (the 288-GPU GB200 job's ~34 s of CPU)."""
    return f"simulating the healthy step ({gpus:,} GPUs)"


def _own_links_down(loaded: LoadedScenario, topology: Topology) -> set[tuple[str, str]]:
    """The links the scenario's own `faults.step` take down for the rest of the step, both ways: a state's step
    has them down with its own, and aborts where they split the GPUs together (`split` is checked as each goes
    down, so with all of them at the last). Those that come back (`until`) are left out: a split they make with
    the state's links aborts its step only where a transfer needs a route across it while it lasts."""
    from simulator.simulation import step_faults

    return set(both_ways(edge for event in step_faults(loaded, topology).links
                         if event.capacity == 0 and event.until_s is None for edge in event.edges))


def _unused_memory_tier(memory: str, storage: str, *, in_steps: bool) -> tuple[str, str]:
    """The problem and the allowed values of an in-memory interval ``memory`` not shorter than the storage one,
    ``storage`` (each as written or in steps): each storage checkpoint restarts the snapshots' count, so the tier
    would never take a snapshot."""
    return (f"{memory} is not shorter than checkpoint.interval ({storage}): {NO_SNAPSHOT_TAKEN}",
            f"{'fewer' if in_steps else 'shorter'} than {storage}")


def _refuse_unused_memory_tier(loaded: LoadedScenario, healthy: SegmentCosts) -> None:
    """Refuse an in-memory interval not shorter than the storage one in the healthy state's steps, where one is
    given in steps and the other as a duration, or two durations round to the same steps (`_check_inputs`
    refuses two in one unit, in `trainsim validate` too)."""
    if healthy.memory_tier_idle:
        raise loaded.error(("checkpoint", "memory", "interval"),
                           *_unused_memory_tier(counted(healthy.memory_interval_steps, "step"),
                                                counted(healthy.interval_steps, "step"), in_steps=True))


@collector_paused()
def simulate_job(loaded: LoadedScenario, *, force: bool = False,
                 on_healthy_step: Callable[[dict], None] | None = None,
                 progress: Callable[[int, int], None] | None = None, workers: int = 0,
                 states_progress: Callable[[int, int], None] | None = None,
                 states_sharing: Callable[[int], None] | None = None,
                 foresight_progress: Callable[[int, int], None] | None = None,
                 workers_warning: Callable[[str], None] | None = None,
                 activity: Callable[[str], None] | None = None,
                 sizes_progress: Callable[[int, int], None] | None = None,
                 merge_rotations: bool = True) -> JobResult:
    """Run the job simulation of a scenario with `run.horizon` set (the garbage collector paused); one
    expected to handle more than MAX_JOB_EVENTS events, or whose healthy step (`run.fold: false`) or degraded
    or straggling states are unfolded steps beyond the scale limits, is refused unless ``force``.
    ``on_healthy_step`` gets the healthy step's summary, its warnings followed by the job's known before it runs,
    once the job has passed its checks, before any replication is simulated: `trainsim run` prints them (out of
    memory above all, an interval that writes no checkpoint) then, not minutes later when the job ends.
    ``progress(done, total)`` hears of each replication simulated, and of none done once the healthy step is
    (and any states ahead): the bar (and its clock) then shows from the start of the first replication, which
    meets most of a job's states (the throttling example's first took 10 minutes, with nothing on the screen).
    Where the job's straggler or degraded states are simulated ahead on the other cores (reliability/ahead.py,
    at most ``workers`` of them where not 0), ``foresight_progress(done, total)`` first hears of each replication
    of the pass that foresees them, then ``states_progress(done, total)`` of each state simulated, before the
    replications run, in each round, and of the first round's states simulated in the job's process before the
    second (`ahead.simulate_known`) (``states_sharing(workers)`` before the count of each simulated in the job's
    process: how many workers share those left, `ahead.simulate_ahead`); ``workers_warning`` hears one line where
    a worker ended early or could not be forked, or where the states with links down foreseen (on one core too)
    will take long (`_told_time_ahead`, which refuses those past `ahead.MAX_AHEAD_S` unless ``force``) (the
    outputs are the same; only the time differs).
    ``activity`` hears the NVSwitch tray states' fold checks (`first_tray_fold_blocker`), that the states foreseen
    are merged and sized (`sizing_text`) until they are, which state the job's process simulates before those
    workers start, then what the replications do between their counts: `replication 1/2`, and `replication 1/2:
    simulating a new cluster state (8 link(s) down)` while a state met for the first time is simulated (a leaf
    switch's state of the 2,048-GPU job took minutes, and a job printed nothing meanwhile), then '' once they are
    done; where the job may take two rounds of states ahead, each line of a round after its name (`round_text`),
    and '' after the last. ``sizes_progress(done, total)``, first of all, hears of each smaller size an elastic
    job may shrink to checked (check_job). ``merge_rotations``: states with links down that are rotations of each
    other take one step (`StepStates`; off, each is simulated, with the same outputs)."""
    scenario = loaded.scenario
    prepared = prepare_job(loaded, force=force, sizes_progress=sizes_progress, merge_rotations=merge_rotations,
                           activity=activity)
    plan, model, counts, healthy = prepared.plan, prepared.model, prepared.counts, prepared.healthy
    refuse_long_job(loaded, model, counts, healthy.cycle.period_s, force=force,
                    memory_period=memory_period_s(healthy))
    if on_healthy_step is not None:
        on_healthy_step(_with_warnings(_priced_step(loaded, prepared), prepared.warnings))
    horizon = plan.horizon_s

    def arrivals(replication: int) -> Arrivals:
        return draw_arrivals(np.random.default_rng([scenario.run.seed, replication]), model.classes,
                             plan.drawn_units(counts), horizon)

    linked, parallel = _link_classes(model), cores(workers) > 1
    slow_timed = _straggler_state_s(prepared.link_sizes, prepared.states.healthy) >= STRAGGLER_FORESIGHT_S
    if linked or slow_timed or (parallel and any(klass.effect in (Effect.STRAGGLE, Effect.DEGRADE)
                                                 for klass in model.classes)):
        rounds = _rounds_ahead(model, scenario.restart.elastic)
        round_one = _in_round(activity, 1, rounds)
        first = _foreseen_ahead(loaded, prepared, arrivals, linked, parallel, workers, force, foresight_progress,
                                states_progress, states_sharing, workers_warning, round_one)
        if first.splits:
            simulate_known(prepared.states, first.states, states_progress, round_one)
            if foresight_progress is not None:  # the count round 1 left is not round 2's
                foresight_progress(0, scenario.run.replications)
            _foreseen_ahead(loaded, prepared, arrivals, linked, parallel, workers, force, foresight_progress,
                            states_progress, states_sharing, workers_warning, _in_round(activity, 2, rounds),
                            first.states)
        if rounds > 1 and activity is not None:
            activity("")
    if progress is not None:
        progress(0, scenario.run.replications)
    events = JobEvents(tiered=scenario.checkpoint.memory is not None)
    replications = scenario.run.replications
    if activity is not None:
        prepared.states.on_simulating = _state_activity(activity, events, replications, prepared.link_sizes,
                                                        prepared.states)
    totals: list[ReplicationTotals] = []
    trained_in: set[ClusterState] = set()
    met_by_job: set[ClusterState] = set()
    split_evenly: dict[ClusterState, str] = {}
    for replication in range(replications):
        events.replication = replication
        if activity is not None:
            activity(replication_text(replication, replications))
        env = simpy.Environment()
        job = JobProcess(plan, arrivals(replication), events)
        env.process(job.run(env))
        run_all(env)
        totals.append(job.totals(healthy))
        trained_in.update(job.trained_in)
        met_by_job.update(job.met)
        split_evenly = {**job.split_evenly, **split_evenly}
        if activity is not None:  # named no more before it is counted done: each call may print the line
            activity("")
        if progress is not None:
            progress(replication + 1, replications)
    if activity is not None:
        prepared.states.on_simulating = None
    met = {state: c for state, c in prepared.cost_cache.items() if c is not None}
    summary = job_summary(loaded, plan, counts, totals, healthy, prepared.checkpoint_bytes, met,
                          prepared.gpu_model)
    summary["oom"] = bool(prepared.step_summary.get("oom"))
    summary["resources"] = _job_resources(loaded, prepared, summary)
    link_states = prepared.states.symmetry_figures(state for state in met if state in met_by_job)
    if link_states is not None:
        summary["link_states"] = link_states
    waiting = waiting_warning(summary, scenario.restart.min_replicas)
    idle = idle_memory_tier_warning(loaded, {state: costs for state, costs in met.items() if state in trained_in})
    evenly = split_evenly_warning(split_evenly)
    warnings = prepared.warnings + tuple(warning for warning in (waiting, idle, evenly) if warning is not None)
    return JobResult(summary, events, _with_warnings(_priced_step(loaded, prepared), warnings), warnings, waiting, idle,
                     evenly, tuple(summary["ettr"]["by_replication"]))


def _priced_step(loaded: LoadedScenario, prepared: PreparedJob) -> dict:
    """The healthy step's summary with its `resources`, as `trainsim run` of the step alone writes them: the states
    simulate steps without them (`simulate()` adds them), and `costs` changes no step (states.JOB_SECTIONS)."""
    from simulator.simulation import step_resources_of

    return {**prepared.step_summary, "resources": step_resources_of(loaded, prepared.gpu_model, prepared.step_summary)}


def _job_resources(loaded: LoadedScenario, prepared: PreparedJob, summary: dict) -> dict:
    """The job's GPU-hours, the part lost and its cost (metrics/resources.py): every GPU of its hosts and spare
    hosts, held over the horizon."""
    from simulator.metrics.resources import Tariff, job_resources

    plan = prepared.plan
    gpus_per_host = prepared.step_summary["gpus"] // plan.hosts
    goodput = summary["goodput_tokens_per_s"]
    trained = None if goodput is None else goodput["mean"] * plan.horizon_s
    return job_resources(Tariff.of(loaded.scenario.costs, prepared.gpu_model),
                         plan.hosts * gpus_per_host, plan.spares * gpus_per_host, plan.horizon_s,
                         summary["ettr"]["mean"], trained)


def _foreseen_ahead(loaded: LoadedScenario, prepared: PreparedJob, arrivals: Callable[[int], Arrivals],
                    linked: Sequence[FailureClass], parallel: bool, workers: int, force: bool,
                    foresight_progress: Callable[[int, int], None] | None,
                    states_progress: Callable[[int, int], None] | None,
                    states_sharing: Callable[[int], None] | None, workers_warning: Callable[[str], None] | None,
                    activity: Callable[[str], None] | None, before: Sequence[ClusterState] | None = None
                    ) -> Foreseen:
    """One round of a job's states foreseen (`ahead.states_foreseen`), told and simulated ahead as
    `simulate_job` says: the first (``before`` None) the states the job trains or restarts in, sized and refused
    up front (`_told_time_ahead`); the second the sub-states their slow-step split asks (attribution.py), where
    the first met a state with two causes or more: foreseen with the first round's states (``before``) known
    (simulated ahead, or here first, `ahead.simulate_known`), so a state no slower than healthy asks none;
    told, never refused (a sub-state refused when met splits its state evenly). The forecast reads the costs
    of the states known without adding to the job's (``prepared.cost_cache``, whose states the outputs list) or
    moving a step simulated ahead into the process's state cache, which could drop it before the job meets it
    (`StepStates.foreseen_step`). The states foreseen."""
    states, plan = prepared.states, prepared.plan
    cache = prepared.cost_cache
    split = before is not None
    read: dict[ClusterState, SegmentCosts | None] = {}

    def known(state: ClusterState) -> bool:
        return state in cache or (split and states.known(state))

    def costs(state: ClusterState) -> SegmentCosts | None:
        if state in cache:
            return cache[state]
        if state not in read:
            read[state] = prepared.step_costs(states.foreseen_step(state))
        return read[state]

    foreseen = states_foreseen(plan, arrivals, loaded.scenario.run.replications, known, costs, prepared.healthy,
                               foresight_progress, split=split, before=set(before or ()))
    if activity is not None:
        activity(sizing_text(len(foreseen.states)))
    sizes = prepared.link_sizes
    kinds = states_ahead(states, foreseen.states, sizes.ranks)
    if linked:
        _told_time_ahead(loaded, states, linked, with_links_down(kinds), sizes, workers, force or split,
                         workers_warning)
    slow = slow_states(states, foreseen.states)
    if slow and sizes.straggler_ranks is not None:
        shared = workers if parallel and len(slow) >= AHEAD_MIN_STATES else 1
        _told_straggler_time(loaded, prepared.model, slow, sizes, states, shared, force or split, workers_warning)
    if activity is not None:
        activity("")
    if parallel:
        simulate_ahead(states, kinds, workers, states_progress, workers_warning, activity, states_sharing)
    return foreseen


def round_text(number: int) -> str:
    """The round of states ahead a job is in (1-based ``number``), as its progress names it: round 1 foresees
    and simulates the states the job trains or restarts in, round 2 (only where round 1 met a state with two
    causes or more) the sub-states of their slow-step split. 'round 1 of up to 2', since round 2 may not come
    and round 1's count and time left do not hold it; short, so that the bar keeps its count on an 80-column
    terminal."""
    return "round 1 of up to 2" if number == 1 else f"round {number} of 2"


def _rounds_ahead(model: FailureModel, elastic: bool) -> int:
    """How many rounds of states ahead a job may take: 2 where two causes of slow steps may be in force at once
    (two classes that straggle or degrade, or one and an elastic job's shrink), whose slow-step split asks
    sub-states (attribution.py), else 1."""
    slowing = sum(1 for klass in model.classes if klass.effect in (Effect.STRAGGLE, Effect.DEGRADE))
    return 2 if slowing + elastic > 1 else 1


def _in_round(activity: Callable[[str], None] | None, number: int, rounds: int) -> Callable[[str], None] | None:
    """``activity`` told at once that round ``number`` begins (`round_text`), each line it then hears after the
    round's name ('' the name alone): a job's two forecasts counted the same replications, and its bar did not
    say which it was in. ``activity`` itself where a job may take one round only (``rounds``,
    `_rounds_ahead`)."""
    if activity is None or rounds < 2:
        return activity
    named = round_text(number)
    activity(named)
    return lambda line: activity(f"{named}; {line}" if line else named)


def split_evenly_warning(split_evenly: Mapping[ClusterState, str]) -> str | None:
    """A warning naming the states whose slow-step time split evenly between their causes (`split_evenly`: the
    state, and why one of its sub-states was refused; attribution.cause_shares), the first in state order."""
    if not split_evenly:
        return None
    first = min(split_evenly)
    named = ", ".join(filter(None, (counted(first.replicas, "replica"), first.describe())))
    return (f"the slow-step time of {counted(len(split_evenly), 'cluster state')} is split evenly between the "
            f"causes in force, not by their effects: a state with fewer of them could not be simulated (first: "
            f"{named}: {split_evenly[first]})")


def _link_classes(model: FailureModel) -> list[FailureClass]:
    """The classes of ``model`` whose units take links down while degraded (a spine switch's state is the tree
    with slower uplinks, sized otherwise; an NVSwitch tray's degrades its rack's NVLink links, a state of its
    own that folds by the rack's hosts, sized before the healthy step by `_refuse_unfolded_link_states`)."""
    return [klass for klass in model.classes if klass.effect is Effect.DEGRADE
            and klass.unit not in ("spine_switch", "nvswitch_tray")]


def _told_time_ahead(loaded: LoadedScenario, states: StepStates, linked: Sequence[FailureClass],
                     down: Sequence[ClusterState], sizes: LinkStateSizes, workers: int, force: bool,
                     warning: Callable[[str], None] | None) -> None:
    """Size the states with links down ``down`` (`ahead.with_links_down` of `ahead.states_ahead`, of classes
    ``linked``; a shrunk elastic job's among them, each on its own cluster, `ahead.LinkStateSizes`) before any is
    simulated: refused, unless ``force``, where the largest one's fold passes the scale limits (the job's up-front
    refusal sized one unit down, while 96.5% of the 16,384-GPU job's states have 2-7 leaves down), naming the
    class with the most links in it; then their estimated time (`ahead.time_ahead`, each state
    `ahead.link_state_s` of its `LinkStateSizes.estimate`), refused past `ahead.MAX_AHEAD_S`
    unless ``force``, and told to ``warning`` from `ahead.LONG_AHEAD_S` on (or past the limit, forced). A trace
    (no estimate) is told nothing."""
    if not down or sizes.estimate(down[0]) is None:
        return
    largest = max(down, key=sizes.ranks)
    culprit = _class_of(largest, linked, cluster_units(states.topology))
    if not force:
        _refuse_folded_link_state(loaded, sizes.size(largest).loaded, sizes.size(largest).topology,
                                  sizes.world(largest), culprit,
                                  sizes.ranks(largest), sizes.estimate(largest),
                                  f"its largest state foreseen ({largest.describe()})")

    def state_s(state: ClusterState) -> float:
        estimate = sizes.estimate(state)
        assert estimate is not None  # a modelled step's, as the first
        return link_state_s(estimate)

    told = time_ahead(down, sizes.ranks, state_s, workers)
    assert told is not None
    replications = loaded.scenario.run.replications
    cuts = (f"fewer run.replications, a shorter run.horizon, a rarer {culprit.name} failure or effect: replace "
            f"(the job restarts without the unit), more cores (--workers)")
    if told.wall_s > MAX_AHEAD_S and not force:
        field = ("run", "replications") if told.wall_s / replications <= MAX_AHEAD_S else _class_field(loaded, culprit)
        raise loaded.error(field, f"{told.line()}, over the limit of {format_duration(MAX_AHEAD_S)}",
                           f"{cuts}; or pass --force")
    if (told.wall_s >= LONG_AHEAD_S or told.wall_s > MAX_AHEAD_S) and warning is not None:
        warning(f"{told.line()}: {cuts} cut it")


def _straggler_state_s(sizes: LinkStateSizes, healthy: ClusterState, first: bool = False) -> float:
    """The estimated CPU seconds of the step of a state of straggling GPUs alone (`LinkStateSizes.state_s` of a
    state slowing GPU 0 of the job's ``healthy`` replicas; the ``first``, building their fold), 0 where not
    sized."""
    state_s = sizes.state_s(replace(healthy, slow_gpus=((0, 2.0),)), healthy, first)
    return 0.0 if state_s is None else state_s


def _told_straggler_time(loaded: LoadedScenario, model: FailureModel, slow: Sequence[ClusterState],
                         sizes: LinkStateSizes, states: StepStates, workers: int, force: bool,
                         warning: Callable[[str], None] | None) -> None:
    """Tell the estimated time of the straggler states ``slow`` (`ahead.slow_states`) before any is simulated, as
    `_told_time_ahead` tells the states with links down: each `_straggler_state_s` (the ranks
    `LinkStateSizes.straggler_ranks`), the first here, building the fold the rest share where ``states`` has none
    yet (`StepStates.fold_built`), and the rest over ``workers`` (1: simulated as met, on one core), refused
    past `ahead.MAX_AHEAD_S` unless ``force`` (at run.replications where one replication's share fits, else at
    the first straggle class) and told to ``warning`` from `ahead.LONG_AHEAD_S` on."""
    state_s = _straggler_state_s(sizes, states.healthy)
    first_s = _straggler_state_s(sizes, states.healthy, first=not states.fold_built)
    ranks = sizes.straggler_ranks
    assert ranks is not None
    told = time_ahead(slow, lambda _state: ranks, lambda state: first_s if state == slow[0] else state_s, workers)
    assert told is not None
    told = replace(told, kind="with straggling GPUs", each=sizes.straggler_each)
    culprit = next(klass for klass in model.classes if klass.effect is Effect.STRAGGLE)
    analytic = ANALYTIC_STRAGGLERS if sizes.straggler_every_mirror else ""
    cuts = (f"fewer run.replications, a shorter run.horizon, a rarer {culprit.name} failure, {analytic}"
            f"more cores (--workers)")
    if told.wall_s > MAX_AHEAD_S and not force:
        one = told.wall_s / loaded.scenario.run.replications <= MAX_AHEAD_S
        field = ("run", "replications") if one else _class_field(loaded, culprit)
        raise loaded.error(field, f"{told.line()}, over the limit of {format_duration(MAX_AHEAD_S)}",
                           f"{cuts}; or pass --force")
    if (told.wall_s >= LONG_AHEAD_S or told.wall_s > MAX_AHEAD_S) and warning is not None:
        warning(f"{told.line()}: {cuts} cut it")


def _class_of(state: ClusterState, linked: Sequence[FailureClass], units: ClusterUnits) -> FailureClass:
    """The class of ``linked`` whose units hold the most of the links ``state`` has down (the first of those
    tied)."""
    down = set(state.links_down)
    held = [len(down.intersection(pair for unit in range(units.count(klass.unit))
                                  for pair in units.links(klass.unit, unit))) for klass in linked]
    return linked[held.index(max(held))]


def sizing_text(states: int) -> str:
    """What a job does between foreseeing its ``states`` states and simulating them: it merges those that are
    rotations of each other (`StepStates.merged`) and counts the ranks of each, to order them and estimate their
    time (the 16,384-GPU job's 19,663 states with leaves down took minutes, with the bar still at the end of
    its foresight)."""
    return f"merging the {states:,} states foreseen that are rotations of each other, sizing them"


def replication_text(replication: int, replications: int) -> str:
    """The replication a job simulates now, as its progress line names it beside the count of those done:
    'replication 135/1,000' (0-based ``replication``), with separators as that count has them."""
    return f"replication {replication + 1:,}/{replications:,}"


def _state_activity(activity: Callable[[str], None], events: JobEvents, replications: int,
                    sizes: LinkStateSizes, states: StepStates) -> Callable[[ClusterState | None], None]:
    """A `StepStates.on_simulating` that tells ``activity`` which state the replication now running (its
    ``events``' replication) simulates, by what differs in it, and, for a state with links down or straggling
    GPUs alone (the job's healthy state otherwise; the first of those builds the fold of ``states`` the later
    ones share, `StepStates.fold_built`), the CPU time its step is estimated to take
    (``sizes``: `LinkStateSizes.state_s`, as the job's up-front estimate sizes each state; a leaf state of the
    16,384-GPU job takes minutes, a straggler state of the 2,048-GPU job ~3 min), and when
    it is done. Unnumbered: states simulated ahead or cached are not heard, and job_summary.json sorts its
    states, so no count here indexes them."""

    def on_simulating(state: ClusterState | None) -> None:
        replication = replication_text(events.replication, replications)
        if state is None:
            activity(replication)
            return
        differs = state.describe() or f"{state.replicas} replicas"
        state_s = sizes.state_s(state, states.healthy, first=not states.fold_built)
        took = "" if state_s is None else f", an estimated {format_duration(state_s)} of CPU"
        activity(f"{replication}: simulating a new cluster state ({differs}){took}")

    return on_simulating


def _with_warnings(step_summary: dict, warnings: tuple[str, ...]) -> dict:
    """The healthy step's summary with the job's ``warnings`` after its own."""
    if not warnings:
        return step_summary
    return {**step_summary, "warnings": [*step_summary.get("warnings", ()), *warnings]}
