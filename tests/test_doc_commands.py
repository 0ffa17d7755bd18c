"""Every `trainsim` command the README and docs/*.md show is one the command line accepts.

A user copies these lines; a subcommand renamed or a flag dropped leaves them showing a command that fails at
once (`trainsim topo dgx-h100-cluster` once stood where `topo describe` was meant). Only the parsing is checked
(placeholders such as SCENARIO or DIR parse as any value would), and prose that names a command without its
arguments or a flag without its value (`trainsim run --force`, `trainsim collective --chunk`) only for its
subcommands and flags; commands that show alternatives or
optional parts (`[--strict]`, `local|serial|dask`, `...`) are templates, not commands, and are left out."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from simulator.cli import _parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
INLINE = re.compile(r"`(trainsim [^`]+)`")
TEMPLATE_MARKS = ("[", "|", "...")


def shown_commands(path: Path) -> list[str]:
    """The `trainsim ...` commands of a page: lines of its code blocks (a trailing backslash continues a line)
    and inline code spans, less the templates."""
    text = path.read_text()
    commands = INLINE.findall(FENCE.sub("", text))
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").strip()
            if line.startswith("trainsim "):
                commands.append(line)
    return [command for command in commands if not any(mark in command for mark in TEMPLATE_MARKS)]


CASES = [(path.relative_to(ROOT).as_posix(), command) for path in DOCS for command in shown_commands(path)]


def test_the_docs_show_commands():
    assert len(CASES) > 20


@pytest.mark.parametrize(("page", "command"), CASES)
def test_a_command_the_docs_show_parses(page, command, capsys):
    argv = shlex.split(command, comments=True)[1:]
    try:
        _parser().parse_args(argv)
    except SystemExit as exc:
        refusal = capsys.readouterr().err
        named_only = "arguments are required" in refusal or "expected one argument" in refusal
        assert exc.code == 0 or named_only, f"{page}: `{command}` is refused: {refusal}"
