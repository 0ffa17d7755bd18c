"""A job simulation (failures, checkpoints and restarts over a horizon) whose step is a replayed trace: the
healthy step, each straggler state and each size an elastic job shrinks to are replays of the trace, the
checkpoint's size is given, and a trace's job is refused where it cannot be told honestly (no checkpoint.size,
keep_global, idle GPUs)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from shared import SCENARIOS, STEP_ONLY, H

from simulator import simulate
from simulator.cli import main
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.errors import ScenarioError
from simulator.reliability.simulate import simulate_job
from simulator.reliability.states import ClusterState, StepStates
from simulator.topology.loader import scenario_topology

PAIR = SCENARIOS / "trace-allreduce-2rank.yaml"
JOB = """run: {horizon: 2 d, replications: 3}
faults: {preset: llama3, rate_multiplier: 5000}
checkpoint: {size: 270 MB, interval: 10 min}
"""


def _pair_job(extra: str = JOB):
    """The bundled two-rank trace's scenario with a job's sections, read as its file would be (its trace glob
    relative to the scenarios folder)."""
    return scenario_from_text(PAIR.read_text() + extra, str(PAIR))


def test_a_trace_job_runs_the_plain_replays_step_and_its_figures_follow_from_its_events():
    """The job of the bundled two-rank trace under the llama3 preset (rates x 5,000: 16.49 failures expected in 2
    days were every unit always in use). Its healthy step is the plain replay's, to the last bit; the work it lost
    is its failures' rows' (no planned stop cuts a step short), and its interruptions are its failure rows."""
    job = simulate_job(_pair_job())
    plain = simulate(load_scenario(PAIR)).summary["step_time_s"]
    assert job.summary["step_time_s"] == plain
    assert job.step_summary["step_time_s"] == plain
    assert job.summary["checkpoint"]["size_bytes"] == 270e6
    assert job.summary["tokens_per_step"] is None and job.summary["goodput_tokens_per_s"] is None
    failures = job.events[job.events["kind"] == "failure"]
    # Each class's failures arrive as a Poisson process over the horizon (exponential, repairs aside), 16.49 per
    # replication of 2 d together; a failure row is one of those arrivals, so over the 3 replications the rows
    # number at most Poisson(49.46), which exceeds 89 with probability 1.5e-7. The first arrival of each
    # replication strikes the running job (every class of the preset interrupts it), so there are at least 3 rows
    # but with probability 3 exp(-16.49) = 2e-7. (There are 12: with no spare host, a GPU's or a host's repair of
    # a day or two holds the job, and the arrivals that meet no unit in use make no row; the closed form, with no
    # spare at hand each unit out while any failure of its host is in repair, expects 3.88 a replication, an upper
    # bound: 200 replications meet 3.38, 95% 3.17 to 3.59.)
    assert job.summary["expected_unexpected_interruptions"] == pytest.approx(3.878, abs=1e-3)
    assert 3 <= len(failures) <= 89
    lost = job.summary["time_s"]["lost_work_s"]["mean"]
    assert lost == pytest.approx(failures["lost_work_s"].sum() / 3, rel=1e-12)
    assert job.summary["interruptions"]["unexpected"]["mean"] * 3 == pytest.approx(len(failures), rel=1e-12)
    total = sum(part["mean"] for part in job.summary["time_s"].values())
    assert total == pytest.approx(2 * 86400, rel=1e-9)


STRAGGLING = """run: {horizon: 2 d, replications: 2, seed: 5}
faults:
  components:
    throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 12 h, repair: 6 h}
