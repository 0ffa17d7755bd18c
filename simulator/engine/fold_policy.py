"""Whether a step runs folded (one representative rank per pipeline stage) or every rank, and why not.

Folding is exact only where every replica meets what the representatives meet. Three checks, from the cheapest:
the cluster (`fold_blocker`: an explicit graph, or hosts of unequal size), the folded program's collectives
(`engine/symmetry.py`: on the flow model a mirror that would meet the links differently, on the analytic model
one whose plan alone takes another time), and the step's
faults (`fold_with_faults`: link faults other than links down from the start, which fold by classes of the hosts
near them, `link_fault_step`; or stragglers that do not slow a stage alike or stay in one replica: one rank per
stage then plays the slow replica, exact on the flow model only where its traffic meets no other's, and the step is
refolded by the slow replica's classes, `straggler_step`). A check that fails rebuilds the program unfolded (but
for the shared-links refusal, which refolds by the slow replica's classes with every mirror kept) and gives the
reason, which the summary reports as `fold_off_reason`. `fold_verdict` is the rule the engine applies to a
folded program; a job asks it of its straggler states before it meets them (`straggler_blocker`). The caller's
guard hears of each unfolding (program/unfolding.py: which check, why) before the unfolded program is built,
so that a step too large unfolded is refused (scale.py) before it takes minutes or memory. Where a folded run's
only mirrors out of step were pipeline hand-offs, `lane_step` (one rank per CP lane of each stage,
classes keyed by CP lane) and `route_steps` (ranks classed also by their hand-offs' routes: the hops, then the loads
on them, then by place in the other collectives' plans, then by host, coarsest first; classes of unequal size
weighted, `FoldedStep.weights`) are tried before unfolding, lanes first unless copies of one CP lane's hand-off
ended apart (`Lockstep.hand_offs_within_lanes`: in the first instance out of step where the run stopped there,
`LockstepWatch`, else in the whole run); a refold whose class-mates' hand-offs the runs stopped so far predict
apart (the caller's ``defer``) is put off unbuilt behind the next (`Deferred`), built and run after them unless
the run of one that kept pace refutes it (engine/refold_evidence.py `refuted`),
then `meet_step` where both ran or were deferred (their meet: one rank per CP lane of each class by route), or only
lanes on a step classed by NVLink loads (with those classes): the unfolded run
where their own mirrors keep pace, at a fraction of its cost. Each is judged by `fold_verdict` before its run,
as the first fold is (`_refined_step`), and the lockstep check after its run certifies it. Classed folds and
refolds are tried without step faults or under stragglers alike on every rank of a stage (faults/step.py
`alike_in_stages`); stragglers in one replica refold by the slow replica's coordinates (`straggler_step`), with
every mirror kept where that replica's traffic shares links with the others' (`FoldedStep.every_mirror`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

import numpy as np

from simulator.engine.faults import kept_from_start
from simulator.engine.lockstep import Lockstep, OutOfStep, hop_signature
from simulator.engine.ordering import ProgramOrder
from simulator.engine.plans import PlanCache
from simulator.engine.rank_classes import hosts_near, link_fault_classes, rank_classes, route_classes
from simulator.engine.shapes import CollectiveShapes
from simulator.engine.sharing import kept_mirrors
from simulator.engine.symmetry import (
    UnalignedHandOff,
    asymmetric_replicas,
    unequally_met,
    unlike_alone,
    unlike_routes,
)
from simulator.faults.step import NOMINAL, Slowdown, StepFaultPlan, alike_in_stages, folded_slowdowns, straggler_classes
from simulator.network.model import effective_capacity
from simulator.network.modes import NetworkMode
from simulator.parallel.folding import (
    RankClasses,
    class_copies,
    classes_of,
    lane_classes,
    rank_weights,
    representatives,
    unheld_representative,
    unlike_images,
)
from simulator.parallel.layout import Layout
from simulator.program.ops import CollectiveOp
from simulator.program.step import StepProgram
from simulator.program.unfolding import FoldCheck, RefoldBudget, Unfolding, UnfoldingGuard
from simulator.topology.graph import Topology

StepBuilder = Callable[[bool, RankClasses | None], StepProgram]
"""How a step program is built: folded or not, and with which classes of ranks simulated apart (None: one
representative per stage)."""


FoldKind = Literal["stage", "classes", "stragglers", "lanes", "routes", "meet", "links"]
"""How a step is folded: one rank per pipeline stage, one per class of ranks by NVLink loads (`rank_classes`) or
by the slow replica's coordinates (`straggler_step`), per CP lane (`lane_step`), per class by hand-off routes
(`route_steps`), by the meet of the last two (`meet_step`) or by the hosts near links down (`link_fault_step`)."""

REFUSED: dict[FoldCheck, str] = {"plan": "ranks of a stage do different work",
                                 "copies": "the traced job's copies would use the cluster differently",
                                 "cluster": "the cluster is not symmetric",
                                 "stages": "stages not aligned to NVLink domains hand on unlike",
                                 "collectives": "mirrored collectives would load the links differently",
                                 "faults": "the step's faults differ across replicas",
                                 "changing": "the step's link faults change mid-step",
                                 "near": "the ranks near the link faults are simulated apart",
                                 "links": "every class by the hosts near the link faults holds one rank",
                                 "hops": "the replicas' hand-offs cross other hops",
                                 "size": "the refold is too large to simulate",
                                 "untried": "finer refolds are not tried where the step may not unfold",
                                 "classes": "the fold by classes is too large to simulate",
                                 "ended": "class-mates' hand-offs end apart unfolded",
                                 "aligned": "a group or mirror holds ranks its folded collective does not wait for"}
"""Why a fold is refused before its run, by the check that refused it (`Unfolding.check`), or stands not exact
(``hops``): the stable short text of a `GivenUp`. ``classes`` is told to the caller's guard alone, which refuses
the run past the scale limits (`_classed_step`): no `GivenUp` carries it, but every check has its text."""


@dataclass(frozen=True)
class GivenUp:
    """A fold given up: which (`FoldKind`) and how many ranks it simulates, why (the check that refused it before
    its run, `Unfolding`), and where its run's mirrors fell out of step (engine/lockstep.py), the figures of the
    first instance out of step, at which its run stopped (`LockstepWatch`), or of the whole run for a fold that
    stands (`fold_not_exact`). ``unordered``: the check that refused it ran without the program's ordering
    (too large to order, engine/ordering.py), judging each collective on one rank's ops, which sees more of them
    overlap: it may have refused a fold that an ordered check would have passed."""

    fold: FoldKind
    ranks: int | None
    """None where the fold's program was never built (refused by the cluster or the plan) and has no layout."""
    unfolding: Unfolding
    out_of_step: OutOfStep | None = None
    unordered: bool = False

    @property
    def why(self) -> str:
        """A short stable text: the check that refused the fold, or the kind of collective out of step."""
        if self.out_of_step is None:
            return REFUSED[self.unfolding.check]
        return f"a {'hand-off' if self.out_of_step.hand_off else 'collective'} fell out of step in its run"

    def summary(self) -> dict:
        """What summary.json's `fold_given_up` lists of it, or `fold_not_exact` is (docs/training-step.md)."""
        entry = {"fold": self.fold, "simulated_ranks": self.ranks, "why": self.why, "reason": self.unfolding.reason,
                 **({"unordered": True} if self.unordered else {})}
        return entry if self.out_of_step is None else {**entry, "out_of_step": self.out_of_step.figures()}


