"""A step with links down from its start folds by classes of ranks (engine/fold_policy.py `link_fault_step`: the
hosts near the links down apart, the other ranks by rail and by the near ranks their groups hold), and the folded
step equals the unfolded one: the step time to the bit, every other figure to the rounding of a weighted mean.
Each case says whether it folds, so a change that unfolded every case (as link faults all did) or folded one
wrongly fails here. The cases are shared (`CASES`): `LinkFaultRanks` counts each one's fold without a step."""

from __future__ import annotations

import json
from functools import cache

import pytest
from shared import FABRIC_HAND_OFFS, SCENARIOS, assert_same_figures

from simulator.config.loader import scenario_from_text
from simulator.engine.fold_policy import (
    EVERY_RANK_NEAR,
    LINKS_DURING_STEP,
    LINKS_WITHOUT_LAYOUT,
    STAGE_FOLD_NEAR,
)
from simulator.engine.rank_classes import LinkFaultRanks
from simulator.simulation import simulate
from simulator.topology.loader import scenario_topology
from simulator.workload.training import pipeline_depth, resolve_layout

STEP = """
collectives: {channels: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
run: {timeline: summary}
"""
RAILS = "cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2, oversubscription: 2}\n" + STEP
"""Rail-optimized DGX H100 hosts (a NIC and a leaf per rail), two hosts a leaf group."""
RAILS_8 = RAILS.replace("nodes: 4", "nodes: 8")
RAILS_16 = RAILS.replace("nodes: 4, leaf_ports: 2", "nodes: 16, leaf_ports: 4")
"""Sixteen rail-optimized hosts in four leaf groups."""
PLAIN = ("cluster: {topology: dgx-h100-cluster, nodes: 8, node: {kind: nvswitch_node, gpus: 4}, nics_per_node: 1, "
         "leaf_ports: 2, spines: 2, oversubscription: 2}\n" + STEP)
"""A plain fat tree: one NIC a host, every GPU of a host behind it."""
TWO_NICS = PLAIN.replace("nics_per_node: 1", "nics_per_node: 2")

MOE_16 = RAILS_16.replace("vocab: 32000}", "vocab: 32000, moe: {experts: 16, top_k: 2}}")
"""RAILS_16 with a MoE model: its EP all-to-alls and expert-DP reductions are groups of their own."""

STAGE_FOLD_UNDER_LINKS = f"links down: {STAGE_FOLD_NEAR}"
"""Why the stage fold is given up under links down (`link_faults_held` names them before the reason)."""

