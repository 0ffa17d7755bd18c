"""Why a step asked to fold runs unfolded, told before the unfolded program is built: the check that found it
(the step's plan, the cluster, the collectives' symmetry on the flow model, the step's faults) and its reason,
which the summary reports as `fold_off_reason`. The caller's guard (scale.refuse_unfolded) may refuse the run
there, before a program of every GPU takes minutes or memory that the folded estimate did not count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

FoldCheck = Literal["plan", "copies", "cluster", "stages", "collectives", "faults", "changing", "near", "links",
                    "hops", "size", "untried", "classes", "ended", "aligned"]
"""The check that unfolds a step: the plan's ranks of a stage doing different work
(`parallel/program.plan_fold_blocker`), a replicated trace's copies whose own traffic meets the cluster unlike the
traced ranks' (`workload/traces/program._copies_unlike`), the cluster (`engine/fold_policy.fold_blocker`), its pipeline
hand-offs over NVLink in one replica and over the NICs in another (``stages``, `engine/symmetry.UnalignedHandOff`), its
collectives on the flow model (`engine/symmetry.py`), the step's faults (`engine/fold_policy.fold_with_faults`:
``changing`` where link faults change mid-step) or, under links down or degraded unevenly from its start, the stage fold
given up for the ranks near them (``near``) and their fold's classes holding one rank each (``links``,
`engine/fold_policy.link_fault_step`); or that leaves a folded step standing not exact: on the analytic model, hand-offs
whose replicas' copies cross other hops (`engine/fold_policy.unlike_hand_off_hops`); or a refold beyond the refold
budget, tried where the step may not unfold (`RefoldBudget`), or not proposed there (``untried``: route classes finer
than by hops, `engine/fold_policy.route_steps`); or ``classes``: the step folded by classes of ranks whose NVLink loads
differ (`engine/fold_policy._classed_step`), told with the ranks it simulates; or ``ended``: a refold whose class-mates'
copies of a hand-off end apart in the unfolded run, as a refold that kept pace shows (`engine/refold_evidence.refuted`),
given up unrun; or ``aligned``: a fold by classes with a group that holds a rank whose class's representative is outside
it, or that keeps a mirror whose ranks span other classes than its group's (`engine/fold_policy.misaligned_copy`), given
up unrun."""


@dataclass(frozen=True)
class Unfolding:
    """Why a step asked to fold runs unfolded: the check that failed and its reason (`fold_off_reason`)."""

    check: FoldCheck
    reason: str
    ranks: int | None = None
    """The ranks the step then simulates where it runs folded by classes (check ``classes``); None where it
    runs unfolded, every rank."""
    shares_links: bool = False
    """Whether the reason is stragglers in one replica whose traffic shares links with the other replicas'
    (engine/fold_policy.py `SHARED_LINKS`): the stage fold is then refolded by the slow replica's classes with every
    mirror kept (`straggler_step`) rather than unfolded."""


UnfoldingGuard = Callable[[Unfolding], None]
"""Told of an unfolding before the unfolded program is built, and of a fold by classes before its program is built
(`Unfolding.ranks`); raises to refuse the run."""

RefoldBudget = Callable[[int], str]
"""Why a refold of a step that may not run unfolded, simulating the given number of ranks, is too large to run
(scale.refold_refusal: its estimate beyond the limits), '' where it may run."""
