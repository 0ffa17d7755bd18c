"""Memory per pipeline stage of a training step, from the memory model and the schedule's in-flight
micro-batches, plus small facts about the step the summary reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from simulator.catalog.models import ModelSpec
from simulator.config.schema import FsdpStrategy, Scenario, TrainingConfig
from simulator.config.training_options import Recompute
from simulator.parallel.work import layer_experts, layer_units
from simulator.schedules.timing import peak_held_weight, peak_in_flight, transient_excess
from simulator.workload import memory
from simulator.workload.memory import MemoryBreakdown
from simulator.workload.stage_work import layers_per_stage
from simulator.workload.training import TrainingStep
from simulator.workload.transformer import ShardShape

GIB = 2.0**30

UNMODELLED_BYTES = GIB
"""The least the memory plan leaves out of every GPU's peak, a floor and not a model: the CUDA context (a few
hundred MiB, docs/cost-model.md), NCCL's buffers and the caching allocator's fragmentation. NCCL's buffers grow
with each communicator and linearly with its channels (NVIDIA/nccl#986, a maintainer's answer on #864, where one
communicator's all-reduce took about 1.6 GB and three or more about 6 GB); #964 measured 544 MB per process
group of two A100 and 688 MB of more, and #1685 a first all-to-all over 8 H100 taking NCCL from 1.06 to 4.34 GB.
A job's TP, PP and DP groups each hold one (docs/training-step.md, "Memory"). A layout that fits with less room
than this is `tight_fit`."""

DDP_BUCKET_COPIES = 2.0
"""An approximation: DDP's communication buffers taken as two buckets' worth (one reduced, the next filled).
Neither framework allocates that: PyTorch's reducer (reducer.cpp `initialize_buckets`) gives every bucket a flat
buffer, a full copy of the gradients with gradient_as_bucket_view=False (its default) and nothing beyond them
with True, where the gradients are views into the buckets; Megatron-LM's buckets are views into its one gradient
buffer (ParamAndGradBuffer), nothing more."""


def ddp_bucket_bytes(bucket_bytes: float, gradient_bytes: float) -> float:
    """DDP's buffers as modelled, two buckets (`DDP_BUCKET_COPIES`, an approximation of neither framework's
    allocation), at most the ``gradient_bytes`` the rank's buckets hold:
    buckets partition the gradients (PyTorch's reducer, `compute_bucket_assignment_by_size`, closes a bucket
    once it reaches the cap, so a cap above the gradients makes one bucket of all of them; Megatron-LM's
    ParamAndGradBuffer cuts its buckets out of the one gradient buffer), so a bucket of 10 GiB on a rank of
    8 GiB of gradients holds 8 GiB, not 20."""
    return min(DDP_BUCKET_COPIES * bucket_bytes, gradient_bytes)


def stage_memory(scenario: Scenario, step: TrainingStep) -> list[tuple[MemoryBreakdown, float]]:
    """Peak memory of one rank of each pipeline stage (ranks of a stage are alike), with the micro-batches of
    activations it holds at its peak: the chunks in flight weighted by the activations each keeps, so a rank
    whose chunks differ (Llama 3's embedding-only first chunk) is counted exactly, and under zero-bubble
    schedules what each deferred W keeps from its B (chunk_weight_grad_bytes), walking the rank's order.
    ZeRO-2 with gradient accumulation keeps the full gradient buffer (the gradients are reduce-scattered
    once, after the last micro-batch), so its memory is ZeRO-1's then (Megatron-LM's persistent main_grad),
    unless each micro-batch's gradients are reduce-scattered (``reduce_every_microbatch``) or it is PyTorch
    FSDP's shard_grad_op, whose accumulators live only from a chunk's first gradient action to its last
    (fsdp_accumulator_bytes). Buffers: PyTorch FSDP's unsharded working set of wrapped units
    (memory.fsdp_working_set_bytes), DeepSpeed ZeRO-3's two gathered layers, two layers of gradients for
    sharded gradient steps, or DDP's two buckets (with shard_grad_op's accumulators); with recompute, also the
    layer the backward recomputes (memory.recompute_working_bytes), on every stage that holds layers, by what it
    adds to the peak of the rank's order (timing.transient_excess): all of it after a forward, nothing where
    deferred W's set the peak after a B (zero-bubble schedules)."""
    plan, model = step.plan, step.model
    layout, training, par = plan.layout, scenario.training, scenario.parallelism
    if model is None:  # a synthetic step holds no bytes, but its schedule still keeps micro-batches in flight
        return [(MemoryBreakdown(0.0, 0.0, 0.0), peak_in_flight(plan.schedule[pp_rank]) / plan.virtual_stages)
                for pp_rank in range(layout.pp)]
    counts = layers_per_stage(model.layers, layout.pp * plan.virtual_stages, par.pipeline.first_last_fewer_layers)
    shard = ShardShape(training.micro_batch, training.seq_len, layout.tp, layout.cp, plan.sequence_parallel,
                       dtype_bytes=int(plan.sharding.param_bytes), eager=training.kernels == "eager",
                       fsdp_weights=scenario.parallelism.fsdp is not None)
    dp_ways = layout.dp * layout.cp
    sharding = replace(plan.sharding, stage=held_stage(step))
    result = []
    kept_for_w = chunk_weight_grad_bytes(scenario, step)
    for pp_rank, per_vstage in enumerate(chunk_activation_bytes(scenario, step)):
        vstages = plan.rank_stages(pp_rank)
        layers = sum(counts[vs] for vs in vstages)
        chunk_bytes = [per_vstage[vs] for vs in vstages]
        working = memory.recompute_working_bytes(model, shard, stored_activations(training),
                                                 rematerialized_activations(training), step.routed_tokens)
        if sum(chunk_bytes) > 0:
            chunk_kept = [kept_for_w[pp_rank][vs] for vs in vstages]
            in_flight = peak_held_weight(plan.schedule[pp_rank], chunk_bytes, chunk_kept) / sum(chunk_bytes)
            recomputing = transient_excess(plan.schedule[pp_rank], chunk_bytes, chunk_kept,
                                           [working if counts[vs] else 0.0 for vs in vstages])
        else:
            in_flight = peak_in_flight(plan.schedule[pp_rank]) / plan.virtual_stages
            recomputing = working if layers else 0.0
        buffers = 0.0
        if (dp_ways > 1 or plan.sharding.fp32_shards) and plan.sharding.stage == 3 and plan.sharding.gather_per_layer:
            buffers = fsdp_buffer_bytes(step, pp_rank)
        elif dp_ways > 1 and plan.sharding.stage == 3:
            buffers = memory.unsharded_layers_bytes(model, layout.tp, element_bytes=plan.sharding.param_bytes)
        elif dp_ways > 1 and plan.sharding.sharded_grad_steps:
            buffers = memory.unsharded_layers_bytes(model, layout.tp, element_bytes=plan.sharding.grad_bytes)
        elif dp_ways > 1:
            gradients = rank_parameters(scenario, step, pp_rank)
            buffers = ddp_bucket_bytes(plan.sharding.bucket_bytes, gradients * plan.sharding.grad_bytes)
            if accumulates_whole_gradient(step) and plan.sharding.fsdp:
                buffers += fsdp_accumulator_bytes(step, pp_rank)
        buffers += recomputing
        breakdown = memory.rank_memory(
            model, shard, layers=layers, in_flight=in_flight, recompute=stored_activations(training),
            sharding=sharding,
            precision=training.precision, optimizer=training.optimizer,
            grad_reduce=training.gradient_buffer_dtype(scenario.parallelism.deepspeed_zero3),
            first_stage=0 in vstages,
            last_stage=layout.pp * plan.virtual_stages - 1 in vstages, buffer_bytes=buffers,
            ep=scenario.parallelism.ep, routed_tokens=step.routed_tokens)
        result.append((breakdown, in_flight))
    return result


