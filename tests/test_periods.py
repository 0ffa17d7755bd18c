"""Translations by whole periods of the fabric's spine hash (topology/periods.py) and the mirror link tables read
off them (engine/plans.py `link_table`): every translated route is the image of its translate's, link for link,
and the tables, the pruned mirrors and the fold-symmetry verdict equal those found by planning and routing
every mirror."""

from __future__ import annotations

import numpy as np
import pytest
from shared import CP_FABRIC, SHARED_NICS, THREE_TIERS, step_program_and_plans

from simulator.engine.sharing import _connected_sets, kept_mirrors, private_collectives
from simulator.program.ops import CollectiveOp
from simulator.topology.builders import build_topology
from simulator.topology.periods import NO_IMAGE, Periods

FABRICS = {
    "two tiers, a rail a GPU": {"nodes": 8, "leaf_ports": 2, "spines": 4, "oversubscription": 2},
    "three tiers, four pods": {"nodes": 8, "leaf_ports": 1, "tiers": 3, "pods": 4, "spines": 2},
    "two GPUs a NIC": {"nodes": 6, "leaf_ports": 2, "spines": 3, "nics_per_node": 4},
    "PCIe hosts": {"nodes": 6, "leaf_ports": 2, "spines": 2, "node": {"kind": "pcie_node", "gpus": 4}},
}


@pytest.mark.parametrize("name", FABRICS)
def test_a_translated_route_is_the_image_of_its_translate(name):
    """Every route (every pair, channels 0-2) moved by one and by two periods is the route of the moved pair,
    link for link, and every link it crosses has an image."""
    topology = build_topology("cluster", FABRICS[name])
    periods = Periods.of(topology)
    assert periods is not None and periods.exact
    for shift in (1, 2):
        image, moved = periods.links(shift), shift * periods.period
        pairs = [(src, dst) for src in range(topology.num_gpus - moved) for dst in range(topology.num_gpus - moved)
                 if src != dst]
        assert pairs
        for src, dst in pairs:
            for channel in range(3):
                route = topology.path(src, dst, channel)
                assert tuple(image[list(route)]) == topology.path(src + moved, dst + moved, channel)


def test_a_period_that_cuts_a_domain_has_no_translation():
    """NVL72 racks of 18 trays under 4-port leaves: one period (4 trays) moves some GPUs of a rack into the
    next rack and others within it, so the rack's switch would have two images."""
    topology = build_topology("nvl72", {"racks": 2, "leaf_ports": 4})
    assert topology.router.shift_gpus
    assert Periods.of(topology) is None


def test_links_unlike_their_image_have_none():
    """Three tiers with five leaf groups in pods of three and two: the second pod's spine-core links carry two
    groups' uplinks, the first's three, so a shift from the first pod into the second maps them onto narrower
    links: they have no image, every other link has one or leaves the fabric."""
    topology = build_topology("cluster", {"nodes": 5, "leaf_ports": 1, "tiers": 3, "pods": 2, "spines": 2})
    periods = Periods.of(topology)
    assert periods is not None and not periods.exact
    image = periods.links(1)
    core = [link for link, (u, v) in enumerate(topology.link_ends) if "core" in u or "core" in v]
    assert core and (image[core] == NO_IMAGE).all()
    mapped = image[image != NO_IMAGE]
    assert len(np.unique(mapped)) == len(mapped)
    assert (topology.link_bandwidth[image != NO_IMAGE] == topology.link_bandwidth[mapped]).all()


DP_FABRIC = """
cluster: {topology: dgx-h100-cluster, nodes: 32, leaf_ports: 2, oversubscription: 2}
model: {preset: llama3-8b, layers: 8}
training: {seq_len: 2048, global_batch: 64, micro_batch: 1}
parallelism: {tp: 4, pp: 4, dp: 16, order: [tp, cp, pp, dp], sequence_parallel: true, zero: 1}
"""
POD_PER_REPLICA = THREE_TIERS.replace("pods: 2", "pods: 4")
"""THREE_TIERS (tests/shared.py) with a pod per replica: rings across the cores."""


