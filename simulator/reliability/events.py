"""The job event log: one row per failure, checkpoint (completed or lost), restart (after a failure or for
maintenance), degradation and straggler (from its start to its repair). Single rows are kept as tuples; the
checkpoints of many identical cycles as one arithmetic block (start = a + j p, end = b + j p, step = s + j k),
expanded with numpy when the table is built. The table is built as Arrow columns (the strings as codes into
their few distinct values), so that writing job_events.parquet never goes through a million Python strings.
A job with an in-memory checkpoint tier has two more columns, `tier`: a checkpoint's (written or lost), and the tier
a failure rolled back to and a restart loaded from (`memory` or `storage`); and `storage_because`: on those that
rolled back to or loaded storage, why (`StorageReason`)."""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import pyarrow as pa

EventKind = Literal["failure", "checkpoint", "checkpoint_lost", "restart", "degraded", "straggling"]
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)
"""A planned maintenance stop is a `restart` that `began` with `maintenance` (its `cause` is `failure` when a failure
struck it)."""
KIND_CODE: dict[EventKind, int] = {kind: code for code, kind in enumerate(EVENT_KINDS)}
COLUMNS = ("replication", "kind", "cause", "began", "start_s", "end_s", "step", "lost_work_s", "hosts", "gpus",
           "step_s")
"""`gpus`: the GPU indices a `degraded` or `straggling` row's unit slows, comma-separated ('' on other rows and
where it slows none: links down); `step_s`: the step time in the state it brought about, with every other
degradation then in force (0 on other rows, and while no GPU has a route: the job waits for a repair)."""
TIER_COLUMN = "tier"
Tier = Literal["memory", "storage"]
"""A checkpoint tier: the in-memory one (`checkpoint.memory`) or storage."""
TIERS: tuple[Tier, ...] = get_args(Tier)
STORAGE_COLUMN = "storage_because"
StorageReason = Literal["newer", "copies_lost"]
"""Why a failure rolled back to storage with an in-memory tier: `newer`, no in-memory snapshot was newer than the
last completed storage checkpoint (or a planned stop wrote the newest); `copies_lost`, a newer snapshot existed but
the hosts out held every copy of some host's (a host and all its peers)."""
STORAGE_REASONS: tuple[StorageReason, ...] = get_args(StorageReason)


