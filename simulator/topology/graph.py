"""The cluster graph: GPUs, switches and NICs as nodes, full-duplex links as pairs of directed edges.

A builder lists the nodes and links in a `Wiring` (plain dicts); a `Topology` compiles it once into flat
arrays (link capacity, latency, class) plus a route cache, so that the network model never touches networkx.
The networkx DiGraph of the same nodes and links (`Topology.graph`) is built on first use only: fault
rerouting, blast radii and `topo describe` need one, a healthy run does not (building it for 16k GPUs, and
importing networkx, cost more than the rest of a run's setup).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property, reduce
from operator import add
from typing import TYPE_CHECKING

import numpy as np

from simulator.config.link_classes import LINK_CLASSES, LinkClass
from simulator.errors import TopologyError

if TYPE_CHECKING:
    import networkx as nx


class NvlinkReduction(StrEnum):
    """In-switch reduction of an NVLink domain (topology parameter ``nvls``)."""

    NONE = "none"
    NVSWITCH3 = "nvswitch3"
    """NVLink SHARP on third-generation NVSwitches."""


class NetworkReduction(StrEnum):
    """In-network reduction in the InfiniBand switches (topology parameter ``sharp``)."""

    NONE = "none"
    SHARPV3 = "sharpv3"
    """SHARPv3, Quantum-2 NDR streaming aggregation."""


NODE_KINDS = ("gpu", "nvswitch", "pcie_switch", "host_bridge", "nic", "switch")

Router = Callable[["Topology", int, int, int], list[str]]
"""A routing function: (topology, src gpu index, dst gpu index, channel) -> node names along the path. A router
with a ``route_links`` method of the same arguments returning the link ids directly is asked that instead, and
one with a ``route_arrays`` method (topology and arrays of src, dst, channel, src != dst) for many routes at once
(`Topology.routes`: a matrix of link ids, a route per row, -1 after its end)."""

PXN_CHANNEL = -1
"""The channel of a point-to-point transfer that NCCL sends through PXN (`Topology.pxn_relay`): over NVLink to
the source host's GPU on the destination's rail, then from that GPU's NIC along its rail. `Topology.route`
joins the two routes (channel 0 each); the router is never asked for this channel."""


class Wiring:
    """The nodes (name -> attributes) and directed edges ((u, v) -> attributes) of a cluster, in the order they
    were added, with the part of networkx's DiGraph interface the builders use. `networkx()` turns it into a
    DiGraph with the same node, adjacency and attribute order as if it had been built edge by edge."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self.edges: dict[tuple[str, str], dict] = {}
        """Each directed edge's attributes. The edges of one `add_links` call, both directions of every link,
        share one dict: give an edge new attributes by replacing its dict (`add_edge`), never by changing it in
        place, which would change every link of that call."""
        self._graph: nx.DiGraph | None = None

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def add_node(self, node: str, **attributes) -> None:
        self.nodes.setdefault(node, {}).update(attributes)

    def add_edge(self, u: str, v: str, **attributes) -> None:
        """An edge, or more attributes for one (its attribute dict replaced, not changed: `add_links`' edges
        share theirs)."""
        self.nodes.setdefault(u, {})
        self.nodes.setdefault(v, {})
        self.edges[(u, v)] = {**self.edges.get((u, v), {}), **attributes}

    def has_edge(self, u: str, v: str) -> bool:
        return (u, v) in self.edges

    def graph_order_edges(self) -> list[tuple[str, str]]:
        """The edges in the order networkx's DiGraph iterates them: by source node in node order, then as added
        (what results keyed by edge order, such as cable indices, were first defined on)."""
        position = {node: index for index, node in enumerate(self.nodes)}
        return sorted(self.edges, key=lambda edge: position[edge[0]])

    def networkx(self) -> nx.DiGraph:
        """The DiGraph of these nodes and edges, built on first call (networkx imported then)."""
        if self._graph is None:
            import networkx as nx

            graph = nx.DiGraph()
            graph.add_nodes_from(self.nodes.items())
            graph.add_edges_from((u, v, data) for (u, v), data in self.edges.items())
            self._graph = graph
        return self._graph


