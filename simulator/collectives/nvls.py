"""NVLS: NCCL's in-switch reduction on NVLink SHARP (third-generation NVSwitch), inside one NVLink domain.

All-reduce: every GPU owns 1/p of the buffer; it pulls its slice reduced by the switch (`multimem.ld_reduce`:
the switch reads that slice from every GPU) and stores the result once to a multicast address (`multimem.st`:
the switch writes it to every GPU). Each GPU's link to the switch then carries n (its share of every reduced
slice) + n/p (its own store) up, and n/p (its reduced slice) + n (every stored slice) down: n (p+1)/p each way,
against 2 (p-1)/p n for a ring, so busbw = 2 (p-1)/(p+1) x link bandwidth x in-switch efficiency (below).
Reduce-scatter carries n up and n/p down, all-gather n/p up and n down: one direction at n. Across NVLink
domains all-reduce runs NCCL's NVLS tree: in-switch inside each domain (a DGX host, or a whole GB200 NVL72 rack,
one node to NCCL under MNNVL); across domains NCCL's double binary tree over each domain's heads, one per NIC
(`head_trees`), on DGX hosts and GB200 racks alike.

The links are loaded through ordinary GPU-to-GPU transfers of the same size (GPU i to GPU i+1 over the
switch), which loads every GPU's up and down link exactly as above for all-reduce; for reduce-scatter and
all-gather the idle direction is loaded too, which only matters when other traffic shares it. Each transfer
waits NCCL's NVLS latency (25 us) before its bytes flow.

The switch's multimem loads and stores do not reach the rate the ring's stores reach over the same NVLinks: NCCL's
tuner charges NVLS the ring's NVLink bandwidth times nvlsEfficiency (0.85 on Hopper, 0.74 on Blackwell;
catalog/kernels.yaml `nvls`), and nccl-tests measures 480 GB/s busbw on 8 H100 against the 2 x 7/9 x 370 = 575
the link loads alone would allow. The loss is put in the load: each payload byte takes 1/efficiency bytes of its
switch links, so every busbw (over p, op and the links' own efficiency) comes out of the flow model, and traffic
sharing those links meets the link time NVLS really holds, which a cap on the collective's rate would hide. The
flow rows therefore carry these load bytes; each transfer's ``sent_share`` keeps what its GPU really sends
(`sent_bytes`: n (p+1)/p for all-reduce, n for reduce-scatter, n/p for all-gather), which the summary's traffic
reports.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from simulator.catalog.calibration import nvls_efficiency
from simulator.catalog.gpus import gpu_names
from simulator.collectives.hierarchical import host_grid
from simulator.collectives.names import ALGORITHM_OPS, Primitive
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.collectives.tree import double_binary_tree
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS = ALGORITHM_OPS["nvls"]
LATENCY = 25e-6
"""NCCL's latency of an NVLS collective, Simple protocol (src/graph/tuning.cc, hwLatencies[NVLINK][NVLS])."""
TREE_NET_LATENCY = 20.9e-6
"""NCCL's per-level network latency of the NVLS tree (hwLatencies[NET][NVLS_TREE]): the NVLS tree costs
LATENCY + 2 log2(nodes) x this (`tree_latency`)."""


def tree_latency(nodes: int) -> float:
    """The latency of NCCL's NVLS tree over ``nodes`` NVLink domains (tuning.cc: intraLat + 2 log2i(nNodes) x
    interLat; under MNNVL a GB200 rack is one node)."""
    return LATENCY + 2 * math.ceil(math.log2(nodes)) * TREE_NET_LATENCY


def link_bytes(op: Primitive, nbytes: float, size: int) -> float:
    """Bytes an NVLS collective moves over each member's busiest switch link."""
    return nbytes * (size + 1) / size if op == "all_reduce" else nbytes


def sent_bytes(op: Primitive, nbytes: float, size: int) -> float:
    """Bytes each member really sends to the switch in an NVLS collective: its share of every reduced slice and
    its store for all-reduce, its share of every slice for reduce-scatter, its own slice for all-gather."""
    return nbytes / size if op == "all_gather" else link_bytes(op, nbytes, size)


def available(topology: Topology) -> bool:
    """Whether ``topology`` can run NVLS at all: switches that reduce (``topology.nvls``) and GPUs that drive
    NVLink SHARP (an efficiency in the catalog)."""
    return topology.nvls and nvls_efficiency(topology.gpu_model) is not None


def switches_up(ranks: Sequence[int], topology: Topology) -> bool:
    """Whether every GPU of ``ranks`` keeps a link up to an NVSwitch. With all of a GPU's NVSwitch links down
    (every NVSwitch tray of a GB200 NVL72 rack down, or `faults.step.links` at capacity 0 from the start: the
    rerouter's links down) no switch is left to reduce in, and NCCL runs another algorithm. Links degraded but up
    (some trays down) keep NVLS, slowed as every transfer over them is by the capacity left."""
    # Loaded wherever a Rerouter was made; not imported here: it loads networkx, ~0.1 s that a healthy run spares.
    rerouting = sys.modules.get("simulator.faults.rerouting")
    router = topology.router
    if rerouting is None or not isinstance(router, rerouting.Rerouter):
        return True
    nodes, graph = topology.wiring.nodes, topology.graph
    return all(any(nodes[peer].get("kind") == "nvswitch" and (gpu, peer) not in router.down
                   for peer in graph.successors(gpu))
               for gpu in (topology.gpus[rank] for rank in ranks))


def supports(ranks: tuple[int, ...], topology: Topology) -> bool:
    """NVLS inside one domain: the whole group in one NVLink domain of a topology that can run it, each GPU's
    links to the NVSwitches up."""
    return (available(topology) and len({topology.gpu_domain[rank] for rank in ranks}) == 1
            and switches_up(ranks, topology))


