"""Context parallelism: the attention core of a layer split over the CP group's shares of the sequence.

Each CP rank holds 1/cp of the sequence's queries and meets the keys and values of the whole sequence. Two
ways to get them (`parallelism.cp_algorithm`):

- ``all_gather`` (Llama 3): gather the whole sequence's K/V before the attention, blocking, and reduce-scatter
  their gradients after its backward.
- ``ring`` (ring attention, Megatron-Core's default ``cp_comm_type: p2p``, Transformer Engine's
  ``AttnFuncWithCPAndKVP2P``): the K/V blocks travel around the CP group in cp - 1 point-to-point steps while
  each rank computes attention on the block it holds; the backward sends K/V and their gradients around
  together (twice the bytes). At each step every CP rank sends the block in hand to the next CP rank and
  receives one from the previous (isend/irecv), one transfer per neighbour pair over the path between the two
  GPUs: NVLink inside a host, one NIC across hosts, never a multi-channel collective that spreads a pair over
  every rail. The program posts each step as one grouped send/receive over the CP group (`ring_step_pairs`:
  only the neighbour pairs carry bytes), step k + 1 after step k, on the ``cp`` stream alongside the attention
  of the first cp - 1 blocks; the last block waits for the last step. With equal steps this is exactly
  ``block + (cp - 1) x max(block, transfer)``, the time of the step-by-step overlap.

Causal masking makes the work uneven: split naively, rank i of the CP group meets i + 1/2 blocks' worth of the
score triangle (chunk i against chunks 0..i), so its share of the mean is (2i + 1) / cp. Load balancing
(`parallelism.cp_load_balance`, on by default) gives each rank two mirrored chunks, i and 2cp - 1 - i, which
makes every rank's work, and every ring step, equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import assert_never

from simulator.collectives.names import Primitive
from simulator.config.parallelism_options import CpAlgorithm
from simulator.parallel.passes import Pass

CP_STREAM = "cp"


def gathered_kv_op(phase: Pass, gather: bool) -> Primitive:
    """The blocking CP collective of the ``all_gather`` algorithm on one side of a block pass: the whole
    sequence's K/V gathered before the forward, the recompute and (``gather``) the backward, their gradients
    reduce-scattered after the backward."""
    return "reduce_scatter" if phase.input_grads and not gather else "all_gather"


@cache
def ring_step_pairs(cp: int, nbytes: float) -> tuple[tuple[float, ...], ...]:
    """The bytes CP rank i sends CP rank j in one step of the K/V ring: ``nbytes`` (a block) to the next rank,
    i + 1 mod cp, nothing to any other. Cached, so that every step's op shares one matrix object (the engine
    knows a matrix by its identity first, engine/groups.py)."""
    return tuple(tuple(nbytes if j == (i + 1) % cp else 0.0 for j in range(cp)) for i in range(cp))


@dataclass(frozen=True, slots=True)
class ContextAttention:
    """The attention core of one block under context parallelism, for a rank with the mean share of the work.

    ``forward_s``/``backward_s``/``recompute_s`` and the FLOPs are the core's part of the block's figures (the
    block's own figures include them), ``sm_bound_s`` the seconds of them that SMs limit (forward, backward,
    recompute), ``hbm_bytes`` the HBM bytes its kernels move (the same passes); ``kv_bytes`` is the K/V of the
    whole sequence for this rank's heads;
    ``causal`` says masked blocks are skipped (flash attention), which is what makes unbalanced splits uneven.
    """

    algorithm: CpAlgorithm
    cp: int
    balanced: bool
    causal: bool
    forward_s: float
    backward_s: float
    recompute_s: float
    forward_flops: float
    backward_flops: float
    recompute_flops: float
    kv_bytes: float
    sm_bound_s: tuple[float, float, float]
    hbm_bytes: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def core(self, phase: Pass) -> tuple[float, float, float]:
        """(seconds, FLOPs, SM-bound seconds) of the core in pass ``phase``; the core has no weights, so its
        backward is all input gradients and a weight-gradient pass has none of it."""
        forward, backward, recompute = self.sm_bound_s
        match phase:
            case Pass.FORWARD:
                return self.forward_s, self.forward_flops, forward
            case Pass.RECOMPUTE:
                return self.recompute_s, self.recompute_flops, recompute
            case Pass.BACKWARD | Pass.BACKWARD_INPUT:
                return self.backward_s, self.backward_flops, backward
            case Pass.BACKWARD_WEIGHT:
                return 0.0, 0.0, 0.0
        assert_never(phase)

    def core_bytes(self, phase: Pass) -> float:
        """HBM bytes of the core's kernels in pass ``phase`` (none in a weight-gradient pass, as in ``core``)."""
        forward, backward, recompute = self.hbm_bytes
        match phase:
            case Pass.FORWARD:
                return forward
            case Pass.RECOMPUTE:
                return recompute
            case Pass.BACKWARD | Pass.BACKWARD_INPUT:
                return backward
            case Pass.BACKWARD_WEIGHT:
                return 0.0
        assert_never(phase)

    def share(self, cp_rank: int) -> float:
        """This CP rank's attention work over the mean rank's: 1 when balanced (or nothing is skipped), else
        (2 i + 1) / cp, its strip of the causal triangle."""
        if self.balanced or not self.causal:
            return 1.0
        return (2 * cp_rank + 1) / self.cp

    def last_step_share(self, cp_rank: int) -> float:
        """Share of this rank's attention work done on the last block of the ring (after the last transfer):
        1/cp when balanced; unbalanced, a full block for the last rank (whose final block is below the
        diagonal) and nothing for the others (their final block is masked out)."""
        if self.balanced or not self.causal:
            return 1.0 / self.cp
        return 1.0 / (cp_rank + 0.5) if cp_rank == self.cp - 1 else 0.0

    def ring_block_bytes(self, phase: Pass) -> float:
        """Bytes each CP rank sends its next one in one step of the ring in pass ``phase``: a block, 1/cp of the
        sequence's K/V, with its gradients (twice the bytes) in a pass that computes input gradients."""
        return self.kv_bytes / self.cp * (2 if phase.input_grads else 1)

    @property
    def ring(self) -> bool:
        """Whether the K/V blocks travel a ring over the CP group (ring attention with cp > 1)."""
        return self.algorithm == "ring" and self.cp > 1


