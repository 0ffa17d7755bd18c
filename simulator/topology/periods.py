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

import collections
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
    have two images or two nodes one (`_node_step`). With ``wrap`` the last period's GPUs map onto the first's
    (a rotation, `Rotation`)."""
    sources = np.arange(gpus if wrap else gpus - fabric.shift_gpus, dtype=np.int64)
    return _node_step(fabric, node_ids, sources, (sources + fabric.shift_gpus) % gpus)


def _node_step(fabric: Fabric, node_ids: dict[str, int], sources: np.ndarray,
               images: np.ndarray) -> np.ndarray | None:
    """Each node's image under the map of GPUs ``sources`` onto GPUs ``images`` (NO_IMAGE where it has none),
    or None when a node would have two images or two nodes one: each GPU's name, NIC, leaf and way up map onto
    those of its image (a lone GPU's domain root, which is no node, onto another's), each pod's spines onto
    those of the image's pod, in order; cores stay."""
    if len({len(up) for up in fabric.uplinks}) != 1:
        return None
    ids, known = node_ids.get, node_ids.__getitem__
    gpus = len(fabric.gpus)
    leaf_ids = np.fromiter(map(known, fabric.leaf_names), dtype=np.int64, count=len(fabric.leaf_names))
    leaf = np.array(fabric.leaf, dtype=np.int64)
    per_gpu = np.column_stack([np.fromiter(map(ids, names, [NO_IMAGE] * gpus), dtype=np.int64, count=gpus)
                               for names in (fabric.gpus, fabric.nic, *zip(*fabric.uplinks))] + [leaf_ids[leaf]])
    tails, heads = per_gpu[sources].reshape(-1), per_gpu[images].reshape(-1)
    if ((tails < 0) != (heads < 0)).any():
        return None
    switches: list[tuple[str, str]] = [(core, core) for core in fabric.core_names]
    leaf_pod = np.array(fabric.leaf_pod, dtype=np.int64)[leaf]
    pods = len(fabric.spine_names)
    for code in np.unique(leaf_pod[sources] * pods + leaf_pod[images]).tolist():
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


class _NodeShift:
    """A permutation of a fabric's nodes that maps its wiring onto itself, of order ``turns``: its powers by
    name (`nodes`), built once per power."""

    def __init__(self, turns: int, names: list[str], step: np.ndarray):
        self.turns = turns
        """The shifts that make the identity."""
        self._names = names
        self._step = step
        self._maps: dict[int, dict[str, str]] = {}

    def nodes(self, turns: int) -> dict[str, str]:
        """Each node's image (by name) under the shift by ``turns`` (any integer: taken modulo `turns`), built
        once per power."""
        turns %= self.turns
        if turns not in self._maps:
            names = self._names
            self._maps[turns] = {name: names[moved] for name, moved in zip(names, self._node_images(turns).tolist())}
        return self._maps[turns]

    def _node_images(self, turns: int) -> np.ndarray:
        """Each node's image (by index) under the shift by ``turns`` (0 to `turns` - 1)."""
        image = np.arange(len(self._names), dtype=np.int64)
        for _ in range(turns):
            image = self._step[image]
        return image


def _automorphism(topology: Topology, node_ids: dict[str, int], step: np.ndarray | None,
                  moved: tuple[str, ...]) -> bool:
    """Whether the node map ``step`` maps ``topology``'s wiring onto itself: every node has an image, every link
    onto a link of the same bandwidth, latency and class, one to one, and every node onto one with the same
    attributes but those ``moved``, renumbered one to one."""
    if step is None or (step < 0).any():
        return False
    links, _ = _link_step(topology, node_ids, step)
    if (links < 0).any() or len(np.unique(links)) != len(links):
        return False
    return _attributes_move([topology.wiring.nodes[name] for name in node_ids], step, moved)


