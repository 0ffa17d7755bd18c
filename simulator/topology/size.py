"""How many GPUs a topology file describes, read from its parameters without building the graph, so that a
cluster too large to simulate can be refused in milliseconds instead of after minutes of graph building."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np

from simulator.errors import TopologyError
from simulator.topology.builders import (
    BUILDERS,
    GRAPH_PARAMETERS,
    NODE_TYPES,
    rack_trays,
    read_graph_nodes,
    shift_period_hosts,
)
from simulator.topology.loader import TopologySource
from simulator.topology.parameters import read_parameters

MAX_QUICK_GPUS = 2**15
"""`topo describe/draw` and `collective` refuse larger clusters unless forced: building the cluster is linear in the
GPUs (`topo describe` of 32,768 took 1.8 s and 170 MB, of 131,072 6.8 s and 460 MB, on a shared 2-core machine on
2026-12-03), a million would take minutes. `trainsim collective` on 65,536 GPUs (dgx-h100-cluster, nodes=8192)
timed an all-reduce of its default 11 sizes (1MiB:1GiB) in 3:05 and 3.1 GB, one 1 GiB size in 11 s and 0.67 GB
with ring, 20 s and 0.80 GB with auto (NVLS), each one run on the 2-core machine at a load of 7 to 10, on
2026-12-06 (2.9 s on 2026-12-03 was a quieter machine's); a cluster twice the limit already takes minutes with
the command's default sizes."""


def _node_gpus(raw: object) -> int:
    kind = raw.get("kind", "nvswitch_node") if isinstance(raw, dict) else None
    if kind not in NODE_TYPES or not isinstance(raw, dict):
        raise TopologyError("unknown node kind")
    return read_parameters(NODE_TYPES[kind][0], {k: v for k, v in raw.items() if k != "kind"})["gpus"]


def _graph_gpus(raw: dict) -> int:
    """The GPUs among the nodes the builder would build: a graph whose nodes it refuses has no count, so that
    its own error, not a layout measured against a miscount (duplicates, misspelt keys), is what the user sees."""
    nodes = read_parameters({"nodes": GRAPH_PARAMETERS["nodes"]}, {"nodes": raw.get("nodes")})["nodes"]
    return sum(1 for node in read_graph_nodes(nodes) if node["kind"] == "gpu")


_COUNTERS: dict[str, Callable[[dict], int]] = {
    "nvswitch_node": lambda p: read_parameters(BUILDERS["nvswitch_node"].parameters, p)["gpus"],
    "pcie_node": lambda p: read_parameters(BUILDERS["pcie_node"].parameters, p)["gpus"],
    "cluster": lambda p: read_parameters(BUILDERS["cluster"].parameters, p)["nodes"] * _node_gpus(
        p.get("node", {"kind": "nvswitch_node"})),
    "nvl72": lambda p: (lambda q: sum(rack_trays(q)) * q["gpus_per_tray"])(
        read_parameters(BUILDERS["nvl72"].parameters, p)),
    "graph": _graph_gpus,
}
"""GPU count of each builder kind from its raw parameters; a kind without an entry is counted by building it."""

SIZE_PARAMETERS: dict[str, tuple[str, ...]] = {
    "nvswitch_node": ("gpus",), "pcie_node": ("gpus",), "cluster": ("nodes",), "nvl72": ("racks", "trays"),
    "graph": ()}
"""The parameters that set how many GPUs each builder kind has, which a cluster too large is told to lower (none
for a graph, whose GPUs are its listed nodes)."""


def topology_gpus(spec: TopologySource) -> int | None:
    """The number of GPUs ``spec`` would build, or None when it cannot be told without building (an unknown
    kind, or parameters the builder will refuse with a located error)."""
    counter = _COUNTERS.get(spec.kind)
    if counter is None:
        return None
    try:
        return int(counter(dict(spec.params)))
    except TopologyError:
        return None


@dataclass(frozen=True)
class HostShape:
    """The GPUs of each host of a cluster, the rails (NICs) each host leaves on, and the GPUs of each NVLink
    domain, read from its parameters: what tells a collective's flows apart from its members' count before the
    cluster is built (scale.py). A GB200 NVL72 tray is a host (collectives/ring.py runs a ring per channel through
    trays) inside a rack's NVLink domain (a last rack partly in use, `last_rack_trays`, holds fewer: domain
    ``rank // domain`` all the same); a DGX host is its own domain."""

    gpus: int
    rails: int
    domain: int
    period: int = 0
    """GPU indices per period of the fabric's spine hash (`Fabric.shift_gpus`), whose whole multiples shift the
    data-parallel replicas onto each other (engine/replicas.py); 0: one period spans the cluster."""

    def nic(self, rank: int) -> tuple[int, int]:
        """The host of GPU ``rank`` and the NIC it drives there: GPU i of a host on NIC i rails // gpus, as the
        topology builders wire them (`Topology.gpu_nic`)."""
        return rank // self.gpus, rank % self.gpus * self.rails // self.gpus


def _period(hosts: int, host_gpus: int, params: dict) -> int:
    """`HostShape.period` of ``hosts`` hosts of ``host_gpus`` GPUs (0 where one period holds every host)."""
    period = shift_period_hosts(hosts, params)
    return period * host_gpus if period < hosts else 0


def host_shape(spec: TopologySource) -> HostShape | None:
    """The `HostShape` of a multi-host cluster ``spec`` or of GB200 NVL72 racks, or None for a single host, a
    graph, or parameters the builder will refuse (every collective then counts as inside one host)."""
    try:
        if spec.kind == "cluster":
            params = read_parameters(BUILDERS["cluster"].parameters, dict(spec.params))
            gpus = _node_gpus(params["node"])
            return HostShape(gpus, min(params["nics_per_node"] or gpus, gpus), gpus,
                             _period(params["nodes"], gpus, params))
        if spec.kind == "nvl72":
            params = read_parameters(BUILDERS["nvl72"].parameters, dict(spec.params))
            tray = params["gpus_per_tray"]
            rails = min(params["nics_per_tray"], tray) if params["racks"] > 1 else 1
            trays = sum(rack_trays(params))
            period = _period(trays, tray, params) if params["racks"] > 1 else 0
            return HostShape(tray, rails, tray * params["trays"], period)
    except TopologyError:
        return None
    return None


class GpuPlacement(Protocol):
    """What a training step's plan reads of its cluster (workload/training.py): a built `Topology`, or an
    `UnbuiltCluster` read from its parameters."""

    @property
    def num_gpus(self) -> int: ...

    @property
    def gpu_model(self) -> str: ...

    @property
    def gpu_domain(self) -> list[int]: ...

    @property
    def gpu_domain_array(self) -> np.ndarray: ...


@dataclass(frozen=True)
class UnbuiltCluster:
    """A cluster's `GpuPlacement` from its topology's parameters, not built: its GPUs, their model and NVLink
    domains of ``domain`` consecutive GPUs (`HostShape.domain`). `trainsim validate` weighs a step's memory on a
    cluster beyond scale.MAX_GPUS with it, where building one of 524,288 GPUs would take over a minute."""

    num_gpus: int
    gpu_model: str
    domain: int

    @cached_property
    def gpu_domain_array(self) -> np.ndarray:
        """Each GPU's NVLink domain."""
        return np.arange(self.num_gpus, dtype=np.int64) // self.domain

    @cached_property
    def gpu_domain(self) -> list[int]:
        """`gpu_domain_array` as a list."""
        return self.gpu_domain_array.tolist()


def unbuilt_cluster(spec: TopologySource) -> UnbuiltCluster | None:
    """The `UnbuiltCluster` of ``spec`` (a cluster of servers, GB200 NVL72 racks or one server), None where its
    parameters do not tell it (a graph, or parameters the builder will refuse)."""
    gpus = topology_gpus(spec)
    try:
        if spec.kind == "cluster":
            node = read_parameters(BUILDERS["cluster"].parameters, dict(spec.params))["node"]
            kind = node.get("kind", "nvswitch_node") if isinstance(node, dict) else None
            if kind not in NODE_TYPES:
                return None
            model = read_parameters(NODE_TYPES[kind][0], {k: v for k, v in node.items() if k != "kind"})["gpu_model"]
        elif spec.kind in ("nvl72", *NODE_TYPES):
            model = read_parameters(BUILDERS[spec.kind].parameters, dict(spec.params))["gpu_model"]
        else:
            return None
    except TopologyError:
        return None
    hosts = host_shape(spec)
    return None if gpus is None else UnbuiltCluster(gpus, model, hosts.domain if hosts is not None else gpus)
