"""Checkpoint-interval studies against Young, Daly and the exact renewal-reward optimum.

One unit fails as a renewal process (mean time between failures M = 3 h), every failure interrupts the job,
a sync checkpoint costs C = 60 s (60 GB at 1 GB/s), a restart R. Renewal-reward theory gives the exact ETTR
of a checkpoint every T of work: a failure X after the previous one leaves floor((X - R) / (T + C)) completed
cycles of T useful work, so ETTR(T) = T sum_j P(X > R + j (T + C)) / M.

- Small restart cost (R = 10 s), exponential failures: the fitted optimum lies within 2% of Daly's
  interval (1,099 s; the exact optimum is 1,098 s) and the best interval tried is one either side of it.
- Large restart cost (R = 1 h): with exponential failures the optimum does not move (memoryless: R only delays
  when the next cycles start, it scales the waste, not its shape), but with Weibull failures of shape 0.5
  (a fresh unit fails early more often) the optimum moves to 1,520 s, 38% above Daly: Young and Daly assume
  exponential failures. The simulated ETTR follows the renewal-reward curve point by point, within 3 standard
  errors of its mean over the 20 replications (1.53 of its 95% half-widths), and with R = 1 h the alternative
  each curve exists to reject lies outside that at every interval: restarts that no failure interrupts
  (ETTR T sum_j e^(-j (T+C)/M) / (M + R)) for exponential failures, exponential failures for Weibull ones.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from shared import OOM_JOB, SPARE_JOB, WAIT_JOB, inside, renewal_ettr, stderr_before_each_draw

from simulator.cli import main
from simulator.config.loader import scenario_from_text
from simulator.errors import InputError
from simulator.reliability.study import write_study
from simulator.report.run_folder import write_run_folder
from simulator.units import durations_alike, expected_count, format_duration, format_seconds, seconds_alike

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


def within_three_sigma(value: float, ettr: dict) -> bool:
    """``value`` within 3 standard errors (`THREE_SIGMA_IN_HALF_WIDTHS` of the 95% half-widths) of the simulated
    mean ETTR."""
    return inside(value, ettr, math.inf)


def simulated_curve(text: str, intervals: list[float]) -> list[dict]:
    from simulator.reliability.simulate import simulate_job

    return [simulate_job(scenario_from_text(text, "study.yaml", [f"checkpoint.interval={t} s"])).summary
            for t in intervals]


def test_small_restart_cost_optimum_near_daly():
    """Daly's interval sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + C / 18M) - C = 1,098.8 s for C = 60 s, M = 3 h. The
    optimum of a parabola fitted to the simulated curve lies within 2% of it (today 1.3% below), and the best
    interval tried is one of the two either side of the exact optimum (1,099 s), whose exact ETTRs differ by
    5e-5, well below the sampling error. The simulated ETTR is the renewal-reward ETTR within 3 standard errors
    at every interval (today 1.1 of them at worst; 20 replications of 54 d, 95% half-widths 0.0005 to
    0.0035)."""
    intervals = [400.0, 600.0, 800.0, 1000.0, 1200.0, 1400.0, 1800.0, 2400.0, 3200.0]
    curve = simulated_curve(job_text("exponential", 1.0, "10 s"), intervals)
    daly = curve[0]["daly_interval_s"]
    assert daly == pytest.approx(math.sqrt(2 * C * M) * (1 + math.sqrt(C / (2 * M)) / 3 + C / (18 * M)) - C,
                                 rel=1e-12)
    ettr = [s["ettr"]["mean"] for s in curve]
    from simulator.reliability.study import fitted_optimum

    assert fitted_optimum(intervals, ettr) == pytest.approx(daly, rel=0.02)
    assert intervals[int(np.argmax(ettr))] in (1000.0, 1200.0)
    for interval, summary in zip(intervals, curve):
        assert within_three_sigma(renewal_ettr(interval, 10.0, 1.0, cost=C, mtbf=M), summary["ettr"])


def restarts_never_fail_ettr(interval: float, restart: float) -> float:
    """ETTR under exponential failures if no failure struck during a restart: each failure costs R plus the
    work since the last checkpoint, T sum_j e^(-j (T+C)/M) / (M + R)."""
    return renewal_ettr(interval, 0.0, cost=C, mtbf=M) * M / (M + restart)


@pytest.mark.parametrize("distribution, shape, optimum", [("exponential", 1.0, 1100.0), ("weibull", 0.5, 1520.0)])
def test_large_restart_cost_moves_the_optimum_only_for_weibull(distribution, shape, optimum):
    """The simulated ETTR is the renewal-reward ETTR within 3 standard errors at every interval (today 0.1 of
    them at worst for exponential failures, 0.9 for Weibull 0.5, whose long tail of failure gaps makes the 20
    replications' mean noisier: 95% half-widths 0.0057 to 0.0067 and 0.0073 to 0.0084). The alternative lies
    outside at every interval: restarts that never fail 8.8 to 10.4 standard errors above the exponential
    curve, exponential failures 24.8 to 26.6 below the Weibull one."""
    intervals = [800.0, 1100.0, 1500.0, 2100.0]
    grid = np.linspace(300.0, 4000.0, 3701)
    exact = grid[int(np.argmax([renewal_ettr(t, 3600.0, shape, cost=C, mtbf=M) for t in grid]))]
    assert exact == pytest.approx(optimum, rel=0.01)
    curve = simulated_curve(job_text(distribution, shape, "1 h"), intervals)
    daly = curve[0]["daly_interval_s"]
    for interval, summary in zip(intervals, curve):
        assert within_three_sigma(renewal_ettr(interval, 3600.0, shape, cost=C, mtbf=M), summary["ettr"])
        alternative = (restarts_never_fail_ettr(interval, 3600.0) if distribution == "exponential"
                       else renewal_ettr(interval, 3600.0, 1.0, cost=C, mtbf=M))
        assert not within_three_sigma(alternative, summary["ettr"])
    best = intervals[int(np.argmax([s["ettr"]["mean"] for s in curve]))]
    assert best == min(intervals, key=lambda t: abs(t - exact))
    assert (abs(exact - daly) / daly > 0.3) == (distribution == "weibull")


@pytest.mark.parametrize("best, steps, edge", [
    (61.2, "6 steps", ", the shortest tried: the optimum may be shorter"),
    (122.3, "12 steps", ""),
    (244.6, "24 steps", ", the longest tried: the optimum may be longer"),
])
def test_the_study_line_gives_the_best_intervals_steps_and_whether_it_is_at_the_edge(best, steps, edge):
    """'--intervals 1min,2min,4min': the line gives the best interval with its steps (1 min rounds to 6 steps of 10.18
    s, 61.06 s) and says the best is the shortest tried, where Young's interval (13.6 s) says the optimum lies below."""
    from simulator.cli import _steps_and_edge

    points = [{"interval_s": 61.2, "interval_steps": 6}, {"interval_s": 122.3, "interval_steps": 12},
              {"interval_s": 244.6, "interval_steps": 24}]
    assert _steps_and_edge({"points": points, "best_interval_s": best}) == (steps, edge)
    at_young = {"points": points, "best_interval_s": 61.2, "young_interval_s": 55.0}  # within a 10.2 s step
    assert _steps_and_edge(at_young) == ("6 steps", ", the shortest tried: within a step of Young's interval or "
                                                    "below it")
    before_young = {**at_young, "young_interval_s": 50.0}  # 61.2 s is more than a step above it
    assert _steps_and_edge(before_young)[1] == ", the shortest tried: the optimum may be shorter"
    at_floor = {"points": points, "best_interval_s": 61.2, "write_floor_steps": 6}
    assert _steps_and_edge(at_floor)[1] == (", the shortest tried: at the async write floor, below which each "
                                            "checkpoint waits for the write")
    one_step = [{"interval_s": 10.2, "interval_steps": 1}, *points]  # no job checkpoints more often than a step
    assert _steps_and_edge({"points": one_step, "best_interval_s": 10.2}) == ("1 step", "")
    assert _steps_and_edge({"points": points[:1], "best_interval_s": 61.2}) == ("6 steps", "")


def test_a_curve_flat_within_its_intervals_says_so_instead_of_naming_a_best(tmp_path, capsys):
    """trace-job's study (4 replications, restarts waiting for hosts) has every point within 0.02% of the best (ETTR
    97.94% at 49.29 s) and 95% intervals of +-2%: a curve whose every point lies inside the best point's 95% interval
    says it is flat, with the spread of the points and that interval, not 'best interval 49.29 s'; study.json's
    `flat` says it too."""
    from simulator.reliability.study import curve_is_flat

    assert curve_is_flat([0.97, 0.975, 0.98], 0.96) and not curve_is_flat([0.95, 0.975, 0.98], 0.96)
    assert not curve_is_flat([0.98], 0.96) and not curve_is_flat([0.97, 0.98], None)
    out = tmp_path / "study"
    assert main(["study", "checkpoint-interval", "trace-job", "--out", str(out)]) == 0
    curve = json.loads((out / "study.json").read_text())["curves"][0]
    ettr = [point["ettr"] for point in curve["points"]]
    best = next(point for point in curve["points"] if point["interval_s"] == curve["best_interval_s"])
    assert curve["flat"] and min(ettr) >= best["ettr_ci95_low"] and max(ettr) - min(ettr) < 2e-4
    printed = capsys.readouterr().out
    assert "best interval" not in printed
    assert (f"rate x 1 (MTBF 250.0 h, C 2.7 ms): flat within the 95% intervals: ETTR {100 * min(ettr):.2f}% to "
            f"{100 * max(ettr):.2f}% over the 9 intervals tried, all inside the best's 95% interval "
            f"({100 * best['ettr_ci95_low']:.2f}% to {100 * best['ettr_ci95_high']:.2f}%); highest at 49.29 s, "
            "7,581 steps; Young 69.71 s, Daly 69.71 s\n") in printed


def test_study_command_writes_the_curve_and_plot(tmp_path, capsys):
    """Besides the curves: what the command prints and study.csv hold to four and six significant digits (not `:.0f`,
    which shows a 0.4 s interval as 0 s, nor float noise such as 1138.4199576606166); study.json keeps every digit."""
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
    young = math.sqrt(2 * first["checkpoint_cost_s"] * M)  # sqrt(2 C M), C = 60 s: 1,138.42 s
    assert first["young_interval_s"] == pytest.approx(young, rel=1e-12)
    printed = capsys.readouterr().out.splitlines()[0]
    assert printed.startswith("rate x 1 (MTBF 3.0 h, C 60 s): best interval ") and "; Young 18.97 min, Daly " in printed
    assert f"(ETTR {100 * first['best_ettr']:.2f}%)" in printed  # a percentage, as the job's table prints it
    rows = pd.read_csv(out / "study.csv", dtype=str)
    assert set(rows["young_interval_s"]) == {"1138.42", f"{young / math.sqrt(2):.6g}"}  # x 2: M / 2
    assert all(len(value.replace(".", "").lstrip("0")) <= 6 for value in rows["ettr"])
    assert main(["plot", "goodput", str(out)]) == 0
    assert (out / "goodput.png").stat().st_size > 10_000


def replayed_goodputs(scenario: str, interval_s: float, replications: int) -> tuple[np.ndarray, float]:
    """Each replication's kept healthy-equivalent steps per second of the job at ``interval_s``, replayed one by
    one with its own arrivals (replication r draws from `default_rng([run.seed, r])`), and the tokens a step
    holds."""
    import simpy

    from simulator.reliability.events import JobEvents
    from simulator.reliability.job import JobProcess
    from simulator.reliability.processes import draw_arrivals
    from simulator.reliability.simulate import prepare_job
    from simulator.reliability.study import study_point_scenario

    loaded = study_point_scenario(scenario, [], 1.0, 1.0, interval_s)
    job = prepare_job(loaded)
    horizon, seed = loaded.scenario.run.horizon, loaded.scenario.run.seed
    rates = []
    for replication in range(replications):
        arrivals = draw_arrivals(np.random.default_rng([seed, replication]), job.model.classes,
                                 job.plan.drawn_units(job.counts), horizon)
        process = JobProcess(job.plan, arrivals, JobEvents())
        env = simpy.Environment()
        env.process(process.run(env))
        env.run()
        rates.append(process.totals(job.healthy).equivalent_steps / horizon)
    return np.asarray(rates), job.healthy.tokens_per_step


def test_study_csv_gives_goodputs_95_percent_interval_and_the_chart_its_band(tmp_path):
    """study.csv gives goodput's 95% interval beside ETTR's, so `trainsim plot goodput` draws a band under goodput too:
    `goodput_tokens_per_s_ci95_low`/`_high` and `goodput_steps_per_s_ci95_low`/`_high` are Student's t interval over
    the replications, here of the replications replayed one by one (scipy's t quantile), and the goodput panel fills
    between them."""
    from scipy import stats

    from simulator.reliability.plots import goodput_figure, load_study

    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 5"))
    out = tmp_path / "study"
    assert main(["study", "mtbf", str(scenario), "--intervals", "20min,40min", "--multipliers", "1", "--out", str(out),
                 "--quiet"]) == 0
    rows = pd.read_csv(out / "study.csv")
    for row in rows.itertuples():
        steps, tokens = replayed_goodputs(str(scenario), row.interval_s, 5)
        half = stats.t.ppf(0.975, len(steps) - 1) * steps.std(ddof=1) / math.sqrt(len(steps))
        assert half > 0
        expected = {"goodput_steps_per_s": steps.mean(), "goodput_steps_per_s_ci95_low": steps.mean() - half,
                    "goodput_steps_per_s_ci95_high": steps.mean() + half,
                    "goodput_tokens_per_s_ci95_low": tokens * (steps.mean() - half),
                    "goodput_tokens_per_s_ci95_high": tokens * (steps.mean() + half)}
        # six significant digits in the CSV; the t table's three decimals (2.776 for 4 degrees of freedom)
        assert {key: getattr(row, key) for key in expected} == pytest.approx(expected, rel=2e-5)
    figure = goodput_figure(load_study(out))
    assert [len(axis.collections) for axis in figure.axes] == [1, 1]  # ETTR's band, and now goodput's


def test_study_multipliers_scale_the_scenarios_own_rate_multiplier(tmp_path, capsys):
    """A scenario with `faults.rate_multiplier: 2` (one failing unit with a 3 h MTBF, so 1.5 h): its study's x 1 curve
    is that scenario, MTBF 1.5 h, and x 2 is 0.75 h; the study multiplies the field, not sets it (else a
    checkpoint-interval study, multiplier 1 by default, would run the job at half its failure rate with the Young and
    Daly intervals of a 3 h MTBF). Each line names its MTBF, and with one interval that interval's ETTR, not a 'best
    interval' (the only one tried). Its intervals read in one unit, the one the shortest of them reaches (not
    'interval 20 min ...; Young 805 s, Daly 765.5 s')."""
    scenario = tmp_path / "job.yaml"
    text = job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 1")
    scenario.write_text(text.replace("faults:\n", "faults:\n  rate_multiplier: 2\n"))
    out = tmp_path / "study"
    assert main(["study", "mtbf", str(scenario), "--intervals", "20min", "--multipliers", "1,2",
                 "--out", str(out)]) == 0
    curves = json.loads((out / "study.json").read_text())["curves"]
    assert [curve["rate_multiplier"] for curve in curves] == [1.0, 2.0]
    assert [curve["mtbf_s"] for curve in curves] == pytest.approx([M / 2, M / 4], rel=1e-12)
    assert curves[0]["young_interval_s"] == pytest.approx(math.sqrt(2 * C * M / 2), rel=1e-12)
    lines = capsys.readouterr().out.splitlines()
    ettr = [100 * curve["points"][0]["ettr"] for curve in curves]
    assert lines[:2] == [f"rate x 1 (MTBF 1.5 h, C 60 s): interval 20.00 min, 3,893 steps (ETTR {ettr[0]:.2f}%); "
                         "Young 13.42 min, Daly 12.76 min",  # sqrt(2 C M) and Daly's for C = 60 s, M = 1.5 h
                         f"rate x 2 (MTBF 45.0 min, C 60 s): interval 20.00 min, 3,893 steps (ETTR {ettr[1]:.2f}%); "
                         "Young 9.487 min, Daly 8.832 min"]


def test_force_runs_a_study_point_past_the_job_event_limit(tmp_path, monkeypatch, capsys):
    """A study point over the job-event limit is refused with "...; or pass --force", and `trainsim study --force`
    passes --force to every point."""
    import simulator.reliability.simulate as job_simulation

    monkeypatch.setattr(job_simulation, "MAX_JOB_EVENTS", 10)
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 1"))
    command = ["study", "mtbf", str(scenario), "--intervals", "20min", "--out", str(tmp_path / "study")]
    assert main(command) == 2
    assert capsys.readouterr().err.rstrip().endswith("or pass --force)")
    assert main([*command, "--force"]) == 0
    assert len(json.loads((tmp_path / "study" / "study.json").read_text())["curves"][0]["points"]) == 1


def test_a_rerun_study_does_not_keep_the_earlier_studys_chart(tmp_path):
    """The study folder holds one study: rerun with other intervals, the goodput.png drawn of the earlier
    study goes with its files (it stayed beside the new study.json, showing the old curve)."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 2"))
    out = tmp_path / "study"
    command = ["study", "checkpoint-interval", str(scenario), "--out", str(out), "--intervals"]
    assert main([*command, "10min,20min,40min"]) == 0
    assert main(["plot", "goodput", str(out)]) == 0
    assert (out / "goodput.png").is_file()
    assert main([*command, "5min,10min"]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["manifest.json", "study.csv", "study.json"]
    assert main(["plot", "goodput", str(out)]) == 0


def test_goodput_chart_of_a_study_without_failures(tmp_path):
    """A study of a job without failures has no MTBF: the chart says 'no failures' in its legend (it raised a
    TypeError on MTBF None after the study had been written)."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 2").replace(
        "faults:\n  components:\n    job_failure: {unit: host, effect: restart, mtbf: 3 h, distribution: exponential, "
        "shape: 1.0}\n", ""))
    out = tmp_path / "study"
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "10min,20min", "--out", str(out)]) == 0
    assert json.loads((out / "study.json").read_text())["curves"][0]["mtbf_s"] is None
    from simulator.reliability.plots import goodput_figure, load_study

    figure = goodput_figure(load_study(out))
    assert figure.get_suptitle() == "job.yaml"  # the scenario's file name, as a run's charts are titled
    assert figure.axes[0].get_legend().get_texts()[0].get_text() == "rate x 1 (no failures)"
    assert main(["plot", "goodput", str(out)]) == 0


