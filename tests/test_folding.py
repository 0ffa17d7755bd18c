"""Rank folding: representatives and mirror groups on a small layout, checked by hand, and folded steps
against unfolded ones on small oversubscribed leaf/spine fabrics (equal to 1e-9, or folding off with why)."""

from __future__ import annotations

import pytest

from simulator.engine import symmetry
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


def _images_by_definition(layout: Layout, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """mirror_images spelt out rank by rank: each equivalent rank shifts every member's TP, CP and DP
    coordinates cyclically by its offset from the group's first member; an image already seen (as a set), or
    the group itself, is left out."""
    first = layout.coords(group[0])
    seen, images = {frozenset(group)}, []
    for rank in layout.stage_ranks(first["pp"]):
        offset = layout.coords(rank)
        image = tuple(layout.rank_of(**{dim: value if dim == "pp" else
                                        (value + offset[dim] - first[dim]) % layout.degree(dim)
                                        for dim, value in layout.coords(member).items()})
                      for member in group)
        if frozenset(image) not in seen:
            seen.add(frozenset(image))
            images.append(image)
    return tuple(images)


@pytest.mark.parametrize("order", [("tp", "cp", "pp", "dp"), ("dp", "tp", "cp", "pp"), ("cp", "pp", "dp", "tp")])
def test_mirror_images_follow_their_definition(order):
    """Every kind of group the builder folds: TP, CP, DP, pipeline pairs, the DP x CP group and slices of it (a
    shard group), on a layout of unequal degrees in three placement orders."""
    layout = Layout(tp=2, cp=3, pp=2, dp=4, order=order)
    for rank in range(0, layout.world, 5):
        combined = layout.combined_group(("dp", "cp"), rank)
        groups = [layout.group(dim, rank) for dim in ("tp", "cp", "dp", "pp")]
        groups += [combined, combined[:4], combined[1::3], (rank, layout.group("pp", rank)[-1])]
        for group in groups:
            assert mirror_images(layout, group) == _images_by_definition(layout, group), (rank, group)


OVERSUBSCRIBED = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2, oversubscription: 2}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 4096, global_batch: 32, micro_batch: 1, precision: bf16, recompute: selective}
parallelism: {tp: 8, pp: 1, dp: 4, zero: 1}
"""
"""4 DGX H100 hosts, two per leaf, two spines and 2:1 oversubscription: each spine uplink carries half a NIC.
The DP ring of each rail crosses between the leaves; which spine a flow takes is hashed from the source's flow
key (its host and place on its NIC, not its rail) within its leaf group, the destination's offset and the
channel, the same draw in every leaf group (topology/builders.py `Fabric`)."""


def test_two_channels_on_an_oversubscribed_fabric_fold_exactly(run_yaml):
    """The reported case: with spines hashed by GPU index, rail 0's two crossing flows shared a spine uplink
    while rail 1's took one each, so the folded step (rail 0 only) was off. Spines are hashed from flow keys that
    leave out the rail, so every rail's ring meets the uplinks alike and the folded step (one rank) is the
    unfolded one."""
    folded = run_yaml(OVERSUBSCRIBED, "collectives.channels=2").summary
    unfolded = run_yaml(OVERSUBSCRIBED, "collectives.channels=2", "run.fold=false").summary
    assert folded["folded"] and folded["simulated_ranks"] == 1 and "fold_off_reason" not in folded
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-9)


def test_folding_stays_on_and_exact_where_replicas_meet_the_fabric_alike(run_yaml):
    """One channel: each rail's ring crosses between the leaves once each way, alone on its uplinks whichever
    spine it hashes to, so the replicas are equal and the folded step (one rank simulated) is the unfolded one."""
    folded = run_yaml(OVERSUBSCRIBED, "collectives.channels=1").summary
    unfolded = run_yaml(OVERSUBSCRIBED, "collectives.channels=1", "run.fold=false").summary
    assert folded["folded"] and folded["simulated_ranks"] == 1 and "fold_off_reason" not in folded
    assert folded["step_time_s"] == unfolded["step_time_s"]


SMALL_FABRIC = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2, oversubscription: 2}
collectives: {channels: 2}
model: {layers: 12, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 8, dp: 4}
"""


def _folded_and_unfolded(run_yaml, *overrides: str) -> tuple[dict, dict]:
    return run_yaml(SMALL_FABRIC, *overrides).summary, run_yaml(SMALL_FABRIC, *overrides, "run.fold=false").summary


EXACT = 1e-9
PP_ROUTES = 7.5e-3
"""Pipeline pairs routed inside a leaf group in one replica and across the spines in another: folding keeps the
simulated replica's routes (engine/symmetry.py does not compare send/recvs), so the step is off by the hops and
the spine uplinks those hand-offs take: 0.70% slow on the fabric below (0.32% fast under the host-pair hash)."""


