"""Whether a folded run's mirrors kept pace with their groups: the certificate that the folded step is the
unfolded one.

A folded collective runs its group's plan and each kept mirror's plan at once and ends when the last of them
does (collectives/execute.py `run_plans`); the unfolded run ends each group's copy on its own. So the two runs
agree as long as every mirror's plan ends when its group's does: the mirrors then stand for lanes that start
every collective when the representative does, which is the unfolded run's trajectory, flow for flow. The
checks before the run (engine/symmetry.py) compare each collective with its mirrors alone and against the
unequal traffic that may overlap it; they cannot see a lane whose flows meet another collective's (or their
own mirrors') flows on an uplink that the representative's do not, as when two GPUs share a NIC and their
flows hash onto the spines unevenly. The run can: a mirror that ended later held the representative back,
where an unfolded lane would not have waited, and one that ended sooner would have gone on sooner. This reads
the ends off the event log after the run. It sees only the copies the run simulated: a collective whose copies
may end apart (`copies_apart`: other hops, or copies that meet one another on a link) is never replayed without
its mirrors (engine/sharing.py). A run whose fold is given up if its mirrors fall out of step is watched as it
goes instead (`LockstepWatch`, by the same rule on the same ends) and stops at the first instance out of step:
what the rest would show is thrown away.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import overload

import numpy as np

from simulator.collectives.names import Primitive
from simulator.engine.plans import PlanCache
from simulator.engine.sharing import Mirrors
from simulator.metrics.events import EventLog
from simulator.program.ops import CollectiveOp, Op
from simulator.topology.graph import Topology
from simulator.units import counted, durations_apart, format_seconds

IN_STEP = 1e-9
"""Relative difference of two plans' ends below which they ended together (float rounding of a differently
ordered max-min solve)."""

KEYS = 1 << 24
"""Plan indices per key when (key, plan) pairs are packed into one integer: a collective has far fewer mirrors."""


@overload
def ended_apart(latest: float, earliest: float) -> bool: ...
@overload
def ended_apart(latest: np.ndarray, earliest: np.ndarray) -> np.ndarray: ...
def ended_apart(latest: float | np.ndarray, earliest: float | np.ndarray) -> bool | np.ndarray:
    """Whether plans (or instances, element by element) that ended at ``earliest`` and ``latest`` ended apart:
    further apart than `IN_STEP` of the later end. The one rule of the check after the run and the watch."""
    return latest - earliest > IN_STEP * latest


@dataclass(frozen=True)
class OutOfStep:
    """The first collective instance of a kind whose mirrors ended apart in a folded run, with the figures that
    say how far the run may be from exact: when its plans ended (first and last), how many instances of the kind
    ended apart and the widest gap between the ends of one instance's plans; or, where the run stopped at it
    (`LockstepWatch`: its fold certainly given up), that instance alone (``instances`` 1, ``widest_s`` its own
    gap) and when the run stopped."""

    op: Primitive
    name: str
    group: tuple[int, ...]
    earliest_s: float
    latest_s: float
    instances: int
    widest_s: float
    copies: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    """The copies (the group or a kept mirror) that ended first and last in that instance."""
    links: tuple[int, int] | None = None
    """How many links each of ``copies`` crosses, for a hand-off (`hop_signature`); None for other collectives."""
    stopped_at_s: float | None = None
    """The simulated time at which the run stopped, at this instance's end; None where it ran to its end."""
    detours: bool = False
    """Whether the run had links down, its flows to or from the hosts near them detoured (the links fold,
    fold_policy.link_fault_step): its copies then end apart by the detours, not by the lanes of a stage."""
    ends: tuple[tuple[tuple[int, ...], float], ...] = ()
    """Where the run stopped at it, each copy that sent (the group, then each kept mirror) and when its plan ended
    (engine/refold_evidence.py); empty otherwise."""
    members: tuple[int, ...] = ()
    """Where the run stopped at it, the ids of its ops (one per simulated member); empty otherwise."""

    @property
    def hand_off(self) -> bool:
        """Whether it is a pipeline hand-off (a send/recv), which refolds are made for."""
        return self.op == "send_recv"

    def reason(self) -> str:
        """The sentence a summary's fold reasons give (`fold_off_reason` and the refolds' keys): the instance, when
        its copies ended (as many digits as tell the two apart, units.py `durations_apart`), and what differs."""
        earliest, latest = durations_apart(self.earliest_s, self.latest_s)
        found = (f"the run stopped there, its first instance out of step, by {format_seconds(self.widest_s)}"
                 if self.stopped_at_s is not None else
                 f"{counted(self.instances, 'instance')} out of step, by up to "
                 f"{format_seconds(self.widest_s)}")
        return (f"{self.op} {self.name!r} over GPUs {list(self.group)} ended on its mirrors between {earliest} and "
                f"{latest} in the folded run ({found}): {self._cause()}")

    def _cause(self) -> str:
        """What made the copies end apart: for a hand-off, the routes its copies take in other replicas (other
        hops, or the same hops under other flows); for another collective, the detours around links down, or
        else the loads the lanes of a stage met."""
        first, last = (list(copy) for copy in self.copies)
        if self.links is None and self.detours:
            return ("its copies met the detours around the links down unlike (each detour is one of the shortest "
                    "paths, picked by a hash of its ends), so one rank cannot stand for its class")
        if self.links is None:
            return ("the lanes of a stage met the fabric's traffic unlike (as flows hashed onto the spines unevenly, "
                    "or a ring that runs the other way round through every other host), so one rank cannot stand "
                    "for its stage")
        if self.links[0] != self.links[1]:
            return (f"its copy over GPUs {first} crosses {self.links[0]} links and the one over {last} "
                    f"{self.links[1]}: the replicas' hand-offs take routes of other hops (as one inside a leaf group "
                    "and one across the spines), so one rank cannot stand for both")
        return (f"its copies over GPUs {first} and {last} cross as many links ({self.links[0]}) but met other flows "
                "on them (the fabric hashes each flow onto a spine by its hosts, their rails' difference and its "
                "channel), so one rank cannot stand for both")

    def figures(self) -> dict:
        """Its figures as summary.json holds them (seconds): ``stopped_at_s`` in place of ``instances`` where the
        run stopped at it."""
        found = ({"instances": self.instances} if self.stopped_at_s is None
                 else {"stopped_at_s": self.stopped_at_s})
        return {"op": self.op, "name": self.name, "group": list(self.group),
                "ended_s": [self.earliest_s, self.latest_s], **found, "widest_s": self.widest_s}


