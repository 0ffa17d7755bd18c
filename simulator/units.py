"""Quantities with units: "400 Gb/s", "450 GB/s", "25 MiB", "1.5 us", "54 d" into SI floats.

Internal units are bytes, bytes per second and seconds. Sizes accept both decimal (KB, MB, GB, TB, PB) and
binary (KiB, MiB, GiB, TiB, PiB) prefixes, and so do bandwidths in bytes (GB/s as vendors quote link rates,
GiB/s as nccl-tests and some data sheets do; bits take decimal prefixes only). A number may carry thousands
separators ('1,800 s', as trainsim prints it). A bare number where a unit is needed is an error that lists the
units that work, and a unit often meant for another ('30m', '2 days') names the one to write.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from simulator.errors import InputError, yaml_spelling

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}

SIZE_UNITS: dict[str, float] = {
    "B": 1.0,
    "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "PB": 1e15,
    "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40, "PiB": 2.0**50,
}
DURATION_UNITS: dict[str, float] = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
}
BANDWIDTH_UNITS: dict[str, float] = {
    **{f"{p}b/s": f / 8.0 for p, f in _DECIMAL.items() if p != "K"},
    **{f"{p}B/s": f for p, f in _DECIMAL.items() if p != "K"},
    "Kb/s": 1e3 / 8.0, "KB/s": 1e3,
    **{f"{unit}/s": SIZE_UNITS[unit] for unit in ("KiB", "MiB", "GiB", "TiB", "PiB")},
}
POWER_UNITS: dict[str, float] = {"W": 1.0, "kW": 1e3}
DURATION_MEANT: dict[str, str] = {"m": "min", "mins": "min", "minute": "min", "minutes": "min", "sec": "s",
                                  "secs": "s", "second": "s", "seconds": "s", "hr": "h", "hrs": "h", "hour": "h",
                                  "hours": "h", "day": "d", "days": "d"}
"""Duration units written another way, and the unit meant: 'm' is minutes in many tools (but meters or milli
elsewhere, so it is not taken)."""
SEPARATED_WHOLE = r"[1-9]\d{0,2}(?:,\d{3})+"
"""A whole number with thousands separators as trainsim prints them ('16,384'); a leading zero is no group
('0,128' is a host list typed without its brackets, not 128)."""
NUMBER = rf"[-+]?(?:{SEPARATED_WHOLE}(?:\.\d*)?|\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
"""A number as a quantity or a rate's count is written, thousands separators allowed ('16,384', '1,800 s')."""
_NUMBER = re.compile(rf"^\s*({NUMBER})\s*([^\s\d].*?)?\s*$")

QuantityKind = Literal["size", "duration", "bandwidth", "power"]
"""The kinds of quantity a unit can give (bytes, seconds, bytes per second, watts)."""
_KINDS: dict[QuantityKind, dict[str, float]] = {
    "size": SIZE_UNITS,
    "duration": DURATION_UNITS,
    "bandwidth": BANDWIDTH_UNITS,
    "power": POWER_UNITS,
}


def _allowed(kind: QuantityKind) -> str:
    names = {"size": ", ".join(SIZE_UNITS),
             "duration": "ns, us, ms, s, min, h, d",
             "bandwidth": "b/s or B/s with k, M, G, T, P prefixes, or B/s with Ki, Mi, Gi, Ti, Pi, e.g. '400 Gb/s', "
                          "'450 GB/s', '50 GiB/s'",
             "power": "W or kW, e.g. '700 W'"}
    return names[kind]


def case_hint(unit: str, names: Iterable[str]) -> str:
    """Where ``unit`` is one of ``names`` in other letters' case ('MIN', 'gib', 'Steps'), that units are
    case-sensitive and which it may mean: they stay so, since case tells b from B (8 times) and m from M."""
    meant = [name for name in names if name.casefold() == unit.casefold()]
    return f": units are case-sensitive ({' or '.join(meant)})" if meant else ""


