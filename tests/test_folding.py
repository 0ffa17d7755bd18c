"""Rank folding: representatives and mirror groups on a small layout, checked by hand, and folded steps
against unfolded ones on small oversubscribed leaf/spine fabrics (equal to 1e-9, or folding off with why)."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import replace
from types import SimpleNamespace
from typing import get_args

import pytest
from shared import (
    CP_FABRIC_TEMPLATE,
    EXACT,
    NCCL_SIMPLE_BASE_S,
    SCENARIOS,
    TWO_REPLICAS_PER_RACK,
    assert_same_figures,
    refused_unfolded,
)

from simulator.collector import collector_paused
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.console.report import folding_text, format_seconds
from simulator.engine import fold_policy, symmetry
from simulator.engine.engine import Engine, EngineResult
from simulator.faults.step import StepFaultPlan
from simulator.network.model import effective_capacity
from simulator.parallel.experts import ep_group, expert_dp_group, group_images
from simulator.parallel.folding import RankClasses, class_images, mirror_images, representatives, unlike_images
from simulator.parallel.layout import Layout
from simulator.parallel.program import ProgramBuilder
from simulator.program.ops import CollectiveOp
from simulator.program.unfolding import FoldCheck, Unfolding
from simulator.simulation import (
    network_settings,
    plan_cache,
    prepare_training,
    program_sharing,
    run_step,
    simulate,
    step_program,
)
from simulator.topology.loader import scenario_topology
from simulator.units import counted

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
    """mirror_images of a group of whole dimensions spelt out rank by rank: each equivalent rank shifts every
    member's TP, CP and DP coordinates cyclically by its offset from the group's first member; an image already
    seen (as a set), or the group itself, is left out."""
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


def _block(layout: Layout, rank: int, size: int) -> tuple[int, ...]:
    """``rank``'s block of ``size`` consecutive members of its DP x CP group (an HSDP shard group, an EP group)."""
    combined = layout.combined_group(("dp", "cp"), rank)
    start = combined.index(rank) // size * size
    return combined[start:start + size]


def _stride(layout: Layout, rank: int, step: int) -> tuple[int, ...]:
    """``rank``'s every ``step``-th member of its DP x CP group (an HSDP replica group, an expert-DP group)."""
    combined = layout.combined_group(("dp", "cp"), rank)
    return combined[combined.index(rank) % step::step]


def _slice_images_by_definition(layout: Layout, rank: int, slice_of) -> tuple[tuple[int, ...], ...]:
    """mirror_images of ``rank``'s slice of its DP x CP group spelt out rank by rank: every rank of its stage
    runs the collective in its own slice of the same kind; each slice once, in rank order, the group's own left
    out."""
    seen, images = {slice_of(rank)}, []
    for other in layout.stage_ranks(layout.coords(rank)["pp"]):
        image = slice_of(other)
        if image not in seen:
            seen.add(image)
            images.append(image)
    return tuple(images)


