"""The user-facing CSV format: float noise trimmed to six significant digits, whole numbers kept whole."""

import pandas as pd

from simulator.report.tables import csv_text


def test_csv_floats_keep_six_significant_digits_and_whole_numbers_stay_exact():
    """A checkpoint cost of 0.03999999999996362 s reads 0.04 and Young's 29.39387691338477 s 29.3939 (six
    significant digits, no exponent: 1.08e+04 would read 10800); a byte count of 1,234,567,890 held as a float
    stays 1234567890 (rounding it would read 1234570000); a missing value is empty."""
    frame = pd.DataFrame({"cost_s": [0.03999999999996362, 29.39387691338477, 10800.5],
                          "bytes": [1234567890.0, 2.0**53, None], "name": ["a", "b", "c"]})
    assert csv_text(frame).splitlines() == ["cost_s,bytes,name", "0.04,1234567890,a",
                                            "29.3939,9007199254740992,b", "10800.5,,c"]
