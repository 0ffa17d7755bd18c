"""Translations of a fabric by whole periods of its spine hash, as permutations of its GPUs, nodes and links.

The `Fabric` router hashes a flow onto a spine from the source's place within its period (a leaf group, a pod
with three tiers) and the destination's offset, so shifting both ends of a route by whole periods moves the
route onto the shifted switches (docs/architecture.md, rank folding). A group translated by ``k`` periods
therefore uses the image of the group's links under the translation's link permutation: the folded mirrors of
a collective in other data-parallel replicas are such translates, and their links are read off one planned
copy per class instead of being routed again (engine/plans.py).

The node map of one period's shift is built from the fabric's tables (each GPU's NIC, leaf and way up to its
domain root, the pods' spines) and checked: where a node would have two images or two nodes one (a domain cut
by the period, as NVL72 racks of 18 trays under 32-port leaves) the fabric has no translations at all; a link
whose image is missing or differs in bandwidth, latency or class (a partial pod's core links) has no image,
and link sets that touch it are routed as before. Routes and plans are taken to move with their groups (the
hash's construction, planners that read hosts and local indices relatively); `PlanCache.link_table` checks
one moved copy of each class against its own plan.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from simulator.topology.builders import Fabric
from simulator.topology.graph import Topology

NO_IMAGE = -1


class Periods:
    """The translations of a topology by whole periods of its spine hash (``period`` GPUs); `of` builds it.
    ``exact``: every link whose ends have images maps onto a link alike, so a group translated within the GPUs
    meets links alike transfer for transfer (no link of its translate's routes lacks an image)."""

    def __init__(self, period: int, step: np.ndarray, exact: bool):
        self.period = period
        self.exact = exact
        # the step by 2**j periods for j = 0, 1, ... as far as asked, each with NO_IMAGE appended, so that
        # indexing it by NO_IMAGE (its last entry) gives NO_IMAGE
        self._powers = [np.append(step, NO_IMAGE)]

    @staticmethod
    def of(topology: Topology) -> Periods | None:
        """The translations of ``topology``, or None when its router has no period or one period's shift is
        not a consistent one-to-one map of its nodes."""
        fabric = topology.router
        if not isinstance(fabric, Fabric) or not 0 < fabric.shift_gpus < topology.num_gpus:
            return None
        node_ids = {name: index for index, name in enumerate(topology.wiring.nodes)}
        nodes = _one_period(fabric, node_ids, topology.num_gpus)
        return None if nodes is None else Periods(fabric.shift_gpus, *_link_step(topology, node_ids, nodes))

    def split(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Groups (a row of members each) as (their translates whose lowest member lies in the first period,
        the periods each is shifted by)."""
        shifts = groups.min(axis=1) // self.period
        return groups - (shifts * self.period)[:, None], shifts

    def move(self, links: np.ndarray, periods: int) -> np.ndarray:
        """The images of ``links`` (an array of link ids or NO_IMAGE) under the translation by ``periods``
        periods, NO_IMAGE where there is none: one index by the stored step of each power of two in
        ``periods``, so a shift by thousands of periods costs a dozen passes over ``links``."""
        power = 0
        while periods:
            if power == len(self._powers):
                last = self._powers[-1]
                self._powers.append(last[last])
            if periods & 1:
                links = self._powers[power][links]
            periods >>= 1
            power += 1
        return links

    def links(self, periods: int) -> np.ndarray:
        """Each link's image under the translation by ``periods`` periods (NO_IMAGE where it has none)."""
        return self.move(np.arange(len(self._powers[0]) - 1, dtype=np.int64), periods)


def _link_step(topology: Topology, node_ids: dict[str, int], nodes: np.ndarray) -> tuple[np.ndarray, bool]:
    """The links' images under the node map ``nodes``: a link whose ends both have images maps onto the link
    between them if there is one with the same bandwidth, latency and class, else it has none; and whether
    every link whose ends have images has one."""
    ends = np.fromiter(map(node_ids.__getitem__, chain.from_iterable(topology.link_ends)), dtype=np.int64,
                       count=2 * len(topology.link_ends)).reshape(-1, 2)
    count = len(node_ids)
    codes = ends[:, 0] * count + ends[:, 1]
    order = np.argsort(codes)
    moved = nodes[ends]
    wanted = moved[:, 0] * count + moved[:, 1]
    found = order[np.searchsorted(codes, wanted, sorter=order).clip(max=len(codes) - 1)]
    classes = topology.link_class_ids
    alike = ((moved >= 0).all(axis=1) & (codes[found] == wanted)
             & (topology.link_bandwidth == topology.link_bandwidth[found])
             & (topology.link_latency == topology.link_latency[found]) & (classes == classes[found]))
    return np.where(alike, found, NO_IMAGE), bool(alike[(moved >= 0).all(axis=1)].all())


def _one_period(fabric: Fabric, node_ids: dict[str, int], gpus: int, wrap: bool = False) -> np.ndarray | None:
    """Each node's image under a shift by one period (NO_IMAGE where it has none), or None when a node would
    have two images or two nodes one: each GPU's name, NIC, leaf and way up map onto those of the GPU one
    period on (a lone GPU's domain root, which is no node, onto another's), each pod's spines onto those of
    the shifted pod, in order; cores stay. With ``wrap`` the last period's GPUs map onto the first's (a
    rotation, `Rotation`)."""
    if len({len(up) for up in fabric.uplinks}) != 1:
        return None
    ids, known = node_ids.get, node_ids.__getitem__
    leaf_ids = np.fromiter(map(known, fabric.leaf_names), dtype=np.int64, count=len(fabric.leaf_names))
    leaf = np.array(fabric.leaf, dtype=np.int64)
    per_gpu = np.column_stack([np.fromiter(map(ids, names, [NO_IMAGE] * gpus), dtype=np.int64, count=gpus)
                               for names in (fabric.gpus, fabric.nic, *zip(*fabric.uplinks))] + [leaf_ids[leaf]])
    shift = fabric.shift_gpus

    def shifted(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (table, np.roll(table, -shift, axis=0)) if wrap else (table[:-shift], table[shift:])

    tails, heads = (side.reshape(-1) for side in shifted(per_gpu))
    if ((tails < 0) != (heads < 0)).any():
        return None
    switches: list[tuple[str, str]] = [(core, core) for core in fabric.core_names]
    leaf_pod = np.array(fabric.leaf_pod, dtype=np.int64)[leaf]
    pods = len(fabric.spine_names)
    pod_tails, pod_heads = shifted(leaf_pod)
    for code in np.unique(pod_tails * pods + pod_heads).tolist():
        pod, moved = divmod(code, pods)
        switches += zip(fabric.spine_names[pod], fabric.spine_names[moved])
    tails = np.concatenate((tails[tails >= 0], np.array([known(a) for a, _ in switches], dtype=np.int64)))
    heads = np.concatenate((heads[heads >= 0], np.array([known(b) for _, b in switches], dtype=np.int64)))
    codes = np.unique(tails * len(node_ids) + heads)
    tails, heads = np.divmod(codes, len(node_ids))
    if len(np.unique(tails)) != len(tails) or len(np.unique(heads)) != len(heads):
        return None
    step = np.full(len(node_ids), NO_IMAGE, dtype=np.int64)
    step[tails] = heads
    return step


class Rotation:
    """The translation of a whole fabric by one period of its spine hash, the last period's GPUs onto the first's:
    a permutation of its nodes that maps the wiring onto itself (`of` checks it: every link onto a link of the
    same bandwidth, latency and class, every node onto one of the same kind, tier and rail, hosts, NVLink domains
    and pods onto hosts, domains and pods). Its powers are the fabric's rotations by whole periods, which map
    every shortest path onto a shortest path: the rerouter picks its detours in the frame of the source's period
    (faults/rerouting.py), so that the detours under links down rotate with them; a job's states with links
    down that are rotations of each other are then one step (reliability/symmetry.py)."""

    def __init__(self, period: int, gpus: int, names: list[str], step: np.ndarray):
        self.period = period
        """GPUs per period: a rotation by one period moves GPU i to i + period (modulo the GPUs)."""
        self.turns = gpus // period
        """Periods in the fabric: the rotation by this many is the identity."""
        self.gpus = gpus
        self._names = names
        self._step = step
        self._maps: dict[int, dict[str, str]] = {}

    @staticmethod
    def of(topology: Topology, router: object = None) -> Rotation | None:
        """The rotation of ``topology``'s fabric (routed by ``router``, by default its own: a rerouter passes the
        router it stands in front of), or None where the router has no period, the period does not divide the
        GPUs (a partial last leaf group), or the shift is no automorphism of the wiring."""
        fabric = topology.router if router is None else router
        gpus = topology.num_gpus
        if not isinstance(fabric, Fabric) or not 0 < fabric.shift_gpus < gpus or gpus % fabric.shift_gpus:
            return None
        node_ids = {name: index for index, name in enumerate(topology.wiring.nodes)}
        step = _one_period(fabric, node_ids, gpus, wrap=True)
        if step is None or (step < 0).any():
            return None
        links, _ = _link_step(topology, node_ids, step)
        if (links < 0).any() or len(np.unique(links)) != len(links):
            return None
        names = list(node_ids)
        attributes = [topology.wiring.nodes[name] for name in names]
        if not _attributes_move(attributes, step):
            return None
        return Rotation(fabric.shift_gpus, gpus, names, step)

    def nodes(self, turns: int) -> dict[str, str]:
        """Each node's image (by name) under the rotation by ``turns`` periods (any integer: taken modulo the
        periods), built once per power."""
        turns %= self.turns
        if turns not in self._maps:
            names = self._names
            self._maps[turns] = {name: names[moved] for name, moved in zip(names, self._node_images(turns).tolist())}
        return self._maps[turns]

    def links(self, topology: Topology, turns: int) -> np.ndarray:
        """Each link's image under the rotation by ``turns`` periods, by index into ``topology.link_ends`` (the
        topology this rotation is `of`: every link has one)."""
        node_ids = {name: index for index, name in enumerate(self._names)}
        return _link_step(topology, node_ids, self._node_images(turns % self.turns))[0]

    def _node_images(self, turns: int) -> np.ndarray:
        """Each node's image (by index) under the rotation by ``turns`` periods (0 to `turns` - 1)."""
        image = np.arange(len(self._names), dtype=np.int64)
        for _ in range(turns):
            image = self._step[image]
        return image

    def gpu(self, gpu: int, turns: int) -> int:
        """GPU ``gpu``'s image under the rotation by ``turns`` periods."""
        return (gpu + turns * self.period) % self.gpus


MOVED_ATTRIBUTES = ("host", "nvlink_domain", "pod")
"""Node attributes that a rotation renumbers (each value onto one value, one to one); all others it keeps."""


def _attributes_move(attributes: list[dict], step: np.ndarray) -> bool:
    """Whether the node map ``step`` keeps every node's attributes but MOVED_ATTRIBUTES, and renumbers each of
    those one to one."""
    renamed: dict[tuple[str, object], object] = {}
    for node, image in enumerate(step.tolist()):
        ours, theirs = attributes[node], attributes[image]
        if ours.keys() != theirs.keys():
            return False
        for key, value in ours.items():
            if key not in MOVED_ATTRIBUTES:
                if theirs[key] != value:
                    return False
            elif renamed.setdefault((key, value), theirs[key]) != theirs[key]:
                return False
    images = [(key, value) for (key, _), value in renamed.items()]
    return len(set(images)) == len(images)
