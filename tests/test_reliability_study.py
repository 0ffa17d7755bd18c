"""Checkpoint-interval studies against Young, Daly and the exact renewal-reward optimum.

One unit fails as a renewal process (mean time between failures M = 3 h), every failure interrupts the job,
a sync checkpoint costs C = 60 s (60 GB at 1 GB/s), a restart R. Renewal-reward theory gives the exact ETTR
of a checkpoint every T of work: a failure X after the previous one leaves floor((X - R) / (T + C)) completed
cycles of T useful work, so ETTR(T) = T sum_j P(X > R + j (T + C)) / M.

- Small restart cost (R = 10 s), exponential failures: the simulated optimum lies within 10% of Daly's
  interval (1,099 s; the exact optimum is 1,098 s).
- Large restart cost (R = 1 h): with exponential failures the optimum does not move (memoryless: R only delays
  when the next cycles start, it scales the waste, not its shape), but with Weibull failures of shape 0.5
  (a fresh unit fails early more often) the optimum moves to 1,520 s, 38% above Daly: Young and Daly assume
  exponential failures. The simulated ETTR follows the renewal-reward curve point by point within 0.005.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from simulator.cli import main
from simulator.config.loader import scenario_from_text

M, C = 3 * 3600.0, 60.0
JOB = """
cluster: {topology: dgx-h100, gpus: 8}
model: {preset: llama3-8b}
training: {seq_len: 2048, global_batch: 8}
parallelism: {tp: 8}
run: {horizon: 54 d, replications: 20, seed: 1}
faults:
  components:
    job_failure: {unit: host, effect: restart, mtbf: 3 h, distribution: DIST, shape: SHAPE}
checkpoint: {interval: 30 min, size: 60 GB}
storage: {host_write: 1 GB/s, host_read: 1 TB/s, write: 1 GB/s, read: 1 TB/s}
restart: {detection: RESTART, reschedule: 0 s, launch: 0 s, warmup_steps: 0}
"""


def job_text(distribution: str, shape: float, restart: str) -> str:
    return JOB.replace("DIST", distribution).replace("SHAPE", repr(shape)).replace("RESTART", restart)


def renewal_ettr(interval: float, restart: float, shape: float) -> float:
    """Exact ETTR of the renewal-reward model above (Weibull of the given shape with mean M)."""
    scale = M / math.gamma(1 + 1 / shape)
    starts = restart + np.arange(1, 100_000) * (interval + C)
    return interval * float(np.exp(-(starts / scale) ** shape).sum()) / M


def simulated_curve(text: str, intervals: list[float]) -> list[dict]:
    from simulator.reliability.simulate import simulate_job

    return [simulate_job(scenario_from_text(text, "study.yaml", [f"checkpoint.interval={t} s"])).summary
            for t in intervals]


def test_small_restart_cost_optimum_near_daly():
    intervals = [400.0, 600.0, 800.0, 1000.0, 1200.0, 1400.0, 1800.0, 2400.0, 3200.0]
    curve = simulated_curve(job_text("exponential", 1.0, "10 s"), intervals)
    daly = curve[0]["daly_interval_s"]
    assert daly == pytest.approx(1098.8, abs=0.5)
    ettr = [s["ettr"]["mean"] for s in curve]
    from simulator.reliability.study import fitted_optimum

    assert fitted_optimum(intervals, ettr) == pytest.approx(daly, rel=0.10)
    best = intervals[int(np.argmax(ettr))]
    assert best == pytest.approx(daly, rel=0.10)
    for interval, summary in zip(intervals, curve):
        assert summary["ettr"]["mean"] == pytest.approx(renewal_ettr(interval, 10.0, 1.0), abs=0.005)


@pytest.mark.parametrize("distribution, shape, optimum", [("exponential", 1.0, 1100.0), ("weibull", 0.5, 1520.0)])
def test_large_restart_cost_moves_the_optimum_only_for_weibull(distribution, shape, optimum):
    intervals = [800.0, 1100.0, 1500.0, 2100.0]
    grid = np.linspace(300.0, 4000.0, 3701)
    exact = grid[int(np.argmax([renewal_ettr(t, 3600.0, shape) for t in grid]))]
    assert exact == pytest.approx(optimum, rel=0.01)
    curve = simulated_curve(job_text(distribution, shape, "1 h"), intervals)
    daly = curve[0]["daly_interval_s"]
    for interval, summary in zip(intervals, curve):
        assert summary["ettr"]["mean"] == pytest.approx(renewal_ettr(interval, 3600.0, shape), abs=0.005)
    best = intervals[int(np.argmax([s["ettr"]["mean"] for s in curve]))]
    assert best == min(intervals, key=lambda t: abs(t - exact))
    assert (abs(exact - daly) / daly > 0.3) == (distribution == "weibull")


def test_study_command_writes_the_curve_and_plot(tmp_path):
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 2"))
    out = tmp_path / "study"
    assert main(["study", "mtbf", str(scenario), "--intervals", "10min,20min,40min", "--multipliers", "1,2",
                 "--out", str(out)]) == 0
    study = json.loads((out / "study.json").read_text())
    assert [curve["rate_multiplier"] for curve in study["curves"]] == [1.0, 2.0]
    first, second = study["curves"]
    assert second["mtbf_s"] == pytest.approx(first["mtbf_s"] / 2)
    assert second["daly_interval_s"] < first["daly_interval_s"]
    assert len((out / "study.csv").read_text().splitlines()) == 1 + 6
    assert main(["plot", "goodput", str(out)]) == 0
    assert (out / "goodput.png").stat().st_size > 10_000
