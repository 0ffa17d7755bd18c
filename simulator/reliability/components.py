"""Component classes and the failure model of a scenario: the `faults:` preset and components resolved into
one rate per unit, a time-to-failure distribution and a repair time per class.

A known class has a default unit (what it is counted in on the topology graph) and effect (what its failure
does to the job, `Effect`); a user-defined class names its unit, and its effect defaults to `replace`. The
classes of the `llama3` preset keep interrupting whatever their unit: the paper's table counts interruptions.
A generic `cable` and a `leaf_switch` degrade (routing around them where it can), a `spine_switch` degrades;
straggling classes are the user's (`effect: straggle` with a `slowdown`). On GB200 NVL72 racks a `rack` (power
shelves, liquid cooling, rack management) takes its compute trays, an `nvswitch_tray` degrades its rack's NVLink
bandwidth; no failure rate of either is published, so a scenario naming them gives its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

from simulator.catalog.failures import FAILURE_PRESETS
from simulator.config.faults import FaultsConfig
from simulator.config.reliability import (
    EFFECT_UNITS,
    MAINTENANCE_ALLOWED,
    RATE_ALLOWED,
    UNIT_KINDS,
    ComponentSpec,
    Effect,
    FailureDistribution,
    RepairDistribution,
    UnitKind,
    no_time_to_train,
)
from simulator.errors import ScenarioError
from simulator.units import counted, format_duration


@dataclass(frozen=True)
class ComponentClass:
    """A known component class: the unit it is counted in and what its failure does by default."""

    unit: UnitKind
    effect: Effect
    description: str
    unpublished: str = ""
    """Why the class has no rate of its own to offer where no public figure exists ('' where a preset has one)."""


def _gpu(description: str) -> ComponentClass:
    return ComponentClass("gpu", Effect.REPLACE, description)


def _host(description: str) -> ComponentClass:
    return ComponentClass("host", Effect.REPLACE, description)


def _software(description: str) -> ComponentClass:
    return ComponentClass("gpu", Effect.RESTART, description)


COMPONENT_CLASSES: MappingProxyType = MappingProxyType({
    "gpu": _gpu("the GPU itself"),
    "hbm": _gpu("GPU HBM memory"),
    "gpu_sram": _gpu("GPU SRAM (caches, register files)"),
    "gpu_system_processor": _gpu("GPU system processor (GSP)"),
    "silent_data_corruption": _gpu("a GPU computing wrong values"),
    "gpu_thermal": _gpu("GPU thermal interface and sensors"),
    "nic": ComponentClass("nic", Effect.REPLACE, "a network adapter; its host leaves the job"),
    "switch_cable": ComponentClass("cable", Effect.REPLACE, "a network cable or the switch port it plugs into"),
    "cable": ComponentClass("cable", Effect.DEGRADE, "a network cable; traffic is routed around it"),
    "leaf_switch": ComponentClass("leaf_switch", Effect.DEGRADE, "a leaf switch; its rail's GPUs route through "
                                  "their peers' NICs, or every host below it leaves the job"),
    "spine_switch": ComponentClass("spine_switch", Effect.DEGRADE, "a spine switch; leaf uplink bandwidth drops"),
    "rack": ComponentClass("rack", Effect.REPLACE, "a whole GB200 NVL72 rack (power shelves, liquid cooling and "
                           "its CDU, rack management): its compute trays leave the job",
                           "no public failure rate of a GB200 NVL72 rack exists: the Llama 3 table counts H100 "
                           "hosts, NVIDIA publishes none"),
    "nvswitch_tray": ComponentClass("nvswitch_tray", Effect.DEGRADE, "an NVSwitch tray of a GB200 NVL72 rack: its "
                                    "GPUs lose 1/9 of their NVLink bandwidth (2 of 18 links)",
                                    "no public failure rate of an NVLink switch tray exists: NVIDIA publishes "
                                    "none"),
    "host": _host("the server as a whole"),
    "host_maintenance": _host("unplanned maintenance of a host"),
    "ssd": _host("a host's local SSD"),
    "power_supply": _host("a host's power supply"),
    "server_chassis": _host("a host's chassis"),
    "io_expansion_board": _host("a host's IO expansion board"),
    "cpu": _host("a host CPU"),
    "system_memory": _host("host DRAM"),
    "software": _software("a software bug in the training job"),
    "nccl_watchdog": _software("an NCCL watchdog timeout"),
    "dependency": _software("a failing dependency (storage, scheduler, ...)"),
})


RACK_UNITS = ("rack", "nvswitch_tray")
"""The units of a GB200 NVL72 rack whose failures follow the physical rack (`FailureClass.repaired_in_place`), and
which a spare rack brings its own of (`JobPlan.spare_units`)."""


@dataclass(frozen=True)
class FailureClass:
    """One resolved failure process: per-unit rate (1/s), distribution, repair time, unit and effect."""

    name: str
    unit: UnitKind
    effect: Effect
    rate_per_unit_s: float
    distribution: FailureDistribution = "exponential"
    shape: float = 1.0
    repair_s: float = 0.0
    repair_distribution: RepairDistribution = "exponential"
    label: str = ""
    slowdown: float = 1.0

    @property
    def repaired_in_place(self) -> bool:
        """Whether a failed unit stays where it is until repaired, so that it cannot fail again meanwhile: a
        `degrade` or `straggle` unit (a spine, a cable, a throttled GPU) and a GB200 rack or NVSwitch tray
        (`RACK_UNITS`), whose failures follow the physical rack. The other classes' failures belong to slots (a
        host's place), which a spare fills at once (`processes.py`)."""
        return not Effect(self.effect).interrupts or self.unit in RACK_UNITS

    def failure_rate_s(self, spare_at_hand: bool) -> float:
        """Failures per second the job meets of one unit in use. The rate itself for a `restart` class (nothing
        goes to repair) and for an interrupting class with ``spare_at_hand``: a spare (a host, a rack) takes the
        place of the unit in repair at once, so the place fails on (GB200 racks, 100 h / 1 d, one spare rack:
        2 x 720 h / 100 h = 14.4 a month, 14.45 simulated). Else 1 / (MTBF + mean repair), the unit up
        M / (M + r) of the time and not failing in repair: a `degrade` or `straggle` unit stays in the job while
        in repair, and with no spare the job waits for the unit (or runs on without it, elastic): 2 x 720 h /
        124 h = 11.6, 11.6 simulated (the rate alone said 14.4); a `replace` unit sharing its host with others is
        out for their repairs too (`JobPlan.unit_rates_s`). Where spares are too few for the failures at
        once, the plain rate assumes one at hand for each: a long-run upper bound. All these are long-run rates
        (horizons past a few M + r): over a shorter one units repaired in place, and `replace` units with no
        spare, whose hosts start up, may draw more (one DGX H100 host, GPU MTBF 100 h, 1 d repairs, no spare, 400
        replications: 1.03 interruptions over 1 d against 0.658; `expected_in_horizon` in
        docs/reliability.md)."""
        if Effect(self.effect) is Effect.RESTART or (Effect(self.effect).interrupts and spare_at_hand):
            return self.rate_per_unit_s
        return self.rate_per_unit_s / (1.0 + self.rate_per_unit_s * self.repair_s)