def test_goodput_chart_legend_gives_the_mtbf_as_the_printed_lines_do_and_no_best_of_one_point():
    """A study of a 32-GPU job at x 1, 100 and 10000 labels its curves 'MTBF 2,168.5 h' as its printed lines say (not
    'MTBF 2.17e+03 h'); a study of one point does not star it as the 'simulated best', which the printed lines
    rightly do not call it, nor draw its 95% interval as a band of no width. (Several rates of one interval each are
    drawn against the MTBF: test_an_mtbf_studys_chart_is_drawn_against_the_mtbf.)"""
    from simulator.reliability.plots import goodput_figure

    def curve(multiplier: float, intervals: list[float]) -> dict:
        points = [{"interval_s": t, "ettr": 0.9, "ettr_ci95_low": 0.89, "ettr_ci95_high": 0.91,
                   "goodput_tokens_per_s": 1e5} for t in intervals]
        return {"rate_multiplier": multiplier, "mtbf_s": 7_806_607.0 / multiplier, "points": points,
                "young_interval_s": 4479.0, "daly_interval_s": 4478.0, "best_interval_s": intervals[0],
                "best_ettr": 0.9}

    def legend(study: dict) -> list[str]:
        return [text.get_text() for text in goodput_figure(study).axes[0].get_legend().get_texts()]

    grid = {"scenario": "job.yaml", "curves": [curve(m, [900.0, 1800.0]) for m in (1, 100, 1e4)]}
    assert legend(grid) == ["rate x 1 (MTBF 2,168.5 h)", "rate x 100 (MTBF 21.7 h)", "rate x 10000 (MTBF 13.01 min)",
                            "Young", "Daly", "simulated best"]
    lone = {"scenario": "job.yaml", "curves": [curve(1, [1800.0])]}
    assert legend(lone) == ["rate x 1 (MTBF 2,168.5 h)", "Young", "Daly"]
    assert not any(line.get_marker() == "*" for line in goodput_figure(lone).axes[0].get_lines())
    assert len(goodput_figure(lone).axes[0].containers) == 1  # the lone point's 95% interval as an error bar


