"""Gantt chart and memory timeline of a simulated step, checked against pipeline closed forms: the busy time of
a stage is m (F + B), the bubble is (p - 1) / (m + p - 1) for 1F1B and GPipe, and the activation peak of
stage 0 is p micro-batches for 1F1B and m for GPipe; plus the `trainsim plot` command."""

from __future__ import annotations

import json
from typing import get_args

import matplotlib
from shared import DATA, SCENARIOS

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.cli import main
from simulator.errors import InputError
from simulator.program.ops import Category
from simulator.report.gantt import BAR_CLASSES, OP_BARS, PASS_BARS, Bar, _bar_class, _legend, gantt_figure
from simulator.report.layout_names import parallel_degrees
from simulator.report.memory_timeline import GIB, memory_figure, memory_timeline
from simulator.report.outputs import simulated_ranks
from simulator.report.run_folder import MANIFEST, file_digest

STAGES, MICROBATCHES = 4, 8
FORWARD_MS, BACKWARD_MS = 1.0, 2.0
SYNTHETIC = f"""
cluster: {{topology: dgx-h100}}
model: {{synthetic: {{stages: {STAGES}, forward: {FORWARD_MS} ms, backward: {BACKWARD_MS} ms}}}}
training: {{microbatches: {MICROBATCHES}}}
parallelism: {{pp: {STAGES}, dp: 2, pipeline: {{schedule: {{schedule}}}}}}
"""
SMALL_MODEL = f"""
cluster: {{topology: dgx-h100}}
model: {{layers: 8, hidden: 1024, heads: 8, vocab: 32000}}
training: {{seq_len: 1024, micro_batch: 1, microbatches: {MICROBATCHES}}}
parallelism: {{tp: 2, pp: {STAGES}, dp: 1, pipeline: {{schedule: {{schedule}}}}}}
"""
REL = 1e-9
"""Float tolerance: every compared number is a sum of the same simulated durations."""


def _run(tmp_path, template: str, schedule: str):
    path = tmp_path / f"{schedule.split(',')[0]}.yaml"
    path.write_text(template.replace("{schedule}", schedule))
    return simulator.simulate(simulator.load_scenario(str(path)))


@pytest.fixture(scope="module")
def synthetic_1f1b(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("syn"), SYNTHETIC, "1f1b")


def _bars(figure, kind: str, row: int) -> np.ndarray:
    """Widths (in the axis unit) of the bars of one kind in one row, from the broken_barh collection."""
    widths = []
    for collection in figure.axes[0].collections:
        if collection.get_gid() == f"{kind}:{row}":
            widths += [np.ptp(path.vertices[:, 0]) for path in collection.get_paths()]
    return np.array(widths)


def test_gantt_has_one_row_per_stage_busy_for_m_times_f_plus_b(synthetic_1f1b):
    figure = gantt_figure(synthetic_1f1b.timeline, synthetic_1f1b.summary)
    ax = figure.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"stage {s} (rank {s})" for s in range(STAGES)]
    assert ax.get_xlabel() == "time (ms)"
    for row in range(STAGES):
        forward, backward = _bars(figure, "forward", row), _bars(figure, "backward", row)
        assert len(forward) == len(backward) == MICROBATCHES
        busy = forward.sum() + backward.sum()
        assert busy == pytest.approx(MICROBATCHES * (FORWARD_MS + BACKWARD_MS), rel=REL)


@pytest.mark.parametrize("window_ms, legend", [
    (None, ["forward (F)", "full backward (BW)", "idle (bubble)"]),
    # 1F1B, p = 4, F = 1 ms, B = 2 ms: stage 0's first backward starts after p forwards and p - 1 hand-offs
    # down and back (stage 3's F0 ends at 4 ms, its B0 at 6 ms, stage 0's B0 starts at 4 F + 3 B = 10 ms)
    ((0.0, 2.0), ["forward (F)", "idle (bubble)"]),
    # the last 3 ms, (m + p - 1)(F + B) = 33 ms: the stages drain with backward passes only
    ((30.0, 33.0), ["full backward (BW)", "idle (bubble)"]),
])
def test_gantt_legend_lists_what_the_window_shows(synthetic_1f1b, window_ms, legend):
    """`plot gantt --window 0:2ms` listed backward passes in its legend, drawn only outside the window."""
    window = None if window_ms is None else (window_ms[0] / 1e3, window_ms[1] / 1e3)
    figure = gantt_figure(synthetic_1f1b.timeline, synthetic_1f1b.summary, window=window)
    assert [text.get_text() for text in figure.legends[0].get_texts()] == legend


