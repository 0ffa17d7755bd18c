"""Collective algorithms against their alpha-beta closed forms (Thakur, Rabenseifner, Gropp 2005; NCCL's
double binary tree; the two-level all-reduce of the reference set's published-results.md section 5), flow
mode, efficiency 1, on small hand-built topologies."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace
from functools import partial

import networkx
import pytest
import simpy
from networkx.algorithms.isomorphism import DiGraphMatcher, categorical_edge_match
from shared import ALPHA, BANDWIDTH, GIB, KIB, MIB, NCCL_SIMPLE_BASE_S, switch_topology, two_level_topology

from simulator.cli import main
from simulator.collective_sweep import collective_sweep
from simulator.collectives.busbw import BUS_FACTORS, bus_bandwidth, bus_bandwidth_factor
from simulator.collectives.execute import run_plan, time_collective
from simulator.collectives.names import ALGORITHM_CHOICES, PRIMITIVES
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.registry import ALGORITHMS, plan_collective, runnable_algorithms
from simulator.collectives.ring import group_by_host, ring_order
from simulator.collectives.tree import double_binary_tree
from simulator.collectives.tuner import choose, estimates
from simulator.config.loader import scenario_from_text
from simulator.engine.stepping import run_all
from simulator.errors import ScenarioError
from simulator.network.calibration import calibrated
from simulator.network.model import Network
from simulator.topology.graph import Topology, Wiring, add_link
from simulator.topology.loader import load_topology

TOLERANCE = 1e-9
"""Relative: the closed forms hold to float rounding on these topologies (at most 2e-15 measured; 0.005 before,
which let a step's latency or a hop's bytes go wrong unseen)."""
BASE = NCCL_SIMPLE_BASE_S
"""NCCL's base latency of a collective under Simple (tuning.cc baseLatencies, ring and tree alike): every ring,
tree, hierarchical and halving-doubling collective pays it once, before its first step; direct pays none."""


def close(simulated: float, expected: float, tolerance: float = TOLERANCE) -> bool:
    return abs(simulated - expected) <= tolerance * expected


SAMPLES = [(2, 8 * GIB), (3, 1 * KIB), (5, 64 * MIB), (8, 1 * MIB), (16, 8 * GIB), (64, 256 * KIB), (64, 1 * GIB)]


@pytest.mark.parametrize("size,nbytes", SAMPLES)
def test_ring_all_reduce_matches_closed_form(size, nbytes):
    expected = BASE + 2 * (size - 1) * ALPHA + 2 * (size - 1) / size * nbytes / BANDWIDTH
    assert close(time_collective(switch_topology(size), "all_reduce", "ring", size, nbytes), expected)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("size,nbytes", SAMPLES[1::2])
def test_ring_reduce_scatter_and_all_gather(op, size, nbytes):
    expected = BASE + (size - 1) * ALPHA + (size - 1) / size * nbytes / BANDWIDTH
    assert close(time_collective(switch_topology(size), op, "ring", size, nbytes), expected)


def chunk_step(chunk: float, alpha: float = ALPHA, bandwidth: float = BANDWIDTH) -> float:
    """A streamed chunk step: its transfer time c b, or NCCL_STEPS = 8 chunks per slot round trip 2 (a + c b)
    where the latency outlasts the window."""
    return max(chunk / bandwidth, 2 * (alpha + chunk / bandwidth) / 8)


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
@pytest.mark.parametrize("size,nbytes,chunk", [(2, 1 * MIB, None), (7, 64 * MIB, None), (8, 64 * MIB, 4 * MIB),
                                               (33, 1 * GIB, 8 * MIB), (16, 1 * MIB, 4 * MIB),
                                               (8, 64 * MIB, 16 * KIB), (5, 1 * MIB, 1 * KIB)])
def test_ring_chain_broadcast_and_reduce(op, size, nbytes, chunk):
    """Chunk 0 crosses the p-1 hops paying a + c b each; each later chunk follows one streamed step behind, its
    latency hidden by the chunks in flight (the last two cases are window-bound: c b < a / 3)."""
    chunks = math.ceil(nbytes / chunk) if chunk else 1
    c = nbytes / chunks
    expected = BASE + (size - 1) * (ALPHA + c / BANDWIDTH) + (chunks - 1) * chunk_step(c)
    simulated = time_collective(switch_topology(size), op, "ring", size, nbytes, chunk_bytes=chunk, root=size // 2)
    assert close(simulated, expected, tolerance=1e-9)


def test_chains_of_several_channels_stream_as_one():
    """Two channels' chains inside one host follow the same hops, each with n/2 in L chunks c: every link
    carries two chunks a step, and the merged steps still pay the latency only while the chains open."""
    size, nbytes, chunk = 8, 64 * MIB, 4 * MIB
    chunks = math.ceil(nbytes / 2 / chunk)
    c_b = nbytes / 2 / chunks / BANDWIDTH
    expected = BASE + (size - 1) * (ALPHA + 2 * c_b) + (chunks - 1) * 2 * c_b
    simulated = time_collective(switch_topology(size), "broadcast", "ring", size, nbytes, chunk_bytes=chunk,
                                channels=2)
    assert close(simulated, expected, tolerance=1e-9)


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_chain_on_8_h100_pays_the_latency_once_per_hop(op):
    """1 GiB over a DGX H100's 7-hop NVLink chain in 4 MiB chunks: 7 (a + c b) + 255 c b = 7 a + n b + 6 c b, plus
    the base latency,
    busbw 357.6 GB/s at H100's calibrated NVLink rate."""
    topology = load_topology("dgx-h100", {})
    row = collective_sweep("dgx-h100", {}, op=op, algorithm="ring", ranks=8, sizes=[GIB], chunk="4MiB")[0]
    c_b = 4 * MIB / (450e9 * calibrated("h100-sxm")["nvlink"])
    expected = BASE + 7 * topology.path_latency(0, 1) + GIB / 4 / MIB * c_b + 6 * c_b
    assert row["time_s"] == pytest.approx(expected, rel=1e-9)
    assert row["busbw_GBps"] == pytest.approx(GIB / expected / 1e9, rel=1e-9)


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
@pytest.mark.parametrize("size,nbytes", [(2, 1 * KIB), (5, 1 * MIB), (16, 64 * MIB), (64, 8 * GIB)])
def test_binomial_tree_broadcast_and_reduce(op, size, nbytes):
    expected = BASE + math.ceil(math.log2(size)) * (ALPHA + nbytes / BANDWIDTH)
    simulated = time_collective(switch_topology(size), op, "tree", size, nbytes, chunk_bytes=MIB, root=1)
    assert close(simulated, expected)


@pytest.mark.parametrize("size,nbytes,chunk", [(4, 1 * MIB, None), (8, 64 * MIB, None), (8, 64 * MIB, 1 * MIB),
                                               (64, 1 * GIB, 16 * MIB), (16, 8 * GIB, 64 * MIB),
                                               (16, 64 * MIB, 4 * KIB)])
