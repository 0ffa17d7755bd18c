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
from simulator.units import seconds_alike

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
    young = math.sqrt(2 * summary["young_daly_cost_s"] * summary["mtbf_s"])
    assert young < steps * step / 4
    assert summary["young_formula_s"] == pytest.approx(young, rel=1e-12)
    assert summary["daly_formula_s"] < summary["young_formula_s"]
    assert young_daly_text(summary).startswith(f"Young {seconds_alike(summary['young_formula_s'])}, Daly "
                                               f"{seconds_alike(summary['daly_formula_s'])} (for C ")
    assert f": both floored to the write's {steps} steps, " in young_daly_text(summary)

    below = simulate_job(scenario_from_text(job(f"{steps - 1} steps")))
    held = simulate_job(scenario_from_text(job(f"{steps} steps")))
    waits = [w for w in below.step_summary["warnings"] if "do not hold their write" in w]
    assert len(waits) == 1 and f"every {steps - 1} steps" in waits[0] and f"the fewest that do: {steps}," in waits[0]
    assert below.summary["checkpoint"]["cost_s"] == pytest.approx(write + snapshot - (steps - 1) * step, rel=1e-9)
    assert below.summary["checkpoint"]["cost_s"] > held.summary["checkpoint"]["cost_s"]
    assert not any("do not hold their write" in w for w in held.step_summary.get("warnings", []))
    assert held.summary["checkpoint"]["cost_s"] == pytest.approx(summary["young_daly_cost_s"], rel=1e-9)


def test_the_default_grid_keeps_one_point_below_the_write_floor_and_the_floor_itself():
    """Daly's interval is the floor, 325 steps: the grid holds it, and of the factors that round below it only the
    longest, to show the cliff (not 81 to 1,296 steps with 4 below the floor and no 325)."""
    grid = default_grid(scenario_from_text(job("1 steps")))
    assert grid.floor_steps == 325 and grid.centre_s == pytest.approx(325 * grid.step_s)
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



def test_a_sync_checkpoint_costly_against_the_mtbf_warns_that_youngs_interval_does_not_apply():
    """Where a sync checkpoint's cost C is near the MTBF M, Young's interval does not hold (the 405B job at 1
    GB/s: C = 0.58 M, Young 1.49 x Daly's). By the renewal ETTR T e^(-R/M) /
    (M (e^((T+C)/M) - 1)), Young keeps less than Daly's; from 1% the job warns. Here the same 100 s write, sync:
    at M = 9 min (C = 0.19 M) Young keeps 1.15% less and it warns; at M = 11 min (0.86%) and 3 h it does not."""
    from simulator.reliability.stats import daly_interval, young_interval
    from simulator.reliability.summary import young_shortfall

    def kept(interval: float, cost: float, mtbf: float) -> float:
        return interval / (math.exp((interval + cost) / mtbf) - 1.0)

    young, daly = young_interval(6494.0, 11135.0), daly_interval(6494.0, 11135.0)
    assert young_shortfall(6494.0, 11135.0) == pytest.approx(1 - kept(young, 6494.0, 11135.0)
                                                             / kept(daly, 6494.0, 11135.0), rel=1e-12)
    assert 0.0595 < young_shortfall(6494.0, 11135.0) < 0.0597
    assert young_shortfall(1e6, 1.0) == pytest.approx(1.0)
    text = job("30 min", "9 min").replace("mode: async", "mode: sync")
    result = simulate_job(scenario_from_text(text))
    cost, mtbf = result.summary["young_daly_cost_s"], result.summary["mtbf_s"]
    shortfall = 1 - kept(result.summary["young_interval_s"], cost, mtbf) / kept(result.summary["daly_interval_s"],
                                                                               cost, mtbf)
    assert 0.0114 < shortfall < 0.0116
    warned = [w for w in result.step_summary["warnings"] if "Young's interval" in w]
    assert len(warned) == 1 and f"keeps {shortfall:.1%} less ETTR" in warned[0] and "Daly's applies" in warned[0]
    for mtbf in ("11 min", "3 h"):
        quiet = simulate_job(scenario_from_text(job("30 min", mtbf).replace("mode: async", "mode: sync")))
        assert not any("Young's interval" in w for w in quiet.step_summary["warnings"])


def test_a_sync_interval_shorter_than_its_write_warns_as_an_async_one_does():
    """Sync, the 100 s write stalls the training: every 324 steps (99.99 s of training) it stalls longer than it
    trains, and warns by the same rule as async, with the share of each checkpoint cycle the stall takes,
    W / (k t + W), and that share at the fewest steps that hold the write, 325 (still about half, so those steps
    are no remedy, unlike async's); 325 steps do not warn."""
    sync = job("324 steps").replace("mode: async", "mode: sync").replace("replications: 2", "replications: 1")
    below = simulate_job(scenario_from_text(sync))
    held = simulate_job(scenario_from_text(sync.replace("324 steps", "325 steps")))
    step, write = below.summary["step_time_s"], below.summary["checkpoint"]["write_s"]
    waits = [w for w in below.step_summary["warnings"] if "do not hold their write" in w]
    assert len(waits) == 1, below.step_summary["warnings"]
    assert waits[0].startswith("sync checkpoints every 324 steps") and "the fewest that do" not in waits[0]
    share, held_share = write / (324 * step + write), write / (325 * step + write)
    assert (f"longer than it trains between them, {share:.0%} of each checkpoint cycle, and still {held_share:.0%} at "
            "the fewest steps that hold it (325, ") in waits[0]
    assert waits[0].endswith("(a longer checkpoint.interval, or checkpoint.mode: async)")
    assert not any("do not hold their write" in w for w in held.step_summary.get("warnings", []))


def test_a_host_writes_and_reads_the_remote_store_at_most_at_its_nics():
    """trace-job's 270 MB checkpoint from 8 hosts of one 100 GbE NIC: the store's 25 GB/s per host is more than the
    NIC's 12.5 GB/s, so the write and the load take 270 MB / (8 x 12.5 GB/s) = 2.7 ms, not 1.35 ms; hosts of 400 GB/s
    write at the store's 25 GB/s."""
    from dataclasses import replace

    from simulator.config.reliability import CheckpointConfig, RestartConfig, StorageConfig
    from simulator.reliability.checkpoint import StepState, segment_costs

    step = StepState(step_s=6.5e-3, tokens_per_step=1.0, microbatches=1, exposed_network_share=0.5, hosts=8, gpus=8,
                     host_network_bandwidth=12.5e9)
    costs = segment_costs(step, step, 270e6, CheckpointConfig(), StorageConfig(), RestartConfig())
    assert (costs.write_s, costs.load_s) == pytest.approx((2.7e-3, 2.7e-3), rel=1e-12)
    wide = replace(step, host_network_bandwidth=400e9)
    costs = segment_costs(wide, wide, 270e6, CheckpointConfig(), StorageConfig(), RestartConfig())
    assert (costs.write_s, costs.load_s) == pytest.approx((1.35e-3, 1.35e-3), rel=1e-12)
