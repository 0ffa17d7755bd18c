"""The passes a block runs over a micro-batch, defined once.

What a pass computes decides which of a block's figures it takes (forward, recompute, input or weight
gradients), which way data flows through its communication (gradients flow back through the CP ring and the
MoE all-to-alls of a pass that computes input gradients; a weight-gradient pass sends nothing) and which TP
collectives bracket it. Passes are made here and nowhere else, so a misspelt pass cannot reach the program
builder; the names of a pass's compute ops start with its ``op_prefix``, which the reports read back.
"""

from __future__ import annotations

from enum import StrEnum
from typing import assert_never


class Pass(StrEnum):
    """One pass of a block; the value names it in op names and collective keys."""

    FORWARD = "fwd"
    RECOMPUTE = "rec"
    """The forward redone before the backward (activation recomputation)."""
    BACKWARD = "bwd"
    """Input and weight gradients together."""
    BACKWARD_INPUT = "bwi"
    """Input gradients only (a zero-bubble schedule's B)."""
    BACKWARD_WEIGHT = "bww"
    """Weight gradients only (a zero-bubble schedule's W)."""

    @property
    def input_grads(self) -> bool:
        """The pass computes input gradients: its communication carries gradients back toward the input."""
        return self in _INPUT_GRADS

    @property
    def weight_grads(self) -> bool:
        """The pass computes weight gradients."""
        return self in _WEIGHT_GRADS

    @property
    def sends_activations(self) -> bool:
        """The pass computes activations or input gradients, which the block's TP, CP and EP communication carries
        to other ranks; a weight-gradient pass (W) keeps what it computes on the rank."""
        return self is not Pass.BACKWARD_WEIGHT

    @property
    def op_prefix(self) -> str:
        """What the names of the pass's compute ops start with, before the micro-batch ("Bi3 attention")."""
        return _OP_PREFIXES[self]

    def op_name(self, microbatch: int, block: str) -> str:
        """The name of the pass's compute op for ``block`` in micro-batch ``microbatch``."""
        return f"{self.op_prefix}{microbatch} {block}"


_INPUT_GRADS = frozenset({Pass.BACKWARD, Pass.BACKWARD_INPUT})
_WEIGHT_GRADS = frozenset({Pass.BACKWARD, Pass.BACKWARD_WEIGHT})
_OP_PREFIXES = {Pass.FORWARD: "F", Pass.RECOMPUTE: "R", Pass.BACKWARD: "B", Pass.BACKWARD_INPUT: "Bi",
                Pass.BACKWARD_WEIGHT: "W"}


PassFigures = tuple[float, float, float, float]
"""One figure of a block's work per part of a pass: (forward, input gradients, weight gradients, recompute)."""


def pass_figure(figures: PassFigures, phase: Pass) -> float:
    """Pass ``phase``'s figure of ``figures``: the whole backward's is its input- and weight-gradient parts'."""
    forward, backward_input, backward_weight, recompute = figures
    match phase:
        case Pass.FORWARD:
            return forward
        case Pass.RECOMPUTE:
            return recompute
        case Pass.BACKWARD:
            return backward_input + backward_weight
        case Pass.BACKWARD_INPUT:
            return backward_input
        case Pass.BACKWARD_WEIGHT:
            return backward_weight
    assert_never(phase)
