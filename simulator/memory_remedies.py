"""What would lower a layout's peak memory per GPU, for the out-of-memory line and the elastic refusal.

Each candidate is a few `--set`s (sharding further, recompute, more cp, tp or pp, a smaller micro-batch, the
pipeline schedule of the same bubble). It is built the way `--set` builds a scenario (the loaded data with the
settings written over it, then the loader's validation), its step resolved and its memory plan computed (a few ms
each once the run has costed its kernels); it is kept only where the loader, the step's checks and the batch check
(`refuse_inconsistent_batch`) take it, its step warns of nothing new (nor spreads its TP group over more NVLink
domains than the scenario's does), it lowers the peak by at least what the memory plan leaves out (`_tried`)
and, for a job over weeks (`run.horizon`), the whole job with it passes the checks of the sizes an elastic job
restarts on (`reliability/elastic.check_sizes`: min_replicas, each smaller size's step, a smaller size that fits).
Nothing here restates what those checks refuse or what the memory plan computes. The job's other checks (spares,
failures, checkpoint, the horizon against one step) are not run. """

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from simulator.config.loader import LoadedScenario, scenario_from_data
from simulator.config.parallelism_options import SCHEDULE_FIELD, VIRTUAL_STAGES_FIELD, BuiltinSchedule
from simulator.config.yaml_source import FieldPath, parse_field, parse_value
from simulator.errors import InputError
from simulator.parallel.experts import expert_sharding
from simulator.parallel.layout import Layout
from simulator.scenario_checks import refuse_inconsistent_batch
from simulator.topology.graph import Topology
from simulator.topology.loader import scenario_topology
from simulator.workload import memory_plan
from simulator.workload.memory_plan import GIB, stage_memory
from simulator.workload.training import build_training_step, tp_domains

SAME_BUBBLE_SCHEDULE: dict[tuple[BuiltinSchedule, bool], tuple[BuiltinSchedule, ...]] = {
    ("gpipe", False): ("1f1b",),
    ("looped-bfs", False): ("1f1b",),
    ("looped-bfs", True): ("interleaved", "1f1b"),
}
"""The schedules offered in place of (a schedule, whether it runs more than one chunk per rank), the first the
step takes: one of the same bubble (docs/schedules.md: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(m v+p-1) for
looped-bfs and interleaved), so about the same step, with about p micro-batches' activations in flight instead of
all m (GPipe and looped-BFS run every forward first); 1F1B on one chunk where interleaved is refused (m not a
multiple of max(1, m // p)). Llama 3 70B on 256 H100 (TP 8, PP 4, 32 micro-batches): gpipe 199.1 GiB, 7.876 s; 1f1b
36.8 GiB, 7.871 s."""

COMPUTE_FIELDS = ("training.recompute",)
"""The fields whose remedies run more compute (recompute runs a forward again: +33% for full): a remedy that fits
without them is listed first."""

LAYOUT_STEPS = 3
"""How many multiples of tp, pp or cp a layout remedy tries: the smallest factors of dp, which keep the GPUs."""

MAX_LAYOUT_FACTOR = 8
"""The most a layout remedy multiplies tp, pp or cp by: beyond it the layout is another job's, and weighing it
costs seconds (pp 315 for the 529.6B row's 105 layers built its schedule for 6 s before the step refused it)."""

CLUSTER_FACTORS = (2, 4)
"""The multiples of the cluster's size a MoE remedy tries where one rank holds the routed experts' state whole:
twice the GPUs at the same ep put it over two ranks, halving it, four times over four."""


