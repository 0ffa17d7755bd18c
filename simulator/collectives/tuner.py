"""The `auto` rule: pick, per collective, the algorithm and protocol NCCL's tuner would run, by the cost of what
this simulator runs for them.

NCCL (src/graph/tuning.cc `ncclTopoTuneModel` and src/enqueue.cc `topoGetAlgoInfo`, NCCL 2.30.7) gives every
algorithm and protocol it may run for a collective a latency and a bandwidth, and takes the pair whose latency +
size / bandwidth is lowest. `candidates` is its list of algorithms, as far as they are modelled here, and
protocols.py says which protocols each runs under; `estimates` costs each algorithm under one protocol as
latency + size / bandwidth too, but from the shape of this simulator's own plan of that algorithm on the
topology's links at the bandwidths the network model gives them (the run's per-class efficiencies), with what
the protocol changes (its latency per hop, its payload's share of the wire, the stall of Simple's window of
chunk steps in flight, which the plans charge), so the pick is the pair the simulation ranks fastest and its
estimate stays close to the simulated time (tests/test_auto.py bounds both); an LL or LL128 ring, the tree
all-reduce under every protocol and the NVLS tree across nodes are weighed no faster than NCCL's caps on their
busbw (`nccl_capped`), as NCCL's tuner rates them.
docs/collectives.md, "The `auto` rule", says it in prose.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import lru_cache
from operator import attrgetter
from typing import Any, NamedTuple, TypeVar

import numpy as np

from simulator.catalog.sharp import collnet_direct_latency
from simulator.collectives import collnet_direct, nvls, nvls_sharp, protocols, ring
from simulator.collectives.busbw import bus_bandwidth_factor
from simulator.collectives.channels import kernel_channels
from simulator.collectives.chunking import NCCL_STEPS, pipeline_chunk
from simulator.collectives.names import PROTOCOLS, AlgorithmChoice, AlgorithmName, Protocol, ProtocolChoice
from simulator.collectives.phases import NVLINK, CollectiveRequest, HopKind, Phase, hop_kind, hop_kinds, window_stall
from simulator.collectives.ring import RING_STEPS, channel_count, group_by_domain, group_by_host, nics_used
from simulator.collectives.tree import all_reduce_edges, chunk_count, nccl_nodes, pipeline_stretches, tree_shape
from simulator.network.model import effective_capacity
from simulator.topology.graph import Topology
from simulator.topology.periods import Periods

T = TypeVar("T")


def candidates(request: CollectiveRequest, topology: Topology, hosts: list[list[int]]) -> list[AlgorithmName]:
    """The modelled algorithms NCCL's tuner weighs for ``request`` (``hosts``: its members per host), in
    tie-breaking order. Broadcast and reduce: the ring only (NCCL costs no other algorithm for them).
    Reduce-scatter and all-gather: the ring, and NVLS inside one NVLink-SHARP domain (NCCL >= 2.19; across hosts
    NCCL runs them through CollNet only, not modelled; PAT, for one GPU per host, is not modelled). All-reduce:
    the ring; the tree across NCCL's nodes (`nccl_nodes`: NVLink domains, so a GB200 rack of 18 trays is one;
    inside one node NCCL's tree is a chain of its GPUs, connect.cc `ncclTopoPreset`'s `treeIntra`, which the
    `tree` here, a double binary tree over the ranks or over the hosts' chains, is not); NVLS inside one domain
    and, with as many members on every NVLink domain and at least `nvls.MIN_HEADS` heads on each (members on
    distinct NICs), NCCL's NVLS tree across domains (`nvls`), on GPUs that drive NVLink SHARP; CollNetDirect
    and multi-node NVLS (`nvls_sharp`) where the switches reduce (NCCL enables both only with CollNet).
    `hierarchical` is not an NCCL algorithm and is never a candidate."""
    op = request.op
    inside = nccl_nodes(topology, request.ranks) == 1
    nvls_domain = nvls.supports(request.ranks, topology)
    if op in ("broadcast", "reduce"):
        return ["ring"]
    if op in ("reduce_scatter", "all_gather"):
        return ["ring", "nvls"] if nvls_domain else ["ring"]
    found: list[AlgorithmName] = ["ring"]
    if nvls_domain:
        return [*found, "nvls"]
    if inside:
        return found
    found.append("tree")
    domains = group_by_domain(request.ranks, topology)
    even = len({len(members) for members in domains}) == 1
    if (nvls.available(topology) and even and nics_used(topology, domains) >= nvls.MIN_HEADS
            and nvls.switches_up(request.ranks, topology)):
        found.append("nvls")
    if collnet_direct.supports(request.ranks, topology):
        found.append("collnet_direct")
        if nvls_sharp.fits(topology, hosts):
            found.append("nvls_sharp")
    return found


class Hop(NamedTuple):
    """The route between two members: one-way ``latency`` (s), bottleneck ``bandwidth`` (bytes/s of payload) as
    the network model runs it (line rate times the link class's efficiency, times the protocol's payload
    share) and bottleneck ``line_rate`` (bytes/s), at which the plans read a chunk's time for the window's stall
    (execute.py `phase_items`), ``kind`` the `HopKind` it crosses and whether its streamed steps wait on Simple's
    window (``windowed``)."""

    latency: float
    bandwidth: float
    line_rate: float
    kind: HopKind = NVLINK
    windowed: bool = True

    def stall(self, chunk: float) -> float:
        """`window_stall` of a streamed step carrying ``chunk`` bytes over this hop (none but under Simple)."""
        return window_stall(self.latency, chunk / self.line_rate, NCCL_STEPS) if self.windowed else 0.0

    def under(self, algorithm: AlgorithmName, protocol: Protocol) -> Hop:
        """This hop as ``algorithm``'s steps cross it under ``protocol`` (protocols.py): its latency scaled by
        the protocol's ratio for its kind, its bandwidth times the payload's share of the wire."""
        if protocol == "simple":
            return self
        fraction = protocols.PAYLOAD_FRACTION[protocol]
        return Hop(self.latency * protocols.cost(algorithm, protocol).latency_scale[self.kind],
                   self.bandwidth * fraction, self.line_rate, self.kind, windowed=False)


NO_HOP = Hop(0.0, math.inf, math.inf)
"""The intra-host hop of a group with one member per host: none, free."""


class PhaseLoad(NamedTuple):
    """One phase of a plan as the engine runs it, for the estimates of the ring across hosts (its one phase, a step
    of which every member of each channel's ring sends n / (p ch) to its successor on that channel's route) and of
    the NVLS tree (the in-switch transfers and the level across domains at once): each transfer's path ``latencies``
    and hop ``kinds``, the bytes each link their routes use carries per byte of the collective (``load``, links in
    order of first use) and those links' usable ``capacity`` (bytes/s); ``links``, the links each transfer's route
    uses (-1 past its end), and ``nbytes``, the bytes each transfer carries per byte of the collective, for phases
    whose transfers run a step at a time (`step_seconds`). The transfers that share links are equal, so
    under max-min sharing the phase lasts as long as its most loaded link takes (`seconds`): on an oversubscribed
    fabric the uplinks the channels' routes hash onto, which one route's bottleneck does not show (4 channels over 2
    spines share each uplink two by two). The load scales with the size, so it is found once per group and
    efficiency (`plan_load`)."""

    latencies: np.ndarray
    kinds: np.ndarray
    load: np.ndarray
    capacity: np.ndarray
    links: np.ndarray
    nbytes: np.ndarray

    def seconds(self, nbytes: float, fraction: float = 1.0) -> float:
        """How long the phase of a collective of ``nbytes`` keeps its most loaded link busy, ``fraction`` of
        each link's capacity carrying payload."""
        return nbytes * float((self.load / (self.capacity * fraction)).max())

    def step_seconds(self, nbytes: float, steps: int, fraction: float = 1.0) -> float:
        """How long ``steps`` steps take end to end on their most loaded links where transfer i runs in step
        i % ``steps`` with the others of that step only (an unchunked chain's edges, channel by channel:
        `ring.chain_step`), for a collective of ``nbytes``."""
        on_route = self.links >= 0
        step = np.broadcast_to((np.arange(len(self.links)) % steps)[:, None], self.links.shape)[on_route]
        weights = np.broadcast_to(self.nbytes[:, None], self.links.shape)[on_route]
        load = np.bincount(step * self.capacity.size + self.links[on_route], weights=weights,
                           minlength=steps * self.capacity.size).reshape(steps, self.capacity.size)
        return nbytes * float((load / (self.capacity * fraction)).max(axis=1).sum())

    def latency(self, protocol: Protocol) -> float:
        """The mean of the transfers' latencies under ``protocol``, each scaled for its kind of hop (a ring step's,
        a pipelined phase's in execute.py `step_latencies`)."""
        return float(self.scaled_latencies(protocol).mean())

    def scaled_latencies(self, protocol: Protocol) -> np.ndarray:
        """The transfers' latencies under ``protocol``, each scaled for its kind of hop."""
        if protocol == "simple":
            return self.latencies
        scale = np.array(protocols.cost("ring", protocol).latency_scale)
        return self.latencies * scale[self.kinds]

    def key(self) -> tuple[bytes, ...]:
        """The arrays' contents, for `GroupTerms.key`."""
        return tuple(array.tobytes() for array in self)


