"""On a rail-optimized fabric the rails are alike, and so are the detours around a link down on any of them: the
rerouter picks each detour in the frame of its source's rail (faults/rerouting.py, topology/periods.py
`RailRotation`), so the same failure costs the same on every rail."""

from __future__ import annotations

import pytest

from simulator import simulate
from simulator.config.loader import scenario_from_text
from simulator.faults.rerouting import Rerouter
from simulator.topology.loader import scenario_topology
from simulator.topology.periods import RailRotation

UNIFORM = """cluster: {topology: dgx-h100-cluster, nodes: 8, leaf_ports: 8, spines: 4}
model: {layers: 2, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 2}
parallelism: {tp: 8, dp: 8}
collectives: {channels: 2}
run: {timeline: summary}
"""
"""Eight DGX H100 under one leaf group (a leaf a rail), TP 8 over each host's rails, DP 8 along each rail."""


def _cable(host: int, rail: int) -> str:
    return f"{{link: [h{host}/nic{rail}, leaf0.r{rail}]}}"


def test_the_same_cable_down_on_each_rail_is_the_same_step():
    """The cable between h5's NIC and its leaf down, rail by rail: picked by a hash of the absolute ends, the
    detours of rails 2, 3, 5, 6 and 7 sent both channels through one peer NIC and took 4.4% longer than those of
    rails 0, 1 and 4."""
    steps = [simulate(scenario_from_text(UNIFORM, "inline.yaml", [f"faults.step.links=[{_cable(5, rail)}]"]))
             .summary["step_time_s"] for rail in range(8)]
    assert max(steps) == pytest.approx(min(steps), rel=1e-12)


SHRUNK = UNIFORM.replace("nodes: 8, leaf_ports: 8, spines: 4",
                         "nodes: 5, fabric_hosts: 12, leaf_ports: 2, tiers: 3, pods: 3").replace("dp: 8", "dp: 5")
"""Five DGX H100 on the three-tier fabric wired for twelve (an elastic shrink's shape): leaves without hosts."""


def test_a_fabric_wired_for_more_hosts_shifts_its_rails_too():
    """The leaves without hosts map by their rail, so the shrunk fabric has its rail shift and h1's NIC cable down costs
    the same on every rail (without the shift rail 5's step would be 6.8% below rail 0's)."""
    topology = scenario_topology(scenario_from_text(SHRUNK))
    rails = RailRotation.of(topology)
    assert rails is not None and rails.turns == 8
    steps = [simulate(scenario_from_text(SHRUNK, "inline.yaml", [
        f"faults.step.links=[{_cable(1, rail)}]"])).summary["step_time_s"] for rail in range(8)]
    assert max(steps) == pytest.approx(min(steps), rel=1e-12)


def test_detours_around_a_nic_move_with_its_rail():
    """Every route (both channels, every pair of GPUs) around h5's NIC cable on rail 3 is the shift by three rails
    of the route around the cable on rail 0."""
    routers = []
    for rail in (0, 3):
        topology = scenario_topology(scenario_from_text(UNIFORM))
        Rerouter(topology).take_down([(f"h5/nic{rail}", f"leaf0.r{rail}")])
        routers.append((topology, topology.router))
    (first, first_router), (second, second_router) = routers
    rails = RailRotation.of(first, first_router.base)
    assert rails is not None and rails.turns == 8
    moved = rails.nodes(3)
    for src in range(first.num_gpus):
        for dst in range(first.num_gpus):
            for channel in (0, 1):
                if src != dst:
                    assert [moved[node] for node in first_router(first, src, dst, channel)] == second_router(
                        second, rails.gpu(src, 3), rails.gpu(dst, 3), channel)
    assert first_router.rerouted == second_router.rerouted > 0


def test_a_fabric_whose_hosts_share_one_nic_has_no_rail_shift():
    """With one NIC a host there is one rail: no shift, and detours are picked from the ends."""
    plain = UNIFORM.replace("leaf_ports: 8", "leaf_ports: 8, nics_per_node: 1")
    topology = scenario_topology(scenario_from_text(plain))
    assert RailRotation.of(topology) is None
