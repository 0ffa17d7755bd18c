"""Folding is exact across the ways data-parallel replicas share state: for DDP, ZeRO 1-3 (DeepSpeed), PyTorch FSDP
(full shard, shard-grad-op reducing every micro-batch, under pipelining, with context parallelism, hybrid sharding,
also over one-rank shard groups), expert parallelism, DP-innermost placement and a V-shaped schedule, the step of
the folded run (one rank per pipeline stage) equals the unfolded run's on a 2:1 oversubscribed fabric, where wrong
mirror images would meet on the spines. A layout folding cannot reproduce must unfold (``folded`` false, with the
reason stated: found before the run, or by the folded run's mirrors falling out of step with their groups), never
fold wrongly: each case says whether it folds, so a change that unfolded every case would fail here."""

from __future__ import annotations

import pytest
from shared import FABRIC_HAND_OFFS, NO_REFOLDS, assert_same_figures, refused_unfolded

from simulator.config.loader import scenario_from_text
from simulator.engine.lockstep import OutOfStep
from simulator.parallel.folding import RankClasses, rank_weights
from simulator.parallel.layout import Layout
from simulator.report.gantt import gantt_figure
from simulator.report.outputs import load_run_outputs
from simulator.simulation import simulate

FABRIC = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2, oversubscription: 2}
collectives: {channels: 2}
training: {seq_len: 1024, microbatches: 4}
run: {timeline: summary}
"""
DENSE = FABRIC + "model: {layers: 8, hidden: 2048, heads: 16, vocab: 32000}\nparallelism: {tp: 4, dp: 8}\n"
MOE = FABRIC + ("model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000, moe: {experts: 8, top_k: 2}}\n"
                "parallelism: {tp: 2, dp: 16}\n")
PIPELINED = ["parallelism.pp=2", "parallelism.dp=4"]


UNALIGNED = """
cluster: {topology: dgx-h100-cluster, nodes: 3}
model: {layers: 12, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 4096, microbatches: 6}
run: {timeline: summary}
parallelism: {tp: 4, pp: 3, dp: 2}
"""
"""Pipeline stages not aligned to hosts: replica 0 hands stage 0 on to stage 1 over NVLink inside host 0 (GPUs
0-3 to 4-7), replica 1 over the NICs from host 1 to host 2 (12-15 to 16-19); folded, the step was 0.70% slow.
With tp 2, dp 4, FSDP and an interleaved schedule of two virtual stages it was 1.48% slow with one rank per
stage; there the DP collectives' transfers inside the hosts are unlike from host to host, so the stage's ranks
fall into four classes of two (engine/rank_classes.py) whose representatives hand on as their own replicas do,
and the step folds exactly (12 of 24 ranks simulated)."""
PCIE_HOSTS = """
cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: pcie_node, gpus: 6, gpus_per_switch: 3}, nics_per_node: 2,
          leaf_ports: 2, spines: 2}
model: {layers: 12, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 2048, microbatches: 4}
run: {timeline: summary}
parallelism: {tp: 1, cp: 2, pp: 4, dp: 3}
"""
"""Hosts of six GPUs behind PCIe switches of three: the CP pair of GPUs 0-1 meets under one switch, that of 2-3
across two, through the host bridge, so the CP rings inside a host are not alike. The symmetry check passed over
groups inside one domain, and the folded step came out 60 ns slow (rel. 4.2e-7), reported exact; it compares
them where a domain is not a star (`symmetry.star_domains`)."""
UNLIKE_PCIE_PAIRS = "'cp ring step 1 L0.attn' takes"
STRADDLING_CP_PAIRS = """
cluster: {topology: dgx-h100-cluster, nodes: 3, nics_per_node: 1, leaf_ports: 3, spines: 3, oversubscription: 2,
          node: {kind: nvswitch_node, gpus: 4, nvlink_bandwidth: 450 GB/s, nvlink_latency: 3.4 us, gpu_model: h100-sxm}}
model: {layers: 24, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 2048, microbatches: 4}
run: {timeline: summary}
parallelism: {tp: 1, cp: 2, pp: 2, dp: 3, order: [dp, tp, cp, pp]}
"""
"""CP pairs {i, i + 3} on hosts of four GPUs: rank 0's pair [0, 3] stays inside host 0, rank 1's [1, 4] crosses
to host 1. The ranks fell into classes by NVLink loads ({0, 1}, {2, 3}, {4, 5} of each stage), every CP pair held
a representative, so no mirror was compared, and the folded step came out 0.39% slow (exposed pp 3.18 against
2.49 ms), reported exact. Each class-mate's copy is compared as a mirror (`fold_policy.unlike_class_mates`) and
the step unfolds: the ring step takes 34.47 us over [0, 3] and 199.9 us over [1, 4], each with the grouped kernel's
8.4 us base latency."""
STRADDLING_PAIRS = ("'cp ring step 1 L0.attn' takes 34.47 us over GPUs [0, 3] but 199.9 us over the equivalent "
                    "[1, 4]")
TREE_CLASSES = """
cluster: {topology: dgx-h100-cluster, nodes: 6, nics_per_node: 4, leaf_ports: 3, spines: 1, oversubscription: 2,
          node: {kind: nvswitch_node, gpus: 4, nvlink_bandwidth: 450 GB/s, nvlink_latency: 3.4 us, gpu_model: h100-sxm}}