def plan_load(topology: Topology, request: CollectiveRequest,
              plan: Callable[[CollectiveRequest, Topology], list[Phase]], efficiency: Mapping[str, float] | None
              ) -> PhaseLoad:
    """The `PhaseLoad` of the one-phase ``plan`` of ``request``'s group on its channels, on links that reach
    ``efficiency`` (`kept` per group, root, direction and efficiency)."""

    def build() -> PhaseLoad:
        (phase,) = plan(replace(request, nbytes=1.0), topology)
        src, dst, channel = (np.fromiter(map(field, phase.transfers), dtype=np.int64, count=len(phase.transfers))
                             for field in (attrgetter("src"), attrgetter("dst"), attrgetter("channel")))
        nbytes = np.fromiter(map(attrgetter("nbytes"), phase.transfers), dtype=float, count=len(phase.transfers))
        routes, latencies = topology.routes(src, dst, channel)
        on_route = routes >= 0
        used, link_of = first_use(routes[on_route])
        load = np.bincount(link_of, weights=np.broadcast_to(nbytes[:, None], routes.shape)[on_route],
                           minlength=used.size)
        links = np.full(routes.shape, -1, dtype=np.int64)
        links[on_route] = link_of
        return PhaseLoad(latencies, hop_kinds(topology, src, dst), load,
                         effective_capacity(topology, efficiency or {})[used], links, nbytes)

    return kept(topology, (plan, request.ranks, request.channels, request.root, request.op == "reduce",
                           profile_of(efficiency)), build)


def first_use(links: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``links`` in order of first use, and each entry of ``links`` as a position in that order:
    numbered so, translated groups that load their links alike give equal arrays (and `GroupTerms` keys)."""
    ids, first, inverse = np.unique(links, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    return ids[order], position[inverse.reshape(-1)]


def profile_of(efficiency: Mapping[str, float] | None) -> tuple[tuple[str, float], ...]:
    """``efficiency`` as a key (link class -> fraction of line rate, sorted; empty: line rate)."""
    return tuple(sorted(efficiency.items())) if efficiency else ()


def kept(topology: Topology, key: tuple, build: Callable[[], T]) -> T:
    """``build()``, kept per topology (as its routes and bandwidths stand) and ``key`` in `KEPT`: a run weighs
    several sizes of one group, each under every protocol, and the routes of a group's plan do not depend on
    them."""
    entries = KEPT.get(id(topology))
    if entries is None:
        entries = KEPT[id(topology)] = {}
        weakref.finalize(topology, KEPT.pop, id(topology), None)
    full_key = (*key, topology.routes_version, topology.bandwidth_version)
    found = entries.get(full_key)
    if found is not None:
        return found
    if len(entries) >= KEPT_PER_TOPOLOGY:
        entries.clear()
    entries[full_key] = result = build()
    return result


KEPT: dict[int, dict[tuple, Any]] = {}
"""`kept`'s results by topology (its id, dropped when the topology is collected, so that a sweep's topologies do
not stay alive and an id another takes later finds nothing) and key."""
KEPT_PER_TOPOLOGY = 4096
"""Entries kept per topology before they are dropped (a 16k-GPU run weighs a few hundred groups)."""


def hop(topology: Topology, capacity: np.ndarray, src: int, dst: int) -> Hop:
    """The `Hop` from ``src`` to ``dst`` on links of usable ``capacity`` (bytes/s, by link). The bottlenecks are
    read link by link: `auto` asks for hops thousands of times per run, and indexing numpy arrays by a route of
    a few links costs more than reading its items."""
    path = topology.path(src, dst)
    return Hop(topology.path_latency(src, dst), min(map(capacity.item, path)),
               min(map(topology.link_bandwidth.item, path)), hop_kind(topology, src, dst))


class GroupTerms(NamedTuple):
    """All that the estimates read of a group and the topology, as plain figures (`group_terms`): its ``size``,
    its hosts (``host_count``) and the members on the fullest (``widest``), the algorithms weighed (``names``) and
    the protocols each runs under (``able``, in ``names``' order), its hops under Simple (`_estimate`'s a_in/b_in
    and a_out/b_out; ``chain_hop`` the slowest between consecutive hosts, `slowest_host_hop`), the ring's channels
    (counted over NVLink domains, as ring.py plans them), NVLS's
    in-switch efficiency, whether it lies in one NVLS domain, the one-phase plans' loads by algorithm and the
    tree's passes with the links they cross (None but for the tree). No GPU or link is named, so groups placed
    alike on links alike have equal terms: `choose` keys its choices by them (`key`) and the request's op and
    size fields, the rest of what the estimates read."""

    size: int
    host_count: int
    widest: int
    names: tuple[AlgorithmName, ...]
    able: tuple[tuple[Protocol, ...], ...]
    inner: Hop
    outer: Hop
    chain_hop: Hop
    channels: int
    nvls_rate: float
    nvls_domain: bool
    loads: tuple[tuple[AlgorithmName, PhaseLoad], ...]
    tree: TreeTerms | None
    caps: BusCaps
    """NCCL's caps on the ring's, the tree's and the NVLS tree's busbw (`bus_caps`)."""
    tree_nodes: tuple[int, float]
    """NCCL's nodes and members per node (`tree.tree_shape`), which size the LL128 tree's chunk."""
    nodes: int
    """NCCL's nodes for the group (`nccl_nodes`): the NVLink domains it spans, the levels of the NVLS tree."""

    def key(self) -> tuple:
        """The terms as a hashable value: the arrays by their contents."""
        loads = tuple((name, load.key()) for name, load in self.loads)
        plain = tuple(getattr(self, name) for name in self._fields if name not in ("loads", "tree"))
        return (*plain, loads, self.tree and self.tree.key())


