"""One run of a scenario: build the cluster, turn the workload into per-rank ops, execute them, summarise.

This is the single path behind `trainsim run` and `simulator.simulate`; the collective benchmark reuses it
through `run_ops`. The scenario schema, the workload builders, the step faults and the metrics (pydantic,
pandas) are imported where a run needs them, so that `trainsim collective` starts without them.
"""

from __future__ import annotations

import warnings as python_warnings
from array import array
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from itertools import repeat
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import numpy as np
import simpy

from simulator.collectives.chunking import ChunkSetting
from simulator.collectives.execute import PlanRunner, run_plan, run_plans
from simulator.collectives.names import AlgorithmChoice, ProtocolChoice
from simulator.collector import collector_paused
from simulator.config.locate import located
from simulator.engine.contention import Contention, NcclChannels
from simulator.engine.engine import Engine, EngineResult
from simulator.engine.faults import compute_hook
from simulator.engine.lockstep import Lockstep, LockstepWatch, OutOfStep, copies_apart, lockstep
from simulator.engine.ordering import ProgramOrder
from simulator.engine.plans import PlanCache, auto_choices, traffic_correction
from simulator.engine.replicas import replica_quotient
from simulator.engine.shapes import CollectiveShapes
from simulator.engine.sharing import Mirrors, Sharing, kept_mirrors, private_collectives
from simulator.engine.stepping import run_all, run_until
from simulator.errors import ScenarioError
from simulator.metrics.collectives import collective_table
from simulator.metrics.events import EventLog, FlowBlock, FlowRoutes
from simulator.network.calibration import resolve_efficiency
from simulator.network.isolated import is_large, run_isolated
from simulator.network.model import Network, effective_capacity
from simulator.network.modes import NetworkMode
from simulator.parallel.folding import cp_lanes, ranks_stood_for
from simulator.program.contention import SmShare
from simulator.program.ops import COMM_CATEGORIES, CollectiveOp, Op
from simulator.program.step import StepProgram
from simulator.topology.graph import Topology
from simulator.topology.loader import scenario_topology

if TYPE_CHECKING:
    import pandas as pd

    from simulator.collectives.phases import Phase
    from simulator.config.loader import LoadedScenario
    from simulator.config.schema import CollectiveItem
    from simulator.config.yaml_source import FieldPath
    from simulator.engine.faults import FaultHooks
    from simulator.engine.fold_policy import Deferred, FoldedStep, GivenUp, StepBuilder
    from simulator.faults.step import Slowdown, StepFaultPlan
    from simulator.parallel.folding import RankClasses
    from simulator.parallel.layout import Layout
    from simulator.program.unfolding import RefoldBudget, UnfoldingGuard

Progress = Callable[[int, int], None]
"""Called with (ops done, ops in total) while a run executes."""


@dataclass(frozen=True)
class Result:
    """A finished run: the summary (what summary.json holds), the cluster it ran on and the event log; the
    timeline is made of the log on first use."""

    summary: dict
    topology: Topology
    log: EventLog = field(default_factory=EventLog, repr=False)

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """The log as a DataFrame, one row per op and flow (metrics/events.py), built when first asked for: the
        summary is computed from the log's columns, so a run that writes no timeline never builds one (nor
        imports pandas)."""
        return self.log.to_frame()

    @cached_property
    def flow_routes(self) -> FlowRoutes:
        """The route (directed link ids) of each flow row of the timeline, in flow-row order, as flat arrays;
        read off the log on first use, since only the trace's link tracks, reports by link and the parameter
        server's report need them (`link_tiers` reads the log's routes once per replayed block instead)."""
        return self.log.route_table()


@dataclass(frozen=True)
class NetworkSettings:
    """How transfers are costed: flow or analytic model, per-class efficiency, collective defaults."""

    mode: NetworkMode = "flow"
    efficiency: tuple[tuple[str, float], ...] = ()
    algorithm: AlgorithmChoice = "auto"
    chunk_bytes: ChunkSetting = None
    channels: int = 0
    protocol: ProtocolChoice = "auto"
    pxn: bool = True


def run_ops(topology: Topology, ops: Sequence[Op], settings: NetworkSettings,
            async_streams: frozenset[str] = frozenset(), faults: FaultHooks | None = None,
            slowdowns: Mapping[int, Slowdown] | None = None, progress: Progress | None = None,
            serial_streams: frozenset[str] = frozenset(), plans: PlanCache | None = None,
            sm_share: SmShare | None = None, layout: Layout | None = None, shapes: CollectiveShapes | None = None,
            order: ProgramOrder | None = None, weights: Mapping[int, int] | None = None,
            stops: Callable[[OutOfStep], bool] | None = None,
            exchanges: Mapping[str, str] | None = None, every_mirror: bool = False
            ) -> tuple[EngineResult, Network]:
    """Execute ops on a fresh environment and network; the shared core of every run. ``sm_share`` (None: off)
    slows compute-bound kernels while communication kernels hold SMs on their GPU. ``faults`` plays link and
    GPU events (collectives are then never replayed while the network changes); ``slowdowns`` slows the compute
    of the simulated ranks it names (engine/faults.compute_hook);
    ``progress(done, total)`` is called every few thousand ops; ``plans`` is the run's plan cache when the
    caller has already planned with it (the run's settings, the same topology); ``layout`` is a folded
    program's placement, whose data-parallel replicas run as one where they are exact images of each other
    (engine/replicas.py; not under link faults or stragglers that slow some ranks of a stage and not others,
    faults/step.py `alike_in_stages`); ``shapes`` the index of ``ops``' collectives and ``order`` their
    ordering (with ``async_streams``) when the caller has made them (engine/shapes.py, engine/ordering.py: the
    analyses before the run read them); ``weights``: how many ranks each simulated rank stands for where they
    stand for unlike numbers (parallel/folding.py `rank_weights`), which the SM time lost counts. ``stops`` (None:
    run to the end) is asked at the first collective instance whose mirrors fell out of step whether the run
    stops there (engine/lockstep.py `LockstepWatch`: where its fold is then given up, flow model only); a
    watched run that ends still watching had every instance in step, by the ends the check after the run reads,
    so that check is not run again (0.2 s of the 76.1B step's place refold).
    ``exchanges`` (`StepProgram.exchanges`) names the exchange of the collectives (by key) that the analytic
    model times as one collective, each link shared among all their transfers; none of them is replayed alone
    (the flow model ignores it). ``every_mirror``: keep every mirror of a folded program, none pruned
    (`program_sharing`), so that the lockstep check compares every copy."""
    env = simpy.Environment()
    log = EventLog()
    plans = plans or plan_cache(topology, settings)
    own_plans = plans.topology is topology and plans.efficiency == dict(settings.efficiency)
    network = Network(env, topology, efficiency=dict(settings.efficiency), mode=settings.mode, log=log,
                      timings=plans.analytic if own_plans else None)
    shapes = shapes or CollectiveShapes.of(ops)
    replays = faults is None or not faults.changes_during_step
    mirrors, private = program_sharing(ops, plans, async_streams, shapes, order, replays, every_mirror)
    members = exchange_phases(ops, plans, exchanges) if exchanges and settings.mode == "analytic" else {}
    if members:
        private = private - {op.id for op in ops if isinstance(op, CollectiveOp) and op.key in members}
    copies, sharing_copies = copy_phases(plans, shapes) if settings.mode == "analytic" else ({}, frozenset())
    private = private - sharing_copies
    quotient = None
    if layout is not None and settings.mode == "flow" and (faults is None or faults.keeps_stages_alike(layout)):
        quotient, mirrors = replica_quotient(ops, layout, plans, mirrors, private, shapes=shapes)
        if quotient is not None:
            log.stand_for_orbits(quotient.representative, quotient.images)
    if faults is not None:
        faults.install(env, network)
    runner = PlanRunner(network, topology, quotient, plans.parsed if own_plans else None, members, copies)
    contention = None
    if sm_share is not None:
        cache = plans
        channels = NcclChannels(sm_share, topology, lambda op: cache.resolved_algorithm(op, op.group))
        contention = Contention(env, sm_share, channels, weights)
    checked = bool(mirrors) and settings.mode == "flow"
    lanes = None if not checked or layout is None or layout.cp == 1 else cp_lanes(layout)
    detours = faults is not None and faults.rerouter is not None
    watch = LockstepWatch(topology, stops, lanes, detours) if checked and stops is not None else None
    engine = Engine(
        env,
        plans=plans,
        run_plan=runner.run_plan,
        run_plans=runner.run_plans,
        isolated=(partial(plans.alone, settings.mode, partial(run_alone, topology, settings)) if own_plans
                  else partial(run_alone, topology, settings)),
        log=log,
        async_streams=async_streams,
        serial_streams=serial_streams,
        compute_duration=compute_hook(slowdowns or {}),
        progress=progress,
        sharing=Sharing(mirrors, private),
        contention=contention,
        watch=watch,
    )
    result = engine.run(ops)
    if checked and result.stopped_at_s is None and (watch is None or not watch.watching):
        result.lockstep = lockstep(log, ops, mirrors, topology, lanes, detours)
    return result, network


