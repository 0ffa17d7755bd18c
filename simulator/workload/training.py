"""A scenario's training step as a StepPlan: model and GPU from the catalog, the 4D layout with its checks,
the pipeline schedule, per-stage work from the cost model, and the data-parallel sharding."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from simulator.catalog.gpus import GPUSpec, get_gpu
from simulator.catalog.models import ModelSpec, MoESpec, get_model
from simulator.config.moe import MoEConfig
from simulator.config.schema import (
    MAX_MICROBATCHES,
    ModelConfig,
    Scenario,
    SyntheticModel,
)
from simulator.config.training_options import (
    LOSS_SCALED,
    GradReduceDtype,
    KernelEra,
    Optimizer,
    OptimizerStep,
    Precision,
    grad_buffer_bytes,
)
from simulator.config.yaml_source import FieldPath
from simulator.errors import ScenarioError
from simulator.parallel.context import imbalance_report
from simulator.parallel.experts import expert_sharding
from simulator.parallel.layout import Layout
from simulator.parallel.program import StepPlan
from simulator.parallel.sharding import FP32_BYTES, Sharding, hybrid_degree
from simulator.schedules.base import Placement, rank_stages
from simulator.schedules.custom_csv import refuse_deadlocked_table
from simulator.schedules.interleaved import RoundsError
from simulator.schedules.registry import SINGLE_STAGE, build_schedule
from simulator.schedules.timing import ScheduleDeadlock, simulate_schedule
from simulator.topology.size import GpuPlacement
from simulator.workload.calibrated import calibrated_efficiency, tp_overlap
from simulator.workload.experts import check_expert_parallelism, moe_report, plan_experts
from simulator.workload.stage_work import (
    CostContext,
    layers_per_stage,
    synthetic_stages,
    transformer_stages,
    unsplit_layers_text,
)
from simulator.workload.transformer import AttentionCost, ShardShape, six_n_flops_per_token

PRECISION_BYTES: dict[Precision, int] = {"bf16": 2, "fp16": 2, "fp8": 2, "fp32": 4}
"""Bytes of a stored or communicated element (activations, weights, fresh gradients) per training precision:
fp8 training runs its GEMMs in fp8 but keeps activations and weights, and their messages, in 16 bits. The
gradient buffer and its reduction take grad_buffer_bytes (training.grad_reduce_dtype)."""
UPDATE_BYTES_PER_PARAM: dict[Optimizer, float] = {"adam": 28.0, "adamw": 28.0, "sgd": 12.0, "sgd_momentum": 20.0}
"""HBM bytes the fused update moves per local parameter. Adam (apex FusedAdam): read fp32 master, grad, m and
v, write master, m and v; AdamW the same (its decoupled weight decay is one more term on the master weight it
already reads). SGD: read master and grad, write master; with momentum it also reads and writes the momentum."""


FOREACH_BYTES_PER_PARAM: dict[Optimizer, float] = {"adam": 72.0, "adamw": 80.0, "sgd": 12.0, "sgd_momentum": 32.0}
"""HBM bytes torch.optim's foreach update moves per parameter, one multi-tensor kernel per op
(torch/optim/adam.py _multi_tensor_adam, not capturable; sgd.py _multi_tensor_sgd), fp32 throughout: Adam's
lerp_ of m towards the gradient (read 8, write 4), mul_ of v (4 + 4), addcmul_ of the squared gradient into v
(8 + 4), sqrt of v into a new list (4 + 4), div_ by the bias correction (4 + 4), add_ of eps (4 + 4) and the
addcdiv_ of the update into the weights (12 + 4): 72 B; AdamW's decoupled decay multiplies the weights first
(4 + 4): 80 B (the default weight decay, 0.01). SGD adds the gradient into the weights (8 + 4); with momentum
mul_ of the buffer (4 + 4) and add_ of the gradient into it (8 + 4) first: 32 B."""


def unscale_bytes_per_param(precision: Precision) -> float:
    """HBM bytes per parameter of a loss-scaled precision's unscale and inf/NaN check of the fp32 gradients
    before the update (read and write 4 B: Megatron-LM's and torch.amp's GradScaler alike); 0 without scaling."""
    return 8.0 if precision in LOSS_SCALED else 0.0


def copy_bytes_per_param(precision: Precision, buffer_bytes: int) -> float:
    """HBM bytes of the mixed-precision passes around the update with a gradient buffer of ``buffer_bytes``
    per element (see optimizer_bytes_per_param)."""
    widen = 2.0 + 4.0 if buffer_bytes == 2 else 0.0
    master_to_model = 4.0 + 2.0 if PRECISION_BYTES[precision] == 2 else 0.0
    return widen + unscale_bytes_per_param(precision) + master_to_model


def optimizer_bytes_per_param(optimizer: Optimizer, precision: Precision,
                              grad_reduce: GradReduceDtype | None = None, kernels: KernelEra = "fused",
                              step: OptimizerStep = "fused", fp32_shards: bool = False) -> float:
    """HBM bytes of one optimizer step per local parameter, pass by pass as Megatron-LM's mixed-precision
    optimizer runs it (megatron/optimizer/optimizer.py, Float16OptimizerWithFloat16Params):
    ``main_param.grad = main_grad.float()`` copies a 16-bit gradient buffer to fp32 (read 2 B, write 4 B) and is
    no copy at all for an fp32 buffer (``grad_reduce``, by default fp32 for bf16: grad_buffer_bytes); fp16's
    loss scaler unscales the gradients and checks them for inf/NaN (read and write 4 B); every precision reads
    the fp32 gradients once for the gradient norm (4 B) and runs the update; 16-bit training then copies the
    fp32 master weights into the 16-bit ones (read 4 B, write 2 B). Adam with fp16 moves 52 B, with bf16 38 B.
    PyTorch eager under autocast (``kernels``) updates the fp32 weights and gradients themselves with
    torch.optim's update, ``fused=True`` (as the H200 trace's step) or its default foreach (``step``,
    FOREACH_BYTES_PER_PARAM): no copy either way and no gradient norm unless the script clips (not modelled);
    fp16's GradScaler still unscales: Adam fused 28 B, 36 B with fp16; AdamW foreach 80 B. Fused kernels over
    PyTorch FSDP2's fp32 shards (``fp32_shards``, Sharding.fp32_shards) update the shards and their fp32 sharded
    gradients in place: the gradient norm, fp16's unscale and the update, no copy (no master weights, no 16-bit
    gradient buffer to widen): Adam 32 B with bf16."""
    if kernels == "eager":
        update = FOREACH_BYTES_PER_PARAM if step == "foreach" else UPDATE_BYTES_PER_PARAM
        return update[optimizer] + unscale_bytes_per_param(precision)
    if fp32_shards:
        return UPDATE_BYTES_PER_PARAM[optimizer] + 4.0 + unscale_bytes_per_param(precision)
    buffer = grad_buffer_bytes(precision, grad_reduce)
    return UPDATE_BYTES_PER_PARAM[optimizer] + 4.0 + copy_bytes_per_param(precision, buffer)


LayoutWarning = tuple[FieldPath, str]
"""A layout warning (`layout_warnings`): the field it is about and the problem, located by the caller."""

MOST_DROPPED = 0.5
"""The share of token-expert assignments the capacity may drop before the step warns: a judgment, not a measured
limit. Past half, most of the routed expert work the model declares is skipped (with top-2 routing, less than a
top-1 model's), so the step's time and MFU size another model; a skewed routing's drops below it are the cost the
run is there to show (`mixtral-8x7b-ep8`, zipf at capacity factor 1.25: 18.9%)."""


@dataclass(frozen=True)
class TrainingStep:
    """A resolved training step: what to simulate and the facts the metrics need."""

    plan: StepPlan
    model: ModelSpec | None
    gpu: GPUSpec
    tokens_per_step: float
    model_flops_per_step: float
    seq_len: int
    micro_batch: int
    warnings: tuple[LayoutWarning, ...] = ()
    moe: Mapping[str, object] | None = None
    routed_tokens: float | None = None
    """Tokens the hottest EP rank's experts receive per micro-batch (None without experts)."""
    nominal_model_flops_per_step: float | None = None
    """With experts, the architecture's model FLOPs: top_k routed experts for every token, dropped ones included
    (``model_flops_per_step`` counts only the token-expert assignments the capacity kept); None without."""
    kernels: KernelEra = "fused"
    """The kernel era the step's kernels were built for (`training.kernels`)."""
    cp_imbalance: Mapping[str, object] | None = None
    """Where the CP ranks' attention work differs, the summary's `cp_imbalance` entry
    (`parallel.context.imbalance_report`); None where it does not."""


def resolve_model(scenario: Scenario) -> ModelSpec:
    """The preset with explicit dimensions applied (`moe: null`: its dense twin, named "PRESET (dense)"), or a
    model from dimensions alone."""
    config = _model_section(scenario)
    dims = {name: getattr(config, name) for name in ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab",
                                                     "gated_mlp", "norm", "bias") if getattr(config, name) is not None}
    try:
        if config.preset is not None:
            model = get_model(config.preset)
            if config.moe is not None:
                dims["moe"] = _experts(config.moe, model.moe, dims.get("ffn_hidden", model.ffn_hidden))
            if config.experts_dropped:
                dims.update(moe=None, name=f"{model.name} (dense)")
            return replace(model, **dims)
        hidden = dims["hidden"]
        dims.setdefault("ffn_hidden", 4 * hidden)
        dims.setdefault("kv_heads", dims["heads"])
        dims.setdefault("vocab", 51200)
        dims.setdefault("gated_mlp", False)
        if config.moe is not None:
            dims["moe"] = _experts(config.moe, None, dims["ffn_hidden"])
        return ModelSpec(name="custom", **dims)
    except ScenarioError as exc:
        if exc.field:
            raise
        raise exc.rebuilt(field="model") from None


