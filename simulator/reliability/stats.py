"""Statistics over replications (means with 95% intervals) and the classic optimal checkpoint intervals.

The interval is the Student-t one, mean +/- t(0.975, n - 1) s / sqrt(n); t comes from a table for up to 30
degrees of freedom and from the Cornish-Fisher expansion beyond (error < 1e-4 there).
Young (1974): T = sqrt(2 C M). Daly (2006): T = sqrt(2 C M) [1 + (1/3) sqrt(C / 2M) + (1/9) (C / 2M)] - C for
C < 2M, else M; C is the cost of one checkpoint, M the mean time between interruptions.
"""

from __future__ import annotations

import math

import numpy as np

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959963984540054


def t975(dof: int) -> float:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom."""
    if dof <= len(_T975):
        return _T975[dof - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def mean_interval(values, bounds: tuple[float, float] = (0.0, math.inf)) -> dict:
    """Mean, standard deviation and 95% interval of the mean over replications (no interval for one), the
    interval kept within ``bounds``, the range the quantity can take: a count, a duration or a rate is never
    negative (a rare event's t interval reaches below 0), a fraction such as ETTR also at most 1. No values
    (lost work per failure of a job without failures) have no mean: None."""
    array = np.asarray(values, dtype=float)
    if array.size < 2:
        return {"mean": float(array.mean()) if array.size else None, "std": 0.0, "ci95_low": None, "ci95_high": None}
    mean, std = float(array.mean()), float(array.std(ddof=1))
    half = t975(array.size - 1) * std / math.sqrt(array.size)
    low, high = bounds
    return {"mean": mean, "std": std, "ci95_low": max(mean - half, low), "ci95_high": min(mean + half, high)}


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's optimal compute time between checkpoints."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimal compute time between checkpoints."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s