def copy_phases(plans: PlanCache, shapes: CollectiveShapes) -> tuple[dict[int, list[Phase]], frozenset[int]]:
    """Where a collective's copies (`CollectiveOp.copies`) cross a link its own plan crosses: by phase (its id;
    the collective's over its group or over any copy's), that phase of the plans over the group and over every
    copy, whose load on each link the analytic model shares the links by, as the copies meet there at once on the
    wire; and the ids of those collectives' ops, never replayed alone. The same lists whichever of the groups are
    simulated, so a run folded and one unfolded time them alike; a copy whose plan has fewer phases adds nothing
    to the later ones."""
    found: dict[int, list[Phase]] = {}
    shared: set[int] = set()
    for shape, op in enumerate(shapes.firsts):
        if not plans.copies_meet(op):
            continue
        shared.add(shape)
        groups = [plans.phases(op, group) for group in (op.group, *op.copies)]
        for index in range(max(map(len, groups))):
            column = [plan[index] for plan in groups if index < len(plan)]
            for phase in column:
                found.setdefault(id(phase), column)
    ids = frozenset(op.id for op, shape in zip(shapes.ops, shapes.shape_of) if shape in shared)
    return found, ids


def exchange_phases(ops: Sequence[Op], plans: PlanCache, exchanges: Mapping[str, str]) -> dict[str, list[Phase]]:
    """By collective key, the phases of every collective of the exchange ``exchanges`` puts it in, each
    collective counted once however many members post it: one list per exchange, exchanges of the same phases
    (a parameter server's iterations) one list, whose load the plan runner works out once."""
    phases: dict[str, list[Phase]] = {}
    seen: set[str] = set()
    for op in ops:
        if isinstance(op, CollectiveOp) and op.key in exchanges and op.key not in seen:
            seen.add(op.key)
            phases.setdefault(exchanges[op.key], []).extend(plans.phases(op, op.group))
    alike: dict[tuple[int, ...], list[Phase]] = {}
    shared = {name: alike.setdefault(tuple(map(id, members)), members) for name, members in phases.items()}
    return {key: shared[name] for key, name in exchanges.items() if name in shared}


_SHARING: WeakKeyDictionary[ProgramOrder, dict[tuple[PlanCache, bool, bool],
                                               tuple[Mapping[int, Mirrors], array[int]]]] = WeakKeyDictionary()


def program_sharing(ops: Sequence[Op], plans: PlanCache, async_streams: frozenset[str], shapes: CollectiveShapes,
                    order: ProgramOrder | None, replays: bool, every_mirror: bool = False
                    ) -> tuple[Mapping[int, Mirrors], frozenset[int]]:
    """The mirrors each collective of ``ops`` keeps (`kept_mirrors`; all of them with ``every_mirror``, where the
    lockstep check after the run must compare every copy: `fold_policy.FoldedStep.every_mirror`) and, where the
    run replays collectives
    (``replays``: no link event changes the network), those that run alone on their links
    (`private_collectives`). Neither reads a duration or a slowdown, only the program, its ordering and the
    plans' links, so runs of one ``order`` (one per program) on one plan cache share one analysis: a job's
    straggler states each run the same fold with other slowdowns (`fold_policy.refaulted`), and each spent
    0.4 s of its 2.8 s on the 16,384-GPU job redoing it. The mirrors come read-only: every run of the order
    gets the same mapping. The private ids are kept as an array (8 B an id) and each later run gets a set made
    from it: the set's table, kept as long as the order (through the run's summary), raised the peak RSS of the
    1,024-GPU 70B unfolded step (1.65 M private ids) by ~65 MiB."""
    known = _SHARING.setdefault(order, {}) if order is not None else {}
    found = known.get((plans, replays, every_mirror))
    if found is not None:
        mirrors, ids = found
        return mirrors, frozenset(ids)
    mirrors = MappingProxyType({op.id: op.mirrors for op in shapes.ops if op.mirrors} if every_mirror
                               else kept_mirrors(ops, plans, shapes))
    private = (private_collectives(ops, plans.links, async_streams, mirrors, plans.mirror_links, shapes=shapes,
                                   order=order, timed_apart=partial(copies_apart, plans))
               if replays else frozenset())
    known[(plans, replays, every_mirror)] = mirrors, array("q", private)
    return mirrors, private


def plan_cache(topology: Topology, settings: NetworkSettings) -> PlanCache:
    """The run's one cache of collective plans, with the scenario's collective defaults and link efficiencies."""
    return PlanCache(topology, algorithm=settings.algorithm, chunk_bytes=settings.chunk_bytes,
                     channels=settings.channels, efficiency=dict(settings.efficiency), protocol=settings.protocol,
                     pxn=settings.pxn)


def run_alone(topology: Topology, settings: NetworkSettings, phases) -> tuple[float, FlowBlock]:
    """Run a plan on an otherwise idle network: its duration and its flow rows, times relative to the plan's
    start. Plans with a large phase run in the array form of the flow model (network/isolated.py, the same
    times to the last bit)."""
    if settings.mode == "flow" and is_large(phases):
        alone = run_isolated(topology, effective_capacity(topology, dict(settings.efficiency)), phases)
        return alone.duration_s, alone.rows
    env = simpy.Environment()
    log = EventLog()
    network = Network(env, topology, efficiency=dict(settings.efficiency), mode=settings.mode, log=log)
    env.process(run_plan(env, network, topology, phases, ""))
    run_all(env)
    c = log.flow_columns()
    return env.now, FlowBlock.of(c["src"], c["dst"], c["start_s"], c["end_s"], c["bytes"], log.route_table())


def alone_seconds(topology: Topology, settings: NetworkSettings, phases: list[Phase]) -> float:
    """Seconds the plan ``phases`` takes on an otherwise idle network: `run_alone`'s duration to the last bit,
    without its flow rows (the event-by-event network logs nothing: the layout search times thousands of
    collectives and reads only their durations; `together_ends` times plans that overlap)."""
    if settings.mode == "flow" and is_large(phases):
        return run_isolated(topology, effective_capacity(topology, dict(settings.efficiency)), phases).duration_s
    env = simpy.Environment()
    network = Network(env, topology, efficiency=dict(settings.efficiency), mode=settings.mode)
    env.process(run_plans(env, network, topology, [phases], ""))
    run_all(env)
    return env.now


def together_ends(topology: Topology, settings: NetworkSettings, plans: list[list[Phase]]) -> tuple[float, ...]:
    """When each of ``plans``, started together on an otherwise idle network, ends (seconds after the start),
    as the engine runs collectives that overlap on different streams: the layout search charges the SMs of a
    collective that shares its links for as long as it runs."""
    env = simpy.Environment()
    network = Network(env, topology, efficiency=dict(settings.efficiency), mode=settings.mode)
    ends = [0.0] * len(plans)

    def run(index: int, phases: list[Phase]):
        yield env.process(run_plan(env, network, topology, phases, ""))
        ends[index] = env.now

    for index, phases in enumerate(plans):
        env.process(run(index, phases))
    run_all(env)
    return tuple(ends)


