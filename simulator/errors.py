"""Errors a user can cause (bad scenario or topology) and errors the simulation can hit (deadlock).

User errors render as one line, ``FILE:LINE: field.path: problem (allowed: ...)``, which the CLI prints
before exiting with status 2; where the value the problem quotes is close to names the allowed list gives, the line
names them: ``unknown key 'global_bacth' (did you mean global_batch?) (allowed: ...)``.
"""

from __future__ import annotations

import difflib
import json
import re
import signal
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from simulator.sweep.search import SearchResult

T = TypeVar("T")


def yaml_spelling(value: object) -> str:
    """A value a user gave, as a message echoes it: in YAML's words (`true`, `false`, `null`, not Python's `True`
    and `None`), a text quoted, a mapping or list as JSON (which YAML reads too)."""
    if value is None or isinstance(value, (bool, dict, list, tuple)):
        return json.dumps(value, default=str)
    return repr(value)


QUOTED = re.compile(r"'([^'\n]+)'")
"""A value a problem quotes as the user wrote it (`unknown key 'global_bacth'`, `'h100' is not supported`)."""
ALLOWED_NAME = re.compile(r"[\w.+/-]+")
"""One name of an allowed list (a key, an option's value, a flag), not the prose some lists end with ('or a path to
a YAML file')."""
LIST_OF = "a comma list of "
"""The words before the names of an option that takes several ('a comma list of none, selective, full')."""
SIMILAR = 0.75
"""The least `difflib` ratio of a close name: 'llama3-7b' finds llama3-8b (0.89) and llama3-70b (0.84), '1f1f'
finds 1f1b (0.75), 'tp' finds neither cp nor pp (0.5); the names at the two best ratios are named."""
SHORTEST_PREFIX = 3
"""The fewest letters of a value cut short that find the names it begins: 'h100' finds h100-sxm, 'gpu' gpu_model."""
MOST_COMPLETIONS = 3
"""The most names a value cut short is the beginning of that are named: 'llama3' names llama3-8b, llama3-70b and
llama3-405b; a value that begins more names says too little to name any."""
SEPARATORS = "-_. "
"""The characters that split a name into words ('gpu_model', 'h100-sxm'): a value cut short ends before one."""


def _folded(name: str) -> str:
    """A name as its spellings compare: case, '-', '_', '.' and spaces ignored ('allreduce' is all_reduce)."""
    return re.sub(r"[-_. ]", "", name.casefold())


def _completes(name: str, given: str) -> bool:
    """Whether ``name`` is ``given`` (case aside) going on at a separator: 'gpu_model' completes 'gpu', 'gpus' (a
    word of its own) does not."""
    head = name.casefold()
    cut = given.casefold()
    return len(head) > len(cut) and head.startswith(cut) and head[len(cut)] in SEPARATORS


def allowed_names(allowed: str) -> list[str]:
    """The names an ``allowed`` text lists ('a, b or c'; 'a comma list of a, b, c' too; 'a, b, or a path to a YAML
    file' ends in prose, left out), or none where it is not such a list ('distinct values, durations with units,
    e.g. 5min,10min')."""
    parts = [part.strip() for part in allowed.removeprefix(LIST_OF).split(",")]
    head, _, tail = parts[-1].rpartition(" or ")
    parts[-1:] = [part for part in (head.strip(), tail.strip()) if part] if " or " in parts[-1] else parts[-1:]
    if parts and not ALLOWED_NAME.fullmatch(parts[-1]) and " or " in allowed.split(",")[-1]:
        parts.pop()  # a prose alternative after the names: 'or a path to a YAML file'
    return parts if parts and all(ALLOWED_NAME.fullmatch(part) for part in parts) else []


def close_names(given: str, allowed: str) -> list[str]:
    """The names of the ``allowed`` list (`allowed_names`) that ``given`` most likely misspells: those it equals
    but for case and separators; else those it is the beginning of up to a separator (cut short), in the list's
    order, none where more than MOST_COMPLETIONS are; else those `difflib` finds most alike (`_alike`). Empty where
    none is close or ``given`` is one of them."""
    names = allowed_names(allowed)
    folded = _folded(given)
    if not folded or given in names:
        return []
    same = [name for name in names if _folded(name) == folded]
    if same:
        return same
    completions = [name for name in names if len(folded) >= SHORTEST_PREFIX and _completes(name, given)]
    if completions:
        return completions if len(completions) <= MOST_COMPLETIONS else []
    return _alike(given, names)


