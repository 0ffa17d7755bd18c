"""Per-rank memory: ZeRO model-state tables from the seeds and the ZeRO paper; Korthikanti activation formulas."""

import math

import pytest
from shared import GB, SCENARIOS

from simulator import load_scenario
from simulator.catalog.models import get_model
from simulator.errors import ScenarioError
from simulator.topology.loader import scenario_topology
from simulator.workload.memory import (
    Sharding,
    activation_bytes_per_layer,
    head_activation_bytes,
    model_state_memory,
    rank_memory,
    rank_params,
    state_bytes_per_param,
)
from simulator.workload.memory_plan import stage_memory
from simulator.workload.training import build_training_step
from simulator.workload.transformer import ShardShape


def state_gb(params, stage, n):
    """The ZeRO paper and the seeds count fp16 mixed precision: 16 B per parameter with 2 B gradients."""
    return model_state_memory(params, Sharding(stage, n), precision="fp16").model_state / GB


@pytest.mark.parametrize(
    "params, n, expected_gb",
    [
        # Seed 000 Q4: 7.5e9 params on 8 GPUs: 120 / 41.25 / 28.1 GB for DP / ZeRO-1 / ZeRO-2. Its ZeRO-3 line
        # prints 13.1 GB, but its own terms 15/8 + 1.875 + 11.25 sum to 15.0 GB (= 16 B x 7.5e9 / 8, the same
        # rule as seed 003 and the ZeRO paper), so 15.0 is the figure checked here.
        (7.5e9, 8, (120.0, 41.25, 28.1, 15.0)),
        # Seed 003: Llama-3.1-8B, 8.03e9 params on 8 GPUs.
        (8.03e9, 8, (128.5, 44.2, 30.1, 16.1)),
        # Rajbhandari et al. (ZeRO, SC20) Fig. 1: 7.5e9 params, N = 64.
        (7.5e9, 64, (120.0, 31.4, 16.6, 1.9)),
    ],
)
def test_zero_model_state_tables(params, n, expected_gb):
    # Within 1%, or half a printed digit for the small ZeRO paper figure (1.875 GB is printed as 1.9).
    for stage, expected in enumerate(expected_gb):
        assert state_gb(params, stage, n) == pytest.approx(expected, rel=0.01, abs=0.05)


def test_breakdown_by_category():
    state = model_state_memory(7.5e9, Sharding(2, 8))
    assert state.params == pytest.approx(15e9)
    assert state.grads == pytest.approx(30e9 / 8)  # bf16: Megatron-LM's fp32 gradient buffer
    assert state.optimizer == pytest.approx(90e9 / 8)
    assert state.total == pytest.approx(state.model_state)


def test_precision_and_optimizer_bytes():
    assert state_bytes_per_param("bf16", "adam", "bf16") == state_bytes_per_param("fp16", "adamw")
    mixed = state_bytes_per_param("fp16", "adam")
    assert (mixed.param, mixed.grad, mixed.optimizer) == (2, 2, 12)
    bf16 = state_bytes_per_param("bf16", "adam")
    assert (bf16.param, bf16.grad, bf16.optimizer) == (2, 4, 12)
    fp32 = state_bytes_per_param("fp32", "adam")
    assert (fp32.param, fp32.grad, fp32.optimizer) == (4, 4, 8)
    assert state_bytes_per_param("bf16", "sgd_momentum").optimizer == 8
    assert state_bytes_per_param("fp32", "sgd").optimizer == 0
    with pytest.raises(ScenarioError) as info:
        state_bytes_per_param("bf16", "lion")
    assert info.value.field == "training.optimizer" and "adam" in info.value.allowed


def test_hybrid_shard_and_bad_stage():
    # HSDP: ZeRO-3 within 8-GPU groups, replicated across the 8 groups: 8.03e9 x 16 B / 8 = 16.1 GB per GPU.
    assert model_state_memory(8.03e9, Sharding(3, 8), precision="fp16").total == pytest.approx(8.03e9 * 16 / 8,
                                                                                               rel=1e-12)
    with pytest.raises(ScenarioError) as info:
        model_state_memory(1e9, Sharding(4, 8))
    assert info.value.field == "parallelism.zero"


