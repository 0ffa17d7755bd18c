"""Cluster states of a job that keeps running: straggling GPUs and degraded leaves, cables and NICs. Their
slow-step time against the closed form, their step times against `simulate()` of the perturbed scenario, and
a leaf that cannot be routed around interrupting the job instead."""

from __future__ import annotations

import functools
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pandas as pd
import pytest
from shared import (
    DATA,
    DP_INNERMOST_DGX,
    GIB,
    ONE_GPU_HOSTS,
    RAILS,
    REPO,
    STEP_ONLY,
    ZERO3_JOB,
    after_the_healthy_step,
    inside,
)

from simulator import scale, simulate, simulation
from simulator.cli import main
from simulator.config.loader import LoadedScenario, scenario_from_text
from simulator.errors import InputError, ScenarioError
from simulator.reliability import ahead, states
from simulator.reliability import simulate as reliability_simulate
from simulator.reliability.elastic import allowed_sizes
from simulator.reliability.simulate import JobResult, simulate_job
from simulator.reliability.summary import TIME_PARTS
from simulator.sweep.executors import SerialExecutor
from simulator.sweep.runner import run_sweep
from simulator.sweep.spec import load_sweep
from simulator.workload.training import resolve_model


def test_straggling_time_matches_the_closed_form():
    """Four GPUs each throttled (x1.5) at rate 1/48 h for a fixed 6 h. Every GPU's straggler is simulated on replica 0's
    GPU, so the job is slow while any of the four is throttled: at time t with probability 1 - (1 - p(t))^4, p(t) a
    GPU's chance to be throttled. A throttled GPU is not throttled again (its renewal restarts at the repair's end),
    so p = 1 - exp(-L t) up to R, then p'(t) = L (p(t - R) - p(t)), L = 1/48 h (integrated in 10 s steps), and a GPU
    is throttled L (1 - p(t)) times per second. Expected slow-step time = E[time throttled] x (1 - healthy step /
    throttled step), with no checkpoint in the horizon. 2,000 replications of 10 d: 0.78% over (standard error
    0.42%); tolerance 3 standard errors, 1.3%, and the closed form within the 95% interval. The 35,605 straggling
    windows expected (17.80 a replication, as sum_k P(Gamma(k, L) <= H - (k - 1) R) gives too; 40,000 if a throttled
    GPU could be throttled again): 0.72% over (Poisson standard error 0.53%); tolerance 3 standard errors, 1.6%."""
    text = ONE_GPU_HOSTS + """run: {horizon: 10 d, replications: 2000, seed: 3}
faults:
  components:
    throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 48 h, repair: 6 h, repair_distribution: fixed}
"""
    job = simulate_job(scenario_from_text(text))
    summary = job.summary
    healthy, throttled = (state["step_time_s"] for state in summary["states"])
    assert [state["slow_gpus"] for state in summary["states"]] == [{}, {"0": 1.5}]
    assert throttled == pytest.approx(simulate(scenario_from_text(
        ONE_GPU_HOSTS, "inline.yaml", ["faults.step.stragglers=[{gpus: [0], slowdown: 1.5}]"])).summary["step_time_s"],
        rel=1e-12)
    horizon, repair, rate, dt = 10 * 86400.0, 6 * 3600.0, 1 / (48 * 3600.0), 10.0
    lag = round(repair / dt)
    throttled_chance = [1 - math.exp(-rate * i * dt) for i in range(lag + 1)]
    for i in range(lag, round(horizon / dt)):
        throttled_chance.append(throttled_chance[i] + dt * rate * (throttled_chance[i - lag] - throttled_chance[i]))
    slowed = dt * sum(1 - (1 - chance) ** 4 for chance in throttled_chance[:-1])
    windows = 4 * dt * rate * sum(1 - chance for chance in throttled_chance[:-1])
    expected = slowed * (1 - healthy / throttled)
    slow = summary["time_s"]["slow_steps_s"]
    assert slow["mean"] == pytest.approx(expected, rel=0.013)
    assert slow["ci95_low"] < expected < slow["ci95_high"]
    assert summary["slow_steps_by_cause_s"]["throttle"]["mean"] == pytest.approx(slow["mean"], rel=1e-12)
    assert summary["ettr"]["mean"] == pytest.approx(1 - slow["mean"] / horizon, rel=1e-12)
    rows = job.events[job.events["kind"] == "straggling"]
    assert len(rows) == pytest.approx(2000 * windows, rel=0.016)
    assert (rows["end_s"] - rows["start_s"]).to_numpy() == pytest.approx(repair, rel=1e-12)


PIPELINED = ["parallelism.pp=2", "parallelism.dp=2", "training.microbatches=4"]
SHARED_NICS = ["cluster.nics_per_node=4", "cluster.oversubscription=2", "collectives.channels=2"]


def throttled_rails_job(overrides: list[str]) -> tuple[LoadedScenario, scale.ScaleEstimate]:
    """RAILS as a 1-day job of one replication with a GPU straggle class (x1.5, mtbf 1000 h), and its healthy
    step's folded scale estimate on the 32 GPUs."""
    job = scenario_from_text(RAILS + """run: {horizon: 1 d, replications: 1}
faults:
  components:
    throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 1000 h, repair: 6 h}
""", "inline.yaml", overrides)
    folded = scale.estimate_scale(job.scenario, 32, scale.scenario_hosts(job))
    assert folded is not None
    return job, folded


@pytest.mark.parametrize("overrides, own, reason", [
    ([], "", ""),
    (PIPELINED, "", ""),
    ([], "{gpus: [9], slowdown: 2}", "stragglers in more than one pipeline replica"),
    ([*PIPELINED, "network.model=analytic"], "", ""),
    (SHARED_NICS, "", "their flows share the fabric's links unevenly"),
], ids=["folds", "shares-links", "own-straggler-in-replica-1", "analytic", "asymmetric-replicas"])
def test_the_refusal_of_straggler_states_follows_the_engine(monkeypatch, overrides, own, reason):
    """A job with a straggle class whose states are beyond the scale limits unfolded (lowered here to the
    ops + flows of the state's straggler refold, which runs: with every mirror kept where the slow replica's
    traffic shares links with the others', `scale.every_mirror_refold`) is refused exactly when the engine runs
    its straggler state unfolded, for the reason that state's own run
    gives (`fold_off_reason`: the state is `simulate()` of the scenario with the representative GPU 0 slowed).
    Asking only whether one straggler's replica shares links would let through a state that the scenario's own
    straggler in replica 1 unfolds (two slow replicas), and name another reason than the symmetry check's; a
    slow replica whose traffic shares links with the others' refolds by its classes with every mirror kept
    (`fold_policy.straggler_step`), as on the analytic model, where each transfer runs alone."""
    stragglers = ", ".join(entry for entry in (own, "{gpus: [0], slowdown: 1.5}") if entry)
    state = simulate(scenario_from_text(RAILS, "inline.yaml",
                                        [*overrides, f"faults.step.stragglers=[{stragglers}]"])).summary
    assert state["folded"] == (not reason)
    assert reason in state["fold_off_reason"] if reason else "fold_off_reason" not in state
    job, folded = throttled_rails_job([*overrides, f"faults.step.stragglers=[{own}]"])
    refold = (scale.every_mirror_refold(job, 32, 4 * folded.simulated_ranks) if overrides == PIPELINED
              else scale.refold_estimate(folded, 32, 4 * folded.simulated_ranks))
    assert refold is not None
    monkeypatch.setattr(scale, "MAX_EVENTS", refold.events)
    if reason:
        with pytest.raises(ScenarioError) as refused:
            simulate_job(job)
        assert refused.value.field == "faults.components.throttle"
        assert (f"each such state is simulated as an unfolded step ({state['fold_off_reason']}): "
                in refused.value.problem)
    else:
        straggling = [s for s in simulate_job(job).summary["states"] if s.get("slow_gpus") == {"0": 1.5}]
        assert [s["step_time_s"] for s in straggling] == [state["step_time_s"]]


JOB64 = """
cluster: {topology: dgx-h100-cluster, nodes: 8, leaf_ports: 4, spines: 2}
model: {layers: 8, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 2, pp: 4, dp: 8}
network: {model: analytic}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
run: {horizon: 2 d, replications: 2, seed: 1}
faults:
  components:
    throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 200 h, repair: 12 h}
"""


def test_straggler_states_share_one_fold_and_each_equals_its_own_run(monkeypatch):
    """A 64-GPU job (TP 2, PP 4, DP 8, analytic) whose throttled GPUs slow 9 sets of stages: every state's step is
    simulated from one shared fold (the stage fold and its straggler refold built once, each state taking only
    its own slowdowns, `fold_policy.refaulted`), and each state's whole summary (`link_tiers` aside, which a
    state does not compute) equals `simulate()` of the
    scenario with its stragglers as `faults.step`, which folds from scratch. Unshared, each state built and judged
    both programs again: 10 of the 17 s of a state of the 16,384-GPU job; and redid the sharing analysis of
    the program it runs (`simulation.program_sharing`: which collectives run alone), 0.4 of its 2.8 s."""
    builds = []
    step_program = simulation.step_program

    def counted_build(*args, **kwargs):
        builds.append(kwargs.get("classes"))
        return step_program(*args, **kwargs)

    analyses = []
    private_collectives = simulation.private_collectives

    def counted_analysis(*args, **kwargs):
        analyses.append(args[0])
        return private_collectives(*args, **kwargs)

    monkeypatch.setattr(simulation, "step_program", counted_build)
    monkeypatch.setattr(simulation, "private_collectives", counted_analysis)
    loaded = scenario_from_text(JOB64, "job64.yaml")
    job = simulate_job(loaded)
    slowed = [state for state in job.summary["states"] if state["slow_gpus"]]
    assert len(slowed) == 9
    assert len(builds) == 2 and builds[0] is None and builds[1] is not None
    assert len(analyses) == 2
    monkeypatch.setattr(simulation, "step_program", step_program)
    monkeypatch.setattr(simulation, "private_collectives", private_collectives)
    key = states.step_key(loaded)
    for state in slowed:
        stragglers = ", ".join(f"{{gpus: [{gpu}], slowdown: {factor}}}" for gpu, factor in state["slow_gpus"].items())
        step = scenario_from_text(JOB64, "job64.yaml", [f"faults.step.stragglers=[{stragglers}]"])
        with pytest.warns(UserWarning, match=r"simulate\(\) runs one training step and ignores the job"):
            alone = simulate(step).summary
        job_warning = alone["warnings"].pop(0)  # a state keeps no warning that the job sections go unread
        assert "runs one training step" in job_warning
        # a state skips the link tiers (`simulate_training(..., link_tiers=False)`): nothing reads them, and over a
        # job's many states their route reading is the step's dearest part, so its verdict names no binding tier;
        # nor has it the step's `resources` (`simulate()` adds them; a job counts its own over the horizon); every
        # other figure must still match
        del alone["link_tiers"], alone["resources"]
        tier = alone["bottleneck"].pop("binding_tier", None)
        slow = tuple((int(gpu), factor) for gpu, factor in state["slow_gpus"].items())
        cached = states._CACHE[key, states.ClusterState(8, slow_gpus=slow)][1]
        if tier is not None:  # the verdict's clause naming the tier is the only text the state's lacks
            parts = alone["bottleneck"]["verdict"].split("; ")
            assert sum(" bound by the " in part for part in parts) == 1
            alone["bottleneck"]["verdict"] = "; ".join(part for part in parts if " bound by the " not in part)
        assert cached == alone


OWN_STRAGGLER = ONE_GPU_HOSTS + """run: {horizon: 10 d, replications: 200, seed: 3}
faults:
  step: {stragglers: [{gpus: [0], slowdown: 1.5}]}
  components:
    throttle: {unit: gpu, effect: straggle, slowdown: 1.3, mtbf: 48 h, repair: 6 h, repair_distribution: fixed}
"""
"""The four one-GPU hosts with a straggler of the scenario's own on GPU 0 (x1.5) and every GPU throttled (x1.3)
at rate 1/48 h for a fixed 6 h."""


def _own_straggler_and(*stragglers: tuple[int, float]) -> float:
    """`simulate()`'s step of the four one-GPU hosts with GPU 0 slowed x1.5 and ``stragglers`` (GPU, factor)."""
    entries = ", ".join(f"{{gpus: [{gpu}], slowdown: {factor}}}" for gpu, factor in [(0, 1.5), *stragglers])
    return simulate(scenario_from_text(ONE_GPU_HOSTS, "inline.yaml", [f"faults.step.stragglers=[{entries}]"])
                    ).summary["step_time_s"]


def test_a_throttle_lands_on_its_own_gpu_not_on_the_scenarios_own_straggler():
    """Every throttle was simulated on GPU 0, the first of its stage, where the scenario's own x1.5 straggler
    sits: the two multiplied (0.06189 s a step) though 3 throttles in 4 hit another GPU, which costs nothing
    (0.05999 s, the own straggler sets the pace, as `simulate()` of GPUs 0 and 2 slowed says). A throttle on
    GPU 0 is its own state; one on GPUs 1 to 3 is simulated on GPU 1, the first GPU the scenario leaves at full
    speed. Slow-step time is then GPU 0's throttles' alone: E[time GPU 0 throttled] x (1 - 0.05999 / 0.06189),
    as in `test_straggling_time_matches_the_closed_form` with a rate of 1/48 h (before: 3.3 times it, every
    throttle charged). 200 replications of 10 d: 0.7% off, within 3 standard errors (one is 3%)."""
    loaded = scenario_from_text(OWN_STRAGGLER)
    job_states = reliability_simulate.prepare_job(loaded).states
    assert [job_states.representative(gpu) for gpu in range(4)] == [0, 1, 1, 1]
    summary = simulate_job(loaded).summary
    steps = {tuple(state["slow_gpus"].items()): state["step_time_s"] for state in summary["states"]}
    own, both = _own_straggler_and(), _own_straggler_and((0, 1.3))
    assert steps[()] == own
    assert steps[("0", 1.3),] == pytest.approx(both, rel=1e-12)
    assert steps[("1", 1.3),] == pytest.approx(_own_straggler_and((2, 1.3)), rel=1e-12) == own
    horizon, repair, rate = 10 * 86400.0, 6 * 3600.0, 1 / (48 * 3600.0)
    slowed = repair - (1 - math.exp(-rate * repair)) / rate + (horizon - repair) * (1 - math.exp(-rate * repair))
    assert inside(slowed * (1 - own / both), summary["slow_steps_by_cause_s"]["throttle"], 250)


