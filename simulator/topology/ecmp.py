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

    The next hops on fewest-link routes from a source to a destination (the equal-cost graph of the pair) are
    worked out once per (source, destination) GPU pair, by a breadth-first search back from the destination that
    stops at the source's distance, and kept: every channel of the pair picks its route in that table. Next hops
    are taken in the order of their names, so the routes do not depend on the order the file lists the links in.
    """

    def __init__(self, wiring: Wiring):
        successors: dict[str, list[str]] = {}
        predecessors: dict[str, list[str]] = {}
        for u, v in sorted(wiring.edges):
            successors.setdefault(u, []).append(v)
            predecessors.setdefault(v, []).append(u)
        self._successors = successors
        self._predecessors = predecessors
        self._next_hops: dict[tuple[int, int], dict[str, tuple[str, ...]]] = {}

    def __call__(self, topology: Topology, src: int, dst: int, channel: int) -> list[str]:
        """Node names from GPU ``src`` to GPU ``dst``: at each node with several equal-cost next hops, the one
        the hash of the flow (``src``, ``dst``, ``channel``) and the branch point's order picks."""
        next_hops = self.next_hops(topology, src, dst)
        key = (src * topology.num_gpus + dst) * 0x9E3779B1 + channel
        node, route, branch = topology.gpus[src], [topology.gpus[src]], 0
        target = topology.gpus[dst]
        while node != target:
            choices = next_hops[node]
            if len(choices) > 1:
                node = choices[avalanche(key + branch * BRANCH_STEP) % len(choices)]
                branch += 1
            else:
                node = choices[0]
            route.append(node)
        return route

    def next_hops(self, topology: Topology, src: int, dst: int) -> dict[str, tuple[str, ...]]:
        """Each node on a fewest-link route from GPU ``src`` to GPU ``dst`` (but ``dst``) and its next hops on
        such routes, in name order; found once per pair."""
        pair = (src, dst)
        found = self._next_hops.get(pair)
        if found is None:
            found = self._next_hops[pair] = self._equal_cost(topology.gpus[src], topology.gpus[dst])
        return found

    def _equal_cost(self, source: str, target: str) -> dict[str, tuple[str, ...]]:
        distance = {target: 0}
        frontier = deque([target])
        while frontier and source not in distance:
            node = frontier.popleft()
            for previous in self._predecessors.get(node, ()):
                if previous not in distance:
                    distance[previous] = distance[node] + 1
                    frontier.append(previous)
        if source not in distance:
            raise TopologyError(f"GPU {target} cannot be reached from {source}",
                                allowed="a graph where every GPU reaches every other")
        next_hops: dict[str, tuple[str, ...]] = {}
        pending = [source]
        while pending:
            node = pending.pop()
            if node == target or node in next_hops:
                continue
            closer = distance[node] - 1
            hops = tuple(sorted(v for v in self._successors[node] if distance.get(v, -1) == closer))
            next_hops[node] = hops
            pending.extend(hops)
        return next_hops
