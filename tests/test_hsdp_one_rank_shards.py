"""HSDP whose shard group is one GPU (`fsdp: hybrid_shard` with TP 8 filling each DGX H100, DP 2 across two): FSDP2 over
a one-rank shard mesh runs no all-gather and no reduce-scatter (torch 2.13,
torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py and _fsdp_collectives.py, ``world_size == 1``).
FSDPParamGroup.unshard only records an event; wait_for_unshard, on the compute stream, casts each fp32 shard to bf16
(all_gather_inputs: read 4, write 2 B) and copies it into the unsharded parameters (read 2, write 2 B): 10 B per
parameter, no copy-in stream, no copy-out. foreach_reduce copies the reduce-scatter input into its output on the
reduce-scatter stream (read 4, write 4 B with the fp32 reduce), which HSDP all-reduces whole across the two replicas.
Bytes, seconds at the HBM rate and streams, counted by hand."""

from __future__ import annotations

import pytest

from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import get_model
from simulator.config.loader import scenario_from_text
from simulator.parallel.sharding import Sharding
from simulator.program.ops import CollectiveOp, ComputeOp
from simulator.simulation import step_program
from simulator.topology.loader import scenario_topology
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.memory import embedding_rank_params, rank_params
from simulator.workload.memory_plan import stage_memory
from simulator.workload.training import build_training_step

TP, LAYERS, M = 8, 4, 4
HSDP = f"""
cluster: {{topology: dgx-h100-cluster, nodes: 2}}
model: {{preset: llama3-8b, layers: {LAYERS}}}
training: {{seq_len: 1024, global_batch: {2 * M}, micro_batch: 1}}
parallelism: {{tp: {TP}, dp: 2, sequence_parallel: true, fsdp: hybrid_shard}}
"""
MODEL = get_model("llama3-8b")
LAYER = rank_params(MODEL, TP, 1, first_stage=False, last_stage=False)
"""Parameters of one layer on one TP rank (its FSDP unit)."""
HEAD = MODEL.norm_params() + MODEL.vocab * MODEL.hidden / TP
"""The head unit on one TP rank: the final norm and the output layer's vocabulary slice."""
COPY_RATE = get_gpu("h100-sxm").hbm_bandwidth * calibrated_efficiency("h100-sxm", "bf16").memory_peak


def test_bytes_per_parameter_over_a_one_rank_shard_group():
    sharding = Sharding(stage=3, degree=1, fsdp=True, param_bytes=2, grad_bytes=4, shard_bytes=4)
    assert sharding.unshard_copy_bytes() == 4 + 2 + 2 + 2
    assert sharding.one_rank_reduce_bytes() == 4 + 4
    # Over a larger group the same cast and copy are the copy-in, 1/degree of the unit.
    assert Sharding(stage=3, degree=4, fsdp=True, shard_bytes=4).gather_copy_bytes() == (10 / 4, 4.0)


def _rank0_ops(*overrides: str) -> list:
    loaded = scenario_from_text(HSDP, "inline.yaml", list(overrides))
    return [op for op in step_program(loaded, scenario_topology(loaded), fold=True).ops if op.rank == 0]


def test_units_are_unsharded_by_a_copy_on_the_compute_stream_without_a_gather():
    ops = _rank0_ops()
    names = [op.name for op in ops]
    assert not [name for name in names if name.startswith(("all_gather params", "reduce_scatter grads",
                                                           "fsdp copy-in", "fsdp copy-out"))]
    assert not [op for op in ops if isinstance(op, CollectiveOp) and len(op.group) == 1]
    unshards = [op for op in ops if op.name.startswith("fsdp unshard copy ")]
    # Every unit for each micro-batch's forward and, but the head (kept gathered), again for its backward.
    assert len(unshards) == M * (2 * (LAYERS + 2) - 1)
    assert {op.stream for op in unshards} == {"compute"}
    assert {op.category for op in unshards} == {"forward", "backward"}
    layer = next(op for op in unshards if op.name == "fsdp unshard copy L0")
    assert layer.duration == pytest.approx(LAYER * 10 / COPY_RATE, rel=1e-12)
    embedding = next(op for op in unshards if op.name == "fsdp unshard copy embedding")
    assert embedding.duration == pytest.approx(embedding_rank_params(MODEL, TP) * 10 / COPY_RATE, rel=1e-12)