def parse_quantity(value: object, kind: QuantityKind) -> float:
    """Parse ``value`` (a string with a unit) as a quantity of ``kind`` and return it in SI units."""
    table = _KINDS[kind]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError(f"expected a {kind} with a unit, got {yaml_spelling(value)}", allowed=_allowed(kind))
    if isinstance(value, (int, float)):
        if value == 0 and kind in ("size", "duration"):
            return 0.0
        raise InputError(f"{kind} {value!r} has no unit", allowed=_allowed(kind))
    match = _NUMBER.match(value)
    if not match:
        raise InputError(f"cannot read {kind} {value!r}", allowed=_allowed(kind))
    number, unit = float(match.group(1).replace(",", "")), (match.group(2) or "").strip()
    if not unit:
        if number == 0 and kind in ("size", "duration"):
            return 0.0
        raise InputError(f"{kind} {value!r} has no unit", allowed=_allowed(kind))
    if unit not in table:
        meant = DURATION_MEANT.get(unit) if kind == "duration" else None
        hint = f": durations write {meant!r} for {unit!r}" if meant else case_hint(unit, table)
        if unit.startswith(","):
            hint = ": thousands separators group three digits ('1,800'), and a decimal point is '.'"
        raise InputError(f"unknown unit {unit!r} in {value!r}{hint}", allowed=_allowed(kind))
    result = number * table[unit]
    if not math.isfinite(result):
        raise InputError(f"{kind} {value!r} is not finite", allowed=_allowed(kind))
    return result


def parse_size(value: object) -> float:
    """Bytes from a size such as "25 MiB" or "14 GB"."""
    return parse_quantity(value, "size")


MAX_MESSAGE_BYTES = 2.0**50
"""Largest buffer one GPU sends or holds for communication (a collective's or transfer's size, a gradient
bucket, a pipelining chunk): 1 PiB, thousands of times the memory of any GPU, so anything above it is a typo
(1e30 B) rather than a study."""
MESSAGE_ALLOWED = "a size up to 1 PiB (2^50 B), e.g. 64 MiB"


def parse_message_size(value: object) -> float:
    """Bytes of a communication buffer (MAX_MESSAGE_BYTES): a size with its unit, zero, or one beyond any GPU's
    memory refused."""
    nbytes = parse_size(value)
    if nbytes > MAX_MESSAGE_BYTES:
        raise InputError(f"size {value!r} is more than 1 PiB, beyond any GPU's memory", allowed=MESSAGE_ALLOWED)
    return nbytes


BUFFER_ALLOWED = "0 B, or whole bytes from 1 B up to 1 PiB (2^50 B), e.g. 64 MiB"


def whole_bytes(nbytes: float, value: object, allowed: str) -> float:
    """``nbytes``, parsed from ``value``, if it is a whole number of bytes (to float rounding: 0.3 GB is
    300000000 B): a buffer holds whole bytes, so 1.5 B or 1e-3 B is a typo, refused with ``allowed``."""
    if not math.isclose(nbytes, round(nbytes), rel_tol=1e-12):
        raise InputError(f"size {value!r} is {nbytes:.10g} B, not whole bytes", allowed=allowed)
    return nbytes


def parse_buffer_size(value: object) -> float:
    """Bytes of a scenario's buffer (a workload item, a synthetic P2P transfer, a gradient bucket): a message
    size of whole bytes, 0 B meaning nothing sent, as `trainsim collective --sizes` asks."""
    return whole_bytes(parse_message_size(value), value, BUFFER_ALLOWED)


BUCKET_ALLOWED = "whole bytes from 1 B up to 1 PiB (2^50 B), e.g. 25 MiB"


def parse_bucket_size(value: object) -> float:
    """Bytes of a DDP gradient bucket's cap: whole bytes, at least 1 B (a 0 B cap is no bucket size)."""
    nbytes = whole_bytes(parse_message_size(value), value, BUCKET_ALLOWED)
    if nbytes <= 0:
        raise InputError(f"size {value!r} is no bucket: a bucket holds at least 1 B", allowed=BUCKET_ALLOWED)
    return nbytes


