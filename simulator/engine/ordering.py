"""Happens-before between the collectives of a program: which instances can never run at the same time.

A program is a DAG: every op waits for its dependencies and, on an in-order stream, for the op before it; a
collective (one `key`, an op on every simulated member) completes for all members at once, so it is one node
whose predecessors are those of all its member ops. Instance A happens before instance B when B is reachable
from A: A's flows have all finished before any of B's start, in every run, whatever the durations.

Reachability is answered with vector clocks: one component per in-order (rank, stream) of the program, and per
node the latest position on each component that it is reachable from (its own position on its own
components). Ops on asynchronous streams have no position of their own; an asynchronous collective happens
before B when one of the first in-order ops after it does (or is B): those ops are its reach marks.

The clocks are one numpy table (nodes x components), filled wave by wave: a node's wave is the length of the
longest chain of predecessors before it, so every predecessor's clock is complete when its wave is taken, and
each wave is one vectorized maximum over its nodes' predecessors (a few thousand waves for a folded training
step of 70 k nodes). Queries come in whole arrays of node pairs, so the sharing analysis asks them per shape.

The fold symmetry check and the sharing analysis both ask it of the same program, so a run makes one
`ProgramOrder` per program and hands it to both: the ordering is built once, on first use.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import chain

import numpy as np

from simulator.program.ops import CollectiveOp, Op

ORDERING_BUDGET_BYTES = 512 * 2**20
"""Most bytes an ordering may take at its peak while it is built (`OrderingSize.bytes`); beyond it (unfolded runs of
many ranks) no ordering, and the sharing analysis judges a group on one member rank's ops alone
(`ProgramOrder.rank_ordering`), which sees fewer collectives as private (engine/sharing.py). 512 MiB, a
thirty-second of the 16 GiB a run may be estimated to need (scale.MAX_MEMORY_BYTES), admits the folded steps of many
micro-batches: the 405B step at 1,024 GPUs (DP 8, 256 micro-batches per replica, sequence parallelism's re-gathers
on a second stream) has 664,485 ops on 48 components (300 MiB measured at the peak); its ordering costs 2.4
s of CPU and saves the 20 s and 1 GiB its collectives took on the network unordered. It admits the refolds by route
class too: the DeepSeek-V3-style step on 1,024 GPUs with DualPipeV at global batch 2048, refolded to 112 ranks, has
254,639 ops (238,949 nodes) on 336 components, 379 MiB of clock table and per-op tables (381.8 MiB measured at
the peak, 4.4 s of CPU); ordered, 82,211 of its
112,833 collectives (79,716 EP all-to-alls) run alone and are replayed, where unordered none was private and the
refold's run took 108.7 s of CPU against 12.6 (side by side, the machine shared). The earlier cap, 2^27 ops x
components, counted the clock table alone: on 48 streams it admitted 2.8 M ops, whose per-op tables bring the
ordering to 1.3 GiB. These figures are of 32-bit clock entries; 16-bit ones (`clock_dtype`) halve the clock table."""

CLOCK_ENTRY_BYTES = 4
"""Bytes of one clock-table entry (a 32-bit position) where a component holds more ops than a 16-bit one counts."""

SHORT_CLOCK_ENTRY_BYTES = 2
"""Bytes of one clock-table entry where no component holds more than `SHORT_POSITIONS` ops (a 16-bit position):
the clock table at half the bytes, the same clocks (the DeepSeek-V3-style CP 2 x PP 64 ZeRO-1 step, 128 ranks of
320,742 ops, comes under the budget so: docs/performance.md)."""

SHORT_POSITIONS = int(np.iinfo(np.int16).max)
"""Most ops on one in-order component for 16-bit clock entries (positions 0 to 32,766, and -1: unreached)."""


def clock_dtype(longest: int) -> type[np.signedinteger]:
    """The clock table's entry type for a program whose longest in-order component holds ``longest`` ops."""
    return np.int16 if longest <= SHORT_POSITIONS else np.int32

BYTES_PER_OP = 300
"""Bytes an ordering takes per op beyond its clock table and passed pairs, at its peak: the node, place, edge
and wave arrays and lists, the reach marks and the wave's gathered clock rows. Measured (tracemalloc, the peak
while `Ordering` builds, less the clock table) on the DeepSeek-V3-style DualPipeV programs at global batch 2048:
36,377 ops on 48 streams 10.9 MiB, 72,754 ops on 96 streams 21.6 MiB, 254,639 ops on 336 streams 75.5 MiB
(296 to 314 B an op); tests/test_ordering.py checks the estimate against the measured peak."""

