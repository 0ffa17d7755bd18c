"""FILE:LINE attached once, at the top: layers below the loaded scenario raise input errors with a field path
alone (`parallelism.tp`, `workload[2].group`), and the run's entry points call them through `located`, which
finds the field's line in the scenario's line table (or the `--set` that wrote it).

A module of its own, without the schema, so that `simulation.py` can import it and `trainsim collective`
still starts without pydantic."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from simulator.config.yaml_source import parse_field
from simulator.errors import InputError

if TYPE_CHECKING:
    from simulator.config.loader import LoadedScenario

T = TypeVar("T")


def located(loaded: LoadedScenario, build: Callable[[], T]) -> T:
    """Run ``build``; an input error raised without a file gets the scenario's file and the field's line."""
    try:
        return build()
    except InputError as exc:
        if exc.file:
            raise
        error = loaded.error(parse_field(exc.field), exc.problem, exc.allowed,
                             reads=tuple(parse_field(field) for field in exc.reads))
        raise error.rebuilt(type(exc)) from None