def group_terms(request: CollectiveRequest, topology: Topology, efficiency: Mapping[str, float] | None,
                algorithms: tuple[AlgorithmName, ...] | None = None, hosts: list[list[int]] | None = None
                ) -> GroupTerms:
    """The `GroupTerms` of ``request``'s group weighing ``algorithms`` (None: its `candidates`) on links that
    reach ``efficiency`` (link class -> fraction of line rate, as the network model takes it; None: line
    rate), ``hosts`` its members per host when the caller has them."""
    hosts = hosts or group_by_host(request.ranks, topology)
    count, g = len(hosts), max(len(members) for members in hosts)
    widest = max(hosts, key=len)
    capacity = effective_capacity(topology, efficiency or {})
    inner = hop(topology, capacity, widest[0], widest[1]) if g > 1 else NO_HOP
    outer = hop(topology, capacity, hosts[0][0], hosts[1][0]) if count > 1 else inner
    domains = group_by_domain(request.ranks, topology)
    channels = channel_count(request, topology, domains)
    chain_hop = slowest_host_hop(topology, capacity, hosts) if count > 1 and request.op not in RING_STEPS else outer
    names = algorithms or tuple(candidates(request, topology, hosts))
    able = tuple(protocols.available(name, request.op, request.ranks, topology) for name in names)
    nvls_rate = nvls.in_switch_efficiency(topology) if {"nvls", "nvls_sharp"} & set(names) else 1.0
    nvls_domain = "nvls" in names and nvls.supports(request.ranks, topology)
    loads: list[tuple[AlgorithmName, PhaseLoad]] = []
    if count > 1 and "ring" in names:
        ring_plan = ring.plan if request.op in RING_STEPS else ring.chain_step
        loads.append(("ring", plan_load(topology, request, ring_plan, efficiency)))
    if count > 1 and "nvls" in names and not nvls_domain:
        loads.append(("nvls", plan_load(topology, request, nvls.plan, efficiency)))
    tree = tree_terms(request, topology, domains, channels, efficiency) if "tree" in names else None
    nodes = nccl_nodes(topology, request.ranks)
    return GroupTerms(len(request.ranks), count, g, names, able, inner, outer, chain_hop, channels, nvls_rate,
                      nvls_domain, tuple(loads), tree, bus_caps(request.ranks, topology, names, channels),
                      tree_shape(request.ranks, topology), nodes)


def slowest_host_hop(topology: Topology, capacity: np.ndarray, hosts: list[list[int]]) -> Hop:
    """The slowest `Hop` (least bandwidth, then most latency) between consecutive hosts of the group's first ring,
    the hop a ring's broadcast or reduce chain waits on: the ring runs by NVLink domain (`ring.group_by_domain`),
    so where the group spans domains the slowest of its hops between them, else of its hops between hosts (two
    trays of one GB200 rack meet over NVLink)."""
    domains = group_by_domain(tuple(rank for members in hosts for rank in members), topology)
    order = ring.ring_order(domains, topology, 0)
    host_of = topology.gpu_domain if len(domains) > 1 else topology.gpu_host
    crossings = [(src, dst) for src, dst in zip(order, order[1:]) if host_of[src] != host_of[dst]]
    return min((hop(topology, capacity, src, dst) for src, dst in crossings),
               key=lambda found: (found.bandwidth, -found.latency))


GB = 1e9
GENERATIONS: Mapping[str, str] = {"a100-40gb": "ampere", "a100-80gb": "ampere", "h100-sxm": "hopper",
                                  "h200": "hopper", "b200": "blackwell", "gb200": "blackwell"}
"""The generation of each catalog GPU, the row of NCCL's tuning tables it reads (tuning.cc compCapIndex)."""
LL_BUS_CAPS_ONE_HOST: Mapping[str, float] = {"ampere": 87.7 * GB, "hopper": 141.0 * GB, "blackwell": 282.0 * GB}
"""NCCL's cap on LL's busbw inside one host, by the GPU's generation (tuning.cc `llMaxBws`, column N1: Ampere
87.7 GB/s, Hopper 141, Blackwell 2 x 141; NVIDIA/nccl master 5067397)."""
LL128_RING_CAPS_PER_CHANNEL: Mapping[str, float] = {"ampere": 20.0 * GB, "hopper": 36.7 * GB, "blackwell": 40.0 * GB}
"""NCCL's cap on the LL128 ring's busbw per channel, by the GPU's generation, on any number of hosts (tuning.cc
`perChMaxRingLL128Bws`, NVIDIA/nccl master 5067397: `busBw = min(busBw * 0.92, nChannels *
perChMaxRingLL128Bw)`)."""
LL128_TREE_CAPS_PER_CHANNEL: Mapping[str, tuple[float, float, float]] = {
    "ampere": (20.0 * GB, 20.0 * GB, 20.0 * GB), "hopper": (36.7 * GB, 36.7 * GB, 29.0 * GB),
    "blackwell": (55.6 * GB, 31.67 * GB, 20.0 * GB)}
"""NCCL's cap on the LL128 tree's busbw per channel, by the GPU's generation over 1, 2 and more hosts (tuning.cc
`perChMaxTreeLL128Bws`, NVIDIA/nccl master 5067397: `busBw = min(busBw * 120/128, nChannels *
perChMaxTreeLL128Bw)` across hosts)."""
LL_BUS_CAPS_INTEL = (39.0 * GB, 20.4 * GB)
LL_BUS_CAPS_AMD = (22.5 * GB, 19.0 * GB)
"""NCCL's caps on LL's busbw across 2 hosts and across more (`llMaxBws`, columns N2 and N4), which across hosts
NCCL picks by the hosts' CPU vendor: AMD's row (its Ampere row) or the others' (its Volta/Intel row)."""
AMD_HOSTED = frozenset({"a100-40gb", "a100-80gb"})
"""GPUs whose hosts are taken to have AMD CPUs (DGX A100: AMD EPYC 7742); the CPU is not modelled, so the
others' hosts read as NCCL reads Intel's (DGX H100, H200 and B200: Intel Xeon) and Grace (not AMD)."""


def generation(gpu_model: str) -> str:
    """``gpu_model``'s row of NCCL's tuning tables (`GENERATIONS`; a GPU outside the catalog reads as Hopper)."""
    return GENERATIONS.get(gpu_model, "hopper")


def ll_bus_cap(gpu_model: str, nodes: int) -> float:
    """NCCL's cap on LL's busbw (bytes/s) for a group over NCCL's ``nodes`` (`nccl_nodes`) of ``gpu_model`` GPUs
    (tuning.cc `ncclTopoTuneModel`: ``llMaxBw``, which bounds the LL ring's and the LL tree's bandwidth)."""
    if nodes == 1:
        return LL_BUS_CAPS_ONE_HOST[generation(gpu_model)]
    across = LL_BUS_CAPS_AMD if gpu_model in AMD_HOSTED else LL_BUS_CAPS_INTEL
    return across[0] if nodes == 2 else across[1]


def ll128_bus_caps(gpu_model: str, nodes: int, channels: int) -> tuple[float, float]:
    """NCCL's caps on LL128's busbw (bytes/s) for the ring and the tree over NCCL's ``nodes`` (`nccl_nodes`) of
    ``gpu_model`` GPUs on NCCL's ``channels`` (`bus_caps` says which count): the per-channel caps
    (`LL128_RING_CAPS_PER_CHANNEL`, `LL128_TREE_CAPS_PER_CHANNEL`, its column by nodes as tuning.cc's index2)
    times the channels."""
    row = generation(gpu_model)
    return (channels * LL128_RING_CAPS_PER_CHANNEL[row],
            channels * LL128_TREE_CAPS_PER_CHANNEL[row][min(nodes, 3) - 1])


TREE_CAPS_PER_CHANNEL: Mapping[str, tuple[float, float, float]] = {
    "ampere": (24.0 * GB, 23.6 * GB, 17.8 * GB), "hopper": (38.7 * GB, 41.4 * GB, 36.0 * GB),
    "blackwell": (70.0 * GB, 42.8 * GB, 24.0 * GB)}