BYTES_PER_PASSED_PAIR = 24
"""Bytes an ordering takes per pair of asynchronous nodes one passes on the way to its reach marks (each
node's sorted array of those it passes, and the one sorted array of all pairs' codes): 8 B each, and 8 B of
the concatenation they are sorted from. An asynchronous send chain of n nodes has n (n - 1) / 2 of them, so
they outgrow the per-op tables on long chains (DualPipeV at global batch 8192: 979,200 pairs, 40 MiB while
they were kept in frozensets)."""


@dataclass(frozen=True)
class OrderingSize:
    """What an ordering's bytes at its peak are counted from: ``ops``, ``nodes`` (the clock table's rows: a
    collective's member ops are one node), in-order ``components`` (its columns) and ``passed_pairs`` (0 until
    the nodes' graph is known)."""

    ops: int
    nodes: int
    components: int
    passed_pairs: int = 0
    longest: int | None = None
    """The most ops on one in-order component (None: not known, counted as 32-bit clock entries)."""

    @property
    def bytes(self) -> int:
        """Its clock table (2 or 4 bytes an entry, `clock_dtype`), `BYTES_PER_OP` per op and
        `BYTES_PER_PASSED_PAIR` per passed pair."""
        entry = (SHORT_CLOCK_ENTRY_BYTES if self.longest is not None and clock_dtype(self.longest) == np.int16
                 else CLOCK_ENTRY_BYTES)
        return (self.nodes * max(self.components, 1) * entry + self.ops * BYTES_PER_OP
                + self.passed_pairs * BYTES_PER_PASSED_PAIR)

    @property
    def affordable(self) -> bool:
        """Whether a program of this size gets an ordering: its bytes within ORDERING_BUDGET_BYTES."""
        return self.bytes <= ORDERING_BUDGET_BYTES


@dataclass(frozen=True)
class SkippedOrdering:
    """A program too large to order (its ordering over ORDERING_BUDGET_BYTES): its size. The analyses that asked
    for its ordering judged each collective on one rank's ops instead, which proves fewer of them alone on their
    links, so more run on the network with their mirrors rather than being replayed: the same step, often at more
    CPU and memory (the DeepSeek-V3-style 1,024-GPU DualPipeV refold unordered: 68.4 against 27.9 s of CPU, 6.79
    against 2.96 GB at the peak), not always (Llama 3 70B unfolded at global batch 36: 6.6 s and 0.55 GiB
    unordered, 7.7 s and 0.76 GiB ordered). Said in the summary's ``ordering_skipped`` and a warning, not
    silently."""

    size: OrderingSize

    @property
    def mib(self) -> float:
        """The ordering's bytes at its peak, in MiB."""
        return self.size.bytes / 2**20

    def summary(self) -> dict[str, int | float]:
        return {"ops": self.size.ops, "components": self.size.components, "mib": round(self.mib, 1)}

    def warning(self) -> str:
        return (f"collectives not ordered: {self.size.ops:,} ops on {self.size.components:,} in-order streams need "
                f"{self.mib:,.1f} MiB to order, over the budget of {ORDERING_BUDGET_BYTES / 2**20:,.1f} MiB; "
                f"each collective was judged on one rank's ops, so fewer are replayed alone and more run on the "
                f"network: the same step, which may take more CPU time and memory")


UNREACHED = np.iinfo(np.int32).max
"""Position of a padding reach mark: no clock ever attains it."""

CHUNK_ENTRIES = 1 << 21
"""Most node pairs x reach marks compared in one vectorized step by `Ordering.any_concurrent`."""


