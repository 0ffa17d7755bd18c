"""A real GPU trace: one training step profiled with torch.profiler on an H200 (scenarios/trace-h200-step.yaml,
made by benchmarks/gpu_kernels.py), replayed, with its GEMMs re-costed by the H200's kernel model."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from shared import REPO, SCENARIOS

from simulator import simulate
from simulator.catalog.gpus import catalog_gpu_of
from simulator.config.loader import scenario_from_text
from simulator.workload.traces.model import attention_key_length, kernel_kind

SCENARIO = SCENARIOS / "trace-h200-step.yaml"
TRACE = SCENARIOS / "traces" / "h200-step" / "rank0.json.gz"
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
    assert {kinds[name] for name in kinds if "sdpa" in name} == {"attention"}
    assert {kinds[name] for name in kinds if "cudnn::fusion" in name} == {"elementwise"}  # its memory helpers
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
    """A preset's MFU counts 6 x the weights that multiply plus causal attention (workload/training.py:
    model_flops_per_token): 549,453,312 FLOPs per token here, MFU 28.0%. 6 x all 116.0M parameters, the 32.8M
    embedding table (a lookup, no matmul) among them, plus unmasked attention, 12 l d s, would give 796,392,960 and
    an MFU of 40.7%, above any the GPU can reach with its matrix multiplies alone (HFU >= 25.5% counts 499 MFLOP of
    GEMMs per token)."""
    import yaml

    step = json.loads(MEASURED.read_text())["profiled_step"]
    embedding_table = step["vocab"] * step["width"]
    expected = 6 * (step["parameters"] - embedding_table) + 6 * step["layers"] * step["width"] * step["seq"]
    assert yaml.safe_load(SCENARIO.read_text())["workload"]["model_flops_per_token"] == expected == 549_453_312
    summary = replay(False).summary
    assert summary["mfu"] == pytest.approx(0.2805, abs=5e-4)
    assert summary["hfu"] < summary["mfu"] < summary["hfu"] * 1.15  # the GEMMs, and causal attention besides


def test_replicating_the_one_traced_rank_is_refused_in_the_singular():
    """`--set workload.dp=8` on the one-rank H200 step is refused in the singular ('its 1 rank is ...', not 'its 1 ranks
    are TP 1 x CP 1 x PP 1')."""
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError) as refused:
        simulate(scenario_from_text(SCENARIO.read_text() + "  dp: 8\n", source=str(SCENARIO)))
    assert "(its 1 rank is TP 1 x CP 1 x PP 1)" in str(refused.value)


@cache
def moved_to_h100(traced_gpu: str, trace: str = ""):
    """The bundled scenario on one H100 SXM, its trace stated as taken on ``traced_gpu`` (and read from ``trace`` where
    given)."""
    text = SCENARIO.read_text().replace("gpu_model: h200", "gpu_model: h100-sxm") + f"  traced_gpu: {traced_gpu}\n"
    if trace:
        text = text.replace("traces/h200-step/rank0.json.gz", trace)
    return simulate(scenario_from_text(text, source=str(SCENARIO)))


def traced_durations(part: str) -> list[float]:
    """The traced durations (s) of the step's GPU kernels and memsets whose names hold ``part``, sorted."""
    events = json.loads(gzip.decompress(TRACE.read_bytes()))["traceEvents"]
    return sorted(event["dur"] * 1e-6 for event in events
                  if event.get("cat") in ("kernel", "gpu_memset") and part in event["name"])


def replayed_durations(result, part: str) -> list[float]:
    frame = result.timeline[result.timeline["name"].str.contains(part, regex=False)]
    return sorted((frame["end_s"] - frame["start_s"]).tolist())


# The ratios of the bounding rates, H200 over H100 SXM (vendor datasheets: 989 TFLOP/s dense bf16 both, HBM 4.8
# and 3.35 TB/s; kernels.yaml: sustained clocks 1.0 and 0.848, matmul achievable 0.710 and 0.803, memory
# fractions 0.890 and 0.88, and the causal attention tables in TFLOP/s by key length, the H100's backward its
# non-causal one times cuDNN's causal / non-causal ratio, that at 4k keys held below 4k)
MATMUL = 0.710 * 1.0 / (0.803 * 0.848)
MEMORY = 4.8e12 * 0.890 / (3.35e12 * 0.88)
H100_CAUSAL = 443.6 / 517.3
FORWARD_2K = 461.5 / (484 * 0.848)
BACKWARD_2K = 371.7 / (465 * H100_CAUSAL * 0.848)
RAMP_S = 2e-6
"""The H200's and the H100's ramp of every kernel kind (kernels.yaml <gemm|attention|memory>.ramp_time_s): a
kernel's time within it is launch and tail, which no rate shortens."""


