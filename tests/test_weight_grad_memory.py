"""Deferred weight gradients hold memory: what W keeps from B to W (Zero Bubble, Qi et al., ICLR 2024, Table 1:
M_W = 32 s b h per GPT layer against M_B = 34 s b h + 5 a s^2 b), the peak that follows each rank's order, the
memory timeline that shows it, and Gantt rows labelled by rank and the stages it holds."""

from __future__ import annotations

import pytest
from shared import GIB, SCENARIOS

from simulator.catalog.models import get_model
from simulator.report.gantt import gantt_figure, pipeline_passes
from simulator.report.memory_timeline import memory_figure, memory_timeline
from simulator.report.outputs import compute_stream_work, pipeline_actions, stage_of, stage_representatives
from simulator.schedules.registry import build_schedule
from simulator.schedules.timing import peak_held_weight, peak_in_flight, transient_excess
from simulator.workload.memory import (
    activation_bytes_per_layer,
    head_activation_bytes,
    head_weight_grad_bytes,
    weight_grad_bytes_per_layer,
)
from simulator.workload.transformer import ShardShape


def test_gpt_layer_weight_grad_memory_is_the_papers_32_sbh():
    # GEMM inputs h (QKV) + h (projection) + h (FC1) + 4h (FC2) and output gradients 3h + h + 4h + h, 2 bytes each.
    model = get_model("megatron-145.6b")
    s, b, h = 2048, 2, model.hidden
    shard = ShardShape(b, s)
    assert weight_grad_bytes_per_layer(model, shard) == pytest.approx(32 * s * b * h, rel=1e-12)
    # The paper's M_W <= M_B: 32 s b h against 34 s b h (+ 5 a s^2 b without flash attention).
    assert weight_grad_bytes_per_layer(model, shard) < activation_bytes_per_layer(model, shard, "selective")


def test_llama_layer_weight_grad_memory_by_hand():
    # Llama 3 8B (GQA 8 of 32 heads, SwiGLU), per token: QKV input h and output gradient h + 2 h/4, projection
    # input h and output gradient h, gate/up input h and output gradient 2f, down input f and output gradient h.
    model = get_model("llama3-8b")
    h, f = 4096, 14336
    per_token = 2 * (h + (h + 2 * h / 4) + h + h + h + 2 * f + f + h)
    assert weight_grad_bytes_per_layer(model, ShardShape(1, 8192)) == pytest.approx(8192 * per_token, rel=1e-12)


@pytest.mark.parametrize("w", [0.5, 32 / 34, 1.0, 2.0])
def test_zb_h1_peak_follows_the_order(w):
    """zb-h1 at p = 4, m = 8 (orders in docs/schedules.md): rank r >= 1 defers the W of its first r backwards
    until the cool-down, so after its last forward it holds p - r forwards' activations and r deferred weight
    gradients, (p - r) + r w chunk activations with w = M_W / M_B; its first cool-down B, run before the
    oldest W, trades one forward's activations for one more W's: (p - r - 1) + (r + 1) w, the peak when w > 1.
    Rank 0 runs whole BWs. 1F1B holds p - r."""
    p, m = 4, 8
    zb = [peak_held_weight(actions, [1.0], [w]) for actions in build_schedule("zb-h1", p, m, 1)]
    one_f_one_b = [peak_held_weight(actions, [1.0], [w]) for actions in build_schedule("1f1b", p, m, 1)]
    assert one_f_one_b == [4.0, 3.0, 2.0, 1.0]
    by_hand = [float(p)] + [max((p - r) + r * w, (p - r - 1) + (r + 1) * w) for r in range(1, p)]
    assert zb == pytest.approx(by_hand, rel=1e-12)
    assert all(zb[r] > one_f_one_b[r] for r in range(1, p))
    # The paper: ZB-H1's peak (over ranks) equals 1F1B's, p M_B, which holds because M_W <= M_B; with full
    # recompute (M_B only the layer input) the deferred W's inputs push rank p-1 above rank 0.
    assert (max(zb) == max(one_f_one_b)) == (w <= 1.0)
    assert [peak_in_flight(actions) for actions in build_schedule("zb-h1", p, m, 1)] == [4, 3, 2, 1]