"""NCCL's cap on the tree all-reduce's busbw per channel under every protocol, by the GPU's generation over 1, 2
and more nodes (tuning.cc `perChMaxTreeBws`, NVIDIA/nccl master 5067397: `busBw = min(busBw * .92, nChannels *
perChMaxTreeBw)`, before LL's and LL128's own caps)."""
LL_TREE_SHARE = 1 / 3.8
"""The share of the tree's busbw NCCL rates its LL tree at (tuning.cc: `min(busBw * 1.0 / 3.8, llMaxBw)`)."""
LL128_TREE_SHARE = 120 / 128
"""The share of the tree's busbw NCCL rates its LL128 tree at across nodes (tuning.cc: `min(busBw * (nNodes == 1 ?
7.0 / 9.0 : 120.0 / 128.0), nChannels * perChMaxTreeLL128Bw)`; inside one node, where NCCL's tree is a chain,
`bus_caps` weighs no tree cap, so its 7/9 is not read)."""
LONE_TREE_SHARE = 0.85
"""What NCCL rates the tree's busbw at where its tree graph has the plain tree pattern (tuning.cc: `busBw *= .85`
where `maxTreePattern == NCCL_TOPO_PATTERN_TREE`). search.cc gives that pattern to a tree graph over one GPU a node,
and on compute capability 9.0 and up to a search that finds no balanced tree ("Try a simpler tree"); modelled: one
member per node only, the fallback's search not being."""
NVLS_TREE_CAPS_PER_CHANNEL: Mapping[str, tuple[float, float]] = {
    "ampere": (23.6 * GB, 17.8 * GB), "hopper": (57.7 * GB, 45.5 * GB), "blackwell": (96.0 * GB, 80.0 * GB)}
"""NCCL's cap on the NVLS tree's busbw per channel (a head), by the GPU's generation over 2 nodes and more
(tuning.cc `perChMaxNVLSTreeBws`, NVIDIA/nccl master 5067397: `bw = min({intraBw, interBw, perChMaxNVLSTreeBw})`,
`busBw = nChannels * bw`, the NVLS graph's channels being its heads a node)."""


class BusCaps(NamedTuple):
    """NCCL's caps on busbw (bytes/s) that `auto` weighs (`nccl_capped`): the ring's under LL128 and LL, the tree
    all-reduce's under Simple, LL128 and LL, the NVLS tree's (inf where NCCL sets none)."""

    ring: tuple[float, float, float]
    tree: tuple[float, float, float]
    nvls_tree: float

    def of(self, name: AlgorithmName, protocol: Protocol) -> float:
        """The cap on ``name`` under ``protocol`` (inf: none)."""
        if name == "nvls":
            return self.nvls_tree
        if name in ("ring", "tree"):
            return getattr(self, name)[PROTOCOLS.index(protocol)]
        return math.inf


def bus_caps(ranks: tuple[int, ...], topology: Topology, names: tuple[AlgorithmName, ...], channels: int
             ) -> BusCaps:
    """NCCL's `BusCaps` for a group of ``ranks`` weighing ``names`` over NCCL's nodes (`nccl_nodes`), whose ring
    and tree run ``channels`` (ring.py `channel_count`: the channels of NCCL's search, which tuning.cc's
    `graphs[a]->nChannels` counts before init duplicates them): each cap is the busbw NCCL's tuner rates the pair
    at however fast its own model of the links (`ll_bus_cap`; `ll128_bus_caps` and `tree_bus_caps` across nodes
    on the search's channels, as tuning.cc multiplies both by that one count; `nvls_tree_bus_cap` on the heads).
    Inside one node, where the ring model runs one channel, not NCCL's search's, the LL128 caps multiply the
    kernel's channels (`nccl_channels`)."""
    gpu, nodes = topology.gpu_model, nccl_nodes(topology, ranks)
    ll_cap = ll_bus_cap(gpu, nodes)
    ring_ll128, tree_ll128 = ll128_bus_caps(gpu, nodes, channels if nodes > 1 else nccl_channels(topology, ranks))
    lone = min(Counter(topology.gpu_domain[rank] for rank in ranks).values()) == 1
    nvls_tree = math.inf
    if "nvls" in names and nodes > 1:
        hosts = group_by_domain(ranks, topology)
        nvls_tree = nvls_tree_bus_cap(gpu, nodes, len(nvls.domain_heads(hosts, topology)[0]))
    # inside one node NCCL's tree is a chain (`candidates`), not the tree asked for by name here
    tree = tree_bus_caps(gpu, nodes, channels, lone, (tree_ll128, ll_cap)) if nodes > 1 else (
        math.inf, tree_ll128, ll_cap)
    return BusCaps((math.inf, ring_ll128, ll_cap), tree, nvls_tree)


def tree_bus_caps(gpu_model: str, nodes: int, channels: int, lone: bool, caps: tuple[float, float]
                  ) -> tuple[float, float, float]:
    """NCCL's caps on the tree all-reduce's busbw (bytes/s) under Simple, LL128 and LL over ``nodes`` of
    ``gpu_model`` GPUs on ``channels``: `TREE_CAPS_PER_CHANNEL` times the channels under every protocol, under LL128
    and LL its share of that (`LL128_TREE_SHARE`, `LL_TREE_SHARE`) and no more than those protocols' own ``caps``
    (the LL128 tree's, LL's), all at `LONE_TREE_SHARE` where some node holds one member (``lone``; modelled: one
    member per node only). ``nodes`` is 2 or more: inside one node `bus_caps` weighs no tree cap."""
    tree = channels * TREE_CAPS_PER_CHANNEL[generation(gpu_model)][min(nodes, 3) - 1]
    share = LONE_TREE_SHARE if lone else 1.0
    ll128 = min(tree * LL128_TREE_SHARE, caps[0])
    return share * tree, share * ll128, share * min(tree * LL_TREE_SHARE, caps[1])


def nvls_tree_bus_cap(gpu_model: str, nodes: int, heads: int) -> float:
    """NCCL's cap on the NVLS tree's busbw (bytes/s) over ``nodes`` (2 or more) of ``gpu_model`` GPUs with
    ``heads`` a node: `NVLS_TREE_CAPS_PER_CHANNEL` times the heads."""
    return heads * NVLS_TREE_CAPS_PER_CHANNEL[generation(gpu_model)][nodes > 2]


def nccl_channels(topology: Topology, ranks: tuple[int, ...]) -> int:
    """The channels NCCL runs a ring or tree kernel over ``ranks`` on (channels.py `kernel_channels`, the count
    the SM contention model holds), which NCCL's per-channel LL128 caps multiply inside one node (`bus_caps`;
    across nodes they multiply the search's). The GPU's SM table is read here, not at import, so
    `trainsim collective` starts without the workload builders and the schema."""
    from simulator.workload.calibrated import sm_share

    return kernel_channels(sm_share(topology.gpu_model), topology, ranks)


def nccl_capped(request: CollectiveRequest, terms: GroupTerms, name: AlgorithmName, protocol: Protocol,
                seconds: float) -> float:
    """An estimate no faster than NCCL's tuner allows (`BusCaps`): the LL and LL128 ring and the NVLS tree across
    nodes weigh at least their base latency (the NVLS tree: its latency floor, `nvls.tree_latency`) plus the
    bytes NCCL's busbw counts (the op's nccl-tests factor) at the cap; the tree all-reduce, under every protocol,
    weighs on one line: its own estimate's latency plus twice the size (tuning.cc's ratio of 0.5) at the lower of
    its own busbw and the cap (`tree_seconds_per_byte`); ``seconds`` as they are for the others. The cap weighs
    the choice only; the plan the choice runs is not slowed."""
    cap = terms.caps.of(name, protocol)
    if cap == math.inf or (name == "nvls" and terms.nvls_domain):
        return seconds
    if name == "tree":
        return seconds + request.nbytes * max(0.0, 2.0 / cap - tree_seconds_per_byte(request, terms, protocol))
    factor = bus_bandwidth_factor(request.op, terms.size)
    latency = nvls.tree_latency(terms.nodes) if name == "nvls" else protocols.base_latency(name, protocol)
    return max(seconds, latency + factor * request.nbytes / cap)


