"""Equal-cost multi-path routing: the flow hash every router spreads flows with, and the router of `graph` topologies.

A fabric's switches spread flows over their equal-cost next hops by a hash of each flow's header, so parallel
links between tiers share the traffic. The structured fat-tree router (`builders.Fabric`) hashes its flows'
keys with `avalanche`; `GraphRouter` does the same on a graph listed node by node: among the fewest-link routes
from a GPU to another, each switch on the way picks one of its next hops that still lie on a fewest-link route,
by `avalanche` of the flow (source, destination, channel: each of NCCL's connections has a header of its own)
and the branch point's order along the route. So flows over a tier of parallel links land on them as if drawn
at random, as with a real hash a few more on one link than on another, and one flow's route is the same in
every run. Only forwarding nodes carry a route through: a GPU is a route's end and not on its way, and a NIC
passes traffic from its host's side (GPU, NVSwitch, PCIe switch, host bridge) to either side, and from the network
(a switch, or a NIC cabled to it) to its host's side only, so a fewest-link route never turns through a third GPU's
NVLink or between a NIC's two network ports, while GPUs that share a NIC reach each other through it, as through
the PCIe path it hangs off. A GPU that reaches a destination only through another GPU (one without a NIC of its
own, whose NVLink peers hold the host's NICs) is relayed by a GPU of its own host, as NCCL's PXN relays a GPU's
traffic to a peer's NIC, and one reached only so is relayed by a GPU of its host: its routes are the fewest-link
routes on which only the GPUs of the two ends' hosts forward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from simulator.errors import TopologyError

if TYPE_CHECKING:
    from simulator.topology.graph import Topology, Wiring

NETWORK_SIDE = frozenset(("switch", "nic"))
"""Node kinds on a NIC's network side; every other kind is on its host's side."""

State = tuple[str, bool]
"""A node on a route and, for a NIC, whether it was entered from its network side, which leaves it only its host's
side to go on to (False for other nodes)."""

Hashed = TypeVar("Hashed", int, np.ndarray)
"""One flow's integer (a bool for a flag), or an array of many flows' (`Fabric._spine_and_core`, `avalanche`)."""

BRANCH_STEP = 0x632BE5AB
"""Added to a flow's hashed key per branch point passed, so each switch on a route draws its next hop afresh."""


