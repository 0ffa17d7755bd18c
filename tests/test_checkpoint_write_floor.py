"""The async write floor of Young's and Daly's intervals, the default study grid and the fitted optimum.

An 8-GPU job (0.3086 s steps) saves 10 GB asynchronously through hosts that write 0.1 GB/s: a write W of 100 s,
324.05 steps, under a snapshot of a few ms. Young's sqrt(2 C M) at M = 3 h is about 20 s, shorter than the
write, so Young and Daly stop at the write floor: W / (1 + sigma) rounded up to whole steps, 325 (a checkpoint
falls at a step's end, and 324 steps wait for the write at every checkpoint). With M = 10 min the floor is
past the MTBF and the renewal argument of docs/reliability.md puts the optimum below it, near M.
"""

from __future__ import annotations

import math

import pytest

from simulator.config.loader import scenario_from_text
from simulator.console.report import young_daly_text
from simulator.reliability.simulate import simulate_job
from simulator.reliability.study import default_grid, fitted_optimum, run_study

JOB = """
cluster: {topology: dgx-h100, gpus: 8}
model: {preset: llama3-8b}
training: {seq_len: 2048, global_batch: 8}
parallelism: {tp: 8}
run: {horizon: 1 d, replications: 2, seed: 3}
faults:
  components:
    job_failure: {unit: host, effect: restart, mtbf: MTBF}
checkpoint: {interval: INTERVAL, size: 10 GB, mode: async}
storage: {host_write: 0.1 GB/s, host_read: 1 TB/s, write: 1 TB/s, read: 1 TB/s}
restart: {detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0}
"""


def job(interval: str, mtbf: str = "3 h") -> str:
    return JOB.replace("INTERVAL", interval).replace("MTBF", mtbf)


def floor_steps(summary: dict) -> int:
    """The fewest whole steps whose training, slowed by the write, holds it, from the summary's own figures."""
    checkpoint, step = summary["checkpoint"], summary["step_time_s"]
    steps = math.ceil(checkpoint["write_s"] / (1 + checkpoint["slowdown"]) / step)
    assert (steps - 1) * step * (1 + checkpoint["slowdown"]) < checkpoint["write_s"] <= steps * step * (
        1 + checkpoint["slowdown"])
    return steps


def test_young_and_daly_on_the_write_floor_are_the_fewest_whole_steps_that_hold_the_write():
    """Young's and Daly's intervals on the floor are 325 steps, not the write's 324.05 steps of time (typed back
    as checkpoint.interval that rounded to 324 steps, which wait for the write, without a word); one step fewer
    warns, with its cost per checkpoint against the floor's; the C they take and the floor are in the summary
    and the console's words."""
    result = simulate_job(scenario_from_text(job("1 steps")))
    summary, step = result.summary, result.summary["step_time_s"]
    steps = floor_steps(summary)
    assert steps == 325
    assert summary["young_interval_s"] == summary["daly_interval_s"] == pytest.approx(steps * step, rel=1e-12)
    assert (summary["write_floor_steps"], summary["write_floor_s"]) == (steps, pytest.approx(steps * step))
    snapshot, write, sigma = (summary["checkpoint"][key] for key in ("stall_s", "write_s", "slowdown"))
    assert summary["young_daly_cost_s"] == pytest.approx(snapshot + write * sigma / (1 + sigma), rel=1e-9)
    assert math.sqrt(2 * summary["young_daly_cost_s"] * summary["mtbf_s"]) < steps * step / 4
    assert "(for C " in young_daly_text(summary) and f"{steps} steps, " in young_daly_text(summary)

    below = simulate_job(scenario_from_text(job(f"{steps - 1} steps")))
    held = simulate_job(scenario_from_text(job(f"{steps} steps")))
    waits = [w for w in below.step_summary["warnings"] if "do not hold their write" in w]
    assert len(waits) == 1 and f"every {steps - 1} steps" in waits[0] and f"the fewest that do: {steps}," in waits[0]
    assert below.summary["checkpoint"]["cost_s"] == pytest.approx(write + snapshot - (steps - 1) * step, rel=1e-9)
    assert below.summary["checkpoint"]["cost_s"] > held.summary["checkpoint"]["cost_s"]
    assert not any("do not hold their write" in w for w in held.step_summary.get("warnings", []))
    assert held.summary["checkpoint"]["cost_s"] == pytest.approx(summary["young_daly_cost_s"], rel=1e-9)


def test_the_default_grid_keeps_one_point_below_the_write_floor_and_the_floor_itself():
    """Daly's interval is the floor, 325 steps: the grid holds it, and of the factors that round below it
    (324.05 steps x 1/4 to x 1/sqrt 2 before) only the longest, to show the cliff; it held 81 to 1,296 steps
    with 4 below the floor and no 325."""
    grid = default_grid(scenario_from_text(job("1 steps")))
    assert grid.floor_steps == 325 and grid.daly_s == pytest.approx(325 * grid.step_s)
    assert grid.steps == (230, 325, 460, 650, 919, 1300) and grid.cliff_steps == 230 and grid.clamped == 4
    assert [n for n in grid.steps if n < grid.floor_steps] == [grid.cliff_steps]


def test_the_fitted_optimum_fits_only_the_intervals_that_hold_the_write():
    """ETTR = 0.95 - 2 / T - 1e-4 T above a floor of 100 s (T* = sqrt(2 / 1e-4) = 141.4 s) and T / (W + S)
    times the same below it: the fit across the kink put T* at 295 s, twice the optimum; over the points at or
    above the floor it is exact; where T* is below the floor it is null."""
    def ettr(t: float, floor: float = 100.0) -> float:
        return (0.95 - 2 / t - 1e-4 * t) * min(1.0, t / floor)

    intervals = [25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0]
    values = [ettr(t) for t in intervals]
    assert fitted_optimum(intervals, values) == pytest.approx(295, rel=0.01)
    assert fitted_optimum(intervals, values, 100.0) == pytest.approx(math.sqrt(2 / 1e-4), rel=1e-9)
    high = [200.0, 300.0, 400.0, 600.0]
    assert fitted_optimum(high, [ettr(t, 200.0) for t in high], 200.0) is None


def test_a_write_floor_past_the_mtbf_warns_and_the_optimum_lies_below_it(tmp_path):
    """W = 100 s and M = 1 min: the floor is 1.7 M, so Young's and Daly's intervals (the floor) are no optimum:
    a checkpoint every M (which waits for the write) beats the floor, as the renewal argument says, and the
    job warns; at M = 3 h (floor 0.0093 M) it does not, nor at M = 201 s (the floor just under M / 2)."""
    text = job("1 steps", "1 min").replace("replications: 2", "replications: 8")
    result = simulate_job(scenario_from_text(text))
    floor = result.summary["write_floor_s"]
    warned = [w for w in result.step_summary["warnings"] if "do not apply" in w]
    assert len(warned) == 1 and "1.7 x the system MTBF" in warned[0]
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)
    at_mtbf, at_floor = (p["ettr"] for p in run_study(scenario, [], [60.0, floor], [1.0])["curves"][0]["points"])
    assert at_mtbf > 1.05 * at_floor
    for mtbf in ("3 h", "201 s"):
        quiet = simulate_job(scenario_from_text(job("1 steps", mtbf)))
        assert not any("do not apply" in w for w in quiet.step_summary["warnings"])

