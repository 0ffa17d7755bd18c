"""Per-rank memory: model state (params, grads, optimizer) under ZeRO/FSDP sharding, activations by recompute mode.

Model state follows Rajbhandari et al. (ZeRO, SC20): with mixed precision and Adam a parameter costs 2 B (16-bit
weight) + the gradient buffer (2 B in fp16; 4 B in fp32, Megatron-LM's default for bf16) + 12 B (fp32 master
weight, momentum, variance). ZeRO-1 shards the optimizer
state over the shard group, ZeRO-2 also the gradients, ZeRO-3 also the weights. Activations follow Korthikanti et
al. ("Reducing activation recomputation in large transformer models", 2022), generalised term by term to gated
MLPs, grouped-query attention and models without dropout; docs/cost-model.md lists the terms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from simulator.catalog.models import ModelSpec
from simulator.config.training_options import (
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE_MODES,
    GradReduceDtype,
    Optimizer,
    Precision,
    Recompute,
    grad_buffer_bytes,
)
from simulator.errors import ScenarioError
from simulator.parallel.experts import expert_sharding
from simulator.parallel.sharding import ZERO_STAGES, Sharding
from simulator.schedules.base import Action
from simulator.workload.transformer import ShardShape, kv_heads_per_rank, validate_shard

OPTIMIZER_MOMENT_BYTES: dict[Optimizer, float] = {"adam": 8.0, "adamw": 8.0, "sgd": 0.0, "sgd_momentum": 4.0}
"""fp32 optimizer state per parameter beside the master weights: Adam/AdamW's momentum and variance, SGD's
momentum."""


UNSHARDED = Sharding()
"""Every rank holds the whole model state (plain data parallelism or a single rank)."""


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of the weights, the gradients and the optimizer state (fp32 master weights included)."""

    param: float
    grad: float
    optimizer: float


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one rank holds, by category."""

    params: float
    grads: float
    optimizer: float
    activations: float = 0.0
    buffers: float = 0.0

    @property
    def model_state(self) -> float:
        """Weights + gradients + optimizer state."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        """Everything: model state, activations and buffers."""
        return self.model_state + self.activations + self.buffers


def state_bytes_per_param(precision: Precision = "bf16", optimizer: Optimizer = "adam",
                          grad_reduce: GradReduceDtype | None = None, fp32_weights: bool = False) -> StateBytes:
    """Bytes per parameter for a training precision, optimizer and gradient buffer format.

    16-bit (and fp8, which keeps 16-bit weights) mixed precision holds 2 B weights, the gradient buffer
    (``grad_reduce``; by default fp32 for bf16 and fp8, fp16 for fp16: grad_buffer_bytes) and a 4 B fp32 master
    copy inside the optimizer state; fp32 training holds 4 B weights and grads and no master copy, and so do
    ``fp32_weights``: PyTorch eager's fp32 weights and their fp32 ``.grad``, which the optimizer updates itself,
    and PyTorch FSDP2's fp32 shards under either kernel era (Sharding.fp32_shards: the fp32 sharded gradient
    whatever the reduce dtype, FSDP2 casting the reduce-scatter's output to the parameter's dtype). Adam adds
    momentum and variance (8 B), SGD with momentum 4 B, plain SGD nothing.
    """
    if precision not in PRECISIONS:
        raise ScenarioError(
            f"unknown precision {precision!r}", field="training.precision", allowed=", ".join(PRECISIONS)
        )
    if optimizer not in OPTIMIZERS:
        raise ScenarioError(
            f"unknown optimizer {optimizer!r}", field="training.optimizer", allowed=", ".join(OPTIMIZERS)
        )
    moments = OPTIMIZER_MOMENT_BYTES[optimizer]
    grad = float(grad_buffer_bytes(precision, grad_reduce))
    if fp32_weights:
        return StateBytes(4.0, 4.0, moments)
    if precision == "fp32":
        return StateBytes(4.0, grad, moments)
    return StateBytes(2.0, grad, 4.0 + moments)


def model_state_memory(
    num_params: float, sharding: Sharding = UNSHARDED, precision: Precision = "bf16", optimizer: Optimizer = "adam",
    grad_reduce: GradReduceDtype | None = None, fp32_weights: bool = False,
) -> MemoryBreakdown:
    """Weights, gradients and optimizer state one rank holds for ``num_params`` parameters under ``sharding``,
    gradients in the buffer format ``grad_reduce``, fp32 weights without a master copy when ``fp32_weights``
    (state_bytes_per_param)."""
    if sharding.stage not in ZERO_STAGES:
        raise ScenarioError(
            f"unknown ZeRO stage {sharding.stage}", field="parallelism.zero", allowed="0, 1, 2, 3"
        )
    if sharding.degree < 1:
        raise ScenarioError(
            f"shard degree {sharding.degree} must be >= 1", field="parallelism.dp", allowed="positive integers"
        )
    per_param = state_bytes_per_param(precision, optimizer, grad_reduce, fp32_weights)
    n = sharding.degree
    return MemoryBreakdown(
        params=num_params * per_param.param / (n if sharding.stage >= 3 else 1),
        grads=num_params * per_param.grad / (n if sharding.stage >= 2 else 1),
        optimizer=num_params * per_param.optimizer / (n if sharding.stage >= 1 else 1),
    )


def routed_params(model: ModelSpec, layers: int, ep: int) -> float:
    """Routed-expert parameters one rank of a stage holding ``layers`` MoE layers keeps (E/ep experts each)."""
    return layers * model.routed_expert_params() / ep


def moe_activation_bytes(model: ModelSpec, shard: ShardShape, routed_tokens: float | None = None) -> float:
    """Bytes a MoE MLP keeps for the backward of one micro-batch on one rank, in place of the dense MLP's
    intermediates: for every token its routed experts receive (``routed_tokens``, the hottest EP rank's; by
    default top_k per own token, uniform routing) the dispatched copy that feeds the experts' first GEMMs and
    the experts' intermediates (as the dense term, 3 d f gated or 2 d f, of width expert_ffn_hidden), and the
    shared experts' intermediates for the rank's own tokens. Experts are not split by TP (expert tensor
    parallelism 1): each TP rank routes its own 1/t of the tokens."""
    moe, d = model.moe, shard.dtype_bytes
    if moe is None:
        return 0.0
    own_tokens = shard.tokens / shard.tp
    received = moe.top_k * own_tokens if routed_tokens is None else routed_tokens
    per_expert_token = (3 if model.gated_mlp else 2) * d * moe.expert_ffn_hidden
    return received * (d * model.hidden + per_expert_token) + own_tokens * moe.shared_experts * per_expert_token


def embedding_rank_params(model: ModelSpec, tp: int) -> float:
    """Embedding parameters one tensor-parallel rank holds: the token table split by vocabulary, the learned
    position table (GPT style) whole, as Megatron-LM keeps it (a plain ``torch.nn.Embedding`` on every TP rank
    beside the ``VocabParallelEmbedding``)."""
    tokens = model.vocab * model.hidden
    return tokens / tp + (model.embedding_params() - tokens)


def rank_params(model: ModelSpec, tp: int, layers: int, first_stage: bool, last_stage: bool, ep: int = 1) -> float:
    """Parameters one tensor-parallel rank of a pipeline stage holds (norms are replicated, not split).

    A MoE layer's router and shared experts are held whole and its routed experts split ``ep`` ways
    (parallel/experts.py: expert tensor parallelism 1).
    The first stage holds the embedding (embedding_rank_params: vocabulary split t ways); the last holds the
    final norm and the output layer, or a copy of the token table when tied (Megatron keeps that copy on the
    last stage).
    """
    norms = 2 * model.norm_params()
    mlp = model.mlp_params()
    mlp_share = mlp / tp
    if model.moe is not None:
        mlp_share = mlp - model.routed_expert_params() + routed_params(model, 1, ep)
    per_layer = (model.layer_params() - norms - mlp) / tp + mlp_share + norms
    total = layers * per_layer
    if first_stage:
        total += embedding_rank_params(model, tp)
    if last_stage:
        output = model.vocab * model.hidden / tp
        if model.tied_embeddings and first_stage:
            output = 0.0
        total += model.norm_params() + output
    return total


def activation_bytes_per_layer(model: ModelSpec, shard: ShardShape, recompute: Recompute = "none",
                               routed_tokens: float | None = None) -> float:
    """Bytes one layer keeps for the backward pass of one micro-batch on one rank.

    For a GPT layer (FFN 4h, multi-head attention, dropout, 16-bit) this is Korthikanti et al.'s
    s b h (34 + 5 a s / h) without tensor parallelism, s b h (10 + 24/t + 5 a s/(h t)) with it, s b h/t (34 + ...)
    with sequence parallelism; selective recompute drops the score term; full recompute keeps the layer input.
    A MoE layer's MLP intermediates are its experts' (moe_activation_bytes, ``routed_tokens`` as there).
    PyTorch eager (``shard.eager``) saves SiLU's output in a gated MLP; under autocast (``shard.autocast``) also
    the norms' fp32 inputs and each linear's 16-bit copy of its fp32 weight (autocast's cast, which the backward
    multiplies by; the bias's copy is not saved), and under full recompute the fp32 layer input alone. Under
    FSDP the weights the backward multiplies by are the unit's, gathered again (the buffers).
    """
    validate_shard(model, shard)
    if recompute not in RECOMPUTE_MODES:
        raise ScenarioError(
            f"unknown recompute mode {recompute!r}", field="training.recompute", allowed=", ".join(RECOMPUTE_MODES)
        )
    t, d = shard.tp, shard.dtype_bytes
    tokens, h = shard.tokens, model.hidden
    replicated_tokens = shard.pointwise_tokens
    if recompute == "full":
        return shard.stream_bytes * replicated_tokens * h
    mask = 1.0 if model.dropout else 0.0
    q_width = model.heads * model.head_dim / t
    kv_width = kv_heads_per_rank(model, t) * model.head_dim
    ffn = model.ffn_hidden / t
    # Outside the tensor-parallel region (split by SP): two norm inputs (the residual stream's), the QKV and MLP
    # inputs, two dropout masks.
    outside = replicated_tokens * (2 * shard.stream_bytes * h + 2 * d * h + 2 * mask * h)
    # Inside it: Q, K, V, the output-projection input, and the MLP intermediates (eager's F.silu(g) * u saves
    # SiLU's output for the product besides the gate, the up and the product).
    mlp_intermediates = (3 + shard.eager) * d * ffn if model.gated_mlp else 2 * d * ffn
    inside = tokens * (d * (q_width + 2 * kv_width) + d * q_width)
    if model.moe is not None:
        inside += moe_activation_bytes(model, shard, routed_tokens)
    else:
        inside += tokens * mlp_intermediates
    if shard.autocast:
        inside += d * h * (2 * q_width + 2 * kv_width + (3 if model.gated_mlp else 2) * ffn)
    if recompute == "selective":
        return outside + inside
    # Scores: softmax output (d bytes), and with dropout its mask (1 byte) and dropped copy (d bytes), per head.
    per_score = d + (1 + d) * mask
    scores = per_score * tokens * shard.seq_len * model.heads / t
    return outside + inside + scores


def recompute_working_bytes(model: ModelSpec, shard: ShardShape, recompute: Recompute, rematerialized: Recompute,
                            routed_tokens: float | None = None) -> float:
    """Bytes the backward holds beyond the stored activations while it recomputes one layer: that layer's
    activations as the forward without recompute keeps them (``rematerialized``: ``none``, or ``selective``
    under flash attention, which keeps no score matrix), less what ``recompute`` stored for it. Korthikanti et
    al.'s ``2 s b h L`` for full recompute counts the stored inputs only; the layer being recomputed comes on
    top, ``s b h (34 + 5 a s / h)`` for a GPT layer without TP."""
    return (activation_bytes_per_layer(model, shard, rematerialized, routed_tokens)
            - activation_bytes_per_layer(model, shard, recompute, routed_tokens))


def weight_grad_bytes_per_layer(model: ModelSpec, shard: ShardShape, routed_tokens: float | None = None) -> float:
    """Bytes one layer keeps from a micro-batch's input-grad backward (B) to its deferred weight-grad pass (W) on
    one rank: the input and the output gradient of each weight GEMM, which W multiplies (dW = X^T dY).

    Zero Bubble (Qi et al., ICLR 2024, Table 1) counts this M_W = 32 s b h for a GPT layer without TP: GEMM
    inputs h (QKV) + h (projection) + h (FC1) + 4h (FC2) and output gradients 3h + h + 4h + h, 16 h elements
    of 2 bytes per token. PyTorch's pipelining keeps the same tensors: `stage_backward_input` retains the graph
    and each parameter group's intermediates and their gradients for `stage_backward_weight`. The inputs stored
    sharded under sequence parallelism (norm outputs) count as the activation model stores them; GQA, gated MLPs
    and MoE experts (``routed_tokens`` as in moe_activation_bytes) widen the terms as they do the GEMMs."""
    validate_shard(model, shard)
    t, h, tokens = shard.tp, model.hidden, shard.tokens
    q_width = model.heads * model.head_dim / t
    kv_width = kv_heads_per_rank(model, t) * model.head_dim
    up_widths = 2 if model.gated_mlp else 1

    def mlp(mlp_tokens: float, width: float) -> float:
        """FC1's output gradient, FC2's input and FC2's output gradient; FC1's input is counted apart."""
        return mlp_tokens * (up_widths * width + width + h)

    norm_output = shard.pointwise_tokens * h
    attention = norm_output + tokens * (q_width + 2 * kv_width) + tokens * (q_width + h)
    moe = model.moe
    if moe is None:
        ffn = norm_output + mlp(tokens, model.ffn_hidden / t)
    else:
        own_tokens = tokens / t
        received = moe.top_k * own_tokens if routed_tokens is None else routed_tokens
        ffn = (norm_output + received * h + mlp(received, moe.expert_ffn_hidden)
               + mlp(own_tokens * moe.shared_experts, moe.expert_ffn_hidden))
    return shard.dtype_bytes * (attention + ffn)


def head_weight_grad_bytes(model: ModelSpec, shard: ShardShape) -> float:
    """Bytes the output layer keeps for its deferred W: its input (the final norm's output) and the logits'
    gradient, V/t per token."""
    return shard.dtype_bytes * (shard.pointwise_tokens * model.hidden + shard.tokens * model.vocab / shard.tp)


def head_activation_bytes(model: ModelSpec, shard: ShardShape) -> float:
    """Bytes the last stage keeps for the loss: fp32 logits, 4 s b V / t (Korthikanti et al.). PyTorch eager's
    F.cross_entropy on ``logits.float()`` holds at its backward's peak the 16-bit logits, the saved fp32
    log-probabilities, their zeroed fp32 gradient and log-softmax's fp32 input gradient: 14 B per logit at
    16 bits."""
    per_logit = 3 * 4.0 + shard.dtype_bytes if shard.eager else 4.0
    return per_logit * shard.tokens * model.vocab / shard.tp


def unsharded_layers_bytes(model: ModelSpec, tp: int, layers: int = 2, element_bytes: float = 2.0) -> float:
    """Bytes of ``layers`` whole layers' weights or gradients on one TP rank: what ZeRO-3/FSDP keeps gathered
    (the running layer plus the prefetched one), or what a sharded gradient step holds before its
    reduce-scatter (the gradients being reduced plus those being computed)."""
    return layers * math.ceil(model.layer_params() / tp) * element_bytes


def fsdp_working_set_bytes(units: Sequence[float], param_bytes: float, reduce_bytes: float,
                           prefetches: bool = True) -> float:
    """Peak bytes PyTorch FSDP2 holds beside its shards for a chain of wrapped units (each unit's parameters on
    one TP rank, forward order; torch 2.13 _fully_shard/_fsdp_param_group.py). Forward of unit i: its unsharded
    parameters and the all-gather outputs of units i+1 and i+2 (implicit prefetch keeps one all-gather result
    until the next copy-out, the copy-out copies it into the unsharded parameters). Backward of unit i: its
    parameters, unit i-1's (prefetched), the gradients autograd gives it in the parameters' dtype, and unit
    i+1's reduce-scatter input (``reduce_bytes`` per element, the reduce dtype), which lives until unit i's
    post_backward. That reshards unit i first, then waits for unit i+1's reduce-scatter and drops its input,
    then copies unit i's gradients into its own input (foreach_reduce's chunk_cat, the gradients freed after):
    unit i-1's parameters, unit i's gradients and its reduce-scatter input. ``reduce_bytes`` 0: no
    reduce-scatter in the backward (the gradients accumulate unsharded, counted apart). Without ``prefetches``
    (a one-rank shard group: FSDP2's unshard gathers nothing, and each unit's wait_for_unshard copies its shard
    into its unsharded parameters when its own pass reaches it) no other unit's parameters are held: unit i's
    alone forward, with its gradients and unit i+1's reduce-scatter input backward."""
    padded = [0.0, *units, 0.0, 0.0]
    inner = range(1, len(units) + 1)
    ahead = 1.0 if prefetches else 0.0
    forward = max((padded[i] + ahead * (padded[i + 1] + padded[i + 2])) * param_bytes for i in inner)
    backward = max((ahead * padded[i - 1] + 2 * padded[i]) * param_bytes + padded[i + 1] * reduce_bytes
                   for i in inner)
    reduce = max(ahead * padded[i - 1] * param_bytes + padded[i] * (param_bytes + reduce_bytes) for i in inner)
    return max(forward, backward, reduce)


def fsdp_pipelined_bytes(actions: Sequence[Action], chunk_units: Sequence[Sequence[float]], param_bytes: float,
                         grad_bytes: float) -> float:
    """Peak bytes PyTorch FSDP2 holds beside its shards on one pipeline rank under torch.distributed.pipelining
    (torchtitan: ``reshard_after_forward=not pp_enabled``; the stage sets ``set_reshard_after_backward(False)``
    and ``set_requires_gradient_sync(False)`` on every backward, and its REDUCE_GRAD reduce-scatters and
    reshards). ``actions`` are the rank's schedule, ``chunk_units`` each chunk's units (parameters on one TP
    rank). Counted, walking the actions: a chunk's unsharded parameters (``param_bytes``), from its first
    forward, when its units are gathered, to its last gradient action, after which the stage's REDUCE_GRAD
    reshards them (the runtime's UNSHARD gathers them before the rank's first action, which changes no peak:
    every chunk's first forward comes before any gradient action); its unsharded gradients in the reduce dtype
    (``grad_bytes``, FSDP2's ``unsharded_accumulated_grad``) from its first weight-gradient action (BW or W: an
    input-gradient B makes none) to its last. Not counted: the all-gather outputs in flight during the first
    forward (within the chunk's parameters), one unit's fresh gradient before it is folded into the
    accumulator."""
    first_forward: dict[int, int] = {}
    first_grad: dict[int, int] = {}
    last_grad: dict[int, int] = {}
    for index, action in enumerate(actions):
        if action.kind == "F":
            first_forward.setdefault(action.chunk, index)
        elif action.kind in ("BW", "W"):
            first_grad.setdefault(action.chunk, index)
            last_grad[action.chunk] = index
    sizes = [sum(units) for units in chunk_units]
    peak = 0.0
    for index in range(len(actions)):
        held = 0.0
        for chunk, size in enumerate(sizes):
            end = last_grad.get(chunk, -1)
            if first_forward.get(chunk, index + 1) <= index <= end:
                held += size * param_bytes
            if first_grad.get(chunk, index + 1) <= index <= end:
                held += size * grad_bytes
        peak = max(peak, held)
    return peak


def rank_memory(
    model: ModelSpec,
    shard: ShardShape,
    *,
    layers: int,
    in_flight: float,
    recompute: Recompute = "none",
    sharding: Sharding = UNSHARDED,
    precision: Precision = "bf16",
    optimizer: Optimizer = "adam",
    grad_reduce: GradReduceDtype | None = None,
    first_stage: bool = True,
    last_stage: bool = True,
    buffer_bytes: float = 0.0,
    ep: int = 1,
    routed_tokens: float | None = None,
) -> MemoryBreakdown:
    """Peak memory of one rank of a pipeline stage holding ``layers`` layers and ``in_flight`` micro-batches.

    ``in_flight`` comes from the pipeline schedule (1F1B: p - stage index; GPipe: all micro-batches);
    ``grad_reduce`` is the gradient buffer's format (state_bytes_per_param); ``buffer_bytes`` are communication
    buffers and workspaces the caller accounts for; ``ep`` splits the routed experts, whose state is sharded
    over the ranks holding the same experts (parallel/experts.expert_sharding: under PyTorch FSDP2 as fp32 shards
    as the dense part, otherwise only their optimizer state); ``routed_tokens`` are the tokens the rank's experts
    receive per micro-batch (moe_activation_bytes).
    """
    params = rank_params(model, shard.tp, layers, first_stage, last_stage, ep)
    routed = routed_params(model, layers, ep)
    dense = model_state_memory(params - routed, sharding, precision, optimizer, grad_reduce,
                               shard.eager or sharding.fp32_shards)
    experts = model_state_memory(routed, expert_sharding(sharding, ep, shard.tp), precision, optimizer, grad_reduce,
                                 sharding.shards_experts and (shard.eager or sharding.fp32_shards))
    state = MemoryBreakdown(dense.params + experts.params, dense.grads + experts.grads,
                            dense.optimizer + experts.optimizer)
    per_micro_batch = layers * activation_bytes_per_layer(model, shard, recompute, routed_tokens)
    if last_stage:
        per_micro_batch += head_activation_bytes(model, shard)
    return MemoryBreakdown(
        params=state.params,
        grads=state.grads,
        optimizer=state.optimizer,
        activations=in_flight * per_micro_batch,
        buffers=buffer_bytes,
    )
