"""The route shapes that engine/symmetry.py compares a collective's mirrors by: worked out together over arrays,
they must tell phases apart exactly as the plain definition does (per transfer its bytes and, along its route,
each link's kind and how many of the phase's transfers cross it, in any transfer order)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from simulator.collectives.phases import Phase, Transfer
from simulator.engine.symmetry import link_kind_codes, route_shapes
from simulator.topology.builders import build_topology

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
