"""CollNetDirect: NCCL's all-reduce with in-network reduction in SHARP InfiniBand switches (`NCCL_COLLNET_ENABLE=1`).

Inside each host the buffer is split over the group's g GPUs there, each the "head" of one n/g slice with its own
NIC: every GPU sends each head its part of that head's slice over NVLink ((g-1)/g n out), each head hands its
reduced slice to the SHARP tree of its rail once (n/g up its NIC), the switches reduce it across the hosts and
send the result down once (n/g down its NIC), and the head broadcasts it back to its host mates ((g-1)/g n out).
Each GPU's NVLink then carries 2 (g-1)/g n each way, each NIC n/g each way, whatever the number of hosts: the
switch tree, not the hosts, does the N-way reduction, at line rate (SHARPv3 streams aggregation through the
switch's ports). NCCL pipelines the stages chunk by chunk, so the collective takes the slower of the two.

On the flow-level network the NIC load is a ring of n/g transfers over each rail's hosts, taken in order of leaf
group: every NIC sends n/g once and receives n/g once, and a leaf's hosts stay under their leaf, with one flow each
way to the spines, as a SHARP tree's leaf sends its partial aggregate up once and receives the result once. The
switches' limit on concurrent streaming aggregation flows (NVIDIA HPC-X: at most 2 per switch) is not modelled:
it binds the SHARP groups of the whole job at once, not one collective. The NVLink load is GPU i -> GPU i+1
transfers of 2 (g-1)/g n through the host's switch. Every transfer waits NCCL's CollNetDirect latency.

NCCL also runs reduce-scatter and all-gather through CollNetDirect, but only when the plugin offers them and every
host has one NIC per GPU of the group; they are not modelled here (ring, direct or nvls run them).
"""

from __future__ import annotations

from simulator.catalog.sharp import collnet_direct_latency
from simulator.collectives.names import ALGORITHM_OPS
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.collectives.ring import group_by_host
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS = ALGORITHM_OPS["collnet_direct"]


def refusal(ranks: tuple[int, ...], topology: Topology) -> str:
    """Why the group cannot reduce in the network on ``topology`` ('' when it can): the switches must run SHARP,
    and the group must span hosts that are NVLink domains of their own, with NVLink (NCCL disables CollNetDirect
    without NVSwitches, tuning.cc) and the same count of members on each."""
    if not topology.sharp:
        return f"{topology.name} has no SHARP switches (topology parameter sharp: none)"
    hosts = group_by_host(ranks, topology)
    if len(hosts) < 2:
        return "the group sits in one host; in-network reduction runs across hosts"
    if len({len(members) for members in hosts}) > 1:
        return "the group has a different number of GPUs on some host"
    domains = [{topology.gpu_domain[r] for r in members} for members in hosts]
    if any(len(d) > 1 for d in domains) or len(set.union(*domains)) < len(hosts):
        return "the group's hosts share NVLink domains (an NVL72 rack); CollNet runs between NVLink domains"
    if not all(topology.gpu_nvlink[r] for r in ranks):
        return "the group's hosts have no NVLink (PCIe servers); NCCL runs CollNetDirect only with NVSwitches"
    return ""


def supports(ranks: tuple[int, ...], topology: Topology) -> bool:
    """Whether ``ranks`` can reduce in the network (see `refusal`)."""
    return not refusal(ranks, topology)


def check(request: CollectiveRequest, topology: Topology, name: str) -> list[list[int]]:
    """The group's members per host, hosts in index order, or the error that says why algorithm ``name`` cannot
    run it. The fabric numbers hosts leaf group by leaf group, so in index order each leaf's hosts are adjacent
    and a ring over them leaves each leaf once each way, whatever the order of the group's ranks."""
    reason = refusal(request.ranks, topology)
    if reason:
        raise ScenarioError(f"{name} needs a group across hosts on SHARP switches: {reason}",
                            field="collectives.algorithm")
    return sorted(group_by_host(request.ranks, topology), key=lambda members: topology.gpu_host[members[0]])


def hosts(request: CollectiveRequest, topology: Topology) -> list[list[int]]:
    """`check` in CollNetDirect's name: the members per host, or why it cannot run ``request``."""
    return check(request, topology, "collnet_direct")


def sharp_transfers(hosts: list[list[int]], nbytes: float) -> list[Transfer]:
    """Each rail's in-network all-reduce of ``nbytes`` per NIC: every GPU of the rail sends that much to the same
    rail's GPU on the next host, so each NIC carries it once up and once down."""
    count = len(hosts)
    return [Transfer(hosts[i][j], hosts[(i + 1) % count][j], nbytes, j)
            for j in range(len(hosts[0])) for i in range(count)]


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """One phase: the heads' scatter and broadcast over NVLink and the SHARP all-reduce of n/g per NIC at once."""
    members = hosts(request, topology)
    g, n = len(members[0]), request.nbytes
    intra = [Transfer(host[i], host[(i + 1) % g], 2 * (g - 1) / g * n)
             for host in members for i in range(g)] if g > 1 else []
    return [Phase(tuple(intra + sharp_transfers(members, n / g)), min_latency=collnet_direct_latency(g))]
