"""Inputs of the job simulation: every kind of bad input is one located line with exit status 2 and no
files; units and blast radii counted on the topology graph; failure processes against their means."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from shared import ONE_GPU_HOSTS, SPARE_JOB

from simulator import scale
from simulator.cli import main
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.reliability import simulate as job_simulation
from simulator.reliability.ahead import LinkStateSizes
from simulator.reliability.blast import cluster_units
from simulator.reliability.components import FailureClass
from simulator.reliability.processes import draw_arrivals
from simulator.reliability.simulate import _refuse_unfolded_steps, check_job
from simulator.scale import capped_topology, classed_estimate, unfolded_beyond_limits
from simulator.topology.loader import load_topology
from simulator.units import format_bandwidth, format_decimal_size, format_duration

BAD = {
    "negative rate": (("      mtbf: 1000 h", "      rate: -3 per 54 d"), 16, "faults.components.gpu.rate"),
    "zero mtbf": (("      mtbf: 1000 h", "      mtbf: 0 h"), 16, "faults.components.gpu.mtbf"),
    "unknown class": (("    gpu:", "    warp_core:"), 15, "faults.components.warp_core"),
    "repair without unit": (("      repair: 4 h", "      repair: 4"), 17, "faults.components.gpu.repair"),
    "interval 0": (("  interval: 30 min", "  interval: 0 steps"), 19, "checkpoint.interval"),
    "horizon under a step": (("  horizon: 2 d", "  horizon: 1 ms"), 12, "run.horizon"),
    "checkpoint over capacity": (("  capacity: 1 PB", "  capacity: 10 GB"), 21, "storage.capacity"),
    "shape without weibull": (("      repair: 4 h", "      shape: 0.7"), 15, "faults.components.gpu"),
    "degrade a gpu": (("      repair: 4 h", "      effect: degrade"), 17, "faults.components.gpu.effect"),
    "negative steps": (("  interval: 30 min", "  interval: -5 steps"), 19, "checkpoint.interval"),
    "fractional steps": (("  interval: 30 min", "  interval: 1.5 steps"), 19, "checkpoint.interval"),
    "maintenance longer than its period": (("  components:", "  maintenance: {every: 1 h, duration: 2 h}\n"
                                            "  components:"), 14, "faults.maintenance"),
    "failures every 0.1 s": (("      mtbf: 1000 h", "      mtbf: 100 ms"), 15, "faults.components.gpu"),
    # was blamed on checkpoint.interval, which the scenario leaves at its default of 30 min
    "horizon of 1e300 s": (("  horizon: 2 d", "  horizon: 1e300 s"), 12, "run.horizon"),
    # 36,500 d: 1.77 M events per replication, 21.2 M over 12 (below); was blamed on checkpoint.interval
    # (the largest part, left at its default)
    "replications past the event limit": (("  horizon: 2 d", "  horizon: 36500 d\n  replications: 12"), 13,
                                          "run.replications"),
    # was blamed on storage.capacity, which the scenario gives too
    "checkpoint size over capacity": (("  interval: 30 min", "  interval: 30 min\n  size: 2 PB"), 20,
                                      "checkpoint.size"),
    "bytes per parameter over capacity": (("  interval: 30 min", "  interval: 30 min\n  bytes_per_param: 1e6"),
                                          20, "checkpoint.bytes_per_param"),
    # maintenance windows dominate: the failure rates' multiplier scales none of them (was blamed on it)
    "maintenance past the event limit": (("  horizon: 2 d\nfaults:\n  components:",
                                          "  horizon: 36500 d\nfaults:\n  rate_multiplier: 1\n"
                                          "  maintenance: {every: 1 min, duration: 1 s}\n  components:"), 15,
                                         "faults.maintenance.every"),
    "elastic policy without elastic": (("  spares: 1", "  spares: 1\n  regrow: next_restart"), 24,
                                       "restart.regrow"),
    "repair of a restart": (("      repair: 4 h", "      repair: 4 h\n      effect: restart"), 17,
                            "faults.components.gpu.repair"),
    "weibull shape under 0.1": (("      repair: 4 h", "      repair: 4 h\n      distribution: weibull\n"
                                 "      shape: 0.001"), 19, "faults.components.gpu.shape"),
    # was accepted as the exponential (shape 1), without a word
    "weibull without a shape": (("      repair: 4 h", "      repair: 4 h\n      distribution: weibull"), 15,
                                "faults.components.gpu"),
    "interval beyond 64-bit steps": (("  interval: 30 min", "  interval: 1e30 steps"), 19, "checkpoint.interval"),
    # the empty key quoted: the field read `faults.components.`, a trailing dot and nothing after it
    "a class without a name": (("    gpu:", '    "":\n      unit: gpu'), 15, "faults.components['']"),
    "a class named blank": (("    gpu:", '    " ":\n      unit: gpu'), 15, "faults.components[' ']"),
    "a class named as a restart's cause": (("    gpu:", "    maintenance:\n      unit: gpu"), 15,
                                           "faults.components.maintenance"),
    "a class named as the elastic shrink": (("    gpu:", "    elastic_shrink:\n      unit: gpu"), 15,
                                            "faults.components.elastic_shrink"),
    "a rate per a bare unit": (("      mtbf: 1000 h", "      rate: 0.5 per h"), 16, "faults.components.gpu.rate"),
    # both give the checkpoint's size
    "size beside bytes per parameter": (("  interval: 30 min",
                                         "  interval: 30 min\n  size: 1 TB\n  bytes_per_param: 16"), 18, "checkpoint"),
    "maintenance without a period or a preset": (("  components:", "  maintenance: {duration: 10 min}\n"
                                                  "  components:"), 14, "faults.maintenance.every"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_job_input_is_one_located_line(case, tmp_path, capsys):
    (old, new), line, field = BAD[case]
    assert old in SPARE_JOB
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace(old, new))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.match(rf"^error: {re.escape(str(scenario))}:{line}: {re.escape(field)}: ", err), err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(("in_file", "told"), [(None, ["checkpoint.size=1TB", "checkpoint.bytes_per_param=16"]),
                                               ("  size: 1 TB", ["checkpoint.bytes_per_param=16"]),
                                               ("  bytes_per_param: 16", ["checkpoint.size=1TB"])])
def test_a_checkpoint_size_beside_bytes_per_param_is_refused(tmp_path, capsys, in_file, told):
    """`size` and `bytes_per_param` both give the checkpoint's size: either from the file or from --set, the pair is
    refused at the checkpoint section's line, as `mtbf` beside `rate` is; its example is Llama 3 405B's 14 B
    checkpoint, 5.68 TB, as docs/reliability.md's scenario comment gives it."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("  interval: 30 min", f"  interval: 30 min\n{in_file}" if in_file
                                          else "  interval: 30 min"))
    settings = [arg for setting in told for arg in ("--set", setting)]
    assert main(["validate", str(scenario), *settings]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: {scenario}:18: checkpoint: give one of size and bytes_per_param, not both"), err
    assert "(allowed: size: '5.68 TB', bytes_per_param: 14)" in err, err


def test_a_checkpoint_larger_than_the_storage_reads_in_decimal_units(tmp_path, capsys):
    """The checkpoint and the storage read in decimal units, as their fields are given (`--set storage.capacity=1TB` is
    not answered in binary units, 'larger than the storage (931.3 GiB)'): llama3-8b's 8,030,261,248 parameters x 14 B
    = 112.4 GB against 100 GB."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB)
    assert main(["validate", str(scenario), "--set", "storage.capacity=100GB"]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim validate: --set storage.capacity=100GB: a 112.4 GB checkpoint is larger than "
        "the storage (100 GB) (allowed: a checkpoint of at most 100 GB, or a storage.capacity of at least 112.4 GB)\n")


@pytest.mark.parametrize(("size", "capacity", "shown"), [
    ("100.02GB", "100GB", "a 100.02 GB checkpoint is larger than the storage (100 GB) (allowed: a checkpoint of at "
                          "most 100 GB, or a storage.capacity of at least 100.02 GB)"),
    ("1.0001TB", "1TB", "a 1.0001 TB checkpoint is larger than the storage (1 TB) (allowed: a checkpoint of at "
                        "most 1 TB, or a storage.capacity of at least 1.0001 TB)"),
])
def test_a_checkpoint_just_larger_than_the_storage_reads_larger(tmp_path, capsys, size, capacity, shown):
    """A checkpoint of 100.02 GB against 100 GB of storage: the two sizes take the digits they need to differ, not four
    significant digits that make them equal ('a 100 GB checkpoint is larger than the storage (100 GB)')."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB)
    assert main(["validate", str(scenario), "--set", f"checkpoint.size={size}",
                 "--set", f"storage.capacity={capacity}"]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim validate: --set checkpoint.size={size}: {shown}\n"


def test_a_maintenance_duration_alone_keeps_the_presets_period(capsys):
    """`faults: {preset: llama3, maintenance: {duration: 30 min}}` gives the preset's 47 windows a length without
    restating their period (54 d / 47): `every` defaults to the preset's, not 'faults.maintenance.every: required
    field is missing'; a stop as long as that period is refused naming it, and without a preset `every` is required
    (BAD above)."""
    from simulator.config.faults import FaultsConfig
    from simulator.reliability.components import Maintenance, failure_model

    faults = FaultsConfig.model_validate({"preset": "llama3", "maintenance": {"duration": "30 min"}})
    assert failure_model(faults).maintenance == Maintenance(54 * 86400 / 47, 1800.0)
    faults = FaultsConfig.model_validate({"preset": "llama3", "maintenance": {"every": "1 d", "duration": "30 min"}})
    assert failure_model(faults).maintenance == Maintenance(86400.0, 1800.0)
    assert main(["validate", "llama3-405b-16k-job", "--set", "faults.maintenance.duration=2 d"]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim validate: --set faults.maintenance.duration=2 d: a 2 d stop every 1.149 d "
        "leaves no time to train, the period of faults.preset llama3 (allowed: a duration shorter than every)\n")


def test_a_preset_class_given_a_repair_alone_keeps_the_presets_rate(tmp_path, capsys):
    """`--set faults.components.gpu.repair=4h` over the llama3 preset (faster GPU swaps) keeps the preset's rate, as a
    class given a new rate keeps the preset's repair (not 'give exactly one of mtbf and rate'); so does a new Weibull
    shape. A class the preset lacks needs a rate, and both at once are refused."""
    from simulator.config.faults import FaultsConfig
    from simulator.reliability.components import failure_model

    faults = FaultsConfig.model_validate({"preset": "llama3", "components": {"gpu": {"repair": "4 h"},
                                          "hbm": {"distribution": "weibull", "shape": 0.7}}})
    classes = {c.name: c for c in failure_model(faults).classes}
    # Dubey et al. 2024 (Llama 3), Table 5: 148 faulty-GPU and 72 HBM3 interruptions in 54 days on 16,384 GPUs
    # (catalog/failures.py)
    gpu_per_s = 148 / 16384 / (54 * 86400)
    assert classes["gpu"].rate_per_unit_s == pytest.approx(gpu_per_s, rel=1e-12)
    assert (classes["gpu"].repair_s, classes["gpu"].label) == (4 * 3600.0, "faulty GPU")
    assert classes["hbm"].rate_per_unit_s == pytest.approx(72 / 16384 / (54 * 86400), rel=1e-12)
    assert (classes["hbm"].distribution, classes["hbm"].shape, classes["hbm"].repair_s) == ("weibull", 0.7, 2 * 86400.0)
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("      mtbf: 1000 h\n", ""))
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (
        f"error: {scenario}:15: faults.components.gpu: give one of mtbf and rate (allowed: mtbf: '50000 h', rate: "
        "'3 per 54 d'; a class of faults.preset keeps the preset's without them)\n")
    scenario.write_text(SPARE_JOB.replace("      mtbf: 1000 h", "      mtbf: 1000 h\n      rate: 1 per 1 h"))
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (
        f"error: {scenario}:15: faults.components.gpu: give one of mtbf and rate, not both (allowed: mtbf: '50000 h', "
        "rate: '3 per 54 d')\n")


def test_the_repair_multiplier_scales_every_classs_repair_and_is_checked_at_load(capsys):
    """Trying faster repairs over the llama3 preset meant setting `repair` on each GPU and host class one by one;
    `faults.repair_multiplier` scales every class's repair time (the preset's and those `components` give) and
    nothing else, a positive number whose products stay finite."""
    from simulator.config.faults import FaultsConfig
    from simulator.reliability.components import failure_model

    given = {"preset": "llama3", "components": {"gpu": {"repair": "4 h"}}}
    plain = {c.name: c for c in failure_model(FaultsConfig.model_validate(given)).classes}
    faster = FaultsConfig.model_validate({**given, "repair_multiplier": 0.25})
    quarter = {c.name: c for c in failure_model(faster).classes}
    assert plain.keys() == quarter.keys() and len(plain) > 5
    for name, before in plain.items():
        assert quarter[name].repair_s == before.repair_s * 0.25
        assert quarter[name].rate_per_unit_s == before.rate_per_unit_s
    assert quarter["gpu"].repair_s == 3600.0
    assert main(["validate", "llama3-405b-16k-job", "--set", "faults.repair_multiplier=0"]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim validate: --set faults.repair_multiplier=0: 0 is "
                                       "not above 0 (allowed: a value > 0)\n")
    assert main(["validate", "trace-job", "--set", "faults.repair_multiplier=1e308"]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim validate: --set faults.repair_multiplier=1e308: a 12 h repair times 1e308 is "
        "not finite (allowed: a multiplier that keeps every repair finite)\n")


def test_a_preset_class_moved_to_another_unit_needs_its_own_rate(tmp_path, capsys):
    """`--set faults.components.gpu.unit=host` over the llama3 preset kept the preset's per-GPU rate and counted
    it per host: 2,048 hosts gave 18.5 GPU failures in 54 d instead of 148, with no warning. The preset's rate
    has no exact rescaling to another unit, so the move is refused at the unit's line unless a rate is given."""
    assert main(["validate", "llama3-405b-16k-job", "--set", "faults.components.gpu.unit=host"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "faults.components.gpu.unit=host" in err
    assert "the preset's gpu rate is per gpu, and a class moved to unit 'host' needs its own mtbf or rate" in err
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("  components:", "  preset: llama3\n  components:")
                        .replace("      mtbf: 1000 h\n", "      unit: host\n"))
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (
        f"error: {scenario}:17: faults.components.gpu.unit: the preset's gpu rate is per gpu, and a class moved to "
        "unit 'host' needs its own mtbf or rate (allowed: unit 'gpu' to keep the preset's rate, or mtbf: "
        "'50000 h', rate: '3 per 54 d')\n")
    scenario.write_text(SPARE_JOB.replace("  components:", "  preset: llama3\n  components:")
                        .replace("      mtbf: 1000 h\n", "      unit: host\n      mtbf: 1000 h\n"))
    assert main(["validate", str(scenario)]) == 0


def test_a_key_under_an_optional_mapping_field_lists_the_allowed_keys():
    """An unknown key's (allowed: ...) walked into a mapping field only where the annotation was exactly a dict:
    under a `dict[...] | None` field the walk stopped, and the list was left out silently."""
    from pydantic import BaseModel, ConfigDict

    from simulator.config.loader import _allowed_keys

    class Inner(BaseModel):
        model_config = ConfigDict(extra="forbid")
        repair: str = ""
        unit: str = ""

    class Outer(BaseModel):
        components: dict[str, Inner] | None = None

    assert _allowed_keys(Outer, ("components", "gpu")) == "repair, unit"


def test_an_unknown_effect_names_the_choices(tmp_path, capsys):
    """An enum field's refusal was pydantic's own words, "Input should be 'replace', 'restart', 'degrade' or
    'straggle'", with no (allowed: ...) as every literal field's has."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("      repair: 4 h", "      effect: explode"))
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (f"error: {scenario}:17: faults.components.gpu.effect: 'explode' is not a valid "
                                       "choice (allowed: replace, restart, degrade or straggle)\n")


def test_a_straggle_effect_on_a_unit_that_cannot_straggle_is_refused_for_its_unit_first(tmp_path, capsys):
    """`leaf_switch: {effect: straggle}` is refused because straggle does not apply to a leaf switch, not told to
    add a slowdown first: the effect is checked against the unit before the slowdown rule, which refuses a
    straggle class without a slowdown."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("    gpu:\n", "    leaf_switch:\n      effect: straggle\n"))
    assert main(["validate", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert "faults.components.leaf_switch.effect: effect straggle on unit 'leaf_switch'" in err
    scenario.write_text(SPARE_JOB.replace("    gpu:\n", "    gpu:\n      effect: straggle\n"))
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (f"error: {scenario}:15: faults.components.gpu: effect straggle and a slowdown "
                                       "factor go together (allowed: effect: straggle, slowdown: 1.3)\n")


def test_a_plain_steps_failure_classes_are_checked_at_load(capsys):
    """A plain step (no horizon) never builds the failure model, so the failure classes' effect checks run at
    load, the effect against its unit first: `validate` refuses a straggle class without a slowdown there
    too."""
    base = ["validate", "scenarios/trace-job.yaml", "--set", "run.horizon=null", "--set"]
    assert main([*base, "faults.components.throttle={unit: gpu, effect: straggle, mtbf: 1000 h, repair: 12 h}"]) == 2
    assert "effect straggle and a slowdown factor go together" in capsys.readouterr().err
    assert main([*base, "faults.components.nvswitch_tray={effect: straggle, mtbf: 1000 h, repair: 12 h}"]) == 2
    assert "effect straggle on unit 'nvswitch_tray'" in capsys.readouterr().err


def test_a_misspelt_key_of_a_failure_class_names_the_class_fields(tmp_path, capsys):
    """A key of `faults.components.gpu` spelt wrong (`repiar`) is refused with the class's fields as allowed: the schema
    walk that lists a section's fields goes past the class's name, a key of a mapping, not a field."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("      repair: 4 h", "      repiar: 4 h"))
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (
        f"error: {scenario}:17: faults.components.gpu.repiar: unknown key 'repiar' (did you mean repair?) "
        "(allowed: unit, effect, slowdown, mtbf, rate, distribution, shape, repair, repair_distribution)\n")


def test_units_and_blast_radius_on_the_graph():
    topology = load_topology("dgx-h100-cluster", {"nodes": 64})
    units = cluster_units(topology)
    leaves = 2 * 8
    assert (units.count("gpu"), units.count("host"), units.count("nic")) == (512, 64, 512)
    assert (units.count("leaf_switch"), units.count("spine_switch")) == (leaves, 16)
    assert units.count("cable") == 512 + leaves * 16
    assert units.blast["gpu"][9] == (1,)
    assert sorted(len(hosts) for hosts in units.blast["leaf_switch"]) == [32] * leaves
    assert units.blast["leaf_switch"][0] == tuple(range(32))
    assert units.blast["spine_switch"][0] == ()
    assert sum(1 for hosts in units.blast["cable"] if hosts) == 512


@pytest.mark.parametrize("distribution, shape", [("exponential", 1.0), ("weibull", 0.7), ("weibull", 2.0)])
def test_failure_counts_follow_the_renewal_rate(distribution, shape):
    """Over a horizon of 200 MTBFs per unit, the count per unit is H / MTBF (renewal theorem) within 0.5% (today
    0.3% at worst; standard deviation of the 12,800 failures' count 0.9% for exponential gaps, 1.3% for Weibull
    0.7), and the exponential repair times' mean is the class's 60 s within 1.2% (today 1.0%; standard error
    60 / sqrt(12,800) s, 0.9%)."""
    mtbf = 1000.0
    klass = FailureClass("x", "gpu", "replace", 1 / mtbf, distribution, shape, repair_s=60.0)
    arrivals = draw_arrivals(np.random.default_rng(1), (klass,), [64], 200 * mtbf)
    assert len(arrivals) / 64 == pytest.approx(200, rel=0.005)
    assert np.all(np.diff(arrivals.time_s) >= 0)
    assert arrivals.repair_s.mean() == pytest.approx(60.0, rel=0.012)
    assert math.isclose(float(arrivals.unit.max()), 63)


def _fraction_down(arrivals, units: int, horizon: float) -> np.ndarray:
    """Each unit's share of ``horizon`` in repair: the union of its [failure, failure + repair] spans."""
    down = np.zeros(units)
    for unit in range(units):
        mine = arrivals.unit == unit
        end = -math.inf
        for start, stop in zip(arrivals.time_s[mine], np.minimum(arrivals.time_s[mine] + arrivals.repair_s[mine],
                                                                   horizon)):
            down[unit] += max(0.0, stop - max(start, end))
            end = max(end, stop)
    return down / horizon


@pytest.mark.parametrize("distribution, shape, repair", [("exponential", 1.0, "fixed"),
                                                         ("weibull", 0.7, "exponential")])
def test_a_unit_in_repair_does_not_fail_again(distribution, shape, repair):
    """A spine repaired in place (8 h repairs, MTBF 100 h) does not fail while in repair: its renewal restarts at
    the repair's end, so over 10,000 h each of 1,000 spines fails horizon / (M + r) = 92.6 times and is down r / (M
    + r) = 7.41% of the time, within 4 standard errors of the units' mean (0.3 failures, 0.02 to 0.04 points)."""
    from simulator.config.reliability import Effect

    mtbf, repair_s, horizon, units = 100 * 3600.0, 8 * 3600.0, 10_000 * 3600.0, 1000
    klass = FailureClass("spine", "spine_switch", Effect.DEGRADE, 1 / mtbf, distribution, shape, repair_s=repair_s,
                         repair_distribution=repair)
    arrivals = draw_arrivals(np.random.default_rng(1), (klass,), [units], horizon)
    counts = np.bincount(arrivals.unit, minlength=units)
    down = _fraction_down(arrivals, units, horizon)
    assert abs(counts.mean() - horizon / (mtbf + repair_s)) < 4 * counts.std() / math.sqrt(units)
    assert abs(down.mean() - repair_s / (mtbf + repair_s)) < 4 * down.std() / math.sqrt(units)
    assert klass.failure_rate_s(spare_at_hand=True) * horizon == pytest.approx(horizon / (mtbf + repair_s), rel=1e-12)


def test_a_unit_repaired_in_place_starts_in_service_not_new():
    """40,000 spines repaired in place (Weibull shape 0.5, MTBF 100 h, fixed 24 h repairs) over 720 h: each
    starts up at its law's equilibrium age, as the cluster in service does, so it fails 5.60 times, 3.5% under
    720 h / 124 h = 5.81 (the start misses the units that would be in repair then, docs/reliability.md
    Processes), far from the 6.94 of units starting new (age 0) and more than 4 standard errors from the rate
    that the exact equilibrium of up and repair gives: a change of either start fails here and moves that
    page's figures."""
    from simulator.config.reliability import Effect

    mtbf, repair_s, horizon, units = 100 * 3600.0, 24 * 3600.0, 720 * 3600.0, 40_000
    klass = FailureClass("spine", "spine_switch", Effect.DEGRADE, 1 / mtbf, "weibull", 0.5, repair_s=repair_s,
                         repair_distribution="fixed")
    counts = np.bincount(draw_arrivals(np.random.default_rng(1), (klass,), [units], horizon).unit, minlength=units)
    error = counts.std() / math.sqrt(units)
    assert counts.mean() == pytest.approx(5.60, abs=error)
    assert horizon / (mtbf + repair_s) - counts.mean() > 4 * error
    assert counts.mean() < 6.94 - 4 * error


@pytest.mark.parametrize("shape", [0.5, 0.8, 2.0])
def test_a_weibull_class_expects_its_rate_over_a_short_horizon(shape):
    """A horizon of 5% of the units' MTBF, as a job's weeks are next to a GPU's years: the cluster is in service,
    each unit's renewal process in equilibrium, so the count is units x horizon / MTBF (4,000 here, Poisson standard
    deviation 1.6%) whatever the shape."""
    mtbf, units = 1000.0, 80_000
    klass = FailureClass("x", "gpu", "replace", 1 / mtbf, "weibull", shape, repair_s=60.0)
    arrivals = draw_arrivals(np.random.default_rng(1), (klass,), [units], 0.05 * mtbf)
    assert len(arrivals) == pytest.approx(units * 0.05, rel=0.025)  # today 2.1% over at shape 0.5, 1.3 sd


NEEDS_THE_STEP = {"horizon under a step", "failures every 0.1 s", "replications past the event limit",
                  "maintenance past the event limit"}
"""Refusals that compare with the simulated step, which `trainsim validate` does not run: it refuses them at
the same field from what it can count without the step (a lower bound of the step time; the failures and
maintenance windows, not the checkpoints), in words of its own."""


@pytest.mark.parametrize("case", sorted(BAD))
def test_validate_refuses_what_a_job_run_refuses(case, tmp_path, capsys):
    """`trainsim validate` of a job scenario gives the run's one line, not 'valid', for spares beyond the cluster, an
    unknown class, a checkpoint larger than the storage and a horizon shorter than the step, at the same field where
    it needs the step."""
    (old, new), _, _ = BAD[case]
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace(old, new))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 2
    refused = capsys.readouterr().err
    if case == "replications past the event limit":  # its excess is checkpoints, which validate cannot count
        assert main(["validate", str(scenario)]) == 0
        return
    assert main(["validate", str(scenario)]) == 2
    said = capsys.readouterr().err
    if case in NEEDS_THE_STEP:
        assert said.split(": ")[:3] == refused.split(": ")[:3]
    else:
        assert said == refused


def test_validate_refuses_a_horizon_shorter_than_the_step_it_can_bound(tmp_path, capsys):
    """A 1F1B step of 4 stages and 8 micro-batches of F = 1 ms, B = 2 ms lasts (m + p - 1)(F + B) = 33 ms, and no stage
    can finish before its own m (F + B) = 24 ms of kernels: `trainsim validate` refuses a 20 ms horizon from that
    bound, as `run` does, and passes 30 ms, which only `run` can refuse."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text("cluster: {topology: dgx-h100}\n"
                        "model: {synthetic: {stages: 4, forward: 1 ms, backward: 2 ms}}\n"
                        "training: {microbatches: 8}\nparallelism: {pp: 4, dp: 2}\n"
                        "run: {horizon: 20 ms}\ncheckpoint: {size: 1 GB}\n")
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (f"error: {scenario}:5: run.horizon: the horizon is shorter than one step (at "
                                       "least 0.024 s, the kernels of its busiest GPU stream alone) (allowed: a "
                                       "longer duration)\n")
    assert main(["validate", str(scenario), "--set", "run.horizon=30 ms", "--quiet"]) == 0
    assert main(["run", str(scenario), "--set", "run.horizon=30 ms", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim run: --set run.horizon=30 ms: the horizon is "
                                       "shorter than one step (0.033 s) (allowed: a longer duration)\n")


def test_a_job_of_a_workload_list_is_refused(tmp_path, capsys):
    """A list of collectives is no training step; a job of one is refused, naming the steps a job runs (a model or
    a replayed trace: tests/test_trace_job.py)."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text("cluster: {topology: ethernet-100g, nodes: 2}\nworkload: [{op: all_reduce, bytes: 1 GiB}]\n"
                        "run: {horizon: 2 d}\ncheckpoint: {size: 1 GB}\n")
    for command in (["validate", str(scenario)], ["run", str(scenario), "--out", str(tmp_path / "out")]):
        assert main(command) == 2
        assert capsys.readouterr().err == (f"error: {scenario}:3: run.horizon: a job simulation needs a training "
                                           "step, which a list of collectives is not (allowed: a model section "
                                           "(preset, dimensions or synthetic stage costs), a replayed trace "
                                           "(workload.trace), or no run.horizon)\n")


@pytest.mark.parametrize("change, message", [
    (("  interval: 30 min", "  interval: -5 steps"),
     "checkpoint.interval: interval '-5 steps' must be a whole number of steps, at least one (allowed: '200 steps', "
     "'30 min')"),
    # a bare number read as a duration without its unit, and the refusal offered durations only
    (("  interval: 30 min", "  interval: 200"),
     "checkpoint.interval: duration 200 has no unit (allowed: a number of steps, e.g. '200 steps', or a duration "
     "in ns, us, ms, s, min, h, d, e.g. '30 min')"),
    (("      repair: 4 h", "      shape: 0.7"),
     "faults.components.gpu: shape 0.7 applies to distribution: weibull only (allowed: distribution: weibull with "
     "a shape, or no shape)"),
    (("      repair: 4 h", "      repair: 4 h\n      distribution: weibull"),
     "faults.components.gpu: distribution: weibull needs a shape, which says how failures cluster (allowed: a shape "
     "of at least 0.1, e.g. shape: 0.7; shape 1 is the exponential)"),
    (("  components:", "  maintenance: {every: 1 h, duration: 2 h}\n  components:"),
     "faults.maintenance: a 2 h stop every 1 h leaves no time to train (allowed: a duration shorter than every)"),
    (("  components:", "  maintenance: {every: 1 d, duration: 2 d}\n  components:"),  # was '172800 s ... 86400 s'
     "faults.maintenance: a 2 d stop every 1 d leaves no time to train (allowed: a duration shorter than every)"),
    (("      mtbf: 1000 h", "      mtbf: 100 ms"),
     "faults.components.gpu: the job would handle ~27,648,096 events over 1 replication (27,648,000 failures, "
     "0 maintenance windows, 96 checkpoints; limit 20,000,000) (allowed: lower failure rates, a longer "
     "checkpoint.interval or faults.maintenance.every, fewer run.replications or a shorter run.horizon; or pass "
     "--force)"),
    # 1e300 s / 30 min = 5.556e296 checkpoints were refused under the default checkpoint.interval, each count
    # printed with 297 digits at first
    (("  horizon: 2 d", "  horizon: 1e300 s"),
     "run.horizon: horizon 1.1574e+295 d is more than 36,500 d (a century), longer than any training job (allowed: "
     "a duration up to 36500 d, e.g. 54 d)"),
    # a horizon typed in days is answered in days, as the limit is
    (("  horizon: 2 d", "  horizon: 36501 d"),
     "run.horizon: horizon 36,501 d is more than 36,500 d (a century), longer than any training job (allowed: a "
     "duration up to 36500 d, e.g. 54 d)"),
    # 16 GPUs at 1 / 1000 h over 36,500 d: 16 x 876,000 h / 1000 h = 14,016 failures; 36,500 d / 30 min =
    # 1,752,000 checkpoints at most (1,749,870.0: 30 min rounds to whole steps, and each cycle adds its
    # snapshot stall); ~1.76 M per replication, within the limit, and 12 x 1,763,886 = 21.2 M over 12
    # replications, beyond it: the replications carry the excess
    (("  horizon: 2 d", "  horizon: 36500 d\n  replications: 12"),
     "run.replications: the job would handle ~21,166,632 events over 12 replications (168,192 failures, 0 "
     "maintenance windows, 20,998,440 checkpoints; limit 20,000,000) (allowed: lower failure rates, a longer "
     "checkpoint.interval or faults.maintenance.every, fewer run.replications or a shorter run.horizon; or pass "
     "--force)"),
    (("    gpu:", "    elastic_shrink:\n      unit: gpu"),
     "faults.components.elastic_shrink: 'elastic_shrink' is a cause the job's outputs name already (allowed: a "
     "non-blank name other than failure, maintenance, elastic_shrink and regrow, e.g. rack_pdu)"),
    (("      mtbf: 1000 h", "      rate: 0.5 per h"),
     "faults.components.gpu.rate: rate '0.5 per h' has a period without its number, 'h' (allowed: 'N per U units "
     "per T' or 'N per T', T a duration, e.g. '148 per 16384 units per 54 d', '0.5 per 1 h')"),
    # was "unknown duration unit 'GPUs per 54 d' in '16384 GPUs per 54 d'"
    (("      mtbf: 1000 h", "      rate: 148 per 16384 GPUs per 54 d"),
     "faults.components.gpu.rate: rate '148 per 16384 GPUs per 54 d' counts 'GPUs': the count of units is written "
     "'16384 units' (the class's unit says what a unit is) (allowed: 'N per U units per T' or 'N per T', T a "
     "duration, e.g. '148 per 16384 units per 54 d', '0.5 per 1 h')"),
    # was "unknown duration unit ',384 GPUs per 54 d' in '16,384 GPUs per 54 d'"
    (("      mtbf: 1000 h", "      rate: 148 per 16,384 GPUs per 54 d"),
     "faults.components.gpu.rate: rate '148 per 16,384 GPUs per 54 d' counts 'GPUs': the count of units is "
     "written '16,384 units' (the class's unit says what a unit is) (allowed: 'N per U units per T' or 'N per T', T "
     "a duration, e.g. '148 per 16384 units per 54 d', '0.5 per 1 h')"),
    # was "counts 'd': the count of units is written '2 units'", a duration taken for a count of units
    (("      mtbf: 1000 h", "      rate: 148 per 2 d per 54 d"),
     "faults.components.gpu.rate: cannot read rate '148 per 2 d per 54 d': after the count, one period or 'U units "
     "per' a period (allowed: 'N per U units per T' or 'N per T', T a duration, e.g. '148 per 16384 units per 54 d', "
     "'0.5 per 1 h')"),
])
def test_bad_job_input_says_what_to_change(change, message, tmp_path, capsys):
    """The refusal names the problem in the user's terms: '-5 steps' is not read as a duration with an
    unknown unit 'steps'; a failure rate that would draw 27.6 million failures (16 GPUs failing every 100 ms
    for 2 days) is refused before any is drawn, not simulated for many minutes."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace(*change))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    problem = err.split(": ", 2)[2]
    assert problem == message, err


def test_an_interval_past_the_horizon_is_a_warning_with_its_bound(tmp_path, capsys):
    """A checkpoint interval longer than the horizon ('3 d' meant as '3 min') wrote no checkpoint without a word:
    it warns at its line, with the most whole healthy steps whose first write still ends within the horizon, on
    stderr and in summary.json's warnings (`validate` too, for a duration, without the steps it cannot know), and
    the job runs (no checkpoint row in its events); the default interval (30 min) past a shorter horizon asked for
    no checkpoint and does not warn."""
    import pandas as pd

    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB)
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--quiet", "--set", "checkpoint.interval=3 d"]) == 0
    job = json.loads((out / "job_summary.json").read_text())
    step, write = job["step_time_s"], job["checkpoint"]["write_s"]
    most = math.ceil((2 * 86400 - write) / step) - 1
    problem = ("a checkpoint every 3 d is longer than run.horizon (2 d): the job writes none, and each failure loses "
               "the work since its start or the last maintenance stop")
    warning = (f"--set checkpoint.interval=3 d: {problem} (allowed: at most {most:,} steps (about "
               f"{format_duration(most * step)}) for checkpoints to be written)")
    assert capsys.readouterr().err == f"warning: command line: trainsim run: {warning}\n"
    assert json.loads((out / "summary.json").read_text())["warnings"] == [warning]
    assert "checkpoint" not in set(pd.read_parquet(out / "job_events.parquet")["kind"].astype(str))
    assert main(["validate", str(scenario), "--quiet", "--set", "checkpoint.interval=3 d"]) == 0
    assert capsys.readouterr().err == (f"warning: command line: trainsim validate: --set checkpoint.interval=3 "
                                       f"d: {problem} "
                                       "(allowed: a duration under 2 d for checkpoints to be written)\n")
    assert main(["validate", str(scenario), "--quiet", "--set", "checkpoint.interval=259208.6 s"]) == 0
    assert "a checkpoint every 3 d is longer than run.horizon (2 d)" in capsys.readouterr().err
    short = tmp_path / "short.yaml"
    short.write_text(SPARE_JOB.replace("  interval: 30 min\n", "  mode: sync\n").replace("horizon: 2 d",
                                                                                        "horizon: 20 min"))
    assert main(["run", str(short), "--out", str(tmp_path / "short"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("interval", ["2 d", "one step more", "the most steps"])
def test_an_interval_whose_first_write_ends_at_the_horizon_warns_and_the_bound_is_exact(tmp_path, capsys, interval):
    """An interval equal to the horizon, or whose first write (the interval in whole steps, then the write) would
    end at or past it, writes no checkpoint either, and warns with that end; the bound it names is exact: a job
    without failures at that many steps writes its one checkpoint, and one step more writes none."""
    import pandas as pd

    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("mtbf: 1000 h", "mtbf: 1000000000 h"))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    job = json.loads((out / "job_summary.json").read_text())
    step, write = job["step_time_s"], job["checkpoint"]["write_s"]
    most = math.ceil((2 * 86400 - write) / step) - 1
    given = {"2 d": "2 d", "one step more": f"{most + 1} steps", "the most steps": f"{most} steps"}[interval]
    again = tmp_path / "again"
    assert main(["run", str(scenario), "--out", str(again), "--quiet", "--set", f"checkpoint.interval={given}"]) == 0
    err = capsys.readouterr().err
    written = (pd.read_parquet(again / "job_events.parquet")["kind"].astype(str) == "checkpoint").sum()
    if interval == "the most steps":
        assert (err, written) == ("", 1)
        return
    steps = round(2 * 86400 / step) if interval == "2 d" else most + 1
    assert written == 0
    end = steps * step + write
    assert (f"finishes no write before run.horizon (2 d): its first, after {steps:,} steps and a "
            f"{format_duration(write)} write, would end at 2 d ({format_duration(end - 2 * 86400)} past it): the job "
            "writes none") in err
    assert f"(allowed: at most {most:,} steps (about {format_duration(most * step)}) for" in err


def test_force_refuses_a_job_no_machine_could_simulate(tmp_path, capsys):
    """`--force` runs a job past the 20 million event limit, but not one of more than 10^12 events (70 days and
    150 TiB at the limit's rate): 16 GPUs failing 1e300 times a second for 2 d draw 16 x 1e300 x 172,800 =
    2.765e306 failures, whose count numpy could not even draw (its 'lam value too large' was a traceback)."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("      mtbf: 1000 h", "      rate: 1e300 per 1 s"))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--force"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {scenario}:15: faults.components.gpu: the job would handle ~2.765e+306 events over 1 replication "
        "(2.765e+306 failures, 0 maintenance windows, 96 checkpoints; even --force runs at most 1,000,000,000,000) "
        "(allowed: lower failure rates, a longer checkpoint.interval or faults.maintenance.every, fewer "
        "run.replications or a shorter run.horizon)")
    assert not out.exists()


@pytest.mark.parametrize("rate", ["0.5 per 1 h", ".5 per 1 h", "1 per 2 units per 1 h", "1800 per 1 units per 1 h",
                                  "1,800 per 1 units per 1 h", "8,192 per 16,384 units per 1 h"])
def test_a_rate_reads_decimal_counts_as_durations_read_numbers(rate):
    """"N per T" takes N as any number a duration takes ('.5' too, which the rate refused while '.5 h' was
    read): a unit failing 0.5 times per hour fails 0.5 / 3,600 s = 1.389e-4 times a second. The docs' "N per U
    units per T" divides by U (1 per 2 units per hour is the same rate); 1800 per unit per hour is 0.5 / s.
    Counts take thousands separators ('16,384 units' was "unknown duration unit ',384 units per 1 h'")."""
    from simulator.config.reliability import parse_rate

    expected = 0.5 if "800 per" in rate else 0.5 / 3600
    assert parse_rate(rate) == pytest.approx(expected, rel=1e-15)


def test_a_class_of_a_unit_the_cluster_lacks_is_refused(tmp_path, capsys):
    """A `nic` class on one DGX H100 (8 GPUs on NVSwitch, no NIC, switch or cable) counts no units: it is refused in one
    located line, also from `validate`, not run silently without a single NIC failure; the llama3 preset's network
    classes count none there without a word (the preset is for any cluster)."""
    single = SPARE_JOB.replace("  topology: dgx-h100-cluster\n  nodes: 2\n", "  topology: dgx-h100\n").replace(
        "global_batch: 16", "global_batch: 8")
    scenario = tmp_path / "job.yaml"
    scenario.write_text(single.replace("    gpu:", "    nic:"))
    message = (f"error: {scenario}:14: faults.components.nic: class 'nic' fails per nic, and this cluster has no "
               "nic (allowed: a class whose unit the cluster has: gpu, host)")
    for command in (["run", str(scenario), "--out", str(tmp_path / "out")], ["validate", str(scenario)]):
        assert main(command) == 2
        assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "out").exists()
    scenario.write_text(single.replace("faults:\n", "faults:\n  preset: llama3\n"))
    assert main(["validate", str(scenario)]) == 0


def test_a_preset_class_given_a_new_rate_keeps_its_label_and_repair(tmp_path):
    """`components: {gpu: {mtbf: ...}}` over the llama3 preset changes the rate only: the class is still the
    paper's 'faulty GPU', repaired in 2 d, in job_summary.json and in the printed table."""
    from simulator.config.loader import scenario_from_text
    from simulator.reliability.simulate import simulate_job

    text = SPARE_JOB.replace("faults:\n", "faults:\n  preset: llama3\n").replace("      repair: 4 h\n", "")
    model = simulate_job(scenario_from_text(text)).summary["failure_model"]
    assert model["gpu"]["label"] == "faulty GPU" and model["gpu"]["repair_s"] == 2 * 86400.0
    assert model["gpu"]["rate_per_unit_per_h"] == pytest.approx(1 / 1000)


@pytest.mark.parametrize("multipliers", ["inf", "nan", "0", "1,-2"])
def test_study_multipliers_are_positive_finite_numbers(multipliers, tmp_path, capsys):
    """`--multipliers inf` is refused at the flag, not at a `--set faults.rate_multiplier=inf` the user never typed."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB)
    out = tmp_path / "out"
    assert main(["study", "mtbf", str(scenario), f"--multipliers={multipliers}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: command line: trainsim study: --multipliers: {multipliers!r} needs positive, finite values "
                   "(allowed: numbers, e.g. 0.5,1,2,4)"), err
    assert not out.exists()


def test_study_intervals_may_be_whole_steps_as_checkpoint_interval_is(tmp_path, capsys):
    """`checkpoint.interval` takes '200 steps' or a duration, and so does `--intervals` (`2steps`, not "unknown duration
    unit 'steps'"): every point runs those steps exactly, and a step count that is not whole is refused at the option
    as the field refuses it."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB)
    out = tmp_path / "out"
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "2steps,4 steps", "--out", str(out),
                 "--quiet"]) == 0
    points = json.loads((out / "study.json").read_text())["curves"][0]["points"]
    assert [point["interval_steps"] for point in points] == [2, 4]
    capsys.readouterr()
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "1.5steps", "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim study: --intervals: interval '1.5steps' must be "
                                       "a whole number "
                                       "of steps, at least one (allowed: durations with units or whole steps, e.g. "
                                       "5min,10min,30min,1h or 10steps,20steps)\n")


