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
arguments before unknown flags, so its refusal alone would pass `trainsim validate --strikt`). A command that
gives its subcommand's positional arguments (a scenario, a sweep file), or a value where the subcommand takes
none (`collective --op send_recv`), is a whole command, inline in prose as in a code block: a required option it
leaves out fails it (`trainsim search llama3-8b-dgx-h100-dp8` without `--out DIR` is refused before it runs).
Commands that show alternatives or optional parts (`[--strict]`, `local|serial|dask`, `run / validate`, `...`) are
templates, not commands, and are left out. A
scenario's relative paths (a trace) are read as from a file in scenarios/, where the bundled fixtures are.

Figures quoted in prose are checked where the run is cheap: `trainsim collective` figures of docs/collectives.md
and bundled runs' figures (COLLECTIVE_QUOTES, SCENARIO_QUOTES), and docs/schedules.md's example and CSV table.
Reference tables stay true to the code: docs/architecture.md's module map names every module of simulator/ and
none that is gone, and each field table lists every field of its schema model with the default the model has."""

from __future__ import annotations

import argparse
import ast
import contextlib
import itertools
import json
import math
import re
import shlex
from enum import Enum
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pydantic import BaseModel
from shared import REPO, SCENARIOS, bundled_result

from simulator import load_scenario
from simulator.cli import _parser, main
from simulator.config import schema
from simulator.config.loader import scenario_from_text
from simulator.errors import InputError, ScenarioError
from simulator.preflight import validate
from simulator.program.ops import COMPUTE_STREAM, PIPELINE_CATEGORIES
from simulator.scale import sized_topology
from simulator.schedules import load_schedule_csv
from simulator.simulation import Result
from simulator.units import parse_bandwidth, parse_duration, parse_size
from simulator.workload.training import check_schedule_runs

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
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


CASES = [(path.relative_to(REPO).as_posix(), command) for path in DOCS for command in shown_commands(path)]


def test_the_docs_show_commands():
    assert len(CASES) > 20


@pytest.mark.parametrize(("page", "command"), CASES)
def test_a_command_the_docs_show_parses(page, command, capsys):
    argv = shlex.split(command, comments=True)[1:]
    try:
        _parser().parse_args(argv)
    except SystemExit as exc:
        refusal = capsys.readouterr().err
        assert exc.code == 0 or names_only(argv, refusal), f"{page}: `{command}` is refused: {refusal}"
        unknown = [flag for flag in shown_flags(argv) if flag not in option_strings(argv)]
        assert not unknown, f"{page}: `{command}` shows flags its subcommand does not have: {unknown}"


MISSING = re.compile(r"the following arguments are required: (.+?)(?: \(allowed|$)", re.M)


def names_only(argv: list[str], refusal: str) -> bool:
    """``argv``, refused by argparse with ``refusal``, names a subcommand or a flag rather than a whole command: a
    flag without its value, a subcommand without a positional argument it takes (`run --force`, `plot goodput`),
    or a subcommand with flags and no value (`collective --json`)."""
    if "expected one argument" in refusal:
        return True
    missing = MISSING.search(refusal)
    return missing is not None and (all(token.startswith("-") for token in argv[1:])
                                    or any(not name.startswith("-") for name in missing[1].split(", ")))


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


SHOWN_SCENARIOS = [pytest.param(path.relative_to(REPO).as_posix(), index, text, id=f"{path.name}-{index}")
             for path in DOCS for index, text in enumerate(shown_scenarios(path))]


def test_the_docs_show_scenarios():
    assert {case.values[0] for case in SHOWN_SCENARIOS} >= {"README.md", "docs/traces.md", "docs/parameter_server.md"}


@pytest.mark.parametrize(("page", "index", "text"), SHOWN_SCENARIOS)
def test_a_scenario_the_docs_show_validates(page, index, text):
    loaded = scenario_from_text(text, str(SCENARIOS / f"example-{index}.yaml"))
    verdict = validate(loaded, sized_topology(loaded, force=False))
    assert not verdict.memory.get("oom"), page


SHOWN_RUN = re.compile(r"```\n\$ (trainsim [^\n]+)\n(.*?)```", re.S)
"""A code block that opens with a `$ trainsim ...` line: the command, then what it prints."""


def shown_outputs(path: Path) -> list[tuple[str, str]]:
    """The (command, printed text) pairs a page shows."""
    return [(command, printed) for command, printed in SHOWN_RUN.findall(path.read_text()) if printed.strip()]


OUTPUTS = [pytest.param(path.relative_to(REPO).as_posix(), command, printed, id=f"{path.name}-{index}")
           for path in DOCS for index, (command, printed) in enumerate(shown_outputs(path))]


def test_the_docs_show_outputs():
    assert {case.values[0] for case in OUTPUTS} >= {"README.md", "docs/collectives.md", "docs/reliability.md",
                                                     "docs/training-step.md"}


@pytest.mark.parametrize(("page", "command", "printed"), OUTPUTS)
def test_a_command_the_docs_show_prints_what_they_show(page, command, printed, tmp_path, monkeypatch, capsys):
    """Figures a page shows drift from the code when a cost changes; the failure prints the new text to paste. A
    refusal the page shows (its last line `error: ...`) is its output and then its one-line error, exit 2. The
    progress heartbeat is off (tests/conftest.py): no page shows one, and a loaded machine printed one in a
    refusal's stderr (the 405B study's refusal took 45 s under load ~11)."""
    argv = shlex.split(command)[1:]
    shown_out = argv[argv.index("--out") + 1] if "--out" in argv else None
    if shown_out is not None:
        argv[argv.index("--out") + 1] = str(tmp_path / "out")
    monkeypatch.chdir(REPO)
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
    page = (REPO / "docs" / "training-step.md").read_text()
    excerpt = json.loads(re.findall(r"```json\n(.*?)```", page, re.S)[-1])
    summary = json.loads(json.dumps(bundled_result("llama3-8b-dgx-h100-dp8").summary))
    assert shown_part(summary, excerpt) == excerpt


def shown_part(value: object, shown: object) -> object:
    """``value`` cut to the keys ``shown`` has, at every depth (an excerpt may leave keys of a mapping out)."""
    if isinstance(value, dict) and isinstance(shown, dict):
        return {key: shown_part(value.get(key), part) for key, part in shown.items()}
    return value


MODULE_ROW = re.compile(r"^\| (`[^|]+`) \|(.*)$", re.M)
"""A row of docs/architecture.md's module map: its first cell (the modules it is about), then the rest."""


def module_map() -> list[tuple[str, str]]:
    """The module map's rows as (first cell, whole row)."""
    page = (REPO / "docs" / "architecture.md").read_text()
    return [(match[1], match[0]) for match in MODULE_ROW.finditer(page)]


def named_in_map(module: str, rows: list[tuple[str, str]]) -> bool:
    """``module`` (a path under simulator/) is named in the map: by its path, or by its file name in the row of
    its folder (the `collectives/` row names `ring.py`, `names.py`, ...)."""
    if any(f"`{module}`" in row for _, row in rows):
        return True
    folder, _, file = module.rpartition("/")
    return any(f"`{file}`" in row for first, row in rows if f"`{folder}/`" in first)


README = REPO / "README.md"