DP_FIRST = "order: [dp, tp, cp, pp]"
CASES = {
    "rails-leaf": (RAILS, "{tp: 8, dp: 4}", "leaf"),
    "rails-nic": (RAILS, "{tp: 8, dp: 4}", "nic"),
    "rails-uplink": (RAILS, "{tp: 8, dp: 4}", "uplink"),
    "rails-pp-nic": (RAILS_8, "{tp: 8, pp: 2, dp: 4}", "nic"),
    "rails-pp-uplink": (RAILS_8, "{tp: 8, pp: 2, dp: 4}", "uplink"),
    "two-nics-pp-uplink": (TWO_NICS, "{tp: 4, pp: 2, dp: 4}", "uplink"),
    "two-nics-tp2-uplink": (TWO_NICS, "{tp: 2, dp: 16}", "uplink"),
    "plain-tp4-uplink": (PLAIN, "{tp: 4, dp: 8}", "uplink"),
    "plain-dp-uplink": (PLAIN, "{tp: 1, dp: 32}", "uplink"),
    "plain-hsdp-uplink": (PLAIN, "{tp: 1, dp: 32, fsdp: hybrid_shard}", "uplink"),
    "rails-hsdp-leaf": (RAILS, "{tp: 4, dp: 8, fsdp: hybrid_shard}", "leaf"),
    "spine": (RAILS, "{tp: 8, dp: 4}", "spine"),
    "nic-dp2": (RAILS_8, "{tp: 8, pp: 4, dp: 2}", "nic"),
    "tp-over-two-hosts": (RAILS_16, "{tp: 16, dp: 8}", "leaf3.r1"),
    "tp-over-eight-hosts": (RAILS_16.replace("spines: 2", "spines: 4"), f"{{tp: 8, dp: 16, {DP_FIRST}}}", "leaf3.r1"),
    "tp-over-eight-hosts-two-spines": (RAILS_16, f"{{tp: 8, dp: 16, {DP_FIRST}}}", "leaf3.r1"),
    "tp-over-eight-hosts-two-spines-rings": (RAILS_16.replace("collectives: {channels: 2}",
                                                              "collectives: {channels: 2, algorithm: ring}"),
                                             f"{{tp: 8, dp: 16, {DP_FIRST}}}", "leaf3.r1"),
    "one-leaf-group": (RAILS, "{tp: 8, pp: 2, dp: 2}", "leaf"),
    "pp-leaf-near-hand-off": (RAILS_8, "{tp: 8, pp: 2, dp: 4}", "leaf"),
    "tree-loads": (RAILS, "{tp: 4, pp: 2, dp: 4}", "nic"),
    "two-nics-pp-leaf-out-of-step": (TWO_NICS, "{tp: 4, pp: 2, dp: 4}", "leaf"),
    "dp-first-uplink-out-of-step": (RAILS_16, f"{{tp: 4, dp: 32, {DP_FIRST}}}", "leaf2.r2-spine1"),
    "moe-ep8-leaf": (MOE_16, "{tp: 8, dp: 16, ep: 8}", "leaf3.r1"),
}
"""Every step with links down from its start that this module simulates, by name: its cluster, its parallelism
and the links down (`_links`). The tests below say what each does; `LinkFaultRanks` is checked on all."""


def _links(text: str, down: str) -> list[list[str]]:
    """The links ``down`` names on ``text``'s cluster: a leaf's (all of leaf0.r0's, or of the leaf named), a
    spine's (spine0's), a NIC's cable (h0/nic0 to its leaf) or a leaf's cable to a spine (leaf0.r0's to spine0,
    or the one named as 'leaf-spine')."""
    graph = scenario_topology(scenario_from_text(text, "inline.yaml", [])).graph
    if "-" in down:
        return [down.split("-")]
    if down not in ("nic", "uplink"):
        switch = {"leaf": "leaf0.r0", "spine": "spine0"}.get(down, down)
        return [[switch, node] for node in sorted(graph.successors(switch))]
    return [["leaf0.r0", "h0/nic0" if down == "nic" else "spine0"]]


@cache
def _summary(case: str, fold: bool = True) -> dict:
    """The summary of ``case``'s step (`CASES`), folded where its fold policy allows or unfolded; each read once
    for the module (the count of its ranks reads the folded one again)."""
    text, parallelism, down = CASES[case]
    links = json.dumps([{"link": pair} for pair in _links(text, down)])
    faulted = text + f"parallelism: {parallelism}\nfaults: {{step: {{links: {links}}}}}\n"
    return simulate(scenario_from_text(faulted, "inline.yaml", [] if fold else ["run.fold=false"])).summary


def _folded_and_unfolded(case: str) -> tuple[dict, dict]:
    return _summary(case), _summary(case, fold=False)


