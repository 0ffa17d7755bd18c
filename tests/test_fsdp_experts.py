"""Routed experts under PyTorch FSDP2 as torchtitan shards them: ``fully_shard`` of each layer's experts over the
ranks left after EP (its ``efsdp`` mesh, dp_shard x cp x tp / ep ranks), fp32 shards all-gathered with their layer's
unit in every forward and backward and their gradients reduce-scattered with it; checked by hand on a small
Mixtral-like case."""

from __future__ import annotations

import pytest

from simulator.catalog.models import get_model

TP, DP, EP, LAYERS, MICROBATCHES = 2, 8, 4, 2, 2
SCENARIO = f"""
cluster: {{topology: dgx-h100-cluster, nodes: 2}}
model:
  preset: mixtral-8x7b
  layers: {LAYERS}
  moe: {{experts: 8, top_k: 2, routing: {{balance: uniform}}}}
training: {{seq_len: 4096, microbatches: {MICROBATCHES}, precision: bf16}}
parallelism: {{tp: {TP}, dp: {DP}, ep: {EP}, sequence_parallel: true, fsdp: full_shard}}
run: {{seed: 3}}
"""
MIXTRAL = get_model("mixtral-8x7b")
LAYER_EXPERTS = 8 // EP * 3 * MIXTRAL.hidden * 14336
"""Routed-expert parameters of one layer on one rank: 8 / EP experts of three hidden x expert_ffn_hidden
(14,336) matrices (SwiGLU)."""
SHARD = [0, 1, 8, 9]
"""Rank 0's expert shard group: the DP ranks holding its experts (DP positions 0 and 4 of ranks 0, 2, .., 14:
stride EP) with their TP peers, TP x DP / EP = 4 ranks."""


def _ops(frame, name: str):
    return frame[(frame["kind"] == "collective") & (frame["rank"] == 0) & (frame["name"] == name)]


def _sent(frame, ops) -> float:
    return float(frame[(frame["kind"] == "flow") & (frame["src"] == 0) & frame["name"].isin(set(ops["key"]))]
                 ["bytes"].sum())


def test_each_layer_gathers_and_reduce_scatters_its_experts_over_the_expert_shard_group(run_yaml):
    """Per layer and micro-batch: one all-gather of the rank's experts in bf16 before the forward and one before
    the backward (reshard_after_forward), each sending the rank's 1/4 shard to the 3 others ((n - 1)/n of the
    gathered bytes leave GPU 0 over a ring); one reduce-scatter of their fp32 gradients after the backward. None
    of Megatron's after-step expert reduction or gather is left."""
    frame = run_yaml(SCENARIO).timeline
    for layer in range(LAYERS):
        gathers = _ops(frame, f"all_gather params L{layer}.experts")
        reduces = _ops(frame, f"reduce_scatter grads L{layer}.experts")
        assert len(gathers) == 2 * MICROBATCHES and len(reduces) == MICROBATCHES
        assert gathers["bytes"].tolist() == pytest.approx([LAYER_EXPERTS * 2] * 2 * MICROBATCHES, rel=1e-12)
        assert reduces["bytes"].tolist() == pytest.approx([LAYER_EXPERTS * 4] * MICROBATCHES, rel=1e-12)
        assert _sent(frame, gathers) == pytest.approx(2 * MICROBATCHES * 3 / 4 * LAYER_EXPERTS * 2, rel=1e-12)
        assert _sent(frame, reduces) == pytest.approx(MICROBATCHES * 3 / 4 * LAYER_EXPERTS * 4, rel=1e-12)
        assert all(key.endswith(".0") for key in gathers["key"])
    ops = frame[(frame["kind"] == "collective") & (frame["rank"] == 0)]
    assert not ops["name"].isin(["reduce_scatter expert grads", "all_gather expert params"]).any()


