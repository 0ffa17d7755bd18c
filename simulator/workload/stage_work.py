"""Per-virtual-stage work from the transformer cost model (or a synthetic spec): layers cut into attention and
MLP blocks with roofline durations, the embedding on the first stage, the output head and loss on the last."""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.catalog.gpus import GPUSpec
from simulator.catalog.models import ModelSpec
from simulator.config.parallelism_options import CpAlgorithm
from simulator.config.training_options import Precision, Recompute
from simulator.parallel.context import ContextAttention
from simulator.parallel.experts import ExpertWork
from simulator.parallel.work import Block, StageWork, TpPattern
from simulator.workload.eager import eager_embedding_kernels, eager_head_kernels, eager_layer_kernels
from simulator.workload.experts import MoELayer
from simulator.workload.memory import embedding_rank_params
from simulator.workload.roofline import Efficiency, kernels_duration, roofline_table, sm_bound_duration
from simulator.workload.transformer import (
    AttentionCost,
    PassKernels,
    ShardShape,
    embedding_kernels,
    grad_accumulation,
    head_kernels,
    kernel_bytes,
    kernel_flops,
    kv_heads_per_rank,
    layer_kernels,
)

ATTENTION_KERNELS = frozenset({"input_norm", "qkv_proj", "attention", "out_proj", "attn_residual"})
TP_ADJACENT_GEMMS = {
    TpPattern.LAYER: (frozenset({"qkv_proj", "mlp_gate", "mlp_up", "mlp_fc1"}),
                      frozenset({"out_proj", "mlp_down", "mlp_fc2"})),
    TpPattern.HEAD: (frozenset({"lm_head"}), frozenset()),
    TpPattern.EMBEDDING: (frozenset(), frozenset()),
    TpPattern.EXPERTS: (frozenset(), frozenset()),
}
"""Per TP pattern, the column-parallel GEMMs right after a block's leading TP collective and the row-parallel
GEMMs right before its trailing one: the GEMMs tp_comm_overlap splits into chunks against them, and whose
input- and weight-gradient GEMMs run beside the backward's re-gather of the sharded input (the
embedding's lookup is no GEMM, so its reduce-scatter stays exposed; a MoE block's all-gather follows the
combine all-to-all, not a GEMM)."""


@dataclass(frozen=True)
class CostContext:
    """What a kernel's duration depends on besides its shape."""

    gpu: GPUSpec
    precision: Precision
    efficiency: Efficiency = Efficiency()
    attention: AttentionCost = AttentionCost()

    def times(self, kernels) -> list[tuple[float, float]]:
        """Each kernel's (compute seconds, HBM seconds) on this GPU (`roofline_times`, each shape costed once)."""
        return list(map(roofline_table(self.gpu, self.precision, self.efficiency).times, kernels))

    def seconds(self, kernels) -> float:
        """The kernels' time back to back on this GPU (`kernels_duration`)."""
        return kernels_duration(kernels, self.gpu, self.precision, self.efficiency)

    def sm_bound(self, kernels) -> float:
        """The share of the kernels' time that SM contention slows (`sm_bound_duration`)."""
        return sm_bound_duration(kernels, self.gpu, self.precision, self.efficiency)


def _part(kernels, attention: bool):
    return tuple(k for k in kernels
                 if (k.name.removeprefix("recompute.").split(".")[0] in ATTENTION_KERNELS) == attention)


