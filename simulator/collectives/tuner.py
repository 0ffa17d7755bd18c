"""The `auto` rule: pick, per collective, the algorithm NCCL's tuner would run, by the cost of what this simulator
runs for it.

NCCL (src/graph/tuning.cc `ncclTopoTuneModel` and src/enqueue.cc `topoGetAlgoInfo`, NCCL 2.30.7) gives every
algorithm it may run for a collective a latency and a bandwidth, and takes the one whose latency + size /
bandwidth is lowest. `candidates` is its list of algorithms, as far as they are modelled here; `estimates` costs
each of them as latency + size / bandwidth too, but from the shape of this simulator's own plan of that algorithm
on the topology's links at the bandwidths the network model gives them (the run's per-class efficiencies), with
the stall of NCCL's window of chunk steps in flight that the plans charge, so the pick is the candidate the
simulation ranks fastest and its estimate stays close to the simulated time (tests/test_auto.py bounds both).
Only NCCL's Simple protocol is modelled: its LL and LL128 protocols, which would take the smallest messages, are
not. docs/collectives.md, "The `auto` rule", says it in prose.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import NamedTuple

import numpy as np

from simulator.catalog.sharp import collnet_direct_latency
from simulator.collectives import collnet_direct, nvls, nvls_sharp
from simulator.collectives.names import AlgorithmName
from simulator.collectives.phases import CollectiveRequest, window_stall
from simulator.collectives.ring import RING_STEPS, channel_count, group_by_host, rails_used
from simulator.collectives.tree import NCCL_STEPS, chunk_count, in_order_tree
from simulator.network.model import effective_capacity
from simulator.topology.graph import Topology


def candidates(request: CollectiveRequest, topology: Topology, hosts: list[list[int]]) -> list[AlgorithmName]:
    """The modelled algorithms NCCL's tuner weighs for ``request`` (``hosts``: its members per host), in
    tie-breaking order. Broadcast and reduce: the ring only (NCCL costs no other algorithm for them).
    Reduce-scatter and all-gather: the ring, and NVLS inside one NVLink-SHARP domain (NCCL >= 2.19; across hosts
    NCCL runs them through CollNet only, not modelled; PAT, for one GPU per host, is not modelled). All-reduce:
    the ring; the tree across hosts (inside one host NCCL's tree is a chain of the GPUs, which the `tree` here,
    a double binary tree over the ranks, is not); NVLS inside one domain and, with two or more members on every
    host, NCCL's NVLS tree across hosts (`nvls`), on GPUs that drive NVLink SHARP; CollNetDirect and multi-node
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
    if nvls.available(topology) and even and len(hosts[0]) > 1:
        found.append("nvls")
    if collnet_direct.supports(request.ranks, topology):
        found.append("collnet_direct")
        if nvls_sharp.fits(topology, hosts):
            found.append("nvls_sharp")
    return found


class Hop(NamedTuple):
    """The route between two members: one-way ``latency`` (s), bottleneck ``bandwidth`` (bytes/s) as the network
    model runs it (line rate times the link class's efficiency) and bottleneck ``line_rate`` (bytes/s), at which
    the plans read a chunk's time for the window's stall (execute.py `phase_items`)."""

    latency: float
    bandwidth: float
    line_rate: float

    def stall(self, chunk: float) -> float:
        """`window_stall` of a streamed step carrying ``chunk`` bytes over this hop."""
        return window_stall(self.latency, chunk / self.line_rate, NCCL_STEPS)


NO_HOP = Hop(0.0, math.inf, math.inf)
"""The intra-host hop of a group with one member per host: none, free."""


def hop(topology: Topology, capacity: np.ndarray, src: int, dst: int) -> Hop:
    """The `Hop` from ``src`` to ``dst`` on links of usable ``capacity`` (bytes/s, by link)."""
    path = list(topology.path(src, dst))
    return Hop(topology.path_latency(src, dst), float(capacity[path].min()),
               float(topology.link_bandwidth[path].min()))


@cache
def tree_depth(size: int) -> int:
    """Edges from the deepest position to the top of `in_order_tree` over ``size`` positions."""
    return max(in_order_tree(size)[2])


