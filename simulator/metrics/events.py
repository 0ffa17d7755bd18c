"""The columnar event log: one row per executed op or network flow, appended cheaply while the clock runs and
moved into columns as it goes: numpy arrays for the metrics, an Arrow table for timeline.parquet and, on
request, a DataFrame.

Op rows and flow rows are kept apart, each with only the columns that vary for them (a flow row's kind, stream,
category, micro-batch, chunk and FLOPs are constants, an op row's src and dst), and each op row notes how many
flow rows came before it, so the DataFrame puts every row back in recording order. A row goes in as one tuple
appended to a list, and so does a replay: the engine logs some 70 k op rows and a quarter of a million flow
rows a step, and an append costs a quarter of an op row's three extends of typed `array` buffers (a third of a
flow row's seven appends to column arrays). Every `ROWS_PER_CHUNK` rows the tuples are moved into one array per
field (`_Rows`) and dropped: a tuple and its float objects cost about 250 bytes a row where the arrays cost 8 a
field (104 an op row, 56 a flow row), and a run's tuples, made while the cyclic collector is paused, all waited
for the first collection after it, which walked them (Llama 3 70B unfolded, 3.47 M op rows and 1.87 M flow
rows: that collection 2.2 -> 0.6 s of CPU, the peak 2,887 -> 2,567 MiB). A column is the concatenation of its
field's arrays, made when first read and kept for the next reader (`op_columns`, `columns`: the step metrics
and then the timeline); the flow columns are put in flow order once, when first read (`_FlowTable`, column by
column), and the metrics and the DataFrame share them. The flows of a replayed collective (engine/engine.py)
are kept as one block: a reference to the rows of its timing alone plus the time they are shifted by, expanded
with numpy at the end. Each flow row also keeps its route
(the tuple of directed link ids, shared with the topology's route cache), in flow order, for the per-link
utilisation of the trace; `route_table` gives them as flat arrays, the replayed rows' routes read once per
block, not once per row.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain, count
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Literal
from weakref import proxy

import numpy as np

from simulator.program.ops import Category

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

RowKind = Literal["compute", "collective", "flow"]
"""What a row of the log is: a compute op, one rank's part of a collective (or send/recv), or a network flow."""
COMPUTE_KIND: RowKind = "compute"
COLLECTIVE_KIND: RowKind = "collective"
FLOW_KIND: RowKind = "flow"
"""The row kinds, for selecting rows by the `kind` column: a misspelt name is an error, where a misspelt
string would select no rows."""
COLUMNS = ("kind", "rank", "stream", "name", "category", "microbatch", "chunk", "start_s", "end_s", "bytes",
           "flops", "src", "dst", "key")
INT_COLUMNS = ("rank", "microbatch", "chunk", "src", "dst")
FLOAT_COLUMNS = ("start_s", "end_s", "bytes", "flops")
TEXT_COLUMNS = ("kind", "stream", "name", "category", "key")
FLOW_COLUMNS = ("src", "dst", "start_s", "end_s", "bytes")
FLOW_ROW = ("key", *FLOW_COLUMNS, "route")
"""The fields of a single flow row's tuple, in order."""
FLOW_CONSTANTS = {"kind": FLOW_KIND, "stream": "net", "category": "", "microbatch": -1, "chunk": -1, "flops": 0.0}
"""The value of every flow row in the columns that do not vary between flows."""
OP_ROW = ("kind", "rank", "stream", "name", "category", "microbatch", "chunk", "start_s", "end_s", "bytes", "flops",
          "key", "flows_before")
"""The fields of an op row's tuple, in order: `EventLog.record`'s arguments, then how many flow rows came before
the row (which places it among them)."""
ROWS_PER_CHUNK = 1 << 16
"""Rows a log holds as tuples before it moves them into arrays (`_Rows`): large enough that the move is a few
numpy calls per field over many rows, small enough that the tuples are a few MB."""
OP_CONSTANTS = {"src": -1, "dst": -1}
"""The value of every op row in the columns that only flows fill."""
Columns = dict[str, tuple[np.ndarray, list[str] | None]]
"""Timeline columns by name as `EventLog.columns` gives them: numbers as arrays (distinct None), text as codes
into a list of its strings (which may repeat a string)."""


