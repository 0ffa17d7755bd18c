"""Output paths given on the command line, checked before any work starts: a run or a plot that cannot write
its result is refused in one line instead of failing after minutes of simulation."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.errors import InputError

if TYPE_CHECKING:
    from simulator.report.run_folder import FolderKind

COMMAND_LINE = "command line"
"""Where an error in an option is located (in place of FILE:LINE)."""
WRITABLE = "a path inside a writable folder"
FIGURE_FORMATS = ("png", "svg", "pdf", "eps", "jpg", "jpeg", "tif", "tiff")
"""Image formats the plots are saved in (matplotlib's Agg, SVG, PDF and PS backends, Pillow for the rest)."""


def command_line(prog: str) -> str:
    """Where an error in one of ``prog``'s flags is located ('command line: trainsim search'), the one place both
    argparse's refusals and a command's own checks of its flags take it from: the file, then the command."""
    return f"{COMMAND_LINE}: {prog}"


def at_flag(text: str, flags: Iterable[str]) -> bool:
    """Whether a library warning's text begins at one of ``flags``, the command's flags as the library locates
    what the user gave there (`--set a.b=v`, `--intervals`), not knowing the command. A warning is text by then
    (study.json keeps it), and a file's name may begin as a flag does (`--x.yaml:7: ...`), so only the flags
    given count; an error says so itself (`InputError.at_flag`)."""
    return any(text.startswith(f"{flag}: ") for flag in flags)


def on_command_line(warning: str, prog: str, flags: Iterable[str]) -> str:
    """A warning the library located at one of ``prog``'s ``flags`` (`--intervals: 60 d: ...`, as study.json keeps
    it) on the command line, as the command's errors are (`command line: trainsim study: --intervals: 60 d: ...`);
    any other as it is."""
    return f"{command_line(prog)}: {warning}" if at_flag(warning, flags) else warning


def option_error(option: str, problem: str, allowed: str) -> InputError:
    """An InputError about a command-line option."""
    return InputError(problem, field=option, allowed=allowed, file=COMMAND_LINE)


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _check_writable(folder: Path, given: str, option: str) -> None:
    """Create and remove an empty probe folder in ``folder``, the nearest existing folder of the path ``given``:
    the only test that holds for every user (root included) and every file system (read-only mounts, /proc,
    which takes no new entry and says that no such file exists). Refused, the line names the path given and
    that ``folder`` is not writable, with the system's reason where it says more than that."""
    if not folder.is_dir():
        raise option_error(option, f"{folder} is not a folder", WRITABLE)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".trainsim-probe-", dir=folder))
    except OSError as exc:
        reason = "" if exc.errno == errno.ENOENT or not exc.strerror else f" ({exc.strerror})"
        where = "it" if Path(given).absolute() == folder else str(folder)
        raise option_error(option, f"cannot write {given}: {where} is not writable{reason}", WRITABLE) from None


def output_folder(text: str, kind: FolderKind, option: str = "--out") -> Path:
    """The folder a command writing ``kind``'s results will write into: not empty, not a file, inside a folder
    this user can write, and not holding another command's results (`run_folder.other_results`)."""
    from simulator.report.run_folder import other_results

    if not text.strip():
        raise option_error(option, "the output folder is empty", "a folder path such as runs/a")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise option_error(option, f"{text} exists and is not a folder", "a folder path")
    _check_writable(_nearest_existing(path), text, option)
    refused = other_results(path, kind)
    if refused is not None:
        raise option_error(option, *refused)
    return path


def chosen_figure_file(given: str | None, default: str, option: str = "--output") -> Path:
    """`figure_file` of the option's value, or of ``default`` where the option was left out (None): an empty
    value was given, and is refused as any other name without an image format (`or default` saved it as the
    default)."""
    return figure_file(default if given is None else given, option)


def figure_file(text: str, option: str = "--output") -> Path:
    """An image file to save a figure to: a format in FIGURE_FORMATS, inside a writable folder."""
    path = Path(text)
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FIGURE_FORMATS:
        problem = f"unknown image format '.{suffix}'" if suffix else f"cannot tell the image format of {text!r}"
        raise option_error(option, problem, ", ".join(f".{name}" for name in FIGURE_FORMATS))
    if path.is_dir():
        raise option_error(option, f"{text} is a folder", "an image file path such as gantt.png")
    _check_writable(_nearest_existing(path.parent), text, option)
    return path
