"""PXN: an all-to-all's cross-rail transfers between hosts of a rail-optimized fabric go over NVLink to the source
host's GPU on the destination's rail and out of its NIC, as NCCL sends point-to-point messages by default."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import simpy
from shared import GIB, MIB

from simulator import simulate
from simulator.cli import main
from simulator.collective_sweep import collective_sweep
from simulator.collectives.execute import phase_items, run_plan
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.registry import plan_collective
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.engine.stepping import run_all
from simulator.errors import ScenarioError
from simulator.network.model import Network
from simulator.topology.graph import PXN_CHANNEL, Topology
from simulator.topology.loader import load_topology

LEAF_GROUPS_2_TO_1 = {"nodes": 4, "leaf_ports": 2, "spines": 2, "oversubscription": 2}
"""Four DGX H100 hosts (eight 400G NICs each, one per GPU), two hosts per leaf group, the leaves' uplinks to the
two spines half their downlinks (2:1)."""

PAIR = 4 * GIB / 16
"""What each of 16 ranks sends each peer in a 4 GiB all-to-all."""


def sweep(pxn: bool) -> float:
    """Seconds of a 4 GiB all-to-all over the two hosts of the first leaf group, at line rate."""
    row, = collective_sweep("dgx-h100-cluster", LEAF_GROUPS_2_TO_1, op="all_to_all", algorithm="auto", ranks=16,
                            sizes=[4 * GIB], efficiency="ideal", pxn=pxn)
    return row["time_s"]


def test_pxn_keeps_a_leaf_groups_all_to_all_off_its_oversubscribed_spines():
    """By hand, with PXN: each NIC carries what its host's eight GPUs send to the other host's GPU on its rail,
    8 x 268 MB at 50 GB/s = 42.9 ms (43.0 ms with the 8.4 us base latency and the path latency), whatever the
    spines. Without: a rail leaf's two hosts send their GPUs' 7 cross-rail messages each up through 50 GB/s of
    uplinks (2:1), 2 x 7 x 268 MB / 50 GB/s = 75.2 ms."""
    assert math.isclose(sweep(pxn=True), 8 * PAIR / 50e9, rel_tol=1e-3)
    assert math.isclose(sweep(pxn=False), 2 * 7 * PAIR / 50e9, rel_tol=1e-3)


def test_a_relayed_transfer_loads_the_nvswitch_links_then_the_relays_rail_only():
    """GPU 0 (rail 0) to host 1's GPU 1 (rail 1) crosses the NVSwitch to host 0's GPU 1 and leaves through its
    NIC into rail 1's leaf; no spine. GPU 0's link into the NVSwitch carries its 7 messages to its host's GPUs and
    its 7 cross-rail messages to the other host; GPU 1's link out of it, its 7 local ones and the 7 it relays."""
    topology = load_topology("dgx-h100-cluster", LEAF_GROUPS_2_TO_1)
    phases = plan_collective(CollectiveRequest("all_to_all", tuple(range(16)), 4 * GIB), topology, "direct")
    relayed = next(t for phase in phases for t in phase.transfers if (t.src, t.dst) == (0, 9))
    assert relayed.channel == PXN_CHANNEL
    nodes = [topology.link_ends[link] for link in topology.path(0, 9, PXN_CHANNEL)]
    assert nodes == [("h0/gpu0", "h0/nvswitch"), ("h0/nvswitch", "h0/gpu1"), ("h0/gpu1", "h0/nic1"),
                     ("h0/nic1", "leaf0.r1"), ("leaf0.r1", "h1/nic1"), ("h1/nic1", "h1/gpu1")]
    carried: Counter[tuple[str, str]] = Counter()
    for phase in phases:
        for path, nbytes, *_ in phase_items(topology, phase):
            carried.update({topology.link_ends[link]: nbytes for link in path})
    assert carried[("h0/gpu0", "h0/nvswitch")] == pytest.approx(14 * PAIR)
    assert carried[("h0/nvswitch", "h0/gpu1")] == pytest.approx(14 * PAIR)
    assert not any(node.startswith("spine") for edge in carried for node in edge)


