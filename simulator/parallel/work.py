"""The per-GPU work of one micro-batch on one virtual pipeline stage, as blocks between TP collectives.

A transformer layer is two blocks (attention and MLP); each block's compute is bracketed by tensor-parallel
communication (all-reduce, or all-gather + reduce-scatter with sequence parallelism). The program builder
turns blocks into ops; the cost model (or a synthetic spec) fills them in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar, assert_never

from simulator.parallel.context import ContextAttention
from simulator.parallel.experts import ExpertWork
from simulator.parallel.passes import Pass, pass_figure

Key = TypeVar("Key")


class TpPattern(StrEnum):
    """Where a block's TP collectives sit (see Block)."""

    LAYER = "layer"
    EMBEDDING = "embedding"
    HEAD = "head"
    EXPERTS = "experts"


@dataclass(frozen=True, slots=True)
class Block:
    """Compute between TP collectives, per micro-batch on one GPU.

    Times are seconds; ``backward_input_s``/``backward_weight_s`` split the backward (zero-bubble schedules run
    them apart), ``backward_weight_flops`` is the weight-gradient part of ``backward_flops``; ``recompute_s`` is
    forward work redone before the backward. ``tp_bytes`` is the size of the TP collective after the block (0 =
    none); ``cp_bytes`` the KV gathered across the CP group before it;
    ``params`` the parameters this GPU holds for the block (after TP split), for gradient buckets and ZeRO.
    ``layer`` groups blocks into layers (ZeRO-3 gathers and frees a layer at a time); ``tensors`` splits
    ``params`` into the parameter tensors DDP assigns to gradient buckets one by one. ``tp_pattern`` says
    where the TP collectives sit: ``layer`` (Megatron column-then-row: all-reduce after the forward and after
    the backward; with SP all-gather before and reduce-scatter after both), ``embedding`` (vocabulary-parallel
    lookup: all-reduce, or reduce-scatter with SP, after the forward only) or ``head`` (column-parallel output
    layer: with SP all-gather before the forward and reduce-scatter after the backward; without, all-reduce
    after the backward only). ``context`` is the attention core's split under context parallelism (None
    without it): the program runs the ring around it, or scales it by the rank's share of a causal split.
    ``overlap_gemm_s`` holds the GEMMs next to the block's TP collectives, which
    ``tp_comm_overlap`` hides them behind: (forward GEMM after the collective before the block, forward GEMM
    before the collective after it, the same two in the backward); 0 where no GEMM is adjacent.
    ``sm_bound_s`` holds, per pass (forward, backward input, backward weight, recompute: the order of the ``*_s``
    fields, as in ExpertWork), the seconds of its kernels that compute, not HBM traffic, limits (those slow down
    while communication kernels hold SMs; None: all of them), and ``overlap_gemm_sm_s`` the same of the
    ``overlap_gemm_s`` GEMMs. ``column_wgrad_s`` holds (seconds, SM-bound seconds) of the weight-gradient GEMMs of
    the column-parallel linears right after the leading TP collective (QKV, the first MLP GEMMs, the output
    layer): with sequence parallelism they wait for the backward's all-gather of their sharded input
    (``overlap.regathers_input``). ``experts`` is a MoE block's routed-expert part (parallel/experts.py): its ``params``
    are reduced over the expert-data-parallel group, not counted in ``params``; a MoE block's ``tp_pattern`` is
    ``experts`` (tokens split over TP: an all-gather after forward and backward, none with SP).
    ``hbm_bytes`` holds, per pass in the order of ``sm_bound_s``, the HBM bytes its kernels move, the figure
    their roofline times are costed by (0: a synthetic block, which has no kernels); ``overlap_gemm_bytes`` and
    ``column_wgrad_bytes`` those of the ``overlap_gemm_s`` and ``column_wgrad_s`` GEMMs, so that each op a pass is
    split into carries its own kernels' bytes.
    """

    name: str
    layer: int
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    recompute_s: float = 0.0
    forward_flops: float = 0.0
    backward_flops: float = 0.0
    backward_weight_flops: float = 0.0
    recompute_flops: float = 0.0
    tp_bytes: float = 0.0
    cp_bytes: float = 0.0
    params: float = 0.0
    memory_bound: bool = False
    sm_bound_s: tuple[float, float, float, float] | None = None
    tensors: tuple[float, ...] = ()
    tp_pattern: TpPattern = TpPattern.LAYER
    context: ContextAttention | None = None
    overlap_gemm_s: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    experts: ExpertWork | None = None
    overlap_gemm_sm_s: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    column_wgrad_s: tuple[float, float] = (0.0, 0.0)
    overlap_gemm_bytes: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    column_wgrad_bytes: float = 0.0
    hbm_bytes: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def pass_seconds(self, phase: Pass) -> float:
        """Kernel seconds of pass ``phase``."""
        match phase:
            case Pass.FORWARD:
                return self.forward_s
            case Pass.RECOMPUTE:
                return self.recompute_s
            case Pass.BACKWARD:
                return self.backward_input_s + self.backward_weight_s
            case Pass.BACKWARD_INPUT:
                return self.backward_input_s
            case Pass.BACKWARD_WEIGHT:
                return self.backward_weight_s
        assert_never(phase)

    def pass_hbm_bytes(self, phase: Pass) -> float:
        """HBM bytes of pass ``phase``."""
        return pass_figure(self.hbm_bytes, phase)

    def sm_bound_seconds(self, phase: Pass) -> float:
        """SM-bound seconds of pass ``phase``."""
        return pass_figure(self.sm_bound_s or (self.forward_s, self.backward_input_s, self.backward_weight_s,
                                                self.recompute_s), phase)


