"""Rack and NVSwitch tray failures on GB200 NVL72: a `rack` takes its compute trays (a job restarts, an elastic
one shrinks by the rack), an `nvswitch_tray` leaves the rack's GPUs (T - k) / T of their NVLink bandwidth with k
of its T trays down (their links to the rack's NVSwitch node degraded, as the step-fault engine degrades a link),
and neither has a published failure rate, so a scenario naming one gives its own."""

from __future__ import annotations

import pytest
from shared import THROTTLE_CLASSES, H, after_the_healthy_step, assert_same_figures, gb200_job

from simulator import simulate
from simulator.cli import main
from simulator.config.faults import LinkFault, StepFaults, Straggler
from simulator.config.loader import scenario_from_text
from simulator.errors import ScenarioError
from simulator.reliability.attribution import cause_shares
from simulator.reliability.blast import cluster_units
from simulator.reliability.perturbed import with_step_faults
from simulator.reliability.states import nvswitch_tray_faults
from simulator.topology.loader import scenario_topology

# simulate() on a job's scenario warns that it runs one step: these tests mean that step
pytestmark = pytest.mark.filterwarnings("ignore:.*runs one training step and ignores the job's:UserWarning")


CLASSES = "rack: {mtbf: 1000 d, repair: 4 h}, nvswitch_tray: {mtbf: 1000 d, repair: 2 h}"
NIC_CLASSES = "rack: {mtbf: 1000 d, repair: 4 h}, nic: {mtbf: 1000 d, repair: 3 h, effect: degrade}"
ONE_RACK_RING = """cluster: {{topology: gb200-nvl72, trays: 4, nvls: none}}
network: {{model: flow}}
collectives: {{algorithm: ring}}
workload:
  - {{name: ar, op: all_reduce, bytes: {size}, group: all}}
"""


def two_stages(text: str) -> str:
    """A `job` as TP 4 x PP 2 x DP 4."""
    return text.replace("{tp: 4, dp: 8}", "{tp: 4, pp: 2, dp: 4}")


def three_racks_two_stages(text: str) -> str:
    """A `job` on 3 racks as TP 4 x PP 2 x DP 6."""
    return two_stages(text).replace("racks: 2,", "racks: 3,").replace("pp: 2, dp: 4}", "pp: 2, dp: 6}")


def lone_rack(text: str) -> str:
    """A `job` on one rack (no network): DP 4."""
    return text.replace("racks: 2, trays: 4, leaf_ports: 4, spines: 2", "trays: 4").replace("dp: 8", "dp: 4")


def three_racks(text: str) -> str:
    """A `job` on 3 racks: DP 12."""
    return text.replace("racks: 2,", "racks: 3,").replace("dp: 8", "dp: 12")


def test_a_rack_takes_its_trays_and_an_nvswitch_tray_no_host():
    """2 racks of 4 trays: 2 rack units, each taking its 4 hosts (16 GPUs); 9 NVSwitch trays per rack, 18 units
    taking no host, each naming its rack's NVSwitch node. A DGX fat tree has neither."""
    units = cluster_units(scenario_topology(scenario_from_text(gb200_job(CLASSES), "job.yaml")))
    assert units.count("rack") == 2 and units.blast["rack"] == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert units.gpus["rack"] == (tuple(range(16)), tuple(range(16, 32)))
    assert units.count("nvswitch_tray") == 18 and set(units.blast["nvswitch_tray"]) == {()}
    assert units.nodes["nvswitch_tray"] == ("rack0/nvswitch",) * 9 + ("rack1/nvswitch",) * 9
    dgx = cluster_units(scenario_topology(scenario_from_text("cluster: {topology: dgx-h100-cluster, nodes: 2}\n"
                                                             "model: {preset: llama3-8b}\n", "dgx.yaml")))
    assert dgx.count("rack") == dgx.count("nvswitch_tray") == 0


def all_reduce(nbytes: str, algorithm: str, trays_down: int) -> float:
    """The makespan of an all-reduce of ``nbytes`` over one rack of 4 trays (16 GPUs) with ``trays_down`` of its
    9 NVSwitch trays down."""
    nvls = "nvswitch3" if algorithm == "nvls" else "none"
    loaded = scenario_from_text(f"""cluster: {{topology: gb200-nvl72, trays: 4, nvls: {nvls}}}
network: {{model: flow}}
collectives: {{algorithm: {algorithm}}}
workload:
  - {{name: ar, op: all_reduce, bytes: {nbytes}, group: all}}
""", "ar.yaml")
    faults = nvswitch_tray_faults(scenario_topology(loaded), (("rack0/nvswitch", trays_down),) if trays_down else ())
    return simulate(with_step_faults(loaded, StepFaults(links=faults))).summary["makespan_s"]


@pytest.mark.parametrize("algorithm", ["ring", "nvls"])
@pytest.mark.parametrize("trays_down", [1, 3])
def test_nvswitch_trays_down_slow_an_all_reduce_in_the_rack_by_the_bandwidth_they_take(algorithm, trays_down):
    """Bandwidth-bound, a ring all-reduce takes 2(p-1) a + 2(p-1)/p n / B and NVLS L + (p+1)/p n / (B e): with k of
    9 NVSwitch trays down each GPU's NVLink bandwidth B is (9 - k)/9 of it, so busbw drops by that factor and the
    time a byte takes grows by 9 / (9 - k). The difference of two sizes cancels the latency terms: it comes out 9/8
    (one tray) and 3/2 (three) to 1e-12."""
    extra = {size: all_reduce(size, algorithm, trays_down) - all_reduce(size, algorithm, 0)
             for size in ("256 MiB", "1 GiB")}
    healthy = all_reduce("1 GiB", algorithm, 0) - all_reduce("256 MiB", algorithm, 0)
    degraded = healthy + extra["1 GiB"] - extra["256 MiB"]
    assert degraded / healthy == pytest.approx(9 / (9 - trays_down), rel=1e-12)


