"""The kernels of a plain PyTorch step under torch.autocast without torch.compile (`training.kernels: eager`).

The fused kernel list (workload/transformer.py) is Megatron-LM's with Transformer Engine: 16-bit weights whose
fp32 master copy lives in the optimizer, norms and the residual stream in 16 bits, one fused cross-entropy, bias
gradients in the weight-gradient GEMMs' epilogue. PyTorch eager under autocast keeps the weights in fp32 and
launches every op apart, so its step runs the same GEMMs and attention with these kernels around them (read off
a profiled step, traces/h200-step; docs/cost-model.md "PyTorch eager" lists them with their aten ops):

- autocast's casts: every linear casts its fp32 weight (and bias) to 16 bits each forward, and its input when
  that is fp32 (a norm's output); the backward casts each 16-bit weight gradient, and the gradient of each cast
  input, back to fp32 (ToCopyBackward0);
- the norms in fp32 (autocast runs layer_norm and rms_norm in fp32), as PyTorch's own kernels;
- the residual stream in fp32: each residual add sums the fp32 stream and a 16-bit branch (an unrolled mixed-
  dtype kernel), and in the backward the skip's fp32 gradient is added to the norm's (add_) and cast to 16 bits
  for the branch;
- the bias gradients as reductions over the output gradient, one per linear layer (AddmmBackward0's sum);
- the attention block's backward copies of the QKV gradient from the heads' layout into the projection's: a
  packed QKV unbound into heads stacks the three and copies the permuted stack; separate q, k and v projections
  (``ModelSpec.separate_qkv``, Hugging Face's Llama) copy each of the three once, `qkv_proj.grad_layout`;
- a gated MLP as ``F.silu(gate) * up``: SiLU and the product, two kernels forward; the product's two gradients and
  SiLU's backward, three kernels backward (Megatron-LM fuses SwiGLU into one each way);
- the loss on ``logits.float()``: the cast, log-softmax and NLL forward; the zeroed fp32 gradient, the NLL and
  log-softmax backward and the cast back;
- the embedding's fp32 table: gathered and scattered in fp32, its gradient zeroed;
- AccumulateGrad's add of each fresh fp32 gradient into the parameter's ``.grad`` (read both, write 4 B) on every
  micro-batch but the first, whose gradient becomes ``.grad`` as it is: charged as its (m - 1) / m share on
  each micro-batch (``ShardShape.accumulating_share``), so the step's total is exact.

Under PyTorch FSDP (``ShardShape.fsdp_weights``) the layers see the 16-bit weights FSDP2 all-gathered in
param_dtype, and torchtitan runs them without autocast: no cast of weights, inputs or weight gradients (the
fp32 shard's cast is FSDP's copy-in, the reduce dtype's its reduce-scatter copy, parallel/sharding.py), the
norms (PyTorch's own kernels, fp32 math inside), the residual stream and the embedding table in 16 bits, and no
AccumulateGrad add (FSDP2 reduce-scatters each micro-batch's gradients and adds the shard); the loss still runs
on ``logits.float()`` (torchtitan's cross_entropy_loss), SiLU and the product and the QKV layout copies apart.

Every added kernel is memory-bound and costed from its bytes at the GPU's HBM fraction, or a measured family's
(Kernel.memory_kind, kernels.yaml). Kernels keep the fused list's names where they stand for the same work, so
a block's split into attention and MLP (stage_work.py) is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.catalog.models import ModelSpec
from simulator.config.model_options import Norm
from simulator.config.training_options import Recompute
from simulator.workload.transformer import (
    AttentionCost,
    Kernel,
    MemoryKind,
    PassKernels,
    ShardShape,
    embedding_kernels,
    head_kernels,
    kv_heads_per_rank,
    layer_kernels,
)

FP32 = 4
"""Bytes of an fp32 element: autocast's weights, norms, residual stream, loss and gradients of the weights."""
NORM_FAMILY: dict[Norm, MemoryKind] = {"layernorm": "eager_layernorm", "rmsnorm": "eager_rmsnorm"}
"""PyTorch's own norm kernels (F.layer_norm, F.rms_norm): one forward kernel, an input- and a weight-gradient
kernel backward, measured together (kernels.yaml)."""
CAST_INPUT = ("qkv_proj", "mlp_gate", "mlp_up", "mlp_fc1", "lm_head")
"""The linear layers whose input is a norm's fp32 output, which autocast casts to 16 bits before the GEMM."""


