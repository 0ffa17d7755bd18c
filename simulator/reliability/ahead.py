"""A job's cluster states simulated ahead of its replications, on the machine's other cores.

A job with straggling GPUs meets many states one after another as its replications run (docs/reliability.md's
throttling example on the 16,384-GPU job: 1,685 sets of slowed stages over 100 replications, each a step of ~3.0 s
of CPU at a load of ~4.5 on 2 cores, ~1.7 s on idle ones), on one core. Which states a replication meets is set by
its failures, drawn before it runs, and by what the job does about them; a state's step only sets how fast it trains
meanwhile, except where a state has no route (no step) or an elastic job picks its size. So a first pass runs every
replication with the healthy step standing in for each state not simulated yet, noting the states it asks for
(`states_foreseen`; the states it trains or restarts in first, then, those simulated, the sub-states their slow-step
split asks); those are simulated in worker processes forked from the job's, which inherit the fold, programs and
plan cache its states share (the first is simulated before the fork, building them), and the replications then run
as before, each state's step taken from there (`StepStates.simulated_ahead`). A job with degraded units (a leaf
switch, a cable, a NIC, a spine) meets states with links down, each an unfolded step of its own (the engine folds no
step with link faults, and a leaf down slows only its rail's collectives): 41 of them on the 2,048-GPU job with a
leaf-switch class over 2 replications, ~223 s of CPU and 5.2 GB each; those are simulated ahead too, the first with
links down in the job's process, whose peak memory then sizes the pool. A state the first pass did not foresee is
simulated when met, as before. The steps simulated ahead are kept for the job's life, whatever the budget of the
process's state cache, and an error one of them raised (a state refused) is kept as its result, raised where the job
meets the state, not simulated again (`StepStates.simulated_ahead`). A state's step is the same function of the
state in whichever process it is simulated, so the job's outputs are byte-identical to a run on one core. States
with links down that are rotations of each other by whole data-parallel replicas are one step where the job's step
is proven to rotate (reliability/symmetry.py): only one of each class is simulated (`states_ahead`)."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from multiprocessing import get_all_start_methods, get_context, parent_process
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

import simpy

from simulator.config.loader import LoadedScenario
from simulator.config.locate import located
from simulator.console.progress import resume_heartbeats
from simulator.engine.stepping import run_all
from simulator.errors import STOP_SIGNALS, TrainsimError
from simulator.machine import available_memory, usable_cores
from simulator.parallel.layout import Layout
from simulator.reliability.checkpoint import SegmentCosts, StepState
from simulator.reliability.events import JobEvents
from simulator.reliability.job import JobPlan, JobProcess
from simulator.reliability.processes import Arrivals
from simulator.reliability.states import ClusterState, StepStates, state_scenario
from simulator.report.run_folder import interrupts_held
from simulator.scale import ScaleEstimate
from simulator.topology.graph import Topology
from simulator.units import format_duration

AHEAD_MIN_STATES = 16
"""Fewer straggler states than this foreseen are simulated as the job meets them: forking the job's process costs
about as much as a straggler state's step (a degraded state's takes far longer: any number of them goes ahead
where two workers can share them)."""
STRAGGLER_FORESIGHT_S = 1.0
"""From this many CPU seconds estimated for a straggler state's step on, a job foresees its straggler states on
one core too, to tell their time up front (`simulate._told_straggler_time`): a forecast runs the replications
once more without simulating any step (~0.15 s a replication of the 16,384-GPU job), which a job of states of
milliseconds need not pay."""
LONG_AHEAD_S = 600.0
"""From this many seconds of wall time on, the states with links down a job foresees are warned of as it begins,
with their estimated time (`TimeAhead.line`), before any is simulated: the 16,384-GPU Llama 3 405B job with a
leaf switch class said nothing for the 7-8 minutes of its first state, then '0/19,663 states'."""
MAX_AHEAD_S = 2 * 3600.0
"""Refuse, unless forced, a job whose states with links down are estimated to take longer than this on its
cores (`TimeAhead.wall_s`): two hours, twelve times the ten minutes a plain run's step may take (scale.MAX_EVENTS)
and sixty times the two minutes of a job's own events (simulate.MAX_JOB_EVENTS); the 2,048-GPU Llama 3 70B job
with a leaf switch class (41 states, ~20 min on one core) passes, the 16,384-GPU 405B job with one (19,663
states, hundreds of CPU hours) does not."""
LINK_STATE_S_PER_EVENT = 12.4e-6
"""CPU seconds a state with links down takes per op + flow its fold is estimated to simulate
(`scale.classed_estimate`), beside LINK_STATE_S_PER_EVENT_GPU for each GPU of the cluster: fitted to one leaf
down on two jobs, each simulated alone as a plain run (2026-12-06, 2 shared cores): the 2,048-GPU Llama 3 70B
job's, 288 ranks, ~1.49 M ops + flows estimated, 27 s of CPU (18.1 us each); the 16,384-GPU Llama 3 405B job's,
384 ranks, ~1.55 M, 90 s (58.2 us each). Checked on that job's state with three leaves down (896 ranks,
~3.61 M), simulated in its job's states beside one leaf's under a load of ~10 on the 2 cores: 407.6 s of CPU
against 163.2 s, 2.50 times for 2.33 times the ops + flows (an additive cost per GPU of the cluster, which the
two jobs alone allowed, gave 1.34 times); at one leaf's 1.81 times the quiet run, ~225 s quiet, the estimate
210 s."""
LINK_STATE_S_FIXED = 0.05
"""CPU seconds a state with links down is estimated to take whatever its size, beside LINK_STATE_S_PER_EVENT
(a CPU-time forecast, not a simulated figure): without it the estimate of small states was 1.8-2.7 times low
here (7-10 times reported elsewhere). Fitted to states timed one by one with `StepStates.entry` (CPU time of the job's
process, merging off; 2026-12-06, the 2 shared cores at a load of ~4), each against its per-event estimate:
a leaf down on the 4-GPU job of one-GPU hosts, 1.5-3.0 ms against 1.5 ms; on the 32-GPU eight-rail job (TP 8 x
DP 4) 49-79 ms, median 52 ms, against 29 ms (2,352 ops + flows); on the 64-GPU TP 2 x PP 4 x DP 8 job 183-240 ms,
median ~210 ms, against 76 ms (6,080) with the flow model, 139-193 ms, median ~160 ms, analytic. The 54 ms that
makes the 32-GPU states' estimate as much too high as the 64-GPU flow states' is too low (1.6 times either way)
is rounded to 50 ms: within a factor of 1.6 of those, 25 times high on the 4-GPU states (50 ms too many each),
and under 0.2% of the large states' time the per-event terms were fitted to (27 s and more)."""
LINK_STATE_S_PER_EVENT_GPU = 2.8e-9
"""CPU seconds each op + flow of a state with links down takes per GPU of the cluster, beside
LINK_STATE_S_PER_EVENT (the same fit: its routes, detours and mirrors span the whole cluster)."""