checkpoint: {size: 270 MB}
"""


@pytest.mark.parametrize("dp", [None, 8], ids=["traced-ranks", "dp-8-folded"])
def test_a_trace_jobs_straggler_states_are_plain_replays_with_that_straggler(dp):
    """Each straggler state's step equals the plain replay with the same `faults.step.stragglers` entry and seed, to
    the last bit: the state is simulated, on the GPU that straggles (the traced ranks do unlike work: GPU 1 slowed
    gives another step than GPU 0), also where workload.dp's copies fold (a trace has no layout to fold stragglers
    by, so its states replay the copies unfolded)."""
    copies = [] if dp is None else [f"workload.dp={dp}", f"cluster.nodes={dp}"]
    loaded = scenario_from_text(PAIR.read_text() + STRAGGLING, str(PAIR), copies)
    job = simulate_job(loaded)
    states = job.summary["states"]
    slowed = [state for state in states if state["slow_gpus"]]
    assert len(slowed) >= 2
    for state in slowed:
        entries = ", ".join(f"{{gpus: [{gpu}], slowdown: {factor}}}" for gpu, factor in state["slow_gpus"].items())
        replay = simulate(load_scenario(PAIR, [*copies, "run.seed=5", f"faults.step.stragglers=[{entries}]"]))
        assert state["step_time_s"] == replay.summary["step_time_s"]
    assert len({state["step_time_s"] for state in slowed}) > 1


def test_a_trace_job_without_a_checkpoint_size_is_refused_before_any_step(tmp_path, capsys, monkeypatch):
    """A trace has no parameter count to size the checkpoint from: one located line at checkpoint.size, exit 2,
    nothing written, no step simulated (`trainsim validate` refuses it too)."""
    from simulator.engine.engine import Engine

    scenario = tmp_path / "job.yaml"
    traces = SCENARIOS / "traces" / "allreduce-2rank" / "rank*.json"
    scenario.write_text(f"cluster: {{topology: ethernet-100g, nodes: 2}}\nworkload: {{trace: '{traces}'}}\n"
                        "run: {horizon: 2 d}\ncheckpoint:\n  interval: 10 min\n")

    def no_step(*_args, **_kwargs):
        raise AssertionError("a step was simulated")

    monkeypatch.setattr(Engine, "run", no_step)
    out = tmp_path / "out"
    for command in (["validate", str(scenario)], ["run", str(scenario), "--out", str(out)]):
        assert main(command) == 2
        assert capsys.readouterr().err == (
            f"error: {scenario}:4: checkpoint.size: a replayed trace has no parameter count to size the checkpoint "
            "from (workload.model_flops_per_token is not read as one) (allowed: a size such as '810 GB')\n")
    assert not out.exists()


@pytest.mark.parametrize("extra, overrides, message", [
    ("restart: {elastic: true, elastic_batch: keep_global}\n", [],
     "job.yaml:7: restart.elastic_batch: a replayed trace's replicas each replay the traced step as recorded, and it "
     "holds no more micro-batches to keep the global batch on fewer replicas (allowed: keep_per_replica beside "
     "workload.trace)"),
    ("", ["cluster.nodes=4"],
     "job.yaml:1: cluster: the trace's job runs 2 ranks, and the cluster has 4 GPUs: the idle ones' failures would "
     "interrupt it (with --set cluster.nodes=4) (allowed: a cluster of 2 GPUs, or a workload.dp that fills it)"),
    ("restart: {elastic: true, elastic_batch: keep_global}\n", ["cluster.nodes=4"],
     "job.yaml:1: cluster: the trace's job runs 2 ranks, and the cluster has 4 GPUs: the idle ones' failures would "
     "interrupt it (with --set cluster.nodes=4) (allowed: a cluster of 2 GPUs, or a workload.dp that fills it)"),
], ids=["keep-global", "idle-gpus", "both"])
def test_a_trace_job_is_refused_where_it_cannot_be_told(tmp_path, capsys, monkeypatch, extra, overrides, message):
    """An elastic trace job keeping its global batch (the trace holds no more micro-batches) and one whose ranks
    leave GPUs idle (their failures would interrupt it) are refused, one located line, by `validate` as by `run`,
    and before any step is simulated. A job both refusals apply to meets the idle GPUs first in both: run checked
    the job's sections (keep_global among them) before its trace's step, validate after."""
    from simulator.engine.engine import Engine

    def no_step(*_args, **_kwargs):
        raise AssertionError("a step was simulated")

    monkeypatch.setattr(Engine, "run", no_step)
    scenario = tmp_path / "job.yaml"
    traces = SCENARIOS / "traces" / "allreduce-2rank" / "rank*.json"
    scenario.write_text(f"cluster: {{topology: ethernet-100g, nodes: 2}}\nworkload: {{trace: '{traces}'}}\n"
                        f"checkpoint: {{size: 1 GB}}\nrun: {{horizon: 2 d}}\nfaults: {{preset: llama3}}\n\n{extra}")
    sets = [argument for override in overrides for argument in ("--set", override)]
    for command in (["validate", str(scenario)], ["run", str(scenario), "--out", str(tmp_path / "out")]):
        assert main([*command, *sets]) == 2
        assert capsys.readouterr().err == f"error: {tmp_path}/{message}\n"
    assert not (tmp_path / "out").exists()


def test_a_trace_job_both_too_large_and_leaving_gpus_idle_meets_one_first_error(tmp_path, capsys, monkeypatch):
    """With the event limit below the two-rank trace's ops, its job on 4 GPUs is both too large and leaves two GPUs
    idle: `validate` and `run` both refuse the idle GPUs first (`refuse_trace_step`, one order for the two)."""
    import simulator.scale as scale

    monkeypatch.setattr(scale, "MAX_EVENTS", 1)
    scenario = tmp_path / "job.yaml"
    traces = SCENARIOS / "traces" / "allreduce-2rank" / "rank*.json"
    scenario.write_text(f"cluster: {{topology: ethernet-100g, nodes: 4}}\nworkload: {{trace: '{traces}'}}\n"
                        "checkpoint: {size: 1 GB}\nrun: {horizon: 2 d}\nfaults: {preset: llama3}\n")
    for command in (["validate", str(scenario)], ["run", str(scenario), "--out", str(tmp_path / "out")]):
        assert main(command) == 2
        assert capsys.readouterr().err.startswith(
            f"error: {scenario}:1: cluster: the trace's job runs 2 ranks, and the cluster has 4 GPUs")

@pytest.mark.parametrize("field, value", [("min_replicas", "1"), ("elastic_batch", "keep_global"),
                                          ("regrow", "on_repair")])
def test_an_elastic_setting_beside_a_trace_that_is_not_elastic_offers_elastic(tmp_path, capsys, field, value):
    """A restart setting of an elastic job beside a trace that is not elastic is refused as a modelled job's is,
    offering `restart.elastic: true`, which a trace's job takes. `keep_global` too: a trace's elastic job is refused
    it apart, not first as a trace's offering `keep_per_replica`, which would then be refused for want of
    `restart.elastic`."""
    scenario = tmp_path / "job.yaml"
    traces = SCENARIOS / "traces" / "allreduce-2rank" / "rank*.json"
    scenario.write_text(f"cluster: {{topology: ethernet-100g, nodes: 2}}\nworkload: {{trace: '{traces}'}}\n"
                        f"checkpoint: {{size: 1 GB}}\nrun: {{horizon: 2 d}}\nrestart: {{{field}: {value}}}\n")
    assert main(["validate", str(scenario)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {scenario}:5: restart.{field}: ")
    assert error.endswith(f"(allowed: restart.elastic: true, or no {field})\n")


ELASTIC = f"""cluster: {{topology: ethernet-100g, nodes: 8}}
workload: {{trace: '{SCENARIOS / "traces" / "allreduce-2rank" / "rank*.json"}', format: kineto, dp: 8,
            tokens_per_step: 8192}}
