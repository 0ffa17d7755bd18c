"""Transformer kernel FLOPs against the Megatron and 6N formulas; roofline durations bounded and monotone."""

import pytest

from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import MEGATRON_SC21_NAMES, get_model
from simulator.errors import ScenarioError
from simulator.workload.roofline import Efficiency, kernel_duration, kernels_duration
from simulator.workload.training import model_flops_per_token
from simulator.workload.transformer import (
    AttentionCost,
    Kernel,
    ShardShape,
    embedding_kernels,
    head_kernels,
    layer_kernels,
    megatron_flops_per_iteration,
    six_n_flops_per_token,
)

FULL_MATRIX = AttentionCost(causal_factor=1.0, backward_factor=2.0)  # the accounting of Megatron's formula
FULL_MATRIX_FLASH = AttentionCost(causal_factor=1.0, backward_factor=2.5)


def model_flops(model, shard, recompute="none", cost=None):
    """Forward + backward FLOPs of a whole model for one micro-batch on one rank."""
    cost = cost or AttentionCost()
    layers = layer_kernels(model, shard, recompute, cost).flops * model.layers
    return layers + embedding_kernels(model, shard).flops + head_kernels(model, shard).flops


@pytest.mark.parametrize("name", MEGATRON_SC21_NAMES)
def test_kernel_sums_match_megatron_formula(name):
    # Narayanan et al. SC21: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recompute; without it the
    # layers lose one forward, the output layer does not: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
    model = get_model(name)
    shard = ShardShape(micro_batch=2, seq_len=2048)
    with_recompute = megatron_flops_per_iteration(model, 2, 2048, recompute=True)
    without = megatron_flops_per_iteration(model, 2, 2048, recompute=False)
    assert model_flops(model, shard, "full", FULL_MATRIX) == pytest.approx(with_recompute, rel=0.005)
    assert model_flops(model, shard, "none", FULL_MATRIX) == pytest.approx(without, rel=0.005)
    # Flash-style attention backward (2.5x forward) adds at most ~1.6% (the 1.7B row, where s/h is largest).
    assert model_flops(model, shard, "full", FULL_MATRIX_FLASH) == pytest.approx(with_recompute, rel=0.02)


def test_tensor_parallel_splits_the_flops():
    # With TP + SP every kernel is split t ways, so t ranks together do the unsplit model's FLOPs (all but the
    # position-embedding add, which each rank repeats on its full output: ~1e-6 of the total).
    model = get_model("megatron-18.4b")
    single = model_flops(model, ShardShape(8, 2048), "full", FULL_MATRIX)
    split = model_flops(model, ShardShape(8, 2048, tp=8, sequence_parallel=True), "full", FULL_MATRIX)
    assert 8 * split == pytest.approx(single, rel=1e-5)
    context = model_flops(model, ShardShape(8, 2048, tp=8, cp=2, sequence_parallel=True), "full", FULL_MATRIX)
    assert 16 * context == pytest.approx(single, rel=1e-5)


def test_llama31_8b_flops_per_gpu_at_tp8():
    # Seed 003: 6 x 8.03e9 x 8192 / 8 = 4.9e13 FLOP per GPU per 8192-token micro-batch. The kernels add causal
    # attention and leave out the embedding lookup (6.5% of N): 6 N_matmul + 3 x the forward's causal QK^T and
    # AV, 2 x 2 s d l / 2 per token (`model_flops_per_token`), plus half a forward's attention more for the
    # flash backward (2.5 x its forward, not 2), 9.1% over the seed's 6 N in all. The rest, 0.02% today, is the
    # elementwise kernels (norms, SwiGLU, softmax).
    model = get_model("llama3-8b")
    seq, tp = 8192, 8
    flops = model_flops(model, ShardShape(1, seq, tp=tp, sequence_parallel=True))
    attention_forward = 2 * 2 * seq * model.hidden * model.layers / 2  # per token
    matmuls = (model_flops_per_token(model, seq) + attention_forward / 2) * seq / tp
    assert flops == pytest.approx(matmuls, rel=5e-4)
    assert flops == pytest.approx(6 * 8.03e9 * seq / tp, rel=0.10)  # the seed's figure, without attention


def test_six_n_convention():
    # PaLM: 6N + 12 l (a d) s per token; the 6N part alone is the seed's 6 x 8.03e9.
    model = get_model("llama3-8b")
    assert six_n_flops_per_token(model, 8192, attention=False) == pytest.approx(6 * 8.03e9, rel=0.001)
    attention = six_n_flops_per_token(model, 8192) - six_n_flops_per_token(model, 8192, attention=False)
    assert attention == pytest.approx(12 * 32 * 4096 * 8192)



def test_model_flops_leave_out_every_lookup_table():
    # Megatron's GPT ties its token table to the output layer (a matmul, counted) and looks up a learned position
    # table (no matmul, not counted). Per token: 6 x (l (12 h^2 + 13 h) layer weights and biases + 2 h final norm
    # + V h output layer) + 6 l h s causal attention. Counting the 2,048 x 2,304 position table added 0.29%.
    model = get_model("megatron-1.7b")
    l, h, v, s = 24, 2304, 51200, 2048
    assert model_flops_per_token(model, s) == 6 * (l * (12 * h**2 + 13 * h) + 2 * h + v * h) + 6 * l * h * s