def test_an_mtbf_studys_chart_is_drawn_against_the_mtbf(tmp_path):
    """`trainsim study mtbf --multipliers 0.5,1,2` runs the scenario's one interval (30 min) at three failure rates:
    ETTR and goodput are drawn against the system MTBF in hours (6 h, 3 h, 1.5 h for this job's 3 h), each point
    marked with its multiplier, with their 95% bands, not three points at x = 30 min one above the other; a
    checkpoint-interval study of the same job keeps the interval axis."""
    from simulator.reliability.plots import goodput_figure, load_study

    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 3"))
    out = tmp_path / "mtbf"
    assert main(["study", "mtbf", str(scenario), "--multipliers", "0.5,1,2", "--out", str(out), "--quiet"]) == 0
    curves = load_study(out)["curves"]
    figure = goodput_figure(load_study(out))
    ettr_axis, goodput_axis = figure.axes
    assert goodput_axis.get_xlabel() == "system MTBF (h)"
    (ettr,) = [line for line in ettr_axis.get_lines() if line.get_marker() == "o"]
    (goodput,) = [line for line in goodput_axis.get_lines() if line.get_marker() == "o"]
    by_mtbf = sorted(curves, key=lambda curve: curve["mtbf_s"])
    assert list(ettr.get_xdata()) == pytest.approx([M / 2 / 3600, M / 3600, 2 * M / 3600], rel=1e-12)
    assert list(ettr.get_ydata()) == pytest.approx([100 * c["points"][0]["ettr"] for c in by_mtbf], rel=1e-12)
    assert list(goodput.get_xdata()) == list(ettr.get_xdata())
    assert ettr.get_label() == "checkpoint every 30 min"
    assert [text.get_text() for text in ettr_axis.texts] == ["rate x 2", "rate x 1", "rate x 0.5"]
    assert [len(axis.collections) for axis in figure.axes] == [1, 1]  # the 95% bands over the three MTBFs
    assert main(["plot", "goodput", str(out)]) == 0
    interval = tmp_path / "interval"
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "10min,20min", "--multipliers", "1,2",
                 "--out", str(interval), "--quiet"]) == 0
    assert goodput_figure(load_study(interval)).axes[1].get_xlabel() == "checkpoint interval (min)"


def test_goodput_chart_gives_ettr_in_percent_as_the_printed_lines_do():
    """The study prints 'ETTR 91.99%', and its chart's ETTR axis reads in percent too (not 0.92): the points, their band
    and the star are in percent, and the label says so."""
    from simulator.reliability.plots import goodput_figure

    points = [{"interval_s": t, "ettr": e, "ettr_ci95_low": e - 0.01, "ettr_ci95_high": e + 0.01,
               "goodput_tokens_per_s": 1e6} for t, e in ((300.0, 0.9199), (600.0, 0.9077))]
    study = {"scenario": "job.yaml", "curves": [{"rate_multiplier": 1, "mtbf_s": 11135.0, "points": points,
                                                 "young_interval_s": 13.6, "daly_interval_s": 13.6,
                                                 "best_interval_s": 300.0, "best_ettr": 0.9199}]}
    axis = goodput_figure(study).axes[0]
    assert axis.get_ylabel() == "ETTR, effective training time ratio (%)"
    curve, star = (line for line in axis.get_lines() if len(line.get_ydata()) and line.get_linestyle() != "--"
                   and line.get_linestyle() != ":")
    assert list(curve.get_ydata()) == pytest.approx([91.99, 90.77])
    assert list(star.get_ydata()) == pytest.approx([91.99])
    band = axis.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(89.77) and band.max() == pytest.approx(92.99)


def test_an_mtbf_study_without_multipliers_runs_half_and_twice_the_rate_and_is_drawn_against_the_mtbf(tmp_path):
    """`trainsim study mtbf` without --multipliers runs x 0.5, 1 and 2, not x 1 alone, and one given multiplier
    is drawn against the MTBF too, not against the checkpoint interval (study.json names its kind), its ticks in
    hours rounded as the lines print them."""
    from simulator.reliability.plots import goodput_figure, load_study

    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 1"))
    out = tmp_path / "mtbf"
    assert main(["study", "mtbf", str(scenario), "--out", str(out), "--quiet"]) == 0
    study = load_study(out)
    assert [curve["rate_multiplier"] for curve in study["curves"]] == [0.5, 1.0, 2.0]
    axes = goodput_figure(study).axes[1]
    assert axes.get_xlabel() == "system MTBF (h)"
    ticks = axes.xaxis.get_major_formatter()
    assert [ticks(hours, 0) for hours in (3.09308, 6.18616, 0.51234)] == ["3.1", "6.2", "0.51"]  # as printed
    assert main(["study", "mtbf", str(scenario), "--multipliers", "1", "--out", str(out), "--quiet"]) == 0
    study = load_study(out)
    assert study["study"] == "mtbf" and len(study["curves"]) == 1
    assert goodput_figure(study).axes[1].get_xlabel() == "system MTBF (h)"


@pytest.mark.parametrize("mtbf", [True, False], ids=["against-the-mtbf", "against-the-multiplier"])
def test_an_mtbf_charts_points_of_different_intervals_each_say_their_interval(mtbf):
    """An mtbf study whose points ran different intervals (one per rate): each point says its own interval (where the x
    axis is the multiplier too) and the line says so, not one line labelled 'checkpoint every 2 min, 4 min' with
    points marked only by their multipliers."""
    from simulator.reliability.plots import goodput_figure

    def curve(rate: float, interval: float) -> dict:
        point = {"interval_s": interval, "ettr": 0.9, "ettr_ci95_low": 0.89, "ettr_ci95_high": 0.91,
                 "goodput_tokens_per_s": 1e6}
        return {"rate_multiplier": rate, "mtbf_s": 7200.0 / rate if mtbf else None, "points": [point],
                "young_interval_s": None, "daly_interval_s": None, "best_interval_s": interval, "best_ettr": 0.9}

    axis = goodput_figure({"scenario": "job.yaml", "curves": [curve(1, 240.0), curve(2, 120.0)]}).axes[0]
    (line,) = [line for line in axis.get_lines() if line.get_marker() == "o"]
    assert line.get_label() == "checkpoint interval per point"
    marks = ["rate x 2, every 2 min", "rate x 1, every 4 min"] if mtbf else ["every 4 min", "every 2 min"]
    assert [text.get_text() for text in axis.texts] == marks


@pytest.mark.parametrize("goodput, unit, shown", [(6.2e4, "k tokens/s", 62.0), (1.5e6, "M tokens/s", 1.5),
                                                   (450.0, "tokens/s", 450.0)])
def test_goodput_axis_takes_the_unit_its_largest_value_reaches(goodput, unit, shown):
    """A small study's goodput axis read 0.06 in 'M tokens/s': the axis is in the unit of tokens/s that its
    largest goodput reaches, so that its values read 1 to 1,000 (62 k tokens/s), its band scaled alike."""
    from simulator.reliability.plots import goodput_figure

    points = [{"interval_s": t, "ettr": 0.9, "ettr_ci95_low": 0.89, "ettr_ci95_high": 0.91,
               "goodput_tokens_per_s": goodput * share, "goodput_tokens_per_s_ci95_low": 0.9 * goodput * share,
               "goodput_tokens_per_s_ci95_high": 1.1 * goodput * share} for t, share in ((300.0, 0.5), (600.0, 1.0))]
    study = {"scenario": "job.yaml", "curves": [{"rate_multiplier": 1, "mtbf_s": 11135.0, "points": points,
                                                 "young_interval_s": 13.6, "daly_interval_s": 13.6,
                                                 "best_interval_s": 600.0, "best_ettr": 0.9}]}
    axis = goodput_figure(study).axes[1]
    assert axis.get_ylabel() == f"goodput ({unit})"
    curve = next(line for line in axis.get_lines() if line.get_marker() == "o")
    assert list(curve.get_ydata()) == pytest.approx([shown / 2, shown])
    assert axis.collections[0].get_paths()[0].vertices[:, 1].max() == pytest.approx(1.1 * shown)