@pytest.mark.parametrize("nodes, leaf_ports, spines, oversubscription, channels, tp, pp, dp, nics, rel", [
    (4, 2, 2, 2, 2, 4, 1, 8, 8, EXACT),     # TP 4: two replicas per host, DP rings over the spines
    (8, 2, 4, 4, 2, 8, 2, 4, 8, EXACT),     # PP pairs inside leaf groups, DP rings over spines at 4:1
    (4, 1, 2, 2, 1, 2, 2, 8, 8, EXACT),     # one host per leaf: every DP ring crosses the spines
    (4, 3, 2, 2, 2, 8, 2, 2, 8, EXACT),     # replica 0's PP pair stays in a leaf group, replica 1's crosses it
    (4, 2, 2, 2, 4, 8, 2, 2, 4, EXACT),     # two GPUs per NIC: lanes hash apart, their rings timed alone agree
    (6, 2, 3, 2, 4, 8, 3, 2, 8, PP_ROUTES),  # 3-host replicas on 2-host leaf groups: folded 0.70% slow
    (8, 4, 2, 3, 2, 4, 4, 4, 8, EXACT),     # cross-rail PP pairs over 3:1 spine links
])
def test_folded_and_unfolded_agree_on_small_fabrics(run_yaml, nodes, leaf_ports, spines, oversubscription, channels,
                                                    tp, pp, dp, nics, rel):
    folded, unfolded = _folded_and_unfolded(
        run_yaml, f"cluster.nodes={nodes}", f"cluster.leaf_ports={leaf_ports}", f"cluster.spines={spines}",
        f"cluster.oversubscription={oversubscription}", f"cluster.nics_per_node={nics}",
        f"collectives.channels={channels}", f"parallelism.tp={tp}", f"parallelism.pp={pp}", f"parallelism.dp={dp}")
    assert folded["folded"] and "fold_off_reason" not in folded
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=rel)


CP_FABRIC = """
cluster: {topology: dgx-h100-cluster, spines: 2, oversubscription: 2}
model: {layers: 8, hidden: 2048, heads: 16, kv_heads: 4, vocab: 32000}
training: {seq_len: 16384, microbatches: 4, precision: bf16}
parallelism: {order: [tp, cp, pp, dp], sequence_parallel: true}
"""


@pytest.mark.parametrize("algorithm", ["ring", "all_gather"])
@pytest.mark.parametrize("nodes, leaf_ports, tp, cp, pp, dp", [
    (4, 2, 8, 2, 1, 2),  # CP pairs inside leaf groups, DP rings over the 2:1 spines
    (4, 2, 4, 4, 1, 2),  # two TP lanes per host: CP rings of both lanes share the hosts' NICs and uplinks
    (4, 1, 8, 4, 1, 1),  # one host per leaf: every K/V hop crosses the spines
    (4, 2, 8, 2, 2, 1),  # pipeline sends from every CP rank share the NICs of the K/V exchange
    (8, 4, 8, 4, 2, 1),  # CP rings of both stages in one leaf group, sends over the spines
])
def test_cp_ranks_fold_exactly(run_yaml, algorithm, nodes, leaf_ports, tp, cp, pp, dp):
    """One rank per stage stands for its CP peers (causal load balancing gives them equal work, their K/V
    rings and sends are mirrors of the simulated ones): the folded step is the unfolded one, for ring attention
    and for the all-gather of K/V."""
    overrides = (f"cluster.nodes={nodes}", f"cluster.leaf_ports={leaf_ports}", f"parallelism.tp={tp}",
                 f"parallelism.cp={cp}", f"parallelism.pp={pp}", f"parallelism.dp={dp}",
                 f"parallelism.cp_algorithm={algorithm}")
    folded = run_yaml(CP_FABRIC, *overrides).summary
    unfolded = run_yaml(CP_FABRIC, *overrides, "run.fold=false").summary
    assert folded["folded"] and "fold_off_reason" not in folded
    assert folded["simulated_ranks"] == pp
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=EXACT)


def test_cp_all_gather_over_two_replicas_on_an_oversubscribed_fabric_folds_exactly(run_yaml):
    """8 hosts, 2 per leaf, 2:1 spines, TP 4 x CP 4 x PP 2 x DP 2 with all-gather CP: under a spine hash of the
    host pair the second replica's flows met the spines otherwise than the first's and the folded step was
    0.44% slow; hashing the source's place in its leaf group and the destination's offset makes the replicas
    images of each other, and the folded step is the unfolded one."""
    overrides = ("cluster.nodes=8", "cluster.leaf_ports=2", "parallelism.tp=4", "parallelism.cp=4",
                 "parallelism.pp=2", "parallelism.dp=2", "parallelism.cp_algorithm=all_gather")
    folded = run_yaml(CP_FABRIC, *overrides).summary
    unfolded = run_yaml(CP_FABRIC, *overrides, "run.fold=false").summary
    assert folded["folded"] and "fold_off_reason" not in folded
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=EXACT)


@pytest.mark.parametrize("batch_transfers", [symmetry.BATCH_TRANSFERS, 1])
def test_lanes_sharing_a_nic_whose_rings_meet_the_uplinks_unevenly_unfold(run_yaml, monkeypatch, batch_transfers):
    """Two GPUs per NIC, two channels: one lane's two crossing flows hash onto one 2:1 spine uplink, the other
    lane's onto two, so their DP rings take 1.26 and 0.64 ms alone; folding is switched off, with the reason,
    also when the mirrors' route shapes are worked out one mirror per pass."""
    monkeypatch.setattr(symmetry, "BATCH_TRANSFERS", batch_transfers)
    folded, unfolded = _folded_and_unfolded(
        run_yaml, "cluster.nics_per_node=4", "collectives.channels=2", "parallelism.pp=2", "parallelism.dp=2")
    assert not folded["folded"]
    assert "share the fabric's links unevenly" in folded["fold_off_reason"]
    assert folded["step_time_s"] == unfolded["step_time_s"]
