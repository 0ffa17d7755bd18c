"""Point-to-point sends in the order they are issued, each on its channel after the one before.

PyTorch's ProcessGroupNCCL issues a lone isend/irecv on the communicator and NCCL stream of the unordered rank
pair within its process group (`getKeySendRecv`), and a batch (`batch_isend_irecv`: Megatron-LM's
`_batched_p2p_ops`, torch pipelining's `_batch_p2p`) on the process group's communicator and stream of the
device; kernels on one stream run in order. So a rank's sends to one peer over one process group leave one
after another instead of sharing the link at once (a burst of them, the embedding-only first pipeline chunk's
forwards, would otherwise all arrive late); a receive is its send's other end, so receives from one peer keep
that order too. Sends over another process group run on another communicator and stream, unordered with these.

Both keys serialize more than this, which is left out: a pair's transfers the other way share the stream, and
a batch's stream also carries the rank's transfers with its other neighbour; but the ops of one batch (in
1F1B's steady state Megatron sends an activation to the next stage and receives a gradient from it in one) run
as one NCCL group, at once, so those orders depend on how the job batches its transfers, which neither the
modelled program nor a trace's separate send and receive ops tell. Every producer of point-to-point sends that
no recorded stream orders (parallel/program.py's pipeline hand-offs, workload/traces/program.py's Chakra sends)
orders them here; a Kineto trace's sends keep the streams they ran on. docs/traces.md ("What the order leaves
out") says what the left-out orders would change.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class SendOrder:
    """The last send issued on each channel (a rank, its peer and, where a rank may reach the peer over several,
    the process group), which the next send on the channel waits for."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[Hashable, int] = {}

    def issue(self, channel: Hashable, op_id: int, deps: Sequence[int]) -> tuple[int, ...]:
        """The dependencies of send ``op_id``, issued next on ``channel``: ``deps`` and the channel's previous
        send, if any; ``op_id`` is then the send the channel's next one waits for."""
        previous = self._last.get(channel)
        self._last[channel] = op_id
        return tuple(deps) if previous is None else (*deps, previous)