@dataclass(frozen=True)
class Remedy:
    """One change that lowers the peak: its `--set`s (``a.b=value``, as typed), what it saves (bytes), the peak it
    leaves and the GPU's capacity (bytes), and what it changes beyond the settings where they do not say it
    (``note``: the expert-data-parallel group a larger cluster gives)."""

    settings: tuple[str, ...]
    saved_bytes: float
    peak_bytes: float
    capacity_bytes: float
    note: str = ""

    @property
    def fits(self) -> bool:
        """Whether the peak it leaves fits in the GPU."""
        return self.peak_bytes <= self.capacity_bytes

    @property
    def costs_compute(self) -> bool:
        """Whether the remedy runs more compute per step (COMPUTE_FIELDS)."""
        return any(setting.split("=", 1)[0] in COMPUTE_FIELDS for setting in self.settings)

    @property
    def text(self) -> str:
        """The settings as a user pastes them, what they save and what they leave: '--set parallelism.zero=3
        (-12.4 GiB, fits)', '--set parallelism.cp=8 (-3.0 GiB, still 83.1 of 79.6 GiB)'."""
        sets = " ".join(f"--set {setting}" for setting in self.settings)
        left = ("fits" if self.fits
                else f"still {self.peak_bytes / GIB:,.1f} of {self.capacity_bytes / GIB:,.1f} GiB")
        return f"{sets} (-{self.saved_bytes / GIB:,.1f} GiB, {left}{f': {self.note}' if self.note else ''})"


@dataclass(frozen=True)
class Peak:
    """A scenario's peak memory per GPU and the GPU's capacity (bytes), with its resolved layout (None for a
    parameter-server run, which has no layout to change), its transformer layers (None without), the fields its
    step's warnings name (`parallelism.tp` for a TP group across NVLink domains), the most NVLink domains
    one of its TP groups spans, the fields of its choices no framework trains
    (`LoadedScenario.unframed_fields`), and the ranks that shard its routed experts' state (the expert-data-parallel
    group, `parallel/experts.expert_sharding`; None without routed experts)."""

    bytes: float
    capacity: float
    layout: Layout | None
    layers: int | None = None
    warned: frozenset[FieldPath] = frozenset()
    tp_domains: int = 1
    unframed: frozenset[str] = frozenset()
    expert_dp: int | None = None


def peak_memory(loaded: LoadedScenario, topology: Topology) -> Peak:
    """The peak memory per GPU the run's summary reports, without building its ops: the transformer's memory
    plan over its pipeline stages (`stage_memory`), or a parameter-server run's fuller GPU, worker or server."""
    scenario = loaded.scenario
    if scenario.uses_parameter_servers:
        from simulator.parameter_server.program import ps_program

        memory = ps_program(scenario, topology).memory
        return Peak(cast(float, memory["peak_memory_gib"]) * GIB, cast(float, memory["memory_capacity_gib"]) * GIB,
                    None)
    step = build_training_step(scenario, topology, Path(loaded.source).parent)
    peak = max(breakdown.total for breakdown, _ in stage_memory(scenario, step))
    warned = frozenset(field for field, _ in step.warnings)
    layout = step.plan.layout
    expert_dp = (expert_sharding(step.plan.sharding, scenario.parallelism.ep, layout.tp).degree
                 if step.model is not None and step.model.moe is not None else None)
    return Peak(peak, step.gpu.hbm_bytes, layout, step.model.layers if step.model else None, warned,
                tp_domains(layout, topology.gpu_domain_array), loaded.unframed_fields(), expert_dp)


def memory_remedies(loaded: LoadedScenario, topology: Topology | None = None,
                    base_settings: Sequence[str] = ()) -> tuple[Remedy, ...] | None:
    """The remedies for ``loaded``'s layout on ``topology`` (its cluster, built here when not given): those that fit
    without more compute first (not recompute, COMPUTE_FIELDS), then those that fit with more, then those that do
    not fit, with more compute or without, each the one that saves most first. Of each knob's candidates
    (`candidates`, smallest change first) the first whose peak fits, else the one that saves most.
    ``base_settings``: `--set`s that make the scenario whose memory is weighed (an elastic job shrunk to fewer
    replicas); a remedy never touches the fields they set, and they are not printed. Where the routed experts' state
    is sharded over one rank, also the larger cluster that shards it (`_expert_remedy`; not for an elastic job's
    shrunk sizes, `base_settings`). None (nothing weighed) where the scenario cannot be rebuilt from its data
    (`LoadedScenario.written`), or has no modelled memory (a trace, a communication-only workload)."""
    if loaded.written is None or loaded.scenario.workload or loaded.scenario.model is None:
        return None
    base = rebuilt(loaded, base_settings) if base_settings else loaded
    topology = topology if topology is not None else scenario_topology(base)
    before = peak_memory(base, topology)
    fixed = {parse_field(setting.split("=", 1)[0]) for setting in base_settings}
    found = []
    for index, group in enumerate(candidates(loaded, before)):
        best: Remedy | None = None
        for settings in group:
            if any(parse_field(setting.split("=", 1)[0]) in fixed for setting in settings):
                continue
            remedy = _tried(loaded, topology, before, base_settings, settings)
            if remedy is not None and (best is None or remedy.saved_bytes > best.saved_bytes):
                best = remedy
            if best is not None and best.fits:
                break
        if best is not None:
            found.append((not best.fits, best.fits and best.costs_compute, -best.saved_bytes, index, best))
    expert = _expert_remedy(loaded, before) if not base_settings else None
    if expert is not None:
        found.append((not expert.fits, expert.fits and expert.costs_compute, -expert.saved_bytes, len(found),
                      expert))
    return tuple(remedy for *_, remedy in sorted(found, key=lambda item: item[:4]))


