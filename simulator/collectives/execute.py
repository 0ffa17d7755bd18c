"""Running a plan: each phase becomes one batch of transfers on the network model, phases back to back.

A phase with ``repeat`` k is posted once, each transfer carrying k times its bytes and paying k times its
latency per step (its path latency, or the window's stall for steps in flight): the k identical steps cost
the same as k separate batches while rates stay constant.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np
import simpy

from simulator.collectives.chunking import ChunkSetting
from simulator.collectives.names import AlgorithmChoice, Primitive, ProtocolChoice
from simulator.collectives.phases import SIMPLE, CollectiveRequest, Phase, hop_kinds, window_stall
from simulator.collectives.registry import plan_collective
from simulator.engine.stepping import run_all
from simulator.metrics.events import FlowRoutes
from simulator.network.model import Network, Transfers
from simulator.network.modes import NetworkMode
from simulator.topology.graph import Topology

if TYPE_CHECKING:
    from simulator.engine.replicas import ReplicaQuotient


def phase_items(topology: Topology, phase: Phase) -> list[tuple]:
    """The network model's items for one phase: (links, bytes, latency, src, dst, channel) per transfer, the
    latency as `step_latencies` charges it per step, times the phase's repeats, plus its `Phase.launch` once."""
    repeat = phase.repeat
    routes = [topology.route(t.src, t.dst, t.channel) for t in phase.transfers]
    paths = [path for path, _ in routes]

    def chunk_seconds() -> list[float]:
        line_rate = topology.link_bandwidth
        return [t.nbytes / float(line_rate[list(path)].min()) if path else 0.0
                for t, path in zip(phase.transfers, paths)]

    latencies = step_latencies(phase, [latency for _, latency in routes], chunk_seconds,
                               lambda: hop_kinds(topology, [t.src for t in phase.transfers],
                                                 [t.dst for t in phase.transfers]).tolist())
    return [(path, t.nbytes * repeat, latency * repeat + phase.launch, t.src, t.dst, t.channel)
            for t, path, latency in zip(phase.transfers, paths, latencies)]