def test_every_per_second_column_of_a_study_chart_takes_the_unit_its_largest_value_reaches(tmp_path):
    """Every `*_per_s` column of a study's or a sweep's chart (a synthetic model's healthy-equivalent steps/s, 1,667
    steps/s of 0.6 ms steps; the job's `goodput_steps_per_s.mean`, `tokens_per_s`) takes the unit its largest value
    reaches (k, M, G), as tokens/s does, read off one tiny study.json and a sweep table of its figures."""
    from simulator.reliability.plots import goodput_figure, load_study
    from simulator.report.run_folder import write_run_folder
    from simulator.report.study_plots import sweep_figure

    points = [{"interval_s": t, "ettr": e, "ettr_ci95_low": e - 0.01, "ettr_ci95_high": e + 0.01,
               "goodput_tokens_per_s": None, "goodput_steps_per_s": e / 6e-4}
              for t, e in ((300.0, 0.9), (600.0, 0.95))]
    study = {"scenario": "job.yaml", "overrides": [], "curves": [
        {"rate_multiplier": 1, "mtbf_s": 11135.0, "points": points, "young_interval_s": 400.0,
         "daly_interval_s": 420.0, "best_interval_s": 600.0, "best_ettr": 0.95}]}
    write_run_folder(tmp_path / "study", {"scenario": "job.yaml"},
                     lambda stage: (stage / "study.json").write_text(json.dumps(study)))
    axis = goodput_figure(load_study(tmp_path / "study")).axes[1]
    assert axis.get_ylabel() == "goodput (k healthy-equivalent steps/s)"
    curve = next(line for line in axis.get_lines() if line.get_marker() == "o")
    assert list(curve.get_ydata()) == pytest.approx([1.5, 0.95 / 0.6])
    frame = pd.DataFrame({"status": "ok", "checkpoint.interval": [300, 600],
                          "goodput_steps_per_s.mean": [p["goodput_steps_per_s"] for p in points],
                          "tokens_per_s": [2.5e6, 2.6e6]})
    for column, label, shown in (("goodput_steps_per_s.mean", "goodput, mean (k steps/s)", 1.5),
                                 ("tokens_per_s", "throughput (M tokens/s)", 2.5)):
        ax = sweep_figure(frame, "checkpoint.interval", column).axes[0]
        assert ax.get_ylabel() == label and ax.get_lines()[0].get_ydata()[0] == pytest.approx(shown)


def test_a_synthetic_models_study_charts_goodput_in_healthy_steps(tmp_path, capsys):
    """A synthetic model has no tokens: the job crashed dividing by them. Its study's points carry goodput in
    healthy-equivalent steps per second (tokens per second null), the chart draws those, and the job's table
    says tokens/s n/a. Without failures all training is kept: goodput = ETTR / 6 ms. At 10 min, 143 whole cycles
    of 100,000 6 ms steps and a 0.1 s write (10 GB at 4 hosts x 25 GB/s) fit in the day: ETTR = 1 - 14.3 s / 1 d."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text("""
cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1,
          leaf_ports: 2, spines: 2, oversubscription: 2}
model: {synthetic: {stages: 1, forward: 1 ms, backward: 2 ms}}
training: {microbatches: 2}
parallelism: {dp: 4}
checkpoint: {size: 10 GB}
storage: {capacity: 1 PB}
run: {horizon: 1 d}
""")
    out = tmp_path / "study"
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "10min,20min", "--out", str(out)]) == 0
    point = json.loads((out / "study.json").read_text())["curves"][0]["points"][0]
    assert point["goodput_tokens_per_s"] is None
    assert point["ettr"] == pytest.approx(1 - 143 * 0.1 / 86400, rel=1e-12)
    assert point["goodput_steps_per_s"] == pytest.approx(point["ettr"] / 0.006, rel=1e-12)
    from simulator.reliability.plots import goodput_figure, load_study

    assert goodput_figure(load_study(out)).axes[1].get_ylabel() == "goodput (healthy-equivalent steps/s)"
    assert main(["plot", "goodput", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", str(scenario), "--out", str(tmp_path / "job")]) == 0
    table = capsys.readouterr().out
    # ETTR 1 - 14.3 s / 1 d = 99.98%: short of the whole, so not '100.0%'
    assert "6.000 ms, tokens/s n/a" in table and "healthy-equivalent steps/s, >99.9% of healthy" in table
    assert "ETTR             >99.9%\n" in table


@pytest.mark.parametrize("content, option, problem", [
    ("{", None, "study.json is not readable JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
     "(char 1))"),
    ('{"curves": []}', None, "study.json has no curves"),
    ('{"curves": [{"rate_multiplier": 1}]}', None, "a curve of study.json lacks 'mtbf_s'"),
    (None, None, "has no study.json"),
    ("VALID", "goodput.foo", "unknown image format '.foo'"),
])
def test_goodput_chart_refuses_what_it_cannot_draw(content, option, problem, tmp_path, capsys):
    """One line, exit 2, no image, no traceback and no empty chart: a corrupt, empty or partial study.json and an image
    format matplotlib cannot write."""
    folder = tmp_path / "study"
    folder.mkdir()
    if content == "VALID":
        content = json.dumps({"scenario": "job.yaml", "curves": [{
            "rate_multiplier": 1.0, "mtbf_s": 3600.0, "young_interval_s": 60.0, "daly_interval_s": 59.0,
            "best_interval_s": 60.0, "best_ettr": 0.9, "points": [{
                "interval_s": 60.0, "ettr": 0.9, "ettr_ci95_low": None, "ettr_ci95_high": None,
                "goodput_tokens_per_s": 1e6}]}]})
    if content is not None:  # as `trainsim study` writes its folder: the file with a manifest that lists it
        write_run_folder(folder, {"scenario": "job.yaml"}, lambda stage: (stage / "study.json").write_text(content))
    output = ["-o", str(tmp_path / option)] if option else []
    assert main(["plot", "goodput", str(folder), *output]) == 2
    err = capsys.readouterr().err.strip()
    where = "command line: trainsim plot: --output" if option else f"{folder}: OUTDIR"
    assert err.startswith(f"error: {where}: {problem} (allowed: "), err
    assert len(err.splitlines()) == 1
    assert not list(tmp_path.glob("**/*.png")) and not list(tmp_path.glob("*.foo"))


@pytest.mark.parametrize("change, problem", [
    (lambda folder: (folder / "manifest.json").unlink(),
     "has no manifest.json (not a complete trainsim run, or written before manifests)"),
    (lambda folder: (folder / "study.json").write_text((folder / "study.json").read_text().replace("1.0", "2.0")),
     "study.json is not the file this run wrote (mixed or edited folder)"),
    (lambda folder: (folder / "study.csv").unlink(), "study.csv of this run is missing (incomplete folder)"),
])
def test_goodput_chart_checks_the_study_folder_against_its_manifest(change, problem, tmp_path, capsys):
    """`plot goodput` refuses in one line a folder whose study.json its manifest does not vouch for (an edited file,
    another study's beside this one's table), as `plot gantt` and `plot memory` do."""
    folder = tmp_path / "study"
    study = {"scenario": "job.yaml", "overrides": [], "curves": [{
        "rate_multiplier": 1.0, "mtbf_s": 3600.0, "young_interval_s": 60.0, "daly_interval_s": 59.0,
        "best_interval_s": 60.0, "best_ettr": 0.9, "points": [{
            "rate_multiplier": 1.0, "interval_s": 60.0, "ettr": 0.9, "ettr_ci95_low": None, "ettr_ci95_high": None,
            "goodput_tokens_per_s": 1e6}]}]}
    write_study(folder, study)
    assert main(["plot", "goodput", str(folder), "-o", str(tmp_path / "ok.png")]) == 0
    change(folder)
    assert main(["plot", "goodput", str(folder)]) == 2
    assert capsys.readouterr().err == (f"error: {folder}: OUTDIR: {problem} (allowed: a folder written by "
                                       "`trainsim study ... --out DIR`)\n")
    assert not (folder / "goodput.png").exists()


def test_a_study_out_inside_a_file_is_refused_before_the_study_runs(tmp_path, monkeypatch, capsys):
    """--out under a file (or an unwritable folder) was first tried after the whole study had run: 'error:
    FILE/.x.partial-...: ...', exit status 1."""
    import simulator.reliability.study as study

    monkeypatch.setattr(study, "run_study", lambda *args, **kwargs: pytest.fail("ran the study"))
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s"))
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "study"
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "10min", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: command line: trainsim study: --out: {tmp_path / 'afile'} is not a "
                                       "folder (allowed: "
                                       "a path inside a writable folder)\n")


def test_durations_print_with_four_significant_digits_and_no_exponent():
    """`format_seconds` (the job and study printouts): four significant digits and no exponent (10,800 s, not
    1.08e+04 s), thousands separators from 1,000 s on, as every other figure beside it."""
    assert [format_seconds(value) for value in (29.39387691338477, 0.4, 10800.0, 1138.4199576606166)] == [
        "29.39 s", "400 ms", "10,800 s", "1,138 s"]