def _alike(given: str, names: list[str]) -> list[str]:
    """The names `difflib` finds at least SIMILAR alike to ``given``, case aside, at the two best ratios, best first
    and in the list's order within a ratio; a ratio that more names share than MOST_COMPLETIONS allows with those
    before it is left out ('zero9' names zero0, zero1 and zero2, each 0.8 alike, not two of them)."""
    spelt: dict[str, str] = {}
    for name in names:
        spelt.setdefault(name.casefold(), name)
    matcher = difflib.SequenceMatcher(b=given.casefold())
    ratios: dict[str, float] = {}
    for folded_name in spelt:
        matcher.set_seq1(folded_name)
        ratios[folded_name] = matcher.ratio()
    meant: list[str] = []
    for best in sorted({ratio for ratio in ratios.values() if ratio >= SIMILAR}, reverse=True)[:2]:
        tied = [spelt[name] for name, ratio in ratios.items() if ratio == best]
        if len(meant) + len(tied) > MOST_COMPLETIONS:
            break
        meant += tied
    return meant


def did_you_mean(given: str, allowed: str, said: str = "") -> str:
    """' (did you mean X?)' naming the close names of ``given`` in ``allowed`` ('X or Y' for two, 'X, Y or Z' for
    three), less those the problem ``said`` names already (`units are case-sensitive (GiB)`), or nothing where none
    is left."""
    meant = [name for name in close_names(given, allowed)
             if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", said)]
    if not meant:
        return ""
    listed = ", ".join(meant[:-1]) + " or " + meant[-1] if len(meant) > 1 else meant[0]
    return f" (did you mean {listed}?)"


class Kept(Enum):
    """`InputError.rebuilt`'s mark of a part left as it was (None is a value ``line`` can take)."""

    KEPT = "kept"


KEPT = Kept.KEPT


class TrainsimError(Exception):
    """Base class of every error trainsim raises on purpose."""


class InputError(TrainsimError):
    """A mistake in a user's input, located by file, line and field path; ``at_flag``: ``file`` is a flag of the
    command (`--set a.b=v`, `--intervals`), not a file, whatever its name; ``reads``: the other fields (dotted
    paths, a section standing for every field under it) that a check across fields read, so that the error names
    the overrides that wrote any of them (`config/loader.located_error`)."""

    def __init__(self, problem: str, *, field: str = "", allowed: str = "", file: str = "", line: int | None = None,
                 at_flag: bool = False, reads: tuple[str, ...] = ()):
        self.problem = problem
        self.reads = reads
        self.field = field
        self.allowed = allowed
        self.file = file
        self.line = line
        self.at_flag = at_flag
        super().__init__(self.render())

    def located(self, file: str | None = None, line: int | None = None, field_prefix: str = "") -> InputError:
        """A copy of this error with its location filled in where it was not known yet."""
        field = self.field
        if field_prefix:
            field = f"{field_prefix}.{field}" if field else field_prefix
        return self.rebuilt(field=field, file=self.file or (file or ""),
                            line=self.line if self.line is not None else line)

    def rebuilt(self, kind: type[InputError] | None = None, *, problem: str | Kept = KEPT,
                field: str | Kept = KEPT, allowed: str | Kept = KEPT, file: str | Kept = KEPT,
                line: int | Kept | None = KEPT, at_flag: bool | Kept = KEPT) -> InputError:
        """This error as ``kind`` (its own class unless given) with the parts given replaced and the others
        (KEPT, the default) kept, its mark of a flag (``at_flag``) too; a part given empty, or ``line`` None,
        has none (no line, where the error moves off the file). A copy made here drops no part of its location
        (one that left out ``at_flag`` turned `--set a.b=v: problem` back into `--set a.b=v: a.b: problem`, off
        the command line; one that left out ``line`` named a flag's error without the line its topology file
        gave). A new error built from ``problem`` names a place of its own instead of the original's: a workload
        item's field (simulation.py), the command line (cli.py's topology argument) or the sweep file's line
        (sweep/spec.py). One mark of a kept part: before, the others took None, so a caller clearing ``file``
        with None kept it."""
        return (kind or type(self))(
            self.problem if problem is KEPT else problem,
            field=self.field if field is KEPT else field,
            allowed=self.allowed if allowed is KEPT else allowed,
            file=self.file if file is KEPT else file,
            line=self.line if line is KEPT else line,
            at_flag=self.at_flag if at_flag is KEPT else at_flag,
            reads=self.reads,
        )

    @property
    def shown_field(self) -> str:
        """The field the line names: none where the error is located at a flag that names it already, a `--set`
        of the field or of a key under it (`--set a.b=v: problem`, not `--set a.b=v: a.b: problem`) or a command's
        option, which sets one field (`--intervals: 60 d: problem`); a field inside the section a `--set` wrote
        is named (`--set a={b: 1}: a.b: problem`)."""
        if not self.at_flag:
            return self.field
        setting = self.file.partition(" ")[2]
        key = setting.split("=", 1)[0].strip()
        named = not setting or key == self.field or key.startswith((f"{self.field}.", f"{self.field}["))
        return "" if named else self.field

    def render(self) -> str:
        """The one line the user sees: ``FILE:LINE: field: problem (allowed: ...)``, with the names of the allowed
        list close to the value the problem quotes first (`did_you_mean`)."""
        where = self.file or "<input>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        field = self.shown_field
        text = f"{where}: {field}: {self.problem}" if field else f"{where}: {self.problem}"
        if self.allowed:
            quoted = QUOTED.search(self.problem)
            text += did_you_mean(quoted[1], self.allowed, self.problem) if quoted else ""
            text += f" (allowed: {self.allowed})"
        return text

    def __str__(self) -> str:
        return self.render()

    def __reduce__(self) -> tuple[object, ...]:
        """Pickled by its fields, so that a copy from a worker process is this error exactly: Exception's own
        pickling rebuilt it from its rendered line, as InputError('<input>: FILE:LINE: ...'), whose `args` stayed
        that line after the fields were restored (and a subclass taking other arguments would not rebuild)."""
        return (_rebuilt, (type(self), self.problem, self.field, self.allowed, self.file, self.line, self.at_flag),
                self.__dict__)


def _rebuilt(cls: type[InputError], problem: str, field: str, allowed: str, file: str,
             line: int | None, at_flag: bool) -> InputError:
    """An InputError (of subclass ``cls``) from its fields, as unpickled (`InputError.__reduce__`)."""
    error = cls.__new__(cls)
    InputError.__init__(error, problem, field=field, allowed=allowed, file=file, line=line, at_flag=at_flag)
    return error


class ScenarioError(InputError):
    """The scenario file (or a --set override) is not valid."""


class TopologyError(InputError):
    """The topology file or its parameters describe no usable cluster."""


class TraceError(InputError):
    """A trace file cannot be read or replayed; ``file`` is the trace and ``field`` the event (traceEvents[i])."""


def lookup(registry: Mapping[str, T], name: str, what: str, field: str,
           allowed: Iterable[str] | None = None) -> T:
    """``registry[name]``; an unknown name is the one error every registry raises, a ScenarioError
    "unknown WHAT 'name'" at ``field`` listing the names ``allowed`` (the registry's keys unless given)."""
    try:
        return registry[name]
    except (KeyError, TypeError):
        names = registry if allowed is None else allowed
        raise ScenarioError(f"unknown {what} {name!r}", field=field, allowed=", ".join(names)) from None


class SimulationError(TrainsimError):
    """The simulation could not finish, e.g. a collective that some ranks never joined (deadlock)."""


class ExecutorError(TrainsimError):
    """The machinery that runs a sweep's points failed, e.g. an unreachable Dask scheduler (exit status 1)."""


class WorkerKilled(ExecutorError):
    """A pool's worker process was ended from outside (the out-of-memory killer, `kill -9`) before its points
    finished; each command says what of its work is kept."""


class StepAborted(SimulationError):
    """A fault stopped the step at ``at_s``: a GPU failed, or failed links left some GPUs unable to reach others."""

    def __init__(self, at_s: float, reason: str):
        super().__init__(at_s, reason)  # SimPy re-raises a process's exception as type(exc)(*exc.args)
        self.at_s = at_s
        self.reason = reason

    def __str__(self) -> str:
        return f"step aborted at {self.at_s:.6g} s: {self.reason}"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a command: Ctrl-C and `kill`'s SIGTERM (held back while a run's files move into place;
a worker process leaves both to the process that started it)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a batch scheduler's or a container's stop), raised where Ctrl-C raises KeyboardInterrupt,
    so that a command stops as it does on Ctrl-C (its workers ended, nothing half-written) and exits 143
    (128 + 15) instead of vanishing with its workers left blocked on their pipes."""


class InterruptedWritten(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM: ``terminated``) while a run's files were moved into its folder, held back until the
    move ended, or just after it: the folder holds the complete run (with its manifest) and the command stops
    after writing it."""

    def __init__(self, out_dir: Path, terminated: bool = False) -> None:
        super().__init__(str(out_dir))
        self.out_dir = out_dir
        self.terminated = terminated


class SearchStopped(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM: ``terminated``) while a layout search simulated its candidates: ``result`` (its
    `SearchResult`) holds the layouts simulated so far, the rest marked `stopped`, for the command to write
    (before, a search stopped after 8 of its 9 simulations wrote nothing)."""

    def __init__(self, result: SearchResult, terminated: bool) -> None:
        super().__init__("the layout search was stopped")
        self.result = result
        self.terminated = terminated
