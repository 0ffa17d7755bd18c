"""The schedule's own bubble beside the measured one: `schedule_bubble_fraction` is the ideal executor's bubble
(schedules/timing.py) for the run's schedule with the run's pass times, so it is the closed form at uniform
stages, and the measured `bubble_fraction` exceeds it by the waits."""

from __future__ import annotations

import pytest

from simulator.console.report import _bubble_text
from simulator.metrics.summary import bottleneck
from simulator.schedules.registry import build_schedule, closed_form_bubble
from simulator.schedules.timing import simulate_schedule

SYNTHETIC = """
cluster: {{topology: dgx-h100-cluster, nodes: 1}}
model: {{synthetic: {{stages: 4, forward: 1 ms, backward: 2 ms{p2p}}}}}
training: {{microbatches: 8}}
parallelism: {{pp: 4, dp: 2, pipeline: {{schedule: {schedule}, virtual_stages: {v}}}}}
collectives: {{sm_contention: none}}
run: {{timeline: summary}}
"""

MODEL = """
cluster: {{topology: dgx-h100-cluster, nodes: 1}}
model: {{layers: 8, hidden: 2048, heads: 16, kv_heads: 4, vocab: 32000}}
training: {{seq_len: 2048, microbatches: 8, precision: bf16}}
parallelism: {{tp: 2, pp: 4, pipeline: {{schedule: {schedule}, virtual_stages: {v}}}}}
run: {{timeline: summary}}
"""


@pytest.mark.parametrize(("schedule", "v", "closed_form"), [("1f1b", 1, 3 / 11), ("interleaved", 2, 3 / 19)])
def test_the_schedules_bubble_is_the_closed_form_at_uniform_stages(run_yaml, schedule, v, closed_form):
    """1F1B at p = 4, m = 8: (p-1)/(m+p-1) = 3/11; interleaved at v = 2: (p-1)/(m v+p-1) = 3/19. Hand-offs are
    free, so nothing waits and the measured bubble is the schedule's."""
    summary = run_yaml(SYNTHETIC.format(p2p="", schedule=schedule, v=v)).summary
    assert summary["schedule_bubble_fraction"] == pytest.approx(closed_form, rel=1e-9)
    assert summary["bubble_fraction"] == pytest.approx(closed_form, rel=1e-9)


@pytest.mark.parametrize(("schedule", "v"), [("zb-h1", 1), ("dualpipev", 2), ("zbv", 2), ("interleaved-zb", 2)])
def test_split_backward_schedules_bubble_is_the_executors_at_uniform_stages(run_yaml, schedule, v):
    """Zero-bubble schedules at p = 4, m = 8 with F = B = W = 1 ms a stage: the ideal executor's bubble for the
    same schedule. zb-h1 and DualPipeV mix whole backwards (BW) with split ones (B ... W) on a stage, so their B
    is the backward's input-grad part, not all of it (zb-h1 1/9, not 0.2; DualPipeV 1/17, not 0.147)."""
    summary = run_yaml(SYNTHETIC.format(p2p="", schedule=schedule, v=v)).summary
    ideal = simulate_schedule(build_schedule(schedule, 4, 8, v), 1e-3, 1e-3, 1e-3, v=v).bubble_fraction
    assert summary["schedule_bubble_fraction"] == pytest.approx(ideal, rel=1e-9)
    assert summary["bubble_fraction"] == pytest.approx(ideal, rel=1e-9)


@pytest.mark.parametrize(("schedule", "v", "alone", "measured"), [("zb-h1", 1, 0.311, 0.339),
                                                                   ("dualpipev", 2, 0.279, 0.305)])
def test_a_models_schedule_bubble_is_at_most_the_measured_one(run_yaml, schedule, v, alone, measured):
    """An 8-layer model at TP 2 x PP 4 on one host: the embedding and head make its stages uneven and its
    hand-offs cross NVLink. The schedule alone, with the run's pass times and no waits, idles no more than the
    run does (zb-h1 31.1% against 33.9%, DualPipeV 27.9% against 30.5%)."""
    summary = run_yaml(MODEL.format(schedule=schedule, v=v)).summary
    assert summary["schedule_bubble_fraction"] == pytest.approx(alone, abs=5e-4)
    assert summary["bubble_fraction"] == pytest.approx(measured, abs=5e-4)
    assert summary["schedule_bubble_fraction"] <= summary["bubble_fraction"]