def fell_out_of_step(step: FoldedStep, kept_pace: Lockstep) -> GivenUp:
    """The fold of ``step`` (a folded one: an unfolded step has no mirrors) given up after its run, whose mirrors
    fell out of step (``kept_pace``, its lockstep report, not in step): other collectives are named before
    hand-offs, as the run's `fold_off_reason`."""
    assert step.kind is not None
    first = kept_pace.apart[0]
    return GivenUp(step.kind, len(step.program.ranks), Unfolding("collectives", first.reason()), first)


@dataclass(frozen=True)
class StageFold:
    """The step folded with one rank per stage and the indexes its analyses share (`program_indexes`), kept by a
    step folded otherwise from it, so that what reads the stage fold again (`route_steps`, `straggler_blocker`)
    neither builds it nor orders its collectives a second time."""

    program: StepProgram
    shapes: CollectiveShapes
    order: ProgramOrder


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
    kind: FoldKind | None
    """How the program is folded; None where it is not (every rank simulated)."""
    classes: RankClasses | None = None
    """The classes of ranks folded apart (None: one representative per stage, or unfolded)."""
    given_up: tuple[GivenUp, ...] = ()
    """The folds refused before this step was chosen (`folded_step`'s classes, its stage fold), in order."""
    not_exact: GivenUp | None = None
    """This fold, where it stands though known before its run not to be exact (`unlike_hand_off_hops`)."""
    stage_fold: StageFold | None = None
    """The stage fold this step was classed from (`_classed_step`); None where the step is that fold, or unfolded,
    or was refolded from a fold the caller holds."""
    every_mirror: bool = False
    """Whether its run keeps every mirror (none pruned, engine/sharing.py), so that the lockstep check after it
    compares every copy of every collective with its group: a fold by the slow replica's classes whose traffic
    shares links with the other replicas' (`straggler_step`)."""

    @property
    def weights(self) -> dict[int, int] | None:
        """How many ranks each simulated rank stands for, where ``classes`` of unequal size make them unlike
        (parallel/folding.py `rank_weights`); None where each stands for as many."""
        layout = self.program.layout
        return None if layout is None else rank_weights(layout, self.classes)


def fold_blocker(topology: Topology) -> str:
    """Why rank folding would not be exact on ``topology`` ('' when it is): an explicit graph may give
    equivalent ranks different links, and hosts of unequal size break the symmetry."""
    if topology.explicit_graph:
        return "explicit graph topology (links may differ between equivalent ranks)"
    if len(set(Counter(topology.gpu_host).values())) > 1:
        return "hosts with different GPU counts"
    return ""


SHARED_LINKS = "stragglers in one replica whose traffic shares links with the other replicas'"
"""Why one rank per stage cannot play the slow replica of stragglers in one replica on the flow model
(`fold_with_faults`; the analytic model, which runs each collective alone, lets it), as the summary and the
job's announcements tell it: the text of the `Unfolding` marked `shares_links`, which is what callers branch on
(the step is then refolded by the slow replica's classes with every mirror kept, `straggler_step`, or unfolded)."""

STRAGGLERS_WITHOUT_LAYOUT = "stragglers in a step without a parallel layout"
"""Why stragglers unfold a step without a layout (a trace): no replicas or stages to fold them by."""


def fold_with_faults(plan: StepFaultPlan, program: StepProgram, plans: PlanCache, mode: NetworkMode,
                     shapes: CollectiveShapes | None = None) -> tuple[dict[int, Slowdown], Unfolding | None]:
    """Each representative's slowdown and None when folding ``program`` stays exact under the step's faults, else
    ``({}, why)`` (check ``faults``; `Unfolding.shares_links` where the reason is `SHARED_LINKS`). Link faults
    break the replicas' symmetry unless they are links down from the start (`link_fault_blocker`), which the
    checks see over the detoured routes. Stragglers fold when every rank of a stage is
    slowed alike; stragglers in one replica fold onto the slow replica's classes, each slow rank simulated as
    itself (faults/step.py `folded_slowdowns`; their class-mates are held to their representatives as in any
    classed fold), and onto one rank per stage playing the slow replica only where its traffic meets no other
    replica's (on the flow model: no mirror survives pruning, else `SHARED_LINKS`; the analytic model runs each
    collective alone, so no traffic meets another's): the other replicas then only wait for it at the collectives
    they share. ``shapes``: the index of the program's collectives, when the caller has it."""
    if plan.links:
        reason = link_fault_blocker(plan, mode) or (LINKS_WITHOUT_LAYOUT if program.layout is None else "")
        return {}, Unfolding("changing" if reason == LINKS_DURING_STEP else "faults", reason) if reason else None
    if not plan.slowdowns:
        return {}, None
    if program.layout is None:
        return {}, Unfolding("faults", STRAGGLERS_WITHOUT_LAYOUT)
    slowdowns, needs_isolation, reason = folded_slowdowns(plan, program.layout, program.ranks)
    if reason:
        return slowdowns, Unfolding("faults", reason)
    if needs_isolation and mode == "flow" and any(kept_mirrors(program.ops, plans, shapes).values()):
        return {}, Unfolding("faults", SHARED_LINKS, shares_links=True)
    return slowdowns, None


LINKS_DURING_STEP = "link faults mid-step (routes or capacities change after the fold checks read them at its start)"
"""Why link faults unfold a step unless every one takes its links down or degrades them for the whole step
(`link_fault_blocker`): a link failing, degraded or coming back mid-step changes routes or capacities that the
fold checks, which read the routes and capacities at the step's start, do not see."""


LINKS_WITHOUT_LAYOUT = "link faults in a step without a parallel layout (a trace: no hosts' classes to fold by)"
"""Why links down unfold a step without a layout: its copies are not classed by the hosts near the links."""


def link_fault_blocker(plan: StepFaultPlan, mode: NetworkMode) -> str:
    """Why the step's link faults keep it from folding ('' where a fold may stand, judged like any other by
    `fold_verdict` and the lockstep check after its run): links down from the start reroute
    the flows that crossed them (faults/rerouting.py) before any check reads a route, so the checks compare
    every mirror over the routes the run takes (the fabric's translations are off once routes change,
    `PlanCache.translations`); links degraded from the start are the topology's at their bandwidth
    (`Topology.degrade`) before any check reads a capacity, and the translations map no link onto one of
    another bandwidth (topology/periods.py); a link failing, degraded or coming back (`until`) mid-step changes
    capacities or routes the checks do not see. The analytic model has no lockstep check to certify a fold that
    meets detours, and stragglers beside link faults are not refolded (`link_fault_step` classes by hosts, not
    slowdowns)."""
    if any(event.timed for event in plan.links):
        return LINKS_DURING_STEP
    if mode != "flow":
        return "link faults on the analytic model (no lockstep check after the run to certify a fold over detours)"
    if plan.slowdowns:
        return "link faults beside stragglers (the ranks near the links down are classed apart, not the slow ones)"
    return ""


def evenly_degraded(plan: StepFaultPlan, topology: Topology) -> bool:
    """Whether ``plan``'s link faults only degrade, for the whole step, whole kinds of links alike: every link
    of a kind (its class, line rate and the kinds of the nodes at its ends: every tray's NIC-leaf link, every
    leaf's uplinks) keeps one fraction of its line rate (`kept_from_start`, as `degrade_from_start` degrades
    ``topology``, whether or not it did yet). The cluster is then the healthy one with slower links of those
    kinds, as symmetric as it was, and the step folds as without link faults: no rank is nearer a fault than
    another, so classing ranks by the hosts near them (`link_fault_step`) would simulate every rank for nothing."""
    if not plan.links or any(event.timed or event.capacity == 0 for event in plan.links):
        return False
    nodes = topology.wiring.nodes
    kept = kept_from_start(topology, plan)

    def kind(node: str) -> tuple:
        return nodes[node].get("kind"), nodes[node].get("tier")

    fractions: dict[tuple, set[float]] = {}
    for link, (a, b) in enumerate(topology.link_ends):
        key = (topology.link_class[link], float(topology.line_rate[link]), kind(a), kind(b))
        fractions.setdefault(key, set()).add(kept.get(link, 1.0))
    return all(len(kept_by_kind) == 1 for kept_by_kind in fractions.values())