@pytest.mark.parametrize(("schedule", "w", "excess"), [
    ("1f1b", 1.0, 0.25), ("1f1b", 16.0, 0.25), ("zb-h1", 1.0, 0.25), ("zb-h1", 16.0, 0.0), ("zb-h1", 1.2, 0.05),
])
def test_a_layer_being_recomputed_adds_to_the_peak_only_where_it_is_live(schedule, w, excess):
    """A pass holds the layer it recomputes (0.25 of a chunk here) on top of what is stored: a forward at its
    end, a backward at its start. 1F1B peaks after a forward, so all of it adds; zb-h1's last rank (p = 4,
    m = 8) with deferred W's of 16 chunks' worth (full recompute) peaks after a B, when no layer is being
    recomputed, 4 w = 64 against 3 w + 1 + 0.25 after its last forward: nothing adds. At w = 1.2, 4.8 after
    the B against 3.6 + 1 + 0.25 = 4.85 after the forward: 0.05."""
    last = build_schedule(schedule, 4, 8, 1)[3]
    assert transient_excess(last, [1.0], [w], [0.25]) == pytest.approx(excess, abs=1e-12)


def test_full_recompute_does_not_raise_a_zero_bubble_peak_set_by_deferred_weight_gradients():
    """Llama 3 70B, torchtitan's PP 2 x FSDP 2 x TP 8 under zb-h1: the last stage's peak is two deferred W's,
    2 x 19.48 GiB, with or without recompute, so full recompute leaves its 96.46 GiB; counting the recomputed
    layer on top made it 96.71. Under 1F1B the layer is live at
    the peak and counted: stage 1's buffers grow by it."""
    from simulator.config.loader import load_scenario
    from simulator.preflight import validate
    from simulator.topology.loader import scenario_topology

    def stages(*overrides: str) -> list[dict]:
        loaded = load_scenario(SCENARIOS / "llama3-70b-torchtitan-pp-fsdp.yaml",
                               list(overrides))
        return validate(loaded, scenario_topology(loaded)).memory["memory_per_stage"]

    zb = {rc: stages("parallelism.pipeline.schedule=zb-h1", f"training.recompute={rc}")[1]
          for rc in ("none", "full")}
    assert zb["full"]["activations_gib"] == zb["none"]["activations_gib"] == pytest.approx(2 * 19.479, abs=1e-3)
    assert zb["full"]["total_gib"] == pytest.approx(zb["none"]["total_gib"], rel=1e-12)
    assert zb["full"]["total_gib"] == pytest.approx(96.46, abs=0.005)
    one_f_one_b = {rc: stages(f"training.recompute={rc}")[1] for rc in ("none", "full")}
    assert one_f_one_b["full"]["buffers_gib"] - one_f_one_b["none"]["buffers_gib"] == pytest.approx(0.24609375,
                                                                                                     rel=1e-9)


GPT_ZB_H1 = """
cluster: {topology: dgx-h100}
model: {preset: megatron-1.7b}
training: {seq_len: 1024, micro_batch: 1, microbatches: 8}
parallelism: {pp: 4, dp: 2, pipeline: {schedule: zb-h1}}
"""


def test_zb_h1_step_memory_and_timeline(run_yaml):
    """The summary's activations per stage are the hand count from the order, and each rank's memory timeline
    peaks at the summary's total."""
    result = run_yaml(GPT_ZB_H1)
    model, shard = get_model("megatron-1.7b"), ShardShape(1, 1024)
    layers = model.layers // 4
    held = layers * activation_bytes_per_layer(model, shard, "selective")
    kept = layers * weight_grad_bytes_per_layer(model, shard)
    stages = result.summary["memory_per_stage"]
    for r in range(3):
        assert stages[r]["activations_gib"] * GIB == pytest.approx((4 - r) * held + r * kept, rel=1e-12)
    last_held = held + head_activation_bytes(model, shard)
    last_kept = kept + head_weight_grad_bytes(model, shard)
    assert stages[3]["activations_gib"] * GIB == pytest.approx(max(last_held + 3 * last_kept, 4 * last_kept),
                                                           rel=1e-12)
    assert stages[3]["weight_grad_per_virtual_stage_gib"] == {"3": pytest.approx(last_kept / GIB, rel=1e-12)}
    for rank in stage_representatives(result.timeline, result.summary):
        curve = memory_timeline(result.timeline, result.summary, rank)
        entry = next(e for e in stages if e["stage"] == stage_of(result.summary, rank))
        assert curve["bytes"].max() / GIB == pytest.approx(entry["total_gib"], rel=1e-12)


