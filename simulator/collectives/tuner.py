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
estimate stays close to the simulated time (tests/test_auto.py bounds both). docs/collectives.md, "The `auto`
rule", says it in prose.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from simulator.catalog.sharp import collnet_direct_latency
from simulator.collectives import collnet_direct, nvls, nvls_sharp, protocols
from simulator.collectives.names import PROTOCOLS, AlgorithmChoice, AlgorithmName, Protocol, ProtocolChoice
from simulator.collectives.phases import NET, NVLINK, PCI, CollectiveRequest, HopKind, window_stall
from simulator.collectives.ring import RING_STEPS, channel_count, group_by_host, nics_used
from simulator.collectives.tree import NCCL_STEPS, all_reduce_edges, chunk_count, pipeline_stretches
from simulator.network.model import effective_capacity
from simulator.topology.graph import Topology


def candidates(request: CollectiveRequest, topology: Topology, hosts: list[list[int]]) -> list[AlgorithmName]:
    """The modelled algorithms NCCL's tuner weighs for ``request`` (``hosts``: its members per host), in
    tie-breaking order. Broadcast and reduce: the ring only (NCCL costs no other algorithm for them).
    Reduce-scatter and all-gather: the ring, and NVLS inside one NVLink-SHARP domain (NCCL >= 2.19; across hosts
    NCCL runs them through CollNet only, not modelled; PAT, for one GPU per host, is not modelled). All-reduce:
    the ring; the tree across hosts (inside one host NCCL's tree is a chain of the GPUs, which the `tree` here,
    a double binary tree over the ranks, is not); NVLS inside one domain and, with as many members on every host
    and at least `nvls.MIN_HEADS` heads on each (members on distinct NICs), NCCL's NVLS tree across hosts
    (`nvls`), on GPUs that drive NVLink SHARP; CollNetDirect and multi-node
    NVLS (`nvls_sharp`) where the switches reduce (NCCL enables both only with CollNet). `hierarchical` is not an
    NCCL algorithm and is never a candidate."""
    op = request.op
    inside = len(hosts) == 1
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
    even = len({len(members) for members in hosts}) == 1
    if nvls.available(topology) and even and nics_used(topology, hosts) >= nvls.MIN_HEADS:
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


def hop(topology: Topology, capacity: np.ndarray, src: int, dst: int) -> Hop:
    """The `Hop` from ``src`` to ``dst`` on links of usable ``capacity`` (bytes/s, by link)."""
    path = list(topology.path(src, dst))
    nvlink = topology.gpu_nvlink
    kind = (NET if topology.gpu_domain[src] != topology.gpu_domain[dst]
            else NVLINK if nvlink[src] and nvlink[dst] else PCI)
    return Hop(topology.path_latency(src, dst), float(capacity[path].min()),
               float(topology.link_bandwidth[path].min()), kind)


def estimates(request: CollectiveRequest, topology: Topology, efficiency: Mapping[str, float] | None = None,
              protocol: Protocol = "simple", algorithms: tuple[AlgorithmName, ...] | None = None
              ) -> dict[AlgorithmName, float]:
    """Latency + size / bandwidth estimates (seconds) under ``protocol`` of the `candidates` for ``request``
    (or of ``algorithms``) that run under it: `estimates_by_protocol` for one protocol."""
    return estimates_by_protocol(request, topology, efficiency, (protocol,), algorithms)[protocol]


def estimates_by_protocol(request: CollectiveRequest, topology: Topology, efficiency: Mapping[str, float] | None,
                          wanted: tuple[Protocol, ...], algorithms: tuple[AlgorithmName, ...] | None = None,
                          hosts: list[list[int]] | None = None) -> dict[Protocol, dict[AlgorithmName, float]]:
    """Per protocol in ``wanted``, latency + size / bandwidth estimates (seconds) of the `candidates` for
    ``request`` (or of ``algorithms``) that run under it (`protocols.available`), on links that reach
    ``efficiency`` (link class -> fraction of line rate, as the network model takes it; None: line rate), each
    with NCCL's base latency of the algorithm under the protocol (`protocols.base_latency`), which its plan
    charges once. The group's hosts (``hosts`` when the caller has them), hops and channels are read once for
    every protocol: only the hops' latency and payload share depend on it."""
    hosts = hosts or group_by_host(request.ranks, topology)
    count, g = len(hosts), max(len(members) for members in hosts)
    widest = max(hosts, key=len)
    capacity = effective_capacity(topology, efficiency or {})
    simple_inner = hop(topology, capacity, widest[0], widest[1]) if g > 1 else NO_HOP
    simple_outer = hop(topology, capacity, hosts[0][0], hosts[1][0]) if count > 1 else simple_inner
    simple_across = hop(topology, capacity, hosts[0][-1], hosts[1][0]) if count > 1 else simple_inner
    channels = channel_count(request, topology, hosts)
    rails = min(channels, nics_used(topology, hosts)) if count > 1 else 1
    listed = algorithms or tuple(candidates(request, topology, hosts))
    able = {name: protocols.available(name, request.op, request.ranks, topology) for name in listed}
    nvls_rate = nvls.in_switch_efficiency(topology) if {"nvls", "nvls_sharp"} & set(listed) else 1.0
    return {protocol: {name: _estimate(request, topology, hosts, name, protocol, simple_inner, simple_outer,
                                       simple_across, channels, rails, nvls_rate)
                       for name in listed if protocol in able[name]} for protocol in wanted}