def link_attributes(a: str, b: str, bandwidth: float, latency: float, link_class: LinkClass) -> dict:
    """The attributes of both edges of the link between ``a`` and ``b``, checked."""
    if not bandwidth > 0:
        raise TopologyError(f"link {a} <-> {b} has bandwidth {bandwidth!r}", allowed="a positive bandwidth")
    if not latency >= 0:
        raise TopologyError(f"link {a} <-> {b} has latency {latency!r}", allowed="zero or a positive duration")
    return {"bandwidth": float(bandwidth), "latency": float(latency), "link_class": link_class}


def both_ways(links: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The directed edges of the full-duplex links between the node pairs ``links``: (a, b), then (b, a), pair by
    pair."""
    return [edge for a, b in links for edge in ((a, b), (b, a))]


def add_link(graph: Wiring | nx.DiGraph, a: str, b: str, *, bandwidth: float, latency: float,
             link_class: LinkClass) -> None:
    """Add one full-duplex physical link as two directed edges with the same capacity and latency."""
    attributes = link_attributes(a, b, bandwidth, latency, link_class)
    for u, v in both_ways([(a, b)]):
        graph.add_edge(u, v, **attributes)


def add_links(wiring: Wiring, ends: Iterable[tuple[str, str]], *, bandwidth: float, latency: float,
              link_class: LinkClass) -> None:
    """`add_link` for every pair of ``ends``, links of one kind: checked once, their edges (a, b) and (b, a), in
    that order, sharing one attribute dict (a builder adds a hundred thousand edges)."""
    attributes: dict | None = None
    for a, b in ends:
        attributes = attributes or link_attributes(a, b, bandwidth, latency, link_class)
        wiring.nodes.setdefault(a, {})
        wiring.nodes.setdefault(b, {})
        wiring.edges[(a, b)] = wiring.edges[(b, a)] = attributes


@dataclass
class Topology:
    """A cluster's wiring plus the facts the collectives and the network model need, compiled for speed.

    ``gpus`` lists the GPU node names in global index order; ``gpu_host[i]`` is the server (host) GPU ``i``
    sits in and ``gpu_local[i]`` its index inside that host. ``rails`` is how many NICs a host has that
    collectives can use as parallel channels (1 for single-node and shared-NIC topologies). ``gpu_domain[i]``
    is the NVLink domain of GPU ``i``: its host, except where NVLink spans hosts (an NVL72 rack). ``nvls``
    says whether the domains' NVSwitches reduce in the switch (NVLink SHARP, the `nvls` algorithm); ``sharp``
    whether the scale-out InfiniBand switches do (SHARP, the `collnet_direct` and `nvls_sharp` algorithms).
    ``host_nic_bandwidth`` is a host's NICs' bandwidth into the scale-out network together, per direction, as
    the builder wired it (0 where it built none: a single server, a single NVL72 rack, an explicit graph).
    ``explicit_graph`` says the nodes and links were listed one by one (the `graph` builder), not generated from
    a pattern: equivalent ranks may have different links (no rank folding) and GPUs may forward traffic (fault
    rerouting may pass through them).
    """

    name: str
    wiring: Wiring
    gpus: list[str]
    gpu_host: list[int]
    gpu_local: list[int]
    rails: int = 1
    gpu_model: str = "h100-sxm"
    router: Router | None = None
    params: dict = field(default_factory=dict)
    nvls: bool = False
    sharp: bool = False
    explicit_graph: bool = False
    host_nic_bandwidth: float = 0.0
    link_index: dict[tuple[str, str], int] = field(init=False, repr=False)
    link_ends: list[tuple[str, str]] = field(init=False, repr=False)
    link_bandwidth: np.ndarray = field(init=False, repr=False)
    line_rate: np.ndarray = field(init=False, repr=False)
    """Each directed link's nominal bandwidth, which `degrade` leaves as built (utilisation is of it)."""
    link_latency: np.ndarray = field(init=False, repr=False)
    link_class: list[LinkClass] = field(init=False, repr=False)
    gpu_domain: list[int] = field(init=False, repr=False)
    _routes: dict[tuple[int, int, int], tuple[tuple[int, ...], float]] = field(init=False, repr=False,
                                                                              default_factory=dict)
    _latency_of: list[float] = field(init=False, repr=False)
    """``link_latency`` as Python floats, for adding up a route's latency without numpy scalars."""
    routes_version: int = field(init=False, repr=False, default=0)
    """Counts `forget_routes` calls, so caches built from routes know when they are stale."""
    bandwidth_version: int = field(init=False, repr=False, default=0)
    """Counts the `degrade` calls that changed a bandwidth, so caches built from bandwidths (the tuner's, a plan
    cache's choices and periods) know when they are stale."""
    capacities: dict[tuple[tuple[str, float], ...], np.ndarray] = field(init=False, repr=False, default_factory=dict)
    """Usable capacity per directed link, by efficiency profile (filled by `network.effective_capacity`)."""

    def __post_init__(self) -> None:
        nodes, edges = self.wiring.nodes, self.wiring.edges
        self.gpu_domain = [nodes[gpu].get("nvlink_domain", host) for gpu, host in zip(self.gpus, self.gpu_host)]
        self.link_ends = sorted(edges)
        self.link_index = {edge: i for i, edge in enumerate(self.link_ends)}
        attributes = [edges[edge] for edge in self.link_ends]
        self.link_bandwidth = np.array([data["bandwidth"] for data in attributes], dtype=float)
        self.line_rate = self.link_bandwidth
        self.link_latency = np.array([data["latency"] for data in attributes], dtype=float)
        self._latency_of = self.link_latency.tolist()
        self.link_class = [data["link_class"] for data in attributes]

    @property
    def graph(self) -> nx.DiGraph:
        """The cluster as a networkx DiGraph (built on first use; see the module's docstring)."""
        return self.wiring.networkx()

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def num_hosts(self) -> int:
        return max(self.gpu_host) + 1 if self.gpu_host else 0

    @cached_property
    def link_class_ids(self) -> np.ndarray:
        """Each directed link's class as its index in LINK_CLASSES (for comparing classes as arrays)."""
        index: dict[str, int] = {name: i for i, name in enumerate(LINK_CLASSES)}
        return np.fromiter(map(index.__getitem__, self.link_class), dtype=np.int64, count=len(self.link_class))

    @cached_property
    def gpu_nic(self) -> list[str]:
        """The NIC each GPU drives (the GPU's own name where it has none)."""
        nic = list(self.gpus)
        index = {name: i for i, name in enumerate(self.gpus)}
        for u, v in self.wiring.edges:
            if u in index and self.wiring.nodes[v].get("kind") == "nic":
                nic[index[u]] = v
        return nic

    @cached_property
    def gpu_rail(self) -> list[int | None]:
        """The rail of the NIC each GPU drives (None where the GPU drives none, or its NIC has no rail: an
        explicit graph's)."""
        nodes = self.wiring.nodes
        return [nodes[nic].get("rail") if nic != gpu else None for gpu, nic in zip(self.gpus, self.gpu_nic)]

    @cached_property
    def _rail_gpus(self) -> dict[tuple[int, int], int]:
        """(host, rail) -> the host's first GPU (by local index) driving that rail's NIC, among GPUs with NVLink."""
        first: dict[tuple[int, int], int] = {}
        order = sorted(range(self.num_gpus), key=lambda gpu: (self.gpu_host[gpu], self.gpu_local[gpu]))
        for gpu in order:
            rail = self.gpu_rail[gpu]
            if rail is not None and self.gpu_nvlink[gpu]:
                first.setdefault((self.gpu_host[gpu], rail), gpu)
        return first

    def pxn_relay(self, src: int, dst: int) -> int | None:
        """The GPU that forwards a point-to-point message from ``src`` to ``dst`` under NCCL's PXN: where the two
        sit in different NVLink domains on different rails, the source's host's first GPU on the destination's
        rail, reached from the source over NVLink (None where there is no such GPU, or no need for one)."""
        rail = self.gpu_rail[dst]
        if (rail is None or self.gpu_rail[src] in (None, rail) or self.gpu_domain[src] == self.gpu_domain[dst]
                or not self.gpu_nvlink[src]):
            return None
        return self._rail_gpus.get((self.gpu_host[src], rail))

    @cached_property
    def gpu_nvlink(self) -> list[bool]:
        """Whether each GPU has an NVLink (to a peer or an NVSwitch); PCIe-only hosts' GPUs have none."""
        linked = {u for (u, _), data in self.wiring.edges.items() if data["link_class"] == "nvlink"}
        return [gpu in linked for gpu in self.gpus]

    @cached_property
    def gpu_domain_local(self) -> list[int]:
        """Each GPU's index inside its NVLink domain: its ``gpu_local`` where the domain is one host; across the
        trays of an NVL72 rack the trays in order, each tray's GPUs by local index (tray t's GPU j of 4 is 4t + j),
        so that GPUs of two racks with equal indices sit on the same rail."""
        per_host = Counter(self.gpu_host)
        offset: dict[int, int] = {}
        filled: dict[int, int] = {}
        for host, domain in sorted(set(zip(self.gpu_host, self.gpu_domain))):
            offset[host] = filled.get(domain, 0)
            filled[domain] = offset[host] + per_host[host]
        return [offset[host] + local for host, local in zip(self.gpu_host, self.gpu_local)]

    @cached_property
    def gpu_domain_array(self) -> np.ndarray:
        """``gpu_domain`` as an array (for reading many GPUs' domains at once)."""
        return np.array(self.gpu_domain, dtype=np.int64)

    @cached_property
    def gpu_nvlink_array(self) -> np.ndarray:
        """``gpu_nvlink`` as an array (for reading many GPUs' at once)."""
        return np.array(self.gpu_nvlink, dtype=bool)

    def first_hosts(self, hosts: int) -> Topology:
        """The GPUs of this cluster's first ``hosts`` hosts, with their hosts and NVLink domains, and no link: what
        a layout's memory and its groups' NVLink domains are resolved on, where the cluster of those hosts is
        this one cut (an elastic job's smaller sizes: a fat tree's first nodes, NVL72's first trays), without
        building its network. GPUs are numbered host by host, as the cluster and NVL72 builders number them; the
        GPUs' attribute dicts are this cluster's own, to read."""
        count = bisect_left(self.gpu_host, hosts)
        wiring = Wiring()
        wiring.nodes = {gpu: self.wiring.nodes[gpu] for gpu in self.gpus[:count]}
        return Topology(name=self.name, wiring=wiring, gpus=self.gpus[:count], gpu_host=self.gpu_host[:count],
                        gpu_local=self.gpu_local[:count], gpu_model=self.gpu_model, nvls=self.nvls)

    def host_gpus(self, host: int) -> list[int]:
        """Global indices of the GPUs in ``host``, in local order."""
        return [i for i, h in enumerate(self.gpu_host) if h == host]

    def route(self, src: int, dst: int, channel: int = 0) -> tuple[tuple[int, ...], float]:
        """The directed link ids from GPU ``src`` to GPU ``dst`` (``channel`` picks among parallel routes;
        `PXN_CHANNEL`: through the `pxn_relay`, where there is one) and the sum of their latencies, added in path
        order; worked out once per (src, dst, channel) and kept, both in one entry (one lookup per read)."""
        key = (src, dst, channel)
        route = self._routes.get(key)
        if route is None:
            route_links = getattr(self.router, "route_links", None)
            if channel == PXN_CHANNEL:
                relay = self.pxn_relay(src, dst)
                links = (self.route(src, dst)[0] if relay is None
                         else self.route(src, relay)[0] + self.route(relay, dst)[0])
            elif route_links is not None and src != dst:
                links = route_links(self, src, dst, channel)
            else:
                links = self.link_ids(self._route_nodes(src, dst, channel))
            route = self._routes[key] = (links, reduce(add, map(self._latency_of.__getitem__, links), 0.0))
        return route

    def path(self, src: int, dst: int, channel: int = 0) -> tuple[int, ...]:
        """Directed link ids from GPU ``src`` to GPU ``dst``; ``channel`` picks among parallel routes."""
        return (self._routes.get((src, dst, channel)) or self.route(src, dst, channel))[0]

    def paths(self, ends: Iterable[tuple[int, int, int]]) -> list[tuple[int, ...]]:
        """`path` of each ``(src, dst, channel)`` of ``ends``, in order, without a method call per known route: the
        fold checks and plans route all of a plan's transfers at once, most of them known."""
        known, route = self._routes.get, self.route
        return [(known(end) or route(*end))[0] for end in ends]

    def hop_signature(self, src: int, dst: int) -> list[tuple[float, str]]:
        """The bandwidth and class of each link from GPU ``src`` to GPU ``dst``, hop for hop: two transfers with
        equal signatures take the same time alone (the fold checks compare hand-offs and copies by it)."""
        return [(float(self.link_bandwidth[link]), self.link_class[link]) for link in self.path(src, dst)]

    def hop_signatures(self, src: Sequence[int], dst: Sequence[int]) -> list[tuple[tuple[float, str], ...]]:
        """`hop_signature` of each pair ``src[i]`` to ``dst[i]``, as a tuple: the routes found together (`routes`,
        channel 0), each link's hop made once. For speed: routed pair by pair, the hops of the copies of Llama 3
        405B's long-context hand-offs cost ~0.48 s of its fold checks' CPU, found together ~0.30 s."""
        ends = np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)
        matrix, _ = self.routes(*ends, np.zeros(len(ends[0]), dtype=np.int64))
        used = np.unique(matrix[matrix >= 0]).tolist()
        hop = dict(zip(used, zip(self.link_bandwidth[used].tolist(), map(self.link_class.__getitem__, used))))
        return [tuple(map(hop.__getitem__, row[:length]))
                for row, length in zip(matrix.tolist(), (matrix >= 0).sum(axis=1).tolist())]

    def link_ids(self, nodes: list[str]) -> tuple[int, ...]:
        """The directed link ids along a path of node names."""
        try:
            return tuple(map(self.link_index.__getitem__, zip(nodes, nodes[1:])))
        except KeyError as missing:
            raise TopologyError(f"route {nodes} uses a link that does not exist: {missing}") from None

    def links_between(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """The directed link ids between each pair of node names."""
        try:
            return np.fromiter(map(self.link_index.__getitem__, pairs), dtype=np.int64, count=len(pairs))
        except KeyError as missing:
            raise TopologyError(f"a route uses a link that does not exist: {missing}") from None

    def routes(self, src: np.ndarray, dst: np.ndarray, channel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`route` of many (src, dst, channel) at once: a matrix of link ids (at least one column), one route
        per row from its first column on (-1 after its end), and each route's latency, its links' added in
        path order as `route` adds them. The router's array form where it has one and no route goes through a
        PXN relay (a 16k-GPU ring's 131k routes in numpy), which keeps nothing in the route cache (a large
        phase's routes are asked for once); else `route` per row, which keeps each."""
        route_arrays = getattr(self.router, "route_arrays", None)
        moving = np.flatnonzero(src != dst)
        if route_arrays is not None and PXN_CHANNEL not in channel:
            found = route_arrays(self, src[moving], dst[moving], channel[moving])
            matrix = np.full((src.size, found.shape[1]), -1, dtype=np.int64)
            matrix[moving] = found
        else:
            paths = [self.route(*ends)[0] for ends in zip(src.tolist(), dst.tolist(), channel.tolist())]
            matrix = np.full((src.size, max(map(len, paths), default=1) or 1), -1, dtype=np.int64)
            for row, path in enumerate(paths):
                matrix[row, :len(path)] = path
        latency = np.zeros(src.size)
        for column in matrix.T:
            latency += np.where(column >= 0, self.link_latency[column], 0.0)
        return matrix, latency

    def path_latency(self, src: int, dst: int, channel: int = 0) -> float:
        """Sum of link latencies along the route from ``src`` to ``dst``."""
        return self.route(src, dst, channel)[1]

    def degrade(self, links: Sequence[int], fraction: float) -> None:
        """The directed ``links`` keep ``fraction`` of their line rate for good: a link degraded from a step's
        start (engine/faults.py) is the cluster's link at that bandwidth for every plan, check and tuner choice.
        Degrading links again to the fraction they have changes nothing (a job's healthy step is prepared on its
        degraded cluster before its run degrades it again), so faults on one link are given as their product
        (`degrade_from_start`); a change bumps `bandwidth_version`. The bandwidths
        are copied first (another topology may share them) and the capacities made from them forgotten."""
        links = list(links)
        degraded = self.line_rate[links] * fraction
        if np.array_equal(self.link_bandwidth[links], degraded):
            return
        self.link_bandwidth = self.link_bandwidth.copy()
        self.link_bandwidth[links] = degraded
        self.capacities.clear()
        self.bandwidth_version += 1

    def forget_routes(self) -> None:
        """Drop the cached routes and latencies (after the router's view of the links changed)."""
        self._routes.clear()
        self.routes_version += 1

    def _route_nodes(self, src: int, dst: int, channel: int) -> list[str]:
        if src == dst:
            return [self.gpus[src]]
        if self.router is not None:
            return self.router(self, src, dst, channel)
        # Every builder gives its topology a router: networkx serves only topologies built by hand without one.
        import networkx as nx

        try:
            return nx.shortest_path(self.graph, self.gpus[src], self.gpus[dst])
        except nx.NetworkXNoPath:
            raise TopologyError(f"GPU {self.gpus[dst]} cannot be reached from {self.gpus[src]}",
                                allowed="a graph where every GPU reaches every other") from None
