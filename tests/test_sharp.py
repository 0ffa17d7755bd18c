"""In-network reduction over SHARP InfiniBand switches (`collnet_direct`, `nvls_sharp`): the bytes each NIC moves,
the time against the closed form at the calibrated link rates, `auto` taking it where the switches reduce and
never where they do not, the refusal on a fabric without SHARP, and folding."""

from __future__ import annotations

from collections import defaultdict

import pytest
from shared import GIB, SCENARIOS

from simulator import simulate
from simulator.catalog.calibration import nvls_efficiency
from simulator.catalog.sharp import collnet_direct_latency
from simulator.collectives import nvls, nvls_sharp
from simulator.collectives.busbw import bus_bandwidth
from simulator.collectives.execute import phase_items, time_collective
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.registry import plan_collective
from simulator.collectives.tuner import choose
from simulator.config.loader import load_scenario
from simulator.errors import ScenarioError, TopologyError
from simulator.network.calibration import calibrated
from simulator.topology.loader import load_topology

CALIBRATED = calibrated("h100-sxm")
NVLINK = 450e9 * CALIBRATED["nvlink"]
NIC = 50e9 * CALIBRATED["infiniband"]
IN_SWITCH = NVLINK * nvls_efficiency("h100-sxm")
"""What NVLS's in-switch reduction carries per second over each GPU's switch link (collectives/nvls.py)."""


def loads(topology, phases, lower: str, upper: str) -> tuple[dict[str, float], dict[str, float]]:
    """Bytes each node named with ``lower`` sends up to a node named with ``upper`` and receives from one, summed
    over the plan's transfers."""
    up: dict[str, float] = defaultdict(float)
    down: dict[str, float] = defaultdict(float)
    for phase in phases:
        for links, nbytes, *_ in phase_items(topology, phase):
            for link in links:
                a, b = topology.link_ends[link]
                if lower in a and b.startswith(upper):
                    up[a] += nbytes
                elif a.startswith(upper) and lower in b:
                    down[b] += nbytes
    return up, down


@pytest.mark.parametrize("algorithm, group, per_nic", [
    ("collnet_direct", tuple(range(0, 64, 8)), GIB),    # one GPU per host: the whole message up once, down once
    ("collnet_direct", tuple(range(64)), GIB / 8),      # eight per host: each head's n/8 slice
    ("nvls_sharp", tuple(range(64)), GIB / 8),
])
def test_each_nic_sends_its_share_up_once_and_receives_it_once(algorithm, group, per_nic):
    topology = load_topology("dgx-h100-superpod", {"nodes": 8, "leaf_ports": 4, "spines": 4})
    phases = plan_collective(CollectiveRequest("all_reduce", group, GIB), topology, algorithm)
    up, down = loads(topology, phases, "/nic", "leaf")
    nics = {topology.router.nic[rank] for rank in group}
    assert set(up) == set(down) == nics
    assert all(up[nic] == down[nic] == per_nic for nic in nics)


def test_each_leaf_sends_the_rail_aggregate_to_the_spines_once_each_way_whatever_the_rank_order():
    """One GPU per host over four leaf groups, ranks listed across leaves: each leaf carries n up to the spines
    once and n down once, as a SHARP tree's leaf does."""
    topology = load_topology("dgx-h100-superpod", {"nodes": 8, "leaf_ports": 2, "spines": 4})
    phases = plan_collective(CollectiveRequest("all_reduce", (0, 32, 8, 40, 16, 48, 24, 56), GIB), topology,
                             "collnet_direct")
    up, down = loads(topology, phases, "leaf", "spine")
    leaves = {f"leaf{group}.r0" for group in range(4)}
    assert set(up) == set(down) == leaves
    assert all(up[leaf] == down[leaf] == GIB for leaf in leaves)