def _experts(section: MoEConfig, preset: MoESpec | None, ffn_hidden: int) -> MoESpec:
    """The `model.moe` section over the preset's experts (``preset``, None for a dense preset or no preset):
    each field left out keeps the preset's value, or without preset experts the section's default; top_k
    checked against the experts wherever each came from."""
    if preset is None:
        if section.experts is None:
            raise _invalid("model.moe.experts", "model.moe needs the number of experts (the model has none of "
                           "its own)", "experts: E, or a preset with experts (mixtral-8x7b, deepseek-v3-style)")
        preset = MoESpec(experts=section.experts, top_k=1, expert_ffn_hidden=ffn_hidden)
    given = section.model_fields_set
    spec = MoESpec(
        experts=section.experts if section.experts is not None else preset.experts,
        top_k=section.top_k if section.top_k is not None else preset.top_k,
        expert_ffn_hidden=section.expert_ffn_hidden or preset.expert_ffn_hidden,
        shared_experts=section.shared_experts if section.shared_experts is not None else preset.shared_experts,
        capacity_factor=section.capacity_factor if "capacity_factor" in given else preset.capacity_factor)
    if spec.top_k > spec.experts and section.top_k is None:
        raise _invalid("model.moe.experts", f"{spec.experts} experts are fewer than the preset's top_k "
                       f"{spec.top_k}", f"{spec.top_k} or more experts, or a top_k of at most {spec.experts}")
    if spec.top_k > spec.experts:
        raise _invalid("model.moe.top_k", f"top_k {spec.top_k} is above the {spec.experts} experts",
                       f"1 to {spec.experts}: each token picks distinct experts")
    return spec


