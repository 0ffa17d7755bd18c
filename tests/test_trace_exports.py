"""Kineto traces as real exports leave them: GPU-only exports of several profiled steps, traces without (or with
unresolved) cuda_sync Stream Wait Events, kernels-only exports, CPU ops cut short without a duration.

Each is the bundled two-rank trace (scenarios/traces/allreduce-2rank) edited as that export writes it. Its
full replay on two single-GPU ethernet-100g hosts with 100 Gb/s NICs: rank 1's GEMM (1,100 us) gates the
all-reduce, which waits for it through a Stream Wait Event; Adam (200 us) waits for the all-reduce; the
all-reduce is re-costed as a two-rank ring, NCCL's Simple base latency (8.4 us) and two transfers of n / 2:
1,100 + 8.4 + 2 x (14 + 16.78 MB / 11.75 GB/s = 1,427.85) + 200 us = 4,192.1 us.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from shared import (
    ALLREDUCE_BYTES,
    DATA,
    EXACT,
    KINETO_2RANK,
    NCCL_SIMPLE_BASE_S,
    SCENARIOS,
    copy_traces,
    run,
    transfer_s,
    two_rank_scenario,
)

from simulator.errors import TraceError
from simulator.workload.traces.kineto import read_kineto

FULL_STEP_S = 1100e-6 + NCCL_SIMPLE_BASE_S + 2 * transfer_s(100e9, ALLREDUCE_BYTES / 2) + 200e-6
"""The full trace's replayed step (module docstring)."""
H200_SCENARIO = SCENARIOS / "trace-h200-step.yaml"
H200_TRACE = SCENARIOS / "traces" / "h200-step" / "rank0.json.gz"


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
    """The trace profiled over three steps, 5 ms apart (new correlation ids each step), each marked on the GPU
    rows as Kineto marks a real step: a ProfilerStep#N `gpu_user_annotation` over the kernels that the host's
    ProfilerStep range launches itself, the forward's (here the GEMM on stream 7); the backward's come from
    autograd's thread and the optimizer's from its own nested annotation (here the all-reduce and Adam)."""
    gemm = next(event for event in events if "gemm" in event["name"] and event.get("cat") == "kernel")
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
                          "tid": 7, "ts": 5000 * number + gemm["ts"], "dur": gemm["dur"]}]
    return steps


def test_a_gpu_only_export_of_three_steps_replays_its_last_step(tmp_path):
    """Without host events nothing marked the step: all three ran as one, 14.576 ms for a 4.19 ms step. The
    kernels from the start of the last gpu_user_annotation on replay as the full one-step trace does, though the
    annotation ends with the GEMM."""
    many, warnings = step(tmp_path, lambda events: gpu_only(three_gpu_steps(events)))
    assert many == pytest.approx(FULL_STEP_S, rel=EXACT)
    assert not [warning for warning in warnings if "ProfilerStep" in warning]


def test_a_real_gpu_only_export_replays_the_whole_step_past_its_gpu_annotation(tmp_path):
    """The bundled H200 step (scenarios/trace-h200-step.yaml) exported GPU-only, as Perfetto or a filter keeps
    the GPU rows (every complete event of pid 0): its ProfilerStep#2 gpu_user_annotation spans 5,546.417 us,
    the forward's kernels, of a 16.2 ms step; the kernels from its start on replay as the full trace does."""
    doc = json.loads(gzip.decompress(H200_TRACE.read_bytes()))
    doc["traceEvents"] = [event for event in doc["traceEvents"] if event.get("pid") == 0 and event.get("ph") == "X"]
    annotation = next(event for event in doc["traceEvents"] if event.get("cat") == "gpu_user_annotation"
                      and event["name"].startswith("ProfilerStep#"))
    (tmp_path / "gpu-only.json").write_text(json.dumps(doc))
    scenario = H200_SCENARIO.read_text()
    _, full = run(scenario.replace("traces/h200-step/rank0.json.gz", str(H200_TRACE)), tmp_path)
    _, gpu = run(scenario.replace("traces/h200-step/rank0.json.gz", str(tmp_path / "gpu-only.json")), tmp_path)
    assert annotation["dur"] == pytest.approx(5546.417) and full.summary["step_time_s"] > 16e-3
    assert gpu.summary["step_time_s"] == pytest.approx(full.summary["step_time_s"], rel=EXACT)
    assert gpu.summary["warnings"] == full.summary["warnings"]


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
        "the GPU work runs on 2 streams and no resolvable cross-stream wait is recorded (no cuda_sync Stream Wait "
        "Event naming its streams, no cudaStreamWaitEvent call after a cudaEventRecord, which Kineto writes since "
        "kineto#808, September 2023) in 2 files of the trace: each stream keeps its traced idle time as host time, "
        "so the step cannot shrink below the traced waits and re-costed collectives hardly move it"]


