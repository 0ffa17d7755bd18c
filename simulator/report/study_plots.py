"""Charts of studies over many runs, each a matplotlib Figure: a metric along a sweep axis (one line per value
of another axis), a heat map over two axes, collective bus bandwidth against message size per algorithm
(nccl-tests style), and the layout search's throughput-memory front."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullLocator

from simulator.errors import ScenarioError
from simulator.report.column_units import (
    PLAIN,
    ColumnScale,
    PlainFormatter,
    cell_texts,
    column_scale,
    power_tick,
)
from simulator.report.run_folder import checked_manifest, other_kind, outdir_error, read_parquet_table
from simulator.sweep.options import StudyChart
from simulator.sweep.report import split_by_space, status_counts
from simulator.sweep.results import AXES_ATTR, RESULTS_CSV, CandidateStatus, PointStatus, ranked
from simulator.units import format_size, magnitude, shown_value

COLUMN_ALLOWED = "a column of the results table (an axis or a flattened summary metric)"
TABLE_ALLOWED = "a folder written by `trainsim sweep` (results.parquet)"
SEARCH_ALLOWED = "a folder written by `trainsim search ... --out DIR` (candidates.parquet and its manifest.json)"
BUSBW_ALLOWED = "a sweep of a collectives scenario, or a `trainsim collective --json` file"
COLLECTIVE_JSON_COLUMNS = ("bytes", "busbw_GBps", "algorithm")
"""What the busbw chart reads of each row of `trainsim collective --json`."""
LIGHT_CELLS = 0.6
"""Above this share of the colour scale viridis turns green to yellow, where white annotations washed out:
they are written in black there."""
SHOWN_COLUMNS = 24
"""Columns a refusal names; a sweep's table has its axes first (after point, status, error), then 100 or so
metrics, which results.parquet holds (results.csv all but the link tiers' and `auto`'s detail)."""
FRONT_TITLE_WIDTH = 80
"""Characters a line of the front's title holds: an 8-inch chart's width at matplotlib's title size."""


def _check_columns(frame: pd.DataFrame, named: dict[str, str | None]) -> None:
    """Refuse a column the table lacks at what ``named`` it (a flag such as --x, or OUTDIR for the columns a
    chart needs of its file), naming the columns it has (the first SHOWN_COLUMNS) and why a metric may have none
    (`results_table` writes no column of nothing)."""
    for field, name in named.items():
        if name is not None and name not in frame.columns:
            columns = [str(column) for column in frame.columns]
            more = len(columns) - SHOWN_COLUMNS
            shown = ", ".join(columns[:SHOWN_COLUMNS]) + (f", ... ({more} more)" if more > 0 else "")
            raise ScenarioError(f"no column {name!r}", field=field, allowed=f"a column of the table: {shown}; a metric "
                                "no point has a value for, such as the hfu of traces without op shapes, has none")


def swept_fields(frame: pd.DataFrame) -> tuple[str, ...]:
    """The fields a sweep's results table varies, as its sweep file names them (none for a table written before
    `results_table` kept them)."""
    return tuple(frame.attrs.get(AXES_ATTR, ()))


def default_sweep_x(path: Path) -> str:
    """A sweep chart's --x where it is not given: the one field the sweep at ``path`` varies; a sweep of several
    fields is refused naming them to choose from."""
    fields = swept_fields(_read_table(path, "results.parquet"))
    if len(fields) == 1:
        return fields[0]
    if not fields:
        raise ScenarioError("a sweep chart needs --x and --y", field="--x", allowed=COLUMN_ALLOWED)
    raise ScenarioError(f"a sweep chart needs --x and --y: {len(fields)} fields are swept", field="--x",
                        allowed=f"one of the swept fields: {', '.join(fields)}")