FOLDED_STRAGGLER_S_FIXED = 0.05
"""CPU seconds a straggler state whose step folds by the slow GPU's classes takes whatever its size, beside
FOLDED_STRAGGLER_S_PER_EVENT each op + flow of that fold (`scale.classed_estimate`). Such states share the job's
programs, plans and fold (`StepStates._shared_fold`), so they cost less than a state with links down. Fitted to
states timed one by one (CPU time of `StepStates._fresh` in the job's process, `--workers 1`, network.model:
analytic, a `throttling` class `{unit: gpu, effect: straggle, slowdown: 1.3, repair: 1 d}`, 1 d, 1 replication;
2026-12-07, the 2 shared cores at a load of ~3.5-5): the 2,048-GPU Llama 3 70B job (mtbf 5000 h, 83,524 ops +
flows on 16 ranks) 0.72-1.33 s a state after the first, median ~1.0 s; the 16,384-GPU Llama 3 405B job (mtbf
200000 h, 259,401 on 64 ranks) 2.78-3.33 s, median ~3.0 s. The line through the two medians: 11.4 us an op + flow
and 0.05 s fixed. A straggler state that unfolds is timed as a state with links down (`link_state_s`): on the
2,048-GPU Llama 3 70B job cut down to 64 GPUs 1.02 times its measured time, to 256 GPUs 0.72 times."""
FOLDED_STRAGGLER_S_PER_EVENT = 1.14e-5
"""CPU seconds each op + flow of a folded straggler state takes (the fit of FOLDED_STRAGGLER_S_FIXED)."""
FOLDED_STRAGGLER_FOLD_S_PER_EVENT = 2.2e-5
"""CPU seconds each op + flow adds to the first folded straggler state of a job, which builds the fold the later
ones share (`StepStates.fold_built`). Measured in the runs of FOLDED_STRAGGLER_S_FIXED as the first state's time
less the later ones' (in its run): 1.1-1.8 s on the 2,048-GPU job (first states 1.81-2.84 s), 13-22 us an op + flow;
7.0-7.4 s on the 16,384-GPU job (first states 10.1-10.2 s), 27-29 us; 22 us is within 1.4 times of their medians."""
EVERY_MIRROR_S_PER_OP = 3.0e-6
"""CPU seconds each op of a folded straggler state that keeps every mirror takes (the slow replica's traffic shares
links with the other replicas', fold_policy.straggler_step), beside FOLDED_STRAGGLER_S_FIXED and EVERY_MIRROR_S_PER_FLOW
each flow: there flows are most of the events (the 2,048-GPU Llama 3 70B job: 54,268 ops, 384,800 flows), each costing a
little more than an op, and the fold checks no mirror for pruning. Fitted to states timed one by one as
FOLDED_STRAGGLER_S_FIXED's, on the flow model (2026-12-07, the 2 shared cores at a load of ~3.7-4.3), states after the
first, with the ops and flows each ran: that job 1.70-1.84 s (16 ranks, 54,268 ops, 384,800 flows); cut to 32 hosts (DP
8, global batch 64, 10 d) 0.70-0.73 s (54,268, 118,592), and with 40 layers 0.36-0.40 s (27,548, 60,992); cut to 8 hosts
(DP 2, global batch 16, 7 d) 0.65 s (54,268, 106,856). The two 32-host cases give the ops' share with the fixed 0.05 s,
the 2,048-GPU job against the 32-host one the flows': 3.0 us an op, 4.1 us a flow, within 5% of every median.
`scale.every_mirror_refold` counts more flows than run where few replicas share the links (232,192 for 118,592 on 32
hosts, 415,424 for 384,800 on 2,048 GPUs), so the estimate is up to ~1.7 times the state's time on small jobs, ~1.1
times on the 2,048-GPU one."""
EVERY_MIRROR_S_PER_FLOW = 4.1e-6
"""CPU seconds each flow of a folded straggler state that keeps every mirror takes (the fit of
EVERY_MIRROR_S_PER_OP)."""
EVERY_MIRROR_FOLD_S_PER_OP = 1.4e-5
"""CPU seconds each op adds to the first folded straggler state of a job that keeps every mirror, which builds the
fold the later ones share (`StepStates.fold_built`): the fold is built from the ops, before any flow. Measured in the
runs of EVERY_MIRROR_S_PER_OP as the first state's time less the later ones' median: 0.37 s on 27,548 ops, 0.52 and
0.60 s on 54,268 (8 and 32 hosts), 0.87 and 1.2 s on 54,268 (2,048 GPUs, two runs): 9.6-22 us an op; 14 us is
within 1.6 times of each."""

