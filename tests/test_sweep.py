"""Sweep files: expansion (grid x zip x seeded random, constraints), identical results on the local pool and on
a Dask LocalCluster, resuming after an interruption, failing points recorded, and bad sweep files refused in one
line with exit status 2 (an unreachable scheduler: status 1 with its address)."""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import yaml
from shared import CROSS_RAIL_PP, DATA, REPO, SCENARIOS, UNEQUAL_HOSTS_GRAPH

from simulator.cli import main
from simulator.config.loader import scenario_from_text
from simulator.config.yaml_source import parse_field
from simulator.errors import ExecutorError, ScenarioError
from simulator.sweep.console_table import format_sweep_table
from simulator.sweep.constraints import EVALUABLE
from simulator.sweep.executors import DaskExecutor, PoolExecutor, SerialExecutor
from simulator.sweep.fields import value_at
from simulator.sweep.results import SUMMARY_SCHEMA, PointRecord, PointStatus, results_table, write_results
from simulator.sweep.runner import run_sweep
from simulator.sweep.spec import load_sweep, sweep_from_text
from simulator.units import shown_value


def small_job(horizon: str = "1 d", replications: int = 1) -> str:
    """tests/data/small-job.yaml with its horizon and replications set."""
    text = (DATA / "small-job.yaml").read_text()
    run = f"run: {{horizon: {horizon}, replications: {replications},"
    return text.replace("run: {horizon: 1 d, replications: 1,", run)


def job_sweep(grid: str, horizon: str = "1 d", replications: int = 1, outputs: bool = False) -> str:
    """A sweep file whose base is small_job(...) and whose grid is ``grid`` (YAML lines under `grid:`)."""
    lines = small_job(horizon, replications).splitlines()[1:]
    base = "base:\n" + "".join(f"  {line}\n" for line in lines)
    return base + "grid:\n" + grid + ("outputs: true\n" if outputs else "")
SWEEP_200 = DATA / "sweep_200.yaml"
BASE = """
base:
  cluster: {topology: dgx-h100}
  model: {synthetic: {stages: 4, forward: 1 ms, backward: 2 ms}}
  training: {microbatches: 8}
  parallelism: {pp: 4, dp: 2, pipeline: {schedule: gpipe}}
  run: {timeline: summary}
"""


class CountingExecutor(SerialExecutor):
    """The serial executor, counting the points it is given."""

    def __init__(self):
        self.ran: list[int] = []

    def map_unordered(self, fn, tasks, starting=None):
        for task in tasks:
            self.ran.append(task.index)
            if starting is not None:
                starting(task)
            yield fn(task)


def test_200_points_identical_on_local_pool_and_dask(tmp_path):
    sweep = load_sweep(SWEEP_200)
    assert len(sweep.points) == 200
    pool = PoolExecutor(workers=2)
    try:
        report = run_sweep(sweep, tmp_path / "pool", pool)
    finally:
        pool.close()
    dask = DaskExecutor(workers=2)
    try:
        assert dask.workers == 2
        run_sweep(sweep, tmp_path / "dask", dask)
    finally:
        dask.close()
    assert report.statuses == {"invalid": 110, "ok": 90}
    pool_bytes = (tmp_path / "pool" / "results.parquet").read_bytes()
    assert pool_bytes == (tmp_path / "dask" / "results.parquet").read_bytes()
    frame = pd.read_parquet(tmp_path / "pool" / "results.parquet")
    assert list(frame["point"]) == list(range(200))
    refused = frame[frame["status"] == "invalid"]
    stages = refused["error"].str.contains("differs from the synthetic model's 4 stages")
    rounds = refused["error"].str.contains("interleaved schedules run micro-batches in rounds of equal size")
    assert (stages.sum(), rounds.sum(), (stages | rounds).all()) == (100, 10, True)
    assert (frame.loc[frame["status"] == "ok", "step_time_s"] > 0).all()


def test_interrupted_sweep_keeps_finished_points_and_resumes(tmp_path):
    sweep = sweep_from_text(BASE + "grid:\n  training.microbatches: [4, 8, 12, 16, 20, 24]\n", "s.yaml")

    def interrupt_after_three(done, total):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, tmp_path, SerialExecutor(), on_progress=interrupt_after_three)
    finished = pd.read_parquet(tmp_path / "results.parquet")
    assert list(finished["point"]) == [0, 1, 2]
    executor = CountingExecutor()
    report = run_sweep(sweep, tmp_path, executor)
    assert executor.ran == [3, 4, 5]
    assert (report.ran, report.reused) == (3, 3)
    frame = pd.read_parquet(tmp_path / "results.parquet")
    # GPipe with uniform stages: step = (m + p - 1) (F + B) = (m + 3) x 3 ms.
    assert frame["step_time_s"].to_numpy() == pytest.approx([(m + 3) * 3e-3 for m in (4, 8, 12, 16, 20, 24)],
                                                            rel=1e-9)


class ReversingExecutor(SerialExecutor):
    """Finishes the points last to first, as a pool may."""

    def map_unordered(self, fn, tasks, starting=None):
        return super().map_unordered(fn, reversed(list(tasks)), starting)


def test_a_skipped_point_is_journalled_at_the_end_not_appended_one_fsync_each(tmp_path, monkeypatch):
    """No run reuses a skipped point (its constraints are judged again), so skipped points are written with the
    journal's rewrite at the end, not appended and flushed to disk one by one."""
    import simulator.sweep.runner as runner

    sweep = sweep_from_text(BASE + "grid:\n  training.microbatches: [4, 8, 16]\n"
                            "constraints: ['training.microbatches < 8']\n", "s.yaml")
    appended: list[int] = []
    monkeypatch.setattr(runner, "append_record", lambda out_dir, record: appended.append(record.index))
    run_sweep(sweep, tmp_path, SerialExecutor())
    assert appended == [0]
    assert [orjson.loads(line)["status"] for line in (tmp_path / "points.jsonl").read_bytes().splitlines()] == [
        "ok", "skipped", "skipped"]


def test_the_journal_is_in_point_order_whatever_order_points_finish(tmp_path):
    """points.jsonl was appended in completion order, so its bytes varied between runs on a pool or Dask."""
    sweep = sweep_from_text(BASE + "grid:\n  training.microbatches: [4, 8, 12]\n", "s.yaml")
    run_sweep(sweep, tmp_path / "serial", SerialExecutor())
    run_sweep(sweep, tmp_path / "reversed", ReversingExecutor())
    journal = (tmp_path / "reversed" / "points.jsonl").read_bytes()
    assert journal == (tmp_path / "serial" / "points.jsonl").read_bytes()
    assert [orjson.loads(line)["index"] for line in journal.splitlines()] == [0, 1, 2]


def test_changed_point_is_rerun_and_constraint_skips_with_reason(tmp_path):
    text = BASE + "grid:\n  training.microbatches: [4, 8]\n"
    run_sweep(sweep_from_text(text, "s.yaml"), tmp_path, SerialExecutor())
    changed = text.replace("forward: 1 ms", "forward: 2 ms") + "constraints: ['training.microbatches > 4']\n"
    executor = CountingExecutor()
    run_sweep(sweep_from_text(changed, "s.yaml"), tmp_path, executor)
    assert executor.ran == [1]
    frame = pd.read_parquet(tmp_path / "results.parquet")
    assert list(frame["status"]) == ["skipped", "ok"]
    assert frame["error"][0] == "constraint: training.microbatches > 4"
    assert frame["step_time_s"][1] == pytest.approx((8 + 3) * 4e-3, rel=1e-9)


def test_grid_zip_random_expand_in_order_and_random_is_seeded():
    text = BASE + """
grid: {training.microbatches: [4, 8]}
zip: {parallelism.ddp.bucket: [1 MiB, 25 MiB], parallelism.ddp.overlap: [false, true]}
random:
  seed: 11
  samples: 3
  axes:
    model.synthetic.forward: {low: 1 ms, high: 4 ms, log: true}
    parallelism.zero: [0, 1]
"""
    first, again = sweep_from_text(text), sweep_from_text(text)
    assert len(first.points) == 2 * 2 * 3
    assert [p.values for p in first.points] == [p.values for p in again.points]
    assert first.points[0].values[:3] == (("training.microbatches", 4), ("parallelism.ddp.bucket", "1 MiB"),
                                          ("parallelism.ddp.overlap", False))
    assert first.points[3].values[1] == ("parallelism.ddp.bucket", "25 MiB")
    draws = [dict(p.values)["model.synthetic.forward"] for p in first.points]
    assert all(1e-3 <= float(d.split()[0]) <= 4e-3 and d.endswith(" s") for d in draws)
    assert draws[:3] == draws[3:6]