def test_throttles_on_gpus_the_scenario_slows_alike_make_one_state():
    """With every GPU slowed alike by the scenario's own stragglers (`fraction: 1.0`), a throttled GPU need not keep
    its place, which would make each throttled GPU a state of its own: the stand-in is the first GPU of the stage
    with the same own slowdown, one throttle state, whose step is `simulate()`'s with any one GPU throttled on top
    of the shared x1.05."""
    loaded = scenario_from_text(OWN_STRAGGLER, "inline.yaml",
                                ["faults.step.stragglers=[{fraction: 1.0, slowdown: 1.05}]"])
    job_states = reliability_simulate.prepare_job(loaded).states
    assert [job_states.representative(gpu) for gpu in range(4)] == [0, 0, 0, 0]
    states = simulate_job(loaded).summary["states"]
    assert sorted(tuple(state["slow_gpus"].items()) for state in states) == [(), (("0", 1.3),)]
    alone = simulate(scenario_from_text(ONE_GPU_HOSTS, "inline.yaml", [
        "faults.step.stragglers=[{fraction: 1.0, slowdown: 1.05}, {gpus: [3], slowdown: 1.3}]"])).summary
    throttled = next(state for state in states if state["slow_gpus"])
    assert throttled["step_time_s"] == pytest.approx(alone["step_time_s"], rel=1e-12)


def test_a_throttle_stands_in_for_the_gpus_the_scenario_slows_as_it_slows_its_own():
    """Own stragglers on GPUs 0 and 1 (x1.5): a throttle on GPU 1 is simulated on GPU 0, one on GPU 3 on GPU 2."""
    loaded = scenario_from_text(OWN_STRAGGLER, "inline.yaml",
                                ["faults.step.stragglers=[{gpus: [0, 1], slowdown: 1.5}]"])
    job_states = reliability_simulate.prepare_job(loaded).states
    assert [job_states.representative(gpu) for gpu in range(4)] == [0, 0, 2, 2]


def test_a_straggler_state_run_again_shares_its_plans_parsed_and_timed_with_the_first_run(monkeypatch):
    """A straggler state of the 64-GPU job simulated a second time (its cached step dropped): its plans are neither
    parsed into `Transfers`, nor timed by the analytic model, nor its private collectives run alone again (the
    state's plan cache keeps them for every run on it, `PlanCache.parsed`, `.analytic`, `.alone`), and its summary
    is the first run's."""
    from simulator.network import model
    from simulator.reliability.simulate import prepare_job

    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    job_states = prepare_job(scenario_from_text(JOB64, "job64.yaml")).states
    state = states.ClusterState(8, slow_gpus=((job_states.representative(20), 1.5),))
    first = job_states.entry(state)
    calls: list[str] = []
    run_alone, transfers, timed = simulation.run_alone, model.Transfers.__init__, model.analytic_seconds
    monkeypatch.setattr(simulation, "run_alone", lambda *args: calls.append("alone") or run_alone(*args))
    monkeypatch.setattr(model.Transfers, "__init__",
                        lambda self, *args: calls.append("parsed") or transfers(self, *args))
    monkeypatch.setattr(model, "analytic_seconds", lambda *args: calls.append("timed") or timed(*args))
    states._CACHE.clear()
    again = job_states.entry(state)
    assert calls == []
    assert again[1] == first[1]


@functools.cache
def _one_core_job(text: str) -> JobResult:
    """The job of ``text`` run on one core (its states simulated as met) with a fresh state cache, once per session:
    the tests compare their runs against it and none changes it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(states, "_CACHE", states.StateCache())
        patch.setattr(reliability_simulate, "cores", lambda workers=0: 1)
        return simulate_job(scenario_from_text(text, "job64.yaml"))


def _one_core_job_then_two_cores(monkeypatch, text: str = JOB64):
    """The 64-GPU job (or ``text``'s) run on one core (`_one_core_job`), then the machine set to two cores and the
    ahead path opened from 2 states, with a fresh state cache: the loaded job and the one-core result."""
    loaded = scenario_from_text(text, "job64.yaml")
    one_core = _one_core_job(text)
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: 2)
    monkeypatch.setattr(ahead, "cores", lambda workers=0: 2)
    monkeypatch.setattr(ahead, "AHEAD_MIN_STATES", 2)
    monkeypatch.setattr(ahead, "memory_room", lambda workers, each=0: workers)  # not the host's free memory
    return loaded, one_core


def _counting_states_ahead(monkeypatch) -> list[int]:
    """A list that hears how many states each call of `simulate_ahead` handed back from its workers."""
    forked: list[int] = []
    simulate_ahead = ahead.simulate_ahead
    monkeypatch.setattr(reliability_simulate, "simulate_ahead",
                        lambda *args: forked.append(simulate_ahead(*args)) or forked[-1])
    return forked


def test_straggler_states_simulated_ahead_in_forked_workers_give_the_one_core_job(monkeypatch):
    """The 64-GPU job's 9 straggler states foreseen by a first pass over its replications (`ahead.states_foreseen`,
    the healthy step standing in for each), the first simulated in the job's process and the other 8 in two
    forked workers: the job summary and event table equal those of the job run on one core, each state
    simulated as met."""
    loaded, one_core = _one_core_job_then_two_cores(monkeypatch)
    forked = _counting_states_ahead(monkeypatch)
    two_cores = simulate_job(loaded)
    assert forked == [8]
    assert two_cores.summary == one_core.summary
    assert two_cores.table.equals(one_core.table)


def test_the_heartbeat_goes_on_while_the_job_waits_on_its_workers_ahead(monkeypatch):
    """The fork hook ends the progress heartbeat before each worker's fork, and it started again only at the
    run's next report, which came when a worker handed back its first state: while the job waited on them no
    plain line came (a state's step is ~1.75 s on the 16,384-GPU job, but nothing bounds it). ahead.py starts
    it again once its workers are forked: alive at each wait on them."""
    from simulator.console.progress import Heartbeat

    loaded, _ = _one_core_job_then_two_cores(monkeypatch)
    heartbeat = Heartbeat(lambda: None, lambda: 60.0)
    alive: list[bool] = []
    wait = ahead.wait
    monkeypatch.setattr(ahead, "wait", lambda pipes: alive.append(heartbeat.alive) or wait(pipes))
    heartbeat.start()
    try:
        simulate_job(loaded)
    finally:
        heartbeat.stop()
    assert alive and all(alive)


def test_states_simulated_ahead_report_progress_and_survive_a_dead_worker(monkeypatch):
    """The 64-GPU job's 9 states ahead: ``states_progress`` hears 0, 1 (the one simulated in the job's process)
    and each worker's state up to 9/9; a worker that dies on one state (os._exit, as the kernel's OOM killer
    would end it) breaks the pool, and the job simulates what is left as it meets it, to the one-core job's
    summary and events."""
    import os

    loaded, one_core = _one_core_job_then_two_cores(monkeypatch)
    heard: list[tuple[int, int]] = []
    two_cores = simulate_job(loaded, states_progress=lambda done, total: heard.append((done, total)))
    assert heard[:2] == [(0, 9), (1, 9)] and heard[-1] == (9, 9) and len(heard) == 10
    assert two_cores.summary == one_core.summary

    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    entry, job_process, calls = states.StepStates.ahead_entry, os.getpid(), []

    def dies_in_a_worker(self, state):
        calls.append(state)
        if os.getpid() != job_process and len(calls) == 2:
            os._exit(9)
        return entry(self, state)

    monkeypatch.setattr(states.StepStates, "ahead_entry", dies_in_a_worker)
    forked = _counting_states_ahead(monkeypatch)
    warned: list[str] = []
    broken = simulate_job(loaded, workers_warning=warned.append)
    assert forked == [0]
    assert warned == ["a worker simulating cluster states ahead ended (exit status 9); the job simulates the 8 "
                      "states left as it meets them, on one core"]
    assert broken.summary == one_core.summary
    assert broken.table.equals(one_core.table)


def test_a_worker_killed_with_a_state_unread_in_its_pipe_leaves_the_rest_to_the_job(monkeypatch):
    """Each worker hands back its first state and dies (os._exit, as the OOM killer ends it) once the next one sits
    unread in its pipe: the job's end of the pipe reads ConnectionResetError, not EOFError, and the job still
    simulates the states left as it meets them, to the one-core job's summary and events."""
    from multiprocessing.connection import Connection

    loaded, one_core = _one_core_job_then_two_cores(monkeypatch)
    send, job_process = Connection.send, os.getpid()

    def dies_holding_the_next_state(self, obj):
        send(self, obj)
        if os.getpid() != job_process:
            self.poll(None)  # the job's process has sent the next state: it lies unread in the pipe
            os._exit(9)

    monkeypatch.setattr(Connection, "send", dies_holding_the_next_state)
    forked = _counting_states_ahead(monkeypatch)
    warned: list[str] = []
    broken = simulate_job(loaded, workers_warning=warned.append)
    assert forked in ([1], [2])  # the other worker's first state handed back before the reset is read, or not
    assert warned == [f"a worker simulating cluster states ahead ended (exit status 9); the job simulates the "
                      f"{8 - forked[0]} states left as it meets them, on one core"]
    assert broken.summary == one_core.summary
    assert broken.table.equals(one_core.table)


def test_a_fork_the_host_refuses_leaves_the_states_to_the_workers_forked_before_it(monkeypatch):
    """The second worker's fork refused (ENOMEM, as a host out of memory refuses it): the one worker forked
    simulates the 8 states ahead, to the one-core job's outputs; every fork refused, none goes ahead and the job
    simulates them as met."""
    import errno

    loaded, one_core = _one_core_job_then_two_cores(monkeypatch)
    fork, forks, allowed = os.fork, [], [1]

    def refused_after_the_allowed(*args):
        forks.append(None)
        if len(forks) > allowed[0]:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return fork(*args)

    monkeypatch.setattr(os, "fork", refused_after_the_allowed)
    forked = _counting_states_ahead(monkeypatch)
    warned: list[str] = []
    one_worker = simulate_job(loaded, workers_warning=warned.append)
    assert forked == [8] and len(forks) == 2
    assert warned == ["the host refused to fork a worker to simulate cluster states ahead (Cannot allocate "
                      "memory): 1 of 2 forked"]
    assert one_worker.summary == one_core.summary
    assert one_worker.table.equals(one_core.table)

    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    allowed[0] = 0
    no_worker = simulate_job(loaded, workers_warning=warned.append)
    assert forked == [8, 0]
    assert warned[1:] == ["the host refused to fork a worker to simulate cluster states ahead (Cannot allocate "
                          "memory): 0 of 2 forked; the job simulates them as it meets them"]
    assert no_worker.summary == one_core.summary
    assert no_worker.table.equals(one_core.table)


def test_the_pass_that_foresees_the_states_reports_its_replications_before_the_states_and_the_job(monkeypatch):
    """The 64-GPU job on two cores reports three phases in order: the first pass over its 2 replications
    (``foresight_progress``, 0 to 2), the 9 states simulated ahead (0 to 9), then its replications (0 to 2), so
    the bar moves through the first pass too (~15 s on the 16,384-GPU throttling job)."""
    loaded, _ = _one_core_job_then_two_cores(monkeypatch)
    heard: list[tuple[str, int, int]] = []

    def hearing(phase: str):
        return lambda done, total: heard.append((phase, done, total))

    simulate_job(loaded, progress=hearing("job"), states_progress=hearing("states"),
                 foresight_progress=hearing("foresight"))
    phases = [phase for index, (phase, _, _) in enumerate(heard) if index == 0 or heard[index - 1][0] != phase]
    assert phases == ["foresight", "states", "job"]
    assert [entry for entry in heard if entry[0] == "foresight"] == [("foresight", done, 2) for done in range(3)]
    assert heard[-1] == ("job", 2, 2)


def test_the_first_count_of_states_ahead_says_how_many_workers_share_the_rest(monkeypatch):
    """The 64-GPU job's 9 states ahead on two cores: the count of the one simulated in the job's process says
    that the 2 workers share the other 8, so that the bar's first time left is theirs (it took the 8 one after
    the other); the workers' counts say nothing of it (their rate so far is already shared)."""
    loaded, _ = _one_core_job_then_two_cores(monkeypatch)
    heard: list[tuple[int, int] | int] = []
    simulate_job(loaded, states_progress=lambda done, total: heard.append((done, total)),
                 states_sharing=heard.append)
    assert heard[:3] == [(0, 9), 2, (1, 9)] and heard[-1] == (9, 9) and heard.count(2) == 1


def test_the_count_of_states_ahead_takes_in_the_first_where_no_workers_follow(monkeypatch):
    """Where the free memory holds fewer than two workers, the job's process simulates the first state and the job the
    rest as it meets them: the count says 1/9 once the first is done, shared by no worker, not 0/9. A
    ``progress(done, total)`` of two arguments is heard (a third, the workers, is not passed to it)."""
    loaded, _ = _one_core_job_then_two_cores(monkeypatch)
    monkeypatch.setattr(ahead, "memory_room", lambda workers, each=0: 1)
    heard: list[tuple[int, int] | int] = []
    simulate_job(loaded, states_progress=lambda done, total: heard.append((done, total)),
                 states_sharing=heard.append)
    assert heard == [(0, 9), 1, (1, 9)]