def test_expert_shard_group_is_the_data_parallel_ranks_left_after_ep_with_their_tp_peers():
    """torchtitan's efsdp = dp_shard x cp x tp / ep: here 8 x 2 / 4 = 4, the same for every member; HSDP shards
    within each replica (a host's 4 DP ranks: the one holding the experts, with its TP peer) and all-reduces
    across the replicas at its TP coordinate."""
    from simulator.parallel.experts import expert_shard_groups
    from simulator.parallel.layout import Layout

    layout = Layout(tp=TP, dp=DP)
    shard, replicas = expert_shard_groups(layout, 0, EP, DP)
    assert (list(shard), replicas) == (SHARD, ())
    assert all(expert_shard_groups(layout, member, EP, DP)[0] == shard for member in shard)
    assert expert_shard_groups(layout, 0, EP, 4) == ((0, 1), (0, 8))
    assert expert_shard_groups(layout, 0, 8, 4) == ((0, 1), ())


def test_experts_memory_is_fp32_shards_over_the_expert_shard_group():
    """Per rank the experts hold 4 B of fp32 shard, 4 B of fp32 gradient shard and Adam's 8 B over the group of
    4, as the dense FSDP2 shards do, instead of whole 16-bit weights and fp32 gradients with 12 B of optimizer
    state over it (2 + 4 + 12/4 = 9 B a parameter against 16/4 = 4 B). The gathered units (each layer's dense
    parameters and experts) are the FSDP working set of the buffers."""
    from simulator.config.loader import scenario_from_text
    from simulator.parallel.sharding import Sharding
    from simulator.topology.loader import scenario_topology
    from simulator.workload.memory import rank_memory, rank_params, routed_params
    from simulator.workload.memory_plan import wrapped_units
    from simulator.workload.training import build_training_step
    from simulator.workload.transformer import ShardShape

    shard = ShardShape(1, 4096, TP, 1, True, dtype_bytes=2)
    fsdp = Sharding(stage=3, degree=DP, gather_per_layer=True, fsdp=True, fp32_shards=True)
    zero = Sharding(stage=3, degree=DP)
    routed = routed_params(MIXTRAL, LAYERS, EP)
    assert routed == LAYERS * LAYER_EXPERTS
    held, whole = (rank_memory(MIXTRAL, shard, layers=LAYERS, in_flight=1, sharding=sharding, first_stage=False,
                               last_stage=False, ep=EP) for sharding in (fsdp, zero))
    dense = rank_params(MIXTRAL, TP, LAYERS, first_stage=False, last_stage=False, ep=EP) - routed
    assert held.params == pytest.approx(4 * (dense / DP + routed / 4), rel=1e-12)
    assert held.grads == pytest.approx(4 * (dense / DP + routed / 4), rel=1e-12)
    assert held.optimizer == pytest.approx(8 * (dense / DP + routed / 4), rel=1e-12)
    assert whole.params == pytest.approx(2 * (dense / DP + routed), rel=1e-12)
    assert whole.grads == pytest.approx(4 * (dense / DP + routed), rel=1e-12)
    assert whole.optimizer == pytest.approx(12 * (dense / DP + routed / 4), rel=1e-12)

    loaded = scenario_from_text(SCENARIO, "inline.yaml", [])
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    units = wrapped_units(step, 0)
    dense_units = [sum(block.params for block in step.plan.stages[0].blocks if block.layer == layer)
                   for layer in sorted({block.layer for block in step.plan.stages[0].blocks})]
    assert [unit - own for unit, own in zip(units, dense_units, strict=True)] == pytest.approx(
        [0.0, LAYER_EXPERTS, LAYER_EXPERTS, 0.0], rel=1e-12)


