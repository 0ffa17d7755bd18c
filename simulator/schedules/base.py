"""The vocabulary of pipeline schedules: the Action type, shape checks and the completeness check of a table.

A schedule is a list of action lists, one per pipeline rank; each rank runs its list in order. Which virtual
stage chunk ``c`` of rank ``r`` holds is the schedule's placement: ``loop`` puts it at ``c * p + r`` (Megatron's
interleaved layout; with one chunk, stage = rank), ``v`` zigzags, so that with two chunks rank r holds stages r
and 2p - 1 - r (the V shape of ZBV and DualPipeV) and the turn at the middle stays on one rank.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from simulator.config.parallelism_options import SCHEDULE_FIELD
from simulator.errors import ScenarioError, yaml_spelling

ActionKind = Literal["F", "B", "W", "BW"]
ACTION_KINDS: dict[str, ActionKind] = {kind: kind for kind in get_args(ActionKind)}
"""Each action kind by its letters, as `parse_action` reads them."""
Placement = Literal["loop", "v"]
PLACEMENTS: tuple[Placement, ...] = ("loop", "v")
PLACEMENT_NAMES: dict[Placement, str] = {"loop": "loop", "v": "V"}
"""Each placement as errors and the docs name it (`the V placement`)."""
PLACEMENT_SITTING: dict[Placement, str] = {"loop": ", looped", "v": " in a V"}
"""How a rank's chunks sit in the pipeline, by placement, as a warning words it after their count ('2 a rank,
looped', '2 a rank in a V')."""

STAGES_FIELD = "parallelism.pp"
MICROBATCHES_FIELD = "training.microbatches"
VIRTUAL_STAGES_FIELD = "parallelism.pipeline.virtual_stages"
TABLE_FIELD = "parallelism.pipeline.table"
OVERLAP_MARK = "+"
ORDER_RULE = "F, then BW or B ... W, for every micro-batch and chunk"
"""What every rank of a schedule must run for each (micro-batch, chunk), in this order."""

_ACTION_PATTERN = re.compile(r"^(BW|F|B|W)(\d+)(?:C(\d+))?$")


@dataclass(frozen=True, slots=True)
class Action:
    """One pipeline step on one rank: F forward, B input-grad backward, W weight-grad, BW the whole backward.
    ``overlap`` marks a backward that shares one slot with the forward before it (DualPipe's overlapped F&B:
    PyTorch's OVERLAP_F_B runs the two back to back, each when its own input is there)."""

    kind: ActionKind
    microbatch: int
    chunk: int = 0
    overlap: bool = False

    def __str__(self) -> str:
        suffix = f"c{self.chunk}" if self.chunk else ""
        return f"{self.kind}{self.microbatch}{suffix}"


RankActions = list[list[Action]]
"""Each pipeline rank's actions, in the order it runs them."""


class Schedule(RankActions):
    """Each pipeline rank's action list, and the placement of its chunks (`rank_stages`): `build_schedule`
    gives a named schedule the registry's (`V_PLACED` are 'v', the others 'loop'), a table its placement row's.
    `simulate_schedule` and `schedule_to_csv` read it, so that a V schedule runs in its V without the caller
    naming it. Equal to any list of the same actions (the placement is no part of ``==``)."""

    __slots__ = ("_placement",)

    def __init__(self, ranks: Iterable[list[Action]] = (), placement: Placement = "loop") -> None:
        super().__init__(ranks)
        self._placement: Placement = placement

    @property
    def placement(self) -> Placement:
        """Which virtual stage each chunk holds: 'loop' (chunk c of rank r is stage c p + r) or 'v'."""
        return self._placement

    def __reduce__(self) -> tuple[type[Schedule], tuple[list[list[Action]], Placement]]:
        """Pickle and copy as the rank lists and the placement: every pickle protocol, 0 and 1 too, which a
        class with ``__slots__`` refuses without it."""
        return Schedule, (list(self), self._placement)

    def __repr__(self) -> str:
        return f"Schedule({list.__repr__(self)}, placement={self._placement!r})"


