"""Happens-before between the collectives of a program: which instances can never run at the same time.

A program is a DAG: every op waits for its dependencies and, on an in-order stream, for the op before it; a
collective (one `key`, an op on every simulated member) completes for all members at once, so it is one node
whose predecessors are those of all its member ops. Instance A happens before instance B when B is reachable
from A: A's flows have all finished before any of B's start, in every run, whatever the durations.

Reachability is answered with vector clocks: one component per in-order (rank, stream) of the program, and per
node the latest position on each component that it is reachable from. Ops on asynchronous streams have no
position of their own; an asynchronous collective happens before B when one of the first in-order ops after
it does (or is B).

Most nodes only continue the stream they are on (one predecessor, the op before them), so their clock is that
op's with their own position moved on: such a node keeps a reference to a shared row of clocks plus its own
places, and a row is written only where streams join (about one node in ten in a folded training step).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from simulator.program.ops import CollectiveOp, Op

MAX_CLOCK_ENTRIES = 1 << 24
"""Largest nodes x components table allowed (the rows written are at most one per node); beyond it (unfolded
runs of many ranks) no ordering."""


class Ordering:
    """Vector clocks of a program's nodes (compute ops, and collectives by key), built once in O(ops) plus
    O(components) per join of streams."""

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
        count = len(places)
        successors: list[list[int]] = [[] for _ in range(count)]
        waiting = [0] * count
        for node, before in enumerate(predecessors):
            before.discard(node)
            waiting[node] = len(before)
            for other in before:
                successors[other].append(node)
        self.places = places
        self._rows: list[list[int]] = [[-1] * len(components)]
        self._row_of = [0] * count
        ready = deque(node for node in range(count) if not waiting[node])
        while ready:
            node = ready.popleft()
            self._row_of[node] = self._clock_row(node, predecessors[node])
            for other in successors[node]:
                waiting[other] -= 1
                if not waiting[other]:
                    ready.append(other)
        self.node_of_key = node_of_key
        self.node_of_op = node_of_op
        self._successors = successors
        self._reach: dict[int, tuple[list[tuple[int, int]], frozenset[int]]] = {}

    def _clock_row(self, node: int, before: set[int]) -> int:
        """The row of ``node``'s clock without its own places: its only predecessor's row when that one's own
        places are all on streams ``node`` continues (a later position overrides them), else a new row, the
        latest of its predecessors' full clocks."""
        if not before:
            return 0
        if len(before) == 1:
            (only,) = before
            inherited, own = self.places[only], self.places[node]
            if not inherited or (len(inherited) == 1 and len(own) == 1 and inherited[0][0] == own[0][0]):
                return self._row_of[only]
            components = {component for component, _ in own}
            if all(component in components for component, _ in inherited):
                return self._row_of[only]
        self._rows.append(list(map(max, *(self._full_clock(other) for other in before)))
                          if len(before) > 1 else self._full_clock(next(iter(before))))
        return len(self._rows) - 1

    def _full_clock(self, node: int) -> list[int]:
        clock = list(self._rows[self._row_of[node]])
        for component, position in self.places[node]:
            clock[component] = position
        return clock

    def latest(self, node: int, component: int) -> int:
        """The latest position on ``component`` that happens before ``node`` or is ``node`` (-1: none)."""
        for own, position in self.places[node]:
            if own == component:
                return position
        return self._rows[self._row_of[node]][component]

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
        return b in passed or any(self.latest(b, component) >= position for component, position in marks)

    def concurrent(self, a: int, b: int) -> bool:
        """Nodes ``a`` and ``b`` may overlap in time."""
        return a != b and not self.before(a, b) and not self.before(b, a)