def _block(name: str, layer: int, kernels: PassKernels, cost: CostContext, *, tp_bytes: float, cp_bytes: float,
           tensors: tuple[float, ...], tp_pattern: TpPattern = TpPattern.LAYER, context: ContextAttention | None = None,
           experts: ExpertWork | None = None) -> Block:
    seconds, sm_bound = cost.seconds, cost.sm_bound

    def adjacent(ks, names):
        return tuple(k for k in ks if k.kind == "matmul" and k.name.split(".")[0] in names)

    leading, trailing = TP_ADJACENT_GEMMS[tp_pattern]
    gemms = (adjacent(kernels.forward, leading), adjacent(kernels.forward, trailing),
             adjacent(kernels.backward_input, trailing), adjacent(kernels.backward_input, leading))
    column_wgrads = adjacent(kernels.backward_weight, leading)
    times = cost.times(kernels.forward + kernels.backward)
    compute_s = sum(compute for compute, _ in times)
    memory_s = sum(memory for _, memory in times)
    return Block(name=name, layer=layer, forward_s=seconds(kernels.forward),
                 backward_input_s=seconds(kernels.backward_input), backward_weight_s=seconds(kernels.backward_weight),
                 recompute_s=seconds(kernels.recompute), forward_flops=kernel_flops(kernels.forward),
                 backward_flops=kernel_flops(kernels.backward_input + kernels.backward_weight),
                 backward_weight_flops=kernel_flops(kernels.backward_weight),
                 recompute_flops=kernel_flops(kernels.recompute), tp_bytes=tp_bytes, cp_bytes=cp_bytes,
                 params=sum(tensors), memory_bound=memory_s > compute_s,
                 sm_bound_s=(sm_bound(kernels.forward), sm_bound(kernels.backward_input),
                             sm_bound(kernels.backward_weight), sm_bound(kernels.recompute)),
                 tensors=tensors, tp_pattern=tp_pattern, context=context,
                 overlap_gemm_s=(seconds(gemms[0]), seconds(gemms[1]), seconds(gemms[2]), seconds(gemms[3])),
                 overlap_gemm_sm_s=(sm_bound(gemms[0]), sm_bound(gemms[1]), sm_bound(gemms[2]), sm_bound(gemms[3])),
                 overlap_gemm_bytes=(kernel_bytes(gemms[0]), kernel_bytes(gemms[1]), kernel_bytes(gemms[2]),
                                     kernel_bytes(gemms[3])),
                 experts=experts, column_wgrad_s=(seconds(column_wgrads), sm_bound(column_wgrads)),
                 column_wgrad_bytes=kernel_bytes(column_wgrads),
                 hbm_bytes=(kernel_bytes(kernels.forward), kernel_bytes(kernels.backward_input),
                            kernel_bytes(kernels.backward_weight), kernel_bytes(kernels.recompute)))


def _split(kernels: PassKernels, attention: bool) -> PassKernels:
    return PassKernels(_part(kernels.forward, attention), _part(kernels.recompute, attention),
                       _part(kernels.backward_input, attention), _part(kernels.backward_weight, attention))


