"""Units counted on the job's topology graph and the blast radius of each unit's failure.

GPUs, hosts, NICs, leaf and spine switches and network cables are read off the wiring. The blast
radius of a unit is the set of hosts that leave the job with it: a GPU or NIC takes its host; a leaf switch
every host with a NIC below it; a NIC-to-leaf cable its host; a leaf-to-spine cable and a spine switch take
no host (the job's traffic is routed around them). On GB200 NVL72 racks (topology kind `nvl72`) a rack takes
its compute trays (hosts), and an NVSwitch tray none: it lowers the NVLink bandwidth of its rack's GPUs. For the
states of a job that keeps running, each network unit also lists the links (node-name pairs) its failure takes
down, each NVSwitch tray its rack's NVSwitch node, and each GPU, host or rack unit its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.config.reliability import UnitKind
from simulator.topology.graph import Topology

NO_HOSTS: tuple[int, ...] = ()


@dataclass(frozen=True)
class ClusterUnits:
    """Per unit kind, the hosts each unit's failure takes out of the job (unit index -> tuple of hosts), the
    links a network unit's failure takes down and the GPUs of a GPU or host unit."""

    hosts: int
    blast: dict[UnitKind, tuple[tuple[int, ...], ...]]
    """Per unit kind, the hosts each unit's failure takes out of the job."""
    spines: int
    nodes: dict[UnitKind, tuple[str, ...]]
    cable_ends: tuple[tuple[str, str], ...]
    gpus: dict[UnitKind, tuple[tuple[int, ...], ...]]
    outgoing: dict[str, tuple[str, ...]]
    nvswitch_trays: int = 0
    """NVSwitch trays per rack (0: not NVL72 racks); NVSwitch tray unit u is tray u mod this of the rack whose
    NVSwitch node is ``nodes["nvswitch_tray"][u]`` (a rack of one GPU has no switch, and no trays)."""

    def count(self, unit: UnitKind) -> int:
        return len(self.blast[unit])

    def first_trays(self) -> range:
        """Each rack's first NVSwitch tray unit: a rack's trays are consecutive units (`_add_racks`)."""
        return range(0, self.count("nvswitch_tray"), self.nvswitch_trays) if self.nvswitch_trays else range(0)

    def tray_place(self, unit: int) -> tuple[int, int]:
        """NVSwitch tray unit ``unit`` as (its rack, its index among the rack's trays), a spare rack's after the
        cluster's."""
        return divmod(unit, self.nvswitch_trays)

    def links(self, unit: UnitKind, index: int) -> tuple[tuple[str, str], ...]:
        """The links (node pairs) the failure of network unit ``index`` of kind ``unit`` takes down: a cable
        itself, every link of a NIC or switch (an NVSwitch tray: its rack's GPU links, which its state degrades,
        or takes down with every tray)."""
        if unit == "cable":
            return (self.cable_ends[index],)
        node = self.nodes[unit][index]
        return tuple((node, other) for other in self.outgoing[node])


def cluster_units(topology: Topology) -> ClusterUnits:
    """Count every unit kind on ``topology`` and record each unit's blast radius."""
    wiring = topology.wiring
    nic_host: dict[str, int] = {}
    leaves: list[str] = []
    spines: list[str] = []
    for name, data in wiring.nodes.items():
        kind = data.get("kind")
        if kind == "nic":
            nic_host[name] = data["host"]
        elif kind == "switch" and data.get("tier") == 1:
            leaves.append(name)
        elif kind == "switch" and data.get("tier") == 2:
            spines.append(name)
    below: dict[str, set[int]] = {leaf: set() for leaf in leaves}
    nvswitches = [name for name, data in wiring.nodes.items() if data.get("kind") == "nvswitch"]
    outgoing: dict[str, list[str]] = {node: [] for node in (*nic_host, *leaves, *spines, *nvswitches)}
    for a, b in wiring.edges:
        if b in below and a in nic_host:
            below[b].add(nic_host[a])
        if a in outgoing:
            outgoing[a].append(b)
    leaf_hosts = {leaf: tuple(sorted(below[leaf])) for leaf in leaves}
    cables: list[tuple[int, ...]] = []
    cable_ends: list[tuple[str, str]] = []
    switches = set(leaves) | set(spines)
    for a, b in wiring.graph_order_edges():
        if a < b and (a in switches or b in switches) and (a in nic_host or b in nic_host or
                                                          (a in switches and b in switches)):
            host = nic_host.get(a, nic_host.get(b))
            cables.append(NO_HOSTS if host is None else (host,))
            cable_ends.append((a, b))
    nics = sorted(nic_host.items(), key=lambda item: item[0])
    host_gpus: list[list[int]] = [[] for _ in range(topology.num_hosts)]
    for gpu, host in enumerate(topology.gpu_host):
        host_gpus[host].append(gpu)
    blast: dict[UnitKind, tuple[tuple[int, ...], ...]] = {
        "gpu": tuple((host,) for host in topology.gpu_host),
        "host": tuple((host,) for host in range(topology.num_hosts)),
        "nic": tuple((host,) for _, host in nics),
        "leaf_switch": tuple(leaf_hosts[leaf] for leaf in leaves),
        "spine_switch": tuple(NO_HOSTS for _ in spines),
        "cable": tuple(cables),
    }
    nodes: dict[UnitKind, tuple[str, ...]] = {
        "nic": tuple(nic for nic, _ in nics), "leaf_switch": tuple(leaves), "spine_switch": tuple(spines)}
    gpus: dict[UnitKind, tuple[tuple[int, ...], ...]] = {
        "gpu": tuple((gpu,) for gpu in range(topology.num_gpus)), "host": tuple(map(tuple, host_gpus))}
    trays = _add_racks(topology, blast, nodes, gpus)
    return ClusterUnits(topology.num_hosts, blast, len(spines), nodes, tuple(cable_ends), gpus,
                        {node: tuple(sorted(others)) for node, others in outgoing.items()}, trays)


def _add_racks(topology: Topology, blast: dict, nodes: dict, gpus: dict) -> int:
    """Record the racks and NVSwitch trays of GB200 NVL72 racks (none on another cluster kind): a rack's blast
    radius is its compute trays, an NVSwitch tray's none; each tray unit names its rack's NVSwitch node. The
    NVSwitch trays per rack (0 where there are no racks). The racks are the NVLink domains, in wiring order."""
    if topology.params.get("kind") != "nvl72":
        blast.update(rack=(), nvswitch_tray=())
        gpus["rack"] = ()
        nodes["nvswitch_tray"] = ()
        return 0
    rack_gpus: dict[int, list[int]] = {}
    for gpu, domain in enumerate(topology.gpu_domain):
        rack_gpus.setdefault(domain, []).append(gpu)
    racks = sorted(rack_gpus)
    trays = topology.params["nvswitch_trays"]
    blast["rack"] = tuple(tuple(sorted({topology.gpu_host[gpu] for gpu in rack_gpus[rack]})) for rack in racks)
    gpus["rack"] = tuple(tuple(rack_gpus[rack]) for rack in racks)
    switches = [name for name, data in topology.wiring.nodes.items() if data.get("kind") == "nvswitch"]
    nodes["nvswitch_tray"] = tuple(switch for switch in switches for _ in range(trays))
    blast["nvswitch_tray"] = tuple(NO_HOSTS for _ in nodes["nvswitch_tray"])
    return trays