@pytest.mark.parametrize(("case", "ranks"), [
    ("rails-leaf", 24), ("rails-nic", 24), ("rails-uplink", 24), ("rails-pp-nic", 32), ("rails-pp-uplink", 32),
    ("two-nics-pp-uplink", 16), ("two-nics-tp2-uplink", 12), ("plain-tp4-uplink", 12), ("plain-dp-uplink", 12),
])
def test_links_down_fold_by_the_hosts_near_them_exactly(case, ranks):
    """Folded onto the hosts near the links down (each of their ranks apart) and one rank per rail elsewhere,
    the step time is the unfolded one's to the bit; the per-GPU means, weighed by the classes' sizes, agree to
    a few units in the last place (the weighted sum adds in another order). The stage fold is given up first."""
    folded, unfolded = _folded_and_unfolded(case)
    assert folded["folded"] and folded["simulated_ranks"] == ranks and not folded["warnings"]
    assert [(entry["fold"], entry["reason"]) for entry in folded["fold_given_up"]] == [("stage",
                                                                                          STAGE_FOLD_UNDER_LINKS)]
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert folded["faults"] == unfolded["faults"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)


@pytest.mark.parametrize(("case", "near", "stages"), [("spine", "4 of 4", 1), ("nic-dp2", "2 of 8", 4)])
def test_links_fold_of_one_rank_a_class_says_so_and_how_many_hosts_are_near(case, near, stages):
    """Where every class of the links fold holds one rank, the reason says so and how many hosts are near (not "links
    down near every host"), and the links fold is listed as given up beside the stage fold: with DP 2 under a NIC
    down near 2 of 8 hosts, every far rank shares a DP group with a near one."""
    folded = _summary(case)
    assert not folded["folded"] and folded["fold_off_reason"] == f"{EVERY_RANK_NEAR} ({near} hosts near)"
    assert [(entry["fold"], entry["simulated_ranks"], entry["reason"]) for entry in folded["fold_given_up"]] == [
        ("stage", stages, STAGE_FOLD_UNDER_LINKS),
        ("links", folded["simulated_ranks"], folded["fold_off_reason"])]


@pytest.mark.parametrize("case", ["tp-over-two-hosts", "tp-over-eight-hosts"])
def test_far_ranks_whose_groups_hold_other_near_ranks_fold_apart(case):
    """With TP across hosts, the far ranks of one rail sit in groups that hold other ranks of the hosts near a leaf
    down, and meet its detours unlike (TP 16, DP 8: the DP communication of a rail's far ranks takes 8.4 ms on even
    hosts, 6.8 ms on odd ones). Classed by rail alone, the fold's step time would be right but its DP communication
    2.1% high (TP over eight hosts: the bubble 5% low); classed also by the near ranks their groups hold, every
    figure is the unfolded one's. TP over eight hosts runs on four spines: on two, the detours picked in the frame of
    their source's rail (faults/rerouting.py) meet a DP all-reduce's copies unlike, and the fold is given up at run
    time."""
    folded, unfolded = _folded_and_unfolded(case)
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)
    assert folded["folded"] and folded["simulated_ranks"] == 48 and folded["warnings"] == unfolded["warnings"]


def test_tp_over_eight_hosts_on_two_spines_folds_by_links_to_the_unfolded_figures():
    """TP over eight hosts on two spines, leaf3.r1 down: with `nvls` across DGX hosts as NCCL's tree over each
    host's heads the step's collectives meet the detours alike, and the links fold onto 48 ranks holds, every
    figure the unfolded step's (31.96 ms)."""
    folded, unfolded = _folded_and_unfolded("tp-over-eight-hosts-two-spines")
    assert folded["folded"] and folded["simulated_ranks"] == 48
    assert [entry["fold"] for entry in folded["fold_given_up"]] == ["stage"]
    assert folded["step_time_s"] == unfolded["step_time_s"] == pytest.approx(31.96e-3, abs=5e-6)
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)


def test_rings_over_eight_hosts_on_two_spines_give_the_fold_up_for_the_unfolded_figures():
    """The same step with its all-reduces as rings: the DP all-reduce's copies meet the detours unlike, the links
    fold is given up in its run, saying so, and every figure is the unfolded step's (37.34 ms)."""
    folded, unfolded = _folded_and_unfolded("tp-over-eight-hosts-two-spines-rings")
    reason = "its copies met the detours around the links down unlike"
    assert not folded["folded"] and reason in folded["fold_off_reason"]
    assert [(entry["fold"], reason in entry["reason"]) for entry in folded["fold_given_up"]] == [
        ("stage", False), ("links", True)]
    assert folded["step_time_s"] == unfolded["step_time_s"] == pytest.approx(37.336e-3, abs=5e-6)
    assert_same_figures(folded, unfolded, 0, 0, "fold_off_reason")


