"""The compute of one block pass as ops, where a pass is more than one kernel run: the attention core under
context parallelism (its rank's share of the causal work, beside the K/V ring) and a MoE block (router, the
dispatch all-to-all, the routed experts, the combine all-to-all), plus the experts' gradient reduction.

A mixin of ProgramBuilder: it uses the builder core (builder_core.py): ``plan``, ``fold``, ``_compute``,
``_collective`` and ``_grad_ready``.
"""

from __future__ import annotations

from simulator.parallel.builder_core import BuilderCore
from simulator.parallel.context import CP_STREAM, ContextAttention, ring_step_pairs
from simulator.parallel.experts import (
    AllToAll,
    ExpertWork,
    ep_group,
    expert_gradient_reduction,
    expert_param_gather,
    group_images,
)
from simulator.parallel.passes import Pass
from simulator.parallel.work import Block, bound_share
from simulator.program.ops import COMPUTE_STREAM, Category

EXPERT_DP_STREAM = "expert_dp"
"""ZeRO's all-gathers of the routed experts' parameters over the expert-data-parallel group."""


class BlockPasses(BuilderCore):
    """Ops of a block pass ``phase`` (forward, recompute, backward, or its input or weight gradients alone)."""

    def _pass(self, rank: int, block: Block, phase: Pass, name: str, duration: float, flops: float, deps: list[int],
              category: Category, mb: int, vstage: int, sm_bound_s: float, hbm_bytes: float) -> int:
        """``duration`` seconds of the pass, ``sm_bound_s`` of them in kernels SMs limit, moving ``hbm_bytes``."""
        whole = (duration, flops, sm_bound_s, hbm_bytes)
        if block.context is not None:
            return self._context_pass(rank, block, block.context, phase, name, whole, deps, category, mb, vstage)
        if block.experts is not None:
            return self._expert_pass(rank, block, block.experts, phase, name, whole, deps, category, mb, vstage)
        return self._part(rank, name, *whole, deps, category, mb)

    def _part(self, rank: int, name: str, seconds: float, flops: float, sm_bound_s: float, hbm_bytes: float,
              deps: list[int], category: Category, mb: int) -> int:
        """A compute op of one part of a pass, slowing under SM contention by that part's own SM-bound share and
        carrying its own kernels' HBM bytes (a whole less its other parts, so never below 0 by rounding)."""
        return self._compute(rank, name, seconds, deps, category, max(flops, 0.0), mb=mb,
                             sm_bound_share=bound_share(sm_bound_s, seconds), hbm_bytes=max(hbm_bytes, 0.0))

    def _context_pass(self, rank: int, block: Block, context: ContextAttention, phase: Pass, name: str,
                      whole: tuple[float, float, float, float], deps: list[int], category: Category, mb: int,
                      vstage: int) -> int:
        """Under context parallelism the attention core takes this CP rank's share of the causal work, and with
        ring attention runs beside the K/V ring, cp - 1 steps one after another, each a grouped send/receive
        between CP neighbours: the core of the first cp - 1 blocks overlaps the ring, the last block waits for
        its last step (parallel/context.py). ``whole``: the pass's (seconds, FLOPs, SM-bound
        seconds, HBM bytes)."""
        duration, flops, sm_bound_s, hbm_bytes = whole
        core_s, core_flops, core_sm_s = context.core(phase)
        core_bytes = context.core_bytes(phase)
        if core_s <= 0:
            return self._part(rank, name, *whole, deps, category, mb)
        layout = self.plan.layout
        cp_rank = layout.coords(rank)["cp"]
        share = context.share(cp_rank)
        if not context.ring:
            return self._part(rank, name, duration + core_s * (share - 1), flops + core_flops * (share - 1),
                              sm_bound_s + core_sm_s * (share - 1), hbm_bytes + core_bytes * (share - 1), deps,
                              category, mb)
        rest = self._part(rank, name, duration - core_s, flops - core_flops, sm_bound_s - core_sm_s,
                          hbm_bytes - core_bytes, deps, category, mb)
        group = layout.group("cp", rank)
        block_bytes = context.ring_block_bytes(phase)
        pairs = ring_step_pairs(len(group), block_bytes)
        ring = rest
        for step in range(1, context.cp):
            key = f"cp.ring.{phase}.mb{mb}.vs{vstage}.{block.name}.step{step}.{group[0]}"
            ring = self._collective(rank, CP_STREAM, f"cp ring step {step} {block.name}", "all_to_all", group,
                                    block_bytes, key, [ring], "cp", mb, algorithm="direct", pair_bytes=pairs)
        last = context.last_step_share(cp_rank)
        head = self._part(rank, f"{name} attention", core_s * share * (1 - last), core_flops * share * (1 - last),
                          core_sm_s * share * (1 - last), core_bytes * share * (1 - last), [rest], category, mb)
        return self._part(rank, f"{name} attention last block", core_s * share * last, core_flops * share * last,
                          core_sm_s * share * last, core_bytes * share * last, [head, ring], category, mb)

    def _expert_pass(self, rank: int, block: Block, experts: ExpertWork, phase: Pass, name: str,
                     whole: tuple[float, float, float, float], deps: list[int], category: Category, mb: int,
                     vstage: int) -> int:
        """Forward (and recompute): router and shared experts, dispatch, routed experts, combine. Backward: the
        combine's gradient all-to-all, the experts' backward, the dispatch's, then the rest of the block; a
        weight-gradient pass (W) runs the experts' weight gradients, then the rest's, with no all-to-all.
        ``whole``: the pass's (seconds, FLOPs, SM-bound seconds, HBM bytes)."""
        duration, flops, sm_bound_s, hbm_bytes = whole
        expert_s, expert_flops, expert_sm_s = experts.part(phase)
        expert_bytes = experts.part_bytes(phase)
        if expert_s <= 0:
            return self._part(rank, name, *whole, deps, category, mb)
        backward = phase.input_grads or phase.weight_grads
        rest = (duration - expert_s, flops - expert_flops, sm_bound_s - expert_sm_s, hbm_bytes - expert_bytes)
        if not backward:
            deps = [self._part(rank, name, *rest, deps, category, mb)]
        deps = self._all_to_all(rank, block, experts, "combine" if backward else "dispatch", phase, deps, mb, vstage)
        deps = [self._part(rank, f"{name} experts", expert_s, expert_flops * experts.mean_load_share, expert_sm_s,
                           expert_bytes, deps, category, mb)]
        deps = self._all_to_all(rank, block, experts, "dispatch" if backward else "combine", phase, deps, mb, vstage)
        if backward:
            return self._part(rank, name, *rest, deps, category, mb)
        return deps[0]

    def _all_to_all(self, rank: int, block: Block, experts: ExpertWork, which: AllToAll, phase: Pass, deps: list[int],
                    mb: int, vstage: int) -> list[int]:
        if not experts.exchanges(phase):
            return deps
        ep = experts.ep
        group = ep_group(self.plan.layout, rank, ep)
        key = f"ep.{which}.{phase}.mb{mb}.vs{vstage}.{block.name}.{group[0]}"
        mirrors = group_images(self.plan.layout, rank, ep, expert_dp=False) if self.images else ()
        pairs = experts.pairs(which, backward=phase.input_grads)
        return [self._collective(rank, COMPUTE_STREAM, f"ep {which} {block.name}", "all_to_all", group,
                                 experts.dispatch_bytes, key, deps, "ep", mb, mirrors=mirrors,
                                 pair_bytes=pairs)]

    def _expert_gradients(self, rank: int, ready: list[tuple[int, Block]], stream: str) -> list[int]:
        """The routed experts' gradients, reduced over the expert-data-parallel group after the last
        micro-batch (`expert_gradient_reduction`), one collective per pipeline stage."""
        blocks = [(vs, block, block.experts) for vs, block in ready if block.experts is not None]
        reduction = expert_gradient_reduction(self.plan.layout, rank, [experts for _, _, experts in blocks],
                                              self.plan.sharding)
        if reduction is None:
            return []
        deps = [self._grad_ready[(rank, vs, id(block))] for vs, block, _ in blocks]
        mirrors = group_images(self.plan.layout, rank, blocks[0][2].ep, expert_dp=True) if self.images else ()
        pp_rank = self.plan.layout.coords(rank)["pp"]
        return [self._collective(rank, stream, f"{reduction.op} expert grads", reduction.op, reduction.group,
                                 reduction.nbytes, f"edp.grads.pp{pp_rank}.{reduction.group[0]}", deps, "dp",
                                 mirrors=mirrors)]

    def _deferred_expert_gathers(self, rank: int) -> None:
        """``overlap_param_gather``: each MoE block's routed experts, updated shard by shard by the previous
        step's optimizer, are all-gathered over the expert-data-parallel group at the start of this step in
        forward order, one gather per block beside the dense buckets', and the block's first forward waits for it
        too."""
        plan, sharding = self.plan, self.plan.sharding
        if not sharding.overlap_param_gather or sharding.stage not in (1, 2):
            return
        for vstage in plan.rank_stages(plan.layout.coords(rank)["pp"]):
            for block in plan.stages[vstage].blocks:
                if block.experts is None:
                    continue
                op = self._expert_param_gather(rank, [block.experts], f"edp.ag.vs{vstage}.{block.name}", [])
                if op is not None:
                    self._param_gathers.setdefault((rank, vstage, id(block)), []).append(op)

    def _expert_param_gather(self, rank: int, experts: list[ExpertWork], key: str, deps: list[int]) -> int | None:
        """ZeRO: the distributed optimizer updates each routed expert's parameters shard by shard over the
        expert-data-parallel group, so that group all-gathers ``experts``' parameters before they are used
        again, as the DP x CP group gathers the rest: Megatron-Core's expert-parallel buffers, whose gathers run
        on their own communicator beside the dense buckets' (``EXPERT_DP_STREAM``). Under ``zero: 3`` too: routed
        experts keep their weights and gradients whole at every stage (experts.expert_sharding), their
        gradients reduced once after the last micro-batch, so only their optimizer state is sharded. None
        when the group is one rank."""
        gather = expert_param_gather(self.plan.layout, rank, experts, self.plan.sharding)
        if gather is None:
            return None
        mirrors = group_images(self.plan.layout, rank, experts[0].ep, expert_dp=True) if self.images else ()
        return self._collective(rank, EXPERT_DP_STREAM, "all_gather expert params", gather.op, gather.group,
                                gather.nbytes, f"{key}.{gather.group[0]}", deps, "dp", mirrors=mirrors)