def test_gradients_are_copied_on_the_reduce_stream_and_all_reduced_whole_across_the_replicas():
    ops = _rank0_ops()
    copies = [op for op in ops if op.name.startswith("fsdp reduce copy-out ")]
    # Reduced every micro-batch (FSDP2 syncs each backward without pipelining): each unit's once per micro-batch.
    assert len(copies) == M * (LAYERS + 2)
    assert all(isinstance(op, ComputeOp) and op.stream == "dp" for op in copies)
    layer = next(op for op in copies if op.name == "fsdp reduce copy-out L0")
    assert layer.duration == pytest.approx(LAYER * 2 * 4 / COPY_RATE, rel=1e-12)
    reduces = {op.name: op for op in ops if op.name.startswith("all_reduce shard ")}
    assert len(reduces) == LAYERS + 2  # the last micro-batch's, on FSDP2's all-reduce stream
    last_copy = {op.name.removeprefix("fsdp reduce copy-out "): op for op in copies}  # the final backward's
    reduce = reduces["all_reduce shard L0"]
    assert (reduce.stream, reduce.group, reduce.nbytes) == ("dp_all_reduce", (0, 8), LAYER * 4)
    assert reduce.deps == (last_copy["L0"].id,)
    step = next(op for op in ops if op.name == "optimizer step")
    assert {op.id for op in copies} <= set(step.deps)


def test_memory_keeps_the_whole_fp32_state_and_no_prefetched_unit():
    loaded = scenario_from_text(HSDP, "inline.yaml", [])
    (breakdown, _), = stage_memory(loaded.scenario, build_training_step(loaded.scenario, scenario_topology(loaded)))
    params = rank_params(MODEL, TP, LAYERS, first_stage=True, last_stage=True)
    assert (breakdown.params, breakdown.grads, breakdown.optimizer) == pytest.approx(
        (params * 4, params * 4, params * 8), rel=1e-12)
    # The largest set is the head's post-backward: its bf16 parameters and gradients' copy into the fp32
    # reduce-scatter input (2 + 4 B), no previous unit prefetched (a gathering group would add 2 B x a layer).
    assert HEAD > 2 * LAYER
    assert breakdown.buffers == pytest.approx(HEAD * (2 + 4), rel=1e-12)


ONE_REPLICA = f"""
cluster: {{topology: dgx-h100}}
model: {{preset: llama3-8b, layers: {LAYERS}}}
training: {{seq_len: 1024, global_batch: {M}, micro_batch: 1}}
parallelism: {{tp: {TP}, dp: 1, sequence_parallel: true}}
"""


@pytest.mark.parametrize("strategy", ["full_shard", "hybrid_shard"])
def test_one_data_parallel_rank_keeps_fp32_shards_and_the_one_rank_copies(strategy):
    """fully_shard over a one-rank mesh (dp x cp = 1) takes the same world_size == 1 path: fp32 shards updated in
    place (4 + 4 + 8 B, optimizer 32 B), an unshard copy per gather and a reduce copy per unit. It kept 16-bit
    weights with a master copy (2 + 4 + 12 B, optimizer 38 B) and ran no copy, while one more replica (the HSDP
    scenario above) switched to fp32 shards and lowered the state per GPU by 2 B/param."""
    loaded = scenario_from_text(ONE_REPLICA, "inline.yaml", [f"parallelism.fsdp={strategy}"])
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    (breakdown, _), = stage_memory(loaded.scenario, step)
    params = rank_params(MODEL, TP, LAYERS, first_stage=True, last_stage=True)
    assert (breakdown.params, breakdown.grads, breakdown.optimizer) == pytest.approx(
        (params * 4, params * 4, params * 8), rel=1e-12)
    assert breakdown.buffers == pytest.approx(HEAD * (2 + 4), rel=1e-12)
    assert step.plan.optimizer_s[0] == pytest.approx(params * 32 / COPY_RATE, rel=1e-12)
    ops = [op for op in step_program(loaded, scenario_topology(loaded), fold=True).ops if op.rank == 0]
    assert len([op for op in ops if op.name.startswith("fsdp unshard copy ")]) == M * (2 * (LAYERS + 2) - 1)
    assert len([op for op in ops if op.name.startswith("fsdp reduce copy-out ")]) == M * (LAYERS + 2)
    assert not [op for op in ops if isinstance(op, CollectiveOp) and op.stream.startswith("dp")]