ZBV = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b}
training: {seq_len: 1024, micro_batch: 1, microbatches: 8}
parallelism: {pp: 4, dp: 2, pipeline: {schedule: zbv, virtual_stages: 2}}
"""


def test_zbv_gantt_rows_name_the_rank_and_its_stages(run_yaml):
    """In the V rank r holds stages r and 2p - 1 - r; each pass's chunk is its stage's place in that list."""
    result = run_yaml(ZBV)
    figure = gantt_figure(result.timeline, result.summary)
    rows = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert rows == ["rank 0: stages 0, 7", "rank 1: stages 1, 6", "rank 2: stages 2, 5", "rank 3: stages 3, 4"]
    # two chunks on each rank, one on each stage (the title said "2 chunks/stage"): the schedule's v2
    assert ", zbv v2, 8 micro-batches — bubble " in figure.axes[0].get_title()
    assert gantt_figure(result.timeline, result.summary, by="rank", ranks=[5]).axes[0].get_yticklabels()[
        0].get_text() == "rank 5: stages 1, 6"
    work = compute_stream_work(result.timeline, 1)
    passes = pipeline_passes(pipeline_actions(work), 2, [1, 6])
    stage_of_op = work[work["category"].isin(["forward", "backward", "weight_grad"])]
    assert set(stage_of_op["chunk"]) == {1, 6}
    for chunk, stage in ((0, 1), (1, 6)):
        ops = stage_of_op[stage_of_op["chunk"] == stage]
        assert (passes["chunk"] == chunk).sum() == len(pipeline_passes(pipeline_actions(ops), 2, [1, 6]))
    assert sorted(set(passes["chunk"])) == [0, 1]


def test_zbv_memory_legend_names_both_stages_of_each_rank(run_yaml):
    """A rank of the V holds stages r and 2p - 1 - r and its curve is the memory of both: the legend named one
    ("rank 1 (stage 1)"), which read as half the model's layers on that GPU."""
    result = run_yaml(ZBV)
    figure = memory_figure(result.timeline, result.summary)
    labels = [text.get_text() for text in figure.legends[0].get_texts()][:-1]
    assert [label.split(", peak")[0] for label in labels] == [
        "rank 0 (stages 0, 7)", "rank 1 (stages 1, 6)", "rank 2 (stages 2, 5)", "rank 3 (stages 3, 4)"]
    unfolded = run_yaml(ZBV, "run.fold=false")
    named = memory_figure(unfolded.timeline, unfolded.summary, ranks=[5]).legends[0].get_texts()[0].get_text()
    assert named.startswith("rank 5 (stages 1, 6), peak ")


@pytest.mark.parametrize(("virtual_stages", "held"), [(2, ["0, 4", "1, 5", "2, 6", "3, 7"]),
                                                      (4, ["0, 4, 8, 12", "1, 5, 9, 13", "2, 6, 10, 14",
                                                           "3, 7, 11, 15"])])
def test_interleaved_memory_legend_names_every_stage_of_each_rank(run_yaml, virtual_stages, held):
    """Interleaved, rank r holds stages r, r + p, ...: the legend names them all, as the Gantt rows do."""
    result = run_yaml(ZBV.replace("zbv", "interleaved"), f"parallelism.pipeline.virtual_stages={virtual_stages}")
    labels = [text.get_text() for text in memory_figure(result.timeline, result.summary).legends[0].get_texts()]
    assert [label.split(", peak")[0] for label in labels[:-1]] == [f"rank {r} (stages {s})" for r, s in enumerate(held)]
