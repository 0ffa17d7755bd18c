"""Kernel calibration (simulator/catalog/kernels.yaml) against its kernel-level sources, and the TP / DP overlaps
against what their mechanism implies."""

from __future__ import annotations

import dataclasses
import math

import pytest
from shared import SCENARIOS

from simulator.catalog.calibration import kernel_data
from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import ModelSpec, get_model
from simulator.metrics.intervals import uncovered
from simulator.workload.calibrated import calibrated_efficiency, tp_overlap
from simulator.workload.roofline import DEFAULT_RAMP_S, Efficiency, kernel_duration, kernels_duration, wave_efficiency
from simulator.workload.training import optimizer_bytes_per_param
from simulator.workload.transformer import (
    MEASURED_KERNELS,
    AttentionCost,
    Kernel,
    ShardShape,
    head_kernels,
    layer_kernels,
)

PARTS = ("clock", "gemm", "attention", "memory")


def test_every_gpu_constant_names_a_kernel_source():
    data = kernel_data()
    for name, entry in data["gpus"].items():
        for part in PARTS + tuple(part for part in MEASURED_KERNELS if part in entry):
            assert entry[part]["source"] in data["sources"], (name, part)
    assert data["tp_comm_overlap"]["source"] in data["sources"]


def test_the_h100s_clock_ratio_is_the_h200s_and_its_gemm_shares_its_own():
    """msmf measured no H100 sustained clock: the h100-sxm entry holds the H200's ratio (698.6 / 823.9) and names
    it as a transfer. mamf's v2 tables have the H100's own bf16 and fp8 rows (794.5 / 989 and 1402.6 / 1979, one
    run on torch 2.7.0+cu126), which the entry takes, fp16 at the bf16 share."""
    data = kernel_data()
    h100 = data["gpus"]["h100-sxm"]
    assert h100["clock"] == {"sustained_ratio": round(698.6 / 823.9, 3), "source": "msmf-h200-transfer"}
    assert "transfer, not an H100 measurement" in data["sources"]["msmf-h200-transfer"]
    assert h100["gemm"]["achievable"] == {"bf16": round(794.5 / 989, 3), "fp16": round(794.5 / 989, 3),
                                          "fp8": round(1402.6 / 1979, 3)}
    assert h100["gemm"]["source"] == "mamf-v2"
    for figure in ("794.5 of 989", "1402.6 of 1979", "torch 2.7.0+cu126"):
        assert figure in data["sources"]["mamf-v2"]
    assert "transfer" not in data["sources"]["mamf-v2"]


@pytest.mark.parametrize(("gpu", "shares", "figures"), [
    ("a100-40gb", {"bf16": 271.2 / 312, "fp16": 271.2 / 312}, ("271.2 of 312", "torch 2.6.0+cu126")),
    ("b200", {"bf16": 1745.0 / 2250, "fp16": 1745.0 / 2250, "fp8": 3432.5 / 4500},
     ("1745.0 of 2250", "3432.5 of 4500", "torch 2.7.1+cu128")),
])
def test_every_mamf_gemm_share_is_a_row_of_the_v2_tables(gpu, shares, figures):
    """One revision of the MAMF table for every GPU: the v2 tables (cache reset between shapes) have an A100 SXM
    row, 271.2 of 312, where the older v1 table read 267.9, and the B200's bf16 and fp8 rows."""
    data = kernel_data()
    gemm = data["gpus"][gpu]["gemm"]
    assert gemm["achievable"] == {precision: round(share, 3) for precision, share in shares.items()}
    assert gemm["source"] == "mamf-v2"
    for figure in figures:
        assert figure in data["sources"]["mamf-v2"]


def test_the_gb200s_gemm_shares_are_the_b200s_and_its_source_says_so():
    """The MAMF tables' GB200 row (1822.0 of 2500 bf16, 3615.6 of 5000 fp8, a pre-release torch) is not taken: the
    gb200 entry holds the B200's v2 shares under a source of its own that names them and how far the GB200's own
    row reads below them."""
    data = kernel_data()
    gemm, b200 = data["gpus"]["gb200"]["gemm"], data["gpus"]["b200"]["gemm"]
    assert gemm["achievable"] == b200["achievable"] and b200["source"] == "mamf-v2"
    assert gemm["source"] == "mamf-b200-for-gb200"
    source = data["sources"][gemm["source"]]
    shares = b200["achievable"]
    assert f"bf16 and fp16 {shares['bf16']:.3f}, fp8 {shares['fp8']:.3f}" in source
    for precision, row in (("bf16", "1822.0 of 2500"), ("fp8", "3615.6 of 5000")):
        measured, peak = (float(part) for part in row.split(" of "))
        assert row in source
        assert f"{1 - measured / peak / shares[precision]:.1%} below" in source


def test_only_infiniband_has_a_measured_link_efficiency():
    """network/calibration.py's GPU-independent classes say which figure was measured (InfiniBand, nccl-tests)
    and which assumed (Ethernet, PCIe); calibrated() takes their fractions and NVLink's for c2c."""
    from simulator.network.calibration import FIXED, calibrated

    assert {link_class for link_class, fixed in FIXED.items() if fixed.measured} == {"infiniband"}
    efficiency = calibrated("h100-sxm")
    assert {link_class: efficiency[link_class] for link_class in FIXED} == {
        link_class: fixed.fraction for link_class, fixed in FIXED.items()}
    assert efficiency["c2c"] == efficiency["nvlink"] == pytest.approx(370 / 450)


