"""How data-parallel replicas share model state: one description used by the program builder (which
collectives run) and the memory model (which bytes a rank holds)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from simulator.collectives.names import Primitive

if TYPE_CHECKING:
    from simulator.parallel.layout import Layout

ZERO_STAGES = (0, 1, 2, 3)
FP32_BYTES = 4.0
"""Bytes of an fp32 element: PyTorch FSDP2's shards (the parameters in their own dtype) and eager's weights."""

GradSync = Literal["every_microbatch", "after_last_backward"]
"""When ZeRO-3's gradients are reduce-scattered (the summary's ``layout.grad_sync``): each micro-batch's, or
accumulated unsharded and reduced once, after the last backward (PyTorch FSDP's no-sync)."""


@dataclass(frozen=True)
class Sharding:
    """ZeRO ``stage`` 0 (DDP) to 3 (ZeRO-3 / FSDP full shard) and ``degree``, the number of data-parallel ranks
    the sharded state is split over. A degree below the data-parallel group's size is hybrid sharding (HSDP):
    groups of ``degree`` ranks shard, and the groups all-reduce across each other. ``bucket_bytes`` and
    ``overlap`` are DDP's gradient buckets; ``grad_bytes`` and ``param_bytes`` the bytes of a communicated
    gradient and parameter element; ``overlap_param_gather`` moves the ZeRO-1/2 parameter gather from after the
    optimizer to the next step's forward, bucket by bucket; ``reduce_every_microbatch`` reduce-scatters every
    micro-batch's gradients, unit by unit, so that only the gradient shard is accumulated (resolved at load,
    ParallelismConfig.reduce_every_microbatch): false under ZeRO-2 means buckets after the last micro-batch,
    under ZeRO-3 (PyTorch FSDP's no-sync) the whole unsharded gradient accumulated in the gradient buffer's
    format and each unit reduce-scattered in the last backward (without pipelining, as its backward ends) or
    once after the chunk's last gradient action (under pipelining, ``stage_reduces_grads``).
    ``gather_per_layer`` is how ZeRO-3 gathers parameters: PyTorch FSDP (``fsdp: full_shard | hybrid_shard``)
    all-gathers one wrapped unit at a time (torchtitan wraps each transformer layer, the embedding, and the
    final norm with the output layer, which stays gathered from its forward to its backward); DeepSpeed ZeRO-3
    (``zero: 3``) gathers submodules as the forward reaches them, here one block (attention, MLP) at a time.
    ``fsdp`` marks PyTorch FSDP (any ``parallelism.fsdp`` strategy), whose post-backward waits for its previous
    reduce-scatter; DeepSpeed ZeRO does not. ``reshard_after_forward`` false (PyTorch FSDP under pipelining:
    torchtitan's ``reshard_after_forward=not pp_enabled``, and the pipeline stage's
    ``set_reshard_after_backward(False)`` on every backward) gathers each unit once per step, before its first
    forward, and keeps it unsharded until the chunk's last gradient action. ``grad_copy_rate`` (HBM bytes per
    second; 0 charges none) times PyTorch FSDP's gradient copies on the compute stream (grad_copy_bytes) and
    FSDP2's copies around each all-gather of its shards, kept in ``shard_bytes`` per element (gather_copy_bytes;
    ``fsdp: full_shard | hybrid_shard`` keeps fp32 shards under both kernel eras, ``fp32_shards``; FSDP1's
    shard_grad_op and no_shard the training precision; 0 charges none: DeepSpeed ZeRO-3 gathers into flat
    buffers its modules' parameters are views of)."""

    stage: int = 0
    degree: int = 1
    bucket_bytes: float = 25 * 2**20
    overlap: bool = True
    grad_bytes: float = 2.0
    param_bytes: float = 2.0
    overlap_param_gather: bool = False
    reduce_every_microbatch: bool = False
    gather_per_layer: bool = False
    fsdp: bool = False
    reshard_after_forward: bool = True
    grad_copy_rate: float = 0.0
    shard_bytes: float = 0.0
    fp32_shards: bool = False
    """Whether the rank keeps its parameter shards in fp32 and the optimizer updates them in place, with no
    master copy (PyTorch FSDP2, ``fsdp: full_shard | hybrid_shard``: the sharded parameter keeps the original
    parameter's dtype, fp32, and MixedPrecisionPolicy's param_dtype applies only to what is gathered), its
    sharded gradient fp32 too whatever the reduce dtype (foreach_reduce casts the reduce-scatter's output to the
    parameter's dtype before it accumulates it into ``.grad``): 4 + 4 B per parameter and the optimizer's
    moments, all over the shard group. Set by the strategy, not read off ``shard_bytes``: fp32 training keeps
    4 B shards under shard_grad_op too, which are the training precision's weights beside no master copy."""

    @property
    def shards_experts(self) -> bool:
        """Whether the routed experts are fully sharded as the dense units are (PyTorch FSDP2, ``fsdp: full_shard
        | hybrid_shard``, as torchtitan's apply_fsdp shards them: ``fully_shard`` of each layer's experts over
        the ``efsdp`` mesh, the data-parallel ranks left after EP, dp_shard x cp x tp / ep of them; their fp32
        shards all-gathered with their layer's unit and their gradients reduce-scattered with it), rather than
        kept whole with only their optimizer state sharded (Megatron-Core's distributed optimizer, ``zero``)."""
        return self.gather_per_layer

    @property
    def grad_reduction(self) -> Primitive:
        """The collective that reduces gradients over their data-parallel group: an all-reduce without ZeRO (every
        rank keeps the whole sum), a reduce-scatter with it (each rank its shard)."""
        return "all_reduce" if self.stage == 0 else "reduce_scatter"

    @property
    def sharded_grad_steps(self) -> bool:
        """Whether gradients are reduce-scattered unit by unit (ZeRO-3 always: every micro-batch as its backward
        produces them, or without ``reduce_every_microbatch`` after each chunk's last gradient action; ZeRO-2
        with ``reduce_every_microbatch``), rather than in buckets after the last micro-batch."""
        return self.stage == 3 or (self.stage == 2 and self.reduce_every_microbatch)

    @property
    def defers_unit_grads(self) -> bool:
        """Whether ZeRO-3 accumulates the unsharded gradients over the micro-batches and reduce-scatters each
        unit once per step (PyTorch FSDP's ``set_requires_gradient_sync(False)`` until the last backward)."""
        return self.stage == 3 and not self.reduce_every_microbatch

    @property
    def stage_reduces_grads(self) -> bool:
        """Whether the pipeline stage reduces each chunk's accumulated gradients itself, once, after the chunk's
        last gradient action (torch.distributed.pipelining's REDUCE_GRAD under PyTorch FSDP), rather than
        FSDP's post-backward hooks during the last backward."""
        return self.defers_unit_grads and not self.reshard_after_forward

    @property
    def grad_sync(self) -> GradSync:
        """When ZeRO-3's gradients are reduce-scattered (GradSync)."""
        return "after_last_backward" if self.defers_unit_grads else "every_microbatch"

    def grad_copy_bytes(self, first: bool, final: bool, pipelined: bool) -> tuple[float, float]:
        """HBM bytes per weight PyTorch FSDP2 moves on the compute stream for a unit's gradients (torch 2.13,
        torch/distributed/fsdp/_fully_shard: FSDPParamGroup.post_backward, FSDPParam, foreach_reduce): (in the
        unit's backward, when its gradients are reduced after the ``final`` backward under ``pipelined``
        torch.distributed.pipelining, whose REDUCE_GRAD follows the chunk's last gradient action and its send).
        Autograd writes a fresh gradient in the training precision (``param_bytes``); ``grad_bytes`` is the
        reduce dtype. Reduced every micro-batch: foreach_reduce's chunk_cat copies the fresh gradient into the
        reduce-scatter input (read ``param_bytes``, write ``grad_bytes``). Accumulated: the ``first`` backward
        of the step casts it into ``unsharded_accumulated_grad`` (to_accumulated_grad_if_needed; nothing when
        the dtypes agree: autograd's ``.grad`` is the accumulator), later ones add it in
        (accumulate_unsharded_grad_if_needed, or AccumulateGrad: read both, write the accumulator), and the
        reduce copies the accumulator into the reduce-scatter input (read and write ``grad_bytes``): in the
        final backward without pipelining, where a single backward copies its fresh gradient in directly.
        Not charged: the shard-sized adds and casts foreach_reduce runs after the reduce-scatter, on its
        stream."""
        fresh, reduced = self.param_bytes, self.grad_bytes
        if self.reduce_every_microbatch or (first and final and not pipelined):
            return fresh + reduced, 0.0
        if first:
            accumulate = fresh + reduced if fresh != reduced else 0.0
        else:
            accumulate = fresh + 2 * reduced
        if not final:
            return accumulate, 0.0
        return (accumulate, 2 * reduced) if pipelined else (accumulate + 2 * reduced, 0.0)

    def gather_copy_bytes(self) -> tuple[float, float]:
        """HBM bytes per parameter of a unit PyTorch FSDP2 moves around each all-gather of it, its shards kept in
        ``shard_bytes`` per element (torch 2.13, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): (the
        copy-in, on its own stream before the gather, 1/degree of the unit: where the shard's dtype is not
        param_dtype, _get_param_all_gather_inputs' foreach copy casts it (read ``shard_bytes``, write
        ``param_bytes``; where they agree FSDPParam clamps param_dtype to None and the shard itself is the
        input), then all_gather_copy_in's foreach copy into the all-gather input (read and write
        ``param_bytes``); the copy-out, on the compute stream once the gather is done:
        foreach_all_gather_copy_out's split_with_sizes_copy of the whole output into the unsharded parameters
        (read and write ``param_bytes``)). (0, 0) without ``shard_bytes``."""
        if self.shard_bytes <= 0:
            return 0.0, 0.0
        return self.unshard_copy_bytes() / self.degree, 2 * self.param_bytes

    def replica_reduce_bytes(self, params: float, group: tuple[int, ...]) -> float:
        """Bytes per rank of HSDP's all-reduce across the replicas of a unit of ``params`` parameters reduce-
        scattered over ``group``: the reduced shard, 1/len(group) of its gradients in the reduce dtype."""
        return params * self.grad_bytes / len(group)

    def unshard_copy_bytes(self) -> float:
        """HBM bytes per parameter of a unit FSDP2 moves to make its shard gatherable: where the shard's dtype is
        not param_dtype a cast (read ``shard_bytes``, write ``param_bytes``; FSDPParam clamps param_dtype to
        None where they agree), then a copy of the result (read and write ``param_bytes``). Over a shard group
        of more than one rank that is the copy-in (gather_copy_bytes); over one rank (HSDP whose shard group is
        a single GPU) FSDP2 gathers nothing: FSDPParamGroup.unshard only records an event and
        wait_for_unshard, on the current stream, copies each parameter's ``all_gather_inputs`` (the cast shard)
        into its all-gather output, which the unsharded parameter views (torch 2.13,
        torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, ``world_size == 1``): no copy-in stream, no
        all-gather, no copy-out."""
        cast = self.shard_bytes + self.param_bytes if self.shard_bytes != self.param_bytes else 0.0
        return cast + 2 * self.param_bytes

    def one_rank_reduce_bytes(self) -> float:
        """HBM bytes per parameter of a unit FSDP2's foreach_reduce moves on its reduce-scatter stream where the
        shard group is one rank: no reduce-scatter, ``reduce_output.copy_(reduce_scatter_input)`` (read and
        write ``grad_bytes``; the default gradient_divide_factor None divides nothing there), which HSDP then
        all-reduces across the replicas (torch 2.13, _fsdp_collectives.py, ``world_size > 1`` else branch)."""
        return 2 * self.grad_bytes


def hybrid_degree(layout: Layout, domain: Callable[[int], int]) -> int:
    """HSDP's shard group size: rank 0's DP x CP ranks in its NVLink domain (``domain``: a GPU's)."""
    return sum(1 for rank in layout.combined_group(("dp", "cp"), 0) if domain(rank) == domain(0))


def shard_group(layout: Layout, rank: int, degree: int) -> tuple[int, ...]:
    """The ranks ``rank``'s sharded state is split over: the block of ``degree`` consecutive members of its DP x
    CP group that holds it (HSDP's ``dp_shard``), the whole group where ``degree`` covers it."""
    group = layout.combined_group(("dp", "cp"), rank)
    if degree >= len(group):
        return group
    position = group.index(rank)
    start = position - position % degree
    return group[start:start + degree]


def replica_group(layout: Layout, rank: int, degree: int) -> tuple[int, ...]:
    """The ranks at ``rank``'s place in every shard group of its DP x CP group (`shard_group`), across which HSDP
    all-reduces each gradient shard (``dp_replicate``); () where one shard group covers the DP x CP group."""
    group = layout.combined_group(("dp", "cp"), rank)
    if degree >= len(group):
        return ()
    return group[group.index(rank) % degree::degree]
