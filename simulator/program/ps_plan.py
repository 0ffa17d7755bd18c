"""What a parameter-server step program tells its summary besides its ops (parameter_server/summary.py).

The summary reads the run back from the event log: it finds each push and pull by its op key and each server
update by its name, both looked up here, and the iteration of every op in the log's ``microbatch`` column,
which parameter-server programs fill with the iteration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from simulator.program.ops import Op


@dataclass(frozen=True)
class PsTransfer:
    """One push (worker -> server GPU) or pull (server GPU -> worker) of a stripe in an iteration."""

    pull: bool
    iteration: int
    worker: int
    endpoint: int


class PsModeEntries(TypedDict):
    """The servers' mode and, with ssp, its staleness bound: the first entries of the summary."""

    mode: str
    staleness: NotRequired[int]


class PsEntries(PsModeEntries):
    """The plan's entries of the `parameter_server` summary, written as they are (docs/parameter_server.md)."""

    sharding: str
    iterations: int
    server_hosts: list[int]
    server_gpus: list[int]
    workers: int
    worker_gpus: list[int]
    samples_per_iteration: int
    tokens_per_sample: int
    parameters: int
    parameter_bytes: int
    server_parameter_bytes: list[int]
    worker_compute_s: float
    memory_gib: NotRequired[dict]


@dataclass(frozen=True)
class PsPlan:
    """The plan of a parameter-server run: ``entries`` (its summary entries, which also give the workers, the
    server GPUs, the iterations and what an iteration trains), whether the servers wait for every push
    (``sync``), ``transfers`` by op key, ``update_owner`` (the name of each server update -> the worker whose
    gradient it applies; None for sync's one update per iteration, which applies every worker's), and
    ``comparison``: the ring all-reduce of the same gradient over the same workers, which the run's
    orchestrator runs alone on the cluster after the step."""

    entries: PsEntries
    sync: bool
    transfers: Mapping[str, PsTransfer]
    update_owner: Mapping[str, int | None]
    comparison: tuple[Op, ...]

    @property
    def workers(self) -> tuple[int, ...]:
        """The worker GPUs."""
        return tuple(self.entries["worker_gpus"])

    @property
    def endpoints(self) -> tuple[int, ...]:
        """The server GPUs."""
        return tuple(self.entries["server_gpus"])

    @property
    def iterations(self) -> int:
        return self.entries["iterations"]

    @property
    def samples_per_iteration(self) -> int:
        """The samples every worker together trains per iteration."""
        return self.entries["samples_per_iteration"]

    @property
    def tokens_per_sample(self) -> int:
        return self.entries["tokens_per_sample"]