def test_optimizer_updates_expert_shards_as_the_dense_shards(run_yaml):
    """FSDP2 updates the experts' fp32 shards in place, 32 B per parameter of its shard with Adam, as the dense
    ones: the optimizer step's time is that of all its shards, at a quarter of the experts each."""
    from simulator.config.loader import scenario_from_text
    from simulator.topology.loader import scenario_topology
    from simulator.workload.calibrated import calibrated_efficiency
    from simulator.workload.training import build_training_step

    loaded = scenario_from_text(SCENARIO, "inline.yaml", [])
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    dense = step.plan.stages[0].params
    bandwidth = step.gpu.hbm_bandwidth * calibrated_efficiency(step.gpu.name, "bf16").memory_peak
    assert step.plan.optimizer_s[0] * bandwidth == pytest.approx(32 * (dense / DP + LAYERS * LAYER_EXPERTS / 4),
                                                                 rel=1e-12)


def test_hybrid_shard_all_reduces_each_expert_shard_across_the_replicas(run_yaml):
    """hybrid_shard on two 8-GPU hosts: a host's 4 DP ranks shard, and of them one holds rank 0's experts, so the
    experts' shard group is rank 0 and its TP peer; after the last backward each layer's expert gradient shard
    (half of them, fp32) is all-reduced with the other host's copy."""
    frame = run_yaml(SCENARIO, "parallelism.fsdp=hybrid_shard").timeline
    for layer in range(LAYERS):
        reduces = _ops(frame, f"reduce_scatter grads L{layer}.experts")
        shards = _ops(frame, f"all_reduce shard L{layer}.experts")
        assert reduces["bytes"].tolist() == pytest.approx([LAYER_EXPERTS * 4] * MICROBATCHES, rel=1e-12)
        assert shards["bytes"].tolist() == pytest.approx([LAYER_EXPERTS * 4 / 2], rel=1e-12)
        assert _sent(frame, _ops(frame, f"all_gather params L{layer}.experts")) == pytest.approx(
            2 * MICROBATCHES / 2 * LAYER_EXPERTS * 2, rel=1e-12)


def test_pipelined_fsdp_gathers_and_reduces_the_experts_once_a_step(run_yaml):
    """Under pipelining torchtitan keeps each unit gathered from its first forward to the chunk's last gradient
    action (reshard_after_forward=not pp_enabled), and the stage reduces once: one gather and one reduce-scatter
    of each layer's experts per step."""
    frame = run_yaml(SCENARIO, "parallelism.pp=2", "parallelism.dp=4", "parallelism.ep=2").timeline
    gathers = _ops(frame, "all_gather params L0.experts")
    reduces = _ops(frame, "reduce_scatter grads L0.experts")
    assert len(gathers) == 1 and len(reduces) == 1
    assert float(reduces["bytes"].iloc[0]) == pytest.approx(2 * LAYER_EXPERTS * 4, rel=1e-12)  # 4 experts a rank


def test_megatron_zero_keeps_the_experts_whole(run_yaml):
    """`zero: 3` without fsdp (DeepSpeed / Megatron style): no per-layer expert gathers, one reduction of the experts'
    gradients after the last micro-batch."""
    frame = run_yaml(SCENARIO.replace("fsdp: full_shard", "zero: 3")).timeline
    ops = frame[(frame["kind"] == "collective") & (frame["rank"] == 0)]
    assert not ops["name"].str.contains(r"L\d\.experts").any()
    assert (ops["name"] == "reduce_scatter expert grads").sum() == 1


def test_hybrid_shard_refuses_an_ep_that_does_not_tile_its_shard_groups(validation_error):
    """A host's 4 DP ranks shard under hybrid_shard; EP 8 tiles them (its groups span two shard groups) and EP 2
    splits them, but an EP of 3 (24 experts over 48 DP ranks) holds its experts on unlike numbers of ranks per
    shard group."""
    error = validation_error(SCENARIO.replace("nodes: 2", "nodes: 12").replace("experts: 8", "experts: 24"),
                             "parallelism.fsdp=hybrid_shard", "parallelism.dp=48", "parallelism.ep=3")
    assert error.field == "parallelism.ep"
    assert "neither divides the other" in str(error)


HYBRID = "parallelism.fsdp=hybrid_shard"
NO_SYNC = "parallelism.ddp.reduce_every_microbatch=false"
PIPELINED = ("parallelism.pp=2", "parallelism.dp=4", "parallelism.ep=2")


