"""Quantities as users write them (units.py): thousands separators, binary bandwidths, a unit meant for another."""

from __future__ import annotations

import math

import pytest

from simulator.cli import main
from simulator.config.reliability import parse_rate
from simulator.errors import InputError
from simulator.units import durations_apart, parse_bandwidth, parse_duration, parse_size

DURATIONS = "(allowed: ns, us, ms, s, min, h, d)"


def test_thousands_separators_read_as_trainsim_prints_them():
    """'1,800 s' is 1,800 s, not 1 with the unit ',800 s', as rates take '16,384'."""
    assert parse_duration("1,800 s") == 1800.0
    assert parse_duration("1,234,567.5 ms") == 1234.5675
    assert parse_size("1,024 MiB") == 2.0**30
    assert parse_bandwidth("1,600 Gb/s") == 200e9
    assert parse_rate("1,000 per 16,384 units per 1,000 h") == pytest.approx(1000 / 16384 / 3.6e6, rel=1e-15)


@pytest.mark.parametrize("text", ["1,8 s", "1,80 s", "12,3456 s"])
def test_a_comma_that_groups_no_three_digits_says_how_separators_go(text):
    with pytest.raises(InputError) as error:
        parse_duration(text)
    assert str(error.value) == (f"<input>: unknown unit {text[text.index(','):]!r} in {text!r}: thousands separators "
                                f"group three digits ('1,800'), and a decimal point is '.' {DURATIONS}")


def test_binary_prefixed_bandwidths_are_bytes_per_second():
    """nccl-tests reports GiB/s: '50 GiB/s' was an unknown unit; bits keep decimal prefixes only."""
    assert parse_bandwidth("50 GiB/s") == 50 * 2.0**30
    assert parse_bandwidth("1 KiB/s") == 1024.0 and parse_bandwidth("2 PiB/s") == 2 * 2.0**50
    with pytest.raises(InputError, match="unknown unit 'Gib/s'"):
        parse_bandwidth("50 Gib/s")


@pytest.mark.parametrize(("text", "unit", "meant"), [("30m", "m", "min"), ("2 days", "days", "d"),
                                                     ("5 sec", "sec", "s"), ("1 hr", "hr", "h")])
def test_a_duration_unit_written_another_way_names_the_one_to_write(text, unit, meant):
    with pytest.raises(InputError) as error:
        parse_duration(text)
    assert str(error.value) == (f"<input>: unknown unit {unit!r} in {text!r}: durations write {meant!r} for "
                                f"{unit!r} {DURATIONS}")


def test_the_command_line_takes_a_separated_interval_and_names_min_for_m(tmp_path, capsys):
    """`--set "checkpoint.interval=1,800 s"` validates; `--set checkpoint.interval=30m` is one line naming min."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text("cluster: {topology: dgx-h100-cluster, nodes: 1}\nmodel: {preset: llama3-8b}\n"
                        "training: {seq_len: 1024, global_batch: 8}\nparallelism: {tp: 8}\n"
                        "run: {horizon: 1 d}\nfaults: {components: {gpu: {mtbf: 1000 h}}}\n")
    assert main(["validate", str(scenario), "--quiet", "--set", "checkpoint.interval=1,800 s"]) == 0
    capsys.readouterr()
    assert main(["validate", str(scenario), "--quiet", "--set", "checkpoint.interval=30m"]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim validate: --set checkpoint.interval=30m: unknown unit 'm' in '30m': durations "
        "write 'min' for 'm' (allowed: a number of steps, e.g. '200 steps', or a duration in ns, us, ms, s, min, h, "
        "d, e.g. '30 min')\n")


def test_two_times_print_in_one_unit_with_as_many_digits_as_tell_them_apart():
    """Times read side by side share the unit the shorter reaches, with four digits or as many more as tell
    them apart, and never an exponent (12.78 s beside 12.79 s, not '1.278e+04 ms')."""
    assert durations_apart(6.04e-3, 6.0400001e-3) == ("6.04 ms", "6.0400001 ms")
    assert durations_apart(0.03447e-3, 0.1999e-3) == ("34.47 us", "199.9 us")
    assert durations_apart(1e-3, 1e-3) == ("1 ms", "1 ms")
    assert durations_apart(12.7845, 12.78501) == ("12.78 s", "12.79 s")
    assert durations_apart(12784.4, 12785.01) == ("12,784 s", "12,785 s")
    assert durations_apart(0.999, 1.2) == ("999 ms", "1,200 ms")
    assert durations_apart(0.0, 0.0) == ("0 s", "0 s")


def test_zero_and_times_that_are_not_finite_read_plainly_beside_another():
    """Zero beside another time is '0 s', as every zero duration reads (units.py `ZERO_DURATION`), and the other
    keeps its own unit; a time that is not finite reads 'inf' or 'nan' in the other's unit, not an error."""
    assert durations_apart(0.0, 5e-6) == ("0 s", "5 us")
    assert durations_apart(2.5e-3, 0.0) == ("2.5 ms", "0 s")
    assert durations_apart(1.0, math.inf) == ("1 s", "inf s")
    assert durations_apart(math.nan, 2e-3) == ("nan ms", "2 ms")
    assert durations_apart(math.inf, math.inf) == ("inf s", "inf s")