def parse_duration(value: object) -> float:
    """Seconds from a duration such as "1.5 us" or "54 d"."""
    return parse_quantity(value, "duration")


MAX_STEP_DURATION_S = 86_400.0
"""Longest time inside one training step (a synthetic stage's pass, when a fault strikes): a day, millions of
times a real stage's pass, so anything above it is a typo (1e300 s) rather than a study."""


def parse_step_duration(value: object) -> float:
    """Seconds of a time inside one step (MAX_STEP_DURATION_S): a duration with its unit, more than a day refused."""
    seconds = parse_duration(value)
    if seconds > MAX_STEP_DURATION_S:
        raise InputError(f"duration {value!r} is more than a day, longer than any training step",
                         allowed="a duration up to 1 d, e.g. 3 ms")
    return seconds


def parse_power(value: object) -> float:
    """Watts from a power such as "700 W" or "1.2 kW"."""
    return parse_quantity(value, "power")


def parse_bandwidth(value: object) -> float:
    """Bytes per second from a bandwidth such as "400 Gb/s" (bits) or "450 GB/s" (bytes)."""
    return parse_quantity(value, "bandwidth")


def parse_size_range(text: str) -> list[float]:
    """Sizes from ``LOW:HIGH`` (doubling from LOW up to HIGH) or a comma list, as nccl-tests' -b/-e/-f 2."""
    if ":" in text:
        low_text, high_text = text.split(":", 1)
        low, high = parse_message_size(low_text), parse_message_size(high_text)
        if low < 1 or high < low:
            raise InputError(f"size range {text!r} must go up from a size of 1 B or more", allowed="e.g. 1MiB:8GiB")
        whole_bytes(low, low_text, "whole bytes, e.g. 1MiB:8GiB")
        sizes = []
        size = low
        while size <= high * (1 + 1e-12):
            sizes.append(size)
            size *= 2
        return sizes
    if "," in text and any(not part.strip() for part in text.split(",")):
        raise InputError(f"{text!r} has an empty item between commas", allowed="e.g. 1MiB,64MiB")
    sizes = [parse_message_size(part) for part in text.split(",")]
    if any(size < 1 for size in sizes):
        raise InputError(f"sizes {text!r} must be 1 B or more (whole bytes)", allowed="e.g. 1MiB,64MiB")
    return [whole_bytes(size, part, "whole bytes, e.g. 1MiB,64MiB") for size, part in zip(sizes, text.split(","))]


# The units the formatters below choose from, largest first: (name, its size in bytes, seconds or bytes/s).
SIZE_STEPS = (*((unit, SIZE_UNITS[unit]) for unit in ("TiB", "GiB", "MiB", "KiB")), ("B", 1.0))
DECIMAL_SIZE_STEPS = (*((unit, SIZE_UNITS[unit]) for unit in ("PB", "TB", "GB", "MB", "KB")), ("B", 1.0))
DURATION_STEPS = (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))
BANDWIDTH_STEPS = (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3), ("B/s", 1.0))


def rate_steps(unit: str) -> tuple[tuple[str, float], ...]:
    """The units of a count per second, ``unit`` ('tokens/s') with the decimal prefixes k, M and G."""
    return tuple((f"{prefix} {unit}".strip(), scale) for prefix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3),
                                                                           ("", 1.0)))


def fitting_unit(value: float, units: tuple[tuple[str, float], ...]) -> tuple[str, float]:
    """The first of ``units`` (largest first) whose scale ``value`` reaches, the last one when it reaches none."""
    return next(((unit, scale) for unit, scale in units if abs(value) >= scale), units[-1])


def _scaled(value: float, units: tuple[tuple[str, float], ...], digits: int = 4) -> str:
    """``value`` to ``digits`` significant digits (4 unless told) in its fitting unit of ``units``."""
    unit, scale = fitting_unit(value, units)
    return f"{value / scale:.{digits}g} {unit}"