@dataclass(frozen=True)
class Maintenance:
    """Planned maintenance: every `every_s` the job checkpoints and stops for `duration_s`."""

    every_s: float
    duration_s: float


@dataclass(frozen=True)
class FailureModel:
    """The failure classes of a scenario and its planned maintenance (None: none)."""

    classes: tuple[FailureClass, ...]
    maintenance: Maintenance | None


def check_class_effects(faults: FaultsConfig) -> None:
    """Refuse a class of `faults.components` whose effect does not apply to its unit, or whose effect and
    slowdown do not go together: checked at load for every scenario, a plain step's too, as `failure_model`
    (which a plain step never builds) checks them again."""
    for name, spec in faults.components.items():
        _unit_and_effect(name, spec)


def _unit_and_effect(name: str, spec: ComponentSpec) -> tuple[UnitKind, Effect]:
    """The unit and effect of class ``name``, from ``spec`` or the known class of that name: the effect checked
    against the unit first, then against the slowdown factor."""
    known = COMPONENT_CLASSES.get(name)
    if spec.unit is not None:
        unit = spec.unit
    elif known is not None:
        unit = known.unit
    else:
        raise ScenarioError(f"unknown component class {name!r}; a class of your own needs a unit",
                            field=f"faults.components.{name}",
                            allowed=f"{', '.join(COMPONENT_CLASSES)}, or any name with unit: ...")
    effect = spec.effect or (known.effect if known and unit == known.unit else Effect.REPLACE)
    if unit not in EFFECT_UNITS[effect]:
        limited = (f"{e} for {'/'.join(units)} units" for e, units in EFFECT_UNITS.items() if not e.interrupts)
        raise ScenarioError(f"effect {effect} on unit {unit!r}", field=f"faults.components.{name}.effect",
                            allowed=", ".join(limited) + "; replace or restart for any unit")
    if (effect is Effect.STRAGGLE) != (spec.slowdown is not None):
        raise ScenarioError("effect straggle and a slowdown factor go together", field=f"faults.components.{name}",
                            allowed="effect: straggle, slowdown: 1.3")
    return unit, effect


