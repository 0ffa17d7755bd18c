"""The table `trainsim sweep` prints when it ends: each point's axis values, its step figures, what bounds it and
the link tier that binds it (where its verdict names one), fastest step first, the points whose status is not ok
after them with their status, at most `SHOWN_ROWS` rows and a line saying where the rest are (results.csv holds
every point, in point order)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from simulator.sweep.results import RESULTS_CSV, PointStatus
from simulator.units import counted, durations_alike, format_memory

SHOWN_ROWS = 20
"""The most points the table shows; the line under it counts the rest."""
BINDING = "binding links"
"""The table's column naming the link tier that binds a communication-bound step (`_with_binding`)."""
MISSING = "-"
"""A figure the point has none of (a point that did not run, a job point without a step figure)."""


def _figure(write: Callable[[float], str]) -> Callable[[object], str]:
    """``write`` for a cell that holds a number, `MISSING` where it holds none (None, NaN)."""
    def cell(value: object) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return MISSING
        return write(float(value))  # type: ignore[arg-type]
    return cell


def ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """The results table's rows in the console's order: the ok points by step time, shortest first (ties, and
    points without one, by point), then the rest by point."""
    ok = frame["status"] == PointStatus.OK
    key = frame["step_time_s"] if "step_time_s" in frame else pd.Series(math.nan, index=frame.index)
    ranked = frame[ok].assign(_key=key[ok]).sort_values(["_key", "point"], na_position="last", kind="stable")
    return pd.concat([ranked.drop(columns="_key"), frame[~ok].sort_values("point", kind="stable")])


def format_sweep_table(frame: pd.DataFrame, out_dir: Path, limit: int = SHOWN_ROWS) -> str:
    """The console table of a sweep's results ``frame`` (`results_table`, its axes in `attrs`) written to
    ``out_dir``: point, status, each axis's value, step time, tokens/s, TFLOP/s per GPU, MFU and peak memory,
    each with its unit, the bottleneck's constraint and the binding link tier with its utilisation (each where
    some row shown has one), in `ordered` order, at most ``limit`` rows; '' for a sweep without points."""
    if frame.empty:
        return ""
    axes = [axis for axis in frame.attrs.get("axes", []) if axis in frame]
    rows = ordered(frame)
    shown = rows.head(limit)
    step = shown["step_time_s"] if "step_time_s" in shown else pd.Series(dtype=float)
    figures: dict[str, tuple[str, Callable[[object], str]]] = {
        "step_time_s": ("step time", _figure(durations_alike(step.dropna().astype(float)))),
        "tokens_per_s": ("tokens/s", _figure(lambda value: f"{value:,.0f}")),
        "tflops_per_gpu": ("TFLOP/s per GPU", _figure(lambda value: f"{value:,.1f}")),
        "mfu": ("MFU", _figure(lambda value: f"{100 * value:.1f}%")),
        "peak_memory_gib": ("peak memory", _figure(format_memory)),
        "bottleneck.constraint": ("bound", _text),
        BINDING: ("binding links", _text),
    }
    columns: list[tuple[str, Callable[[object], str], str]] = [
        ("point", _figure(lambda value: f"{value:.0f}"), ">"), ("status", str, "<"),
        *((axis, _axis_cell, ">" if _numeric(frame[axis]) else "<") for axis in axes),
        *((name, write, "<" if write is _text else ">") for name, (_, write) in figures.items())]
    headers = {"point": "point", "status": "status", **{axis: axis for axis in axes},
               **{name: header for name, (header, _) in figures.items()}}
    rows_shown = list(map(_with_binding, shown.to_dict("records")))
    columns = [column for column in columns if column[1] is not _text
               or any(_text(row.get(column[0])) != MISSING for row in rows_shown)]
    cells = [[write(row.get(name)) for name, write, _ in columns] for row in rows_shown]
    widths = [max([len(headers[name]), *(len(line[i]) for line in cells)]) for i, (name, _, _) in enumerate(columns)]

    def line(texts: list[str]) -> str:
        return "  ".join(f"{text:{align}{width}}" for text, (_, _, align), width in zip(texts, columns, widths)
                         ).rstrip()

    lines = ["points by step time, fastest first; those not ok after them:",
             line([headers[name] for name, _, _ in columns]), *map(line, cells)]
    rest = rows.iloc[limit:]
    if len(rest):
        slower = int((rest["status"] == PointStatus.OK).sum())
        kinds = [f"{slower:,} ok, slower" if slower else "", f"{len(rest) - slower:,} not ok" if len(rest) > slower
                 else ""]
        lines.append(f"... {counted(len(rest), 'more point')} ({', '.join(filter(None, kinds))}): every point is in "
                     f"{out_dir / RESULTS_CSV}")
    return "\n".join(lines)


def _text(value: object) -> str:
    """A text cell, `MISSING` where the point has none."""
    return MISSING if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _with_binding(row: dict) -> dict:
    """A results row with its `BINDING` cell: the link tier its verdict names and that tier's busiest link's
    utilisation while the transfers crossing it run ('leaf-spine 92.2%'), none where it names no tier."""
    tier = row.get("bottleneck.binding_tier.tier")
    if not isinstance(tier, str):
        return row
    return {**row, BINDING: f"{tier} {100 * float(row['bottleneck.binding_tier.utilisation_in_transfers']):.1f}%"}


def _numeric(column: pd.Series) -> bool:
    """Whether an axis's values are all numbers (not booleans), which the table aligns right."""
    return all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in column)


def _axis_cell(value: object) -> str:
    """An axis value as the table shows it: as results.csv writes it, `MISSING` where the point has none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return str(value)