def test_double_binary_tree_all_reduce(size, nbytes, chunk):
    """Per tree n/2 in L chunks c: reduce then broadcast, each H + L - 1 steps (H = log2 p) of 2 c b (a link
    carries two chunks), except the single root-edge step at the end of the reduce and the start of the
    broadcast, which carries one. The H steps where edges carry their first chunk pay a; the L - 1 streamed
    steps pay only the stall of the window (the last case, c b < a / 3, is window-bound)."""
    height = int(math.log2(size))
    chunks = math.ceil(nbytes / 2 / chunk) if chunk else 1
    c = nbytes / 2 / chunks
    stall = chunk_step(c) - c / BANDWIDTH
    expected = BASE + 2 * (height * ALPHA + (height + chunks - 2) * 2 * c / BANDWIDTH + c / BANDWIDTH
                           + (chunks - 1) * stall)
    assert close(time_collective(switch_topology(size), "all_reduce", "tree", size, nbytes, chunk_bytes=chunk),
                 expected, tolerance=1e-9)


def test_pipelined_double_tree_approaches_two_n_beta():
    nbytes, size = 8 * GIB, 32
    simulated = time_collective(switch_topology(size, alpha=0.0), "all_reduce", "tree", size, nbytes,
                                chunk_bytes=4 * MIB)
    assert close(simulated, 2 * nbytes / BANDWIDTH, tolerance=0.01)


def nccl_btree_parent(ranks: int, rank: int) -> tuple[int, int]:
    """trees.cc ncclGetBtree for ``rank`` of ``ranks``: its parent (-1 for rank 0, the root) and parentChildType
    (0 where the rank lies below its parent). The parent flips the rank's lowest set bit and sets the bit above it,
    or only flips it where that parent lies past the last rank."""
    if rank == 0:
        return -1, 0
    low = rank & -rank
    parent = (rank ^ low) | (low << 1)
    if parent >= ranks:
        parent = rank ^ low
    return parent, int(rank > parent)