MIN_HEADS = 2
"""NCCL runs NVLS and its NVLS tree only on an NVLS graph of at least 2 channels (src/graph/tuning.cc: "NVLS/NVLStree
needs at least 2 channels"; NCCL master of 2026-06-11). Inside one NVLink domain the graph has a channel per GPU
(up to 32, search.cc), so any group of 2 or more qualifies; across hosts a channel per head, a member GPU that is
the local GPU of a NIC, no GPU twice (search.cc, NCCL_TOPO_PATTERN_NVLS), the fewest of any host (connect.cc):
here the distinct NICs a host's members drive (`ring.nics_used`; the PCIe distances that would let a NIC no
member drives pick one of them as its local GPU are not modelled, so members sharing a NIC make one head)."""


def in_switch_efficiency(topology: Topology) -> float:
    """The fraction of the ring's NVLink bandwidth the in-switch reduction reaches on ``topology``'s GPUs."""
    efficiency = nvls_efficiency(topology.gpu_model)
    if efficiency is None:
        able = ", ".join(name for name in gpu_names() if nvls_efficiency(name) is not None)
        raise ScenarioError(f"nvls needs GPUs with NVLink SHARP; {topology.gpu_model} has none",
                            field="cluster.gpu_model", allowed=able)
    return efficiency


def in_switch(groups: list[list[int]], op: Primitive, nbytes: float, topology: Topology) -> list[Transfer]:
    """The transfers of one NVLS collective in every group at once (one group per NVLink domain), each carrying
    its link load at the in-switch efficiency and, as its sent share, the `sent_bytes` its GPU really sends."""
    efficiency = in_switch_efficiency(topology)
    transfers = []
    for members in groups:
        load = link_bytes(op, nbytes, len(members)) / efficiency
        share = sent_bytes(op, nbytes, len(members)) / load
        transfers += [Transfer(rank, members[(index + 1) % len(members)], load, 0, share)
                      for index, rank in enumerate(members)]
    return transfers


def check(request: CollectiveRequest, topology: Topology) -> list[list[int]]:
    """The group's members per NVLink domain, or the error that says why NVLS cannot run ``request`` on
    ``topology``: inside one NVLink domain it needs NVLink SHARP; across domains only all_reduce runs, over switches
    that reduce, with the same count of members on every domain (`hierarchical.host_grid`)."""
    if supports(request.ranks, topology):
        return [list(request.ranks)]
    if not topology.nvls or request.op != "all_reduce" or not switches_up(request.ranks, topology):
        raise ScenarioError(f"nvls {request.op} needs NVLink SHARP, the group's links to the NVSwitches up and a "
                            f"group inside one NVLink domain (all_reduce may span hosts whose switches reduce); "
                            f"{topology.name} does not fit",
                            field="collectives.algorithm")
    hosts = host_grid(request, topology, "nvls")
    if len(hosts[0]) > 1:
        in_switch_efficiency(topology)
    return hosts


MAX_HEADS = 32
"""The most heads NCCL's NVLS graph finds per node (src/graph/search.cc caps its channels at
min(NCCL_MAX_NVLS_ARITY = 32, GPUs); each channel's head is the local GPU of one NIC, no GPU twice)."""


def domain_heads(hosts: list[list[int]], topology: Topology) -> list[list[int]]:
    """Each NVLink domain's NVLS heads, as NCCL's search finds them: the first member on each NIC its members
    drive, in member order, at most `MAX_HEADS`, as many on every domain as on the one with fewest (connect.cc
    keeps the smallest head count of any node)."""
    nic = topology.gpu_nic
    firsts = []
    for members in hosts:
        first_on: dict[str, int] = {}
        for rank in members:
            first_on.setdefault(nic[rank], rank)
        firsts.append(list(first_on.values()))
    count = min(MAX_HEADS, *map(len, firsts))
    return [heads[:count] for heads in firsts]


def head_trees(hosts: list[list[int]], nbytes: float, topology: Topology) -> list[Transfer]:
    """NCCL's NVLS tree across NVLink domains (connect.cc `connectNvls`): head h of every domain joins the
    double binary tree of the domains (trees.cc `ncclGetDtree`), its channels alternating between the two trees,
    and carries its n/heads slice, half up and down each tree: every edge moves n/(2 heads) each way."""
    heads = domain_heads(hosts, topology)
    share = nbytes / (2 * len(heads[0]))
    transfers = []
    for channel in range(len(heads[0])):
        column = tuple(domain[channel] for domain in heads)
        for edges in double_binary_tree(column):
            transfers += [Transfer(a, b, share, channel) for child, parent, *_ in edges
                          for a, b in ((child, parent), (parent, child))]
    return transfers


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """Inside one domain: one in-switch phase. Across domains (all_reduce, NCCL's NVLS tree): the in-switch
    all-reduce in every domain and, at the same time, NCCL's tree over the domains' heads (`head_trees`: one head
    per NIC, DGX hosts and GB200 racks alike), NCCL pipelining the two chunk by chunk, so the step takes as long
    as the slower level."""
    ranks = request.ranks
    hosts = check(request, topology)
    if supports(ranks, topology):
        return [Phase(tuple(in_switch([list(ranks)], request.op, request.nbytes, topology)), min_latency=LATENCY)]
    transfers = in_switch(hosts, "all_reduce", request.nbytes, topology) if len(hosts[0]) > 1 else []
    transfers += head_trees(hosts, request.nbytes, topology)
    return [Phase(tuple(transfers), min_latency=tree_latency(len(hosts)))]
