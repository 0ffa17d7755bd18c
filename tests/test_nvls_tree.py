"""NVLS (in-switch reduction on NVLink SHARP) against its link-load closed form, `auto` choosing it where NCCL
does, and NCCL's per-host tree (chain inside a host, double binary tree across hosts)."""

from __future__ import annotations

import pytest
import simpy

from simulator.catalog.calibration import nvls_efficiency
from simulator.collective_sweep import collective_sweep
from simulator.collectives import nvls
from simulator.collectives.execute import run_plan, time_collective
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.registry import plan_collective
from simulator.collectives.ring import group_by_host
from simulator.collectives.tree import double_tree_all_reduce, host_tree_all_reduce
from simulator.collectives.tuner import choose
from simulator.errors import ScenarioError
from simulator.network.calibration import calibrated
from simulator.network.model import Network
from simulator.topology.loader import load_topology

GIB = 2.0**30
CALIBRATED = calibrated("h100-sxm")
NVLINK = 450e9 * CALIBRATED["nvlink"]
IN_SWITCH = NVLINK * nvls_efficiency("h100-sxm")
"""What NVLS's in-switch reduction carries per second over each GPU's switch link."""


def test_auto_all_reduce_on_8_h100_is_nvls_with_its_closed_form_busbw():
    topology = load_topology("dgx-h100", {})
    request = CollectiveRequest("all_reduce", tuple(range(8)), 8 * GIB)
    assert choose(request, topology, protocol="simple").algorithm == "nvls"
    row = collective_sweep("dgx-h100", {}, op="all_reduce", algorithm="auto", ranks=8, sizes=[8 * GIB])[0]
    # n (p+1)/p over each GPU's switch link at the in-switch rate after NCCL's 25 us NVLS latency; busbw =
    # 2 (p-1)/p n / t, the ring's NVLink busbw times 2 (p-1)/(p+1) and NCCL's nvlsEfficiency.
    expected = nvls.LATENCY + 8 * GIB * 9 / 8 / IN_SWITCH
    assert row["time_s"] == pytest.approx(expected, rel=1e-9)
    assert row["busbw_GBps"] == pytest.approx(2 * 7 / 9 * IN_SWITCH / 1e9, rel=1e-3)
    ring = collective_sweep("dgx-h100", {}, op="all_reduce", algorithm="ring", ranks=8, sizes=[8 * GIB])[0]
    assert row["busbw_GBps"] / ring["busbw_GBps"] == pytest.approx(2 * 7 / 9 * IN_SWITCH / NVLINK, rel=5e-3)


@pytest.mark.parametrize("ranks, chosen", [(2, "ring"), (3, "ring"), (4, "nvls")])
def test_auto_takes_nvls_only_where_it_moves_fewer_bytes_than_the_ring(ranks, chosen):
    """NVLS loads each switch link with n (p+1)/p against the ring's 2 (p-1)/p n: less only from 4 GPUs. auto took
    nvls for a TP 2 all-reduce too, 1.5 times slower than the ring it could have run (and NCCL's tuner takes the
    ring for small messages there: 8.4 + 2 x 3.4 us of ring latency against NVLS's 25 us)."""
    topology = load_topology("dgx-h100", {})
    request = CollectiveRequest("all_reduce", tuple(range(ranks)), GIB)
    assert choose(request, topology, protocol="simple").algorithm == chosen
    times = {algorithm: time_collective(topology, "all_reduce", algorithm, ranks, GIB, efficiency=dict(CALIBRATED))
             for algorithm in ("nvls", "ring")}
    assert times[chosen] <= min(times.values()) * (1 + 1e-3)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
def test_nvls_reduce_scatter_and_all_gather_move_n_over_one_direction(op):
    topology = load_topology("dgx-h100", {})
    seconds = time_collective(topology, op, "nvls", 8, GIB, efficiency=dict(CALIBRATED))
    assert seconds == pytest.approx(nvls.LATENCY + GIB / IN_SWITCH, rel=1e-9)


def test_nvls_needs_nvlink_sharp():
    with pytest.raises(ScenarioError) as info:
        plan_collective(CollectiveRequest("all_reduce", tuple(range(8)), GIB), load_topology("dgx-a100", {}), "nvls")
    assert info.value.field == "collectives.algorithm"
    a100 = load_topology("dgx-a100", {})
    assert choose(CollectiveRequest("all_reduce", tuple(range(8)), GIB), a100, protocol="simple").algorithm == "ring"


def test_nvls_across_uneven_hosts_is_refused_in_its_own_name():
    """An nvls all-reduce over hosts holding different member counts was refused as 'hierarchical all_reduce
    needs ...', an algorithm the user had not asked for."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 2})
    with pytest.raises(ScenarioError) as info:
        plan_collective(CollectiveRequest("all_reduce", (0, 1, 8), GIB), topology, "nvls")
    assert info.value.problem.startswith("nvls all_reduce needs the same number of group members on every host")
    assert info.value.field == "collectives.algorithm"


def test_host_tree_is_chains_joined_by_a_binary_tree_of_hosts():
    topology = load_topology("dgx-h100-cluster", {"nodes": 4})
    request = CollectiveRequest("all_reduce", tuple(range(32)), GIB, chunk_bytes=None)
    phases = host_tree_all_reduce(group_by_host(request.ranks, topology), request, 1, topology.gpu_nic)
    edges = {(t.src, t.dst) for phase in phases[: len(phases) // 2] for t in phase.transfers}
    cross = [(a, b) for a, b in edges if topology.gpu_host[a] != topology.gpu_host[b]]
    # Two trees, each: 7 chain edges in each of 4 hosts, 3 host-to-host edges.
    assert len(edges) == 2 * (4 * 7 + 3)
    assert len(cross) == 2 * 3


def test_tree_across_two_hosts_is_no_longer_the_slowest():
    times = {algorithm: collective_sweep("dgx-h100-cluster", {}, op="all_reduce", algorithm=algorithm, ranks=16,
                                         sizes=[GIB], chunk="4MiB")[0]["time_s"]
             for algorithm in ("ring", "tree", "hierarchical", "direct", "halving_doubling")}
    assert times["tree"] < max(times.values())
    # 5.26 ms against the ring's 5.49 ms at 1 GiB (the flat double binary tree over all 16 ranks takes 23.2 ms).
    assert times["tree"] < 1.05 * times["ring"]
    topology = load_topology("dgx-h100-cluster", {})
    flat = double_tree_all_reduce(CollectiveRequest("all_reduce", tuple(range(16)), GIB, chunk_bytes=4 * 2**20))
    env = simpy.Environment()
    network = Network(env, topology, efficiency=dict(CALIBRATED))
    env.process(run_plan(env, network, topology, flat))
    env.run()
    assert times["tree"] < 0.6 * env.now
