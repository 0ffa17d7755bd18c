"""benchmarks/search_accuracy.py writes docs/search-accuracy.md: its rows must be the search's estimate and the
simulation of the layout, not figures of its own. Checked on Llama-3-8B DP 8 on one DGX H100 (the bundled
scenario's own layout, so the simulation is `trainsim run`'s) against `estimate_step_s` and `simulate()` called
directly, and on a layout the search refuses; a simulation kept from an earlier run (`--reuse`) is taken by its
key."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
from shared import REPO

from simulator import load_scenario, simulate
from simulator.simulation import network_settings
from simulator.sweep.layouts import CollectiveTimes, estimate_step_s
from simulator.topology.loader import scenario_topology
from simulator.workload.calibrated import contention_share
from simulator.workload.training import build_training_step

SCRIPT = REPO / "benchmarks" / "search_accuracy.py"
BUNDLED = "llama3-8b-dgx-h100-dp8"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("search_accuracy", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_reports_row_is_the_estimate_and_the_simulation_called_directly(script):
    case = script.Case("dp8", "Llama-3-8B", BUNDLED, (), script.layout(1, 1, 1, 8))
    measured = script.measure(case)

    loaded = load_scenario(BUNDLED)
    topology = scenario_topology(loaded)
    step = build_training_step(loaded.scenario, topology)
    estimate_s = estimate_step_s(step, CollectiveTimes(topology, network_settings(loaded, topology)),
                                 contention_share(loaded.scenario.collectives.sm_contention, step.gpu.name))
    summary = simulate(loaded).summary
    assert (measured.reason, measured.base_schedule) == ("", "1f1b")
    assert measured.estimate_tokens_per_s == pytest.approx(step.tokens_per_step / estimate_s, rel=1e-12)
    assert measured.tokens_per_s == pytest.approx(summary["tokens_per_s"], rel=1e-12)
    assert measured.step_time_s == pytest.approx(summary["step_time_s"], rel=1e-12)
    assert measured.estimate_step_s == pytest.approx(estimate_s, rel=1e-12)

    files = measured.kept["files"]
    assert "simulator/simulation.py" in files
    assert not any(path.startswith("simulator/sweep/") for path in files)  # the estimate alone may change
    kept = {**measured.kept, "tokens_per_s": 1.0, "step_time_s": 2.0}
    reused = script.measure(case, {measured.key: kept})
    assert (reused.estimate_tokens_per_s, reused.tokens_per_s, reused.step_time_s) == (
        measured.estimate_tokens_per_s, 1.0, 2.0)
    changed = {**kept, "files": {**files, next(iter(files)): "an older version"}}
    assert script.measure(case, {measured.key: changed}).tokens_per_s == measured.tokens_per_s

    refused = script.measure(script.Case("tp16", "Llama-3-8B", BUNDLED, (), script.layout(16, 1, 1, 16)))
    assert refused.reason.startswith("refused: ")

    text = script.render([measured, refused], [], "python benchmarks/search_accuracy.py")
    assert text.startswith(script.HEADER + "\n")
    ratio = summary["tokens_per_s"] * estimate_s / step.tokens_per_step
    assert (f"| dp8 | Llama-3-8B | TP1 CP1 PP1 DP8 mb1 zero1 recompute=none | "
            f"{step.tokens_per_step / estimate_s:,.0f} | {summary['tokens_per_s']:,.0f} | {estimate_s:.4f} | "
            f"{summary['step_time_s']:.4f} | {ratio:.4f} |") in text.splitlines()
    assert f"| tp16 | Llama-3-8B | TP16 CP1 PP1 DP1 mb1 zero1 recompute=none | {refused.reason} | | | | |" in text
    # the refused layout has no ratio, so the family's band is the one measured layout's
    assert f"| Llama-3-8B | 1 | {ratio:.4f} (dp8) | {ratio:.4f} (dp8) |" in text.splitlines()


def test_case_names_are_unique_and_select_by_pattern(script):
    names = [task.name for task in [*script.CASES, *script.SEARCHES]]
    assert len(names) == len(set(names))
    assert [task.name for task in script.selected(["8b-seq1024-*"], long=False)] == [
        "8b-seq1024-cp2-zero1", "8b-seq1024-cp4-zero1", "8b-seq1024-cp8-zero1"]
    assert not any(task.name == "deepseek-default" for task in script.selected([], long=False))


def test_the_tp_overlap_family_runs_transformer_engines_overlap_at_each_tp(script):
    """The report's family under `parallelism.tp_comm_overlap`: Llama-3-8B ZeRO-1 at tp 2, 4 and 8 on one DGX H100
    and on four, each case's scenario loading with the overlap on."""
    cases = [case for case in script.CASES if "parallelism.tp_comm_overlap=true" in case.overrides]
    assert [case.name for case in cases] == [f"8b-{hosts}-te-tp{tp}-zero1" for hosts in ("1host", "4hosts")
                                             for tp in (2, 4, 8)]
    assert {case.family for case in cases} == {"Llama-3-8B ZeRO-1, Transformer Engine's TP overlap"}
    for case in cases[::3]:
        loaded = load_scenario(case.scenario, list(case.overrides))
        assert loaded.scenario.parallelism.tp_comm_overlap


