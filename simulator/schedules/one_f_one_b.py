"""1F1B (PipeDream-Flush, Megatron's default): warm up, then alternate one forward and one backward.

Rank r runs min(p - r - 1, m) warm-up forwards, then pairs (forward, backward), then the remaining backwards.
The bubble is the same as GPipe's, (p - 1)(F + B), but rank r holds at most p - r micro-batches' activations.
"""

from __future__ import annotations

from simulator.schedules.base import Action, RankActions, check_shape, require_single_chunk


def warmup_forwards(p: int, m: int, rank: int) -> int:
    """How many forwards rank ``rank`` runs before its first backward in 1F1B order."""
    return min(p - rank - 1, m)


def one_f_one_b_order(p: int, m: int, rank: int) -> list[tuple[str, int]]:
    """The 1F1B sequence of one rank as ("F" | "BACKWARD", micro-batch) pairs, shared with the ZB-H1 schedule."""
    warmup = warmup_forwards(p, m, rank)
    order: list[tuple[str, int]] = [("F", mb) for mb in range(warmup)]
    for step in range(m - warmup):
        order.append(("F", warmup + step))
        order.append(("BACKWARD", step))
    order.extend(("BACKWARD", mb) for mb in range(m - warmup, m))
    return order


def one_f_one_b(p: int, m: int, v: int = 1) -> RankActions:
    """Megatron's non-interleaved 1F1B order with whole backwards (BW)."""
    check_shape(p, m, v)
    require_single_chunk("1f1b", v)
    return [[Action("F" if kind == "F" else "BW", mb) for kind, mb in one_f_one_b_order(p, m, rank)]
            for rank in range(p)]