def _mirrored(ops) -> list[CollectiveOp]:
    """The first op of each (op, size, group) with mirrors."""
    found = {}
    for op in ops:
        if isinstance(op, CollectiveOp) and op.mirrors:
            found.setdefault((op.op, op.algorithm, op.root, op.nbytes, op.group), op)
    return list(found.values())


@pytest.mark.parametrize("text", [CP_FABRIC, DP_FABRIC, POD_PER_REPLICA], ids=["cp", "dp", "three tiers"])
def test_mirror_link_tables_equal_planning_every_mirror(text):
    """Each op's table of mirror link sets holds, row by row, the links of the mirror planned and routed on its
    own; rows of one class are translates (some of the rows here)."""
    program, plans, fresh = step_program_and_plans(text)
    direct = fresh()
    rows = classes = 0
    for op in _mirrored(program.ops):
        table = plans.link_table(op, op.mirrors)
        starts = np.concatenate(([0], np.cumsum(table.sizes)))
        for index, mirror in enumerate(op.mirrors):
            assert frozenset(table.links[starts[index]:starts[index + 1]].tolist()) == direct.links(op, mirror)
        rows += len(op.mirrors)
        classes += len(set(table.classes.tolist()))
    assert classes < rows


@pytest.mark.parametrize("text, prunes", [(CP_FABRIC, False), (DP_FABRIC, True), (POD_PER_REPLICA, True)],
                         ids=["cp", "dp", "three tiers"])
def test_kept_mirrors_are_those_joined_to_the_simulated_traffic(text, prunes):
    """The definition, mirror by mirror, with every mirror planned on its own: a mirror is kept when a chain of
    mirrors sharing links joins it to a link of the simulated ranks' own collectives (here every mirror where
    the K/V gathers' rings cross every host's NICs, some of them elsewhere); the private collectives found with
    the kept mirrors' links read off the tables are those found routing each mirror."""
    program, plans, fresh = step_program_and_plans(text)
    direct = fresh()
    ops = _mirrored(program.ops)
    reached = set().union(*(direct.links(op, op.group) for op in program.ops if isinstance(op, CollectiveOp)))
    candidates = [(op, mirror) for op in ops for mirror in op.mirrors]
    sets = [sorted(direct.links(op, mirror)) for op, mirror in candidates]
    joined = _connected_sets(np.array(list(map(len, sets))), np.array([link for links in sets for link in links],
                                                                      dtype=np.int64), reached)
    expected = {}
    for (op, mirror), keep in zip(candidates, joined.tolist()):
        expected.setdefault(op.id, [])
        if keep:
            expected[op.id].append(mirror)
    kept = kept_mirrors(program.ops, plans)
    assert {op.id: list(kept[op.id]) for op in ops} == expected
    assert any(expected.values())
    assert prunes == any(len(kept[op.id]) < len(op.mirrors) for op in ops)
    private = private_collectives(program.ops, plans.links, program.async_streams, kept, plans.mirror_links)
    assert private == private_collectives(program.ops, direct.links, program.async_streams, kept)


PARTIAL_POD = """
cluster: {topology: dgx-h100-cluster, nodes: 10, leaf_ports: 2, tiers: 3, pods: 2, spines: 2, oversubscription: 2}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 2048, global_batch: 40, micro_batch: 1}
parallelism: {tp: 8, cp: 2, pp: 1, dp: 5, order: [tp, cp, pp, dp], sequence_parallel: true,
              cp_algorithm: all_gather}
"""
"""Five leaf groups in pods of three and two: translates into the second pod meet narrower core links."""


@pytest.mark.parametrize("text, asymmetric", [(CP_FABRIC, False), (POD_PER_REPLICA, False), (SHARED_NICS, True),
                                              (PARTIAL_POD, False)],
                         ids=["cp", "three tiers", "shared NICs", "partial pod"])
