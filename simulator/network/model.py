"""The network model a SimPy run sends its transfers through: flows sharing directed links max-min fairly.

A transfer first waits its latency without using bandwidth, then becomes a fluid flow of its bytes. In
``flow`` mode the rates of all active flows (of every phase and collective) are max-min fair on every
directed link and are re-solved only when flows start or end, only for the flows connected to the change
through shared links, and once per simulated instant however many flows changed. In ``analytic`` mode a
transfer never waits for other work: it takes its latency plus its bytes at its share of its path's links,
each link split among the transfers of its own collective's phase that cross it, with its copies' on the
equivalent ranks where the plan runner gives their load (`analytic_seconds`).
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, count
from operator import attrgetter, itemgetter

import numpy as np
import simpy
from simpy.events import NORMAL, EventPriority

from simulator.config.link_classes import LINK_CLASSES
from simulator.metrics.events import EventLog, FlowBlock, FlowRoutes
from simulator.network.maxmin import Incidence
from simulator.network.modes import NetworkMode
from simulator.topology.graph import Topology

FINISH_TOLERANCE = 1e-9
"""A flow whose remaining bytes are within this fraction of its size has finished (no float-dust events)."""
SOLVED_ENTRIES = 1 << 22
"""Group rates remembered over all the solved components kept for reuse (forgotten all at once when full, or
when a capacity changes): an entry holds a rate, its key's size and the group's number in its component's ident
key, with each solve's and ident's objects shared by its entries: measured 26 bytes an entry on the EP 16 Mixtral
run's components of ~170 groups, up to 390 on components of one group each met once (~1.6 GB when full)."""
MOVE_ENTRIES = 1 << 18
"""Entries of the remembered component moves (`Network._component`), forgotten all at once, and alone, when
full: one per touched group of a move's key and one per position its answer leaves out of its home; measured
48 bytes an entry on the EP 16 Mixtral run, up to 365 on moves of one entry (~95 MB when full)."""
CACHED_GROUPS = 4096
"""Largest component whose solve and moves are remembered: larger ones (unfolded all-to-alls over spines, of
60 k-1 M groups) would fill the memory and seldom meet the same sizes again."""
GROUP_RATES = 1 << 10
"""First length of `Network`'s array of rates by group number, doubled whenever a number passes it."""
_AFTER_NORMAL_EVENTS = EventPriority(NORMAL + 1)
"""SimPy priority that sorts after its NORMAL (1): the batched re-solve runs once the instant has settled."""
_number_of, _weight_of, _path_of = attrgetter("number"), attrgetter("weight"), attrgetter("path")
_seq_of = attrgetter("seq")
_flows_of, _position_of = attrgetter("flows"), attrgetter("position")


class Transfers:
    """A phase's transfers parsed once (see `Network.run_phase` for the item forms): per transfer its path (the
    links it contends on), logged route, bytes, latency and endpoints. ``starts`` lists, by latency in
    first-seen order, the transfers that finish as soon as their latency is over (no bytes or no links) and
    those that start a flow of their own, each with its ``twins``: later transfers of the phase with the same
    path, bytes and latency, which would keep its flow's state to the last bit and so ride along with it. The
    flows are listed in cohorts, one per size in first-seen order: flows that start together with the same
    bytes keep one state for as long as the solves give them equal rates. A plan runner keeps one per phase
    of a collective (or per set of single-phase plans run together) and posts it again each time.
    ``collectives`` says where the transfers of each collective lie (start, stop) where the batch joins several (a
    collective and its mirrors); empty, all are one collective's: the analytic model shares a link among the
    transfers of one collective only."""

    __slots__ = ("channel", "collectives", "count", "dst", "latency", "nbytes", "paths", "routes", "src", "starts")

    def __init__(self, items: Sequence[tuple], collectives: Sequence[tuple[int, int]] = ()):
        self.count = len(items)
        self.collectives = tuple(collectives)
        paths: list[tuple[int, ...]] = []
        routes: list[tuple[int, ...]] = []
        nbytes_of: list[float] = []
        latency_of: list[float] = []
        src_of: list[int] = []
        dst_of: list[int] = []
        channel_of: list[int] = []
        by_latency: dict[float, tuple[list[int], dict[float, list[tuple[int, list[int]]]]]] = {}
        twins_of: dict[tuple[float, tuple[int, ...], float], list[int]] = {}
        for index, item in enumerate(items):
            route = None
            if len(item) == 7:
                route, nbytes, latency, src, dst, channel, path = item
            elif len(item) == 6:
                path, nbytes, latency, src, dst, channel = item
            else:
                path, nbytes, latency = item[:3]
                src, dst = (item[3], item[4]) if len(item) >= 5 else (-1, -1)
                channel = 0
            path, nbytes, latency = tuple(path), float(nbytes), float(latency)
            paths.append(path)
            routes.append(path if route is None else tuple(route))
            nbytes_of.append(nbytes)
            latency_of.append(latency)
            src_of.append(src)
            dst_of.append(dst)
            channel_of.append(channel)
            empty, cohorts = by_latency.setdefault(latency, ([], {}))
            if nbytes > 0 and path:
                twins = twins_of.setdefault((latency, path, nbytes), [])
                twins.append(index)
                if len(twins) == 1:
                    cohorts.setdefault(nbytes, []).append((index, twins))
            else:
                empty.append(index)
        self.paths, self.routes = tuple(paths), tuple(routes)
        self.nbytes, self.latency = tuple(nbytes_of), tuple(latency_of)
        self.src, self.dst, self.channel = tuple(src_of), tuple(dst_of), tuple(channel_of)
        self.starts = tuple((latency, tuple(empty),
                             tuple((nbytes, tuple((index, tuple(twins[1:])) for index, twins in leaders))
                                   for nbytes, leaders in cohorts.items()))
                            for latency, (empty, cohorts) in by_latency.items())

    def __len__(self) -> int:
        return self.count