model: {layers: 24, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 2048, microbatches: 4}
run: {timeline: summary}
parallelism: {tp: 2, cp: 2, pp: 1, dp: 6, order: [tp, dp, cp, pp]}
collectives: {algorithm: tree}
"""
"""Tree collectives, whose inner ranks and leaves send unlike amounts: the ranks fell into three classes by
NVLink loads, every class-mate's copy took its representative's time alone and met the trees' traffic as it
did, and the classed step came out 9.3e-6 slow (exposed tp 10.446 against 10.466 ms, cp 56.164 against
56.119), reported exact; with one rank per stage, the CP pair [0, 12] meets that traffic otherwise than its
mirror [4, 16]. Classed folds are now held to that check too (`fold_policy.unlike_class_mates`), and the step
unfolds."""
UNLIKE_TREE_TRAFFIC = ("'cp ring step 1 L23.attn' over GPUs [0, 12] meets the traffic of collectives whose members "
                       "send unlike amounts (a tree's inner ranks and leaves) otherwise than over the equivalent "
                       "[4, 16]")
MIXED_HAND_OFFS = "stays inside one NVLink domain but its mirror"
OUT_OF_STEP = "'all_gather expert params' over GPUs [0, 1, 8, 9, 16, 17, 24, 25] ended on its mirrors"
"""MoE with EP 4 and ZeRO-1: the expert parameters' all-gather over the representative's expert-DP group ended at
55.64 ms, over its mirror on lanes 4-5 at 51.68 ms (their NICs meet the dense DP ring's exits from the hosts
unlike). The folded step was the unfolded one, but its mirrors stood for lanes that end sooner: the folded run
reported 40.57 ms of exposed DP communication per GPU, the unfolded 38.59. The run checks that its mirrors kept
pace (engine/lockstep.py) and runs the step unfolded."""


EP_MEETS_THE_TREE = ("all_to_all 'ep dispatch L0.mlp' over GPUs [0, 2, 4, 6, 8, 10, 12, 14] meets the traffic of "
                     "collectives whose members send unlike amounts (a tree's inner ranks and leaves) otherwise than "
                     "over the equivalent [16, 18, 20, 22, 24, 26, 28, 30]")
"""MoE with EP 8 over the hosts: each EP group holds the GPUs of two rails' worth (even or odd) of the two hosts of
one leaf group, and the DP gradient buckets run as trees over the four hosts rail by rail, hosts 1 and 2 inner
(65.5 MB of bucket 0 through each of their NICs each way), hosts 0 and 3 leaves (32.8 MB). The group over hosts
0-1 and its mirror over hosts 2-3 each meet one inner host and one leaf, alike in bytes (host 3 matched to host
0), but the tree's flow out of host 0 on rail 2 climbs a spine uplink three of its flows cross, where host 3's
climbs one it crosses alone, so they drain at other times: in the unfolded run, PXN on, the last micro-batch's backward
dispatch of layer 1 ends at 16.149137 ms over hosts 0-1 and 16.157530 ms over hosts 2-3, 8.393 us apart (each
copy pays the grouped kernel's 8.4 us base latency once; the gap is the tree's, not the launch's). The fold's
check before the run compared only the first mirror of each class of translates by a whole leaf group, as if
the tree moved with them, and only by bytes: it let the fold run and the run gave it up (the mirrors out of step
by those 8.393 us). It now compares every mirror where the unequal traffic does not move with the translates
(`symmetry._moves_with_translates`), by the company the tree's flows keep on each link as well as their bytes
(`symmetry._link_loads`), and refuses before the run. Without PXN the dispatch's cross-rail flows climb the
spines, where the copies meet the tree's bytes unlike under every matching: refused too, though in that
unfolded run they happen to end together."""


@pytest.mark.parametrize("text, overrides, off_reason", [
    (DENSE, [], ""),
    (DENSE, ["parallelism.zero=1"], ""),
    (DENSE, ["parallelism.zero=3"], ""),
    (DENSE, ["parallelism.fsdp=full_shard"], ""),
    (DENSE, ["parallelism.fsdp=shard_grad_op", "parallelism.ddp.reduce_every_microbatch=true"], ""),
    (DENSE, ["parallelism.fsdp=full_shard", *PIPELINED], ""),
    (DENSE, ["parallelism.fsdp=full_shard", *PIPELINED, "parallelism.pipeline.schedule=interleaved",
             "parallelism.pipeline.virtual_stages=2"], ""),
    (DENSE, ["parallelism.fsdp=full_shard", "parallelism.cp=2", "parallelism.dp=4",
             "parallelism.sequence_parallel=true"], ""),
    (DENSE, ["parallelism.fsdp=hybrid_shard"], ""),
    (DENSE, ["parallelism.fsdp=hybrid_shard", "parallelism.tp=1", "parallelism.dp=32"], ""),
    (DENSE, ["parallelism.fsdp=hybrid_shard", "parallelism.tp=2", "parallelism.pp=2", "parallelism.dp=8"], ""),
    (DENSE, ["parallelism.fsdp=hybrid_shard", "parallelism.tp=8", "parallelism.dp=4"], ""),
    (DENSE, ["parallelism.fsdp=hybrid_shard", "parallelism.tp=8", "parallelism.pp=2", "parallelism.dp=2",
             "parallelism.pipeline.schedule=interleaved", "parallelism.pipeline.virtual_stages=2"], ""),
    (DENSE, ["parallelism.order=[dp,tp,cp,pp]", "parallelism.zero=1"], ""),
    (DENSE, [*PIPELINED, "parallelism.pipeline.schedule=zbv", "parallelism.pipeline.virtual_stages=2"], ""),
    (MOE, ["parallelism.ep=4"], ""),
    (MOE, ["parallelism.ep=4", "parallelism.zero=1"], OUT_OF_STEP),
    (MOE, ["parallelism.ep=8", "network.pxn=false"], EP_MEETS_THE_TREE),
    (MOE, ["parallelism.ep=8"], EP_MEETS_THE_TREE),
    (MOE, ["parallelism.ep=4", "parallelism.fsdp=hybrid_shard"], ""),
    (MOE, ["parallelism.ep=2", "parallelism.fsdp=hybrid_shard"], ""),
    (UNALIGNED, [], MIXED_HAND_OFFS),
    (PCIE_HOSTS, [], UNLIKE_PCIE_PAIRS),
    (STRADDLING_CP_PAIRS, [], STRADDLING_PAIRS),
    (TREE_CLASSES, [], UNLIKE_TREE_TRAFFIC),
    (UNALIGNED, ["parallelism.tp=2", "parallelism.dp=4", "parallelism.fsdp=full_shard",
                 "parallelism.pipeline.schedule=interleaved", "parallelism.pipeline.virtual_stages=2"], ""),
], ids=["ddp", "zero1", "zero3", "fsdp", "fsdp-shard-grad-op", "fsdp-pp2", "fsdp-interleaved", "fsdp-cp2",
        "hsdp-tp4", "hsdp-tp1", "hsdp-pp2", "hsdp-one-rank-shards", "hsdp-one-rank-shards-interleaved",
        "dp-innermost", "zbv", "ep4", "ep4-zero1", "ep8", "ep8-pxn", "ep4-hsdp", "ep2-hsdp", "pp3-unaligned",
        "pcie-hosts-cp2", "straddling-cp-pairs", "tree-classes", "pp3-unaligned-fsdp-interleaved"])
def test_folded_step_equals_the_unfolded_step(text, overrides, off_reason):
    """Each layout folds, or unfolds for the stated reason (``off_reason``, '' for folded), and the steps agree."""
    folded = simulate(scenario_from_text(text, "inline.yaml", overrides)).summary
    unfolded = simulate(scenario_from_text(text, "inline.yaml", [*overrides, "run.fold=false"])).summary
    assert folded["folded"] == (not off_reason)
    assert off_reason in folded.get("fold_off_reason", "")
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("text, reason", [(STRADDLING_CP_PAIRS, STRADDLING_PAIRS), (TREE_CLASSES, UNLIKE_TREE_TRAFFIC)],
                         ids=["straddling-cp-pairs", "tree-classes"])
def test_class_mates_refuse_the_classed_fold_first(text, reason):
    """The classed fold is refused by its class-mates' check before it is built (the first fold given up), not
    only by the stage fold's verdict after it: the copy named ([1, 4], [4, 16]) holds another class's
    representative (rank 4), which the classed program's own verdict never compares with [0, 3] or [0, 12]."""
    given_up = simulate(scenario_from_text(text, "inline.yaml", [])).summary["fold_given_up"]
    assert [entry["fold"] for entry in given_up] == ["classes", "stage"]
    assert reason in given_up[0]["reason"]


CLASSED_HAND_OFFS = """
cluster: {topology: dgx-h100-cluster, nodes: 8, leaf_ports: 5, spines: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000, moe: {experts: 8, top_k: 2}}
training: {seq_len: 1024, microbatches: 4}
run: {timeline: summary}
parallelism: {tp: 1, pp: 2, dp: 32, ep: 8, order: [tp, dp, cp, pp]}
"""


def test_class_mates_hand_offs_must_cross_the_same_hops():
    """Stage 0 on hosts 0-3, stage 1 on hosts 4-7, leaf groups {0..4} and {5, 6, 7}: the ranks fall into classes
    by NVLink loads with hosts 0 and 3 in one, but host 0 hands on inside its leaf group (GPUs 0 -> 32) and host
    3 across the spines (24 -> 56), so the classed fold is refused before its run; the stage fold's hand-offs
    then fall out of step and the step folds again by route (8 ranks), equal to the unfolded step."""
    folded = simulate(scenario_from_text(CLASSED_HAND_OFFS, "inline.yaml", [])).summary
    unfolded = simulate(scenario_from_text(CLASSED_HAND_OFFS, "inline.yaml", ["run.fold=false"])).summary
    first = folded["fold_given_up"][0]
    assert first["fold"] == "classes"
    assert "'send fwd mb0' over GPUs [0, 32] crosses other hops than over [24, 56]" in first["reason"]
    assert folded["folded"] and folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-9)