@pytest.mark.parametrize("order", [("tp", "cp", "pp", "dp"), ("dp", "tp", "cp", "pp"), ("cp", "pp", "dp", "tp")])
def test_mirror_images_follow_their_definition(order):
    """Every kind of group the builder folds: TP, CP, DP, pipeline pairs, the DP x CP group (shifted
    cyclically), and slices of it (blocks: shard and EP groups; strides: replica and expert-DP groups, listed
    per rank, also where a slice is a whole CP or DP group), on a layout of unequal degrees in three orders."""
    layout = Layout(tp=2, cp=3, pp=2, dp=4, order=order)
    for rank in range(0, layout.world, 5):
        groups = [layout.group(dim, rank) for dim in ("tp", "cp", "dp", "pp")]
        groups += [layout.combined_group(("dp", "cp"), rank), (rank, layout.group("pp", rank)[-1])]
        for group in groups:
            assert mirror_images(layout, group) == _images_by_definition(layout, group), (rank, group)
        for size in (2, 3, 4, 6):
            for slice_of in (lambda r, size=size: _block(layout, r, size),
                             lambda r, size=size: _stride(layout, r, 12 // size)):
                assert mirror_images(layout, slice_of(rank)) == _slice_images_by_definition(layout, rank, slice_of), \
                    (rank, slice_of(rank))


def test_hsdp_shard_and_replica_groups_mirror_onto_whole_blocks():
    """The HSDP case of the review (two 8-GPU hosts, PP 2 x DP 8, rank = pp + 2 dp, shards of 4 DP ranks per
    host): stage 1's shard group has one image, the other host's shard group (cyclic shifts over DP made
    images such as (5, 7, 9, 11) that straddle both hosts); its replica group has the other three pairs of
    like-placed ranks. With TP 2 x DP 4 and shards of 2: the other lane's, then the next block's."""
    layout = Layout(pp=2, dp=8)
    assert mirror_images(layout, (1, 3, 5, 7)) == ((9, 11, 13, 15),)
    assert mirror_images(layout, (9, 11, 13, 15)) == ((1, 3, 5, 7),)
    assert mirror_images(layout, (1, 9)) == ((3, 11), (5, 13), (7, 15))
    layout = Layout(tp=2, dp=4)
    assert mirror_images(layout, (0, 2)) == ((1, 3), (4, 6), (5, 7))
    assert mirror_images(layout, (0, 4)) == ((1, 5), (2, 6), (3, 7))


def _builder_groups(layout: Layout, stage: int) -> dict[str, object]:
    """Every group kind the program builder makes on ``stage``, as functions of a rank, made by the builder's
    own code: TP, CP, DP and DP x CP groups, pipeline pairs to and from every other stage, and for each divisor
    of DP x CP the shard and replica groups (ProgramBuilder, HSDP) and the EP and expert-DP groups (experts)."""
    kinds: dict[str, object] = {dim: lambda r, dim=dim: layout.group(dim, r) for dim in ("tp", "cp", "dp")}
    kinds["dp x cp"] = lambda r: layout.combined_group(("dp", "cp"), r)
    for other in range(layout.pp):
        if other != stage:
            shift = (other - stage) * layout.stride("pp")
            kinds[f"send to {other}"] = lambda r, shift=shift: (r, r + shift)
            kinds[f"receive from {other}"] = lambda r, shift=shift: (r + shift, r)
    size = layout.dp * layout.cp
    for degree in (d for d in range(1, size + 1) if size % d == 0):
        builder = ProgramBuilder(SimpleNamespace(layout=layout, sharding=SimpleNamespace(degree=degree)), fold=True)
        kinds[f"shard {degree}"] = builder._shard_group
        if degree < size:
            kinds[f"replica {degree}"] = builder._replica_group
        kinds[f"ep {degree}"] = lambda r, degree=degree: ep_group(layout, r, degree)
        kinds[f"expert dp {degree}"] = lambda r, degree=degree: expert_dp_group(layout, r, degree)
    return kinds


@pytest.mark.parametrize("order", list(itertools.permutations(("tp", "cp", "pp", "dp"))))
def test_mirror_images_are_the_groups_the_builder_makes(order):
    """For every placement order, each stage's first rank's group of every kind the builder makes: its mirror
    images are exactly the groups of that kind the stage's other ranks run (first occurrence in rank order,
    members in the builder's order, the group itself left out). An expert-DP group spans TP as well, so its
    images are the ones the builder asks for (experts.group_images). A cut-down of the review's exhaustive
    check."""
    layout = Layout(tp=2, cp=2, pp=2, dp=3, order=order)
    for stage in range(layout.pp):
        ranks = layout.stage_ranks(stage)
        for kind, make in _builder_groups(layout, stage).items():
            own = make(ranks[0])
            seen, wanted = {own}, []
            for rank in ranks:
                group = make(rank)
                if group not in seen:
                    seen.add(group)
                    wanted.append(group)
            images = (group_images(layout, ranks[0], int(kind.split()[-1]), expert_dp=True)
                      if kind.startswith("expert dp") else mirror_images(layout, own))
            assert images == tuple(wanted), (stage, kind, own)


def test_a_subset_of_the_dp_group_that_is_no_slice_has_no_images():
    with pytest.raises(ValueError, match="neither whole dimensions nor a block or stride slice"):
        mirror_images(Layout(pp=2, dp=8), (1, 3, 5))


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
    """SMALL_FABRIC with ``overrides`` folded and unfolded, its collectives under Simple (the figures below)."""
    overrides = ("collectives.protocol=simple", *overrides)
    return run_yaml(SMALL_FABRIC, *overrides).summary, run_yaml(SMALL_FABRIC, *overrides, "run.fold=false").summary


@pytest.mark.parametrize("nodes, leaf_ports, spines, oversubscription, channels, tp, pp, dp, nics, ranks", [
    (4, 2, 2, 2, 2, 4, 1, 8, 8, 1),  # TP 4: two replicas per host, DP rings over the spines
    (8, 2, 4, 4, 2, 8, 2, 4, 8, 2),  # PP pairs inside leaf groups, DP rings over spines at 4:1
    (4, 1, 2, 2, 1, 2, 2, 8, 8, 4),  # one host per leaf: every DP ring crosses the spines
    (4, 3, 2, 2, 2, 8, 2, 2, 8, 4),  # replica 0's PP pair stays in a leaf group, replica 1's crosses it:
                                     # their copies end apart, each replica simulated apart
    (4, 2, 2, 2, 4, 8, 2, 2, 4, 2),  # two GPUs per NIC: lanes hash apart, their rings timed alone agree
    (6, 2, 3, 2, 4, 8, 3, 2, 8, 6),  # 3-host replicas on 2-host leaf groups: each replica simulated apart
])
def test_folded_and_unfolded_agree_on_small_fabrics(run_yaml, nodes, leaf_ports, spines, oversubscription, channels,
                                                    tp, pp, dp, nics, ranks):
    """The last case hands stage 1 on to stage 2 inside a leaf group in replica 0 and across the spines in
    replica 1: folded by stage, the step came out 0.55% slow (reported exact while a hand-off's mirrors over
    other hops were not compared); its copies end apart in that run, and the step folds again with the
    replicas' hosts classed by their hand-offs' hops (`fold_policy.route_steps`), one rank per stage and
    replica, exactly. So does the fourth, whose folded step was exact (its hand-offs ended with the crossing
    copy) but held replica 0's ranks to replica 1's hand-offs."""
    folded, unfolded = _folded_and_unfolded(
        run_yaml, f"cluster.nodes={nodes}", f"cluster.leaf_ports={leaf_ports}", f"cluster.spines={spines}",
        f"cluster.oversubscription={oversubscription}", f"cluster.nics_per_node={nics}",
        f"collectives.channels={channels}", f"parallelism.tp={tp}", f"parallelism.pp={pp}", f"parallelism.dp={dp}")
    assert folded["folded"] and folded["simulated_ranks"] == ranks and "fold_off_reason" not in folded
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=EXACT)


LEAF_GROUPS_OF_THREE = """
cluster: {topology: dgx-h100-cluster, nodes: 6, leaf_ports: 3}
model: {layers: 16, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 2048, microbatches: 8}
run: {timeline: summary}
"""
"""Six DGX H100 hosts in leaf groups of three, replicas of two hosts (dp 3, the middle one straddling both
groups). A hand-off between hosts leaves its rail (stage 7 on GPU 7 to stage 8 on GPU 8 of the next host), so
it crosses a spine (16, each leaf's uplink 9.375 GB/s) in every replica, over the same hops; but two replicas'
hand-offs hash onto one spine link where the third's is alone, and take twice as long (tp 2, pp 8: replicas 1
and 2 onto one spine's downlinks into the second group's leaves; tp 1, pp 16: replicas 0 and 1 onto one
spine's uplink out of the first group's rail-7 leaf). Those two copies met only each other, so the folded send
was replayed without them, and the folded step came out 0.79% fast with tp 2, pp 8 and 1.16% fast with tp 1,
pp 16 (81.11 against 82.06 ms), reported exact."""


@pytest.mark.parametrize("tp, pp, ranks", [(2, 8, 16), (1, 16, 32)])
def test_hand_offs_whose_copies_meet_one_another_fold_by_route_class(run_yaml, tp, pp, ranks):
    """The copies of a collective that share a link with one another are never replayed without them
    (`lockstep.copies_apart`), so the folded run's forward sends end on the two replicas that share a spine link
    after the third's (tp 1: 5.55 against 4.60 ms), and the step folds again with its hosts classed by their
    hand-offs' route loads: the replica alone on its link apart from the two, which meet the same loads (classes of
    unequal size, each representative weighed by how many ranks it stands for), the TP lanes still folded with tp 2;
    that is the unfolded step."""
    overrides = (f"parallelism.tp={tp}", f"parallelism.pp={pp}", "parallelism.dp=3")
    folded = run_yaml(LEAF_GROUPS_OF_THREE, *overrides).summary
    unfolded = run_yaml(LEAF_GROUPS_OF_THREE, *overrides, "run.fold=false").summary
    assert folded["folded"] and folded["simulated_ranks"] == ranks and "fold_not_exact" not in folded
    assert "fold_off_reason" not in folded
    assert folded["fold_routes_reason"].startswith("send_recv 'send fwd mb0' over GPUs")
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=EXACT)
    for kind, seconds in unfolded["exposed_comm_s"].items():
        assert folded["exposed_comm_s"][kind] == pytest.approx(seconds, rel=EXACT, abs=1e-15)
    assert folded["bubble_fraction"] == pytest.approx(unfolded["bubble_fraction"], rel=EXACT)
    # the schedule's own bubble too: each virtual stage's pass times are the mean over its ranks, weighed by the
    # ranks each representative stands for
    assert folded["schedule_bubble_fraction"] == pytest.approx(unfolded["schedule_bubble_fraction"], rel=EXACT)


def test_hand_offs_whose_mirrors_fall_out_of_step_fold_by_route_class(run_yaml):
    """Cross-rail PP pairs over 3:1 spine links (8 hosts, 4 per leaf group, 3 spines, TP 4 x PP 4 x DP 4): the hand-offs
    of the lanes of a stage meet the DP rings of the rails they leave and enter unlike, so in the folded run the
    backward receive of micro-batch 3 on the representative's mirrors ends between 8.279 ms and 8.313 ms. The folded
    run's mirrors are checked to keep pace with their groups (engine/lockstep.py), and the step runs again with its
    ranks classed also by the loads their hand-offs meet on their routes (two representatives per stage, 8 of 32
    ranks), which is the unfolded run. (On 2 spines the fabric's hash, which reads the rails a flow turns between,
    gives the hand-offs alike loads, and the stage folds as it is.)"""
    folded, unfolded = _folded_and_unfolded(
        run_yaml, "cluster.nodes=8", "cluster.leaf_ports=4", "cluster.spines=3", "cluster.oversubscription=3",
        "parallelism.tp=4", "parallelism.pp=4", "parallelism.dp=4")
    assert folded["folded"] and folded["simulated_ranks"] == 8 and "fold_off_reason" not in folded
    assert folded["fold_routes_reason"].startswith(
        "send_recv 'recv bwd mb3' over GPUs [8, 4] ended on its mirrors between 8.279 ms and 8.313 ms")
    assert folded["step_time_s"] == unfolded["step_time_s"]
    for kind, seconds in unfolded["exposed_comm_s"].items():
        assert folded["exposed_comm_s"][kind] == pytest.approx(seconds, rel=EXACT, abs=1e-15)


