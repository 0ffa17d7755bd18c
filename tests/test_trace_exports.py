"""Kineto traces as real exports leave them: GPU-only exports of several profiled steps, traces without (or with
unresolved) cuda_sync Stream Wait Events, kernels-only exports, CPU ops cut short without a duration.

Each is the bundled two-rank trace (scenarios/traces/allreduce-2rank) edited as that export writes it. Its
full replay on two single-GPU ethernet-100g hosts with 100 Gb/s NICs: rank 1's GEMM (1,100 us) gates the
all-reduce, which waits for it through a Stream Wait Event; Adam (200 us) waits for the all-reduce; the
all-reduce is re-costed as a two-rank ring, NCCL's Simple base latency (8.4 us) and two transfers of n / 2:
1,100 + 8.4 + 2 x (14 + 16.78 MB / 11.75 GB/s) + 200 us = 4,193.9 us.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared import (
    ALLREDUCE_BYTES,
    DATA,
    EXACT,
    KINETO_2RANK,
    NCCL_SIMPLE_BASE_S,
    copy_traces,
    run,
    transfer_s,
    two_rank_scenario,
)

from simulator.errors import TraceError

FULL_STEP_S = 1100e-6 + NCCL_SIMPLE_BASE_S + 2 * transfer_s(100e9, ALLREDUCE_BYTES / 2) + 200e-6
"""The full trace's replayed step (module docstring)."""


def edited(folder: Path, edit) -> str:
    """The two-rank scenario of the bundled traces after ``edit(events)`` rewrote each rank's event list."""
    traces = copy_traces(KINETO_2RANK, folder)
    for path in sorted(traces.glob("rank*.json")):
        doc = json.loads(path.read_text())
        doc["traceEvents"] = edit(doc["traceEvents"])
        path.write_text(json.dumps(doc))
    return two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces))


def step(folder: Path, edit) -> tuple[float, list[str]]:
    """(step time, warnings) of the bundled traces edited by ``edit``."""
    _, result = run(edited(folder, edit), folder)
    return result.summary["step_time_s"], result.summary["warnings"]


def gpu_only(events: list) -> list:
    """What a GPU-only export keeps: the complete events of the GPU rows (kernels, cuda_sync, annotations), the
    NCCL kernel carrying its collective's args as recent PyTorch writes them."""
    comms = next(event["args"] for event in events if event["name"] == "record_param_comms")
    kept = [event for event in events if event.get("pid") == 0 and event.get("ph") == "X"]
    for event in kept:
        if event["name"].startswith("nccl"):
            event["args"].update(comms)
    return kept


def three_gpu_steps(events: list) -> list:
    """The trace profiled over three steps, 5 ms apart (new correlation ids each step), each marked as Kineto
    marks a step on the GPU rows: a ProfilerStep#N `gpu_user_annotation` per stream, spanning that stream's
    work of the step (stream 7 from the GEMM to Adam, stream 20 the all-reduce, which starts 1 ms in)."""
    steps = []
    for number in range(3):
        copy = json.loads(json.dumps(events))
        for event in copy:
            event["ts"] += 5000 * number
            args = event.get("args") or {}
            for key in ("correlation", "wait_on_cuda_event_record_corr_id"):
                if key in args:
                    args[key] += 100 * number
        steps += copy + [{"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{5 + number}", "pid": 0,
                          "tid": stream, "ts": 5000 * number + start, "dur": dur}
                         for stream, start, dur in ((7, 0, 4100), (20, 1020, 2800))]
    return steps


def test_a_gpu_only_export_of_three_steps_replays_its_last_step(tmp_path):
    """Without host events nothing marked the step: all three ran as one, 14.2 ms for a 4.19 ms step. The
    kernels inside the last gpu_user_annotation replay as the full one-step trace does."""
    many, warnings = step(tmp_path, lambda events: gpu_only(three_gpu_steps(events)))
    assert many == pytest.approx(FULL_STEP_S, rel=EXACT)
    assert not [warning for warning in warnings if "ProfilerStep" in warning]