def pipeline_depth(scenario: Scenario) -> int:
    """``parallelism.pp``, or the synthetic model's stage count (``pp`` may then be left out). A ``pp`` the
    scenario gives is honoured as given, 1 included: it must equal the stage count (its default, 1, stands
    for "not given" only when the field is absent)."""
    par, stages = scenario.parallelism, scenario.pipeline_stages
    if "pp" in par.model_fields_set and par.pp != stages:
        raise _invalid("parallelism.pp", f"pp {par.pp} differs from the synthetic model's {stages} stages",
                       f"{stages} (or leave it out)")
    return stages


DP_FILL_READS = ("cluster", "parallelism.tp", "parallelism.cp", "parallelism.pp")
"""What the check that dp fills the cluster reads beside dp (not the whole parallelism section: zero and the rest
have no part in the product)."""


def resolve_layout(scenario: Scenario, world: int, pp: int) -> Layout:
    """The layout with DP filled in from the GPU count; the product must equal the GPUs of the cluster."""
    par = scenario.parallelism
    fixed = par.tp * par.cp * pp
    if par.dp is None and world % fixed:
        raise _invalid("parallelism", f"tp x cp x pp = {par.tp} x {par.cp} x {pp} = {fixed:,} does not divide "
                       f"the cluster's {world:,} GPUs", f"degrees whose product divides {world:,}", reads=("cluster",))
    dp = par.dp if par.dp is not None else world // fixed
    if fixed * dp != world:
        problem = (f"tp x cp x pp x dp = {par.tp} x {par.cp} x {pp} x {dp} = {fixed * dp:,} does not equal the "
                   f"cluster's {world:,} GPUs")
        if world % fixed:
            raise _invalid("parallelism", problem, f"degrees whose product is {world:,}", reads=("cluster",))
        # tp x cp x pp divides the GPUs, so it is the given dp that does not fill them: the error is dp's
        raise _invalid("parallelism.dp", problem, f"dp {world // fixed:,} at tp x cp x pp = {fixed:,}, or degrees "
                       f"whose product is {world:,}", reads=DP_FILL_READS)
    return Layout(tp=par.tp, cp=par.cp, pp=pp, dp=dp, order=tuple(par.order))


def microbatch_count(scenario: Scenario, dp: int, replicas: str = "dp") -> int:
    """``training.microbatches``, or the global batch over micro_batch x ``dp``: a whole number, at most
    `MAX_MICROBATCHES`; the refusals name the ``dp`` replicas ``replicas`` (a parameter-server run's workers)."""
    training = scenario.training
    if training.microbatches is not None:
        return training.microbatches
    if training.global_batch is None:
        raise _invalid("training.global_batch", "give global_batch or microbatches",
                       f"a global batch in sequences, divisible by micro_batch x {replicas}")
    per_step = training.micro_batch * dp
    if training.global_batch % per_step:
        raise _invalid("training.global_batch", f"global_batch {training.global_batch} is not a multiple "
                       f"of micro_batch x {replicas} = {per_step}", f"multiples of {per_step}")
    count = training.global_batch // per_step
    if count > MAX_MICROBATCHES:
        raise _invalid("training.global_batch", f"{count:,} micro-batches per step",
                       f"at most {MAX_MICROBATCHES:,} (global_batch / (micro_batch x {replicas}))")
    return count


def _sharding(scenario: Scenario, layout: Layout, topology: GpuPlacement) -> Sharding:
    """Data-parallel sharding: parameters gathered in the training precision, gradients reduced in the
    gradient buffer's format (training.grad_reduce_dtype); whether they are reduced every micro-batch resolved
    for the layout's pipeline depth, and PyTorch FSDP under pipelining keeping its units gathered for the step
    (torchtitan's ``reshard_after_forward=not pp_enabled``)."""
    par, training = scenario.parallelism, scenario.training
    group = layout.combined_group(("dp", "cp"), 0)
    degree = len(group)
    if par.hybrid_shard:
        degree = hybrid_degree(layout, lambda rank: topology.gpu_domain[rank])
        _check_hybrid_blocks(layout, topology, degree)
        _check_hybrid_experts(par.ep, degree)
    return Sharding(stage=par.zero_stage, degree=degree, bucket_bytes=par.ddp.bucket, overlap=par.ddp.overlap,
                    grad_bytes=grad_buffer_bytes(training.precision,
                                                 training.gradient_buffer_dtype(par.deepspeed_zero3)),
                    param_bytes=PRECISION_BYTES[training.precision],
                    overlap_param_gather=par.ddp.overlap_param_gather,
                    reduce_every_microbatch=par.reduce_every_microbatch(layout.pp),
                    gather_per_layer=par.gathers_per_unit, fsdp=par.fsdp is not None,
                    reshard_after_forward=not par.pipelined_fsdp(layout.pp))


