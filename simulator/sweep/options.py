"""Option sets of the studies, defined once for the library and the command line (kept light: the CLI imports
it to build its parser)."""

from __future__ import annotations

from typing import Literal, get_args

from simulator.config.training_options import RECOMPUTE_MODES, Recompute

Sharding = Literal["zero0", "zero1", "zero2", "fsdp"]
SHARDINGS: tuple[Sharding, ...] = get_args(Sharding)
RECOMPUTES: tuple[Recompute, ...] = RECOMPUTE_MODES
"""Recompute options (`training.recompute`'s set) from the least extra compute to the most: a lighter one that
fits dominates."""
DEFAULT_MAX_POINTS = 10_000
"""The most points a sweep runs without --max-points (a typo such as a 1,000-value axis is refused, not run)."""
SEARCH_CP: tuple[int, ...] = (1, 2)
SEARCH_VIRTUAL_STAGES: tuple[int, ...] = (1, 2, 4)
SEARCH_MICRO_BATCHES: tuple[int, ...] = (1, 2)
SEARCH_SHARDINGS: tuple[Sharding, ...] = ("zero0", "zero1", "fsdp")
"""The layout search's values of the dimensions that the cluster and model do not set (sweep/layouts.py
`SearchSpace`), named once for it and for `trainsim search --help`."""
StudyChart = Literal["sweep", "heatmap", "busbw", "front"]
STUDY_CHARTS: tuple[StudyChart, ...] = get_args(StudyChart)
"""`trainsim plot` charts drawn from a sweep or search folder (report/study_plots.py)."""
GanttRows = Literal["stage", "rank"]
GANTT_ROWS: tuple[GanttRows, ...] = get_args(GanttRows)
"""What a Gantt chart's rows are (`trainsim plot gantt --by`, report/gantt.py): one representative rank per
pipeline stage, or every simulated rank."""
CsvColumns = Literal["readable", "all"]
CSV_COLUMNS: tuple[CsvColumns, ...] = get_args(CsvColumns)
"""Which metrics a sweep's results.csv holds (`trainsim sweep --csv-columns`, sweep/results.py `csv_frame`);
results.parquet holds every one. readable: every metric but the link tiers' and `auto`'s per-collective detail
(`DETAIL_METRICS`); all: every one."""
ExecutorName = Literal["local", "serial", "dask"]
EXECUTORS: tuple[ExecutorName, ...] = get_args(ExecutorName)
"""Where a sweep's or a search's points run (sweep/executors.py), the default first."""
StudyName = Literal["checkpoint-interval", "memory-interval", "mtbf"]
STUDIES: tuple[StudyName, ...] = get_args(StudyName)
"""The job studies of `trainsim study` (reliability/study.py): ETTR against the checkpoint interval, against the
in-memory tier's interval (`checkpoint.memory.interval`), or against failure-rate multipliers at the scenario's
own interval; `study.STUDY_FIELDS` names the field each one's `--intervals` sets."""
