"""YAML reading that remembers where each value came from, so errors can name FILE:LINE and the field path."""

from __future__ import annotations

from pathlib import Path

import yaml

from simulator.errors import InputError

FieldPath = tuple  # of str keys and int list indices


class _LineLoader(yaml.SafeLoader):
    """A safe loader that records the line of every mapping key and sequence item, by field path."""


def _compose_lines(node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            key = key_node.value
            child = path + (key,)
            if key in seen:
                raise DuplicateKey(child, key_node.start_mark.line + 1, lines[child])
            seen.add(key)
            lines[child] = key_node.start_mark.line + 1
            _compose_lines(value_node, child, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = path + (index,)
            lines[child] = item.start_mark.line + 1
            _compose_lines(item, child, lines)


class DuplicateKey(Exception):
    """A mapping names the same key twice (YAML would silently keep the last)."""

    def __init__(self, path: FieldPath, line: int, first_line: int):
        super().__init__(path)
        self.path, self.line, self.first_line = path, line, first_line


def parse_yaml_text(text: str, source: str, error: type[InputError]) -> tuple[object, dict[FieldPath, int]]:
    """Parse YAML text; return the data and a map from field path to line number (1-based). A key given twice
    in one mapping is an error."""
    try:
        node = yaml.compose(text, Loader=_LineLoader)
        data = yaml.load(text, Loader=_LineLoader) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"YAML syntax error: {problem}", file=source, line=line) from None
    lines: dict[FieldPath, int] = {}
    if node is not None:
        try:
            _compose_lines(node, (), lines)
        except DuplicateKey as duplicate:
            raise error(f"key given twice (first on line {duplicate.first_line})", field=dotted(duplicate.path),
                        allowed="each key once per section", file=source, line=duplicate.line) from None
    return data, lines


def read_yaml(path: str | Path, error: type[InputError]) -> tuple[object, dict[FieldPath, int]]:
    """Read a YAML file; a missing or unreadable file is an ``error`` naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read file: {exc.strerror if isinstance(exc, OSError) else exc}", file=str(path)) from None
    return parse_yaml_text(text, str(path), error)


def line_of(lines: dict[FieldPath, int], path: FieldPath) -> int | None:
    """The line of ``path``, or of its nearest ancestor that has one."""
    while True:
        if path in lines:
            return lines[path]
        if not path:
            return None
        path = path[:-1]


def dotted(path: FieldPath) -> str:
    """``('parallelism', 'tp')`` -> ``parallelism.tp``; list indices as ``workload[2].bytes``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text