def test_gantt_idle_share_is_the_bubble_fraction(synthetic_1f1b):
    summary = synthetic_1f1b.summary
    figure = gantt_figure(synthetic_1f1b.timeline, summary)
    window_ms = (MICROBATCHES + STAGES - 1) * (FORWARD_MS + BACKWARD_MS)
    idle_share = sum(_bars(figure, "idle", row).sum() for row in range(STAGES)) / (STAGES * window_ms)
    assert idle_share == pytest.approx(summary["bubble_fraction"], rel=REL)
    assert idle_share == pytest.approx((STAGES - 1) / (MICROBATCHES + STAGES - 1), rel=REL)
    assert f"bubble {100 * summary['bubble_fraction']:.1f}%" in figure.axes[0].get_title()
    # Titled by the scenario's file name: the summary's path (absolute for a bundled scenario run by name)
    # filled half the title.
    assert figure.axes[0].get_title().startswith("1f1b.yaml: TP1 CP1 PP4 DP2 DDP, ")
    assert memory_figure(synthetic_1f1b.timeline, summary).axes[0].get_title().startswith("1f1b.yaml: memory")


@pytest.mark.parametrize("layout,moe,degrees", [
    ({"tp": 2, "cp": 1, "pp": 1, "dp": 16}, {"ep": 8}, "TP2 CP1 PP1 DP16 EP8"),
    ({"tp": 8, "cp": 4, "pp": 2, "dp": 1}, None, "TP8 CP4 PP2 DP1"),
    ({"tp": 1, "cp": 1, "pp": 1, "dp": 1}, {"ep": 1}, "TP1 CP1 PP1 DP1"),
])
def test_gantt_title_names_the_layout_as_the_console_does(layout, moe, degrees):
    """The title names the layout as the run's console line does ('TP2 CP1 PP1 DP16 EP8'), both from parallel_degrees,
    EP included (read 'tp=2 cp=1 pp=1 dp=16', Mixtral's TP2 EP8 DP16 would look as if its experts were replicated)."""
    from simulator.console.report import _layout_line

    summary = {"layout": layout, **({"moe": moe} if moe else {})}
    assert parallel_degrees(summary) == degrees
    assert f", {degrees}, " in _layout_line(summary)


@pytest.mark.parametrize("sharding,name", [({"zero_stage": 3, "fsdp": "full_shard"}, "FSDP full_shard (ZeRO-3)"),
                                           ({"zero_stage": 1}, "ZeRO-1")])
def test_gantt_title_names_the_sharding_as_the_console_does(synthetic_1f1b, sharding, name):
    """The Gantt title names an FSDP full_shard run's sharding ('FSDP full_shard (ZeRO-3)', which explains the
    gathers the chart draws) as its console line does, not the bare 'TP1 CP1 PP1 DP8': both name the layout by one
    function."""
    from simulator.console.report import _layout_line

    summary = {**synthetic_1f1b.summary, "layout": {**synthetic_1f1b.summary["layout"], **sharding}}
    title = gantt_figure(synthetic_1f1b.timeline, summary).axes[0].get_title()
    assert title.startswith(f"1f1b.yaml: TP1 CP1 PP4 DP2 {name}, ")
    assert f", TP1 CP1 PP4 DP2 {name}, " in _layout_line(summary)


