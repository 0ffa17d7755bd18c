"""A parameter-server run as a step program: several iterations of every worker's compute, gradient pushes,
server updates and parameter pulls, with the waiting rule of the mode expressed as dependencies.

Per worker and iteration: forward and backward of the whole model (the transformer cost model, times the
iteration's drawn slowdown), then a push of each server GPU's stripe of the gradient and, once the server lets
it, a pull of the same stripe of the parameters; the next iteration starts when every pull is in. A server
GPU applies what arrives one gradient at a time (a serial stream, first come first served):

- sync: each push is added into an fp32 sum; once all workers' pushes of the iteration are in, one optimizer
  update; every pull of the iteration waits for that update.
- async: each push is an optimizer update of its own; a worker's pull waits only for its own update.
- ssp (staleness k): as async, and the pull a worker needs before iteration i + 1 also waits until every
  worker's update of iteration i - k is applied, so no worker starts an iteration more than k ahead of the
  slowest's completed ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.catalog.gpus import GPUSpec, get_gpu
from simulator.catalog.models import ModelSpec
from simulator.config.parameter_server import ParameterServerConfig
from simulator.config.schema import Scenario
from simulator.faults.step import draw_factors
from simulator.parallel.passes import Pass
from simulator.parameter_server.memory import memory_entries, pushed_grad_dtype, server_memory, worker_memory
from simulator.parameter_server.placement import Placement, place, shard_tensors, stripe
from simulator.program.ops import COMPUTE_STREAM, Category, CollectiveOp, ComputeOp, Op
from simulator.program.ps_plan import PsEntries, PsModeEntries, PsPlan, PsTransfer
from simulator.program.step import StepProgram
from simulator.topology.graph import Topology
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.stage_work import CostContext, transformer_stages
from simulator.workload.training import (
    PRECISION_BYTES,
    microbatch_count,
    model_flops_per_token,
    optimizer_bytes_per_param,
    resolve_model,
)
from simulator.workload.transformer import AttentionCost, ShardShape

TRANSFER_STREAM = "ps"
"""Pushes and pulls, on workers and servers alike: asynchronous (each its own process, like isend/irecv)."""
UPDATE_STREAM = "ps_update"
"""A server GPU's updates: serial, in the order the gradients arrive."""
ACCUMULATE_EXTRA_BYTES = 8
"""HBM bytes per parameter of adding a pushed gradient into the fp32 sum, besides reading the gradient: read
and write the 4-byte sum."""
SLOWDOWN_STREAM = 0x50534954
"""Mixed into the seed of the per-iteration slowdown draws, so other users of `run.seed` draw independently."""


@dataclass
class PsOps:
    """Op lists of every worker and server GPU, with ids in creation order, and what the summary needs to read
    them back: each push and pull by key (``transfers``), each server update's name with the worker whose gradient
    it applies (``update_owner``)."""

    ops: list[Op] = field(default_factory=list)
    transfers: dict[str, PsTransfer] = field(default_factory=dict)
    update_owner: dict[str, int | None] = field(default_factory=dict)

    def compute(self, rank: int, stream: str, name: str, duration: float, deps: list[int], category: Category,
                iteration: int, flops: float = 0.0, hbm_bytes: float = 0.0) -> int:
        self.ops.append(ComputeOp(id=len(self.ops), rank=rank, stream=stream, name=name, deps=tuple(deps),
                                  category=category, microbatch=iteration, duration=duration, flops=flops,
                                  hbm_bytes=hbm_bytes))
        return len(self.ops) - 1

    def update(self, endpoint: int, name: str, hbm_bytes: float, server: ServerCost, deps: list[int],
               iteration: int) -> int:
        """A memory-bound step on a server GPU's update stream."""
        return self.compute(endpoint, UPDATE_STREAM, name, hbm_bytes * server.seconds_per_byte, deps, "optimizer",
                            iteration, hbm_bytes=hbm_bytes)

    def transfer(self, pull: bool, iteration: int, worker: int, endpoint: int, nbytes: int,
                 src_deps: list[int], dst_deps: list[int]) -> tuple[int, int]:
        """Both sides of a push (worker -> server GPU) or a pull (server GPU -> worker): the sender's op id,
        the receiver's."""
        name = "pull" if pull else "push"
        key = transfer_key(name, iteration, worker, endpoint)
        self.transfers[key] = PsTransfer(pull, iteration, worker, endpoint)
        src, dst = (endpoint, worker) if pull else (worker, endpoint)
        ids = []
        for rank, deps in ((src, src_deps), (dst, dst_deps)):
            self.ops.append(CollectiveOp(id=len(self.ops), rank=rank, stream=TRANSFER_STREAM, name=name,
                                         deps=tuple(deps), category="dp", microbatch=iteration, op="send_recv",
                                         group=(src, dst), nbytes=float(nbytes), key=key))
            ids.append(len(self.ops) - 1)
        return ids[0], ids[1]


