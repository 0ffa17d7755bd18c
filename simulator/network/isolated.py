"""A collective's plan run alone on an idle network, with arrays instead of one Python object per flow.

The engine times a private collective once on an idle network and replays it (engine/sharing.py). For a
collective over 16,384 GPUs that one run has 131,072 flows, and the event-by-event `Network` spends most of
its time on per-flow bookkeeping (objects, heaps, link sets). This module follows the same rules step for
step over numpy arrays: a transfer waits its latency, then shares its links max-min fairly with the active
flows; rates are re-solved once per instant for the flows connected to the links that changed (the union of
components `Network` solves, grouped by route in the same order, so the same floating-point operations give
the same rates); a flow finishes when its remaining bytes run out, within `FINISH_TOLERANCE` of its size, at
the wake-up time `Network` would schedule. Its rows and times equal those of `Network` to the last bit
(tests/test_isolated.py); the cost is a few numpy passes per instant, so it is used for large phases only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.collectives.execute import PhaseArrays, phase_arrays
from simulator.collectives.phases import Phase
from simulator.metrics.events import FlowBlock, FlowRoutes
from simulator.network.maxmin import Incidence, distinct
from simulator.network.model import FINISH_TOLERANCE
from simulator.topology.graph import Topology

LARGE_PHASE = 512
"""Transfers in a phase from which the array form is faster than the event-by-event network."""


@dataclass(frozen=True)
class IsolatedRun:
    """The flow rows of a plan run alone, in the order `Network` logs them, and the plan's duration."""

    rows: FlowBlock
    duration_s: float


class _Rows:
    """The flow rows logged so far, a block of rows per instant at which flows finished."""

    def __init__(self) -> None:
        self.blocks: list[tuple[PhaseArrays, np.ndarray, float, float]] = []

    def log(self, arrays: PhaseArrays, rows: np.ndarray, posted_s: float, end_s: float) -> None:
        """Log transfers ``rows`` of ``arrays``, posted at ``posted_s``, ending at ``end_s``."""
        if rows.size:
            self.blocks.append((arrays, rows, posted_s, end_s))

    def run(self, duration_s: float) -> IsolatedRun:
        """The rows as columns, the plan's duration ``duration_s``."""
        blocks = self.blocks

        def joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts or [np.empty(0, dtype=dtype)])

        flows = FlowBlock.of(joined([arrays.src[rows] for arrays, rows, _, _ in blocks], np.int64),
                             joined([arrays.dst[rows] for arrays, rows, _, _ in blocks], np.int64),
                             joined([np.full(rows.size, posted) for _, rows, posted, _ in blocks], float),
                             joined([np.full(rows.size, end) for _, rows, _, end in blocks], float),
                             joined([arrays.nbytes[rows] for arrays, rows, _, _ in blocks], float),
                             FlowRoutes.joined([FlowRoutes.of_matrix(arrays.routes[rows])
                                                for arrays, rows, _, _ in blocks]))
        return IsolatedRun(rows=flows, duration_s=duration_s)


def is_large(phases: list[Phase]) -> bool:
    """Whether a plan has a phase large enough for the array form to pay."""
    return any(len(phase.transfers) >= LARGE_PHASE for phase in phases)


def run_isolated(topology: Topology, capacity: np.ndarray, phases: list[Phase]) -> IsolatedRun:
    """Run ``phases`` back to back from time 0 on an otherwise idle network of link ``capacity`` (bytes/s)."""
    rows = _Rows()
    now = 0.0
    for phase in phases:
        if phase.transfers:
            now = _Phase(phase_arrays(topology, phase), capacity).run(now, rows)
    return rows.run(now)


