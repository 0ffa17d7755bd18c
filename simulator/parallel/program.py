"""Turn a training step into per-rank ops: pipeline actions, TP/SP/CP collectives, P2P between stages,
DDP gradient buckets, ZeRO/FSDP gathers and reduce-scatters, and the optimizer step.

Streams: `compute` runs kernels and the blocking TP/CP collectives (as Megatron does); `tp` the chunked TP
collectives that `tp_comm_overlap` runs against their neighbouring GEMMs; `dp` runs gradient buckets, ZeRO
reduce-scatters and ZeRO-1/2 parameter gathers; `expert_dp` ZeRO's gathers of routed experts over the
expert-data-parallel group (their own communicator); `dp_all_reduce` HSDP's all-reduces across replicas; `zero`
runs ZeRO-3 parameter prefetches; `pp` holds the asynchronous P2P sends and receives (each runs as soon as its
data is ready, like isend/irecv).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.collectives.names import AlgorithmChoice, Primitive, ProtocolChoice
from simulator.parallel.block_passes import BlockPasses
from simulator.parallel.context import context_fold_blocker, gathered_kv_op
from simulator.parallel.experts import expert_shard_groups, expert_shard_images, expert_sharding
from simulator.parallel.folding import RankClasses, class_images, mirror_images, representatives
from simulator.parallel.layout import Layout
from simulator.parallel.overlap import DP_STREAM, OverlapMixin, TPOverlap, tp_op
from simulator.parallel.passes import Pass
from simulator.parallel.sharding import Sharding, replica_group, shard_group
from simulator.parallel.work import Block, StageWork, TpPattern, gradient_buckets, layer_experts, layer_units
from simulator.program.ops import COMPUTE_STREAM, Category, CollectiveOp, ComputeOp, Op
from simulator.program.send_order import SendOrder
from simulator.schedules.base import Action, Placement, Schedule, rank_stages, stage_rank

ZERO_STREAM = "zero"
COPY_IN_STREAM = "fsdp_copy_in"
"""FSDP2's ``all_gather_copy_in_stream``, where a unit's shards are copied into its all-gather's input."""
PP_STREAM = "pp"
ALL_REDUCE_STREAM = "dp_all_reduce"
"""HSDP's all-reduces of each reduce-scattered shard across the replicas: FSDP2's ``all_reduce_stream``, which
waits for the reduce-scatter stream, so the next unit's reduce-scatter does not queue behind an all-reduce."""
ASYNC_STREAMS = frozenset({PP_STREAM})


@dataclass(frozen=True)
class StepPlan:
    """Everything the program builder needs: layout, schedule (per pipeline rank), per-virtual-stage work,
    the optimizer step's duration per pipeline rank, and the placement of each rank's chunks on virtual stages."""

    layout: Layout
    schedule: Schedule
    stages: tuple[StageWork, ...]
    virtual_stages: int
    microbatches: int
    sequence_parallel: bool
    sharding: Sharding
    optimizer_s: tuple[float, ...]
    optimizer_bytes: tuple[float, ...]
    """The optimizer step's HBM bytes per pipeline rank, which its duration is costed by."""
    recompute_comm: bool = False
    tp_overlap: TPOverlap | None = None
    placement: Placement = "loop"
    schedule_name: str = ""
    """The schedule as the summary's `layout.schedule` names it ('dualpipev', 'custom: table.csv'); '' where the
    step has one stage and the scenario names no schedule."""
    single_stage_loop: bool = False
    """Whether torch.distributed.pipelining runs the schedule with its own loop (ScheduleGPipe, Schedule1F1B)
    rather than _PipelineScheduleRuntime. Under pipelined FSDP the loop lets FSDP's hooks gather each unit
    before its first forward and waits for its backward sends before the stage reduces its gradients; the
    runtime gathers each chunk whole (UNSHARD) before the rank's first action and reduces (REDUCE_GRAD) right
    after the chunk's last gradient action."""

    def rank_stages(self, pp_rank: int) -> list[int]:
        """The virtual stages pipeline rank ``pp_rank`` holds, chunk 0 first."""
        return rank_stages(pp_rank, self.layout.pp, self.virtual_stages, self.placement)


def plan_fold_blocker(plan: StepPlan) -> str:
    """Why the plan's ranks of one stage would not run the same program ('' when they do)."""
    for stage in plan.stages:
        for block in stage.blocks:
            reason = context_fold_blocker(block.context)
            if reason:
                return reason
    return ""


