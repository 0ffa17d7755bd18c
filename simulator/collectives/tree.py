"""Tree algorithms: NCCL-style double binary tree all-reduce and binomial-tree broadcast / reduce.

Also home of `pipelined_phases`, which turns any tree (a chain is a tree too) whose edges start at known
step offsets into phases of chunk-sized transfers; consecutive steps with the same active edges share one
phase through ``repeat``, and steps that continue open streams pay only the stall of NCCL's window of chunk
steps in flight, not the path latency again.
"""

from __future__ import annotations

import math

from simulator.collectives.names import Primitive
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS: tuple[Primitive, ...] = ("all_reduce", "broadcast", "reduce")

NCCL_STEPS = 8
"""Chunk steps a connection keeps in flight: NCCL's ``NCCL_STEPS`` (src/include/device.h), the slots of a Simple
protocol buffer that the sender fills before it waits for the receiver's credit (src/device/prims_simple.h)."""

Edge = tuple[int, int, int, int]
"""(src GPU, dst GPU, channel, first step): the edge carries chunk j at step ``first step + j``."""


def chunk_count(nbytes: float, chunk_bytes: float | None) -> int:
    """How many pipeline chunks a buffer of ``nbytes`` splits into (1 when chunking is off)."""
    if not chunk_bytes or nbytes <= chunk_bytes:
        return 1
    return math.ceil(nbytes / chunk_bytes)


def pipelined_phases(edges: list[Edge], nbytes: float, chunks: int) -> list[Phase]:
    """Phases that move ``nbytes`` in ``chunks`` equal chunks over ``edges`` as a pipeline.

    At step s the active edges are those whose first step lies in ``[s - chunks + 1, s]``; the set only
    changes when s reaches a first step or a first step plus ``chunks``, so each stretch between two such
    breakpoints is one phase whose ``repeat`` is the stretch length. A step where an edge carries its first
    chunk pays the path latency (nothing is in flight on that edge to hide it behind); every later step of a
    stretch continues open streams with ``NCCL_STEPS`` chunks in flight and pays only the window's stall, so
    a chain of h hops costs h (a + c b) + (L - 1) max(c b, 2 (a + c b) / NCCL_STEPS) for L chunks of c bytes:
    h a + n b + (h - 1) c b while the window hides the latency, NCCL's latency per hop plus size over bandwidth.
    """
    if not edges or nbytes <= 0:
        return []
    chunk = nbytes / chunks
    firsts = {e[3] for e in edges}
    breakpoints = sorted(firsts | {first + chunks for first in firsts})
    phases = []
    for start, stop in zip(breakpoints, breakpoints[1:]):
        active = tuple(Transfer(src, dst, chunk, channel) for src, dst, channel, first in edges
                       if start - chunks < first <= start)
        if not active:
            continue
        streamed = stop - start
        if start in firsts:
            phases.append(Phase(active))
            streamed -= 1
        if streamed:
            phases.append(Phase(active, repeat=streamed, steps_in_flight=NCCL_STEPS))
    return phases


def in_order_tree(size: int) -> tuple[list[int], list[int], list[int]]:
    """Parent, height and depth of each position 0..size-1 in a binary tree (parent -1 for the root, 0).

    Positions 1..size-1 form an in-order tree where a position's level follows its lowest set bit (odd
    positions are leaves); position 0 sits on top with that tree as its only child.
    """
    parent, depth, height = [-1] * size, [0] * size, [0] * size

    def build(low: int, high: int, above: int) -> None:
        if low > high:
            return
        top = max(range(low, high + 1), key=lambda p: p & -p)
        parent[top], depth[top] = above, depth[above] + 1
        build(low, top - 1, top)
        build(top + 1, high, top)

    build(1, size - 1, 0)
    for p in sorted(range(1, size), key=lambda q: -depth[q]):
        height[parent[p]] = max(height[parent[p]], height[p] + 1)
    return parent, height, depth


def double_binary_tree(ranks: tuple[int, ...]) -> list[list[tuple[int, int, int, int]]]:
    """Two complementary binary trees over ``ranks``: per tree, (child, parent, child height, parent depth).

    The second tree mirrors positions (even sizes) or shifts them by one (odd sizes), so a rank that is
    interior in one tree is a leaf in the other and every rank's links carry about the same load.
    """
    size = len(ranks)
    parent, height, depth = in_order_tree(size)
    trees = []
    for mapping in (lambda p: p, (lambda p: size - 1 - p) if size % 2 == 0 else (lambda p: (p - 1) % size)):
        trees.append([(ranks[mapping(p)], ranks[mapping(parent[p])], height[p], depth[parent[p]])
                      for p in range(size) if parent[p] >= 0])
    return trees