SLOPE_BYTES = float(1 << 36)
"""The size (64 GiB) from which `tree_seconds_per_byte` reads the slope of the tree's own estimate, far past
where its fixed costs (hop latencies, the pipeline's fill and drain) weigh."""


def tree_seconds_per_byte(request: CollectiveRequest, terms: GroupTerms, protocol: Protocol) -> float:
    """The seconds a byte of the all-reduce adds to the tree's own estimate under ``protocol`` (`_estimate`) for
    ``request``'s group: the slope of that estimate between `SLOPE_BYTES` and twice that, its reciprocal the
    tree's own busbw over 2 (tuning.cc's ratio of 0.5). The slope does not depend on the request's size, so it
    is found once per tree and `slope_key` (`SLOPES`): two estimates at 64 and 128 GiB cost three times the
    weighing of one size."""
    assert terms.tree is not None, "the tree is weighed with its terms"
    slopes = SLOPES.of(terms.tree.key())
    key = slope_key(request, terms, protocol)
    found = slopes.get(key)
    if found is not None:
        return found

    def seconds(nbytes: float) -> float:
        return _estimate(replace(request, nbytes=nbytes), terms, "tree", protocol, None)

    slopes[key] = slope = (seconds(2 * SLOPE_BYTES) - seconds(SLOPE_BYTES)) / SLOPE_BYTES
    return slope


def slope_key(request: CollectiveRequest, terms: GroupTerms, protocol: Protocol) -> tuple:
    """All that the tree's own estimate (`_estimate`, `tree_estimate`) reads besides the size and the tree's terms
    (`SLOPES` keeps slopes by `TreeTerms.key` first): the NVLink hop, NCCL's nodes and members per node, the
    request's chunk and ``protocol``."""
    return terms.inner, terms.tree_nodes, request.chunk_bytes, protocol


class TreeSlopes:
    """`tree_seconds_per_byte`'s slopes by tree (`TreeTerms.key`), then by `slope_key`: `auto` weighs many sizes
    of one group, each under every protocol. A tree's key holds its links' bytes (43 KB for 128 GPUs, 361 KB for
    1,024), so it is held once for every hop, chunk and protocol, and all slopes are dropped when the keys held
    would pass `SLOPE_KEY_BYTES_KEPT`."""

    def __init__(self) -> None:
        self.by_tree: dict[tuple, dict[tuple, float]] = {}
        self.held = 0

    def of(self, tree: tuple) -> dict[tuple, float]:
        """The slopes kept for ``tree`` (a `TreeTerms.key`), to be read and added to; empty when new."""
        found = self.by_tree.get(tree)
        if found is None:
            size = held_bytes(tree)
            if self.held + size > SLOPE_KEY_BYTES_KEPT:
                self.clear()
            self.held += size
            found = self.by_tree[tree] = {}
        return found

    def clear(self) -> None:
        """Drop every slope and key."""
        self.by_tree.clear()
        self.held = 0


def held_bytes(key: object) -> int:
    """The length of the `bytes` in ``key`` (nested tuples searched): what a key of arrays by contents holds."""
    if isinstance(key, bytes):
        return len(key)
    return sum(map(held_bytes, key)) if isinstance(key, tuple) else 0


SLOPES = TreeSlopes()
"""The slopes `tree_seconds_per_byte` has found."""
SLOPE_KEY_BYTES_KEPT = 32 << 20
"""The bytes (32 MiB) of tree keys `SLOPES` holds before it drops them all."""


def estimates(request: CollectiveRequest, topology: Topology, efficiency: Mapping[str, float] | None = None,
              protocol: Protocol = "simple", algorithms: tuple[AlgorithmName, ...] | None = None
              ) -> dict[AlgorithmName, float]:
    """Latency + size / bandwidth estimates (seconds) under ``protocol`` of the `candidates` for ``request``
    (or of ``algorithms``) that run under it: `terms_estimates` for one protocol."""
    return terms_estimates(request, group_terms(request, topology, efficiency, algorithms), (protocol,))[protocol]


def terms_estimates(request: CollectiveRequest, terms: GroupTerms, wanted: tuple[Protocol, ...]
                    ) -> dict[Protocol, dict[AlgorithmName, float]]:
    """Per protocol in ``wanted``, latency + size / bandwidth estimates (seconds) of the algorithms of ``terms``
    that run under it, each with NCCL's base latency of the algorithm under the protocol
    (`protocols.base_latency`), which its plan charges once, and each no faster than NCCL's caps
    (`nccl_capped`). Of ``request`` only its op, size and chunk are
    read: the group's hops and channels are in ``terms``, found once for every protocol (only the hops'
    latency and payload share depend on it)."""
    loads = dict(terms.loads)
    return {protocol: {name: nccl_capped(request, terms, name, protocol,
                                         _estimate(request, terms, name, protocol, loads.get(name)))
                       for name, able in zip(terms.names, terms.able) if protocol in able} for protocol in wanted}


def _estimate(request: CollectiveRequest, terms: GroupTerms, name: AlgorithmName, protocol: Protocol,
              load: PhaseLoad | None) -> float:
    """One algorithm's estimate under one protocol (`terms_estimates`), from the group's hops under Simple
    (latency a, bottleneck bandwidth b): a_in, b_in between two members of the fullest host, a_out, b_out
    between the first members of the first two hosts; the ring and the NVLS tree across hosts from their plans'
    own phase (``load``), the double tree from its plan's edges (`tree_estimate`)."""
    fraction = protocols.PAYLOAD_FRACTION[protocol]
    if name == "tree" and terms.tree is not None:
        tree_s = tree_estimate(request, terms.tree, terms.inner, protocol, terms.tree_nodes)
        return tree_s + protocols.base_latency(name, protocol)
    if name == "ring" and load is not None and request.op not in RING_STEPS:
        chunk = pipeline_chunk(request.chunk_bytes, protocol, request.nbytes / terms.channels)
        return chain_estimate(request.nbytes, terms.size, terms.channels, chunk, terms.inner.under(name, protocol),
                              (terms.chain_hop.under(name, protocol), load.scaled_latencies(protocol),
                               load.seconds(1.0, fraction), load.step_seconds(1.0, terms.size - 1, fraction))
                              ) + protocols.base_latency(name, protocol)
    if name == "ring" and load is not None:
        step = load.latency(protocol) + load.seconds(request.nbytes, fraction)
        return RING_STEPS[request.op](terms.size) * step + protocols.base_latency(name, protocol)
    if name == "nvls" and load is not None:
        # one phase whose transfers all wait the tree's latency floor (nvls.plan), then its busiest link
        return nvls.tree_latency(terms.nodes) + load.seconds(request.nbytes)
    inner, outer = terms.inner.under(name, protocol), terms.outer.under(name, protocol)
    return _transfer_estimate(request, terms, name, inner, outer, protocol) + protocols.base_latency(name, protocol)


