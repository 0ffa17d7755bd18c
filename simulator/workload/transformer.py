"""Transformer cost model: the kernels of one layer (and of the embedding and output head) with FLOPs and HBM bytes.

Every count is for one rank working on one micro-batch of ``b`` sequences of ``s`` tokens, under tensor
parallelism ``t`` (heads, KV heads, FFN columns and vocabulary split t ways), context parallelism ``c`` (each
rank holds s/c query tokens and attends to the whole sequence) and optional sequence parallelism (norms,
residuals and dropout run on the rank's 1/t of the tokens). Backward passes are split into input-gradient and
weight-gradient kernels so that schedules such as ZB-H1 can place them apart. docs/cost-model.md derives each count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal, get_args

from simulator.catalog.models import ModelSpec
from simulator.config.model_options import Norm
from simulator.config.training_options import RECOMPUTE_MODES, AttentionKernel, Recompute
from simulator.errors import ScenarioError

KernelKind = Literal["matmul", "attention", "elementwise"]
"""What bounds a kernel and which efficiency curve it follows (roofline.py): GEMMs, the attention core, the rest."""
MemoryKind = Literal["score_passes", "layernorm", "eager_layernorm", "eager_rmsnorm", "eager_softmax",
                     "mixed_dtype"]
"""Memory-bound kernel families whose HBM efficiency a GPU's calibration may measure apart from a streaming
kernel's (Kernel.memory_kind): the passes over unfused attention scores (softmax, dropout and their gradients),
the 2021 fused LayerNorm of apex and Megatron-LM, and PyTorch eager's own kernels (workload/eager.py): its
LayerNorm and RMSNorm, its log-softmax, and the elementwise kernels whose operands differ in dtype, which
PyTorch runs unrolled rather than vectorized."""
MEASURED_KERNELS: tuple[MemoryKind, ...] = get_args(MemoryKind)


@dataclass(frozen=True)
class NormCost:
    """A norm kernel's cost per element: nominal FLOPs (forward, backward; the kernels are memory-bound), the
    activation-sized tensors its backward reads, and its measured family (None: it streams)."""

    flops: tuple[float, float]
    backward_reads: int
    memory_kind: MemoryKind | None = None


_NORMS: dict[Norm, NormCost] = {"rmsnorm": NormCost((4.0, 8.0), 2), "layernorm": NormCost((7.0, 14.0), 2)}
"""Norms as Transformer Engine runs them: the backward reads x and dy once, writing dx and the weight
gradients from the same pass."""
_APEX_LAYERNORM = NormCost((7.0, 14.0), 4, "layernorm")
"""LayerNorm as apex's and Megatron-LM's 2021 fused kernel runs it (megatron/fused_kernels/
layer_norm_cuda_kernel.cu, HostLayerNormGradient): cuComputePartGradGammaBeta reads dy and x for the weight
gradients, then cuComputeGradInput reads both again to write dx (`training.layernorm_fusion: false`)."""
ACTIVATION_FLOPS = {True: (5.0, 10.0), False: (8.0, 12.0)}
"""FLOPs per element of the MLP activation (forward, backward), by ``gated_mlp``: SwiGLU, or GeLU's tanh form."""
_CROSS_ENTROPY_FLOPS = (5.0, 2.0)
_FP32 = 4
# HBM bytes per logit of Megatron-LM's unfused vocab-parallel cross-entropy on ``logits.float()``
# (megatron/mpu/cross_entropy.py, 2021), pass by pass, past the 16-bit read (forward) or write (backward) of the
# cast: forward cast (write 4), max (read 4), sub_ (4 + 4), exp (4 + 4), sum (4), div_ (4 + 4); backward
# mul_ by the loss gradient (4 + 4), cast back (read 4).
_UNFUSED_CROSS_ENTROPY_BYTES = (9 * _FP32, 3 * _FP32)