def four_digits(value: float, zeros: bool = False) -> str:
    """``value`` to four significant digits: whole with thousands separators from 1,000 on (1,040; 31,942), below
    that with its trailing zeros where ``zeros`` (49.30, for figures read side by side) or without (49.3)."""
    if float(f"{value:.4g}") >= 1000:
        return f"{value:,.0f}"
    return f"{value:#.4g}" if zeros and value else f"{value:.4g}"


def counted(number: object, one: str, many: str = "") -> str:
    """A count with its noun, singular for one, whole numbers with thousands separators: '1 host', '16,384 GPUs',
    '2 micro-batches' (``many`` where the plural is not ``one`` + 's')."""
    shown = f"{number:,}" if isinstance(number, int) and not isinstance(number, bool) else number
    return f"{shown} {one if number == 1 else (many or one + 's')}"


def expected_count(expected: float, one: str = "", many: str = "") -> str:
    """A count a model expects (a mean, rarely whole), with its noun where given: whole with thousands
    separators from 100 on, three significant digits below, the noun singular for exactly one ('4,250
    degradations', '2.07 degradations', '1 degradation'; '{:,.3g}' printed '4.25e+03' and '1 degradations'), the
    noun's number following the figure shown (0.9996 reads '1 degradation')."""
    shown = format_count(expected) if abs(expected) >= 100 else f"{expected:.3g}"
    if not one:
        return shown
    return f"{shown} {one if shown == '1' else (many or one + 's')}"


def number_ranges(numbers: Iterable[int]) -> str:
    """Whole numbers, ascending, with each run of three or more consecutive ones as 'first to last': an elastic
    job's sizes on 128 replicas read '22 to 128', not 107 numbers; [3, 4] stays '3, 4'."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(f"{run[0]} to {run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)


def magnitude(value: object) -> float | None:
    """A sweep value's size for ordering: a number as it is, a quantity in its SI unit (a size, a duration or a
    bandwidth), None for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        for kind in _KINDS:
            try:
                return parse_quantity(value, kind)
            except InputError:
                continue
    return None


SHOWN_SIGNIFICANT_DIGITS = 6
"""Digits a value of a sweep axis is shown with in messages and charts (the results files keep every one)."""


def shown_value(value: object) -> str:
    """A sweep axis's value as a person reads it: a float, or a quantity's number where it has more digits, to
    SHOWN_SIGNIFICANT_DIGITS significant digits (random draws printed as 0.30000000000000004 or
    11.501145599256004 read 0.3 and 11.5011; '0.00143764319991 s' reads '0.00143764 s', '25 MiB' stays); from
    10^6 to 10^15 to the nearest whole number with thousands separators, as format_count (1234567.8 read
    1.23457e+06, now 1,234,568; 1048576.0 reads 1,048,576); null, true or a mapping as `yaml_spelling` echoes it."""
    if isinstance(value, float):
        return _significant(value)
    if value is None or isinstance(value, (bool, dict, list, tuple)):
        return yaml_spelling(value)
    match = _NUMBER.match(value) if isinstance(value, str) else None
    if match is None or not match.group(2):
        return str(value)
    number = float(match.group(1))
    rounded = float(f"{number:.{SHOWN_SIGNIFICANT_DIGITS}g}")
    return f"{_significant(number)} {match.group(2)}" if rounded != number else str(value)


def _significant(number: float) -> str:
    """``number`` to SHOWN_SIGNIFICANT_DIGITS significant digits, or, where that would print an exponent below
    10^15 (from 10^6 on), to the nearest whole number with thousands separators: every digit shown is the
    number's own (1048576 reads '1,048,576', not '1,048,580')."""
    rounded = float(f"{number:.{SHOWN_SIGNIFICANT_DIGITS}g}")
    if 10**SHOWN_SIGNIFICANT_DIGITS <= abs(rounded) < 1e15:
        return format_count(number)
    return f"{number:.{SHOWN_SIGNIFICANT_DIGITS}g}"