def _estimate(request: CollectiveRequest, topology: Topology, hosts: list[list[int]], name: AlgorithmName,
              protocol: Protocol, simple_inner: Hop, simple_outer: Hop, simple_across: Hop, channels: int,
              rails: int, nvls_rate: float) -> float:
    """One algorithm's estimate under one protocol (`estimates_by_protocol`), from the group's hops under
    Simple (latency a, bottleneck bandwidth b): a_in, b_in between two members of the fullest host, a_out,
    b_out between the first members of the first two hosts, across from the first host's last member to the
    second's first."""
    inner, outer = simple_inner.under(name, protocol), simple_outer.under(name, protocol)
    return _transfer_estimate(request, topology, hosts, name, inner, outer, simple_across.under(name, protocol),
                              channels, rails, nvls_rate) + protocols.base_latency(name, protocol)


def _transfer_estimate(request: CollectiveRequest, topology: Topology, hosts: list[list[int]], name: AlgorithmName,
                       inner: Hop, outer: Hop, across: Hop, channels: int, rails: int, nvls_rate: float) -> float:
    """``name``'s latency + size / bandwidth on hops already under its protocol (`_estimate`): p ranks on N
    hosts, g members on the fullest, n bytes, r the rails the group leaves each host on (distinct NICs, at most
    one per channel), ch the channels
    (ring.channel_count), L the pipeline chunks of a tree or chain. NVLS loads its switch links at its
    in-switch efficiency (nvls.in_switch_efficiency), as its plan does."""
    n, size = request.nbytes, len(request.ranks)
    count, g = len(hosts), max(len(members) for members in hosts)
    (a_in, b_in, *_), (a_out, b_out, *_) = inner, outer
    mean_latency = ((size - count) * a_in + count * a_out) / size if count > 1 else a_in
    per_byte = max(1 / b_in, 1 / (rails * b_out)) if count > 1 else 1 / b_in
    if name == "ring" and request.op in RING_STEPS:
        # One ring per channel; per step every link carries n / p in all (the NICs n / (p r)).
        return RING_STEPS[request.op](size) * (mean_latency + n / size * per_byte)
    if name == "ring":
        return chain_estimate(n, size, channels, rails, request.chunk_bytes, inner, outer if count > 1 else None)
    if name == "tree":
        # the tree's edges across hosts join a chain's end to the next host's chain start: across rails
        return tree_estimate(topology, request, hosts, channels, inner, across)
    if name == "nvls" and nvls.supports(request.ranks, topology):
        return nvls.LATENCY + nvls.link_bytes(request.op, n, size) / (nvls_rate * b_in)
    if name == "nvls":
        # g rail rings of n / g each, over the NICs the members drive (members may share one)
        return (nvls.LATENCY + 2 * math.ceil(math.log2(count)) * nvls.TREE_NET_LATENCY
                + max(nvls.link_bytes("all_reduce", n, g) / (nvls_rate * b_in),
                      2 * (count - 1) / count * n / nics_used(topology, hosts) / b_out))
    if name == "collnet_direct":
        # The heads' scatter and broadcast on NVLink and n / g each way per NIC, pipelined.
        return collnet_direct_latency(g) + n * max(2 * (g - 1) / (g * b_in), 1 / (g * b_out))
    return nvls_sharp.LATENCY + n * max((g + 1) / (g * nvls_rate * b_in), 1 / (g * b_out))


def chain_estimate(n: float, size: int, channels: int, rails: int, chunk_bytes: float | None, inner: Hop,
                   outer: Hop | None) -> float:
    """The ring's broadcast or reduce as ring.py plans it: a pipelined chain per channel over the p ranks, L chunks
    of c = n / (ch L), so p - 1 + L - 1 steps. The p - 1 steps that open a hop pay the slower hop's latency; the
    L - 1 that continue open streams pay instead the 8-slot window's stall (`Hop.stall`), which is zero unless a
    chunk takes under a third of a hop's latency. A step lasts as long as its slower hop: c over NVLink, or ch / r
    chunks over a rail (``outer``, None inside one host)."""
    chunks = chunk_count(n / channels, chunk_bytes)
    chunk = n / (channels * chunks)
    inside = chunk / inner.bandwidth
    if outer is None:
        latency, step, streamed = inner.latency, inside, inside + inner.stall(chunk)
    else:
        across = chunk * channels / (rails * outer.bandwidth)
        latency, step = max(inner.latency, outer.latency), max(inside, across)
        streamed = max(inside + inner.stall(chunk), across + outer.stall(chunk))
    return (size - 1) * (latency + step) + (chunks - 1) * streamed