@pytest.mark.parametrize(("racks", "trays_down"), [(2, 1), (2, 3), (3, 4)])
def test_a_step_with_nvswitch_trays_down_folds_by_the_rack_they_degrade(racks, trays_down):
    """TP 4 x PP 2 x DP 2 per rack on 2 or 3 racks of 4 trays, trays of rack 1 down: its GPU links degraded from
    the step's start fold as links down do (`fold_policy.link_fault_step`), the rack's 16 ranks apart and one per
    tray position and stage elsewhere, 24 of 32 or 48 ranks, the step time the unfolded one's to the bit and every
    other figure to the rounding of a weighted mean. On 3 racks the degraded rack's TP groups meet the DP tree
    otherwise than another rack's, which the unequal-traffic check leaves aside: they are simulated apart
    (refused from c57a4b1f's stricter check until the copies simulated apart were left out of it)."""
    job = two_stages(gb200_job(CLASSES)) if racks == 2 else three_racks_two_stages(gb200_job(CLASSES))
    text = job + "network: {model: flow}\n"
    loaded = scenario_from_text(text, "job.yaml")
    faults = StepFaults(links=nvswitch_tray_faults(scenario_topology(loaded), (("rack1/nvswitch", trays_down),)))
    folded, unfolded = (simulate(with_step_faults(scenario_from_text(text, "job.yaml", overrides), faults)).summary
                        for overrides in ([], ["run.fold=false"]))
    assert folded["folded"] and folded["simulated_ranks"] == 24 and unfolded["simulated_ranks"] == 16 * racks
    assert folded["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(folded, unfolded, 1e-12, 1e-15)


def test_a_job_sizes_its_nvswitch_tray_states_by_their_fold(monkeypatch):
    """The job of the test above on 3 racks (TP 4 x PP 2 x DP 6) with limits that its step folded by the rack's
    hosts (24 of 48 ranks) passes and unfolded does not, nor any state that unfolds: refused up front, naming the
    first count of trays down whose state does not fold (9 of 9: links down, `first_tray_fold_blocker`)."""
    import simulator.scale as scale
    from simulator.reliability.simulate import prepare_job

    loaded = scenario_from_text(three_racks_two_stages(gb200_job(CLASSES)), "job.yaml")
    estimate = scale.classed_estimate(loaded, 48, 24)
    assert estimate is not None
    monkeypatch.setattr(scale, "MAX_EVENTS", estimate.events)
    assert scale.unfolded_beyond_limits(loaded, 48) is not None
    with pytest.raises(ScenarioError, match="9 of a rack's 9 NVSwitch trays down: all_reduce 'tp all_reduce"):
        prepare_job(loaded)


def test_the_tray_fold_checks_stop_at_the_first_blocker_and_show_on_the_bar(monkeypatch):
    """The job above is refused by the fold of 9 trays down: its checks build the steps of 1-9 trays down, one
    each, and the bar shows them (`TRAY_FOLDS_ACTIVITY`, then '')."""
    import simulator.scale as scale
    import simulator.simulation as simulation
    from simulator.reliability.simulate import TRAY_FOLDS_ACTIVITY, prepare_job

    loaded = scenario_from_text(three_racks_two_stages(gb200_job(CLASSES)), "job.yaml")
    estimate = scale.classed_estimate(loaded, 48, 24)
    assert estimate is not None
    monkeypatch.setattr(scale, "MAX_EVENTS", estimate.events)
    built = []
    prepare_training = simulation.prepare_training
    monkeypatch.setattr(simulation, "prepare_training", lambda *args: built.append(args) or prepare_training(*args))
    heard: list[str] = []
    with pytest.raises(ScenarioError, match="9 of a rack's 9"):
        prepare_job(loaded, activity=heard.append)
    assert len(built) == 9
    assert after_the_healthy_step(heard) == [TRAY_FOLDS_ACTIVITY, ""]


@pytest.mark.parametrize(("racks", "trays_down"), [(3, 9), (2, 9)])
def test_a_tray_state_whose_fold_is_given_up_is_known_at_load(racks, trays_down):
    """TP 4 x PP 2 x DP 2 per rack (2 or 3 racks): with all 9 of rack 0's trays down (links down, rerouted over the
    network, the tree planned by tray) the TP all-reduce meets the traffic of the DP tree over the detours, whose
    racks send unlike amounts, otherwise than its copy in another rack; the state's step runs unfolded (every
    rank). `tray_fold_blocker` says so, from the fold alone, with the links down taken down first, and not for 1
    or 4 (links degraded), which fold: the degraded rack's copies meet the tree otherwise too, but its ranks are
    simulated apart, each with all its traffic."""
    from simulator.reliability.simulate import tray_fold_blocker

    job = two_stages(gb200_job(CLASSES)) if racks == 2 else three_racks_two_stages(gb200_job(CLASSES))
    text = job + "network: {model: flow}\n"
    loaded = scenario_from_text(text, "job.yaml")
    topology = scenario_topology(loaded)
    blockers = {down: tray_fold_blocker(loaded, cluster_units(topology), down) for down in (1, 4, trays_down)}
    assert blockers[1] is None and blockers[4] is None
    faults = StepFaults(links=nvswitch_tray_faults(topology, (("rack0/nvswitch", trays_down),)))
    summary = simulate(with_step_faults(loaded, faults)).summary
    assert summary["simulated_ranks"] == 16 * racks
    assert "tp all_reduce embedding" in blockers[trays_down]


def test_an_nvswitch_tray_down_slows_the_job_until_its_repair_without_a_restart(job_with):
    """NVSwitch tray 4 of rack 1 fails at 1 h, repaired at 3 h: no interruption, no host lost; the job trains
    meanwhile at the step of its cluster with rack 1's GPU links to its NVSwitch at 8/9 of their bandwidth, which
    is `simulate()` of the scenario with those links degraded, slower than the healthy step; the slow time is the
    class's."""
    result = job_with(gb200_job(CLASSES), (1 * H, 1, 13, 2 * H))
    summary = result.summary
    assert summary["interruptions"]["unexpected"]["mean"] == 0
    healthy, degraded = summary["states"]
    assert degraded["nvswitch_trays_down"] == {"rack1/nvswitch": 1} and degraded["replicas"] == 8
    loaded = scenario_from_text(gb200_job(CLASSES), "job.yaml")
    faults = nvswitch_tray_faults(scenario_topology(loaded), (("rack1/nvswitch", 1),))
    assert len(faults) == 16 and {fault.capacity for fault in faults} == {8 / 9}
    alone = simulate(with_step_faults(loaded, StepFaults(links=faults))).summary["step_time_s"]
    assert degraded["step_time_s"] == alone > healthy["step_time_s"]
    rows = result.events[result.events["kind"] == "degraded"]
    assert list(rows["cause"]) == ["nvswitch_tray"] and list(rows["end_s"] - rows["start_s"]) == [2 * H]
    assert summary["slow_steps_by_cause_s"]["nvswitch_tray"]["mean"] > 0


def test_nvswitch_trays_down_one_after_another_slow_the_job_more_until_nvlink_is_gone(job_with):
    """The 9 trays of rack 0 fail 0.1 h apart, each back 2 h later: each tray more down is a slower state (the
    rack's GPU links at 8/9, 7/9, ... of their bandwidth). With all 9 down rack 0's GPUs have no NVLink left and
    reach each other through their trays' NICs over the network: the job runs on, at the step of its cluster with
    every tray of rack 0 down (2.03 times the healthy one, measured). On a lone rack, which has no network, that
    state has no route: the job stops in a restart until the first tray is back."""
    rows = [((1 + 0.1 * tray) * H, 1, tray, 2 * H) for tray in range(9)]
    summary = job_with(gb200_job(CLASSES), *rows).summary
    assert summary["interruptions"]["unexpected"]["mean"] == 0
    steps = [state["step_time_s"] for state in summary["states"]]
    assert [state["nvswitch_trays_down"].get("rack0/nvswitch", 0) for state in summary["states"]] == list(range(10))
    assert steps == sorted(steps) and len(set(steps)) == 10
    loaded = scenario_from_text(gb200_job(CLASSES), "job.yaml")
    all_down = nvswitch_tray_faults(scenario_topology(loaded), (("rack0/nvswitch", 9),))
    assert steps[-1] == simulate(with_step_faults(loaded, StepFaults(links=all_down))).summary["step_time_s"]
    lone = lone_rack(gb200_job(CLASSES))
    summary = job_with(lone, *rows).summary
    assert summary["interruptions"]["by_cause"]["nvswitch_tray"]["mean"] == 1
    assert {state["nvswitch_trays_down"].get("rack0/nvswitch", 0) for state in summary["states"]} == set(range(9))


def test_an_elastic_job_losing_a_rack_shrinks_by_the_rack(job_with):
    """Rack 0 fails at 1 h (4 h repair): its 4 trays, 4 of the 8 one-tray replicas, leave; with no spares the
    elastic job restarts on 4 replicas, a whole rack fewer, and runs on them to the horizon (it grows back at its
    next restart, which never comes). A job that is not elastic waits the repair out in its restart."""
    summary = job_with(gb200_job(CLASSES), (1 * H, 0, 0, 4 * H)).summary
    assert summary["replicas"]["shrinks"]["mean"] == 1
    assert set(summary["replicas"]["running_s"]) == {"4", "8"}
    assert summary["interruptions"]["by_cause"]["rack"]["mean"] == 1
    fixed = job_with(gb200_job(CLASSES, elastic=False), (1 * H, 0, 0, 4 * H)).summary
    assert set(fixed["replicas"]["running_s"]) == {"8"}
    assert fixed["restart_waiting_for_hosts_s"]["mean"] == pytest.approx(4 * H - 60, rel=1e-9)


@pytest.mark.parametrize("name, unit", [("rack", "a GB200 NVL72 rack"), ("nvswitch_tray", "an NVLink switch tray")])
def test_a_class_without_a_published_rate_must_be_given_one(tmp_path, capsys, name, unit):
    """No public failure rate exists for a rack or an NVSwitch tray: a class without mtbf or rate is refused in
    one located line saying so, nothing invented."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(gb200_job(f"{name}: {{repair: 4 h}}"))
    assert main(["validate", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {scenario}:8: faults.components.{name}: give one of mtbf and rate (no public "
                          f"failure rate of {unit} exists: ") and err.count("\n") == 1


def test_nvls_forced_with_every_tray_of_a_rack_down_waits_for_a_tray(tmp_path, capsys, job_with):
    """`collectives.algorithm: nvls` with an `nvswitch_tray` class that degrades: all 9 trays of a rack down leave
    no switch to reduce in, and NCCL_ALGO=NVLS does not fall back, so that state has no step: the job stops in a
    restart until the first tray is back, on 2 racks as on a lone one, and runs each state of 1-8 trays down with
    NVLS. On 2 racks the restart runs from the 9th tray's failure at 1.8 h to the first tray's repair at 3 h, ending
    with the checkpoint's load (under 1 s), and the job's ETTR is the horizon less that stop, the work it lost, the
    slow steps of the states with trays down and the checkpoint stalls (0.872 measured)."""
    text = gb200_job(CLASSES) + "collectives: {algorithm: nvls}\n"
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)
    assert main(["validate", str(scenario)]) == 0
    rows = [((1 + 0.1 * tray) * H, 1, tray, 2 * H) for tray in range(9)]
    result = job_with(text, *rows)
    restart = result.events[result.events["kind"] == "restart"].iloc[0]
    assert restart["start_s"] == 1.8 * H and 3 * H < restart["end_s"] < 3 * H + 1
    lost = result.events[result.events["kind"] == "failure"]["lost_work_s"].sum()
    times = {name: figures["mean"] for name, figures in result.summary["time_s"].items()}
    assert times["slow_steps_s"] > 0 and times["restart_s"] == restart["end_s"] - restart["start_s"]
    idle = times["restart_s"] + lost + times["slow_steps_s"] + times["checkpoint_stall_s"]
    assert result.summary["ettr"]["mean"] == pytest.approx(1 - idle / (12 * H), rel=1e-12)
    lone = lone_rack(text)
    for forced in (text, lone):
        summary = job_with(forced, *rows).summary
        assert summary["interruptions"]["by_cause"]["nvswitch_tray"]["mean"] == 1
        assert {state["nvswitch_trays_down"].get("rack0/nvswitch", 0)
                for state in summary["states"]} == set(range(9))


def test_a_rack_class_on_a_cluster_without_racks_is_refused(tmp_path, capsys):
    """A DGX fat tree has no NVL72 rack: naming the class there is refused, as a NIC on a single host is."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(gb200_job(CLASSES).replace("gb200-nvl72, racks: 2, trays: 4", "dgx-h100-cluster, nodes: 2")
                        .replace("tp: 4, dp: 8", "tp: 8, dp: 2"))
    assert main(["validate", str(scenario)]) == 2
    assert "faults.components.rack: class 'rack' fails per rack, and this cluster has no rack" in \
        capsys.readouterr().err


