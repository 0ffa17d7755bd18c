"""The fold symmetry check (engine/symmetry.py). The route shapes it compares a collective's mirrors by:
worked out together over arrays, they must tell phases apart exactly as the plain definition does (per transfer
its bytes and, along its route, each link's kind and how many of the phase's transfers cross it, in any transfer
order). And what lets it skip a group without comparing its mirrors (a group already compared, or known by
translation: `_Translates`), and what must not. Last, the unequal traffic (a tree's) that a collective meets
where the ordering lets the two overlap, instance by instance, against step times folded and unfolded."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from shared import CP_FABRIC, SHARED_NICS, step_program_and_plans

from simulator.collectives.phases import Phase, Transfer
from simulator.engine import symmetry
from simulator.engine.symmetry import link_kind_codes, route_shapes
from simulator.network.model import effective_capacity
from simulator.program.ops import CollectiveOp
from simulator.topology.builders import build_topology
from simulator.topology.periods import Periods

FABRIC = {"nodes": 8, "leaf_ports": 2, "spines": 2, "oversubscription": 2, "nics_per_node": 4,
          "node": {"kind": "nvswitch_node", "gpus": 8}}
"""Two GPUs per NIC and 2:1 spines: flows out of one host meet on NICs and uplinks in varied numbers."""


def _plain_shape(topology, phase: Phase) -> tuple:
    paths = [topology.path(t.src, t.dst, t.channel) for t in phase.transfers]
    load = Counter(link for path in paths for link in path)
    kind = list(zip(topology.link_bandwidth.tolist(), topology.link_class))
    return tuple(sorted((t.nbytes, tuple((kind[link], load[link]) for link in path))
                        for t, path in zip(phase.transfers, paths)))


def test_route_shapes_tell_phases_apart_as_the_plain_definition_does():
    """120 random phases of 1-4 transfers (two sizes, two channels) between the hosts of a small fabric, each
    also with its transfers reversed: two phases get equal shapes exactly when their plain shapes are equal,
    and both outcomes occur."""
    topology = build_topology("cluster", FABRIC)
    rng = np.random.default_rng(7)
    phases = []
    for _ in range(120):
        count = int(rng.integers(1, 5))
        transfers = tuple(Transfer(int(src), int((src + 8 * rng.integers(1, 8)) % 64), float(rng.choice([1e6, 2e6])),
                                   int(rng.integers(0, 2)))
                          for src in rng.integers(0, 64, size=count))
        phases += [Phase(transfers), Phase(transfers[::-1])]
    shapes = route_shapes(topology, phases, link_kind_codes(topology))
    plain = [_plain_shape(topology, phase) for phase in phases]
    same = [(plain[i] == plain[j], shapes[i] == shapes[j]) for i in range(len(phases)) for j in range(len(phases))]
    assert all(expected == found for expected, found in same)
    assert {expected for expected, _ in same} == {True, False}
    assert sum(expected for expected, _ in same) > 2 * len(phases)  # equal pairs beyond a phase and its reverse


def test_route_shapes_do_not_depend_on_the_phases_worked_out_beside_them():
    """A phase's shape is the same alone as among others (the mirrors of a collective are compared in batches,
    each its own call), for one-transfer phases and longer ones alike."""
    topology = build_topology("cluster", FABRIC)
    kinds = link_kind_codes(topology)
    short = Phase((Transfer(0, 1, 1e6, 0),))
    crossing = Phase(tuple(Transfer(src, (src + 24) % 64, 2e6, src % 2) for src in range(0, 64, 9)))
    together = route_shapes(topology, [short, crossing, Phase(())], kinds)
    assert together == [route_shapes(topology, [phase], kinds)[0] for phase in (short, crossing, Phase(()))]
    assert together[0] != together[1]



def test_unequal_shapes_tell_phases_apart_as_the_plain_definition_does():
    """What 120 random phases (and their reverses) meet of a load on half the links, as arrays
    (`unequal_shapes` of a `route_table`): equal for two phases exactly when the plain definition (per
    transfer its bytes and the load along its route, the transfers sorted) is, both outcomes occurring; and a
    plan of several phases is told apart phase by phase (a phase and its reverse meet the load alike)."""
    topology = build_topology("cluster", FABRIC)
    rng = np.random.default_rng(11)
    load = rng.choice([0.0, 1e6, 2e6], size=len(topology.link_class))
    phases = []
    for _ in range(120):
        sources = rng.integers(0, 64, size=int(rng.integers(1, 4)))
        transfers = tuple(Transfer(int(src), int((src + 8 * rng.integers(1, 8)) % 64), float(rng.choice([1e6, 2e6])),
                                   int(rng.integers(0, 2))) for src in sources)
        phases += [Phase(transfers), Phase(transfers[::-1])]
    found = [symmetry.unequal_shapes(symmetry.route_table(topology, [phase]), load) for phase in phases]
    plain = [sorted((t.nbytes, *load[list(topology.path(t.src, t.dst, t.channel))].tolist()) for t in phase.transfers)
             for phase in phases]
    same = [(plain[i] == plain[j], found[i] == found[j]) for i in range(len(phases)) for j in range(len(phases))]
    assert all(expected == got for expected, got in same)
    assert sum(expected for expected, _ in same) > 2 * len(phases)
    plan = symmetry.route_table(topology, phases[:4])
    assert symmetry.unequal_shapes(plan, load) != symmetry.unequal_shapes(symmetry.route_table(topology, phases[2:6]),
                                                                          load)
    assert symmetry.unequal_shapes(plan, load) == symmetry.unequal_shapes(
        symmetry.route_table(topology, [phases[1], phases[0], phases[3], phases[2]]), load)

SHARED_NICS_8 = SHARED_NICS.replace("nodes: 4", "nodes: 8").replace(
    "collectives: {channels: 2}", "collectives: {channels: 2, algorithm: ring}").replace(
    "dp: 2}", "dp: 4, order: [tp, cp, dp, pp]}")
"""Lanes sharing a NIC, two pipeline stages: each stage's DP ring meets the uplinks unevenly (its group's copy
takes about twice its mirrors' time, 2.22 against 1.15 ms), and stage 1's groups (32 GPUs on, two periods of
the spine hash) are translates of stage 0's."""


