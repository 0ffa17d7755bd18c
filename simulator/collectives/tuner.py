"""The `auto` rule: pick, per collective, the algorithm NCCL's tuner would run, by the cost of what this simulator
runs for it.

NCCL (src/graph/tuning.cc `ncclTopoTuneModel` and src/enqueue.cc `topoGetAlgoInfo`, NCCL 2.30.7) gives every
algorithm it may run for a collective a latency and a bandwidth, and takes the one whose latency + size /
bandwidth is lowest. `candidates` is its list of algorithms, as far as they are modelled here; `estimates` costs
each of them as latency + size / bandwidth too, but from the shape of this simulator's own plan of that algorithm
on the topology's links (nominal bandwidths), so the estimate of the pick stays close to what the simulation then
gives (tests/test_auto.py bounds both). Only NCCL's Simple protocol is modelled: its LL and LL128 protocols,
which would take the smallest messages, are not. docs/collectives.md, "The `auto` rule", says it in prose.
"""

from __future__ import annotations

import math
from functools import cache

from simulator.catalog.sharp import collnet_direct_latency
from simulator.collectives import collnet_direct, nvls, nvls_sharp
from simulator.collectives.names import AlgorithmName
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.ring import RING_STEPS, channel_count, group_by_host, rails_used
from simulator.collectives.tree import chunk_count, in_order_tree
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


def link_costs(topology: Topology, src: int, dst: int) -> tuple[float, float]:
    """(latency s, bottleneck bytes/s) of the route from ``src`` to ``dst`` at nominal link bandwidth."""
    path = topology.path(src, dst)
    return topology.path_latency(src, dst), float(min(topology.link_bandwidth[i] for i in path))


@cache
def tree_depth(size: int) -> int:
    """Edges from the deepest position to the top of `in_order_tree` over ``size`` positions."""
    return max(in_order_tree(size)[2])


def estimates(request: CollectiveRequest, topology: Topology) -> dict[AlgorithmName, float]:
    """Latency + size / bandwidth estimates (seconds) of the `candidates` for ``request``.

    a_in, b_in: latency and bottleneck bandwidth between two members of the fullest host; a_out, b_out: between
    the first members of the first two hosts; p ranks on N hosts, g members on the fullest, n bytes, r the rails
    the group leaves each host on, ch the channels (ring.channel_count), L the pipeline chunks of a tree or chain.
    NVLS loads its switch links at its in-switch efficiency (nvls.in_switch_efficiency), as its plan does.
    """
    n, size = request.nbytes, len(request.ranks)
    hosts = group_by_host(request.ranks, topology)
    count, g = len(hosts), max(len(members) for members in hosts)
    widest = max(hosts, key=len)
    a_in, b_in = link_costs(topology, widest[0], widest[1]) if g > 1 else (0.0, math.inf)
    a_out, b_out = link_costs(topology, hosts[0][0], hosts[1][0]) if count > 1 else (a_in, b_in)
    channels = channel_count(request, topology, hosts)
    rails = min(channels, rails_used(topology, hosts)) if count > 1 else 1
    hop = ((size - count) * a_in + count * a_out) / size if count > 1 else a_in
    per_byte = max(1 / b_in, 1 / (rails * b_out)) if count > 1 else 1 / b_in
    found: dict[AlgorithmName, float] = {}
    names = candidates(request, topology, hosts)
    nvls_rate = nvls.in_switch_efficiency(topology) if {"nvls", "nvls_sharp"} & set(names) else 1.0
    for name in names:
        if name == "ring" and request.op in RING_STEPS:
            # One ring per channel; per step every link carries n / p in all (the NICs n / (p r)).
            found[name] = RING_STEPS[request.op](size) * (hop + n / size * per_byte)
        elif name == "ring":
            # A pipelined chain per channel: p - 1 + L - 1 steps, each hop carrying one chunk of n / ch; the
            # latency is paid once per hop (NCCL keeps chunks in flight), at the slower hop's; the 8-slot window's
            # stall, which the plan charges only when a chunk takes under a third of a hop's latency, is left out.
            chunks = chunk_count(n / channels, request.chunk_bytes)
            step = n / (channels * chunks) * max(1 / b_in, channels / (rails * b_out) if count > 1 else 0.0)
            found[name] = (size - 1) * max(a_in, a_out) + (size + chunks - 2) * step
        elif name == "tree":
            found[name] = tree_estimate(n, hosts, channels, rails, request.chunk_bytes, (a_in, b_in), (a_out, b_out))
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


def tree_estimate(n: float, hosts: list[list[int]], channels: int, rails: int, chunk_bytes: float | None,
                  inner: tuple[float, float], outer: tuple[float, float]) -> float:
    """NCCL's tree all-reduce across hosts as tree.py plans it: up, then down, each a pipeline of L chunks of c
    bytes over the tree's height H (edges from its deepest GPU to its root), so H + L - 1 steps, each as long as
    its slowest edge.

    With g members per host the trees are chains of g - 1 NVLink hops joined by a double binary tree of the N
    hosts, D host levels deep: H = g D + g - 1, and every channel's two trees carry n / (2 ch) each. A host's
    edges to its parent start at steps g - 1, 2g - 1, ..., Dg - 1 of the pipeline and stay busy for L steps, so
    X = min(steps, D L if L < g else (D - 1) g + L) steps cross hosts; in each a rail carries k = 2 chunks (a
    host takes its two children's at once; k = 1 between two hosts, where every host has one peer). Over the
    whole pipeline each GPU sends n (g - 1) / g over NVLink, spread over the steps. The latency is paid in the H
    steps that open an edge (NCCL keeps chunks in flight after that): the network's in those that cross hosts,
    NVLink's in the others; the 8-slot window's stall (phases.window_stall, charged only for chunks under a third
    of a hop's latency) is left out. With one member per host it is the double binary tree over the ranks, each tree
    carrying n / 2, every step crossing hosts."""
    (a_in, b_in), (a_out, b_out) = inner, outer
    count, g = len(hosts), max(map(len, hosts))
    share = n / (2 * channels) if g > 1 else n / 2
    chunks = chunk_count(share, chunk_bytes)
    depth = tree_depth(count if g > 1 else sum(map(len, hosts)))
    height = g * depth + g - 1
    steps = height + chunks - 1
    crossing = steps if g == 1 else min(steps, depth * chunks if chunks < g else (depth - 1) * g + chunks)
    rail_chunks = (1 if count == 2 else 2) * max(1, channels // rails if g > 1 else 1)
    nvlink_step = n * (g - 1) / g / (steps * b_in) if g > 1 else 0.0
    cross_step = max(nvlink_step, rail_chunks * share / chunks / b_out)
    crossing_fill = min(crossing, height - g + 1)
    latency = crossing_fill * a_out + (height - crossing_fill) * a_in
    return 2 * (latency + crossing * cross_step + (steps - crossing) * nvlink_step)


def choose_algorithm(request: CollectiveRequest, topology: Topology) -> AlgorithmName:
    """`direct` for all_to_all and send_recv (point to point, as NCCL runs them); otherwise the candidate with
    the lowest estimate (ties go to the first listed)."""
    if request.op in ("all_to_all", "send_recv"):
        return "direct"
    costs = estimates(request, topology)
    return min(costs, key=costs.__getitem__)