def _table_bytes(shard: ShardShape) -> int:
    """Bytes of an embedding-table element and of its gradient: autocast's fp32 table, or FSDP's gathered
    16-bit one."""
    return FP32 if shard.autocast else shard.dtype_bytes


def _stream(name: str, elements: float, read: float, written: float, *, backward: bool = False,
            family: MemoryKind | None = None) -> Kernel:
    """A memory-bound kernel over ``elements``: ``read`` and ``written`` bytes per element."""
    return Kernel(name, elements, (read + written) * elements, "elementwise", backward=backward,
                  memory_kind=family)


def _cast_down(name: str, elements: float, shard: ShardShape) -> Kernel:
    """fp32 -> 16 bits (PyTorch's vectorized float-to-16-bit copy): streams at the HBM fraction."""
    return _stream(name, elements, FP32, shard.dtype_bytes)


def _cast_up(name: str, elements: float, shard: ShardShape, backward: bool) -> Kernel:
    """16 bits -> fp32 (a copy between dtypes, which PyTorch runs unrolled)."""
    return _stream(name, elements, shard.dtype_bytes, FP32, backward=backward, family="mixed_dtype")


def _norm(kernel: Kernel, model: ModelSpec, shard: ShardShape) -> Kernel:
    """A fused norm kernel (forward or backward, its FLOPs kept) run by PyTorch's own kernels on the residual
    stream's format (fp32 under autocast, else 16 bits): forward reads x and writes y; backward reads x and dy
    and writes dx (the weight-gradient kernel's second read is in its family's measured rate, the benchmark
    having timed both kernels together)."""
    elements = shard.pointwise_tokens * model.hidden
    tensors = 3 if kernel.backward else 2
    return replace(kernel, hbm_bytes=tensors * shard.stream_bytes * elements, memory_kind=NORM_FAMILY[model.norm])


def _residual(name: str, model: ModelSpec, shard: ShardShape) -> tuple[Kernel, tuple[Kernel, ...]]:
    """The residual stream plus a 16-bit branch (forward; under autocast an fp32 stream, a mixed-dtype add);
    backward the skip's gradient added to the norm's input gradient (add_), then under autocast cast to 16 bits
    for the branch."""
    elements = shard.pointwise_tokens * model.hidden
    stream = shard.stream_bytes
    backward = _stream(f"{name}.bwd", elements, 2 * stream, stream, backward=True)
    if not shard.autocast:
        return _stream(name, elements, 2 * stream, stream), (backward,)
    return (_stream(name, elements, FP32 + shard.dtype_bytes, FP32, family="mixed_dtype"),
            (backward, _cast_down(f"{name}.grad_cast", elements, shard)))


def _output(gemm: Kernel) -> tuple[float, float]:
    """(rows, columns) of a linear's GEMM output, which sizes the cast of its input or input gradient: every
    GEMM of the fused list carries it (transformer.matmul_kernels)."""
    if not gemm.output:
        raise ValueError(f"{gemm.name} has no output shape, so its autocast cast cannot be sized")
    _, rows, columns = gemm.output
    return rows, columns