def nccl_dtree_parents(ranks: int, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """trees.cc ncclGetDtree: the btree's parent, then the second tree's, the btree of the mirrored rank
    (even counts) or of the rank shifted down by one (odd counts), mapped back."""
    if ranks % 2:
        parent, side = nccl_btree_parent(ranks, (rank - 1) % ranks)
        second = (-1 if parent < 0 else (parent + 1) % ranks, side)
    else:
        parent, side = nccl_btree_parent(ranks, ranks - 1 - rank)
        second = (-1 if parent < 0 else ranks - 1 - parent, side)
    return nccl_btree_parent(ranks, rank), second


@pytest.mark.parametrize("ranks", range(1, 130))
def test_double_binary_tree_is_nccls(ranks):
    """Both trees over ``ranks`` give every rank NCCL's parent and child side (ncclGetDtree), so a group's first
    rank roots the first tree on every channel and its last (even counts) or second (odd) roots the other."""
    trees = double_binary_tree(tuple(range(ranks)))
    for number, tree in enumerate(trees):
        ours = {child: (parent, side) for child, parent, _, _, side in tree}
        nccls = {rank: nccl_dtree_parents(ranks, rank)[number] for rank in range(ranks)}
        assert ours == {rank: found for rank, found in nccls.items() if found[0] >= 0}


@pytest.mark.parametrize("hosts", [4, 8, 32, 64])
def test_no_two_hosts_hold_the_same_place_in_both_trees(hosts):
    """The only relabelling of the hosts that keeps both trees is the identity, so no host's copy of a DP tree's
    traffic is another's: a fold that lets one data-parallel replica stand for another whose NICs carry the trees
    is exact only where the flows happen to take like times (megatron-sc21-76.1b's hand-offs did not: docs/
    performance.md). The two roots (hosts 0 and hosts - 1) send half the bytes every other host sends."""
    graph = networkx.DiGraph()
    for number, tree in enumerate(double_binary_tree(tuple(range(hosts)))):
        for child, parent, *_ in tree:
            earlier = graph.get_edge_data(child, parent, {"trees": ()})["trees"]
            graph.add_edge(child, parent, trees=(*earlier, number))
    matcher = DiGraphMatcher(graph, graph, edge_match=categorical_edge_match("trees", ()))
    assert list(matcher.isomorphisms_iter()) == [{host: host for host in range(hosts)}]
    edges_at = Counter(end for child, parent, trees in graph.edges(data="trees") for end in (child, parent)
                       for _ in trees)
    assert {host for host, edges in edges_at.items() if edges == 2} == {0, hosts - 1}
    assert set(edges_at.values()) == {2, 4}


@pytest.mark.parametrize("size,nbytes", [(2, 1 * KIB), (6, 64 * MIB), (16, 1 * GIB), (48, 8 * MIB)])
def test_all_to_all_sends_to_every_peer_at_once(size, nbytes):
    """L + a + n_sent b, with n_sent = (p-1)/p of the nccl-tests buffer (the own slice stays home): NCCL posts the
    sends to every peer together in one kernel, which pays the Simple base latency L once; each send pays its path
    latency once, side by side, and they share the GPU's link."""
    expected = NCCL_SIMPLE_BASE_S + ALPHA + (size - 1) / size * nbytes / BANDWIDTH
    assert close(time_collective(switch_topology(size), "all_to_all", "direct", size, nbytes), expected)


def test_a_1_mib_all_to_all_on_a_dgx_h100_pays_the_kernels_base_latency_by_hand():
    """8 H100s on one NVSwitch, 1 MiB: the grouped send/receive kernel's 8.4 us (NCCL's Simple base latency), one
    3.4 us NVLink path latency (1.7 us a link, two links), and 7/8 MiB through each GPU's NVLink at the calibrated
    370 GB/s (2.48 us): 14.28 us, where the peers' transfers alone took 5.88 us."""
    row, = collective_sweep("dgx-h100", {}, op="all_to_all", algorithm="auto", ranks=8, sizes=[MIB])
    by_hand = 8.4e-6 + 3.4e-6 + 7 / 8 * MIB / 370e9
    assert row["resolved_algorithm"] == "direct"
    assert math.isclose(row["time_s"], by_hand, rel_tol=1e-9)
    assert f"{row['time_s'] * 1e6:.2f}" == "14.28"


def test_an_all_to_all_with_nothing_to_send_still_pays_one_handshake():
    """A pair with no bytes posts no transfer beside pairs that carry some, but where no pair has any, every pair's
    count-0 send runs as NCCL 2.14 and later run it, one empty step (docs/collectives.md, direct): the all-to-all
    lasts the kernel's base latency and one path latency, not nothing."""
    size, topology = 4, switch_topology(4)
    own_slices_only = tuple(tuple(MIB if i == j else 0.0 for j in range(size)) for i in range(size))
    phases = plan_collective(CollectiveRequest("all_to_all", tuple(range(size)), size * MIB,
                                               pair_bytes=own_slices_only), topology, "direct")
    assert [len(phase.transfers) for phase in phases] == [size * (size - 1)]
    env = simpy.Environment()
    env.process(run_plan(env, Network(env, topology), topology, phases))
    run_all(env)
    assert close(env.now, NCCL_SIMPLE_BASE_S + ALPHA)


@pytest.mark.parametrize("hosts", [2, 4, 6])
def test_all_to_all_across_hosts_is_bound_by_its_cross_host_bytes(hosts):
    """nccl-tests alltoall on DGX H100 hosts (one 400G NIC per GPU): the busbw tends to N/(N-1) x a NIC's rate
    (S. Jeaugey, NVIDIA/nccl-tests issue #130). By hand: each GPU sends (hosts - 1)/hosts of the buffer through
    its own NIC at the calibrated 47 GB/s, while its NVLink share (1/hosts, at ~370 GB/s) moves beside it; the
    phase-per-peer plan ran every peer at NIC speed (busbw ~46.9 on 2 hosts). The grouped kernel's 8.4 us base
    latency comes first; the 13 us path latency is the rest (2.8e-4 of the time on 2 hosts)."""
    nbytes, size = 4 * GIB, 8 * hosts
    row, = collective_sweep("dgx-h100-cluster", {"nodes": hosts}, op="all_to_all", algorithm="auto", ranks=size,
                            sizes=[nbytes])
    seconds = NCCL_SIMPLE_BASE_S + (hosts - 1) / hosts * nbytes / 47e9
    assert math.isclose(row["time_s"], seconds, rel_tol=3e-4)
    assert math.isclose(row["busbw_GBps"], (size - 1) / size * nbytes / seconds / 1e9, rel_tol=3e-4)


@pytest.mark.parametrize("op,factor", [("all_gather", 1), ("reduce_scatter", 1), ("all_reduce", 2)])
def test_direct_pairwise_gather_scatter(op, factor):
    size, nbytes = 12, 96 * MIB
    expected = factor * ((size - 1) * ALPHA + (size - 1) / size * nbytes / BANDWIDTH)
    assert close(time_collective(switch_topology(size), op, "direct", size, nbytes), expected)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("size,nbytes", [(2, 1 * KIB), (8, 16 * MIB)])
def test_userbuffers_is_one_latency_and_the_rings_bytes(op, size, nbytes):
    """Transformer Engine's userbuffers kernel: every member sends n/p to every other at once, a + (p-1)/p n b,
    without NCCL's base latency, whatever protocol the run asks for (it has none of NCCL's)."""
    expected = ALPHA + (size - 1) / size * nbytes / BANDWIDTH
    assert close(time_collective(switch_topology(size), op, "userbuffers", size, nbytes), expected, 1e-9)
    with pytest.raises(ScenarioError) as info:
        plan_collective(CollectiveRequest("all_reduce", (0, 1), MIB), switch_topology(2), "userbuffers")
    assert info.value.problem == "algorithm 'userbuffers' does not implement all_reduce"


@pytest.mark.parametrize("size,nbytes", [(2, 1 * KIB), (4, 64 * MIB), (8, 16 * MIB)])
def test_ring_exchange_is_the_rings_steps_without_nccls_base_latency(size, nbytes):
    """Transformer Engine's ring exchange: p - 1 copies of n/p to the next GPU in group order, one after the
    other, each paying its path latency: (p-1)(a + n/p b), NCCL's ring all-gather less its base latency."""
    topology = switch_topology(size)
    exchange = time_collective(topology, "all_gather", "ring_exchange", size, nbytes)
    assert close(exchange, (size - 1) * (ALPHA + nbytes / size / BANDWIDTH), 1e-9)
    assert close(time_collective(topology, "all_gather", "ring", size, nbytes) - exchange, BASE, 1e-6)
    (phase,) = plan_collective(CollectiveRequest("all_gather", (6, 0, 4, 2), MIB), switch_topology(8),
                               "ring_exchange")
    assert {(t.src, t.dst) for t in phase.transfers} == {(6, 0), (0, 4), (4, 2), (2, 6)}
    with pytest.raises(ScenarioError) as info:
        plan_collective(CollectiveRequest("reduce_scatter", (0, 1), MIB), switch_topology(2), "ring_exchange")
    assert info.value.problem == "algorithm 'ring_exchange' does not implement reduce_scatter"


@pytest.mark.parametrize("size,nbytes", [(2, 8 * GIB), (4, 1 * KIB), (16, 64 * MIB), (64, 1 * GIB)])
def test_halving_doubling(size, nbytes):
    steps, volume = math.log2(size), (size - 1) / size * nbytes / BANDWIDTH
    topology = switch_topology(size)
    assert close(time_collective(topology, "all_reduce", "halving_doubling", size, nbytes),
                 BASE + 2 * steps * ALPHA + 2 * volume)
    assert close(time_collective(topology, "reduce_scatter", "halving_doubling", size, nbytes),
                 BASE + steps * ALPHA + volume)
    assert close(time_collective(topology, "all_gather", "halving_doubling", size, nbytes),
                 BASE + steps * ALPHA + volume)


def test_halving_doubling_rejects_other_sizes():
    with pytest.raises(ScenarioError, match="power-of-two"):
        time_collective(switch_topology(6), "all_reduce", "halving_doubling", 6, MIB)


TWO_LEVEL = dict(b_in=450e9, a_in=3e-6, b_out=50e9, a_out=14e-6)


@pytest.mark.parametrize("hosts,per_host,nbytes", [(2, 8, 1 * GIB), (4, 4, 1 * MIB), (8, 2, 8 * GIB),
                                                   (3, 4, 1 * KIB), (16, 4, 256 * MIB)])
def test_hierarchical_all_reduce_matches_published_formula(hosts, per_host, nbytes):
    """published-results.md section 5: 2(g-1) a_in + 2(g-1)/g n b_in + 2(N-1) a_out + 2(N-1)/N (n/g) b_out."""
    g, count = per_host, hosts
    p = TWO_LEVEL
    expected = (BASE + 2 * (g - 1) * p["a_in"] + 2 * (g - 1) / g * nbytes / p["b_in"]
                + 2 * (count - 1) * p["a_out"] + 2 * (count - 1) / count * (nbytes / g) / p["b_out"])
    topology = two_level_topology(hosts, per_host, **TWO_LEVEL)
    simulated = time_collective(topology, "all_reduce", "hierarchical", hosts * per_host, nbytes)
    assert close(simulated, expected)


def test_hierarchical_reduce_scatter_all_gather_broadcast_reduce():
    hosts, g, n = 4, 4, 256 * MIB
    p = TWO_LEVEL
    topology = two_level_topology(hosts, g, **TWO_LEVEL)
    intra = (g - 1) * (p["a_in"] + n / g / p["b_in"])
    rail_ring = (hosts - 1) * (p["a_out"] + n / (g * hosts) / p["b_out"])
    rail_tree = math.log2(hosts) * (p["a_out"] + n / g / p["b_out"])
    star = p["a_in"] + (g - 1) * n / g / p["b_in"]
    expected = {"reduce_scatter": intra + rail_ring, "all_gather": rail_ring + intra,
                "broadcast": star + rail_tree + intra, "reduce": intra + rail_tree + star}
    for op, value in expected.items():
        assert close(time_collective(topology, op, "hierarchical", hosts * g, n, root=5), BASE + value), op


def test_hierarchical_needs_even_hosts():
    topology = two_level_topology(2, 4, **TWO_LEVEL)
    with pytest.raises(ScenarioError, match="same number of group members"):
        time_collective(topology, "all_reduce", "hierarchical", [0, 1, 2, 4, 5], MIB)


@pytest.mark.parametrize("channels,nics_used", [(1, 1), (None, 4)])
def test_two_node_ring_uses_every_nic(channels, nics_used):
    """Rail-aligned rings: with one ring per rail the cross-node bandwidth is the sum of the host's NICs. The form
    charges each of the 14 steps the cross-host latency; the simulated ring is 0.115 ms under it (measured: 0.08%
    with one channel, 0.31% with four)."""
    hosts, g, n = 2, 4, 4 * GIB
    topology = two_level_topology(hosts, g, **TWO_LEVEL)
    size = hosts * g
    cross_step = TWO_LEVEL["a_out"] + n / (size * nics_used) / TWO_LEVEL["b_out"]
    simulated = time_collective(topology, "all_reduce", "ring", size, n, channels=channels)
    assert close(simulated, BASE + 2 * (size - 1) * cross_step, tolerance=0.0035)


def cross_host_nics(topology: Topology, phases) -> Counter:
    """How many cross-host transfers of ``phases`` leave through each NIC."""
    return Counter(topology.gpu_nic[t.src] for phase in phases for t in phase.transfers
                   if topology.gpu_host[t.src] != topology.gpu_host[t.dst])


def test_rings_and_trees_spread_evenly_over_nics_that_two_gpus_share():
    """2 DGX H100 hosts with 4 NICs for 8 GPUs (GPUs 2k and 2k+1 on NIC k): the 4 rings leave each host through the 4
    NICs, one each, as NCCL's search places channels (one per NIC in turn, returning to it), and so do the tree's
    chains. Ring all-reduce of 1 GiB, p = 16, 4 rings: a step moves n/(4p) through every NIC at 50 GB/s (the 64 GB/s
    PCIe hop to it and n/p per GPU on 450 GB/s NVLink are faster); 14 of a ring's 16 hops cross NVLink (3.4 us), 2
    cross hosts (13 us: GPU-NIC-leaf-NIC-GPU, 3.25 us each), mean 4.6 us, so t = 8.4 us + 2(p-1) (4.6 us + n/(4p x 50
    GB/s)) = 10.213 ms, busbw 2(p-1)/p n / t = 197 GB/s. With NIC 0 carrying two rings and NIC 2 none, a step would
    take twice as long: 20.3 ms, 99 GB/s. The ring's broadcast estimate counts the rails as equally loaded, and
    matches the simulation (6.75 ms)."""
    topology = load_topology("dgx-h100-cluster", {"nics_per_node": 4})
    ranks, n = tuple(range(16)), 1 * GIB
    for algorithm in ("ring", "tree"):
        phases = plan_collective(CollectiveRequest("all_reduce", ranks, n), topology, algorithm)
        sends = cross_host_nics(topology, phases)
        assert sorted(sends) == [f"h{host}/nic{nic}" for host in range(2) for nic in range(4)]
        assert len(set(sends.values())) == 1, sends
    simulated = time_collective(topology, "all_reduce", "ring", 16, n)
    step = (14 * 3.4e-6 + 2 * 13e-6) / 16 + n / (4 * 16 * 50e9)
    assert close(simulated, BASE + 30 * step, 1e-6)
    assert close(bus_bandwidth("all_reduce", 16, n, simulated), 197.1e9, 1e-3)
    request = CollectiveRequest("broadcast", ranks, n, chunk_bytes=4 * MIB)
    simulated = time_collective(topology, "broadcast", "ring", 16, n, chunk_bytes=4 * MIB)
    assert close(estimates(request, topology, algorithms=("ring",))["ring"], simulated, 1e-6)


@pytest.mark.parametrize("nodes, nics, op", [(8, 1, "broadcast"), (8, 4, "broadcast"), (4, 2, "reduce")])
def test_an_unchunked_ring_chain_is_estimated_at_each_hops_own_speed(nodes, nics, op):
    """With chunking off a ring's broadcast or reduce moves each channel's buffer one edge of its chain at a time,
    over NVLink between members of a host and through a NIC between hosts, so the estimate charges every edge its
    own link's speed and matches the simulation: 8 GiB from GPU 5 over 8 DGX H100 hosts takes 2424.6 ms with 1 NIC,
    1713.7 ms with 4 (1737.6 ms from GPU 0). Charging every edge the NICs' rate estimated 10823.6 ms (4.46x) and
    2706.4 ms (1.58x)."""
    ranks, n = tuple(range(8 * nodes)), 8 * GIB
    topology = load_topology("dgx-h100-cluster", {"nodes": nodes, "nics_per_node": nics})
    request = CollectiveRequest(op, ranks, n, root=5, chunk_bytes=None)
    simulated = time_collective(topology, op, "ring", ranks, n, chunk_bytes=None, root=5)
    assert close(estimates(request, topology, algorithms=("ring",))["ring"], simulated, 1e-6)


def test_rings_run_every_nic_both_ways_when_the_nics_do_not_divide_the_gpus():
    """4 DGX H100 hosts with k = 3..8 NICs for 8 GPUs (GPU i on NIC i k // 8: with k = 6 NICs 0 and 3 serve two
    GPUs, the others one): the k rings of a 32-rank all-reduce leave and enter each host through every NIC once,
    and an 8 GiB all-reduce at line rate runs at k NICs' busbw, k/8 of the 8 NICs' 397.2 GB/s and less than 0.5%
    above it (the fixed latency weighs more where a step takes longer): 149.6, 199.3, 248.9, 298.4, 347.9 GB/s
    for k = 3..7."""
    ranks, n = tuple(range(32)), 8 * GIB
    busbw = {}
    for nics in range(3, 9):
        topology = load_topology("dgx-h100-cluster", {"nodes": 4, "nics_per_node": nics})
        phases = plan_collective(CollectiveRequest("all_reduce", ranks, n), topology, "ring")
        crossing = [t for phase in phases for t in phase.transfers
                    if topology.gpu_host[t.src] != topology.gpu_host[t.dst]]
        sends = Counter(topology.gpu_nic[t.src] for t in crossing)
        receives = Counter(topology.gpu_nic[t.dst] for t in crossing)
        for counts in (sends, receives):
            assert len(counts) == 4 * nics and len(set(counts.values())) == 1, (nics, counts)
        busbw[nics] = bus_bandwidth("all_reduce", 32, n, time_collective(topology, "all_reduce", "ring", ranks, n))
    for nics in range(3, 8):
        assert 1 <= busbw[nics] / (busbw[8] * nics / 8) < 1.005, busbw


@pytest.mark.parametrize("nics, per_host, channels", [(2, 5, 2), (4, 3, 2), (6, 6, 4)])
def test_a_group_filling_part_of_each_host_runs_one_ring_each_way_through_each_nic_it_drives(nics, per_host, channels):
    """2 DGX H100 hosts with k NICs for 8 GPUs (GPU i on NIC i k // 8), the group the first m GPUs of each: 5 on 2
    NICs, 3 on 4 and 6 on 6 drive 2, 2 and 4 NICs, one of which serves one GPU of the group, so the group runs one
    ring per NIC it drives, as NCCL's search finds channels over the NICs local to the communicator's GPUs; each
    enters at the first GPU of its NIC and leaves through the NIC before, and every NIC the group drives sends one
    ring and receives one. A step moves n/(p ch) through each NIC each way at 50 GB/s, over p - 2 NVLink hops and 2
    across hosts, as for 8 + 2 ranks (`test_a_ring_over_a_partial_host_runs_each_of_its_nics_both_ways`): 19.43,
    17.97 and 9.96 ms, the estimate alike."""
    assert_one_ring_each_way_per_nic((*range(per_host), *range(8, 8 + per_host)), nics, channels)


def assert_one_ring_each_way_per_nic(ranks: tuple[int, ...], nics: int, channels: int) -> None:
    """The ring all-reduce of 1 GiB over ``ranks`` of 2 DGX H100 hosts with ``nics`` NICs runs ``channels`` rings,
    every NIC they cross sending one and receiving one, and takes 2 (p - 1) steps of n/(p ch) through each NIC at
    50 GB/s over p - 2 NVLink hops (3.4 us) and 2 across hosts (13 us), the estimate alike."""
    n = GIB
    topology = load_topology("dgx-h100-cluster", {"nodes": 2, "nics_per_node": nics})
    request = CollectiveRequest("all_reduce", ranks, n)
    phases = plan_collective(request, topology, "ring")
    assert {t.channel for phase in phases for t in phase.transfers} == set(range(channels))
    crossing = [t for phase in phases for t in phase.transfers if topology.gpu_host[t.src] != topology.gpu_host[t.dst]]
    for end in ("src", "dst"):
        counts = Counter(topology.gpu_nic[getattr(t, end)] for t in crossing)
        assert len(counts) == 2 * channels and set(counts.values()) == {1}, (end, counts)
    p = len(ranks)
    step = ((p - 2) * 3.4e-6 + 2 * 13e-6) / p + n / (p * channels * 50e9)
    simulated = time_collective(topology, "all_reduce", "ring", ranks, n)
    assert close(simulated, BASE + 2 * (p - 1) * step, 1e-6)
    assert close(estimates(request, topology, algorithms=("ring",))["ring"], simulated, 1e-6)


FSDP_TWO_HOSTS = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 4096, global_batch: 16, micro_batch: 1, precision: bf16, recompute: none}
parallelism: {tp: 1, pp: 1, dp: 16, fsdp: full_shard}
"""


def test_an_fsdp_step_runs_faster_with_every_nic_a_host_adds(run_yaml):
    """FSDP over 2 DGX H100 hosts (Llama 3 8B cut to 2 layers, DP 16): its all-gathers and reduce-scatters are rings
    that send and receive through every NIC alike, so each NIC added from 4 to 8 for the 8 GPUs shortens the step:
    measured 79.8, 70.5, 64.4, 62.1 and 60.5 ms."""
    step = [run_yaml(FSDP_TWO_HOSTS, f"cluster.nics_per_node={nics}").summary["step_time_s"] for nics in range(4, 9)]
    assert all(fewer > more for fewer, more in zip(step, step[1:])), step


@pytest.mark.parametrize("size, channels", [(10, 2), (12, 4)])
def test_a_ring_over_a_partial_host_runs_each_of_its_nics_both_ways(size, channels):
    """2 DGX H100 hosts, the group 8 GPUs on one and 2 (or 4) on the other, so ch = 2 (4) rings. Each ring enters the
    partial host at one of the local indices both hosts hold and leaves at the one before, in turn, so each of its NICs
    takes one ring in and one out and a step moves n/(p ch) through every NIC each way at 50 GB/s. A ring's p hops: p
    - 2 over NVLink (3.4 us), 2 across hosts (13 us), so t = 8.4 us + 2(p-1) (latency mean + n/(p ch 50 GB/s)): 19.43
    ms for p = 10 (busbw 99.5 GB/s), 9.96 ms for p = 12 (197.6 GB/s), in the flow and the analytic model alike. Rings
    entering the partial host at its first GPU and leaving at its last would run each of its NICs one way only: 38.76
    ms (49.9 GB/s) and 19.80 ms (99.4 GB/s)."""
    n = GIB
    topology = load_topology("dgx-h100-cluster", {"nodes": 2})
    phases = plan_collective(CollectiveRequest("all_reduce", tuple(range(size)), n), topology, "ring")
    into = Counter(topology.gpu_nic[t.dst] for phase in phases for t in phase.transfers
                   if topology.gpu_host[t.src] != topology.gpu_host[t.dst])
    partial_host_nics = [nic for nic in into if nic.startswith("h1/")]
    assert len(partial_host_nics) == size - 8 and cross_host_nics(topology, phases) == into
    step = ((size - 2) * 3.4e-6 + 2 * 13e-6) / size + n / (size * channels * 50e9)
    for mode in ("flow", "analytic"):
        row, = collective_sweep("dgx-h100-cluster", {"nodes": 2}, op="all_reduce", algorithm="ring", ranks=size,
                                sizes=[n], efficiency="ideal", mode=mode)
        assert close(row["time_s"], BASE + 2 * (size - 1) * step, 1e-6)


@pytest.mark.parametrize("nics, size, channels", [(4, 12, 2), (6, 12, 3), (6, 14, 4)])
def test_a_ring_over_a_partial_host_picks_its_ends_by_nic(nics, size, channels):
    """2 DGX H100 hosts with k NICs for 8 GPUs (GPU i on NIC i k // 8), the group 8 GPUs on one and the rest on the
    other: the partial host's GPUs drive ch NICs, one ring each (12 ranks: 2 of 4 NICs, 3 of 6; 14 ranks: 4 of 6).
    Each ring enters a host at a GPU on its channel's NIC and leaves at one on the same NIC or the NIC before, so
    every NIC the rings cross sends one and receives one, and a step moves n/(p ch) through each at 50 GB/s:
    19.80, 13.24 and 10.10 ms, the estimate alike."""
    assert_one_ring_each_way_per_nic(tuple(range(size)), nics, channels)


def two_spine_topology(hosts: int) -> Topology:
    """One GPU per host behind its leaf (bandwidth B); each leaf has two uplinks of B/2, one per spine, and
    a flow's channel picks its spine (a static ECMP hash that differs per connection)."""
    graph = Wiring()
    gpus = [f"gpu{h}" for h in range(hosts)]
    for host, gpu in enumerate(gpus):
        add_link(graph, gpu, f"leaf{host}", bandwidth=BANDWIDTH, latency=ALPHA / 4, link_class="infiniband")
        for spine in range(2):
            add_link(graph, f"leaf{host}", f"spine{spine}", bandwidth=BANDWIDTH / 2, latency=ALPHA / 4,
                     link_class="infiniband")

    def route(topo: Topology, src: int, dst: int, channel: int) -> list[str]:
        return [gpus[src], f"leaf{src}", f"spine{channel % 2}", f"leaf{dst}", gpus[dst]]

    return Topology("two-spine", graph, gpus, gpu_host=list(range(hosts)), gpu_local=[0] * hosts, router=route)


@pytest.mark.parametrize("channels,spines_used", [(1, 1), (None, 2)])
def test_one_gpu_per_host_ring_runs_two_channels(channels, spines_used):
    """NCCL doubles its search's channels (ncclTopoPostset), so a ring across hosts with one GPU each runs
    two rings, each its own flow: on a fabric whose hash sends them over different spines a hop gets both
    B/2 uplinks, against one uplink for a single ring: 2(p-1)(a + n/(p x spines x B/2))."""
    size, n = 4, 256 * MIB
    topology = two_spine_topology(size)
    plan = plan_collective(CollectiveRequest("all_reduce", tuple(range(size)), n, channels=channels or 0),
                           topology, "ring")
    assert {t.channel for t in plan[0].transfers} == set(range(spines_used))
    simulated = time_collective(topology, "all_reduce", "ring", size, n, channels=channels)
    assert close(simulated, BASE + 2 * (size - 1) * (ALPHA + n / (size * spines_used * BANDWIDTH / 2)))


def test_rail_aligned_ring_order_keeps_cross_hops_on_one_rail():
    topology = two_level_topology(4, 8, **TWO_LEVEL)
    hosts = group_by_host(tuple(range(32)), topology)
    for channel in range(8):
        order = ring_order(hosts, topology, channel)
        assert sorted(order) == list(range(32))
        hops = [(a, b) for a, b in zip(order, order[1:] + order[:1]) if topology.gpu_host[a] != topology.gpu_host[b]]
        assert len(hops) == 4
        assert all(topology.gpu_local[a] == topology.gpu_local[b] for a, b in hops)


@pytest.mark.parametrize("bandwidth,expected", [(12.5e9, 1.96), (450e9, 0.0544)])
def test_seed_vector_7b_fp16_gradients(bandwidth, expected):
    """[seed 000, Q1] 7e9 FP16 gradients (14e9 B), 8-GPU ring all-reduce: ~1.96 s at 12.5 GB/s, ~54 ms at
    450 GB/s."""
    simulated = time_collective(switch_topology(8, bandwidth=bandwidth), "all_reduce", "ring", 8, 14e9)
    assert close(simulated, expected, tolerance=0.02)


def test_ring_all_reduce_over_1024_ranks_is_one_phase():
    request = CollectiveRequest("all_reduce", tuple(range(1024)), 1 * GIB)
    phases = plan_collective(request, switch_topology(1024), "ring")
    assert len(phases) == 1 and phases[0].repeat == 2046 and len(phases[0].transfers) == 1024
    multi = plan_collective(replace(request, channels=0), two_level_topology(128, 8, **TWO_LEVEL), "ring")
    assert len(multi) == 1 and len(multi[0].transfers) == 8 * 1024
    assert {t.channel for t in multi[0].transfers} == set(range(8))


def test_flow_and_analytic_agree_without_contention():
    topology = switch_topology(8)
    flow = time_collective(topology, "all_reduce", "ring", 8, 64 * MIB, mode="flow")
    analytic = time_collective(topology, "all_reduce", "ring", 8, 64 * MIB, mode="analytic")
    assert close(flow, analytic, tolerance=1e-9)


@pytest.mark.parametrize("topology, overrides, line_rate", [
    ("ethernet-100g", {"nodes": 8}, 12.5e9),
    ("dgx-h100-cluster", {"nodes": 8, "node": {"gpus": 1}, "nics_per_node": 1}, 50e9)])
def test_analytic_ring_on_one_nic_hosts_keeps_to_line_rate_as_the_flow_model_does(topology, overrides, line_rate):
    """A ring all-reduce over one-GPU hosts with one NIC each runs its two channels through that NIC: on the
    analytic model they share its line rate, as on the wire and in the flow model, and the busbw stays under it
    (each channel at the NIC's full rate would read 24.93 GB/s on 12.5 GB/s, 99.00 on 50)."""
    rows = {mode: collective_sweep(topology, overrides, op="all_reduce", algorithm="ring", ranks=8, sizes=[GIB],
                                   efficiency="ideal", mode=mode)[0] for mode in ("flow", "analytic")}
    assert rows["analytic"]["busbw_GBps"] * 1e9 < line_rate
    assert math.isclose(rows["analytic"]["time_s"], rows["flow"]["time_s"], rel_tol=1e-12)


def test_efficiency_scales_the_bandwidth_term():
    topology = switch_topology(4, alpha=0.0)
    full = time_collective(topology, "all_gather", "ring", 4, GIB)
    slowed = time_collective(topology, "all_gather", "ring", 4, GIB, efficiency={"nvlink": 0.5})
    assert close(slowed - BASE, 2 * (full - BASE), tolerance=1e-9)


def test_send_recv_is_one_transfer():
    phases = plan_collective(CollectiveRequest("send_recv", (3, 5), MIB), switch_topology(8), "direct")
    assert len(phases) == 1 and len(phases[0].transfers) == 1
    assert close(time_collective(switch_topology(8), "send_recv", "auto", (3, 5), MIB), ALPHA + MIB / BANDWIDTH)


def test_an_unknown_algorithm_or_collective_is_refused_where_it_enters_and_lists_the_choices():
    """The command line's op and algorithm are checked once, by `trainsim collective` (a scenario's by the
    schema): the planner takes only the typed sets."""
    with pytest.raises(ScenarioError) as info:
        collective_sweep("dgx-h100", {}, op="all_reduce", algorithm="butterfly", ranks=2, sizes=[MIB])
    assert (info.value.problem, info.value.field) == ("unknown algorithm 'butterfly'", "collectives.algorithm")
    assert info.value.allowed == ("ring, tree, hierarchical, direct, halving_doubling, nvls, collnet_direct, "
                                  "nvls_sharp, userbuffers, ring_exchange, auto")
    with pytest.raises(ScenarioError) as info:
        collective_sweep("dgx-h100", {}, op="gather", algorithm="auto", ranks=2, sizes=[MIB])
    assert (info.value.problem, info.value.field) == ("unknown collective 'gather'", "op")
    assert info.value.allowed == ", ".join(PRIMITIVES)


def test_one_rank_is_refused_as_too_few_not_as_too_many():
    """`collective_sweep(ranks=1)` is refused as too few: one rank fits dgx-h100 (not '1 ranks do not fit dgx-h100 (8
    GPUs)'); a collective needs two."""
    with pytest.raises(ScenarioError) as info:
        collective_sweep("dgx-h100", {}, op="all_reduce", algorithm="auto", ranks=1, sizes=[MIB])
    assert (info.value.problem, info.value.field, info.value.allowed) == (
        "1 rank: a collective needs two or more", "--ranks", "2..8")


def test_a_scenario_names_an_algorithm_of_the_one_set():
    text = "cluster: {topology: dgx-h100}\ncollectives: {algorithm: butterfly}\nworkload: []\n"
    with pytest.raises(ScenarioError) as info:
        scenario_from_text(text, "s.yaml")
    assert (info.value.field, info.value.line) == ("collectives.algorithm", 2)
    assert all(name in info.value.allowed for name in ALGORITHM_CHOICES)


def test_unsupported_primitive_names_the_algorithms_that_can():
    with pytest.raises(ScenarioError) as info:
        plan_collective(CollectiveRequest("all_to_all", (0, 1, 2), MIB), switch_topology(3), "ring")
    assert "does not implement all_to_all" in str(info.value) and "direct" in info.value.allowed


SEND_RECV = "cluster: {topology: dgx-h100-cluster}\n%sworkload:\n  - {op: send_recv, src: 0, dst: 8, bytes: 1 MiB%s}\n"
"""A scenario of one send_recv across two DGX H100 hosts: run-wide collectives settings, the item's own."""


@pytest.mark.parametrize("own, field, problem, allowed", [
    (", algorithm: tree", "workload[0].algorithm", "algorithm 'tree' does not implement send_recv", "direct or auto"),
    (", protocol: ll", "workload[0].protocol", "protocol 'll' does not run direct send_recv on this group",
     "simple or auto"),
])
def test_a_send_recv_refuses_an_algorithm_or_protocol_it_does_not_run(tmp_path, capsys, own, field, problem, allowed):
    """A send_recv item's own algorithm or protocol is refused at load as an all_to_all's is, naming what runs."""
    path = tmp_path / "s.yaml"
    path.write_text(SEND_RECV % ("", own))
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}:3: {field}: {problem} (allowed: {allowed})\n"


