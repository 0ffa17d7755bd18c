"""The trace form of `workload:`: replay a profiler trace (Kineto) or a Chakra execution trace instead of a
list of collectives or a transformer model, with what-if knobs (compute speed, data-parallel degree)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from simulator.config.sections import Section, user_value

TraceFormat = Literal["kineto", "chakra-json"]


def _gpu_name(name: str) -> str:
    """A GPU the catalog has, checked when the scenario is read (the catalog is imported only then)."""
    from simulator.catalog.gpus import get_gpu

    get_gpu(name, "workload.traced_gpu")
    return name


class TraceWorkload(Section):
    """`trace`: a file or a glob (one file per rank), relative to the scenario's folder; `format`: kineto
    (PyTorch profiler Chrome-trace JSON) or chakra-json (Chakra execution trace as JSON).

    Compute keeps its traced durations times `compute_scale` and, with `traced_gpu` (the GPU the trace was
    taken on), times the ratio of the rates that bound each kernel on that GPU and on the cluster's
    (workload/traces/gpu_move.py: matmul, attention or memory-bound by its name). Collectives are re-costed on the
    cluster with the scenario's `collectives` settings. `dp` gives the job that many data-parallel replicas of
    the traced model, a multiple of the traced job's own d: its ranks are copied dp / d times, model-parallel
    groups and transfers inside each copy, data-parallel groups across all (workload/traces/program.py
    `_Replicas`, docs/traces.md). `host_gaps` keeps
    the idle time between a stream's ops that no dependency explains (kernel launch and Python overhead) as
    host time, so that a replay on the traced device reproduces the traced step. `recost_gemms` replaces the
    traced duration of every matrix multiply whose operand shapes the trace records (`record_shapes=True`) by
    the kernel model's time on the cluster's GPU (docs/cost-model.md), and warns where none records them. A
    trace states no tokens: give `tokens_per_step` (tokens one step of the traced job processes; replication
    multiplies them by the copies, `dp` over d) and `model_flops_per_token` (e.g. 6N plus attention) for
    throughput and MFU. `traced_tp`,
    `traced_pp`, `traced_cp` and `traced_ep` are the traced job's tensor-parallel size, pipeline stages,
    context- and expert-parallel sizes, which tell the dimension of a process group that the trace names only
    by number (workload/traces/layout.py); left out, they are told by the trace's named groups or inferred.
    """

    trace: str = Field(description="a file or a glob, relative to the scenario's folder")
    format: TraceFormat = "kineto"
    compute_scale: float = Field(default=1.0, gt=0)
    traced_gpu: Annotated[str, AfterValidator(user_value(_gpu_name))] | None = None
    dp: int | None = Field(default=None, ge=1, le=131_072)
    traced_tp: int | None = Field(default=None, ge=1, le=131_072)
    traced_pp: int | None = Field(default=None, ge=1, le=131_072)
    traced_cp: int | None = Field(default=None, ge=1, le=131_072)
    traced_ep: int | None = Field(default=None, ge=1, le=131_072)
    host_gaps: bool = True
    recost_gemms: bool = False
    tokens_per_step: int | None = Field(default=None, ge=1)
    model_flops_per_token: float | None = Field(default=None, gt=0)


TRACE_NO_OPS: dict[tuple[str, str], str] = {
    ("collectives", "sm_contention"): "a replayed trace's compute durations already include any slowdown from the "
                                      "NCCL kernels beside them",
}
"""The fields a replayed trace is not changed by, with why: a scenario that sets one is warned once, as for a
parameter-server run (parameter_server.PARAMETER_SERVER_NO_OPS)."""
