"""The `faults:` section: what goes wrong inside one simulated step and over a job's horizon.

`faults.step` perturbs the engine's run of a step (stragglers, degraded or failed links, failed GPUs);
the other fields describe failure processes of the cluster's components over weeks, for the job simulation
(`preset`, `rate_multiplier`, `repair_multiplier`, `components`, `maintenance`; config/reliability.py,
docs/reliability.md).
Every model here is frozen and hashable, so a job simulation can cache step times by its `StepFaults`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from simulator.config.reliability import (
    MAX_SLOWDOWN_SIGMA,
    ComponentName,
    ComponentSpec,
    Duration,
    MaintenanceConfig,
    SlowdownFactor,
    StragglerSlowdown,
)
from simulator.config.sections import FieldProblem, Section, user_value
from simulator.errors import yaml_spelling
from simulator.units import format_seconds, parse_duration, parse_step_duration

StepDuration = Annotated[float, BeforeValidator(user_value(parse_step_duration)), Field(ge=0)]
"""A time inside one step (at most a day): when a fault strikes, from the start of the step; a synthetic
stage's pass."""
Period = Annotated[float, BeforeValidator(user_value(parse_duration)), Field(gt=0)]


def _gpu_selection(value: object) -> object:
    """`all` or a list of GPU indices (whole numbers); anything else is refused in those words (pydantic
    would say 'Input should be a valid array', of the union's first member)."""
    if value == "all":
        return value
    if isinstance(value, list | tuple) and all(isinstance(gpu, int) and not isinstance(gpu, bool) for gpu in value):
        return tuple(value)
    raise ValueError(f"expected a list of GPU indices or all, got {yaml_spelling(value)} (allowed: [0, 5], all)")


GpuSelection = Annotated[tuple[int, ...] | Literal["all"], BeforeValidator(_gpu_selection)]


class SlowdownDraw(Section):
    """A slowdown factor drawn per GPU from the run's seeded generator: `uniform` between `low` and `high`,
    or `lognormal` with `median` and `sigma` (the factor is median x exp(sigma x N(0, 1)); sigma at most
    MAX_SLOWDOWN_SIGMA, the tails held within the factor's bounds)."""

    distribution: Literal["uniform", "lognormal"]
    low: SlowdownFactor | None = None
    high: SlowdownFactor | None = None
    median: SlowdownFactor | None = None
    sigma: float | None = Field(default=None, ge=0, le=MAX_SLOWDOWN_SIGMA)

    @model_validator(mode="after")
    def _parameters(self) -> SlowdownDraw:
        wanted = ("low", "high") if self.distribution == "uniform" else ("median", "sigma")
        given = {name for name in ("low", "high", "median", "sigma") if getattr(self, name) is not None}
        if given != set(wanted):
            raise ValueError(f"{self.distribution} takes {' and '.join(wanted)} (allowed: {', '.join(wanted)})")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high} (allowed: low <= high)")
        return self


class Swing(Section):
    """A periodic change of a straggler's factor, e.g. a 1-2% diurnal swing: the factor at time t of the step
    is slowdown x (1 + amplitude x sin(2 pi (t + phase) / period)); `phase` places the step in the cycle."""

    amplitude: float = Field(ge=0, lt=1)
    period: Period
    phase: Duration = 0.0


class Straggler(Section):
    """GPUs whose compute runs `slowdown` times longer (a given factor from 1 to MAX_SLOWDOWN; below 1 is refused,
    it would make the GPU faster) or by a factor `draw`n per GPU: by index (`gpus`, or `all`), or a seeded random
    `fraction` of the GPUs. Overlapping entries multiply, the product held within the factor's bounds
    (MIN_SLOWDOWN to MAX_SLOWDOWN), as a drawn factor is."""

    gpus: GpuSelection | None = None
    fraction: float | None = Field(default=None, gt=0, le=1)
    slowdown: StragglerSlowdown | None = None
    draw: SlowdownDraw | None = None
    swing: Swing | None = None

    @model_validator(mode="after")
    def _one_selection(self) -> Straggler:
        if (self.gpus is None) == (self.fraction is None):
            raise ValueError("name the GPUs or a fraction of them (allowed: gpus, fraction)")
        if (self.slowdown is None) == (self.draw is None):
            raise ValueError("give a slowdown factor or a draw (allowed: slowdown, draw)")
        return self


