"""Readable Gantt charts and the study charts.

Gantt: with `recompute: full` each backward pass carries one recompute bar as long as the recompute ops inside
it; interleaved chunks get their own shades and the chunk of each pass follows the data dependencies (a
micro-batch's forwards run chunk 0 then 1 on a rank, its backwards 1 then 0); `--window` and `--ranks` zoom;
the legend lists what is drawn. Study charts: `trainsim plot sweep|heatmap|busbw|front` from a sweep folder, a
`collective --json` file and a search folder."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from simulator import simulate
from simulator.cli import main
from simulator.config.loader import scenario_from_text
from simulator.errors import ScenarioError
from simulator.report.gantt import gantt_figure, pipeline_passes
from simulator.report.outputs import compute_stream_work, pipeline_actions
from simulator.report.run_folder import write_run_folder
from simulator.report.study_plots import pareto_front
from simulator.sweep.executors import SerialExecutor
from simulator.sweep.runner import run_sweep
from simulator.sweep.spec import sweep_from_text

RECOMPUTE = """
cluster: {topology: dgx-h100}
model: {layers: 8, hidden: 1024, heads: 8, vocab: 32000}
training: {seq_len: 1024, micro_batch: 1, microbatches: 4, recompute: full}
parallelism: {tp: 2, pp: 4, dp: 1}
"""
INTERLEAVED = """
cluster: {topology: dgx-h100}
model: {synthetic: {stages: 4, forward: 1 ms, backward: 2 ms}}
training: {microbatches: 8}
parallelism: {pp: 4, dp: 2, pipeline: {schedule: interleaved, virtual_stages: 2}}
"""
ZBV = INTERLEAVED.replace("schedule: interleaved", "schedule: zbv")


def _bars(figure, kind: str, row: int) -> np.ndarray:
    """(start, width) of the bars of one kind in one row, from the broken_barh collection's gid."""
    for collection in figure.axes[0].collections:
        if collection.get_gid() == f"{kind}:{row}":
            return np.array([path.vertices[:, 0].min() for path in collection.get_paths()]), np.array(
                [np.ptp(path.vertices[:, 0]) for path in collection.get_paths()])
    return np.empty(0), np.empty(0)


def test_recompute_is_one_visible_bar_per_backward_pass():
    result = simulate(scenario_from_text(RECOMPUTE, "r.yaml"))
    timeline, summary = result.timeline, result.summary
    work = compute_stream_work(timeline, 0)
    passes = pipeline_passes(pipeline_actions(work), 1)
    backward = passes[passes["category"] == "backward"]
    assert list(backward["microbatch"]) == [0, 1, 2, 3]
    recompute = work[work["category"] == "recompute"]
    per_mb = (recompute["end_s"] - recompute["start_s"]).groupby(recompute["microbatch"]).sum()
    assert backward["recompute_s"].to_numpy() == pytest.approx(per_mb.to_numpy(), rel=1e-12)
    figure = gantt_figure(timeline, summary)
    starts, widths = _bars(figure, "recompute", 0)
    assert len(starts) == 4
    assert widths / 1e3 == pytest.approx(per_mb.to_numpy(), rel=1e-9)  # ms on the chart
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "recompute (R)" in labels and "weight-grad (W)" not in labels


