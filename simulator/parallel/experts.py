"""Expert parallelism: the routed experts of a MoE layer spread over the EP group, and the groups it uses.

Placement (as Megatron-Core with expert tensor parallelism 1): the EP group of a rank is a block of ``ep``
consecutive members of its DP x CP group (same TP coordinate, same pipeline stage); EP rank j holds experts
j E/ep .. (j+1) E/ep - 1 whole. Each TP rank routes its own 1/t of the micro-batch's tokens, so the MoE block
needs no TP collective with sequence parallelism and an all-gather across TP without it. The expert-data-parallel
group (ranks holding the same experts: stride ``ep`` in the DP x CP groups of every TP coordinate, tp x dp x cp /
ep ranks) reduces the experts' gradients. Under PyTorch FSDP2 (``fsdp: full_shard | hybrid_shard``) the experts
are fully sharded over those of them in the rank's shard group instead, as torchtitan's ``efsdp`` mesh shards
them (`expert_shard_groups`), gathered and reduced layer by layer with their layer's unit.

A MoE MLP block runs: the router, permutation and shared experts; the dispatch all-to-all; the routed experts'
GEMMs; the combine all-to-all (the backward runs the two all-to-alls in reverse around the experts' backward).
Each pair of EP ranks exchanges the tokens it really routes to the other's experts (the dispatch matrix; the
combine sends the transpose back), so an uneven routing loads some links more than others. Every rank computes
the hottest EP rank's experts, since every rank of the group waits for that rank at the combine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Literal, assert_never

import numpy as np

from simulator.collectives.names import Primitive
from simulator.parallel.folding import mirror_images
from simulator.parallel.layout import Layout
from simulator.parallel.passes import Pass, pass_figure

if TYPE_CHECKING:
    from simulator.parallel.sharding import Sharding

AllToAll = Literal["dispatch", "combine"]
"""The two all-to-alls around a MoE block's routed experts."""


@dataclass(frozen=True, slots=True)
class ExpertWork:
    """The routed experts' part of a MoE block on one rank per micro-batch (the block's figures include it).

    ``dispatch_pairs``: bytes EP rank i sends EP rank j in the dispatch (tokens x hidden x bytes, itself
    included on the diagonal), ``combine_pairs`` its transpose; ``dispatch_bytes``: their mean per rank (k n d
    elements for uniform routing);
    ``params``: routed-expert parameters this rank holds; ``sm_bound_s``: the seconds of the experts' kernels that
    SMs limit (forward, backward input, backward weight, recompute), ``hbm_bytes`` the HBM bytes they move (the
    same passes). The seconds and FLOPs are the hottest EP
    rank's, which every rank of the group waits for; ``mean_load_share`` (the group's mean rank load over the
    hottest's, 1 for an even routing) is the share of those FLOPs an average rank executes, which its expert ops
    record, so that HFU counts what the GPUs executed, not the hottest rank's work on every GPU.
    """

    ep: int
    dispatch_pairs: tuple[tuple[float, ...], ...]
    combine_pairs: tuple[tuple[float, ...], ...]
    dispatch_bytes: float
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    recompute_s: float
    forward_flops: float
    backward_input_flops: float
    backward_weight_flops: float
    recompute_flops: float
    params: float
    sm_bound_s: tuple[float, float, float, float]
    mean_load_share: float = 1.0
    hbm_bytes: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def pairs(self, which: AllToAll, backward: bool) -> tuple[tuple[float, ...], ...]:
        """Bytes per (sender, receiver) of the ``which`` (dispatch or combine) all-to-all: the dispatch matrix
        in the forward dispatch and the backward of the combine (gradients flow toward the experts), its
        transpose otherwise."""
        if (which == "dispatch") != backward:
            return self.dispatch_pairs
        return self.combine_pairs

    def exchanges(self, phase: Pass) -> bool:
        """Whether pass ``phase`` runs the dispatch and the combine all-to-alls around the experts: the experts
        run in it, it carries activations or input gradients to other ranks (not a weight-gradient pass) and
        the experts are split over more than one EP rank."""
        return self.ep > 1 and phase.sends_activations and self.part(phase)[0] > 0

    def part(self, phase: Pass) -> tuple[float, float, float]:
        """(seconds, FLOPs, SM-bound seconds) of the experts in pass ``phase``."""
        forward, backward_input, backward_weight, recompute = self.sm_bound_s
        match phase:
            case Pass.FORWARD:
                return self.forward_s, self.forward_flops, forward
            case Pass.RECOMPUTE:
                return self.recompute_s, self.recompute_flops, recompute
            case Pass.BACKWARD:
                return (self.backward_input_s + self.backward_weight_s,
                        self.backward_input_flops + self.backward_weight_flops, backward_input + backward_weight)
            case Pass.BACKWARD_INPUT:
                return self.backward_input_s, self.backward_input_flops, backward_input
            case Pass.BACKWARD_WEIGHT:
                return self.backward_weight_s, self.backward_weight_flops, backward_weight
        assert_never(phase)

    def part_bytes(self, phase: Pass) -> float:
        """HBM bytes of the experts' kernels in pass ``phase``."""
        return pass_figure(self.hbm_bytes, phase)


