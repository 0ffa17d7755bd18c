"""Topology builders, in one registry by name: NVSwitch and PCIe servers, fat-tree clusters, GB200 NVL72, graphs.

Each builder declares its parameters (unit kind and default), so topology files, a scenario's `cluster:` block and
`--set` overrides are validated the same way. Default latencies follow NCCL's Simple-protocol per-hop figures
(tuning.cc): a GPU-to-GPU NVLink path costs 3.4 us, a cross-node path about 14 us, split over the path's links.
Builders fill a `Wiring` (plain dicts, no networkx); routers are structured (plain lists and integer
arithmetic) so a 16k-GPU cluster builds in a fraction of a second and routes in microseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from simulator.catalog.gpus import gpu_names
from simulator.config.link_classes import LINK_CLASSES
from simulator.errors import TopologyError
from simulator.topology.ecmp import GraphRouter, Hashed, avalanche
from simulator.topology.graph import (
    NODE_KINDS,
    NetworkReduction,
    NvlinkReduction,
    Topology,
    Wiring,
    add_link,
    add_links,
)
from simulator.topology.parameters import Param, read_parameters


@dataclass(frozen=True)
class Builder:
    """A named topology builder: its parameter table and the function that turns parsed parameters into a wiring."""

    build: Callable[[dict, str], Topology]
    parameters: dict[str, Param]
    summary: str
    check: Callable[[dict], None] | None = None
    """Refuses, from parsed parameters alone, every one `build` refuses; None where only building tells."""

    def __call__(self, raw: dict, name: str = "") -> Topology:
        return self.build(read_parameters(self.parameters, raw), name)

    def checked(self, raw: dict) -> bool:
        """Refuse ``raw`` as building it would, without building: True where the builder's `check` told
        everything, False where it has none (nothing but the parameters read checked)."""
        parsed = read_parameters(self.parameters, raw)
        if self.check is None:
            return False
        self.check(parsed)
        return True


# ---------------------------------------------------------------------------------------------- servers (domains)

NVSWITCH_NODE_PARAMETERS = {
    "gpus": Param("count", 8, "GPUs in the server"),
    "nvlink_bandwidth": Param("bandwidth", "450 GB/s", "NVLink bandwidth per GPU, per direction"),
    "nvlink_latency": Param("duration", "3.4 us", "GPU-to-GPU latency (half on each of the two links)"),
    "gpu_model": Param("text", "h100-sxm", "GPU model name in the catalog", choices=gpu_names()),
    "nvls": Param("text", "none", "in-switch reduction: nvswitch3 (NVLink SHARP on NVSwitch 3+: DGX/HGX H100, "
                  "H200, B200) or none", choices=NvlinkReduction),
}
PCIE_NODE_PARAMETERS = {
    "gpus": Param("count", 8, "GPUs in the server"),
    "gpus_per_switch": Param("count", 2, "GPUs behind each PCIe switch"),
    "pcie_bandwidth": Param("bandwidth", "32 GB/s", "bandwidth of every PCIe link, per direction (Gen4 x16)"),
    "pcie_latency": Param("duration", "3.4 us", "GPU-to-GPU latency under one switch (half per link)"),
    "gpu_model": Param("text", "a100-80gb", "GPU model name in the catalog", choices=gpu_names()),
}

@dataclass
class Fabric:
    """Flat routing tables shared by every builder: each GPU's way up to its domain root and into the network.

    ``uplinks[i]`` lists the nodes from GPU i up to the root of its NVLink/PCIe domain; GPUs of one domain meet
    at their lowest common node. Across domains the route is GPU -> NIC -> leaf [-> spine [-> core -> spine]]
    -> leaf -> NIC -> GPU, with the spine/core picked by an integer mix of the two ends' `flow_key`, the
    difference of their rails and the channel. A GPU's flow key is its host and its place among the GPUs sharing
    its NIC, not its rail, and the mix reads only the rails' difference (destination less source, modulo the
    rails): ranks that differ only in their rail (the TP lanes of a rail-optimized fabric) send flows with the
    same differences, so every rail's leaves spread them over the spines alike and the lanes see the same
    contention, as rank folding assumes (docs/architecture.md); and flows from one host's rails into one NIC
    spread over the spines as ECMP's hash of their headers (which differ per NIC) spreads them, where without
    the difference they all took one spine's downlink into that NIC's leaf. A same-rail flow (difference 0) is
    hashed from its keys and channel alone. The mix reads the source's key within its `shift_period` (a leaf
    group, or a pod with tiers: 3) and the destination's offset from it, not the two keys themselves: shifting
    both ends by whole periods (another data-parallel replica, placed on the leaf groups of its own) moves the
    route onto the shifted switches, so replicas are exact images of each other (engine/replicas.py). Among the
    flows that share any one leaf or spine link, (position, offset, rail difference) and (source, destination)
    determine each other, and the key is mixed by an avalanche hash (topology/ecmp.py `avalanche`), so each of
    them lands on a spine as if drawn at random, like ECMP's hash of a flow's header. But every period repeats
    the same draw: a cross-replica collective's flows out of each leaf group collide on the spines as the first
    group's do, where per-flow ECMP draws each group independently and a synchronized collective waits for the
    worst of them. This is optimistic for such collectives on a
    contended spine tier (Llama 3 405B at 8,192 GPUs in an experiment of 2 December: 475 TFLOP/s per GPU, about
    408 with independent draws; docs/architecture.md, rank folding).
    """

    gpus: list[str] = field(default_factory=list)
    gpu_host: list[int] = field(default_factory=list)
    gpu_local: list[int] = field(default_factory=list)
    domain: list[int] = field(default_factory=list)
    uplinks: list[tuple[str, ...]] = field(default_factory=list)
    nic: list[str] = field(default_factory=list)
    flow_key: list[int] = field(default_factory=list)
    flow_keys: int = 1
    rail: list[int] = field(default_factory=list)
    """Each GPU's NIC index on its host (its rail), whose difference between a flow's two ends the hash mixes in."""
    rails: int = 1
    shift_period: int = 1
    """Flow keys in the fabric, and per leaf group (per pod with tiers: 3): the period of the spine hash."""
    shift_gpus: int = 0
    """GPU indices per period: shifting every GPU by a multiple of it maps routes onto routes (0: no fabric)."""
    leaf: list[int] = field(default_factory=list)
    leaf_names: list[str] = field(default_factory=list)
    leaf_pod: list[int] = field(default_factory=list)
    spine_names: list[list[str]] = field(default_factory=list)
    core_names: list[str] = field(default_factory=list)
    host_nic_bandwidth: float = 0.0
    """Bandwidth of each host's NICs into the network together, per direction (0: no network)."""
    _middles: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict, repr=False)
    _as_arrays: _FabricArrays | None = field(default=None, repr=False)

    def __call__(self, topo: Topology, src: int, dst: int, channel: int) -> list[str]:
        return self.route(topo, src, dst, channel)

    def route_links(self, topo: Topology, src: int, dst: int, channel: int) -> tuple[int, ...]:
        """`route` as directed link ids, put together from pieces kept per GPU: inside a domain the source's
        way up to where it meets the destination's and the destination's way down; across domains the
        source GPU's way up to its leaf, the switch hops between the two leaves (kept per hop choice), the
        way down to the destination GPU."""
        if self.domain[src] == self.domain[dst]:
            up, down = self.uplinks[src], self.uplinks[dst]
            if up[0] == down[0]:
                return self._climb(topo, src)[:1] + self._descent(topo, dst)[-1:]
            meet = next(i for i, node in enumerate(up) if node in down)
            return self._climb(topo, src)[:meet + 1] + self._descent(topo, dst)[-1 - down.index(up[meet]):]
        return self._end(topo, src, 0) + self._middle(topo, self._hops(src, dst, channel)) + self._end(topo, dst, 1)

    def route_arrays(self, topo: Topology, src: np.ndarray, dst: np.ndarray,
                     channel: np.ndarray) -> np.ndarray:
        """`route_links` of many pairs (``src`` != ``dst``) at once, as a matrix of link ids, one route per
        row from its first column on, -1 after its end: the leaf ends, spines and cores picked as
        `route_links` picks them, in numpy (a ring over 16k GPUs asks for 131k routes at once); routes inside
        a domain with more than one switch level (PCIe trees) one by one."""
        arrays = self._arrays()
        inside = arrays.domain[src] == arrays.domain[dst]
        flat = inside & arrays.flat_domain[src]
        routes = np.full((src.size, arrays.widest), -1, dtype=np.int64)
        if flat.any():
            routes[flat, 0] = self._known(topo, arrays.climb, src[flat], self._to_root)[:, 0]
            routes[flat, 1] = self._known(topo, arrays.descent, dst[flat], self._from_root)[:, 0]
        for row in np.flatnonzero(inside & ~flat).tolist():
            links = self.route_links(topo, int(src[row]), int(dst[row]), int(channel[row]))
            routes[row, :len(links)] = links
        across = np.flatnonzero(~inside)
        if across.size:
            self._fill_across(topo, routes, across, src[across], dst[across], channel[across])
        return routes

    def _fill_across(self, topo: Topology, routes: np.ndarray, rows: np.ndarray, src: np.ndarray, dst: np.ndarray,
                     channel: np.ndarray) -> None:
        """Routes between domains into ``routes[rows]``: the source's two links up to its leaf, the switch hops
        (each distinct choice of hops routed once, as `route_links` does), the destination's two down."""
        arrays = self._arrays()
        low, high = arrays.leaf[src], arrays.leaf[dst]
        hops = np.zeros((rows.size, 4), dtype=np.int64)
        hops[:, 0], hops[:, 1] = low, high
        apart = np.flatnonzero(low != high)
        if apart.size:
            pods = arrays.leaf_pod[low[apart]], arrays.leaf_pod[high[apart]]
            hops[apart, 2], hops[apart, 3] = self._spine_and_core(
                arrays.flow_key[src[apart]], arrays.flow_key[dst[apart]],
                arrays.rail[dst[apart]] - arrays.rail[src[apart]], channel[apart],
                arrays.pod_spines[pods[0]], pods[0] != pods[1])
        radix = [len(self.leaf_names), max(1, *map(len, self.spine_names)), max(len(self.core_names), 1)]
        codes = ((hops[:, 0] * radix[0] + hops[:, 1]) * radix[1] + hops[:, 2]) * radix[2] + hops[:, 3]
        _, first, choice = np.unique(codes, return_index=True, return_inverse=True)
        middles = [self._middle(topo, tuple(row)) for row in hops[first].tolist()]
        middle_length = np.fromiter(map(len, middles), dtype=np.int64, count=len(middles))
        table = np.full((len(middles), max(middle_length.max(initial=0), 1)), -1, dtype=np.int64)
        for index, middle in enumerate(middles):
            table[index, :len(middle)] = middle
        choice = choice.reshape(-1)
        up = self._known(topo, arrays.leaf_up, src, self._to_leaf)
        down = self._known(topo, arrays.leaf_down, dst, self._from_leaf)
        routes[rows, 0], routes[rows, 1] = up[:, 0], up[:, 1]
        length = middle_length[choice]
        for column in range(table.shape[1]):
            has = np.flatnonzero(length > column)
            routes[rows[has], 2 + column] = table[choice[has], column]
        routes[rows, 2 + length], routes[rows, 3 + length] = down[:, 0], down[:, 1]

    def _middle(self, topo: Topology, hops: tuple[int, ...]) -> tuple[int, ...]:
        """Link ids of the switch hops ``hops`` (as `_hops` gives them; same leaf: none), kept once worked out:
        the one table `route_links` and `route_arrays` both read, so their routes agree."""
        hops = hops[:2] if hops[0] == hops[1] else hops
        middle = self._middles.get(hops)
        if middle is None:
            middle = self._middles[hops] = topo.link_ids(self._switch_hops(*hops))
        return middle

    def _arrays(self) -> _FabricArrays:
        """The routing tables as arrays (made on first use, once the builder has filled them)."""
        if self._as_arrays is None:
            self._as_arrays = _FabricArrays(self)
        return self._as_arrays

    @staticmethod
    def _known(topo: Topology, table: np.ndarray, gpus: np.ndarray,
               way: Callable[[list[int]], list[list[str]]]) -> np.ndarray:
        """Rows ``gpus`` of ``table``, a per-GPU table of link ids (-1: not yet known) whose row for GPU g holds
        the links along the nodes ``way(...)`` lists for it (a column of names per node on the way; GPUs with ways
        of one length), left-aligned (a row wider than its way is -1 after it), the missing rows looked up
        first."""
        rows = table[gpus]
        missing = np.unique(gpus[rows[:, 0] < 0]).tolist()
        if missing:
            nodes = way(missing)
            table[missing, :len(nodes) - 1] = np.column_stack([topo.links_between(list(zip(tails, heads)))
                                                               for tails, heads in zip(nodes, nodes[1:])])
            rows = table[gpus]
        return rows

    def _to_root(self, gpus: list[int]) -> list[list[str]]:
        """The GPUs' names and their domains' switches' up to the root (GPUs with as many switch levels)."""
        return [[self.gpus[g] for g in gpus], *map(list, zip(*(self.uplinks[g] for g in gpus)))]

    def _from_root(self, gpus: list[int]) -> list[list[str]]:
        """`_to_root` the other way."""
        return self._to_root(gpus)[::-1]

    def _to_leaf(self, gpus: list[int]) -> list[list[str]]:
        """The GPUs', their NICs' and their leaves' names."""
        return [[self.gpus[g] for g in gpus], [self.nic[g] for g in gpus],
                [self.leaf_names[self.leaf[g]] for g in gpus]]

    def _from_leaf(self, gpus: list[int]) -> list[list[str]]:
        """`_to_leaf` the other way."""
        return self._to_leaf(gpus)[::-1]

    def _hops(self, src: int, dst: int, channel: int) -> tuple[int, ...]:
        """(leaf of src, leaf of dst, spine index, core index) between two domains: the spine (and core) hashed
        from the source's flow key within its period, the destination's offset, the rails' difference and the
        channel, as ECMP hashes a flow, but with the same draw in every period (optimistic for cross-replica
        collectives, see `Fabric`); just the two leaves when they are the same."""
        low, high = self.leaf[src], self.leaf[dst]
        if low == high:
            return (low, high)
        pods = self.leaf_pod[low], self.leaf_pod[high]
        return (low, high, *self._spine_and_core(self.flow_key[src], self.flow_key[dst],
                                                 self.rail[dst] - self.rail[src], channel,
                                                 len(self.spine_names[pods[0]]), pods[0] != pods[1]))

    def _spine_and_core(self, key: Hashed, other: Hashed, turn: Hashed, channel: Hashed, spines: Hashed,
                        across: Hashed) -> tuple[Hashed, Hashed]:
        """The spine and core indices of flows from flow key ``key`` to flow key ``other`` on ``channel`` between
        two leaves, ``turn`` the destination's rail less the source's, ``spines`` the spine count of the
        source's pod and ``across`` whether the leaves lie in different pods (core 0 when not): one flow as ints
        (`_hops`), or many as int64 arrays (`_fill_across`), where the products wrap modulo 2^64 and keep the
        low 32 bits `avalanche` reads. The turn (modulo the rails) is the most significant digit of the mixed
        index, so a same-rail flow (turn 0) hashes as it did before the turn was mixed in."""
        offset = (other - key) % self.flow_keys
        place = (turn % self.rails) * self.shift_period + key % self.shift_period
        mix = avalanche((place * self.flow_keys + offset) * 0x9E3779B1 + channel)
        return mix % spines, (mix // spines) % max(len(self.core_names), 1) * across

    def _switch_hops(self, low: int, high: int, spine: int = 0, core: int = 0) -> list[str]:
        """Switch names from leaf ``low`` to leaf ``high`` through the spine (and core) of those indices."""
        if low == high:
            return [self.leaf_names[low]]
        pod_a, pod_b = self.leaf_pod[low], self.leaf_pod[high]
        middle = [self.spine_names[pod_a][spine]]
        if pod_a != pod_b:
            middle += [self.core_names[core], self.spine_names[pod_b][spine]]
        return [self.leaf_names[low], *middle, self.leaf_names[high]]

    def _end(self, topo: Topology, gpu: int, down: int) -> tuple[int, ...]:
        """Link ids from GPU ``gpu`` up to its leaf, or with ``down`` from its leaf down to it. The first GPU
        routed across domains fills that way's table for every GPU in one batch of lookups (`_known`): routing
        pair by pair meets most GPUs of a large run, and one lookup per GPU cost 16k-GPU jobs 0.15 s CPU."""
        arrays = self._arrays()
        table, way = (arrays.leaf_down, self._from_leaf) if down else (arrays.leaf_up, self._to_leaf)
        if table.item(gpu, 0) < 0:
            self._known(topo, table, np.arange(len(table)), way)
        return tuple(table[gpu].tolist())

    def _climb(self, topo: Topology, gpu: int) -> tuple[int, ...]:
        """Link ids from GPU ``gpu`` up through its domain's switches to the domain's root."""
        return self._row(topo, self._arrays().climb, gpu, len(self.uplinks[gpu]), self._to_root)

    def _descent(self, topo: Topology, gpu: int) -> tuple[int, ...]:
        """Link ids from the root of GPU ``gpu``'s domain down to it."""
        return self._row(topo, self._arrays().descent, gpu, len(self.uplinks[gpu]), self._from_root)

    def _row(self, topo: Topology, table: np.ndarray, gpu: int, length: int,
             way: Callable[[list[int]], list[list[str]]]) -> tuple[int, ...]:
        """The ``length`` link ids of GPU ``gpu``'s row of ``table`` (a `_known` table), looked up first when
        not yet known: the one copy that routes one at a time and many at once both read."""
        if table.item(gpu, 0) < 0:
            links = topo.link_ids([names[0] for names in way([gpu])])
            table[gpu, :length] = links
            return links
        return tuple(table[gpu].tolist()[:length])

    def route(self, topo: Topology, src: int, dst: int, channel: int) -> list[str]:
        """Node names from GPU ``src`` to GPU ``dst``; ``channel`` spreads flows over spines."""
        if self.domain[src] == self.domain[dst]:
            up, down = self.uplinks[src], self.uplinks[dst]
            meet = next(i for i, node in enumerate(up) if node in down)
            return [self.gpus[src], *up[:meet + 1], *reversed(down[:down.index(up[meet])]), self.gpus[dst]]
        return [self.gpus[src], self.nic[src], *self._switch_hops(*self._hops(src, dst, channel)), self.nic[dst],
                self.gpus[dst]]


class _FabricArrays:
    """A `Fabric`'s routing tables as numpy arrays, for routing many pairs at once (`Fabric.route_arrays`),
    with the per-GPU tables of link ids (up to the leaf and down from it, up the domain's switches and down
    them) that routing one pair at a time reads too, filled as GPUs are first routed (-1 until then; the two
    leaf tables for every GPU at once, `Fabric._end`)."""

    def __init__(self, fabric: Fabric):
        gpus = len(fabric.gpus)
        self.domain = np.array(fabric.domain, dtype=np.int64)
        self.flat_domain = np.array([len(up) == 1 for up in fabric.uplinks], dtype=bool)
        self.leaf = np.array(fabric.leaf or [0] * gpus, dtype=np.int64)
        self.flow_key = np.array(fabric.flow_key or [0] * gpus, dtype=np.int64)
        self.rail = np.array(fabric.rail or [0] * gpus, dtype=np.int64)
        self.leaf_pod = np.array(fabric.leaf_pod or [0], dtype=np.int64)
        self.pod_spines = np.array([len(spines) for spines in fabric.spine_names] or [0], dtype=np.int64)
        levels = max((len(up) for up in fabric.uplinks), default=1)
        self.widest = max(8, 2 * levels)
        """Columns a route needs: two links to the leaf at each end and up to four switch hops between, or up
        and down a domain's switch levels."""
        self.climb = np.full((gpus, levels), -1, dtype=np.int64)
        self.descent = np.full((gpus, levels), -1, dtype=np.int64)
        self.leaf_up = np.full((gpus, 2), -1, dtype=np.int64)
        self.leaf_down = np.full((gpus, 2), -1, dtype=np.int64)


def _add_nvswitch_domain(wiring: Wiring, fabric: Fabric, prefix: str, host: int, domain: int, p: dict,
                         gpus_per_host: int = 0) -> None:
    """GPUs on one non-blocking NVSwitch node; a lone GPU needs no switch.

    The domain is one host, or with ``gpus_per_host`` several hosts (NVL72 trays) numbered from ``host``.
    """
    switch = f"{prefix}nvswitch"
    base = len(fabric.gpus)
    per_host = gpus_per_host or p["gpus"]
    for index in range(p["gpus"]):
        gpu = f"{prefix}gpu{index}"
        wiring.add_node(gpu, kind="gpu", host=host + index // per_host, nvlink_domain=domain)
        fabric.gpus.append(gpu)
        fabric.gpu_host.append(host + index // per_host)
        fabric.gpu_local.append(index % per_host)
        fabric.domain.append(domain)
        fabric.uplinks.append((switch,))
    if p["gpus"] > 1:
        wiring.add_node(switch, kind="nvswitch", nvlink_domain=domain, **({} if gpus_per_host else {"host": host}))
        add_links(wiring, ((gpu, switch) for gpu in fabric.gpus[base:]), bandwidth=p["nvlink_bandwidth"],
                  latency=p["nvlink_latency"] / 2, link_class="nvlink")


def _add_pcie_domain(wiring: Wiring, fabric: Fabric, prefix: str, host: int, domain: int, p: dict) -> None:
    """GPUs behind PCIe switches, which a host bridge joins; every link has the same bandwidth."""
    bridge = f"{prefix}host_bridge"
    wiring.add_node(bridge, kind="host_bridge", host=host)
    half = p["pcie_latency"] / 2
    for local in range(p["gpus"]):
        switch = f"{prefix}pcie_switch{local // p['gpus_per_switch']}"
        if switch not in wiring:
            wiring.add_node(switch, kind="pcie_switch", host=host)
            add_link(wiring, switch, bridge, bandwidth=p["pcie_bandwidth"], latency=half, link_class="pcie")
        gpu = f"{prefix}gpu{local}"
        wiring.add_node(gpu, kind="gpu", host=host)
        add_link(wiring, gpu, switch, bandwidth=p["pcie_bandwidth"], latency=half, link_class="pcie")
        fabric.gpus.append(gpu)
        fabric.gpu_host.append(host)
        fabric.gpu_local.append(local)
        fabric.domain.append(domain)
        fabric.uplinks.append((switch, bridge))


NODE_TYPES = {
    "nvswitch_node": (NVSWITCH_NODE_PARAMETERS, _add_nvswitch_domain),
    "pcie_node": (PCIE_NODE_PARAMETERS, _add_pcie_domain),
}


def _topology(name: str, wiring: Wiring, fabric: Fabric, rails: int, gpu_model: str, params: dict,
              nvls: NvlinkReduction = NvlinkReduction.NONE) -> Topology:
    """The compiled topology; ``nvls`` is the NVLink domains' in-switch reduction, ``params["sharp"]`` (a fabric's
    parameter, absent without one) the network switches'."""
    sharp = params.get("sharp", NetworkReduction.NONE)
    return Topology(name=name, wiring=wiring, gpus=fabric.gpus, gpu_host=fabric.gpu_host, gpu_local=fabric.gpu_local,
                    rails=rails, gpu_model=gpu_model, router=fabric, params=params,
                    nvls=nvls is not NvlinkReduction.NONE, sharp=sharp is not NetworkReduction.NONE,
                    host_nic_bandwidth=fabric.host_nic_bandwidth)


def _single_node(node_kind: str) -> Callable[[dict, str], Topology]:
    def build(p: dict, name: str) -> Topology:
        wiring, fabric = Wiring(), Fabric()
        NODE_TYPES[node_kind][1](wiring, fabric, "h0/", 0, 0, p)
        return _topology(name or node_kind, wiring, fabric, 1, p["gpu_model"], {"kind": node_kind, **p},
                         p.get("nvls", NvlinkReduction.NONE))
    return build


# ---------------------------------------------------------------------------------------------- fat-tree network

FABRIC_PARAMETERS = {
    "nic_bandwidth": Param("bandwidth", "400 Gb/s", "bandwidth of each NIC port, per direction"),
    "nic_latency": Param("duration", "6.5 us", "GPU-to-leaf latency, half on GPU-NIC, half on NIC-leaf"),
    "nic_pcie_bandwidth": Param("bandwidth", "64 GB/s", "GPU-to-NIC PCIe link, per direction (Gen5 x16)"),
    "switch_latency": Param("duration", "0.5 us", "latency of each switch-to-switch link"),
    "link_class": Param("text", "infiniband", "network link class", choices=("infiniband", "ethernet")),
    "leaf_ports": Param("count", 32, "downlinks (NIC ports) per leaf switch"),
    "spines": Param("count", 8, "spine switches (per pod with tiers: 3)"),
    "oversubscription": Param("ratio", 1, "leaf downlink : uplink bandwidth, e.g. 2 or '2:1'"),
    "tiers": Param("count", 2, "switch tiers: 2 = leaf/spine, 3 = leaf/spine/core in pods", choices=(2, 3)),
    "pods": Param("count", 1, "pods (with tiers: 3); leaf groups are split evenly over them"),
    "cores": Param("count", None, "core switches (tiers: 3); default = spines", optional=True),
    "core_oversubscription": Param("ratio", 1, "a pod's leaf-spine : spine-core bandwidth (tiers: 3), e.g. 7 or "
                                   "'7:1'"),
    "sharp": Param("text", "none", "in-network reduction in the InfiniBand switches: sharpv3 (Quantum-2 NDR "
                   "SHARPv3 streaming aggregation) or none", choices=NetworkReduction),
    "fabric_hosts": Param("count", None, "hosts the fat tree is wired for: its leaves, pods, spines, cores and "
                          "their links are those of this many hosts, only the first ones attached (an elastic job's "
                          "shrunk three-tier cluster keeps its full fabric); default = the hosts", optional=True),
}


def wired_hosts(hosts: int, p: dict) -> int:
    """The hosts the fat tree of ``hosts`` attached hosts is wired for (`fabric_hosts`, else ``hosts``)."""
    return p["fabric_hosts"] or hosts


def leaf_groups(hosts: int, p: dict) -> int:
    """The leaf groups (of `leaf_ports` hosts) of the fat tree of ``hosts`` attached hosts: of the hosts it is
    wired for (`wired_hosts`)."""
    return -(-wired_hosts(hosts, p) // p["leaf_ports"])


def shift_period_hosts(hosts: int, p: dict) -> int:
    """Hosts per period of the spine hash (`Fabric.shift_period`): a leaf group, or with tiers: 3 a pod's leaf
    groups (of the hosts it is wired for, `wired_hosts`); read by `_add_network` and, before the cluster is built,
    by topology/size.py."""
    groups = leaf_groups(hosts, p)
    return p["leaf_ports"] * (-(-groups // p["pods"]) if p["tiers"] == 3 else 1)


def _pod_counts_filled(groups: int) -> list[int]:
    """The pod counts (2 or more) that split ``groups`` leaf groups with none left empty: pods take
    ceil(groups / pods) groups each in turn, so 3 pods over 4 groups would fill two and leave the third bare."""
    return [pods for pods in range(2, groups + 1) if -(-groups // -(-groups // pods)) == pods]


def _check_network(attached: int, p: dict) -> None:
    """Refuse fabric parameters ``p`` that cannot wire ``attached`` hosts: a fabric wired for fewer
    (`fabric_hosts`), pods, cores or core oversubscription without a third tier, a third tier over one leaf group or
    over pods some of which its leaf groups leave empty (of the hosts it is wired for), SHARP off InfiniBand."""
    hosts = wired_hosts(attached, p)
    if hosts < attached:
        raise TopologyError(f"a fabric wired for {hosts} hosts cannot attach {attached}", field="fabric_hosts",
                            allowed=f"at least {attached} (the hosts), or leave it out")
    groups = leaf_groups(attached, p)
    pods = p["pods"]
    if p["tiers"] == 2 and (pods > 1 or p["cores"]):
        raise TopologyError("pods and cores need tiers: 3", field="pods" if pods > 1 else "cores",
                            allowed="tiers: 3, or leave pods and cores out")
    if p["tiers"] == 2 and p["core_oversubscription"] != 1:
        raise TopologyError("core_oversubscription sizes the spine-core links of tiers: 3",
                            field="core_oversubscription", allowed="1 (or leave it out) with tiers: 2, or tiers: 3")
    if p["tiers"] == 3 and groups < 2:
        raise TopologyError(f"3 splits leaf groups into pods, but {hosts} hosts make one leaf group "
                            f"(up to {p['leaf_ports']} hosts)", field="tiers",
                            allowed=f"tiers: 2, or more than {p['leaf_ports']} hosts "
                                    f"({'fabric_hosts' if p['fabric_hosts'] else 'nodes'}), or fewer leaf_ports")
    if p["tiers"] == 3 and pods not in (filled := _pod_counts_filled(groups)):
        empty = ", which leaves a pod without leaf groups" if 2 <= pods <= groups else ""
        raise TopologyError(f"tiers: 3 with {pods} pods over {groups} leaf groups{empty}", field="pods",
                            allowed=f"{', '.join(map(str, filled))} (one leaf group = {p['leaf_ports']} hosts)")
    if p["sharp"] is not NetworkReduction.NONE and p["link_class"] != "infiniband":
        raise TopologyError(f"{p['sharp']} runs in InfiniBand switches, not on link_class {p['link_class']}",
                            field="sharp", allowed="none, or link_class: infiniband")


def _add_network(wiring: Wiring, fabric: Fabric, host_gpus: list[list[int]], nics: int, p: dict) -> dict:
    """NICs on each host, per-rail leaves over groups of ``leaf_ports`` hosts, aggregated spine (and core) links:
    the leaves, pods, spines and cores of `fabric_hosts` hosts (`wired_hosts`), the first hosts attached."""
    _check_network(len(host_gpus), p)
    per_gpu_latency = p["nic_latency"] / 2
    link_class, bandwidth = p["link_class"], p["nic_bandwidth"]
    groups = leaf_groups(len(host_gpus), p)
    pods = p["pods"]
    fabric.host_nic_bandwidth = nics * bandwidth
    fabric.nic = [""] * len(fabric.gpus)
    fabric.flow_key = [0] * len(fabric.gpus)
    fabric.rail = [0] * len(fabric.gpus)
    fabric.rails = nics
    fabric.leaf = [0] * len(fabric.gpus)
    fabric.leaf_names = [f"leaf{q}.r{r}" for q in range(groups) for r in range(nics)]
    groups_per_pod = -(-groups // pods)
    fabric.leaf_pod = [(index // nics) // groups_per_pod for index in range(len(fabric.leaf_names))]
    for index, leaf in enumerate(fabric.leaf_names):
        wiring.add_node(leaf, kind="switch", tier=1, rail=index % nics, pod=fabric.leaf_pod[index])
    sharing_nic = -(-len(host_gpus[0]) // nics)
    for host, members in enumerate(host_gpus):
        host_nics = [f"h{host}/nic{rail}" for rail in range(nics)]
        first_leaf = (host // p["leaf_ports"]) * nics
        for rail, nic in enumerate(host_nics):
            wiring.add_node(nic, kind="nic", host=host, rail=rail)
        add_links(wiring, zip(host_nics, fabric.leaf_names[first_leaf:first_leaf + nics]), bandwidth=bandwidth,
                  latency=per_gpu_latency, link_class=link_class)
        slots = [0] * nics
        for local, gpu in enumerate(members):
            rail = local * nics // len(members)
            fabric.nic[gpu] = host_nics[rail]
            fabric.flow_key[gpu] = host * sharing_nic + slots[rail]
            fabric.rail[gpu] = rail
            slots[rail] += 1
            fabric.leaf[gpu] = first_leaf + rail
        add_links(wiring, ((fabric.gpus[gpu], fabric.nic[gpu]) for gpu in members),
                  bandwidth=p["nic_pcie_bandwidth"], latency=per_gpu_latency, link_class="pcie")
    fabric.flow_keys = wired_hosts(len(host_gpus), p) * sharing_nic
    period_hosts = shift_period_hosts(len(host_gpus), p)
    fabric.shift_period = period_hosts * sharing_nic
    fabric.shift_gpus = period_hosts * len(host_gpus[0])
    uplink = p["leaf_ports"] * bandwidth / p["oversubscription"] / p["spines"]
    derived = {"leaves": len(fabric.leaf_names), "leaf_spine_bandwidth": uplink if groups * nics > 1 else None}
    if groups * nics == 1:
        fabric.spine_names = [[]]
        return derived
    fabric.spine_names = [[f"spine{s}" if pods == 1 else f"spine{pod}.{s}" for s in range(p["spines"])]
                          for pod in range(pods)]
    for pod, spines in enumerate(fabric.spine_names):
        for spine in spines:
            wiring.add_node(spine, kind="switch", tier=2, pod=pod)
        add_links(wiring, ((leaf, spine) for index, leaf in enumerate(fabric.leaf_names)
                           if fabric.leaf_pod[index] == pod for spine in spines),
                  bandwidth=uplink, latency=p["switch_latency"], link_class=link_class)
    derived["spines"] = p["spines"] * pods
    if pods > 1:
        cores = p["cores"] or p["spines"]
        fabric.core_names = [f"core{c}" for c in range(cores)]
        for core in fabric.core_names:
            wiring.add_node(core, kind="switch", tier=3)
        for pod, spines in enumerate(fabric.spine_names):
            core_bandwidth = fabric.leaf_pod.count(pod) * uplink / cores / p["core_oversubscription"]
            add_links(wiring, ((spine, core) for spine in spines for core in fabric.core_names),
                      bandwidth=core_bandwidth, latency=p["switch_latency"], link_class=link_class)
        derived["cores"] = cores
    return derived


CLUSTER_PARAMETERS = {
    "nodes": Param("count", 2, "servers (hosts)"),
    "node": Param("mapping", {"kind": "nvswitch_node"}, "server: kind (nvswitch_node, pcie_node) + params"),
    "nics_per_node": Param("count", None, "NICs per server; default = GPUs per server (rail-optimized)", optional=True),
    **FABRIC_PARAMETERS,
}


def _read_node(raw: object) -> tuple[str, dict]:
    if not isinstance(raw, dict):
        raw = {"kind": None}
    node_kind = raw.get("kind", "nvswitch_node")
    if not isinstance(node_kind, str) or node_kind not in NODE_TYPES:
        raise TopologyError(f"unknown node kind {node_kind!r}", field="node.kind", allowed=", ".join(NODE_TYPES))
    spec = NODE_TYPES[node_kind][0]
    return node_kind, read_parameters(spec, {k: v for k, v in raw.items() if k != "kind"}, prefix="node.")


def _cluster_node(p: dict) -> tuple[str, dict, int]:
    """A cluster's node kind, node parameters and NICs per node, refusing more NICs than GPUs."""
    node_kind, node = _read_node(p["node"])
    nics = p["nics_per_node"] or node["gpus"]
    if nics > node["gpus"]:
        raise TopologyError(f"{nics} NICs per node but {node['gpus']} GPUs", field="nics_per_node",
                            allowed=f"1 to {node['gpus']}")
    return node_kind, node, nics


def _check_cluster(p: dict) -> None:
    """Refuse what `_build_cluster` refuses: its node, its NICs, its fabric over its hosts."""
    _cluster_node(p)
    _check_network(p["nodes"], p)


def _build_cluster(p: dict, name: str) -> Topology:
    node_kind, node, nics = _cluster_node(p)
    wiring, fabric = Wiring(), Fabric()
    for host in range(p["nodes"]):
        NODE_TYPES[node_kind][1](wiring, fabric, f"h{host}/", host, host, node)
    host_gpus = [list(range(h * node["gpus"], (h + 1) * node["gpus"])) for h in range(p["nodes"])]
    derived = _add_network(wiring, fabric, host_gpus, nics, p)
    params = {"kind": "cluster", **p, "node": {"kind": node_kind, **node}, "nics_per_node": nics, **derived}
    return _topology(name or "cluster", wiring, fabric, nics, node["gpu_model"], params,
                     node.get("nvls", NvlinkReduction.NONE))


# ---------------------------------------------------------------------------------------------- GB200 NVL72

NVL72_PARAMETERS = {
    "racks": Param("count", 1, "NVL72 racks; more than one are joined by the fat-tree network"),
    "trays": Param("count", 18, "compute trays (hosts) per rack"),
    "gpus_per_tray": Param("count", 4, "GPUs per compute tray"),
    "nvlink_bandwidth": Param("bandwidth", "900 GB/s", "NVLink bandwidth per GPU, per direction (1.8 TB/s total)"),
    "nvlink_latency": Param("duration", "3.4 us", "GPU-to-GPU latency in the rack (half on each link)"),
    "gpu_model": Param("text", "gb200", "GPU model name in the catalog", choices=gpu_names()),
    "nvls": Param("text", "nvswitch3", "in-switch reduction in the rack's NVSwitches (NVLink SHARP) or none",
                  choices=NvlinkReduction),
    "nvswitch_trays": Param("count", 9, "NVSwitch trays per rack; each GPU's NVLinks are spread evenly over them "
                            "(18 per B200, 2 to each of 9 trays), so a tray down takes 1/9 of its bandwidth"),
    "nics_per_tray": Param("count", 4, "NICs per compute tray (used when racks > 1)"),
    "last_rack_trays": Param("count", None, "compute trays in the last rack, for a rack partly in use (an elastic "
                             "job shrunk by trays); default = trays", optional=True),
    **FABRIC_PARAMETERS,
}


def rack_trays(p: dict) -> list[int]:
    """The compute trays of each rack of parsed NVL72 parameters ``p``: `trays`, the last rack's
    `last_rack_trays` where given (at most `trays`, so that tray t of rack r is host r x trays + t in any case)."""
    last = p["last_rack_trays"]
    if last is not None and last > p["trays"]:
        raise TopologyError(f"{last} trays in the last rack, more than a rack's {p['trays']}",
                            field="last_rack_trays", allowed=f"1 to {p['trays']} (trays)")
    return [p["trays"]] * (p["racks"] - 1) + [p["trays"] if last is None else last]


def _check_tray_nics(p: dict) -> None:
    """Refuse more NICs per tray than GPUs (NICs count only with several racks, on the network)."""
    if p["nics_per_tray"] > p["gpus_per_tray"]:
        raise TopologyError(f"{p['nics_per_tray']} NICs per tray but {p['gpus_per_tray']} GPUs",
                            field="nics_per_tray", allowed=f"1 to {p['gpus_per_tray']}")


def _check_nvl72(p: dict) -> None:
    """Refuse what `_build_nvl72` refuses: its last rack's trays and, with several racks, its NICs and its fabric
    over its trays."""
    per_rack = rack_trays(p)
    if p["racks"] > 1:
        _check_tray_nics(p)
        _check_network(sum(per_rack), p)


def _build_nvl72(p: dict, name: str) -> Topology:
    wiring, fabric = Wiring(), Fabric()
    links = {k: p[k] for k in ("nvlink_bandwidth", "nvlink_latency")}
    per_rack = rack_trays(p)
    for rack, trays in enumerate(per_rack):
        domain = {"gpus": trays * p["gpus_per_tray"], **links}
        _add_nvswitch_domain(wiring, fabric, f"rack{rack}/", rack * p["trays"], rack, domain, p["gpus_per_tray"])
    rails, derived = 1, {}
    if p["racks"] > 1:
        _check_tray_nics(p)
        trays = sum(per_rack)
        host_gpus = [list(range(t * p["gpus_per_tray"], (t + 1) * p["gpus_per_tray"])) for t in range(trays)]
        derived = _add_network(wiring, fabric, host_gpus, p["nics_per_tray"], p)
        rails = p["nics_per_tray"]
    return _topology(name or "nvl72", wiring, fabric, rails, p["gpu_model"], {"kind": "nvl72", **p, **derived},
                     p["nvls"])


# ---------------------------------------------------------------------------------------------- explicit graph

GRAPH_PARAMETERS = {
    "nodes": Param("list", None, "[{name, kind, host?}]"),
    "links": Param("list", None, "[{a, b, bandwidth, latency, class}]"),
    "rails": Param("count", 1, "NICs per host that collectives may use as parallel channels"),
    "gpu_model": Param("text", "h100-sxm", "GPU model name in the catalog", choices=gpu_names()),
}
_GRAPH_NODE = {"name": Param("text"), "kind": Param("text", choices=NODE_KINDS), "host": Param("index", optional=True)}
_GRAPH_LINK = {"a": Param("text"), "b": Param("text"), "bandwidth": Param("bandwidth"), "latency": Param("duration"),
               "class": Param("text", choices=LINK_CLASSES)}


def read_graph_nodes(raw_nodes: list) -> list[dict]:
    """A graph's nodes checked (parameters, unique names), in order: what the builder builds, so that the
    GPU count read before building (topology/size.py) is the built cluster's."""
    nodes: list[dict] = []
    names: set[str] = set()
    for index, raw in enumerate(raw_nodes):
        node = read_parameters(_GRAPH_NODE, raw, prefix=f"nodes[{index}].")
        if node["name"] in names:
            raise TopologyError(f"duplicate node {node['name']!r}", field=f"nodes[{index}].name")
        names.add(node["name"])
        nodes.append(node)
    return nodes


def _add_graph_nodes(wiring: Wiring, raw_nodes: list) -> tuple[list[str], list[int]]:
    """Add the listed nodes; return GPU names in order and their hosts, renumbered 0.. by first GPU appearance."""
    nodes = read_graph_nodes(raw_nodes)
    for node in nodes:
        wiring.add_node(node["name"], kind=node["kind"])
    hosts: dict[tuple, int] = {}
    gpus = [node for node in nodes if node["kind"] == "gpu"]
    for node in gpus + [node for node in nodes if node["kind"] != "gpu" and node["host"] is not None]:
        key = ("own", node["name"]) if node["host"] is None else ("host", node["host"])
        wiring.nodes[node["name"]]["host"] = hosts.setdefault(key, len(hosts))
    return [node["name"] for node in gpus], [wiring.nodes[node["name"]]["host"] for node in gpus]


HOST_SIDE = ("pcie_switch", "host_bridge")
"""Node kinds between a GPU and its NIC inside a host."""


def graph_nics_without_a_gpu(p: dict) -> list[TopologyError]:
    """Each NIC of a graph (parameters as read) that reaches no GPU, directly or through PCIe switches or host
    bridges, as a problem at its node: no GPU sends through it, and the GPU it was meant for (its PCIe link left
    out of the file, say) sends through a peer's NIC instead. A GPU needs no NIC of its own (it may link straight to a
    switch, or reach other hosts through its NVLink peers), so this warns and refuses nothing."""
    nodes = read_graph_nodes(p["nodes"])
    kind = {node["name"]: node["kind"] for node in nodes}
    neighbours: dict[str, set[str]] = {}
    for link in p["links"]:
        neighbours.setdefault(link["a"], set()).add(link["b"])
        neighbours.setdefault(link["b"], set()).add(link["a"])
    problems = []
    for index, node in enumerate(nodes):
        if node["kind"] != "nic":
            continue
        seen, pending, reaches_gpu = {node["name"]}, [node["name"]], False
        while pending and not reaches_gpu:
            for near in neighbours.get(pending.pop(), ()):
                reaches_gpu = reaches_gpu or kind[near] == "gpu"
                if near not in seen and kind[near] in HOST_SIDE:
                    seen.add(near)
                    pending.append(near)
        if not reaches_gpu:
            problems.append(TopologyError(
                f"NIC {node['name']!r} has no link to a GPU, directly or through PCIe switches or host bridges, so "
                "no GPU sends through it", field=f"nodes[{index}]",
                allowed="a link from the NIC to its GPU or PCIe switch"))
    return problems


def _build_graph(p: dict, name: str) -> Topology:
    wiring = Wiring()
    gpus, gpu_hosts = _add_graph_nodes(wiring, p["nodes"])
    for index, raw in enumerate(p["links"]):
        link = read_parameters(_GRAPH_LINK, raw, prefix=f"links[{index}].")
        for end in ("a", "b"):
            if link[end] not in wiring:
                raise TopologyError(f"unknown node {link[end]!r}", field=f"links[{index}].{end}",
                                    allowed="a name from nodes")
        if link["a"] == link["b"]:
            raise TopologyError(f"link from {link['a']!r} to itself", field=f"links[{index}].b",
                                allowed="two different nodes")
        if wiring.has_edge(link["a"], link["b"]):
            raise TopologyError(f"duplicate link {link['a']} <-> {link['b']}", field=f"links[{index}]")
        add_link(wiring, link["a"], link["b"], bandwidth=link["bandwidth"], latency=link["latency"],
                 link_class=link["class"])
    if not gpus:
        raise TopologyError("the graph has no GPU", field="nodes", allowed="at least one node with kind: gpu")
    router = GraphRouter(wiring)
    host_of = dict(zip(gpus, gpu_hosts))
    # every GPU against two GPUs of different hosts: only the two ends' hosts relay, so a GPU that reaches the first
    # through a GPU of a third host's relay (listed first) is refused by the second
    anchors = [gpus[0], *[gpu for gpu in gpus if host_of[gpu] != host_of[gpus[0]]][:1]]
    stranded = [(gpu, anchor) for gpu in gpus for anchor in anchors
                if gpu != anchor and router.reaching(gpu, anchor) is None]
    if stranded:
        raise TopologyError(f"GPU {stranded[0][0]!r} cannot be reached from {stranded[0][1]!r}", field="links",
                            allowed="links that connect every GPU to every other, a NIC from its host's side to the "
                                    "network, a GPU without one to a GPU of its host that has")
    gpu_local: list[int] = []
    seen: dict[object, int] = {}
    for host in gpu_hosts:
        gpu_local.append(seen.get(host, 0))
        seen[host] = gpu_local[-1] + 1
    return Topology(name=name or "graph", wiring=wiring, gpus=gpus, gpu_host=gpu_hosts, gpu_local=gpu_local,
                    rails=p["rails"], gpu_model=p["gpu_model"], router=router,
                    params={"kind": "graph", **p},
                    explicit_graph=True)


BUILDERS: dict[str, Builder] = {
    "nvswitch_node": Builder(_single_node("nvswitch_node"), NVSWITCH_NODE_PARAMETERS,
                             "one server, GPUs on a non-blocking NVSwitch"),
    "pcie_node": Builder(_single_node("pcie_node"), PCIE_NODE_PARAMETERS,
                         "one server, GPUs behind PCIe switches joined by a host bridge"),
    "cluster": Builder(_build_cluster, CLUSTER_PARAMETERS, "servers on a leaf/spine(/core) fat tree, rail-optimized",
                       _check_cluster),
    "nvl72": Builder(_build_nvl72, NVL72_PARAMETERS, "GB200 NVL72 racks: 72 GPUs per NVLink domain", _check_nvl72),
    "graph": Builder(_build_graph, GRAPH_PARAMETERS, "explicit nodes and links, equal-cost multi-path routing"),
}


def build_topology(kind: object, params: dict, name: str = "") -> Topology:
    """Build a topology with the builder registered as ``kind`` from user-form parameters."""
    if not isinstance(kind, str) or kind not in BUILDERS:
        raise TopologyError(f"unknown topology kind {kind!r}", field="kind", allowed=", ".join(BUILDERS))
    return BUILDERS[kind](params, name)