def remedies_text(remedies: Sequence[Remedy] | None, whole_model: bool = False) -> str:
    """The remedies joined for one line, each with the peak it leaves, led by a larger GPU or more GPUs where
    none fits; or what to do where none is found, or where none was weighed (None). ``whole_model``: each GPU
    holds the whole model (a parameter-server worker, with no layout to spread it over), so more GPUs do not
    help and a smaller model takes their place."""
    other = "a smaller model" if whole_model else "more GPUs"
    if remedies is None:
        return (f"sharding further, recompute, a smaller micro-batch, another pipeline schedule, a larger GPU or "
                f"{other}: no setting weighed")
    if not remedies:
        return f"no single setting the checks take saves 1 GiB or more: a larger GPU, or {other}"
    listed = "; ".join(remedy.text for remedy in remedies)
    if any(remedy.fits for remedy in remedies):
        return listed
    return f"a larger GPU or {other}: no single setting weighed fits, the most each saves: {listed}"


def rebuilt(loaded: LoadedScenario, settings: Sequence[str]) -> LoadedScenario:
    """``loaded``'s data with ``settings`` written over it and validated, as `--set` does."""
    assert loaded.written is not None
    return scenario_from_data(loaded.written, loaded.lines, loaded.source, list(settings))


def _tried(loaded: LoadedScenario, topology: Topology | None, before: Peak, base_settings: Sequence[str],
           settings: tuple[str, ...], note: str = "") -> Remedy | None:
    """``settings`` as a remedy, or None where the loader or the step's checks refuse them, where they save less
    than the memory plan leaves out (`memory_plan.UNMODELLED_BYTES`, 1 GiB, read from the plan at use: the CUDA
    context, NCCL's buffers and the caching allocator's fragmentation; a smaller saving, such as ZeRO-3's 0.15 GiB of
    a MoE model's 1,000 on a long sequence, is within what the plan does not count and would not be seen in a real
    job), where the step warns of a field it did not warn of before (a TP group stretched
    across NVLink domains fits, and crawls) or warns of a choice no framework trains at a field it did not warn
    of so before (DeepSpeed's ZeRO-2 under pipelining, `LoadedScenario.unframed_fields`) or spreads its TP group
    over more NVLink domains than before (a layout whose TP 16 spans two hosts already was offered TP 128 across
    sixteen first, as the remedy that saved most), or where the whole job with them fails its elastic sizes'
    checks (`_check_job`). ``topology``: the cluster the settings leave (None: the one they build, for a
    settings of the cluster's size)."""
    try:
        changed = rebuilt(loaded, [*base_settings, *settings])
        topology = topology if topology is not None else scenario_topology(changed)
        refuse_inconsistent_batch(changed, topology.num_gpus)
        after = peak_memory(changed, topology)
        saved = before.bytes - after.bytes
        if (saved < memory_plan.UNMODELLED_BYTES or not after.warned <= before.warned
                or after.tp_domains > before.tp_domains or not after.unframed <= before.unframed):
            return None
        if loaded.scenario.run.horizon is not None:
            _check_job(rebuilt(loaded, settings) if base_settings else changed, None if base_settings else topology)
    except InputError:
        return None
    return Remedy(settings, saved, after.bytes, after.capacity, note)


