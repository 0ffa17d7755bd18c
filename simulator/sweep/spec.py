"""Sweep files: a base scenario plus axes (`grid:`, `zip:`, `random:`) over scenario field paths and
constraints, expanded into the sweep's points. Every point's scenario is validated here, before anything runs, so
a bad axis value is one located error and not 200 failed points. `trainsim sweep --set` overrides the base
scenario before the axes, and is refused on a field an axis sets.

```yaml
base: ../scenarios/schedule-gpipe-p4-m8.yaml      # a path (relative to this file), a bundled name or an inline scenario
grid:                                            # every combination, the last axis moving fastest
  parallelism.pipeline.schedule: [gpipe, 1f1b]
  training.microbatches: [4, 8, 16]
zip:                                             # axes that move together (equal lengths)
  parallelism.ddp.bucket: [1 MiB, 25 MiB]
  parallelism.ddp.overlap: [false, true]
random:                                          # `samples` draws, seeded
  seed: 7
  samples: 10
  axes:
    model.synthetic.forward: {low: 0.5 ms, high: 2 ms}
    parallelism.zero: [0, 1, 2]
constraints: ["parallelism.pp * parallelism.tp <= 8"]
outputs: false                                   # true: each point's run outputs in points/NNNNN/
```
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import orjson
from pydantic import Field, ValidationError

from simulator.config.bundled import bundled_file
from simulator.config.field_paths import path_problem
from simulator.config.loader import (
    LoadedScenario,
    Override,
    apply_overrides,
    validate_as_json,
    validated_scenario,
    validation_error,
)
from simulator.config.model_options import SYNTHETIC_NO_OPS
from simulator.config.parameter_server import PARAMETER_SERVER_NO_OPS
from simulator.config.schema import Scenario
from simulator.config.sections import Section
from simulator.config.yaml_source import (
    FIELD_PATH_EXAMPLE,
    FieldPath,
    dotted,
    is_field_path,
    line_of,
    parse_field,
    parse_yaml_text,
    read_yaml,
    set_text,
)
from simulator.errors import InputError, ScenarioError, TopologyError
from simulator.reliability.inputs import FILE_FIELDS, contents_key
from simulator.report.writers import scenario_digest
from simulator.scale import scenario_gpus, scenario_hosts
from simulator.sweep.constraints import EVALUABLE, Constraint, parse_constraint, with_derived
from simulator.sweep.fields import with_values
from simulator.sweep.options import DEFAULT_MAX_POINTS
from simulator.topology.loader import (
    TopologySource,
    checked_parameters,
    leftover_fix,
    read_topology,
    scenario_field_of,
    scenario_overridden,
    scenario_topology,
)
from simulator.units import QuantityKind, counted, parse_quantity, shown_value

Axis = Annotated[list, Field(min_length=1)]
_BASE_UNITS: dict[QuantityKind, str] = {"size": "B", "duration": "s", "bandwidth": "B/s"}


class RandomRange(Section):
    """A continuous axis: uniform (or log-uniform) between `low` and `high`, numbers or quantities with units;
    `integer` rounds each draw."""

    low: float | str
    high: float | str
    log: bool = False
    integer: bool = False


class RandomAxes(Section):
    """`samples` points drawn with a generator seeded by `seed`; each axis is a list of choices or a range."""

    seed: int = Field(default=0, ge=0)
    samples: int = Field(ge=1)
    axes: dict[str, Axis | RandomRange] = Field(min_length=1)


BASE_ALLOWED = ("a scenario path relative to the sweep file, a bundled scenario's name (trainsim scenarios), or an "
                "inline scenario")
"""What a sweep's `base` takes: said when it is missing and when it names no scenario."""