@pytest.mark.parametrize("pipeline,pp,named", [
    ("{schedule: dualpipev, virtual_stages: 2}", STAGES, "dualpipev v2"),
    ("{schedule: custom, table: order.csv}", STAGES, "custom: order.csv"),
    ("{schedule: 1f1b}", 1, "1f1b"),
    ("{virtual_stages: 1}", 1, None),
])
def test_the_schedule_is_named_in_the_summary_console_line_and_gantt_title(tmp_path, pipeline, pp, named):
    """A dualpipev run made with --set over a zb-h1 scenario named its schedule nowhere: summary.json's layout, the
    run's first line and the Gantt title (which names the scenario file) left it out. They name it, with its chunks
    per rank where above 1, or the custom table's file, wherever the step is pipelined or the scenario names a
    schedule."""
    from simulator.console.report import _layout_line
    from simulator.schedules import build_schedule, schedule_to_csv

    (tmp_path / "order.csv").write_text(schedule_to_csv(build_schedule("1f1b", STAGES, MICROBATCHES)))
    path = tmp_path / "run.yaml"
    dp = 8 // pp
    path.write_text(SYNTHETIC.replace(f"stages: {STAGES}", f"stages: {pp}")
                    .replace(f"pp: {STAGES}, dp: 2", f"pp: {pp}, dp: {dp}").replace("{schedule: {schedule}}", pipeline))
    result = simulator.simulate(simulator.load_scenario(str(path)))
    title = gantt_figure(result.timeline, result.summary).axes[0].get_title()
    layout = f"TP1 CP1 PP{pp} DP{dp} DDP"
    if named is None:
        assert "schedule" not in result.summary["layout"]
        assert f"{layout}, {MICROBATCHES} micro-batches per step" in _layout_line(result.summary)
        return
    assert result.summary["layout"]["schedule"] == named.split(" v")[0]
    assert f"{layout}, {named}, {MICROBATCHES} micro-batches per step" in _layout_line(result.summary)
    assert title.startswith(f"run.yaml: {layout}, {named}, {MICROBATCHES} micro-batches — ")


def test_memory_title_says_fsdp_buffers_are_drawn_from_the_start(synthetic_1f1b):
    """llama3-70b-torchtitan-pp-fsdp's curves hold FSDP's 24.9 GiB of unsharded parameters and gradient
    accumulators from t = 0, before any gather or gradient: the title says so where the run shards by FSDP (or
    ZeRO-3) and its drawn stages hold buffers, and not otherwise."""
    summary = synthetic_1f1b.summary
    stages = [{**entry, "buffers_gib": 24.889 if int(entry["stage"]) == 0 else 1.0}
              for entry in summary["memory_per_stage"]]
    fsdp = {**summary, "memory_per_stage": stages,
            "layout": {**summary["layout"], "zero_stage": 3, "fsdp": "full_shard"}}
    note = "working buffers, up to 24.9 GiB, drawn from t = 0, though allocated at first use"
    assert note in memory_figure(synthetic_1f1b.timeline, fsdp).axes[0].get_title()
    assert "up to 1.0 GiB" in memory_figure(synthetic_1f1b.timeline, fsdp, ranks=[3]).axes[0].get_title()
    ddp = {**fsdp, "layout": {**summary["layout"], "zero_stage": 0}}
    assert "buffers" not in memory_figure(synthetic_1f1b.timeline, ddp).axes[0].get_title()


def test_gantt_by_rank_and_row_limit(synthetic_1f1b):
    figure = gantt_figure(synthetic_1f1b.timeline, synthetic_1f1b.summary, by="rank", max_rows=3)
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels == ["rank 0 (stage 0)", "rank 1 (stage 1)", "rank 2 (stage 2)"]
    simulated = simulated_ranks(synthetic_1f1b.timeline)
    assert len(simulated) == STAGES  # folding simulates one rank per stage
    assert f"first 3 of {len(simulated)} rows" in figure.axes[0].get_title()
    chosen = gantt_figure(synthetic_1f1b.timeline, synthetic_1f1b.summary, by="rank", ranks=[simulated[-1]])
    label = f"rank {simulated[-1]} (stage {STAGES - 1})"
    assert [t.get_text() for t in chosen.axes[0].get_yticklabels()] == [label]


@pytest.fixture(scope="module")
def small_model_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    return {schedule: _run(folder, SMALL_MODEL, schedule)
            for schedule in ("1f1b", "gpipe", "interleaved, virtual_stages: 2")}


def test_gantt_merges_the_ops_of_one_action(small_model_runs):
    """With TP, a forward of one micro-batch is many kernels and all-reduces: it must read as one bar."""
    run = small_model_runs["1f1b"]
    figure = gantt_figure(run.timeline, run.summary)
    for row in range(STAGES):
        assert len(_bars(figure, "forward", row)) == len(_bars(figure, "backward", row)) == MICROBATCHES
        assert len(_bars(figure, "tp_cp", row)) > MICROBATCHES
    numbers = sorted(int(t.get_text()) for t in figure.axes[0].texts if t.get_position()[1] < 0.5)
    assert numbers == sorted(list(range(MICROBATCHES)) * 2)


