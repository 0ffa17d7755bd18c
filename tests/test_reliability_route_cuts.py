"""A `degrade` failure that leaves some GPU without a route interrupts the job, so the closed forms count it
(reliability/cuts.py): the expected interruptions, the system MTBF and Young's and Daly's intervals.

Hand figures: the bundled trace job (8 single-GPU hosts under one 100 GbE leaf, host
MTBF 2000 h, 4 h repairs, no spare, 30 d) with `leaf_switch: {mtbf: 200 h, repair: 4 h}` expects
8 x 720 / 2004 = 2.874 host interruptions (no spare: the job waits for a host in repair, which does not fail) and
1 x 720 / (200 + 4) = 3.529 leaf interruptions (a leaf repaired in place fails once per MTBF + repair), 6.404 in
all; while the job trains every host and the leaf are up, so M = 1 / (8 / 2000 h + 1 / 200 h) = 111.1 h
(400,000 s); the 270 MB checkpoint leaves the 8 hosts at their one NIC's 12.5 GB/s, C = 270 MB / (8 x 12.5 GB/s)
= 2.7 ms, so Young sqrt(2 x 2.7 ms x 400,000 s) = 46.48 s. A NIC degrading on those one-NIC hosts (MTBF
1000 h, 4 h repairs) expects 8 x 720 / 1004 = 5.737, M = 125.0 h. The
last spine of two (each MTBF 100 h, 12 h exponential repairs) over single-NIC hosts under two leaves interrupts
when the other is down: 2 x 720 / 112 x 12 / 112 = 1.378 a replication.
"""

from __future__ import annotations

import math

import pytest
from shared import ONE_GPU_HOSTS, SCENARIOS, inside

from simulator.config.loader import load_scenario, scenario_from_text
from simulator.faults.rerouting import split
from simulator.reliability.blast import cluster_units
from simulator.reliability.components import failure_model
from simulator.reliability.cuts import RouteCuts, both_ways, interrupting_shares
from simulator.reliability.simulate import _own_links_down, simulate_job
from simulator.topology.loader import scenario_topology

TRACE_JOB = SCENARIOS / "trace-job.yaml"


def trace_job(*settings: str) -> dict:
    return simulate_job(load_scenario(TRACE_JOB, list(settings))).summary


def test_the_scenarios_links_down_with_a_units_are_those_that_stay_down():
    """A unit's links split the GPUs in every state with the scenario's lasting link faults down beside them; a
    fault that comes back (`until`) aborts a state's step only where a transfer crosses the split meanwhile."""
    loaded = load_scenario(SCENARIOS / "faults-straggler-and-spine-link.yaml",
                           ["faults.step.links=[{link: [leaf0.r0, spine0], at: 5 ms}, "
                            "{link: [leaf1.r0, spine1], at: 1 ms, until: 2 ms}]"])
    assert _own_links_down(loaded, scenario_topology(loaded)) == set(both_ways([("leaf0.r0", "spine0")]))


def test_a_leaf_over_single_nic_hosts_counts_in_the_mtbf_and_young_daly():
    summary = trace_job("run.replications=40", "faults.components.leaf_switch={mtbf: 200 h, repair: 4 h}")
    expected = 8 * 720 / 2004 + 720 / 204
    mtbf = 3600 / (8 / 2000 + 1 / 200)  # while the job trains every host and the leaf are up: 111.1 h
    assert summary["expected_unexpected_interruptions"] == pytest.approx(expected, rel=1e-12)
    assert summary["failure_model"]["leaf_switch"]["interrupting_units"] == 1.0
    assert summary["mtbf_s"] == pytest.approx(mtbf, rel=1e-12)
    cost = summary["young_daly_cost_s"]
    assert cost == pytest.approx(270e6 / (8 * 12.5e9), rel=1e-6)
    assert summary["young_interval_s"] == pytest.approx(math.sqrt(2 * cost * mtbf), rel=1e-12)  # 46.48 s
    assert summary["daly_interval_s"] == pytest.approx(46.47, abs=0.01)
    assert inside(expected, summary["interruptions"]["unexpected"], 1.2)
    assert inside(720 / 204, summary["interruptions"]["by_cause"]["leaf_switch"], 1.0)


def test_a_nic_degrading_on_one_nic_hosts_interrupts_in_the_closed_forms():
    summary = trace_job("run.replications=20",
                        "faults.components={nic: {mtbf: 1000 h, repair: 4 h, effect: degrade}}")
    assert summary["expected_unexpected_interruptions"] == pytest.approx(8 * 720 / 1004, rel=1e-12)
    assert summary["mtbf_s"] == pytest.approx(1000 / 8 * 3600.0, rel=1e-12)
    assert summary["young_interval_s"] == pytest.approx(math.sqrt(2 * summary["young_daly_cost_s"] * 1000 / 8 * 3600.0),
                                                        rel=1e-12)
    assert inside(8 * 720 / 1004, summary["interruptions"]["unexpected"], 1.5)


