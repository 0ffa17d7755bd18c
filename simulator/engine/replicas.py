"""Data-parallel replicas as exact images of each other: a folded run sends only the first replicas' flows.

Folding keeps every replica's copy of a collective on the network (its mirrors, and the transfers of a group
that spans the replicas, such as a data-parallel ring), because they share NICs and switch links with the
simulated traffic. When the layout's data-parallel shift by ``step`` replicas is a symmetry of the whole
posted traffic, they need not all run:

- the shift maps every flow's route onto the route of its image, link by link, onto links of the same
  bandwidth, latency and class (the fabric hashes spines shift-invariantly, topology/builders.py `Fabric`);
- the set of posted flows is closed under the shift (each collective's group and kept mirrors, completed
  with the images pruning dropped: they meet no simulated traffic, so adding them changes nothing);
- no link is its own image under any power of the shift (every link orbit has ``replicas / step`` members),
  and no route crosses two links of one orbit.

Then all images of a flow have the same rate at every instant (the max-min allocation is unique, so it is
invariant under a symmetry of the instance), and it is the max-min allocation of the quotient network: keep
the flows whose source lies in the first ``step`` replicas (one per orbit), and let each meet the others on
its links' orbit representatives. The load a representative link carries there is the load every link of
its orbit carries in the full network, so the rates, hence every time, are those of the full run. A phase of
a group that spans the replicas ends when its kept transfers do (the others are their images); a mirror with
no kept transfer ends with its images, which run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from simulator.engine.plans import PlanCache
from simulator.engine.shapes import CollectiveShapes
from simulator.engine.sharing import Mirrors
from simulator.parallel.layout import Layout
from simulator.program.ops import CollectiveOp, Op
from simulator.topology.builders import Fabric
from simulator.topology.graph import Topology


@dataclass(frozen=True)
class ReplicaQuotient:
    """The symmetry found: GPUs whose flows are sent (``kept``, the first replicas, one per orbit of the shift)
    and each link's orbit representative (``representative[link]``; links no flow uses map to themselves)."""

    kept: np.ndarray
    representative: np.ndarray

    @property
    def images(self) -> int:
        """How many flows each sent flow stands for (itself and its images): the replicas over those sent."""
        return self.kept.size // int(self.kept.sum())

    def items(self, items: list[tuple]) -> list[tuple]:
        """The network items (path, bytes, latency, src, dst, channel) of the kept sources, each with the path
        the flow contends on (its links' representatives) appended; the route itself is what the log shows."""
        kept, representative = self.kept, self.representative
        return [(*item, tuple(representative[list(item[0])].tolist())) for item in items if kept[item[3]]]


