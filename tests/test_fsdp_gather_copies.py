"""FSDP2's copies around each all-gather (torch 2.13, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) and the
state it keeps: `fsdp: full_shard | hybrid_shard` keeps fp32 shards under fused kernels as under eager (FSDPParam's
sharded parameter keeps the parameter's own dtype; MixedPrecisionPolicy's param_dtype applies to what is gathered),
so every copy-in casts (read 4, write 2) before all_gather_copy_in's copy into the all-gather input (2 + 2 B per
shard element) on FSDP2's copy-in stream, and foreach_all_gather_copy_out's split_with_sizes_copy of the whole
output into the unsharded parameters (2 + 2 B per parameter) runs on the compute stream. The model state is 4 + 4 +
8 B / n per parameter with Adam (fp32 shard, fp32 sharded gradient, moments; no master copy) and the optimizer
updates the shards in place. DeepSpeed ZeRO-3 and FSDP1's shard_grad_op copy nothing and keep 16-bit weights with
an fp32 master copy. Bytes, seconds at the HBM rate and streams, counted by hand."""

from __future__ import annotations

import pytest

from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import get_model
from simulator.config.loader import scenario_from_text
from simulator.parallel.sharding import Sharding
from simulator.program.ops import ComputeOp
from simulator.simulation import step_program
from simulator.topology.loader import scenario_topology
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.memory import rank_params
from simulator.workload.memory_plan import stage_memory
from simulator.workload.training import UPDATE_BYTES_PER_PARAM, build_training_step

RANKS, LAYERS, M = 8, 4, 4
FSDP_8B = f"""
cluster: {{topology: dgx-h100}}
model: {{preset: llama3-8b, layers: {LAYERS}}}
training: {{seq_len: 1024, global_batch: {RANKS * M}, micro_batch: 1}}
parallelism: {{dp: {RANKS}, fsdp: full_shard}}
"""
COPY_RATE = get_gpu("h100-sxm").hbm_bandwidth * calibrated_efficiency("h100-sxm", "bf16").memory_peak
"""HBM bytes per second of a memory-bound kernel on the H100 (the calibrated fraction of its bandwidth)."""


def test_bytes_per_parameter_around_a_gather():
    # 16-bit shards: param_dtype clamped to None, the shard is the input; copied in (read 2, write 2) / n.
    assert Sharding(stage=3, degree=8, fsdp=True, shard_bytes=2).gather_copy_bytes() == (4 / 8, 4.0)
    # fp32 shards: cast to bf16 (read 4, write 2), then copied in (read 2, write 2), / n; HSDP's shard group.
    assert Sharding(stage=3, degree=8, fsdp=True, shard_bytes=4).gather_copy_bytes() == (10 / 8, 4.0)
    assert Sharding(stage=3, degree=4, fsdp=True, shard_bytes=4).gather_copy_bytes() == (10 / 4, 4.0)
    assert Sharding(stage=3, degree=8).gather_copy_bytes() == (0.0, 0.0)


def _rank0_ops(*overrides: str) -> list[ComputeOp]:
    loaded = scenario_from_text(FSDP_8B, "inline.yaml", list(overrides))
    ops = step_program(loaded, scenario_topology(loaded), fold=True).ops
    return [op for op in ops if isinstance(op, ComputeOp) and op.rank == 0]


def test_fused_fsdp_copies_in_and_out_every_gather_by_hand():
    # Reshard after forward: every unit gathered for each micro-batch's forward and, but the head (kept
    # gathered), again for its backward: M x (2 N - head) parameters gathered on rank 0, each copied out at 4 B
    # and, 1/8 of it, cast and copied in at 10 B.
    model = get_model("llama3-8b")
    gathered = M * (2 * rank_params(model, 1, LAYERS, first_stage=True, last_stage=True) - model.head_params())
    ops = _rank0_ops()
    copy_in = [op for op in ops if op.name.startswith("fsdp copy-in ")]
    copy_out = [op for op in ops if op.name.startswith("fsdp copy-out ")]
    assert len(copy_in) == len(copy_out) == M * (2 * (LAYERS + 2) - 1)
    assert sum(op.duration for op in copy_in) == pytest.approx(gathered * 10 / RANKS / COPY_RATE, rel=1e-12)
    assert sum(op.duration for op in copy_out) == pytest.approx(gathered * 4 / COPY_RATE, rel=1e-12)
    layer_in = next(op for op in copy_in if op.name == "fsdp copy-in L0")
    assert layer_in.duration == pytest.approx(model.layer_params() * (4 + 2 + 2 + 2) / RANKS / COPY_RATE, rel=1e-12)
    layer = next(op for op in copy_out if op.name == "fsdp copy-out L0")
    assert layer.duration == pytest.approx(model.layer_params() * 4 / COPY_RATE, rel=1e-12)
    assert {op.stream for op in copy_in} == {"fsdp_copy_in"}
    assert {op.stream for op in copy_out} == {"compute"}
    # HBM copies, counted in the pass they gather for, not as communication
    assert {op.category for op in copy_in} == {op.category for op in copy_out} == {"forward", "backward"}