ALL_TO_ALL = "cluster: {topology: dgx-h100-cluster}\n%sworkload:\n  - {op: all_to_all, bytes: 1 MiB%s}\n"
"""A scenario of one all_to_all over two DGX H100 hosts: run-wide collectives settings, the item's own."""


def test_an_all_to_all_refuses_its_own_protocol_as_a_send_recv_does_and_runs_under_the_run_wide_one(tmp_path,
                                                                                                     capsys):
    """An all_to_all ran its own protocol 'll' as Simple, saying nothing, where a send_recv's is refused: both run
    point to point under Simple (`names.POINT_TO_POINT`), the run-wide protocol the other collectives'."""
    path = tmp_path / "s.yaml"
    path.write_text(ALL_TO_ALL % ("", ", protocol: ll"))
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == (f"error: {path}:3: workload[0].protocol: protocol 'll' does not run direct "
                                       "all_to_all on this group (allowed: simple or auto)\n")
    path.write_text(ALL_TO_ALL % ("collectives: {protocol: ll}\n", ""))
    assert main(["validate", str(path)]) == 0


def test_a_send_recv_runs_under_any_run_wide_collectives_setting(tmp_path, capsys):
    """The run-wide `collectives:` algorithm and protocol are the collectives': a send_recv (a pipeline's hand-off
    too) runs point to point under them."""
    path = tmp_path / "s.yaml"
    path.write_text(SEND_RECV % ("collectives: {algorithm: tree, protocol: ll}\n", ""))
    assert main(["validate", str(path)]) == 0


