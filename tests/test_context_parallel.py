"""Context parallelism: ring attention's K/V traffic, the causal work split with and without load balancing,
and the checks on cp. Closed forms: a ring all-gather moves (cp-1)/cp of the gathered bytes per rank; an
unbalanced causal split gives CP rank i the strip (2i + 1) / cp of the mean attention work."""

from __future__ import annotations

import pytest
from shared import NCCL_SIMPLE_BASE_S, SCENARIOS

from simulator import load_scenario, simulate
from simulator.catalog.models import get_model
from simulator.topology.graph import PXN_CHANNEL
from simulator.topology.loader import load_topology

CP = 4
SEQ = 8192
SCENARIO = f"""
cluster: {{topology: dgx-h100}}
model: {{preset: llama3-8b, layers: 2}}
training: {{seq_len: {SEQ}, microbatches: 1, precision: bf16}}
parallelism: {{tp: 2, cp: {CP}, pp: 1, dp: 1}}
collectives: {{protocol: simple}}
run: {{fold: false}}
"""
"""Under Simple: a flow row carries the bytes on the wire, LL's and LL128's flags included (docs/collectives.md,
"Protocols"), and these checks count the K/V each rank sends."""


def _kv_bytes() -> float:
    """K and V of the whole sequence for one TP rank's KV heads, bf16."""
    model = get_model("llama3-8b")
    return 2 * SEQ * (model.kv_heads // 2) * model.head_dim * 2


def _sent(frame, key_prefix: str, rank: int) -> float:
    flows = frame[(frame["kind"] == "flow") & (frame["src"] == rank) & frame["name"].str.startswith(key_prefix)]
    return float(flows["bytes"].sum())


@pytest.mark.parametrize("model", ["flow", "analytic"])
def test_a_ring_step_posts_one_flow_per_neighbour_pair_and_none_between_other_members(run_yaml, model):
    """Each step of the K/V ring is a grouped send/receive in which CP rank i sends only to CP rank i + 1, so
    it posts cp flows, not one to every other member with nothing in most (they were cp (cp - 1), 12 here,
    and filled the TP1 CP16 timeline with 15 x 224 empty flows a step), in either network model."""
    frame = run_yaml(SCENARIO, f"network.model={model}").timeline
    cp_group = (0, 2, 4, 6)  # the CP group of TP rank 0
    for phase in ("fwd", "bwd"):
        for step in range(1, CP):
            key = f"cp.ring.{phase}.mb0.vs0.L0.attn.step{step}.0"
            flows = frame[(frame["kind"] == "flow") & (frame["name"] == key)]
            assert sorted(zip(flows["src"], flows["dst"])) == sorted(
                (cp_group[i], cp_group[(i + 1) % CP]) for i in range(CP))


def test_ring_moves_cp_minus_one_over_cp_of_the_sequence_kv_per_rank_per_layer(run_yaml):
    frame = run_yaml(SCENARIO).timeline
    expected = (CP - 1) / CP * _kv_bytes()
    for rank in (0, 2, 4, 6):  # the CP group of TP rank 0
        assert _sent(frame, "cp.ring.fwd.mb0.vs0.L0.attn.", rank) == pytest.approx(expected, rel=1e-12)
        assert _sent(frame, "cp.ring.bwd.mb0.vs0.L0.attn.", rank) == pytest.approx(2 * expected, rel=1e-12)


NIC_BYTES_PER_S = 47e9
"""One NDR 400 Gb/s NIC at the efficiency trainsim measures it at (network/calibration.py, 47 of 50 GB/s)."""
ACROSS = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 1}
training: {seq_len: 16384, microbatches: 1, precision: bf16, recompute: none}
parallelism: {tp: 1, cp: 16, pp: 1, dp: 1}
collectives: {protocol: simple}
run: {fold: false}
"""


@pytest.mark.parametrize("tp, cp", [(1, 16), (8, 2)])
def test_ring_steps_are_point_to_point_transfers_across_hosts_bounded_by_one_nic(run_yaml, tp, cp):
    """Ring attention's K/V ring is cp - 1 steps in which each CP rank sends its block to the next CP rank
    (Megatron-Core's cp_comm_type p2p). TP1 CP16 on 2 DGX H100: only the pairs 7->8 and 15->0 cross hosts, each on
    one NIC (rail 0's, through the PXN relays GPU 0 and 8), so a step of the 4 MiB block (K/V of 16,384 tokens / 16)
    lasts its time over one NIC, 89.2 us, plus latency (114.0 us, 8.4 us of it the grouped kernel's base
    latency), and the forward's ring 15 of them, 1.71 ms (run as a ring all-gather, whose 8 channels cross the
    hosts on all 8 NICs, it would take 0.245 ms). TP8 CP2 (each CP pair on its own rail, the same bytes a step): one
    step over one NIC either way, up to the ring all-gather's own overheads (0.1106 ms as the pair's transfer,
    0.111 ms as a ring all-gather). A step lasts its line time, the grouped kernel's base latency and its slowest
    pair's path latency (16.4 us from GPU 7 to GPU 8 through the PXN relay GPU 0, 13.0 us from GPU 0 to GPU 8),
    exactly."""
    frame = run_yaml(ACROSS, f"parallelism.tp={tp}", f"parallelism.cp={cp}").timeline
    model = get_model("llama3-8b")
    block = 2 * 16384 * (model.kv_heads // tp) * model.head_dim * 2 / cp
    steps = frame[(frame["kind"] == "collective") & (frame["rank"] == 0) & (frame["category"] == "cp")
                  & frame["key"].str.startswith("cp.ring.fwd.mb0.vs0.L0.attn.")]
    assert len(steps) == cp - 1
    flows = frame[(frame["kind"] == "flow") & (frame["name"] == "cp.ring.fwd.mb0.vs0.L0.attn.step1.0")]
    topology = load_topology("dgx-h100-cluster", {"nodes": 2})
    members = set(flows["src"])
    path_latency = max(topology.route(src, dst, PXN_CHANNEL if topology.pxn_relay(src, dst) in members else 0)[1]
                       for src, dst in zip(flows["src"], flows["dst"]))
    for seconds in (steps["end_s"] - steps["start_s"]).tolist():
        assert seconds == pytest.approx(block / NIC_BYTES_PER_S + NCCL_SIMPLE_BASE_S + path_latency, rel=1e-9)
    cp_stride = tp
    assert sorted(zip(flows["src"], flows["dst"], flows["bytes"])) == sorted(
        (cp_rank * cp_stride, (cp_rank + 1) % cp * cp_stride, block) for cp_rank in range(cp))


P2P_NET_PEER_SMS = 2
"""The channels, one SM each, NCCL's point-to-point kernel gives a network peer (NCCL_NCHANNELS_PER_NET_PEER)."""
H100_SMS = 132