def test_a_study_simulates_its_points_states_ahead_once_capped_by_its_workers(monkeypatch, tmp_path):
    """`trainsim study` runs its points one after another in its own process, so the first point's 9 straggler
    states go ahead in two workers (``states_progress`` up to 9/9) and the second point (another interval, the
    same steps) finds them all; ``workers=1`` forks none, to the same study."""
    from simulator.reliability.study import run_study

    scenario = tmp_path / "job64.yaml"
    scenario.write_text(JOB64)
    monkeypatch.setattr(ahead.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(ahead, "AHEAD_MIN_STATES", 2)
    monkeypatch.setattr(ahead, "memory_room", lambda workers: workers)
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    forked = _counting_states_ahead(monkeypatch)
    heard: list[tuple[int, int]] = []
    ahead_study = run_study(scenario, [], [1800.0, 3600.0], [1.0],
                            states_progress=lambda done, total: heard.append((done, total)))
    assert forked == [8, 0] and heard[-1] == (9, 9) and len(heard) == 10
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    assert run_study(scenario, [], [1800.0, 3600.0], [1.0], workers=1) == ahead_study
    assert forked == [8, 0]


def test_a_study_with_more_states_than_the_old_count_of_64_simulates_each_once(monkeypatch, tmp_path):
    """A 64-GPU job (PP 8) with 117 straggler states over 12 replications: its study's first point simulates them
    (116 in two workers) and the second finds every one cached."""
    from simulator.reliability.study import run_study

    scenario = tmp_path / "job64pp8.yaml"
    scenario.write_text(JOB64.replace("microbatches: 4", "microbatches: 8").replace("pp: 4, dp: 8", "pp: 8, dp: 4")
                        .replace("horizon: 2 d, replications: 2", "horizon: 7 d, replications: 12")
                        .replace("mtbf: 200 h", "mtbf: 30 h"))
    monkeypatch.setattr(ahead.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(ahead, "memory_room", lambda workers: workers)
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    forked = _counting_states_ahead(monkeypatch)
    run_study(scenario, [], [1800.0, 3600.0], [1.0])
    assert forked == [116, 0]
    assert len(states._CACHE) == 118 and states._CACHE.bytes < states.CACHE_BYTES  # the healthy step too


def test_the_state_cache_drops_the_least_recently_used_beyond_its_budget():
    """The cache counts its entries pickled and drops the least recently used past its budget, keeping the
    newest entry whatever its size."""
    cache = states.StateCache(budget=3000)
    entries = {name: (None, {"reason": name * 1000}) for name in "abcd"}
    for name in "abc":
        cache.store(("job", states.ClusterState(ord(name))), entries[name])
    assert len(cache) == 2 and ("job", states.ClusterState(ord("a"))) not in cache
    cache.used(("job", states.ClusterState(ord("b"))))
    cache.store(("job", states.ClusterState(ord("d"))), entries["d"])
    assert [key in cache for key in (("job", states.ClusterState(ord(name))) for name in "bcd")] == [True, False, True]
    assert cache.bytes <= 3000
    cache.store(("job", states.ClusterState(0)), (None, {"reason": "e" * 5000}))
    assert len(cache) == 1 and cache.bytes > 3000


def test_a_study_shows_its_points_again_once_a_points_states_ahead_are_done(monkeypatch, tmp_path):
    """Each point of a study on two cores first foresees its states (``foresight_progress``); the bar then counts
    points again (0 of 2, then 1 of 2 through the second point) while the point's replications run."""
    from simulator.reliability.study import run_study

    scenario = tmp_path / "job64.yaml"
    scenario.write_text(JOB64)
    monkeypatch.setattr(ahead.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    heard: list[tuple[str, int, int]] = []

    def hearing(phase: str):
        return lambda done, total: heard.append((phase, done, total))

    run_study(scenario, [], [1800.0, 3600.0], [1.0], progress=hearing("points"),
              foresight_progress=hearing("foresight"), states_progress=hearing("states"))
    changes = [entry for index, entry in enumerate(heard) if index == 0 or heard[index - 1][0] != entry[0]]
    assert changes == [("foresight", 0, 2), ("points", 0, 2), ("foresight", 0, 2), ("points", 1, 2)]
    assert heard[-1] == ("points", 2, 2)


INTERRUPTED_AHEAD = """
import os, signal, sys
from simulator.cli import console
from simulator.reliability import ahead, states

entry, job_process, (scenario, out, reached, presses) = states.StepStates.ahead_entry, os.getpid(), sys.argv[1:]


def interrupted_in_a_worker(self, state):
    if os.getpid() != job_process:
        try:  # only the first worker to get here says so (and, where it presses, presses Ctrl-C once)
            os.close(os.open(reached, os.O_CREAT | os.O_EXCL))
            if presses == "worker":
                os.killpg(0, signal.SIGINT)  # Ctrl-C at the terminal reaches the whole process group
            if presses == "killed":
                os.kill(job_process, signal.SIGKILL)  # the kernel's out-of-memory killer
                return entry(self, state)
        except FileExistsError:
            pass
        if presses != "killed":
            signal.pause()
    return entry(self, state)


states.StepStates.ahead_entry = interrupted_in_a_worker
ahead.AHEAD_MIN_STATES = 2
ahead.cores = lambda workers=0: 2
ahead.memory_room = lambda workers: workers  # a loaded host's free memory must not leave the job without workers
sys.argv = ["trainsim", "run", scenario, "--out", out, "--quiet"]
sys.exit(console())
"""


def _interrupted_ahead(tmp_path, presses: str) -> tuple[subprocess.Popen, Path, Path]:
    """`trainsim run` of the 64-GPU job in a process group of its own, its workers stopped on their first
    state: the process, its output folder and the file that says a worker got there; ``presses``: "worker"
    (the first worker there presses Ctrl-C), "test" (the caller does) or "killed" (the first worker there
    kills the job's process and the workers go on)."""
    scenario = tmp_path / "job64.yaml"
    scenario.write_text(JOB64)
    out, reached = tmp_path / "out", tmp_path / "reached"
    job = subprocess.Popen([sys.executable, "-c", INTERRUPTED_AHEAD, str(scenario), str(out), str(reached), presses],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           cwd=REPO)
    return job, out, reached


def _ended_quietly(job: subprocess.Popen, stderr: str, out: Path, word: str = "interrupted",
                   status: int = 130) -> None:
    """The interrupted job said ``word`` ('interrupted') and exited ``status`` (130), no process printed a
    traceback, none is left running, and the output folder holds nothing of the job."""
    assert job.returncode == status, stderr
    assert "Traceback" not in stderr and word in stderr
    assert not (out / "job_summary.json").exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(job.pid, 0)


def test_ctrl_c_while_states_are_simulated_ahead_stops_the_workers_without_a_traceback(tmp_path):
    """Ctrl-C (SIGINT to the process group) while the workers simulate the 64-GPU job's states: `trainsim run`
    says 'interrupted' and exits 130, no process prints a traceback, no worker is left running, and the output
    folder holds nothing of the job."""
    job, out, _ = _interrupted_ahead(tmp_path, "worker")
    try:
        _, stderr = job.communicate(timeout=300)
        _ended_quietly(job, stderr, out)
    finally:
        _killed_group(job.pid)


def test_sigterm_to_the_jobs_process_while_states_are_simulated_ahead_ends_its_workers(tmp_path):
    """SIGTERM to the job's process alone (`kill PID`, a scheduler's stop) while a worker simulates a state: it ends
    its workers, says 'terminated' and exits 143, with no traceback and no output."""
    job, out, reached = _interrupted_ahead(tmp_path, "test")
    deadline = time.monotonic() + 240
    while not reached.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reached.exists(), job.communicate()[1]
    job.send_signal(signal.SIGTERM)
    try:
        _, stderr = job.communicate(timeout=60)
        _ended_quietly(job, stderr, out, "terminated", 143)
    finally:
        _killed_group(job.pid)


def _killed_group(group: int) -> None:
    """End whatever of a test's process group is left, so that a failing test leaves no process behind."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_ctrl_c_pressed_again_and_again_while_the_job_stops_still_ends_it_quietly(tmp_path):
    """Ctrl-C pressed every 2 ms from the moment a worker is busy until the job's process is gone: the presses after
    the first land while it ends its workers and exits; it still says 'interrupted' once and exits 130, with no
    traceback, no worker left and no output."""
    job, out, reached = _interrupted_ahead(tmp_path, "test")
    deadline = time.monotonic() + 240
    while not reached.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reached.exists(), job.communicate()[1]
    presses = 0
    while job.poll() is None and time.monotonic() < deadline:
        os.killpg(job.pid, signal.SIGINT)
        presses += 1
        time.sleep(0.002)
    _, stderr = job.communicate(timeout=60)
    assert presses > 1
    _ended_quietly(job, stderr, out)


def test_workers_end_with_the_jobs_process_when_it_is_killed(tmp_path):
    """The job's process killed (SIGKILL, as the out-of-memory killer ends it) while its workers simulate states:
    each worker finds its pipe ended and exits within seconds, none is left behind."""
    job, _, _ = _interrupted_ahead(tmp_path, "killed")
    with job:  # closes the pipes, which the test does not read, once done
        assert job.wait(timeout=300) == -signal.SIGKILL  # not communicate: its pipes end only with the workers
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                os.killpg(job.pid, 0)
                time.sleep(0.05)
        except ProcessLookupError:
            return
        os.killpg(job.pid, signal.SIGKILL)
        pytest.fail("workers left running after the job's process was killed")


def test_workers_ahead_are_capped_by_the_option_and_by_the_free_memory(monkeypatch):
    """`trainsim run --workers N` caps the processes as a sweep's --workers does (0: every usable core, the
    affinity mask capped by the cgroup's CPU quota: tests/test_machine.py); the memory this process may still
    take over its resident size caps them again, never below 1, and a host that does not say leaves them be."""
    monkeypatch.setattr(ahead, "usable_cores", lambda: 6)
    assert (ahead.cores(), ahead.cores(2), ahead.cores(64)) == (6, 2, 6)
    monkeypatch.setattr(ahead, "_resident_bytes", lambda: 600 << 20)
    monkeypatch.setattr(ahead, "available_memory", lambda: 1900 << 20)
    assert ahead.memory_room(6) == 3
    monkeypatch.setattr(ahead, "available_memory", lambda: 100 << 20)
    assert ahead.memory_room(6) == 1
    monkeypatch.setattr(ahead, "available_memory", lambda: None)
    assert ahead.memory_room(6) == 6


def test_a_straggler_state_reroutes_the_scenarios_own_failed_link_on_its_own_topology():
    """With a link of the scenario's own down from the start (`faults.step.links`), each straggler state ran
    its fault hooks on the healthy run's topology, whose routes were already rerouted around that link: its
    summary counted 0 rerouted routes against `simulate()`'s 8 (each run reroutes its own topology). One three-hour
    replication throttles two GPUs (seed 1), which is all the check needs of the job."""
    text = JOB64.replace("analytic", "flow")
    link = ["faults.step.links=[{link: [leaf0.r0, spine0]}]"]
    loaded = scenario_from_text(text, "job.yaml", [*link, "run.horizon=3 h", "run.replications=1"])
    job = simulate_job(loaded)
    key = states.step_key(loaded)
    slowed = [state for state in job.summary["states"] if state["slow_gpus"]]
    assert slowed
    state = slowed[0]
    stragglers = ", ".join(f"{{gpus: [{gpu}], slowdown: {factor}}}" for gpu, factor in state["slow_gpus"].items())
    step = scenario_from_text(text, "job.yaml", [STEP_ONLY, *link, f"faults.step.stragglers=[{stragglers}]"])
    alone = simulate(step).summary
    slow = tuple((int(gpu), factor) for gpu, factor in state["slow_gpus"].items())
    summary = states._CACHE[key, states.ClusterState(8, slow_gpus=slow)][1]
    assert alone["faults"]["rerouted_routes"] > 0
    assert summary["faults"] == alone["faults"]


LEAF_SWITCH_JOB = RAILS + """run: {horizon: 2 d, replications: 2, seed: 1}
faults:
  components:
    leaf_switch: {mtbf: 20 d, repair: 2 h, repair_distribution: fixed}
"""
"""Two two-day replications on the eight-rail DGX cluster, its leaf switches down for a fixed two hours."""


def test_a_degraded_leaf_runs_at_the_step_time_of_its_links_down():
    """DGX hosts, eight rails: a leaf down leaves its rail's GPUs routing over NVLink through their peers'
    NICs (PXN). The job keeps training at that state's step time, which is `simulate()` of the scenario with
    the leaf's links down; its extra time is slow-step time of `leaf_switch`, and the time parts still add up
    to the horizon."""
    job = simulate_job(scenario_from_text(LEAF_SWITCH_JOB))
    summary = job.summary
    degraded = [state for state in summary["states"] if state["links_down"]]
    assert degraded and summary["interruptions"]["unexpected"]["mean"] == 0
    healthy = summary["states"][0]["step_time_s"]
    for state in degraded[:2]:
        links = ", ".join(f"{{link: [{a}, {b}]}}" for a, b in state["links_down"])
        direct = simulate(scenario_from_text(RAILS, "inline.yaml", [f"faults.step.links=[{links}]"])).summary
        assert state["step_time_s"] == pytest.approx(direct["step_time_s"], rel=1e-12)
        assert state["step_time_s"] > healthy * 1.2 and direct["faults"]["rerouted_routes"] > 0
    rows = job.events[job.events["kind"] == "degraded"]
    assert set(rows["cause"]) == {"leaf_switch"}
    assert (rows["end_s"] - rows["start_s"]).to_numpy() == pytest.approx(7200.0, rel=1e-12)
    assert summary["time_s"]["slow_steps_s"]["mean"] > 0
    assert summary["slow_steps_by_cause_s"]["leaf_switch"]["mean"] == pytest.approx(
        summary["time_s"]["slow_steps_s"]["mean"], rel=1e-9)
    total = sum(summary["time_s"][part]["mean"] for part in TIME_PARTS)
    assert total == pytest.approx(2 * 86400.0, rel=1e-9)


def test_a_job_says_which_degraded_state_each_replication_simulates(monkeypatch):
    """A leaf switch's state is simulated inline when a replication first meets it (minutes at 2,048 GPUs, on one core:
    on more they go ahead): the job's ``activity`` hears the replication, each state as its step starts (what is
    down and the CPU time its step is estimated to take; unnumbered: no count of states heard here indexes the
    summary's sorted states) and when it is done, then '' once the replications are."""
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: 1)
    told: list[str] = []
    job = simulate_job(scenario_from_text(LEAF_SWITCH_JOB), activity=told.append)
    heard = after_the_healthy_step(told)
    degraded = [state for state in job.summary["states"] if state["links_down"]]
    simulating = [line for line in heard if ": simulating" in line]
    assert len(simulating) == job.summary["link_states"]["steps"] > 0  # one per class of rotations
    first = degraded[0]
    start = f"replication 1/2: simulating a new cluster state ({len(first['links_down'])} link(s) down), an estimated "
    assert simulating[0].startswith(start) and simulating[0].endswith(" of CPU")  # the state's own estimate
    assert heard[0].startswith("merging the ") and heard[1:3] == ["", "replication 1/2"]  # the states foreseen
    assert heard[-1] == "" and "replication 2/2" in heard
    for line in simulating:
        assert heard[heard.index(line) + 1] == line.split(":")[0]


def test_a_degraded_state_leaves_nothing_of_its_topology_behind(monkeypatch):
    """The job's collector is paused and collects its youngest generation after each state, once the state's topology (a
    cycle with its rerouter) is not a local any more, so no link state's topology outlives it to the job's end
    (gigabytes over a long job). Between states as many are alive as before the first (the healthy one, and what
    earlier tests left in caches); on one core, where no state goes ahead."""
    import gc

    from simulator.topology.graph import Topology

    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: 1)
    alive: list[int] = []

    def heard(line: str) -> None:
        if line.startswith("replication") and ": simulating" not in line:
            alive.append(sum(isinstance(thing, Topology) for thing in gc.get_objects()))

    gc.collect()
    job = simulate_job(scenario_from_text(LEAF_SWITCH_JOB), activity=heard)
    assert sum(1 for state in job.summary["states"] if state["links_down"]) >= 2
    assert len(alive) > 2 and len(set(alive)) == 1


def test_degraded_states_simulated_ahead_in_forked_workers_give_the_one_core_job(monkeypatch):
    """A leaf switch's state is a step of its own, which a job may meet many times over (a 2,048-GPU job met 41
    in 2 replications). Its 4 degraded states go ahead as straggler states do (any that two workers can share:
    each takes far longer than forking), the first in the job's process and the other 3 in two forked workers,
    to the one-core job's summary and event table."""
    loaded, one_core = _one_core_job_then_two_cores(monkeypatch, LEAF_SWITCH_JOB)
    forked = _counting_states_ahead(monkeypatch)
    heard: list[tuple[int, int]] = []
    two_cores = simulate_job(loaded, states_progress=lambda done, total: heard.append((done, total)))
    degraded = [state for state in one_core.summary["states"] if state["links_down"]]
    assert len(degraded) == 4 and forked == [3]
    assert heard[:2] == [(0, 4), (1, 4)] and heard[-1] == (4, 4)
    assert two_cores.summary == one_core.summary
    assert two_cores.table.equals(one_core.table)