def test_the_fold_symmetry_check_compares_one_mirror_per_class(monkeypatch, text, asymmetric):
    """The check compares the first mirror of each class of translates only (fewer than all of them where
    groups lie within a replica: the K/V gathers) and gives the verdict it gives comparing every mirror."""
    from simulator.engine.symmetry import _class_firsts, asymmetric_replicas
    from simulator.network.model import effective_capacity

    program, plans, fresh = step_program_and_plans(text)
    capacity = effective_capacity(plans.topology, {})
    verdict = asymmetric_replicas(program.ops, plans, capacity)
    assert bool(verdict) == asymmetric
    if text is CP_FABRIC:
        cp = [op for op in _mirrored(program.ops) if op.category == "cp"]
        assert cp and all(len(_class_firsts(plans, op)) < len(op.mirrors) for op in cp)
    monkeypatch.setattr(Periods, "of", staticmethod(lambda topology: None))
    assert asymmetric_replicas(program.ops, fresh(), capacity) == verdict


def test_the_fold_symmetry_check_skips_groups_translated_from_one_compared(monkeypatch):
    """With tp 4 and cp 4 the second pipeline stage's groups lie one period (16 GPUs) on from the first's, their
    mirrors with them: of the six (op, group) compared without translations, the second stage's three (its K/V
    all-gather and reduce-scatter, its gradient all-reduce) are known by translation, and the verdict is the
    one comparing every group."""
    from simulator.engine import symmetry
    from simulator.network.model import effective_capacity

    program, plans, fresh = step_program_and_plans(CP_FABRIC)
    capacity = effective_capacity(plans.topology, {})
    compared: list[tuple[int, ...]] = []
    verdict_of = symmetry._mirror_verdict

    def spy(plans, op, *args):
        compared.append(op.group)
        return verdict_of(plans, op, *args)

    monkeypatch.setattr(symmetry, "_mirror_verdict", spy)
    assert symmetry.asymmetric_replicas(program.ops, plans, capacity) == ""
    translated = list(compared)
    compared.clear()
    monkeypatch.setattr(Periods, "of", staticmethod(lambda topology: None))
    assert symmetry.asymmetric_replicas(program.ops, fresh(), capacity) == ""
    assert len(translated) == 3 and len(compared) == 6
    skipped = set(compared) - set(translated)
    assert skipped and all(min(group) >= plans.topology.router.shift_gpus for group in skipped)


def _direct_rows(op: CollectiveOp, groups, fresh) -> list[frozenset[int]]:
    return [fresh.links(op, group) for group in groups]


def _table_rows(table) -> list[frozenset[int]]:
    starts = np.concatenate(([0], np.cumsum(table.sizes))).tolist()
    return [frozenset(table.links[start:end].tolist()) for start, end in zip(starts, starts[1:])]


def _plans(topology):
    """A plan cache whose `auto` weighs Simple alone (the sizes below are where its algorithms differ)."""
    from simulator.engine.plans import PlanCache
    return PlanCache(topology, protocol="simple")


def _op(**fields) -> CollectiveOp:
    return CollectiveOp(id=0, rank=fields["group"][0], stream="comm", name="mirrored", **fields)


def test_a_shift_by_a_thousand_periods_moves_a_route_at_once():
    """1,024 one-GPU hosts under one-port leaves (a period a GPU): a pipeline pair's mirrors 1,000 periods and
    more on are the routes of the moved pairs, found without a step per period in between (the old recursion
    per period overflowed Python's stack at such shifts and kept an array of every link per period)."""
    topology = build_topology("cluster", {"nodes": 1024, "leaf_ports": 1, "spines": 4, "node": {"gpus": 1}})
    plans = _plans(topology)
    op = _op(op="send_recv", group=(0, 1), nbytes=1e6, mirrors=((1000, 1001), (1021, 1022), (517, 2)))
    table = plans.link_table(op, op.mirrors)
    assert _table_rows(table) == _direct_rows(op, op.mirrors, _plans(topology))
    assert len(set(table.classes.tolist())) == 2
    assert len(plans.translations()._powers) == 10


SIZE_DEPENDENT = {"nodes": 5, "leaf_ports": 1, "tiers": 3, "pods": 3, "spines": 1, "cores": 4, "nics_per_node": 1,
                  "oversubscription": 4, "node": {"gpus": 2}}