@dataclass(frozen=True)
class FlowBlock:
    """The flow rows of one collective timed alone, times relative to its start: what a replay logs again,
    shifted to each instance's start, without copying them row by row."""

    src: np.ndarray
    dst: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    nbytes: np.ndarray
    routes: FlowRoutes

    @classmethod
    def of(cls, src, dst, start_s, end_s, nbytes, routes: FlowRoutes) -> FlowBlock:
        return cls(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                   np.asarray(start_s, dtype=np.float64), np.asarray(end_s, dtype=np.float64),
                   np.asarray(nbytes, dtype=np.float64), routes)

    def __len__(self) -> int:
        return len(self.src)


@dataclass(frozen=True)
class FlowRoutes:
    """The route of each flow row, in flow order, flat: ``links`` holds the directed link ids of every route
    one after another, ``lengths[i]`` how many of them are flow i's. Under a replica quotient
    (engine/replicas.py) the flows marked in ``for_orbit`` stand for themselves and their images under the
    data-parallel shift, which were not sent: such a flow's bytes on link ``l`` are carried alike by every link
    whose orbit representative is ``representative[l]`` (both None without a quotient)."""

    lengths: np.ndarray
    links: np.ndarray
    representative: np.ndarray | None = None
    for_orbit: np.ndarray | None = None

    @classmethod
    def of(cls, routes: list[tuple[int, ...]]) -> FlowRoutes:
        lengths = np.fromiter(map(len, routes), dtype=np.int64, count=len(routes))
        return cls(lengths, np.fromiter(chain.from_iterable(routes), dtype=np.int64, count=int(lengths.sum())))

    @classmethod
    def of_matrix(cls, matrix: np.ndarray) -> FlowRoutes:
        """The routes of a matrix of link ids, one route per row from its first column on, -1 after its end."""
        on_route = matrix >= 0
        return cls(on_route.sum(axis=1), matrix[on_route])

    @classmethod
    def joined(cls, parts: Sequence[FlowRoutes]) -> FlowRoutes:
        """The routes of ``parts``, one after another."""
        return cls(np.concatenate([part.lengths for part in parts] or [np.empty(0, dtype=np.int64)]),
                   np.concatenate([part.links for part in parts] or [np.empty(0, dtype=np.int64)]))

    def __len__(self) -> int:
        return len(self.lengths)

    def starts(self) -> np.ndarray:
        """Where each route begins in ``links``."""
        return np.cumsum(self.lengths) - self.lengths

    def taken(self, rows: np.ndarray) -> FlowRoutes:
        """The routes of ``rows`` (indices into these), in that order."""
        lengths = self.lengths[rows]
        ends = np.cumsum(lengths)
        return FlowRoutes(lengths, self.links[np.repeat(self.starts()[rows] - (ends - lengths), lengths)
                                              + np.arange(int(ends[-1]) if len(ends) else 0)])

    def tolist(self) -> list[tuple[int, ...]]:
        """One tuple of link ids per flow."""
        if not len(self):
            return []
        return [tuple(route.tolist()) for route in np.split(self.links, np.cumsum(self.lengths)[:-1])]


@dataclass(frozen=True)
class FlowParts:
    """The flow rows as logged, replays not copied out: the single flows (``routes``, which carry the replica
    quotient's marks, and their times, bytes and key codes) and each replay's block (an index into ``blocks``),
    time shift and key code; key codes index ``keys``. What reads every flow's links once per block rather than
    once per replayed row (metrics/link_tiers.py)."""

    routes: FlowRoutes
    start_s: np.ndarray
    end_s: np.ndarray
    nbytes: np.ndarray
    key_codes: np.ndarray
    blocks: tuple[FlowBlock, ...]
    replay_block: np.ndarray
    replay_shift_s: np.ndarray
    replay_key: np.ndarray
    keys: list[str]