def test_a_job_says_which_state_it_simulates_before_its_workers_start(monkeypatch):
    """The first degraded state ahead is simulated in the job's process before the workers are forked (~223 s at 2,048
    GPUs): ``activity`` hears that state (what is down) before any replication (after the states foreseen are merged
    and sized), so the bar says more than '0/41 states' meanwhile, and '' once it is done."""
    loaded, _ = _one_core_job_then_two_cores(monkeypatch, LEAF_SWITCH_JOB)
    told: list[str] = []
    job = simulate_job(loaded, activity=told.append)
    heard = after_the_healthy_step(told)
    first = heard.index("replication 1/2")
    links = {len(state["links_down"]) for state in job.summary["states"] if state["links_down"]}
    assert len(links) == 1
    assert heard[:first] == [reliability_simulate.sizing_text(4), "",
                             f"first state, before the workers start ({links.pop()} link(s) down)", ""]


def test_degraded_states_go_ahead_only_as_far_as_their_peak_memory_fits(monkeypatch):
    """Each worker simulating degraded states comes to hold a whole unfolded step (5.2 GB a state of the
    2,048-GPU job), not the job's resident size alone: the pool is sized by the job process's peak once the first
    state ran there. With room for one such worker (the free memory twice the resident size, the peak above half
    of it), none is forked and the job simulates the rest as it meets them, to the same outputs."""
    memory_room = ahead.memory_room
    loaded, one_core = _one_core_job_then_two_cores(monkeypatch, LEAF_SWITCH_JOB)
    monkeypatch.setattr(ahead, "memory_room", memory_room)
    monkeypatch.setattr(ahead, "_resident_bytes", lambda: 1 << 30)
    monkeypatch.setattr(ahead, "_peak_bytes", lambda: 3 << 29)
    monkeypatch.setattr(ahead, "available_memory", lambda: 2 << 30)
    forked = _counting_states_ahead(monkeypatch)
    alone = simulate_job(loaded)
    assert forked == [0]
    assert alone.summary == one_core.summary


def test_degraded_states_ahead_are_sized_by_a_state_with_links_down_not_a_spine_state_met_first(monkeypatch):
    """The pool is sized by a state with links down, not by whichever degraded state the first pass met first: a
    spine down (the same tree with slower uplinks) folds and is small (136 MB against a leaf state's 488 MB on a
    128-GPU job), so a pool sized by it would undercount the workers handed leaf states. Foreseen a spine state,
    then leaf states, the job's process simulates a leaf state first, and the pool is counted at the peak after
    it."""
    from simulator.reliability.blast import cluster_units
    from simulator.reliability.simulate import prepare_job

    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    job_states = prepare_job(scenario_from_text(LEAF_SWITCH_JOB)).states
    units = cluster_units(job_states.topology)
    replicas = job_states.healthy.replicas
    spine = states.ClusterState(replicas, spines_down=1)
    leaves = [states.ClusterState(replicas, links_down=tuple(sorted(units.links("leaf_switch", index))))
              for index in range(3)]
    here: list[states.ClusterState] = []
    simulated_here, sized = ahead._simulated_here, []
    monkeypatch.setattr(ahead, "_simulated_here", lambda step_states, state: here.append(state)
                        or simulated_here(step_states, state))
    monkeypatch.setattr(ahead, "cores", lambda workers=0: 2)
    monkeypatch.setattr(ahead, "_peak_bytes", lambda: len(here) << 30, raising=False)
    monkeypatch.setattr(ahead, "memory_room", lambda workers, each=0: sized.append(each) or 1)
    ranks = ahead.LinkStateSizes(job_states.loaded, job_states.topology).ranks
    assert ahead.simulate_ahead(job_states, ahead.states_ahead(job_states, [spine, *leaves], ranks)) == 0
    assert here == [leaves[0]] and sized == [1 << 30]


