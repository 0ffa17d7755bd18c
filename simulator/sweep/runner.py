"""Running a sweep: the points not finished yet go to an executor, each finished point is journalled at once
(the journal is put in point order at the end, so its bytes do not depend on the executor), and the results
table is written at the end, or with the points finished so far when interrupted. A point's failure is
recorded with its error and never stops the sweep."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from simulator.config.loader import LoadedScenario, Override, sets_typed
from simulator.errors import InputError, SimulationError
from simulator.stops import raise_dropped
from simulator.sweep.executors import Executor
from simulator.sweep.options import CsvColumns
from simulator.sweep.results import (
    SIMULATED,
    SUMMARY_SCHEMA,
    PointRecord,
    PointStatus,
    append_record,
    flatten,
    read_records,
    results_table,
    rewrite_journal,
    write_results,
)
from simulator.sweep.spec import Point, Sweep

if TYPE_CHECKING:
    from simulator.simulation import RerunNotice


@dataclass(frozen=True)
class PointTask:
    """Everything a worker needs to run one point (picklable; no open files, no topology)."""

    index: int
    key: str
    data: dict
    source: str
    lines: dict
    outputs_dir: str | None
    overrides: tuple[Override, ...] = ()
    """The `--set` values and the point's axis values as overrides of the base: an error in a field one of
    them set is located at it, as when the sweep is read."""
    force: bool = False
    """Run the point even beyond the scale limits (`trainsim sweep --force`), as `trainsim run --force` would."""
    inline_base: dict | None = None
    """The sweep's inline base (`Sweep.inline_base`), written as `scenario.yaml` into the point's folder, which its
    manifest then names; None for a base file."""


@dataclass(frozen=True)
class TimedPoint:
    """A finished point's record and the wall seconds it took: said on stderr as it finishes, never written to
    the journal or the table, whose bytes must not depend on the machine's load."""

    record: PointRecord
    wall_s: float
    refold: str = ""
    """Where its step ran again after a fold fell out of step in its run (`simulation.FoldDropped`): how it ran
    again, the first fold given up and why, and the wall seconds from that fold's drop to the end
    (`refold_clause`); '' where it ran once."""

    def done_text(self) -> str:
        """'in 54.0 s wall' and, where it ran again, why: what a point's or layout's line ends with."""
        return f"in {self.wall_s:.1f} s wall" + (f"; {self.refold}" if self.refold else "")


def timed_point(task: PointTask) -> TimedPoint:
    """`run_point` timed by the wall clock: a sweep of six points at 2,048 GPUs takes 3 min 14 s, one of them
    over 100 s, and its line says so as it finishes (`point_done_line`), with why where its step ran again
    (`refold_clause`): Llama 3 70B TP4 PP8 DP8 on 256 GPUs takes 54 s, most of it after its fold fell out of step."""
    from simulator.simulation import FoldDropped, Rerun

    started = time.monotonic()
    dropped: list[tuple[float, dict]] = []
    reruns: list[Rerun] = []

    def heard(notice: FoldDropped | Rerun) -> None:
        if isinstance(notice, FoldDropped):
            dropped.append((time.monotonic(), notice.given_up))
        else:
            reruns.append(notice)

    record = run_point(task, heard)
    ended = time.monotonic()
    refold = refold_clause(dropped[0][1], reruns[-1].unfolded, ended - dropped[0][0]) if dropped and reruns else ""
    return TimedPoint(record, ended - started, refold)


def refold_clause(given_up: dict, unfolded: bool, after_s: float) -> str:
    """Why a point's step ran again, from the first fold given up in its run (its `fold_given_up` entry, as the
    engine recorded it) and how the last run went: 'refolded: the stage fold given up: a hand-off fell out of
    step in its run, 48.2 s wall from there'."""
    how = "unfolded" if unfolded else "refolded"
    return f"{how}: the {given_up['fold']} fold given up: {given_up['why']}, {after_s:.1f} s wall from there"


@dataclass(frozen=True)
class SweepReport:
    """How a sweep went: how many points ran now, how many were reused from an earlier run, the counts per
    status, and for each status but ok its reasons, each with its points, in the order of their first point
    (`reasons`), so that the command can say why points did not run without the user opening the table. It gave
    each status's first reason alone, which the end line printed "(and 19 others)" where 12 of them broke another
    constraint. The points out of memory share one reason, the range of their peaks (`_out_of_memory_reason`).
    ``results`` is the results table written (`results_table`), from which the command prints its table."""

    ran: int
    reused: int
    statuses: dict[str, int]
    reasons: dict[str, tuple[tuple[str, tuple[int, ...]], ...]]
    results: pd.DataFrame