def _step(*overrides: str):
    loaded = scenario_from_text(FSDP_8B, "inline.yaml", list(overrides))
    return loaded.scenario, build_training_step(loaded.scenario, scenario_topology(loaded))


@pytest.mark.parametrize("reduce_dtype", ["fp32", "bf16"])
def test_fused_fsdp_keeps_fp32_shards_and_their_fp32_gradients_without_a_master_copy(reduce_dtype):
    # fp32 shard (4 B), fp32 sharded .grad (4 B: foreach_reduce casts the reduce-scatter output to the parameter's
    # dtype whatever reduce_dtype is), Adam's moments (8 B), all / 8; no 16-bit weights, no fp32 master copy.
    scenario, step = _step(f"training.grad_reduce_dtype={reduce_dtype}")
    params = rank_params(get_model("llama3-8b"), 1, LAYERS, first_stage=True, last_stage=True)
    (breakdown, _), = stage_memory(scenario, step)
    assert breakdown.params == pytest.approx(params * 4 / RANKS, rel=1e-12)
    assert breakdown.grads == pytest.approx(params * 4 / RANKS, rel=1e-12)
    assert breakdown.optimizer == pytest.approx(params * 8 / RANKS, rel=1e-12)
    assert step.plan.sharding.grad_bytes == {"fp32": 4, "bf16": 2}[reduce_dtype]  # what is reduce-scattered
    # The optimizer updates the shards in place: Adam's 28 B and the gradient norm's read, no copy.
    assert step.plan.optimizer_s[0] == pytest.approx(params / RANKS * (UPDATE_BYTES_PER_PARAM["adam"] + 4)
                                                     / COPY_RATE, rel=1e-12)


@pytest.mark.parametrize("parallelism", ["parallelism.fsdp=shard_grad_op", "parallelism.zero=3"])
def test_shard_grad_op_and_deepspeed_keep_16_bit_weights_and_an_fp32_master_copy(parallelism):
    # 2 B weights, the fp32 gradient buffer (4 B) and master weights + moments (12 B): ZeRO-3 all / 8, ZeRO-2 its
    # weights whole (one micro-batch, so its gradients are reduce-scattered and sharded).
    overrides = [parallelism, "training.global_batch=8"]
    if parallelism.endswith("zero=3"):
        overrides.insert(0, "parallelism.fsdp=null")
    scenario, step = _step(*overrides)
    params = rank_params(get_model("llama3-8b"), 1, LAYERS, first_stage=True, last_stage=True)
    (breakdown, _), = stage_memory(scenario, step)
    assert breakdown.params == pytest.approx(params * 2 / (RANKS if step.plan.sharding.stage == 3 else 1), rel=1e-12)
    assert breakdown.optimizer == pytest.approx(params * 12 / RANKS, rel=1e-12)
    assert not step.plan.sharding.fp32_shards


@pytest.mark.parametrize("parallelism", ["parallelism.fsdp=shard_grad_op", "parallelism.fsdp=null"])
def test_deepspeed_zero3_and_fsdp1s_shard_grad_op_copy_nothing_around_their_gathers(parallelism):
    # DeepSpeed gathers into flat buffers its modules' parameters view; shard_grad_op gathers after the optimizer.
    overrides = [parallelism] if parallelism.endswith("shard_grad_op") else [parallelism, "parallelism.zero=3"]
    assert not [op for op in _rank0_ops(*overrides) if op.name.startswith("fsdp copy-")]


@pytest.mark.parametrize(("schedule", "stream"), [("1f1b", "fsdp_copy_in"), ("interleaved", "compute")])
def test_pipelined_unshards_copy_in_on_the_stream_fsdp2_picks(schedule, stream):
    # Schedule1F1B gathers each unit in its pre-forward hook (async_op=False: the copy-in stream);
    # _PipelineScheduleRuntime's UNSHARD calls unshard(async_op=True), and get_all_gather_streams then returns the
    # current stream, so those copy-ins run on the compute stream.
    overrides = ["parallelism.dp=4", "parallelism.pp=2", f"parallelism.pipeline.schedule={schedule}",
                 "training.global_batch=16"]
    if schedule == "interleaved":
        overrides.append("parallelism.pipeline.virtual_stages=2")
    copy_in = [op for op in _rank0_ops(*overrides) if op.name.startswith("fsdp copy-in ")]
    assert copy_in and {op.stream for op in copy_in} == {stream}


def test_fp32_shards_follow_the_strategy_not_the_shard_width():
    # fp32 training under FSDP1's shard_grad_op keeps 4 B shards, its training precision: not FSDP2's fp32 shards
    # (not read off shard_bytes == 4). full_shard keeps them whatever the precision.
    _, shard_grad_op = _step("parallelism.fsdp=shard_grad_op", "training.precision=fp32")
    assert shard_grad_op.plan.sharding.shard_bytes == 4 and not shard_grad_op.plan.sharding.fp32_shards
    _, full_shard = _step("training.precision=fp32")
    assert full_shard.plan.sharding.fp32_shards