def test_figures_read_side_by_side_keep_their_trailing_zeros():
    """The job table read 'per failure 46.9 s (95%: 46 s to 47.81 s)' and 'Young 49.3 s, Daly 49.29 s': a trailing
    zero dropped reads as a figure known to fewer digits. A mean and its 95% interval, Young's and Daly's
    intervals, and a study line's intervals keep four significant digits, zeros and all."""
    from simulator.console.report import seconds_alike, young_daly_text

    assert [seconds_alike(value) for value in (46.9, 46.0, 47.81, 0.0015, 1040.2, 0.0)] == [
        "46.90 s", "46.00 s", "47.81 s", "1.500 ms", "1,040 s", "0 s"]
    figures = {"young_interval_s": 49.3, "daly_interval_s": 49.29, "young_formula_s": 49.3, "daly_formula_s": 49.29}
    assert young_daly_text(figures) == "Young 49.30 s, Daly 49.29 s"
    assert [durations_alike([49.3, 49.29])(value) for value in (49.3, 49.29)] == ["49.30 s", "49.29 s"]


def test_young_and_daly_below_one_step_print_as_the_formulas_give_them_and_say_they_are_floored():
    """x 2 the 405B job's failure rates Young's sqrt(2 x 7.26 ms x 5,567 s) is 8.991 s, under its one 10.18 s step:
    the line prints the formulas' figures as they come by hand, not the floored 'Young 10.18 s, Daly 10.18 s', and
    says which the step floors; above the step it prints them alone."""
    from simulator.console.report import young_daly_text

    step = {"write_floor_steps": 1, "write_floor_s": 10.1761}
    both = {**step, "young_interval_s": 10.1761, "daly_interval_s": 10.1761, "young_formula_s": 8.9906,
            "daly_formula_s": 8.9857}
    assert young_daly_text(both) == "Young 8.991 s, Daly 8.986 s (both floored to 1 step, 10.18 s)"
    daly = {**both, "young_interval_s": 10.5, "young_formula_s": 10.5, "daly_formula_s": 9.9}
    assert young_daly_text(daly) == "Young 10.50 s, Daly 9.900 s (Daly's floored to 1 step, 10.18 s)"
    above = {**both, "young_interval_s": 12.7151, "daly_interval_s": 12.7103, "young_formula_s": 12.7151,
             "daly_formula_s": 12.7103}
    assert young_daly_text(above) == "Young 12.72 s, Daly 12.71 s"


def test_a_duration_takes_the_unit_of_its_rounded_value():
    """A duration takes the unit of its rounded value: a 1 ms checkpoint cost computed as 0.0009999999999763531 s reads
    '1 ms' (not '1000 us of training each'), 0.99999 s '1 s' (not '1000 ms') and 9999.99 s '10,000 s' (not '1e+04
    s')."""
    assert [format_seconds(value) for value in (0.0009999999999763531, 0.99999, 9999.99, 0.00099949, 0.99994)] == [
        "1 ms", "1 s", "10,000 s", "999.5 us", "999.9 ms"]


def test_durations_read_side_by_side_share_the_unit_the_shortest_reaches():
    """A study line's interval and Young's and Daly's share one unit, the largest the shortest reaches, with four
    significant digits (not 'interval 20 min; Young 805 s'); figures too far apart for four digits in that unit
    (9,999.6 s rounds to 1e+04 s beside 19.22 s) each in their own unit."""
    minutes = durations_alike([1200.0, 805.0, 765.5])
    assert [minutes(value) for value in (1200.0, 805.0, 765.5)] == ["20.00 min", "13.42 min", "12.76 min"]
    seconds = durations_alike([295.6, 19.22, 9999.4])
    assert [seconds(value) for value in (295.6, 19.22, 9999.4)] == ["295.6 s", "19.22 s", "9,999 s"]
    apart = durations_alike([295.6, 19.22, 9999.6])
    assert [apart(value) for value in (295.6, 19.22, 9999.6)] == ["4.927 min", "19.22 s", "2.778 h"]
    assert durations_alike([86400.0 * 60, 2 * 86400.0])(86400.0 * 2) == "2.000 d"
    assert durations_alike([])(1.5) == "1.5 s"


def test_a_zero_duration_beside_minutes_reads_zero_seconds():
    """A mean and its 95% bounds share the unit the shortest positive one reaches, but a zero bound has no magnitude
    to share one: it reads '0 s' (docs/reliability.md), not '0 min' beside '2.406 min'."""
    alike = durations_alike([64.2, 0.0, 144.36])
    assert [alike(value) for value in (64.2, 0.0, 144.36)] == ["1.070 min", "0 s", "2.406 min"]


def test_an_astronomical_duration_prints_four_significant_digits():
    """Young's interval of a study at failure rates x 1e-300 is sqrt(2 x cost x MTBF), ~1.4e153 s: from 10^15 s on it
    prints four significant digits, as format_count does, not 154 digits with separators; the boundary is decided on
    the value as rounded, as the units are: 999,999,999,999,999 s is 1e+15 to four digits, and 9.9949e14 s is not."""
    assert [format_seconds(value) for value in (999_999_999_999_999.0, 9.9949e14, 1e15, 1.4239444e153)] == [
        "1e+15 s", "999,490,000,000,000 s", "1e+15 s", "1.424e+153 s"]


def test_a_study_names_a_long_interval_and_its_bound_in_days(tmp_path, capsys):
    """A 60 d interval past a 54 d horizon: every interval and horizon figure of a study, in the warning's prefix, the
    study line and the bound (its steps, 'about 54 d'), reads as format_duration writes it, not as 'interval
    5,184,000 s' or '4,665,594.1 s'. The warning is located at --intervals: on the command line of the command on the
    console, as the command's errors are (not `command line: --intervals: ...`), and without a command in study.json,
    which the library writes."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 1"))
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "60d", "--out",
                 str(tmp_path / "study"), "--quiet"]) == 0
    printed = capsys.readouterr()
    assert printed.err.startswith("warning: rate x 1, interval 60 d: command line: trainsim study: --intervals: 60 d: "
                                  "a checkpoint every 60 d is longer than run.horizon (54 d)")
    kept = json.loads((tmp_path / "study" / "study.json").read_text())["point_warnings"]
    assert [w["warning"] for w in kept] == [printed.err.split(": command line: trainsim study: ", 1)[1].strip()]
    assert kept[0]["warning"].startswith("--intervals: 60 d: a checkpoint every 60 d is longer than run.horizon")
    assert re.search(r"\(allowed: at most [0-9,]+ steps \(about 54 d\) for checkpoints", printed.err)
    assert printed.out.startswith("rate x 1 (MTBF 3.0 h, C 60 s): interval 60 d, ")


def test_a_warning_from_a_file_named_like_a_flag_stays_at_the_file(tmp_path, capsys, monkeypatch):
    """A warning is text by the time the command sees it, and one that began with '--' was taken for one located
    at a flag: a scenario file named `--job.yaml` gave 'warning: command line: trainsim study: --job.yaml:4:
    ...'. Only the flags the command was given count (its `--set`s and the study's options), so the warning
    names the file alone; one located at a `--set` is still on the command line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "--job.yaml").write_text(job_text("exponential", 1.0, "10 s").replace(
        "replications: 20", "replications: 1").replace("global_batch: 8}", "global_batch: 8, recompute: selective}"))
    selective = "training.recompute: selective recompute saves no memory under flash attention"
    assert main(["study", "checkpoint-interval", "--intervals", "10min", "--out", "study", "--quiet", "--",
                 "--job.yaml"]) == 0
    assert capsys.readouterr().err.startswith(f"warning: --job.yaml:4: {selective}")
    assert main(["validate", "--", "--job.yaml"]) == 0
    assert capsys.readouterr().err.startswith(f"warning: --job.yaml:4: {selective}")
    assert main(["validate", "--set", "run.seed=2", "--", "--job.yaml"]) == 0
    assert capsys.readouterr().err.startswith(f"warning: --job.yaml:4: {selective}")
    (tmp_path / "--job.yaml").write_text(job_text("exponential", 1.0, "10 s"))
    assert main(["validate", "--set", "training.recompute=selective", "--", "--job.yaml"]) == 0
    assert capsys.readouterr().err.startswith("warning: command line: trainsim validate: --set "
                                              "training.recompute=selective: selective recompute saves no memory")


def test_a_study_prints_its_steps_warnings_once_before_its_first_point(tmp_path, capsys, monkeypatch):
    """The out-of-memory job with a hybrid_shard warning (tests/test_reliability_job.py): its study prints both warnings
    a run of it prints, once, before the first point's job draws a failure; the points (two intervals, two
    replications each) change no step, so nothing more is said of it. The job's own warning (its restarts wait for
    hosts) comes once, after the points, for the curve."""
    before = stderr_before_each_draw(monkeypatch, capsys)
    scenario = tmp_path / "job.yaml"
    scenario.write_text(OOM_JOB)
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "10min,20min",
                 "--out", str(tmp_path / "study")]) == 0
    assert len(before) == 4 and before[1:] == ["", "", ""]
    after = capsys.readouterr().err.splitlines()
    assert len(after) == 1 and after[0].startswith("warning: rate x 1, interval ") and "restarts waited" in after[0]
    lines = before[0].splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"warning: {scenario}:")
    assert ": parallelism.fsdp: hybrid_shard " in lines[0] and lines[1].startswith("warning: OUT OF MEMORY")


def test_job_and_study_progress_count_replications_and_points(tmp_path):
    """A job is told of each replication as it ends and a study of each point, in order and to the total: the
    bar a terminal draws for minutes-long studies (docs/reliability.md) counts what the run really did. A job is
    told of none done once its healthy step is simulated, so its bar shows while the first replication meets most
    of its states (the 16,384-GPU throttling example's first took 10 minutes with nothing on the screen)."""
    from simulator.reliability.simulate import simulate_job
    from simulator.reliability.study import run_study

    text = job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 3")
    heard: list[tuple[int, int]] = []
    simulate_job(scenario_from_text(text, "job.yaml"), progress=lambda done, total: heard.append((done, total)))
    assert heard == [(0, 3), (1, 3), (2, 3), (3, 3)]
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)
    points: list[tuple[int, int]] = []
    run_study(scenario, [], [600.0, 1200.0], [0.5, 1.0, 2.0], progress=lambda done, total: points.append((done, total)))
    shown = [entry for index, entry in enumerate(points) if index == 0 or points[index - 1] != entry]
    assert shown == [(done, 6) for done in range(7)]  # each point's replications show the points done before it