def fsdp_buffer_bytes(step: TrainingStep, pp_rank: int) -> float:
    """What PyTorch FSDP holds unsharded on a rank of pipeline rank ``pp_rank``: without pipelining the working set of
    its units (memory.fsdp_working_set_bytes, without prefetched units over a one-rank shard group), plus the whole
    accumulated gradient in the reduce dtype when it does not sync every micro-batch (``reduce_every_microbatch:
    false``, its parameters' working set then without gradients); under pipelining (``stage_reduces_grads``) the
    chunks' parameters held from their first forward to their last gradient action, and their accumulated gradients
    (memory.fsdp_pipelined_bytes). gpipe and 1f1b gather a chunk before its first forward; the runtime of the other
    schedules gathers every chunk at the step's start (program._unshard_chunks), which leaves the peak where it is:
    no gradients are held before the rank's first gradient action, and a chunk's first gradient action follows the
    forward of that micro-batch on every chunk of the rank, so every chunk is gathered by then under both."""
    sharding = step.plan.sharding
    chunk_units = [wrapped_units(step, vs) for vs in step.plan.rank_stages(pp_rank)]
    if sharding.stage_reduces_grads:
        return memory.fsdp_pipelined_bytes(step.plan.schedule[pp_rank], chunk_units, sharding.param_bytes,
                                           sharding.grad_bytes)
    prefetches = sharding.degree > 1
    if sharding.defers_unit_grads:
        return max(memory.fsdp_working_set_bytes(units, sharding.param_bytes, 0.0, prefetches)
                   + sum(units) * sharding.grad_bytes for units in chunk_units)
    return max(memory.fsdp_working_set_bytes(units, sharding.param_bytes, sharding.grad_bytes, prefetches)
               for units in chunk_units)