def transfer_key(kind: str, iteration: int, worker: int | None = None, endpoint: int | None = None) -> str:
    """The key of a push or pull: `ps.<kind>.i<iteration>.w<worker GPU>.e<server GPU>`; without the GPUs,
    `ps.<kind>.i<iteration>`, the exchange of the iteration's pushes (or pulls), which the analytic model times
    as one collective."""
    exchange = f"ps.{kind}.i{iteration}"
    return exchange if worker is None else f"{exchange}.w{worker}.e{endpoint}"


def comparison_allreduce(workers: tuple[int, ...], nbytes: int) -> tuple[Op, ...]:
    """One ring all-reduce of ``nbytes`` over ``workers``: what the servers' exchange is compared with."""
    return tuple(CollectiveOp(id=index, rank=w, stream="dp", name="all-reduce", category="dp", op="all_reduce",
                              group=workers, nbytes=float(nbytes), key="allreduce", algorithm="ring")
                 for index, w in enumerate(workers))


@dataclass(frozen=True)
class WorkerCost:
    """One worker's iteration: forward and backward of the whole model over its micro-batches (seconds, FLOPs
    and HBM bytes), the model's parameter tensors and the micro-batches per iteration."""

    forward_s: float
    backward_s: float
    forward_flops: float
    backward_flops: float
    tensors: tuple[int, ...]
    microbatches: int
    forward_bytes: float = 0.0
    backward_bytes: float = 0.0


def worker_cost(scenario: Scenario, model: ModelSpec, gpu: GPUSpec, workers: int) -> WorkerCost:
    """The transformer cost model for the whole model on one GPU (no TP, CP or PP), micro-batches from
    `training.microbatches` or the global batch over the workers."""
    training = scenario.training
    shard = ShardShape(training.micro_batch, training.seq_len, dtype_bytes=PRECISION_BYTES[training.precision])
    cost = CostContext(gpu, training.precision, calibrated_efficiency(gpu.name, training.precision),
                       AttentionCost.for_kernel(training.attention))
    (stage,) = transformer_stages(model, shard, training.recompute, cost, [model.layers])
    blocks = stage.blocks
    m = microbatch_count(scenario, workers, "workers")
    return WorkerCost(forward_s=m * sum(b.forward_s for b in blocks),
                      backward_s=m * sum(b.backward_input_s + b.backward_weight_s + b.recompute_s for b in blocks),
                      forward_flops=m * sum(b.forward_flops for b in blocks),
                      backward_flops=m * sum(b.backward_flops + b.recompute_flops for b in blocks),
                      tensors=tuple(round(size) for b in blocks for size in b.tensors), microbatches=m,
                      forward_bytes=m * sum(b.pass_hbm_bytes(Pass.FORWARD) for b in blocks),
                      backward_bytes=m * sum(b.pass_hbm_bytes(Pass.BACKWARD) + b.pass_hbm_bytes(Pass.RECOMPUTE)
                                             for b in blocks))


def ps_program(scenario: Scenario, topology: Topology) -> StepProgram:
    """Every worker's and server's ops over `ps.iterations` iterations, and the plan the summary reads back."""
    config = scenario.ps
    assert config is not None  # the schema pairs strategy parameter_server with a ps: section
    placement = place(config, topology)
    training = scenario.training
    model = resolve_model(scenario)
    gpu = get_gpu(topology.gpu_model)
    workers, n = placement.workers, config.iterations
    cost = worker_cost(scenario, model, gpu, len(workers))
    element = PRECISION_BYTES[training.precision]
    held = shard_tensors(cost.tensors, len(placement.server_hosts), config.sharding)
    slowdown = np.ones((len(workers), n))
    if config.iteration_slowdown is not None:
        rng = np.random.default_rng([SLOWDOWN_STREAM, scenario.run.seed % 2**63])
        slowdown = draw_factors(config.iteration_slowdown, (len(workers), n), rng)
    seconds_per_byte = 1.0 / (gpu.hbm_bandwidth * calibrated_efficiency(gpu.name, training.precision).memory_peak)
    server = ServerCost(endpoint_bytes(placement, held, element, topology), element,
                        optimizer_bytes_per_param(training.optimizer, training.precision,
                                                  pushed_grad_dtype(training)), seconds_per_byte)
    built = build_ops(config, placement, cost, server, slowdown)
    per_iteration = len(workers) * cost.microbatches * training.micro_batch
    samples = per_iteration * n
    tokens = samples * training.seq_len
    parameters = sum(cost.tensors)
    mode: PsModeEntries = ({"mode": config.mode} if config.staleness is None  # the schema: staleness iff ssp
                           else {"mode": config.mode, "staleness": config.staleness})
    entries: PsEntries = {
        **mode,
        "sharding": config.sharding, "iterations": n, "server_hosts": list(placement.server_hosts),
        "server_gpus": list(placement.endpoints), "workers": len(workers), "worker_gpus": list(workers),
        "samples_per_iteration": per_iteration,
        "tokens_per_sample": training.seq_len, "parameters": parameters, "parameter_bytes": parameters * element,
        "server_parameter_bytes": [params * element for params in held],
        "worker_compute_s": cost.forward_s + cost.backward_s,
    }
    busiest = max(placement.endpoints, key=lambda e: (server.stripe_bytes[e], -e))
    memory, memory_gib = memory_entries(worker_memory(scenario, model, parameters), workers[0],
                                        server_memory(scenario, server.stripe_bytes[busiest] / element), busiest, gpu)
    entries["memory_gib"] = memory_gib
    details = {"parameter_server": entries,
               "layout": {"strategy": "parameter_server", "dp": len(workers), "microbatches": cost.microbatches,
                          "model": model.name, "gpu": gpu.name}}
    ranks = tuple(sorted((*workers, *placement.endpoints)))
    plan = PsPlan(entries=entries, sync=config.mode == "sync", transfers=built.transfers,
                  update_owner=built.update_owner,
                  comparison=comparison_allreduce(tuple(workers), parameters * element))
    return StepProgram(ops=tuple(built.ops), world=topology.num_gpus, ranks=ranks,
                       tokens_per_step=float(tokens),
                       model_flops_per_step=model_flops_per_token(model, training.seq_len) * tokens,
                       peak_flops=gpu.peak(training.precision), async_streams=frozenset({TRANSFER_STREAM}),
                       serial_streams=frozenset({UPDATE_STREAM}), memory=memory, details=details, pipelined=False,
                       parameter_server=plan, training_ranks=tuple(workers),
                       exchanges={key: transfer_key("pull" if moved.pull else "push", moved.iteration)
                                  for key, moved in built.transfers.items()})