OUT_OF_MEMORY = "out of memory"
"""The error of a point out of memory, before its figures, and the end line's reason for them all."""
STEP_FIGURES = ("oom", "memory_tight", "peak_memory_gib", "memory_capacity_gib", "warnings")
"""What a job point's row holds of its healthy step beside job_summary.json's figures: whether the step fits in
GPU memory, and with less room than the memory plan leaves out (`memory_plan.tight_fit`), and its warnings, as a
step point's row has them."""


def run_point(task: PointTask, on_rerun: RerunNotice | None = None) -> PointRecord:
    """Simulate one point (a step, or a job over `run.horizon`); an input error is `invalid`, any other failure
    `failed`, never raised. ``on_rerun`` hears of a step's fold dropped and its run again (`simulate`'s)."""
    from simulator.config.loader import validate_as_json
    from simulator.config.schema import Scenario
    from simulator.simulation import simulate

    sets = sets_typed(task.overrides)
    try:
        scenario = validate_as_json(Scenario, task.data)
        source, lines = task.source, task.lines
        if task.outputs_dir is not None and task.inline_base is not None:
            source, lines = str(_write_inline_base(Path(task.outputs_dir), task.inline_base)), {}
        loaded = LoadedScenario(scenario, source, lines, task.overrides, (scenario, task.data))
        if loaded.scenario.run.horizon is not None:
            from simulator.reliability.report import run_job

            outputs = None if task.outputs_dir is None else Path(task.outputs_dir)
            job = run_job(loaded, outputs, force=task.force)[0]
            summary = {**job.summary, **{key: job.step_summary[key] for key in STEP_FIGURES
                                         if job.step_summary.get(key) is not None}}
        else:
            result = simulate(loaded, force=task.force, on_rerun=on_rerun)
            summary = result.summary
            if task.outputs_dir is not None:
                from simulator.report.writers import write_outputs

                write_outputs(Path(task.outputs_dir), result, loaded)
    except InputError as exc:
        return PointRecord(task.index, task.key, PointStatus.INVALID, str(exc), {}, sets)
    except SimulationError as exc:
        return PointRecord(task.index, task.key, PointStatus.FAILED, str(exc), {}, sets)
    except Exception as exc:  # a bug in one point must not end the sweep; its message is kept
        return PointRecord(task.index, task.key, PointStatus.FAILED, f"{type(exc).__name__}: {exc}", {}, sets)
    return PointRecord(task.index, task.key, PointStatus.OK, "", flatten(summary), sets)