def _fsdp2_fp32_shards(scenario: Scenario) -> bool:
    """Whether PyTorch FSDP keeps fp32 shards (Sharding.fp32_shards): FSDP2's ``fully_shard`` (``fsdp:
    full_shard | hybrid_shard``, under either kernel era) keeps each shard in the parameter's own dtype, fp32,
    and gathers it in MixedPrecisionPolicy's param_dtype (torchtitan's bf16 parameters, fp32 shards), over a
    one-rank mesh too (its ``world_size == 1`` path copies the cast shard into the unsharded parameters,
    Sharding.unshard_copy_bytes); FSDP1's shard_grad_op and no_shard keep the training precision with an fp32
    master copy in the optimizer, as the fused path's Megatron-LM does."""
    return scenario.parallelism.gathers_per_unit


def _fsdp_shard_bytes(scenario: Scenario, layout: Layout, sharding: Sharding) -> float:
    """Bytes per element of PyTorch FSDP's parameter shards: fp32 where FSDP2 keeps fp32 shards
    (_fsdp2_fp32_shards) and under eager, whose weights are fp32 whatever the strategy; otherwise the training
    precision."""
    if scenario.training.kernels == "eager" or _fsdp2_fp32_shards(scenario):
        return FP32_BYTES
    return sharding.param_bytes


def _check_eager_shard_group(scenario: Scenario, sharding: Sharding) -> None:
    """Eager FSDP needs a shard group of more than one rank: torchtitan applies fully_shard only when it shards
    (``parallel_dims.fsdp_enabled``, dp_shard > 1) and otherwise trains the fp32 weights under autocast, which is
    eager without fsdp; a one-rank group would drop autocast's costs without charging FSDP's."""
    fsdp = scenario.parallelism.fsdp
    if scenario.training.kernels != "eager" or fsdp is None or sharding.degree > 1:
        return
    group = ("GPU 0's DP x CP ranks in its NVLink domain" if scenario.parallelism.hybrid_shard
             else "dp x cp")
    raise _invalid("parallelism.fsdp", f"fsdp {fsdp} under kernels: eager shards over one rank ({group} = 1): "
                   "torchtitan applies fully_shard only over more than one (otherwise autocast, as eager without "
                   "fsdp)", "fsdp with a shard group of more than one rank (dp x cp > 1; hybrid_shard: more than "
                   "one of them per NVLink domain), no fsdp with eager, or training.kernels: fused")


def _check_hybrid_experts(ep: int, degree: int) -> None:
    """HSDP shards each MoE layer's routed experts over the ranks of a shard group (``degree`` consecutive DP x
    CP ranks) that hold the same experts (parallel/experts.expert_shard_groups), which are as many in every
    group only where the EP blocks of ``ep`` ranks tile the shard groups or the shard groups tile them
    (torchtitan's efsdp x ep mesh covers the ranks of each replica)."""
    if ep > 1 and degree % ep and ep % degree:
        raise _invalid("parallelism.ep", f"ep {ep} beside fsdp: hybrid_shard's shard groups of {degree} DP x CP "
                       "ranks: neither divides the other, so the ranks holding the same experts are not as many in "
                       "every shard group", f"an ep that divides {degree} or a multiple of it, or fsdp: full_shard")


def _check_hybrid_blocks(layout: Layout, topology: GpuPlacement, degree: int) -> None:
    """HSDP shards within the data-parallel ranks of one NVLink domain (the host, on hosts without NVSwitch):
    the shard groups are blocks of ``degree`` consecutive members of each DP x CP group (the program
    builder's), so ``degree`` (GPU 0's DP x CP ranks in its domain) must divide the group and every block lie in
    one domain. A block that straddles domains simulated before this check; hybrid_shard means sharding inside a
    domain, so it is refused. The message counts each domain's members of the offending group."""
    size = layout.dp * layout.cp
    allowed = ("a layout in which each NVLink domain (host) holds the same number of every DP x CP group's ranks, "
               "as consecutive members of the group, or fsdp: full_shard")
    seen: set[int] = set()
    for rank in range(layout.world):
        if rank in seen:
            continue
        group = layout.combined_group(("dp", "cp"), rank)
        seen.update(group)
        blocks = [group[start:start + degree] for start in range(0, size, degree)]
        straddling = next((block for block in blocks if len({topology.gpu_domain[m] for m in block}) > 1), None)
        if size % degree or straddling is not None:
            counts = Counter(topology.gpu_domain[member] for member in group)
            spread = ", ".join(f"{count} in domain {domain}" for domain, count in counts.items())
            problem = (f"hybrid_shard shards over GPU 0's {degree} of the {size} DP x CP ranks in its NVLink "
                       f"domain, which does not divide them into equal shard groups" if size % degree else
                       f"hybrid_shard's shard group {list(straddling or ())} spans NVLink domains")
            raise _invalid("parallelism.fsdp", f"{problem} (DP x CP group {list(group)}: {spread})", allowed)


