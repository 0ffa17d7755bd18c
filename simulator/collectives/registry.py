"""The one registry of collective algorithms, by name, and the `auto` rule that picks one per collective.

`auto` compares alpha-beta estimates built from the topology's own links (latency and bottleneck bandwidth
of an intra-host and a cross-host path of the group) and takes the cheapest candidate; docs/collectives.md
states the rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from simulator.catalog.sharp import collnet_direct_latency
from simulator.collectives import collnet_direct, direct, halving_doubling, hierarchical, nvls, nvls_sharp, ring, tree
from simulator.collectives.chunking import check_chunk
from simulator.collectives.names import AlgorithmChoice, AlgorithmName, Primitive
from simulator.collectives.phases import CollectiveRequest, Phase
from simulator.collectives.ring import channel_count, group_by_host, rails_used
from simulator.collectives.tree import chunk_count
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

Planner = Callable[[CollectiveRequest, Topology], list[Phase]]


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm: its ``plan``, the primitives (``ops``) it implements, and whether NCCL runs it on
    its NVLS channels (``nvls_channels``, the SMs its kernel holds; engine/contention.py)."""

    plan: Planner
    ops: tuple[Primitive, ...]
    nvls_channels: bool = False


ALGORITHMS: dict[AlgorithmName, Algorithm] = {
    "ring": Algorithm(ring.plan, ring.OPS),
    "tree": Algorithm(tree.plan, tree.OPS),
    "hierarchical": Algorithm(hierarchical.plan, hierarchical.OPS),
    "direct": Algorithm(direct.plan, direct.OPS),
    "halving_doubling": Algorithm(halving_doubling.plan, halving_doubling.OPS),
    "nvls": Algorithm(nvls.plan, nvls.OPS, nvls_channels=True),
    "collnet_direct": Algorithm(collnet_direct.plan, collnet_direct.OPS),
    "nvls_sharp": Algorithm(nvls_sharp.plan, nvls_sharp.OPS, nvls_channels=True),
}
"""name -> algorithm, one per names.py AlgorithmName. send_recv is one transfer whatever the algorithm."""

def plan_collective(request: CollectiveRequest, topology: Topology, algorithm: AlgorithmChoice = "auto"
                    ) -> list[Phase]:
    """Check ``request``, resolve ``algorithm`` (a registered name or "auto") and return its phases."""
    check_request(request, topology)
    if len(request.ranks) < 2 or request.nbytes == 0:
        return []
    name = resolve_algorithm(request, topology, algorithm)
    chosen = ALGORITHMS[name]
    if request.op not in chosen.ops:
        able = ", ".join(name for name, entry in ALGORITHMS.items() if request.op in entry.ops)
        raise ScenarioError(f"algorithm {name!r} does not implement {request.op}",
                            field="collectives.algorithm", allowed=f"{able} or auto")
    return chosen.plan(request, topology)


def resolve_algorithm(request: CollectiveRequest, topology: Topology, algorithm: AlgorithmChoice) -> AlgorithmName:
    """The algorithm that runs ``request``: a send_recv is one direct transfer whatever was asked; ``auto`` is
    `choose_algorithm`'s choice; any other name runs as given."""
    if request.op == "send_recv":
        return "direct"
    return choose_algorithm(request, topology) if algorithm == "auto" else algorithm


def check_request(request: CollectiveRequest, topology: Topology) -> None:
    """Reject a request no algorithm can plan, naming the field and what would be accepted."""
    ranks = request.ranks
    if not ranks or len(set(ranks)) != len(ranks):
        raise ScenarioError(f"group {ranks} must list distinct GPUs", field="group", allowed="distinct GPU indices")
    if min(ranks) < 0 or max(ranks) >= topology.num_gpus:
        raise ScenarioError(f"group {ranks} names a GPU the cluster lacks", field="group",
                            allowed=f"GPU indices 0..{topology.num_gpus - 1}")
    if request.op == "send_recv" and len(ranks) != 2:
        raise ScenarioError(f"send_recv takes (src, dst), got {ranks}", field="group", allowed="two GPU indices")
    if not (math.isfinite(request.nbytes) and request.nbytes >= 0):
        raise ScenarioError(f"size {request.nbytes!r} is not a byte count", field="nbytes",
                            allowed="zero or a positive size")
    if not 0 <= request.root < len(ranks):
        raise ScenarioError(f"root {request.root} is not a position in the group", field="root",
                            allowed=f"0..{len(ranks) - 1}")
    check_chunk(request.chunk_bytes)
    if request.channels < 0:
        raise ScenarioError(f"channels {request.channels} is negative", field="collectives.channels",
                            allowed="0 (one per rail) or a positive count")


