"""Writers for a run's outputs: summary.json, timeline.parquet and trace.json (Chrome trace event format,
opens in the Perfetto UI). Everything is written to temporary names first and moved into place at the end,
so a failed run leaves no half-written output."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_summary(summary: dict, path: Path) -> None:
    """summary.json, keys sorted, floats as JSON numbers."""
    _atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n"))


def write_timeline(frame: pd.DataFrame, path: Path) -> None:
    """timeline.parquet, one row per op or flow."""
    _atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def chrome_trace(frame: pd.DataFrame, gpu_host: list[int]) -> dict:
    """Chrome trace events: a process per host (server), a thread per GPU stream; times in microseconds."""
    events: list[dict] = []
    threads: dict[tuple[int, str], int] = {}
    hosts = set()
    rows = frame[frame["rank"] >= 0]
    for rank, stream in sorted(set(zip(rows["rank"].tolist(), rows["stream"].tolist()))):
        host = gpu_host[rank]
        tid = len(threads) + 1
        threads[(rank, stream)] = tid
        if host not in hosts:
            hosts.add(host)
            events.append({"ph": "M", "name": "process_name", "pid": host, "tid": 0,
                           "args": {"name": f"host {host}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": host, "tid": tid,
                       "args": {"name": f"GPU {rank} {stream}"}})
    columns = [rows[c].tolist() for c in ("kind", "rank", "stream", "name", "category", "start_s", "end_s",
                                          "bytes", "flops", "src", "dst")]
    for kind, rank, stream, name, category, start, end, nbytes, flops, src, dst in zip(*columns):
        args = {"bytes": nbytes}
        if flops:
            args["flops"] = flops
        if kind == "flow":
            args.update(src=src, dst=dst)
        events.append({"ph": "X", "name": name, "cat": category or kind, "pid": gpu_host[rank],
                       "tid": threads[(rank, stream)], "ts": start * 1e6, "dur": (end - start) * 1e6,
                       "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_trace(frame: pd.DataFrame, gpu_host: list[int], path: Path) -> None:
    """trace.json for Perfetto / chrome://tracing."""
    trace = chrome_trace(frame, gpu_host)
    _atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(trace, separators=(",", ":"))))


def stage_timeline(frame: pd.DataFrame, summary: dict) -> pd.DataFrame:
    """The ops (no flows) of the lowest simulated rank of each pipeline stage; all ops when there is no
    pipeline layout (communication-only runs)."""
    ops = frame[frame["kind"] != "flow"]
    layout = summary.get("layout")
    if not layout:
        return ops.reset_index(drop=True)
    order = layout["order"]
    stride = 1
    for dim in order:
        if dim == "pp":
            break
        stride *= layout[dim]
    stages = (ops["rank"] // stride) % layout["pp"]
    first_rank = ops["rank"].groupby(stages).transform("min")
    return ops[ops["rank"] == first_rank].reset_index(drop=True)


def write_outputs(out_dir: Path, summary: dict, frame: pd.DataFrame, gpu_host: list[int],
                  timeline: str = "full") -> None:
    """Write a run's outputs into ``out_dir`` (created if needed): summary.json always; timeline.parquet and
    trace.json with every row (``full``), one rank per stage without flows (``per-stage``), or not at all
    (``summary``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if timeline != "summary":
        rows = frame if timeline == "full" else stage_timeline(frame, summary)
        write_timeline(rows, out_dir / "timeline.parquet")
        write_trace(rows, gpu_host, out_dir / "trace.json")
    write_summary(summary, out_dir / "summary.json")