def test_readme_names_every_bundled_scenario():
    """README's list of bundled scenarios names each one `trainsim scenarios` lists (a scenario added without a
    word in README fails here)."""
    text = README.read_text()
    bundled = [path.stem for path in sorted(SCENARIOS.glob("*.yaml"))]
    assert len(bundled) > 20
    assert not [name for name in bundled if f"`{name}`" not in text]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The `trainsim` subcommands by name, with their parsers."""
    action = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return dict(action.choices)


def test_readme_command_table_names_every_flag_of_every_subcommand():
    """Each subcommand's options (less --help) are named in the rows of README's command table that show that
    subcommand (`run --workers` and `validate --set/--quiet/--force` went unsaid)."""
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `trainsim ")]
    unnamed = {}
    for name, parser in subcommands(_parser()).items():
        text = " ".join(row for row in rows if re.search(rf"`trainsim {re.escape(name)}(?![\w-])", row.split(" | ")[0]))
        assert text, name
        unnamed[name] = [action.option_strings[-1] for action in parser._actions
                         if action.option_strings and "--help" not in action.option_strings
                         and not any(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)
                                     for flag in action.option_strings)]
    assert unnamed == {name: [] for name in unnamed}


def test_the_module_map_names_every_module_and_no_other():
    rows = module_map()
    package = REPO / "simulator"
    modules = [path.relative_to(package).as_posix() for path in sorted(package.rglob("*.py"))
               if path.name != "__init__.py"]
    assert not [module for module in modules if not named_in_map(module, rows)]
    named = {name for first, _ in rows for name in re.findall(r"`([\w/]+\.py)`", first)}
    named |= {f"{folder}/{file}" for first, row in rows for folder in re.findall(r"`([\w/]+)/`", first)
              for file in re.findall(r"`(\w+\.py)`", row)}
    assert not [name for name in named if not (package / name).exists()]


FIELD_TABLES = [
    ("docs/training-step.md", "### `training`", {"": "TrainingConfig"}),
    ("docs/training-step.md", "### `parallelism`", {"": "ParallelismConfig"}),
    ("docs/network.md", "## Scenario: `network:`", {"": "NetworkConfig"}),
    ("docs/collectives.md", "## Scenario: `collectives:`", {"": "CollectivesConfig"}),
    ("docs/collectives.md", "Fields of an item", {"": "CollectiveItem"}),
    ("docs/cost-model.md", "## Published cases", {"": "PublishedConfig"}),
    ("docs/outputs.md", "## GPU time, energy and cost", {"": "CostsConfig"}),
    ("docs/reliability.md", "The fields and their defaults",
     {"checkpoint.": "CheckpointConfig", "storage.": "StorageConfig", "restart.": "RestartConfig"}),
]
"""The pages' field tables (the first `| field |` table after the anchor) and the schema models each documents,
by the prefix their fields take there; docs/reliability.md's also lists `run.horizon` and `run.replications`."""


def field_table(page: str, anchor: str) -> dict[str, str]:
    """Field name -> its default cell, from the first `| field | default |` table after ``anchor``."""
    lines = (REPO / page).read_text().splitlines()
    start = next(index for index, line in enumerate(lines) if anchor in line)
    header = next(index for index in range(start, len(lines)) if lines[index].startswith("| field | default"))
    table: dict[str, str] = {}
    for line in itertools.takewhile(lambda line: line.startswith("|"), lines[header + 2:]):
        first, default = (cell.strip() for cell in line.split("|")[1:3])
        names = re.findall(r"`([^`]+)`", first)
        defaults = default.split(", ") if len(names) > 1 and default.count(", ") == len(names) - 1 else [default]
        table.update(zip(names, defaults * len(names) if len(defaults) == 1 else defaults, strict=True))
    return table


REQUIRED = object()
"""The default of a field a scenario must give."""

NONE_DEFAULT_CELLS = {
    "global_batch": "none",
    "microbatches": "none",
    "grad_accumulation_fusion": "the framework's",
    "grad_reduce_dtype": "the framework's",
    "loss_scaling": "none",
    "dp": "GPUs / (tp cp pp)",
    "pipeline.table": "none",
    "fsdp": "none",
    "ddp.reduce_every_microbatch": "the framework's",
    "name": "`OP#INDEX` (e.g. `all_reduce#0`)",
    "src": "none",
    "dst": "none",
    "algorithm": "`collectives.algorithm`",
    "protocol": "`collectives.protocol`",
    "checkpoint.size": "parameters x `bytes_per_param`",
    "checkpoint.bytes_per_param": "the layout's",
    "checkpoint.memory": "none",
    "restart.min_replicas": "1",
    "gpu_hour_price": "none",
    "gpu_power": "the catalog GPU's board power",
}
"""The default cell of each field whose schema default is None: what the code does without it, in words."""


def schema_fields(model: type[BaseModel], prefix: str) -> dict[str, object]:
    """A model's fields with their defaults (`REQUIRED` where there is none); a sub-section that is always
    present (`parallelism.pipeline`) by its own fields, an optional one (`training.loss_scaling`) as one field."""
    fields: dict[str, object] = {}
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            fields.update(schema_fields(info.annotation, f"{prefix}{name}."))
        else:
            fields[prefix + name] = REQUIRED if info.is_required() else info.get_default(call_default_factory=True)
    return fields


def shown_default(cell: str) -> object:
    """The value a default cell shows: YAML (`true`, `1`, `[]`, `"no"`), else a quantity with its unit."""
    text = cell.strip("`")
    value = yaml.safe_load(text)
    if not isinstance(value, str):
        return value
    for parse in (parse_size, parse_duration, parse_bandwidth):
        with contextlib.suppress(InputError):
            return parse(value)
    return value


@pytest.mark.parametrize(("page", "anchor", "models"), FIELD_TABLES, ids=[case[1] for case in FIELD_TABLES])
def test_a_field_table_lists_every_field_with_its_default(page, anchor, models):
    table = field_table(page, anchor)
    fields = {name: default for prefix, model in models.items()
              for name, default in schema_fields(getattr(schema, model), prefix).items()}
    assert sorted(set(fields) - set(table)) == [], f"{page}: fields without a row"
    assert sorted(set(table) - set(fields) - {"run.horizon", "run.replications"}) == [], f"{page}: rows of no field"
    for name, default in fields.items():
        if default is REQUIRED:
            assert table[name] == "required", name
        elif default is None:
            assert table[name] == NONE_DEFAULT_CELLS[name], f"{page}: {name} without a value, shown {table[name]}"
        else:
            value = default.value if isinstance(default, Enum) else default
            assert shown_default(table[name]) == value, f"{page}: {name} defaults to {value!r}, shown {table[name]}"


def test_the_schedule_example_of_schedules_md_gives_what_it_shows(capsys):
    page = (REPO / "docs" / "schedules.md").read_text()
    block = re.findall(r"```python\n(.*?)```", page, re.S)[0]
    namespace: dict = {}
    exec(block, namespace)
    order = re.search(r"print\(format_schedule\(schedule\)\)\s+# (.*) \.\.\.", block)[1]
    assert capsys.readouterr().out.startswith(order)
    makespan, bubble, peak = ast.literal_eval(re.search(r"peak_in_flight\s+# (.*)", block)[1])
    timing = namespace["timing"]
    assert (timing.makespan, round(timing.bubble_fraction, 3), timing.peak_in_flight) == (makespan, bubble, peak)


def test_the_csv_table_of_schedules_md_is_what_schedule_to_csv_writes():
    from simulator import schedules

    page = (REPO / "docs" / "schedules.md").read_text()
    block = next(block for block in FENCE.findall(page) if "schedule_to_csv(" in block)
    expression = re.search(r"what (schedule_to_csv\(.*\)) writes", block)[1]
    table = "".join(line + "\n" for line in block.splitlines() if not line.startswith("#"))
    assert eval(expression, vars(schedules)) == table


def test_the_deadlock_refusals_of_schedules_md_are_what_a_scenario_says(tmp_path):
    """The CSV section quotes three refusals of a deadlocked table: a p = 2 one's (whole), a p = 4 one's line and
    message end, and the DualPipeV table's without its placement row (whole)."""
    text = (REPO / "docs" / "schedules.md").read_text()
    page = " ".join(text.split())

    def refusal(name: str, text: str) -> ScenarioError:
        (tmp_path / name).write_text(text)
        with pytest.raises(ScenarioError) as caught:
            table = load_schedule_csv(tmp_path / name)
            check_schedule_runs(table, table.placement, tmp_path / name)
        return caught.value

    first, second, quote = re.search(r"`(F0[^`]*)` over `([^`]*)` says `(deadlock\.csv:1: [^`]*)`", page).groups()
    assert str(refusal("deadlock.csv", f"{first}\n{second}\n")).replace(f"{tmp_path}/", "") == quote
    twice, third, fourth, line, end = re.search(r"at p = 4, rows `([^`]*)` twice, then `([^`]*)` and `([^`]*)`, "
                                                r"it is refused at line (\d+), rank \d's \(`\.\.\. ([^`]*)`\)",
                                                page).groups()
    refused = refusal("dl4.csv", f"{twice}\n{twice}\n{third}\n{fourth}\n")
    assert refused.line == int(line) and refused.problem.endswith(end)
    quote = re.search(r"says `(dualpipev\.csv:3: [^`]*)`", page)[1]
    block = next(block for block in FENCE.findall(text) if "placement,v\n" in block)
    assert str(refusal("dualpipev.csv", block.replace("placement,v\n", ""))).replace(f"{tmp_path}/", "") == quote


