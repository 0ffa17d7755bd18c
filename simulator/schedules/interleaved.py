"""Interleaved 1F1B (Narayanan et al., SC21; Megatron's virtual pipeline) and its zero-bubble form (Qi et al.,
ICLR 2024, ZB1P): v model chunks per rank, as torch.distributed.pipelining runs them.

Chunk c on rank r is virtual stage c * p + r. Micro-batches advance in rounds of g = m / max(1, m // p) (PyTorch's
microbatches_per_round; g = p, Megatron's groups of p, where m is a multiple of p): the k-th forward slot of a
rank runs chunk (k mod g v) // g on micro-batch (k // g v) g + k mod g; backward slots walk the chunks in
reverse. Rank r warms up with 2(p - r - 1) + (v - 1) g forwards, then alternates one forward and one backward,
then drains the backwards. The bubble shrinks v-fold to (p - 1)(F + B) / v, at the price of more
point-to-point traffic and activations. With v = 1 this is PyTorch's ScheduleInterleaved1F1B on one stage per
rank, which warms up deeper than plain 1F1B (2(p - r - 1) forwards instead of p - r - 1).

The zero-bubble form warms up with (p - r - 1) + (v - 1) g forwards, runs every backward as the input grad B
alone, and rank r runs the weight grad W of its j-th backward right after its (j + r)-th backward (the rest at
the end), so weight grads fill the slots where the plain form waits on its neighbours.
"""

from __future__ import annotations

from simulator.errors import ScenarioError
from simulator.schedules.base import MICROBATCHES_FIELD, Action, ActionKind, RankActions, check_shape


def _slot_action(kind: ActionKind, slot: int, rounds_of: int, v: int) -> Action:
    """The action in a rank's ``slot``-th forward (or backward) position, micro-batches in rounds of
    ``rounds_of``."""
    within_round = slot % (rounds_of * v)
    chunk = within_round // rounds_of
    if kind != "F":
        chunk = v - 1 - chunk
    microbatch = (slot // (rounds_of * v)) * rounds_of + slot % rounds_of
    return Action(kind, microbatch, chunk)


def round_size(p: int, m: int) -> int:
    """Micro-batches per round: m over PyTorch's number_of_rounds, max(1, m // p); p where m is a multiple of p."""
    return m // max(1, m // p)


def interleaved_warmup(p: int, m: int, v: int, rank: int, hops: int = 2) -> int:
    """Forward slots rank ``rank`` runs before its first backward: (v - 1) rounds plus ``hops`` per rank away
    from the last (Megatron's num_warmup_microbatches; PyTorch's _get_warmup_ops); Megatron runs every forward
    first when m = p and v > 1."""
    total = m * v
    if m == p and v > 1 and hops == 2:
        return total
    return min(hops * (p - rank - 1) + (v - 1) * round_size(p, m), total)


def _rank_order(p: int, m: int, v: int, rank: int, zero_bubble: bool) -> list[Action]:
    total, rounds_of = m * v, round_size(p, m)
    warmup = interleaved_warmup(p, m, v, rank, hops=1 if zero_bubble else 2)
    backward: ActionKind = "B" if zero_bubble else "BW"
    actions = [_slot_action("F", k, rounds_of, v) for k in range(warmup)]
    for k in range(total):
        if warmup + k < total:
            actions.append(_slot_action("F", warmup + k, rounds_of, v))
        actions.append(_slot_action(backward, k, rounds_of, v))
        if zero_bubble and k >= rank:
            actions.append(_slot_action("W", k - rank, rounds_of, v))
    if zero_bubble:
        actions.extend(_slot_action("W", k, rounds_of, v) for k in range(max(total - rank, 0), total))
    return actions


def _fits_rounds(p: int, m: int) -> bool:
    """Whether m splits into max(1, m // p) rounds of equal size (PyTorch's rule)."""
    return m % max(1, m // p) == 0


def _nearest_accepted(p: int, m: int) -> tuple[int, int]:
    """The micro-batch counts nearest m, below and above, that PyTorch's rounds rule accepts at p (1 and every
    multiple of p always fit)."""
    below = next(count for count in range(m - 1, 0, -1) if _fits_rounds(p, count))
    above = next(count for count in range(m + 1, m + p + 1) if _fits_rounds(p, count))
    return below, above


class RoundsError(ScenarioError):
    """An interleaved schedule's refusal of a micro-batch count PyTorch's rounds rule does not accept, with the
    accepted counts nearest it (``accepted``) and the stage count (``p``), so that a scenario that set the
    global batch is told the global batches those counts give, not the counts. A copy `InputError.rebuilt`
    makes has neither (empty ``accepted``)."""

    accepted: tuple[int, ...] = ()
    p: int = 0


def _check_rounds(p: int, m: int, v: int) -> None:
    """PyTorch's rule: m a multiple of its number of rounds, max(1, m // p) (Megatron-LM's stricter one asks for
    m a multiple of p)."""
    check_shape(p, m, v)
    rounds = max(1, m // p)
    if not _fits_rounds(p, m):
        below, above = _nearest_accepted(p, m)
        error = RoundsError(f"interleaved schedules run micro-batches in rounds of equal size, max(1, m // p) = "
                            f"{rounds} rounds at p = {p}, m = {m} (PyTorch's rule; Megatron-LM's asks for a "
                            f"multiple of p)", field=MICROBATCHES_FIELD,
                            allowed=f"{below} or {above} (m a multiple of max(1, m // p) rounds, PyTorch's rule); "
                                    f"a multiple of p = {p} for Megatron-LM's order")
        error.accepted, error.p = (below, above), p
        raise error


def interleaved(p: int, m: int, v: int = 2) -> RankActions:
    """Interleaved 1F1B with whole backwards (BW); needs m a multiple of max(1, m // p)."""
    _check_rounds(p, m, v)
    return [_rank_order(p, m, v, rank, zero_bubble=False) for rank in range(p)]


def interleaved_zero_bubble(p: int, m: int, v: int = 2) -> RankActions:
    """Interleaved zero bubble (ZB1P) with split backwards (B then W); needs m a multiple of max(1, m // p)."""
    _check_rounds(p, m, v)
    return [_rank_order(p, m, v, rank, zero_bubble=True) for rank in range(p)]