def _transfer_estimate(request: CollectiveRequest, terms: GroupTerms, name: AlgorithmName, inner: Hop, outer: Hop,
                       protocol: Protocol) -> float:
    """``name``'s latency + size / bandwidth on hops already under its protocol (`_estimate`): p ranks on N
    hosts, g members on the fullest, n bytes, ch the channels (ring.channel_count), L the pipeline chunks of a
    chain. NVLS loads its switch links at its in-switch efficiency (nvls.in_switch_efficiency), as its plan does."""
    n, size, g = request.nbytes, terms.size, terms.widest
    (a_in, b_in, *_), (_, b_out, *_) = inner, outer
    if name == "ring" and request.op in RING_STEPS:
        # Inside one host (across hosts: `PhaseLoad`): per step every GPU's link carries n / p.
        return RING_STEPS[request.op](size) * (a_in + n / size / b_in)
    if name == "ring":  # inside one host (across hosts: `PhaseLoad` of its chains' step)
        chunk = pipeline_chunk(request.chunk_bytes, protocol, n / terms.channels)
        return chain_estimate(n, size, terms.channels, chunk, inner, None)
    if name == "nvls" and terms.nvls_domain:
        return nvls.LATENCY + nvls.link_bytes(request.op, n, size) / (terms.nvls_rate * b_in)
    if name == "collnet_direct":
        # The heads' scatter and broadcast on NVLink and n / g each way per NIC, pipelined.
        return collnet_direct_latency(g) + n * max(2 * (g - 1) / (g * b_in), 1 / (g * b_out))
    return nvls_sharp.LATENCY + n * max((g + 1) / (g * terms.nvls_rate * b_in), 1 / (g * b_out))


def chain_estimate(n: float, size: int, channels: int, chunk_bytes: float | None, inner: Hop,
                   outer: tuple[Hop, np.ndarray, float, float] | None) -> float:
    """The ring's broadcast or reduce as ring.py plans it: a pipelined chain per channel over the p ranks, L chunks
    of c = n / (ch L), so p - 1 + L - 1 steps. The p - 1 steps that open a hop pay a latency (inside one host
    the hop's; across hosts the slowest of the edges carrying a chunk then, `chain_fill_latency`); the L - 1
    that continue open streams pay instead the 8-slot window's stall (`Hop.stall`), which is zero unless a chunk
    takes under a third of a hop's latency. A step lasts as long as c takes over NVLink, or across hosts as long
    as the most loaded link of the chains' routes takes for every channel's chunk. ``outer`` (None inside one
    host): the slowest hop between hosts, the latencies of the chains' edges under the protocol, the step's
    seconds per byte of the collective, and the p - 1 steps' seconds per byte where each carries its own edges
    only, from `ring.chain_step`'s `PhaseLoad`: with chunking off (``chunk_bytes`` None) the buffer moves one edge
    at a time, each at its own link's speed (over NVLink between members of a host, a NIC's between hosts)."""
    chunks = chunk_count(n / channels, chunk_bytes)
    chunk = n / (channels * chunks)
    inside = chunk / inner.bandwidth
    if outer is None:
        return (size - 1) * (inner.latency + inside) + (chunks - 1) * (inside + inner.stall(chunk))
    slowest, latencies, seconds_per_byte, unchunked_seconds_per_byte = outer
    if chunk_bytes is None:
        return chain_fill_latency(latencies.reshape(channels, size - 1), 1) + n * unchunked_seconds_per_byte
    across = chunk * channels * seconds_per_byte
    streamed = max(inside + inner.stall(chunk), across + slowest.stall(chunk))
    return (chain_fill_latency(latencies.reshape(channels, size - 1), chunks) + (size - 1) * max(inside, across)
            + (chunks - 1) * streamed)


def chain_fill_latency(latencies: np.ndarray, chunks: int) -> float:
    """The latency the p - 1 steps that open a chain's edges pay, ``latencies`` by channel (rows) and edge in the
    order they open (columns): the step opening edge k waits for the slowest of the edges carrying a chunk then,
    k - L + 1 to k on any channel (tree.py `pipelined_phases`)."""
    slowest = latencies.max(axis=0)
    if chunks >= slowest.size:  # the window's result without its large view: every window starts at edge 0
        return float(np.maximum.accumulate(slowest).sum())
    padded = np.concatenate((np.zeros(chunks - 1), slowest))
    return float(np.lib.stride_tricks.sliding_window_view(padded, chunks).max(axis=1).sum())


class TreeTerms(NamedTuple):
    """What the tree estimate reads of a group (`tree_terms`): its `group_shape` by NVLink domain (its "hosts", as
    tree.py plans them: a GB200 rack is one) and ``channels``, the hop between the first members of its first two
    domains (``outer``, one rail: the kind and line rate of the edges across domains), the passes of its plan
    (`tree_passes`) and, per pass, the links its edges across hosts cross (`AcrossLinks`, numbered in order of
    first use), and where hosts share an NVLink domain or links down reroute some edge inside a host off NVLink,
    the links every edge of each pass crosses (``rerouted``; None otherwise)."""

    shape: tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]
    channels: int
    outer: Hop
    passes: tuple[TreePass, ...]
    links: tuple[AcrossLinks, ...]
    rerouted: tuple[AcrossLinks, ...] | None = None

    def key(self) -> tuple:
        """The terms as a hashable value: the passes follow from the shape and channels, the links by contents."""
        return (self.shape, self.channels, self.outer, *(None if found is None else tuple(
            (links.routes.tobytes(), links.routes.shape, links.capacity.tobytes(), links.latency.tobytes())
            for links in found) for found in (self.links, self.rerouted)))


def tree_terms(request: CollectiveRequest, topology: Topology, domains: list[list[int]], channels: int,
               efficiency: Mapping[str, float] | None) -> TreeTerms:
    """The `TreeTerms` of ``request``'s group (``domains``: its members per NVLink domain, `ring.group_by_domain`)
    on ``channels``, on links that reach ``efficiency`` (`kept` per group and efficiency)."""
    shape = group_shape(request.ranks, domains, topology)
    passes = tree_passes(*shape, channels)
    ranks = np.array(request.ranks, dtype=np.int64)
    capacity = effective_capacity(topology, efficiency or {})

    def crossed(ends: np.ndarray) -> AcrossLinks:
        """The links the edges of ``ends`` (sender, receiver, channel rows) cross, numbered in order of first use."""
        src, dst, channel = ends.T
        routes, latency = topology.routes(ranks[src], ranks[dst], channel)
        on_route = routes >= 0
        used, numbered = first_use(routes[on_route])
        links = np.full(routes.shape, -1, dtype=np.int64)
        links[on_route] = numbered
        return AcrossLinks(links, capacity[used], latency)

    def rerouted() -> tuple[AcrossLinks, ...] | None:
        """Every edge's links, where hosts share an NVLink domain (GB200 trays of a rack planned by tray, its
        NVSwitches down: `ring.group_by_domain`) or links down move some edge inside a host off NVLink (its bytes
        then share the NICs and switches with the edges across hosts)."""
        if nccl_nodes(topology, request.ranks) < len(domains):
            return tuple(crossed(tree_pass.every_ends) for tree_pass in passes)
        if not topology.routes_version:
            return None
        inside = [topology.routes(ranks[src], ranks[dst], channel)[0]
                  for src, dst, channel in (tree_pass.inside_ends.T for tree_pass in passes)]
        classes = topology.link_class
        if not any(classes[link] != "nvlink" for routes in inside for link in routes[routes >= 0].tolist()):
            return None
        return tuple(crossed(tree_pass.every_ends) for tree_pass in passes)

    key = ("tree", request.ranks, channels, profile_of(efficiency))
    firsts = [request.ranks[members[0]] for members in shape[0][:2]]
    outer = hop(topology, capacity, *firsts) if len(firsts) > 1 else NO_HOP
    return TreeTerms(shape, channels, outer, passes,
                     kept(topology, key, lambda: tuple(crossed(tree_pass.across_ends) for tree_pass in passes)),
                     kept(topology, (*key, "rerouted"), rerouted))