@pytest.mark.parametrize(("rows", "columns"), [(0, 3), (1, 1), (40, 3), (300, 64), (200, 70), (5, 0)])
def test_distinct_rows_are_those_of_np_unique_in_its_order(rows, columns):
    """The overlap tables' distinct rows, found packed into bytes, are `np.unique(axis=0)`'s, in its order, over
    tables with no rows or no columns and past 64 columns (more than eight bytes a row)."""
    rng = np.random.default_rng(rows * 100 + columns)
    met = rng.random((rows, columns)) < 0.3
    met[1::3] = met[: len(met[1::3])]
    found = symmetry._distinct_rows(met)
    expected = np.unique(met, axis=0)
    assert found.dtype == bool and found.shape == expected.shape and (found == expected).all()


@pytest.mark.parametrize("translations", [True, False], ids=["translations", "no translations"])
def test_a_zero_byte_collective_first_hides_no_group(monkeypatch, translations):
    """A copy of stage 0's first DP all-reduce that sends nothing, put first in the program, changes nothing:
    its empty plan shows no routes, so it neither stands for its group's later ops (which it did: the group was
    taken as compared at that size) nor vouches for the group's translates (which it did: each translate's
    plan at 0 bytes is empty too, so every translate was skipped and the check found nothing)."""
    if not translations:
        monkeypatch.setattr(Periods, "of", staticmethod(lambda topology: None))
    program, _, fresh = step_program_and_plans(SHARED_NICS_8)
    capacity = effective_capacity(fresh().topology, {})
    ops = list(program.ops)
    first = next(op for op in ops if isinstance(op, CollectiveOp) and op.category == "dp" and op.mirrors
                 and min(op.group) < 16)
    zero = dataclasses.replace(first, nbytes=0.0, id=max(op.id for op in ops) + 1, key="zero")
    verdict = symmetry.asymmetric_replicas(ops, fresh(), capacity)
    assert f"over GPUs {list(first.group)} but" in verdict
    assert symmetry.asymmetric_replicas([zero, *ops], fresh(), capacity) == verdict