def test_degraded_states_ahead_are_sized_by_the_state_with_links_down_near_the_most_hosts(monkeypatch):
    """Links down fold by the hosts near them (`fold_policy.link_fault_step`), so the state with links down that
    simulates the most ranks is the largest: two leaves down in the two leaf groups leave every host near (all 32
    ranks, unfolded) where one leaf leaves 24. The job's process simulates the two leaves' state first, so the pool
    is counted at its larger peak (with every state with links down ranked alike, one leaf would come first and the
    pool be counted at its smaller peak)."""
    from simulator.reliability.blast import cluster_units
    from simulator.reliability.simulate import prepare_job

    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    job_states = prepare_job(scenario_from_text(LEAF_SWITCH_JOB)).states
    units = cluster_units(job_states.topology)
    replicas = job_states.healthy.replicas
    groups = [units.blast["leaf_switch"][index][0] // 2 for index in range(units.count("leaf_switch"))]
    other = groups.index(1 - groups[0])
    one = states.ClusterState(replicas, links_down=tuple(sorted(units.links("leaf_switch", 0))))
    two = states.ClusterState(replicas, links_down=tuple(sorted({*units.links("leaf_switch", 0),
                                                                 *units.links("leaf_switch", other)})))
    here: list[states.ClusterState] = []
    simulated_here = ahead._simulated_here
    monkeypatch.setattr(ahead, "_simulated_here", lambda step_states, state: here.append(state)
                        or simulated_here(step_states, state))
    monkeypatch.setattr(ahead, "cores", lambda workers=0: 2)
    monkeypatch.setattr(ahead, "memory_room", lambda workers, each=0: 1)
    # another rail's leaf in the other group: the same rail's would be a rotation of `one`, the same step
    another = states.ClusterState(replicas, links_down=tuple(sorted(units.links("leaf_switch", other + 1))))
    assert groups[other + 1] == groups[other] and job_states.merged(another) != job_states.merged(one)
    ranks = ahead.LinkStateSizes(job_states.loaded, job_states.topology).ranks
    assert ahead.simulate_ahead(job_states, ahead.states_ahead(job_states, [one, another, two], ranks)) == 0
    assert here == [two]


def test_a_leaf_without_a_detour_takes_the_hosts_below_it():
    """One GPU and one NIC per host: a leaf down leaves its hosts without a route, so its failure interrupts
    the job and sends both hosts below it to repair (as `replace`)."""
    text = ONE_GPU_HOSTS + """run: {horizon: 2 d, replications: 3, seed: 2}
faults:
  components:
    leaf_switch: {mtbf: 10 d, repair: 2 h}
restart: {spares: 2}
"""
    job = simulate_job(scenario_from_text(text))
    failures = job.events[job.events["kind"] == "failure"]
    assert len(failures) > 0 and set(failures["cause"]) == {"leaf_switch"}
    assert set(failures["hosts"]) <= {2} and 2 in set(failures["hosts"])
    assert not (job.events["kind"] == "degraded").any()
    assert [state["links_down"] for state in job.summary["states"]] == [[]]


def test_a_shrunk_elastic_job_counts_its_slow_steps_under_elastic_shrink():
    """An elastic job that loses a host with no spare runs on fewer replicas until a restart grows it back;
    the slow-step time of those steps is the cause `elastic_shrink`'s."""
    text = ONE_GPU_HOSTS + """run: {horizon: 4 d, replications: 4, seed: 5}
faults:
  components:
    gpu: {mtbf: 20 d, repair: 6 h}
    nccl_watchdog: {mtbf: 10 d}
restart: {elastic: true}
"""
    summary = simulate_job(scenario_from_text(text, "inline.yaml", ["checkpoint.interval=30 min"])).summary
    assert any(state["replicas"] < 4 for state in summary["states"])
    assert set(summary["slow_steps_by_cause_s"]) == {"elastic_shrink"}
    assert summary["slow_steps_by_cause_s"]["elastic_shrink"]["mean"] == pytest.approx(
        summary["time_s"]["slow_steps_s"]["mean"], rel=1e-9)


@pytest.mark.parametrize("component, line, field", [
    ("{unit: leaf_switch, effect: straggle, slowdown: 1.2, mtbf: 9 d}", 12, "faults.components.x.effect"),
    ("{unit: gpu, effect: straggle, mtbf: 9 d}", 12, "faults.components.x"),
    ("{unit: gpu, slowdown: 1.2, mtbf: 9 d}", 12, "faults.components.x"),
    ("{unit: gpu, effect: straggle, slowdown: 0.5, mtbf: 9 d}", 12, "faults.components.x.slowdown"),
    ("{unit: gpu, effect: straggle, slowdown: 1e300, mtbf: 9 d, repair: 1 h}", 12, "faults.components.x.slowdown"),
    ("{unit: host, effect: degrade, mtbf: 9 d}", 12, "faults.components.x.effect"),
    # no repair: the state would last 0 s, the class changed nothing (the job ran at ETTR 100% without a word)
    ("{unit: gpu, effect: straggle, slowdown: 1.3, mtbf: 9 d}", 12, "faults.components.x"),
    ("{unit: spine_switch, effect: degrade, mtbf: 9 d, repair: 0 s}", 12, "faults.components.x.repair"),
])
def test_bad_state_classes_are_one_located_line(component, line, field, tmp_path, capsys):
    scenario = tmp_path / "job.yaml"
    scenario.write_text(ONE_GPU_HOSTS + f"run: {{horizon: 2 d}}\nfaults:\n  components:\n    x: {component}\n")
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert re.match(rf"^error: {re.escape(str(scenario))}:{line}: {re.escape(field)}: ", err), err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_a_straggler_refold_beyond_the_limits_is_refused_before_the_healthy_step(monkeypatch, tmp_path, capsys):
    """Each straggler state of the 64-GPU job simulates its step refolded by the slow GPU's classes (4 stages x 4
    classes: sharing or not its TP and DP coordinates), four times the fold's ops and flows: with the limit
    below that, `trainsim run` refuses the job in one line naming the class and the limit passed with its value,
    before the healthy step runs. A plain run's refusal names the limit it passed the same way. Both count the
    trees `auto` runs the DDP all-reduces as on the built cluster (they counted rings: ~4,960 ops + flows for the
    refold, where the built cluster's estimate says ~5,784)."""
    job = scenario_from_text(JOB64, "job64.yaml")
    folded = scale.estimate_scale(job.scenario, 64, scale.scenario_hosts(job), scale.capped_topology(job))
    assert folded is not None and folded.simulated_ranks == 4
    refold = scale.refold_estimate(folded, 64, 16)
    monkeypatch.setattr(scale, "MAX_EVENTS", refold.events - 1)
    monkeypatch.setattr(simulation, "run_step", None)
    scenario = tmp_path / "job.yaml"
    scenario.write_text(JOB64)
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists()
    assert err.startswith(f"error: {scenario}:12: faults.components.throttle: a throttle failure slows one GPU of a "
                          "pipeline stage, and each such state is simulated refolded by the slow GPU's classes (4 "
                          "stages x 4): 64 GPUs, 16 simulated ranks (folded)")
    assert err.endswith(f"; ops + flows ~{refold.events:,} over the limit of {refold.events - 1:,} (allowed: a "
                        "smaller cluster, or --force)")
    monkeypatch.setattr(scale, "MAX_EVENTS", folded.events - 1)
    assert main(["run", str(scenario), "--set", "run.horizon=null", "--out", str(out)]) == 2
    assert f"ops + flows ~{folded.events:,} over the limit of {folded.events - 1:,}" in capsys.readouterr().err
    # a host's straggle class: it slowed 'one GPU of a pipeline stage', which a host's failure does not
    scenario.write_text(JOB64.replace("unit: gpu", "unit: host"))
    monkeypatch.setattr(scale, "MAX_EVENTS", refold.events - 1)
    assert main(["run", str(scenario), "--out", str(out)]) == 2
    assert ("a throttle failure slows a host's GPUs (a state: one GPU of each pipeline stage they serve), and each "
            "such state is simulated refolded by the slow GPU's classes (4 stages x 4)") in capsys.readouterr().err


def test_straggler_states_run_unfolded_are_held_to_the_unfolded_estimate(monkeypatch):
    """TP 2, PP 8, DP 2 on 32 GPUs: the slow replica's classes are every rank, so each straggler state runs its
    step unfolded (`fold_policy.EVERY_RANK_A_CLASS`), and the job is held to the unfolded estimate, not to the
    linear refold of the fold (~4,000 ops + flows against 3,104): within the unfolded one it runs, below it
    it is refused as an unfolded step."""
    text = JOB64.replace("nodes: 8", "nodes: 4").replace("{tp: 2, pp: 4, dp: 8}", "{tp: 2, pp: 8, dp: 2}")
    job = scenario_from_text(text, "job.yaml")
    folded = scale.estimate_scale(job.scenario, 32, scale.scenario_hosts(job))
    unfolded = scale.estimate_scale(job.scenario.model_copy(update={"run": job.scenario.run.model_copy(
        update={"fold": False})}), 32, scale.scenario_hosts(job))
    assert folded is not None and unfolded is not None
    refold = scale.refold_estimate(folded, 32, 32)
    assert refold.events > unfolded.events
    monkeypatch.setattr(scale, "MAX_EVENTS", unfolded.events)
    assert simulate_job(job).summary["states"]
    monkeypatch.setattr(scale, "MAX_EVENTS", unfolded.events - 1)
    with pytest.raises(InputError, match="simulated as an unfolded step \\(stragglers in one pipeline replica: "
                       "one rank per class by the slow replica's coordinates is every rank\\)"):
        simulate_job(job)

SMALL_JOB = (DATA / "small-job.yaml").read_text().replace(
    "job_failure: {unit: host, effect: restart, mtbf: 3 h}",
    "throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 12 h, repair: 6 h}")


def test_a_straggler_on_a_single_host_runs_the_scenario_the_user_set():
    """One DGX H100 (no spine switches), TP 8, `--set training.seq_len=4096`: a throttled GPU (16 expected in
    the day) slows the job to `simulate()` of the scenario as set with GPU 0 slowed x1.5 (0.799 s against
    0.419 s at the file's 2,048). Every straggler was dropped here: an arrival that would leave no spine up
    was skipped, and with no spines at all that was every arrival (0 spines down >= 0 spines)."""
    as_set = ["training.seq_len=4096"]
    summary = simulate_job(scenario_from_text(SMALL_JOB, "job.yaml", as_set)).summary
    assert [state["slow_gpus"] for state in summary["states"]] == [{}, {"0": 1.5}]
    healthy, throttled = (state["step_time_s"] for state in summary["states"])
    slowed = ["faults.step.stragglers=[{gpus: [0], slowdown: 1.5}]"]
    assert healthy == simulate(scenario_from_text(SMALL_JOB, "job.yaml", [STEP_ONLY, *as_set])).summary["step_time_s"]
    assert throttled == simulate(scenario_from_text(SMALL_JOB, "job.yaml", [STEP_ONLY, *as_set, *slowed])).summary[
        "step_time_s"]
    from_file = simulate(scenario_from_text(SMALL_JOB, "job.yaml", [STEP_ONLY, *slowed])).summary["step_time_s"]
    assert throttled > 1.5 * from_file
    assert summary["slow_steps_by_cause_s"]["throttle"]["mean"] > 0


STATES = ONE_GPU_HOSTS + """run: {horizon: 4 d, replications: 2, seed: 5}
restart: {elastic: true}
faults:
  components:
    gpu: {mtbf: 20 d, repair: 6 h}
    spine_switch: {mtbf: 4 d, repair: 6 h}
    throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 8 d, repair: 6 h}
"""


@pytest.mark.parametrize("setting, written", [
    ("training.seq_len=2048", ("seq_len: 1024", "seq_len: 2048")),
    ("cluster.oversubscription=4", ("oversubscription: 2", "oversubscription: 4")),
    ("cluster.spines=4", ("spines: 2", "spines: 4")),
], ids=["training", "cluster-uplinks", "cluster-spines"])
def test_every_state_of_a_job_run_with_set_is_the_states_of_the_file_that_says_so(setting, written):
    """Spine-down, straggling and shrunk (elastic) states of a job run with a `--set` have the step times of
    the same job with the value written in its file, to the bit: the states are built from the scenario as
    set, not re-read from the file."""
    as_set = simulate_job(scenario_from_text(STATES, "job.yaml", [setting])).summary["states"]
    as_written = simulate_job(scenario_from_text(STATES.replace(*written), "job.yaml")).summary["states"]
    assert as_set == as_written
    assert {state["replicas"] for state in as_set} == {3, 4}
    assert any(state["spines_down"] for state in as_set) and any(state["slow_gpus"] for state in as_set)
    plain = simulate_job(scenario_from_text(STATES, "job.yaml")).summary["states"]
    assert [state["step_time_s"] for state in as_set] != [state["step_time_s"] for state in plain[:len(as_set)]]


SHRINKING = ONE_GPU_HOSTS.replace("vocab: 32000}", "vocab: 32000, moe: {experts: 8, top_k: 2}}") + """\
run: {horizon: 2 d, replications: 1, seed: 5}
restart: {elastic: true}
faults: {components: {gpu: {mtbf: 2 d, repair: 6 h}}}
"""
SPLIT_TP_GROUP = ("the elastic job shrunk to 3 replicas (3 hosts): a TP group spans 2 NVLink domains, where each of "
                  "the full job's stays inside one (allowed: a parallelism.order that keeps each TP group inside one "
                  "NVLink domain on fewer replicas; or restart.min_replicas above 3)")


@pytest.mark.parametrize("command", ["run", "study"])
def test_an_error_in_a_shrunk_state_names_the_set_that_wrote_the_value(command, tmp_path, capsys):
    """TP 2 keeps the full job's TP groups in their hosts and not those of the job shrunk to 3 replicas; the value comes
    from `--set`, and the error names the `--set parallelism.tp=2`, not the file's line (a shrunk state's scenario is
    rebuilt with the overrides). It is refused at load, before any step. (A shrunk three-tier cluster keeps the full
    fabric, so two pods that 2 hosts, one leaf group, cannot fill are no error.)"""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(DP_INNERMOST_DGX)
    args = ["mtbf"] if command == "study" else []
    assert main([command, *args, str(scenario), "--set", "parallelism.tp=2", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: command line: trainsim {command}: --set parallelism.tp=2: {SPLIT_TP_GROUP}\n")


def test_an_error_in_a_shrunk_state_of_a_sweep_point_names_its_axis(tmp_path):
    """The same point from a sweep's axes: its error names the `tp` axis's line, not the base's `parallelism`."""
    path = tmp_path / "sweep.yaml"
    base = "".join(f"  {line}\n" for line in DP_INNERMOST_DGX.strip().splitlines())
    path.write_text(f"base:\n{base}grid:\n  parallelism.tp: [2]\n")
    run_sweep(load_sweep(path), tmp_path / "out", SerialExecutor())
    frame = pd.read_parquet(tmp_path / "out" / "results.parquet")
    axis_line = 1 + len(base.splitlines()) + 2
    assert frame["error"][0] == f"{path}:{axis_line}: grid.parallelism.tp: value 2: {SPLIT_TP_GROUP}"


def test_two_pods_that_the_shrunk_hosts_cannot_fill_keep_the_full_fabric():
    """Two pods over 4 one-GPU hosts, two per leaf group: the job shrunk to 2 replicas keeps one leaf group, which a
    fabric rebuilt on 2 hosts could not split into pods. Cut from the full fabric, each group stays in its pod, and
    the job runs on every size."""
    text = SHRINKING.replace("oversubscription: 2}", "oversubscription: 2,\n          tiers: 3, pods: 2}")
    assert simulate_job(scenario_from_text(text, "job.yaml")).summary["replicas"]["sizes"] == [1, 2, 3, 4]


@pytest.mark.parametrize("settings, message", [
    (["restart.min_replicas=5"], "min_replicas 5 is above the layout's 4 replicas (allowed: 1 to 4)"),
    (["restart.elastic=false", "restart.min_replicas=2"],
     "min_replicas bounds an elastic job's shrinking (allowed: restart.elastic: true, or no min_replicas)"),
    (["restart.elastic=false", "restart.elastic_batch=keep_global"], "elastic_batch sets an elastic job's batch "
     "on fewer replicas (allowed: restart.elastic: true, or no elastic_batch)"),
    (["restart.elastic=false", "restart.regrow=on_repair"],
     "regrow says when an elastic job grows back (allowed: restart.elastic: true, or no regrow)"),
], ids=["above-dp", "not-elastic", "batch-not-elastic", "regrow-not-elastic"])
def test_an_elastic_setting_the_job_cannot_use_is_one_located_line(settings, message, tmp_path, capsys):
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SHRINKING)
    sets = [arg for setting in settings for arg in ("--set", setting)]
    assert main(["run", str(scenario), *sets, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim run: --set {settings[-1]}: {message}\n"


def test_a_kept_global_batch_shrinks_only_to_sizes_it_splits_over(tmp_path, capsys):
    """keep_global on DP 4: a global batch of 4 micro-batches splits over 4, 2 and 1 replicas, never 3 (4 / 3
    each), so the job runs on those sizes only (as Megatron-LM needs DP to divide it); 6 per replica (24 in all)
    splits over every size; keep_per_replica needs no split. One of 25,002 per replica (100,008 in all) splits
    over 3 and 2 but is 100,008 micro-batches on 1, above MAX_MICROBATCHES: refused at the `restart` line,
    naming the size, before any step."""
    text = SHRINKING.replace("restart: {elastic: true}", "restart: {elastic: true, elastic_batch: keep_global}")

    def sizes(microbatches, job=text):
        return simulate_job(scenario_from_text(job.replace("microbatches: 1", f"microbatches: {microbatches}"))
                            ).summary["replicas"]["sizes"]

    assert sizes(1) == [1, 2, 4]
    assert sizes(6) == [1, 2, 3, 4]
    assert sizes(1, SHRINKING) == [1, 2, 3, 4]
    scenario, error = run_refused(tmp_path, capsys, text.replace("microbatches: 1", "microbatches: 25002"))
    line = text.splitlines().index("restart: {elastic: true, elastic_batch: keep_global}") + 1
    assert error == (
        f"error: {scenario}:{line}: restart.elastic_batch: the elastic job shrunk to 1 replica keeps its global "
        "batch of 100008 sequences: 100008 micro-batches per replica (allowed: at most 100000; elastic_batch: "
        "keep_per_replica, or restart.min_replicas above 1)\n")


def run_refused(tmp_path: Path, capsys, text: str) -> tuple[Path, str]:
    """``text`` written as a job file and run: refused (exit 2, no output folder). The file and its error."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out)]) == 2
    assert not out.exists()
    return scenario, capsys.readouterr().err


def test_an_elastic_job_skips_the_sizes_whose_step_does_not_fit_in_memory(tmp_path, capsys):
    """ZeRO-3 shards each parameter's 18 B (bf16 weight, fp32 gradient, Adam's 12 B: the ZeRO paper's (2 + 2 + K) Psi /
    N with 4-byte gradients) over the N replicas, so a GPU of the job shrunk to N holds 18 Psi (1/N - 1/4) more than
    on 4; the activations (one micro-batch on every size) and the two gathered layers (with more than one replica)
    stay. 11.66e9 parameters: 58.0 GiB on 4, 74.3 GiB on 3, 106.8 GiB on 2 and 197.8 GiB on 1 (no gathered layers):
    an H100 holds 79.6 GiB, so the job runs on 3 and 4 and skips 1 and 2, not run out of memory with a warning at
    most. With 8 layers it fits on no smaller size: refused at `restart.elastic` (not `min_replicas`, which cannot
    help), naming 3 replicas' 95.3 GiB (15.28e9 parameters: 85.4 GiB of states, 6.75 GiB of gathered layers and 3.16
    GiB of activations), before any step."""
    job = simulate_job(scenario_from_text(ZERO3_JOB))
    replicas, healthy = job.summary["replicas"], job.step_summary
    params = resolve_model(scenario_from_text(ZERO3_JOB).scenario).num_params()
    states = sum(healthy["memory_breakdown_gib"][part] for part in ("params", "grads", "optimizer"))
    assert states == pytest.approx(18 * params / 4 / GIB, rel=1e-12)
    peak, buffers = healthy["peak_memory_gib"], healthy["memory_breakdown_gib"]["buffers"]
    assert replicas["sizes"] == [3, 4]
    assert replicas["out_of_memory_gib"] == pytest.approx(
        {"1": peak - buffers + 18 * params * (1 - 1 / 4) / GIB, "2": peak + 18 * params * (1 / 2 - 1 / 4) / GIB},
        rel=1e-12)
    assert peak + 18 * params * (1 / 3 - 1 / 4) / GIB < replicas["memory_capacity_gib"] == healthy[
        "memory_capacity_gib"]
    assert {state["replicas"] for state in job.summary["states"]} == {3, 4}  # one failure in the 2 days
    scenario = tmp_path / "job.yaml"
    scenario.write_text(ZERO3_JOB)
    assert main(["run", str(scenario), "--out", str(tmp_path / "printed")]) == 0
    assert ("(sizes 3, 4; 1, 2 skipped, out of memory: 106.8 GiB per GPU on 2, the GPU holds 79.6 GiB; "
            "keep_per_replica, regrow next_restart)") in " ".join(capsys.readouterr().out.split())
    assert main(["validate", str(scenario)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == ("  elastic sizes: 3, 4; 1, 2 skipped, out of memory: 106.8 GiB "
                                                        "per GPU on 2, the GPU holds 79.6 GiB")
    text = ZERO3_JOB.replace("layers: 6", "layers: 8").replace("restart: {elastic: true}",
                                                               "restart: {elastic: true, min_replicas: 2}")
    scenario, error = run_refused(tmp_path, capsys, text)
    line = text.splitlines().index("restart: {elastic: true, min_replicas: 2}") + 1
    assert error == (
        f"error: {scenario}:{line}: restart.elastic: the elastic job fits in GPU memory on none of its "
        "smaller sizes: shrunk to 3 replicas it needs 95.3 GiB per GPU, the GPU holds 79.6 GiB (allowed: less "
        "memory per GPU on fewer replicas (no single setting the checks take saves 1 GiB or more: a larger GPU, "
        "or more GPUs), or restart.elastic: false)\n")
    # the remedies are computed on the job shrunk to 3 replicas, the out-of-memory line's way: ZeRO-3 and a
    # micro-batch of 1 already, flash attention; a layout remedy would change the replicas, so none is tried (it
    # said 'recompute, more tp or pp, a smaller micro_batch' whatever the job did). recompute: full saves 2.5 GiB
    # there, too little: the job with it is refused the same way, so it is not offered (it was)


def test_an_elastic_jobs_sizes_print_runs_as_ranges():
    """The 405B job made elastic without spares runs on 22 to 128 replicas (21 and fewer are out of memory): its table
    and `validate` print runs of three or more consecutive sizes as 'first to last', pairs and gaps as they are, not
    all 107 sizes and the 21 skipped number by number."""
    from simulator.units import number_ranges

    assert number_ranges(range(22, 129)) == "22 to 128"
    assert number_ranges([1, 2]) == "1, 2"
    assert number_ranges([1, 2, 4, 6, 7, 8]) == "1, 2, 4, 6 to 8"
    assert number_ranges([]) == ""


def test_the_job_plan_carries_the_elastic_sizes_it_was_checked_with(monkeypatch):
    """The ZeRO-3 job above: its sizes are checked once (elastic_sizes), and the plan every replication reads
    carries them whole: 3 and 4 run, 1 and 2 skipped for memory against the H100's 79.6 GiB. job_summary.json's
    replica figures are read from that plan (job_summary was handed the sizes a second time, beside it)."""
    import simulator.reliability.simulate as job_simulation

    plans, checked = [], []
    process, check = job_simulation.JobProcess, job_simulation.elastic_sizes
    monkeypatch.setattr(job_simulation, "JobProcess", lambda plan, *rest: plans.append(plan) or process(plan, *rest))
    monkeypatch.setattr(job_simulation, "elastic_sizes", lambda *args: checked.append(check(*args)) or checked[-1])
    job = simulate_job(scenario_from_text(ZERO3_JOB))
    assert len(checked) == 1 and len(plans) == 1 and plans[0].sizes is checked[0]
    sizes = checked[0]
    assert sizes.sizes == (3, 4) and [size for size, _ in sizes.out_of_memory] == [1, 2]
    assert sizes.capacity_bytes / GIB == pytest.approx(79.6, abs=0.05)
    replicas = job.summary["replicas"]
    assert replicas["sizes"] == [3, 4] and replicas["out_of_memory_gib"] == sizes.out_of_memory_gib()


def test_an_elastic_job_whose_layout_is_out_of_memory_is_warned_as_a_plain_one(tmp_path, capsys):
    """With 12 layers (22.53e9 parameters) the ZeRO-3 job's own layout does not fit: 18 Psi / 4 = 94.4 GiB of states per
    GPU on 4 replicas, 105.8 GiB in all, against the H100's 79.6 GiB. The plain job runs with the out-of-memory
    warning a plain run gives; the elastic one gets the same verdict, and runs on 4 replicas only, its smaller sizes
    (more states per GPU) skipped. `validate --strict` refuses both at parallelism, as a plain run's layout."""
    text = ZERO3_JOB.replace("layers: 6", "layers: 12")
    params = resolve_model(scenario_from_text(text).scenario).num_params()
    assert 18 * params / 4 / GIB == pytest.approx(94.4, abs=0.05)
    warnings = {}
    for name, job in (("plain", text.replace("restart: {elastic: true}", "")), ("elastic", text)):
        scenario = tmp_path / f"{name}.yaml"
        scenario.write_text(job)
        assert main(["run", str(scenario), "--out", str(tmp_path / name), "--quiet"]) == 0
        warnings[name] = capsys.readouterr().err.replace(str(scenario), "SCENARIO")  # its interval warns at its line
        summary = orjson.loads((tmp_path / name / "job_summary.json").read_bytes())
        assert summary["replicas"]["sizes"] == [4]
        assert main(["validate", str(scenario), "--strict"]) == 2
        line = job.splitlines().index("parallelism: {dp: 4, zero: 3}") + 1
        assert f"{scenario}:{line}: parallelism: OUT OF MEMORY: 105.8 GiB needed" in capsys.readouterr().err
    plain, elastic = (warnings[name].split("warning: restarts waited")[0] for name in ("plain", "elastic"))
    assert plain == elastic  # the step's verdict; then each is told its restarts wait for hosts (8 GPUs fail)
    assert "warning: OUT OF MEMORY: 105.8 GiB needed" in " ".join(warnings["plain"].split())
    assert list(summary["replicas"]["out_of_memory_gib"]) == ["1", "2", "3"]


def test_an_elastic_moe_job_runs_on_the_sizes_ep_splits():
    """EP 2 on DP 4 splits 4 and 2 replicas' ranks, not 3 or 1: the job runs on those sizes only, not refused at load;
    EP 4 on DP 4 splits only 4 (the job waits for repaired hosts, as an inelastic one) and EP 2 with CP 2 every size.
    An inelastic EP 4 never shrinks."""
    def sizes(parallelism, text=SHRINKING):
        summary = simulate_job(scenario_from_text(text.replace("parallelism: {dp: 4}", parallelism))).summary
        return summary["replicas"]["sizes"], {state["replicas"] for state in summary["states"]}

    assert sizes("parallelism: {dp: 4, ep: 2}") == ([2, 4], {2, 4})
    assert sizes("parallelism: {dp: 4, ep: 4}") == ([4], {4})
    split = SHRINKING.replace("nodes: 4,", "nodes: 8,")
    assert sizes("parallelism: {dp: 4, cp: 2, ep: 2}", split)[0] == [1, 2, 3, 4]
    assert sizes("parallelism: {dp: 4, ep: 4}", SHRINKING.replace("restart: {elastic: true}", "")) == ([4], {4})


@pytest.mark.parametrize(("restart", "parallelism", "warning"), [
    ("restart: {elastic: true, min_replicas: 3, elastic_batch: keep_global}", "parallelism: {dp: 4}",
     "restart.min_replicas: min_replicas 3: keep_global's 4 micro-batches split whole over none of 3 replicas; the "
     "elastic job never shrinks below its 4 replicas: it runs as a job of fixed size (allowed: at most 2, the "
     "nearest size it would shrink to; or elastic_batch: keep_per_replica, with which it shrinks to 3 replicas)"),
    ("restart: {elastic: true}", "parallelism: {dp: 4, ep: 4}",
     "parallelism.ep: EP 4 divides the DP x CP ranks of none of 1 to 3 replicas; the elastic job never shrinks "
     "below its 4 replicas: it runs as a job of fixed size (allowed: an EP that divides a smaller size's DP x CP "
     "ranks, or restart.elastic: false)"),
], ids=["min-replicas-and-keep-global", "ep-4-on-dp-4"])
def test_an_elastic_job_left_no_smaller_size_is_warned_at_the_field_that_leaves_it_so(
        tmp_path, capsys, restart, parallelism, warning):
    """keep_global's 4 micro-batches on DP 4 split whole over 4, 2 and 1 replicas, and min_replicas 3 leaves only 4;
    EP 4 on DP 4 splits no smaller size's ranks. Either job runs on 4 replicas only, as a job of fixed size;
    `validate` and `run` both warn at the field that leaves it so, naming the nearest size that would shrink.
    min_replicas 2 shrinks: no warning."""
    text = SHRINKING.replace("restart: {elastic: true}", restart).replace("parallelism: {dp: 4}", parallelism)
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)
    line = next(number for number, row in enumerate(text.splitlines(), 1)
                if row.startswith(warning.split(".")[0] + ":"))
    for command in (["validate", str(scenario)], ["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]):
        assert main(command) == 0
        err = " ".join(capsys.readouterr().err.split())
        assert f"warning: {scenario}:{line}: {warning}" in err, command[0]
        assert err.count("never shrinks") == 1
    assert orjson.loads((tmp_path / "out" / "job_summary.json").read_bytes())["replicas"]["sizes"] == [4]
    scenario.write_text(text.replace("min_replicas: 3", "min_replicas: 2").replace("ep: 4", "ep: 2"))
    assert main(["validate", str(scenario)]) == 0
    assert "never shrinks" not in capsys.readouterr().err


def test_keep_global_leaves_a_smaller_size_wherever_keep_per_replica_does():
    """Why `fixed_size_warning` names `restart.min_replicas` or `parallelism.ep`, never `restart.elastic_batch`: any
    size below DP that EP allows from ``smallest`` up is a multiple of e = EP / gcd(EP, CP), so DP / e >= 2 and
    DP / p (p a prime of DP / e) is a smaller size EP allows and the kept DP x m micro-batches split over. Checked
    over DP 2 to 32, CP 1 to 4, every EP dividing DP x CP and m of 1, 2, 3, 5 or 8 micro-batches."""
    for dp in range(2, 33):
        for cp in range(1, 5):
            for ep in (ep for ep in range(1, dp * cp + 1) if dp * cp % ep == 0):
                for microbatches in (1, 2, 3, 5, 8):
                    kept = dp * microbatches
                    unbounded = allowed_sizes(dp, cp, ep, 1, kept)[:-1]
                    for smallest in range(1, dp):
                        if allowed_sizes(dp, cp, ep, smallest)[:-1]:
                            assert unbounded, (dp, cp, ep, microbatches, smallest)


def test_a_shrunk_job_drops_the_scenarios_step_faults_on_hosts_it_gave_up():
    """The scenario's own straggler on GPU 3 and link of host 3 are on the host a job shrunk to 3 replicas gave
    up: its shrunk state's step is `simulate()` of the 3-host cluster without them (to the bit), where the job
    ended with 'unknown GPU index 3 (allowed: 0 to 2)'. Its straggler on GPU 1, still in the job, is kept: the
    shrunk step is slower than the plain 3-host one."""
    faults = ["faults.step.stragglers=[{gpus: [1, 3], slowdown: 1.5}]",
              "faults.step.links=[{link: [h3/nic0, leaf1.r0], capacity: 0.5}]"]
    text = STATES.replace("    spine_switch: {mtbf: 4 d, repair: 6 h}\n", "").replace(
        "    throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 8 d, repair: 6 h}\n", "")
    states = {state["replicas"]: state for state in
              simulate_job(scenario_from_text(text, "job.yaml", faults)).summary["states"]}
    assert set(states) == {3, 4}
    three = ["cluster.nodes=3", "parallelism.dp=3", "faults.step.stragglers=[{gpus: [1], slowdown: 1.5}]"]
    assert states[3]["step_time_s"] == simulate(scenario_from_text(ONE_GPU_HOSTS, "job.yaml", three)).summary[
        "step_time_s"]
    assert states[3]["step_time_s"] > simulate(scenario_from_text(ONE_GPU_HOSTS, "job.yaml", three[:2])).summary[
        "step_time_s"]
    assert states[4]["step_time_s"] == simulate(scenario_from_text(ONE_GPU_HOSTS, "job.yaml", faults)).summary[
        "step_time_s"]


@pytest.mark.parametrize("policies", [[], ["--set", "restart.regrow=on_repair", "--set",
                                             "restart.elastic_batch=keep_global", "--set", "training.microbatches=3"]],
                         ids=["defaults", "regrow-on-repair-keep-global"])
def test_an_elastic_job_with_outages_writes_the_same_bytes_for_the_same_seed(tmp_path, policies):
    """Shrinks, waits below `min_replicas`, regrows (at the next restart, or on repair with restarts of its own,
    keeping the global batch) and both spines down (an outage) over 20 replications: the same seed writes the
    same job_events.parquet and job_summary.json, byte for byte; another seed does not."""
    text = ONE_GPU_HOSTS.replace("checkpoint: {interval: 1000 d}", "checkpoint: {interval: 20 min}") + """\
run: {horizon: 10 d, replications: 20, seed: 7}
faults:
  components:
    gpu: {mtbf: 8 d, repair: 1 d}
    spine_switch: {mtbf: 3 d, repair: 12 h}
    software: {mtbf: 10 d}
restart: {elastic: true, min_replicas: 2}
"""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)

    def written(name, *sets):
        out = tmp_path / name
        assert main(["run", str(scenario), "--quiet", "--out", str(out), *sets]) == 0
        return [(out / file).read_bytes() for file in ("job_events.parquet", "job_summary.json")]

    first = written("a", *policies)
    assert written("b", *policies) == first
    assert written("c", *policies, "--set", "run.seed=8")[0] != first[0]
    summary = orjson.loads(first[1])
    assert summary["replicas"]["shrinks"]["mean"] > 0 and summary["replicas"]["regrows"]["mean"] > 0
    assert (summary["replicas"]["regrow_restarts"]["mean"] > 0) == bool(policies)
    assert summary["interruptions"]["by_cause"]["spine_switch"]["mean"] > 0


def test_a_job_tells_the_time_of_its_states_with_links_down_before_simulating_any(monkeypatch):
    """A job tells the time of its states with links down once foreseen, before any state is simulated (the 16,384-GPU
    Llama 3 405B job with a leaf switch class foresees 19,663 states, the first of which takes 7-8 minutes): each
    state LINK_STATE_S_FIXED and its fold's ops + flows (`scale.classed_estimate` on its `LinkFaultRanks`) at
    LINK_STATE_S_PER_EVENT plus LINK_STATE_S_PER_EVENT_GPU for each GPU of its cluster, summed over the states
    `states_ahead` lists (here the 4 one-leaf states of the small leaf switch job, 24 of its 32 ranks each), the
    first in the job's process and the other 3 over 2 workers. Told from LONG_AHEAD_S on, which this job stays far
    below."""
    from simulator.engine.rank_classes import LinkFaultRanks
    from simulator.scale import classed_estimate
    from simulator.units import format_duration

    loaded, _ = _one_core_job_then_two_cores(monkeypatch, LEAF_SWITCH_JOB)
    heard: list[str] = []
    told_before: list[int] = []
    simulated_here = ahead._simulated_here
    monkeypatch.setattr(ahead, "_simulated_here", lambda step_states, state: told_before.append(len(heard))
                        or simulated_here(step_states, state))
    simulate_job(loaded, workers_warning=heard.append)
    assert heard == []
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "LONG_AHEAD_S", 0.0)
    job = simulate_job(loaded, workers_warning=heard.append)
    count = LinkFaultRanks(job_layout(loaded), scale.capped_topology(loaded))
    down = [state for state in job.summary["states"] if state["links_down"]]
    each = [ahead.LINK_STATE_S_FIXED + classed_estimate(loaded, 32, count([tuple(pair) for pair in state["links_down"]])
                                                         ).events
            * (ahead.LINK_STATE_S_PER_EVENT + 32 * ahead.LINK_STATE_S_PER_EVENT_GPU) for state in down]
    assert len(each) == 4 and len(set(each)) == 1
    assert len(heard) == 1 and told_before[-1] == 1
    assert heard[0] == (f"the 4 cluster states with links down foreseen take an estimated "
                        f"{format_duration(sum(each))} of CPU, {format_duration(each[0] + sum(each[1:]) / 2)} on 2 "
                        "cores, each folded by the hosts near its links down onto at most 24 ranks: fewer "
                        "run.replications, a shorter run.horizon, a rarer leaf_switch failure or effect: replace (the "
                        "job restarts without the unit), more cores (--workers) cut it")


def job_layout(loaded):
    """The layout of ``loaded``'s job on its cluster."""
    from simulator.workload.training import pipeline_depth, resolve_layout

    scenario = loaded.scenario
    return resolve_layout(scenario, scale.capped_topology(loaded).num_gpus, pipeline_depth(scenario))


def _refused_in_one_line(tmp_path: Path, capsys, text: str) -> tuple[Path, Path, str]:
    """`trainsim run` of the job ``text`` refused (exit 2) in one line on stderr with nothing written: the
    scenario's path, the output folder it did not write, and the line."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists()
    return scenario, out, err


def test_a_job_whose_states_with_links_down_take_past_the_limit_is_refused_unless_forced(tmp_path, capsys,
                                                                                         monkeypatch):
    """Past MAX_AHEAD_S (brought down to 0.01 s: the small leaf switch job's 4 states take ~0.03 s each by the
    estimate, more than it whatever the cores) the job is refused in one located line before any state is
    simulated, at the class (a replication's share alone is past it), with nothing written; --force runs it,
    telling the time."""
    monkeypatch.setattr(reliability_simulate, "MAX_AHEAD_S", 0.01)
    monkeypatch.setattr(states, "_CACHE", states.StateCache())  # none of its states known to the process yet
    scenario, out, err = _refused_in_one_line(tmp_path, capsys, LEAF_SWITCH_JOB)
    assert f"{scenario}:" in err and "faults.components.leaf_switch: the 4 cluster states with links down " in err
    assert ", over the limit of 10 ms" in err and "more cores (--workers); or pass --force" in err
    assert main(["run", str(scenario), "--quiet", "--force", "--out", str(out)]) == 0
    assert "warning: the 4 cluster states with links down foreseen take an estimated " in capsys.readouterr().err


LINK_CLASSES_JOB = LEAF_SWITCH_JOB.replace(
    "leaf_switch: {mtbf: 20 d, repair: 2 h, repair_distribution: fixed}",
    "nic: {effect: degrade, mtbf: 200 d, repair: 2 h}\n    leaf_switch: {mtbf: 4 d, repair: 12 h}")
"""The small leaf switch job with a NIC class first (a NIC down leaves its leaf's hosts near, as the leaf does:
24 of 32 ranks), and leaves down often enough for two to overlap (every host near, 32 ranks)."""


def test_a_job_is_sized_by_its_largest_foreseen_state_with_links_down(tmp_path, capsys, monkeypatch):
    """The up-front refusal sizes the largest foreseen state, not one unit down (most of the 16,384-GPU job's states
    have 2 to 7 leaves down). With the limit at one leaf's ~2,352 ops + flows the small job foresees states with two
    leaves down, every host near (its 32 ranks unfolded, ~3,136): refused once foreseen, before any state is
    simulated, naming the class with the most links in that state, not the NIC class listed first. The limit is the
    one-leaf state's estimate (its leaf's hosts near: 24 of the 32 ranks), which that state does not pass."""
    one_leaf = scale.classed_estimate(scenario_from_text(LINK_CLASSES_JOB), 32, 24)
    assert one_leaf is not None
    monkeypatch.setattr(scale, "MAX_EVENTS", one_leaf.events)
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    _, _, err = _refused_in_one_line(tmp_path, capsys, LINK_CLASSES_JOB)
    assert re.search(r"faults\.components\.leaf_switch: a leaf_switch failure degrades the cluster, and its "
                     r"largest state foreseen \(\d+ link\(s\) down\) is simulated unfolded \(links down: every "
                     r"class holds one rank .*\): 32 GPUs, 32 simulated ranks \(not folded\)", err), err
    assert f"over the limit of {one_leaf.events:,}" in err


ELASTIC_LEAF_JOB = RAILS + """run: {horizon: 4 d, replications: 2, seed: 1}
restart: {elastic: true}
faults:
  components:
    leaf_switch: {mtbf: 20 d, repair: 12 h}
    gpu: {mtbf: 40 d, repair: 24 h}
"""
"""The small leaf switch job, elastic, its GPUs failing often enough that it trains shrunk to 3 replicas most of
the time: 14 states with links down simulated over its 2 replications, 7 of them shrunk (trained in) and 7 on
all 4 replicas (the sub-states that split the shrunk ones' slow-step time between `leaf_switch` and
`elastic_shrink`, never trained in)."""
ELASTIC_LEAF_STATE_S = 0.739 / 14
"""The mean CPU seconds of those 14 states, timed in the job on one core (`StepStates._simulated`, 2026-12-06,
the shared 2-core machine at a load of ~4)."""


def _elastic_leaf_job(monkeypatch, text: str = ELASTIC_LEAF_JOB):
    """The elastic leaf job run on one core with its time up front told (LONG_AHEAD_S at 0): the job, the
    `TimeAhead` its up-front estimate gave, the states with links down it simulated, in order, and the states
    its replications trained in (each heard as it trained, by the job's slow-step split)."""
    from simulator.reliability.job import JobProcess

    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: 1)
    monkeypatch.setattr(reliability_simulate, "LONG_AHEAD_S", 0.0)
    told: list = []
    time_ahead = reliability_simulate.time_ahead
    monkeypatch.setattr(reliability_simulate, "time_ahead", lambda *args: told.append(time_ahead(*args)) or told[-1])
    simulated: list = []
    simulated_step = states.StepStates._simulated
    monkeypatch.setattr(states.StepStates, "_simulated", lambda self, state, *args: (
        simulated.append(state) if state is not None and state.links_down else None) or simulated_step(
        self, state, *args))
    trained: set = set()
    cause_shares = JobProcess._cause_shares
    monkeypatch.setattr(JobProcess, "_cause_shares", lambda self: trained.add(self.state) or cause_shares(self))
    job = simulate_job(scenario_from_text(text, "elastic.yaml"), workers_warning=lambda line: None)
    return job, told, simulated, trained


@functools.cache
def _elastic_leaf_job_once():
    """`_elastic_leaf_job` of ELASTIC_LEAF_JOB, nothing else patched, once per session: the three tests that read
    its job, estimates and states share it, and none changes them."""
    with pytest.MonkeyPatch.context() as patch:
        return _elastic_leaf_job(patch)


def test_the_time_up_front_counts_the_states_of_a_shrunk_elastic_job():
    """The estimate and the sizing of the states with links down count the states the job simulates, shrunk ones
    each on its own cluster, not only those on the job's full replica count (7 of this elastic job's 14): the 7
    shrunk states it trains in, then the 7 sub-states their splits ask, in a second round."""
    _, told, simulated, _ = _elastic_leaf_job_once()
    assert len(simulated) == len(set(simulated)) == 14
    assert [round_told.states for round_told in told] == [7, 7]
    assert sum(1 for state in simulated if state.replicas < 4) == 7


def test_the_time_up_front_of_a_small_job_is_near_its_states_measured_time():
    """The estimate, with its fixed cost per state (without it small states' estimates are 1.8-2.7 times low),
    lies within a factor of 1.6 of the count simulated times their measured mean (ELASTIC_LEAF_STATE_S)."""
    _, told, simulated, _ = _elastic_leaf_job_once()
    measured = len(simulated) * ELASTIC_LEAF_STATE_S
    assert measured / 1.6 < sum(round_told.cpu_s for round_told in told) < measured * 1.6


def test_link_states_count_only_the_states_the_job_trained_in():
    """job_summary.json's `link_states` counts as met only the 7 states with links down the job trained in, not
    the sub-states of the slow-step split (the 7 on all 4 replicas, which the shrunk job never trains in);
    `states` lists every state simulated, 14 with links down."""
    job, _, simulated, trained = _elastic_leaf_job_once()
    met = {state for state in trained if state.links_down}
    assert len(met) == 7 and met < set(simulated)
    assert job.summary["link_states"]["states"] == len(met)
    assert sum(1 for state in job.summary["states"] if state["links_down"]) == 14


RESTARTING_LEAF_JOB = RAILS + """run: {horizon: 2 d, replications: 2, seed: 1}
faults:
  components:
    leaf_switch: {effect: degrade, mtbf: 3 d, repair: 24 h}
    host: {mtbf: 5 d, repair: 12 h}
restart: {spares: 0}
"""
"""A job without spares whose leaves go down while it waits for a host back from repair."""


def test_link_states_count_the_states_a_job_only_restarted_in():
    """States met are those the job trained in or was in while it restarted (a leaf down while it waited for a host):
    `link_states` counts all 20 states with links down that `states` lists, the restart-only ones included (its one
    cause, the leaf class, asks no sub-state)."""
    summary = simulate_job(scenario_from_text(RESTARTING_LEAF_JOB, "job.yaml")).summary
    linked = sum(1 for state in summary["states"] if state["links_down"])
    assert summary["link_states"]["states"] == linked == 20


MIXED_ELASTIC_JOB = RAILS + """run: {horizon: 3 d, replications: 2, seed: 1}
restart: {elastic: true}
faults:
  components:
    leaf_switch: {effect: degrade, mtbf: 10 d, repair: 24 h}
    cable: {effect: degrade, mtbf: 10 d, repair: 24 h}
    spine_switch: {effect: degrade, mtbf: 10 d, repair: 24 h}
    gpu: {mtbf: 20 d, repair: 24 h}
"""
"""An elastic job with three degrading classes and failing GPUs: states with two causes or more, some no slower
than healthy."""


def test_states_ahead_are_the_states_trained_in_then_only_the_sub_states_their_split_needs(monkeypatch):
    """The states the job trains or restarts in are foreseen, told and simulated first, then the sub-states their steps
    ask (a state no slower than healthy asks none), not every sub-state of a forecast made on the healthy costs: each
    state simulated ahead is one the job uses (in `states`), and the time up front is told in two rounds, which
    together count every state simulated ahead with links down (one round of splits on the healthy costs would
    tell the mixed elastic job's 3 days 229 such states)."""
    loaded, one_core = _one_core_job_then_two_cores(monkeypatch, MIXED_ELASTIC_JOB)
    told: list = []
    time_ahead = reliability_simulate.time_ahead
    monkeypatch.setattr(reliability_simulate, "time_ahead", lambda *args: told.append(time_ahead(*args)) or told[-1])
    ahead_states: list = []
    simulate_ahead = ahead.simulate_ahead
    monkeypatch.setattr(reliability_simulate, "simulate_ahead", lambda job_states, kinds, *args: (
        ahead_states.extend(state for kind in kinds for state in kind)) or simulate_ahead(job_states, kinds, *args))
    job = simulate_job(loaded, workers_warning=lambda line: None,
                       merge_rotations=False)  # each state ahead is then one of `states`, not their representative
    listed = {(state["replicas"], state["spines_down"], tuple(map(tuple, state["links_down"])))
              for state in job.summary["states"]}
    assert len(told) == 2 and len(ahead_states) == len(set(ahead_states))
    assert {(state.replicas, state.spines_down, state.links_down) for state in ahead_states} <= listed
    assert told[0].states + told[1].states == sum(1 for state in ahead_states if state.links_down)
    assert job.summary == one_core.summary


def test_a_job_on_one_core_foresees_the_states_it_simulates_no_more(monkeypatch):
    """The second round of the forecast knows the first round's steps (`ahead.simulate_known`), so it asks only the
    sub-states the job's splits ask, not all the sub-states of each state with two causes (on the healthy costs, the
    mixed elastic job on one core would foresee and size 234 states and simulate 135): the states foreseen are the
    states simulated, none over (margin 0: a state foreseen on the healthy costs that the job's own costs steer clear
    of would be one over)."""
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: 1)
    foreseen: list = []
    states_ahead = reliability_simulate.states_ahead
    monkeypatch.setattr(reliability_simulate, "states_ahead", lambda job_states, asked, ranks: (
        foreseen.extend(asked) or states_ahead(job_states, asked, ranks)))
    simulated: list = []
    simulated_step = states.StepStates._simulated
    monkeypatch.setattr(states.StepStates, "_simulated", lambda self, state, *args: (
        simulated.append(state) or simulated_step(self, state, *args)))
    job = simulate_job(scenario_from_text(MIXED_ELASTIC_JOB, "job.yaml"), workers_warning=lambda line: None,
                       merge_rotations=False)  # each state simulated is then one foreseen, not a representative
    assert len(foreseen) == len(set(foreseen)) == len(simulated) - 1 == len(job.summary["states"]) - 1
    assert set(foreseen) == set(simulated) - {None}  # None: the healthy step