def format_count(count: float) -> str:
    """A count for a message: whole and with thousands separators, 4 significant digits from 10^15 on (a count
    derived from a 1e300 s horizon has hundreds of digits): 27648096 -> '27,648,096', 6.48e299 -> '6.48e+299'."""
    return f"{count:,.0f}" if abs(count) < 1e15 else f"{count:.4g}"


def format_size(nbytes: float) -> str:
    """A human-readable binary size: 1073741824 -> '1 GiB'."""
    return _scaled(nbytes, SIZE_STEPS)


def format_memory(gib: float) -> str:
    """A memory figure given in GiB, as the console prints it: GiB to one decimal, MiB below 0.1 GiB (a tiny
    model's 45 MiB printed as '0.0 GiB'): 42.39 -> '42.4 GiB', 0.044 -> '45.1 MiB'."""
    return f"{gib:,.1f} GiB" if abs(gib) >= 0.1 or not gib else f"{gib * 1024:,.1f} MiB"


def format_decimal_size(nbytes: float) -> str:
    """A size in decimal units, as storage and checkpoints are quoted and their fields given: 112423657472 ->
    '112.4 GB' (`format_size`'s '104.7 GiB' beside a write rate of 8 GB/s made a 14.05 s write look wrong)."""
    return _scaled(nbytes, DECIMAL_SIZE_STEPS)


def texts_apart(values: Sequence[float], write: Callable[[float, int], str], least: int = 4,
                most: int = 17) -> list[str]:
    """``values`` written by ``write(value, digits)`` with ``least`` significant digits, or as many more, up to
    ``most``, as distinct values need to read differently (17 digits tell any two different floats apart):
    figures read side by side must not print alike where they differ. Values still alike at ``most`` digits
    (apart by float noise) count as one, so they do not widen every other text to ``most`` digits."""
    distinct = len({write(value, most) for value in values})
    for digits in range(least, most + 1):
        texts = [write(value, digits) for value in values]
        if len(set(texts)) == distinct:
            break
    return texts


def decimal_sizes_apart(first: float, second: float) -> tuple[str, str]:
    """Two different sizes in decimal units, as storage and checkpoints are quoted and their fields are given
    (6.48e12 -> '6.48 TB'; a `storage.capacity` of 1 TB was echoed as 931.3 GiB, in a base the user never wrote),
    to four significant digits or as many more as they need to read differently (`texts_apart`): 100.02 GB
    against 100 GB read '100 GB' twice, now '100.02 GB' and '100 GB'."""
    first_text, second_text = texts_apart([first, second], lambda value, digits: _scaled(
        value, DECIMAL_SIZE_STEPS, digits))
    return first_text, second_text


ZERO_DURATION = "0 s"
"""Every duration of zero, whatever the figures beside it: zero has no magnitude to pick a unit by (it read '0 ns'
or '0 us', and '0 us' beside seconds in a mean's 95% range)."""


def format_duration(seconds: float, digits: int = 4) -> str:
    """A human-readable duration to ``digits`` significant digits (4 unless told; `texts_apart` asks for
    more): 0.0123 -> '12.3 ms'; zero `ZERO_DURATION`."""
    return ZERO_DURATION if seconds == 0 else _scaled(seconds, DURATION_STEPS, digits)


def format_seconds(value: float) -> str:
    """A duration with a unit that keeps three or four significant digits (whole seconds with thousands
    separators from 1,000 s on, as `four_digits` writes them: 'per failure 1040 s' read beside '31,942 s'; four
    significant digits from 10^15 s on, as format_count: Young's interval at a failure rate x 1e-300 had 307
    digits). The unit and the form are chosen by the value as rounded: a checkpoint's 0.99999999999998 ms cost
    reads '1 ms' (not '1000 us'), 9999.99 s '10,000 s' (not '1e+04 s'). The console's figures and the fold
    reasons' gaps (engine/lockstep.py) both read through it."""
    return _seconds(value, zeros=False)


