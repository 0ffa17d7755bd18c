"""Running a plan: each phase becomes one batch of transfers on the network model, phases back to back.

A phase with ``repeat`` k is posted once, each transfer carrying k times its bytes and paying k times its
path latency: the k identical steps cost the same as k separate batches while rates stay constant.
"""

from __future__ import annotations

from collections.abc import Iterable

import simpy

from simulator.collectives.phases import CollectiveRequest, Phase
from simulator.collectives.registry import plan_collective
from simulator.network.model import Network
from simulator.topology.graph import Topology


def phase_items(topology: Topology, phase: Phase) -> list[tuple]:
    """The network model's items for one phase: (links, bytes, latency, src, dst, channel) per transfer; a pipelined
    phase charges every transfer the mean latency of the phase's hops."""
    repeat = phase.repeat
    latencies = [max(topology.path_latency(t.src, t.dst, t.channel), phase.min_latency) for t in phase.transfers]
    if phase.pipelined and latencies:
        latencies = [sum(latencies) / len(latencies)] * len(latencies)
    return [(topology.path(t.src, t.dst, t.channel), t.nbytes * repeat, latency * repeat, t.src, t.dst, t.channel)
            for t, latency in zip(phase.transfers, latencies)]


def run_plan(env: simpy.Environment, network: Network, topology: Topology, phases: Iterable[Phase],
             key: str = ""):
    """SimPy process generator: run ``phases`` one after another on ``network``, labelled ``key``."""
    for phase in phases:
        yield network.run_phase(phase_items(topology, phase), key=key)


def run_plans(env: simpy.Environment, network: Network, topology: Topology, plans: list[list[Phase]],
              key: str = ""):
    """SimPy process generator: run several independent plans at once (a collective and its mirrors) and
    finish when all have. Single-phase plans go to the network as one batch, which is the same as running
    them side by side; longer plans run as separate processes so none waits at another's phase barrier."""
    if all(len(plan) == 1 for plan in plans):
        yield network.run_phase([item for plan in plans for item in phase_items(topology, plan[0])], key=key)
        return
    yield env.all_of([env.process(run_plan(env, network, topology, plan, key)) for plan in plans])


def time_collective(topology: Topology, op: str, algorithm: str, ranks, nbytes: float, *,
                    efficiency: dict[str, float] | None = None, mode: str = "flow",
                    chunk_bytes: float | None = None, channels: int | None = None, root: int = 0) -> float:
    """Seconds one collective takes alone on an idle network; ``ranks`` is a count (GPUs 0..k-1) or a list."""
    group = tuple(range(ranks)) if isinstance(ranks, int) else tuple(ranks)
    request = CollectiveRequest(op=op, ranks=group, nbytes=float(nbytes), root=root, chunk_bytes=chunk_bytes,
                                channels=channels or 0)
    phases = plan_collective(request, topology, algorithm)
    env = simpy.Environment()
    network = Network(env, topology, efficiency=efficiency, mode=mode)
    env.process(run_plan(env, network, topology, phases, key=op))
    env.run()
    return float(env.now)