STOPPED_OUT_OF_STEP = {
    "stage-fold-hand-off": (SMALL_FABRIC, ["collectives.protocol=simple", "cluster.nodes=8", "cluster.leaf_ports=4",
                                           "cluster.spines=3", "cluster.oversubscription=3", "parallelism.tp=4",
                                           "parallelism.pp=4", "parallelism.dp=4"], "stage"),
}
"""A stage fold whose run falls out of step at a hand-off (then refolded by route class: the test above). The
class fold of Mixtral EP 8 on 16 nodes fell out of step at an EP all-to-all too while it ran as p - 1 phases; sent
to every peer at once, as NCCL sends it, it keeps pace (`test_mixtral_ep_across_leaf_groups_folds_exactly`)."""


@pytest.mark.parametrize("case", STOPPED_OUT_OF_STEP)
def test_a_fold_given_up_for_its_run_out_of_step_stops_that_run_at_its_first_instance_out_of_step(
        monkeypatch, run_yaml, case):
    """A fold whose run falls out of step is given up, so that run stops at the end of its first instance out of
    step (engine/lockstep.py `LockstepWatch`): it executes part of its program, its `fold_given_up` entry gives
    that instance's own gap and when the run stopped, before the step's end, not a whole run's count; the run
    that stands executes every op and its figures are the unfolded run's (the DeepSeek-V3-style DualPipeV step at
    global batch 2048 stops its class fold's run 2.283 s into the 8.067 s step, not at its end)."""
    text, overrides, fold = STOPPED_OUT_OF_STEP[case]
    runs: list[tuple[int, int]] = []
    run = Engine.run

    def counted(engine: Engine, ops) -> EngineResult:
        ops = list(ops)
        result = run(engine, ops)
        runs.append((result.ops_executed, len(ops)))
        return result

    monkeypatch.setattr(Engine, "run", counted)
    folded = run_yaml(text, *overrides).summary
    monkeypatch.setattr(Engine, "run", run)
    unfolded = run_yaml(text, *overrides, "run.fold=false").summary
    (entry,) = [entry for entry in folded["fold_given_up"] if "out_of_step" in entry]
    found = entry["out_of_step"]
    assert entry["fold"] == fold and "instances" not in found
    assert found["stopped_at_s"] == found["ended_s"][1] < folded["step_time_s"]
    assert found["widest_s"] == found["ended_s"][1] - found["ended_s"][0] > 0
    assert [executed < ops for executed, ops in runs] == [True, False]
    assert folded["step_time_s"] == unfolded["step_time_s"]
    for kind, seconds in unfolded["exposed_comm_s"].items():
        assert folded["exposed_comm_s"][kind] == pytest.approx(seconds, rel=EXACT, abs=1e-15)
    assert folded["bubble_fraction"] == pytest.approx(unfolded["bubble_fraction"], rel=EXACT)


@pytest.mark.parametrize("case", STOPPED_OUT_OF_STEP)
def test_a_run_stopped_out_of_step_is_freed_with_the_collector_paused(monkeypatch, run_yaml, case):
    """A run the watch stops leaves no suspended generator behind that holds its engine, so its engine, network and
    event log are freed by reference counting while the cyclic collector is paused (as it is for a whole
    `simulate()`, simulator/collector.py)."""
    stopped: list[tuple[weakref.ref, weakref.ref, weakref.ref]] = []
    run = Engine.run

    def kept(engine: Engine, ops) -> EngineResult:
        result = run(engine, ops)
        if result.stopped_at_s is not None:
            network = engine.run_plan.__self__.network  # the plan runner's
            stopped.append((weakref.ref(engine), weakref.ref(engine.log), weakref.ref(network)))
        return result

    monkeypatch.setattr(Engine, "run", kept)
    text, overrides, _fold = STOPPED_OUT_OF_STEP[case]
    with collector_paused():
        run_yaml(text, *overrides)
        assert stopped and all(ref() is None for refs in stopped for ref in refs)


CROSS_RAIL_UNFOLDED = {
    "ep16-five-spines": (
        "mixtral-8x7b-ep8", ["model.layers=4", "model.moe.experts=16", "cluster.nodes=8", "cluster.leaf_ports=4",
                             "cluster.spines=5", "parallelism.tp=1", "parallelism.ep=16", "parallelism.dp=64",
                             "training.global_batch=64", "network.pxn=false"], 64,
        "all_to_all 'ep dispatch L0.mlp' takes 924.1 us over GPUs [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, "
        "14, 15] but 913.8 us over the equivalent [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]"),
}
"""Layouts whose copies meet unlike contention on flows that turn rails between hosts over the spines (without PXN,
whose relays keep an EP group's cross-rail flows on their rails), so they run unfolded: not because a check misses
a symmetry, but because those flows spread over the spines by the rails' difference
(topology/builders.py `Fabric`), each drawn as ECMP draws it. Two EP groups of one leaf group then collide on
other spine links and end their all-to-alls apart (EP 16 over 5 spines: 0.9241 against 0.9138 ms, each with the
grouped kernel's 8.4 us base latency, found before the run; 2.286 against 2.381 ms while an all-to-all ran as
p - 1 phases)."""


