"""The CSV tables a user reads (a sweep's results, a search's candidates, a study's points): floats to six
significant digits, written plainly (29.3939, not 29.39387691338477 nor 2.93939e+01), since their last digits
are float noise (a checkpoint cost of 0.03999999999996362 s, a difference of two times). The Parquet and JSON
files beside them keep every digit for programs. A whole number held as a float (a byte count, a GPU count
in a float column) is written whole: rounding it would change a count, not trim noise."""

from __future__ import annotations

import numpy as np
import pandas as pd

CSV_SIGNIFICANT_DIGITS = 6
EXACT_WHOLE = 2.0**53
"""The largest whole number every float64 below it holds exactly."""


def _plain(value: object) -> str:
    """A float ``value`` (numpy's float64 is one) rounded to CSV_SIGNIFICANT_DIGITS significant digits, without
    an exponent, or whole when it is a whole number float64 holds exactly; anything else as str gives it."""
    if not isinstance(value, float):
        return str(value)
    if value.is_integer() and abs(value) <= EXACT_WHOLE:
        return str(int(value))
    return np.format_float_positional(value, precision=CSV_SIGNIFICANT_DIGITS, unique=True, fractional=False,
                                      trim="-")


def csv_text(frame: pd.DataFrame) -> str:
    """``frame`` as CSV without its index, floats to CSV_SIGNIFICANT_DIGITS significant digits (missing values
    empty)."""
    return frame.to_csv(index=False, float_format=_plain)
