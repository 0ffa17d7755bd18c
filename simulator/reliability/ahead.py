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
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
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


def cores(cap: int = 0) -> int:
    """The cores this process may run on where worker processes can be forked from it, at most ``cap`` (0: no
    cap; `trainsim run --workers`): 1 on a platform without `fork`, and in a process that is itself a worker (a
    sweep's points run in parallel, each job on its core)."""
    if "fork" not in get_all_start_methods() or parent_process() is not None:
        return 1
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(count, cap) if cap else count


def memory_room(workers: int) -> int:
    """How many of ``workers`` the host's available memory holds, each counted at this process's resident size
    (a forked worker shares the job's pages until it writes them, and Python's reference counts write most of
    those it reads; a state's own step then adds a few hundred MB on the 16,384-GPU job): at least 1, all of
    them where the host does not say (no /proc/meminfo)."""
    available, resident = _meminfo_available(), _resident_bytes()
    if available is None or not resident:
        return workers
    return max(1, min(workers, available // resident))


def _meminfo_available() -> int | None:
    """The host's MemAvailable in bytes, None where there is no /proc/meminfo."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _resident_bytes() -> int:
    """This process's resident set in bytes (0 where /proc/self/statm is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


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


def simulate_ahead(states: StepStates, wanted: Sequence[ClusterState], workers: int = 0,
                   progress: Callable[[int, int], None] | None = None) -> int:
    """Simulate the straggling states of ``wanted`` that ``states`` has not, the first here (building the fold
    they share) and the rest in worker processes (one per core, at most ``workers`` where not 0, and no more
    than the host's free memory holds), for ``states`` to hand out when the job meets them; nothing where there
    are fewer than AHEAD_MIN_STATES, one core, or the first raised. ``progress(done, total)`` hears of each
    state simulated. Ctrl-C ends the workers without a word and raises KeyboardInterrupt here. How many the
    workers simulated."""
    global _FORKED
    todo = [state for state in wanted if straggling(state, states.healthy) and not states.known(state)]
    if len(todo) < AHEAD_MIN_STATES or min(cores(workers), len(todo) - 1) < 2:
        return 0
    if progress is not None:
        progress(0, len(todo))
    if _simulated_here(states, todo[0]) is None:
        return 0
    if progress is not None:
        progress(1, len(todo))
    pool_size = memory_room(min(cores(workers), len(todo) - 1))
    if pool_size < 2:
        return 0
    _FORKED = states
    done = 0
    pool = ProcessPoolExecutor(pool_size, mp_context=get_context("fork"), initializer=_quiet_on_interrupt)
    try:
        futures = {pool.submit(_simulated, state): state for state in todo[1:]}
        for finished, future in enumerate(as_completed(futures), start=2):
            entry = future.result()
            if entry is not None:
                states.simulated_ahead(futures[future], entry)
                done += 1
            if progress is not None:
                progress(finished, len(todo))
    except BrokenProcessPool:  # a worker died (out of memory): the job simulates the rest as it meets them
        pass
    except BaseException:  # Ctrl-C: end the workers before the job's process stops
        for process in list(pool._processes.values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _FORKED = None
    return done


def _quiet_on_interrupt() -> None:
    """In a worker: Ctrl-C (sent to the whole process group) ends it at once without a traceback; the job's
    process stops the pool and reports the interrupt once."""
    signal.signal(signal.SIGINT, lambda _signum, _frame: os._exit(130))


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
