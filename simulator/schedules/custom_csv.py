"""Custom schedules from a CSV action table: one row per pipeline rank, one action per cell, run left to right.

Cells are actions as ``str(Action)`` writes them: F3 (forward of micro-batch 3), B3 (input-grad backward), W3
(weight-grad), BW3 (whole backward), with an optional chunk suffix (F0c1), or an overlapped slot, a forward and a
backward joined by '+' (F4+BW1c1). An optional first row ``placement,v`` puts the chunks in the V placement (default
``loop``). Cells are read as CSV (a quoted cell is its text), without the spaces around them or around a '+', in
either case (``f0`` is F0, ``placement,V`` the V) and with or without chunk 0's suffix (F0c0). Blank lines, blank
cells (a row of commas too) and lines starting with '#' are skipped, as is a leading byte-order mark. The table
fixes p (rows), m and v (largest micro-batch and chunk + 1).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from simulator.config.yaml_source import read_user_text
from simulator.errors import ScenarioError
from simulator.schedules.base import (
    ORDER_RULE,
    PLACEMENT_NAMES,
    PLACEMENTS,
    TABLE_FIELD,
    Action,
    Placement,
    RankActions,
    Schedule,
    ScheduleBuilder,
    parse_slot,
    placement_of,
    slots,
    validate_schedule,
)
from simulator.schedules.timing import ScheduleDeadlock, schedule_order

PLACEMENT_ROW = "placement"
_PLACEMENT_ROWS = f"{PLACEMENT_ROW},{f' or {PLACEMENT_ROW},'.join(PLACEMENTS)}"
BYTE_ORDER_MARK = "\ufeff"
"""What spreadsheets put before the first cell of a CSV saved as UTF-8."""


def schedule_to_csv(schedule: RankActions, placement: Placement | None = None) -> str:
    """The schedule as CSV text that parse_schedule_csv reads back unchanged (with its placement row when the
    chunks sit in the V placement: ``placement``, else the schedule's own)."""
    placement = placement_of(schedule) if placement is None else placement
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if placement != "loop":
        writer.writerow((PLACEMENT_ROW, placement))
    for actions in schedule:
        writer.writerow(slots(actions))
    return buffer.getvalue()


def parse_schedule_csv(text: str, source: str = "") -> Schedule:
    """Read a CSV action table and check it is complete, with its placement row's placement ('loop' without
    one); ``source`` names the file in errors."""
    return _read_table(text, source).schedule


@dataclass(frozen=True, slots=True)
class _Table:
    """A checked action table and where its rows are in its file."""

    schedule: Schedule
    placement: Placement
    placement_line: int
    """The line of its placement row (of its first row where it has none)."""
    rank_lines: tuple[int, ...]
    """The line of each rank's row."""


def _read_table(text: str, source: str) -> _Table:
    """The table in ``text``, checked complete (`validate_schedule`, after `_check_indices`)."""
    schedule: RankActions = []
    rank_lines: list[int] = []
    placement: Placement = "loop"
    placement_line: int | None = None
    for line_number, line in enumerate(text.removeprefix(BYTE_ORDER_MARK).splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [cell.strip() for cell in next(csv.reader([line])) if cell.strip()]
        if not cells:
            continue
        if cells[0].lower() == PLACEMENT_ROW:
            if schedule or placement_line is not None:
                before = f"rank 0's row on line {rank_lines[0]}" if schedule else f"one on line {placement_line}"
                raise ScenarioError(f"the placement row must be the table's first row; {before} comes before it",
                                    field=TABLE_FIELD, file=source, line=line_number,
                                    allowed=f"one row {_PLACEMENT_ROWS}, before the ranks' rows")
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
    _check_indices(schedule, rank_lines, source)
    validate_schedule(schedule, len(schedule), m, v, field=TABLE_FIELD, file=source, rank_lines=rank_lines)
    return _Table(Schedule(schedule, placement), placement, placement_line or rank_lines[0], tuple(rank_lines))


def _check_indices(schedule: RankActions, rank_lines: list[int], source: str) -> None:
    """Every rank's row names each micro-batch and chunk index below the table's m and v, which its largest
    indices set: a row that misses one is refused naming the action that set the size and its line (a stray
    `W1c5` makes a table of 6 chunks per rank). The row holding that action is checked first, so that a stray
    one's own line prefixes the error."""
    for name, index, unit in (("micro-batch", _microbatch, "micro-batches"), ("chunk", _chunk, "chunks per rank")):
        rank, largest = max(((r, a) for r, rank_actions in enumerate(schedule) for a in rank_actions),
                            key=lambda pair: index(pair[1]))
        size = index(largest) + 1
        for r in (rank, *(other for other in range(len(schedule)) if other != rank)):
            named = sorted({index(a) for a in schedule[r]})  # walking these, not range(size): a stray F99999999
            missing = next((i for i, each in enumerate(named) if each != i), len(named))
            if missing < size:
                raise ScenarioError(f"rank {r} runs no action of {name} {missing}, though {largest} on line "
                                    f"{rank_lines[rank]} makes the table {size} {unit} (its largest {name} + 1)",
                                    field=TABLE_FIELD, file=source, line=rank_lines[r],
                                    allowed=f"{ORDER_RULE}; the largest micro-batch and chunk + 1 set m and v")


def _microbatch(action: Action) -> int:
    return action.microbatch


def _chunk(action: Action) -> int:
    return action.chunk


def refuse_deadlocked_table(path: str | Path, deadlock: ScheduleDeadlock) -> NoReturn:
    """Refuse the table at ``path`` that deadlocks in its placement (``deadlock``, from the check that it runs:
    a table that runs is never ordered twice). One of several chunks per rank that runs in the other placement
    is refused at its placement row (its first row where it has none), naming the row that places it (a V table
    without `placement,v`); any other at the row of the lowest rank in the wait cycle that the first stuck rank's
    waits reach (`ScheduleDeadlock.cycle`), naming the cycle's waits: rank 0, which holds stage 0, is stuck in
    every deadlock, though often only waiting on the ranks at fault."""
    table = _load_table(path)
    _, v = table_size(table.schedule)
    other = next(each for each in PLACEMENTS if each != table.placement)
    if v > 1 and _runs(table.schedule, v, other):
        given = "the default without a placement row" if table.placement == "loop" else "as its placement row asks"
        row = "no placement row, or placement,loop" if other == "loop" else f"placement,{other} as the first row"
        raise ScenarioError(f"{deadlock}, {given}; the table runs in the {PLACEMENT_NAMES[other]} placement",
                            field=TABLE_FIELD, file=str(path), line=table.placement_line, allowed=row) from None
    cycle = deadlock.cycle()
    waits = f"; {_wait_cycle(deadlock, cycle)}" if cycle else ""
    raise ScenarioError(f"the schedule cannot run: {deadlock}{waits}", field=TABLE_FIELD, file=str(path),
                        line=table.rank_lines[cycle[0] if cycle else deadlock.stuck_ranks[0]],
                        allowed="an action order in which every dependency can be met") from None


def _wait_cycle(deadlock: ScheduleDeadlock, cycle: tuple[int, ...]) -> str:
    """The waits of ``cycle`` in words: "rank 2's BW0 waits for rank 3's BW0, and rank 3's F1 for rank 2's F1"."""
    waits = dict(zip(deadlock.stuck_ranks, deadlock.waits, strict=True))
    phrases: list[str] = []
    for rank in cycle:
        action, waited, other = waits[rank]
        verb = "" if phrases else " waits"
        phrases.append(f"rank {rank}'s {action}{verb} for rank {waited}'s {other}")
    return phrases[0] if len(phrases) == 1 else f"{', '.join(phrases[:-1])}, and {phrases[-1]}"


def _runs(schedule: RankActions, v: int, placement: Placement) -> bool:
    try:
        schedule_order(schedule, v, placement)
    except ScheduleDeadlock:
        return False
    return True


def _placement(cells: list[str], source: str, line: int) -> Placement:
    for placement in PLACEMENTS:
        if [cell.lower() for cell in cells] == [placement]:
            return placement
    raise ScenarioError(f"placement row names {', '.join(cells) or 'nothing'}", field=TABLE_FIELD, file=source,
                        line=line, allowed=_PLACEMENT_ROWS)


def table_size(schedule: RankActions) -> tuple[int, int]:
    """(micro-batches, chunks per rank) that a table covers: largest index + 1 of each."""
    actions = [a for rank in schedule for a in rank]
    return max(a.microbatch for a in actions) + 1, max(a.chunk for a in actions) + 1


def load_schedule_csv(path: str | Path) -> Schedule:
    """Read and check the CSV action table at ``path``."""
    return _load_table(path).schedule


def _load_table(path: str | Path) -> _Table:
    """The checked table at ``path``. A file that cannot be read is refused without a file of its own, so that
    the scenario's line of `parallelism.pipeline.table` names it (`config/locate.located`); a fault inside the
    file, at the file's line."""
    try:
        text = read_user_text(path, ScenarioError, field=TABLE_FIELD, allowed="a readable UTF-8 CSV file")
    except ScenarioError as exc:
        if exc.line is not None:
            raise
        raise exc.rebuilt(problem=f"cannot read {path}: {exc.problem.removeprefix('cannot read file: ')}",
                          file="") from None
    return _read_table(text, source=str(path))


SIZE_FIELDS = ("parallelism.pp", "training.microbatches", "training.global_batch", "training.micro_batch",
               "parallelism.pipeline.virtual_stages")
"""The scenario's fields that set the (p, m, v) a table must cover, which an error of a table of another size
reads: the overrides that wrote them are named beside the scenario's line of the table."""


def csv_schedule(path: str | Path) -> ScheduleBuilder:
    """A schedule builder serving the table at ``path``; it refuses a (p, m, v) the table does not cover,
    without a file of its own: the fault is the scenario's pairing of the table with its sizes, located at its
    `parallelism.pipeline.table` line (`config/locate.located`), and the message names the table's rows."""
    table = _load_table(path)
    schedule = table.schedule
    m_table, v_table = table_size(schedule)
    rows = f"{table.rank_lines[0]}-{table.rank_lines[-1]}" if len(schedule) > 1 else str(table.rank_lines[0])

    def build(p: int, m: int, v: int = 1) -> RankActions:
        if (p, m, v) != (len(schedule), m_table, v_table):
            raise ScenarioError(f"the schedule table is for p = {len(schedule)}, m = {m_table}, v = {v_table} "
                                f"({path}, its rows on lines {rows}); the scenario asks for p = {p}, m = {m}, v = {v}",
                                field=TABLE_FIELD, reads=SIZE_FIELDS,
                                allowed=f"parallelism.pp: {len(schedule)}, {m_table} micro-batches "
                                "(training.microbatches, or a global_batch of dp x micro_batch x "
                                f"{m_table}) and parallelism.pipeline.virtual_stages: {v_table}; or a table for "
                                f"p = {p}, m = {m}, v = {v}")
        return Schedule([list(actions) for actions in schedule], table.placement)

    return build