def test_unaligned_stages_unfold_on_the_analytic_model():
    """The analytic model runs each transfer alone, so its fold check cannot compare what mirrors meet; it must
    still compare what they take: with stages not aligned to hosts, replica 0's hand-off from stage 0 to 1 stays
    on NVLink (GPUs 0 -> 4, 0.009 ms) and replica 1's crosses the NICs (12 -> 16, 0.059 ms). Folded unchecked,
    the step came out 0.38% slow (its kept mirrors held the representatives back; dropped ones went unseen)."""
    overrides = ["network.model=analytic"]
    folded = simulate(scenario_from_text(UNALIGNED, "inline.yaml", overrides)).summary
    unfolded = simulate(scenario_from_text(UNALIGNED, "inline.yaml", [*overrides, "run.fold=false"])).summary
    assert not folded["folded"]
    assert "stays inside one NVLink domain but its mirror over [12, 16] does not" in folded["fold_off_reason"]
    assert folded["step_time_s"] == unfolded["step_time_s"]


@pytest.mark.parametrize("model", ["analytic", "flow"])
def test_hand_offs_across_the_fabric_fold_on_both_models(model):
    """Replica 0 hands stage 1 on to stage 2 inside a leaf group, replica 1 across the spines: one hop's latency more.
    On both models the step folds before its run by the route classes of hops (`fold_policy.hop_refold`), one rank
    per stage and replica (on the flow model the stage fold's copies would end apart in its run, by that latency):
    the unfolded step on both (docs/architecture.md, rank folding). Unfolding
    on the analytic model instead would refuse the published SC21 1T, 310.1B and 529.6B runs as too large unfolded
    (~57.5 GiB for 1T), and the stage fold alone is within 2e-4, not exact."""
    overrides = [f"network.model={model}"]
    folded = simulate(scenario_from_text(FABRIC_HAND_OFFS, "inline.yaml", overrides)).summary
    unfolded = simulate(scenario_from_text(FABRIC_HAND_OFFS, "inline.yaml", [*overrides, "run.fold=false"])).summary
    assert folded["folded"] and folded["simulated_ranks"] == 6 and "fold_off_reason" not in folded
    assert "fold_not_exact" not in folded and not folded["warnings"]
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-9)