def avalanche(value: Hashed) -> Hashed:
    """A 32-bit integer hash in which every input bit flips every output bit with probability about 1/2
    (MurmurHash3's finalizer): keys that differ by a little, such as neighbouring hosts at one offset, land on
    spines as if drawn at random, as ECMP's hash of a flow's header does. Only the low 32 bits of ``value`` count
    (an int, or an int64 array, whose wrapped products keep them)."""
    value = value & 0xFFFFFFFF
    value = ((value ^ (value >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    value = ((value ^ (value >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return value ^ (value >> 16)


class GraphRouter:
    """Routes of an explicit graph: one of the fewest-link routes per flow, picked hop by hop by the flow hash.

    A node's next hops towards a destination are its neighbours one link closer to it, so one breadth-first
    search back from each destination (its `Towards`) serves every source and channel: found once and kept.
    Next hops are taken in the order of their names, so the routes do not depend on the order the file lists the
    links in. The search passes through no GPU but its destination (where the source reaches it so; else through
    the GPUs of the source's and the destination's hosts, a peer's relay), and through a NIC from its host's side to
    either side, from the network to its host's side only (`Towards`). With links down (``down``, directed node
    pairs) the same search skips them, so a detour around failed links is the route the hash picks on the graph
    without them, alike in every listing of the links.
    """

    def __init__(self, wiring: Wiring):
        successors: dict[str, list[str]] = {}
        predecessors: dict[str, list[str]] = {}
        for u, v in sorted(wiring.edges):
            successors.setdefault(u, []).append(v)
            predecessors.setdefault(v, []).append(u)
        self._successors = successors
        self._predecessors = predecessors
        self._kinds = {node: attributes.get("kind", "") for node, attributes in wiring.nodes.items()}
        self._hosts = {node: attributes.get("host") for node, attributes in wiring.nodes.items()
                       if attributes.get("kind") == "gpu"}
        self._towards: dict[frozenset[tuple[str, str]], dict[tuple[str, frozenset[str]], Towards]] = {frozenset(): {}}
        """Per set of links down (the healthy graph's and the latest other), each destination's search, per set of
        GPUs that relay (none for most)."""

    def __call__(self, topology: Topology, src: int, dst: int, channel: int,
                 down: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
        """Node names from GPU ``src`` to GPU ``dst`` without the links ``down``: at each node with several
        equal-cost next hops, the one the hash of the flow (``src``, ``dst``, ``channel``) and the branch point's
        order picks."""
        source, target = topology.gpus[src], topology.gpus[dst]
        towards = self.reaching(source, target, down)
        if towards is None:
            raise TopologyError(f"GPU {target} cannot be reached from {source}",
                                allowed="a graph where every GPU reaches every other")
        walk = hashed_walk((source, False), (target, False), towards.next_hops,
                           flow_key(topology.num_gpus, src, dst, channel))
        return [node for node, _ in walk]

    def reaching(self, source: str, target: str, down: frozenset[tuple[str, str]] = frozenset()) -> Towards | None:
        """The search back from GPU ``target`` that reaches GPU ``source`` without the links ``down``: through no
        GPU where it can, else relayed by the GPUs of the two ends' hosts only (NCCL's PXN relays through a peer of
        the sender's host, and a receiver's peer forwards to it); None where neither reaches it."""
        towards = self.towards(target, down)
        if (source, False) not in towards.distance:
            ends = (self._hosts[source], self._hosts[target])
            towards = self.towards(target, down, frozenset(gpu for gpu, host in self._hosts.items() if host in ends))
        return towards if (source, False) in towards.distance else None

    def towards(self, target: str, down: frozenset[tuple[str, str]] = frozenset(),
                relays: frozenset[str] = frozenset()) -> Towards:
        """The search back from node ``target`` without the links ``down``, through the GPUs ``relays``, found
        once per destination, set of links down and ``relays`` (the searches of an older set of links down are
        dropped)."""
        searches = self._towards.get(down)
        if searches is None:
            self._towards = {frozenset(): self._towards[frozenset()], down: {}}
            searches = self._towards[down]
        found = searches.get((target, relays))
        if found is None:
            found = searches[target, relays] = Towards(target, self._successors, self._predecessors, self._kinds, down,
                                                       relays)
        return found


def flow_key(gpus: int, src: int, dst: int, channel: int) -> int:
    """The integer a flow's route is drawn from: its ends among ``gpus`` GPUs and its channel."""
    return (src * gpus + dst) * 0x9E3779B1 + channel


Node = TypeVar("Node", str, State)
"""A node of a walk: a name, or a `State` of one."""


def hashed_walk(source: Node, target: Node, next_hops: Callable[[Node], Sequence[Node]], key: int) -> list[Node]:
    """The route from ``source`` to ``target`` taking at each node one of its ``next_hops`` (in name order): the
    only one, or where there are several the one `avalanche` of ``key`` and the branch point's order picks."""
    node, route, branch = source, [source], 0
    while node != target:
        choices = next_hops(node)
        if len(choices) > 1:
            node = choices[avalanche(key + branch * BRANCH_STEP) % len(choices)]
            branch += 1
        else:
            node = choices[0]
        route.append(node)
    return route


class Towards:
    """The fewest-link distance of every `State` to ``target`` without the links ``down`` (a breadth-first search
    back from it), and each state's next hops on fewest-link routes there, in name order, found when first asked.
    The search goes on from no GPU but the target and the GPUs ``relays`` (a GPU forwards nothing unless it
    relays), and through a NIC from its host's side to either side but from its network side (`NETWORK_SIDE`) to
    its host's side only: a NIC passes traffic between its host and the network, and between the GPUs it serves.
    A NIC's state says which side it was entered from, so one NIC may be on the fewest-link routes both ways."""

    def __init__(self, target: str, successors: dict[str, list[str]], predecessors: dict[str, list[str]],
                 kinds: dict[str, str], down: frozenset[tuple[str, str]], relays: frozenset[str] = frozenset()):
        self.target = target
        self._relays = relays
        self._successors = successors
        self._kinds = kinds
        self._down = down
        distance: dict[State, int] = {(target, False): 0}
        frontier = deque([(target, False)])
        while frontier:
            state = frontier.popleft()
            node, entered_from_network = state
            if not self.passes_through(node):
                continue
            is_nic = kinds.get(node) == "nic"
            for previous in predecessors.get(node, ()):
                if (previous, node) in down or (is_nic and self.network_side(previous) != entered_from_network):
                    continue
                befores = [(previous, False)]
                if kinds.get(previous) == "nic" and not self.network_side(node):
                    befores.append((previous, True))
                for before in befores:
                    if before not in distance:
                        distance[before] = distance[state] + 1
                        frontier.append(before)
        self.distance = distance
        self._next_hops: dict[State, tuple[State, ...]] = {}

    def network_side(self, node: str) -> bool:
        """Whether ``node`` lies on a NIC's network side."""
        return self._kinds.get(node) in NETWORK_SIDE

    def passes_through(self, node: str) -> bool:
        """Whether a route may pass through ``node`` (or end there): any node but a GPU other than the target
        and the relays."""
        return self._kinds.get(node) != "gpu" or node == self.target or node in self._relays

    def next_hops(self, state: State) -> tuple[State, ...]:
        """The states one link closer to the target than ``state`` over links not down that a route may pass
        through from it, in name order (the successor lists are sorted)."""
        hops = self._next_hops.get(state)
        if hops is None:
            node, entered_from_network = state
            closer, distance, down = self.distance[state] - 1, self.distance, self._down
            leaves_to_host = self._kinds.get(node) == "nic" and entered_from_network
            found = []
            for v in self._successors[node]:
                if (node, v) in down or (leaves_to_host and self.network_side(v)) or not self.passes_through(v):
                    continue
                after = (v, self._kinds.get(v) == "nic" and self.network_side(node))
                if distance.get(after, -1) == closer:
                    found.append(after)
            hops = self._next_hops[state] = tuple(found)
        return hops