def chain_ends(topology: Topology, settings: NetworkSettings, running: list[list[Phase]],
               chain: list[tuple[float, list[Phase]]]) -> tuple[float, ...]:
    """When each plan of ``chain`` ends (seconds after the start), run one after another on one stream, each
    ``wait`` seconds (its pair's first) after the one before it ended (the first after the start), while the
    plans ``running`` start together at the start, on an otherwise idle network: a compute stream's blocking
    collectives between its kernels beside the collectives of another stream, for the layout search."""
    env = simpy.Environment()
    network = Network(env, topology, efficiency=dict(settings.efficiency), mode=settings.mode)
    ends: list[float] = []

    def stream():
        for wait, phases in chain:
            if wait > 0:
                yield env.timeout(wait)
            yield env.process(run_plan(env, network, topology, phases, ""))
            ends.append(env.now)

    for phases in running:
        env.process(run_plan(env, network, topology, phases, ""))
    run_until(env, env.process(stream()))  # what runs beside the chain after it ended changes none of its ends
    if len(ends) != len(chain):
        raise RuntimeError(f"a chain of {len(chain)} plans stalled after {len(ends)}: nothing left to run")
    return tuple(ends)


def network_settings(loaded: LoadedScenario, topology: Topology) -> NetworkSettings:
    """The scenario's network and collective settings, its link efficiencies resolved for ``topology``'s GPU
    model."""
    scenario = loaded.scenario
    efficiency = located(loaded, lambda: resolve_efficiency(scenario.network.efficiency, topology.gpu_model))
    return NetworkSettings(mode=scenario.network.model, efficiency=tuple(sorted(efficiency.items())),
                           algorithm=scenario.collectives.algorithm, chunk_bytes=scenario.collectives.chunk,
                           channels=scenario.collectives.channels, protocol=scenario.collectives.protocol,
                           pxn=scenario.network.pxn)


def plan_workload(items: list[CollectiveItem], ops: Sequence[CollectiveOp], plans: PlanCache) -> None:
    """`plan_every_collective` for a workload list: an algorithm or protocol an item names itself that cannot run
    its collective is that item's error (`workload[i].algorithm`, `workload[i].protocol`), not the run
    default's."""
    from simulator.workload.comm_program import item_names

    index_of = {name: index for index, name in enumerate(item_names(items))}
    for op in ops:
        try:
            plans.phases(op, op.group)
        except ScenarioError as exc:
            own = {"collectives.algorithm": op.algorithm, "collectives.protocol": op.protocol}.get(exc.field, "auto")
            if own == "auto":
                raise
            raise ScenarioError(exc.problem, field=f"workload[{index_of[op.name]}].{exc.field.split('.')[1]}",
                                allowed=exc.allowed) from None


def step_program(loaded: LoadedScenario, topology: Topology, *, fold: bool,
                 guard: UnfoldingGuard | None = None, classes: RankClasses | None = None) -> StepProgram:
    """The scenario's step program from its workload source (a trace, or the transformer model), with
    configuration errors located in the scenario's file (errors inside a trace name the trace's file).
    ``guard`` hears why the transformer's plan, or a replicated trace's copies, unfold a step asked to fold
    before it is built unfolded;
    ``classes``: the ranks of a stage the transformer's folded step simulates apart (engine/rank_classes.py,
    which classes only the layout's representatives, never a trace's ranks; or its CP lanes,
    parallel/folding.py `lane_classes`). The scenario's own warnings are not the step's (`scenario_warnings`)."""
    from simulator.config.traces import TraceWorkload

    base_dir = Path(loaded.source).parent
    workload = loaded.scenario.workload
    if loaded.scenario.uses_parameter_servers:
        from simulator.parameter_server.program import ps_program

        return located(loaded, lambda: ps_program(loaded.scenario, topology))
    if isinstance(workload, TraceWorkload):
        from simulator.workload.traces.program import read_traces, trace_program

        return located(loaded, lambda: trace_program(workload, read_traces(workload, base_dir), topology,
                                                     fold=fold, guard=guard))
    from simulator.recompute_check import full_recompute_warning, selective_recompute_warning
    from simulator.workload.transformer_program import transformer_program

    program = located(loaded, lambda: transformer_program(loaded.scenario, topology, base_dir, fold=fold,
                                                          guard=guard, classes=classes))
    recompute = (selective_recompute_warning(loaded, program),
                 full_recompute_warning(loaded, program, topology, base_dir))
    layout = tuple(located_layout_warning(loaded, field, problem) for field, problem in program.layout_warnings)
    return replace(program, warnings=(*program.warnings, *layout,
                                      *(warning for warning in recompute if warning is not None)))


LAYOUT_WARNING_READS: dict[FieldPath, tuple[FieldPath, ...]] = {
    ("parallelism", "tp"): (("parallelism", "order"),), ("parallelism", "fsdp"): (("parallelism", "order"),)}
"""The fields of the layout warnings the step's plan gives (workload/training.py `layout_warnings`), each with
the fields whose values make it too: the placement order puts a TP group across NVLink domains as much as its
degree does."""


def located_layout_warning(loaded: LoadedScenario, field: FieldPath, problem: str) -> str:
    """A layout warning (``field``, ``problem``) located as the scenario's errors are: at its field's line or
    override, naming the overrides of the fields it reads (`--set parallelism.order=[dp, pp, cp, tp]`, where
    before it read `parallelism.tp: ...` with no location and no word of the order that spread the group)."""
    return str(loaded.error(field, problem, reads=LAYOUT_WARNING_READS.get(field, ())))


def scenario_warnings(loaded: LoadedScenario, topology: Topology) -> tuple[str, ...]:
    """The warnings of the scenario's sections rather than of its step: the fields a run without a horizon
    ignores, those a synthetic model or parameter servers cannot be changed by, a routing skew under uniform
    routing, fields a replayed trace ignores, MoE layouts and pipelined DeepSpeed sharding no framework trains
    (`moe_layouts_no_framework_trains`, `pipelined_deepspeed_no_framework_trains`), a GPU changed without the
    NVLink bandwidth or NVLink SHARP that go with it (`kept_node_warning`), a `zero: 2` that runs as ZeRO-1
    (`zero2_as_zero1_warning`), parameter servers whose workers drift apart under the analytic model
    (`analytic_drifting_pushes_warning`), a `--set` of the micro-batches that changes the file's global batch, an
    interleaved schedule on one chunk and a pipeline of fewer micro-batches than stages (scenario_checks.py).
    Each command gives them once: every step program carried the NVLink SHARP one, a job's each cluster state's
    too, and a job's healthy step cached from another file with the same step sections named that file's line."""
    from simulator.scenario_checks import (
        batch_override_warning,
        interleaved_one_chunk_warning,
        unfilled_pipeline_warning,
    )
    from simulator.topology.loader import kept_node_warning

    gpus = topology.num_gpus
    found = (kept_node_warning(loaded, topology), zero2_as_zero1_warning(loaded, gpus),
             batch_override_warning(loaded, gpus, topology), interleaved_one_chunk_warning(loaded, gpus),
             unfilled_pipeline_warning(loaded, gpus),
             analytic_drifting_pushes_warning(loaded), analytic_shared_nic_warning(loaded, topology))
    return (*loaded.ignored_without_a_horizon(), *loaded.ignored_by_a_synthetic_model(),
            *loaded.ignored_by_parameter_servers(), *loaded.ignored_by_uniform_routing(),
            *loaded.ignored_by_a_trace(),
            *loaded.moe_layouts_no_framework_trains(),
            *loaded.pipelined_deepspeed_no_framework_trains(),
            *(warning for warning in found if warning is not None))


