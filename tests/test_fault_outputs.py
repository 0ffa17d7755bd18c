"""A step's faults as its outputs show them: the Gantt chart's fault lines and straggler labels, the trace's
"faults" track and slowed GPUs' thread names, and faults.parquet beside the timeline."""

from __future__ import annotations

import json

import matplotlib
import pandas as pd
import pytest
from shared import SCENARIOS

from simulator import load_scenario, simulate
from simulator.cli import main
from simulator.report.fault_marks import fault_marks, fault_rows, slowdown_notes
from simulator.report.gantt import gantt_figure
from simulator.report.outputs import load_run_outputs

matplotlib.use("Agg")

FAULTS_SCENARIO = SCENARIOS / "faults-straggler-and-spine-link.yaml"
"""Four one-GPU servers in data parallel: GPU 1 at x2, leaf0.r0-spine0 down 5 ms into the step."""
LINK_DOWN_S = 5e-3


@pytest.fixture(scope="module")
def faulted_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults") / "run"
    assert main(["run", str(FAULTS_SCENARIO), "--out", str(out)]) == 0
    return out


def test_the_gantt_draws_a_line_at_a_link_fault_and_labels_the_slowed_rank(faulted_run):
    """The link going down at 5 ms is a vertical line at 5 (the axis is in ms) with a legend entry naming it, and
    GPU 1's row gives its factor; the healthy rows say nothing of one. Zoomed to the first 4 ms, the fault is
    outside: no line and no legend entry."""
    outputs = load_run_outputs(faulted_run)
    figure = gantt_figure(outputs.timeline, outputs.summary, by="rank")
    ax = figure.axes[0]
    lines = [line for line in ax.get_lines() if line.get_gid() == "fault:link down"]
    assert [list(line.get_xdata()) for line in lines] == [[5.0, 5.0]]
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "link down: leaf0.r0-spine0 at 5 ms" in legend
    labels = [label.get_text() for label in ax.get_yticklabels()]
    assert labels == ["rank 0 (stage 0)", "rank 1 (stage 0, x2 slower)", "rank 2 (stage 0)", "rank 3 (stage 0)"]
    zoomed = gantt_figure(outputs.timeline, outputs.summary, by="rank", window=(0.0, 4e-3))
    assert not [line for line in zoomed.axes[0].get_lines() if str(line.get_gid()).startswith("fault:")]
    assert not any("link down" in text.get_text() for text in zoomed.legends[0].get_texts())


def test_the_trace_has_an_instant_event_at_the_fault_and_names_the_slowed_gpu(faulted_run):
    """trace.json holds a "faults" process with one instant event at 5,000 us, and GPU 1's threads say x2."""
    events = json.loads((faulted_run / "trace.json").read_text())["traceEvents"]
    instants = [event for event in events if event["ph"] == "i"]
    assert [(event["name"], event["ts"]) for event in instants] == [("link down leaf0.r0-spine0", LINK_DOWN_S * 1e6)]
    processes = {event["pid"]: event["args"]["name"] for event in events if event["name"] == "process_name"}
    assert processes[instants[0]["pid"]] == "faults"
    threads = [event["args"]["name"] for event in events if event["name"] == "thread_name"]
    assert "GPU 1 compute (x2 slower)" in threads
    assert "GPU 0 compute" in threads


def test_faults_parquet_lists_the_straggler_and_the_link_fault(faulted_run, tmp_path):
    """faults.parquet beside the timeline: the straggler from 0 s with its factor, the link at 5 ms at capacity
    0; timeline.parquet keeps only ops and flows. A healthy run writes none, and no "faults" process in its
    trace."""
    faults = pd.read_parquet(faulted_run / "faults.parquet")
    assert faults["until_s"].isna().all()  # the straggler is slow throughout, the link stays down
    assert faults.drop(columns="until_s").to_dict("records") == [
        {"kind": "straggler", "at_s": 0.0, "what": "GPU 1", "gpu": 1, "factor": 2.0, "capacity": 1.0},
        {"kind": "link down", "at_s": LINK_DOWN_S, "what": "leaf0.r0-spine0", "gpu": -1, "factor": 1.0,
         "capacity": 0.0}]
    timeline = pd.read_parquet(faulted_run / "timeline.parquet")
    assert set(timeline["kind"]) == {"compute", "collective", "flow"}
    healthy = tmp_path / "healthy"
    overrides = ["--set", "faults.step.links=[]", "--set", "faults.step.stragglers=[]"]
    assert main(["run", str(FAULTS_SCENARIO), *overrides, "--out", str(healthy)]) == 0
    assert not (healthy / "faults.parquet").exists()
    events = json.loads((healthy / "trace.json").read_text())["traceEvents"]
    assert not [event for event in events if event["ph"] == "i"]


