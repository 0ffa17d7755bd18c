"""Scenario sections of the job simulation over weeks: failure processes per component class, planned
maintenance, checkpoints, storage and restarts (docs/reliability.md).

Quantities are unit strings ("30 min", "2 TB/s", "6.48 TB"); a rate is an MTBF per unit or "N per U units
per T" ("148 per 16384 units per 54 d"). Which component classes exist and what a failure takes down is
decided in `simulator/reliability/components.py`; these classes only check each value on its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from simulator.config.sections import INT64_LIMIT, Section, user_value
from simulator.errors import InputError, yaml_spelling
from simulator.units import (
    DURATION_UNITS,
    NUMBER,
    case_hint,
    format_duration,
    parse_bandwidth,
    parse_duration,
    parse_size,
    texts_apart,
)

UnitKind = Literal["gpu", "host", "nic", "leaf_switch", "spine_switch", "cable", "rack", "nvswitch_tray"]
UNIT_KINDS: tuple[UnitKind, ...] = get_args(UnitKind)
"""What a component class is counted in on the job's topology graph (a rack and its NVSwitch trays: GB200 NVL72)."""
FailureDistribution = Literal["exponential", "weibull"]
"""A component's time to failure: exponential (a Poisson process per unit) or Weibull with a `shape`."""
RepairDistribution = Literal["fixed", "exponential"]
"""A repair's duration: exactly `repair`, or exponential with that mean."""
CheckpointMode = Literal["sync", "async"]
"""How a checkpoint is written: training stalls for the write, or only for a snapshot while the write runs."""


MAX_SLOWDOWN = 1000.0
"""Largest compute slowdown of a straggling GPU. Fail-slow GPUs (thermal or power throttling, degraded HBM or
PCIe links) run a few times, at worst some tens of times, slower; one a thousand times slower does no useful
work and holds every peer at each collective, which is a failed GPU (faults.step.gpu_failures, or a failure
class), so a larger factor (1e300) is a typo rather than a study."""
MIN_SLOWDOWN = 1.0 / MAX_SLOWDOWN
"""Smallest compute factor (below 1 is faster than nominal, as a drawn jitter can be): a GPU a thousand times
faster than its nominal kernels is a typo (1e-300 made every kernel of the GPU take no time)."""
MAX_SLOWDOWN_SIGMA = 2.3
"""Widest lognormal slowdown draw: ln(MAX_SLOWDOWN) / 3 = 2.303, rounded down, so a draw three standard
deviations from median 1 stays within [MIN_SLOWDOWN, MAX_SLOWDOWN]. Measured GPU-to-GPU spreads are a few
percent; sigma 50 drew factors of 1e-56 beside ones capped at 1000, nothing a cluster shows."""


def _apart_from_one(value: float) -> str:
    """``value`` to three significant digits, or as many more as it takes not to read as 1: slowdown 0.999 made
    the GPU '1 times faster'."""
    for digits in range(3, 18):
        text = f"{value:.{digits}g}"
        if float(text) != 1:
            return text
    return repr(value)


def _slowdown_rule(lowest: float, allowed: str, below: Callable[[float], str], *, lowest_refused: bool = False
                   ) -> AfterValidator:
    """The one check of a slowdown field: a factor from ``lowest`` (above it with ``lowest_refused``) to
    MAX_SLOWDOWN, every refusal ending in the field's one ``allowed`` text, ``below`` saying why a factor under
    the lowest is wrong."""

    def check(factor: float) -> float:
        if factor > MAX_SLOWDOWN:
            raise ValueError(f"slowdown {factor:g} is more than {MAX_SLOWDOWN:g}: a GPU that much slower than its "
                             f"peers has failed (model it as a GPU failure) (allowed: {allowed})")
        if factor < lowest or (lowest_refused and factor == lowest):
            shown = "1" if factor == 1 else _apart_from_one(factor)
            raise ValueError(f"slowdown {shown} {below(factor)} (allowed: {allowed})")
        return factor

    return AfterValidator(check)


def _faster_than_a_thousandth(factor: float) -> str:
    return (f"is less than {MIN_SLOWDOWN:g}: no GPU runs a thousand times faster than its nominal kernels"
            if factor > 0 else "is not above 0: a GPU's kernels last slowdown times their nominal time")