def one_rack_step(text: str, racks: int, trays_down: tuple[tuple[str, int], ...]) -> float:
    """The step of the job of ``text`` built by hand on ``racks`` racks (DP 4 a rack) with ``trays_down``."""
    cluster = "trays: 4" if racks == 1 else f"racks: {racks}, trays: 4, leaf_ports: 4, spines: 2"
    loaded = scenario_from_text(text.replace("racks: 2, trays: 4, leaf_ports: 4, spines: 2", cluster)
                                .replace("dp: 8", f"dp: {4 * racks}"), "hand.yaml")
    faults = nvswitch_tray_faults(scenario_topology(loaded), trays_down)
    return simulate(with_step_faults(loaded, StepFaults(links=faults))).summary["step_time_s"]


def shrunk_states(summary: dict, replicas: int) -> list[tuple[dict, float]]:
    """The trays down and step time of each of the job's states on ``replicas`` replicas."""
    return [(state["nvswitch_trays_down"], state["step_time_s"]) for state in summary["states"]
            if state["replicas"] == replicas]


def test_nvswitch_trays_down_follow_their_rack_when_a_rack_failure_shrinks_the_job(job_with):
    """A tray of rack 1 is down (0.5 h, 3 h repair) when rack 0 fails (1 h): the elastic job shrinks onto rack 1,
    the first rack of its group, and trains at the step of one rack with a tray down, as built by hand. A tray of
    rack 0 down when it fails leaves with the rack: the shrunk job trains at one healthy rack's step. A tray down
    later on rack 0, out of the group in repair, is kept for when the rack joins again (its row logged), out of the
    shrunk job's state."""
    degraded = one_rack_step(gb200_job(CLASSES), 1, (("rack0/nvswitch", 1),))
    healthy = one_rack_step(gb200_job(CLASSES), 1, ())
    assert degraded > healthy
    summary = job_with(gb200_job(CLASSES), (0.5 * H, 1, 9, 3 * H), (1 * H, 0, 0, 4 * H)).summary
    assert shrunk_states(summary, 4) == [({}, healthy), ({"rack0/nvswitch": 1}, degraded)]
    summary = job_with(gb200_job(CLASSES), (0.5 * H, 1, 0, 3 * H), (1 * H, 0, 0, 4 * H)).summary
    assert shrunk_states(summary, 4) == [({}, healthy)]
    result = job_with(gb200_job(CLASSES), (1 * H, 0, 0, 4 * H), (2 * H, 1, 0, 1 * H))
    assert shrunk_states(result.summary, 4) == [({}, healthy)]
    assert "nvswitch_tray" not in result.summary["slow_steps_by_cause_s"]


def test_on_three_racks_the_racks_left_close_ranks(job_with):
    """3 racks (DP 12): rack 0 fails with a tray of rack 2 down; the job shrinks to 8 replicas on racks 1 and 2, its
    group's racks 0 and 1, so the tray is on its second rack: the step of 2 racks with rack 1's tray down, as built
    by hand (`rack2/nvswitch` is moved with its rack, not dropped as matching no rack of the shrunk job)."""
    three = three_racks(gb200_job(CLASSES))
    summary = job_with(three, (0.5 * H, 1, 18, 3 * H), (1 * H, 0, 0, 4 * H)).summary
    degraded = one_rack_step(gb200_job(CLASSES), 2, (("rack1/nvswitch", 1),))
    assert shrunk_states(summary, 8) == [({}, one_rack_step(gb200_job(CLASSES), 2, ())),
                                         ({"rack1/nvswitch": 1}, degraded)]


@pytest.mark.parametrize("text, rack_repair_s", [
    (gb200_job(CLASSES, elastic=False), 2 * H),
    (gb200_job(CLASSES).replace("elastic: true", "elastic: true, regrow: next_restart"), 30.0)],
    ids=["fixed", "elastic"])
def test_a_rack_back_by_the_restart_keeps_its_place(job_with, text, rack_repair_s):
    """Rack 0 fails at 1 h and its hosts are all back by the restart's rendezvous (a job that is not elastic waits
    the 2 h repair out; an elastic one's 30 s repair ends within the detection): the job re-forms on both racks, so
    a tray of rack 1 failing at 4 h slows it, on rack 1."""
    summary = job_with(text, (1 * H, 0, 0, rack_repair_s), (4 * H, 1, 9, 2 * H)).summary
    assert [(state["replicas"], state["nvswitch_trays_down"]) for state in summary["states"]] == [
        (8, {}), (8, {"rack1/nvswitch": 1})]
    assert summary["slow_steps_by_cause_s"]["nvswitch_tray"]["mean"] > 0