def seconds_alike(value: float) -> str:
    """`format_seconds` with its trailing zeros kept (49.30 s, 46.00 s), for figures read side by side, a mean and
    its 95% interval, Young's and Daly's intervals: 'Young 49.3 s, Daly 49.29 s' and '46.9 s (95%: 46 s to
    47.81 s)' read as if one figure were known to fewer digits than the other."""
    return _seconds(value, zeros=True)


def _seconds(value: float, zeros: bool) -> str:
    """`format_seconds` and, with ``zeros``, `seconds_alike`; zero in seconds (`ZERO_DURATION`)."""
    if value == 0:
        return ZERO_DURATION
    if rounds_to(value, 1e15):
        return f"{value:.4g} s"
    if rounds_to(value, 1):
        return f"{four_digits(value, zeros)} s"
    if rounds_to(value, 1e-3):
        return f"{four_digits(value * 1e3, zeros)} ms"
    return f"{four_digits(value * 1e6, zeros)} us"


def rounds_to(value: float, bound: float) -> bool:
    """Whether ``value`` to four significant digits is ``bound`` or more."""
    return float(f"{value:.4g}") >= bound


def durations_alike(seconds: Iterable[float]) -> Callable[[float], str]:
    """A formatter for durations read side by side: one unit, the largest the shortest of ``seconds`` reaches, to
    four significant digits (a study line read 'interval 20 min ...; Young 805 s', two figures to compare in two
    units), where the longest then reads in at most four digits; figures further apart than that each in their
    own unit, as `format_duration` writes them (a 60 d interval beside Young's 19 min read '86,400 min'); zero is
    `ZERO_DURATION` in any company ('0 s to 2.406 min')."""
    positive = [value for value in seconds if value > 0]
    if not positive:
        return format_duration
    unit, scale = fitting_unit(min(positive), DURATION_STEPS)
    if float(f"{max(positive) / scale:.4g}") >= 1e4:
        return format_duration
    return lambda value: ZERO_DURATION if value == 0 else f"{four_digits(value / scale, zeros=True)} {unit}"


SECOND_STEPS = DURATION_STEPS[3:]
"""The units of a time inside a run, as the console gives it: seconds and below, never minutes."""


def durations_apart(first: float, second: float) -> tuple[str, str]:
    """Two times read side by side (when a collective's copies ended, how long a group and its mirror take) in
    one unit of `SECOND_STEPS`, the one the shorter reaches, to four significant digits or as many more as they
    need to read differently (`texts_apart`), with thousands separators and never an exponent: 12.78 s and
    12.79 s, not '1.278e+04 ms' beside '12785.01 ms'. Zero is `ZERO_DURATION` beside any other time, and a time
    that is not finite reads as Python writes it, in the other's unit ('inf ms' beside '1 ms'; 'inf s' where
    neither is finite)."""
    sized = [abs(value) for value in (first, second) if value and math.isfinite(value)]
    unit, scale = fitting_unit(min(sized), SECOND_STEPS) if sized else ("s", 1.0)
    first_text, second_text = (ZERO_DURATION if value == 0 else f"{text} {unit}" for value, text in zip(
        (first, second), texts_apart([first / scale, second / scale], _plain_digits), strict=True))
    return first_text, second_text


def _plain_digits(value: float, digits: int) -> str:
    """``value`` in fixed point to ``digits`` significant digits, or to every whole digit where it has more
    (thousands separators, no exponent, no trailing zeros after the point): 12785.01 to 7 digits is
    '12,785.01', to 4 digits '12,785'; 119.6 to 6 digits '119.6'; inf and nan as Python writes them."""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_bandwidth(bytes_per_s: float) -> str:
    """A human-readable bandwidth in bytes per second: 5e10 -> '50 GB/s'."""
    return _scaled(bytes_per_s, BANDWIDTH_STEPS)
