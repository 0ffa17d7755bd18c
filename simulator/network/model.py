"""The network model a SimPy run sends its transfers through: flows sharing directed links max-min fairly.

A transfer first waits its latency without using bandwidth, then becomes a fluid flow of its bytes. In
``flow`` mode the rates of all active flows (of every phase and collective) are max-min fair on every
directed link and are re-solved only when flows start or end, only for the flows connected to the change
through shared links, and once per simulated instant however many flows changed. In ``analytic`` mode a
transfer never waits for others: it takes its latency plus its bytes over its path's bottleneck capacity.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from itertools import chain, count
from operator import attrgetter, itemgetter

import numpy as np
import simpy
from simpy.events import NORMAL, EventPriority

from simulator.errors import ScenarioError
from simulator.metrics.events import EventLog
from simulator.network.maxmin import grouped_max_min_rates
from simulator.network.modes import NetworkMode
from simulator.topology.graph import LINK_CLASSES, Topology

FINISH_TOLERANCE = 1e-9
"""A flow whose remaining bytes are within this fraction of its size has finished (no float-dust events)."""
SOLVED_ENTRIES = 1 << 22
"""Group rates remembered over all the solved components kept for reuse (forgotten all at once when full, or
when a capacity changes): an entry holds a rate (8 bytes) and its key's group number and size (8 bytes each, and
the number's int), so the memory stays under ~0.25 GB."""
CACHED_GROUPS = 4096
"""Largest component whose solve is remembered: larger ones (unfolded all-to-alls over spines, of 60 k-1 M
groups) would fill the memory and seldom meet the same sizes again."""
_AFTER_NORMAL_EVENTS = EventPriority(NORMAL + 1)
"""SimPy priority that sorts after its NORMAL (1): the batched re-solve runs once the instant has settled."""


class _Phase:
    """The transfers of one ``run_phase`` call still running, and the event that fires when none is."""

    __slots__ = ("event", "key", "pending")

    def __init__(self, event: simpy.Event, pending: int, key: str):
        self.event = event
        self.pending = pending
        self.key = key


class _Flow:
    """An active transfer: bytes left as of ``last_update`` at ``rate``, due at ``finish`` (done from
    ``ready``, within tolerance); ``version`` ages its heap entries. It contends on the links of ``path`` (as
    a member of ``group``) and is logged with ``route`` (the same unless a quotient maps it). ``twins`` are
    transfers of the same phase with the same path, bytes and latency: they would keep this flow's state to
    the last bit, so they ride along with it (one flow to solve, update and finish; logged one by one)."""

    __slots__ = (
        "channel",
        "dst",
        "finish",
        "group",
        "last_update",
        "nbytes",
        "path",
        "phase",
        "posted_s",
        "rate",
        "ready",
        "remaining",
        "route",
        "seq",
        "src",
        "twins",
        "version",
    )
    group: _PathGroup

    def __init__(self, seq: int, path: tuple[int, ...], nbytes: float, phase: _Phase, posted_s: float,
                 src: int, dst: int, channel: int = 0, route: tuple[int, ...] | None = None):
        self.seq = seq
        self.channel = channel
        self.path = path
        self.route = path if route is None else route
        self.nbytes = nbytes
        self.remaining = nbytes
        self.rate = 0.0
        self.last_update = posted_s
        self.finish = self.ready = math.inf
        self.version = 0
        self.phase = phase
        self.posted_s = posted_s
        self.src = src
        self.dst = dst
        self.twins: list[_Flow] = []

    def split(self) -> list[_Flow]:
        """This flow and its twins as flows of their own, each in this flow's state (they go separate ways)."""
        twins, self.twins = self.twins, []
        for twin in twins:
            twin.remaining, twin.last_update, twin.rate = self.remaining, self.last_update, self.rate
            twin.finish, twin.ready = self.finish, self.ready
        return [self, *twins]


