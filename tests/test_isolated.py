"""The array form of a plan run alone (network/isolated.py) against the event-by-event network model: the same
rows, in the same order, with the same times to the last bit, for every algorithm's phase shapes (pipelined
rings, chunked trees, direct all-to-all, halving-doubling, hierarchical, a strided group, 1-byte messages)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from shared import MIB

from simulator.collectives.execute import phase_arrays, phase_items, run_plan
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.registry import ALGORITHMS, plan_collective
from simulator.errors import ScenarioError
from simulator.metrics.events import EventLog
from simulator.network import isolated
from simulator.network.calibration import resolve_efficiency
from simulator.network.isolated import run_isolated
from simulator.network.maxmin import Incidence
from simulator.network.model import Network, effective_capacity
from simulator.topology.loader import load_topology


@pytest.fixture(scope="module")
def cluster():
    return load_topology("dgx-h100-cluster", {"nodes": 8})


@pytest.mark.parametrize("op,algorithm,ranks,nbytes,chunk,profile", [
    ("all_reduce", "ring", 64, 1024 * MIB, None, "calibrated"),
    ("all_reduce", "ring", 64, 1024 * MIB, 4 * MIB, "ideal"),
    ("all_reduce", "tree", 64, 256 * MIB, 4 * MIB, "calibrated"),
    ("all_reduce", "hierarchical", 64, 256 * MIB, None, "calibrated"),
    ("all_to_all", "direct", 64, 64 * MIB, None, "calibrated"),
    ("all_gather", "ring", tuple(range(0, 64, 8)), 64 * MIB, None, "calibrated"),
    ("all_reduce", "halving_doubling", 32, 64 * MIB, None, "ideal"),
    ("reduce_scatter", "ring", 32, 1.0, None, "calibrated"),
])
def test_isolated_run_equals_the_network_model(cluster, op, algorithm, ranks, nbytes, chunk, profile):
    group = tuple(range(ranks)) if isinstance(ranks, int) else ranks
    request = CollectiveRequest(op=op, ranks=group, nbytes=nbytes, root=0, chunk_bytes=chunk, channels=0)
    phases = plan_collective(request, cluster, algorithm)
    efficiency = resolve_efficiency(profile, cluster.gpu_model)
    env, log = simpy.Environment(), EventLog()
    network = Network(env, cluster, efficiency=efficiency, log=log)
    env.process(run_plan(env, network, cluster, phases, ""))
    env.run()
    alone = run_isolated(cluster, effective_capacity(cluster, efficiency), phases)
    c = log.flow_columns()
    assert alone.duration_s == env.now
    assert (alone.rows.src.tolist(), alone.rows.dst.tolist(), alone.rows.routes.tolist()) == (
        c["src"].tolist(), c["dst"].tolist(), log.flow_routes())
    assert (alone.rows.start_s.tolist(), alone.rows.end_s.tolist(), alone.rows.nbytes.tolist()) == (
        c["start_s"].tolist(), c["end_s"].tolist(), c["bytes"].tolist())


@pytest.mark.parametrize("collide", [False, True])
def test_rows_are_numbered_by_first_appearance(monkeypatch, collide):
    """`first_seen_rows` numbers equal routes alike, in order of first appearance, as a dict of tuples would;
    also when every row's hash collides (then the rows are compared by value)."""
    if collide:
        monkeypatch.setattr(isolated, "row_hashes", lambda matrix: np.zeros(len(matrix), dtype=np.uint64))
    rng = np.random.default_rng(0)
    matrix = rng.integers(-1, 4, size=(500, 3))
    numbers: dict[tuple[int, ...], int] = {}
    expected = [numbers.setdefault(tuple(row), len(numbers)) for row in matrix.tolist()]
    ids, firsts = isolated.first_seen_rows(matrix)
    assert ids.tolist() == expected and len(numbers) > 10
    assert [tuple(row) for row in matrix[firsts].tolist()] == list(numbers)


