"""The layout search's estimate of a block pass's TP collectives under Transformer Engine's TP overlap
(`parallelism.tp_comm_overlap`), built as the program builder builds them (parallel/overlap.py) and timed as the
engine runs them: each collective alone on the idle network with the algorithm and SMs the program gives it,
each GEMM beside one slowed by the engine's rule while the collective's kernel holds its SMs
(`SmShare.overlap_delay`; a GEMM chunk launched without SMs at their rate throughout, as engine/contention.py
runs a kernel with ``reserved`` SMs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.collectives.names import Primitive
from simulator.parallel.overlap import TPOverlap, regathers_input, tp_op
from simulator.parallel.passes import Pass
from simulator.parallel.program import StepPlan
from simulator.parallel.work import Block, TpPattern, bound_share
from simulator.program.contention import SmShare, mixed_rate

if TYPE_CHECKING:
    from simulator.sweep.layouts import CollectiveTimes


def overlapped_tp_s(plan: StepPlan, times: CollectiveTimes, block: Block, rank: int, phase: Pass,
                    share: SmShare | None, weight_grads: bool = True) -> float:
    """Seconds the TP collectives of pass ``phase`` of ``block`` on ``rank`` add to its kernels under
    ``plan.tp_overlap``, as `OverlapMixin._tp_compute` places them: the all-gather before a transformer layer's
    column-parallel GEMM as a ring exchange against it (`ring_exchange_s`), the reduce-scatter after its
    row-parallel GEMM pipelined behind that GEMM's chunks (`pipelined_reduce_scatter_s`), the backward's
    re-gather of a sharded input and its gradient's reduce-scatter beside the input- and weight-gradient GEMMs
    (`column_backward_s`; ``weight_grads`` false: a zero-bubble B, whose reduce-scatter blocks), and every other
    TP collective (the embedding's, the output layer's forward gather) blocking on the compute stream, NCCL's,
    at its alone time. ``share`` None: communication slows no kernel."""
    overlap, layout = plan.tp_overlap, plan.layout
    assert overlap is not None
    if layout.tp == 1 or block.tp_bytes <= 0:
        return 0.0
    group = layout.group("tp", rank)
    backward = phase.input_grads
    gemms = tuple(zip(block.overlap_gemm_s, block.overlap_gemm_sm_s))
    leading_gemm, trailing_gemm = (gemms[2], gemms[3]) if backward else (gemms[0], gemms[1])
    layer = block.tp_pattern is TpPattern.LAYER
    before = tp_op(block.tp_pattern, backward, True, plan.sequence_parallel)
    after = tp_op(block.tp_pattern, backward, False, plan.sequence_parallel)
    seconds = 0.0
    if layer and before == "all_gather" and leading_gemm[0] > 0:
        seconds += ring_exchange_s(overlap, times, group, rank, block.tp_bytes, leading_gemm, share)
    elif before is not None:
        seconds += times.seconds(before, group, block.tp_bytes)
    if backward and regathers_input(block.tp_pattern, plan.sequence_parallel):
        assert after is not None
        return seconds + column_backward_s(overlap, times, group, block, after, share, weight_grads)
    if layer and after == "reduce_scatter" and trailing_gemm[0] > 0:
        return seconds + pipelined_reduce_scatter_s(overlap, times, group, block.tp_bytes, trailing_gemm, share)
    return seconds + (times.seconds(after, group, block.tp_bytes) if after is not None else 0.0)


def slowed_s(share: SmShare | None, beside_s: float, held: int, gemm: tuple[float, float]) -> float:
    """Seconds GEMM ``gemm`` (seconds, SM-bound seconds) takes started together with a collective of
    ``beside_s`` seconds whose kernel holds ``held`` SMs."""
    gemm_s, gemm_sm_s = gemm
    if share is None or gemm_s <= 0:
        return gemm_s
    return gemm_s + share.overlap_delay(beside_s, held, gemm_s, bound_share(gemm_sm_s, gemm_s))


def ring_exchange_s(overlap: TPOverlap, times: CollectiveTimes, group: tuple[int, ...], rank: int, nbytes: float,
                    gemm: tuple[float, float], share: SmShare | None) -> float:
    """What the ring exchange adds to the GEMM ``gemm`` (seconds, SM-bound seconds) it all-gathers ``nbytes``
    for (`OverlapMixin._ring_exchange`): with ``aggregate`` (an even group above 2) the pair swap, which every
    GEMM step waits for, then the exchanges over the ring of every other member beside the first steps - 1 GEMM
    steps, whose end the last step waits for with theirs."""
    size, position = len(group), group.index(rank)
    ring = group
    seconds = 0.0
    if overlap.aggregate and size % 2 == 0 and size > 2:
        start = position - position % 2
        seconds += times.seconds("all_gather", group[start:start + 2], nbytes * 2 / size, algorithm="userbuffers",
                                 protocol="simple")
        ring = group[position % 2::2]
    steps = len(ring)
    if steps == 1:
        return seconds
    gemm_s, gemm_sm_s = gemm
    first = (gemm_s * (steps - 1) / steps, gemm_sm_s * (steps - 1) / steps)
    exchange = times.seconds("all_gather", ring, nbytes, algorithm="ring_exchange", protocol="simple")
    return seconds + max(slowed_s(share, exchange, overlap.all_gather_sms, first), exchange) - first[0]


def pipelined_reduce_scatter_s(overlap: TPOverlap, times: CollectiveTimes, group: tuple[int, ...], nbytes: float,
                               gemm: tuple[float, float], share: SmShare | None) -> float:
    """What the pipelined reduce-scatter of ``nbytes`` adds to the GEMM ``gemm`` (seconds, SM-bound seconds) it
    follows (`OverlapMixin._pipelined_reduce_scatter`): the GEMM's ``chunks`` chunks back to back, each launched
    without the reduce-scatter's SMs (so at their rate throughout), chunk k's reduce-scatter once GEMM chunk k
    and the reduce-scatter before it have ended; the pass ends with the last reduce-scatter."""
    gemm_s, gemm_sm_s = gemm
    chunks, sms = overlap.chunks, overlap.reduce_scatter_sms
    rate = mixed_rate(share.rate(sms), bound_share(gemm_sm_s, gemm_s)) if share is not None else 1.0
    chunk_s = gemm_s / chunks / rate
    scatter_s = times.seconds("reduce_scatter", group, nbytes / chunks, algorithm="userbuffers", protocol="simple")
    end = 0.0
    for index in range(1, chunks + 1):
        end = max(index * chunk_s, end) + scatter_s
    return end - gemm_s


def column_backward_s(overlap: TPOverlap, times: CollectiveTimes, group: tuple[int, ...], block: Block,
                      scatter: Primitive, share: SmShare | None, weight_grads: bool) -> float:
    """What the backward's re-gather of ``block``'s sharded input and its gradient's ``scatter`` add to the
    GEMMs they run beside (`OverlapMixin._column_backward`): the bulk all-gather beside the input-gradient GEMMs,
    which the weight-gradient GEMMs wait for, then the bulk reduce-scatter beside those, on the `tp` stream
    after the gather; without weight gradients the reduce-scatter blocks, NCCL's, after both."""
    nbytes = block.tp_bytes
    dgrad = (block.overlap_gemm_s[3], block.overlap_gemm_sm_s[3])
    gather = times.seconds("all_gather", group, nbytes, algorithm="userbuffers", protocol="simple")
    seconds = max(slowed_s(share, gather, overlap.bulk_all_gather_sms, dgrad), gather) - dgrad[0]
    if not weight_grads:
        return seconds + times.seconds(scatter, group, nbytes)
    wgrad = block.column_wgrad_s
    reduce = times.seconds(scatter, group, nbytes, algorithm="userbuffers", protocol="simple")
    return seconds + max(slowed_s(share, reduce, overlap.bulk_reduce_scatter_sms, wgrad), reduce) - wgrad[0]


def split_backward_excess_s(plan: StepPlan, times: CollectiveTimes, blocks: tuple[Block, ...], rank: int,
                            share: SmShare | None) -> float:
    """Seconds the input grads of ``blocks`` on ``rank`` take apart from their weight grads (a zero-bubble B)
    beyond the input grads of a whole backward (`overlapped_tp_s`): under the TP overlap the backward's
    reduce-scatter of a sharded input's gradient runs beside the weight-gradient GEMMs of a whole backward and
    blocks a B (nothing without the overlap, where it blocks both)."""
    if plan.tp_overlap is None:
        return 0.0
    return sum(overlapped_tp_s(plan, times, block, rank, Pass.BACKWARD, share, weight_grads=False)
               - overlapped_tp_s(plan, times, block, rank, Pass.BACKWARD, share) for block in blocks)