def fold_faults(plan: StepFaultPlan, topology: Topology) -> StepFaultPlan:
    """The step's faults as the fold checks weigh them: without its link faults where they degrade whole kinds of
    links alike (`evenly_degraded`: the topology already holds them, as symmetric as it was), else as they are."""
    return replace(plan, links=()) if evenly_degraded(plan, topology) else plan


def fold_verdict(program: StepProgram, plans: PlanCache, mode: NetworkMode, efficiency: Mapping[str, float],
                 faults: StepFaultPlan, shapes: CollectiveShapes, order: ProgramOrder
                 ) -> tuple[dict[int, Slowdown], Unfolding | None]:
    """Whether the folded ``program`` is exact, the engine's rule: on the flow model every replica's collectives meet
    the links as the simulated copy's do (`engine/symmetry.py`); on the analytic model, which runs each transfer
    alone, every mirror's plan takes its group's time (`unlike_alone`: no mirror meets traffic there, but a
    replica's routes may take other hops); and the step's ``faults`` keep the replicas alike (`fold_with_faults`).
    Each representative's slowdown and None when it is, else every slowed GPU's (the step runs unfolded) and why
    not, the check ``stages`` where the first collective found unlike is a hand-off over NVLink in one replica and
    over the NICs in another (`symmetry.UnalignedHandOff`), which neither model folds. ``shapes`` and ``order``: the
    program's indexes (`program_indexes`)."""
    capacity = effective_capacity(plans.topology, dict(efficiency))
    blocker = (asymmetric_replicas(program.ops, plans, capacity, shapes, order) if mode == "flow"
               else unlike_alone(plans, capacity, shapes))
    if blocker:
        stages = isinstance(blocker, UnalignedHandOff)
        return faults.slowdown_of(), Unfolding("stages" if stages else "collectives", blocker)
    folded, unfolding = fold_with_faults(faults, program, plans, mode, shapes)
    return (faults.slowdown_of(), unfolding) if unfolding is not None else (folded, None)


def straggler_blocker(step: FoldedStep, build: StepBuilder, plans: PlanCache, mode: NetworkMode,
                      faults: StepFaultPlan, factor: float) -> Unfolding | None:
    """Why a job's straggler states would not fold with one rank per stage playing the slow replica (None where
    they do; where a stage has more than one rank they then refold by the slow replica's classes), by the engine's
    rule, asked of its healthy ``step`` (with the scenario's own ``faults``) as `folded_step` made it, folded: a
    state adds stragglers on the representatives of some pipeline stages (reliability/states.py), all in the first
    replica. Each such state unfolds when the step without them does (the cluster, the symmetry check, link
    faults, the scenario's own stragglers across replicas: a state keeps every slowed GPU of the scenario's),
    which `folded_step`'s guard hears before this is asked; otherwise all of them fold exactly when one slowed
    representative does (its stage is unlike unless it has one rank, and the answer is then whether that
    replica meets another's traffic, whichever stages), so one straggler of ``factor`` on the first stage asks
    it: where it does (`Unfolding.shares_links`), the states refold by the slow replica's classes with every
    mirror kept (`straggler_step`), any other answer unfolds them. A step folded by classes of ranks is asked as
    ``build`` folds it with one rank per stage: where a stage has more than one rank, a state's stragglers slow
    one of them and not its mates (not `alike_in_stages`), and `folded_step` judges such a step by its stage fold,
    then refolds it by the slow replica's classes (`straggler_step`) or, where those are every rank (at most 2 per
    dimension), runs it unfolded."""
    program, shapes, layout = step.program, step.shapes, step.program.layout
    faults = fold_faults(faults, plans.topology)
    if layout is None:
        return Unfolding("faults", STRAGGLERS_WITHOUT_LAYOUT)
    if program.folded and list(program.ranks) != representatives(layout, True):
        stage_fold = stage_fold_of(step, build)
        program, shapes = stage_fold.program, stage_fold.shapes
    representative = layout.rank_of(pp=0)
    slowed = faults.slowdown_of()
    slowed[representative] = slowed.get(representative, NOMINAL).times(Slowdown(factor))
    state = replace(faults, slowdowns=tuple(sorted(slowed.items())))
    return fold_with_faults(state, program, plans, mode, shapes)[1]


def refaulted(step: FoldedStep, faults: StepFaultPlan) -> FoldedStep:
    """``step``, as `folded_step` made it under faults of the same `fold_shape` as ``faults`` (faults/step.py),
    with the slowdowns ``faults`` give its simulated ranks: the shape alone decides the folding path and the
    programs built (no check reads the slowdowns' factors or which stages they slow), so the step under
    ``faults`` is that one with these slowdowns, as `fold_verdict` gives them (every slowed GPU's where it runs
    unfolded). A job's straggler states share one fold this way: on the 16,384-GPU job every state slowed a
    representative of the first replica, and each built and judged the same 64-rank program again (10 of its 17 s)."""
    layout = step.program.layout
    assert layout is not None, "a step without a layout folds no stragglers"
    if step.kind is None:
        return replace(step, slowdowns=faults.slowdown_of())
    return replace(step, slowdowns=folded_slowdowns(faults, layout, step.program.ranks)[0])


def program_indexes(program: StepProgram) -> tuple[CollectiveShapes, ProgramOrder]:
    """What the analyses before ``program``'s run share, made once per program: its collectives by shape and
    their ordering (built on first use)."""
    return CollectiveShapes.of(program.ops), ProgramOrder(program.ops, program.async_streams)


def stage_fold_of(step: FoldedStep, build: StepBuilder) -> StageFold:
    """The stage fold of ``step`` (folded, with a layout) with its indexes: ``step`` itself where it simulates one
    rank per stage, the one it was classed from where it kept it, else built (and indexed) by ``build``."""
    layout = step.program.layout
    assert layout is not None
    if list(step.program.ranks) == representatives(layout, True):
        return StageFold(step.program, step.shapes, step.order)
    if step.stage_fold is not None:
        return step.stage_fold
    program = build(True, None)
    return StageFold(program, *program_indexes(program))


