"""Communication-only scenarios end to end (YAML -> simulate): seed test vectors, calibration, contention, deadlock.

Reference figures (copied here; the source is the project's reference set, hardware.md and published-results.md):
- [seed 000, Q1] 7e9 FP16 gradients = 14e9 B, ring all-reduce over N = 8: each GPU moves 2(N-1)/N x 14 GB = 24.5 GB;
  ~1.96 s at 12.5 GB/s (100 GbE), ~54 ms at 450 GB/s (NVLink, per direction).
- [seed 003] Llama-3.1-8B BF16 gradients 16.06e9 B, 8-GPU ring: 2 x 7/8 x 16.06 GB; ~0.06 s on NVLink 450 GB/s,
  ~0.56 s at 400 Gb/s (50 GB/s).
- nccl-tests #149: 8x A100 SXM all_reduce busbw ~230 GB/s at >= 8 GB; nccl-tests #290: one NDR 400 Gb/s NIC
  achieves 46-48 GB/s.
- [seed 000, Q5] TP = 16 across two 8-GPU nodes over InfiniBand is slower than TP = 8 inside one node; the seed's
  analysis assumes ring algorithms.
"""

from __future__ import annotations

import json

import pytest
from shared import DATA, NCCL_SIMPLE_BASE_S

from simulator.cli import main
from simulator.collective_sweep import collective_sweep
from simulator.config.loader import scenario_from_text
from simulator.errors import SimulationError
from simulator.program.ops import CollectiveOp, ComputeOp
from simulator.simulation import NetworkSettings, run_ops, simulate
from simulator.topology.loader import load_topology
from simulator.units import parse_size_range

NVLINK_H100 = 450e9      # B/s per direction (H100 datasheet)
ETHERNET_100G = 12.5e9   # B/s per direction (100 GbE)
NDR_NIC = 50e9           # B/s per direction (NDR 400 Gb/s)

EIGHT_HOSTS_400G = DATA / "eight-hosts-400g.yaml"


def collective_times(text: str) -> dict[str, float]:
    """Simulate a scenario given as YAML text; time of each workload item by name."""
    result = simulate(scenario_from_text(text, "scenario.yaml"))
    return {row["name"]: row["time_s"] for row in result.summary["collectives"]}


NVLINK_LATENCY = 3.4e-6  # GPU to GPU through the NVSwitch (topologies/dgx-h100.yaml)
ETHERNET_LATENCY = 14e-6  # 7 us per NIC through the one switch (topologies/ethernet-100g.yaml)
NIC_LATENCY = 13e-6      # a cluster's default nic_latency, 6.5 us per NIC through the one switch


RING_BASE = NCCL_SIMPLE_BASE_S