def test_attention_beside_a_cross_host_ring_loses_only_a_send_receive_pairs_sms(run_yaml):
    """A ring step is one send and one receive per GPU, which NCCL runs on a network peer's p2p channels (2)
    when the CP group spans hosts, not on every channel of a ring collective over the group (16 for TP1 CP16
    on 2 hosts: the attention beside the ring ran 13.8% slow): the attention core overlapped by the ring is
    slowed by at most 2 of the H100's 132 SMs."""
    def attention_s(contention: str) -> float:
        frame = run_yaml(ACROSS, f"collectives.sm_contention={contention}").timeline
        core = frame[(frame["kind"] == "compute") & (frame["rank"] == 0) & (frame["name"] == "F0 L0.attn attention")]
        return float((core["end_s"] - core["start_s"]).sum())

    free = attention_s("none")
    assert free < attention_s("nccl") <= free * H100_SMS / (H100_SMS - P2P_NET_PEER_SMS) * (1 + 1e-9)


def _attention_flops(frame, rank: int) -> float:
    ops = frame[(frame["kind"] == "compute") & (frame["rank"] == rank) & frame["name"].str.startswith("F0 L0.attn ")]
    return float(ops["flops"].sum())


def test_causal_split_without_balancing_gives_rank_i_the_strip_2i_plus_1_over_cp(run_yaml):
    balanced = run_yaml(SCENARIO).timeline
    unbalanced = run_yaml(SCENARIO, "parallelism.cp_load_balance=false").timeline
    ranks = [cp_rank * 2 for cp_rank in range(CP)]
    mean = _attention_flops(balanced, 0)
    model = get_model("llama3-8b")
    heads = model.heads // 2
    assert mean == pytest.approx(4.0 * (SEQ / CP) * SEQ * heads * model.head_dim * 0.5, rel=1e-12)
    for cp_rank, rank in enumerate(ranks):
        assert _attention_flops(balanced, rank) == pytest.approx(mean, rel=1e-12)
        assert _attention_flops(unbalanced, rank) == pytest.approx(mean * (2 * cp_rank + 1) / CP, rel=1e-12)


