"""The `ps:` section and the `parallelism.strategy` option set: data parallelism through parameter servers
instead of collectives (seed 001), with synchronous, asynchronous or stale-synchronous updates."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from simulator.config.faults import SlowdownDraw
from simulator.config.sections import Section

Strategy = Literal["collective", "parameter_server"]
"""How data-parallel workers exchange gradients: collectives (all-reduce, ZeRO) or parameter servers."""
PSMode = Literal["sync", "async", "ssp"]
Sharding = Literal["by_size", "round_robin"]
MAX_ITERATIONS = 10_000
"""More simulated iterations than this is certainly a mistake (every worker's every iteration is simulated)."""


class ParameterServerConfig(Section):
    """Parameter servers (docs/parameter_server.md). `servers`: how many hosts serve (the last hosts of the
    cluster), or the host indices that do; every GPU of the other hosts is a worker. `mode`: `sync` (servers
    wait for every worker each iteration), `async` (no waiting), `ssp` (a worker runs at most `staleness`
    iterations ahead of the slowest). `sharding`: parameter tensors over the servers `by_size` (largest first
    onto the least loaded server) or `round_robin`. `iterations` per worker are simulated; a worker's compute
    in each iteration is slowed by a factor drawn from `iteration_slowdown` (seeded by `run.seed`)."""

    servers: int | list[int]
    mode: PSMode = "sync"
    staleness: int | None = None
    sharding: Sharding = "by_size"
    iterations: int = Field(default=10, ge=1, le=MAX_ITERATIONS)
    iteration_slowdown: SlowdownDraw | None = None
