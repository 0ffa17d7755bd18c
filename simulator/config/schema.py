"""The scenario schema: frozen pydantic models that reject unknown keys, with quantities parsed from unit strings.

Sections grow with features; each is optional except `cluster`. Quantities stay strings in YAML ("1 GiB",
"400 Gb/s") and become SI floats here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from simulator.collectives.chunking import AUTO_CHUNK, chunk_bytes
from simulator.collectives.names import AlgorithmChoice, Primitive, ProtocolChoice
from simulator.config.costs import NO_COSTS, CostsConfig
from simulator.config.faults import FaultsConfig, StepDuration
from simulator.config.link_classes import EfficiencyProfile, LinkClass
from simulator.config.model_options import Norm
from simulator.config.moe import MoEConfig
from simulator.config.parallelism_options import CUSTOM_SCHEDULE, SCHEDULE_FIELD, SCHEDULE_NAMES, CpAlgorithm
from simulator.config.parameter_server import WORKER_PARALLELISM, ParameterServerConfig, Strategy
from simulator.config.precision import LossScalingConfig
from simulator.config.published import PublishedConfig
from simulator.config.reliability import CheckpointConfig, Horizon, RestartConfig, StorageConfig
from simulator.config.sections import STORED_FIELD, UNSET, FieldProblem, Section, unset_by_none, user_value
from simulator.config.traces import TraceWorkload
from simulator.config.training_options import (
    AUTOCAST_PRECISIONS,
    DEEPSPEED_GRAD_REDUCE,
    DEFAULT_GRAD_REDUCE,
    LOSS_SCALED,
    REDUCE_DTYPES_OF,
    AttentionKernel,
    GradReduceDtype,
    KernelEra,
    Optimizer,
    OptimizerStep,
    Precision,
    Recompute,
)
from simulator.errors import lookup, yaml_spelling
from simulator.network.modes import NetworkMode
from simulator.units import parse_bucket_size, parse_buffer_size


def _schedule(name: str) -> str:
    """A schedule the registry builds or 'custom', by the one rule for unknown names (errors.lookup)."""
    return lookup(dict(zip(SCHEDULE_NAMES, SCHEDULE_NAMES, strict=True)), name, "schedule", SCHEDULE_FIELD)


def _model_preset(name: str) -> str:
    """A preset the model catalog has, checked when the scenario is read (the catalog is imported only then:
    reading the schema loads no catalog)."""
    from simulator.catalog.models import get_model

    get_model(name)
    return name


def _preset_has_experts(name: str) -> bool:
    """Whether the model preset ``name`` (already checked to exist) carries its own experts."""
    from simulator.catalog.models import get_model

    return get_model(name).moe is not None


MAX_RANGE_MEMBERS = 2**22
"""The most GPUs a workload item's range "A-B" may name (4 M, above the 3.4 M GPUs that scale.py's memory limit
admits), so that a typo in a bound cannot exhaust memory while the range is read."""
GROUP_ALLOWED = "all, a list of GPU indices, or a range like 0-7"


def _group(value: object) -> object:
    """A workload item's range "A-B" (inclusive) read into its list of GPU indices at load, so every consumer
    sees "all" or a list (whose entries the type check reads)."""
    if isinstance(value, list) or value == "all":
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a group of GPUs, got {yaml_spelling(value)} (allowed: {GROUP_ALLOWED})")
    bounds = value.split("-")
    if len(bounds) != 2 or not all(b.strip().isascii() and b.strip().isdigit() for b in bounds):
        raise ValueError(f"cannot read group {value!r} (allowed: {GROUP_ALLOWED})")
    low, high = int(bounds[0]), int(bounds[1])
    if high < low:
        raise ValueError(f"empty range {value!r} (allowed: A-B with A <= B)")
    if high - low >= MAX_RANGE_MEMBERS:
        raise ValueError(f"range {value!r} names more GPUs than a cluster holds "
                         f"(allowed: at most {MAX_RANGE_MEMBERS:,} GPUs)")
    return list(range(low, high + 1))


ScheduleName = Annotated[str, AfterValidator(user_value(_schedule))]
MessageSize = Annotated[float, BeforeValidator(user_value(parse_buffer_size)), Field(ge=0)]
"""A communication buffer's bytes: a collective's or transfer's size (0 B, or 1 B to 1 PiB)."""
BucketSize = Annotated[float, BeforeValidator(user_value(parse_bucket_size))]
"""A DDP gradient bucket's cap, 1 B to 1 PiB: PyTorch's reducer and Megatron-LM close a bucket once it holds
the cap, so a cap of 0 B is no bucket size."""
Chunk = Annotated[float | Literal["auto"] | None, BeforeValidator(user_value(chunk_bytes))]
GpuGroup = Annotated[Literal["all"] | list[int], BeforeValidator(_group)]

MAX_MICROBATCHES = 100_000
"""More micro-batches per step than this is certainly a mistake (and would take hours to simulate)."""


