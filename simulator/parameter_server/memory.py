"""What a worker and a server GPU of a parameter-server run hold, and the summary's memory entries.

A worker holds the whole model's weights and gradients, the gradients in the parameters' format it pushes them
in (the optimizer state lives on the servers), and the activations of one micro-batch at a time (Korthikanti et
al., as workload/memory.py computes them, with the layer a recompute is rebuilding). A server GPU
holds its stripe's weights in the training precision (what workers pull), the optimizer state with the fp32
master copy, a buffer for the gradient being applied and, under sync, the fp32 sum of the iteration's pushes.
"""

from __future__ import annotations

from simulator.catalog.gpus import GPUSpec
from simulator.catalog.models import ModelSpec
from simulator.config.schema import Scenario, TrainingConfig
from simulator.config.training_options import PARAM_DTYPE, GradReduceDtype
from simulator.workload.memory import (
    MemoryBreakdown,
    activation_bytes_per_layer,
    head_activation_bytes,
    recompute_working_bytes,
    state_bytes_per_param,
)
from simulator.workload.memory_plan import (
    GIB,
    breakdown_gib,
    peak_memory_entries,
    rematerialized_activations,
    stored_activations,
)
from simulator.workload.training import PRECISION_BYTES
from simulator.workload.transformer import ShardShape


def pushed_grad_dtype(training: TrainingConfig) -> GradReduceDtype:
    """Workers push gradients in the parameters' format, and servers keep and update them in it (not the fp32
    reduction buffers of data-parallel training)."""
    return PARAM_DTYPE[training.precision]


SUM_BYTES_PER_PARAM = 4
"""The fp32 sum a sync server keeps of the iteration's pushed gradients."""


def worker_memory(scenario: Scenario, model: ModelSpec, parameters: int) -> MemoryBreakdown:
    """A worker: weights and gradients of every parameter, one micro-batch's activations and, with recompute,
    the layer its backward is recomputing (memory.recompute_working_bytes)."""
    training = scenario.training
    state = state_bytes_per_param(training.precision, training.optimizer, pushed_grad_dtype(training))
    shard = ShardShape(training.micro_batch, training.seq_len, dtype_bytes=PRECISION_BYTES[training.precision])
    stored = stored_activations(training)
    activations = (model.layers * activation_bytes_per_layer(model, shard, stored)
                   + head_activation_bytes(model, shard))
    working = recompute_working_bytes(model, shard, stored, rematerialized_activations(training))
    return MemoryBreakdown(params=parameters * state.param, grads=parameters * state.grad, optimizer=0.0,
                           activations=activations, buffers=working)


def server_memory(scenario: Scenario, stripe_params: float) -> MemoryBreakdown:
    """A server GPU holding ``stripe_params`` parameters."""
    training = scenario.training
    state = state_bytes_per_param(training.precision, training.optimizer, pushed_grad_dtype(training))
    assert scenario.ps is not None
    summed = SUM_BYTES_PER_PARAM if scenario.ps.mode == "sync" else 0
    return MemoryBreakdown(params=stripe_params * state.param, grads=stripe_params * (state.grad + summed),
                           optimizer=stripe_params * state.optimizer)


def memory_entries(worker: MemoryBreakdown, worker_rank: int, server: MemoryBreakdown, server_rank: int,
                   gpu: GPUSpec) -> tuple[dict, dict]:
    """The summary's memory keys for the fuller of the two (peak, breakdown, capacity, out of memory, rank),
    and the `parameter_server.memory_gib` entry with both."""
    peak, rank = max((worker, worker_rank), (server, server_rank), key=lambda pair: pair[0].total)
    both = {role: {**breakdown_gib(held), "total": held.total / GIB} for role, held in (("worker", worker),
                                                                                      ("server", server))}
    return peak_memory_entries(peak, rank, gpu.hbm_bytes), both