def tree_estimate(request: CollectiveRequest, terms: TreeTerms, inner: Hop, protocol: Protocol,
                  tree_nodes: tuple[int, float]) -> float:
    """NCCL's tree all-reduce under ``protocol`` as tree.py plans it, step by step over the plan's own edges
    (`all_reduce_edges`): every channel's two trees carry n / (2 ch) each, up then down, each pass a pipeline of L
    chunks of c bytes (`pipeline_chunk`; ``tree_nodes``, the group's NCCL nodes and members per node, size NCCL's LL128
    chunk) in which an edge carries chunk j at its first step plus j. Over each stretch of steps with the same active
    edges (`pipeline_stretches`, as the plan's phases), a step lasts as long as its busiest port: c times the most
    active edges a GPU sends or receives on inside its host (an NVLink domain, `TreeTerms`) over the NVLink bandwidth
    (``inner``, under Simple as `TreeTerms.outer`), and c times the most active edges across hosts any link of their
    routes carries over the share of its capacity that carries payload (`AcrossLinks`: a NIC, or on an oversubscribed
    fabric the leaf uplink the channels' routes hash onto); the edges across hosts take the latency of the slowest route
    among them (`AcrossLinks.slowest`: hosts under one leaf or across the spines), `TreeTerms.outer`'s otherwise. A step
    that opens an edge pays its hop's latency; the later steps continue open streams and pay instead the 8-slot window's
    stall (`Hop.stall`, zero unless a chunk takes under a third of a hop's latency). Counting the active edges, not
    spreading a host's NVLink bytes evenly over the steps, sees the chain steps that hide behind a step across hosts:
    when L equals the members per host, 2 DGX A100 hosts, 512 MiB, the even spread took the tree 10% over its simulated
    time and the ring (6% slower) was picked. Where hosts share an NVLink domain or links down reroute edges inside
    hosts off NVLink (`TreeTerms.rerouted`), every active edge, inside a host or across, is counted on the links its
    route crosses: counted apart, a rack's 16 GPUs with all 9 NVSwitch trays down estimated the tree at 3.00 ms against
    4.52 ms simulated, below the ring's 3.25 (3.43 simulated), and `auto` picked the slower tree; the 72 GPUs of a rack
    with NVLS off at 0.67-0.85 of the simulated time (1 GiB under LL128: 3.35 against 5.00 ms)."""
    fraction = protocols.PAYLOAD_FRACTION[protocol]
    inner = inner.under("tree", protocol)
    share = request.nbytes / (2 * terms.channels)
    chunks = chunk_count(share, pipeline_chunk(request.chunk_bytes, protocol, share, tree_nodes))
    chunk = share / chunks
    total = 0.0
    rerouted = terms.rerouted or (None,) * len(terms.passes)
    for tree_pass, links, every in zip(terms.passes, terms.links, rerouted):
        # where links down reroute edges inside hosts, every edge is counted on the links its route crosses
        edges, crossed = (tree_pass.across, links) if every is None else (tree_pass.every, every)
        for start, stop, opens in pipeline_stretches(list(tree_pass.steps), chunks):
            # the active edges, first step in (start - chunks, start]
            count = tree_pass.inside.busiest(start - chunks, start) if every is None else 0
            ports = [(inner, count * chunk / inner.bandwidth)] if count else []
            across = crossed.seconds_per_byte(edges, start - chunks, start) / fraction
            if across:
                slowest = terms.outer._replace(latency=crossed.slowest(edges, start - chunks, start))
                ports.append((slowest.under("tree", protocol), across * chunk))
            if not ports:
                continue
            streamed = max(seconds + hop.stall(chunk) for hop, seconds in ports)
            opening = max(hop.latency + seconds for hop, seconds in ports) if opens else streamed
            total += opening + (stop - start - 1) * streamed
    return total


def group_shape(ranks: tuple[int, ...], hosts: list[list[int]], topology: Topology
                ) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """The group as the tree estimate sees it, whichever GPUs it holds: its members per host (``hosts``) as
    positions in ``ranks``, and the NIC of each position, numbered in order of first use. The data-parallel
    groups of a layout are translates of one another, so they share one shape (and one `tree_passes`)."""
    position = dict(zip(ranks, range(len(ranks))))
    names = list(map(topology.gpu_nic.__getitem__, ranks))
    number = dict(zip(dict.fromkeys(names), range(len(names))))
    return (tuple(tuple(map(position.__getitem__, members)) for members in hosts),
            tuple(map(number.__getitem__, names)))


class EdgePorts(NamedTuple):
    """Edges of one side of a tree pass (inside hosts or across them), sorted by ``first`` step, with the port
    each sends on (``out``) and receives on (``into``): the member's position inside a host, its NIC across."""

    first: np.ndarray
    out: np.ndarray
    into: np.ndarray

    def busiest(self, after: int, until: int) -> int:
        """The most edges one port sends or receives on among those whose first step lies in (after, until]
        (one slice, the edges being sorted by first step); 0 when there is none."""
        low, high = np.searchsorted(self.first, (after, until), side="right").tolist()
        if low == high:
            return 0
        return int(max(np.bincount(self.out[low:high]).max(), np.bincount(self.into[low:high]).max()))


class TreePass(NamedTuple):
    """The up or the down pass of the tree all-reduce: the distinct first ``steps`` of its edges, its edges
    ``inside`` hosts and ``across`` them, and the across edges' (sender, receiver, channel) as positions in the
    group (``across_ends``, one row per edge in ``across``'s order), which their routes are found from; the
    same of the inside edges (``inside_ends``) and of ``every`` edge (``every_ends``), read where links down
    reroute edges inside hosts (`TreeTerms.rerouted`)."""

    steps: tuple[int, ...]
    inside: EdgePorts
    across: EdgePorts
    across_ends: np.ndarray
    inside_ends: np.ndarray
    every: EdgePorts
    every_ends: np.ndarray


class AcrossLinks(NamedTuple):
    """The links a tree pass's edges across hosts cross (``routes``: one row per edge in `EdgePorts` order, each
    link as its position in ``capacity``, -1 past a route's end), their usable ``capacity`` (bytes/s at the
    run's efficiencies) and each route's path ``latency`` (s)."""

    routes: np.ndarray
    capacity: np.ndarray
    latency: np.ndarray

    def seconds_per_byte(self, edges: EdgePorts, after: int, until: int) -> float:
        """Among the edges whose first step lies in (after, until], the most any link carries over its capacity:
        seconds per byte of a chunk, each edge carrying one (0 when no edge is active)."""
        low, high = np.searchsorted(edges.first, (after, until), side="right").tolist()
        links = self.routes[low:high]
        links = links[links >= 0]
        if not links.size:
            return 0.0
        used, counts = np.unique(links, return_counts=True)
        return float((counts / self.capacity[used]).max())

    def slowest(self, edges: EdgePorts, after: int, until: int) -> float:
        """The longest path latency among the edges whose first step lies in (after, until] (one at least)."""
        low, high = np.searchsorted(edges.first, (after, until), side="right").tolist()
        return float(self.latency[low:high].max())


@lru_cache(maxsize=64)
def tree_passes(hosts: tuple[tuple[int, ...], ...], nics: tuple[int, ...], channels: int
                ) -> tuple[TreePass, ...]:
    """The up and down passes of the tree all-reduce (`all_reduce_edges`) over a group of `group_shape`
    (``hosts``, ``nics``: positions per host, NIC per position) on ``channels``, built once per shape: a
    run's translated groups, and every size `auto` weighs for one, share them."""
    host_of = np.empty(len(nics), dtype=np.int64)
    for index, members in enumerate(hosts):
        host_of[list(members)] = index
    nic = np.array(nics, dtype=np.int64)
    found = []
    for edges in all_reduce_edges(tuple(range(len(nics))), [list(members) for members in hosts], channels, nics):
        src, dst, channel, first = np.array(edges, dtype=np.int64).reshape(-1, 4).T
        order = np.argsort(first, kind="stable")
        src, dst, channel, first = src[order], dst[order], channel[order], first[order]
        crossing = host_of[src] != host_of[dst]
        inside, across = ~crossing, crossing
        ends = np.stack((src, dst, channel), axis=1)
        found.append(TreePass(tuple(np.unique(first).tolist()),
                              EdgePorts(first[inside], src[inside], dst[inside]),
                              EdgePorts(first[across], nic[src[across]], nic[dst[across]]),
                              ends[across], ends[inside], EdgePorts(first, src, dst), ends))
    return tuple(found)


