"""The columnar event log: one row per executed op or network flow, kept in typed arrays while the clock runs
and turned into a DataFrame once at the end.

Numbers go into `array` columns (8 bytes a value, no Python object kept per event); strings are references to
the few distinct names the ops carry. Each flow row also keeps its route (the tuple of directed link ids, shared
with the topology's route cache), in flow order, for the per-link utilisation of the trace.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("kind", "rank", "stream", "name", "category", "microbatch", "chunk", "start_s", "end_s", "bytes",
           "flops", "src", "dst", "key")
INT_COLUMNS = ("rank", "microbatch", "chunk", "src", "dst")
FLOAT_COLUMNS = ("start_s", "end_s", "bytes", "flops")
TEXT_COLUMNS = ("kind", "stream", "name", "category", "key")


class EventLog:
    """Append-only columns. ``kind`` is one of compute, collective, flow; ``rank`` is a global GPU index
    (-1 for rows that belong to no single rank); ``src``/``dst`` are set for flows; ``microbatch`` is the
    pipeline micro-batch an op works on and ``chunk`` its virtual stage (-1 for none). ``flow_routes[i]`` is the
    route of the i-th flow row."""

    def __init__(self) -> None:
        self.columns: dict[str, array | list] = {}
        for name in COLUMNS:
            self.columns[name] = array("q") if name in INT_COLUMNS else array("d") if name in FLOAT_COLUMNS else []
        self.flow_routes: list[tuple[int, ...]] = []

    def record(self, kind: str, rank: int, stream: str, name: str, start_s: float, end_s: float, *,
               category: str = "", nbytes: float = 0.0, flops: float = 0.0, src: int = -1, dst: int = -1,
               key: str = "", microbatch: int = -1, chunk: int = -1) -> None:
        """One op row (compute or collective)."""
        c = self.columns
        c["kind"].append(kind)
        c["rank"].append(rank)
        c["stream"].append(stream)
        c["name"].append(name)
        c["category"].append(category)
        c["microbatch"].append(microbatch)
        c["chunk"].append(chunk)
        c["start_s"].append(start_s)
        c["end_s"].append(end_s)
        c["bytes"].append(nbytes)
        c["flops"].append(flops)
        c["src"].append(src)
        c["dst"].append(dst)
        c["key"].append(key)

    def flow(self, key: str, src: int, dst: int, start_s: float, end_s: float, nbytes: float,
             route: tuple[int, ...]) -> None:
        """One flow row of collective ``key``: ``nbytes`` from GPU ``src`` to ``dst`` over ``route``."""
        c = self.columns
        c["kind"].append("flow")
        c["rank"].append(src)
        c["stream"].append("net")
        c["name"].append(key)
        c["category"].append("")
        c["microbatch"].append(-1)
        c["chunk"].append(-1)
        c["start_s"].append(start_s)
        c["end_s"].append(end_s)
        c["bytes"].append(nbytes)
        c["flops"].append(0.0)
        c["src"].append(src)
        c["dst"].append(dst)
        c["key"].append(key)
        self.flow_routes.append(route)

    def record_flows(self, key: str, src: list[int], dst: list[int], start_s: list[float], end_s: list[float],
                     nbytes: list[float], routes: list[tuple[int, ...]]) -> None:
        """Append many flow rows of one collective at once (the replay of a private collective)."""
        count = len(src)
        c = self.columns
        c["kind"].extend(["flow"] * count)
        c["rank"].extend(src)
        c["stream"].extend(["net"] * count)
        c["name"].extend([key] * count)
        c["category"].extend([""] * count)
        c["microbatch"].extend(array("q", [-1]) * count)
        c["chunk"].extend(array("q", [-1]) * count)
        c["start_s"].extend(start_s)
        c["end_s"].extend(end_s)
        c["bytes"].extend(nbytes)
        c["flops"].extend(array("d", [0.0]) * count)
        c["src"].extend(src)
        c["dst"].extend(dst)
        c["key"].extend([key] * count)
        self.flow_routes.extend(routes)

    def __len__(self) -> int:
        return len(self.columns["kind"])

    def to_frame(self) -> pd.DataFrame:
        """The log as a DataFrame: int64 and float64 columns copied from the arrays, text columns as pandas
        infers them from the lists (as the row-list log did)."""
        import numpy as np
        import pandas as pd

        data: dict[str, object] = {}
        for name, column in self.columns.items():
            if isinstance(column, array):
                data[name] = np.frombuffer(column, dtype=np.int64 if column.typecode == "q" else np.float64).copy()
            else:
                data[name] = column
        return pd.DataFrame(data, columns=list(COLUMNS))