def test_a_hop_refold_out_of_step_on_the_flow_model_goes_on_from_it():
    """Two NICs per host at 8:1 on the flow model: the stage fold's hand-offs cross other hops (4 links over GPUs
    [0, 8], 6 over [24, 32]), so it is given up before its run for the refold by hops (6 ranks); that refold's
    class-mates then meet other loads on their NICs and fall out of step, and the step goes on from it, here
    unfolded: one rerun (its note, then the run's), where the stage fold's run came first and the step ran three
    times. Every figure is the unfolded run's."""
    overrides = ["cluster.nics_per_node=2", "cluster.oversubscription=8"]
    notices: list = []
    folded = simulate(scenario_from_text(FABRIC_HAND_OFFS, "inline.yaml", overrides), on_rerun=notices.append).summary
    unfolded = simulate(scenario_from_text(FABRIC_HAND_OFFS, "inline.yaml", [*overrides, "run.fold=false"])).summary
    assert [(entry["fold"], entry["simulated_ranks"], entry["why"]) for entry in folded["fold_given_up"]] == [
        ("stage", 3, "the replicas' hand-offs cross other hops"),
        ("routes", 6, "a hand-off fell out of step in its run")]
    assert [type(notice).__name__ for notice in notices] == ["FoldDropped", "Rerun"] and notices[1].unfolded
    assert folded["simulated_ranks"] == unfolded["simulated_ranks"] == 48
    assert folded["step_time_s"] == unfolded["step_time_s"]


def test_analytic_hand_offs_over_other_hops_refold_by_hops():
    """With oversubscription 8 the same layout's stage fold on the analytic model is 2.0% slow (25.442 against 24.936
    ms) and its exposed pp 48% high (1.667 against 1.129 ms): replica 0 hands stage 0 on to stage 1 inside a leaf
    group (GPUs 0 -> 8, 4 links), replica 1 across the spines (24 -> 32, 6 links), which that model, running each
    transfer alone and with no lockstep check after the run, cannot compare. Known before the run, the stage fold is
    given up for that reason and the step folds by the route classes of hops, each transfer alone taking its own
    route's time: every figure is the unfolded run's."""
    overrides = ["network.model=analytic", "cluster.oversubscription=8"]
    folded = simulate(scenario_from_text(FABRIC_HAND_OFFS, "inline.yaml", overrides)).summary
    unfolded = simulate(scenario_from_text(FABRIC_HAND_OFFS, "inline.yaml", [*overrides, "run.fold=false"])).summary
    assert folded["folded"] and "fold_not_exact" not in folded and not folded["warnings"]
    (stage,) = folded["fold_given_up"]
    assert (stage["fold"], stage["simulated_ranks"], stage["why"]) == ("stage", 3,
                                                                     "the replicas' hand-offs cross other hops")
    assert "crosses 4 links over GPUs [0, 8] but 6 over the equivalent [24, 32]" in folded["fold_routes_reason"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15, "fold_routes_reason")