def folded_step(build: StepBuilder, topology: Topology, plans: PlanCache, mode: NetworkMode,
                efficiency: Mapping[str, float], faults: StepFaultPlan, fold: bool,
                guard: UnfoldingGuard | None = None) -> FoldedStep:
    """The step ``build(fold, None)`` makes, folded when ``fold`` asks for it and every check passes
    (`fold_blocker`, then `fold_verdict`), else rebuilt unfolded; ``guard`` hears why before the unfolded
    program is built. Folded on the flow model without step faults or with stragglers alike on every rank of a
    stage (`alike_in_stages`), it is built again with one representative per class of ranks where its ranks are not
    all alike (`_classed_step`); folded by stage under stragglers in one replica, it is built again with the slow
    replica's ranks apart (`straggler_step`)."""
    faults = fold_faults(faults, topology)
    blocker = fold_blocker(topology) if fold else ""
    if blocker and guard is not None:
        guard(Unfolding("cluster", blocker))
    program = build(fold and not blocker, None)
    shapes, order = program_indexes(program)
    slowdowns = faults.slowdown_of()
    given_up: tuple[GivenUp, ...] = ()
    plan_blocker = str(program.details.get("fold_off_reason", ""))
    if fold and not program.folded and (blocker or plan_blocker):
        refused = Unfolding("cluster", blocker) if blocker else Unfolding(program.fold_off_check, plan_blocker)
        layout = program.layout
        given_up = (GivenUp("stage", None if layout is None else len(representatives(layout, True)), refused),)
    if program.folded and mode == "flow" and program.layout is not None and alike_in_stages(faults, program.layout):
        classed = _classed_step(build, program, plans, mode, efficiency, faults, shapes, order, guard)
        if isinstance(classed, FoldedStep):
            return classed
        given_up = () if classed is None else (classed,)
    if program.folded and faults.links and program.layout is not None and not link_fault_blocker(faults, mode):
        return link_fault_step(build, program, plans, mode, efficiency, faults, shapes, order, given_up, guard)
    not_exact = None
    if program.folded:
        slowdowns, unfolding = fold_verdict(program, plans, mode, efficiency, faults, shapes, order)
        if unfolding is not None and unfolding.shares_links:
            shared = GivenUp("stage", len(program.ranks), unfolding)
            stage = FoldedStep(program, shapes, order, {}, "", "stage", given_up=(*given_up, shared))
            return straggler_step(build, stage, plans, mode, efficiency, faults, guard, shared=True)
        if unfolding is not None:
            refused_stage = GivenUp("stage", len(program.ranks), unfolding, unordered=_unordered(order))
            return replace(unfolded_step(build, faults, unfolding, guard), given_up=(*given_up, refused_stage))
        unlike = unlike_hand_off_hops(shapes, plans.topology) if mode == "analytic" else ""
        not_exact = GivenUp("stage", len(program.ranks), Unfolding("hops", unlike)) if unlike else None
        stage = FoldedStep(program, shapes, order, slowdowns, blocker, "stage", given_up=given_up, not_exact=not_exact)
        return straggler_step(build, stage, plans, mode, efficiency, faults, guard)
    return FoldedStep(program, shapes, order, slowdowns, blocker, None, given_up=given_up)


def link_fault_step(build: StepBuilder, program: StepProgram, plans: PlanCache, mode: NetworkMode,
                    efficiency: Mapping[str, float], faults: StepFaultPlan, shapes: CollectiveShapes,
                    order: ProgramOrder, given_up: tuple[GivenUp, ...] = (), guard: UnfoldingGuard | None = None
                    ) -> FoldedStep:
    """The step under links down from its start (`link_fault_blocker` passed), folded where that is exact: the
    stage fold ``program`` (``shapes`` and ``order`` its indexes) refolded by the classes of the hosts near the
    links down (engine/rank_classes.py `link_fault_classes`; the stage fold itself is given up,
    `STAGE_FOLD_NEAR`) where the class-mates keep pace with their representatives
    (`unlike_class_mates`) and `fold_verdict` passes the classed program, as any classed fold; else unfolded,
    with the classed fold's refusal, or where its classes hold one rank each (one leaf group, a spine, or classes
    of one rank wherever a near rank joins them) saying so (`EVERY_RANK_NEAR`, with how many hosts are near).
    Detours break the translations the checks otherwise lean on, so every mirror is compared, and the lockstep
    check after the run certifies the fold (one out of step unfolds).
    A leaf down on 512 H100s (TP 8, PP 4, DP 16, two leaf groups) folds onto 288 ranks, its step time the
    unfolded one's to the bit, in 21 s of CPU and 0.84 GB against 35 s and 1.38 GB."""
    layout = program.layout
    assert layout is not None
    nvlink = rank_classes(program, plans, shapes, order, between_hosts=False)
    held = link_faults_held(faults)
    refused = [GivenUp("stage", len(program.ranks), Unfolding("near", f"{held}: {STAGE_FOLD_NEAR}"))]
    stage = FoldedStep(program, shapes, order, {}, "", "stage")
    down = [edge for event in faults.links for edge in event.edges]
    classes = link_fault_classes(program, plans.topology, down, nvlink)
    ranks = len(representatives(layout, True, classes)) if classes is not None else layout.world
    hosts = int(max(plans.topology.gpu_host)) + 1
    unfolding = Unfolding("links", f"{held}: {EVERY_CLASS_ONE_RANK} ({len(hosts_near(plans.topology, down))} of "
                                   f"{hosts} hosts near)")
    if classes is not None and ranks == layout.world:
        refused.append(GivenUp("links", ranks, unfolding))
    if classes is not None and ranks < layout.world:
        # links degraded, none down: copies held by the ranks simulated apart are left out of the unequal-traffic
        # check. With links down not: on 2 racks with all 9 NVSwitch trays down that fold gave the unfolded step's
        # figures but its count of rerouted routes (256 against 64, a count that includes the checks' routes)
        degraded = all(event.capacity > 0 for event in faults.links)
        apart = ranks_alone(layout, classes) if degraded else frozenset()
        unlike = unlike_class_mates(program, classes, shapes, order, plans, efficiency, apart)
        refold = (GivenUp("links", ranks, Unfolding("collectives", unlike)) if unlike
                  else _refined_step(build, stage, classes, plans, mode, efficiency, faults, "links"))
        if isinstance(refold, FoldedStep):
            return replace(refold, given_up=(*given_up, *refused), stage_fold=StageFold(program, shapes, order))
        assert refold is not None
        refused.append(refold)
        unfolding = refold.unfolding
    return replace(unfolded_step(build, faults, unfolding, guard), given_up=(*given_up, *refused))


def link_faults_held(plan: StepFaultPlan) -> str:
    """What ``plan``'s link faults do to their links, as the fold reasons under them begin: 'links down',
    'links degraded' (none down: the capacity they keep) or 'links down or degraded'."""
    down = {event.capacity == 0 for event in plan.links}
    return "links down or degraded" if len(down) > 1 else "links down" if down == {True} else "links degraded"


STAGE_FOLD_NEAR = ("the ranks near them are simulated apart, since the checks compare each group's mirrors at one "
                   "message size (one leaf-spine cable down, TP 8 x DP 4: the stage fold passed them with the step "
                   "time exact and the DP communication 0.6% high)")
"""Why `link_fault_step` gives up the stage fold of a step with links down or degraded from its start, after
what they are (`link_faults_held`)."""

EVERY_CLASS_ONE_RANK = ("every class holds one rank (the ranks of the hosts near them apart, the others by rail and "
                        "by the near ranks their groups hold)")
"""Why `link_fault_step` runs a step unfolded whose classes by the hosts near its link faults hold one rank each
(after what they are, `link_faults_held`): every host near them, or every class of far ranks holding one rank
beside a near one (DP 2)."""

EVERY_RANK_NEAR = f"links down: {EVERY_CLASS_ONE_RANK}"
"""`EVERY_CLASS_ONE_RANK` under links down (a job's states: a tray, a NIC, a leaf down)."""