class _Rows:
    """Rows of one kind (the fields ``fields``) appended as tuples to ``pending`` and moved every `ROWS_PER_CHUNK`
    into one read-only array per field (numbers typed, text and routes as object arrays), so that a run holds
    arrays rather than millions of small objects; a column is its field's arrays joined, kept for the next
    reader."""

    def __init__(self, fields: tuple[str, ...]):
        self.fields = fields
        self.pending: list[tuple] = []
        self._parts: dict[str, list[np.ndarray]] = {name: [] for name in fields}
        self.moved = 0
        """Rows moved into arrays so far (the log reads it with ``pending`` for its count of flow rows)."""

    def __len__(self) -> int:
        return self.moved + len(self.pending)

    def move(self) -> None:
        """The pending rows into arrays, one per field."""
        rows = self.pending
        if not rows:
            return
        for index, name in enumerate(self.fields):
            values = map(itemgetter(index), rows)
            part = (np.fromiter(values, dtype=object, count=len(rows)) if _is_object(name)
                    else np.fromiter(values, dtype=_numpy_type(name), count=len(rows)))
            part.flags.writeable = False
            self._parts[name].append(part)
        self.moved += len(rows)
        rows.clear()

    def column(self, name: str) -> np.ndarray:
        """Field ``name`` of every row, in order (read-only)."""
        self.move()
        parts = self._parts[name]
        if len(parts) != 1:
            joined = (np.concatenate(parts) if parts
                      else np.empty(0, dtype=object if _is_object(name) else _numpy_type(name)))
            joined.flags.writeable = False
            parts[:] = [joined]
        return parts[0]


