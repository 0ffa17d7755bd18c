"""YAML reading that remembers where each value came from, so errors can name FILE:LINE and the field path."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import yaml

from simulator.errors import InputError
from simulator.units import SEPARATED_WHOLE

FieldPath = tuple  # of str keys and int list indices


MAX_DEPTH = 64
"""Deepest nesting of mappings and lists a scenario or topology file may have (real ones need about 5)."""
MAX_VALUES = 500_000
"""Most values a file may hold once its aliases are expanded, so that an alias bomb (an anchor referenced
many times at each of several levels) is refused instead of exhausting memory."""


class _TooLarge(Exception):
    """The document nests too deeply or expands to too many values."""

    def __init__(self, problem: str, line: int):
        super().__init__(problem)
        self.problem, self.line = problem, line


class _LineLoader(yaml.SafeLoader):
    """A safe loader that refuses documents nested deeper than MAX_DEPTH while composing them."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooLarge(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


INT_TAG, FLOAT_TAG, BOOL_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"
_LineLoader.yaml_implicit_resolvers = {first: [(tag, regexp) for tag, regexp in resolvers
                                               if tag not in (INT_TAG, FLOAT_TAG, BOOL_TAG)]
                                       for first, resolvers in _LineLoader.yaml_implicit_resolvers.items()}
_YAML_1_2_INT = re.compile(rf"^(?:[-+]?[0-9]+|[-+]?{SEPARATED_WHOLE}|0o[0-7]+|0x[0-9a-fA-F]+)$")
_LineLoader.add_implicit_resolver(INT_TAG, _YAML_1_2_INT, list("-+0123456789"))
"""Whole numbers are YAML 1.2's: decimal (`010` is ten, `007` seven), `0o` octal and `0x` hexadecimal, and decimal
with thousands separators as trainsim prints them (`4,096`; inside `{seq_len: 4,096}` or `[1,024]` the comma
separates entries to YAML, which `_refuse_split_number` refuses). `1:30`, `0b101` and `1_0` are words (not YAML
1.1's base-60, binary and underscored ints), which a whole-number field refuses at their line."""
_LineLoader.add_implicit_resolver(FLOAT_TAG, re.compile(
    r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?$|^[-+]?\.(?:inf|Inf|INF)$|"
    r"^\.(?:nan|NaN|NAN)$"), list("-+0123456789."))