def straggler_step(build: StepBuilder, stage: FoldedStep, plans: PlanCache, mode: NetworkMode,
                   efficiency: Mapping[str, float], faults: StepFaultPlan, guard: UnfoldingGuard | None = None,
                   shared: bool = False) -> FoldedStep:
    """The ``stage`` fold (one rank per stage, passed by `fold_verdict`) refolded by the classes of ranks that
    stragglers in one pipeline replica part (faults/step.py `straggler_classes`; by TP coordinate too where TP
    all-gathers run as ring exchanges, whose ranks wait by their places along the ring), each slow rank simulated as
    itself beside one rank of every other class, weighted by its class's size: in the stage fold the
    representatives play the slow replica, so the step time is right but every per-GPU figure (bubble, exposed
    communication, loss shares, SM contention) is the slow replica's, not the mean over the GPUs (TP 8, DP 4, GPU
    9 slowed x2: bubble 0.0 against 0.378 unfolded). ``stage`` itself where no such stragglers are; the step
    unfolded where the refold simulates every rank, or its class-mates would not keep pace (`unlike_class_mates`),
    or `fold_verdict` refuses it. The lockstep check after its run certifies it, as any classed fold.

    ``shared``: ``stage`` was refused for `SHARED_LINKS` (its mirrors' traffic meets the slow replica's, so one
    rank per stage playing it is not exact; `Unfolding.shares_links`), and the step has such stragglers. The
    refold then keeps every mirror (`FoldedStep.every_mirror`), and the lockstep check compares every copy: where
    each copy of every collective instance ends with its group's end (within `lockstep.IN_STEP`, 1e-9 relative),
    each class-mate starts its next op when its representative does (alike slowed, alike programs), so the run
    holds the unfolded run's flows at their times up to that tolerance; a copy out of step unfolds the step. The
    collectives that the refold replays with no mirror rest on the checks before the run instead (the ordering of
    engine/ordering.py, the symmetry check of engine/symmetry.py). Exact to the bit is what the cases tried
    measured: 8 hosts of 8 H100, TP 4 x PP 4 x DP 4, 2 NICs a host (sends and DP rings share NICs), GPU 5 x1.5:
    16 ranks, the step and every figure the unfolded run's (tests/test_step_faults.py); 32 to 2,048 GPUs in
    docs/faults.md. Keeping every mirror buys that certificate, not a measured difference: a pruned mirror would
    go unchecked, where a class-mate whose links carry another class's traffic than its representative's could
    meet other loads unseen, yet the refold with mirrors pruned gave the same figures on every layout tried, with
    fewer flows (the 2,048-GPU Llama 3 70B step with GPU 0 x1.3: 384,800 flows and 4.1 s of CPU every mirror
    kept, 212,768 and 3.4 s pruned)."""
    layout = stage.program.layout
    parted = any(op.algorithm == "ring_exchange" for op in stage.shapes.firsts)
    classes = None if layout is None else straggler_classes(faults, layout, parted)
    assert not (shared and classes is None), "a stage fold refused for SHARED_LINKS has stragglers in one replica"
    if classes is None or layout is None:
        return stage
    ranks = len(representatives(layout, True, classes))
    if ranks == layout.world:
        refused = GivenUp("stragglers", ranks, Unfolding("faults", EVERY_RANK_A_CLASS))
    else:
        unlike = unlike_class_mates(stage.program, classes, stage.shapes, stage.order, plans, efficiency)
        refold = (GivenUp("stragglers", ranks, Unfolding("collectives", unlike)) if unlike
                  else _refined_step(build, stage, classes, plans, mode, efficiency, faults, "stragglers"))
        if isinstance(refold, FoldedStep):
            unlike = unlike_hand_off_hops(refold.shapes, plans.topology) if mode == "analytic" else ""
            not_exact = GivenUp("stragglers", ranks, Unfolding("hops", unlike)) if unlike else None
            return replace(refold, given_up=stage.given_up, not_exact=not_exact, every_mirror=shared)
        assert refold is not None
        refused = refold
    return replace(unfolded_step(build, faults, refused.unfolding, guard), given_up=(*stage.given_up, refused))


EVERY_RANK_A_CLASS = ("stragglers in one pipeline replica: one rank per class by the slow replica's coordinates "
                      "is every rank")
"""Why `straggler_step` runs a step unfolded whose straggler classes hold one rank each."""


def unlike_hand_off_hops(shapes: CollectiveShapes, topology: Topology, mode: NetworkMode = "analytic") -> str:
    """Why a step folded on the analytic model is not exact though `fold_verdict` passed it ('' where it is):
    a pipeline hand-off whose copies (its group and mirrors, ``shapes``' collectives) all cross the fabric but
    over other hops (`hop_signature`: inside a leaf group in one replica, across the spines in another), which
    the verdict lets pass because unfolding such steps refused the published SC21 1T case as too large, and
    which this model, with no run of copies side by side to compare their ends (engine/lockstep.py), leaves
    unchecked: tp 8, pp 3, dp 2 on six hosts in leaf groups of two with oversubscription 8 folded 0.89% slow,
    its exposed pp 10.86 against 6.69 ms. The step then stands folded, `fold_not_exact` with a warning. On the
    flow model (``mode``) such copies end apart in the run by the hops' latencies, so the stage fold is given up
    before it (`hop_refold`), and the text says so."""
    for op in shapes.firsts:
        if op.op != "send_recv" or not op.mirrors:
            continue
        own = hop_signature(topology, op.group)
        unlike = next((mirror for mirror in op.mirrors if hop_signature(topology, mirror) != own), None)
        if unlike is not None:
            crossing = (f"send_recv {op.name!r} crosses {len(own)} links over GPUs {list(op.group)} but "
                        f"{len(hop_signature(topology, unlike))} over the equivalent {list(unlike)}: ")
            if mode == "flow":
                return crossing + ("its copies end apart by those hops' latencies, so one rank per stage cannot "
                                   "stand for both, and the step folds by the hand-offs' routes before its run")
            return crossing + ("on the analytic model the representative's hand-off stands for copies that take "
                               "other times alone, so the folded step may be off (slow where kept mirrors on "
                               "longer routes hold the representative back)")
    return ""


def lane_step(build: StepBuilder, folded: FoldedStep, plans: PlanCache, mode: NetworkMode,
              efficiency: Mapping[str, float], faults: StepFaultPlan, budget: RefoldBudget | None = None,
              defer: Deferring | None = None) -> FoldedStep | GivenUp | Deferred | None:
    """The step with one rank per CP lane of each stage (``build`` with parallel/folding.py `lane_classes`), to
    run where the ``folded`` step's only mirrors out of step were pipeline hand-offs; None where lanes cannot
    stand for them: no CP lanes, no layout (a trace), step faults that leave some stage's ranks unlike (not
    `alike_in_stages`); a lane program that `_refined_step` refuses (or ``budget``) is given up (`GivenUp`)."""
    layout = folded.program.layout
    if layout is None or layout.cp == 1 or not alike_in_stages(faults, layout):
        return None
    return _proposed_step(build, folded, lane_classes(layout), plans, mode, efficiency, faults, "lanes", budget,
                          defer)


