"""Equal-cost multi-path routing on `graph` topologies, and the messages of link faults on them."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import networkx as nx
import pytest
import yaml

from simulator.config.faults import LinkFault
from simulator.engine.faults import FaultHooks
from simulator.errors import ScenarioError, StepAborted, TopologyError
from simulator.faults.rerouting import Rerouter
from simulator.faults.step import LinkEvent, StepFaultPlan, _link_event
from simulator.topology.builders import build_topology
from simulator.topology.ecmp import flow_key, hashed_walk
from simulator.topology.graph import Topology

CORE_UP = [("p0.spine0", "core0"), ("p0.spine1", "core0")]


def two_pods() -> dict:
    """2 pods of 2 DGX-like hosts, a rail leaf per pod and rail, two pod spines, one core reached from each pod by
    two 100 GB/s links (4:1 against the pod's 16 x 50 GB/s NICs)."""
    nodes, links = [], []

    def link(a: str, b: str, bandwidth: str, latency: str, kind: str) -> None:
        links.append({"a": a, "b": b, "bandwidth": bandwidth, "latency": latency, "class": kind})

    for host in range(4):
        nodes.append({"name": f"h{host}/nvswitch", "kind": "nvswitch"})
        for gpu in range(8):
            nodes += [{"name": f"h{host}/gpu{gpu}", "kind": "gpu", "host": host},
                      {"name": f"h{host}/nic{gpu}", "kind": "nic"}]
    for pod in range(2):
        nodes += [{"name": f"p{pod}.leaf.r{rail}", "kind": "switch"} for rail in range(8)]
        nodes += [{"name": f"p{pod}.spine{spine}", "kind": "switch"} for spine in range(2)]
    nodes.append({"name": "core0", "kind": "switch"})
    for host in range(4):
        for gpu in range(8):
            link(f"h{host}/gpu{gpu}", f"h{host}/nvswitch", "450 GB/s", "1.7 us", "nvlink")
            link(f"h{host}/gpu{gpu}", f"h{host}/nic{gpu}", "64 GB/s", "3.25 us", "pcie")
            link(f"h{host}/nic{gpu}", f"p{host // 2}.leaf.r{gpu}", "400 Gb/s", "3.25 us", "infiniband")
    for pod in range(2):
        for rail in range(8):
            for spine in range(2):
                link(f"p{pod}.leaf.r{rail}", f"p{pod}.spine{spine}", "50 GB/s", "0.5 us", "infiniband")
        for spine in range(2):
            link(f"p{pod}.spine{spine}", "core0", "100 GB/s", "0.5 us", "infiniband")
    return {"nodes": nodes, "links": links, "rails": 8}


def cross_pod_routes(topology: Topology) -> dict[tuple[int, int, int], list[tuple[str, str]]]:
    """Every route from a pod-0 GPU to a pod-1 GPU on channels 0 and 1, as node pairs."""
    return {(src, dst, channel): [topology.link_ends[link] for link in topology.path(src, dst, channel)]
            for src in range(16) for dst in range(16, 32) for channel in range(2)}


def core_uplink_counts(routes: dict) -> Counter:
    return Counter(edge for route in routes.values() for edge in route if edge in CORE_UP)


def test_cross_pod_routes_spread_over_both_core_links_on_fewest_links() -> None:
    topology = build_topology("graph", two_pods())
    routes = cross_pod_routes(topology)
    counts = core_uplink_counts(routes)
    assert set(counts) == set(CORE_UP)
    assert min(counts.values()) > 0.4 * len(routes)
    same_rail = [route for (src, dst, _), route in routes.items() if src % 8 == dst % 8]
    assert {len(route) for route in same_rail} == {8}
    assert cross_pod_routes(build_topology("graph", two_pods())) == routes


def test_link_down_moves_its_routes_onto_the_other_core_link() -> None:
    topology = build_topology("graph", two_pods())
    before = cross_pod_routes(topology)
    assert all(core_uplink_counts(before)[edge] > 0 for edge in CORE_UP)
    rerouter = Rerouter(topology)
    rerouter.take_down([CORE_UP[0]])
    after = cross_pod_routes(topology)
    assert core_uplink_counts(after) == Counter({CORE_UP[1]: len(after)})
    assert all(after[key] == route for key, route in before.items() if CORE_UP[1] in route)
    assert rerouter.rerouted == core_uplink_counts(before)[CORE_UP[0]]


def all_routes(topology: Topology) -> dict[tuple[int, int, int], list[tuple[str, str]]]:
    """Every route between two GPUs on channels 0 and 1, as node pairs."""
    return {(src, dst, channel): [topology.link_ends[link] for link in topology.path(src, dst, channel)]
            for src in range(topology.num_gpus) for dst in range(topology.num_gpus) if src != dst
            for channel in range(2)}


def test_detours_do_not_depend_on_the_order_or_direction_the_file_lists_links_in() -> None:
    spec = two_pods()
    shuffled = {**spec, "links": [dict(link) for link in spec["links"]]}
    random.Random(7).shuffle(shuffled["links"])
    for link in shuffled["links"][::2]:
        link["a"], link["b"] = link["b"], link["a"]
    routes = []
    for listing in (spec, shuffled):
        topology = build_topology("graph", listing)
        Rerouter(topology).take_down([CORE_UP[0]])
        routes.append(all_routes(topology))
    assert len(routes[0]) == 1984
    assert routes[0] == routes[1]


def leaf_spine(hosts: int) -> dict:
    """``hosts`` hosts of 2 GPUs, each GPU with a NIC on its host's leaf (4 hosts a leaf), 4 spines."""
    nodes = [{"name": f"s{spine}", "kind": "switch"} for spine in range(4)]
    nodes += [{"name": f"l{leaf}", "kind": "switch"} for leaf in range(hosts // 4)]
    links = [{"a": f"l{leaf}", "b": f"s{spine}", "bandwidth": "100 GB/s", "latency": "1 us", "class": "ethernet"}
             for leaf in range(hosts // 4) for spine in range(4)]
    for host in range(hosts):
        nodes.append({"name": f"h{host}/nvswitch", "kind": "nvswitch"})
        for gpu in range(2):
            name = f"h{host}/gpu{gpu}"
            nodes += [{"name": name, "kind": "gpu", "host": host}, {"name": f"{name}.nic", "kind": "nic"}]
            links += [{"a": name, "b": f"h{host}/nvswitch", "bandwidth": "450 GB/s", "latency": "1 us",
                       "class": "nvlink"},
                      {"a": name, "b": f"{name}.nic", "bandwidth": "64 GB/s", "latency": "1 us", "class": "pcie"},
                      {"a": f"{name}.nic", "b": f"l{host // 4}", "bandwidth": "50 GB/s", "latency": "1 us",
                       "class": "ethernet"}]
    return {"nodes": nodes, "links": links}


def pair_by_pair(topology: Topology, src: int, dst: int, channel: int) -> list[str]:
    """The route the hash picks among the pair's own fewest-link routes, with next hops from networkx's distances
    rather than the router's search back from the destination, on the graph without the other GPUs (which forward
    nothing; these graphs' NICs have one port on each side, so no route crosses one from a side to the same)."""
    ends = {topology.gpus[src], topology.gpus[dst]}
    graph = topology.graph.subgraph(node for node, kind in topology.graph.nodes(data="kind")
                                    if kind != "gpu" or node in ends)
    target = topology.gpus[dst]
    distance = nx.shortest_path_length(graph, target=target)

    def next_hops(node: str) -> list[str]:
        return sorted(v for v in graph.successors(node) if distance.get(v) == distance[node] - 1)

    return hashed_walk(topology.gpus[src], target, next_hops, flow_key(topology.num_gpus, src, dst, channel))


@pytest.mark.parametrize("spec", [two_pods(), leaf_spine(64)], ids=["two-pods", "64-hosts"])
def test_one_search_per_destination_gives_each_pairs_fewest_link_routes(spec: dict) -> None:
    topology = build_topology("graph", spec)
    step = max(1, topology.num_gpus // 16)
    for src in range(0, topology.num_gpus, step):
        for dst in range(topology.num_gpus):
            for channel in range(2):
                if src != dst:
                    assert topology.router(topology, src, dst, channel) == pair_by_pair(topology, src, dst, channel)


def test_no_route_passes_through_a_third_gpu_on_the_two_pods() -> None:
    topology = build_topology("graph", two_pods())
    kinds = dict(topology.graph.nodes(data="kind"))
    routes = all_routes(topology)
    assert len(routes) == 1984
    assert not [route for route in routes.values() if any(kinds[u] == "gpu" for u, _ in route[1:])]


def shortcut_graph(shortcut: str) -> dict:
    """GPUs g0 and g1 on switches a and b, which reach each other over two more switches (a-c-d-b), and a shorter
    way between them through a node that forwards nothing: ``shortcut`` 'gpu', a third GPU g2 cabled to both by
    NVLink; 'nic', a NIC x of g2's with a port on each switch."""
    def link(a: str, b: str, kind: str = "ethernet") -> dict:
        return {"a": a, "b": b, "bandwidth": "50 GB/s", "latency": "1 us", "class": kind}

    nodes = [{"name": name, "kind": "switch"} for name in "abcd"]
    nodes += [{"name": f"g{index}", "kind": "gpu", "host": index} for index in range(3)]
    links = [link("g0", "a"), link("g1", "b"), link("a", "c"), link("c", "d"), link("d", "b")]
    if shortcut == "gpu":
        links += [link("g2", "a", "nvlink"), link("g2", "b", "nvlink")]
    else:
        nodes.append({"name": "x", "kind": "nic"})
        links += [link("g2", "x", "pcie"), link("x", "a"), link("x", "b")]
    return {"nodes": nodes, "links": links}


@pytest.mark.parametrize("shortcut", ["gpu", "nic"])
def test_a_route_takes_the_switches_where_a_gpu_or_a_nic_would_be_shorter(shortcut: str) -> None:
    topology = build_topology("graph", shortcut_graph(shortcut))
    for channel in range(4):
        assert topology.router(topology, 0, 1, channel) == ["g0", "a", "c", "d", "b", "g1"]
        assert topology.router(topology, 1, 0, channel) == ["g1", "b", "d", "c", "a", "g0"]
    assert topology.router(topology, 0, 2, 0) == (["g0", "a", "g2"] if shortcut == "gpu" else ["g0", "a", "x", "g2"])


def test_a_gpu_reached_only_through_another_gpu_is_relayed_by_it() -> None:
    spec = shortcut_graph("gpu")
    spec["nodes"].append({"name": "g3", "kind": "gpu", "host": 2})
    spec["links"].append({"a": "g3", "b": "g2", "bandwidth": "50 GB/s", "latency": "1 us", "class": "nvlink"})
    topology = build_topology("graph", spec)
    assert topology.router(topology, 3, 1, 0) == ["g3", "g2", "b", "g1"]
    assert topology.router(topology, 1, 3, 0) == ["g1", "b", "g2", "g3"]
    assert topology.router(topology, 0, 1, 0) == ["g0", "a", "c", "d", "b", "g1"]


def test_only_gpus_of_the_two_ends_hosts_relay() -> None:
    """GPU h of host 0 has no way out but its NVLink peer g0: its routes to g1 and back go through g0 and the
    switches, not through g2 of host 2, whose NVLinks to both switches are a shorter way that a GPU of a third
    host does not forward on (NCCL's PXN relays through a peer of the sender's host only)."""
    spec = shortcut_graph("gpu")
    spec["nodes"].append({"name": "h", "kind": "gpu", "host": 0})
    spec["links"].append({"a": "h", "b": "g0", "bandwidth": "50 GB/s", "latency": "1 us", "class": "nvlink"})
    topology = build_topology("graph", spec)
    h = topology.gpus.index("h")
    for channel in range(4):
        assert topology.router(topology, h, 1, channel) == ["h", "g0", "a", "c", "d", "b", "g1"]
        assert topology.router(topology, 1, h, channel) == ["g1", "b", "d", "c", "a", "g0", "h"]


def test_a_gpu_whose_only_way_out_is_another_hosts_gpu_is_refused_at_load() -> None:
    spec = shortcut_graph("gpu")
    spec["nodes"].append({"name": "g3", "kind": "gpu", "host": 3})
    spec["links"].append({"a": "g3", "b": "g2", "bandwidth": "50 GB/s", "latency": "1 us", "class": "nvlink"})
    with pytest.raises(TopologyError, match="'g3' cannot be reached from 'g0'"):
        build_topology("graph", spec)
    # listed first, g2 (g3's relay) reaches every GPU, so the check against it alone let g3 through
    spec["nodes"].sort(key=lambda node: node["name"] != "g2")
    with pytest.raises(TopologyError, match=r"'g3' cannot be reached from '(g0|g1)'"):
        build_topology("graph", spec)


def test_gpus_sharing_a_nic_reach_each_other_through_it_not_through_the_switch() -> None:
    """g0 and g1 of host 0 hang off NIC x, g2 and g3 of host 1 off NIC y, both NICs on switch sw: a NIC forwards
    between the GPUs of its host, as the PCIe path it hangs off does, so g0 to g1 does not leave the host, and
    between hosts a route enters and leaves each NIC once."""
    def link(a: str, b: str, kind: str = "pcie") -> dict:
        return {"a": a, "b": b, "bandwidth": "50 GB/s", "latency": "1 us", "class": kind}

    nodes = [{"name": "sw", "kind": "switch"}, {"name": "x", "kind": "nic"}, {"name": "y", "kind": "nic"}]
    nodes += [{"name": f"g{index}", "kind": "gpu", "host": index // 2} for index in range(4)]
    links = [link("g0", "x"), link("g1", "x"), link("g2", "y"), link("g3", "y"), link("x", "sw", "ethernet"),
             link("y", "sw", "ethernet")]
    topology = build_topology("graph", {"nodes": nodes, "links": links})
    assert topology.router(topology, 0, 1, 0) == ["g0", "x", "g1"]
    assert topology.router(topology, 3, 2, 0) == ["g3", "y", "g2"]
    assert topology.router(topology, 0, 3, 0) == ["g0", "x", "sw", "y", "g3"]


def test_ring_all_reduce_takes_the_time_of_its_busiest_core_link(tmp_path) -> None:
    """The 8 rings cross between the pods once each way: 8 flows each way, hashed 3/5 and 6/2 onto the pods' core
    links up, 4/4 and 5/3 down. The busiest link carries 6, so each moves 2 * 31/32 * (4 GiB / 8) at 100/6 GB/s:
    62.4 ms (one link for all: 83.2 ms; an even split: 41.6 ms)."""
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump({"name": "pods", "kind": "graph", **two_pods()}))
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "collective", "--topology", str(path), "--op",
                          "all_reduce", "--algorithm", "ring", "--sizes", "4GiB", "--efficiency", "ideal"],
                         capture_output=True, text=True, check=True).stdout
    time_s = float(out.strip().splitlines()[-1].split()[3]) * 1e-6
    busiest_link = 2 * 31 / 32 * (4 * 2**30 / 8) / (100e9 / 6)
    assert time_s == pytest.approx(busiest_link, rel=0.01)


def test_uplinks_of_a_graph_switch_says_graph_switches_have_no_tiers() -> None:
    topology = build_topology("graph", two_pods())
    with pytest.raises(ScenarioError, match=r"graph topology.*no tiers"):
        _link_event(LinkFault(uplinks_of="p0.spine0"), "faults.step.links[0]", topology)


def test_partition_abort_names_every_link_fault_that_cut_the_route() -> None:
    topology = build_topology("graph", two_pods())
    plan = StepFaultPlan(links=tuple(LinkEvent(0.0, (edge,), 0.0, f"{edge[0]}-{edge[1]}") for edge in CORE_UP))
    with pytest.raises(StepAborted, match=r"p0\.spine0-core0, p0\.spine1-core0 down: .* cannot reach"):
        FaultHooks(topology, plan)


def test_a_nic_no_gpu_reaches_is_warned_of_at_its_line(tmp_path) -> None:
    spec = two_pods()
    spec["links"] = [link for link in spec["links"] if (link["a"], link["b"]) != ("h3/gpu7", "h3/nic7")]
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump({"name": "pods", "kind": "graph", **spec}, default_flow_style=None, width=200))
    line = 1 + path.read_text().splitlines().index("- {kind: nic, name: h3/nic7}")
    done = subprocess.run([sys.executable, "-m", "simulator.cli", "topo", "describe", str(path)],
                          capture_output=True, text=True, check=True)
    index = next(i for i, node in enumerate(spec["nodes"]) if node["name"] == "h3/nic7")
    assert done.stderr == (f"warning: {path}:{line}: nodes[{index}]: NIC 'h3/nic7' has no link to a GPU, directly or "
                           "through PCIe switches or host bridges, so no GPU sends through it (allowed: a link from "
                           "the NIC to its GPU or PCIe switch)\n")
    path.write_text(yaml.safe_dump({"name": "pods", "kind": "graph", **two_pods()}))
    assert subprocess.run([sys.executable, "-m", "simulator.cli", "topo", "describe", str(path)],
                          capture_output=True, text=True, check=True).stderr == ""