def test_under_force_the_hop_refold_is_held_to_the_refold_multiple_not_to_the_limits(monkeypatch):
    """--force skips the scale limits, but the hop refold, which runs in place of the stage fold the forced estimate was
    made for, is held to `scale.REFOLD_COST_MULTIPLE` times the fold's ranks, forced or not (unbounded, on the
    published SC21 1T row, analytic, it would simulate 320 of 3,072 ranks, 5 x the stage fold: 118 s of CPU and 7.1
    GB against 19.6 s and 1.5 GB): the case above (6 ranks against 3) refolds under --force with every refold beyond
    the limits, and with the multiple below 2 it is given up (`size`) and the stage fold stands, not exact."""
    from simulator import scale

    loaded = scenario_from_text(FABRIC_HAND_OFFS, "inline.yaml", ["network.model=analytic",
                                                                   "cluster.oversubscription=8"])
    monkeypatch.setattr(scale, "MAX_EVENTS", 1)
    forced = simulate(loaded, force=True).summary
    assert forced["simulated_ranks"] == 6 and "fold_not_exact" not in forced
    monkeypatch.setattr(scale, "REFOLD_COST_MULTIPLE", 1.5)
    held = simulate(loaded, force=True).summary
    assert held["simulated_ranks"] == 3 and held["fold_not_exact"]["fold"] == "stage"
    (refold,) = held["fold_given_up"]
    assert (refold["fold"], refold["simulated_ranks"], refold["why"]) == ("routes", 6,
                                                                        "the refold is too large to simulate")
    assert refold["reason"].startswith("the refold would cost 2 x the fold (6 ranks simulated against 3)")


def test_tree_all_reduces_over_tp_lanes_unfold():
    """NCCL's tree all-reduce over the DP groups of four TP lanes, with the TP all-reduces trees too: the TP
    tree's inner ranks (lanes 1 and 2) send and receive twice a leaf's bytes on their NVLink ports, where their
    lanes' DP trees cross too, so in the unfolded run those lanes' DP buckets end 20 us after lane 0's (bucket 0:
    0.016957 s against 0.016937 s; step 0.049256 s) while a folded run's mirrors would follow lane 0's phases
    (0.049244 s, 2.3e-4 short). The symmetry check sees the lanes meet the TP tree's unequal load unlike and
    unfolds."""
    overrides = ["collectives.algorithm=tree"]
    folded = simulate(scenario_from_text(DENSE, "inline.yaml", overrides)).summary
    assert not folded["folded"]
    assert "members send unlike amounts" in folded["fold_off_reason"]


DP_TREES = """
cluster: {topology: dgx-a100-cluster, nodes: 8}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 2, micro_batch: 4, precision: fp16}
parallelism: {tp: 2, ddp: {overlap: true}}
collectives: {algorithm: tree}
run: {timeline: summary}
"""
"""SC21 3.6B's geometry on a small model: TP 2 inside DGX A100 hosts, gradient buckets all-reduced over DP 32 by
NCCL's tree (a chain of four GPUs in each host, a double binary tree across the 8 hosts) during the backward."""


def test_dp_trees_across_hosts_fold_to_the_bit():
    """Every host's chain carries the same chunks over its NVLink links, but over phases of other lengths where the
    host's place in the host tree differs. Summed by size in a fixed order the loads are one number, the step folds
    to one rank, and its step is the unfolded one's to the bit; summed phase by phase in float, host 1's load would
    come out three units in the last place above host 0's (60442214.40000005 against ...03 bytes), the TP all-reduce
    over [0, 1] would seem to meet the trees otherwise than over [8, 9], and the step would run unfolded (64 ranks)."""
    folded = simulate(scenario_from_text(DP_TREES, "inline.yaml")).summary
    unfolded = simulate(scenario_from_text(DP_TREES, "inline.yaml", ["run.fold=false"])).summary
    assert folded["folded"] and folded["simulated_ranks"] == 1
    assert folded["step_time_s"] == unfolded["step_time_s"]


TREE_HAND_OFFS = """
cluster: {topology: dgx-a100-cluster, nodes: 64, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1}
model: {layers: 8, hidden: 4096, heads: 32, vocab: 32000}
training: {seq_len: 1024, microbatches: 4, micro_batch: 1, precision: fp16}
parallelism: {pp: 2}
collectives: {algorithm: tree}
run: {timeline: summary}
"""
"""megatron-sc21-76.1b's DP trees on hosts of one GPU: each stage's gradient buckets all-reduced by NCCL's double
binary tree over 32 hosts, one member a host, while the last micro-batch's backward hands on."""


def test_hand_offs_beside_dp_trees_fold_with_the_roots_apart():
    """NCCL roots its two trees at the group's first and last hosts, whose NICs carry 2 tree edges where every other
    host's carry 4: folded by stage, replica 0's hand-off (the representative's) ends 0.89 ms before its mirrors'.
    The refold by the loads the hand-offs' copies meet keeps the roots' replicas (0 and 31) apart from the other 30
    and keeps pace: 4 of 64 ranks, every figure the unfolded run's. With an interleaved schedule that refold falls
    out of step too, and so does the refold by place in the trees on these two leaves, and the step runs unfolded
    (`test_hand_offs_beside_dp_trees_on_two_leaves_run_unfolded`; one leaf per rail: below)."""
    folded = simulate(scenario_from_text(TREE_HAND_OFFS, "inline.yaml")).summary
    unfolded = simulate(scenario_from_text(TREE_HAND_OFFS, "inline.yaml", ["run.fold=false"])).summary
    assert [(entry["fold"], entry["simulated_ranks"]) for entry in folded["fold_given_up"]] == [("stage", 2)]
    assert "'recv bwd mb3' over GPUs [1, 0]" in folded["fold_given_up"][0]["reason"]
    assert folded["folded"] and folded["simulated_ranks"] == 4
    assert folded["rank_weights"] == {"0": 2, "1": 2, "2": 30, "3": 30}
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15, "fold_routes_reason")