def route_steps(build: StepBuilder, folded: FoldedStep, plans: PlanCache, mode: NetworkMode,
                efficiency: Mapping[str, float], faults: StepFaultPlan, budget: RefoldBudget | None = None,
                defer: Deferring | None = None) -> Iterator[FoldedStep | GivenUp | Deferred | None]:
    """The step with its ranks classed also by the routes of their pipeline hand-offs (engine/rank_classes.py
    `route_classes`: by the hops the copies take, then also by the loads they meet on them, then also by place in
    the other collectives' plans, then by place in the period of the spine hash, then by host), the coarsest first,
    the next to be drawn only where the one before fell out of step in its run or was deferred unbuilt (`Deferred`:
    ``defer`` predicts its class-mates' hand-offs apart from the runs stopped so far); for a ``folded`` step whose only
    mirrors out of step were hand-offs (the fabric hashes each flow onto a spine by its hosts and rails, so one
    host's hand-off can share an uplink that its mirrors' do not, and one replica's may cross the spines where
    another's stays in its leaf group). Nothing where no such classes refine its own: no layout (a trace), step
    faults that leave some stage's ranks unlike (not `alike_in_stages`), or ranks all alike. The classes refine
    those of ``folded`` (hosts classed by their NVLink loads too); `_refined_step` judges each before its run,
    ordered or not, and against ``budget``: none is drawn after one beyond it, each being finer than the one before.
    Where a ``budget`` is given (the step may not unfold), only the classes by hops are proposed: the loads'
    signature took 183 s on the published SC21 529.6B row and 4 s on the long-context row, whose classes by it (240
    ranks) were then beyond the budget. There, where the hops' classes ran and fell out of step, or part no ranks
    ``folded`` did not (copies that cross as many links but meet other flows there), the classes not proposed are
    given up unbuilt (`UNTRIED_ROUTES`), so the summary says what was not tried."""
    layout = folded.program.layout
    if layout is None or not alike_in_stages(faults, layout):
        return
    stage_fold = stage_fold_of(folded, build)
    for classes in route_classes(stage_fold.program, plans, stage_fold.shapes, stage_fold.order,
                                 hops_only=budget is not None):
        refold = _proposed_step(build, folded, classes, plans, mode, efficiency, faults, "routes", budget, defer)
        yield refold
        if isinstance(refold, GivenUp) and refold.unfolding.check == "size":
            return
    if budget is not None:
        yield GivenUp("routes", None, Unfolding("untried", UNTRIED_ROUTES))


UNTRIED_ROUTES = ("route classes by the loads the hand-offs' copies meet on their hops, by place in the other "
                  "collectives' plans, and by host, are not proposed where the step may not unfold (the loads' "
                  "signature alone took 183 s on the published SC21 529.6B row), and no class by hops alone ran and "
                  "kept pace")
"""Why `route_steps` gives up the finer route classes of a step that may not unfold."""


def hop_refold(build: StepBuilder, folded: FoldedStep, plans: PlanCache, mode: NetworkMode,
               efficiency: Mapping[str, float], faults: StepFaultPlan, budget: RefoldBudget | None = None
               ) -> FoldedStep | GivenUp | None:
    """The stage fold ``folded`` whose hand-offs' copies cross other hops (`unlike_hand_off_hops`), known before
    its run, folded again by the route classes of hops alone (`route_classes` with ``hops_only``), the stage fold
    given up. On the analytic model that fold stands not exact (`FoldedStep.not_exact`): there each transfer runs
    alone, so copies over like hops take like times (where copies share links, `symmetry.unlike_alone` holds those
    over like hops to one time under their load), and the refold is exact where none of its own hand-offs' copies
    crosses other hops, which is asked of it before its run (a refold that still has some is given up, as is one
    beyond ``budget``, `scale.refold_refusal` whether forced or not (a job's states are given one too), or refused by
    `fold_verdict`); given up unbuilt where its step faults leave some stage's ranks unlike (not faults/step.py
    `alike_in_stages`: route classes would fold a slow rank onto healthy class-mates), so the summary says why the
    fold stands not exact. The reviewer's c1 case (tp 8, pp 2, dp 3 on six hosts in leaf groups of three,
    oversubscription 8): the stage fold's exposed pp was 1.702 ms against 0.687 unfolded; refolded by hops (4 ranks,
    weights 16, 16, 8, 8) every figure is the unfolded run's.

    On the flow model the stage fold's copies over other hops end apart by those hops' latencies in its run (the
    lockstep check, engine/lockstep.py), which then gave it up and ran the step again by these same classes first
    (`route_steps`): GPT-3 175B on 1,024 A100s, TP 8 x PP 8 x DP 16, hands stage 3 on to 4 across the spines in
    replicas 2, 7 and 12 (hosts 19 to 20, 59 to 60, 99 to 100, leaf groups of 20 hosts), 6 links against 4, two
    switch hops' 0.5 us later; its stage fold ran to its end 1 us out of step, and the step ran again on 16 ranks.
    The refold runs first instead, its lockstep check certifying it as any refold's; where it is not tried (beyond
    ``budget``, refused by `fold_verdict`, step faults unlike in a stage) None, the stage fold running as before.
    None where ``folded`` is not such a fold. Links degraded alike everywhere are weighed as the first fold weighs
    them (`fold_faults`)."""
    program = folded.program
    faults = fold_faults(faults, plans.topology)
    stood = folded.not_exact if mode == "analytic" else _unlike_hops_stage(folded, plans.topology)
    if stood is None or stood.unfolding.check != "hops" or program.layout is None:
        return None
    if not alike_in_stages(faults, program.layout):
        return GivenUp("routes", None, Unfolding("faults", UNREFOLDED_STRAGGLERS)) if mode == "analytic" else None
    classes = next(route_classes(program, plans, folded.shapes, folded.order, hops_only=True), None)
    refold = _refined_step(build, folded, classes, plans, mode, efficiency, faults, "routes", budget)
    if not isinstance(refold, FoldedStep):
        return refold if mode == "analytic" else None
    unlike = unlike_hand_off_hops(refold.shapes, plans.topology) if mode == "analytic" else ""
    if unlike:
        return GivenUp("routes", len(refold.program.ranks), Unfolding("hops", unlike))
    return replace(refold, given_up=(*folded.given_up, stood),
                   stage_fold=StageFold(program, folded.shapes, folded.order))


def _unlike_hops_stage(folded: FoldedStep, topology: Topology) -> GivenUp | None:
    """On the flow model, the plain stage fold ``folded`` (no classes, no slow replica apart) given up before its
    run where its hand-offs' copies cross other hops (`unlike_hand_off_hops`); None otherwise."""
    if folded.kind != "stage" or folded.classes is not None or folded.every_mirror:
        return None
    unlike = unlike_hand_off_hops(folded.shapes, topology, "flow")
    return GivenUp("stage", len(folded.program.ranks), Unfolding("hops", unlike)) if unlike else None


UNREFOLDED_STRAGGLERS = ("stragglers slow some ranks of a stage and not others, so route classes, which fold a "
                         "rank onto class-mates whatever their slowdowns, are not tried")
"""Why `hop_refold` gives up refolding a step whose hand-offs cross other hops under such stragglers."""


def meet_step(build: StepBuilder, folded: FoldedStep, tried: Sequence[FoldedStep | Deferred], plans: PlanCache,
              mode: NetworkMode, efficiency: Mapping[str, float], faults: StepFaultPlan,
              budget: RefoldBudget | None = None, defer: Deferring | None = None
              ) -> FoldedStep | GivenUp | Deferred | None:
    """The step classed by the meet of the classes of the two refolds of ``folded`` tried before it that did not
    keep pace (``tried``: `lane_step`'s and the last of `route_steps`', in the order proposed, each either run and
    fallen out of step or deferred unbuilt, `Deferred`, its class-mates' copies of a hand-off having ended apart
    in a run stopped there): one rank per CP lane of each class of hosts by route, where route classes part the
    hosts but not a host's lanes and lanes the reverse. Where only one was tried and ``folded`` is classed (by
    NVLink loads, which route classes may add nothing to), ``folded``'s classes stand for the hosts' side.
    None where fewer than two sides remain, or their meet is one of them (one refines the other); its classes may
    be of unequal size (`FoldedStep.weights`)."""
    sides: list[FoldedStep | Deferred] = [*tried] if len(tried) == 2 or folded.classes is None else [folded, *tried]
    if len(sides) != 2 or sides[0].classes is None or sides[1].classes is None:
        return None
    met = sides[0].classes.meet(sides[1].classes)
    return None if met in (sides[0].classes, sides[1].classes) else _proposed_step(build, folded, met, plans, mode,
                                                                                  efficiency, faults, "meet", budget,
                                                                                  defer)