def test_a_near_hand_off_keeps_pace_where_detours_rotate_with_the_replicas():
    """TP 8 x PP 2 x DP 4 on eight hosts in leaf groups of two, leaf0.r0 down: the detours are picked in the frame of
    the source's leaf group (faults/rerouting.py), so they rotate with the replicas, and the fold onto 32 ranks keeps
    pace, every figure the unfolded one's. Picked by a hash of their absolute ends, a near replica's hand-off would
    meet other flows than its class-mate's and the fold fall out of step at 'recv bwd mb3' over GPUs [28, 20]."""
    folded, unfolded = _folded_and_unfolded("pp-leaf-near-hand-off")
    assert folded["folded"] and folded["simulated_ranks"] == 32
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)


@pytest.mark.parametrize(("case", "reason"), [
    ("spine", EVERY_RANK_NEAR),
    ("one-leaf-group", EVERY_RANK_NEAR),
    ("tree-loads", "members send unlike amounts"),
    ("two-nics-pp-leaf-out-of-step", "send_recv 'recv bwd mb3' over GPUs [14, 10] ended on its mirrors"),
    ("dp-first-uplink-out-of-step", "members send unlike amounts (a tree's inner ranks and leaves)"),
])
def test_links_down_that_no_fold_stands_for_unfold(case, reason):
    """Where every host is near the links down (a spine, one leaf group), where the classed fold is refused
    before its run (a tree's unlike loads) or falls out of step in it (a hand-off of a near host meeting other
    flows than its class-mate's), the step runs unfolded, saying why."""
    folded, unfolded = _folded_and_unfolded(case)
    assert not folded["folded"] and reason in folded["fold_off_reason"]
    assert folded["step_time_s"] == unfolded["step_time_s"]


@pytest.mark.parametrize(("fault", "overrides", "reason"), [
    ("{link: [leaf0.r0, spine0], at: 1 ms}", (), LINKS_DURING_STEP),
    ("{link: [leaf0.r0, spine0], capacity: 0.5, at: 1 ms}", (), LINKS_DURING_STEP),
    ("{link: [leaf0.r0, spine0]}", ("network.model=analytic",), "on the analytic model"),
], ids=["mid-step", "degraded-mid-step", "analytic"])
def test_link_faults_the_checks_cannot_read_unfold(fault, overrides, reason):
    """A link failing or degraded mid-step changes what the fold checks read at the step's start, and the
    analytic model has no lockstep check after the run: each unfolds the step, saying why."""
    text = RAILS + f"parallelism: {{tp: 8, dp: 4}}\nfaults: {{step: {{links: [{fault}]}}}}\n"
    summary = simulate(scenario_from_text(text, "inline.yaml", list(overrides))).summary
    assert not summary["folded"] and reason in summary["fold_off_reason"]


def test_a_link_degraded_from_the_start_folds_as_a_link_down():
    """A leaf's cable to a spine at half its bandwidth from the step's start is the cluster's cable at that
    bandwidth for the fold checks (`Topology.degrade`), so the step folds by the hosts near it, as with the cable
    down, onto 24 of 32 ranks, every figure the unfolded one's."""
    text = RAILS + "parallelism: {tp: 8, dp: 4}\nfaults: {step: {links: [{link: [leaf0.r0, spine0], capacity: 0.5}]}}\n"
    folded, unfolded = (simulate(scenario_from_text(text, "inline.yaml", overrides)).summary
                        for overrides in ([], ["run.fold=false"]))
    assert folded["folded"] and folded["simulated_ranks"] == 24
    assert folded["step_time_s"] == unfolded["step_time_s"] and folded["faults"] == unfolded["faults"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)