def test_hand_offs_beside_dp_trees_refold_by_place_in_the_trees():
    """Interleaved (v = 2), the refold by the loads the hand-offs meet falls out of step as well ('recv bwd mb3'
    over GPUs [3, 2], 0.29 ms apart), and the refold by each host's place in the trees (`_place_signatures`:
    its transfers per phase of the trees' plans, which tree aside) keeps pace: 10 of 64 ranks, one for the two roots
    together and one per height (16, 8, 4 and 2 hosts) shared by the two trees in each stage, every figure the
    unfolded run's. One leaf per rail here: on two leaves the spine hash parts hosts in like places, that refold
    falls out of step by 2.5 us, and the step runs unfolded
    (`test_hand_offs_beside_dp_trees_on_two_leaves_run_unfolded`)."""
    text = TREE_HAND_OFFS.replace("nics_per_node: 1}", "nics_per_node: 1, leaf_ports: 64}").replace(
        "parallelism: {pp: 2}", "parallelism: {pp: 2, pipeline: {schedule: interleaved, virtual_stages: 2}}")
    folded = simulate(scenario_from_text(text, "inline.yaml")).summary
    unfolded = simulate(scenario_from_text(text, "inline.yaml", ["run.fold=false"])).summary
    assert [(entry["fold"], entry["simulated_ranks"]) for entry in folded["fold_given_up"]] == [("stage", 2),
                                                                                                ("routes", 4)]
    assert folded["folded"] and folded["simulated_ranks"] == 10
    assert folded["rank_weights"] == {"0": 2, "1": 2, "2": 16, "3": 16, "6": 8, "7": 8, "14": 4, "15": 4,
                                      "30": 2, "31": 2}
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15, "fold_routes_reason")


def test_hand_offs_beside_dp_trees_on_two_leaves_run_unfolded():
    """Interleaved (v = 2) on the default two leaves, the spine hash sends the flows of hosts in like places in the
    trees over other spines: after the stage fold (2 ranks) and the refold by loads (4), the refold by place in the
    trees (10) falls out of step too ('send bwd mb2' over GPUs [2, 3], 2.5 us apart), and the step runs unfolded,
    every figure the run with `run.fold=false`'s to the bit."""
    text = TREE_HAND_OFFS.replace(
        "parallelism: {pp: 2}", "parallelism: {pp: 2, pipeline: {schedule: interleaved, virtual_stages: 2}}")
    folded = simulate(scenario_from_text(text, "inline.yaml")).summary
    unfolded = simulate(scenario_from_text(text, "inline.yaml", ["run.fold=false"])).summary
    assert [(entry["fold"], entry["simulated_ranks"]) for entry in folded["fold_given_up"]] == [
        ("stage", 2), ("routes", 4), ("routes", 10)]
    place = folded["fold_given_up"][-1]["out_of_step"]
    assert (place["name"], place["group"]) == ("send bwd mb2", [2, 3])
    assert place["widest_s"] == pytest.approx(2.5e-6)
    assert not folded["folded"] and folded["simulated_ranks"] == unfolded["simulated_ranks"] == 64
    assert_same_figures(folded, unfolded, 0.0, 0.0, "fold_off_reason")


SC21_LIKE = """
cluster: {topology: dgx-a100-cluster, nodes: 24}
model: {layers: 16, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 2048, global_batch: 48, micro_batch: 2, precision: fp16}
parallelism: {tp: 8, pp: 8, pipeline: {schedule: interleaved, virtual_stages: 2}, ddp: {overlap: false}}
run: {timeline: summary}
"""
"""The published SC21 145.6B row's geometry (DGX A100 hosts, leaf groups of 20 hosts, replicas of 8 hosts, one
per stage, an interleaved schedule, the DP reduction after the last micro-batch) on 24 hosts in place of 192:
replicas 0 and 1 hand on inside leaf group 0, replica 2 (hosts 16-23) hands stage 3 on to stage 4 across the
spines (host 19 to host 20) and wraps back over them, a switch hop's latency later. Folded by stage, the copies of
its hand-offs end 1 us apart, as the row's 'send fwd mb0' over GPUs [24, 32] did."""


@pytest.mark.parametrize("nodes, overrides", [(24, []), (24, ["cluster.oversubscription=2"]),
                                              (40, ["training.global_batch=80"])])
def test_replicas_that_hand_on_across_the_spines_fold_once_per_kind_of_route(nodes, overrides):
    """Known before its run, the stage fold's hand-offs cross other hops in some replicas (the wrap from stage 7
    back to 0 over GPUs [56, 0] crosses 4 links, over [184, 128] in replica 2 6; `fold_policy.hop_refold`), so it is
    given up unrun, where it once ran and fell out of step by 1 us, and the step folds with one representative per
    kind of hand-off route (engine/rank_classes.py `route_classes`: the replicas that hand on inside their leaf
    group, and those that cross the spines), each weighed by how many ranks it stands for (classes of 16 and 8
    positions with 24 hosts, 32 and 8 with 40, where replicas 0, 1, 3 and 4 stay inside): 16 ranks, where
    classing each replica apart simulated 8 per replica (the row: 192 of 1,536 ranks, 36 s and 1.7 GB against
    about 5 s and 0.34 GB). Every figure of the summary is the unfolded run's, within 1e-12; unweighted, the
    per-GPU means were off (exposed pp by 1e-4 on the row)."""
    text = SC21_LIKE.replace("nodes: 24", f"nodes: {nodes}")
    reruns: list = []
    folded = simulate(scenario_from_text(text, "inline.yaml", overrides), on_rerun=reruns.append).summary
    assert reruns == [], "the step runs once, folded by route before its run"
    unfolded = simulate(scenario_from_text(text, "inline.yaml", [*overrides, "run.fold=false"])).summary
    assert folded["folded"] and folded["simulated_ranks"] == 16 and unfolded["simulated_ranks"] == 8 * nodes
    (stage,) = folded["fold_given_up"]
    assert (stage["fold"], stage["simulated_ranks"], stage["why"]) == ("stage", 8,
                                                                     "the replicas' hand-offs cross other hops")
    assert "out_of_step" not in stage and stage["reason"] == folded["fold_routes_reason"]
    assert folded["fold_routes_reason"] == (
        "send_recv 'recv fwd mb0' crosses 4 links over GPUs [56, 0] but 6 over the equivalent [184, 128]: its copies "
        "end apart by those hops' latencies, so one rank per stage cannot stand for both, and the step folds by the "
        "hand-offs' routes before its run")
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15, "fold_routes_reason")