class SweepFile(Section):
    """A sweep file as written."""

    base: str | dict = Field(description=BASE_ALLOWED)
    grid: dict[str, Axis] = {}
    zip: dict[str, Axis] = {}
    random: RandomAxes | None = None
    constraints: list[str] = []
    outputs: bool = False
    description: str = ""


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its index, its axis values (by field path, as written), the validated scenario
    data, a key that changes whenever the scenario does (what resuming matches on), the validated scenario's
    digest (what a reused point's run folder must name), for a point a constraint
    rules out, why, and the `--set` values and its axis values as overrides of the base, so that an error in a
    field one of them set is located at it."""

    index: int
    values: tuple[tuple[str, object], ...]
    data: dict
    key: str
    digest: str
    skipped: str = ""
    overrides: tuple[Override, ...] = ()


@dataclass(frozen=True)
class Sweep:
    """An expanded sweep: where it came from, the base scenario's source and line table, the axis names in
    column order, and the points."""

    source: str
    base_source: str
    base_lines: dict
    axes: tuple[str, ...]
    points: tuple[Point, ...]
    outputs: bool
    warnings: tuple[str, ...] = ()
    """One per axis that no point can be changed by (`no_op_axis_warnings`), located at the axis."""
    shared_steps: int = 0
    """How many job points (`run.horizon`) have the same step sections as another point (`_step_sections`): their
    cluster states' steps are the same, which one process simulates once and each pool worker again."""
    inline_base: dict | None = None
    """The base scenario written inline in the sweep file, its `--set`s applied (the manifest's replay of them
    changes nothing), its files' paths absolute (`absolute_files`): what a point folder's `scenario.yaml` holds.
    None where the base is a file."""


def load_sweep(path: str | Path, max_points: int = DEFAULT_MAX_POINTS, overrides: list[str] | None = None) -> Sweep:
    """Read a sweep file and expand it, its base scenario overridden first by ``overrides`` (`--set a.b=value`);
    any mistake is one located ScenarioError."""
    data, lines = read_yaml(path, ScenarioError)
    return sweep_from_data(data, lines, str(path), Path(path).parent, max_points, overrides)


def sweep_from_text(text: str, source: str = "<sweep>", folder: Path = Path("."),
                    max_points: int = DEFAULT_MAX_POINTS, overrides: list[str] | None = None) -> Sweep:
    """Like `load_sweep` for YAML text already in memory; a relative base scenario is read from ``folder``."""
    data, lines = parse_yaml_text(text, source, ScenarioError)
    return sweep_from_data(data, lines, source, folder, max_points, overrides)


def sweep_from_data(data: object, lines: dict, source: str, folder: Path, max_points: int,
                    overrides: list[str] | None = None) -> Sweep:
    """Parsed sweep YAML ``data`` validated and expanded into its points (at most ``max_points``), each a
    validated scenario: the base scenario with the ``overrides`` (`--set`, as `trainsim run` takes them) written
    in, then the point's axis values. A `--set` on a field an axis sets (or on a section above one, or a field
    below one) is refused: the axis would write over it at every point, and the `--set` would be dropped without
    a word. Any mistake is one ScenarioError located in ``source``, or at the `--set` that wrote the value."""
    if not isinstance(data, dict):
        raise ScenarioError("a sweep file must be a mapping", allowed=", ".join(SweepFile.model_fields), file=source,
                            line=1)
    try:
        spec = validate_as_json(SweepFile, data)
    except ValidationError as exc:
        raise validation_error(exc, SweepFile, source, lines) from None
    locate = _locator(source, lines)
    base_data, base_source, base_lines = _base(spec, folder, source, lines)
    inline = isinstance(spec.base, dict)
    base_data, set_by_hand = apply_overrides(base_data, overrides or [])
    axes = _axis_paths(spec, locate)
    _refuse_sets_on_axes(set_by_hand, axes, source, lines)
    _check_axes_in_base(axes, base_data, locate)
    count = _count(spec)
    if not axes:
        raise locate(("grid",), "the sweep has no axis", "grid:, zip: or random: with at least one field path")
    if count > max_points:
        block = ("grid",) if spec.grid else ("zip",) if spec.zip else ("random", "samples")
        raise locate(block, f"{count:,} points is more than --max-points {max_points:,}",
                     "fewer axis values or samples, or a larger --max-points")
    constraints = []
    for index, text in enumerate(spec.constraints):
        try:
            constraints.append(parse_constraint(text))
        except InputError as exc:
            raise locate(("constraints", index), exc.problem, exc.allowed) from None
    points = []
    job_steps: list[str] = []
    synthetic = parameter_servers = True
    clusters: set[bytes] = set()
    topology_files: dict[str, TopologySource] = {}
    digests: dict[Path, str] = {}
    cluster_gpus: dict[bytes, tuple[int | None, tuple[int, ...] | None]] = {}
    for index, values in enumerate(_combinations(spec, locate)):
        try:
            point_data = with_values(base_data, {parse_field(name): value for name, value in values})
        except ScenarioError as exc:
            failed = next(name for name, _ in values if dotted(parse_field(name)) == exc.field)
            raise locate(axes[failed], exc.problem, exc.allowed) from None
        if inline:
            point_data = absolute_files(point_data, folder)
        written = set_by_hand + tuple(Override(parse_field(name), source, line_of(lines, axes[name]),
                                               dotted(axes[name]), f"value {_shown(value)}: ",
                                               replay=set_text(name, _replayed(point_data, name, value)))
                                      for name, value in values)
        scenario = validated_scenario(point_data, base_source, base_lines, written)
        synthetic = synthetic and scenario.model is not None and scenario.model.synthetic is not None
        parameter_servers = parameter_servers and scenario.uses_parameter_servers
        cluster = orjson.dumps(point_data.get("cluster"), option=orjson.OPT_SORT_KEYS)
        if constraints and cluster not in cluster_gpus:
            cluster_gpus[cluster] = _cluster_size(LoadedScenario(scenario, base_source, base_lines, written))
        gpus, host_gpus = cluster_gpus.get(cluster, (None, None))
        try:
            skipped = _violated(constraints, scenario, gpus, host_gpus, index, locate)
        except ScenarioError:
            if gpus is None:  # an invalid cluster gives no GPUs: its own error comes first
                _check_cluster(scenario, base_source, base_lines, written, topology_files)
            raise
        if not skipped and cluster not in clusters:
            clusters.add(cluster)
            _check_cluster(scenario, base_source, base_lines, written, topology_files)
        digest = scenario_digest(LoadedScenario(scenario, "", {}))
        files = contents_key(LoadedScenario(scenario, base_source, base_lines, written), digests)
        points.append(Point(index, values, point_data, point_key(point_data, files), digest, skipped, written))
        if not skipped and scenario.run.horizon is not None:
            job_steps.append(_step_sections(scenario))
    warnings = (no_op_axis_warnings(axes, locate, SYNTHETIC_NO_OPS, "every point's model is synthetic")
                if synthetic else ())
    warnings += (no_op_axis_warnings(axes, locate, PARAMETER_SERVER_NO_OPS, "every point runs parameter servers")
                 if parameter_servers else ())
    shared = sum(count for count in Counter(job_steps).values() if count > 1)
    return Sweep(source, base_source, base_lines, tuple(axes), tuple(points), spec.outputs, warnings, shared,
                 base_data if inline else None)


def _replayed(point_data: dict, name: str, value: object) -> object:
    """An axis's value as its point's `--set` replays it: a file field's as the point's data holds it (an inline
    base's made absolute by `absolute_files`)."""
    path = parse_field(name)
    if not any(field.path == path for field in FILE_FIELDS):
        return value
    node: object = point_data
    for part in path:
        node = node[part] if isinstance(node, dict) else None
    return node


def _step_sections(scenario: Scenario) -> str:
    """A job scenario's step sections (all but the job's: states.JOB_SECTIONS): the job points whose sections are
    the same have the same cluster states' steps (their cache key, `states.step_key`, is those sections, the files
    they read and the base's file, one for every point)."""
    from simulator.reliability.states import JOB_SECTIONS

    return scenario.model_dump_json(exclude=JOB_SECTIONS)


def no_op_axis_warnings(axes: dict[str, FieldPath], locate, no_ops: dict[tuple[str, str], str],
                        every_point: str) -> tuple[str, ...]:
    """A warning for each axis over a field of ``no_ops`` (SYNTHETIC_NO_OPS, PARAMETER_SERVER_NO_OPS), where
    ``every_point`` is what each point is that makes it one: its values only multiply the points, each the same
    run."""
    warnings = []
    for name, where in axes.items():
        path = parse_field(name)
        why = next((why for prefix, why in no_ops.items() if tuple(path[:len(prefix)]) == prefix), None)
        if why is not None:
            warnings.append(str(locate(where, f"{why}: {every_point}, so no point changes with this axis")))
    return tuple(warnings)


def _shown(value: object) -> str:
    """An axis value in an error about its point: short (`shown_value`), a text quoted."""
    return repr(shown_value(value)) if isinstance(value, str) else shown_value(value)


def _locator(source: str, lines: dict):
    def locate(path: FieldPath, problem: str, allowed: str = "") -> ScenarioError:
        return ScenarioError(problem, field=dotted(path), allowed=allowed, file=source, line=line_of(lines, path))
    return locate


def _base(spec: SweepFile, folder: Path, source: str, lines: dict) -> tuple[dict, str, dict]:
    """The base scenario's data, source name and line table."""
    if isinstance(spec.base, dict):
        base_lines = {path[1:]: line for path, line in lines.items() if path[:1] == ("base",)}
        return absolute_files(spec.base, folder), source, base_lines
    path = folder / spec.base
    if not path.is_file():
        path = bundled_file(spec.base) or path
    if not path.is_file():
        raise ScenarioError(f"no scenario file {folder / spec.base}", field="base", allowed=BASE_ALLOWED, file=source,
                            line=line_of(lines, ("base",)))
    data, base_lines = read_yaml(path, ScenarioError)
    if not isinstance(data, dict):
        raise ScenarioError("a scenario must be a mapping of sections", file=str(path), line=1)
    return data, str(path), base_lines


def absolute_files(data: dict, folder: Path) -> dict:
    """``data`` with each relative file path of `FILE_FIELDS` made absolute from ``folder`` (a topology's bundled
    name kept): an inline base's files, read from the sweep file's folder, then read alike from the
    `scenario.yaml` a point folder holds (`trainsim run` of it reproduces the point)."""
    written: dict[FieldPath, object] = {}
    for field in FILE_FIELDS:
        node: object = data
        for part in field.path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) and not Path(node).is_absolute() and field.names_a_file(node):
            written[field.path] = str((folder / node).resolve())
    return with_values(data, written) if written else data


