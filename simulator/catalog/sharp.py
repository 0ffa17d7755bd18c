"""Constants of in-network reduction over SHARP InfiniBand switches, each with its source.

NCCL reaches SHARP through its CollNet interface (the NCCL-RDMA-SHARP plugin, `NCCL_COLLNET_ENABLE=1`); the
latencies are the ones NCCL's tuner charges its CollNet and NVLS algorithms (src/graph/tuning.cc,
`hwLatencies`, Simple protocol, NCCL master of 2026-06-11), so a simulated collective costs what NCCL expects.
"""

from __future__ import annotations

COLLNET_DIRECT_NET_LATENCY = 31e-6
"""hwLatencies[NET][CollNetDirect][Simple]: the in-network all-reduce through the switch tree, up and down."""
TREE_NET_LATENCY = 14e-6
"""hwLatencies[NET][Tree][Simple]: tuning.cc charges it instead of the algorithm's own network latency when the
communicator has one GPU per host ("With ppn=1 latencies are fully exposed, use the Tree network latency")."""
COLLNET_DIRECT_INTRA_LATENCY = 3.7e-6
"""hwLatencies[NVLINK][CollNetDirect][Simple]: each of the scatter to the heads and the broadcast from them."""
COLLNET_ARITY_LATENCY = 0.4e-6
"""tuning.cc: "Add 0.4 us arity serialization latency" per further GPU of the host, on each way."""
NVLS_SHARP_NET_LATENCY = 18e-6
"""hwLatencies[NET][NVLS][Simple]: the SHARP part of NCCL's multi-node NVLS (which needs CollNet)."""


def collnet_direct_latency(per_host: int) -> float:
    """NCCL's CollNetDirect latency with ``per_host`` GPUs of the group on each host:
    2 (min(1, g-1) x 3.7 us + (g-1) x 0.4 us) + 31 us, or the Tree network latency (14 us) alone for g = 1."""
    if per_host == 1:
        return TREE_NET_LATENCY
    return 2 * (min(1, per_host - 1) * COLLNET_DIRECT_INTRA_LATENCY
                + (per_host - 1) * COLLNET_ARITY_LATENCY) + COLLNET_DIRECT_NET_LATENCY