@pytest.mark.parametrize("overrides, tolerance", [
    ((), 0.008), (PIPELINED, 0.008), ((HYBRID,), 0.018), ((HYBRID, "parallelism.ep=8"), 0.023),
    ((HYBRID, *PIPELINED), 0.008), (("parallelism.ep=8",), 0.012), ((NO_SYNC,), 0.009),
    ((NO_SYNC, "parallelism.ep=8"), 0.008), ((HYBRID, NO_SYNC), 0.015)],
    ids=["fsdp", "fsdp-pp2", "hsdp-ep4", "hsdp-ep8", "hsdp-pp2", "fsdp-ep8", "fsdp-no-sync", "fsdp-no-sync-ep8",
         "hsdp-no-sync"])
def test_layout_search_estimate_counts_the_experts_gathers_and_reduce_scatters(overrides, tolerance):
    """`trainsim search`'s ranking estimate times each layer's expert all-gathers and reduce-scatters over their shard
    group beside the dense units' and FSDP2's copies of their gradients, and under HSDP each reduced shard's
    all-reduce across its replicas after the last backward (`unit_reductions`): 4 layers, 4 micro-batches, each
    simulated / estimated step within just over its error. full_shard 1.0016, pipelined 0.9942, ep 8 0.9923;
    hybrid_shard ep 4 (dividing the shard group of 4) 0.9842, ep 8 (a multiple of it: the experts' shard group is the
    TP pair, with no replicas) 0.9790, pipelined (shard group 2, ep 2) 1.0057; reducing in the last backward alone
    (no-sync): full_shard 0.99131 (0.98659 while its walk of the gathers left the MoE all-to-alls out of each
    unit's compute, `ShardedUnit`), ep 8 0.9971, hybrid_shard 0.9856.

    The terms that bring it there: the SM toll of the FSDP collectives' spans is charged for the kernels' share of
    the compute stream's time, its MoE all-to-alls counted beside its blocking collectives and FSDP's gradient copies
    among the work the engine does not slow (`sharded_slowdown`, `unslowed_s`: the collectives start at a unit's
    edge, where the stream runs its copy-outs and all-to-alls, not kernels; what over-estimate is left is that toll,
    a span beside a unit's opening copy-out and EP combine taking no SMs from a kernel); the EP combines are timed
    beside the DP gathers and reduce-scatters that start with them and share their links
    (`backward_exchange_sharing_s`: the backward's 2.05 ms a micro-batch longer than alone); the gathers walk across
    the passes and micro-batches as FSDP2 prefetches them (`gather_walk`: a layer's expert gather over the NICs, 5.9
    ms, outlasts its forward, 3.6 ms); and the last backward, which reduce-scatters, is costed as a backward that
    reduces every micro-batch. Without the experts' collectives the estimate would read 0.179 s against 0.420 s
    simulated (2.35), without HSDP's all-reduces across replicas hybrid_shard 1.1307."""
    assert _simulated_over_estimate(ESTIMATED, overrides) == pytest.approx(1.0, abs=tolerance)


ESTIMATED = SCENARIO.replace(f"layers: {LAYERS}", "layers: 4").replace(f"microbatches: {MICROBATCHES}",
                                                                        "microbatches: 4")
