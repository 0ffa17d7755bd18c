"""The `ps:` section and the `parallelism.strategy` option set: data parallelism through parameter servers
instead of collectives (seed 001), with synchronous, asynchronous or stale-synchronous updates."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from simulator.config.faults import SlowdownDraw
from simulator.config.sections import FieldProblem, Section

Strategy = Literal["collective", "parameter_server"]
"""How data-parallel workers exchange gradients: collectives (all-reduce, ZeRO) or parameter servers."""
PSMode = Literal["sync", "async", "ssp"]
Sharding = Literal["by_size", "round_robin"]
MAX_ITERATIONS = 10_000
"""More simulated iterations than this is certainly a mistake (every worker's every iteration is simulated)."""
WORKER_PARALLELISM = {"tp": 1, "cp": 1, "pp": 1, "ep": 1, "zero": 0}
"""The parallelism fields a parameter-server run must leave at these values: each worker holds the whole model,
the servers the optimizer state."""
PARAMETER_SERVER_NO_OPS: dict[tuple[str, str], str] = {
    ("training", "grad_reduce_dtype"): "a parameter-server run pushes its gradients in the training precision",
    ("parallelism", "ddp"): "a parameter-server run pushes each worker's whole gradient after its backward, in no "
                            "buckets",
    ("parallelism", "sequence_parallel"): "a parameter-server worker runs no tensor parallelism",
    ("parallelism", "pipeline"): "a parameter-server worker runs no pipeline",
    ("parallelism", "cp_algorithm"): "a parameter-server worker runs no context parallelism",
    ("collectives", "algorithm"): "a parameter-server run sends its pushes and pulls as transfers, not collectives, "
                                  "and compares them with a ring all-reduce",
}
"""The fields `parallelism.strategy: parameter_server` is not changed by, with why: a scenario or a sweep axis that
sets one is warned once, as for a synthetic model (model_options.SYNTHETIC_NO_OPS)."""


class ParameterServerConfig(Section):
    """Parameter servers (docs/parameter_server.md). `servers`: how many hosts serve (the last hosts of the
    cluster), or the host indices that do; every GPU of the other hosts is a worker. `mode`: `sync` (servers
    wait for every worker each iteration), `async` (no waiting), `ssp` (a worker runs at most `staleness`
    iterations ahead of the slowest). `sharding`: parameter tensors over the servers `by_size` (largest first
    onto the least loaded server) or `round_robin`. `iterations` per worker are simulated; a worker's compute
    in each iteration is slowed by a factor drawn from `iteration_slowdown` (seeded by `run.seed`)."""

    servers: int | list[int] = Field(description="a count of server hosts such as 2 (the cluster's last hosts), "
                                                 "or a list of host indices such as [0, 3]")
    mode: PSMode = "sync"
    staleness: int | None = None
    sharding: Sharding = "by_size"
    iterations: int = Field(default=10, ge=1, le=MAX_ITERATIONS)
    iteration_slowdown: SlowdownDraw | None = None

    @model_validator(mode="after")
    def _staleness_with_ssp(self) -> ParameterServerConfig:
        if self.mode == "ssp" and self.staleness is None:
            raise FieldProblem(("mode",), "mode ssp needs the staleness bound k",
                               "staleness: k (iterations a worker may run ahead of the slowest)")
        if self.staleness is not None:
            if self.mode != "ssp":
                raise FieldProblem(("staleness",), f"staleness applies to mode ssp, not {self.mode}",
                                   "mode: ssp, or no staleness")
            if self.staleness < 0:
                raise FieldProblem(("staleness",), f"staleness {self.staleness} is negative",
                                   "0 or more iterations (0 waits like sync)")
        return self
