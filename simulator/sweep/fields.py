"""Field paths of a scenario as a sweep names them (`parallelism.pp`, `parallelism.ddp.bucket`,
`workload[0].bytes`): parsing, checking them against the scenario schema, and setting a value in scenario data."""

from __future__ import annotations

import copy
import re
from typing import get_args

from pydantic import BaseModel

from simulator.config.loader import _model_in
from simulator.config.schema import Scenario
from simulator.errors import ScenarioError

FieldParts = tuple  # of str keys and int list indices
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_path(text: str) -> FieldParts:
    """``workload[0].bytes`` -> ``('workload', 0, 'bytes')``; a numeric part (``workload.0``) is an index too."""
    parts: list[str | int] = []
    for key, index in _PART.findall(text):
        if index:
            parts.append(int(index))
        else:
            parts.append(int(key) if key.isdigit() else key)
    return tuple(parts)


def check_path(parts: FieldParts) -> str:
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
            return f"{dotted_path(parts[:depth])} has no sub-fields" if depth else "not a field path"
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


def with_values(data: dict, values: dict[FieldParts, object]) -> dict:
    """A copy of scenario ``data`` with each field path set to its value (missing sections created)."""
    result = copy.deepcopy(data)
    for parts, value in values.items():
        node: object = result
        for depth, part in enumerate(parts[:-1]):
            child = _child(node, part)
            if child is None:
                child = {}
                _set(node, part, child, parts[:depth + 1])
            node = child
        _set(node, parts[-1], value, parts)
    return result


def _child(node: object, part: str | int) -> object:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and isinstance(part, int) and part < len(node):
        return node[part]
    return None


def _set(node: object, part: str | int, value: object, parts: FieldParts) -> None:
    if isinstance(node, dict) and isinstance(part, str):
        node[part] = value
    elif isinstance(node, list) and isinstance(part, int) and part < len(node):
        node[part] = value
    else:
        raise ScenarioError(f"the base scenario has no {dotted_path(parts)} to set", field=dotted_path(parts))


def dotted_path(parts: FieldParts) -> str:
    """The canonical spelling of a field path: ``workload[0].bytes``."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def value_at(model: BaseModel, parts: FieldParts) -> object:
    """The validated value of a field of a scenario (SI floats for quantities)."""
    current: object = model
    for part in parts:
        if isinstance(part, int):
            if not isinstance(current, (list, tuple)) or part >= len(current):
                raise ScenarioError(f"the scenario has no {dotted_path(parts)}", field=dotted_path(parts))
            current = current[part]
        elif isinstance(current, BaseModel) and part not in type(current).model_fields:
            current = (current.model_extra or {})[part]
        else:
            current = getattr(current, part)
    return current