def fsdp_accumulator_bytes(step: TrainingStep, pp_rank: int) -> float:
    """What PyTorch FSDP's shard_grad_op holds beside its sharded gradients on a rank of pipeline rank
    ``pp_rank`` when it accumulates over micro-batches: each chunk's ``unsharded_accumulated_grad`` in the
    reduce dtype, allocated at the chunk's first gradient action (to_accumulated_grad_if_needed) and freed
    after its reduce-scatter, following its last (memory.fsdp_pipelined_bytes's walk of the rank's actions,
    without parameters: shard_grad_op keeps them unsharded all step, counted as ZeRO-2 counts them)."""
    chunk_units = [wrapped_units(step, vs) for vs in step.plan.rank_stages(pp_rank)]
    return memory.fsdp_pipelined_bytes(step.plan.schedule[pp_rank], chunk_units, 0.0, step.plan.sharding.grad_bytes)


def wrapped_units(step: TrainingStep, vstage: int) -> list[float]:
    """Parameters per FSDP unit on one TP rank of virtual stage ``vstage``, in forward order: the blocks of
    one layer together, the embedding and the head (final norm and output layer) each a unit of its own; a MoE
    layer's with its routed experts where FSDP2 shards them (Sharding.shards_experts: gathered, held and
    reduced with their layer's unit)."""
    blocks = step.plan.stages[vstage].blocks
    experts = layer_experts(blocks) if step.plan.sharding.shards_experts else {}
    return [params + experts.get(layer, (0.0, 1))[0] for layer, (_, _, params) in layer_units(blocks).items()]


def chunk_activation_bytes(scenario: Scenario, step: TrainingStep) -> list[dict[int, float]]:
    """Per pipeline rank, the activation bytes one micro-batch leaves on each virtual stage the rank holds
    until its backward: its layers' (and on the last virtual stage the loss's fp32 logits)."""
    return _per_virtual_stage(scenario, step, lambda model, shard: (
        memory.activation_bytes_per_layer(model, shard, stored_activations(scenario.training), step.routed_tokens),
        memory.head_activation_bytes(model, shard)))


def chunk_weight_grad_bytes(scenario: Scenario, step: TrainingStep) -> list[dict[int, float]]:
    """Per pipeline rank, the bytes one micro-batch keeps on each virtual stage from its input-grad backward
    (B) to its deferred weight-grad pass (W) under zero-bubble schedules: its layers' weight GEMM inputs and
    output gradients (and on the last virtual stage the output layer's input and the logits' gradient)."""
    return _per_virtual_stage(scenario, step, lambda model, shard: (
        memory.weight_grad_bytes_per_layer(model, shard, step.routed_tokens),
        memory.head_weight_grad_bytes(model, shard)))


