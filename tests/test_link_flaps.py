"""Link faults that come back (`until`) and flap (`every`): each interval's rates and the completion times by hand on
two leaf groups joined by two spines, routes back for the transfers posted after, windows that miss the traffic,
partitions that heal, folding, refusals and the console's fault line."""

from __future__ import annotations

import json
import signal

import pytest
from shared import SCENARIOS, SPINES

from simulator import simulate
from simulator.cli import main
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.console.report import _step_faults
from simulator.engine.faults import FaultHooks
from simulator.engine.fold_policy import LINKS_DURING_STEP
from simulator.errors import SimulationError, StepAborted
from simulator.faults.step import LinkEvent, StepFaultPlan
from simulator.program.ops import CollectiveOp
from simulator.report.writers import scenario_digest
from simulator.simulation import NetworkSettings, run_ops
from simulator.topology.loader import load_topology

FABRIC = """
cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1,
          leaf_ports: 2, spines: 2, oversubscription: 2}
collectives: {channels: 1}
"""
"""Hosts 0 and 1 on leaf0.r0, hosts 2 and 3 on leaf1.r0, one GPU and one 50 GB/s NIC each; a leaf's two NICs over
its two uplinks at oversubscription 2 make each leaf-spine link 25 GB/s. By the fabric's hash, 0 -> 3 crosses
spine0 and 1 -> 2 spine1."""
RATE = 25e9 * 0.94
"""A flow alone on a leaf-spine link: 25 GB/s at the dgx-h100-cluster profile's InfiniBand efficiency."""
LATENCY = 2 * (3.25e-6 + 3.25e-6 + 0.5e-6)
"""A transfer's latency between leaf groups: GPU-NIC, NIC-leaf and leaf-spine links at both ends."""
GB = 1e9


def run(workload: str, faults: str = "", *overrides: str) -> dict:
    sets = [f"faults.step.links=[{faults}]"] if faults else []
    return simulate(scenario_from_text(FABRIC + workload, "inline.yaml", [*sets, *overrides])).summary


ONE_FLOW = "workload: [{name: p2p, op: send_recv, bytes: 1 GB, src: 0, dst: 3}]\n"
TWO_STREAMS = """workload: [{name: a, op: send_recv, bytes: 1 GB, src: 0, dst: 3, stream: a, repeat: 2},
           {name: b, op: send_recv, bytes: 1 GB, src: 1, dst: 2, stream: b, repeat: 2}]
"""


def test_a_link_degraded_for_a_window_slows_its_flow_only_in_it():
    """The flow runs at RATE, at RATE / 2 from 10 to 20 ms, then at RATE again: it falls RATE / 2 x 10 ms behind,
    5 ms at RATE, where the fault without `until` halves the rest of it."""
    assert run(ONE_FLOW)["makespan_s"] == pytest.approx(LATENCY + GB / RATE, rel=1e-12)
    window = run(ONE_FLOW, "{link: [leaf0.r0, spine0], capacity: 0.5, at: 10 ms, until: 20 ms}")
    assert window["makespan_s"] == pytest.approx(LATENCY + GB / RATE + 5e-3, rel=1e-12)
    lasting = run(ONE_FLOW, "{link: [leaf0.r0, spine0], capacity: 0.5, at: 10 ms}")
    assert lasting["makespan_s"] == pytest.approx(10e-3 + (GB - RATE * (10e-3 - LATENCY)) / (RATE / 2), rel=1e-12)


def test_a_link_down_for_a_window_detours_its_flow_and_gives_later_transfers_their_own_route():
    """a (0 -> 3, spine0) and b (1 -> 2, spine1) run at RATE each until spine0's link from leaf0.r0 goes down at
    10 ms; a's flow then takes the detour over spine1 and the two share leaf0.r0's uplink at RATE / 2 each to their
    end T, a on its detour after the link is back at 20 ms. The second transfers, posted at T, take their own
    spines again: RATE each. With the link down for good they share spine1 at RATE / 2."""
    shared_end = 10e-3 + (GB - RATE * (10e-3 - LATENCY)) / (RATE / 2)
    assert run(TWO_STREAMS)["makespan_s"] == pytest.approx(2 * (LATENCY + GB / RATE), rel=1e-12)
    flap = run(TWO_STREAMS, "{link: [leaf0.r0, spine0], at: 10 ms, until: 20 ms}")
    assert flap["makespan_s"] == pytest.approx(shared_end + LATENCY + GB / RATE, rel=1e-12)
    assert flap["faults"]["links"] == [{"link": "leaf0.r0-spine0", "at_s": 0.01, "until_s": 0.02, "capacity": 0.0}]
    lasting = run(TWO_STREAMS, "{link: [leaf0.r0, spine0], at: 10 ms}")
    assert lasting["makespan_s"] == pytest.approx(shared_end + LATENCY + 2 * GB / RATE, rel=1e-12)