@dataclass(frozen=True, slots=True)
class Kernel:
    """One GPU kernel: ``flops``, HBM ``hbm_bytes`` moved, its ``kind`` and the size its efficiency depends on.

    ``size_dim`` is the smallest GEMM dimension for a matmul, the key length for attention; 0 when it does not
    apply (elementwise) or is not known, which leaves the efficiency at its plateau. ``backward`` marks a
    backward-pass kernel: the attention core's and a measured family's efficiency differ by pass.
    ``weights`` is the number of weight elements a weight-gradient kernel produces (a weight-gradient GEMM, an
    unfused bias-gradient reduction, the embedding's scatter-add; 0 for every other kernel).
    ``output`` is a GEMM's (batch, rows, columns) of output, which sets how its tiles fill the GPU's SMs
    (roofline.wave_efficiency); empty when not a GEMM or not known. ``memory_kind`` names the family of a
    memory-bound kernel whose measured HBM efficiency may differ from a streaming kernel's (MEASURED_KERNELS,
    Efficiency.measured_memory); None for the others.
    """

    name: str
    flops: float
    hbm_bytes: float
    kind: KernelKind
    size_dim: float = 0.0
    backward: bool = False
    weights: float = 0.0
    output: tuple[float, float, float] | tuple[()] = ()
    memory_kind: MemoryKind | None = None


def kernel_flops(kernels: Iterable[Kernel]) -> float:
    """The FLOPs of ``kernels`` together, summed in order."""
    return sum(kernel.flops for kernel in kernels)


def kernel_bytes(kernels: Iterable[Kernel]) -> float:
    """The HBM bytes of ``kernels`` together, summed in order: the traffic their roofline times are costed by."""
    return sum(kernel.hbm_bytes for kernel in kernels)


@dataclass(frozen=True)
class ShardShape:
    """How one rank sees a micro-batch: ``micro_batch`` sequences of ``seq_len`` tokens split by tp/cp (and SP),
    and in which formats: ``dtype_bytes`` per activation, weight and gradient element, ``grad_accum_bytes`` per
    element of the gradient buffer weight gradients accumulate in (the weight-gradient GEMMs add into it when
    ``fused_grad_accumulation``, otherwise see `grad_accumulation`, unless ``framework_copies``: PyTorch FSDP's
    post-backward copies the fresh gradients, which the program charges, Sharding.grad_copy_bytes), whether the
    loss is one fused cross-entropy pass per direction (``fused_cross_entropy``; otherwise see `head_kernels`), whether
    LayerNorm's backward is one pass (``fused_layernorm``; otherwise apex's two, _APEX_LAYERNORM) and whether the
    weight-gradient GEMMs also produce the bias gradients (``fused_bias_grad``; otherwise see `_bias_grads`).
    ``eager``: the step runs PyTorch's own unfused kernels (workload/eager.py builds its kernels from these, with
    fresh 16-bit weight gradients and unfused bias gradients); ``fsdp_weights``: under eager, the 16-bit weights
    are PyTorch FSDP's gathers in param_dtype (the layers then run in 16 bits throughout, as torchtitan runs FSDP,
    without autocast), not torch.autocast's casts of each rank's fp32 weights before every linear (``autocast``:
    plain DDP, norms, residual stream and ``.grad`` in fp32); ``accumulating_share``: under autocast, the share of
    the step's micro-batches whose gradients autograd adds into an existing fp32 ``.grad``, all but the first:
    (m - 1) / m."""

    micro_batch: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    dtype_bytes: int = 2
    grad_accum_bytes: int = 4
    fused_grad_accumulation: bool = True
    framework_copies: bool = False
    fused_cross_entropy: bool = True
    fused_layernorm: bool = True
    fused_bias_grad: bool = True
    eager: bool = False
    fsdp_weights: bool = False
    accumulating_share: float = 0.0

    @property
    def tokens(self) -> float:
        """Query tokens a rank's matmuls process: b * s / c."""
        return self.micro_batch * self.seq_len / self.cp

    @property
    def autocast(self) -> bool:
        """Whether the step is PyTorch eager under torch.autocast over each rank's fp32 weights (not FSDP's)."""
        return self.eager and not self.fsdp_weights

    @property
    def stream_bytes(self) -> int:
        """Bytes per element of the residual stream between layers and of its gradient, which a pipeline stage
        hands to the next: fp32 under ``autocast`` (which leaves the residual adds in fp32), else ``dtype_bytes``."""
        return 4 if self.autocast else self.dtype_bytes

    @property
    def pointwise_tokens(self) -> float:
        """Tokens a rank's norms and residual adds process: 1/t of ``tokens`` with sequence parallelism."""
        return self.tokens / self.tp if self.sequence_parallel else self.tokens