"""Five 2-GPU hosts, a host a leaf, pods of two: `auto` picks a tree for 384 KiB over the first period's group
(estimates 147.1 us against the ring's 151.2) but a ring over its translate in the partial last pod, whose
narrower core links take the tree to 210.0 us and the ring to 203.6. (It was 128 KiB until the tree's chains
joined at their first GPUs as NCCL's do: the tree is now the faster over both there.)"""


def test_a_table_is_not_reused_at_a_size_where_auto_picks_other_algorithms():
    """The same mirror tuple at 16 B (every mirror a tree) and then at 384 KiB (the translate a ring): each
    table holds the links of each mirror planned at its own size."""
    topology = build_topology("cluster", SIZE_DEPENDENT)
    plans = _plans(topology)
    mirrors = ((0, 1, 4, 2, 3, 5), (4, 5, 8, 6, 7, 9))
    small, large = (_op(op="all_reduce", group=mirrors[0], nbytes=size, mirrors=mirrors)
                    for size in (16, 384 * 1024))
    assert [plans.resolved_algorithm(large, group) for group in mirrors] == ["tree", "ring"]
    for op in (small, large):
        assert _table_rows(plans.link_table(op, mirrors)) == _direct_rows(op, mirrors, _plans(topology))


def test_a_zero_byte_collective_has_no_links_beside_a_sized_one():
    """A zero-byte all-gather plans no transfers: its links are empty even after a sized one over the group,
    and a sized one's are not empty after it."""
    topology = build_topology("cluster", FABRICS["two tiers, a rail a GPU"])
    plans = _plans(topology)
    group, mirrors = (0, 8, 16), ((32, 40, 48),)
    empty, sized = (_op(op="all_gather", group=group, nbytes=size, mirrors=mirrors) for size in (0, 1e6))
    assert plans.links(empty, group) == frozenset() and plans.links(sized, group)
    assert plans.link_table(empty, mirrors).links.size == 0 and plans.link_table(sized, mirrors).links.size