def test_a_checkpoint_interval_study_without_intervals_runs_a_grid_around_daly(tmp_path, capsys):
    """Without --intervals a checkpoint-interval study runs the whole steps nearest Daly's interval (1,098.8 s for C =
    60 s, M = 3 h) times 2^(k/2), k = -4 to 4, each once, and prints them first: 891 to 14,258 steps of 0.3083 s. The
    fitted optimum lies inside the grid (1,071 s, 2.5% below Daly; 10 replications of 54 d)."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 10"))
    out = tmp_path / "study"
    assert main(["study", "checkpoint-interval", str(scenario), "--out", str(out), "--quiet"]) == 0
    curve = json.loads((out / "study.json").read_text())["curves"][0]
    daly = math.sqrt(2 * C * M) * (1 + math.sqrt(C / (2 * M)) / 3 + C / (18 * M)) - C
    assert curve["daly_interval_s"] == pytest.approx(daly, rel=1e-12)
    points = curve["points"]
    step = points[0]["interval_s"] / points[0]["interval_steps"]
    expected = sorted({round(daly * 2 ** (k / 2) / step) for k in range(-4, 5)})
    assert [point["interval_steps"] for point in points] == expected
    assert (expected[0], expected[-1]) == (891, 14258)
    assert [point["interval_s"] for point in points] == pytest.approx([n * step for n in expected], rel=1e-12)
    assert points[0]["interval_s"] < curve["fitted_optimum_s"] < points[-1]["interval_s"]
    assert curve["fitted_optimum_s"] == pytest.approx(daly, rel=0.05)
    printed = capsys.readouterr().out.splitlines()[0]
    shown = ", ".join(f"{n:,} ({seconds_alike(n * step)})" for n in expected)
    low, high = expected[0] * step / daly, expected[-1] * step / daly  # 0.25 and 4 to three digits
    assert printed == (f"intervals (no --intervals): 9 points from {low:.3g} to {high:.3g} times Daly's "
                       f"{seconds_alike(daly)}, in ratios of sqrt 2 rounded to whole steps of {seconds_alike(step)}: "
                       f"{shown} steps")
    assert (f"{low:.3g}", f"{high:.3g}") == ("0.25", "4")


def test_the_grid_lines_durations_keep_their_trailing_zeros():
    """The 2k job's grid line gives each interval's duration to four significant digits, trailing zeros kept:
    '182 (591.0 s)' beside '(295.5 s)' and '(837.8 s)', not '591 s'."""
    from simulator.cli import _grid_line
    from simulator.reliability.study import IntervalGrid

    grid = IntervalGrid(centre_s=591.0, step_s=3.2473, steps=(91, 182, 258), clamped=0, past_horizon=0)
    assert _grid_line(grid).endswith(": 91 (295.5 s), 182 (591.0 s), 258 (837.8 s) steps")
    assert "times Daly's 591.0 s, " in _grid_line(grid)


TINY_CHECKPOINT_JOB = (job_text("exponential", 1.0, "10 s").replace("size: 60 GB", "size: 8 KB")
                       .replace("horizon: 54 d, replications: 20", "horizon: 5 d, replications: 20"))
"""A job whose Daly interval is 1.35 steps: C = 8 KB / 1 GB/s = 8 us, M = 3 h, sqrt(2 C M) = 0.416 s, steps of
0.3086 s; over 5 days a checkpoint every step is 1.4 million events a replication."""


def test_a_default_grid_over_the_job_event_limit_is_refused_before_any_point_runs(tmp_path, capsys, monkeypatch):
    """The default grid of a job whose Daly interval is 1.35 steps is 1 to 5 steps: Daly x 1/4 and x 1/sqrt 2 round to
    no step (raised to one), x 1/2 to x 1 to one step too (4 points merged), and the line says so, with the range the
    steps really span over Daly (0.74 to 3.7 times, not 1/4 to 4). A checkpoint every step over 5 days is 40 failures
    + 432,000 s / (step + write) events a replication; at 20 replications only that point is over the 20 M limit, and
    the study is refused once, at run.replications, before any point runs, with the replications every point fits in
    (not "a longer checkpoint.interval", which the grid sets)."""
    import simulator.reliability.study as study
    from simulator.reliability.study import DEFAULT_GRID_FACTORS, default_grid

    scenario = tmp_path / "job.yaml"
    scenario.write_text(TINY_CHECKPOINT_JOB)
    grid = default_grid(scenario_from_text(TINY_CHECKPOINT_JOB))
    nearest = [round(grid.centre_s * factor / grid.step_s) for factor in DEFAULT_GRID_FACTORS]
    assert nearest == [0, 0, 1, 1, 1, 2, 3, 4, 5] and grid.steps == (1, 2, 3, 4, 5) and grid.clamped == 2

    def ran(*args, **kwargs):
        raise AssertionError("a point ran before the refusal")

    monkeypatch.setattr(study, "simulate_job", ran)
    assert main(["study", "checkpoint-interval", str(scenario), "--out", str(tmp_path / "study"), "--quiet"]) == 2
    printed = capsys.readouterr()
    shown = ", ".join(f"{n} ({seconds_alike(n * grid.step_s)})" for n in range(1, 6))
    low, high = grid.step_s / grid.centre_s, 5 * grid.step_s / grid.centre_s
    assert printed.out.splitlines() == [
        f"intervals (no --intervals): 5 points from {low:.3g} to {high:.3g} times Daly's "
        f"{seconds_alike(grid.centre_s)}, of 9 planned from 1/4 to 4 times it in ratios of sqrt 2 rounded to whole "
        f"steps of {seconds_alike(grid.step_s)} (4 points merged in rounding, 2 below half a step raised to one "
        f"step): {shown} steps"]
    events = [40 + 5 * 86400 / (n * grid.step_s + 8e-6) for n in range(1, 6)]  # each cycle with its 8 us write
    assert [20 * count > 20e6 for count in events] == [True, False, False, False, False]
    fits = int(20e6 // events[0])
    assert fits == 14
    assert printed.err == (
        f"error: {scenario}:6: run.replications: 1 of the study's 5 points would each handle more than 20,000,000 "
        f"events over 20 replications, the job-event limit (the most, a checkpoint every 1 step "
        f"({format_duration(grid.step_s)}) at rate x 1: ~{20 * events[0]:,.0f}) (allowed: at most 14 "
        "run.replications (every point then fits), or --intervals or --multipliers without the 1 point over it; "
        "or pass --force)\n")


def test_a_job_that_only_degrades_or_straggles_is_told_so_at_the_default_grid(tmp_path, capsys):
    """A job whose one failure class straggles expects failures, but none that interrupts it: no Daly interval
    to build the grid around, and the refusal says why ("expects no failure" was false) and how many it expects
    instead: 8 GPUs x 54 d x 24 h / (48 h + 6 h) = 192 (a throttled GPU is not throttled again meanwhile)."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace(
        "job_failure: {unit: host, effect: restart, mtbf: 3 h, distribution: exponential, shape: 1.0}",
        "throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 48 h, repair: 6 h}"))
    assert main(["study", "checkpoint-interval", str(scenario), "--out", str(tmp_path / "study")]) == 2
    assert capsys.readouterr().err.startswith(
        "error: command line: trainsim study: --intervals: the job expects no failure that interrupts the job (its "
        "classes only "
        "degrade or straggle: 192 expected over the horizon, slower steps but no restart), so it has no Daly "
        "interval to build the default grid around")


def test_the_study_help_gives_the_default_grid(capsys):
    assert main(["study", "--help"]) == 0
    assert "default 1/4 to 4 times the job's Daly interval" in " ".join(capsys.readouterr().out.split())


def test_a_study_keeps_the_jobs_waiting_for_hosts_figure_and_warns_once_per_curve(tmp_path, capsys, monkeypatch):
    """GPU 0 fails at 1 h and its host is back 93 min later, no spares: each point's restart waits 91 min after
    its 2 min detection, over 5% of the 30 h horizon. Every study row gives that wait, and the job's warning
    (which `trainsim run` prints, and a study dropped) comes once for the curve, naming its point."""
    import simulator.reliability.simulate as job_simulation
    from simulator.reliability.processes import Arrivals

    arrivals = Arrivals(np.array([3600.0]), np.array([0]), np.array([0]), np.array([93 * 60.0]))
    monkeypatch.setattr(job_simulation, "draw_arrivals", lambda rng, classes, counts, horizon: arrivals)
    scenario, out = tmp_path / "job.yaml", tmp_path / "study"
    scenario.write_text(WAIT_JOB)
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "10min,20min", "--out", str(out),
                 "--quiet"]) == 0
    curve = json.loads((out / "study.json").read_text())["curves"][0]
    assert [point["restart_waiting_for_hosts_s"] for point in curve["points"]] == pytest.approx([91 * 60.0] * 2,
                                                                                                 rel=1e-12)
    assert pd.read_csv(out / "study.csv")["restart_waiting_for_hosts_s"].tolist() == [5460.0, 5460.0]
    assert curve["warnings_interval_s"] == curve["points"][0]["interval_s"]
    assert len(curve["warnings"]) == 1 and curve["warnings"][0].startswith(
        "restarts waited 1.517 h per replication for spare or repaired hosts, 5.1% of the horizon")
    err = capsys.readouterr().err
    assert err.count("restarts waited") == 1
    assert (f"warning: rate x 1, interval {format_duration(curve['points'][0]['interval_s'])}: "
            f"{curve['warnings'][0]}\n") in err


