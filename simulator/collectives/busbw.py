"""nccl-tests bandwidth figures: algorithm bandwidth (bytes / time) and bus bandwidth (algbw x a factor
that makes the number comparable to a link's speed whatever the group size)."""

from __future__ import annotations

from simulator.errors import ScenarioError

BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
"""op -> factor for n ranks, as nccl-tests' doc/PERFORMANCE.md defines them."""


def bus_bandwidth_factor(op: str, ranks: int) -> float:
    """The nccl-tests busbw/algbw factor of ``op`` over ``ranks`` ranks."""
    if op not in BUS_FACTORS:
        raise ScenarioError(f"unknown collective {op!r}", field="op", allowed=", ".join(BUS_FACTORS))
    return BUS_FACTORS[op](ranks)


def algorithm_bandwidth(nbytes: float, time_s: float) -> float:
    """algbw in bytes/s: the per-rank buffer size over the collective's time."""
    return nbytes / time_s


def bus_bandwidth(op: str, ranks: int, nbytes: float, time_s: float) -> float:
    """busbw in bytes/s: algbw times the op's factor."""
    return algorithm_bandwidth(nbytes, time_s) * bus_bandwidth_factor(op, ranks)