def layer_units(blocks: Iterable[Block]) -> dict[int, tuple[str, str, float]]:
    """FSDP's wrapped units (one per layer, the embedding and the head each a layer of their own) in forward
    order: each layer's first and last block with parameters and their parameters on one TP rank."""
    units: dict[int, tuple[str, str, float]] = {}
    for block in blocks:
        if block.params > 0:
            first, _, params = units.get(block.layer, (block.name, block.name, 0.0))
            units[block.layer] = (first, block.name, params + block.params)
    return units


def layer_experts(blocks: Iterable[Block]) -> dict[int, tuple[float, int]]:
    """Per layer of ``blocks`` with routed experts, in forward order: their parameters on one rank and their EP
    degree (PyTorch FSDP2 shards them beside the layer's unit, Sharding.shards_experts)."""
    found: dict[int, tuple[float, int]] = {}
    for block in blocks:
        if block.experts is not None:
            params, _ = found.get(block.layer, (0.0, 1))
            found[block.layer] = (params + block.experts.params, block.experts.ep)
    return found


def gradient_buckets(ready: Iterable[tuple[Key, Block]], grad_bytes: float,
                     bucket_bytes: float) -> list[tuple[list[Key], float]]:
    """PyTorch DDP's gradient buckets: the parameter tensors of the blocks in ``ready``, given in the order
    their gradients are finished (reverse forward order) each with the key that marks it finished, filled into
    the open bucket until it holds at least ``bucket_bytes`` (``grad_bytes`` per gradient); per bucket, the
    keys of its blocks (a key once where blocks share it, in order) and its bytes."""
    buckets: list[tuple[list[Key], float]] = []
    keys: list[Key] = []
    size = 0.0
    for key, block in ready:
        for tensor in reversed(block.tensors or (block.params,)):
            if tensor <= 0:
                continue
            if not keys or keys[-1] != key:
                keys.append(key)
            size += tensor * grad_bytes
            if size >= bucket_bytes:
                buckets.append((keys, size))
                keys, size = [], 0.0
    if keys:
        buckets.append((keys, size))
    return buckets


def bound_share(sm_bound_s: float, seconds: float) -> float:
    """The share of a part's ``seconds`` that SMs limit (an op's ``sm_bound_share``), rounding kept in [0, 1]."""
    return min(max(sm_bound_s / seconds, 0.0), 1.0) if seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StageWork:
    """All blocks of one virtual stage in forward order, and the activation bytes sent to the next stage."""

    blocks: tuple[Block, ...]
    p2p_bytes: float

    @property
    def params(self) -> float:
        return sum(block.params for block in self.blocks)