def test_interleaved_chunks_are_numbered_and_shaded():
    result = simulate(scenario_from_text(INTERLEAVED, "i.yaml"))
    passes = pipeline_passes(pipeline_actions(compute_stream_work(result.timeline, 0)), 2)
    forward = passes[passes["category"] == "forward"]
    backward = passes[passes["category"] == "backward"]
    # Megatron's interleaved order on rank 0: F0..F3 of chunk 0, then F0..F3 of chunk 1, ...
    assert list(forward["chunk"][:8]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert forward.groupby("microbatch")["chunk"].apply(list).tolist() == [[0, 1]] * 8
    assert backward.groupby("microbatch")["chunk"].apply(list).tolist() == [[1, 0]] * 8
    figure = gantt_figure(result.timeline, result.summary)
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert {"forward (F) chunk 0", "forward (F) chunk 1", "full backward (BW) chunk 1"} <= set(labels)
    assert ", interleaved v2, 8 micro-batches — bubble 15.8%" in figure.axes[0].get_title()


def test_zero_bubble_chunks_shade_their_input_and_weight_gradients():
    """ZBV runs every backward as Bi then W: those bars take their chunk's shade, so rank 0's stage-0 and stage-7
    gradients look apart. Each micro-batch's Bi and W run chunk 1 (stage 7) then chunk 0 (stage 0), read from the
    chunk column or, without it, from the data dependencies."""
    result = simulate(scenario_from_text(ZBV, "z.yaml"))
    actions = pipeline_actions(compute_stream_work(result.timeline, 0))
    for passes in (pipeline_passes(actions, 2, [0, 7]), pipeline_passes(actions, 2)):
        for category in ("backward", "weight_grad"):
            chunks = passes[passes["category"] == category].groupby("microbatch")["chunk"].apply(list)
            assert chunks.tolist() == [[1, 0]] * 8
    figure = gantt_figure(result.timeline, result.summary)
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert {f"{kind} chunk {chunk}" for kind in ("input-grad backward (B)", "weight-grad (W)")
            for chunk in (0, 1)} <= set(labels)


def test_window_and_ranks_zoom(tmp_path, capsys):
    result = simulate(scenario_from_text(INTERLEAVED, "i.yaml"))
    figure = gantt_figure(result.timeline, result.summary, ranks=[1, 3], window=(0.005, 0.010))
    ax = figure.axes[0]
    assert ax.get_xlim()[0] == pytest.approx(5.0) and ax.get_xlim()[1] == pytest.approx(5.0 + 5.0 * 1.005)
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["rank 1: stages 1, 5", "rank 3: stages 3, 7"]
    out = tmp_path / "run"
    assert main(["run", str(_write(tmp_path, INTERLEAVED)), "--out", str(out)]) == 0
    assert main(["plot", "gantt", str(out), "--window", "5ms:10ms", "--ranks", "0-1", "-o",
                 str(tmp_path / "g.png")]) == 0
    assert (tmp_path / "g.png").stat().st_size > 0
    for bad in (["--window", "10ms:5ms"], ["--window", "5"], ["--ranks", "0,99"], ["--ranks", "a"]):
        capsys.readouterr()
        assert main(["plot", "gantt", str(out), *bad, "-o", str(tmp_path / "bad.png")]) == 2
        assert "\n" not in capsys.readouterr().err.strip()
    assert not (tmp_path / "bad.png").exists()


def _one_field_sweep(out) -> None:
    """A sweep of ring all-reduces on one DGX H100 over two sizes (one field swept), written to ``out``."""
    sweep = sweep_from_text("""
base:
  cluster: {topology: dgx-h100}
  workload: [{op: all_reduce, bytes: 1 MiB}]
grid:
  workload[0].bytes: [1 MiB, 16 MiB]
""", "one.yaml")
    run_sweep(sweep, out, SerialExecutor())


def _all_reduce_sweep(out, sizes: str) -> None:
    """A sweep of ring and tree all-reduces on one DGX H100 over ``sizes``, written to ``out``."""
    sweep = sweep_from_text(f"""
base:
  cluster: {{topology: dgx-h100}}
  workload: [{{op: all_reduce, bytes: 1 MiB}}]
grid:
  collectives.algorithm: [ring, tree]
  workload[0].bytes: [{sizes}]
""", "c.yaml")
    run_sweep(sweep, out, SerialExecutor())


@pytest.mark.parametrize("flags, error", [
    (["--x", "workload[0].bytes", "--y", "workload[0].bytes", "--value", "collectives[0].time_s"],
     "--x/--y/--value: --x workload[0].bytes, --y workload[0].bytes and --value collectives[0].time_s name one "
     "column twice (allowed: three different columns: two axes and a metric)"),
    (["--x", "workload[0].bytes", "--y", "collectives.algorithm", "--value", "workload[0].bytes"],
     "--x/--y/--value: --x workload[0].bytes, --y collectives.algorithm and --value workload[0].bytes name one "
     "column twice (allowed: three different columns: two axes and a metric)"),
    (["--x", "workload[0].bytes", "--y", "collectives.algorithm", "--value", "status"],
     "--value: column 'status' holds values that are not numbers (allowed: a numeric column: gpus, makespan_s, "
     "collectives[0].ranks, collectives[0].bytes, collectives[0].time_s, collectives[0].algbw_GBps, "
     "collectives[0].busbw_GBps, ops_executed, flows_simulated, seed, auto_choices[0].bytes, auto_choices[0].ranks, "
     "auto_choices[0].candidates[0].estimate_s, auto_choices[0].candidates[1].estimate_s, "
     "auto_choices[0].candidates[2].estimate_s)"),
])
def test_a_heatmap_of_a_column_twice_or_of_text_is_refused(tmp_path, capsys, flags, error):
    """A heat map over one column twice (pandas: 'Grouper ... not 1-dimensional') or of a text column (pandas:
    "dtype 'str' does not support operation 'mean'") was a traceback, exit 1."""
    _all_reduce_sweep(tmp_path / "sweep", "1 MiB, 16 MiB")
    capsys.readouterr()
    assert main(["plot", "heatmap", str(tmp_path / "sweep"), *flags, "-o", str(tmp_path / "h.png")]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim plot: {error}\n"
    assert not (tmp_path / "h.png").exists()


@pytest.mark.parametrize("chart", ["sweep", "heatmap"])
def test_a_folder_that_is_no_sweeps_is_told_so_before_the_missing_axes(tmp_path, capsys, chart):
    """`trainsim plot sweep DIR` judges the folder first: a run's folder is told it holds no sweep before any word of
    --x and --y, and a sweep's folder without the axes is told what the chart needs."""
    from simulator.cli import main

    run = tmp_path / "run"
    assert main(["run", "llama3-8b-dgx-h100-dp8", "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["plot", chart, str(run)]) == 2
    assert capsys.readouterr().err == (f"error: {run}: OUTDIR: a run's folder: its charts are `trainsim plot gantt` "
                                       "and `memory` (allowed: a folder written by `trainsim sweep` (results.parquet))"
                                       "\n")
    _all_reduce_sweep(tmp_path / "sweep", "1 MiB, 16 MiB")
    capsys.readouterr()
    assert main(["plot", chart, str(tmp_path / "sweep")]) == 2
    assert f"a {chart} chart needs --{'value' if chart == 'heatmap' else 'x and --y'}" in capsys.readouterr().err


def test_a_sweep_chart_of_a_text_column_is_refused_as_a_heatmap_is(tmp_path, capsys):
    """`plot sweep --y bottleneck.constraint` is refused as `heatmap --value` refuses texts, naming the numeric columns,
    not drawn as a category axis."""
    _all_reduce_sweep(tmp_path / "sweep", "1 MiB, 16 MiB")
    capsys.readouterr()
    assert main(["plot", "sweep", str(tmp_path / "sweep"), "--x", "workload[0].bytes", "--y",
                 "collectives.algorithm", "-o", str(tmp_path / "s.png")]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim plot: --y: column 'collectives.algorithm' holds values that are not numbers "
        "(allowed: a "
        "numeric column: gpus, makespan_s, collectives[0].ranks, collectives[0].bytes, collectives[0].time_s, "
        "collectives[0].algbw_GBps, collectives[0].busbw_GBps, ops_executed, flows_simulated, seed, "
        "auto_choices[0].bytes, auto_choices[0].ranks, auto_choices[0].candidates[0].estimate_s, "
        "auto_choices[0].candidates[1].estimate_s, auto_choices[0].candidates[2].estimate_s)\n")
    assert not (tmp_path / "s.png").exists()


def test_a_sweep_chart_defaults_x_to_the_one_swept_field_and_says_so(tmp_path, capsys):
    """Without --x, a sweep of one field draws against it and says so; a sweep of two is refused naming them."""
    _one_field_sweep(tmp_path / "one")
    capsys.readouterr()
    assert main(["plot", "sweep", str(tmp_path / "one"), "--y", "collectives[0].busbw_GBps", "-o",
                 str(tmp_path / "one.png")]) == 0
    assert capsys.readouterr().out.startswith("--x workload[0].bytes: the one field the sweep varies\n")
    assert (tmp_path / "one.png").stat().st_size > 0
    _all_reduce_sweep(tmp_path / "two", "1 MiB, 16 MiB")
    capsys.readouterr()
    assert main(["plot", "sweep", str(tmp_path / "two"), "--y", "collectives[0].busbw_GBps"]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim plot: --x: a sweep chart needs --x and --y: 2 "
                                       "fields are "
                                       "swept (allowed: one of the swept fields: collectives.algorithm, "
                                       "workload[0].bytes)\n")


def test_a_heatmap_defaults_its_axes_to_the_two_swept_fields_and_says_so(tmp_path, capsys):
    """`plot heatmap DIR --value M` of a sweep of two fields draws over the two fields (or the one --x or --y leaves)
    and says so, as `plot sweep` defaults --x to a sweep's one field, not 'needs --x and --y and --value'; a missing
    --value is refused at --value, naming the numeric columns; a sweep of one field is refused naming it."""
    _all_reduce_sweep(tmp_path / "two", "1 MiB, 16 MiB")
    capsys.readouterr()
    two, value = str(tmp_path / "two"), "collectives[0].busbw_GBps"
    assert main(["plot", "heatmap", two, "--value", value, "-o", str(tmp_path / "h.png")]) == 0
    assert capsys.readouterr().out.startswith("--x collectives.algorithm --y workload[0].bytes: the two fields the "
                                              "sweep varies\n")
    assert (tmp_path / "h.png").stat().st_size > 0
    assert main(["plot", "heatmap", two, "--value", value, "--x", "workload[0].bytes", "-o",
                 str(tmp_path / "g.png")]) == 0
    assert capsys.readouterr().out.startswith("--y collectives.algorithm: the other field the sweep varies\n")
    assert main(["plot", "heatmap", two, "--x", "collectives.algorithm", "--y", "workload[0].bytes"]) == 2
    assert capsys.readouterr().err.startswith("error: command line: trainsim plot: --value: a heatmap chart needs "
                                              "--value (allowed: "
                                              "a numeric column: gpus, makespan_s,")
    _one_field_sweep(tmp_path / "one")
    capsys.readouterr()
    assert main(["plot", "heatmap", str(tmp_path / "one"), "--value", value]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim plot: --x: a heatmap chart needs --x and --y: 1 "
                                       "field is swept "
                                       "(allowed: two columns of the results table; the swept fields: "
                                       "workload[0].bytes)\n")


def test_a_line_through_points_that_share_a_place_says_so(tmp_path):
    """A job sweep over checkpoint.interval x restart.spares x checkpoint.mode drawn against the interval alone
    joined 4 points per interval in one line, a zigzag between ETTR 0.64 and 0.99 that read as a curve. Without
    --hue, ring and tree share each size here: the title says how many points share a place and suggests
    --hue; with --hue, one point per place, it says nothing; with a --hue that splits nothing it does not
    suggest --hue again."""
    from simulator.report.study_plots import sweep_figure

    _all_reduce_sweep(tmp_path / "sweep", "1 MiB, 16 MiB")
    frame = pd.read_parquet(tmp_path / "sweep" / "results.parquet")
    title = sweep_figure(frame, "workload[0].bytes", "collectives[0].busbw_GBps").axes[0].get_title()
    assert title == ("collectives[0].busbw_GBps vs workload[0].bytes\nup to 2 points per place, other axes varying, "
                     "joined in point order: --hue splits them")
    split = sweep_figure(frame, "workload[0].bytes", "collectives[0].busbw_GBps", "collectives.algorithm")
    assert split.axes[0].get_title() == "collectives[0].busbw_GBps vs workload[0].bytes by collectives.algorithm"
    frame["run.seed"] = 0  # a hue that splits nothing: --hue is set, so the title does not suggest it
    unsplit = sweep_figure(frame, "workload[0].bytes", "collectives[0].busbw_GBps", "run.seed")
    assert unsplit.axes[0].get_title() == (
        "collectives[0].busbw_GBps vs workload[0].bytes by run.seed\nup to 2 points per place, other axes varying, "
        "joined in point order: more axes vary than --x and --hue show")


def _write(tmp_path, text: str):
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_study_charts_from_a_sweep_a_collective_table_and_a_search(tmp_path, capsys):
    _all_reduce_sweep(tmp_path / "sweep", "1 MiB, 16 MiB, 256 MiB")
    for chart, extra in (("sweep", ["--x", "workload[0].bytes", "--y", "collectives[0].busbw_GBps", "--hue",
                                    "collectives.algorithm"]),
                         ("heatmap", ["--x", "workload[0].bytes", "--y", "collectives.algorithm", "--value",
                                      "collectives[0].time_s"]),
                         ("busbw", [])):
        assert main(["plot", chart, str(tmp_path / "sweep"), *extra, "-o", str(tmp_path / f"{chart}.png")]) == 0
        assert (tmp_path / f"{chart}.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["plot", "sweep", str(tmp_path / "sweep"), "--x", "nope", "--y", "step_time_s"]) == 2
    # the refusal names the flag at fault (it named all four) and the columns there are, the axes first
    assert ("command line: trainsim plot: --x: no column 'nope' (allowed: a column of the table: point, status, error, "
            "collectives.algorithm, workload[0].bytes, ") in capsys.readouterr().err
    assert main(["plot", "heatmap", str(tmp_path / "sweep"), "--x", "workload[0].bytes", "--y",
                 "collectives.algorithm", "--value", "time"]) == 2
    assert "command line: trainsim plot: --value: no column 'time' (allowed: " in capsys.readouterr().err
    rows = [{"op": "all_reduce", "algorithm": "ring", "bytes": 2.0**20 * k, "busbw_GBps": 10.0 * k}
            for k in (1, 2, 4)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    assert main(["plot", "busbw", str(tmp_path / "rows.json"), "-o", str(tmp_path / "rows.png")]) == 0
    candidates = pd.DataFrame({"label": ["a", "b", "c", "d"], "status": ["simulated"] * 3 + ["pruned"],
                               "peak_memory_gib": [40.0, 50.0, 60.0, None],
                               "tokens_per_s": [1.0, 3.0, 2.0, None], "tree_choice": [False, False, True, False],
                               "searched": True})
    write_run_folder(tmp_path / "search", {"scenario": "s.yaml"},
                     lambda stage: candidates.to_parquet(stage / "candidates.parquet"))
    assert main(["plot", "front", str(tmp_path / "search")]) == 0
    assert (tmp_path / "search" / "front.png").is_file()  # listed in the manifest: the next search removes it
    assert json.loads((tmp_path / "search" / "manifest.json").read_text())["figures"] == ["front.png"]
    # the table edited after the search wrote it: refused, as a run's charts refuse theirs (it was drawn)
    candidates.assign(tokens_per_s=candidates["tokens_per_s"] * 2).to_parquet(tmp_path / "search" /
                                                                                "candidates.parquet")
    capsys.readouterr()
    assert main(["plot", "front", str(tmp_path / "search"), "-o", str(tmp_path / "edited.png")]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'search'}: OUTDIR: candidates.parquet is not the file this run wrote (mixed or edited "
        "folder) (allowed: a folder written by `trainsim search ... --out DIR` (candidates.parquet and its "
        "manifest.json))\n")
    assert not (tmp_path / "edited.png").exists()
    assert list(pareto_front(candidates[:3], "peak_memory_gib", "tokens_per_s")["label"]) == ["a", "b"]


def test_the_front_reads_tokens_per_second_in_the_unit_they_reach():
    """The front's axis read 480000 where the search's table prints 480,576 tokens/s; then 480,000 tokens/s, while
    the goodput chart and the sweep's took the unit the largest value reaches: the front does too (k tokens/s),
    its ticks plain numbers with thousands separators."""
    from simulator.report.column_units import PlainFormatter
    from simulator.report.study_plots import front_figure

    candidates = pd.DataFrame({"label": ["a", "b"], "status": ["simulated"] * 2, "peak_memory_gib": [68.9, 72.3],
                               "tokens_per_s": [465_432.0, 480_576.0], "tree_choice": [True, False], "searched": True})
    axes = front_figure(candidates).axes[0]
    assert axes.get_ylabel() == "k tokens/s"
    assert sorted(axes.collections[0].get_offsets()[:, 1]) == pytest.approx([465.432, 480.576])
    assert isinstance(axes.yaxis.get_major_formatter(), PlainFormatter)


def test_the_front_labels_the_best_of_the_searched_space_not_the_trees_layout_outside_it():
    """The tree's layout is simulated for the comparison even where the space leaves it out; with nothing of the space
    simulated, the front labels none 'best', as search.json has no winner."""
    from simulator.report.study_plots import front_figure

    candidates = pd.DataFrame({"label": ["in", "tree"], "status": ["simulated"] * 2, "peak_memory_gib": [60.0, 50.0],
                               "tokens_per_s": [300_000.0, 400_000.0], "tree_choice": [False, True],
                               "searched": [True, False]})
    texts = [text.get_text() for text in front_figure(candidates).axes[0].texts]
    assert "best: in" in texts and "tree: tree" in texts
    texts = [text.get_text() for text in front_figure(candidates[candidates["tree_choice"]]).axes[0].texts]
    assert texts == ["tree: tree"]


def test_a_front_of_one_point_is_drawn():
    """One layout beats the other on both memory and throughput: the front is that point alone, which a line
    draws nothing of, while the legend names the front; its points are ringed."""
    from simulator.report.study_plots import front_figure

    candidates = pd.DataFrame({"label": ["lean", "heavy"], "status": ["simulated"] * 2,
                               "peak_memory_gib": [50.0, 70.0], "tokens_per_s": [400_000.0, 300_000.0],
                               "tree_choice": False, "searched": True})
    front, = [line for line in front_figure(candidates).axes[0].lines
              if line.get_label() == "throughput-memory front"]
    assert list(front.get_xdata()) == [50.0]
    assert front.get_marker() not in (None, "None", "", " ") and front.get_markersize() > 0


@pytest.mark.parametrize("best_memory_gib", [10.0, 90.0])
def test_the_front_labels_stay_inside_the_axes(best_memory_gib):
    """The best layout's label sat left of its point, over the tick labels when the best was the leftmost point
    (the constrained layout squeezing the axes to keep it on the figure); the decision tree's sat right of its
    point, past the axes when that was the rightmost."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from simulator.report.study_plots import front_figure

    tree_memory_gib = 100.0 - best_memory_gib
    candidates = pd.DataFrame({"label": ["TP8 CP1 PP2 DP4 mb1 zero1 recompute=selective",
                                         "TP4 CP1 PP4 DP4 mb1 zero1 recompute=none", "c"],
                               "status": ["simulated"] * 3, "peak_memory_gib": [best_memory_gib, tree_memory_gib, 50.0],
                               "tokens_per_s": [500_000.0, 300_000.0, 400_000.0], "tree_choice": [False, True, False],
                               "searched": True})
    figure = front_figure(candidates)
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    figure_box, axes_box = figure.bbox, figure.axes[0].bbox
    labels = [text for text in figure.axes[0].texts if text.get_text().startswith(("best:", "tree:"))]
    assert len(labels) == 2
    for label in labels:
        extent = label.get_window_extent(renderer)
        assert figure_box.y0 <= extent.y0 and extent.y1 <= figure_box.y1
        assert axes_box.x0 <= extent.x0 and extent.x1 <= axes_box.x1  # not over the tick labels, nor squeezing the axes


def test_busbw_chart_of_an_auto_table_says_which_algorithm_ran_and_on_how_many_ranks(tmp_path, capsys):
    """`trainsim collective --json` of the auto rule on a 32-GPU cluster (tree to 8 MiB, ring above): the busbw chart
    names the algorithms drawn and the ranks, not one line labelled 'auto' under 'all_reduce: bus bandwidth vs size'."""
    from simulator.report.study_plots import busbw_figure, collective_rows

    assert main(["collective", "--topology", "dgx-h100-cluster", "--set", "nodes=4", "--sizes", "1MiB:64MiB",
                 "--json"]) == 0
    (tmp_path / "rows.json").write_text(capsys.readouterr().out)
    rows = collective_rows(tmp_path / "rows.json")
    runs = []
    for algorithm, size in zip(rows["resolved_algorithm"], rows["bytes"]):
        runs = runs[:-1] + [(algorithm, size)] if runs and runs[-1][0] == algorithm else runs + [(algorithm, size)]
    assert len(runs) > 1  # the rule switches along the line, which is what the label must tell
    axis = busbw_figure(rows).axes[0]
    sizes = {2.0**20 * 2**k: f"{2**k} MiB" for k in range(7)}
    assert [text.get_text() for text in axis.get_legend().get_texts()] == [
        "auto: " + ", ".join(f"{algorithm} to {sizes[size]}" for algorithm, size in runs)]
    assert axis.get_title() == "all_reduce on 32 ranks: bus bandwidth vs size"


def test_busbw_of_a_sweep_of_training_steps_is_refused_in_one_line(tmp_path, capsys):
    """A sweep of training steps has no collective columns; the busbw chart raised pandas' ValueError."""
    folder = tmp_path / "sweep"
    folder.mkdir()
    pd.DataFrame({"point": [0], "status": ["ok"], "error": [""], "training.microbatches": [4],
                  "step_time_s": [0.03]}).to_parquet(folder / "results.parquet")
    assert main(["plot", "busbw", str(folder), "-o", str(tmp_path / "b.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "OUTDIR: its sweep points are not collectives" in err
    assert not (tmp_path / "b.png").exists()


def test_a_search_folder_is_refused_by_the_sweep_charts_with_the_chart_it_has(tmp_path, capsys):
    """`plot sweep` and `plot heatmap` read a sweep's results.parquet alone, yet their refusal of a search folder
    offered 'or `trainsim search` (candidates.parquet)', the very folder it refused."""
    candidates = pd.DataFrame({"label": ["a"], "status": ["simulated"], "peak_memory_gib": [40.0],
                               "tokens_per_s": [1.0], "tree_choice": [False], "searched": True, "tp": [8], "pp": [1]})
    write_run_folder(tmp_path / "search", {"scenario": "s.yaml"},
                     lambda stage: candidates.to_parquet(stage / "candidates.parquet"))
    refusal = (f"error: {tmp_path / 'search'}: OUTDIR: a layout search's folder: its chart is `trainsim plot front` "
               "(allowed: a folder written by `trainsim sweep` (results.parquet))\n")
    assert main(["plot", "heatmap", str(tmp_path / "search"), "--x", "tp", "--y", "pp", "--value", "tokens_per_s"]) == 2
    assert capsys.readouterr().err == refusal
    assert main(["plot", "heatmap", str(tmp_path / "search")]) == 2  # told the folder is wrong before the options
    assert capsys.readouterr().err == refusal


def test_unreadable_study_inputs_say_what_they_should_be(tmp_path, capsys):
    """Every refusal of a study chart's OUTDIR says what it takes, as the run-folder refusals do, a corrupt
    results.parquet and a JSON file that does not parse included."""
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "results.parquet").write_text("not parquet")
    (tmp_path / "rows.json").write_text("{")
    assert main(["plot", "sweep", str(folder), "--x", "a", "--y", "b"]) == 2
    assert capsys.readouterr().err == (f"error: {folder}: OUTDIR: results.parquet is not readable (ArrowInvalid) "
                                       "(allowed: a folder written by `trainsim sweep` (results.parquet))\n")
    assert main(["plot", "busbw", str(tmp_path / "rows.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'rows.json'}: OUTDIR: not readable JSON (" in err
    assert err.endswith("(allowed: a sweep of a collectives scenario, or a `trainsim collective --json` file)\n")


@pytest.mark.parametrize("text, missing", [("[]", "bytes, busbw_GBps, algorithm"),
                                           ('[{"bytes": 1024, "time_s": 1e-5}]', "busbw_GBps, algorithm")])
def test_busbw_of_json_that_is_not_a_collective_table_names_what_it_lacks(tmp_path, capsys, text, missing):
    """An empty list or other rows blamed flags the command had not been given: "--x/--y/--hue/--value: no
    column 'bytes' (allowed: a column of the table: )"."""
    (tmp_path / "rows.json").write_text(text)
    assert main(["plot", "busbw", str(tmp_path / "rows.json")]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'rows.json'}: OUTDIR: not the rows of a collective table "
                                       f"(no {missing}) (allowed: a sweep of a collectives scenario, or a `trainsim "
                                       "collective --json` file)\n")


def test_a_sweeps_drawn_values_read_in_six_significant_digits_on_the_charts():
    """A random axis's draws (and sums such as 0.1 + 0.2) label a heatmap's ticks and a sweep chart's legend in six
    significant digits, 0.3 and 11.5011, not 0.30000000000000004 or 11.501145599256004 (the results files keep every
    digit)."""
    from simulator.report.study_plots import heatmap_figure, sweep_figure

    frame = pd.DataFrame({"status": "ok", "a": [0.1 + 0.2, 0.1 + 0.2, 11.501145599256004, 11.501145599256004],
                          "b": ["0.00143764319991 s", "25 MiB", "0.00143764319991 s", "25 MiB"],
                          "step_time_s": [1.0, 2.0, 3.0, 4.0]})
    heatmap = heatmap_figure(frame, "a", "b", "step_time_s")
    assert [text.get_text() for text in heatmap.axes[0].get_xticklabels()] == ["0.3", "11.5011"]
    assert [text.get_text() for text in heatmap.axes[0].get_yticklabels()] == ["0.00143764 s", "25 MiB"]
    lines = sweep_figure(frame, "step_time_s", "step_time_s", hue="a")
    assert [text.get_text() for text in lines.axes[0].get_legend().get_texts()] == ["a = 0.3", "a = 11.5011"]


def test_quantities_on_a_chart_axis_go_smallest_first():
    """A sweep over `forward: [4 ms, 25 ms, 100 us]` draws its heatmap columns and its line's points by size, 100 us, 4
    ms, 25 ms, not in the texts' order. Values that are not all sizes keep their order."""
    from simulator.report.study_plots import heatmap_figure, sweep_figure

    frame = pd.DataFrame({"status": "ok", "forward": ["4 ms", "25 ms", "100 us"] * 2, "m": [4, 4, 4, 8, 8, 8],
                          "step_time_s": [0.042, 0.189, 0.0147, 0.066, 0.297, 0.0231]})
    heatmap = heatmap_figure(frame, "forward", "m", "step_time_s")
    assert [text.get_text() for text in heatmap.axes[0].get_xticklabels()] == ["100 us", "4 ms", "25 ms"]
    assert heatmap.axes[0].images[0].get_array()[0].tolist() == pytest.approx([14.7, 42.0, 189.0])  # in ms
    lines = sweep_figure(frame, "forward", "step_time_s", hue="m")
    assert [list(line.get_ydata()) for line in lines.axes[0].get_lines()] == [pytest.approx([14.7, 42.0, 189.0]),
                                                                              pytest.approx([23.1, 66.0, 297.0])]
    mixed = frame.assign(forward=["4 ms", "fast", "100 us"] * 2)
    labels = heatmap_figure(mixed, "forward", "m", "step_time_s").axes[0].get_xticklabels()
    assert [text.get_text() for text in labels] == ["100 us", "4 ms", "fast"]  # pandas' own order of texts


def test_a_heatmap_cell_of_several_points_says_it_is_their_mean():
    """A sweep that varies more axes than --x and --y show puts several points in each cell; the cell shows their mean
    and the title says so, as the sweep chart says how many share a place."""
    from simulator.report.study_plots import heatmap_figure

    frame = pd.DataFrame({"status": "ok", "m": [4, 4, 8, 8, 4], "schedule": ["gpipe"] * 4 + ["1f1b"],
                          "forward": ["1 ms", "2 ms"] * 2 + ["1 ms"], "step_time_s": [1.0, 3.0, 5.0, 7.0, 2.0]})
    figure = heatmap_figure(frame, "m", "schedule", "step_time_s")
    assert figure.axes[0].images[0].get_array().tolist()[1] == [2.0, 6.0]  # gpipe: the mean of two points
    assert figure.axes[0].get_title() == ("step_time_s over m x schedule\n"
                                          "mean of up to 2 points per cell: more axes vary than --x and --y show")
    single = heatmap_figure(frame[frame["forward"] == "1 ms"], "m", "schedule", "step_time_s")
    assert single.axes[0].get_title() == "step_time_s over m x schedule"
    half_empty = frame.assign(step_time_s=[1.0, float("nan"), 5.0, float("nan"), 2.0])
    assert heatmap_figure(half_empty, "m", "schedule", "step_time_s").axes[0].get_title() == (
        "step_time_s over m x schedule")  # a point without a value is not in the cell's mean


def test_a_heatmaps_long_axis_name_stays_clear_of_its_title():
    """Two rows of `parallelism.pipeline.schedule`: the y label, taller than the two-row plot, ran up into the
    title."""
    from simulator.report.study_plots import heatmap_figure

    frame = pd.DataFrame({"status": "ok", "training.microbatches": [4, 8, 4, 8],
                          "parallelism.pipeline.schedule": ["gpipe", "gpipe", "1f1b", "1f1b"],
                          "bubble_fraction": [0.43, 0.27, 0.43, 0.27]})
    figure = heatmap_figure(frame, "training.microbatches", "parallelism.pipeline.schedule", "bubble_fraction")
    figure.draw_without_rendering()
    ax = figure.axes[0]
    label, title = ax.yaxis.label.get_window_extent(), ax.title.get_window_extent()
    assert label.y1 <= title.y0
    assert not label.overlaps(title)


def test_a_whole_number_axis_has_whole_number_ticks():
    """Llama 3 70B tokens/s against parallelism.pp in {4, 8}: the sweep chart's x axis read 4.0, 4.5, 5.0, ...
    8.0, ticks at pipeline depths no layout has."""
    from simulator.report.study_plots import sweep_figure

    frame = pd.DataFrame({"point": range(4), "status": "ok", "parallelism.pp": [4, 8, 4, 8],
                          "cluster.nodes": [128, 128, 256, 256], "tokens_per_s": [9.5e5, 9.1e5, 1.88e6, 1.73e6]})
    ticks = sweep_figure(frame, "parallelism.pp", "tokens_per_s", "cluster.nodes").axes[0].get_xticks()
    assert len(ticks) and all(tick == int(tick) for tick in ticks)
    assert {4, 8} <= set(ticks)


def test_a_heatmap_writes_its_light_cells_in_black():
    """Llama 3 70B MFU over pp x nodes: the best cell's '0.423' was white on viridis's yellow, barely legible;
    light cells are annotated in black, dark ones in white."""
    from simulator.report.study_plots import heatmap_figure

    frame = pd.DataFrame({"point": range(4), "status": "ok", "parallelism.pp": [4, 8, 4, 8],
                          "cluster.nodes": [128, 128, 256, 256], "mfu": [0.423, 0.404, 0.400, 0.382]})
    texts = {text.get_text(): text.get_color() for text in heatmap_figure(frame, "parallelism.pp", "cluster.nodes",
                                                                          "mfu").axes[0].texts}
    assert texts == {"42.3": "black", "40.4": "white", "40": "white", "38.2": "white"}  # MFU in percent


def test_a_sweep_charts_axes_carry_their_units_without_exponents_or_offsets():
    """Llama 3 8B over ddp.bucket x micro_batch: each axis names its unit (bytes and seconds in the unit that fits,
    fractions in percent), ticks are plain numbers (no '1e10' offset, no 1.4360 to 1.4395 without a unit, no 0.5552
    for a share), the legend goes by size (1, 25, 100 MiB, not as text sorts them) and the heatmap's cells read whole
    tokens/s (not '9.1e+04' for 91,043 and 91,060 alike). A per-second column takes the unit its largest value
    reaches, as the goodput chart's axis does: tokens_per_s reads 91.04 in k tokens/s. The label says the column in
    words, not 'step_time_s (ms)', seconds and milliseconds at once (the title keeps the name)."""
    from simulator.report.study_plots import heatmap_figure, sweep_figure

    frame = pd.DataFrame({"status": "ok", "bucket": ["1 MiB", "100 MiB", "25 MiB"] * 2, "m": [1, 1, 1, 2, 2, 2],
                          "traffic_bytes_per_gpu.dp": [42_159_763_456.0] * 6,
                          "exposed_comm_s.dp": [0.04342, 0.04339, 0.04342, 0.04336, 0.04333, 0.04336],
                          "mfu": [0.5552, 0.5553, 0.5552, 0.5566, 0.5567, 0.5566],
                          "tokens_per_s": [91043.0, 91060.0, 91043.0, 91268.0, 91284.0, 91268.0]})
    expected = {"traffic_bytes_per_gpu.dp": "traffic per GPU, DP (GiB)",
                "exposed_comm_s.dp": "exposed communication, DP (ms)", "mfu": "MFU (%)",
                "tokens_per_s": "throughput (k tokens/s)"}
    for column, label in expected.items():
        figure = sweep_figure(frame, "m", column, hue="bucket")
        figure.draw_without_rendering()
        ax = figure.axes[0]
        assert ax.get_ylabel() == label
        assert ax.get_title() == f"{column} vs m by bucket"  # the name --y takes, where the label is in words
        assert ax.yaxis.get_offset_text().get_text() == ""
        assert all("e" not in tick.get_text() for tick in ax.get_yticklabels())
    assert [text.get_text() for text in ax.get_legend().get_texts()] == [
        "bucket = 1 MiB", "bucket = 25 MiB", "bucket = 100 MiB"]
    assert "91.25" in [tick.get_text() for tick in ax.get_yticklabels()]
    heatmap = heatmap_figure(frame, "m", "bucket", "tokens_per_s")
    assert sorted(text.get_text() for text in heatmap.axes[0].texts) == ["91.04", "91.04", "91.06", "91.27",
                                                                       "91.27", "91.28"]
    assert heatmap.axes[1].get_ylabel() == "throughput (k tokens/s)"


def test_a_metric_no_simulated_point_knows_is_refused_not_drawn(tmp_path, capsys):
    """A sweep of traces without op shapes does not know hfu, so `plot sweep --y hfu` draws no line of zeros. Unknown in
    every simulated point (a point that failed may lack it too), the chart is refused, nothing to plot; a sweep table
    has no column for a metric no point knows, and the refusal of a missing column says that."""
    from simulator.report.study_plots import sweep_figure

    frame = pd.DataFrame({"point": [0, 1, 2], "status": ["ok", "ok", "error"], "m": [1, 2, 4],
                          "step_time_s": [0.01, 0.02, None], "hfu": [None, None, None]})
    with pytest.raises(ScenarioError, match="column 'hfu' has no value in any simulated point: nothing to plot"):
        sweep_figure(frame, "m", "hfu")
    frame.drop(columns="hfu").to_parquet(tmp_path / "results.parquet")
    assert main(["plot", "sweep", str(tmp_path), "--x", "m", "--y", "hfu"]) == 2
    assert ("--y: no column 'hfu' (allowed: a column of the table: point, status, m, step_time_s; a metric no point "
            "has a value for, such as the hfu of traces without op shapes, has none)") in capsys.readouterr().err


def test_a_heatmap_cell_whose_metric_is_unknown_reads_n_a_and_the_title_counts_it():
    """A zip sweep of a trace without op shapes and one with them: the heatmap of hfu shows the unknown cell as 'n/a'
    and the title counts the point, where the other trace's row and column would otherwise vanish without a word; a
    cell no point falls in stays blank."""
    from simulator.report.study_plots import heatmap_figure

    frame = pd.DataFrame({"status": "ok", "nodes": [1, 2], "trace": ["plain", "shaped"], "hfu": [None, 0.25]})
    heatmap = heatmap_figure(frame, "nodes", "trace", "hfu")
    ax = heatmap.axes[0]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["1", "2"]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["plain", "shaped"]
    assert sorted((text.get_position(), text.get_text()) for text in ax.texts) == [((0, 0), "n/a"),
                                                                                   ((1, 1), "25")]
    assert ax.get_title().endswith("\n1 point has no hfu (n/a)")


@pytest.mark.parametrize("statuses, oom", [(["ok", "ok", "out_of_memory"], [False, False, True]),
                                           (["ok", "ok", "ok"], [False, False, True])])
def test_a_heatmap_cell_out_of_memory_reads_oom_and_the_title_counts_it(statuses, oom):
    """A point out of memory has no throughput to chart: its cell reads 'OOM' and the title counts it; a folder
    written before the status out_of_memory (status ok, `oom` true) is read the same."""
    from simulator.report.study_plots import heatmap_figure, sweep_figure

    frame = pd.DataFrame({"status": statuses, "tp": [1, 2, 4], "mb": [1, 1, 2], "oom": oom,
                          "tokens_per_s": [100.0, 200.0, 900.0]})
    ax = heatmap_figure(frame, "tp", "mb", "tokens_per_s").axes[0]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["1", "2", "4"]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["1", "2"]
    assert sorted((text.get_position(), text.get_text()) for text in ax.texts) == [
        ((0, 0), "100"), ((1, 0), "200"), ((2, 1), "OOM")]
    assert ax.get_title().endswith("\n1 point out of memory (OOM), not drawn")
    ax = sweep_figure(frame, "tp", "tokens_per_s").axes[0]
    assert list(ax.lines[0].get_xdata()) == [1, 2]
    assert ax.get_title() == "tokens_per_s vs tp\n1 point out of memory (OOM), not drawn"


@pytest.mark.parametrize("chart", [["sweep", "--x", "tp", "--y", "tokens_per_s"],
                                   ["heatmap", "--x", "tp", "--y", "mb", "--value", "tokens_per_s"]])
def test_a_chart_of_a_sweep_without_an_ok_point_is_refused(tmp_path, capsys, chart):
    """A sweep with no point of status ok is refused (exit 2), naming the statuses, not drawn as an empty chart."""
    pd.DataFrame({"point": [0, 1, 2], "status": ["out_of_memory", "ok", "skipped"], "error": "", "tp": [1, 2, 4],
                  "mb": [1, 1, 2], "oom": [True, True, None], "tokens_per_s": [100.0, 200.0, None]}
                 ).to_parquet(tmp_path / "results.parquet")
    assert main(["plot", *chart[:1], str(tmp_path), *chart[1:], "--out", str(tmp_path / "c.png")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"no point has status ok (2 out_of_memory, 1 skipped: see {tmp_path}/results.csv) (allowed: a sweep "
        "folder with a point of status ok)")
    assert not (tmp_path / "c.png").exists()


def test_heatmap_cells_that_differ_read_differently():
    """Scaled into k tokens/s, cells of 91,041 and 91,044 tokens/s both read '91.04' at four significant digits
    (in whole tokens/s they had read apart): the cells take as many more digits as distinct values need, and
    no more than the axis's four where those suffice (the 8B sweep's cells above)."""
    from simulator.report.study_plots import heatmap_figure

    frame = pd.DataFrame({"status": "ok", "bucket": ["1 MiB", "25 MiB"] * 2, "m": [1, 1, 2, 2],
                          "tokens_per_s": [91041.0, 91044.0, 91262.0, 91268.0]})
    heatmap = heatmap_figure(frame, "m", "bucket", "tokens_per_s")
    assert sorted(text.get_text() for text in heatmap.axes[0].texts) == ["91.041", "91.044", "91.262", "91.268"]
    assert heatmap.axes[1].get_ylabel() == "throughput (k tokens/s)"


def test_heatmap_cells_apart_by_float_noise_alone_widen_no_cell():
    """Two cells apart only in the 16th digit (means of replications) read alike at the six-digit cap; they
    counted as distinct, so every cell grew to six digits ('1,500.00') trying to tell them apart."""
    from simulator.report.column_units import cell_texts

    assert cell_texts([1500.0, 2500.0, 3500.0, 3500.0000000001]) == ["1,500", "2,500", "3,500", "3,500"]
    assert cell_texts([91041.0, 91044.0, 91044.00000000001]) == ["91,041", "91,044", "91,044"]


def test_a_log_x_axis_places_quantities_by_size_and_reads_plain_numbers():
    """`--log-x` over ddp.bucket (1 MiB, 25 MiB, 100 MiB) places quantities at their sizes, ticked as written, not texts
    at category places 0, 1, 2 (ticks '2^0' and '2^1', the first point at log(0), off the chart); over micro_batch
    (1, 2) numbers read 1, 2, not '2^0', '2^1'; a column of texts that are not quantities is refused at --log-x."""
    from simulator.errors import ScenarioError
    from simulator.report.study_plots import sweep_figure

    frame = pd.DataFrame({"status": "ok", "bucket": ["1 MiB", "100 MiB", "25 MiB"] * 2, "m": [1, 1, 1, 2, 2, 2],
                          "step_time_s": [1.4397, 1.4394, 1.4397, 1.4361, 1.4359, 1.4361]})
    figure = sweep_figure(frame, "bucket", "step_time_s", hue="m", log_x=True)
    figure.draw_without_rendering()
    ax = figure.axes[0]
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["1 MiB", "25 MiB", "100 MiB"]
    assert list(ax.get_lines()[0].get_xdata()) == [2.0**20, 25 * 2.0**20, 100 * 2.0**20]
    figure = sweep_figure(frame, "m", "step_time_s", hue="bucket", log_x=True)
    figure.draw_without_rendering()
    shown = [tick.get_text() for tick in figure.axes[0].get_xticklabels()]
    assert {"1", "2"} <= set(shown) and not any("^" in text or text.endswith(".0") for text in shown)
    with pytest.raises(ScenarioError, match="neither numbers nor quantities"):
        sweep_figure(frame.assign(bucket=["a", "b", "c"] * 2), "bucket", "step_time_s", log_x=True)


@pytest.mark.parametrize("chart, folder, told", [
    ("gantt", "search", "a layout search's folder: its chart is `trainsim plot front`"),
    ("memory", "sweep", "a sweep's folder: its charts are `trainsim plot sweep`, `heatmap` and `busbw`"),
    ("goodput", "run", "a run's folder: its charts are `trainsim plot gantt` and `memory`"),
    ("front", "sweep", "a sweep's folder: its charts are `trainsim plot sweep`, `heatmap` and `busbw`"),
])
def test_a_chart_given_another_commands_folder_names_its_charts(tmp_path, capsys, chart, folder, told):
    """`plot gantt` of a search's folder, `plot memory` of a sweep's and `plot goodput` of a run's each say what the
    folder is and which charts read it, not 'this run wrote no summary.json', 'has no manifest.json (not a complete
    trainsim run ...)' or 'has no study.json'."""
    candidates = pd.DataFrame({"label": ["a"], "status": ["simulated"], "peak_memory_gib": [40.0],
                               "tokens_per_s": [1.0], "tree_choice": [False], "searched": True})
    paths = {"search": tmp_path / "search", "sweep": tmp_path / "sweep", "run": tmp_path / "run"}
    write_run_folder(paths["search"], {"scenario": "s.yaml"},
                     lambda stage: candidates.to_parquet(stage / "candidates.parquet"))
    paths["sweep"].mkdir()
    pd.DataFrame({"point": [0], "status": ["ok"]}).to_parquet(paths["sweep"] / "results.parquet")
    write_run_folder(paths["run"], {"scenario": "s.yaml"},
                     lambda stage: [(stage / name).write_text("{}") for name in ("summary.json", "timeline.parquet")])
    assert main(["plot", chart, str(paths[folder])]) == 2
    assert f"OUTDIR: {told} (allowed: " in capsys.readouterr().err


@pytest.mark.parametrize(("column", "values", "label"), [
    ("bottleneck.largest_loss.share_of_step", [0.127, 0.2], "bottleneck, largest loss, share of step (%)"),
    ("ettr_ci95_low", [0.906], "ETTR 95% CI low (%)"), ("ettr_ci95_high", [0.909], "ETTR 95% CI high (%)"),
    ("exposed_comm_s.dp", [0.0, 0.0], "exposed communication, DP (s)"),
    ("traffic_bytes_per_gpu.dp", [0.0], "traffic per GPU, DP (B)"),
    ("failures.gpu.rate_per_unit_per_h", [1e-5], "failures, GPU, rate (per unit per h)"),
    ("time_s.restart_s.mean", [1.8e6], "time, restart, mean (d)"),
    ("slow_steps_by_cause_s.throttle.mean", [1.4e4], "slow steps by cause, throttle, mean (h)"),
])
def test_every_column_reads_in_its_unit_as_its_siblings_do(column, values, label):
    """Before: share_of_step plotted 0.127 while the bottleneck's other shares read %, the ETTR bounds 0.906
    beside ettr's 90.7 %, a seconds column of zeros '(ns)' and a byte one '(B)' by luck, rate_per_unit_per_h no
    unit at all; a job sweep's time_s.restart_s.mean 'time s, restart, mean (d)'."""
    from simulator.report.column_units import column_scale

    assert column_scale(column, values).label(column) == label


def test_a_narrow_heatmaps_title_fits_its_figure_clear_of_the_colour_bar():
    """`plot heatmap` of a job sweep (restart.spares x checkpoint.interval, two values each, the mode varying
    too) has a two-line title wider than a 3.4 in figure of two columns: the figure widens (and grows) to hold
    it within its edges and clear of the colour bar's label."""
    from simulator.report.study_plots import heatmap_figure

    frame = pd.DataFrame({"point": range(8), "status": ["ok"] * 8, "restart.spares": [0, 0, 0, 0, 8, 8, 8, 8],
                          "checkpoint.interval": ["5 min", "20 min"] * 4,
                          "checkpoint.mode": ["sync", "sync", "async", "async"] * 2,
                          "goodput_tokens_per_s.mean": [3.85e5, 3.84e5, 3.86e5, 3.84e5, 1.269e6, 1.265e6, 1.271e6,
                                                        1.265e6]})
    figure = heatmap_figure(frame, "restart.spares", "checkpoint.interval", "goodput_tokens_per_s.mean")
    figure.draw_without_rendering()
    ax, colorbar = figure.axes
    title, label = ax.title.get_window_extent(), colorbar.yaxis.label.get_window_extent()
    assert "mean of up to 2 points per cell" in ax.get_title()
    assert 0 <= title.x0 and title.x1 <= figure.bbox.width
    assert not title.overlaps(label)


def test_the_front_of_a_search_stopped_before_any_simulation_is_refused_and_the_title_counts_the_stopped(
        tmp_path, capsys):
    """The front of a search stopped before its first simulation is refused, not drawn as an empty chart, and a
    front's title counts its `stopped` layouts."""
    from simulator.report.study_plots import front_figure

    candidates = pd.DataFrame({"label": ["a", "b", "c"], "status": ["pruned", "stopped", "stopped"],
                               "peak_memory_gib": [None, 40.0, 50.0], "tokens_per_s": None, "tree_choice": False,
                               "searched": True})
    write_run_folder(tmp_path / "search", {"scenario": "s.yaml"},
                     lambda stage: candidates.to_parquet(stage / "candidates.parquet"))
    assert main(["plot", "front", str(tmp_path / "search")]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'search'}: OUTDIR: no layout was simulated (3 layouts: 0 simulated, 1 pruned, 0 failed, "
        "2 stopped) (allowed: "
        "a folder written by `trainsim search ... --out DIR` (candidates.parquet and its manifest.json) where at "
        "least one layout simulated)\n")
    one = candidates.assign(status=["pruned", "simulated", "stopped"], tokens_per_s=[None, 1e5, None])
    assert front_figure(one).axes[0].get_title() == (
        "layout search of 3 layouts: 1 simulated, 1 pruned, 0 failed, 1 stopped")


def test_the_front_counts_the_searched_space_and_names_the_trees_layout_outside_it_apart(tmp_path, capsys):
    """The searched space of two layouts, both pruned, and the decision tree's layout outside it, simulated for
    the comparison: the title counts the space as the search's text does (2 layouts, 0 simulated) and names the
    tree's layout apart, on lines that stay inside the chart; where the tree's layout was not simulated either,
    the refusal counts the same way."""
    from simulator.report.study_plots import front_figure

    tree = "TP1 CP1 PP1 DP8 mb1 zero1 recompute=none"
    candidates = pd.DataFrame({"label": ["TP1 CP1 PP1 DP8 mb1 zero0 recompute=none",
                                         "TP1 CP1 PP1 DP8 mb2 zero0 recompute=none", tree],
                               "status": ["pruned", "pruned", "simulated"], "peak_memory_gib": [None, None, 75.1],
                               "tokens_per_s": [None, None, 91219.0], "tree_choice": [False, False, True],
                               "searched": [True, True, False]})
    figure = front_figure(candidates)
    title = figure.axes[0].title
    assert title.get_text().replace("\n", " ") == (
        f"layout search of 2 layouts: 0 simulated, 2 pruned, 0 failed (+ the tree's {tree}, outside the space: "
        "simulated)")
    figure.savefig(tmp_path / "front.png")
    extent = title.get_window_extent()
    assert 0 <= extent.x0 and extent.x1 <= figure.bbox.width
    write_run_folder(tmp_path / "search", {"scenario": "s.yaml"}, lambda stage: candidates.assign(
        status=["pruned", "stopped", "pruned"], tokens_per_s=None).to_parquet(stage / "candidates.parquet"))
    assert main(["plot", "front", str(tmp_path / "search")]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: {tmp_path / 'search'}: OUTDIR: no layout was simulated (2 layouts: 0 simulated, 1 pruned, 0 failed, "
        f"1 stopped (+ the tree's {tree}, outside the space: pruned)) (allowed: ")
