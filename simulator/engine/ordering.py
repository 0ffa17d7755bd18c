"""Happens-before between the collectives of a program: which instances can never run at the same time.

A program is a DAG: every op waits for its dependencies and, on an in-order stream, for the op before it; a
collective (one `key`, an op on every simulated member) completes for all members at once, so it is one node
whose predecessors are those of all its member ops. Instance A happens before instance B when B is reachable
from A: A's flows have all finished before any of B's start, in every run, whatever the durations.

Reachability is answered with vector clocks: one component per in-order (rank, stream) of the program, and per
node the latest position on each component that it is reachable from. Ops on asynchronous streams have no
position of their own; an asynchronous collective happens before B when one of the first in-order ops after
it does (or is B).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from simulator.program.ops import CollectiveOp, Op

MAX_CLOCK_ENTRIES = 1 << 24
"""Largest nodes x components table built (64 MiB); beyond it (unfolded runs of many ranks) no ordering."""


class Ordering:
    """Vector clocks of a program's nodes (compute ops, and collectives by key), built once in O(ops x
    components)."""

    @staticmethod
    def affordable(ops: Sequence[Op], async_streams: frozenset[str]) -> bool:
        """Whether the clock table of ``ops`` stays within MAX_CLOCK_ENTRIES."""
        components = {(op.rank, op.stream) for op in ops if op.stream not in async_streams}
        return len(ops) * len(components) <= MAX_CLOCK_ENTRIES

    def __init__(self, ops: Sequence[Op], async_streams: frozenset[str]):
        node_of_key: dict[str, int] = {}
        node_of_op: dict[int, int] = {}
        self.places: list[list[tuple[int, int]]] = []
        components: dict[tuple[int, str], int] = {}
        lengths: list[int] = []
        for op in ops:
            key = op.key if isinstance(op, CollectiveOp) else None
            node = node_of_key.get(key) if key is not None else None
            if node is None:
                node = len(self.places)
                self.places.append([])
                if key is not None:
                    node_of_key[key] = node
            node_of_op[op.id] = node
            if op.stream not in async_streams:
                component = components.setdefault((op.rank, op.stream), len(components))
                if component == len(lengths):
                    lengths.append(0)
                self.places[node].append((component, lengths[component]))
                lengths[component] += 1
        count = len(self.places)
        predecessors: list[set[int]] = [set() for _ in range(count)]
        last_on: dict[int, int] = {}
        for op in ops:
            node = node_of_op[op.id]
            predecessors[node].update(node_of_op[dep] for dep in op.deps)
            if op.stream not in async_streams:
                component = components[(op.rank, op.stream)]
                previous = last_on.get(component)
                if previous is not None and previous != node:
                    predecessors[node].add(previous)
                last_on[component] = node
        successors: list[list[int]] = [[] for _ in range(count)]
        waiting = [0] * count
        for node, before in enumerate(predecessors):
            before.discard(node)
            waiting[node] = len(before)
            for other in before:
                successors[other].append(node)
        clocks = np.full((count, len(components)), -1, dtype=np.int32)
        ready = deque(node for node in range(count) if not waiting[node])
        while ready:
            node = ready.popleft()
            before = predecessors[node]
            if len(before) == 1:
                clocks[node] = clocks[next(iter(before))]
            elif before:
                clocks[node] = clocks[list(before)].max(axis=0)
            for component, position in self.places[node]:
                clocks[node, component] = position
            for other in successors[node]:
                waiting[other] -= 1
                if not waiting[other]:
                    ready.append(other)
        self.clocks = clocks
        self.node_of_key = node_of_key
        self.node_of_op = node_of_op
        self._successors = successors
        self._reach: dict[int, tuple[list[tuple[int, int]], frozenset[int]]] = {}

    def _reach_of(self, node: int) -> tuple[list[tuple[int, int]], frozenset[int]]:
        """(component, position) pairs whose op is ``node`` itself, or for an asynchronous node the first
        in-order ops after it, and the asynchronous nodes reached on the way: B is reachable from ``node``
        exactly when it is one of those or reachable from one of the pairs."""
        found = self._reach.get(node)
        if found is None:
            if self.places[node]:
                found = (self.places[node][:1], frozenset())
            else:
                marks: list[tuple[int, int]] = []
                passed: set[int] = set()
                for after in self._successors[node]:
                    after_marks, after_passed = self._reach_of(after)
                    marks += after_marks
                    passed |= after_passed
                    if not self.places[after]:
                        passed.add(after)
                found = (marks, frozenset(passed))
            self._reach[node] = found
        return found

    def before(self, a: int, b: int) -> bool:
        """Node ``a`` finishes before node ``b`` starts in every run."""
        if a == b:
            return False
        marks, passed = self._reach_of(a)
        clock = self.clocks[b]
        return b in passed or any(clock[component] >= position for component, position in marks)

    def concurrent(self, a: int, b: int) -> bool:
        """Nodes ``a`` and ``b`` may overlap in time."""
        return a != b and not self.before(a, b) and not self.before(b, a)
