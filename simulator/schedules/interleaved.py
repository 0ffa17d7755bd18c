"""Interleaved 1F1B (Narayanan et al., SC21; Megatron's virtual pipeline): v model chunks per rank.

Chunk c on rank r is virtual stage c * p + r. Micro-batches advance in groups of p: the k-th forward slot of a
rank runs chunk (k mod p v) // p on micro-batch (k // p v) p + k mod p; backward slots walk the chunks in
reverse. Rank r warms up with 2(p - r - 1) + (v - 1) p forwards (all of them when m = p). The bubble shrinks
v-fold to (p - 1)(F + B) / v, at the price of more point-to-point traffic and activations.
"""

from __future__ import annotations

from simulator.errors import ScenarioError
from simulator.schedules.base import (
    MICROBATCHES_FIELD,
    VIRTUAL_STAGES_FIELD,
    Action,
    ActionKind,
    Schedule,
    check_shape,
)


def _slot_action(kind: ActionKind, slot: int, p: int, v: int) -> Action:
    """The action in a rank's ``slot``-th forward (or backward) position, in Megatron's group-of-p order."""
    within_group = slot % (p * v)
    chunk = within_group // p
    if kind != "F":
        chunk = v - 1 - chunk
    microbatch = (slot // (p * v)) * p + slot % p
    return Action(kind, microbatch, chunk)


def interleaved_warmup(p: int, m: int, v: int, rank: int) -> int:
    """Forward slots rank ``rank`` runs before its first backward (Megatron's num_warmup_microbatches)."""
    total = m * v
    if m == p:
        return total
    return min(2 * (p - rank - 1) + (v - 1) * p, total)


def interleaved(p: int, m: int, v: int = 2) -> Schedule:
    """Megatron's interleaved 1F1B order with whole backwards (BW); needs v >= 2 and m a multiple of p."""
    check_shape(p, m, v)
    if v < 2:
        raise ScenarioError(f"interleaved 1F1B needs at least 2 chunks per rank, got {v}",
                            field=VIRTUAL_STAGES_FIELD, allowed="2 or more (use '1f1b' for one chunk)")
    if m % p:
        raise ScenarioError(f"interleaved 1F1B needs micro-batches in whole groups of p = {p}, got {m}",
                            field=MICROBATCHES_FIELD, allowed=f"a multiple of {p}")
    total = m * v
    schedule: Schedule = []
    for rank in range(p):
        warmup = interleaved_warmup(p, m, v, rank)
        actions = [_slot_action("F", k, p, v) for k in range(warmup)]
        for k in range(total - warmup):
            actions.append(_slot_action("F", warmup + k, p, v))
            actions.append(_slot_action("BW", k, p, v))
        actions.extend(_slot_action("BW", k, p, v) for k in range(total - warmup, total))
        schedule.append(actions)
    return schedule