@dataclass(frozen=True)
class AttentionCost:
    """Attention accounting choices.

    ``causal_factor``: share of the s x s score matrix computed (1/2 for a causal mask with flash-style
    block skipping; 1 to count the full matrix, as Megatron's FLOP formula does).
    ``backward_factor``: attention-core backward FLOPs over forward FLOPs; 2.5 for flash attention (five s x s
    matmuls against two forward: the score product is recomputed), 2.0 for attention that keeps its scores.
    """

    causal_factor: float = 0.5
    backward_factor: float = 2.5
    flash: bool = True

    @classmethod
    def for_kernel(cls, kind: AttentionKernel) -> AttentionCost:
        """``flash`` (fused, scores stay on chip, causal blocks skipped) or ``standard`` (Megatron-LM before
        flash attention: the full score matrix is computed and goes through HBM for softmax and dropout)."""
        if kind == "flash":
            return cls()
        return cls(causal_factor=1.0, backward_factor=2.0, flash=False)


@dataclass(frozen=True)
class PassKernels:
    """Kernels of one unit (a layer, the embedding or the head) for one micro-batch, by pass.

    ``recompute`` runs at the start of the backward pass, before ``backward_input``.
    """

    forward: tuple[Kernel, ...]
    recompute: tuple[Kernel, ...]
    backward_input: tuple[Kernel, ...]
    backward_weight: tuple[Kernel, ...]

    @property
    def backward(self) -> tuple[Kernel, ...]:
        """Everything the backward pass runs: recompute, then input gradients, then weight gradients."""
        return self.recompute + self.backward_input + self.backward_weight

    @property
    def flops(self) -> float:
        """FLOPs of forward plus backward (recompute included)."""
        return kernel_flops(self.forward + self.backward)

    @property
    def hbm_bytes(self) -> float:
        """HBM bytes of forward plus backward (recompute included)."""
        return sum(kernel.hbm_bytes for kernel in self.forward + self.backward)


def validate_shard(model: ModelSpec, shard: ShardShape) -> None:
    """Reject splits the kernels cannot express: t must divide heads and FFN width, c must divide the sequence."""
    if shard.micro_batch < 1 or shard.seq_len < 1 or shard.tp < 1 or shard.cp < 1:
        raise ScenarioError(
            f"micro_batch {shard.micro_batch}, seq_len {shard.seq_len}, tp {shard.tp}, cp {shard.cp} must be >= 1",
            field="parallelism", allowed="positive integers",
        )
    if model.heads % shard.tp or model.ffn_hidden % shard.tp:
        raise ScenarioError(
            f"tp {shard.tp} does not divide {model.name}'s {model.heads} heads and FFN width {model.ffn_hidden}",
            field="parallelism.tp", allowed=f"divisors of {math.gcd(model.heads, model.ffn_hidden)}",
        )
    if shard.seq_len % shard.cp:
        raise ScenarioError(
            f"cp {shard.cp} does not divide seq_len {shard.seq_len}", field="parallelism.cp",
            allowed="divisors of the sequence length",
        )


