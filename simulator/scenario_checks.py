"""Checks across a scenario's fields that need its layout's data-parallel degree (from the cluster's GPUs): the
global batch against the micro-batches that override it, the interleaved schedule on one chunk per rank, and a
pipeline of fewer micro-batches than stages.

A `training.global_batch` and `training.microbatches` that disagree are refused where the file gives both (or
`--set`s give both): microbatches, which win, made the step run another global batch than the file says without a
word. A `--set training.microbatches` over the file's global batch runs and says the global batch it makes; a
`--set training.global_batch` that the file's microbatches would override is refused, since it changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.config.loader import LoadedScenario
from simulator.config.locate import located
from simulator.schedules.base import PLACEMENT_SITTING, Placement

if TYPE_CHECKING:
    from simulator.topology.graph import Topology

MICROBATCHES = ("training", "microbatches")
GLOBAL_BATCH = ("training", "global_batch")
BATCH_READS = (("training", "micro_batch"), ("parallelism",), ("cluster",), ("ps",))
"""The fields besides the two whose values make the global batch the micro-batches run: a `--set` of any of them
is named where the two disagree."""


@dataclass(frozen=True)
class BatchConflict:
    """Micro-batches that run another global batch than `training.global_batch` says: ``microbatches`` of
    ``micro_batch`` sequences on each of ``dp`` replicas, named ``replicas``, in each ``unit`` (a parameter-server
    run's replicas are its workers, its unit an iteration)."""

    microbatches: int
    micro_batch: int
    dp: int
    global_batch: int
    replicas: str = "dp"
    unit: str = "a step"

    @property
    def sequences(self) -> int:
        """The sequences a step (an iteration) runs: the global batch the micro-batches make."""
        return self.microbatches * self.micro_batch * self.dp

    @property
    def product(self) -> str:
        """The global batch the micro-batches make, worked out: 'microbatches 16 x micro_batch 1 x dp 8 = 128'."""
        return (f"microbatches {self.microbatches:,} x micro_batch {self.micro_batch:,} x {self.replicas} "
                f"{self.dp:,} = {self.sequences:,}")

    @property
    def agreeing(self) -> str:
        """The micro-batches that would make the global batch, where a whole number of them does."""
        per_step = self.micro_batch * self.dp
        if self.global_batch % per_step:
            return f"a global_batch that is a multiple of micro_batch x {self.replicas} = {per_step:,}"
        return f"microbatches: {self.global_batch // per_step:,} for global_batch: {self.global_batch:,}"


def _is_modelled_step(loaded: LoadedScenario) -> bool:
    """Whether the scenario's step is the transformer model's, whose micro-batches the layout counts."""
    scenario = loaded.scenario
    return (scenario.model is not None and isinstance(scenario.workload, list)
            and not scenario.uses_parameter_servers)


def data_parallel(loaded: LoadedScenario, gpus: int) -> int:
    """The layout's data-parallel degree on ``gpus`` GPUs (errors located at the scenario's fields)."""
    from simulator.workload.training import pipeline_depth, resolve_layout

    scenario = loaded.scenario
    return located(loaded, lambda: resolve_layout(scenario, gpus, pipeline_depth(scenario)).dp)


def batch_conflict(loaded: LoadedScenario, gpus: int, topology: Topology | None = None) -> BatchConflict | None:
    """The micro-batches and global batch the scenario gives both of, where they disagree on ``gpus`` GPUs; a
    parameter-server run's workers, in dp's place, are counted on ``topology`` (None: not known, no conflict)."""
    scenario = loaded.scenario
    training = scenario.training
    if training.microbatches is None or training.global_batch is None:
        return None
    if scenario.ps is not None and topology is not None:
        from simulator.parameter_server.placement import place

        ps = scenario.ps
        conflict = BatchConflict(training.microbatches, training.micro_batch,
                                 len(located(loaded, lambda: place(ps, topology)).workers), training.global_batch,
                                 "workers", "an iteration")
    elif _is_modelled_step(loaded):
        conflict = BatchConflict(training.microbatches, training.micro_batch, data_parallel(loaded, gpus),
                                 training.global_batch)
    else:
        return None
    return conflict if conflict.sequences != conflict.global_batch else None


def refuse_inconsistent_batch(loaded: LoadedScenario, gpus: int, topology: Topology | None = None) -> None:
    """Refuse micro-batches and a global batch that disagree on ``gpus`` GPUs (a parameter-server run's workers
    counted on ``topology``), unless a `--set` of the micro-batches alone wrote over the file's global batch
    (`batch_override_warning` says so): given both in the file (or both by overrides) they contradict each
    other, and a global batch an override wrote under the file's micro-batches would change nothing."""
    conflict = batch_conflict(loaded, gpus, topology)
    if conflict is None:
        return
    microbatches_set, global_batch_set = loaded.override_of(MICROBATCHES), loaded.override_of(GLOBAL_BATCH)
    if microbatches_set is not None and global_batch_set is None:
        return
    if global_batch_set is not None and microbatches_set is None:
        raise loaded.error(GLOBAL_BATCH, f"the file's microbatches override it: {conflict.product} sequences, not "
                           f"{conflict.global_batch:,}", f"--set training.microbatches=null with it, or "
                           f"{conflict.agreeing}")
    raise loaded.error(MICROBATCHES,
                       f"{conflict.product} sequences {conflict.unit}, not global_batch {conflict.global_batch:,}",
                       f"one of the two, or {conflict.agreeing}", reads=(GLOBAL_BATCH, *BATCH_READS))


def batch_override_warning(loaded: LoadedScenario, gpus: int, topology: Topology | None = None) -> str | None:
    """The located warning for a `--set training.microbatches` over the file's global batch that it changes: the
    global batch the step runs, which its throughput is of (a user who read the file's 32 read 94,701 tokens/s
    of 128 sequences); None otherwise (a sweep axis's value is in its table). A parameter-server run's workers
    are counted on ``topology``."""
    conflict = batch_conflict(loaded, gpus, topology)
    override = loaded.override_of(MICROBATCHES)
    if conflict is None or override is None or not override.typed or loaded.override_of(GLOBAL_BATCH) is not None:
        return None
    return str(loaded.error(MICROBATCHES, f"{conflict.product} sequences {conflict.unit}, overriding the file's "
                            f"global_batch {conflict.global_batch:,}"))


UNFILLED_COSTS = (1.0, 1.0, 1.0)
"""The forward, input-grad and weight-grad times per stage that an unfilled pipeline's warning times its schedule
with: uniform stages, the backward twice the forward (the bundled schedule studies' F = 1 ms, B = 2 ms)."""


def unfilled_pipeline_warning(loaded: LoadedScenario, gpus: int) -> str | None:
    """The located warning for a pipelined step of fewer micro-batches than fill its pipeline
    (`filling_microbatches`, which words its rule for the allowed text). Under one a rank (m < p) the pipeline
    never fills: each rank idles while the micro-batches pass the others. From p up to the threshold (zbv's 3p/2
    rounded down) every rank is busy at some instant, but each idles longer than at the threshold: the warning
    gives both idle times, from the same executor (zbv at p = 4: 2 forwards' time at m = 5, 1.5 at m = 6). It
    names the ranks and, where each holds more than one chunk, the virtual stages and their placement (zbv at
    p = 4: 8 virtual stages in a V), and gives the bubble the schedule has at uniform stages (`UNFILLED_COSTS`,
    timed by `simulate_schedule`: 1F1B's (p-1)/(m+p-1), 60.0% at p = 4, m = 2); a schedule that refuses so few
    micro-batches (dualpipev) or a custom table is refused or timed elsewhere, and warned of here not at all."""
    from simulator.errors import InputError
    from simulator.schedules.registry import build_schedule, filling_microbatches
    from simulator.schedules.timing import simulate_schedule
    from simulator.units import counted
    from simulator.workload.training import microbatch_count

    scenario = loaded.scenario
    pipeline, stages = scenario.parallelism.pipeline, scenario.pipeline_stages
    if stages == 1 or pipeline.table is not None or not _is_modelled_step(loaded):
        return None
    m = located(loaded, lambda: microbatch_count(scenario, data_parallel(loaded, gpus)))
    filling = filling_microbatches(pipeline.schedule, stages)
    if m >= filling.microbatches:
        return None
    try:
        schedule = build_schedule(pipeline.schedule, stages, m, pipeline.virtual_stages)
    except InputError:
        return None
    timing = simulate_schedule(schedule, *UNFILLED_COSTS)
    depth = _pipeline_depth(stages, pipeline.virtual_stages, schedule.placement)
    article = "an" if pipeline.schedule[0] in "aeiou" else "a"
    bubble = (f"{article} {pipeline.schedule} bubble of {timing.bubble_fraction:.1%} at uniform stages (backward 2x "
              "forward)")
    if m < stages:
        what = (f"the pipeline never fills with {counted(m, 'micro-batch', 'micro-batches')} over {depth}: each "
                f"rank idles while the others run, {bubble}")
        allowed = f"at least {filling.microbatches} micro-batches, {filling.rule}, to fill it"
    else:
        filled = build_schedule(pipeline.schedule, stages, filling.microbatches, pipeline.virtual_stages)
        idle_filled = max(simulate_schedule(filled, *UNFILLED_COSTS).idle_per_rank)
        what = (f"{m} micro-batches over {depth} leave each rank idle for {max(timing.idle_per_rank):g} forwards' "
                f"time where {filling.microbatches} leave it {idle_filled:g}, {bubble}")
        allowed = f"at least {filling.microbatches} micro-batches, {filling.rule}, past which more idle no less"
    field = ("training", "microbatches") if scenario.training.microbatches is not None else ("training",
                                                                                              "global_batch")
    return str(loaded.error(
        field, what, allowed,
        reads=(("parallelism", "pp"), ("parallelism", "pipeline", "schedule"),
               ("parallelism", "pipeline", "virtual_stages"))))


def _pipeline_depth(ranks: int, chunks: int, placement: Placement) -> str:
    """A pipeline's ranks and, where each holds more than one chunk, its virtual stages and how they sit:
    '4 stages', '4 ranks (8 virtual stages, 2 a rank, looped)', '4 ranks (8 virtual stages, 2 a rank in a V)'."""
    if chunks == 1:
        return f"{ranks} stages"
    return f"{ranks} ranks ({ranks * chunks} virtual stages, {chunks} a rank{PLACEMENT_SITTING[placement]})"


def interleaved_one_chunk_warning(loaded: LoadedScenario, gpus: int) -> str | None:
    """The located warning for `schedule: interleaved` with `virtual_stages: 1` where it holds more than 1F1B:
    PyTorch's ScheduleInterleaved1F1B on one chunk warms up with 2(p-r-1) forwards, so rank r holds
    min(2(p-r-1)+1, m) micro-batches' activations where `schedule: 1f1b`, with the same bubble, holds min(p-r, m)
    (52.6 against 36.8 GiB in a sweep over v, whose table read as if memory fell from v = 1 to v = 2)."""
    from simulator.schedules.interleaved import interleaved_warmup
    from simulator.schedules.one_f_one_b import warmup_forwards
    from simulator.workload.training import microbatch_count

    scenario = loaded.scenario
    pipeline = scenario.parallelism.pipeline
    stages = scenario.pipeline_stages
    synthetic = scenario.model is not None and scenario.model.synthetic is not None  # it holds no activations
    if (pipeline.schedule != "interleaved" or pipeline.virtual_stages != 1 or stages == 1 or synthetic
            or not _is_modelled_step(loaded)):
        return None
    m = located(loaded, lambda: microbatch_count(scenario, data_parallel(loaded, gpus)))
    interleaved = [min(interleaved_warmup(stages, m, 1, rank) + 1, m) for rank in range(stages)]
    plain = [min(warmup_forwards(stages, m, rank) + 1, m) for rank in range(stages)]
    if interleaved == plain:
        return None
    rank = next(rank for rank in range(stages) if interleaved[rank] != plain[rank])
    return str(loaded.error(
        ("parallelism", "pipeline", "virtual_stages"),
        f"interleaved on 1 chunk per rank has 1F1B's bubble but a deeper warm-up: rank {rank} holds "
        f"{interleaved[rank]:,} micro-batches' activations (2(p-r-1)+1 at p = {stages}) where 1F1B holds "
        f"{plain[rank]:,} (p-r)", "schedule: 1f1b for the same step in less memory, or virtual_stages of 2 or more"))