def timed(topology: Topology, ranks: tuple[int, ...], nbytes: float, pxn: bool) -> float:
    """Seconds of an all-to-all of ``nbytes`` a rank over ``ranks`` alone on ``topology``, at line rate."""
    request = CollectiveRequest("all_to_all", ranks, nbytes, pxn=pxn)
    env = simpy.Environment()
    env.process(run_plan(env, Network(env, topology), topology, plan_collective(request, topology, "direct")))
    run_all(env)
    return env.now


def test_a_same_rail_all_to_all_is_unchanged():
    """GPU 0 of each of the four hosts: every transfer stays on rail 0, so none goes through a relay and the time
    is the same with PXN or without; inside one leaf group, by hand: GPU 0 sends 1 GiB / 2 to host 1's GPU 0
    through its 50 GB/s NIC, 10.7 ms (and ~13 us of path latency, 8.4 us of base latency)."""
    ranks = (0, 8, 16, 24)
    topology = load_topology("dgx-h100-cluster", LEAF_GROUPS_2_TO_1)
    phases = plan_collective(CollectiveRequest("all_to_all", ranks, GIB), topology, "direct")
    assert {t.channel for phase in phases for t in phase.transfers} == {0}
    assert timed(topology, ranks, GIB, pxn=True) == timed(topology, ranks, GIB, pxn=False)
    assert math.isclose(timed(topology, (0, 8), GIB, pxn=True), GIB / 2 / 50e9, rel_tol=2e-3)


def test_an_expert_parallel_dispatch_over_two_hosts_by_hand():
    """EP 8 over GPUs 0, 2, 4, 6 of two DGX H100 (the even rails), 4 MiB a rank, 0.5 MiB a peer, at line rate:
    each GPU sends 3 messages over NVLink inside its host, 1 through its own NIC to the other host's GPU on its
    rail and 3 through relays, its host's GPUs on the destination's rails. Each NIC then carries its host's 4
    messages to the other host's GPU on its rail, 2 MiB at 50 GB/s = 41.94 us; a GPU's port into the NVSwitch
    carries 6 x 0.5 MiB at 450 GB/s = 6.99 us. The NIC is busy from the direct message's arrival, after the
    grouped launch's 8.4 us base latency and its route's 13.0 us (4 hops of 3.25 us; a relayed message adds the
    two NVLink hops, 16.4 us, and joins while the NIC is busy), to its last byte: 8.4 + 13.0 + 41.94 = 63.34 us."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 2})
    phases = plan_collective(CollectiveRequest("all_to_all", tuple(range(0, 16, 2)), 4 * MIB), topology, "direct")
    assert Counter(t.channel for phase in phases for t in phase.transfers) == {0: 32, PXN_CHANNEL: 24}
    seconds = timed(topology, tuple(range(0, 16, 2)), 4 * MIB, pxn=True)
    assert seconds == pytest.approx((8.4 + 13.0) * 1e-6 + 4 * (MIB / 2) / 50e9, rel=1e-12)


def test_only_a_relay_inside_the_group_forwards():
    """GPU 0 of host 0 and GPU 1 of host 1: host 0's GPU on rail 1 is no member of the group, so NCCL has no
    rank to proxy through and the transfer leaves from GPU 0's own NIC."""
    topology = load_topology("dgx-h100-cluster", LEAF_GROUPS_2_TO_1)
    phases = plan_collective(CollectiveRequest("all_to_all", (0, 9), GIB), topology, "direct")
    assert {t.channel for phase in phases for t in phase.transfers} == {0}
    assert topology.pxn_relay(0, 9) == 1


