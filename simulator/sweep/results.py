"""A sweep's records: one per finished point, appended to DIR/points.jsonl as it finishes (what resuming
reads back) and rewritten in point order when the sweep ends, and the results table built from them:
DIR/results.parquet and DIR/results.csv, one row per point with its axis values, the headline metrics
(`HEADLINE_METRICS`) and every other summary metric, nested keys flattened (`exposed_comm_s.dp`,
`collectives[0].busbw_GBps`); results.csv leaves out the link tiers' and `auto`'s per-collective detail unless
asked (`CsvColumns`)."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

import orjson
import pandas as pd

from simulator.report.atomic import write_bytes, write_through_temporary
from simulator.report.tables import csv_text
from simulator.sweep.options import CsvColumns


class PointStatus(StrEnum):
    """A sweep point's status (results.csv's `status`). OK: simulated; OUT_OF_MEMORY: simulated, but its step's
    peak memory exceeds the GPU's (`oom` in its summary: the layout could not run, so its figures are no result
    to rank or chart); INVALID: the scenario was refused when the point was built (a layout that does not divide
    the cluster...); FAILED: the simulation raised (deadlock, or a bug); SKIPPED: a sweep constraint ruled it
    out."""

    OK = "ok"
    OUT_OF_MEMORY = "out_of_memory"
    INVALID = "invalid"
    FAILED = "failed"
    SKIPPED = "skipped"


SIMULATED = (PointStatus.OK, PointStatus.OUT_OF_MEMORY)
"""The statuses of a point that ran, whose run folder `--point-outputs` keeps."""


class CandidateStatus(StrEnum):
    """A layout search's candidate (candidates.csv's `status`): simulated (its step ran), failed (the simulation
    raised), stopped (not simulated: the search was stopped first), pruned (a check ruled it out, with why)."""

    SIMULATED = "simulated"
    FAILED = "failed"
    STOPPED = "stopped"
    PRUNED = "pruned"


def ranked(simulated: pd.DataFrame) -> pd.DataFrame:
    """Simulated rows best first: by tokens/s, those with room for what the memory plan leaves out before the
    `memory_tight` ones (`memory_plan.tight_fit`: a real GPU may run out of memory on them), ties by label."""
    return simulated.sort_values(["memory_tight", "tokens_per_s", "label"], ascending=[True, False, True])


def simulations_done(statuses: pd.Series) -> tuple[int, int]:
    """Of a search's candidate ``statuses`` (`CandidateStatus`), the layout simulations done (simulated or
    failed) and of how many (those and the stopped ones)."""
    done = int(statuses.isin((CandidateStatus.SIMULATED, CandidateStatus.FAILED)).sum())
    return done, done + int((statuses == CandidateStatus.STOPPED).sum())


HEADLINE_METRICS = ("step_time_s", "tokens_per_s", "mfu", "tflops_per_gpu", "peak_memory_gib", "memory_capacity_gib",
                    "oom", "memory_tight", "bottleneck.constraint", "bottleneck.binding_tier.kind",
                    "bottleneck.binding_tier.tier", "bottleneck.binding_tier.utilisation_in_transfers",
                    "bottleneck.verdict", "resources.gpu_hours_per_million_tokens",
                    "resources.cost_per_million_tokens")
"""The metrics a results table leads with after the axes, those some point has: what a sweep is read for (step
time, throughput, MFU, memory against the GPU's, the verdict and the link tier that binds it, with its busiest
link's utilisation while the transfers crossing it run, and what a million tokens take in GPU-hours and, priced,
cost: metrics/resources.py); the other metrics follow in the order they first appear."""
DETAIL_METRICS = ("link_tiers.", "auto_choices[")
"""The prefixes of the metrics a readable results.csv leaves out (`CsvColumns`): each link tier's busiest
link per kind of communication (50 or so columns a step) and the algorithm and protocol `auto` chose per collective
(50 or so); results.parquet and each point's summary.json keep them."""