def test_a_refused_sub_state_splits_its_state_evenly_with_a_warning(monkeypatch):
    """A sub-state the job cannot simulate (here each on all 4 replicas with links down, refused as a state past
    the scale limits would be) ended the whole job, though the job never trains in it. The states asking for it
    split their slow-step time evenly between their causes, and the job warns of it."""
    entry = states.StepStates.entry

    def refused(self, state):
        if state.links_down and state.replicas == 4:
            raise ScenarioError("too large to simulate", field="faults.components.leaf_switch")
        return entry(self, state)

    monkeypatch.setattr(states.StepStates, "entry", refused)
    job, _, _, _ = _elastic_leaf_job(monkeypatch)
    warning = [line for line in job.warnings if "split evenly" in line]
    assert warning == [job.split_evenly]  # printed after the run, as the other late warnings
    assert warning[0].startswith("the slow-step time of 7 cluster states is split evenly ")
    assert "too large to simulate" in warning[0]
    by_cause = job.summary["slow_steps_by_cause_s"]
    assert set(by_cause) == {"elastic_shrink", "leaf_switch"}


def test_a_sub_state_past_the_limits_up_front_splits_its_state_evenly_not_refuse_the_job(monkeypatch):
    """Only the states the job trains or restarts in are sized and refused up front (here none on all 4 replicas), not
    the sub-states among the states foreseen, which would refuse the whole job (unless --force) where the even split
    applies: a sub-state refused when met splits its state evenly."""
    refuse_folded, entry = reliability_simulate._refuse_folded_link_state, states.StepStates.entry
    too_large = ScenarioError("too large to simulate", field="faults.components.leaf_switch")

    def sized_up_front(loaded, sized, topology, world, klass, ranks, folded, which):
        if world == 32 and "foreseen" in which:
            raise too_large
        refuse_folded(loaded, sized, topology, world, klass, ranks, folded, which)

    def simulated(self, state):
        if state.links_down and state.replicas == 4:
            raise too_large
        return entry(self, state)

    monkeypatch.setattr(reliability_simulate, "_refuse_folded_link_state", sized_up_front)
    monkeypatch.setattr(states.StepStates, "entry", simulated)
    job, _, _, _ = _elastic_leaf_job(monkeypatch)
    assert job.split_evenly is not None and job.split_evenly.startswith("the slow-step time of 7 cluster states")