def test_the_deepseek_ep16_layout_stays_with_its_copies_across_hosts(script):
    """The cut DeepSeek EP 16 case still runs an EP group over two 8-GPU hosts beside a copy in its stage, and
    its family says it is cut."""
    cases = [case for case in script.CASES if case.candidate.ep == 16 and case.scenario == script.DEEPSEEK]
    assert [case.name for case in cases] == ["deepseek-512-pp16-ep16-zero1-full"]
    (case,) = cases
    assert "cluster.nodes=64" in case.overrides and "512 H100" in case.family
    assert case.candidate.dp // case.candidate.ep == 2 and case.candidate.ep > 8


def test_a_search_row_says_when_the_tree_s_layout_has_no_simulated_figure(script):
    """The winner against the tree's layout: a ratio where the tree's layout was simulated, else what happened
    to it (no layout fits, or its status), never a 'nan'."""
    search = script.SearchCase("s", "a search", BUNDLED, script.SearchSpace(), 1)
    winner = {"label": "w", "estimate_tokens_per_s": 110.0, "tokens_per_s": 100.0}
    rows = script.searches_table([
        script.SearchOutcome(search, 3, 2, winner, {"label": "t", "status": "simulated", "tokens_per_s": 80.0}),
        script.SearchOutcome(search, 3, 1, winner, {"label": "t", "status": "failed", "tokens_per_s": None}),
        script.SearchOutcome(search, 3, 1, winner, {})])[2:]
    assert rows == ["| a search | 3 | 2 | w | 110 | 100 | t | 80 | +25.0% |",
                    "| a search | 3 | 1 | w | 110 | 100 | t | not simulated (failed) | - |",
                    "| a search | 3 | 1 | w | 110 | 100 | none fits | - | - |"]


def test_worker_processes_are_given_as_every_command_gives_them(script, monkeypatch, capsys):
    """`search_accuracy.py --workers N` takes its worker count as `trainsim sweep|search|validate-published`
    do, 0 meaning one per usable core; --jobs N, its older spelling, still works, with a note."""
    counts = []
    monkeypatch.setattr(script, "run_all", lambda tasks, workers, known, done: counts.append(workers) or [])
    monkeypatch.setattr(script, "render", lambda rows, outcomes, typed: "")
    first = script.selected([], long=True)[0].name
    monkeypatch.setattr(script, "usable_cores", lambda: 5)  # the cores this process may use (machine.py)
    for flags in (["--workers", "3"], ["--jobs", "2"], [], ["--workers", "0"]):
        assert script.main([*flags, "--case", first]) == 0
    assert counts == [3, 2, 1, 5]
    assert "--jobs is deprecated, use --workers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        script.main(["--workers", "2", "--jobs", "2", "--case", first])
    assert refused.value.code == 2


STOPPED_RUN = """
import importlib.util, os, signal, sys
from types import SimpleNamespace

spec = importlib.util.spec_from_file_location("search_accuracy", sys.argv[1])
script = importlib.util.module_from_spec(spec)
sys.modules["search_accuracy"] = script
spec.loader.exec_module(script)
reached = sys.argv[2]


def blocked(task, known):
    os.close(os.open(os.path.join(reached, str(os.getpid())), os.O_CREAT | os.O_EXCL))
    signal.pause()


script.timed = blocked
signal.signal(signal.SIGTERM, script.terminated)
script.run_all([SimpleNamespace(name=str(n)) for n in range(4)], 2, {}, lambda result, cpu_s: None)
"""


def test_a_stopped_run_ends_its_workers(tmp_path):
    """SIGTERM to the benchmark while its workers hold cases ends the workers with it, rather than leaving them
    running and waiting on them. The signal is sent once both workers say they hold a case (a file each), never
    after a fixed sleep."""
    reached = tmp_path / "reached"
    reached.mkdir()
    process = subprocess.Popen([sys.executable, "-c", STOPPED_RUN, str(SCRIPT), str(reached)], cwd=tmp_path,
                               env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[1])}, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        while len(list(reached.iterdir())) < 2 and process.poll() is None:
            time.sleep(0.01)
        workers = [int(path.name) for path in reached.iterdir()]
        assert len(workers) == 2, process.communicate(timeout=10)
        process.terminate()
        _, stderr = process.communicate(timeout=60)
        assert "Terminated" in stderr
        for pid in workers:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_negative_worker_count_is_refused(script, capsys):
    """--workers -1 is refused with status 2, as trainsim refuses it, rather than running every case in this
    process."""
    with pytest.raises(SystemExit) as refused:
        script.main(["--workers", "-1", "--case", script.selected([], long=True)[0].name])
    assert refused.value.code == 2
    assert "--workers -1 is below 0 (allowed: a whole number, 0 or more" in capsys.readouterr().err


def test_a_case_s_layout_is_labelled_as_the_search_labels_it_from_the_scenario_s_schedule(script):
    """The cases table names the schedule a layout runs where `trainsim search`'s table does (from the case's
    scenario's schedule), so a case and a search's winner of the same layout read alike."""
    case = script.Case("70b-tp4-cp2-pp2-v4-zero1", "Llama-3-70B", script.LLAMA_70B, (), script.layout(4, 2, 2, 512, 4))
    rows = [script.Measured(case, 0.0, 0.0, 0.0, "refused: a row of the test", base_schedule=base)
            for base in ("1f1b", "interleaved", "dualpipev")]
    labels = [line.split(" | ")[2] for line in script.cases_table(rows)[2:]]
    assert labels == ["TP4 CP2 PP2 DP32 interleaved v4 mb1 zero1 recompute=none",
                      "TP4 CP2 PP2 DP32 v4 mb1 zero1 recompute=none",
                      "TP4 CP2 PP2 DP32 interleaved v4 mb1 zero1 recompute=none"]