@pytest.mark.parametrize("refolds", [True, False])
def test_a_step_that_may_not_unfold_refolds_by_route_within_the_budget(refolds):
    """The SC21-like step where the guard refuses it unfolded (as the published 1T, 310.1B and 529.6B rows are
    refused): its hand-offs out of step, the route refold by hops is tried all the same where the refold budget
    allows it (scale.refold_refusal), and stands, exact (the unfolded step's figures within 1e-12), with the stage
    fold given up; refused by the budget, it is given up before it is built and the stage fold stands, not exact,
    with its warning. Until then the refold was never tried there, and the step stood `fold_not_exact`."""
    summary = refused_unfolded(SC21_LIKE, refolds=refolds)
    assert summary["folded"]
    if refolds:
        unfolded = simulate(scenario_from_text(SC21_LIKE, "inline.yaml", ["run.fold=false"])).summary
        # simulate() adds the step's `resources` (its step time and tokens, compared here) past simulate_training,
        # which `refused_unfolded` calls
        del unfolded["resources"]
        assert summary["simulated_ranks"] == 16 and not summary["warnings"] and "fold_not_exact" not in summary
        assert [(entry["fold"], entry["simulated_ranks"]) for entry in summary["fold_given_up"]] == [("stage", 8)]
        assert_same_figures(summary, unfolded, 1e-12, 1e-15, "fold_routes_reason")
        return
    assert summary["simulated_ranks"] == 8 and summary["fold_not_exact"]["fold"] == "stage"
    assert summary.get("fold_given_up") == [
        {"fold": "routes", "simulated_ranks": 16, "why": "the refold is too large to simulate", "reason": NO_REFOLDS}]
    (warning,) = summary["warnings"]
    assert warning.startswith("folded step not exact, and too large to simulate unfolded: send_recv 'send fwd mb0'")


ALIKE_HOPS = """
cluster: {topology: dgx-h100-cluster, nodes: 10, leaf_ports: 3, spines: 2}
model: {layers: 16, hidden: 1024, heads: 8, vocab: 32000}
training: {seq_len: 1024, microbatches: 8}
parallelism: {tp: 2, pp: 8, dp: 5, pipeline: {schedule: 1f1b}}
collectives: {algorithm: hierarchical, sm_contention: none}
run: {timeline: summary}
"""
"""Five replicas on ten hosts in leaf groups of three: copies of the first hand-off cross as many links (6) but
meet other flows on them (the spines' hash), so the route classes by hops part no ranks."""


def test_a_step_that_may_not_unfold_says_which_refolds_it_did_not_try():
    """Where the step may not unfold only the route classes by hops are proposed; on `ALIKE_HOPS` they part no ranks, so
    no refold runs and the stage fold stands, not exact. `fold_given_up` lists the finer route classes as not tried,
    and why (unfolded, main refolds 32 then 40 ranks, exact), so the summary says so, not only the warning."""
    summary = refused_unfolded(ALIKE_HOPS, refolds=True)
    assert summary["simulated_ranks"] == 8 and summary["fold_not_exact"]["fold"] == "stage"
    assert summary["fold_not_exact"]["out_of_step"]["widest_s"] > 0
    (untried,) = summary["fold_given_up"]
    assert (untried["fold"], untried["simulated_ranks"], untried["why"]) == (
        "routes", None, "finer refolds are not tried where the step may not unfold")
    assert untried["reason"].startswith("route classes by the loads the hand-offs' copies meet on their hops, by "
                                        "place in the other collectives' plans, and by host, are not proposed where "
                                        "the step may not unfold")


SPINE_CROSSING_REPLICA = """
cluster: {topology: dgx-h100-cluster, nodes: 6, leaf_ports: 3}
model: {layers: 8, hidden: 1024, heads: 8, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 8, pp: 2, dp: 3}
"""
"""Three replicas of two hosts in leaf groups of three hosts: the middle one hands on across the spines, so the
route refold simulates ranks 0 and 8 (replicas 0 and 2, 16 GPUs each) and 16 and 24 (replica 1, 8 each)."""


