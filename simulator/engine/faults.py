"""The engine's fault hooks: how long a kernel takes on a slowed GPU (`compute_hook`), and the link and GPU
events of `faults.step` played at their times on the network and the routes (`FaultHooks`).

A degraded link keeps a fraction of its capacity from its time on; the flows crossing it are re-solved at
once. One degraded from the start is the topology's link at that bandwidth (`Topology.degrade`), which every
plan, fold check and `auto` choice reads. A failed link is removed from routing: transfers posted afterwards
take a detour, flows in flight on it move to their new route with the bytes they have left. A failure that
leaves some GPU unable to reach another (through switches and NICs; GPUs forward nothing), or a failed GPU,
aborts the step at that time.
"""

from __future__ import annotations

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


def degrade_from_start(topology: Topology, plan: StepFaultPlan) -> None:
    """Degrade on ``topology`` the links ``plan`` degrades from the step's start, before anything reads its
    bandwidths: `prepare_training` does it before it plans the step, `FaultHooks` before it runs it. Faults on
    the same link stack: each directed link keeps the product of its faults' capacities, set once from its line
    rate (`Topology.degrade`), so doing it again changes nothing."""
    kept: dict[int, float] = {}
    for event in plan.links:
        if event.at_s == 0 and event.capacity > 0:
            for link in directed_links(topology, event):
                kept[link] = kept.get(link, 1.0) * event.capacity
    by_fraction: dict[float, list[int]] = {}
    for link, fraction in kept.items():
        by_fraction.setdefault(fraction, []).append(link)
    for fraction, links in by_fraction.items():
        topology.degrade(links, fraction)


class FaultHooks:
    """The link and GPU events of a step's fault ``plan`` on ``topology``. Create it before any route of
    ``topology`` is computed: it installs the rerouter and fails the links that are down from the start, and
    degrades those degraded from it, which changes ``topology``'s routing and bandwidths for good (give every
    run its own topology, as `simulate` does). The plan's slowdowns reach the engine through `compute_hook`,
    once folding has placed them."""

    def __init__(self, topology: Topology, plan: StepFaultPlan):
        self.topology = topology
        self.plan = plan
        self.rerouter: Rerouter | None = None
        self.down_labels: list[str] = []
        """The link faults that took links down so far, in order: those that together may split the job."""
        if any(e.capacity == 0 for e in plan.links):
            from simulator.faults.rerouting import Rerouter  # networkx, needed only when links fail

            self.rerouter = Rerouter(topology)
        for event in plan.links:
            if event.at_s == 0 and event.capacity == 0:
                self._take_down(event)
        degrade_from_start(topology, plan)

    @property
    def changes_network(self) -> bool:
        """Whether the plan degrades or fails any link, from the start or later (the topology's routes and
        bandwidths are then not the cluster's as built)."""
        return bool(self.plan.links)

    @property
    def changes_during_step(self) -> bool:
        """Whether link capacities or routes change after the step's start (collectives cannot be timed once and
        replayed then); links degraded or down from the start are the topology's already."""
        return any(event.at_s > 0 for event in self.plan.links)

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
        """Schedule every link event after the start (those at it are the topology's already)."""
        for event in self.plan.links:
            if event.at_s > 0:
                env.process(self._link_event(env, network, event))
        for failure in self.plan.gpu_failures:
            env.process(self._gpu_failure(env, failure.at_s, failure.gpu))

    def _directed(self, event: LinkEvent) -> list[int]:
        return directed_links(self.topology, event)

    def _take_down(self, event: LinkEvent) -> None:
        assert self.rerouter is not None
        self.rerouter.take_down(list(event.edges))
        self.down_labels.append(event.label)
        split = self.rerouter.split()
        if split:
            raise StepAborted(event.at_s, f"{', '.join(self.down_labels)} down: {split}")

    def _link_event(self, env: simpy.Environment, network: Network, event: LinkEvent):
        yield env.timeout(event.at_s)
        if event.capacity > 0:
            network.scale_capacity(self._directed(event), event.capacity)
        else:
            self._take_down(event)
            network.take_down(self._directed(event))

    def _gpu_failure(self, env: simpy.Environment, at_s: float, gpu: int):
        yield env.timeout(at_s)
        raise StepAborted(at_s, f"GPU {gpu} ({self.topology.gpus[gpu]}) failed")