Deferring = Callable[[RankClasses], bool]
"""Whether a refold by the given classes is deferred behind the next (engine/refold_evidence.predicted_apart)."""


@dataclass(frozen=True)
class Deferred:
    """A refold proposed but not built, deferred behind the next (simulation.py `_refolded`): which (``kind``), its
    ``classes`` and the ranks it would simulate, and how to build and judge it (`_built_step`) where it is still
    to run."""

    kind: FoldKind
    classes: RankClasses
    ranks: tuple[int, ...]
    built: Callable[[], FoldedStep | GivenUp | None]


def _unordered(order: ProgramOrder) -> bool:
    """Whether a check asked for the ordering of ``order``'s program and went without it (too large)."""
    return order.skipped_when_asked is not None


def _proposed_step(build: StepBuilder, folded: FoldedStep, classes: RankClasses | None, plans: PlanCache,
                   mode: NetworkMode, efficiency: Mapping[str, float], faults: StepFaultPlan, kind: FoldKind,
                   budget: RefoldBudget | None = None, defer: Deferring | None = None
                   ) -> FoldedStep | GivenUp | Deferred | None:
    """`_refined_step`, or where the refold applies (`_refold_ranks`) and ``defer`` picks its ``classes``
    (engine/refold_evidence.py), the refold unbuilt, to be built later if at all (`Deferred`)."""
    ranks = _refold_ranks(folded, classes, kind, budget)
    if not isinstance(ranks, tuple):
        return ranks
    if classes is not None and defer is not None and defer(classes):
        return Deferred(kind, classes, ranks, partial(_built_step, build, folded, classes, plans, mode, efficiency,
                                                      faults, kind))
    return _built_step(build, folded, classes, plans, mode, efficiency, faults, kind)


def _refold_ranks(folded: FoldedStep, classes: RankClasses | None, kind: FoldKind, budget: RefoldBudget | None
                  ) -> tuple[int, ...] | GivenUp | None:
    """The ranks a refold of ``folded`` (as ``kind``) by ``classes`` simulates, one representative per class,
    where it applies: None where there are no such classes or they simulate the ranks ``folded`` did or every
    rank, given up (`GivenUp`) where beyond ``budget``."""
    layout = folded.program.layout
    if classes is None or layout is None:
        return None
    ranks = representatives(layout, True, classes)
    if list(folded.program.ranks) == ranks or len(ranks) == layout.world:
        return None
    too_large = budget(len(ranks)) if budget is not None else ""
    if too_large:
        return GivenUp(kind, len(ranks), Unfolding("size", too_large))
    return tuple(ranks)


def _refined_step(build: StepBuilder, folded: FoldedStep, classes: RankClasses | None, plans: PlanCache,
                  mode: NetworkMode, efficiency: Mapping[str, float], faults: StepFaultPlan, kind: FoldKind,
                  budget: RefoldBudget | None = None) -> FoldedStep | GivenUp | None:
    """The step folded (as ``kind``) with one representative per class of ``classes``, to run again where
    ``folded``'s only mirrors out of step were pipeline hand-offs; None where there are no such classes or they
    simulate the ranks ``folded`` did or every rank (such a refold is the unfolded step, which then runs as
    such: folded false, with the reason; one rank per class of 48 cost 2.75 s against 2.48 unfolded), given up
    (`GivenUp`) where `fold_verdict` refuses them. Every refold is
    judged as the first fold is, whether its program can be ordered (`ProgramOrder`) or not: that ``folded``
    passed the check does not vouch for it, since `engine/symmetry.py` judged the unequal traffic each mirror
    meets by ``folded``'s order, with its classes in lockstep, and refolds run because they were not. Unordered,
    the check judges each instance by its first rank's ordering (`symmetry._rank_overlapping`), and where it
    refuses, the step tries the next refold or unfolds, exact either way, where an unjudged refold met unequal
    traffic (notably from mirrors that pruning dropped, which the lockstep check after the run does not compare)
    unguarded. Refolds
    run only under step faults `alike_in_stages`, with which the step is judged (each representative slowed as its
    stage is). Where the step
    may not run unfolded, ``budget`` says whether the refold may (`program/unfolding.RefoldBudget`); one beyond it
    is given up before its program is built."""
    ranks = _refold_ranks(folded, classes, kind, budget)
    if not isinstance(ranks, tuple):
        return ranks
    return _built_step(build, folded, classes, plans, mode, efficiency, faults, kind)


def _built_step(build: StepBuilder, folded: FoldedStep, classes: RankClasses | None, plans: PlanCache,
                mode: NetworkMode, efficiency: Mapping[str, float], faults: StepFaultPlan, kind: FoldKind
                ) -> FoldedStep | GivenUp:
    """The refold of ``folded`` by ``classes`` (one that applies, `_refold_ranks`) built and judged by
    `fold_verdict`: given up (`GivenUp`) where it refuses it."""
    refined = build(True, classes)
    assert classes is not None and refined.layout is not None, "a refold has classes and a layout"
    misaligned = misaligned_copy(refined, classes)
    if misaligned:
        return GivenUp(kind, len(refined.ranks), Unfolding("aligned", misaligned))
    shapes, order = program_indexes(refined)
    slowdowns, unfolding = fold_verdict(refined, plans, mode, efficiency, faults, shapes, order)
    if unfolding is not None:
        return GivenUp(kind, len(refined.ranks), unfolding, unordered=_unordered(order))
    return FoldedStep(refined, shapes, order, slowdowns, "", kind, classes)


def _classed_step(build: StepBuilder, program: StepProgram, plans: PlanCache, mode: NetworkMode,
                  efficiency: Mapping[str, float], faults: StepFaultPlan, shapes: CollectiveShapes,
                  order: ProgramOrder, guard: UnfoldingGuard | None = None) -> FoldedStep | GivenUp | None:
    """The step folded with one representative per class of ranks (engine/rank_classes.py) where the folded
    ``program``'s ranks are not all alike and every class-mate keeps pace with its representative
    (`unlike_class_mates`) and the classed program passes `fold_verdict`; None where they are
    all alike, the classed fold given up (`GivenUp`) where the check refuses it (the
    program with one rank per stage is then judged as before, and the lockstep check guards it after the run:
    the classed program's representatives of one stage have no order between their ops, so the check of
    unequal traffic sees more collectives that may overlap and can refuse a classed step whose single fold
    keeps pace, as on the DeepSeek search's FSDP layouts). ``guard`` hears of the classed fold, with the ranks it
    simulates, before its program is built (scale.refuse_unfolded refuses it beyond the limits: one rank per tray
    of a GB200 job of 47 racks is ~23 M ops and flows at 80 layers)."""
    classes = rank_classes(program, plans, shapes, order)
    if classes is None:
        return None
    assert program.layout is not None
    ranks = len(representatives(program.layout, True, classes))
    unlike = unlike_class_mates(program, classes, shapes, order, plans, efficiency)
    if unlike:
        return GivenUp("classes", ranks, Unfolding("collectives", unlike))
    if guard is not None:
        guard(Unfolding("classes", CLASSED_BY_NVLINK_LOADS, ranks))
    classed = build(True, classes)
    misaligned = misaligned_copy(classed, classes)
    if misaligned:
        return GivenUp("classes", len(classed.ranks), Unfolding("aligned", misaligned))
    classed_shapes, classed_order = program_indexes(classed)
    slowdowns, unfolding = fold_verdict(classed, plans, mode, efficiency, faults, classed_shapes, classed_order)
    if unfolding is not None:
        return GivenUp("classes", len(classed.ranks), unfolding, unordered=_unordered(classed_order))
    return FoldedStep(classed, classed_shapes, classed_order, slowdowns, "", "classes", classes,
                      stage_fold=StageFold(program, shapes, order))


