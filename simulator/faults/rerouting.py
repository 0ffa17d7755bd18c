"""Routing around failed links, and the check that a failure has not split the job's GPUs.

Routes that avoid every failed link keep the topology's own router. On an explicit `graph` topology a route that
crosses a failed link is its `GraphRouter`'s route on the graph without the failed links: the fewest-link routes
left, picked hop by hop by the same flow hash, through forwarding nodes only, alike in every order the file lists its
links in. On a built fabric such a route is recomputed on the networkx graph without the failed links: one of
the shortest remaining paths, picked by a hash of (src, dst, channel) as ECMP would spread flows. A GPU
forwards traffic only for the GPUs of its own NVLink domain (NCCL's PXN: a GPU whose NIC or leaf is down sends
over NVLink to a peer and out through the peer's NIC, on another rail), so a detour passes through third GPUs
only in the source's or the destination's domain. On a fabric whose rotation by one period of its spine hash
maps it onto itself (topology/periods.py `Rotation`), a detour is picked in the source's period's frame: the
route rotated back until its source lies in the first period, around the failed links rotated back alike, then
rotated forward.
So the detours rotate with the links down, as the fabric's own routes rotate with their ends, and a job's
states whose links down are rotations of each other are the same step (reliability/symmetry.py); picked from
the absolute ends, a leaf down in one leaf group slowed the step 27% more than the same leaf in the next. On a
rail-optimized fabric whose shift by one rail maps it onto itself (`RailRotation`), the detour is picked in the
frame of the source's rail too, so the same failure costs the same on every rail where the traffic is alike on
every rail, TP within hosts and DP along the rails (picked from the absolute ends, a NIC's cable down cost 4.4%
more on five rails of eight than on the other three); where a group crosses the rails unevenly (TP over eight
hosts with DP first: the DP ring's crossings on rails 0 and 7), the rails still differ by their traffic (1.2%).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice

import networkx as nx

from simulator.errors import SimulationError, TopologyError
from simulator.topology.ecmp import GraphRouter
from simulator.topology.graph import Topology, both_ways
from simulator.topology.periods import RailRotation, Rotation

MAX_DETOURS = 64
"""Equal-cost detours considered per route on a built fabric (the hash picks among the first ones networkx
lists)."""


def _mix(src: int, dst: int, channel: int) -> int:
    mix = (src * 0x9E3779B1 + dst * 0x85EBCA77 + channel * 0xC2B2AE3D) & 0xFFFFFFFF
    return mix ^ (mix >> 15)


class Rerouter:
    """Installs itself as ``topology``'s router; ``take_down`` fails links (both directions of each pair of
    node names) and forgets the cached routes. ``rerouted`` counts the routes that needed a detour."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.base = topology.router
        self.down: set[tuple[str, str]] = set()
        self._down_frozen: frozenset[tuple[str, str]] = frozenset()
        self.rerouted = 0
        self._rotation: Rotation | None = None
        self._shifts: list[Rotation | RailRotation] | None = None
        """The fabric's `Rotation` and `RailRotation` where it has them (None: not looked for yet)."""
        self._down_by_turns: dict[tuple[int, ...], set[tuple[str, str]]] = {}
        self.partition: Callable[[str, str], SimulationError] | None = None
        """Where the links down split the GPUs until some of them come back: the error a route from one GPU to
        another (by name) that has none raises (the step aborted then); None: a plain SimulationError."""
        topology.router = self

    def take_down(self, edges: list[tuple[str, str]]) -> None:
        """Mark the links between the node pairs ``edges`` down, both directions, and drop the cached routes."""
        self.down.update(both_ways(edges))
        self._down_frozen = frozenset(self.down)
        self._down_by_turns.clear()
        self.topology.forget_routes()

    def bring_up(self, edges: list[tuple[str, str]]) -> None:
        """The links between the node pairs ``edges`` work again, both directions; drop the cached routes."""
        self.down.difference_update(both_ways(edges))
        self._down_frozen = frozenset(self.down)
        self._down_by_turns.clear()
        self.topology.forget_routes()

    def __call__(self, topology: Topology, src: int, dst: int, channel: int) -> list[str]:
        """The base router's route, or where it crosses a link that is down one of the shortest detours around the
        failed links: a graph's `GraphRouter` route without them, else one picked by a hash of the ends and the
        channel in the frame of the source's period and rail (a SimulationError where none is left)."""
        if self.base is not None:
            nodes = self.base(topology, src, dst, channel)
        else:  # a topology built by hand without a router (every builder gives one)
            nodes = nx.shortest_path(topology.graph, topology.gpus[src], topology.gpus[dst])
        if not any(edge in self.down for edge in zip(nodes, nodes[1:])):
            return nodes
        self.rerouted += 1
        if isinstance(self.base, GraphRouter):
            try:
                return self.base(topology, src, dst, channel, self._down_frozen)
            except TopologyError:
                raise self._no_route(src, dst) from None
        shifts = self.shifts()
        turns = tuple(shift.frame(src) for shift in shifts)
        if not any(turns):
            return self._detour(src, dst, channel, self.down)
        if turns not in self._down_by_turns:
            back = self._mover(turns, -1)
            self._down_by_turns[turns] = {(back(u), back(v)) for u, v in self.down}
        first_src, first_dst = src, dst
        for shift, count in zip(shifts, turns):
            first_src, first_dst = shift.gpu(first_src, -count), shift.gpu(first_dst, -count)
        try:
            detour = self._detour(first_src, first_dst, channel, self._down_by_turns[turns])
        except SimulationError:
            raise self._no_route(src, dst) from None
        forward = self._mover(turns, 1)
        return [forward(node) for node in detour]

    def rotation(self) -> Rotation | None:
        """The topology's `Rotation`, found once (None where it has none)."""
        self.shifts()
        return self._rotation

    def shifts(self) -> list[Rotation | RailRotation]:
        """The topology's `Rotation` and `RailRotation`, those it has, found once (at the first detour)."""
        if self._shifts is None:
            self._rotation = Rotation.of(self.topology, self.base)
            rails = RailRotation.of(self.topology, self.base)
            self._shifts = [shift for shift in (self._rotation, rails) if shift is not None]
        return self._shifts

    def _mover(self, turns: tuple[int, ...], sign: int) -> Callable[[str], str]:
        """A node's image (by name) under each of `shifts` by its ``turns`` times ``sign``; the shifts commute
        (periods move whole hosts, rails stay within them)."""
        images = [shift.nodes(sign * count) for shift, count in zip(self.shifts(), turns) if count]

        def move(node: str) -> str:
            for image in images:
                node = image[node]
            return node

        return move

    def _detour(self, src: int, dst: int, channel: int, down: set[tuple[str, str]]) -> list[str]:
        """One of the shortest routes from GPU ``src`` to ``dst`` without the links ``down``, picked by a hash of
        the ends and the channel."""
        gpus = self.topology.gpus
        view = self._view({gpus[src], gpus[dst]}, down)
        try:
            detours = list(islice(nx.all_shortest_paths(view, gpus[src], gpus[dst]), MAX_DETOURS))
        except nx.NetworkXNoPath:
            raise self._no_route(src, dst) from None
        return detours[_mix(src, dst, channel) % len(detours)]

    def _no_route(self, src: int, dst: int) -> SimulationError:
        gpus = self.topology.gpus
        if self.partition is not None:
            return self.partition(gpus[src], gpus[dst])
        return SimulationError(f"no route from {gpus[src]} to {gpus[dst]} around the failed links")

    def _view(self, ends: set[str], down: set[tuple[str, str]]) -> nx.DiGraph:
        """The graph without the failed links ``down`` and without GPUs outside the NVLink domains of ``ends``
        (a built fabric's GPUs forward nothing; a `graph` file's detours come from its `GraphRouter`)."""
        graph = self.topology.graph
        domains = {graph.nodes[n].get("nvlink_domain") for n in ends} - {None}

        def kept(node: str) -> bool:
            data = graph.nodes[node]
            return node in ends or data.get("kind") != "gpu" or data.get("nvlink_domain") in domains

        return nx.subgraph_view(graph, filter_node=kept, filter_edge=lambda u, v: (u, v) not in down)

    def split(self) -> str:
        """'' when every GPU still reaches every other around the failed links, else which pair cannot."""
        return split(self.topology, self.down)


