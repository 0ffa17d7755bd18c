"""The one registry of pipeline schedules by name, and the lookup that turns a name into a builder."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from simulator.config.parallelism_options import CUSTOM_SCHEDULE, SCHEDULE_FIELD, SCHEDULE_NAMES
from simulator.errors import ScenarioError, lookup
from simulator.schedules.base import TABLE_FIELD, Action, Placement, Schedule, ScheduleBuilder, placement_of
from simulator.schedules.custom_csv import csv_schedule
from simulator.schedules.gpipe import gpipe
from simulator.schedules.interleaved import interleaved, interleaved_zero_bubble
from simulator.schedules.looped_bfs import looped_bfs
from simulator.schedules.one_f_one_b import one_f_one_b
from simulator.schedules.v_shape import dualpipe_v, zbv
from simulator.schedules.zero_bubble import zb_h1

SCHEDULES: dict[str, ScheduleBuilder] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "zb-h1": zb_h1,
    "interleaved-zb": interleaved_zero_bubble,
    "looped-bfs": looped_bfs,
    "zbv": zbv,
    "dualpipev": dualpipe_v,
}
"""name -> builder, one per config/parallelism_options.py BuiltinSchedule."""

V_PLACED = frozenset({"zbv", "dualpipev"})
"""Schedules whose chunks sit in the V placement; every other one loops (chunk c of rank r is stage c p + r).
They keep exactly two chunks per rank."""
ONE_CHUNK = frozenset({"gpipe", "1f1b", "zb-h1"})
"""Schedules that keep one model chunk per rank; the others but the V ones take any number of chunks."""
SINGLE_STAGE = frozenset({"gpipe", "1f1b"})
"""Schedules torch.distributed.pipelining runs with their own loop (ScheduleGPipe, Schedule1F1B), which waits for
the backward sends before the stage reduces its gradients; every other one runs on _PipelineScheduleRuntime."""


@dataclass(frozen=True)
class ClosedForm:
    """A schedule's textbook bubble at uniform stages, written out, and whether it holds at every micro-batch
    count or only from m >= p on."""

    formula: str
    every_m: bool


BUBBLE_CLOSED_FORMS = {"gpipe": ClosedForm("(p-1)/(m+p-1)", every_m=True),
                       "1f1b": ClosedForm("(p-1)/(m+p-1)", every_m=True),
                       "interleaved": ClosedForm("(p-1)/(v m+p-1)", every_m=False),
                       "looped-bfs": ClosedForm("(p-1)/(v m+p-1)", every_m=False)}
"""The schedules whose bubble at uniform stages has the closed form (p-1)/(v m+p-1) (v = 1 for the one-chunk
ones): exact at every m for gpipe and 1f1b; for interleaved and looped-bfs from m >= p on, where below it a
rank's next chunk waits for the pipeline's first micro-batch (40% at p = 4, m = 3, v = 2, not 3/9)."""


@dataclass(frozen=True)
class ClosedFormBubble:
    """A schedule's closed-form bubble (`BUBBLE_CLOSED_FORMS`) for one pipeline: '(p-1)/(v m+p-1)' = 3/19 at
    p = 4, m = 8, v = 2, and whether it is the schedule's bubble there (`exact`)."""

    formula: str
    numerator: int
    denominator: int
    exact: bool

    @property
    def fraction(self) -> float:
        return self.numerator / self.denominator


def closed_form_bubble(name: str, p: int, m: int, v: int = 1) -> ClosedFormBubble | None:
    """Schedule ``name``'s closed-form bubble at p stages, m micro-batches and v chunks per rank, None for a
    schedule without one."""
    form = BUBBLE_CLOSED_FORMS.get(name)
    if form is None:
        return None
    return ClosedFormBubble(form.formula, p - 1, v * m + p - 1, form.every_m or m >= p)


@dataclass(frozen=True)
class Filling:
    """The fewest micro-batches that fill a schedule's pipeline, and the rule that gives them as a warning's
    allowed text words it ('one a rank', '3p/2 rounded down for zbv')."""

    microbatches: int
    rule: str


def filling_microbatches(name: str, p: int) -> Filling:
    """The fewest micro-batches that fill schedule ``name``'s pipeline of p ranks. For zb-h1, looped-bfs and
    zbv it is where more micro-batches stop shortening a rank's idle time (the ideal executor at uniform
    stages): one a rank, p, but zbv's idle per rank keeps falling to 3p/2 rounded down (at p = 4,
    F = B = W = 1 per stage: 3 at m = 4, 2 at m = 5, 1.5 from m = 6 on). GPipe and 1F1B idle the same at every
    m ((p-1)(F+B+W) a rank: 9 at p = 4), so theirs, and every other schedule's, is p by convention: a
    micro-batch is on one stage at a time, so with fewer than p some rank holds none at every instant and idles."""
    if name == "zbv":
        return Filling(p + p // 2, "3p/2 rounded down for zbv")
    return Filling(p, "one a rank")


def schedule_names() -> list[str]:
    """Every name get_schedule accepts: the registered schedules and 'custom' (a CSV table)."""
    return list(SCHEDULE_NAMES)


def get_schedule(name: str, table: str | Path | None = None) -> ScheduleBuilder:
    """The builder ``(p, m, v) -> per-rank actions`` for ``name``; 'custom' reads the CSV action table ``table``."""
    if name == CUSTOM_SCHEDULE:
        if table is None:
            raise ScenarioError("schedule 'custom' needs a CSV action table", field=TABLE_FIELD,
                                allowed="a path to a CSV file, one row of actions per rank")
        return csv_schedule(table)
    return lookup(SCHEDULES, name, "schedule", SCHEDULE_FIELD, schedule_names())


def schedule_placement(name: str) -> Placement:
    """Which virtual stage each chunk holds for the registered schedule ``name``: 'v' or 'loop' (a custom table's
    is its `Schedule.placement`, from its optional placement row)."""
    return "v" if name in V_PLACED else "loop"


def serves_chunks(name: str, v: int) -> bool:
    """Whether schedule ``name`` is made for ``v`` chunks per rank: one for gpipe, 1f1b and zb-h1, two for the
    V ones, two or more for the other interleaved ones (which also run one, deeper than 1f1b); never for
    'custom', whose table fixes v."""
    if name in ONE_CHUNK:
        return v == 1
    if name in V_PLACED:
        return v == 2
    return name in SCHEDULES and v >= 2


def build_schedule(name: str, p: int, m: int, v: int = 1, table: str | Path | None = None) -> Schedule:
    """The per-rank action lists of schedule ``name`` for p stages, m micro-batches and v chunks per rank, each
    call its own lists, with their placement (`schedule_placement`). A named schedule is built once per
    (name, p, m, v): a layout search asks for the same ones for many candidates."""
    if table is not None:
        built = get_schedule(name, table)(p, m, v)
        return Schedule(built, placement_of(built))
    return Schedule([list(actions) for actions in _named_schedule(name, p, m, v)], schedule_placement(name))


@lru_cache(maxsize=256)
def _named_schedule(name: str, p: int, m: int, v: int) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(actions) for actions in get_schedule(name)(p, m, v))
