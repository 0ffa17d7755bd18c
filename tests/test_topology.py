"""Topology builders, bundled files, loader overrides and errors, routing, describe/draw.

Expected figures: NVLink 300 GB/s (A100) and 450 GB/s (H100) per direction, NVL72 900 GB/s per direction, HDR
200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s, 100 GbE = 12.5 GB/s (vendor datasheets); default path latencies
3.4 us over NVLink and 14 us across the network (NCCL tuning.cc Simple-protocol per-hop latencies).
"""

from __future__ import annotations

import math
import random
import re
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from shared import NCCL_SIMPLE_BASE_S

from simulator.cli import main
from simulator.collectives.execute import time_collective
from simulator.engine.fold_policy import fold_blocker
from simulator.errors import TopologyError
from simulator.faults.rerouting import Rerouter
from simulator.topology.builders import BUILDERS, build_topology
from simulator.topology.describe import describe_topology, draw_topology, tier_bisection
from simulator.topology.graph import Wiring, add_link, add_links
from simulator.topology.loader import list_bundled_topologies, load_topology, read_topology
from simulator.topology.periods import Periods, Rotation
from simulator.topology.size import host_shape, topology_gpus

REL = 1e-12


def kinds(topo) -> Counter:
    return Counter(attrs["kind"] for _, attrs in topo.graph.nodes(data=True))


def links_between(topo, kind_a: str, kind_b: str) -> list[dict]:
    """Physical links (each once) joining a node of kind_a to one of kind_b; switches named by tier via 'switchN'."""
    def label(node):
        attrs = topo.graph.nodes[node]
        return f"switch{attrs['tier']}" if attrs["kind"] == "switch" else attrs["kind"]
    return [data for u, v, data in topo.graph.edges(data=True) if (label(u), label(v)) == (kind_a, kind_b)]


def route(topo, src, dst, channel=0) -> list[str]:
    return [topo.link_ends[i][0] for i in topo.path(src, dst, channel)] + [topo.gpus[dst]]


def route_kinds(topo, src, dst, channel=0) -> list[str]:
    return [topo.graph.nodes[node]["kind"] for node in route(topo, src, dst, channel)]


# ------------------------------------------------------------------------------------------------ bundled files

def test_bundled_names():
    assert list_bundled_topologies() == ["dgx-a100", "dgx-a100-cluster", "dgx-b200", "dgx-b200-cluster", "dgx-h100",
                                         "dgx-h100-cluster", "dgx-h100-superpod", "dgx-h200", "dgx-h200-cluster",
                                         "ethernet-100g", "gb200-nvl72"]


@pytest.mark.parametrize("name, gpu, nvlink", [("dgx-h200", "h200", 450e9), ("dgx-h200-cluster", "h200", 450e9),
                                               ("dgx-b200", "b200", 900e9), ("dgx-b200-cluster", "b200", 900e9)])
def test_bundled_h200_and_b200_servers_carry_their_gpu_and_nvlink(name, gpu, nvlink):
    """A DGX H200 or B200 by name, not a DGX H100 with `--set`s (whose NVLink a B200 would halve: a warning only)."""
    topo = load_topology(name)
    assert topo.gpu_model == gpu
    rates = {data["bandwidth"] for data in topo.wiring.edges.values() if data["link_class"] == "nvlink"}
    assert rates == {nvlink}


def test_describe_says_the_description_is_the_files_where_a_set_changed_more_than_the_size(capsys):
    """`--set gpu_model=b200` on a DGX H100 printed its '8 H100 SXM GPUs' text unmarked beside '(b200)'."""
    assert main(["topo", "describe", "dgx-h100-cluster", "--set", "nodes=4", "--set", "node.gpu_model=h200"]) == 0
    assert "\n  the file's description, before --set node.gpu_model: DGX H100 servers" in capsys.readouterr().out
    assert main(["topo", "describe", "dgx-h100-cluster", "--set", "nodes=4"]) == 0
    assert "\n  DGX H100 servers on a rail-optimized" in capsys.readouterr().out


@pytest.mark.parametrize("name, gpu_model, nvlink", [("dgx-a100", "a100-80gb", 3.0e11),
                                                     ("dgx-h100", "h100-sxm", 4.5e11)])
def test_single_dgx(name, gpu_model, nvlink):
    topo = load_topology(name)
    assert (topo.num_gpus, topo.num_hosts, topo.rails, topo.gpu_model) == (8, 1, 1, gpu_model)
    assert kinds(topo) == {"gpu": 8, "nvswitch": 1}
    assert topo.graph.number_of_edges() == 2 * 8
    assert all(data["bandwidth"] == nvlink and data["link_class"] == "nvlink"
               for _, _, data in topo.graph.edges(data=True))


@pytest.mark.parametrize("name, nic, spines, gpu_model", [("dgx-a100-cluster", 2.5e10, 10, "a100-80gb"),
                                                          ("dgx-h100-cluster", 5.0e10, 16, "h100-sxm")])
def test_dgx_clusters(name, nic, spines, gpu_model):
    topo = load_topology(name)
    assert (topo.num_gpus, topo.num_hosts, topo.rails, topo.gpu_model) == (16, 2, 8, gpu_model)
    assert kinds(topo) == {"gpu": 16, "nvswitch": 2, "nic": 16, "switch": 8 + spines}
    nvlink, gpu_nic, nic_leaf = 16, 16, 16
    assert topo.graph.number_of_edges() == 2 * (nvlink + gpu_nic + nic_leaf + 8 * spines)
    assert [d["bandwidth"] for d in links_between(topo, "nic", "switch1")] == [nic] * 16
    assert {d["link_class"] for d in links_between(topo, "nic", "switch1")} == {"infiniband"}
    leaf_ports = topo.params["leaf_ports"]
    assert {d["bandwidth"] for d in links_between(topo, "switch1", "switch2")} == {leaf_ports * nic / spines}


def test_ethernet_and_nvl72_files():
    eth = load_topology("ethernet-100g")
    assert (eth.num_gpus, eth.num_hosts, eth.rails) == (8, 8, 1)
    assert kinds(eth) == {"gpu": 8, "nic": 8, "switch": 1}
    assert [d["bandwidth"] for d in links_between(eth, "nic", "switch1")] == [1.25e10] * 8
    assert route_kinds(eth, 0, 7) == ["gpu", "nic", "switch", "nic", "gpu"]
    assert eth.path_latency(0, 7) == pytest.approx(14e-6, rel=REL)
    nvl = load_topology("gb200-nvl72")
    assert (nvl.num_gpus, nvl.num_hosts, nvl.gpu_model) == (72, 18, "gb200")
    assert kinds(nvl) == {"gpu": 72, "nvswitch": 1}
    assert {d["bandwidth"] for _, _, d in nvl.graph.edges(data=True)} == {9.0e11}
    assert nvl.gpu_host[:8] == [0, 0, 0, 0, 1, 1, 1, 1] and nvl.gpu_local[4:8] == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------------ routing

def test_same_host_path_is_two_nvlink_links():
    topo = load_topology("dgx-h100-cluster")
    assert len(topo.path(1, 6)) == 2
    assert [topo.link_class[i] for i in topo.path(9, 14)] == ["nvlink", "nvlink"]
    assert topo.path_latency(1, 6) == pytest.approx(3.4e-6, rel=REL)


def test_rail_optimized_routes():
    topo = load_topology("dgx-h100-cluster")
    same_rail = route(topo, 3, 8 + 3)
    assert route_kinds(topo, 3, 11) == ["gpu", "nic", "switch", "nic", "gpu"]
    assert same_rail == ["h0/gpu3", "h0/nic3", "leaf0.r3", "h1/nic3", "h1/gpu3"]
    assert topo.path_latency(3, 11) == pytest.approx(13e-6, rel=REL)
    cross_rail = route(topo, 3, 8 + 5)
    assert [topo.graph.nodes[n].get("tier") for n in cross_rail[2:5]] == [1, 2, 1]
    assert cross_rail[-2:] == ["h1/nic5", "h1/gpu5"]
    assert topo.path_latency(3, 13) == pytest.approx(14e-6, rel=REL)