def test_every_kernel_kind_has_a_ramp_that_names_its_source():
    """Each kind's launch and tail time (gemm, attention, memory: the roofline's matmul, attention and elementwise
    kernels) names where it comes from: a fit on that kind's kernel timings, or default-ramp, the unmeasured
    2 us."""
    data = kernel_data()
    for name, entry in data["gpus"].items():
        efficiency = calibrated_efficiency(name)
        for part, kind in (("gemm", "matmul"), ("attention", "attention"), ("memory", "elementwise")):
            assert entry[part]["ramp_source"] in data["sources"], (name, part)
            assert efficiency.ramp(kind) == entry[part]["ramp_time_s"]
            if entry[part]["ramp_source"] == "default-ramp":
                assert entry[part]["ramp_time_s"] == DEFAULT_RAMP_S


def test_a_modelled_b200_memory_bound_kernel_takes_its_own_ramp_not_the_gemm_fit():
    """The B200's 8 us ramp was fitted on cuBLAS GEMM timings alone (gemm-shapes): a modelled memory-bound
    kernel streams its bytes at the HBM fraction and adds the memory kind's ramp, the unmeasured 2 us
    (default-ramp), as a trace moved to a B200 gives it, not the GEMMs' 8 us: a 1 MB copy takes 2.14 us."""
    gpu, efficiency = get_gpu("b200"), calibrated_efficiency("b200")
    copy = Kernel("copy", 0.0, 1e6, "elementwise")
    streaming = 1e6 / (gpu.hbm_bandwidth * kernel_data()["gpus"]["b200"]["memory"]["fraction"])
    assert kernel_duration(copy, gpu, "bf16", efficiency) == pytest.approx(streaming + 2e-6, rel=1e-12)
    gemm = Kernel("gemm", 2.0 * 4096**3, 3 * 2.0 * 4096**2, "matmul", 4096)
    plateau = gpu.peak("bf16") * efficiency.matmul_peak * 4096 / (4096 + 64)
    assert kernel_duration(gemm, gpu, "bf16", efficiency) == pytest.approx(gemm.flops / plateau + 8e-6, rel=1e-12)


@pytest.mark.parametrize(("n", "measured", "tolerance"), [(2048, 1006, 0.03), (4096, 1532, 0.045),
                                                          (8192, 1610, 0.07)])
def test_b200_gemm_follows_cublas_by_shape(n, measured, tolerance):
    # pyptx.dev cuBLAS bf16 timings at the boost clock: the calibrated rate over the sustained ratio.
    gpu, efficiency = get_gpu("b200"), calibrated_efficiency("b200")
    ratio = kernel_data()["gpus"]["b200"]["clock"]["sustained_ratio"]
    gemm = Kernel("gemm", 2.0 * n**3, 3 * 2.0 * n * n, "matmul", n)
    rate = gemm.flops / kernel_duration(gemm, gpu, "bf16", efficiency) / 1e12 / ratio
    assert rate == pytest.approx(measured, rel=tolerance)


def test_large_h100_gemm_runs_at_the_sustained_mamf():
    # 794.5 TFLOP/s (MAMF) x 698.6 / 823.9 (MSMF / MAMF): 673.7 TFLOP/s, less the 64-wide tile factor.
    gpu, efficiency = get_gpu("h100-sxm"), calibrated_efficiency("h100-sxm")
    n = 16384
    gemm = Kernel("gemm", 2.0 * n**3, 3 * 2.0 * n * n, "matmul", n)
    rate = gemm.flops / kernel_duration(gemm, gpu, "bf16", efficiency)
    assert rate == pytest.approx(794.5e12 * 0.848 * n / (n + 64), rel=2e-3)


def test_dense_h100_layer_compute_time_against_kernel_sources():
    # Llama 3 70B layer, TP 8 with SP, 8,192 tokens: GEMMs at the sustained MAMF, causal attention at cuDNN's
    # rates at 8k times the sustained ratio (forward 529 TFLOP/s, FA3 paper; backward the paper's 518 without
    # the mask times cuDNN's measured causal / non-causal 463.5 / 530.4), elementwise kernels at 88% of HBM
    # bandwidth. The model adds the tile factor and 2 us per kernel: 2.7% over.
    gpu, efficiency = get_gpu("h100-sxm"), calibrated_efficiency("h100-sxm")
    ratio = 0.848
    kernels = layer_kernels(get_model("llama3-70b"), ShardShape(1, 8192, tp=8, sequence_parallel=True))
    every = kernels.forward + kernels.backward
    expected = 0.0
    for kernel in every:
        if kernel.kind == "matmul":
            expected += kernel.flops / (794.5e12 * ratio)
        elif kernel.kind == "attention":
            expected += kernel.flops / ((518e12 * 463.5 / 530.4 if kernel.backward else 529e12) * ratio)
        else:
            expected += kernel.hbm_bytes / (0.88 * 3.35e12)
    simulated = sum(kernel_duration(kernel, gpu, "bf16", efficiency) for kernel in every)
    assert simulated == pytest.approx(expected, rel=0.03)
    assert simulated > expected