@lru_cache(maxsize=4096)
def ep_group(layout: Layout, rank: int, ep: int) -> tuple[int, ...]:
    """The ranks that share ``rank``'s tokens through the all-to-alls: its block of ``ep`` in DP x CP."""
    group = layout.combined_group(("dp", "cp"), rank)
    start = group.index(rank) // ep * ep
    return group[start:start + ep]


def expert_group_numbers(layout: Layout, ep: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank of ``layout``, a number for its EP group (`ep_group`) and one for its expert-data-parallel group
    (`expert_dp_group`), for every rank at once: a rank's place in its DP x CP group (in rank order) over ``ep``
    and modulo ``ep``. ``ep`` divides the DP x CP ranks."""
    ranks = np.arange(layout.world, dtype=np.int64)
    dp, cp = ((ranks // layout.stride(dim)) % layout.degree(dim) for dim in ("dp", "cp"))
    place = dp * layout.cp + cp if layout.stride("dp") > layout.stride("cp") else cp * layout.dp + dp
    rest = ranks - dp * layout.stride("dp") - cp * layout.stride("cp")
    stage = (ranks // layout.stride("pp")) % layout.pp
    return rest * (layout.dp * layout.cp // ep) + place // ep, stage * ep + place % ep


@lru_cache(maxsize=4096)
def expert_dp_group(layout: Layout, rank: int, ep: int) -> tuple[int, ...]:
    """The ranks holding the same experts as ``rank``: stride ``ep`` in the DP x CP group of each of its TP
    group's members. Every TP rank holds its experts whole and runs them on its own tokens, so their gradients
    are summed over the TP ranks too (Megatron-Core's expert-data-parallel group with expert TP 1:
    tp x dp x cp / ep ranks)."""
    return _across_tp(layout, _expert_slice(layout, rank, ep))


def expert_sharding(sharding: Sharding, ep: int, tp: int) -> Sharding:
    """How routed experts' state is sharded: over the ranks of a shard group of ``sharding.degree`` DP x CP ranks
    that hold the same experts, with their TP peers (every TP rank holds them whole): tp x degree / ep ranks, or
    the TP group alone where ep exceeds the shard group (`expert_shard_groups`). Under PyTorch FSDP2
    (Sharding.shards_experts) as the dense units are, ZeRO-3 over those ranks: torchtitan's ``fully_shard`` of
    the experts over its ``efsdp`` mesh, dp_shard x cp x tp / ep ranks. Otherwise Megatron-Core's distributed
    optimizer, over that group, not over the whole data-parallel group, and only their optimizer state at any
    ZeRO stage (ZeRO-1's sharding): the step keeps the experts' weights whole (no per-layer gather; the
    optimizer's updates are all-gathered after it) and accumulates their gradients whole until one
    reduce-scatter after the last micro-batch (parallel/block_passes.py)."""
    degree = tp * max(1, sharding.degree // ep)
    if sharding.shards_experts:
        return replace(sharding, degree=degree)
    return replace(sharding, stage=min(sharding.stage, 1), degree=degree)


@lru_cache(maxsize=4096)
def expert_shard_groups(layout: Layout, rank: int, ep: int, degree: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """PyTorch FSDP2's groups for ``rank``'s routed experts (Sharding.shards_experts), its dense shard group being
    a block of ``degree`` consecutive members of its DP x CP group (the whole group under full_shard): (the
    shard group, the members of that block holding its experts (stride ``ep``) with their TP peers, torchtitan's
    ``efsdp`` mesh; the replica group, the ranks of its TP coordinate holding its experts at its place in the
    other blocks, HSDP's ``dp_replicate``, () where there are none). The shard group's size is
    expert_sharding's degree."""
    group = layout.combined_group(("dp", "cp"), rank)
    position = group.index(rank)
    start = position - position % degree
    shard = tuple(member for index, member in enumerate(group[start:start + degree], start)
                  if (index - position) % ep == 0)
    replicas = tuple(member for index, member in enumerate(group)
                     if (index - position) % degree == 0 and (index - position) % ep == 0)
    return _across_tp(layout, shard), replicas if len(replicas) > 1 else ()


@lru_cache(maxsize=256)
def expert_shard_images(layout: Layout, rank: int, ep: int, degree: int) -> tuple[tuple[int, ...], ...]:
    """Every other expert shard group of ``rank``'s pipeline stage (`expert_shard_groups`), once each in rank
    order of first occurrence: the folded replicas' copies of its experts' gathers and reduce-scatters."""
    own = expert_shard_groups(layout, rank, ep, degree)[0]
    stage = (member for member in layout.stage_ranks(layout.coords(rank)["pp"]) if layout.coords(member)["tp"] == 0)
    groups = dict.fromkeys(expert_shard_groups(layout, member, ep, degree)[0] for member in stage)
    return tuple(group for group in groups if group != own)


@dataclass(frozen=True, slots=True)
class ExpertStateCollective:
    """A collective of the routed experts' gradients or parameters over the expert-data-parallel group: ``op``
    over ``group``, ``nbytes`` per rank."""

    op: Primitive
    group: tuple[int, ...]
    nbytes: float


def expert_gradient_reduction(layout: Layout, rank: int, experts: Sequence[ExpertWork],
                              sharding: Sharding) -> ExpertStateCollective | None:
    """The routed experts' gradients of ``rank``'s pipeline stage (``experts``: its MoE blocks'), reduced once
    over the expert-data-parallel group after the last micro-batch: all-reduce, or reduce-scatter under ZeRO.
    None without experts, when the group is one rank, or under PyTorch FSDP2, which reduce-scatters them with
    their layer's unit (Sharding.shards_experts)."""
    if sharding.shards_experts:
        return None
    return _expert_state(layout, rank, experts, sharding.grad_reduction, sharding.grad_bytes)


def expert_param_gather(layout: Layout, rank: int, experts: Sequence[ExpertWork],
                        sharding: Sharding) -> ExpertStateCollective | None:
    """ZeRO: the all-gather of ``experts``' parameters over the expert-data-parallel group, which the
    distributed optimizer updated shard by shard. None without experts, when the group is one rank, or under
    PyTorch FSDP2, which gathers them with their layer's unit (Sharding.shards_experts)."""
    if sharding.shards_experts:
        return None
    return _expert_state(layout, rank, experts, "all_gather", sharding.param_bytes)


def _expert_state(layout: Layout, rank: int, experts: Sequence[ExpertWork], op: Primitive,
                  bytes_per_param: float) -> ExpertStateCollective | None:
    if not experts:
        return None
    group = expert_dp_group(layout, rank, experts[0].ep)
    if len(group) == 1:
        return None
    return ExpertStateCollective(op, group, sum(work.params for work in experts) * bytes_per_param)


def _expert_slice(layout: Layout, rank: int, ep: int) -> tuple[int, ...]:
    """The ranks of ``rank``'s TP coordinate holding its experts: stride ``ep`` in its DP x CP group."""
    group = layout.combined_group(("dp", "cp"), rank)
    return group[group.index(rank) % ep::ep]


def _across_tp(layout: Layout, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """``ranks`` and their TP peers, in rank order."""
    return tuple(sorted(peer for member in ranks for peer in layout.group("tp", member)))


@lru_cache(maxsize=256)
def group_images(layout: Layout, rank: int, ep: int, expert_dp: bool) -> tuple[tuple[int, ...], ...]:
    """Every other EP (or expert-DP) group of ``rank``'s pipeline stage: the folded replicas' copies of the
    collective, the other slices of the DP x CP groups (`folding.mirror_images`); an expert-DP group's are the
    images of its slice at one TP coordinate, each with its TP peers, once each. Cached: every all-to-all of a
    rank asks again."""
    if not expert_dp:
        return mirror_images(layout, ep_group(layout, rank, ep))
    own = expert_dp_group(layout, rank, ep)
    images = (_across_tp(layout, image) for image in mirror_images(layout, _expert_slice(layout, rank, ep)))
    return tuple(image for image in dict.fromkeys(images) if image != own)
