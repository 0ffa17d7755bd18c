"""NVLS + SHARP: NCCL's multi-node NVLS all-reduce, NVLink SHARP inside each host and SHARP across hosts.

NCCL enables its NVLS algorithm across hosts only with CollNet (tuning.cc disables NVLS for nNodes > 1 when
CollNet is off): each GPU of a host pulls its n/g slice reduced by the NVSwitch (`multimem.ld_reduce`), hands it
to its rail's SHARP tree once (n/g up its NIC), receives the slice reduced over all hosts once (n/g down) and
stores it to the host's multicast address (`multimem.st`). Each GPU's NVLink carries n (g+1)/g each way, as in
`nvls` (at its in-switch efficiency), and each NIC n/g each way; NCCL pipelines the two, so the collective takes
the slower, after NCCL's NVLS latency inside the host (25 us) plus its NVLS network latency (18 us). Without
SHARP switches NCCL runs NVLSTree instead, which the `nvls` algorithm models across hosts. All-reduce only:
NCCL's NVLS reduce-scatter and all-gather across hosts use CollNet's, which `collnet_direct` does not model
either.
"""

from __future__ import annotations

from simulator.catalog.sharp import NVLS_SHARP_NET_LATENCY
from simulator.collectives import nvls
from simulator.collectives.collnet_direct import check, sharp_transfers
from simulator.collectives.names import ALGORITHM_OPS
from simulator.collectives.phases import CollectiveRequest, Phase
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS = ALGORITHM_OPS["nvls_sharp"]
LATENCY = nvls.LATENCY + NVLS_SHARP_NET_LATENCY
"""NCCL's NVLS latency across hosts: intra-host NVLS (25 us) + the network's NVLS latency (18 us)."""


def fits(topology: Topology, hosts: list[list[int]]) -> bool:
    """NVLS needs every host's members on NVLink-SHARP switches (more than one GPU per host), on GPUs that drive
    NVLink SHARP, their links to the NVSwitches up."""
    return (nvls.available(topology) and len(hosts[0]) > 1
            and nvls.switches_up([rank for members in hosts for rank in members], topology))


def host_members(request: CollectiveRequest, topology: Topology) -> list[list[int]]:
    """The group's members per host, or the error that says why NVLS with SHARP cannot run ``request`` here."""
    hosts = check(request, topology, "nvls_sharp")
    if not fits(topology, hosts):
        raise ScenarioError(f"nvls_sharp needs NVLink SHARP inside the hosts (nvls: nvswitch3) and two or more GPUs "
                            f"of the group per host; {topology.name} with this group does not fit",
                            field="collectives.algorithm")
    return hosts


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """One phase: the in-switch all-reduce in every host and the SHARP all-reduce of n/g per NIC at once."""
    hosts = host_members(request, topology)
    g, n = len(hosts[0]), request.nbytes
    intra = nvls.in_switch(hosts, "all_reduce", n, topology)
    return [Phase(tuple(intra + sharp_transfers(hosts, n / g)), min_latency=LATENCY)]