def estimates(request: CollectiveRequest, topology: Topology, efficiency: Mapping[str, float] | None = None
              ) -> dict[AlgorithmName, float]:
    """Latency + size / bandwidth estimates (seconds) of the `candidates` for ``request`` on links that reach
    ``efficiency`` (link class -> fraction of line rate, as the network model takes it; None: line rate).

    a_in, b_in: latency and bottleneck bandwidth between two members of the fullest host; a_out, b_out: between
    the first members of the first two hosts; p ranks on N hosts, g members on the fullest, n bytes, r the rails
    the group leaves each host on, ch the channels (ring.channel_count), L the pipeline chunks of a tree or chain.
    NVLS loads its switch links at its in-switch efficiency (nvls.in_switch_efficiency), as its plan does.
    """
    n, size = request.nbytes, len(request.ranks)
    hosts = group_by_host(request.ranks, topology)
    count, g = len(hosts), max(len(members) for members in hosts)
    widest = max(hosts, key=len)
    capacity = effective_capacity(topology, efficiency or {})
    inner = hop(topology, capacity, widest[0], widest[1]) if g > 1 else NO_HOP
    outer = hop(topology, capacity, hosts[0][0], hosts[1][0]) if count > 1 else inner
    (a_in, b_in, _), (a_out, b_out, _) = inner, outer
    channels = channel_count(request, topology, hosts)
    rails = min(channels, rails_used(topology, hosts)) if count > 1 else 1
    mean_latency = ((size - count) * a_in + count * a_out) / size if count > 1 else a_in
    per_byte = max(1 / b_in, 1 / (rails * b_out)) if count > 1 else 1 / b_in
    found: dict[AlgorithmName, float] = {}
    names = candidates(request, topology, hosts)
    nvls_rate = nvls.in_switch_efficiency(topology) if {"nvls", "nvls_sharp"} & set(names) else 1.0
    for name in names:
        if name == "ring" and request.op in RING_STEPS:
            # One ring per channel; per step every link carries n / p in all (the NICs n / (p r)).
            found[name] = RING_STEPS[request.op](size) * (mean_latency + n / size * per_byte)
        elif name == "ring":
            found[name] = chain_estimate(n, size, channels, rails, request.chunk_bytes, inner,
                                         outer if count > 1 else None)
        elif name == "tree":
            found[name] = tree_estimate(n, hosts, channels, rails, request.chunk_bytes, inner, outer)
        elif name == "nvls" and nvls.supports(request.ranks, topology):
            found[name] = nvls.LATENCY + nvls.link_bytes(request.op, n, size) / (nvls_rate * b_in)
        elif name == "nvls":
            found[name] = (nvls.LATENCY + 2 * math.ceil(math.log2(count)) * nvls.TREE_NET_LATENCY
                           + max(nvls.link_bytes("all_reduce", n, g) / (nvls_rate * b_in),
                                 2 * (count - 1) / count * n / g / b_out))
        elif name == "collnet_direct":
            # The heads' scatter and broadcast on NVLink and n / g each way per NIC, pipelined.
            found[name] = collnet_direct_latency(g) + n * max(2 * (g - 1) / (g * b_in), 1 / (g * b_out))
        else:
            found[name] = nvls_sharp.LATENCY + n * max((g + 1) / (g * nvls_rate * b_in), 1 / (g * b_out))
    return found


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


def tree_estimate(n: float, hosts: list[list[int]], channels: int, rails: int, chunk_bytes: float | None,
                  inner: Hop, outer: Hop) -> float:
    """NCCL's tree all-reduce across hosts as tree.py plans it: up, then down, each a pipeline of L chunks of c
    bytes over the tree's height H (edges from its deepest GPU to its root), so H + L - 1 steps, each as long as
    its slowest edge.

    With g members per host the trees are chains of g - 1 NVLink hops joined by a double binary tree of the N
    hosts, D host levels deep: H = g D + g - 1, and every channel's two trees carry n / (2 ch) each. A host's
    edges to its parent start at steps g - 1, 2g - 1, ..., Dg - 1 of the pipeline and stay busy for L steps, so
    X = min(steps, D L if L < g else (D - 1) g + L) steps cross hosts; in each a rail carries k = 2 chunks (a
    host takes its two children's at once; k = 1 between two hosts, where every host has one peer). Over the
    whole pipeline each GPU sends n (g - 1) / g over NVLink, spread over the steps. The H steps that open an edge
    pay its latency: the network's in those that cross hosts, NVLink's in the others. The L - 1 later steps
    continue open streams and pay instead the 8-slot window's stall (`Hop.stall`, zero unless a chunk takes under
    a third of a hop's latency), the network's in the crossing ones left after the openings, NVLink's in the
    rest. With one member per host it is the double binary tree over the ranks, each tree carrying n / 2, every
    step crossing hosts."""
    count, g = len(hosts), max(map(len, hosts))
    share = n / (2 * channels) if g > 1 else n / 2
    chunks = chunk_count(share, chunk_bytes)
    chunk = share / chunks
    depth = tree_depth(count if g > 1 else sum(map(len, hosts)))
    height = g * depth + g - 1
    steps = height + chunks - 1
    crossing = steps if g == 1 else min(steps, depth * chunks if chunks < g else (depth - 1) * g + chunks)
    rail_chunks = (1 if count == 2 else 2) * max(1, channels // rails if g > 1 else 1)
    nvlink_step = n * (g - 1) / g / (steps * inner.bandwidth) if g > 1 else 0.0
    rail_step = rail_chunks * chunk / outer.bandwidth
    cross_step = max(nvlink_step, rail_step)
    crossing_fill = min(crossing, height - g + 1)
    latency = crossing_fill * outer.latency + (height - crossing_fill) * inner.latency
    streamed_crossing = min(chunks - 1, crossing - crossing_fill)
    inner_stall, outer_stall = inner.stall(chunk), outer.stall(chunk)
    stalls = (streamed_crossing * (max(nvlink_step + inner_stall, rail_step + outer_stall) - cross_step)
              + (chunks - 1 - streamed_crossing) * inner_stall)
    return 2 * (latency + crossing * cross_step + (steps - crossing) * nvlink_step + stalls)


TIE = 1 + 1e-9
"""Estimates within this factor of the lowest tie with it: equal closed forms computed in a different order differ
in the last bits (the ring's and the tree's over two ranks on two hosts are both 2 a + n / b)."""


def choose_algorithm(request: CollectiveRequest, topology: Topology, efficiency: Mapping[str, float] | None = None
                     ) -> AlgorithmName:
    """`direct` for all_to_all and send_recv (point to point, as NCCL runs them); otherwise the candidate with
    the lowest estimate on links that reach ``efficiency``, ties (`TIE`) going to the first listed."""
    if request.op in ("all_to_all", "send_recv"):
        return "direct"
    costs = estimates(request, topology, efficiency)
    lowest = min(costs.values())
    return next(name for name, cost in costs.items() if cost <= lowest * TIE)
