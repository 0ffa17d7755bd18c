"""The step's faults as the charts and files of a run mark them, read off the summary's `faults`: each slowed
GPU's factor, the moments links fail or degrade and GPUs fail, and the faults.parquet table of both (kept apart
from timeline.parquet, whose every row is an op or a flow)."""

from __future__ import annotations

from typing import Literal, NamedTuple

FaultKind = Literal["link down", "link degraded", "GPU failure"]


class FaultMark(NamedTuple):
    """A fault at a moment of the step: its time in seconds from the step's start, its kind, what it struck (a
    link's label, 'GPU 3'), the GPU's index (-1 for a link) and the fraction of line rate a link keeps (1 for a
    GPU)."""

    at_s: float
    kind: FaultKind
    what: str
    gpu: int = -1
    capacity: float = 1.0


def fault_marks(summary: dict) -> list[FaultMark]:
    """The link faults and GPU failures of the step (the summary's `faults`), in order of time."""
    faults = summary.get("faults") or {}
    marks = [FaultMark(link["at_s"], "link down" if link["capacity"] == 0 else "link degraded", link["link"],
                       capacity=link["capacity"]) for link in faults.get("links") or []]
    marks += [FaultMark(failure["at_s"], "GPU failure", f"GPU {failure['gpu']}", gpu=failure["gpu"])
              for failure in faults.get("gpu_failures") or []]
    return sorted(marks)


def slowdown_notes(summary: dict) -> dict[int, str]:
    """What slows each slowed GPU (rank) of the step, by GPU index: its compute factor ("x1.3 slower"), with
    "and a swing" where the factor swings in time."""
    slowed = (summary.get("faults") or {}).get("slowed_gpus") or {}
    return {int(gpu): f"x{entry['factor']:.3g} slower" + (" and a swing" if entry.get("swings") else "")
            for gpu, entry in slowed.items()}


FAULT_COLUMNS = ("kind", "at_s", "what", "gpu", "factor", "capacity")
"""faults.parquet's columns: the fault's kind (`straggler` or a FaultKind), when it strikes (seconds from the step's
start; a straggler is slow from 0), what it strikes (a link's label, 'GPU 3'), the GPU index (-1 for a link),
the compute slowdown factor (1 but for a straggler) and the fraction of line rate left (1 but for a link)."""


def fault_rows(summary: dict) -> dict[str, list]:
    """faults.parquet's columns (FAULT_COLUMNS): the stragglers by GPU index, then the link faults and GPU
    failures in order of time; empty lists when the step has no faults."""
    faults = summary.get("faults") or {}
    slowed = sorted((int(gpu), entry["factor"]) for gpu, entry in (faults.get("slowed_gpus") or {}).items())
    rows: list[tuple] = [("straggler", 0.0, f"GPU {gpu}", gpu, factor, 1.0) for gpu, factor in slowed]
    rows += [(mark.kind, mark.at_s, mark.what, mark.gpu, 1.0, mark.capacity) for mark in fault_marks(summary)]
    return {column: [row[index] for row in rows] for index, column in enumerate(FAULT_COLUMNS)}