STAGE_SPLIT_READS = ("parallelism.pipeline.virtual_stages", "parallelism.pipeline.first_last_fewer_layers",
                     "model.layers", "model.preset")
"""The fields besides `pp` that the layers' split over the stages reads: an override of any of them is named
with its error (`--set parallelism.pipeline.virtual_stages=3` went unsaid)."""


def check_model_layout(scenario: Scenario, model: ModelSpec, layout: Layout) -> list[int]:
    """Refuse a layout that ``model`` cannot take (heads, layers over the stages, sequence shards, experts) and
    return the layers of each virtual stage. Cheap, so made before the run's size is estimated: a layout
    estimated beyond the scale limits was refused as too large, with advice to shrink the batch, before it was
    found impossible."""
    par, seq_len = scenario.parallelism, scenario.training.seq_len
    _check_heads(model, layout)
    v = par.pipeline.virtual_stages
    counts = layers_per_stage(model.layers, layout.pp * v, par.pipeline.first_last_fewer_layers)
    if not counts:
        unsplit = unsplit_layers_text(model.layers, layout.pp * v, par.pipeline.first_last_fewer_layers)
        raise _invalid("parallelism.pp", f"{unsplit} evenly over pp x virtual_stages = {layout.pp * v} stages",
                       "pp x virtual_stages dividing the layers (or layers + 2 with first_last_fewer_layers)",
                       reads=STAGE_SPLIT_READS)
    _check_context(seq_len, layout.cp, par.cp_load_balance)
    _check_sequence_shards(seq_len, layout, par.sequence_parallel, model.moe is not None)
    check_expert_parallelism(scenario, model, layout)
    return counts