def test_a_second_shrink_by_the_same_rack_reuses_its_cause_shares(job_with, monkeypatch):
    """Rack 0 fails at 1 h and again at 3 h (1 h repairs, regrow on repair): the job shrinks onto rack 1 twice, the
    same state both times, so the slow-step split by cause is worked out no more often than for one shrink."""
    import simulator.reliability.job as job_module
    calls: list[tuple] = []
    monkeypatch.setattr(job_module, "cause_shares", lambda *args: calls.append(args) or cause_shares(*args))
    text = gb200_job(CLASSES).replace("elastic: true", "elastic: true, regrow: on_repair")
    once = job_with(text, (1 * H, 0, 0, 1 * H)).summary
    assert once["replicas"]["shrinks"]["mean"] == 1 and calls
    once_calls, calls[:] = len(calls), []
    twice = job_with(text, (1 * H, 0, 0, 1 * H), (3 * H, 0, 0, 1 * H)).summary
    assert twice["replicas"]["shrinks"]["mean"] == 2 and len(calls) == once_calls


def rack_all_reduce(algorithm: str, down: int) -> dict:
    """The summary of a 64 MiB all-reduce over rack 0's 16 GPUs (2 racks of 4 trays) under ``algorithm``, with
    ``down`` of rack 0's 9 NVSwitch trays down."""
    loaded = scenario_from_text(f"""cluster: {{topology: gb200-nvl72, racks: 2, trays: 4, leaf_ports: 4, spines: 2}}
network: {{model: flow}}
collectives: {{algorithm: {algorithm}}}
workload:
  - {{name: ar, op: all_reduce, bytes: 64 MiB, group: [{", ".join(map(str, range(16)))}]}}
""", "ar.yaml")
    faults = nvswitch_tray_faults(scenario_topology(loaded), (("rack0/nvswitch", down),))
    return simulate(with_step_faults(loaded, StepFaults(links=faults))).summary["collectives"][0]


@pytest.mark.parametrize(("nic", "moved"), [("h8/nic0", "h4/nic0"), ("h4/nic0", "h0/nic0")])
def test_links_down_follow_their_rack_when_a_rack_failure_shrinks_the_job(job_with, nic, moved):
    """3 racks (DP 12): a NIC of rack 2 (or 1) degrades at 0.5 h (3 h repair) and rack 0 fails at 1 h: the job
    shrinks onto racks 1 and 2, its group's racks 0 and 1, and the NIC's links go with its tray, to `moved` in the
    shrunk cluster's names, whose step is `simulate()` of 2 racks with those links down."""
    three = three_racks(gb200_job(NIC_CLASSES))
    units = cluster_units(scenario_topology(scenario_from_text(three, "job.yaml")))
    summary = job_with(three, (0.5 * H, 1, units.nodes["nic"].index(nic), 3 * H), (1 * H, 0, 0, 4 * H)).summary
    shrunk = [(state["links_down"], state["step_time_s"]) for state in summary["states"] if state["replicas"] == 8]
    rack = int(moved[1]) // 4
    links = [[moved, f"leaf{rack}.r0"], [moved, f"rack{rack}/gpu0"]]
    faults = StepFaults(links=tuple(LinkFault(link=(a, b)) for a, b in links))
    alone = simulate(with_step_faults(scenario_from_text(gb200_job(NIC_CLASSES), "hand.yaml"),
                                      faults)).summary["step_time_s"]
    assert shrunk[1] == (links, alone) and alone > shrunk[0][1]


def test_with_every_tray_of_a_rack_down_auto_weighs_the_rerouted_tree_and_picks_the_ring():
    """All 9 trays of rack 0 down reroute its GPUs over their trays' NICs, inside a tray too: the tree's chains inside a
    tray then share the NICs with its edges across trays, and the ring (3.098 ms) is faster than the tree (3.823 ms).
    The tuner counts every edge on the links its route crosses (tuner.py `TreeTerms.rerouted`); counted apart, the
    tree would come out at 3.00 ms, below the ring's 3.25, and be picked (a 1 GiB all-reduce: the tree 58.2 ms
    against the ring's 48.6). With NCCL's chunk (512 KiB under Simple, 16 per pipeline) and detours picked in the
    frame of their source's rail, the tree simulates at 3.8227 ms, and weighed as the run weighs it, in the run's
    chunks at the calibrated efficiencies, the estimate follows the plan's pipeline stretch by stretch: 3.8240 ms,
    1.25 us (3.3e-4) over (an opening step charged its slowest edge's latency on its busiest link), and the ring's is
    its simulated 3.0981 ms (weighed without chunks at line rate, the tree's estimate would be 4.76 ms, 24% over: the
    unpipelined tree, not the tuner's error). The rack is one NCCL node, where `auto` weighs the ring alone (tuner.py
    `candidates`); the tree's estimate is asked for by name."""
    from simulator.collectives.chunking import AUTO_CHUNK
    from simulator.collectives.phases import CollectiveRequest
    from simulator.collectives.tuner import estimates
    from simulator.engine.faults import FaultHooks
    from simulator.network.calibration import calibrated
    from simulator.simulation import step_faults

    ring, tree, picked = (rack_all_reduce(algorithm, 9) for algorithm in ("ring", "tree", "auto"))
    assert ring["time_s"] < tree["time_s"] and picked["algorithm"] == "ring" and picked["time_s"] == ring["time_s"]
    loaded = scenario_from_text("cluster: {topology: gb200-nvl72, racks: 2, trays: 4, leaf_ports: 4, spines: 2}\n"
                                "workload: [{name: ar, op: all_reduce, bytes: 64 MiB, group: all}]\n", "ar.yaml")
    faults = StepFaults(links=nvswitch_tray_faults(scenario_topology(loaded), (("rack0/nvswitch", 9),)))
    topology = scenario_topology(loaded)
    FaultHooks(topology, step_faults(with_step_faults(loaded, faults), topology))
    request = CollectiveRequest("all_reduce", tuple(range(16)), 64 * 2**20, chunk_bytes=AUTO_CHUNK)
    estimated = estimates(request, topology, calibrated(topology.gpu_model), algorithms=("ring", "tree"))
    assert estimated["ring"] == pytest.approx(ring["time_s"], rel=1e-9)
    assert estimated["tree"] == pytest.approx(tree["time_s"], rel=3.5e-4)


def test_with_every_tray_of_a_rack_down_nvls_is_not_run_there():
    """All 9 trays of rack 0 down leave its GPUs no NVSwitch to reduce in: `auto` picks another algorithm for an
    all-reduce over the rack's 16 GPUs, and `nvls` asked for is refused in one line; with 8 down the links are
    degraded but up and NVLS runs, slowed."""
    assert rack_all_reduce("auto", 8)["algorithm"] == "nvls"
    picked = rack_all_reduce("auto", 9)
    assert picked["algorithm"] != "nvls" and picked["time_s"] == rack_all_reduce(picked["algorithm"], 9)["time_s"]
    with pytest.raises(ScenarioError, match="the group's links to the NVSwitches up"):
        rack_all_reduce("nvls", 9)


def test_a_jobs_healthy_step_sees_the_links_degraded_from_its_start():
    """Every GPU link of rack 0 at 0.12 of its bandwidth in `faults.step`: the job's healthy step is `simulate()`'s
    step of its scenario."""
    from simulator.reliability.simulate import prepare_job

    text = gb200_job(CLASSES)
    loaded = scenario_from_text(text, "job.yaml")
    faults = StepFaults(links=tuple(fault.model_copy(update={"capacity": 0.12}) for fault in
                                    nvswitch_tray_faults(scenario_topology(loaded), (("rack0/nvswitch", 1),))))
    degraded = with_step_faults(loaded, faults)
    assert prepare_job(degraded).healthy.step_s == simulate(degraded).summary["step_time_s"]