def test_a_random_draws_value_reads_in_six_significant_digits(tmp_path, capsys):
    """A draw that a field refuses was named with every digit ('value 11.501145599256004: ...'); the message
    names it as the charts do (`shown_value`), the results keep every digit."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "random: {seed: 7, samples: 1, axes: {training.microbatches: {low: 4, high: 16}}}\n")
    draw = float(np.random.default_rng(7).uniform(4, 16))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial"]) == 2
    assert f"random.axes.training.microbatches: value {draw:.6g}: expected a whole number" in capsys.readouterr().err


@pytest.mark.parametrize("value, shown", [
    (0.1 + 0.2, "0.3"), (11.501145599256004, "11.5011"), (2.0, "2"), (8, "8"), (True, "true"), ("nccl", "nccl"),
    ("0.00143764319991 s", "0.00143764 s"), ("25 MiB", "25 MiB"), ("1e-3 s", "1e-3 s"), ([1, 2], "[1, 2]"),
    (None, "null"), ({"interval": "5 min"}, '{"interval": "5 min"}'),
    (1234567.8, "1,234,568"), (999999.7, "1,000,000"), (-2.5e7, "-25,000,000"), ("12345678.9 B", "12,345,679 B"),
    (2.5e15, "2.5e+15"), (999999.0, "999999"), (1048576.0, "1,048,576"), ("1048577 B", "1,048,577 B"),
])
def test_shown_value_keeps_six_significant_digits_and_what_needs_no_rounding(value, shown):
    assert shown_value(value) == shown


@pytest.mark.parametrize("axes, problem, line", [
    ("grid: {parallelism.ppp: [1, 2]}",
     "grid.parallelism.ppp: unknown key 'ppp' (did you mean pp?) (allowed: strategy, tp,", 8),
    ("grid: {parallelism.pp: []}", "grid.parallelism.pp: [] is empty (allowed: at least 1 item)", 8),
    ("random: {samples: 2, axes: {parallelism.pp: []}}",
     "random.axes.parallelism.pp: [] is empty (allowed: at least 1 item)", 8),  # was '.RandomRange: expected..'
    ("random: {samples: 2, axes: {}}", "random.axes: {} is empty (allowed: at least 1 item)", 8),
    ("grid: {parallelism.ddp.bucket: [1 MiB, 25 parsecs]}", "value '25 parsecs'", 8),
    ("grid: {parallelism.tp: [1, two]}", "value 'two'", 8),
    ("grid: {training.seq_len.x: [1]}", "training.seq_len has no sub-fields", 8),
    ("zip: {parallelism.pp: [1, 2], parallelism.tp: [1]}", "zip: axes of different lengths: parallelism.pp has 2 "
     "values, parallelism.tp 1 (allowed: lists of equal length)", 8),
    # each axis named with its length, in file order: 'zip axes have different lengths [1, 2]' left it to the user
    ("zip: {parallelism.tp: [1], parallelism.pp: [1, 2], training.microbatches: [4, 8]}",
     "zip: axes of different lengths: parallelism.tp has 1 value, parallelism.pp 2, training.microbatches 2", 8),
    ("grid: {training.microbatches: [1, 2, 3, 4]}\ngrid2: 1", "unknown key 'grid2'", 9),
    ("grid: {training.microbatches: [1, 2]}\nconstraints: ['training.micro > 1']",
     "training.micro: unknown key 'micro' (allowed: seq_len,", 9),
    ("grid: {training.microbatches: [1, 2]}\nconstraints: ['parallelism.pq > 1']",  # one group of allowed
     "parallelism.pq: unknown key 'pq' (allowed: strategy, tp, cp, cp_algorithm, cp_load_balance, ep, pp, dp, "
     "order, sequence_parallel, tp_comm_overlap, pipeline, zero, fsdp, ddp)", 9),
    ("grid: {training.microbatches: [1, 2]}\nconstraints: ['__import__(\"os\")']", "uses Call", 9),
    ("grid: {'workload[0.bytes': [1 MiB]}", "not a field path", 8),
    ("random: {seed: -1, samples: 2, axes: {training.microbatches: [1, 2]}}", "random.seed: -1 is below 0", 8),
    ("grid: {training.microbatches.x: [1]}", "training.microbatches has no sub-fields", 8),
    # topology parameters were checked only as each point ran: every point 'invalid', exit status 0
    ("grid: {cluster.nvlink_bandwidth: [450 GB/s, 400 GB]}",
     "grid.cluster.nvlink_bandwidth: value '400 GB': unknown unit 'GB' in '400 GB'", 8),
    ("grid: {cluster.gpuz: [8]}", "grid.cluster.gpuz: value 8: unknown override 'gpuz' for topology kind", 8),
    # a null or boolean axis value was echoed as Python's None / True
    ("grid: {parallelism.ddp.bucket: [1 MiB, null]}",
     "grid.parallelism.ddp.bucket: value null: expected a size with a unit, got null", 8),
    ("grid: {training.microbatches: [1, true]}",
     "grid.training.microbatches: value true: expected a whole number, got true", 8),
    ("zip: {cluster.gpus: [8, 0], training.microbatches: [8, 4]}", "zip.cluster.gpus: value 0: 0 must be positive",
     8),
])
def test_bad_sweep_file_is_one_located_error(tmp_path, capsys, axes, problem, line):
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + axes + "\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and problem in err and f"sweep.yaml:{line}:" in err
    assert err.count("(allowed: ") <= 1
    assert not (tmp_path / "out").exists()


def test_a_constraint_reads_a_digit_part_of_a_mapping_as_its_key():
    """`set_field` writes `cluster.node.7` as the key "7"; a constraint read it as a list index and failed."""
    scenario = scenario_from_text("cluster: {topology: dgx-h100-cluster, node: {kind: nvswitch_node, '7': 3}}\n"
                                  "workload: [{op: all_reduce, bytes: 1 MiB}]\n", "s.yaml").scenario
    assert value_at(scenario, parse_field("cluster.node.7")) == 3
    assert value_at(scenario, parse_field("cluster.node.kind")) == "nvswitch_node"
    assert value_at(scenario, parse_field("workload[0].bytes")) == 2**20


@pytest.mark.parametrize("constraint, problem", [
    ("cluster.nodes >= 2", "the scenario has no cluster.nodes"),
    ("network.efficiency.nvlink < 1", "the scenario has no network.efficiency.nvlink"),
    ("cluster.node.gpus >= 2", "the scenario has no cluster.node"),
])
def test_a_constraint_on_a_value_the_point_lacks_is_one_located_error(tmp_path, capsys, constraint, problem):
    """Keys of open sections (topology parameters, mappings) are checked per point: a missing one was a bare
    KeyError text, and a key under a text or a mapping a traceback (AttributeError)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + f"grid: {{training.microbatches: [4]}}\nconstraints: ['{constraint}']\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}:9: constraints[0]: cannot evaluate at point 0: {problem} (allowed: {EVALUABLE})\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("constraint, problem", [
    ("10.0 ** 400 > 1", "10.0 ** 400 overflows a float"),  # was an OverflowError traceback, exit status 1
    ("9 ** 9 ** 9 > 1", "9 ** 9 ** 9 is beyond 4096-bit numbers"),  # was a hang (a 1.2-billion-bit power)
    ("'a' * 10 ** 11 == 'b'", "'a' * 10 ** 11: texts and lists only join with +"),  # was 'out of memory', 1
    ("'%999999999s' % 1 == 'b'", "'%999999999s' % 1: texts and lists only join with +"),
])
def test_a_constraint_too_large_to_evaluate_is_one_located_error(tmp_path, capsys, constraint, problem):
    """Arithmetic that overflows, or would take the memory or hours, is refused at the constraint's line, saying what a
    constraint may compute."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + f"grid: {{training.microbatches: [4]}}\nconstraints: [\"{constraint}\"]\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial"]) == 2
    assert capsys.readouterr().err == (f"error: {path}:9: constraints[0]: cannot evaluate at point 0: {problem} "
                                       f"(allowed: {EVALUABLE})\n")
    assert not (tmp_path / "out").exists()


def test_constraint_arithmetic_within_bounds_still_holds():
    """The bounds leave ordinary constraints alone: powers of a field, joined texts, 2 ** 4096."""
    sweep = sweep_from_text(BASE + "grid: {training.microbatches: [4, 8]}\nconstraints: ['2 ** training."
                            "microbatches > 100 and parallelism.pipeline.schedule + \"x\" == \"gpipex\" "
                            "and 2 ** 4096 > 0']\n")
    assert [point.skipped for point in sweep.points] == ["constraint: 2 ** training.microbatches > 100 and "
                                                         "parallelism.pipeline.schedule + \"x\" == \"gpipex\" "
                                                         "and 2 ** 4096 > 0", ""]


def test_a_point_the_simulator_refuses_is_located_at_the_axis_that_set_the_field(tmp_path):
    """The error named the base scenario's line, which shows the value the axis replaced (global_batch: 32)."""
    path = tmp_path / "sweep.yaml"
    path.write_text("base: llama3-8b-dgx-h100-dp8\ngrid:\n  training.global_batch: [33]\n")
    run_sweep(load_sweep(path), tmp_path / "out", SerialExecutor())
    frame = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert list(frame["status"]) == ["invalid"]
    assert frame["error"][0] == (f"{path}:3: grid.training.global_batch: value 33: global_batch 33 is not a "
                                 "multiple of micro_batch x dp = 8 (allowed: multiples of 8)")


def test_the_command_says_why_points_did_not_run(tmp_path, capsys):
    """'sweep: 4 points (1 invalid, 2 ok, 1 skipped)' sent the user to results.csv to learn why; the command
    prints each status's first point, how many others share it, and its reason."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  parallelism.pp: [4, 3]\n  training.microbatches: [2, 8]\n"
                    "constraints: ['training.microbatches > 2']\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sweep: 4 points (1 invalid, 1 ok, 2 skipped; 0 reused)")
    assert lines[1:] == [f"  invalid: point 3: {path}:9: grid.parallelism.pp: value 3: pp 3 differs from the "
                         "synthetic model's 4 stages (allowed: 4 (or leave it out))",
                         "  skipped: point 0 (and 1 other): constraint: training.microbatches > 2"]


def test_the_sweep_says_on_stderr_which_point_it_simulates_and_its_wall_time(tmp_path, capsys):
    """Each point is said on stderr as it starts and as it finishes with its status and wall time (a slow point
    among six at 2,048 GPUs could be found only by watching); the table and journal hold no wall time, so
    two runs of the sweep write them byte for byte alike."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  parallelism.pp: [4, 3]\n")
    for out in ("a", "b"):
        assert main(["sweep", str(path), "--out", str(tmp_path / out), "--executor", "serial"]) == 0
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep: ")]
        assert [re.sub(r"in \d+\.\d s wall$", "in S s wall", line) for line in lines] == [
            "sweep: simulating point 0 (parallelism.pp=4)", "sweep: point 0 (parallelism.pp=4) ok in S s wall",
            "sweep: simulating point 1 (parallelism.pp=3)", "sweep: point 1 (parallelism.pp=3) invalid in S s wall"]
    for name in ("results.csv", "results.parquet", "points.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_a_point_whose_fold_falls_out_of_step_says_why_it_ran_again(tmp_path, capsys):
    """CROSS_RAIL_PP's stage fold falls out of step at a hand-off in its run and the step runs again refolded by
    route class (tests/test_cli.py): the point's line says so, with the first fold given up and its `why` as
    `fold_given_up` records them, and the wall time from the drop to the end (a layout search's line the same,
    `TimedPoint.done_text`), so a user seeing one point take minutes knows why; the table holds no wall time."""
    (tmp_path / "base.yaml").write_text(CROSS_RAIL_PP + "run: {timeline: summary}\n")
    path = tmp_path / "sweep.yaml"
    path.write_text("base: base.yaml\ngrid:\n  run.seed: [0]\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial"]) == 0
    done = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep: point 0")]
    assert [re.sub(r"\d+\.\d s wall", "S s wall", line) for line in done] == [
        "sweep: point 0 (run.seed=0) ok in S s wall; refolded: the stage fold given up: a hand-off fell out of step "
        "in its run, S s wall from there"]