A100_16 = "--topology dgx-a100-cluster --set nodes=16"
GB200_NO_NVLS = "--topology gb200-nvl72 --set nvls=none"
NVLS_SIZES = "--topology dgx-h100 --algorithm nvls --sizes 1GiB,4GiB,64GiB"
ALL_TO_ALL_8 = "--topology dgx-h100 --op all_to_all --sizes 8B,1MiB,4GiB"
GB200_TREE = "--topology gb200-nvl72 --set racks=2 --op all_reduce --algorithm tree --protocol ll128 --sizes 16MiB,1GiB"
COLLECTIVE_QUOTES = [
    ("docs/collectives.md", ["--topology dgx-h100-cluster --set nodes=2 --set nics_per_node=4 --algorithm ring "
                             "--sizes 1GiB --efficiency ideal",
                             "--topology dgx-h100-cluster --set nodes=2 --set nics_per_node=4 --algorithm ring "
                             "--sizes 1GiB"],
     "1 GiB takes {0[ms]:.1f} ms at line rate, busbw {0[busbw]:.0f} GB/s (`--efficiency ideal`; {1[ms]:.1f} ms and "
     "{1[busbw]:.0f} GB/s calibrated;"),
    ("docs/collectives.md", [f"--topology dgx-h100-cluster --set nodes=4 --set nics_per_node={nics} --algorithm ring "
                             "--protocol simple --sizes 8GiB --efficiency ideal" for nics in range(3, 9)],
     "busbw is k NICs' worth: {0[busbw]:.1f}, {1[busbw]:.1f}, {2[busbw]:.1f}, {3[busbw]:.1f}, {4[busbw]:.1f} and "
     "{5[busbw]:.1f} GB/s for"),
    *[("docs/collectives.md", [f"--topology dgx-h100-cluster --set nodes={hosts} --set nics_per_node={nics} "
                               "--algorithm tree --protocol simple --sizes 1MiB,64MiB,1GiB"],
       f"| {hosts} | {nics} | {{0[us]:.0f}} us | {{1[us]:,.0f}} us | {{2[ms]:.2f}} ms |")
      for hosts, nics in ((2, 8), (2, 4), (4, 8), (4, 4))],
    ("docs/collectives.md", [f"--topology dgx-h100-cluster --set nodes=2 --ranks {ranks} --algorithm ring "
                             "--sizes 1GiB --efficiency ideal" for ranks in (10, 12)],
     "10 ranks (8 + 2) on 2 DGX H100 hosts run 1 GiB in {0[ms]:.2f} ms, busbw {0[busbw]:.1f} GB/s (two NICs each "
     "way, `--efficiency ideal`, measured; 12 ranks: {1[ms]:.2f} ms, {1[busbw]:.1f} GB/s);"),
    ("docs/collectives.md", ["--topology dgx-h100-cluster --set nodes=2 --algorithm ring --sizes 1GiB"],
     "against the ring's {0[ms]:.2f} ms (the flat tree"),
    ("docs/collectives.md", [f"--topology dgx-h100 --algorithm nvls --ranks {ranks} --sizes 4GiB"
                             for ranks in range(5, 9)],
     "{0[busbw]:.0f}, {1[busbw]:.0f}, {2[busbw]:.0f} and {3[busbw]:.0f} GB/s on 5 to 8 GPUs at 4 GiB"),
    ("docs/collectives.md", ["--topology dgx-h100 --set gpu_model=b200 --set nvlink_bandwidth=900GB/s --algorithm nvls "
                             "--sizes 4GiB"],
     "On 8 B200s it gives {0[busbw]:.0f} GB/s"),
    ("docs/collectives.md", ["--topology dgx-h100-cluster --algorithm nvls --sizes 4GiB",
                             "--topology dgx-h100-cluster --algorithm ring --sizes 4GiB"],
     "On two DGX H100s at 4 GiB it gives {0[busbw]:.0f} GB/s busbw against the ring's {1[busbw]:.0f} ("),
    ("docs/collectives.md", ["--topology dgx-h100-superpod --set nodes=4 --algorithm collnet_direct --sizes 1GiB",
                             "--topology dgx-h100-superpod --set nodes=4 --algorithm ring --sizes 1GiB"],
     "on 4 hosts, 1 GiB takes {0[ms]:.2f} ms (busbw {0[busbw]:.0f} GB/s, ring {1[ms]:.2f} ms)"),
    ("docs/collectives.md", ["--topology dgx-h100-superpod --set nodes=4 --algorithm nvls_sharp --sizes 1GiB",
                             "--topology dgx-h100-superpod --set nodes=4 --algorithm nvls --sizes 1GiB"],
     "On 4 DGX H100 hosts, 1 GiB takes {0[ms]:.2f} ms, busbw {0[busbw]:.0f} GB/s (`nvls` across hosts without "
     "SHARP, NCCL's NVLS tree over 8 heads a host, up to 2 n/8 per NIC: {1[ms]:.2f} ms, {1[busbw]:.0f} GB/s)"),
    ("docs/collectives.md",
     [*(f"--topology dgx-h100-cluster --set nodes={hosts} --sizes 1GiB,4GiB" for hosts in (3, 4, 16)),
      "--topology dgx-h100-cluster --set nodes=3 --algorithm nvls --sizes 1GiB"],
     "3 hosts {0[busbw]:.1f} at 1 GiB, the ring, since `nvls`, which runs {6[busbw]:.1f} there (`--algorithm nvls`), "
     "is weighed at NCCL's 364 GB/s; 4 hosts {2[busbw]:.1f} at 1 GiB ({2[ms]:.2f} ms; at line rate 380, "
     "`tests/test_nvls_tree.py`) and {3[busbw]:.1f} at 4 GiB, where `auto` takes the ring; 16 hosts "
     "{4[busbw]:.1f} at 1 GiB"),
    ("docs/collectives.md", ["--topology dgx-h100 --op broadcast --algorithm ring --protocol simple --sizes 1GiB",
                             "--topology dgx-h100 --algorithm tree --sizes 1GiB",
                             "--topology dgx-h100-cluster --algorithm tree --sizes 1GiB"],
     "takes {0[ms]:.2f} ms, busbw {0[busbw]:.1f} GB/s at H100's NVLink efficiency (`trainsim collective --topology "
     "dgx-h100 --op broadcast --algorithm ring --protocol simple --sizes 1GiB`); a tree all-reduce of 1 GiB over the "
     "8 GPUs {1[ms]:.2f} ms, over 2 DGX H100 nodes {2[ms]:.2f} ms"),
    ("docs/collectives.md", ["--topology dgx-h100 --sizes 8B,4KiB"],
     "= {0[us]:.1f} us (LL ring; `trainsim collective --topology dgx-h100 --sizes 8B`)"),
    ("docs/collectives.md", ["--topology dgx-h100 --sizes 8B,4KiB"], "the simulation gives {1[us]:.1f} at both"),
    ("docs/collectives.md", ["--topology dgx-h100 --sizes 1MiB", "--topology dgx-h100 --protocol ll --sizes 1GiB"],
     "up to 1 MiB, where it reaches {0[busbw]:.0f} GB/s busbw, half the cap; forced at 1 GiB (`--protocol ll`) it "
     "reaches {1[busbw]:.0f} GB/s here"),
    ("docs/collectives.md", ["--topology dgx-a100-cluster --algorithm tree --sizes 512MiB --chunk 4MiB",
                             "--topology dgx-a100-cluster --algorithm ring --sizes 512MiB"],
     "over its simulated {0[ms]:.2f} ms for 512 MiB over two DGX A100s in 4 MiB chunks (`--chunk 4MiB`: 8 chunks "
     "per pipeline, as many as GPUs per host) and picks the ring ({1[ms]:.2f} ms)"),
    ("docs/collectives.md", ["--topology dgx-a100-cluster --sizes 512MiB",
                             "--topology dgx-a100-cluster --algorithm tree --protocol simple --sizes 512MiB"],
     "Simple ring from 128 MiB (512 MiB: {0[ms]:.2f} ms, where the Simple tree runs {1[ms]:.2f}, its chain steps"),
    ("docs/collectives.md", ["--topology dgx-h100-cluster --set nodes=16 --sizes 256KiB"],
     "(16 hosts, 256 KiB: {0[us]:.1f} us; up to 256 KiB), the LL128 tree from 512 KiB to 8 MiB"),
    ("docs/collectives.md", [f"{A100_16} --sizes 1KiB", f"{A100_16} --algorithm tree --protocol simple --sizes 1KiB",
                             f"{A100_16} --algorithm ring --protocol simple --sizes 1KiB", f"{A100_16} --sizes 1GiB",
                             f"{A100_16} --algorithm tree --protocol simple --sizes 1GiB"],
     "(1 KiB on 16 hosts: {0[us]:.0f} us, where the Simple tree takes {1[us]:.0f} and the Simple ring {2[us]:,.0f}; "
     "up to 256 KiB), the LL128 tree from 512 KiB to 64 MiB, the LL128 ring from 128 to 512 MiB and the Simple ring "
     "from 1 GiB (1 GiB: {3[ms]:.1f} ms; the Simple tree, {4[ms]:.1f} ms there, is weighed at NCCL's cap"),
    ("docs/collectives.md", [f"{GB200_NO_NVLS} --algorithm tree --protocol ll128 --sizes 1GiB",
                             f"{GB200_NO_NVLS} --sizes 1GiB", f"{GB200_NO_NVLS} --sizes 16MiB,256MiB,4GiB"],
     "takes the LL128 ring at 1 GiB, {1[ms]:.2f} ms, busbw {1[busbw]:.1f} GB/s (16 MiB: the LL ring, {2[us]:.1f} us; "
     "256 MiB: the LL128 ring, {3[ms]:.2f} ms; 4 GiB: the Simple ring, {4[ms]:.2f} ms; measured, estimates equal to "
     "the simulated times); the `tree` asked for there (`trainsim collective --topology gb200-nvl72 --set nvls=none "
     "--algorithm tree --protocol ll128 --sizes 1GiB`, measured) takes {0[ms]:.2f} ms, busbw {0[busbw]:.1f} GB/s."),
    ("docs/collectives.md", ["--topology dgx-h100-cluster --set nodes=16 --sizes 16MiB,8GiB",
                             "--topology dgx-h100-cluster --set nodes=16 --algorithm tree --sizes 16MiB",
                             "--topology dgx-h100-cluster --set nodes=16 --algorithm nvls --sizes 8GiB"],
     "`auto` takes `nvls` at 16 MiB, {0[us]:.2f} us, where `--algorithm tree` runs the LL128 tree in {2[us]:.2f} us "
     "(3.4% faster; weighed at NCCL's LL128 tree cap, 8 x 29 GB/s, 321.49 us), and the Simple ring at 8 GiB, "
     "{1[us]:,.2f} us, where `--algorithm nvls` runs {3[us]:,.2f} us (1.4% faster, busbw {3[busbw]:.2f} GB/s;"),
    ("docs/collectives.md", [NVLS_SIZES], f"`trainsim collective {NVLS_SIZES}` prints {{0[busbw]:.2f}} GB/s at 1 GiB, "
     "{1[busbw]:.2f} at 4 GiB, {2[busbw]:.2f} at 64 GiB"),
    ("docs/collectives.md", [ALL_TO_ALL_8], f"(`trainsim collective {ALL_TO_ALL_8}`, 8 H100s, 4 GiB: {{2[ms]:.2f}} ms, "
     "busbw {2[busbw]:.1f} GB/s; 1 MiB: {1[us]:.2f} us; 8 B: {0[us]:.1f} us, the base latency and one path latency)"),
    ("docs/collectives.md", [GB200_TREE], f"`trainsim collective {GB200_TREE}` (calibrated, the LL128 tree, measured) "
     "takes {0[us]:.1f} us at 16 MiB (busbw {0[busbw]:.1f} GB/s) and {1[ms]:.2f} ms at 1 GiB ({1[busbw]:.1f} GB/s)"),
    ("docs/collectives.md", ["--topology dgx-h100-superpod --set nodes=4 --sizes 1KiB",
                             "--topology dgx-h100-superpod --set nodes=4 --algorithm nvls_sharp --sizes 1KiB"],
     "({0[us]:.1f} us at 1 KiB, against `nvls_sharp`'s {1[us]:.0f} us without base latency)"),
]
"""Figures docs/collectives.md quotes from `trainsim collective` runs: the commands, and the text with the
figures of their rows (every command's rows, in order: `ms` and `us` the time, `busbw` in GB/s); where the text
shows the command beside its figures, the quote holds it too, so that the command as shown prints them."""