def default_heatmap_axes(path: Path, x: str | None, y: str | None) -> tuple[str, str]:
    """A heat map's --x and --y where either is not given: the two fields the sweep at ``path`` varies, in the
    order its file names them (or the one that --x or --y does not name); a sweep of another number of fields
    is refused naming them."""
    fields = swept_fields(_read_table(path, "results.parquet"))
    left = [field for field in fields if field not in (x, y)]
    missing = [flag for flag, name in (("--x", x), ("--y", y)) if name is None]
    if len(fields) == 2 and len(left) == len(missing):
        filled = iter(left)
        return x or next(filled), y or next(filled)
    if not fields:
        raise ScenarioError("a heatmap chart needs --x and --y", field=missing[0], allowed=COLUMN_ALLOWED)
    swept = f"{len(fields)} field{'s are' if len(fields) > 1 else ' is'} swept"
    raise ScenarioError(f"a heatmap chart needs --x and --y: {swept}", field=missing[0],
                        allowed=f"two columns of the results table; the swept fields: {', '.join(fields)}")


def _numbers(rows: pd.DataFrame, column: str, field: str) -> pd.Series:
    """The column as numbers; a column holding text (a bottleneck's constraint, a status) is refused at ``field``
    naming the numeric columns there are (the first SHOWN_COLUMNS)."""
    numbers = pd.to_numeric(rows[column], errors="coerce")
    if (numbers.isna() & rows[column].notna()).any():
        raise ScenarioError(f"column {column!r} holds values that are not numbers", field=field,
                            allowed=_numeric_columns(rows))
    if len(rows) and numbers.isna().all():  # an unknown metric, such as the HFU of traces without op shapes
        raise ScenarioError(f"column {column!r} has no value in any simulated point: nothing to plot", field=field,
                            allowed=_numeric_columns(rows.dropna(axis=1, how="all")))
    return numbers


def _numeric_columns(frame: pd.DataFrame) -> str:
    """The numeric columns of a results table, as a refusal names them: the first SHOWN_COLUMNS, then how many more
    (results.parquet holds every column)."""
    columns = [str(c) for c in frame.columns if c != "point" and pd.api.types.is_numeric_dtype(frame[c])]
    more = len(columns) - SHOWN_COLUMNS
    return "a numeric column: " + ", ".join(columns[:SHOWN_COLUMNS]) + (
        f", ... ({more} more; results.parquet holds them)" if more > 0 else "")


def _by_magnitude(values):
    """A sort key for an axis's values (a Series or an Index): by size where each is a number or a quantity
    ('100 us', '4 ms', '25 ms', which sorted as texts read '100 us', '25 ms', '4 ms'), else the values."""
    sizes = values.map(magnitude)
    return values if pd.isna(sizes).any() else sizes.astype(float)


def _out_of_memory(frame: pd.DataFrame) -> pd.Series:
    """Which rows of a sweep's results are out of memory: status `out_of_memory`, or `ok` with `oom` true, as a
    sweep before the status of its own wrote them (its folder still charted them as if they ran)."""
    if "status" not in frame.columns:
        return pd.Series(False, index=frame.index)
    marked = frame["oom"].fillna(False).astype(bool) if "oom" in frame.columns else False
    return (frame["status"] == PointStatus.OUT_OF_MEMORY) | ((frame["status"] == PointStatus.OK) & marked)


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    """The simulated rows of a sweep's results that fit in memory (all rows when there is no status column)."""
    if "status" not in frame.columns:
        return frame
    return frame[(frame["status"] == PointStatus.OK) & ~_out_of_memory(frame)]


