"""Field paths of a scenario as a sweep names them (`parallelism.pp`, `parallelism.ddp.bucket`,
`workload[0].bytes`): setting a value in scenario data and reading one back (config/field_paths.py checks them)."""

from __future__ import annotations

import copy

from pydantic import BaseModel

from simulator.config.yaml_source import FieldPath, dotted, set_field
from simulator.errors import ScenarioError


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