def test_each_point_that_writes_no_checkpoint_warns_before_any_point_runs(tmp_path, capsys):
    """On a 1 h horizon, --intervals 10min,2h,3h at rates x 1 and x 2: the 2 h and 3 h points of both curves write no
    checkpoint. Each of the four warns once, named by its rate and interval, before the first point is simulated (not
    one point's warnings a curve, after all had run), and study.json keeps them in the study's order; the 10 min
    points do not warn."""
    from simulator.reliability.study import run_study

    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("horizon: 54 d, replications: 20",
                                                                      "horizon: 1 h, replications: 2"))
    heard: list[object] = []
    study = run_study(scenario, [], [600.0, 7200.0, 10800.0], [1.0, 2.0],
                      on_point_warnings=lambda warned: heard.append([w["warning"] for w in warned]),
                      progress=lambda done, total: heard.append(done))
    warned = study["point_warnings"]
    assert [(w["rate_multiplier"], round(w["interval_s"] / 3600, 2)) for w in warned] == [
        (1.0, 2.0), (1.0, 3.0), (2.0, 2.0), (2.0, 3.0)]
    assert all("is longer than run.horizon (1 h): the job writes none" in w["warning"] for w in warned)
    assert heard[0] == [w["warning"] for w in warned] and sorted(set(heard[1:])) == [*range(7)]
    assert heard[1:] == sorted(heard[1:])
    assert all(curve["warnings"] == [] for curve in study["curves"])
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "10min,2h,3h", "--multipliers",
                 "1,2", "--out", str(tmp_path / "study"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: ") == 4
    for w in warned:
        assert (f"warning: rate x {w['rate_multiplier']:g}, interval {format_duration(w['interval_s'])}: "
                "command line: trainsim study: --intervals: ") in err
    assert json.loads((tmp_path / "study" / "study.json").read_text())["point_warnings"] == warned


def test_the_default_grid_leaves_out_intervals_past_the_horizon(tmp_path, capsys):
    """Daly's interval for C = 60 s, M = 3 h is 1,098.8 s, so the default grid's x 4 (4,395 s) is past a 1 h
    horizon: it is left out (a point there would write no checkpoint, and is refused at --intervals), and the
    printed line says so; a 4 min horizon, shorter than Daly x 1/4 (274.7 s), has no point left and is refused
    at --intervals before any point runs."""
    from simulator.reliability.study import DEFAULT_GRID_FACTORS, default_grid

    text = job_text("exponential", 1.0, "10 s").replace("horizon: 54 d, replications: 20",
                                                        "horizon: 1 h, replications: 2")
    grid = default_grid(scenario_from_text(text))
    nearest = [round(grid.centre_s * factor / grid.step_s) for factor in DEFAULT_GRID_FACTORS]
    assert [n * grid.step_s > 3600 for n in nearest] == [False] * 8 + [True]
    assert grid.steps == tuple(nearest[:8]) and grid.past_horizon == 1
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)
    out = tmp_path / "study"
    assert main(["study", "checkpoint-interval", str(scenario), "--out", str(out), "--quiet"]) == 0
    assert "(1 past run.horizon left out)" in capsys.readouterr().out.splitlines()[0]
    points = json.loads((out / "study.json").read_text())["curves"][0]["points"]
    assert [point["interval_steps"] for point in points] == nearest[:8]
    assert main(["study", "checkpoint-interval", str(scenario), "--out", str(tmp_path / "short"), "--quiet",
                 "--set", "run.horizon=4 min"]) == 2
    assert capsys.readouterr().err == (
        f"error: command line: trainsim study: --intervals: Daly's interval ({format_duration(grid.centre_s)}) x 0.25 "
        "is longer than "
        "run.horizon (4 min): failures are too rare in the horizon for checkpoints to matter (allowed: durations "
        "under 4 min, e.g. 30 s,1 min,2 min)\n")
    assert not (tmp_path / "short").exists()


def test_the_default_grid_is_built_around_daly_at_the_study_s_multipliers(tmp_path, capsys):
    """C = 60 s, M = 3 h: at rate x 4 (M = 2,700 s) Daly's interval is 529.9 s, and --multipliers 4 builds the grid
    around it (the geometric mean of 2,8 too); the grid sat around x 1's 1,098.8 s, twice too long, whatever the
    multipliers, so a study of --multipliers 100 on a real job found its best point at the grid's shortest."""
    from simulator.reliability.stats import daly_interval
    from simulator.reliability.study import DEFAULT_GRID_FACTORS, default_grid

    text = job_text("exponential", 1.0, "10 s").replace("horizon: 54 d, replications: 20",
                                                        "horizon: 1 h, replications: 2")
    daly = daly_interval(60.0, 2700.0)
    assert daly == pytest.approx(529.9, abs=0.05)
    for multipliers in ([4.0], [2.0, 8.0]):
        grid = default_grid(scenario_from_text(text), multipliers=multipliers)
        assert grid.centre_s == pytest.approx(daly, rel=1e-12) and grid.rate_multiplier == pytest.approx(4.0)
        assert grid.steps == tuple(sorted({max(1, round(daly * f / grid.step_s)) for f in DEFAULT_GRID_FACTORS}))
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)
    assert main(["study", "checkpoint-interval", str(scenario), "--out", str(tmp_path / "study"), "--quiet",
                 "--multipliers", "4"]) == 0
    assert f"times Daly's {format_seconds(daly)} at rate x 4, " in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("expected, shown", [
    (4250.0, "4,250 degradations"), (216.0, "216 degradations"), (99.94, "99.9 degradations"),
    (2.0736, "2.07 degradations"), (1.0, "1 degradation"), (0.9996, "1 degradation"), (1.0004, "1 degradation"),
    (0.5, "0.5 degradations"), (6.48e299, "6.48e+299 degradations"),
])
def test_an_expected_count_is_whole_from_100_and_singular_for_one(expected, shown):
    """`expected_count` prints 4,250 expected degradations as a whole number (not '4.25e+03 degradations') and one in
    the singular (not '1 degradations')."""
    assert expected_count(expected, "degradation") == shown
    assert expected_count(expected) == shown.split()[0]


@pytest.mark.parametrize("expected, words", [
    (4250.0, "4,250 degradations or stragglers"), (1.0, "1 degradation or straggler")])
def test_a_study_line_counts_its_expected_slowdowns_in_words(expected, words):
    """The study line of a job whose failures only slow it, with the count as `expected_count` writes it."""
    from simulator.cli import _optimum_text
    from simulator.units import format_duration

    curve = {"young_interval_s": None, "expected_slowdowns": expected, "horizon_s": 86400.0}
    assert _optimum_text(curve, format_duration) == (
        f"no failure expected that interrupts the job, only {words} in 1 day (slower steps, no restart), so no "
        "Young or Daly interval")