def test_dp_rings_over_a_partial_host_keep_their_mirrors_in_step():
    """TP 1 x PP 2 x DP 12 on 3 DGX H100 with DP inside PP: each DP ring spans a whole host and half of another. Rings
    enter and leave the partial host at indices every host holds, in turn per channel, so its NICs run both ways: the
    step folds to 2 ranks and equals the unfolded step to the bit (130.95 ms). Rings entering and leaving the partial
    host at one GPU each would run each NIC there one way, the hand-offs from one host to the next over other rails
    (GPUs 20 to 8 and 21 to 9) would meet those rings unlike (93.2 against 93.91 ms), and the step would run unfolded
    at 156.62 ms."""
    overrides = ["model.layers=4", "cluster.topology=dgx-h100-cluster", "cluster.nodes=3", "parallelism.tp=1",
                 "parallelism.pp=2", "parallelism.dp=12", "parallelism.order=[tp,cp,dp,pp]", "training.global_batch=24"]
    folded = simulate(load_scenario(SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml", overrides)).summary
    unfolded = simulate(load_scenario(SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml",
                                      [*overrides, "run.fold=false"])).summary
    assert (folded["folded"], folded["simulated_ranks"]) == (True, 2)
    assert folded["step_time_s"] == unfolded["step_time_s"] == pytest.approx(0.13095, rel=1e-4)


@pytest.mark.parametrize("case", CROSS_RAIL_UNFOLDED)
def test_cross_rail_contention_unlike_between_lanes_or_groups_runs_unfolded(case):
    name, overrides, ranks, reason = CROSS_RAIL_UNFOLDED[case]
    folded = simulate(load_scenario(SCENARIOS / f"{name}.yaml", overrides)).summary
    unfolded = simulate(load_scenario(SCENARIOS / f"{name}.yaml", [*overrides, "run.fold=false"])).summary
    assert not folded["folded"] and folded["simulated_ranks"] == ranks
    assert folded["fold_off_reason"].startswith(reason)
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert folded["flows_simulated"] == unfolded["flows_simulated"]


def test_mixtral_ep_across_leaf_groups_folds_exactly():
    """Mixtral EP 8 on 16 nodes (layers 4): its EP groups' all-to-alls, sent to every peer at once as NCCL sends them,
    keep pace with their mirrors, so the step folds to 2 ranks and equals the unfolded step to the bit."""
    overrides = ["model.layers=4", "cluster.nodes=16", "training.global_batch=256"]
    folded = simulate(load_scenario(SCENARIOS / "mixtral-8x7b-ep8.yaml", overrides)).summary
    unfolded = simulate(load_scenario(SCENARIOS / "mixtral-8x7b-ep8.yaml", [*overrides, "run.fold=false"])).summary
    assert folded["folded"] and folded["simulated_ranks"] == 2 and "fold_given_up" not in folded
    assert folded["step_time_s"] == unfolded["step_time_s"]


TWO_PER_NIC = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 1, spines: 3, nics_per_node: 4}
collectives: {channels: 2}
model: {layers: 8, hidden: 2048, heads: 16, kv_heads: 4, vocab: 32000}
training: {seq_len: 2048, microbatches: 4}
parallelism: {tp: 2, cp: 2, dp: 8, order: [dp, tp, cp, pp]}
"""
"""Two GPUs per NIC, one host per leaf, three spines (each uplink a third of a NIC), DP innermost: a DP group is
a host's eight GPUs, its DP x CP gradient reduction leaves the host from every lane to the CP peer's host, and
the TP all-reduces cross hosts too (TP pairs 0-8, 1-9, ...)."""


DEEPSEEK_DUALPIPEV = ("training.global_batch=2048", "parallelism.pipeline.schedule=dualpipev",
                      "parallelism.pipeline.virtual_stages=2")
"""The bundled DeepSeek-V3-style scenario (PP 16 x DP 64 on 128 DGX H100, leaf groups of 32 hosts, so every stage
is 8 hosts and stages 7 | 8 and 11 | 12 meet across the spines) under DualPipeV at global batch 2048: its class
fold (32 ranks) falls out of step at a hand-off and the step refolds by route class to 112 ranks."""


def test_deepseek_dualpipev_hand_off_copies_meet_on_one_spine_uplink():
    """Why the class fold falls out of step there ('recv bwd mb0' over GPUs [512, 448]): a real asymmetry of the
    fabric's per-flow spine hash, not a fold bug. Stage 8's backward hand-offs into stage 7 leave leaf group 2 on
    each host's rail; hosts 0 and 5 of the stage (GPUs 512 and 552) hash onto spine 10, host 2 (GPU 528, the same
    NVLink class as host 0) onto spine 9 alone, and stage 11's forward hand-off into stage 12 from its host 6 (GPU
    752) climbs the same leaf's uplink to spine 10. That uplink carries two NICs' worth (100 GB/s against 50), so
    two copies pass at full rate and the third flow, when DualPipeV's slots make it overlap them, slows all three,
    so in the folded run GPU 512's copy ends after GPU 528's."""
    loaded = load_scenario(SCENARIOS / "deepseek-v3-style-1024-gpus.yaml", list(DEEPSEEK_DUALPIPEV))
    topology = scenario_topology(loaded)

    def uplink(src: int, dst: int) -> tuple[str, str]:
        return next(topology.link_ends[link] for link in topology.path(src, dst)
                    if topology.link_ends[link][1].startswith("spine"))

    assert uplink(512, 448) == uplink(552, 488) == uplink(752, 816) == ("leaf2.r0", "spine10")
    assert uplink(528, 464) == ("leaf2.r0", "spine9")
    nic, spine = (topology.link_bandwidth[topology.link_index[edge]] for edge in
                  (("h64/nic0", "leaf2.r0"), ("leaf2.r0", "spine10")))
    assert spine == 2 * nic


def test_a_later_run_of_an_order_gets_the_sharing_its_first_run_found(monkeypatch):
    """`program_sharing` analyses an order once per plan cache: a second call on the same order (a job's next
    straggler state) finds the first's mirrors (the same read-only mapping) and its private collectives, kept
    as an array, back as an equal set, without running the analysis again."""
    from simulator import simulation

    loaded = load_scenario(SCENARIOS / "megatron-sc21-18.4b.yaml")
    prepared = prepare_training(loaded, scenario_topology(loaded), StepFaultPlan())
    step, analysed = prepared.step, []
    private_collectives = simulation.private_collectives
    monkeypatch.setattr(simulation, "private_collectives",
                        lambda *args, **kwargs: analysed.append(None) or private_collectives(*args, **kwargs))

    def sharing() -> tuple:
        return program_sharing(step.program.ops, prepared.plans, step.program.async_streams, step.shapes,
                               step.order, replays=True)

    first_mirrors, first_private = sharing()
    again_mirrors, again_private = sharing()
    assert len(analysed) == 1 and len(first_private) == 1089
    assert again_mirrors is first_mirrors
    assert isinstance(again_private, frozenset) and again_private == first_private


def test_deepseek_dualpipev_refold_by_route_class_is_ordered():
    """The refold to 112 ranks has 254,639 ops on 336 in-order streams, 2^26.35 clock entries: ordered, 82,211 of its
    112,833 collectives are private (engine/sharing.py) and its EP all-to-alls among them replayed, and the refold's
    run is the same step as unordered (8.0866 s, within float rounding of the replays). Unordered (as under a cap of
    2^26 entries) none would be private, the EP all-to-alls would run on the network with their mirrors, and the
    whole `trainsim run` would take 100 s against 31 s (8 s for 1F1B). Pinned: the collective ops found private and
    the EP all-to-alls among them, which the ordering's presence alone does not say."""
    loaded = load_scenario(SCENARIOS / "deepseek-v3-style-1024-gpus.yaml", list(DEEPSEEK_DUALPIPEV))
    prepared = prepare_training(loaded, scenario_topology(loaded), StepFaultPlan())
    assert (prepared.step.kind, len(prepared.step.program.ranks)) == ("classes", 32)
    settings = prepared.settings
    refold = next(step for step in fold_policy.route_steps(prepared.build, prepared.step, prepared.plans,
                                                           settings.mode, dict(settings.efficiency), StepFaultPlan())
                  if isinstance(step, fold_policy.FoldedStep))
    assert len(refold.program.ranks) == 112
    assert refold.order.ordering is not None
    ops = refold.program.ops
    _, private = program_sharing(ops, prepared.plans, refold.program.async_streams, refold.shapes, refold.order,
                                 replays=True)
    collectives = [op for op in ops if isinstance(op, CollectiveOp)]
    all_to_alls = sum(op.op == "all_to_all" for op in collectives if op.id in private)
    assert (len(private), all_to_alls, len(collectives)) == (82_211, 79_716, 112_833)


def test_lanes_meeting_another_collective_unevenly_on_the_spines_unfold(run_yaml):
    """The blind spot of the checks before the run: each collective's mirrors alone meet the links as its group does,
    but the DP x CP reduction's flows out of lanes 6 and 7 (one NIC) hash onto one spine uplink where those of lanes
    0 and 1 take two, and the TP all-reduce of the head's backward crosses that uplink on lanes 6 and 7, so lanes 6-7
    end it after lanes 0-5 unfolded; folded, the representative (lane 0) waits for its mirror on lane 6 and the
    folded step comes out short. The folded run's mirrors fall out of step with their groups, so it runs unfolded
    (the step 78.1163 ms, the CP pair's K/V exchange a point-to-point transfer). With `nvls` across DGX hosts, which
    runs NCCL's tree over each host's heads, whose inner ranks and leaves send unlike amounts, the check before the
    run finds the stage's ranks unlike, so this scenario does not reach the blind spot there."""
    folded = run_yaml(TWO_PER_NIC, "collectives.protocol=simple").summary
    unfolded = run_yaml(TWO_PER_NIC, "collectives.protocol=simple", "run.fold=false").summary
    assert unfolded["step_time_s"] == pytest.approx(0.0781163, abs=1e-7)
    assert not folded["folded"] and "a tree's inner ranks and leaves" in folded["fold_off_reason"]
    assert folded["step_time_s"] == unfolded["step_time_s"]


