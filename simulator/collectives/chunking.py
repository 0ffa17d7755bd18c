"""One rule for a collective's pipelining chunk, however it is given (the schema's `collectives.chunk`, `trainsim
collective --chunk`, a request to plan); kept apart from the registry so that the schema loads no algorithm."""

from __future__ import annotations

from simulator.errors import InputError, ScenarioError
from simulator.units import parse_message_size, whole_bytes

CHUNK_FIELD = "collectives.chunk"
CHUNK_ALLOWED = "whole bytes from 1 B up to 1 PiB such as 4 MiB, or none (off) to turn chunking off"
CHUNKING_OFF = ("none", "off")


def chunk_bytes(value: object) -> float | None:
    """The pipelining chunk a user gives (`collectives.chunk`, `trainsim collective --chunk`): a size, or none
    (also `off`, which YAML reads as false) for no chunking."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in CHUNKING_OFF):
        return None
    try:
        nbytes = parse_message_size(value)
    except InputError as exc:
        raise exc.rebuilt(ScenarioError, field=CHUNK_FIELD, allowed=CHUNK_ALLOWED) from None
    check_chunk(nbytes, value)
    return nbytes


def check_chunk(nbytes: float | None, written: object = None) -> None:
    """The one check of a pipelining chunk (None: no chunking): whole bytes, at least 1 B, however it was given
    (a chunk of 1e-20 B cut a tree's buffer into 1e26 chunks)."""
    if nbytes is None:
        return
    shown = nbytes if written is None else written
    if not nbytes > 0:
        raise ScenarioError(f"chunk {shown!r} is not positive", field=CHUNK_FIELD, allowed=CHUNK_ALLOWED)
    try:
        whole_bytes(nbytes, shown, CHUNK_ALLOWED)
    except InputError as exc:
        raise exc.rebuilt(ScenarioError, field=CHUNK_FIELD, allowed=CHUNK_ALLOWED) from None