def test_a_class_whose_translate_routes_elsewhere_is_planned_mirror_by_mirror(monkeypatch):
    """A spine hash that reads the absolute period (not periodic, though the wiring is): the check of each
    class's furthest translate against its own plan finds the difference, and every mirror's links are then
    its own, with no class shared."""
    from simulator.topology.builders import Fabric

    hops = Fabric._hops

    def absolute_hops(self, src, dst, channel):
        low, high, *spine_core = hops(self, src, dst, channel)
        if not spine_core:
            return (low, high)
        spines = len(self.spine_names[self.leaf_pod[low]])
        return (low, high, (spine_core[0] + src // self.shift_gpus) % spines, *spine_core[1:])

    monkeypatch.setattr(Fabric, "_hops", absolute_hops)
    topology = build_topology("cluster", FABRICS["two tiers, a rail a GPU"])
    plans = _plans(topology)
    period = topology.router.shift_gpus
    op = _op(op="all_gather", group=(0, 8, 16), nbytes=1e6, algorithm="ring",
             mirrors=tuple((first + shift, first + 8 + shift, first + 16 + shift)
                           for first in (0, 1) for shift in (period, 2 * period)))
    table = plans.link_table(op, op.mirrors)
    assert _table_rows(table) == _direct_rows(op, op.mirrors, _plans(topology))
    assert len(set(table.classes.tolist())) == len(op.mirrors)


SWEPT_FABRICS = {
    **FABRICS,
    "SHARP, NVLS hosts": ("cluster", {"nodes": 8, "leaf_ports": 2, "spines": 2, "link_class": "infiniband",
                                      "sharp": "sharpv3", "node": {"nvls": "nvswitch3"}}),
    "NVL72 racks a leaf group": ("nvl72", {"racks": 3, "leaf_ports": 18}),
}


@pytest.mark.parametrize("name", SWEPT_FABRICS)
def test_link_tables_equal_planning_each_mirror_for_random_groups(name):
    """Random groups with random translates by whole periods and a few groups that are none, every op, `auto`
    and every algorithm that plans it, a small and a large size: each row of the table is the links of that
    mirror planned and routed on its own."""
    from simulator.collectives.registry import ALGORITHMS

    kind, params = SWEPT_FABRICS[name] if isinstance(SWEPT_FABRICS[name], tuple) else ("cluster", SWEPT_FABRICS[name])
    topology = build_topology(kind, params)
    periods = Periods.of(topology)
    assert periods is not None
    rng = np.random.default_rng(7)
    plans, direct = _plans(topology), _plans(topology)
    gpus, period = topology.num_gpus, periods.period
    compared = 0
    for op_name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"):
        for algorithm in ["auto", *(a for a, entry in ALGORITHMS.items() if op_name in entry.ops)]:
            size = 2 if op_name == "send_recv" else int(rng.integers(2, 6))
            group = tuple(rng.choice(gpus - period, size=size, replace=False).tolist())
            room = (gpus - 1 - max(group)) // period
            mirrors = tuple(tuple(rank + shift * period for rank in group)
                            for shift in sorted(set(rng.integers(1, room + 1, size=3).tolist()))) if room else ()
            mirrors += tuple(tuple(rng.choice(gpus, size=size, replace=False).tolist()) for _ in range(2))
            for nbytes in (16.0, 64 * 2**20):
                op = _op(op=op_name, group=group, nbytes=nbytes, algorithm=algorithm, mirrors=mirrors)
                try:
                    expected = _direct_rows(op, mirrors, direct)
                except Exception:  # an algorithm this group or fabric cannot run (SHARP outside InfiniBand, ...)
                    continue
                assert _table_rows(plans.link_table(op, mirrors)) == expected, (op_name, algorithm, nbytes)
                compared += 1
    assert compared >= 30


def test_the_fold_symmetry_check_reads_the_tables_kept_mirrors_reads():
    """On a partial pod (links without images) the check classes mirrors by the op's own mirror table, the one
    the sharing analysis reads after it: the two together make the tables the sharing analysis makes alone."""
    from simulator.engine.symmetry import asymmetric_replicas
    from simulator.network.model import effective_capacity

    program, plans, fresh = step_program_and_plans(PARTIAL_POD)
    alone = fresh()
    kept_mirrors(program.ops, alone)
    assert asymmetric_replicas(program.ops, plans, effective_capacity(plans.topology, {})) == ""
    assert plans._tables
    kept_mirrors(program.ops, plans)
    assert plans._tables.keys() == alone._tables.keys()


BUNDLED = {"dgx-a100-cluster": "nodes", "dgx-h100-cluster": "nodes", "dgx-h100-superpod": "nodes",
           "ethernet-100g": "nodes", "gb200-nvl72": "racks"}
"""The bundled fabrics and what they are scaled by (at their own sizes a period spans every GPU)."""


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_fabrics_scaled_to_three_periods_move_their_routes(name):
    """Each bundled fabric scaled to three leaf groups (NVL72: racks): 400 random routes of the first period,
    on random channels, moved by one and two periods are the routes of the moved pairs, link for link."""
    from simulator.topology.loader import load_topology

    base = load_topology(name, {})
    scale = BUNDLED[name]
    topology = load_topology(name, {scale: 3 * (base.params["leaf_ports"] if scale == "nodes" else 1)})
    periods = Periods.of(topology)
    assert periods is not None and periods.exact and periods.period * 3 == topology.num_gpus
    images = {shift: periods.links(shift) for shift in (1, 2)}
    rng = np.random.default_rng(11)
    for src, dst, channel in zip(rng.integers(0, periods.period, 400).tolist(),
                                 rng.integers(0, topology.num_gpus - 2 * periods.period, 400).tolist(),
                                 rng.integers(0, 8, 400).tolist()):
        if src == dst:
            continue
        route = list(topology.path(src, dst, channel))
        for shift, image in images.items():
            moved = shift * periods.period
            assert tuple(image[route]) == topology.path(src + moved, dst + moved, channel)
