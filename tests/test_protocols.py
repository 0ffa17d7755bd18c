"""NCCL's LL and LL128 protocols (collectives/protocols.py): the closed forms come out of the simulation with each
protocol's latency per hop and payload share, `auto` chooses the protocol with the algorithm by the one estimate,
and the option reaches the runs and the reports."""

from __future__ import annotations

import json
import math

import pytest
from shared import ALPHA, BANDWIDTH, KIB, MIB, chakra_scenario, chakra_step, run, switch_topology, two_level_topology

from simulator.cli import main
from simulator.collective_sweep import collective_sweep
from simulator.collectives import protocols
from simulator.collectives.chunking import nccl_chunk
from simulator.collectives.execute import time_collective
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.registry import plan_collective
from simulator.collectives.tuner import Choice, choose, estimates
from simulator.network.calibration import calibrated
from simulator.topology.loader import load_topology

RING_NVLINK_SCALE = {"ll": 0.6 / 3.4, "ll128": 1.9 / 3.4}
"""NCCL's ring latency per NVLink hop over Simple's (tuning.cc hwLatencies: 0.6, 1.9 and 3.4 us)."""
RING_NET_SCALE = {"ll": 2.7 / 14, "ll128": 4.0 / 14}
"""The same over the network (2.7, 4.0 and 14 us)."""
PAYLOAD = {"ll": 0.5, "ll128": 120 / 128}
"""Data per byte on the wire: LL's 8-byte line holds 4 bytes of data, LL128's 128-byte line 120."""
RING_BASE = {"ll": 6.6e-6, "ll128": 14e-6, "simple": 8.4e-6}
"""NCCL's base latency of a ring collective, paid once (tuning.cc baseLatencies)."""