@dataclass(frozen=True)
class PhaseArrays:
    """One phase's transfers as arrays, `phase_items` without a tuple per transfer (for phases of thousands):
    their ends, bytes and latency over the phase's repeats, and their routes as a matrix of link ids (one
    route per row from its first column on, -1 after its end)."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    latency: np.ndarray
    routes: np.ndarray


def phase_arrays(topology: Topology, phase: Phase) -> PhaseArrays:
    """`phase_items` of ``phase`` as arrays, the same numbers (the routes from `Topology.routes`)."""
    transfers, count = phase.transfers, len(phase.transfers)
    src, dst, channel = (np.fromiter(map(field, transfers), dtype=np.int64, count=count)
                         for field in (attrgetter("src"), attrgetter("dst"), attrgetter("channel")))
    nbytes = np.fromiter((t.nbytes for t in transfers), dtype=float, count=count)
    routes, latency = topology.routes(src, dst, channel)

    def chunk_seconds() -> list[float]:
        on_route = routes >= 0
        rate = np.where(on_route, topology.link_bandwidth[routes], np.inf).min(axis=1, initial=np.inf)
        return np.where(on_route.any(axis=1), nbytes / rate, 0.0).tolist()

    latencies = step_latencies(phase, latency.tolist(), chunk_seconds,
                               lambda: hop_kinds(topology, src, dst).tolist())
    return PhaseArrays(src, dst, nbytes * phase.repeat,
                       np.array(latencies, dtype=float) * phase.repeat + phase.launch, routes)


def step_latencies(phase: Phase, latencies: list[float], chunk_seconds: Callable[[], list[float]],
                   kinds: Callable[[], list[int]]) -> list[float]:
    """The latency each transfer of ``phase`` pays per step, given its path's (``latencies``): at least the
    phase's floor; scaled for the phase's protocol by the kind of hop each crosses (``kinds()``, `hop_kinds`);
    in a pipelined phase the mean over the phase's hops; in a phase of steps in flight its `window_stall`, its
    chunk's time (``chunk_seconds()``) read at its path's line rate, under Simple, and nothing under LL and
    LL128."""
    if phase.min_latency > 0:
        latencies = [max(latency, phase.min_latency) for latency in latencies]
    scale = phase.protocol.latency_scale
    if scale != SIMPLE.latency_scale:
        latencies = [latency * scale[kind] for latency, kind in zip(latencies, kinds())]
    if phase.pipelined and latencies:
        latencies = [sum(latencies) / len(latencies)] * len(latencies)
    if phase.steps_in_flight:
        latencies = ([window_stall(latency, seconds, phase.steps_in_flight)
                      for latency, seconds in zip(latencies, chunk_seconds())] if phase.protocol.windowed
                     else [0.0] * len(latencies))
    return latencies


Spans = list[tuple[int, int]] | None
"""Where each plan of a batch lies among the batch's transfers (start, stop); None where each is one transfer
(each a pipeline hand-off's copy), so a plan's end is its transfer's."""


@dataclass
class ParsedPhases:
    """Phases' items and their `Transfers` (those of plans run together, joined), by phase (kept referenced, so
    its id stays unique), with the routes version they were worked out under: a plan runner's own, or one that
    the runs on one plan cache share (`PlanCache.parsed`), since a phase's items are a function of the phase
    and the cluster's routes alone (a job's straggler states each parsed the same ~500 phases again, ~0.15 s
    of a state's ~2 s)."""

    items: dict[int, tuple[Phase, int, list[tuple]]] = field(default_factory=dict)
    transfers: dict[Hashable, tuple[object, int, Transfers, Spans]] = field(default_factory=dict)
    """Per phase, or per batch of single-phase plans run together: the parsed transfers, with where each plan's
    lie among them (`Spans`), so the two live and die together."""


class PlanRunner:
    """Runs plans on one network. A phase's items are worked out (and parsed as `Transfers`) once and reused
    while the routes stay the same: the plan cache hands out one phase object for every instance of a
    collective, and one list of plans for every instance of a collective with its mirrors. ``exchanges`` gives,
    by collective key, the phases of every collective of the exchange it belongs to (one list per exchange,
    shared by its keys and by exchanges of the same phases), whose load on each link the analytic model shares
    the links by (`load`, worked out once per list); ``copies`` gives, by phase id, that phase of a collective
    and of all its copies that cross its links (`simulation.copy_phases`), shared the same way."""

    def __init__(self, network: Network, topology: Topology, quotient: ReplicaQuotient | None = None,
                 parsed: ParsedPhases | None = None, exchanges: Mapping[str, list[Phase]] | None = None,
                 copies: Mapping[int, list[Phase]] | None = None):
        self.network = network
        self.topology = topology
        self.quotient = quotient
        self._parsed_phases = parsed if parsed is not None and quotient is None else ParsedPhases()
        self._exchanges = exchanges or {}
        self._copies = copies or {}
        self._loads: dict[int, tuple[list[Phase], int, np.ndarray]] = {}

    def load(self, key: str, phase: Phase) -> np.ndarray | None:
        """The bytes each link carries in the exchange of the collective ``key``, or else in ``phase`` run with
        its copies (None: neither), under the current routes."""
        members = self._exchanges.get(key)
        if members is None:
            members = self._copies.get(id(phase))
        if members is None:
            return None
        version = self.topology.routes_version
        cached = self._loads.get(id(members))
        if cached is None or cached[1] != version:
            parsed = [self.transfers(phase) for phase in members]
            routes = FlowRoutes.of([route for transfers in parsed for route in transfers.routes])
            nbytes = np.fromiter((size for transfers in parsed for size in transfers.nbytes), dtype=float,
                                 count=len(routes))
            load = np.bincount(routes.links, weights=np.repeat(nbytes, routes.lengths),
                               minlength=self.network.capacity.size)
            load.setflags(write=False)
            cached = self._loads[id(members)] = (members, version, load)
        return cached[2]

    def items(self, phase: Phase) -> list[tuple]:
        """`phase_items` of ``phase`` under the current routes (the phase is kept referenced, so its id stays
        unique); with a replica ``quotient``, only the kept sources' items, with the paths they contend on."""
        version = self.topology.routes_version
        cached = self._parsed_phases.items.get(id(phase))
        if cached is None or cached[1] != version:
            items = phase_items(self.topology, phase)
            if self.quotient is not None:
                items = self.quotient.items(items)
            cached = self._parsed_phases.items[id(phase)] = (phase, version, items)
        return cached[2]

    def transfers(self, phase: Phase) -> Transfers:
        """`items` of ``phase`` parsed, under the current routes."""
        return self._parsed(id(phase), phase, lambda: [self.items(phase)])[0]

    def _parsed(self, key: Hashable, source: object, items: Callable[[], list[list[tuple]]]
                ) -> tuple[Transfers, Spans]:
        """``items()`` (each plan's) joined and parsed, with where each plan's lie among them, once per ``key``
        (the id of a phase, or the ids of the first phases of plans run together; ``source``, kept referenced
        with it so those ids stay unique) while the routes stay the same."""
        version = self.topology.routes_version
        cache = self._parsed_phases.transfers
        cached = cache.get(key)
        if cached is None or cached[1] != version:
            plans = items()
            spans, start = [], 0
            for plan in plans:
                spans.append((start, start + len(plan)))
                start += len(plan)
            single = all(stop - start == 1 for start, stop in spans)
            joined = Transfers([item for plan in plans for item in plan], spans if len(plans) > 1 else ())
            cached = cache[key] = (source, version, joined, None if single else spans)
        return cached[2], cached[3]

    def run_plan(self, env: simpy.Environment, phases: Iterable[Phase], key: str = ""):
        """Generator of SimPy events (a process of its own, or `yield from` inside the engine's stepping
        generators, engine/stepping.py): run ``phases`` one after another, labelled ``key``."""
        for phase in phases:
            yield self.network.run_phase(self.transfers(phase), key=key, load=self.load(key, phase))

    def run_plans(self, env: simpy.Environment, plans: list[list[Phase]], key: str = "",
                  ends: list[float | None] | None = None):
        """Generator of SimPy events, as `run_plan`: run several independent plans at once (a collective and
        its mirrors) and finish when all have. Single-phase plans go to the network as one batch, which is the
        same as running them side by side; longer plans run as separate processes so none waits at another's
        phase barrier. ``ends`` (flow model), where given empty, is then filled with when each plan ended, the
        last of its flows (None for a plan that sent none here: a replica quotient's image). Where the
        analytic model shares the links among the collective's copies (`copies`), the first plan (the group's) runs
        alone: the others' bytes are in its load already, and a copy's plan takes its own time, not the slowest
        mirror's (the fold check holds the mirrors to that time, engine/symmetry.py `unlike_alone`)."""
        if self.network.mode == "analytic" and plans[0] and id(plans[0][0]) in self._copies:
            yield from self.run_plan(env, plans[0], key)
            return
        if all(len(plan) == 1 for plan in plans):
            load = self.load(key, plans[0][0])
            if len(plans) == 1 and ends is None:
                yield self.network.run_phase(self.transfers(plans[0][0]), key=key, load=load)
                return
            joined, spans = self._parsed(tuple(id(plan[0]) for plan in plans), plans,
                                         lambda: [self.items(plan[0]) for plan in plans])
            if ends is None:
                yield self.network.run_phase(joined, key=key, load=load)
                return
            flows = [0.0] * joined.count
            yield self.network.run_phase(joined, key=key, ends=flows)
            ends += flows if spans is None else [max(flows[start:stop]) if stop > start else None
                                                 for start, stop in spans]
            return
        if ends is None:
            if self.quotient is not None:
                plans = [plan for plan in plans if any(self.transfers(phase) for phase in plan)]
            yield env.all_of([env.process(self.run_plan(env, plan, key)) for plan in plans])
            return
        sends = [any(self.transfers(phase) for phase in plan) for plan in plans]
        ends += [None] * len(plans)
        yield env.all_of([env.process(self._timed(env, plan, key, ends if sent else None, index))
                          for index, (plan, sent) in enumerate(zip(plans, sends))
                          if sent or self.quotient is None])

    def _timed(self, env: simpy.Environment, plan: list[Phase], key: str, ends: list[float | None] | None,
               index: int):
        """`run_plan` of ``plan``, then its end into ``ends[index]`` (None: a plan that sends nothing, whose end
        no flow tells): its last phase ends with its last flow, the latest of the plan's (each phase starts when
        the one before it ends)."""
        yield from self.run_plan(env, plan, key)
        if ends is not None:
            ends[index] = env.now


def run_plan(env: simpy.Environment, network: Network, topology: Topology, phases: Iterable[Phase],
             key: str = ""):
    """SimPy process generator: run ``phases`` one after another on ``network``, labelled ``key``."""
    return PlanRunner(network, topology).run_plan(env, phases, key)


def run_plans(env: simpy.Environment, network: Network, topology: Topology, plans: list[list[Phase]],
              key: str = ""):
    """SimPy process generator: run several independent plans at once on ``network`` (see `PlanRunner`)."""
    return PlanRunner(network, topology).run_plans(env, plans, key)


def time_collective(topology: Topology, op: Primitive, algorithm: AlgorithmChoice, ranks, nbytes: float, *,
                    efficiency: dict[str, float] | None = None, mode: NetworkMode = "flow",
                    chunk_bytes: ChunkSetting = None, channels: int | None = None, root: int = 0,
                    protocol: ProtocolChoice = "simple") -> float:
    """Seconds one collective takes alone on an idle network; ``ranks`` is a count (GPUs 0..k-1) or a list; NCCL's
    Simple protocol unless ``protocol`` says otherwise."""
    group = tuple(range(ranks)) if isinstance(ranks, int) else tuple(ranks)
    request = CollectiveRequest(op=op, ranks=group, nbytes=float(nbytes), root=root, chunk_bytes=chunk_bytes,
                                channels=channels or 0)
    phases = plan_collective(request, topology, algorithm, efficiency, protocol)
    env = simpy.Environment()
    network = Network(env, topology, efficiency=efficiency, mode=mode)
    env.process(run_plan(env, network, topology, phases, key=op))
    run_all(env)
    return float(env.now)