def flowing(text: str) -> str:
    """``text`` with each run of white space one space, as a sentence reads across the page's line breaks."""
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize(("page", "commands", "quote"), COLLECTIVE_QUOTES,
                         ids=[f"{case[1][0]} ..." for case in COLLECTIVE_QUOTES])
def test_a_collective_figure_a_page_quotes_is_what_the_command_prints(page, commands, quote, capsys):
    rows = []
    for command in commands:
        assert main(["collective", *shlex.split(command), "--json"]) == 0
        rows += [{"ms": row["time_s"] * 1e3, "us": row["time_s"] * 1e6, "busbw": row["busbw_GBps"]}
                 for row in json.loads(capsys.readouterr().out)]
    now = quote.format(*rows)
    assert now in flowing((REPO / page).read_text()), f"{page} should now read: {now}"


STRAIGHT_FAULTS = ("faults-straggler-and-spine-link", ("faults.step.links=[]",))
HSDP_ONE_GPU_SHARDS = ("cluster.topology=dgx-h100-cluster", "cluster.nodes=2", "training.global_batch=8",
                       "parallelism.tp=8", "parallelism.dp=2", "parallelism.zero=0",
                       "parallelism.sequence_parallel=true", "parallelism.fsdp=hybrid_shard")
"""docs/training-step.md's HSDP over one-GPU shard groups: Llama 3 8B, TP 8, DP 2 on two DGX H100."""
TRACE_REPLICATED = ("trace-allreduce-2rank", ("cluster.nodes=64", "workload.traced_gpu=h100-sxm", "workload.dp=64",
                                              "workload.tokens_per_step=8192", "workload.model_flops_per_token=1.0e8"))
"""docs/traces.md's opening example: the two-rank trace, traced on an H100, 64 replicas on 64 hosts of 100 GbE."""
SERVER_STRAGGLER = "faults.step.stragglers=[{gpus: [24], slowdown: 3.0}]"
"""The bundled parameter-server scenario's straggler on server GPU 24 in place of worker 5."""
CP_ACROSS_HOSTS = ("cluster.topology=dgx-h100-cluster", "cluster.nodes=2", "training.seq_len=32768",
                   "training.global_batch=1", "training.recompute=full", "parallelism.dp=1")
"""docs/training-step.md's ring attention across 2 DGX H100 (the DP 8 scenario's ZeRO-1 kept), CP to be set."""
NIC_800G = "cluster.nic_bandwidth=800Gb/s"
"""docs/network.md's NIC what-if: twice the DGX H100's 400 Gb/s NICs."""
WORKER_STRAGGLER = "faults.step.stragglers=[{gpus: [5], slowdown: 3.0}]"
"""The bundled parameter-server scenario's straggler worker 5 at 3x, not 1.5x."""
PS_EVEN = ("faults.step.stragglers=[]", "ps.iteration_slowdown=null")
"""The bundled parameter-server scenario with every worker computing alike."""
CP_UNBALANCED = ("cluster.topology=dgx-h100-cluster", "cluster.nodes=1", "model.layers=2", "training.seq_len=16384",
                 "training.global_batch=2", "parallelism.cp=4", "parallelism.dp=2",
                 "parallelism.cp_load_balance=false", "parallelism.zero=1")