@dataclass(frozen=True)
class Lockstep:
    """Why a folded run's mirrors fell out of step with their groups, '' where none did: for the collectives
    other than pipeline hand-offs (``collectives``), and for the hand-offs (``hand_offs``), which fold unless
    the step can be afforded unfolded (simulation.py): a hand-off's mirrors out of step was found in the
    published long-context case, which unfolded is far beyond the scale limits."""

    collectives: str = ""
    hand_offs: str = ""
    hand_offs_within_lanes: bool = False
    """Whether some hand-off's copies in one CP lane (of those the caller named) ended apart, in the run or, for
    a run the watch stopped, in the instance it stopped at: one rank per lane would then hold copies that met the
    fabric unlike to one representative, as the stage fold did."""
    apart: tuple[OutOfStep, ...] = ()
    """The first instance out of step of each kind that fell out of step, other collectives before hand-offs:
    the figures behind ``collectives`` and ``hand_offs``."""


class StoppedOutOfStep(Exception):
    """Raised from a watched run (`LockstepWatch`) at the end of its first collective instance out of step,
    where its fold is then given up whatever the rest would show: the engine ends the run there."""

    def __init__(self, kept_pace: Lockstep):
        super().__init__(kept_pace.collectives or kept_pace.hand_offs)
        self.lockstep = kept_pace


