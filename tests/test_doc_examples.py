"""What the README and docs/*.md show a user to type is accepted: every `trainsim` command parses, and every
whole scenario (a YAML block with a `cluster:`) validates.

A page that shows a command with what it prints (a block that opens with `$ trainsim ...`) shows what it prints
now: the command is run (its `--out` in a temporary folder) and its output compared line for line, and the
summary.json excerpt of docs/training-step.md is compared with the summary of that run.

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
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from simulator import load_scenario, simulate
from simulator.cli import _parser, main
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


SHOWN_RUN = re.compile(r"```\n\$ (trainsim [^\n]+)\n(.*?)```", re.S)
"""A code block that opens with a `$ trainsim ...` line: the command, then what it prints."""


def shown_outputs(path: Path) -> list[tuple[str, str]]:
    """The (command, printed text) pairs a page shows."""
    return [(command, printed) for command, printed in SHOWN_RUN.findall(path.read_text()) if printed.strip()]


OUTPUTS = [pytest.param(path.relative_to(ROOT).as_posix(), command, printed, id=f"{path.name}-{index}")
           for path in DOCS for index, (command, printed) in enumerate(shown_outputs(path))]


def test_the_docs_show_outputs():
    assert {case.values[0] for case in OUTPUTS} >= {"README.md", "docs/collectives.md", "docs/reliability.md",
                                                     "docs/training-step.md"}


@pytest.mark.parametrize(("page", "command", "printed"), OUTPUTS)
def test_a_command_the_docs_show_prints_what_they_show(page, command, printed, tmp_path, monkeypatch, capsys):
    """Figures a page shows drift from the code when a cost changes; the failure prints the new text to paste. A
    refusal the page shows (its last line `error: ...`) is its output and then its one-line error, exit 2."""
    argv = shlex.split(command)[1:]
    shown_out = argv[argv.index("--out") + 1] if "--out" in argv else None
    if shown_out is not None:
        argv[argv.index("--out") + 1] = str(tmp_path / "out")
    monkeypatch.chdir(ROOT)
    refused = printed.splitlines()[-1].startswith("error: ")
    status = main(argv)
    captured = capsys.readouterr()
    assert status == (2 if refused else 0), captured.err
    now = captured.out + captured.err if refused else captured.out
    if shown_out is not None:
        now = now.replace(str(tmp_path / "out"), shown_out)
    assert now == printed, f"{page}: `{command}` now prints:\n{now}"


def test_the_summary_excerpt_of_training_step_md_is_the_runs():
    """docs/training-step.md shows an excerpt of summary.json of `trainsim run llama3-8b-dgx-h100-dp8`: each key
    it shows holds what the run writes."""
    page = (ROOT / "docs" / "training-step.md").read_text()
    excerpt = json.loads(re.findall(r"```json\n(.*?)```", page, re.S)[-1])
    summary = json.loads(json.dumps(simulate(load_scenario("llama3-8b-dgx-h100-dp8")).summary))
    assert shown_part(summary, excerpt) == excerpt


def shown_part(value: object, shown: object) -> object:
    """``value`` cut to the keys ``shown`` has, at every depth (an excerpt may leave keys of a mapping out)."""
    if isinstance(value, dict) and isinstance(shown, dict):
        return {key: shown_part(value.get(key), part) for key, part in shown.items()}
    return value