"""docs/training-step.md's CP 4 x DP 2 without load balancing on one DGX H100 (2 layers, 16k tokens)."""
SCENARIO_QUOTES = [
    ("docs/schedules.md", ("schedule-zb-h1-p4-m8", ()),
     "`zb-h1`'s summary reads `bubble_fraction` {s[bubble_fraction]!r} and `step_time_s` {s[step_time_s]!r}"),
    ("docs/training-step.md", ("mixtral-8x7b-ep8", ()),
     "(`mixtral-8x7b-ep8`: {mb_all_to_all:.1f} MB of the"),
    ("docs/training-step.md", ("mixtral-8x7b-ep8", ()),
     "(`trainsim run mixtral-8x7b-ep8 --out DIR`: {s[moe][dropped_token_fraction]:.1%} dropped, MFU {s[mfu]:.1%}, "
     "nominal {s[nominal_mfu]:.1%})"),
    ("docs/training-step.md", ("mixtral-8x7b-ep8", ()),
     "skew lowers HFU as it lowers MFU (`mixtral-8x7b-ep8`: HFU {s[hfu]:.1%}, MFU {s[mfu]:.1%})"),
    ("docs/training-step.md", ("mixtral-8x7b-ep8", ()),
     "`mixtral-8x7b-ep8` sends {gb_ep:.2f} GB per GPU of it per step, `traffic_bytes_per_gpu.ep`, and leaves "
     "{s[exposed_comm_s][ep]:.3f} s exposed"),
    ("docs/training-step.md", ("mixtral-8x7b-ep8", ()),
     "`mixtral-8x7b-ep8`'s zipf routing adds {ms_routing_skew:.1f} ms ({s[bottleneck][loss_shares][moe_imbalance]:.1%})"
     " to its {s[step_time_s]:.3f} s step, more than its exposed EP communication "
     "({s[bottleneck][loss_shares][exposed_ep_comm]:.1%}), so its verdict reads `{s[bottleneck][verdict]}`"),
    ("docs/training-step.md", ("mixtral-8x7b-ep8", ("parallelism.ep=1",)),
     "hottest expert {s[moe][hottest_expert_load_over_mean]:.2f}x the mean load` (`mixtral-8x7b-ep8` at "
     "`parallelism.ep=1`: {ms_routing_skew:.1f} ms)"),
    ("docs/network.md", ("mixtral-8x7b-ep8", ()), "(`mixtral-8x7b-ep8`: exposed EP {ms_exposed_ep:.1f} ms to"),
    ("docs/network.md", ("mixtral-8x7b-ep8", (NIC_800G,)), "ms to {ms_exposed_ep:.1f} ms) until"),
    ("docs/network.md", ("mixtral-8x7b-ep8", (NIC_800G, "cluster.nic_pcie_bandwidth=128GB/s")),
     "(`128GB/s`: {ms_exposed_ep:.1f} ms)"),
    ("docs/training-step.md", ("mixtral-8x7b-ep8", ("training.recompute=full",)),
     "the skew adds {ms_routing_skew:.1f} ms ({s[bottleneck][loss_shares][moe_imbalance]:.1%} of a "
     "{s[step_time_s]:.3f} s step"),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", ()),
     "fully exposed: {ms_exposed_dp:.1f} ms of the {ms_dp:.0f} ms of DP communication"),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", ()),
     "Model FLOPs are {gflop_model_per_token:.1f} GFLOP"),
    ("docs/outputs.md", ("llama3-8b-dgx-h100-dp8", ("costs.gpu_hour_price=2.5",)),
     "`per 1M tokens {s[resources][gpu_hours_per_million_tokens]:.4g} GPU-h, "
     "{s[resources][gpu_energy_kwh_per_million_tokens]:.4g} kWh (700 W a GPU, board power), "
     "{s[resources][cost_per_million_tokens]:.4g} USD`"),
    ("docs/outputs.md", ("llama3-8b-dgx-h100-dp8", ()),
     "(8 GPUs x {s[step_time_s]:.4f} s / 3,600 = {s[resources][gpu_hours_per_step]:.4g} GPU-h a step"),
    *(("docs/studies.md", ("llama3-8b-dgx-h100-dp8", (f"cluster.topology={topology}", f"costs.gpu_hour_price={price}")),
       f"| {topology} | {{s[step_time_s]:.4g}} s | {{s[resources][gpu_hours_per_million_tokens]:.4g}} | "
       f"{{s[resources][cost_per_million_tokens]:.4g}} | {{s[resources][gpu_energy_kwh_per_million_tokens]:.4g}} "
       f"({watts} W) |")
      for topology, price, watts in (("dgx-h100", 2.99, 700), ("dgx-h200", 3.79, 700), ("dgx-b200", 5.99, "1,000"))),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", ()),
     "the hardware count adds {gflop_hardware_extra_per_token:.1f} GFLOP per token"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ()),
     "(sync: {ms_exchange:.0f} ms of exchange per iteration against a {ms_allreduce:.0f} ms all-reduce on an idle "
     "cluster; `busiest_link_bytes` {gib_busiest:.1f} GiB against {gib_allreduce_busiest:.1f} GiB)"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ()),
     "exposed DP {s[exposed_comm_s][dp]:.3f} s ({s[bottleneck][loss_shares][exposed_dp_comm]:.1%} of the run) and "
     "worker wait {ms_worker_wait:.1f} ms ({s[bottleneck][loss_shares][worker_wait]:.1%}), 6 x {ms_exchange:.1f} ms"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", (WORKER_STRAGGLER,)),
     "wait grows to {s[bottleneck][loss_shares][worker_wait]:.1%}"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ("ps.mode=async",)),
     "ps.mode=async` the workers wait {s[bottleneck][loss_shares][worker_wait]:.1%} of the {s[step_time_s]:.3f} s "
     "run in their iterations and idle {s[bottleneck][loss_shares][finished_early]:.1%} after them;"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ("ps.mode=async", WORKER_STRAGGLER)),
     "straggler 3x slow too, {s[bottleneck][loss_shares][worker_wait]:.1%} and "
     "{s[bottleneck][loss_shares][finished_early]:.1%}, and the verdict's largest loss is exposed DP communication, "
     "{s[bottleneck][loss_shares][exposed_dp_comm]:.1%} of the run"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ("ps.mode=async", "training.microbatches=8",
                                                                     WORKER_STRAGGLER)),
     "straggler 3x slow: a {s[bottleneck][evidence][wait_share]:.1%} wait, "
     "{s[bottleneck][evidence][finished_early_share]:.1%} of the run after the last iterations, "
     "{s[bottleneck][evidence][exposed_comm_share]:.1%} exposed DP communication, `{bound}`)"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", (
        "ps.mode=ssp", "ps.staleness=1", "training.microbatches=8",
        "faults.step.stragglers=[{gpus: [5], slowdown: 4.0}]")),
     "(`waits {wait_in_iterations:.1%} of the workers' iterations` under ssp, staleness 1"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", (*PS_EVEN, "network.model=analytic")),
     "ps.iteration_slowdown=null`: exchange {ms_exchange:.1f} ms analytic,"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", PS_EVEN),
     "ms analytic, {ms_exchange:.1f} ms flow); where"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ("network.model=analytic",)),
     "(the bundled scenario: {ms_exchange:.1f} ms analytic,"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ()),
     "ms analytic, {ms_exchange:.1f} ms flow; with"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ("ps.mode=async", "network.model=analytic")),
     "with `mode: async` {ms_exchange:.1f} ms analytic,"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ("ps.mode=async",)),
     "ms analytic, {ms_exchange:.1f} ms flow), so a run"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", (SERVER_STRAGGLER,)),
     "its sums and update take {ms_server_work[24]:.1f} ms an iteration"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ("faults.step.stragglers=[]",)),
     "where they took {ms_server_work[24]:.1f} ms"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", (SERVER_STRAGGLER,)),
     "and the exchange {ms_exchange:.1f} ms against"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", ("faults.step.stragglers=[]",)),
     "ms against {ms_exchange:.1f} ms with no straggler"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", (*PS_EVEN, "ps.iterations=3")),
     "the server links are {s[parameter_server][server_links][mean_utilisation]:.1%} busy over the "
     "{s[step_time_s]:.3f} s run but {s[parameter_server][server_links][mean_utilisation_in_transfers]:.1%} while the "
     "pushes and pulls cross them, the workers' "
     "{s[parameter_server][worker_links][mean_utilisation_in_transfers]:.1%}, and the verdict ends `{binding_note}`"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", (*PS_EVEN, "ps.iterations=3", "ps.servers=3")),
     "the worker links bind, their busiest at "
     "{s[parameter_server][worker_links][busiest_utilisation_in_transfers]:.1%} against the servers' busiest "
     "{s[parameter_server][server_links][busiest_utilisation_in_transfers]:.1%}."),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", (*PS_EVEN, "ps.iterations=2", "ps.servers=2")),
     "the two sides' busiest links run at {s[parameter_server][server_links][busiest_utilisation_in_transfers]:.1%} "
     "and {s[parameter_server][worker_links][busiest_utilisation_in_transfers]:.1%}, and the verdict says "
     "{s[parameter_server][binding_links]} bind"),
    ("docs/parameter_server.md", ("parameter-server-vs-allreduce", (*PS_EVEN, "ps.iterations=2",
                                                                     "cluster.leaf_ports=2",
                                                                     "cluster.oversubscription=8")),
     "the busiest server or worker link runs at "
     "{s[parameter_server][server_links][busiest_utilisation_in_transfers]:.1%} "
     "while {s[parameter_server][peak_link][link]} runs at "
     "{s[parameter_server][peak_link][utilisation_in_transfers]:.1%}, and the verdict ends `{fabric_note}`"),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", CP_UNBALANCED),
     "tokens over CP 4 x DP 2 on one DGX H100 adds {ms_cp_imbalance:.3f} ms "
     "({s[bottleneck][loss_shares][cp_imbalance]:.1%}) to a {ms_step:.2f} ms step"),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", (*CP_UNBALANCED, "collectives.sm_contention=none")),
     "same {ms_cp_imbalance:.3f} ms with SM contention off"),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", CP_UNBALANCED),
     "(compute idle at pp = 1: {s[bottleneck][loss_shares][pipeline_bubble]:.2%} against "
     "{s[bottleneck][loss_shares][cp_imbalance]:.2%} of the {ms_step:.2f} ms step above)"),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", (*CP_ACROSS_HOSTS, "parallelism.cp=16")),
     "exposed CP {ms_exposed_cp:.1f} ms (214.3 ms with the group's 16 SMs a step), step {ms_step:.1f} ms."),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", (*CP_ACROSS_HOSTS, "parallelism.cp=16")),
     "6.7 ms of the {ms_step:.1f} ms step"),
    ("docs/collectives.md", ("llama3-8b-dgx-h100-dp8", (*CP_ACROSS_HOSTS, "parallelism.cp=16")),
     "simulates 43,904 flows and 45,896 events, a {ms_step:.1f} ms step."),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", (*CP_ACROSS_HOSTS, "parallelism.tp=8", "parallelism.cp=2")),
     "0.200 ms, step {ms_step:.1f} ms"),
    ("docs/plots.md", ("llama3-8b-dgx-h100-dp8", ("parallelism.pp=4", "parallelism.dp=2")),
     "(rank 4 here: {gib_static_stage_0:.1f} GiB against rank 0's {s[peak_memory_gib]:.1f} GiB peak)"),
    ("docs/cost-model.md", ("llama3-8b-dgx-h100-eager-fsdp", ()),
     "eager under FSDP takes {s[step_time_s]:.3f} s a step and {s[peak_memory_gib]:.1f} GiB per GPU"),
    ("docs/cost-model.md", ("llama3-8b-dgx-h100-eager-fsdp", ("training.kernels=fused",)),
     "takes {s[step_time_s]:.3f} s and {s[peak_memory_gib]:.1f} GiB; with"),
    ("docs/cost-model.md", ("llama3-8b-dgx-h100-eager-fsdp", ("parallelism.fsdp=null",)),
     "(eager DDP) {s[step_time_s]:.3f} s and {s[peak_memory_gib]:.1f} GiB, out of memory"),
    ("docs/cost-model.md", ("llama3-8b-dgx-h100-eager-fsdp", ()),
     "Per step on rank 0, eager FSDP's passes take {ms_passes:,.0f} ms of compute"),
    ("docs/cost-model.md", ("llama3-8b-dgx-h100-eager-fsdp", ("training.kernels=fused",)),
     "against the fused ones' {ms_passes:,.0f} ms"),
    ("docs/cost-model.md", ("llama3-8b-dgx-h100-eager-fsdp", ()),
     "its copy-ins {ms_copy_in:.1f} ms on their own stream"),
    ("docs/cost-model.md", ("llama3-8b-dgx-h100-eager-fsdp", ("training.kernels=fused",)),
     "as the fused step's {ms_copy_in:.1f} ms;"),
    ("docs/cost-model.md", ("llama3-8b-dgx-h100-eager-fsdp", ()),
     "the copy-outs ({ms_copy_out:.1f} ms on the compute stream), the gradient copies ({ms_grad_copies:.1f} ms) and "
     "the traffic ({gb_dp:.1f} GB per GPU)"),
    ("docs/cost-model.md", ("llama3-8b-dgx-h100-eager-fsdp", ("training.kernels=fused",)),
     "are the fused FSDP step's ({ms_copy_out:.1f} ms, {ms_grad_copies:.1f} ms, {gb_dp:.1f} GB)"),
    ("docs/training-step.md", ("llama3-8b-dgx-h100-dp8", HSDP_ONE_GPU_SHARDS),
     "(4 micro-batches of 4,096 tokens) takes {ms_step:.1f} ms a step with fp32 shards"),
    ("docs/training-step.md", ("llama3-70b-torchtitan-pp-fsdp", ()),
     "rank 0's copy-ins take {ms_copy_in:.3f} ms a step ({n_copy_in} copy-ins, on their own stream)"),
    ("docs/training-step.md", ("llama3-70b-torchtitan-pp-fsdp", ()),
     "on their own stream) and its model state is {gib_model_state:.2f} GiB;"),
    ("docs/training-step.md", ("llama3-70b-torchtitan-pp-fsdp", ()),
     "optimizer step {ms_optimizer:.2f} ms (28.42 ms with the master copy's passes)"),
    ("docs/traces.md", TRACE_REPLICATED,
     "replicated to 64 single-GPU hosts: a step of {ms_step:.2f} ms, of which the 64-rank ring all-reduce of 32 MiB "
     "over 100 GbE leaves {ms_exposed_dp:.2f} ms exposed"),
    ("docs/traces.md", TRACE_REPLICATED,
     "the slower rank's GEMM, 1.1 ms traced, moved from the H100 to the A100 as 2 us + 1,098 us x "
     "{s[trace][gpu_move][classes][matmul][rates][0][duration_ratio]:.3f} "
     "({ms_kernel[sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64]:.3f} ms), and its "
     "Adam kernel, 2 us + 198 us x {s[trace][gpu_move][classes][memory-bound][rates][0][duration_ratio]:.3f} "
     "({ms_kernel[multi_tensor_apply_kernel_adam]:.3f} ms)"),
    ("docs/traces.md", TRACE_REPLICATED,
     "{m_tokens_per_s:.1f} M tokens/s and {s[tflops_per_gpu]:.1f} TFLOP/s per GPU (MFU {s[mfu]:.1%} of the A100's "
     "312)"),
    ("docs/faults.md", STRAIGHT_FAULTS,
     "reports {s[bottleneck][loss_shares][peer_wait]:.1%} of the step waiting for slower ranks folded and"),
    ("docs/faults.md", (STRAIGHT_FAULTS[0], (*STRAIGHT_FAULTS[1], "run.fold=false")),
     "waiting for slower ranks folded and {s[bottleneck][loss_shares][peer_wait]:.1%} with `--set run.fold=false`"),
]
"""Figures pages quote from a bundled scenario's summary: the scenario with the overrides the page names, and
the text with its figures (`s` the summary, and the derived figures of `quoted_figures`)."""