@dataclass
class LockstepWatch:
    """The lockstep check (`lockstep`) during a folded run, instance by instance as each collective with kept
    mirrors ends, for a run whose fold is given up if they fall out of step (a refold's, or a first fold's that
    may unfold: simulation.py): at the first instance out of step it asks ``stops`` (``found``: that instance's
    figures) and, where told to, raises `StoppedOutOfStep` to end the run there, since what the rest would
    show is thrown away; else it watches no more and the check after the run reports the whole run. Each plan's
    end is its last flow's, the one the log reads (collectives/execute.py ``ends``), so it finds an instance out
    of step exactly where the check after the run would. ``lanes``: each GPU's CP lane, as `lockstep` takes."""

    topology: Topology
    stops: Callable[[OutOfStep], bool]
    lanes: np.ndarray | None = None
    detours: bool = False
    """Whether the run has links down (`OutOfStep.detours`)."""
    watching: bool = True

    def ended(self, members: Mapping[int, CollectiveOp], mirrors: Mirrors, ends: Sequence[float | None],
              now: float) -> None:
        """A collective instance ended ``now`` (``members``: its ops by rank), its plans (its group's, then each
        kept mirror's) at ``ends`` (None: one that sent nothing); stop the run where they ended apart and
        ``stops`` says so. The instance is named by its lowest rank's op, the first of the program's (its ops go
        rank by rank), as `lockstep` names it."""
        sent = [end for end in ends if end is not None]
        if len(sent) < 2:
            return
        latest, earliest = max(sent), min(sent)
        if not ended_apart(latest, earliest):
            return
        self.watching = False
        op = members[min(members)]
        copies = (op.group, *mirrors)
        timed = [(end, copies[index]) for index, end in enumerate(ends) if end is not None]
        ended = (min(timed, key=itemgetter(0))[1], max(timed, key=itemgetter(0))[1])
        hand_off = op.op == "send_recv"
        links = (len(hop_signature(self.topology, ended[0])), len(hop_signature(self.topology, ended[1]))
                 ) if hand_off else None
        found = OutOfStep(op.op, op.name, op.group, earliest, latest, 1, latest - earliest, ended, links, now,
                          self.detours, tuple((copy, end) for end, copy in timed),
                          tuple(member.id for member in members.values()))
        if not self.stops(found):
            return
        within = hand_off and self.lanes is not None and _apart_in_a_lane(timed, self.lanes)
        reason = found.reason()
        raise StoppedOutOfStep(Lockstep("" if hand_off else reason, reason if hand_off else "", within, (found,)))


def _apart_in_a_lane(timed: Sequence[tuple[float, tuple[int, ...]]], lanes: np.ndarray) -> bool:
    """Whether two of one instance's hand-off copies (``timed``: each plan's end and copy) sent from one CP
    lane (its sender's) ended apart: `_apart_within` over that one instance."""
    ends = np.array([end for end, _ in timed])
    lane = np.array([lanes[copy[0]] for _, copy in timed])
    return _apart_within(ends, np.zeros(len(timed), dtype=np.int64), lane)


def lockstep(log: EventLog, ops: Sequence[Op], mirrors: Mapping[int, Mirrors], topology: Topology,
             lanes: np.ndarray | None = None, detours: bool = False) -> Lockstep:
    """Whether every kept mirror (``mirrors`` by op id) of the folded run logged in ``log`` ended each
    collective's plan when its group did, by the flows the log holds (a replica quotient logs the first
    replicas' flows only; the others are exact images); per kind, the first collective (in the log's order of
    keys) that did not, with how many instances did not and by how much at most (the widest gap between the
    ends of one instance's plans), so that a warning says how far the folded run may be from exact. A pipeline
    send/recv is held to it by every kept mirror, those whose hand-off takes other hops too (routed inside a
    leaf group in one replica and across the spines in another, which the checks before the run let pass,
    engine/symmetry.py): they end apart, and the step folds again with each replica's hosts classed by their
    hand-offs' hops (engine/rank_classes.py), or unfolds, or stands with a warning (simulation.py).
    ``lanes``: each GPU's CP lane, where the run's layout has several, to say whether copies of one lane ended
    apart; ``detours``: whether the run had links down (`OutOfStep.detours`)."""
    numbers: dict[tuple[int, tuple[int, ...], bool], int] = {}
    sets: list[tuple[CollectiveOp, Mirrors]] = []
    of_key: dict[str, int] = {}
    op_of: dict[str, CollectiveOp] = {}
    for op in ops:
        kept = mirrors.get(op.id)
        if kept and isinstance(op, CollectiveOp) and op.key not in of_key:
            number = numbers.setdefault((id(kept), op.group, op.op == "send_recv"), len(sets))
            if number == len(sets):
                sets.append((op, kept))
            of_key[op.key] = number
            op_of[op.key] = op
    if not of_key:
        return Lockstep()
    codes, keys = log.flow_keys()
    found = log.flow_columns(("src", "end_s"))
    src, end = found["src"], found["end_s"]
    of_row = np.array([of_key.get(key, -1) for key in keys] or [-1], dtype=np.int64)[codes]
    plan = np.full(codes.size, -1, dtype=np.int64)
    for number, (op, kept) in enumerate(sets):
        rows = np.flatnonzero(of_row == number)
        if rows.size:
            plan[rows] = _plan_lookup(op, kept, topology)[src[rows]]
    compared = np.flatnonzero(plan >= 0)
    order = compared[np.lexsort((plan[compared], codes[compared]))]
    starts = np.flatnonzero(np.diff(codes[order] * KEYS + plan[order], prepend=-1))
    if not starts.size:
        return Lockstep()
    ends = np.maximum.reduceat(end[order], starts)
    key_of = codes[order][starts]
    bounds = np.flatnonzero(np.diff(key_of, prepend=-1))
    latest, earliest = np.maximum.reduceat(ends, bounds), np.minimum.reduceat(ends, bounds)
    apart = np.flatnonzero(ended_apart(latest, earliest))
    first: dict[bool, int] = {}
    count: dict[bool, int] = {False: 0, True: 0}
    widest: dict[bool, float] = {False: 0.0, True: 0.0}
    for index in apart.tolist():
        hand_off = op_of[keys[key_of[bounds[index]]]].op == "send_recv"
        first.setdefault(hand_off, index)
        count[hand_off] += 1
        widest[hand_off] = max(widest[hand_off], float(latest[index] - earliest[index]))
    within = False
    if lanes is not None and True in first:
        sends = np.array([key in op_of and op_of[key].op == "send_recv" for key in keys])[key_of]
        within = _apart_within(ends[sends], key_of[sends], lanes[src[order][starts]][sends])
    apart_of: dict[bool, OutOfStep] = {}
    plan_of = plan[order][starts]
    for hand_off, index in sorted(first.items()):
        key = keys[key_of[bounds[index]]]
        op, kept = op_of[key], sets[of_key[key]][1]
        instance = slice(bounds[index], bounds[index + 1] if index + 1 < len(bounds) else len(ends))
        copies = (op.group, *kept)
        ended = (copies[plan_of[instance][np.argmin(ends[instance])]],
                 copies[plan_of[instance][np.argmax(ends[instance])]])
        links = (len(hop_signature(topology, ended[0])), len(hop_signature(topology, ended[1]))) if hand_off else None
        apart_of[hand_off] = OutOfStep(op.op, op.name, op.group, float(earliest[index]), float(latest[index]),
                                       count[hand_off], widest[hand_off], ended, links, detours=detours)
    reasons = {hand_off: found.reason() for hand_off, found in apart_of.items()}
    return Lockstep(reasons.get(False, ""), reasons.get(True, ""), within, tuple(apart_of.values()))