class _Phase:
    """The transfers of one phase as arrays: sizes, latencies, routes (as ids into a table of distinct
    routes, in first-seen order, and as a flow-link incidence list)."""

    def __init__(self, arrays: PhaseArrays, capacity: np.ndarray):
        self.arrays = arrays
        self.capacity = capacity
        routes = arrays.routes
        self.nbytes = arrays.nbytes
        self.latency = arrays.latency.tolist()
        self.route_of, firsts = first_seen_rows(routes)
        table = FlowRoutes.of_matrix(routes[firsts])
        self.incidence = without_shadowed_links(Incidence.of(table.lengths, table.links), capacity)
        self.empty = (self.nbytes <= 0) | (self.incidence.lengths[self.route_of] == 0)

    def run(self, posted: float, log: _Rows) -> float:
        """Post the phase at ``posted``; return the time its last transfer finished."""
        count = self.nbytes.size
        arrival = np.array([posted + latency if latency > 0 else posted for latency in self.latency])
        arrivals = sorted(set(arrival.tolist()))
        active = np.zeros(count, dtype=bool)
        state = _FlowState(count, self.nbytes)
        left, end = count, posted
        wake_due: float | None = None
        wake_at = np.inf
        while left:
            now = min(arrivals[0] if arrivals else np.inf, wake_at)
            touched = np.zeros(self.incidence.links.size, dtype=bool)
            if arrivals and arrivals[0] == now:
                arrivals.pop(0)
                arriving = arrival == now
                empties = np.flatnonzero(arriving & self.empty)
                log.log(self.arrays, empties, posted, now)
                left -= empties.size
                end = now if empties.size else end
                starting = arriving & ~self.empty
                state.last_update[starting] = now
                active |= starting
                touched[self._links_of(starting)] = True
            if wake_at == now:
                done = np.flatnonzero(active & (state.ready <= wake_due))
                done = done[np.lexsort((done, state.ready[done]))]
                active[done] = False
                state.ready[done] = state.finish[done] = np.inf
                touched[self._links_of(done)] = True
                log.log(self.arrays, done, posted, now)
                left -= done.size
                end = now
                wake_due, wake_at = None, np.inf
            component = self._component(touched, active)
            if component.size:
                self._resolve(component, state, now)
            if active.any():
                due = float(state.finish[active].min())
                if due != wake_due:
                    wake_due, wake_at = due, now + max(due - now, 0.0)
            else:
                wake_due, wake_at = None, np.inf
        return end

    def _links_of(self, flows: np.ndarray) -> np.ndarray:
        """The links (compact ids of the phase's incidence) that ``flows`` (a mask or indices) cross."""
        incidence = self.incidence
        return incidence.entry_link[incidence.entries_of(distinct(self.route_of[flows], incidence.lengths.size))]

    def _component(self, touched: np.ndarray, active: np.ndarray) -> np.ndarray:
        """Active flows connected to the ``touched`` links (compact ids) through shared links, in posting order: a
        search over the phase's routes (a flow's links are its route's), which visits each link and each route
        once."""
        incidence = self.incidence
        routes = incidence.lengths.size
        unfound = np.zeros(routes, dtype=bool)
        unfound[self.route_of[active]] = True
        left = int(np.count_nonzero(unfound))
        seen = touched.copy()
        frontier = np.flatnonzero(seen)
        while frontier.size and left:
            reached = incidence.groups_on(frontier)
            fresh = distinct(reached[unfound[reached]], routes)
            unfound[fresh] = False
            left -= fresh.size
            ahead = np.zeros(seen.size, dtype=bool)
            ahead[incidence.entry_link[incidence.entries_of(fresh)]] = True
            frontier = np.flatnonzero(ahead & ~seen)
            seen[frontier] = True
        return np.flatnonzero(active & ~unfound[self.route_of])

    def _resolve(self, component: np.ndarray, state: _FlowState, now: float) -> None:
        """Max-min rates of ``component`` grouped by route, as `Network._resolve` does (the rates depend on the
        groups' routes and sizes, not their order); flows whose rate changes are brought up to date."""
        route = self.route_of[component]
        rates = self.incidence.rates(np.bincount(route, minlength=self.incidence.lengths.size), self.capacity)[route]
        old = state.rate[component]
        changed = rates != old
        flows, new, old = component[changed], rates[changed], old[changed]
        state.remaining[flows] = np.maximum(state.remaining[flows] - old * (now - state.last_update[flows]), 0.0)
        state.last_update[flows] = now
        state.rate[flows] = new
        state.finish[flows] = now + state.remaining[flows] / new
        state.ready[flows] = state.finish[flows] - FINISH_TOLERANCE * self.nbytes[flows] / new


def without_shadowed_links(incidence: Incidence, capacity: np.ndarray) -> Incidence:
    """``incidence`` without the links that cross the same routes as another of no more capacity (a GPU's PCIe
    link to its NIC carries the same flows as the NIC's narrower link to its leaf, and is the one dropped): such
    a link has the same load as that one and, its capacity no less, never a smaller share, so it never
    saturates alone, nor joins or parts a component, and the solves and searches are the same without it, to
    the last bit (a third fewer link crossings in an all-to-all over DGX H100 hosts). Links whose routes only
    hash alike are kept."""
    routes_on = incidence.entry_group[incidence.by_link].astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = (routes_on + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        signature = np.add.reduceat(mixed ^ (mixed >> np.uint64(29)), incidence.link_start[:-1])
    counts = np.diff(incidence.link_start)
    order = np.lexsort((capacity[incidence.links], counts, signature))
    kept = np.ones(incidence.links.size, dtype=bool)
    starts = incidence.link_start
    leader = int(order[0]) if order.size else 0
    for link in order[1:].tolist():
        if signature[link] != signature[leader] or counts[link] != counts[leader]:
            leader = link
        elif np.array_equal(routes_on[starts[leader]:starts[leader + 1]], routes_on[starts[link]:starts[link + 1]]):
            kept[link] = False
    if kept.all():
        return incidence
    entries = kept[incidence.entry_link]
    return Incidence.of(np.bincount(incidence.entry_group[entries], minlength=incidence.lengths.size),
                        incidence.links[incidence.entry_link[entries]])


def first_seen_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row of ``matrix`` (integers) numbered by the first appearance of its value among the rows, and
    where each number's first row is. The rows are sorted by a 64-bit hash of their values rather than the
    values themselves (the rows of a 16k-GPU ring's routes: 131k of them, 8 wide), and compared afterwards:
    should two different rows share a hash, by their values."""
    _, first, inverse = np.unique(row_hashes(matrix), return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not np.array_equal(matrix, matrix[first[inverse]]):
        rows = np.ascontiguousarray(matrix).view(np.dtype((np.void, matrix.dtype.itemsize * matrix.shape[1])))
        _, first, inverse = np.unique(rows.reshape(-1), return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse], first[order]


def row_hashes(matrix: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of ``matrix`` (FNV-1a over its values)."""
    mixed = np.full(matrix.shape[0], 0xCBF29CE484222325, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in matrix.T:
            mixed = (mixed ^ column.astype(np.uint64)) * np.uint64(0x100000001B3)
    return mixed


class _FlowState:
    """Per flow: rate, bytes left as of ``last_update``, and the finish and ready times of its current rate."""

    def __init__(self, count: int, nbytes: np.ndarray):
        self.rate = np.zeros(count)
        self.remaining = nbytes.copy()
        self.last_update = np.zeros(count)
        self.finish = np.full(count, np.inf)
        self.ready = np.full(count, np.inf)
