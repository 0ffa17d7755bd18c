"""A results table's column on a chart: the unit its name carries (summary.json's keys end in it: `step_time_s`,
`peak_memory_gib`, `busbw_GBps`, `tokens_per_s`, `rate_per_unit_per_h`; `mfu`, `ettr` and its confidence bounds
`ettr_ci95_*`, `*_fraction` and `share_of_*` are fractions) and the scale that shows it without an exponent or an
offset: a byte axis read '1e10' above its ticks and a step-time axis '1.4360 ... 1.4395' under the bare name
`step_time_s`."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from matplotlib.ticker import ScalarFormatter

from simulator.units import BANDWIDTH_STEPS, DURATION_STEPS, SIZE_STEPS, fitting_unit, rate_steps, texts_apart

FRACTION_NAMES = frozenset({"mfu", "hfu", "ettr"})
"""Whole key names of fractions of one; any key ending in one of FRACTION_ENDINGS is one too."""
FRACTION_ENDINGS = frozenset({"fraction", "share", "shares", "ratio"})
_INDEX = re.compile(r"\[\d+\]")


@dataclass(frozen=True)
class ColumnScale:
    """How a column's values are shown: divided by ``divisor``, in ``unit`` ('' for a count or a plain number)."""

    unit: str
    divisor: float

    def label(self, column: str) -> str:
        """The axis label: a column with a unit in words with the unit shown (`step_time_s` read 'step_time_s
        (ms)', seconds in the name and milliseconds beside it: now 'step time (ms)'); one without, as its name,
        which --x, --y and --value take. The chart's title keeps the column names."""
        return f"{spoken_column(column)} ({self.unit})" if self.unit else column

    def scaled(self, values):
        """``values`` (a number, Series or array) in the shown unit."""
        return values / self.divisor


PLAIN = ColumnScale("", 1.0)


def column_scale(column: str, values: Iterable[float]) -> ColumnScale:
    """The unit of ``column``, read from the last key of its flattened name that carries one (statistics such as
    `.mean` and keys such as `.dp` carry none), scaled so that its largest finite value in ``values`` reads
    without an exponent: seconds as us to days, bytes as B to TiB, counts per second as X/s to G X/s (the unit a
    study's goodput chart takes), fractions as percent."""
    finite = [abs(float(value)) for value in values if value is not None and math.isfinite(float(value))]
    largest = max(finite, default=0.0)
    for key in reversed(_INDEX.sub("", column).split(".")):
        scale = _key_scale(key, largest)
        if scale is not None:
            return scale
    return PLAIN


WORDS = {"busbw": "bus bandwidth", "comm": "communication", "gpu": "GPU", "mfu": "MFU", "hfu": "HFU",
         "ettr": "ETTR", "ci95": "95% CI", "dp": "DP", "tp": "TP", "pp": "PP", "cp": "CP", "ep": "EP"}
"""Words of a column's name said otherwise on an axis: acronyms in capitals, abbreviations spelled out."""


def spoken_column(column: str) -> str:
    """``column`` in words, without the unit its name carries (shown beside it): 'step_time_s' -> 'step time',
    'traffic_bytes_per_gpu.dp' -> 'traffic per GPU, DP', 'tokens_per_s' -> 'throughput', 'mfu' -> 'MFU'. A key
    holding keys in its unit says it too and drops it alike: a job's 'time_s.restart_s.mean' read 'time s,
    restart, mean (d)', now 'time, restart, mean (d)'."""
    keys = column.split(".")
    scales = [_key_scale(_INDEX.sub("", key), 0.0) for key in keys]
    shown = next((scale for scale in reversed(scales) if scale), None)
    return ", ".join(_spoken_key(key, unit=shown is not None and scale == shown) for key, scale in zip(
        keys, scales, strict=True))


def _spoken_key(key: str, *, unit: bool) -> str:
    """One key of a column's name in words, its unit words dropped where ``unit``."""
    words = key.split("_")
    if unit:
        if key.endswith(("_per_s", "_per_h")):  # the count or 'per unit per h' is the unit shown
            words = words[:-3] if key.endswith("_per_s") else words[:words.index("per")]
            words = words or ["throughput"]
        elif "tflops" in words:
            words = [*words[:words.index("tflops")], "FLOP", "rate"]
        else:
            words = [word for word in words if word != "bytes"]
            words = words[:-1] if len(words) > 1 and words[-1] in {"s", "gib", "GBps"} else words
    return " ".join(WORDS.get(word, word) for word in words)