def split(topology: Topology, down: set[tuple[str, str]]) -> str:
    """'' when every GPU of ``topology`` still reaches every other without the directed links ``down`` (GPUs
    forwarding for their own NVLink domain only, as the Rerouter's detours; any node on an explicit graph),
    else which pair cannot."""
    graph, gpus = topology.graph, topology.gpus
    undirected = nx.Graph((u, v) for u, v in graph.edges() if (u, v) not in down)
    undirected.add_nodes_from(graph.nodes)
    if topology.explicit_graph:
        component = nx.node_connected_component(undirected, gpus[0])
        stranded = next((gpu for gpu in gpus if gpu not in component), None)
        return f"{gpus[0]} cannot reach {stranded}" if stranded else ""
    fabric = undirected.subgraph(n for n in graph.nodes if graph.nodes[n].get("kind") != "gpu")
    component_of = {node: index for index, nodes in enumerate(nx.connected_components(fabric)) for node in nodes}
    own = {gpu: {component_of[n] for n in undirected.neighbors(gpu) if n in component_of} for gpu in gpus}
    domain_reach: dict[object, set[int]] = {}
    for gpu in gpus:
        domain = graph.nodes[gpu].get("nvlink_domain")
        if domain is not None:
            domain_reach.setdefault(domain, set()).update(own[gpu])
    reach: dict[frozenset[int], str] = {}
    for gpu in gpus:
        domain = graph.nodes[gpu].get("nvlink_domain")
        components = frozenset(own[gpu] if domain is None else domain_reach[domain])
        if not components and len(gpus) > 1:
            return f"{gpu} has no working link"
        reach.setdefault(components, gpu)
    kinds = list(reach.items())
    for i, (first, gpu_a) in enumerate(kinds):
        for second, gpu_b in kinds[i + 1:]:
            if not first & second:
                return f"{gpu_a} cannot reach {gpu_b}"
    return ""