def test_the_collective_command_turns_pxn_off(capsys):
    """`--pxn off` times the spine path: 75.2 ms where `on` (the default) gives 43.0 ms."""
    args = ["collective", "--topology", "dgx-h100-cluster", "--op", "all_to_all", "--ranks", "16", "--sizes",
            "4GiB", "--efficiency", "ideal", "--json", *(f"--set={k}={v}" for k, v in LEAF_GROUPS_2_TO_1.items())]
    times = []
    for flag in (["--pxn", "off"], []):
        assert main([*args, *flag]) == 0
        times.append(float(capsys.readouterr().out.split('"time_s": ')[1].split(",")[0]))
    assert times[0] == pytest.approx(2 * 7 * PAIR / 50e9, rel=1e-3)
    assert times[1] == pytest.approx(8 * PAIR / 50e9, rel=1e-3)


def test_network_pxn_is_a_yes_or_no():
    """`network.pxn` takes true or false; anything else is refused at load in one line naming the line and field."""
    base = "cluster: {topology: dgx-h100-cluster}\nnetwork: {pxn: %s}\nworkload:\n  - {op: all_to_all, bytes: 1 MiB}\n"
    assert scenario_from_text(base % "false").scenario.network.pxn is False
    assert scenario_from_text(base % "true").scenario.network.pxn is True
    with pytest.raises(ScenarioError) as refused:
        scenario_from_text(base % "sometimes")
    assert str(refused.value) == "<text>:2: network.pxn: expected true or false, got 'sometimes' (allowed: true, false)"


EP_ACROSS_HOSTS = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: mixtral-8x7b, layers: 2, moe: {experts: 8, top_k: 2, routing: {balance: zipf}}}
training: {seq_len: 4096, microbatches: 1, precision: bf16}
parallelism: {tp: 2, pp: 1, ep: 8, sequence_parallel: true}
run: {seed: 3}
"""
"""EP 8 over the DP ranks of TP 2 on two DGX H100: each EP group holds four GPUs of each host on even rails, so its
cross-host transfers between different rails go through relays of its own."""


def test_a_folded_expert_parallel_step_with_pxn_is_the_unfolded_one(run_yaml):
    """The relayed dispatch and combine fold as the rest of the step: folded and unfolded agree to the bit in
    step time and traffic, and the relays change the step (without them the cross-rail flows take the spines)."""
    folded = run_yaml(EP_ACROSS_HOSTS).summary
    unfolded = run_yaml(EP_ACROSS_HOSTS, "run.fold=false").summary
    assert folded["simulated_ranks"] < unfolded["simulated_ranks"] == 16
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert folded["traffic_bytes_per_gpu"] == pytest.approx(unfolded["traffic_bytes_per_gpu"], rel=1e-12)
    assert run_yaml(EP_ACROSS_HOSTS, "network.pxn=false").summary["comm_s"]["ep"] != folded["comm_s"]["ep"]


def test_pxn_lets_groups_of_one_leaf_group_fold_that_collide_on_the_spines_without_it():
    """EP 16 over two whole hosts, two groups a leaf group (8 DGX H100, leaf_ports 4, 5 spines): without PXN their
    cross-rail flows collide unlike on the spines and the step runs all 64 ranks (tests/test_folding.py); through
    the relays they stay on their rails, and the step folds to 2 ranks, equal to the unfolded step to the bit."""
    overrides = ["model.layers=4", "model.moe.experts=16", "cluster.nodes=8", "cluster.leaf_ports=4",
                 "cluster.spines=5", "parallelism.tp=1", "parallelism.ep=16", "parallelism.dp=64",
                 "training.global_batch=64"]
    scenario = Path(__file__).parents[1] / "scenarios" / "mixtral-8x7b-ep8.yaml"
    folded = simulate(load_scenario(scenario, overrides)).summary
    unfolded = simulate(load_scenario(scenario, [*overrides, "run.fold=false"])).summary
    assert (folded["folded"], folded["simulated_ranks"]) == (True, 2)
    assert folded["step_time_s"] == unfolded["step_time_s"]