def double_tree_all_reduce(request: CollectiveRequest) -> list[Phase]:
    """Each tree reduces half the buffer up to its root, then broadcasts it down, pipelined in chunks."""
    half = request.nbytes / 2
    chunks = chunk_count(half, request.chunk_bytes)
    trees = double_binary_tree(request.ranks)
    up = [(child, parent, index, h) for index, tree in enumerate(trees) for child, parent, h, _ in tree]
    down = [(parent, child, index, d) for index, tree in enumerate(trees) for child, parent, _, d in tree]
    return pipelined_phases(up, half, chunks) + pipelined_phases(down, half, chunks)


def _heights_depths(parent: dict[int, int]) -> tuple[dict[int, int], dict[int, int]]:
    """Height and depth of every vertex of a tree given as child -> parent (the root maps to -1)."""
    depth: dict[int, int] = {}

    def depth_of(vertex: int) -> int:
        if vertex not in depth:
            depth[vertex] = 0 if parent[vertex] < 0 else depth_of(parent[vertex]) + 1
        return depth[vertex]

    for vertex in parent:
        depth_of(vertex)
    height = dict.fromkeys(parent, 0)
    for vertex in sorted(parent, key=lambda v: -depth[v]):
        if parent[vertex] >= 0:
            height[parent[vertex]] = max(height[parent[vertex]], height[vertex] + 1)
    return height, depth


def host_tree_all_reduce(hosts: list[list[int]], request: CollectiveRequest, channels: int) -> list[Phase]:
    """NCCL's tree across hosts: inside each host a chain of its GPUs, across hosts a double binary tree of
    the chains. Every channel runs two trees (the second with the mirrored host tree and the reversed chains),
    each carrying n / (2 channels), pipelined in chunks; channel c's chains start at local position c, so the
    channels leave each host through different GPUs (and NICs). A chain's first GPU talks to the parent
    host's last GPU, as NCCL's tree-up and tree-down GPUs sit at the two ends of the intra-node chain."""
    share = request.nbytes / (2 * channels)
    chunks = chunk_count(share, request.chunk_bytes)
    host_trees = double_binary_tree(tuple(range(len(hosts))))
    up, down = [], []
    for channel in range(channels):
        for index, host_tree in enumerate(host_trees):
            chains = [members[channel % len(members):] + members[:channel % len(members)] for members in hosts]
            if index:
                chains = [chain[::-1] for chain in chains]
            parent = {chain[k + 1]: chain[k] for chain in chains for k in range(len(chain) - 1)}
            children = {child for child, _, _, _ in host_tree}
            root = next(h for h in range(len(hosts)) if h not in children)
            parent[chains[root][0]] = -1
            for child, above, _, _ in host_tree:
                parent[chains[child][0]] = chains[above][-1]
            height, depth = _heights_depths(parent)
            tag = 2 * channel + index
            up += [(child, above, tag, height[child]) for child, above in parent.items() if above >= 0]
            down += [(above, child, tag, depth[above]) for child, above in parent.items() if above >= 0]
    up = [(a, b, tag // 2, step) for a, b, tag, step in up]
    down = [(a, b, tag // 2, step) for a, b, tag, step in down]
    return pipelined_phases(up, share, chunks) + pipelined_phases(down, share, chunks)


def binomial_rounds(size: int) -> list[list[tuple[int, int]]]:
    """Broadcast rounds over positions 0..size-1 from position 0: round k sends i -> i + 2**k for i < 2**k."""
    rounds = []
    span = 1
    while span < size:
        rounds.append([(i, i + span) for i in range(span) if i + span < size])
        span *= 2
    return rounds


def binomial_phases(ranks: tuple[int, ...], root: int, nbytes: float, *, toward_root: bool,
                    channel: int = 0) -> list[Phase]:
    """Binomial-tree broadcast from (or reduce toward, reversed) position ``root``: ceil(log2 p) rounds of n."""
    size = len(ranks)
    order = [ranks[(root + i) % size] for i in range(size)]
    rounds = binomial_rounds(size)
    if toward_root:
        rounds = [[(b, a) for a, b in pairs] for pairs in reversed(rounds)]
    return [Phase(tuple(Transfer(order[a], order[b], nbytes, channel) for a, b in pairs)) for pairs in rounds]


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """All-reduce: per host a chain, across hosts a double binary tree (NCCL's tree), or the double binary tree
    over the ranks when every host holds one member or the group sits in one host; binomial-tree broadcast and
    reduce (not pipelined: see docs)."""
    if request.op == "all_reduce":
        from simulator.collectives.ring import channel_count, group_by_host  # ring builds on this module

        hosts = group_by_host(request.ranks, topology)
        if len(hosts) > 1 and max(len(members) for members in hosts) > 1:
            return host_tree_all_reduce(hosts, request, channel_count(request, topology, hosts))
        return double_tree_all_reduce(request)
    if request.op in ("broadcast", "reduce"):
        return binomial_phases(request.ranks, request.root, request.nbytes, toward_root=request.op == "reduce")
    raise ScenarioError(f"algorithm 'tree' does not implement {request.op}", field="collectives.algorithm",
                        allowed=f"tree for {', '.join(OPS)}; ring, direct or halving_doubling for {request.op}")