def _faster_than_nominal(factor: float) -> str:
    """Why a given straggler factor below 1 is refused: it makes the GPU faster, which a user who means "runs at
    half speed" by `slowdown: 0.5` gets the opposite of."""
    faster = (f", so {_apart_from_one(factor)} would make the GPU {_apart_from_one(1 / factor)} times faster"
              if factor > 0 else "")
    return f"is below 1: a straggler's kernels last slowdown times their nominal time{faster}"


def _no_slower(factor: float) -> str:
    return "does not slow the GPU: a straggle class's GPUs run their compute slowdown times longer"


SlowdownFactor = Annotated[float, Field(allow_inf_nan=False), _slowdown_rule(
    MIN_SLOWDOWN, f"a factor from {MIN_SLOWDOWN:g} to {MAX_SLOWDOWN:g}, e.g. 1.5", _faster_than_a_thousandth)]
"""A drawn compute slowdown's bound or median: from MIN_SLOWDOWN (below 1 is faster than nominal, as a drawn
jitter can be) to MAX_SLOWDOWN."""
StragglerSlowdown = Annotated[float, Field(allow_inf_nan=False), _slowdown_rule(
    1.0, f"a factor from 1 to {MAX_SLOWDOWN:g}, e.g. 2 for half speed", _faster_than_nominal)]
"""A straggler's given slowdown factor: from 1 (nominal) to MAX_SLOWDOWN; only a drawn factor (a jitter around 1)
may fall below 1."""
ClassSlowdown = Annotated[float, Field(allow_inf_nan=False), _slowdown_rule(
    1.0, f"a factor above 1, up to {MAX_SLOWDOWN:g}, e.g. 1.3", _no_slower, lowest_refused=True)]
"""A `straggle` class's compute factor: above 1 (a class that slows nothing is no class) up to MAX_SLOWDOWN."""


class Effect(StrEnum):
    """What a failure of a component class does to the job: the one definition of the option set."""

    REPLACE = "replace"
    """Interrupts the job; the hosts in the blast radius go to repair."""
    RESTART = "restart"
    """Interrupts the job and replaces nothing (software)."""
    DEGRADE = "degrade"
    """The job keeps running on less bandwidth until the repair (spine and leaf switches, cables, NICs, a rack's
    NVSwitch trays); a leaf, cable or NIC whose loss leaves some GPUs without a route interrupts and takes its
    hosts, as `replace`."""
    STRAGGLE = "straggle"
    """The job keeps running with the unit's GPUs `slowdown` times slower until the repair (thermal
    throttling, a degraded GPU or host)."""

    @property
    def interrupts(self) -> bool:
        """Whether the effect stops the job (replace or restart), rather than slowing it."""
        return self in (Effect.REPLACE, Effect.RESTART)


class BuiltInCause(StrEnum):
    """The causes a job's outputs name besides its component classes (job_events.parquet's `cause`,
    `slow_steps_by_cause_s`): the one definition, so that no class takes one of these names and merges with it."""

    FAILURE = "failure"
    """A restart after an unexpected interruption."""
    MAINTENANCE = "maintenance"
    """A restart after a planned maintenance stop."""
    ELASTIC_SHRINK = "elastic_shrink"
    """The slow steps of an elastic job running on fewer replicas."""
    REGROW = "regrow"
    """A restart an elastic job takes to grow back onto repaired hosts (`restart.regrow: on_repair`)."""


def _component_name(name: str) -> str:
    """A component class's name as the outputs show it: not blank (a checkpoint event's cause is empty) and no
    built-in cause (its failures and slow steps would be counted as that cause's)."""
    *others, last = BuiltInCause
    allowed = f"a non-blank name other than {', '.join(others)} and {last}, e.g. rack_pdu"
    if not name.strip():
        raise ValueError(f"a component class needs a name, got {yaml_spelling(name)} (allowed: {allowed})")
    if name in set(BuiltInCause):
        raise ValueError(f"{name!r} is a cause the job's outputs name already (allowed: {allowed})")
    return name


ComponentName = Annotated[str, AfterValidator(_component_name)]
"""A key of `faults.components`: a class's name, checked at load."""


EFFECT_UNITS: dict[Effect, tuple[str, ...]] = {
    Effect.REPLACE: UNIT_KINDS,
    Effect.RESTART: UNIT_KINDS,
    Effect.DEGRADE: ("spine_switch", "leaf_switch", "cable", "nic", "nvswitch_tray"),
    Effect.STRAGGLE: ("gpu", "host"),
}
"""The units each effect applies to."""