def test_a_traces_copies_under_links_down_unfold():
    """A replayed trace has no layout to class its copies by the hosts near the links down, so its copies run
    unfolded, saying why (they would otherwise fold as a stage fold does, which `link_fault_step` gives up)."""
    traces = SCENARIOS / "traces" / "allreduce-2rank" / "rank*.json"
    text = (f"cluster: {{topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2}}\n"
            f"workload: {{trace: '{traces}', format: kineto, dp: 32}}\n"
            "faults: {step: {links: [{link: [leaf0.r0, spine0]}]}}\n")
    summary = simulate(scenario_from_text(text, "inline.yaml", [])).summary
    assert not summary["folded"] and summary["fold_off_reason"] == LINKS_WITHOUT_LAYOUT


@pytest.mark.parametrize("case", list(CASES))
def test_the_ranks_of_a_fold_by_links_down_are_counted_without_a_step(case):
    """`LinkFaultRanks`, which a job's refusal of its states with links down sizes them by before it simulates
    any, counts from the layout and the cluster the ranks the step folded by the hosts near them simulates, in
    every case above: the folded step's, or the fold's given up for its classes of one rank or a failed check
    (every rank where every host is near). Far ranks of one rail whose groups hold other near ranks are
    counted apart, as the fold simulates them (TP across hosts: 48 ranks, where by rail alone it counted 40), and
    so are those whose EP or expert-DP groups hold near ranks (EP 8: 72 ranks, where without them it counted 40).
    Under HSDP the DP x CP group and the rails stand for its shard and replica groups (12 and 24 ranks)."""
    text, parallelism, down = CASES[case]
    loaded = scenario_from_text(text + f"parallelism: {parallelism}\n", "inline.yaml", [])
    topology = scenario_topology(loaded)
    layout = resolve_layout(loaded.scenario, topology.num_gpus, pipeline_depth(loaded.scenario))
    folded = _summary(case)
    ranks = folded["simulated_ranks"] if folded["folded"] else next(
        entry["simulated_ranks"] for entry in folded["fold_given_up"] if entry["fold"] == "links")
    count = LinkFaultRanks(layout, topology, loaded.scenario.parallelism.ep)
    assert count([(a, b) for a, b in _links(text, down)]) == ranks


RAILS_TP8 = RAILS + "parallelism: {tp: 8, dp: 4}\n"
GB200_RACKS = ("cluster: {topology: gb200-nvl72, racks: 2}\n" + STEP.replace("collectives: {channels: 2}\n", "")
               + "parallelism: {tp: 4, pp: 2, dp: 18}\n")
"""Two full GB200 NVL72 racks (144 GPUs, 4 NICs a tray on 2 leaf groups x 4 rails) as TP 4 x PP 2 x DP 18, on
its default channels (with 2, `auto` plans a tree whose traffic the TP all-reduce meets, and the step runs
unfolded, faults or not)."""


def _degraded(leaves: list[str], fold: bool = True, healthy: str = RAILS_TP8) -> dict:
    """The ``healthy`` step (RAILS as TP 8 x DP 4) with the uplinks of ``leaves`` at half their bandwidth from its
    start."""
    links = ", ".join(f"{{uplinks_of: {leaf}, capacity: 0.5}}" for leaf in leaves)
    text = healthy + f"faults: {{step: {{links: [{links}]}}}}\n"
    return simulate(scenario_from_text(text, "inline.yaml", [] if fold else ["run.fold=false"])).summary