ONE_NIC = """
cluster: {topology: dgx-h100-cluster, nodes: 2, leaf_ports: 1, spines: 4, oversubscription: 4, nics_per_node: 1}
collectives: {channels: 4}
model: {layers: 8, hidden: 2048, heads: 16, kv_heads: 4, vocab: 32000}
training: {seq_len: 2048, microbatches: 4}
parallelism: {tp: 2, pp: 4, dp: 2, order: [tp, dp, cp, pp], sequence_parallel: true}
"""


def test_hand_offs_sharing_a_nic_that_hash_onto_one_uplink_unfold(run_yaml):
    """Eight GPUs on one NIC, four spines at 4:1 (each uplink a sixteenth of the NIC): stage 1 (GPUs 4-7) hands
    on to stage 2 (8-11) over the fabric, the four lanes' flows hashed from their places on the NIC; some share
    an uplink, so folded the representative's hand-off waited for its slowest mirror and the folded step was
    5.8% long. The pairs all take the same hops, so their mirrors are held to keep pace, and the step unfolds
    (it is small enough to run unfolded)."""
    folded = run_yaml(ONE_NIC).summary
    unfolded = run_yaml(ONE_NIC, "run.fold=false").summary
    assert not folded["folded"] and folded["fold_off_reason"].startswith("send_recv")
    assert folded["step_time_s"] == unfolded["step_time_s"]


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
    and for the all-gather of K/V. DP runs rings, as the cases say (`auto` takes NCCL's tree for the first
    case's DP buckets, whose mirrors meet the K/V rings unlike the simulated copy's: its lockstep check unfolds
    the step)."""
    overrides = (f"cluster.nodes={nodes}", f"cluster.leaf_ports={leaf_ports}", f"parallelism.tp={tp}",
                 f"parallelism.cp={cp}", f"parallelism.pp={pp}", f"parallelism.dp={dp}",
                 f"parallelism.cp_algorithm={algorithm}", "collectives.algorithm=ring")
    folded = run_yaml(CP_FABRIC_TEMPLATE, *overrides).summary
    unfolded = run_yaml(CP_FABRIC_TEMPLATE, *overrides, "run.fold=false").summary
    assert folded["folded"] and "fold_off_reason" not in folded
    assert folded["simulated_ranks"] == pp
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=EXACT)


def test_cp_all_gather_over_two_replicas_on_an_oversubscribed_fabric_folds_by_lane_for_its_hand_offs(run_yaml):
    """8 hosts, 2 per leaf, 2:1 spines, TP 4 x CP 4 x PP 2 x DP 2 with all-gather CP: under a spine hash of the
    host pair the second replica's flows met the spines otherwise than the first's and the folded step was
    0.44% slow; hashing the source's place in its leaf group and the destination's offset makes the replicas
    images of each other, and the folded step was the unfolded one. But the lanes' pipeline hand-offs meet the
    K/V all-gathers' cross-leaf flows unevenly: the backward receive of micro-batch 3 ended on the mirrors
    between 37.83 ms and 38.00 ms (37.47 and 37.65 since `nvls` across hosts runs NCCL's tree over heads), so the
    stage-folded run (step equal to the bit) reported 1.904 ms of exposed pipeline communication per GPU against
    the unfolded 1.815 (measured before that change). The step runs again with one rank per CP lane
    (classes keyed by CP lane: 2 stages x 4 lanes), whose mirrors keep pace, and gives the unfolded figures; it
    runs before route classes since the stage fold's copies of each lane ended together (only the lanes apart)."""
    overrides = ("cluster.nodes=8", "cluster.leaf_ports=2", "parallelism.tp=4", "parallelism.cp=4",
                 "parallelism.pp=2", "parallelism.dp=2", "parallelism.cp_algorithm=all_gather",
                 "collectives.protocol=simple")
    folded = run_yaml(CP_FABRIC_TEMPLATE, *overrides).summary
    unfolded = run_yaml(CP_FABRIC_TEMPLATE, *overrides, "run.fold=false").summary
    assert folded["folded"] and folded["simulated_ranks"] == 8 and "fold_off_reason" not in folded
    assert folded["fold_lanes_reason"].startswith("send_recv 'recv bwd mb3' over GPUs [16, 0] ended on its mirrors "
                                                  "between 37.47 ms and 37.65 ms")
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert folded["exposed_comm_s"] == pytest.approx(unfolded["exposed_comm_s"], rel=1e-12)
    assert folded["exposed_comm_s"]["pp"] == pytest.approx(0.0018145, rel=1e-4)
    loaded = scenario_from_text(CP_FABRIC_TEMPLATE, "inline.yaml", list(overrides))
    topology = scenario_topology(loaded)
    prepared = prepare_training(loaded, topology, StepFaultPlan())
    assert len(prepared.step.program.ranks) == 4
    _, _, kept_pace = run_step(prepared.step.program, topology, prepared.settings, plans=prepared.plans)
    assert kept_pace.hand_offs and not kept_pace.hand_offs_within_lanes


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


def test_a_two_rank_tree_across_the_replicas_folds_exactly(run_yaml, monkeypatch):
    """The small fabric with two GPUs per NIC, 4 channels, PP 2 x DP 2, the DP all-reduces forced onto NCCL's tree.
    Every channel runs both trees, as the tree across hosts' chains does, each carrying n / (2 channels): both
    directions of every channel cross at once, as a ring's do, and the folded step is the unfolded one. Over two
    ranks the tree's up and down are then the ring's reduce-scatter and all-gather, one hop each way per channel, so
    the step is the ring's (auto's) to the last bits. With the two trees on channels 0 and 1 whatever the channel
    count, one rank would send up on channel 1 while its replica sent up on channel 0, hashed onto another spine, and
    the folded step would come out 6.7% short (34.12 ms against 36.59)."""
    from simulator.engine import plans

    nccl_choice = plans.resolve_weighing
    overrides = ("cluster.nics_per_node=4", "collectives.channels=4", "parallelism.pp=2", "parallelism.dp=2")
    ring = run_yaml(SMALL_FABRIC, "collectives.protocol=simple", *overrides).summary

    def tree_for_dp_pairs(request, topology, algorithm, protocol="simple", efficiency=None):
        pair = len(request.ranks) == 2 and topology.gpu_host[request.ranks[0]] != topology.gpu_host[request.ranks[1]]
        if request.op == "all_reduce" and pair:
            algorithm = "tree"
        return nccl_choice(request, topology, algorithm, protocol, efficiency)

    monkeypatch.setattr(plans, "resolve_weighing", tree_for_dp_pairs)
    folded, unfolded = _folded_and_unfolded(run_yaml, *overrides)
    assert folded["folded"] and "fold_off_reason" not in folded
    assert folded["step_time_s"] == unfolded["step_time_s"] == pytest.approx(ring["step_time_s"], rel=1e-12)


HSDP = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
network: {efficiency: ideal}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 1024, global_batch: 32, micro_batch: 1}
parallelism: {tp: 1, pp: 2, dp: 8, fsdp: hybrid_shard}
collectives: {algorithm: ring}
run: {timeline: full}
"""
"""The review's HSDP case: two DGX H100 hosts, PP 2 x DP 8 (rank = pp + 2 dp), each host's 4 DP ranks of a stage
a shard group, the two hosts' like-placed ranks a replica group; gradients reduce-scattered in each shard group
over NVLink, then the shards all-reduced between the hosts over the rails."""


def test_hsdp_folds_exactly_and_its_reductions_take_their_ring_closed_forms(run_yaml):
    """Folded (ranks 0 and 1 simulated) and unfolded steps and traffic agree to 1e-9 (the shard groups' images
    straddled both hosts and the folded step took 0.376 s against 0.104 s); every reduce-scatter takes the
    ring's b + (k - 1) a + (k - 1)/k n / B over NVLink (k = 4, a and B the route's latency and bandwidth, ideal
    efficiency, b NCCL's base latency of a Simple ring, 8.4 us) and every all-reduce b + 2 (k - 1) a + 2 (k - 1)/k
    n / B over the rails (k = 2), to 1e-9 (today 1e-15)."""
    folded = run_yaml(HSDP)
    unfolded = run_yaml(HSDP, "run.fold=false").summary
    assert folded.summary["folded"] and folded.summary["simulated_ranks"] == 2
    assert folded.summary["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=EXACT)
    assert folded.summary["traffic_bytes_per_gpu"] == pytest.approx(unfolded["traffic_bytes_per_gpu"], rel=EXACT)
    topology, frame = folded.topology, folded.timeline
    ops = frame[(frame["kind"] == "collective") & (frame["category"] == "dp")]

    def route(src: int, dst: int) -> tuple[float, float]:
        links = topology.path(src, dst, 0)
        return sum(topology.link_latency[link] for link in links), min(topology.link_bandwidth[link] for link in links)

    for kind, (alpha, bandwidth), size, rounds in (("reduce_scatter grads", route(1, 3), 4, 1),
                                                   ("all_reduce shard", route(1, 9), 2, 2)):
        chosen = ops[ops["name"].str.startswith(kind)]
        assert len(chosen) == 6  # 3 units per stage
        expected = NCCL_SIMPLE_BASE_S + rounds * (size - 1) * (alpha + chosen["bytes"] / size / bandwidth)
        assert (chosen["end_s"] - chosen["start_s"]).to_numpy() == pytest.approx(expected.to_numpy(), rel=EXACT)


def test_the_symmetry_check_refuses_mirrors_of_a_shard_group_shifted_across_hosts():
    """Had the shard groups kept their cyclic DP shifts (images such as (2, 4, 6, 8) across both hosts), the
    fold symmetry check would switch folding off: such a group lies in one NVLink domain, but its mirrors do
    not, so it is compared, and the images take 15.8 ms alone against the group's 1.76 ms."""
    loaded = scenario_from_text(HSDP, "inline.yaml", [])
    topology = scenario_topology(loaded)
    program = step_program(loaded, topology, fold=True)
    settings = network_settings(loaded, topology)
    capacity = effective_capacity(topology, dict(settings.efficiency))
    assert symmetry.asymmetric_replicas(program.ops, plan_cache(topology, settings), capacity) == ""
    shifted = [replace(op, mirrors=_images_by_definition(program.layout, op.group))
               if isinstance(op, CollectiveOp) and len(op.group) == 4 else op for op in program.ops]
    verdict = symmetry.asymmetric_replicas(shifted, plan_cache(topology, settings), capacity)
    assert "over GPUs [0, 2, 4, 6] but" in verdict and "over the equivalent [2, 4, 6, 8]" in verdict