class _PathGroup:
    """The active flows contending on one path. Max-min fairness gives them one ``rate``, so a group, not
    each flow, is registered on the links, reached by a component search and solved. A group lives as long
    as the network (its ``number`` orders a component's groups the same way whenever they meet again);
    ``weight`` counts its transfers (flows and their twins); ``joined`` holds the flows added since the last
    solve, the only ones whose rate may differ from it. A group lives while it has flows, and an idle one until
    the remembered solves are forgotten; its ``number`` is never reused (a component's groups are ordered and
    remembered by their numbers)."""

    __slots__ = ("flows", "joined", "number", "path", "rate", "weight")

    def __init__(self, number: int, path: tuple[int, ...]):
        self.number = number
        self.path = path
        self.flows: set[_Flow] = set()
        self.joined: list[_Flow] = []
        self.rate = 0.0
        self.weight = 0


class _EndOfInstant(simpy.Event):
    """An event processed after every ordinary event already due at the current simulated time."""

    def __init__(self, env: simpy.Environment):
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, _AFTER_NORMAL_EVENTS)


class Network:
    """Transfers over a compiled ``Topology``; ``efficiency`` scales each link class's bandwidth.

    Counters for benchmarks: ``flows_simulated`` (transfers posted), ``resolves`` (components re-solved),
    ``resolved_flows`` (transfers summed over all of them, i.e. the work the solves did), ``max_min_solves``
    (the resolves not answered by an earlier solve of the same component) and ``wake_ups`` (completion
    instants processed).
    """

    def __init__(self, env: simpy.Environment, topology: Topology, *, efficiency: Mapping[str, float] | None = None,
                 mode: NetworkMode = "flow", log: EventLog | None = None):
        self.env = env
        self.topology = topology
        self.mode = mode
        self.log = log
        self.capacity = effective_capacity(topology, efficiency or {})
        self.flows_simulated = 0
        self.resolves = 0
        self.resolved_flows = 0
        self.max_min_solves = 0
        self.wake_ups = 0
        self._bottleneck: dict[tuple[int, ...], float] = {}
        self._groups: dict[tuple[int, ...], _PathGroup] = {}
        self._link_groups: dict[int, set[_PathGroup]] = {}
        self._solved: dict[tuple[tuple[int, ...], tuple[int, ...]], array[float]] = {}
        self._solved_entries = 0
        self._group_numbers = count()
        self._active = 0
        self._starting: list[_Flow] = []
        self._touched_groups: set[_PathGroup] = set()
        self._touched_links: set[int] = set()
        self._batch_pending = False
        self._by_ready: list[tuple[float, int, int, _Flow]] = []
        self._wake_time: float | None = None
        self._wake_version = 0
        self._down: set[int] = set()

    def transfer(self, path: tuple[int, ...], nbytes: float, latency: float = 0.0, *, src: int = -1,
                 dst: int = -1, key: str = "") -> simpy.Event:
        """One transfer: an event that succeeds when ``nbytes`` have crossed ``path`` after ``latency``."""
        return self.run_phase(((path, nbytes, latency, src, dst),), key=key)

    def run_phase(self, transfers: Sequence[tuple], *, key: str = "") -> simpy.Event:
        """Start a batch of transfers now; the event succeeds when all of them have finished.

        Each item is a plain tuple, ``nbytes`` over the directed link ids ``path`` after ``latency`` seconds:
        ``(path, nbytes, latency)``; ``(path, nbytes, latency, src, dst)``, whose global GPU indices label the
        event-log row; ``(path, nbytes, latency, src, dst, channel)``, which a failed link on ``path`` can
        route again; or ``(route, nbytes, latency, src, dst, channel, contends)``, a folded run's replica
        quotient (engine/replicas.py): the flow shares the links of ``contends`` (its route's orbit
        representatives) and is logged with ``route``. A transfer with no bytes, or with an empty path (a GPU
        to itself), finishes right after its latency.
        """
        if not transfers:
            return self.env.event().succeed()
        if self.mode == "analytic":
            return self._run_analytic(transfers, key)
        phase = _Phase(self.env.event(), len(transfers), key)
        now = self.env.now
        by_latency: dict[float, list[_Flow]] = {}
        twin_of: dict[tuple[float, tuple[int, ...], float], _Flow] = {}
        seq = self.flows_simulated
        for item in transfers:
            route = None
            if len(item) == 7:
                route, nbytes, latency, src, dst, channel, path = item
            elif len(item) == 6:
                path, nbytes, latency, src, dst, channel = item
            else:
                path, nbytes, latency = item[:3]
                src, dst = (item[3], item[4]) if len(item) >= 5 else (-1, -1)
                channel = 0
            flow = _Flow(seq, tuple(path), float(nbytes), phase, now, src, dst, channel, route)
            seq += 1
            if flow.nbytes > 0 and flow.path:
                first = twin_of.setdefault((latency, flow.path, flow.nbytes), flow)
                if first is not flow:
                    first.twins.append(flow)
                    continue
            flows = by_latency.get(latency)
            if flows is None:
                flows = by_latency[float(latency)] = []
            flows.append(flow)
        self.flows_simulated = seq
        for latency, flows in by_latency.items():
            if latency > 0:
                self.env.timeout(latency).callbacks.append(partial(self._on_latency_over, flows))
            else:
                self._begin(flows)
        return phase.event

    def _run_analytic(self, transfers: Sequence[tuple], key: str) -> simpy.Event:
        """Contention-free phase: each transfer takes latency + bytes / bottleneck capacity."""
        now = self.env.now
        durations = []
        for item in transfers:
            path, nbytes = tuple(item[0]), float(item[1])
            busy = nbytes / self._bottleneck_of(path) if nbytes > 0 and path else 0.0
            durations.append(float(item[2]) + busy)
        self.flows_simulated += len(transfers)
        done = self.env.timeout(max(durations))
        log = self.log
        if log is not None:
            def record(_event: simpy.Event) -> None:
                for item, duration in zip(transfers, durations):
                    src, dst = (item[3], item[4]) if len(item) >= 5 else (-1, -1)
                    log.flow(key, src, dst, now, now + duration, float(item[1]), tuple(item[0]))
            done.callbacks.append(record)
        return done

    def _bottleneck_of(self, path: tuple[int, ...]) -> float:
        bottleneck = self._bottleneck.get(path)
        if bottleneck is None:
            bottleneck = self._bottleneck[path] = float(self.capacity[list(path)].min())
        return bottleneck

    def _on_latency_over(self, flows: list[_Flow], _event: simpy.Event) -> None:
        self._begin(flows)

    def _begin(self, flows: list[_Flow]) -> None:
        """Make ``flows`` active now (or finish the empty ones) and ask for one re-solve at this instant."""
        now = self.env.now
        for flow in flows:
            if flow.nbytes <= 0 or not flow.path:
                self._finish(flow, now)
            elif self._down and not self._down.isdisjoint(flow.path):
                for member in flow.split():
                    member.path = member.route = self.topology.path(member.src, member.dst, member.channel)
                    member.last_update = now
                    self._starting.append(member)
            else:
                flow.last_update = now
                self._starting.append(flow)
        if self._starting:
            self._request_batch()

    def scale_capacity(self, links: Sequence[int], fraction: float) -> None:
        """From now on ``links`` keep ``fraction`` of their capacity; the flows crossing them are re-solved.
        The network takes its own copy of the capacities (the topology's are shared between runs)."""
        if not self.capacity.flags.writeable:
            self.capacity = self.capacity.copy()
        self.capacity[list(links)] *= fraction
        self._bottleneck.clear()
        self._forget_solves()
        self._touched_links.update(links)
        self._request_batch()

    def take_down(self, links: Sequence[int]) -> None:
        """``links`` failed (the topology already routes around them): flows in flight on them continue on
        their new route with the bytes they have left; flows still in their latency are rerouted as they start."""
        self._down.update(links)
        self._bottleneck.clear()
        moving = {flow for link in links for group in self._link_groups.get(link, ()) for flow in group.flows}
        now = self.env.now
        members = []
        for flow in moving:
            flow.remaining = max(flow.remaining - flow.rate * (now - flow.last_update), 0.0)
            flow.last_update = now
            self._unlink(flow)
            twins = flow.twins
            members.extend(flow.split())
            for twin in twins:
                heapq.heappush(self._by_ready, (twin.ready, twin.seq, twin.version, twin))
            self._active += len(twins)
        for flow in sorted(members, key=attrgetter("seq")):
            flow.path = flow.route = self.topology.path(flow.src, flow.dst, flow.channel)
            self._join(flow)
        self._request_batch()

    def _request_batch(self) -> None:
        if not self._batch_pending:
            self._batch_pending = True
            _EndOfInstant(self.env).callbacks.append(self._apply_batch)

    def _apply_batch(self, _event: simpy.Event) -> None:
        """Register the flows that started, re-solve the component the changes touched, re-arm the wake-up."""
        self._batch_pending = False
        for flow in self._starting:
            self._join(flow)
        self._active += len(self._starting)
        self._starting = []
        seeds = self._touched_links
        seeds.update(chain.from_iterable(group.path for group in self._touched_groups))
        self._touched_links = set()
        self._touched_groups = set()
        component = self._component(seeds)
        if component:
            self._resolve(component)
        self._arm_wake_up()

    def _join(self, flow: _Flow) -> None:
        """Add ``flow`` to the group of its path (registering the group on its links if it was idle)."""
        group = self._groups.get(flow.path)
        if group is None:
            group = self._groups[flow.path] = _PathGroup(next(self._group_numbers), flow.path)
        if not group.flows:
            link_groups = self._link_groups
            for link in group.path:
                members = link_groups.get(link)
                if members is None:
                    link_groups[link] = {group}
                else:
                    members.add(group)
        group.flows.add(flow)
        group.weight += 1 + len(flow.twins)
        group.joined.append(flow)
        flow.group = group
        self._touched_groups.add(group)

    def _component(self, seeds: set[int]) -> list[_PathGroup]:
        """Active groups connected to links ``seeds`` through shared links, in the order of their numbers: the
        groups on the seeds, then depth first through the links not seen yet."""
        link_groups = self._link_groups
        found: set[_PathGroup] = set().union(*filter(None, map(link_groups.get, seeds)))
        unexplored = list(found)
        seen = seeds
        while unexplored:
            for link in unexplored.pop().path:
                if link not in seen:
                    seen.add(link)
                    for group in link_groups[link]:
                        if group not in found:
                            found.add(group)
                            unexplored.append(group)
        return sorted(found, key=attrgetter("number"))

    def _resolve(self, component: list[_PathGroup]) -> None:
        """New max-min rates for ``component``; only flows whose rate changes are brought up to date.

        The rates depend only on the groups' paths and sizes (the solve sums whole flow counts and takes
        minima, so the order of the groups does not move a bit): a component seen before with the same
        sizes reuses its rates, as the repeated steps of a training run meet the same components again.
        """
        self.resolves += 1
        sizes = tuple(group.weight for group in component)
        self.resolved_flows += sum(sizes)
        kept = len(component) <= CACHED_GROUPS
        key = (tuple(group.number for group in component), sizes)
        group_rates = self._solved.get(key) if kept else None
        if group_rates is None:
            self.max_min_solves += 1
            group_rates = array("d", grouped_max_min_rates([group.path for group in component],
                                                           np.array(sizes, dtype=float), self.capacity).tobytes())
            if kept:
                if self._solved_entries + len(component) > SOLVED_ENTRIES:
                    self._forget_solves()
                self._solved[key] = group_rates
                self._solved_entries += len(component)
        now = self.env.now
        push, by_ready = heapq.heappush, self._by_ready
        for group, rate in zip(component, group_rates):
            if rate != group.rate:
                group.rate = rate
                changed: Iterable[_Flow] = group.flows
            elif group.joined:
                changed = [flow for flow in group.joined if flow in group.flows]
            else:
                continue
            group.joined = []
            for flow in changed:
                if rate == flow.rate:
                    continue
                flow.remaining = max(flow.remaining - flow.rate * (now - flow.last_update), 0.0)
                flow.last_update = now
                flow.rate = rate
                flow.version = version = flow.version + 1
                flow.finish = finish = now + flow.remaining / rate
                flow.ready = finish - FINISH_TOLERANCE * flow.nbytes / rate
                push(by_ready, (flow.ready, flow.seq, version, flow))
        if len(self._by_ready) > 4 * self._active + 1024:
            self._by_ready = self._fresh(self._by_ready)

    def _forget_solves(self) -> None:
        """Forget the remembered solves, and with them the idle path groups (their numbers were kept for those
        solves' keys; a path used again gets a new group)."""
        self._solved.clear()
        self._solved_entries = 0
        self._groups = {path: group for path, group in self._groups.items() if group.flows}

    @staticmethod
    def _fresh(heap: list[tuple[float, int, int, _Flow]]) -> list[tuple[float, int, int, _Flow]]:
        """The heap without entries made stale by a rate change or a finished flow."""
        live = [entry for entry in heap if entry[2] == entry[3].version]
        heapq.heapify(live)
        return live

    def _arm_wake_up(self) -> None:
        """Make sure exactly one live wake-up is scheduled, at the earliest finish time."""
        heap = self._by_ready
        while heap and heap[0][2] != heap[0][3].version:
            heapq.heappop(heap)
        if not heap:
            self._wake_time = None
            return
        finish = self._earliest_finish()
        if finish != self._wake_time:
            self._wake_time = finish
            self._wake_version += 1
            delay = max(finish - self.env.now, 0.0)
            self.env.timeout(delay).callbacks.append(partial(self._on_wake_up, self._wake_version, finish))

    def _earliest_finish(self) -> float:
        """The earliest finish time of the live flows, read off the ready-time heap (its top is live): a flow
        is ready before it finishes, so only entries ready before the best finish found so far can beat it,
        and a heap walk stops below any other entry (usually only the flows due at that instant are seen)."""
        heap = self._by_ready
        best = heap[0][3].finish
        size = len(heap)
        unexplored = [1, 2]
        while unexplored:
            index = unexplored.pop()
            if index < size:
                ready, _, version, flow = heap[index]
                if ready < best:
                    if version == flow.version and flow.finish < best:
                        best = flow.finish
                    unexplored += (2 * index + 1, 2 * index + 2)
        return best

    def _on_wake_up(self, version: int, due: float, _event: simpy.Event) -> None:
        """Finish every flow within tolerance of done at the wake-up time ``due``; stale wake-ups (an earlier
        ``version``) do nothing."""
        if version != self._wake_version:
            return
        self.wake_ups += 1
        self._wake_time = None
        now = self.env.now
        heap = self._by_ready
        done: list[tuple[float, int, _Flow]] = []
        with_twins = False
        while heap and heap[0][0] <= due:
            ready, seq, version, flow = heapq.heappop(heap)
            if version != flow.version:
                continue
            self._unlink(flow)
            self._active -= 1
            done.append((ready, seq, flow))
            if flow.twins:
                with_twins = True
                done.extend((ready, twin.seq, twin) for twin in flow.twins)
        if with_twins:
            done.sort(key=itemgetter(0, 1))
        for _, _, flow in done:
            self._finish(flow, now)
        self._request_batch()

    def _unlink(self, flow: _Flow) -> None:
        """Take ``flow`` out of its group, and an emptied group off its links (re-solved at the end of the
        instant)."""
        group = flow.group
        group.flows.discard(flow)
        group.weight -= 1 + len(flow.twins)
        if not group.flows:
            group.joined = []
            link_groups = self._link_groups
            for link in group.path:
                members = link_groups[link]
                members.discard(group)
                if not members:
                    del link_groups[link]
        self._touched_groups.add(group)

    def _finish(self, flow: _Flow, now: float) -> None:
        flow.version = -1
        if self.log is not None:
            self.log.flow(flow.phase.key, flow.src, flow.dst, flow.posted_s, now, flow.nbytes, flow.route)
        phase = flow.phase
        phase.pending -= 1
        if phase.pending == 0:
            phase.event.succeed()


def effective_capacity(topology: Topology, efficiency: Mapping[str, float]) -> np.ndarray:
    """Each directed link's usable bytes/s: its bandwidth times its class's efficiency (default 1); computed
    once per topology and profile (every isolated replay builds a Network of its own)."""
    for link_class, value in efficiency.items():
        field = f"network.efficiency.{link_class}"
        if link_class not in LINK_CLASSES:
            raise ScenarioError(f"unknown link class {link_class!r}", field=field, allowed=", ".join(LINK_CLASSES))
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
            raise ScenarioError(f"efficiency {value!r} is out of range", field=field, allowed="a number in (0, 1]")
    profile = tuple(sorted(efficiency.items()))
    cached = topology.capacities.get(profile)
    if cached is not None:
        return cached
    scale = np.array([efficiency.get(c, 1.0) for c in topology.link_class], dtype=float)
    capacity = topology.capacities[profile] = topology.link_bandwidth * scale
    capacity.setflags(write=False)
    return capacity
