"""A real GPU trace: one training step profiled with torch.profiler on an H200 (scenarios/trace-h200-step.yaml,
made by benchmarks/gpu_kernels.py), replayed, with its GEMMs re-costed by the H200's kernel model."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest

from simulator import simulate
from simulator.config.loader import scenario_from_text
from simulator.workload.traces.model import kernel_kind

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "trace-h200-step.yaml"
TRACE = REPO / "scenarios" / "traces" / "h200-step" / "rank0.json.gz"
MEASURED = REPO / "benchmarks" / "results" / "h200-2026-12-04.json"
LAYERS, LINEARS, PASSES = 4, 4, 3


@cache
def kernels() -> tuple[str, ...]:
    events = json.loads(gzip.decompress(TRACE.read_bytes()))["traceEvents"]
    return tuple(event["name"] for event in events if event.get("cat") == "kernel")


@cache
def replay(recost: bool):
    """The bundled scenario run as it is, or with `workload.recost_gemms` (its workload section comes last)."""
    text = SCENARIO.read_text() + ("  recost_gemms: true\n" if recost else "")
    return simulate(scenario_from_text(text, source=str(SCENARIO)))


def test_every_kernel_of_a_hopper_training_step_has_its_kind():
    kinds = {name: kernel_kind(name) for name in kernels()}
    assert len(kernels()) == 277 and all(kinds.values())
    assert {kinds[name] for name in kinds if name.startswith("nvjet_sm90")} == {"matmul"}
    assert {kinds[name] for name in kinds if "sdpa" in name or "cudnn::fusion" in name} == {"attention"}
    assert {kinds[name] for name in kinds if "GammaBeta" in name or "radix_sort" in name} == {"elementwise"}


def test_the_replay_takes_the_traced_step_a_little_over_the_unprofiled_one():
    result = replay(False)
    traced = result.summary["trace"]["traced_step_time_s"]
    assert result.summary["step_time_s"] == pytest.approx(traced, rel=1e-3)
    assert result.summary["trace"]["unknown_kernels"] == 0
    unprofiled = json.loads(MEASURED.read_text())["profiled_step"]["step_wall_median_s"]
    assert 1.0 < result.summary["step_time_s"] / unprofiled < 1.02    # +1.6%: the profiler's own cost


def test_recost_gemms_recosts_each_gemm_kernel_once_and_nothing_else():
    traced, recosted = replay(False), replay(True)
    assert recosted.summary["trace"]["recosted_gemms"] == LAYERS * LINEARS * PASSES + PASSES  # and the head's
    frame = recosted.timeline
    shaped = frame[frame["flops"] > 0]
    assert len(shaped) == 51 and shaped["name"].str.startswith("nvjet_sm90").all()
    model = float((shaped["end_s"] - shaped["start_s"]).sum())
    before = traced.timeline.loc[shaped.index]
    assert (before["name"] == shaped["name"]).all()
    measured = float((before["end_s"] - before["start_s"]).sum())
    # steady rates at the power limit against a short step's GEMMs near the boost clock: 6.28 against 5.31 ms
    assert model / measured == pytest.approx(1.184, abs=0.01)
    others = frame["flops"] == 0
    assert ((frame["end_s"] - frame["start_s"])[others].to_numpy() ==
            pytest.approx((traced.timeline["end_s"] - traced.timeline["start_s"])[others].to_numpy(), rel=1e-9))


def test_model_flops_per_token_follows_the_convention_of_a_presets_mfu():
    """The scenario stated 796,392,960 FLOPs per token: 6 x all 116.0M parameters, the 32.8M embedding table (a
    lookup, no matmul) among them, plus unmasked attention, 12 l d s. A preset's MFU counts 6 x the weights
    that multiply plus causal attention (workload/training.py: model_flops_per_token), and by that count the
    MFU it printed, 40.7%, was above any the GPU can reach with its matrix multiplies alone (HFU >= 25.5%
    counts 499 MFLOP of GEMMs per token against the stated 796). Now 549,453,312: MFU 28.0%."""
    import yaml

    step = json.loads(MEASURED.read_text())["profiled_step"]
    embedding_table = step["vocab"] * step["width"]
    expected = 6 * (step["parameters"] - embedding_table) + 6 * step["layers"] * step["width"] * step["seq"]
    assert yaml.safe_load(SCENARIO.read_text())["workload"]["model_flops_per_token"] == expected == 549_453_312
    summary = replay(False).summary
    assert summary["mfu"] == pytest.approx(0.2805, abs=5e-4)
    assert summary["hfu"] < summary["mfu"] < summary["hfu"] * 1.15  # the GEMMs, and causal attention besides


def test_replicating_the_one_traced_rank_is_refused_in_the_singular():
    """`--set workload.dp=8` on the one-rank H200 step was refused with 'its 1 ranks are TP 1 x CP 1 x PP 1'."""
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError) as refused:
        simulate(scenario_from_text(SCENARIO.read_text() + "  dp: 8\n", source=str(SCENARIO)))
    assert "(its 1 rank is TP 1 x CP 1 x PP 1)" in str(refused.value)


@cache
def moved_to_h100(traced_gpu: str):
    """The bundled scenario on one H100 SXM, its trace said to be taken on ``traced_gpu``."""
    text = SCENARIO.read_text().replace("gpu_model: h200", "gpu_model: h100-sxm") + f"  traced_gpu: {traced_gpu}\n"
    return simulate(scenario_from_text(text, source=str(SCENARIO)))


def traced_durations(part: str) -> list[float]:
    """The traced durations (s) of the step's GPU kernels and memsets whose names hold ``part``, sorted."""
    events = json.loads(gzip.decompress(TRACE.read_bytes()))["traceEvents"]
    return sorted(event["dur"] * 1e-6 for event in events
                  if event.get("cat") in ("kernel", "gpu_memset") and part in event["name"])