"""The estimate tests' Mixtral-like case: 4 layers, 4 micro-batches."""
DENSE_ESTIMATED = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 4096, microbatches: 4, precision: bf16}
parallelism: {tp: 2, dp: 8, sequence_parallel: true, fsdp: full_shard}
run: {seed: 3}
"""
"""Its dense twin (Llama-3-8B's layers)."""
ONE_GPU_SHARDS = (HYBRID, "parallelism.tp=8", "parallelism.dp=2")


def _simulated_over_estimate(text: str, overrides: tuple[str, ...]) -> float:
    """The simulated step time of scenario ``text`` with ``overrides`` over `trainsim search`'s estimate of it."""
    from simulator import simulate
    from simulator.config.loader import scenario_from_text
    from simulator.simulation import network_settings
    from simulator.sweep.layouts import CollectiveTimes, estimate_step_s
    from simulator.topology.loader import scenario_topology
    from simulator.workload.calibrated import contention_share
    from simulator.workload.training import build_training_step

    loaded = scenario_from_text(text, "inline.yaml", ["run.timeline=summary", *overrides])
    topology = scenario_topology(loaded)
    step = build_training_step(loaded.scenario, topology)
    estimate = estimate_step_s(step, CollectiveTimes(topology, network_settings(loaded, topology)),
                               contention_share(loaded.scenario.collectives.sm_contention, step.gpu.name))
    return simulate(loaded).summary["step_time_s"] / estimate


@pytest.mark.parametrize("overrides, tolerance", [((NO_SYNC,), 0.005), ((HYBRID, NO_SYNC), 0.006)],
                         ids=["fsdp", "hsdp"])
def test_layout_search_estimate_of_a_dense_no_sync_step(overrides, tolerance):
    """The dense twin reducing in the last backward alone (no-sync), each within just over its error: full_shard 0.9959,
    hybrid_shard 0.9944. The last micro-batch is costed as one that reduces every micro-batch, its backward's TP
    collectives timed beside the reduce-scatter and the gather that start with each unit's backward and share their
    links (`backward_sharing_s`), each forward but the first charged its opening gathers (`microbatch_starts_s`: the
    next forward's first gathers run beside the backward's last units, 2.5 ms of the embedding's beside layer 0's
    backward), and FSDP's gradient copies counted among the compute stream's work the engine does not slow
    (`unslowed_s`)."""
    assert _simulated_over_estimate(DENSE_ESTIMATED, overrides) == pytest.approx(1.0, abs=tolerance)


@pytest.mark.parametrize("text, overrides, tolerance", [
    (ESTIMATED, ("training.microbatches=16",), 0.0065), (ESTIMATED, ("model.layers=16",), 0.0155),
    (ESTIMATED, (HYBRID, "training.microbatches=2"), 0.029), (ESTIMATED, (HYBRID, "training.microbatches=16"), 0.005),
    (ESTIMATED, (HYBRID, "model.layers=16"), 0.02),
    (DENSE_ESTIMATED, ("training.microbatches=2",), 0.016), (DENSE_ESTIMATED, ("training.microbatches=16",), 0.005),
    (DENSE_ESTIMATED, ("model.layers=16",), 0.004),
    (DENSE_ESTIMATED, (HYBRID, "training.microbatches=2"), 0.011),
    (DENSE_ESTIMATED, (HYBRID, "training.microbatches=16"), 0.002),
    (DENSE_ESTIMATED, (HYBRID, "model.layers=16"), 0.005),
], ids=["moe-fsdp-m16", "moe-fsdp-16-layers", "moe-hsdp-m2", "moe-hsdp-m16", "moe-hsdp-16-layers",
        "dense-fsdp-m2", "dense-fsdp-m16", "dense-fsdp-16-layers", "dense-hsdp-m2", "dense-hsdp-m16",
        "dense-hsdp-16-layers"])
def test_layout_search_estimate_of_a_no_sync_step_over_micro_batches_and_depth(text, overrides, tolerance):
    """The no-sync estimate beyond 4 layers x 4 micro-batches, each within just over today's error. MoE
    full_shard: 16 micro-batches 0.9885, 16 layers 0.9798 (2 micro-batches: the next test); hybrid_shard: 2
    micro-batches 0.9686, 16 1.0004, 16 layers 0.9805 (with 2, the first and the last micro-batch alone, its
    estimate is over by 3%: not yet explained). Dense full_shard 0.9828, 1.0030 and 0.9949, hybrid_shard 0.9849,
    0.9966 and 0.9923; 0.9940, 1.0046 and 1.0036, 0.9886, 0.9972 and 0.9952 while the last micro-batch's
    backward TP collectives were timed alone (the previous test); full_shard rose with either, 0.9997, 1.0171
    and 1.0170, while the backward's TP
    collectives were timed alone (`backward_sharing_s`), a term per layer and steady micro-batch. Since the SM
    toll counts FSDP's gradient copies among the compute stream's work the engine does not slow (`unslowed_s`):
    MoE full_shard 0.9897 and 0.9808, hybrid_shard 0.9720, 1.0041 and 0.9839; dense full_shard 0.9847, 1.0041
    and 0.9964, hybrid_shard 0.9892, 0.9991 and 0.9952. Since the EP all-to-all sends to every peer at once
    (2026-12-06): MoE full_shard 0.9883 and 0.9794, hybrid_shard 16 layers 0.9803. Since each EP all-to-all pays the
    grouped kernel's 8.4 us base latency (2026-12-07): MoE full_shard 0.98743 and 0.97860 (0.98804 and 0.97920 with
    it at 0): the estimate charged the forward's all-to-alls, launches and all, on top of its gather waits, where
    the simulation runs them on the compute stream while the next gather is awaited. Since the walk of the gathers
    counts each unit's MoE all-to-alls in its compute (`ShardedUnit`, `walked_gathers`): MoE full_shard 0.99401
    and 0.98512, each forward's steady waits 12.05 ms a micro-batch over 16 against 12.53 before."""
    assert _simulated_over_estimate(text, (NO_SYNC, *overrides)) == pytest.approx(1.0, abs=tolerance)


def test_layout_search_estimate_charges_the_last_no_sync_micro_batch_its_forwards_opening():
    """Under no-sync the last micro-batch is costed as one that reduces every micro-batch, whose slot leaves its
    forward's first `OPENING_GATHERS` gathers to the forward's start (`spans_beside_compute`); the estimate adds
    what a steady forward waits for them (`gather_walk`). MoE full_shard over 2 micro-batches, where layer 0's
    routed experts gathered over the NICs outlast the embedding's forward: 0.9890; 1.0198 adding no wait or the
    first unit's alone, 0.9758 adding the third's too; 0.9896 since the SM toll counts FSDP's gradient copies
    among the compute stream's work the engine does not slow (`unslowed_s`); 0.9886 since the EP all-to-all sends to
    every peer at once (2026-12-06); 0.98814 with the all-to-all's 8.4 us base latency, 0.99091 since the walk
    counts each unit's MoE all-to-alls in its compute (`ShardedUnit`)."""
    overrides = (NO_SYNC, "training.microbatches=2")
    assert _simulated_over_estimate(ESTIMATED, overrides) == pytest.approx(1.0, abs=0.0095)


@pytest.mark.parametrize("text, overrides, tolerance", [
    (DENSE_ESTIMATED, ONE_GPU_SHARDS, 0.012),
    (ESTIMATED, (*ONE_GPU_SHARDS, "parallelism.ep=2"), 0.04),
    (ESTIMATED, (*ONE_GPU_SHARDS, "parallelism.ep=1"), 0.015),
    (ESTIMATED, ("parallelism.tp=8", "parallelism.dp=1", "parallelism.ep=1", "cluster.nodes=1"), 0.025),
    (ESTIMATED, (*ONE_GPU_SHARDS, "parallelism.ep=2", NO_SYNC), 0.003),
    (ESTIMATED, ("parallelism.tp=8", "parallelism.dp=1", "parallelism.ep=1", "cluster.nodes=1", NO_SYNC), 0.046),
], ids=["dense-hsdp", "hsdp-ep2", "hsdp-ep1", "full-shard-dp1", "hsdp-ep2-no-sync", "full-shard-dp1-no-sync"])
def test_layout_search_estimate_times_the_collectives_left_over_a_one_gpu_shard_group(text, overrides, tolerance):
    """TP 8 fills each DGX H100, so hybrid_shard's shard group, and full_shard's on one host, is one GPU: no dense
    gather or reduce-scatter, but the dense shards are still all-reduced across the hosts and the routed experts
    gathered and reduce-scattered over their own group (the TP ranks: tp x d / ep). sim/est, each within just
    over today's error: dense HSDP 1.0087, ep 2 1.0332, ep 1 0.9891, full_shard dp 1 ep 1 0.9775; when the
    estimate ended there, timing none of them, 1.2444, 1.4792, 1.7305 and 1.6530 (`trainsim search` ranked
    "tp8 dp1 fsdp" at 58,326 tok/s against 35,284 simulated). Under no-sync, ep 2 0.9812 and full_shard dp 1
    0.9576: 0.9205 and 0.9616 while each forward waited for its opening gathers in full, 0.8584 and 0.8593
    once the gathers were walked (`gather_walk`) while the routed experts' copy-outs were charged as the dense
    units' one-rank unshard copies (10 B a parameter instead of the 4 B of a copy-out after their gather over
    the TP ranks: 9.6 ms a layer and micro-batch against 3.8 ms simulated), which the slots bound by their
    collectives had hidden. No-sync ep 2 0.98569 with the all-to-all's 8.4 us base latency, 0.99724 since the
    walk of the gathers counts each unit's MoE all-to-alls in its compute (`ShardedUnit`): they run while the
    routed experts' gather is awaited."""
    assert _simulated_over_estimate(text, overrides) == pytest.approx(1.0, abs=tolerance)


@pytest.mark.parametrize("overrides", [(HYBRID,), (HYBRID, "parallelism.ep=8"), (HYBRID, *PIPELINED),
                                       (*ONE_GPU_SHARDS, "parallelism.ep=2")],
                         ids=["ep4", "ep8", "pp2-ep2", "one-gpu-shards"])
def test_layout_search_estimate_reduces_hsdp_shards_as_the_program_does(run_yaml, overrides):
    """A layer's reductions in the estimate's last backward under hybrid_shard (`unit_reductions`: dense, then
    routed experts') are the program's: each reduce-scatter and all-reduce of rank 0's last backward with the
    bytes and the members its flows run between (dense over the host's DP ranks, experts over tp x d / ep ranks,
    each shard all-reduced with the other host's copy; none where a group has one member: ep 8's experts, which
    no other DP rank holds, or tp 8's dense shards, one GPU a host)."""
    from simulator.config.loader import scenario_from_text
    from simulator.sweep.layouts import unit_blocks, unit_reductions
    from simulator.topology.loader import scenario_topology
    from simulator.workload.training import build_training_step

    loaded = scenario_from_text(SCENARIO, "inline.yaml", list(overrides))
    plan = build_training_step(loaded.scenario, scenario_topology(loaded)).plan
    layer = next(unit for unit in unit_blocks(plan, list(plan.stages[0].blocks)) if unit[0].name == "L0.attn")
    frame = run_yaml(SCENARIO, "run.fold=false", *overrides).timeline
    flows = frame[frame["kind"] == "flow"]

    def issued(name: str) -> tuple[str, tuple[int, ...], float] | None:
        """The last of rank 0's collectives called ``name``: (op, the ranks its flows run between, bytes)."""
        ops = _ops(frame, name)
        if ops.empty:
            return None
        op = ops.iloc[-1]
        sent = flows[flows["name"] == op["key"]]
        return op["name"].split()[0], tuple(sorted({*sent["src"], *sent["dst"]})), float(op["bytes"])

    program = [(issued(f"reduce_scatter grads {name}"), issued(f"all_reduce shard {name}"))
               for name in ("L0", "L0.experts")]
    estimate = [tuple(None if shape is None else (shape[0], shape[1], pytest.approx(shape[2], rel=1e-12))
                      for shape in shard) for shard in unit_reductions(plan, 0, layer)]
    assert estimate == [shard for shard in program if shard != (None, None)]
    assert any(all_reduce is not None for _, all_reduce in program)
