"""Direct (pairwise) algorithms: every rank talks to every other rank without relaying through a third.

All-to-all runs as NCCL runs it, grouped sends and receives to every peer at once (nccl-tests alltoall.cu: one
ncclSend and one ncclRecv per peer inside ncclGroupStart/End; NCCL's enqueue.cc scheduleP2pTasksToPlan puts
every peer's round in one kernel, on channels of their own, up to 8 peers at once per channel, with no barrier
between peers): one phase of p(p-1) transfers of nbytes/p each (an uneven all-to-all, ``pair_bytes``, of what
each pair exchanges; a pair with nothing to send posts none), each paying its own path latency once after the
kernel's base latency (`protocols.GROUPED_P2P_BASE_LATENCY_US`, NCCL's Simple kernel start and setup), which
share the NICs and NVLink as the network model shares any flows: L + a + (p-1)/p n b on one switch. All-gather and
reduce-scatter run as p-1 phases of shifted pairs (in phase k, rank i sends to rank i+k), each moving nbytes/p:
(p-1) a + (p-1)/p n b. Broadcast and reduce are a star around the root.

An all-to-all's transfer between hosts whose ends sit on different rails goes through PXN, as NCCL (2.12 and
later, NCCL_PXN_DISABLE=0) sends a point-to-point message from the NIC the destination uses: over NVLink to
the source host's GPU on the destination's rail, then from that GPU's NIC along the rail (`Topology.pxn_relay`),
so a rail-optimized leaf group's all-to-all never crosses its spines. NCCL picks the relay among the
communicator's own GPUs, so only a relay inside the group forwards: a pipeline send, a group of two, never has
one.
"""

from __future__ import annotations

from simulator.collectives import protocols
from simulator.collectives.names import ALGORITHM_OPS
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.errors import ScenarioError
from simulator.topology.graph import PXN_CHANNEL, Topology

OPS = ALGORITHM_OPS["direct"]


def shifted_pairs(ranks: tuple[int, ...], nbytes: float) -> list[Phase]:
    """p-1 phases; in phase k every rank i sends ``nbytes`` to rank (i + k) mod p."""
    size = len(ranks)
    return [Phase(tuple(Transfer(ranks[i], ranks[(i + shift) % size], nbytes) for i in range(size)))
            for shift in range(1, size)]


def all_pairs(ranks: tuple[int, ...], pair_bytes: tuple[tuple[float, ...], ...],
              topology: Topology | None = None) -> list[Phase]:
    """One phase: every rank i sends ``pair_bytes[i][j]`` to every other rank j at once, listed by shift (the
    transfers to rank i+1 first, then to rank i+2...), as NCCL's all-to-all posts them, each through its PXN
    relay (`PXN_CHANNEL`) where ``topology`` (None: no PXN) gives one that is in the group. A pair with nothing to
    send posts no transfer (a CP ring step sends only to the next rank; docs/collectives.md, direct), unless no
    pair has anything: then every pair posts its empty handshake, as NCCL 2.14 and later run count-0 sends, and
    the all-to-all lasts a path latency rather than nothing. The phase starts after the grouped kernel's base
    latency (`protocols.GROUPED_P2P_BASE_LATENCY_US`)."""
    size = len(ranks)
    if len(pair_bytes) != size or any(len(row) != size for row in pair_bytes):
        raise ScenarioError(f"an all-to-all over {size} ranks needs a {size} x {size} byte matrix",
                            field="pair_bytes", allowed=f"{size} rows of {size} sizes")
    pairs = [(i, (i + shift) % size) for shift in range(1, size) for i in range(size)]
    carrying = [(i, j) for i, j in pairs if pair_bytes[i][j] > 0] or pairs
    members = set(ranks)
    relays = ({(i, j): topology.pxn_relay(ranks[i], ranks[j]) for i, j in carrying} if topology is not None
              else {})
    transfers = tuple(Transfer(ranks[i], ranks[j], pair_bytes[i][j],
                               PXN_CHANNEL if relays.get((i, j)) in members else 0) for i, j in carrying)
    return [Phase(transfers, launch=protocols.GROUPED_P2P_BASE_LATENCY_US * 1e-6)] if transfers else []


def star(ranks: tuple[int, ...], root: int, nbytes: float, *, toward_root: bool) -> list[Phase]:
    """One phase: the root sends ``nbytes`` to every other rank, or every other rank sends to the root."""
    center = ranks[root]
    pairs = [(r, center) if toward_root else (center, r) for r in ranks if r != center]
    return [Phase(tuple(Transfer(a, b, nbytes) for a, b in pairs))] if pairs else []


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """All-to-all at once, pairwise all-gather / reduce-scatter (all-reduce = both), star broadcast / reduce,
    and send/recv as one transfer."""
    ranks, n = request.ranks, request.nbytes
    if request.op == "send_recv":
        return [Phase((Transfer(ranks[0], ranks[1], n),))]
    if request.op == "all_to_all":
        size = len(ranks)
        return all_pairs(ranks, request.pair_bytes or ((n / size,) * size,) * size,
                         topology if request.pxn else None)
    if request.op in ("all_gather", "reduce_scatter"):
        return shifted_pairs(ranks, n / len(ranks))
    if request.op == "all_reduce":
        return shifted_pairs(ranks, n / len(ranks)) * 2
    if request.op in ("broadcast", "reduce"):
        return star(ranks, request.root, n, toward_root=request.op == "reduce")
    raise ScenarioError(f"algorithm 'direct' does not implement {request.op}", field="collectives.algorithm")