@pytest.mark.parametrize("group", ["[0, 8]", "[8, 0]", "all"])
def test_a_send_recv_takes_a_group_that_names_its_src_and_dst(tmp_path, capsys, group):
    """A send_recv's group, where given, names the two GPUs it sends between (in either order) or is `all`: such a
    workload runs as one with no group (a group that contradicts src and dst is refused: test_bad_input_list)."""
    path = tmp_path / "s.yaml"
    path.write_text(SEND_RECV % ("", f", group: {group}"))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    path.write_text(SEND_RECV % ("", ""))
    assert main(["run", str(path), "--out", str(tmp_path / "plain"), "--quiet"]) == 0
    summary, plain = (json.loads((tmp_path / out / "summary.json").read_text()) for out in ("out", "plain"))
    assert summary["collectives"] == plain["collectives"] and summary["makespan_s"] == plain["makespan_s"] > 0


@pytest.mark.parametrize("asked, op", [("collnet_direct", "all_reduce"), ("nvls_sharp", "all_reduce"),
                                       ("userbuffers", "all_reduce"), ("nvls", "broadcast")])
def test_an_algorithm_refused_on_a_topology_offers_those_that_run_there(asked, op):
    """An algorithm refused on a topology offers what plans there, each checked by planning it: collnet_direct on one
    DGX H100 offers nvls, the fastest all-reduce there; userbuffers' refusal does not offer collnet_direct or
    nvls_sharp, which need SHARP switches the node lacks."""
    topology = load_topology("dgx-h100")
    request = CollectiveRequest(op, tuple(range(8)), 64 * MIB)
    with pytest.raises(ScenarioError) as info:
        plan_collective(request, topology, asked)
    offered = info.value.allowed.removesuffix(" or auto").split(", ")
    assert offered and asked not in offered
    for name in offered:
        assert plan_collective(request, topology, name)
    assert {"collnet_direct", "nvls_sharp"}.isdisjoint(offered)
    assert ("nvls" in offered) == (op == "all_reduce")