"""Numbers with a point or an exponent, such as 0.5, 4.8e10 and 1e9, are floats, as in YAML 1.2 and JSON (YAML 1.1
read 1e9 as a string and `1:30.0` as base-60 5,430.0)."""
_LineLoader.add_implicit_resolver(BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
"""Booleans are true and false alone, as in YAML 1.2 and JSON: YAML 1.1's yes, no, on and off are words, which a
boolean field refuses at their line (`restart.elastic: yes` ran as true though the types are strict)."""


def _construct_int(loader: _LineLoader, node: yaml.ScalarNode) -> int:
    """A YAML 1.2 whole number (PyYAML's own constructor reads a leading zero as octal)."""
    text = loader.construct_scalar(node).replace(",", "")
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    base = {"0o": 8, "0x": 16}.get(digits[:2], 10)
    return sign * int(digits[2:] if base != 10 else digits, base)


_LineLoader.add_constructor(INT_TAG, _construct_int)


INDENTATION = "the keys of one section indented alike, deeper than the key above them (spaces, not tabs)"
"""What a misindented key breaks, for PyYAML's 'expected <block end>, but found ...'."""

NESTED_UNDER_A_VALUE = ("a key at its section's indentation (not deeper, under a key that has a value), and a value "
                        "holding ': ' in quotes")
"""What PyYAML's 'mapping values are not allowed here' means: a key indented under a key that already has a value
(`topology: x` then a deeper `nodes: 2`), or an unquoted ': ' inside a value."""


def parse_value(text: str) -> object:
    """One YAML value as a scenario file reads it (`--set a.b=VALUE`): 1e8 is a float here too. Raises
    yaml.YAMLError for text that is no YAML value, or nests deeper than a scenario may, and SplitNumber for a
    number with thousands separators inside `{...}` or `[...]`, as a file's."""
    try:
        return _constructed(text, lambda node: _refuse_split_numbers(node, (), set()))
    except _TooLarge as exc:
        raise yaml.YAMLError(exc.problem) from None


def override_value(text: str) -> object:
    """A `--set NAME=VALUE`'s value, read exactly like a file's (`parse_value`): nothing is the empty text, and
    text that is no YAML value is kept as typed, for the field's own check to refuse it."""
    if not text.strip():
        return ""
    try:
        return parse_value(text)
    except yaml.YAMLError:
        return text


def set_text(name: str, value: object) -> str:
    """``name=value`` as `--set` takes it, the value written in YAML's flow style so that `override_value` reads
    it back as itself (as JSON where YAML's plain style would not: the text "1e8" reads as a number)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20).removesuffix("...\n").strip()
    if override_value(text) != value:
        text = json.dumps(value)
    return f"{name}={text}"


def _compose_lines(node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int]) -> None:
    """Record the line of every mapping key and sequence item by field path, aliases expanded (and bounded)."""
    lines.setdefault(path, node.start_mark.line + 1)
    if len(lines) > MAX_VALUES or len(path) > MAX_DEPTH:
        problem = (f"more than {MAX_VALUES:,} values once aliases are expanded" if len(lines) > MAX_VALUES
                   else f"nested deeper than {MAX_DEPTH} levels through aliases")
        raise _TooLarge(problem, node.start_mark.line + 1)
    _refuse_split_number(node, path)
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(None, None, "a key must be a plain value, not a list or "
                                                        "mapping", key_node.start_mark)
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


def _refuse_split_number(node: yaml.Node, path: FieldPath) -> None:
    """Raise SplitNumber where a `{...}` or `[...]` ``node`` at ``path`` holds a whole number with thousands
    separators, which YAML splits at its commas: `{seq_len: 4,096}` is `seq_len: 4` and a key `096` without a
    value, `[1,024, 2,048]` the four items 1, 24, 2 and 48. The tail is three digits right after the comma that
    follows a plain whole number (`[1, 024]` is two items as typed)."""
    if not getattr(node, "flow_style", False):
        return
    if isinstance(node, yaml.MappingNode):
        pairs = [(before[1], key, before[0].value) for before, (key, value) in zip(node.value, node.value[1:])
                 if _plain(value) and value.value == ""]
        kind = "{...} mapping"
    elif isinstance(node, yaml.SequenceNode):
        pairs = [(before, item, index) for index, (before, item) in enumerate(zip(node.value, node.value[1:]))]
        kind = "[...] list"
    else:
        return
    for head, tail, at in pairs:
        if (_plain(head) and _plain(tail) and re.fullmatch(r"[-+]?[1-9][0-9]{0,2}", head.value)
                and re.fullmatch(r"[0-9]{3}", tail.value) and tail.start_mark.index == head.end_mark.index + 1):
            raise SplitNumber(path + (at,), tail.start_mark.line + 1, f"{head.value},{tail.value}", kind)


def _plain(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.style is None


def _refuse_split_numbers(node: yaml.Node, path: FieldPath, seen: set[int]) -> None:
    """`_refuse_split_number` for ``node`` and every collection inside it, each (aliased) node once."""
    if id(node) in seen:
        return
    seen.add(id(node))
    _refuse_split_number(node, path)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            _refuse_split_numbers(value_node, path + (getattr(key_node, "value", ""),), seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_split_numbers(item, path + (index,), seen)


class SplitNumber(Exception):
    """A number with thousands separators inside `{...}` or `[...]`, which YAML splits at its commas."""

    def __init__(self, path: FieldPath, line: int, number: str, kind: str):
        super().__init__(path)
        self.path, self.line, self.number, self.kind = path, line, number, kind

    @property
    def problem(self) -> str:
        return f"{self.number} in a {self.kind} is two entries to YAML (its comma separates them)"

    @property
    def allowed(self) -> str:
        return f"{self.number.replace(',', '')} in the {self.kind.split()[0]}, or {self.number} on a line of its own"


class DuplicateKey(Exception):
    """A mapping names the same key twice (YAML would silently keep the last)."""

    def __init__(self, path: FieldPath, line: int, first_line: int):
        super().__init__(path)
        self.path, self.line, self.first_line = path, line, first_line


def _constructed(text: str, inspect: Callable[[yaml.Node], None]) -> object:
    """The data of ``text`` (None for no document), parsed once: its node tree goes to ``inspect`` (a check, or
    what records its lines) before it is constructed."""
    loader = _LineLoader(text)  # safe: _LineLoader is a SafeLoader
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        inspect(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_yaml_text(text: str, source: str, error: type[InputError]) -> tuple[object, dict[FieldPath, int]]:
    """Parse YAML text; return the data and a map from field path to line number (1-based). A key given twice
    in one mapping, nesting deeper than MAX_DEPTH and more than MAX_VALUES values are errors."""
    lines: dict[FieldPath, int] = {}
    try:
        return _constructed(text, lambda node: _compose_lines(node, (), lines)), lines
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        column = f" at column {mark.column + 1}" if mark is not None else ""
        # PyYAML words a misindented key as a block it expected to end, a tab as a character: say what is wrong.
        allowed = (INDENTATION if "<block" in problem or "'\\t'" in problem else
                   NESTED_UNDER_A_VALUE if "mapping values are not allowed" in problem else "")
        raise error(f"YAML syntax error{column}: {problem}", file=source, line=line, allowed=allowed) from None
    except DuplicateKey as duplicate:
        raise error(f"key given twice (first on line {duplicate.first_line})", field=dotted(duplicate.path),
                    allowed="each key once per section", file=source, line=duplicate.line) from None
    except SplitNumber as split:
        raise error(split.problem, field=dotted(split.path), file=source, line=split.line,
                    allowed=split.allowed) from None
    except _TooLarge as exc:
        raise error(f"the document is {exc.problem}", file=source, line=exc.line, allowed="a smaller file") from None


def read_user_text(path: str | Path, error: type[InputError], field: str = "", allowed: str = "") -> str:
    """The text of a user's file; a missing or unreadable file, or bytes that are not UTF-8, are an ``error``
    naming the file (and the line of the first bad byte)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read file: {exc.strerror}", field=field, allowed=allowed or "a readable file",
                    file=str(path)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"byte 0x{data[exc.start]:02x} is not UTF-8 text", field=field, file=str(path),
                    line=data.count(b"\n", 0, exc.start) + 1, allowed=allowed or "a UTF-8 text file") from None