def _check_recompute(recompute: str) -> None:
    if recompute not in RECOMPUTE_MODES:
        raise ScenarioError(
            f"unknown recompute mode {recompute!r}", field="training.recompute", allowed=", ".join(RECOMPUTE_MODES)
        )


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads a rank holds: kv_heads / t, at least one (KV heads are replicated when t exceeds them)."""
    return max(1, math.ceil(model.kv_heads / tp))


def matmul_kernels(name: str, m: float, n: float, k: float, shard: ShardShape,
            bias: bool = False) -> tuple[Kernel, Kernel, Kernel]:
    """Forward Y[m,n] = X[m,k] W[k,n], input gradient dX = dY W^T, weight gradient X^T dY: added into the
    gradient buffer (``grad_accum_bytes`` per element, read and written) by the GEMM itself (fused), or written
    fresh in the training precision for `grad_accumulation` to add. ``bias``: the weight-gradient GEMM also
    sums dY over the rows in its epilogue, producing the n bias gradients the same way (fused_bias_grad)."""
    d = shard.dtype_bytes
    flops = 2.0 * m * n * k
    size = min(m, n, k)
    forward = Kernel(name, flops, d * (m * k + k * n + m * n), "matmul", size, output=(1, m, n))
    grad_input = Kernel(f"{name}.dgrad", flops, d * (m * n + k * n + m * k), "matmul", size, output=(1, m, k))
    gradient_bytes = 2 * shard.grad_accum_bytes if shard.fused_grad_accumulation else d
    weights = k * n + (n if bias else 0.0)
    grad_weight = Kernel(f"{name}.wgrad", flops, d * (m * k + m * n) + gradient_bytes * weights, "matmul", size,
                         weights=weights, output=(1, k, n))
    return forward, grad_input, grad_weight


def grad_accumulation(kernels: PassKernels, shard: ShardShape) -> PassKernels:
    """``kernels`` with the gradient accumulation Megatron-LM ran before its fused weight-gradient GEMM
    (--gradient-accumulation-fusion, February 2022): after each weight-gradient GEMM of every micro-batch, the
    DDP hook adds the fresh gradient into the accumulation buffer (``main_grad.add_(grad)``), a memory-bound
    kernel that reads the fresh gradient and reads and writes the buffer (``grad_accum_bytes``). Unchanged when
    the GEMM fuses it, or when the framework's own copies stand in for it (``framework_copies``), or under
    ``eager``, where autograd's casts of the fresh gradients to fp32 do (workload/eager.py)."""
    if shard.fused_grad_accumulation or shard.framework_copies or shard.eager:
        return kernels
    moved = shard.dtype_bytes + 2 * shard.grad_accum_bytes
    adds = tuple(Kernel(f"{k.name}.accumulate", k.weights, moved * k.weights, "elementwise", backward=True)
                 for k in kernels.backward_weight if k.weights > 0)
    return PassKernels(kernels.forward, kernels.recompute, kernels.backward_input, kernels.backward_weight + adds)


def norm_kernels(name: str, model: ModelSpec, shard: ShardShape) -> tuple[Kernel, Kernel]:
    """Norm forward (read x, write y) and backward (read x and dy, twice for apex's LayerNorm, write dx; the
    weight gradients come out of the same passes)."""
    elements = shard.pointwise_tokens * model.hidden
    cost = _APEX_LAYERNORM if model.norm == "layernorm" and not shard.fused_layernorm else _NORMS[model.norm]
    fwd_flops, bwd_flops = cost.flops
    d = shard.dtype_bytes
    return (
        Kernel(name, fwd_flops * elements, 2 * d * elements, "elementwise", memory_kind=cost.memory_kind),
        Kernel(f"{name}.bwd", bwd_flops * elements, (cost.backward_reads + 1) * d * elements,
               "elementwise", backward=True, memory_kind=cost.memory_kind),
    )


def residual_kernels(name: str, model: ModelSpec, shard: ShardShape) -> tuple[Kernel, Kernel]:
    """(Bias + dropout +) residual add: read branch and skip, write the sum (and a 1-byte dropout mask).

    Backward as autograd runs it: the skip's gradient is the output gradient itself, and where the skip meets
    the norm's input gradient autograd adds the two (read 2, write 1); with dropout the branch's gradient is one
    more pass (read the gradient and the mask, write), counted in the same kernel."""
    elements = shard.pointwise_tokens * model.hidden
    d = shard.dtype_bytes
    mask = 1.0 if model.dropout else 0.0
    extra_flops = 2.0 if model.dropout else 0.0
    dropout_grad = (2 * d + mask) if model.dropout else 0.0
    return (
        Kernel(name, (1 + extra_flops) * elements, (3 * d + mask) * elements, "elementwise"),
        Kernel(f"{name}.bwd", (1 + extra_flops) * elements, (3 * d + dropout_grad) * elements, "elementwise"),
    )