def test_the_last_spine_counts_the_chance_the_other_is_down():
    """Two spines under heavy load (MTBF 10 h, 12 h repairs): each fails 720 / (10 + 12) times (none while in
    repair) and interrupts where the other is down, 12 / 22 of the time: 2 x 720 / 22 x 12 / 22 = 35.70
    interruptions a replication, and 200 replications simulate it."""
    text = ONE_GPU_HOSTS + """
run: {horizon: 30 d, replications: 200, seed: 5}
faults:
  components:
    spine_switch: {mtbf: 10 h, repair: 12 h}
"""
    summary = simulate_job(scenario_from_text(text, "spines.yaml")).summary
    expected = 2 * 720 / 22 * 12 / 22
    assert summary["expected_unexpected_interruptions"] == pytest.approx(expected, rel=1e-9)
    assert inside(expected, summary["interruptions"]["unexpected"], 2.2)


@pytest.mark.parametrize(("settings", "all_cleared"), [
    (["cluster.nodes=128", "workload.dp=128"], False),  # single-NIC hosts under two leaves: every NIC and leaf cuts
    (["cluster.nodes=128", "workload.dp=128", "cluster.spines=1"], False),  # and each leaf-spine cable
    (["cluster.topology=dgx-h100-cluster", "cluster.nodes=8", "workload.dp=64", "cluster.spines=1"], False),  # PXN:
    # none cuts, but a cable under the single spine is a bridge, left to the reachability check
    (["cluster.topology=dgx-h100-cluster", "cluster.nodes=8", "workload.dp=64", "cluster.spines=2"], True),
])
def test_the_linear_test_agrees_with_the_reachability_check_on_every_unit(settings, all_cleared):
    """Every unit the linear test clears cuts nothing; on the DGX fabric (PXN) of two spines it clears every
    unit itself, leaving none to the reachability check."""
    topology = scenario_topology(load_scenario(TRACE_JOB, settings))
    units, cuts = cluster_units(topology), RouteCuts(topology, set())
    assert cuts.fast
    for kind in ("nic", "leaf_switch", "cable", "spine_switch"):
        for unit in range(units.count(kind)):
            links = units.links(kind, unit)
            assert cuts.cuts(links) == bool(split(topology, both_ways(links))), (kind, unit)
            if all_cleared:
                assert cuts._cleared(links), (kind, unit)


def gb200_trace_job(racks: int, trays: int, algorithm: str, component: str, *settings: str):
    """The bundled trace, 72 data-parallel replicas a GB200 NVL72 rack of ``trays`` NVSwitch trays."""
    text = f"""
cluster: {{topology: gb200-nvl72, racks: {racks}, nvswitch_trays: {trays}}}
workload:
  trace: {TRACE_JOB.parent}/traces/allreduce-2rank/rank*.json
  format: kineto
  dp: {72 * racks}
  tokens_per_step: 8192
collectives: {{algorithm: {algorithm}}}
run: {{horizon: 30 d, replications: 10}}
faults: {{components: {{nvswitch_tray: {component}}}}}
checkpoint: {{size: 270 MB, interval: 10 min}}
"""
    return scenario_from_text(text, "gb200-trace-job.yaml", list(settings))


def test_a_lone_racks_only_nvswitch_tray_interrupts_in_the_closed_forms():
    """One rack of one tray (MTBF 500 h, 4 h repairs): every tray failure leaves the rack without NVLink and no
    route, so 720 / 504 = 1.429 interruptions a replication (none while the tray is in repair), M = 500 h (the job
    trains only with the tray up)."""
    summary = simulate_job(gb200_trace_job(1, 1, "auto", "{mtbf: 500 h, repair: 4 h}")).summary
    assert summary["failure_model"]["nvswitch_tray"]["interrupting_units"] == 1.0
    assert summary["expected_unexpected_interruptions"] == pytest.approx(720 / 504, rel=1e-12)
    assert summary["mtbf_s"] == pytest.approx(500 * 3600.0, rel=1e-12)
    assert summary["young_interval_s"] == pytest.approx(math.sqrt(2 * summary["young_daly_cost_s"] * 500 * 3600.0),
                                                        rel=1e-12)
    assert inside(720 / 504, summary["interruptions"]["unexpected"], 1.0)


@pytest.mark.parametrize(("racks", "algorithm", "interrupts"), [
    (1, "auto", True),  # a lone rack with every tray down has no route
    (2, "auto", False),  # across racks the GPUs reach each other through their trays' NICs
    (2, "nvls", True),  # NVLS forced: a rack with every tray down has no step
])
def test_a_trays_share_is_the_chance_the_racks_other_trays_are_down(racks, algorithm, interrupts):
    """Three trays a rack, each MTBF 10 h, 12 h repairs: a tray interrupts where its rack's two others are down,
    each 12 / 22 of the time: (12 / 22)^2 = 0.2975 of its failures, on every rack."""
    loaded = gb200_trace_job(racks, 3, algorithm, "{mtbf: 10 h, repair: 12 h}")
    topology = scenario_topology(loaded)
    classes = failure_model(loaded.scenario.faults).classes
    shares = interrupting_shares(topology, cluster_units(topology), classes, set(), algorithm == "nvls")
    share = (12 / 22) ** 2 if interrupts else 0.0
    assert shares == ((pytest.approx(share, rel=1e-12),) * 3 * racks,)