FOLDED_STRAGGLERS = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {layers: 8, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 2048, micro_batch: 1, microbatches: 8}
parallelism: {tp: 2, pp: 2, dp: 4, order: [tp, cp, dp, pp], pipeline: {schedule: 1f1b}}
faults: {step: {stragglers: [{gpus: [0, 8], slowdown: 1.3}]}}
"""


def test_a_folded_gantt_row_of_one_gpu_says_so_in_the_singular_beside_its_factor(tmp_path):
    """GPUs 0 and 8 (replica 0's two stages) at x1.3 fold the other replicas onto classes of unequal size: the
    straggler's row reads 'stands for 1 GPU, x1.3 slower', a class of three 'stands for 3 GPUs'."""
    path = tmp_path / "pp.yaml"
    path.write_text(FOLDED_STRAGGLERS)
    result = simulate(load_scenario(str(path)))
    figure = gantt_figure(result.timeline, result.summary, by="rank")
    labels = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert labels[0] == "rank 0 (stage 0, stands for 1 GPU, x1.3 slower)"
    assert labels[1] == "rank 1 (stage 0, stands for 1 GPU)"
    assert labels[2] == "rank 2 (stage 0, stands for 3 GPUs)"


def test_faults_timed_after_the_step_are_not_marked(tmp_path):
    """A GPU failure at 1 s and a second link down at 1 s, both after the 65.89 ms step's end, changed nothing (a
    GPU failure before the end aborts the step, which writes no outputs): faults.parquet, the trace's instants and
    the Gantt chart's lines (zoomed out to 2 s) hold the 5 ms link alone, and the trace ends with the step (a 1 s
    instant stretched it 15 times), while summary.json's `faults` still lists both."""
    out = tmp_path / "run"
    overrides = ["--set", "faults.step.gpu_failures=[{gpu: 2, at: 1 s}]", "--set",
                 "faults.step.links=[{link: [leaf0.r0, spine0], at: 5 ms}, {link: [leaf1.r0, spine1], at: 1 s}]"]
    assert main(["run", str(FAULTS_SCENARIO), *overrides, "--out", str(out), "--quiet"]) == 0
    outputs = load_run_outputs(out)
    step_s = outputs.summary["step_time_s"]
    assert step_s < 0.1
    assert [failure["at_s"] for failure in outputs.summary["faults"]["gpu_failures"]] == [1.0]
    assert [link["at_s"] for link in outputs.summary["faults"]["links"]] == [LINK_DOWN_S, 1.0]
    faults = pd.read_parquet(out / "faults.parquet")
    assert list(faults["kind"]) == ["straggler", "link down"] and list(faults["at_s"]) == [0.0, LINK_DOWN_S]
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert [event["ts"] for event in events if event["ph"] == "i"] == [LINK_DOWN_S * 1e6]
    assert max(event.get("ts", 0) for event in events) <= step_s * 1e6 * (1 + 1e-9)
    figure = gantt_figure(outputs.timeline, outputs.summary, by="rank", window=(0.0, 2.0))
    lines = [line for line in figure.axes[0].get_lines() if str(line.get_gid()).startswith("fault:")]
    assert [list(line.get_xdata()) for line in lines] == [[LINK_DOWN_S, LINK_DOWN_S]]  # a window in s: the axis too


def test_a_flapping_link_is_marked_at_each_window_with_when_it_comes_back():
    """A link degraded from 5 to 10 ms, every 10 ms, twice: faults.parquet rows at 5 and 15 ms, back at 10 and
    20 ms; one repeating to the step's end is marked at each window that starts before the end; one past the end
    not at all."""
    def marks(link: dict, end_s: float) -> list[float]:
        """The windows' starts and ends in ms, in turn."""
        summary = {"step_time_s": end_s, "faults": {"links": [{"link": "leaf0.r0-spine0", "capacity": 0.5, **link}]}}
        rows = fault_rows(summary)
        assert [mark.at_s for mark in fault_marks(summary)] == rows["at_s"]
        return [1e3 * time for window in zip(rows["at_s"], rows["until_s"]) for time in window]

    flap = {"at_s": 5e-3, "until_s": 10e-3, "every_s": 10e-3}
    assert marks({**flap, "count": 2}, 1.0) == pytest.approx([5, 10, 15, 20], rel=1e-12)
    assert marks(flap, 36e-3) == pytest.approx([5, 10, 15, 20, 25, 30, 35, 40], rel=1e-12)
    assert marks({"at_s": 5e-3, "until_s": 10e-3}, 5e-3) == []


def test_a_slowed_gpus_label_says_a_factor_below_one_is_faster_and_one_near_one_in_full():
    """The Gantt rows' and trace threads' notes read a factor as the console's `step faults` row does: a drawn
    0.939 is faster, not 'x0.939 slower'; 1.001 is not rounded to a nominal-looking 'x1'."""
    summary = {"faults": {"slowed_gpus": {"1": {"factor": 0.939, "swings": []}, "2": {"factor": 1.001, "swings": []},
                                          "3": {"factor": 1.3, "swings": [{"amplitude": 0.01}]}}}}
    assert slowdown_notes(summary) == {1: "x0.939 (faster)", 2: "x1.001 slower", 3: "x1.3 slower and a swing"}
