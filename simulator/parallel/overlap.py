"""Communication overlap in the program builder: TP collectives chunked against their neighbouring GEMMs
(Megatron-LM's --tp-comm-overlap, Transformer Engine userbuffers) and the distributed optimizer's parameter
gather deferred to the next step's forward (--overlap-param-gather). docs/training-step.md describes both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import assert_never

from simulator.collectives.names import Primitive
from simulator.parallel.builder_core import BuilderCore
from simulator.parallel.passes import Pass
from simulator.parallel.work import Block, TpPattern, bound_share
from simulator.program.ops import Category

TP_STREAM = "tp"
DP_STREAM = "dp"


@cache
def tp_op(pattern: TpPattern, backward: bool, before: bool, sequence_parallel: bool) -> Primitive | None:
    """The TP collective (or None) at one side of a block's forward or backward, per Megatron's operators.
    Cached: the builder asks it twice per block pass, and matching on enum members (each read off its class
    through a descriptor on Python 3.11) costs 0.27 us a call against 0.06 us cached."""
    match pattern:
        case TpPattern.EMBEDDING:
            if backward or before:
                return None
            return "reduce_scatter" if sequence_parallel else "all_reduce"
        case TpPattern.EXPERTS:
            return None if sequence_parallel or before else "all_gather"
        case TpPattern.HEAD:
            if sequence_parallel:
                if before and not backward:
                    return "all_gather"
                return "reduce_scatter" if backward and not before else None
            return "all_reduce" if backward and not before else None
        case TpPattern.LAYER:
            if sequence_parallel:
                return "all_gather" if before else "reduce_scatter"
            return None if before else "all_reduce"
    assert_never(pattern)


def regathers_input(pattern: TpPattern, sequence_parallel: bool) -> bool:
    """Whether a block's backward all-gathers its input again: with sequence parallelism the column-parallel
    linears after the forward's leading all-gather save their input sharded (Megatron-LM's
    LinearWithGradAccumulationAndAsyncCommunication, ``ctx.save_for_backward(input, weight)`` before gathering
    into the shared "mpu" buffer; Transformer Engine's Linear with sequence_parallel), and their weight
    gradients need it whole. A recomputed forward saves it sharded again, so recomputation does not spare it."""
    return tp_op(pattern, backward=False, before=True, sequence_parallel=sequence_parallel) == "all_gather"


@dataclass(frozen=True)
class TPOverlap:
    """Transformer Engine's userbuffers TP overlap (Megatron-LM's --tp-comm-overlap) as NeMo configures it.

    The all-gather before a column-parallel GEMM (QKV and FC1 forward, projection and FC2 input gradient) runs
    as a ring exchange: the GEMM is split into steps, each on the input chunk already present while the next
    chunk moves to the neighbour (``aggregate``, at an even TP size above 2: first one chunk swapped within GPU
    pairs, then two chunks per step with the GPU two along the ring, tp / 2 steps; NeMo aggregates only at TP 4
    and 8, where steps are left to overlap); its kernel holds ``all_gather_sms`` SMs and the GEMMs
    run on all of them (``set_sm_margin`` false). The reduce-scatter after a row-parallel GEMM (projection and
    FC2 forward) is pipelined: the GEMM in ``chunks`` chunks, each chunk's reduce-scatter once its GEMM chunk
    has ended, on ``reduce_scatter_sms`` SMs that the GEMM chunks leave to it for their whole length
    (``set_sm_margin`` true; engine/contention.py). The backward's re-gather of a column-parallel input and the
    reduce-scatter of its input gradient run whole ("bulk") beside the input- and the weight-gradient GEMM, on
    ``bulk_all_gather_sms`` and ``bulk_reduce_scatter_sms`` SMs."""

    chunks: int = 4
    aggregate: bool = False
    all_gather_sms: int = 0
    reduce_scatter_sms: int = 0
    bulk_all_gather_sms: int = 0
    bulk_reduce_scatter_sms: int = 0


class OverlapMixin(BuilderCore):
    """The overlap methods of ProgramBuilder (kept apart to keep the builder readable); they use the builder
    core (builder_core.py)."""

    def _tp_compute(self, rank: int, block: Block, phase: Pass, deps: list[int], mb: int,
                    vstage: int, name: str, duration: float, category: Category, flops: float,
                    compute_phase: Pass | None = None) -> tuple[list[int], int]:
        """A block's compute with its TP collectives before and after; returns (what the next op waits for, the
        last compute op). Under ``tp_overlap`` an all-gather before a GEMM runs as a ring exchange against it,
        a reduce-scatter after one pipelined in chunks behind it.
        ``compute_phase`` names the pass for the compute when it differs from ``phase``, the pass whose TP
        collectives bracket it (input gradients only, between the full backward's collectives)."""
        before, after = self._adjacent_gemms(block, phase)
        before_gemm, before_sm, before_bytes = before
        after_gemm, after_sm, after_bytes = after
        pass_phase = compute_phase or phase
        pass_bytes = block.pass_hbm_bytes(pass_phase)
        if not before_gemm:
            deps = self._tp_collective(rank, block, phase, deps, mb, vstage, before=True)
        else:
            deps = self._ring_exchange(rank, block, phase, deps, mb, vstage, name=name, gemm=before,
                                       flops=flops * before_gemm / duration, category=category)
        if self._regathers(block, phase):
            left = duration - before_gemm
            whole = (left, flops * left / duration if duration > 0 else 0.0,
                     block.sm_bound_seconds(pass_phase) - before_sm, pass_bytes - before_bytes)
            return self._column_backward(rank, block, pass_phase, deps, mb, vstage, name, category, whole)
        rest = duration - before_gemm - after_gemm
        share = rest / duration if duration > 0 else 1.0
        last = self._pass(rank, block, pass_phase, name, rest, flops * share, deps, category, mb, vstage,
                          block.sm_bound_seconds(pass_phase) - before_sm - after_sm,
                          pass_bytes - before_bytes - after_bytes)
        if not after_gemm:
            return self._tp_collective(rank, block, phase, [last], mb, vstage, before=False), last
        return self._pipelined_reduce_scatter(rank, block, phase, [last], mb, vstage, name=name, gemm=after,
                                              flops=flops * after_gemm / duration, category=category)

    def _regathers(self, block: Block, phase: Pass) -> bool:
        """Whether ``phase`` of ``block`` all-gathers the block's input again (``regathers_input``)."""
        return (phase.input_grads and self.plan.layout.tp > 1 and block.tp_bytes > 0
                and regathers_input(block.tp_pattern, self.plan.sequence_parallel))

    def _column_backward(self, rank: int, block: Block, phase: Pass, deps: list[int], mb: int, vstage: int,
                         name: str, category: Category,
                         whole: tuple[float, float, float, float]) -> tuple[list[int], int]:
        """The backward of a block whose input the column-parallel linears saved sharded (``regathers_input``),
        after its leading TP collective, as Megatron-LM runs it: the compute up to those linears' input-gradient
        GEMMs; then the input's all-gather on the `tp` stream beside those GEMMs (``async_op=True``; with
        ``tp_comm_overlap`` Transformer Engine's bulk overlap, qkv_dgrad / fc1_dgrad, whose userbuffers kernels
        (collectives/userbuffers.py) hold their SMs while the GEMMs run on all of them: ``set_sm_margin`` false, so
        the engine's SM sharing slows the GEMMs only while the collective runs); their weight-gradient GEMMs wait
        for it (``handle.wait()``); then the input gradient's reduce-scatter: with ``tp_comm_overlap`` whole beside
        the weight-gradient GEMMs (bulk qkv_wgrad / fc1_wgrad), otherwise blocking after them, as every TP
        collective on the compute stream. A pass without weight gradients (a zero-bubble B) waits for the gather
        too, then its reduce-scatter blocks (Megatron-LM waits right after the input-gradient GEMM; the zero-bubble
        fork keeps the gathered input for the W). ``whole``: the pass's (seconds, FLOPs, SM-bound seconds, HBM bytes)
        after the leading collective; the FLOPs are shared by time, as for the chunked overlap, while the dgrad and
        wgrad GEMMs carry their own kernels' bytes and the rest of the pass the others'. Returns (what the next op
        waits for, the last compute op)."""
        duration, flops, sm_bound_s, hbm_bytes = whole
        overlap = self.plan.tp_overlap
        rate = flops / duration if duration > 0 else 0.0
        dgrad_s, dgrad_sm = block.overlap_gemm_s[3], block.overlap_gemm_sm_s[3]
        dgrad_bytes = block.overlap_gemm_bytes[3]
        wgrad_s, wgrad_sm = block.column_wgrad_s if phase.weight_grads else (0.0, 0.0)
        wgrad_bytes = block.column_wgrad_bytes if phase.weight_grads else 0.0
        rest_s = duration - dgrad_s - wgrad_s
        rest = self._pass(rank, block, phase, name, rest_s, rate * rest_s, deps, category, mb, vstage,
                          sm_bound_s - dgrad_sm - wgrad_sm, hbm_bytes - dgrad_bytes - wgrad_bytes)
        group = self.plan.layout.group("tp", rank)
        key = f"tp.{Pass.BACKWARD}.{{}}.mb{mb}.vs{vstage}.{block.name}.{group[0]}"
        gather_name, gather_key = f"tp all_gather {block.name} (input again)", key.format("regather")
        if overlap is None:
            gather = self._collective(rank, TP_STREAM, gather_name, "all_gather", group, block.tp_bytes, gather_key,
                                      [rest], "tp", mb)
        else:
            gather = self._userbuffers(rank, gather_name, "all_gather", group, block.tp_bytes, gather_key, [rest], mb,
                                       overlap.bulk_all_gather_sms)
        dgrad = self._compute(rank, f"{name} dgrad", dgrad_s, [rest], category, rate * dgrad_s, mb=mb,
                              sm_bound_share=bound_share(dgrad_sm, dgrad_s), hbm_bytes=dgrad_bytes)
        if not phase.weight_grads:
            return self._tp_collective(rank, block, Pass.BACKWARD, [dgrad, gather], mb, vstage, before=False), dgrad
        wgrad = self._compute(rank, f"{name} wgrad", wgrad_s, [dgrad, gather], category, rate * wgrad_s, mb=mb,
                              sm_bound_share=bound_share(wgrad_sm, wgrad_s), hbm_bytes=wgrad_bytes)
        if overlap is None:
            return self._tp_collective(rank, block, Pass.BACKWARD, [wgrad], mb, vstage, before=False), wgrad
        op = tp_op(block.tp_pattern, backward=True, before=False, sequence_parallel=True)
        assert op is not None
        scatter = self._userbuffers(rank, f"tp {op} {block.name} (bulk)", op, group, block.tp_bytes, key.format(op),
                                    [dgrad], mb, overlap.bulk_reduce_scatter_sms)
        return [scatter, wgrad], wgrad

    def _adjacent_gemms(self, block: Block, phase: Pass
                        ) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """(seconds, SM-bound seconds, HBM bytes) of the GEMMs the block's leading all-gather (ring exchange) and
        trailing reduce-scatter (pipelined) overlap (0: not overlapped). Transformer Engine's userbuffers serve the
        transformer layers' linears alone (qkv, proj, fc1, fc2: module/base.py names no others); the output layer
        is Megatron-core's own ColumnParallelLinear (GPTModel.output_layer), whose forward all-gather blocks."""
        plan = self.plan
        if (plan.tp_overlap is None or plan.layout.tp == 1 or block.tp_bytes <= 0
                or block.tp_pattern is not TpPattern.LAYER):
            return (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)
        gemms = tuple(zip(block.overlap_gemm_s, block.overlap_gemm_sm_s, block.overlap_gemm_bytes))
        pairs = (gemms[2], gemms[3]) if phase.input_grads else (gemms[0], gemms[1])
        sides = [tp_op(block.tp_pattern, phase.input_grads, before, plan.sequence_parallel) for before in (True, False)]
        leading, trailing = (gemm if side == overlapped else (0.0, 0.0, 0.0)
                             for gemm, side, overlapped in zip(pairs, sides, ("all_gather", "reduce_scatter")))
        return leading, trailing

    def _ring_exchange(self, rank: int, block: Block, phase: Pass, deps: list[int], mb: int, vstage: int, *,
                       name: str, gemm: tuple[float, float, float], flops: float, category: Category) -> list[int]:
        """The all-gather before a column-parallel GEMM as Transformer Engine's ring exchange runs it
        (CommOverlapP2PBase::split_overlap_ag): the GEMM in ``steps`` steps, step k on the input chunks present
        while the chunks for step k + 1 move one exchange along the ring; step k + 1 waits for both. With
        ``aggregate`` (tp even, above 2) the GPUs of each pair first swap their chunks, which every GEMM step
        waits for, then each exchange moves two chunks to the GPU two along: tp / 2 steps over the pair's ring
        (every other member of the TP group); otherwise tp steps of one chunk over the TP group's ring. Ops: the
        pair swap, the exchanges as one ring all-gather (its steps - 1 ring steps), the first ``steps - 1`` GEMM
        steps beside it and the last step after both. With equal GEMM steps of g and exchanges of p, step by step
        the last GEMM step starts max((steps - 1) g, (steps - 1) p) after the first, as with these ops. The pair
        swap is a userbuffers kernel (collectives/userbuffers.py: one latency, no NCCL base latency); the
        exchanges are userbuffers sends and receives, one after the other (the `ring_exchange` algorithm: a
        latency per exchange, none of NCCL's). Returns the last GEMM step.
        ``gemm``: the GEMM's (seconds, SM-bound seconds, HBM bytes)."""
        overlap, layout = self.plan.tp_overlap, self.plan.layout
        assert overlap is not None
        group = layout.group("tp", rank)
        size, position = len(group), group.index(rank)
        key = f"tp.{phase}.all_gather.mb{mb}.vs{vstage}.{block.name}"
        gemm_s, gemm_sm_s, gemm_bytes = gemm
        share = bound_share(gemm_sm_s, gemm_s)
        sms = overlap.all_gather_sms
        aggregate = overlap.aggregate and size % 2 == 0 and size > 2
        if aggregate:
            pair = group[position - position % 2:position - position % 2 + 2]
            swap = self._userbuffers(
                rank, f"tp all_gather {block.name} (pair exchange)", "all_gather", pair, block.tp_bytes * 2 / size,
                f"{key}.pair.{pair[0]}", deps, mb, sms,
                mirrors=self._part_mirrors(group, pair, lambda g: [g[i:i + 2] for i in range(0, len(g), 2)]))
            deps = [*deps, swap]
            ring = group[position % 2::2]
            mirrors = self._part_mirrors(group, ring, lambda g: [g[0::2], g[1::2]])
        else:
            ring, mirrors = group, None
        steps = len(ring)
        if steps > 1:
            exchange = self._collective(rank, TP_STREAM, f"tp all_gather {block.name} (ring exchange)", "all_gather",
                                        ring, block.tp_bytes, f"{key}.ring.{ring[0]}", deps, "tp", mb,
                                        algorithm="ring_exchange", protocol="simple", mirrors=mirrors, sms=sms)
            first = self._compute(rank, f"{name} gemm (first steps)", gemm_s * (steps - 1) / steps, deps, category,
                                  flops * (steps - 1) / steps, mb=mb, sm_bound_share=share,
                                  hbm_bytes=gemm_bytes * (steps - 1) / steps)
            deps = [first, exchange]
        return [self._compute(rank, f"{name} gemm (last step)", gemm_s / steps, deps, category, flops / steps, mb=mb,
                              sm_bound_share=share, hbm_bytes=gemm_bytes / steps)]

    def _part_mirrors(self, group: tuple[int, ...], own: tuple[int, ...],
                      parts: Callable[[tuple[int, ...]], list[tuple[int, ...]]]) -> tuple[tuple[int, ...], ...] | None:
        """The folded replicas' copies of ``own``, a part of the TP group ``group`` (``parts`` splits a TP group
        into the parts of its kind): the other parts of ``group`` and of its mirror images, once per part (kept
        in the builder's mirror cache); None where collectives carry none (`ProgramBuilder.images`)."""
        if not self.images:
            return None
        key = ("tp part", *own)
        mirrors = self._mirror_cache.get(key)
        if mirrors is None:
            mirrors = self._mirror_cache[key] = tuple(part for image in (group, *self._mirrors(group))
                                                      for part in parts(image) if part != own)
        return mirrors

    def _pipelined_reduce_scatter(self, rank: int, block: Block, phase: Pass, deps: list[int], mb: int, vstage: int,
                                  *, name: str, gemm: tuple[float, float, float], flops: float,
                                  category: Category) -> tuple[list[int], int]:
        """The reduce-scatter after a row-parallel GEMM as Transformer Engine pipelines it
        (CommOverlapBase::split_overlap_rs): the GEMM in ``chunks`` chunks back to back on the SMs the
        userbuffers kernels leave, chunk k's reduce-scatter on the `tp` stream once GEMM chunk k and the
        reduce-scatter before it have ended: one op per GEMM chunk and one userbuffers kernel per chunk, each
        paying its own latency, as TE launches them. Returns (the last reduce-scatter, the last GEMM chunk).
        ``gemm``: the GEMM's (seconds, SM-bound seconds, HBM bytes)."""
        overlap = self.plan.tp_overlap
        assert overlap is not None
        group = self.plan.layout.group("tp", rank)
        key = f"tp.{phase}.reduce_scatter.mb{mb}.vs{vstage}.{block.name}.{group[0]}"
        gemm_s, gemm_sm_s, gemm_bytes = gemm
        share = bound_share(gemm_sm_s, gemm_s)
        chunks, sms = overlap.chunks, overlap.reduce_scatter_sms
        scatter: list[int] = []
        for index in range(1, chunks + 1):
            deps = [self._compute(rank, f"{name} gemm (chunk {index} of {chunks})", gemm_s / chunks, deps, category,
                                  flops / chunks, mb=mb, sm_bound_share=share, reserved_sms=sms,
                                  hbm_bytes=gemm_bytes / chunks)]
            scatter = [self._userbuffers(rank, f"tp reduce_scatter {block.name} (chunk {index} of {chunks})",
                                         "reduce_scatter", group, block.tp_bytes / chunks, f"{key}.{index}",
                                         [*deps, *scatter], mb, sms)]
        return scatter, deps[0]

    def _userbuffers(self, rank: int, name: str, op: Primitive, group: tuple[int, ...], nbytes: float, key: str,
                     deps: list[int], mb: int, sms: int, mirrors: tuple[tuple[int, ...], ...] | None = None) -> int:
        """One Transformer Engine userbuffers kernel on the `tp` stream (collectives/userbuffers.py): its own
        algorithm, none of NCCL's protocols or base latency."""
        return self._collective(rank, TP_STREAM, name, op, group, nbytes, key, deps, "tp", mb,
                                algorithm="userbuffers", protocol="simple", mirrors=mirrors, sms=sms)

    def _deferred_param_gathers(self, rank: int) -> None:
        """``overlap_param_gather`` (Megatron's distributed optimizer): the parameters the previous step's
        optimizer updated are all-gathered bucket by bucket in forward order at the start of this step, and a
        block's first forward waits only for its own bucket, so the gathers hide behind the forward."""
        plan, sharding = self.plan, self.plan.sharding
        if not sharding.overlap_param_gather or sharding.stage not in (1, 2) or self._dp_size() == 1:
            return
        pp_rank = plan.layout.coords(rank)["pp"]
        group = self._dp_group(rank)
        pending: list[tuple[int, int]] = []
        size = 0.0

        def flush(index: int) -> None:
            op = self._collective(rank, DP_STREAM, f"all_gather params bucket {index}", "all_gather", group,
                                  size, f"zero.ag.pp{pp_rank}.bucket{index}.{group[0]}", [], "dp")
            for vstage, block_id in pending:
                self._param_gathers.setdefault((rank, vstage, block_id), []).append(op)

        index = 0
        for vstage in plan.rank_stages(pp_rank):
            for block in plan.stages[vstage].blocks:
                if block.params <= 0:
                    continue
                pending.append((vstage, id(block)))
                size += block.params * sharding.param_bytes
                if size >= sharding.bucket_bytes:
                    flush(index)
                    index, pending, size = index + 1, [], 0.0
        if pending:
            flush(index)

    def _param_gather(self, rank: int, vstage: int, block: Block) -> list[int]:
        """The deferred parameter gathers a block's first forward waits for (none after the first)."""
        return self._param_gathers.pop((rank, vstage, id(block)), [])
