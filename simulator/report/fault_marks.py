"""The step's faults as the charts and files of a run mark them, read off the summary's `faults`: each slowed
GPU's factor, the moments links fail or degrade within the step, and the faults.parquet table of both (kept apart
from timeline.parquet, whose every row is an op or a flow). Only faults that struck the finished step are marked:
a link fault timed at or after its end changed nothing, and a GPU failure at or before it aborts the step, which then
has no outputs, so no GPU failure is ever marked (the summary's `faults.gpu_failures` lists those after the end)."""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from simulator.metrics.summary import factor_text, pace

FaultKind = Literal["link down", "link degraded"]


class FaultMark(NamedTuple):
    """A link fault's window within the step: when it strikes and when the link comes back (NaN: it stays so to
    the step's end), in seconds from the step's start, its kind, the link's label and the fraction of line rate it
    keeps."""

    at_s: float
    kind: FaultKind
    what: str
    capacity: float
    until_s: float


def step_end_s(summary: dict) -> float:
    """When the step ends, in seconds from its start: a training step's time, a communication-only run's
    makespan."""
    return float(summary.get("step_time_s", summary.get("makespan_s", 0.0)))


def _windows(link: dict, end: float) -> list[tuple[float, float]]:
    """The (start, back) windows of a link fault (summary `faults.links` entry) that start before the step's
    ``end``: one from `at_s`, to `until_s` where it comes back (NaN where it does not), repeated every `every_s`,
    `count` times or to the step's end, as the engine applies them (`faults.step.LinkEvent.times`)."""
    start, until, every = link["at_s"], link.get("until_s"), link.get("every_s")
    back = math.nan if until is None else until
    if every is None:
        return [(start, back)] if start < end else []
    windows = []
    k = 0
    while (link.get("count") is None or k < link["count"]) and start + k * every < end:
        windows.append((start + k * every, back + k * every))
        k += 1
    return windows


def fault_marks(summary: dict) -> list[FaultMark]:
    """The link faults of the step (the summary's `faults`) that struck before its end, each window of one that
    comes back or flaps apart, in order of time."""
    links = (summary.get("faults") or {}).get("links") or []
    end = step_end_s(summary)
    return sorted(FaultMark(start, "link down" if link["capacity"] == 0 else "link degraded", link["link"],
                            link["capacity"], back) for link in links for start, back in _windows(link, end))


def slowdown_notes(summary: dict) -> dict[int, str]:
    """What slows each slowed GPU (rank) of the step, by GPU index: its compute factor as the console's
    `step faults` row says it ("x1.3 slower", "x1.001 slower", "x0.939 (faster)"), with "and a swing" where the
    factor swings in time."""
    slowed = (summary.get("faults") or {}).get("slowed_gpus") or {}
    return {int(gpu): (f"x{factor_text(entry['factor'])} {pace(entry['factor'], entry['factor'])}"
                       + (" and a swing" if entry.get("swings") else ""))
            for gpu, entry in slowed.items()}


FAULT_TYPES = {"kind": "string", "at_s": "float64", "until_s": "float64", "what": "string", "gpu": "int64",
               "factor": "float64", "capacity": "float64"}
"""faults.parquet's columns and their Arrow types: the fault's kind (`straggler` or a FaultKind), when it strikes
and when the link comes back (seconds from the step's start; a straggler is slow from 0, and NaN: to the step's
end), what it strikes (a link's label, 'GPU 3'), the GPU index (-1 for a link), the compute slowdown factor (1 but
for a straggler) and the fraction of line rate left (1 but for a link)."""
FAULT_COLUMNS = tuple(FAULT_TYPES)


def fault_rows(summary: dict) -> dict[str, list]:
    """faults.parquet's columns (FAULT_COLUMNS): the stragglers by GPU index, then the windows of the link faults
    that struck the step (`fault_marks`) in order of time; empty lists when it has none."""
    faults = summary.get("faults") or {}
    slowed = sorted((int(gpu), entry["factor"]) for gpu, entry in (faults.get("slowed_gpus") or {}).items())
    rows: list[tuple] = [("straggler", 0.0, math.nan, f"GPU {gpu}", gpu, factor, 1.0) for gpu, factor in slowed]
    rows += [(mark.kind, mark.at_s, mark.until_s, mark.what, -1, 1.0, mark.capacity) for mark in fault_marks(summary)]
    return {column: [row[index] for row in rows] for index, column in enumerate(FAULT_COLUMNS)}