@pytest.mark.parametrize("tp, sp", [(1, False), (8, False), (8, True)])
def test_korthikanti_activation_formulas(tp, sp):
    # Korthikanti et al. 2022, bytes per layer: s b h (34 + 5 a s / h) without TP; s b h (10 + 24/t + 5as/(ht))
    # with TP; s b h / t (34 + 5 a s / h) with TP + SP; selective recompute drops the 5 a s / h term.
    model = get_model("megatron-145.6b")
    s, b, h, a = 2048, 2, model.hidden, model.heads
    shard = ShardShape(b, s, tp=tp, sequence_parallel=sp)
    if sp or tp == 1:
        full, selective = s * b * h / tp * (34 + 5 * a * s / h), s * b * h / tp * 34
    else:
        full, selective = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)), s * b * h * (10 + 24 / tp)
    assert activation_bytes_per_layer(model, shard) == pytest.approx(full, rel=1e-9)
    assert activation_bytes_per_layer(model, shard, "selective") == pytest.approx(selective, rel=1e-9)
    stored_input = 2 * s * b * h / (tp if sp else 1)
    assert activation_bytes_per_layer(model, shard, "full") == pytest.approx(stored_input, rel=1e-9)


def test_llama_activations_have_no_score_or_dropout_terms_when_selective():
    # Llama 3 8B, no dropout, GQA (8 of 32 heads) and SwiGLU: per token 2h (two norm inputs, 2 B each) + 2h
    # (QKV and MLP inputs) + 2(h + 2 h/4) (Q, K, V) + 2h (attention output) + 3 x 2 x ffn (gate, up, act out).
    model = get_model("llama3-8b")
    h, f = 4096, 14336
    per_token = 4 * h + 4 * h + 2 * (h + 2 * h / 4) + 2 * h + 6 * f
    shard = ShardShape(1, 8192)
    assert activation_bytes_per_layer(model, shard, "selective") == pytest.approx(8192 * per_token)
    scores = activation_bytes_per_layer(model, shard) - activation_bytes_per_layer(model, shard, "selective")
    assert scores == pytest.approx(2 * 32 * 8192 * 8192)  # softmax output only, 2 B per score


def test_rank_memory_llama3_405b_stage():
    # Seed 003: 405B at 16 B/param is 6.48 TB, ~50.6 GB per GPU when split 128 ways by TP 8 x PP 16 (no DP
    # sharding). A middle stage of 8 layers holds 8/126 of the layers, split 8 ways (norms replicated).
    model = get_model("llama3-405b")
    assert model.num_params() * 16 / 128 / GB == pytest.approx(50.6, rel=0.01)
    middle = rank_params(model, 8, 8, first_stage=False, last_stage=False)
    assert middle == pytest.approx(8 * model.layer_params() / 8, rel=1e-4)
    shard = ShardShape(1, 8192, tp=8, sequence_parallel=True)
    memory = rank_memory(model, shard, layers=8, in_flight=16, recompute="full", first_stage=False, last_stage=False,
                         buffer_bytes=1e9)
    assert memory.model_state == pytest.approx(18 * middle)  # bf16 weights, fp32 gradients, Adam's 12 B
    assert memory.activations == pytest.approx(16 * 8 * 2 * 8192 * 16384 / 8)
    assert memory.total == pytest.approx(memory.model_state + memory.activations + 1e9)


def test_last_stage_keeps_fp32_logits():
    model = get_model("llama3-8b")
    shard = ShardShape(1, 8192, tp=8, sequence_parallel=True)
    assert head_activation_bytes(model, shard) == pytest.approx(4 * 8192 * 128256 / 8)
    last = rank_memory(model, shard, layers=4, in_flight=1, first_stage=False, last_stage=True)
    middle = rank_memory(model, shard, layers=4, in_flight=1, first_stage=False, last_stage=False)
    assert last.activations - middle.activations == pytest.approx(head_activation_bytes(model, shard))
    # Tied embeddings (GPT style): a single stage holds the table once, a separate last stage holds a copy.
    gpt = get_model("megatron-1.7b")
    single = rank_params(gpt, 1, gpt.layers, first_stage=True, last_stage=True)
    assert single == pytest.approx(gpt.num_params())
    assert rank_params(gpt, 1, 0, False, True) == pytest.approx(gpt.vocab * gpt.hidden + gpt.norm_params())


def _published_stage_memory(case):
    loaded = load_scenario(str(SCENARIOS / "published" / f"{case}.yaml"))
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    return step, stage_memory(loaded.scenario, step)


