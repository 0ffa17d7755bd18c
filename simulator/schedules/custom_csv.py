"""Custom schedules from a CSV action table: one row per pipeline rank, one action per cell, run left to right.

Cells are actions as ``str(Action)`` writes them: F3 (forward of micro-batch 3), B3 (input-grad backward),
W3 (weight-grad), BW3 (whole backward), with an optional chunk suffix (F0c1), or an overlapped slot, a forward
and a backward joined by '+' (F4+BW1c1). An optional first row ``placement,v`` puts the chunks in the V
placement (default ``loop``). Blank lines, blank cells (a row of commas too) and lines starting with '#' are
skipped, as is a leading byte-order mark. The table fixes p (rows), m and v (largest micro-batch and chunk + 1).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from simulator.config.yaml_source import read_user_text
from simulator.errors import ScenarioError, SimulationError
from simulator.schedules.base import (
    PLACEMENT_NAMES,
    PLACEMENTS,
    TABLE_FIELD,
    Placement,
    Schedule,
    ScheduleBuilder,
    parse_slot,
    slots,
    validate_schedule,
)
from simulator.schedules.timing import schedule_order

PLACEMENT_ROW = "placement"
BYTE_ORDER_MARK = "\ufeff"
"""What spreadsheets put before the first cell of a CSV saved as UTF-8."""


def schedule_to_csv(schedule: Schedule, placement: Placement = "loop") -> str:
    """The schedule as CSV text that parse_schedule_csv reads back unchanged (with its placement row when the
    chunks sit in the V placement)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if placement != "loop":
        writer.writerow((PLACEMENT_ROW, placement))
    for actions in schedule:
        writer.writerow(slots(actions))
    return buffer.getvalue()


def parse_schedule_csv(text: str, source: str = "") -> Schedule:
    """Read a CSV action table and check it is complete; ``source`` names the file in errors."""
    return _read_table(text, source)[0]


def _read_table(text: str, source: str) -> tuple[Schedule, Placement, int]:
    """The table's actions, its placement and the line of its placement row (its first row where it has none)."""
    schedule: Schedule = []
    rank_lines: list[int] = []
    placement: Placement = "loop"
    placement_line: int | None = None
    for line_number, line in enumerate(text.removeprefix(BYTE_ORDER_MARK).splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [cell.strip() for cell in next(csv.reader([line])) if cell.strip()]
        if not cells:
            continue
        if cells[0].lower() == PLACEMENT_ROW and not schedule:
            placement = _placement(cells[1:], source, line_number)
            placement_line = line_number
            continue
        actions = []
        for cell in cells:
            try:
                actions.extend(parse_slot(cell))
            except ValueError:
                raise ScenarioError(f"'{cell}' is not an action", field=TABLE_FIELD, file=source,
                                    line=line_number, allowed="F3, B3, W3, BW3, F0c1, F4+BW1c1 ...") from None
        schedule.append(actions)
        rank_lines.append(line_number)
    if not schedule or not any(schedule):
        raise ScenarioError("the schedule table has no actions", field=TABLE_FIELD, file=source,
                            allowed="one row of actions per pipeline rank")
    m, v = table_size(schedule)
    validate_schedule(schedule, len(schedule), m, v, field=TABLE_FIELD, file=source, rank_lines=rank_lines)
    return schedule, placement, placement_line or rank_lines[0]


def refuse_the_other_placement(path: str | Path, deadlock: SimulationError) -> None:
    """Refuse the table at ``path`` that deadlocks in its placement (``deadlock``, from the check that it runs:
    a table that runs is never ordered twice) where it has several chunks per rank and runs in the other
    placement, at its placement row (its first row where it has none), naming the row that places it (a V table
    without `placement,v`). Nothing where it deadlocks in both."""
    schedule, placement, line = _load_table(path)
    _, v = table_size(schedule)
    if v == 1:
        return
    other = next(each for each in PLACEMENTS if each != placement)
    try:
        schedule_order(schedule, v, other)
    except SimulationError:
        return
    given = "the default without a placement row" if placement == "loop" else "as its placement row asks"
    row = "no placement row, or placement,loop" if other == "loop" else f"placement,{other} as the first row"
    raise ScenarioError(f"{deadlock}, {given}; the table runs in the {PLACEMENT_NAMES[other]} placement",
                        field=TABLE_FIELD, file=str(path), line=line, allowed=row) from None


def _placement(cells: list[str], source: str, line: int) -> Placement:
    for placement in PLACEMENTS:
        if cells == [placement]:
            return placement
    raise ScenarioError(f"placement row names {', '.join(cells) or 'nothing'}", field=TABLE_FIELD, file=source,
                        line=line, allowed=f"placement,{' or placement,'.join(PLACEMENTS)}")


def table_size(schedule: Schedule) -> tuple[int, int]:
    """(micro-batches, chunks per rank) that a table covers: largest index + 1 of each."""
    actions = [a for rank in schedule for a in rank]
    return max(a.microbatch for a in actions) + 1, max(a.chunk for a in actions) + 1


def load_schedule_csv(path: str | Path) -> Schedule:
    """Read and check the CSV action table at ``path``."""
    return _load_table(path)[0]


def load_table_placement(path: str | Path) -> Placement:
    """The placement the CSV action table at ``path`` asks for ('loop' unless it has a placement row)."""
    return _load_table(path)[1]


def _load_table(path: str | Path) -> tuple[Schedule, Placement, int]:
    text = read_user_text(path, ScenarioError, field=TABLE_FIELD, allowed="a readable UTF-8 CSV file")
    return _read_table(text, source=str(path))


def csv_schedule(path: str | Path) -> ScheduleBuilder:
    """A schedule builder serving the table at ``path``; it refuses a (p, m, v) the table does not cover."""
    schedule = load_schedule_csv(path)
    m_table, v_table = table_size(schedule)

    def build(p: int, m: int, v: int = 1) -> Schedule:
        if (p, m, v) != (len(schedule), m_table, v_table):
            raise ScenarioError(f"the schedule table is for p = {len(schedule)}, m = {m_table}, v = {v_table}; "
                                f"the scenario asks for p = {p}, m = {m}, v = {v}", field=TABLE_FIELD,
                                file=str(path), allowed=f"parallelism.pp: {len(schedule)}, {m_table} micro-batches "
                                "(training.microbatches, or a global_batch of dp x micro_batch x "
                                f"{m_table}) and parallelism.pipeline.virtual_stages: {v_table}; or a table for "
                                f"p = {p}, m = {m}, v = {v}")
        return [list(actions) for actions in schedule]

    return build
