"""Step metrics from the event log: step time, throughput, MFU/HFU, pipeline bubble, communication ratio and
exposed communication per parallelism kind. Pure functions of the timeline DataFrame."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import numpy as np
import pandas as pd

from simulator.metrics.intervals import covered, uncovered

PIPELINE_CATEGORIES = ("forward", "backward", "weight_grad", "recompute")
STAGE_WORK_CATEGORIES = (*PIPELINE_CATEGORIES, "tp", "cp", "ep")
"""What keeps a stage busy inside an action: its kernels and the blocking TP/CP/EP collectives between them."""
COMM_KINDS = ("tp", "cp", "pp", "dp", "ep")


def _rank_arrays(frame: pd.DataFrame) -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per rank, per category, the (starts, ends) of its intervals."""
    result: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    rows = frame.loc[frame["kind"] != "flow", ["rank", "category", "start_s", "end_s"]]
    for key, group in rows.groupby(["rank", "category"], sort=True):
        rank, category = cast(tuple[int, str], key)
        result.setdefault(int(rank), {})[category] = (group["start_s"].to_numpy(), group["end_s"].to_numpy())
    return result


def _cat(arrays: dict[str, tuple[np.ndarray, np.ndarray]], categories) -> tuple[np.ndarray, np.ndarray]:
    parts = [arrays[c] for c in categories if c in arrays]
    if not parts:
        return np.empty(0), np.empty(0)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def bubble_fraction(frame: pd.DataFrame) -> float:
    """Mean over ranks of the compute stream's idle share of the pipeline window.

    The window runs from 0 to the end of the last forward/backward op of any rank, so pipeline fill, drain
    and waits all count, and the optimizer and the data-parallel tail do not: with uniform stages this is
    (p-1)/(m+p-1) for 1F1B. Blocking TP/CP collectives count as busy: they are part of a stage's work.
    """
    pipeline = frame.loc[frame["category"].isin(PIPELINE_CATEGORIES), "end_s"]
    if pipeline.empty:
        return 0.0
    window = float(pipeline.max())
    work = frame.loc[frame["category"].isin(STAGE_WORK_CATEGORIES) & (frame["stream"] == "compute"),
                     ["rank", "start_s", "end_s"]]
    busy = work.assign(d=work["end_s"].clip(upper=window) - work["start_s"]).groupby("rank")["d"].sum()
    return float(np.mean(np.clip(1.0 - busy.to_numpy() / window, 0.0, None))) if window > 0 else 0.0


def pipeline_window_s(frame: pd.DataFrame) -> float:
    """End of the last forward/backward/recompute op of any rank: the window `bubble_fraction` is a share of."""
    ends = frame.loc[frame["category"].isin(PIPELINE_CATEGORIES), "end_s"]
    return float(ends.max()) if len(ends) else 0.0


def optimizer_s(frame: pd.DataFrame) -> float:
    """Mean over the ranks with ops of their optimizer-step time."""
    ranks = frame.loc[frame["kind"] != "flow", "rank"].nunique()
    steps = frame.loc[frame["category"] == "optimizer", ["start_s", "end_s"]]
    return float((steps["end_s"] - steps["start_s"]).sum()) / ranks if ranks else 0.0


def communication_metrics(frame: pd.DataFrame, step_time_s: float) -> dict:
    """comm_ratio (mean over ranks of time with any communication in flight / step time) and exposed
    communication per kind (mean over ranks of communication time not overlapped by compute), seconds."""
    arrays = _rank_arrays(frame)
    compute_categories = (*PIPELINE_CATEGORIES, "optimizer", "compute")
    ratios: list[float] = []
    exposed: dict[str, list[float]] = {kind: [] for kind in COMM_KINDS}
    totals: dict[str, list[float]] = {kind: [] for kind in COMM_KINDS}
    for per_category in arrays.values():
        cs, ce = _cat(per_category, compute_categories)
        all_s, all_e = _cat(per_category, COMM_KINDS)
        ratios.append(covered(all_s, all_e) / step_time_s if step_time_s > 0 else 0.0)
        for kind in COMM_KINDS:
            ks, ke = _cat(per_category, (kind,))
            totals[kind].append(covered(ks, ke))
            exposed[kind].append(uncovered(ks, ke, cs, ce))
    mean = lambda values: float(np.mean(values)) if values else 0.0  # noqa: E731
    return {
        "comm_ratio": mean(ratios),
        "exposed_comm_s": {kind: mean(exposed[kind]) for kind in COMM_KINDS},
        "comm_s": {kind: mean(totals[kind]) for kind in COMM_KINDS},
    }


def traffic_bytes(frame: pd.DataFrame, excess: Mapping[str, float] | None = None) -> dict:
    """Bytes a GPU sends per step for each kind of communication, mean over the simulated ranks: flows sent by
    a rank that has ops (folded peers and mirrors are the same traffic again), matched to their collective's
    category, plus a folded run's ``excess`` per category (what its groups' members send on average beyond the
    simulated ranks' own share, engine/plans.py `send_excess`)."""
    collectives = frame.loc[frame["kind"] == "collective", ["key", "category"]]
    categories = dict(zip(collectives["key"].tolist(), collectives["category"].tolist()))
    ranks = frame.loc[frame["kind"] != "flow", "rank"].unique()
    if len(ranks) == 0:
        return {kind: 0.0 for kind in COMM_KINDS}
    flows = frame.loc[(frame["kind"] == "flow") & frame["src"].isin(ranks), ["name", "bytes"]]
    sums: dict[str, float] = {}
    if not flows.empty:
        codes, names = pd.factorize(flows["name"])
        category = np.array([categories.get(name, "") for name in names.tolist()], dtype=object)[codes]
        totals = flows["bytes"].groupby(category).sum()
        sums = {str(kind): float(total) for kind, total in totals.items()}
    for kind, extra in (excess or {}).items():
        if extra:
            sums[kind] = sums.get(kind, 0.0) + extra
    return {kind: float(sums.get(kind, 0.0)) / len(ranks) for kind in COMM_KINDS}
