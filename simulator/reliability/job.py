"""The job process of one replication: a SimPy process that trains in whole segments between events
(failures, planned maintenance, a degraded spine coming back) and restarts after interruptions.

Failures arrive per unit slot of the job's topology (processes.py). A failure of a unit the job is not using
(a slot beyond a shrunk job's hosts, or a host already out) is ignored. `replace` and `restart` failures
interrupt: the clock rolls back to the last completed checkpoint, the hosts in the blast radius go to repair,
and the restart runs detection, rescheduling (spare hosts; when there are too few, waiting for repaired ones,
or with `elastic` shrinking to the replicas the hosts allow), launch, checkpoint load and warm-up steps. An
interrupting failure during a restart starts it over. `degrade` failures (spines) change the cluster state
until their repair. Planned maintenance windows come every `every_s`, the first after half a period; at each
the job checkpoints, stops for its duration and restarts without detection (a window that falls inside a
restart is taken right after it).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from simulator.reliability.checkpoint import SegmentCosts
from simulator.reliability.components import FailureClass, Maintenance
from simulator.reliability.events import JobEvents
from simulator.reliability.processes import Arrivals
from simulator.reliability.states import ClusterState
from simulator.reliability.training import EPS, CheckpointClock

INF = math.inf


@dataclass(frozen=True)
class JobPlan:
    """Everything a replication needs that does not change between replications."""

    horizon_s: float
    classes: tuple[FailureClass, ...]
    blast: tuple[tuple[tuple[int, ...], ...], ...]
    maintenance: Maintenance | None
    hosts: int
    replicas: int
    spines: int
    spares: int
    elastic: bool
    costs: Callable[[ClusterState], SegmentCosts]

    @property
    def hosts_per_replica(self) -> int:
        return self.hosts // self.replicas


@dataclass(frozen=True)
class ReplicationTotals:
    """Where one replication's wall time went, and what it counted."""

    productive_s: float
    slow_steps_s: float
    lost_work_s: float
    checkpoint_stall_s: float
    checkpoint_slowdown_s: float
    restart_s: float
    maintenance_s: float
    steps: float
    tokens: float
    interruptions: Counter
    planned: int
    lost_per_failure_s: tuple[float, ...]


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
        self.state = ClusterState(plan.replicas)
        self.in_use = plan.hosts
        self.spares = plan.spares
        self.repairs: list[float] = []
        self.missing: set[int] = set()
        self.spine_repairs: list[float] = []
        self.next_maintenance = plan.maintenance.every_s / 2 if plan.maintenance else INF
        self.restart_s = 0.0
        self.maintenance_s = 0.0
        self.interruptions: Counter = Counter()
        self.planned = 0
        self.lost_per_failure: list[float] = []

    def run(self, env: simpy.Environment):
        """The SimPy process: train to the next event, handle it, repeat until the horizon."""
        horizon = self.plan.horizon_s
        while env.now < horizon - EPS:
            self._repair_spines(env.now)
            costs = self.plan.costs(self.state)
            arrival = self._peek()
            spine_back = self.spine_repairs[0] if self.spine_repairs else INF
            maintenance = max(self.next_maintenance, env.now)
            t = min(self.times[arrival] if arrival is not None else INF, spine_back, maintenance, horizon)
            self.clock.advance(env.now, t, costs)
            yield env.timeout(t - env.now)
            if t >= horizon:
                break
            if arrival is not None and t == self.times[arrival]:
                if self._skip(arrival, t):
                    continue
                self._fail(arrival, t, during_training=True)
                yield from self._restart(env, planned=False)
            elif t == maintenance:
                self.planned += 1
                self.next_maintenance += self.plan.maintenance.every_s if self.plan.maintenance else INF
                self.clock.stop_cleanly(t)
                yield from self._restart(env, planned=True)

    def _peek(self) -> int | None:
        """Index of the next arrival, if any is left."""
        return self.next_arrival if self.next_arrival < len(self.times) else None

    def _skip(self, index: int, t: float) -> bool:
        """Consume an arrival that does not interrupt: a unit not in use (a slot beyond a shrunk job, a host
        already out) or a `degrade` failure, which is applied. False for an interrupting one."""
        hosts = self.plan.blast[self.klass[index]][self.unit[index]]
        if hosts and not any(h < self.in_use and h not in self.missing for h in hosts):
            self.next_arrival += 1
            return True
        return self._degrade(index, t)

    def _degrade(self, index: int, t: float) -> bool:
        """Apply a `degrade` arrival (a spine down until repaired); False for interrupting ones."""
        klass = self.plan.classes[self.klass[index]]
        if klass.effect != "degrade":
            return False
        self.next_arrival += 1
        if self.state.spines_down + 1 < self.plan.spines:
            heapq.heappush(self.spine_repairs, t + self.repair[index])
            self.state = ClusterState(self.state.replicas, self.state.spines_down + 1)
            self.events.add("degraded", t, t + self.repair[index], cause=klass.name)
        return True

    def _repair_spines(self, now: float) -> None:
        while self.spine_repairs and self.spine_repairs[0] <= now + EPS:
            heapq.heappop(self.spine_repairs)
            self.state = ClusterState(self.state.replicas, self.state.spines_down - 1)

    def _fail(self, index: int, t: float, during_training: bool) -> None:
        """An interrupting failure: lost work, hosts to repair, one row."""
        self.next_arrival += 1
        klass = self.plan.classes[self.klass[index]]
        lost = self.clock.fail(t) if during_training else 0.0
        if during_training:
            self.lost_per_failure.append(lost)
        hosts = 0
        if klass.effect == "replace":
            for host in self.plan.blast[self.klass[index]][self.unit[index]]:
                if host < self.in_use and host not in self.missing:
                    self.missing.add(host)
                    heapq.heappush(self.repairs, t + self.repair[index])
                    hosts += 1
        self.interruptions[klass.name] += 1
        self.events.add("failure", t, t, cause=klass.name, step=self.clock.steps, lost_work_s=lost, hosts=hosts)

    def _collect_repairs(self, now: float) -> None:
        while self.repairs and self.repairs[0] <= now + EPS:
            heapq.heappop(self.repairs)
            self.spares += 1

    def _hosts_ready(self, now: float) -> tuple[float, int]:
        """When enough hosts are there to relaunch, and the replicas the job then runs."""
        per_replica = self.plan.hosts_per_replica
        healthy = self.in_use - len(self.missing)
        if self.plan.elastic:
            replicas = min(self.plan.replicas, (healthy + self.spares) // per_replica)
            if replicas >= 1:
                return now, replicas
            short = per_replica - healthy - self.spares
            return self._returns(short), 1
        short = len(self.missing) - self.spares
        return (self._returns(short) if short > 0 else now), self.state.replicas

    def _returns(self, count: int) -> float:
        """The time by which ``count`` more hosts are back from repair (never, when fewer are away)."""
        if count > len(self.repairs):
            return INF
        return heapq.nsmallest(count, self.repairs)[-1]

    def _restart(self, env: simpy.Environment, planned: bool):
        """Restart until it completes without an interrupting failure (or the horizon comes)."""
        horizon = self.plan.horizon_s
        begin = env.now
        while True:
            now = env.now
            self._collect_repairs(now)
            ready, replicas = self._hosts_ready(now)
            state = ClusterState(replicas, self.state.spines_down)
            costs = self.plan.costs(state)
            pre = self._maintenance_stop(costs) if planned else costs.detection_s
            end = now + pre + max(0.0, ready - now - pre) + costs.fixed_restart_s + costs.load_s + costs.warmup_s
            arrival = self._peek()
            while arrival is not None and self.times[arrival] < end and self._skip(arrival, self.times[arrival]):
                arrival = self._peek()
            stop = min(end, horizon)
            if arrival is not None and self.times[arrival] < stop:
                stop = self.times[arrival]
            yield env.timeout(stop - now)
            maintenance = min(stop - now, pre) if planned else 0.0
            self.maintenance_s += maintenance
            self.restart_s += stop - now - maintenance
            if stop >= horizon:
                return
            if arrival is not None and stop < end:
                self._fail(arrival, stop, during_training=False)
                planned = False
                continue
            self._relaunch(end, state)
            self.events.add("restart", begin, end, cause="maintenance" if planned else "failure")
            return

    def _maintenance_stop(self, costs: SegmentCosts) -> float:
        duration = self.plan.maintenance.duration_s if self.plan.maintenance else 0.0
        return costs.write_s + duration

    def _relaunch(self, t: float, state: ClusterState) -> None:
        self._collect_repairs(t)
        available = self.in_use - len(self.missing) + self.spares
        self.in_use = state.replicas * self.plan.hosts_per_replica
        self.spares = available - self.in_use
        self.missing.clear()
        self.state = state

    def totals(self, healthy: SegmentCosts) -> ReplicationTotals:
        clock = self.clock
        kept_wall = clock.wall - clock.lost_wall
        kept_equiv = clock.equiv - clock.lost_equiv
        return ReplicationTotals(
            productive_s=kept_equiv, slow_steps_s=kept_wall - kept_equiv, lost_work_s=clock.lost_wall,
            checkpoint_stall_s=clock.stall_s, checkpoint_slowdown_s=clock.slow_s, restart_s=self.restart_s,
            maintenance_s=self.maintenance_s, steps=clock.steps,
            tokens=kept_equiv / healthy.step_s * healthy.tokens_per_step, interruptions=self.interruptions,
            planned=self.planned, lost_per_failure_s=tuple(self.lost_per_failure))
