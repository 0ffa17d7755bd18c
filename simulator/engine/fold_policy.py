"""Whether a step runs folded (one representative rank per pipeline stage) or every rank, and why not.

Folding is exact only where every replica meets what the representatives meet. Three checks, from the cheapest:
the cluster (`fold_blocker`: an explicit graph, or hosts of unequal size), the folded program's collectives
on the flow model (`engine/symmetry.py`: a mirror that would meet the links differently), and the step's
faults (`fold_with_faults`: link faults, or stragglers that do not slow a stage alike or stay in one replica
whose traffic meets no other's). A check that fails rebuilds the program unfolded and gives the reason, which
the summary reports as `fold_off_reason`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from simulator.engine.ordering import ProgramOrder
from simulator.engine.plans import PlanCache
from simulator.engine.shapes import CollectiveShapes
from simulator.engine.sharing import kept_mirrors
from simulator.engine.symmetry import asymmetric_replicas
from simulator.faults.step import Slowdown, StepFaultPlan, folded_slowdowns
from simulator.network.model import effective_capacity
from simulator.network.modes import NetworkMode
from simulator.program.step import StepProgram
from simulator.topology.graph import Topology


@dataclass(frozen=True)
class FoldedStep:
    """The step program to run, folded where that is exact: its collectives by shape and their ordering (what
    the analyses before the run share), each GPU's compute slowdown under the step's faults (onto the
    representatives when folded), and why folding is off ('' when it is on or was not asked for)."""

    program: StepProgram
    shapes: CollectiveShapes
    order: ProgramOrder
    slowdowns: dict[int, Slowdown]
    off_reason: str


def fold_blocker(topology: Topology) -> str:
    """Why rank folding would not be exact on ``topology`` ('' when it is): an explicit graph may give
    equivalent ranks different links, and hosts of unequal size break the symmetry."""
    if topology.explicit_graph:
        return "explicit graph topology (links may differ between equivalent ranks)"
    if len(set(Counter(topology.gpu_host).values())) > 1:
        return "hosts with different GPU counts"
    return ""


def fold_with_faults(plan: StepFaultPlan, program: StepProgram, plans: PlanCache,
                     shapes: CollectiveShapes | None = None) -> tuple[dict[int, Slowdown], str]:
    """Each representative's slowdown when folding ``program`` stays exact under the step's faults, else
    ``({}, reason)``. Link faults break the replicas' symmetry. Stragglers fold when every rank of a stage is
    slowed alike, or when they lie in one replica whose traffic meets no other replica's (no mirror survives
    pruning): the other replicas then only wait for it at the collectives they share. ``shapes``: the index of
    the program's collectives, when the caller has it."""
    if plan.links:
        return {}, "link faults (replicas no longer see the same links)"
    if not plan.slowdowns:
        return {}, ""
    if program.layout is None:
        return {}, "stragglers in a step without a parallel layout"
    slowdowns, needs_isolation, reason = folded_slowdowns(plan, program.layout)
    if reason or not needs_isolation:
        return slowdowns, reason
    if any(kept_mirrors(program.ops, plans, shapes).values()):
        return {}, "stragglers in one replica whose traffic shares links with the other replicas'"
    return slowdowns, ""


def straggler_blocker(program: StepProgram, plans: PlanCache, shapes: CollectiveShapes, factor: float) -> str:
    """Why a job's straggler state would run ``program`` (folded) unfolded ('' when it folds): a state slows
    the representatives of some pipeline stages (reliability/states.py), and whichever stages they are, the
    step folds exactly when one slowed representative does (a stage of one rank is slowed alike, else the
    answer is whether the replica's traffic meets another's), so one straggler on the first stage asks it."""
    if program.layout is None:
        return "stragglers in a step without a parallel layout"
    plan = StepFaultPlan(slowdowns=((program.layout.rank_of(pp=0), Slowdown(factor)),))
    return fold_with_faults(plan, program, plans, shapes)[1]


def program_indexes(program: StepProgram) -> tuple[CollectiveShapes, ProgramOrder]:
    """What the analyses before ``program``'s run share, made once per program: its collectives by shape and
    their ordering (built on first use)."""
    return CollectiveShapes.of(program.ops), ProgramOrder(program.ops, program.async_streams)


def folded_step(build: Callable[[bool], StepProgram], topology: Topology, plans: PlanCache, mode: NetworkMode,
                efficiency: Mapping[str, float], faults: StepFaultPlan, fold: bool) -> FoldedStep:
    """The step ``build(fold)`` makes, folded when ``fold`` asks for it and every check passes, else rebuilt
    unfolded. The collectives' symmetry is checked on the flow model only: the analytic model runs each
    transfer alone, so no mirror meets traffic there."""
    blocker = fold_blocker(topology) if fold else ""
    program = build(fold and not blocker)
    shapes, order = program_indexes(program)
    if program.folded and mode == "flow":
        capacity = effective_capacity(topology, dict(efficiency))
        blocker = asymmetric_replicas(program.ops, plans, capacity, shapes, order)
        if blocker:
            program = build(False)
            shapes, order = program_indexes(program)
    slowdowns = faults.slowdown_of()
    if program.folded and not faults.empty:
        folded, blocker = fold_with_faults(faults, program, plans, shapes)
        if blocker:
            program = build(False)
            shapes, order = program_indexes(program)
        else:
            slowdowns = folded
    return FoldedStep(program, shapes, order, slowdowns, blocker)
