"""GPipe: every rank runs all forwards, then all backwards (Huang et al., 2019).

Backwards run in forward order, as Megatron's no-pipelining-overlap path does; GPipe's paper runs them in reverse.
Both orders give the same bubble, (p - 1)(F + B), but every rank holds all m micro-batches' activations.
"""

from __future__ import annotations

from simulator.schedules.base import Action, RankActions, check_shape, require_single_chunk


def gpipe(p: int, m: int, v: int = 1) -> RankActions:
    """All-forward-all-backward order: F0..F(m-1) then BW0..BW(m-1) on every rank."""
    check_shape(p, m, v)
    require_single_chunk("gpipe", v)
    order = [Action("F", mb) for mb in range(m)] + [Action("BW", mb) for mb in range(m)]
    return [list(order) for _ in range(p)]
