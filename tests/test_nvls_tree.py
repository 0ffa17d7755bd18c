"""NVLS (in-switch reduction on NVLink SHARP) against its link-load closed form, `auto` choosing it where NCCL
does, and NCCL's per-host tree (chain inside a host, double binary tree across hosts)."""

from __future__ import annotations

import pytest
import simpy
from shared import GIB

from simulator.catalog.calibration import nvls_efficiency
from simulator.collective_sweep import collective_sweep
from simulator.collectives import nvls
from simulator.collectives.execute import run_plan, time_collective
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.registry import plan_collective
from simulator.collectives.ring import group_by_host
from simulator.collectives.tree import all_reduce_phases, double_tree_edges, host_tree_edges
from simulator.collectives.tuner import choose
from simulator.errors import ScenarioError
from simulator.network.calibration import calibrated
from simulator.network.model import Network
from simulator.topology.loader import load_topology

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
    """An nvls all-reduce over hosts holding different member counts is refused in nvls's name, not as 'hierarchical
    all_reduce needs ...', an algorithm the user did not ask for."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 2})
    with pytest.raises(ScenarioError) as info:
        plan_collective(CollectiveRequest("all_reduce", (0, 1, 8), GIB), topology, "nvls")
    assert info.value.problem.startswith("nvls all_reduce needs the same number of group members on every host")
    assert info.value.field == "collectives.algorithm"


def tree_parents(hosts: int, nics: int, channels: int) -> list[list[dict[int, int]]]:
    """Per channel, per tree, each GPU's parent (the GPU it sends to on the way up) in the tree all-reduce over
    every GPU of ``hosts`` DGX H100 hosts with ``nics`` NICs each: NCCL's "Trees" log line read from the plan's
    up edges (each tree holds p - 1 of them, channel by channel, tree by tree)."""
    topology = load_topology("dgx-h100-cluster", {"nodes": hosts, "nics_per_node": nics})
    ranks = tuple(range(8 * hosts))
    up, _ = host_tree_edges(group_by_host(ranks, topology), channels, topology.gpu_nic)
    size = len(ranks) - 1
    trees = [dict((src, dst) for src, dst, _, _ in up[start:start + size]) for start in range(0, len(up), size)]
    assert all(channel == c for c in range(channels) for _, _, channel, _ in up[2 * c * size:(2 * c + 2) * size])
    return [trees[2 * c:2 * c + 2] for c in range(channels)]


def nccl_tree(hosts: int, heads: list[int], chain: list[int], receivers: dict[tuple[int, int], int]
              ) -> dict[int, int]:
    """A tree as NCCL's connectTrees builds it: in each host h (GPUs 8h..8h+7) the chain of local indices
    ``chain`` (treeIntra: each GPU sends up to the one before it), and ``heads``' host h sending to
    ``receivers[h, parent]``'s local GPU of its parent host (the chain's first GPU, or its second for a first
    child under BALANCED_TREE); ``heads[h]`` is h's parent host, -1 for the root, whose head sends nowhere."""
    parent = {8 * h + chain[k + 1]: 8 * h + chain[k] for h in range(hosts) for k in range(7)}
    parent.update({8 * child + chain[0]: 8 * above + local for (child, above), local in receivers.items()})
    assert [h for h in range(hosts) if 8 * h + chain[0] not in parent] == [heads.index(-1)]
    assert all(heads[child] == above for child, above in receivers)
    return parent


@pytest.mark.parametrize("channel", range(8))
def test_host_tree_chains_start_at_the_nic_and_join_at_their_heads_as_nccl_does(channel):
    """NCCL's tree on DGX H100 hosts, hand-derived from src/graph (search.cc, connect.cc, trees.cc): channel c
    goes through NIC c (8 NICs) or c mod 4 (4 NICs, GPUs 2k and 2k+1 on NIC k) and its chain starts at that
    NIC's first GPU, then follows the local order round the host; both trees of a channel share the chains. The
    host tree is ncclGetDtree's: over 2 hosts host 1 under host 0, then host 0 under host 1; over 4 hosts 0 -> 2
    -> {1, 3}, then the mirror 3 -> 1 -> {2, 0}. With 8 NICs (TREE pattern) every host-to-host edge joins the
    two chains' first GPUs; with 4 NICs (BALANCED_TREE) a host's first child (lower position) sends to the
    parent's second GPU, which shares the first's NIC. Every edge across hosts stays on the channel's rail."""
    for nics in (8, 4):
        start = channel if nics == 8 else 2 * (channel % 4)
        chain = [(start + k) % 8 for k in range(8)]
        first, second = chain[0], chain[1] if nics == 4 else chain[0]
        two = tree_parents(2, nics, 8)[channel]
        assert two == [nccl_tree(2, [-1, 0], chain, {(1, 0): first}),
                       nccl_tree(2, [1, -1], chain, {(0, 1): first})]
        four = tree_parents(4, nics, 8)[channel]
        assert four == [nccl_tree(4, [-1, 2, 0, 2], chain, {(2, 0): first, (1, 2): second, (3, 2): first}),
                        nccl_tree(4, [1, 3, 1, -1], chain, {(1, 3): first, (2, 1): second, (0, 1): first})]


def test_tree_across_two_hosts_is_no_longer_the_slowest():
    times = {algorithm: collective_sweep("dgx-h100-cluster", {}, op="all_reduce", algorithm=algorithm, ranks=16,
                                         sizes=[GIB], chunk="4MiB")[0]["time_s"]
             for algorithm in ("ring", "tree", "hierarchical", "direct", "halving_doubling")}
    assert times["tree"] < max(times.values())
    # 5.58 ms against the ring's 5.50 ms at 1 GiB (the flat double binary tree over all 16 ranks takes 23.2 ms).
    assert times["tree"] < 1.05 * times["ring"]
    topology = load_topology("dgx-h100-cluster", {})
    request = CollectiveRequest("all_reduce", tuple(range(16)), GIB, chunk_bytes=4 * 2**20)
    flat = all_reduce_phases(double_tree_edges(request.ranks, 1), request, 1, (2, 8.0))
    env = simpy.Environment()
    network = Network(env, topology, efficiency=dict(CALIBRATED))
    env.process(run_plan(env, network, topology, flat))
    env.run()
    assert times["tree"] < 0.6 * env.now


def test_nvls_across_four_dgx_hosts_runs_nccls_tree_over_eight_heads_at_line_rate():
    """NCCL runs the NVLS tree over 4 DGX H100 hosts on 8 heads a host, one per NIC (search.cc, connect.cc
    connectNvls), each head's column a double binary tree of the hosts: a head interior in one tree (a parent and
    2 children) and a leaf in the other has 4 tree edges of n/16 each way, 2 n/8 over its NIC, which binds before
    the in-switch level (n 9/8 at the in-switch rate): 5.48 ms for 1 GiB, busbw 380 GB/s. The plan ran rail rings,
    2 (N-1)/N n/8 per NIC: 4.14 ms, 503 GB/s, above the 387 GB/s bound NCCL's tree has at line rate."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 4})
    line_rate = {"nvlink": 1.0, "infiniband": 1.0, "pcie": 1.0}
    nic = 400e9 / 8
    in_switch = GIB * 9 / 8 / (450e9 * nvls_efficiency("h100-sxm"))
    tree = 4 * GIB / 16 / nic
    assert tree > in_switch
    simulated = time_collective(topology, "all_reduce", "nvls", 32, GIB, efficiency=line_rate)
    assert simulated == pytest.approx(nvls.LATENCY + 2 * 2 * nvls.TREE_NET_LATENCY + tree, rel=1e-9)