def layer_tensors(model: ModelSpec, tp: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Parameter tensors one TP rank holds of a layer's attention block and MLP block, in forward order
    (norm, weights, biases), which is the granularity DDP buckets gradients at."""
    norm = float(model.norm_params())
    attention_weights = float(model.attention_params())
    q_width = model.heads * model.head_dim
    qkv = model.hidden * (q_width + 2 * model.kv_heads * model.head_dim)
    attention = (norm, qkv / tp, (attention_weights - qkv) / tp)
    mlp_total = float(model.mlp_params())
    matrices = 3 if model.gated_mlp else 2
    matrix = model.hidden * model.ffn_hidden
    biases = mlp_total - matrices * matrix
    mlp = (norm, *(matrix / tp for _ in range(matrices)), *((biases / tp,) if biases else ()))
    return attention, mlp


def layers_per_stage(layers: int, stages: int, fewer_on_ends: bool) -> list[int]:
    """Layers on each virtual stage: even split, or (Llama 3) one fewer on the first and the last stage.

    Returns an empty list when the layers do not divide; the caller reports the error with its field.
    """
    if fewer_on_ends and stages >= 2:
        if (layers + 2) % stages:
            return []
        per = (layers + 2) // stages
        return [per - 1] + [per] * (stages - 2) + [per - 1]
    if layers % stages:
        return []
    return [layers // stages] * stages


def unsplit_layers_text(layers: int, stages: int, fewer_on_ends: bool) -> str:
    """Why ``layers`` do not split over ``stages`` (`layers_per_stage` empty), naming the number divided: with
    one layer fewer on each end stage it is layers + 2, which a reader of '32 layers do not split over 4
    stages' could not tell."""
    if fewer_on_ends and stages >= 2:
        return f"{layers + 2} ({layers} layers + 2 with first_last_fewer_layers) do not split"
    return f"{layers} layers do not split"


def context_attention(kernels: PassKernels, cost: CostContext, shard: ShardShape, kv_bytes: float,
                      algorithm: CpAlgorithm, balanced: bool) -> ContextAttention:
    """The attention core's share of a layer's kernels under context parallelism (see parallel/context.py)."""
    def core(ks):
        return tuple(k for k in ks if k.name.removeprefix("recompute.").split(".")[0] == "attention")

    def seconds(ks):
        return cost.seconds(core(ks))

    def flops(ks):
        return kernel_flops(core(ks))

    def sm_bound(ks):
        return cost.sm_bound(core(ks))

    return ContextAttention(algorithm=algorithm, cp=shard.cp, balanced=balanced,
                            causal=cost.attention.causal_factor < 1.0, forward_s=seconds(kernels.forward),
                            backward_s=seconds(kernels.backward_input), recompute_s=seconds(kernels.recompute),
                            forward_flops=flops(kernels.forward), backward_flops=flops(kernels.backward_input),
                            recompute_flops=flops(kernels.recompute), kv_bytes=kv_bytes,
                            sm_bound_s=(sm_bound(kernels.forward), sm_bound(kernels.backward_input),
                                        sm_bound(kernels.recompute)),
                            hbm_bytes=(kernel_bytes(core(kernels.forward)), kernel_bytes(core(kernels.backward_input)),
                                       kernel_bytes(core(kernels.recompute))))


def transformer_stages(model: ModelSpec, shard: ShardShape, recompute: Recompute, cost: CostContext,
                       counts: list[int], cp_algorithm: CpAlgorithm = "ring", cp_balanced: bool = True,
                       moe: MoELayer | None = None) -> tuple[StageWork, ...]:
    """StageWork per virtual stage for a transformer with ``counts[i]`` layers on virtual stage i; with
    context parallelism the attention blocks carry their core's split (``cp_algorithm``, ``cp_balanced``);
    with experts every MLP block is the MoE block ``moe`` (workload/experts.py)."""
    t, c = shard.tp, shard.cp
    layer = (eager_layer_kernels if shard.eager else layer_kernels)(model, shard, recompute, cost.attention)
    embedding = (eager_embedding_kernels if shard.eager else embedding_kernels)(model, shard)
    head = (eager_head_kernels if shard.eager else head_kernels)(model, shard)
    activation_bytes = shard.tokens * model.hidden * shard.dtype_bytes
    kv_bytes = 2 * shard.micro_batch * shard.seq_len * kv_heads_per_rank(model, t) * model.head_dim * shard.dtype_bytes
    cp_bytes = kv_bytes if c > 1 and cp_algorithm == "all_gather" else 0.0
    context = (context_attention(layer, cost, shard, kv_bytes, cp_algorithm, cp_balanced) if c > 1 else None)
    attention_tensors, mlp_tensors = layer_tensors(model, t)
    attention = _split(layer, attention=True)
    mlp = _split(layer, attention=False)
    p2p_bytes = shard.tokens * model.hidden * shard.stream_bytes / t
    # Every layer costs the same: time its two blocks once and rename copies per layer.
    attention_block = _block("", 0, attention, cost, tp_bytes=activation_bytes, cp_bytes=cp_bytes,
                             tensors=attention_tensors, context=context)
    if moe is None:
        mlp_block = _block("", 0, mlp, cost, tp_bytes=activation_bytes, cp_bytes=0.0, tensors=mlp_tensors)
    else:
        mlp_block = _block("", 0, grad_accumulation(moe.kernels, shard), cost, tp_bytes=activation_bytes,
                           cp_bytes=0.0, tensors=moe.tensors, tp_pattern=TpPattern.EXPERTS, experts=moe.experts)
    stages = []
    first_layer = 0
    for index, count in enumerate(counts):
        blocks = []
        if index == 0:
            blocks.append(_block("embedding", -1, embedding, cost,
                                 tp_bytes=activation_bytes, cp_bytes=0.0, tensors=(embedding_rank_params(model, t),),
                                 tp_pattern=TpPattern.EMBEDDING))
        for number in range(first_layer, first_layer + count):
            blocks.append(replace(attention_block, name=f"L{number}.attn", layer=number))
            blocks.append(replace(mlp_block, name=f"L{number}.mlp", layer=number))
        first_layer += count
        if index == len(counts) - 1:
            output = (model.head_params() - model.norm_params()) / t
            head_tensors = (float(model.norm_params()), *((output,) if output else ()))
            blocks.append(_block("head", model.layers, head, cost, tp_bytes=activation_bytes,
                                 cp_bytes=0.0, tensors=head_tensors, tp_pattern=TpPattern.HEAD))
        stages.append(StageWork(tuple(blocks), p2p_bytes))
    return tuple(stages)


def synthetic_stages(stages: int, virtual: int, forward_s: float, backward_s: float,
                     p2p_bytes: float) -> tuple[StageWork, ...]:
    """Uniform stages with fixed costs: per virtual stage forward/v, backward split evenly into input and weight."""
    forward = forward_s / virtual
    half_backward = backward_s / virtual / 2
    block = Block(name="stage", layer=0, forward_s=forward, backward_input_s=half_backward,
                  backward_weight_s=half_backward)
    return tuple(StageWork((block,), p2p_bytes) for _ in range(stages * virtual))