JOURNAL = "points.jsonl"
RESULTS_PARQUET = "results.parquet"
RESULTS_CSV = "results.csv"
LEADING_COLUMNS = ("point", "status", "error")
AXES_ATTR = "axes"
"""The key of a results table's `attrs` (kept in results.parquet) listing the fields its sweep varies, as the
sweep file names them: what `trainsim plot sweep` defaults --x to when there is one."""
OVERRIDES_COLUMN = "overrides"
"""The `--set`s a point ran with, a JSON list; only in a table where some point had one."""
SUMMARY_SCHEMA = 12
"""The version of the summary's field names a record's metrics carry, raised when a field is renamed or changes
meaning, so that a resumed sweep runs again the points recorded under earlier names rather than mixing both in
one table (1: `memory_per_stage[i].total_gib`, which replaced `memory_per_stage_gib[i].total` in 8a86ad6; records
from before carry none, read as 0; 2: `hfu` and `hardware_tflops_per_gpu` null, not 0, for a trace without op
shapes; 3: `bottleneck.constraint` and `verdict` by the wait rule of the time with no compute op,
`bottleneck.evidence.wait_share` and `bubble_share`, where bubble plus exposed communication had named steps
idle- or bubble-bound; 4: `bottleneck.constraint` `host` and `bottleneck.evidence.host_share`, where a replayed
trace's host time had named steps idle-bound; 5: the losses `worker_wait` and `finished_early` of a
parameter-server run (the first of which the verdict's largest loss may name), where its idle time had none,
and `bottleneck.evidence.finished_early_share`, which its bound rules leave out of the time they judge;
MoE at ep 1's `moe.all_to_all_bytes_per_layer` 0, where it counted self-traffic no all-to-all sends; and the
verdict with a bracketed reason and 'largest single loss', where it read 'largest loss'; 6: the loss
`sm_contention` (compute time lost to communication kernels holding SMs), in `bottleneck.loss_shares` and
among the losses the verdict's largest may name, where that time had no loss of its own: the ZeRO-3 example's
largest single loss reads 'SM contention, 10.1%' where it read 'exposed DP communication, 1.9%'; 7: the verdict's
reason names a pipelined step's idle part 'bubble and other idle', where it read 'other idle', and
`tokens_per_s`, `tflops_per_gpu` and `mfu` are null, not 0, for a trace whose scenario states no tokens or no
model FLOPs per token, and so are they and `hardware_tflops_per_gpu` and `hfu` for a synthetic model; 8:
`schedule_bubble_fraction`, the schedule's own bubble with the run's pass times, and the verdict whose largest
loss is the pipeline bubble gives its share of the pipeline window beside that one where they differ; 9:
`layout.schedule`, the pipeline schedule that ran, where a pipelined step's layout named none; a
parameter-server run's `parameter_server.worker_links`, `binding_links` (server, worker, both or neither, by
each side's busiest link against `peak_link`), `peak_link` and `*_utilisation_in_transfers`, the server links
chosen nearest the GPU among equally slow ones, and its communication-bound verdict ending with whose links bind;
and the loss `cp_imbalance` with the `cp_imbalance` entry, the attention the slowest CP rank adds where the ranks'
causal work differs, and the losses `peer_wait` and `stage_tail_wait`, a rank's idle time after the pipeline
window waiting for slower ranks of its stage and then for other stages, among the losses the verdict's largest
may name; 10: `link_tiers`, each link tier's busiest link over every flow and each kind of communication's, with
the tiers that bind each kind, and the verdict whose largest loss is a kind's exposed communication ending with
the tier that binds it, `bottleneck.binding_tier`: the 2:1 rail fabric's 'DP transfers bound by the leaf-spine
links, oversubscribed 2:1 (...)'; `bubble_fraction` a share of each rank's replica's window, a replica's wait for a
slower replica's passes (a straggler's) `peer_wait`; 11: each
`link_tiers.by_kind.<kind>.tiers.<tier>.utilisation_in_transfers` over the time the kind's transfers crossing the
link run, not all of the kind's, so that a parameter-server run's verdict names the NIC-leaf tier its server links
bind (43.9% became 94.0%); 12: a pipelined step's `uniform_stage_bubble_fraction` (the schedule's bubble at uniform
stages) and `stage_busy_s` (each pipeline rank's pass seconds in it), a dense model's `model_state` (bytes per
parameter, the sharded parts, their ranks and the fullest rank's `parameters`), and `resources` (GPU-hours,
energy and, with a price, the cost of a step), columns a point recorded under 11 lacks."""


@dataclass(frozen=True)
class PointRecord:
    """What a point produced: its status, the error or the reason it was skipped, and its flattened summary."""

    index: int
    key: str
    status: PointStatus
    error: str
    metrics: dict
    overrides: tuple[str, ...] = ()
    """The sweep's `--set`s the point ran with, as typed (read back from the journal as a list); a point reused
    from an earlier run takes the reusing run's, which give the same scenario."""
    summary_schema: int = SUMMARY_SCHEMA
    """The `SUMMARY_SCHEMA` its metrics were recorded under."""


def flatten(summary: dict, prefix: str = "") -> dict:
    """Nested dicts become dotted keys; lists of dicts are indexed (`collectives[0].time_s`); other lists (of
    strings or numbers) become one JSON string so that every cell is a scalar."""
    flat: dict = {}
    for key, value in summary.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, name))
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for index, item in enumerate(value):
                flat.update(flatten(item, f"{name}[{index}]"))
        elif isinstance(value, (list, tuple)):
            flat[name] = orjson.dumps(list(value)).decode()
        else:
            flat[name] = value
    return flat


