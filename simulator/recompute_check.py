"""Whether a step's activation recomputation buys memory for the time it costs. Selective recompute (Megatron's
core-attention recompute) drops the attention's stored s x s scores; flash attention stores none, so under it
selective recompute saves no memory (the memory model's own rule, `memory_plan.rematerialized_activations`) and
still runs every layer's attention forward again in the backward. Full recompute under a schedule of deferred
weight-gradient passes (any schedule that runs W actions: zb-h1, zbv, interleaved-zb, dualpipev) saves little or
no memory where the deferred W's set the peak: each keeps the inputs of its layer's GEMMs, which the recompute
rebuilt. A run so set says so in one warning line with what the recompute costs, read from the step program's
recompute ops, and, for full recompute, the memory plan's peaks with and without it."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from simulator.config.loader import LoadedScenario
from simulator.program.ops import RECOMPUTE_CATEGORY, ComputeOp
from simulator.program.step import StepProgram
from simulator.topology.graph import Topology
from simulator.units import format_duration
from simulator.workload import memory_plan
from simulator.workload.memory_plan import GIB, rematerialized_activations, stage_memory
from simulator.workload.training import build_training_step


def recompute_seconds(program: StepProgram) -> tuple[float, float]:
    """The seconds of recompute a step's program runs on the rank that runs the most, and that rank's compute
    seconds in all (0, 0 where nothing is recomputed)."""
    recompute: dict[int, float] = defaultdict(float)
    compute: dict[int, float] = defaultdict(float)
    for op in program.ops:
        if isinstance(op, ComputeOp):
            compute[op.rank] += op.duration
            if op.category == RECOMPUTE_CATEGORY:
                recompute[op.rank] += op.duration
    if not recompute:
        return 0.0, 0.0
    rank = max(recompute, key=lambda r: (recompute[r], -r))
    return recompute[rank], compute[rank]


def selective_recompute_warning(loaded: LoadedScenario, program: StepProgram) -> str | None:
    """The located warning for selective recompute where it saves no memory (flash attention) yet costs time;
    None otherwise."""
    training = loaded.scenario.training
    if training.recompute != "selective" or rematerialized_activations(training) != "selective":
        return None
    seconds, compute = recompute_seconds(program)
    if not seconds:
        return None
    return str(loaded.error(
        ("training", "recompute"),
        f"selective recompute saves no memory under flash attention, which stores no s x s attention scores for it "
        f"to drop, and runs every layer's attention forward again in the backward: {format_duration(seconds)} of "
        f"compute per step on the busiest GPU ({seconds / compute:.1%} of its compute)",
        "none (the same memory, less time) or full (less memory)"))


def full_recompute_warning(loaded: LoadedScenario, program: StepProgram, topology: Topology,
                           base_dir: Path) -> str | None:
    """The located warning for full recompute under a schedule of deferred W's (the step's pipeline schedule runs
    W actions) where it saves less of the peak than the memory plan leaves out (`memory_plan.UNMODELLED_BYTES`,
    1 GiB, what an out-of-memory remedy must save to be offered, `memory_remedies`), the peak the memory plan
    weighs with and without it (the fullest pipeline stage's), yet costs its time; None otherwise."""
    scenario = loaded.scenario
    if scenario.training.recompute != "full" or scenario.model is None:
        return None
    step = build_training_step(scenario, topology, base_dir)
    if not any(action.kind == "W" for actions in step.plan.schedule for action in actions):
        return None
    without = scenario.model_copy(update={"training": scenario.training.model_copy(update={"recompute": "none"})})
    peak = max(breakdown.total for breakdown, _ in stage_memory(scenario, step))
    peak_without = max(breakdown.total for breakdown, _ in
                       stage_memory(without, build_training_step(without, topology, base_dir)))
    seconds, compute = recompute_seconds(program)
    if peak_without - peak >= memory_plan.UNMODELLED_BYTES or not seconds:
        return None
    schedule = scenario.parallelism.pipeline.schedule
    return str(loaded.error(
        ("training", "recompute"),
        f"full recompute saves {(peak_without - peak) / GIB:.2f} GiB under {schedule} (peak {peak / GIB:.2f} GiB, "
        f"{peak_without / GIB:.2f} GiB without), whose deferred W's keep the GEMM inputs the recompute rebuilt, "
        f"and runs every layer's forward again in the backward: {format_duration(seconds)} of compute per step on "
        f"the busiest GPU ({seconds / compute:.1%} of its compute)",
        "none (about the same memory, less time), or full under a schedule without deferred W's (1f1b, interleaved)",
        reads=(("parallelism", "pipeline", "schedule"),)))