def test_gantt_draws_tp_collectives_off_the_compute_stream_as_overlapped(tmp_path):
    """With `tp_comm_overlap` the TP collectives run on their own stream beside the GEMMs: each TP op is one bar of the
    kind its stream says, blocking on the compute stream, overlapped (side lane) off it, never red and "TP/CP
    collective (blocking)" for traffic that is hidden."""
    overlapped = SMALL_MODEL.replace("dp: 1,", "dp: 1, sequence_parallel: true, tp_comm_overlap: true,")
    run = _run(tmp_path, overlapped, "1f1b")
    figure = gantt_figure(run.timeline, run.summary)
    tp = run.timeline[(run.timeline["category"] == "tp") & (run.timeline["kind"] != "flow")]
    for row in range(STAGES):
        ops = tp[tp["rank"] == run.summary["layout"]["tp"] * row]
        blocking = int((ops["stream"] == "compute").sum())
        assert len(_bars(figure, "tp_cp", row)) == blocking
        assert len(_bars(figure, "tp_cp_overlapped", row)) == len(ops) - blocking > 0
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "TP/CP collective (overlapped)" in legend


def test_gantt_draws_the_expert_all_to_alls_as_their_own_kind(tmp_path):
    """2 MoE layers x 2 micro-batches x (dispatch and combine, forward and backward) = 16 EP all-to-alls on rank
    0, each one bar as long as its op, labelled as EP in the legend, not "other communication"."""
    moe = ("cluster: {topology: dgx-h100}\nmodel: {preset: mixtral-8x7b, layers: 2}\n"
           "training: {seq_len: 1024, microbatches: 2}\nparallelism: {ep: 8, zero: 1}\n")
    run = _run(tmp_path, moe, "1f1b")
    figure = gantt_figure(run.timeline, run.summary)
    ops = run.timeline[(run.timeline["rank"] == 0) & (run.timeline["kind"] == "collective")
                       & (run.timeline["category"] == "ep")]
    assert len(ops) == 16
    assert sorted(_bars(figure, "ep", 0)) == pytest.approx(sorted((ops["end_s"] - ops["start_s"]) * 1e3), rel=REL)
    assert len(_bars(figure, "other_comm", 0)) == 0
    assert "EP all-to-all" in [text.get_text() for text in figure.legends[0].get_texts()]


def _static_and_unit(summary: dict, stage: int) -> tuple[float, float]:
    entry = summary["memory_per_stage"][stage]
    static = sum(entry[f"{part}_gib"] for part in ("params", "grads", "optimizer", "buffers")) * GIB
    return static, entry["activation_per_microbatch_gib"] * GIB


@pytest.mark.parametrize("schedule, in_flight", [("1f1b", STAGES), ("gpipe", MICROBATCHES)])
def test_memory_peak_of_stage_0(small_model_runs, schedule, in_flight):
    run = small_model_runs[schedule]
    static, activation = _static_and_unit(run.summary, 0)
    assert activation > 0
    curve = memory_timeline(run.timeline, run.summary, rank=0)
    assert curve["bytes"].max() == pytest.approx(static + in_flight * activation, rel=REL)
    assert curve["bytes"].iloc[0] == pytest.approx(static + activation, rel=REL)
    assert curve["bytes"].iloc[-1] == pytest.approx(static, rel=REL)


def test_memory_peak_matches_the_summary_for_every_stage(small_model_runs):
    """The summary's per-stage total counts the schedule's peak in-flight chunks; with v = 2 the timeline
    counts merged forward/backward actions at half a micro-batch each and must reach the same peak."""
    for run in small_model_runs.values():
        for stage, rank in enumerate(range(0, 2 * STAGES, 2)):
            curve = memory_timeline(run.timeline, run.summary, rank)
            total = run.summary["memory_per_stage"][stage]["total_gib"] * GIB
            assert curve["bytes"].max() == pytest.approx(total, rel=REL)


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_memory_with_interleaving_and_recompute_returns_to_the_static_state(tmp_path, recompute):
    """Recompute ops split a chunk's backward into many actions; each took out the chunk's whole activations,
    so the curve of Megatron-LM's 76.1B row (v = 3, full recompute) fell to -259 GiB. Every stage must peak at
    the summary's total and end the step holding its static state alone, never less."""
    template = SMALL_MODEL.replace("micro_batch: 1", f"micro_batch: 1, recompute: {recompute}")
    run = _run(tmp_path, template, "interleaved, virtual_stages: 2")
    for stage, rank in enumerate(range(0, 2 * STAGES, 2)):
        static, _ = _static_and_unit(run.summary, stage)
        curve = memory_timeline(run.timeline, run.summary, rank)
        assert curve["bytes"].max() == pytest.approx(run.summary["memory_per_stage"][stage]["total_gib"] * GIB,
                                                     rel=REL)
        assert curve["bytes"].min() == pytest.approx(static, rel=REL)
        assert curve["bytes"].iloc[-1] == pytest.approx(static, rel=REL)