def _journal_line(record: PointRecord) -> bytes:
    return orjson.dumps(asdict(record), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def append_record(out_dir: Path, record: PointRecord) -> None:
    """Append one finished point to the journal, flushed to disk, so an interruption keeps it."""
    with open(out_dir / JOURNAL, "ab") as handle:
        handle.write(_journal_line(record))
        handle.flush()
        os.fsync(handle.fileno())


def rewrite_journal(out_dir: Path, records: dict[int, PointRecord]) -> None:
    """The journal again, one line per point in point order (it was appended in the order points finished,
    which a process pool or Dask varies from run to run), moved into place in one rename."""
    write_bytes(out_dir / JOURNAL, b"".join(_journal_line(records[index]) for index in sorted(records)))


def read_records(out_dir: Path) -> dict[int, PointRecord]:
    """The journal's records by point index (the last one of an index wins); a torn last line, or one of a status
    this trainsim does not know, is ignored (its point runs again)."""
    path = out_dir / JOURNAL
    records: dict[int, PointRecord] = {}
    if not path.is_file():
        return records
    for line in path.read_bytes().splitlines():
        try:
            fields = {"summary_schema": 0, **orjson.loads(line)}
            record = PointRecord(**{**fields, "status": PointStatus(fields.get("status", ""))})
        except (orjson.JSONDecodeError, TypeError, ValueError):
            continue
        records[record.index] = record
    return records


def results_table(axes: tuple[str, ...], values: dict[int, tuple], records: dict[int, PointRecord]) -> pd.DataFrame:
    """One row per finished point, in point order: point, status, error, the `--set`s it ran with (where some point had
    any), the axes, then the metrics that some point has a value for, the `HEADLINE_METRICS` first in their order, the
    rest in the order they first appear: a metric null in every point (the token figures of a synthetic model's job, the
    confidence bounds of a single replication) would be a column of nothing. An axis whose values are not all numbers
    (or all booleans) is written as text, `_axis_text`. The axes' names are kept in the table's attrs (`AXES_ATTR`)."""
    rows = []
    leading = [*LEADING_COLUMNS, OVERRIDES_COLUMN] if any(r.overrides for r in records.values()) else LEADING_COLUMNS
    for index in sorted(records):
        record = records[index]
        row = {"point": index, "status": str(record.status), "error": record.error}
        if len(leading) > len(LEADING_COLUMNS):
            row[OVERRIDES_COLUMN] = orjson.dumps(list(record.overrides)).decode()
        row.update(dict(values[index]))
        row.update({key: value for key, value in record.metrics.items() if key not in row and value is not None})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=None if rows else [*LEADING_COLUMNS, *axes])
    for axis in axes:
        column = frame[axis]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in column)
        logical = all(isinstance(v, bool) for v in column)
        if not (numeric or logical):
            frame[axis] = column.map(_axis_text)
    for name in frame.columns[len(leading) + len(axes):]:
        if frame[name].dtype == object:
            frame[name] = frame[name].map(_cell_text)
    metrics = list(frame.columns[len(leading) + len(axes):])
    headline = [name for name in HEADLINE_METRICS if name in metrics]
    frame = frame[[*frame.columns[:len(leading) + len(axes)], *headline,
                   *(name for name in metrics if name not in headline)]]
    frame.attrs[AXES_ATTR] = list(axes)
    return frame


def csv_frame(frame: pd.DataFrame, columns: CsvColumns) -> pd.DataFrame:
    """The results table as results.csv writes it: ``frame`` less the `DETAIL_METRICS` where ``columns`` is
    readable."""
    if columns == "all":
        return frame
    return frame[[name for name in frame.columns if not str(name).startswith(DETAIL_METRICS)]]


def _axis_text(value: object) -> str:
    """An axis value in a column of mixed types: a text as it is, anything else (a number, null, a mapping such as
    `{interval: 5 min}`) as JSON, as the overrides column is, not as Python's repr (`None`, `{'interval': ...}`)."""
    return value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def _cell_text(value: object) -> str | None:
    """A cell of a metric column of mixed types as text; missing (None, or NaN where a point lacks the metric)
    stays missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value if isinstance(value, str) else str(value)


def write_results(out_dir: Path, frame: pd.DataFrame, columns: CsvColumns = "readable") -> None:
    """results.parquet (every column) and results.csv (``columns``: `csv_frame`), each written under a temporary
    name and moved into place."""
    write_through_temporary(out_dir / RESULTS_PARQUET, lambda path: frame.to_parquet(path, index=False))
    write_bytes(out_dir / RESULTS_CSV, csv_text(csv_frame(frame, columns)).encode())