def test_waits_on_hand_offs_make_the_measured_bubble_larger_than_the_schedules(run_yaml):
    """512 MB hand-offs between stages over NVLink: the stages wait on them, which the measured bubble counts
    and the schedule's (the executor without hand-off time) does not: still 3/11 with the same passes. The
    console row gives both, and the part of the step's bubble spent on the exposed hand-offs beyond the
    schedule's own (30.4% of 57.7%), which the verdict ranks as exposed PP communication (34.5%), not again as
    bubble (27.3% without it), bound by the GPU-NVSwitch links."""
    summary = run_yaml(SYNTHETIC.format(p2p=", p2p_bytes: 512 MB", schedule="1f1b", v=1)).summary
    assert summary["schedule_bubble_fraction"] == pytest.approx(3 / 11, rel=1e-9)
    assert summary["bubble_fraction"] > summary["schedule_bubble_fraction"] + 0.2
    measured, alone = (f"{100 * summary[key]:.1f}%" for key in ("bubble_fraction", "schedule_bubble_fraction"))
    assert _bubble_text(summary).startswith(
        f"{measured} of the pipeline window (idle on the compute stream, waits included; the schedule alone {alone}; "
        "27.3% at uniform stages = (p-1)/(m+p-1) = 3/11)")
    evidence = summary["bottleneck"]["evidence"]
    on_comm = evidence["bubble_share"] - summary["schedule_bubble_fraction"]  # one window: the step's
    assert evidence["bubble_on_exposed_comm_share"] == pytest.approx(on_comm, rel=1e-9)
    assert _bubble_text(summary).endswith(
        f"{measured} of the whole step, of which {100 * on_comm:.1f}% waiting on exposed communication")
    # The exposed PP loss is bound by NVLink (c9ddc19a reads a link over the transfers crossing it): stage 1's GPU
    # sends 8 forward and 8 backward hand-offs, 16 x 512 MB = 8.192 GB over its 450 GB/s NVSwitch link, which at the
    # usable 82.2% (370 GB/s) take 22.1 ms; the transfers crossing it span 23.1 ms, so 78.9% of line rate, within
    # the binding margin of the usable rate.
    pp = summary["link_tiers"]["by_kind"]["pp"]
    assert pp["binding"] == ["gpu-nvswitch"] and pp["tiers"]["gpu-nvswitch"]["bytes"] == 16 * 512e6
    assert summary["bottleneck"]["verdict"] == (
        "communication-bound (exposed communication 34.5% of the step > 30.0%); largest single loss: exposed PP "
        "communication, 34.5% of the step; PP transfers bound by the GPU-NVSwitch links (the busiest, "
        "h0/gpu1->h0/nvswitch, at 78.9% of line rate while they run, usable 82.2%)")


def test_the_verdict_names_the_schedules_bubble_only_where_it_reads_apart():
    """A measured bubble within 0.1% of the schedule's alone (20.21% against 20.24%) is named by its share of
    the step alone; one larger by waits (20.2% against 6.2%) gives both shares of the window, and one with no
    schedule's bubble, or of one pipeline stage (a compute idle), neither."""
    comm = {"exposed_union_s": 0.0, "wait_s": 0.2, "host_s": 0.0}
    losses = {"pipeline_bubble": 0.198, "optimizer": 0.01}

    def verdict(bubble: float, schedule: float | None, stages: int = 16) -> str:
        return bottleneck(1.0, comm, {}, 0.0, bubble, losses, pipeline_stages=stages,
                          schedule_bubble=schedule)["verdict"]

    assert verdict(0.202, 0.0617) == ("compute-bound; largest single loss: pipeline bubble, 19.8% of the step (20.2% "
                                      "of the pipeline window, the schedule alone 6.2%)")
    assert verdict(0.2021, 0.2024) == "compute-bound; largest single loss: pipeline bubble, 19.8% of the step"
    assert verdict(0.202, None) == "compute-bound; largest single loss: pipeline bubble, 19.8% of the step"
    assert verdict(0.202, 0.0617, stages=1) == "compute-bound; largest single loss: compute idle, 19.8% of the step"


def test_a_summary_without_the_schedules_bubble_still_prints_its_row():
    """A summary.json without `schedule_bubble_fraction` prints the measured bubble alone."""
    summary = {"bubble_fraction": 0.202, "bottleneck": {"loss_shares": {"pipeline_bubble": 0.198}}}
    assert _bubble_text(summary) == ("20.2% of the pipeline window (idle on the compute stream, waits included), "
                                     "19.8% of the whole step")


def test_a_slow_head_stage_is_what_lifts_the_bubble_above_the_closed_form(run_yaml):
    """The 8-layer model at p = 4, m = 8 under 1F1B: 2 layers a stage, the last with the 32,000-word output
    layer. At uniform stages the schedule's bubble is (p-1)/(m+p-1) = 3/11 exactly. With the run's stages
    (busy b_0..b_3, the last slowest) 1F1B's critical path is the first forward down the pipeline, the last
    stage's m passes back to back and the last backward up: (sum b + (m-1) b_3) / m, so the bubble is
    1 - mean(b) / that = 39.9%; the last stage is b_3 / mean(b_0..b_2) - 1 = 49.7% slower than the others, and
    the row says so."""
    summary = run_yaml(MODEL.format(schedule="1f1b", v=1)).summary
    busy, m = [summary["stage_busy_s"][str(stage)] for stage in range(4)], 8
    assert summary["uniform_stage_bubble_fraction"] == pytest.approx(3 / 11, rel=1e-9)
    critical_path = (sum(busy) + (m - 1) * busy[3]) / m
    assert summary["schedule_bubble_fraction"] == pytest.approx(1 - sum(busy) / 4 / critical_path, rel=1e-9)
    assert summary["schedule_bubble_fraction"] == pytest.approx(0.399, abs=5e-4)
    slower = busy[3] / (sum(busy[:3]) / 3) - 1
    assert slower == pytest.approx(0.497, abs=5e-4)
    assert ("the schedule alone 39.9%; 27.3% at uniform stages = (p-1)/(m+p-1) = 3/11: the last stage, with the "
            "output layer, is 49.7% slower than the others' mean), ") in _bubble_text(summary)