def _unset(value: object) -> bool:
    """Whether an optional field is left out of the section's dump: unset, it is no part of the scenario, so a
    scenario that does not use it keeps its digest (manifest.json's scenario_sha256) and cache keys."""
    return value is None


class LinkFault(Section):
    """A link (both directions) that loses capacity at time `at`, until time `until` (None: to the step's end), when
    it comes back at its full capacity, and again every `every` after each (a flapping link: `count` times, None: to
    the step's end): named by its two endpoints in the topology graph (`link: [leaf0.r0, spine3]`), or every uplink
    of a switch (`uplinks_of: leaf0.r0`: its links to switches of a higher tier). `capacity` is the fraction of line
    rate left; 0 (default) takes the link down, and routes are recomputed around it."""

    link: tuple[str, str] | None = None
    uplinks_of: str | None = None
    capacity: float = Field(default=0.0, ge=0, lt=1)
    at: StepDuration = 0.0
    until: StepDuration | None = Field(default=None, exclude_if=_unset)
    every: Period | None = Field(default=None, exclude_if=_unset)
    count: int | None = Field(default=None, ge=1, exclude_if=_unset)

    @model_validator(mode="after")
    def _one_selection(self) -> LinkFault:
        if (self.link is None) == (self.uplinks_of is None):
            raise ValueError("name a link or a switch's uplinks (allowed: link, uplinks_of)")
        if self.until is not None and self.until <= self.at:
            raise FieldProblem(("until",), f"{format_seconds(self.until)} is not after at ({format_seconds(self.at)})",
                               f"a time after {format_seconds(self.at)}, e.g. {format_seconds(self.at + 0.01)}")
        if self.every is not None and self.until is None:
            raise FieldProblem(("every",), "a fault repeats only once it has ended", "until, the end of its first "
                               f"time, e.g. until: {format_seconds(self.at + 0.01)}")
        if self.every is not None and self.until is not None and self.every <= self.until - self.at:
            raise FieldProblem(("every",), f"{format_seconds(self.every)} is not longer than the fault "
                               f"({format_seconds(self.until - self.at)}): the link would never come back",
                               f"a period longer than {format_seconds(self.until - self.at)}")
        if self.count is not None and self.every is None:
            raise FieldProblem(("count",), "count is how many times a fault repeats every period",
                               "every, a period, e.g. every: 100 ms")
        return self


class GpuFailure(Section):
    """A GPU that fails at time `at` of the step: the step aborts there."""

    gpu: int = Field(ge=0)
    at: StepDuration = 0.0


class StepFaults(Section):
    """Faults inside one simulated step (docs/faults.md)."""

    stragglers: tuple[Straggler, ...] = ()
    links: tuple[LinkFault, ...] = ()
    gpu_failures: tuple[GpuFailure, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.stragglers or self.links or self.gpu_failures)


def _failure_preset(name: str) -> str:
    from simulator.catalog.failures import FAILURE_PRESETS

    if name not in FAILURE_PRESETS:
        raise ValueError(f"unknown failure preset {name!r} (allowed: {', '.join(FAILURE_PRESETS)})")
    return name


class FaultsConfig(Section):
    """Faults of a scenario: inside a step (`step`) and over the job's horizon (a `preset` table of
    component failure rates, scaled by `rate_multiplier`, with `components` added or overriding it by
    class name, every class's repair time scaled by `repair_multiplier`, and planned `maintenance`)."""

    step: StepFaults = StepFaults()
    preset: Annotated[str, AfterValidator(_failure_preset)] | None = None
    rate_multiplier: float = Field(default=1.0, gt=0)
    repair_multiplier: float = Field(default=1.0, gt=0)
    components: dict[ComponentName, ComponentSpec] = {}
    maintenance: MaintenanceConfig | None = None


JOB_FAULT_FIELDS = frozenset(FaultsConfig.model_fields) - {"step"}
"""The fields of `faults` that describe failure processes over a job's horizon: all but `step`."""