def test_a_trace_marking_no_step_warns_that_it_is_replayed_whole(tmp_path):
    whole, warnings = step(tmp_path / "whole", gpu_only)
    assert whole == pytest.approx(FULL_STEP_S, rel=EXACT)
    assert [warning.split(": ", 2)[2] for warning in warnings if "ProfilerStep" in warning] == [
        "no ProfilerStep#N annotation marks a profiled step in 2 files of the trace: each is replayed whole as one "
        "step (a profile of several steps needs torch.profiler's schedule and prof.step())"]


def without_syncs(events: list) -> list:
    """The trace as Kineto before pytorch#119478 writes it: no cuda_sync events, the host's
    cudaEventRecord / cudaStreamWaitEvent calls kept."""
    return [event for event in events if event.get("cat") != "cuda_sync"]


def untold_waits(events: list) -> list:
    """The trace as Kineto on CUDA 12.9+ before kineto#1552 writes it: Stream Wait Events naming no stream
    waited on and no event record (-1)."""
    for event in events:
        if event.get("cat") == "cuda_sync":
            event["args"].update(wait_on_stream=-1, wait_on_cuda_event_record_corr_id=-1)
    return events


@pytest.mark.parametrize("edit", [without_syncs, untold_waits])
def test_cross_stream_waits_are_rebuilt_from_the_host_calls(tmp_path, edit):
    """The host records an event after launching the GEMM on stream 7 (cudaEventRecord at 30 us, after the
    launch at 5 us), stream 20 waits on it before the all-reduce is launched on it (cudaStreamWaitEvent at 45
    us, launch at 50 us); then an event after the all-reduce, which stream 7 waits on before Adam: the
    dependencies a Stream Wait Event gives, so the replay is the full trace's, not pinned to the traced 4 ms."""
    rebuilt, warnings = step(tmp_path, edit)
    assert rebuilt == pytest.approx(FULL_STEP_S, rel=EXACT)
    assert not [warning for warning in warnings if "cross-stream" in warning]


def test_kernels_on_two_streams_without_any_wait_warn_that_the_step_is_pinned(tmp_path):
    """A kernels-only export: nothing orders the streams, so each keeps its traced idle time as host time."""
    _, warnings = step(tmp_path, lambda events: [event for event in gpu_only(events) if event.get("cat") == "kernel"])
    assert [warning.split(": ", 2)[2] for warning in warnings if "cross-stream" in warning] == [
        "the GPU work runs on 2 streams and no cross-stream wait is recorded (no cuda_sync Stream Wait Event naming "
        "its streams, no cudaEventRecord / cudaStreamWaitEvent calls) in 2 files of the trace: each stream keeps "
        "its traced idle time as host time, so the step cannot shrink below the traced waits and re-costed "
        "collectives hardly move it"]


def test_a_cpu_op_without_a_duration_is_left_out_of_a_gpu_trace_with_a_warning(tmp_path):
    """traceEvents[0] (aten::mm, the GEMM's launching op) cut short as a profile stopped mid-op: not replayed,
    so the replay is the full trace's."""

    def undated(events: list) -> list:
        del events[0]["dur"]
        return events

    kept, warnings = step(tmp_path, undated)
    assert kept == pytest.approx(FULL_STEP_S, rel=EXACT)
    assert [warning.split(": ", 1)[1] for warning in warnings if "without a duration" in warning] == [
        "traceEvents[0]: 1 event without a duration left out: only replayed ops need one (first: 'aten::mm')"] * 2


def test_a_cpu_op_without_a_duration_is_refused_where_cpu_ops_are_replayed(tmp_path):
    doc = json.loads((DATA / "traces" / "torch_cpu_step.json").read_text())
    index = next(i for i, event in enumerate(doc["traceEvents"]) if event.get("cat") == "cpu_op")
    del doc["traceEvents"][index]["dur"]
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    with pytest.raises(TraceError) as caught:
        run(f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{tmp_path}/rank0.json', format: kineto}}\n",
            tmp_path)
    assert caught.value.field == f"traceEvents[{index}]"
    assert caught.value.problem.endswith("has no duration (dur)")