def test_collnet_direct_time_and_busbw_follow_the_nic_bound_across_hosts():
    """One GPU per host (a DP group): L + n / NIC; busbw = 2 (p-1)/p n / t tends to 2 (p-1)/p x the NIC rate,
    beyond the ring's NIC rate."""
    topology = load_topology("dgx-h100-superpod", {"nodes": 16})
    group = tuple(range(0, 128, 8))
    seconds = time_collective(topology, "all_reduce", "collnet_direct", list(group), 4 * GIB,
                              efficiency=dict(CALIBRATED))
    expected = collnet_direct_latency(1) + 4 * GIB / NIC
    assert collnet_direct_latency(1) == 14e-6  # tuning.cc: with ppn=1, the Tree network latency
    assert seconds == pytest.approx(expected, rel=1e-9)
    assert bus_bandwidth("all_reduce", 16, 4 * GIB, seconds) == pytest.approx(2 * 15 / 16 * NIC, rel=2e-3)
    ring = time_collective(topology, "all_reduce", "ring", list(group), 4 * GIB, efficiency=dict(CALIBRATED))
    assert ring > 1.8 * expected


@pytest.mark.parametrize("algorithm, expected", [
    ("collnet_direct", collnet_direct_latency(8) + GIB * max(2 * 7 / 8 / NVLINK, 1 / (8 * NIC))),
    ("nvls_sharp", nvls_sharp.LATENCY + GIB * max(9 / 8 / IN_SWITCH, 1 / (8 * NIC))),
])
def test_full_hosts_take_the_slower_of_nvlink_and_the_nics(algorithm, expected):
    topology = load_topology("dgx-h100-superpod", {"nodes": 4})
    seconds = time_collective(topology, "all_reduce", algorithm, 32, GIB, efficiency=dict(CALIBRATED))
    assert seconds == pytest.approx(expected, rel=1e-9)


def test_auto_reduces_in_the_network_only_where_the_switches_do():
    sharp = load_topology("dgx-h100-superpod", {"nodes": 4})
    plain = load_topology("dgx-h100-cluster", {"nodes": 4})
    no_nvls = load_topology("dgx-h100-superpod", {"nodes": 4, "node": {"kind": "nvswitch_node", "nvls": "none"}})
    for size in (64 * 2**10, GIB):
        full = CollectiveRequest("all_reduce", tuple(range(32)), size, chunk_bytes=4 * 2**20)
        rail = CollectiveRequest("all_reduce", (0, 8, 16, 24), size, chunk_bytes=4 * 2**20)
        assert choose(full, sharp, protocol="simple").algorithm == "nvls_sharp"
        assert choose(full, no_nvls, protocol="simple").algorithm == "collnet_direct"
        assert choose(rail, sharp, protocol="simple").algorithm == "collnet_direct"
        assert choose(full, plain, protocol="simple").algorithm not in ("collnet_direct", "nvls_sharp")
    inside = CollectiveRequest("all_reduce", tuple(range(8)), GIB)
    assert choose(inside, sharp, protocol="simple").algorithm == "nvls"
    two = CollectiveRequest("all_reduce", (0, 8), 1024.0, chunk_bytes=4 * 2**20)
    # one GPU per host: NCCL's 14 us beats the ring's 2 x 13 us
    assert choose(two, sharp, protocol="simple").algorithm == "collnet_direct"


def test_refusals_name_the_reason():
    plain = load_topology("dgx-h100-cluster", {"nodes": 2})
    with pytest.raises(ScenarioError, match="no SHARP switches") as info:
        plan_collective(CollectiveRequest("all_reduce", tuple(range(16)), GIB), plain, "collnet_direct")
    assert info.value.field == "collectives.algorithm"
    sharp = load_topology("dgx-h100-superpod", {"nodes": 2})
    with pytest.raises(ScenarioError, match="does not implement reduce_scatter"):
        plan_collective(CollectiveRequest("reduce_scatter", tuple(range(16)), GIB), sharp, "collnet_direct")
    with pytest.raises(ScenarioError, match="one host"):
        plan_collective(CollectiveRequest("all_reduce", tuple(range(8)), GIB), sharp, "nvls_sharp")
    pcie = load_topology("dgx-h100-superpod", {"nodes": 2, "node": {"kind": "pcie_node"}})
    with pytest.raises(ScenarioError, match="no NVLink"):  # tuning.cc: no CollNetDirect without NVSwitches
        plan_collective(CollectiveRequest("all_reduce", (0, 8), GIB), pcie, "collnet_direct")
    assert choose(CollectiveRequest("all_reduce", (0, 8), GIB), pcie, protocol="simple").algorithm != "collnet_direct"
    with pytest.raises(TopologyError, match="sharp"):
        load_topology("ethernet-100g", {"sharp": "sharpv3"})


