"""The passes a block runs over a micro-batch, defined once.

What a pass computes decides which of a block's figures it takes (forward, recompute, input or weight
gradients), which way data flows through its communication (gradients flow back through the CP ring and the
MoE all-to-alls of a pass that computes input gradients) and which TP collectives bracket it. Passes are made
here and nowhere else, so a misspelt pass cannot reach the program builder.
"""

from __future__ import annotations

from enum import StrEnum


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


_INPUT_GRADS = frozenset({Pass.BACKWARD, Pass.BACKWARD_INPUT})
_WEIGHT_GRADS = frozenset({Pass.BACKWARD, Pass.BACKWARD_WEIGHT})