@pytest.mark.parametrize("mtbf", [True, False], ids=["against-the-mtbf", "against-the-multiplier"])
def test_an_mtbf_charts_ticks_are_at_its_points(mtbf):
    """`study mtbf --multipliers 0.5,1,2` of a 2 h job puts points at 1, 2 and 4 h: the ticks are the points' own MTBFs
    (or multipliers), each labelled, so the 4 h point can be read off the axis (a fixed 1-2-5 locator labels 1 and 2
    only)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from simulator.reliability.plots import goodput_figure

    def curve(rate: float) -> dict:
        point = {"interval_s": 600.0, "ettr": 0.9, "ettr_ci95_low": 0.89, "ettr_ci95_high": 0.91,
                 "goodput_tokens_per_s": 1e6}
        return {"rate_multiplier": rate, "mtbf_s": 7200.0 / rate if mtbf else None, "points": [point],
                "young_interval_s": None, "daly_interval_s": None, "best_interval_s": 600.0, "best_ettr": 0.9}

    figure = goodput_figure({"scenario": "job.yaml", "curves": [curve(rate) for rate in (0.5, 1, 2)]})
    FigureCanvasAgg(figure).draw()
    labels = [tick.get_text() for tick in figure.axes[1].get_xticklabels() if tick.get_text()]
    assert labels == (["1", "2", "4"] if mtbf else ["0.5", "1", "2"])


@pytest.mark.parametrize("study, sets, options", [
    ("checkpoint-interval", "checkpoint.interval=5min", ["--intervals", "5min,10min"]),
    ("checkpoint-interval", "checkpoint.interval=5min", []),
    ("memory-interval", "checkpoint.memory.interval=1min", []),
    ("mtbf", "checkpoint.interval=5min", ["--intervals", "10min"]),
])
def test_a_set_of_the_interval_the_study_varies_is_refused_naming_intervals(study, sets, options, monkeypatch,
                                                                            capsys, tmp_path):
    """A `--set` of the interval the study sets at every point (`checkpoint.interval=5min`) is refused naming
    `--intervals`, not written over at every point and kept in study.json's overrides as if it applied."""
    import simulator.reliability.study as module

    monkeypatch.setattr(module, "prepare_job", lambda *args, **kwargs: pytest.fail("prepared a job"))
    field = sets.split("=")[0]
    assert main(["study", study, "llama3-70b-2k-job", "--set", sets, *options, "--out", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == (f"error: command line: trainsim study: --set {sets}: the {study} study sets "
                                       f"{field} at every point (allowed: a field the study does not vary; for "
                                       f"{field}: --intervals)\n")


def test_run_study_refuses_a_set_of_the_interval_its_points_set():
    """The library's study, called without the command line, refuses as `trainsim study` does: its points
    would write over the `--set` and study.json keep it as applied."""
    from simulator.reliability.study import run_study

    with pytest.raises(InputError, match=r"the checkpoint-interval study sets checkpoint\.interval at every point"):
        run_study("llama3-70b-2k-job", ["checkpoint.interval=5min"], [300.0, 600.0], [1.0])


def test_an_mtbf_study_without_intervals_runs_at_the_interval_a_set_gives(tmp_path):
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 1"))
    out = tmp_path / "mtbf"
    assert main(["study", "mtbf", str(scenario), "--set", "checkpoint.interval=25min", "--multipliers", "1",
                 "--out", str(out), "--quiet"]) == 0
    curve = json.loads((out / "study.json").read_text())["curves"][0]
    assert curve["best_interval_s"] == pytest.approx(1500.0, abs=0.2)  # 4,860 steps of 0.309 s


def test_a_study_of_two_replications_says_its_interval_is_too_few_to_read(tmp_path, capsys):
    """With 2 replications Student's t of one degree of freedom (12.7) spans 'ETTR 79.54%, 95%: 0.00% to
    100.00%': the line says the replications are too few for an interval worth reading; with 3 it is read as it is."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 2"))
    assert main(["study", "mtbf", str(scenario), "--intervals", "20min", "--multipliers", "1",
                 "--out", str(tmp_path / "two")]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert re.search(r", 95%: [0-9.]+% to [0-9.]+%, 2 replications: too few for an interval worth reading\); ", line)
    assert main(["study", "mtbf", str(scenario), "--intervals", "20min", "--multipliers", "1", "--set",
                 "run.replications=3", "--out", str(tmp_path / "three")]) == 0
    assert "too few" not in capsys.readouterr().out


def test_the_best_point_is_compared_with_its_neighbours_replication_by_replication():
    """Every point runs the same seeds, so its replications pair with its neighbours': a neighbour 0.1% below in
    every replication is told apart although the points' own 95% intervals (replications spread by 3%) overlap,
    and one whose differences straddle 0 is not. The study line names the latter with its paired interval and
    the fitted optimum beside it."""
    from simulator.cli import _study_line
    from simulator.reliability.study import StudyPoint, paired_differences

    best = (0.90, 0.95, 0.92, 0.97)
    below = tuple(value - 0.001 for value in best)
    straddling = (0.901, 0.949, 0.9205, 0.9695)
    points = [StudyPoint(100.0, 1.0, {}, None, ettrs=below), StudyPoint(200.0, 1.0, {}, None, ettrs=best),
              StudyPoint(400.0, 1.0, {}, None, ettrs=straddling)]
    shorter, longer = paired_differences(points, points[1])
    assert shorter["interval_s"] == 100.0 and shorter["told_apart"]
    assert shorter["ettr_difference"] == pytest.approx(0.001) and shorter["ci95_low"] == pytest.approx(0.001)
    assert longer["interval_s"] == 400.0 and not longer["told_apart"]
    assert longer["ci95_low"] < 0 < longer["ci95_high"]
    assert paired_differences([StudyPoint(1.0, 1.0, {}, None, ettrs=(0.9,)), StudyPoint(2.0, 1.0, {}, None,
                                                                                        ettrs=(0.8,))],
                              StudyPoint(1.0, 1.0, {}, None, ettrs=(0.9,))) == []
    row = {"interval_s": 200.0, "interval_steps": 20, "ettr": 0.935, "ettr_ci95_low": 0.90, "ettr_ci95_high": 0.97}
    curve = {"rate_multiplier": 1.0, "mtbf_s": None, "replications": 4, "best_interval_s": 200.0, "best_ettr": 0.935,
             "flat": False, "points": [{**row, "interval_s": 100.0}, row, {**row, "interval_s": 400.0}],
             "young_interval_s": None, "expected_slowdowns": 0, "write_floor_steps": 0, "fitted_optimum_s": 231.0,
             "best_against_neighbours": [shorter, longer]}
    line = _study_line(curve)
    assert (f"best interval 3.333 min, 20 steps (ETTR 93.50%), not told apart from 6.667 min "
            f"({100 * longer['ci95_low']:+.3f} to {100 * longer['ci95_high']:+.3f} pp) by the paired 95% interval of "
            "its ETTR less theirs; read the fitted optimum, 3.850 min;") in line


def test_each_replications_ettr_is_written_so_that_runs_pair(tmp_path):
    """job_summary.json's `ettr.by_replication` and each study point's `ettrs` in study.json hold every
    replication's ETTR in order, so that two runs of the same seeds pair replication by replication; study.csv
    keeps one scalar per cell."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(job_text("exponential", 1.0, "10 s").replace("replications: 20", "replications: 3"))
    out = tmp_path / "study"
    assert main(["study", "mtbf", str(scenario), "--intervals", "20min,40min", "--multipliers", "1", "--out",
                 str(out), "--quiet"]) == 0
    point = json.loads((out / "study.json").read_text())["curves"][0]["points"][0]
    assert len(point["ettrs"]) == 3 and len(set(point["ettrs"])) == 3
    assert point["ettr"] == pytest.approx(sum(point["ettrs"]) / 3, rel=1e-12)
    assert "ettrs" not in pd.read_csv(out / "study.csv").columns
    assert main(["run", str(scenario), "--set", "checkpoint.interval=20min", "--out", str(tmp_path / "job"),
                 "--quiet"]) == 0
    ettr = json.loads((tmp_path / "job" / "job_summary.json").read_text())["ettr"]
    assert ettr["by_replication"] == point["ettrs"]
    assert ettr["mean"] == pytest.approx(sum(ettr["by_replication"]) / 3, rel=1e-12)


def test_a_scenario_wide_warning_is_given_once_of_no_point(tmp_path, capsys):
    """A failure preset measured on another system is the scenario's, not one point's: a study prints it once
    without a point's label and study.json keeps it as `scenario_warnings`, out of `point_warnings`."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("  components:", "  preset: llama3\n  components:").replace(
        "  nodes: 2\n", "  nodes: 2\n  node: {gpu_model: a100-80gb}\n").replace("horizon: 2 d", "horizon: 2 h"))
    out = tmp_path / "study"
    assert main(["study", "mtbf", str(scenario), "--intervals", "10min,20min", "--multipliers", "1,2",
                 "--set", "run.replications=1", "--out", str(out), "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "faults.preset" in line]
    assert len(warned) == 1 and warned[0].startswith(f"warning: {scenario}:15: faults.preset: the llama3 preset's")
    study = json.loads((out / "study.json").read_text())
    assert [warning.split(": ")[1] for warning in study["scenario_warnings"]] == ["faults.preset"]
    assert not any("faults.preset" in point["warning"] for point in study["point_warnings"])


def test_the_study_prints_every_interval_tried_with_its_ettr_goodput_and_resources():
    """Llama 3 70B on 2,048 H100 (usertest67): Young's 4.944 min, 10 min and 30 min, 5 replications. The line
    named the best alone; the table gives each interval with its steps (295.5 s / 3.247 s = 91), ETTR with its
    95% interval, goodput and, where study.csv has them, GPU-hours and cost per million tokens, to four
    significant digits: every GPU held, the job's 2,112 (its 8 spare hosts' included), x 1 h over 3,600 s x
    1,271,294 tokens/s = 0.4615 GPU-h per million tokens, at 2.50 a GPU-hour 1.154."""
    from simulator.cli import _study_table

    def point(interval_s, steps, ettr, low, high, tokens, tokens_low, tokens_high, **resources):
        return {"interval_s": interval_s, "interval_steps": steps, "ettr": ettr, "ettr_ci95_low": low,
                "ettr_ci95_high": high, "goodput_tokens_per_s": tokens, "goodput_tokens_per_s_ci95_low": tokens_low,
                "goodput_tokens_per_s_ci95_high": tokens_high, **resources}

    gpu_hours = 2112 / 3600 / 1271294 * 1e6
    points = [point(1799.0, 554, 0.977036, 0.9745, 0.9796, 1262000, 1259000, 1265000),
              point(295.511, 91, 0.984278, 0.982079, 0.986476, 1271294, 1268454, 1274134,
                    gpu_hours_per_million_tokens=gpu_hours, cost_per_million_tokens=2.5 * gpu_hours),
              point(600.763, 185, 0.983539, 0.981312, 0.985766, 1270340, 1267460, 1273220)]
    assert gpu_hours == pytest.approx(0.4615, abs=5e-5)
    assert _study_table({"points": points}, "USD") == [
        " interval  steps  ETTR (95% interval)        goodput tokens/s (95% interval)     GPU-h per 1M tokens  "
        "cost per 1M tokens (USD)",
        "4.925 min     91  98.43% (98.21% to 98.65%)  1,271,294 (1,268,454 to 1,274,134)  0.4615               1.154",
        "10.01 min    185  98.35% (98.13% to 98.58%)  1,270,340 (1,267,460 to 1,273,220)",
        "29.98 min    554  97.70% (97.45% to 97.96%)  1,262,000 (1,259,000 to 1,265,000)"]
    without = [{key: value for key, value in entry.items() if not key.endswith("per_million_tokens")}
               for entry in points]
    assert _study_table({"points": without}, "USD")[0].endswith("goodput tokens/s (95% interval)")
    assert _study_table({"points": points[:1]}, "USD") == []
