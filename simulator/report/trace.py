"""trace.json: the Chrome trace event format (opens in the Perfetto UI and chrome://tracing), streamed to the
file in chunks of rows, so that neither one dict per event for the whole run nor the whole text is ever held at
once.

A process per host (server) and a thread per GPU stream carry the op slices, with further threads (lanes)
where a stream's ops overlap in time; times are in microseconds.
`run.trace` chooses what else goes in: `ops` nothing; `ops+links` (the default) a process "network links"
with one counter track per busy link (its utilisation in time bins, metrics/link_load.py); `full` also one
slice per network flow on the sending GPU's `net` thread. A step struck by link faults has a process
"faults" with an instant event at each, and a slowed GPU's threads say its factor. `run.trace_compress` gzips the stream
(trace.json.gz; the gzip header carries no time stamp or name, so the bytes stay deterministic).

Times lie on a nanosecond grid: a slice's start and end are each rounded to the nanosecond and its duration is
their difference, so slices that meet in the run meet in the trace (Perfetto reads times to the nanosecond).
Bytes and FLOPs are integers, left out where zero; a compute slice carries its FLOPs, not its HBM bytes, which
timeline.parquet holds (where they are analysed) and which would add a distinct args object to nearly every
compute slice. A rank whose kernels all work on one virtual stage (no
interleaving) names it in its thread names, where the run has more than one (a run without a pipeline has only
stage 0, and every thread of it would say so), and only its slices of another stage carry `chunk`.

The events are encoded column by column rather than as one dict per event: what repeats across slices (a name,
a category, a thread, an args object) is encoded once, the times by orjson straight from arrays, and a chunk's
events are one join of these pieces.
"""

from __future__ import annotations

import gzip
import heapq
from collections.abc import Iterator, Mapping, Sequence
from json.encoder import encode_basestring
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import orjson

from simulator.metrics.events import COMPUTE_KIND, FLOW_KIND, Columns
from simulator.metrics.link_load import LinkLoad
from simulator.report.fault_marks import FaultMark
from simulator.report.layout_names import stands_for

if TYPE_CHECKING:
    from simulator.topology.graph import Topology

CHUNK_ROWS = 100_000
"""Rows encoded per chunk: large enough to amortise the numpy and orjson calls, small enough to bound memory."""


class _Sink(Protocol):
    """Where the encoded events go: the file, or the gzip stream over it."""

    def write(self, data: bytes, /) -> int: ...


def trace_name(compress: bool) -> str:
    """The trace file's name: trace.json, or trace.json.gz when compressed."""
    return "trace.json.gz" if compress else "trace.json"


def write_trace(path: Path, columns: Columns, topology: Topology, *, flows: bool, load: LinkLoad | None,
                compress: bool, weights: Mapping[int, int] | None = None, slowed: Mapping[int, str] | None = None,
                faults: Sequence[FaultMark] = ()) -> None:
    """Stream the trace of the timeline ``columns`` (kind, rank, stream, name, category, chunk, start_s, end_s,
    bytes, flops, src and dst at least) to ``path``: op slices, flow slices when ``flows``, link counter
    tracks when ``load`` is given, and an instant event per fault of ``faults`` on a "faults" track; each GPU's
    threads named with how many GPUs it stands for where ``weights`` (a fold by classes of unequal size, the
    summary's `rank_weights`) gives it, and with its slowdown where ``slowed`` gives one ("x1.3 slower")."""
    slices = _Slices(columns, topology.gpu_host, flows, weights or {}, slowed or {})

    def blobs() -> Iterator[bytes]:
        yield slices.metadata()
        yield from slices.encoded()
        if load is not None:
            yield _counters(load, topology, pid=topology.num_hosts)
        if faults:
            yield _fault_events(faults, pid=topology.num_hosts + 1)

    with open(path, "wb") as raw:
        if compress:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as stream:
                _write_events(stream, blobs())
        else:
            _write_events(raw, blobs())


