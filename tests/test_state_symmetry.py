"""A job's states with links down that are rotations of each other by whole data-parallel replicas are simulated
once (reliability/symmetry.py), with the job's outputs byte-identical to simulating each; where the rotation is
not proven to map the step onto itself, none are merged."""

from __future__ import annotations

from itertools import combinations

import orjson
import pytest
from shared import RAILS, after_the_healthy_step

from simulator import simulate
from simulator.config.loader import scenario_from_text
from simulator.faults.rerouting import Rerouter
from simulator.reliability import simulate as reliability_simulate
from simulator.reliability import states
from simulator.reliability.blast import cluster_units
from simulator.reliability.simulate import prepare_job, simulate_job, sizing_text
from simulator.topology.loader import scenario_topology
from simulator.topology.periods import Rotation

LEAF_CLASS = """run: {horizon: 2 d, replications: 3, seed: 4}
faults:
  components:
    leaf_switch: {mtbf: 4 d, repair: 2 h, repair_distribution: fixed}
"""
LEAF_JOB = RAILS + LEAF_CLASS


def _leaf_links(leaf: str, hosts: tuple[int, int], rail: int) -> list[tuple[str, str]]:
    return [(leaf, f"h{host}/nic{rail}") for host in hosts] + [(leaf, f"spine{spine}") for spine in range(2)]


def test_detours_around_a_leaf_rotate_with_it():
    """Every route (both channels, every pair of GPUs) around leaf 1 of rail 6 down is the rotation by one leaf
    group of the route around leaf 0 of rail 6 down. The detours were picked by a hash of the absolute ends, and
    the two states' steps differed (37.3 against 29.4 ms)."""
    down = [_leaf_links("leaf0.r6", (0, 1), 6), _leaf_links("leaf1.r6", (2, 3), 6)]
    topologies = []
    for links in down:
        topology = scenario_topology(scenario_from_text(RAILS))
        Rerouter(topology).take_down(links)
        topologies.append(topology)
    first, second = topologies
    rotation = first.router.rotation()
    assert rotation is not None and rotation.period == 16
    moved = rotation.nodes(1)
    for src in range(32):
        for dst in range(32):
            for channel in (0, 1):
                if src != dst:
                    route = first.router(first, src, dst, channel)
                    assert [moved[node] for node in route] == second.router(
                        second, rotation.gpu(src, 1), rotation.gpu(dst, 1), channel)
    assert first.router.rerouted == second.router.rerouted > 0
    steps = [simulate(scenario_from_text(RAILS, "inline.yaml", ["faults.step.links=[" + ", ".join(
        f"{{link: [{a}, {b}]}}" for a, b in links) + "]"])).summary["step_time_s"] for links in down]
    assert steps[0] == steps[1]


SIMULATED = states.StepStates._simulated


def _job(monkeypatch, merge: bool) -> tuple[bytes, bytes, list[states.ClusterState]]:
    """The job's summary and events as bytes, and the states simulated, with rotations merged or not; on one
    core (no state ahead) and a fresh cache."""
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: 1)
    simulated: list[states.ClusterState] = []

    def counted(self, state, scenario, prepared):
        if state is not None:
            simulated.append(state)
        return SIMULATED(self, state, scenario, prepared)

    monkeypatch.setattr(states.StepStates, "_simulated", counted)
    job = simulate_job(scenario_from_text(LEAF_JOB), merge_rotations=merge)
    return orjson.dumps(job.summary), job.events.to_csv(index=False).encode(), simulated


def test_a_job_simulates_one_state_per_class_of_rotations_with_the_same_outputs(monkeypatch):
    """Three replications meet 17 states with leaves down, four of them rotations of others by two replicas
    (leaf 1 of a rail onto leaf 0): merged, the job simulates 13 and writes the same summary and events byte for
    byte as when it simulates all 17 (18 and 14 while a leaf in repair could fail again and add a state)."""
    merged_summary, merged_events, merged = _job(monkeypatch, True)
    each_summary, each_events, each = _job(monkeypatch, False)
    assert merged_summary == each_summary and merged_events == each_events
    link_states = orjson.loads(merged_summary)["link_states"]
    assert link_states["states"] == len(each) == 17 and link_states["steps"] == len(merged) == 13
    assert link_states["rotations"] == "rotations by 2 data-parallel replica(s) (2 of them, 16 GPUs apart)"
    assert link_states["not_merged_because"] is None