def _expert_remedy(loaded: LoadedScenario, peak: Peak) -> Remedy | None:
    """Where the routed experts' state is sharded over an expert-data-parallel group of one rank (tp x dp x cp /
    ep = 1, `parallel/experts.expert_sharding`), the cluster of the smallest multiple (`CLUSTER_FACTORS`) of its size
    parameter (`topology/size.SIZE_PARAMETERS`, when it has one) that fits, else the one that saves most, each
    with dp multiplied by as much where the scenario gives dp, the same ep and the micro-batches that keep the
    global batch (`kept_batch`). No setting on the same GPUs shards that state: a smaller ep or ZeRO-3 and FSDP
    over an expert group of one rank leave each rank the same optimizer state and more weights (the DeepSeek-V3-
    style step on 16 H100, ep 8: 86.1 GiB; ep 4 109.7, ep 2 156.9, zero 3 112.5, full_shard 102.6 GiB). None
    without such a group, a cluster size to change, or a multiple the checks take."""
    from simulator.topology.loader import scenario_source_or_none
    from simulator.topology.size import SIZE_PARAMETERS

    source = scenario_source_or_none(loaded)
    layout = peak.layout
    if peak.expert_dp != 1 or layout is None or source is None:
        return None
    names = [name for name in SIZE_PARAMETERS.get(source.kind, ()) if isinstance(source.params.get(name), int)]
    if len(names) != 1:
        return None
    size, scenario = source.params[names[0]], loaded.scenario
    note = (f"the routed experts' state is sharded over an expert-data-parallel group of 1 rank (tp x dp x cp / ep "
            f"= {layout.tp} x {layout.dp} x {layout.cp} / {scenario.parallelism.ep}), which more GPUs at the same "
            "ep shard")
    best: Remedy | None = None
    for factor in CLUSTER_FACTORS:
        dp = (f"parallelism.dp={layout.dp * factor}",) if scenario.parallelism.dp is not None else ()
        for batch in kept_batch(loaded, layout.dp, layout.dp * factor, scenario.training.micro_batch):
            remedy = _tried(loaded, None, peak, (), (f"cluster.{names[0]}={size * factor}", *dp, *batch), note)
            if remedy is not None and (best is None or remedy.saved_bytes > best.saved_bytes):
                best = remedy
        if best is not None and best.fits:
            break
    return best


def _check_job(job: LoadedScenario, topology: Topology | None) -> None:
    """Raise what the sizes of ``job`` (on ``topology``, its cluster, built here when not given) an elastic job
    restarts on fail, as `trainsim validate` does: a remedy of its step that leaves min_replicas above its
    replicas, or none of its smaller sizes in GPU memory, would be refused."""
    from simulator.reliability.elastic import check_sizes

    check_sizes(job, topology if topology is not None else scenario_topology(job))


