"""The job process of one replication: a SimPy process that trains in whole segments between events
(failures, planned maintenance, the repair of a degradation) and restarts after interruptions.

Failures arrive per unit slot of the job's topology (processes.py). A failure of a unit the job is not using
(a slot beyond a shrunk job's hosts, or a host already out) is ignored. `replace` and `restart` failures
interrupt: the clock rolls back to the last completed checkpoint, the hosts in the blast radius go to repair,
and the restart runs detection, rescheduling (spare hosts; when there are too few, waiting for repaired ones,
or with `elastic` relaunching on the largest of the job's sizes the hosts fill, elastic.py, waiting only below
the smallest), launch, checkpoint load and warm-up steps. The group is formed as launch begins (its rendezvous):
every host back from repair by then joins it, and its hosts, spares standing in for those taken out included,
are in use from then on (a host taken out is out until then). One back later, during launch, load or warm-up,
waits for the next restart, unless the job regrows `on_repair` and the hosts back then fill a larger size: then
the group re-forms at once, from rescheduling (torchelastic agents restart their workers when a node waits at
the rendezvous).
An interrupting failure during a restart starts it over. A shrunk elastic job grows back at its next
restart, or with `regrow: on_repair` as soon as the hosts back from repair (and spares) fill a larger size
whose GPUs all have a route: it stops cleanly (writes a checkpoint, as a maintenance stop does, but with no
maintenance to wait for, and none when no step was trained since the last completed one: right after a
restart the checkpoint loaded is current) and restarts without detection, on the largest size the hosts back
by its rendezvous fill (one regrow for the hosts back during its write and rescheduling, not one per host); its
time is restart time, and a failure during its write loses that checkpoint and restarts with detection.
`degrade` and `straggle` failures change the cluster state until their repair (a unit hit again while degraded
stays so until its last repair): the job trains at that state's step time, and the extra time of its kept steps
is slow-step time of the causes in force, split by their marginal effects (attribution.py). A `degrade` failure
whose state has no route for some GPU interrupts instead: it takes its blast radius, as `replace`, or, when that
holds no host (the last spine up), stays down and the restart waits for the repair that gives every GPU a route
again. Planned
maintenance windows come every `every_s`, the first after half a period; at each the job checkpoints (unless no
step was trained since the last completed one, as for a regrow), stops for its duration and restarts without
detection (a window that falls inside a restart is taken right after it, with no checkpoint: the one loaded
is current; several windows that fall inside one restart are taken as one). A failure during the stop does not
cut it short: its detection overlaps what is left of the stop, and one that comes before the stop's checkpoint
is written loses that checkpoint, as any checkpoint being written.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

import simpy

from simulator.config.reliability import BuiltInCause, Effect, Regrow
from simulator.errors import SimulationError
from simulator.reliability import hosts_out
from simulator.reliability.attribution import cause_shares
from simulator.reliability.checkpoint import SegmentCosts, snapshot_survives
from simulator.reliability.components import RACK_UNITS, FailureClass, Maintenance
from simulator.reliability.elastic import ElasticSizes, hosts_at
from simulator.reliability.events import JobEvents, StorageReason, Tier
from simulator.reliability.processes import Arrivals
from simulator.reliability.states import ClusterState, Degradation
from simulator.reliability.training import EPS, CheckpointClock

INF = math.inf

Frame = tuple[tuple[str, str], ...]
"""Where the physical racks stood when links went down: (place, rack) pairs, a place as the cluster names it
(its rack's NVSwitch node) and the rack filling it then (`JobProcess._physical`); empty for another degradation."""
Kept = tuple[int, Degradation, Frame]
"""A degradation in force as the job keeps it: its class's index, the degradation (an NVSwitch tray under its
physical rack's name, links under the names of the places they were drawn on) and, for links, their `Frame`."""


def full_rack_hosts(racks: tuple[tuple[str, tuple[int, ...]], ...]) -> int:
    """The hosts (compute trays) of a full GB200 NVL72 rack of ``racks`` (`JobPlan.racks`): the first's."""
    return len(racks[0][1])


def spare_rack_names(spares: int, racks: tuple[tuple[str, tuple[int, ...]], ...]) -> tuple[str, ...]:
    """The spare pool's hosts (`restart.spares`) as GB200 NVL72 racks as full as ``racks``' first (the last one
    holds those left), each named by its NVSwitch node as a cluster's rack is: `spare-0/nvswitch`, ...; none
    where there are no ``racks``."""
    return tuple(f"spare-{index}/nvswitch" for index in range(-(-spares // full_rack_hosts(racks)))) if racks else ()


@dataclass(frozen=True)
class JobPlan:
    """Everything a replication needs that does not change between replications. ``detection_s``,
    ``reschedule_s`` and ``launch_s`` are the parts of a restart that no cluster state changes
    (`restart.detection`, `reschedule`, `launch`)."""

    horizon_s: float
    classes: tuple[FailureClass, ...]
    blast: tuple[tuple[tuple[int, ...], ...], ...]
    maintenance: Maintenance | None
    hosts: int
    replicas: int
    spares: int
    elastic: bool
    sizes: ElasticSizes
    """The replica counts the job runs on, ascending, `replicas` last (only it when not elastic), and those
    skipped for memory: elastic.py's, computed once when the job is checked."""
    regrow: Regrow
    detection_s: float
    reschedule_s: float
    launch_s: float
    costs: Callable[[ClusterState], SegmentCosts | None]
    degradation: Callable[[int, int], Degradation]
    """(class index, unit index) -> what that unit's degradation or straggling does to the cluster."""
    state_of: Callable[[int, list[Degradation]], ClusterState]
    """The cluster state on some replicas with some degradations in force (`StepStates.state_of`)."""
    interrupting: tuple[tuple[float, ...], ...]
    """Per class, per unit, the share of its failures that interrupt the job on a healthy cluster (cuts.py): what
    the closed forms count; the job itself checks each degradation against the state it meets."""
    trains: tuple[float, ...]
    """Per class, the share of time the job can train as far as that class's outages go (`cuts.training_shares`):
    below 1 for a `degrade` spine or NVSwitch tray class only."""
    memory_replicas: int = 0
    """Peer hosts holding each host's in-memory snapshot (`checkpoint.memory.replicas`); 0 without that tier."""
    racks: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """GB200 NVL72 racks in host order: each one's NVSwitch node and its hosts (none on another cluster). The
    NVSwitch trays down follow their rack when a restart regroups the hosts (`JobProcess._regrouped`)."""
    follow_links: Callable[[dict[str, str], tuple[tuple[str, str], ...]], tuple[tuple[str, str], ...]] | None = None
    """Links down moved with their racks' hardware (`states.LinksFollowRacks`), where there are ``racks``."""
    spare_racks: tuple[str, ...] = ()
    """The spare pool's racks (`spare_rack_names`), where there are ``racks``: real racks, whose units (the rack,
    its NVSwitch trays) fail as the cluster's do, after them in unit order."""
    nvswitch_trays: int = 0
    """NVSwitch trays per rack (GB200 NVL72; 0 on another cluster)."""

    @cached_property
    def rack_names(self) -> tuple[str, ...]:
        """Every physical rack, by its NVSwitch node: the cluster's in rack order, then the spares'."""
        return tuple(switch for switch, _ in self.racks) + self.spare_racks

    @cached_property
    def rack_order(self) -> dict[str, int]:
        """Each physical rack's index in `rack_names` (the order ties between racks are broken in)."""
        return {rack: index for index, rack in enumerate(self.rack_names)}

    def rack_hosts(self, rack: str) -> int:
        """How many hosts physical ``rack`` holds: a cluster rack's, a spare's (the last spare holds those left)."""
        if rack not in self.spare_racks:
            return len(dict(self.racks)[rack])
        size = full_rack_hosts(self.racks)
        return min(size, self.spares - size * self.spare_racks.index(rack))

    def spare_units(self, klass: FailureClass) -> int:
        """The units of the spare racks a class draws failures for beyond the cluster's: their racks for a `rack`
        class, their NVSwitch trays for an `nvswitch_tray` one (0 for another)."""
        if klass.unit not in RACK_UNITS:
            return 0
        return len(self.spare_racks) * (1 if klass.unit == "rack" else self.nvswitch_trays)

    @cached_property
    def whole_spare_rack(self) -> bool:
        """Whether the spare pool holds a spare rack with a whole rack's hosts, which can take a failed rack's
        place: the last spare rack holds the hosts left, so `restart.spares: 2` on 4-host racks is no spare rack
        at hand and the job waits for the rack's repair."""
        size = full_rack_hosts(self.racks) if self.racks else 0
        return any(self.rack_hosts(rack) == size for rack in self.spare_racks)

    def failure_rate_s(self, klass: FailureClass) -> float:
        """Failures per second the job meets of one unit of ``klass`` in use over the horizon
        (`FailureClass.failure_rate_s`), a spare at hand where the spare pool has one: a spare rack with a whole
        rack's hosts (`whole_spare_rack`) for a `rack` or `nvswitch_tray` class, a spare host for another."""
        return klass.failure_rate_s(self.spare_at_hand(klass))

    def unit_rates_s(self, index: int) -> tuple[float, ...] | None:
        """Failures per second the job meets of each unit of class ``index`` over the horizon, where they are not
        all `failure_rate_s`: those of a `replace` class with no spare at hand (not a rack's). Such a unit fails
        only while its hosts are in use, and with no spare they are out while any failure that took them is in
        repair: the unit is up 1 / (1 + rho) of the time, rho the sum of rate x mean repair over the `replace`
        units (not racks) whose hosts hold its own (`repair_loads`: its own, its host's other GPUs, the host, its
        NIC, ...), and fails at its rate then (one DGX H100 host, GPU MTBF 100 h, 12 h repairs, 30 d, 200
        replications: 8 x 720 h / 100 h / 1.96 = 29.39, 29.79 simulated, 95% 29.25 to 30.33; a unit's own
        repair alone said 8 x 720 h / 112 h = 51.43). rho leaves out the repairs of cutting `degrade` units and
        of racks, which keep the host out too: with those the count is higher than the job meets. Exact, in the
        long run, for a job on one host; on more the job waits for every host, a host back from repair waits
        idle too, and the count is a long-run upper bound. Over a horizon of a few MTBF + repair the job
        meets more, its hosts starting up (`expected_in_horizon` in docs/reliability.md). None for every other
        class."""
        klass = self.classes[index]
        if klass.effect is not Effect.REPLACE or klass.unit in RACK_UNITS or self.spare_at_hand(klass):
            return None
        rates = []
        for hosts in self.blast[index]:
            if not hosts:
                rates.append(self.failure_rate_s(klass))
                continue
            covering = set(hosts)
            load = math.fsum(part for held, part in self.repair_loads.get(min(hosts), ()) if covering <= held)
            rates.append(klass.rate_per_unit_s / (1.0 + load))
        return tuple(rates)

    @cached_property
    def repair_loads(self) -> dict[int, tuple[tuple[frozenset[int], float], ...]]:
        """Per host, the `replace` units (not racks) that take it out, each as the hosts it takes and its rate x
        mean repair."""
        loads: dict[int, list[tuple[frozenset[int], float]]] = {}
        for klass, blast in zip(self.classes, self.blast, strict=True):
            if klass.effect is not Effect.REPLACE or klass.unit in RACK_UNITS:
                continue
            for hosts in blast:
                entry = (frozenset(hosts), klass.rate_per_unit_s * klass.repair_s)
                for host in hosts:
                    loads.setdefault(host, []).append(entry)
        return {host: tuple(entries) for host, entries in loads.items()}

    def spare_at_hand(self, klass: FailureClass) -> bool:
        """Whether the spare pool can stand in for a failed unit of ``klass``: a spare rack with a whole rack's
        hosts (`whole_spare_rack`) for a `rack` or `nvswitch_tray` class, a spare host for another."""
        return self.whole_spare_rack if klass.unit in RACK_UNITS else self.spares > 0

    def training_rates_s(self) -> tuple[tuple[float, ...], ...]:
        """Per class, per unit, the interruptions per second the unit brings while the job trains at full size,
        its share (`interrupting`) x the unit's rate then. The class's own rate 1 / M for a `replace` or
        `restart` class: its units are up while the job trains (a spare stands in for one in repair, or the
        job waits for the repair, or, elastic, runs on smaller). A `degrade` unit stays in repair where it is,
        failing no more, while spares carry the job on: `degrade_odds` for one that cuts hosts off, 1 / M with
        no spare; for a spine or NVSwitch tray class, its share x 1 / (M + r) over the share of time the job
        can train as far as the class goes (`trains`)."""
        rates = []
        for klass, blast, shares, trains in zip(self.classes, self.blast, self.interrupting, self.trains,
                                                strict=True):
            if klass.effect is not Effect.DEGRADE:
                rate = klass.rate_per_unit_s
            elif trains < 1.0:
                rate = klass.failure_rate_s(False) / trains
            else:
                rate = klass.failure_rate_s(False) * self.degrade_odds(klass, blast, shares)
            rates.append(tuple(share * rate for share in shares))
        return tuple(rates)

    def degrade_odds(self, klass: FailureClass, blast: tuple[tuple[int, ...], ...], shares: tuple[float, ...]
                     ) -> float:
        """What turns a cutting `degrade` unit's 1 / (M + r) into its rate while the job trains: the job trains
        while the one spare pool covers every host out (`pool_load`: the hosts of the cutting units in repair,
        each class's units counted as cutting its widest unit's hosts, and those of `replace` failures in
        repair), X <= spares; each cutting unit is down r / (M + r) of the time, on its own, so a unit is up
        M / (M + r) x P(X less it <= spares) / P(X <= spares) of the time the job trains, and fails at 1 / M for
        that time. 1 / M with no spare, 1 / (M + r) where spares cover them all (4 NICs of 40 h, 12 h repairs,
        4 spares: 52 h / 4 = 13.0 h, 13.3 h simulated; 2 leaves of 10 h, 12 h repairs over 2 one-GPU hosts
        each, 2 spares: 7.73 h, 7.74 h simulated; with 4 GPUs of 40 h, 2 d repairs, drawing on the same 4
        spares: 5.39 h, 5.39 h simulated, where a pool of its own for each class said 5.65 h). 1 / M too where
        the pool covers the hosts out with no chance a float holds."""
        cutting = [len(hosts) for hosts, share in zip(blast, shares, strict=True) if share]
        if not cutting:
            return 1.0
        units, batches = self.pool_load
        unit = (self.down_share(klass), max(cutting))
        others = Counter(units)
        others[unit] -= 1
        every = hosts_out.covered(units, batches, self.spares)
        if every == 0.0:
            return 1.0 / (1.0 - unit[0])
        return hosts_out.covered(others, batches, self.spares) / every

    @staticmethod
    def down_share(klass: FailureClass) -> float:
        """The share of time a unit repaired in place is down, r / (M + r)."""
        load = klass.repair_s * klass.rate_per_unit_s
        return load / (1.0 + load)

    @cached_property
    def pool_load(self) -> tuple[Counter[tuple[float, int]], dict[int, float]]:
        """What the one spare pool must cover for the job to train, every class that takes hosts drawing on it
        (hosts_out.py): the cutting `degrade` units, (their down share, the hosts their class's widest unit cuts
        off) -> units, of every class whose job trains as far as it goes (`trains` 1: not a spine's), and the
        `replace` failures in repair, hosts a failure takes -> mean failures in repair (rate x repair, summed over
        units). A `rack` class's failures draw on whole spare racks, and are left out."""
        units: Counter[tuple[float, int]] = Counter()
        batches: dict[int, float] = {}
        for klass, blast, shares, trains in zip(self.classes, self.blast, self.interrupting, self.trains,
                                                strict=True):
            if klass.effect is Effect.DEGRADE and trains == 1.0:
                cutting = [len(hosts) for hosts, share in zip(blast, shares, strict=True) if share]
                if cutting:
                    units[(self.down_share(klass), max(cutting))] += len(cutting)
            elif klass.effect is Effect.REPLACE and klass.unit not in RACK_UNITS:
                for hosts, share in zip(blast, shares, strict=True):
                    if hosts and share:
                        batches[len(hosts)] = batches.get(len(hosts), 0.0) + (
                            share * klass.rate_per_unit_s * klass.repair_s)
        return units, batches

    def drawn_units(self, counts: list[int]) -> list[int]:
        """The units each class draws failures for: the cluster's (``counts``), and for a `rack` or `nvswitch_tray`
        class the spare racks' too, idle or standing in for a rack."""
        return [count + self.spare_units(klass) for klass, count in zip(self.classes, counts)]

    def hosts_for(self, replicas: int) -> int:
        """The hosts a job of ``replicas`` data-parallel replicas runs on: every host at full size, also when
        a host holds several replicas or a replica spans a fraction of a host."""
        return hosts_at(self.hosts, self.replicas, replicas)


def rate_sum(rates: Iterable[Iterable[float]]) -> float:
    """The sum of per-class, per-unit rates (`JobPlan.training_rates_s`, or part of them), each class's exactly
    rounded (`math.fsum`) and then theirs: the same units give the same figure whichever sum takes them."""
    return math.fsum(math.fsum(unit_rates) for unit_rates in rates)


@dataclass(frozen=True)
class ReplicationTotals:
    """Where one replication's wall time went, and what it counted."""

    productive_s: float
    slow_steps_s: float
    lost_work_s: float
    checkpoint_stall_s: float
    checkpoint_slowdown_s: float
    restart_s: float
    waiting_for_hosts_s: float
    """The part of `restart_s` a restart waited, after detection (or a planned stop), for spare or repaired hosts
    to fill the job's smallest size: what a larger spare pool (`restart.spares`) or `restart.elastic` cuts."""
    maintenance_s: float
    steps: float
    equivalent_steps: float
    """Healthy-equivalent steps kept (lost work excluded): the kept training time at the healthy step's rate of
    work; times the healthy step's tokens, the tokens trained."""
    interruptions: Counter
    planned: int
    checkpoints_written: int
    """Storage checkpoints completed, periodic and at planned stops (the `checkpoint` rows of the event log)."""
    lost_per_failure_s: tuple[float, ...]
    slow_by_cause_s: dict[str, float]
    shrinks: int
    regrows: int
    running_by_replicas_s: dict[int, float]
    """Wall time the job ran (trained, checkpointed, lost work) on each replica count: the horizon less
    restarts and maintenance."""
    regrow_restarts: int
    """Restarts taken to grow back (`regrow: on_repair`) that did: each one a regrow."""
    regrow_restarts_cut_short: int
    """Restarts taken to grow back that a failure cut short (they went on as the failure's restart)."""
    regrow_restart_s: float
    """The time of both, up to their end or the failure (a part of `restart_s`)."""
    restores: Counter = field(default_factory=Counter)
    """Restarts after a failure, completed, by the checkpoint tier they loaded (`memory`, `storage`)."""
    storage_because: Counter = field(default_factory=Counter)
    """Those that loaded storage, by why (`StorageReason`: `newer`, `copies_lost`)."""
    slowdowns: Counter = field(default_factory=Counter)
    """Degradations and stragglers that began, by class name: the `degraded` and `straggling` rows of the event
    log."""


class JobProcess:
    """One replication's job: its clock, hosts (in use, spare, in repair) and cluster state."""

    def __init__(self, plan: JobPlan, arrivals: Arrivals, events: JobEvents) -> None:
        self.plan = plan
        self.events = events
        self.times = arrivals.time_s.tolist()
        self.klass = arrivals.klass.tolist()
        self.unit = arrivals.unit.tolist()
        self.repair = arrivals.repair_s.tolist()
        self.next_arrival = 0
        self.clock = CheckpointClock(events)
        self.replicas = plan.replicas
        self.degraded: dict[Kept, int] = {}
        """The degradations in force, each with how many of its failures are not repaired yet; those of a rack out of
        the group (an idle spare's trays) are kept too, out of the state until the rack joins it (`_regrouped`)."""
        self.degraded_repairs: list[tuple[float, int, Kept]] = []
        self.missing: set[int] = set()
        self.met: set[ClusterState] = set()
        """The states the job was in, training or restarting (those of `trained_in`, and those it only waited or
        restarted in): not the sub-states of its slow-step split, nor those a restart only looked at."""
        self.missing_until: dict[int, float] = {}
        """When each host out (a slot of the group) is back from repair, the latest of its failures'."""
        self.stand_in_rack: dict[int, str] = {}
        """The slots of the group whose host is a rack's out of the group, standing in for their own, with that rack
        (`_form_group`): it stays there until the slot fails or a shrink drops it."""
        self.rack_spares = {spare: plan.rack_hosts(spare) for spare in plan.spare_racks}
        """The free hosts of each rack out of the group (a spare, a rack that left it), among the spare hosts; the
        others (``spares`` less these) are hosts back from repair. A rack in repair has none."""
        self.rack_back: dict[str, int] = {}
        """The hosts each rack out of the group and in repair brings back to its free hosts with it: its free
        ones and its stand-ins, taken by its failure, or all its hosts where it left the group."""
        self.vacated: set[int] = set()
        """The slots out whose stand-in went with its rack (`_fail`): they take any host, as stand-ins."""
        self.rack_returns: list[tuple[float, str]] = []
        """When a spare rack's host out alone (its stand-in's slot failed) is back from repair, and its rack."""
        self.group = list(plan.rack_names[:len(plan.racks)])
        """The physical racks (NVSwitch nodes) in the job's group, in place order: the i-th fills the place of
        ``plan.racks[i]`` (`_places`)."""
        self.pool: list[tuple[float, str]] = [(0.0, spare) for spare in plan.spare_racks]
        """The racks out of the group, each with the time it is free: the spares from the start, a rack that left
        (its hosts all out) once back from repair; in that order, ties in rack order (`_places`)."""
        self._refresh(0.0)
        self.in_use = plan.hosts
        self.spares = plan.spares
        self.repairs: list[float] = []
        self.lost_since_restore: set[int] = set()
        self.next_maintenance = plan.maintenance.every_s / 2 if plan.maintenance else INF
        self.restart_s = 0.0
        self.waiting_for_hosts_s = 0.0
        self.maintenance_s = 0.0
        self.interruptions: Counter = Counter()
        self.slowdowns: Counter = Counter()
        self.planned = 0
        self.lost_per_failure: list[float] = []
        self.shrinks = 0
        self.regrows = 0
        self.regrow_restarts = 0
        self.regrow_restarts_cut_short = 0
        self.regrow_restart_s = 0.0
        self.running_s: dict[int, float] = {}
        self.restores: Counter = Counter()
        self.storage_because: Counter = Counter()
        self.shares: dict[tuple, tuple[tuple[str, float], ...]] = {}
        """Each state's `_cause_shares`, by what they depend on: its replicas, the degradations in force, the racks
        in each place and the racks out in their order, which a full-size sub-state places (not when they are
        back: the state is the same). The state the job trains in, ``running``, is a function of the first three
        (no host is out while it trains). The racks in each place follow from the racks out (every other rack, in
        rack order): a key without them, as before spares were racks, is as right; they are named for the reader."""
        self.trained_in: set[ClusterState] = set()
        """The states the job trained in: not the sub-states its slow-step split asks of (attribution.py), nor
        those a restart only looked at for a route."""
        self.split_evenly: dict[ClusterState, str] = {}
        """The states whose extra time split evenly between their causes, a sub-state refused, and why."""

    @property
    def hosts_in_hand(self) -> int:
        """Hosts the job could form a group on now: those in use not out for repair, and the spares (hosts
        back from repair among them, once collected)."""
        return self.in_use - len(self.missing) + self.spares

    def run(self, env: simpy.Environment):
        """The SimPy process: train to the next event, handle it, repeat until the horizon."""
        horizon = self.plan.horizon_s
        times, count, clock = self.times, len(self.times), self.clock
        while env.now < horizon - EPS:
            now = env.now
            if self.degraded_repairs:
                self._end_degradations(now)
            arrival = times[self.next_arrival] if self.next_arrival < count else INF
            back = self.degraded_repairs[0][0] if self.degraded_repairs else INF
            maintenance = max(self.next_maintenance, now)
            regrow = self._regrow_due(now)
            t = min(arrival, back, maintenance, regrow, horizon)
            clock.advance(now, t, self.running, self._cause_shares())
            if t > now:
                self.trained_in.add(self.state)
            self.running_s[self.replicas] = self.running_s.get(self.replicas, 0.0) + t - now
            yield env.timeout(t - now)
            if t >= horizon:
                break
            if t == arrival:
                if self._skip(self.next_arrival, t):
                    continue
                self._fail(self.next_arrival, t, rolls_back=True)
                yield from self._restart(env, BuiltInCause.FAILURE)
            elif t == maintenance:
                self.planned += 1
                self._skip_windows(t)
                self._stop_cleanly(t)
                yield from self._restart(env, BuiltInCause.MAINTENANCE)
            elif t == regrow:
                self._stop_cleanly(t)
                yield from self._restart(env, BuiltInCause.REGROW)

    def _stop_cleanly(self, t: float) -> None:
        """A clean stop at ``t`` (maintenance, regrow) writes a checkpoint of the job's progress, unless the last
        completed one already holds every step: nothing trained since it was loaded (a stop right after a
        restart) or written. An async one still being written is not durable, and does not spare the write."""
        if not self.clock.saved:
            self.clock.stop_cleanly(t, t + self.running.write_s, self.running)
        self.clock.restored_from, self.clock.storage_because = "storage", "newer"

    def _regrow_due(self, now: float) -> float:
        """When a shrunk job with `regrow: on_repair` restarts to grow: now if the hosts in use, spare and back
        from repair fill its next larger size and that size's GPUs all have a route; else when enough hosts are
        back (checked again then); never when not shrunk, not regrowing on repair, or without a route."""
        if self.plan.regrow is not Regrow.ON_REPAIR or self.replicas == self.plan.replicas:
            return INF
        self._collect_repairs(now)
        larger, need = self._growth(self.replicas)
        if need > 0:
            return self._returns(need)
        return now if self.plan.costs(self._state(larger, now)) is not None else INF

    def _growth(self, replicas: int) -> tuple[int, int]:
        """The next size above ``replicas`` and how many more hosts it needs back from repair beyond those in
        use and spare (0 or less: they are in hand)."""
        larger = next(size for size in self.plan.sizes.sizes if size > replicas)
        return larger, self.plan.hosts_for(larger) - self.hosts_in_hand

    def _skip_windows(self, t: float) -> None:
        """After the window taken at ``t``, the next one due after ``t``: windows that came due while the
        job was restarting are taken as one, right after the restart, not one after the other."""
        if self.plan.maintenance is None:
            self.next_maintenance = INF
            return
        every = self.plan.maintenance.every_s
        self.next_maintenance += every * (math.floor((t - self.next_maintenance) / every) + 1)

    def _peek(self) -> int | None:
        """Index of the next arrival, if any is left."""
        return self.next_arrival if self.next_arrival < len(self.times) else None

    def _skip(self, index: int, t: float) -> bool:
        """Consume an arrival that does not interrupt: a unit not in use (a slot beyond a shrunk job, a host
        already out, a rack whose hosts the job does not use, its trays), the failure of a rack out of the group
        none of whose hosts stands in (`_rack_out_of_group_fails`) or a degradation or straggler, which is applied
        (a tray of a rack out of the group kept until that rack joins it). False for an interrupting one."""
        rack = self._rack(index)
        if rack is not None and rack not in self.group:
            if self.plan.classes[self.klass[index]].unit == "rack":
                if self._rack_stand_ins(rack, t):  # its hosts standing in are in use: it interrupts (`_fail`)
                    return False
                self._rack_out_of_group_fails(rack, index, t)
                self.events.add("failure", t, t, cause=self.plan.classes[self.klass[index]].name,
                                step=self.clock.steps)
                self.next_arrival += 1
                return True
            return self._degrade(index, t, idle=True)
        hosts = self.plan.blast[self.klass[index]][self.unit[index]] if rack is None else self._place_hosts(rack)
        if hosts and not self._touches_job(hosts):
            if rack is None and self.plan.classes[self.klass[index]].effect is Effect.DEGRADE:
                self._idle_unit_fails(index, t, hosts)
            self.next_arrival += 1
            return True
        return self._degrade(index, t)

    def _idle_unit_fails(self, index: int, t: float, hosts: tuple[int, ...]) -> None:
        """A `degrade` unit that cuts ``hosts`` off, none of them in use, fails again (after its repair: it does
        not fail in repair), as a restart waits on other hosts: one row, and the job's hosts among them, out
        since an earlier failure, back only with this repair, which a restart planned on them waits for."""
        back = t + self.repair[index]
        later = [host for host in hosts if host in self.missing and self.missing_until[host] < back]
        for host in later:
            if self.missing_until[host] in self.repairs:
                self.repairs.remove(self.missing_until[host])
                heapq.heapify(self.repairs)
            else:
                self.spares -= 1
            self.missing_until[host] = back
            heapq.heappush(self.repairs, back)
        self.events.add("failure", t, t, cause=self.plan.classes[self.klass[index]].name, step=self.clock.steps,
                        hosts=len(later))

    def _rack(self, index: int) -> str | None:
        """The physical rack of arrival ``index``'s unit where it is a rack or one of its NVSwitch trays (None for
        another unit): rack unit i is `plan.rack_names[i]`, a spare after the cluster's racks."""
        unit = self.plan.classes[self.klass[index]].unit
        if unit == "rack":
            return self.plan.rack_names[self.unit[index]]
        if unit == "nvswitch_tray":
            tray = self.plan.degradation(self.klass[index], self.unit[index]).nvswitch_tray
            assert tray is not None
            return tray[0]
        return None

    def _place_hosts(self, rack: str) -> tuple[int, ...]:
        """The hosts (slots) of the place ``rack`` fills in the group (none for a rack out of it)."""
        return self.plan.racks[self.group.index(rack)][1] if rack in self.group else ()

    def _blast(self, index: int, t: float) -> tuple[int, ...]:
        """The hosts arrival ``index`` at ``t`` takes: its unit's blast radius, a rack's that of the place it fills,
        or out of the group its hosts standing in for hosts out (`_rack_stand_ins`)."""
        rack = self._rack(index)
        if rack is None:
            return self.plan.blast[self.klass[index]][self.unit[index]]
        if self.plan.classes[self.klass[index]].unit == "rack":
            return self._place_hosts(rack) if rack in self.group else self._rack_stand_ins(rack, t)
        return ()

    def _rack_stand_ins(self, rack: str, t: float) -> tuple[int, ...]:
        """The slots whose hosts at ``t`` are those of ``rack``, a spare rack out of the group, standing in for
        their own (`stand_in_rack`)."""
        return tuple(sorted(slot for slot, spare in self.stand_in_rack.items()
                            if spare == rack and slot < self.in_use and slot not in self.missing))

    def _rack_out_of_group_fails(self, rack: str, index: int, t: float, standing_in: int = 0) -> None:
        """Rack ``rack``, out of the group (a spare, a rack back from repair, one still in repair), fails at ``t``:
        it is in repair until the later of its repairs' ends, and no restart takes it before (`_places`). Free, its
        free hosts (a spare rack's `rack_spares`, a cluster rack's all) leave the spare hosts until then, as the
        rack does the pool; the ``standing_in`` ones that stand in for hosts out the job loses (`_fail`); all come
        back with the rack. In repair, they come back then."""
        back = t + self.repair[index]
        free = {switch: at for at, switch in self.pool}
        self._collect_repairs(t)
        if free[rack] <= t + EPS:
            hosts = self.rack_spares.get(rack, self.plan.rack_hosts(rack))
            self.spares -= hosts
            self.rack_spares[rack] = 0
            self.rack_back[rack] = hosts + standing_in
            for _ in range(hosts + standing_in):
                heapq.heappush(self.repairs, back)
        elif back > free[rack]:
            self._postpone_repairs(self.rack_back.get(rack, self.plan.rack_hosts(rack)), free[rack], back)
        free[rack] = max(free[rack], back)
        self.pool = self._pool_order(free)

    def _postpone_repairs(self, count: int, until: float, to: float) -> None:
        """The ``count`` latest host repairs ending by ``until`` (a rack's in repair until then: its hosts' are
        the latest by then, unless some failed alone before it) end at ``to`` instead."""
        ordered = sorted(self.repairs)
        cut = bisect.bisect_right(ordered, until + EPS)
        ordered[max(0, cut - count):cut] = [to] * min(count, cut)
        heapq.heapify(ordered)
        self.repairs = ordered

    def _pool_order(self, free: dict[str, float]) -> list[tuple[float, str]]:
        """The racks out of the group with the times they are free (``free``), in that order, ties in rack
        order."""
        rank = self.plan.rack_order
        return sorted(((at, switch) for switch, at in free.items()), key=lambda out: (out[0], rank[out[1]]))

    def _touches_job(self, hosts: tuple[int, ...]) -> bool:
        """Whether any of ``hosts`` is in use by the job."""
        for host in hosts:
            if host < self.in_use and host not in self.missing:
                return True
        return False

    def _degrade(self, index: int, t: float, idle: bool = False) -> bool:
        """Apply a `degrade` or `straggle` arrival until its repair; False for interrupting ones. A degradation
        that would leave some GPU without a route interrupts too: one that takes hosts as `replace` does (a
        leaf above single-NIC hosts), one that takes none (the last spine up, all that joined the leaves) is
        applied, and the restart waits for the repair that gives the job its routes back (`_routable`); a
        degradation during that wait (another spine: one in repair does not fail again, `processes.py`) starts
        the restart over, as any failure of a unit in use does, so that it waits for the later repair. ``idle``:
        an NVSwitch tray of a rack out of the group, kept until its repair, in the state only once its rack joins
        the group."""
        klass = self.plan.classes[self.klass[index]]
        if klass.effect.interrupts:
            return False
        self._end_degradations(t)
        key = self._physical(index)
        if key not in self.degraded and self.costs is not None and self._blast(index, t):
            if self.plan.costs(self._state_of(self.replicas, [*self.degraded, key], t)) is None:
                return False
        end = t + self.repair[index]
        self.degraded[key] = self.degraded.get(key, 0) + 1
        heapq.heappush(self.degraded_repairs, (end, index + 1, key))
        self._refresh(t)
        self.events.add("straggling" if klass.effect is Effect.STRAGGLE else "degraded", t, end, cause=klass.name,
                        gpus=key[1].gpus, step_s=self.costs.step_s if self.costs is not None else 0.0)
        self.slowdowns[klass.name] += 1
        if self.costs is None and klass.effect is Effect.DEGRADE and not idle:
            return False
        self.next_arrival += 1
        return True

    def _end_degradations(self, now: float) -> None:
        changed = False
        while self.degraded_repairs and self.degraded_repairs[0][0] <= now + EPS:
            key = heapq.heappop(self.degraded_repairs)[2]
            self.degraded[key] -= 1
            if not self.degraded[key]:
                del self.degraded[key]
                changed = True
        if changed:
            self._refresh(now)

    def _state(self, replicas: int, at: float) -> ClusterState:
        """The state of the job on ``replicas`` with the degradations in force, its group formed at ``at``."""
        return self._state_of(replicas, self.degraded, at)

    def _state_of(self, replicas: int, kept: Iterable[Kept], at: float) -> ClusterState:
        """The state of the job on ``replicas`` with the degradations ``kept``, its group formed at ``at``."""
        return self.plan.state_of(replicas, [degradation for _, degradation in self._regrouped(kept, at, replicas)])

    def _places(self, replicas: int, at: float) -> dict[str, str]:
        """Where each physical rack (its NVSwitch node: a cluster's rack or a spare) sits in the group of
        ``replicas`` a restart forms at ``at``: the place it fills (a place is a rack of the full cluster, as the
        cluster names it). The job's own group when it keeps its size and no host is out. Else a rack whose
        hosts are all out (a rack failure) leaves, its trays and links down with it (repaired with it); racks free
        by ``at`` (spares, racks back from repair; in the order they became free) take the places the group needs
        beyond the racks kept, a rack in repair never; and they fill the places in rack order, the spares after
        the cluster's racks, as the hosts close ranks (a group's hosts are the slots from 0 up). A place that no
        free rack fills (spare hosts short of a rack's) has no rack: no tray of it fails. Exact only where whole
        racks are lost: with some of a rack's hosts out the slots shift across rack boundaries but no rack moves,
        so its trays down stay on its place (the slot model of a shrunk rack job, an approximation). ``at``
        infinite: the racks out all free, in their order (the full-size sub-states of `_cause_shares`, the job as
        it would be without its shrink)."""
        racks = self.plan.racks
        if replicas == self.replicas and not self.missing:
            return {switch: place for switch, (place, _) in zip(self.group, racks)}
        kept = [switch for switch, hosts in self._present_racks() if not all(host in self.missing for host in hosts)]
        hosts = self.plan.hosts_for(replicas)
        needed = sum(1 for _, rack_hosts in racks if min(rack_hosts) < hosts)
        free = [switch for back, switch in self.pool if back <= at + EPS]
        order = sorted(kept + free[:max(0, needed - len(kept))], key=self.plan.rack_order.__getitem__)
        return {switch: place for switch, (place, _) in zip(order, racks)}

    def _present_racks(self) -> list[tuple[str, tuple[int, ...]]]:
        """The racks in the job's group, in place order, each with the hosts (slots) of the place it fills."""
        return [(switch, hosts) for switch, (_, hosts) in zip(self.group, self.plan.racks)]

    def _physical(self, index: int) -> Kept:
        """Arrival ``index``'s degradation as the job keeps it (`_regrouped` places it again for each state): an
        NVSwitch tray is drawn on its physical rack; links on the places of their hosts (and leaves), kept with
        the racks that stand there (`Frame`): the group's, then the racks out in their order on the places past
        them. A spare's links so move with it as a cluster rack's do; none is dropped."""
        klass, degradation = self.klass[index], self.plan.degradation(self.klass[index], self.unit[index])
        if not self.plan.racks or not degradation.links:
            return klass, degradation, ()
        standing = self.group + [switch for _, switch in self.pool]
        return klass, degradation, tuple((place, switch) for (place, _), switch in zip(self.plan.racks, standing))

    def _regrouped(self, kept: Iterable[Kept], at: float, replicas: int | None = None) -> list[tuple[int, Degradation]]:
        """The degradations ``kept`` (each with its class's index) where the group the job forms at ``at`` on
        ``replicas`` (None: its own) puts them (`_places`): NVSwitch trays down and links down follow their
        rack's hardware (`JobPlan.follow_links`), leave with it, or wait out of the state for it to join."""
        if not self.plan.racks:
            return [(index, degradation) for index, degradation, _ in kept]
        places = self._places(self.replicas if replicas is None else replicas, at)
        return [(key[0], placed) for key in kept if (placed := self._placed(key, places)) is not None]

    def _placed(self, key: Kept, moves: dict[str, str]) -> Degradation | None:
        """The degradation of ``key`` with its racks moved by ``moves`` (physical rack -> place; None where it is
        on no rack moved: its rack left or is out of the group)."""
        _, degradation, frame = key
        tray, links = degradation.nvswitch_tray, degradation.links
        if tray is not None:
            return replace(degradation, nvswitch_tray=(moves[tray[0]], tray[1])) if tray[0] in moves else None
        if links and self.plan.follow_links is not None:
            followed = self.plan.follow_links({place: moves[rack] for place, rack in frame if rack in moves}, links)
            return replace(degradation, links=followed) if followed else None
        return degradation

    def _regroup_degradations(self, replicas: int, at: float) -> bool:
        """Take the racks whose hosts are all out off the job, into the pool of racks out with the time they are
        back from repair, and the degradations on them with them, before the hosts out are forgotten; place the
        racks the group of ``replicas`` takes from the pool at ``at`` (`_places`). Degradations of racks already
        out (an idle spare's trays) stay, for when the rack joins. Whether the group or its degradations changed
        (the state then moves with them)."""
        if not self.plan.racks:
            return False
        before = {switch: place for switch, (place, _) in zip(self.group, self.plan.racks)}
        places = self._places(replicas, at)
        free = {switch: back for back, switch in self.pool if switch not in places}
        for switch, hosts in self._present_racks():
            if switch not in places:
                free[switch] = max(self.missing_until[host] for host in hosts)
                self.rack_spares[switch] = 0
                self.rack_back[switch] = len(hosts)
        self.pool = self._pool_order(free)
        group, self.group = self.group, sorted(places, key=self.plan.rack_order.__getitem__)
        gone = {key for key in self.degraded
                if self._placed(key, before) is not None and self._placed(key, places) is None}
        if not gone:
            return group != self.group
        self.degraded = {key: count for key, count in self.degraded.items() if key not in gone}
        self.degraded_repairs = [entry for entry in self.degraded_repairs if entry[2] not in gone]
        heapq.heapify(self.degraded_repairs)
        return True

    def _refresh(self, at: float) -> None:
        """The cluster state at ``at``, its costs (None while it leaves some GPU without a route: the job waits in
        a restart) and the slow-step causes in force (those of the degradations in the state), after a change."""
        in_state = self._regrouped(self.degraded, at)
        self.state = self.plan.state_of(self.replicas, [degradation for _, degradation in in_state])
        self.costs = self.plan.costs(self.state)
        self.met.add(self.state)
        causes = {self.plan.classes[index].name for index, _ in in_state}
        if self.replicas < self.plan.replicas:
            causes.add(BuiltInCause.ELASTIC_SHRINK)
        self.causes = tuple(sorted(causes))

    def _cause_shares(self) -> tuple[tuple[str, float], ...]:
        """Each cause in force's part of the training time in the state that is extra time (attribution.py),
        from the sub-states' steps: the state with the degradations of a subset of the causes, on the shrunk
        replicas where `elastic_shrink` is among them, else on the job's."""
        if not self.causes:
            return ()
        key = (self.replicas, frozenset(self.degraded), tuple(self.group), tuple(switch for _, switch in self.pool))
        if key not in self.shares:
            def extra(subset: frozenset[str]) -> float | None:
                replicas = self.replicas if BuiltInCause.ELASTIC_SHRINK in subset else self.plan.replicas
                costs = self.plan.costs(self._state_of(
                    replicas, (kept for kept in self.degraded if self.plan.classes[kept[0]].name in subset), INF))
                return None if costs is None else costs.step_s / costs.equivalent_step_s - 1.0

            def refused(why: str) -> None:
                self.split_evenly.setdefault(state, why)

            c, state = self.running, self.state
            self.shares[key] = cause_shares(1.0 - c.equivalent_step_s / c.step_s, self.causes, extra, refused)
        return self.shares[key]

    @property
    def running(self) -> SegmentCosts:
        """The costs of the state the job trains in: never one without a route (the restart waits it out)."""
        if self.costs is None:
            raise SimulationError(f"the job trains in cluster state {self.state}, which has no route for some GPU")
        return self.costs

    def _fail(self, index: int, t: float, rolls_back: bool) -> None:
        """An interrupting failure: lost work (when it strikes progress not yet in a checkpoint: training, or
        a planned stop's checkpoint being written), hosts to repair, one row."""
        self.next_arrival += 1
        klass = self.plan.classes[self.klass[index]]
        lost_hosts: list[int] = []
        if klass.effect is not Effect.RESTART:
            lost_hosts = [host for host in dict.fromkeys(self._blast(index, t))
                          if host < self.in_use and host not in self.missing]
        rack = self._rack(index) if klass.unit == "rack" else None
        rack_out = rack if rack is not None and rack not in self.group else None
        if rack_out is not None:
            self._rack_out_of_group_fails(rack_out, index, t, standing_in=len(lost_hosts))
        # A restart loading an in-memory snapshot falls back to storage when the hosts lost since the last
        # completed restore (this failure's and those of earlier failures during the restart) took out all
        # copies of some host's snapshot.
        self.lost_since_restore.update(lost_hosts)
        survives = snapshot_survives((host for host in self.lost_since_restore if host < self.in_use), self.in_use,
                                     self.plan.memory_replicas)
        rolls_back = rolls_back or (self.clock.restored_from == "memory" and not survives)
        lost = self.clock.fail(t, survives) if rolls_back else 0.0
        if rolls_back:
            self.lost_per_failure.append(lost)
        for host in lost_hosts:
            self.missing.add(host)
            spare = self.stand_in_rack.pop(host, None)
            if spare is not None and rack_out is None:  # a spare rack's host: back to its rack once repaired
                heapq.heappush(self.rack_returns, (t + self.repair[index], spare))
            if rack_out is not None:  # its stand-in is in repair with its rack: the slot, not its own host, lacks one
                self.vacated.add(host)
                self.missing_until[host] = max(self.missing_until.get(host, 0.0), t)
                continue
            self.missing_until[host] = max(self.missing_until.get(host, 0.0), t + self.repair[index])
            heapq.heappush(self.repairs, t + self.repair[index])
        self.interruptions[klass.name] += 1
        restored: tuple[Tier | Literal[""], StorageReason | Literal[""]] = self._restored() if rolls_back else ("", "")
        tier, because = restored
        self.events.add("failure", t, t, cause=klass.name, step=self.clock.steps, lost_work_s=lost,
                        hosts=len(lost_hosts), tier=tier, storage_because=because)

    def _restored(self) -> tuple[Tier, StorageReason | Literal[""]]:
        """The tier the last roll-back restored from, and why it was storage ('' for memory)."""
        tier = self.clock.restored_from
        return tier, self.clock.storage_because if tier == "storage" else ""

    def _collect_repairs(self, now: float) -> None:
        """Hosts back from repair by ``now`` join the spare hosts: a spare rack's among its free hosts (with the
        rack, where it is in repair then), and a rack's own once it is back, as many as are back (a host of a
        rack that left the group may be back later than it)."""
        while self.repairs and self.repairs[0] <= now + EPS:
            heapq.heappop(self.repairs)
            self.spares += 1
        while self.rack_returns and self.rack_returns[0][0] <= now + EPS:
            _, spare = heapq.heappop(self.rack_returns)
            if spare in self.rack_back:
                self.rack_back[spare] += 1
            elif spare in self.rack_spares:
                self.rack_spares[spare] += 1
        free = {switch: at for at, switch in self.pool}
        for spare in [spare for spare in self.rack_back if free[spare] <= now + EPS]:
            loose = self.spares - sum(self.rack_spares.values())
            self.rack_spares[spare] = min(self.rack_back.pop(spare), loose)

    def _relaunch_plan(self, gate: float) -> tuple[float, float, int, SegmentCosts]:
        """When the restarting job has the hosts it needs, when it re-forms its group (its rendezvous: launch
        begins then) and on how many replicas, with that state's costs. The group forms once the job may
        (``gate``: detection, or a planned stop, is over), the hosts fill its smallest size (waiting for repaired
        ones, overlapping detection: the first time returned, ``gate`` when none is missing) and rescheduling has
        placed them; every host back by then joins, as a torchelastic rendezvous admits every node that has
        arrived (one back later re-forms the group, `_rejoin_due`, or waits for the next restart). It takes the
        largest of its sizes (all its replicas but for an elastic job) those hosts fill whose GPUs all have a
        route; else the largest they fill, once repairs give it its routes back (hosts back during that wait
        join the next restart; the wait for a route is not a wait for hosts)."""
        short = self.plan.hosts_for(self.plan.sizes.sizes[0]) - self.hosts_in_hand
        formed = max(gate, self._returns(short)) if short > 0 else gate
        rendezvous = formed + self.plan.reschedule_s
        have = self._hosts_by(rendezvous)
        fitting = [size for size in reversed(self.plan.sizes.sizes) if self.plan.hosts_for(size) <= have]
        for size in fitting:
            costs = self.costs if size == self.replicas else self.plan.costs(self._state(size, rendezvous))
            if costs is not None:
                return formed, rendezvous, size, costs
        size = fitting[0] if fitting else self.plan.sizes.sizes[0]
        routable, costs = self._routable(size, rendezvous)
        return formed, max(formed, routable) + self.plan.reschedule_s, size, costs

    def _hosts_by(self, t: float) -> int:
        """The hosts a group formed at ``t`` could take: those in hand and those back from repair by then."""
        return self.hosts_in_hand + sum(1 for back in self.repairs if back <= t + EPS)

    def _routable(self, replicas: int, at: float) -> tuple[float, SegmentCosts]:
        """When the job on ``replicas`` replicas, its group formed at ``at``, has a route for every GPU (at once,
        unless an outage is in force: then at the repair that ends it), and the costs of that state."""
        counts = dict(self.degraded)
        costs = self.plan.costs(self._state_of(replicas, counts, at))
        if costs is not None:
            return 0.0, costs
        for end, _, key in sorted(self.degraded_repairs):
            counts[key] -= 1
            if not counts[key]:
                del counts[key]
                costs = self.plan.costs(self._state_of(replicas, counts, at))
                if costs is not None:
                    return end, costs
        raise SimulationError(f"no route for some GPU on {replicas} replicas with every degradation repaired")

    def _returns(self, count: int) -> float:
        """The time by which ``count`` (at least 1) more hosts are back from repair (never, when fewer are
        away)."""
        if count > len(self.repairs):
            return INF
        return heapq.nsmallest(count, self.repairs)[-1]

    def _restart(self, env: simpy.Environment, cause: BuiltInCause):
        """Restart until it completes without an interrupting failure (or the horizon comes). A planned one
        (maintenance, regrow) first stops for the checkpoint write, and a maintenance one for the maintenance;
        a failure during a maintenance stop restarts with its detection overlapping the rest of it, one during
        a regrow's write with its detection (the write is lost, nothing else holds the job)."""
        horizon = self.plan.horizon_s
        begin, began = env.now, cause
        detects = cause is BuiltInCause.FAILURE
        stopped_until = begin if detects else begin + self._stop_s(self.running, cause)
        maintained_until = stopped_until if cause is BuiltInCause.MAINTENANCE else begin
        while True:
            now = env.now
            self._collect_repairs(now)
            self._end_degradations(now)
            gate = max(stopped_until, now + self.plan.detection_s if detects else now)
            formed, rendezvous, replicas, costs = self._relaunch_plan(gate)
            load_s = costs.memory_load_s if self.clock.restored_from == "memory" else costs.load_s
            end = rendezvous + self.plan.launch_s + load_s + costs.warmup_s
            planned = self._hosts_by(rendezvous)
            arrival = self._skip_arrivals(rendezvous)
            if self._hosts_by(rendezvous) < planned:  # an idle rack failed, taking hosts the plan counted
                continue
            rejoin = INF
            if arrival is None or self.times[arrival] >= rendezvous:
                self._form_group(rendezvous, replicas)
                larger, back = self._grows_back(rendezvous, end, replicas)
                arrival = self._skip_arrivals(min(end, back))
                if arrival is None or self.times[arrival] >= min(end, back):
                    rejoin = self._rejoin_due(larger, back) if back < end else INF
                    if rejoin == INF:
                        arrival = self._skip_arrivals(end)
            stop = min(end, rejoin, horizon)
            if arrival is not None and self.times[arrival] < stop:
                stop = self.times[arrival]
            yield env.timeout(stop - now)
            maintenance = max(0.0, min(stop, maintained_until) - now)
            self.maintenance_s += maintenance
            self.restart_s += stop - now - maintenance
            self.waiting_for_hosts_s += max(0.0, min(stop, formed) - gate)
            if cause is BuiltInCause.REGROW:
                self.regrow_restart_s += stop - now
            self.clock.settle_stop(stop)
            tier, because = self._restored()
            if stop >= horizon:
                self.events.add("restart", begin, stop, cause=cause, began=began, step=self.clock.steps, tier=tier,
                                storage_because=because)
                return
            if stop == rejoin:
                detects = False
                continue
            if arrival is not None and stop < end:
                self._fail(arrival, stop, rolls_back=self.clock.stopping)
                if cause is BuiltInCause.REGROW:
                    self.regrow_restarts_cut_short += 1
                    stopped_until = stop
                detects, cause = True, BuiltInCause.FAILURE
                continue
            if cause is BuiltInCause.REGROW:
                self.regrow_restarts += 1
            self._relaunch(replicas, stop)
            self.lost_since_restore.clear()
            if cause is BuiltInCause.FAILURE:
                self.restores[tier] += 1
                if because:
                    self.storage_because[because] += 1
            self.events.add("restart", begin, end, cause=cause, began=began, step=self.clock.steps, tier=tier,
                            storage_because=because)
            return

    def _skip_arrivals(self, until: float) -> int | None:
        """Consume the arrivals before ``until`` that do not interrupt a restart (`_skip`: units not in use,
        degradations and stragglers, applied); the index of the next one left, if any."""
        arrival = self._peek()
        while arrival is not None and self.times[arrival] < until and self._skip(arrival, self.times[arrival]):
            arrival = self._peek()
        return arrival

    def _grows_back(self, rendezvous: float, end: float, replicas: int) -> tuple[int, float]:
        """For a restart that formed its group on ``replicas`` at ``rendezvous`` and completes at ``end``: the
        next larger size and the return of the host with which the hosts back fill it, between the two
        (``INF`` otherwise); only with `regrow: on_repair` below full size (with `next_restart` hosts back wait
        for the next restart)."""
        if self.plan.regrow is not Regrow.ON_REPAIR or replicas == self.plan.replicas:
            return replicas, INF
        larger, need = self._growth(replicas)
        back = self._returns(need) if need > 0 else INF
        return larger, back if rendezvous + EPS < back < end else INF

    def _rejoin_due(self, larger: int, back: float) -> float:
        """When the restart re-forms its group on ``larger`` replicas, during launch, checkpoint load or warm-up:
        at ``back``, the host's return (`_grows_back`), as torchelastic agents restart their workers when a node
        waits at the rendezvous, if that size's GPUs all have a route with the degradations in force then
        (those that began before it, consumed by `_skip_arrivals`, less those repaired by it); never otherwise.
        Judged at the pass's start, a spine repaired before the host came back kept the job small, and two spines
        lost before it re-formed a group that could not grow."""
        in_force = Counter(self.degraded)
        for repaired, _, key in self.degraded_repairs:
            if repaired <= back + EPS:
                in_force[key] -= 1
        kept = [key for key, count in in_force.items() if count > 0]
        return back if self.plan.costs(self._state_of(larger, kept, back)) is not None else INF

    def _stop_s(self, costs: SegmentCosts, cause: BuiltInCause) -> float:
        """How long a planned stop holds the job before its restart: the checkpoint write it began (none for a
        clean stop that found its progress already saved, `_stop_cleanly`), and the maintenance."""
        write = costs.write_s if self.clock.stopping else 0.0
        duration = self.plan.maintenance.duration_s if self.plan.maintenance else 0.0
        return write + (duration if cause is BuiltInCause.MAINTENANCE else 0.0)

    def _form_group(self, rendezvous: float, replicas: int) -> None:
        """The group a restart forms at its ``rendezvous`` on ``replicas``: its hosts (every slot of that size,
        spares and hosts back from repair by then standing in for those out) are in use from then on, so that a
        failure of any of them during launch, load or warm-up starts the restart over; the rest are spares. A
        rack whose hosts are all back from repair by then stays in the group (`_places`)."""
        self._collect_repairs(rendezvous)
        available = self.hosts_in_hand
        self.in_use = self.plan.hosts_for(replicas)
        self.spares = available - self.in_use
        back = {host for host in self.missing if self.missing_until[host] <= rendezvous + EPS}
        self.missing -= back
        regrouped = self._regroup_degradations(replicas, rendezvous)
        self._place_stand_ins(sorted(slot for slot in self.missing | self.vacated if slot < self.in_use))
        self.missing.clear()
        self.vacated.clear()
        self.missing_until.clear()
        if (regrouped or back) and replicas == self.replicas:
            self._refresh(rendezvous)

    def _place_stand_ins(self, filled: list[int]) -> None:
        """Record which spare rack's hosts stand in for the ``filled`` slots of the group just formed (their own
        hosts out): hosts back from repair first, then the free racks' out of the group in pool order
        (`stand_in_rack`). A shrink's dropped stand-ins go back to their racks; a rack that joined the group keeps
        no spare hosts, stand-ins nor hosts to come back (its hosts are its place's). A rack's host the spare count
        takes beyond those slots (a regrow's, or one standing in for a host the count has back while a failure
        took its stand-in) stands in at the first slot without one."""
        for slot in [slot for slot in self.stand_in_rack if slot >= self.in_use]:
            self.rack_spares[self.stand_in_rack.pop(slot)] += 1
        for spare in [spare for spare in self.rack_spares if spare in self.group]:
            del self.rack_spares[spare]
        self.stand_in_rack = {slot: spare for slot, spare in self.stand_in_rack.items() if spare not in self.group}
        self.rack_returns = [(back, spare) for back, spare in self.rack_returns if spare not in self.group]
        heapq.heapify(self.rack_returns)
        short = sum(self.rack_spares.values()) - self.spares
        others = (slot for slot in range(self.in_use) if slot not in self.stand_in_rack and slot not in filled)
        slots = itertools.chain(filled, others)
        for _, spare in self.pool:
            while short > 0 and self.rack_spares.get(spare, 0) > 0:
                self.rack_spares[spare] -= 1
                short -= 1
                taken = next(slots, None)
                if taken is not None:
                    self.stand_in_rack[taken] = spare

    def _relaunch(self, replicas: int, at: float) -> None:
        """A restart completed at ``at`` on ``replicas``: the job trains on that size (its group formed at the
        rendezvous, `_form_group`), a shrink or a regrow when it changed."""
        if replicas != self.replicas:
            if replicas < self.replicas:
                self.shrinks += 1
            else:
                self.regrows += 1
            self.replicas = replicas
            self._refresh(at)

    def totals(self, healthy: SegmentCosts) -> ReplicationTotals:
        """The replication's totals: its time split into parts, its steps (and their worth at the ``healthy``
        step time), interruptions and resizes."""
        clock = self.clock
        kept_wall = clock.wall - clock.lost_wall
        kept_equiv = clock.equiv - clock.lost_equiv
        slow_by_cause = clock.slow_by_cause()
        slow = sum(slow_by_cause.values())
        return ReplicationTotals(
            productive_s=kept_wall - slow, slow_steps_s=slow, lost_work_s=clock.lost_wall,
            checkpoint_stall_s=clock.stall_s, checkpoint_slowdown_s=clock.slow_s, restart_s=self.restart_s,
            waiting_for_hosts_s=self.waiting_for_hosts_s, maintenance_s=self.maintenance_s, steps=clock.steps,
            equivalent_steps=kept_equiv / healthy.step_s, interruptions=self.interruptions,
            planned=self.planned, checkpoints_written=clock.written, lost_per_failure_s=tuple(self.lost_per_failure),
            slow_by_cause_s=slow_by_cause, shrinks=self.shrinks, regrows=self.regrows,
            running_by_replicas_s=dict(self.running_s), regrow_restarts=self.regrow_restarts,
            regrow_restarts_cut_short=self.regrow_restarts_cut_short, regrow_restart_s=self.regrow_restart_s,
            restores=self.restores, storage_because=self.storage_because, slowdowns=self.slowdowns)
