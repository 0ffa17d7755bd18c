"""`trainsim validate`: every check a run makes before the clock starts, without running it.

The step faults against the cluster, the program of every rank (folded where the run folds it, and refused
where a fold check unfolds it beyond the scale limits, as the run refuses it) and a plan of every distinct
collective (an algorithm may not support an op or a group), on a scenario already loaded and a cluster already
built (`trainsim validate` builds it through `scale.sized_topology`, which checks the layout and the run's size
first).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from simulator.collector import collector_paused
from simulator.config.locate import located
from simulator.engine.plans import PlanCache
from simulator.program.ops import CollectiveOp, ComputeOp, Op
from simulator.simulation import (
    network_settings,
    plan_cache,
    plan_workload,
    prepare_training,
    scenario_warnings,
    step_faults,
)
from simulator.topology.graph import Topology

if TYPE_CHECKING:
    from simulator.config.loader import LoadedScenario
    from simulator.reliability.elastic import ElasticSizes


@dataclass(frozen=True)
class Verdict:
    """What `validate` found in a scenario that passed its checks: the memory entries of the summary
    (``oom`` among them, empty for a communication-only workload) with its ``layout``, which names the stages
    each rank holds (`held_stages`), the layout warnings, a lower bound of the
    step time that needs no run (`step_floor`; 0 for a communication-only workload), the GPUs the step spans
    (the summary's `gpus`: a replayed trace's ranks, which may be fewer than the cluster's; None for a
    communication-only workload, which spans the cluster), run unfolded for minutes, what it simulates
    (``size``) and a replayed trace's job's sizes (``trace_sizes``)."""

    memory: Mapping[str, object]
    warnings: tuple[str, ...]
    step_floor_s: float = 0.0
    gpus: int | None = None
    size: tuple[str, ...] = ()
    """A step that runs unfolded for a minute or more: what it simulates, about how long, and why
    (`scale.unfolded_size_lines`)."""
    trace_sizes: ElasticSizes | None = None
    """A replayed trace's job's sizes as its trace tells them (`refuse_trace_step`), which `validate_job` gives in
    place of the placeholder `check_job` finds before the trace is read; None for a step without a horizon or of
    no trace."""


@collector_paused()
def validate(loaded: LoadedScenario, topology: Topology, *, force: bool = False) -> Verdict:
    """Every check a run makes before the clock starts, without running it: the scenario, the program of
    every rank (`folded_step`'s, refused unfolded beyond the scale limits unless ``force``, a replayed trace's
    beyond them once built), and a plan for
    every distinct collective (an algorithm may not support an op or a group). The cyclic garbage collector is
    paused meanwhile, as in a run (simulator/collector.py): the program's million ops are a heap that each
    full collection walks again (on the SC21 1T row, 64 stages x 512 micro-batches, 5.76 -> 4.45 s of CPU,
    means of two runs each)."""
    from simulator.config.traces import TraceWorkload
    from simulator.scale import refuse_unfolded, unfolded_size_lines
    from simulator.workload.comm_program import build_comm_program

    settings = network_settings(loaded, topology)
    faults = step_faults(loaded, topology)
    workload = loaded.scenario.workload
    if loaded.scenario.model is None and isinstance(workload, list):
        items = workload
        plans = plan_cache(topology, settings)
        ops = located(loaded, lambda: build_comm_program(items, topology.num_gpus))
        located(loaded, lambda: plan_workload(items, ops, plans))
        return Verdict({}, scenario_warnings(loaded, topology))
    guard = None if force else partial(refuse_unfolded, loaded, topology.num_gpus, topology=topology)
    prepared = prepare_training(loaded, topology, faults, guard)
    program = prepared.step.program
    shrinking: tuple[str, ...] = ()
    trace_sizes = None
    if isinstance(workload, TraceWorkload):  # the job modules imported for a trace only: a plain step's
        from simulator.reliability.simulate import one_size_warning_of, refuse_trace_step  # validate loads none

        trace_sizes = refuse_trace_step(loaded, topology, program, force=force)
        shrinking = one_size_warning_of(loaded, topology, program)
    located(loaded, lambda: plan_every_collective(prepared.step.shapes.firsts, prepared.plans))
    layout = {"layout": program.details["layout"]} if "layout" in program.details and program.memory else {}
    return Verdict({**program.memory, **layout}, (*scenario_warnings(loaded, topology), *program.warnings,
                                                        *shrinking),
                   step_floor(program.ops, set(prepared.step.slowdowns)), program.world,
                   unfolded_size_lines(loaded, topology.num_gpus, prepared.step, topology), trace_sizes)


def unbuilt_step_text(loaded: LoadedScenario) -> str:
    """The memory line `validate` prints (`memory_line`) for the step of ``loaded`` planned on its cluster's
    parameters, not built (`UnbuiltCluster`), followed by the layout warnings `validate` gives on the built
    cluster (workload/training.py `layout_warnings`: a TP group across NVLink domains, HSDP sharding nothing),
    each '; warning: FIELD: problem': what `validate`'s refusal past scale.MAX_GPUS, before any cluster is built,
    ends with. '' where the parameters do not tell the cluster (a graph) or the step models no memory (parameter
    servers, a trace, a workload list, synthetic costs)."""
    from pathlib import Path

    from simulator.console.report import memory_line
    from simulator.topology.loader import scenario_source_or_none
    from simulator.topology.size import unbuilt_cluster
    from simulator.workload.memory_plan import layout_summary, step_memory
    from simulator.workload.training import build_training_step

    scenario = loaded.scenario
    if scenario.model is None or scenario.uses_parameter_servers:
        return ""
    source = scenario_source_or_none(loaded)  # None: the build reports why, located
    cluster = unbuilt_cluster(source) if source is not None else None
    if cluster is None:
        return ""
    folder = Path(loaded.source).parent
    step = located(loaded, lambda: build_training_step(scenario, cluster, folder))
    line = memory_line({**step_memory(scenario, step), "layout": layout_summary(step, scenario.parallelism.fsdp)})
    return "".join([line, *(f"; warning: {'.'.join(map(str, field))}: {problem}"
                            for field, problem in step.warnings)])


def step_floor(ops: Sequence[Op], slowed: Collection[int]) -> float:
    """A lower bound of the step time without running it: the most kernel time one stream of one GPU holds. A
    stream runs its ops one after another and the engine never runs a kernel in less than its nominal time
    (SM contention only stretches it), except on a GPU a fault slows by a factor that may be below 1: the
    ``slowed`` ranks are left out."""
    busy: dict[tuple[int, str], float] = defaultdict(float)
    for op in ops:
        if isinstance(op, ComputeOp) and op.rank not in slowed:
            busy[op.rank, op.stream] += op.duration
    return max(busy.values(), default=0.0)


def plan_every_collective(firsts: Sequence[CollectiveOp], plans: PlanCache) -> None:
    """Plan each distinct collective once, so unsupported algorithm choices surface, located in the scenario,
    before a run (an error raised inside the SimPy run would lose its field). ``firsts``: the first op of each
    collective shape (`CollectiveShapes.firsts`, in program order); a plan depends on nothing else, so the first
    that fails is the program's first collective that would."""
    for op in firsts:
        plans.phases(op, op.group)
