"""The replications' 95% intervals (reliability/stats.py): Student's t, kept within the quantity's range."""

from __future__ import annotations

import math

import pytest

from simulator.reliability.stats import mean_interval, t975


def test_interval_is_students_t_of_the_mean():
    values = [0.90, 0.92, 0.91, 0.95]
    mean, std = sum(values) / 4, math.sqrt(sum((v - 0.92) ** 2 for v in values) / 3)
    interval = mean_interval(values, bounds=(0.0, 1.0))
    half = 3.182 * std / 2
    assert interval["mean"] == pytest.approx(0.92, rel=1e-12)
    assert (interval["ci95_low"], interval["ci95_high"]) == pytest.approx((mean - half, mean + half), rel=1e-12)
    assert t975(3) == 3.182


def test_a_rare_events_interval_stops_at_zero_and_a_fraction_at_one():
    """Interruptions of a rare cause, 0 in four replications of five and 7 in one: the t interval of the mean
    (1.4 +/- 2.776 x 3.13 / sqrt 5 = [-2.49, 5.29]) reaches below 0, which no count can."""
    counts = mean_interval([0, 0, 0, 0, 7])
    assert counts["ci95_low"] == 0.0
    assert counts["ci95_high"] == pytest.approx(1.4 + 2.776 * math.sqrt(9.8) / math.sqrt(5), rel=1e-12)
    ettr = mean_interval([0.99, 1.0, 0.80], bounds=(0.0, 1.0))
    assert ettr["ci95_high"] == 1.0 and ettr["ci95_low"] < ettr["mean"]