def test_memory_of_a_folded_rank_is_refused(small_model_runs):
    """Rank 1 (TP rank 1 of stage 0) is folded into rank 0: its memory chart is refused, not stage 0's static memory
    alone drawn and labelled as its peak."""
    run = small_model_runs["1f1b"]
    allowed = "(allowed: a simulated rank: 0, 2, 4, 6; or rerun with run.fold: false)"
    with pytest.raises(InputError) as refused:
        memory_timeline(run.timeline, run.summary, 1)
    assert str(refused.value) == ("<input>: rank: rank 1 has no ops in this run's timeline (folded into an "
                                  f"equivalent rank, or not kept by run.timeline) {allowed}")
    with pytest.raises(InputError) as refused:
        memory_figure(run.timeline, run.summary, ranks=[0, 1])
    assert refused.value.field == "ranks" and str(refused.value).endswith(allowed)


def test_memory_figure_draws_each_stage_and_the_capacity(small_model_runs):
    run = small_model_runs["1f1b"]
    figure = memory_figure(run.timeline, run.summary)
    lines = figure.axes[0].get_lines()
    assert len(lines) == STAGES + 1
    capacity = lines[-1].get_ydata()
    assert capacity[0] == pytest.approx(run.summary["memory_capacity_gib"], rel=REL)
    # The legend sits beside the axes, clear of the curves and of the title (inside, at the lower right, it
    # covered the later stages' curves).
    figure.draw_without_rendering()
    (legend,) = figure.legends
    box = legend.get_window_extent()
    assert not box.overlaps(figure.axes[0].get_window_extent())
    assert not box.overlaps(figure.axes[0].title.get_window_extent())


def test_memory_figure_of_sixteen_stages_gives_each_its_own_colour(tmp_path):
    """16 pipeline stages, 16 curves: each has a colour of its own, so the legend tells them apart (a ten-colour cycle
    would draw stage 10 in stage 0's blue); up to ten keep the cycle."""
    path = tmp_path / "p16.yaml"
    path.write_text("""
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {synthetic: {stages: 16, forward: 1 ms, backward: 2 ms}}
training: {microbatches: 16}
parallelism: {pp: 16, pipeline: {schedule: 1f1b}}
""")
    run = simulator.simulate(simulator.load_scenario(str(path)))
    colours = [matplotlib.colors.to_hex(line.get_color()) for line in memory_figure(
        run.timeline, run.summary).axes[0].get_lines()[:-1]]
    assert len(colours) == 16 == len(set(colours))
    few = memory_figure(run.timeline, run.summary, ranks=[0, 5]).axes[0].get_lines()[:-1]
    assert [line.get_color() for line in few] == ["C0", "C1"]