def test_hsdp_over_dp_and_cp_folds_exactly(run_yaml):
    """TP 2 x CP 2 x DP 4 on two hosts: each host's CP x DP ranks of a TP lane are a shard group (CP 0-1 x DP 0-1
    on the first host); the cyclic DP shift had its images straddle the hosts and the folded step 2.5 times the
    unfolded one. Equal to 1e-9."""
    overrides = ("parallelism.tp=2", "parallelism.cp=2", "parallelism.pp=1", "parallelism.dp=4",
                 "training.seq_len=4096")
    folded = run_yaml(HSDP, *overrides, "run.timeline=summary").summary
    unfolded = run_yaml(HSDP, *overrides, "run.timeline=summary", "run.fold=false").summary
    assert folded["folded"] and folded["simulated_ranks"] == 1
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=EXACT)


def test_a_mirror_whose_ranks_span_other_classes_than_its_group_is_found():
    """PP 2 x DP 8 (rank = pp + 2 dp), shards of 4 DP ranks: classed by a slow DP rank 1 (the straggler classes),
    the first shard group keeps the other shard group as its mirror (its lowest rank's class is simulated in the
    group), though none of that copy's ranks is the slow one's class-mate; classed by host, every replica group's
    kept mirrors hold the group's classes. Classes at other places, or held other times, are alike: the copy
    starts when the last of them is ready either way."""
    layout = Layout(pp=2, dp=8)
    shard, replica = (0, 2, 4, 6), (0, 8)
    by_slow_rank = RankClasses((0, 1, 0, 0, 0, 0, 0, 0))
    kept = class_images(layout, by_slow_rank, shard, mirror_images(layout, shard))
    assert kept == ((8, 10, 12, 14),)
    assert unlike_images(layout, by_slow_rank, shard, kept).tolist() == [True]
    by_host = RankClasses((0, 0, 0, 0, 1, 1, 1, 1))
    kept = class_images(layout, by_host, replica, mirror_images(layout, replica))
    assert kept == ((2, 10), (4, 12), (6, 14))
    assert unlike_images(layout, by_host, replica, kept).tolist() == [False] * 3
    by_pairs = RankClasses((0, 0, 1, 1, 2, 2, 3, 3))
    copies = ((6, 2, 4, 0), (0, 0, 0, 4), (0, 2, 4, 8), (0, 0, 2, 2))
    assert unlike_images(layout, by_pairs, (0, 2, 4, 6), copies).tolist() == [False, False, True, True]


MIXTRAL_EP4 = ("model.layers=2", "model.moe.experts=8", "cluster.nodes=2", "parallelism.tp=1", "parallelism.pp=1",
               "parallelism.ep=4", "parallelism.dp=16", "training.global_batch=16")
"""Mixtral on two DGX H100 hosts, EP 4 inside DP 16: with GPU 5 x2 the straggler classes folded it onto 2 ranks
and, without the alignment check, its EP communication is 1.4134 against 1.4912 ms unfolded."""


@pytest.mark.parametrize(("gpu", "overrides", "reason"), [
    (2, (), "all_gather 'all_gather params embedding' over GPUs [0, 2, 4, 6] keeps the copy over GPUs "
            "[8, 10, 12, 14] as a mirror"),
    (10, (), "all_gather 'all_gather params embedding' over GPUs [8, 10, 12, 14] holds GPU 8, whose class's "
             "representative GPU 0 is outside the group"),
    (5, MIXTRAL_EP4, "whose class's representative GPU"),
], ids=["hsdp-mirror", "hsdp-group", "mixtral-ep"])
def test_stragglers_whose_classes_misalign_a_group_or_mirror_run_unfolded(run_yaml, gpu, overrides, reason):
    """A fold by the slow replica's classes is given up before its run where a kept mirror's ranks span other
    classes than its group's (HSDP, GPU 2 x2: the other host's shard group mirrored the slow GPU's) or a simulated
    group holds a member whose class's representative is outside it (HSDP, GPU 10 x2: the slow GPU's shard group
    waited for GPU 10 alone; the Mixtral EP 4 case, GPU 5 x2): folded without the check, each has its data- or
    expert-parallel communication 5-7% short of the unfolded run's. Every figure is the unfolded run's."""
    straggler = f"faults.step.stragglers=[{{gpus: [{gpu}], slowdown: 2}}]"
    if overrides:
        scenario = SCENARIOS / "mixtral-8x7b-ep8.yaml"
        folded, unfolded = (simulate(load_scenario(scenario, [*overrides, straggler, "run.timeline=summary", *fold]))
                            .summary for fold in ((), ("run.fold=false",)))
    else:
        folded, unfolded = (run_yaml(HSDP, straggler, "run.timeline=summary", *fold).summary
                            for fold in ((), ("run.fold=false",)))
    assert_same_figures(folded, unfolded, rel=EXACT, absolute=1e-12, reason="fold_off_reason")
    given_up = folded["fold_given_up"][-1]
    assert (given_up["fold"], given_up["why"]) == ("stragglers", fold_policy.REFUSED["aligned"])
    assert reason in given_up["reason"]