# Causal attention backward on Hopper: FA3 paper Fig. 6(b), without the mask, (key length, TFLOP/s); cuDNN 9.1
# (cudnn-frontend benchmark_results.csv) with and without the mask at the same shapes.
FA3_BACKWARD_NON_CAUSAL = {512: 305, 1024: 408, 2048: 465, 4096: 499, 8192: 518, 16384: 516}
CUDNN_BACKWARD = {4096: (443.6, 517.3), 8192: (463.5, 530.4), 16384: (497.7, 538.5), 32768: (499.7, 536.2),
                  65536: (503.8, 535.4)}


def _backward_tflops(gpu_name: str, key_length: int) -> float:
    """The calibrated attention backward rate at ``key_length`` at the boost clock, in TFLOP/s of the table's peak."""
    data = kernel_data()["gpus"][gpu_name]
    kernel = Kernel("attention.bwd", 1e15, 0.0, "attention", key_length, backward=True)
    rate = kernel.flops / kernel_duration(kernel, get_gpu(gpu_name), "bf16", calibrated_efficiency(gpu_name))
    return rate / 1e12 / data["clock"]["sustained_ratio"] * data["attention"]["table_peak_tflops"] / 989


@pytest.mark.parametrize("gpu_name", ["h100-sxm"])
@pytest.mark.parametrize(("length", "expected"), [
    (512, 305 * 443.6 / 517.3),     # below the ratio's lengths: its 4k value held
    (2048, 465 * 443.6 / 517.3),
    (4096, 499 * 443.6 / 517.3),
    (8192, 518 * 463.5 / 530.4),
    (16384, 516 * 497.7 / 538.5),
    (65536, 516 * 503.8 / 535.4),   # beyond the paper's 16k: its 16k value held
    (131072, 516 * 503.8 / 535.4),
])
def test_hopper_causal_backward_is_the_papers_non_causal_times_cudnns_measured_ratio(gpu_name, length, expected):
    # 1e15 FLOP makes the 2 us ramp 1e-6 of the time.
    assert _backward_tflops(gpu_name, length) == pytest.approx(expected, rel=1e-5)


def test_causal_backward_between_measured_lengths_is_log_linear():
    # 6k keys: 0.585 of the way (in log2 of the length) from the 4k product to the 8k one.
    share = math.log2(6144 / 4096)
    at_4k, at_8k = 499 * 443.6 / 517.3, 518 * 463.5 / 530.4
    assert _backward_tflops("h100-sxm", 6144) == pytest.approx(at_4k + share * (at_8k - at_4k), rel=1e-5)


def test_causal_backward_is_slower_than_without_the_mask_and_than_the_forward():
    for length, non_causal in FA3_BACKWARD_NON_CAUSAL.items():
        assert _backward_tflops("h100-sxm", length) < non_causal
    assert all(causal < plain for causal, plain in CUDNN_BACKWARD.values())
    attention = kernel_data()["gpus"]["h100-sxm"]["attention"]
    forward = dict(zip(attention["seq_len"], attention["forward_tflops"]))
    assert all(_backward_tflops("h100-sxm", length) < forward[length] for length in forward)


@pytest.mark.parametrize(("length", "forward", "backward"), [(4096, 855.7, 701.3), (8192, 1171.3, 942.5),
                                                              (131072, 1355.4, 1047.8), (1024, 855.7, 701.3)])
def test_b200_attention_follows_cudnns_causal_b200_table(length, forward, backward):
    # cudnn-frontend's B200 run (cuDNN 9.13.1, causal, head dim 128): fractions of 2,250 TFLOP/s at the sustained
    # clock; below 4k keys the 4k figures are held (the shorter rows are dispatch-bound).
    efficiency = calibrated_efficiency("b200")
    fractions = {pass_: dict(table)[float(max(length, 4096))] for pass_, table in
                 (("forward", efficiency.attention_forward), ("backward", efficiency.attention_backward))}
    assert fractions["forward"] == pytest.approx(forward / 2250 * 0.815, rel=1e-9)
    assert fractions["backward"] == pytest.approx(backward / 2250 * 0.815, rel=1e-9)


