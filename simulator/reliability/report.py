"""Outputs of a job simulation: job_summary.json, job_events.parquet, the healthy step's summary.json and
trace.json with the first replication's failures, checkpoints, restarts, degraded and straggling periods as Perfetto
tracks (times in microseconds). The event table and the trace are written to a temporary name and moved into
place; the two summaries are small JSON files written directly. The event table
goes to Parquet straight from Arrow, dictionary-encoding only its two string columns (trying a dictionary on the
float columns, which have no repeats to find, doubled the write)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.report.atomic import write_bytes, write_through_temporary
from simulator.report.writers import write_summary

JOB_FILES = ("job_summary.json", "job_events.parquet", "summary.json", "trace.json")
TRACKS = {"failure": 1, "checkpoint": 2, "checkpoint_lost": 2, "restart": 3, "degraded": 4, "straggling": 4}
TRACK_NAMES = {1: "failures", 2: "checkpoints", 3: "restarts", 4: "degraded and straggling"}


def job_trace(events: pa.Table, replication: int = 0) -> dict:
    """Chrome trace events of one replication: one thread per track, failures as instants. ``events`` is
    sorted by replication."""
    bounds = np.searchsorted(events.column("replication").to_numpy(), [replication, replication + 1])
    rows = events.slice(int(bounds[0]), int(bounds[1] - bounds[0]))
    trace: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
                          "args": {"name": f"job, replication {replication}"}}]
    trace += [{"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": name}}
              for tid, name in TRACK_NAMES.items()]
    columns = [rows.column(c).to_pylist() for c in ("kind", "cause", "start_s", "end_s", "step", "lost_work_s",
                                                    "hosts")]
    for kind, cause, start, end, step, lost, hosts in zip(*columns):
        event = {"name": f"{kind} {cause}".strip(), "cat": kind, "pid": 0, "tid": TRACKS[kind], "ts": start * 1e6,
                 "args": {"step": step, "lost_work_s": lost, "hosts": hosts}}
        if kind == "failure":
            event.update(ph="i", s="t")
        else:
            event.update(ph="X", dur=(end - start) * 1e6)
        trace.append(event)
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def write_job_outputs(out_dir: Path, summary: dict, events: pa.Table, step_summary: dict) -> None:
    """Write the job simulation's files into ``out_dir`` (created if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_through_temporary(out_dir / "job_events.parquet",
                            lambda tmp: pq.write_table(events, tmp, use_dictionary=["kind", "cause"]))
    write_bytes(out_dir / "trace.json", orjson.dumps(job_trace(events)))
    write_summary(step_summary, out_dir / "summary.json")
    write_summary(summary, out_dir / "job_summary.json")
