"""What the README and docs/*.md show a user to type is accepted: every `trainsim` command parses, and every
whole scenario (a YAML block with a `cluster:`) validates.

A user copies these lines; a subcommand renamed or a flag dropped leaves them showing a command that fails at
once (`trainsim topo dgx-h100-cluster` once stood where `topo describe` was meant). Only the parsing is checked
(placeholders such as SCENARIO or DIR parse as any value would), and prose that names a command without its
arguments or a flag without its value (`trainsim run --force`, `trainsim collective --chunk`) only for its
subcommands and flags: each flag it shows must be one of its subcommand's options (argparse reports missing
arguments before unknown flags, so its refusal alone would pass `trainsim validate --strikt`). Commands that
show alternatives or optional parts (`[--strict]`, `local|serial|dask`, `run / validate`, `...`) are
templates, not commands, and are left out. A
scenario's relative paths (a trace) are read as from a file in scenarios/, where the bundled fixtures are."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import yaml

from simulator.cli import _parser
from simulator.config.loader import scenario_from_text
from simulator.preflight import validate
from simulator.scale import sized_topology

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
YAML_FENCE = re.compile(r"```yaml\n(.*?)```", re.S)
INLINE = re.compile(r"`(trainsim [^`]+)`")
TEMPLATE_MARKS = ("[", "|", " / ", "...")
FLAG = re.compile(r"--?[A-Za-z][^=]*")


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
        unknown = [flag for flag in shown_flags(argv) if flag not in option_strings(argv)]
        assert not unknown, f"{page}: `{command}` shows flags its subcommand does not have: {unknown}"


def shown_flags(argv: list[str]) -> list[str]:
    """The flags among ``argv``, without an attached value (`--intervals=-5min` is `--intervals`)."""
    return [match[0] for token in argv if (match := FLAG.match(token))]


def option_strings(argv: list[str]) -> set[str]:
    """The option strings of the (sub)command ``argv`` names (`plot gantt`: the gantt parser's)."""
    parser = _parser()
    for token in argv:
        subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        if subcommands and token in subcommands[0].choices:
            parser = subcommands[0].choices[token]
    return set(parser._option_string_actions)


def shown_scenarios(path: Path) -> list[str]:
    """The YAML blocks of a page that are whole scenarios (fragments of one, sweep and topology files are not)."""
    return [block for block in YAML_FENCE.findall(path.read_text()) if "cluster" in (yaml.safe_load(block) or {})]


SCENARIOS = [pytest.param(path.relative_to(ROOT).as_posix(), index, text, id=f"{path.name}-{index}")
             for path in DOCS for index, text in enumerate(shown_scenarios(path))]


def test_the_docs_show_scenarios():
    assert {case.values[0] for case in SCENARIOS} >= {"README.md", "docs/traces.md", "docs/parameter_server.md"}


@pytest.mark.parametrize(("page", "index", "text"), SCENARIOS)
def test_a_scenario_the_docs_show_validates(page, index, text):
    loaded = scenario_from_text(text, str(ROOT / "scenarios" / f"example-{index}.yaml"))
    verdict = validate(loaded, sized_topology(loaded, force=False))
    assert not verdict.memory.get("oom"), page
