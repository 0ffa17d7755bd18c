"""Interval arithmetic on sorted numpy arrays: union length and the part of one set not covered by another."""

from __future__ import annotations

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the same points as the given ones."""
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    new_block = np.empty(len(starts), dtype=bool)
    new_block[0] = True
    new_block[1:] = starts[1:] > running_end[:-1]
    block_id = np.cumsum(new_block) - 1
    merged_starts = starts[new_block]
    merged_ends = np.zeros(len(merged_starts))
    np.maximum.at(merged_ends, block_id, running_end)
    return merged_starts, merged_ends


def covered(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of the union of the intervals."""
    s, e = merge(starts, ends)
    return float(np.sum(e - s))


def uncovered(starts: np.ndarray, ends: np.ndarray, cover_starts: np.ndarray, cover_ends: np.ndarray) -> float:
    """Length of the union of the first intervals minus the union of the cover intervals."""
    s, e = merge(starts, ends)
    cs, ce = merge(cover_starts, cover_ends)
    total = float(np.sum(e - s))
    if len(cs) == 0 or len(s) == 0:
        return total
    overlap = 0.0
    j = 0
    cover_s, cover_e = cs.tolist(), ce.tolist()  # Python floats: the loop reads them one by one
    for a, b in zip(s.tolist(), e.tolist()):
        while j < len(cover_s) and cover_e[j] <= a:
            j += 1
        k = j
        while k < len(cover_s) and cover_s[k] < b:
            overlap += min(b, cover_e[k]) - max(a, cover_s[k])
            k += 1
    return total - overlap