def test_links_down_follow_their_rack_back_when_the_job_grows_again(job_with):
    """3 racks (DP 12): NIC h8/nic0 (rack 2) degrades at 0.5 h (10 h repair), rack 0 fails at 1 h and is back at 3
    h: shrunk to 8 replicas the NIC is h4/nic0 of the 2 racks left, and grown back to 12 it is h8/nic0 again, the
    job keeping it under its own name and placing it for each group."""
    three = three_racks(gb200_job(NIC_CLASSES))
    units = cluster_units(scenario_topology(scenario_from_text(three, "job.yaml")))
    summary = job_with(three, (0.5 * H, 1, units.nodes["nic"].index("h8/nic0"), 10 * H), (1 * H, 0, 0, 2 * H)).summary
    down = {(state["replicas"], tuple(map(tuple, state["links_down"]))) for state in summary["states"]}
    assert (8, (("h4/nic0", "leaf1.r0"), ("h4/nic0", "rack1/gpu0"))) in down
    assert (12, (("h8/nic0", "leaf2.r0"), ("h8/nic0", "rack2/gpu0"))) in down
    assert (12, (("h4/nic0", "leaf1.r0"), ("h4/nic0", "rack1/gpu0"))) not in down


def test_link_utilisation_is_of_line_rate_under_trays_down():
    """A 1 GiB ring all-reduce over one rack of 4 trays with 4 of its 9 trays down: each GPU's NVLink runs at 5/9 of
    its line rate, and the trace's link utilisation (`writers.link_tracks`, "utilisation of line rate") is of the
    line rate whether the links are degraded from the step's start or 1 ns into it (the same peak, to the rounding
    of the binned flows, below 5/9)."""
    from simulator.report.writers import link_tracks

    loaded = scenario_from_text(ONE_RACK_RING.format(size="1 GiB"), "ar.yaml")
    faults = nvswitch_tray_faults(scenario_topology(loaded), (("rack0/nvswitch", 4),))
    peaks = []
    for at in (0.0, 1e-9):
        moved = tuple(fault.model_copy(update={"at": at}) for fault in faults)
        result = simulate(with_step_faults(loaded, StepFaults(links=moved)))
        peaks.append(link_tracks(result).utilisation.max())
    assert peaks[0] == pytest.approx(peaks[1], rel=1e-3) and peaks[0] < 5 / 9


def rack_ring_all_reduce(faults: tuple[LinkFault, ...]) -> float:
    """The makespan of a 256 MiB ring all-reduce over one rack of 4 trays under the link ``faults``."""
    loaded = scenario_from_text(ONE_RACK_RING.format(size="256 MiB"), "ar.yaml")
    return simulate(with_step_faults(loaded, StepFaults(links=faults))).summary["makespan_s"]


def test_faults_on_the_same_links_from_the_start_stack():
    """Two faults at half capacity from the step's start on the rack's GPU links leave them a quarter: the
    all-reduce takes what one fault at 0.25 gives, exactly, and what the two 1 ns into the step give (to the
    rounding of the re-solved flows)."""
    topology = scenario_topology(scenario_from_text("cluster: {topology: gb200-nvl72, trays: 4}\n"
                                                    "model: {preset: llama3-8b}\n", "rack.yaml"))
    links = nvswitch_tray_faults(topology, (("rack0/nvswitch", 1),))

    def at(capacity: float, at_s: float) -> tuple[LinkFault, ...]:
        return tuple(fault.model_copy(update={"capacity": capacity, "at": at_s}) for fault in links)

    twice = rack_ring_all_reduce(at(0.5, 0.0) + at(0.5, 0.0))
    assert twice == rack_ring_all_reduce(at(0.25, 0.0))
    assert twice == pytest.approx(rack_ring_all_reduce(at(0.5, 1e-9) + at(0.5, 1e-9)), rel=1e-6)
    assert twice > 1.9 * rack_ring_all_reduce(at(0.5, 0.0))


def test_a_tray_down_on_links_degraded_from_the_start_slows_the_job(job_with):
    """Rack 0's GPU links at 0.12 of their bandwidth in `faults.step` and one NVSwitch tray of rack 0 down at 1 h:
    the tray state's links keep 0.12 x 8/9, and its step is slower than the healthy one."""
    loaded = scenario_from_text(gb200_job(CLASSES), "job.yaml")
    degraded = tuple(fault.model_copy(update={"capacity": 0.12}) for fault in
                     nvswitch_tray_faults(scenario_topology(loaded), (("rack0/nvswitch", 1),)))
    text = gb200_job(CLASSES).replace("faults: {components:", "faults: {step: {links: [" + ", ".join(
        f"{{link: [{a}, {b}], capacity: 0.12}}" for fault in degraded for a, b in [fault.link]) + "]}, components:")
    healthy, tray = job_with(text, (1 * H, 1, 0, 2 * H)).summary["states"]
    assert tray["nvswitch_trays_down"] == {"rack0/nvswitch": 1}
    assert tray["step_time_s"] > healthy["step_time_s"]


def test_a_job_sizes_its_nvswitch_tray_states_by_trays_down_on_every_rack(monkeypatch):
    """TP 4 x PP 2 x DP 4 under forced NVLS, whose tray states on one rack fold (24 of 32 ranks), with limits that
    fold passes and the unfolded step does not: a tray down on each of the 2 racks leaves every host near and the
    step unfolded, a state the job can meet, so it is refused at load, at the tray class, saying so. 8 of 8 hosts
    near')."""
    import simulator.scale as scale
    from simulator.engine.fold_policy import EVERY_RANK_NEAR
    from simulator.reliability.simulate import prepare_job

    text = two_stages(gb200_job(CLASSES)) + "collectives: {algorithm: nvls}\n"
    loaded = scenario_from_text(text, "job.yaml")
    estimate = scale.classed_estimate(loaded, 32, 24)
    assert estimate is not None
    monkeypatch.setattr(scale, "MAX_EVENTS", estimate.events)
    with pytest.raises(ScenarioError, match="nvswitch_tray failure") as refused:
        prepare_job(loaded)
    assert EVERY_RANK_NEAR in str(refused.value), str(refused.value)


def test_a_regrow_brings_back_the_rack_repaired_first(job_with):
    """3 racks (DP 12), regrow on repair: rack 0 fails at 1 h (6 h repair), then rack 2, at place 1 of the shrunk
    group, at 1.5 h (1.5 h repair); at 2 h the NIC at place 0 of the lone rack left (rack 1's h4/nic0) degrades. At
    3 h rack 2 is back and rack 0 is not: the job grows to racks 1 and 2, rack 1 first, its NIC h0/nic0 (a state
    only this regrow meets)."""
    three = three_racks(gb200_job(NIC_CLASSES)).replace(
        "elastic: true}", "elastic: true, regrow: on_repair}")
    units = cluster_units(scenario_topology(scenario_from_text(three, "job.yaml")))
    summary = job_with(three, (1 * H, 0, 0, 6 * H), (1.5 * H, 0, 2, 1.5 * H),
                       (2 * H, 1, units.nodes["nic"].index("h0/nic0"), 10 * H)).summary
    down = [(state["replicas"], tuple(map(tuple, state["links_down"]))) for state in summary["states"]]
    assert (8, (("h0/nic0", "leaf0.r0"), ("h0/nic0", "rack0/gpu0"))) in down, down
    assert (8, (("h4/nic0", "leaf1.r0"), ("h4/nic0", "rack1/gpu0"))) not in down, down


def spared(text: str, regrow: str = "") -> str:
    """A `job` with a spare rack's 4 hosts (`restart.spares: 4`: spare rack `spare-0`), ``regrow`` its policy."""
    return text.replace("warmup_steps: 0,", f"warmup_steps: 0, spares: 4,{regrow}")


def trays_by_replicas(summary: dict) -> list[tuple[int, dict]]:
    """Each state's replicas and NVSwitch trays down, in the order the summary lists them (by replicas, then
    trays down)."""
    return [(state["replicas"], state["nvswitch_trays_down"]) for state in summary["states"]]