_RATE = re.compile(rf"^\s*(?P<count>{NUMBER})\s+per\s+(?:(?P<units>{NUMBER})\s+units?\s+per\s+)?(?P<time>.+?)\s*$")


def parse_rate(value: object) -> float:
    """Failures per unit per second from "N per U units per T" or "N per T" (per unit), T a duration with its
    number as every duration is written ("0.5 per 1 h"; "0.5 per h" is refused with that form)."""
    allowed = "'N per U units per T' or 'N per T', T a duration, e.g. '148 per 16384 units per 54 d', '0.5 per 1 h'"
    match = _RATE.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"cannot read rate {value!r} (allowed: {allowed})")
    counted_as = re.match(rf"^(?P<units>{NUMBER})\s+(?P<word>\S+)\s+per\s", match["time"])
    if counted_as and counted_as["word"] not in DURATION_UNITS:
        raise ValueError(f"rate {value!r} counts {counted_as['word']!r}: the count of units is written "
                         f"'{counted_as['units']} units' (the class's unit says what a unit is) (allowed: {allowed})")
    if re.search(r"\sper\s", match["time"]):
        raise ValueError(f"cannot read rate {value!r}: after the count, one period or 'U units per' a period "
                         f"(allowed: {allowed})")
    if not re.search(r"\d", match["time"]):
        raise ValueError(f"rate {value!r} has a period without its number, {match['time']!r} (allowed: {allowed})")
    count = float(match["count"].replace(",", ""))
    units = float(match["units"].replace(",", "")) if match["units"] else 1.0
    period = user_value(parse_duration)(match["time"])
    if count <= 0 or units <= 0 or period <= 0:
        raise ValueError(f"rate {value!r} must be positive (allowed: {allowed})")
    return count / units / period


STEP_WORDS = ("step", "steps")
"""The unit of an interval in whole steps ('1 step', '200 steps')."""
STEPS = re.compile(r"^\s*([-+]?\d*\.?\d*(?:[eE][-+]?\d+)?)\s*(steps?)\s*$", re.IGNORECASE)
"""An interval in steps, its word in any case (told apart from a duration so that 'Steps' is refused as such)."""


def parse_interval(value: object) -> float | int:
    """A checkpoint interval: an int number of steps from "N steps", else seconds from a duration. The step word
    is case-sensitive as every unit is ('10 Steps' refused, saying so, where it was called a duration unit)."""
    if isinstance(value, str):
        match = STEPS.match(value)
        if match and match[2] not in STEP_WORDS:
            raise ValueError(f"unknown unit {match[2]!r} in {value!r}{case_hint(match[2], STEP_WORDS)} (allowed: "
                             "'200 steps', '30 min')")
        if match:
            steps = float(match[1]) if re.search(r"\d", match[1]) else math.nan
            if not steps >= 1 or steps != int(steps):
                raise ValueError(f"interval {value!r} must be a whole number of steps, at least one (allowed: "
                                 "'200 steps', '30 min')")
            if steps >= INT64_LIMIT:
                raise ValueError(f"interval {value!r} is beyond 64-bit step counts (allowed: fewer than 2^63 "
                                 "steps, or a duration such as '30 min')")
            return int(steps)
    try:
        seconds = parse_duration(value)
    except InputError as exc:
        raise ValueError(f"{exc.problem} (allowed: a number of steps, e.g. '200 steps', or a duration in "
                         f"{exc.allowed}, e.g. '30 min')") from None
    if seconds <= 0:
        raise ValueError(f"interval {value!r} must be positive (allowed: '200 steps', '30 min')")
    return seconds


MIN_WEIBULL_SHAPE = 0.1
"""The smallest Weibull shape a component class may have. Below it the mean time between failures is carried
by gaps so rare and so long that no feasible number of replications meets it (at shape 0.05, 99.7% of one-day
replications of a 3 h MTBF unit see no failure at all and a few see thousands), and below about 0.006 the scale
that gives the MTBF, MTBF / Gamma(1 + 1 / shape), is no longer a floating-point number (it was an
OverflowError's traceback). Published fits of the time between node failures in HPC systems have shapes of
about 0.7 to 0.8 (Schroeder and Gibson, DSN 2006)."""

PositiveDuration = Annotated[float, BeforeValidator(user_value(parse_duration)), Field(gt=0)]
Duration = Annotated[float, BeforeValidator(user_value(parse_duration)), Field(ge=0)]