def ramped(ratio: float) -> Callable[[float], float]:
    """A kernel's traced duration on the H100: its time beyond the ramp moved by ``ratio``."""
    return lambda duration: duration if duration <= RAMP_S else RAMP_S + (duration - RAMP_S) * ratio


streamed = ramped(MEMORY)
"""A memory-bound kernel's move."""


# One kernel family of each class and pass, with its traced duration's move onto the H100
MOVED = {
    "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN": ramped(MATMUL),
    "sdpa_sm90_flash_fprop": ramped(FORWARD_2K),
    "sdpa_sm90_flash_bprop": ramped(BACKWARD_2K),
    "cunn_SoftMaxForward": streamed,
    "compute_dot_do_o": streamed,  # cuDNN's attention backward helpers stream memory
    "convert_dq_to_16bits": streamed,
    "Memset (Device)": streamed,  # 0.7 to 1.5 us: within the ramp, unmoved
}


def test_the_h200_trace_moved_to_an_h100_scales_each_kernel_by_what_bounds_it():
    """Moved by the bf16 peaks alone, every kernel kept its H200 duration on the H100 (the same 989 TFLOP/s),
    though the memory-bound ones stream at 3.35 against 4.8 TB/s. Then attention moved by the best forward
    rates, at 32k keys on the H200 and 16k on the H100 (1.288), where this step runs 2,048 keys (1.124 forward,
    1.099 backward); cuDNN's dO.O and dQ helpers moved as attention, and kernels shorter than the ramp by the
    bandwidth ratio."""
    result = moved_to_h100("h200")
    move = result.summary["trace"]["gpu_move"]
    assert (move["from"], move["to"]) == ("h200", "h100-sxm")
    classes = move["classes"]
    assert {kind: entry["ops"] for kind, entry in classes.items()} == {"matmul": 51, "attention": 8,
                                                                      "memory-bound": 210 + 8 + 49, "unknown": 0}
    assert [(entry["precision"], entry["duration_ratio"]) for entry in classes["matmul"]["rates"]] == \
        [("bf16", pytest.approx(MATMUL, rel=1e-9))]
    assert [(entry["pass"], entry["key_length"], entry["key_length_from"], entry["ops"], entry["duration_ratio"])
            for entry in classes["attention"]["rates"]] == [
        ("backward", 2048, "trace", 4, pytest.approx(BACKWARD_2K, rel=1e-9)),
        ("forward", 2048, "trace", 4, pytest.approx(FORWARD_2K, rel=1e-9))]
    memory = classes["memory-bound"]
    assert memory["rates"][0]["duration_ratio"] == pytest.approx(MEMORY, rel=1e-9)
    assert memory["rate_unit"] == "B/s" and memory["rates"][0]["traced_gpu_rate"] == pytest.approx(4.8e12 * 0.890)
    assert all(entry["ramp_time_s"] == {"from": RAMP_S, "to": RAMP_S} for entry in classes.values())
    assert memory["ops_within_ramp"] == 80
    assert (classes["matmul"]["ops_within_ramp"], classes["attention"]["ops_within_ramp"]) == (0, 0)
    for part, moved in MOVED.items():
        traced = traced_durations(part)
        assert traced and replayed_durations(result, part) == pytest.approx([moved(d) for d in traced], rel=1e-9)


def test_the_printed_table_of_a_moved_trace_says_from_which_gpu_and_by_how_much(tmp_path, capsys):
    """The table of the H200 step on an H100 has a row that names both GPUs and each class's kernels with its factor,
    not only 'trace on dgx-h100 (1 h100-sxm GPU)' with the move in summary.json alone."""
    from simulator.cli import main

    assert main(["run", str(SCENARIO), "--set", "cluster.gpu_model=h100-sxm", "--set", "workload.traced_gpu=h200",
                 "--out", str(tmp_path / "out")]) == 0
    words = " ".join(capsys.readouterr().out.split())  # the row as a terminal of any width wraps it
    assert ("step time 20.21 ms moved from h200 to h100-sxm: 51 GEMMs x1.043, 8 attention x1.099-1.124, "
            "267 memory-bound x1.449 throughput") in words
    assert main(["run", str(SCENARIO), "--out", str(tmp_path / "plain")]) == 0
    assert " moved " not in capsys.readouterr().out