def _translated_pair():
    """CP_FABRIC's first gradient all-reduce of the first pipeline stage and the second stage's first
    (its group and mirrors one period, 16 GPUs, on), an empty `_Translates`, the algorithm and the plan cache."""
    program, plans, _ = step_program_and_plans(CP_FABRIC)
    shift = plans.topology.router.shift_gpus
    dp = [op for op in program.ops if isinstance(op, CollectiveOp) and op.category == "dp" and op.mirrors]
    known = next(op for op in dp if min(op.group) < shift)
    moved = tuple(rank + shift for rank in known.group)
    translate = next(op for op in dp if op.group == moved)
    translates = symmetry._Translates(plans, symmetry.link_kind_codes(plans.topology))
    algorithm = plans.resolved_algorithm(known, known.group)
    return known, translate, translates, algorithm, plans


def _reference(plans, op) -> tuple[bytes, ...]:
    return tuple(symmetry.route_shapes(plans.topology, plans.phases(op, op.group),
                                       symmetry.link_kind_codes(plans.topology)))


def test_a_translate_of_a_compared_group_is_known():
    """The translate of a group whose mirrors were compared, its mirrors moved with it, needs no comparison."""
    known, translate, translates, algorithm, plans = _translated_pair()
    assert not translates.known(translate, algorithm)
    translates.add(known, algorithm, _reference(plans, known))
    assert translates.known(translate, algorithm)


def _other_mirrors(known: CollectiveOp, translate: CollectiveOp, plans) -> CollectiveOp:
    return dataclasses.replace(translate, mirrors=translate.mirrors[::-1])


def _other_algorithm(known: CollectiveOp, translate: CollectiveOp, plans) -> CollectiveOp:
    """The known op made to resolve to `tree` over the translate's group, its plan there made beforehand (the routes of
    a tree plan would tell it apart on their own)."""
    plans.phases(known, translate.group)
    resolved = plans.resolved_algorithm
    plans.resolved_algorithm = lambda op, group: "tree" if group == translate.group else resolved(op, group)
    return translate


def _other_routes(known: CollectiveOp, translate: CollectiveOp, plans) -> CollectiveOp:
    phases = plans.phases
    plans.phases = lambda op, group: phases(op, group)[:-1] if group == translate.group else phases(op, group)
    return translate


@pytest.mark.parametrize("differ", [_other_mirrors, _other_algorithm, _other_routes],
                         ids=["mirrors not moved with it", "another algorithm", "other route shapes"])
def test_a_translate_unlike_its_known_group_is_compared(differ):
    """A translate is not known when its mirrors are not the known group's moved as far, when the known op
    resolves to another algorithm over it, or when the known op's plan over it has other route shapes (here
    each made to differ, one at a time)."""
    known, translate, translates, algorithm, plans = _translated_pair()
    translates.add(known, algorithm, _reference(plans, known))
    assert not translates.known(differ(known, translate, plans), algorithm)




LANES_STEP = dict[str, list[tuple[str, tuple[int, ...], tuple[str, ...]]]]
"""Rank 0's ops on one DGX H100, by stream, each (name, group, names of its dependencies): a name starting with
T is a tree all-reduce over four lanes (a TP group; its chain's inner ranks, the second and third of the group,
send and receive twice an end's bytes on their NVLink ports), mirrored on lanes 4-7 (the other replica); one
starting with S a ring all-gather over lanes 0 and 4 (a DP group), mirrored on each other lane pair."""


