"""Rank folding's representatives and mirror groups on a small layout, checked by hand."""

from __future__ import annotations

from simulator.parallel.folding import mirror_images, representatives
from simulator.parallel.layout import Layout

LAYOUT = Layout(tp=2, cp=1, pp=2, dp=2)  # rank = tp + 2 * pp + 4 * dp


def test_one_representative_per_stage_when_folded():
    assert representatives(LAYOUT, fold=True) == [0, 2]
    assert representatives(LAYOUT, fold=False) == list(range(8))


def test_dp_group_mirrors_are_the_other_tp_lanes_of_the_stage():
    dp_group = LAYOUT.group("dp", 0)
    assert dp_group == (0, 4)
    assert mirror_images(LAYOUT, dp_group) == ((1, 5),)


def test_tp_group_mirrors_are_the_other_replicas_and_p2p_pairs_keep_direction():
    assert mirror_images(LAYOUT, LAYOUT.group("tp", 2)) == ((6, 7),)
    assert mirror_images(LAYOUT, (0, 2)) == ((1, 3), (4, 6), (5, 7))
    assert mirror_images(LAYOUT, (2, 0)) == ((3, 1), (6, 4), (7, 5))


OVERSUBSCRIBED = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2, oversubscription: 2}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 4096, global_batch: 32, micro_batch: 1, precision: bf16, recompute: selective}
parallelism: {tp: 8, pp: 1, dp: 4, zero: 1}
"""
"""4 DGX H100 hosts, two per leaf, two spines and 2:1 oversubscription: each spine uplink carries half a NIC.
The DP ring of each rail crosses between the leaves; which spine a flow takes is hashed from its GPUs."""


def test_folding_turns_itself_off_where_spine_hashing_treats_replicas_unequally(run_yaml):
    """With two channels, rail 0's two crossing flows share a spine uplink while rail 1's take one each: rail 1
    finishes first, the unfolded step waits for rail 0, and a folded step (one rail simulated) would be off.
    Folding must notice and fall back to every rank, with the reason in the summary."""
    folded = run_yaml(OVERSUBSCRIBED, "collectives.channels=2").summary
    unfolded = run_yaml(OVERSUBSCRIBED, "collectives.channels=2", "run.fold=false").summary
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert folded["simulated_ranks"] == 32 and not folded["folded"]
    assert "share the fabric's links unevenly" in folded["fold_off_reason"]


def test_folding_stays_on_and_exact_where_replicas_meet_the_fabric_alike(run_yaml):
    """One channel: each rail's ring crosses between the leaves once each way, alone on its uplinks whichever
    spine it hashes to, so the replicas are equal and the folded step (one rank simulated) is the unfolded one."""
    folded = run_yaml(OVERSUBSCRIBED, "collectives.channels=1").summary
    unfolded = run_yaml(OVERSUBSCRIBED, "collectives.channels=1", "run.fold=false").summary
    assert folded["folded"] and folded["simulated_ranks"] == 1 and "fold_off_reason" not in folded
    assert folded["step_time_s"] == unfolded["step_time_s"]