@pytest.mark.parametrize("protocol", ["ll", "ll128"])
@pytest.mark.parametrize(("size", "nbytes"), [(2, 8.0), (8, 64 * KIB), (16, 4 * MIB), (64, 1 * MIB)])
def test_ring_all_reduce_is_its_closed_form_under_each_protocol(protocol, size, nbytes):
    """base + 2 (p - 1) (a s + n / (p f B)): the protocol's base latency, then the ring's steps at its latency per
    hop (s a) and payload share f, on a non-blocking switch at line rate; the estimate is the same closed form."""
    topology = switch_topology(size)
    expected = RING_BASE[protocol] + 2 * (size - 1) * (ALPHA * RING_NVLINK_SCALE[protocol]
                                                       + nbytes / (size * PAYLOAD[protocol] * BANDWIDTH))
    simulated = time_collective(topology, "all_reduce", "ring", size, nbytes, protocol=protocol)
    assert simulated == pytest.approx(expected, rel=1e-9)
    request = CollectiveRequest("all_reduce", tuple(range(size)), nbytes)
    assert estimates(request, topology, None, protocol)["ring"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("protocol", ["ll", "ll128"])
def test_ring_across_hosts_pays_the_network_latency_of_the_protocol(protocol):
    """Two hosts of two GPUs: the ring's 4 hops, 2 over NVLink (a_in = 2 us) and 2 over the rails (a_out = 10 us),
    each step at the mean hop latency, NVLink hops scaled as NCCL's NVLink figures, network hops as its
    network figures. The base latency, then 2 (p - 1) steps of ((p - N) s_in a_in + N s_out a_out) / p
    + n / (p f B_out)) (the rails at 25 GB/s bind; the 2 channels' rings leave on both rails)."""
    a_in, a_out, b_out, nbytes = 2e-6, 10e-6, 25e9, 1 * MIB
    topology = two_level_topology(2, 2, b_in=400e9, a_in=a_in, b_out=b_out, a_out=a_out)
    hop = (2 * a_in * RING_NVLINK_SCALE[protocol] + 2 * a_out * RING_NET_SCALE[protocol]) / 4
    expected = RING_BASE[protocol] + 2 * 3 * (hop + nbytes / (4 * PAYLOAD[protocol] * 2 * b_out))
    simulated = time_collective(topology, "all_reduce", "ring", 4, nbytes, protocol=protocol)
    assert simulated == pytest.approx(expected, rel=1e-9)


def test_a_chain_under_ll_streams_without_the_window_stall():
    """A broadcast chain of 1 KiB chunks: under Simple each streamed step waits on the 8 slots (the chunk takes
    20 ns against 5 us of latency: 2 (a + c b) / 8 per step); under LL only the first chunk's hops pay latency,
    0.6/3.4 of Simple's, and the later chunks follow at the wire rate, c / (f B) a step."""
    size, nbytes, chunk = 5, 1 * MIB, 1 * KIB
    chunks = math.ceil(nbytes / chunk)
    step = chunk / (0.5 * BANDWIDTH)
    expected = RING_BASE["ll"] + (size - 1) * (ALPHA * RING_NVLINK_SCALE["ll"] + step) + (chunks - 1) * step
    simulated = time_collective(switch_topology(size), "broadcast", "ring", size, nbytes, chunk_bytes=chunk,
                                protocol="ll")
    assert simulated == pytest.approx(expected, rel=1e-9)
    simple = time_collective(switch_topology(size), "broadcast", "ring", size, nbytes, chunk_bytes=chunk)
    assert simple > 10 * simulated


def test_auto_takes_ll_then_ll128_then_simple_as_messages_grow():
    """8 A100s of one DGX (no NVLink SHARP, so the ring alone): LL's 0.6 us hops win the small all-reduces, LL128
    the middle, Simple the large. Each of the 14 steps carries n/8 at 230 GB/s: LL128's 1.3 us more per hop
    than LL, and its base latency 7.4 us more (14 against 6.6), 25.6 us in all, cost less than LL's half wire
    (14 n/8 (2 - 128/120) / B) from n/8 = 450 KB, n = 3.6 MB (3.4 MiB); Simple's 1.5 us more per hop than LL128,
    less its base latency's 5.6 us less (8.4 against 14), 15.4 us in all, cost less than LL128's flags
    (14 n/8 (128/120 - 1) / B) from n/8 = 3.8 MB, n = 30 MB (28.6 MiB). LL is weighed no faster than NCCL's cap
    on LL inside an Ampere host (87.7 GB/s busbw: 6.6 us + 1.75 n / 87.7 GB/s), which passes LL128's between 2.5
    and 3 MiB (62.8 us of the cap's wire at 3 MiB), before the wire alone would (3.4 MiB): 3 MiB took LL."""
    topology = load_topology("dgx-a100", {})
    efficiency = calibrated(topology.gpu_model)
    picks = {nbytes: choose(CollectiveRequest("all_reduce", tuple(range(8)), nbytes, chunk_bytes=4 * MIB),
                            topology, efficiency) for nbytes in (8.0, 2.5 * MIB, 3 * MIB, 27 * MIB, 31 * MIB)}
    assert [pick.protocol for pick in picks.values()] == ["ll", "ll", "ll128", "ll128", "simple"]
    assert {pick.algorithm for pick in picks.values()} == {"ring"}


def test_nvls_and_collnet_are_simple_only_and_ll128_needs_nvlink():
    h100 = load_topology("dgx-h100", {})
    pcie = load_topology("dgx-h100-cluster", {"nodes": 1, "node": {"kind": "pcie_node"}})
    everyone = tuple(range(8))
    assert protocols.available("nvls", "all_reduce", everyone, h100) == ("simple",)
    assert protocols.available("collnet_direct", "all_reduce", everyone, h100) == ("simple",)
    assert protocols.available("tree", "broadcast", everyone, h100) == ("simple",)
    assert protocols.available("ring", "broadcast", everyone, h100) == ("simple", "ll128", "ll")
    assert protocols.available("ring", "all_reduce", everyone, pcie) == ("simple", "ll")
    # a protocol asked for keeps auto's algorithm among those that run it: the ring, not NVLS, under LL128
    request = CollectiveRequest("all_reduce", everyone, 256 * MIB)
    assert choose(request, h100, calibrated(h100.gpu_model)) == Choice("nvls", "simple")
    assert choose(request, h100, calibrated(h100.gpu_model), protocol="ll128") == Choice("ring", "ll128")


@pytest.mark.parametrize(("cluster", "ranks", "algorithm", "protocol"), [
    ("{topology: dgx-h100}", [0, 1, 2, 3], "ring", "ll"),
    ("{topology: dgx-h100-cluster, nodes: 2}", [0, 1, 8, 9], "tree", "ll128")])
def test_the_flags_load_the_links_but_the_traffic_counts_the_payload(tmp_path, cluster, ranks, algorithm, protocol):
    """A 4-GPU all-reduce of n, rank 0 simulated: under LL its flows carry twice the payload and under LL128
    128/120 of it, but each GPU reports the 2 (p-1)/p n = 1.5 n it sends, as under Simple (test_traces.py)."""
    chakra_step(tmp_path, 0, [{"pg_name": "0", "pg_desc": "default_pg", "ranks": ranks, "group_size": 4}], "0")
    _, result = run(chakra_scenario(tmp_path, cluster, algorithm, protocol), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(1.5 * 64 * MIB, rel=1e-12)


def test_the_summary_names_the_algorithm_and_protocol_that_ran(run_yaml):
    text = ("cluster: {topology: dgx-h100}\nworkload:\n  - {name: small, op: all_reduce, bytes: 8 KiB}\n"
            "  - {name: large, op: all_reduce, bytes: 1 GiB}\n  - {name: asked, op: all_gather, bytes: 1 MiB, "
            "protocol: ll128}\n")
    rows = run_yaml(text).summary["collectives"]
    assert [(row["algorithm"], row["protocol"]) for row in rows] == [("ring", "ll"), ("nvls", "simple"),
                                                                     ("ring", "ll128")]


def test_trainsim_collective_shows_the_protocol_that_ran(capsys):
    assert main(["collective", "--topology", "dgx-a100", "--sizes", "8B,1GiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(row["resolved_algorithm"], row["resolved_protocol"]) for row in rows] == [("ring", "ll"),
                                                                                     ("ring", "simple")]
    assert {row["protocol"] for row in rows} == {"auto"}
    assert main(["collective", "--topology", "dgx-a100", "--sizes", "8B", "--protocol", "ll128"]) == 0
    table = capsys.readouterr().out
    assert "protocol=ll128" in table and table.rstrip().endswith("ring             ll128")


def test_a_small_all_reduce_pays_nccls_base_latency_once():
    """8 bytes over one DGX H100 (its NVLink hop 3.4 us, NCCL's Simple ring figure): `auto` runs the LL ring, 6.6 us
    of base latency then 14 hops of 0.6 us, 15.0 us as NCCL's tuner reckons it (tuning.cc: baseLatencies plus
    nsteps x hwLatencies), where it took 8.4 us without the base latency; the bytes add 0.1 ns. NVLS has no base
    latency in NCCL: its 25 us alone."""
    topology = load_topology("dgx-h100", {})
    efficiency = calibrated(topology.gpu_model)
    assert topology.path_latency(0, 1) == pytest.approx(3.4e-6)
    assert time_collective(topology, "all_reduce", "auto", 8, 8.0, efficiency=efficiency,
                           protocol="auto") == pytest.approx(6.6e-6 + 14 * 0.6e-6, rel=1e-4)
    assert time_collective(topology, "all_reduce", "nvls", 8, 8.0, efficiency=efficiency) == pytest.approx(25e-6,
                                                                                                          rel=1e-4)


@pytest.mark.parametrize("protocol", ["ll", "ll128", "simple"])
def test_the_tree_pays_its_own_base_latency_before_its_first_step(protocol):
    """A double binary tree all-reduce of 8 ranks in one chunk per tree (c = n/2): NCCL's tree base latency (6.8,
    14 and 8.4 us), then up and down H = 3 levels, each level's first step paying the tree's latency per hop
    (0.6, 1.25 and 4.0 us over Simple's 4.0, times a), and 2 (H - 1) + 1 chunk times per pass at the payload share
    (the root edge carries one chunk, the others two)."""
    size, nbytes = 8, 64 * KIB
    scale = {"ll": 0.6 / 4.0, "ll128": 1.25 / 4.0, "simple": 1.0}[protocol]
    payload = {"ll": 0.5, "ll128": 120 / 128, "simple": 1.0}[protocol]
    base = {"ll": 6.8e-6, "ll128": 14e-6, "simple": 8.4e-6}[protocol]
    chunk_s = nbytes / 2 / (payload * BANDWIDTH)
    expected = base + 2 * (3 * ALPHA * scale + (2 * 2 + 1) * chunk_s)
    simulated = time_collective(switch_topology(size), "all_reduce", "tree", size, nbytes, protocol=protocol)
    assert simulated == pytest.approx(expected, rel=1e-9)
    phases = plan_collective(CollectiveRequest("all_reduce", tuple(range(size)), nbytes), switch_topology(size),
                             "tree", protocol=protocol)
    assert [phase.launch for phase in phases] == pytest.approx([base] + [0.0] * (len(phases) - 1), rel=1e-12)


def test_the_default_chunk_is_one_step_of_nccls_buffer_for_the_protocol():
    """`collectives.chunk` defaulted to 4 MiB, NCCL's whole Simple buffer of 8 steps, where NCCL pipelines a chain
    and a tree one step at a time (enqueue.cc `calcCollChunking`: buffSize / NCCL_STEPS, BROADCAST_CHUNKSTEPS 1):
    every hop of the fill took 8 steps' time. A 64 MiB broadcast over 2 DGX H100s is 8 channels of 8 MiB over
    a 15-hop chain: in 4 MiB chunks 16 steps of 4 MiB at ~47 GB/s, 1,631 us (busbw 41 GB/s, below one NIC's);
    in Simple's 512 KiB, 30 steps of ~11 us, 538 us. LL moves 32 KiB of data a step, LL128 576,000 B (8 MiB in
    15 chunks)."""
    topology = load_topology("dgx-h100-cluster", {})
    request = CollectiveRequest("broadcast", tuple(range(16)), 64 * MIB, chunk_bytes="auto")
    for protocol, chunk in (("simple", 512 * KIB), ("ll", 32 * KIB), ("ll128", 8 * MIB / 15)):
        phases = plan_collective(request, topology, "ring", protocol=protocol)
        payload = sorted({t.nbytes * t.sent_share for phase in phases for t in phase.transfers})
        assert payload == pytest.approx([chunk], rel=1e-12), protocol
    rows = [collective_sweep("dgx-h100-cluster", {}, op="broadcast", algorithm="ring", protocol="simple", ranks=16,
                             sizes=[64 * MIB], **chunk)[0] for chunk in ({}, {"chunk": "512KiB"}, {"chunk": "4MiB"})]
    assert rows[0]["time_s"] == rows[1]["time_s"] < 0.6e-3 < 1.5e-3 < rows[2]["time_s"]


def test_the_ll128_tree_halves_its_chunk_while_a_share_makes_few_chunks_for_the_trees_depth():
    """NCCL's LL128 tree (enqueue.cc): 4 hosts of 8, nsteps = 1 + log2(4) + 0.1 x 8 = 3.8; a channel's 4 MiB
    makes 4,194,304 // 576,000 = 7 chunks, under 64 x 3.8 / 8 = 30.4: halved to 288,000 (14), 144,000 (29),
    72,000 (58, and under 131,072 anyway), which 16 x 3.8 / 8 = 7.6 leaves; whole 1,920 B grains: 71,040 B. A
    share of 64 MiB makes 116 chunks of 576,000 and keeps them; a chain (no tree) keeps them at any size."""
    assert nccl_chunk("ll128", 4 * MIB, (4, 8.0)) == 71040
    assert nccl_chunk("ll128", 64 * MIB, (4, 8.0)) == 576000
    assert nccl_chunk("ll128", 4 * MIB) == 576000
    assert nccl_chunk("simple", 4 * MIB, (4, 8.0)) == 512 * KIB


def test_the_ll128_tree_chunk_counts_nvlink_domains_as_nccls_nodes():
    """Under MNNVL NCCL's nNodes is the NVLink domains (a GB200 rack of 18 trays is one node), which the LL128
    tree's chunk reads: over 2 racks (16 channels, the ring's) a channel's tree moves 512 KiB of a 16 MiB
    all-reduce, nsteps = 1 + log2(2) + 0.1 x 72 = 9.2, halved from 576,000 B while under 64 x 9.2 / 72 = 8.2
    chunks: 72,000 B, cut to 71,040 in whole grains, 8 chunks. Counted as 36 trays of 4 (nsteps 6.4, under 102.4
    chunks down to 128 KiB, then under 25.6 down to 32 KiB: 32,640 B) it would be 17."""
    topology = load_topology("gb200-nvl72", {"racks": 2})
    request = CollectiveRequest("all_reduce", tuple(range(144)), 16 * MIB, chunk_bytes="auto")
    phases = plan_collective(request, topology, "tree", protocol="ll128")
    payload = sorted({t.nbytes * t.sent_share for phase in phases for t in phase.transfers})
    assert payload == pytest.approx([MIB / 2 / 8], rel=1e-12)