OVERLAP = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {layers: 4, hidden: 8192, heads: 64, kv_heads: 8, ffn_hidden: 28672, vocab: 128256, gated_mlp: true}
training: {seq_len: 4096, microbatches: 4, micro_batch: 1, precision: bf16}
parallelism: {tp: 8, dp: 2, sequence_parallel: true, zero: 1}
"""


def _rank0(timeline, category):
    rows = timeline[(timeline["rank"] == 0) & (timeline["kind"] != "flow")]
    return rows[rows["category"] == category]


def test_tp_comm_overlap_exposes_the_pair_swaps_and_the_last_chunks(run_yaml):
    plain = run_yaml(OVERLAP)
    overlapped = run_yaml(OVERLAP, "parallelism.tp_comm_overlap=true")
    # Without the overlap every TP collective blocks the compute stream but the backward's re-gathers of the
    # sequence-parallel inputs, which run beside their input-gradient GEMMs (test_sp_regather.py).
    tp = _rank0(plain.timeline, "tp")
    blocking = tp[tp["stream"] == "compute"]
    regathers = tp[tp["name"].str.endswith("(input again)")]
    assert len(blocking) + len(regathers) == len(tp)
    assert plain.summary["exposed_comm_s"]["tp"] == pytest.approx(
        float((blocking["end_s"] - blocking["start_s"]).sum()), rel=0.02)
    tp = _rank0(overlapped.timeline, "tp")
    exposed = tp[tp["name"].str.endswith("(pair exchange)") | tp["name"].str.endswith("(chunk 4 of 4)")
                 | (tp["stream"] == "compute")]
    # The ring exchanges' pair swaps (every GEMM step waits for them), the pipelined reduce-scatters' last chunks
    # and the embedding's reduce-scatter are exposed; the ring exchanges, the first chunks and the backward's
    # bulk collectives hide behind their GEMMs except where one outlasts a short GEMM: the QKV's ring beside
    # its GQA-narrow GEMM (and the projection's input-gradient one), the QKV's input- and weight-gradient GEMMs
    # beside the input's re-gather and the input gradient's reduce-scatter (test_sp_regather.py has the closed
    # form): 86% more today.
    tails = float((exposed["end_s"] - exposed["start_s"]).sum())
    assert tails <= overlapped.summary["exposed_comm_s"]["tp"] <= 1.9 * tails
    assert overlapped.summary["exposed_comm_s"]["tp"] < 0.45 * plain.summary["exposed_comm_s"]["tp"]
    assert overlapped.summary["step_time_s"] < plain.summary["step_time_s"]
    assert overlapped.summary["overlaps"]["tp_comm"] and not plain.summary["overlaps"]["tp_comm"]


def test_overlapped_gemms_pay_for_the_sms_communication_holds(run_yaml, catalog_sources):
    overlap, held = tp_overlap(), catalog_sources["tp_comm_overlap_sms"]
    assert (overlap.all_gather_sms, overlap.reduce_scatter_sms) == (held["all_gather"], held["reduce_scatter"])
    sms = catalog_sources["sms"]["h100-sxm"]
    free = run_yaml(OVERLAP, "parallelism.tp_comm_overlap=true", "collectives.sm_contention=none")
    paid = run_yaml(OVERLAP, "parallelism.tp_comm_overlap=true")

    def first_forward(frame, suffix, category="forward"):
        """Layer 0's first micro-batch's forward ops (attention, MLP) ending in ``suffix``: nothing else
        communicates then."""
        rows = _rank0(frame, category)
        rows = rows[rows["name"].str.endswith(suffix) & rows["name"].str.contains(" L0.") & (rows["microbatch"] == 0)]
        return list(rows.sort_values("start_s").head(2).itertuples())

    # The pipelined reduce-scatter's GEMM chunks run on the SMs its kernels leave (108), whether or not a chunk
    # runs (set_sm_margin): they last their nominal time times 132 / 108.
    for suffix in ("gemm (chunk 1 of 4)", "gemm (chunk 4 of 4)"):
        for gemm, nominal in zip(first_forward(paid.timeline, suffix), first_forward(free.timeline, suffix),
                                 strict=True):
            assert gemm.end_s - gemm.start_s == pytest.approx(
                (nominal.end_s - nominal.start_s) * sms / (sms - overlap.reduce_scatter_sms), rel=1e-9)
    # The ring exchange's GEMM steps run on every SM: they slow by the exchange kernel's SM while it runs beside
    # them (T + L n / SMs), and the last step, after the exchange, keeps its nominal time.
    rings = first_forward(paid.timeline, "(ring exchange)", "tp")
    for gemm, nominal, ring in zip(first_forward(paid.timeline, "gemm (first steps)"),
                                   first_forward(free.timeline, "gemm (first steps)"), rings, strict=True):
        assert ring.start_s == gemm.start_s
        beside = min(ring.end_s, gemm.end_s) - gemm.start_s
        assert gemm.end_s - gemm.start_s == pytest.approx(
            nominal.end_s - nominal.start_s + beside * overlap.all_gather_sms / sms, rel=1e-9)
    for gemm, nominal in zip(first_forward(paid.timeline, "gemm (last step)"),
                             first_forward(free.timeline, "gemm (last step)"), strict=True):
        assert gemm.end_s - gemm.start_s == pytest.approx(nominal.end_s - nominal.start_s, rel=1e-12)


def test_overlap_param_gather_moves_the_gather_behind_the_forward(run_yaml):
    plain = run_yaml(OVERLAP)
    deferred = run_yaml(OVERLAP, "parallelism.ddp.overlap_param_gather=true")
    dp = _rank0(plain.timeline, "dp")
    gather = dp[dp["name"] == "all_gather params"]
    # Without it the gather follows the optimizer and ends the step, fully exposed.
    assert plain.summary["step_time_s"] == pytest.approx(float(gather["end_s"].iloc[0]), rel=1e-12)
    # With it the bucket gathers run at the start; only what the forward cannot cover stays exposed.
    rows = _rank0(deferred.timeline, "dp")
    gathers = rows[rows["name"].str.startswith("all_gather params bucket")]
    compute = deferred.timeline[(deferred.timeline["rank"] == 0) & deferred.timeline["category"].isin(
        ("forward", "backward", "recompute", "optimizer"))]
    hidden_share = 1 - uncovered(gathers["start_s"].to_numpy(), gathers["end_s"].to_numpy(),
                                 compute["start_s"].to_numpy(), compute["end_s"].to_numpy()) / float(
        (gathers["end_s"] - gathers["start_s"]).sum())
    assert hidden_share > 0.3
    assert deferred.summary["exposed_comm_s"]["dp"] < plain.summary["exposed_comm_s"]["dp"] - 0.3 * float(
        (gather["end_s"] - gather["start_s"]).iloc[0])
    assert deferred.summary["overlaps"]["param_gather"]


def test_tp_comm_overlap_needs_sequence_parallelism(run_yaml):
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError) as info:
        run_yaml(OVERLAP, "parallelism.tp_comm_overlap=true", "parallelism.sequence_parallel=false")
    assert info.value.field == "parallelism.tp_comm_overlap"


LAYER_NAMES = ("mlp_fc2", "mlp_fc1", "out_proj", "qkv_proj")


KERNELS_2021 = {"fused_layernorm": False, "fused_bias_grad": False}
"""Megatron-LM's 2021 kernels (SC21): apex's two-pass LayerNorm backward, bias gradients as separate sums."""


def test_unfused_gradient_accumulation_adds_one_pass_per_weight():
    # Megatron-LM before --gradient-accumulation-fusion: each micro-batch's weight gradient is written in fp16
    # and main_grad.add_(grad) reads both and writes the sum into the fp16 buffer, 3 x 2 B per weight element of
    # the layer's four matrices (tp 8: 12 h^2 / 8 weights) and of their biases (3h/8 + h + 4h/8 + h),
    # streamed at the calibrated 88% of the A100's 2.039 TB/s.
    model, gpu = get_model("megatron-76.1b"), get_gpu("a100-80gb")
    efficiency = calibrated_efficiency("a100-80gb", "fp16")
    fused = layer_kernels(model, ShardShape(2, 2048, tp=8, grad_accum_bytes=2, **KERNELS_2021), "full")
    separate = layer_kernels(model, ShardShape(2, 2048, tp=8, grad_accum_bytes=2, fused_grad_accumulation=False,
                                               **KERNELS_2021), "full")
    assert not [k for k in fused.backward_weight if k.name.endswith(".accumulate")]
    adds = [k for k in separate.backward_weight if k.name.endswith(".accumulate")]
    h = model.hidden
    weights, biases = 12 * h**2 / 8, 3 * h / 8 + h + 4 * h / 8 + h
    assert [k.name for k in adds] == [f"{name}.{part}.accumulate" for part in ("wgrad", "bgrad")
                                      for name in LAYER_NAMES]
    assert sum(k.hbm_bytes for k in adds) == pytest.approx(3 * 2 * (weights + biases), rel=1e-12)
    seconds = sum(kernel_duration(k, gpu, "fp16", efficiency) for k in adds[:4])
    # Four kernels, each paying the 2 us launch/tail ramp on top of its streaming time.
    assert seconds == pytest.approx(6 * weights / (0.88 * 2.039e12) + 4 * 2e-6, rel=1e-3)
    assert separate.forward == fused.forward and separate.recompute == fused.recompute
    # An fp32 buffer (bf16 training) reads 2 B of fresh gradient and reads and writes 4 B per element.
    fp32_buffer = layer_kernels(model, ShardShape(2, 2048, tp=8, fused_grad_accumulation=False, **KERNELS_2021),
                                "full")
    assert sum(k.hbm_bytes for k in fp32_buffer.backward_weight if k.name.endswith(".accumulate")) == \
        pytest.approx(10 * (weights + biases), rel=1e-12)
    # Bias gradients out of the weight-gradient GEMMs: the same elements are added, one add per GEMM.
    bias_in_gemm = layer_kernels(model, ShardShape(2, 2048, tp=8, grad_accum_bytes=2, fused_grad_accumulation=False),
                                 "full")
    adds = [k for k in bias_in_gemm.backward_weight if k.name.endswith(".accumulate")]
    assert [k.name for k in adds] == [f"{name}.wgrad.accumulate" for name in LAYER_NAMES]
    assert sum(k.hbm_bytes for k in adds) == pytest.approx(3 * 2 * (weights + biases), rel=1e-12)


def test_layer_backward_runs_megatrons_2021_elementwise_passes():
    # Megatron-LM 2021 (the SC21 commit), per element of a [s, b, h] activation unless said: the fused LayerNorm
    # backward reads x and dy twice (cuComputePartGradGammaBeta, then cuComputeGradInput) and writes dx (5 x 2 B);
    # the bias-dropout-add backward writes the branch gradient from dy and the mask (2 + 1 + 2 B) and autograd
    # adds the skip's gradient to the norm's dx (3 x 2 B); each linear layer's bias gradient is a sum over the
    # tokens of its output gradient (2 B per output element: 3h/t, h, 4h/t, h). RMSNorm models without dropout
    # or biases (Llama) keep one pass per norm (3 x 2 B) and the skip's sum alone.
    model, t = get_model("megatron-76.1b"), 8
    tokens, h = 2 * 2048, model.hidden
    kernels = layer_kernels(model, ShardShape(2, 2048, tp=t, **KERNELS_2021), "full")
    by_name = {k.name: k for k in kernels.backward_input + kernels.backward_weight}
    for norm in ("input_norm.bwd", "mlp_norm.bwd"):
        assert by_name[norm].hbm_bytes == 5 * 2 * tokens * h
    for residual in ("attn_residual.bwd", "mlp_residual.bwd"):
        assert by_name[residual].hbm_bytes == (3 * 2 + 2 + 1 + 2) * tokens * h
    widths = {"qkv_proj": 3 * h / t, "out_proj": h, "mlp_fc1": 4 * h / t, "mlp_fc2": h}
    for name, width in widths.items():
        assert by_name[f"{name}.bgrad"].hbm_bytes == 2 * tokens * width
        assert by_name[f"{name}.bgrad"].weights == width
    # Transformer Engine (the default): LayerNorm's backward reads x and dy once (3 x 2 B), and each
    # weight-gradient GEMM writes its bias gradient beside the weights' (fp32 buffer: read and write 4 B each).
    modern = layer_kernels(model, ShardShape(2, 2048, tp=t), "full")
    modern_by_name = {k.name: k for k in modern.backward_input + modern.backward_weight}
    assert modern_by_name["input_norm.bwd"].hbm_bytes == 3 * 2 * tokens * h
    assert not [name for name in modern_by_name if name.endswith(".bgrad")]
    for name, width in widths.items():
        gemm, bare = modern_by_name[f"{name}.wgrad"], by_name[f"{name}.wgrad"]
        assert gemm.weights == bare.weights + width
        assert gemm.hbm_bytes == pytest.approx(bare.hbm_bytes + 8 * width, rel=1e-15)
    llama = layer_kernels(get_model("llama3-70b"), ShardShape(1, 8192, tp=8, sequence_parallel=True))
    names = {k.name: k for k in llama.backward_input + llama.backward_weight}
    assert not [name for name in names if name.endswith(".bgrad")]
    elements = 8192 / 8 * 8192
    assert names["input_norm.bwd"].hbm_bytes == names["attn_residual.bwd"].hbm_bytes == 3 * 2 * elements


@pytest.mark.parametrize(("optimizer", "precision", "grad_reduce", "expected"), [
    ("adam", "fp16", None, 52.0), ("adam", "bf16", None, 38.0), ("adam", "fp8", None, 38.0),
    ("adam", "fp32", None, 32.0), ("sgd", "fp16", None, 36.0), ("adam", "bf16", "bf16", 44.0),
    ("adam", "fp16", "fp32", 46.0)])
def test_optimizer_step_counts_megatrons_mixed_precision_passes(optimizer, precision, grad_reduce, expected):
    # Adam update 28 B (read master, grad, m, v; write master, m, v), gradient norm 4 B, master -> 16-bit copy
    # 6 B; fp16 also copies its 16-bit gradient buffer to fp32 (6 B) and unscales it with the inf check (8 B).
    # bf16 (and fp8, with bf16 parameters) accumulates in an fp32 buffer, as Megatron-LM forces, so
    # main_grad.float() copies nothing; --grad-reduce-in-bf16 brings the 6 B copy back.
    assert optimizer_bytes_per_param(optimizer, precision, grad_reduce) == expected


def test_a100_gemms_lose_the_partial_last_wave(catalog_sources):
    # NVIDIA's Matrix Multiplication Background guide: 256x128 tiles, one per SM per wave, 108 SMs on A100.
    # A 2304 x 2304 output (the 1.7B model's projection weight gradient) is 9 x 18 = 162 tiles: two waves,
    # the second 54/108 full, 75% of the slots busy. 108 x 256 rows by 128 columns fill exactly one wave.
    a100, sms = calibrated_efficiency("a100-80gb", "fp16"), catalog_sources["sms"]["a100-80gb"]
    assert a100.wave_sms == sms
    assert a100.wave_tiles == tuple(map(tuple, catalog_sources["gemm_tiles"]))
    assert wave_efficiency((1, 2304, 2304), a100.wave_tiles, a100.wave_sms) == pytest.approx(162 / (2 * sms),
                                                                                               rel=1e-12)
    assert wave_efficiency((1, sms * 256, 128), a100.wave_tiles, a100.wave_sms) == 1.0
    # Batched: the 1.7B model's attention context (16 x 24 heads of 2048 x 96): a 96-wide output fills 3/4
    # of a 128-wide tile, and 384 x 8 = 3072 tiles are 28.4 waves (29 run): 0.75 x 3072 / 3132.
    assert wave_efficiency((384, 2048, 96), a100.wave_tiles, a100.wave_sms) == pytest.approx(
        0.75 * 3072 / (29 * sms), rel=1e-12)
    gpu = get_gpu("a100-80gb")
    rows = sms * 256
    square, ragged = (Kernel("gemm", 2.0 * rows * 128 * 8192, 0.0, "matmul", 8192, output=(1, rows, 128)),
                      Kernel("gemm", 2.0 * 2304**2 * 8192, 0.0, "matmul", 8192, output=(1, 2304, 2304)))
    plateau = 0.869 * 0.926 * 8192 / (8192 + 64) * 312e12
    for kernel, share in ((square, 1.0), (ragged, 0.75)):
        seconds = kernel.flops / (plateau * share)
        assert kernel_duration(kernel, gpu, "fp16", a100) == pytest.approx(seconds + 2e-6, rel=1e-9)


def test_hopper_and_blackwell_gemms_have_no_wave_term():
    # Persistent kernels split the last wave; their calibration comes from measured shapes.
    for name in ("h100-sxm", "h200", "b200"):
        assert calibrated_efficiency(name).wave_tiles == ()


# Dao et al., "FlashAttention" (2022), appendix E.5, row "Megatron" (Megatron-LM's unfused attention) on A100
# 40GB, fp16, batch 16, 8 heads of 64: (forward, backward) ms by sequence length; Tables 15/16 with dropout 0.1,
# Tables 18/19 without dropout (neither with a mask).
FA1_MEGATRON_DROPOUT = {1024: (1.88, 2.94), 2048: (6.56, 10.80)}
FA1_MEGATRON_PLAIN = {2048: (4.28, 8.86)}


def _unfused_attention_ms(seq_len: int, dropout: bool, efficiency: Efficiency | None = None) -> tuple[float, float]:
    model = ModelSpec("fa1-benchmark", 1, 512, 2048, 8, kv_heads=8, vocab=1, gated_mlp=False, dropout=dropout)
    kernels = layer_kernels(model, ShardShape(16, seq_len), "none", AttentionCost.for_kernel("standard"))
    gpu, efficiency = get_gpu("a100-40gb"), efficiency or calibrated_efficiency("a100-40gb", "fp16")
    passes = (tuple(k for k in kernels.forward if k.name.startswith("attention")),
              tuple(k for k in kernels.backward_input if k.name.startswith("attention")))
    return tuple(kernels_duration(ks, gpu, "fp16", efficiency) * 1e3 for ks in passes)


def test_unfused_attention_follows_megatrons_measured_kernels():
    # The score passes' HBM fractions (forward 0.73, backward 0.61) are fitted on the time per score element
    # between 1,024 and 2,048 tokens with dropout: that marginal only re-checks the fit (it holds to rounding by
    # construction). The table's times also hold ~0.3 ms per call (the whole time at 512 tokens is 0.56 / 0.92
    # ms), so the simulated kernels run 4.7% and 2.5% under the measured 2,048-token calls with dropout.
    short, long = _unfused_attention_ms(1024, True), _unfused_attention_ms(2048, True)
    for index in (0, 1):
        marginal = FA1_MEGATRON_DROPOUT[2048][index] - FA1_MEGATRON_DROPOUT[1024][index]
        assert long[index] - short[index] == pytest.approx(marginal, rel=0.01)
        assert long[index] == pytest.approx(FA1_MEGATRON_DROPOUT[2048][index], rel=0.05)
        assert long[index] < FA1_MEGATRON_DROPOUT[2048][index]


def test_score_pass_fractions_are_the_fit_at_the_a100s_gemm_rate():
    """fa1-megatron's fit: the marginal time per score between 1,024 and 2,048 tokens with dropout, less the
    batched GEMMs at the A100's calibrated GEMM rate, over the score passes' bytes. The marginal is linear in the
    passes' time, 1 / fraction, so two fractions give the fit exactly; kernels.yaml holds it to two digits, and it
    follows the GEMM share (at 0.869 forward 0.728, backward 0.613)."""
    calibrated = calibrated_efficiency("a100-40gb", "fp16")

    def marginals(fraction: float) -> tuple[float, ...]:
        memory = tuple((kind, fraction, fraction) if kind == "score_passes" else (kind, forward, backward)
                       for kind, forward, backward in calibrated.measured_memory)
        efficiency = dataclasses.replace(calibrated, measured_memory=memory)
        short, long = (_unfused_attention_ms(seq_len, True, efficiency) for seq_len in (1024, 2048))
        return tuple(b - a for a, b in zip(short, long, strict=True))

    at_one, at_half = marginals(1.0), marginals(0.5)
    fitted = kernel_data()["gpus"]["a100-40gb"]["score_passes"]
    for index, direction in enumerate(("forward", "backward")):
        passes = at_half[index] - at_one[index]  # the passes' marginal time at the full HBM bandwidth
        measured = FA1_MEGATRON_DROPOUT[2048][index] - FA1_MEGATRON_DROPOUT[1024][index]
        assert fitted[direction] == round(passes / (measured - (at_one[index] - passes)), 2)


def test_unfused_attention_without_dropout_a_row_not_fitted_on():
    # The independent check: the same source's runs without dropout (Tables 18 and 19), which the fit never saw.
    # The model drops the dropout passes' bytes and keeps the fitted fractions: the forward comes out 9.2% and
    # the backward 13.1% under the measured 4.28 and 8.86 ms, more than the ~0.3 ms per call explains, so
    # without dropout the score passes run slower than the fractions fitted with dropout say.
    forward, backward = _unfused_attention_ms(2048, False)
    assert forward == pytest.approx(FA1_MEGATRON_PLAIN[2048][0], rel=0.095)
    assert backward == pytest.approx(FA1_MEGATRON_PLAIN[2048][1], rel=0.14)
    assert forward < FA1_MEGATRON_PLAIN[2048][0] and backward < FA1_MEGATRON_PLAIN[2048][1]


def test_unfused_attention_backward_moves_the_kernels_bytes():
    # Per score element: dropout gradient (read 2 + mask 1, write 2) and fused softmax gradient (read output and
    # gradient, write: 6), over the a / t heads x s x s scores of a micro-batch; forward softmax 4 + dropout 5.
    model = get_model("megatron-1.7b")
    kernels = layer_kernels(model, ShardShape(16, 2048), "none", AttentionCost.for_kernel("standard"))
    scores = 16 * 24 * 2048**2
    by_name = {k.name: k for k in kernels.forward + kernels.backward_input}
    assert by_name["attention.softmax"].hbm_bytes == 9 * scores
    assert by_name["attention.softmax.bwd"].hbm_bytes == 11 * scores
    assert by_name["attention.softmax"].memory_kind == by_name["attention.softmax.bwd"].memory_kind == "score_passes"
    assert by_name["attention.softmax.bwd"].backward
    # The backward runs at the score passes' measured backward fraction of the 2,039 GB/s, not the streaming one.
    a100 = calibrated_efficiency("a100-80gb", "fp16")
    backward = kernel_data()["gpus"]["a100-80gb"]["score_passes"]["backward"]
    seconds = kernel_duration(by_name["attention.softmax.bwd"], get_gpu("a100-80gb"), "fp16", a100)
    assert seconds == pytest.approx(11 * scores / (backward * 2.039e12) + 2e-6, rel=1e-9)


def test_unfused_cross_entropy_runs_megatrons_fp32_passes():
    # Megatron-LM's vocab-parallel cross-entropy on logits.float(): cast (2 + 4), max 4, sub_ 8, exp 8, sum 4,
    # div_ 8 = 38 B per logit forward; mul_ by the loss gradient 8 and the cast back (4 + 2) = 14 B backward.
    # Fused: read the 16-bit logits and write an fp32 softmax (6 B), read it and write 16-bit gradients (6 B).
    model = get_model("megatron-1.7b")
    logits = 16 * 2048 * model.vocab / 2
    for fused, expected in ((True, (6, 6)), (False, (38, 14))):
        kernels = head_kernels(model, ShardShape(16, 2048, tp=2, fused_cross_entropy=fused))
        loss, loss_grad = kernels.forward[-1], kernels.backward_input[0]
        assert (loss.name, loss_grad.name) == ("cross_entropy", "cross_entropy.bwd")
        assert (loss.hbm_bytes, loss_grad.hbm_bytes) == (expected[0] * logits, expected[1] * logits)


APEX_LAYERNORM_MS = (0.0751, 0.1762)
"""NVIDIA/apex PR #1037 (kernels.yaml source apex-layernorm): apex's fused LayerNorm on GA100 (A100 40GB), fp16,
16,384 rows of 1,024, forward and backward milliseconds."""


def test_a100_layernorm_fit_reproduces_apex_timings():
    """Guards the fit, not the model's fidelity: kernels.yaml's LayerNorm fractions were fitted on these two
    timings alone, over the bytes the layer's apex LayerNorm kernels move and the ramp, so they hold only with
    those. A change to the kernels' HBM bytes (workload/transformer.py), the ramp or the fractions that moves
    either timing by more than 0.15% fails it (today: forward +0.06%, backward -0.10%, the fractions' two-digit
    rounding). The A100 80GB applies the
    same fractions to its 2,039 GB/s, an extrapolation no measurement checks. RMSNorm, and LayerNorm as
    Transformer Engine runs it (layernorm_fusion), keep the GPU's streaming plateau."""
    model = ModelSpec("apex-benchmark", 1, 1024, 4096, 16, kv_heads=16, vocab=1, gated_mlp=False, norm="layernorm")
    kernels = layer_kernels(model, ShardShape(32, 512, fused_layernorm=False))
    norm = next(k for k in kernels.forward if k.name == "input_norm")
    norm_bwd = next(k for k in kernels.backward_input if k.name == "input_norm.bwd")
    gpu, a100 = get_gpu("a100-40gb"), calibrated_efficiency("a100-40gb", "fp16")
    forward_ms, backward_ms = APEX_LAYERNORM_MS
    assert kernel_duration(norm, gpu, "fp16", a100) == pytest.approx(forward_ms * 1e-3, rel=0.0015)
    assert kernel_duration(norm_bwd, gpu, "fp16", a100) == pytest.approx(backward_ms * 1e-3, rel=0.0015)
    rms = layer_kernels(get_model("llama3-8b"), ShardShape(1, 8192)).forward[0]
    fused = layer_kernels(model, ShardShape(32, 512)).forward[0]
    streaming = kernel_data()["gpus"]["a100-40gb"]["memory"]["fraction"]
    for kernel in (rms, fused):
        assert kernel.memory_kind is None and a100.memory_fraction(kernel) == streaming