def build_training_step(scenario: Scenario, topology: GpuPlacement, base_dir: Path = Path(".")) -> TrainingStep:
    """Resolve the scenario's training step into a plan the program builder can turn into ops; ``base_dir`` is
    the scenario file's folder, where a custom schedule table is looked up."""
    par, training = scenario.parallelism, scenario.training
    synthetic = _model_section(scenario).synthetic
    source: SyntheticModel | ModelSpec = synthetic if synthetic is not None else resolve_model(scenario)
    layout = resolve_layout(scenario, topology.num_gpus, pipeline_depth(scenario))
    gpu = get_gpu(topology.gpu_model)
    m = microbatch_count(scenario, layout.dp)
    v = par.pipeline.virtual_stages
    table = par.pipeline.table_path(base_dir)
    try:
        schedule = build_schedule(par.pipeline.schedule, layout.pp, m, v, table)
    except ScenarioError as exc:
        if exc.field == "training.microbatches" and training.microbatches is None:
            allowed = _global_batches_allowed(exc, training.micro_batch * layout.dp)
            raise _invalid("training.global_batch", f"{exc.problem} (micro-batches = global_batch / "
                           f"(micro_batch x dp) = {m})", allowed) from None
        raise
    placement = schedule.placement
    named = layout.pp > 1 or "schedule" in par.pipeline.model_fields_set
    schedule_name = par.pipeline.schedule_label() if named else ""
    if table is not None:
        check_schedule_runs(schedule, placement, table)
    precision_bytes = PRECISION_BYTES[training.precision]
    sharding = _sharding(scenario, layout, topology)
    _check_eager_shard_group(scenario, sharding)
    warnings = layout_warnings(layout, topology, sharding, hybrid=par.hybrid_shard)
    if isinstance(source, SyntheticModel):
        if par.ep > 1:
            raise _invalid("parallelism.ep", f"ep {par.ep} needs a model with experts; a synthetic model has none",
                           "1, or a model with model.moe")
        _check_synthetic_splits(layout)
        stages = synthetic_stages(layout.pp, v, source.forward, source.backward, source.p2p_bytes)
        plan = StepPlan(layout, schedule, stages, v, m, False, sharding, optimizer_s=(0.0,) * layout.pp,
                        optimizer_bytes=(0.0,) * layout.pp,
                        placement=placement, schedule_name=schedule_name)
        return TrainingStep(plan, None, gpu, 0.0, 0.0, training.seq_len, training.micro_batch, warnings)
    model = source
    counts = check_model_layout(scenario, model, layout)
    eager = training.kernels == "eager"
    shard = ShardShape(training.micro_batch, training.seq_len, layout.tp, layout.cp, par.sequence_parallel,
                       dtype_bytes=precision_bytes, grad_accum_bytes=int(sharding.grad_bytes),
                       fused_grad_accumulation=training.fused_grad_accumulation(par.fsdp is not None) and not eager,
                       framework_copies=par.fsdp is not None,
                       fused_cross_entropy=training.cross_entropy_fusion,
                       fused_layernorm=training.layernorm_fusion,
                       fused_bias_grad=training.bias_grad_fusion and not eager, eager=eager,
                       fsdp_weights=par.fsdp is not None,
                       accumulating_share=(m - 1) / m if eager and par.fsdp is None else 0.0)
    cost = CostContext(gpu, training.precision, calibrated_efficiency(gpu.name, training.precision),
                       AttentionCost.for_kernel(training.attention))
    if par.fsdp is not None:
        sharding = replace(sharding, grad_copy_rate=gpu.hbm_bandwidth * cost.efficiency.memory_peak,
                           shard_bytes=_fsdp_shard_bytes(scenario, layout, sharding),
                           fp32_shards=_fsdp2_fp32_shards(scenario))
    experts = plan_experts(scenario, model, layout, shard, cost)
    stages = transformer_stages(model, shard, training.recompute, cost, counts, par.cp_algorithm,
                                par.cp_load_balance, experts.layer if experts else None)
    expert_fp32 = sharding.fp32_shards and sharding.shards_experts
    dense_bytes, expert_bytes = (optimizer_bytes_per_param(training.optimizer, training.precision,
                                                           training.grad_reduce_dtype, training.kernels,
                                                           training.optimizer_step, fp32)
                                 for fp32 in (sharding.fp32_shards, expert_fp32))
    held = [rank_stages(stage, layout.pp, v, placement) for stage in range(layout.pp)]
    rate = gpu.hbm_bandwidth * cost.efficiency.memory_peak
    optimizer_bytes, optimizer_s = zip(*(
        (sum(dense * dense_bytes + routed * expert_bytes for dense, routed in params),
         sum(dense * (dense_bytes / rate) + routed * (expert_bytes / rate) for dense, routed in params))
        for params in ([sharded_params(stages[vstage], sharding, par.ep, par.tp) for vstage in held[stage]]
                       for stage in range(layout.pp))))
    if par.tp_comm_overlap and layout.tp > 1 and not par.sequence_parallel:
        raise _invalid("parallelism.tp_comm_overlap", "TP communication overlap needs sequence parallelism (as in "
                       "Megatron-LM)", "sequence_parallel: true, or tp_comm_overlap: false")
    _check_tp_overlap_domains(par.tp_comm_overlap, layout, topology)
    overlap = tp_overlap() if par.tp_comm_overlap else None
    plan = StepPlan(layout, schedule, stages, v, m, par.sequence_parallel, sharding, optimizer_s,
                    optimizer_bytes=optimizer_bytes, recompute_comm=training.recompute == "full", tp_overlap=overlap,
                    placement=placement, schedule_name=schedule_name,
                    single_stage_loop=par.pipeline.schedule in SINGLE_STAGE)
    tokens = m * layout.dp * training.micro_batch * training.seq_len
    nominal_flops = model_flops_per_token(model, training.seq_len) * tokens
    model_flops, report, routed_tokens, nominal = nominal_flops, None, None, None
    layers_per_rank = max(sum(counts[vstage] for vstage in stages_of_rank) for stages_of_rank in held)
    if experts is not None:
        routed_tokens = float(experts.sample.rank_load(experts.ep)[experts.sample.hottest_rank(experts.ep)])
        report = moe_report(model, shard, cost, experts.sample, experts.ep, experts.layer, layers_per_rank, m,
                            training.recompute)
        model_flops -= experts.sample.dropped_fraction * routed_flops_per_token(model) * tokens
        nominal = nominal_flops
        warnings += _dropping_warning(experts.sample.dropped_fraction, experts.sample.capacity)
    context = next((block.context for stage in stages for block in stage.blocks if block.context is not None), None)
    imbalance = None if context is None else imbalance_report(context, layers_per_rank, m)
    return TrainingStep(plan, model, gpu, float(tokens), model_flops, training.seq_len, training.micro_batch,
                        warnings, report, routed_tokens, nominal, training.kernels, imbalance)


def sharded_params(work, sharding: Sharding, ep: int, tp: int) -> tuple[float, float]:
    """Parameters a rank of a virtual stage updates: (its blocks' share over the shard group, their routed
    experts' share over the ranks sharding them (parallel/experts.expert_sharding)). The two are apart because
    the optimizer moves different bytes for them under ZeRO: the routed experts keep 16-bit weights whole, so
    their update writes the 16-bit copy from fp32 state (memory.rank_memory counts that state as the master
    copy); under PyTorch FSDP2 both are fp32 shards updated in place (Sharding.shards_experts)."""
    routed = sum(block.experts.params for block in work.blocks if block.experts is not None)
    dense_ways = sharding.degree if sharding.stage >= 1 else 1
    expert_ways = expert_sharding(sharding, ep, tp).degree if sharding.stage >= 1 else 1
    return work.params / dense_ways, routed / expert_ways


def check_schedule_runs(schedule, placement: Placement, table: Path) -> None:
    """A custom action table (read from ``table``) must run to completion: try it with unit costs in the exact
    schedule executor; one that deadlocks is refused at its CSV row (custom_csv.refuse_deadlocked_table)."""
    try:
        simulate_schedule(schedule, 1.0, 1.0, 1.0, placement=placement)
    except ScheduleDeadlock as exc:
        refuse_deadlocked_table(table, exc)