class ProgramBuilder(OverlapMixin, BlockPasses):
    """Accumulates ops with unique ids; one instance builds one step.

    With ``fold`` on, only one representative rank per pipeline stage gets a program (its TP, CP and DP peers
    run the same program at the same times), or one per class of ``classes`` and stage; collectives still span
    their full groups and carry mirrors, the same collective of every folded replica (of the class), so links
    shared between replicas carry all of their traffic.
    """

    def __init__(self, plan: StepPlan, *, fold: bool = False, classes: RankClasses | None = None,
                 copies: bool = False):
        self.plan = plan
        self.fold = fold
        self.images = fold or copies
        """Whether collectives carry their copies' groups (`CollectiveOp.copies`): folded, or where ``copies``
        asks (the analytic model shares links among them)."""
        self.classes = classes if fold else None
        self._classed: dict[tuple, tuple[tuple[int, ...], ...]] = {}
        self._classed_by_id: dict[tuple[int, int], tuple[tuple, tuple, tuple[tuple[int, ...], ...]]] = {}
        self._mirror_cache: dict[tuple, tuple[tuple[int, ...], ...]] = {}
        self._peers: dict[tuple[int, int], int] = {}
        self.ops: list[Op] = []
        self._grad_ready: dict[tuple[int, int, int], int] = {}
        self._grad_counts: dict[tuple[int, int, int], int] = {}
        self._layer_grads: dict[tuple[int, int, int, int], list[tuple[Block, int]]] = {}
        self._layer_counts: dict[int, dict[int, int]] = {}
        self._units: dict[int, dict[int, tuple[str, str, float]]] = {}
        self._unit_ends: dict[int, list[list[int]]] = {}
        """Per rank, the last compute op before each of the last two gathered units (or blocks) began."""
        self._dp_ops: dict[int, list[int]] = {}
        self._recent_compute: dict[int, list[int]] = {}
        self._handoff_producers: dict[str, int] = {}
        self._send_order = SendOrder()
        self._handoffs: list[tuple[int, str]] = []
        self._param_gathers: dict[tuple[int, int, int], list[int]] = {}
        self._last_grad_rs: dict[tuple[int, int], int] = {}
        """Per rank and model chunk, the gradient reduce-scatter issued last (FSDP2's
        ``comm_ctx.reduce_scatter_state`` in PyTorch 2.10, the one entry ``reduce_scatter_states`` keeps under
        the default ``reduce_scatter_max_input_buffers`` = 1 in 2.13; one per root module: torchtitan shards each
        pipeline chunk apart)."""
        self._gathered: set[tuple[int, int, int]] = set()
        """Per rank, virtual stage and unit, the units gathered once for the step (``reshard_after_forward``
        false)."""
        self._unshards: dict[tuple[int, int], list[tuple[str, float, int | None]]] = {}
        """Per rank and virtual stage, the all-gathers of the runtime's UNSHARD of the chunk (unit name,
        parameters, op), whose copy-outs the chunk's first action runs and waits for."""
        self._backward_sends: dict[tuple[int, int], list[int]] = {}
        """Per rank and virtual stage, its backward sends so far, which Schedule1F1B and ScheduleGPipe wait for
        before the stage reduces its gradients."""
        self._copied: set[tuple[int, int, int]] = set()
        """Per rank, virtual stage and block, the blocks whose gradients FSDP has copied this step (_grad_copy)."""
        self._compute_waits: dict[int, int] = {}
        """Per rank, the reduce-scatter the next op on the compute stream waits for (FSDP2's ``wait_event``)."""
        self._gather_waits: dict[int, int] = {}
        """Per rank, the reduce-scatter the next forward's first all-gather waits for (`_end_backward`)."""
        self._vstage = -1
        """The virtual stage of the action being built, which its ops carry (-1 outside actions)."""
        self._layer_experts: dict[int, dict[int, tuple[float, int]]] = {}
        """Per virtual stage, its layers' routed experts (`_experts_of`)."""

    def _compute(self, rank: int, name: str, duration: float, deps: list[int], category: Category,
                 flops: float = 0.0, stream: str = COMPUTE_STREAM, mb: int = -1, sm_bound_share: float = 1.0,
                 reserved_sms: int = 0, hbm_bytes: float = 0.0) -> int:
        deps = self._with_stream_wait(rank, stream, deps)
        # Fields by position (their order and the defaults written here are pinned by tests/test_ops.py): keywords
        # took a fifth of the build.
        op = ComputeOp(len(self.ops), rank, stream, name, tuple(deps), category, mb, self._vstage,
                       duration, flops, hbm_bytes, sm_bound_share, reserved_sms)
        self.ops.append(op)
        if stream == COMPUTE_STREAM:
            recent = self._recent_compute.setdefault(rank, [])
            recent.append(op.id)
            del recent[:-2]
        return op.id

    def _collective(self, rank: int, stream: str, name: str, op: Primitive, group: tuple[int, ...],
                    nbytes: float, key: str, deps: list[int], category: Category, mb: int = -1,
                    algorithm: AlgorithmChoice = "auto",
                    mirrors: tuple[tuple[int, ...], ...] | None = None,
                    pair_bytes: tuple[tuple[float, ...], ...] = (), sms: int | None = None,
                    protocol: ProtocolChoice = "auto") -> int:
        deps = self._with_stream_wait(rank, stream, deps)
        if mirrors is None:
            mirrors = self._mirrors(group) if self.images else ()
        copies = mirrors
        if not self.fold:
            mirrors = ()
        if self.classes is not None and mirrors:
            mirrors = self._class_mirrors(group, mirrors)
        # Fields by position, as in `_compute`.
        item = CollectiveOp(len(self.ops), rank, stream, name, tuple(deps), category, mb, self._vstage,
                            op, group, nbytes, key, algorithm, protocol, 0, mirrors, pair_bytes, sms, copies)
        self.ops.append(item)
        if stream in (DP_STREAM, ALL_REDUCE_STREAM):
            self._dp_ops.setdefault(rank, []).append(item.id)
        return item.id

    def _hbm_copy(self, rank: int, name: str, nbytes: float, deps: list[int], category: Category,
                  stream: str = COMPUTE_STREAM, mb: int = -1, rate: float | None = None) -> int:
        """An FSDP copy of ``nbytes`` in HBM, memory-bound at ``rate`` (by default the sharding's
        ``grad_copy_rate``); free (no time, no bytes) where none is charged (a synthetic model's FSDP, which has no
        rate)."""
        rate = self.plan.sharding.grad_copy_rate if rate is None else rate
        charged = nbytes if rate > 0 else 0.0
        return self._compute(rank, name, charged / rate if rate > 0 else 0.0, deps, category, stream=stream, mb=mb,
                             sm_bound_share=0.0, hbm_bytes=charged)

    def _with_stream_wait(self, rank: int, stream: str, deps: list[int]) -> list[int]:
        """``deps`` plus the reduce-scatter the compute stream was told to wait for, on its next op."""
        if stream != COMPUTE_STREAM or rank not in self._compute_waits:
            return deps
        return [*deps, self._compute_waits.pop(rank)]

    def representatives(self) -> list[int]:
        """The ranks that get a program: all of them, or with folding one per pipeline stage (per class of
        ``classes`` with those)."""
        return representatives(self.plan.layout, self.fold, self.classes)

    def _class_mirrors(self, group: tuple[int, ...], images: tuple[tuple[int, ...], ...]
                       ) -> tuple[tuple[int, ...], ...]:
        """Of ``images``, the copies of ``group`` that its class stands for (folding.class_images), cached by
        value and found first by the two tuples' identity: the builder passes the same cached objects for most
        collectives, and hashing the images by value (hundreds of ranks) costs ~0.2 s of the 76.1B step's refolded
        builds. An identity entry holds its tuples, so their ids stay unique."""
        assert self.classes is not None
        known = self._classed_by_id.get((id(group), id(images)))
        if known is None:
            found = self._classed.get((group, images))
            if found is None:
                found = self._classed[group, images] = class_images(self.plan.layout, self.classes, group, images)
            known = self._classed_by_id[id(group), id(images)] = (group, images, found)
        return known[2]

    def _mirrors(self, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        mirrors = self._mirror_cache.get(group)
        if mirrors is None:
            mirrors = self._mirror_cache[group] = mirror_images(self.plan.layout, group)
        return mirrors

    def build(self) -> list[Op]:
        """Ops of every simulated rank, in a deterministic order."""
        for rank in self.representatives():
            self._rank_program(rank)
        for handoff, key in self._handoffs:
            producer = self._handoff_producers.get(key)
            if producer is not None:
                self.ops[handoff] = replace(self.ops[handoff], deps=(producer,))
        return self.ops

    def _rank_program(self, rank: int) -> None:
        plan, layout = self.plan, self.plan.layout
        coords = layout.coords(rank)
        pp_rank = coords["pp"]
        actions = plan.schedule[pp_rank]
        last_grad_action = self._last_grad_actions(actions)
        tag = f"{coords['tp']}.{coords['cp']}.{coords['dp']}"
        self._deferred_param_gathers(rank)
        self._deferred_expert_gathers(rank)
        held = plan.rank_stages(pp_rank)
        self._unshard_chunks(rank, [held[chunk] for chunk in dict.fromkeys(action.chunk for action in actions)])
        for index, action in enumerate(actions):
            vstage = held[action.chunk]
            work = plan.stages[vstage]
            self._vstage = vstage
            final = index in last_grad_action
            if action.kind == "F":
                self._forward(rank, action, vstage, work, tag)
            elif action.kind in ("B", "BW"):
                phase = Pass.BACKWARD if action.kind == "BW" else Pass.BACKWARD_INPUT
                self._backward(rank, action, vstage, work, tag, phase, final=final)
            else:
                self._weight_grads(rank, action, vstage, work, final)
        self._vstage = -1
        self._data_parallel(rank)

    def _last_grad_actions(self, actions: list[Action]) -> set[int]:
        """Indices of the actions that finish each chunk's weight gradients (last BW or W per chunk)."""
        last: dict[int, int] = {}
        for index, action in enumerate(actions):
            if action.kind in ("W", "BW"):
                last[action.chunk] = index
        return set(last.values())

    def _peer(self, rank: int, vstage: int) -> int:
        """The rank with ``rank``'s TP, CP and DP coordinates that holds virtual stage ``vstage`` (found once:
        every micro-batch's sends and receives ask again)."""
        peer = self._peers.get((rank, vstage))
        if peer is None:
            layout = self.plan.layout
            coords = layout.coords(rank)
            coords["pp"] = stage_rank(vstage, layout.pp, self.plan.placement)
            peer = self._peers[(rank, vstage)] = layout.rank_of(**coords)
        return peer

    def _p2p_key(self, direction: Pass, mb: int, src_vstage: int, tag: str) -> str:
        return f"pp.{direction}.mb{mb}.vs{src_vstage}.{tag}"

    def _receive(self, rank: int, direction: Pass, mb: int, src_vstage: int, tag: str) -> list[int]:
        """The receive an action waits for: a P2P transfer, or a free hand-off (same GPU, or no P2P cost)
        whose dependency on the producing op is filled in once every rank's program is built.

        Each TP rank sends 1/t of the activation (StageWork.p2p_bytes). Without sequence parallelism the
        receiving stage needs it whole: Megatron's scatter-gather (--scatter-gather-tensors-in-pipeline, SC21)
        all-gathers the slices over the TP group on the compute stream before the first block runs; with
        sequence parallelism the activation stays split and nothing is gathered."""
        src = self._peer(rank, src_vstage)
        nbytes = self.plan.stages[src_vstage].p2p_bytes
        key = self._p2p_key(direction, mb, src_vstage, tag)
        if src == rank or nbytes <= 0:
            handoff = self._compute(rank, f"handoff {direction} mb{mb}", 0.0, [], "pp", stream=PP_STREAM, mb=mb)
            self._handoffs.append((handoff, key))
            return [handoff]
        received = self._collective(rank, PP_STREAM, f"recv {direction} mb{mb}", "send_recv", (src, rank), nbytes,
                                    key, [], "pp", mb)
        layout = self.plan.layout
        if layout.tp == 1 or self.plan.sequence_parallel:
            return [received]
        group = layout.group("tp", rank)
        return [self._collective(rank, COMPUTE_STREAM, f"pp gather {direction} mb{mb}", "all_gather", group,
                                 nbytes * layout.tp, f"pp.gather.{direction}.mb{mb}.vs{src_vstage}.{group[0]}",
                                 [received], "pp", mb)]

    def _send(self, rank: int, direction: Pass, mb: int, vstage: int, dst_vstage: int, last_op: int,
              tag: str) -> int | None:
        """The P2P send of ``last_op``'s output to ``dst_vstage``'s rank; None for a free hand-off. A rank's sends
        to one peer leave in the order they are issued (program/send_order.py: one NCCL stream per pair)."""
        dst = self._peer(rank, dst_vstage)
        nbytes = self.plan.stages[vstage].p2p_bytes
        key = self._p2p_key(direction, mb, vstage, tag)
        if dst == rank or nbytes <= 0:
            self._handoff_producers[key] = last_op
            return None
        deps = list(self._send_order.issue((rank, dst), len(self.ops), [last_op]))
        return self._collective(rank, PP_STREAM, f"send {direction} mb{mb}", "send_recv", (rank, dst), nbytes, key,
                                deps, "pp", mb)

    def _tp_collective(self, rank: int, block: Block, phase: Pass, deps: list[int], mb: int, vstage: int,
                       before: bool) -> list[int]:
        """The TP collective before or after a block's forward, recompute or backward pass, placed by the
        block's ``tp_pattern`` (see Block)."""
        plan, layout = self.plan, self.plan.layout
        if layout.tp == 1 or block.tp_bytes <= 0:
            return deps
        op = tp_op(block.tp_pattern, phase.input_grads, before, plan.sequence_parallel)
        if op is None:
            return deps
        group = layout.group("tp", rank)
        key = f"tp.{phase}.{op}.mb{mb}.vs{vstage}.{block.name}.{group[0]}"
        return [self._collective(rank, COMPUTE_STREAM, f"tp {op} {block.name}", op, group, block.tp_bytes, key,
                                 deps, "tp", mb)]

    def _cp_collective(self, rank: int, block: Block, phase: Pass, deps: list[int], mb: int, vstage: int,
                       gather: bool = False) -> list[int]:
        """Context parallelism: gather the KV of the whole sequence before attention (forward and recompute),
        gather them again before its backward (``gather``) and reduce-scatter their gradients after it:
        Transformer Engine's AttnFuncWithCPAndKVAllGather saves only the rank's own K and V for the backward."""
        layout = self.plan.layout
        if layout.cp == 1 or block.cp_bytes <= 0:
            return deps
        op = gathered_kv_op(phase, gather)
        group = layout.group("cp", rank)
        key = f"cp.{phase}{'.gather' if gather else ''}.mb{mb}.vs{vstage}.{block.name}.{group[0]}"
        return [self._collective(rank, COMPUTE_STREAM, f"cp {op} {block.name}", op, group, block.cp_bytes, key,
                                 deps, "cp", mb)]

    def _forward(self, rank: int, action: Action, vstage: int, work: StageWork, tag: str) -> None:
        mb = action.microbatch
        deps = self._receive(rank, Pass.FORWARD, mb, vstage - 1, tag) if vstage > 0 else []
        if (rank, vstage) in self._unshards:
            deps = [*deps, *[self._copy_out(rank, name, params, gather, "forward", -1)
                             for name, params, gather in self._unshards.pop((rank, vstage))]]
        for block in work.blocks:
            deps = [*deps, *self._zero3_gather(rank, block, vstage, mb, Pass.FORWARD),
                    *self._param_gather(rank, vstage, block)]
            deps = self._cp_collective(rank, block, Pass.FORWARD, deps, mb, vstage)
            deps, _ = self._tp_compute(rank, block, Pass.FORWARD, deps, mb, vstage,
                                       Pass.FORWARD.op_name(mb, block.name), block.forward_s, "forward",
                                       block.forward_flops)
        if vstage + 1 < len(self.plan.stages) and deps:
            self._send(rank, Pass.FORWARD, mb, vstage, vstage + 1, deps[-1], tag)

    def _backward(self, rank: int, action: Action, vstage: int, work: StageWork, tag: str, phase: Pass, *,
                  final: bool) -> None:
        """The backward of a micro-batch on a virtual stage: the full backward (``phase`` BACKWARD) or its input
        gradients alone (BACKWARD_INPUT, a zero-bubble B), between the full backward's TP collectives."""
        mb = action.microbatch
        last_stage = len(self.plan.stages) - 1
        deps = self._receive(rank, Pass.BACKWARD, mb, vstage + 1, tag) if vstage < last_stage else []
        reduce_copies: list[tuple[Block, int, float]] = []
        for block in reversed(work.blocks):
            deps = deps + self._zero3_gather(rank, block, vstage, mb, Pass.BACKWARD)
            if block.recompute_s > 0:
                name = Pass.RECOMPUTE.op_name(mb, block.name)
                if self.plan.recompute_comm:
                    deps = self._cp_collective(rank, block, Pass.RECOMPUTE, deps, mb, vstage)
                    deps, _ = self._tp_compute(rank, block, Pass.RECOMPUTE, deps, mb, vstage, name,
                                               block.recompute_s, "recompute", block.recompute_flops)
                else:
                    deps = [self._pass(rank, block, Pass.RECOMPUTE, name, block.recompute_s,
                                       block.recompute_flops, deps, "recompute", mb, vstage,
                                       block.sm_bound_seconds(Pass.RECOMPUTE),
                                       block.pass_hbm_bytes(Pass.RECOMPUTE))]
            deps = self._cp_collective(rank, block, Pass.BACKWARD, deps, mb, vstage, gather=True)
            weights = phase.weight_grads
            duration = block.backward_input_s + (block.backward_weight_s if weights else 0.0)
            flops = block.backward_flops - (0.0 if weights else block.backward_weight_flops)
            deps, op_id = self._tp_compute(rank, block, Pass.BACKWARD, deps, mb, vstage, phase.op_name(mb, block.name),
                                           duration, "backward", flops, compute_phase=phase)
            if weights:
                copy, reduce_copy = self._grad_copy(rank, vstage, block, [op_id, *deps], final, mb)
                if copy is not None:
                    op_id, deps = copy, [copy]
                self._grads_or_copy(rank, vstage, block, op_id, final, reduce_copy, reduce_copies)
            deps = self._cp_collective(rank, block, Pass.BACKWARD, deps, mb, vstage)
        sent = self._send(rank, Pass.BACKWARD, mb, vstage, vstage - 1, deps[-1], tag) if vstage > 0 and deps else None
        sends = self._backward_sends.setdefault((rank, vstage), [])
        if sent is not None:
            sends.append(sent)
        waits = sends if sends and self.plan.single_stage_loop else []
        last = self._reduce_copies(rank, vstage, reduce_copies, final, mb, waits)
        if final and phase.weight_grads and deps:
            self._chunk_grad_sync(rank, vstage, [*(waits or deps[-1:]), *last])
        self._end_backward(rank, vstage)

    def _end_backward(self, rank: int, vstage: int) -> None:
        """FSDP2's root post-backward callback after each micro-batch's backward without pipelining: torchtitan's
        gradient accumulation leaves ``is_last_backward`` true, so the callback makes the compute stream wait for
        the last reduce-scatter (torch/distributed/fsdp/_fully_shard/_fsdp_state.py,
        ``_root_post_backward_final_callback``: ``current_stream().wait_event(reduce_scatter_state.event)``),
        the embedding's; the next forward's ``_root_pre_forward`` makes the all-gather streams wait for the compute
        stream (``all_gather_stream.wait_stream(current_stream)``), so its first gather waits for that
        reduce-scatter too. Under pipelining the stage runs its backwards with ``set_is_last_backward(False)``
        and reduces its gradients once (``stage_reduces_grads``): no such wait."""
        if self.plan.layout.pp > 1 or (rank, vstage) not in self._last_grad_rs:
            return
        self._compute_waits[rank] = self._gather_waits[rank] = self._last_grad_rs[rank, vstage]

    def _weight_grads(self, rank: int, action: Action, vstage: int, work: StageWork, final: bool) -> None:
        """A zero-bubble W: the stage's weight gradients of one micro-batch, block by block in backward order;
        a MoE block's routed experts and the rest of it run as separate parts (each with its own SM-bound
        share), as in its backward, without the all-to-alls (the pass sends nothing)."""
        mb = action.microbatch
        phase = Pass.BACKWARD_WEIGHT
        op_id = -1
        reduce_copies: list[tuple[Block, int, float]] = []
        for block in reversed(work.blocks):
            op_id = self._pass(rank, block, phase, phase.op_name(mb, block.name), block.backward_weight_s,
                               block.backward_weight_flops, [], "weight_grad", mb, vstage,
                               block.sm_bound_seconds(phase), block.pass_hbm_bytes(phase))
            copy, reduce_copy = self._grad_copy(rank, vstage, block, [op_id], final, mb, "weight_grad")
            op_id = op_id if copy is None else copy
            self._grads_or_copy(rank, vstage, block, op_id, final, reduce_copy, reduce_copies)
        last = self._reduce_copies(rank, vstage, reduce_copies, final, mb, [])
        if final and op_id >= 0:
            self._chunk_grad_sync(rank, vstage, [op_id, *last])

    def _grad_copy(self, rank: int, vstage: int, block: Block, after: list[int], final: bool, mb: int,
                   category: Category = "backward") -> tuple[int | None, float]:
        """PyTorch FSDP's copies of a block's fresh weight gradients in its backward (Sharding.grad_copy_bytes)
        as a memory-bound op on the compute stream once the ops ``after`` (the one that wrote them, and the
        input gradient's TP collective) are done; returns (that op, or None when there is nothing to copy in
        the backward; the bytes of the reduce's copy that a pipelined stage runs after the action). FSDP2
        runs them once per unit, in its post-backward when the unit's input gradient is done: the same bytes
        on the same stream, here block by block; a MoE block's routed experts' with it where FSDP2 shards them
        (Sharding.shards_experts)."""
        sharding = self.plan.sharding
        if sharding.grad_copy_rate <= 0 or block.params <= 0:
            return None, 0.0
        key = (rank, vstage, id(block))
        first = key not in self._copied
        self._copied.add(key)
        now, at_reduce = sharding.grad_copy_bytes(first, final, self.plan.layout.pp > 1)
        params = block.params + (block.experts.params if block.experts and sharding.shards_experts else 0.0)
        later = params * at_reduce
        if now <= 0:
            return None, later
        return self._hbm_copy(rank, f"fsdp grad copy mb{mb} {block.name}", params * now, after, category, mb=mb), later

    def _grads_or_copy(self, rank: int, vstage: int, block: Block, op_id: int, final: bool, nbytes: float,
                       pending: list[tuple[Block, int, float]]) -> None:
        """Record a block's gradients as done after ``op_id`` (_grads_done), or when the pipelined stage's
        reduce copies them first (``nbytes`` > 0), keep them in ``pending`` for _reduce_copies."""
        if nbytes > 0:
            pending.append((block, op_id, nbytes))
        else:
            self._grads_done(rank, vstage, block, op_id, final)

    def _reduce_copies(self, rank: int, vstage: int, pending: list[tuple[Block, int, float]], final: bool,
                       mb: int, waits: list[int]) -> list[int]:
        """The pipelined stage's copies of the accumulated gradients into the reduce-scatter input (its
        REDUCE_GRAD, after the action and its send; under Schedule1F1B and ScheduleGPipe once the backward
        sends ``waits`` are done), ``pending`` as (block, op its gradients were written by, bytes copied), each
        block's gradients done after its copy (_grads_done); returns the copy ops."""
        ops = []
        for block, op_id, nbytes in pending:
            copy = self._hbm_copy(rank, f"fsdp reduce copy {block.name}", nbytes, [op_id, *waits], "backward", mb=mb)
            self._grads_done(rank, vstage, block, copy, final)
            ops.append(copy)
        return ops

    def _grads_done(self, rank: int, vstage: int, block: Block, op_id: int, final: bool) -> None:
        """Record the op that finished a block's gradients; ZeRO-3, and ZeRO-2 with ``reduce_every_microbatch``,
        reduce-scatter them every micro-batch, one reduce-scatter per layer once all its blocks' gradients are
        done (PyTorch FSDP wraps each transformer layer as one unit: its post-backward hook reduce-scatters the
        unit's gradients together). FSDP2's post_backward first makes the compute stream wait for the
        reduce-scatter it issued before (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py,
        ``current_stream().wait_event(comm_ctx.reduce_scatter_state.event)``; in 2.13 the oldest of
        ``reduce_scatter_states`` once ``reduce_scatter_max_input_buffers``, 1 by default, are in flight), so
        under FSDP the compute after a unit's backward waits for the chunk's previous reduce-scatter (of the unit
        before, or the last of the chunk's previous backward): at most one reduce-scatter per chunk runs behind
        compute. DeepSpeed ZeRO
        (``zero`` without ``fsdp``) has no such wait. Under HSDP the reduce-scattered shard of the ``final``
        backward is then all-reduced across the replicas on its own stream (FSDP2's ``all_reduce_stream``).
        Gradients accumulated unsharded (``defers_unit_grads``) are reduced here only in the last backward
        without pipelining (FSDP2 with ``set_requires_gradient_sync(True)`` again: its post-backward hooks
        reduce-scatter each unit as its backward ends); under pipelining the stage reduces them once, after
        the chunk's last gradient action (_chunk_grad_sync)."""
        sharding = self.plan.sharding
        deferred = sharding.stage_reduces_grads or (sharding.defers_unit_grads and not final)
        if deferred and block.params > 0 and self._reduces_units():
            return
        if sharding.sharded_grad_steps and block.params > 0 and self._reduces_units():
            layer = (rank, vstage, block.layer, self._grad_count(rank, vstage, block))
            waiting = self._layer_grads.setdefault(layer, [])
            waiting.append((block, op_id))
            if len(waiting) < self._layer_blocks(vstage, block.layer):
                return
            del self._layer_grads[layer]
            params = sum(item.params for item, _ in waiting)
            name = block.name if len(waiting) == 1 else f"L{block.layer}"
            group = self._shard_group(rank)
            done = [done for _, done in waiting]
            rs = self._reduce_scatter(rank, name, group, params, f"grads.rs.{name}.vs{vstage}.op{layer[3]}.{group[0]}",
                                      done)
            if final and self._replica_group(rank):
                replicas = self._replica_group(rank)
                self._collective(rank, ALL_REDUCE_STREAM, f"all_reduce shard {name}", "all_reduce", replicas,
                                 sharding.replica_reduce_bytes(params, group), f"hsdp.ar.{name}.vs{vstage}."
                                 f"{replicas[0]}", [rs], "dp")
            rs = next(iter(self._expert_reduce(rank, vstage, block.layer, ("grads.rs", f".vs{vstage}.op{layer[3]}"),
                                               done, final)), rs)
            if sharding.fsdp:
                if (rank, vstage) in self._last_grad_rs:
                    self._compute_waits[rank] = self._last_grad_rs[rank, vstage]
                self._last_grad_rs[rank, vstage] = rs
            if final:
                for item, _ in waiting:
                    self._grad_ready[(rank, vstage, id(item))] = rs
            return
        if final:
            self._grad_ready[(rank, vstage, id(block))] = op_id

    def _chunk_grad_sync(self, rank: int, vstage: int, after: list[int]) -> None:
        """The chunk's REDUCE_GRAD under pipelined FSDP (``stage_reduces_grads``), as torch.distributed.pipelining
        runs it since PyTorch 2.10 (PR #166449; torch/distributed/pipelining/stage.py ``perform_reduce_grad``):
        ``post_backward()`` on every FSDP unit of the chunk in forward order (``_state_ctx.all_states``), each
        reduce-scattering its accumulated gradients on the ``dp`` stream (under HSDP then all-reducing its
        shard across the replicas on their own stream) once the ops ``after`` have finished, then
        ``_root_post_backward_final_callback``, which makes the compute stream wait for the last of them: the
        rank's next compute op starts when it ends. ``after`` is the last op of the chunk's last gradient
        action (the runtime's REDUCE_GRAD follows it; its backward send is already issued and does not wait),
        or under Schedule1F1B and ScheduleGPipe (``single_stage_loop``) every backward send of the chunk: both
        wait for all of them before ``perform_reduce_grad`` (ScheduleGPipe its ``bwd_sends_to_wait``,
        Schedule1F1B each cooldown send before the next); as a rank's sends to one peer end in issue order
        (`_send`, program/send_order.py), the last of them ends last."""
        sharding = self.plan.sharding
        if not sharding.stage_reduces_grads or not self._reduces_units():
            return
        group, replicas = self._shard_group(rank), self._replica_group(rank)
        blocks = self.plan.stages[vstage].blocks
        last = after[-1]
        for layer, (first, final_block, params) in self._units_of(vstage).items():
            name = first if first == final_block else f"L{layer}"
            reduced = last = self._reduce_scatter(rank, name, group, params,
                                                  f"grads.rs.{name}.vs{vstage}.{group[0]}", after)
            if replicas:
                last = self._collective(rank, ALL_REDUCE_STREAM, f"all_reduce shard {name}", "all_reduce",
                                        replicas, sharding.replica_reduce_bytes(params, group),
                                        f"hsdp.ar.{name}.vs{vstage}.{replicas[0]}", [last], "dp")
            experts = self._expert_reduce(rank, vstage, layer, ("grads.rs", f".vs{vstage}"), after, True)
            if experts:
                reduced, last = experts[0], experts[-1]
            for block in blocks:
                if block.layer == layer and block.params > 0:
                    self._grad_ready[(rank, vstage, id(block))] = reduced
        self._compute_waits[rank] = last

    def _reduce_scatter(self, rank: int, name: str, group: tuple[int, ...], params: float, key: str,
                        deps: list[int], mirrors: tuple[tuple[int, ...], ...] | None = None) -> int:
        """A unit's gradient reduce-scatter over its shard ``group`` on the ``dp`` stream (FSDP2's reduce-scatter
        stream) once ``deps`` are done; over a one-rank group FSDP2 runs no collective but copies the
        reduce-scatter input into its output on that stream (Sharding.one_rank_reduce_bytes), an HBM copy
        counted in the backward."""
        sharding = self.plan.sharding
        if len(group) > 1:
            return self._collective(rank, DP_STREAM, f"reduce_scatter grads {name}", "reduce_scatter", group,
                                    params * sharding.grad_bytes, key, deps, "dp", mirrors=mirrors)
        copy = self._hbm_copy(rank, f"fsdp reduce copy-out {name}", params * sharding.one_rank_reduce_bytes(), deps,
                              "backward", stream=DP_STREAM)
        self._dp_ops.setdefault(rank, []).append(copy)
        return copy

    def _layer_blocks(self, vstage: int, layer: int) -> int:
        """How many blocks with parameters layer ``layer`` has on virtual stage ``vstage``."""
        counts = self._layer_counts.get(vstage)
        if counts is None:
            counts = self._layer_counts[vstage] = {}
            for item in self.plan.stages[vstage].blocks:
                if item.params > 0:
                    counts[item.layer] = counts.get(item.layer, 0) + 1
        return counts[layer]

    def _grad_count(self, rank: int, vstage: int, block: Block) -> int:
        key = (rank, vstage, id(block))
        count = self._grad_counts.get(key, 0)
        self._grad_counts[key] = count + 1
        return count

    def _dp_size(self) -> int:
        return self.plan.layout.dp * self.plan.layout.cp

    def _reduces_units(self) -> bool:
        """Whether sharded steps run their per-unit gathers and gradient reductions: over more than one DP x CP
        rank, or over one where FSDP2 keeps fp32 shards (fully_shard on a one-rank mesh takes its
        ``world_size == 1`` path: an unshard copy per gather, a reduce copy per unit; Sharding.fp32_shards)."""
        return self._dp_size() > 1 or self.plan.sharding.fp32_shards

    def _dp_group(self, rank: int) -> tuple[int, ...]:
        return self.plan.layout.combined_group(("dp", "cp"), rank)

    def _shard_group(self, rank: int) -> tuple[int, ...]:
        return shard_group(self.plan.layout, rank, self.plan.sharding.degree)

    def _replica_group(self, rank: int) -> tuple[int, ...]:
        return replica_group(self.plan.layout, rank, self.plan.sharding.degree)

    def _zero3_gather(self, rank: int, block: Block, vstage: int, mb: int, phase: Pass) -> list[int]:
        """ZeRO-3 gathers parameters before use, on the prefetch stream: DeepSpeed one block at a time, PyTorch
        FSDP (``gather_per_layer``) one wrapped unit at a time, a layer's blocks together, when the pass reaches
        its first block; the head unit (final norm and output layer) stays gathered from its forward to its
        backward (torchtitan: reshard_after_forward=False), so its backward gathers nothing.

        Prefetch: a block's gather may start once the compute two blocks back has finished. FSDP2's forward
        prefetch is implicit and one unit deeper: unit k's all-gather is queued behind the copy-out of unit k-2
        (FSDPParamGroup.wait_for_unshard keeps the all-gather result until the next copy-out), which the compute
        stream runs once unit k-3 has finished; its backward prefetch (_backward_prefetch) gathers unit k-1 when
        unit k's copy-out is done, after unit k+1's backward. The memory model counts these working sets.
        Without ``reshard_after_forward`` (FSDP under pipelining) each unit is gathered once per step and stays
        gathered through the backwards: here, before its first forward (same prefetch rule), under the
        schedules that run their own loop (``single_stage_loop``: gpipe, 1f1b); _PipelineScheduleRuntime (every
        other schedule) gathers every chunk whole at the step's start instead (_unshard_chunks), so that none
        is left to gather here."""
        sharding = self.plan.sharding
        if sharding.stage != 3 or block.params <= 0 or not self._reduces_units():
            return []
        name, params = block.name, block.params
        if sharding.gather_per_layer:
            first, last, params = self._unit(vstage, block.layer)
            if block.name != (last if phase.input_grads else first):
                return []
            name = block.name if first == last else f"L{block.layer}"
        ends = self._unit_ends.setdefault(rank, [[], []])
        window = ends[0] if sharding.gather_per_layer and not phase.input_grads else ends[1]
        if not phase.input_grads and rank in self._gather_waits:
            window = [*window, self._gather_waits.pop(rank)]
        ends[:] = [ends[1], self._recent_compute.get(rank, [])[-1:]]
        if sharding.gather_per_layer and phase.input_grads and block.tp_pattern is TpPattern.HEAD:
            return []
        if not sharding.reshard_after_forward:
            unit = (rank, vstage, block.layer)
            if phase.input_grads or unit in self._gathered:
                return []
            self._gathered.add(unit)
        group = self._shard_group(rank)
        key = f"zero3.ag.{phase}.mb{mb}.vs{vstage}"
        category: Category = "backward" if phase.input_grads else "forward"
        gathers = [self._unit_gather(rank, name, group, params, f"{key}.{name}.{group[0]}", window, category, mb)]
        experts = self._expert_gather(rank, vstage, block.layer, key, window, category, mb)
        if experts is not None:
            gathers.append(self._copy_out(rank, *experts, category, mb))
        return gathers

    def _unit_gather(self, rank: int, name: str, group: tuple[int, ...], params: float, key: str, deps: list[int],
                     category: Category, mb: int) -> int:
        """One FSDP unit's all-gather (`_gather_copied_in`) and its copy-out (`_copy_out`) in the pass's
        ``category``; over a one-rank shard group only the copy-out's place takes FSDP2's copy from the shard
        (`_copy_out`); returns the op the unit's compute waits for."""
        gather = None if len(group) == 1 else self._gather_copied_in(rank, name, group, params, key, deps, category,
                                                                     mb)
        return self._copy_out(rank, name, params, gather, category, mb)

    def _gather_copied_in(self, rank: int, name: str, group: tuple[int, ...], params: float, key: str,
                          deps: list[int], category: Category, mb: int, copy_in_stream: str = COPY_IN_STREAM,
                          sharding: Sharding | None = None, mirrors: tuple[tuple[int, ...], ...] | None = None) -> int:
        """One FSDP unit's all-gather on the prefetch stream once ``deps`` are done, after FSDP2's copy-in of the
        rank's shard (Sharding.gather_copy_bytes) on ``copy_in_stream``, which the gather waits for
        (``all_gather_stream.wait_stream(all_gather_copy_in_stream)``; an ``unshard(async_op=True)`` copies in on
        the current stream, get_all_gather_streams). The copy-in is an HBM copy, counted in the pass's
        ``category`` as the copy-out and the gradient copies are, not as communication. ``sharding``: the
        unit's (the plan's, or the routed experts' over their own shard group), ``mirrors`` its group's
        folded copies (by default the builder's)."""
        sharding = sharding or self.plan.sharding
        copy_in, _ = sharding.gather_copy_bytes()
        if copy_in > 0:
            deps = [self._hbm_copy(rank, f"fsdp copy-in {name}", params * copy_in, deps, category, copy_in_stream, mb,
                                   sharding.grad_copy_rate)]
        return self._collective(rank, ZERO_STREAM, f"all_gather params {name}", "all_gather", group,
                                params * sharding.param_bytes, key, deps, "dp", mb, mirrors=mirrors)

    def _expert_gather(self, rank: int, vstage: int, layer: int, key: str, deps: list[int], category: Category,
                       mb: int, copy_in_stream: str = COPY_IN_STREAM) -> tuple[str, float, int | None] | None:
        """PyTorch FSDP2's all-gather of layer ``layer``'s routed experts on virtual stage ``vstage``, issued right
        after its layer's unit's on the same streams (Sharding.shards_experts: torchtitan shards them with their
        layer, over the ``efsdp`` mesh, and prefetches them with it), over their own shard group
        (`expert_shard_groups`), 1/degree of them copied in; (the unit's name, its parameters, the gather, or
        None over a one-rank group: its unshard copy takes the copy-out's place), which the caller copies out
        (`_copy_out`). None where the layer has no routed experts or they are not sharded so."""
        found = self._experts_of(vstage).get(layer)
        if found is None or not self.plan.sharding.shards_experts:
            return None
        params, ep = found
        name = f"L{layer}.experts"
        degree = self.plan.sharding.degree
        group, _ = expert_shard_groups(self.plan.layout, rank, ep, degree)
        if len(group) == 1:
            return name, params, None
        mirrors = expert_shard_images(self.plan.layout, rank, ep, degree) if self.images else ()
        sharding = expert_sharding(self.plan.sharding, ep, self.plan.layout.tp)
        return name, params, self._gather_copied_in(rank, name, group, params, f"{key}.{name}.{group[0]}", deps,
                                                    category, mb, copy_in_stream, sharding, mirrors)

    def _expert_reduce(self, rank: int, vstage: int, layer: int, key: tuple[str, str], deps: list[int],
                       final: bool) -> list[int]:
        """PyTorch FSDP2's reduce-scatter of layer ``layer``'s routed experts' gradients over their shard group
        (`expert_shard_groups`; ``key``: what its key has before and after the unit's name), issued on the
        reduce-scatter stream right after its layer's unit's, once
        ``deps`` are done (their post-backward with their layer's: Sharding.shards_experts), under HSDP in the
        ``final`` reduction then all-reduced across their replicas on the all-reduce stream, as a unit's shard
        is; returns the reduce-scatter and the all-reduce after it, none where the layer has no routed experts
        or they are not sharded so."""
        found = self._experts_of(vstage).get(layer)
        if found is None or not self.plan.sharding.shards_experts:
            return []
        params, ep = found
        name = f"L{layer}.experts"
        degree = self.plan.sharding.degree
        group, replicas = expert_shard_groups(self.plan.layout, rank, ep, degree)
        mirrors = expert_shard_images(self.plan.layout, rank, ep, degree) if self.images else ()
        reduced = self._reduce_scatter(rank, name, group, params, f"{key[0]}.{name}{key[1]}.{group[0]}", deps,
                                       mirrors)
        if not (final and replicas):
            return [reduced]
        return [reduced, self._collective(rank, ALL_REDUCE_STREAM, f"all_reduce shard {name}", "all_reduce",
                                          replicas, self.plan.sharding.replica_reduce_bytes(params, group),
                                          f"hsdp.ar.{name}.vs{vstage}.{replicas[0]}", [reduced], "dp")]

    def _experts_of(self, vstage: int) -> dict[int, tuple[float, int]]:
        """Per layer of virtual stage ``vstage``, its routed experts' parameters on one rank and their EP degree
        (work.layer_experts), found once."""
        found = self._layer_experts.get(vstage)
        if found is None:
            found = self._layer_experts[vstage] = layer_experts(self.plan.stages[vstage].blocks)
        return found

    def _copy_out(self, rank: int, name: str, params: float, gather: int | None, category: Category,
                  mb: int) -> int:
        """FSDP2's copy-out of a unit's all-gather output into its unsharded parameters, on the compute stream once
        ``gather`` is done (wait_for_unshard; Sharding.gather_copy_bytes), in ``category``; ``gather`` itself
        where none is charged. Without a gather (``gather`` None: a one-rank shard group) wait_for_unshard
        copies the cast shard into the unsharded parameters instead, on the compute stream in its turn
        (Sharding.unshard_copy_bytes)."""
        sharding = self.plan.sharding
        if gather is None:
            return self._hbm_copy(rank, f"fsdp unshard copy {name}", params * sharding.unshard_copy_bytes(), [],
                                  category, mb=mb)
        _, copy_out = sharding.gather_copy_bytes()
        if copy_out <= 0:
            return gather
        return self._hbm_copy(rank, f"fsdp copy-out {name}", params * copy_out, [gather], category, mb=mb)

    def _unshard_chunks(self, rank: int, vstages: list[int]) -> None:
        """Pipelined FSDP on _PipelineScheduleRuntime: the UNSHARD actions ``_add_unshard_reshard`` puts before
        the rank's first action (with at most 3 chunks per rank, ``max_active_stages``, every chunk is among the
        next 3 stages to compute): every unit of each chunk in ``vstages`` (their order of first appearance)
        all-gathered on the prefetch stream at once (``unshard(async_op=True)``, whose copy-ins
        get_all_gather_streams puts on the current stream: the compute stream), in forward order; the chunk's
        first action copies them out and waits for all of them (``_assert_unsharded``: the handle's wait is
        wait_for_unshard) and no unit is gathered again."""
        sharding = self.plan.sharding
        if sharding.reshard_after_forward or self.plan.single_stage_loop or not self._reduces_units():
            return
        group = self._shard_group(rank)
        for vstage in vstages:
            self._vstage = vstage
            for layer, (first, last, params) in self._units_of(vstage).items():
                name = first if first == last else f"L{layer}"
                gather = None if len(group) == 1 else self._gather_copied_in(
                    rank, name, group, params, f"zero3.unshard.vs{vstage}.{name}.{group[0]}", [], "forward", -1,
                    copy_in_stream=COMPUTE_STREAM)
                self._unshards.setdefault((rank, vstage), []).append((name, params, gather))
                experts = self._expert_gather(rank, vstage, layer, f"zero3.unshard.vs{vstage}", [], "forward", -1,
                                              copy_in_stream=COMPUTE_STREAM)
                if experts is not None:
                    self._unshards[(rank, vstage)].append(experts)
                self._gathered.add((rank, vstage, layer))
        self._vstage = -1

    def _unit(self, vstage: int, layer: int) -> tuple[str, str, float]:
        """Layer ``layer``'s first and last block with parameters on virtual stage ``vstage`` and its parameters."""
        return self._units_of(vstage)[layer]

    def _units_of(self, vstage: int) -> dict[int, tuple[str, str, float]]:
        """The FSDP units of virtual stage ``vstage`` in forward order (work.layer_units), found once."""
        units = self._units.get(vstage)
        if units is None:
            units = self._units[vstage] = layer_units(self.plan.stages[vstage].blocks)
        return units

    def _data_parallel(self, rank: int) -> None:
        """Gradient buckets (DDP all-reduce or ZeRO-1/2 reduce-scatter), the optimizer, ZeRO-1/2 param gather."""
        plan, sharding = self.plan, self.plan.sharding
        layout = plan.layout
        pp_rank = layout.coords(rank)["pp"]
        vstages = plan.rank_stages(pp_rank)
        ready = [(vs, block) for vs in reversed(vstages) for block in reversed(plan.stages[vs].blocks)
                 if (rank, vs, id(block)) in self._grad_ready]
        grad_ops = [self._grad_ready[(rank, vs, id(block))] for vs, block in ready]
        bucket_ops: list[int] = []
        if self._dp_size() > 1 and not sharding.sharded_grad_steps:
            op = sharding.grad_reduction
            group = self._dp_group(rank)
            for index, (deps, nbytes) in enumerate(self._buckets(rank, ready)):
                deps = deps if sharding.overlap else grad_ops
                key = f"dp.bucket{index}.pp{pp_rank}.{group[0]}"
                bucket_ops.append(self._collective(rank, DP_STREAM, f"{op} bucket {index}", op, group, nbytes, key,
                                                   deps, "dp"))
        bucket_ops += self._expert_gradients(rank, ready, DP_STREAM)
        optimizer_deps = bucket_ops or grad_ops
        if sharding.sharded_grad_steps and self._reduces_units():
            optimizer_deps = self._dp_ops.get(rank, [])
        step = self._compute(rank, "optimizer step", plan.optimizer_s[pp_rank], optimizer_deps, "optimizer",
                             sm_bound_share=0.0,
                             hbm_bytes=plan.optimizer_bytes[pp_rank])
        if sharding.stage == 0 or sharding.overlap_param_gather:
            return
        if self._dp_size() > 1 and sharding.stage in (1, 2):
            group = self._dp_group(rank)
            params = sum(plan.stages[vs].params for vs in vstages)
            self._collective(rank, DP_STREAM, "all_gather params", "all_gather", group, params * sharding.param_bytes,
                             f"zero.ag.pp{pp_rank}.{group[0]}", [step], "dp")
        experts = [block.experts for vs in vstages for block in plan.stages[vs].blocks if block.experts]
        self._expert_param_gather(rank, experts, f"edp.ag.pp{pp_rank}", [step])

    def _buckets(self, rank: int, ready: list[tuple[int, Block]]) -> list[tuple[list[int], float]]:
        """The rank's gradient buckets (`gradient_buckets`), each with the ops that finish its blocks'
        gradients."""
        sharding = self.plan.sharding
        return gradient_buckets(((self._grad_ready[(rank, vs, id(block))], block) for vs, block in ready),
                                sharding.grad_bytes, sharding.bucket_bytes)