def test_nvls_sharp_beats_the_nvls_tree_where_the_nics_bound_it():
    """Across hosts without SHARP, `nvls` runs NCCL's tree over 8 heads a host, up to 2 n/8 per NIC on 4 hosts (it
    ran rail rings of 2 (N-1)/N n/8); with SHARP each NIC carries n/8 once, so the network part halves and NVLink
    becomes the bound."""
    topology = load_topology("dgx-h100-superpod", {"nodes": 4})
    tree = time_collective(topology, "all_reduce", "nvls", 32, GIB, efficiency=dict(CALIBRATED))
    sharp = time_collective(topology, "all_reduce", "nvls_sharp", 32, GIB, efficiency=dict(CALIBRATED))
    assert tree == pytest.approx(nvls.LATENCY + 2 * 2 * nvls.TREE_NET_LATENCY + 2 * GIB / (8 * NIC), rel=1e-9)
    assert sharp < tree


FOLDING = """
cluster: {topology: dgx-h100-superpod, nodes: 4, leaf_ports: 2, spines: 4}
model: {layers: 12, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
"""


@pytest.mark.parametrize("tp, dp, nvls_inside, algorithm", [
    (4, 8, "nvswitch3", "collnet_direct"),  # two GPUs per host: CollNet's latency is the lower, both NIC-bound
    (1, 32, "nvswitch3", "nvls_sharp"),     # full hosts: NVLink bounds CollNet's scatter and broadcast
    (1, 32, "none", "collnet_direct"),
])
def test_folded_and_unfolded_agree_with_in_network_reduction(run_yaml, tp, dp, nvls_inside, algorithm):
    """`auto` reduces the DP gradients in the network; the folded step is the unfolded one."""
    overrides = (f"cluster.node={{kind: nvswitch_node, nvls: {nvls_inside}}}", f"parallelism.tp={tp}",
                 f"parallelism.dp={dp}")
    topology = load_topology("dgx-h100-superpod", {"nodes": 4, "leaf_ports": 2, "spines": 4,
                                                   "node": {"kind": "nvswitch_node", "nvls": nvls_inside}})
    dp_group = CollectiveRequest("all_reduce", tuple(range(0, 32, tp)), 64 * 2**20, chunk_bytes=4 * 2**20)
    assert choose(dp_group, topology, protocol="simple").algorithm == algorithm
    folded = run_yaml(FOLDING, *overrides).summary
    unfolded = run_yaml(FOLDING, *overrides, "run.fold=false").summary
    assert folded["folded"] and "fold_off_reason" not in folded
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-9)


def test_the_bundled_scenario_shows_each_algorithm_at_its_closed_form():
    """scenarios/allreduce-sharp-dgx-h100.yaml: `auto` (NVLS + SHARP), CollNetDirect and the ring on 1 GiB over
    four full hosts, and a DP-style all-reduce of one GPU per host (CollNetDirect, the NIC bound)."""
    scenario = SCENARIOS / "allreduce-sharp-dgx-h100.yaml"
    rows = {row["name"]: row for row in simulate(load_scenario(str(scenario))).summary["collectives"]}
    assert rows["nvls-sharp"]["time_s"] == pytest.approx(
        nvls_sharp.LATENCY + GIB * max(9 / 8 / IN_SWITCH, 1 / (8 * NIC)), rel=1e-9)
    assert rows["collnet-direct"]["time_s"] == pytest.approx(
        collnet_direct_latency(8) + GIB * 2 * 7 / 8 / NVLINK, rel=1e-9)
    assert rows["ring"]["time_s"] > rows["collnet-direct"]["time_s"]
    assert rows["dp-rail0"]["time_s"] == pytest.approx(collnet_direct_latency(1) + GIB / 4 / NIC, rel=1e-9)