class ClusterConfig(BaseModel):
    """`topology` is a bundled name or a path; every other key overrides a builder parameter of that topology."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, defer_build=True)
    topology: str = Field(description="a bundled topology's name (topologies/, docs/topologies.md), or a YAML "
                                      "file's path relative to the scenario")

    def overrides(self) -> dict:
        """The builder parameters the scenario sets, by name."""
        return dict(self.model_extra or {})


class NetworkConfig(Section):
    """`model`: flow (max-min sharing) or analytic (each collective alone with its
    copies on the equivalent ranks, their transfers sharing the links);
    `efficiency`: calibrated, ideal or per class;
    `pxn`: whether an all-to-all's cross-rail transfers between hosts go through NCCL's PXN relay (docs/network.md)."""

    model: NetworkMode = "flow"
    efficiency: EfficiencyProfile | dict[LinkClass, Annotated[float, Field(gt=0, le=1)]] = "calibrated"
    pxn: bool = True


SmContention = Literal["nccl", "none"]
"""Whether communication kernels take SMs from the compute running beside them: `nccl` (as many as NCCL's
channels, or the TP overlap's settings; docs/cost-model.md) or `none` (overlapped communication is free)."""


def _within_nccl_channels(channels: int) -> int:
    """``channels`` if NCCL could run that many (a million made a million ring flows per hop: no answer in
    minutes)."""
    from simulator.catalog.calibration import max_channels

    if channels > max_channels():
        raise ValueError(f"{channels} channels are more than NCCL runs (MAXCHANNELS) (allowed: 0, one per rail, or "
                         f"1 to {max_channels()})")
    return channels


class CollectivesConfig(Section):
    """Defaults for every collective: algorithm, NCCL protocol (`auto`: chosen with the algorithm), pipelining
    chunk (`auto`: NCCL's for the protocol; `none` = off) and channels (0 = one per rail; at most NCCL's
    MAXCHANNELS); `sm_contention`: compute slowed while communication kernels hold SMs (`nccl`) or not
    (`none`)."""

    algorithm: AlgorithmChoice = "auto"
    protocol: ProtocolChoice = "auto"
    chunk: Chunk = AUTO_CHUNK
    channels: Annotated[int, Field(ge=0), AfterValidator(_within_nccl_channels)] = 0
    sm_contention: SmContention = "nccl"


TimelineLevel = Literal["full", "per-stage", "summary"]
TraceLevel = Literal["ops", "ops+links", "full"]
"""What trace.json holds: op slices; plus link utilisation counters; plus one slice per network flow."""

MAX_REPLICATIONS = 10_000
"""More job replications than this is certainly a mistake (each is weeks of simulated failures)."""


class RunConfig(Section):
    """Run-level settings: the seed of the run's random generator; rank folding (simulate one rank per
    pipeline stage and mirror the rest; exact for symmetric runs, `false` simulates every rank); and how much
    timeline to write: `full` (every op and flow), `per-stage` (the ops of one rank per pipeline stage, no
    flows) or `summary` (summary.json only); what trace.json shows: `ops` (op slices), `ops+links` (plus
    per-link utilisation counter tracks) or `full` (plus one slice per network flow); `trace_compress` writes
    trace.json.gz instead. `horizon` turns the run into a job simulation over that much wall time,
    `replications` times with independent failures (docs/reliability.md)."""

    seed: int = Field(default=0, ge=0)
    fold: bool = True
    timeline: TimelineLevel = "full"
    trace: TraceLevel = "ops+links"
    trace_compress: bool = False
    horizon: Horizon | None = None
    replications: int = Field(default=1, ge=1, le=MAX_REPLICATIONS)


class CollectiveItem(Section):
    """One collective or transfer in a communication-only scenario.

    `group`: "all", a list of GPU indices, or a range "A-B" (inclusive); for send_recv, `src` and `dst`.
    `stream`: items on one stream run in file order, items on different streams concurrently (and contend);
    `after`: names of items that must finish first (on the members they share); `repeat` runs it k times.
    """

    op: Primitive
    bytes: MessageSize
    name: str | None = None
    group: GpuGroup = "all"
    src: int | None = None
    dst: int | None = None
    root: int = 0
    algorithm: AlgorithmChoice | None = None
    protocol: ProtocolChoice | None = None
    stream: str = "comm"
    after: list[str] = []
    repeat: int = Field(default=1, ge=1, le=100_000)

    @model_validator(mode="after")
    def _send_recv_endpoints(self) -> CollectiveItem:
        """A send_recv names its two GPUs by src and dst, and a group, where given, names those two (`all`, the
        default, stands for them: a full dump of the item holds it); a collective takes a group and neither: each
        refusal at the field to change, with what it takes."""
        endpoints = "src and dst GPU indices, e.g. {op: send_recv, bytes: 1 GiB, src: 0, dst: 8}"
        if self.op == "send_recv":
            missing = next((name for name in ("src", "dst") if getattr(self, name) is None), None)
            if missing is not None:
                raise FieldProblem((missing,), f"send_recv needs {missing}, a GPU index", endpoints)
            if self.group != "all" and (len(self.group) != 2 or set(self.group) != {self.src, self.dst}):
                raise FieldProblem(("group",), f"group {self.group} contradicts src {self.src} and dst {self.dst}: "
                                   "a send_recv's group is the two GPUs it sends between",
                                   f"all, or [{self.src}, {self.dst}]")
        else:
            given = next((name for name in ("src", "dst") if getattr(self, name) is not None), None)
            if given is not None:
                raise FieldProblem((given,), f"{given} applies to send_recv only, not {self.op}",
                                   f"group: all, a list of GPU indices or a range A-B for {self.op}")
        return self


class SyntheticModel(Section):
    """Fixed per-stage costs for schedule studies: per stage per micro-batch forward and backward time.

    The backward splits evenly into input-grad and weight-grad; P2P is free unless `p2p_bytes` is given.
    """

    stages: int = Field(ge=1)
    forward: StepDuration
    backward: StepDuration
    p2p_bytes: MessageSize = 0.0


class ModelConfig(Section):
    """A preset name, explicit dimensions (overriding the preset's), or a synthetic cost model; `norm` and
    `bias` override the preset's normalisation and linear biases (a model from dimensions alone: RMSNorm, no
    biases). `experts_dropped` (what `moe: null` sets): no experts, a preset's own included (mixtral-8x7b's dense
    twin); dumped only when true, so every other scenario's dump and digest stay as they were."""

    preset: Annotated[str, AfterValidator(user_value(_model_preset))] | None = None
    layers: int | None = Field(default=None, ge=1)
    hidden: int | None = Field(default=None, ge=1)
    ffn_hidden: int | None = Field(default=None, ge=1)
    heads: int | None = Field(default=None, ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    vocab: int | None = Field(default=None, ge=1)
    gated_mlp: bool | None = None
    norm: Norm | None = None
    bias: bool | None = None
    moe: MoEConfig | None = None
    experts_dropped: bool = Field(default=False, exclude_if=lambda dropped: not dropped,
                                    json_schema_extra=STORED_FIELD)
    synthetic: SyntheticModel | None = None

    @model_validator(mode="before")
    @classmethod
    def _record_dropped_experts(cls, data: Any) -> Any:
        """`moe: null` as a value, `experts_dropped: true`: whether a field was given is invisible to ==,
        model_dump and so to every cache key and digest, which would take the dense twin for its preset."""
        if isinstance(data, dict) and "moe" in data and data["moe"] is None and "experts_dropped" not in data:
            return {**data, "experts_dropped": True}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        explicit = [name for name in ("layers", "hidden", "heads") if getattr(self, name) is not None]
        shaped = self.norm is not None or self.bias is not None
        if self.experts_dropped and self.moe is not None:
            raise ValueError("experts_dropped and a moe section contradict (allowed: a moe section, or moe: null)")
        if self.synthetic is not None and (self.preset or explicit or shaped or self.moe is not None
                                           or self.experts_dropped):
            raise ValueError("give either synthetic costs or a model (preset/dimensions/moe), not both (allowed: "
                             "{synthetic: {...}} alone, or a preset and/or dimensions)")
        if self.synthetic is None and self.preset is None and len(explicit) < 3:
            missing = ", ".join(name for name in ("layers", "hidden", "heads") if name not in explicit)
            raise ValueError(f"a model needs a preset, or at least layers, hidden and heads; {missing} missing "
                             "(allowed: {preset: llama3-8b}, {layers: 32, hidden: 4096, heads: 32} or "
                             "{synthetic: {stages, forward, backward}})")
        return self

    def has_experts(self) -> bool:
        """Whether the model this section describes routes tokens to experts: a `moe:` section, or a preset with
        experts of its own that `moe: null` does not drop."""
        if self.moe is not None:
            return True
        return self.preset is not None and not self.experts_dropped and _preset_has_experts(self.preset)


def _default_grad_reduce(precision: Precision) -> str:
    """The gradient buffer's default format for ``precision`` as a refusal names it: Megatron-LM's, and DeepSpeed's
    under `zero: 3` where it differs."""
    megatron, deepspeed = DEFAULT_GRAD_REDUCE[precision], DEEPSPEED_GRAD_REDUCE[precision]
    return megatron if megatron == deepspeed else f"{megatron}, under zero: 3 {deepspeed}"


class TrainingConfig(Section):
    """Batch, sequence, precision and recompute; `microbatches` overrides global_batch/(micro_batch x dp);
    `loss_scaling` models fp16 dynamic loss scaling over a multi-step run. `grad_accumulation_fusion`: the
    weight-gradient GEMMs add into the accumulator themselves (Megatron-LM since 2022); false runs a separate
    add per weight and micro-batch, as Megatron-LM did before (SC21), or under PyTorch FSDP its own copies;
    left out, the framework's (TrainingConfig.fused_grad_accumulation). `cross_entropy_fusion`: the loss reads
    the logits once per pass; false runs Megatron-LM's unfused fp32 passes (SC21). `layernorm_fusion`: LayerNorm's
    backward reads x and dy once (Transformer Engine); false runs apex's 2021 two-pass kernel (SC21).
    `bias_grad_fusion`: the weight-gradient GEMMs produce the bias gradients; false runs one reduction per
    linear layer (Megatron-LM 2021, SC21). `kernels`: `fused` (Megatron-LM with Transformer Engine) or `eager`
    (plain PyTorch under torch.autocast, unfused: workload/eager.py); `optimizer_step`: torch.optim's `fused`
    update or its default `foreach` one (eager only). `grad_reduce_dtype`: the
    gradient buffer's format, which the micro-batches accumulate into, the data-parallel reduction sends and
    memory holds (default Megatron-LM's: fp32 for bf16 and fp8, fp16 for fp16; bf16 is --grad-reduce-in-bf16;
    under DeepSpeed's `zero: 3` DeepSpeed's, the parameters' 16 bits: gradient_buffer_dtype)."""

    seq_len: int = Field(default=2048, ge=1)
    global_batch: int | None = Field(default=None, ge=1)
    micro_batch: int = Field(default=1, ge=1)
    microbatches: int | None = Field(default=None, ge=1, le=MAX_MICROBATCHES)
    precision: Precision = "bf16"
    recompute: Recompute = "none"
    optimizer: Optimizer = "adam"
    attention: AttentionKernel = "flash"
    grad_accumulation_fusion: bool | None = None
    cross_entropy_fusion: bool = True
    layernorm_fusion: bool = True
    bias_grad_fusion: bool = True
    kernels: KernelEra = "fused"
    optimizer_step: OptimizerStep = "fused"
    grad_reduce_dtype: GradReduceDtype | None = None
    loss_scaling: LossScalingConfig | None = None

    def gradient_buffer_dtype(self, deepspeed_zero3: bool) -> GradReduceDtype:
        """The format the gradients accumulate, reduce and sit in: grad_reduce_dtype if given; else under eager
        fp32 (autocast's fp32 ``.grad``, which DDP reduces as it is and the schema keeps fp32; PyTorch FSDP's
        reduce_dtype, torchtitan's default fp32); under DeepSpeed's ZeRO-3 (``deepspeed_zero3``) the parameters'
        format (DEEPSPEED_GRAD_REDUCE); else Megatron-LM's default for the precision (DEFAULT_GRAD_REDUCE)."""
        if self.grad_reduce_dtype is not None:
            return self.grad_reduce_dtype
        if self.kernels == "eager":
            return "fp32"
        return (DEEPSPEED_GRAD_REDUCE if deepspeed_zero3 else DEFAULT_GRAD_REDUCE)[self.precision]

    def fused_grad_accumulation(self, fsdp: bool) -> bool:
        """Whether the weight-gradient GEMMs accumulate into the gradient buffer (grad_accumulation_fusion),
        resolved for the data-parallel framework: the explicit choice, else true for Megatron-LM and DeepSpeed
        layouts and false under PyTorch FSDP (``fsdp``), which has no such fusion: its post-backward copies and
        adds the autograd gradients (Sharding.grad_copy_bytes); true with FSDP is refused at load."""
        if self.grad_accumulation_fusion is not None:
            return self.grad_accumulation_fusion
        return not fsdp

    @model_validator(mode="after")
    def _loss_scaling_needs_fp16(self) -> TrainingConfig:
        if self.loss_scaling is not None and self.precision not in LOSS_SCALED:
            raise ValueError(f"loss_scaling applies to fp16, not {self.precision} (bf16, fp8 and fp32 keep an "
                             "exponent range that needs none)")
        return self

    @model_validator(mode="after")
    def _foreach_is_torch_optims(self) -> TrainingConfig:
        if self.optimizer_step == "foreach" and self.kernels != "eager":
            raise FieldProblem(("optimizer_step",), "foreach is torch.optim's multi-tensor update, which a plain "
                               "PyTorch step runs; fused kernels update through Megatron-LM's fused optimizer",
                               "fused, or foreach with kernels: eager")
        return self

    @model_validator(mode="after")
    def _eager_runs_pytorchs_kernels(self) -> TrainingConfig:
        """`kernels: eager` is PyTorch's 16-bit mixed precision (torch.autocast, or under FSDP its param_dtype),
        with PyTorch's own kernels: the flags that pick Megatron-LM's fused or 2021 kernels do not apply to it."""
        if self.kernels != "eager":
            return self
        if self.precision not in AUTOCAST_PRECISIONS:
            raise FieldProblem(("kernels",), f"eager kernels are modelled as PyTorch's mixed precision runs them "
                               f"(torch.autocast, or FSDP's param_dtype), in 16 bits, not {self.precision}",
                               f"precision: {' or '.join(AUTOCAST_PRECISIONS)} with eager, or kernels: fused")
        megatron = {"cross_entropy_fusion": False, "layernorm_fusion": False, "bias_grad_fusion": False,
                    "grad_accumulation_fusion": True}
        for name, value in megatron.items():
            if getattr(self, name) is value:
                raise FieldProblem((name,), f"{name}: {str(value).lower()} picks one of Megatron-LM's kernels, "
                                   "and kernels: eager runs PyTorch's own", f"leave {name} out with eager, or "
                                   "kernels: fused")
        return self

    @model_validator(mode="after")
    def _grad_reduce_fits_precision(self) -> TrainingConfig:
        allowed = REDUCE_DTYPES_OF[self.precision]
        if self.grad_reduce_dtype is not None and self.grad_reduce_dtype not in allowed:
            raise FieldProblem(("grad_reduce_dtype",), f"{self.precision} training cannot reduce gradients in "
                               f"{self.grad_reduce_dtype}", f"{', '.join(allowed)} (default "
                               f"{_default_grad_reduce(self.precision)})")
        return self


class PipelineConfig(Section):
    """Pipeline schedule by name (`custom` reads the CSV action table `table`) and interleaving depth."""

    schedule: ScheduleName = "1f1b"
    virtual_stages: int = Field(default=1, ge=1)
    table: str | None = None
    first_last_fewer_layers: bool = False

    def table_path(self, folder: Path) -> Path | None:
        """Where the custom schedule table is: ``table`` read from ``folder``, the scenario file's, as a relative
        path in a scenario reads; None without a table."""
        return folder / self.table if self.table is not None else None

    def schedule_label(self) -> str:
        """The schedule as a run's outputs name it: its registry name, or 'custom: FILE' for a CSV table, FILE its
        file's name (not its folder, which a sweep makes absolute, so one sweep run from two folders writes alike)."""
        if self.schedule != CUSTOM_SCHEDULE:
            return self.schedule
        return f"{CUSTOM_SCHEDULE}: {Path(self.table).name}" if self.table is not None else CUSTOM_SCHEDULE

    @model_validator(mode="after")
    def _table_only_for_custom(self) -> PipelineConfig:
        if self.table is not None and self.schedule != CUSTOM_SCHEDULE:
            raise FieldProblem(("table",), f"a schedule table is read only by schedule {CUSTOM_SCHEDULE!r}, not "
                               f"{self.schedule!r}", f"schedule: {CUSTOM_SCHEDULE} with the table, or no table")
        return self


class DDPConfig(Section):
    """PyTorch DDP gradient buckets and whether their all-reduces overlap the backward; with ZeRO-1/2 (the
    distributed optimizer), `overlap_param_gather` defers the parameter all-gather to the next step's forward
    (Megatron-LM's --overlap-param-gather, off by default there too). `reduce_every_microbatch` says whether
    sharded gradients are reduce-scattered after every micro-batch's backward (only the shard accumulated) or
    accumulated whole and reduce-scattered once; left out, the framework's own behaviour
    (ParallelismConfig.reduce_every_microbatch): ZeRO-2 accumulates (Megatron-LM's distributed optimizer; true
    is PyTorch FSDP outside `no_sync`, DeepSpeed ZeRO-2, Llama 3's FSDP), DeepSpeed ZeRO-3 reduces every
    micro-batch, PyTorch FSDP (`full_shard`, `hybrid_shard`) every micro-batch without pipelining and, under
    torch.distributed.pipelining (pp > 1), once per stage after its last backward (true is refused there: the
    pipeline stage turns FSDP's sync off on every backward)."""

    bucket: BucketSize = 25 * 2**20
    overlap: bool = True
    overlap_param_gather: bool = False
    reduce_every_microbatch: bool | None = None


FsdpStrategy = Literal["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"]
"""PyTorch FSDP's sharding strategies, each run as the ZeRO stage of `FSDP_ZERO_STAGE`."""
FSDP_ZERO_STAGE: dict[FsdpStrategy, int] = {"no_shard": 0, "shard_grad_op": 2, "full_shard": 3, "hybrid_shard": 3}
ZERO_STAGE_NAMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
"""How a run names `zero: 0 | 1 | 2 | 3` (index: the stage): plain DDP, then Megatron-LM / DeepSpeed's ZeRO stages."""
MAX_UNSHARDED_STAGES = 3
"""The local stages torch.distributed.pipelining's runtime keeps unsharded at once under FSDP
(`_add_unshard_reshard(max_active_stages=3)` in torch/distributed/pipelining/schedules.py)."""


class ParallelismConfig(Section):
    """Degrees, placement order (innermost first) and the sharding / bucketing choices; how context
    parallelism gets the sequence's K/V (`cp_algorithm`) and whether it balances the causal work over its
    ranks (`cp_load_balance`, two mirrored chunks per rank); `ep` splits each layer's experts over that many
    ranks of the DP x CP group. `tp_comm_overlap` chunks the TP collectives against their neighbouring GEMMs
    (Megatron-LM's --tp-comm-overlap, off by default; it needs sequence parallelism). `strategy:
    parameter_server` exchanges gradients through the servers of the `ps:` section instead of collectives."""

    strategy: Strategy = "collective"
    tp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    cp_algorithm: CpAlgorithm = "ring"
    cp_load_balance: bool = True
    ep: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dp: int | None = Field(default=None, ge=1)
    order: list[Literal["tp", "cp", "pp", "dp"]] = ["tp", "cp", "pp", "dp"]
    sequence_parallel: bool = False
    tp_comm_overlap: bool = False
    pipeline: PipelineConfig = PipelineConfig()
    zero: int = Field(default=0, ge=0, le=3)
    fsdp: Annotated[FsdpStrategy | None, unset_by_none(get_args(FsdpStrategy))] = None
    ddp: DDPConfig = DDPConfig()

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage the step runs: `fsdp`'s (FSDP_ZERO_STAGE), else `zero`."""
        return FSDP_ZERO_STAGE[self.fsdp] if self.fsdp is not None else self.zero

    @property
    def hybrid_shard(self) -> bool:
        """Whether PyTorch FSDP shards inside each NVLink domain and replicates across them (HSDP)."""
        return self.fsdp == "hybrid_shard"

    @property
    def deepspeed_zero3(self) -> bool:
        """Whether ZeRO-3 runs as DeepSpeed (`zero: 3`), rather than as PyTorch FSDP (`fsdp: ...`)."""
        return self.zero == 3

    @property
    def gathers_per_unit(self) -> bool:
        """Whether ZeRO-3 runs as PyTorch FSDP (`fsdp: full_shard | hybrid_shard`), gathering parameters per
        wrapped unit, rather than as DeepSpeed (`zero: 3`), per submodule."""
        return self.zero_stage == 3 and self.fsdp is not None

    def pipelined_fsdp(self, pp: int) -> bool:
        """Whether PyTorch FSDP (`fsdp: full_shard | hybrid_shard`) runs under torch.distributed.pipelining, with
        ``pp`` pipeline stages (the synthetic model's may differ from `pp`): each unit gathered once per step
        (torchtitan's `reshard_after_forward=not pp_enabled`), the gradients reduced once per stage."""
        return self.gathers_per_unit and pp > 1

    def reduce_every_microbatch(self, pp: int) -> bool:
        """Whether the step reduce-scatters each micro-batch's gradients (DDPConfig.reduce_every_microbatch),
        resolved for ``pp`` pipeline stages: the explicit choice, else the framework's: DeepSpeed ZeRO-3 every
        micro-batch; PyTorch FSDP (`shard_grad_op` as well as `full_shard` / `hybrid_shard`) every micro-batch
        (FSDP2 syncs every backward, as FSDP1 does outside `no_sync`) unless pipelined, where
        torch.distributed.pipelining turns the sync off (`set_requires_gradient_sync(False)`) on every backward
        and reduces each stage's gradients once (`perform_reduce_grad`); Megatron-LM's ZeRO-2 (`zero: 2`)
        never."""
        if self.ddp.reduce_every_microbatch is not None:
            return self.ddp.reduce_every_microbatch
        if self.fsdp is not None and self.zero_stage >= 2:
            return pp == 1
        return self.zero_stage == 3

    @model_validator(mode="after")
    def _one_sharding_choice(self) -> ParallelismConfig:
        if self.fsdp is not None and self.zero:
            raise FieldProblem(("fsdp",), "give zero or fsdp, not both",
                               f"one of them; unset the other with fsdp: {UNSET} or zero: 0")
        every = self.ddp.reduce_every_microbatch
        if every and self.zero_stage not in (2, 3):
            raise FieldProblem(("ddp", "reduce_every_microbatch"),
                               f"applies to sharded gradients (ZeRO-2 and 3), not ZeRO stage {self.zero_stage}",
                               "zero: 2 | 3 or fsdp: shard_grad_op | full_shard | hybrid_shard")
        if self.ddp.overlap_param_gather and self.zero_stage not in (1, 2):
            instead = ("plain DDP gathers no parameters" if self.zero_stage == 0 else
                       "ZeRO-3 gathers each unit's parameters before its use already")
            raise FieldProblem(("ddp", "overlap_param_gather"),
                               "needs ZeRO-1/2 (Megatron-LM's distributed optimizer, as it asserts), whose parameter "
                               f"all-gather after the optimizer it moves into the next forward; {instead}",
                               "false or left out; true with zero: 1 | 2 or fsdp: shard_grad_op")
        if every is False and self.zero_stage == 3 and self.fsdp is None:
            raise FieldProblem(("ddp", "reduce_every_microbatch"),
                               "DeepSpeed ZeRO-3 (zero: 3) reduce-scatters every micro-batch's gradients; it "
                               "cannot accumulate them unsharded",
                               "true or left out; fsdp: full_shard for PyTorch FSDP's no-sync accumulation")
        return self

    @model_validator(mode="after")
    def _order_names_each_dimension_once(self) -> ParallelismConfig:
        if sorted(self.order) != ["cp", "dp", "pp", "tp"]:
            raise FieldProblem(("order",), f"order {self.order} must name each of tp, cp, pp, dp once",
                               "a permutation of [tp, cp, pp, dp]")
        return self


class Scenario(Section):
    """A whole scenario file: a cluster plus either a training step (model, training, parallelism), a
    communication-only workload list, or a trace to replay (`workload: {trace: ...}`)."""

    cluster: ClusterConfig = Field(description="a section such as {topology: dgx-h100-cluster, nodes: 16}")
    network: NetworkConfig = NetworkConfig()
    collectives: CollectivesConfig = CollectivesConfig()
    run: RunConfig = RunConfig()
    workload: list[CollectiveItem] | TraceWorkload = []
    model: ModelConfig | None = None
    training: TrainingConfig = TrainingConfig()
    parallelism: ParallelismConfig = ParallelismConfig()
    ps: ParameterServerConfig | None = None
    faults: FaultsConfig = FaultsConfig()
    published: PublishedConfig | None = None
    checkpoint: CheckpointConfig = CheckpointConfig()
    storage: StorageConfig = StorageConfig()
    restart: RestartConfig = RestartConfig()
    costs: CostsConfig = Field(default=NO_COSTS, exclude_if=lambda costs: costs == NO_COSTS)
    description: str = ""

    @property
    def uses_parameter_servers(self) -> bool:
        """Whether data parallelism runs through parameter servers (`parallelism.strategy: parameter_server`,
        which the schema admits only with a `ps:` section, and a `ps:` section only with it)."""
        return self.parallelism.strategy == "parameter_server"

    @property
    def pipeline_stages(self) -> int:
        """The step's pipeline depth: the synthetic model's stage count where it gives one (`parallelism.pp`
        must then be left out or the same, checked with the cluster), else `parallelism.pp`."""
        synthetic = self.model.synthetic if self.model is not None else None
        return synthetic.stages if synthetic is not None else self.parallelism.pp

    @model_validator(mode="after")
    def _fsdp_does_not_fuse(self) -> Scenario:
        if self.training.grad_accumulation_fusion and self.parallelism.fsdp is not None:
            raise FieldProblem(("training", "grad_accumulation_fusion"),
                               f"PyTorch FSDP (parallelism.fsdp: {self.parallelism.fsdp}) has no gradient "
                               "accumulation fused into the weight-gradient GEMMs (Megatron-LM's "
                               "--gradient-accumulation-fusion): its post-backward copies and adds the gradients "
                               "autograd wrote", "false or left out with parallelism.fsdp; true with Megatron-LM "
                               "or DeepSpeed layouts (zero)")
        return self

    @model_validator(mode="after")
    def _eager_on_data_parallel_ranks(self) -> Scenario:
        """`training.kernels: eager` models torch.autocast over each rank's own fp32 weights (plain PyTorch DDP,
        optionally pipelined) and PyTorch FSDP2's fully_shard over fp32 shards gathered in 16 bits (`fsdp:
        full_shard | hybrid_shard`, as torchtitan runs it); shard_grad_op and no_shard are FSDP1 strategies it
        does not model, and a ZeRO optimizer keeps 16-bit weights with an fp32 master copy; experts,
        parameter-server workers, tensor, context and sequence parallelism run kernels or casts the eager list
        does not cover, and a synthetic model has no kernels."""
        if self.training.kernels != "eager":
            return self
        par, model = self.parallelism, self.model
        if par.fsdp is not None and par.zero_stage != 3:
            raise FieldProblem(("parallelism", "fsdp"), f"fsdp {par.fsdp}: eager kernels are modelled with FSDP2's "
                               "fully_shard (its fp32 shards gathered in 16 bits per unit, torchtitan's default), "
                               "not FSDP1's other strategies", "full_shard or hybrid_shard with eager, no fsdp "
                               "(plain DDP), or training.kernels: fused")
        if par.fsdp is None and self.training.grad_reduce_dtype not in (None, "fp32"):
            raise FieldProblem(("training", "grad_reduce_dtype"), f"grad_reduce_dtype "
                               f"{self.training.grad_reduce_dtype}: under kernels: eager without fsdp the gradients "
                               "are the fp32 weights' fp32 .grad, which DDP reduces as it is", "fp32 or left out "
                               "with eager DDP; a 16-bit reduce_dtype with parallelism.fsdp: full_shard, or "
                               "kernels: fused")
        if model is not None and model.synthetic is not None:
            raise FieldProblem(("training", "kernels"), "a synthetic model gives its stages' costs, which no kernel "
                               "list builds, so eager kernels would change nothing", "fused with model.synthetic, "
                               "or a preset or dimensions with eager")
        for name, degree in (("tp", par.tp), ("cp", par.cp)):
            if degree > 1:
                raise FieldProblem(("parallelism", name), f"{name} {degree}: eager kernels are modelled for data-"
                                   "parallel ranks (plain DDP or FSDP), where each rank's norms, residual adds and "
                                   "autocast's casts see whole tensors; PyTorch's tensor and context parallelism "
                                   "around them is not modelled",
                                   f"{name} 1 with training.kernels: eager (dp and pp), or fused")
        if par.sequence_parallel:
            raise FieldProblem(("parallelism", "sequence_parallel"), "sequence parallelism splits the norms and "
                               "residual adds over a TP group, which training.kernels: eager does not model",
                               "false with eager, or training.kernels: fused")
        if par.tp_comm_overlap:
            raise FieldProblem(("parallelism", "tp_comm_overlap"), "tp_comm_overlap is Transformer Engine's "
                               "userbuffers overlap of TP collectives with GEMM chunks, which plain PyTorch (training."
                               "kernels: eager) does not run", "false with eager, or training.kernels: fused")
        if par.zero:
            raise FieldProblem(("parallelism", "zero"), f"zero {par.zero} runs a sharded optimizer over 16-bit "
                               "weights with an fp32 master copy (DeepSpeed, Megatron-LM's distributed optimizer); "
                               "training.kernels: eager shards its fp32 state with PyTorch FSDP instead",
                               "fsdp: full_shard (or hybrid_shard) with eager, zero 0 (plain DDP), or "
                               "training.kernels: fused")
        if self.uses_parameter_servers:
            raise FieldProblem(("training", "kernels"), "eager kernels are modelled for a collective step, not "
                               "parameter-server workers", "fused with parallelism.strategy: parameter_server")
        if model is not None and model.has_experts():
            raise FieldProblem(("training", "kernels"), "eager kernels are modelled for dense layers; the "
                               "experts' routing and grouped GEMMs are not", "fused with a mixture of experts")
        return self

    @model_validator(mode="after")
    def _one_workload(self) -> Scenario:
        trace = isinstance(self.workload, TraceWorkload)
        if self.model is not None and trace:
            raise FieldProblem(("model",), "a replayed trace (workload.trace) brings its own step; model describes a "
                               "modelled one", "leave model out: workload.tokens_per_step and model_flops_per_token "
                               "give throughput and MFU")
        if self.model is not None and self.workload:
            raise FieldProblem(("model",), "a workload list already says what to simulate; give either a training "
                               "step (model) or a workload list, not both", "model with no workload, or a workload "
                               "list with no model")
        if self.model is None and not self.workload:
            raise ValueError("nothing to simulate: add a model (training step), a workload list or a trace "
                             "(allowed: model: {preset: ...}, workload: [{op: ..., bytes: ...}] or workload: "
                             "{trace: ...})")
        if trace:
            for name in ("training", "parallelism"):
                if getattr(self, name).model_fields_set:
                    raise FieldProblem((name,), f"a replayed trace brings its own step; {name} describes a modelled "
                                       "one and would be ignored", "leave it out: workload.dp replicates the "
                                       "trace, workload.tokens_per_step and model_flops_per_token give throughput")
        return self

    @model_validator(mode="after")
    def _parameter_servers(self) -> Scenario:
        """A `ps:` section and `parallelism.strategy: parameter_server` come together; its workers each hold a
        whole dense model for a few iterations (docs/parameter_server.md)."""
        par = self.parallelism
        if self.ps is not None and not self.uses_parameter_servers:
            raise FieldProblem(("ps",), "a ps: section needs parallelism.strategy: parameter_server",
                               "parallelism.strategy: parameter_server, or no ps: section")
        if not self.uses_parameter_servers:
            return self
        if self.ps is None:
            raise FieldProblem(("parallelism", "strategy"), "parameter_server needs a ps: section naming the server "
                               "hosts", "ps: {servers: N} (hosts that serve)")
        for name, whole in WORKER_PARALLELISM.items():
            if getattr(par, name) != whole:
                raise FieldProblem(("parallelism", name), f"{name} {getattr(par, name)}: parameter-server workers "
                                   "each hold the whole model and the servers the optimizer state",
                                   f"{whole}, or strategy: collective")
        if par.dp is not None:
            raise FieldProblem(("parallelism", "dp"), "with parameter servers every worker GPU is a data-parallel "
                               "rank", "leave it out: the workers are the GPUs of the hosts that do not serve")
        if par.fsdp is not None:
            raise FieldProblem(("parallelism", "fsdp"), f"fsdp {par.fsdp}: parameter-server workers each hold the "
                               "whole model and the servers the optimizer state", "leave it out, or strategy: "
                               "collective")
        model = self.model
        if model is None or model.synthetic is not None or model.moe is not None:
            raise FieldProblem(("model",), "parameter servers need a dense transformer model (its parameters are "
                               "what they hold)", "a preset or dimensions, without synthetic or moe")
        if model.has_experts():
            raise FieldProblem(("model", "preset"), f"preset {model.preset} is a mixture of experts; parameter "
                               "servers need a dense transformer model (its parameters are what they hold)",
                               "a dense preset or dimensions")
        if self.run.horizon is not None:
            raise FieldProblem(("run", "horizon"), "a job simulation repeats one training step; a parameter-server "
                               "run is several iterations of workers that drift apart",
                               "no run.horizon with parameter servers")
        return self

    @model_validator(mode="after")
    def _pipelined_fsdp(self) -> Scenario:
        """What PyTorch FSDP under torch.distributed.pipelining cannot run, for the step's pipeline depth (a
        synthetic model's stage count may stand for `pp`)."""
        par = self.parallelism
        if not par.pipelined_fsdp(self.pipeline_stages):
            return self
        if par.ddp.reduce_every_microbatch:
            raise FieldProblem(("parallelism", "ddp", "reduce_every_microbatch"),
                               "torch.distributed.pipelining turns PyTorch FSDP's gradient sync off on every backward "
                               "and reduce-scatters each stage's gradients once per step; no PyTorch runtime "
                               "reduce-scatters every micro-batch under pipelining",
                               "false or left out with fsdp: full_shard | hybrid_shard and pp > 1; true with fsdp: "
                               "shard_grad_op (ZeRO-2, as Llama 3's own runtime)")
        chunks = par.pipeline.virtual_stages
        if chunks > MAX_UNSHARDED_STAGES:
            raise FieldProblem(("parallelism", "pipeline", "virtual_stages"),
                               f"{chunks} chunks per rank: PyTorch FSDP under torch.distributed.pipelining keeps at "
                               f"most {MAX_UNSHARDED_STAGES} stages unsharded (_add_unshard_reshard's "
                               "max_active_stages) and gathers the others again as the schedule cycles, which is not "
                               "modelled", f"1 to {MAX_UNSHARDED_STAGES} with fsdp: full_shard | hybrid_shard and "
                               "pp > 1")
        return self
