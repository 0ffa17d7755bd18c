"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with the weight-grad pass split out.

The backward splits into B (input grad, on the critical path between stages) and W (weight grad, local only).
Starting from the 1F1B order of rank r > 0 (rank 0 runs 1F1B's), as the paper's authors' Megatron-LM code
(sail-sg/zero-bubble-pipeline-parallelism, WeightGradStore) runs it:
- head: the first r backwards run as B alone; their W's are deferred (a FIFO), so gradients reach upstream ranks
  sooner and rank r keeps pace with its neighbours in the steady state;
- tail: the backwards from the steady state's last one on (the cool-down, where 1F1B waits on downstream ranks)
  run as B alone too, each from the r-th backward on followed by the oldest deferred W, which fills the wait;
  with m >= p that is the last p - r backwards, each followed by a W; with m < p every backward of rank r is a B;
- remaining deferred W's run at the end; every other backward is whole (BW), and a B directly followed by its own
  W is written as one BW.
The bubble drops from (p - 1)(F + B + W) to (p - 1)(F + B - W); activations held stay within p (rank 0's 1F1B
peak), since rank r defers at most r weight grads on top of its p - r in-flight micro-batches.
"""

from __future__ import annotations

from collections import deque

from simulator.schedules.base import Action, RankActions, check_shape, require_single_chunk
from simulator.schedules.one_f_one_b import one_f_one_b_order


def _zb_h1_rank(p: int, m: int, rank: int) -> list[Action]:
    last_steady = m - min(p - rank - 1, m) - 1  # the steady state's last backward (-1 where there is none)
    deferred: deque[int] = deque()
    actions: list[Action] = []
    for kind, mb in one_f_one_b_order(p, m, rank):
        if kind == "F":
            actions.append(Action("F", mb))
        elif rank == 0 or rank <= mb < last_steady:
            actions.append(Action("BW", mb))
        else:
            actions.append(Action("B", mb))
            deferred.append(mb)
            if mb >= max(last_steady, rank):
                actions.append(Action("W", deferred.popleft()))
    actions.extend(Action("W", mb) for mb in deferred)
    return _merge_adjacent_backwards(actions)


def _merge_adjacent_backwards(actions: list[Action]) -> list[Action]:
    """Write each B immediately followed by its own W as one whole backward BW."""
    merged: list[Action] = []
    for action in actions:
        previous = merged[-1] if merged else None
        if (action.kind == "W" and previous is not None and previous.kind == "B"
                and previous.microbatch == action.microbatch and previous.chunk == action.chunk):
            merged[-1] = Action("BW", action.microbatch, action.chunk)
        else:
            merged.append(action)
    return merged


def zb_h1(p: int, m: int, v: int = 1) -> RankActions:
    """The ZB-H1 order for p ranks and m micro-batches (one chunk per rank)."""
    check_shape(p, m, v)
    require_single_chunk("zb-h1", v)
    return [_zb_h1_rank(p, m, rank) for rank in range(p)]