@dataclass(frozen=True, eq=False)
class ProgramOrder:
    """A program (its ops and asynchronous streams) and its `Ordering`, built when first asked for (None when
    its bytes over ORDERING_BUDGET_BYTES: `skipped`). A run makes one per program and passes it to each analysis
    that orders the program's collectives, so they share one ordering; the ops must not change meanwhile."""

    ops: Sequence[Op]
    async_streams: frozenset[str]

    @property
    def ordering(self) -> Ordering | None:
        return self._outcome if isinstance(self._outcome, Ordering) else None

    @property
    def skipped_when_asked(self) -> SkippedOrdering | None:
        """Why the program got no ordering (too large) where an analysis asked for it; None where it got one or
        none asked (none went without it)."""
        outcome = vars(self).get("_outcome")
        return outcome if isinstance(outcome, SkippedOrdering) else None

    @cached_property
    def _outcome(self) -> Ordering | SkippedOrdering:
        """The ordering, or why not, checked in two steps so that neither takes much more than the budget: the
        size from the ops alone, then with the passed pairs that the nodes' graph (per-op tables) shows."""
        op_components, columns, nodes = _components(self.ops, self.async_streams)
        size = OrderingSize(len(self.ops), nodes, columns, longest=longest_component(op_components))
        if not size.affordable:
            return SkippedOrdering(size)
        graph = _graph(self.ops, op_components)
        size = replace(size, passed_pairs=graph.passed_pairs)
        return Ordering(graph, columns) if size.affordable else SkippedOrdering(size)

    def rank_ordering(self, rank: int) -> Ordering:
        """The ordering of ``rank``'s ops alone (a part of the program, affordable where the whole is not): a
        collective whose op on ``rank`` happens before another's there happens before it in the whole program,
        since each op of the rank is part of its collective's node; what the other ranks add is not seen."""
        known = self._rank_orderings.get(rank)
        if known is None:
            known = self._rank_orderings[rank] = Ordering.of(self._ops_by_rank[rank], self.async_streams, part=True)
        return known

    @cached_property
    def _rank_orderings(self) -> dict[int, Ordering]:
        return {}

    @cached_property
    def _ops_by_rank(self) -> dict[int, list[Op]]:
        found: dict[int, list[Op]] = {}
        for op in self.ops:
            found.setdefault(op.rank, []).append(op)
        return found


@dataclass(frozen=True, eq=False)
class Graph:
    """A program's nodes (compute ops, and collectives by key) and the edges between them, in waves, and how
    many pairs of asynchronous nodes its ordering keeps as passed (`_passed_counts`)."""

    node_of_key: dict[str, int]
    nodes: np.ndarray
    """Each op's node, in op order."""
    op_ids: np.ndarray
    places: Places
    predecessors: Csr
    successors: Csr
    waves: list[list[int]]
    first_component: np.ndarray
    first_position: np.ndarray
    passed_pairs: int

    @property
    def count(self) -> int:
        return len(self.first_component)


def _graph(ops: Sequence[Op], op_components: np.ndarray, part: bool = False) -> Graph:
    """The `Graph` of ``ops`` on their in-order components (`_components`); ``part``: ``ops`` are part of a
    program (one rank's, `ProgramOrder.rank_ordering`): their dependencies on other ops are left out."""
    node_of_key: dict[str, int] = {}
    nodes = np.fromiter((node_of_key.setdefault(op.key, len(node_of_key)) if isinstance(op, CollectiveOp) else -1
                         for op in ops), dtype=np.int64, count=len(ops))
    compute = np.flatnonzero(nodes < 0)
    nodes[compute] = len(node_of_key) + np.arange(len(compute))
    op_ids = np.fromiter((op.id for op in ops), dtype=np.int64, count=len(ops))
    count = len(node_of_key) + len(compute)
    places, stream_edges = _places(nodes, op_components)
    predecessors = _predecessors(ops, op_ids, nodes, stream_edges, count, part)
    successors = _successors(predecessors, count)
    waves = _waves(predecessors, successors)
    first_component, first_position = _first_places(count, *places)
    passed_pairs = sum(_passed_counts(first_component < 0, successors, waves).values())
    return Graph(node_of_key, nodes, op_ids, places, predecessors, successors, waves, first_component,
                 first_position, passed_pairs)


