"""Tree algorithms: NCCL-style double binary tree all-reduce and binomial-tree broadcast / reduce.

The all-reduce's "host" is an NVLink domain (`ring.group_by_domain`), as NCCL's node is under MNNVL: a DGX
server, or a whole GB200 NVL72 rack, one chain through its 72 GPUs per channel under a tree of racks.

Also home of `pipelined_phases`, which turns any tree (a chain is a tree too) whose edges start at known
step offsets into phases of chunk-sized transfers; consecutive steps with the same active edges share one
phase through ``repeat``, and steps that continue open streams pay only the stall of NCCL's window of chunk
steps in flight, not the path latency again.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Hashable, Iterator, Sequence

from simulator.collectives.channels import child_receivers, tree_chain
from simulator.collectives.chunking import NCCL_STEPS, pipeline_chunk
from simulator.collectives.names import ALGORITHM_OPS
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS = ALGORITHM_OPS["tree"]

Edge = tuple[int, int, int, int]
"""(src GPU, dst GPU, channel, first step): the edge carries chunk j at step ``first step + j``."""


def chunk_count(nbytes: float, chunk_bytes: float | None) -> int:
    """How many pipeline chunks a buffer of ``nbytes`` splits into (1 when chunking is off)."""
    if not chunk_bytes or nbytes <= chunk_bytes:
        return 1
    return math.ceil(nbytes / chunk_bytes)


def pipelined_phases(edges: list[Edge], nbytes: float, chunks: int) -> list[Phase]:
    """Phases that move ``nbytes`` in ``chunks`` equal chunks over ``edges`` as a pipeline.

    Each stretch of steps over which the active edges stay the same (`pipeline_stretches`) is one phase whose
    ``repeat`` is the stretch length. A step where an edge carries its first chunk pays the path latency
    (nothing is in flight on that edge to hide it behind); every later step of a stretch continues open
    streams with ``NCCL_STEPS`` chunks in flight and pays only the window's stall, so a chain of h hops costs
    h (a + c b) + (L - 1) max(c b, 2 (a + c b) / NCCL_STEPS) for L chunks of c bytes: h a + n b + (h - 1) c b
    while the window hides the latency, NCCL's latency per hop plus size over bandwidth.
    """
    if not edges or nbytes <= 0:
        return []
    chunk = nbytes / chunks
    transfers = [Transfer(src, dst, chunk, channel) for src, dst, channel, _ in edges]
    by_first = sorted(range(len(edges)), key=lambda index: edges[index][3])
    phases = []
    for low, high, opens, streamed in _active_stretches([edges[index][3] for index in by_first], chunks):
        active = tuple(map(transfers.__getitem__, sorted(by_first[low:high])))  # back in edge order
        if opens:
            phases.append(Phase(active))
        if streamed:
            phases.append(Phase(active, repeat=streamed, steps_in_flight=NCCL_STEPS))
    return phases


def pipelined_transfers(edges: list[Edge], nbytes: float, chunks: int) -> int:
    """The transfers of `pipelined_phases`' phases, counted without building them (the scale estimate's count
    of a tree over thousands of hosts: building its phases took seconds)."""
    if not edges or nbytes <= 0:
        return 0
    return sum((high - low) * (opens + (streamed > 0))
               for low, high, opens, streamed in _active_stretches(sorted(edge[3] for edge in edges), chunks))


def _active_stretches(firsts: list[int], chunks: int) -> Iterator[tuple[int, int, bool, int]]:
    """Per stretch of `pipeline_stretches` with active edges: the slice [low, high) of the edges sorted by
    their sorted first steps ``firsts`` that it runs, whether its first step opens an edge (a phase of its own),
    and the steps after it that stream."""
    for start, stop, opens in pipeline_stretches(firsts, chunks):
        low, high = bisect_right(firsts, start - chunks), bisect_right(firsts, start)
        if high > low:
            yield low, high, opens, stop - start - opens


def pipeline_stretches(firsts: list[int], chunks: int) -> list[tuple[int, int, bool]]:
    """The stretches [start, stop) of a pipeline of ``chunks`` chunks over edges that carry their first chunk
    at steps ``firsts``, over which the active edges (those whose first step lies in [s - chunks + 1, s]) stay
    the same: the set only changes when s reaches a first step or a first step plus ``chunks``. Each with
    whether its first step opens an edge (an edge carries its first chunk then). Some may have no active edge."""
    opening = set(firsts)
    breakpoints = sorted(opening | {first + chunks for first in opening})
    return [(start, stop, start in opening) for start, stop in zip(breakpoints, breakpoints[1:])]


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


def double_binary_tree(ranks: tuple[int, ...]) -> list[list[tuple[int, int, int, int, int]]]:
    """Two complementary binary trees over ``ranks``: per tree, (child, parent, child height, parent depth,
    side), side 0 where the child's position lies below its parent's (NCCL's first child, ncclGetBtree's
    parentChildType), 1 above.

    The second tree mirrors positions (even sizes) or shifts them by one (odd sizes: position q holds rank
    q + 1), as trees.cc ncclGetDtree does, so a rank that is interior in one tree is a leaf in the other and
    every rank's links carry about the same load.
    """
    size = len(ranks)
    parent, height, depth = in_order_tree(size)
    trees = []
    for mapping in (lambda p: p, (lambda p: size - 1 - p) if size % 2 == 0 else (lambda p: (p + 1) % size)):
        trees.append([(ranks[mapping(p)], ranks[mapping(parent[p])], height[p], depth[parent[p]],
                       int(p > parent[p])) for p in range(size) if parent[p] >= 0])
    return trees


def all_reduce_phases(edges: tuple[list[Edge], list[Edge]], request: CollectiveRequest, channels: int,
                      tree_nodes: tuple[int, float]) -> list[Phase]:
    """A tree all-reduce over the (up, down) ``edges`` of ``channels`` channels' two trees: each tree reduces
    n / (2 channels) up to its root, then broadcasts it down, pipelined in chunks (`pipeline_chunk`; the
    group's ``tree_nodes``, its NCCL nodes and members per node, `tree_shape`, size NCCL's LL128 chunk)."""
    share, chunks = _tree_pipeline(request, channels, tree_nodes)
    up, down = edges
    return pipelined_phases(up, share, chunks) + pipelined_phases(down, share, chunks)


def _tree_pipeline(request: CollectiveRequest, channels: int, tree_nodes: tuple[int, float]) -> tuple[float, int]:
    """The bytes each tree of `all_reduce_phases` moves and the chunks it pipelines them in."""
    share = request.nbytes / (2 * channels)
    return share, chunk_count(share, pipeline_chunk(request.chunk_bytes, request.protocol, share, tree_nodes))


def nccl_nodes(topology: Topology, ranks: tuple[int, ...]) -> int:
    """NCCL's nNodes for a group: the NVLink domains its members span. init.cc counts a node per intra-node
    chain of the ring graph (the ranks' distinct ``ringRecv[0]``), and under MNNVL the system NCCL searches is
    the whole NVLink domain (graph/topo.cc fuses the clique's XML), so a GB200 rack of 18 trays is one node."""
    domain = topology.gpu_domain
    return len({domain[rank] for rank in ranks})


def tree_shape(ranks: tuple[int, ...], topology: Topology) -> tuple[int, float]:
    """A tree's nodes and ranks per node as NCCL's LL128 tree chunk reads them (`nccl_chunk`: enqueue.cc's
    nNodes and nRanks / nNodes, `nccl_nodes`: NVLink domains, not hosts or trays)."""
    nodes = nccl_nodes(topology, ranks)
    return nodes, len(ranks) / nodes


def double_tree_edges(ranks: tuple[int, ...], channels: int) -> tuple[list[Edge], list[Edge]]:
    """The up and down edges of the `double_binary_tree` over ``ranks`` on each of ``channels``: every channel
    runs both trees, as every channel of the tree across hosts does (`host_tree_edges`). An edge up starts at
    its child's height, an edge down at its parent's depth."""
    trees = double_binary_tree(ranks)
    up = [(child, parent, channel, height) for channel in range(channels) for tree in trees
          for child, parent, height, _, _ in tree]
    down = [(parent, child, channel, depth) for channel in range(channels) for tree in trees
            for child, parent, _, depth, _ in tree]
    return up, down


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


def all_reduce_edges(ranks: tuple[int, ...], hosts: list[list[int]], channels: int, nic_of: Sequence[Hashable]
                     ) -> tuple[list[Edge], list[Edge]]:
    """The (up, down) edges of the tree all-reduce over ``ranks`` (``hosts``: its members per host, or per NVLink
    domain as `plan` groups them; ``nic_of[member]``: the NIC each drives) on ``channels``: NCCL's tree across
    hosts (`host_tree_edges`) where some host holds two members or more, else the double binary tree over the
    ranks (`double_tree_edges`: one member per host, or a group in one host)."""
    if len(hosts) > 1 and max(map(len, hosts)) > 1:
        return host_tree_edges(hosts, channels, nic_of)
    return double_tree_edges(ranks, channels)


def host_tree_edges(hosts: list[list[int]], channels: int, nic_of: Sequence[Hashable]
                    ) -> tuple[list[Edge], list[Edge]]:
    """The up and down edges of NCCL's tree across hosts: inside each host a chain of its GPUs, across hosts a double
    binary tree of the chains, as connect.cc connectTrees joins them (`plan`'s hosts are NVLink domains: a GB200 rack's
    chain runs through the 72 GPUs of its 18 trays, from the local GPU of the channel's NIC). Channel c's chain in each
    host is its `tree_chain` (it starts at the first GPU of the channel's NIC, so the channels take the host's NICs in
    turn); both trees of a channel run over the same chains (ncclTopoPreset copies channel c's chain to channel c +
    nChannels, which carries the second tree), the second with the mirrored or shifted host tree. A chain's first GPU
    talks to its parent host's GPU that receives that child (`child_receivers`: the parent chain's first GPU, or its
    second where the two share a NIC), so every edge across hosts joins GPUs on the channel's NIC, one rail. An edge up
    starts at its child's height, an edge down at its parent's depth."""
    host_trees = double_binary_tree(tuple(range(len(hosts))))
    up, down = [], []
    for channel in range(channels):
        chains = [tree_chain(members, nic_of, channel) for members in hosts]
        receivers = [child_receivers(chain, nic_of) for chain in chains]
        inside = {chain[k + 1]: chain[k] for chain in chains for k in range(len(chain) - 1)}
        for host_tree in host_trees:
            parent = dict(inside)
            children = {child for child, *_ in host_tree}
            root = next(h for h in range(len(hosts)) if h not in children)
            parent[chains[root][0]] = -1
            for child, above, _, _, side in host_tree:
                parent[chains[child][0]] = receivers[above][side]
            height, depth = _heights_depths(parent)
            up += [(child, above, channel, height[child]) for child, above in parent.items() if above >= 0]
            down += [(above, child, channel, depth[above]) for child, above in parent.items() if above >= 0]
    return up, down


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
    """All-reduce: per NVLink domain a chain, across domains a double binary tree (NCCL's tree; a GB200 rack is
    one domain, as NCCL's node under MNNVL), or the double binary tree over the ranks when every domain holds one
    member or the group sits in one domain; every channel (counted as for rings, as NCCL's tree graph takes the
    ring graph's channels, init.cc) runs both trees. Binomial-tree broadcast and reduce (not pipelined: see
    docs)."""
    if request.op == "all_reduce":
        edges, channels = _all_reduce_tree(request, topology)
        return all_reduce_phases(edges, request, channels, tree_shape(request.ranks, topology))
    if request.op in ("broadcast", "reduce"):
        return binomial_phases(request.ranks, request.root, request.nbytes, toward_root=request.op == "reduce")
    raise ScenarioError(f"algorithm 'tree' does not implement {request.op}", field="collectives.algorithm")


def all_reduce_transfers(request: CollectiveRequest, topology: Topology) -> int:
    """The transfers of `plan`'s all-reduce phases (``request`` under its protocol), counted without building
    them (`pipelined_transfers`)."""
    (up, down), channels = _all_reduce_tree(request, topology)
    share, chunks = _tree_pipeline(request, channels, tree_shape(request.ranks, topology))
    return pipelined_transfers(up, share, chunks) + pipelined_transfers(down, share, chunks)


def _all_reduce_tree(request: CollectiveRequest, topology: Topology) -> tuple[tuple[list[Edge], list[Edge]], int]:
    """The (up, down) edges of `plan`'s all-reduce and its channels, over the group's NVLink domains."""
    from simulator.collectives.ring import channel_count, group_by_domain  # ring builds on this module

    domains = group_by_domain(request.ranks, topology)
    channels = channel_count(request, topology, domains)
    return all_reduce_edges(request.ranks, domains, channels, topology.gpu_nic), channels