def _per_virtual_stage(scenario: Scenario, step: TrainingStep,
                       sizes: Callable[[ModelSpec, ShardShape], tuple[float, float]]) -> list[dict[int, float]]:
    """Per pipeline rank and virtual stage it holds: layers x the per-layer bytes ``sizes`` gives, plus its
    head bytes on the last virtual stage."""
    plan, model = step.plan, step.model
    layout, training = plan.layout, scenario.training
    if model is None:
        return [dict.fromkeys(plan.rank_stages(pp_rank), 0.0) for pp_rank in range(layout.pp)]
    counts = layers_per_stage(model.layers, layout.pp * plan.virtual_stages,
                              scenario.parallelism.pipeline.first_last_fewer_layers)
    shard = ShardShape(training.micro_batch, training.seq_len, layout.tp, layout.cp, plan.sequence_parallel,
                       dtype_bytes=int(plan.sharding.param_bytes), eager=training.kernels == "eager",
                       fsdp_weights=scenario.parallelism.fsdp is not None)
    layer_bytes, head_bytes = sizes(model, shard)
    last_vstage = layout.pp * plan.virtual_stages - 1
    return [{vs: counts[vs] * layer_bytes + (head_bytes if vs == last_vstage else 0.0)
             for vs in plan.rank_stages(pp_rank)} for pp_rank in range(layout.pp)]


def stored_activations(training: TrainingConfig) -> Recompute:
    """The recompute mode whose activation accounting applies to what the forward stores for the backward."""
    if training.recompute == "none":
        return rematerialized_activations(training)
    return training.recompute


def rematerialized_activations(training: TrainingConfig) -> Recompute:
    """The accounting of a layer's activations when all of them are kept (no recompute, or one layer while the
    backward recomputes it): flash attention keeps no score matrix for the backward, which saves exactly what
    selective recompute saves."""
    return "selective" if training.attention == "flash" else "none"


def memory_bound_share(step: TrainingStep) -> float:
    """Share of one micro-batch's compute time spent in blocks whose HBM traffic outlasts their math."""
    total = bound = 0.0
    for stage in step.plan.stages:
        for block in stage.blocks:
            seconds = block.forward_s + block.backward_input_s + block.backward_weight_s + block.recompute_s
            total += seconds
            bound += seconds if block.memory_bound else 0.0
    return bound / total if total else 0.0


def layout_summary(step: TrainingStep, fsdp: FsdpStrategy | None) -> dict:
    """The resolved layout and pipeline shape, for the summary; with ZeRO-3 under pipelining or without
    per-micro-batch sync (where PyTorch FSDP's no-sync can apply) also ``grad_sync``, when the gradients were
    reduce-scattered: ``every_microbatch`` or ``after_last_backward`` (each chunk's, once per step); with a
    kernel era other than the default ``fused`` also ``kernels`` (so a default step's summary is unchanged);
    with hybrid sharding over fewer ranks than DP x CP also ``shard_ranks``, its shard group's size (what an
    out-of-memory message weighs `fsdp: full_shard` against); under PyTorch FSDP also ``fsdp``, the scenario's
    strategy (``fsdp``, `FsdpStrategy`), which the run's first line names beside the ZeRO stage it runs as; with
    more than one pipeline stage, or a schedule the scenario names, also ``schedule`` (`StepPlan.schedule_name`)."""
    plan = step.plan
    layout, sharding = plan.layout, plan.sharding
    entry = {"tp": layout.tp, "cp": layout.cp, "pp": layout.pp, "dp": layout.dp, "order": list(layout.order),
             "microbatches": plan.microbatches, **({"schedule": plan.schedule_name} if plan.schedule_name else {}),
             "virtual_stages": plan.virtual_stages, "placement": plan.placement, "zero_stage": sharding.stage,
             "sequence_parallel": plan.sequence_parallel,
             "model": step.model.name if step.model else "synthetic", "gpu": step.gpu.name}
    if sharding.stage == 3 and (layout.pp > 1 or sharding.defers_unit_grads):
        entry["grad_sync"] = sharding.grad_sync
    if step.kernels != "fused":
        entry["kernels"] = step.kernels
    if sharding.degree != layout.dp * layout.cp:
        entry["shard_ranks"] = sharding.degree
    if fsdp is not None:
        entry["fsdp"] = fsdp
    return entry


MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers")


def memory_summary(per_stage: list[tuple[MemoryBreakdown, float]], capacity_bytes: float,
                   stage_rank: list[int], chunk_bytes: list[dict[int, float]],
                   kept_for_w: list[dict[int, float]]) -> dict:
    """Peak memory over pipeline stages, its breakdown in GiB, whether it exceeds the GPU's HBM, and each
    stage's breakdown (`memory_per_stage`: the index `stage`, the count `in_flight_microbatches` and sizes whose
    keys end in `_gib`) with its activation memory per in-flight micro-batch and per virtual stage it holds
    (``chunk_bytes``, from chunk_activation_bytes; for memory timelines) and what a deferred W keeps per
    virtual stage (``kept_for_w``, from chunk_weight_grad_bytes). ``stage_rank`` names the first rank
    of each stage, reported as the rank at the peak (every rank of a stage holds the same)."""
    worst_stage = max(range(len(per_stage)), key=lambda i: per_stage[i][0].total)
    stages = []
    for index, (stage, in_flight) in enumerate(per_stage):
        entry: dict[str, object] = {f"{part}_gib": size for part, size in breakdown_gib(stage).items()}
        entry.update(stage=index, total_gib=stage.total / GIB, in_flight_microbatches=in_flight,
                     activation_per_microbatch_gib=stage.activations / in_flight / GIB if in_flight else 0.0,
                     activation_per_virtual_stage_gib={str(vs): size / GIB for vs, size in chunk_bytes[index].items()},
                     weight_grad_per_virtual_stage_gib={str(vs): size / GIB
                                                        for vs, size in kept_for_w[index].items()})
        stages.append(entry)
    return {"memory_per_stage": stages, "peak_memory_stage": worst_stage,
            **peak_memory_entries(per_stage[worst_stage][0], stage_rank[worst_stage], capacity_bytes)}


def accumulates_whole_gradient(step: TrainingStep) -> bool:
    """Whether a ZeRO-2 step accumulates its gradients over more than one micro-batch before one reduce-scatter
    (not one after each micro-batch), so some buffer holds the whole gradient in between."""
    sharding = step.plan.sharding
    return sharding.stage == 2 and step.plan.microbatches > 1 and not sharding.reduce_every_microbatch


def held_stage(step: TrainingStep) -> int:
    """The ZeRO stage whose memory the step holds: ZeRO-2 accumulating the whole gradient
    (`accumulates_whole_gradient`) keeps the whole gradient buffer (Megatron-LM's persistent main_grad),
    ZeRO-1's memory; PyTorch FSDP's shard_grad_op does not (its accumulators are buffers). With dp x cp = 1 the
    dense part shards over 1 rank; experts over tp / ep."""
    sharding = step.plan.sharding
    return 1 if accumulates_whole_gradient(step) and not sharding.fsdp else sharding.stage


def rank_parameters(scenario: Scenario, step: TrainingStep, pp_rank: int) -> float:
    """The parameters a rank of pipeline rank ``pp_rank`` holds before ZeRO shards them: its tp (and ep) share of
    the layers of its virtual stages, with the embedding or the output layer where it holds them."""
    plan, model = step.plan, step.model
    assert model is not None, "a synthetic step holds no parameters"
    stages = plan.layout.pp * plan.virtual_stages
    counts = layers_per_stage(model.layers, stages, scenario.parallelism.pipeline.first_last_fewer_layers)
    vstages = plan.rank_stages(pp_rank)
    return memory.rank_params(model, plan.layout.tp, sum(counts[vs] for vs in vstages), 0 in vstages,
                              stages - 1 in vstages, scenario.parallelism.ep)


