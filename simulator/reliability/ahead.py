"""A job's cluster states simulated ahead of its replications, on the machine's other cores.

A job with straggling GPUs meets many states one after another as its replications run (docs/reliability.md's
throttling example on the 16,384-GPU job: 1,685 sets of slowed stages over 100 replications, each a step of
~1.75 s of CPU), on one core. Which states a replication meets is set by its failures, drawn before it runs,
and by what the job does about them; a state's step only sets how fast it trains meanwhile, except where a
state has no route (no step) or an elastic job picks its size. So a first pass runs every replication with the
healthy step standing in for each state not simulated yet, noting the states it asks for (`states_foreseen`);
those are simulated in worker processes forked from the job's, which inherit the fold, programs and plan cache
its states share (the first is simulated before the fork, building them), and the replications then run as
before, each state's step taken from there (`StepStates.simulated_ahead`). A state the first pass did not
foresee is simulated when met, as before, and so is one a worker failed on, so that its error is raised where
the job meets it. A state's step is the same function of the state in whichever process it is simulated, so the
job's outputs are byte-identical to a run on one core.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from multiprocessing import get_all_start_methods, get_context, parent_process

import simpy

from simulator.reliability.checkpoint import SegmentCosts
from simulator.reliability.events import JobEvents
from simulator.reliability.job import JobPlan, JobProcess
from simulator.reliability.processes import Arrivals
from simulator.reliability.states import ClusterState, StepStates

AHEAD_MIN_STATES = 16
"""Fewer states than this foreseen are simulated as the job meets them: forking the job's process costs about
as much as a state's step."""

_FORKED: StepStates | None = None
"""The job's states, as the workers inherit them (set only while they run)."""


def cores() -> int:
    """The cores this process may run on where worker processes can be forked from it: 1 on a platform without
    `fork`, and in a process that is itself a worker (a sweep's points run in parallel, each job on its core)."""
    if "fork" not in get_all_start_methods() or parent_process() is not None:
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def states_foreseen(plan: JobPlan, replications: Iterable[Arrivals], known: Mapping[ClusterState, SegmentCosts | None],
                    healthy: SegmentCosts) -> list[ClusterState]:
    """The states the replications with these failures ask the costs of, in order of first asking, those in
    ``known`` left out; each unknown one answered with the ``healthy`` costs. A replication that raises ends the
    forecast: the job's own run raises it, or not, where it meets it."""
    wanted: dict[ClusterState, None] = {}

    def noted(state: ClusterState) -> SegmentCosts | None:
        if state in known:
            return known[state]
        wanted[state] = None
        return healthy

    forecast = replace(plan, costs=noted)
    try:
        for arrivals in replications:
            env = simpy.Environment()
            env.process(JobProcess(forecast, arrivals, JobEvents()).run(env))
            env.run()
    except Exception:  # a forecast only: the job's own run meets the error where it does
        pass
    return list(wanted)


def straggling(state: ClusterState, healthy: ClusterState) -> bool:
    """Whether ``state`` differs from ``healthy`` only in straggling GPUs: a step on the job's own cluster that
    shares the fold the first such state builds (`StepStates._shared_fold`), so a worker forked after it
    simulates it at a state's cost and memory (a state with links down is an unfolded step of its own)."""
    return replace(state, slow_gpus=()) == healthy


def simulate_ahead(states: StepStates, wanted: Sequence[ClusterState]) -> int:
    """Simulate the straggling states of ``wanted`` that ``states`` has not, the first here (building the fold
    they share) and the rest in worker processes (one per core), for ``states`` to hand out when the job meets
    them; nothing where there are fewer than AHEAD_MIN_STATES, one core, or the first raised. How many the
    workers simulated."""
    global _FORKED
    todo = [state for state in wanted if straggling(state, states.healthy) and not states.known(state)]
    workers = min(cores(), len(todo) - 1)
    if len(todo) < AHEAD_MIN_STATES or workers < 2 or _simulated_here(states, todo[0]) is None:
        return 0
    _FORKED = states
    done = 0
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
            for state, entry in zip(todo[1:], pool.map(_simulated, todo[1:])):
                if entry is not None:
                    states.simulated_ahead(state, entry)
                    done += 1
    except BrokenProcessPool:  # a worker died (out of memory): the job simulates the rest as it meets them
        pass
    finally:
        _FORKED = None
    return done


def _simulated(state: ClusterState) -> tuple | None:
    """In a worker: `_simulated_here` in the job's states as forked."""
    assert _FORKED is not None
    return _simulated_here(_FORKED, state)


def _simulated_here(states: StepStates, state: ClusterState) -> tuple | None:
    """The state's step and summary as ``states`` keep them, or None where simulating it raised (the job raises
    it where it meets the state, if it does)."""
    try:
        return states.entry(state)
    except Exception:  # raised again by the job's own run of the state
        return None