def test_a_moved_trace_with_recost_gemms_counts_its_gemms_as_re_costed_not_scaled(tmp_path, capsys):
    """With `recost_gemms` the 51 GEMMs take the H100's kernel model, not their H200 time x1.043, yet the moved
    row and summary.json's `trace.gpu_move` counted them as scaled: the move counts only what it scales, and the
    row says how many were re-costed."""
    from simulator.cli import main

    assert main(["run", str(SCENARIO), "--set", "cluster.gpu_model=h100-sxm", "--set", "workload.traced_gpu=h200",
                 "--set", "workload.recost_gemms=true", "--out", str(tmp_path / "out")]) == 0
    words = " ".join(capsys.readouterr().out.split())
    assert ("moved from h200 to h100-sxm: 51 GEMMs re-costed, 8 attention x1.099-1.124, 267 memory-bound x1.449 "
            "throughput") in words
    trace = json.loads((tmp_path / "out" / "summary.json").read_text())["trace"]
    assert trace["recosted_gemms"] == 51
    assert {kind: entry["ops"] for kind, entry in trace["gpu_move"]["classes"].items()} == {
        "matmul": 0, "attention": 8, "memory-bound": 267, "unknown": 0}


def trace_with_keys(folder: Path, dims: Callable[[list], list]) -> str:
    """The bundled trace written into ``folder`` with each attention op's `Input Dims` replaced by ``dims`` of
    them; its path."""
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    for event in doc["traceEvents"]:
        if event.get("cat") == "cpu_op" and "attention" in event["name"]:
            event["args"]["Input Dims"] = dims(event["args"]["Input Dims"])
    path = folder / "rank0.json"
    path.write_text(json.dumps(doc))
    return str(path)


def log_linear(length: float, points: tuple[tuple[float, float], tuple[float, float]]) -> float:
    """The value at ``length`` between two (key length, value) points, linear in log2 of the length."""
    (x0, y0), (x1, y1) = points
    return y0 + (math.log2(length) - math.log2(x0)) / (math.log2(x1) - math.log2(x0)) * (y1 - y0)


def test_attention_moves_at_the_key_length_its_launching_op_records(tmp_path):
    """3,000 keys (the step's shapes, their sequence axis rewritten): both GPUs' rates log-interpolated between
    the tables' 2k and 4k points, as the roofline reads them."""
    path = trace_with_keys(tmp_path, lambda dims: [d[:2] + [3000] + d[3:] if len(d) == 4 else d for d in dims])
    result = moved_to_h100("h200", path)
    forward = log_linear(3000, ((2048, 461.5), (4096, 516.0))) / (
        log_linear(3000, ((2048, 484.0), (4096, 518.0))) * 0.848)
    backward = log_linear(3000, ((2048, 371.7), (4096, 436.4))) / (
        log_linear(3000, ((2048, 465.0), (4096, 499.0))) * H100_CAUSAL * 0.848)
    rates = result.summary["trace"]["gpu_move"]["classes"]["attention"]["rates"]
    assert [(entry["pass"], entry["key_length"], entry["key_length_from"], entry["duration_ratio"])
            for entry in rates] == [("backward", 3000, "trace", pytest.approx(backward, rel=1e-9)),
                                    ("forward", 3000, "trace", pytest.approx(forward, rel=1e-9))]
    for part, ratio in (("sdpa_sm90_flash_fprop", forward), ("sdpa_sm90_flash_bprop", backward)):
        assert replayed_durations(result, part) == pytest.approx([ramped(ratio)(d) for d in traced_durations(part)],
                                                                 rel=1e-9)