def quoted_figures(result: Result) -> dict:
    """The summary and the figures pages derive from it in other units, and from rank 0's ops (`rank_0_ms`);
    `bound`, the verdict's bound with its reason."""
    summary = result.summary
    figures: dict = {"s": summary, "gb_ep": summary["traffic_bytes_per_gpu"]["ep"] / 1e9,
                     "gb_dp": summary["traffic_bytes_per_gpu"]["dp"] / 1e9, **rank_0_ms(result.timeline),
                     "mb_all_to_all": summary.get("moe", {}).get("all_to_all_bytes_per_layer", 0) / 1e6,
                     "ms_exposed_dp": summary["exposed_comm_s"]["dp"] * 1e3, "ms_dp": summary["comm_s"]["dp"] * 1e3,
                     "ms_exposed_cp": summary["exposed_comm_s"].get("cp", 0.0) * 1e3,
                     "ms_exposed_ep": summary["exposed_comm_s"].get("ep", 0.0) * 1e3,
                     "ms_worker_wait": summary["bottleneck"]["loss_shares"].get("worker_wait", 0.0)
                     * summary["step_time_s"] * 1e3,
                     "ms_step": summary["step_time_s"] * 1e3, "m_tokens_per_s": (summary["tokens_per_s"] or 0.0) / 1e6,
                     "bound": summary["bottleneck"].get("verdict", "").partition(";")[0],
                     "ms_routing_skew": summary.get("moe", {}).get("hottest_rank_adds_s", 0) * 1e3,
                     "ms_cp_imbalance": summary.get("cp_imbalance", {}).get("slowest_rank_adds_s", 0) * 1e3,
                     "binding_note": summary["bottleneck"].get("verdict", "").rpartition("; ")[2],
                     "fabric_note": summary["bottleneck"].get("verdict", "").rpartition(", and ")[2],
                     "gib_model_state": sum(summary.get("memory_breakdown_gib", {}).get(part, 0.0)
                                            for part in ("params", "grads", "optimizer"))}
    if summary.get("tokens_per_s"):
        flop_per_token = summary["gpus"] * 1e12 / summary["tokens_per_s"] / 1e9
        figures["gflop_model_per_token"] = summary["tflops_per_gpu"] * flop_per_token
        if summary["hardware_tflops_per_gpu"] is not None:  # null for a trace without op shapes
            figures["gflop_hardware_extra_per_token"] = (
                (summary["hardware_tflops_per_gpu"] - summary["tflops_per_gpu"]) * flop_per_token)
    if "memory_per_stage" in summary:
        stage = summary["memory_per_stage"][0]
        figures["gib_static_stage_0"] = stage["total_gib"] - stage["activations_gib"]
    if "parameter_server" in summary:
        servers, evidence = summary["parameter_server"], summary["bottleneck"]["evidence"]
        updates = result.timeline[(result.timeline["kind"] == "compute") & (result.timeline["category"] == "optimizer")]
        per_iteration = (updates["end_s"] - updates["start_s"]).groupby(updates["rank"]).sum() / servers["iterations"]
        figures |= {"ms_exchange": servers["exchange_s"] * 1e3, "ms_allreduce": servers["allreduce"]["time_s"] * 1e3,
                    "ms_server_work": (per_iteration * 1e3).to_dict(),
                    "gib_busiest": servers["busiest_link_bytes_per_iteration"] / 2**30,
                    "gib_allreduce_busiest": servers["allreduce"]["busiest_link_bytes"] / 2**30,
                    "wait_in_iterations": (evidence["wait_share"] - evidence["finished_early_share"])
                    / (1 - evidence["finished_early_share"])}
    return figures


