"""Units counted on the job's topology graph and the blast radius of each unit's failure.

GPUs, hosts, NICs, leaf and spine switches and network cables are read off the networkx graph. The blast
radius of a unit is the set of hosts that leave the job with it: a GPU or NIC takes its host; a leaf switch
every host with a NIC below it; a NIC-to-leaf cable its host; a leaf-to-spine cable and a spine switch take
no host (the job's traffic is routed around them).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.topology.graph import Topology

NO_HOSTS: tuple[int, ...] = ()


@dataclass(frozen=True)
class ClusterUnits:
    """Per unit kind, the hosts each unit's failure takes out of the job (unit index -> tuple of hosts)."""

    hosts: int
    blast: dict[str, tuple[tuple[int, ...], ...]]
    spines: int
    hosts_per_leaf: int

    def count(self, unit: str) -> int:
        return len(self.blast[unit])


def cluster_units(topology: Topology) -> ClusterUnits:
    """Count every unit kind on ``topology`` and record each unit's blast radius."""
    graph = topology.graph
    nic_host: dict[str, int] = {}
    leaves: list[str] = []
    spines: list[str] = []
    for name, data in graph.nodes(data=True):
        kind = data.get("kind")
        if kind == "nic":
            nic_host[name] = data["host"]
        elif kind == "switch" and data.get("tier") == 1:
            leaves.append(name)
        elif kind == "switch" and data.get("tier") == 2:
            spines.append(name)
    leaf_hosts = {leaf: tuple(sorted({nic_host[n] for n in graph.predecessors(leaf) if n in nic_host}))
                  for leaf in leaves}
    cables: list[tuple[int, ...]] = []
    switches = set(leaves) | set(spines)
    for a, b in graph.edges():
        if a < b and (a in switches or b in switches) and (a in nic_host or b in nic_host or
                                                          (a in switches and b in switches)):
            host = nic_host.get(a, nic_host.get(b))
            cables.append(NO_HOSTS if host is None else (host,))
    nics = sorted(nic_host.items(), key=lambda item: item[0])
    blast = {
        "gpu": tuple((host,) for host in topology.gpu_host),
        "host": tuple((host,) for host in range(topology.num_hosts)),
        "nic": tuple((host,) for _, host in nics),
        "leaf_switch": tuple(leaf_hosts[leaf] for leaf in leaves),
        "spine_switch": tuple(NO_HOSTS for _ in spines),
        "cable": tuple(cables),
    }
    per_leaf = max((len(hosts) for hosts in leaf_hosts.values()), default=0)
    return ClusterUnits(topology.num_hosts, blast, len(spines), per_leaf)
