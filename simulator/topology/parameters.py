"""Builder parameters: each declared with the kind of value it takes and a default written as a user would
write it, read and checked the same way from topology files, a scenario's `cluster:` block and `--set`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from simulator.errors import InputError, TopologyError, yaml_spelling
from simulator.units import parse_bandwidth, parse_duration

ParamKind = Literal["count", "index", "ratio", "bandwidth", "duration", "text", "mapping", "list"]
"""How a builder parameter is read (`_READERS`) and bounded (`read_parameters`)."""


@dataclass(frozen=True)
class Param:
    """One builder parameter: how to read it (count, index, ratio, bandwidth, duration, text, mapping, list), default.

    ``default`` is written as a user would write it (e.g. "450 GB/s") and parsed like user input; None means the
    parameter is required unless ``optional`` is set. ``choices``: the values allowed, or an option set (a
    StrEnum), which the parameter is then read as.
    """

    kind: ParamKind
    default: object = None
    doc: str = ""
    choices: tuple | type[StrEnum] = ()
    optional: bool = False


def _read_integer(value: object) -> int:
    """An int, or text of ASCII digits after at most one minus sign ('²' and '--5' passed str.isdigit)."""
    digits = str(value).strip().removeprefix("-")
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not (digits.isascii() and digits.isdigit()):
        raise InputError(f"expected a whole number, got {yaml_spelling(value)}", allowed="an integer such as 8")
    return int(value)


def _read_ratio(value: object) -> float:
    text = str(value).strip()
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"expected a ratio, got {yaml_spelling(value)}",
                         allowed="a positive number such as 2 or '2:1'")
    try:
        if ":" in text:
            high, low = text.split(":", 1)
            ratio = float(high) / float(low)
        else:
            ratio = float(text)
    except (ValueError, ZeroDivisionError):
        raise InputError(f"cannot read ratio {value!r}", allowed="a positive number such as 2 or '2:1'") from None
    if not math.isfinite(ratio):
        raise InputError(f"ratio {value!r} is not finite", allowed="a positive number such as 2 or '2:1'")
    return ratio


def _read_typed(value: object, type_: type, what: str) -> object:
    if not isinstance(value, type_):
        raise InputError(f"expected {what}, got {yaml_spelling(value)}", allowed=what)
    return value


_READERS: dict[ParamKind, Callable[[object], object]] = {
    "count": _read_integer,
    "index": _read_integer,
    "ratio": _read_ratio,
    "bandwidth": parse_bandwidth,
    "duration": parse_duration,
    "text": lambda v: _read_typed(v, str, "a string"),
    "mapping": lambda v: _read_typed(v, dict, "a mapping of parameters"),
    "list": lambda v: _read_typed(v, list, "a list"),
}


MAX_COUNT = 2**17
"""The largest count any builder parameter accepts (131,072 servers, switches or GPUs per server), so that a
typo cannot make the builder run out of memory."""


def _whole_range(param: Param) -> str:
    """What a count or index parameter takes, from its bounds and default, in a scenario field's words: 'an
    integer from 1 to 131,072, 2 where not given'."""
    span = f"from 1 to {MAX_COUNT:,}" if param.kind == "count" else ">= 0"
    given = isinstance(param.default, int) and not isinstance(param.default, bool)
    return f"an integer {span}" + (f", {param.default:,} where not given" if given else "")


def read_parameters(spec: dict[str, Param], raw: object, prefix: str = "") -> dict:
    """Check ``raw`` against ``spec`` and return the parameters in SI units, defaults filled in. A required
    parameter set to null is refused by its reader (`got None`, as a scenario's fields), not called missing; a
    mapping under a plain parameter is "not a section", as `trainsim run --set` says of a key under a value."""
    where = prefix.rstrip(".")
    if not isinstance(raw, dict):
        raise TopologyError(f"expected a mapping of parameters, got {yaml_spelling(raw)}", field=where)
    for key in raw:
        if key not in spec:
            raise TopologyError(f"unknown parameter {key!r}", field=f"{prefix}{key}", allowed=", ".join(spec))
    parsed: dict[str, Any] = {}
    for name, param in spec.items():
        value = raw.get(name, param.default)
        if value is None and (param.optional or name not in raw):
            if not param.optional:
                raise TopologyError("missing required parameter", field=f"{prefix}{name}")
            parsed[name] = None
            continue
        try:
            result: Any = _READERS[param.kind](value)
        except InputError as exc:
            problem = f"{prefix}{name} is not a section" if isinstance(value, dict) else exc.problem
            takes = _whole_range(param) if param.kind in ("count", "index") else exc.allowed
            raise exc.rebuilt(TopologyError, problem=problem, field=f"{prefix}{name}", allowed=takes) from None
        if param.kind in ("count", "ratio", "bandwidth") and not result > 0:
            raise TopologyError(f"{value!r} must be positive", field=f"{prefix}{name}", allowed="a positive value")
        if param.kind == "count" and result > MAX_COUNT:
            raise TopologyError(f"{value!r} is beyond what a cluster holds", field=f"{prefix}{name}",
                                allowed=f"1..{MAX_COUNT}")
        if param.kind == "duration" and isinstance(result, float) and result < 0:
            raise TopologyError(f"{value!r} is negative", field=f"{prefix}{name}",
                                allowed="zero or a positive duration")
        if param.kind == "index" and result < 0:
            raise TopologyError(f"{value!r} is negative", field=f"{prefix}{name}", allowed="0, 1, 2, ...")
        allowed = tuple(param.choices)
        if allowed and result not in allowed:
            raise TopologyError(f"{value!r} is not supported", field=f"{prefix}{name}",
                                allowed=", ".join(map(str, allowed)))
        if isinstance(param.choices, type):
            result = param.choices(result)
        parsed[name] = result
    return parsed