class EventLog:
    """Append-only columns. ``kind`` is one of compute, collective, flow; ``rank`` is a global GPU index
    (-1 for rows that belong to no single rank); ``src``/``dst`` are set for flows; ``microbatch`` is the
    pipeline micro-batch an op works on and ``chunk`` its virtual stage (-1 for none). ``flow_routes()[i]`` is the
    route of the i-th flow row."""

    def __init__(self) -> None:
        self._op_rows = _Rows(OP_ROW)
        """The op rows: their OP_ROW fields, the last of them how many flow rows came before each."""
        self._flows = _Rows(FLOW_ROW)
        """The single flow rows: their FLOW_ROW fields."""
        self._table: _FlowTable | None = None
        """The flow rows split into columns, made when first read (`_flow_table`)."""
        self._blocks: list[FlowBlock] = []
        self._block_index: dict[int, tuple[int, int]] = {}
        self._replays: list[tuple[int, int, float, str]] = []
        """Per replay, its block's index in ``_blocks``, how many single flow rows came before it, the time its
        rows are shifted by and its key."""
        self._replayed_rows = 0
        self._orbit_representative: np.ndarray | None = None
        self.flow_images = 1
        """How many flows each flow row the network logs stands for: itself and its images (a replica quotient)."""

    def stand_for_orbits(self, representative: np.ndarray, images: int) -> None:
        """Mark the flows the network logs as standing for their ``images`` under a replica quotient whose
        links map to ``representative`` (replayed collectives, timed alone, keep every flow they have)."""
        self._orbit_representative = representative
        self.flow_images = images

    def record(self, kind: RowKind, rank: int, stream: str, name: str, category: Category, microbatch: int, chunk: int,
               start_s: float, end_s: float, nbytes: float = 0.0, flops: float = 0.0, key: str = "") -> None:
        """One op row (compute or collective). The engine passes every argument by position: a call by keyword
        costs twice as much, and this is called once per op (the flow rows before it are counted from the fields of
        ``_flows``, without a call of its ``__len__``)."""
        rows, flows = self._op_rows.pending, self._flows
        rows.append((kind, rank, stream, name, category, microbatch, chunk, start_s, end_s, nbytes, flops, key,
                     flows.moved + len(flows.pending) + self._replayed_rows))
        if len(rows) == ROWS_PER_CHUNK:
            self._op_rows.move()

    def flow(self, key: str, src: int, dst: int, start_s: float, end_s: float, nbytes: float,
             route: tuple[int, ...]) -> None:
        """One flow row of collective ``key``: ``nbytes`` from GPU ``src`` to ``dst`` over ``route``."""
        rows = self._flows.pending
        rows.append((key, src, dst, start_s, end_s, nbytes, route))
        if len(rows) == ROWS_PER_CHUNK:
            self._flows.move()

    def replayed_flows(self, key: str, shift_s: float, block: FlowBlock) -> None:
        """The rows of ``block`` as flows of collective ``key``, their times moved on by ``shift_s``."""
        found = self._block_index.get(id(block))
        if found is None:
            found = self._block_index[id(block)] = (len(self._blocks), len(block))
            self._blocks.append(block)
        index, rows = found
        self._replays.append((index, len(self._flows), shift_s, key))
        self._replayed_rows += rows

    def __len__(self) -> int:
        return self._ops() + len(self._flows) + self._replayed_rows

    def _ops(self) -> int:
        return len(self._op_rows)

    def flows_per_op(self) -> float:
        """The flows logged per op logged so far (0 before any op): what sizes the next run of a step whose run
        is given up part way (simulation.py), whose flows no estimate counts."""
        ops = self._ops()
        return (len(self._flows) + self._replayed_rows) / ops if ops else 0.0

    def _op_column(self, name: str) -> np.ndarray:
        """Column ``name`` of the op rows (numbers as arrays, text as object arrays), read-only: kept by the log
        for the next reader (the step metrics read some that the timeline then reads again); a row recorded
        since is in the next read."""
        if name in OP_CONSTANTS:
            column = np.full(len(self._op_rows), OP_CONSTANTS[name], dtype=np.int64)
            column.flags.writeable = False
            return column
        return self._op_rows.column(name)

    def _flow_table(self) -> _FlowTable:
        """The flow rows as columns, split once and made again only if flows were logged since."""
        if self._table is None or self._table.logged != (len(self._flows), len(self._replays)):
            self._table = _FlowTable(self)
        return self._table

    def flow_routes(self) -> list[tuple[int, ...]]:
        """The route of each flow row, in flow order (a list built on each call: read it once, at the end)."""
        table = self._flow_table()
        layout = table.layout
        pool = _objects((route for block in self._blocks for route in block.routes.tolist()),
                        int(layout.pool_start[-1]))
        routes = table.routes()
        return layout.merged(_objects(routes, len(routes)), pool[layout.gather]).tolist()

    def route_table(self) -> FlowRoutes:
        """The route of each flow row, in flow order, as flat arrays (``flow_routes`` without a tuple per row)."""
        table = self._flow_table()
        layout = table.layout
        singles = table.logged[0]
        pool = FlowRoutes.joined([FlowRoutes.of(table.routes()), *(block.routes for block in self._blocks)])
        routes = pool.taken(layout.merged(np.arange(singles), singles + layout.gather))
        if self._orbit_representative is None:
            return routes
        for_orbit = layout.merged(np.ones(singles, dtype=bool), np.zeros(len(layout.gather), dtype=bool))
        return replace(routes, representative=self._orbit_representative, for_orbit=for_orbit)

    def flow_parts(self) -> FlowParts:
        """The flow rows as logged, single flows apart from the replayed blocks (`FlowParts`)."""
        table = self._flow_table()
        singles, layout = table.logged[0], table.layout
        codes, keys = table.keys()
        code_of = {key: code for code, key in enumerate(keys)}
        routes = FlowRoutes.of(table.routes())
        if self._orbit_representative is not None:
            routes = replace(routes, representative=self._orbit_representative,
                             for_orbit=np.ones(singles, dtype=bool))
        blocks = np.fromiter((replay[0] for replay in self._replays), dtype=np.int64, count=len(self._replays))
        flows = self._flows
        return FlowParts(routes, flows.column("start_s")[:singles], flows.column("end_s")[:singles],
                         flows.column("bytes")[:singles], codes[layout.single_rows], tuple(self._blocks), blocks,
                         layout.shifts,
                         np.fromiter(map(code_of.__getitem__, layout.keys), dtype=np.int64, count=len(layout.keys)),
                         keys)

    def op_columns(self, names: tuple[str, ...] = COLUMNS) -> dict[str, np.ndarray]:
        """The op rows alone (compute and collective), in recording order: the columns of COLUMNS among
        ``names``, text columns as object arrays (read-only: the log keeps them for the next reader)."""
        return {name: self._op_column(name) for name in (*INT_COLUMNS, *FLOAT_COLUMNS, *TEXT_COLUMNS)
                if name in names}

    def flow_columns(self, names: tuple[str, ...] = ("key", *FLOW_COLUMNS)) -> dict[str, np.ndarray]:
        """The flow rows alone, in order: of ``key`` (object array) and the FLOW_COLUMNS, those in ``names``
        (the numbers read-only: the log keeps them for the next reader)."""
        table = self._flow_table()
        found = {name: table.number(name) for name in FLOW_COLUMNS if name in names}
        if "key" in names:
            codes, keys = table.keys()
            found["key"] = _objects(keys, len(keys))[codes]
        return found

    def flow_keys(self) -> tuple[np.ndarray, list[str]]:
        """Each flow row's key as a code into the distinct keys (in order of first appearance), and those keys."""
        return self._flow_table().keys()

    def to_frame(self) -> pd.DataFrame:
        """The log as a DataFrame, rows in recording order: int64 and float64 columns, and text columns of the
        dtype pandas infers for lists of strings (`str`, on Arrow), built from each column's distinct strings
        and per-row codes (a replayed block's key coded once) rather than from a Python object per row."""
        import pandas as pd

        if not len(self):
            return pd.DataFrame({name: [] for name in COLUMNS}, columns=list(COLUMNS))
        data = {name: values if distinct is None else _strings(values, distinct)
                for name, (values, distinct) in self.columns().items()}
        return pd.DataFrame(data, columns=list(COLUMNS))

    def columns(self) -> Columns:
        """Each of COLUMNS over all rows in recording order: numbers as arrays (distinct None), text as codes
        into a list of distinct strings (`decoded` gives the strings, `arrow_table` the table of them all)."""
        ops = self._ops()
        table = self._flow_table()
        flows = {name: table.number(name) for name in FLOW_COLUMNS}
        total = ops + len(flows["src"])
        if not total:
            return {name: (np.empty(0, dtype=np.int32 if name in TEXT_COLUMNS else _numpy_type(name)),
                           [] if name in TEXT_COLUMNS else None) for name in COLUMNS}
        op_rows = np.arange(ops) + self._op_column("flows_before")
        is_flow = np.ones(total, dtype=bool)
        is_flow[op_rows] = False
        flow_rows = np.flatnonzero(is_flow)
        flow_values: dict[str, Any] = {**FLOW_CONSTANTS, **flows, "rank": flows["src"]}
        data: dict[str, tuple[np.ndarray, list[str] | None]] = {}
        for name in COLUMNS:
            if name in TEXT_COLUMNS:
                distinct: list[str] = []
                merged = np.empty(total, dtype=np.int32)
                merged[op_rows] = _codes(self._op_column(name).tolist(), distinct)
                if name in ("name", "key"):
                    codes, keys = table.keys()
                    merged[flow_rows] = codes + len(distinct)
                    distinct.extend(keys)
                else:
                    merged[flow_rows] = _codes([flow_values[name]], distinct)[0]
                data[name] = (merged, distinct)
            else:
                own = self._op_column(name)
                merged = np.empty(total, dtype=own.dtype)
                merged[op_rows] = own
                merged[flow_rows] = flow_values[name]
                data[name] = (merged, None)
        return data