def test_a_states_size_up_front_is_built_on_the_scenario_its_step_runs():
    """`LinkStateSizes` and `StepStates` build a shrunk job's scenario alike (`states.state_scenario`), with the
    oversubscription of its spines down and the scenario's step faults outside the shrunk cluster dropped: a shrunk
    state with a spine down is sized on its step's cluster and faults."""
    loaded = scenario_from_text(STATES, "job.yaml", ["faults.step.stragglers=[{gpus: [3], slowdown: 1.2}]"])
    prepared = reliability_simulate.prepare_job(loaded)
    state = states.ClusterState(3, spines_down=1, links_down=(("h0/nic0", "leaf0.r0"),))
    sized = prepared.link_sizes.size(state)
    stepped, topology = prepared.states._scenario_of(states.ClusterState(3, spines_down=1))
    assert sized.loaded.scenario == stepped.scenario
    assert sized.topology.params["oversubscription"] == topology.params["oversubscription"] == 4
    assert sized.loaded.scenario.faults.step.stragglers[0].gpus == () and sized.topology.num_gpus == 3


def _on_cores(monkeypatch, count: int) -> None:
    """The machine set to ``count`` cores, each worker ahead fitting in the free memory, and a fresh state cache."""
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: count)
    monkeypatch.setattr(ahead, "cores", lambda workers=0: count)
    monkeypatch.setattr(ahead, "memory_room", lambda workers, each=0: workers)
    monkeypatch.setattr(states, "_CACHE", states.StateCache())


def _simulations_counted(monkeypatch, log: Path) -> Callable[[], Counter[str]]:
    """How many times each state is simulated by `StepStates._simulated`, the one function that simulates one, in
    the job's process and in its workers alike (each run appends its state to ``log``)."""
    simulated = states.StepStates._simulated

    def counted(self, state, *args):
        with log.open("a") as out:
            out.write(f"{state!r}\n")
        return simulated(self, state, *args)

    monkeypatch.setattr(states.StepStates, "_simulated", counted)
    return lambda: Counter(log.read_text().splitlines())


@pytest.mark.parametrize("cores", [1, 2])
def test_each_state_is_simulated_once_however_small_the_state_cache(monkeypatch, tmp_path, cores):
    """The elastic leaf job's 16 states under a state cache of 20 KB (about 6 of their entries): the states
    simulated ahead went into the cache (the second round's forecast moved the workers' there, and the first
    round's simulated in the job's process went there at once), which dropped them before the job met them, so it
    simulated them again: 24 simulations of 16 states, on one core or two. Kept for the job's life, each
    is simulated once, to the outputs of a cache that holds them all."""
    _on_cores(monkeypatch, cores)
    loaded = scenario_from_text(ELASTIC_LEAF_JOB, "job.yaml")
    whole = simulate_job(loaded)
    monkeypatch.setattr(states, "_CACHE", states.StateCache(budget=20_000))
    simulations = _simulations_counted(monkeypatch, tmp_path / "simulated.log")
    small = simulate_job(loaded)
    assert len(states._CACHE) < 16  # it dropped some
    assert set(simulations().values()) == {1} and len(simulations()) == len(small.summary["states"]) == 16
    assert small.summary == whole.summary
    assert small.table.equals(whole.table)


@pytest.mark.parametrize("cores, where", [(1, "anywhere"), (2, "anywhere"), (2, "in a worker")])
def test_a_state_refused_ahead_is_simulated_once_and_its_refusal_raised_where_met(monkeypatch, tmp_path, cores,
                                                                                   where):
    """The elastic leaf job's shrunk states with links down (the states it trains in) refused, as a state past
    the scale limits is: each was simulated ahead (the first in the job's process, the rest, on two cores, in
    the workers), again before the second round and again where the job met it, which raised the refusal; one
    refused in a worker alone was simulated again in the job's process, to no refusal. A refusal is a result:
    each state is simulated once, and the job raises the refusal where it meets the first (here, its first
    replication)."""
    _on_cores(monkeypatch, cores)
    simulated, job_process = states.StepStates._simulated, os.getpid()

    def refused(self, state, *args):
        if (state is not None and state.links_down and state.replicas == 3
                and (where == "anywhere" or os.getpid() != job_process)):
            raise ScenarioError("too large to simulate", field="faults.components.leaf_switch")
        return simulated(self, state, *args)

    monkeypatch.setattr(states.StepStates, "_simulated", refused)
    simulations = _simulations_counted(monkeypatch, tmp_path / "simulated.log")
    made = _states_made(monkeypatch)
    with pytest.raises(ScenarioError, match="too large to simulate"):
        simulate_job(scenario_from_text(ELASTIC_LEAF_JOB, "job.yaml"))
    assert set(simulations().values()) == {1}
    assert sum(1 for state in simulations() if "links_down=((" in state and "replicas=3" in state) == 7
    job_states = made[-1]
    refused_state = next(iter(job_states._refused))
    raised = []
    for _ in range(2):
        with pytest.raises(ScenarioError, match="too large to simulate") as caught:
            job_states.entry(refused_state)
        raised.append(caught.value)
    assert raised[0] is not raised[1]  # a fresh error each time: one kept and raised again kept each raise's frames


