"""Custom schedules from a CSV action table: one row per pipeline rank, one action per cell, run left to right.

Cells are actions as ``str(Action)`` writes them: F3 (forward of micro-batch 3), B3 (input-grad backward),
W3 (weight-grad), BW3 (whole backward), with an optional chunk suffix (F0c1). Blank lines, blank cells and lines
starting with '#' are skipped. The table fixes p (rows), m and v (largest micro-batch and chunk + 1).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from simulator.config.yaml_source import read_user_text
from simulator.errors import ScenarioError
from simulator.schedules.base import (
    TABLE_FIELD,
    Schedule,
    ScheduleBuilder,
    parse_action,
    validate_schedule,
)


def schedule_to_csv(schedule: Schedule) -> str:
    """The schedule as CSV text that parse_schedule_csv reads back unchanged."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for actions in schedule:
        writer.writerow(str(action) for action in actions)
    return buffer.getvalue()


def parse_schedule_csv(text: str, source: str = "") -> Schedule:
    """Read a CSV action table and check it is complete; ``source`` names the file in errors."""
    schedule: Schedule = []
    rank_lines: list[int] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [cell.strip() for cell in next(csv.reader([line])) if cell.strip()]
        actions = []
        for cell in cells:
            try:
                actions.append(parse_action(cell))
            except ValueError:
                raise ScenarioError(f"'{cell}' is not an action", field=TABLE_FIELD, file=source,
                                    line=line_number, allowed="F3, B3, W3, BW3, F0c1 ...") from None
        schedule.append(actions)
        rank_lines.append(line_number)
    if not schedule or not any(schedule):
        raise ScenarioError("the schedule table has no actions", field=TABLE_FIELD, file=source,
                            allowed="one row of actions per pipeline rank")
    m, v = table_size(schedule)
    validate_schedule(schedule, len(schedule), m, v, field=TABLE_FIELD, file=source, rank_lines=rank_lines)
    return schedule


def table_size(schedule: Schedule) -> tuple[int, int]:
    """(micro-batches, chunks per rank) that a table covers: largest index + 1 of each."""
    actions = [a for rank in schedule for a in rank]
    return max(a.microbatch for a in actions) + 1, max(a.chunk for a in actions) + 1


def load_schedule_csv(path: str | Path) -> Schedule:
    """Read and check the CSV action table at ``path``."""
    text = read_user_text(path, ScenarioError, field=TABLE_FIELD, allowed="a readable UTF-8 CSV file")
    return parse_schedule_csv(text, source=str(path))


def csv_schedule(path: str | Path) -> ScheduleBuilder:
    """A schedule builder serving the table at ``path``; it refuses a (p, m, v) the table does not cover."""
    schedule = load_schedule_csv(path)
    m_table, v_table = table_size(schedule)

    def build(p: int, m: int, v: int = 1) -> Schedule:
        if (p, m, v) != (len(schedule), m_table, v_table):
            raise ScenarioError(f"the schedule table is for p = {len(schedule)}, m = {m_table}, v = {v_table}; "
                                f"the scenario asks for p = {p}, m = {m}, v = {v}", field=TABLE_FIELD,
                                file=str(path), allowed="a table matching the pipeline sizes")
        return [list(actions) for actions in schedule]

    return build