def test_a_spare_rack_in_the_group_has_trays_that_fail(job_with):
    """2 racks of 4 trays and a spare rack (`spares: 4`), not elastic: rack 0 fails at 1 h (100 h repair) and the
    spare takes a place, the group rack 1 then spare-0 (rack order, the spares after the cluster's racks; the
    summary names a tray by its place). The spare's first tray (unit 18, after the cluster's 18) fails at 2 h: the
    job trains slower, its group's second rack with a tray down (until 6 h), and the row shows it; rack 1's (unit 9)
    at 4 h is on its first. A tray of rack 0, in repair, at 3 h is kept out of the state, for when rack 0 joins a
    group (its row logged)."""
    result = job_with(spared(gb200_job(CLASSES, elastic=False)), (1 * H, 0, 0, 100 * H), (2 * H, 1, 18, 4 * H),
                      (3 * H, 1, 0, 4 * H), (4 * H, 1, 9, 4 * H))
    spare, rack1 = {"rack1/nvswitch": 1}, {"rack0/nvswitch": 1}
    assert trays_by_replicas(result.summary) == [(8, {}), (8, rack1), (8, {**rack1, **spare}), (8, spare)]
    rows = result.events[result.events["kind"] == "degraded"]
    assert list(rows["start_s"]) == [2 * H, 3 * H, 4 * H] and set(rows["cause"]) == {"nvswitch_tray"}
    assert result.summary["slow_steps_by_cause_s"]["nvswitch_tray"]["mean"] > 0


def test_a_regrow_takes_racks_repaired_and_spares_not_racks_in_repair(job_with):
    """3 racks (DP 12), a spare rack, regrow on repair: rack 0 fails at 1 h (2 h repair) and rack 1 during the
    restart's detection (9 h repair): 8 hosts are left, rack 2 and the spare, and the job shrinks onto them. At 3 h
    rack 0 is back and the job grows to 12 on racks 0, 2 and spare-0 (rack order): a tray of the spare at 4 h is on
    its group's third rack, and one of rack 1, in repair until 10.5 h, at 5 h is ignored."""
    text = spared(three_racks(gb200_job(CLASSES)), " regrow: on_repair,")
    summary = job_with(text, (1 * H, 0, 0, 2 * H), (1 * H + 30, 0, 1, 9.5 * H), (4 * H, 1, 27, 4 * H),
                       (5 * H, 1, 9, 4 * H)).summary
    assert summary["replicas"]["regrows"]["mean"] == 1
    assert trays_by_replicas(summary) == [(8, {}), (12, {}), (12, {"rack2/nvswitch": 1})]


def test_a_rack_failure_strikes_its_rack_wherever_it_sits(job_with):
    """3 racks (DP 12), elastic: rack 0 fails at 1 h (100 h repair) and the job shrinks onto racks 1 and 2. Rack 0
    failing again at 2 h only extends its repair (it is out of the group); rack 2 failing at 3 h takes the group's
    second place, and the job shrinks onto rack 1 alone: a tray of rack 1 at 4 h slows it, one of rack 2 at 5 h does
    not. The summary also lists the full-size states with trays down that the slow-step split asks (the shrink and
    the trays as causes), never trained in."""
    summary = job_with(three_racks(gb200_job(CLASSES)), (1 * H, 0, 0, 100 * H), (2 * H, 0, 0, 100 * H),
                       (3 * H, 0, 2, 100 * H), (4 * H, 1, 9, 4 * H), (5 * H, 1, 18, 4 * H)).summary
    assert summary["interruptions"]["by_cause"]["rack"]["mean"] == 2
    assert summary["replicas"]["shrinks"]["mean"] == 2
    rack1, rack2 = {"rack1/nvswitch": 1}, {"rack2/nvswitch": 1}
    assert trays_by_replicas(summary) == [(4, {}), (4, {"rack0/nvswitch": 1}), (8, {}), (12, {}), (12, rack1),
                                          (12, {**rack1, **rack2})]


def test_racks_trays_nics_and_leaves_fail_at_their_rate_spares_too(text_job):
    """2 racks and a spare rack, not elastic, 30 days, 20 replications, racks failing every 200 h (1 d repair),
    NVSwitch trays every 2000 h, NICs every 100 d and leaves every 20 d (1 h repairs, degrading): the spare stands
    in for a rack failed and stays when it is back (to the pool), so 2 racks are in the group nearly all the time,
    the spare among them from the first rack failure on. The job meets 2 x 720 h / 200 h = 7.2 rack failures a
    replication and 18 x 720 h / 2000 h = 6.48 tray failures (counted by their slow-step time: one tray down slows
    the step by a known part), and as many NIC and leaf failures as `failure_model` expects of the cluster's units,
    in their Poisson bands (3 sigma over 20 replications); the rows count every rack's, idle or not, each rack
    failing once per MTBF + repair (none while in repair): 3 x 720 h / 224 h = 9.64 rack failures and 27 x 720 h /
    2001 h = 9.72 tray failures (10.8 racks while a rack in repair failed too)."""
    text = spared(gb200_job("rack: {mtbf: 200 h, repair: 1 d}, nvswitch_tray: {mtbf: 2000 h, repair: 1 h}, "
                      "nic: {mtbf: 100 d, repair: 1 h, effect: degrade}, "
                      "leaf_switch: {mtbf: 20 d, repair: 1 h, effect: degrade}", elastic=False)).replace(
        "horizon: 12 h", "horizon: 30 d, replications: 20")
    result = text_job(text)
    summary, rows = result.summary, result.events

    def band(count: float, expected: float) -> None:
        assert count == pytest.approx(expected, abs=3 * (expected / 20) ** 0.5)

    band(summary["interruptions"]["by_cause"]["rack"]["mean"], 7.2)
    step = {(state["replicas"], tuple(state["nvswitch_trays_down"].items()), len(state["links_down"])):
            state["step_time_s"] for state in summary["states"]}
    one_tray_slows = 1 - step[8, (), 0] / step[8, (("rack0/nvswitch", 1),), 0]
    band(summary["slow_steps_by_cause_s"]["nvswitch_tray"]["mean"] / (H * one_tray_slows), 6.48)
    for cause in ("nic", "leaf_switch"):
        band(((rows["kind"] == "degraded") & (rows["cause"] == cause)).sum() / 20,
             summary["failure_model"][cause]["expected_in_horizon"])
    band(((rows["kind"] == "failure") & (rows["cause"] == "rack")).sum() / 20, 3 * 720 / 224)
    band(((rows["kind"] == "degraded") & (rows["cause"] == "nvswitch_tray")).sum() / 20, 27 * 720 / 2001)


def test_the_cause_shares_kept_are_those_worked_out_afresh(job_with, monkeypatch):
    """The slow-step split by cause is kept by the job's replicas, degradations in force, racks in the group and
    racks out, which fix the state it trains in (`JobProcess.running`) and the sub-states the split asks of. 2
    racks and a spare rack, not elastic: rack 1's NIC h4/nic0 and a tray of rack 1 fail at 0.5 h, then rack 0 at
    1 h; the spare takes a place and rack 1 moves to the first: the same degradations, on another place, a state
    of their own. The split kept equals the one worked out at every segment, the cache never answering. A guard:
    main's key (replicas, degradations, racks out in their order) was right, and this passes there: the racks out
    fix the places (the group is every other rack, in rack order); the key names the group too, for its reader."""
    import simulator.reliability.job as job_module

    text = spared(gb200_job(CLASSES + ", nic: {mtbf: 1000 d, repair: 3 h, effect: degrade}", elastic=False))
    units = cluster_units(scenario_topology(scenario_from_text(text, "job.yaml")))
    rows = ((0.5 * H, 2, units.nodes["nic"].index("h4/nic0"), 10 * H), (0.5 * H, 1, 9, 10 * H),
            (1 * H, 0, 0, 100 * H))
    kept = job_with(text, *rows).summary

    class Forgetful(dict):
        def __contains__(self, key: object) -> bool:
            return False

    init = job_module.JobProcess.__init__

    def forgetting(self, *args) -> None:
        init(self, *args)
        self.shares = Forgetful()

    monkeypatch.setattr(job_module.JobProcess, "__init__", forgetting)
    afresh = job_with(text, *rows).summary
    trained = {(tuple(map(tuple, state["links_down"])), tuple(state["nvswitch_trays_down"].items()))
               for state in kept["states"]}
    assert ((("h4/nic0", "leaf1.r0"), ("h4/nic0", "rack1/gpu0")), (("rack1/nvswitch", 1),)) in trained
    assert ((("h0/nic0", "leaf0.r0"), ("h0/nic0", "rack0/gpu0")), (("rack0/nvswitch", 1),)) in trained
    assert kept["slow_steps_by_cause_s"] == afresh["slow_steps_by_cause_s"]


