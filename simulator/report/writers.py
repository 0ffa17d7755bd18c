"""Writers for a run's outputs: summary.json, timeline.parquet, faults.parquet and trace.json (report/trace.py), written
together into a temporary folder and moved into `--out` with a manifest only when all are done
(report/run_folder.py), so a failed or interrupted run never leaves a mix of two runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson

from simulator.metrics.events import (
    FLOAT_COLUMNS,
    FLOW_KIND,
    INT_COLUMNS,
    TEXT_COLUMNS,
    Columns,
    arrow_table,
    frame_columns,
)
from simulator.metrics.link_load import LinkLoad, link_load
from simulator.report.fault_marks import FAULT_TYPES, fault_marks, fault_rows, slowdown_notes, step_end_s
from simulator.report.run_folder import RUN_FOLDER, trainsim_version, write_run_folder
from simulator.report.trace import trace_name, write_trace

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from simulator.config.loader import LoadedScenario
    from simulator.config.schema import TimelineLevel
    from simulator.simulation import Result


def write_summary(summary: dict, path: Path) -> None:
    """summary.json, keys sorted, floats as JSON numbers."""
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def write_timeline(table: pa.Table, path: Path) -> None:
    """timeline.parquet, one row per op or flow, written by Arrow (no pandas metadata: pandas reads the columns
    back with the dtypes of `EventLog.to_frame` and a default index). Dictionary pages only for the columns
    whose values repeat (text and small integers; times and sizes seldom do), and min/max statistics only for
    numbers (text's cost a string comparison per row): a third less time than Arrow's defaults, and no larger."""
    import pyarrow.parquet as pq

    pq.write_table(table.replace_schema_metadata(None), path, use_dictionary=[*TEXT_COLUMNS, *INT_COLUMNS],
                   write_statistics=[*INT_COLUMNS, *FLOAT_COLUMNS])


def timeline_rows(result: Result, timeline: TimelineLevel) -> tuple[pa.Table, Columns]:
    """What timeline.parquet holds and the columns the trace reads, made once for both. The whole timeline comes
    off the log's columns as an Arrow table (no DataFrame, no pandas); one rank per stage (`per-stage`) is
    picked from the DataFrame."""
    if timeline == "per-stage":
        import pyarrow as pa

        frame = stage_timeline(result.timeline, result.summary)
        return pa.Table.from_pandas(frame, preserve_index=False), frame_columns(frame)
    columns = result.log.columns()
    return arrow_table(columns), columns


def stage_timeline(frame: pd.DataFrame, summary: dict) -> pd.DataFrame:
    """The ops (no flows) of the lowest simulated rank of each pipeline stage; all ops when there is no
    pipeline layout (communication-only runs). A fold by classes of unequal size (`rank_weights`) keeps every
    simulated rank, one per class of each stage: the lowest alone would drop a class that stands for other GPUs
    (a replica handing on across the spines) and its time."""
    ops = frame[frame["kind"] != FLOW_KIND]
    layout = summary.get("layout")
    if not layout or summary.get("rank_weights"):
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


def scenario_digest(loaded: LoadedScenario) -> str:
    """SHA-256 of the validated scenario (overrides applied, quantities parsed), keys sorted: two runs with the
    same digest ran the same scenario."""
    content = orjson.dumps(loaded.scenario.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(content).hexdigest()


def write_faults(summary: dict, path: Path) -> bool:
    """faults.parquet, the step's faults one row each (report/fault_marks.py `FAULT_COLUMNS`), where it has any;
    returns whether it wrote one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = fault_rows(summary)
    if not rows["kind"]:
        return False
    pq.write_table(pa.table({column: pa.array(values, type=pa.type_for_alias(FAULT_TYPES[column]))
                             for column, values in rows.items()}), path)
    return True


def link_tracks(result: Result) -> LinkLoad:
    """The trace's per-link utilisation: links of the flows sent by ranks that ran ops, over the whole run (read
    off the log's columns)."""
    summary = result.summary
    ranks = result.log.op_columns(("rank",))["rank"]
    shown = set(np.unique(ranks[ranks >= 0]).tolist())
    flows = result.log.flow_columns(("start_s", "end_s", "bytes", "src"))
    start, end, nbytes, src = (flows[column] for column in ("start_s", "end_s", "bytes", "src"))
    makespan = step_end_s(summary)
    return link_load(start, end, nbytes, src, result.flow_routes, np.asarray(result.topology.line_rate), shown,
                     makespan)


def write_outputs(out_dir: Path, result: Result, loaded: LoadedScenario) -> list[str]:
    """Write a run's outputs into ``out_dir`` (created if needed) as one unit, and return their names:
    summary.json always; timeline.parquet and the trace with every row (`run.timeline: full`), one rank per
    stage without flows (`per-stage`), or not at all (`summary`), with faults.parquet beside them where the step
    has faults; manifest.json last."""
    run = loaded.scenario.run

    def write(stage: Path) -> None:
        if run.timeline != "summary":
            table, columns = timeline_rows(result, run.timeline)
            write_timeline(table, stage / "timeline.parquet")
            weights = {int(rank): weight for rank, weight in result.summary.get("rank_weights", {}).items()}
            write_trace(stage / trace_name(run.trace_compress), columns, result.topology, flows=run.trace == "full",
                        load=None if run.trace == "ops" else link_tracks(result), compress=run.trace_compress,
                        weights=weights, slowed=slowdown_notes(result.summary), faults=fault_marks(result.summary))
            write_faults(result.summary, stage / "faults.parquet")
        write_summary(result.summary, stage / "summary.json")

    return write_run_folder(out_dir, run_identity(loaded), write, RUN_FOLDER)


def run_identity(loaded: LoadedScenario) -> dict:
    """What a run folder's manifest says it holds: the scenario's path, the `--set`s written over it (as typed;
    a sweep point's axis values after them) and the digest of the result, the version, the seed."""
    return {"scenario": loaded.source, "overrides": list(loaded.replayed), "scenario_sha256": scenario_digest(loaded),
            "trainsim_version": trainsim_version(), "seed": loaded.scenario.run.seed}
