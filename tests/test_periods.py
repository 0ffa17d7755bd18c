"""Translations by whole periods of the fabric's spine hash (topology/periods.py) and the mirror link tables read
off them (engine/plans.py `link_table`): every translated route is the image of its translate's, link for link,
and the tables, the pruned mirrors and the fold-symmetry verdict equal those found by planning and routing
every mirror."""

from __future__ import annotations

import numpy as np
import pytest
from test_replicas import CP_FABRIC
from test_replicas import THREE_TIERS as TIERS

from simulator import simulation
from simulator.config.loader import scenario_from_text
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
THREE_TIERS = TIERS.replace("pods: 2", "pods: 4")
"""test_replicas' three tiers with a pod per replica: rings across the cores."""


def _folded(text: str):
    loaded = scenario_from_text(text, "inline.yaml", [])
    topology = simulation.build_topology(loaded)
    program = simulation.step_program(loaded, topology, fold=True)
    settings = simulation.network_settings(loaded)
    return program, simulation.plan_cache(topology, settings), lambda: simulation.plan_cache(topology, settings)


def _mirrored(ops) -> list[CollectiveOp]:
    """The first op of each (op, size, group) with mirrors."""
    found = {}
    for op in ops:
        if isinstance(op, CollectiveOp) and op.mirrors:
            found.setdefault((op.op, op.algorithm, op.root, op.nbytes, op.group), op)
    return list(found.values())


@pytest.mark.parametrize("text", [CP_FABRIC, DP_FABRIC, THREE_TIERS], ids=["cp", "dp", "three tiers"])
def test_mirror_link_tables_equal_planning_every_mirror(text):
    """Each op's table of mirror link sets holds, row by row, the links of the mirror planned and routed on its
    own; rows of one class are translates (some of the rows here)."""
    program, plans, fresh = _folded(text)
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


@pytest.mark.parametrize("text, prunes", [(CP_FABRIC, False), (DP_FABRIC, True), (THREE_TIERS, True)],
                         ids=["cp", "dp", "three tiers"])
def test_kept_mirrors_are_those_joined_to_the_simulated_traffic(text, prunes):
    """The definition, mirror by mirror, with every mirror planned on its own: a mirror is kept when a chain of
    mirrors sharing links joins it to a link of the simulated ranks' own collectives (here every mirror where
    the K/V gathers' rings cross every host's NICs, some of them elsewhere); the private collectives found with
    the kept mirrors' links read off the tables are those found routing each mirror."""
    program, plans, fresh = _folded(text)
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


SHARED_NICS = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2, oversubscription: 2, nics_per_node: 4}
collectives: {channels: 2}
model: {layers: 12, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 8, pp: 2, dp: 2}
"""
"""tests/test_folding.py's lanes sharing a NIC whose DP rings meet the uplinks unevenly: folding is not exact."""


PARTIAL_POD = """
cluster: {topology: dgx-h100-cluster, nodes: 10, leaf_ports: 2, tiers: 3, pods: 2, spines: 2, oversubscription: 2}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 2048, global_batch: 40, micro_batch: 1}
parallelism: {tp: 8, cp: 2, pp: 1, dp: 5, order: [tp, cp, pp, dp], sequence_parallel: true,
              cp_algorithm: all_gather}
"""
"""Five leaf groups in pods of three and two: translates into the second pod meet narrower core links."""


@pytest.mark.parametrize("text, asymmetric", [(CP_FABRIC, False), (THREE_TIERS, False), (SHARED_NICS, True),
                                              (PARTIAL_POD, False)],
                         ids=["cp", "three tiers", "shared NICs", "partial pod"])
def test_the_fold_symmetry_check_compares_one_mirror_per_class(monkeypatch, text, asymmetric):
    """The check compares the first mirror of each class of translates only (fewer than all of them where
    groups lie within a replica: the K/V gathers) and gives the verdict it gives comparing every mirror."""
    from simulator.engine.symmetry import _class_firsts, asymmetric_replicas
    from simulator.network.model import effective_capacity

    program, plans, fresh = _folded(text)
    capacity = effective_capacity(plans.topology, {})
    verdict = asymmetric_replicas(program.ops, plans, capacity)
    assert bool(verdict) == asymmetric
    if text is CP_FABRIC:
        cp = [op for op in _mirrored(program.ops) if op.category == "cp"]
        assert cp and all(len(_class_firsts(plans, op)) < len(op.mirrors) for op in cp)
    monkeypatch.setattr(Periods, "of", staticmethod(lambda topology: None))
    assert asymmetric_replicas(program.ops, fresh(), capacity) == verdict