def _dropping_warning(dropped: float, capacity: float) -> tuple[LayoutWarning, ...]:
    """A warning where the capacity drops more than `MOST_DROPPED` of the token-expert assignments."""
    if dropped <= MOST_DROPPED:
        return ()
    return ((("model", "moe", "capacity_factor"),
             f"the capacity ({capacity:,.0f} assignments per expert and source rank) drops {dropped:.1%} of the "
             f"token-expert assignments, more than {MOST_DROPPED:.0%}: most of the routed expert work is skipped, "
             "so the step and its MFU are another model's (a capacity factor of 1.0 or more keeps about every "
             "assignment under uniform routing)"),)


def layout_warnings(layout: Layout, topology: GpuPlacement, sharding: Sharding,
                    hybrid: bool) -> tuple[LayoutWarning, ...]:
    """Legal but costly or pointless placements: a TP group spread over several NVLink domains runs its
    per-layer collectives over the network (seed 000, Q5); hybrid sharding with one DP rank per domain
    shards nothing."""
    warnings: list[LayoutWarning] = []
    domains = tp_domains(layout, topology.gpu_domain_array)
    if domains > 1:
        warnings.append((("parallelism", "tp"), f"a TP group of {layout.tp} GPUs spans {domains} NVLink domains; "
                         "its collectives cross the network every layer"))
    if hybrid and sharding.degree == 1:
        warnings.append((("parallelism", "fsdp"), f"hybrid_shard shards within an NVLink domain, and "
                         f"{_alone(layout, topology)}, so its shard group is one rank: it shards nothing and each "
                         "GPU holds the model state of plain data parallelism (fsdp: full_shard shards across "
                         "domains)"))
    return tuple(warnings)


def _check_tp_overlap_domains(tp_comm_overlap: bool, layout: Layout, topology: GpuPlacement) -> None:
    """TP overlap needs each TP group inside one NVLink domain: Transformer Engine's userbuffers map the peers'
    buffers by CUDA IPC or multicast handles among the GPUs of one NVLink domain (a host, or an NVL72 rack
    through MNNVL fabric handles: userbuffers-host.cpp, `create_communicator_grouped2`), and have no path over
    the network (TransformerEngine issue #1071)."""
    if not tp_comm_overlap:
        return
    domains = tp_domains(layout, topology.gpu_domain_array)
    if domains > 1:
        raise _invalid("parallelism.tp_comm_overlap", f"TP communication overlap (Transformer Engine's userbuffers) "
                       f"runs inside one NVLink domain, and a TP group of {layout.tp} GPUs spans {domains} NVLink "
                       "domains",
                       "a TP group inside one NVLink domain, or tp_comm_overlap: false",
                       reads=("parallelism.tp", "parallelism.order"))