def rank_0_ms(timeline: pd.DataFrame) -> dict:
    """Milliseconds per step of rank 0's ops: its passes' own work on the compute stream (`ms_passes`, PyTorch
    FSDP's copies left out), its optimizer step, and FSDP's copies: copy-outs, copy-ins (and their count) and
    gradient copies; and of every rank's, each compute op's longest by name (`ms_kernel`)."""
    ops = timeline[(timeline["rank"] == 0) & (timeline["kind"] == "compute")]
    seconds = ops["end_s"] - ops["start_s"]
    fsdp = ops["name"].str.startswith("fsdp ")
    passes = (ops["stream"] == COMPUTE_STREAM) & ops["category"].isin(PIPELINE_CATEGORIES) & ~fsdp
    kernels = timeline[timeline["kind"] == "compute"]
    figures = {"ms_passes": seconds[passes].sum() * 1e3,
               "ms_kernel": ((kernels["end_s"] - kernels["start_s"]).groupby(kernels["name"]).max() * 1e3).to_dict(),
               "ms_optimizer": seconds[ops["name"] == "optimizer step"].sum() * 1e3,
               "n_copy_in": int(ops["name"].str.startswith("fsdp copy-in").sum())}
    for figure, names in (("ms_copy_out", ("fsdp copy-out",)), ("ms_copy_in", ("fsdp copy-in",)),
                          ("ms_grad_copies", ("fsdp grad copy", "fsdp reduce copy"))):
        figures[figure] = seconds[ops["name"].str.startswith(names)].sum() * 1e3
    return figures


@pytest.mark.parametrize(("page", "scenario", "quote"), SCENARIO_QUOTES,
                         ids=[f"{case[1][0]}-{index}" for index, case in enumerate(SCENARIO_QUOTES)])
def test_a_figure_a_page_quotes_from_a_bundled_run_is_the_runs(page, scenario, quote):
    now = quote.format(**quoted_figures(bundled_result(*scenario)))
    assert now in flowing((REPO / page).read_text()), f"{page} should now read: {now}"


ELASTIC_2K = ("--set", "restart.elastic=true", "--set", "restart.spares=0", "--set", "restart.regrow=on_repair")


def test_the_elastic_and_mtbf_figures_reliability_md_quotes_are_llama3_70b_2k_jobs(tmp_path):
    """docs/reliability.md's keep_global figures and its MTBF chart's ETTRs were measured on a job the repository
    did not ship: `scenarios/llama3-70b-2k-job.yaml` is it, and its runs give the page's figures."""
    runs = {}
    for batch in ("keep_global", "keep_per_replica"):
        out = tmp_path / batch
        assert main(["run", "llama3-70b-2k-job", "--out", str(out), "--quiet", *ELASTIC_2K,
                     "--set", f"restart.elastic_batch={batch}"]) == 0
        runs[batch] = json.loads((out / "job_summary.json").read_text())
    horizon, kept, split = runs["keep_global"]["horizon_s"], runs["keep_global"], runs["keep_per_replica"]
    elastic = (f"it ran {kept['replicas']['running_s']['32']['mean'] / horizon:.1%} of the 30 days on 32 replicas, "
               f"ETTR {kept['ettr']['mean']:.1%}, against {split['ettr']['mean']:.1%} with `keep_per_replica` (63 "
               f"replicas {split['replicas']['running_s']['63']['mean'] / horizon:.1%} of the time)")
    assert main(["study", "mtbf", "llama3-70b-2k-job", "--multipliers", "0.5,1,2,4,8", "--out",
                 str(tmp_path / "study"), "--quiet"]) == 0
    points = [curve["points"][0] for curve in json.loads((tmp_path / "study" / "study.json").read_text())["curves"]]
    ettrs = [f"{point['ettr']:.2%} at {point['mtbf_s'] / 3600:.1f} h" for point in points]
    study = (f"at its {points[0]['interval_s'] / 60:.2f} min: ETTR {ettrs[0].replace(' at ', ' at an MTBF of ')}, "
             f"{ettrs[1]}, {ettrs[2]}, then {ettrs[3]} and {ettrs[4]}, where its restarts wait for hosts")
    page = flowing((REPO / "docs" / "reliability.md").read_text())
    assert elastic in page, f"docs/reliability.md should now read: {elastic}"
    assert study in page, f"docs/reliability.md should now read: {study}"