def read_yaml(path: str | Path, error: type[InputError]) -> tuple[object, dict[FieldPath, int]]:
    """Read a YAML file; a missing or unreadable file is an ``error`` naming it."""
    return parse_yaml_text(read_user_text(path, error), str(path), error)


def line_of(lines: dict[FieldPath, int], path: FieldPath) -> int | None:
    """The line of ``path``, or of its nearest ancestor that has one (an index part is also looked up as the
    text of a mapping key: `parse_field` reads ``node.7`` as an index)."""
    while True:
        if path in lines:
            return lines[path]
        as_keys = tuple(str(part) if isinstance(part, int) else part for part in path)
        if as_keys in lines:
            return lines[as_keys]
        if not path:
            return None
        path = path[:-1]


def dotted(path: FieldPath) -> str:
    """``('parallelism', 'tp')`` -> ``parallelism.tp``; list indices as ``workload[2].bytes``; a mapping key that
    would not show (empty, or with spaces at an end: a component class's name) quoted in brackets,
    ``faults.components['']``, not ``faults.components.``. A key holding dots stays as it is: a sweep's axis
    (``grid.parallelism.tp``) reads as the path it names."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not part or part != part.strip():
            text += f"[{part!r}]"
        else:
            text += f".{part}" if text else str(part)
    return text


_FIELD_PART = re.compile(r"([^.\[\]]+)|\[([0-9]+)\]")
_FIELD_PATH = re.compile(r"[^.\[\]]+(?:\.[^.\[\]]+|\[[0-9]+\])*")
FIELD_PATH_EXAMPLE = "a field path such as parallelism.tp or workload[0].bytes"


def is_field_path(text: str) -> bool:
    """Whether ``text`` is a whole field path as a user writes one (not ``a..b``, ``workload[0`` or
    ``parallelism[tp]``, which `parse_field` would read as something else)."""
    return _FIELD_PATH.fullmatch(text) is not None


def parse_field(text: str) -> FieldPath:
    """The inverse of `dotted`: ``workload[0].bytes`` -> ``('workload', 0, 'bytes')``; a part of ASCII digits
    (``workload.0``) is an index too (a mapping key written so is found as its text, `set_field`). Text from a
    user is checked with `is_field_path` first."""
    return tuple(int(index) if index else (int(key) if key.isascii() and key.isdigit() else key)
                 for key, index in _FIELD_PART.findall(text))


def set_field(data: dict, path: FieldPath, value: object) -> None:
    """Set the field at ``path`` in YAML ``data`` in place, creating missing sections; a list index must name
    an item the list has. Raises ValueError naming the part of the path that cannot be set."""
    node: object = data
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        if isinstance(node, dict) and isinstance(part, int):
            part = str(part)
        if isinstance(node, dict) and isinstance(part, str):
            if last:
                node[part] = value
            elif node.get(part) is None:
                node[part] = {}
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            if last:
                node[part] = value
            node = node[part]
        elif isinstance(node, list):
            raise ValueError(f"{dotted(path[:depth])} has no item [{part}] (it has {len(node)})")
        else:
            raise ValueError(f"{dotted(path[:depth]) or 'the scenario'} is not "
                             f"{'a list' if isinstance(part, int) else 'a section'}")