def tree_estimate(topology: Topology, request: CollectiveRequest, hosts: list[list[int]], channels: int, inner: Hop,
                  outer: Hop) -> float:
    """NCCL's tree all-reduce as tree.py plans it, step by step over the plan's own edges (`all_reduce_edges`):
    every channel's two trees carry n / (2 ch) each, up then down, each pass a pipeline of L chunks of c bytes
    in which an edge carries chunk j at its first step plus j. Over each stretch of steps with the same active
    edges (`pipeline_stretches`, as the plan's phases), a step lasts as long as its busiest port: c times the
    most active edges a GPU sends or receives on inside its host over the NVLink bandwidth (``inner``), and c
    times the most active edges a NIC sends or receives on across hosts over the network's (``outer``). A step
    that opens an edge pays its hop's latency; the later steps continue open streams and pay instead the 8-slot
    window's stall (`Hop.stall`, zero unless a chunk takes under a third of a hop's latency). Counting the
    active edges, not spreading a host's NVLink bytes evenly over the steps, sees the chain steps that hide
    behind a step across hosts: when L equals the members per host, 2 DGX A100 hosts, 512 MiB, the even spread
    took the tree 10% over its simulated time and the ring (6% slower) was picked."""
    share = request.nbytes / (2 * channels)
    chunks = chunk_count(share, request.chunk_bytes)
    chunk = share / chunks
    total = 0.0
    for tree_pass in tree_passes(*group_shape(request.ranks, hosts, topology), channels):
        sides = ((inner, tree_pass.inside), (outer, tree_pass.across))
        for start, stop, opens in pipeline_stretches(list(tree_pass.steps), chunks):
            # the active edges, first step in (start - chunks, start]
            active = ((hop, edges.busiest(start - chunks, start)) for hop, edges in sides)
            ports = [(hop, count * chunk / hop.bandwidth) for hop, count in active if count]
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
    """The up or the down pass of the tree all-reduce: the distinct first ``steps`` of its edges and its edges
    ``inside`` hosts and ``across`` them."""

    steps: tuple[int, ...]
    inside: EdgePorts
    across: EdgePorts


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
    for edges in all_reduce_edges(tuple(range(len(nics))), [list(members) for members in hosts], channels):
        src, dst, _, first = np.array(edges, dtype=np.int64).reshape(-1, 4).T
        order = np.argsort(first, kind="stable")
        src, dst, first = src[order], dst[order], first[order]
        crossing = host_of[src] != host_of[dst]
        inside, across = ~crossing, crossing
        found.append(TreePass(tuple(np.unique(first).tolist()),
                              EdgePorts(first[inside], src[inside], dst[inside]),
                              EdgePorts(first[across], nic[src[across]], nic[dst[across]])))
    return tuple(found)


TIE = 1 + 1e-9
"""Estimates within this factor of the lowest tie with it: equal closed forms computed in a different order differ
in the last bits (the ring's and the tree's over two ranks on two hosts are both 2 a + n / b)."""


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
    algorithms in `candidates` order, each under Simple, LL128, LL in turn. Nothing is weighed where nothing is
    `auto`, nor for an algorithm asked for that runs under Simple alone."""
    if request.op == "send_recv" or (request.op == "all_to_all" and algorithm == "auto"):
        return Choice("direct", "simple")
    if algorithm != "auto":
        able = protocols.available(algorithm, request.op, request.ranks, topology)
        if protocol != "auto" or len(able) == 1:
            return Choice(algorithm, able[0] if protocol == "auto" else protocol)
    hosts = group_by_host(request.ranks, topology)
    names = (algorithm,) if algorithm != "auto" else tuple(candidates(request, topology, hosts))
    wanted: tuple[Protocol, ...] = PROTOCOLS if protocol == "auto" else (protocol,)
    by_protocol = estimates_by_protocol(request, topology, efficiency, wanted, names, hosts)
    costs = {(name, each): by_protocol[each][name] for name in names for each in wanted if name in by_protocol[each]}
    if not costs:
        protocols.check(names[0], request.op, wanted[0], request.ranks, topology)
    lowest = min(costs.values())
    return Choice(*next(pair for pair, cost in costs.items() if cost <= lowest * TIE))