class JobEvents:
    """Rows of job_events.parquet, filled by the job process of each replication."""

    def __init__(self, tiered: bool = False) -> None:
        self.tiered = tiered
        self.replication = 0
        self.rows: list[tuple] = []
        self.blocks: list[tuple] = []

    def add(self, kind: EventKind, start: float, end: float, *, cause: str = "", began: str = "",
            step: float = 0.0, lost_work_s: float = 0.0, hosts: int = 0, gpus: tuple[int, ...] = (),
            step_s: float = 0.0, tier: Tier | Literal[""] = "",
            storage_because: StorageReason | Literal[""] = "") -> None:
        """One row; ``began``, a restart's alone, is what began it (its ``cause`` is what it restarted from);
        ``gpus`` and ``step_s`` a degradation's or straggler's (COLUMNS); ``tier`` the checkpoint tier it wrote,
        lost or restored from ('' for none); ``storage_because`` why it restored from storage ('' for none)."""
        self.rows.append((self.replication, kind, cause, began, start, end, step, lost_work_s, hosts,
                          ",".join(map(str, gpus)), step_s, tier, storage_because))

    def add_checkpoints(self, start: float, end: float, step: float, period: float, steps: float,
                        count: int) -> None:
        """``count`` completed checkpoints, the j-th from start + j period to end + j period at step
        step + j steps."""
        if count > 0:
            self.blocks.append((self.replication, start, end, step, period, steps, count))

    def table(self) -> pa.Table:
        """All rows, sorted by replication and start time (stable: logging order breaks ties); `kind`, `cause`
        and `began` dictionary columns (over EVENT_KINDS and the causes met, sorted), `gpus` one over its own GPU
        lists (sorted), written to Parquet as they are.
        The columns are allocated once at full length, single rows first, and the checkpoint blocks expanded
        into them in place: a long job has millions of checkpoints, and concatenating temporaries of that
        length costs more than the expansion itself."""
        columns = list(zip(*self.rows)) if self.rows else [()] * (len(COLUMNS) + 2)
        names = sorted({"", *columns[2], *columns[3]})
        code_of = {name: code for code, name in enumerate(names)}
        gpu_lists = sorted({"", *columns[9]})
        gpu_code = {name: code for code, name in enumerate(gpu_lists)}
        blocks = [np.asarray(c) for c in zip(*self.blocks)] if self.blocks else []
        counts = blocks[-1].astype(np.int64) if blocks else np.zeros(0, dtype=np.int64)
        single, total = len(self.rows), int(counts.sum())
        replication = np.empty(single + total, dtype=np.int32)
        kind = np.full(single + total, KIND_CODE["checkpoint"], dtype=np.int8)
        cause, began = (np.full(single + total, code_of[""], dtype=np.int32) for _ in range(2))
        gpus = np.full(single + total, gpu_code[""], dtype=np.int32)
        start, end, step, lost, step_s = (np.zeros(single + total) for _ in range(5))
        hosts = np.zeros(single + total, dtype=np.int64)
        replication[:single] = columns[0]
        kind[:single] = [KIND_CODE[k] for k in columns[1]]
        cause[:single] = [code_of[c] for c in columns[2]]
        began[:single] = [code_of[c] for c in columns[3]]
        gpus[:single] = [gpu_code[c] for c in columns[9]]
        for column, values in zip((start, end, step, lost, hosts), columns[4:9]):
            column[:single] = values
        step_s[:single] = columns[10]
        if blocks:
            rep, a, b, s, p, k, _ = blocks
            checkpoints = slice(single, None)
            j = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
            offset = np.repeat(p, counts) * j
            replication[checkpoints] = np.repeat(rep, counts)
            for column, first in ((start, a), (end, b)):
                column[checkpoints] = np.repeat(first, counts)
                column[checkpoints] += offset
            step[checkpoints] = np.repeat(s, counts)
            step[checkpoints] += np.repeat(k, counts) * j
        order = _by_replication_and_start(replication, start)
        arrays = [
            pa.array(replication[order]),
            pa.DictionaryArray.from_arrays(kind[order], pa.array(EVENT_KINDS)),
            *(pa.DictionaryArray.from_arrays(codes[order], pa.array(names)) for codes in (cause, began)),
            *(pa.array(column[order]) for column in (start, end, step, lost, hosts)),
            pa.DictionaryArray.from_arrays(gpus[order], pa.array(gpu_lists)), pa.array(step_s[order]),
        ]
        names_out = list(COLUMNS)
        if self.tiered:
            tier = np.full(single + total, "storage", dtype=object)
            tier[:single] = columns[11]
            arrays.append(pa.array(tier[order], type=pa.string()).dictionary_encode())
            names_out.append(TIER_COLUMN)
            because = np.full(single + total, "", dtype=object)
            because[:single] = columns[12]
            arrays.append(pa.array(because[order], type=pa.string()).dictionary_encode())
            names_out.append(STORAGE_COLUMN)
        return pa.Table.from_arrays(arrays, names=names_out)


def _by_replication_and_start(replication: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The stable order by (replication, start), as np.lexsort gives it, in O(n) on the log's layout: single
    rows and checkpoint blocks are each logged in replication order and nearly in time order, runs that the
    stable sort (timsort) merges in linear time."""
    by_replication = np.argsort(replication, kind="stable")
    bounds = np.flatnonzero(np.diff(replication[by_replication])) + 1
    return np.concatenate([rows[np.argsort(start[rows], kind="stable")]
                           for rows in np.split(by_replication, bounds)]) if len(start) else by_replication
