"""Generators stepped on SimPy events (engine/stepping.py) behave as SimPy processes: the same event order, and a
failed event raised at the ``yield`` that waits for it (the engine's refusals to join: test_scenarios_comm.py)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from shared import SCENARIOS

from simulator import simulation as simulation_module
from simulator.cli import main
from simulator.collectives.execute import PlanRunner
from simulator.config.loader import load_scenario
from simulator.engine import engine as engine_module
from simulator.engine.engine import Engine
from simulator.engine.plans import PlanCache
from simulator.engine.sharing import Sharing
from simulator.engine.stepping import follow, run_until, start, succeed_next
from simulator.errors import InputError, ScenarioError
from simulator.metrics.events import EventLog
from simulator.network.model import Network
from simulator.program.ops import CollectiveOp, ComputeOp
from simulator.simulation import simulate
from simulator.topology.loader import load_topology

TOPOLOGY = load_topology("dgx-h100")


def _random_program(seed: int, launcher, finish=simpy.Environment.run):
    """Eight generators of random steps, each logging (time, name) after every step: timeouts of a few equal
    lengths (ties at one time), shared events that other generators or timeouts trigger, collectives on a shared
    network (flows that change each other's rates as they come and go) and children launched mid-run with
    ``launcher(env)``, the function that starts generators; ``finish(env)`` runs the events. Returns the end time,
    the log and the flows."""
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    launch = launcher(env)
    network = Network(env, TOPOLOGY, log=EventLog())
    runner, plans = PlanRunner(network, TOPOLOGY), PlanCache(TOPOLOGY)
    shared = [env.event() for _ in range(6)]
    for index, event in enumerate(shared[:3]):
        env.timeout(1e-6 * (index + 1)).callbacks.append(lambda _timeout, event=event: event.succeed())
    log: list[tuple[float, str]] = []

    def steps(name: str, count: int):
        for step in range(count):
            kind = rng.integers(5)
            if kind == 0:
                yield env.timeout(float(rng.choice([0.0, 1e-6, 2e-6])))
            elif kind == 1:
                yield shared[rng.integers(len(shared))]
            elif kind == 2:
                event = shared[3 + rng.integers(3)]
                if not event.triggered:
                    event.succeed()
            elif kind == 3:
                group = tuple(int(rank) for rank in rng.choice(8, size=int(rng.integers(2, 5)), replace=False))
                op = CollectiveOp(id=0, rank=group[0], stream="comm", name="c", op=str(rng.choice(
                    ["all_reduce", "all_gather"])), group=group, nbytes=float(rng.choice([2**16, 2**20, 2**24])))
                yield from runner.run_plan(env, plans.phases(op, group), f"{name}.{step}")
            elif len(name) < 6:
                launch([steps(f"{name}{step}", 4)])
            log.append((env.now, f"{name}.{step}"))

    launch([steps(chr(ord("a") + index), 12) for index in range(8)])
    for event in shared[3:]:  # whatever no generator triggered, so that nobody waits forever
        env.timeout(1e-3).callbacks.append(lambda _timeout, event=event: event.triggered or event.succeed())
    finish(env)
    return env.now, log, network.log.flow_columns()


def _processes(env: simpy.Environment):
    return lambda runs: [env.process(steps) for steps in runs]


def _stepped(env: simpy.Environment):
    return lambda runs: start(env, runs)


@pytest.mark.parametrize("seed", range(6))
def test_stepped_generators_process_their_events_in_the_order_simpy_processes_do(seed):
    """The same random program run as SimPy processes and as stepped generators: the same log, step for step and
    to the last bit of every time, and the same flows on the network."""
    end_a, log_a, flows_a = _random_program(seed, _processes)
    end_b, log_b, flows_b = _random_program(seed, _stepped)
    assert len(log_a) > 40
    assert log_a == log_b and end_a == end_b
    assert flows_a.keys() == flows_b.keys() and len(flows_a["src"]) > 10
    for column in flows_a:
        assert np.array_equal(flows_a[column], flows_b[column])


STOP_S = 2e-5
"""When the random programs are stopped early: after a few dozen of their steps, before most."""


@pytest.mark.parametrize("seed", range(4))
def test_run_until_processes_the_events_simpy_runs_do(seed):
    """`run_until` against `env.run` on the random program: with an event that never comes it drains the queue
    as `env.run()` does; with a timeout it stops where `env.run(until=...)` stops, having processed the same
    events (the same log and flows, to the last bit)."""
    end_a, log_a, flows_a = _random_program(seed, _stepped)
    end_b, log_b, flows_b = _random_program(seed, _stepped, lambda env: run_until(env, env.event()))
    assert (end_a, log_a) == (end_b, log_b) and all(np.array_equal(flows_a[c], flows_b[c]) for c in flows_a)
    end_c, log_c, flows_c = _random_program(seed, _processes, lambda env: env.run(until=env.timeout(STOP_S)))
    end_d, log_d, flows_d = _random_program(seed, _stepped, lambda env: run_until(env, env.timeout(STOP_S)))
    assert end_c == end_d == STOP_S and log_c == log_d and 10 < len(log_d) < len(log_a) - 10
    assert all(np.array_equal(flows_c[c], flows_d[c]) for c in flows_c)


def test_run_until_refuses_an_event_something_waits_on():
    env = simpy.Environment()
    until = env.event()
    until.callbacks.append(lambda _event: None)
    with pytest.raises(AssertionError):
        run_until(env, until)


def test_a_generator_sees_a_failed_event_at_its_yield_and_may_handle_it():
    """The failed event's exception is raised at the ``yield`` (the generator catches it and goes on); it is
    defused, so the run itself does not fail."""
    env = simpy.Environment()
    failing, error, seen = env.event(), ValueError("link down"), []
    env.timeout(2.0).callbacks.append(lambda _timeout: failing.fail(error))

    def steps():
        try:
            yield failing
        except ValueError as caught:
            seen.append((env.now, caught))
        yield env.timeout(1.0)
        seen.append(env.now)

    start(env, [steps()])
    env.run()
    assert seen == [(2.0, error), 3.0]


def test_an_error_no_generator_catches_leaves_the_run_as_itself():
    env = simpy.Environment()
    failing, error = env.event(), InputError("bad", field="collectives.algorithm")
    env.timeout(1.0).callbacks.append(lambda _timeout: failing.fail(error))

    def steps():
        yield failing

    follow(steps())
    with pytest.raises(InputError) as caught:
        env.run()
    assert caught.value is error and env.now == 1.0


class _Refusal(Exception):
    """An error whose ``__init__`` takes other arguments than its args (a rank and a keyword)."""

    def __init__(self, rank: int, *, why: str):
        super().__init__(f"rank {rank}: {why}")
        self.rank = rank


class _Formatted(Exception):
    """An error whose ``__init__`` formats its argument into its message: called again on its args, it would
    format its own message a second time (``bad value bad value 5``)."""

    def __init__(self, value: int):
        super().__init__(f"bad value {value}")
        self.value = value


@pytest.mark.parametrize("error", [
    InputError("bad", field="run.seed", allowed="an integer", file="--set run.seed=x", line=None, at_flag=True),
    InputError("bad", field="collectives.algorithm", allowed="ring, tree", file="s.yaml", line=7),
    _Refusal(3, why="not in the group"),
    _Formatted(5),
])
def test_run_until_raises_the_error_nothing_caught_itself(error):
    """A SimPy process fails and nothing defuses it: `run_until` raises that very error, all its parts with it, not
    SimPy's copy, ``type(error)(*error.args)``, which would make an InputError of the rendered line (field, allowed,
    file, line and flag lost), fail with a TypeError for `_Refusal` and double `_Formatted`'s message."""
    env = simpy.Environment()

    def failing():
        yield env.timeout(1.0)
        raise error

    env.process(failing())
    with pytest.raises(type(error)) as caught:
        run_until(env, env.event())
    assert caught.value is error and env.now == 1.0