def _linear_casts(gemm: Kernel, weights: float, biases: float, shard: ShardShape) -> tuple[Kernel, ...]:
    """autocast's casts before a linear's forward GEMM ``gemm`` (its output (1, rows, columns)): the fp32
    weight and bias to 16 bits, and the fp32 input of a linear after a norm; none without autocast (FSDP's
    gathered weights are 16-bit already, and so is the norm's output)."""
    if not shard.autocast:
        return ()
    casts = [_cast_down(f"{gemm.name}.cast_weight", weights, shard)]
    if biases:
        casts.append(_cast_down(f"{gemm.name}.cast_bias", biases, shard))
    if gemm.name.removeprefix("recompute.") in CAST_INPUT:
        rows, columns = _output(gemm)
        casts.append(_cast_down(f"{gemm.name}.cast_input", rows * weights / columns, shard))
    return tuple(casts)


def _silu_times_up(fused: Kernel, model: ModelSpec, shard: ShardShape) -> tuple[Kernel, ...]:
    """A gated MLP's activation as ``F.silu(gate) * up`` launches it, from the fused SwiGLU kernel ``fused``
    (its FLOPs split as SiLU's 4 and the product's 1 per element forward, 8 and 1 + 1 backward): forward SiLU
    (read the gate, write) and the product (read both, write), 10 B per element at 16 bits against the fused 6;
    backward the product's gradients, one per factor (read the output gradient and the other factor, write),
    then SiLU's (read its output gradient and the gate, write), 18 B against 10."""
    d = shard.dtype_bytes
    elements = shard.tokens * model.ffn_hidden / shard.tp
    if fused.name.endswith(".bwd"):
        passes = (("mul.bwd_gate", 0.1), ("mul.bwd_up", 0.1), ("silu.bwd", 0.8))
        return tuple(replace(fused, name=f"{fused.name.removesuffix('.bwd')}.{step}", flops=share * fused.flops,
                             hbm_bytes=3 * d * elements) for step, share in passes)
    return (replace(fused, name=f"{fused.name}.silu", flops=0.8 * fused.flops, hbm_bytes=2 * d * elements),
            replace(fused, name=f"{fused.name}.mul", flops=0.2 * fused.flops, hbm_bytes=3 * d * elements))


def _eager_forward(kernels: tuple[Kernel, ...], model: ModelSpec, shard: ShardShape,
                   weights: dict[str, float], biases: dict[str, float]) -> tuple[Kernel, ...]:
    """A pass's forward kernels run eagerly: norms and residual adds in fp32, each linear's casts before it, a
    gated MLP's SiLU and product apart."""
    out: list[Kernel] = []
    for kernel in kernels:
        prefix = "recompute." if kernel.name.startswith("recompute.") else ""
        base = kernel.name.removeprefix(prefix)
        if base == "mlp_act" and model.gated_mlp:
            out.extend(_silu_times_up(kernel, model, shard))
        elif base.endswith("_norm"):
            out.append(_norm(kernel, model, shard))
        elif base.endswith("_residual"):
            out.append(replace(_residual(base, model, shard)[0], name=kernel.name))
        elif base in weights:
            out.extend(_linear_casts(kernel, weights[base], biases.get(base, 0.0), shard))
            out.append(kernel)
        else:
            out.append(kernel)
    return tuple(out)


def _linear_weights(layer: PassKernels) -> tuple[dict[str, float], dict[str, float]]:
    """Each linear's weight and bias elements on this rank, from its weight-gradient kernels."""
    weights = {k.name.removesuffix(".wgrad"): k.weights for k in layer.backward_weight if k.name.endswith(".wgrad")}
    biases = {k.name.removesuffix(".bgrad"): k.weights for k in layer.backward_weight if k.name.endswith(".bgrad")}
    return weights, biases


def _qkv_layout_copies(model: ModelSpec, shard: ShardShape) -> tuple[Kernel, ...]:
    """The attention's q, k and v gradients copied from the heads' layout into the projections' (read and write
    16 bits): a packed QKV stacks the three and copies the permuted stack (the trace's two passes over the QKV
    width); separate projections copy each once (the transpose and view of Hugging Face's Llama undone)."""
    q = shard.tokens * model.heads * model.head_dim / shard.tp
    kv = shard.tokens * kv_heads_per_rank(model, shard.tp) * model.head_dim
    d = shard.dtype_bytes
    if model.separate_qkv:
        return tuple(_stream(f"qkv_proj.grad_layout.{name}", elements, d, d, backward=True)
                     for name, elements in (("q", q), ("k", kv), ("v", kv)))
    return tuple(_stream(f"qkv_proj.grad_layout.{step}", q + 2 * kv, d, d, backward=True)
                 for step in ("stack", "copy"))


