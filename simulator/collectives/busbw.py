"""nccl-tests bandwidth figures: algorithm bandwidth (bytes / time) and bus bandwidth (algbw x a factor
that makes the number comparable to a link's speed whatever the group size)."""

from __future__ import annotations

from collections.abc import Callable

from simulator.collectives.names import Primitive

BUS_FACTORS: dict[Primitive, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
"""op -> factor for n ranks, as nccl-tests' doc/PERFORMANCE.md defines them (every primitive has one)."""


def bus_bandwidth_factor(op: Primitive, ranks: int) -> float:
    """The nccl-tests busbw/algbw factor of ``op`` over ``ranks`` ranks."""
    return BUS_FACTORS[op](ranks)


def algorithm_bandwidth(nbytes: float, time_s: float) -> float:
    """algbw in bytes/s: the per-rank buffer size over the collective's time."""
    return nbytes / time_s


def bus_bandwidth(op: Primitive, ranks: int, nbytes: float, time_s: float) -> float:
    """busbw in bytes/s: algbw times the op's factor."""
    return algorithm_bandwidth(nbytes, time_s) * bus_bandwidth_factor(op, ranks)