class _FlowTable:
    """The flow rows as columns in flow order, each split off the log's tuples once, when first read: the
    FLOW_COLUMNS (read-only arrays) and each row's key as a code into the distinct keys (in order of first
    appearance); ``layout`` says where the single and replayed rows go, ``logged`` how many single rows and
    replays the log held when the table was made."""

    def __init__(self, log: EventLog):
        self.log = proxy(log)
        """The log, which owns this table: a strong reference back made the pair a cycle, which only the cyclic
        collector frees (paused while a simulation runs, simulator/collector.py), so every finished run's rows
        waited for it (a 16,384-GPU job's straggler state: ~0.6 M tuples, most of the 0.35 s `gc.collect(0)`
        after it). A weak proxy: a table kept after its log is freed raises ReferenceError when it reads the log,
        so keep the log, not the table."""
        self.layout = _Layout(log)
        self.logged = (len(log._flows), len(log._replays))
        self._numbers: dict[str, np.ndarray] = {}
        self._keys: tuple[np.ndarray, list[str]] | None = None

    def number(self, name: str) -> np.ndarray:
        """One of FLOW_COLUMNS: replayed rows copied from their block, their times shifted."""
        if name not in self._numbers:
            log, layout = self.log, self.layout
            dtype = np.int64 if name in INT_COLUMNS else np.float64
            own = log._flows.column(name)[:self.logged[0]]
            field = "nbytes" if name == "bytes" else name
            pool = np.concatenate([getattr(block, field) for block in log._blocks] or [np.empty(0, dtype)])
            replayed = pool[layout.gather]
            if name in ("start_s", "end_s"):
                replayed = replayed + np.repeat(layout.shifts, layout.sizes)
            column = layout.merged(own, replayed)
            column.flags.writeable = False
            self._numbers[name] = column
        return self._numbers[name]

    def keys(self) -> tuple[np.ndarray, list[str]]:
        """Each row's key code and the distinct keys the codes index."""
        if self._keys is None:
            log, (singles, replays) = self.log, self.logged
            first: dict[str, int] = {}  # each key's first position in the single rows' keys, then the replays'
            single_first = np.fromiter(map(first.setdefault, log._flows.column("key")[:singles].tolist(), count()),
                                       dtype=np.int64, count=singles)
            replay_first = np.fromiter(map(first.setdefault, self.layout.keys, count(singles)), dtype=np.int64,
                                       count=replays)
            code_at = np.zeros(singles + replays, dtype=np.int64)
            code_at[list(first.values())] = np.arange(len(first))
            self._keys = (code_at[self.layout.merged(single_first, np.repeat(replay_first, self.layout.sizes))],
                          list(first))
        return self._keys

    def routes(self) -> list[tuple[int, ...]]:
        """The single rows' routes, in logging order."""
        return self.log._flows.column("route")[:self.logged[0]].tolist()


