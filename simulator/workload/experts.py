"""Cost of a mixture-of-experts MLP block on one rank per micro-batch, from a routing sample.

Kernels (docs/training-step.md, "Mixture of experts"): the MLP norm, the router (an n x E GEMM over the rank's n
tokens, n = b s / (cp tp): each TP rank routes its own share), the permutation into expert order and back
(elementwise, k n h elements read and written each way), the shared experts (dense GEMMs on all n tokens)
and the residual; then the routed experts of the hottest EP rank, each a GEMM chain sized by the tokens that
expert really receives (its kept load). Small experts run small GEMMs, which the roofline's size curve makes
slower per FLOP: the cost of fine-grained experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from simulator.catalog.models import ModelSpec, MoESpec
from simulator.config.moe import RoutingConfig
from simulator.errors import ScenarioError
from simulator.parallel.experts import ExpertWork
from simulator.workload.routing import RoutingSample, sample_routing
from simulator.workload.transformer import (
    ACTIVATION_FLOPS,
    Kernel,
    PassKernels,
    ShardShape,
    kernel_bytes,
    kernel_flops,
    matmul_kernels,
    norm_kernels,
    residual_kernels,
)

if TYPE_CHECKING:
    from simulator.config.schema import Scenario
    from simulator.config.training_options import Recompute
    from simulator.parallel.layout import Layout
    from simulator.workload.stage_work import CostContext

ROUTING_STREAM = 0x6D6F65
"""Spawn key of the routing generator under the run's seed, so other random draws never shift it."""


def _moe_of(model: ModelSpec) -> MoESpec:
    """The experts of a MoE model (the MoE block's cost exists only for one)."""
    if model.moe is None:
        raise ValueError(f"model {model.name} has no experts")
    return model.moe


@dataclass(frozen=True)
class MoELayer:
    """A MoE MLP block's kernels (everything, routed experts included), its non-expert parameter tensors (norm,
    router, shared experts) and the routed-expert part the program runs between the all-to-alls."""

    kernels: PassKernels
    tensors: tuple[float, ...]
    experts: ExpertWork


@dataclass(frozen=True)
class ExpertPlan:
    """The step's experts: the MoE block every layer runs, the routing sample behind it and the EP degree."""

    layer: MoELayer
    sample: RoutingSample
    ep: int


def experts_split_problem(moe: MoESpec, ep: int) -> tuple[str, str] | None:
    """The problem and the allowed values where an EP degree of ``ep`` does not divide the model's experts (no
    rank can hold an equal share); None where it does."""
    if moe.experts % ep:
        return f"ep {ep} does not divide the {moe.experts} experts", f"divisors of {moe.experts}"
    return None


EXPERT_COUNT_READS = ("model.moe", "model.preset")
"""Where the expert count the EP degree must divide comes from: an override of it is named with the refusal."""
EP_GROUP_READS = ("cluster", "parallelism.tp", "parallelism.cp", "parallelism.pp", "parallelism.dp")
"""What dp x cp, the group the EP degree must divide, is derived from (the GPUs and the other degrees): an override
of any of them is named with the refusal at `ep` (`--set parallelism.tp=8` shrinking dp went unsaid)."""


def check_expert_parallelism(scenario: Scenario, model: ModelSpec, layout: Layout) -> None:
    """Refuse an EP degree that the model's experts or the layout's DP x CP group do not split into."""
    ep = scenario.parallelism.ep
    moe = model.moe
    if moe is None:
        if ep > 1:
            dropped = scenario.model is not None and scenario.model.experts_dropped
            raise ScenarioError(f"ep {ep} needs a model with experts", field="parallelism.ep",
                                allowed="1 (model.moe is null: no experts)" if dropped else "1, or add model.moe")
        return
    split = experts_split_problem(moe, ep)
    if split is not None:
        raise ScenarioError(split[0], field="parallelism.ep", allowed=split[1], reads=EXPERT_COUNT_READS)
    ranks = layout.dp * layout.cp
    if ranks % ep:
        raise ScenarioError(f"ep {ep} does not divide dp x cp = {layout.dp} x {layout.cp} = {ranks} ranks",
                            field="parallelism.ep", allowed=f"divisors of {ranks}", reads=EP_GROUP_READS)


def plan_experts(scenario: Scenario, model: ModelSpec, layout: Layout, shard: ShardShape,
                 cost: CostContext) -> ExpertPlan | None:
    """Draw the routing sample from the run's seed and cost the MoE block (None for a dense model), for an EP
    degree `check_expert_parallelism` passed."""
    moe = model.moe
    if moe is None:
        return None
    ep = scenario.parallelism.ep
    config = scenario.model.moe if scenario.model is not None else None
    routing = config.routing if config is not None else RoutingConfig()
    tokens = max(1, round(shard.tokens / shard.tp))
    sample = seeded_routing(routing, moe.experts, moe.top_k, moe.capacity_factor, tokens, ep, scenario.run.seed)
    return ExpertPlan(moe_layer(model, shard, scenario.training.recompute, cost, sample, ep), sample, ep)