def _with_ok_points(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """``frame``, refused where no point of it has status ok (a chart of none would be empty): the refusal counts
    the other statuses (an old folder's `ok` points out of memory among the
    out_of_memory)."""
    if "status" not in frame.columns or len(_ok(frame)):
        return frame
    statuses = frame["status"].where(~_out_of_memory(frame), str(PointStatus.OUT_OF_MEMORY)).value_counts()
    counts = ", ".join(f"{count} {status}" for status, count in sorted(statuses.items())) or "no points"
    table = (path if path.is_dir() else path.parent) / RESULTS_CSV
    raise outdir_error(path, f"no point has status ok ({counts}: see {table})",
                       "a sweep folder with a point of status ok")


def _numeric_scale(rows: pd.DataFrame, column: str) -> ColumnScale | None:
    """The scale a numeric column is shown in (None for a column of texts or quantities, shown as written)."""
    if not pd.api.types.is_numeric_dtype(rows[column]):
        return None
    return column_scale(column, rows[column].dropna())


def _groups(rows: pd.DataFrame, hue: str | None) -> list[tuple[object, pd.DataFrame]]:
    """The sweep chart's lines: one per value of ``hue``, smallest first (by size where the values are quantities:
    a legend read '1 MiB, 100 MiB, 25 MiB'); all rows on one line without it."""
    if hue is None:
        return [(None, rows)]
    groups = dict(list(rows.groupby(hue, sort=False)))
    values = pd.Series(list(groups), dtype=object)
    return [(value, groups[value]) for value in values.sort_values(key=_by_magnitude, kind="stable")]


def sweep_figure(frame: pd.DataFrame, x: str, y: str, hue: str | None = None, *, log_x: bool = False) -> Figure:
    """``y`` against ``x`` over a sweep's simulated points, one line per value of ``hue``. Points of one line at
    one place (the sweep varies an axis the chart does not show) are joined in point order, and the title says
    so (the zigzag read as a curve), suggesting --hue where it is not set."""
    _check_columns(frame, {"--x": x, "--y": y, "--hue": hue})
    rows = _ok(frame)
    _numbers(rows, y, "--y")
    figure = Figure(figsize=(8, 5), layout="constrained")
    ax = figure.add_subplot()
    x_scale, y_scale = _numeric_scale(rows, x), _numeric_scale(rows, y)
    sized = log_x and x_scale is None  # quantities on a log axis: placed by size, labelled as written
    if sized and rows[x].map(magnitude).isna().any():
        raise ScenarioError(f"column {x!r} holds values that are neither numbers nor quantities", field="--log-x",
                            allowed="an --x column of numbers or of quantities with units (1 MiB, 4 ms)")
    shared = 1
    for value, group in _groups(rows, hue):
        ordered = group.sort_values(x, key=_by_magnitude, kind="stable")
        shared = max(shared, int(ordered[x].value_counts().max()) if len(ordered) else 1)
        places = (ordered[x].map(magnitude).astype(float) if sized else
                  x_scale.scaled(ordered[x]) if x_scale else ordered[x])
        ax.plot(places, y_scale.scaled(ordered[y]) if y_scale else ordered[y], marker="o",
                label=f"{hue} = {shown_value(value)}" if hue else y)
    if log_x:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
    elif pd.api.types.is_integer_dtype(rows[x]) and x_scale == PLAIN:  # pp, nodes: no tick at 4.5 between 4 and 8
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if sized:  # a tick at each value, as written ('2^0', '2^1' stood at the categories' places 0, 1, 2)
        written = dict(sorted(zip(rows[x].map(magnitude).astype(float), rows[x]), key=lambda pair: pair[0]))
        ax.set_xticks(list(written), [shown_value(value) for value in written.values()])
    for axis, scale, column in ((ax.xaxis, x_scale, x), (ax.yaxis, y_scale, y)):
        axis.set_label_text(scale.label(column) if scale else column)
        if scale:
            axis.set_major_formatter(FuncFormatter(power_tick) if log_x and axis is ax.xaxis else PlainFormatter())
    ax.grid(color="#DDDDDD", linewidth=0.6)
    ax.legend(fontsize=8)
    split = "more axes vary than --x and --hue show" if hue else "--hue splits them"
    ax.set_title(f"{y} vs {x}" + (f" by {hue}" if hue else "") + (
        f"\nup to {shared} points per place, other axes varying, joined in point order: {split}"
        if shared > 1 else "") + _out_of_memory_line(frame))
    return figure


def _out_of_memory_line(frame: pd.DataFrame) -> str:
    """A chart title's line counting the points out of memory, which it does not draw ('' for none)."""
    count = int(_out_of_memory(frame).sum())
    return f"\n{count} point{'s' if count > 1 else ''} out of memory (OOM), not drawn" if count else ""


def heatmap_figure(frame: pd.DataFrame, x: str, y: str, value: str) -> Figure:
    """``value`` over the grid of two sweep axes, each cell annotated (mean where several points share a cell,
    which the title says); a cell whose points all lack ``value`` (the HFU of a trace without op shapes) reads
    'n/a' and the title counts those points, as a cell whose points are all out of memory reads 'OOM';
    refused when the three columns are not distinct or ``value`` holds something other than numbers (each was a
    pandas traceback)."""
    _check_columns(frame, {"--x": x, "--y": y, "--value": value})
    if len({x, y, value}) < 3:
        raise ScenarioError(f"--x {x}, --y {y} and --value {value} name one column twice", field="--x/--y/--value",
                            allowed="three different columns: two axes and a metric")
    rows = _ok(frame)
    numbers = _numbers(rows, value, "--value")
    scale = column_scale(value, numbers.dropna())
    table = rows.assign(**{value: scale.scaled(numbers)}).pivot_table(index=y, columns=x, values=value, aggfunc="mean")
    unknown = rows[numbers.isna()]
    out_of_memory = frame[_out_of_memory(frame)]
    unvalued = pd.concat([unknown, out_of_memory])
    table = table.reindex(index=table.index.union(pd.Index(unvalued[y].unique()), sort=False),
                          columns=table.columns.union(pd.Index(unvalued[x].unique()), sort=False))
    table = table.sort_index(key=_by_magnitude).sort_index(axis=1, key=_by_magnitude)
    valued = rows[numbers.notna()]
    shared = int(valued.groupby([y, x], dropna=False).size().max()) if len(valued) else 1
    figure = Figure(figsize=(1.2 + 1.1 * max(len(table.columns), 1), 1.4 + 0.6 * max(len(table.index), 1)),
                    layout="constrained")
    ax = figure.add_subplot()
    image = ax.imshow(table.to_numpy(dtype=float), aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(table.columns)), [shown_value(c) for c in table.columns])
    ax.set_yticks(range(len(table.index)), [shown_value(i) for i in table.index])
    shares = np.asarray(image.norm(table.to_numpy(dtype=float)), dtype=float)
    cells = [(row, column, cell) for (row, column), cell in np.ndenumerate(table.to_numpy(dtype=float))
             if np.isfinite(cell)]
    for (row, column, _), text in zip(cells, cell_texts([cell for _, _, cell in cells]), strict=True):
        ax.text(column, row, text, ha="center", va="center", fontsize=8,
                color="black" if shares[row, column] > LIGHT_CELLS else "white")
    unshown = 0  # the points in cells that read n/a (one without a value beside valued ones is left out of the mean)
    grid = table.to_numpy(dtype=float)
    rows_at = {label: place for place, label in enumerate(table.index)}
    columns_at = {label: place for place, label in enumerate(table.columns)}
    out_of_memory_cells = set(zip(out_of_memory[y], out_of_memory[x], strict=True))
    for (y_value, x_value), points in Counter(zip(unknown[y], unknown[x], strict=True)).items():
        row, column = rows_at.get(y_value), columns_at.get(x_value)
        if row is not None and column is not None and not np.isfinite(grid[row, column]):
            unshown += points
            if (y_value, x_value) not in out_of_memory_cells:
                ax.text(column, row, "n/a", ha="center", va="center", fontsize=8, color="grey")
    for y_value, x_value in out_of_memory_cells:
        row, column = rows_at[y_value], columns_at[x_value]
        if not np.isfinite(grid[row, column]):
            ax.text(column, row, "OOM", ha="center", va="center", fontsize=8, color="firebrick")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    colorbar = figure.colorbar(image, ax=ax, label=scale.label(value))
    colorbar.ax.yaxis.set_major_formatter(PlainFormatter())
    ax.set_title(f"{value} over {x} x {y}" + (
        f"\nmean of up to {shared} points per cell: more axes vary than --x and --y show" if shared > 1 else "") + (
        f"\n{unshown} point{'s have' if unshown > 1 else ' has'} no {value} (n/a)" if unshown else "")
        + _out_of_memory_line(frame))
    _fit_title_width(figure, ax)
    _fit_label_height(figure, ax)
    _fit_label_height(figure, colorbar.ax)
    return figure