@pytest.mark.parametrize("text, why", [
    (RAILS.replace("nodes: 4, leaf_ports: 2", "nodes: 6, leaf_ports: 4").replace("dp: 4", "dp: 6"),
     "the cluster does not map onto itself by whole leaf groups"),
    (RAILS + "collectives: {algorithm: tree}\n", "all_reduce of group [0, 8, 16, 24]: a rotated copy is planned"),
])
def test_rotations_not_proven_merge_nothing(text, why, monkeypatch):
    """A partial last leaf group (six hosts in leaf groups of four) has no rotation onto itself; a tree all-reduce
    over the replicas is rooted at the first, so its rotated copy is planned otherwise. Each job's states with
    links down are then simulated each, and its summary says why."""
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    job_states = prepare_job(scenario_from_text(text + LEAF_CLASS)).states
    why_not = job_states.symmetry()
    assert isinstance(why_not, str) and why_not.startswith(why)
    units = cluster_units(job_states.topology)
    state = states.ClusterState(job_states.healthy.replicas,
                                links_down=tuple(sorted(units.links("leaf_switch", units.count("leaf_switch") - 1))))
    assert job_states.merged(state) == state
    assert job_states.symmetry_figures([state]) == {"states": 1, "steps": 1, "rotations": None,
                                                    "not_merged_because": why_not}


TWELVE_LEAF_GROUPS = RAILS.replace("nodes: 4, leaf_ports: 2", "nodes: 12, leaf_ports: 1").replace("dp: 4", "dp: 12")
"""Twelve hosts, each its own leaf group: twelve rotations by one replica, and leaf names (`leaf10.r0` before
`leaf2.r0`) that order otherwise than their groups."""


def _least_by_link_lists(symmetry, links: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The least image of ``links`` worked out by names: each rotation's node map applied to each pair, the pairs
    sorted, the least tuple kept."""
    images = []
    for power in range(symmetry.order):
        moved = symmetry.rotation.nodes(power * symmetry.turns)
        images.append(tuple(sorted((moved[a], moved[b]) for a, b in links)))
    return min(images)


def _no_node_maps(rotation, turns):
    raise AssertionError("a state's images were mapped node by node")


@pytest.mark.parametrize("text", [RAILS, TWELVE_LEAF_GROUPS], ids=["rails", "twelve-leaf-groups"])
def test_the_least_rotation_by_link_indices_is_the_one_by_link_lists(text, monkeypatch):
    """`StateSymmetry.representative` takes the least image on link indices, mapping no node names; it is the
    least tuple of node pairs over every rotation, for each leaf, NIC and cable down, every two leaves, wrapping
    states (the first leaf group's and the last's) and states of three units of kinds mixed. Each image was a
    tuple of node pairs built and sorted, 64 a state at 16,384 GPUs: 114 s of CPU (profiled) for the 16k job's
    19,663 states."""
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    job_states = prepare_job(scenario_from_text(text + LEAF_CLASS)).states
    symmetry = job_states.symmetry()
    assert not isinstance(symmetry, str)
    units = cluster_units(job_states.topology)
    downs = {kind: [units.links(kind, index) for index in range(units.count(kind))]
             for kind in ("leaf_switch", "nic", "cable")}
    leaves, nics, cables = downs["leaf_switch"], downs["nic"], downs["cable"]
    unit_sets = [(down,) for kind in downs.values() for down in kind] + list(combinations(leaves, 2))
    unit_sets += [(leaves[0], leaves[-1]), (leaves[-1], nics[0], cables[len(cables) // 2]),
                  (leaves[1], leaves[len(leaves) // 2], nics[-1])]
    link_sets = [tuple(sorted({pair for down in unit_set for pair in down})) for unit_set in unit_sets]
    with monkeypatch.context() as by_indices:
        by_indices.setattr(Rotation, "nodes", _no_node_maps)
        leasts = [symmetry.representative(links) for links in link_sets]
    merged = set()
    for links, least in zip(link_sets, leasts):
        assert least == _least_by_link_lists(symmetry, links)
        state = states.ClusterState(job_states.healthy.replicas, links_down=links)
        assert job_states.merged(state) == states.ClusterState(state.replicas, links_down=least)
        assert job_states.merged(job_states.merged(state)) == job_states.merged(state)
        merged.add(least)
    assert len(merged) < len(unit_sets)


def test_a_job_says_it_merges_and_sizes_the_states_foreseen(monkeypatch):
    """Between its foresight's count and its replications a job merges the states foreseen that are rotations of
    each other and sizes them: the 16,384-GPU job's 19,663 took minutes, the bar still at '100/100
    replications' all the while. Its activity says so, and is cleared once they are done."""
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: 1)
    heard: list[str] = []
    simulate_job(scenario_from_text(LEAF_JOB), activity=heard.append)
    assert after_the_healthy_step(heard)[:3] == [sizing_text(17), "", "replication 1/3"]
