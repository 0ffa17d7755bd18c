"""Transformer Engine's userbuffers collectives: the one-kernel reduce-scatter and all-gather that its TP overlap
launches (Megatron-LM's --tp-comm-overlap; parallel/overlap.py), which are not NCCL's.

Read in Transformer Engine main of 2026-08-22 (transformer_engine/common/comm_gemm_overlap/userbuffers/
userbuffers.cu, comm_gemm_overlap.cpp): a reduce-scatter (`reducescatter2_userbuff_stridedoutput` for each chunk
of `split_overlap_rs`, `reducescatter2_userbuff_inplace` for the bulk overlap) is one kernel in which every GPU
raises a flag in each peer's registered buffer, waits for every peer's flag, then loads its own slice from every
peer's buffer over NVLink and sums it; the all-gather (`allgather2_userbuff_inplace`) moves every slice to every
peer in one pass the same way. So the plan is one phase in which every member sends n/p to every other member at
once: each transfer pays its path's latency once (the flags' round before the loads), (p - 1)/p n crosses each
GPU's NVLink each way, as in NCCL's ring, and none of NCCL's base latency, protocols or window of chunk steps
applies (it runs under Simple's costs, which change nothing in a single phase).

What stands in for a measurement: no kernel-level timing of userbuffers was found, so its latency is the path's
(the bundled topologies' NVLink latency, 3.4 us) and its bandwidth the NVLink's efficiency as NCCL's ring
reaches it (catalog/kernels.yaml `nccl-nvlink`). Not modelled: the multicast variants (`callranks_rsMC`, with
NVLink SHARP buffers), which NeMo's settings do not ask for.
"""

from __future__ import annotations

from simulator.collectives.names import Primitive
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS: tuple[Primitive, ...] = ("reduce_scatter", "all_gather")


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """One phase: every member sends its n/p slice to every other member (``topology`` only routes them)."""
    if request.op not in OPS:
        raise ScenarioError(f"algorithm 'userbuffers' does not implement {request.op}",
                            field="collectives.algorithm", allowed=", ".join(OPS))
    ranks = request.ranks
    share = request.nbytes / len(ranks)
    return [Phase(tuple(Transfer(src, dst, share) for src in ranks for dst in ranks if dst != src))]