def _fit_title_width(figure: Figure, ax) -> None:
    """Make the figure wide enough for the title over ``ax``: a heatmap of two columns is 3.4 in wide, and the
    title of a job sweep's (`goodput_tokens_per_s.mean over restart.spares x checkpoint.interval`, then the line
    saying cells hold means) ran 121 px past its left edge and 130 px past its right, under the colour bar. The
    axes, and the title centred over them, widen by the width added less the fixed margins: half of it moves
    each end of the title, hence twice the larger overrun (and a margin)."""
    for _ in range(3):
        figure.draw_without_rendering()
        title = ax.title.get_window_extent()
        overrun = max(-title.x0, title.x1 - figure.bbox.width)
        if overrun <= 0:
            return
        figure.set_figwidth(figure.get_figwidth() + (2 * overrun) / figure.dpi + 0.2)


def _fit_label_height(figure: Figure, ax) -> None:
    """Make the figure tall enough for the y label beside the axes: a long axis name (parallelism.pipeline.
    schedule) over a plot of two rows ran up into the title."""
    figure.draw_without_rendering()
    label, axes = ax.yaxis.label.get_window_extent(), ax.get_window_extent()
    if label.height > axes.height:
        figure.set_figheight(figure.get_figheight() + (label.height - axes.height) / figure.dpi + 0.2)