def placement_of(schedule: RankActions) -> Placement:
    """The placement a schedule carries; 'loop' for a plain list of action lists."""
    return schedule.placement if isinstance(schedule, Schedule) else "loop"


ScheduleBuilder = Callable[[int, int, int], RankActions]


def parse_action(text: str) -> Action:
    """Read an action written as its str ("F3", "B0c1", "W5", "BW2"); raises ValueError when it is not one."""
    match = _ACTION_PATTERN.match(text.strip().upper())
    if match is None:
        raise ValueError(f"'{text}' is not an action")
    kind, microbatch, chunk = match.groups()
    return Action(ACTION_KINDS[kind], int(microbatch), int(chunk) if chunk else 0)


def parse_slot(text: str) -> list[Action]:
    """Read one slot: an action, or a forward and a backward overlapped in one slot ("F4+BW1c1")."""
    parts = [parse_action(part) for part in text.split(OVERLAP_MARK)]
    if len(parts) == 1:
        return parts
    forward, backward = parts if len(parts) == 2 else (None, None)
    if forward is None or backward is None or forward.kind != "F" or backward.kind not in ("B", "BW"):
        raise ValueError(f"'{text}' is not an overlapped slot (a forward + a backward)")
    return [forward, Action(backward.kind, backward.microbatch, backward.chunk, overlap=True)]


def slots(actions: list[Action]) -> list[str]:
    """One rank's actions as slot words: overlapped pairs joined by '+', the inverse of parse_slot."""
    words: list[str] = []
    for action in actions:
        if action.overlap and words:
            words[-1] += OVERLAP_MARK + str(action)
        else:
            words.append(str(action))
    return words


def format_schedule(schedule: RankActions) -> str:
    """The schedule as text, one line per rank ("r0: F0 F1 B0 ..."), for logs, docs and failure messages."""
    return "\n".join(f"r{rank}: " + " ".join(slots(actions)) for rank, actions in enumerate(schedule))


def rank_stages(rank: int, p: int, v: int, placement: Placement = "loop") -> list[int]:
    """The virtual stages rank ``rank`` holds, chunk 0 first: ``loop`` c p + r, ``v`` mirrored on odd chunks."""
    if placement == "v":
        return [c * p + (rank if c % 2 == 0 else p - 1 - rank) for c in range(v)]
    return [c * p + rank for c in range(v)]


def stage_action_counts(schedule: RankActions, v: int) -> list[Counter[ActionKind]]:
    """How many actions of each kind (F, B, W, BW) run on each virtual stage, in stage order: each rank's
    actions on the stage its chunk holds under the schedule's placement (`rank_stages`)."""
    p = len(schedule)
    placement = placement_of(schedule)
    counts: list[Counter[ActionKind]] = [Counter() for _ in range(p * v)]
    for rank, actions in enumerate(schedule):
        stages = rank_stages(rank, p, v, placement)
        for action in actions:
            counts[stages[action.chunk]][action.kind] += 1
    return counts