class Ordering:
    """Vector clocks of a program's nodes (its `Graph`), built once in O(ops) Python steps plus one vectorized
    step per wave."""

    def __init__(self, graph: Graph, columns: int):
        """``columns``: the program's in-order components (`_components`)."""
        self.node_of_key = graph.node_of_key
        self._op_ids = graph.op_ids
        self._nodes = graph.nodes
        self.first_component, self.first_position = graph.first_component, graph.first_position
        self.clocks = _clocks(graph.places, graph.predecessors, graph.waves, columns)
        self._mark_components, self._mark_positions, passed = _reach_marks(
            self.first_component, self.first_position, graph.successors, graph.waves)
        self._count = count = graph.count
        self._passing = np.zeros(count, dtype=bool)
        self._passing[list(passed)] = True
        codes = [node * count + others for node, others in passed.items()]
        self._passed_pairs = np.sort(np.concatenate(codes)) if codes else np.zeros(0, dtype=np.int64)

    @classmethod
    def of(cls, ops: Sequence[Op], async_streams: frozenset[str], *, part: bool = False) -> Ordering:
        """The ordering of ``ops`` whatever its size; ``part`` as for `_graph`."""
        op_components, columns, _ = _components(ops, async_streams)
        return cls(_graph(ops, op_components, part), columns)

    @cached_property
    def node_of_op(self) -> dict[int, int]:
        """Each op's node, by op id."""
        return dict(zip(self._op_ids.tolist(), self._nodes.tolist()))

    def before_each(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """For each i, whether node ``a[i]`` finishes before node ``b[i]`` starts in every run: ``b[i]`` is
        reachable from one of ``a[i]``'s reach marks, or is an asynchronous node passed on the way to them."""
        reached = (self.clocks[b[:, None], self._mark_components[a]] >= self._mark_positions[a]).any(axis=1)
        rows = np.flatnonzero(self._passing[a])
        if len(rows):
            reached[rows] |= self._passes(a[rows], b[rows])
        return reached & (a != b)

    def before(self, a: int, b: int) -> bool:
        """Node ``a`` finishes before node ``b`` starts in every run."""
        return bool(self.before_each(np.array([a]), np.array([b]))[0])

    def concurrent(self, a: int, b: int) -> bool:
        """Nodes ``a`` and ``b`` may overlap in time."""
        return a != b and not self.before(a, b) and not self.before(b, a)

    def any_concurrent(self, nodes: np.ndarray, others: np.ndarray) -> np.ndarray:
        """For each of ``nodes``, whether some of ``others`` (not itself) may overlap it; compared as tables of
        at most CHUNK_ENTRIES pairs x reach marks."""
        found = np.zeros(len(nodes), dtype=bool)
        rows = max(1, CHUNK_ENTRIES // (len(others) * self._mark_components.shape[1] or 1))
        for start in range(0, len(nodes), rows):
            chunk = nodes[start:start + rows]
            apart = self._before_table(chunk, others) | self._before_table(others, chunk).T
            found[start:start + rows] = ~(apart | (chunk[:, None] == others)).all(axis=1)
        return found

    def _before_table(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """[i, j]: whether node ``a[i]`` happens before node ``b[j]`` (or is it: the caller sets those apart)."""
        table = (self.clocks[b][:, self._mark_components[a]] >= self._mark_positions[a]).any(axis=2).T
        rows = np.flatnonzero(self._passing[a])
        if len(rows):
            table[rows] |= self._passes(a[rows, None], b[None, :])
        return table

    def _passes(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise (broadcast): whether asynchronous node ``a`` passes asynchronous node ``b`` on the way to
        its reach marks; the pairs are kept as one sorted array of codes ``a x nodes + b``, searched at once."""
        codes = a * self._count + b
        found = np.searchsorted(self._passed_pairs, codes)
        return self._passed_pairs[np.minimum(found, len(self._passed_pairs) - 1)] == codes


def _components(ops: Sequence[Op], async_streams: frozenset[str]) -> tuple[np.ndarray, int, int]:
    """Each op's in-order (rank, stream), numbered from 0 (-1 for an op on an asynchronous stream), how many
    there are (the clock table's columns) and how many nodes the ops make (its rows: a collective's member ops
    are one)."""
    slots: dict[tuple[int, str], int] = {}
    components = np.fromiter((-1 if op.stream in async_streams else slots.setdefault((op.rank, op.stream), len(slots))
                              for op in ops), dtype=np.int64, count=len(ops))
    collectives = [op.key for op in ops if isinstance(op, CollectiveOp)]
    return components, len(slots), len(ops) - len(collectives) + len(set(collectives))


def longest_component(op_components: np.ndarray) -> int:
    """The most ops on one in-order component (``op_components`` as `_components` numbers them; 0 for none)."""
    placed = op_components[op_components >= 0]
    return int(np.bincount(placed).max()) if placed.size else 0


Places = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Every in-order op's (node, component, position), in op order."""

Csr = tuple[np.ndarray, np.ndarray]
"""Adjacency as (pointers, neighbours): node n's neighbours are neighbours[pointers[n]:pointers[n + 1]]."""


def _places(nodes: np.ndarray, components: np.ndarray) -> tuple[Places, tuple[np.ndarray, np.ndarray]]:
    """Each in-order op's place (its component, -1 for asynchronous ops, and its position there by op order)
    and the stream edges (each in-order op's node after the node of the op before it on its component)."""
    inorder = np.flatnonzero(components >= 0)
    order = inorder[np.argsort(components[inorder], kind="stable")]
    on = components[order]
    continues = on[1:] == on[:-1]
    starts = np.flatnonzero(np.concatenate(([True], ~continues)))
    positions = np.empty(len(components), dtype=np.int64)
    positions[order] = np.arange(len(order)) - np.repeat(starts, np.diff(np.append(starts, len(order))))
    following = nodes[order]
    edges = (following[:-1][continues], following[1:][continues])
    return (nodes[inorder], components[inorder], positions[inorder]), edges


def _predecessors(ops: Sequence[Op], ids: np.ndarray, nodes: np.ndarray,
                  stream_edges: tuple[np.ndarray, np.ndarray], count: int, part: bool = False) -> Csr:
    """Each node's distinct predecessors (itself excluded): the nodes before its ops on their streams and
    those of their dependencies (named by op ``ids``); with ``part``, dependencies on ops not in ``ops`` are
    left out (else they are an error)."""
    deps = [op.deps for op in ops]
    counts = np.fromiter(map(len, deps), dtype=np.int64, count=len(deps))
    dep_ids = np.fromiter(chain.from_iterable(deps), dtype=np.int64, count=int(counts.sum()))
    by_id = np.argsort(ids)
    found = by_id[np.searchsorted(ids, dep_ids, sorter=by_id).clip(max=max(len(ids) - 1, 0))]
    known = ids[found] == dep_ids
    if not part and not known.all():
        raise ValueError(f"dependencies on ops not in the program: {sorted(set(dep_ids[~known].tolist()))[:5]}")
    sources = np.concatenate((stream_edges[0], nodes[found][known]))
    targets = np.concatenate((stream_edges[1], np.repeat(nodes, counts)[known]))
    codes = np.sort((targets * count + sources)[sources != targets])
    targets, sources = np.divmod(codes[np.diff(codes, prepend=-1) != 0], count)
    return np.searchsorted(targets, np.arange(count + 1)), sources


def _successors(predecessors: Csr, count: int) -> Csr:
    """The reverse adjacency."""
    pointers, sources = predecessors
    targets = np.repeat(np.arange(count), np.diff(pointers))
    order = np.argsort(sources, kind="stable")
    return np.searchsorted(sources[order], np.arange(count + 1)), targets[order]


def _first_places(count: int, nodes: np.ndarray, components: np.ndarray, positions: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Each node's first place in op order (component -1 and position UNREACHED: an asynchronous node)."""
    first_component = np.full(count, -1, dtype=np.int64)
    first_position = np.full(count, UNREACHED, dtype=np.int32)
    placed, first = np.unique(nodes, return_index=True)
    first_component[placed] = components[first]
    first_position[placed] = positions[first]
    return first_component, first_position


def _waves(predecessors: Csr, successors: Csr) -> list[list[int]]:
    """The nodes by wave: wave 0 has no predecessors, wave k + 1 those whose last predecessor is in wave k.
    Nodes on a cycle (a deadlocked program) and those after them are in no wave."""
    waiting = np.diff(predecessors[0]).tolist()
    pointers, targets = successors[0].tolist(), successors[1].tolist()
    waves = []
    wave = [node for node, count in enumerate(waiting) if not count]
    while wave:
        waves.append(wave)
        following = []
        for node in wave:
            for other in targets[pointers[node]:pointers[node + 1]]:
                waiting[other] -= 1
                if not waiting[other]:
                    following.append(other)
        wave = following
    return waves


def _clocks(places: Places, predecessors: Csr, waves: list[list[int]], components: int) -> np.ndarray:
    """The nodes x components clock table: own positions, and per wave the latest of each node's own row and
    its predecessors' (a node's own position on a component is later than any of its predecessors' there).
    It has one column at least: a padding reach mark points at component 0, which a program of asynchronous
    ops alone (a Chakra trace of sends and receives) does not have. Its entries are 16-bit where every position
    fits (`clock_dtype`)."""
    nodes, columns, positions = places
    longest = int(positions.max()) + 1 if positions.size else 0
    clocks = np.full((len(predecessors[0]) - 1, max(components, 1)), -1, dtype=clock_dtype(longest))
    clocks[nodes, columns] = positions
    order = np.fromiter(chain.from_iterable(waves[1:]), dtype=np.int64)
    starts, ends, inputs = _input_rows(predecessors, order)
    first = 0
    for wave in waves[1:]:
        last = first + len(wave)
        begin, end = starts[first], ends[last - 1]
        clocks[order[first:last]] = np.maximum.reduceat(clocks[inputs[begin:end]], starts[first:last] - begin)
        first = last
    return clocks


def _input_rows(predecessors: Csr, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows a clock is the latest of, for each node of ``order`` in turn: its predecessors, then itself,
    one flat array (``inputs``) with each node's run at ``inputs[starts[i]:ends[i]]``, ready for one
    `np.maximum.reduceat` per wave."""
    pointers, sources = predecessors
    counts = pointers[order + 1] - pointers[order] + 1
    ends = np.cumsum(counts)
    starts = ends - counts
    runs = np.arange(ends[-1] if len(ends) else 0) + np.repeat(pointers[order] - starts, counts)
    inputs = np.append(sources, 0)[runs]
    inputs[ends - 1] = order
    return starts, ends, inputs


def _floating_last_first(floating: np.ndarray, waves: list[list[int]]) -> list[int]:
    """The asynchronous nodes, last wave first: each after every asynchronous node it reaches."""
    order = np.fromiter(chain.from_iterable(waves), dtype=np.int64)
    wave_of = np.repeat(np.arange(len(waves)), [len(wave) for wave in waves])
    last_first = np.argsort(-wave_of[floating[order]], kind="stable")
    return order[floating[order]][last_first].tolist()


def _passed_counts(floating: np.ndarray, successors: Csr, waves: list[list[int]]) -> dict[int, int]:
    """Per asynchronous node, at least as many as the asynchronous nodes it passes on the way to its reach
    marks (`_reach_marks`): the sum over its asynchronous successors of one and theirs, exact where no two
    paths meet (a send chain of n nodes: n - 1, ..., 1, 0), an upper bound where they do (at most all the other
    asynchronous nodes); counted without building the sets."""
    pointers, targets = successors
    most = max(int(floating.sum()) - 1, 0)
    counts: dict[int, int] = {}
    for node in _floating_last_first(floating, waves):
        after = targets[pointers[node]:pointers[node + 1]]
        counts[node] = min(most, sum(1 + counts[other] for other in after[floating[after]].tolist()))
    return counts


def _reach_marks(first_component: np.ndarray, first_position: np.ndarray, successors: Csr,
                 waves: list[list[int]]) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    """Per node its reach marks, padded to one width with UNREACHED positions (components, positions: an
    in-order node's first place; an asynchronous node's earliest first-in-order-op-after-it per component),
    and the asynchronous nodes an asynchronous node passes on the way to them (only those passing some, each
    a sorted array)."""
    pointers, targets = successors
    floating = first_component < 0
    earliest: dict[int, dict[int, int]] = {}
    passed: dict[int, np.ndarray] = {}
    for node in _floating_last_first(floating, waves):
        marks: dict[int, int] = {}
        through: list[np.ndarray] = []
        for after in targets[pointers[node]:pointers[node + 1]].tolist():
            reached: Iterable[tuple[int, int]]
            if floating[after]:
                reached = earliest[after].items()
                through += [np.array([after]), passed.get(after, np.zeros(0, dtype=np.int64))]
            else:
                reached = [(int(first_component[after]), int(first_position[after]))]
            for component, position in reached:
                marks[component] = min(position, marks.get(component, position))
        earliest[node] = marks
        if through:
            passed[node] = np.unique(np.concatenate(through))
    width = max([1, *map(len, earliest.values())])
    components = np.zeros((len(first_component), width), dtype=np.int64)
    positions = np.full((len(first_component), width), UNREACHED, dtype=np.int32)
    components[~floating, 0] = first_component[~floating]
    positions[~floating, 0] = first_position[~floating]
    for node, marks in earliest.items():
        components[node, :len(marks)] = list(marks)
        positions[node, :len(marks)] = list(marks.values())
    return components, positions, passed