@pytest.mark.parametrize("topology, overrides", [("dgx-h100", None), ("dgx-h100-cluster", {"nodes": 2}),
                                                  ("dgx-h100-superpod", {"nodes": 3}), ("gb200-nvl72", {"racks": 2}),
                                                  ("dgx-a100", None), ("ethernet-100g", None)])
def test_the_algorithms_offered_are_exactly_those_whose_plan_runs(topology, overrides):
    """runnable_algorithms asks each algorithm's check, never its plan: the checks must refuse exactly what the
    plans refuse, for every primitive on groups in one host, across hosts, uneven and of a size not a power of
    two."""
    cluster = load_topology(topology, overrides)
    per_host = len(group_by_host(tuple(range(cluster.num_gpus)), cluster)[0])
    groups = {tuple(range(cluster.num_gpus)), (0, 1), tuple(range(6)), tuple(range(0, cluster.num_gpus, per_host)),
              tuple(range(min(cluster.num_gpus, per_host + 2)))}
    for group in (g for g in groups if len(g) > 1):
        for op in (op for op in PRIMITIVES if op != "send_recv"):
            request = CollectiveRequest(op, group, 64 * MIB)
            planned = []
            for name, entry in ((n, e) for n, e in ALGORITHMS.items() if op in e.ops):
                try:
                    entry.plan(request, cluster)
                except ScenarioError:
                    continue
                planned.append(name)
            assert runnable_algorithms(request, cluster) == planned, (op, group)


