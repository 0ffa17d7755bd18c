"""PyTorch FSDP accumulates gradients itself: nothing fused into the weight-gradient GEMMs (Megatron-LM's
--gradient-accumulation-fusion), but FSDP2's post-backward casts, adds and copies the gradients autograd wrote
(torch 2.13, torch/distributed/fsdp/_fully_shard), and shard_grad_op's accumulators live only from a chunk's
first gradient action to its last. Bytes per weight, the copies' time in a step and the Llama 3 405B peaks,
against closed forms; the framework's default and its refusal."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest
from shared import GIB, SCENARIOS

from simulator import load_scenario
from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import get_model
from simulator.config.loader import scenario_from_text
from simulator.config.schema import TrainingConfig
from simulator.parallel.sharding import Sharding
from simulator.program.ops import ComputeOp
from simulator.scale import sized_topology
from simulator.simulation import step_program
from simulator.topology.loader import scenario_topology
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.memory import rank_params
from simulator.workload.memory_plan import DDP_BUCKET_COPIES, stage_memory
from simulator.workload.training import build_training_step
from simulator.workload.transformer import ShardShape, layer_kernels

ACCUMULATING = Sharding(stage=3, degree=8, grad_bytes=4, param_bytes=2, fsdp=True)
"""bf16 training, fp32 reduce dtype (FSDP2's MixedPrecisionPolicy as torchtitan sets it)."""
COPY_RATE = get_gpu("h100-sxm").hbm_bandwidth * calibrated_efficiency("h100-sxm", "bf16").memory_peak
LAYERS, M = 4, 4
FSDP_8B = f"""
cluster: {{topology: dgx-h100}}
model: {{preset: llama3-8b, layers: {LAYERS}}}
training: {{seq_len: 1024, global_batch: {8 * M}, micro_batch: 1}}
parallelism: {{dp: 8, fsdp: full_shard}}
"""
PUBLISHED = SCENARIOS / "published"


def test_bytes_per_weight_of_fsdp_gradient_copies():
    # Reduced every micro-batch: foreach_reduce's chunk_cat reads the bf16 gradient, writes the fp32 input.
    every = replace(ACCUMULATING, reduce_every_microbatch=True)
    for first, final, pipelined in product((True, False), repeat=3):
        assert every.grad_copy_bytes(first, final, pipelined) == (2 + 4, 0.0)
    # Accumulated: cast (read 2, write 4), then add (read 2 and 4, write 4), then the accumulator copied into the
    # reduce-scatter input (read 4, write 4): in the last backward, or in the pipelined stage's REDUCE_GRAD.
    assert ACCUMULATING.grad_copy_bytes(True, False, False) == (6.0, 0.0)
    assert ACCUMULATING.grad_copy_bytes(False, False, True) == (10.0, 0.0)
    assert ACCUMULATING.grad_copy_bytes(False, True, False) == (10.0 + 8.0, 0.0)
    assert ACCUMULATING.grad_copy_bytes(False, True, True) == (10.0, 8.0)
    # One backward: without pipelining it reduces autograd's gradient directly; a pipelined stage casts it first.
    assert ACCUMULATING.grad_copy_bytes(True, True, False) == (6.0, 0.0)
    assert ACCUMULATING.grad_copy_bytes(True, True, True) == (6.0, 8.0)
    # A bf16 reduce dtype: autograd's .grad is the accumulator (no cast; AccumulateGrad reads 2 + 2, writes 2).
    bf16 = replace(ACCUMULATING, grad_bytes=2)
    assert bf16.grad_copy_bytes(True, False, False) == (0.0, 0.0)
    assert bf16.grad_copy_bytes(False, False, False) == (6.0, 0.0)
    assert bf16.grad_copy_bytes(False, True, True) == (6.0, 4.0)


def test_fusion_resolves_by_framework_and_fsdp_kernels_leave_the_add_to_fsdp():
    assert TrainingConfig().fused_grad_accumulation(fsdp=False)
    assert not TrainingConfig().fused_grad_accumulation(fsdp=True)
    assert not TrainingConfig(grad_accumulation_fusion=False).fused_grad_accumulation(fsdp=False)
    model = get_model("llama3-8b")
    megatron = layer_kernels(model, ShardShape(1, 1024, fused_grad_accumulation=False))
    fsdp = ShardShape(1, 1024, fused_grad_accumulation=False, framework_copies=True)
    assert any(kernel.name.endswith(".accumulate") for kernel in megatron.backward_weight)
    assert not any(kernel.name.endswith(".accumulate") for kernel in layer_kernels(model, fsdp).backward_weight)


@pytest.mark.parametrize(("every", "per_weight"), [(True, 6.0 * M), (False, 6.0 + 10.0 * (M - 2) + 18.0)])
def test_a_steps_copies_take_their_bytes_at_the_hbm_rate(every, per_weight):
    # pp 1, dp 8, full_shard: every weight of the rank copied M times at 6 B (reduced every micro-batch), or cast
    # once, added M - 2 times and added and copied into the reduce-scatter input in the last backward.
    loaded = scenario_from_text(FSDP_8B, "inline.yaml", [f"parallelism.ddp.reduce_every_microbatch={every}"])
    ops = step_program(loaded, scenario_topology(loaded), fold=True).ops
    copies = [op for op in ops if isinstance(op, ComputeOp) and op.rank == 0
              and op.name.startswith(("fsdp grad copy", "fsdp reduce copy"))]
    params = rank_params(get_model("llama3-8b"), 1, LAYERS, first_stage=True, last_stage=True)
    assert sum(op.duration for op in copies) == pytest.approx(params * per_weight / COPY_RATE, rel=1e-12)
    assert {op.stream for op in copies} == {"compute"}


def _llama_405b_stage_1(gpus: int):
    loaded = load_scenario(PUBLISHED / f"llama3-405b-{gpus}-gpus.yaml",
                           ["parallelism.ddp.reduce_every_microbatch=false"])
    step = build_training_step(loaded.scenario, sized_topology(loaded, force=True))
    breakdown, _ = stage_memory(loaded.scenario, step)[1]
    return step, breakdown


@pytest.mark.parametrize(("gpus", "alive"), [(16384, 1), (8192, 8)])
def test_llama3_405b_shard_grad_op_holds_the_accumulators_of_the_chunks_in_their_backwards(gpus, alive):
    # fsdp: shard_grad_op accumulating over the micro-batches (interleaved, pp 16, v 8): pipeline rank 1 holds
    # 8 chunks of one layer. At 16k (m = 16) its chunks' backwards come one chunk after the other, so one
    # chunk's fp32 accumulator is alive at a time; at 8k (m = 32) all 8 are in the steady state. Beside them
    # the sharded fp32 gradients (ZeRO-2) and the two DDP buckets; no persistent whole-model gradient buffer.
    step, breakdown = _llama_405b_stage_1(gpus)
    layer = rank_params(get_model("llama3-405b"), 8, 1, first_stage=False, last_stage=False)
    dp = step.plan.layout.dp
    assert breakdown.buffers == pytest.approx(DDP_BUCKET_COPIES * 25 * 2**20 + alive * 4 * layer, rel=1e-12)
    assert breakdown.grads == pytest.approx(8 * layer * 4 / dp, rel=1e-12)
    capacity = step.gpu.hbm_bytes
    assert (breakdown.total < capacity) == (gpus == 16384)
    if gpus == 16384:
        assert breakdown.total / GIB == pytest.approx(71.34, abs=0.01)