def test_the_gb200_elastic_figures_reliability_md_quotes_are_llama3_70b_gb200_jobs(tmp_path):
    """docs/reliability.md's ETTRs of an elastic job on GB200 NVL72 racks, without elastic and with two spare trays
    instead are `scenarios/llama3-70b-gb200-job.yaml`'s runs."""
    runs = {}
    for name, sets in (("elastic", ()), ("fixed", ("restart.elastic=false",)),
                       ("spares", ("restart.elastic=false", "restart.spares=2"))):
        out = tmp_path / name
        overrides = [part for setting in sets for part in ("--set", setting)]
        assert main(["run", "llama3-70b-gb200-job", "--out", str(out), "--quiet", *overrides]) == 0
        runs[name] = json.loads((out / "job_summary.json").read_text())
    elastic, fixed = runs["elastic"], runs["fixed"]
    running = {size: value["mean"] / elastic["horizon_s"] for size, value in elastic["replicas"]["running_s"].items()}
    quote = (f"elastic, ETTR {elastic['ettr']['mean']:.1%} ({elastic['goodput_tokens_per_s']['mean']:,.0f} tokens/s; "
             f"{elastic['replicas']['shrinks']['mean']:.1f} shrinks and {elastic['replicas']['regrows']['mean']:.1f} "
             f"regrows a run, on 36 replicas {running['36']:.1%} of the time, 35 {running['35']:.1%}, 34 "
             f"{running['34']:.1%}); with `--set restart.elastic=false` its restarts wait "
             f"{fixed['restart_waiting_for_hosts_s']['mean'] / 86400:.2f} days a run for repaired trays and ETTR is "
             f"{fixed['ettr']['mean']:.1%} ({fixed['goodput_tokens_per_s']['mean']:,.0f} tokens/s); two spare trays "
             "instead (`--set restart.elastic=false --set restart.spares=2`, 2.8% more GPUs) "
             f"{runs['spares']['ettr']['mean']:.1%}.")
    page = flowing((REPO / "docs" / "reliability.md").read_text())
    assert quote in page, f"docs/reliability.md should now read: {quote}"


W175_BLOCK = re.compile(r"```\n\$ trainsim run llama3-405b-16k-job --set storage\.write=175GB/s [^\n]*\n(.*?)```", re.S)
"""docs/reliability.md's console block of the 405B job with its store at 175 GB/s and checkpoints every 3 steps."""


def w175_rows(printed: str) -> list[str]:
    """The rows of a printed job table that do not depend on the horizon or the draws: the healthy step, the
    restart's parts and the checkpoints row (its wrapped lines joined, as `flowing` reads them)."""
    text = flowing(printed)
    return [re.search(r"healthy step \S+ s, [\d,]+ tokens/s", text)[0], re.search(r"\(detection [^)]*\)", text)[0],
            re.search(r"checkpoints async .*?40\.\d+ s\)", text)[0]]


def test_the_async_checkpoint_figures_reliability_md_quotes_are_the_405b_jobs(tmp_path, monkeypatch, capsys):
    """docs/reliability.md's snapshot stall, slowdown sigma, cost C, M and Young's and Daly's intervals of the 405B
    job, where it describes the async mode and in its worked example, are its x 1 point of a study over 2 days, one
    replication (they take the failure rates, not the draws; the study's point at one step has the default run's
    step, write and rates); its Young's intervals at x 2, 1 and 0.5 the failure rates are the study's, as the
    formula gives them and, where one step is longer, the step it is floored to (x 2: 8.991 s, floored to
    10.18 s). With its store at 175 GB/s and checkpoints every 3 steps, one 2-day run gives sqrt(2 C M), the
    write floor, the console block's rows that the horizon does not change and the warning beside them."""
    from simulator.reliability import study as study_module

    summaries: list[dict] = []
    simulate = study_module.simulate_job

    def kept(loaded, **options):
        result = simulate(loaded, **options)
        summaries.append(result.summary)
        return result

    monkeypatch.setattr(study_module, "simulate_job", kept)
    curves = study_module.run_study("llama3-405b-16k-job", ["run.replications=1", "run.horizon=2d"], ["1 steps"],
                                    [2.0, 1.0, 0.5])["curves"]
    job = summaries[1]
    assert [curve["rate_multiplier"] for curve in curves] == [2.0, 1.0, 0.5] and len(summaries) == 3
    checkpoint, mtbf = job["checkpoint"], job["mtbf_s"]
    stall, sigma = f"{checkpoint['stall_s'] * 1e3:.3f} ms", f"{checkpoint['slowdown'] * 1e4:.4f}e-4"
    cost = f"{job['young_daly_cost_s'] * 1e3:.3f} ms"
    slow = job["young_daly_cost_s"] - checkpoint["stall_s"]
    quotes = [f"`snapshot_bandwidth`: {stall} for 405B on 16,384 GPUs)",
              f"and sigma is {sigma} (`checkpoint.slowdown` in job_summary.json)",
              f"S = 5.682 TB / 16,384 / 50 GB/s = {stall};",
              f"/ (1 - 0.002441) = {sigma}.",
              f"C = {stall} + 2.841 s x {sigma} / {1 + checkpoint['slowdown']:.5f} = {stall} + {slow * 1e3:.3f} ms = "
              f"{cost}",
              f"with M = {mtbf:,.0f} s ({mtbf / 3600:.2f} h) Young's interval is sqrt(2 x {cost} x {mtbf:,.0f} s) = "
              f"{job['young_interval_s']:.2f} s and Daly's {job['daly_interval_s']:.2f} s"]
    assert curves[0]["young_formula_s"] < curves[0]["young_interval_s"] == curves[0]["write_floor_s"]
    youngs = [f"{curves[0]['young_formula_s']:.3f} s (floored to one step, {curves[0]['young_interval_s']:.2f} s)",
              *(f"{curve['young_formula_s']:.2f} s" for curve in curves[1:])]
    quotes.append(f"whose C of {curves[0]['young_daly_cost_s'] * 1e3:.3f} ms puts Young's interval at {youngs[0]}, "
                  f"{youngs[1]} and {youngs[2]} for x 2, 1 and 0.5")
    out = tmp_path / "w175"
    capsys.readouterr()
    assert main(["run", "llama3-405b-16k-job", "--set", "storage.write=175GB/s", "--set", "checkpoint.interval=3 steps",
                 "--set", "run.replications=1", "--set", "run.horizon=2d", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    at_175 = json.loads((out / "job_summary.json").read_text())
    young = math.sqrt(2 * at_175["young_daly_cost_s"] * at_175["mtbf_s"])
    quotes.append(f"sqrt(2 x {at_175['young_daly_cost_s'] * 1e3:.3f} ms x {at_175['mtbf_s']:,.0f} s) = {young:.2f} s "
                  f"is shorter than the write, so both are the floor, {at_175['write_floor_steps']} steps "
                  f"({at_175['write_floor_s']:.2f} s)")
    warning = re.search(r"warning: async checkpoints every 3 steps .*?\(checkpoint\.interval\)", flowing(printed.err))
    assert warning is not None, printed.err
    quotes.append(f"(and on stderr, first, `{warning[0]}`)")
    text = (REPO / "docs" / "reliability.md").read_text()
    page = flowing(text)
    assert [quote for quote in quotes if quote not in page] == []
    assert w175_rows(printed.out) == w175_rows(W175_BLOCK.findall(text)[0])


def test_the_memory_training_step_md_quotes_for_deepseek_without_recompute_is_what_validate_gives():
    loaded = load_scenario("deepseek-v3-style-1024-gpus", ["training.recompute=none"])
    stage = validate(loaded, sized_topology(loaded, force=False)).memory["memory_per_stage"][1]
    state = stage["params_gib"] + stage["grads_gib"] + stage["optimizer_gib"]
    now = (f"without it stage 1 would keep {stage['in_flight_microbatches']:.0f} micro-batches of "
           f"{stage['activation_per_microbatch_gib']:.1f} GiB next to {state:.1f} GiB of model state "
           f"({stage['total_gib']:.1f} GiB)")
    assert now in flowing((REPO / "docs" / "training-step.md").read_text()), now