def imbalance_report(context: ContextAttention, layers_per_rank: int, microbatches: int) -> dict | None:
    """The summary's `cp_imbalance` entry of a step whose CP ranks do different attention work (causal, not load
    balanced; None where every rank's share is the mean's): each CP rank's attention core seconds in the step,
    the forward, recompute and backward of its ``layers_per_rank`` layers over the ``microbatches`` at its
    share of the causal work, as the cost model gives them before SM contention stretches an op, and what the
    slowest rank's adds beyond the mean, which every rank of its group waits for, as a MoE step's ranks wait for
    the hottest EP rank. At pp > 1 the step grows by more, (m + p - 1)/m times it with uniform stages: the
    pipeline's fill and drain carry the slower passes too."""
    if context.share(0) == context.share(context.cp - 1):
        return None
    per_layer = (context.forward_s + context.recompute_s + context.backward_s) * layers_per_rank * microbatches
    seconds = [per_layer * context.share(cp_rank) for cp_rank in range(context.cp)]
    mean = sum(seconds) / context.cp
    slowest = max(seconds)
    return {"cp": context.cp, "attention_s_per_cp_rank": seconds, "slowest_cp_rank": seconds.index(slowest),
            "slowest_rank_load_over_mean": slowest / mean if mean else 0.0, "slowest_rank_adds_s": slowest - mean}


def context_fold_blocker(context: ContextAttention | None) -> str:
    """Why folding (one rank per stage for all its CP peers) would not be exact: ranks of an unbalanced causal
    CP group do different work."""
    if context is not None and context.cp > 1 and context.share(0) != context.share(context.cp - 1):
        return "context parallelism without causal load balancing (CP ranks do different attention work)"
    return ""