# Llama 3 405B (Llama 3 paper, Table 3): 126 layers, model dimension 16,384, FFN 53,248, 128 heads of 128 with 8
# KV heads, vocabulary 128,256; RMSNorm (one weight vector of h per norm, two per layer).
H, FFN, HEADS, KV_HEADS, HEAD_DIM = 16384, 53248, 128, 8, 128
LLAMA3_LAYER_PARAMS = 2 * H * HEADS * HEAD_DIM + 2 * H * KV_HEADS * HEAD_DIM + 3 * H * FFN + 2 * H
"""Q and output projections, K and V, SwiGLU's gate, up and down projections, two norms."""
TP, TOKENS = 8, 8192
"""Every published layout: TP 8 with sequence parallelism, 8,192 tokens per rank (the long context's 131,072
split 16 ways by CP)."""
LLAMA3_LAYER_PARAMS_PER_RANK = (LLAMA3_LAYER_PARAMS - 2 * H) / TP + 2 * H
"""The matrices split 8 ways, the norms replicated."""
LLAMA3_LAYER_ACTIVATION = (TOKENS / TP * 4 * 2 * H  # two norm inputs, the QKV and MLP inputs (split by SP)
                           + TOKENS * 2 * (HEADS * HEAD_DIM / TP * 2 + 2 * KV_HEADS / TP * HEAD_DIM)  # Q, out; K, V
                           + TOKENS * 3 * 2 * FFN / TP)  # gate, up and activation outputs
"""Bytes one layer keeps per micro-batch on a rank (bf16, flash attention: no score matrix): 532.7 MB."""


@pytest.mark.parametrize("case, dp_shards, layers_held, in_flight", [
    # 16 micro-batches, 8 chunks of one layer: every forward runs before the first backward, 128 layers held;
    # each micro-batch's gradients reduce-scattered over DP 128.
    ("llama3-405b-16384-gpus", 128, 128, 16),
    # 32 micro-batches: Megatron's interleaved warm-up on rank 1 is 2 (p - 2) + (v - 1) p = 140 chunks, the
    # 141st forward comes before the first backward; DP 64.
    ("llama3-405b-8192-gpus", 64, 141, 141 / 8),
    # CP 16 x DP 8 shard the optimizer and gradients 128 ways; as at 16,384 GPUs, 8 one-layer chunks and every
    # one of the 16 micro-batches' forwards before the first backward: 128 layers held.
    # (A whole fp32 gradient buffer, reduced once after the last micro-batch, would add 11.8 GiB and not fit.)
    ("llama3-405b-long-context", 128, 16 * 8, 16),
])
def test_llama3_405b_layouts_fit_in_the_h100s_memory(case, dp_shards, layers_held, in_flight):
    # Llama 3 ran these layouts (TP 8, PP 16) on 80 GB H100s without activation checkpointing. The fullest rank
    # is a middle one holding 8 layers: bf16 weights kept whole, fp32 gradients (4 B, the paper's section 3.3.2)
    # and Adam's fp32 master copy and moments (12 B) sharded over the data-parallel ranks (each micro-batch's
    # gradients reduce-scattered); two layers of unsharded gradients wait for their reduce-scatter; the
    # activations of the layers held. Against the 81,559 MiB (79.65 GiB) the driver reports.
    step, stages = _published_stage_memory(case)
    breakdown, held = max(stages, key=lambda stage: stage[0].total)
    params = 8 * LLAMA3_LAYER_PARAMS_PER_RANK
    buffers = 2 * math.ceil(LLAMA3_LAYER_PARAMS / TP) * 4
    parts = {"params": 2 * params, "grads": 4 * params / dp_shards,
             "optimizer": 12 * params / dp_shards, "activations": layers_held * LLAMA3_LAYER_ACTIVATION,
             "buffers": buffers}
    assert held == pytest.approx(in_flight, rel=1e-12)
    assert {name: getattr(breakdown, name) for name in parts} == pytest.approx(parts, rel=1e-12)
    assert breakdown.total == pytest.approx(sum(parts.values()), rel=1e-12)
    assert breakdown.total < step.gpu.hbm_bytes == 81559 * 2**20


