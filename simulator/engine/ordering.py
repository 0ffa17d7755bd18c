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
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from simulator.program.ops import CollectiveOp, Op

MAX_CLOCK_ENTRIES = 1 << 24
"""Largest nodes x components table allowed (64 MiB of 32-bit positions); beyond it (unfolded runs of many
ranks) no ordering."""

UNREACHED = np.iinfo(np.int32).max
"""Position of a padding reach mark: no clock ever attains it."""

CHUNK_ENTRIES = 1 << 21
"""Most node pairs x reach marks compared in one vectorized step by `Ordering.any_concurrent`."""


class Ordering:
    """Vector clocks of a program's nodes (compute ops, and collectives by key), built once in O(ops) Python
    steps plus one vectorized step per wave."""

    @staticmethod
    def affordable(ops: Sequence[Op], async_streams: frozenset[str]) -> bool:
        """Whether the clock table of ``ops`` stays within MAX_CLOCK_ENTRIES."""
        components = {(op.rank, op.stream) for op in ops if op.stream not in async_streams}
        return len(ops) * len(components) <= MAX_CLOCK_ENTRIES

    def __init__(self, ops: Sequence[Op], async_streams: frozenset[str]):
        node_of_key: dict[str, int] = {}
        node_of_op: dict[int, int] = {}
        places: list[list[tuple[int, int]]] = []
        predecessors: list[set[int]] = []
        components: dict[tuple[int, str], int] = {}
        lengths: list[int] = []
        last_on: list[int] = []
        dependencies: list[tuple[set[int], tuple[int, ...]]] = []
        for op in ops:
            key = op.key if isinstance(op, CollectiveOp) else None
            node = node_of_key.get(key) if key is not None else None
            if node is None:
                node = len(places)
                places.append([])
                predecessors.append(set())
                if key is not None:
                    node_of_key[key] = node
            node_of_op[op.id] = node
            before = predecessors[node]
            if op.deps:
                dependencies.append((before, op.deps))
            if op.stream not in async_streams:
                slot = (op.rank, op.stream)
                component = components.get(slot)
                if component is None:
                    component = components[slot] = len(lengths)
                    lengths.append(0)
                    last_on.append(node)
                else:
                    before.add(last_on[component])
                    last_on[component] = node
                places[node].append((component, lengths[component]))
                lengths[component] += 1
        for before, deps in dependencies:
            before.update([node_of_op[dep] for dep in deps])
        for node, before in enumerate(predecessors):
            before.discard(node)
        self.places = places
        self.node_of_key = node_of_key
        self.node_of_op = node_of_op
        waves = _waves(predecessors)
        self.clocks = _clocks(places, predecessors, waves, len(components))
        self._mark_components, self._mark_positions, self._passed = _reach_marks(places, predecessors, waves)
        self._passing = np.array(sorted(self._passed), dtype=np.int64)

    def latest(self, node: int, component: int) -> int:
        """The latest position on ``component`` that happens before ``node`` or is ``node`` (-1: none)."""
        return int(self.clocks[node, component])

    def before_each(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """For each i, whether node ``a[i]`` finishes before node ``b[i]`` starts in every run: ``b[i]`` is
        reachable from one of ``a[i]``'s reach marks, or is an asynchronous node passed on the way to them."""
        reached = (self.clocks[b[:, None], self._mark_components[a]] >= self._mark_positions[a]).any(axis=1)
        if self._passed:
            for index in np.flatnonzero(np.isin(a, self._passing)):
                reached[index] |= int(b[index]) in self._passed[int(a[index])]
        return reached & (a != b)

    def before(self, a: int, b: int) -> bool:
        """Node ``a`` finishes before node ``b`` starts in every run."""
        return bool(self.before_each(np.array([a]), np.array([b]))[0])

    def concurrent(self, a: int, b: int) -> bool:
        """Nodes ``a`` and ``b`` may overlap in time."""
        return a != b and not self.before(a, b) and not self.before(b, a)

    def any_concurrent(self, nodes: np.ndarray, others: np.ndarray) -> np.ndarray:
        """For each of ``nodes``, whether some of ``others`` (not itself) may overlap it; the pairs are
        compared in chunks of CHUNK_ENTRIES."""
        found = np.zeros(len(nodes), dtype=bool)
        rows = max(1, CHUNK_ENTRIES // (len(others) * self._mark_components.shape[1] or 1))
        for start in range(0, len(nodes), rows):
            chunk = nodes[start:start + rows]
            a, b = np.repeat(chunk, len(others)), np.tile(others, len(chunk))
            apart = self.before_each(a, b) | self.before_each(b, a) | (a == b)
            found[start:start + rows] = ~apart.reshape(len(chunk), len(others)).all(axis=1)
        return found


def _waves(predecessors: list[set[int]]) -> list[list[int]]:
    """The nodes by wave: wave 0 has no predecessors, wave k + 1 those whose last predecessor is in wave k.
    Nodes on a cycle (a deadlocked program) and those after them are in no wave."""
    successors: list[list[int]] = [[] for _ in predecessors]
    waiting = [len(before) for before in predecessors]
    for node, before in enumerate(predecessors):
        for other in before:
            successors[other].append(node)
    waves = []
    wave = [node for node, count in enumerate(waiting) if not count]
    while wave:
        waves.append(wave)
        following = []
        for node in wave:
            for other in successors[node]:
                waiting[other] -= 1
                if not waiting[other]:
                    following.append(other)
        wave = following
    return waves


def _clocks(places: list[list[tuple[int, int]]], predecessors: list[set[int]], waves: list[list[int]],
            components: int) -> np.ndarray:
    """The nodes x components clock table: own positions, and per wave the latest of the predecessors'
    clocks (a node's own position on a component is later than any of its predecessors' there)."""
    clocks = np.full((len(places), components), -1, dtype=np.int32)
    owned = [(node, component, position) for node, own in enumerate(places) for component, position in own]
    if owned:
        nodes, columns, positions = np.array(owned, dtype=np.int64).T
        clocks[nodes, columns] = positions
    order = np.fromiter(chain.from_iterable(waves[1:]), dtype=np.int64)
    counts = np.fromiter((len(predecessors[node]) for node in order), dtype=np.int64, count=len(order))
    inputs = np.fromiter(chain.from_iterable(predecessors[node] for node in order), dtype=np.int64,
                         count=int(counts.sum()))
    starts = np.concatenate(([0], np.cumsum(counts)))
    first = 0
    for wave in waves[1:]:
        last = first + len(wave)
        nodes = order[first:last]
        joined = np.maximum.reduceat(clocks[inputs[starts[first]:starts[last]]], starts[first:last] - starts[first])
        clocks[nodes] = np.maximum(clocks[nodes], joined)
        first = last
    return clocks


def _reach_marks(places: list[list[tuple[int, int]]], predecessors: list[set[int]], waves: list[list[int]]
                 ) -> tuple[np.ndarray, np.ndarray, dict[int, frozenset[int]]]:
    """Per node its reach marks, padded to one width with UNREACHED positions (components, positions: an
    in-order node's first place; an asynchronous node's earliest first-in-order-op-after-it per component),
    and the asynchronous nodes an asynchronous node passes on the way to them (only those passing some)."""
    successors: list[list[int]] = [[] for _ in places]
    for node, before in enumerate(predecessors):
        for other in before:
            successors[other].append(node)
    earliest: dict[int, dict[int, int]] = {}
    passed: dict[int, frozenset[int]] = {}
    for node in chain.from_iterable(reversed(waves)):
        if places[node]:
            continue
        marks: dict[int, int] = {}
        through: set[int] = set()
        for after in successors[node]:
            reached = places[after][:1] if places[after] else earliest[after].items()
            for component, position in reached:
                marks[component] = min(position, marks.get(component, position))
            if not places[after]:
                through.add(after)
                through |= passed.get(after, frozenset())
        earliest[node] = marks
        if through:
            passed[node] = frozenset(through)
    width = max([1, *map(len, earliest.values())])
    components = np.zeros((len(places), width), dtype=np.int64)
    positions = np.full((len(places), width), UNREACHED, dtype=np.int32)
    for node, own in enumerate(places):
        reached = own[:1] if own else earliest.get(node, {}).items()
        for column, (component, position) in enumerate(reached):
            components[node, column] = component
            positions[node, column] = position
    return components, positions, passed