def _eager_backward_input(kernels: tuple[Kernel, ...], model: ModelSpec, shard: ShardShape) -> tuple[Kernel, ...]:
    """The input-gradient pass run eagerly: residual and norm backwards on the stream's format (fp32 under
    autocast, 16 bits under FSDP), under autocast each cast input's gradient cast back to fp32 after its linear's
    input-gradient GEMM, the attention's QKV gradients copied into the projections' layout, a gated MLP's SiLU
    and product backward apart and its two input gradients of the norm's output summed."""
    out: list[Kernel] = []
    for kernel in kernels:
        base = kernel.name.removesuffix(".bwd")
        if kernel.name.endswith(".bwd") and base.endswith("_norm"):
            if base == "mlp_norm" and model.gated_mlp:
                elements = shard.tokens * model.hidden
                stream = shard.stream_bytes
                out.append(_stream("mlp_norm.grad_sum", elements, 2 * stream, stream, backward=True))
            out.append(_norm(kernel, model, shard))
        elif kernel.name.endswith(".bwd") and base.endswith("_residual"):
            out.extend(_residual(base, model, shard)[1])
        elif kernel.name == "mlp_act.bwd" and model.gated_mlp:
            out.extend(_silu_times_up(kernel, model, shard))
        elif kernel.name == "attention.bwd":
            out.append(kernel)
            out.extend(_qkv_layout_copies(model, shard))
        elif (shard.autocast and kernel.name.endswith(".dgrad")
              and kernel.name.removesuffix(".dgrad") in CAST_INPUT):
            rows, columns = _output(kernel)
            out.append(kernel)
            out.append(_cast_up(f"{kernel.name.removesuffix('.dgrad')}.cast_input.bwd", rows * columns, shard,
                                backward=True))
        else:
            out.append(kernel)
    return tuple(out)


def _accumulate(name: str, params: float, shard: ShardShape) -> tuple[Kernel, ...]:
    """AccumulateGrad's ``.grad += grad`` over ``params`` fp32 gradients (read 4 + 4, write 4 B), its share of
    the step's micro-batches that add (none with one micro-batch)."""
    if shard.accumulating_share == 0.0:
        return ()
    return (_stream(f"{name}.accumulate", params, 2 * FP32 * shard.accumulating_share,
                    FP32 * shard.accumulating_share, backward=True),)


def _grad_casts(kernels: tuple[Kernel, ...], shard: ShardShape) -> tuple[Kernel, ...]:
    """Under autocast each 16-bit weight and bias gradient cast to its fp32 parameter's dtype after the kernel
    that made it, then added into ``.grad``; under FSDP the gradients are the gathered 16-bit parameters', which
    FSDP's own copies take from there (Sharding.grad_copy_bytes)."""
    if not shard.autocast:
        return kernels
    out: list[Kernel] = []
    for kernel in kernels:
        out.append(kernel)
        if kernel.weights > 0:
            out.append(_cast_up(f"{kernel.name}.cast", kernel.weights, shard, backward=True))
            out.extend(_accumulate(kernel.name, kernel.weights, shard))
    return tuple(out)