def replica_quotient(ops: Sequence[Op], layout: Layout, plans: PlanCache, mirrors: Mapping[int, Mirrors],
                     private: frozenset[int], shapes: CollectiveShapes | None = None
                     ) -> tuple[ReplicaQuotient | None, dict[int, Mirrors]]:
    """The quotient of a folded run by its data-parallel shift, with the mirrors each op still sends: its kept
    mirrors closed under the shift, less those wholly outside the first replicas; ``(None, mirrors)`` when no
    shift is an exact symmetry (docs/architecture.md, rank folding). The ``private`` collectives are timed
    alone and replayed, never posted, so they need no symmetry. ``shapes``: the index of ``ops``' collectives,
    when the caller has it."""
    topology = plans.topology
    step = _shift_step(layout, topology)
    if step == 0:
        return None, dict(mirrors)
    shift = np.arange(topology.num_gpus, dtype=np.int64)
    ranks = np.arange(layout.world, dtype=np.int64)
    stride = layout.stride("dp")
    replica = ranks // stride % layout.dp
    shift[:layout.world] = ranks + ((replica + step) % layout.dp - replica) * stride
    kept = np.zeros(topology.num_gpus, dtype=bool)
    kept[:layout.world] = replica < step
    if not kept[list({op.rank for op in ops})].all():
        return None, dict(mirrors)
    shapes = shapes or CollectiveShapes.of(ops)
    collectives = [(op, shape, shapes.group_of_shape[shape]) for op, shape in zip(shapes.ops, shapes.shape_of)
                   if op.id not in private]
    families = _Families(shift, kept)
    closed = families.close(collectives, mirrors)
    if closed is None:
        return None, dict(mirrors)
    planned = _plan_groups(collectives, closed, families)
    images = _link_images(planned, families.kept, plans, shift.tolist())
    if images is None:
        return None, dict(mirrors)
    representative = _representatives(images, layout.dp // step, len(topology.link_ends))
    if representative is None or not _routes_meet_each_orbit_once(planned, plans, kept, representative):
        return None, dict(mirrors)
    sent = {}
    for op, _, gid in collectives:
        rows = closed[op.id][1:]
        if rows:
            sent[op.id] = families.sent(op, gid, rows)
    return ReplicaQuotient(kept, representative), sent


def _shift_step(layout: Layout, topology: Topology) -> int:
    """`shift_step` on ``topology``'s fabric, when the layout covers every GPU of it."""
    period = topology.router.shift_gpus if isinstance(topology.router, Fabric) else 0
    return shift_step(layout, period) if layout.world == topology.num_gpus else 0


def shift_step(layout: Layout, period: int) -> int:
    """The fewest data-parallel replicas whose shift moves every GPU index by whole ``period``s of the fabric's
    spine hash (0 when there is none): data parallelism outermost over the layout's GPUs. The pre-run estimate
    (scale.py) predicts the quotient with it from the topology's parameters."""
    stride = layout.stride("dp")
    if not period or layout.dp == 1 or stride * layout.dp != layout.world:
        return 0
    return next((step for step in range(1, layout.dp) if layout.dp % step == 0 and step * stride % period == 0), 0)


_Table = tuple[tuple[tuple[int, ...], ...], np.ndarray, np.ndarray, dict[tuple[int, ...], int]]

_Collective = tuple[CollectiveOp, int, int]
"""A collective op posted by the run, with its shape and its group's dense id (`CollectiveShapes`)."""


class _Families:
    """Per group (by its dense id): the group and its mirror candidates as rows, the row each row's shift image
    is (by member set), and each row's orbit under the shift; so closing a set of rows is a lookup."""

    def __init__(self, shift: np.ndarray, kept: np.ndarray):
        self.shift = shift
        self.kept = kept
        self._tables: dict[int, _Table | None] = {}
        self._closed: dict[tuple[int, int], tuple[int, ...] | None] = {}
        self._sent: dict[tuple[int, tuple[int, ...]], Mirrors] = {}

    def table(self, op: CollectiveOp, gid: int) -> _Table | None:
        """(rows, image row of each row, orbit of each row, row of each group) of ``op``'s group (whose id is
        ``gid``), or None when a row's image is not a row."""
        if gid not in self._tables:
            rows = (op.group, *op.mirrors)
            members = np.sort(np.array(rows, dtype=np.int64), axis=1)
            index = {row.tobytes(): i for i, row in enumerate(members)}
            images = np.sort(self.shift[members], axis=1)
            image = np.array([index.get(row.tobytes(), -1) for row in images], dtype=np.int64)
            self._tables[gid] = None if (image < 0).any() else (
                rows, image, _cycles(image), {group: i for i, group in enumerate(rows)})
        return self._tables[gid]

    def close(self, collectives: list[_Collective], mirrors: Mapping[int, Mirrors]
              ) -> dict[int, tuple[int, ...]] | None:
        """Per op id, the rows it posts once closed under the shift (row 0, its group, first), or None."""
        closed: dict[int, tuple[int, ...]] = {}
        for op, _, gid in collectives:
            kept = mirrors.get(op.id, ())
            key = (gid, id(kept))
            if key not in self._closed:
                self._closed[key] = self._close(op, gid, kept)
            rows = self._closed[key]
            if rows is None:
                return None
            closed[op.id] = rows
        return closed

    def _close(self, op: CollectiveOp, gid: int, kept: Mirrors) -> tuple[int, ...] | None:
        table = self.table(op, gid)
        if table is None:
            return None
        _, _, orbit, position = table
        wanted = orbit[[0, *(position[group] for group in kept)]]
        chosen = np.flatnonzero(np.isin(orbit, wanted))
        return (0, *(int(i) for i in chosen if i != 0))

    def sent(self, op: CollectiveOp, gid: int, rows: tuple[int, ...]) -> Mirrors:
        """The mirrors among ``rows`` with a member in the first replicas (the others send nothing)."""
        key = (gid, rows)
        found = self._sent.get(key)
        if found is None:
            table = self.table(op, gid)
            assert table is not None
            groups, kept = table[0], self.kept
            found = self._sent[key] = tuple(groups[i] for i in rows if kept[list(groups[i])].any())
        return found


def _cycles(image: np.ndarray) -> np.ndarray:
    """The cycle (orbit) id of each element of the permutation ``image``."""
    successor = image.tolist()
    orbit = [-1] * len(successor)
    for start in range(len(successor)):
        node = start
        while orbit[node] < 0:
            orbit[node] = start
            node = successor[node]
    return np.array(orbit, dtype=np.int64)


def _plan_groups(collectives: list[_Collective], closed: Mapping[int, tuple[int, ...]], families: _Families
                 ) -> list[tuple[CollectiveOp, tuple[int, ...], tuple[int, ...]]]:
    """(op, group, image group) for every distinct plan the run posts: each op's closed rows, once per shape.
    Ops of one shape share their closed rows (one tuple per group and kept mirrors, `_Families.close`), so
    the rows are walked once per shape and closed set, not once per instance."""
    walked: set[tuple[int, int]] = set()
    seen: set[tuple[int, int]] = set()
    found = []
    for op, shape, gid in collectives:
        rows = closed[op.id]
        if (shape, id(rows)) in walked:
            continue
        walked.add((shape, id(rows)))
        table = families.table(op, gid)
        assert table is not None
        groups, image, _, _ = table
        for row in rows:
            if (shape, row) not in seen:
                seen.add((shape, row))
                found.append((op, groups[row], groups[image[row]]))
    return found


def _link_images(planned: list[tuple[CollectiveOp, tuple[int, ...], tuple[int, ...]]], kept: np.ndarray,
                 plans: PlanCache, shift: list[int]) -> dict[int, int] | None:
    """The shift's action on the links the run's flows use, read off each plan and the plan of its image
    phase by phase (the same transfers, moved; routes moved link by link onto links alike), or None. A plan
    that is not its own image must send from the first replicas only or not at all: a phase ends when all its
    transfers do, so dropping some of a plan's transfers is exact only where their images are in that plan."""
    path = plans.topology.path
    images: dict[int, int] = {}
    checked: set[tuple[int, int, int]] = set()
    for op, group, image_group in planned:
        phases, image_phases = plans.phases(op, group), plans.phases(op, image_group)
        if len(phases) != len(image_phases):
            return None
        if image_group is not group and len({bool(kept[t.src]) for phase in phases for t in phase.transfers}) > 1:
            return None  # its phases would end with its kept transfers, not with the images it drops
        for phase, image in zip(phases, image_phases):
            if replace(phase, transfers=()) != replace(image, transfers=()):
                return None  # every field but the transfers, which follow
            if sorted([t._replace(src=shift[t.src], dst=shift[t.dst]) for t in phase.transfers]
                      ) != sorted(image.transfers):
                return None
            for t in phase.transfers:
                route = (t.src, t.dst, t.channel)
                if route in checked:
                    continue
                checked.add(route)
                links, image_links = path(*route), path(shift[t.src], shift[t.dst], t.channel)
                if len(links) != len(image_links):
                    return None
                for link, moved_link in zip(links, image_links):
                    if images.setdefault(link, moved_link) != moved_link:
                        return None
    return images if _alike(plans.topology, images) else None


def _alike(topology: Topology, images: dict[int, int]) -> bool:
    """Whether every link and its image have the same bandwidth, latency and class."""
    links = np.fromiter(images.keys(), dtype=np.int64, count=len(images))
    moved = np.fromiter(images.values(), dtype=np.int64, count=len(images))
    classes = topology.link_class_ids
    return bool(np.array_equal(topology.link_bandwidth[links], topology.link_bandwidth[moved])
                and np.array_equal(topology.link_latency[links], topology.link_latency[moved])
                and np.array_equal(classes[links], classes[moved]))


def _representatives(images: dict[int, int], order: int, links: int) -> np.ndarray | None:
    """Each link's orbit representative (its lowest id), or None unless every orbit has ``order`` links: the
    links are walked along their orbits together, ``order`` steps, each of them back at its start only then."""
    starts = np.fromiter(images, dtype=np.int64, count=len(images))
    image = np.full(links, -1, dtype=np.int64)
    image[starts] = np.fromiter(images.values(), dtype=np.int64, count=len(images))
    current, lowest = starts, starts
    for step in range(1, order + 1):
        current = image[current]
        if (current < 0).any() or (step < order and (current == starts).any()):
            return None
        lowest = np.minimum(lowest, current)
    if (current != starts).any():
        return None
    representative = np.arange(links, dtype=np.int64)
    representative[starts] = lowest
    return representative


def _routes_meet_each_orbit_once(planned: list[tuple[CollectiveOp, tuple[int, ...], tuple[int, ...]]],
                                 plans: PlanCache, kept: np.ndarray, representative: np.ndarray) -> bool:
    """Whether no kept flow's route crosses two links of one orbit (its quotient path would carry it twice)."""
    path = plans.topology.path
    checked: set[tuple[int, int, int]] = set()
    for op, group, _ in planned:
        for phase in plans.phases(op, group):
            for t in phase.transfers:
                route = (t.src, t.dst, t.channel)
                if kept[t.src] and route not in checked:
                    checked.add(route)
                    links = path(*route)
                    if len(set(representative[list(links)].tolist())) != len(links):
                        return False
    return True
