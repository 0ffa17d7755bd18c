"""Whether a step's activation recomputation buys memory for the time it costs. Selective recompute (Megatron's
core-attention recompute) drops the attention's stored s x s scores; flash attention stores none, so under it
selective recompute saves no memory (the memory model's own rule, `memory_plan.rematerialized_activations`) and
still runs every layer's attention forward again in the backward. A run so set says so in one warning line with
what the recompute costs, read from the step program's recompute ops."""

from __future__ import annotations

from collections import defaultdict

from simulator.config.loader import LoadedScenario
from simulator.program.ops import RECOMPUTE_CATEGORY, ComputeOp
from simulator.program.step import StepProgram
from simulator.units import format_duration
from simulator.workload.memory_plan import rematerialized_activations


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