def test_all_gather_attention_takes_the_same_causal_shares(run_yaml):
    balanced = run_yaml(SCENARIO, "parallelism.cp_algorithm=all_gather").timeline
    unbalanced = run_yaml(SCENARIO, "parallelism.cp_algorithm=all_gather",
                          "parallelism.cp_load_balance=false").timeline

    def block_flops(frame, rank):
        ops = frame[(frame["kind"] == "compute") & (frame["rank"] == rank) & (frame["name"] == "F0 L0.attn")]
        return float(ops["flops"].sum())

    model = get_model("llama3-8b")
    core = 4.0 * (SEQ / CP) * SEQ * (model.heads // 2) * model.head_dim * 0.5
    for cp_rank in range(CP):
        extra = block_flops(unbalanced, 2 * cp_rank) - block_flops(balanced, 2 * cp_rank)
        assert extra == pytest.approx(core * ((2 * cp_rank + 1) / CP - 1), rel=1e-9)


def test_all_gather_gathers_the_kv_again_before_the_backward(run_yaml):
    """Transformer Engine's AttnFuncWithCPAndKVAllGather saves only the rank's own K and V, so its backward all-gathers
    them again before reduce-scattering their gradients: (cp-1)/cp of the sequence's K/V per rank three times per
    layer, as the ring moves (twice the forward's bytes in the backward)."""
    frame = run_yaml(SCENARIO, "parallelism.cp_algorithm=all_gather").timeline
    expected = (CP - 1) / CP * _kv_bytes()
    ops = frame[(frame["kind"] == "collective") & (frame["rank"] == 0) & (frame["category"] == "cp")]
    backward = frame[(frame["rank"] == 0) & (frame["name"] == "B0 L0.attn")]
    for rank in (0, 2, 4, 6):
        assert _sent(frame, "cp.fwd.mb0.vs0.L0.attn.", rank) == pytest.approx(expected, rel=1e-12)
        assert _sent(frame, "cp.bwd.gather.mb0.vs0.L0.attn.", rank) == pytest.approx(expected, rel=1e-12)
        assert _sent(frame, "cp.bwd.mb0.vs0.L0.attn.", rank) == pytest.approx(expected, rel=1e-12)
    gather = ops[ops["key"].str.startswith("cp.bwd.gather.mb0.vs0.L0.attn.")]
    assert gather["name"].tolist() == ["cp all_gather L0.attn"]
    assert float(gather["end_s"].iloc[0]) <= float(backward["start_s"].iloc[0])


def test_ring_hides_kv_traffic_that_all_gather_exposes(run_yaml):
    # SM contention off: at 8k keys on NVLink the SMs the ring's kernels hold beside the causal attention
    # backward cost about what the ring hides. The forward and backward end earlier by nearly what the ring hides
    # (12.14 against 12.36 ms, 90% of it: the DP x CP gradient all-reduce, NVLS over 4 GPUs, loads the switch
    # links the ring's hidden K/V transfers share at NVLS's in-switch efficiency); the step does not show it:
    # that all-reduce, 12.5 ms of the 29.7 ms step, then overlaps less of the shorter backward, and the two steps
    # tie within 5 us.
    ring = run_yaml(SCENARIO, "collectives.sm_contention=none")
    gather = run_yaml(SCENARIO, "parallelism.cp_algorithm=all_gather", "collectives.sm_contention=none")
    assert ring.summary["exposed_comm_s"]["cp"] < 0.5 * gather.summary["exposed_comm_s"]["cp"]

    def compute_end(result) -> float:
        frame = result.timeline
        return float(frame.loc[frame["category"].isin(["forward", "backward"]), "end_s"].max())

    hidden = gather.summary["exposed_comm_s"]["cp"] - ring.summary["exposed_comm_s"]["cp"]
    assert hidden > 0 and compute_end(gather) - compute_end(ring) > 0.85 * hidden


def test_unbalanced_causal_split_turns_folding_off(run_yaml):
    summary = run_yaml(SCENARIO, "run.fold=true", "parallelism.cp_load_balance=false").summary
    assert summary["folded"] is False
    assert "load balancing" in summary["fold_off_reason"]
    assert run_yaml(SCENARIO, "run.fold=true").summary["folded"] is True


@pytest.mark.parametrize(("overrides", "problem"), [
    (["training.seq_len=8190"], "2 x cp = 8 chunks"),
    (["training.seq_len=8190", "parallelism.cp_load_balance=false"], "cp 4 shares"),
])
def test_cp_that_does_not_split_the_sequence_is_a_located_error(validation_error, overrides, problem):
    error = validation_error(SCENARIO, *overrides)
    assert error.field == "parallelism.cp"
    assert problem in error.problem
    assert error.line == 5


@pytest.mark.parametrize(("overrides", "problem"), [
    (["training.seq_len=8196", "parallelism.cp_load_balance=false", "parallelism.sequence_parallel=true"],
     "seq_len 8196 does not split into cp x tp = 4 x 2 = 8 token shares, which sequence parallelism gives"),
    (["training.seq_len=8196", "parallelism.cp_load_balance=false", "model.preset=mixtral-8x7b",
      "parallelism.ep=2"], "which the experts' routing gives each TP rank"),
])
def test_a_cp_share_that_tp_does_not_split_is_a_located_error(validation_error, assert_located, overrides, problem):
    """8196 tokens split into 4 CP shares of 2049, which sequence parallelism (or MoE routing) over TP 2 cut into
    1024.5 tokens a rank: refused at the field, as Megatron-LM asserts the split, not simulated as fractional
    tokens."""
    assert_located(validation_error(SCENARIO, *overrides), tuple(overrides), "training.seq_len", problem)


def test_without_sequence_parallelism_or_experts_tp_holds_the_whole_cp_share():
    from simulator.config.loader import scenario_from_text
    from simulator.preflight import validate
    from simulator.topology.loader import scenario_topology

    loaded = scenario_from_text(SCENARIO, "inline.yaml", ["training.seq_len=8196", "parallelism.cp_load_balance=false"])
    validate(loaded, scenario_topology(loaded))


TESTER_CASE = ["cluster.topology=dgx-h100-cluster", "cluster.nodes=1", "model.layers=2", "training.seq_len=16384",
               "training.global_batch=2", "parallelism.cp=4", "parallelism.dp=2", "parallelism.zero=1",
               "collectives.sm_contention=none"]
"""Llama 3 8B, 2 layers, 16k tokens over CP 4 x DP 2 on one DGX H100 (a user tester's case), SM contention off so
that every attention op runs for the seconds its rank's share gives it."""


def test_the_cp_imbalance_loss_is_what_the_slowest_cp_ranks_attention_adds_beyond_the_mean():
    """Without load balancing, CP rank i's attention is (2i + 1) / cp of the mean: the loss is the slowest CP
    rank's attention seconds less the mean over the CP group, summed over its layers and passes as the timeline
    runs them, its own loss and console row beside the pipeline bubble it overlaps at pp = 1 (9.43%); a balanced
    split has none."""
    path = SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"
    result = simulate(load_scenario(path, overrides=[*TESTER_CASE, "parallelism.cp_load_balance=false"]))
    frame, summary = result.timeline, result.summary
    attention = frame[(frame["kind"] == "compute") & frame["name"].str.contains(" attention")]
    per_rank = (attention["end_s"] - attention["start_s"]).groupby(attention["rank"]).sum()
    group = [0, 1, 2, 3]  # the CP ranks of DP replica 0
    seconds = [float(per_rank[rank]) for rank in group]
    assert seconds == pytest.approx([seconds[0] * (2 * i + 1) for i in range(CP)], rel=1e-9)
    added = max(seconds) - sum(seconds) / CP
    assert summary["cp_imbalance"]["slowest_rank_adds_s"] == pytest.approx(added, rel=1e-9)
    assert summary["cp_imbalance"]["attention_s_per_cp_rank"] == pytest.approx(seconds, rel=1e-9)
    assert summary["bottleneck"]["loss_shares"]["cp_imbalance"] == pytest.approx(added / summary["step_time_s"],
                                                                                   rel=1e-9)
    balanced = simulate(load_scenario(path, overrides=TESTER_CASE)).summary
    assert "cp_imbalance" not in balanced and "cp_imbalance" not in balanced["bottleneck"]["loss_shares"]


def test_at_pp_2_the_cp_imbalance_lengthens_the_step_by_m_plus_p_minus_1_over_m_times_the_entry():
    """CP 4 x PP 2, 4 layers, 4 micro-batches, SM contention off: the entry is the slowest CP rank's extra attention
    over its passes (27.63 ms); the step grows by (m + p - 1)/m = 5/4 times it (34.54 ms), the pipeline's fill
    and drain carrying the slower passes too, as docs/training-step.md says."""
    case = [*TESTER_CASE, "model.layers=4", "training.global_batch=4", "parallelism.pp=2", "parallelism.dp=1"]
    path = SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"
    unbalanced = simulate(load_scenario(path, overrides=[*case, "parallelism.cp_load_balance=false"])).summary
    balanced = simulate(load_scenario(path, overrides=case)).summary
    added = unbalanced["cp_imbalance"]["slowest_rank_adds_s"]
    assert added == pytest.approx(27.63e-3, abs=5e-6)
    assert unbalanced["step_time_s"] - balanced["step_time_s"] == pytest.approx(added * (4 + 2 - 1) / 4, rel=1e-9)