def model_state_entry(scenario: Scenario, step: TrainingStep, pp_rank: int) -> dict:
    """The summary's `model_state` of a dense model's step at its fullest pipeline rank ``pp_rank``: the bytes
    per parameter of its weights, gradients and optimizer state (`memory.state_bytes_per_param`, as the memory
    plan holds them), which of them are sharded and over how many ranks, and the parameters of the rank's
    tp x pp shard before that (`rank_parameters`), so that validate's line can write the ZeRO paper's
    (2 + 2 + K) sum; bf16
    keeps its gradients in fp32 by default, 18 B, not the paper's 16. Empty for a synthetic or MoE model (whose
    routed experts shard over another group)."""
    if step.model is None or step.model.moe is not None:
        return {}
    training, sharding = scenario.training, step.plan.sharding
    per = memory.state_bytes_per_param(training.precision, training.optimizer,
                                       training.gradient_buffer_dtype(scenario.parallelism.deepspeed_zero3),
                                       training.kernels == "eager" or sharding.fp32_shards)
    stage = held_stage(step)
    sharded = [part for part, first in (("params", 3), ("grads", 2), ("optimizer", 1)) if stage >= first]
    return {"model_state": {"bytes_per_parameter": {"params": per.param, "grads": per.grad,
                                                    "optimizer": per.optimizer},
                            "sharded": sharded if sharding.degree > 1 else [], "shard_ranks": sharding.degree,
                            "parameters": rank_parameters(scenario, step, pp_rank),
                            "precision": training.precision}}


def step_memory(scenario: Scenario, step: TrainingStep) -> dict:
    """The memory entries of ``step``'s summary (`memory_summary` over its pipeline stages, and a dense model's
    `model_state_entry`)."""
    layout = step.plan.layout
    held = memory_summary(stage_memory(scenario, step), step.gpu.hbm_bytes,
                          [layout.rank_of(pp=stage) for stage in range(layout.pp)],
                          chunk_activation_bytes(scenario, step), chunk_weight_grad_bytes(scenario, step))
    return {**held, **model_state_entry(scenario, step, held["peak_memory_stage"])}


def breakdown_gib(held: MemoryBreakdown) -> dict[str, float]:
    """A rank's memory by part (MEMORY_PARTS), in GiB."""
    return {name: getattr(held, name) / GIB for name in MEMORY_PARTS}


def peak_memory_entries(peak: MemoryBreakdown, rank: int, capacity_bytes: float) -> dict:
    """The summary's memory keys of the fullest rank: its total and breakdown in GiB, the GPU's capacity,
    which rank it is, whether it is out of memory and whether it fits with less room than the plan leaves out
    (`memory_tight`, `tight_fit`): the one record of it that run, validate, search and sweep read."""
    return {"peak_memory_gib": peak.total / GIB, "memory_breakdown_gib": breakdown_gib(peak),
            "memory_capacity_gib": capacity_bytes / GIB, "peak_memory_rank": rank, "oom": peak.total > capacity_bytes,
            "memory_tight": tight_fit(peak.total, capacity_bytes)}


def tight_fit(peak_bytes: float, capacity_bytes: float) -> bool:
    """Whether a peak that fits the GPU's capacity leaves it less room than the plan leaves out
    (`UNMODELLED_BYTES`), so that a real GPU may run out of memory where the plan says the step fits."""
    return peak_bytes <= capacity_bytes and capacity_bytes - peak_bytes < UNMODELLED_BYTES


def overlap_summary(step: TrainingStep) -> dict:
    """Which communication overlaps the step ran with: chunked TP collectives against their GEMMs, gradient
    buckets during the backward, the distributed optimizer's parameter gather during the next forward, and
    ZeRO-3 / FSDP parameter prefetch."""
    plan = step.plan
    layout, sharding = plan.layout, plan.sharding
    data_parallel = layout.dp * layout.cp > 1
    return {
        "tp_comm": plan.tp_overlap is not None and layout.tp > 1,
        "grad_reduce": data_parallel and sharding.overlap,
        "param_gather": data_parallel and sharding.overlap_param_gather and sharding.stage in (1, 2),
        "zero3_prefetch": data_parallel and sharding.stage == 3,
    }