def test_interleaved_closed_form_and_the_rank_that_lifts_the_bubble():
    """Interleaved at p = 4, m = 8, v = 2 reads (p-1)/(v m+p-1) = 3/19 at uniform stages; a rank of several
    stages is named with them: looped, rank 3 holds stages 3 and 7 (the output layer); in the V placement
    rank 0 holds 0 and 7 (both ends) and rank 3 the middle two, 3 and 4, neither the first nor the last. Even
    stages name no slow rank. The summaries are written by hand: busy 1.0, 1.0, 1.0 and 1.3 s, the slow one
    30.0% slower than the others."""
    layout = {"pp": 4, "microbatches": 8, "virtual_stages": 2, "schedule": "interleaved", "placement": "loop",
              "model": "custom"}
    uneven = {"bubble_fraction": 0.30, "schedule_bubble_fraction": 0.25, "uniform_stage_bubble_fraction": 3 / 19,
              "stage_busy_s": {"0": 1.0, "1": 1.0, "2": 1.0, "3": 1.3}, "layout": layout}
    assert _bubble_text(uneven) == (
        "30.0% of the pipeline window (idle on the compute stream, waits included; the schedule alone 25.0%; 15.8% "
        "at uniform stages = (p-1)/(v m+p-1) = 3/19: pipeline rank 3 (stages 3, 7), with the output layer, is "
        "30.0% slower than the others' mean)")
    v_layout = {**layout, "placement": "v", "schedule": "zbv"}
    first = {**uneven, "stage_busy_s": {"0": 1.3, "1": 1.0, "2": 1.0, "3": 1.0}, "layout": v_layout}
    assert _bubble_text(first).endswith("15.8% at uniform stages: pipeline rank 0 (stages 0, 7), with the embedding "
                                        "and the output layer, is 30.0% slower than the others' mean)")
    middle = {**uneven, "layout": v_layout}
    assert _bubble_text(middle).endswith("15.8% at uniform stages: pipeline rank 3 (stages 3, 4) is 30.0% slower "
                                         "than the others' mean)")
    even = {**uneven, "schedule_bubble_fraction": 3 / 19, "stage_busy_s": dict.fromkeys("0123", 1.0)}
    assert _bubble_text(even).endswith("the schedule alone 15.8%; 15.8% at uniform stages = (p-1)/(v m+p-1) = 3/19)")


@pytest.mark.parametrize(("schedule", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3),
                                             ("looped-bfs", 2), ("looped-bfs", 3)])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_the_closed_form_is_exact_where_the_registry_says(schedule, v, p):
    """The ideal executor at uniform stages (F = 1, B = 2) idles (p-1)/(v m+p-1) of the window for GPipe and
    1F1B at every m, and for interleaved and looped-bfs from m >= p on. Below p each of a rank's v - 1 later
    chunks waits p - m more slots for the first micro-batch to come round: ((p-1) + (v-1)(p-m)) /
    (v m + (p-1) + (v-1)(p-m)), 4/10 = 40% at p = 4, m = 3, v = 2, not 3/9."""
    for m in range(1, 2 * p + 1):
        stages = p * v
        bubble = simulate_schedule(build_schedule(schedule, p, m, v), [1.0] * stages, [2.0] * stages, [0.0] * stages,
                                   v=v).bubble_fraction
        form = closed_form_bubble(schedule, p, m, v)
        assert form is not None and form.exact == (schedule in ("gpipe", "1f1b") or m >= p)
        late = 0 if form.exact else (v - 1) * (p - m)
        assert bubble == pytest.approx((p - 1 + late) / (v * m + p - 1 + late), rel=1e-12)
        assert (form.numerator, form.denominator) == (p - 1, v * m + p - 1)


def test_below_p_micro_batches_the_interleaved_row_gives_no_closed_form(run_yaml):
    """Interleaved at p = 4, m = 3, v = 2 (synthetic stages: 1 ms forward, 2 ms backward): the uniform-stage
    bubble is ((p-1) + (v-1)(p-m)) / (v m + (p-1) + (v-1)(p-m)) = 4/10 = 40.0%, not (p-1)/(v m+p-1) = 3/9, so
    the row writes no closed form beside it."""
    summary = run_yaml(SYNTHETIC.format(p2p="", schedule="interleaved", v=2), "training.microbatches=3").summary
    assert summary["uniform_stage_bubble_fraction"] == pytest.approx(4 / 10, rel=1e-9)
    assert _bubble_text(summary).startswith("40.0% of the pipeline window (idle on the compute stream, waits "
                                            "included; the schedule alone 40.0%; 40.0% at uniform stages), ")