def test_a_flapping_link_costs_each_window_and_repeats_to_the_step_end_without_a_count():
    """Half the link from 5 to 10 ms and again 10 ms later: each window costs RATE / 2 x 5 ms, 2.5 ms at RATE.
    Without a count every 10 ms period from 5 ms on carries RATE x (5 ms / 2 + 5 ms) = 176.25 MB: the flow has
    RATE x (5 ms - LATENCY) by 5 ms, five periods to 55 ms, and the rest at RATE / 2."""
    flap = "{link: [leaf0.r0, spine0], capacity: 0.5, at: 5 ms, until: 10 ms, every: 10 ms"
    twice = run(ONE_FLOW, flap + ", count: 2}")
    assert twice["makespan_s"] == pytest.approx(LATENCY + GB / RATE + 2 * 2.5e-3, rel=1e-12)
    assert twice["faults"]["links"][0] | {"link": ""} == {"link": "", "at_s": 5e-3, "until_s": 10e-3, "every_s": 10e-3,
                                                         "count": 2, "capacity": 0.5}
    period = RATE * 7.5e-3
    left = GB - RATE * (5e-3 - LATENCY) - 5 * period
    assert 0 < left < RATE / 2 * 5e-3
    assert run(ONE_FLOW, flap + "}")["makespan_s"] == pytest.approx(55e-3 + left / (RATE / 2), rel=1e-12)


@pytest.mark.parametrize("gpus", [["gpu0"], ["gpu0", "gpu1"]])
def test_a_link_flapping_to_the_step_end_leaves_a_deadlock_reported(gpus):
    """GPU 0 runs X then Y, GPU 1 Y then X: the engine runs out of events and says so, though the flaps could
    repeat for ever (they repeat only while anything but their own timers is left to run)."""
    topology = load_topology("dgx-h100")
    ops = [CollectiveOp(id=index, rank=rank, stream="comm", name=key, op="all_reduce", group=(0, 1), nbytes=2**20,
                        key=key) for index, (rank, key) in enumerate([(0, "X"), (0, "Y"), (1, "Y"), (1, "X")])]
    flaps = tuple(LinkEvent(1e-3, ((f"h0/{gpu}", "h0/nvswitch"),), 0.5, f"h0/{gpu}-h0/nvswitch", 2e-3, 10e-3)
                  for gpu in gpus)
    previous = signal.signal(signal.SIGALRM, _never_ends)
    signal.alarm(20)
    try:
        with pytest.raises(SimulationError, match="deadlock"):
            run_ops(topology, ops, NetworkSettings(), faults=FaultHooks(topology, StepFaultPlan(links=flaps)))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _never_ends(_signum: int, _frame: object) -> None:
    """A run still going after the alarm fails the test rather than hang it."""
    raise TimeoutError("the run never ended")


SPINES_STEP = SPINES
"""A DP 4 step over both leaf groups: its first flow starts after 1.2 ms of compute."""


@pytest.mark.parametrize("fault", ["{link: [leaf0.r0, spine0], until: 1 ms}",
                                   "{uplinks_of: leaf0.r0, capacity: 0.25, until: 1 ms}",
                                   "{uplinks_of: leaf0.r0, at: 0.5 ms, until: 1 ms}"])
def test_a_fault_window_that_misses_all_traffic_leaves_the_healthy_step(fault):
    healthy = simulate(scenario_from_text(SPINES_STEP)).summary
    faulted = simulate(scenario_from_text(SPINES_STEP, "inline.yaml", [f"faults.step.links=[{fault}]"])).summary
    assert faulted["step_time_s"] == healthy["step_time_s"]
    assert faulted["comm_s"] == healthy["comm_s"]
    assert faulted["faults"]["rerouted_routes"] == 0


def test_a_timed_link_fault_gives_the_fold_up_and_matches_the_unfolded_step():
    """A link down for the whole step folds (by the hosts near it) to the unfolded step's figures; one that comes
    back gives the fold up, saying why, and runs the unfolded step."""
    def step(fault: str, *overrides: str) -> dict:
        return simulate(scenario_from_text(SPINES_STEP, "inline.yaml",
                                           [f"faults.step.links=[{fault}]", *overrides])).summary

    lasting = "{link: [leaf0.r0, spine0]}"
    assert step(lasting)["folded"] and step(lasting)["step_time_s"] == step(lasting, "run.fold=false")["step_time_s"]
    for timed in ("{link: [leaf0.r0, spine0], until: 15 ms}", "{link: [leaf0.r0, spine0], at: 5 ms, until: 15 ms}"):
        folded, unfolded = step(timed), step(timed, "run.fold=false")
        assert not folded["folded"] and folded["simulated_ranks"] == 4
        assert folded["fold_given_up"][0]["reason"] == LINKS_DURING_STEP
        assert folded["step_time_s"] == unfolded["step_time_s"] and folded["comm_s"] == unfolded["comm_s"]
        assert healthy_step() < folded["step_time_s"] < step(lasting)["step_time_s"]


def healthy_step() -> float:
    return simulate(scenario_from_text(SPINES_STEP)).summary["step_time_s"]


INSIDE_THEN_ACROSS = """workload: [{name: inside, op: send_recv, bytes: 1 GB, src: 0, dst: 1},
           {name: across, op: send_recv, bytes: 1 GB, src: 0, dst: 2, after: [inside]}]
"""
"""GPU 0 sends to its leaf mate, then across the spines: cut off from the spines, it needs them only then."""