def _axis_paths(spec: SweepFile, locate) -> dict[str, FieldPath]:
    """Every axis name with the sweep-file path of its entry, checked to be a field path; a name given in two
    blocks is an error."""
    blocks: list[tuple[str, dict]] = [("grid", spec.grid), ("zip", spec.zip)]
    if spec.random is not None:
        blocks.append(("random", spec.random.axes))
    names: dict[str, FieldPath] = {}
    for block, axes in blocks:
        prefix = ("random", "axes") if block == "random" else (block,)
        for name in axes:
            if not is_field_path(name):
                raise locate(prefix + (name,), "not a field path", FIELD_PATH_EXAMPLE)
            if name in names:
                raise locate(prefix + (name,), "axis given twice")
            names[name] = prefix + (name,)
    if len({len(values) for values in spec.zip.values()}) > 1:
        raise locate(("zip",), f"axes of different lengths: {_lengths_text(spec.zip)}", "lists of equal length")
    return names


def _lengths_text(zipped: dict[str, list]) -> str:
    """Each zip axis with its count of values, in file order: 'parallelism.ddp.overlap has 3 values,
    parallelism.ddp.bucket 1', which says which axis is short."""
    (first, values), *rest = zipped.items()
    return ", ".join([f"{first} has {counted(len(values), 'value')}", *(f"{name} {len(more)}" for name, more in rest)])