def test_a_step_too_large_unfolded_is_refused_or_warned_as_its_mirrors_fell_out_of_step():
    """Where a collective's mirrors fell out of step the guard's refusal stands (exit 2 at the CLI, as for the checks
    before the run); where only pipeline hand-offs did (ONE_NIC: 'send fwd mb0' and no other), the folded run stands,
    where no refold applies (a stage's ranks share a host, whose hand-offs all take one route), with a warning that
    says why it is not exact (the published long-context row), and its stage fold is `fold_not_exact` with the
    figures of the hand-off out of step, not in `fold_given_up` (it ran and stands); the `ranks` row says 'folded
    by stage, not exact' with how many hand-offs fell out of step by up to how much, not 'given up'."""
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError, match="too large unfolded: all_reduce 'tp all_reduce"):
        refused_unfolded(TWO_PER_NIC)
    summary = refused_unfolded(ONE_NIC)
    assert summary["folded"] and "fold_off_reason" not in summary
    (warning,) = summary["warnings"]
    assert warning.startswith("folded step not exact, and too large to simulate unfolded: send_recv 'send fwd mb0' "
                              "over GPUs [4, 8] ended on its mirrors")
    (untried,) = summary["fold_given_up"]
    assert (untried["fold"], untried["why"]) == ("routes", "finer refolds are not tried where the step may not unfold")
    entry = summary["fold_not_exact"]
    assert (entry["fold"], entry["simulated_ranks"], entry["why"]) == (
        "stage", 4, "a hand-off fell out of step in its run")
    assert entry["reason"] == warning.removeprefix("folded step not exact, and too large to simulate unfolded: ")
    assert (entry["out_of_step"]["op"], entry["out_of_step"]["name"]) == ("send_recv", "send fwd mb0")
    assert entry["out_of_step"]["group"] == [4, 8]
    apart = entry["out_of_step"]
    assert folding_text(summary) == (
        f"4 of {summary['gpus']} ranks simulated; folded by stage, not exact: "
        f"{counted(apart['instances'], 'hand-off')} out of step by up to {format_seconds(apart['widest_s'])}")


def test_hand_offs_whose_copies_meet_one_another_stand_not_exact_where_the_step_cannot_unfold():
    """LEAF_GROUPS_OF_THREE with tp 1, pp 16, dp 3 where the step may not run unfolded: the folded run stands, its
    forward sends out of step (stage 7's to stage 8 ended between 4.59 ms and 5.55 ms on its copies), with the
    warning and `fold_not_exact`, not silently (it stood as exact at 81.11 ms, the unfolded step 82.06). No refold
    applies there: its copies cross the same hops in every replica (they meet one another), and where the step
    may not unfold route classes are proposed by hops only (`fold_policy.route_steps`), which part none: the finer
    ones are listed as not tried."""
    summary = refused_unfolded(LEAF_GROUPS_OF_THREE + "parallelism: {tp: 1, pp: 16, dp: 3}\n", refolds=True)
    assert summary["folded"] and summary["simulated_ranks"] == 16
    assert [(entry["fold"], entry["simulated_ranks"]) for entry in summary["fold_given_up"]] == [("routes", None)]
    (warning,) = summary["warnings"]
    assert warning.startswith("folded step not exact, and too large to simulate unfolded: send_recv 'send fwd mb0' "
                              "over GPUs [7, 8] ended on its mirrors between 4.594 ms and 5.546 ms")
    entry = summary["fold_not_exact"]
    assert (entry["fold"], entry["simulated_ranks"], entry["why"]) == (
        "stage", 16, "a hand-off fell out of step in its run")
    assert entry["out_of_step"]["instances"] == 11


def test_every_fold_check_has_its_refusal_text():
    """`fold_given_up`'s `why` of a fold refused before its run is `REFUSED` of the check that refused it: one
    text per `FoldCheck`, none for a check that does not exist."""
    assert set(fold_policy.REFUSED) == set(get_args(FoldCheck))


@pytest.mark.parametrize(("fold", "kind"), [(True, "stage"), (False, None)])
def test_a_step_s_fold_kind_is_none_where_every_rank_is_simulated(fold, kind):
    """SMALL_FABRIC folds to one rank per stage (rank 0 of 32, one stage); unfolded (run.fold false, or rebuilt by
    `unfolded_step` for a check that refused the fold) its step has no fold kind, not 'stage'."""
    loaded = scenario_from_text(SMALL_FABRIC, "inline.yaml", [f"run.fold={str(fold).lower()}"])
    prepared = prepare_training(loaded, scenario_topology(loaded), StepFaultPlan())
    assert (len(prepared.step.program.ranks), prepared.step.kind) == (1 if fold else 32, kind)
    unfolded = fold_policy.unfolded_step(prepared.build, StepFaultPlan(), Unfolding("plan", "refused"))
    assert (len(unfolded.program.ranks), unfolded.kind, unfolded.off_reason) == (32, None, "refused")


TWO_RACKS_OF_SIXTEEN_TRAYS = TWO_REPLICAS_PER_RACK.replace("trays: 4", "trays: 16").replace(
    "layers: 4", "layers: 8").replace("seq_len: 2048", "seq_len: 1024").replace(
    "tp: 4, pp: 2, dp: 4", "tp: 8, pp: 4, dp: 4")
FOUR_REPLICAS_PER_RACK = TWO_RACKS_OF_SIXTEEN_TRAYS.replace("layers: 8", "layers: 4").replace(
    "global_batch: 16", "global_batch: 32").replace("pp: 4, dp: 4", "pp: 2, dp: 8")


@pytest.mark.parametrize(("scenario", "ranks"), [(TWO_REPLICAS_PER_RACK, 2), (TWO_RACKS_OF_SIXTEEN_TRAYS, 8),
                                                 (FOUR_REPLICAS_PER_RACK, 4)],
                         ids=["two-replicas-a-rack", "tp8-pp4-dp4", "four-replicas-a-rack"])
def test_gb200_trays_fold_apart_by_where_their_transfers_leave_the_rack(run_yaml, scenario, ranks):
    """DP rings built rack by rack hop between a rack's trays over NVLink and leave it over the NICs, each tray to its
    own peer tray of the other rack, whose flows the fabric hashes onto a spine by their hosts. Classed by NVLink
    loads alone, every rank of a stage would be one class (TP 8 x PP 4 x DP 4: the DP reduce-scatter falls out of
    step by 171 us) or the classes of unequal sizes (four replicas a rack: 8, 8, 8, 8, 16, 16). The racks' trays
    lie in leaf groups of 18, which no rotation maps onto themselves, so each transfer leaving the rack is read by
    the copy of its group it runs in, whose hosts all end it together: one rank per stage and tray of a TP group
    (2 of 32 at TP 4, 8 and 4 of 128 at TP 8; keyed by the host at the other end, one rank per tray and stage, 8,
    32 and 32), every figure the unfolded step's and the step time to the bit."""
    folded = run_yaml(scenario).summary
    unfolded = run_yaml(scenario, "run.fold=false").summary
    assert folded["folded"] and "fold_given_up" not in folded
    assert folded["simulated_ranks"] == ranks
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, EXACT, 1e-15)