def test_paths_are_each_pairs_path_whether_known_or_new():
    """`Topology.paths` looks a list of (src, dst, channel) up at once: each entry is what `path` gives, a route
    already known (read) or new (worked out on the fresh topology). By hand: inside a host two NVLink links, on one
    rail across hosts four (GPU-NIC, NIC-leaf and back), across rails six (through a spine)."""
    ends = [(1, 6, 0), (3, 11, 0), (3, 13, 5), (1, 6, 0), (3, 13, 6)]
    fresh, stepwise = load_topology("dgx-h100-cluster"), load_topology("dgx-h100-cluster")
    fresh.path(3, 11)
    paths = fresh.paths(ends)
    assert paths == [stepwise.path(*end) for end in ends]
    assert [len(path) for path in paths] == [2, 4, 6, 2, 6]


def test_spine_choice_is_deterministic_and_spreads_over_channels():
    topo = load_topology("dgx-h100-cluster")
    spines = {route(topo, 0, 13, channel)[3] for channel in range(64)}
    assert len(spines) > 8
    assert route(topo, 0, 13, 5) == build_topology("cluster", {"spines": 16, "leaf_ports": 32})._route_nodes(0, 13, 5)


def test_cross_rail_flows_into_one_nic_land_on_spines_as_random_draws_do():
    """32 hosts in one leaf group over 16 spines: the 7 flows from one host's other rails into one NIC cross the
    spines; over every (source host, destination NIC) they use 5.82 distinct spines on average and all 7 in 21.7%
    of cases, as 7 independent draws from 16 do (16 (1 - (15/16)^7) = 5.816; 16!/9!/16^7 = 21.5%). With the
    rail left out of the hash all 7 took one spine, and its downlink into the destination's leaf carried them
    all."""
    fabric = build_topology("cluster", {"nodes": 32, "leaf_ports": 32, "spines": 16}).router
    distinct = [len({fabric._hops(src * 8 + rail, dst * 8 + into, 0)[2] for rail in range(8) if rail != into})
                for src in range(32) for dst in range(32) if dst != src for into in range(8)]
    assert sum(distinct) / len(distinct) == pytest.approx(16 * (1 - (15 / 16) ** 7), abs=0.1)
    assert distinct.count(7) / len(distinct) == pytest.approx(math.perm(16, 7) / 16**7, abs=0.03)


def test_a_push_from_every_rail_of_a_host_into_one_nic_waits_for_the_nic_not_one_spine():
    """Two hosts, one leaf group, 8 spines at 1:1 (each leaf uplink 2 x 50 / 8 = 12.5 GB/s): every GPU of host 0
    sends 1 GB to GPU 0 of host 1 (a direct reduce: a parameter-server push into one server GPU). The 7 cross-rail
    flows take 6 spines, at most 2 on one downlink (2 x 6.25 GB/s fits 12.5), so the 8 flows share the NIC's
    50 GB/s: 8 GB / 50 GB/s + 14 us = 160.014 ms. With the rail left out of the hash the 7 took one spine's
    12.5 GB/s downlink: 7 GB / 12.5 GB/s = 560.014 ms."""
    topology = build_topology("cluster", {"nodes": 2, "leaf_ports": 2, "spines": 8})
    spines = Counter(topology.router._hops(rail, 8, 0)[2] for rail in range(1, 8))
    assert len(spines) == 6 and max(spines.values()) == 2
    assert time_collective(topology, "reduce", "direct", 16, 1e9, root=8) == pytest.approx(8e9 / 50e9 + 14e-6,
                                                                                         rel=REL)


def test_shared_nics():
    topo = build_topology("cluster", {"nodes": 2, "nics_per_node": 2})
    assert topo.rails == 2 and kinds(topo)["nic"] == 4
    assert [route(topo, gpu, 8)[1] for gpu in (0, 3, 4, 7)] == ["h0/nic0", "h0/nic0", "h0/nic1", "h0/nic1"]
    assert route(topo, 0, 13)[-2] == "h1/nic1"


def test_three_tier_routes_through_core_only_across_pods():
    topo = build_topology("cluster", {"nodes": 8, "leaf_ports": 2, "spines": 2, "tiers": 3, "pods": 2})
    assert kinds(topo)["switch"] == 4 * 8 + 2 * 2 + 2
    def tiers(s, d):
        return [topo.graph.nodes[n].get("tier") for n in route(topo, s, d)[2:-2]]
    assert tiers(0, 2 * 8 + 1) == [1, 2, 1]
    assert tiers(0, 7 * 8 + 1) == [1, 2, 3, 2, 1]
    assert topo.path_latency(0, 7 * 8 + 1) == pytest.approx(15e-6, rel=REL)
    for src in range(0, 64, 5):
        for dst in range(64):
            topo.path(src, dst, src % 3)


def test_pcie_node_routes_through_host_bridge():
    topo = build_topology("pcie_node", {"gpus": 8, "gpus_per_switch": 2, "pcie_bandwidth": "64 GB/s"})
    assert kinds(topo) == {"gpu": 8, "pcie_switch": 4, "host_bridge": 1}
    assert route_kinds(topo, 0, 1) == ["gpu", "pcie_switch", "gpu"]
    assert route_kinds(topo, 0, 7) == ["gpu", "pcie_switch", "host_bridge", "pcie_switch", "gpu"]
    assert set(topo.link_bandwidth) == {6.4e10}


def test_nvl72_keeps_the_rack_on_nvlink():
    topo = build_topology("nvl72", {"racks": 2, "leaf_ports": 36})
    assert (topo.num_gpus, topo.num_hosts, topo.rails) == (144, 36, 4)
    assert topo.gpu_host[4] != topo.gpu_host[71]
    assert [topo.link_class[i] for i in topo.path(4, 71)] == ["nvlink", "nvlink"]
    assert route_kinds(topo, 0, 72) == ["gpu", "nic", "switch", "nic", "gpu"]
    assert topo.graph.nodes["rack1/gpu0"]["nvlink_domain"] == 1


def test_a_last_rack_partly_in_use_keeps_every_tray_in_its_rack():
    """`last_rack_trays`: 2 racks of 18 trays and a third of 5 (an elastic job shrunk by trays keeps such a
    cluster): 41 hosts, the last rack's 20 GPUs in NVLink domain 2, every other GPU where 3 full racks put it;
    counted (`topology_gpus`) and shaped (`host_shape`) before building as built. More trays than a rack holds
    is refused at the field."""
    partial = {"racks": 3, "leaf_ports": 8, "last_rack_trays": 5}
    full = load_topology("gb200-nvl72", {"racks": 3, "leaf_ports": 8})
    topo = load_topology("gb200-nvl72", partial)
    assert (topo.num_gpus, topo.num_hosts, topo.rails) == (164, 41, 4)
    assert topo.gpu_domain == full.gpu_domain[:164] and topo.gpu_host == full.gpu_host[:164]
    assert [topo.link_class[i] for i in topo.path(144, 163)] == ["nvlink", "nvlink"]
    source = read_topology("gb200-nvl72", partial)
    assert topology_gpus(source) == 164
    shape = host_shape(source)
    assert shape is not None and (shape.gpus, shape.domain) == (4, 72)
    assert shape.period == topo.router.shift_gpus
    with pytest.raises(TopologyError, match="19 trays in the last rack, more than a rack's 18") as error:
        build_topology("nvl72", {"racks": 2, "last_rack_trays": 19})
    assert error.value.field == "last_rack_trays"