@dataclass(frozen=True)
class ServerCost:
    """What a server GPU moves and spends per push: its stripe's bytes (``stripe_bytes`` by GPU), and the
    memory-bound costs of adding a gradient into the sum and of an optimizer update of the stripe."""

    stripe_bytes: dict[int, int]
    element_bytes: int
    optimizer_bytes_per_param: float
    seconds_per_byte: float

    def accumulate(self, endpoint: int) -> float:
        """HBM bytes of adding one pushed gradient stripe into the fp32 sum."""
        return self.stripe_bytes[endpoint] / self.element_bytes * (self.element_bytes + ACCUMULATE_EXTRA_BYTES)

    def update(self, endpoint: int) -> float:
        """HBM bytes of one optimizer update of the stripe."""
        return self.stripe_bytes[endpoint] / self.element_bytes * self.optimizer_bytes_per_param


def build_ops(config: ParameterServerConfig, placement: Placement, cost: WorkerCost, server: ServerCost,
              slowdown: np.ndarray) -> PsOps:
    """The ops of every iteration, with the mode's waiting rule as dependencies (see the module docstring)."""
    ops = PsOps()
    workers, endpoints = placement.workers, placement.endpoints
    pulled: dict[int, list[int]] = {w: [] for w in workers}
    applied: dict[tuple[int, int, int], int] = {}  # (worker, iteration, server GPU) -> the update of that push
    for i in range(config.iterations):
        received: dict[int, list[tuple[int, int]]] = {e: [] for e in endpoints}
        pushed: dict[tuple[int, int], int] = {}
        for index, w in enumerate(workers):
            factor = float(slowdown[index, i])
            forward = ops.compute(w, COMPUTE_STREAM, "forward", cost.forward_s * factor, pulled[w], "forward", i,
                                  flops=cost.forward_flops, hbm_bytes=cost.forward_bytes)
            backward = ops.compute(w, COMPUTE_STREAM, "backward", cost.backward_s * factor, [forward], "backward",
                                   i, flops=cost.backward_flops, hbm_bytes=cost.backward_bytes)
            for e in endpoints:
                push, recv = ops.transfer(False, i, w, e, server.stripe_bytes[e], [backward], [])
                pushed[(w, e)] = push
                received[e].append((w, recv))
        ready: dict[tuple[int, int], int] = {}
        for e in endpoints:
            if config.mode == "sync":
                sums = [ops.update(e, f"accumulate w{w}", server.accumulate(e), server, [recv], i)
                        for w, recv in received[e]]
                ops.update_owner["update"] = None
                update = ops.update(e, "update", server.update(e), server, sums, i)
                ready.update(((w, e), update) for w in workers)
                continue
            for w, recv in received[e]:
                name = f"update w{w}"
                ops.update_owner[name] = w
                ready[(w, e)] = applied[(w, i, e)] = ops.update(e, name, server.update(e), server, [recv], i)
        slowest = i - (config.staleness or 0)
        for w in workers:
            pulls = []
            for e in endpoints:
                server_deps = [ready[(w, e)]]
                if config.mode == "ssp" and slowest >= 0:
                    server_deps += [applied[(other, slowest, e)] for other in workers]
                _, pull = ops.transfer(True, i, w, e, server.stripe_bytes[e], server_deps, [pushed[(w, e)]])
                pulls.append(pull)
            pulled[w] = pulls
    return ops


def endpoint_bytes(placement: Placement, held: tuple[int, ...], element: int,
                    topology: Topology) -> dict[int, int]:
    """Bytes of gradient (and of parameters) each server GPU takes per worker and iteration: its server's
    shard striped over the host's GPUs."""
    result: dict[int, int] = {}
    for server, host in enumerate(placement.server_hosts):
        gpus = topology.host_gpus(host)
        result.update(zip(gpus, stripe(held[server] * element, len(gpus))))
    return result