def _refuse_sets_on_axes(set_by_hand: tuple[Override, ...], axes: dict[str, FieldPath], source: str,
                         lines: dict) -> None:
    """A `--set` whose field an axis also writes (the same field, a section holding the axis's, or a field
    under the axis's) refused at the `--set`, naming the axis and its line."""
    for override in set_by_hand:
        for name, entry in axes.items():
            if override.overlaps(parse_field(name)):
                raise override.error(f"the sweep's axis {dotted(entry)} ({source}:{line_of(lines, entry)}) sets "
                                     f"{name} at every point", dotted(override.path),
                                     "a field no axis writes: vary it in the sweep file, or leave out the --set")


def _check_axes_in_base(axes: dict[str, FieldPath], base_data: dict, locate) -> None:
    """Each axis's path checked against the scenario schema and the base scenario (an index its list lacks),
    after the `--set`s on axes are refused, so that one taking an axis's field away is blamed on the `--set`."""
    for name, entry in axes.items():
        problem = path_problem(parse_field(name), base_data)
        if problem is not None:
            raise locate(entry, problem.problem, problem.allowed)


def _count(spec: SweepFile) -> int:
    grid = math.prod(len(values) for values in spec.grid.values())
    rows = len(next(iter(spec.zip.values()))) if spec.zip else 1
    samples = spec.random.samples if spec.random is not None else 1
    return grid * rows * samples