LINK_CLASSES = ("rack: {mtbf: 1000 d, repair: 4 h}, nic: {mtbf: 1000 d, repair: 3 h, effect: degrade}, "
                "cable: {mtbf: 1000 d, repair: 3 h, effect: degrade}")


def test_links_down_on_a_spare_racks_place_move_with_the_spare(job_with):
    """2 racks and a spare rack, elastic: rack 0 fails at 1 h and the group is rack 1, then spare-0. The spare's NIC (at
    its place, h4/nic0) degrades at 2 h and its leaf's cable to spine 0 (leaf1.r0-spine0) at 2.5 h: the job trains
    with both down. Rack 1 fails at 3 h and the job shrinks onto the spare, then at place 0: its NIC and cable follow
    it there (h0/nic0, leaf0.r0-spine0)."""
    text = spared(gb200_job(LINK_CLASSES))
    units = cluster_units(scenario_topology(scenario_from_text(text, "job.yaml")))
    cable = units.cable_ends.index(("leaf1.r0", "spine0"))
    result = job_with(text, (1 * H, 0, 0, 100 * H), (2 * H, 1, units.nodes["nic"].index("h4/nic0"), 20 * H),
                      (2.5 * H, 2, cable, 20 * H), (3 * H, 0, 1, 100 * H))
    down = {(state["replicas"], tuple(map(tuple, state["links_down"]))) for state in result.summary["states"]}
    assert (8, (("h4/nic0", "leaf1.r0"), ("h4/nic0", "rack1/gpu0"), ("leaf1.r0", "spine0"))) in down, down
    assert (4, (("h0/nic0", "leaf0.r0"), ("h0/nic0", "rack0/gpu0"), ("leaf0.r0", "spine0"))) in down, down


def test_a_rack_failing_out_of_the_group_is_in_repair(job_with):
    """2 racks and a spare rack, not elastic. The spare fails idle at 0.5 h (100 h repair), then rack 0 at 1 h: no
    rack is free, and the job waits out the horizon (12 h) for a repair; the idle failure has its row, taking no
    host, and is no interruption. Rack 0 fails at 1 h (1 h repair): the spare takes its place and rack 0, back at 2
    h, joins the pool; it fails there at 2.5 h (100 h repair), and rack 1 at 3 h finds no rack free: the job waits
    from then on."""
    result = job_with(spared(gb200_job(CLASSES, elastic=False)), (0.5 * H, 0, 2, 100 * H), (1 * H, 0, 0, 100 * H))
    summary, rows = result.summary, result.events
    assert summary["interruptions"]["by_cause"]["rack"]["mean"] == 1
    assert summary["restart_waiting_for_hosts_s"]["mean"] == pytest.approx(11 * H - 60)
    failures = rows[rows["kind"] == "failure"]
    assert list(zip(failures["start_s"], failures["hosts"])) == [(0.5 * H, 0), (1 * H, 4)]
    summary = job_with(spared(gb200_job(CLASSES, elastic=False)), (1 * H, 0, 0, 1 * H), (2.5 * H, 0, 0, 100 * H),
                       (3 * H, 0, 1, 100 * H)).summary
    assert summary["interruptions"]["by_cause"]["rack"]["mean"] == 2
    assert summary["restart_waiting_for_hosts_s"]["mean"] == pytest.approx(9 * H - 60)


def test_a_spare_rack_failing_while_one_of_its_hosts_stands_in_interrupts_the_job(job_with):
    """2 racks and a spare rack (4 hosts), not elastic: host 5 fails at 0.5 h (10 h repair) and a host of the
    spare rack, idle in the pool, stands in for it. The spare rack fails at 1 h (2 h repair): its stand-in goes
    with it, so the job is interrupted (the row takes that host) and its restart waits for the rack, back at 3 h
    (2 h less the detection minute), the rack's free hosts out with it. A stand-in again, it fails again at 5 h
    (1 h repair): another interruption. At 11 h host 5 is back (10.5 h) among the spare hosts, but the rack's
    host stays in its slot (the stand-in is recorded, not counted): its failure interrupts the job a third time,
    whose restart takes host 5 at once."""
    classes = CLASSES + ", host: {mtbf: 1000 d, repair: 1 h}"
    result = job_with(spared(gb200_job(classes, elastic=False)), (0.5 * H, 2, 5, 10 * H), (1 * H, 0, 2, 2 * H),
                      (5 * H, 0, 2, 1 * H), (11 * H, 0, 2, 1 * H))
    rows = result.events
    failures = rows[rows["kind"] == "failure"]
    assert list(zip(failures["start_s"], failures["cause"], failures["hosts"])) == [
        (0.5 * H, "host", 1), (1 * H, "rack", 1), (5 * H, "rack", 1), (11 * H, "rack", 1)]
    restarts = rows[rows["kind"] == "restart"]
    assert list(restarts["start_s"]) == [0.5 * H, 1 * H, 5 * H, 11 * H]
    assert result.summary["interruptions"]["by_cause"]["rack"]["mean"] == 3
    assert result.summary["restart_waiting_for_hosts_s"]["mean"] == pytest.approx(3 * H - 2 * 60)


def test_each_of_two_spare_racks_interrupts_the_job_while_its_host_stands_in(job_with):
    """2 racks and two spare racks (8 hosts), not elastic: host 5 fails at 0.5 h (10 h repair) and a host of
    spare-0 stands in for it. spare-0 fails at 1 h (2 h repair): the job is interrupted and a host of spare-1
    stands in at once; spare-1 fails at 2 h (1 h repair): interrupted again, the restart waits for the first rack
    back, spare-1 at 3 h (1 h less the detection minute). The spare count held as many hosts as a rack: before,
    neither failure interrupted."""
    classes = CLASSES + ", host: {mtbf: 1000 d, repair: 1 h}"
    text = gb200_job(classes, elastic=False).replace("warmup_steps: 0,", "warmup_steps: 0, spares: 8,")
    result = job_with(text, (0.5 * H, 2, 5, 10 * H), (1 * H, 0, 2, 2 * H), (2 * H, 0, 3, 1 * H))
    rows = result.events
    failures = rows[rows["kind"] == "failure"]
    assert list(zip(failures["start_s"], failures["cause"], failures["hosts"])) == [
        (0.5 * H, "host", 1), (1 * H, "rack", 1), (2 * H, "rack", 1)]
    restarts = rows[rows["kind"] == "restart"]
    assert list(restarts["start_s"]) == [0.5 * H, 1 * H, 2 * H]
    assert result.summary["restart_waiting_for_hosts_s"]["mean"] == pytest.approx(1 * H - 60)


def test_a_stand_in_lost_with_its_spare_rack_leaves_its_slot_to_the_first_host_back(job_with):
    """2 racks and a spare rack (4 hosts), not elastic: host 5 fails at 0.5 h (1 h repair) and a host of the spare
    rack stands in for it; the spare rack fails at 1 h (10 h repair), taking the stand-in: the restart waits for
    host 5, back at 1.5 h, not for the rack (the slot's failure at 1.2 h, its host out, is none). Host 1 failing
    at 2 h finds no spare host, the rack's all in repair: the restart waits for the rack, until 11 h."""
    classes = CLASSES + ", host: {mtbf: 1000 d, repair: 1 h}"
    result = job_with(spared(gb200_job(classes, elastic=False)), (0.5 * H, 2, 5, 1 * H), (1 * H, 0, 2, 10 * H),
                      (1.2 * H, 2, 5, 1 * H), (2 * H, 2, 1, 100 * H))
    restarts = result.events[result.events["kind"] == "restart"]
    assert list(restarts["start_s"]) == [0.5 * H, 1 * H, 2 * H]
    assert result.summary["restart_waiting_for_hosts_s"]["mean"] == pytest.approx(0.5 * H + 9 * H - 2 * 60)


