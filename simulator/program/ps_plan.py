"""What a parameter-server step program tells its summary besides its ops (parameter_server/summary.py).

The summary reads the run back from the event log: it finds each push and pull by its op key and each server
update by its name, both looked up here, and the iteration of every op in the log's ``microbatch`` column,
which parameter-server programs fill with the iteration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from simulator.program.ops import Op


@dataclass(frozen=True)
class PsTransfer:
    """One push (worker -> server GPU) or pull (server GPU -> worker) of a stripe in an iteration."""

    pull: bool
    iteration: int
    worker: int
    endpoint: int


@dataclass(frozen=True)
class PsPlan:
    """The plan of a parameter-server run: ``entries`` (its summary entries, written as they are), the ``workers``
    and server GPUs (``endpoints``), ``iterations``, whether the servers wait for every push (``sync``),
    ``transfers`` by op key, ``update_owner`` (the name of each server update -> the worker whose gradient it
    applies; None for sync's one update per iteration, which applies every worker's), the samples and tokens
    an iteration trains, and ``comparison``: the ring all-reduce of the same gradient over the same workers,
    which the run's orchestrator runs alone on the cluster after the step."""

    entries: Mapping[str, object]
    workers: tuple[int, ...]
    endpoints: tuple[int, ...]
    iterations: int
    sync: bool
    transfers: Mapping[str, PsTransfer]
    update_owner: Mapping[str, int | None]
    samples_per_iteration: int
    tokens_per_sample: int
    comparison: tuple[Op, ...]