class _Layout:
    """Where the single flows and the replayed blocks' rows go in flow order (a replay's rows come before the
    single flows logged after it), which row of the blocks' pool each replayed row copies, and each replay's
    time shift (``shifts``) and key (``keys``)."""

    def __init__(self, log: EventLog):
        singles = len(log._flows)
        block_sizes = np.array([len(block) for block in log._blocks], dtype=np.int64)
        self.pool_start = np.concatenate(([0], np.cumsum(block_sizes)))
        index, before_rows, shifts, keys = zip(*log._replays) if log._replays else ((), (), (), ())
        self.keys: tuple[str, ...] = keys
        blocks, before = np.array(index, dtype=np.int64), np.array(before_rows, dtype=np.int64)
        self.shifts = np.array(shifts, dtype=np.float64)
        self.sizes = block_sizes[blocks]
        replayed = int(self.sizes.sum())
        prior = np.cumsum(self.sizes) - self.sizes
        self.gather = np.repeat(self.pool_start[blocks] - prior, self.sizes) + np.arange(replayed)
        self.replayed_rows = np.repeat(before, self.sizes) + np.arange(replayed)
        rows_up_to = np.concatenate(([0], np.cumsum(self.sizes)))
        self.single_rows = np.arange(singles) + rows_up_to[np.searchsorted(before, np.arange(singles),
                                                                           side="right")]

    def merged(self, singles: np.ndarray, replayed: np.ndarray) -> np.ndarray:
        merged = np.empty(len(singles) + len(replayed), dtype=singles.dtype)
        merged[self.single_rows] = singles
        merged[self.replayed_rows] = replayed
        return merged


def _codes(values: Sequence[str], distinct: list[str]) -> np.ndarray:
    """Each value's index in ``distinct``, to which the values not seen before in this call are added in order
    of first appearance (a value may then appear in ``distinct`` more than once, which decoding does not mind).
    One pass of C calls over the values: each value's first position (`dict.setdefault`), numbered in numpy."""
    first: dict[str, int] = {}
    first_at = np.fromiter(map(first.setdefault, values, count()), dtype=np.int64, count=len(values))
    code_at = np.empty(len(values), dtype=np.int64)
    code_at[list(first.values())] = np.arange(len(distinct), len(distinct) + len(first))
    distinct.extend(first)
    return code_at[first_at]


def _is_object(name: str) -> bool:
    """Whether a row field is held as Python objects (text, a flow's route) rather than as numbers."""
    return name in TEXT_COLUMNS or name == "route"