def _bias_grads(model: ModelSpec, shard: ShardShape, layers: tuple[tuple[str, float, bool], ...]) -> tuple[Kernel, ...]:
    """Bias gradients of a layer with biases, one reduction per linear layer over the tokens of its output
    gradient (read, in the gradient format), as autograd runs them unfused: F.linear's bias in the QKV projection,
    and the biases Megatron-LM adds outside the GEMM (skip_bias_add) in its fused bias-GeLU and
    bias-dropout-add, whose broadcast autograd sums back. ``layers``: (name, output width, whether its bias
    sits on the pointwise tokens, as the row-parallel layers' full-width biases do under sequence parallelism).
    The sums are weight gradients (``weights``: the bias elements). None with ``fused_bias_grad``: Transformer
    Engine's weight-gradient GEMM sums dY in its epilogue while it reads it (_matmul's ``bias``)."""
    if not model.bias or shard.fused_bias_grad:
        return ()
    kernels = []
    for name, width, pointwise in layers:
        elements = (shard.pointwise_tokens if pointwise else shard.tokens) * width
        kernels.append(Kernel(f"{name}.bgrad", elements, shard.dtype_bytes * elements, "elementwise",
                              backward=True, weights=width))
    return tuple(kernels)


def _attention_core(model: ModelSpec, shard: ShardShape,
                    cost: AttentionCost) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """Attention core (forward kernels, backward kernels).

    Flash-style: one fused kernel per pass; QK^T and AV never leave on-chip memory, HBM traffic is Q, K, V, O
    (and grads). Standard (Megatron-LM before flash attention): separate kernels, as it ran them: the batched
    GEMM QK^T writes the scores, the fused scale-mask-softmax and the dropout read and write them (plus a
    1-byte mask), the batched GEMM AV reads them; the batched GEMMs' smallest side is the head width. The
    backward runs four batched GEMMs (dP = dO V^T with score-sized output; dV, dQ, dK with head-width output)
    and, between them, the dropout gradient (read the gradient and the mask, write) and the fused softmax
    gradient (read the softmax output and the gradient, write): 3 B/score of 16-bit values, 2 + 1 more with
    dropout. The softmax and dropout passes are ``score_passes`` kernels.
    """
    d = shard.dtype_bytes
    heads = model.heads / shard.tp
    kv_heads = kv_heads_per_rank(model, shard.tp)
    q_tokens = shard.tokens
    kv_tokens = shard.micro_batch * shard.seq_len
    q_elems = q_tokens * heads * model.head_dim
    kv_elems = kv_tokens * kv_heads * model.head_dim
    flops = 4.0 * q_tokens * shard.seq_len * heads * model.head_dim * cost.causal_factor
    stats = 4.0 * q_tokens * heads
    if cost.flash:
        fused = Kernel("attention", flops, d * (2 * q_elems + 2 * kv_elems) + stats, "attention", shard.seq_len)
        fused_backward = Kernel("attention.bwd", cost.backward_factor * flops,
                                d * (4 * q_elems + 4 * kv_elems) + 2 * stats, "attention", shard.seq_len,
                                backward=True)
        return (fused,), (fused_backward,)
    scores = q_tokens * shard.seq_len * heads
    dropout_bytes = (2 * d + 1) * scores if model.dropout else 0.0
    width = model.head_dim
    batch, rows = shard.micro_batch * heads, shard.seq_len / shard.cp
    score_tile, context_tile = (batch, rows, shard.seq_len), (batch, rows, width)
    forward = (
        Kernel("attention", flops / 2, d * (q_elems + kv_elems + scores), "matmul", width, output=score_tile),
        Kernel("attention.softmax", 5.0 * scores, 2 * d * scores + dropout_bytes, "elementwise",
               memory_kind="score_passes"),
        Kernel("attention.context", flops / 2, d * (scores + kv_elems + q_elems), "matmul", width,
               output=context_tile),
    )
    gemm_flops = cost.backward_factor * flops / 4
    backward = (
        Kernel("attention.bwd", gemm_flops, d * (q_elems + kv_elems + scores), "matmul", width,
               output=score_tile),
        Kernel("attention.context.bwd", 3 * gemm_flops, d * (3 * q_elems + 3 * kv_elems + 3 * scores), "matmul",
               width, output=context_tile),
        Kernel("attention.softmax.bwd", 7.0 * scores, 3 * d * scores + dropout_bytes, "elementwise",
               backward=True, memory_kind="score_passes"),
    )
    return forward, backward


