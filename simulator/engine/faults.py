"""The engine's fault hooks: how long a kernel takes on a slowed GPU (`compute_hook`), and the link and GPU
events of `faults.step` played at their times on the network and the routes (`FaultHooks`).

A degraded link keeps a fraction of its capacity from its time on, until its `until` where it has one; the flows
crossing it are re-solved at each change. One degraded for the whole step is the topology's link at that
bandwidth (`Topology.degrade`), which every plan, fold check and `auto` choice reads. A failed link is removed
from routing: transfers posted afterwards take a detour, flows in flight on it move to their new route with the
bytes they have left; when it comes back, transfers posted afterwards take their own routes again and flows on
detours finish there. A failure that leaves some GPU unable to reach another (through switches, NICs and the
GPUs of its NVLink domain, `faults/rerouting.py` `split`) for the rest of the step, or a failed GPU, aborts the
step at that time; a split that heals aborts it only when a transfer needs a route across it before then.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import simpy

from simulator.errors import StepAborted
from simulator.network.model import Network
from simulator.topology.graph import Topology, both_ways

if TYPE_CHECKING:
    from simulator.faults.rerouting import Rerouter
    from simulator.faults.step import LinkEvent, Slowdown, StepFaultPlan
    from simulator.parallel.layout import Layout


def compute_hook(slowdowns: Mapping[int, Slowdown]) -> Callable[[int, float, float], float] | None:
    """The engine's compute hook for the simulated ranks slowed by ``slowdowns`` (after folding: the
    representatives'): how long a kernel of nominal duration starting now takes on a rank; None when no rank
    is slowed (the engine then takes every kernel's nominal duration)."""
    if not slowdowns:
        return None
    slowed = dict(slowdowns)

    def duration(rank: int, nominal_s: float, now: float) -> float:
        slowdown = slowed.get(rank)
        return nominal_s if slowdown is None else nominal_s * slowdown.at(now)

    return duration


def directed_links(topology: Topology, event: LinkEvent) -> list[int]:
    """The directed links of ``event``'s edges, both ways."""
    index = topology.link_index
    return [index[edge] for edge in both_ways(event.edges)]


def kept_from_start(topology: Topology, plan: StepFaultPlan) -> dict[int, float]:
    """The fraction of its line rate each directed link ``plan`` degrades for the whole step (from its start,
    with no `until`) keeps: faults on the same link stack, so it is the product of their capacities."""
    kept: dict[int, float] = {}
    for event in plan.links:
        if event.from_start and event.capacity > 0:
            for link in directed_links(topology, event):
                kept[link] = kept.get(link, 1.0) * event.capacity
    return kept


def degrade_from_start(topology: Topology, plan: StepFaultPlan) -> None:
    """Degrade on ``topology`` the links ``plan`` degrades for the whole step (`kept_from_start`), before anything
    reads its bandwidths: `prepare_training` does it before it plans the step, `FaultHooks` before it runs it.
    Each is set once from its line rate (`Topology.degrade`), so doing it again changes nothing."""
    by_fraction: dict[float, list[int]] = {}
    for link, fraction in kept_from_start(topology, plan).items():
        by_fraction.setdefault(fraction, []).append(link)
    for fraction, links in by_fraction.items():
        topology.degrade(links, fraction)


class FaultHooks:
    """The link and GPU events of a step's fault ``plan`` on ``topology``. Create it before any route of
    ``topology`` is computed: it installs the rerouter and fails the links that are down for the whole step, and
    degrades those degraded for it, which changes ``topology``'s routing and bandwidths for good (give every
    run its own topology, as `simulate` does). Faults with an `until` (or after the start) are played on the
    network at their times, from the start at 0. The plan's slowdowns reach the engine through `compute_hook`,
    once folding has placed them."""

    def __init__(self, topology: Topology, plan: StepFaultPlan):
        self.topology = topology
        self.plan = plan
        self.rerouter: Rerouter | None = None
        self._down: list[LinkEvent] = []
        """The faults holding links down now, in the order they took them down."""
        self._timers: set[simpy.Event] = set()
        """The timeouts of the link faults' processes not processed yet: where nothing else is queued, the step
        has ended or stalled, and a fault that repeats to the step's end stops."""
        self._degraded: dict[int, list[float]] = {}
        """Each directed link's capacities kept under the timed faults degrading it now, in their order."""
        self._env: simpy.Environment | None = None
        if any(e.capacity == 0 for e in plan.links):
            from simulator.faults.rerouting import Rerouter  # networkx, needed only when links fail

            self.rerouter = Rerouter(topology)
        for event in plan.links:
            if event.from_start and event.capacity == 0:
                self._take_down(event, 0.0)
        degrade_from_start(topology, plan)

    @property
    def down_labels(self) -> list[str]:
        """The labels of the link faults that hold links down now, in the order they took them down: those that
        together may split the job."""
        return [event.label for event in self._down]

    @property
    def changes_network(self) -> bool:
        """Whether the plan degrades or fails any link, from the start or later (the topology's routes and
        bandwidths are then not the cluster's as built)."""
        return bool(self.plan.links)

    @property
    def changes_during_step(self) -> bool:
        """Whether link capacities or routes change during the step (collectives cannot be timed once and replayed
        then); links degraded or down for the whole step are the topology's already."""
        return any(event.timed for event in self.plan.links)

    def keeps_stages_alike(self, layout: Layout) -> bool:
        """Whether the plan leaves the ranks of every pipeline stage of ``layout`` alike (faults/step.py
        `alike_in_stages`: no link faults, each stage's ranks slowed alike), so a folded run's replicas stay images
        of each other."""
        from simulator.faults.step import alike_in_stages  # loaded with the plan; `collective` runs without faults

        return alike_in_stages(self.plan, layout)

    def describe(self) -> dict:
        """The `faults` entry of the summary: what was injected, and how many routes took a detour."""
        return {**self.plan.describe(self.topology),
                "rerouted_routes": self.rerouter.rerouted if self.rerouter is not None else 0}

    def install(self, env: simpy.Environment, network: Network) -> None:
        """Schedule every timed link event (those for the whole step are the topology's already)."""
        self._env = env
        for event in self.plan.links:
            if event.timed:
                env.process(self._link_event(env, network, event))
        for failure in self.plan.gpu_failures:
            env.process(self._gpu_failure(env, failure.at_s, failure.gpu))

    def _directed(self, event: LinkEvent) -> list[int]:
        return directed_links(self.topology, event)

    def _take_down(self, event: LinkEvent, now: float) -> None:
        """Route around ``event``'s links from ``now``. A split of the GPUs aborts the step now where it lasts the
        step; one that heals (every fault splitting them comes back) aborts it only when a transfer needs a route
        across it while it lasts (the rerouter's `partition`)."""
        assert self.rerouter is not None
        self.rerouter.take_down(list(event.edges))
        self._down.append(event)
        self._watch_partition(now)

    def _bring_up(self, event: LinkEvent, now: float) -> list[int]:
        """``event``'s links come back at ``now`` where no other fault holds them down: their directed links."""
        assert self.rerouter is not None
        self._down.remove(event)
        held = {edge for other in self._down for edge in both_ways(other.edges)}
        up = [edge for edge in event.edges if edge not in held]
        self.rerouter.bring_up(up)
        self._watch_partition(now)
        index = self.topology.link_index
        return [index[edge] for edge in both_ways(up)]

    def _watch_partition(self, now: float) -> None:
        """Abort the step at ``now`` where the links down for the rest of the step split the GPUs; where only
        faults that come back split them, have the rerouter abort the step at the first transfer with no route."""
        from simulator.faults.rerouting import split  # loaded with the rerouter

        assert self.rerouter is not None
        self.rerouter.partition = None
        cut = self.rerouter.split()
        if not cut:
            return
        labels = ", ".join(self.down_labels)
        lasting = {edge for event in self._down if event.until_s is None for edge in both_ways(event.edges)}
        if lasting == self.rerouter.down or split(self.topology, lasting):
            raise StepAborted(now, f"{labels} down: {cut}")
        env = self._env
        assert env is not None, "faults that come back are played in the run"
        self.rerouter.partition = lambda a, b: StepAborted(env.now, f"{labels} down: {a} cannot reach {b}")

    def _link_event(self, env: simpy.Environment, network: Network, event: LinkEvent):
        links = self._directed(event)
        for index, (start, end) in enumerate(event.times()):
            yield from self._wait(env, start)
            if index and self._only_own_timers_left(env):
                return  # nothing but the faults was left to run: the step has ended, or stalled (a deadlock report)
            if event.capacity > 0:
                for link in links:
                    self._degraded.setdefault(link, []).append(event.capacity)
                network.scale_capacity(links, event.capacity)
            else:
                self._take_down(event, env.now)
                network.take_down(links)
            if end is None:
                return
            yield from self._wait(env, end)
            if event.capacity > 0:
                self._restore(network, links, event.capacity)
            else:
                network.bring_up(self._bring_up(event, env.now))

    def _wait(self, env: simpy.Environment, until_s: float):
        """Wait until ``until_s`` on a timeout kept among the faults' own while it is queued."""
        timer = env.timeout(until_s - env.now)
        self._timers.add(timer)
        yield timer
        self._timers.discard(timer)

    def _only_own_timers_left(self, env: simpy.Environment) -> bool:
        """Whether every event queued on ``env`` is a link fault's timeout (SimPy's private queue, as
        `run_until` reads it)."""
        return all(event in self._timers for *_, event in env._queue)

    def _restore(self, network: Network, links: list[int], capacity: float) -> None:
        """``links`` come back from a fault that kept ``capacity`` of them: each keeps the product of the timed
        faults still degrading it."""
        by_kept: dict[float, list[int]] = {}
        for link in links:
            held = self._degraded[link]
            held.remove(capacity)
            by_kept.setdefault(math.prod(held), []).append(link)
        for kept, restored in by_kept.items():
            network.restore_capacity(restored, kept)

    def _gpu_failure(self, env: simpy.Environment, at_s: float, gpu: int):
        yield env.timeout(at_s)
        raise StepAborted(at_s, f"GPU {gpu} ({self.topology.gpus[gpu]}) failed")