checkpoint: {{size: 270 MB, interval: 10 min}}
run: {{horizon: 20 h, replications: 1}}
faults:
  components:
    host: {{unit: host, effect: replace, mtbf: 1000 d, repair: 10 h}}
    software: {{unit: host, effect: restart, mtbf: 1000 d}}
restart: {{detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true}}
"""


def test_an_elastic_trace_job_shrinks_by_whole_copies_each_size_a_plain_replay(monkeypatch):
    """The two-rank DP-2 trace copied to 8 replicas on 8 one-GPU hosts, elastic, no spares. Hosts fail at 1 h, 2 h
    and 3 h (back at 11 h, 12 h, 13 h): 7 hosts run 6 replicas (3 copies; 7 is no whole copy), 6 hosts 6, 5 hosts 4;
    a software failure at 14 h finds every host back and the job grows to 8. Its sizes are the whole copies, 2 to 8;
    each size's step is the plain replay at that `workload.dp` on its hosts, to the last bit (the data-parallel
    all-reduce re-simulated over fewer ranks); two shrinks, one regrow, and the time on each size is what its
    restart rows leave it."""
    import numpy as np

    import simulator.reliability.simulate as job_simulation
    from simulator.reliability.processes import Arrivals

    rows = [(1 * H, 0, 0, 10 * H), (2 * H, 0, 1, 10 * H), (3 * H, 0, 2, 10 * H), (14 * H, 1, 0, 0.0)]
    time, klass, unit, repair = (np.asarray(column) for column in zip(*rows))
    arrivals = Arrivals(time.astype(float), klass.astype(int), unit.astype(int), repair.astype(float))
    monkeypatch.setattr(job_simulation, "draw_arrivals", lambda rng, classes, counts, horizon: arrivals)
    job = simulate_job(scenario_from_text(ELASTIC, "job.yaml"))
    replicas = job.summary["replicas"]
    assert replicas["sizes"] == [2, 4, 6, 8]
    assert (replicas["shrinks"]["mean"], replicas["regrows"]["mean"]) == (2, 1)
    steps = {state["replicas"]: state["step_time_s"] for state in job.summary["states"]}
    assert sorted(steps) == [4, 6, 8]
    for size, step in steps.items():
        plain = simulate(scenario_from_text(ELASTIC, "job.yaml", [f"workload.dp={size}", f"cluster.nodes={size}",
                                                                   "run.horizon=null"])).summary
        assert step == plain["step_time_s"]
    assert steps[4] < steps[6] < steps[8]
    restarts = job.events[job.events["kind"] == "restart"][["start_s", "end_s"]].to_numpy()
    assert restarts[:, 0].tolist() == [1 * H, 2 * H, 3 * H, 14 * H]
    running = {int(size): value["mean"] for size, value in replicas["running_s"].items()}
    assert running[6] == pytest.approx(2 * H - restarts[0, 1] + 3 * H - restarts[1, 1], abs=1e-6)
    assert running[4] == pytest.approx(14 * H - restarts[2, 1], abs=1e-6)
    assert running[8] == pytest.approx(1 * H + 20 * H - restarts[3, 1], abs=1e-6)
    assert sum(running.values()) + job.summary["time_s"]["restart_s"]["mean"] == pytest.approx(20 * H, abs=1e-6)


def test_validate_gives_an_elastic_trace_jobs_sizes_as_its_run_does():
    """`trainsim validate`'s job sizes for the 8-replica elastic trace job are the whole copies its run shrinks
    to (`refuse_trace_step`'s); validate dropped those and took `check_job`'s, the 8 replicas alone, which the
    trace's job never uses to plan."""
    from simulator.preflight import validate
    from simulator.reliability.simulate import prepare_job, validate_job
    from simulator.scale import sized_topology

    loaded = scenario_from_text(ELASTIC, "job.yaml")
    topology = sized_topology(loaded, force=False)
    verdict = validate(loaded, topology)
    sizes = validate_job(loaded, topology, verdict.step_floor_s, verdict.trace_sizes).sizes
    assert sizes.sizes == prepare_job(loaded).plan.sizes.sizes == (2, 4, 6, 8)


def test_an_elastic_trace_jobs_min_replicas_is_checked_against_its_replicas(tmp_path, capsys):
    """`restart.min_replicas` above the trace job's replicas is refused at its line: against `workload.dp` at load, and
    against the traced job's own replicas (dp left out: 2 for the two-rank trace) once it is read, by `validate` as
    by `run`."""
    scenario = tmp_path / "job.yaml"
    for dp, whose in ((", dp: 8", "workload.dp's 8 replicas"), ("", "the trace's job's 2 replicas")):
        nodes = 8 if dp else 2
        text = ELASTIC.replace(", dp: 8", dp).replace("nodes: 8", f"nodes: {nodes}")
        scenario.write_text(text.replace("elastic: true", "elastic: true, min_replicas: 9"))
        for command in (["validate", str(scenario)], ["run", str(scenario), "--out", str(tmp_path / "out")]):
            assert main(command) == 2
            assert capsys.readouterr().err == (f"error: {scenario}:10: restart.min_replicas: min_replicas 9 is "
                                               f"above {whose} (allowed: 1 to {8 if dp else 2})\n")


def test_trace_jobs_in_two_folders_with_one_relative_glob_each_get_their_own_steps(tmp_path):
    """One process, two folders each with the same job.yaml (trace 'tr/rank*.json') and the bundled two-rank trace,
    B's rank-1 GEMM 3x longer: each job's steps are its own trace's, as in a fresh process."""
    source = SCENARIOS / "traces" / "allreduce-2rank"
    for name, factor in (("A", 1), ("B", 3)):
        folder = tmp_path / name / "tr"
        folder.mkdir(parents=True)
        (folder / "rank0.json").write_text((source / "rank0.json").read_text())
        rank1 = json.loads((source / "rank1.json").read_text())
        gemm = next(event for event in rank1["traceEvents"] if "gemm" in event.get("name", "").lower()
                    and event.get("cat") == "kernel")
        gemm["dur"] *= factor
        (folder / "rank1.json").write_text(json.dumps(rank1))
        (tmp_path / name / "job.yaml").write_text(
            "cluster: {topology: ethernet-100g, nodes: 2}\nworkload: {trace: 'tr/rank*.json', format: kineto}\n"
            + STRAGGLING)
    first, second = (simulate_job(load_scenario(tmp_path / name / "job.yaml")).summary for name in "AB")
    alone = simulate(load_scenario(tmp_path / "B" / "job.yaml", ["run.horizon=null"])).summary["step_time_s"]
    assert second["step_time_s"] == alone > first["step_time_s"]
    assert {state["step_time_s"] for state in second["states"]}.isdisjoint(
        state["step_time_s"] for state in first["states"])


def test_trainsim_run_writes_a_trace_jobs_outputs(tmp_path, capsys):
    """`trainsim run` of the bundled trace job writes what a modelled job writes: job_summary.json, the events,
    the healthy step's summary.json, its Perfetto trace and the manifest; the summary's healthy step is the
    replay's."""
    out = tmp_path / "job"
    assert main(["run", str(SCENARIOS / "trace-job.yaml"), "--out", str(out), "--quiet"]) == 0
    assert {path.name for path in out.iterdir()} == {"job_summary.json", "job_events.parquet", "summary.json",
                                                      "trace.json", "manifest.json"}
    summary = json.loads((out / "job_summary.json").read_text())
    step = json.loads((out / "summary.json").read_text())
    assert summary["step_time_s"] == step["step_time_s"] > 0
    events = pd.read_parquet(out / "job_events.parquet")
    assert {"failure", "checkpoint", "restart", "straggling"} <= set(events["kind"])
    assert summary["replicas"]["sizes"] == [8]


def test_a_study_of_a_trace_job_runs_each_interval(tmp_path):
    """`trainsim study checkpoint-interval` of the bundled trace job runs the job at each interval given (in whole
    replayed steps)."""
    out = tmp_path / "study"
    assert main(["study", "checkpoint-interval", str(SCENARIOS / "trace-job.yaml"), "--intervals", "2min,30min",
                 "--set", "run.replications=1", "--out", str(out), "--quiet"]) == 0
    study = json.loads((out / "study.json").read_text())
    (curve,) = study["curves"]
    step = simulate(load_scenario(SCENARIOS / "trace-job.yaml", ["run.horizon=null"])).summary["step_time_s"]
    assert [point["interval_steps"] for point in curve["points"]] == [round(120 / step), round(1800 / step)]
    for point, asked in zip(curve["points"], (120.0, 1800.0), strict=True):
        assert point["interval_s"] == pytest.approx(point["interval_steps"] * step, rel=1e-12)
        assert abs(point["interval_s"] - asked) <= step / 2


def test_a_trace_jobs_missing_size_is_a_scenario_error_at_its_field():
    """The refusal is raised by the job's checks, at checkpoint.size, whatever else the trace holds."""
    with pytest.raises(ScenarioError, match=r"checkpoint\.size: a replayed trace has no parameter count"):
        simulate_job(_pair_job("run: {horizon: 2 d}\n"))


def test_a_trace_jobs_straggler_states_are_refused_where_their_unfolded_copies_pass_the_limits(monkeypatch):
    """The bundled trace job folds its 8 replicas onto the 2 traced ranks (6 ops); a straggler state replays the
    copies unfolded (4 x 6 = 24 ops): with the event limit between the two the job is refused before it runs, at its
    straggling class."""
    import simulator.scale as scale

    monkeypatch.setattr(scale, "MAX_EVENTS", 12)
    with pytest.raises(ScenarioError) as caught:
        simulate_job(load_scenario(SCENARIOS / "trace-job.yaml"))
    assert str(caught.value) == (
        f"{SCENARIOS / 'trace-job.yaml'}:21: faults.components.throttle: a throttle failure's states replay the trace "
        "unfolded (a trace has no layout to fold them by): 24 ops on 8 ranks (~0.2 GiB before their flows); ops + "
        "flows ~24 over the limit of 12 (allowed: a smaller workload.dp, or --force)")


def test_a_trace_jobs_link_fault_states_are_plain_replays_with_those_links_down():
    """A trace job on a fat tree of 4 DGX hosts (the two-rank trace copied to 32 ranks) whose leaf switches
    degrade: each degraded state's step equals the plain replay with that state's links down in
    `faults.step.links`, to the last bit, and is slower than the healthy step (its routes rerouted): the states
    are simulated, not scaled."""
    traces = SCENARIOS / "traces" / "allreduce-2rank" / "rank*.json"
    step = (f"cluster: {{topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2}}\n"
            f"workload: {{trace: '{traces}', format: kineto, dp: 32}}\ncheckpoint: {{size: 1 GB}}\n")
    job = simulate_job(scenario_from_text(step + "run: {horizon: 2 d, replications: 2, seed: 1}\nfaults:\n"
                                          "  components:\n    leaf_switch: {mtbf: 20 d, repair: 2 h}\n", "job.yaml"))
    degraded = [state for state in job.summary["states"] if state["links_down"]]
    assert degraded
    for state in degraded:
        links = ", ".join(f"{{link: [{low}, {high}]}}" for low, high in state["links_down"])
        replay = simulate(scenario_from_text(step, "step.yaml", [f"faults.step.links=[{links}]"])).summary
        assert replay["faults"]["rerouted_routes"] > 0
        assert state["step_time_s"] == replay["step_time_s"] > job.summary["step_time_s"]


def test_a_trace_job_counts_the_traced_jobs_own_replicas_with_dp_left_out_as_with_dp_equal_to_it():
    """The bundled two-rank trace is a DP-2 job: left out or given as 2, `workload.dp` names the same job and step,
    which count 2 replicas alike (job_summary.json's `replicas.sizes` and `running_s`)."""
    left_out, given = (simulate_job(scenario_from_text(PAIR.read_text() + STRAGGLING, str(PAIR), sets)).summary
                       for sets in ([], ["workload.dp=2"]))
    assert left_out["step_time_s"] == given["step_time_s"]
    assert left_out["replicas"]["sizes"] == given["replicas"]["sizes"] == [2]
    assert list(left_out["replicas"]["running_s"]) == list(given["replicas"]["running_s"]) == ["2"]


def test_an_elastic_trace_job_on_a_gb200_rack_shrinks_by_whole_trays(tmp_path, capsys):
    """The two-rank trace copied to 72 replicas on a GB200 NVL72 rack (18 trays of 4 GPUs): its sizes are the
    multiples of 4 replicas (whole trays), and the job shrunk to 68 keeps 17 trays of the rack (`last_rack_trays`):
    its step is `simulate()` of that cluster."""
    traces = SCENARIOS / "traces" / "allreduce-2rank" / "rank*.json"
    text = (f"cluster: {{topology: gb200-nvl72}}\nworkload: {{trace: '{traces}', format: kineto, dp: 72}}\n"
            "checkpoint: {size: 1 GB}\nrun: {horizon: 2 d, replications: 1}\nfaults: {preset: llama3}\n"
            "restart: {elastic: true}\n")
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)
    assert main(["validate", str(scenario)]) == 0
    err = capsys.readouterr().err  # the one warning: the preset's table is of DGX H100 hosts, not GB200 trays
    assert err.count("\n") == 1 and "faults.preset: the llama3 preset's rates were measured on hosts of 8" in err
    loaded = scenario_from_text(text, str(scenario))
    topology = scenario_topology(loaded)
    states = StepStates(loaded, topology)
    assert simulate_job(loaded).summary["replicas"]["sizes"] == list(range(4, 73, 4))
    kept = text.replace("gb200-nvl72}", "gb200-nvl72, last_rack_trays: 17}").replace("dp: 72", "dp: 68")
    step = states(ClusterState(68))
    assert step is not None and step.step_s == simulate(scenario_from_text(kept, str(scenario), [STEP_ONLY])).summary[
        "step_time_s"] != states.healthy_step.step_s