def analytic_drifting_pushes_warning(loaded: LoadedScenario) -> str | None:
    """The located warning for parameter servers under `network.model: analytic` whose workers drift apart
    (`ps.mode` async or ssp, a straggler, drawn iteration slowdowns): the model times every push of an iteration as
    if all workers pushed at once, where the flow model lets a late push have the links the early ones left (the
    bundled scenario under async: 428.1 ms against 210.2 ms an exchange); None otherwise."""
    scenario = loaded.scenario
    ps = scenario.ps
    if scenario.network.model != "analytic" or ps is None:
        return None
    drifts = [f"mode {ps.mode}"] if ps.mode != "sync" else []
    drifts += ["stragglers"] if scenario.faults.step.stragglers else []
    drifts += ["iteration_slowdown"] if ps.iteration_slowdown is not None else []
    if not drifts:
        return None
    return str(loaded.error(
        ("network", "model"),
        f"analytic times each parameter-server iteration's pushes (and pulls) as if every worker sent at once, "
        f"where {', '.join(drifts)} let the workers drift apart: its exchange times are pessimistic",
        "network.model: flow, which lets a late push have the links the early ones left",
        reads=(("ps", "mode"), ("ps", "iteration_slowdown"), ("faults", "step"))))


def analytic_shared_nic_warning(loaded: LoadedScenario, topology: Topology) -> str | None:
    """The located warning for a training step under `network.model: analytic` where a host's groups of one kind
    (DP x CP, CP, EP) from more pipeline stages than the host has NICs leave it: analytic shares a link among the
    copies of one collective (`CollectiveOp.copies`, one stage's groups), not among different stages'
    collectives, so those share a NIC uncounted (tp 1, pp 8, dp 2 on two one-NIC DGX H100 hosts: comm_s.dp 64.5 ms
    against the flow model's 309.3 ms); None otherwise."""
    from simulator.workload.training import pipeline_depth, resolve_layout

    scenario = loaded.scenario
    if (scenario.network.model != "analytic" or scenario.model is None or scenario.ps is not None
            or not isinstance(scenario.workload, list)):
        return None
    layout = resolve_layout(scenario, topology.num_gpus, pipeline_depth(scenario))
    shared = _most_stages_per_nic(layout, scenario.parallelism.ep, topology)
    if shared is None:
        return None
    kind, stages, host, nics = shared
    per_nic = -(-stages // nics)
    return str(loaded.error(
        ("network", "model"),
        f"analytic shares a link among the copies of one collective (one pipeline stage's groups) but not among "
        f"different stages' collectives, and host {host}'s {kind} groups of {stages} pipeline stages leave it "
        f"through {nics} NIC{'s' if nics > 1 else ''}: up to {per_nic} stages' collectives share a NIC uncounted, "
        f"so the analytic figures may overstate its rate by up to {per_nic}x",
        "network.model: flow, which shares each NIC among all the traffic that crosses it",
        reads=(("parallelism",), ("cluster",))))


def _most_stages_per_nic(layout: Layout, ep: int, topology: Topology) -> tuple[str, int, int, int] | None:
    """Where one NIC carries groups of one kind from the most pipeline stages (the stages of a host's groups that
    leave its NVLink domain, over its NICs, rounded up), if more than 1: the kind, those stages, the host and its
    NICs; else None."""
    from simulator.parallel.experts import expert_group_numbers

    ranks = np.arange(layout.world, dtype=np.int64)
    coords = {dim: (ranks // layout.stride(dim)) % layout.degree(dim) for dim in ("cp", "pp", "dp")}
    kinds = {"DP": ranks - coords["dp"] * layout.stride("dp") - coords["cp"] * layout.stride("cp"),
             "CP": ranks - coords["cp"] * layout.stride("cp")}
    if ep > 1:
        kinds["EP"] = expert_group_numbers(layout, ep)[0]
    domain = topology.gpu_domain_array[:layout.world]
    host = np.array(topology.gpu_host[:layout.world], dtype=np.int64)
    nics_of = Counter(h for h, nic in {(h, nic) for h, gpu, nic in zip(topology.gpu_host, topology.gpus,
                                                                        topology.gpu_nic) if nic != gpu})
    worst: tuple[str, int, int, int] | None = None
    for kind, group in kinds.items():
        spans = np.zeros(int(group.max()) + 1, dtype=bool)
        pairs = np.unique(np.stack([group, domain], axis=1), axis=0)
        counts = np.bincount(pairs[:, 0])
        spans[:len(counts)] = counts > 1
        leaving = np.unique(np.stack([host, coords["pp"]], axis=1)[spans[group]], axis=0)
        for h, stages in zip(*np.unique(leaving[:, 0], return_counts=True)) if len(leaving) else ():
            nics = nics_of[int(h)]
            if nics and stages > nics and (worst is None or -(-stages // nics) > -(-worst[1] // worst[3])):
                worst = (kind, int(stages), int(h), nics)
    return worst


def zero2_as_zero1_warning(loaded: LoadedScenario, gpus: int) -> str | None:
    """The located warning for `zero: 2` with `ddp.reduce_every_microbatch` left out on a step of several
    micro-batches (on ``gpus`` GPUs; called once the step is built, so its layout resolves): the default
    accumulates the whole gradient and reduce-scatters it once after the last micro-batch (Megatron-LM's
    distributed optimizer, which has no stage 2 of its own), so the step holds, sends and takes exactly what
    `zero: 1` does, which a user asking for ZeRO-2 does not expect; None otherwise. Under pipelining it names
    FSDP's shard_grad_op for ZeRO-2, not DeepSpeed's, which refuses pipelining."""
    from simulator.workload.training import microbatch_count, pipeline_depth, resolve_layout

    scenario = loaded.scenario
    parallelism = scenario.parallelism
    if (parallelism.zero != 2 or parallelism.ddp.reduce_every_microbatch is not None or scenario.model is None
            or not isinstance(scenario.workload, list)):
        return None
    layout = resolve_layout(scenario, gpus, pipeline_depth(scenario))
    if microbatch_count(scenario, layout.dp) == 1:
        return None
    zero2 = ("fsdp: shard_grad_op with parallelism.ddp.reduce_every_microbatch: true for ZeRO-2 under pipelining "
             "(Llama 3's own runtime; DeepSpeed's ZeRO-2 refuses pipelining)" if layout.pp > 1 else
             "parallelism.ddp.reduce_every_microbatch: true for DeepSpeed's ZeRO-2 (each micro-batch's gradients "
             "reduce-scattered, only the shard kept)")
    return str(loaded.error(
        ("parallelism", "zero"),
        "zero: 2 with ddp.reduce_every_microbatch left out accumulates whole gradients and reduce-scatters them "
        "once per step (Megatron-LM's distributed optimizer), so it holds ZeRO-1's memory and sends its traffic",
        f"{zero2}, or zero: 1 for the same step"))


def step_faults(loaded: LoadedScenario, topology: Topology) -> StepFaultPlan:
    """`faults.step` checked against the cluster and resolved (errors located in the scenario)."""
    from simulator.faults.step import resolve_step_faults

    scenario = loaded.scenario
    return located(loaded, lambda: resolve_step_faults(scenario.faults.step, topology, scenario.run.seed))


def run_step(program: StepProgram, topology: Topology, settings: NetworkSettings, faults: FaultHooks | None = None,
             slowdowns: Mapping[int, Slowdown] | None = None, progress: Progress | None = None,
             plans: PlanCache | None = None, shapes: CollectiveShapes | None = None,
             order: ProgramOrder | None = None, weights: Mapping[int, int] | None = None,
             stops: Callable[[OutOfStep], bool] | None = None, every_mirror: bool = False
             ) -> tuple[dict | None, EventLog, Lockstep]:
    """Execute a step program and summarise it: the metrics see only the program and the log's columns (the
    log comes back for the timeline and the flows' routes, with whether a folded run's mirrors kept pace with
    their groups: engine/lockstep.py); no summary (None) where ``stops`` stopped the run at its first collective
    instance out of step (`run_ops`), whose fold is given up. The metrics are imported here, not at module
    level, so that `trainsim collective` never loads them. ``slowdowns``: each slowed rank's compute slowdown
    as the program places it (`FoldedStep.slowdowns`: onto the representatives when folded); ``shapes``: the
    index of the program's collectives, and ``order`` its ordering, when the caller has them; ``weights``: how
    many ranks each simulated rank stands for, where a program folded by classes of unequal size simulates them
    (`FoldedStep.weights`), which the per-GPU figures weigh them by (None: the plain mean); ``every_mirror``:
    no mirror pruned (`FoldedStep.every_mirror`)."""
    from simulator.metrics.step import StepRows
    from simulator.metrics.summary import sm_contention_summary, training_summary

    plans = plans or plan_cache(topology, settings)
    ops = list(program.ops)
    shapes = shapes or CollectiveShapes.of(ops)
    order = order or ProgramOrder(ops, program.async_streams)
    result, network = run_ops(topology, ops, settings, async_streams=program.async_streams,
                              faults=faults, slowdowns=slowdowns, progress=progress,
                              serial_streams=program.serial_streams, plans=plans, sm_share=program.sm_share,
                              layout=program.layout if program.folded else None, shapes=shapes, order=order,
                              weights=weights, stops=stops, exchanges=program.exchanges, every_mirror=every_mirror)
    if result.stopped_at_s is not None:
        return None, result.log, result.lockstep
    contention = (sm_contention_summary(result.sm_lost_s, ranks_stood_for(program.ranks, weights))
                  if program.sm_share is not None else None)
    summary = training_summary(StepRows.of(result.log, weights), step_time_s=result.makespan_s, gpus=program.world,
                               simulated=program.ranks, tokens_per_step=program.tokens_per_step,
                               model_flops_per_step=program.model_flops_per_step, peak_flops=program.peak_flops,
                               nominal_model_flops_per_step=program.nominal_model_flops_per_step,
                               training_ranks=program.training_ranks,
                               span="run" if program.parameter_server is not None else "step",
                               traced="trace" in program.details,
                               routing_skew_s=_routing_skew_s(program.details),
                               cp_imbalance_s=_cp_imbalance_s(program.details),
                               sm_contention_s=None if contention is None else contention["total_compute_slowdown_s"],
                               memory=dict(program.memory), memory_bound_share=program.memory_bound_share,
                               pipelined=program.pipelined, schedule=program.schedule,
                               pipeline_stages=program.layout.pp if program.layout is not None else 1,
                               stages=None if program.layout is None
                               else {rank: program.layout.coords(rank)["pp"] for rank in program.ranks},
                               replicas=None if program.layout is None
                               else {rank: program.layout.coords(rank)["dp"] for rank in program.ranks},
                               traffic_correction=traffic_correction(ops, plans, shapes, weights))
    summary.update(topology=topology.name, gpu_model=topology.gpu_model, gpus=program.world, **program.details,
                   ops_executed=result.ops_executed,
                   flows_simulated=int(network.flows_simulated + result.replayed_flows), folded=program.folded,
                   simulated_ranks=len(program.ranks), warnings=list(program.warnings))
    skipped = order.skipped_when_asked
    if skipped is not None:
        summary["ordering_skipped"] = skipped.summary()
        summary["warnings"].append(skipped.warning())
    if result.log.flow_images > 1 and program.layout is not None:
        summary["replica_quotient"] = {"replicas": program.layout.dp,
                                       "replicas_sent": program.layout.dp // result.log.flow_images}
    if weights is not None:
        summary["rank_weights"] = {str(rank): weight for rank, weight in sorted(weights.items())}
    if contention is not None:
        summary["sm_contention"] = contention
    choices = auto_choices(shapes, plans)
    if choices:
        summary["auto_choices"] = choices
    return summary, result.log, result.lockstep


def link_tiers_entry(result: Result, settings: NetworkSettings, makespan_s: float, faults: FaultHooks) -> dict:
    """The run's `link_tiers` entry (metrics/link_tiers.py): each link tier's busiest link, over every flow and
    over each kind of communication's, read off the log's flows and their routes (a replayed block's once), each
    flow's kind its collective's category, looked up once per distinct key; `approximate_because` says why its
    figures are not exact where the step's link faults make them so (`approximation`), else null."""
    from simulator.metrics.link_tiers import step_link_tiers

    topology = result.topology
    ops = result.log.op_columns(("key", "category"))
    names = ["", *sorted(COMM_CATEGORIES)]
    comm = np.isin(ops["category"], names[1:])
    code_of = {category: code for code, category in enumerate(names)}
    kind_of = dict(zip(ops["key"][comm].tolist(), map(code_of.__getitem__, ops["category"][comm].tolist())))
    parts = result.log.flow_parts()
    kind_of_key = np.fromiter(map(kind_of.get, parts.keys, repeat(0)), dtype=np.int64, count=len(parts.keys))
    line_rate = np.asarray(topology.line_rate, dtype=float)
    usable = effective_capacity(topology, dict(settings.efficiency)) / line_rate
    entry = step_link_tiers(parts, kind_of_key, names, topology, makespan_s, usable)
    return {**entry, "approximate_because": approximation(faults)}


def approximation(faults: FaultHooks) -> str | None:
    """Why a step's `link_tiers` are approximate, None where they are exact: a flow rerouted around a link that
    went down keeps one row, with its detour's route and all its bytes, so the links it left and those it took
    are credited wrongly; a link whose capacity changes during the step has no one usable fraction. Links
    degraded for the whole step are exact: the topology is built degraded, and its usable fractions say so."""
    rerouted = faults.rerouter.rerouted if faults.rerouter is not None else 0
    if rerouted:
        return (f"{rerouted} routes took a detour around links down: a rerouted flow's bytes all count on its "
                "detour")
    if faults.changes_during_step:
        return "link capacities change during the step, which a link's one usable fraction does not follow"
    return None


def _routing_skew_s(details: Mapping[str, object]) -> float | None:
    """What a MoE step's routing skew adds to every rank's step (its `moe` entry's `hottest_rank_adds_s`), None
    for a step without experts."""
    moe = details.get("moe")
    return float(moe["hottest_rank_adds_s"]) if isinstance(moe, Mapping) else None


def _cp_imbalance_s(details: Mapping[str, object]) -> float | None:
    """What the slowest CP rank's causal attention adds to every rank's step (its `cp_imbalance` entry's
    `slowest_rank_adds_s`), None for a step whose CP ranks' work is even."""
    imbalance = details.get("cp_imbalance")
    return float(imbalance["slowest_rank_adds_s"]) if isinstance(imbalance, Mapping) else None


@dataclass(frozen=True)
class PreparedStep:
    """A training step built, not yet run: the run's network settings, its one plan cache, its program folded
    where that is exact (`fold_policy.folded_step`) with the indexes the analyses share, and how it is built
    (``build(fold, classes)``; again unfolded when a folded run's mirrors fall out of step)."""

    settings: NetworkSettings
    plans: PlanCache
    step: FoldedStep
    build: StepBuilder


def prepare_training(loaded: LoadedScenario, topology: Topology, faults: StepFaultPlan,
                     guard: UnfoldingGuard | None = None) -> PreparedStep:
    """The training step (modelled or traced) of ``loaded`` under the step's ``faults``, its program folded where
    that is exact (engine/fold_policy.py), else rebuilt unfolded; ``guard`` hears why a step asked to fold is
    unfolded before it is built unfolded (scale.refuse_unfolded). The links ``faults`` degrades from the step's
    start are degraded on ``topology`` first (`faults.degrade_from_start`), so that its routes, `auto`'s choices
    and capacities are those of the cluster it runs on. Micro-batches and a global batch that disagree are
    refused first (`refuse_inconsistent_batch`)."""
    from simulator.engine.faults import degrade_from_start
    from simulator.engine.fold_policy import folded_step
    from simulator.scenario_checks import refuse_inconsistent_batch

    refuse_inconsistent_batch(loaded, topology.num_gpus, topology)
    degrade_from_start(topology, faults)
    settings = network_settings(loaded, topology)
    plans = plan_cache(topology, settings)

    def build(fold: bool, classes: RankClasses | None) -> StepProgram:
        return step_program(loaded, topology, fold=fold, guard=guard, classes=classes)

    step = located(loaded, lambda: folded_step(build, topology, plans, settings.mode, dict(settings.efficiency),
                                               faults, loaded.scenario.run.fold, guard))
    return PreparedStep(settings, plans, step, build)


@dataclass(frozen=True)
class FoldDropped:
    """A fold given up because its run fell out of step (its `fold_given_up` entry), said before the next run's
    program is built: that build takes 20 to 50 s on the 2,048-GPU Llama 3 70B step at 4:1 oversubscription,
    whose stage fold falls out of step at a hand-off."""

    given_up: dict


@dataclass(frozen=True)
class Rerun:
    """A training step simulated again after a fold given up for falling out of step (`FoldDropped`), as its
    run starts: whether it is unfolded (else refolded onto more ranks) and its size in words
    (`scale.run_size_text`). `trainsim run` prints, for that 70B step: 'note: simulating the step again
    refolded, 256 of 2,048 ranks, 774,976 ops and ~3,563,322 flows (estimated), about 2 minutes' (it simulates
    3,348,608)."""

    unfolded: bool
    size: str


RerunNotice = Callable[[FoldDropped | Rerun], None]
"""Hears of each fold given up for falling out of step before the next run is built (`FoldDropped`), and of each
run that follows it as it starts (`Rerun`)."""


def simulate_training(loaded: LoadedScenario, topology: Topology, faults: FaultHooks,
                      progress: Progress | None = None, guard: UnfoldingGuard | None = None,
                      prepared: PreparedStep | None = None, budget: RefoldBudget | None = None,
                      on_rerun: RerunNotice | None = None, link_tiers: bool = True) -> Result:
    """One training step (modelled or traced): the step ``prepared`` (`prepare_training` with ``guard`` when
    None), run under the step's faults, summarised, with its `link_tiers` and the verdict's binding tier where
    ``link_tiers`` (a job's states other than its healthy one leave them out: nothing reads them; they cost about
    1% of an 8,192-GPU step's `simulate()`). A folded run whose mirrors fell out of step with their groups
    (engine/lockstep.py) is run again unfolded, or where only pipeline hand-offs did, first with one rank per CP
    lane (`fold_policy.lane_step`) and with ranks classed by their hand-offs' routes
    (`fold_policy.route_steps`), route classes first where copies of one lane's hand-off ended apart, then by
    the meet of the two (`fold_policy.meet_step`), each the unfolded run's timeline where its own mirrors keep
    pace, at a fraction of its cost (a refold whose other collectives fell out of step unfolds it at once, as the
    first run does); where ``guard`` refuses the step unfolded and only hand-offs fell out of step, the refolds
    are tried those ``budget`` allows (`scale.refold_refusal`; None: none, as a job's states are run), and where
    none keeps pace the folded run stands with a warning. The hop refold (`fold_policy.hop_refold`: a stage
    fold whose hand-offs' copies cross other hops, known before its run, on either model) is tried within
    ``budget`` too (`simulate` gives one under --force as well: the multiple, not the limits, and so do a job's
    states). Each fold given up on the way,
    refused before its run or out of step in it, goes
    into the summary's `fold_given_up` with why (`fold_policy.GivenUp`); a folded run that stands out of step is
    not given up, and goes into `fold_not_exact` (its fold and its hand-offs' figures, in the same shape). A run
    whose fold is given up if it falls out of step (a refold's, or the first one's where ``guard`` lets the step
    unfold) stops at its first collective instance out of step (`run_ops` ``stops``), whose kind (a hand-off or
    another collective) decides what is tried next; its entry gives that instance's figures, not the whole run's.
    The DeepSeek-V3-style DualPipeV step at global batch 2048: its class fold's run stops at 2.289 of 8.087 s.
    ``on_rerun`` hears of each run that starts after a fold given up for falling out of step (`Rerun`)."""
    from simulator.engine.fold_policy import FoldedStep, fell_out_of_step, hop_refold, unfolded_step
    from simulator.program.unfolding import Unfolding

    if prepared is None:
        prepared = prepare_training(loaded, topology, faults.plan, guard)
    settings, plans, step, build = prepared.settings, prepared.plans, prepared.step, prepared.build

    pace: list[float] = []
    """The flows per op of each run so far (`EventLog.flows_per_op`)."""

    def run(step: FoldedStep, stops: Callable[[OutOfStep], bool] | None = None
            ) -> tuple[dict | None, EventLog, Lockstep]:
        ran = located(loaded, lambda: run_step(step.program, topology, settings, faults, step.slowdowns, progress,
                                               plans, step.shapes, step.order, step.weights, stops,
                                               step.every_mirror))
        pace.append(ran[1].flows_per_op())
        return ran

    dropped: list[int] = []
    """The `id` of each fold given up that ``on_rerun`` has heard of."""

    def dropping(given_up: list[GivenUp]) -> None:
        """Tell ``on_rerun`` of each fold in ``given_up`` that fell out of step and is not yet told, once, as the
        next run's program is built (`build_again`), or as that run starts (``rerun``) where no build came first."""
        for entry in given_up:
            if on_rerun is not None and entry.out_of_step is not None and id(entry) not in dropped:
                dropped.append(id(entry))
                on_rerun(FoldDropped(entry.summary()))

    def rerun(step: FoldedStep, stops: Callable[[OutOfStep], bool] | None, given_up: list[GivenUp]
              ) -> tuple[dict | None, EventLog, Lockstep]:
        """``run`` of a step that follows the folds ``given_up``, announced to ``on_rerun`` with its size, its
        flows at the rate of the run given up before it (`scale.run_size_text`)."""
        if on_rerun is not None:
            from simulator.scale import run_size_text

            dropping(given_up)
            size = run_size_text(loaded, topology.num_gpus, len(step.program.ranks), len(step.program.ops),
                                 topology, pace[-1])
            on_rerun(Rerun(step.kind is None, size))
        return run(step, stops)

    def unfolds(found: OutOfStep) -> bool:
        """Whether ``guard`` lets the step run unfolded for the first instance out of step of its folded run
        (``found``): its fold is then given up whatever the rest of the run shows, so the run stops there."""
        try:
            if guard is not None:
                guard(Unfolding("collectives", found.reason()))
        except ScenarioError:
            return False
        return True

    hop_refolded = hop_refold(build, step, plans, settings.mode, dict(settings.efficiency), faults.plan, budget)
    routes_reason = ""
    """Why the step folds by its hand-offs' routes before its run (the stage fold given up for their hops)."""
    if isinstance(hop_refolded, FoldedStep):
        step, hop_refolded = hop_refolded, None
        routes_reason = step.given_up[-1].unfolding.reason
    summary, log, kept_pace = run(step, unfolds)
    given_up = [*step.given_up, *([] if hop_refolded is None else [hop_refolded])]
    not_exact = step.not_exact
    if summary is not None and routes_reason and not_exact is None:
        summary["fold_routes_reason"] = routes_reason
    if summary is not None and not_exact is not None:
        summary["warnings"].append(f"folded step not exact: {not_exact.unfolding.reason}")
    out_of_step = kept_pace.collectives or kept_pace.hand_offs
    if out_of_step:
        unfolding = Unfolding("collectives", out_of_step)
        fell_out = fell_out_of_step(step, kept_pace)
        try:
            if guard is not None:
                guard(unfolding)
            may_unfold = True
        except ScenarioError:
            if kept_pace.collectives:
                raise
            may_unfold = False
        refolds_given_up: list[GivenUp] = []
        refolds = not kept_pace.collectives and (may_unfold or budget is not None)

        def run_refold(step: FoldedStep, stops: Callable[[OutOfStep], bool]) -> tuple[dict | None, EventLog, Lockstep]:
            """A refold's run, announced: each run of the step again says so, whether or not it may unfold."""
            return rerun(step, stops, [fell_out, *refolds_given_up])

        def build_again(fold: bool, classes: RankClasses | None) -> StepProgram:
            """``build`` of a refold or of the unfolded step, the fold last given up said first."""
            dropping([fell_out, *refolds_given_up])
            return build(fold, classes)

        refolded = _refolded(loaded, replace(prepared, step=step, build=build_again), faults.plan, run_refold,
                             kept_pace, refolds_given_up, None if may_unfold else budget,
                             step.program) if refolds else None
        if refolded is not None or may_unfold:
            given_up += [fell_out, *refolds_given_up]
            if refolded is not None:
                step, summary, log, reason_key = refolded
                summary[reason_key] = out_of_step
            else:
                step = located(loaded, lambda: unfolded_step(build_again, faults.plan, unfolding))
                summary, log, _ = rerun(step, None, [fell_out, *refolds_given_up])
        else:
            given_up += refolds_given_up
            not_exact = fell_out
            assert summary is not None, "a run stops only where its fold is given up"
            summary["warnings"].append(f"folded step not exact, and too large to simulate unfolded: {out_of_step}")
    assert summary is not None, "the run that stands ran to its end"
    program, blocker = step.program, step.off_reason
    result = Result(summary, topology, log)
    summary.update(scenario=loaded.source, seed=loaded.scenario.run.seed)
    if "trace" in program.details:
        from simulator.workload.traces.program import throughput_warnings

        summary["warnings"] += throughput_warnings(summary, program.peak_flops)
    from simulator.metrics.link_tiers import with_binding_tier

    if link_tiers:
        summary["link_tiers"] = link_tiers_entry(result, settings, summary["step_time_s"], faults)
        summary["bottleneck"] = with_binding_tier(summary["bottleneck"], summary["link_tiers"], topology)
    if program.parameter_server is not None:
        from simulator.parameter_server.summary import ps_report, with_binding_links

        plan = program.parameter_server
        healthy = scenario_topology(loaded) if faults.changes_network else topology  # links down stay down
        comparison, _ = run_ops(healthy, plan.comparison, settings)
        summary["parameter_server"] = ps_report(plan, result.timeline, result.flow_routes.tolist(), topology,
                                                summary["step_time_s"], comparison)
        summary["bottleneck"] = with_binding_links(summary["bottleneck"], summary["parameter_server"])
    if blocker:
        summary["fold_off_reason"] = blocker
    if given_up:
        summary["fold_given_up"] = [entry.summary() for entry in given_up]
    if not_exact is not None:
        summary["fold_not_exact"] = not_exact.summary()
    if not faults.plan.empty:
        from simulator.metrics.step import StepRows, last_replicas_ranks
        from simulator.metrics.summary import with_stragglers

        summary["faults"] = faults.describe()
        slowed = summary["faults"]["slowed_gpus"]
        layout, waited_for = program.layout, None
        if slowed and layout is not None and program.pipelined:
            simulated = frozenset(program.ranks)
            last = last_replicas_ranks(StepRows.of(log), {rank: layout.coords(rank)["dp"] for rank in simulated})
            waited_for = [int(gpu) for gpu in slowed
                          if _simulated_by(layout, step.classes, simulated, int(gpu)) in last]
        summary["bottleneck"] = with_stragglers(summary["bottleneck"], slowed, waited_for)
    return result


def _simulated_by(layout: Layout, classes: RankClasses | None, ranks: Collection[int], gpu: int) -> int:
    """The simulated rank whose ops stand for ``gpu``'s in a run of ``layout`` that simulates ``ranks``: ``gpu``
    where it runs, else its class's first rank of its pipeline stage (``classes``; None: one class a stage)."""
    if gpu in ranks:
        return gpu
    stage_ranks = layout.stage_ranks(layout.coords(gpu)["pp"])
    if classes is None:
        return stage_ranks[0]
    return stage_ranks[classes.firsts[classes.of_position[stage_ranks.index(gpu)]]]


def _refolded(loaded: LoadedScenario, prepared: PreparedStep, faults: StepFaultPlan,
              run: Callable[[FoldedStep, Callable[[OutOfStep], bool]], tuple[dict | None, EventLog, Lockstep]],
              kept_pace: Lockstep,
              given_up: list[GivenUp], budget: RefoldBudget | None = None, ran: StepProgram | None = None
              ) -> tuple[FoldedStep, dict, EventLog, str] | None:
    """The ``prepared`` step, whose folded run's only mirrors out of step were pipeline hand-offs (``kept_pace``,
    its lockstep report), run again with one rank per CP lane (`fold_policy.lane_step`), else with its ranks
    classed also by their hand-offs' routes (`fold_policy.route_steps`, coarsest classes first, each finer one
    where the one before fell out of step), route classes first where copies of one CP lane's hand-off ended
    apart (one rank per lane would hold them to one representative again), then by the meet of lanes and the
    last route classes that ran (`fold_policy.meet_step`), each where it applies until one whose mirrors all keep
    pace (it is then the unfolded run): the step, its summary and log, and the summary key that says why it ran;
    else None. A refold whose mirrors of other collectives than hand-offs fell out of step ends the tries (None:
    the step unfolds), the rule the first folded run follows: refolds are made for hand-offs out of step, not for
    other collectives. Each refold refused before its run (by the fold checks, or by ``budget`` where the step
    may not unfold) or out of step in it is appended to ``given_up``. A refold's run stops at its first instance
    out of step (`_given_up`), whose kind (a hand-off or another collective) then decides whether tries go on.
    A refold whose class-mates' copies of a hand-off ended apart in a run stopped there before it (the first,
    ``ran``'s, or a refold's: engine/refold_evidence.py `predicted_apart`) is deferred unbuilt
    (`fold_policy.Deferred`), the next one run first; where one keeps pace, each deferred refold that its run
    refutes (`refuted`: its class-mates' copies end apart in the unfolded run) is given up unbuilt, and the
    others are built and run in the order proposed, the first to keep pace standing (the SC21 76.1B step runs
    the stage fold and the place refold; the route classes by loads are neither built nor run). A fold stands
    only where it kept pace in its own run, so its figures are the unfolded run's; which one stands is the one
    the refolds run in order would give, except where a refold put off (deferred, or refuted unrun) would have
    ended the tries: a refuted one whose run would have stopped on a collective other than a hand-off (in order,
    the step unfolds), a deferred one that falls out of step so after a later one kept pace, or a meet of two
    deferred sides that the check refuses once built. There a fold that kept pace stands instead of the
    unfolded run, with the same figures. Each refold given up goes into ``given_up``, after what it held, in the
    order proposed."""
    from simulator.engine.fold_policy import (
        Deferred,
        GivenUp,
        fell_out_of_step,
        fold_faults,
        lane_step,
        meet_step,
        route_steps,
    )
    from simulator.engine.refold_evidence import StoppedHandOff, predicted_apart, refuted, stopped_hand_off
    from simulator.program.unfolding import Unfolding

    build, folded = prepared.build, prepared.step
    faults = fold_faults(faults, prepared.plans.topology)  # links degraded alike weighed as the first fold weighs them
    layout = folded.program.layout
    known: list[StoppedHandOff] = []
    deferred: list[tuple[str, int, Deferred]] = []
    entered = len(given_up)
    """The entries ``given_up`` held before this call, which stay first and in their order."""
    places: list[int] = []
    """The place in the order proposed of each refold this call appends to ``given_up`` (its proposal's)."""

    def give_up(entry: GivenUp | None, place: int) -> None:
        """Append ``entry`` (if any), the refold proposed ``place``-th, to ``given_up``."""
        if entry is not None:
            given_up.append(entry)
            places.append(place)

    def learn(program: StepProgram, pace: Lockstep) -> None:
        """Keep the hand-off at which ``program``'s run stopped out of step (``pace``), with its copies' ends."""
        for found in pace.apart:
            stopped = stopped_hand_off(program.ops, found)
            if stopped is not None:
                known.append(stopped)

    def defer(classes: RankClasses) -> bool:
        """Whether the refold by ``classes`` waits behind the next: the runs stopped so far predict it apart."""
        assert layout is not None, "a refold applies to a step with a layout"
        return predicted_apart(classes, layout, known)

    def settle(kept: tuple[FoldedStep, dict, EventLog, str] | None) -> tuple[FoldedStep, dict, EventLog, str] | None:
        """The first of the deferred refolds to keep pace, built and run in order, those that ``kept`` (the refold
        that kept pace after them; None: none did) refutes given up unbuilt, the tries ending at one whose other
        collectives fell out of step; else ``kept``. The entries this call appended to ``given_up`` are then put
        in the order the refolds were proposed."""
        stands = kept
        for reason_key, place, later in deferred:
            if kept is not None:
                assert layout is not None and kept[0].classes is not None, "a refold that ran is classed"
                reason = refuted(later.classes, layout, known, kept[0].classes, kept[0].program.ops, kept[2])
                if reason:
                    give_up(GivenUp(later.kind, len(later.ranks), Unfolding("ended", reason)), place)
                    continue
            step = located(loaded, later.built)
            if step is None or isinstance(step, GivenUp):
                give_up(step, place)
                continue
            summary, log, pace = run(step, _given_up)
            if not pace.apart:
                assert summary is not None, "a run that kept pace ran to its end"
                stands = step, summary, log, reason_key
                break
            give_up(fell_out_of_step(step, pace), place)
            if pace.collectives:
                break
        appended = sorted(zip(places, given_up[entered:], strict=True), key=lambda placed: placed[0])
        given_up[entered:] = [entry for _, entry in appended]
        return stands

    if ran is not None:
        learn(ran, kept_pace)
    judged = (prepared.plans, prepared.settings.mode, dict(prepared.settings.efficiency))
    tried: dict[str, FoldedStep | Deferred] = {}
    tries: list[tuple[str, Callable[[], Iterator[FoldedStep | GivenUp | Deferred | None]]]] = [
        ("fold_lanes_reason", lambda: iter([lane_step(build, folded, *judged, faults, budget, defer)])),
        ("fold_routes_reason", lambda: route_steps(build, folded, *judged, faults, budget, defer))]
    if kept_pace.hand_offs_within_lanes:
        tries.reverse()
    tries.append(("fold_meet_reason", lambda: iter([meet_step(build, folded, list(tried.values()), *judged,
                                                               faults, budget, defer)])))
    proposed = 0
    for reason_key, refolds in tries:
        for step in _each_located(loaded, located(loaded, refolds)):
            proposed += 1
            if step is None or isinstance(step, GivenUp):
                give_up(step, proposed)
                continue
            if isinstance(step, Deferred):
                deferred.append((reason_key, proposed, step))
                tried[reason_key] = step
                continue
            summary, log, refolded_pace = run(step, _given_up)
            if not refolded_pace.apart:
                assert summary is not None, "a run that kept pace ran to its end"
                return settle((step, summary, log, reason_key))
            give_up(fell_out_of_step(step, refolded_pace), proposed)
            learn(step.program, refolded_pace)
            if refolded_pace.collectives:
                return settle(None)
            tried[reason_key] = step
    return settle(None)


def _given_up(_found: OutOfStep) -> bool:
    """A refold's run stops at its first instance out of step (`run_ops` ``stops``): the refold is then given up
    whatever the rest of its run shows (`_refolded`)."""
    return True


def _each_located(loaded: LoadedScenario, items: Iterator[FoldedStep | GivenUp | Deferred | None]
                  ) -> Iterator[FoldedStep | GivenUp | Deferred | None]:
    """The ``items`` (refolds, each worked out as it is drawn), each drawn with its errors located at the
    scenario's field (config/locate.py)."""
    while True:
        try:
            item = located(loaded, partial(next, items))
        except StopIteration:
            return
        yield item


@collector_paused()
def simulate(loaded: LoadedScenario, *, force: bool = False, progress: Progress | None = None,
             on_rerun: RerunNotice | None = None) -> Result:
    """Run a loaded scenario to completion: a training step when it has a model or a trace, else its workload
    list. Runs estimated beyond the scale limits are refused unless ``force``, folded steps that a fold check
    unfolds too before they are built unfolded, and a replayed trace's step once built, before it runs;
    ``progress(done, total)`` hears of the ops executed, ``on_rerun`` of a step simulated again after its fold
    fell out of step (`FoldDropped`, `Rerun`). The cyclic garbage collector is paused meanwhile
    (simulator/collector.py). The summary's `warnings` hold every warning the run gives, the Python warning that a
    job scenario's step ignores its job (`one_step_of_a_job`) first."""
    from simulator.engine.faults import FaultHooks
    from simulator.scale import refold_refusal, refuse_large_trace, refuse_unfolded, sized_topology

    topology = sized_topology(loaded, force)
    faults = FaultHooks(topology, step_faults(loaded, topology))
    workload = loaded.scenario.workload
    if loaded.scenario.model is not None or not isinstance(workload, list):
        guard = None if force else partial(refuse_unfolded, loaded, topology.num_gpus, topology=topology)
        budget = partial(refold_refusal, loaded, topology.num_gpus, force=force, topology=topology)
        prepared = prepare_training(loaded, topology, faults.plan, guard)
        if not force:
            refuse_large_trace(loaded, topology.num_gpus, prepared.step.program)
        run = simulate_training(loaded, topology, faults, progress, guard, prepared, budget, on_rerun)
        if "parameter_server" not in run.summary:  # a parameter-server run's time spans its iterations
            run.summary["resources"] = step_resources_of(loaded, topology.gpu_model, run.summary)
    else:
        run = simulate_workload(loaded, workload, topology, faults, progress)
    job = one_step_of_a_job(loaded)
    if job is not None:  # a Python warning, and in the summary as the run's others are
        python_warnings.warn(job, UserWarning, stacklevel=3)  # the caller's line, past collector_paused
    warnings = (*([] if job is None else [job]), *scenario_warnings(loaded, topology))
    if warnings:
        run.summary["warnings"] = [*warnings, *run.summary.get("warnings", ())]
    return run


def step_resources_of(loaded: LoadedScenario, gpu_model: str, summary: dict) -> dict:
    """The step's GPU-hours, GPU energy and cost (metrics/resources.py) from its summary's step time and tokens, on
    catalog GPUs ``gpu_model``, at the scenario's `costs`."""
    from simulator.metrics.resources import Tariff, step_resources

    step_s, rate = summary["step_time_s"], summary.get("tokens_per_s")
    return step_resources(Tariff.of(loaded.scenario.costs, gpu_model), summary["gpus"], step_s,
                          rate * step_s if rate else None)


def one_step_of_a_job(loaded: LoadedScenario) -> str | None:
    """The warning of `simulate()` given a job scenario (`run.horizon`): it runs one step and ignores the
    job's horizon, failures, checkpoint and restart, where `trainsim run` runs the job; before, it said nothing."""
    if loaded.scenario.run.horizon is None:
        return None
    return str(loaded.error(("run", "horizon"), "simulate() runs one training step and ignores the job's "
                            f"horizon, failures, checkpoint and restart; {JOB_ENTRY_POINT}(loaded) runs the job, as "
                            "`trainsim run` does"))


JOB_ENTRY_POINT = "simulator.reliability.simulate.simulate_job"
"""The Python entry point of a job over `run.horizon`, as `simulate()`'s warning names it."""


def simulate_workload(loaded: LoadedScenario, workload: list[CollectiveItem], topology: Topology,
                      faults: FaultHooks, progress: Progress | None = None) -> Result:
    """A communication-only run: the scenario's workload list of collectives, with its table of them."""
    from simulator.workload.comm_program import build_comm_program


    ops = located(loaded, lambda: build_comm_program(workload, topology.num_gpus))
    settings = network_settings(loaded, topology)
    plans = plan_cache(topology, settings)
    located(loaded, lambda: plan_workload(workload, ops, plans))
    result, network = located(loaded, lambda: run_ops(topology, ops, settings, faults=faults,
                                                      slowdowns=faults.plan.slowdown_of(), progress=progress,
                                                      plans=plans))
    run = Result({}, topology, result.log)
    run.summary.update({
        "scenario": loaded.source,
        "topology": topology.name,
        "gpu_model": topology.gpu_model,
        "gpus": topology.num_gpus,
        "makespan_s": result.makespan_s,
        "collectives": collective_table(run.timeline, ops, lambda op: plans.resolved(op, op.group)),
        "ops_executed": result.ops_executed,
        "flows_simulated": int(network.flows_simulated + result.replayed_flows),
        "seed": loaded.scenario.run.seed,
    })
    choices = auto_choices(CollectiveShapes.of(ops), plans)
    if choices:
        run.summary["auto_choices"] = choices
    if not faults.plan.empty:
        run.summary["faults"] = faults.describe()
    return run
