"""The collective table of a communication-only run (summary.json's `collectives`): per workload item its time
from first start to last end, nccl-tests' algorithm and bus bandwidths, and the algorithm and NCCL protocol
that ran it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from simulator.collectives.busbw import bus_bandwidth_factor
from simulator.metrics.events import COLLECTIVE_KIND
from simulator.program.ops import CollectiveOp

if TYPE_CHECKING:
    import pandas as pd


def collective_table(frame: pd.DataFrame, ops: list[CollectiveOp],
                     ran: Callable[[CollectiveOp], tuple[str, str]]) -> list[dict]:
    """Per workload item: time from its first start to its last end, algbw and busbw (nccl-tests factors), and
    the algorithm and protocol that ran it (``ran``: the run's resolved choice for an op)."""
    rows = []
    collectives = frame[frame["kind"] == COLLECTIVE_KIND]
    spans = collectives.groupby("key").agg(start=("start_s", "min"), end=("end_s", "max"))
    span_s = (spans["end"] - spans["start"]).to_dict()
    seen: set[str] = set()
    for op in ops:
        if op.key in seen:
            continue
        seen.add(op.key)
        time_s = float(span_s[op.key])
        algbw = op.nbytes / time_s / 1e9 if time_s > 0 else 0.0  # nccl-tests' 0 for a 0-byte item; no Infinity
        algorithm, protocol = ran(op)
        rows.append({"name": op.key, "op": op.op, "ranks": len(op.group), "bytes": op.nbytes, "time_s": time_s,
                     "algbw_GBps": algbw, "busbw_GBps": algbw * bus_bandwidth_factor(op.op, len(op.group)),
                     "algorithm": algorithm, "protocol": protocol})
    return rows
