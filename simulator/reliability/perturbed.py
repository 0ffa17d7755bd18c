"""A step under other faults, for the job simulation: the scenario's step with its `faults.step` replaced, run
to its time or to the abort a failure causes.

    from simulator import load_scenario
    from simulator.config.faults import StepFaults, Straggler
    from simulator.reliability.perturbed import perturbed_step

    loaded = load_scenario("scenarios/llama3-8b-dgx-h100-dp8.yaml")
    slow = perturbed_step(loaded, StepFaults(stragglers=(Straggler(gpus=(3,), slowdown=1.5),)))
    slow.step_time_s          # None when the step aborted; then aborted_at_s and reason say why

`StepFaults` is frozen and hashable, so callers can cache outcomes by it. Times are unit strings as in a
scenario (`GpuFailure(gpu=3, at=f"{t} s")`); the seed of random stragglers is the scenario's `run.seed`.
The job simulation's cluster states (states.py) take their steps through `step_outcome` too, on a cluster
they have built themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from simulator.config.faults import StepFaults
from simulator.config.loader import LoadedScenario
from simulator.errors import StepAborted
from simulator.simulation import Result, simulate


@dataclass(frozen=True)
class StepOutcome:
    """One step under faults: its time, or where and why it aborted; whether it ran folded."""

    step_time_s: float | None
    aborted_at_s: float | None = None
    reason: str = ""
    folded: bool = False
    summary: dict | None = field(default=None, compare=False, hash=False)


def with_step_faults(loaded: LoadedScenario, faults: StepFaults) -> LoadedScenario:
    """``loaded`` with its `faults.step` replaced (the other fault settings, and the overrides that locate an
    error, kept)."""
    scenario = loaded.scenario
    updated = scenario.model_copy(update={"faults": scenario.faults.model_copy(update={"step": faults})})
    return replace(loaded, scenario=updated)


def step_outcome(run: Callable[[], Result]) -> StepOutcome:
    """The outcome of ``run()``: its step time (a workload list's makespan) and summary, or the abort."""
    try:
        result = run()
    except StepAborted as aborted:
        return StepOutcome(None, aborted.at_s, aborted.reason)
    summary = result.summary
    return StepOutcome(summary.get("step_time_s", summary.get("makespan_s")), folded=bool(summary.get("folded")),
                       summary=summary)


def perturbed_step(loaded: LoadedScenario, faults: StepFaults) -> StepOutcome:
    """Simulate one step of ``loaded`` under ``faults``; an abort is an outcome, not an exception."""
    return step_outcome(lambda: simulate(with_step_faults(loaded, faults)))