def link_costs(topology: Topology, src: int, dst: int) -> tuple[float, float]:
    """(latency s, bottleneck bytes/s) of the route from ``src`` to ``dst`` at nominal link bandwidth."""
    path = topology.path(src, dst)
    return topology.path_latency(src, dst), float(min(topology.link_bandwidth[i] for i in path))


def estimates(request: CollectiveRequest, topology: Topology) -> dict[AlgorithmName, float]:
    """Alpha-beta time estimates (seconds) of the candidates `auto` weighs for this request."""
    size, n = len(request.ranks), request.nbytes
    hosts = group_by_host(request.ranks, topology)
    widest = max(hosts, key=len)
    a_in, b_in = link_costs(topology, widest[0], widest[1]) if len(widest) > 1 else (0.0, math.inf)
    a_out, b_out = link_costs(topology, hosts[0][0], hosts[1][0]) if len(hosts) > 1 else (a_in, b_in)
    if request.op in ("broadcast", "reduce"):
        chunks = chunk_count(n, request.chunk_bytes)
        return {"ring": (size + chunks - 2) * (a_out + n / chunks / b_out),
                "tree": math.ceil(math.log2(size)) * (a_out + n / b_out)}
    rails = min(channel_count(request, topology, hosts), rails_used(topology, hosts))  # rings on distinct NICs
    chunks = chunk_count(n / 2, request.chunk_bytes)
    count = len(hosts)
    mean_hop = ((size - count) * a_in + count * a_out) / size if count > 1 else a_in
    ring_bandwidth = min(b_in, rails * b_out) if count > 1 else b_in
    found: dict[AlgorithmName, float] = {
        "ring": 2 * (size - 1) * (mean_hop + n / (size * ring_bandwidth)),
        "tree": 2 * (math.ceil(math.log2(size)) + chunks - 1) * (a_out + n / (chunks * b_out))}
    g = len(hosts[0])
    if count > 1 and g > 1 and all(len(members) == g for members in hosts):
        found["hierarchical"] = (2 * (g - 1) * (a_in + n / (g * b_in))
                                 + 2 * (count - 1) * (a_out + n / (g * count * b_out)))
    if request.op == "all_reduce" and collnet_direct.supports(request.ranks, topology):
        found |= in_network_estimates(n, g, b_in, b_out, nvls_sharp.fits(topology, hosts))
    return found


def in_network_estimates(n: float, g: int, b_in: float, b_out: float,
                         nvls_inside: bool) -> dict[AlgorithmName, float]:
    """The SHARP all-reduces' closed forms: NCCL's latency, then the slower of the host's NVLink load and its
    NICs' n/g each way (the two stages are pipelined)."""
    found: dict[AlgorithmName, float] = {
        "collnet_direct": collnet_direct_latency(g) + n * max(2 * (g - 1) / (g * b_in), 1 / (g * b_out))}
    if nvls_inside:
        found["nvls_sharp"] = nvls_sharp.LATENCY + n * max((g + 1) / (g * b_in), 1 / (g * b_out))
    return found


def choose_algorithm(request: CollectiveRequest, topology: Topology) -> AlgorithmName:
    """The `auto` rule: direct for all_to_all / send_recv; nvls for all_reduce over 4 or more GPUs inside one
    NVLink-SHARP domain (NCCL's tuner ranks NVLS above ring and tree there: 2 x 0.85 x the ring's bus bandwidth
    per channel and a lower latency than 2 (p-1) ring steps; with fewer its link load, n (p+1)/p, is no lower
    than the ring's 2 (p-1)/p n); ring for reduce_scatter / all_gather and for all_reduce inside one
    host; otherwise the cheapest alpha-beta estimate (ties go to the first listed), which on SHARP switches weighs
    the in-network all-reduces too."""
    if request.op in ("all_to_all", "send_recv"):
        return "direct"
    if request.op == "all_reduce" and nvls.supports(request.ranks, topology) and len(request.ranks) > 3:
        return "nvls"
    if request.op in ("reduce_scatter", "all_gather"):
        return "ring"
    if request.op == "all_reduce" and len({topology.gpu_host[r] for r in request.ranks}) == 1:
        return "ring"
    costs = estimates(request, topology)
    return min(costs, key=costs.__getitem__)