def _failing_plan(env: simpy.Environment, _phases, _key: str):
    """A collective's plan that waits on a nested SimPy process (as a plan with mirrors does) which fails."""

    def plan():
        yield env.timeout(1e-3)
        raise InputError("no route", field="cluster.links")

    yield env.all_of([env.process(plan())])


def test_a_failed_plan_stops_its_collective_and_reaches_the_engine_run_with_its_field():
    """The collective neither logs rows nor releases its members (not going on as if the plan had run, the error coming
    at the end of the step); `Engine.run` raises the plan's own error, field and all."""
    env, log = simpy.Environment(), EventLog()
    engine = Engine(env, PlanCache(TOPOLOGY), run_plan=_failing_plan, run_plans=_failing_plan, log=log,
                    sharing=Sharing())
    ops = [CollectiveOp(id=rank, rank=rank, stream="comm", name="X", op="all_reduce", group=(0, 1), nbytes=2**20,
                        key="X") for rank in (0, 1)]
    ops.append(ComputeOp(id=2, rank=0, stream="comm", name="after", duration=1e-3, deps=(0,)))
    with pytest.raises(InputError) as caught:
        engine.run(ops)
    assert caught.value.field == "cluster.links" and caught.value.problem == "no route"
    assert len(log) == 0 and engine.executed == 0


