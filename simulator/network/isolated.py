"""A collective's plan run alone on an idle network, with arrays instead of one Python object per flow.

The engine times a private collective once on an idle network and replays it (engine/sharing.py). For a
collective over 16,384 GPUs that one run has 131,072 flows, and the event-by-event `Network` spends most of
its time on per-flow bookkeeping (objects, heaps, link sets). This module follows the same rules step for
step over numpy arrays: a transfer waits its latency, then shares its links max-min fairly with the active
flows; rates are re-solved once per instant for the flows connected to the links that changed (the union of
components `Network` solves, grouped by route in the same order, so the same floating-point operations give
the same rates); a flow finishes when its remaining bytes run out, within `FINISH_TOLERANCE` of its size, at
the wake-up time `Network` would schedule. Its rows and times equal those of `Network` to the last bit
(tests/test_network.py); the cost is a few numpy passes per instant, so it is used for large phases only.
"""

from __future__ import annotations

import numpy as np

from simulator.collectives.execute import phase_items
from simulator.collectives.phases import Phase
from simulator.network.maxmin import grouped_max_min_rates
from simulator.network.model import FINISH_TOLERANCE
from simulator.topology.graph import Topology

LARGE_PHASE = 512
"""Transfers in a phase from which the array form is faster than the event-by-event network."""


class IsolatedRun:
    """The flow rows of a plan run alone, in the order `Network` logs them (src, dst, start_s, end_s, bytes,
    routes), and the plan's duration."""

    def __init__(self) -> None:
        self.src: list[int] = []
        self.dst: list[int] = []
        self.start_s: list[float] = []
        self.end_s: list[float] = []
        self.nbytes: list[float] = []
        self.routes: list[tuple[int, ...]] = []
        self.duration_s = 0.0

    def log(self, items: list[tuple], rows: np.ndarray, posted_s: float, end_s: float) -> None:
        """Append the rows of transfers ``items[rows]``, posted at ``posted_s``, ending at ``end_s``."""
        for index in rows.tolist():
            path, nbytes, _, src, dst = items[index][:5]
            self.src.append(src)
            self.dst.append(dst)
            self.start_s.append(posted_s)
            self.end_s.append(end_s)
            self.nbytes.append(float(nbytes))
            self.routes.append(path)


def is_large(phases: list[Phase]) -> bool:
    """Whether a plan has a phase large enough for the array form to pay."""
    return any(len(phase.transfers) >= LARGE_PHASE for phase in phases)


def run_isolated(topology: Topology, capacity: np.ndarray, phases: list[Phase]) -> IsolatedRun:
    """Run ``phases`` back to back from time 0 on an otherwise idle network of link ``capacity`` (bytes/s)."""
    run = IsolatedRun()
    now = 0.0
    for phase in phases:
        items = phase_items(topology, phase)
        if items:
            now = _Phase(items, capacity).run(now, run)
    run.duration_s = now
    return run


class _Phase:
    """The transfers of one phase as arrays: sizes, latencies, routes (as ids into a table of distinct
    routes, and as a flow-link incidence list)."""

    def __init__(self, items: list[tuple], capacity: np.ndarray):
        self.items = items
        self.capacity = capacity
        count = len(items)
        self.nbytes = np.fromiter((float(item[1]) for item in items), dtype=float, count=count)
        self.latency = [float(item[2]) for item in items]
        routes: dict[tuple[int, ...], int] = {}
        self.route_of = np.fromiter((routes.setdefault(tuple(item[0]), len(routes)) for item in items),
                                    dtype=np.int64, count=count)
        self.route_table = list(routes)
        lengths = np.fromiter((len(item[0]) for item in items), dtype=np.int64, count=count)
        self.entry_flow = np.repeat(np.arange(count), lengths)
        self.entry_link = np.fromiter((link for item in items for link in item[0]), dtype=np.int64,
                                      count=int(lengths.sum()))
        self.empty = (self.nbytes <= 0) | (lengths == 0)

    def run(self, posted: float, log: IsolatedRun) -> float:
        """Post the phase at ``posted``; return the time its last transfer finished."""
        count = len(self.items)
        arrival = np.array([posted + latency if latency > 0 else posted for latency in self.latency])
        arrivals = sorted(set(arrival.tolist()))
        active = np.zeros(count, dtype=bool)
        state = _FlowState(count, self.nbytes)
        left, end = count, posted
        wake_due: float | None = None
        wake_at = np.inf
        while left:
            now = min(arrivals[0] if arrivals else np.inf, wake_at)
            touched = np.zeros(self.capacity.size, dtype=bool)
            if arrivals and arrivals[0] == now:
                arrivals.pop(0)
                arriving = arrival == now
                empties = np.flatnonzero(arriving & self.empty)
                log.log(self.items, empties, posted, now)
                left -= empties.size
                end = now if empties.size else end
                starting = arriving & ~self.empty
                state.last_update[starting] = now
                active |= starting
                touched[self.entry_link[starting[self.entry_flow]]] = True
            if wake_at == now:
                done = np.flatnonzero(active & (state.ready <= wake_due))
                done = done[np.lexsort((done, state.ready[done]))]
                active[done] = False
                state.ready[done] = state.finish[done] = np.inf
                finished = np.zeros(count, dtype=bool)
                finished[done] = True
                touched[self.entry_link[finished[self.entry_flow]]] = True
                log.log(self.items, done, posted, now)
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

    def _component(self, touched: np.ndarray, active: np.ndarray) -> np.ndarray:
        """Active flows connected to the ``touched`` links through shared links, in posting order."""
        found = np.zeros(active.size, dtype=bool)
        seen = touched.copy()
        frontier = touched
        while True:
            hit = frontier[self.entry_link] & active[self.entry_flow] & ~found[self.entry_flow]
            if not hit.any():
                break
            fresh = np.zeros(active.size, dtype=bool)
            fresh[self.entry_flow[hit]] = True
            found |= fresh
            frontier = np.zeros(seen.size, dtype=bool)
            frontier[self.entry_link[fresh[self.entry_flow]]] = True
            frontier &= ~seen
            seen |= frontier
        return np.flatnonzero(found)

    def _resolve(self, component: np.ndarray, state: _FlowState, now: float) -> None:
        """Max-min rates of ``component`` grouped by route in first-seen order, as `Network._resolve` does;
        flows whose rate changes are brought up to date."""
        routes, first, inverse = np.unique(self.route_of[component], return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        group = rank[inverse.reshape(-1)]
        weight = np.bincount(group, minlength=order.size).astype(float)
        rates = grouped_max_min_rates([self.route_table[r] for r in routes[order].tolist()], weight,
                                      self.capacity)[group]
        old = state.rate[component]
        changed = rates != old
        flows, new, old = component[changed], rates[changed], old[changed]
        state.remaining[flows] = np.maximum(state.remaining[flows] - old * (now - state.last_update[flows]), 0.0)
        state.last_update[flows] = now
        state.rate[flows] = new
        state.finish[flows] = now + state.remaining[flows] / new
        state.ready[flows] = state.finish[flows] - FINISH_TOLERANCE * self.nbytes[flows] / new


class _FlowState:
    """Per flow: rate, bytes left as of ``last_update``, and the finish and ready times of its current rate."""

    def __init__(self, count: int, nbytes: np.ndarray):
        self.rate = np.zeros(count)
        self.remaining = nbytes.copy()
        self.last_update = np.zeros(count)
        self.finish = np.full(count, np.inf)
        self.ready = np.full(count, np.inf)