def _combinations(spec: SweepFile, locate) -> list[tuple[tuple[str, object], ...]]:
    """Grid x zip rows x random samples, in that nesting order (random samples innermost)."""
    grid = [tuple(zip(spec.grid, combo)) for combo in itertools.product(*spec.grid.values())]
    rows = [tuple(zip(spec.zip, row)) for row in zip(*spec.zip.values())] if spec.zip else [()]
    samples = _random_samples(spec.random, locate) if spec.random is not None else [()]
    return [g + r + s for g in grid for r in rows for s in samples]


def _random_samples(random: RandomAxes, locate) -> list[tuple[tuple[str, object], ...]]:
    """The random block's draws: one generator seeded by `seed`, axes drawn in file order per sample."""
    rng = np.random.default_rng(random.seed)
    samples = []
    for _ in range(random.samples):
        sample = []
        for name, axis in random.axes.items():
            if isinstance(axis, list):
                sample.append((name, axis[int(rng.integers(len(axis)))]))
            else:
                sample.append((name, _draw(rng, axis, locate(("random", "axes", name), ""))))
        samples.append(tuple(sample))
    return samples


def _draw(rng: np.random.Generator, axis: RandomRange, where: ScenarioError) -> object:
    """One draw of a range, returned as written: a number, or a quantity string in the SI base unit."""
    kind, low = _quantity(axis.low, where)
    high_kind, high = _quantity(axis.high, where)
    if kind != high_kind or not low <= high or (axis.log and low <= 0):
        raise ScenarioError("a range needs low <= high of one kind (and low > 0 with log)", field=where.field,
                            allowed="{low: 1 MiB, high: 1 GiB, log: true}", file=where.file, line=where.line)
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if axis.log else rng.uniform(low, high)
    if axis.integer:
        value = float(round(value))
    if kind:
        return f"{value:.12g} {_BASE_UNITS[kind]}"
    return int(value) if axis.integer else float(value)


