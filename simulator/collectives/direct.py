"""Direct (pairwise) algorithms: every rank talks to every other rank without relaying through a third.

All-to-all, all-gather and reduce-scatter run as p-1 phases of shifted pairs (in phase k, rank i sends to
rank i+k), each moving nbytes/p: (p-1) a + (p-1)/p n b; an uneven all-to-all (``pair_bytes``) moves what each
pair exchanges, and each phase lasts as long as its largest transfer. Broadcast and reduce are a star around
the root.
"""

from __future__ import annotations

from simulator.collectives.names import Primitive
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS: tuple[Primitive, ...] = ("all_to_all", "all_gather", "reduce_scatter", "all_reduce", "broadcast", "reduce",
                              "send_recv")


def shifted_pairs(ranks: tuple[int, ...], nbytes: float) -> list[Phase]:
    """p-1 phases; in phase k every rank i sends ``nbytes`` to rank (i + k) mod p."""
    size = len(ranks)
    return [Phase(tuple(Transfer(ranks[i], ranks[(i + shift) % size], nbytes) for i in range(size)))
            for shift in range(1, size)]


def uneven_pairs(ranks: tuple[int, ...], pair_bytes: tuple[tuple[float, ...], ...]) -> list[Phase]:
    """p-1 phases; in phase k every rank i sends ``pair_bytes[i][i + k mod p]`` to rank i + k mod p."""
    size = len(ranks)
    if len(pair_bytes) != size or any(len(row) != size for row in pair_bytes):
        raise ScenarioError(f"an all-to-all over {size} ranks needs a {size} x {size} byte matrix",
                            field="pair_bytes", allowed=f"{size} rows of {size} sizes")
    return [Phase(tuple(Transfer(ranks[i], ranks[(i + shift) % size], pair_bytes[i][(i + shift) % size])
                        for i in range(size)))
            for shift in range(1, size)]


def star(ranks: tuple[int, ...], root: int, nbytes: float, *, toward_root: bool) -> list[Phase]:
    """One phase: the root sends ``nbytes`` to every other rank, or every other rank sends to the root."""
    center = ranks[root]
    pairs = [(r, center) if toward_root else (center, r) for r in ranks if r != center]
    return [Phase(tuple(Transfer(a, b, nbytes) for a, b in pairs))] if pairs else []


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """Pairwise all-to-all / all-gather / reduce-scatter (all-reduce = both), star broadcast / reduce,
    and send/recv as one transfer."""
    ranks, n = request.ranks, request.nbytes
    if request.op == "send_recv":
        return [Phase((Transfer(ranks[0], ranks[1], n),))]
    if request.op == "all_to_all" and request.pair_bytes:
        return uneven_pairs(ranks, request.pair_bytes)
    if request.op in ("all_to_all", "all_gather", "reduce_scatter"):
        return shifted_pairs(ranks, n / len(ranks))
    if request.op == "all_reduce":
        return shifted_pairs(ranks, n / len(ranks)) * 2
    if request.op in ("broadcast", "reduce"):
        return star(ranks, request.root, n, toward_root=request.op == "reduce")
    raise ScenarioError(f"algorithm 'direct' does not implement {request.op}", field="collectives.algorithm")