MAX_HORIZON_DAYS = 36_500
"""Longest job horizon: a century. No training job runs that long, so a longer horizon is a typo (1e300 s),
refused at its own line by `trainsim validate` and `run` alike rather than after the healthy step as millions of
checkpoints; the job's clock in float seconds still resolves half a microsecond there."""


def _within_horizon(seconds: float) -> float:
    """``seconds`` if at most MAX_HORIZON_DAYS; the refusal says the horizon in days, as the limit is, with the
    digits that tell the two apart ('36,501 d is more than 36,500 d', not '3.154e+09 s')."""
    if seconds > MAX_HORIZON_DAYS * 86_400.0:
        given, limit = texts_apart([seconds / 86_400.0, MAX_HORIZON_DAYS], lambda days, digits: f"{days:,.{digits}g}",
                                   least=5)
        raise ValueError(f"horizon {given} d is more than {limit} d (a century), longer than any training job "
                         f"(allowed: a duration up to {MAX_HORIZON_DAYS} d, e.g. 54 d)")
    return seconds


Horizon = Annotated[PositiveDuration, AfterValidator(_within_horizon)]
"""A job's wall time (`run.horizon`): positive, at most MAX_HORIZON_DAYS."""
Bandwidth = Annotated[float, BeforeValidator(user_value(parse_bandwidth)), Field(gt=0)]
Size = Annotated[float, BeforeValidator(user_value(parse_size)), Field(gt=0)]
Rate = Annotated[float, BeforeValidator(parse_rate)]
Interval = Annotated[int | float, BeforeValidator(parse_interval)]
"""Steps (an int, from "N steps") or seconds (a float, from a duration); the type tells them apart."""


RATE_ALLOWED = "mtbf: '50000 h', rate: '3 per 54 d'"
"""What a failure class's rate may be, in a refusal."""


class ComponentSpec(Section):
    """One component class: a rate per unit (`mtbf` or `rate`; a class of `faults.preset` given neither keeps
    the preset's, components.py), the time-to-failure distribution and the repair time. `unit` and `effect`
    default to the known class's (components.py); a user-defined class must name its `unit`. `slowdown` is the
    compute factor of a `straggle` class's GPUs."""

    unit: UnitKind | None = None
    effect: Effect | None = None
    slowdown: ClassSlowdown | None = None
    mtbf: PositiveDuration | None = None
    rate: Rate | None = None
    distribution: FailureDistribution = "exponential"
    shape: float = Field(default=1.0, ge=MIN_WEIBULL_SHAPE)
    """The Weibull shape: required with `distribution: weibull`; with the exponential only as 1, its own. The
    default stays 1.0, not None, so that a scenario's digest (`--point-outputs` sweeps resume by it) does not
    change; a `weibull` is refused when the user set no shape (`model_fields_set`)."""
    repair: Duration | None = None
    repair_distribution: RepairDistribution = "exponential"

    @model_validator(mode="after")
    def _at_most_one_rate(self) -> ComponentSpec:
        if self.mtbf is not None and self.rate is not None:
            raise ValueError(f"give one of mtbf and rate, not both (allowed: {RATE_ALLOWED})")
        if self.shape != 1.0 and self.distribution != "weibull":  # shape 1 is the exponential's own
            raise ValueError(f"shape {self.shape:g} applies to distribution: weibull only (allowed: distribution: "
                             "weibull with a shape, or no shape)")
        if "shape" not in self.model_fields_set and self.distribution == "weibull":
            raise ValueError(f"distribution: weibull needs a shape, which says how failures cluster (allowed: a "
                             f"shape of at least {MIN_WEIBULL_SHAPE:g}, e.g. shape: 0.7; shape 1 is the exponential)")
        return self

    @property
    def rate_per_s(self) -> float | None:
        """Failures per unit per second; None when the class gives no rate."""
        if self.mtbf is not None:
            return 1.0 / self.mtbf
        return self.rate


MAINTENANCE_ALLOWED = "a duration shorter than every"
"""What a maintenance stop that leaves no time to train is told."""


def no_time_to_train(duration: float, every: float) -> str | None:
    """Why a maintenance stop of ``duration`` every ``every`` seconds cannot be (it leaves no time to train), or
    None."""
    if duration < every:
        return None
    return f"a {format_duration(duration)} stop every {format_duration(every)} leaves no time to train"