class _Slices:
    """The slices of the shown rows (a GPU's ops; its flows only when asked for): per row, a code into a table
    of encoded text for each of its name, category, thread and args, and its start and end on the nanosecond
    grid."""

    def __init__(self, columns: Columns, gpu_host: list[int], flows: bool, weights: Mapping[int, int],
                 slowed: Mapping[int, str]):
        kind, category = columns["kind"], columns["category"]
        shown = columns["rank"][0] >= 0
        if not flows:
            shown &= ~_matches(*kind, FLOW_KIND)
        rows = np.flatnonzero(shown)
        rank, chunk = columns["rank"][0][rows], columns["chunk"][0][rows]
        compute = _matches(*kind, COMPUTE_KIND)[rows]
        single = _single_stages(rank, chunk, compute)
        self.start_ns = np.rint(columns["start_s"][0][rows] * 1e9)
        self.end_ns = np.rint(columns["end_s"][0][rows] * 1e9)
        named = single if (chunk > 0).any() else np.full_like(single, -1)  # one stage in all: nothing to tell
        thread, thread_table, self.metadata_events = _threads(rank, columns["stream"], rows, named, gpu_host,
                                                              (self.start_ns, self.end_ns), weights, slowed)
        name, names = _used(columns["name"][0][rows], columns["name"][1] or [])
        own_category = ~_matches(*category, "")[rows]
        cat, cat_rows = _combos(own_category, category[0][rows], kind[0][rows])
        cats = [_value(category if own_category[row] else kind, rows[row]) for row in cat_rows.tolist()]
        args = {"bytes": np.where(compute, 0, _integers(columns["bytes"][0][rows])),
                "flops": _integers(columns["flops"][0][rows]),
                "chunk": np.where(chunk == single[rank], -1, chunk), "src": columns["src"][0][rows],
                "dst": columns["dst"][0][rows]}
        arg, arg_rows = _combos(*args.values())
        self.codes = (name, cat, thread, arg)
        self.tables = (_objects('{"ph":"X","name":' + encode_basestring(value) for value in names),
                       _objects(',"cat":' + encode_basestring(value) for value in cats), thread_table,
                       _objects(_args_text({key: values[row] for key, values in args.items()})
                                for row in arg_rows.tolist()))

    def metadata(self) -> bytes:
        """The process and thread name events."""
        return orjson.dumps(self.metadata_events)[1:-1]

    def encoded(self) -> Iterator[bytes]:
        """The slices, CHUNK_ROWS at a time, each chunk one run of comma-separated events."""
        for offset in range(0, len(self.start_ns), CHUNK_ROWS):
            part = slice(offset, offset + CHUNK_ROWS)
            name, cat, thread, arg = (table[codes[part]].tolist() for table, codes in zip(self.tables, self.codes))
            start, end = self.start_ns[part], self.end_ns[part]
            yield _interleaved((name, cat, thread, _numbers(start / 1e3), ',"dur":', _numbers((end - start) / 1e3),
                                arg), len(start))


def _threads(rank: np.ndarray, stream: tuple[np.ndarray, list[str] | None], rows: np.ndarray, single: np.ndarray,
             gpu_host: list[int], times_ns: tuple[np.ndarray, np.ndarray], weights: Mapping[int, int],
             slowed: Mapping[int, str]) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Each row's thread (an index into the table), the table of each thread's pid, tid and ts key as text, and
    the process and thread name events: a process per host, a thread per GPU stream and lane (tids from 1 in
    (rank, stream, lane) order; `_lanes`), named with the rank's virtual stage where it has one (``single``,
    else -1), how many GPUs it stands for where ``weights`` gives it ('GPU 16 pp (virtual stage 0, stands for
    8 GPUs)') and its slowdown where ``slowed`` gives one ('GPU 8 compute (x1.3 slower)')."""
    codes, values = stream[0][rows], stream[1] or []
    order = {value: position for position, value in enumerate(sorted(set(values)))}
    stream_order = np.array([order[value] for value in values] or [0])[codes]
    lane = _lanes(_combos(rank, stream_order)[0], *times_ns)
    thread, thread_rows = _combos(rank, stream_order, lane)
    hosts: set[int] = set()
    events: list[dict] = []
    table = []
    for tid, row in enumerate(thread_rows.tolist(), start=1):
        gpu = int(rank[row])
        host = gpu_host[gpu]
        if host not in hosts:
            hosts.add(host)
            events.append({"ph": "M", "name": "process_name", "pid": host, "tid": 0,
                           "args": {"name": f"host {host}"}})
        notes = ([f"virtual stage {single[gpu]}"] if single[gpu] >= 0 else []) + (
            [stands_for(weights[gpu])] if gpu in weights else []) + ([slowed[gpu]] if gpu in slowed else [])
        extra = f", lane {lane[row] + 1}" if lane[row] else ""
        noted = f" ({', '.join(notes)})" if notes else ""
        events.append({"ph": "M", "name": "thread_name", "pid": host, "tid": tid,
                       "args": {"name": f"GPU {gpu} {values[codes[row]]}{extra}{noted}"}})
        table.append(f',"pid":{host},"tid":{tid},"ts":')
    return thread, _objects(table), events