@pytest.mark.parametrize("name, dims, length", [
    ("aten::_scaled_dot_product_cudnn_attention", [[4, 16, 2048, 64], [4, 16, 3000, 64], [4, 16, 3000, 64]], 3000),
    ("aten::_cudnn_attention_backward", [[4, 16, 2048, 64]] * 2 + [[4, 16, 3000, 64]] * 2, 3000),
    ("aten::_flash_attention_forward", [[4, 2048, 16, 64], [4, 3000, 16, 64], [4, 3000, 16, 64]], 3000),
    ("flash_attn::_flash_attn_backward", [[4, 2048, 16, 64]] * 2 + [[4, 3000, 16, 64]] * 2, 3000),
    ("aten::_flash_attention_forward", [[8192, 16, 64], [8192, 16, 64], [8192, 16, 64], [5], [5]], 0),
    ("aten::mm", [[4, 16, 2048, 64], [4, 16, 3000, 64]], 0),
])
def test_the_key_length_is_the_key_operands_sequence_axis(name, dims, length):
    """The SDPA ops take (batch, heads, length, head dim), the flash kernels' own ops (batch, length, heads,
    head dim), a backward's first operand is the output's gradient; a variable-length batch (3-d, packed) and an
    op that is not attention tell none."""
    assert attention_key_length(name, dims) == length


def test_attention_of_untold_key_length_moves_at_the_longest_both_tables_measure(tmp_path):
    """Shapes not recorded: the forward at 16k keys (the H100's longest), the backward at 32k (the H200's; the
    H100's causal backward runs to 64k, its non-causal 16k figure held beyond), said 'assumed'."""
    result = moved_to_h100("h200", trace_with_keys(tmp_path, lambda dims: []))
    rates = result.summary["trace"]["gpu_move"]["classes"]["attention"]["rates"]
    assert [(entry["pass"], entry["key_length"], entry["key_length_from"], entry["duration_ratio"])
            for entry in rates] == [
        ("backward", 32768, "assumed", pytest.approx(530.6 / (516 * 499.7 / 536.2 * 0.848), rel=1e-9)),
        ("forward", 16384, "assumed", pytest.approx(566.4 / (539 * 0.848), rel=1e-9))]


def chakra_attention(folder: Path) -> Path:
    """A Chakra trace (a JSON array of nodes) of one rank's attention as Chakra's converter writes it: each kernel
    with its launching op as a control dependency, each op with the Python text of its operands' shapes. The
    forward op (flash, (batch, heads, length, head dim)) and the backward op (its first operand the output's
    gradient) record 3,000 keys, 2,048 queries; a third kernel has no launching op."""
    def op(node: int, name: str, shapes: list, caller: int | None = None) -> dict:
        return {"id": node, "name": name, "type": "COMP_NODE", "durationMicros": 5,
                "ctrlDeps": [] if caller is None else [caller],
                "inputs": {"values": "[]", "shapes": str(shapes), "types": "[]"},
                "attr": [{"name": "is_cpu_op", "boolVal": True}]}

    def kernel(node: int, name: str, launcher: int | None) -> dict:
        return {"id": node, "name": name, "type": "COMP_NODE", "durationMicros": 500,
                "ctrlDeps": [] if launcher is None else [launcher], "attr": [{"name": "is_cpu_op", "boolVal": False}]}

    query, key = [4, 16, 2048, 64], [4, 16, 3000, 64]
    nodes = [op(1, "aten::scaled_dot_product_attention", []),
             op(2, "aten::_scaled_dot_product_flash_attention", [query, key, key, [], [], []], caller=1),
             kernel(3, "flash_fwd_kernel", 2),
             op(4, "aten::_scaled_dot_product_flash_attention_backward", [query, query, key, key, [], []]),
             kernel(5, "flash_bwd_dq_dk_dv_loop_kernel", 4),
             kernel(6, "flash_fwd_kernel", None)]
    path = folder / "rank0.json"
    path.write_text(json.dumps(nodes))
    return path