_FORKED: StepStates | None = None
"""The job's states, as the workers inherit them (set only while they run)."""


def cores(cap: int = 0) -> int:
    """The cores this process may use (`machine.usable_cores`) where worker processes can be forked from it, at
    most ``cap`` (0: no cap; `trainsim run --workers`): 1 on a platform without `fork`, and in a process that is
    itself a worker (a sweep's points run in parallel, each job on its core)."""
    if "fork" not in get_all_start_methods() or parent_process() is not None:
        return 1
    count = usable_cores()
    return min(count, cap) if cap else count


def memory_room(workers: int, each: int = 0) -> int:
    """How many of ``workers`` the memory this process may still take holds (the host's, or its container's
    where that limits it less, `machine.available_memory`), each counted at ``each`` bytes, by default this
    process's resident size (a forked worker shares the job's pages until it writes them, and Python's reference
    counts write most of those it reads; a straggler state's own step then adds a few hundred MB on the
    16,384-GPU job): at least 1, all of them where neither says (no /proc/meminfo, no limit)."""
    available, size = available_memory(), each or _resident_bytes()
    if available is None or not size:
        return workers
    return max(1, min(workers, available // size))


def _peak_bytes() -> int:
    """The most this process has held resident so far, in bytes (Linux reports ``ru_maxrss`` in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _resident_bytes() -> int:
    """This process's resident set in bytes (0 where /proc/self/statm is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


@dataclass(frozen=True)
class Foreseen:
    """The states a forecast asked the costs of (`states_foreseen`), in order of first asking, and whether some
    state it met had two causes or more in force, whose slow-step split asks sub-states (attribution.py)."""

    states: list[ClusterState]
    splits: bool


def states_foreseen(plan: JobPlan, arrivals: Callable[[int], Arrivals], replications: int,
                    known: Callable[[ClusterState], bool], costs: Callable[[ClusterState], SegmentCosts | None],
                    healthy: SegmentCosts, progress: Callable[[int, int], None] | None = None, *,
                    split: bool = True, before: Collection[ClusterState] = ()) -> Foreseen:
    """The states that ``replications`` replications of ``plan`` (each with the failures
    ``arrivals(replication)``) ask the costs of, those ``known`` left out (answered their ``costs``, read without
    changing what the job holds: `StepStates.foreseen_step`); each unknown one answered with the ``healthy``
    costs. Without ``split`` the replications split no state's slow-step time, so none of its
    sub-states is asked: the first round, whose states' own steps set which sub-states the second needs (a
    state no slower than healthy needs none; answered the healthy costs, each state asked all of them, 313
    states foreseen where a small elastic job simulated 168). The states ``before`` (the first round's, not
    simulated yet) are answered the healthy costs and left out. ``progress(done, replications)`` hears of each
    replication run (the 100 of the 16,384-GPU throttling job take ~15 s, which the bar showed as 0
    replications simulated). A replication that raises ends the forecast: the job's own run raises it, or not,
    where it meets it."""
    wanted: dict[ClusterState, None] = {}
    splits = False

    def noted(state: ClusterState) -> SegmentCosts | None:
        if known(state):
            return costs(state)
        if state not in before:
            wanted[state] = None
        return healthy

    class Forecast(JobProcess):
        def _cause_shares(self) -> tuple[tuple[str, float], ...]:
            nonlocal splits
            splits = splits or len(self.causes) > 1
            return super()._cause_shares() if split else ()

    forecast = replace(plan, costs=noted)
    if progress is not None:
        progress(0, replications)
    try:
        for replication in range(replications):
            env = simpy.Environment()
            env.process(Forecast(forecast, arrivals(replication), JobEvents()).run(env))
            run_all(env)
            if progress is not None:
                progress(replication + 1, replications)
    except Exception:  # a forecast only: the job's own run meets the error where it does
        pass
    return Foreseen(list(wanted), splits)


def straggling(state: ClusterState, healthy: ClusterState) -> bool:
    """Whether ``state`` differs from ``healthy`` only in straggling GPUs: a step on the job's own cluster that
    shares the fold the first such state builds (`StepStates._shared_fold`), so a worker forked after it
    simulates it at a state's cost and memory (a state with links down is an unfolded step of its own)."""
    return replace(state, slow_gpus=()) == healthy


def degraded(state: ClusterState) -> bool:
    """Whether ``state`` runs with links, spine switches or NVSwitch trays down (stragglers beside them or not),
    on the job's own replicas or a shrunk elastic job's fewer (those were left out of the estimate and the
    sizing: on a small elastic job 7 states estimated, 14 simulated): a step of its own, which shares no fold
    with another state's. One with links down folds by the hosts near them where its checks pass
    (`fold_policy.link_fault_step`: a leaf down on 2,048 GPUs onto 288 ranks, 0.92 GB against 5.27 GB
    unfolded), and unfolds where every host is near them; one with some spines down is the same tree with slower
    uplinks, which folds where the symmetry check passes, and is small then; one with NVSwitch trays down (NVLink
    links degraded, not down) runs unfolded."""
    return bool(state.links_down or state.spines_down or state.nvswitch_trays_down)


def larger_first(state: ClusterState, spines: int, ranks: Callable[[ClusterState], int]) -> tuple[int, int]:
    """How large a degraded state's step is likely to be, as a sort key (largest first): links down first, by
    how many ranks the fold by the hosts near them simulates (``ranks``, `LinkStateSizes.ranks`: every
    rank where every host is near them, as two leaves in different leaf groups of a two-group job, which then
    run unfolded), then every one of the ``spines`` down (every leaf-spine link down, or no route and no step at
    all), then some spines down (the same tree with slower uplinks, folded where the symmetry check passes: on
    the 128-GPU Llama 3 70B job its peak was 136 MB where a leaf state's, then unfolded, was 488 MB). A state
    with NVSwitch trays down comes before all: its step runs unfolded."""
    if state.nvswitch_trays_down:
        return -1, 0
    if state.links_down:
        return 0, -ranks(state)
    return (1 if state.spines_down >= spines else 2), 0


class LinkStateSizes:
    """How large each state with links down of a job (``loaded`` on ``topology``) is, without its step: the ranks
    its fold by the hosts near its links down simulates (`rank_classes.LinkFaultRanks` of the cluster and layout
    it runs on, built as its step's is, `states.state_scenario`: a shrunk elastic job's own, with the
    oversubscription of its spines down, its links beyond that cluster dropped as its step drops them; every
    GPU for a replayed trace, whose copies under links down unfold), counted once per state, and its estimated
    CPU time (`link_state_s` of `scale.classed_estimate`). Each size's cluster, layout, rank count and estimator
    are built once, when first asked, for the job's checks before its healthy step and its forecast after."""

    def __init__(self, loaded: LoadedScenario, topology: Topology) -> None:
        self.loaded = loaded
        self.topology = topology
        self._sizes: dict[ClusterState | None, _Size] = {}
        self._estimators: dict[ClusterState | None, Callable[[int], ScaleEstimate] | None] = {}
        self._ranks: dict[ClusterState, int] = {}
        self.straggler_ranks: int | None = None
        """How many ranks the step of a state of straggling GPUs alone on the job's replicas simulates, set by the
        job (`simulate.sized_straggler_states`): every rank where the engine unfolds such a step, else the slow
        replica's classes in each stage; None without a straggle class, or for a trace."""
        self.straggler_why = ""
        """Why such a step unfolds ('' where it folds by the slow replica's classes), as the engine's folding
        rule says it (`fold_policy.straggler_blocker`)."""
        self.straggler_folded = False
        """Whether such a step folds by the slow replica's classes (`straggler_state_s`'s ``folded``)."""
        self.straggler_every_mirror = False
        """Whether that fold keeps every mirror (`Unfolding.shares_links`: the slow replica's traffic shares
        links with the other replicas'), estimated with every copy of its collectives (`scale.every_mirror_refold`)."""
        self._every_mirror: dict[int, ScaleEstimate | None] = {}
        self.straggler_each = ""
        """How such a step is simulated, as `TimeAhead.each` says it ('unfolded onto {ranks:,} ranks (why)')."""

    def state_estimate(self, state: ClusterState, healthy: ClusterState) -> ScaleEstimate | None:
        """The estimate of what the step of ``state`` simulates (the job's healthy state ``healthy``): its fold
        by the hosts near its links down (`estimate`), or for straggling GPUs alone on the job's replicas the
        `straggler_ranks` of the healthy job (`every_mirror` where its fold keeps every mirror); None for any
        other state (spines down, a shrunk job), a trace, or a job without those sized."""
        if state.links_down:
            return self.estimate(state)
        if self.straggler_ranks is None or not straggling(state, healthy):
            return None
        if self.straggler_every_mirror:
            return self.every_mirror(self.straggler_ranks)
        estimator = self.estimator(None)
        return None if estimator is None else estimator(self.straggler_ranks)

    def state_s(self, state: ClusterState, healthy: ClusterState, first: bool = False) -> float | None:
        """The estimated CPU seconds of the step of ``state`` (`state_estimate`): `link_state_s` for one with
        links down, `straggler_state_s` for straggling GPUs alone (the ``first`` of the job's, which builds
        their shared fold); None where it has no estimate."""
        estimate = self.state_estimate(state, healthy)
        if estimate is None:
            return None
        if state.links_down:
            return link_state_s(estimate)
        return straggler_state_s(estimate, self.straggler_folded, first, self.straggler_every_mirror)

    def ranks(self, state: ClusterState) -> int:
        """How many ranks the step of ``state`` (with some links down) simulates."""
        if state not in self._ranks:
            self._ranks[state] = self.count(state, state.links_down)
        return self._ranks[state]

    def count(self, state: ClusterState | None, down: Sequence[tuple[str, str]]) -> int:
        """How many ranks the job in ``state`` (its replicas and spines down; None: the healthy job) simulates with
        the links ``down``."""
        size = self.size(state)
        return size.ranks(tuple(pair for pair in down if size.topology.wiring.has_edge(*pair)))

    def world(self, state: ClusterState) -> int:
        """The ranks of the job on ``state``'s replicas, unfolded."""
        return self.size(state).topology.num_gpus

    def estimate(self, state: ClusterState) -> ScaleEstimate | None:
        """The step of ``state`` folded onto its `ranks` (`scale.classed_estimate` on its cluster); None for a
        trace."""
        estimator = self.estimator(state)
        return None if estimator is None else estimator(self.ranks(state))

    def every_mirror(self, ranks: int) -> ScaleEstimate | None:
        """`scale.every_mirror_refold` of the healthy job onto ``ranks`` ranks, worked out once."""
        from simulator.scale import every_mirror_refold

        if ranks not in self._every_mirror:
            size = self.size(None)
            self._every_mirror[ranks] = every_mirror_refold(size.loaded, size.topology.num_gpus, ranks, size.topology)
        return self._every_mirror[ranks]

    def estimator(self, state: ClusterState | None) -> Callable[[int], ScaleEstimate] | None:
        """`scale.classed_estimator` of the job in ``state`` (None: the healthy job)."""
        from simulator.scale import classed_estimator

        key = self._key(state)
        if key not in self._estimators:
            size = self.size(state)
            self._estimators[key] = classed_estimator(size.loaded, size.topology.num_gpus, size.topology)
        return self._estimators[key]

    def size(self, state: ClusterState | None) -> _Size:
        """The job in ``state``, on its replicas with its spines down (None: the healthy job, as a replayed
        trace's every state)."""
        if None not in self._sizes:
            self._sizes[None] = self._whole()
        key = self._key(state)
        if key is None:
            return self._sizes[None]
        if key not in self._sizes:
            self._sizes[key] = self._of(key)
        return self._sizes[key]

    def _key(self, state: ClusterState | None) -> ClusterState | None:
        """What of ``state`` its size depends on: its replicas and spines down (None where neither differs from
        the healthy job's, or for a trace)."""
        if state is None:
            return None
        whole = self.size(None)
        if whole.layout is None or (state.replicas == whole.replicas and not state.spines_down):
            return None
        return ClusterState(state.replicas, spines_down=state.spines_down)

    def _whole(self) -> _Size:
        from simulator.config.traces import TraceWorkload
        from simulator.workload.training import pipeline_depth, resolve_layout

        loaded, topology = self.loaded, self.topology
        scenario = loaded.scenario
        if isinstance(scenario.workload, TraceWorkload):
            return _Size(loaded, topology, None, None)
        layout = located(loaded, lambda: resolve_layout(scenario, topology.num_gpus, pipeline_depth(scenario)))
        return _Size(loaded, topology, layout, layout.dp)

    def _of(self, shape: ClusterState) -> _Size:
        """The job on ``shape``'s replicas with its spines down, built as its steps are (`states.state_scenario`)."""
        from simulator.workload.training import microbatch_count, pipeline_depth, resolve_layout

        whole = self._sizes[None]
        assert whole.replicas is not None
        scenario = whole.loaded.scenario
        loaded, topology = state_scenario(whole.loaded, whole.topology, shape, whole.replicas,
                                          microbatch_count(scenario, whole.replicas))
        layout = resolve_layout(loaded.scenario, topology.num_gpus, pipeline_depth(loaded.scenario))
        return _Size(loaded, topology, layout, shape.replicas)


class _Size:
    """The job on some replica count (`LinkStateSizes.size`): its scenario, cluster and layout (None for a
    trace), and the ranks its fold simulates under some links down."""

    def __init__(self, loaded: LoadedScenario, topology: Topology, layout: Layout | None,
                 replicas: int | None) -> None:
        from simulator.engine.rank_classes import LinkFaultRanks

        self.loaded = loaded
        self.topology = topology
        self.layout = layout
        self.replicas = replicas
        gpus = topology.num_gpus
        self.ranks: Callable[[Sequence[tuple[str, str]]], int] = (
            (lambda down: gpus) if layout is None else LinkFaultRanks(layout, topology, loaded.scenario.parallelism.ep))


def _known_states_activity(activity: Callable[[str], None]) -> Callable[[ClusterState | None], None]:
    """A `StepStates.on_simulating` that tells ``activity`` which state `simulate_known` simulates (what differs
    in it), and '' once it is done."""

    def on_simulating(state: ClusterState | None) -> None:
        activity("" if state is None else f"simulating {state.describe() or f'{state.replicas} replicas'}")

    return on_simulating


def _first_states_activity(activity: Callable[[str], None]) -> Callable[[ClusterState | None], None]:
    """A `StepStates.on_simulating` that tells ``activity`` which state the job's process simulates before the
    workers are forked (a leaf switch's state of the 2,048-GPU job takes ~223 s, and the bar said only
    '0/41 states' meanwhile), and '' once it is done."""

    def on_simulating(state: ClusterState | None) -> None:
        activity("" if state is None else f"first state, before the workers start ({state.describe()})")

    return on_simulating


def states_ahead(states: StepStates, wanted: Sequence[ClusterState],
                 ranks: Callable[[ClusterState], int]) -> list[list[ClusterState]]:
    """The states of ``wanted`` whose steps the job simulates and ``states`` has not, by kind: each state's
    `StepStates.merged` one, once (states with links down that are rotations of each other are one step,
    reliability/symmetry.py: the 41 states with leaves down that the 2,048-GPU job with a leaf-switch class
    foresees over 2 replications are 18 steps), the straggling ones where there are AHEAD_MIN_STATES of them,
    then the degraded ones (`degraded`), largest first (`larger_first`, by ``ranks``, `LinkStateSizes.ranks`). The
    one list both the job's estimate of their time (`time_ahead`) and the workers go by, so the estimate falls
    with the merge; each kind is simulated as met where they do not run."""
    merged = dict.fromkeys(states.merged(state) for state in wanted)
    unknown = [state for state in merged if not states.settled(state)]
    slow = [state for state in unknown if straggling(state, states.healthy)]
    down = sorted((state for state in unknown if degraded(state)),
                  key=lambda state: larger_first(state, states.spines, ranks))
    return [kind for kind in (slow if len(slow) >= AHEAD_MIN_STATES else [], down) if kind]


def simulate_ahead(states: StepStates, kinds: Sequence[Sequence[ClusterState]], workers: int = 0,
                   progress: Callable[[int, int], None] | None = None,
                   warning: Callable[[str], None] | None = None,
                   activity: Callable[[str], None] | None = None,
                   sharing: Callable[[int], None] | None = None) -> int:
    """Simulate the states of ``kinds`` (`states_ahead`: straggling ones, degraded ones), the first of each kind
    here (a straggler state's builds the fold they share; the degraded state likely largest, `larger_first`,
    since its peak memory is what each worker may come to hold: sized by a folded spine state met first, the
    workers were counted at 136 MB and reached 488 MB on the 128-GPU Llama 3 70B job) and the rest in worker
    processes (one per core, at most ``workers`` where not 0, and no more than the host's free memory holds,
    each counted at this process's resident size, or its peak once a degraded state ran here), for ``states``
    to hand out when the job meets them; nothing where fewer than two workers would share them, or a first
    raised. ``progress(done, total)`` hears of each state simulated (those simulated here too where no worker
    will share the rest: the count stopped one short of them), ``sharing(workers)`` before the count of each
    simulated here how many workers will share the rest (the bar's first time left took them one after the
    other). A worker that
    dies (the kernel's out-of-memory killer) ends them all: the job simulates the states left as it meets them;
    a fork the host refuses leaves the workers forked before it. ``warning`` hears one line of either (the job
    went on on fewer cores than it was given, which nothing else showed). ``activity`` hears which state is
    simulated here while it is, and '' after. Ctrl-C or SIGTERM ends the workers without a word and raises
    KeyboardInterrupt (Terminated) here. How many the workers simulated."""
    global _FORKED
    todo = [state for kind in kinds for state in kind]
    rest = [state for kind in kinds for state in kind[1:]]
    wanted_workers = min(cores(workers), len(rest))
    if wanted_workers < 2:
        return 0
    if progress is not None:
        progress(0, len(todo))
    heard = states.on_simulating
    if activity is not None:
        states.on_simulating = _first_states_activity(activity)
    try:
        for here, kind in enumerate(kinds, 1):
            if not _kept_ahead(states, kind[0]):
                return 0
            if here < len(kinds):
                _counted(progress, sharing, here, len(todo), wanted_workers)
    finally:
        states.on_simulating = heard
    degrading = any(degraded(kind[0]) for kind in kinds)
    pool_size = memory_room(wanted_workers, _peak_bytes()) if degrading else memory_room(wanted_workers)
    _counted(progress, sharing, len(kinds), len(todo), pool_size if pool_size >= 2 else 1)
    if pool_size < 2:
        return 0
    _FORKED = states
    try:
        return _simulated_in_workers(states, rest, len(todo), pool_size, progress, warning)
    finally:
        _FORKED = None


def simulate_known(states: StepStates, foreseen: Sequence[ClusterState],
                   progress: Callable[[int, int], None] | None = None,
                   activity: Callable[[str], None] | None = None) -> None:
    """Simulate here, ahead of the job, each of the states ``foreseen`` not settled yet (`StepStates.settled`):
    those of a first round that no worker simulated (on one core, all of them), so that the second round's
    forecast knows every one of them, and asks the same sub-states on any number of cores (a state no slower
    than healthy asks none); one that raises keeps its error for the job to raise where it meets it.
    ``progress(done, total)`` hears of each, counted with those settled already among all the round's states
    (on one core the bar sat at the forecast's last count through them; on two it counted the workers' 7/7, then
    0/1 to 1/1 here), ``activity`` which one is simulated while it is, and '' after."""
    round_states = list(dict.fromkeys(states.merged(state) for state in foreseen))
    todo = [state for state in round_states if not states.settled(state)]
    if not todo:
        return
    settled = len(round_states) - len(todo)
    if progress is not None:
        progress(settled, len(round_states))
    heard = states.on_simulating
    if activity is not None:
        states.on_simulating = _known_states_activity(activity)
    try:
        for done, state in enumerate(todo, settled + 1):
            _kept_ahead(states, state)
            if progress is not None:
                progress(done, len(round_states))
    finally:
        states.on_simulating = heard


def _counted(progress: Callable[[int, int], None] | None, sharing: Callable[[int], None] | None, done: int,
             total: int, workers: int) -> None:
    """``done`` of ``total`` states ahead counted to ``progress``, the rest shared by ``workers`` told first to
    ``sharing`` (`simulate_ahead`'s)."""
    if sharing is not None:
        sharing(workers)
    if progress is not None:
        progress(done, total)


@dataclass(frozen=True)
class TimeAhead:
    """The estimated time of a job's states of one kind, before any is simulated: ``states`` of them,
    ``cpu_s`` CPU seconds in all, ``wall_s`` on ``cores`` cores (the first in the job's process, the rest
    shared by the workers, as `simulate_ahead` runs them; all on one core where fewer than two would share
    them), the largest ``largest_ranks`` ranks. ``kind``: what the states have ('with links down'), ``each``:
    how each is simulated, its ranks to be formatted in ('folded ... onto at most {ranks:,} ranks')."""

    states: int
    cpu_s: float
    wall_s: float
    cores: int
    largest_ranks: int
    kind: str = "with links down"
    each: str = "folded by the hosts near its links down onto at most {ranks:,} ranks"

    def line(self) -> str:
        """The estimate in words, with what cuts it."""
        on = f", {format_duration(self.wall_s)} on {self.cores} cores" if self.cores > 1 else " on one core"
        return (f"the {self.states:,} cluster states {self.kind} foreseen take an estimated "
                f"{format_duration(self.cpu_s)} of CPU{on}, each {self.each.format(ranks=self.largest_ranks)}")


def link_state_s(estimate: ScaleEstimate) -> float:
    """The CPU seconds of a state with links down whose fold is estimated as ``estimate``
    (`scale.classed_estimate`): LINK_STATE_S_FIXED, and each op and flow LINK_STATE_S_PER_EVENT and
    LINK_STATE_S_PER_EVENT_GPU for each GPU of the cluster."""
    return LINK_STATE_S_FIXED + estimate.events * (LINK_STATE_S_PER_EVENT + estimate.gpus * LINK_STATE_S_PER_EVENT_GPU)


def straggler_state_s(estimate: ScaleEstimate, folded: bool, first: bool = False, every_mirror: bool = False
                      ) -> float:
    """The CPU seconds of a straggler state whose step is estimated as ``estimate`` (`scale.classed_estimate` on
    `LinkStateSizes.straggler_ranks`, or `scale.every_mirror_refold` where its fold keeps every mirror): where it
    ``folded`` by the slow GPU's classes, FOLDED_STRAGGLER_S_FIXED and FOLDED_STRAGGLER_S_PER_EVENT each op and
    flow, and FOLDED_STRAGGLER_FOLD_S_PER_EVENT more each where it is the ``first`` (building the fold the later
    ones share); where that fold keeps ``every_mirror``, FOLDED_STRAGGLER_S_FIXED, EVERY_MIRROR_S_PER_OP each op
    and EVERY_MIRROR_S_PER_FLOW each flow, and EVERY_MIRROR_FOLD_S_PER_OP more each op where it is the ``first``;
    else as a state with links down (`link_state_s`), unfolded."""
    if not folded:
        return link_state_s(estimate)
    if every_mirror:
        per_op = EVERY_MIRROR_S_PER_OP + (EVERY_MIRROR_FOLD_S_PER_OP if first else 0.0)
        return FOLDED_STRAGGLER_S_FIXED + estimate.ops * per_op + estimate.flows * EVERY_MIRROR_S_PER_FLOW
    per_event = FOLDED_STRAGGLER_S_PER_EVENT + (FOLDED_STRAGGLER_FOLD_S_PER_EVENT if first else 0.0)
    return FOLDED_STRAGGLER_S_FIXED + estimate.events * per_event


def with_links_down(kinds: Sequence[Sequence[ClusterState]]) -> list[ClusterState]:
    """The states with links down of ``kinds`` (`states_ahead`), in its order: those the job sizes and times up
    front."""
    return [state for kind in kinds for state in kind if state.links_down]


def time_ahead(down: Sequence[ClusterState], ranks: Callable[[ClusterState], int],
               state_s: Callable[[ClusterState], float], workers: int = 0) -> TimeAhead | None:
    """The time of the states with links down ``down`` (`with_links_down`), or of straggler states with
    `LinkStateSizes.straggler_each` in `TimeAhead`'s: each ``state_s``, the first in this process and the rest over
    min(`cores`, their count) workers where two or more share them (`simulate_ahead`), else all here (``workers``
    1: straggler states fewer than AHEAD_MIN_STATES, simulated as met); the largest by ``ranks``. None where
    there are none."""
    if not down:
        return None
    times = [state_s(state) for state in down]
    pool = min(cores(workers), len(down) - 1)
    wall = times[0] + sum(times[1:]) / pool if pool >= 2 else sum(times)
    return TimeAhead(len(down), sum(times), wall, pool if pool >= 2 else 1, max(map(ranks, down)))


def slow_states(states: StepStates, wanted: Sequence[ClusterState]) -> list[ClusterState]:
    """The straggler states of ``wanted`` (`straggling`) whose steps the job simulates and ``states`` has not,
    once each, in order: those the job sizes and times up front beside its states with links down, whether or
    not they are simulated ahead (`states_ahead` leaves out fewer than AHEAD_MIN_STATES)."""
    merged = dict.fromkeys(states.merged(state) for state in wanted)
    return [state for state in merged if not states.settled(state) and straggling(state, states.healthy)]


def _simulated_in_workers(states: StepStates, rest: Sequence[ClusterState], total: int, pool_size: int,
                          progress: Callable[[int, int], None] | None,
                          warning: Callable[[str], None] | None) -> int:
    """`simulate_ahead`'s workers: ``pool_size`` processes forked from this one, each handed the next state of
    ``rest`` (the last of the ``total`` states ahead) on its own pipe as it hands one back, all ended before
    this returns or raises. A worker's end of its pipe is in no other process, so one that dies is seen at once:
    its pipe ends (EOFError), or is reset where it died with a state unread in it (ConnectionResetError, an
    OSError). ``warning``: `simulate_ahead`'s. How many states they simulated."""
    waiting = list(reversed(rest))
    pool: list[_Worker] = []
    busy: dict[Connection, tuple[_Worker, ClusterState]] = {}
    done = 0
    worker: _Worker | None = None
    lost: _Worker | None = None
    try:
        refused = _forked_into(pool, pool_size)
        resume_heartbeats()  # the progress goes on while the workers simulate their first states
        if refused is not None and warning is not None:
            unforked = "" if pool else "; the job simulates them as it meets them"
            warning(f"the host refused to fork a worker to simulate cluster states ahead ({refused}): "
                    f"{len(pool)} of {pool_size} forked{unforked}")
        for worker in pool[:len(waiting)]:
            busy[worker.pipe] = worker, worker.hand(waiting.pop())
        while busy:
            ready = wait(list(busy))
            for pipe in [pipe for pipe in busy if pipe in ready]:
                worker, state = busy.pop(pipe)
                result = pipe.recv()
                if result is not None:
                    states.simulated_ahead(state, result)
                    done += 1
                if progress is not None:
                    progress(total - len(waiting) - len(busy), total)
                if waiting:
                    busy[pipe] = worker, worker.hand(waiting.pop())
    except (EOFError, OSError):  # a worker died (out of memory): the job simulates the rest as it meets them
        lost = worker
    finally:
        _ended(pool)
    if lost is not None and warning is not None:
        warning(f"a worker simulating cluster states ahead ended ({_how_it_ended(lost.process.exitcode)}); the "
                f"job simulates the {len(rest) - done:,} states left as it meets them, on one core")
    return done


def _how_it_ended(exitcode: int | None) -> str:
    """A worker's end as `multiprocessing` reports it (minus a signal's number), in words."""
    if exitcode is not None and exitcode < 0:
        oom = ", SIGKILL: the kernel's out-of-memory killer?" if -exitcode == signal.SIGKILL else ""
        return f"signal {-exitcode}{oom}"
    return f"exit status {exitcode}"


def _forked_into(pool: list[_Worker], size: int) -> str | None:
    """Fork workers into ``pool`` up to ``size``; a fork the host refuses (ENOMEM, EAGAIN: out of memory or of
    processes) leaves those forked so far, none at worst, and the job simulates the rest of its states as met.
    Before, the refusal ended the job ('error: Cannot allocate memory', exit 1). Why the host refused, or None."""
    try:
        while len(pool) < size:
            pool.append(_Worker.forked([worker.pipe for worker in pool]))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _ended(pool: Sequence[_Worker]) -> None:
    """End every worker of ``pool`` (SIGTERM: none holds anything to flush) and wait for it; a second Ctrl-C or
    a SIGTERM meanwhile is held back and raised once they are gone, so that none is left running."""
    with interrupts_held():
        for worker in pool:
            worker.process.terminate()
        for worker in pool:
            worker.process.join()
            worker.pipe.close()


class _Worker:
    """A worker process forked from the job's, and this process's end of its pipe."""

    def __init__(self, process: BaseProcess, pipe: Connection) -> None:
        self.process = process
        self.pipe = pipe

    @classmethod
    def forked(cls, others: Sequence[Connection]) -> _Worker:
        """A worker forked now, serving `_serve` on its end of a new pipe; ``others``: this process's ends of the
        pipes of the workers forked before, which it closes (so that each pipe ends with the job's process).
        Ctrl-C and SIGTERM are blocked across the fork, so that the worker sets its own handlers before one can
        reach it (Python's, or the console script's, would raise KeyboardInterrupt inside multiprocessing's
        start-up and print a traceback)."""
        context = get_context("fork")
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(theirs, [ours, *others]), daemon=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            process.start()
        except OSError:  # the fork refused: neither end of the pipe is any process's
            ours.close()
            theirs.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        theirs.close()
        return cls(process, ours)

    def hand(self, state: ClusterState) -> ClusterState:
        """Send ``state`` to the worker to simulate; the state."""
        self.pipe.send(state)
        return state


def _serve(pipe: Connection, inherited: Sequence[Connection]) -> None:
    """In a worker: simulate each state the job's process sends, in the job's states as forked, and send back
    what `_simulated_here` made of it, until the job's process ends the worker (or itself: the pipe ends). Ctrl-C
    (sent to the whole process group) ends it at once without a traceback; the job's process ends the others
    and reports the interrupt once. SIGTERM, which the job's process ends it with (`_ended`), takes its default
    action: the handler the console script set in the job's process would raise KeyboardInterrupt here."""
    signal.signal(signal.SIGINT, lambda _signum, _frame: os._exit(130))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    for connection in inherited:
        connection.close()
    assert _FORKED is not None
    try:
        while True:
            pipe.send(_simulated_here(_FORKED, pipe.recv()))
    except (EOFError, OSError):  # the job's process is gone (a broken pipe, or one reset with a state unread)
        return


def _simulated_here(states: StepStates, state: ClusterState
                    ) -> tuple[StepState | None, dict] | TrainsimError | None:
    """The state's step and summary simulated ahead (`StepStates.ahead_entry`), or the simulator's error where it
    raised one (a state refused: a result, which pickles whole, `errors.InputError.__reduce__`), or None where
    anything else raised (a bug, the host's memory: simulated again where the job meets the state, which raises
    it there, whole)."""
    try:
        return states.ahead_entry(state)
    except TrainsimError as exc:
        return exc
    except Exception:  # raised again by the job's own run of the state
        return None


def _kept_ahead(states: StepStates, state: ClusterState) -> bool:
    """Simulate ``state`` here ahead of the job and keep what came of it (`StepStates.simulated_ahead`): whether
    its step did come of it (not an error)."""
    result = _simulated_here(states, state)
    if result is not None:
        states.simulated_ahead(state, result)
    return isinstance(result, tuple)
