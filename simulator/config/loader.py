"""Load a scenario: read YAML with line numbers, apply `--set a.b=value` overrides, validate into the schema.

Every failure becomes one ScenarioError naming the file, the line, the field path and what is allowed.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from simulator.config.bundled import resolve_scenario
from simulator.config.faults import JOB_FAULT_FIELDS
from simulator.config.field_paths import model_in, origin_in, path_problem
from simulator.config.model_options import SYNTHETIC_NO_OPS
from simulator.config.parameter_server import PARAMETER_SERVER_NO_OPS
from simulator.config.schema import ParallelismConfig, Scenario
from simulator.config.sections import INT64_LIMIT, FieldProblem, user_keys
from simulator.config.traces import TRACE_NO_OPS, TraceWorkload
from simulator.config.yaml_source import (
    FIELD_PATH_EXAMPLE,
    FieldPath,
    SplitNumber,
    dotted,
    is_field_path,
    line_of,
    override_value,
    parse_field,
    parse_yaml_text,
    read_yaml,
    set_field,
)
from simulator.errors import ScenarioError, yaml_spelling


@dataclass(frozen=True)
class Override:
    """A value written over the scenario file's, and where: a `--set` (``file`` is "--set a.b=value", no line),
    a command's option (``file`` is the flag, the value as typed a prefix of the problem) or a sweep axis (the
    sweep file's line, the axis entry as the field and its value as a prefix of the problem). An error in the
    value, or in a key the file lacks under it, points there (its line names the field only where the flag does
    not: `InputError.shown_field`)."""

    path: FieldPath
    file: str
    line: int | None = None
    field: str = ""
    """The field an error in the value names; '' for the scenario field at fault."""
    prefix: str = ""
    at_flag: bool = False
    """``file`` is a flag of the command (a `--set`, a command's option), not a file."""
    typed: str = ""
    """The `--set` as the user typed it (``a.b=value``), which a run's records keep so that it can be
    reproduced; '' for a sweep axis or a command's option, which the sweep file or the command records."""
    replay: str = ""
    """For a sweep axis, the `--set` (``a.b=value``, `set_text`) that writes the point's value: a point's run
    folder lists it after the sweep's `--set`s, so that `trainsim run BASE --set ...` runs the point again."""

    @property
    def is_axis(self) -> bool:
        """Whether a sweep axis wrote it (its point's value is in the sweep's table)."""
        return bool(self.replay)

    @property
    def where(self) -> str:
        """Where the user wrote it, as an error message names it: the `--set`, the sweep file's line, or a
        command's option with the value as typed (`--intervals 1min`)."""
        if self.line is not None:
            return f"{self.file}:{self.line}"
        return " ".join(part for part in (self.field or self.file, self.prefix.removesuffix(": ")) if part)

    def overlaps(self, field: FieldPath) -> bool:
        """Whether it writes ``field``, a section holding it or a field under it (what a command that sets
        ``field`` itself would write over, or lose)."""
        written, other = tuple(map(str, self.path)), tuple(map(str, field))
        common = min(len(written), len(other))
        return written[:common] == other[:common]

    def error(self, problem: str, field: str, allowed: str = "",
              kind: type[ScenarioError] = ScenarioError) -> ScenarioError:
        """The error ``problem`` in the value this override wrote, located at it: the value as typed before the
        problem, its own field in place of ``field`` where it names one, its file and line, and its mark of a flag
        (`InputError.rebuilt` keeps them on a copy)."""
        return kind(self.prefix + (as_typed(problem, self.typed) if self.typed else problem), field=self.field or field,
                    allowed=allowed, file=self.file, line=self.line, at_flag=self.at_flag)


def set_flag(item: str) -> str:
    """Where a `--set ITEM` is located, in place of a file: the flag as typed (`--set a.b=value`)."""
    return f"--set {item.strip()}"


def as_typed(problem: str, typed: str) -> str:
    """``problem`` about the value that the `--set` ``typed`` (`name=value`) wrote, the value named as typed where
    the problem quotes it as YAML read it: `nodes=1e3` said "got 1000.0", `nodes=null` "got None". Only that whole
    value is replaced, not the start of another: with `microbatches=+1`, "got 10" and "got 1.5" stay as they are
    (they read "got +10" and "got +1.5"). A float the problem quotes without "got" is named as typed at its first
    whole mention: `checkpoint.size=1e12` said "size 1000000000000.0 has no unit"."""
    text = typed.split("=", 1)[1].strip()
    value = override_value(text)
    if not (value is None or isinstance(value, (bool, int, float))) or repr(value) == text:
        return problem
    quoted = re.escape(repr(value))
    named, count = re.subn(rf"\bgot {quoted}(?!\w|\.\d)", lambda _: f"got {text}", problem)
    if count or not isinstance(value, float):
        return named
    return re.sub(rf"(?<![\w.]){quoted}(?!\w|\.\d)", lambda _: text, problem, count=1)


def sets_typed(overrides: tuple[Override, ...]) -> tuple[str, ...]:
    """The `--set`s among ``overrides``, as typed, in order (sweep axes and command options left out)."""
    return tuple(override.typed for override in overrides if override.typed)


@dataclass(frozen=True)
class OptionSetting:
    """A value a command's option writes into the scenario (`trainsim study --multipliers` sets
    faults.rate_multiplier): an error in it names the ``option`` and the value as the user wrote it (``shown``),
    not a field of the file or a `--set` the user never typed."""

    option: str
    path: FieldPath
    value: object
    shown: str

    def override(self) -> Override:
        """Where an error in the value points: the option and the value as written (`--intervals: 60 d: ...`),
        which the command puts on its command line (a library text, such as a study's warning in study.json,
        knows no command)."""
        return Override(self.path, self.option, prefix=f"{self.shown}: ", at_flag=True)


DEEPSPEED_REFUSES_PIPELINING = ("DeepSpeed refuses it with pipeline parallelism (its PipelineEngine asserts "
                                "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism')")
"""Why DeepSpeed's ZeRO-2 and ZeRO-3 under pipelining train in no framework, as the loader warns and a search prunes."""


def deepspeed_zero2_under_pipelining(par: ParallelismConfig) -> bool:
    """Whether ``par`` is DeepSpeed's ZeRO-2 (`zero: 2` reducing every micro-batch) under pipelining (pp > 1),
    which DeepSpeed refuses (DEEPSPEED_REFUSES_PIPELINING) and Megatron-LM's accumulating ZeRO-2 is not."""
    return par.pp > 1 and par.fsdp is None and par.zero == 2 and bool(par.ddp.reduce_every_microbatch)


@dataclass(frozen=True)
class LoadedScenario:
    """A validated scenario plus where it came from, so later checks can point at the right line."""

    scenario: Scenario
    source: str
    lines: dict
    overrides: tuple[Override, ...] = ()
    """Each `--set` (or a sweep point's axis), so errors in a value it set point at it."""
    validated_from: tuple[Scenario, dict] | None = field(default=None, compare=False, repr=False)
    """A scenario and the data validated into it (the file with the overrides written over it): `written`."""

    @property
    def written(self) -> dict | None:
        """The data validated into ``scenario``, from which a changed scenario is built as `--set` builds one
        (memory_remedies.py); None where the scenario was made otherwise, as in a copy by `dataclasses.replace`
        with another scenario (a shrunk or perturbed job's), which that data no longer describes."""
        if self.validated_from is None or self.validated_from[0] is not self.scenario:
            return None
        return self.validated_from[1]

    @property
    def sets(self) -> tuple[str, ...]:
        """The `--set`s written over the file, as typed, in order."""
        return sets_typed(self.overrides)

    @property
    def replayed(self) -> tuple[str, ...]:
        """The `--set`s that give this scenario from its file, in the order they apply: each `--set` as typed,
        then a sweep point's axis values (`Override.replay`)."""
        return tuple(override.typed or override.replay for override in self.overrides
                     if override.typed or override.replay)

    def error(self, path: FieldPath, problem: str, allowed: str = "", every_override: bool = False,
              reads: tuple[FieldPath, ...] = ()) -> ScenarioError:
        """A ScenarioError located at ``path`` in this scenario's file (or the override that set it); with
        ``every_override``, naming every override, not only those under ``path`` (a check of the whole scenario
        located at one section, such as out of memory at `parallelism`: a micro-batch or a model set elsewhere
        counts as much), else those under ``path`` or under any of the fields the check ``reads``."""
        return located_error(path, problem, allowed, self.source, self.lines, self.overrides,
                             named=self.overrides if every_override else None, reads=reads)

    def gave(self, path: FieldPath) -> bool:
        """Whether the scenario (its file or an override) gives the field at ``path``, rather than leaving it to
        its default: a check across several fields blames the one the user set, even where the value equals
        the default."""
        node: object = self.scenario
        for part in path:
            if isinstance(node, BaseModel):
                if part not in node.model_fields_set:
                    return False
                node = getattr(node, str(part))
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return False
        return True

    def override_of(self, path: FieldPath) -> Override | None:
        """The override (a `--set`, a sweep axis, a command's option) that wrote the value at ``path``; None where
        the file gives it or leaves it to its default."""
        return _blamed_override(path, self.lines, self.overrides)

    def ignored_without_a_horizon(self) -> tuple[str, ...]:
        """A located warning for each field the scenario sets that only a job over weeks reads (`checkpoint`,
        `storage`, `restart`, `run.replications`, the failure processes of `faults`) when it has no
        `run.horizon`: a single step ignores them, and a user who meant a job should hear so before trusting the
        figures. In the file's line order, as a compiler sorts its diagnostics; the `--set`s, without a line, last."""
        scenario = self.scenario
        if scenario.run.horizon is not None:
            return ()
        paths = [(name, field) for name in ("checkpoint", "storage", "restart")
                 for field in sorted(getattr(scenario, name).model_fields_set)]
        paths += [("run", "replications")] if "replications" in scenario.run.model_fields_set else []
        paths += [("faults", field) for field in sorted(scenario.faults.model_fields_set & JOB_FAULT_FIELDS)]
        errors = [self.error(path, "only a job over weeks reads it (run.horizon); this single step ignores it")
                  for path in paths]
        return _in_file_order(errors)

    def ignored_by_a_synthetic_model(self) -> tuple[str, ...]:
        """A located warning for each field the scenario sets that a synthetic model cannot be changed by
        (SYNTHETIC_NO_OPS: `parallelism.ddp.*`, `zero`, `fsdp`, the training's precision, optimizer and gradient
        reduce format), each section's fields named one by one; in the file's line order, the `--set`s last."""
        scenario = self.scenario
        if scenario.model is None or scenario.model.synthetic is None:
            return ()
        return self._ignored(SYNTHETIC_NO_OPS)

    def ignored_by_parameter_servers(self) -> tuple[str, ...]:
        """A located warning for each field the scenario sets that `parallelism.strategy: parameter_server` is not
        changed by (PARAMETER_SERVER_NO_OPS: the gradient reduce format, `parallelism.ddp.*`, sequence
        parallelism, `pipeline.*`, the CP algorithm, the collectives' algorithm), as
        `ignored_by_a_synthetic_model` gives them."""
        if not self.scenario.uses_parameter_servers:
            return ()
        return self._ignored(PARAMETER_SERVER_NO_OPS)

    def ignored_by_uniform_routing(self) -> tuple[str, ...]:
        """A located warning where the scenario sets `model.moe.routing.skew` beside `balance: uniform` (the
        default), which gives every expert exactly k n / E tokens whatever the skew, as the other no-op fields
        are warned (`ignored_by_parameter_servers`); not where an override made uniform a file's skewed routing
        (`--set model.moe.routing.balance=uniform` to compare, the file's skew left as it was), nor where a sweep
        axis did (a grid over balance and skew: the balance is in its table)."""
        model = self.scenario.model
        moe = None if model is None else model.moe
        if moe is None or moe.routing.balance != "uniform" or "skew" not in moe.routing.model_fields_set:
            return ()
        routing = ("model", "moe", "routing")
        balance = self.override_of((*routing, "balance"))
        if balance is not None and (balance.is_axis or self.override_of((*routing, "skew")) is None):
            return ()
        return (str(self.error((*routing, "skew"),
                               "balance uniform gives every expert exactly k n / E tokens whatever the skew (skew "
                               "shapes zipf and dirichlet routing): it changes nothing",
                               reads=((*routing, "balance"),))),)

    def ignored_by_a_trace(self) -> tuple[str, ...]:
        """A located warning for each field the scenario sets that a replayed trace (`workload.trace`) is not
        changed by (TRACE_NO_OPS: `collectives.sm_contention`), as `ignored_by_a_synthetic_model` gives them."""
        if not isinstance(self.scenario.workload, TraceWorkload):
            return ()
        return self._ignored(TRACE_NO_OPS)

    def unframed_fields(self) -> frozenset[str]:
        """The fields (dotted) of the choices no framework trains, which `moe_layouts_no_framework_trains` and
        `pipelined_deepspeed_no_framework_trains` warn of: a remedy that warns of one more is not offered."""
        return frozenset(error.field for error in (*self._moe_unframed(), *self._pipelined_deepspeed_unframed()))

    def moe_layouts_no_framework_trains(self) -> tuple[str, ...]:
        """`_moe_unframed`'s warnings, in the file's line order, the `--set`s last."""
        return _in_file_order(self._moe_unframed())

    def _moe_unframed(self) -> list[ScenarioError]:
        """A located warning for each choice of a MoE scenario that the frameworks the step follows refuse to
        train, though the step is simulated all the same: `tp` above 1 without sequence parallelism (Megatron-Core's
        MoELayer raises for it in training) and DeepSpeed's `zero: 3` (its engine asserts that MoE is not
        supported with stage 3; Megatron-LM has no ZeRO-3)."""
        scenario = self.scenario
        model, par = scenario.model, scenario.parallelism
        if model is None or not model.has_experts():
            return []
        errors = []
        if par.tp > 1 and not par.sequence_parallel:
            errors.append(self.error(
                ("parallelism", "sequence_parallel"),
                f"false with experts and tp {par.tp}: Megatron-Core, whose MoE placement the step follows, refuses "
                "to train it (MoELayer raises 'During training, performance may degrade if MoE and tensor "
                "parallelism are enabled without also enabling sequence parallelism'); simulated all the same",
                "sequence_parallel: true, or tp: 1", reads=(("parallelism", "tp"),)))
        if par.zero == 3:
            errors.append(self.error(
                ("parallelism", "zero"),
                "3 with experts: DeepSpeed, whose ZeRO-3 this is, refuses it (its engine asserts 'MoE not "
                "supported with Stage 3') and Megatron-LM has no ZeRO-3; simulated all the same",
                "fsdp: full_shard (torchtitan shards experts under FSDP2), or zero: 0 to 2"))
        return errors

    def pipelined_deepspeed_no_framework_trains(self) -> tuple[str, ...]:
        """`_pipelined_deepspeed_unframed`'s warning, if any."""
        return tuple(str(error) for error in self._pipelined_deepspeed_unframed())

    def _pipelined_deepspeed_unframed(self) -> list[ScenarioError]:
        """A located warning for DeepSpeed's gradient sharding under pipeline parallelism (`pp` above 1), which
        the step simulates all the same: `zero: 3` (of a dense model: a MoE one is warned of at the same field by
        `moe_layouts_no_framework_trains`) and `zero: 2` with `ddp.reduce_every_microbatch: true`, DeepSpeed's
        ZeRO-2. DeepSpeed's PipelineEngine asserts that ZeRO-2 and ZeRO-3 are incompatible with pipeline
        parallelism; Megatron-LM's ZeRO-3, Megatron-FSDP, does not run under pipelining and its ZeRO-2 accumulates
        (`reduce_every_microbatch` false)."""
        scenario = self.scenario
        model, par = scenario.model, scenario.parallelism
        if model is None or model.synthetic is not None or par.pp == 1 or par.fsdp is not None:
            return []  # a synthetic model's sharding changes nothing, as ignored_by_a_synthetic_model says
        refused = DEEPSPEED_REFUSES_PIPELINING
        pp = ("parallelism", "pp")
        if par.zero == 3 and not model.has_experts():
            return [self.error(
                ("parallelism", "zero"),
                f"3 with pp {par.pp}: {refused}, and Megatron-LM's ZeRO-3, Megatron-FSDP, does not run under "
                "pipelining; simulated all the same",
                "fsdp: full_shard (torchtitan runs FSDP under pipelining), zero: 0 to 2, or pp: 1", reads=(pp,))]
        if deepspeed_zero2_under_pipelining(par):
            return [self.error(
                ("parallelism", "ddp", "reduce_every_microbatch"),
                f"true with zero: 2 and pp {par.pp} is DeepSpeed's ZeRO-2: {refused}, and Megatron-LM's "
                "distributed optimizer reduces once per step; simulated all the same",
                "fsdp: shard_grad_op with this true for ZeRO-2 under pipelining (as Llama 3's own runtime runs "
                "it), left out for Megatron-LM's ZeRO-2, or pp: 1", reads=(pp, ("parallelism", "zero")))]
        return []

    def _ignored(self, no_ops: dict[tuple[str, str], str]) -> tuple[str, ...]:
        """A located warning for each field of ``no_ops`` (each with why it changes nothing) the scenario sets,
        a section's fields named one by one; in the file's line order, the `--set`s last."""
        scenario = self.scenario
        errors = []
        for (section, name), why in no_ops.items():
            owner = getattr(scenario, section)
            if name not in owner.model_fields_set:
                continue
            value = getattr(owner, name)
            fields = sorted(value.model_fields_set) if isinstance(value, BaseModel) else [None]
            errors += [self.error((section, name) if field is None else (section, name, field),
                                  f"{why}: it changes nothing")
                       for field in fields]
        return _in_file_order(errors)


def located_error(path: FieldPath, problem: str, allowed: str, source: str, lines: dict,
                  overrides: tuple[Override, ...], error: type[ScenarioError] = ScenarioError,
                  named: tuple[Override, ...] | None = None, reads: tuple[FieldPath, ...] = ()) -> ScenarioError:
    """The error in the value at ``path``: at the override that wrote it, naming the other overrides that wrote
    a field the check ``reads`` (with `--set parallelism.pp=4`, the `--set parallelism.pipeline.virtual_stages=3`
    that makes the stages 12 with it), else at the file's line, naming the
    overrides that wrote under ``path`` or under a field the check ``reads`` (a check across fields,
    `parallelism`'s product against the cluster's GPUs, may fail because of one of them, and the file's line
    alone shows other values than the ones checked), or ``named`` where given. An override above a field read
    (`--set parallelism.pipeline={...}` for a check reading its schedule) wrote it too."""
    found = _blamed_override(path, lines, overrides)
    if found is None:
        fields = (_text(path), *(_text(field) for field in reads))
        under = [override.where for override in (overrides if named is None else named)
                 if named is not None or _wrote_under(override, fields)]
        if under:
            problem += f" (with {', '.join(under)})"
        return error(problem, field=dotted(path), allowed=allowed, file=source, line=line_of(lines, path))
    read = [override.where for override in overrides
            if not _wrote_under(override, (_text(path),)) and _wrote_under(override, tuple(map(_text, reads)))]
    return found.error(problem + (f" (with {', '.join(read)})" if read else ""), dotted(path), allowed, error)


def _wrote_under(override: Override, fields: tuple[tuple[str, ...], ...]) -> bool:
    """Whether ``override`` wrote one of ``fields``, under one, or a section above one."""
    return any(_text(override.path[:len(field)]) == field or field[:len(override.path)] == _text(override.path)
               for field in fields)


def _blamed_override(path: FieldPath, lines: dict, overrides: tuple[Override, ...]) -> Override | None:
    """The override that gave the value at ``path``: the last one at or above it; a key the file does not have
    is blamed on the last override that wrote under it (`--set foo.bar=1`: unknown key foo). Parts compare as
    text, since a digit part that set_field wrote into a mapping comes back from pydantic as its key's text."""
    for override in reversed(overrides):
        if _text(path[:len(override.path)]) == _text(override.path):
            return override
    if path not in lines:
        for override in reversed(overrides):
            if _text(override.path[:len(path)]) == _text(path):
                return override
    return None


def _text(parts: FieldPath) -> tuple[str, ...]:
    return tuple(str(part) for part in parts)


def apply_overrides(data: dict, overrides: list[str]) -> tuple[dict, tuple[Override, ...]]:
    """Apply ``a.b=value`` strings (``workload[0].bytes=...`` for a list item; values parsed as YAML scalars)
    to a nested dict; return the new dict and the field path each override set, for locating errors in the
    values they wrote."""
    result = copy.deepcopy(data)
    written: list[Override] = []
    for item in overrides:
        if "=" not in item:
            raise ScenarioError(f"{item!r} has no '='", field="--set", allowed="--set section.field=value",
                                file="command line")
        key, raw = item.split("=", 1)
        parts = parse_field(key.strip())
        if not parts:
            raise ScenarioError(f"{item!r} names no field", field="--set", allowed="--set section.field=value",
                                file="command line")
        if not is_field_path(key.strip()):
            raise ScenarioError(f"{key.strip()!r} is not a field path", file=set_flag(item),
                                allowed=FIELD_PATH_EXAMPLE, at_flag=True)
        try:
            value = override_value(raw)
        except SplitNumber as split:
            raise ScenarioError(split.problem, field=dotted(parts + split.path), file=set_flag(item),
                                allowed=split.allowed, at_flag=True) from None
        problem = path_problem(parts, result)
        if problem is not None:
            raise ScenarioError(problem.problem, field=dotted(problem.at), file=set_flag(item),
                                allowed=problem.allowed, at_flag=True)
        try:
            set_field(result, parts, value)
        except ValueError as exc:
            raise ScenarioError(str(exc), field=dotted(parts), file=set_flag(item),
                                allowed=FIELD_PATH_EXAMPLE, at_flag=True) from None
        written.append(Override(parts, set_flag(item), at_flag=True, typed=item.strip()))
    return result, tuple(written)


def _section_at(model: type[BaseModel], loc: tuple) -> object:
    """The schema model of the section at ``loc`` (None where the schema has none), walking from ``model``; a
    key of a mapping field (a failure class's name under `faults.components`) leads to the mapping's values."""
    current: object = model
    keyed = False
    for position, part in enumerate(loc):
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        annotation = fields[part].annotation
        keyed = origin_in(annotation, dict)
        current = model_in(annotation, in_list=position + 1 < len(loc) and isinstance(loc[position + 1], int))
    return current


def _allowed_keys(model: type[BaseModel], loc: tuple) -> str:
    """The field names allowed at ``loc`` (the parent of an unknown key), walking the schema."""
    return ", ".join(user_keys(_section_at(model, loc)))


def _what_it_takes(model: type[BaseModel], loc: tuple) -> str:
    """What the missing field at ``loc`` takes: its schema description where it has one (a name or path the
    schema cannot check alone), else what its own validation allows when given nothing (null), so a missing
    `bytes` lists the size units its refusal of '25' lists."""
    fields = getattr(_section_at(model, loc[:-1]), "model_fields", None)
    info = fields.get(loc[-1]) if fields else None
    if info is None:
        return ""
    if info.description:
        return info.description
    annotation = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    try:
        TypeAdapter(annotation).validate_json("null")
    except ValidationError as exc:
        return _problem(exc.errors(include_url=False)[0], loc, model)[1]
    return ""


_TYPE_TAGS = ("str", "int", "float", "bool", "list", "dict", "none")


def _section_names(annotation: object) -> set[str]:
    """Class names of the schema's sections: pydantic puts them in error locations for union members."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        names = {annotation.__name__}
        for info in annotation.model_fields.values():
            names |= _section_names(info.annotation)
        return names
    return {name for arg in getattr(annotation, "__args__", ()) or () for name in _section_names(arg)}


_SECTION_NAMES = _section_names(Scenario)


def _is_type_tag(part: object, sections: set[str]) -> bool:
    """Whether a pydantic error location part names a union member type (a type or one of ``sections``)
    rather than a field."""
    return isinstance(part, str) and ("[" in part or part.startswith("function-") or part in _TYPE_TAGS
                                      or part in sections)


_TYPE_PROBLEMS = {
    "int_type": ("a whole number", "an integer such as 8"),
    "int_parsing": ("a whole number", "an integer such as 8"),
    "int_from_float": ("a whole number", "an integer such as 8"),
    "float_type": ("a number", "a number such as 0.5"),
    "float_parsing": ("a number", "a number such as 0.5"),
    "finite_number": ("a finite number", "a number such as 0.5"),
    "bool_type": ("true or false", "true, false"),
    "bool_parsing": ("true or false", "true, false"),
    "string_type": ("a string", "text"),
    "list_type": ("a list", "a YAML list such as [a, b]"),
    "tuple_type": ("a list", "a YAML list such as [a, b]"),
    "dict_type": ("a mapping", "a YAML mapping such as {key: value}"),
    "model_type": ("a mapping", "a YAML mapping such as {key: value}"),
}
"""Pydantic's type errors as plain words: what the field expected, and an example of it."""

_LENGTH_PROBLEMS = {"too_short": ("min_length", "at least"), "too_long": ("max_length", "at most")}
"""Pydantic's length errors of lists and mappings: the bound's key in the error's context, and its words."""

_BOUND_PROBLEMS = {"greater_than_equal": ("ge", "below", ">="), "greater_than": ("gt", "not above", ">"),
                   "less_than_equal": ("le", "above", "<="), "less_than": ("lt", "not below", "<")}
"""Pydantic's bound errors: the bound's key in the error's context, how the value misses it, the comparison."""


def _whole(value: object) -> bool:
    """Whether ``value`` is a whole number (an int, not a bool), which a bound's message writes with thousands
    separators."""
    return isinstance(value, int) and not isinstance(value, bool)


def _location(error: ErrorDetails, sections: set[str]) -> tuple:
    """The field path of a pydantic error: its location without union member tags, and below it the field a
    section's check blames (FieldProblem)."""
    loc = tuple(part for part in error["loc"] if not _is_type_tag(part, sections))
    blamed = error.get("ctx", {}).get("error")
    return loc + blamed.path if isinstance(blamed, FieldProblem) else loc


def validation_error(exc: ValidationError, model: type[BaseModel], source: str, lines: dict,
                     error: type[ScenarioError] = ScenarioError,
                     overrides: tuple[Override, ...] = ()) -> ScenarioError:
    """The first pydantic error as a located one-line ScenarioError. A section's check across its fields that
    blames one of them (FieldProblem) names every override under the section: any of its fields may have failed
    it (`--set parallelism.zero=3` against the file's `fsdp` went unsaid at `fsdp`)."""
    errors = exc.errors(include_url=False)
    sections = _SECTION_NAMES | _section_names(model)
    cleaned = [_location(error, sections) for error in errors]
    deepest = max(range(len(errors)),
                  key=lambda i: (len(cleaned[i]), errors[i]["type"] == "extra_forbidden", -i))
    first, loc = errors[deepest], cleaned[deepest]
    message, allowed = _problem(first, loc, model)
    blamed = first.get("ctx", {}).get("error")
    section = loc[:len(loc) - len(blamed.path)] if isinstance(blamed, FieldProblem) else loc
    return located_error(loc, message, allowed, source, lines, overrides, error, reads=(section,))


def _problem(first: ErrorDetails, loc: tuple, model: type[BaseModel]) -> tuple[str, str]:
    """A pydantic error at ``loc`` in plain words: the problem and what is allowed."""
    kind = first["type"]
    message = first["msg"]
    allowed = ""
    given = yaml_spelling(first.get("input"))
    blamed = first.get("ctx", {}).get("error")
    if isinstance(blamed, FieldProblem):
        message, allowed = blamed.problem, blamed.allowed
    elif kind == "extra_forbidden":
        message = f"unknown key {loc[-1]!r}"
        allowed = _allowed_keys(model, loc[:-1])
    elif kind == "missing":
        message = "required field is missing"
        allowed = _what_it_takes(model, loc)
    elif kind in ("literal_error", "enum"):
        expected = first.get("ctx", {}).get("expected", "")
        message = f"{given} is not a valid choice"
        allowed = expected.replace("'", "")
    elif message.startswith("Value error, "):
        message = message[len("Value error, "):]
        if " (allowed: " in message and message.endswith(")"):
            message, allowed = message[:-1].split(" (allowed: ", 1)
    elif kind in _BOUND_PROBLEMS:
        key, miss, sign = _BOUND_PROBLEMS[kind]
        bound = first.get("ctx", {}).get(key)
        if isinstance(bound, float) and bound.is_integer() and abs(bound) < 2**53:
            bound = int(bound)  # '> 0' as the other bounds say, not '> 0.0'
        if _whole(first.get("input")) and _whole(bound):
            given, bound = f"{first['input']:,}", f"{bound:,}"  # '10,001 is above 10,000', as figures print
        message, allowed = f"{given} is {miss} {bound}", f"a value {sign} {bound}"
    elif kind in _LENGTH_PROBLEMS:
        key, words = _LENGTH_PROBLEMS[kind]
        bound, length = first.get("ctx", {}).get(key), first.get("ctx", {}).get("actual_length")
        message = f"{given} is empty" if length == 0 else f"{given} has {length} items"
        allowed = f"{words} {bound} item" + ("" if bound == 1 else "s")
    elif kind in _TYPE_PROBLEMS:
        message, allowed = f"expected {_TYPE_PROBLEMS[kind][0]}, got {given}", _TYPE_PROBLEMS[kind][1]
        if kind.startswith("int_"):
            allowed = _whole_range(model, loc) or allowed
    return message, allowed


def _whole_range(model: type[BaseModel], loc: tuple) -> str:
    """What the whole-number field at ``loc`` takes, from its schema bounds and default: 'an integer from 0 to 3,
    0 where not given' for `parallelism.zero`; empty for a field without bounds."""
    fields = getattr(_section_at(model, loc[:-1]), "model_fields", None)
    info = fields.get(loc[-1]) if fields and isinstance(loc[-1], str) else None
    if info is None:
        return ""
    low = next((bound.ge for bound in info.metadata if hasattr(bound, "ge")), None)
    high = next((bound.le for bound in info.metadata if hasattr(bound, "le")), None)
    if low is None:
        return ""
    default = f", {info.default:,} where not given" if _whole(info.default) else ""
    span = f"from {low:,} to {high:,}" if high is not None else f">= {low:,}"
    return f"an integer {span}{default}"


M = TypeVar("M", bound=BaseModel)


def validate_as_json(model: type[M], data: object) -> M:
    """Validate YAML data against a strict schema model the way pydantic validates JSON: no coercion (`tp:
    true` or `tp: "4"` is refused where an integer is expected) while YAML lists still fill tuple fields. Values
    JSON lacks arrive as numbers (numpy scalars of sweep axes) or as their text (YAML dates)."""
    return model.model_validate_json(json.dumps(data, default=_plain))


def _plain(value: object) -> object:
    """A value JSON cannot hold as itself: a numpy scalar as its Python number, anything else as its text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


def load_scenario(path: str | Path, overrides: list[str] | None = None,
                  settings: tuple[OptionSetting, ...] = ()) -> LoadedScenario:
    """Read, override (`--set` ``overrides``, then a command's option ``settings``) and validate a scenario file,
    or a bundled scenario given by name; raise ScenarioError on any problem."""
    path = resolve_scenario(path)
    source = str(path)
    data, lines = read_yaml(path, ScenarioError)
    return scenario_from_data(data, lines, source, overrides, settings)


def scenario_from_text(text: str, source: str = "<text>", overrides: list[str] | None = None) -> LoadedScenario:
    """Like `load_scenario` for YAML text already in memory (tests, notebooks)."""
    data, lines = parse_yaml_text(text, source, ScenarioError)
    return scenario_from_data(data, lines, source, overrides)


def scenario_from_data(data: object, lines: dict, source: str, overrides: list[str] | None,
                       settings: tuple[OptionSetting, ...] = ()) -> LoadedScenario:
    """Parsed YAML ``data`` (with its line table) as a validated scenario: the ``--set`` ``overrides`` and the
    option ``settings`` written into a copy first, each remembered for locating errors in what it wrote."""
    if not isinstance(data, dict):
        raise ScenarioError("a scenario must be a mapping of sections", allowed=", ".join(user_keys(Scenario)),
                            file=source, line=1)
    written: tuple[Override, ...] = ()
    if overrides:
        data, written = apply_overrides(data, overrides)  # a copy, which the settings may write into
    elif settings:
        data = copy.deepcopy(data)
    for setting in settings:
        set_field(data, setting.path, setting.value)
    written += tuple(setting.override() for setting in settings)
    scenario = validated_scenario(data, source, lines, written)
    loaded = LoadedScenario(scenario, source, lines, written, (scenario, data))
    if scenario.faults.components:
        from simulator.config.locate import located
        from simulator.reliability.components import check_class_effects

        located(loaded, lambda: check_class_effects(scenario.faults))
    return loaded


def validated_scenario(data: dict, source: str, lines: dict, overrides: tuple[Override, ...] = ()) -> Scenario:
    """Scenario ``data`` validated, or the located ScenarioError of its first problem (at the override that wrote
    the value, if one did)."""
    for path, value in _whole_numbers(data, ()):
        if not -INT64_LIMIT <= value < INT64_LIMIT:
            raise located_error(path, f"{value} is beyond 64-bit integers", "a whole number from -2^63 to 2^63 - 1",
                                source, lines, overrides)
    try:
        return validate_as_json(Scenario, data)
    except ValidationError as exc:
        raise validation_error(exc, Scenario, source, lines, overrides=overrides) from None


def _whole_numbers(data: object, path: FieldPath) -> Iterator[tuple[FieldPath, int]]:
    """Every integer in YAML ``data`` with its field path."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _whole_numbers(value, path + (key,))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _whole_numbers(value, path + (index,))
    elif isinstance(data, int) and not isinstance(data, bool):
        yield path, data


def _in_file_order(errors: list) -> tuple[str, ...]:
    """Located messages in the file's line order, those of `--set` overrides (no line) last."""
    return tuple(str(error) for error in sorted(errors, key=lambda error: (error.line is None, error.line or 0)))