def _quantity(value: float | str, where: ScenarioError) -> tuple[QuantityKind | None, float]:
    """(None, number) for a plain number, (kind, SI value) for a quantity with a unit."""
    if not isinstance(value, str):
        return None, float(value)
    for kind in _BASE_UNITS:
        try:
            return kind, parse_quantity(value, kind)
        except InputError:
            continue
    raise ScenarioError(f"cannot read {value!r} as a number or a quantity", field=where.field,
                        allowed="a number, a size, a duration or a bandwidth", file=where.file, line=where.line)


def _check_cluster(scenario: Scenario, base_source: str, base_lines: dict, written: tuple[Override, ...],
                   files: dict[str, TopologySource]) -> None:
    """The point's topology parameters (`cluster.*`, open in the schema) read as the builder will read them, so
    that an unknown name or a bad unit on an axis is refused with the sweep instead of by every point. ``files``:
    the topology files read so far, by name."""
    cluster = scenario.cluster
    loaded = LoadedScenario(scenario, base_source, base_lines, written)
    try:
        if cluster.topology not in files:
            files[cluster.topology] = read_topology(cluster.topology, None, Path(base_source).parent)
        checked_parameters(scenario_overridden(loaded, files[cluster.topology]))
    except TopologyError as exc:
        field = scenario_field_of(exc, cluster.overrides())
        if field is None:
            raise
        kind = files[cluster.topology].kind if cluster.topology in files else ""
        raise loaded.error(field, exc.problem, leftover_fix(loaded, field, kind) + exc.allowed) from None


def _cluster_size(loaded: LoadedScenario) -> tuple[int | None, tuple[int, ...] | None]:
    """The GPUs of the scenario's cluster and those of each of its hosts (None: not known), from the topology's
    parameters; under parameter servers, where they do not tell the hosts (a graph, one host), from the cluster
    built (cheap for those; None where it is refused, its error reported with the point's)."""
    gpus, shape = scenario_gpus(loaded), scenario_hosts(loaded)
    if gpus is not None and shape is not None:
        return gpus, (shape.gpus,) * (gpus // shape.gpus)
    if not loaded.scenario.uses_parameter_servers:
        return gpus, None
    try:
        topology = scenario_topology(loaded)
    except InputError:
        return gpus, None
    return topology.num_gpus, tuple(len(topology.host_gpus(host)) for host in range(topology.num_hosts))


def _violated(constraints: list[Constraint], scenario: Scenario, gpus: int | None, host_gpus: tuple[int, ...] | None,
              index: int, locate) -> str:
    """The first constraint the point breaks ('' when none), as the reason it is skipped; each sees the fields
    the run derives from the cluster's ``gpus`` and ``host_gpus`` (`with_derived`: `parallelism.dp` left out), as
    `run` prints them. At a point the run refuses before deriving them, one that needs them lets the point run,
    to be `invalid` with the run's error."""
    if not constraints:
        return ""
    try:
        scenario = with_derived(scenario, gpus, host_gpus)
        refused = False
    except ScenarioError:  # the run refuses the point before deriving (a pp its model's stages refuse)
        refused = True
    for number, constraint in enumerate(constraints):
        try:
            if not constraint.holds(scenario):
                return f"constraint: {constraint.text}"
        except (TypeError, ValueError, ZeroDivisionError, ScenarioError) as exc:
            if refused and isinstance(exc, ScenarioError):  # a derived field: the run's own error comes first
                return ""
            problem = exc.problem if isinstance(exc, ScenarioError) else exc
            allowed = (exc.allowed if isinstance(exc, ScenarioError) else "") or EVALUABLE
            raise locate(("constraints", number), f"cannot evaluate at point {index}: {problem}", allowed) from None
    return ""


def point_key(data: dict, files: str = "") -> str:
    """A digest of the point's whole scenario and of the ``files`` it reads by path (`inputs.contents_key`: a
    topology file, a schedule table, traces): a resumed sweep reuses a result only for the same scenario on the
    same files."""
    content = orjson.dumps(data, option=orjson.OPT_SORT_KEYS, default=str) + b"\n" + files.encode()
    return hashlib.sha256(content).hexdigest()[:20]
