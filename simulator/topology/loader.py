"""Topology files: find a bundled one by name or read a path, apply overrides, build, and locate errors as FILE:LINE."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard, TypeVar

import simulator
from simulator.config.yaml_source import FieldPath, line_of, parse_field, read_yaml
from simulator.errors import InputError, TopologyError, yaml_spelling
from simulator.topology.builders import BUILDERS, build_topology, graph_nics_without_a_gpu
from simulator.topology.graph import Topology
from simulator.topology.parameters import read_parameters

if TYPE_CHECKING:
    from simulator.config.loader import LoadedScenario

SOURCE_TREE_DIR = Path(simulator.__file__).resolve().parents[1] / "topologies"
INSTALLED_DIR = Path(sys.prefix) / "share" / "trainsim" / "topologies"
BUNDLED_DIR = SOURCE_TREE_DIR if SOURCE_TREE_DIR.is_dir() else INSTALLED_DIR
"""The repository's topologies/ in a source checkout or editable install; a wheel installs them under
<prefix>/share/trainsim/topologies (pyproject's data-files)."""
FILE_KEYS = ("kind", "name", "description")
T = TypeVar("T")
"""What an action on a topology file returns (a built topology, or whether its checks told everything)."""


def scenario_field_of(exc: TopologyError, overrides: Mapping[str, object]) -> FieldPath | None:
    """Where a topology error belongs in a scenario whose `cluster` section gives ``overrides``: the overriding
    field (``cluster.<parameter>...``) where they set the parameter (`set_by`), or ``cluster.topology`` for a file
    that cannot serve; None when it is the topology file's own mistake, already located in that file."""
    path = parse_field(exc.field)
    if set_by(overrides, path):
        return ("cluster", *path)
    return None if exc.file else ("cluster", "topology")


def set_by(overrides: Mapping[str, object], path: FieldPath) -> bool:
    """Whether ``overrides`` set the parameter at ``path``, or the whole one it is part of: a mapping without a
    `kind`, merged into the file's (`with_overrides`), sets only its own keys. The file's other keys of a merged
    node were blamed on the override (`node: {gpu_model: h200}` took the file's `nvlink_bandwidth: 450`'s missing
    unit as its own, at a field it never wrote). A path's parts are matched as text: an override's keys are, where
    a path reads `9` or `node[0]` as a number (`--set 9=1` was blamed on the bundled file)."""
    if not path or str(path[0]) not in overrides:
        return False
    value = overrides[str(path[0])]
    return len(path) == 1 or not _merging(value) or str(path[1]) in value


def list_bundled_topologies() -> list[str]:
    """Names of the topology files shipped in the repository's topologies/ folder, sorted."""
    return sorted(path.stem for path in BUNDLED_DIR.glob("*.yaml"))


def names_a_file(topology: str) -> bool:
    """Whether a `cluster.topology` text is a file's path (a folder in it, or a YAML suffix), not a bundled name."""
    return "/" in topology or "\\" in topology or topology.endswith((".yaml", ".yml"))


def resolve_topology_path(name_or_path: str, folder: Path | None = None) -> Path:
    """The file a topology name refers to: a bundled name such as 'dgx-h100', else a path, relative to
    ``folder`` (a scenario's, as its trace and schedule table are) when given, else to the working folder."""
    text = str(name_or_path)
    if not names_a_file(text):
        path = BUNDLED_DIR / f"{text}.yaml"
        if not path.is_file():
            _refuse_bundled_scenario(text)
            raise TopologyError(f"unknown topology {text!r}", field="topology",
                                allowed=", ".join(list_bundled_topologies()) + ", or a path to a YAML file")
        return path
    path = Path(text) if folder is None else folder / text
    if not path.is_file():
        relative_to = "the working folder" if folder is None else "the scenario"
        raise TopologyError(f"no topology file {path}", field="topology",
                            allowed=f"a bundled topology's name, or a YAML file's path relative to {relative_to}")
    return path


@dataclass(frozen=True)
class TopologySource:
    """A topology file read and checked, with overrides applied, before anything is built."""

    kind: str
    params: dict
    name: str
    source: str
    lines: dict
    overrides: Mapping[str, object]
    """The overrides applied (`set_by` says which parameters they set)."""
    description: str


def read_topology(name_or_path: str, overrides: dict | None = None, folder: Path | None = None) -> TopologySource:
    """Read the bundled or given YAML file (a path relative to ``folder`` when given) and apply ``overrides``
    (a scenario's ``cluster:`` block, or `trainsim topo`'s ``--set nodes=128`` read as YAML) to its top-level
    parameters; strings such as "128" are read later like file values."""
    path = resolve_topology_path(name_or_path, folder)
    data, lines = read_yaml(path, TopologyError)
    source = str(path)
    if not isinstance(data, dict):
        raise TopologyError("a topology file must be a mapping with a 'kind' key", file=source, line=1)
    kind = data.get("kind")
    if kind is None and isinstance(data.get("cluster"), dict):
        _refuse_scenario(data["cluster"], Path(source).parent, source)
    if not isinstance(kind, str) or kind not in BUILDERS:
        problem = "missing 'kind'" if kind is None else f"unknown topology kind {kind!r}"
        raise TopologyError(problem, field="kind", allowed=", ".join(BUILDERS), file=source,
                            line=line_of(lines, ("kind",)))
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise TopologyError(f"expected a string, got {yaml_spelling(data[key])}", field=key, file=source,
                                line=line_of(lines, (key,)))
    parameters = BUILDERS[kind].parameters
    for key in data:
        if key not in FILE_KEYS and key not in parameters:
            raise TopologyError(f"unknown key {key!r} for topology kind {kind!r}", field=str(key),
                                allowed=", ".join(FILE_KEYS + tuple(parameters)), file=source,
                                line=line_of(lines, (key,)))
    params = {key: value for key, value in data.items() if key not in FILE_KEYS}
    spec = TopologySource(kind, params, data.get("name") or path.stem, source, lines, {},
                          data.get("description", ""))
    return with_overrides(spec, overrides)


def _refuse_bundled_scenario(name: str) -> None:
    """A bundled scenario's name given where a topology's is expected, refused as `_refuse_scenario` refuses its
    file (it had been answered with the list of topologies, as an unknown name)."""
    from simulator.config.bundled import bundled_file

    scenario = bundled_file(name)
    if scenario is None:
        return
    data, _ = read_yaml(scenario, TopologyError)
    if isinstance(data, dict) and isinstance(data.get("cluster"), dict):
        _refuse_scenario(data["cluster"], scenario.parent, "")


def _refuse_scenario(cluster: dict, folder: Path, source: str) -> None:
    """A scenario (a `cluster:` section, no `kind`) given where a topology is expected, refused naming the
    topology its cluster names (a file's path as typed from the working folder: the scenario's folder joined
    to it), where it had said `kind: missing 'kind'` as of a topology file without one. ``source``: the file
    given, '' for a bundled scenario's name (the error is then the argument's)."""
    named = cluster.get("topology")
    line = 1 if source else None
    if not isinstance(named, str):
        raise TopologyError("a scenario, not a topology", allowed="a topology's name or file", file=source, line=line)
    if names_a_file(named) and not Path(named).is_absolute():
        named = str(folder / named)
    raise TopologyError(f"a scenario, not a topology: its cluster is the topology {named}",
                        allowed=f"a topology's name or file, such as the scenario's {named} (its other cluster "
                                "parameters as --set name=value)", file=source, line=line)


def with_overrides(spec: TopologySource, overrides: dict | None,
                   droppable: Collection[str] = ()) -> TopologySource:
    """``spec`` read from its file with ``overrides`` replacing top-level parameters (one file read serves
    many overrides: a sweep's points). A mapping without a `kind` (a cluster's `node: {gpu_model: h200}`) is
    merged into the file's: it replaced dgx-h100-cluster's whole node, whose NVSwitches lost `nvls` unsaid. A
    null for a parameter the kind lacks is no value, which it has already, where ``droppable`` names the key
    (`droppable_nulls`: `--set cluster.nodes=null` drops the scenario's `nodes` where `--set
    cluster.topology=gb200-nvl72` makes it a rack's); any other key the kind lacks is refused, null or not (a
    misspelt `nodez=null`). A null for a parameter the kind has is its value (`read_parameters`)."""
    parameters = BUILDERS[spec.kind].parameters
    params = dict(spec.params)
    given = dict(spec.overrides)
    for key, value in (overrides or {}).items():
        if key not in parameters and value is None and key in droppable:
            continue
        if key not in parameters:
            raise TopologyError(f"unknown override {key!r} for topology kind {spec.kind!r}", field=str(key),
                                allowed=", ".join(parameters), file=spec.source)
        params[key] = _merged(params.get(key), value)
        given[key] = _merged(given.get(key), value)
    return replace(spec, params=params, overrides=given)


def _merged(written: object, override: object) -> object:
    """``override`` over the file's ``written`` value: a mapping that names no `kind` merged into the file's
    mapping key by key; anything else, a whole node with its `kind` included, in its place."""
    if isinstance(written, dict) and _merging(override):
        return {**written, **override}
    return override


def _merging(override: object) -> TypeGuard[dict]:
    """Whether ``override`` is merged into the file's mapping (`_merged`): a mapping that names no `kind`."""
    return isinstance(override, dict) and "kind" not in override


def checked_parameters(spec: TopologySource) -> dict:
    """The top-level parameters of ``spec`` read as its builder reads them (names, units, ranges), without
    building: what a sweep checks of every point before any runs."""
    return read_parameters(BUILDERS[spec.kind].parameters, spec.params)


def load_topology(name_or_path: str, overrides: dict | None = None, folder: Path | None = None) -> Topology:
    """Build the topology in a bundled or given YAML file (relative to ``folder`` when given), with top-level
    parameters replaced by ``overrides``; errors point at the file's line, or at the override that set the
    value."""
    return build_source(read_topology(name_or_path, overrides, folder))


def build_source(spec: TopologySource) -> Topology:
    """Build a topology file already read (``read_topology``), with its errors located as `load_topology`'s and
    its warnings (`graph_nics_without_a_gpu`) on stderr, located alike, once per process."""
    topology = _located_in_file(spec, lambda: build_topology(spec.kind, spec.params, spec.name))
    topology.params["description"] = spec.description
    if spec.kind == "graph":
        for problem in graph_nics_without_a_gpu(spec.params):
            line = f"warning: {_located(spec, problem)}"
            if line not in _WARNED:
                _WARNED.add(line)
                sys.stderr.write(line + "\n")
    return topology


_WARNED: set[str] = set()
"""The topology warnings written so far: a file built again (a sweep's points, a study's states) warns once."""


def check_source(spec: TopologySource) -> bool:
    """Refuse a topology file already read as `build_source` would, errors located alike, without building:
    True where its builder's checks tell everything (`Builder.checked`), False where only building would."""
    return _located_in_file(spec, lambda: BUILDERS[spec.kind].checked(spec.params))


def _located_in_file(spec: TopologySource, action: Callable[[], T]) -> T:
    """``action`` on ``spec``, its topology error located at the file's line, or at the override that set it."""
    try:
        return action()
    except TopologyError as exc:
        raise _located(spec, exc) from None


def _located(spec: TopologySource, exc: TopologyError) -> InputError:
    """``exc`` located at the file's line of its field, or at the override that set it."""
    field_path = parse_field(exc.field)
    if set_by(spec.overrides, field_path):
        return exc.located(file=f"{spec.source} (override)")
    return exc.located(file=spec.source, line=line_of(spec.lines, field_path))


def scenario_topology(loaded: LoadedScenario) -> Topology:
    """The scenario's cluster (its file relative to the scenario's folder); errors in a value the scenario's
    `cluster` section overrides point at that field of the scenario."""
    return _scenario_source(loaded, build_source)


def scenario_topology_checked(loaded: LoadedScenario, file: TopologySource | None = None) -> bool:
    """`check_source` of the scenario's cluster: refused as `scenario_topology` would refuse it, without building
    it; False where only building it would tell. ``file``: its topology file already read, without overrides
    (an elastic job checks a cluster per size it may shrink to, all of one file)."""
    return _scenario_source(loaded, check_source, file)


def scenario_topology_file(loaded: LoadedScenario) -> TopologySource:
    """The scenario's topology file read, without its `cluster` overrides (relative to the scenario's folder)."""
    return read_topology(loaded.scenario.cluster.topology, folder=Path(loaded.source).parent)


def scenario_source_or_none(loaded: LoadedScenario) -> TopologySource | None:
    """The scenario's topology file read with its `cluster` overrides, before the cluster is built; None where
    either is refused (the build reports why, located)."""
    try:
        return scenario_overridden(loaded, scenario_topology_file(loaded))
    except InputError:
        return None


def _scenario_source(loaded: LoadedScenario, use: Callable[[TopologySource], T],
                     file: TopologySource | None = None) -> T:
    """``use`` of the scenario's topology file (``file`` where already read) with its `cluster` overrides,
    errors in a value they override located at that field of the scenario."""
    cluster = loaded.scenario.cluster
    read = file
    try:
        read = scenario_topology_file(loaded) if file is None else file
        return use(scenario_overridden(loaded, read))
    except TopologyError as exc:
        path = scenario_field_of(exc, cluster.overrides())
        if path is None:
            raise
        kind = read.kind if read is not None else ""
        located = loaded.error(path, exc.problem, leftover_fix(loaded, path, kind) + exc.allowed)
        raise located.rebuilt(TopologyError) from None


def scenario_overridden(loaded: LoadedScenario, file: TopologySource) -> TopologySource:
    """The scenario's topology ``file`` (read without overrides) with its `cluster` overrides, a null dropping
    what `droppable_nulls` names where the kind lacks it."""
    return with_overrides(file, loaded.scenario.cluster.overrides(), droppable_nulls(loaded))


def droppable_nulls(loaded: LoadedScenario) -> frozenset[str]:
    """The `cluster` keys whose null is dropped where the topology's kind lacks them (`with_overrides`): those the
    scenario's file gives (its DGX `nodes` after `--set cluster.topology=gb200-nvl72`) and another topology's
    parameters a sweep axis writes (a zip that sizes each topology by its own parameter, null at the other's
    points). A null for any other key is refused as the key would be: a misspelt name."""
    def droppable(key: str) -> bool:
        override = loaded.override_of(("cluster", key))
        return ("cluster", key) in loaded.lines or (override is not None and override.is_axis and any(
            key in builder.parameters for builder in BUILDERS.values()))

    return frozenset(key for key in loaded.scenario.cluster.overrides() if droppable(key))


def leftover_fix(loaded: LoadedScenario, path: FieldPath, kind: str) -> str:
    """How to drop every parameter the file's `cluster` gives that the topology a `--set cluster.topology` (or a
    sweep axis) puts in its place lacks (dgx-h100-cluster's `nodes` on gb200-nvl72), and to size that topology,
    as the start of the refusal of the one at ``path``'s allowed list: '--set cluster.nodes=null to drop the
    file's nodes, --set cluster.racks=N to size gb200-nvl72; or its parameters: ', a zip with null for an axis.
    '' where the parameter is the kind's or an override's, or the file names the topology."""
    from simulator.topology.size import SIZE_PARAMETERS

    switched = loaded.override_of(("cluster", "topology"))
    if len(path) != 2 or not kind or switched is None or not (switched.typed or switched.is_axis):
        return ""
    parameters = BUILDERS[kind].parameters
    leftovers = [key for key in loaded.scenario.cluster.overrides() if key not in parameters
                 and ("cluster", key) in loaded.lines and loaded.override_of(("cluster", key)) is None]
    if str(path[-1]) not in leftovers:
        return ""
    topology = loaded.scenario.cluster.topology
    size = next(iter(SIZE_PARAMETERS.get(kind, ())), None)
    if switched.is_axis:
        zipped = ", ".join(f"cluster.{key}" for key in leftovers)
        sized = f", and of cluster.{size} to size it, null elsewhere" if size else ""
        return f"a zip of {zipped} with cluster.topology, null where it is {topology}{sized}; or its parameters: "
    nulls = " ".join(f"--set cluster.{key}=null" for key in leftovers)
    sized = f", --set cluster.{size}=N to size {topology}" if size else ""
    return f"{nulls} to drop the file's {_listed(leftovers)}{sized}; or its parameters: "


def _listed(names: list[str]) -> str:
    """'nodes', 'racks and last_rack_trays', 'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def kept_node_warning(loaded: LoadedScenario, topology: Topology) -> str | None:
    """`kept_node_problem` of the scenario's `cluster` overrides, located at the override's `gpu_model`."""
    found = kept_node_problem(loaded.scenario.cluster.overrides(), topology)
    if found is None:
        return None
    path, problem, allowed = found
    return str(loaded.error(("cluster", *path), problem, allowed))


def kept_node_problem(overrides: Mapping[str, object], topology: Topology) -> tuple[FieldPath, str, str] | None:
    """Where ``overrides`` (a scenario's `cluster` section, or `trainsim topo` and `collective`'s `--set`s, which
    gave none) change a node's GPU (`node: {gpu_model: ...}`, merged into the file's node or a whole node, or
    `gpu_model` of a one-server or rack topology) and leave it settings written for another GPU: the parameter
    path of that `gpu_model`, the problem and what is allowed. Such settings are an NVLink bandwidth other than
    the new GPU generation's (`--set cluster.node.gpu_model=b200` on dgx-h100-cluster ran B200s on the H100's
    450 GB/s NVLink, the step 17.6% too long, without a word), or the file's NVLink SHARP (`nvls`) on a GPU that
    has none (its collectives never use it). A server of one GPU has no NVLink to keep."""
    from simulator.catalog.calibration import nvlink_line_rate, nvls_efficiency
    from simulator.units import format_bandwidth

    node, built = overrides.get("node"), topology.params
    path: FieldPath = ("gpu_model",)
    given: Mapping[str, object]
    if isinstance(node, dict) and "gpu_model" in node:
        given, path, built = node, ("node", "gpu_model"), topology.params.get("node", {})
    elif "gpu_model" in overrides:
        given = overrides
    else:
        return None
    if built.get("gpus", 0) == 1:
        return None
    gpu, kept, changes = topology.gpu_model, [], []
    if "nvls" not in given and topology.nvls and nvls_efficiency(gpu) is None:
        kept.append(f"the node keeps the topology file's nvls (NVLink SHARP), which {gpu} has none of")
        changes.append("nvls: none")
    bandwidth = built.get("nvlink_bandwidth")
    if "nvlink_bandwidth" not in given and bandwidth is not None and bandwidth != nvlink_line_rate(gpu):
        whose = "its" if kept else "the node's"
        kept.append(f"{whose} nvlink_bandwidth is {format_bandwidth(bandwidth)}, while {gpu}'s NVLink has "
                    f"{format_bandwidth(nvlink_line_rate(gpu))} per direction")
        changes.append(f"nvlink_bandwidth: {format_bandwidth(nvlink_line_rate(gpu))}")
    if not kept:
        return None
    return path, f"gpu_model {gpu}: {'; '.join(kept)}", f"{' and '.join(changes)} beside gpu_model"