def test_a_chakra_attention_kernel_moves_at_the_key_length_its_launching_op_records(tmp_path):
    """A Chakra trace moved from an H200 to an H100 SXM: the flash kernels launched by SDPA ops that record their
    shapes move at the 3,000 keys those record (the forward's op inside aten::scaled_dot_product_attention, which
    records none), as a Kineto trace's do; the kernel without a launching op at the forward's longest common length,
    16k, 'assumed'. The SDPA ops themselves are CPU ops: host time, neither moved nor counted among the moved ops."""
    path = chakra_attention(tmp_path)
    text = (f"cluster: {{topology: dgx-h100, gpus: 1, gpu_model: h100-sxm}}\n"
            f"workload: {{trace: '{path}', format: chakra-json, traced_gpu: h200}}\n")
    result = simulate(scenario_from_text(text, source=str(tmp_path / "scenario.yaml")))
    forward = log_linear(3000, ((2048, 461.5), (4096, 516.0))) / (
        log_linear(3000, ((2048, 484.0), (4096, 518.0))) * 0.848)
    backward = log_linear(3000, ((2048, 371.7), (4096, 436.4))) / (
        log_linear(3000, ((2048, 465.0), (4096, 499.0))) * H100_CAUSAL * 0.848)
    rates = result.summary["trace"]["gpu_move"]["classes"]["attention"]["rates"]
    assert [(entry["pass"], entry["key_length"], entry["key_length_from"], entry["ops"], entry["duration_ratio"])
            for entry in rates] == [("backward", 3000, "trace", 1, pytest.approx(backward, rel=1e-9)),
                                    ("forward", 3000, "trace", 1, pytest.approx(forward, rel=1e-9)),
                                    ("forward", 16384, "assumed", 1, pytest.approx(566.4 / (539 * 0.848), rel=1e-9))]
    timeline = result.timeline
    moved = timeline[timeline["name"] == "flash_bwd_dq_dk_dv_loop_kernel"]
    assert list(moved["end_s"] - moved["start_s"]) == pytest.approx([ramped(backward)(500e-6)], rel=1e-9)
    host = timeline[timeline["name"].str.startswith("aten::")]
    assert len(host) == 3 and list(host["end_s"] - host["start_s"]) == pytest.approx([5e-6] * 3, rel=1e-9)


def test_a_replay_on_the_traced_gpu_is_unchanged_by_naming_it():
    """traced_gpu naming the cluster's own GPU moves nothing: every ratio is 1 and the timeline is the one
    without it, value for value (a memory-bound kernel's ramp split off and added back, unrounded); its
    attention is read at the key length its launching ops record, 2,048."""
    text = SCENARIO.read_text()
    plain = simulate(scenario_from_text(text, source=str(SCENARIO)))
    named = simulate(scenario_from_text(text + "  traced_gpu: h200\n", source=str(SCENARIO)))
    assert named.timeline.equals(plain.timeline)
    assert named.summary["step_time_s"] == plain.summary["step_time_s"]
    classes = named.summary["trace"]["gpu_move"]["classes"]
    assert {entry["duration_ratio"] for kind in classes.values() for entry in kind["rates"]} == {1.0}
    assert {(entry["key_length"], entry["key_length_from"]) for entry in classes["attention"]["rates"]} == \
        {(2048, "trace")}
    assert "gpu_move" not in plain.summary["trace"]


def test_a_trace_replayed_on_another_gpu_without_traced_gpu_warns_naming_the_gpu_it_ran_on():
    """The bundled trace's header names its GPU (`deviceProperties: [{'name': 'NVIDIA H200', ...}]`). Replayed on an
    H100 SXM without `traced_gpu` it keeps the H200's kernel times (16.23 ms, where moved it takes 20.21 ms) under
    the H100's name: it warns at that field, naming the GPU and the setting that moves the kernels; nothing is said
    on an H200 or with `traced_gpu` given."""
    text = SCENARIO.read_text()
    on_h100 = simulate(scenario_from_text(text, source=str(SCENARIO), overrides=["cluster.gpu_model=h100-sxm"]))
    assert [warning for warning in on_h100.summary["warnings"] if "deviceProperties" in warning] == [
        f"{TRACE}: deviceProperties[0].name: the trace ran on an NVIDIA H200, the cluster's GPU is h100-sxm: its "
        "kernels keep the traced GPU's durations (set workload.traced_gpu: h200 to move them)"]
    moved = simulate(scenario_from_text(text, source=str(SCENARIO), overrides=["cluster.gpu_model=h100-sxm",
                                                                               "workload.traced_gpu=h200"]))
    for result in (replay(False), moved):
        assert not any("deviceProperties" in warning for warning in result.summary["warnings"])


@pytest.mark.parametrize("device, gpu", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
                                         ("NVIDIA H100 PCIe", None), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
                                         ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA B200", "b200"),
                                         ("NVIDIA GB200", "gb200"), ("NVIDIA L40S", None),
                                         ("NVIDIA H100 NVL", None), ("NVIDIA GH200 480GB", None)])
def test_a_cuda_device_name_is_its_catalog_gpu(device, gpu):
    """The H100 NVL (a PCIe card of 94 GB at 3.9 TB/s) read as the H100 SXM; the GH200's H100 (96 or 144 GB)
    is no catalog GPU either."""
    assert catalog_gpu_of(device) == gpu