def _numpy_type(name: str) -> type:
    """The numpy type of a numeric column: float for the FLOAT_COLUMNS, else an integer (the INT_COLUMNS and an
    op row's ``flows_before``)."""
    return np.float64 if name in FLOAT_COLUMNS else np.int64


def frame_columns(frame: pd.DataFrame) -> Columns:
    """A timeline DataFrame's COLUMNS in the form of `EventLog.columns`."""
    return {name: _codes_of(frame[name].tolist()) if name in TEXT_COLUMNS else (frame[name].to_numpy(), None)
            for name in COLUMNS}


def _codes_of(values: list[str]) -> tuple[np.ndarray, list[str]]:
    distinct: list[str] = []
    return _codes(values, distinct), distinct


def decoded(values: np.ndarray, distinct: list[str] | None) -> np.ndarray:
    """A column of `EventLog.columns` as its values: numbers as they are, text as an object array of strings."""
    return values if distinct is None else _objects(distinct, len(distinct))[values]


def arrow_table(columns: Columns) -> pa.Table:
    """`EventLog.columns` as an Arrow table: the rows and columns of `to_frame`, text as large strings (what
    pandas' `str` columns are stored as); timeline.parquet is written from it. Each array is made from its
    buffers, not by `pa.array`, whose first call imports pandas (0.3-0.4 s of a command with no other use for
    it)."""
    import pyarrow as pa

    arrays = {}
    for name, (values, distinct) in columns.items():
        if distinct is None:
            numbers: np.ndarray = np.ascontiguousarray(values, dtype=_numpy_type(name))
            kind = pa.int64() if name in INT_COLUMNS else pa.float64()
            arrays[name] = pa.Array.from_buffers(kind, len(numbers), [None, pa.py_buffer(numbers)])
        else:
            arrays[name] = _arrow_strings(values, distinct)
    return pa.table(arrays)


def _arrow_strings(codes: np.ndarray, values: list[str]) -> pa.Array:
    """``values[codes]`` as an Arrow large-string array: the distinct strings (encoded in one piece where they
    are ASCII, a character being a byte) and the codes made from their buffers, the rows copied by Arrow's
    `take` (not a Python bytes object per row). (Handing the Parquet writer a dictionary array instead would
    spare the copy, but its pages then vary from run to run where the dictionary repeats a string.)"""
    import pyarrow as pa

    text = "".join(values)
    if text.isascii():
        data, lengths = text.encode(), map(len, values)
    else:
        encoded = [value.encode() for value in values]
        data, lengths = b"".join(encoded), map(len, encoded)
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(lengths, dtype=np.int64, count=len(values)), out=offsets[1:])
    dictionary = pa.Array.from_buffers(pa.large_string(), len(values),
                                       [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    indices = np.ascontiguousarray(codes, dtype=np.int64)
    return _take(dictionary, pa.Array.from_buffers(pa.int64(), len(indices), [None, pa.py_buffer(indices)]))


def _take(values: pa.Array, indices: pa.Array) -> pa.Array:
    """Arrow's `take`, called through the compute module's Cython core: importing `pyarrow.compute` itself builds
    a Python wrapper with a docstring for every compute function (about 25 ms of a command's CPU, against 5)."""
    try:
        from pyarrow._compute import call_function
    except ImportError:  # a pyarrow that moved its core: the public module has the same function
        from pyarrow.compute import call_function
    return call_function("take", [values, indices])


def _strings(codes: np.ndarray, values: list[str]):
    """``values[codes]`` as the column pandas makes of a list of these strings: on pandas' Arrow-backed `str`
    dtype (pandas 3) decoded from an Arrow dictionary array, otherwise the list itself."""
    import pandas as pd

    inferred = pd.Series(values).dtype
    if isinstance(inferred, pd.StringDtype) and inferred.storage == "pyarrow":
        return pd.array(_arrow_strings(codes, values), dtype=inferred)
    return _objects(values, len(values))[codes].tolist()


def _objects(values, count: int) -> np.ndarray:
    """An object array of ``values`` as they are (a list of tuples stays a list of tuples, not a 2-D array)."""
    return np.fromiter(values, dtype=object, count=count)