FOUR_RACKS_A_LEAF_GROUP_EACH = """
cluster: {topology: gb200-nvl72, racks: 4, trays: 4, leaf_ports: 4}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 2048, global_batch: 32, micro_batch: 1, precision: bf16, recompute: none}
parallelism: {tp: 4, pp: 2, dp: 8, order: [tp, cp, pp, dp], sequence_parallel: true, tp_comm_overlap: true,
              pipeline: {schedule: interleaved, virtual_stages: 2}, zero: 1}
run: {timeline: summary}
"""


STAGES_STRADDLING_RACKS = """
cluster: {topology: gb200-nvl72, racks: 2}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 2048, global_batch: 72, micro_batch: 1, precision: bf16}
parallelism: {tp: 8, pp: 2, dp: 9, sequence_parallel: true, pipeline: {schedule: 1f1b}, fsdp: shard_grad_op}
run: {timeline: summary}
"""
"""TP 8 over two trays, PP 2, DP 9 on two racks of 18 trays: each replica's two stages take four trays, so the fifth
replica's stage 0 ends rack 0 and its stage 1 starts rack 1."""


@pytest.mark.parametrize(("scenario", "ranks"), [
    (FOUR_RACKS_A_LEAF_GROUP_EACH, 2),
    (FOUR_RACKS_A_LEAF_GROUP_EACH.replace("racks: 4", "racks: 5").replace("dp: 8", "dp: 10").replace(
        "global_batch: 32", "global_batch: 40"), 2),
    (STAGES_STRADDLING_RACKS, 36)], ids=["four-racks", "five-racks", "stages-straddling-racks"])
def test_gb200_trays_fold_by_copy_where_the_fabric_rotates(run_yaml, scenario, ranks):
    """Racks of 4 trays (two replicas of TP 4 x PP 2), each its own leaf group, so the spine hash repeats rack by
    rack and a rotation by whole racks maps the wiring onto itself. The copy key holds there as on racks of 16
    trays: every host of a DP ring's copy ends it together, so the trays, which hold the same TP lanes, are one
    class and the stage fold runs, 2 ranks on four racks and on five, every figure the unfolded step's (keyed by
    each route's place in the period of the spine hash and each tray's place in the step's rotation, 8 of 64 on
    four racks, whose step rotated by two racks is its own image, and 20 of 80 on five, with the same figures).
    Where stages straddle the racks (the fifth replica of TP 8 x PP 2 x DP 9 on two racks of 18 trays hands on
    over the NICs where the others hand on over NVLink) the copy key keys every tray alike, and the stage fold
    that would run is refused for its unlike hand-offs (144 ranks); the rotation's classes part the trays there
    (engine/rank_classes.py `_hands_on_unlike`): one rank a tray a stage, 36 of 144."""
    folded = run_yaml(scenario).summary
    unfolded = run_yaml(scenario, "run.fold=false").summary
    assert folded["folded"] and "fold_given_up" not in folded
    assert folded["simulated_ranks"] == ranks
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, EXACT, 1e-15)


TP_OVERLAP_STRAGGLER = "faults.step.stragglers=[{gpus: [5], slowdown: 1.5}]"
"""One slow GPU (TP 1 of stage 1 in the first replica under order [tp, cp, pp, dp]) with its TP mates beside it."""
EIGHT_HOSTS_TP_OVERLAP = """
cluster: {topology: dgx-h100-cluster, nodes: 8, nics_per_node: 2}
model: {layers: 4, hidden: 4096, heads: 32, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 4, pp: 4, dp: 4, order: [tp, cp, pp, dp], sequence_parallel: true, tp_comm_overlap: true}
"""


@pytest.mark.parametrize(("scenario", "ranks"), [(FOUR_RACKS_A_LEAF_GROUP_EACH, 16), (EIGHT_HOSTS_TP_OVERLAP, 32)],
                         ids=["gb200-four-racks", "h100-eight-hosts"])
def test_a_straggler_s_tp_mates_under_ring_exchanges_fold_apart(run_yaml, scenario, ranks):
    """With `tp_comm_overlap` each TP all-gather runs as a ring exchange against its GEMM: pairs swap a chunk, then
    every other rank along the ring passes one on, so a rank waits for the slow GPU (or for a DP mate of it
    waiting on it) by its place along the ring. Keyed only by the slow replica's coordinates, one rank stood for
    TP mates that wait unlike: the step time exact on the racks, bubble 0.48226 against 0.48161 and exposed TP
    0.714 against 0.725 ms; on the H100 hosts the step time itself off. Keyed by TP coordinate too, each folds
    (16 of 64 ranks, 32 of 64) with every figure the unfolded run's."""
    folded = run_yaml(scenario, TP_OVERLAP_STRAGGLER).summary
    unfolded = run_yaml(scenario, TP_OVERLAP_STRAGGLER, "run.fold=false").summary
    assert folded["folded"] and folded["simulated_ranks"] == ranks
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)


def test_a_slow_tp_group_under_ring_exchanges_keeps_its_classes(run_yaml):
    """A whole TP group slow (GPUs 4-7, one host of the eight, under `tp_comm_overlap`): every rank of a ring waits
    alike, so the TP coordinate parts no class: one rank of the slow group and one of the rest a stage, 8 of 64
    (keyed by TP coordinate too, 32), every figure the unfolded run's."""
    slow_host = "faults.step.stragglers=[{gpus: [4, 5, 6, 7], slowdown: 1.5}]"
    folded = run_yaml(EIGHT_HOSTS_TP_OVERLAP, slow_host).summary
    unfolded = run_yaml(EIGHT_HOSTS_TP_OVERLAP, slow_host, "run.fold=false").summary
    assert folded["folded"] and folded["simulated_ranks"] == 8
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)


SPINE_HASHED_COPIES = ("cluster.topology=dgx-h100-cluster", "cluster.nics_per_node=1", "cluster.nodes=6",
                       "cluster.leaf_ports=2", "cluster.oversubscription=8", "parallelism.tp=8", "parallelism.pp=3",
                       "parallelism.dp=2", "training.global_batch=8", "model.layers=24", "run.timeline=summary")
"""Six one-NIC DGX H100 hosts in leaf groups of two, a host a stage: each hand-off's 8 TP copies leave through
the one NIC, and where they cross the spines the fabric's hash puts two of them on some uplinks and one on
others, so copies over like hops take unlike times on the analytic model (5.725 ms over GPUs [8, 16], 11.44
over [9, 17])."""


def test_analytic_hand_off_copies_over_like_hops_unlike_loads_unfold():
    """The stage fold stood for each hand-off's copies by its slowest kept mirror, and the hop refold classes ranks
    by hops only: folded, comm_s.pp came out 77.44 ms against 59.79 unfolded (flow model 65.18). The fold check
    times each mirror over like hops with its copies' load and unfolds: every figure is the unfolded run's, and
    comm_s.pp lies within 9% of the flow model's."""
    path = SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"
    analytic = [*SPINE_HASHED_COPIES, "network.model=analytic"]
    folded = simulate(load_scenario(path, analytic)).summary
    unfolded = simulate(load_scenario(path, [*analytic, "run.fold=false"])).summary
    flow = simulate(load_scenario(path, [*SPINE_HASHED_COPIES, "network.model=flow"])).summary
    assert not folded["folded"]
    assert ("takes 5.725 ms over GPUs [8, 16] but 11.44 ms over the equivalent [9, 17] on the analytic model"
            in folded["fold_off_reason"])
    assert (folded["comm_s"], folded["step_time_s"]) == (unfolded["comm_s"], unfolded["step_time_s"])
    assert folded["comm_s"]["pp"] == pytest.approx(flow["comm_s"]["pp"], rel=0.09)