def test_a_pooled_sweep_says_each_point_it_starts_from_the_parent(tmp_path, capsys):
    """With a pool of workers the line that a point starts comes from this process as it hands the point out,
    above its own progress bar: a forked worker printing it through rich's stderr proxy redrew a stale copy of
    the bar on a terminal (and its line never reached this process's stderr as the tests capture it)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  parallelism.pp: [4, 3]\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "local", "--workers", "2"]) == 0
    lines = [re.sub(r"in \d+\.\d s wall$", "in S s wall", line) for line in capsys.readouterr().err.splitlines()
             if line.startswith("sweep: ")]
    assert sorted(lines) == ["sweep: point 0 (parallelism.pp=4) ok in S s wall",
                             "sweep: point 1 (parallelism.pp=3) invalid in S s wall",
                             "sweep: simulating point 0 (parallelism.pp=4)",
                             "sweep: simulating point 1 (parallelism.pp=3)"]
    for index in (0, 1):
        started, done = (next(at for at, line in enumerate(lines) if line.startswith(head))
                         for head in (f"sweep: simulating point {index} ", f"sweep: point {index} "))
        assert started < done


@pytest.mark.parametrize("axis, message", [
    ("parallelism.order[0]", "grid.parallelism.order[0]: parallelism.order has no item [0] (the scenario gives no "
                             "parallelism.order) (allowed: a whole list as parallelism.order)"),  # expected a list,
    # got {'0': 2}
    ("faults.components.1", "grid.faults.components.1: value 2: expected a mapping, got 2 (allowed: a YAML "
                            "mapping such as {key: value})"),
    ("faults.components[1]", "grid.faults.components[1]: value 2: expected a mapping, got 2 (allowed: a YAML "
                             "mapping such as {key: value})"),
])
def test_an_axis_adding_a_path_the_base_lacks_is_blamed_at_the_axis(tmp_path, capsys, axis, message):
    """The error named an unrelated line of the base (`description:`, the parallelism line) and left out the
    axis's value: the axis was matched to pydantic's field as text, which missed a digit key (`components.1`
    against `components[1]`) and an error on a section above the axis (`parallelism.order`)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: schedule-gpipe-p4-m8\ngrid:\n  {axis}: [2, 4]\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial"]) == 2
    assert capsys.readouterr().err == f"error: {path}:3: {message}\n"


def test_an_axis_over_a_trace_knob(tmp_path):
    """`workload` is a list or a trace's mapping: the axis check read it as a list only and refused every trace
    knob with 'workload has no sub-fields'."""
    base = SCENARIOS / "trace-allreduce-2rank.yaml"
    sweep = sweep_from_text(f"base: {base}\ngrid:\n  workload.compute_scale: [1.0, 2.0]\n")
    assert [point.data["workload"]["compute_scale"] for point in sweep.points] == [1.0, 2.0]