def rate_scale(unit: str, largest: float) -> ColumnScale:
    """A count per second (``unit``: 'tokens/s') with the prefix k, M or G that ``largest`` reaches: every
    per-second column of a chart, and a study's goodput axis (reliability/plots.py)."""
    return ColumnScale(*fitting_unit(largest, rate_steps(unit)))


def _key_scale(key: str, largest: float) -> ColumnScale | None:
    """The scale one key of a column's name says, None where it says no unit."""
    words = key.split("_")
    if key.endswith("_per_s"):  # tokens_per_s, goodput_steps_per_s: in k, M or G where the values reach them
        if words[-3] == "bytes":
            return ColumnScale(*fitting_unit(largest, BANDWIDTH_STEPS))
        return rate_scale(f"{words[-3]}/s", largest)
    if key.endswith("_per_h"):  # rate_per_unit_per_h
        return ColumnScale(" ".join(words[words.index("per"):]), 1.0)
    if key.startswith("tflops") or key.startswith("hardware_tflops"):
        return ColumnScale("TFLOP/s per GPU", 1.0)
    if words[-1] == "GBps":
        return ColumnScale("GB/s", 1.0)
    if words[-1] == "gib":
        return ColumnScale("GiB", 1.0)
    if "bytes" in words:  # a column of zeros in the base unit, not the smallest
        return ColumnScale(*fitting_unit(largest, SIZE_STEPS)) if largest else ColumnScale("B", 1.0)
    if len(words) > 1 and words[-1] == "s":
        return ColumnScale(*fitting_unit(largest, DURATION_STEPS)) if largest else ColumnScale("s", 1.0)
    if key in FRACTION_NAMES or words[-1] in FRACTION_ENDINGS or words[:2] == ["share", "of"] or (
            words[0] in FRACTION_NAMES and words[1].startswith("ci")):  # share_of_step, ettr_ci95_low
        return ColumnScale("%", 0.01)
    return None


class PlainFormatter(ScalarFormatter):
    """Tick labels as plain numbers with thousands separators: no '1e6' above the axis, no offset beside it (a
    step time from 1.4358 s to 1.4397 s read '+1.436'), the decimals matplotlib chooses for the ticks' spacing."""

    def __init__(self) -> None:
        super().__init__(useOffset=False)
        self.set_scientific(False)

    def __call__(self, x, pos=None) -> str:
        text = super().__call__(x, pos)
        whole, dot, decimals = text.partition(".")
        digits = whole.lstrip("-\N{MINUS SIGN}")
        return f"{whole[:len(whole) - len(digits)]}{int(digits):,}{dot}{decimals}" if digits.isdigit() else text


def power_tick(value: float, position: int | None = None) -> str:
    """A tick of a base-2 log axis as a plain number: '1', '2', '1,024', '0.5' (matplotlib wrote 2^0, 2^10, and a
    linear formatter '1.0', '2.0')."""
    return f"{value:,.0f}" if value >= 1 and value == round(value) else f"{value:.4g}"


def cell_texts(values: Sequence[float]) -> list[str]:
    """A heat map's cell figures: whole with thousands separators from 1,000 on, four significant digits below
    ('{:.3g}' printed 91,043 tokens/s as '9.1e+04', the same as 91,268), or as many more as distinct cells need
    to read differently (`texts_apart`), up to six: scaled into k tokens/s, 91,041 and 91,044 both read
    '91.04'. Cells apart by rounding noise alone (means of equal runs) read alike and widen no other cell."""
    return texts_apart(values, _cell_text, most=6)


def _cell_text(value: float, digits: int) -> str:
    """One cell's figure to ``digits`` significant digits, never fewer than its whole part."""
    if abs(value) < 1000:
        return f"{value:.{digits}g}"
    return f"{value:,.{max(0, digits - len(str(int(abs(value)))))}f}"