def replayed_durations(result, part: str) -> list[float]:
    frame = result.timeline[result.timeline["name"].str.contains(part, regex=False)]
    return sorted((frame["end_s"] - frame["start_s"]).tolist())


# One kernel family of each class, with the ratio of its bounding rates, H200 over H100 SXM (vendor datasheets:
# 989 TFLOP/s dense bf16 both, HBM 4.8 and 3.35 TB/s; kernels.yaml: matmul achievable 0.710 and 0.801 at
# sustained clocks 1.0 and 0.848, attention forward plateaus 588.6 and 539 of 989 TFLOP/s, memory fractions
# 0.890 and 0.88)
MOVED = {
    "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN": ("matmul", 0.710 * 1.0 / (0.801 * 0.848)),
    "sdpa_sm90_flash_fprop": ("attention", 588.6 * 1.0 / (539 * 0.848)),
    "cunn_SoftMaxForward": ("memory-bound", 4.8e12 * 0.890 / (3.35e12 * 0.88)),
    "Memset (Device)": ("memory-bound", 4.8e12 * 0.890 / (3.35e12 * 0.88)),
}


def test_the_h200_trace_moved_to_an_h100_scales_each_kernel_by_its_class_ratio():
    """Moved by the bf16 peaks alone, every kernel kept its H200 duration on the H100 (the same 989 TFLOP/s),
    though the memory-bound ones stream at 3.35 against 4.8 TB/s."""
    result = moved_to_h100("h200")
    move = result.summary["trace"]["gpu_move"]
    assert (move["from"], move["to"]) == ("h200", "h100-sxm")
    counts = {kind: entry["ops"] for kind, entry in move["classes"].items()}
    assert counts == {"matmul": 51, "attention": 16, "memory-bound": 210 + 49, "unknown": 0}
    for part, (kind, ratio) in MOVED.items():
        assert move["classes"][kind]["duration_ratio"] == pytest.approx(ratio, rel=1e-9)
        traced = traced_durations(part)
        assert traced and replayed_durations(result, part) == pytest.approx([d * ratio for d in traced], rel=1e-9)
    assert move["classes"]["memory-bound"]["rate_unit"] == "B/s"
    assert move["classes"]["memory-bound"]["traced_gpu_rate"] == pytest.approx(4.8e12 * 0.890, rel=1e-9)
    assert move["classes"]["unknown"]["duration_ratio"] == 1.0


def test_a_replay_on_the_traced_gpu_is_unchanged_by_naming_it():
    """traced_gpu naming the cluster's own GPU moves nothing: every class's ratio is 1 and the timeline is the
    one without it, value for value."""
    text = SCENARIO.read_text()
    plain = simulate(scenario_from_text(text, source=str(SCENARIO)))
    named = simulate(scenario_from_text(text + "  traced_gpu: h200\n", source=str(SCENARIO)))
    assert named.timeline.equals(plain.timeline)
    assert named.summary["step_time_s"] == plain.summary["step_time_s"]
    assert {entry["duration_ratio"] for entry in named.summary["trace"]["gpu_move"]["classes"].values()} == {1.0}
    assert "gpu_move" not in plain.summary["trace"]