def _write_inline_base(folder: Path, base: dict) -> Path:
    """Write a sweep's inline base as ``folder``/scenario.yaml, the scenario a point's manifest names: the sweep
    file holds no scenario `trainsim run` can read (`base: unknown key 'base'`)."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False, allow_unicode=True, width=1 << 20))
    return path


def run_sweep(sweep: Sweep, out_dir: Path, executor: Executor, *, point_outputs: bool = False, force: bool = False,
              on_progress: Callable[[int, int], None] | None = None,
              on_point: Callable[[str], None] | None = None,
              csv_columns: CsvColumns = "readable") -> SweepReport:
    """Run every point of ``sweep`` not already finished in ``out_dir`` (same index, same scenario key, metrics
    under the current `SUMMARY_SCHEMA`) and write the results table. The constraints are judged first, at every
    run (they cost nothing): a point the sweep's constraints now rule out is skipped whatever an earlier run
    recorded, and one an earlier run skipped runs, so that editing `constraints:` gives the table a fresh
    folder would. ``force`` runs points beyond the scale limits, and runs again those an earlier run
    found invalid (a point refused for its size is one); ``csv_columns`` are results.csv's (`CsvColumns`).
    ``on_progress(done, total)`` is called after each
    point; ``on_point``, where given, hears a line for each point as it is handed to a worker ('sweep: simulating
    point 0 (parallelism.pp=4)', said by this process, whose progress bar it is printed above) and for each
    point finished: its status and wall time (`point_done_line`). A skipped point is journalled
    with the rest when the journal is rewritten at the end, not appended at once: no run reuses it (its
    constraints are judged again), and 798 skipped points appended one fsync each took a re-run of 800 points
    from 5.4 to 10.9 s (a loaded 2-core machine). Each finished point, once journalled, is a safe point
    (simulator/stops.py): a stop Python dropped while it ran ends the sweep there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    earlier = read_records(out_dir)
    records: dict[int, PointRecord] = {}
    todo: list[Point] = []
    reused = 0
    outputs = point_outputs or sweep.outputs
    for point in sweep.points:
        previous = earlier.get(point.index)
        if point.skipped:
            records[point.index] = PointRecord(point.index, point.key, PointStatus.SKIPPED, point.skipped, {},
                                               sets_typed(point.overrides))
        elif previous is not None and _reusable(previous, point, force,
                                                point_folder(out_dir, point.index) if outputs else None):
            records[point.index] = _memory_judged(_reused(previous, point))
            reused += 1
        else:
            todo.append(point)
    values = {point.index: point.values for point in sweep.points}
    labels = {point.index: point_label(point) if on_point is not None else "" for point in todo}
    tasks = [PointTask(p.index, p.key, p.data, sweep.base_source, sweep.base_lines,
                       str(point_folder(out_dir, p.index)) if outputs else None, p.overrides, force,
                       sweep.inline_base) for p in todo]
    try:
        if on_progress:
            on_progress(len(records), len(sweep.points))
        for timed in executor.map_unordered(timed_point, tasks, None if on_point is None else partial(
                _starting, on_point, labels)):
            record = _memory_judged(timed.record)
            if on_point is not None:
                on_point(point_done_line(timed, labels[record.index]))
            records[record.index] = record
            append_record(out_dir, record)
            raise_dropped()
            if on_progress:
                on_progress(len(records), len(sweep.points))
    finally:
        rewrite_journal(out_dir, {**earlier, **records})
        results = results_table(sweep.axes, values, records)
        write_results(out_dir, results, csv_columns)
    statuses: dict[str, int] = {}
    reasons: dict[str, dict[str, list[int]]] = {}
    for index, record in sorted(records.items()):
        statuses[record.status] = statuses.get(record.status, 0) + 1
        if record.status == PointStatus.OUT_OF_MEMORY:
            reasons.setdefault(record.status, {}).setdefault(OUT_OF_MEMORY, []).append(index)
        elif record.status != PointStatus.OK:
            reasons.setdefault(record.status, {}).setdefault(record.error, []).append(index)
    if PointStatus.OUT_OF_MEMORY in reasons:
        points = reasons[PointStatus.OUT_OF_MEMORY].pop(OUT_OF_MEMORY)
        reasons[PointStatus.OUT_OF_MEMORY][_out_of_memory_reason([records[index] for index in points])] = points
    return SweepReport(len(todo), reused, dict(sorted(statuses.items())),
                       {status: tuple((reason, tuple(points)) for reason, points in by_reason.items())
                        for status, by_reason in sorted(reasons.items())}, results)


def _starting(on_point: Callable[[str], None], labels: dict[int, str], task: PointTask) -> None:
    """Tell ``on_point`` that ``task``'s point is handed to a worker, by its axis values (``labels``)."""
    on_point(f"sweep: simulating point {task.index} ({labels[task.index]})")


def point_label(point: Point) -> str:
    """A point's axis values in words: 'parallelism.tp=4, parallelism.pp=8'."""
    return ", ".join(f"{field}={value}" for field, value in point.values)


def point_done_line(timed: TimedPoint, label: str) -> str:
    """The line on stderr as a point finishes: 'sweep: point 3 (parallelism.tp=4, parallelism.pp=8) ok in 101.3 s
    wall', and why where its step ran again (`TimedPoint.done_text`)."""
    return f"sweep: point {timed.record.index} ({label}) {timed.record.status} {timed.done_text()}"


def point_folder(out_dir: Path, index: int) -> Path:
    """Where a point's run outputs go (`--point-outputs`, `outputs: true`)."""
    return out_dir / "points" / f"{index:05d}"


def _reused(previous: PointRecord, point: Point) -> PointRecord:
    """An earlier run's record of ``point`` (the same scenario: same key), with the `--set`s this run gave: other
    `--set`s can write the same scenario (one giving the base's own value), and the record kept the earlier
    run's, so the table said the point ran with `--set`s this run did not give."""
    sets = sets_typed(point.overrides)
    return previous if previous.overrides == sets else replace(previous, overrides=sets)


def _reusable(previous: PointRecord, point: Point, force: bool, folder: Path | None) -> bool:
    """Whether an earlier run's record of ``point`` (one no constraint skips now) stands: the same scenario (key)
    under the current field names, not skipped (the constraints it was skipped by may be gone), not invalid under
    ``force``, and where the point's outputs are wanted in ``folder``, there if it ran."""
    return (previous.key == point.key and previous.summary_schema == SUMMARY_SCHEMA
            and previous.status != PointStatus.SKIPPED
            and not (force and previous.status == PointStatus.INVALID)
            and (folder is None or previous.status not in SIMULATED or _has_outputs(folder, point)))


def _out_of_memory_reason(records: list[PointRecord]) -> str:
    """The one reason of the end line's points out of memory: the range of their peaks and of the GPUs' memory
    (each point's own is in its `error`)."""
    peaks = [record.metrics.get("peak_memory_gib") for record in records]
    capacities = [record.metrics.get("memory_capacity_gib") for record in records]
    known_peaks = [float(peak) for peak in peaks if peak is not None]
    known_capacities = [float(capacity) for capacity in capacities if capacity]
    if len(known_peaks) < len(records) or len(known_capacities) < len(records):
        return OUT_OF_MEMORY
    return f"{OUT_OF_MEMORY}: peak {_gib_range(known_peaks)} > {_gib_range(known_capacities)} per GPU"


def _gib_range(values: list[float]) -> str:
    """'85.6 GiB', or '85.6 to 141.9 GiB'."""
    low, high = f"{min(values):.1f}", f"{max(values):.1f}"
    return f"{low} GiB" if low == high else f"{low} to {high} GiB"


def _memory_judged(record: PointRecord) -> PointRecord:
    """``record`` with status `out_of_memory` where its point simulated but its step does not fit in GPU memory
    (`oom`), so that the end line, `plot heatmap` and a table sorted by tokens/s do not count it as run. A record
    an earlier trainsim wrote `ok` is judged again when reused."""
    if record.status != PointStatus.OK or not record.metrics.get("oom"):
        return record
    peak, capacity = record.metrics.get("peak_memory_gib"), record.metrics.get("memory_capacity_gib")
    figures = (f": peak {_gib_range([float(peak)])} > {_gib_range([float(capacity)])} per GPU"
               if peak is not None and capacity else "")
    return replace(record, status=PointStatus.OUT_OF_MEMORY, error=f"{OUT_OF_MEMORY}{figures}")


def _has_outputs(folder: Path, point: Point) -> bool:
    """Whether ``folder`` holds a complete run of ``point``'s scenario: its manifest checks out and names the
    point's validated scenario (its digest, taken when the sweep was read). A point finished without outputs (an
    earlier run without --point-outputs), or whose folder was removed or written by another scenario, is run
    again to write them."""
    from simulator.report.run_folder import checked_manifest

    try:
        manifest = checked_manifest(folder, ())
    except InputError:
        return False
    return manifest.get("scenario_sha256") == point.digest


def progress_printer(quiet: bool, label: str = "sweep"
                     ) -> tuple[Callable[[int, int], None], Callable[[], None], Callable[[str], None] | None]:
    """A rich progress bar named ``label`` with ETA on a terminal, plain lines off one (a run's `RunProgress`:
    every PLAIN_EVERY_S while a point runs too, so that a search says something in its first minute), nothing
    when quiet: (update, stop, say). The bar is redrawn by a `Heartbeat`, which no fork of the pool's workers
    runs beside: rich's own refresh thread would stay alive across them, and a worker forked while it wrote
    would hold stderr's lock for ever. The third is how a line is said on stderr above the bar (None when
    quiet)."""
    if quiet:
        return (lambda done, total: None), (lambda: None), None
    if not sys.stderr.isatty():
        from simulator.console.progress import RunProgress

        plain = RunProgress(True, "points", label)
        return plain, plain.close, plain.say
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    from simulator.console.progress import REDRAW_S, Heartbeat

    progress = Progress(label, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), "ETA",
                        TimeRemainingColumn(), console=Console(stderr=True), transient=True, auto_refresh=False)
    task = progress.add_task("points", total=None)
    progress.start()
    heartbeat = Heartbeat(progress.refresh, lambda: REDRAW_S)
    heartbeat.start()

    def update(done: int, total: int) -> None:
        heartbeat.resume()
        progress.update(task, completed=done, total=total)

    def stop() -> None:
        heartbeat.stop()
        progress.stop()

    def say(line: str) -> None:
        progress.console.print(line, highlight=False, soft_wrap=True, markup=False)

    return update, stop, say