@lru_cache(maxsize=64)
def seeded_routing(routing: RoutingConfig, experts: int, top_k: int, capacity_factor: float | None, tokens: int,
                   ranks: int, seed: int) -> RoutingSample:
    """`sample_routing` drawn from ``seed``'s routing stream: a function of its arguments alone, so kept (read-only)
    for the next step built alike. A layout search builds hundreds of candidates that route the same micro-batch
    over the same EP group, and one sample of 256 experts over a few thousand tokens per rank takes ~0.07 s."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(ROUTING_STREAM,)))
    sample = sample_routing(routing, experts, top_k, capacity_factor, tokens, ranks, rng)
    sample.counts.flags.writeable = False
    return sample


def _ffn(prefix: str, model: ModelSpec, tokens: float, width: float, shard: ShardShape):
    """An MLP of ``width`` on ``tokens`` tokens: (forward, input-grad, weight-grad) kernels in forward order."""
    inputs = ("gate", "up") if model.gated_mlp else ("fc1",)
    first = [matmul_kernels(f"{prefix}.{name}", tokens, width, model.hidden, shard) for name in inputs]
    down = matmul_kernels(f"{prefix}.down", tokens, model.hidden, width, shard)
    fwd_flops, bwd_flops = ACTIVATION_FLOPS[model.gated_mlp]
    elements = tokens * width
    d = shard.dtype_bytes
    reads = len(inputs)
    act = (Kernel(f"{prefix}.act", fwd_flops * elements, (reads + 1) * d * elements, "elementwise"),
           Kernel(f"{prefix}.act.bwd", bwd_flops * elements, (2 * reads + 1) * d * elements, "elementwise"))
    forward = (*(mm[0] for mm in first), act[0], down[0])
    backward_input = (down[1], act[1], *(mm[1] for mm in reversed(first)))
    backward_weight = (down[2], *(mm[2] for mm in reversed(first)))
    return forward, backward_input, backward_weight


def _passes(forward, backward_input, backward_weight, recompute: Recompute) -> PassKernels:
    recomputed = tuple(Kernel(f"recompute.{k.name}", k.flops, k.hbm_bytes, k.kind, k.size_dim) for k in forward)
    return PassKernels(forward, recomputed if recompute == "full" else (), backward_input, backward_weight)


def routed_kernels(model: ModelSpec, shard: ShardShape, loads: np.ndarray, recompute: Recompute) -> PassKernels:
    """The routed experts of one EP rank, expert j receiving ``loads[j]`` tokens."""
    return _routed_kernels(model, shard, tuple(float(tokens) for tokens in loads), recompute)


@lru_cache(maxsize=256)
def _routed_kernels(model: ModelSpec, shard: ShardShape, loads: tuple[float, ...], recompute: Recompute) -> PassKernels:
    """`routed_kernels`, built once for the steps of a search that route the same tokens over the same shard
    (a DeepSeek-style rank runs 32 experts of a few GEMMs each, in every candidate of the layout)."""
    width = _moe_of(model).expert_ffn_hidden
    forward: list[Kernel] = []
    backward_input: list[Kernel] = []
    backward_weight: list[Kernel] = []
    for index, tokens in enumerate(loads):
        if tokens <= 0:
            continue
        f, bi, bw = _ffn(f"expert{index}", model, tokens, width, shard)
        forward += f
        backward_input += bi
        backward_weight += bw
    return _passes(tuple(forward), tuple(backward_input), tuple(backward_weight), recompute)


@lru_cache(maxsize=64)
def moe_layer(model: ModelSpec, shard: ShardShape, recompute: Recompute, cost: CostContext, sample: RoutingSample,
              ep: int) -> MoELayer:
    """The MoE block of every layer: the hottest EP rank's experts, each pair's tokens on the all-to-alls. Built
    once for the steps of a search that route the same sample (`seeded_routing` keeps it) over the same shard."""
    moe, d = _moe_of(model), shard.dtype_bytes
    tokens = shard.tokens / shard.tp
    norm = norm_kernels("mlp_norm", model, shard)
    router = matmul_kernels("router", tokens, moe.experts, model.hidden, shard)
    moved = 2.0 * moe.top_k * tokens * model.hidden * d
    permute = (Kernel("moe_permute", 0.0, 2 * moved, "elementwise"),
               Kernel("moe_permute.bwd", 0.0, 2 * moved, "elementwise"))
    residual = residual_kernels("mlp_residual", model, shard)
    shared_f, shared_bi, shared_bw = ((), (), ())
    if moe.shared_experts:
        shared_f, shared_bi, shared_bw = _ffn("shared", model, tokens, moe.shared_experts * moe.expert_ffn_hidden,
                                              shard)
    rest_forward = (norm[0], router[0], permute[0], *shared_f, residual[0])
    rest_bi = (residual[1], *shared_bi, permute[1], router[1], norm[1])
    rest_bw = (*shared_bw, router[2])
    hot = sample.hottest_rank(ep)
    per_rank = moe.experts // ep
    routed = routed_kernels(model, shard, sample.expert_load()[hot * per_rank:(hot + 1) * per_rank], recompute)
    rest = _passes(rest_forward, rest_bi, rest_bw, recompute)
    kernels = PassKernels(rest.forward + routed.forward, rest.recompute + routed.recompute,
                          rest.backward_input + routed.backward_input, rest.backward_weight + routed.backward_weight)

    seconds, sm_bound = cost.seconds, cost.sm_bound
    pairs = sample.pair_tokens(ep) * (model.hidden * d)
    work = ExpertWork(ep=ep, dispatch_pairs=tuple(tuple(float(x) for x in row) for row in pairs),
                      combine_pairs=tuple(tuple(float(x) for x in row) for row in pairs.T),
                      dispatch_bytes=float(pairs.sum(axis=1).mean()),
                      forward_s=seconds(routed.forward), backward_input_s=seconds(routed.backward_input),
                      backward_weight_s=seconds(routed.backward_weight), recompute_s=seconds(routed.recompute),
                      forward_flops=kernel_flops(routed.forward),
                      backward_input_flops=kernel_flops(routed.backward_input),
                      backward_weight_flops=kernel_flops(routed.backward_weight),
                      recompute_flops=kernel_flops(routed.recompute),
                      params=float(per_rank * model.expert_params()),
                      sm_bound_s=(sm_bound(routed.forward), sm_bound(routed.backward_input),
                                  sm_bound(routed.backward_weight), sm_bound(routed.recompute)),
                      mean_load_share=mean_load_share(sample, ep),
                      hbm_bytes=(kernel_bytes(routed.forward), kernel_bytes(routed.backward_input),
                                 kernel_bytes(routed.backward_weight), kernel_bytes(routed.recompute)))
    return MoELayer(kernels, moe_tensors(model), work)


def moe_tensors(model: ModelSpec) -> tuple[float, ...]:
    """A MoE MLP block's parameter tensors outside its routed experts, in forward order (norm, router, each
    shared-expert matrix): what the DDP buckets and the ZeRO parameter gathers carry of it, the routed experts
    being reduced and gathered over their own expert-data-parallel group."""
    moe = _moe_of(model)
    matrices = 3 if model.gated_mlp else 2
    shared = (float(model.expert_params() // matrices * moe.shared_experts),) * matrices if moe.shared_experts else ()
    return (float(model.norm_params()), float(model.router_params()), *shared)


def mean_load_share(sample: RoutingSample, ep: int) -> float:
    """The EP group's mean rank load over its hottest rank's: the share of the hottest rank's expert FLOPs
    (GEMMs and activations both grow linearly with the tokens) that an average rank executes."""
    loads = sample.rank_load(ep)
    return float(loads.mean() / loads.max()) if loads.max() > 0 else 1.0


def moe_report(model: ModelSpec, shard: ShardShape, cost: CostContext, sample: RoutingSample, ep: int,
               layer: MoELayer, moe_layers_per_rank: int, microbatches: int, recompute: Recompute) -> dict:
    """The summary's `moe` entry: routing outcome and what the hottest EP rank costs, its recomputed forward
    (``recompute`` full) included; `hottest_rank_adds_s` is its extra expert compute over its passes, which a
    pp > 1 step's fill and drain lengthen to (m + p - 1)/m times it with uniform stages. At ep 1 no all-to-all
    runs (a rank routes its tokens to its own experts), so its bytes are 0, not the self-traffic the convention of
    ep > 1 counts on the diagonal."""
    moe = _moe_of(model)
    per_rank = moe.experts // ep
    loads = sample.expert_load()
    rank_loads = sample.rank_load(ep)
    mean = routed_kernels(model, shard, np.full(per_rank, loads.mean()), recompute)
    mean_s = sum(cost.seconds(ks) for ks in (mean.forward, mean.recompute, mean.backward_input, mean.backward_weight))
    work = layer.experts
    hot_s = work.forward_s + work.recompute_s + work.backward_input_s + work.backward_weight_s
    return {
        "experts": moe.experts, "top_k": moe.top_k, "ep": ep, "capacity_factor": moe.capacity_factor,
        "tokens_per_rank": shard.tokens / shard.tp,
        "dropped_token_fraction": sample.dropped_fraction,
        "expert_load_tokens": [float(x) for x in loads],
        "hottest_expert": int(np.argmax(loads)),
        "hottest_expert_load_over_mean": float(loads.max() / loads.mean()) if loads.mean() else 0.0,
        "hottest_ep_rank": sample.hottest_rank(ep),
        "hottest_rank_load_over_mean": float(rank_loads.max() / rank_loads.mean()) if rank_loads.mean() else 0.0,
        "all_to_all_bytes_per_layer": 2.0 * work.dispatch_bytes if ep > 1 else 0.0,
        "expert_s_per_layer": hot_s,
        "expert_s_per_layer_at_mean_load": mean_s,
        "hottest_rank_adds_s": (hot_s - mean_s) * moe_layers_per_rank * microbatches,
    }
