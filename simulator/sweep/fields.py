"""Field paths of a scenario as a sweep names them (`parallelism.pp`, `parallelism.ddp.bucket`,
`workload[0].bytes`): parsing, checking them against the scenario schema, and setting a value in scenario data."""

from __future__ import annotations

import copy
from typing import get_args

from pydantic import BaseModel

from simulator.config.loader import _model_in
from simulator.config.schema import Scenario
from simulator.config.yaml_source import FieldPath, dotted, set_field
from simulator.errors import ScenarioError


def check_path(parts: FieldPath) -> str:
    """Why ``parts`` names no field of a scenario ('' when it does), with the keys allowed where it went wrong.

    `cluster.*` and the keys of mapping fields are open: they are checked when each point is validated."""
    annotation: object = Scenario
    for depth, part in enumerate(parts):
        if (depth == 1 and parts[0] == "cluster") or _origin_in(annotation, dict):
            return ""
        if isinstance(part, int):
            item = _list_item(annotation)
            if item is None:
                return f"[{part}] indexes no list"
            annotation = item
            continue
        model = _model_in(annotation) if not _origin_in(annotation, list) else None
        fields = getattr(model, "model_fields", None)
        if fields is None:
            return f"{dotted(parts[:depth])} has no sub-fields" if depth else "not a field path"
        if part not in fields:
            return f"unknown field {part!r} (allowed: {', '.join(fields)})"
        annotation = fields[part].annotation
    return ""


def _origin_in(annotation: object, origin: type) -> bool:
    """Whether ``annotation`` is, or is a union containing, a generic of ``origin`` (list, dict)."""
    if getattr(annotation, "__origin__", None) is origin:
        return True
    return any(_origin_in(arg, origin) for arg in getattr(annotation, "__args__", ()) or ())


def _list_item(annotation: object) -> object:
    """The item type of the list in ``annotation`` (None when there is no list)."""
    if getattr(annotation, "__origin__", None) is list:
        return get_args(annotation)[0]
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _list_item(arg)
        if found is not None:
            return found
    return None


def with_values(data: dict, values: dict[FieldPath, object]) -> dict:
    """A copy of scenario ``data`` with each field path set to its value (missing sections created)."""
    result = copy.deepcopy(data)
    for parts, value in values.items():
        try:
            set_field(result, parts, value)
        except ValueError as exc:
            raise ScenarioError(f"the base scenario cannot take this axis: {exc}", field=dotted(parts),
                                allowed="a field the base scenario has, or a new key of a section") from None
    return result


def value_at(model: BaseModel, parts: FieldPath) -> object:
    """The validated value of a field of a scenario (SI floats for quantities). A digit part of a mapping is
    its key's text, as `set_field` writes it (``cluster.node.7`` is the key "7"); a part the scenario does not
    have (a topology parameter left at its default, a key of a section given as text) is a ScenarioError."""
    current: object = model
    for depth, part in enumerate(parts):
        key = str(part)
        if isinstance(current, BaseModel) and key in type(current).model_fields:
            current = getattr(current, key)
        elif isinstance(current, BaseModel) and key in (current.model_extra or {}):
            current = (current.model_extra or {})[key]
        elif isinstance(current, dict) and key in current:
            current = current[key]
        elif isinstance(current, (list, tuple)) and isinstance(part, int) and part < len(current):
            current = current[part]
        else:
            raise ScenarioError(f"the scenario has no {dotted(parts[:depth + 1])}", field=dotted(parts))
    return current