def failure_model(faults: FaultsConfig) -> FailureModel:
    """The preset's classes, overridden or extended by `components`, every rate times `rate_multiplier` and every
    repair time times `repair_multiplier` (one knob for "repairs take half as long", a sweep axis)."""
    classes: dict[str, FailureClass] = {}
    maintenance = None
    if faults.preset is not None:
        preset = FAILURE_PRESETS[faults.preset]
        for cause in preset.causes:
            known = COMPONENT_CLASSES[cause.component]
            effect = known.effect if known.effect.interrupts else Effect.REPLACE
            classes[cause.component] = FailureClass(
                cause.component, known.unit, effect, preset.rate_per_unit_s(cause, known.unit),
                repair_s=cause.repair_s, label=cause.label)
        maintenance = Maintenance(preset.window_s / preset.planned_interruptions, 0.0)
    for name, spec in faults.components.items():
        known = COMPONENT_CLASSES.get(name)
        unit, effect = _unit_and_effect(name, spec)
        if effect is Effect.RESTART and spec.repair:
            raise ScenarioError(f"a {effect} class replaces nothing, so a repair time has no effect",
                                field=f"faults.components.{name}.repair",
                                allowed="no repair, or effect: replace (its hosts go to repair)")
        previous = classes.get(name)
        if previous and unit != previous.unit and spec.rate_per_s is None:
            raise ScenarioError(f"the preset's {name} rate is per {previous.unit}, and a class moved to unit "
                                f"{unit!r} needs its own mtbf or rate", field=f"faults.components.{name}.unit",
                                allowed=f"unit {previous.unit!r} to keep the preset's rate, or {RATE_ALLOWED}")
        rate = spec.rate_per_s if spec.rate_per_s is not None else previous.rate_per_unit_s if previous else None
        if rate is None:
            why = f" ({known.unpublished})" if known and known.unpublished else ""
            raise ScenarioError(f"give one of mtbf and rate{why}", field=f"faults.components.{name}",
                                allowed=f"{RATE_ALLOWED}; a class of faults.preset keeps "
                                        "the preset's without them")
        repair = spec.repair if spec.repair is not None else (previous.repair_s if previous else 0.0)
        if not effect.interrupts and repair <= 0:
            raise ScenarioError(f"a {effect} class lasts until its unit's repair, and {name!r} has no repair "
                                "time, so its failures would change nothing",
                                field=f"faults.components.{name}" + (".repair" if spec.repair is not None else ""),
                                allowed="a repair time, e.g. repair: '4 h'")
        classes[name] = FailureClass(name, unit, effect, rate, spec.distribution, spec.shape, repair,
                                     spec.repair_distribution, label=previous.label if previous else name,
                                     slowdown=spec.slowdown or 1.0)
    if faults.maintenance is not None:
        every = faults.maintenance.every or (maintenance.every_s if maintenance else None)
        if every is None:
            raise ScenarioError("required without a faults.preset, whose period it would otherwise keep",
                                field="faults.maintenance.every", allowed="a duration, e.g. 27.6 h")
        problem = no_time_to_train(faults.maintenance.duration, every)
        if problem:
            raise ScenarioError(f"{problem}, the period of faults.preset {faults.preset}", field="faults.maintenance",
                                allowed=MAINTENANCE_ALLOWED)
        maintenance = Maintenance(every, faults.maintenance.duration)
    longest = max((c.repair_s for c in classes.values()), default=0.0)
    if not math.isfinite(longest * faults.repair_multiplier):
        raise ScenarioError(f"a {format_duration(longest)} repair times {faults.repair_multiplier:g} is not finite",
                            field="faults.repair_multiplier", allowed="a multiplier that keeps every repair finite")
    scaled = tuple(FailureClass(c.name, c.unit, c.effect, c.rate_per_unit_s * faults.rate_multiplier, c.distribution,
                                c.shape, c.repair_s * faults.repair_multiplier, c.repair_distribution, c.label,
                                c.slowdown)
                   for c in classes.values())
    return FailureModel(scaled, maintenance)