def test_recompute_modes_add_the_right_forward_work():
    model = get_model("llama3-8b")
    shard = ShardShape(1, 4096, tp=4, sequence_parallel=True)
    none, selective, full = (layer_kernels(model, shard, mode) for mode in ("none", "selective", "full"))
    attention_forward = next(k.flops for k in none.forward if k.name == "attention")
    assert selective.flops - none.flops == pytest.approx(attention_forward)
    assert full.flops - none.flops == pytest.approx(sum(k.flops for k in none.forward))
    assert [k.name for k in full.recompute][:2] == ["recompute.input_norm", "recompute.qkv_proj"]
    with pytest.raises(ScenarioError) as info:
        layer_kernels(model, shard, "sometimes")
    assert "selective" in info.value.allowed


def test_gated_mlp_has_three_matmuls_and_backward_is_twice_forward():
    model = get_model("llama3-70b")
    kernels = layer_kernels(model, ShardShape(1, 2048, tp=8))
    matmuls = [k.name for k in kernels.forward if k.kind == "matmul"]
    assert matmuls == ["qkv_proj", "out_proj", "mlp_gate", "mlp_up", "mlp_down"]
    fwd = sum(k.flops for k in kernels.forward if k.kind == "matmul")
    assert sum(k.flops for k in kernels.backward_input if k.kind == "matmul") == pytest.approx(fwd)
    assert sum(k.flops for k in kernels.backward_weight) == pytest.approx(fwd)
    attention = {k.name: k.flops for k in kernels.forward + kernels.backward_input if k.kind == "attention"}
    assert attention["attention.bwd"] == pytest.approx(2.5 * attention["attention"])
    # GQA: the QKV GEMM is (64 + 2 x 8) heads x 128 wide over t = 8, i.e. 1280 columns.
    qkv = next(k for k in kernels.forward if k.name == "qkv_proj")
    assert qkv.flops == pytest.approx(2 * 2048 * 8192 * 1280)


def test_causal_factor_halves_attention():
    model = get_model("llama3-8b")
    shard = ShardShape(1, 8192)
    full = layer_kernels(model, shard, cost=AttentionCost(causal_factor=1.0)).forward[2]
    causal = layer_kernels(model, shard).forward[2]
    assert causal.name == "attention" and causal.flops == pytest.approx(0.5 * full.flops)
    assert full.flops == pytest.approx(4 * 8192 * 8192 * 4096)


def test_bad_split_is_a_scenario_error():
    with pytest.raises(ScenarioError) as info:
        layer_kernels(get_model("megatron-1.7b"), ShardShape(1, 2048, tp=16))
    assert info.value.field == "parallelism.tp"
    with pytest.raises(ScenarioError) as info:
        layer_kernels(get_model("llama3-8b"), ShardShape(1, 1000, cp=3))
    assert info.value.field == "parallelism.cp"


def test_large_gemm_runs_near_080_of_peak_on_a100():
    gpu = get_gpu("a100-80gb")
    n = 8192
    gemm = Kernel("gemm", 2.0 * n**3, 2.0 * 3 * n * n, "matmul", n)
    achieved = gemm.flops / kernel_duration(gemm, gpu, "bf16") / gpu.peak("bf16")
    assert 0.75 <= achieved <= 0.80


def test_roofline_is_bounded_and_monotone():
    gpu = get_gpu("h100-sxm")
    durations, rates = [], []
    for n in (64, 256, 1024, 4096, 16384):
        gemm = Kernel("gemm", 2.0 * n**3, 2.0 * 3 * n * n, "matmul", n)
        duration = kernel_duration(gemm, gpu, "bf16")
        durations.append(duration)
        rates.append(gemm.flops / duration)
        assert duration >= gemm.flops / gpu.peak("bf16")
        assert duration >= gemm.hbm_bytes / gpu.hbm_bandwidth
    assert durations == sorted(durations)
    assert rates == sorted(rates)
    assert max(rates) <= Efficiency().matmul_peak * gpu.peak("bf16")
    copy = Kernel("copy", 0.0, 1e9, "elementwise")
    streaming = 1e9 / (Efficiency().memory_peak * gpu.hbm_bandwidth)
    assert kernel_duration(copy, gpu, "bf16") == pytest.approx(streaming + Efficiency().ramp("elementwise"),
                                                                rel=1e-9)


def test_layer_time_is_mostly_compute_bound_and_scales_with_gpu():
    model = get_model("llama3-70b")
    kernels = layer_kernels(model, ShardShape(1, 8192, tp=8, sequence_parallel=True))
    every = kernels.forward + kernels.backward
    a100 = kernels_duration(every, get_gpu("a100-80gb"), "bf16")
    h100 = kernels_duration(every, get_gpu("h100-sxm"), "bf16")
    # Mostly matmul time: the speed-up follows the 989/312 peak ratio, a little less for memory-bound kernels.
    assert 2.5 < a100 / h100 < 989 / 312
    achieved = kernels.flops / h100 / get_gpu("h100-sxm").peak("bf16")
    assert 0.6 < achieved < Efficiency().matmul_peak


def test_fp8_needs_a_gpu_that_has_it():
    kernel = Kernel("gemm", 1e12, 1e8, "matmul", 4096)
    with pytest.raises(ScenarioError):
        kernel_duration(kernel, get_gpu("a100-80gb"), "fp8")
    assert kernel_duration(kernel, get_gpu("h100-sxm"), "fp8") < kernel_duration(kernel, get_gpu("h100-sxm"), "bf16")
