"""Looped BFS (Lamy-Poirier, "Breadth-First Pipeline Parallelism", 2022): v chunks per rank in the loop
placement (chunk c of rank r is virtual stage c p + r), each chunk running all m forwards before the next.

Rank r runs F0..F(m-1) of chunk 0, then of chunk 1, ..., then the whole backwards chunk by chunk from the last,
micro-batches in reverse (PyTorch's ScheduleLoopedBFS). Like GPipe it holds all m v chunk activations; the
bubble is (p - 1)(F + B) / v, and each chunk's gradients are complete early, which suits sharded data parallelism.
"""

from __future__ import annotations

from simulator.schedules.base import Action, RankActions, check_shape


def looped_bfs(p: int, m: int, v: int = 1) -> RankActions:
    """The breadth-first order: every forward of chunk 0, then of chunk 1, ...; backwards in reverse."""
    check_shape(p, m, v)
    order = [Action("F", mb, c) for c in range(v) for mb in range(m)]
    order += [Action("BW", mb, c) for c in reversed(range(v)) for mb in reversed(range(m))]
    return [list(order) for _ in range(p)]
