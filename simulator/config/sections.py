"""The base of every scenario section: frozen, unknown keys rejected, strict types.

Strict means no silent conversions: `tp: true` or `tp: "4"` is refused where an integer is expected, and
`fold: 1` where a boolean is (YAML already gives numbers, booleans and strings their own types). Unit strings
are read by their own validators (`BeforeValidator`), so "25 MiB" still becomes a float.

Validators are built on first use (`defer_build`): a scenario is validated as a whole, so building one for
every section class at import (about 0.08 s CPU of each command) would only be thrown away.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic.json_schema import JsonDict

from simulator.errors import InputError, yaml_spelling

INT64_LIMIT = 2**63
"""Whole numbers at or beyond this are refused at load: they would fail in numpy, Arrow and the summary's JSON
after the run (a seed or a token count of 10^22 did, and a checkpoint interval of 10^30 steps)."""


class Section(BaseModel):
    """Base of every section: frozen, unknown keys rejected, no type coercion, no infinite or NaN number."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True, allow_inf_nan=False)


STORED_FIELD: JsonDict = {"stored": True}
"""The `json_schema_extra` of a field the loader stores for itself (`model.experts_dropped`, what `moe: null`
sets): read back from a stored scenario, but never offered to a user among a section's keys (`user_keys`)."""


def user_keys(section: object) -> list[str]:
    """The keys a user writes in ``section`` (a schema model; none for anything else), as a refusal lists them:
    its fields but those the loader stores for itself (marked `stored` as `STORED_FIELD` marks them, beside any
    other schema extras)."""
    fields = getattr(section, "model_fields", None) or {}
    return [name for name, info in fields.items()
            if not (isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("stored"))]


class FieldProblem(ValueError):
    """A section's check across its fields that blames one of them: ``path`` below the section, with its
    ``problem`` and what is ``allowed``. The loader reports it at that field (its line, its dotted name), as it
    does a field's own error."""

    def __init__(self, path: tuple[str, ...], problem: str, allowed: str = ""):
        super().__init__(problem)
        self.path = path
        self.problem = problem
        self.allowed = allowed


T = TypeVar("T")


def user_value(parse: Callable[[object], T]) -> Callable[[object], T]:
    """``parse`` (a reader of a user's value such as `parse_size`) as a field validator: its InputError becomes
    the ValueError pydantic reports, with what is allowed, which the loader locates at the field."""
    def convert(value: object) -> T:
        try:
            return parse(value)
        except InputError as exc:
            raise ValueError(f"{exc.problem} (allowed: {exc.allowed})") from None
    return convert


UNSET = "none"
"""The word that leaves an optional option set unset, as its default is written in the docs (`fsdp: none`), the
way `recompute: none` names a member of its own set: `--set parallelism.fsdp=none` undoes a file's `fsdp`."""


def unset_by_none(choices: Sequence[str]) -> BeforeValidator:
    """The validator of an optional option set of ``choices`` (a field `X | None = None`): `none` (UNSET) reads
    as left out; any other value outside ``choices`` is refused listing `none` with them."""
    def read(value: object) -> object:
        if value == UNSET:
            return None
        if value is not None and value not in choices:
            listed = [UNSET, *choices]
            raise ValueError(f"{yaml_spelling(value)} is not a valid choice (allowed: "
                             f"{', '.join(listed[:-1])} or {listed[-1]})")
        return value
    return BeforeValidator(read)
