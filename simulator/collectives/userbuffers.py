"""Transformer Engine's userbuffers collectives, which its TP overlap launches (Megatron-LM's --tp-comm-overlap;
parallel/overlap.py) instead of NCCL's: the one-kernel reduce-scatter and all-gather (`plan`) and the ring
exchange's point-to-point steps (`ring_exchange`).

Read in Transformer Engine main of 2026-08-22 (transformer_engine/common/comm_gemm_overlap/userbuffers/
userbuffers.cu, comm_gemm_overlap.cpp): a reduce-scatter (`reducescatter2_userbuff_stridedoutput` for each chunk
of `split_overlap_rs`, `reducescatter2_userbuff_inplace` for the bulk overlap) is one kernel in which every GPU
raises a flag in each peer's registered buffer, waits for every peer's flag, then loads its own slice from every
peer's buffer over NVLink and sums it; the all-gather (`allgather2_userbuff_inplace`) moves every slice to every
peer in one pass the same way. So the plan is one phase in which every member sends n/p to every other member at
once: each transfer pays its path's latency once (the flags' round before the loads), (p - 1)/p n crosses each
GPU's NVLink each way, as in NCCL's ring, and none of NCCL's base latency, protocols or window of chunk steps
applies (it runs under Simple's costs, which change nothing in a single phase).

The ring exchange (`CommOverlapP2PBase::split_overlap_ag`) launches no collective kernel at all: each of its
exchanges is a `userbuffers_send` to the next GPU of the ring and a `userbuffers_recv` from the previous one. With
`use_ce` (Transformer Engine's default; NeMo's RingExchangeOverlapCfg does not set it) the send is a copy-engine
`cudaMemcpyAsync` into the peer's registered buffer followed by a one-thread kernel that raises the peer's flag,
and the receive a one-thread kernel that waits for its own flag; the next exchange's send waits for this one's
receive (an event between the send and receive streams). So p - 1 exchanges one after the other, each moving n/p to
the next GPU: the ring's all-gather phase, each step paying the path latency (the flag behind the copy; the
pipelined ring phase charges its hops' mean, which is every hop's inside one NVLink domain, where TP runs) and
none of NCCL's base latency or protocols.

What stands in for a measurement: no kernel-level timing of userbuffers was found, so its latency is the path's
(the bundled topologies' NVLink latency, 3.4 us) and its bandwidth the NVLink's efficiency as NCCL's ring
reaches it (catalog/kernels.yaml `nccl-nvlink`), the copy engine's included. Not modelled: the multicast variants
(`callranks_rsMC`, with NVLink SHARP buffers), which NeMo's settings do not ask for, and the cost of launching
the ring exchange's copies and flag kernels (one each per exchange) beyond the path's latency.
"""

from __future__ import annotations

from simulator.collectives.names import ALGORITHM_OPS
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.collectives.ring import ring_phase
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS = ALGORITHM_OPS["userbuffers"]
RING_EXCHANGE_OPS = ALGORITHM_OPS["ring_exchange"]


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """One phase: every member sends its n/p slice to every other member (``topology`` only routes them)."""
    if request.op not in OPS:
        raise ScenarioError(f"algorithm 'userbuffers' does not implement {request.op}",
                            field="collectives.algorithm")
    ranks = request.ranks
    share = request.nbytes / len(ranks)
    return [Phase(tuple(Transfer(src, dst, share) for src in ranks for dst in ranks if dst != src))]


def ring_exchange(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """The ring exchange's all-gather: p - 1 exchanges in which every member sends n/p to the next in group
    order (Transformer Engine's ``_next_rank``), one ring phase (``topology`` only routes them)."""
    ranks = request.ranks
    return [ring_phase([list(ranks)], request.nbytes / len(ranks), len(ranks) - 1)]