def _activation(model: ModelSpec, shard: ShardShape) -> tuple[Kernel, Kernel]:
    """SwiGLU (read gate and up, write one) or GeLU (read one, write one), and their backward."""
    elements = shard.tokens * model.ffn_hidden / shard.tp
    d = shard.dtype_bytes
    fwd_flops, bwd_flops = ACTIVATION_FLOPS[model.gated_mlp]
    if model.gated_mlp:
        return (
            Kernel("mlp_act", fwd_flops * elements, 3 * d * elements, "elementwise"),
            Kernel("mlp_act.bwd", bwd_flops * elements, 5 * d * elements, "elementwise"),
        )
    return (
        Kernel("mlp_act", fwd_flops * elements, 2 * d * elements, "elementwise"),
        Kernel("mlp_act.bwd", bwd_flops * elements, 3 * d * elements, "elementwise"),
    )


def _renamed(kernels: tuple[Kernel, ...], prefix: str) -> tuple[Kernel, ...]:
    return tuple(replace(k, name=f"{prefix}{k.name}") for k in kernels)


def layer_kernels(
    model: ModelSpec, shard: ShardShape, recompute: Recompute = "none", cost: AttentionCost = AttentionCost()
) -> PassKernels:
    """Kernels of one transformer layer for one micro-batch on one rank.

    ``recompute``: none; selective (the attention core forward runs again in the backward); full (the whole
    layer forward runs again in the backward).
    """
    validate_shard(model, shard)
    _check_recompute(recompute)
    t, tokens, h = shard.tp, shard.tokens, model.hidden
    q_width = model.heads * model.head_dim / t
    kv_width = kv_heads_per_rank(model, t) * model.head_dim
    ffn = model.ffn_hidden / t

    bias = model.bias and shard.fused_bias_grad
    input_norm = norm_kernels("input_norm", model, shard)
    qkv = matmul_kernels("qkv_proj", tokens, q_width + 2 * kv_width, h, shard, bias)
    attention = _attention_core(model, shard, cost)
    out_proj = matmul_kernels("out_proj", tokens, h, q_width, shard, bias)
    attn_residual = residual_kernels("attn_residual", model, shard)
    mlp_norm = norm_kernels("mlp_norm", model, shard)
    mlp_in: tuple[tuple[Kernel, Kernel, Kernel], ...]
    if model.gated_mlp:
        mlp_in = (matmul_kernels("mlp_gate", tokens, ffn, h, shard, bias),
                  matmul_kernels("mlp_up", tokens, ffn, h, shard, bias))
    else:
        mlp_in = (matmul_kernels("mlp_fc1", tokens, ffn, h, shard, bias),)
    activation = _activation(model, shard)
    mlp_out = matmul_kernels("mlp_down" if model.gated_mlp else "mlp_fc2", tokens, h, ffn, shard, bias)
    mlp_residual = residual_kernels("mlp_residual", model, shard)

    forward = (
        input_norm[0], qkv[0], *attention[0], out_proj[0], attn_residual[0], mlp_norm[0],
        *(mm[0] for mm in mlp_in), activation[0], mlp_out[0], mlp_residual[0],
    )
    backward_input = (
        mlp_residual[1], mlp_out[1], activation[1], *(mm[1] for mm in reversed(mlp_in)), mlp_norm[1],
        attn_residual[1], out_proj[1], *attention[1], qkv[1], input_norm[1],
    )
    mlp_in_names = ("mlp_up", "mlp_gate") if model.gated_mlp else ("mlp_fc1",)
    bias_grads = _bias_grads(model, shard, (
        (mlp_out[0].name, h, True), *((name, ffn, False) for name in mlp_in_names),
        ("out_proj", h, True), ("qkv_proj", q_width + 2 * kv_width, False)))
    backward_weight = (mlp_out[2], *(mm[2] for mm in reversed(mlp_in)), out_proj[2], qkv[2], *bias_grads)
    recomputed = {"none": (), "selective": attention[0], "full": forward}[recompute]
    return grad_accumulation(PassKernels(forward, _renamed(recomputed, "recompute."), backward_input,
                                         backward_weight), shard)