def test_cli_plot_writes_pngs_and_rejects_a_bad_outdir(synthetic_1f1b, tmp_path, capsys):
    out = tmp_path / "run"
    scenario = tmp_path / "1f1b.yaml"
    scenario.write_text(SYNTHETIC.replace("{schedule}", "1f1b"))
    assert main(["run", str(scenario), "--out", str(out)]) == 0
    modelled, scenario = tmp_path / "modelled", tmp_path / "small.yaml"
    scenario.write_text(SMALL_MODEL.replace("{schedule}", "1f1b"))
    assert main(["run", str(scenario), "--out", str(modelled), "--quiet"]) == 0
    for chart, folder, extra in (("gantt", out, ["--by", "rank"]), ("memory", modelled, [])):
        image = tmp_path / f"{chart}.png"
        assert main(["plot", chart, str(folder), "-o", str(image), *extra]) == 0
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["plot", "gantt", str(tmp_path / "missing")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "OUTDIR" in error
    (modelled / "timeline.parquet").unlink()
    assert main(["plot", "memory", str(modelled)]) == 2
    assert "timeline.parquet" in capsys.readouterr().err


NOT_A_STEP = [
    ("trace-allreduce-2rank.yaml", [],
     "a replayed trace's run has no pipeline layout or memory to plot (its timeline is in trace.json, for Perfetto) "
     "(allowed: the folder of a modelled training step (a scenario with a model))"),
    ("parameter-server-vs-allreduce.yaml", ["--set", "ps.iterations=1"],
     "a parameter-server run has no pipeline stages or memory timeline to plot (its workers and server GPUs are in "
     "trace.json, for Perfetto) (allowed: the folder of a training step of collectives (not parallelism.strategy: "
     "parameter_server))"),
]
"""Runs gantt and memory cannot draw, with their refusals, each naming what the run lacks: a replayed trace's
folder and a parameter-server run (a training-step run, so not refused as 'not a training-step run?')."""


@pytest.mark.parametrize("chart", ["gantt", "memory"])
@pytest.mark.parametrize("scenario, extra, refusal", NOT_A_STEP)
def test_cli_plot_names_a_run_it_cannot_draw_as_what_it_is(tmp_path, capsys, chart, scenario, extra, refusal):
    """The refusal says what the run is and where its timeline is."""
    path = SCENARIOS / scenario
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet", *extra]) == 0
    capsys.readouterr()
    assert main(["plot", chart, str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'run'}: OUTDIR: {refusal}\n"


@pytest.mark.parametrize("ranks, error", [
    ("4", "--ranks: rank 4 has no ops in this run's timeline (folded into an equivalent rank, or not kept by "
          "run.timeline) (allowed: a simulated rank: 0, 1, 2, 3; or rerun with run.fold: false)"),
    ("3-1", "--ranks: '3-1' is a range from high to low (allowed: e.g. 0,2,4 or 0-7, each range from low to high)"),
    ("1-2-3", "--ranks: '1-2-3' is not a rank list (allowed: e.g. 0,2,4 or 0-7, each range from low to high)"),
    (["--window", "1s:2s"], "--window: '1s:2s' starts after the run's last op ends, at 0.033 s (allowed: a "
                            "window that starts before 0.033 s)"),  # GPipe and 1F1B: (m + p - 1) x (F + B)
    # a traceback (ValueError from the chart) before
    (["--window", "-1ms:2ms"], "--window: '-1ms:2ms': START is before the step begins (allowed: START:END with "
                               "units, e.g. 0:5ms or 1.2s:1.4s, 0 <= START < END)"),
])
def test_cli_gantt_refuses_ranks_it_cannot_draw(tmp_path, capsys, ranks, error):
    """A folded rank (DP replica 1 of p = 4, dp = 2) and a range with no rows ('3-1') are refused, no chart written, not
    drawn idle from start to end or empty with a matplotlib warning."""
    out = tmp_path / "run"
    scenario = tmp_path / "1f1b.yaml"
    scenario.write_text(SYNTHETIC.replace("{schedule}", "1f1b"))
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    flags = ranks if isinstance(ranks, list) else ["--ranks", ranks]
    assert main(["plot", "gantt", str(out), *flags, "-o", str(tmp_path / "g.png")]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim plot: {error}\n"
    assert not (tmp_path / "g.png").exists()


@pytest.mark.parametrize("chart, flags, error", [
    ("memory", ["--ranks", "4"], "--ranks: rank 4 has no ops in this run's timeline (folded into an equivalent "
                                 "rank, or not kept by run.timeline) (allowed: a simulated rank: 0, 1, 2, 3; or rerun "
                                 "with run.fold: false)"),
    ("memory", ["--window", "0:5ms"], "--window: not read by a memory chart (allowed: a gantt chart)"),
    ("memory", ["--by", "rank"], "--by: not read by a memory chart (allowed: a gantt chart)"),
    ("gantt", ["--x", "step_time_s"], "--x: not read by a gantt chart (allowed: a sweep or heatmap chart)"),
    ("gantt", ["--log-x"], "--log-x: not read by a gantt chart (allowed: a sweep chart)"),
])
def test_cli_plot_refuses_options_its_chart_does_not_read(tmp_path, capsys, chart, flags, error):
    """`plot memory --ranks 4` (a folded rank) and `plot memory --window ...` wrote the default chart, exit 0: the
    memory chart ignored --ranks, and every chart ignored the options of the others."""
    out = tmp_path / "run"
    scenario = tmp_path / "1f1b.yaml"
    scenario.write_text(SYNTHETIC.replace("{schedule}", "1f1b"))
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["plot", chart, str(out), *flags, "-o", str(tmp_path / "m.png")]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim plot: {error}\n"
    assert not (tmp_path / "m.png").exists()


def test_cli_memory_draws_the_ranks_asked_for(tmp_path, monkeypatch):
    """`plot memory --ranks 0,3`: one curve per rank given, not one per stage whatever --ranks says."""
    drawn = []
    monkeypatch.setattr("simulator.report.outputs.save_figure",
                        lambda figure, path: drawn.append([line.get_label() for line in figure.axes[0].lines]))
    out = tmp_path / "run"
    scenario = tmp_path / "1f1b.yaml"
    scenario.write_text(SMALL_MODEL.replace("{schedule}", "1f1b"))
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    assert main(["plot", "memory", str(out), "--ranks", "0,6", "-o", str(tmp_path / "m.png")]) == 0
    assert [label.split(",")[0] for label in drawn[0]] == ["rank 0 (stage 0)", "rank 6 (stage 3)", "capacity 79.6 GiB"]


def test_cli_memory_of_a_run_without_memory_is_one_line(tmp_path, capsys):
    """The bundled schedule studies (synthetic per-stage costs, memory reported as 0) get a one-line refusal, not a
    memory chart of flat lines at 0.0 GiB under the GPU's capacity, as if each stage needed nothing."""
    out, scenario = tmp_path / "run", tmp_path / "1f1b.yaml"
    scenario.write_text(SYNTHETIC.replace("{schedule}", "1f1b"))
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["plot", "memory", str(out), "-o", str(tmp_path / "m.png")]) == 2
    assert capsys.readouterr().err == (
        f"error: {out}: OUTDIR: this run models no memory (synthetic per-stage costs report it as 0 GiB): its chart "
        "would be flat lines at 0 (allowed: the folder of a run of a model with dimensions or a preset)\n")
    assert not (tmp_path / "m.png").exists()


def test_cli_gantt_of_a_run_that_takes_no_time_is_one_line(tmp_path, capsys):
    """A synthetic step with forward and backward of 0 s ran (step time 0 us); its Gantt chart ended in a
    traceback, "ValueError: window 0.0:0.0 must have 0 <= START < END"."""
    out = tmp_path / "run"
    scenario = tmp_path / "1f1b.yaml"
    scenario.write_text(SYNTHETIC.replace("{schedule}", "1f1b").replace(f"forward: {FORWARD_MS} ms", "forward: 0 s")
                        .replace(f"backward: {BACKWARD_MS} ms", "backward: 0 s"))
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["plot", "gantt", str(out), "-o", str(tmp_path / "g.png")]) == 2
    assert capsys.readouterr().err == (f"error: {out}: OUTDIR: every op of this run ends at 0 s: a Gantt chart has no "
                                       "time to draw (allowed: the folder of a run whose ops take time)\n")
    assert not (tmp_path / "g.png").exists()


@pytest.mark.parametrize("virtual_stages", [5, 8, 45])
def test_every_chunk_of_an_interleaved_gantt_has_a_look_of_its_own(virtual_stages):
    """docs/plots.md: one shade per chunk, one legend entry per chunk; past the shades (4) a hatch sets chunks apart,
    however many a rank holds, so chunk 4 is not drawn (and listed) in chunk 0's colour."""
    kinds = (Bar.FORWARD, Bar.BACKWARD, Bar.BACKWARD_INPUT, Bar.WEIGHT_GRAD)
    used = {(kind, chunk) for kind in kinds for chunk in range(virtual_stages)}
    handles = _legend(used, virtual_stages, pipelined=True)
    assert len(handles) == len(kinds) * virtual_stages
    looks = {(handle.get_facecolor(), handle.get_hatch() or "") for handle in handles}
    assert len(looks) == len(handles)


def test_every_op_category_of_a_training_step_has_its_gantt_bar():
    """Bars are chosen by category through one table each (pipeline passes, other ops); a category without a
    bar is refused instead of drawn as "other communication" (the fallback every unknown category got)."""
    traced = {"compute", "host", ""}  # a replayed trace's kernels and host gaps: `plot` refuses those runs
    assert set(PASS_BARS) | set(OP_BARS) == set(get_args(Category)) - traced
    assert set(BAR_CLASSES) == set(Bar)
    on_compute = np.array([True, False, True, False])
    assert _bar_class(pd.Series(["tp", "cp", "optimizer", "dp"]), on_compute).tolist() == [
        Bar.TP_CP, Bar.TP_CP_OVERLAPPED, Bar.OPTIMIZER, Bar.DP]
    with pytest.raises(ValueError, match="no Gantt bar for op category 'host'"):
        _bar_class(pd.Series(["dp", "host"]), np.array([True, True]))


def test_a_folder_without_a_timeline_says_why_and_what_to_run(tmp_path, capsys):
    """'this run wrote no timeline.parquet (see run.timeline)' was given for a job's folder too, which no
    run.timeline setting fills: a step's folder points at run.timeline, a job's at running the step alone."""
    step, job = tmp_path / "step", tmp_path / "job"
    assert main(["run", "schedule-gpipe-p4-m8", "--set", "run.timeline=summary", "--out", str(step), "--quiet"]) == 0
    assert main(["run", str(DATA / "small-job.yaml"), "--out", str(job), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["plot", "gantt", str(step)]) == 2
    assert ("wrote no timeline.parquet (run.timeline: summary writes none; run it again with --set "
            "run.timeline=full or per-stage)") in capsys.readouterr().err
    assert main(["plot", "memory", str(job)]) == 2
    assert ("wrote no timeline.parquet (a job over weeks writes its events, not a step's timeline: run the step "
            "without run.horizon)") in capsys.readouterr().err


def test_cli_plot_names_a_run_folder_of_an_earlier_version(tmp_path, capsys):
    """A run folder whose summary.json names memory_per_stage_gib (an earlier version's memory_per_stage) is read as
    the training-step run it is, not refused as 'summary.json has no memory_per_stage (not a training-step run?)'."""
    out = tmp_path / "run"
    scenario = tmp_path / "1f1b.yaml"
    scenario.write_text(SYNTHETIC.replace("{schedule}", "1f1b"))
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    summary["memory_per_stage_gib"] = summary.pop("memory_per_stage")
    (out / "summary.json").write_text(json.dumps(summary))
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["files"]["summary.json"] = {"bytes": (out / "summary.json").stat().st_size,
                                         "sha256": file_digest(out / "summary.json")}
    (out / MANIFEST).write_text(json.dumps(manifest))
    assert main(["plot", "memory", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: {out}: OUTDIR: summary.json was written by an earlier trainsim (memory_per_stage_gib, now "
        "memory_per_stage) (allowed: a run folder of this version: run the scenario again)\n")


def test_gantt_of_one_stage_calls_its_idle_time_compute_idle(tmp_path):
    """Llama 3 70B tp 4 dp 256 FSDP on 1,024 H100: the chart of a run without a pipeline was titled 'bubble 1.8%'
    and its grey bars 'idle (bubble)', where the run's printout says compute idle (waits for FSDP gathers)."""
    path = tmp_path / "fsdp.yaml"
    path.write_text(SMALL_MODEL.replace("{schedule}", "1f1b").replace(f"tp: 2, pp: {STAGES}, dp: 1",
                                                                      "tp: 1, pp: 1, dp: 8, zero: 3"))
    result = simulator.simulate(simulator.load_scenario(str(path)))
    figure = gantt_figure(result.timeline, result.summary)
    title = figure.axes[0].get_title()
    assert f"— compute idle {100 * result.summary['bubble_fraction']:.1f}%" in title and "bubble" not in title
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "idle" in legend and "idle (bubble)" not in legend


def test_the_overlapped_tp_cp_colour_is_a_hue_of_its_own_on_the_side_lane():
    """The overlapped TP/CP bars' hue is at least 45 degrees from every other colour drawn on the side lane (a light red
    such as #EFA3A5 is hard to tell from the PP sends' pink, #DA8BC3)."""
    import colorsys

    from simulator.report.gantt import BAR_CLASSES, Bar

    def hue(colour: str) -> float:
        return colorsys.rgb_to_hsv(*(int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)))[0] * 360

    overlapped = hue(BAR_CLASSES[Bar.TP_CP_OVERLAPPED][1])
    for kind in (Bar.EP, Bar.PP, Bar.DP, Bar.OTHER_COMM, Bar.OPTIMIZER):
        apart = abs(overlapped - hue(BAR_CLASSES[kind][1]))
        assert min(apart, 360 - apart) >= 45, kind