def test_a_fabric_wired_for_more_hosts_attaches_the_first_and_keeps_its_pods():
    """`fabric_hosts`: 5 hosts on the fat tree of 12 (6 leaf groups of 2 in 3 pods) keep the 12-host fabric's
    leaves, pods, spines and cores, core links of 2 leaf groups' bandwidth in every pod, and its spine hash's period
    (a pod: 4 hosts), which the parameters alone tell as building does; fewer than the hosts attached is refused, by
    the builder's check as by building. Its translations by whole pods are exact (what folding reads); a rotation of
    the whole fabric it has not (the leaves without hosts have no image), so detours around links down are picked
    one by one, as on any fabric without one."""
    params = {"nodes": 5, "leaf_ports": 2, "tiers": 3, "pods": 3}
    full = load_topology("dgx-h100-cluster", {**params, "nodes": 12})
    cut = load_topology("dgx-h100-cluster", {**params, "fabric_hosts": 12})
    def switches(topology):
        return {name: attributes for name, attributes in topology.wiring.nodes.items()
                if attributes.get("kind") == "switch"}

    assert switches(cut) == switches(full)
    core_links = {edge: full.wiring.edges[edge] for edge in full.wiring.edges if edge[1].startswith("core")}
    assert {edge: cut.wiring.edges[edge] for edge in cut.wiring.edges if edge[1].startswith("core")} == core_links
    shape = host_shape(read_topology("dgx-h100-cluster", {**params, "fabric_hosts": 12}))
    assert shape is not None and shape.period == cut.router.shift_gpus == 4 * 8
    periods = Periods.of(cut)
    assert periods is not None and periods.exact
    assert Rotation.of(full) is not None and Rotation.of(cut) is None
    for refuse in (lambda raw: build_topology("cluster", raw), BUILDERS["cluster"].checked):
        with pytest.raises(TopologyError, match="a fabric wired for 4 hosts cannot attach 5") as error:
            refuse({**params, "fabric_hosts": 4})
        assert (error.value.field, error.value.allowed) == ("fabric_hosts", "at least 5 (the hosts), or leave it out")


ROUTED_CUTS = {
    # two-GPU hosts on two rails, 5 leaf groups of 2 in 3 pods, 4 spines a pod, 2 cores; cut to 5 hosts
    "rails": ("dgx-h100-cluster", {"node": {"kind": "nvswitch_node", "gpus": 2}, "nics_per_node": 2,
                                   "leaf_ports": 2, "tiers": 3, "pods": 3, "cores": 2, "spines": 4},
              {"nodes": 10}, {"nodes": 5, "fabric_hosts": 10}),
    # GB200 racks of 4 trays, 6 leaf groups of 2 trays in 2 pods; cut to a rack and a half
    "nvl72": ("gb200-nvl72", {"trays": 4, "leaf_ports": 2, "spines": 2, "tiers": 3, "pods": 2},
              {"racks": 3}, {"racks": 2, "last_rack_trays": 2, "fabric_hosts": 12}),
}


@pytest.mark.parametrize("case", ROUTED_CUTS)
def test_a_fabric_wired_for_more_hosts_routes_its_hosts_as_the_full_one(case):
    """Every flow between two GPUs of the attached hosts takes the full fabric's route, spine and core included, on
    every channel: the spine hash reads the flow keys of the hosts the fabric is wired for; and the rails cut's
    translations by whole pods stay exact (the NVL72 cut, its last rack partly in use, has none to fold by)."""
    name, params, full_size, cut_size = ROUTED_CUTS[case]
    full, cut = load_topology(name, {**params, **full_size}), load_topology(name, {**params, **cut_size})
    gpus = range(cut.num_gpus)
    across = [(src, dst) for src in gpus for dst in gpus if cut.gpu_host[src] != cut.gpu_host[dst]]
    assert across and all(cut.router.route(cut, src, dst, channel) == full.router.route(full, src, dst, channel)
                          for src, dst in across for channel in range(4))
    periods = Periods.of(cut)
    assert case == "nvl72" or (periods is not None and periods.exact)


def test_override_nodes_128_gives_1024_gpus():
    topo = load_topology("dgx-h100-cluster", {"nodes": "128"})
    assert (topo.num_gpus, topo.num_hosts) == (1024, 128)
    assert topo.params["leaves"] == 128 // 32 * 8
    assert route(topo, 0, 1023)[-2:] == ["h127/nic7", "h127/gpu7"]


def test_a_node_override_changes_its_keys_and_keeps_the_files_others():
    """`cluster: {topology: dgx-h100-cluster, node: {gpu_model: h200}}` replaced the file's node with the builder's
    defaults but for the GPU: the NVSwitches lost NVLink SHARP (`nvls: nvswitch3`) unsaid, and a traced step's
    DP all-reduce on 16 hosts came out 1.87 ms where the same node and GPU unchanged gave 1.66 ms. A node that
    names its kind still replaces the file's whole."""
    h200 = load_topology("dgx-h100-cluster", {"node": {"gpu_model": "h200"}})
    assert (h200.gpu_model, h200.nvls) == ("h200", True)
    assert load_topology("dgx-h100-cluster", {"node": {"nvls": "none"}}).nvls is False
    pcie = load_topology("dgx-h100-cluster", {"node": {"kind": "pcie_node"}})
    assert (pcie.gpu_model, pcie.nvls) == ("a100-80gb", False)
    assert load_topology("dgx-h100-cluster", {"node": {"kind": "nvswitch_node"}}).nvls is False


@pytest.mark.parametrize(("node", "warned"), [
    ("{gpu_model: a100-80gb}", True), ("{gpu_model: h200}", False),
    ("{gpu_model: a100-80gb, nvls: none, nvlink_bandwidth: 300 GB/s}", False),
    ("{kind: nvswitch_node, gpu_model: a100-80gb, nvlink_bandwidth: 300 GB/s}", False)],
    ids=["a100", "h200", "a100-nvls-none", "whole-node"])