def ring_all_reduce_time(nbytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    """A ring all-reduce at line rate: NCCL's base latency, then 2(p-1) steps, each the hop's latency plus n / p
    bytes at B, so 2(p-1)/p n / B plus 2(p-1) latencies plus the base latency."""
    return RING_BASE + 2 * (ranks - 1) * (latency + nbytes / ranks / bandwidth)


def one_all_reduce(topology: str, nbytes: str, group: str = "all") -> str:
    return (f"cluster: {{topology: {topology}}}\nnetwork: {{efficiency: ideal}}\n"
            f"workload:\n  - {{name: ar, op: all_reduce, bytes: {nbytes}, group: {group}, algorithm: ring}}\n")


# ------------------------------------------------------------------------------------------- seed test vectors

@pytest.mark.parametrize("topology, bandwidth, latency, published", [
    ("ethernet-100g", ETHERNET_100G, ETHERNET_LATENCY, 1.96), ("dgx-h100", NVLINK_H100, NVLINK_LATENCY, 0.054)])
def test_seed000_q1_gradient_all_reduce(topology, bandwidth, latency, published):
    time_s = collective_times(one_all_reduce(topology, "14e9 B"))["ar"]
    assert time_s == pytest.approx(ring_all_reduce_time(14e9, 8, bandwidth, latency), rel=1e-9)
    assert time_s == pytest.approx(published, rel=0.02)


def test_seed003_llama8b_dp_all_reduce_nvlink():
    time_s = collective_times(one_all_reduce("dgx-h100", "16.06e9 B", "0-7"))["ar"]
    assert time_s == pytest.approx(ring_all_reduce_time(16.06e9, 8, NVLINK_H100, NVLINK_LATENCY), rel=1e-9)
    assert time_s == pytest.approx(0.06, rel=0.05)


def test_seed003_llama8b_dp_all_reduce_400g():
    time_s = collective_times(one_all_reduce(str(EIGHT_HOSTS_400G), "16.06e9 B"))["ar"]
    assert time_s == pytest.approx(ring_all_reduce_time(16.06e9, 8, NDR_NIC, NIC_LATENCY), rel=1e-9)
    assert time_s == pytest.approx(0.56, rel=0.05)


# ------------------------------------------------------------------------------------------------- calibration

def run_collective_cli(capsys, *args: str) -> list[dict]:
    assert main(["collective", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_calibrated_a100_all_reduce_busbw(capsys):
    [row] = run_collective_cli(capsys, "--topology", "dgx-a100", "--op", "all_reduce", "--algorithm", "ring",
                               "--sizes", "8GiB")
    # NVLink calibrated to nccl-tests' 230 GB/s of 300 GB/s line rate: the ring's 14 latencies of 3.4 us
    # (topologies/dgx-a100.yaml) and its base latency of 8.4 us keep 8 GiB's busbw 0.09% under it
    time_s = ring_all_reduce_time(8 * 2**30, 8, 230e9, NVLINK_LATENCY)
    assert row["time_s"] == pytest.approx(time_s, rel=1e-9)
    assert row["busbw_GBps"] == pytest.approx(2 * 7 / 8 * 8 * 2**30 / time_s / 1e9, rel=1e-9)
    assert row["busbw_GBps"] == pytest.approx(230, rel=0.001)


def test_calibrated_ndr_nic_send_recv(capsys):
    # GPUs 0 and 8 sit on two DGX H100 nodes: the transfer crosses one NDR NIC each way.
    rows = run_collective_cli(capsys, "--topology", "dgx-h100-cluster", "--op", "send_recv", "--ranks", "9",
                              "--sizes", "1GiB,4GiB")
    assert all(46 <= row["algbw_GBps"] <= 48 for row in rows), rows
    # the NIC's 50 GB/s at the calibrated InfiniBand efficiency, 0.94, after the 13 us GPU-to-GPU latency
    for row in rows:
        assert row["time_s"] == pytest.approx(NIC_LATENCY + row["bytes"] / (0.94 * NDR_NIC), rel=1e-9)


def test_a_send_recv_table_names_the_two_gpus_that_ran(capsys):
    """`--op send_recv --ranks 16` sends GPU 0 -> GPU 15: the table names the two GPUs, not only `ranks=2`, the same
    title as `--ranks 8`'s NVLink transfer at a fifth of the time."""
    assert main(["collective", "--topology", "dgx-h100-cluster", "--op", "send_recv", "--ranks", "16",
                 "--sizes", "1MiB"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert title == "# send_recv algorithm=auto protocol=auto ranks=2 (GPU 0 -> GPU 15)"
    [row] = run_collective_cli(capsys, "--topology", "dgx-h100-cluster", "--op", "send_recv", "--ranks", "16",
                               "--sizes", "1MiB")
    assert (row["ranks"], row["src"], row["dst"]) == (2, 0, 15)


# ------------------------------------------------------------------------------------- seed 000 Q5: TP 16 vs 8

Q5_SIZES = parse_size_range("1MB:64MB") + [67e6]


def all_reduce_times(topology: str, ranks: int, algorithm: str) -> list[float]:
    rows = collective_sweep(topology, {}, op="all_reduce", algorithm=algorithm, ranks=ranks, sizes=Q5_SIZES)
    return [row["time_s"] for row in rows]


def test_seed000_q5_cross_node_all_reduce_slower_at_every_size():
    inside = all_reduce_times("dgx-h100", 8, "auto")
    across = all_reduce_times("dgx-h100-cluster", 16, "auto")
    assert len(inside) == len(across) == 8
    assert all(a > 1.1 * i for a, i in zip(across, inside)), list(zip(Q5_SIZES, across, inside))


def test_seed000_q5_ring_across_nodes_at_1mb_at_least_2x():
    """At 1 MB a ring is latency-bound. NCCL's ring latency (tuning.cc: base 8.4 us, 3.4 us per NVLink step, 14 us
    per network step, 2(nNodes-1) network steps) is 8.4 + 28 x 3.4 + 2 x 14 = 131.6 us over 16 GPUs on two nodes
    against 8.4 + 14 x 3.4 = 56 us over 8 GPUs in one: a ratio of 2.35, so crossing nodes costs at least 2x (under
    Simple; NCCL's LL ring, 0.6 us per NVLink step and 2.7 per network step, has less to lose)."""
    inside = collective_sweep("dgx-h100", {}, op="all_reduce", algorithm="ring", ranks=8, sizes=[1e6],
                              protocol="simple")
    across = collective_sweep("dgx-h100-cluster", {}, op="all_reduce", algorithm="ring", ranks=16, sizes=[1e6],
                              protocol="simple")
    assert across[0]["time_s"] >= 2 * inside[0]["time_s"]


# -------------------------------------------------------------------------------------------------- contention

TWO_NODES = "cluster: {topology: dgx-h100-cluster, nodes: 2}\nnetwork: {efficiency: ideal}\nworkload:\n"
SEND_0_TO_8 = "  - {name: a, op: send_recv, bytes: 1 GiB, src: 0, dst: 8, stream: a}\n"
SEND_0_TO_9 = "  - {name: b, op: send_recv, bytes: 1 GiB, src: 0, dst: 9, stream: b}\n"
ALL_REDUCE_16 = "  - {name: ar, op: all_reduce, bytes: 1 GiB, group: all, stream: comm}\n"


def test_two_transfers_on_one_nic_each_get_half():
    alone = collective_times(TWO_NODES + SEND_0_TO_8)["a"]
    both = collective_times(TWO_NODES + SEND_0_TO_8 + SEND_0_TO_9)
    # GPU 0's NIC (50 GB/s) is the bottleneck of both: sharing it adds exactly n / (B/2) - n / B = n / B.
    assert alone == pytest.approx(2**30 / NDR_NIC, rel=1e-3)
    for name in ("a", "b"):
        assert both[name] == pytest.approx(alone + 2**30 / NDR_NIC, rel=1e-4)


def test_same_stream_transfers_do_not_contend():
    both = collective_times(TWO_NODES + SEND_0_TO_8 + SEND_0_TO_9.replace("stream: b", "stream: a"))
    assert both["b"] == pytest.approx(both["a"], rel=1e-3)
    assert both["a"] == pytest.approx(2**30 / NDR_NIC, rel=1e-3)


def test_all_reduce_and_transfer_on_different_streams_slow_each_other():
    """`auto` runs the 1 GiB all-reduce as NCCL's NVLS tree across the two hosts: GPU 0, a head, sends its n/8
    to GPU 8 as two flows (one per tree) beside the transfer's one on its NIC, so max-min gives the all-reduce
    two thirds of it: 2^27 B / (2/3 x 50 GB/s) = 4.03 ms of network against 2.68 alone (4.09 vs 3.22 ms in all)."""
    all_reduce_alone = collective_times(TWO_NODES + ALL_REDUCE_16)["ar"]
    transfer_alone = collective_times(TWO_NODES + SEND_0_TO_8.replace("stream: a", "stream: p2p"))["a"]
    both = collective_times(TWO_NODES + ALL_REDUCE_16 + SEND_0_TO_8.replace("stream: a", "stream: p2p"))
    assert both["ar"] > 1.25 * all_reduce_alone
    assert both["a"] > 1.1 * transfer_alone


# ---------------------------------------------------------------------------------------------------- deadlock

def test_cross_ordered_collectives_deadlock_with_a_report():
    """GPU 0 runs X then Y, GPU 1 runs Y then X on one stream: neither can complete; the engine says which."""
    topology = load_topology("dgx-h100")

    def op(op_id: int, rank: int, key: str) -> CollectiveOp:
        return CollectiveOp(id=op_id, rank=rank, stream="comm", name=key, op="all_reduce", group=(0, 1),
                            nbytes=2**20, key=key)

    ops = [op(0, 0, "X"), op(1, 0, "Y"), op(2, 1, "Y"), op(3, 1, "X")]
    with pytest.raises(SimulationError) as caught:
        run_ops(topology, ops, NetworkSettings())
    message = str(caught.value)
    assert "deadlock" in message
    assert "'X'" in message and "waits for ranks [1]" in message
    assert "'Y'" in message and "waits for ranks [0]" in message


def _compute(op_id: int, rank: int, name: str, deps: tuple[int, ...] = (), stream: str = "compute") -> ComputeOp:
    return ComputeOp(id=op_id, rank=rank, stream=stream, name=name, duration=1e-3, deps=deps)


@pytest.mark.parametrize("ops, blocked", [
    # A cycle across ranks: a1 waits for b1, which waits for a1 (a0, finished, is not listed).
    ([_compute(0, 0, "a0"), _compute(1, 0, "a1", (0, 3)), _compute(2, 1, "b0"), _compute(3, 1, "b1", (1,))],
     "rank 0 stream 'compute' blocked at 'a1' (waits for ops [3]); "
     "rank 1 stream 'compute' blocked at 'b1' (waits for ops [1])"),
    # A cycle on an asynchronous stream: each op is a stream of its own, named by its id.
    ([_compute(0, 0, "p0", (1,), "p2p"), _compute(1, 0, "p1", (0,), "p2p")],
     "rank 0 stream 'p2p#0' blocked at 'p0' (waits for ops [1]); "
     "rank 0 stream 'p2p#1' blocked at 'p1' (waits for ops [0])"),
    # An op that depends on a later op of its own stream.
    ([_compute(0, 0, "c0"), _compute(1, 0, "c1", (0, 2)), _compute(2, 0, "c2")],
     "rank 0 stream 'compute' blocked at 'c1' (waits for ops [2])"),
])
def test_a_dependency_deadlock_names_each_blocked_stream_its_op_and_what_it_still_waits_for(ops, blocked):
    """With no collective waiting, the report names each stream that stopped, the op it stopped at and that
    op's dependencies not finished, in rank and stream order."""
    with pytest.raises(SimulationError) as caught:
        run_ops(load_topology("dgx-h100"), ops, NetworkSettings(), async_streams=frozenset({"p2p"}))
    assert str(caught.value) == f"deadlock: {blocked}"


def _joins(rank_ops: dict[int, list[str]], sizes: dict[int, float] | None = None) -> list:
    """Each rank's ops in order: "X" joins the all-reduce X over GPUs 0 and 1 (of ``sizes[rank]`` bytes, 1 MiB
    unless given), "wait" is a 1 ms kernel first."""
    ops: list = []
    for rank, names in rank_ops.items():
        for name in names:
            ops.append(ComputeOp(id=len(ops), rank=rank, stream="comm", name=name, duration=1e-3) if name == "wait"
                       else CollectiveOp(id=len(ops), rank=rank, stream="comm", name=name, op="all_reduce",
                                         group=(0, 1), nbytes=(sizes or {}).get(rank, 2**20), key=name))
    return ops


@pytest.mark.parametrize("rank_ops, sizes, words", [
    ({0: ["X", "X"], 1: ["X", "X"]}, None, "rank 0 joins all_reduce 'X' (key X) after it finished"),
    ({0: ["X", "X"]}, None, "rank 0 joins all_reduce 'X' (key X) after it finished"),
    ({0: ["wait", "X"], 1: ["wait", "X"], 2: ["X"]}, None,
     "rank 2 joins all_reduce 'X' but is not in its group (0, 1)"),
    ({0: ["wait", "X"], 2: ["X"]}, None, "rank 2 joins all_reduce 'X' but is not in its group (0, 1)"),
    ({0: ["X"], 1: ["X"], 2: ["wait", "X"]}, None, "rank 2 joins all_reduce 'X' but is not in its group (0, 1)"),
    ({0: ["X"], 2: ["wait", "X"]}, None, "rank 2 joins all_reduce 'X' but is not in its group (0, 1)"),
    ({0: ["X"], 1: ["X"]}, {1: 2**21}, "ranks disagree on 'X' (key X): all_reduce of 1048576 B over (0, 1) "
                                       "(algorithm auto, protocol auto, root 0) vs all_reduce of 2097152 B "
                                       "over (0, 1) (algorithm auto, protocol auto, root 0)"),
], ids=["again-rendezvous", "again-private", "outsider-rendezvous", "outsider-private",
        "outsider-after-rendezvous", "outsider-after-private", "disagree"])
def test_a_join_after_the_end_or_from_outside_the_group_is_refused(rank_ops, sizes, words):
    """The rendezvous and a private collective (one simulated member, timed alone and replayed) refuse a rank
    that joins a finished collective again, or that is not in its group (also once the collective has
    finished), in the same words; ranks that disagree on a collective are refused too. Each is one line from
    `run_ops`."""
    with pytest.raises(SimulationError) as caught:
        run_ops(load_topology("dgx-h100"), _joins(rank_ops, sizes), NetworkSettings())
    assert str(caught.value) == words


@pytest.mark.parametrize("field, value, words", [
    ("algorithm", "tree", "(algorithm ring, protocol auto, root 0) vs all_reduce of 1048576 B over (0, 1) "
                          "(algorithm tree, protocol auto, root 0)"),
    ("root", 1, "(algorithm ring, protocol auto, root 0) vs all_reduce of 1048576 B over (0, 1) "
                "(algorithm ring, protocol auto, root 1)"),
], ids=["algorithm", "root"])
def test_ranks_disagreeing_on_the_algorithm_or_the_root_are_refused(field, value, words):
    """Members of one collective must agree on its algorithm and root as on its op and size: the rendezvous
    refuses the second arrival instead of running the first arrival's choice for both."""
    first, second = (op for op in _joins({0: ["X"], 1: ["X"]}) if isinstance(op, CollectiveOp))
    first.algorithm = second.algorithm = "ring"
    setattr(second, field, value)
    with pytest.raises(SimulationError) as caught:
        run_ops(load_topology("dgx-h100"), [first, second], NetworkSettings())
    assert str(caught.value) == f"ranks disagree on 'X' (key X): all_reduce of 1048576 B over (0, 1) {words}"