def test_llama3_405b_end_stages_hold_only_the_layers_in_flight():
    # Rank 0's first chunk is the embedding alone: at its peak it holds 31 forwards of that chunk (no layer
    # activations) and 16 of each of its seven one-layer chunks, 112 layers. The last rank's last chunk is the
    # output layer alone (fp32 logits, 525 MB < one layer): its peak is 113 layers, 112 of warm-up plus one
    # forward of the next round's first chunk before the backward that frees a layer.
    _, stages = _published_stage_memory("llama3-405b-8192-gpus")
    first, last = stages[0][0], stages[-1][0]
    assert first.activations == pytest.approx(112 * LLAMA3_LAYER_ACTIVATION, rel=1e-12)
    assert last.activations == pytest.approx(113 * LLAMA3_LAYER_ACTIVATION, rel=1e-12)


@pytest.mark.parametrize("recompute, attention, working", [
    # Full recompute stores each layer's input (2 s b h / t with SP); while the backward recomputes a layer, that
    # layer's activations are all there: s b h / t (34 + 5 a s / h) with standard attention, 34 without scores.
    ("full", "standard", lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h - 2)),
    ("full", "flash", lambda s, b, h, a, t: s * b * h / t * (34 - 2)),
    # Selective recompute rebuilds one layer's attention scores, 5 a s^2 b / t; flash attention stores none.
    ("selective", "standard", lambda s, b, h, a, t: 5 * a * s * s * b / t),
    ("selective", "flash", lambda s, b, h, a, t: 0.0),
    ("none", "standard", lambda s, b, h, a, t: 0.0),
])
def test_recompute_holds_the_layer_it_recomputes(recompute, attention, working):
    # GPT 18.4B (h 6144, 48 heads), TP 8 with SP, PP 4, DP 1 (no DDP buckets): a stage's buffers are, with
    # recompute, the one layer the backward is rebuilding, and nothing without.
    loaded = load_scenario(str(SCENARIOS / "megatron-sc21-18.4b.yaml"), [
        "parallelism.pp=4", "parallelism.dp=1", "parallelism.sequence_parallel=true", "training.micro_batch=1",
        "training.global_batch=8", f"training.recompute={recompute}", f"training.attention={attention}",
        "cluster.nodes=4"])
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    s, b, h, a, t = 2048, 1, 6144, 48, 8
    for breakdown, _ in stage_memory(loaded.scenario, step):
        assert breakdown.buffers == pytest.approx(working(s, b, h, a, t), rel=1e-12)


def test_learned_position_table_is_whole_on_every_tp_rank():
    # Megatron-LM splits the token table by vocabulary over TP but keeps the position table (2048 x h for the
    # SC21 GPTs) whole on every TP rank; its gradients go into the first stage's buckets the same way.
    gpt = get_model("megatron-18.4b")
    first = gpt.vocab * gpt.hidden / 8 + 2048 * gpt.hidden
    assert rank_params(gpt, 8, 0, first_stage=True, last_stage=False) == pytest.approx(first, rel=1e-12)
    loaded = load_scenario(str(SCENARIOS / "megatron-sc21-18.4b.yaml"),
                           ["parallelism.pp=4", "cluster.nodes=8"])
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    embedding = step.plan.stages[0].blocks[0]
    assert embedding.name == "embedding" and embedding.tensors == pytest.approx((first,), rel=1e-12)


@pytest.mark.parametrize("bucket, buffers_gb", [("25 MiB", 2 * 25 * 2**20 / 1e9), ("10 GiB", 2 * 10 * 2**30 / 1e9),
                                                ("2 TiB", 8_030_261_248 * 4 / 1e9)])
def test_ddp_buckets_hold_at_most_the_gradients_of_the_rank(bucket, buffers_gb):
    """Llama 3 8B over DP 8 (8,030,261,248 parameters whole on each rank, fp32 gradients: 32.1 GB): DDP's two bucket
    buffers are 2 x bucket until they would hold more than the gradients they partition. A 2 TiB bucket (one
    bucket of every gradient) was charged 4 TiB, 4,171 GiB needed and a false OUT OF MEMORY; its buffers are the
    32.1 GB of gradients."""
    loaded = load_scenario(str(SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"),
                           [f"parallelism.ddp.bucket={bucket}"])
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    (breakdown, _), = stage_memory(loaded.scenario, step)
    assert breakdown.buffers / 1e9 == pytest.approx(buffers_gb, rel=1e-12)
    assert breakdown.buffers <= breakdown.grads
