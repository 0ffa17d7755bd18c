"""The job event log: one row per failure, checkpoint (completed or lost), restart, maintenance and
degradation. Single rows are kept as tuples; the checkpoints of many identical cycles as one arithmetic
block (start = a + j p, end = b + j p, step = s + j k), expanded with numpy when the frame is built."""

from __future__ import annotations

import numpy as np
import pandas as pd

EVENT_KINDS = ("failure", "checkpoint", "checkpoint_lost", "restart", "maintenance", "degraded")


class JobEvents:
    """Rows of job_events.parquet, filled by the job process of each replication."""

    def __init__(self) -> None:
        self.replication = 0
        self.rows: list[tuple] = []
        self.blocks: list[tuple] = []

    def add(self, kind: str, start: float, end: float, *, cause: str = "", step: float = 0.0,
            lost_work_s: float = 0.0, hosts: int = 0) -> None:
        self.rows.append((self.replication, kind, cause, start, end, step, lost_work_s, hosts))

    def add_checkpoints(self, start: float, end: float, step: float, period: float, steps: float,
                        count: int) -> None:
        """``count`` completed checkpoints, the j-th from start + j period to end + j period at step
        step + j steps."""
        if count > 0:
            self.blocks.append((self.replication, start, end, step, period, steps, count))

    def frame(self) -> pd.DataFrame:
        """All rows, sorted by replication and start time (stable: logging order breaks ties)."""
        replication, kind, cause, start, end, step, lost, hosts = (list(c) for c in zip(*self.rows)) if self.rows \
            else ([], [], [], [], [], [], [], [])
        if self.blocks:
            rep, a, b, s, p, k, n = (np.asarray(c) for c in zip(*self.blocks))
            counts = n.astype(np.int64)
            j = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            replication += np.repeat(rep, counts).tolist()
            start += (np.repeat(a, counts) + j * np.repeat(p, counts)).tolist()
            end += (np.repeat(b, counts) + j * np.repeat(p, counts)).tolist()
            step += (np.repeat(s, counts) + j * np.repeat(k, counts)).tolist()
            total = int(counts.sum())
            kind += ["checkpoint"] * total
            cause += [""] * total
            lost += [0.0] * total
            hosts += [0] * total
        frame = pd.DataFrame({
            "replication": np.asarray(replication, dtype=np.int32),
            "kind": pd.Categorical(kind, categories=EVENT_KINDS),
            "cause": pd.Series(cause, dtype=object),
            "start_s": np.asarray(start, dtype=float),
            "end_s": np.asarray(end, dtype=float),
            "step": np.asarray(step, dtype=float),
            "lost_work_s": np.asarray(lost, dtype=float),
            "hosts": np.asarray(hosts, dtype=np.int64),
        })
        order = np.lexsort((frame["start_s"].to_numpy(), frame["replication"].to_numpy()))
        return frame.iloc[order].reset_index(drop=True)