def test_uplinks_degraded_alike_everywhere_fold_as_a_slower_healthy_fabric():
    """Every leaf's uplinks at half their bandwidth (2 groups x 8 rails = 16 leaves) leave no host nearer a
    fault than another: the cluster is the healthy one with 12.5 GB/s leaf-spine links, as symmetric, so the step
    folds as without faults (no fold given up; classing ranks by the hosts near the faults would keep all 32) and
    equals the unfolded run to the bit; it is slower than the healthy step, whose DP rings cross the spines."""
    leaves = [f"leaf{group}.r{rail}" for group in range(2) for rail in range(8)]
    folded, unfolded = _degraded(leaves), _degraded(leaves, fold=False)
    assert folded["folded"] and folded["simulated_ranks"] < 32 and "fold_given_up" not in folded
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)
    healthy = simulate(scenario_from_text(RAILS_TP8, "inline.yaml", [])).summary
    assert folded["step_time_s"] > healthy["step_time_s"]


def test_gb200_racks_with_every_leafs_uplinks_at_half_fold_as_the_healthy_step():
    """Two GB200 NVL72 racks, every leaf's uplinks (2 groups x 4 rails) at half their bandwidth: the cluster is
    the healthy one with slower leaf-spine links, so the step folds to the healthy step's ranks (2 of 144, one a
    stage), none given up, and equals the unfolded run to the bit; its DP reductions cross the spines, so it is
    slower than the healthy step (5.089 against 4.504 ms; DP communication 1.425 against 0.753 ms)."""
    leaves = [f"leaf{group}.r{rail}" for group in range(2) for rail in range(4)]
    folded, unfolded = _degraded(leaves, healthy=GB200_RACKS), _degraded(leaves, fold=False, healthy=GB200_RACKS)
    healthy = simulate(scenario_from_text(GB200_RACKS, "inline.yaml", [])).summary
    assert folded["folded"] and "fold_given_up" not in folded
    assert folded["simulated_ranks"] == healthy["simulated_ranks"] == 2 and unfolded["simulated_ranks"] == 144
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)
    assert folded["step_time_s"] > healthy["step_time_s"]


def test_uplinks_degraded_unevenly_say_degraded_not_down():
    """One leaf's uplinks at half their bandwidth (15 leaves left whole) part the hosts near it from the others:
    the stage fold is given up saying the links are degraded and the ranks near them simulated apart, not that
    links are down or that the replicas' faults differ."""
    folded = _degraded(["leaf0.r0"])
    assert [(entry["fold"], entry["why"], entry["reason"].split(":")[0]) for entry in folded["fold_given_up"]] == [
        ("stage", "the ranks near the link faults are simulated apart", "links degraded")]


@pytest.mark.parametrize("model", ["analytic", "flow"])
def test_links_degraded_alike_everywhere_fold_as_healthy_in_the_hop_refold_too(model):
    """FABRIC_HAND_OFFS (six DGX hosts, two a leaf, replica 1 handing stage 1 on across the spines) with every one of
    its 24 leaves' uplinks at half: the step is the healthy one on slower spines, so it folds by its hand-offs'
    hops before its run onto the healthy step's 6 ranks on both models, every figure the unfolded run's. The hop
    refold saw the raw link faults (reader108): on the analytic model it was given up for stragglers the scenario
    has none of and the stage fold stood not exact (16.022 ms against 15.975); on the flow model the stage fold ran,
    fell out of step by 23.31 us and the step ran again unfolded on 48 ranks."""
    links = ", ".join(f"{{uplinks_of: leaf{group}.r{rail}, capacity: 0.5}}" for group in range(3) for rail in range(8))
    text = FABRIC_HAND_OFFS + f"faults: {{step: {{links: [{links}]}}}}\n"
    overrides = [f"network.model={model}"]
    folded = simulate(scenario_from_text(text, "inline.yaml", overrides)).summary
    unfolded = simulate(scenario_from_text(text, "inline.yaml", [*overrides, "run.fold=false"])).summary
    assert folded["simulated_ranks"] == 6 and "fold_not_exact" not in folded and not folded["warnings"]
    assert [entry["why"] for entry in folded["fold_given_up"]] == ["the replicas' hand-offs cross other hops"]
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15, "fold_routes_reason")