def _lanes_ops(step: LANES_STEP, ranks: range) -> list[CollectiveOp]:
    """``step``'s ops on ``ranks``: rank 0 alone, its collectives carrying their mirrors (the folded program),
    or every rank, each in its own copy of its collectives (the unfolded one). Every group and mirror lies in
    the host's NVLink domain, so only the unequal traffic can refuse the fold."""
    entries = [(stream, *entry) for stream, listed in step.items() for entry in listed]
    ids = {(rank, entry[1]): index for index, (rank, entry) in enumerate((r, e) for r in ranks for e in entries)}
    ops = []
    for rank in ranks:
        for stream, name, group, deps in entries:
            tree = name.startswith("T")
            own = tuple(member + rank // 4 * 4 for member in group) if tree else (rank % 4, rank % 4 + 4)
            mirrors = (() if len(ranks) > 1 else ((tuple(member + 4 for member in group),) if tree
                                                   else tuple((lane, lane + 4) for lane in range(1, 4))))
            ops.append(CollectiveOp(id=ids[rank, name], rank=rank, stream=stream, name=name,
                                    deps=tuple(ids[rank, dep] for dep in deps),
                                    op="all_reduce" if tree else "all_gather", group=own,
                                    nbytes=64e6 if tree else 512e6, key=f"{name}{own}",
                                    algorithm="tree" if tree else "ring", mirrors=mirrors))
    return ops


def _lanes_verdict(step: LANES_STEP) -> str:
    from simulator.engine.ordering import ProgramOrder
    from simulator.simulation import NetworkSettings, plan_cache

    topology = build_topology("cluster", {"nodes": 1})
    ops = _lanes_ops(step, range(1))
    return symmetry.asymmetric_replicas(ops, plan_cache(topology, NetworkSettings()), effective_capacity(topology, {}),
                                        order=ProgramOrder(ops, frozenset()))


def _lanes_steps(step: LANES_STEP) -> tuple[float, float]:
    """The step time of ``step`` folded (rank 0, mirrors alongside) and unfolded (all eight ranks)."""
    from simulator.simulation import NetworkSettings, run_ops

    topology = build_topology("cluster", {"nodes": 1})
    return tuple(run_ops(topology, _lanes_ops(step, ranks), NetworkSettings())[0].makespan_s
                 for ranks in (range(1), range(8)))


CHAIN_0123 = (0, 1, 2, 3)
"""A tree (a chain inside one host) whose inner ranks are lanes 1 and 2: lane 0's all-gather meets less of its
load than lane 1's mirror does."""
CHAIN_1032 = (1, 0, 3, 2)
"""The same tree with lanes swapped in pairs: its inner ranks are lanes 0 and 3, so lane 0 meets more of its
load than lane 1; with CHAIN_0123's, every lane meets the same sum."""


def test_an_all_gather_overlapping_a_tree_all_reduce_unfolds_and_one_after_it_folds():
    """Different collective types on two streams: the all-gather S may overlap the tree T (no order between
    them), so its mirror on lanes 1 and 5 meets the tree's inner-rank load where lanes 0 and 4 meet an end's:
    refused. Made to wait for T, S meets none of its load: folded, and the folded step is the unfolded one."""
    overlapping = {"tp": [("T", CHAIN_0123, ())], "dp": [("S", (0, 4), ())]}
    assert "over GPUs [0, 4] meets the traffic of collectives whose members send unlike amounts" in (
        _lanes_verdict(overlapping))
    after = {"tp": [("T", CHAIN_0123, ())], "dp": [("S", (0, 4), ("T",))]}
    assert _lanes_verdict(after) == ""
    folded, unfolded = _lanes_steps(after)
    assert folded == pytest.approx(unfolded, rel=1e-12)


def test_each_instance_meets_the_unequal_traffic_of_its_own_overlaps():
    """Two instances of one all-gather shape, each overlapping a different tree: S1 meets CHAIN_0123 only
    (CHAIN_1032 waits for it), S2 CHAIN_1032 only (it waits for CHAIN_0123). Each instance meets its tree's load
    unlike its mirrors, so folding is off: the folded step is 7.7% longer than the unfolded one (2.00 against
    1.86 ms). Summed over both trees (what the shape's instances meet together) the loads are alike on every
    lane: the check, when it judged the overlaps of a shape's instances together, folded this step."""
    step = {"tp": [("T1", CHAIN_0123, ()), ("T2", CHAIN_1032, ("S1",))],
            "dp": [("S1", (0, 4), ()), ("S2", (0, 4), ("T1",))]}
    assert "over GPUs [0, 4] meets the traffic" in _lanes_verdict(step)
    folded, unfolded = _lanes_steps(step)
    assert folded / unfolded - 1 == pytest.approx(0.0766, abs=1e-3)


def test_overlapping_trees_are_met_each_on_its_own_not_their_sum():
    """An instance that may overlap both trees is judged on each tree's load on its own (in one matching of
    transfers for both), not on their sum, which is alike on every lane: with no order between the streams,
    S1 runs beside T1 and S2 beside T2 though each may overlap both, and the folded step is 3.49% longer than
    the unfolded one (1.9318 against 1.8666 ms); judged by the sum the check folded it. A lone S1 beside both
    trees is refused too: its folded step is the unfolded one, but its mirror on lanes 1 and 5 ends 0.139 ms
    apart from it (the lockstep check's finding after the run, which then unfolds the step anyway)."""
    trees = [("T1", CHAIN_0123, ()), ("T2", CHAIN_1032, ())]
    free = {"tp": trees, "dp": [("S1", (0, 4), ()), ("S2", (0, 4), ())]}
    assert "over GPUs [0, 4] meets the traffic" in _lanes_verdict(free)
    folded, unfolded = _lanes_steps(free)
    assert folded / unfolded - 1 == pytest.approx(0.0349, abs=1e-3)
    both = {"tp": trees, "dp": [("S1", (0, 4), ())]}
    assert "over GPUs [0, 4] meets the traffic" in _lanes_verdict(both)
    folded, unfolded = _lanes_steps(both)
    assert folded == pytest.approx(unfolded, rel=1e-12)


def test_a_program_too_large_to_order_is_judged_on_its_ranks_own_orders(monkeypatch):
    """With no ordering of the whole program (its limit set to 0 entries), each instance is judged on the order of its
    rank's ops: the all-gather made to wait for the tree folds (the folded step is the unfolded one), the one beside
    the tree is refused, each instance meets its own overlaps (refused) and an all-gather beside both trees their sum
    (folds). Taking every pair to overlap would refuse the first."""
    from simulator.engine import ordering
    from simulator.engine.ordering import ProgramOrder

    monkeypatch.setattr(ordering, "ORDERING_BUDGET_BYTES", 0)
    after = {"tp": [("T", CHAIN_0123, ())], "dp": [("S", (0, 4), ("T",))]}
    assert ProgramOrder(_lanes_ops(after, range(1)), frozenset()).ordering is None
    assert _lanes_verdict(after) == ""
    folded, unfolded = _lanes_steps(after)
    assert folded == pytest.approx(unfolded, rel=1e-12)
    beside = {"tp": [("T", CHAIN_0123, ())], "dp": [("S", (0, 4), ())]}
    assert "over GPUs [0, 4] meets the traffic" in _lanes_verdict(beside)
    each = {"tp": [("T1", CHAIN_0123, ()), ("T2", CHAIN_1032, ("S1",))],
            "dp": [("S1", (0, 4), ()), ("S2", (0, 4), ("T1",))]}
    assert "over GPUs [0, 4] meets the traffic" in _lanes_verdict(each)
    both = {"tp": [("T1", CHAIN_0123, ()), ("T2", CHAIN_1032, ())], "dp": [("S1", (0, 4), ())]}
    assert "over GPUs [0, 4] meets the traffic" in _lanes_verdict(both)


PARTNER = {0: 3, 3: 0, 1: 2, 2: 1}
"""The lane each lane of a host hands small messages to and from (`_handoff_ops`)."""


def _handoff_ops(ranks, folded: bool) -> list[CollectiveOp]:
    """The `each` case of `test_a_program_too_large_to_order_is_judged_on_its_ranks_own_orders` with the order
    between its streams carried by small send/recvs between partner lanes (0 and 3, 1 and 2) instead of deps:
    on lanes 0 and 1 S1 hands to the partner's tree stream, which then starts T2, and T1 to the partner's
    all-gather stream, which then starts S2 (on lanes 2 and 3 the streams' roles swap). ``ranks`` simulated,
    with mirrors where ``folded`` (ranks 0 and 3 of one host stand for all eight)."""
    ops = []
    for rank in ranks:
        base, lane = rank // 4 * 4, rank % 4
        first = lane in (0, 1)
        a, b = (rank, base + PARTNER[lane]) if first else (base + PARTNER[lane], rank)

        def mirrored(groups: tuple) -> tuple:
            return groups if folded else ()

        lanes = mirrored(((1, 5),) if lane == 0 else ((2, 6),))
        forth, back = mirrored(((1, 2), (4, 7), (5, 6))), mirrored(((2, 1), (7, 4), (6, 5)))
        made = {"S1": ("all_gather", (lane, lane + 4), 512e6, "ring", lanes),
                "S2": ("all_gather", (lane, lane + 4), 512e6, "ring", lanes),
                "T1": ("all_reduce", tuple(base + x for x in CHAIN_0123), 64e6, "tree",
                       mirrored((tuple(x + 4 for x in CHAIN_0123),))),
                "T2": ("all_reduce", tuple(base + x for x in CHAIN_1032), 64e6, "tree",
                       mirrored((tuple(x + 4 for x in CHAIN_1032),))),
                "C": ("send_recv", (a, b), 1e3, "auto", forth), "E": ("send_recv", (b, a), 1e3, "auto", back),
                "D": ("send_recv", (b, a), 1e3, "auto", back), "F": ("send_recv", (a, b), 1e3, "auto", forth)}
        streams = ({"dp": ["S1", "C", "E", "S2"], "tp": ["T1", "D", "F", "T2"]} if first else
                   {"dp": ["S1", "D", "F", "S2"], "tp": ["T1", "C", "E", "T2"]})
        for stream, names in streams.items():
            for name in names:
                op, group, nbytes, algorithm, mirrors = made[name]
                ops.append(CollectiveOp(id=len(ops), rank=rank, stream=stream, name=name, op=op, group=group,
                                        nbytes=nbytes, key=f"{name}{group}", algorithm=algorithm, mirrors=mirrors))
    return ops


@pytest.mark.parametrize("limit", [None, 0], ids=["ordered", "too large to order"])
def test_an_order_through_another_rank_hides_no_mirror_image_loads(monkeypatch, limit):
    """Each all-gather instance meets one tree, the order between them carried by send/recvs through the other
    simulated rank (ranks 0 and 3), which rank 0's own ordering does not see: with no whole ordering each
    instance is taken to overlap both trees. Judged by their sum (mirror images, alike on every lane) the
    unordered check folded a step 7.57% longer than the unfolded one (2.0215 against 1.8793 ms); each tree's
    load on its own tells the lanes apart, so the step is refused whether the program is ordered or not."""
    from simulator.engine import ordering
    from simulator.engine.ordering import ProgramOrder
    from simulator.simulation import NetworkSettings, plan_cache, run_ops

    if limit is not None:
        monkeypatch.setattr(ordering, "ORDERING_BUDGET_BYTES", limit)
    topology = build_topology("cluster", {"nodes": 1})
    ops = _handoff_ops((0, 3), True)
    order = ProgramOrder(ops, frozenset())
    assert (order.ordering is None) == (limit == 0)
    verdict = symmetry.asymmetric_replicas(ops, plan_cache(topology, NetworkSettings()),
                                           effective_capacity(topology, {}), order=order)
    assert "all_gather 'S1' over GPUs [0, 4] meets the traffic" in verdict
    folded, unfolded = (run_ops(topology, _handoff_ops(ranks, folded), NetworkSettings())[0].makespan_s
                        for ranks, folded in (((0, 3), True), (range(8), False)))
    assert folded / unfolded - 1 == pytest.approx(0.0757, abs=1e-3)