class Rotation(_NodeShift):
    """The translation of a whole fabric by one period of its spine hash, the last period's GPUs onto the first's:
    a permutation of its nodes that maps the wiring onto itself (`of` checks it: every link onto a link of the
    same bandwidth, latency and class, every node onto one of the same kind, tier and rail, hosts, NVLink domains
    and pods onto hosts, domains and pods). Its powers are the fabric's rotations by whole periods, which map
    every shortest path onto a shortest path: the rerouter picks its detours in the frame of the source's period
    (faults/rerouting.py), so that the detours under links down rotate with them; a job's states with links
    down that are rotations of each other are then one step (reliability/symmetry.py)."""

    def __init__(self, period: int, gpus: int, names: list[str], step: np.ndarray):
        super().__init__(gpus // period, names, step)
        self.period = period
        """GPUs per period: a rotation by one period moves GPU i to i + period (modulo the GPUs)."""
        self.gpus = gpus

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
        if not _automorphism(topology, node_ids, step, MOVED_ATTRIBUTES):
            return None
        assert step is not None
        return Rotation(fabric.shift_gpus, gpus, list(node_ids), step)

    def links(self, topology: Topology, turns: int) -> np.ndarray:
        """Each link's image under the rotation by ``turns`` periods, by index into ``topology.link_ends`` (the
        topology this rotation is `of`: every link has one)."""
        node_ids = {name: index for index, name in enumerate(self._names)}
        return _link_step(topology, node_ids, self._node_images(turns % self.turns))[0]

    def frame(self, gpu: int) -> int:
        """The rotations back that bring GPU ``gpu`` into the first period."""
        return gpu // self.period

    def gpu(self, gpu: int, turns: int) -> int:
        """GPU ``gpu``'s image under the rotation by ``turns`` periods."""
        return (gpu + turns * self.period) % self.gpus


class RailRotation(_NodeShift):
    """The shift of a rail-optimized fabric by one rail, the last rail onto the first: each host's GPUs on rail r
    onto its GPUs on rail r + 1, in order, each NIC and leaf onto the next rail's (a leaf without hosts, on a
    fabric wired for more, by its rail), spines, cores and NVLink switches staying; `of` checks that it maps
    the wiring onto itself as `Rotation.of` does. The fabric's own routes move with it (the spine hash reads the
    rails' difference, not the rails, `Fabric`), and so do the rerouter's detours, picked in the frame of the
    source's rail (faults/rerouting.py): the same failure on any rail of a uniform fabric is then the same step,
    where the traffic is alike on every rail."""

    def __init__(self, rails: list[int], gpu_step: np.ndarray, turns: int, names: list[str], step: np.ndarray):
        super().__init__(turns, names, step)
        self._rails = rails
        self._gpu_powers = [np.arange(len(gpu_step), dtype=np.int64)]
        for _ in range(1, turns):
            self._gpu_powers.append(gpu_step[self._gpu_powers[-1]])

    @staticmethod
    def of(topology: Topology, router: object = None) -> RailRotation | None:
        """The rail shift of ``topology``'s fabric (routed by ``router``, by default its own), or None where it
        has one rail, hosts with different GPU counts or rails that do not divide them, or the shift is no
        automorphism of the wiring."""
        fabric = topology.router if router is None else router
        if not isinstance(fabric, Fabric) or fabric.rails < 2 or len(fabric.rail) != len(fabric.gpus):
            return None
        per_host = collections.Counter(fabric.gpu_host)
        sizes = set(per_host.values())
        if len(sizes) != 1 or next(iter(sizes)) % fabric.rails:
            return None
        size = next(iter(sizes))
        place = {(host, local): gpu for gpu, (host, local) in enumerate(zip(fabric.gpu_host, fabric.gpu_local))}
        gpu_step = np.array([place.get((host, (local + size // fabric.rails) % size), NO_IMAGE)
                             for host, local in zip(fabric.gpu_host, fabric.gpu_local)], dtype=np.int64)
        rail = np.array(fabric.rail, dtype=np.int64)
        if (gpu_step < 0).any() or (rail[gpu_step] != (rail + 1) % fabric.rails).any():
            return None
        node_ids = {name: index for index, name in enumerate(topology.wiring.nodes)}
        step = _node_step(fabric, node_ids, np.arange(len(gpu_step), dtype=np.int64), gpu_step)
        if step is not None:
            _shift_hostless_switches(fabric, node_ids, step)
        if not _automorphism(topology, node_ids, step, ("rail",)):
            return None
        assert step is not None
        return RailRotation(fabric.rail, gpu_step, fabric.rails, list(node_ids), step)

    def frame(self, gpu: int) -> int:
        """The shifts back that bring GPU ``gpu`` onto the first rail."""
        return self._rails[gpu]

    def gpu(self, gpu: int, turns: int) -> int:
        """GPU ``gpu``'s image under the shift by ``turns`` rails."""
        return int(self._gpu_powers[turns % self.turns][gpu])


def _shift_hostless_switches(fabric: Fabric, node_ids: dict[str, int], step: np.ndarray) -> None:
    """Give the switches that no GPU's image reaches (a fabric wired for more hosts than it has, `fabric_hosts`)
    their images under the shift by one rail, in place: each leaf the next rail's of its leaf group (the
    fabric's leaves lie group by group, a rail each), each spine itself."""
    rails = fabric.rails
    for index, leaf in enumerate(fabric.leaf_names):
        if step[node_ids[leaf]] == NO_IMAGE:
            step[node_ids[leaf]] = node_ids[fabric.leaf_names[index - index % rails + (index + 1) % rails]]
    for spine in chain.from_iterable(fabric.spine_names):
        if step[node_ids[spine]] == NO_IMAGE:
            step[node_ids[spine]] = node_ids[spine]


MOVED_ATTRIBUTES = ("host", "nvlink_domain", "pod")
"""Node attributes that a rotation renumbers (each value onto one value, one to one); all others it keeps."""


def _attributes_move(attributes: list[dict], step: np.ndarray, moved: tuple[str, ...]) -> bool:
    """Whether the node map ``step`` keeps every node's attributes but those ``moved``, and renumbers each of
    those one to one."""
    renamed: dict[tuple[str, object], object] = {}
    for node, image in enumerate(step.tolist()):
        ours, theirs = attributes[node], attributes[image]
        if ours.keys() != theirs.keys():
            return False
        for key, value in ours.items():
            if key not in moved:
                if theirs[key] != value:
                    return False
            elif renamed.setdefault((key, value), theirs[key]) != theirs[key]:
                return False
    images = [(key, value) for (key, _), value in renamed.items()]
    return len(set(images)) == len(images)