def stage_rank(stage: int, p: int, placement: Placement = "loop") -> int:
    """The pipeline rank holding virtual stage ``stage``."""
    if placement == "v" and (stage // p) % 2:
        return p - 1 - stage % p
    return stage % p


def check_shape(p: int, m: int, v: int = 1) -> None:
    """Reject pipeline sizes no schedule can run: fewer than one stage, micro-batch or chunk."""
    for value, field, name in ((p, STAGES_FIELD, "pipeline stages"), (m, MICROBATCHES_FIELD, "micro-batches"),
                               (v, VIRTUAL_STAGES_FIELD, "chunks per rank")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScenarioError(f"{name} must be a whole number >= 1, got {yaml_spelling(value)}", field=field,
                                allowed="integers >= 1")


def require_single_chunk(name: str, v: int) -> None:
    """Schedules that keep one model chunk per rank refuse v > 1, pointing at the interleaved one."""
    if v != 1:
        raise ScenarioError(f"schedule '{name}' keeps one chunk per rank, got virtual_stages = {v}",
                            field=VIRTUAL_STAGES_FIELD, allowed="1 (use 'interleaved' for more chunks per rank)",
                            reads=(SCHEDULE_FIELD,))


def validate_schedule(schedule: RankActions, p: int, m: int, v: int = 1, *, field: str = SCHEDULE_FIELD,
                      file: str = "", rank_lines: list[int] | None = None) -> None:
    """Check that a table has p ranks and runs, on every rank, each (micro-batch, chunk) once forward and once
    backward (one BW, or one B followed later by one W), backward after forward. ``rank_lines`` gives the file
    line of each rank's row, so an error about one rank points at it."""
    try:
        _validate_ranks(schedule, p, m, v, field, file)
    except _RankError as exc:
        line = rank_lines[exc.rank] if rank_lines else None
        raise ScenarioError(exc.problem, field=field, allowed=exc.allowed, file=file, line=line) from None


class _RankError(Exception):
    """A problem in one rank's row of a schedule, located by the caller."""

    def __init__(self, rank: int, problem: str, allowed: str):
        super().__init__(problem)
        self.rank, self.problem, self.allowed = rank, problem, allowed


def _validate_ranks(schedule: RankActions, p: int, m: int, v: int, field: str, file: str) -> None:
    if len(schedule) != p:
        raise ScenarioError(f"the schedule has {len(schedule)} ranks, the pipeline has {p} stages",
                            field=field, allowed=f"{p} rows", file=file)
    for rank, actions in enumerate(schedule):
        counts = Counter((a.kind, a.microbatch, a.chunk) for a in actions)
        duplicated = [k for k, n in counts.items() if n > 1]
        if duplicated:
            kind, mb, c = duplicated[0]
            raise _RankError(rank, f"rank {rank} runs {Action(kind, mb, c)} {counts[duplicated[0]]} times",
                             "each action once per rank")
        for action in actions:
            if not (0 <= action.microbatch < m and 0 <= action.chunk < v):
                raise _RankError(rank, f"rank {rank} runs {action}, outside micro-batches 0..{m - 1} and chunks "
                                       f"0..{v - 1}", f"micro-batches < {m}, chunks < {v}")
        # The (micro-batch, chunk) pairs with a forward, in order, up to the first one missing: walking them
        # costs the rank's actions, not m v (a table's largest index sets m, however few actions it holds).
        forwards = sorted((a.microbatch, a.chunk) for a in actions if a.kind == "F")
        complete = next((i for i, key in enumerate(forwards) if key != divmod(i, v)), len(forwards))
        _check_rank_order(rank, actions, forwards[:complete])
        if complete < m * v:
            raise _RankError(rank, f"rank {rank} never runs {Action('F', *divmod(complete, v))}", ORDER_RULE)


def _check_rank_order(rank: int, actions: list[Action], keys: list[tuple[int, int]]) -> None:
    """Each (micro-batch, chunk) of ``keys``, all run forward on this rank, has its backward after it."""
    position = {(a.kind, a.microbatch, a.chunk): i for i, a in enumerate(actions)}
    for mb, c in keys:
        label = str(Action("F", mb, c))[1:]
        forward = position[("F", mb, c)]
        whole = position.get(("BW", mb, c))
        grad = position.get(("B", mb, c))
        weight = position.get(("W", mb, c))
        if whole is not None:
            if grad is not None or weight is not None:
                problem = f"rank {rank} runs BW{label} and also a split B/W for it"
            elif whole < forward:
                problem = f"rank {rank} runs the backward of {label} before F{label}"
            else:
                continue
        elif grad is None or weight is None:
            problem = f"rank {rank} needs BW{label}, or both B{label} and W{label}"
        elif grad < forward:
            problem = f"rank {rank} runs the backward of {label} before F{label}"
        elif weight < grad:
            problem = f"rank {rank} runs W{label} before B{label}"
        else:
            continue
        raise _RankError(rank, problem, ORDER_RULE)