def test_study_intervals_that_round_to_the_same_steps_are_refused_as_a_value_given_twice_is(tmp_path, capsys):
    """`--intervals 10min,600s` is refused (the same value twice), but a duration and a step count that round to
    the same whole steps (or two durations below half a step, both raised to one) ran the same point twice, a
    duplicate row in the curve and its fit. They are refused before any point runs, naming both and the steps."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB)
    out = tmp_path / "out"
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "2steps", "--out", str(out),
                 "--quiet"]) == 0
    step_s = json.loads((out / "study.json").read_text())["curves"][0]["points"][0]["interval_s"] / 2
    capsys.readouterr()
    again = tmp_path / "again"
    near = 3.2 * step_s
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", f"{near!r}s,1steps,3 steps",
                 "--out", str(again)]) == 2
    assert capsys.readouterr().err == (f"error: command line: trainsim study: --intervals: {near:g} s and 3 steps both "
                                       f"run a checkpoint every 3 steps (steps of {format_duration(step_s)}): the "
                                       "same point twice (allowed: values distinct in whole steps, durations with "
                                       "units or whole steps, e.g. 5min,10min,30min,1h or 10steps,20steps)\n")
    assert main(["study", "mtbf", str(scenario), "--intervals", f"{step_s / 10!r}s,{step_s / 4!r}s",
                 "--multipliers", "1,2", "--out", str(again)]) == 2
    assert " both run a checkpoint every 1 step (steps of " in capsys.readouterr().err
    assert not again.exists()


def test_a_step_word_in_other_case_is_refused_as_any_unit_in_other_case_is(tmp_path, capsys):
    """Unit words are case-sensitive (`10 MIN`, `1 gib` are refused: case tells b from B), and `10 steps` and `10steps`
    are step counts: a step word in other case (`--intervals '10 Steps'`) is refused as a unit in the wrong case, in
    `--intervals` and `checkpoint.interval` alike, naming the unit it may mean, in the one wording a duration or size
    unit in the wrong case gets (not "unknown duration unit 'Steps'"; the allowed units name the kind)."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB)
    out = tmp_path / "out"
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "10 Steps", "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim study: --intervals: unknown unit 'Steps' in "
                                       "'10 Steps': units are case-sensitive (steps) (allowed: durations with units "
                                       "or whole steps, e.g. 5min,10min,30min,1h or 10steps,20steps)\n")
    assert main(["validate", str(scenario), "--set", "checkpoint.interval=10 STEPS"]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim validate: --set checkpoint.interval=10 STEPS: "
                                       "unknown unit 'STEPS' in '10 STEPS': units are case-sensitive (steps) "
                                       "(allowed: '200 "
                                       "steps', '30 min')\n")
    assert main(["validate", str(scenario), "--set", "checkpoint.interval=10 MIN"]) == 2
    assert "unknown unit 'MIN' in '10 MIN': units are case-sensitive (min) (allowed: " in (
        capsys.readouterr().err)
    assert main(["validate", str(scenario), "--set", "checkpoint.size=1 gib"]) == 2
    assert "unknown unit 'gib' in '1 gib': units are case-sensitive (GiB) (allowed: " in capsys.readouterr().err
    assert not out.exists()


