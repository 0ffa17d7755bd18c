"""Recursive halving (reduce-scatter) and recursive doubling (all-gather), for power-of-two groups.

In halving step k every rank exchanges half of what it still holds with the partner 2**k positions away
(farthest partner first), so all-reduce costs 2 log2(p) a + 2(p-1)/p n b (Thakur, Rabenseifner, Gropp 2005).
"""

from __future__ import annotations

from simulator.collectives.names import ALGORITHM_OPS
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS = ALGORITHM_OPS["halving_doubling"]


def exchange(ranks: tuple[int, ...], distance: int, nbytes: float) -> Phase:
    """Every rank sends ``nbytes`` to the partner whose position differs in the bit ``distance``."""
    return Phase(tuple(Transfer(ranks[i], ranks[i ^ distance], nbytes) for i in range(len(ranks))))


def halving(ranks: tuple[int, ...], nbytes: float) -> list[Phase]:
    """Reduce-scatter of ``nbytes`` per rank: log2 p exchanges of n/2, n/4, ..., n/p (farthest first)."""
    size = len(ranks)
    return [exchange(ranks, size >> (k + 1), nbytes / 2 ** (k + 1)) for k in range(size.bit_length() - 1)]


def doubling(ranks: tuple[int, ...], nbytes: float) -> list[Phase]:
    """All-gather to ``nbytes`` per rank: log2 p exchanges of n/p, 2n/p, ..., n/2 (nearest first)."""
    return list(reversed(halving(ranks, nbytes)))


def check(request: CollectiveRequest, topology: Topology) -> None:
    """Refuse a group whose size is not a power of two (``topology`` plays no part)."""
    size = len(request.ranks)
    if size & (size - 1):
        raise ScenarioError(f"halving_doubling needs a power-of-two group, got {size} ranks",
                            field="collectives.algorithm")


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """Halving for reduce-scatter, doubling for all-gather, halving then doubling for all-reduce."""
    if request.op not in OPS:
        raise ScenarioError(f"algorithm 'halving_doubling' does not implement {request.op}",
                            field="collectives.algorithm")
    check(request, topology)
    if request.op == "reduce_scatter":
        return halving(request.ranks, request.nbytes)
    if request.op == "all_gather":
        return doubling(request.ranks, request.nbytes)
    return halving(request.ranks, request.nbytes) + doubling(request.ranks, request.nbytes)