TIE_MARGIN = 1e-9
"""How far above the lowest estimate, as a share of it, an estimate ties with it: equal closed forms computed in a
different order differ in the last bits (the ring's and the tree's over two ranks on two hosts are both 2 a + n / b)."""
TIE = 1 + TIE_MARGIN
"""Estimates within this factor of the lowest tie with it (`TIE_MARGIN`)."""


class Choice(NamedTuple):
    """The algorithm and the protocol that run a collective."""

    algorithm: AlgorithmName
    protocol: Protocol


def choose(request: CollectiveRequest, topology: Topology, efficiency: Mapping[str, float] | None = None,
           algorithm: AlgorithmChoice = "auto", protocol: ProtocolChoice = "auto") -> Choice:
    """What runs ``request`` where ``algorithm`` or ``protocol`` is `auto`: `direct` under Simple for send_recv and
    an all_to_all left to `auto` (point to point, as NCCL runs them); otherwise, of the `candidates` (or the
    algorithm asked for) under each protocol they run with (`protocols.available`, or the one asked for), the pair
    with the lowest estimate on links that reach ``efficiency``, ties (`TIE`) going to the first listed:
    algorithms in `candidates` order, each under Simple, LL128, LL in turn (`weighing`). Nothing is weighed where
    nothing is `auto`, nor for an algorithm asked for that runs under Simple alone."""
    fixed = unweighed(request, topology, algorithm, protocol)
    return fixed if fixed is not None else weighed(request, topology, efficiency, algorithm, protocol).choice


def unweighed(request: CollectiveRequest, topology: Topology, algorithm: AlgorithmChoice,
              protocol: ProtocolChoice) -> Choice | None:
    """What runs ``request`` without weighing anything (`choose`), None where `auto` weighs its candidates."""
    if request.op == "send_recv" or (request.op == "all_to_all" and algorithm == "auto"):
        return Choice("direct", "simple")
    if algorithm != "auto":
        able = protocols.available(algorithm, request.op, request.ranks, topology)
        if protocol != "auto" or len(able) == 1:
            return Choice(algorithm, able[0] if protocol == "auto" else protocol)
    return None


AUTO_RULE = ("the lowest estimate (latency + size / bandwidth of its plan on these links) wins, ties within "
             f"a relative {TIE_MARGIN:.0e} of the lowest to the first listed")
"""`weighing`'s rule in words, as `trainsim collective --explain` and summary.json's `auto_choices` state it."""


class Weighing(NamedTuple):
    """What `auto` weighed for one collective: each candidate algorithm and protocol with its estimate (seconds),
    in tie-breaking order, and the pair picked, the first within `TIE` of the lowest."""

    estimates: tuple[tuple[Choice, float], ...]
    choice: Choice

    def report(self) -> dict:
        """The weighing as plain data: the rule, each candidate's algorithm, protocol and estimate (seconds) in
        tie-breaking order, and the algorithm and protocol picked."""
        return {"rule": AUTO_RULE,
                "candidates": [{"algorithm": pair.algorithm, "protocol": pair.protocol, "estimate_s": seconds}
                               for pair, seconds in self.estimates],
                "algorithm": self.choice.algorithm, "protocol": self.choice.protocol}


def weighed(request: CollectiveRequest, topology: Topology, efficiency: Mapping[str, float] | None,
            algorithm: AlgorithmChoice, protocol: ProtocolChoice) -> Weighing:
    """The `weighing` of ``request`` where something is `auto`, found once per `choice_key` (`CHOICES`)."""
    wanted: tuple[Protocol, ...] = PROTOCOLS if protocol == "auto" else (protocol,)
    terms, group_key = weighed_group(request, topology, efficiency, algorithm)
    key = choice_key(request, group_key, wanted)
    found = CHOICES.get(key)
    if found is None:
        if len(CHOICES) >= CHOICES_KEPT:
            CHOICES.clear()
        found = CHOICES[key] = weighing(request, topology, terms, wanted)
    return found


def weighing(request: CollectiveRequest, topology: Topology, terms: GroupTerms, wanted: tuple[Protocol, ...]
             ) -> Weighing:
    """The estimates of ``terms``' algorithms under the protocols ``wanted`` (`terms_estimates`) and the pick: the
    first pair within `TIE` of the lowest, algorithms in their order, each under the protocols in ``wanted``'s."""
    names = terms.names
    by_protocol = terms_estimates(request, terms, wanted)
    costs = {Choice(name, each): by_protocol[each][name] for name in names for each in wanted
             if name in by_protocol[each]}
    if not costs:
        protocols.check(names[0], request.op, wanted[0], request.ranks, topology)
    lowest = min(costs.values())
    return Weighing(tuple(costs.items()), next(pair for pair, cost in costs.items() if cost <= lowest * TIE))


class WeighedGroup(NamedTuple):
    """What `choose` weighs of one group: its `GroupTerms` and their `GroupTerms.key`."""

    terms: GroupTerms
    key: tuple


def weighed_group(request: CollectiveRequest, topology: Topology, efficiency: Mapping[str, float] | None,
                  algorithm: AlgorithmChoice) -> WeighedGroup:
    """The `GroupTerms` of ``request``'s group weighing the algorithm asked for (`auto`: its `candidates`) and
    their key, found once per op, channels, efficiency and group up to whole periods of the fabric
    (`first_period_translate`; `kept`): the 16k-GPU job asks `choose` 5,289 times, for 4,366 groups and ops,
    and weighs 12 keys; building every group's terms and their key (the arrays' bytes) before the lookup cost
    more than the weighing."""
    ranks = first_period_translate(topology, request.ranks)

    def build() -> WeighedGroup:
        translate = replace(request, ranks=ranks)
        hosts = group_by_host(ranks, topology)
        names = (algorithm,) if algorithm != "auto" else tuple(candidates(translate, topology, hosts))
        terms = group_terms(translate, topology, efficiency, names, hosts)
        return WeighedGroup(terms, terms.key())

    return kept(topology, ("weighed", request.op, ranks, request.channels, profile_of(efficiency), algorithm), build)


def first_period_translate(topology: Topology, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """``ranks`` moved by whole periods of the fabric's spine hash (topology/periods.py) so that the lowest lies in
    the first period, where every link maps onto a link alike (`Periods.exact`) and no fault has moved a route:
    a group and its translates then cross links alike, transfer for transfer, and have equal terms. Elsewhere
    ``ranks`` as given. `Periods.exact` checks that links map forward onto links alike; unlike the plan cache,
    which runs one moved copy of each class to check it, this trusts it (every bundled fabric is periodic)."""
    periods = kept(topology, ("periods",), lambda: (Periods.of(topology),))[0]
    if periods is None or not periods.exact or topology.routes_version:
        return ranks
    shift = min(ranks) // periods.period * periods.period
    return tuple(rank - shift for rank in ranks) if shift else ranks


def choice_key(request: CollectiveRequest, group_key: tuple, wanted: tuple[Protocol, ...]) -> tuple:
    """What `choose`'s pick for ``request`` depends on: all that `terms_estimates` reads (the request's op,
    size and chunk, the key of the group's terms, ``group_key``) and the protocols ``wanted``."""
    return request.op, request.nbytes, request.chunk_bytes, wanted, group_key


CHOICES: dict[tuple, Weighing] = {}
"""`weighed`'s weighings, and so `choose`'s picks, by `choice_key`: a run asks for thousands of groups placed alike
(the 16k-GPU job: 4,872 group and size pairs, 12 keys), whichever topology they lie on."""
CHOICES_KEPT = 4096
"""Weighings kept before they are dropped."""