def test_a_partition_aborts_the_step_only_when_a_transfer_needs_it_while_it_lasts():
    healthy = run(INSIDE_THEN_ACROSS)
    inside_end = LATENCY - 2 * 0.5e-6 + GB / (50e9 * 0.94)  # over leaf0.r0 alone: NIC-leaf links at 50 GB/s
    healed = run(INSIDE_THEN_ACROSS, "{uplinks_of: leaf0.r0, until: 10 ms}")
    assert healed["makespan_s"] == healthy["makespan_s"]
    with pytest.raises(StepAborted) as aborted:
        run(INSIDE_THEN_ACROSS, "{uplinks_of: leaf0.r0, until: 30 ms}")
    assert aborted.value.at_s == pytest.approx(inside_end, rel=1e-12)
    assert aborted.value.reason == "uplinks of leaf0.r0 down: h0/gpu0 cannot reach h2/gpu0"
    with pytest.raises(StepAborted) as lasting:  # down for the rest of the step: at once, as any split
        run(INSIDE_THEN_ACROSS, "{uplinks_of: leaf0.r0, at: 5 ms}")
    assert lasting.value.at_s == 5e-3
    with pytest.raises(StepAborted) as in_flight:  # a flow on the links when they go down
        run(ONE_FLOW, "{uplinks_of: leaf0.r0, at: 10 ms, until: 20 ms}")
    assert in_flight.value.at_s == 10e-3


@pytest.mark.parametrize("fault,problem", [
    ("{link: [leaf0.r0, spine0], at: 5 ms, until: 5 ms}",
     "faults.step.links[0].until: 5 ms is not after at (5 ms) (allowed: a time after 5 ms, e.g. 15 ms)"),
    ("{uplinks_of: leaf0.r0, at: 5 ms, until: 2 ms}",
     "faults.step.links[0].until: 2 ms is not after at (5 ms) (allowed: a time after 5 ms, e.g. 15 ms)"),
    ("{link: [leaf0.r0, spine0], until: 5}", "faults.step.links[0].until: "),
    ("{link: [leaf0.r0, spine0], at: 5 ms, every: 10 ms}", "faults.step.links[0].every: a fault repeats only once it "
     "has ended (allowed: until, the end of its first time, e.g. until: 15 ms)"),
    ("{link: [leaf0.r0, spine0], at: 5 ms, until: 10 ms, every: 5 ms}", "faults.step.links[0].every: 5 ms is not "
     "longer than the fault (5 ms): the link would never come back (allowed: a period longer than 5 ms)"),
    ("{link: [leaf0.r0, spine0], until: 10 ms, count: 2}", "faults.step.links[0].count: count is how many times a "
     "fault repeats every period (allowed: every, a period, e.g. every: 100 ms)"),
])
def test_a_bad_until_is_one_located_line(tmp_path, capsys, fault, problem):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(FABRIC.lstrip("\n") + ONE_FLOW + "faults:\n  step:\n    links: [" + fault + "]\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: {scenario}:7: {problem}")
    if fault.endswith("until: 5}"):
        assert "has no unit" in err


def test_the_fault_line_says_when_a_link_comes_back(tmp_path, capsys):
    scenario = tmp_path / "flap.yaml"
    scenario.write_text(FABRIC + TWO_STREAMS + "faults: {step: {links: [{link: [leaf0.r0, spine0], at: 10 ms, "
                        "until: 20 ms}]}}\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("step faults:"))
    assert line == "step faults: leaf0.r0-spine0 down from 10 ms to 20 ms (1 route rerouted)"
    flaps = {"links": [{"link": "leaf0.r0-spine0", "at_s": 5e-3, "until_s": 10e-3, "every_s": 0.1, **count,
                        "capacity": 0.5} for count in ({"count": 3}, {})]}
    assert _step_faults(flaps, end_s=1.0) == (
        "leaf0.r0-spine0 degraded to 50.0% from 5 ms to 10 ms, every 100 ms (3 times), "
        "leaf0.r0-spine0 degraded to 50.0% from 5 ms to 10 ms, every 100 ms to the step's end")


def test_a_link_fault_without_until_reads_and_hashes_as_one_before_them(tmp_path):
    """summary.json names until_s, every_s and count only where set, and the scenario that scenario_sha256 hashes
    leaves them out where unset, so they move no digest where they are not used (a resumed sweep reuses its points
    unless another field changed)."""
    scenario = SCENARIOS / "faults-straggler-and-spine-link.yaml"
    assert main(["run", str(scenario), "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["faults"]["links"] == [{"link": "leaf0.r0-spine0", "at_s": 5e-3, "capacity": 0.0}]
    loaded = load_scenario(scenario)
    assert loaded.scenario.model_dump(mode="json")["faults"]["step"]["links"] == [
        {"link": ["leaf0.r0", "spine0"], "uplinks_of": None, "at": 5e-3, "capacity": 0.0}]
    digest = scenario_digest(loaded)
    assert scenario_digest(load_scenario(scenario, ["faults.step.links[0].until=10 ms"])) != digest