def test_offering_algorithms_builds_no_plan(monkeypatch):
    """Offering what runs a 4,096-GPU all-reduce planned every algorithm first: direct's 16.8 M transfers took
    14 s and 1.8 GB before the refusal. The offer asks the checks alone."""
    def no_plan(request, topology):
        raise AssertionError("an offer planned a collective")
    for name, entry in list(ALGORITHMS.items()):
        monkeypatch.setitem(ALGORITHMS, name, replace(entry, plan=no_plan))
    cluster = load_topology("dgx-h100-cluster", {"nodes": 512})
    request = CollectiveRequest("all_reduce", tuple(range(cluster.num_gpus)), 64 * MIB)
    assert runnable_algorithms(request, cluster) == ["ring", "tree", "hierarchical", "direct", "halving_doubling",
                                                     "nvls"]


@pytest.mark.parametrize("bad", [dict(ranks=(0, 0)), dict(ranks=(0, 9)), dict(nbytes=-1.0),
                                 dict(root=2), dict(chunk_bytes=0.0)])
def test_bad_requests_are_rejected(bad):
    request = dict(op="all_reduce", ranks=(0, 1), nbytes=MIB) | bad
    with pytest.raises(ScenarioError):
        plan_collective(CollectiveRequest(**request), switch_topology(4), "ring")


