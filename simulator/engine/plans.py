"""One cache of collective plans per run, shared by the link-sharing analysis, validation and the engine, so
each distinct collective (op, group, size, root, algorithm) is planned once."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from simulator.collectives.chunking import ChunkSetting
from simulator.collectives.execute import ParsedPhases
from simulator.collectives.names import POINT_TO_POINT, AlgorithmChoice, AlgorithmName, ProtocolChoice, run_choice
from simulator.collectives.phases import TRANSFER_ENDS, CollectiveRequest, Phase
from simulator.collectives.registry import plan_collective, resolve_weighing
from simulator.collectives.tuner import Choice, Weighing
from simulator.engine.shapes import CollectiveShapes, plan_key
from simulator.metrics.events import FlowBlock
from simulator.network.model import AnalyticTimings
from simulator.network.modes import NetworkMode
from simulator.program.ops import CollectiveOp, Op
from simulator.topology.graph import Topology
from simulator.topology.periods import NO_IMAGE, Periods

LOADED_BEYOND_SENT: frozenset[AlgorithmName] = frozenset({"nvls", "nvls_sharp"})
"""The algorithms whose flows carry more than their GPUs send (`Transfer.sent_share` below 1: NVLS's load at
its in-switch efficiency, collectives/nvls.py)."""


@dataclass(frozen=True)
class LinkTable:
    """Link sets as arrays: set i has ``sizes[i]`` links, laid end to end in ``links``. Sets of one class
    (``classes[i]``) are translates of one another's plan, transfer for transfer onto links alike; ``first_of``
    names the class of each group in the first periods whose translates some sets are (the sets of a class
    that failed its check are classes of their own and are not named)."""

    sizes: np.ndarray
    links: np.ndarray
    classes: np.ndarray
    first_of: dict[tuple[int, ...], int]


class PlanCache:
    """Plans collectives on ``topology`` with the run's defaults: the algorithm and the protocol for ops that say
    `auto`, the pipelining chunk and the channel count, whether all-to-alls use PXN (``pxn``), and the per-class
    link ``efficiency`` the run's network applies, by which `auto` weighs its candidates. Plans are cached by what
    they depend on, the message size included, since `auto` picks different algorithms (and links) and protocols
    for small and large messages."""

    def __init__(self, topology: Topology, *, algorithm: AlgorithmChoice = "auto", chunk_bytes: ChunkSetting = None,
                 channels: int = 0, efficiency: Mapping[str, float] | None = None, protocol: ProtocolChoice = "auto",
                 pxn: bool = True):
        self.topology = topology
        self.pxn = pxn
        self.default_algorithm = algorithm
        self.default_protocol = protocol
        self.chunk_bytes = chunk_bytes
        self.channels = channels
        self.efficiency = efficiency
        self._weighings: dict[tuple, Weighing | None] = {}
        """What `auto` weighed for each collective when `resolved` last chose for it, kept across `_forget`: a
        collective chosen for again on degraded links has the weighing of its new choice, one not asked for
        since keeps the weighing of its choice on the links of before."""
        self._forget()

    def _forget(self) -> None:
        """Start afresh on the topology's bandwidths as they stand: what is kept below was chosen, planned and
        timed on them."""
        self._bandwidth_version = self.topology.bandwidth_version
        self._phases: dict[tuple, list[Phase]] = {}
        self._links: dict[tuple, frozenset[int]] = {}
        self._pair_links: dict[tuple[int, ...], frozenset[int]] = {}
        self._choices: dict[tuple, Choice] = {}
        self._periods: Periods | None = None
        self._periods_found = False
        self._tables: dict[tuple, tuple[tuple, LinkTable]] = {}
        self._sized_tables: dict[tuple, tuple[tuple, LinkTable]] = {}
        self.parsed = ParsedPhases()
        """The phases' items and `Transfers`, which every run's plan runner on this cache shares (no replica
        quotient: that keeps only some sources' items)."""
        self.analytic = AnalyticTimings()
        """The analytic model's timings of those `Transfers` on this cache's topology and efficiency, which
        every run's network on them shares (until its capacities or routes change)."""
        self._alone: dict[tuple[int, str], tuple[list[Phase], float, FlowBlock]] = {}

    def _current(self) -> None:
        """Forget what was kept if the topology was degraded since (`Topology.degrade`): `auto`'s choices, the
        plans, the periods and the timings were made on the bandwidths of before."""
        if self._bandwidth_version != self.topology.bandwidth_version:
            self._forget()

    def alone(self, mode: NetworkMode, timed: Callable[[list[Phase]], tuple[float, FlowBlock]], phases: list[Phase]
              ) -> tuple[float, FlowBlock]:
        """``timed(phases)`` (a plan of this cache run on an otherwise idle network of its topology and
        efficiency under the network ``mode``: its duration and flow rows, `simulation.run_alone`) once per plan
        and mode for every run on this cache: a job's straggler states each timed their private collectives
        alone again (~0.05 s a state)."""
        self._current()
        key = (id(phases), mode)
        known = self._alone.get(key)
        if known is None:
            known = self._alone[key] = (phases, *timed(phases))
        return known[1], known[2]

    def _request(self, op: CollectiveOp, group: tuple[int, ...]) -> CollectiveRequest:
        return CollectiveRequest(op=op.op, ranks=group, nbytes=op.nbytes, root=op.root,
                                 chunk_bytes=self.chunk_bytes, channels=self.channels, pair_bytes=op.pair_bytes,
                                 pxn=self.pxn)

    @staticmethod
    def key(op: CollectiveOp, group: Hashable) -> tuple:
        """`plan_key` with ``op``'s own pair sizes: ``group`` the member tuple or its dense id."""
        return plan_key(op, group, op.pair_bytes)

    def resolved(self, op: CollectiveOp, group: tuple[int, ...]) -> Choice:
        """The concrete algorithm and protocol for ``op`` over ``group``: its own, else the run's defaults (a
        collective's: a send_recv takes its own alone, being point to point), what is `auto` chosen by size and
        topology (once per shape)."""
        self._current()
        key = self.key(op, group)
        resolved = self._choices.get(key)
        if resolved is None:
            resolved, self._weighings[key] = resolve_weighing(self._request(op, group), self.topology,
                                                              *self._asked(op), self.efficiency)
            self._choices[key] = resolved
        return resolved

    def _asked(self, op: CollectiveOp) -> tuple[AlgorithmChoice, ProtocolChoice]:
        """The algorithm and protocol ``op`` asks for: its own, else the run's defaults (a send_recv takes its own
        alone, being point to point)."""
        collective = op.op != "send_recv"
        return (run_choice(op.algorithm, self.default_algorithm if collective else "auto"),
                run_choice(op.protocol, "auto" if op.op in POINT_TO_POINT else self.default_protocol))

    def weighing(self, op: CollectiveOp, group: tuple[int, ...]) -> Weighing | None:
        """What `auto` weighed when `resolved` picked the algorithm and protocol for ``op`` over ``group``: the
        candidates' estimates and the pick (tuner.py `weighed`), as the links stood then (weighed again now, a
        run's faults would have moved them, and its detours counted again); None where nothing was weighed (a
        point-to-point op, an all_to_all left to `auto`, an algorithm and protocol given) or nothing chosen."""
        return self._weighings.get(self.key(op, group))

    def resolved_algorithm(self, op: CollectiveOp, group: tuple[int, ...]) -> AlgorithmName:
        """The algorithm of `resolved`."""
        return self.resolved(op, group).algorithm

    def phases(self, op: CollectiveOp, group: tuple[int, ...]) -> list[Phase]:
        """The phases of ``op`` over ``group`` (planned on first use)."""
        self._current()
        key = self.key(op, group)
        phases = self._phases.get(key)
        if phases is None:
            algorithm, protocol = self.resolved(op, group)
            phases = self._phases[key] = plan_collective(self._request(op, group), self.topology, algorithm,
                                                         protocol=protocol)
        return phases

    def mirrored_phases(self, op: CollectiveOp, mirrors: tuple[tuple[int, ...], ...]) -> list[list[Phase]]:
        """The plans of ``op`` over its group and each of its (kept) ``mirrors``, in that order: a new list each
        call (the engine keeps one per collective shape)."""
        return [self.phases(op, group) for group in (op.group, *mirrors)]

    def send_excess(self, op: CollectiveOp) -> dict[int, float] | None:
        """Per member of ``op``'s group, the bytes a member sends in its plan on average less what that member
        sends; None where every member sends alike (a ring), not for a tree's inner ranks and leaves or a skewed
        all-to-all. A folded run adds it to its representative's flows to report the mean over the GPUs, as an
        unfolded run does (its mirror groups are images of the group)."""
        sent: dict[int, float] = dict.fromkeys(op.group, 0.0)
        for phase in self.phases(op, op.group):
            for t in phase.transfers:
                sent[t.src] += t.nbytes * phase.repeat
        if min(sent.values()) == max(sent.values()):
            return None
        mean = sum(sent.values()) / len(sent)
        return {rank: mean - own for rank, own in sent.items()}

    def unsent_bytes(self, op: CollectiveOp) -> dict[int, float] | None:
        """Per member of ``op``'s group, the bytes its flows carry beyond what that member really sends
        (`Transfer.sent_share`: NVLS's load at its in-switch efficiency, the flags of LL and LL128); None where the
        flows carry what is sent. Only the NVLS plans and the plans under LL or LL128 load their flows beyond
        what is sent, so no other plan is scanned."""
        algorithm, protocol = self.resolved(op, op.group)
        if algorithm not in LOADED_BEYOND_SENT and protocol == "simple":
            return None
        unsent: dict[int, float] = dict.fromkeys(op.group, 0.0)
        for phase in self.phases(op, op.group):
            for t in phase.transfers:
                if t.sent_share != 1.0:
                    unsent[t.src] += t.nbytes * (1.0 - t.sent_share) * phase.repeat
        return unsent if any(unsent.values()) else None

    def copies_meet(self, op: CollectiveOp) -> bool:
        """Whether the plan of any of ``op``'s copies (`CollectiveOp.copies`) crosses a link its own plan crosses:
        where the analytic model shares the links among them."""
        own = self.links(op, op.group)
        return bool(own) and not all(own.isdisjoint(self.links(op, copy)) for copy in op.copies)

    def links(self, op: CollectiveOp, group: tuple[int, ...]) -> frozenset[int]:
        """The directed links the plan of ``op`` over ``group`` uses; they depend on the size only through the
        algorithm, so they are cached per algorithm. A send/recv is one transfer on channel 0 whatever the
        algorithm (`plan_collective`), so its links are its route, found without planning it: folded mirrors
        of pipeline transfers are most of the link sets a large run asks for."""
        if op.op == "send_recv":
            return self._route_links(group) if op.nbytes else frozenset()
        key = (op.op, group, op.root, self.resolved_algorithm(op, group), bool(op.nbytes))
        links = self._links.get(key)
        if links is None:
            routes = self.topology.paths(map(TRANSFER_ENDS, chain.from_iterable(
                phase.transfers for phase in self.phases(op, group))))
            links = self._links[key] = frozenset(chain.from_iterable(routes))
        return links

    def _route_links(self, pair: tuple[int, ...]) -> frozenset[int]:
        links = self._pair_links.get(pair)
        if links is None:
            links = self._pair_links[pair] = frozenset(self.topology.path(pair[0], pair[1]))
        return links

    def link_table(self, op: CollectiveOp, groups: tuple[tuple[int, ...], ...]) -> LinkTable:
        """The links of ``op``'s plan over each of ``groups`` (its mirrors), as `links` gives them, in one table.
        A group translated by whole periods of the fabric's spine hash (another data-parallel replica's mirror,
        topology/periods.py) uses the image of its translate's links in the first periods: those are found
        once and moved by the translations as arrays, without planning or routing the translates. Tables are
        kept by the group tuple's identity, whether anything is sent, and the algorithm every group resolves
        to (a size at which `auto` picks other algorithms for some groups gets a table of its own); and found
        again by the op's shape without resolving those algorithms (each call for a table's groups asks for it
        at several sizes, and the sharing analysis asks for every shape's)."""
        shape = self.key(op, id(groups))
        known = self._sized_tables.get(shape)
        if known is not None:
            return known[1]
        periods = self.translations()
        members = np.array(groups, dtype=np.int64).reshape(len(groups), -1)
        firsts_of, shifts = (periods.split(members) if periods is not None
                             else (members, np.zeros(len(groups), dtype=np.int64)))
        index: dict[tuple[int, ...], int] = {}
        of_group = np.fromiter((index.setdefault(row, len(index)) for row in map(tuple, firsts_of.tolist())),
                               dtype=np.int64, count=len(groups))
        firsts = list(index)
        fixed = op.op == "send_recv" or run_choice(op.algorithm, self.default_algorithm) != "auto"
        algorithms = (self.resolved_algorithm(op, op.group),) if fixed else tuple(
            self.resolved_algorithm(op, group) for group in groups)
        key = (op.op, op.root, bool(op.nbytes), algorithms, id(groups))
        found = self._tables.get(key)
        if found is None:
            same = np.ones(len(groups), dtype=bool) if fixed else (
                np.array(algorithms) == np.array([self.resolved_algorithm(op, first) for first in firsts])[of_group])
            found = self._tables[key] = (groups, self._table(op, groups, firsts, of_group, shifts, same))
        self._sized_tables[shape] = found
        return found[1]

    def mirror_links(self, op: CollectiveOp, groups: tuple[tuple[int, ...], ...]) -> frozenset[int]:
        """The links of ``op``'s plans over all of ``groups`` together (its kept mirrors), from `link_table`."""
        return frozenset(self.link_table(op, groups).links.tolist()) if groups else frozenset()

    def _table(self, op: CollectiveOp, groups: tuple[tuple[int, ...], ...], firsts: list[tuple[int, ...]],
               of_group: np.ndarray, shifts: np.ndarray, same_algorithm: np.ndarray) -> LinkTable:
        """`link_table`'s table: each row its first-period translate's links moved by its shift. A row does
        not move (it is planned on its own, a class of its own) where its algorithm is not its translate's or
        a link has no image; nor does any row of a class whose furthest moved row differs from its own plan
        (`_misplaced`)."""
        first_links = [sorted(self.links(op, group)) for group in firsts]
        width = max(map(len, first_links), default=0)
        table = np.full((len(firsts), width), NO_IMAGE, dtype=np.int64)
        for row, links in zip(table, first_links):
            row[:len(links)] = links
        rows = table[of_group]
        periods = self.translations()
        moves = same_algorithm & (shifts > 0)
        if periods is not None:
            for shift in np.unique(shifts[moves]).tolist():
                chosen = np.flatnonzero(moves & (shifts == shift))
                rows[chosen] = periods.move(rows[chosen], shift)
        counts = (table >= 0).sum(axis=1)
        moved = moves & ((rows >= 0).sum(axis=1) == counts[of_group])
        for first in self._misplaced(op, groups, rows, moved, of_group, shifts, counts):
            moved &= of_group != first
        unmoved = np.flatnonzero((shifts > 0) & ~moved)
        classes = of_group.copy()
        classes[unmoved] = len(firsts) + unmoved
        if len(unmoved):
            rows[unmoved] = NO_IMAGE
            for index in unmoved.tolist():
                links = sorted(self.links(op, groups[index]))
                if len(links) > rows.shape[1]:
                    rows = np.pad(rows, ((0, 0), (0, len(links) - rows.shape[1])), constant_values=NO_IMAGE)
                rows[index, :len(links)] = links
        standing = set(classes.tolist())
        used = rows >= 0
        return LinkTable(used.sum(axis=1), rows[used], classes,
                         {first: index for index, first in enumerate(firsts) if index in standing})

    def _misplaced(self, op: CollectiveOp, groups: tuple[tuple[int, ...], ...], rows: np.ndarray, moved: np.ndarray,
                   of_group: np.ndarray, shifts: np.ndarray, counts: np.ndarray) -> list[int]:
        """The classes (by first-period translate) whose moved rows are not what planning and routing a moved
        group gives. The row moved furthest is planned on its own; only if it differs is the furthest row of
        every class: a route or plan that does not move with its group (a hash or planner that reads absolute
        positions) shows in the table's furthest translate at the cost of one plan per table."""
        def differs(row: int) -> bool:
            first = int(of_group[row])
            return self.links(op, groups[row]) != frozenset(rows[row, :counts[first]].tolist())

        candidates = np.flatnonzero(moved)
        if not len(candidates) or not differs(int(candidates[np.argmax(shifts[candidates])])):
            return []
        furthest = np.full(len(counts), -1, dtype=np.int64)
        np.maximum.at(furthest, of_group[candidates], shifts[candidates] * len(groups) + candidates)
        return [first for first, code in enumerate(furthest.tolist()) if code >= 0 and differs(code % len(groups))]

    def translations(self) -> Periods | None:
        """The fabric's translations by whole periods, None without a period or once routes changed (a fault:
        translates no longer route alike)."""
        self._current()
        if not self._periods_found:
            self._periods, self._periods_found = Periods.of(self.topology), True
        return None if self.topology.routes_version else self._periods


def auto_choices(shapes: CollectiveShapes, plans: PlanCache) -> list[dict]:
    """Why `auto` picked what ran, per kind of collective (its category, op and group size: groups of other sizes
    may pick otherwise, a model's 4-rank expert-data-parallel all-reduces beside its 16-rank data-parallel ones): at
    the kind's largest size among its collectives whose algorithm or protocol `auto` weighed (the first of that
    size; an all_to_all, run point to point, never is), the rule, the candidates' estimates and the pick, as
    weighed when chosen (`PlanCache.weighing`). Sorted by category, op and group size."""
    largest: dict[tuple[str, str, int], tuple[CollectiveOp, Weighing]] = {}
    for op in shapes.firsts:
        weighing = plans.weighing(op, op.group)
        kind = (op.category, op.op, len(op.group))
        known = largest.get(kind)
        if weighing is not None and (known is None or op.nbytes > known[0].nbytes):
            largest[kind] = op, weighing
    return [{"category": category, "op": name, "bytes": round(op.nbytes), "ranks": ranks, **weighing.report()}
            for (category, name, ranks), (op, weighing) in sorted(largest.items())]


def traffic_correction(ops: Sequence[Op], plans: PlanCache, shapes: CollectiveShapes | None = None,
                       weights: Mapping[int, int] | None = None) -> dict[str, float]:
    """Per category, the bytes to add to the simulated ranks' flows so that they count what every GPU really
    sends (summed over their collective ops, worked out once per collective shape; ``shapes``, the index of
    ``ops``' collectives, made here unless the caller has it): in a folded run, what a group's members send on
    average beyond the simulated rank's own share (`PlanCache.send_excess`; a group whose members are all
    simulated, as in an unfolded run, already counts every member's flows), less the load its flows carry
    beyond the bytes sent (`PlanCache.unsent_bytes`: NVLS's), the members' mean where the group is partly
    simulated. ``weights``: how many ranks each simulated rank stands for, where they stand for unlike numbers
    (parallel/folding.py `rank_weights`), which its corrections count for."""
    simulated = {op.rank for op in ops}
    shapes = shapes or CollectiveShapes.of(ops)
    partly_simulated: dict[int, bool] = {}
    correction_of: list[dict[int, float] | None] = []
    for op, gid in zip(shapes.firsts, shapes.group_of_shape):
        partly = partly_simulated.get(gid)
        if partly is None:
            partly = partly_simulated[gid] = not simulated.issuperset(op.group)
        correction_of.append(_correction(plans, op, partly))
    correction: dict[str, float] = {}
    for op, shape in zip(shapes.ops, shapes.shape_of):
        extra = correction_of[shape]
        if extra is not None and extra[op.rank]:
            weighed = extra[op.rank] if weights is None else extra[op.rank] * weights[op.rank]
            correction[op.category] = correction.get(op.category, 0.0) + weighed
    return correction


def _correction(plans: PlanCache, op: CollectiveOp, partly: bool) -> dict[int, float] | None:
    """Per member of ``op``'s group, what `traffic_correction` adds to its flows (None: nothing)."""
    excess = plans.send_excess(op) if partly else None
    unsent = plans.unsent_bytes(op)
    if unsent is None:
        return excess
    if partly:
        mean = sum(unsent.values()) / len(unsent)
        unsent = dict.fromkeys(unsent, mean)
    return {rank: (excess[rank] if excess else 0.0) - unsent[rank] for rank in unsent}
