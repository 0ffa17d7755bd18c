"""Numbers in scenario files and `--set` values are read by YAML 1.2's rules, as booleans are: a zero-padded
count is decimal (YAML 1.1 read `spares: 010` as octal 8, silently), and base-60, binary and underscored numbers
are words, which a number field refuses at their line. Whole numbers may carry thousands
separators, as trainsim prints them and as quantities took them."""

from __future__ import annotations

import pytest
from shared import SPARE_JOB

from simulator.cli import main
from simulator.config.loader import scenario_from_text
from simulator.config.yaml_source import parse_value
from simulator.errors import InputError, ScenarioError
from simulator.sweep.spec import sweep_from_text
from simulator.units import parse_size

BUNDLED = "llama3-8b-dgx-h100-dp8"


@pytest.mark.parametrize(("text", "value"), [
    ("010", 10), ("0100", 100), ("007", 7), ("-012", -12), ("0o10", 8), ("0x1F", 31), ("0", 0),
    ("1:30", "1:30"), ("0b101", "0b101"), ("1_0", "1_0"), ("1:30.0", "1:30.0"), ("1_000.5", "1_000.5"),
    ("4,096", 4096), ("-1,000,000", -1000000), ("1,00", "1,00"), ("1,0000", "1,0000"), ("'4,096'", "4,096"),
    ("4.8e10", 4.8e10), ("1e9", 1e9), (".5", 0.5), ("2.", 2.0),
])
def test_numbers_follow_yaml_1_2(text, value):
    read = parse_value(text)
    assert read == value and type(read) is type(value)


def test_a_zero_padded_count_is_decimal_in_a_file_and_in_a_set():
    loaded = scenario_from_text(SPARE_JOB.replace("nodes: 2", "nodes: 12").replace("spares: 1", "spares: 010"),
                                overrides=["run.replications=0100", "run.seed=007"])
    assert (loaded.scenario.restart.spares, loaded.scenario.run.replications, loaded.scenario.run.seed) == (10, 100, 7)


@pytest.mark.parametrize("value", ["1:30", "0b101", "1_0"])
def test_a_base_60_binary_or_underscored_count_is_refused_as_typed(value, capsys):
    assert main(["validate", "llama3-405b-16k-job", "--set", f"run.replications={value}"]) == 2
    assert capsys.readouterr().err == (f"error: command line: trainsim validate: --set run.replications={value}: "
                                       f"expected a whole number, got '{value}' (allowed: an integer from 1 to 10,000, "
                                       "1 where not given)\n")


def test_a_base_60_count_in_a_file_is_refused_at_its_line(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SPARE_JOB.replace("spares: 1", "spares: 1:00"))
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (f"error: {scenario}:23: restart.spares: expected a whole number, got '1:00' "
                                       "(allowed: an integer >= 0, 0 where not given)\n")


def test_thousands_separators_in_a_whole_number_in_a_file_and_in_a_set():
    loaded = scenario_from_text(SPARE_JOB.replace("seq_len: 1024", "seq_len: 4,096"),
                                overrides=["run.replications=1,024"])
    assert (loaded.scenario.training.seq_len, loaded.scenario.run.replications) == (4096, 1024)


def test_a_separated_number_in_a_flow_mapping_says_yaml_splits_it(tmp_path, capsys):
    """YAML reads `{seq_len: 4,096, global_batch: 32}` as seq_len 4 and a key '096' without a value: the error
    was `training.96: unknown key '96'`."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text("cluster: {topology: dgx-h100}\nmodel: {preset: llama3-8b}\n"
                        "training: {seq_len: 4,096, global_batch: 32}\n")
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (f"error: {scenario}:3: training.seq_len: 4,096 in a {{...}} mapping is two "
                                       "entries to YAML (its comma separates them) (allowed: 4096 in the {...}, or "
                                       "4,096 on a line of its own)\n")


@pytest.mark.parametrize("text", ["0,032", "0,128", "01,024", "-0,500"])
def test_a_leading_zero_is_no_thousands_group(text):
    """`cluster.nodes=0,032` and `servers: 0,128` (a host list typed without brackets) are not read as 32 and
    128."""
    assert parse_value(text) == text
    with pytest.raises(InputError, match=r"cannot read size|unknown unit"):
        parse_size(f"{text} GiB")


def test_a_separated_number_in_a_flow_list_of_a_sweep_says_yaml_splits_it():
    """A grid of `[1,024, 2,048]` ran the four points 1, 24, 2 and 48."""
    text = f"base: {BUNDLED}\ngrid:\n  training.global_batch: [1,024, 2,048]\n"
    with pytest.raises(ScenarioError) as refused:
        sweep_from_text(text, "sw.yaml")
    assert str(refused.value) == ("sw.yaml:3: grid.training.global_batch[0]: 1,024 in a [...] list is two entries to "
                                  "YAML (its comma separates them) (allowed: 1024 in the [...], or 1,024 on a line "
                                  "of its own)")


@pytest.mark.parametrize("override, error", [
    ("parallelism.dp=[1,024]", "parallelism.dp[0]: 1,024 in a [...] list is two entries to YAML (its comma separates "
                               "them) (allowed: 1024 in the [...], or 1,024 on a line of its own)"),
    ("training={seq_len: 4,096, global_batch: 32}",
     "training.seq_len: 4,096 in a {...} mapping is two entries to YAML (its comma separates them) (allowed: 4096 in "
     "the {...}, or 4,096 on a line of its own)"),
])
def test_a_separated_number_in_a_set_flow_value_is_refused_at_the_override(override, error, capsys):
    """A number with thousands separators in a --set flow value is refused at the override, not read as `--set
    parallelism.dp=[1,024]`'s 'got [1, 24]' or `--set 'training={seq_len: 4,096, ...}'`'s 'training.96: unknown key
    '96''."""
    assert main(["validate", BUNDLED, "--set", override]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim validate: --set {override}: {error}\n"