UNIT_WORDS: MappingProxyType[UnitKind, str] = MappingProxyType({
    "gpu": "GPU", "host": "host", "nic": "NIC", "leaf_switch": "leaf switch", "spine_switch": "spine switch",
    "cable": "cable", "rack": "rack", "nvswitch_tray": "NVSwitch tray"})
"""Each unit as a message names it."""


def preset_system_warning(faults: FaultsConfig, gpu_model: str, host_gpus: int) -> tuple[str, str] | None:
    """The problem and the advice where `faults.preset`'s table was seen on another system than the job's cluster
    (its GPU, ``gpu_model``, or GPUs a host, ``host_gpus``): its rates apply per unit as they are, so a GB200
    tray of 4 GPUs gets the per-host rate of an 8-GPU DGX H100 host, and a B200 an H100's per-GPU rate. The
    causes are named by unit, every unit the preset counts in (the llama3 table's: GPU, host, NIC, cable). None
    without a preset or on its own system."""
    if faults.preset is None:
        return None
    preset = FAILURE_PRESETS[faults.preset]
    if gpu_model == preset.gpu_model and host_gpus == preset.host_gpus:
        return None
    by_unit = [(unit, [cause.label for cause in preset.causes if COMPONENT_CLASSES[cause.component].unit == unit])
               for unit in UNIT_KINDS]
    groups = [f"per {UNIT_WORDS[unit]} ({_named_causes(labels)})" for unit, labels in by_unit if labels]
    listed = " and ".join(filter(None, (", ".join(groups[:-1]), groups[-1])))
    return (f"the {faults.preset} preset's rates were measured on hosts of {preset.host_gpus} {preset.gpu_model} "
            f"GPUs, and this cluster's hosts hold {host_gpus} {gpu_model} GPUs: they apply unchanged, at that "
            f"system's rate per unit: {listed}",
            "faults.components rates measured on this system, to replace the preset's")


def _named_causes(labels: list[str]) -> str:
    """A unit's causes: their count and the first two labels (then '...' where there are more)."""
    more = ", ..." if len(labels) > 2 else ""
    return f"{counted(len(labels), 'cause')}: {', '.join(labels[:2])}{more}"