def tp_domains(layout: Layout, domains: np.ndarray) -> int:
    """The most NVLink domains any one TP group spans (1 where every group stays inside one), rank r in domain
    ``domains[r]``: a built topology's (`gpu_domain_array`), or the size estimate's rank // domain GPUs, in
    numpy (a 16,384-rank layout's ranks one by one took 20 ms, and an elastic job weighs one per size it may
    shrink to). Every group is weighed, not GPU 0's alone: where a domain's GPU count is not a
    multiple of TP (72-GPU GB200 racks, TP 16) a later group straddles two domains while the first does not."""
    if layout.tp == 1:
        return 1
    ranks = np.arange(layout.world, dtype=np.int64)
    stride = layout.stride("tp")
    return most_domains(ranks - (ranks // stride) % layout.tp * stride, domains[:layout.world])


def most_domains(group: np.ndarray, domain: np.ndarray) -> int:
    """The most distinct ``domain`` values any one ``group`` value spans (arrays of one entry per rank)."""
    pairs = np.unique(group * (int(domain.max()) + 1) + domain)
    return int(np.unique(pairs // (int(domain.max()) + 1), return_counts=True)[1].max())


def _alone(layout: Layout, topology: GpuPlacement) -> str:
    """Why GPU 0's NVLink domain holds no other rank of its DP x CP group: the domain is one GPU, its GPUs are
    all GPU 0's TP peers, or all its TP and PP peers; else (a graph's host of GPUs not numbered together) only
    that the others sit elsewhere in the layout."""
    domain = topology.gpu_domain[0]
    members = {rank for rank in range(layout.world) if topology.gpu_domain[rank] == domain}
    gpus = len(members)
    if gpus == 1:
        return "each NVLink domain holds one GPU"
    if members <= set(layout.group("tp", 0)):
        return f"TP {layout.tp} fills GPU 0's {gpus}-GPU domain"
    if members <= set(layout.combined_group(("tp", "pp"), 0)):
        return f"TP {layout.tp} x PP {layout.pp} fill GPU 0's {gpus}-GPU domain"
    return f"the other {gpus - 1} GPUs of GPU 0's {gpus}-GPU domain hold ranks of other DP x CP groups"


def _model_section(scenario: Scenario) -> ModelConfig:
    """The scenario's `model:` section, which a training step needs."""
    if scenario.model is None:
        raise _invalid("model", "a training step needs a model", "a preset, dimensions or synthetic costs")
    return scenario.model


def _global_batches_allowed(exc: ScenarioError, per_microbatch: int) -> str:
    """What a schedule's refusal of the micro-batch count allows, as global batches where it names the counts
    it accepts (``per_microbatch`` sequences each: micro_batch x dp): a scenario that set global_batch 1,552
    on an interleaved GPT-3 at dp 16 reads 'global_batch 1,536 or 1,664 (m = 96 or 104 ...)', not '96 or 104'."""
    if not isinstance(exc, RoundsError) or not exc.accepted:
        return exc.allowed
    below, above = exc.accepted
    return (f"global_batch {below * per_microbatch:,} or {above * per_microbatch:,} (m = {below} or {above}: a "
            f"multiple of max(1, m // p) rounds, PyTorch's rule); a multiple of p x micro_batch x dp = "
            f"{exc.p * per_microbatch:,} for Megatron-LM's order")


def _invalid(field: str, problem: str, allowed: str = "", reads: tuple[str, ...] = ()) -> ScenarioError:
    """A ScenarioError at ``field`` of the scenario, from a check that also ``reads`` other fields;
    `config/locate.located` adds the file and line."""
    return ScenarioError(problem, field=field, allowed=allowed, reads=reads)


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs per token (no recompute): 6 N plus causal attention, the convention MFU is reported in,
    with N counting the weights that do matmul work: the input embedding's tables are lookups, except that a
    tied token table also serves as the output layer (a learned position table is a lookup either way)."""
    output_layer = model.vocab * model.hidden if model.tied_embeddings else 0
    lookup_params = model.embedding_params() - output_layer
    return six_n_flops_per_token(model, seq_len, attention=True, causal_factor=0.5) - 6.0 * lookup_params


def routed_flops_per_token(model: ModelSpec) -> float:
    """The routed experts' share of `model_flops_per_token`: 6 x the weights of top_k experts in every layer.
    A token-expert assignment the capacity drops does none of its share (the token passes on the residual)."""
    moe = model.moe
    return 6.0 * model.layers * moe.top_k * model.expert_params() if moe is not None else 0.0


def _check_synthetic_splits(layout: Layout) -> None:
    """A synthetic model gives each stage's pass times whole, with no layers, heads or sequence to split, so
    tp and cp above 1 would only take GPUs and change nothing: refused, as ep is."""
    for name, degree, what in (("tp", layout.tp, "layers' matrices"), ("cp", layout.cp, "sequence")):
        if degree > 1:
            raise _invalid(f"parallelism.{name}", f"{name} {degree} has no effect on a synthetic model: its stage "
                           f"times are given whole, with no {what} to split",
                           "1, or a model with dimensions or a preset")


def _check_context(seq_len: int, cp: int, balanced: bool) -> None:
    """cp must split the sequence; with causal load balancing into 2 cp equal chunks."""
    chunks = 2 * cp if balanced and cp > 1 else cp
    if seq_len % chunks:
        what = f"2 x cp = {chunks} chunks (cp_load_balance)" if chunks != cp else f"cp {cp} shares"
        raise _invalid("parallelism.cp", f"seq_len {seq_len} does not split into {what}",
                       f"cp with seq_len divisible by {'2 x cp' if chunks != cp else 'cp'}",
                       reads=("training.seq_len", "parallelism.cp_load_balance"))


SEQUENCE_SHARD_READS = ("parallelism.tp", "parallelism.cp", "parallelism.sequence_parallel", "model.moe",
                        "model.preset")
"""What the check that seq_len splits into cp x tp token shares reads beside seq_len: an override of any of them
is named with its refusal at `training.seq_len`."""


def _check_sequence_shards(seq_len: int, layout: Layout, sequence_parallel: bool, experts: bool) -> None:
    """With sequence parallelism each TP rank holds, and with experts routes, its 1/tp of the CP rank's
    seq_len / cp tokens (Megatron-LM splits the sequence dimension and asserts that it divides), so a whole
    number of them."""
    shards = layout.cp * layout.tp
    if layout.tp > 1 and (sequence_parallel or experts) and seq_len % shards:
        who = "sequence parallelism" if sequence_parallel else "the experts' routing"
        raise _invalid("training.seq_len", f"seq_len {seq_len} does not split into cp x tp = {layout.cp} x "
                       f"{layout.tp} = {shards} token shares, which {who} gives each TP rank",
                       f"a multiple of {shards}", reads=SEQUENCE_SHARD_READS)


def _check_heads(model: ModelSpec, layout: Layout) -> None:
    """tp must split the attention heads, pair with the KV heads and split the MLP's hidden width."""
    if model.heads % layout.tp:
        raise _invalid("parallelism.tp", f"tp {layout.tp} does not divide {model.heads} attention heads",
                       "a divisor of the head count", reads=("model.heads", "model.preset"))
    if model.kv_heads % layout.tp and layout.tp % model.kv_heads:
        raise _invalid("parallelism.tp", f"tp {layout.tp} and {model.kv_heads} KV heads do not divide "
                       "each other", "a divisor or multiple of kv_heads", reads=("model.kv_heads", "model.preset"))
    if model.ffn_hidden % layout.tp:
        raise _invalid("parallelism.tp", f"tp {layout.tp} does not divide ffn_hidden {model.ffn_hidden}",
                       "a divisor of ffn_hidden", reads=("model.ffn_hidden", "model.preset"))
