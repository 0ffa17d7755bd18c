"""The gradient buffer's format (`training.grad_reduce_dtype`) is one thing: the bytes the data-parallel
reduction sends per gradient and the bytes memory holds per gradient both come from it, and its default is
the framework's: Megatron-LM's (fp32 for bf16 and fp8, the parameters' fp16 for fp16), DeepSpeed's under
`zero: 3` (the parameters' 16 bits), torchtitan's fp32 under PyTorch FSDP."""

from __future__ import annotations

import pytest

from simulator.config.loader import scenario_from_text
from simulator.parallel.program import ProgramBuilder
from simulator.program.ops import CollectiveOp
from simulator.topology.loader import scenario_topology
from simulator.workload.memory_plan import stage_memory
from simulator.workload.training import build_training_step

LLAMA_8B_DP8 = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 1, pp: 1, dp: 8, zero: 0, ddp: {bucket: 1 GiB}}
"""


def _per_gradient_bytes(*overrides: str) -> tuple[float, float, float]:
    """(buffer bytes of rank 0's DP gradient collectives per parameter, gradient bytes memory holds per
    parameter, bytes per weight of the parameter all-gather) for the 8B model on 8 data-parallel ranks."""
    loaded = scenario_from_text(LLAMA_8B_DP8, "inline.yaml", list(overrides))
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    sent = {"grads": 0.0, "params": 0.0}
    for op in ProgramBuilder(step.plan, fold=False).build():
        if isinstance(op, CollectiveOp) and op.rank == 0:
            sent["params" if op.name.startswith("all_gather params") else "grads"] += op.nbytes
    (breakdown, _), = stage_memory(loaded.scenario, step)
    params = step.plan.stages[0].params
    return sent["grads"] / params, breakdown.grads / params, sent["params"] / params


@pytest.mark.parametrize(("overrides", "grad_bytes"), [
    ((), 4.0),  # bf16: Megatron-LM forces an fp32 main_grad buffer and reduces it
    (("training.grad_reduce_dtype=bf16",), 2.0),  # --grad-reduce-in-bf16
    (("training.precision=fp8",), 4.0),
    (("training.precision=fp16",), 2.0),  # the fp16 parameters' buffer (no --accumulate-allreduce-grads-in-fp32)
    (("training.precision=fp16", "training.grad_reduce_dtype=fp32"), 4.0),
    (("training.precision=fp32",), 4.0),
])
def test_reduction_traffic_and_memory_hold_the_buffer_format(overrides, grad_bytes):
    sent, held, _ = _per_gradient_bytes(*overrides)
    assert sent == pytest.approx(grad_bytes, rel=1e-12)
    assert held == pytest.approx(grad_bytes, rel=1e-12)


def test_zero1_reduce_scatters_the_buffer_and_gathers_parameters_in_the_training_precision():
    sent, held, gathered = _per_gradient_bytes("parallelism.zero=1")
    assert (sent, held, gathered) == pytest.approx((4.0, 4.0, 2.0), rel=1e-12)


@pytest.mark.parametrize(("overrides", "grad_bytes"), [
    (("parallelism.zero=3",), 2.0),  # DeepSpeed's communication_data_type and ZeRO grad_accum_dtype: bf16
    (("parallelism.zero=3", "training.precision=fp8"), 2.0),  # fp8 through Transformer Engine keeps bf16 on
    (("parallelism.zero=3", "training.precision=fp16"), 2.0),
    (("parallelism.zero=3", "training.grad_reduce_dtype=fp32"), 4.0),  # communication_data_type: fp32
    (("parallelism.fsdp=full_shard",), 4.0),  # torchtitan's mixed_precision_reduce: float32
])
def test_zero3_reduces_and_holds_gradients_in_its_frameworks_format(overrides, grad_bytes):
    sent, held, _ = _per_gradient_bytes(*overrides)
    assert sent == pytest.approx(grad_bytes, rel=1e-12)
    assert held == pytest.approx(grad_bytes / 8, rel=1e-12)


def test_a_buffer_format_the_precision_cannot_reduce_in_is_refused_at_load(validation_error):
    error = validation_error(LLAMA_8B_DP8, "training.grad_reduce_dtype=fp16")
    assert error.field == "training.grad_reduce_dtype"
    assert error.allowed == "fp32, bf16 (default fp32, under zero: 3 bf16)"