def busbw_figure(rows: pd.DataFrame, *, label: str = "algorithm") -> Figure:
    """Bus bandwidth (GB/s) against message size, one line per ``label`` value (columns `bytes`,
    `busbw_GBps` and ``label``), as nccl-tests reports it."""
    for column in ("bytes", "busbw_GBps", label):
        _check_columns(rows, {"OUTDIR": column})
    figure = Figure(figsize=(8, 5), layout="constrained")
    ax = figure.add_subplot()
    for value, group in rows.groupby(label, sort=True):
        ordered = group.sort_values("bytes")
        ax.plot(ordered["bytes"], ordered["busbw_GBps"], marker="o", label=_resolved(str(value), ordered))
    sizes = np.sort(rows["bytes"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [format_size(size) for size in sizes], rotation=45, fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.grid(color="#DDDDDD", linewidth=0.6)
    ax.legend(title=label, fontsize=8)
    ops = ", ".join(sorted(rows["op"].unique())) if "op" in rows.columns else "collective"
    ranks = sorted(rows["ranks"].unique()) if "ranks" in rows.columns else []
    on = f" on {int(ranks[0]):,} ranks" if len(ranks) == 1 else ""
    ax.set_title(f"{ops}{on}: bus bandwidth vs size")
    return figure


def _resolved(label: str, ordered: pd.DataFrame) -> str:
    """A line's legend label; an `auto` line of `trainsim collective --json` rows also says which algorithm ran
    at which sizes ('auto: tree to 8 MiB, ring to 4 GiB'), since the tuner switches along the line."""
    if label != "auto" or "resolved_algorithm" not in ordered.columns:
        return label
    runs: list[tuple[str, float]] = []
    for algorithm, size in zip(ordered["resolved_algorithm"], ordered["bytes"]):
        if runs and runs[-1][0] == algorithm:
            runs[-1] = (algorithm, size)
        else:
            runs.append((algorithm, size))
    return "auto: " + ", ".join(f"{algorithm} to {format_size(size)}" for algorithm, size in runs)


def pareto_front(points: pd.DataFrame, memory: str, throughput: str) -> pd.DataFrame:
    """The rows no other row beats on both less memory and more throughput, by memory."""
    ordered = points.sort_values([memory, throughput], ascending=[True, False])
    best = -np.inf
    keep = []
    for index, value in zip(ordered.index, ordered[throughput]):
        if value > best:
            keep.append(index)
            best = value
    return ordered.loc[keep]


def _label_inwards(ax, text: str, x: float, y: float, xs: pd.Series, rise: float) -> None:
    """Label the point (x, y) on the side of it facing the middle of ``xs`` (the plotted points' x), ``rise``
    points above it: a label on the right of the rightmost point, or on the left of the leftmost, runs off the
    figure."""
    low, high = float(xs.min()), float(xs.max())
    rightwards = not (high > low and (x - low) / (high - low) > 0.5)
    ax.annotate(text, (x, y), fontsize=8, xytext=(5 if rightwards else -5, rise), textcoords="offset points",
                ha="left" if rightwards else "right")


def front_figure(candidates: pd.DataFrame) -> Figure:
    """The layout search's simulated layouts: tokens/s against peak memory, the Pareto front's points ringed and
    joined, the winner (the best of the searched space, none where nothing of it simulated) and the decision
    tree's choice labelled (a search folder's candidates.parquet)."""
    for column in ("status", "peak_memory_gib", "tokens_per_s", "label", "tree_choice", "searched"):
        _check_columns(candidates, {"OUTDIR": column})
    simulated = candidates[candidates["status"] == CandidateStatus.SIMULATED]
    figure = Figure(figsize=(8, 5), layout="constrained")
    ax = figure.add_subplot()
    rate = column_scale("tokens_per_s", simulated["tokens_per_s"])
    simulated = simulated.assign(shown_rate=rate.scaled(simulated["tokens_per_s"]))
    ax.scatter(simulated["peak_memory_gib"], simulated["shown_rate"], color="#4C72B0", label="simulated layouts")
    front = pareto_front(simulated, "peak_memory_gib", "shown_rate")
    ax.plot(front["peak_memory_gib"], front["shown_rate"], color="#C44E52", marker="o", markersize=10,
            fillstyle="none", label="throughput-memory front")  # ringed: a front of one point draws no line
    memories = simulated["peak_memory_gib"]
    searched = simulated[simulated["searched"].astype(bool)]
    if len(searched):
        winner = (ranked(searched) if "memory_tight" in searched else
                  searched.sort_values("tokens_per_s", ascending=False)).iloc[0]
        _label_inwards(ax, f"best: {winner['label']}", winner["peak_memory_gib"], winner["shown_rate"], memories, 5)
    for _, tree in simulated[simulated["tree_choice"].astype(bool)].iterrows():
        ax.scatter([tree["peak_memory_gib"]], [tree["shown_rate"]], color="#DD8452", marker="s", s=60,
                   label="decision tree's layout")
        _label_inwards(ax, f"tree: {tree['label']}", tree["peak_memory_gib"], tree["shown_rate"], memories, -12)
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel(rate.unit)  # in the unit the largest reaches, as every per-second column of a chart
    ax.yaxis.set_major_formatter(PlainFormatter())
    ax.grid(color="#DDDDDD", linewidth=0.6)
    ax.legend(fontsize=8)
    ax.set_title(_front_title(candidates))
    return figure


def _front_title(candidates: pd.DataFrame) -> str:
    """The front's title: the searched space's layouts by status, the decision tree's layout outside it apart, as
    the search's text counts them (`sweep.report.status_counts`), wrapped to the chart's width."""
    return textwrap.fill(f"layout search of {status_counts(*split_by_space(candidates))}", FRONT_TITLE_WIDTH,
                         break_long_words=False)


def _read_table(path: Path, name: str, manifest_allowed: str | None = None) -> pd.DataFrame:
    """The table ``name`` of the folder ``path`` (or the file ``path``); with ``manifest_allowed`` (what the
    folder should be), after checking it against its folder's manifest, as a run's charts are (a sweep's folder
    has none: it is appended to point by point). A path that is not there is 'no such file or folder', as
    busbw's: either would be read."""
    table = path / name if path.is_dir() else path
    if not path.exists():
        raise outdir_error(path, "no such file or folder", manifest_allowed or TABLE_ALLOWED)
    if not table.is_file():
        raise outdir_error(path, (path.is_dir() and other_kind(path, (name,))) or f"has no {name}",
                           manifest_allowed or TABLE_ALLOWED)
    if manifest_allowed is not None:
        checked_manifest(table.parent, (table.name,), manifest_allowed)
    return read_parquet_table(table, path, TABLE_ALLOWED)


def collective_rows(path: Path) -> pd.DataFrame:
    """Rows of (op, bytes, busbw_GBps, label) from `trainsim collective --json` output, or from a sweep whose
    points are one collective each (the label is the sweep's first axis that is not the message size)."""
    if not path.exists():
        raise outdir_error(path, "no such file or folder", BUSBW_ALLOWED)
    if path.is_file() and path.suffix == ".json":
        try:
            rows = pd.DataFrame(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise outdir_error(path, f"not readable JSON ({exc})", BUSBW_ALLOWED) from None
        missing = [column for column in COLLECTIVE_JSON_COLUMNS if column not in rows.columns]
        if missing:
            raise outdir_error(path, f"not the rows of a collective table (no {', '.join(missing)})", BUSBW_ALLOWED)
        return rows
    frame = _ok(_read_table(path, "results.parquet"))
    if "collectives[0].busbw_GBps" not in frame.columns:
        raise outdir_error(path, "its sweep points are not collectives (no collectives[0].busbw_GBps column)",
                           BUSBW_ALLOWED)
    axes = [c for c in frame.columns[3:] if not c.startswith(("collectives[", "step_time", "makespan"))]
    label = next((axis for axis in axes if "bytes" not in axis), None)
    rows = pd.DataFrame({"op": frame.get("collectives[0].op"), "bytes": frame.get("collectives[0].bytes"),
                         "busbw_GBps": frame.get("collectives[0].busbw_GBps")})
    rows["algorithm"] = frame[label].astype(str) if label else "all"
    return rows


def study_figure(chart: StudyChart, path: Path, *, x: str | None = None, y: str | None = None, hue: str | None = None,
                 value: str | None = None, log_x: bool = False) -> Figure:
    """The figure of one study chart read from ``path`` (a sweep or search folder, or collective JSON)."""
    if chart == "front":
        candidates = _read_table(path, "candidates.parquet", SEARCH_ALLOWED)
        countable = {"status", "searched"} <= set(candidates)  # else front_figure names the column missing
        if countable and not (candidates["status"] == CandidateStatus.SIMULATED).any():
            raise outdir_error(path, f"no layout was simulated ({status_counts(*split_by_space(candidates))})",
                               f"{SEARCH_ALLOWED} where at least one layout simulated")
        return front_figure(candidates)
    if chart == "busbw":
        return busbw_figure(collective_rows(path))
    frame = _with_ok_points(_read_table(path, "results.parquet"), path)  # a folder no sweep's is told so first
    if chart == "sweep" and x is not None and y is None:
        raise ScenarioError("a sweep chart needs --y", field="--y", allowed=_numeric_columns(_ok(frame)))
    if chart == "heatmap" and value is None:
        raise ScenarioError("a heatmap chart needs --value", field="--value", allowed=_numeric_columns(_ok(frame)))
    if x is None or y is None:
        raise ScenarioError(f"a {chart} chart needs --x and --y", field="--x", allowed=COLUMN_ALLOWED)
    if chart == "heatmap":
        return heatmap_figure(frame, x, y, value or "")
    return sweep_figure(frame, x, y, hue, log_x=log_x)