@pytest.mark.parametrize("cluster, dp, allowed", [
    ("ethernet-100g, nodes: 2", "", "a workload.dp of several copies of the traced job's 2 replicas"),
    ("ethernet-100g, nodes: 2", ", dp: 2", "a workload.dp of several copies of the traced job's 2 replicas"),
    ("dgx-h100-cluster, nodes: 1", ", dp: 8", "more hosts and a workload.dp that fills them"),
], ids=["dp-left-out", "dp-traced", "copies-split-a-host"])
def test_an_elastic_trace_job_that_cannot_shrink_is_warned_about_at_restart_elastic(tmp_path, capsys, cluster, dp,
                                                                                    allowed):
    """The two-rank DP-2 trace, elastic, with `dp` left out or equal to the traced job's 2 (no smaller whole copy),
    or copied to 8 replicas on one 8-GPU host (a smaller number of copies leaves part of the host) has one size:
    elastic changes nothing. `validate` and `run` both say so, one warning located at `restart.elastic`, and the job
    runs on its replicas alone."""
    scenario = tmp_path / "job.yaml"
    text = ELASTIC.replace("ethernet-100g, nodes: 8", cluster).replace(", dp: 8", dp)
    scenario.write_text(text)
    replicas = 8 if "dgx" in cluster else 2
    warning = (f"warning: {scenario}:10: restart.elastic: the trace's job runs on its {replicas} replicas only: it "
               "shrinks by whole copies of the traced ranks that fill whole hosts, and has no smaller one, so elastic "
               f"changes nothing (allowed: {allowed}, or restart.elastic: false)\n")
    out = tmp_path / "out"
    for command in (["validate", str(scenario), "--quiet"], ["run", str(scenario), "--out", str(out), "--quiet"]):
        assert main(command) == 0
        assert capsys.readouterr().err == warning
    assert json.loads((out / "job_summary.json").read_text())["replicas"]["sizes"] == [replicas]