class _Phase:
    """One ``run_phase`` call: its transfers, the sequence number of the first, when it was posted, how many
    are still running, the event that fires when none is, and where asked (``ends``, else None) when each
    transfer finished."""

    __slots__ = ("ends", "event", "first_seq", "key", "pending", "posted_s", "transfers")

    def __init__(self, event: simpy.Event, transfers: Transfers, key: str, first_seq: int, posted_s: float,
                 ends: list[float] | None = None):
        self.event = event
        self.transfers = transfers
        self.pending = transfers.count
        self.key = key
        self.first_seq = first_seq
        self.posted_s = posted_s
        self.ends = ends


class _Flow:
    """An active transfer, the ``index``-th of its phase, moving with its ``cohort``. It contends on the links
    of ``path`` (as a member of ``group``) and is logged with ``route`` (the same unless a quotient maps it).
    ``twins`` are the indices of its phase's transfers riding along with it (one flow to solve and finish;
    logged one by one)."""

    __slots__ = ("cohort", "group", "index", "path", "phase", "route", "seq", "twins")
    cohort: _Cohort
    group: _PathGroup

    def __init__(self, phase: _Phase, index: int, twins: tuple[int, ...] = ()):
        transfers = phase.transfers
        self.phase = phase
        self.index = index
        self.seq = phase.first_seq + index
        self.path = transfers.paths[index]
        self.route = transfers.routes[index]
        self.twins = twins

    def split(self) -> list[_Flow]:
        """This flow and its twins as flows of their own in its cohort (they go separate ways; joining again
        counts their bytes from then)."""
        members = [self]
        for index in self.twins:
            twin = _Flow(self.phase, index)
            twin.cohort = self.cohort
            members.append(twin)
        self.twins = ()
        self.cohort.flows.update(members[1:])
        return members

    def reroute(self, path: tuple[int, ...]) -> None:
        """Send this flow over ``path`` from now on, and log it there."""
        self.path = self.route = path

    def endpoints(self) -> tuple[int, int, int]:
        """Source and destination GPUs and the channel, which a route around failed links is looked up by."""
        transfers, index = self.phase.transfers, self.index
        return transfers.src[index], transfers.dst[index], transfers.channel[index]


class _Cohort:
    """Flows of one phase that started together with the same ``nbytes`` and have had equal rates since:
    they share one state, bytes left as of ``last_update`` at ``rate``, due at ``finish`` (done from
    ``ready``, within tolerance), and one entry in each heap, which ``stamp`` (unique over the run) marks
    live. A flow moves at its path group's rate; a cohort whose flows' groups get different rates splits,
    so each flow's numbers are those it would have alone, to the last bit. The flows are a set (in no
    particular order: whatever reads them sorts by sequence number), so that parting a few off costs a few."""

    __slots__ = ("finish", "flows", "last_update", "nbytes", "rate", "ready", "remaining", "stamp")

    def __init__(self, flows: Iterable[_Flow], nbytes: float, now: float):
        self.flows = set(flows)
        self.nbytes = self.remaining = nbytes
        self.last_update = now
        self.rate = 0.0
        self.finish = self.ready = math.inf
        self.stamp = -1
        for flow in self.flows:
            flow.cohort = self

    def part(self, flows: Sequence[_Flow]) -> _Cohort:
        """``flows`` (some of this cohort's) as a cohort of their own with this one's state, which keeps
        its other flows and its heap entries (none if it has no flow left)."""
        self.flows.difference_update(flows)
        if not self.flows:
            self.stamp = -1
        part = _Cohort(flows, self.nbytes, self.last_update)
        part.remaining, part.rate = self.remaining, self.rate
        part.finish, part.ready = self.finish, self.ready
        return part


class _PathGroup:
    """The active flows contending on one path. Max-min fairness gives them one ``rate``, so a group, not
    each flow, is registered on the links, reached by a component search and solved. ``weight`` counts its
    transfers (flows and their twins); ``joined`` holds the flows added since the last solve and still in the
    group, the only ones whose rate may differ from it; ``link_sets`` are the network's sets of the groups
    active on each link of its path. A group lives while it has flows, and an idle one until the remembered
    solves are forgotten; its ``number`` is never reused (a component's groups are ordered and remembered by
    their numbers)."""

    __slots__ = ("flows", "home", "joined", "link_sets", "number", "path", "position", "rate", "weight")

    def __init__(self, number: int, path: tuple[int, ...], link_sets: list[set[_PathGroup]]):
        self.number = number
        self.path = path
        self.link_sets = link_sets
        self.flows: set[_Flow] = set()
        self.joined: list[_Flow] = []
        self.rate = 0.0
        self.weight = 0
        self.home: _Found | None = None
        self.position = 0