@pytest.mark.parametrize("topology", ["dgx-h100-cluster", "gb200-nvl72"])
def test_phase_arrays_are_the_phase_items(topology):
    """`phase_arrays` (what the array form reads) gives every transfer of every algorithm's phases the ends,
    bytes, latency and route `phase_items` (what `Network` reads) gives it, to the bit: pipelined phases,
    chunks in flight, NVLS's latency floor."""
    topo = load_topology(topology, {"nodes": 8} if topology == "dgx-h100-cluster" else {"racks": 2})
    kinds = set()
    for algorithm in ALGORITHMS:
        for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
            for chunk in (None, MIB):
                request = CollectiveRequest(op=op, ranks=tuple(range(topo.num_gpus)), nbytes=64 * MIB,
                                            chunk_bytes=chunk)
                try:
                    phases = plan_collective(request, topo, algorithm)
                except ScenarioError:
                    continue
                for phase in phases:
                    items, arrays = phase_items(topo, phase), phase_arrays(topo, phase)
                    assert [(src, dst, float(nbytes), float(latency), tuple(path))
                            for path, nbytes, latency, src, dst, _ in items] == [
                        (src, dst, nbytes, latency, tuple(link for link in route if link >= 0))
                        for src, dst, nbytes, latency, route in zip(arrays.src.tolist(), arrays.dst.tolist(),
                                                                    arrays.nbytes.tolist(), arrays.latency.tolist(),
                                                                    arrays.routes.tolist())]
                    kinds.add((phase.pipelined, phase.steps_in_flight > 0, phase.min_latency > 0))
    assert {(True, False, False), (False, True, False), (False, False, True)} <= kinds


def test_an_all_to_all_with_one_link_degraded_equals_the_network_model(cluster):
    # One GPU's NIC-to-leaf link at 30%: its flows part from the others' (none is solved as another's copy), and
    # the solves over the phase's routes indexed once (groups left out by weight 0) give the network model's rows.
    request = CollectiveRequest(op="all_to_all", ranks=tuple(range(64)), nbytes=64 * MIB, root=0, chunk_bytes=None,
                                channels=0)
    phases = plan_collective(request, cluster, "direct")
    efficiency = resolve_efficiency("calibrated", cluster.gpu_model)
    uplink = cluster.path(0, 8)[1]
    env, log = simpy.Environment(), EventLog()
    network = Network(env, cluster, efficiency=efficiency, log=log)
    network.scale_capacity([uplink], 0.3)
    env.process(run_plan(env, network, cluster, phases, ""))
    env.run()
    capacity = effective_capacity(cluster, efficiency).copy()
    capacity[uplink] *= 0.3
    alone = run_isolated(cluster, capacity, phases)
    c = log.flow_columns()
    assert (alone.duration_s, alone.rows.src.tolist(), alone.rows.dst.tolist()) == (
        env.now, c["src"].tolist(), c["dst"].tolist())
    assert alone.rows.end_s.tolist() == c["end_s"].tolist()
    on_uplink = np.array([uplink in route for route in log.flow_routes()])
    ends = np.asarray(c["end_s"])
    # GPU 0's 56 flows to other hosts at 0.3 of the uplink's rate take over 1/0.3 times the others' 1.26 ms
    assert on_uplink.sum() == 56 and ends[on_uplink].min() > 3 * ends[~on_uplink].max()


@pytest.mark.parametrize("capacity, kept", [([50.0, 10.0, 20.0, 5.0, 5.0], [1, 2, 3, 4]),
                                            ([10.0, 50.0, 20.0, 5.0, 5.0], [0, 2, 3, 4]),
                                            ([10.0, 10.0, 20.0, 5.0, 5.0], [0, 2, 3, 4])])
def test_a_link_is_dropped_only_beside_one_with_the_same_routes_and_no_more_capacity(capacity, kept):
    # Links 0 and 1 carry routes {0, 1}; links 3 and 4 one route each, not the same one. Only the wider of 0
    # and 1 goes (the first of equals stays), and every solve gives the same rates to the bit.
    routes = [(0, 1, 2), (0, 1, 4), (2, 3)]
    lengths = np.array([len(route) for route in routes])
    full = Incidence.of(lengths, np.concatenate(routes))
    capacity = np.array(capacity)
    lean = isolated.without_shadowed_links(full, capacity)
    assert lean.links.tolist() == kept
    for weight in ([1, 1, 1], [3, 1, 2], [0, 2, 5], [4, 0, 1]):
        assert lean.rates(np.array(weight), capacity).tolist() == full.rates(np.array(weight), capacity).tolist()
