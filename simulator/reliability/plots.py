"""The goodput chart of a job study: ETTR and goodput against the checkpoint interval (or the in-memory one),
one line per failure-rate multiplier, with Young's and Daly's intervals (the two-level optimum's) and the
simulated optimum marked; a study of one
interval at several failure rates (an `mtbf` study's default) against the system MTBF instead."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator

from simulator.errors import InputError
from simulator.metrics.summary import OOM_FIGURES
from simulator.report.column_units import rate_scale
from simulator.report.outputs import run_name
from simulator.report.run_folder import OUTDIR_FIELD, checked_manifest, other_kind
from simulator.units import format_duration

STUDY_FILE = "study.json"
STUDY_ALLOWED = "a folder written by `trainsim study ... --out DIR`"
MTBF_LABEL = "system MTBF (h)"
"""The x axis of a study drawn against the system MTBF (`across_mtbf`)."""
CURVE_KEYS = ("rate_multiplier", "mtbf_s", "young_interval_s", "daly_interval_s", "best_interval_s", "best_ettr",
              "points")
POINT_KEYS = ("interval_s", "ettr", "ettr_ci95_low", "ettr_ci95_high", "goodput_tokens_per_s")
"""What the chart reads of each curve and point of study.json (a model without tokens: `goodput_steps_per_s`
too, its goodput_tokens_per_s null)."""
STEPS_KEY = "goodput_steps_per_s"


def _point_missing(point: object) -> str | None:
    """The first field the chart reads that a point of study.json lacks."""
    if not isinstance(point, dict):
        return POINT_KEYS[0]
    needed = (*POINT_KEYS, STEPS_KEY) if point.get("goodput_tokens_per_s") is None else POINT_KEYS
    return next((key for key in needed if key not in point), None)


def _missing(curve: object) -> str | None:
    """The first field the chart reads that a curve of study.json (or one of its points) lacks."""
    if not isinstance(curve, dict):
        return CURVE_KEYS[0]
    absent = [key for key in CURVE_KEYS if key not in curve]
    if absent:
        return absent[0]
    points = curve["points"]
    if not isinstance(points, list) or not points:
        return "points"
    return next((key for key in map(_point_missing, points) if key), None)


def load_study(folder: Path) -> dict:
    """study.json of a `trainsim study` folder, refused in one line when it is missing, is not the file its
    folder's manifest lists (run_folder.checked_manifest: a mixed or edited folder), is not JSON, or lacks a
    curve or a field the chart reads (a hand-edited or truncated file)."""
    path = folder / STUDY_FILE
    if not path.is_file():
        problem = ("is a file, not a folder" if folder.is_file() else "no such folder" if not folder.exists()
                   else other_kind(folder, (STUDY_FILE,)) or f"has no {STUDY_FILE}")
        raise InputError(problem, field=OUTDIR_FIELD, allowed=STUDY_ALLOWED, file=str(folder))
    checked_manifest(folder, (STUDY_FILE,), STUDY_ALLOWED)
    try:
        study = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{STUDY_FILE} is not readable JSON ({exc})", field=OUTDIR_FIELD, allowed=STUDY_ALLOWED,
                         file=str(folder)) from None
    curves = study.get("curves") if isinstance(study, dict) else None
    if not isinstance(curves, list) or not curves:
        raise InputError(f"{STUDY_FILE} has no curves", field=OUTDIR_FIELD, allowed=STUDY_ALLOWED, file=str(folder))
    for curve in curves:
        missing = _missing(curve)
        if missing:
            raise InputError(f"a curve of {STUDY_FILE} lacks {missing!r}", field=OUTDIR_FIELD, allowed=STUDY_ALLOWED,
                             file=str(folder))
    return study


def _tick(value: float, _position: int) -> str:
    """An interval's or a multiplier's tick: '2', '0.5'."""
    return f"{value:g}"


def _mtbf_tick(hours: float, _position: int) -> str:
    """An MTBF tick in hours as the study's lines print it: '3.1' (it read '3.09308'), '4' for 4.0, two
    significant digits under an hour."""
    return f"{hours:,.1f}".removesuffix(".0") if round(hours, 1) >= 1 else f"{hours:.2g}"


def _hours(seconds: float) -> str:
    """An MTBF as the study's printed lines give it: hours with thousands separators ('2,168.5 h', not the
    '2.17e+03 h' the legend showed), minutes or seconds below an hour."""
    hours = seconds / 3600
    return f"{hours:,.1f} h" if round(hours, 1) >= 1 else format_duration(seconds)


def _band(axis: Axes, minutes: list[float], points: list[dict], key: str, scale: float, color: str) -> None:
    """The 95% interval of ``key`` (its `_ci95_low` and `_ci95_high`, times ``scale``) at each point: a band over
    several points, an error bar on a curve of one (a band of one point has no width); none where a point has
    no interval (one replication; goodput in a study.json written before study.csv kept its interval)."""
    low, high = f"{key}_ci95_low", f"{key}_ci95_high"
    if any(p.get(low) is None or p.get(high) is None for p in points):
        return
    if len(points) == 1:
        (point,) = points
        value = scale * point[key]
        axis.errorbar(minutes, [value], yerr=[[value - scale * point[low]], [scale * point[high] - value]],
                      color=color, capsize=4, linestyle="none")
    else:
        axis.fill_between(minutes, [scale * p[low] for p in points], [scale * p[high] for p in points], color=color,
                          alpha=0.15)


def across_mtbf(study: dict) -> bool:
    """Whether the study varies the failure rate alone: one interval for each multiplier (an `mtbf` study's
    default, the scenario's own interval), several multipliers or an `mtbf` study's one. Its chart is drawn
    against the MTBF: against the interval every point sat on one x, one above the other, and the study's
    variable was only in the legend."""
    several = len(study["curves"]) > 1 or study.get("study") == "mtbf"
    return several and all(len(curve["points"]) == 1 for curve in study["curves"])


def goodput_figure(study: dict) -> Figure:
    """Two panels sharing the x axis (log scale): ETTR in percent, as the study's printed lines and the job's
    table give it (the axis read 0.92 beside '91.99%'), and goodput (in the tokens/s unit its largest value
    reaches; in healthy-equivalent steps per second, in the unit they reach, when some point's model has no
    tokens), each with its 95% band; against the checkpoint interval (`_against_interval`), or, for a study of
    one interval at several failure rates, against the system MTBF (`_against_mtbf`). A study whose healthy step
    is out of memory (a curve's `oom`) says under its title that its figures are invalid, as its printed lines do."""
    figure = Figure(figsize=(8, 6.5), constrained_layout=True)
    ettr_axis, goodput_axis = figure.subplots(2, 1, sharex=True)
    tokens = all(p["goodput_tokens_per_s"] is not None for curve in study["curves"] for p in curve["points"])
    goodput, unit = ("goodput_tokens_per_s", "tokens/s") if tokens else (STEPS_KEY, "healthy-equivalent steps/s")
    rate = rate_scale(unit, max(p[goodput] for curve in study["curves"] for p in curve["points"]))
    unit, scale = rate.unit, 1 / rate.divisor  # ticks read 1 to 1,000 (not 0.06 M tokens/s, nor 1,667 steps/s)
    draw = _against_mtbf if across_mtbf(study) else _against_interval
    ettr_axis.set_xscale("log")
    x_label = draw(study, ettr_axis, goodput_axis, goodput, scale)
    ettr_axis.xaxis.set_major_formatter(FuncFormatter(_mtbf_tick if x_label == MTBF_LABEL else _tick))
    ettr_axis.minorticks_off()
    ettr_axis.set_ylabel("ETTR, effective training time ratio (%)")
    ettr_axis.legend(fontsize=8)
    ettr_axis.grid(True, alpha=0.3)
    goodput_axis.set_ylabel(f"goodput ({unit})")
    goodput_axis.set_xlabel(x_label)
    goodput_axis.grid(True, alpha=0.3)
    oom = any(curve.get("oom") for curve in study["curves"])
    figure.suptitle(f"{run_name(study)}\n{OOM_FIGURES}" if oom else run_name(study))
    return figure


def _against_interval(study: dict, ettr_axis: Axes, goodput_axis: Axes, goodput: str, scale: float) -> str:
    """ETTR and goodput against the interval in minutes, one line per multiplier, Young's and Daly's intervals
    (a memory-interval study's: the two-level optimum's in-memory interval, two_level.py) and the simulated best
    marked; the x axis's label."""
    in_memory = study.get("varies") == "checkpoint.memory.interval"
    for index, curve in enumerate(study["curves"]):
        color = f"C{index}"
        points = curve["points"]
        minutes = [p["interval_s"] / 60 for p in points]
        mtbf = f"MTBF {_hours(curve['mtbf_s'])}" if curve["mtbf_s"] else "no failures"
        label = f"rate x {curve['rate_multiplier']:g} ({mtbf})"
        ettr_axis.plot(minutes, [100 * p["ettr"] for p in points], "o-", color=color, label=label)
        _band(ettr_axis, minutes, points, "ettr", 100.0, color)
        goodput_axis.plot(minutes, [scale * p[goodput] for p in points], "o-", color=color)
        _band(goodput_axis, minutes, points, goodput, scale, color)
        for axis in (ettr_axis, goodput_axis):
            _interval_lines(axis, curve, color, in_memory)
        if len(points) > 1:
            ettr_axis.plot([curve["best_interval_s"] / 60], [100 * curve["best_ettr"]], "*", color=color,
                           markersize=14)
    ettr_axis.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ettr_axis.plot([], [], "k--", linewidth=0.9, label="two-level optimum" if in_memory else "Young")
    if not in_memory:
        ettr_axis.plot([], [], "k:", linewidth=1.2, label="Daly")
    if any(len(curve["points"]) > 1 for curve in study["curves"]):
        ettr_axis.plot([], [], "k*", markersize=10, linestyle="none", label="simulated best")
    return "in-memory interval (min)" if in_memory else "checkpoint interval (min)"


def _interval_lines(axis: Axes, curve: dict, color: str, in_memory: bool) -> None:
    """Young's and Daly's intervals of ``curve`` as vertical lines (a memory-interval study's: the two-level
    optimum's in-memory interval). Over a curve of one point the axis's data range is a single x, which
    matplotlib (3.11) inverts with a division by zero while it updates the limits for such a line: a warning of
    no consequence to the chart (the line's limits are read in axes coordinates), silenced here."""
    if in_memory:
        optimum = (curve.get("two_level") or {}).get("memory_interval_s")
        lines = [(optimum, "--", 0.9)] if optimum else []
    else:
        lines = [(curve["young_interval_s"], "--", 0.9), (curve["daly_interval_s"], ":", 1.2)]
    with np.errstate(divide="ignore", invalid="ignore"):
        for interval_s, style, width in lines:
            if interval_s:
                axis.axvline(interval_s / 60, color=color, linestyle=style, linewidth=width)


def _against_mtbf(study: dict, ettr_axis: Axes, goodput_axis: Axes, goodput: str, scale: float) -> str:
    """ETTR and goodput of a study of one interval at several failure rates against the system MTBF in hours,
    each point marked with its rate multiplier and a tick at its value; against the multiplier where some rate
    has no MTBF (no failure that interrupts the job). The line is labelled with its interval where the points
    share one; else each point is marked with its own (the label listed them all without saying which point
    had which). The x axis's label is returned."""
    curves = study["curves"]
    by_mtbf = all(curve["mtbf_s"] for curve in curves)
    curves = sorted(curves, key=lambda curve: curve["mtbf_s"] if by_mtbf else curve["rate_multiplier"])
    x = [curve["mtbf_s"] / 3600 if by_mtbf else curve["rate_multiplier"] for curve in curves]
    points = [curve["points"][0] for curve in curves]
    intervals = {p["interval_s"] for p in points}
    label = ("checkpoint interval per point" if len(intervals) > 1
             else f"checkpoint every {format_duration(*intervals)}")
    ettr_axis.plot(x, [100 * p["ettr"] for p in points], "o-", color="C0", label=label)
    _band(ettr_axis, x, points, "ettr", 100.0, "C0")
    goodput_axis.plot(x, [scale * p[goodput] for p in points], "o-", color="C0")
    _band(goodput_axis, x, points, goodput, scale, "C0")
    ettr_axis.margins(x=0.08)  # room for the outer points' labels
    ettr_axis.xaxis.set_major_locator(FixedLocator(x))  # each point's MTBF read off the axis, not 1-2-5 ticks
    for value, point, curve in zip(x, points, curves):
        marks = [f"rate x {curve['rate_multiplier']:g}"] if by_mtbf else []
        marks += [f"every {format_duration(point['interval_s'])}"] if len(intervals) > 1 else []
        if marks:
            ettr_axis.annotate(", ".join(marks), (value, 100 * point["ettr"]), fontsize=7,
                               textcoords="offset points", xytext=(0, -14), ha="center")
    return MTBF_LABEL if by_mtbf else "failure-rate multiplier (x the scenario's own rates)"