def test_a_set_on_a_digit_key_is_blamed_at_the_set(tmp_path, capsys):
    """`--set faults.components.1=2` was blamed on line 3 of the scenario (`description:`)."""
    assert main(["run", "schedule-gpipe-p4-m8", "--set", "faults.components.1=2", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim run: --set faults.components.1=2: expected a "
                                       "mapping, got 2 (allowed: a YAML mapping such as {key: value})\n")


def test_more_points_than_allowed_is_refused(tmp_path, capsys):
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid: {training.microbatches: [1, 2, 3], parallelism.zero: [0, 1]}\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--max-points", "5"]) == 2
    assert "6 points is more than --max-points 5" in capsys.readouterr().err


def test_too_many_random_samples_are_blamed_at_samples(tmp_path, capsys):
    """A sweep of random samples only is refused at `samples`, not at 'grid', which it lacks (line 1, the base). The
    counts carry separators (not 1000000 points, --max-points 10000, read as digits to count)."""
    path = tmp_path / "sweep.yaml"
    path.write_text("base: schedule-gpipe-p4-m8\nrandom:\n  seed: 1\n  samples: 1000000\n"
                    "  axes: {run.seed: [1, 2]}\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"error: {path}:4: random.samples: 1,000,000 points is more than "
                                       "--max-points 10,000 (allowed: fewer axis values or samples, or a larger "
                                       "--max-points)\n")


def test_a_local_dask_cluster_starts_beside_another_that_holds_port_8787():
    """Two sweeps on one machine (or a sweep beside a notebook's cluster) each start their own LocalCluster: the
    second must not trip over the first's HTTP port (a warning, which fails under filterwarnings = error)."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("", 8787))
        except OSError:
            pass
        holder.listen()
        dask = DaskExecutor(workers=1)
        try:
            assert sorted(dask.map_unordered(abs, [-2, -1])) == [1, 2]
        finally:
            dask.close()


def test_unreachable_scheduler_names_its_address():
    with pytest.raises(ExecutorError, match=r"tcp://127\.0\.0\.1:9"):
        DaskExecutor("tcp://127.0.0.1:9", timeout_s=1)


@pytest.mark.parametrize("command", ["sweep", "search"])
def test_an_executor_that_cannot_start_is_one_line_and_status_1(command, tmp_path, capsys, monkeypatch):
    """sweep and search leave a failed executor to main's handler, which keeps a message to one line."""
    def unreachable(*_args):
        raise ExecutorError("cannot reach the Dask scheduler\nat tcp://127.0.0.1:9 (OSError)")

    monkeypatch.setattr("simulator.sweep.executors.make_executor", unreachable)
    given = str(tmp_path / "sweep.yaml") if command == "sweep" else "schedule-gpipe-p4-m8"
    (tmp_path / "sweep.yaml").write_text("base: schedule-gpipe-p4-m8\ngrid: {training.microbatches: [4]}\n")
    assert main([command, given, "--out", str(tmp_path / "out"), "--executor", "dask"]) == 1
    assert capsys.readouterr().err == "error: cannot reach the Dask scheduler; at tcp://127.0.0.1:9 (OSError)\n"


@pytest.mark.parametrize("command", ["sweep", "search"])
@pytest.mark.parametrize(("flags", "error"), [
    (["--scheduler", "tcp://127.0.0.1:1"], "--scheduler: --executor local uses no Dask scheduler: the points would "
                                           "run on this machine (allowed: --scheduler with --executor dask)"),
    (["--executor", "serial", "--workers", "4"], "--workers: --executor serial runs every point in this process, one "
                                                 "at a time (allowed: --workers with --executor local, or dask "
                                                 "without --scheduler)"),
    (["--executor", "dask", "--scheduler", "tcp://127.0.0.1:1", "--workers", "4"],
     "--workers: a Dask scheduler's workers are the ones started with it (dask worker --nworkers) (allowed: "
     "--workers with --executor local, or dask without --scheduler)")])
def test_an_executor_flag_the_executor_would_ignore_is_refused(command, flags, error, tmp_path, capsys):
    """`--scheduler tcp://...` without `--executor dask`, and `--workers` under `--executor serial`, which the
    executor would ignore, are refused in one line naming what is allowed."""
    given = str(tmp_path / "sweep.yaml") if command == "sweep" else "schedule-gpipe-p4-m8"
    (tmp_path / "sweep.yaml").write_text("base: schedule-gpipe-p4-m8\ngrid: {training.microbatches: [4]}\n")
    assert main([command, given, "--out", str(tmp_path / "out"), "--quiet", *flags]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim {command}: {error}\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("name", "workers", "scheduler", "flag"), [
    ("local", 0, "tcp://127.0.0.1:1", "--scheduler"), ("serial", 4, None, "--workers"),
    ("dask", 4, "tcp://127.0.0.1:1", "--workers")])
def test_make_executor_refuses_what_the_executor_would_ignore_as_the_commands_do(name, workers, scheduler, flag):
    """The commands refused a scheduler or workers the executor ignores; `make_executor`, the Python API, still
    ran a local pool given a scheduler. Both run one check."""
    from simulator.errors import InputError
    from simulator.sweep.executors import make_executor

    with pytest.raises(InputError) as error:
        make_executor(name, workers, scheduler)
    assert error.value.field == flag


def test_base_scenario_path_is_relative_to_the_sweep_file(tmp_path):
    (tmp_path / "sweep.yaml").write_text("base: ../nowhere.yaml\ngrid: {parallelism.pp: [1]}\n")
    with pytest.raises(ScenarioError, match="no scenario file"):
        load_sweep(tmp_path / "sweep.yaml")


def test_a_sweep_without_a_base_says_what_a_base_is(tmp_path):
    """A sweep file without `base` is told what a base is, not "base: required field is missing (allowed: text)"."""
    (tmp_path / "sweep.yaml").write_text("grid: {parallelism.pp: [1]}\n")
    with pytest.raises(ScenarioError) as refused:
        load_sweep(tmp_path / "sweep.yaml")
    assert (refused.value.field, refused.value.problem) == ("base", "required field is missing")
    assert refused.value.allowed == ("a scenario path relative to the sweep file, a bundled scenario's name "
                                     "(trainsim scenarios), or an inline scenario")


def test_base_scenario_by_bundled_name(tmp_path):
    """`base:` may name a bundled scenario, as `trainsim run NAME` does; a file beside the sweep comes first."""
    (tmp_path / "sweep.yaml").write_text("base: schedule-1f1b-p4-m8\ngrid: {training.microbatches: [4, 8]}\n")
    sweep = load_sweep(tmp_path / "sweep.yaml")
    assert Path(sweep.base_source).name == "schedule-1f1b-p4-m8.yaml"
    assert [point.data["training"]["microbatches"] for point in sweep.points] == [4, 8]
    (tmp_path / "schedule-1f1b-p4-m8").write_text(Path(sweep.base_source).read_text())
    assert load_sweep(tmp_path / "sweep.yaml").base_source == str(tmp_path / "schedule-1f1b-p4-m8")


def test_point_outputs_only_when_asked(tmp_path):
    text = BASE + "grid:\n  training.microbatches: [4, 8]\n"
    run_sweep(sweep_from_text(text, "s.yaml"), tmp_path / "plain", SerialExecutor())
    assert not (tmp_path / "plain" / "points").exists()
    run_sweep(sweep_from_text(text + "outputs: true\n", "s.yaml"), tmp_path / "kept", SerialExecutor())
    assert sorted(p.name for p in (tmp_path / "kept" / "points").iterdir()) == ["00000", "00001"]
    assert (tmp_path / "kept" / "points" / "00001" / "summary.json").is_file()


def test_point_outputs_on_resume_are_written_for_points_finished_without_them(tmp_path):
    """Resuming with --point-outputs, a finished point whose folder is incomplete or holds another scenario's run runs
    again, so OUT/points/ lacks none (not the points an earlier run finished without outputs, reused silently); one
    whose outputs are there is reused."""
    text = BASE + "grid:\n  training.microbatches: [4, 8]\n"
    out = tmp_path / "out"

    def resume() -> tuple[int, int]:
        report = run_sweep(sweep_from_text(text, "s.yaml"), out, SerialExecutor(), point_outputs=True)
        return report.ran, report.reused

    run_sweep(sweep_from_text(text, "s.yaml"), out, SerialExecutor())
    assert resume() == (2, 0)
    assert sorted(p.name for p in (out / "points").iterdir()) == ["00000", "00001"]
    assert resume() == (0, 2)
    shutil.rmtree(out / "points" / "00001")
    shutil.copytree(out / "points" / "00000", out / "points" / "00001")  # a complete run of the other point
    (out / "points" / "00000" / "summary.json").unlink()
    assert resume() == (2, 0)
    assert resume() == (0, 2)


def test_a_sweep_over_a_job_runs_the_job_simulation_at_every_point(tmp_path):
    """A base with `run.horizon` is a job: every point runs the job simulation as `trainsim run` does, its row holds
    job_summary.json's figures and its point folder the job's files."""
    from simulator.reliability.simulate import simulate_job

    job = job_sweep("  faults.rate_multiplier: [1, 4]\n", horizon="2 d", replications=2, outputs=True)
    out = tmp_path / "out"
    report = run_sweep(sweep_from_text(job, "s.yaml"), out, SerialExecutor())
    assert report.statuses == {"ok": 2}
    rows = pd.read_parquet(out / "results.parquet")
    base = small_job("2 d", 2)
    for point, multiplier in enumerate((1, 4)):
        expected = simulate_job(scenario_from_text(base, "job.yaml", [f"faults.rate_multiplier={multiplier}"]))
        assert rows["ettr.mean"].iloc[point] == expected.summary["ettr"]["mean"]
        assert orjson.loads(rows["ettr.by_replication"].iloc[point]) == list(expected.ettr_by_replication)
        written = orjson.loads((out / "points" / f"{point:05d}" / "job_summary.json").read_bytes())
        assert written["ettr"] == expected.summary["ettr"]
    assert rows["interruptions.unexpected.mean"].iloc[1] > 2 * rows["interruptions.unexpected.mean"].iloc[0]
    assert run_sweep(sweep_from_text(job, "s.yaml"), out, SerialExecutor()).reused == 2


def test_a_job_sweeps_rows_say_whether_the_step_fits_in_memory(tmp_path):
    """Llama 3 8B and 70B under TP 8 on one DGX H100: the 70B step needs more than the H100's 79.6 GiB (70.6e9
    parameters / 8 at 18 B of bf16 weights, fp32 gradients and Adam's 12 B are 147.8 GiB alone). A job point's row
    holds the healthy step's `oom`, `memory_tight`, peak and capacity per GPU and `warnings` beside
    job_summary.json's figures, as a step point's row does, equal to the step's summary.json, so the sweep's table
    tells the layout that does not fit; that point has a status of its own, `out_of_memory`, not counted ok by the
    end line nor drawn in `plot heatmap`'s cells as if it ran, and it keeps that status when a re-run reuses it."""
    sweep = job_sweep("  model.preset: [llama3-8b, llama3-70b]\n", outputs=True)
    out = tmp_path / "out"
    report = run_sweep(sweep_from_text(sweep, "s.yaml"), out, SerialExecutor())
    assert report.statuses == {"ok": 1, "out_of_memory": 1}
    rows = pd.read_parquet(out / "results.parquet")
    assert list(rows["oom"]) == [False, True]
    assert list(rows["memory_tight"]) == [False, False]  # out of memory is not tight
    assert list(rows["status"]) == ["ok", "out_of_memory"]
    assert rows["error"][1] == f"out of memory: peak {rows['peak_memory_gib'][1]:.1f} GiB > 79.6 GiB per GPU"
    first = (out / "results.parquet").read_bytes()
    assert run_sweep(sweep_from_text(sweep, "s.yaml"), out, SerialExecutor()).reused == 2
    assert (out / "results.parquet").read_bytes() == first
    for point in (0, 1):
        step = orjson.loads((out / "points" / f"{point:05d}" / "summary.json").read_bytes())
        assert rows["peak_memory_gib"].iloc[point] == step["peak_memory_gib"]
        assert rows["memory_capacity_gib"].iloc[point] == step["memory_capacity_gib"] == pytest.approx(79.65,
                                                                                                      abs=0.01)
        assert orjson.loads(rows["warnings"].iloc[point]) == step["warnings"]
    assert rows["peak_memory_gib"].iloc[1] > 147.8


def test_a_point_an_earlier_trainsim_recorded_ok_out_of_memory_is_reused_as_out_of_memory(tmp_path):
    """A journal written before the status out_of_memory holds `{"status": "ok", "metrics": {"oom": true, ...}}`:
    reused, it is judged again, and its row says out_of_memory with its peak, without running the point."""
    sweep = sweep_from_text(BASE + "grid:\n  training.microbatches: [8]\n", "s.yaml")
    out = tmp_path / "out"
    out.mkdir()
    old = {"index": 0, "key": sweep.points[0].key, "status": "ok", "error": "", "overrides": [],
           "summary_schema": SUMMARY_SCHEMA, "metrics": {
               "oom": True, "peak_memory_gib": 85.61, "memory_capacity_gib": 79.65, "tokens_per_s": 9.0}}
    (out / "points.jsonl").write_bytes(orjson.dumps(old) + b"\n")
    executor = CountingExecutor()
    report = run_sweep(sweep, out, executor)
    assert (executor.ran, report.reused, report.statuses) == ([], 1, {"out_of_memory": 1})
    row = pd.read_csv(out / "results.csv").iloc[0]
    assert (row["status"], row["error"]) == ("out_of_memory", "out of memory: peak 85.6 GiB > 79.7 GiB per GPU")


def test_the_journal_is_read_back_as_point_statuses_and_an_unknown_status_runs_again(tmp_path):
    """Statuses are a PointStatus, read back from the journal as its members; a record of a status this trainsim
    does not know is not reused."""
    from simulator.sweep.results import PointStatus, read_records

    sweep = sweep_from_text(BASE + "grid:\n  training.microbatches: [8, 16]\n", "s.yaml")
    run_sweep(sweep, tmp_path, SerialExecutor())
    records = read_records(tmp_path)
    assert [type(record.status) for record in records.values()] == [PointStatus, PointStatus]
    lines = (tmp_path / "points.jsonl").read_bytes().splitlines()
    (tmp_path / "points.jsonl").write_bytes(b"\n".join([lines[0].replace(b'"ok"', b'"done"'), lines[1]]) + b"\n")
    executor = CountingExecutor()
    assert run_sweep(sweep, tmp_path, executor).statuses == {"ok": 2}
    assert executor.ran == [0]


def test_the_end_line_gives_the_points_out_of_memory_one_reason_with_the_range_of_their_peaks(tmp_path, capsys):
    """The points out of memory share one line of the end line, with the range of their peaks; results.csv's
    error keeps each point's own."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  training.microbatches: [8, 16, 32]\n")
    out = tmp_path / "out"
    out.mkdir()
    lines = [orjson.dumps({"index": point.index, "key": point.key, "status": "out_of_memory", "overrides": [],
                           "error": f"out of memory: peak {peak:.1f} GiB > 79.7 GiB per GPU",
                           "summary_schema": SUMMARY_SCHEMA,
                           "metrics": {"oom": True, "peak_memory_gib": peak, "memory_capacity_gib": 79.65}})
             for point, peak in zip(load_sweep(path).points, (85.61, 141.94, 99.0), strict=True)]
    (out / "points.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    assert main(["sweep", str(path), "--out", str(out), "--executor", "serial", "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  out_of_memory: point 0 (and 2 others): out of memory: peak 85.6 to 141.9 GiB > 79.7 GiB per GPU"]
    assert list(pd.read_csv(out / "results.csv")["error"]) == [
        f"out of memory: peak {peak} GiB > 79.7 GiB per GPU" for peak in ("85.6", "141.9", "99.0")]


def test_a_job_sweep_of_a_synthetic_model_writes_no_column_of_nothing(tmp_path):
    """A synthetic model has no tokens: its job's goodput is in healthy-equivalent steps/s, and its table wrote
    an all-null `goodput_tokens_per_s` column (and tokens_per_step, ideal_tokens_per_s, and with one replication
    every ci95 bound: 75 columns of nothing). A step of 33 ms ((m + p - 1)(F + B), 1F1B, m = 8, p = 4) over a
    day without failures runs 86,400 / 0.033 steps less the checkpoints' stalls: the goodput is the ideal
    1 / 0.033 = 30.3 steps/s times the ETTR."""
    sweep = ("base:\n  cluster: {topology: dgx-h100}\n"
             "  model: {synthetic: {stages: 4, forward: 1 ms, backward: 2 ms}}\n"
             "  training: {microbatches: 8}\n  parallelism: {pp: 4, dp: 2}\n  run: {horizon: 1 d}\n"
             "  checkpoint: {size: 1 GB}\ngrid:\n  checkpoint.interval: [10 min, 30 min]\n")
    out = tmp_path / "out"
    assert run_sweep(sweep_from_text(sweep, "s.yaml"), out, SerialExecutor()).statuses == {"ok": 2}
    rows = pd.read_parquet(out / "results.parquet")
    assert [column for column in rows.columns if rows[column].isna().all()] == []
    assert not [column for column in rows.columns if "token" in column or "ci95" in column]
    assert list(rows["ideal_steps_per_s"]) == pytest.approx([1 / 0.033] * 2, rel=1e-12)
    assert list(rows["goodput_steps_per_s.mean"]) == pytest.approx(list(rows["ettr.mean"] / 0.033), rel=1e-9)


def test_a_schedule_sweep_of_a_synthetic_model_has_no_token_or_flop_figures(tmp_path):
    """A synthetic model states no tokens and no FLOPs: its summary's throughput, FLOP rates, MFU and HFU are
    null, not 0 (docs/outputs.md), so a sweep over schedules writes no column of them, and its steps are
    (m + p - 1)(F + B) = 33 ms for both GPipe and 1F1B."""
    from simulator.config.loader import load_scenario
    from simulator.simulation import simulate

    unknown = ("tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "hardware_tflops_per_gpu")
    summary = simulate(load_scenario(SCENARIOS / "schedule-1f1b-p4-m8.yaml", [])).summary
    assert {key: summary[key] for key in unknown} == dict.fromkeys(unknown)
    out = tmp_path / "out"
    sweep = sweep_from_text(BASE + "grid:\n  parallelism.pipeline.schedule: [gpipe, 1f1b]\n", "s.yaml")
    assert run_sweep(sweep, out, SerialExecutor()).statuses == {"ok": 2}
    rows = pd.read_parquet(out / "results.parquet")
    assert not set(unknown) & set(rows.columns)
    assert list(rows["step_time_s"]) == pytest.approx([0.033, 0.033], rel=1e-12)


def test_force_runs_a_job_point_refused_for_its_size(tmp_path, monkeypatch, capsys):
    """A point over the job-event limit says "or pass --force", and `trainsim sweep --force` runs it, and runs again the
    point an earlier run refused."""
    import simulator.reliability.simulate as job_simulation

    monkeypatch.setattr(job_simulation, "MAX_JOB_EVENTS", 10)
    path = tmp_path / "sweep.yaml"
    path.write_text(job_sweep("  faults.rate_multiplier: [1]\n", horizon="2 d"))
    out = tmp_path / "out"
    command = ["sweep", str(path), "--out", str(out), "--executor", "serial", "--quiet"]
    assert main(command) == 0
    refused = pd.read_parquet(out / "results.parquet")
    assert list(refused["status"]) == ["invalid"]
    assert refused["error"][0].endswith("or pass --force)")
    assert main([*command, "--force"]) == 0
    assert list(pd.read_parquet(out / "results.parquet")["status"]) == ["ok"]
    assert "1 ok; 0 reused" in capsys.readouterr().out


def test_a_job_point_writes_the_files_trainsim_run_writes(tmp_path):
    """`trainsim run` and a sweep point run a job through one path, reliability.report.run_job, so a point's folder
    holds the files `trainsim run` writes, byte for byte (the manifest aside: it names the scenario's source). The
    point's folder holds its inline base as scenario.yaml too, which its job_summary.json names, and which `trainsim
    run` is given."""
    from simulator.reliability.report import run_job

    sweep = job_sweep("  run.seed: [3]\n")
    run_sweep(sweep_from_text(sweep, str(tmp_path / "sweep.yaml")), tmp_path / "sweep", SerialExecutor(),
              point_outputs=True)
    point = tmp_path / "sweep" / "points" / "00000"
    source = str(point / "scenario.yaml")
    assert main(["run", source, "--set", "run.seed=3", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    _, files = run_job(scenario_from_text(small_job(), source), tmp_path / "library")
    for folder in (point, tmp_path / "library"):
        assert sorted(path.name for path in folder.iterdir() if path.name != "scenario.yaml") == sorted(files)
        for name in files[:-1]:
            assert (folder / name).read_bytes() == (tmp_path / "run" / name).read_bytes(), name


def test_a_set_overrides_the_base_of_every_point_before_its_axes(tmp_path, capsys):
    """`trainsim sweep --set` writes into the base scenario, as `trainsim run --set` does, and the axes then
    write each point's values: GPipe on 4 uniform stages steps in (m + 3)(F + B), 4 ms a micro-batch with
    `--set model.synthetic.forward=2ms` against the file's 3 ms. A re-run with the same `--set` reuses every
    point, one without it runs them all again (the point's key digests its whole scenario)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  training.microbatches: [4, 8]\n")
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--set", "model.synthetic.forward=2ms", "--out", str(out), "--executor",
                 "serial", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("sweep: 2 points (2 ok; 0 reused)")
    frame = pd.read_parquet(out / "results.parquet")
    assert frame["step_time_s"].to_numpy() == pytest.approx([(m + 3) * 4e-3 for m in (4, 8)], rel=1e-9)
    assert list(frame["overrides"]) == ['["model.synthetic.forward=2ms"]'] * 2
    assert [record["overrides"] for record in map(orjson.loads, (out / "points.jsonl").read_text().splitlines())] == [
        ["model.synthetic.forward=2ms"]] * 2
    executor = CountingExecutor()
    run_sweep(load_sweep(path, overrides=["model.synthetic.forward=2ms"]), out, executor)
    assert executor.ran == []
    run_sweep(load_sweep(path), out, executor)
    assert executor.ran == [0, 1]
    frame = pd.read_parquet(out / "results.parquet")
    assert frame["step_time_s"].to_numpy() == pytest.approx([(m + 3) * 3e-3 for m in (4, 8)], rel=1e-9)
    assert "overrides" not in frame


def test_a_reused_point_records_the_sets_of_the_run_that_reused_it(tmp_path):
    """`--set model.synthetic.forward=1 ms` writes the base's own value, so every point's scenario and key are the
    earlier run's and the points are reused; their records take this run's `--set`s, so the table says what this run
    gave, and the other way round."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  training.microbatches: [4, 8]\n")
    out, executor = tmp_path / "out", CountingExecutor()

    def recorded() -> list[list[str]]:
        return [record["overrides"] for record in map(orjson.loads, (out / "points.jsonl").read_text().splitlines())]

    run_sweep(load_sweep(path), out, executor)
    report = run_sweep(load_sweep(path, overrides=["model.synthetic.forward=1 ms"]), out, executor)
    assert (executor.ran, report.reused) == ([0, 1], 2)
    assert recorded() == [["model.synthetic.forward=1 ms"]] * 2
    assert list(pd.read_parquet(out / "results.parquet")["overrides"]) == ['["model.synthetic.forward=1 ms"]'] * 2
    run_sweep(load_sweep(path), out, executor)
    assert executor.ran == [0, 1] and recorded() == [[], []]
    assert "overrides" not in pd.read_parquet(out / "results.parquet")


@pytest.mark.parametrize("override", ["training.microbatches=2", "training={microbatches: 2}"])
def test_a_set_on_a_field_an_axis_sets_is_refused(tmp_path, capsys, override):
    """An axis writes its field at every point, so a `--set` of that field (or of the section holding it) would
    be dropped without a word, or would leave the axis's column naming values no point ran: refused at the
    `--set`, naming the axis and its line; nothing is written."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  training.microbatches: [4, 8]\n")
    assert main(["sweep", str(path), "--set", override, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: command line: trainsim sweep: --set {override}: the sweep's axis grid.training.microbatches "
        f"({path}:9) sets "
        "training.microbatches at every point (allowed: a field no axis writes: vary it in the sweep file, or "
        "leave out the --set)\n")
    assert not (tmp_path / "out").exists()


def test_a_set_that_takes_away_an_axis_field_is_refused_at_the_set(tmp_path, capsys):
    """A `--set` of a section above an axis that leaves the axis's path pointing at nothing (an empty straggler
    list under an axis on its item [0]) is the `--set`'s fault, not the sweep file's: refused at the `--set`,
    as any `--set` on an axis's field is, not blamed on the axis's line."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "  faults: {step: {stragglers: [{gpus: [0], slowdown: 1.5}]}}\n"
                    "grid:\n  faults.step.stragglers[0].slowdown: [1.5, 2.0]\n")
    override = "faults.step.stragglers=[]"
    assert main(["sweep", str(path), "--set", override, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: command line: trainsim sweep: --set {override}: the sweep's axis "
        "grid.faults.step.stragglers[0].slowdown "
        f"({path}:10) sets faults.step.stragglers[0].slowdown at every point (allowed: a field no axis writes: vary "
        "it in the sweep file, or leave out the --set)\n")


def test_a_bad_set_value_is_located_at_the_set(tmp_path, capsys):
    """A value the schema refuses stops the sweep at the `--set`, on the command line of the command; one the
    simulator refuses when it builds a point makes the points invalid, their error located at the `--set` too, not
    at the base's line, in results.parquet as the library writes it (no command), and on the command line of the
    command in the sweep's closing lines. The key is named once: it read `--set a.b=v: a.b: problem`."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  training.microbatches: [4, 8]\n")
    assert main(["sweep", str(path), "--set", "parallelism.dp=two", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("error: command line: trainsim sweep: --set parallelism.dp=two: expected")
    run_sweep(load_sweep(path, overrides=["parallelism.pp=3"]), tmp_path / "pp3", SerialExecutor())
    frame = pd.read_parquet(tmp_path / "pp3" / "results.parquet")
    assert list(frame["status"]) == ["invalid", "invalid"]
    reason = "--set parallelism.pp=3: pp 3 differs from the synthetic model's 4 stages (allowed: 4 (or leave it out))"
    assert frame["error"][0] == reason
    assert main(["sweep", str(path), "--set", "parallelism.pp=3", "--out", str(tmp_path / "pp3"), "--quiet"]) == 0
    assert f"  invalid: point 0 (and 1 other): command line: trainsim sweep: {reason}\n" in capsys.readouterr().out


def test_a_point_recorded_under_earlier_summary_names_runs_again(tmp_path):
    """A record from before `SUMMARY_SCHEMA` (none in its journal line) runs again, not reused beside new ones (the
    table would hold both the old and the new memory columns, each NaN in the other's rows)."""
    sweep = sweep_from_text(BASE + "grid:\n  training.microbatches: [4, 8]\n", "s.yaml")
    run_sweep(sweep, tmp_path, SerialExecutor())
    journal = tmp_path / "points.jsonl"
    lines = journal.read_bytes().splitlines()
    old = orjson.loads(lines[0])
    old.pop("summary_schema", None)
    journal.write_bytes(b"\n".join([orjson.dumps(old), *lines[1:]]) + b"\n")
    executor = CountingExecutor()
    report = run_sweep(sweep, tmp_path, executor)
    assert executor.ran == [0]
    assert (report.ran, report.reused) == (1, 1)


@pytest.mark.parametrize("schema", [2, 3, 5])
def test_a_point_recorded_under_an_earlier_summary_schema_runs_again(tmp_path, schema):
    """Schema 2's verdicts added compute idle to exposed communication (an idle-bound ZeRO-3 step); schema 3's
    called a replayed trace's host time idle; schema 5's had no SM contention loss (ZeRO-3's largest single loss
    its exposed DP communication, not SM contention): such a point runs again on resume, so one
    `bottleneck.constraint` or `verdict` column does not mix verdicts of one rule with another's."""
    sweep = sweep_from_text(BASE + "grid:\n  training.microbatches: [4, 8]\n", "s.yaml")
    run_sweep(sweep, tmp_path, SerialExecutor())
    journal = tmp_path / "points.jsonl"
    lines = journal.read_bytes().splitlines()
    old = {**orjson.loads(lines[1]), "summary_schema": schema}
    journal.write_bytes(b"\n".join([lines[0], orjson.dumps(old), *lines[2:]]) + b"\n")
    executor = CountingExecutor()
    report = run_sweep(sweep, tmp_path, executor)
    assert executor.ran == [1]
    assert (report.ran, report.reused) == (1, 1)


def test_a_mapping_or_null_axis_value_is_written_as_json(tmp_path):
    """`checkpoint.memory: [null, {interval: 5 min}]` was written to results.csv as Python's `None` and
    `{'interval': '5 min'}`; JSON, as the overrides column is, reads back in any tool."""
    axis = "checkpoint.memory"
    values = {0: ((axis, None),), 1: ((axis, {"interval": "5 min"}),), 2: ((axis, "off"),)}
    records = {index: PointRecord(index, str(index), "ok", "", {"ettr.mean": 0.9}) for index in values}
    write_results(tmp_path, results_table((axis,), values, records))
    assert list(pd.read_csv(tmp_path / "results.csv", keep_default_na=False)[axis]) == [
        "null", '{"interval":"5 min"}', "off"]
    assert list(pd.read_parquet(tmp_path / "results.parquet")[axis]) == ["null", '{"interval":"5 min"}', "off"]


def test_a_job_sweep_whose_points_share_their_steps_notes_that_serial_simulates_them_once():
    """Job points that differ only in the checkpoint mode and spares share every cluster state's step, which the default
    pool simulates in each worker (105.0 s on 2 workers against 42.2 s serial, docs/studies.md): the sweep counts
    them and notes it at the command, for a local pool of several workers only."""
    from simulator.cli import shared_steps_note

    grid = "grid:\n  checkpoint.mode: [sync, async]\n  restart.spares: [0, 2]\n"
    shared = sweep_from_text(f"base: small-job.yaml\n{grid}", "sw.yaml", DATA)
    assert shared.shared_steps == 4
    apart = sweep_from_text("base: small-job.yaml\ngrid:\n  training.seq_len: [1024, 2048]\n", "sw.yaml", DATA)
    assert apart.shared_steps == 0
    assert shared_steps_note(4, "local", 2) == (
        "note: 4 job points share their cluster states' steps (the same step sections): --executor serial simulates "
        "each once, and ahead on every core, where each of the 2 local workers simulates them again")
    for shared_count, executor, workers in ((4, "serial", 1), (4, "local", 1), (0, "local", 2)):
        assert shared_steps_note(shared_count, executor, workers) == ""


def test_a_sweep_runs_again_the_points_whose_files_changed(tmp_path):
    """A point's key digests the bytes of every file the scenario reads, not only its scenario's text, where a topology
    file is its path: the points run again after an edit (the file's NVLink cut from 450 to 50 GB/s: 2.698 s, not the
    reused 1.543 s), and are reused while the files are as they were."""
    topology = tmp_path / "node.yaml"
    shutil.copy(REPO / "topologies" / "dgx-h100.yaml", topology)
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE.replace("topology: dgx-h100", "topology: node.yaml")
                    + "grid:\n  training.microbatches: [4, 8]\n")
    out, executor = tmp_path / "out", CountingExecutor()
    run_sweep(load_sweep(path), out, executor)
    assert run_sweep(load_sweep(path), out, executor).reused == 2
    topology.write_text(topology.read_text().replace("nvlink_bandwidth: 450 GB/s", "nvlink_bandwidth: 50 GB/s"))
    report = run_sweep(load_sweep(path), out, executor)
    assert (report.ran, report.reused, executor.ran) == (2, 0, [0, 1, 0, 1])


@pytest.mark.parametrize("kind", ["table", "trace"])
def test_a_points_key_digests_its_schedule_table_and_traces(tmp_path, kind):
    """The other files a scenario reads by path, a custom schedule's table and a replayed trace's files, count
    by their bytes as the topology file does: an edit changes every point's key, an unchanged file keeps it."""
    folder = tmp_path / "in"
    folder.mkdir()
    if kind == "table":
        written = folder / "table.csv"
        base = BASE.replace("schedule: gpipe", "schedule: custom, table: table.csv")
    else:
        written = folder / "rank1.json"
        base = ("base:\n  cluster: {topology: dgx-h100}\n  workload: {trace: 'rank*.json', format: kineto}\n"
                "  run: {timeline: summary}\n")
    written.write_text("first")
    text = base + "grid:\n  run.seed: [1, 2]\n"

    def keys() -> list[str]:
        return [point.key for point in sweep_from_text(text, str(folder / "s.yaml"), folder).points]

    before = keys()
    assert keys() == before
    written.write_text("second")
    assert all(new != old for new, old in zip(keys(), before, strict=True))


def test_a_point_folders_manifest_reproduces_the_point(tmp_path):
    """A point's run folder's manifest lists the sweep's `--set`s, then the point's axis values, in the order they apply
    (not the sweep's base with `overrides: []`, alike for every point but its SHA-256): `trainsim run` of its
    scenario with those `--set`s gives the point's SHA-256."""
    from simulator.config.loader import load_scenario
    from simulator.report.writers import scenario_digest

    base = tmp_path / "base.yaml"
    base.write_text("\n".join(line.removeprefix("  ") for line in BASE.splitlines()[2:]) + "\n")
    path = tmp_path / "sweep.yaml"
    path.write_text("base: base.yaml\ngrid:\n  parallelism.pipeline.schedule: [gpipe, 1f1b]\n"
                    "  training.microbatches: [4, 8]\n")
    out = tmp_path / "out"
    sweep = load_sweep(path, overrides=["model.synthetic.forward=2 ms"])
    run_sweep(sweep, out, SerialExecutor(), point_outputs=True)
    manifests = [orjson.loads((out / "points" / f"{point:05d}" / "manifest.json").read_bytes()) for point in range(4)]
    assert manifests[3]["scenario"] == str(base)
    assert manifests[3]["overrides"] == ["model.synthetic.forward=2 ms", "parallelism.pipeline.schedule=1f1b",
                                         "training.microbatches=8"]
    for manifest in manifests:
        again = load_scenario(manifest["scenario"], manifest["overrides"])
        assert scenario_digest(again) == manifest["scenario_sha256"]
    assert len({manifest["scenario_sha256"] for manifest in manifests}) == 4


@pytest.mark.parametrize("value", ["1f1b", "25 MiB", "true", "1e8", 1e8, 1.5e-7, 3, True, None, "", [1, "a"],
                                   {"a": 1}, "12:30"])
def test_an_axis_value_is_written_as_a_set_that_reads_back_as_itself(value):
    """A point's manifest lists its axis values as `--set`s: each must read back as the value the axis wrote
    (the text "1e8" unquoted reads as a number, "true" as a bool)."""
    from simulator.config.yaml_source import override_value, set_text

    name, text = set_text("a.b", value).split("=", 1)
    assert (name, override_value(text)) == ("a.b", value)


DERIVED = """
base:
  cluster: {topology: dgx-h100-cluster, nodes: 1}
  model: {preset: llama3-8b}
  training: {seq_len: 4096, global_batch: 32, micro_batch: 1}
  parallelism: {tp: TP, zero: 1}
grid:
  cluster.nodes: [1, 2]
"""


@pytest.mark.parametrize(("constraint", "skipped"), [("parallelism.dp >= 8", [True, False]),
                                                     ("training.microbatches == 8", [False, True])])
def test_a_constraint_sees_the_fields_a_step_derives(constraint, skipped):
    """`parallelism.dp` left out is the cluster's GPUs / (tp cp pp), as `run` prints it: 4 on one DGX H100 at TP 2, 8 on
    two (and the micro-batches 32 / dp, 8 and 4). A constraint on it sees the derived value, not None (Python's "'>='
    not supported between instances of 'NoneType' and 'int'", failing the whole sweep)."""
    sweep = sweep_from_text(DERIVED.replace("TP", "2") + f"constraints: [{constraint!r}]\n", "s.yaml")
    assert [bool(point.skipped) for point in sweep.points] == skipped


def test_a_constraint_on_a_derived_field_the_point_cannot_give_says_so():
    """At TP 3 the 8 GPUs of a host give no dp: the constraint is refused in one line saying the field is
    derived, and what to constrain instead, not with a Python operator error."""
    with pytest.raises(ScenarioError) as refused:
        sweep_from_text(DERIVED.replace("TP", "3") + "constraints: ['parallelism.dp >= 8']\n", "s.yaml")
    assert str(refused.value) == (
        "s.yaml:9: constraints[0]: cannot evaluate at point 0: parallelism.dp is left out, to be derived from the "
        "cluster's GPUs / (tp x cp x pp), which this point's values do not give (allowed: write parallelism.dp, or "
        "constrain the fields it is derived from (cluster.nodes, parallelism.tp, ...))")


PS_DERIVED = """
base:
  cluster: {topology: dgx-h100-cluster, nodes: 2}
  model: {preset: megatron-1.7b}
  training: {seq_len: 2048, micro_batch: 1, global_batch: 48}
  parallelism: {strategy: parameter_server}
  ps: {servers: 1, iterations: 1}
grid:
  cluster.nodes: [2, 3]
constraints: ['training.microbatches == 6 and parallelism.dp == 8']
"""


def test_a_constraint_sees_the_workers_a_parameter_server_run_derives():
    """A parameter-server run's dp is its workers, the GPUs of the hosts that do not serve: 8 of 2 DGX H100 with
    one serving, so 48 / 8 = 6 micro-batches, as the run's layout says. The constraint saw all 16 GPUs as dp (3
    micro-batches) and skipped the point the run gives exactly those figures."""
    from simulator import simulate

    sweep = sweep_from_text(PS_DERIVED, "s.yaml")
    assert [bool(point.skipped) for point in sweep.points] == [False, True]
    layout = simulate(scenario_from_text(yaml.safe_dump(sweep.points[0].data), "p.yaml")).summary["layout"]
    assert (layout["dp"], layout["microbatches"]) == (8, 6)


def test_a_constraint_on_more_micro_batches_than_a_run_allows_is_refused_as_underived():
    """100,001 micro-batches is above the run's cap (MAX_MICROBATCHES): the run refuses the point, so a constraint
    on them cannot say; it saw 100,001 and let the point through to fail at its run."""
    text = DERIVED.replace("TP", "8").replace("global_batch: 32", "global_batch: 100001").replace("[1, 2]", "[1]")
    with pytest.raises(ScenarioError, match=r"training\.microbatches is left out"):
        sweep_from_text(text + "constraints: ['training.microbatches > 1']\n", "s.yaml")




def test_a_constraint_sees_the_workers_of_parameter_servers_on_a_graph(tmp_path):
    """A graph's hosts are not told by its parameters: the sweep builds it (hosts of 2, 1 and 1 GPUs) and a
    parameter-server point's dp is the GPUs of the hosts that do not serve, 3 with the last host serving, 2 with the
    last two, derived for the constraint, not left underived and refused at every such point."""
    (tmp_path / "graph.yaml").write_text(UNEQUAL_HOSTS_GRAPH)
    text = PS_DERIVED.replace("dgx-h100-cluster, nodes: 2", "graph.yaml").replace(
        "cluster.nodes: [2, 3]", "ps.servers: [1, 2, [0]]").replace(
        "'training.microbatches == 6 and parallelism.dp == 8'", "'parallelism.dp == 2'")
    sweep = sweep_from_text(text, "s.yaml", tmp_path)
    assert [bool(point.skipped) for point in sweep.points] == [True, False, False]


def test_a_constraint_on_the_workers_of_one_host_says_they_are_the_hosts_that_do_not_serve():
    """On one DGX H100 no host is left to work: the dp constraint is refused saying dp is the GPUs of the hosts that do
    not serve, and to constrain the hosts and servers, not that dp comes from GPUs / (tp x cp x pp)."""
    with pytest.raises(ScenarioError) as refused:
        sweep_from_text(PS_DERIVED.replace("[2, 3]", "[1, 2]").replace("training.microbatches == 6 and ", ""),
                        "s.yaml")
    assert "parallelism.dp is left out, to be derived from the GPUs of the hosts that do not serve" in str(
        refused.value)
    assert "(allowed: constrain the fields it is derived from (cluster.nodes, ps.servers, ...))" in str(refused.value)


def test_a_point_whose_pp_its_synthetic_model_refuses_is_invalid_not_a_refused_constraint():
    """pp 4 on a synthetic model of 2 stages is refused by the run: the point goes through the constraint to be
    `invalid` with the run's pp error, as without the constraint, not a constraint refused as if dp did not divide
    the GPUs."""
    from simulator import simulate

    text = """
base:
  cluster: {topology: dgx-h100}
  model: {synthetic: {stages: 2, forward: 1 ms, backward: 2 ms, p2p_bytes: 1 MiB}}
  training: {microbatches: 4}
  parallelism: {pp: 4}
grid:
  training.microbatches: [4]
constraints: ['parallelism.dp >= 1']
"""
    sweep = sweep_from_text(text, "s.yaml")
    assert not sweep.points[0].skipped
    with pytest.raises(ScenarioError, match="pp 4 differs from the synthetic model's 2 stages"):
        simulate(scenario_from_text(yaml.safe_dump(sweep.points[0].data), "p.yaml"))


def test_a_point_of_an_inline_base_runs_again_from_its_folders_scenario(tmp_path, monkeypatch):
    """A sweep whose base is inline: each point folder holds the base as `scenario.yaml`, its topology file's path
    absolute, and its manifest names it, not the sweep file, which `trainsim run` refuses (`base: unknown key
    'base'`); run with the manifest's `--set`s from the working folder, it gives the point's SHA-256 and summary."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    shutil.copy(REPO / "topologies" / "dgx-h100.yaml", tmp_path / "sub" / "node.yaml")
    Path("sub/inl.yaml").write_text(BASE.replace("dgx-h100", "node.yaml") + "grid:\n  training.microbatches: [4, 8]\n")
    assert main(["sweep", "sub/inl.yaml", "--point-outputs", "--out", "out", "--executor", "serial", "--quiet"]) == 0
    for point in ("out/points/00000", "out/points/00001"):
        manifest = orjson.loads(Path(point, "manifest.json").read_bytes())
        assert manifest["scenario"] == f"{point}/scenario.yaml"
        sets = [arg for setting in manifest["overrides"] for arg in ("--set", setting)]
        assert main(["run", manifest["scenario"], *sets, "--out", f"{point}-again", "--quiet"]) == 0
        again = orjson.loads(Path(point + "-again", "manifest.json").read_bytes())
        assert again["scenario_sha256"] == manifest["scenario_sha256"]
        assert Path(point + "-again", "summary.json").read_bytes() == Path(point, "summary.json").read_bytes()


def test_an_invalid_cluster_is_reported_before_a_constraint_on_the_dp_it_leaves_underived(tmp_path, capsys):
    """A point whose cluster is invalid gives no GPUs to derive dp from: a constraint on dp was reported as not
    evaluable there (write parallelism.dp), where the cluster's own value is the mistake."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE.replace("dp: 2, ", "") + "grid: {cluster.gpus: [8, 0, 16]}\n"
                    "constraints: ['parallelism.dp >= 2']\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial"]) == 2
    assert "sweep.yaml:8: grid.cluster.gpus: value 0: 0 must be positive" in capsys.readouterr().err


def test_a_sweep_over_the_topology_offers_a_zip_that_nulls_the_base_s_leftover_size(tmp_path):
    """A grid over `cluster.topology` that puts GB200 racks under a DGX base's `nodes` is refused at that line
    offering a zip of `cluster.nodes` with null there (and `cluster.racks` null elsewhere), which then loads; a
    misspelt key nulled by an axis at every point stays refused."""
    (tmp_path / "s.yaml").write_text("cluster: {topology: dgx-h100-cluster, nodes: 2}\n"
                                     "workload:\n  - {op: all_reduce, bytes: 64 MiB}\n")
    grid = "base: s.yaml\ngrid: {cluster.topology: [dgx-h100-cluster, gb200-nvl72]}\n"
    with pytest.raises(ScenarioError) as refused:
        sweep_from_text(grid, "sweep.yaml", tmp_path)
    assert str(refused.value).startswith(
        f"{tmp_path / 's.yaml'}:1: cluster.nodes: unknown override 'nodes' for topology kind 'nvl72' (allowed: a zip "
        "of cluster.nodes with cluster.topology, null where it is gb200-nvl72, and of cluster.racks to size it, null "
        "elsewhere; or its parameters: racks, ")
    zipped = "base: s.yaml\nzip:\n  cluster.topology: [dgx-h100-cluster, gb200-nvl72]\n"
    sweep = sweep_from_text(zipped + "  cluster.nodes: [2, null]\n  cluster.racks: [null, 2]\n", "sweep.yaml", tmp_path)
    assert len(sweep.points) == 2
    with pytest.raises(ScenarioError, match="unknown override 'nodez'"):
        sweep_from_text(zipped + "  cluster.nodez: [null, null]\n", "sweep.yaml", tmp_path)


def test_editing_the_constraints_judges_every_point_again(tmp_path):
    """A re-run after editing `constraints:` reused every point: a constraint removed kept its points skipped,
    one added left the points it breaks ok, so the same sweep file gave another table than into a fresh folder.
    The constraints are judged before anything is reused."""
    path, out = tmp_path / "sweep.yaml", tmp_path / "out"
    grid = BASE + "grid:\n  training.microbatches: [4, 8, 12]\n"

    def statuses(constraints: str) -> tuple[list[str], list[int]]:
        path.write_text(grid + constraints)
        executor = CountingExecutor()
        run_sweep(load_sweep(path), out, executor)
        return list(pd.read_parquet(out / "results.parquet")["status"]), executor.ran

    assert statuses("constraints: ['training.microbatches > 4']\n") == (["skipped", "ok", "ok"], [1, 2])
    assert statuses("") == (["ok", "ok", "ok"], [0])
    assert statuses("constraints: ['training.microbatches < 12']\n") == (["ok", "ok", "skipped"], [])
    fresh = tmp_path / "fresh"
    run_sweep(load_sweep(path), fresh, SerialExecutor())
    assert (fresh / "results.csv").read_bytes() == (out / "results.csv").read_bytes()


def test_the_end_line_gives_each_reason_its_own_points(tmp_path, capsys):
    """The end line gives each reason of a status its own line and count (8 points skipped by one constraint, 12
    by another), three of them at most, the rest counted."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  training.microbatches: [2, 4, 6, 8, 10, 12]\n"
                    "constraints: ['training.microbatches > 2', 'training.microbatches % 4 != 2', "
                    "'training.microbatches != 8', 'training.microbatches != 4']\n")
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--executor", "serial", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sweep: 6 points (1 ok, 5 skipped; 0 reused)")
    assert lines[1:] == ["  skipped: point 0: constraint: training.microbatches > 2",
                         "  skipped: point 1: constraint: training.microbatches != 4",
                         "  skipped: point 2 (and 1 other): constraint: training.microbatches % 4 != 2",
                         f"  skipped: 1 point more, for 1 other reason: see {out}/results.csv's error column"]


def test_a_point_whose_dp_does_not_fill_the_cluster_is_located_at_the_dp_axis(tmp_path):
    """A dp that does not fill the 8 GPUs (3) is the error of `parallelism.dp`, located at the dp axis, not of
    the `parallelism` section, which a sweep would locate at the last axis under it (the schedule's)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  parallelism.dp: [2, 3]\n  parallelism.pipeline.schedule: [gpipe]\n")
    run_sweep(load_sweep(path), tmp_path / "out", SerialExecutor())
    frame = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert list(frame["status"]) == ["ok", "invalid"]
    assert frame["error"][1] == (f"{path}:9: grid.parallelism.dp: value 3: tp x cp x pp x dp = 1 x 1 x 4 x 3 = 12 does "
                                 "not equal the cluster's 8 GPUs (allowed: dp 2 at tp x cp x pp = 4, or degrees whose "
                                 "product is 8)")


def test_a_custom_schedule_is_labelled_alike_whichever_folder_the_sweep_runs_from(tmp_path):
    """A custom table's label in results.parquet names the table's file, not the absolute path the sweep makes of
    it, so the same sweep run from two folders writes the same rows but for `scenario`, the sweep file's path."""
    from simulator.schedules.custom_csv import schedule_to_csv
    from simulator.schedules.registry import build_schedule

    table = schedule_to_csv(build_schedule("1f1b", 4, 8, 1))
    frames = []
    for name in ("first", "second"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "order.csv").write_text(table)
        sweep = folder / "s.yaml"
        sweep.write_text(BASE.replace("schedule: gpipe", "schedule: custom, table: order.csv")
                         + "grid:\n  run.seed: [1]\n")
        run_sweep(load_sweep(sweep), folder / "out", SerialExecutor())
        frames.append(pd.read_parquet(folder / "out" / "results.parquet").drop(columns="scenario"))
    assert frames[0]["layout.schedule"].tolist() == ["custom: order.csv"]
    pd.testing.assert_frame_equal(frames[0], frames[1])


def _finished(index: int, status: str, step_s: float | None = None, peak_gib: float = 40.0) -> PointRecord:
    """A point's record with the step figures the console table shows (tokens/s, TFLOP/s and MFU from its step
    time), none for a point that did not run."""
    metrics = {} if step_s is None else {"step_time_s": step_s, "tokens_per_s": 1e6 / step_s,
                                         "tflops_per_gpu": 400 / step_s, "mfu": 0.4 / step_s,
                                         "peak_memory_gib": peak_gib}
    return PointRecord(index, f"key{index}", PointStatus(status), "" if status == "ok" else status, metrics)


def test_the_console_table_ranks_ok_points_by_step_time_with_units_and_the_rest_after(tmp_path):
    """The sweep's console table: the ok points by step time, each figure with its unit, then the points not ok
    (out of memory, invalid) in point order with their status (an out-of-memory point keeps its figures, an invalid
    one has none)."""
    records = {0: _finished(0, "ok", 2.0), 1: _finished(1, "invalid"), 2: _finished(2, "ok", 1.25, 0.05),
               3: _finished(3, "out_of_memory", 0.5, 90.0), 4: _finished(4, "ok", 1.5)}
    frame = results_table(("parallelism.tp",), {index: (("parallelism.tp", 2 ** index),) for index in records},
                          records)
    assert format_sweep_table(frame, tmp_path).splitlines() == [
        "points by step time, fastest first; those not ok after them:",
        "point  status         parallelism.tp  step time   tokens/s  TFLOP/s per GPU    MFU  peak memory",
        "    2  ok                          4   1,250 ms    800,000            320.0  32.0%     51.2 MiB",
        "    4  ok                         16   1,500 ms    666,667            266.7  26.7%     40.0 GiB",
        "    0  ok                          1   2,000 ms    500,000            200.0  20.0%     40.0 GiB",
        "    1  invalid                     2          -          -                -      -            -",
        "    3  out_of_memory               8   500.0 ms  2,000,000            800.0  80.0%     90.0 GiB"]


def test_the_console_table_shows_at_most_its_limit_and_says_where_the_rest_are(tmp_path):
    """Past its limit the table says how many points it leaves out, of which status, and the file that holds
    every point."""
    records = {index: _finished(index, "ok", 1.0 + index) for index in range(4)} | {4: _finished(4, "failed")}
    frame = results_table(("training.microbatches",), {index: (("training.microbatches", index),)
                                                       for index in records}, records)
    lines = format_sweep_table(frame, tmp_path, limit=2).splitlines()
    assert [line.split()[0] for line in lines[2:4]] == ["0", "1"]
    assert lines[4:] == [f"... 3 more points (2 ok, slower, 1 not ok): every point is in {tmp_path}/results.csv"]


def test_the_sweep_prints_its_table_unless_quiet(tmp_path, capsys):
    """`trainsim sweep` ends with its points' table (results.csv alone held them, in point order); --quiet
    prints none."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid:\n  training.microbatches: [8, 2, 4]\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("points by step time")
    assert [line.split()[:5] for line in lines[3:]] == [
        ["1", "ok", "2", "15.00", "ms"], ["2", "ok", "4", "21.00", "ms"], ["0", "ok", "8", "33.00", "ms"]]
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial", "--quiet"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def _bound_point(index: int, tier: str | None) -> PointRecord:
    """A communication-bound point with its link tiers' and `auto`'s per-collective detail, its verdict naming
    ``tier`` at 92.2% (none where None)."""
    metrics = {"warnings": "[]", "link_tiers.by_kind.dp.tiers.leaf-spine.bytes": 1.5e9,
               "resources.gpu_energy_kwh_per_step": 0.001, "resources.cost_per_million_tokens": 0.07,
               "auto_choices[0].algorithm": "ring", "step_time_s": 0.099, "bottleneck.constraint": "communication",
               "bottleneck.verdict": "communication-bound", "peak_memory_gib": 4.6}
    if tier is not None:
        metrics |= {"bottleneck.binding_tier.tier": tier, "bottleneck.binding_tier.utilisation_in_transfers": 0.9218}
    return PointRecord(index, f"key{index}", PointStatus.OK, "", metrics)


def test_the_results_lead_with_the_headline_and_the_csv_leaves_out_the_tiers_and_auto_detail(tmp_path):
    """After the axes the table leads with the headline metrics (step time, memory, verdict, binding tier, cost per
    million tokens) in
    `HEADLINE_METRICS` order, whatever order the summary gave them; results.csv leaves out `link_tiers.*` and
    `auto_choices[...]` unless `--csv-columns all`, results.parquet keeps every column."""
    records = {0: _bound_point(0, "leaf-spine"), 1: _bound_point(1, None)}
    frame = results_table(("cluster.oversubscription",), {0: (("cluster.oversubscription", 2),),
                                                          1: (("cluster.oversubscription", 1),)}, records)
    assert list(frame.columns) == [
        "point", "status", "error", "cluster.oversubscription", "step_time_s", "peak_memory_gib",
        "bottleneck.constraint", "bottleneck.binding_tier.tier", "bottleneck.binding_tier.utilisation_in_transfers",
        "bottleneck.verdict", "resources.cost_per_million_tokens", "warnings",
        "link_tiers.by_kind.dp.tiers.leaf-spine.bytes", "resources.gpu_energy_kwh_per_step",
        "auto_choices[0].algorithm"]
    write_results(tmp_path, frame)
    assert list(pd.read_csv(tmp_path / "results.csv").columns) == [
        column for column in frame.columns if not column.startswith(("link_tiers.", "auto_choices["))]
    assert list(pd.read_parquet(tmp_path / "results.parquet").columns) == list(frame.columns)
    write_results(tmp_path, frame, "all")
    assert list(pd.read_csv(tmp_path / "results.csv").columns) == list(frame.columns)


def test_the_console_table_names_what_bounds_each_point_and_the_tier_that_binds_it(tmp_path):
    """The table's last columns: the bottleneck's constraint and the binding tier with its busiest link's
    utilisation while the transfers crossing it run (0.9218 shows 92.2%), `-` for a point whose verdict names
    none; a table where no point has either shows neither column (the figures' table above)."""
    records = {0: _bound_point(0, "leaf-spine"), 1: _bound_point(1, None)}
    frame = results_table(("cluster.oversubscription",), {0: (("cluster.oversubscription", 2),),
                                                          1: (("cluster.oversubscription", 1),)}, records)
    lines = format_sweep_table(frame, tmp_path).splitlines()
    assert lines[1].endswith("  bound          binding links")
    assert lines[2].endswith("  communication  leaf-spine 92.2%")
    assert lines[3].endswith("  communication  -")


def test_the_csv_columns_flag_writes_every_metric_to_results_csv(tmp_path, capsys):
    """`trainsim sweep --csv-columns all` writes results.parquet's columns to results.csv; a value outside
    readable and all is refused by the parser (exit status 2)."""
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "grid:\n  parallelism.pipeline.schedule: [gpipe, 1f1b]\n")
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--executor", "serial", "--quiet", "--csv-columns",
                 "all"]) == 0
    assert list(pd.read_csv(out / "results.csv").columns) == list(pd.read_parquet(out / "results.parquet").columns)
    assert main(["sweep", str(path), "--out", str(out), "--csv-columns", "some"]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim sweep: --csv-columns: invalid choice 'some' "
                                       "(allowed: readable, all)\n")