def test_a_weighted_fold_says_how_many_gpus_each_shown_rank_stands_for(tmp_path, capsys):
    """summary.json's `rank_weights`, the trace's thread names, the console's ranks row, the per-stage timeline and the
    Gantt chart's rows of a fold by classes of unequal size say how many GPUs each shown rank stands for (not 'GPU 16
    pp (virtual stage 0)', '4 of 48 ranks simulated (folded)', or `plot gantt --by rank`'s 'rank 16 (stage 0)' drawn
    like 'rank 0 (stage 0)'), and the per-stage timeline keeps the replica across the spines beside ranks 0 and 8 (a
    plain mean over its ranks would give exposed pp 263.2 us against the summary's 236.2)."""
    import json

    import pyarrow.parquet as pq

    from simulator.cli import main

    scenario = tmp_path / "spines.yaml"
    scenario.write_text(SPINE_CROSSING_REPLICA)
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--set", "run.timeline=per-stage"]) == 0
    assert ("4 of 48 ranks simulated (folded), ranks 0, 8 standing for 16 GPUs each, 16, 24 for 8; the stage fold "
            "given up" in " ".join(capsys.readouterr().out.split()))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rank_weights"] == {"0": 16, "8": 16, "16": 8, "24": 8}
    events = json.loads((tmp_path / "out" / "trace.json").read_text())["traceEvents"]
    names = {event["args"]["name"] for event in events if event.get("name") == "thread_name"}
    assert "GPU 16 pp (virtual stage 0, stands for 8 GPUs)" in names
    assert "GPU 0 pp (virtual stage 0, stands for 16 GPUs)" in names
    ranks = pq.read_table(tmp_path / "out" / "timeline.parquet", columns=["rank"]).column("rank").to_pylist()
    assert sorted(set(ranks)) == [0, 8, 16, 24]
    outputs = load_run_outputs(tmp_path / "out")
    rows = gantt_figure(outputs.timeline, outputs.summary, by="rank").axes[0].get_yticklabels()
    assert [label.get_text() for label in rows] == [
        "rank 0 (stage 0, stands for 16 GPUs)", "rank 8 (stage 1, stands for 16 GPUs)",
        "rank 16 (stage 0, stands for 8 GPUs)", "rank 24 (stage 1, stands for 8 GPUs)"]
    stages = gantt_figure(outputs.timeline, outputs.summary, by="stage").axes[0].get_yticklabels()
    assert [label.get_text() for label in stages] == ["stage 0 (rank 0, stands for 16 GPUs)",
                                                      "stage 1 (rank 8, stands for 16 GPUs)"]


def test_representatives_of_unequal_classes_weigh_as_many_ranks_as_they_stand_for():
    """A representative's weight is its class's size (a rank of each stage per position); equal classes, or one
    rank per stage, have none (the plain mean is the unfolded one, to the bit)."""
    layout = Layout(tp=2, pp=2, dp=3)
    unequal = RankClasses((0, 0, 0, 0, 1, 1))
    assert unequal.sizes == (4, 2) and not unequal.equal
    assert rank_weights(layout, unequal) == {0: 4, 8: 2, 2: 4, 10: 2}
    assert sum(rank_weights(layout, unequal).values()) == layout.world
    assert rank_weights(layout, RankClasses((0, 0, 0, 1, 1, 1))) is None
    assert rank_weights(layout, None) is None
    assert RankClasses.keyed([0, 0, 0, 0, 1, 1]) is None
    assert RankClasses.keyed([0, 0, 0, 0, 1, 1], unequal=True) == unequal


def test_out_of_step_reasons_say_what_differs_and_tell_the_two_times_apart():
    """A reason names what differs: for a hand-off, its copies' routes (other hops, or as many links under other
    flows), for another collective the loads the lanes of a stage met; the two ends are printed with as many digits
    as tell them apart (`units.durations_apart`: 1.2345671 s and 1.2345674 s, both 1.23457 s at six digits)."""
    apart = OutOfStep("send_recv", "send fwd mb0", (24, 32), 1.2345671, 1.2345674, 2, 3e-7, ((24, 32), (152, 160)),
                      (4, 6))
    assert apart.reason() == (
        "send_recv 'send fwd mb0' over GPUs [24, 32] ended on its mirrors between 1.2345671 s and 1.2345674 s in the "
        "folded run (2 instances out of step, by up to 0.3 us): its copy over GPUs [24, 32] crosses 4 links and "
        "the one over [152, 160] 6: the replicas' hand-offs take routes of other hops (as one inside a leaf group "
        "and one across the spines), so one rank cannot stand for both")
    same_hops = OutOfStep("send_recv", "send fwd mb0", (7, 8), 4.60056e-3, 5.55246e-3, 8, 9.5e-4, ((7, 8), (55, 56)),
                          (6, 6))
    assert same_hops.reason().endswith(
        "between 4.601 ms and 5.552 ms in the folded run (8 instances out of step, by up to 950 us): its copies over "
        "GPUs [7, 8] and [55, 56] cross as many links (6) but met other flows on them (the fabric hashes each flow "
        "onto a spine by its hosts, their rails' difference and its channel), so one rank cannot stand for both")
    ring = OutOfStep("all_reduce", "dp all_reduce", (0, 8), 0.05, 0.0501, 1, 1e-4, ((0, 8), (1, 9)))
    assert ring.reason().endswith(
        "(1 instance out of step, by up to 100 us): the lanes of a stage met the fabric's traffic unlike (as flows "
        "hashed onto the spines unevenly, or a ring that runs the other way round through every other host), so one "
        "rank cannot stand for its stage")
