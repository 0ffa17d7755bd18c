"""Outputs of a job simulation: job_summary.json, job_events.parquet, the healthy step's summary.json and
trace.json (trace.json.gz with `run.trace_compress`) with the first replication's failures, checkpoints,
restarts, degraded and straggling periods as Perfetto tracks (times in microseconds). They are written as a run
folder (report/run_folder.py): together into a temporary folder, moved in with a manifest, and the files of an
earlier run into the same folder removed. The
event table goes to Parquet straight from Arrow, dictionary-encoding only its two string columns (trying a
dictionary on the float columns, which have no repeats to find, doubled the write). `run_job` simulates a job and
writes them: the one path `trainsim run` and a sweep point take."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.config.reliability import BuiltInCause
from simulator.reliability.events import EventKind
from simulator.reliability.simulate import JobResult, simulate_job
from simulator.report.run_folder import RUN_FOLDER, write_run_folder
from simulator.report.trace import trace_name
from simulator.report.writers import run_identity, write_summary

if TYPE_CHECKING:
    from simulator.config.loader import LoadedScenario

TRACKS = {"failure": 1, "checkpoint": 2, "checkpoint_lost": 2, "restart": 3, "degraded": 4, "straggling": 4}
TRACK_NAMES = {1: "failures", 2: "checkpoints", 3: "restarts", 4: "degraded and straggling"}
RESTART_NAMES = {BuiltInCause.FAILURE: "restart after a failure", BuiltInCause.MAINTENANCE: "restart after maintenance",
                 BuiltInCause.REGROW: "restart to regrow"}


def event_name(kind: EventKind, cause: str, labels: dict[str, str]) -> str:
    """A trace slice's name: the failure class's label where the event has one, as the printed table names
    causes ('failure: GPU SRAM memory', not 'failure gpu_sram'), and what a restart follows in words ('restart
    after a failure', not 'restart failure')."""
    if kind == "restart":
        return RESTART_NAMES[BuiltInCause(cause)]
    if cause:
        return f"{kind}: {labels[cause]}"
    return kind.replace("_", " ")


def job_trace(events: pa.Table, labels: dict[str, str], replication: int = 0) -> dict:
    """Chrome trace events of one replication: one thread per track, failures as instants, each event named by
    `event_name` (``labels``: each failure class's label). ``events`` is
    sorted by replication. Times are in microseconds on a nanosecond grid, as in a step's trace (report/trace.py),
    and the file holds `traceEvents` alone: older Perfetto trace processors read a `displayTimeUnit` as the
    unit of `ts`. An event's args (`step`, whole steps as integers; `lost_work_s`; `hosts`; `tier` with an
    in-memory tier) leave out what is
    zero, as a step's trace leaves out zero bytes and FLOPs: a checkpoint or a restart loses no work and takes no
    hosts, and repeating it on every one of the 14,479 checkpoints of the 405B job's trace was a fifth of it."""
    bounds = np.searchsorted(events.column("replication").to_numpy(), [replication, replication + 1])
    rows = events.slice(int(bounds[0]), int(bounds[1] - bounds[0]))
    trace: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
                          "args": {"name": f"job, replication {replication}"}}]
    trace += [{"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": name}}
              for tid, name in TRACK_NAMES.items()]
    columns = [rows.column(c).to_pylist() for c in ("kind", "cause", "start_s", "end_s", "step", "lost_work_s",
                                                    "hosts")]
    # With an in-memory tier, args name each checkpoint's, failure's and restart's tier (memory or storage).
    tiers = rows.column("tier").to_pylist() if "tier" in rows.column_names else [""] * rows.num_rows
    for kind, cause, start, end, step, lost, hosts, tier in zip(*columns, tiers):
        start_ns, end_ns = round(start * 1e9), round(end * 1e9)
        event = {"name": event_name(kind, cause, labels), "cat": kind, "pid": 0, "tid": TRACKS[kind],
                 "ts": start_ns / 1e3}
        args = {"step": int(step) if step == int(step) else step, "lost_work_s": lost, "hosts": hosts, "tier": tier}
        shown = {name: value for name, value in args.items() if value}
        if shown:
            event["args"] = shown
        if kind == "failure":
            event.update(ph="i", s="t")
        else:
            event.update(ph="X", dur=(end_ns - start_ns) / 1e3)
        trace.append(event)
    return {"traceEvents": trace}


def run_job(loaded: LoadedScenario, out_dir: Path | None, *, force: bool = False,
            on_healthy_step: Callable[[dict], None] | None = None,
            progress: Callable[[int, int], None] | None = None, workers: int = 0,
            states_progress: Callable[[int, int], None] | None = None,
            states_sharing: Callable[[int], None] | None = None,
            foresight_progress: Callable[[int, int], None] | None = None,
            workers_warning: Callable[[str], None] | None = None,
            activity: Callable[[str], None] | None = None,
            sizes_progress: Callable[[int, int], None] | None = None) -> tuple[JobResult, list[str]]:
    """Simulate the job over `run.horizon` and write its run folder into ``out_dir`` (nothing when None), as
    `trainsim run` and a sweep point do; return the result and the names of the files written.
    ``on_healthy_step``, ``progress``, ``workers``, ``states_progress``, ``states_sharing``,
    ``foresight_progress``, ``workers_warning``, ``activity``, ``sizes_progress``: simulate_job's (the healthy
    step before the job; each replication; the cap on the processes simulating states ahead, each state they
    do, how many share those left, each replication of the
    pass that foresees those states, a worker that ended early or was not forked, the state a replication
    simulates, and each elastic size checked);
    ``activity`` then hears 'writing outputs' while the run folder is written (a large job's events take a while,
    and its progress line kept saying only that the replications were done)."""
    job = simulate_job(loaded, force=force, on_healthy_step=on_healthy_step, progress=progress, workers=workers,
                       states_progress=states_progress, states_sharing=states_sharing,
                       foresight_progress=foresight_progress,
                       workers_warning=workers_warning, activity=activity, sizes_progress=sizes_progress)
    if out_dir is None:
        return job, []
    if activity is not None:
        activity("writing outputs")
    return job, write_job_outputs(out_dir, job, loaded)


def write_job_outputs(out_dir: Path, job: JobResult, loaded: LoadedScenario) -> list[str]:
    """Write the job simulation's files into ``out_dir`` as one run folder; return their names, manifest last."""

    compress = loaded.scenario.run.trace_compress

    def write(stage: Path) -> None:
        pq.write_table(job.table, stage / "job_events.parquet", use_dictionary=["kind", "cause"])
        labels = {name: klass["label"] for name, klass in job.summary["failure_model"].items()}
        trace = orjson.dumps(job_trace(job.table, labels))
        (stage / trace_name(compress)).write_bytes(gzip.compress(trace, mtime=0) if compress else trace)
        write_summary(job.step_summary, stage / "summary.json")
        write_summary(job.summary, stage / "job_summary.json")

    return write_run_folder(out_dir, run_identity(loaded), write, RUN_FOLDER)