def test_a_node_override_that_keeps_nvls_for_a_gpu_without_it_is_warned_at_the_gpu(tmp_path, capsys, node, warned):
    """`node: {gpu_model: a100-80gb}` on dgx-h100-cluster keeps the file's `nvls: nvswitch3`, which an A100 cannot
    drive: `validate` warns at the override's line, not just 'valid' while the topology says NVLS; an H200 (NVLink
    SHARP), an A100 that sets `nvls: none` and a whole node that names its kind are not warned."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"cluster: {{topology: dgx-h100-cluster, nodes: 1, node: {node}}}\n"
                        "model: {preset: llama3-8b, layers: 4}\ntraining: {seq_len: 1024, global_batch: 8}\n")
    assert main(["validate", str(scenario)]) == 0
    err = capsys.readouterr().err
    assert (f"warning: {scenario}:1: cluster.node.gpu_model: gpu_model a100-80gb: the node keeps the topology file's "
            "nvls (NVLink SHARP), which a100-80gb has none of" in err) is warned
    assert err.count("warning") == warned


@pytest.mark.parametrize(("node", "sets", "error"), [
    ("{gpu_model: h200}", [], "{topology}:7: node.nvlink_bandwidth: bandwidth 450 has no unit"),
    ("{gpus: 8}", ["cluster.node.gpu_model=h200"], "{topology}:7: node.nvlink_bandwidth: bandwidth 450 has no unit"),
    ("{gpu_model: h200, nvlink_bandwidth: 5}", [],
     "{scenario}:1: cluster.node.nvlink_bandwidth: bandwidth 5 has no unit"),
    ("{gpu_model: h200}", ["cluster.node.nvlink_bandwidth=5"],
     "command line: trainsim validate: --set cluster.node.nvlink_bandwidth=5: bandwidth 5 has no unit"),
], ids=["merged", "merged-by-set", "set-by-the-node", "set-by-a-set"])
def test_an_error_in_a_node_key_the_override_keeps_is_the_topology_files(tmp_path, capsys, node, sets, error):
    """A scenario's `node:` without a kind is merged into the file's node and sets only its own keys; the file's
    `nvlink_bandwidth: 450` (no unit) was blamed on the scenario's `cluster.node.nvlink_bandwidth` (line 1, a
    field it never wrote, or its `node:` line where a `--set` merged the GPU), the file's line lost. A key the
    override does set is still its own."""
    topology, scenario = tmp_path / "my.yaml", tmp_path / "s.yaml"
    topology.write_text("name: my\nkind: cluster\nnodes: 2\nnode:\n  kind: nvswitch_node\n  gpus: 8\n"
                        "  nvlink_bandwidth: 450\nnics_per_node: 8\nnic_bandwidth: 400 Gb/s\n")
    scenario.write_text(f"cluster: {{topology: my.yaml, node: {node}}}\n"
                        "model: {preset: llama3-8b, layers: 4}\ntraining: {seq_len: 1024, global_batch: 16}\n")
    assert main(["validate", str(scenario), *(part for item in sets for part in ("--set", item))]) == 2
    assert capsys.readouterr().err.startswith(f"error: {error.format(topology=topology, scenario=scenario)} (allowed: ")


@pytest.mark.parametrize(("cluster", "sets", "where", "kept"), [
    ("{topology: dgx-h100-cluster, nodes: 1}", ["cluster.node.gpu_model=b200"],
     "command line: trainsim validate: --set cluster.node.gpu_model=b200", "the node's nvlink_bandwidth is 450 GB/s"),
    ("{topology: dgx-h100-cluster, nodes: 1, node: {kind: nvswitch_node, gpu_model: b200}}", [],
     "{scenario}:1: cluster.node.gpu_model", "the node's nvlink_bandwidth is 450 GB/s"),
    ("{topology: dgx-h100}", ["cluster.gpu_model=b200"],
     "command line: trainsim validate: --set cluster.gpu_model=b200", "the node's nvlink_bandwidth is 450 GB/s"),
    ("{topology: dgx-h100-cluster, nodes: 1, node: {gpu_model: a100-80gb}}", [], "{scenario}:1: cluster.node.gpu_model",
     "the node keeps the topology file's nvls (NVLink SHARP), which a100-80gb has none of; its nvlink_bandwidth is "
     "450 GB/s"),
], ids=["merged-b200", "whole-node-b200", "one-server-b200", "a100-both"])
def test_a_gpu_changed_without_its_generations_nvlink_is_warned_at_the_gpu(tmp_path, capsys, cluster, sets, where,
                                                                          kept):
    """`--set cluster.node.gpu_model=b200` on dgx-h100-cluster ran B200s on the H100's NVLink 4 (450 GB/s; the 70B
    step 17.6% long, TP exposure 3.3x) without a word, as did a whole node or a one-server topology given a B200
    and the builder's default NVLink; warned as the kept NVLink SHARP is, one warning naming both."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"cluster: {cluster}\nmodel: {{preset: llama3-8b, layers: 4}}\n"
                        "training: {seq_len: 1024, global_batch: 8}\n")
    assert main(["validate", str(scenario), *(part for item in sets for part in ("--set", item))]) == 0
    err = capsys.readouterr().err
    gpu = "a100-80gb" if "a100" in cluster else "b200"
    rate = "300 GB/s" if gpu == "a100-80gb" else "900 GB/s"
    warning = f"warning: {where.format(scenario=scenario)}: gpu_model {gpu}: {kept}, while {gpu}'s NVLink has {rate}"
    assert f"{warning} per direction (allowed: " in err
    assert err.count("warning") == 1


KEPT_NVLS = "cluster.node.gpu_model: gpu_model a100-80gb: the node keeps the topology file's nvls"
A100_NODE = "cluster: {topology: dgx-h100-cluster, nodes: 1, node: {gpu_model: a100-80gb}}\n"