class MaintenanceConfig(Section):
    """Planned maintenance: every `every` the job checkpoints, stops for `duration`, then restarts. Beside a
    `faults.preset`, `every` defaults to the preset's period (components.failure_model), so that `duration`
    alone gives the preset's windows a length."""

    every: PositiveDuration | None = None
    duration: Duration = 0.0

    @model_validator(mode="after")
    def _time_to_train(self) -> MaintenanceConfig:
        problem = no_time_to_train(self.duration, self.every) if self.every is not None else None
        if problem:
            raise ValueError(f"{problem} (allowed: {MAINTENANCE_ALLOWED})")
        return self


class MemoryCheckpointConfig(Section):
    """The in-memory tier (Gemini, CheckFreq): every `interval` each GPU's shard is copied to host RAM and sent to
    `replicas` peer hosts at `bandwidth` per GPU, training stalled meanwhile. A failure restores from the newest such
    snapshot where every lost host has a peer left; else from the storage tier (docs/reliability.md)."""

    interval: Interval
    replicas: int = Field(default=1, ge=1)
    bandwidth: Bandwidth = 25e9


class CheckpointConfig(Section):
    """What a checkpoint holds and how it is written. `size` defaults to the model's parameters times
    `bytes_per_param`, by default what the framework of the scenario's layout saves for its precision and
    optimizer, no gradients (checkpoint.layout_bytes_per_param: 14 for bf16 with Adam under Megatron-LM or
    DeepSpeed, 12 under PyTorch FSDP2); every host of the job writes its shard. `async`: the training
    stalls only for the HBM -> host snapshot, the write then runs in the background and slows steps
    (docs/reliability.md)."""

    interval: Interval = 1800.0
    mode: CheckpointMode = "sync"
    size: Size | None = None
    bytes_per_param: float | None = Field(default=None, gt=0)
    snapshot_bandwidth: Bandwidth = 50e9
    memory: MemoryCheckpointConfig | None = None

    @model_validator(mode="after")
    def _one_size(self) -> CheckpointConfig:
        if self.size is not None and self.bytes_per_param is not None:
            raise ValueError("give one of size and bytes_per_param, not both: the size is the model's parameters "
                             "times bytes_per_param (allowed: size: '5.68 TB', bytes_per_param: 14)")
        return self


class StorageConfig(Section):
    """The checkpoint store: per-host write/read bandwidth, aggregate caps and capacity. Defaults: Meta's
    Tectonic as the Llama 3 paper describes it (2 TB/s sustained, 7 TB/s peak, 240 PB)."""

    host_write: Bandwidth = 25e9
    host_read: Bandwidth = 25e9
    write: Bandwidth = 2e12
    read: Bandwidth = 7e12
    capacity: Size = 240e15


class ElasticBatch(StrEnum):
    """What an elastic job keeps when it runs on fewer data-parallel replicas: the one definition of the
    option set (docs/reliability.md)."""

    KEEP_PER_REPLICA = "keep_per_replica"
    """Each replica keeps its micro-batches: the global batch shrinks with the replicas (Horovod Elastic,
    a torchrun elastic script with a fixed per-rank batch)."""
    KEEP_GLOBAL = "keep_global"
    """The global batch stays: each replica runs dp / replicas times its micro-batches (gradient accumulation,
    as Megatron-LM and NeMo derive micro-batches from the global batch, and DeepSpeed's elasticity)."""


class Regrow(StrEnum):
    """When an elastic job that shrank grows back onto repaired or spare hosts: the one definition."""

    NEXT_RESTART = "next_restart"
    """At its next restart (a failure or a maintenance stop); it never restarts just to grow."""
    ON_REPAIR = "on_repair"
    """As soon as the hosts fill a larger size: it checkpoints and pays a restart to grow."""


class RestartConfig(Section):
    """Restart after an interruption: detection + rescheduling (spare hosts; when none, wait for repair) +
    launch + checkpoint load + warm-up steps. `elastic`: continue on fewer data-parallel replicas instead of
    waiting for repaired hosts, down to `min_replicas` (none: 1; below it the job waits for repair), keeping
    the per-replica or the global batch (`elastic_batch`), and growing back when `regrow` says."""

    detection: Duration = 120.0
    reschedule: Duration = 180.0
    launch: Duration = 300.0
    warmup_steps: int = Field(default=10, ge=0)
    spares: int = Field(default=0, ge=0)
    elastic: bool = False
    min_replicas: int | None = Field(default=None, ge=1)
    elastic_batch: ElasticBatch = ElasticBatch.KEEP_PER_REPLICA
    regrow: Regrow = Regrow.NEXT_RESTART