class _Found:
    """The answer of a component search: the active ``groups`` connected to the touched ones, ordered by
    number (each group's ``position`` its place there). ``ident`` names one set only (never given to another
    set; a group's path never changes), though a set may get a new ident after the solves are forgotten; None
    for a set too large to remember. ``basis`` gives the groups' `Incidence`: itself once built; the incidence
    of the home the groups were found in and the mask of those kept, which the incidence is cut from; or None,
    built from the groups' paths. ``numbers``: the groups' numbers as an array, cut from the home's where the
    groups were found in one, else made on first use; read them through `number_array`."""

    __slots__ = ("_numbers", "basis", "groups", "ident")

    def __init__(self, groups: list[_PathGroup], ident: int | None,
                 basis: Incidence | tuple[Incidence, np.ndarray] | None = None, numbers: np.ndarray | None = None):
        self.groups = groups
        self.ident = ident
        self.basis = basis
        self._numbers = numbers

    def number_array(self) -> np.ndarray:
        """The groups' numbers, in their order, made on first use."""
        if self._numbers is None:
            self._numbers = np.fromiter(map(_number_of, self.groups), dtype=np.int64, count=len(self.groups))
        return self._numbers

    def incidence(self) -> Incidence:
        """The groups' links indexed for a solve and for `Incidence.reached`, made on first use."""
        basis = self.basis
        if isinstance(basis, Incidence):
            return basis
        if basis is not None:
            made = basis[0].subset(basis[1])
        else:
            paths = list(map(_path_of, self.groups))
            lengths = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
            made = Incidence.of(lengths, np.fromiter(chain.from_iterable(paths), dtype=np.int64,
                                                     count=int(lengths.sum())))
        self.basis = made
        return made


def _without(groups: list[_PathGroup], left_out: tuple[int, ...]) -> list[_PathGroup]:
    """``groups`` less those at the increasing positions ``left_out``, joined from the slices between them."""
    kept: list[_PathGroup] = []
    start = 0
    for position in left_out:
        kept += groups[start:position]
        start = position + 1
    kept += groups[start:]
    return kept


def _cut(home: _Found, kept: np.ndarray) -> tuple[Incidence, np.ndarray] | None:
    """The basis of the groups ``kept`` (a mask) of ``home``: its incidence and the mask, where it was built."""
    return (home.basis, kept) if isinstance(home.basis, Incidence) else None


class _EndOfInstant(simpy.Event):
    """An event processed after every ordinary event already due at the current simulated time."""

    def __init__(self, env: simpy.Environment):
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, _AFTER_NORMAL_EVENTS)


@dataclass
class AnalyticTimings:
    """The analytic model's timings on the cluster's own capacities, which networks of one topology and link
    efficiency that log their flows may share (a plan cache's runs, `PlanCache.analytic`: a job's straggler
    states each timed the same ~500 phases again, ~0.08 s of a state's ~2 s): per phase posted as
    `Transfers` (by identity, kept referenced) its duration and its flow rows relative to its start. A network
    whose capacities or routes change takes new ones of its own."""

    phases: dict[int, tuple[Transfers, float, FlowBlock | None]] = field(default_factory=dict)


