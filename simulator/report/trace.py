"""trace.json: the Chrome trace event format (opens in the Perfetto UI and chrome://tracing), streamed to the
file in chunks encoded by orjson, so that neither one dict per event for the whole run nor the whole text is
ever held at once.

A process per host (server) and a thread per GPU stream carry the op slices; times are in microseconds.
`run.trace` chooses what else goes in: `ops` nothing; `ops+links` (the default) a process "network links"
with one counter track per busy link (its utilisation in time bins, metrics/link_load.py); `full` also one
slice per network flow on the sending GPU's `net` thread. `run.trace_compress` gzips the stream
(trace.json.gz; the gzip header carries no time stamp or name, so the bytes stay deterministic).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import orjson

from simulator.metrics.link_load import LinkLoad

if TYPE_CHECKING:
    from simulator.topology.graph import Topology

CHUNK_ROWS = 20_000
"""Rows encoded per orjson call: large enough to amortise the call, small enough to bound memory."""
class _Sink(Protocol):
    """Where the encoded events go: the file, or the gzip stream over it."""

    def write(self, data: bytes, /) -> int: ...


Rows = Mapping[str, np.ndarray]
"""Timeline columns by name, one array each (a DataFrame's columns as numpy arrays, or the log's)."""

SLICE_COLUMNS = ("kind", "rank", "stream", "name", "category", "chunk", "start_s", "end_s", "bytes", "flops", "src",
                 "dst")


def trace_name(compress: bool) -> str:
    """The trace file's name: trace.json, or trace.json.gz when compressed."""
    return "trace.json.gz" if compress else "trace.json"


def _threads(rows: Rows, gpu_host: list[int]) -> tuple[dict[tuple[int, str], int], list[dict]]:
    """Thread ids per (rank, stream), in sorted order, and the process/thread name metadata events."""
    threads: dict[tuple[int, str], int] = {}
    hosts: set[int] = set()
    events: list[dict] = []
    for rank, stream in sorted(set(zip(rows["rank"].tolist(), rows["stream"].tolist()))):
        host = gpu_host[rank]
        threads[(rank, stream)] = len(threads) + 1
        if host not in hosts:
            hosts.add(host)
            events.append({"ph": "M", "name": "process_name", "pid": host, "tid": 0,
                           "args": {"name": f"host {host}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": host, "tid": threads[(rank, stream)],
                       "args": {"name": f"GPU {rank} {stream}"}})
    return threads, events


def _slices(rows: Rows, gpu_host: list[int], threads: dict[tuple[int, str], int]) -> Iterator[list[dict]]:
    """One complete ('X') event per row, in chunks of CHUNK_ROWS rows."""
    for offset in range(0, len(rows["rank"]), CHUNK_ROWS):
        events = []
        for kind, rank, stream, name, category, virtual_stage, start, end, nbytes, flops, src, dst in zip(
                *(rows[column][offset:offset + CHUNK_ROWS].tolist() for column in SLICE_COLUMNS)):
            args: dict = {"bytes": nbytes}
            if flops:
                args["flops"] = flops
            if virtual_stage >= 0:
                args["chunk"] = virtual_stage
            if kind == "flow":
                args["src"] = src
                args["dst"] = dst
            events.append({"ph": "X", "name": name, "cat": category or kind, "pid": gpu_host[rank],
                           "tid": threads[(rank, stream)], "ts": start * 1e6, "dur": (end - start) * 1e6,
                           "args": args})
        yield events


def _counters(load: LinkLoad, topology: Topology, pid: int) -> list[dict]:
    """The "network links" process and one counter track per link: a sample at each bin where the
    utilisation (rounded to 0.1 %) changes, and a last one back at zero at the end of the run."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": "network links (utilisation of line rate)"}}]
    times_us = (load.edges_s * 1e6).tolist()
    for link, values in zip(load.links, load.utilisation.round(3)):
        u, v = topology.link_ends[link]
        name = f"{u}->{v} {topology.link_class[link]}"
        changes = [0, *(1 + (values[1:] != values[:-1]).nonzero()[0]).tolist()]
        samples = values[changes].tolist()
        for index, value in zip(changes, samples):
            events.append({"ph": "C", "name": name, "pid": pid, "ts": times_us[index], "args": {"util": value}})
        events.append({"ph": "C", "name": name, "pid": pid, "ts": times_us[-1], "args": {"util": 0.0}})
    return events


def _write_events(stream: _Sink, chunks: Iterator[list[dict]]) -> None:
    stream.write(b'{"traceEvents":[')
    first = True
    for events in chunks:
        if not events:
            continue
        if not first:
            stream.write(b",")
        stream.write(orjson.dumps(events)[1:-1])
        first = False
    stream.write(b'],"displayTimeUnit":"ns"}')


def write_trace(path: Path, rows: Rows, topology: Topology, *, flows: bool, load: LinkLoad | None,
                compress: bool) -> None:
    """Stream the trace of ``rows`` (the SLICE_COLUMNS of the timeline's rows) to ``path``: op slices, flow
    slices when ``flows``, and link counter tracks when ``load`` is given."""
    kept = rows["rank"] >= 0
    if not flows:
        kept &= rows["kind"] != "flow"
    shown = {name: np.asarray(rows[name])[kept] for name in SLICE_COLUMNS}
    threads, metadata = _threads(shown, topology.gpu_host)

    def chunks() -> Iterator[list[dict]]:
        yield metadata
        yield from _slices(shown, topology.gpu_host, threads)
        if load is not None:
            yield _counters(load, topology, pid=topology.num_hosts)

    with open(path, "wb") as raw:
        if compress:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as stream:
                _write_events(stream, chunks())
        else:
            _write_events(raw, chunks())
