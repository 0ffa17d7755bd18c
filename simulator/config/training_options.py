"""The option sets of the `training:` section, each defined once: the schema checks a scenario against them at
load, and the models that take them (workload/memory.py, workload/training.py, workload/transformer.py) key
their tables by them and name them in their errors."""

from __future__ import annotations

from typing import Literal, get_args

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
"""Training precision: the GEMMs' peak and the bytes of activations, weights and gradients (fp8 keeps 16-bit
weights and gradients)."""
MathPrecision = Literal[Precision, "tf32"]
"""The precision whose peak bounds a kernel: a training precision, or tf32 (tensor-core math on fp32 inputs, which
no training precision names: a replayed trace's fp32 GEMM under allow_tf32)."""
Optimizer = Literal["adam", "adamw", "sgd", "sgd_momentum"]
"""The optimizer: its state per parameter (memory) and the bytes its step streams through HBM."""
Recompute = Literal["none", "selective", "full"]
"""Activation recomputation: none, the attention core only (selective), or each layer's whole forward (full)."""
AttentionKernel = Literal["flash", "standard"]
"""The attention core: fused flash attention, or Megatron-LM's unfused kernels through HBM."""
KernelEra = Literal["fused", "eager"]
"""How the step's kernels run: ``fused``, as Megatron-LM with Transformer Engine runs them (16-bit weights with an
fp32 master copy in the optimizer; fused norms, cross-entropy and bias gradients); ``eager``, as plain PyTorch runs
them under torch.autocast without torch.compile (fp32 weights cast to 16 bits for every linear, norms and the loss
in fp32, each elementwise op its own kernel: workload/eager.py, docs/cost-model.md "PyTorch eager")."""
OptimizerStep = Literal["fused", "foreach"]
"""How the optimizer's update runs: ``fused``, one pass over each parameter's tensors (apex's FusedAdam under
Megatron-LM, torch.optim with ``fused=True``); ``foreach``, torch.optim's default on CUDA, one multi-tensor
kernel per arithmetic op (training.py's FOREACH_BYTES_PER_PARAM), with `kernels: eager` only."""
GradReduceDtype = Literal["fp32", "bf16", "fp16"]
"""The format of the gradient buffer: gradients accumulate over micro-batches in it and the data-parallel
all-reduce / reduce-scatter sends it (Megatron-LM's ``main_grad``, PyTorch FSDP's ``reduce_dtype``)."""

PRECISIONS: tuple[Precision, ...] = get_args(Precision)
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
RECOMPUTE_MODES: tuple[Recompute, ...] = get_args(Recompute)
AUTOCAST_PRECISIONS: tuple[Precision, ...] = ("bf16", "fp16")
"""The precisions torch.autocast trains in: the ones `training.kernels: eager` models."""
GRAD_REDUCE_DTYPES: tuple[GradReduceDtype, ...] = get_args(GradReduceDtype)

LOSS_SCALED: tuple[Precision, ...] = ("fp16",)
"""Precisions trained with a loss scale: the optimizer step unscales the gradients and checks them for
inf/NaN, and `training.loss_scaling` models the scale's run."""
GRAD_REDUCE_BYTES: dict[GradReduceDtype, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
DEFAULT_GRAD_REDUCE: dict[Precision, GradReduceDtype] = {"bf16": "fp32", "fp16": "fp16", "fp8": "fp32",
                                                         "fp32": "fp32"}
"""Megatron-LM's gradient buffer per precision: fp32 for bf16 (and fp8, whose parameters are bf16), which
arguments.py forces unless --grad-reduce-in-bf16 because bf16 sums lose too much; the parameters' fp16 for
fp16 (--accumulate-allreduce-grads-in-fp32 is off by default). Llama 3 (section 3.3.2) also accumulates over
micro-batches and reduce-scatters across data-parallel workers in fp32."""
PARAM_DTYPE: dict[Precision, GradReduceDtype] = {"bf16": "bf16", "fp16": "fp16", "fp8": "bf16", "fp32": "fp32"}
"""The parameters' format per precision (fp8 training keeps bf16 parameters)."""
DEEPSPEED_GRAD_REDUCE: dict[Precision, GradReduceDtype] = PARAM_DTYPE
"""DeepSpeed's gradient format under ZeRO: the engine's `communication_data_type` is fp16 with fp16 on, bf16 with
bf16 on (fp8 through Transformer Engine keeps bf16 on), else fp32, and with ZeRO `get_data_types` accumulates in
the same model dtype (deepspeed/runtime/engine.py: communication_data_type, get_data_types; stage3.py reduces
in it and keeps `grad_partitions_flat_buffer` in it)."""
REDUCE_DTYPES_OF: dict[Precision, tuple[GradReduceDtype, ...]] = {
    precision: tuple(dict.fromkeys(("fp32", PARAM_DTYPE[precision]))) for precision in PARAM_DTYPE}
"""The buffer formats a precision can reduce in: fp32, or its parameters' format."""


def grad_buffer_bytes(precision: Precision, grad_reduce: GradReduceDtype | None = None) -> int:
    """Bytes per element of the gradient buffer: ``grad_reduce`` or, when None, Megatron-LM's default."""
    return GRAD_REDUCE_BYTES[grad_reduce or DEFAULT_GRAD_REDUCE[precision]]