class Network:
    """Transfers over a compiled ``Topology``; ``efficiency`` scales each link class's bandwidth.

    Counters for benchmarks: ``flows_simulated`` (transfers posted), ``resolves`` (components re-solved),
    ``resolved_flows`` (transfers summed over all of them, i.e. the work the solves did), ``searches`` (the
    component searches not answered by a remembered move), ``max_min_solves`` (the resolves not answered by
    an earlier solve of the same component), ``heap_entries`` (cohorts entered in the ready-time heap, as many
    in the finish-time heap) and ``wake_ups`` (completion instants processed).
    """

    def __init__(self, env: simpy.Environment, topology: Topology, *, efficiency: Mapping[str, float] | None = None,
                 mode: NetworkMode = "flow", log: EventLog | None = None, timings: AnalyticTimings | None = None):
        self.env = env
        self.topology = topology
        self.mode = mode
        self.log = log
        self.capacity = effective_capacity(topology, efficiency or {})
        self._start_capacity = self.capacity
        """The capacities the run starts with (shared, read-only), which links coming back return to."""
        self.flows_simulated = 0
        self.resolves = 0
        self.searches = 0
        self.resolved_flows = 0
        self.max_min_solves = 0
        self.wake_ups = 0
        self.heap_entries = 0
        timings = timings if timings is not None and log is not None else AnalyticTimings()
        self._analytic = timings.phases
        self._exchange_timings: dict[int, tuple[np.ndarray, dict[int, tuple[Transfers, float, FlowBlock | None]]]] = {}
        """By exchange load (kept referenced, so its id stays unique), the analytic timings of the phases posted
        with it, as ``_analytic`` holds those of the others."""
        self._groups: dict[tuple[int, ...], _PathGroup] = {}
        self._link_groups: defaultdict[int, set[_PathGroup]] = defaultdict(set)
        self._solved: dict[tuple[int, tuple[int, ...]], array[float]] = {}
        self._idents: dict[tuple[int, ...], int] = {}
        self._ident_numbers = count()
        self._moves: dict[tuple[int, tuple[tuple[int, bool], ...]], tuple[tuple[int, ...], int | None]] = {}
        self._move_entries = 0
        self._solved_entries = 0
        self._group_numbers = count()
        self._group_rates = np.zeros(GROUP_RATES)
        """Each path group's ``rate`` by its number (0 until solved), read by `_resolve` for a whole component at
        once."""
        self._joined_groups: list[_PathGroup] = []
        """The groups that flows joined since the last solve (repeated, or left since: `_resolve` reads their
        ``joined``). Each one whose ``joined`` is not empty holds flows and was touched since the last batch (a
        join touches its group), so the batch's search finds it: it is in the component solved, its home."""
        self._active = 0
        self._starting: list[_Flow] = []
        self._touched_groups: set[_PathGroup] = set()
        self._touched_links: set[int] = set()
        self._batch_pending = False
        self._by_ready: list[tuple[float, int, _Cohort]] = []
        self._by_finish: list[tuple[float, int, _Cohort]] = []
        self._stamps = count()
        self._wake_time: float | None = None
        self._wake_version = 0
        self._down: set[int] = set()

    def transfer(self, path: tuple[int, ...], nbytes: float, latency: float = 0.0, *, src: int = -1,
                 dst: int = -1, key: str = "") -> simpy.Event:
        """One transfer: an event that succeeds when ``nbytes`` have crossed ``path`` after ``latency``."""
        return self.run_phase(((path, nbytes, latency, src, dst),), key=key)

    def run_phase(self, transfers: Sequence[tuple] | Transfers, *, key: str = "", ends: list[float] | None = None,
                  load: np.ndarray | None = None) -> simpy.Event:
        """Start a batch of transfers now; the event succeeds when all of them have finished, and then ``ends``
        (where given, one item per transfer) holds when each did, the time its flow row logs (flow model only).
        ``load`` (analytic model only; None: the phase's own) is the bytes each link carries in the exchange
        the phase belongs to, by link id, which the phase's transfers then share every link with
        (`analytic_seconds`); the flow model shares the links with whatever runs at once and ignores it.

        Each item is a plain tuple, ``nbytes`` over the directed link ids ``path`` after ``latency`` seconds:
        ``(path, nbytes, latency)``; ``(path, nbytes, latency, src, dst)``, whose global GPU indices label the
        event-log row; ``(path, nbytes, latency, src, dst, channel)``, which a failed link on ``path`` can
        route again; or ``(route, nbytes, latency, src, dst, channel, contends)``, a folded run's replica
        quotient (engine/replicas.py): the flow shares the links of ``contends`` (its route's orbit
        representatives) and is logged with ``route``. A transfer with no bytes, or with an empty path (a GPU
        to itself), finishes right after its latency. A phase posted many times is parsed once as `Transfers`.
        """
        if not transfers:
            return self.env.event().succeed()
        if self.mode == "analytic":
            return self._run_analytic(transfers, key, load)
        if not isinstance(transfers, Transfers):
            transfers = Transfers(transfers)
        phase = _Phase(self.env.event(), transfers, key, self.flows_simulated, self.env.now, ends)
        self.flows_simulated += transfers.count
        for latency, empty, cohorts in transfers.starts:
            if latency > 0:
                self.env.timeout(latency).callbacks.append(partial(self._on_latency_over, phase, empty, cohorts))
            else:
                self._begin(phase, empty, cohorts)
        return phase.event

    def _run_analytic(self, transfers: Sequence[tuple] | Transfers, key: str, load: np.ndarray | None
                      ) -> simpy.Event:
        """A phase without contention from other work: each transfer takes `analytic_seconds`, its route's links
        shared among its own collective's transfers alone, or among its exchange's (``load``). A phase
        posted as `Transfers` (a plan runner's, posted once per instance) is timed once while no capacity or route
        changes (`scale_capacity` and `take_down` forget the timings); each instance logs its
        flow rows as that block shifted to its start (`EventLog.replayed_flows`: the same rows, start + 0 and
        duration + start being the row's start and start + duration to the last bit), where row by row they
        cost a job's 16,384-GPU straggler state ~0.4 s for its ~400 k flows. Without a log (collectives timed
        alone, the layout search's) no block is built."""
        phases = self._analytic if load is None else self._exchange_timings.setdefault(id(load), (load, {}))[1]
        timed = phases.get(id(transfers))
        if timed is None:
            posted = transfers
            transfers = posted if isinstance(posted, Transfers) else Transfers(posted)
            routes = FlowRoutes.of(list(transfers.routes))
            collective = None
            if transfers.collectives:
                starts, stops = np.array(transfers.collectives, dtype=np.int64).T
                collective = np.repeat(np.arange(starts.size), stops - starts)
            durations = analytic_seconds(routes, np.array(transfers.nbytes, dtype=float),
                                         np.array(transfers.latency, dtype=float), self.capacity, collective,
                                         load)
            block = (FlowBlock.of(transfers.src, transfers.dst, np.zeros(len(durations)), durations,
                                  transfers.nbytes, routes)
                     if self.log is not None else None)
            timed = (transfers, float(durations.max()), block)
            if posted is transfers:
                phases[id(transfers)] = timed
        self.flows_simulated += timed[0].count
        done = self.env.timeout(timed[1])
        if timed[2] is not None:
            done.callbacks.append(partial(self._log_analytic, key, self.env.now, timed[2]))
        return done

    def _log_analytic(self, key: str, start: float, block: FlowBlock, _event: simpy.Event) -> None:
        """Log an analytic phase's flow rows at its end, shifted to its ``start``."""
        assert self.log is not None
        self.log.replayed_flows(key, start, block)

    def _forget_timings(self) -> None:
        """Drop the analytic phase timings: they hold the capacities and routes of before (new ones of this
        network's own: others may share the old ones, `AnalyticTimings`)."""
        self._analytic = AnalyticTimings().phases
        self._exchange_timings = {}

    def _on_latency_over(self, phase: _Phase, empty: Sequence[int], cohorts: Sequence[tuple], _event: simpy.Event
                         ) -> None:
        self._begin(phase, empty, cohorts)

    def _begin(self, phase: _Phase, empty: Sequence[int], cohorts: Sequence[tuple]) -> None:
        """Finish the transfers ``empty`` of ``phase`` now and start the flows of ``cohorts`` (``(nbytes,
        ((index, twins), ...))`` each; moved off failed links), asking for one re-solve at this instant."""
        routes = phase.transfers.routes
        self._finish([(phase, index, routes[index]) for index in empty], self.env.now)
        for nbytes, leaders in cohorts:
            flows = [_Flow(phase, index, twins) for index, twins in leaders]
            _Cohort(flows, nbytes, self.env.now)
            if self._down:
                flows = list(chain.from_iterable(self._rerouted(flow) for flow in flows))
            self._starting += flows
        if cohorts:
            self._request_batch()

    def _rerouted(self, flow: _Flow) -> list[_Flow]:
        """``flow`` alone if its path avoids the failed links, else it and its twins apart on new routes."""
        if self._down.isdisjoint(flow.path):
            return [flow]
        members = flow.split()
        for member in members:
            member.reroute(self.topology.path(*member.endpoints()))
        return members

    def scale_capacity(self, links: Sequence[int], fraction: float) -> None:
        """From now on ``links`` keep ``fraction`` of their capacity; the flows crossing them are re-solved.
        The network takes its own copy of the capacities (the topology's are shared between runs)."""
        if not self.capacity.flags.writeable:
            self.capacity = self.capacity.copy()
        self.capacity[list(links)] *= fraction
        self._capacity_changed(links)

    def restore_capacity(self, links: Sequence[int], kept: float) -> None:
        """``links`` come back from a fault: from now on they keep ``kept`` of the capacity they started the run
        with (1: all of it; less while other faults still hold them); the flows crossing them are re-solved."""
        if not self.capacity.flags.writeable:
            self.capacity = self.capacity.copy()
        self.capacity[list(links)] = self._start_capacity[list(links)] * kept
        self._capacity_changed(links)

    def _capacity_changed(self, links: Sequence[int]) -> None:
        """Forget what the old capacities of ``links`` decided, and re-solve the flows crossing them."""
        self._forget_timings()
        self._forget_solves()
        self._touched_links.update(links)
        self._request_batch()

    def take_down(self, links: Sequence[int]) -> None:
        """``links`` failed (the topology already routes around them): flows in flight on them continue on
        their new route with the bytes they have left; flows still in their latency are rerouted as they start,
        and those whose latency ended at this instant (not yet on the links) now. The moved flows of a cohort
        stay one cohort (one new heap entry); the solve at the end of the instant parts them by rate."""
        self._down.update(links)
        self._forget_timings()
        self._starting = list(chain.from_iterable(map(self._rerouted, self._starting)))
        moving = {flow for link in links for group in self._link_groups.get(link, ()) for flow in group.flows}
        now = self.env.now
        self._unlink(moving)
        leaving: dict[_Cohort, list[_Flow]] = {}
        for flow in moving:
            leaving.setdefault(flow.cohort, []).append(flow)
        members: list[_Flow] = []
        for cohort, flows in leaving.items():
            apart = list(chain.from_iterable(flow.split() for flow in flows))
            moved = cohort.part(apart)
            moved.remaining = max(moved.remaining - moved.rate * (now - moved.last_update), 0.0)
            moved.last_update = now
            self._push(moved)
            self._active += len(apart) - len(flows)
            members += apart
        members.sort(key=_seq_of)
        for flow in members:
            flow.reroute(self.topology.path(*flow.endpoints()))
        self._join(members)
        self._request_batch()

    def bring_up(self, links: Sequence[int]) -> None:
        """``links`` work again (the topology already routes over them): transfers posted from now on take their
        own routes; flows in flight on a detour finish on it, and flows still in their latency keep the route they
        were posted with."""
        self._down.difference_update(links)
        self._forget_timings()

    def _request_batch(self) -> None:
        if not self._batch_pending:
            self._batch_pending = True
            _EndOfInstant(self.env).callbacks.append(self._apply_batch)

    def _apply_batch(self, _event: simpy.Event) -> None:
        """Register the flows that started, re-solve the component the changes touched, re-arm the wake-up."""
        self._batch_pending = False
        self._join(self._starting)
        self._active += len(self._starting)
        self._starting = []
        found = self._component(self._touched_groups, self._touched_links)
        self._touched_links = set()
        self._touched_groups = set()
        if found is not None:
            self._resolve(found)
        self._arm_wake_up()

    def _join(self, flows: list[_Flow]) -> None:
        """Add each of ``flows`` (their bytes left counted from now, as their cohorts were made or moved now) to
        the group of its path, registering the group on its links if it was idle."""
        groups, link_groups, touched = self._groups, self._link_groups, self._touched_groups
        for flow in flows:
            group = groups.get(flow.path)
            if group is None:
                group = groups[flow.path] = _PathGroup(next(self._group_numbers), flow.path,
                                                       [link_groups[link] for link in flow.path])
                if group.number == self._group_rates.size:
                    self._group_rates = np.concatenate((self._group_rates, np.zeros(self._group_rates.size)))
            if not group.flows:
                for members in group.link_sets:
                    members.add(group)
            group.flows.add(flow)
            group.weight += 1 + len(flow.twins)
            group.joined.append(flow)
            self._joined_groups.append(group)
            flow.group = group
            touched.add(group)

    def _component(self, touched: set[_PathGroup], links: set[int]) -> _Found | None:
        """Active groups connected through shared links to the ``touched`` groups (active or emptied) or to
        ``links``, in the order of their numbers (`_search`); None if there are none.

        A group's ``home`` is the last answer that found it, until it leaves its links. Its connections are
        still those it had then: a group that joins or leaves links is touched, and the search from it finds
        every group whose connections that changes and gives it a new home. So where every touched group has
        one home and no link was touched, the answer is the groups of that home connected to the touched ones,
        a function of the home's set and of which touched groups are still active: such a move is searched
        once and remembered as the positions of its home's groups it leaves out (an all-to-all's flows end one
        after another, each end a search over all of them, and the same all-to-all of every layer and
        micro-batch makes the same moves on the same path groups)."""
        home = None
        if not links:
            homes = {group.home for group in touched}
            home = homes.pop() if len(homes) == 1 else None
        if home is None:
            component = self._search(touched, links)
            return self._found(component, self._ident(component), touched)
        move = None
        if home.ident is not None:
            move = (home.ident, tuple(sorted((group.number, not group.flows) for group in touched)))
            known = self._moves.get(move)
            if known is not None:
                left_out, ident = known
                if not left_out:
                    return home
                kept = np.ones(len(home.groups), dtype=bool)
                kept[list(left_out)] = False
                return self._found(_without(home.groups, left_out), ident, touched, _cut(home, kept),
                                   home.number_array()[kept])
        kept = self._within(home, touched)
        left_out = tuple(np.flatnonzero(~kept).tolist())
        component = _without(home.groups, left_out)
        ident = self._ident(component)
        if move is not None:
            self._remember_move(move, left_out, ident)
        if not left_out:
            return home
        return self._found(component, ident, touched, _cut(home, kept), home.number_array()[kept])

    def _remember_move(self, move: tuple[int, tuple[tuple[int, bool], ...]], left_out: tuple[int, ...],
                       ident: int | None) -> None:
        """Remember the answer of ``move``, forgetting every move first where it would pass `MOVE_ENTRIES`
        (the idents they name are never given to another set, so the homes and solves keyed by them hold)."""
        entries = len(move[1]) + len(left_out)
        if self._move_entries + entries > MOVE_ENTRIES:
            self._moves.clear()
            self._move_entries = 0
        self._moves[move] = (left_out, ident)
        self._move_entries += entries

    def _ident(self, component: list[_PathGroup]) -> int | None:
        """The ident of ``component``'s set of groups: the one given to the same set before while remembered,
        else a new one; None for a set larger than `CACHED_GROUPS` (not remembered). A new ident is counted
        in `SOLVED_ENTRIES` with the solve that follows it (no solve is remembered under it yet)."""
        if len(component) > CACHED_GROUPS:
            return None
        numbers = tuple(map(_number_of, component))
        ident = self._idents.get(numbers)
        if ident is None:
            ident = self._idents[numbers] = next(self._ident_numbers)
        return ident

    @staticmethod
    def _found(component: list[_PathGroup], ident: int | None, touched: set[_PathGroup],
               basis: tuple[Incidence, np.ndarray] | None = None, numbers: np.ndarray | None = None
               ) -> _Found | None:
        """Make ``component`` the home of its groups (None if it has none), cut from ``basis`` where given, its
        groups' ``numbers`` where known (`_Found`); the ``touched`` groups that left their links have none."""
        for group in touched:
            group.home = None
        if not component:
            return None
        found = _Found(component, ident, basis, numbers)
        for position, group in enumerate(component):
            group.home = found
            group.position = position
        return found

    def _within(self, home: _Found, touched: set[_PathGroup]) -> np.ndarray:
        """`_component` where every touched group has the same ``home`` and no link was touched: the mask of the
        home's groups that the touched groups' links reach through active groups (`Incidence.reached`, over
        the home's incidence, kept for its solve and cut for the answer's), the groups `_search` finds (none
        outside the home: a group joining links beside it would be touched and have none), at a few numpy
        passes over the home's link crossings where the search takes a set union per group and per link."""
        self.searches += 1
        groups = home.groups
        active = np.fromiter(map(bool, map(_flows_of, groups)), dtype=bool, count=len(groups))
        seeds = np.fromiter(map(_position_of, touched), dtype=np.int64, count=len(touched))
        return home.incidence().reached(seeds, active)

    def _search(self, touched: set[_PathGroup], links: set[int]) -> list[_PathGroup]:
        """`_component` searched: a breadth-first search, a level at a time, over whole sets
        (the links the last level's groups cross and that were not seen yet, the groups on those links and
        not found yet), so each link and each group is taken once and the merging runs in the set operations,
        not a Python loop per link crossing (an unfolded all-to-all puts every flow of its step in one
        component, searched again at each of its ends)."""
        self.searches += 1
        link_groups = self._link_groups
        seen = set(links).union(*map(_path_of, touched))
        found: set[_PathGroup] = set().union(*filter(None, map(link_groups.get, seen)))
        frontier = found - touched
        while frontier:
            fresh = set().union(*map(_path_of, frontier))
            fresh -= seen
            seen |= fresh
            frontier = set().union(*map(link_groups.__getitem__, fresh))
            frontier -= found
            found |= frontier
        return sorted(found, key=_number_of)

    def _resolve(self, found: _Found) -> None:
        """New max-min rates for the ``found`` component. Every flow moves at its group's rate: only the flows
        whose group changed rate or which just joined can differ from their cohort's (all others agree with it
        since the last solve), so only they are checked, the groups that changed rate or hold such flows being
        picked out by comparing the whole component's rates at once (an all-to-all's end leaves most of its
        thousands of groups as they were); those that differ leave their cohort, one new cohort per rate (the
        whole cohort is repriced when all of it moves to one rate), brought up to date now.

        The rates depend only on the groups' paths and sizes (the solve sums whole flow counts and takes
        minima, so the order of the groups does not move a bit): a component seen before (the same ident) with
        the same sizes reuses its rates, as the repeated steps of a training run meet the same components again.
        """
        self.resolves += 1
        component = found.groups
        sizes = tuple(map(_weight_of, component))
        self.resolved_flows += sum(sizes)
        ident = found.ident
        group_rates = self._solved.get((ident, sizes)) if ident is not None else None
        if group_rates is None:
            self.max_min_solves += 1
            group_rates = array("d", found.incidence().rates(np.fromiter(sizes, dtype=float, count=len(sizes)),
                                                             self.capacity).tobytes())
            if ident is not None:
                if self._solved_entries + len(component) > SOLVED_ENTRIES:
                    self._forget_solves()
                self._solved[ident, sizes] = group_rates
                self._solved_entries += len(component)
        moved = self._group_rates[found.number_array()] != np.frombuffer(group_rates)
        for group in self._joined_groups:
            if group.joined:  # in ``found``, at its position there (`_joined_groups`)
                moved[group.position] = True
        self._joined_groups = []
        changed: list[Iterable[_Flow]] = []
        for position in np.flatnonzero(moved).tolist():
            group, rate = component[position], group_rates[position]
            if rate != group.rate:
                group.rate = self._group_rates[group.number] = rate
                changed.append(group.flows)
            else:
                changed.append(group.joined)
            group.joined = []
        leaving: dict[_Cohort, dict[float, list[_Flow]]] = {}
        for flow in chain.from_iterable(changed):
            cohort, rate = flow.cohort, flow.group.rate
            if rate != cohort.rate:
                leaving.setdefault(cohort, {}).setdefault(rate, []).append(flow)
        now = self.env.now
        for cohort, by_rate in leaving.items():
            if len(by_rate) == 1:
                (rate, flows), = by_rate.items()
                if len(flows) == len(cohort.flows):
                    self._reprice(cohort, rate, now)
                    continue
            for rate, flows in by_rate.items():
                self._reprice(cohort.part(flows), rate, now)
        most = 4 * self._active + 1024
        if len(self._by_ready) > most:
            self._by_ready = self._fresh(self._by_ready)
        if len(self._by_finish) > most:
            self._by_finish = self._fresh(self._by_finish)

    def _reprice(self, cohort: _Cohort, rate: float, now: float) -> None:
        """Bring ``cohort`` up to date at ``now`` and move it on at ``rate`` (new heap entries)."""
        if cohort.rate:  # a flow without a rate yet has sent nothing
            cohort.remaining = max(cohort.remaining - cohort.rate * (now - cohort.last_update), 0.0)
        cohort.last_update = now
        cohort.rate = rate
        cohort.finish = now + cohort.remaining / rate
        cohort.ready = cohort.finish - FINISH_TOLERANCE * cohort.nbytes / rate
        self._push(cohort)

    def _push(self, cohort: _Cohort) -> None:
        """Enter ``cohort`` in the ready-time and finish-time heaps under a new stamp."""
        cohort.stamp = stamp = next(self._stamps)
        self.heap_entries += 1
        heapq.heappush(self._by_ready, (cohort.ready, stamp, cohort))
        heapq.heappush(self._by_finish, (cohort.finish, stamp, cohort))

    def _forget_solves(self) -> None:
        """Forget the remembered solves, and with them the idle path groups (their numbers were kept for those
        solves' keys; a path used again gets a new group)."""
        self._solved.clear()
        self._idents.clear()
        self._solved_entries = 0
        self._groups = {path: group for path, group in self._groups.items() if group.flows}

    @staticmethod
    def _fresh(heap: list[tuple[float, int, _Cohort]]) -> list[tuple[float, int, _Cohort]]:
        """The heap without entries made stale by a rate change or a finished cohort."""
        live = [entry for entry in heap if entry[1] == entry[2].stamp]
        heapq.heapify(live)
        return live

    def _arm_wake_up(self) -> None:
        """Make sure exactly one live wake-up is scheduled, at the earliest finish time (the top of the
        finish-time heap once its stale entries are dropped)."""
        heap = self._by_finish
        while heap and heap[0][1] != heap[0][2].stamp:
            heapq.heappop(heap)
        if not heap:
            self._wake_time = None
            return
        finish = heap[0][0]
        if finish != self._wake_time:
            self._wake_time = finish
            self._wake_version += 1
            delay = max(finish - self.env.now, 0.0)
            self.env.timeout(delay).callbacks.append(partial(self._on_wake_up, self._wake_version, finish))

    def _on_wake_up(self, version: int, due: float, _event: simpy.Event) -> None:
        """Finish every flow within tolerance of done at the wake-up time ``due``; stale wake-ups (an earlier
        ``version``) do nothing."""
        if version != self._wake_version:
            return
        self.wake_ups += 1
        self._wake_time = None
        now = self.env.now
        heap = self._by_ready
        finished: list[_Flow] = []
        while heap and heap[0][0] <= due:
            _, stamp, cohort = heapq.heappop(heap)
            if stamp == cohort.stamp:
                cohort.stamp = -1
                finished += cohort.flows
                cohort.flows.clear()  # each flow refers to its cohort: a cycle the paused collector would keep
        self._unlink(finished)
        self._active -= len(finished)
        done: list[tuple[float, int, _Phase, int, tuple[int, ...]]] = []
        for flow in finished:
            phase, ready = flow.phase, flow.cohort.ready
            done.append((ready, flow.seq, phase, flow.index, flow.route))
            if flow.twins:
                first, routes = phase.first_seq, phase.transfers.routes
                done += [(ready, first + index, phase, index, routes[index]) for index in flow.twins]
        done.sort(key=itemgetter(0, 1))
        self._finish(map(itemgetter(2, 3, 4), done), now)
        self._request_batch()

    def _unlink(self, flows: Iterable[_Flow]) -> None:
        """Take each of ``flows`` out of its group, and an emptied group off its links (re-solved at the end of
        the instant)."""
        touched = self._touched_groups
        for flow in flows:
            group = flow.group
            group.flows.discard(flow)
            group.weight -= 1 + len(flow.twins)
            if not group.flows:
                group.joined = []
                for members in group.link_sets:
                    members.discard(group)
            elif group.joined and flow in group.joined:
                group.joined.remove(flow)
            touched.add(group)

    def _finish(self, done: Iterable[tuple[_Phase, int, tuple[int, ...]]], now: float) -> None:
        """Log each ``(phase, index, route)`` of ``done``: the phase's ``index``-th transfer, done ``now`` over
        ``route``; a phase's last transfer ends it."""
        log = self.log
        for phase, index, route in done:
            if log is not None:
                transfers = phase.transfers
                log.flow(phase.key, transfers.src[index], transfers.dst[index], phase.posted_s, now,
                         transfers.nbytes[index], route)
            ends = phase.ends
            if ends is not None:
                ends[index] = now
            phase.pending -= 1
            if phase.pending == 0:
                phase.event.succeed()