def test_an_error_in_a_plan_timed_alone_reaches_the_command_line_as_itself(tmp_path, capsys, monkeypatch):
    """A private collective is timed alone in a nested loop (`run_alone`); an input error there is printed as raised,
    not as a copy of its rendered line located again at the scenario (`error: <scenario>:3: s.yaml:3: ...`), as
    `env.run()` would make it."""

    def failing_plan(env, *_args, **_kwargs):
        yield env.timeout(1e-6)
        raise ScenarioError("injected", field="collectives.algorithm", allowed="ring", file="s.yaml", line=3)

    monkeypatch.setattr(simulation_module, "run_plan", failing_plan)
    scenario = SCENARIOS / "allreduce-2x-dgx-h100.yaml"
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert capsys.readouterr().err == "error: s.yaml:3: collectives.algorithm: injected (allowed: ring)\n"


def _releases(seed: int, release) -> list[tuple[float, str]]:
    """Generators that each wait, step after step, for an event a timeout's only callback succeeds with
    ``release(env, event)`` (as the engine releases a replayed collective's members), among timeouts of a few
    equal lengths, so that other events are often due at the instant of a release and sometimes not."""
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    log: list[tuple[float, str]] = []

    def steps(name: str):
        for step in range(30):
            if rng.integers(2):
                released = env.event()
                env.timeout(float(rng.choice([1e-6, 2e-6, 3e-6]))).callbacks.append(
                    lambda _timeout, released=released: release(env, released))
                yield released
            else:
                yield env.timeout(float(rng.choice([0.0, 1e-6, 2e-6])))
            log.append((env.now, f"{name}.{step}"))

    start(env, [steps(chr(ord("a") + index)) for index in range(6)])
    env.run()
    return log


@pytest.mark.parametrize("seed", range(4))
def test_an_event_succeeded_next_runs_where_simpy_would_process_it(seed):
    """`succeed_next` from a timeout's only callback gives the order of a plain `succeed`, whether it runs the
    event's callbacks at once (nothing else due) or schedules it (some other event due at that instant)."""
    inline = []

    def next_release(env: simpy.Environment, event: simpy.Event) -> None:
        inline.append(not env._queue or env._queue[0][0] > env.now)
        succeed_next(env, event)

    expected = _releases(seed, lambda _env, event: event.succeed())
    assert _releases(seed, next_release) == expected and len(expected) == 180
    assert 0 < sum(inline) < len(inline)


def test_succeed_next_refuses_an_event_already_triggered():
    env = simpy.Environment()
    event = env.event()
    event.succeed()
    with pytest.raises(AssertionError):
        succeed_next(env, event)


def test_a_replay_heavy_step_logs_what_a_plain_succeed_logs(monkeypatch):
    """The engine releases a replayed collective's members with `succeed_next`; with a plain `succeed` instead
    the folded Megatron 18.4B step (some 1,100 replays, 79 of them released through the queue, the rest at
    once) logs the same columns, byte for byte."""
    scenario = SCENARIOS / "megatron-sc21-18.4b.yaml"
    at_once: list[bool] = []

    def observed(env: simpy.Environment, event: simpy.Event) -> None:
        at_once.append(not env._queue or env._queue[0][0] > env.now)
        succeed_next(env, event)

    monkeypatch.setattr(engine_module, "succeed_next", observed)
    fast = simulate(load_scenario(scenario)).log.columns()
    monkeypatch.setattr(engine_module, "succeed_next", lambda _env, event: event.succeed())
    plain = simulate(load_scenario(scenario)).log.columns()
    assert len(at_once) > 1000 and 0 < sum(at_once) < len(at_once) - 50
    assert fast.keys() == plain.keys()
    for name, (values, distinct) in fast.items():
        assert values.tobytes() == plain[name][0].tobytes() and distinct == plain[name][1], name
