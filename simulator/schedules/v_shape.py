"""V-shaped schedules: two chunks per rank in the V placement (rank r holds virtual stages r and 2p - 1 - r, so
the first and the last stage share rank 0 and the turn at the middle stays on rank p - 1), with per-rank orders
as torch.distributed.pipelining builds them.

- ZBV (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 6; PyTorch's ScheduleZBVZeroBubble):
  warm-up forwards of chunk 0, then chunk 1's forwards interleaved, then steady (F, B, W) triples of each chunk,
  the cool-down's input grads first and the weight grads last. With F = B = W its bubble is zero apart from
  the fill; per rank it holds at most 2p chunk activations.
- DualPipeV (DeepSeek-V3's DualPipe folded into a V, PyTorch's ScheduleDualPipeV, after deepseek-ai/DualPipe):
  after a zero-bubble warm-up the steady state runs slots that overlap the forward of one micro-batch with the
  whole backward of another (F4+BW1c1); the cool-down splits backwards into B and W again on the second half.
  It needs m >= 2p.
"""

from __future__ import annotations

from collections import deque

from simulator.config.parallelism_options import SCHEDULE_FIELD
from simulator.errors import ScenarioError
from simulator.schedules.base import (
    MICROBATCHES_FIELD,
    VIRTUAL_STAGES_FIELD,
    Action,
    ActionKind,
    RankActions,
    check_shape,
)


def require_two_chunks(name: str, v: int) -> None:
    """V schedules keep exactly two chunks per rank."""
    if v != 2:
        raise ScenarioError(f"schedule '{name}' keeps two chunks per rank (a V), got virtual_stages = {v}",
                            field=VIRTUAL_STAGES_FIELD, allowed="2", reads=(SCHEDULE_FIELD,))


class _RankOrder:
    """One rank's order under construction, with per-chunk counters of forwards, input grads and weight grads
    and the queue of input grads whose weight grad is still owed."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.forwards = [0, 0]
        self.grads = [0, 0]
        self.weights = [0, 0]
        self.owed: deque[tuple[int, int]] = deque()

    def forward(self, chunk: int) -> None:
        self.actions.append(Action("F", self.forwards[chunk], chunk))
        self.forwards[chunk] += 1

    def backward(self, chunk: int, kind: ActionKind, overlap: bool = False) -> None:
        """An input grad B (its W owed) or a whole backward BW of the chunk's next micro-batch."""
        microbatch = self.grads[chunk]
        self.actions.append(Action(kind, microbatch, chunk, overlap=overlap))
        self.grads[chunk] += 1
        if kind == "B":
            self.owed.append((chunk, microbatch))
        else:
            self.weights[chunk] += 1

    def weight(self, chunk: int) -> None:
        """The weight grad of the chunk's oldest input grad without one."""
        self.actions.append(Action("W", self.weights[chunk], chunk))
        self.weights[chunk] += 1

    def owed_weight(self) -> None:
        """The weight grad of the oldest input grad still owed one, if any."""
        if self.owed:
            chunk, microbatch = self.owed.popleft()
            self.actions.append(Action("W", microbatch, chunk))

    def overlapped(self, forward_chunk: int, backward_chunk: int) -> None:
        self.forward(forward_chunk)
        self.backward(backward_chunk, "BW", overlap=True)


def _zbv_rank(p: int, m: int, rank: int) -> list[Action]:
    n = max(2 * p - 1, m)
    order = _RankOrder()
    for _ in range(2 * (p - rank) - 1):
        order.forward(0)
    for _ in range(rank):
        order.forward(1)
        order.forward(0)
    for _ in range(p - rank):
        order.forward(1)
        order.backward(1, "B")
        order.weight(1)
    while order.forwards[1] < order.forwards[0] or order.forwards[0] < n:
        if order.forwards[0] < n:
            order.forward(0)
        order.backward(0, "B")
        order.weight(0)
        order.forward(1)
        order.backward(1, "B")
        order.weight(1)
    for _ in range(rank):
        order.backward(0, "B")
        order.backward(1, "B")
    for _ in range(p - rank):
        order.backward(0, "B")
        order.weight(0)
    for chunk in (1, 0):
        while order.weights[chunk] < order.grads[chunk]:
            order.weight(chunk)
    return [a for a in order.actions if a.microbatch < m]


def zbv(p: int, m: int, v: int = 2) -> RankActions:
    """The ZB-V order (two chunks per rank, V placement); micro-batches beyond m are dropped from the
    order built for max(m, 2p - 1), as PyTorch does."""
    check_shape(p, m, v)
    require_two_chunks("zbv", v)
    return [_zbv_rank(p, m, rank) for rank in range(p)]


def _dualpipe_v_rank(p: int, m: int, rank: int) -> list[Action]:
    order = _RankOrder()
    for _ in range(2 * (p - rank - 1)):
        order.forward(0)
    for _ in range(rank + 1):
        order.forward(0)
        order.forward(1)
    for _ in range(p - rank - 1):
        order.backward(1, "B")
        order.owed_weight()
        order.forward(1)
    for step in range(m - 2 * p + rank + 1):
        if step == 0 and rank == p - 1:
            order.forward(0)
            order.backward(1, "BW")
        else:
            order.overlapped(0, 1)
        order.overlapped(1, 0)
    for _ in range(p - rank - 1):
        order.backward(1, "BW")
        order.overlapped(1, 0)
    split = False
    half = (rank + 1) // 2
    for step in range(rank + 1):
        split = split or (step == half and rank % 2 == 1)
        order.backward(1, "B" if split else "BW")
        split = split or (step == half and rank % 2 == 0)
        order.backward(0, "B" if split else "BW")
    for _ in range(p - rank - 1):
        order.owed_weight()
        order.backward(0, "B" if split else "BW")
    for _ in range(rank + 1):
        order.owed_weight()
    return order.actions


def dualpipe_v(p: int, m: int, v: int = 2) -> RankActions:
    """The DualPipeV order (two chunks per rank, V placement, overlapped F&B slots); needs m >= 2p."""
    check_shape(p, m, v)
    require_two_chunks("dualpipev", v)
    if m < 2 * p:
        raise ScenarioError(f"DualPipeV needs at least as many micro-batches as stages, 2p = {2 * p}, got {m}",
                            field=MICROBATCHES_FIELD, allowed=f">= {2 * p}")
    return [_dualpipe_v_rank(p, m, rank) for rank in range(p)]