def _states_made(monkeypatch) -> list:
    """The `StepStates` made from this call on, as they are made."""
    made: list = []
    init = states.StepStates.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(states.StepStates, "__init__", recorded)
    return made


def test_a_state_simulated_ahead_is_kept_as_its_step_alone(monkeypatch):
    """The states a job keeps simulated ahead until it meets them held each its whole summary (~24 KB, 4,000
    straggler states ~90 MB), which the job never reads: it keeps the step (~0.2 KB pickled), the summary left
    to the bounded state cache."""
    _on_cores(monkeypatch, 2)
    made = _states_made(monkeypatch)
    simulate_job(scenario_from_text(ELASTIC_LEAF_JOB, "job.yaml"))
    kept = made[-1]._ahead
    assert len(kept) >= 8
    assert all(len(pickle.dumps(step)) < 1_000 for step in kept.values())


def test_the_rounds_ahead_count_each_round_from_its_start(monkeypatch):
    """On two cores the elastic leaf job's first round counted the workers' 7/7 states, then 0/1 to 1/1 for the
    one left to the job's process; and its second round's name came with the first round's last count (plain
    line: '8/8 states (100%), round 2 of 2: ...'). The first round counts up to its whole, and the second begins
    at a count of none."""
    _on_cores(monkeypatch, 2)
    heard: list = []
    simulate_job(scenario_from_text(ELASTIC_LEAF_JOB, "job.yaml"), activity=heard.append,
                 states_progress=lambda done, total: heard.append(("states", done, total)),
                 foresight_progress=lambda done, total: heard.append(("foreseen", done, total)))
    second = heard.index(reliability_simulate.round_text(2))
    counts = [entry for entry in heard[:second] if isinstance(entry, tuple)]
    first_round = [entry[1:] for entry in counts if entry[0] == "states"]
    assert first_round and all(later[0] >= earlier[0] for earlier, later in zip(first_round, first_round[1:]))
    assert counts[-1] == ("foreseen", 0, 2)


def test_a_job_names_its_rounds_ahead_and_counts_the_states_it_simulates_before_its_replications(monkeypatch):
    """On one core the elastic leaf job simulates the 8 states of its first round (those it trains or restarts in)
    before its replications, so that its second round's forecast knows their steps: each line its activity hears in a
    round names the round (the two forecasts' replications are told apart), and ``states_progress`` counts those
    states up to as many as it simulates, not a bar sitting at the second's 2/2 replications."""
    _on_cores(monkeypatch, 1)
    heard: list = []
    simulated = states.StepStates._simulated
    monkeypatch.setattr(states.StepStates, "_simulated", lambda self, state, *args: (
        heard.append(("simulated", state)) or simulated(self, state, *args)))
    simulate_job(scenario_from_text(ELASTIC_LEAF_JOB, "job.yaml"), activity=heard.append,
                 states_progress=lambda done, total: heard.append(("counted", done, total)))
    heard = after_the_healthy_step(heard)
    before = heard[heard.index(("simulated", None)) + 1:heard.index("replication 1/2")]
    lines = [entry for entry in before if isinstance(entry, str)]
    first, second = reliability_simulate.round_text(1), reliability_simulate.round_text(2)
    assert lines[0] == first and second in lines and lines[-1] == ""
    switch = lines.index(second)
    assert all(line.startswith(first) for line in lines[:switch])
    assert all(line.startswith(second) for line in lines[switch:-1])
    counted = [entry[1:] for entry in before if isinstance(entry, tuple) and entry[0] == "counted"]
    simulated_ahead = sum(1 for entry in before if isinstance(entry, tuple) and entry[0] == "simulated")
    assert simulated_ahead == 8 and counted == [(done, 8) for done in range(9)]


UNFOLDED_STRAGGLER_JOB = (JOB64.replace("nodes: 8", "nodes: 4")
                          .replace("{tp: 2, pp: 4, dp: 8}", "{tp: 2, pp: 8, dp: 2}")
                          .replace("microbatches: 4", "microbatches: 8"))
"""TP 2, PP 8, DP 2 on 32 GPUs, 8 micro-batches (one a stage, so that no warning of a pipeline that cannot fill
joins its refusal's line): the slow replica's classes are every rank, so each straggler state runs unfolded."""


def test_a_job_says_the_estimated_cpu_time_of_each_straggler_state(monkeypatch):
    """A straggler state's step is announced as a state with links down is, with its estimated CPU time
    (`ahead.straggler_state_s` of `scale.classed_estimate` on the ranks it simulates: here all 32, unfolded), as the
    replication meets it; and told up front, once foreseen (on one core too, STRAGGLER_FORESIGHT_S brought down to
    0), how many there are, their time and how each is simulated. Folded by the slow GPU's classes on JOB64 (4
    stages x 4)."""
    from simulator.scale import classed_estimate
    from simulator.units import format_duration

    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "_STRAGGLER_FOLDS", {})
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: 1)
    monkeypatch.setattr(ahead, "cores", lambda workers=0: 1)
    monkeypatch.setattr(reliability_simulate, "STRAGGLER_FORESIGHT_S", 0.0)
    monkeypatch.setattr(reliability_simulate, "LONG_AHEAD_S", 0.0)
    loaded = scenario_from_text(UNFOLDED_STRAGGLER_JOB, "job.yaml")
    heard: list[str] = []
    warned: list[str] = []
    job = simulate_job(loaded, activity=heard.append, workers_warning=warned.append)
    each = ahead.straggler_state_s(classed_estimate(loaded, 32, 32, scale.capped_topology(loaded)), folded=False)
    simulating = [line for line in heard if ": simulating" in line]
    slow = [state for state in job.summary["states"] if state["slow_gpus"]]
    assert len(simulating) == len(slow) > 1
    assert all(line.endswith(f"straggling GPU(s)), an estimated {format_duration(each)} of CPU")
               for line in simulating)
    assert warned == [f"the {len(slow)} cluster states with straggling GPUs foreseen take an estimated "
                      f"{format_duration(each * len(slow))} of CPU on one core, each unfolded onto 32 ranks "
                      "(stragglers in one pipeline replica: one rank per class by the slow replica's coordinates is "
                      "every rank): fewer run.replications, a shorter run.horizon, a rarer throttle failure, more "
                      "cores (--workers) cut it"]
    folded = scenario_from_text(JOB64, "job64.yaml")
    warned.clear()
    heard.clear()
    slow = [state for state in simulate_job(folded, activity=heard.append,
                                            workers_warning=warned.append).summary["states"] if state["slow_gpus"]]
    estimate = classed_estimate(folded, 64, 16, scale.capped_topology(folded))
    each = ahead.straggler_state_s(estimate, folded=True)
    first = ahead.straggler_state_s(estimate, folded=True, first=True)
    assert each < first and each < ahead.link_state_s(estimate)  # a state sharing the job's fold costs less
    told = [line.rsplit(", an estimated ", 1)[1] for line in heard if ": simulating" in line]
    assert told == [f"{format_duration(first)} of CPU"] + [f"{format_duration(each)} of CPU"] * (len(slow) - 1)
    assert warned == [f"the {len(slow)} cluster states with straggling GPUs foreseen take an estimated "
                      f"{format_duration(first + each * (len(slow) - 1))} of CPU on one core, each folded by the "
                      "slow GPU's classes "
                      "onto 16 ranks: fewer run.replications, a shorter run.horizon, a rarer throttle failure, more "
                      "cores (--workers) cut it"]


def test_a_folded_straggler_state_is_estimated_a_fixed_cost_and_a_rate_near_its_measured_times():
    """A folded straggler state's estimate is FOLDED_STRAGGLER_S_FIXED plus FOLDED_STRAGGLER_S_PER_EVENT an op +
    flow, the first of a job FOLDED_STRAGGLER_FOLD_S_PER_EVENT more for the fold it builds; and it lies within
    1.35 times of the median CPU times measured one state at a time (analytic model, a 1.3 slowdown): 1.0 s after
    the first (1.4 s more for the first) on the 2,048-GPU Llama 3 70B job's 83,524 ops + flows, 3.0 s (7.2 s
    more) on the 16,384-GPU Llama 3 405B job's 259,401."""
    from simulator.scale import ScaleEstimate

    def estimate(events: int) -> ScaleEstimate:
        return ScaleEstimate(gpus=2048, simulated_ranks=16, ops=events, flows=0, memory_bytes=0.0, folded=True)

    for events, later_s, fold_s in ((83_524, 1.0, 1.4), (259_401, 3.0, 7.2)):
        each = ahead.straggler_state_s(estimate(events), folded=True)
        first = ahead.straggler_state_s(estimate(events), folded=True, first=True)
        assert each == pytest.approx(ahead.FOLDED_STRAGGLER_S_FIXED + events * ahead.FOLDED_STRAGGLER_S_PER_EVENT)
        assert first - each == pytest.approx(events * ahead.FOLDED_STRAGGLER_FOLD_S_PER_EVENT)
        assert 1 / 1.35 < each / later_s < 1.35 and 1 / 1.35 < (first - each) / fold_s < 1.35


def test_a_straggler_state_keeping_every_mirror_is_estimated_by_its_ops_and_flows_near_its_measured_times():
    """A folded straggler state that keeps every mirror (its slow replica's traffic shares links with the others')
    is estimated at FOLDED_STRAGGLER_S_FIXED, EVERY_MIRROR_S_PER_OP an op and EVERY_MIRROR_S_PER_FLOW a flow, the
    first of a job EVERY_MIRROR_FOLD_S_PER_OP more an op; on the ops and flows those states ran it lies within 1.05
    times of the median CPU times measured one state at a time (flow model, a 1.3 slowdown), and the first's extra
    within 1.6 times: the 2,048-GPU Llama 3 70B job (54,268 ops, 384,800 flows) 1.80 s after the first (0.87-1.2 s
    more for the first), cut to 32 hosts 0.70 s (0.60 s more), to 32 hosts and 40 layers 0.38 s (0.37 s more), to
    8 hosts 0.65 s (0.52 s more). The rate of the analytic model's folds (an op + flow alike, 11.4 us) put the
    2,048-GPU job's states at 5.1 s."""
    from simulator.scale import ScaleEstimate

    for ops, flows, later_s, fold_s in ((54_268, 384_800, 1.80, 1.03), (54_268, 118_592, 0.70, 0.60),
                                        (27_548, 60_992, 0.38, 0.37), (54_268, 106_856, 0.65, 0.52)):
        estimate = ScaleEstimate(gpus=2048, simulated_ranks=16, ops=ops, flows=flows, memory_bytes=0.0, folded=True)
        each = ahead.straggler_state_s(estimate, folded=True, every_mirror=True)
        first = ahead.straggler_state_s(estimate, folded=True, first=True, every_mirror=True)
        assert each == pytest.approx(ahead.FOLDED_STRAGGLER_S_FIXED + ops * ahead.EVERY_MIRROR_S_PER_OP
                                     + flows * ahead.EVERY_MIRROR_S_PER_FLOW)
        assert first - each == pytest.approx(ops * ahead.EVERY_MIRROR_FOLD_S_PER_OP)
        assert 1 / 1.05 < each / later_s < 1.05 and 1 / 1.6 < (first - each) / fold_s < 1.6


def test_a_job_announces_its_every_mirror_straggler_states_at_the_every_mirror_rates(monkeypatch):
    """A job whose slow replica's traffic shares links with the others' (pipeline sends and DP rings on the rails'
    NICs) announces each straggler state at `straggler_state_s` of its every-mirror refold with ``every_mirror``
    (ops and flows apart), not at the one op + flow rate of the folds that prune mirrors."""
    from simulator.units import format_duration

    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    monkeypatch.setattr(reliability_simulate, "_STRAGGLER_FOLDS", {})
    job, folded = throttled_rails_job(PIPELINED)
    refold = scale.every_mirror_refold(job, 32, 4 * folded.simulated_ranks)
    assert refold is not None
    heard: list[str] = []
    simulate_job(job, activity=heard.append)
    told = [line.rsplit(", an estimated ", 1)[1] for line in heard if ": simulating" in line]
    first, each = (ahead.straggler_state_s(refold, folded=True, first=building, every_mirror=True)
                   for building in (True, False))
    assert told
    assert told == [f"{format_duration(first)} of CPU"] + [f"{format_duration(each)} of CPU"] * (len(told) - 1)
    assert each != ahead.straggler_state_s(refold, folded=True)


def test_an_every_mirror_refold_counts_each_copy_once():
    """The every-mirror refold of a straggler state posts each copy of a collective once, whichever
    representative's group or mirror it is: at most the unfolded step's flows. RAILS at TP 8 PP 2 DP 2 with GPU 0
    slowed refolds onto 8 ranks and runs 1,816 flows; its estimate 1,888, the unfolded step's (the stage fold's
    708 scaled by the 4 x its ranks counted 2,832, 1.56 times)."""
    state = simulate(scenario_from_text(RAILS, "inline.yaml",
                                        [*PIPELINED, "faults.step.stragglers=[{gpus: [0], slowdown: 1.5}]"])).summary
    job, folded = throttled_rails_job(PIPELINED)
    refold = scale.every_mirror_refold(job, 32, state["simulated_ranks"])
    assert refold is not None and state["simulated_ranks"] == 4 * folded.simulated_ranks
    assert refold.ops == state["ops_executed"]
    assert state["flows_simulated"] == 1816
    assert refold.flows == 1888


def test_a_job_whose_straggler_states_take_past_the_limit_is_refused_unless_forced(tmp_path, capsys, monkeypatch):
    """Past MAX_AHEAD_S (brought down to 0.01 s) a job's straggler states are refused in one located line before
    any is simulated, as its states with links down are, with nothing written; --force runs it, telling the
    time."""
    monkeypatch.setattr(reliability_simulate, "MAX_AHEAD_S", 0.01)
    monkeypatch.setattr(reliability_simulate, "STRAGGLER_FORESIGHT_S", 0.0)
    monkeypatch.setattr(reliability_simulate, "_STRAGGLER_FOLDS", {})
    monkeypatch.setattr(states, "_CACHE", states.StateCache())
    scenario, out, err = _refused_in_one_line(tmp_path, capsys, UNFOLDED_STRAGGLER_JOB)
    assert f"{scenario}:" in err and ": the " in err and " cluster states with straggling GPUs foreseen " in err
    assert ", over the limit of 10 ms" in err and "more cores (--workers); or pass --force" in err
    assert main(["run", str(scenario), "--quiet", "--force", "--out", str(out)]) == 0
    assert " cluster states with straggling GPUs foreseen take an estimated " in capsys.readouterr().err