@pytest.mark.parametrize("spares", [4, 8])
def test_spare_racks_hosts_standing_in_are_met_more_often_than_the_spare_count_says(text_job, spares):
    """2 GB200 racks and one or two spare racks (4 or 8 hosts), not elastic, 30 d, 400 replications: racks fail
    every 100 h (1 h repairs) and hosts every 100 h (10 h repairs). The job meets its 2 racks' failures,
    2 x 720 h / 100 h = 14.4, and those of a spare rack while one of its hosts stands in. Had a stand-in only the
    time its host is in repair (the spare count's model: a host in repair 10 / 110 of the time, the 8 independent,
    the rack up 100 / 101), that term would be 7.2 x 0.990 x (1 - (100 / 110)^8) = 3.80, 18.20 in all; a recorded
    stand-in stays until its slot fails (hosts back from repair stand in first), so the job meets more, and at
    most all of each spare rack's failures while up, 7.2 x 100 / 101 a rack. Simulated: 20.54 and 20.73
    (standard errors 0.21 and 0.23); the spare count gave 18.44 and 14.90, below the floor."""
    text = gb200_job("rack: {mtbf: 100 h, repair: 1 h}, host: {mtbf: 100 h, repair: 10 h}", elastic=False).replace(
        "horizon: 12 h", "horizon: 30 d, replications: 400").replace("warmup_steps: 0,",
                                                                      f"warmup_steps: 0, spares: {spares},")
    racks = text_job(text).summary["interruptions"]["by_cause"]["rack"]
    margin = 3 * racks["std"] / 400 ** 0.5
    counted = 14.4 + 7.2 * 100 / 101 * (1 - (100 / 110) ** 8)
    assert counted + margin < racks["mean"] < 14.4 + spares // 4 * 7.2 * 100 / 101 - margin


def test_an_idle_spares_tray_down_is_down_when_it_joins(job_with):
    """2 racks and a spare rack, not elastic: the idle spare's first tray fails at 0.9 h (10 h repair), then rack 0
    at 1 h: the spare joins the group at its second place with that tray down, and the job trains slower until the
    repair (10.9 h)."""
    summary = job_with(spared(gb200_job(CLASSES, elastic=False)), (0.9 * H, 1, 18, 10 * H),
                       (1 * H, 0, 0, 100 * H)).summary
    assert trays_by_replicas(summary) == [(8, {}), (8, {"rack1/nvswitch": 1})]
    assert summary["slow_steps_by_cause_s"]["nvswitch_tray"]["mean"] > 0


def test_the_failure_model_counts_the_spares_units_apart(job_with):
    """2 racks and a spare rack: the job draws rack failures on 3 racks and tray failures on 27 trays, and its
    `failure_model` says so: the cluster's `units` (2, 18; the expected count is theirs) and the spares'
    `spare_units` (1, 9). A job without spare racks has no `spare_units`."""
    model = job_with(spared(gb200_job(CLASSES)), (1 * H, 0, 0, 4 * H)).summary["failure_model"]
    assert [(model[name]["units"], model[name]["spare_units"]) for name in ("rack", "nvswitch_tray")] == [
        (2, 1), (18, 9)]
    assert "spare_units" not in job_with(gb200_job(CLASSES), (1 * H, 0, 0, 4 * H)).summary["failure_model"]["rack"]


def test_a_straggler_keeps_its_rack_while_an_nvswitch_tray_is_down(job_with):
    """A tray of rack 1 down from 1 h to 3 h, GPU 20 (rack 1) throttled x1.5 from 2 h to 4 h. The state with both is
    `simulate()` of the tray's links degraded and GPU 20 slowed, not GPU 0's (on rack 0, away from the tray): the
    first GPU of its stage stands for a straggler only where the places are alike. Alone from 3 h, the throttle is
    simulated on GPU 0 again."""
    summary = job_with(gb200_job(THROTTLE_CLASSES), (1 * H, 0, 13, 2 * H), (2 * H, 1, 20, 2 * H)).summary
    loaded = scenario_from_text(gb200_job(THROTTLE_CLASSES), "job.yaml")
    trays = nvswitch_tray_faults(scenario_topology(loaded), (("rack1/nvswitch", 1),))

    def step_with(gpu: int) -> float:
        faults = StepFaults(links=trays, stragglers=(Straggler(gpus=(gpu,), slowdown=1.5),))
        return simulate(with_step_faults(loaded, faults)).summary["step_time_s"]

    both = [state for state in summary["states"] if state["nvswitch_trays_down"] and state["slow_gpus"]]
    assert [state["slow_gpus"] for state in both] == [{"20": 1.5}]
    assert both[0]["step_time_s"] == step_with(20) != step_with(0)
    assert [state["slow_gpus"] for state in summary["states"] if not state["nvswitch_trays_down"]] == [{}, {"0": 1.5}]


@pytest.mark.parametrize("spares, expected", [(0, 2 * 720 / 124), (4, 2 * 720 / 100)])
def test_a_rack_without_a_spare_is_met_once_per_mtbf_and_repair(text_job, spares, expected):
    """2 GB200 racks (rack MTBF 100 h, 1 d repairs) over 30 d, not elastic. With no spare the job waits for the rack in
    repair, which does not fail meanwhile: the closed form counts 2 x 720 h / 124 h = 11.6 interruptions (not 2 x 720
    h / 100 h = 14.4, the rate alone); with a spare rack (`spares: 4`) the spare takes the place at once and the
    place fails on at the rate itself, 14.4, an upper bound (a spare rack in repair too leaves the job waiting now
    and then). The simulated mean of 400 replications: 11.54 within 3 standard errors (about 0.5) of the first, 14.09
    at most 3 standard errors above the second and within 10% below it."""
    text = gb200_job("rack: {mtbf: 100 h, repair: 1 d}", elastic=False).replace(
        "horizon: 12 h", "horizon: 30 d, replications: 400")
    summary = text_job(spared(text) if spares else text).summary
    assert summary["failure_model"]["rack"]["expected_interruptions"] == pytest.approx(expected, rel=1e-12)
    simulated = summary["interruptions"]["by_cause"]["rack"]
    error = 3 * simulated["std"] / 400 ** 0.5
    low = 0.9 * expected if spares else expected - error
    assert low <= simulated["mean"] <= expected + error


def test_a_partial_spare_rack_is_no_spare_at_hand_for_rack_failures(text_job):
    """2 racks of 4 trays with 2 spare hosts (`spare-0` holds 2 hosts, no whole rack), not elastic, racks failing
    every 100 h (1 d repairs), 30 d, 40 replications: the partial spare cannot take a rack's place, so the job
    waits for the repair as with no spare and the closed forms count 2 x 720 h / 124 h = 11.61 rack
    interruptions (the rate alone, a whole spare rack's, says 14.4); the simulated mean is within 3 standard
    errors of it."""
    text = gb200_job("rack: {mtbf: 100 h, repair: 1 d}", elastic=False).replace(
        "horizon: 12 h", "horizon: 30 d, replications: 40")
    partial = text_job(spared(text).replace("spares: 4,", "spares: 2,")).summary
    expected = partial["failure_model"]["rack"]["expected_interruptions"]
    assert expected == pytest.approx(2 * 720 / 124)
    met = partial["interruptions"]["by_cause"]["rack"]
    assert abs(met["mean"] - expected) < 3 * met["std"] / 40 ** 0.5