def test_auto_rule():
    """channels=0: one ring per rail, as a scenario's default."""
    request = partial(CollectiveRequest, channels=0)
    single = switch_topology(8)
    cluster = two_level_topology(16, 8, **TWO_LEVEL)
    everyone = tuple(range(128))
    assert choose(request("all_reduce", tuple(range(8)), GIB), single, protocol="simple").algorithm == "ring"
    assert choose(request("all_to_all", everyone, GIB), cluster, protocol="simple").algorithm == "direct"
    assert choose(request("all_gather", everyone, GIB), cluster, protocol="simple").algorithm == "ring"
    assert choose(request("all_reduce", everyone, 4 * KIB), cluster, protocol="simple").algorithm == "tree"
    assert choose(request("all_reduce", everyone, 8 * GIB), cluster, protocol="simple").algorithm == "ring"
    for op in ("broadcast", "reduce"):  # NCCL's tuner costs only the ring (a pipelined chain) for these
        assert choose(request(op, everyone, MIB), cluster, protocol="simple").algorithm == "ring"


def test_auto_is_never_much_slower_than_the_best_candidate():
    cluster = two_level_topology(4, 4, **TWO_LEVEL)
    for nbytes in (4 * KIB, 1 * MIB, 256 * MIB):
        times = {name: time_collective(cluster, "all_reduce", name, 16, nbytes)
                 for name in ("ring", "tree", "hierarchical")}
        assert time_collective(cluster, "all_reduce", "auto", 16, nbytes) <= 1.5 * min(times.values())


def test_busbw_factors_and_ring_busbw_reaches_link_speed():
    assert bus_bandwidth_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_bandwidth_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_bandwidth_factor("broadcast", 64) == 1.0
    assert set(PRIMITIVES) == {"broadcast", "reduce", "all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                               "send_recv"} == set(BUS_FACTORS)
    time_s = time_collective(switch_topology(16, alpha=0.0), "all_reduce", "ring", 16, GIB) - BASE
    assert close(bus_bandwidth("all_reduce", 16, GIB, time_s), BANDWIDTH, tolerance=1e-6)


def test_a_sweep_reports_each_size_as_it_begins_and_the_end():
    heard = []
    collective_sweep("dgx-h100", {}, op="all_gather", algorithm="auto", ranks=8, sizes=[MIB, 2 * MIB],
                     progress=lambda done, total: heard.append((done, total)))
    assert heard == [(0, 2), (1, 2), (2, 2)]


def test_a_send_recv_names_the_direct_transfer_it_runs():
    """A send_recv under `auto` is one direct transfer under Simple, as its algorithm and protocol columns say."""
    from simulator.collective_sweep import collective_sweep

    rows = collective_sweep("dgx-h100", {}, op="send_recv", algorithm="auto", ranks=2, sizes=[2**20, 2**24])
    assert [(row["resolved_algorithm"], row["resolved_protocol"]) for row in rows] == [("direct", "simple")] * 2


def cheapest_by_the_rule(candidates: list[dict]) -> tuple[str, str]:
    """The documented rule (docs/collectives.md, "The `auto` rule"): the first candidate listed whose estimate is
    within 1e-9 of the lowest."""
    lowest = min(each["estimate_s"] for each in candidates)
    first = next(each for each in candidates if each["estimate_s"] <= lowest * (1 + 1e-9))
    return first["algorithm"], first["protocol"]


def test_collective_explain_lists_every_candidate_and_picks_the_cheapest_by_the_rule(capsys):
    """`--explain` on 2 DGX A100 hosts: the ring and the tree, each under Simple, LL128 and LL, with their estimates;
    the pair that ran is the one the rule picks from them, at every size; the table marks it."""
    args = ["collective", "--topology", "dgx-a100-cluster", "--set", "nodes=2", "--sizes", "64KiB,4MiB,256MiB",
            "--explain"]
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        candidates = row["auto"]["candidates"]
        assert [(each["algorithm"], each["protocol"]) for each in candidates] == [
            (name, protocol) for name in ("ring", "tree") for protocol in ("simple", "ll128", "ll")]
        assert all(each["estimate_s"] > 0 for each in candidates)
        picked = (row["auto"]["algorithm"], row["auto"]["protocol"])
        assert picked == cheapest_by_the_rule(candidates) == (row["resolved_algorithm"], row["resolved_protocol"])
    assert [row["resolved_algorithm"] for row in rows] == ["tree", "ring", "ring"]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "# why auto picked: the lowest estimate" in table
    assert len([line for line in table.splitlines() if line.endswith("<- picked")]) == 3
    assert len([line for line in table.splitlines() if line.lstrip().startswith(("64 KiB", "4 MiB", "256 MiB"))]) \
        == 3 + 3 * 6


def test_collective_explain_says_an_all_to_all_weighs_nothing(capsys):
    assert main(["collective", "--topology", "dgx-h100", "--op", "all_to_all", "--sizes", "1MiB", "--explain",
                 "--json"]) == 0
    row, = json.loads(capsys.readouterr().out)
    assert row["auto"] is None and row["resolved_algorithm"] == "direct"


def test_a_runs_summary_says_why_auto_picked_per_kind_of_collective(run_yaml):
    """summary.json's `auto_choices`: one entry per kind of collective left to `auto` and group size, at its
    largest size, with the candidates' estimates and the pick by the rule, which is what ran; the all_to_all, run
    point to point, weighs nothing and has none. The 8-rank all-reduce inside one host, of a smaller size, has an
    entry of its own, and picks otherwise than the 16 ranks across hosts."""
    summary = run_yaml("cluster: {topology: dgx-h100-cluster}\nworkload:\n  - {op: all_reduce, bytes: 1 MiB}\n"
                       "  - {op: all_reduce, bytes: 1 GiB}\n  - {op: all_to_all, bytes: 1 MiB}\n"
                       "  - {op: all_reduce, bytes: 256 KiB, group: [0, 1, 2, 3, 4, 5, 6, 7]}\n").summary
    host, entry = summary["auto_choices"]
    assert (host["op"], host["bytes"], host["ranks"]) == ("all_reduce", 256 * KIB, 8)
    assert (entry["op"], entry["bytes"], entry["ranks"]) == ("all_reduce", GIB, 16)
    assert (host["algorithm"], host["protocol"]) == cheapest_by_the_rule(host["candidates"])
    assert (host["algorithm"], host["protocol"]) != (entry["algorithm"], entry["protocol"])
    assert (entry["algorithm"], entry["protocol"]) == cheapest_by_the_rule(entry["candidates"])
    assert {each["algorithm"] for each in entry["candidates"]} >= {"ring", "tree"}
    row, = collective_sweep("dgx-h100-cluster", {}, op="all_reduce", algorithm="auto", ranks=16, sizes=[GIB])
    assert (entry["algorithm"], entry["protocol"]) == (row["resolved_algorithm"], row["resolved_protocol"])
