"""The columnar event log: one row per executed op or network flow, kept as column lists while the clock runs
and turned into a DataFrame once at the end."""

from __future__ import annotations

import pandas as pd

COLUMNS = ("kind", "rank", "stream", "name", "category", "microbatch", "start_s", "end_s", "bytes", "flops",
           "src", "dst", "key")


class EventLog:
    """Append-only columns. ``kind`` is one of compute, collective, flow; ``rank`` is a global GPU index
    (-1 for rows that belong to no single rank); ``src``/``dst`` are set for flows; ``microbatch`` is the
    pipeline micro-batch an op works on (-1 for none)."""

    def __init__(self) -> None:
        self.columns: dict[str, list] = {name: [] for name in COLUMNS}

    def record(self, kind: str, rank: int, stream: str, name: str, start_s: float, end_s: float, *,
               category: str = "", nbytes: float = 0.0, flops: float = 0.0, src: int = -1, dst: int = -1,
               key: str = "", microbatch: int = -1) -> None:
        c = self.columns
        c["kind"].append(kind)
        c["rank"].append(rank)
        c["stream"].append(stream)
        c["name"].append(name)
        c["category"].append(category)
        c["microbatch"].append(microbatch)
        c["start_s"].append(start_s)
        c["end_s"].append(end_s)
        c["bytes"].append(nbytes)
        c["flops"].append(flops)
        c["src"].append(src)
        c["dst"].append(dst)
        c["key"].append(key)

    def record_flows(self, key: str, src: list[int], dst: list[int], start_s: list[float], end_s: list[float],
                     nbytes: list[float]) -> None:
        """Append many flow rows of one collective at once (the replay of a private collective)."""
        count = len(src)
        c = self.columns
        c["kind"].extend(["flow"] * count)
        c["rank"].extend(src)
        c["stream"].extend(["net"] * count)
        c["name"].extend([key] * count)
        c["category"].extend([""] * count)
        c["microbatch"].extend([-1] * count)
        c["start_s"].extend(start_s)
        c["end_s"].extend(end_s)
        c["bytes"].extend(nbytes)
        c["flops"].extend([0.0] * count)
        c["src"].extend(src)
        c["dst"].extend(dst)
        c["key"].extend([key] * count)

    def __len__(self) -> int:
        return len(self.columns["kind"])

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.columns)
        return frame.astype({"rank": "int64", "src": "int64", "dst": "int64", "microbatch": "int64",
                             "start_s": "float64", "end_s": "float64", "bytes": "float64", "flops": "float64"})