def _eager(kernels: PassKernels, model: ModelSpec, shard: ShardShape) -> PassKernels:
    """A pass list run eagerly; under autocast the norms' fp32 weight (and bias) gradients, made in fp32 by
    their backward kernels, are added into ``.grad`` like the linears', one AccumulateGrad per tensor (under
    FSDP, as with one micro-batch, none: `_accumulate`)."""
    weights, biases = _linear_weights(kernels)
    forward = _eager_forward(kernels.forward, model, shard, weights, biases)
    recompute = _eager_forward(kernels.recompute, model, shard, weights, biases)
    backward_input = _eager_backward_input(kernels.backward_input, model, shard)
    norms = tuple(k.name for k in kernels.backward_input if k.name.endswith("_norm.bwd"))
    tensors = ("weight", "bias") if model.norm == "layernorm" else ("weight",)
    norm_adds = tuple(add for name in norms for tensor in tensors
                      for add in _accumulate(f"{name}.{tensor}", model.hidden, shard))
    return PassKernels(forward, recompute, backward_input, _grad_casts(kernels.backward_weight, shard) + norm_adds)


def eager_layer_kernels(model: ModelSpec, shard: ShardShape, recompute: Recompute,
                        cost: AttentionCost) -> PassKernels:
    """One layer's kernels for one micro-batch as PyTorch eager runs them: under autocast over each rank's fp32
    weights, or under FSDP on its gathered 16-bit weights (``shard.autocast``)."""
    return _eager(layer_kernels(model, shard, recompute, cost), model, shard)


def eager_head_kernels(model: ModelSpec, shard: ShardShape) -> PassKernels:
    """The final norm, the output layer and the loss on ``logits.float()``: cast to fp32, log-softmax and NLL
    forward; backward the log-probabilities' gradient zeroed, NLL's scatter, the log-softmax backward and the
    cast of the gradient back to 16 bits (F.cross_entropy on fp32 logits, as the trace's step and Hugging Face
    models call it)."""
    fused = head_kernels(model, shard)
    logits = shard.tokens * model.vocab / shard.tp
    rows = shard.tokens
    loss_forward = (
        _cast_up("cross_entropy.cast", logits, shard, backward=False),
        _stream("cross_entropy.log_softmax", logits, FP32, FP32, family="eager_softmax"),
        _stream("cross_entropy.nll", rows, FP32 + 8, 0.0),
    )
    loss_backward = (
        _stream("cross_entropy.grad_zero", logits, 0.0, FP32, backward=True),
        _stream("cross_entropy.nll.bwd", rows, 8, FP32, backward=True),
        _stream("cross_entropy.log_softmax.bwd", logits, 2 * FP32, FP32, backward=True, family="eager_softmax"),
        replace(_cast_down("cross_entropy.cast.bwd", logits, shard), backward=True),
    )
    forward = tuple(k for k in fused.forward if not k.name.startswith("cross_entropy")) + loss_forward
    backward_input = loss_backward + tuple(k for k in fused.backward_input if not k.name.startswith("cross_entropy"))
    return _eager(PassKernels(forward, fused.recompute, backward_input, fused.backward_weight), model, shard)


def eager_embedding_kernels(model: ModelSpec, shard: ShardShape) -> PassKernels:
    """The table's lookup (gather rows, write the stream) and its gradient: the table's gradient zeroed, then the
    rows' gradients scattered into it (embedding_dense_backward; its sort of the token ids is not counted); in
    fp32 under autocast, in 16 bits from FSDP's gathered table."""
    fused = embedding_kernels(model, shard)
    elements = shard.tokens * model.hidden
    tables = 2 if model.learned_positions else 1
    table = (model.vocab / shard.tp + (model.max_positions if model.learned_positions else 0)) * model.hidden
    w = _table_bytes(shard)
    forward = replace(fused.forward[0], hbm_bytes=(tables + 1) * w * elements)
    zero = _stream("embedding.grad_zero", table, 0.0, w, backward=True)
    scatter = replace(fused.backward_weight[0], hbm_bytes=(w + 2 * w * tables) * elements)
    adds = _accumulate("embedding", model.vocab / shard.tp * model.hidden, shard)
    if model.learned_positions:
        adds += _accumulate("embedding.positions", model.max_positions * model.hidden, shard)
    return PassKernels((forward,), (), (), (zero, scatter, *adds))