def misaligned_copy(program: StepProgram, classes: RankClasses) -> str:
    """Why ``program``, folded by ``classes``, is not exact because one of its groups or kept mirrors holds ranks
    that the folded collective does not time as they are timed unfolded ('' where none does). A simulated group
    waits for its simulated members only (program/ops.py), so a member whose class's representative in its stage
    is outside the group is not waited for (`folding.unheld_representative`): HSDP on two hosts (PP 2 x DP 8,
    shards of 4 DP ranks a host) with GPU 10 x2 left the slow GPU's shard group, GPUs 8 to 14, waiting for GPU
    10 alone (the others' representative is GPU 0): folded without this check, its DP communication is 25.1
    against 27.1 ms unfolded. A mirror is kept by the class of its lowest rank alone (`class_images`) and starts
    with its group, so the lockstep check after the run, which compares the copies' ends, cannot see one whose
    ranks span other classes than its group's (`folding.unlike_images`): with GPU 2 x2 instead, the other host's
    shard group mirrored the slow GPU's, with the same error. Each group is read once by value, and each group's
    mirrors once by the group's value and the mirrors' identity (the builder shares one tuple of mirrors among a
    group's collectives; the group tuples are built anew): on the SC21 145.6B row's refold by hops, 56 pairs,
    0.03 s of its 5.6 s of CPU."""
    layout = program.layout
    assert layout is not None, "a program folded by classes has a layout"
    groups: dict[tuple[int, ...], CollectiveOp] = {}
    seen: set[tuple[tuple[int, ...], int]] = set()
    for op in program.ops:
        if not isinstance(op, CollectiveOp):
            continue
        groups.setdefault(op.group, op)
        if not op.mirrors or (op.group, id(op.mirrors)) in seen:
            continue
        seen.add((op.group, id(op.mirrors)))
        unlike = np.flatnonzero(unlike_images(layout, classes, op.group, op.mirrors))
        if unlike.size:
            image = op.mirrors[int(unlike[0])]
            theirs, own = (classes_of(layout, classes, copy).tolist() for copy in (image, op.group))
            return (f"{op.op} {op.name!r} over GPUs {list(op.group)} keeps the copy over GPUs {list(image)} as a "
                    f"mirror, whose ranks are of classes {theirs} where its group's are of {own}: the unfolded run "
                    "may ready that copy's ranks at other times than the group's, which a replay started with the "
                    "group cannot show")
    unheld = unheld_representative(layout, classes, list(groups))
    if unheld is None:
        return ""
    index, member, representative = unheld
    op = list(groups.values())[index]
    return (f"{op.op} {op.name!r} over GPUs {list(op.group)} holds GPU {member}, whose class's representative GPU "
            f"{representative} is outside the group: the folded collective does not wait for GPU {member}, which "
            "the unfolded run may ready at another time")


CLASSED_BY_NVLINK_LOADS = ("the ranks of a stage whose hosts' NVLink links carry unlike loads are simulated apart, "
                           "one rank per class (engine/rank_classes.py)")
"""Why `_classed_step` folds a step by classes of ranks: what its guard hears (`Unfolding` ``classes``)."""


def unlike_class_mates(stage_fold: StepProgram, classes: RankClasses, shapes: CollectiveShapes, order: ProgramOrder,
                       plans: PlanCache, efficiency: Mapping[str, float], apart: frozenset[int] = frozenset()) -> str:
    """Why a rank of some class would not keep pace with its representative in the step folded by ``classes``
    ('' when every one would), read off ``stage_fold`` (folded by stage, ``shapes`` its collectives, whose
    mirrors are every copy, ``order`` its ordering): `fold_verdict` compares each group of the classed program
    with the mirrors its class stands for, but a mate's copy that holds another class's representative is
    simulated as that one's group and compared with nothing, though the run times the mate as its own
    representative (order [dp, tp, cp, pp], cp 2, odd dp: a class held rank 0, whose CP pair stays inside its
    host, and rank 1, whose pair crosses hosts, and the step came out 0.4-1.6% off, reported exact). So each
    representative's copy of every collective (each collective apart: two over one group may differ in
    algorithm) is held to its mates' copies (`class_copies`) as to mirrors: their plans alone must take its
    time (`unlike_routes`), and a hand-off's must cross the same hops (`hop_signature`; the lockstep check after
    the run compares kept mirrors only, and a mate's copy held by another representative is none: with hosts 0
    and 3 of a stage in one class, one handing on inside its leaf group and the other across the spines, the
    classed run is refused before it runs, where it fell out of step after it, tests/test_fold_equivalence.py).
    Last, every copy must meet the unequal traffic (a tree's inner ranks and leaves) as the stage fold's
    representative does (`unequally_met`, the stage fold's own check): classes part ranks by their NVLink ring
    loads only (engine/rank_classes.py leaves the NICs' to engine/symmetry.py), and with tp 2, cp 2, dp 6 and
    tree collectives on six hosts of four GPUs every mate met it as its representative did, yet the classed
    step came out 9.3e-6 off (oversubscription 2; 3.4e-4 with two NICs per host in leaf groups of two),
    reported exact. Classed folds run on the flow model only (`folded_step`), so there is no analytic
    comparison here. Copies held wholly by ``apart`` (ranks each simulated as itself) are left out of that last
    check (`unequally_met`)."""
    layout = stage_fold.layout
    assert layout is not None
    topology = plans.topology
    mates = [replace(op, group=own, mirrors=copies) for op in shapes.firsts
             for own, copies in class_copies(layout, classes, (op.group, *op.mirrors))]
    for op in mates:
        hops = hop_signature(topology, op.group) if op.op == "send_recv" else []
        unlike = next((copy for copy in op.mirrors if hops and hop_signature(topology, copy) != hops), None)
        if unlike is not None:
            return (f"{op.op} {op.name!r} over GPUs {list(op.group)} crosses other hops than over "
                    f"{list(unlike)}, which a class-mate runs")
    capacity = effective_capacity(topology, dict(efficiency))
    return unlike_routes(plans, capacity, CollectiveShapes.of(mates)) or unequally_met(shapes, plans, order, apart)


def ranks_alone(layout: Layout, classes: RankClasses) -> frozenset[int]:
    """The ranks that ``classes`` simulate each as itself (a class of one stage position, in every stage)."""
    alone = [position for position, kind in enumerate(classes.of_position) if classes.of_position.count(kind) == 1]
    return frozenset(layout.stage_ranks(stage)[position] for stage in range(layout.pp) for position in alone)


def unfolded_step(build: StepBuilder, faults: StepFaultPlan, unfolding: Unfolding,
                  guard: UnfoldingGuard | None = None) -> FoldedStep:
    """The step ``build(False, None)`` makes, every rank simulated, for the reason ``unfolding`` gives (``guard``
    hears it first): a fold check failed before the run, or the folded run's mirrors fell out of step with
    their groups (engine/lockstep.py, after the run), which the checks before it cannot all foresee."""
    if guard is not None:
        guard(unfolding)
    program = build(False, None)
    shapes, order = program_indexes(program)
    return FoldedStep(program, shapes, order, faults.slowdown_of(), unfolding.reason, None)