def test_a_study_value_beyond_the_event_limit_is_blamed_on_its_option(tmp_path, capsys):
    """16 GPUs failing every 1000 h for 2 d expect 16 x 48 h / 1000 h = 0.768 failures; x 1e12, 768 billion. The
    refusal named the scenario's `faults` line, which the user did not change, and a multiplier that overflowed
    the rate a `--set faults.rate_multiplier=inf` the user never typed."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB)
    out = tmp_path / "out"
    assert main(["study", "mtbf", str(scenario), "--multipliers", "1,1e12", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim study: --multipliers: x 1e+12: the job would handle ~768,000,000,096 events "
        "over 1 "
        "replication (768,000,000,000 failures, 0 maintenance windows, 96 checkpoints; limit 20,000,000) "
        "(allowed: lower failure rates, a longer checkpoint.interval or faults.maintenance.every, fewer "
        "run.replications or a shorter run.horizon; or pass --force)\n")
    assert main(["study", "mtbf", str(scenario), "--multipliers", "1e308", "--set", "faults.rate_multiplier=10",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("error: command line: trainsim study: --multipliers: x 1e+308: expected a "
                                       "finite number, got "
                                       "inf (allowed: a number such as 0.5)\n")
    assert not out.exists()


def refused_16k_job(tmp_path, capsys, *settings: str) -> str:
    """The error of the 16,384-GPU job run for one replication with ``settings``: refused (exit 2) in one line,
    with nothing written."""
    out = tmp_path / "out"
    assert main(["run", "llama3-405b-16k-job", "--out", str(out), "--set", "run.replications=1",
                 *(word for setting in settings for word in ("--set", setting))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert not out.exists()
    return err


def test_degraded_states_that_fold_pass_the_jobs_scale_limits(monkeypatch):
    """A leaf switch that degrades (the docs' example) on the 16,384-GPU job: each leaf struck takes 48 links down, and
    its state folds by the hosts near them (its leaf group's 32 hosts apart, one rank per rail elsewhere) onto 384 of
    16,384 ranks, ~1.5 million ops + flows and ~1.7 GiB. The job's up-front check sizes each leaf's state by its fold
    and passes, with no step built; sized as the unfolded step (~66 million and ~55 GiB) it would be refused although
    it folds."""
    loaded = load_scenario("llama3-405b-16k-job", ["faults.components.leaf_switch={mtbf: 100 d, repair: 4 h}"])
    topology = capped_topology(loaded, False)
    sized: list[tuple[int, int]] = []
    refuse_folded = job_simulation._refuse_folded_link_state

    def recording_sizes(*args) -> None:
        """Note each state's (ranks, world), the 6th and 4th arguments, and refuse as the real check does."""
        sized.append((args[5], args[3]))
        refuse_folded(*args)

    monkeypatch.setattr(job_simulation, "_refuse_folded_link_state", recording_sizes)
    _refuse_unfolded_steps(loaded, check_job(loaded, topology).model, topology, LinkStateSizes(loaded, topology),
                           None)
    assert sized == [(384, 16_384)]
    folded, unfolded = classed_estimate(loaded, 16_384, 384), unfolded_beyond_limits(loaded, 16_384)
    assert folded is not None and not folded.over_limits()
    assert unfolded is not None and unfolded.over_limits()


def test_degraded_states_whose_fold_is_refused_up_front_are_refused(tmp_path, capsys):
    """The same leaf switch on the analytic model, which folds no step with links down (it has no lockstep check
    after the run): each leaf struck is an unfolded step, ~66 million ops + flows and ~55 GiB, past the limits a
    plain run has. The job is refused in one located line before its healthy step; `--force` is the way past."""
    err = refused_16k_job(tmp_path, capsys, "faults.components={leaf_switch: {mtbf: 365 d, repair: 4 h}}",
                          "network.model=analytic")
    assert "faults.components.leaf_switch: a leaf_switch failure degrades the cluster" in err
    assert "link faults on the analytic model (no lockstep check after the run" in err
    assert "16,384 simulated ranks (not folded), ~43,422,464 ops, ~22,558,208 flows" in err
    assert "or --force)" in err


def test_an_unfolded_job_beyond_the_scale_limits_is_refused(tmp_path, capsys):
    """`run.fold: false` on the 16,384-GPU job: its healthy step alone is ~51 million ops + flows and ~42 GiB,
    which `trainsim run` refuses for a single step, but the job ran it (and every state) without a word. It is
    refused before the healthy step with the one located line `trainsim run` of the step alone gives (its timeline
    off: a job writes none), at run.fold; `--force` is the way past."""
    err = refused_16k_job(tmp_path, capsys, "run.fold=false")
    assert ("--set run.fold=false: this run is too large to simulate: 16,384 GPUs, 16,384 simulated ranks (not "
            "folded), ~43,422,464 ops, ~22,558,208 flows, ~40.3 GiB of memory" in err)
    assert "(allowed: fold the ranks (run.fold: true); fewer micro-batches" in err
    assert err.endswith("or pass --force)")


def test_straggler_states_that_keep_every_mirror_are_sized_so(tmp_path, capsys, monkeypatch):
    """The docs' throttling class on the 16,384-GPU job: a straggler state slows one replica's stage, whose
    data-parallel traffic shares links with the other replicas', so each state refolds by the slow GPU's classes
    (64 ranks) with every mirror kept, and is sized with every copy of its collectives (~1.5 million ops + flows;
    the share of the unfolded step would count ~0.26 million). It passes the limits a plain run has (as an unfolded
    step each would count ~66 million); with them lowered to a million ops + flows, above the
    healthy fold's ~0.21 million, it is refused in one located line naming that fold and the analytic model first
    among the ways past."""
    monkeypatch.setattr(scale, "MAX_EVENTS", 1_000_000)
    err = refused_16k_job(tmp_path, capsys, "faults.components={throttling: {unit: gpu, effect: straggle, "
                                            "slowdown: 1.3, mtbf: 5000 h, repair: 1 d}}")
    assert "faults.components.throttling: a throttling failure slows one GPU of a pipeline stage" in err
    assert ("refolded by the slow GPU's classes (16 stages x 4, every mirror kept: the slow replica's traffic "
            "shares links with the other replicas'): 16,384 GPUs, 64 simulated ranks (folded), ~169,620 ops, "
            "~1,327,744 flows") in err
    assert err.endswith("(allowed: network.model: analytic (each collective alone: the slow replica meets no "
                        "other's traffic, so its states keep no mirror), a smaller cluster, or --force)")


def test_more_spares_than_hosts_is_a_pool_that_never_runs_dry():
    """A spare pool larger than the job is allowed: the pool is a count, and a large one is how a study says
    "never runs dry": four one-GPU hosts failing every 20 h with 12 h repairs (2.4 out at a time on average)
    wait for hosts with 1 spare, never with 16."""
    text = ONE_GPU_HOSTS + """
run: {horizon: 30 d, replications: 4, seed: 1}
faults:
  components:
    gpu: {mtbf: 20 h, repair: 12 h}
"""
    waits = [job_simulation.simulate_job(scenario_from_text(text, "pool.yaml", [f"restart.spares={spares}"])).summary[
        "restart_waiting_for_hosts_s"]["mean"] for spares in (1, 16)]
    assert waits[0] > 0
    assert waits[1] == 0.0


def test_a_spare_pool_beyond_ten_per_host_is_refused_before_it_is_built(tmp_path, capsys):
    """`spares: 100000000` (a slip of the keys) was taken: on GB200 racks every spare is built as rack and tray
    units drawing failures, so the run built millions of them instead of answering."""
    scenario = tmp_path / "pool.yaml"
    scenario.write_text(ONE_GPU_HOSTS + "run: {horizon: 1 d}\nfaults: {components: {gpu: {mtbf: 20 h}}}\n")
    assert main(["validate", str(scenario), "--set", "restart.spares=100000000", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--set restart.spares=100000000: 100,000,000 spare hosts for a job on 4 hosts" in err
    assert err.endswith("(allowed: 0 to 40 (10 per host: a pool that large never runs dry))\n"), err
    assert main(["validate", str(scenario), "--set", "restart.spares=40", "--quiet"]) == 0


@pytest.mark.parametrize("setting", ["faults.rate_multiplier=2", "faults.preset=llama3", "restart.elastic=true",
                                     "storage.capacity=1 PB", "checkpoint.interval=10 min", "run.replications=5"])
def test_a_single_step_warns_of_what_only_a_job_reads(setting, tmp_path, capsys):
    """A single step (no run.horizon) runs, but says which of its fields it ignored."""
    warning = f"--set {setting}: only a job over weeks reads it (run.horizon); this single step ignores it"
    out = tmp_path / "out"
    assert main(["run", "llama3-8b-dgx-h100-dp8", "--out", str(out), "--set", setting, "--quiet"]) == 0
    assert capsys.readouterr().err.splitlines() == [f"warning: command line: trainsim run: {warning}"]
    assert json.loads((out / "summary.json").read_text())["warnings"] == [warning]
    assert main(["validate", "llama3-8b-dgx-h100-dp8", "--set", setting, "--quiet"]) == 0
    assert capsys.readouterr().err.splitlines() == [f"warning: command line: trainsim validate: {warning}"]


def test_the_warnings_of_what_only_a_job_reads_come_in_file_order(tmp_path):
    """checkpoint (l.5), faults (l.6), restart (l.7): they came out 5, 7, 6, the sections' order in the code."""
    scenario = tmp_path / "nohz.yaml"
    scenario.write_text("cluster: {topology: dgx-h100}\nmodel: {preset: llama3-8b}\n"
                        "training: {seq_len: 4096, global_batch: 32, micro_batch: 1}\nparallelism: {dp: 8}\n"
                        "checkpoint: {interval: 10 min}\nfaults: {preset: llama3}\nrestart: {spares: 3}\n")
    warnings = load_scenario(scenario).ignored_without_a_horizon()
    assert [warning.split(": ")[0] for warning in warnings] == [f"{scenario}:{line}" for line in (5, 6, 7)]


def test_a_collective_list_warns_of_a_checkpoint_at_its_line(tmp_path, capsys):
    scenario = tmp_path / "list.yaml"
    scenario.write_text("cluster: {topology: dgx-h100}\nworkload:\n  - {op: all_reduce, bytes: 1 MiB}\n"
                        "checkpoint:\n  interval: 10 min\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {scenario}:5: checkpoint.interval: only a job over weeks reads it (run.horizon); this single "
        "step ignores it"]


@pytest.mark.parametrize("field", ["write", "host_write"])
def test_a_write_past_the_horizon_names_the_storage_not_the_interval(tmp_path, capsys, field):
    """A store so slow that one checkpoint write outlasts the horizon: no interval lets a checkpoint finish, so the one
    warning is at the bandwidth that sets the write (the store's, or the hosts' where their sum is lower), with the
    horizon as '2 d' and the rate or size that would do, not advice of a shorter checkpoint.interval, a horizon of
    '172,800.0 s' or the sync Young/Daly warning's "Daly's applies"."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("  interval: 30 min\n", "  interval: 30 min\n  mode: sync\n"))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--quiet", "--set", f"storage.{field}=1 B/s"]) == 0
    job = json.loads((out / "job_summary.json").read_text())
    size, write = job["checkpoint"]["size_bytes"], job["checkpoint"]["write_s"]
    rate = 1.0 if field == "write" else 2.0
    assert write == pytest.approx(size / rate, rel=1e-12)
    warning = (f"--set storage.{field}=1 B/s: one checkpoint write takes {format_duration(write)} "
               f"({format_decimal_size(size)} at {format_bandwidth(rate)}), longer than run.horizon (2 d): no "
               "checkpoint.interval lets a checkpoint finish, so the job writes none, and each failure loses the "
               "work since its start or the last maintenance stop (allowed: a write rate above "
               f"{format_bandwidth(size / 172800)}, or a checkpoint.size under {format_decimal_size(rate * 172800)})")
    err = capsys.readouterr().err
    assert "GiB" not in err and " GB" in err  # sizes in decimal, as the rate and the checkpoint's size are
    assert err == f"warning: command line: trainsim run: {warning}\n"


def test_a_write_past_the_horizon_bound_by_the_hosts_nics_names_the_nic_fields(tmp_path, capsys):
    """trace-job's 8 hosts of one 12.5 GB/s NIC write below the store's 25 GB/s a host: 1 PB takes 1 PB / (8 x 12.5
    GB/s) = 10,000 s = 2.778 h, past a 1 h horizon. The warning says the NICs bound the write and points at their
    fields, not at `storage.host_write` alone: 1 PB / 1 h = 277.8 GB/s, 34.72 GB/s a host, which also needs a
    host_write above its 25 GB/s; or a size under 100 GB/s x 1 h = 360 TB."""
    out = tmp_path / "out"
    assert main(["run", "scenarios/trace-job.yaml", "--out", str(out), "--quiet", "--set", "checkpoint.size=1PB",
                 "--set", "run.horizon=1h", "--set", "run.replications=1"]) == 0
    assert json.loads((out / "job_summary.json").read_text())["checkpoint"]["write_s"] == pytest.approx(1e4,
                                                                                                       rel=1e-12)
    warning = ("scenarios/trace-job.yaml:7: cluster.nic_bandwidth: one checkpoint write takes 2.778 h (1 PB at 100 "
               "GB/s: the hosts' NICs bound it, 8 x 12.5 GB/s, below storage.host_write's 25 GB/s a host), longer "
               "than run.horizon (1 h): no checkpoint.interval lets a checkpoint finish, so the job writes none, and "
               "each failure loses the work since its start or the last maintenance stop (allowed: a write rate "
               "above 277.8 GB/s, 34.72 GB/s a host (more cluster.nic_bandwidth x cluster.nics_per_node and a "
               "higher storage.host_write), or a checkpoint.size under 360 TB)")
    assert f"warning: {warning}\n" in capsys.readouterr().err


def test_a_whole_number_past_its_bound_reads_with_thousands_separators(capsys):
    """`run.replications=10001` is refused as `10,001 is above 10,000`, with thousands separators as every other
    figure."""
    assert main(["validate", "scenarios/trace-job.yaml", "--set", "run.replications=10001"]) == 2
    assert capsys.readouterr().err.endswith(": 10,001 is above 10,000 (allowed: a value <= 10,000)\n")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_event_limit_counts_checkpoints_by_their_whole_cycle(tmp_path, capsys, mode):
    """A checkpoint every step whose write (2.25 s) outlasts the step (0.26 s) comes once per cycle, the write
    included (sync: k t + W; async: k t + W sigma / (1 + sigma) + S, or W + S where the write outlasts the
    k steps slowed by sigma): the refusal's count of checkpoints per replication is within 1% of the rows one
    replication writes (horizon / (k t) counted 9 times too many, and refused jobs that fit)."""
    import pandas as pd

    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("horizon: 2 d", "horizon: 2 h"))
    every_step = ["--set", f"checkpoint.mode={mode}", "--set", "checkpoint.interval=1 steps"]
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--quiet", *every_step]) == 0
    written = (pd.read_parquet(out / "job_events.parquet")["kind"].astype(str) == "checkpoint").sum()
    assert main(["run", str(scenario), "--out", str(tmp_path / "refused"), "--quiet", *every_step,
                 "--set", "run.replications=10000"]) == 2
    counted = re.search(r", ([\d,]+) checkpoints;", capsys.readouterr().err)
    assert counted, "no count of checkpoints in the refusal"
    assert int(counted.group(1).replace(",", "")) / 10000 == pytest.approx(written, rel=0.01)


def test_a_class_without_a_shape_keeps_its_scenario_digest():
    """A components class that sets no shape digests as one with `shape: 1`, the exponential's own: with a
    default of None every `faults.components` scenario changed its digest, and resumed `--point-outputs`
    sweeps reran their points; a `weibull` without a shape is still refused (BAD above)."""
    from simulator.report.writers import scenario_digest

    assert "      repair: 4 h" in SPARE_JOB
    shaped = SPARE_JOB.replace("      repair: 4 h", "      repair: 4 h\n      shape: 1")
    assert scenario_digest(scenario_from_text(SPARE_JOB, "job.yaml")) == scenario_digest(
        scenario_from_text(shaped, "job.yaml"))


def test_the_event_limit_counts_in_memory_snapshots_per_storage_cycle(tmp_path, capsys):
    """In-memory snapshots every 2 steps between storage checkpoints every 4: each storage checkpoint restarts
    their count, so one comes a cycle, not two; the refusal's count per replication is within 1% of the rows
    one replication writes (horizon / (k_m t) counted twice as many)."""
    import pandas as pd

    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB.replace("horizon: 2 d", "horizon: 2 h").replace(
        "  interval: 30 min", "  interval: 4 steps\n  memory: {interval: 2 steps, replicas: 1, bandwidth: 1 TB/s}"))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    rows = pd.read_parquet(out / "job_events.parquet")
    written = ((rows["kind"].astype(str) == "checkpoint") & (rows["tier"].astype(str) == "memory")).sum()
    assert main(["run", str(scenario), "--out", str(tmp_path / "refused"), "--quiet",
                 "--set", "run.replications=10000"]) == 2
    counted = re.search(r", ([\d,]+) in-memory snapshots", capsys.readouterr().err)
    assert counted, "no count of in-memory snapshots in the refusal"
    assert int(counted.group(1).replace(",", "")) / 10000 == pytest.approx(written, rel=0.01)


def test_a_preset_applied_to_another_system_is_warned_of(tmp_path, capsys):
    """The llama3 table was seen on DGX H100 hosts of 8 H100s: on such a cluster no word; on hosts of other GPUs
    (or another count a host) one warning at faults.preset naming the system it was measured on and how its rates
    apply (per GPU, per host, per NIC, per cable), the rates unchanged."""
    scenario = tmp_path / "job.yaml"
    own = SPARE_JOB.replace("  components:", "  preset: llama3\n  components:")
    scenario.write_text(own)
    assert main(["validate", str(scenario)]) == 0
    assert "faults.preset" not in capsys.readouterr().err
    scenario.write_text(own.replace("  nodes: 2\n", "  nodes: 2\n  node: {gpu_model: a100-80gb}\n"))
    assert main(["validate", str(scenario)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "faults.preset" in line]
    assert warnings == [
        f"warning: {scenario}:15: faults.preset: the llama3 preset's rates were measured on hosts of 8 h100-sxm "
        "GPUs, and this cluster's hosts hold 8 a100-80gb GPUs: they apply unchanged, at that system's rate per unit: "
        "per GPU (9 causes: faulty GPU, GPU HBM3 memory, ...), per host (7 causes: host maintenance, SSD, ...), per "
        "NIC (1 cause: NIC) and per cable (1 cause: network switch/cable) (allowed: faults.components rates measured "
        "on this system, to replace the preset's)"]