def candidates(loaded: LoadedScenario, peak: Peak) -> list[list[tuple[str, ...]]]:
    """The candidate changes by knob, each knob's smallest change first, leaving out settings the scenario
    already has: sharding (ZeRO-1, ZeRO-2 or -3 with the reduce-scatter every micro-batch they may need, FSDP's
    full_shard; ZeRO-1 first, the smallest change from ZeRO-0 and often all it takes: Llama 3 8B on 8 H100 goes
    from 153.6 to 75.1 GiB, where the list once offered only ZeRO-2 beside a second setting), recompute, the
    schedule of the same bubble with fewer micro-batches in flight
    (`SAME_BUBBLE_SCHEDULE`), then (with a layout) cp, tp and pp, each multiplied by a factor of dp (`_factors`)
    with dp divided by as much where the scenario gives dp, pp no more than the model's layers (a stage without
    a layer), and a smaller micro-batch; each of these last with the micro-batches that keep the global batch
    where the scenario gives them (`kept_batch`), so the suggestion runs as pasted. Not ep: a larger EP
    group samples the routing again for each of its ranks (9 to 31 s a candidate on the DeepSeek-V3-style step
    at seq 65536, where the step itself takes 5 s)."""
    scenario = loaded.scenario
    every = "parallelism.ddp.reduce_every_microbatch=true"
    groups: list[list[tuple[str, ...]]] = [
        [("parallelism.zero=1",), ("parallelism.zero=2", every), ("parallelism.zero=3",), ("parallelism.zero=3", every),
         ("parallelism.fsdp=full_shard", "parallelism.zero=0")],
        [("training.recompute=selective",), ("training.recompute=full",)],
    ]
    pipeline = scenario.parallelism.pipeline
    chunked = pipeline.virtual_stages > 1
    same_bubble = next((offered for (schedule, many), offered in SAME_BUBBLE_SCHEDULE.items()
                        if schedule == pipeline.schedule and many == chunked), ())
    if same_bubble:
        groups.append([(f"{SCHEDULE_FIELD}={schedule}",) + ((f"{VIRTUAL_STAGES_FIELD}=1",) if schedule == "1f1b"
                                                             and chunked else ())
                       for schedule in same_bubble])
    if peak.layout is not None:
        layout = peak.layout
        dp_given = scenario.parallelism.dp is not None
        for name, value in (("cp", layout.cp), ("tp", layout.tp), ("pp", layout.pp)):
            groups.append([(f"parallelism.{name}={value * factor}",
                            *((f"parallelism.dp={layout.dp // factor}",) if dp_given else ()), *batch)
                           for factor in _factors(layout.dp)
                           if name != "pp" or peak.layers is None or value * factor <= peak.layers
                           for batch in kept_batch(loaded, layout.dp, layout.dp // factor,
                                                    scenario.training.micro_batch)])
        groups.append([(f"training.micro_batch={size}", *batch) for size in _halvings(scenario.training.micro_batch)
                       for batch in kept_batch(loaded, layout.dp, layout.dp, size)])
    else:
        groups.append([(f"training.micro_batch={size}",) for size in _halvings(scenario.training.micro_batch)])
    return [_unique(loaded, group) for group in groups]


def kept_batch(loaded: LoadedScenario, dp: int, new_dp: int, new_micro_batch: int) -> list[tuple[str, ...]]:
    """The `--set` of the micro-batches that keeps the step's global batch on ``new_dp`` replicas of
    ``new_micro_batch`` sequences, where the scenario gives the micro-batches (with a global batch, which
    `scenario_checks.refuse_inconsistent_batch` refuses to disagree, or without, which the micro-batches then
    make on the replicas): one empty tuple where it gives no micro-batches, none where no whole number of
    micro-batches keeps it."""
    training = loaded.scenario.training
    if training.microbatches is None:
        return [()]
    sequences = training.microbatches * training.micro_batch * dp
    per_step = new_micro_batch * new_dp
    if sequences % per_step:
        return []
    return [(f"training.microbatches={sequences // per_step}",)]


def _factors(dp: int) -> list[int]:
    """The first `LAYOUT_STEPS` factors of ``dp`` from 2 to `MAX_LAYOUT_FACTOR`: what a layout knob can multiply
    by, dp divided by as much, so the layout keeps its GPUs."""
    return [factor for factor in range(2, MAX_LAYOUT_FACTOR + 1) if dp % factor == 0][:LAYOUT_STEPS]


def _halvings(size: int) -> Iterator[int]:
    while size > 1:
        size //= 2
        yield size


def _unique(loaded: LoadedScenario, group: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """``group`` without the settings the scenario already has, and without what is left empty or repeated."""
    kept: list[tuple[str, ...]] = []
    for settings in group:
        changed = tuple(setting for setting in settings if not _already(loaded, setting))
        if changed and changed not in kept:
            kept.append(changed)
    return kept


def _already(loaded: LoadedScenario, setting: str) -> bool:
    """Whether the scenario already holds the value ``setting`` writes."""
    key, text = setting.split("=", 1)
    node: object = loaded.scenario
    for part in parse_field(key):
        node = getattr(node, str(part), None)
    return getattr(node, "value", node) == parse_value(text)