def test_measured_memory_names_a_known_kernel_family():
    from simulator.errors import ScenarioError
    from simulator.workload.roofline import Efficiency

    with pytest.raises(ScenarioError) as info:
        Efficiency(measured_memory=(("softmax", 0.7, 0.6),))
    assert info.value.field == "efficiency.measured_memory.softmax"
    with pytest.raises(ScenarioError):
        Efficiency(measured_memory=(("layernorm", 0.0, 0.6),))


def test_kernel_era_reaches_the_layers_from_the_scenario():
    # The SC21 scenarios run the 2021 kernels; switching both flags back on shortens a layer's backward (one
    # LayerNorm pass less, no separate bias sums) and its forward (LayerNorm streams instead of running at apex's
    # measured rate).
    from simulator.config.loader import load_scenario
    from simulator.topology.loader import scenario_topology
    from simulator.workload.training import build_training_step

    path = str(SCENARIOS / "published" / "megatron-sc21-1.7b.yaml")
    old, new = (load_scenario(path, overrides) for overrides in
                ([], ["training.layernorm_fusion=true", "training.bias_grad_fusion=true"]))
    assert not old.scenario.training.layernorm_fusion and not old.scenario.training.bias_grad_fusion
    layers = [next(b for b in build_training_step(loaded.scenario, scenario_topology(loaded)).plan.stages[0].blocks
                   if b.name.startswith("L")) for loaded in (old, new)]
    assert layers[1].forward_s < layers[0].forward_s
    assert layers[1].backward_input_s < layers[0].backward_input_s
    assert layers[1].backward_weight_s < layers[0].backward_weight_s
