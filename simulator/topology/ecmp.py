"""Equal-cost multi-path routing: the flow hash every router spreads flows with, and the router of `graph` topologies.

A fabric's switches spread flows over their equal-cost next hops by a hash of each flow's header, so parallel
links between tiers share the traffic. The structured fat-tree router (`builders.Fabric`) hashes its flows'
keys with `avalanche`; `GraphRouter` does the same on a graph listed node by node: among the fewest-link routes
from a GPU to another, each switch on the way picks one of its next hops that still lie on a fewest-link route,
by `avalanche` of the flow (source, destination, channel: each of NCCL's connections has a header of its own)
and the branch point's order along the route. So flows over a tier of parallel links land on them as if drawn
at random, as with a real hash a few more on one link than on another, and one flow's route is the same in
every run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from simulator.errors import TopologyError

if TYPE_CHECKING:
    from simulator.topology.graph import Topology, Wiring

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
    links in. With links down (``down``, directed node pairs) the same search skips them, so a detour around
    failed links is the route the hash picks on the graph without them, alike in every listing of the links.
    """

    def __init__(self, wiring: Wiring):
        successors: dict[str, list[str]] = {}
        predecessors: dict[str, list[str]] = {}
        for u, v in sorted(wiring.edges):
            successors.setdefault(u, []).append(v)
            predecessors.setdefault(v, []).append(u)
        self._successors = successors
        self._predecessors = predecessors
        self._towards: dict[frozenset[tuple[str, str]], dict[str, Towards]] = {frozenset(): {}}
        """Per set of links down (the healthy graph's and the latest other), each destination's search."""

    def __call__(self, topology: Topology, src: int, dst: int, channel: int,
                 down: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
        """Node names from GPU ``src`` to GPU ``dst`` without the links ``down``: at each node with several
        equal-cost next hops, the one the hash of the flow (``src``, ``dst``, ``channel``) and the branch point's
        order picks."""
        towards = self.towards(topology.gpus[dst], down)
        source = topology.gpus[src]
        if source not in towards.distance:
            raise TopologyError(f"GPU {towards.target} cannot be reached from {source}",
                                allowed="a graph where every GPU reaches every other")
        return hashed_walk(source, towards.target, towards.next_hops, flow_key(topology.num_gpus, src, dst, channel))

    def towards(self, target: str, down: frozenset[tuple[str, str]] = frozenset()) -> Towards:
        """The search back from node ``target`` without the links ``down``, found once per destination and
        set of links down (the searches of an older set of links down are dropped)."""
        searches = self._towards.get(down)
        if searches is None:
            self._towards = {frozenset(): self._towards[frozenset()], down: {}}
            searches = self._towards[down]
        found = searches.get(target)
        if found is None:
            found = searches[target] = Towards(target, self._successors, self._predecessors, down)
        return found


def flow_key(gpus: int, src: int, dst: int, channel: int) -> int:
    """The integer a flow's route is drawn from: its ends among ``gpus`` GPUs and its channel."""
    return (src * gpus + dst) * 0x9E3779B1 + channel


def hashed_walk(source: str, target: str, next_hops: Callable[[str], Sequence[str]], key: int) -> list[str]:
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
    """The fewest-link distance of every node to ``target`` without the links ``down`` (a breadth-first search
    back from it), and each node's next hops on fewest-link routes there, in name order, found when first asked."""

    def __init__(self, target: str, successors: dict[str, list[str]], predecessors: dict[str, list[str]],
                 down: frozenset[tuple[str, str]]):
        self.target = target
        self._successors = successors
        self._down = down
        distance = {target: 0}
        frontier = deque([target])
        while frontier:
            node = frontier.popleft()
            for previous in predecessors.get(node, ()):
                if previous not in distance and (previous, node) not in down:
                    distance[previous] = distance[node] + 1
                    frontier.append(previous)
        self.distance = distance
        self._next_hops: dict[str, tuple[str, ...]] = {}

    def next_hops(self, node: str) -> tuple[str, ...]:
        """The neighbours of ``node`` one link closer to the target over links not down, in name order (the
        successor lists are sorted)."""
        hops = self._next_hops.get(node)
        if hops is None:
            closer, distance, down = self.distance[node] - 1, self.distance, self._down
            hops = self._next_hops[node] = tuple(v for v in self._successors[node]
                                                 if distance.get(v, -1) == closer and (node, v) not in down)
        return hops