def embedding_kernels(model: ModelSpec, shard: ShardShape) -> PassKernels:
    """Token (and learned position) embedding of the first pipeline stage: a gather forward, a scatter-add backward.

    With tensor parallelism the table is split by vocabulary; every rank still writes the full b*s/c x h output.
    """
    validate_shard(model, shard)
    elements = shard.tokens * model.hidden
    d = shard.dtype_bytes
    tables = 2 if model.learned_positions else 1
    forward = Kernel("embedding", (tables - 1) * elements, (tables + 1) * d * elements, "elementwise")
    grad = Kernel(
        "embedding.wgrad", tables * elements, (d + 2 * shard.grad_accum_bytes * tables) * elements, "elementwise"
    )
    return PassKernels((forward,), (), (), (grad,))


def head_kernels(model: ModelSpec, shard: ShardShape) -> PassKernels:
    """Final norm, output layer (vocabulary split t ways) and cross-entropy loss of the last pipeline stage.

    A fused cross-entropy reads the 16-bit logits and keeps an fp32 softmax (forward), reads it and writes the
    16-bit gradients (backward). Unfused, as Megatron-LM ran it without --fp16-lm-cross-entropy (SC21), the
    logits are cast to fp32 and go through max, subtract, exp, sum and divide as separate passes, and the
    gradient is scaled and cast back (_UNFUSED_CROSS_ENTROPY_BYTES)."""
    validate_shard(model, shard)
    final_norm = norm_kernels("final_norm", model, shard)
    vocab = model.vocab / shard.tp
    lm_head = matmul_kernels("lm_head", shard.tokens, vocab, model.hidden, shard)
    logits = shard.tokens * vocab
    fwd_flops, bwd_flops = _CROSS_ENTROPY_FLOPS
    if shard.fused_cross_entropy:
        fwd_bytes = bwd_bytes = shard.dtype_bytes + _FP32
    else:
        fwd_bytes, bwd_bytes = (shard.dtype_bytes + extra for extra in _UNFUSED_CROSS_ENTROPY_BYTES)
    loss = Kernel("cross_entropy", fwd_flops * logits, fwd_bytes * logits, "elementwise")
    loss_grad = Kernel("cross_entropy.bwd", bwd_flops * logits, bwd_bytes * logits, "elementwise")
    return grad_accumulation(PassKernels(
        (final_norm[0], lm_head[0], loss),
        (),
        (loss_grad, lm_head[1], final_norm[1]),
        (lm_head[2],),
    ), shard)


def six_n_flops_per_token(
    model: ModelSpec, seq_len: int, attention: bool = True, causal_factor: float = 1.0
) -> float:
    """Model FLOPs per trained token, 6N + 12 l (a d) s (PaLM convention; attention optional, unmasked by default);
    N counts the parameters a token uses (with experts, top_k routed experts per layer)."""
    attention_flops = 12.0 * model.layers * model.heads * model.head_dim * seq_len * causal_factor
    return 6.0 * model.active_params() + (attention_flops if attention else 0.0)


def megatron_flops_per_iteration(model: ModelSpec, batch: int, seq_len: int, recompute: bool = True) -> float:
    """Narayanan et al. (SC21): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recompute.

    Without recompute the layers do 3 instead of 4 forward-equivalents while the output layer still does 3, so
    F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). The formula assumes a GPT layer (FFN 4h, multi-head attention,
    unmasked score FLOPs); for other shapes it is a convention.
    """
    l, h, v, s = model.layers, model.hidden, model.vocab, seq_len
    if recompute:
        return 96.0 * batch * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
    return 72.0 * batch * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