def test_a_communication_only_workload_on_a_node_that_keeps_nvls_is_warned(tmp_path, capsys):
    """The kept-NVLS warning came with a training step's program, so a `workload:` list of collectives on the same
    node was validated and run without it; it is the scenario's warning (`scenario_warnings`), given once."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(A100_NODE + "workload:\n- {op: all_reduce, bytes: 1 MiB}\n")
    assert main(["validate", str(scenario)]) == 0
    assert capsys.readouterr().err.count(f"warning: {scenario}:1: {KEPT_NVLS}") == 1
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert capsys.readouterr().err.count(f"warning: {scenario}:1: {KEPT_NVLS}") == 1


def test_a_jobs_kept_nvls_warning_names_its_own_file_once(tmp_path):
    """Two jobs of the same sections in two files, the second with the node a line lower: each job's healthy step warns
    once, at its own file's line, not with the first file's warning from the cache (nor once more per degraded
    state's program)."""
    from simulator.config.loader import load_scenario
    from simulator.reliability.simulate import simulate_job

    body = ("model: {preset: llama3-8b, layers: 4}\ntraining: {seq_len: 1024, global_batch: 8}\n"
            "run: {horizon: 1 d, replications: 1}\ncheckpoint: {size: 1 GB, interval: 1 h}\n"
            "faults: {preset: llama3}\n")
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(A100_NODE + body)
    second.write_text("# the same job\n" + A100_NODE + body)
    for scenario, line in ((first, 1), (second, 2)):
        warnings = simulate_job(load_scenario(scenario)).step_summary["warnings"]
        kept = [warning for warning in warnings if KEPT_NVLS in warning]
        assert len(kept) == 1 and kept[0].startswith(f"{scenario}:{line}: ")


def test_oversubscription_halves_spine_bandwidth():
    full = build_topology("cluster", {"nodes": 64, "leaf_ports": 32, "spines": 8})
    half = build_topology("cluster", {"nodes": 64, "leaf_ports": 32, "spines": 8, "oversubscription": "2:1"})
    full_bw = {d["bandwidth"] for d in links_between(full, "switch1", "switch2")}
    half_bw = {d["bandwidth"] for d in links_between(half, "switch1", "switch2")}
    assert full_bw == {32 * 5e10 / 8} and half_bw == {32 * 5e10 / 8 / 2}


THREE_TIERS = {"nodes": 8, "leaf_ports": 2, "spines": 2, "tiers": 3, "pods": 2}
"""Two pods of two leaf groups of two DGX hosts: 16 rail leaves a pod, 2 spines a pod, 2 cores."""


def test_core_oversubscription_divides_the_spine_core_links_only():
    """Spine-core links carry a pod's leaf-spine capacity over the cores (16 leaves x 50 GB/s / 2 cores = 400 GB/s
    each), divided by `core_oversubscription`; the leaf-spine links keep 2 x 50 GB/s / 2 spines."""
    def bandwidths(params):
        topo = build_topology("cluster", params)
        return ({d["bandwidth"] for d in links_between(topo, "switch1", "switch2")},
                {d["bandwidth"] for d in links_between(topo, "switch2", "switch3")})

    assert bandwidths(THREE_TIERS) == ({50e9}, {400e9})
    assert bandwidths({**THREE_TIERS, "core_oversubscription": "4:1"}) == ({50e9}, {100e9})
    assert bandwidths({**THREE_TIERS, "core_oversubscription": 7, "oversubscription": 2}) == ({25e9}, {200e9 / 7})


def test_a_ring_across_4_to_1_oversubscribed_pods_runs_at_a_quarter_of_the_nic_rate():
    """One-GPU hosts, two per pod on one leaf, one spine a pod and one core: a ring whose every hop crosses the pods
    (0, 2, 1, 3) has both NICs of each pod send through its spine-core link of 2 x 50 GB/s / 4 at once, 12.5 GB/s a
    hop; a ring inside a pod runs at the NIC's 50 GB/s. Alpha-beta: NCCL's base latency, then 2 (p - 1) steps of
    the path latency (15 us across the core, 13 us under one leaf) and n / p bytes."""
    params = {"nodes": 4, "node": {"kind": "nvswitch_node", "gpus": 1}, "leaf_ports": 2, "spines": 1, "cores": 1,
              "tiers": 3, "pods": 2, "core_oversubscription": 4}
    topo = build_topology("cluster", params)
    n = 1e9
    across = time_collective(topo, "all_reduce", "ring", [0, 2, 1, 3], n)
    assert across == pytest.approx(NCCL_SIMPLE_BASE_S + 6 * (15e-6 + n / 4 / (50e9 / 4)), rel=1e-9)
    inside = time_collective(topo, "all_reduce", "ring", [0, 1], n)
    assert inside == pytest.approx(NCCL_SIMPLE_BASE_S + 2 * (13e-6 + n / 2 / 50e9), rel=1e-9)


def test_describe_says_each_oversubscribed_tier_and_what_a_pod_has_to_the_others():
    text = describe_topology(load_topology("dgx-h100-cluster", {**THREE_TIERS, "oversubscription": 2,
                                                                "core_oversubscription": 4}))
    assert text.endswith(
        "  NIC-leaf                   1.6 TB/s  (whole fabric)\n"
        "  leaf-spine                 800 GB/s  (whole fabric; oversubscribed 2:1 at its leaves, the fabric's "
        "bisection 2:1 against the NIC-leaf tier's 1.6 TB/s)\n"
        "  spine-core                 200 GB/s  (whole fabric; oversubscribed 4:1 at its spines, the fabric's "
        "bisection 4:1 against the leaf-spine tier's 800 GB/s; pod to pod: 200 GB/s out of each of 2 pods)")


# ------------------------------------------------------------------------------------------------ explicit graph

def graph_params(links):
    nodes = [{"name": "a", "kind": "gpu", "host": 0}, {"name": "b", "kind": "gpu", "host": 0},
             {"name": "c", "kind": "gpu"}, {"name": "sw", "kind": "switch"}]
    return {"nodes": nodes, "links": links}


def test_graph_builder_shortest_path_and_hosts():
    links = [{"a": "a", "b": "b", "bandwidth": "100 GB/s", "latency": "1 us", "class": "nvlink"},
             {"a": "a", "b": "sw", "bandwidth": "400 Gb/s", "latency": "2 us", "class": "ethernet"},
             {"a": "sw", "b": "c", "bandwidth": "25 GB/s", "latency": "3 us", "class": "infiniband"}]
    topo = build_topology("graph", graph_params(links))
    assert (topo.gpus, topo.gpu_host, topo.gpu_local) == (["a", "b", "c"], [0, 0, 1], [0, 1, 0])
    assert route(topo, 1, 2) == ["b", "a", "sw", "c"]
    assert topo.path_latency(1, 2) == pytest.approx(6e-6, rel=REL)
    assert topo.graph.edges["a", "sw"]["bandwidth"] == 5e10


def test_only_the_graph_builder_makes_an_explicit_graph_and_it_turns_folding_off():
    """Folding and fault rerouting ask the topology whether its links were listed one by one, not which
    builder made it (a builder renamed would have turned folding on for explicit graphs)."""
    links = [{"a": "a", "b": "sw", "bandwidth": "1 GB/s", "latency": "1 us", "class": "ethernet"},
             {"a": "b", "b": "sw", "bandwidth": "1 GB/s", "latency": "1 us", "class": "ethernet"},
             {"a": "c", "b": "sw", "bandwidth": "1 GB/s", "latency": "1 us", "class": "ethernet"}]
    graph = build_topology("graph", graph_params(links))
    assert graph.explicit_graph and fold_blocker(graph).startswith("explicit graph topology")
    assert not any(load_topology(name).explicit_graph for name in list_bundled_topologies())


def test_each_builder_gives_its_hosts_nic_bandwidth_into_the_network():
    """A host's NICs into the scale-out network, together, as the builder wired them (the job simulation's
    checkpoint writes share them): the cluster's NICs per server and the NVL72 trays' once racks are joined by
    the fabric; none where nothing was built, read from the topology rather than from its builder's kind."""
    assert load_topology("dgx-h100-cluster").host_nic_bandwidth == pytest.approx(8 * 50e9, rel=REL)
    assert load_topology("ethernet-100g").host_nic_bandwidth == pytest.approx(12.5e9, rel=REL)
    assert load_topology("gb200-nvl72", {"racks": 2}).host_nic_bandwidth == pytest.approx(4 * 50e9, rel=REL)
    assert load_topology("gb200-nvl72").host_nic_bandwidth == 0.0
    assert load_topology("dgx-h100").host_nic_bandwidth == 0.0


def test_graph_builder_errors():
    with pytest.raises(TopologyError, match="cannot be reached") as unreachable:
        build_topology("graph", graph_params([{"a": "a", "b": "b", "bandwidth": "1 GB/s", "latency": "1 us",
                                                "class": "pcie"}]))
    assert unreachable.value.field == "links"
    with pytest.raises(TopologyError) as unknown:
        build_topology("graph", graph_params([{"a": "a", "b": "zz", "bandwidth": "1 GB/s", "latency": "1 us",
                                                "class": "pcie"}]))
    assert unknown.value.field == "links[0].b"
    with pytest.raises(TopologyError) as duplicate:
        build_topology("graph", {"nodes": [{"name": "a", "kind": "gpu"}] * 2, "links": []})
    assert duplicate.value.field == "nodes[1].name"
    with pytest.raises(TopologyError) as bad_class:
        build_topology("graph", graph_params([{"a": "a", "b": "b", "bandwidth": "1 GB/s", "latency": "1 us",
                                               "class": "fibre"}]))
    assert bad_class.value.field == "links[0].class" and "nvlink" in bad_class.value.allowed


# ------------------------------------------------------------------------------------------------ bad inputs

@pytest.mark.parametrize("kind, params, field", [
    ("nvswitch_node", {"gpu": 8}, "gpu"),
    ("nvswitch_node", {"nvlink_bandwidth": 450}, "nvlink_bandwidth"),
    ("nvswitch_node", {"nvlink_bandwidth": "-5 GB/s"}, "nvlink_bandwidth"),
    ("nvswitch_node", {"gpus": 0}, "gpus"),
    ("nvswitch_node", {"nvlink_latency": "3 parsecs"}, "nvlink_latency"),
    ("cluster", {"nodes": "many"}, "nodes"),
    ("cluster", {"node": {"kind": "toaster"}}, "node.kind"),
    ("cluster", {"node": {"gpus": 8, "nvlink": "1 GB/s"}}, "node.nvlink"),
    ("cluster", {"nics_per_node": 9}, "nics_per_node"),
    ("cluster", {"link_class": "nvlink"}, "link_class"),
    ("cluster", {"oversubscription": 0}, "oversubscription"),
    ("cluster", {"tiers": 4}, "tiers"),
    ("cluster", {"nodes": 64, "tiers": 3, "pods": 1}, "pods"),
    ("cluster", {"nodes": 64, "pods": 2}, "pods"),
])
def test_bad_parameters_name_the_field(kind, params, field):
    with pytest.raises(TopologyError) as error:
        build_topology(kind, params)
    assert error.value.field == field


@pytest.mark.parametrize("text", ["²", "--5", "٨", "８", "1_0", "+5"])
def test_a_count_is_ascii_digits(text):
    """str.isdigit passed '²' (int() then raised a traceback) and '--5', and let '٨' and '８' through as 8."""
    with pytest.raises(TopologyError) as error:
        load_topology("dgx-h100", {"gpus": text})
    assert error.value.field == "gpus" and error.value.problem == f"expected a whole number, got {text!r}"


@pytest.mark.parametrize("params, problem, allowed", [
    ({**THREE_TIERS, "core_oversubscription": 0}, "0 must be positive", "a positive value"),
    ({**THREE_TIERS, "core_oversubscription": "4:0"}, "cannot read ratio '4:0'",
     "a positive number such as 2 or '2:1'"),
    ({"nodes": 64, "core_oversubscription": 4}, "core_oversubscription sizes the spine-core links of tiers: 3",
     "1 (or leave it out) with tiers: 2, or tiers: 3")])
def test_a_bad_core_oversubscription_is_refused_saying_what_it_takes(params, problem, allowed):
    with pytest.raises(TopologyError) as error:
        build_topology("cluster", params)
    assert (error.value.field, error.value.problem, error.value.allowed) == ("core_oversubscription", problem,
                                                                             allowed)


def test_three_tiers_over_one_leaf_group_names_the_tiers():
    """It asked for '2 to 1' pods."""
    with pytest.raises(TopologyError) as error:
        build_topology("cluster", {"nodes": 3, "tiers": 3, "pods": 2})
    assert (error.value.field, error.value.problem, error.value.allowed) == (
        "tiers", "3 splits leaf groups into pods, but 3 hosts make one leaf group (up to 32 hosts)",
        "tiers: 2, or more than 32 hosts (nodes), or fewer leaf_ports")


def test_three_tiers_over_one_leaf_group_of_a_wired_fabric_advise_more_fabric_hosts():
    """A fabric wired for 2 hosts (`fabric_hosts`) makes one leaf group: the advice names `fabric_hosts`, which
    it follows (3 builds two pods). It named `nodes`, and 3 nodes on a fabric wired for 2 are refused."""
    params = {"nodes": 2, "fabric_hosts": 2, "leaf_ports": 2, "tiers": 3, "pods": 2}
    with pytest.raises(TopologyError) as error:
        build_topology("cluster", params)
    assert (error.value.field, error.value.allowed) == (
        "tiers", "tiers: 2, or more than 2 hosts (fabric_hosts), or fewer leaf_ports")
    wired = build_topology("cluster", {**params, "fabric_hosts": 3})
    assert {attributes["pod"] for attributes in wired.wiring.nodes.values() if attributes.get("tier") == 1} == {0, 1}


def test_pods_that_would_leave_a_pod_without_leaf_groups_are_refused_at_pods():
    """3 pods over 4 leaf groups (8 hosts, 2 per leaf group) gave pods of 2, 2 and 0 groups, and the run failed on
    the topology file's first line ('link spine2.0 <-> core0 has bandwidth 0.0') instead of at cluster.pods."""
    with pytest.raises(TopologyError) as error:
        build_topology("cluster", {"nodes": 8, "leaf_ports": 2, "tiers": 3, "pods": 3})
    assert (error.value.field, error.value.problem, error.value.allowed) == (
        "pods", "tiers: 3 with 3 pods over 4 leaf groups, which leaves a pod without leaf groups",
        "2, 4 (one leaf group = 2 hosts)")
    assert build_topology("cluster", {"nodes": 8, "leaf_ports": 2, "tiers": 3, "pods": 4}).num_gpus == 64


def test_unknown_parameter_lists_allowed_names():
    with pytest.raises(TopologyError) as error:
        build_topology("cluster", {"leafports": 8})
    assert error.value.allowed.split(", ") == list(BUILDERS["cluster"].parameters)
    with pytest.raises(TopologyError, match="unknown topology kind") as kind:
        build_topology("torus", {})
    assert "nvl72" in kind.value.allowed


def test_loader_errors_carry_file_and_line(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("kind: cluster\nnodes: 2\nnode:\n  kind: nvswitch_node\n  nvlink_bandwidth: 450\n")
    with pytest.raises(TopologyError) as error:
        load_topology(str(path))
    assert (error.value.file, error.value.line, error.value.field) == (str(path), 5, "node.nvlink_bandwidth")
    assert str(error.value).startswith(f"{path}:5: node.nvlink_bandwidth:")
    path.write_text("kind: cluster\nname: x\nspine: 4\n")
    with pytest.raises(TopologyError) as unknown_key:
        load_topology(str(path))
    assert (unknown_key.value.line, unknown_key.value.field) == (3, "spine")
    assert "description" in unknown_key.value.allowed and "spines" in unknown_key.value.allowed


def test_loader_override_errors():
    with pytest.raises(TopologyError) as unknown:
        load_topology("dgx-h100-cluster", {"node_count": 4})
    assert unknown.value.field == "node_count" and "nodes" in unknown.value.allowed.split(", ")
    with pytest.raises(TopologyError) as zero:
        load_topology("dgx-h100-cluster", {"nodes": "0"})
    assert zero.value.field == "nodes"
    with pytest.raises(TopologyError) as missing:
        load_topology("dgx-h200-superpod")
    assert missing.value.field == "topology" and "dgx-h100" in missing.value.allowed


# ------------------------------------------------------------------------------------------------ describe / draw

def test_describe_reports_counts_and_bisection():
    topo = load_topology("dgx-h100-cluster")
    bisection = dict(tier_bisection(topo))
    assert bisection["GPU-NVSwitch"] == ((pytest.approx(4 * 4.5e11, rel=REL), 2, "nvlink_domain"),)
    assert bisection["GPU-NIC"] == ((pytest.approx(8 * 64e9 / 2, rel=REL), 2, "host"),)
    assert bisection["NIC-leaf"] == ((pytest.approx(8 * 5e10, rel=REL), 0, ""),)
    assert bisection["leaf-spine"][0][0] == pytest.approx(8 * 16 * (32 * 5e10 / 16) / 2, rel=REL)
    text = describe_topology(topo)
    assert "1.8 TB/s" in text and re.search(r"infiniband +16 x +50 GB/s", text) and "spine " in text
    # the node names a `faults.step` link takes (docs/faults.md sends users here for them)
    assert re.search(r"GPU +16  h0/gpu0 \.\. h1/gpu7\n", text) and re.search(r"spine +16  spine0 \.\. spine15\n", text)
    assert re.search(r"leaf +8  leaf0\.r0 \.\. leaf0\.r7\n", text)
    one = describe_topology(load_topology("dgx-h100"))  # said '1 hosts', '1 rail(s)', 'each of 1 hosts/...'
    assert "8 GPUs (h100-sxm) on 1 host, 8 GPUs per host, 1 rail\n" in one
    assert one.endswith("1.8 TB/s  (1 NVLink domain)")


def test_describe_gives_a_partly_filled_last_rack_its_own_nvlink_bisection():
    """Three GB200 racks, the last of 5 trays (20 GPUs): each full rack's 72 x 900 GB/s / 2 = 32.4 TB/s and the
    last rack's 20 x 900 GB/s / 2 = 9 TB/s, not their average 24.6 TB/s labelled 'each of 3'. Each figure names
    what it is each of: an NVLink domain (a rack) for the NVSwitch tier, a host (a tray) for its 4 GPUs' PCIe links
    to their NICs, 4 x 64 GB/s / 2."""
    topo = load_topology("gb200-nvl72", {"racks": 3, "last_rack_trays": 5, "leaf_ports": 8})
    bisection = dict(tier_bisection(topo))
    assert bisection["GPU-NVSwitch"] == ((pytest.approx(72 * 9e11 / 2, rel=REL), 2, "nvlink_domain"),
                                         (pytest.approx(20 * 9e11 / 2, rel=REL), 1, "nvlink_domain"))
    assert bisection["GPU-NIC"] == ((pytest.approx(4 * 64e9 / 2, rel=REL), 41, "host"),)
    text = describe_topology(topo)
    assert re.search(r"GPU-NVSwitch +32\.4 TB/s  \(each of 2 NVLink domains\), 9 TB/s \(1 "
                     r"NVLink domain\)\n", text)
    assert re.search(r"GPU-NIC +128 GB/s  \(each of 41 hosts\)\n", text)


def test_describe_says_what_a_fabric_wired_for_more_hosts_is_wired_for():
    """5 hosts on the fabric of 12 (`fabric_hosts`): the header says the fabric is wired for 12 hosts, and the
    switch tiers' bisections, those of the 12 hosts' wiring (the full fabric's leaf-spine 2.4 TB/s), say so; the
    tiers the 5 hosts attach through do not."""
    params = {"leaf_ports": 2, "tiers": 3, "pods": 3}
    text = describe_topology(load_topology("dgx-h100-cluster", {**params, "nodes": 5, "fabric_hosts": 12}))
    assert text.startswith("topology dgx-h100-cluster (cluster): 40 GPUs (h100-sxm) on 5 hosts, 8 GPUs per host, "
                           "8 rails, fabric wired for 12 hosts\n")
    assert re.search(r"\n  NIC-leaf +1 TB/s  \(whole fabric\)\n  leaf-spine +2\.4 TB/s  \(whole fabric, as wired "
                     r"for 12 hosts; under-subscribed: carries at most the NIC-leaf tier's 1 TB/s\)\n  spine-core +"
                     r"2\.4 TB/s  \(whole fabric, as wired for 12 hosts; under-subscribed: carries at most the "
                     r"NIC-leaf tier's 1 TB/s\)$", text)
    full = describe_topology(load_topology("dgx-h100-cluster", {**params, "nodes": 12}))
    assert "wired" not in full and re.search(r"\n  leaf-spine +2\.4 TB/s  \(whole fabric\)\n", full)


@pytest.mark.parametrize("params, said", [
    ({"nodes": 40}, "leaf-spine                12.8 TB/s  (whole fabric; under-subscribed: carries at most the "
                    "NIC-leaf tier's 8 TB/s)"),
    ({"nodes": 64}, "leaf-spine                12.8 TB/s  (whole fabric)")])
def test_describe_says_a_fabric_tier_above_what_the_tiers_below_carry_is_under_subscribed(params, said):
    """A partly populated leaf group's uplinks are sized for every port: 40 DGX H100 hosts (8 in the second group of
    32) have 12.8 TB/s of leaf-spine over 8 TB/s of NICs, which it is said to carry at most, no leaf having more
    below it than above; with both groups full, the tiers are even."""
    text = describe_topology(load_topology("dgx-h100-cluster", params))
    assert text.endswith(f"  {said}")


@pytest.mark.parametrize("params, said", [
    ({"nodes": 40, "oversubscription": 2},
     "leaf-spine                 6.4 TB/s  (whole fabric; oversubscribed 2:1 at its leaves, the fabric's bisection "
     "1.25:1 against the NIC-leaf tier's 8 TB/s)"),
    ({"nodes": 36, "oversubscription": 2},
     "leaf-spine                 6.4 TB/s  (whole fabric; oversubscribed 2:1 at its leaves, the fabric's bisection "
     "1.125:1 against the NIC-leaf tier's 7.2 TB/s)"),
    ({"nodes": 64, "oversubscription": 1024},
     "leaf-spine                12.5 GB/s  (whole fabric; oversubscribed 1,024:1 at its leaves, the fabric's "
     "bisection 1,024:1 against the NIC-leaf tier's 12.8 TB/s)"),
    ({"nodes": 40, "tiers": 3, "pods": 2, "core_oversubscription": 4},
     "spine-core                 3.2 TB/s  (whole fabric; oversubscribed 4:1 at its spines, the fabric's bisection "
     "2.5:1 against the NIC-leaf tier's 8 TB/s; pod to pod: 3.2 TB/s out of each of 2 pods)"),
    ({"nodes": 40, "tiers": 3, "pods": 2, "core_oversubscription": 1.25},
     "spine-core               10.24 TB/s  (whole fabric; oversubscribed 1.25:1 at its spines, the fabric's "
     "bisection above the NIC-leaf tier's 8 TB/s; pod to pod: 10.24 TB/s out of each of 2 pods)")])
def test_describe_says_the_worst_switchs_downlink_to_uplink_ratio_apart_from_the_bisection(params, said):
    """`oversubscription` sets each leaf's downlink : uplink ratio, which a partly filled leaf group or pod leaves
    unlike the whole fabric's bisection ratio: 40 DGX H100 hosts 2:1 have full-group leaves at 2:1 (32 NICs of
    50 GB/s under 800 GB/s of uplinks) and a bisection of 1.25:1; 36 hosts 1.125:1, written whole; 1,024:1 without
    an exponent; three tiers in 2 pods of one leaf group each, `core_oversubscription: 4`, have spines at 4:1 over
    a bisection of 2.5:1, and at 1.25:1 spines oversubscribed though the spine-core tier exceeds the NICs."""
    text = describe_topology(load_topology("dgx-h100-cluster", params))
    assert text.endswith(f"  {said}")


@pytest.mark.parametrize("uplink, said", [
    ("50 GB/s", "oversubscribed 4:1 at sw, the worst of 2 switches with uplinks"),
    ("200 GB/s", "none oversubscribed, 2 switches with uplinks")])
def test_describe_gives_a_graph_switchs_ratio_by_hops_from_the_gpus(uplink, said):
    """Graph switches have no tiers: below and above are by hops from the nearest GPU, so `sw` with GPUs a and b
    (100 GB/s each) under it and a 50 GB/s link to the top switch is 4:1, and `edge` (GPU c, 100 GB/s up) 1:1."""
    nodes = [{"name": "a", "kind": "gpu"}, {"name": "b", "kind": "gpu"}, {"name": "c", "kind": "gpu"},
             {"name": "sw", "kind": "switch"}, {"name": "edge", "kind": "switch"}, {"name": "top", "kind": "switch"}]
    links = [{"a": a, "b": b, "bandwidth": bandwidth, "latency": "1 us", "class": "ethernet"}
             for a, b, bandwidth in [("a", "sw", "100 GB/s"), ("b", "sw", "100 GB/s"), ("c", "edge", "100 GB/s"),
                                     ("sw", "top", uplink), ("edge", "top", "100 GB/s")]]
    text = describe_topology(build_topology("graph", {"nodes": nodes, "links": links}))
    assert text.endswith(f"\nswitch downlink : uplink (below and above by hops from the GPUs): {said}")


def test_draw_small_and_refuse_large(tmp_path):
    out = draw_topology(load_topology("dgx-a100-cluster"), tmp_path / "a100.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(TopologyError, match="too many"):
        draw_topology(load_topology("dgx-h100-cluster", {"nodes": 32}), tmp_path / "big.png")


@pytest.mark.parametrize("kind, params", [
    ("cluster", {"nodes": 96, "leaf_ports": 4, "tiers": 3, "pods": 3, "spines": 4}),
    ("cluster", {"nodes": 12, "node": {"kind": "pcie_node"}, "nics_per_node": 2, "leaf_ports": 4}),
    ("nvl72", {"racks": 3, "leaf_ports": 8}),
    ("nvl72", {"racks": 3, "leaf_ports": 8, "last_rack_trays": 5}),
])
def test_link_id_routes_follow_the_node_routes(kind, params):
    """`Topology.path` asks the fabric for link ids put together from cached pieces; they must be the links of
    the node-name route for every pair and channel (3 tiers across pods, shared NICs, multi-host domains)."""
    topo = build_topology(kind, params)
    rng = random.Random(0)
    for _ in range(3000):
        src, dst, channel = rng.randrange(topo.num_gpus), rng.randrange(topo.num_gpus), rng.randrange(4)
        assert topo.path(src, dst, channel) == topo.link_ids(topo._route_nodes(src, dst, channel))


@pytest.mark.parametrize("kind, params", [
    ("cluster", {"nodes": 96, "leaf_ports": 4, "tiers": 3, "pods": 3, "spines": 4}),
    ("cluster", {"nodes": 12, "node": {"kind": "pcie_node"}, "nics_per_node": 2, "leaf_ports": 4}),
    ("cluster", {"nodes": 8, "node": {"kind": "nvswitch_node", "gpus": 1}, "nics_per_node": 1}),
    ("nvl72", {"racks": 3, "leaf_ports": 8}),
    ("nvl72", {"racks": 3, "leaf_ports": 8, "last_rack_trays": 5}),
    ("nvswitch_node", {}),
])
def test_routes_at_once_are_the_routes_one_by_one(kind, params):
    """`Topology.routes` (the fabric's array form, for large phases) gives each (src, dst, channel) the links of
    `route` and the same latency to the bit, for pairs in one domain (one switch level or a PCIe tree), across
    leaves, spines and pods, and from a GPU to itself; also where a rerouter (no array form) routes."""
    topo = build_topology(kind, params)
    rng = np.random.default_rng(0)
    src, dst, channel = (rng.integers(0, topo.num_gpus, 2000), rng.integers(0, topo.num_gpus, 2000),
                         rng.integers(0, 4, 2000))
    src[:20] = dst[:20]
    for _ in range(2):
        matrix, latency = topo.routes(src, dst, channel)
        for row, ends in enumerate(zip(src.tolist(), dst.tolist(), channel.tolist())):
            assert tuple(link for link in matrix[row].tolist() if link >= 0) == topo.route(*ends)[0]
            assert latency[row] == topo.route(*ends)[1]
        Rerouter(topo)
        topo.forget_routes()


@pytest.mark.parametrize("kind, params", [
    ("cluster", {"nodes": 96, "leaf_ports": 4, "tiers": 3, "pods": 3, "spines": 4}),
    ("cluster", {"nodes": 12, "node": {"kind": "pcie_node"}, "nics_per_node": 2, "leaf_ports": 4}),
    ("nvswitch_node", {}),
    ("nvl72", {"racks": 3, "leaf_ports": 8}),
    ("nvl72", {"racks": 3, "leaf_ports": 8, "last_rack_trays": 5}),
])
def test_hop_signatures_at_once_are_the_hop_signatures_one_by_one(kind, params):
    """`Topology.hop_signatures` gives each pair the hops `hop_signature` reads off its route, within a domain,
    across leaves, spines, pods and racks, and from a GPU to itself (no hops); also with every seventh link
    degraded to half its rate (the hops carry the link's bandwidth, not its line rate) and where a rerouter
    routes."""
    topo = build_topology(kind, params)
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, topo.num_gpus, 500).tolist(), rng.integers(0, topo.num_gpus, 500).tolist()
    src[:10] = dst[:10]
    for degraded in (False, True, True):
        if degraded:
            topo.degrade(range(0, len(topo.link_bandwidth), 7), 0.5)
        assert topo.hop_signatures(src, dst) == [tuple(topo.hop_signature(*ends)) for ends in zip(src, dst)]
        Rerouter(topo)
        topo.forget_routes()


def test_links_added_in_bulk_wire_as_one_by_one():
    """`add_links` (the builders' bulk path) gives the nodes, edges, attributes and order of `add_link` per pair,
    refuses a bad bandwidth as it does, and a later `add_edge` changes one edge, not the others sharing its dict."""
    ends = [("g0", "s"), ("g1", "s"), ("s", "leaf")]
    one_by_one, bulk = Wiring(), Wiring()
    for a, b in ends:
        add_link(one_by_one, a, b, bandwidth=5e9, latency=1e-6, link_class="nvlink")
    add_links(bulk, ends, bandwidth=5e9, latency=1e-6, link_class="nvlink")
    assert list(bulk.nodes.items()) == list(one_by_one.nodes.items())
    assert list(bulk.edges.items()) == list(one_by_one.edges.items())
    bulk.add_edge("g0", "s", bandwidth=1e9)
    assert bulk.edges[("g0", "s")]["bandwidth"] == 1e9 and bulk.edges[("g1", "s")]["bandwidth"] == 5e9
    assert bulk.edges[("s", "g0")]["bandwidth"] == 5e9
    with pytest.raises(TopologyError, match="link g0 <-> s has bandwidth 0"):
        add_links(Wiring(), ends, bandwidth=0, latency=1e-6, link_class="nvlink")


def test_cli_draw_into_a_new_folder_and_refuse_a_large_one_on_the_command_line(tmp_path, capsys):
    """`topo draw -o new/t.png` creates the folder, as `plot` does (no status 1, No such file or directory); a topology
    too large to draw is located on the command line, not at '<input>'."""
    assert main(["topo", "draw", "dgx-h100", "-o", str(tmp_path / "new" / "t.png")]) == 0
    assert (tmp_path / "new" / "t.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    with warnings.catch_warnings():  # a lone GPU: no links, so no legend (matplotlib warned of an empty one)
        warnings.simplefilter("error")
        assert main(["topo", "draw", "dgx-h100", "--set", "gpus=1", "-o", str(tmp_path / "one.png")]) == 0
    assert main(["topo", "draw", "dgx-h100-cluster", "--set", "nodes=128", "-o", str(tmp_path / "big.png")]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim topo: TOPOLOGY: topology dgx-h100-cluster has 2,224 nodes, too many to draw "
        "(allowed: at "
        "most 512 nodes (GPUs, switches, NICs): fewer servers, or topo describe)\n")
    assert not (tmp_path / "big.png").exists()


def test_a_scenario_reads_its_topology_file_relative_to_its_own_folder(tmp_path, capsys):
    """As its trace and schedule table are: the path was read from the working folder, so a scenario beside
    its topology file ran only from that folder, and a missing file was not located in the scenario."""
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "mine.yaml").write_text("kind: nvswitch_node\ngpus: 4\n")
    scenario = folder / "s.yaml"
    scenario.write_text("cluster: {topology: mine.yaml}\nworkload: [{op: all_reduce, bytes: 1 MiB}]\n")
    assert main(["validate", str(scenario)]) == 0
    assert capsys.readouterr().out == f"{scenario}: valid (4 h100-sxm GPUs on mine)\n"
    scenario.write_text("description: x\ncluster: {topology: sub/none.yaml}\n"
                        "workload: [{op: all_reduce, bytes: 1 MiB}]\n")
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (
        f"error: {scenario}:2: cluster.topology: no topology file {folder / 'sub' / 'none.yaml'} (allowed: a "
        "bundled topology's name, or a YAML file's path relative to the scenario)\n")


@pytest.mark.parametrize("command", [["collective", "--topology", "dgx-h100", "--sizes", "1MiB"],
                                     ["topo", "describe", "dgx-h100"]], ids=["collective", "topo"])
def test_a_gpu_changed_by_a_set_of_collective_or_topo_is_warned_at_the_set(capsys, command):
    """`trainsim collective --topology dgx-h100 --set gpu_model=a100-80gb` timed an A100 on the H100's NVLink
    (busbw 341 GB/s) without a word, though a scenario's same override is warned (docs/topologies.md)."""
    assert main([*command, "--set", "gpu_model=a100-80gb"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"warning: command line: trainsim {command[0]}: --set gpu_model=a100-80gb: gpu_model "
                          "a100-80gb: the node keeps the topology file's nvls (NVLink SHARP)")
    assert err.count("\n") == 1


def test_a_one_gpu_server_given_another_gpu_is_not_warned_of_nvls(tmp_path, capsys):
    """A server of one GPU has no NVLink, nor NVLink SHARP: `gpus: 1` on dgx-h100 given an A100 was warned that it
    kept the file's nvls."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text("cluster: {topology: dgx-h100, gpus: 1}\nmodel: {preset: llama3-8b, layers: 4}\n"
                        "training: {seq_len: 1024, global_batch: 8}\n")
    assert main(["validate", str(scenario), "--set", "cluster.gpu_model=a100-80gb"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_topo_describe_of_a_scenario_says_a_scenario_was_given(tmp_path, capsys):
    """`trainsim topo describe l8b32.yaml` (a scenario) says a scenario was given where a topology is expected, and
    names its topology, not `kind: missing 'kind'` as if a topology file had left its kind out."""
    path = tmp_path / "l8b32.yaml"
    path.write_text("cluster: {topology: dgx-h100-cluster, nodes: 4}\nmodel: {preset: llama3-8b}\n")
    assert main(["topo", "describe", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}:1: a scenario, not a topology: its cluster is the topology dgx-h100-cluster (allowed: a "
        "topology's name or file, such as the scenario's dgx-h100-cluster (its other cluster parameters as --set "
        "name=value))\n")


def test_topo_describe_of_a_scenario_names_its_topology_file_as_typed_from_the_working_folder(tmp_path, monkeypatch,
                                                                                               capsys):
    """The scenario's topology file is named by its path from the working folder (`sub/node.yaml`), which the user can
    type, not relative to the scenario's folder (`node.yaml`)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    Path("sub/base.yaml").write_text("cluster: {topology: node.yaml}\nmodel: {preset: llama3-8b}\n")
    assert main(["topo", "describe", "sub/base.yaml"]) == 2
    assert "a scenario, not a topology: its cluster is the topology sub/node.yaml (" in capsys.readouterr().err


def test_topo_describe_of_a_bundled_scenarios_name_says_it_is_a_scenario(capsys):
    """A bundled scenario's name is answered as a scenario, not as an unknown topology with the list of topologies."""
    assert main(["topo", "describe", "llama3-8b-dgx-h100-dp8"]) == 2
    assert "TOPOLOGY: a scenario, not a topology: its cluster is the topology dgx-h100 (" in capsys.readouterr().err