def rank1_waits(folder: Path, edit) -> dict[str, tuple[str, ...]]:
    """Each GPU op of rank 1's bundled trace, edited by ``edit``, with the ops it waits for (by name)."""
    doc = json.loads((KINETO_2RANK / "rank1.json").read_text())
    doc["traceEvents"] = edit(doc["traceEvents"])
    (folder / "rank1.json").write_text(json.dumps(doc))
    ops = read_kineto(folder / "rank1.json").ops
    return {op.name: tuple(ops[dep].name for dep in op.deps) for op in ops}


def first_wait(*, recorded: bool, **changes) -> Callable[[list], list]:
    """An edit of rank 1's trace: its first Stream Wait Event (stream 20 on the GEMM of stream 7, before the
    all-reduce) with ``changes`` to its fields, the host's cudaEventRecord of the event it waits for kept or
    left out."""

    def edit(events: list) -> list:
        wait = next(event for event in events if event["name"] == "Stream Wait Event")
        record = wait["args"]["wait_on_cuda_event_record_corr_id"]
        for field, value in changes.items():
            (wait if field == "ts" else wait["args"])[field] = value
        return [event for event in events if recorded or (event.get("args") or {}).get("correlation") != record]

    return edit


def test_a_wait_without_its_record_allows_a_microsecond_of_timestamp_rounding(tmp_path):
    """Rank 1's GEMM runs from 20 to 1,120 us on stream 7. With the event's record gone, the wait on stream 7
    at 1,119.5 us (Kineto rounds each timestamp on its own) still falls on the GEMM: it ends within the
    WAIT_ROUNDING_S (1 us) after the wait; read strictly, no kernel of stream 7 had ended and the all-reduce
    would wait for nothing."""
    waits = rank1_waits(tmp_path, first_wait(recorded=False, ts=1119.5))
    assert waits["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"] == (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",)


def test_a_wait_on_a_stream_idle_in_the_step_is_not_rebuilt_from_the_host_calls(tmp_path):
    """A wait naming no stream (-1, CUDA 12.9+) is rebuilt from the host's calls: the cudaEventRecord at 30 us
    follows the GEMM's launch (5 us) on stream 7, so the all-reduce waits for the GEMM. A wait naming stream 9,
    which runs nothing in the step (its work was before the profile), waits for that: no dependency."""
    untold = rank1_waits(tmp_path, first_wait(recorded=True, wait_on_stream=-1, wait_on_cuda_event_record_corr_id=-1))
    idle = rank1_waits(tmp_path, first_wait(recorded=True, wait_on_stream=9))
    assert untold["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"] == (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",)
    assert idle["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"] == ()


def test_a_cpu_op_without_a_duration_is_left_out_of_a_gpu_trace_with_a_warning(tmp_path):
    """traceEvents[0] (aten::mm, the GEMM's launching op) cut short as a profile stopped mid-op: not replayed,
    so the replay is the full trace's."""

    def undated(events: list) -> list:
        del events[0]["dur"]
        return events

    kept, warnings = step(tmp_path, undated)
    assert kept == pytest.approx(FULL_STEP_S, rel=EXACT)
    assert [warning.split(": ", 1)[1] for warning in warnings if "without a duration" in warning] == [
        "traceEvents[0]: 2 events without a duration left out in 2 files of the trace, first: 'aten::mm' (only "
        "replayed ops need one)"]


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