def _apart_within(ends: np.ndarray, key_of: np.ndarray, lane: np.ndarray) -> bool:
    """Whether two plans of one instance (``key_of``) sent from one ``lane`` ended apart, of the plans'
    ``ends`` (a plan's lane is its sender's)."""
    pairs, which = np.unique(np.column_stack((key_of, lane)), axis=0, return_inverse=True)
    latest, earliest = np.full(len(pairs), -np.inf), np.full(len(pairs), np.inf)
    np.maximum.at(latest, which.ravel(), ends)
    np.minimum.at(earliest, which.ravel(), ends)
    return bool(ended_apart(latest, earliest).any())


def _plan_lookup(op: CollectiveOp, kept: Mirrors, topology: Topology) -> np.ndarray:
    """Per GPU, the index of the plan it sends in: 0 for ``op``'s group, i for its i-th kept mirror, -1 for a
    GPU in none."""
    lookup = np.full(topology.num_gpus, -1, dtype=np.int64)
    for index, group in enumerate((op.group, *kept)):
        lookup[np.array(group, dtype=np.int64)] = index
    return lookup


def hop_signature(topology: Topology, pair: tuple[int, ...]) -> list[tuple[float, str]]:
    """The hops the hand-off from ``pair[0]`` to ``pair[-1]`` crosses (`Topology.hop_signature`)."""
    return topology.hop_signature(pair[0], pair[-1])


def copies_apart(plans: PlanCache, op: CollectiveOp, mirrors: Mirrors) -> bool:
    """Whether a copy of ``op`` over one of its kept ``mirrors`` may end at another time than its group's in the
    run: a hand-off one of whose mirrors crosses other hops (`hop_signature`), so takes another time alone, or
    mirrors that share a link with one another, so slow one another where the group's plan meets neither
    (six DGX H100 hosts in leaf groups of three, tp 1, pp 16, dp 3: replicas 1 and 2 hand stage 7 on to stage
    8 over one spine's downlink at half the time of replica 0's). Such an op is never replayed without its
    mirrors (engine/sharing.py `private_collectives`), so that this certificate compares them."""
    table = plans.link_table(op, mirrors)
    if np.unique(table.links).size < table.links.size:
        return True
    if op.op != "send_recv":
        return False
    own = hop_signature(plans.topology, op.group)
    return any(hop_signature(plans.topology, mirror) != own for mirror in mirrors)
