"""Field paths (`parallelism.tp`, `workload[0].bytes`) checked against the scenario schema, and against the
scenario's data where a value is about to be written there (a `--set`, a sweep axis): a key the schema lacks,
a key under a plain value, an index into something that is not a list, or an item the list does not have is
one problem naming the part at fault and what is allowed there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from pydantic import BaseModel

from simulator.config.schema import Scenario
from simulator.config.sections import user_keys
from simulator.config.yaml_source import FieldPath, dotted

OPEN_SECTIONS = ("cluster",)
"""Sections whose keys the schema leaves open (a topology's parameters), checked when the scenario is built."""
_ABSENT = object()
"""The data below a part the scenario does not give."""


@dataclass(frozen=True)
class PathProblem:
    """Why a field path cannot be written: the part of it at fault (``at``), the problem, what is allowed."""

    at: FieldPath
    problem: str
    allowed: str = ""


def path_problem(parts: FieldPath, data: object = _ABSENT) -> PathProblem | None:
    """The first part of ``parts`` that names nothing in the schema (or, with scenario ``data``, an item its list
    lacks); None when the path is good. Keys of open sections and of mapping fields are not checked here."""
    annotation: object = Scenario
    node = data
    for depth, part in enumerate(parts):
        here = dotted(parts[:depth])
        if (depth == 1 and parts[0] in OPEN_SECTIONS) or origin_in(annotation, dict):
            return None
        if isinstance(part, int):
            item = _list_item(annotation)
            if item is None or (isinstance(node, dict) and model_in(annotation) is not None):
                return _not_a_list(parts[:depth], annotation)
            if node is not _ABSENT and (node is None or isinstance(node, list)):
                items = node or []
                if part >= len(items):
                    since = f"(it has {len(items)})" if node is not None else f"(the scenario gives no {here})"
                    indexes = {0: "", 1: "index 0, or "}.get(len(items), f"an index 0..{len(items) - 1}, or ")
                    return PathProblem(parts[:depth + 1], f"{here} has no item [{part}] {since}",
                                       f"{indexes}a whole list as {here}")
                node = items[part]
            annotation = item
            continue
        if isinstance(node, list):
            last = f"{here}[0]" + (f" to {here}[{len(node) - 1}]" if len(node) > 1 else "")
            return PathProblem(parts[:depth], f"{here} is a list here, not a section",
                               f"its items, {last}" if node else f"a whole list as {here}")
        fields = getattr(model_in(annotation), "model_fields", None)
        if fields is None:
            return PathProblem(parts[:depth + 1], f"{here} has no sub-fields", f"a value for {here} itself")
        if part not in fields:
            return PathProblem(parts[:depth + 1], f"unknown key {part!r}", ", ".join(user_keys(model_in(annotation))))
        annotation = fields[part].annotation
        node = node.get(part) if isinstance(node, dict) else (_ABSENT if node is _ABSENT else None)
    return None


def _not_a_list(at: FieldPath, annotation: object) -> PathProblem:
    """An index under ``at``, which is a section or a single value there."""
    keys = user_keys(model_in(annotation))
    if keys:
        return PathProblem(at, f"{dotted(at)} is a section here, not a list", f"its keys: {', '.join(keys)}")
    return PathProblem(at, f"{dotted(at)} is a single value, not a list", f"a value for {dotted(at)} itself")


def model_in(annotation: object, in_list: bool = False) -> object:
    """The pydantic model inside an annotation such as ``Model``, ``list[Model]`` or ``Model | None``; of
    ``list[A] | B`` (a list or a mapping), A for an item of the list (``in_list``), else B."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args: tuple[object, ...] = getattr(annotation, "__args__", ()) or ()
    if getattr(annotation, "__origin__", None) in (list, tuple):
        return model_in(args[0]) if in_list and args else None
    found = [model for model in (model_in(arg, in_list) for arg in args) if model is not None]
    return found[0] if found else None


def origin_in(annotation: object, origin: type) -> bool:
    """Whether ``annotation`` is, or is a union containing, a generic of ``origin`` (list, dict)."""
    if getattr(annotation, "__origin__", None) is origin:
        return True
    return any(origin_in(arg, origin) for arg in getattr(annotation, "__args__", ()) or ())


def _list_item(annotation: object) -> object:
    """The item type of the list (or tuple) in ``annotation``; None when there is none."""
    if getattr(annotation, "__origin__", None) in (list, tuple):
        return get_args(annotation)[0]
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _list_item(arg)
        if found is not None:
            return found
    return None