def _lanes(stream: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Each slice's lane within its stream (``stream``: a code per slice): 0 where the stream's slices follow
    one another, else the lowest lane free at its start, in order of start (then end). Ops of one stream may
    overlap (a pipeline send beside a receive, a server's concurrent pushes, a GPU's flows), and slices that
    overlap on one thread without nesting are against the trace format: Perfetto drops them. Each stream's
    slices are one run of the sorted order, found by bisection (masking the whole order per stream costs
    streams x slices)."""
    lane = np.zeros(len(stream), dtype=np.int64)
    order = np.lexsort((end_ns, start_ns, stream))
    ordered = stream[order]
    clash = (ordered[1:] == ordered[:-1]) & (start_ns[order][1:] < end_ns[order][:-1])
    codes = np.unique(ordered[1:][clash])
    runs = zip(np.searchsorted(ordered, codes).tolist(), np.searchsorted(ordered, codes, side="right").tolist())
    for first, last in runs:
        rows = order[first:last]
        busy: list[tuple[float, int]] = []
        free: list[int] = []
        lanes = []
        for start, end in zip(start_ns[rows].tolist(), end_ns[rows].tolist()):
            while busy and busy[0][0] <= start:
                heapq.heappush(free, heapq.heappop(busy)[1])
            lanes.append(heapq.heappop(free) if free else len(busy))
            heapq.heappush(busy, (end, lanes[-1]))
        lane[rows] = lanes
    return lane


def _single_stages(rank: np.ndarray, chunk: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Per rank (indexed by rank, up to the largest shown), the virtual stage all its kernels (``kernel``
    rows) work on, where they have one and the same, else -1."""
    staged = kernel & (chunk >= 0)
    ranks, chunks = rank[staged], chunk[staged]
    pairs = _combos(ranks, chunks)[1]
    ranks, chunks = ranks[pairs], chunks[pairs]
    single = np.full(int(rank.max()) + 1 if len(rank) else 0, -1, dtype=np.int64)
    alone = np.bincount(ranks, minlength=len(single))[ranks] == 1
    single[ranks[alone]] = chunks[alone]
    return single


def _counters(load: LinkLoad, topology: Topology, pid: int) -> bytes:
    """The "network links" process and one counter track per link: a sample at each bin where the
    utilisation (rounded to 0.1 %) changes, and a last one back at zero at the end of the run. Nothing when no
    link carried a flow (a run on one GPU, or without flows): an empty process would only clutter the view."""
    if not load.links:
        return b""
    process = orjson.dumps({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                            "args": {"name": "network links (utilisation of line rate)"}})
    values = np.hstack((load.utilisation.round(3), np.zeros((len(load.links), 1))))
    sampled = np.ones(values.shape, dtype=bool)
    sampled[:, 1:-1] = values[:, 1:-1] != values[:, :-2]
    link, index = np.nonzero(sampled)
    names = []
    for link_id in load.links:
        u, v = topology.link_ends[link_id]
        names.append('{"ph":"C","name":' + encode_basestring(f"{u}->{v} {topology.link_class[link_id]}")
                     + f',"pid":{pid},"ts":')
    times_us = np.rint(load.edges_s * 1e9) / 1e3
    pieces = (_objects(names)[link].tolist(), _numbers(times_us[index]), ',"args":{"util":',
              _numbers(values[link, index]))
    return process + b"," + _interleaved(pieces, len(link), end="}}")


def _fault_events(faults: Sequence[FaultMark], pid: int) -> bytes:
    """The "faults" process: one thread-scoped instant event per link fault that struck the step, at its time,
    named by its kind and the link ("link down leaf0.r0-spine0")."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "faults"}},
                          {"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "faults"}}]
    events += [{"ph": "i", "s": "t", "name": f"{mark.kind} {mark.what}", "cat": "fault", "pid": pid, "tid": 1,
                "ts": float(np.rint(mark.at_s * 1e9)) / 1e3} for mark in faults]
    return orjson.dumps(events)[1:-1]


def _interleaved(pieces: tuple, rows: int, end: str = "") -> bytes:
    """Events as one UTF-8 text: row i is the i-th item of each of ``pieces`` in turn (a piece that is one
    string is the same in every row), then ``end``; rows separated by commas. (Joining str pieces and encoding
    once costs half of joining bytes, which reads each piece through the buffer protocol.)"""
    width = len(pieces) + 1
    parts: list[str] = [end + ","] * (rows * width)
    for position, piece in enumerate(pieces):
        parts[position::width] = [piece] * rows if isinstance(piece, str) else piece
    if parts:
        parts[-1] = end
    return "".join(parts).encode()


def _numbers(values: np.ndarray) -> list[str]:
    """Each number of a float or integer array as JSON text (orjson: the shortest text that reads back as it)."""
    if not len(values):
        return []
    return orjson.dumps(np.ascontiguousarray(values), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].decode().split(",")


def _integers(values: np.ndarray) -> np.ndarray:
    """Byte and FLOP counts rounded to integers (kept as floats beyond what an int64 holds)."""
    rounded = np.rint(values)
    return rounded.astype(np.int64) if not len(rounded) or np.abs(rounded).max() < 2.0**63 else rounded


def _args_text(args: dict) -> str:
    """The end of a slice: its args object and the closing brace. Of ``args`` (bytes, flops, chunk, src, dst, in
    that order) it holds the counts that are not zero and the others that are not -1: the virtual stage where it
    is not the one the rank's thread names give, a flow's source and destination GPU."""
    shown = {name: value.item() for name, value in args.items()
             if (value if name in ("bytes", "flops") else value >= 0)}
    return ',"args":' + orjson.dumps(shown).decode() + "}" if shown else "}"


def _matches(codes: np.ndarray, values: list[str] | None, wanted: str) -> np.ndarray:
    """Which rows of a text column are ``wanted``."""
    return np.array([value == wanted for value in values or [""]], dtype=bool)[codes]


def _value(column: tuple[np.ndarray, list[str] | None], row: int) -> str:
    """A text column's string in ``row``."""
    codes, values = column
    return (values or [""])[codes[row]]


def _objects(items) -> np.ndarray:
    """An object array of the items (text pieces), one empty piece where there are none."""
    pieces = list(items) or [""]
    found = np.empty(len(pieces), dtype=object)
    found[:] = pieces
    return found


def _used(codes: np.ndarray, values: list[str]) -> tuple[np.ndarray, list[str]]:
    """``codes`` renumbered over the values they use, and those values in order of their codes."""
    renumbered, holder = _combos(codes)
    return renumbered, [values[code] for code in codes[holder].tolist()]


def _combos(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct combinations of the rows' ``keys`` (number arrays), numbered in sorted order (first key
    first): each row's combination, and for each combination a row that has it."""
    rows = len(keys[0])
    combined = np.zeros(rows, dtype=np.int64)
    size = 1
    for key in keys:
        position, count = _ranked(key)
        if size * count >= 2**62:
            combined, size = _ranked(combined)
        combined = combined * count + position
        size *= count
    combination, count = _ranked(combined)
    holder = np.empty(count, dtype=np.int64)
    holder[combination] = np.arange(rows)
    return combination, holder


def _ranked(key: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's place among the distinct values of ``key`` (in sorted order) and how many there are; integers
    spanning a range no wider than about twice the rows are counted in it, others sorted and each row's place
    found by bisection among the distinct values (the 405B 8k trace's slice tables, whose byte and FLOP counts
    take a dozen values over 83,877 rows: 0.069 -> 0.049 s of CPU against np.unique's inverse; not faster where
    most values are distinct, which these tables do not meet)."""
    if not len(key):
        return np.zeros(0, dtype=np.int64), 0
    low = int(key.min())
    span = int(key.max()) - low + 1
    if key.dtype.kind in "biu" and span <= 2 * len(key) + 64:
        offset = key.astype(np.int64) - low
        present = np.bincount(offset, minlength=span) > 0
        place = np.cumsum(present) - 1
        return place[offset], int(place[-1]) + 1
    values = np.unique(key)
    return np.searchsorted(values, key), len(values)


def _write_events(stream: _Sink, blobs: Iterator[bytes]) -> None:
    stream.write(b'{"traceEvents":[')
    first = True
    for blob in blobs:
        if not blob:
            continue
        if not first:
            stream.write(b",")
        stream.write(blob)
        first = False
    stream.write(b"]}")