def effective_capacity(topology: Topology, efficiency: Mapping[str, float]) -> np.ndarray:
    """Each directed link's usable bytes/s: its bandwidth times its class's efficiency (default 1); computed
    once per topology and profile (every isolated replay builds a Network of its own)."""
    profile = tuple(sorted(efficiency.items()))
    cached = topology.capacities.get(profile)
    if cached is not None:
        return cached
    per_class = np.array([efficiency.get(name, 1.0) for name in LINK_CLASSES], dtype=float)
    capacity = topology.capacities[profile] = topology.link_bandwidth * per_class[topology.link_class_ids]
    capacity.setflags(write=False)
    return capacity


def analytic_seconds(routes: FlowRoutes, nbytes: np.ndarray, latency: np.ndarray, capacity: np.ndarray,
                     collective: np.ndarray | None = None, load: np.ndarray | None = None) -> np.ndarray:
    """Each transfer's seconds on the analytic model: its ``latency``, then its bytes at its share of every link of
    its route, a link's ``capacity`` split among the transfers of its own collective (``collective[i]`` numbers
    transfer i's; None: all of one) that cross it, in proportion to their bytes, so that those a link bounds end
    together on it:
    ``latency + max over its links of (its collective's bytes on the link) / capacity``. A collective's channels
    and peers over one NIC thus share its line rate, as on the wire, while other work never slows it. A transfer
    alone on its links takes ``nbytes / narrowest capacity``, to the last bit; one without bytes or links, its
    latency alone. ``load`` (by link id; None: the collective's own) is the bytes every link carries in the
    exchange the transfers belong to (ops a program times as one collective, though each runs on its own: a
    parameter-server iteration's pushes), or in the phase with its copies on the equivalent ranks
    (`simulation.copy_phases`), which then stand for the collective's."""
    lengths = routes.lengths
    entry_transfer = np.repeat(np.arange(lengths.size), lengths)
    if load is None:
        key = routes.links if collective is None else collective[entry_transfer] * capacity.size + routes.links
        shared, inverse = np.unique(key, return_inverse=True)
        on_link = np.bincount(inverse.reshape(-1), weights=nbytes[entry_transfer], minlength=shared.size)
        entry_load = on_link[inverse.reshape(-1)]
    else:
        entry_load = load[routes.links]
    busiest = np.zeros(lengths.size)
    np.maximum.at(busiest, entry_transfer, entry_load / capacity[routes.links])
    return latency + np.where((nbytes > 0) & (lengths > 0), busiest, 0.0)
