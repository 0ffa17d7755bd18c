"""The flow-level network model against hand-computed max-min answers and a plain step-by-step reference."""

from __future__ import annotations

import gc
import re
import signal
from collections import Counter, defaultdict

import numpy as np
import pytest
import simpy
from shared import GB, SCENARIOS

from simulator.collectives.execute import PlanRunner
from simulator.collectives.phases import Phase
from simulator.collectives.phases import Transfer as PhaseTransfer
from simulator.config.link_classes import LINK_CLASSES
from simulator.config.loader import scenario_from_text
from simulator.errors import ScenarioError
from simulator.faults.rerouting import Rerouter
from simulator.metrics.events import EventLog
from simulator.network import maxmin, model
from simulator.network.maxmin import Incidence, grouped_max_min_rates, max_min_rates
from simulator.network.model import Network, Transfers
from simulator.network.modes import NETWORK_MODES
from simulator.topology.graph import Topology, Wiring, add_link

ROUNDING = 1e-12
"""Relative tolerance for these flow figures, which agree to float rounding (tighter than shared.EXACT, 1e-9)."""


def line_topology(latency: float = 0.0) -> Topology:
    """GPUs a - b - c; a-b carries 10 GB/s over NVLink, b-c 1 GB/s over InfiniBand."""
    graph = Wiring()
    add_link(graph, "a", "b", bandwidth=10 * GB, latency=latency, link_class="nvlink")
    add_link(graph, "b", "c", bandwidth=1 * GB, latency=latency, link_class="infiniband")
    return Topology(name="line", wiring=graph, gpus=["a", "b", "c"], gpu_host=[0, 1, 2], gpu_local=[0, 0, 0])


def dumbbell_topology(edge_latency: float = 0.0, core_latency: float = 0.0) -> Topology:
    """GPUs g0, g1 on switch s0 and g2, g3 on s1; 100 GB/s edges, one 10 GB/s core link s0-s1."""
    graph = Wiring()
    for gpu, switch in (("g0", "s0"), ("g1", "s0"), ("g2", "s1"), ("g3", "s1")):
        add_link(graph, gpu, switch, bandwidth=100 * GB, latency=edge_latency, link_class="nvlink")
    add_link(graph, "s0", "s1", bandwidth=10 * GB, latency=core_latency, link_class="infiniband")
    return Topology(name="dumbbell", wiring=graph, gpus=["g0", "g1", "g2", "g3"], gpu_host=[0, 0, 1, 1],
                    gpu_local=[0, 1, 0, 1])


def diamond_topology() -> Topology:
    """GPUs g0 - s0 and s1 - g1 at 100 GB/s; s0 reaches s1 over m0 or m1, 10 GB/s each hop."""
    graph = Wiring()
    add_link(graph, "g0", "s0", bandwidth=100 * GB, latency=0.0, link_class="nvlink")
    add_link(graph, "s1", "g1", bandwidth=100 * GB, latency=0.0, link_class="nvlink")
    for middle in ("m0", "m1"):
        add_link(graph, "s0", middle, bandwidth=10 * GB, latency=0.0, link_class="infiniband")
        add_link(graph, middle, "s1", bandwidth=10 * GB, latency=0.0, link_class="infiniband")
    return Topology(name="diamond", wiring=graph, gpus=["g0", "g1"], gpu_host=[0, 1], gpu_local=[0, 0])


def fail_s0_m0_at(env: simpy.Environment, topo: Topology, net: Network, at_s: float) -> None:
    """Take the diamond's s0-m0 link down (both directions, routes and network) at ``at_s``."""
    rerouter = Rerouter(topo)

    def fail():
        yield env.timeout(at_s)
        rerouter.take_down([("s0", "m0")])
        net.take_down([topo.link_index[("s0", "m0")], topo.link_index[("m0", "s0")]])

    env.process(fail())


def diamond_detour(topo: Topology) -> tuple[int, ...]:
    """The diamond's g0 -> g1 route over m1."""
    link = topo.link_index
    return (link[("g0", "s0")], link[("s0", "m1")], link[("m1", "s1")], link[("s1", "g1")])


def run_until_done(env: simpy.Environment, event: simpy.Event) -> float:
    env.run(until=event)
    return env.now


def end_times(log: EventLog) -> dict[str, float]:
    frame = log.to_frame()
    return dict(zip(frame["key"], frame["end_s"]))


def reference_max_min(paths: list[tuple[int, ...]], capacity: np.ndarray) -> list[float]:
    """Textbook progressive filling, one flow at a time, written for clarity rather than speed."""
    remaining = {link: float(capacity[link]) for path in paths for link in path}
    unfrozen_on = {link: 0 for link in remaining}
    for path in paths:
        for link in path:
            unfrozen_on[link] += 1
    rate = [None] * len(paths)
    while any(r is None for r in rate):
        shares = {link: remaining[link] / unfrozen_on[link] for link in remaining if unfrozen_on[link] > 0}
        level = min(shares.values())
        bottlenecks = {link for link, share in shares.items() if share <= level * (1 + 1e-12)}
        for i, path in enumerate(paths):
            if rate[i] is None and bottlenecks.intersection(path):
                rate[i] = level
                for link in path:
                    remaining[link] -= level
                    unfrozen_on[link] -= 1
    return rate


def test_single_flow_takes_path_latency_plus_bytes_over_bottleneck():
    topo = dumbbell_topology(edge_latency=1e-6, core_latency=5e-6)
    env = simpy.Environment()
    net = Network(env, topo)
    path = topo.path(0, 2)
    assert topo.path_latency(0, 2) == pytest.approx(7e-6, rel=ROUNDING)
    done = net.transfer(path, 3 * GB, topo.path_latency(0, 2))
    assert run_until_done(env, done) == pytest.approx(7e-6 + 3 * GB / (10 * GB), rel=ROUNDING)


@pytest.mark.parametrize("k", [2, 3])
def test_k_flows_on_one_link_each_get_one_kth(k):
    topo = dumbbell_topology()
    path = topo.path(0, 2)
    assert max_min_rates([path] * k, topo.link_bandwidth).tolist() == pytest.approx([10 * GB / k] * k, rel=ROUNDING)
    env = simpy.Environment()
    net = Network(env, topo)
    done = net.run_phase([(path, 2 * GB, 0.0)] * k)
    assert run_until_done(env, done) == pytest.approx(k * 2 * GB / (10 * GB), rel=ROUNDING)


def test_classic_three_flow_example_leaves_unused_share_to_the_other_flow():
    # a->c crosses a-b (10 GB/s) and b-c (1 GB/s); a->b only a-b; b->c only b-c. b-c is the bottleneck of
    # a->c and b->c (0.5 GB/s each), so a->b gets the rest of a-b: 10 - 0.5 = 9.5 GB/s.
    topo = line_topology()
    paths = [topo.path(0, 2), topo.path(0, 1), topo.path(1, 2)]
    assert max_min_rates(paths, topo.link_bandwidth).tolist() == pytest.approx([0.5 * GB, 9.5 * GB, 0.5 * GB],
                                                                               rel=ROUNDING)
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    # 1 GB at 0.5 GB/s ends at 2 s for a->c and b->c; a->b moves 19 GB by then, then 10 GB alone at 10 GB/s.
    for key, (src, dst, nbytes) in {"ac": (0, 2, 1 * GB), "ab": (0, 1, 29 * GB), "bc": (1, 2, 1 * GB)}.items():
        net.transfer(topo.path(src, dst), nbytes, 0.0, src=src, dst=dst, key=key)
    env.run()
    assert end_times(log) == pytest.approx({"ac": 2.0, "bc": 2.0, "ab": 3.0}, rel=ROUNDING)


def test_finished_flows_are_freed_by_reference_counting_alone():
    """A finished flow leaves no cycle with its cohort behind: simulate() pauses the cyclic collector, so every
    flow of a run stayed in memory until the first collection after it (the DeepSeek-V3-style DualPipeV step
    at global batch 2048: 3.1 M objects of cyclic garbage, its first run's through its refold's run)."""
    topo = line_topology()
    enabled = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        env, log = simpy.Environment(), EventLog()
        net = Network(env, topo, log=log)
        for key, (src, dst, nbytes) in {"ac": (0, 2, 1 * GB), "ab": (0, 1, 39 * GB), "bc": (1, 2, 2 * GB)}.items():
            net.transfer(topo.path(src, dst), nbytes, 0.0, key=key)
        env.run()
        assert end_times(log) == pytest.approx({"ac": 2.0, "bc": 3.0, "ab": 4.0}, rel=ROUNDING)
        assert not [item for item in gc.get_objects() if isinstance(item, model._Flow)]
    finally:
        if enabled:
            gc.enable()


def test_flow_that_ends_early_speeds_up_the_rest():
    # Until 2 s: a->c and b->c at 0.5 GB/s, a->b at 9.5 GB/s. a->c (1 GB) ends at 2 s; b->c has 1 GB left and
    # runs alone at 1 GB/s -> 3 s; a->b has 39 - 19 = 20 GB left at 10 GB/s -> 4 s.
    topo = line_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    for key, (src, dst, nbytes) in {"ac": (0, 2, 1 * GB), "ab": (0, 1, 39 * GB), "bc": (1, 2, 2 * GB)}.items():
        net.transfer(topo.path(src, dst), nbytes, 0.0, key=key)
    env.run()
    assert end_times(log) == pytest.approx({"ac": 2.0, "bc": 3.0, "ab": 4.0}, rel=ROUNDING)


def test_latency_is_waited_before_the_flow_takes_bandwidth():
    # Over b-c (1 GB/s): "late" waits 1 s, "early" runs alone for 1 s (1 GB), then both share at 0.5 GB/s:
    # "early" ends at 1 + 1/0.5 = 3 s; "late" has moved 1 GB by then and ends alone at 4 s.
    topo = line_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    net.transfer(topo.path(1, 2), 2 * GB, 1.0, key="late")
    net.transfer(topo.path(1, 2), 2 * GB, 0.0, key="early")
    env.run()
    assert end_times(log) == pytest.approx({"early": 3.0, "late": 4.0}, rel=ROUNDING)


def test_zero_byte_and_local_transfers_finish_after_their_latency():
    topo = line_topology()
    env = simpy.Environment()
    net = Network(env, topo)
    done = net.run_phase([(topo.path(0, 2), 0.0, 2.5e-6), (topo.path(1, 1), 1 * GB, 1e-6)])
    assert run_until_done(env, done) == pytest.approx(2.5e-6, rel=ROUNDING)
    assert net.resolves == 0


def test_analytic_mode_ignores_contention_between_phases():
    """Three 1 GB transfers over the 10 GB/s core posted as three phases (other work to each other) each take
    0.1 s on the analytic model, 0.3 s under max-min sharing."""
    topo = dumbbell_topology(edge_latency=1e-6)
    path = topo.path(0, 2)
    for mode, expected in (("analytic", 2e-6 + 0.1), ("flow", 2e-6 + 0.3)):
        env = simpy.Environment()
        net = Network(env, topo, mode=mode)
        done = env.all_of([net.run_phase([(path, 1 * GB, 2e-6)]) for _ in range(3)])
        assert run_until_done(env, done) == pytest.approx(expected, rel=ROUNDING)


def test_analytic_mode_shares_a_link_among_the_transfers_of_one_phase():
    """One phase of three 1 GB transfers over the 10 GB/s core (a collective's channels over one NIC) cannot pass the
    core's line rate together: 0.3 s as under max-min sharing, not 0.1 s each (3x the line rate)."""
    topo = dumbbell_topology(edge_latency=1e-6)
    path = topo.path(0, 2)
    for mode in ("analytic", "flow"):
        env = simpy.Environment()
        net = Network(env, topo, mode=mode)
        done = net.run_phase([(path, 1 * GB, 2e-6)] * 3)
        assert run_until_done(env, done) == pytest.approx(2e-6 + 0.3, rel=ROUNDING)


def test_analytic_mode_shares_among_one_collective_of_a_joined_batch_only():
    """A batch joining two collectives (a collective and its mirror, `Transfers` ``collectives``), one 1 GB
    transfer each over the core, takes 0.1 s: each collective alone on it."""
    topo = dumbbell_topology()
    path = topo.path(0, 2)
    env = simpy.Environment()
    net = Network(env, topo, mode="analytic")
    done = net.run_phase(Transfers([(path, 1 * GB, 0.0)] * 2, collectives=((0, 1), (1, 2))))
    assert run_until_done(env, done) == pytest.approx(0.1, rel=ROUNDING)


@pytest.mark.parametrize("phases", [1, 2])
def test_analytic_mode_shares_links_among_a_collectives_copies_posted_together_or_apart(phases):
    """A plan g0 -> g2 and its copy g1 -> g3 (1 GB a phase each over the dumbbell's 10 GB/s core), named copies
    of each other phase by phase (`simulation.copy_phases`), take 0.2 s a phase, the flow model's: posted together
    (a folded collective and its mirror) or each on its own (unfolded), where without copies each took the whole
    core (0.1 s a phase)."""
    topo = dumbbell_topology()
    plans = [[Phase((PhaseTransfer(src, dst, 1 * GB),)) for _ in range(phases)] for src, dst in ((0, 2), (1, 3))]
    copies = {id(phase): [plan[index] for plan in plans] for plan in plans for index, phase in enumerate(plan)}
    for mode in ("analytic", "flow"):
        for together in (True, False):
            env = simpy.Environment()
            runner = PlanRunner(Network(env, topo, mode=mode), topo, copies=copies)
            if together:
                env.process(runner.run_plans(env, plans, "x"))
            else:
                for plan in plans:
                    env.process(runner.run_plan(env, plan, "x"))
            env.run()
            assert env.now == pytest.approx(0.2 * phases, rel=ROUNDING)


def _opposite_copies(phases: int) -> list[list[Phase]]:
    """Two copies of a plan, 1 GB a transfer, each slow (over the dumbbell's 10 GB/s core: 0.1 s) where the other
    is fast (over one switch's 100 GB/s edges: 0.01 s), phase by phase: g0 -> g2 then g0 -> g1, and g1 -> g0 then
    g1 -> g3 (the first phases only where ``phases`` is 1)."""
    return [[Phase((PhaseTransfer(src, dst, 1 * GB),)) for src, dst in pairs[:phases]]
            for pairs in (((0, 2), (0, 1)), ((1, 0), (1, 3)))]


def test_analytic_copies_run_with_no_phase_barrier():
    """Two-phase copies slow where the other is fast, named copies of each other: with no barrier between
    phases each ends after its own sum, 0.11 s, posted together or apart; a barrier would hold both to 0.2 s."""
    topo = dumbbell_topology()
    plans = _opposite_copies(2)
    copies = {id(phase): [plan[index] for plan in plans] for plan in plans for index, phase in enumerate(plan)}
    for together in (True, False):
        env = simpy.Environment()
        runner = PlanRunner(Network(env, topo, mode="analytic"), topo, copies=copies)
        for posted in [plans] if together else [[plan] for plan in plans]:
            env.process(runner.run_plans(env, posted, "x"))
        env.run()
        assert env.now == pytest.approx(0.11, rel=ROUNDING)


def test_analytic_folded_copies_take_the_groups_own_time():
    """A collective posted with its mirror (folded) whose copies share the links (`simulation.copy_phases`)
    takes its own plan's time, its mirror's bytes counted in the load: 0.01 s over the edges, not the mirror's
    0.1 s over the core, as the collective posted alone (unfolded) takes."""
    topo = dumbbell_topology()
    plans = _opposite_copies(1)[::-1]
    copies = {id(plan[0]): [plan[0] for plan in plans] for plan in plans}
    for posted in (plans, plans[:1]):
        env = simpy.Environment()
        runner = PlanRunner(Network(env, topo, mode="analytic"), topo, copies=copies)
        env.process(runner.run_plans(env, posted, "x"))
        env.run()
        assert env.now == pytest.approx(0.01, rel=ROUNDING)


def test_analytic_mode_uses_the_path_bottleneck_and_logs_each_transfer():
    """0 -> 2 takes 1 GB over the 1 GB/s b-c link; 0 -> 1 shares a-b (10 GB/s) with it, the 2 GB of the phase
    over it in 0.2 s (proportional shares: the transfers over a link end together)."""
    topo = line_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, mode="analytic", log=log)
    done = net.run_phase([(topo.path(0, 2), 1 * GB, 0.0, 0, 2), (topo.path(0, 1), 1 * GB, 0.0, 0, 1)], key="p")
    assert run_until_done(env, done) == pytest.approx(1.0, rel=ROUNDING)
    frame = log.to_frame()
    assert sorted(frame["end_s"]) == pytest.approx([0.2, 1.0], rel=ROUNDING)


def test_an_analytic_phase_posted_again_is_timed_once_and_logs_its_rows_at_each_start(monkeypatch):
    """A plan runner posts one `Transfers` per phase for every instance: the analytic network times it once and
    logs each instance's flow rows as that block shifted to its start, the rows a transfer-by-transfer log
    gives (start, start + duration: 1.3 + 1.0 and 1.3 + 0.2, to the last bit), in order, with routes and keys."""
    topo = line_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, mode="analytic", log=log)
    phase = Transfers([(topo.path(0, 2), 1 * GB, 0.0, 0, 2), (topo.path(0, 1), 1 * GB, 0.0, 0, 1)])
    timed = []
    analytic_seconds = model.analytic_seconds
    monkeypatch.setattr(model, "analytic_seconds", lambda *args: timed.append(args) or analytic_seconds(*args))

    def twice():
        yield net.run_phase(phase, key="first")
        yield env.timeout(0.3)
        yield net.run_phase(phase, key="second")

    env.process(twice())
    env.run()
    assert len(timed) == 1
    flows = log.flow_columns()
    assert list(flows["key"]) == ["first", "first", "second", "second"]
    assert list(flows["start_s"]) == [0.0, 0.0, 1.3, 1.3]
    assert list(flows["end_s"]) == [1.0, 0.2, 1.3 + 1.0, 1.3 + 0.2]
    assert log.flow_routes() == [topo.path(0, 2), topo.path(0, 1)] * 2


def test_an_analytic_phase_posted_again_after_a_degrade_takes_the_new_capacity():
    """The timing of a posted `Transfers` holds the capacities of when it was timed: a degrade forgets it, so the same
    phase posted again takes 1 GB over the b-c link at a tenth of 1 GB/s, as a fresh phase does, not the healthy 1 s."""
    topo = line_topology()
    env = simpy.Environment()
    net = Network(env, topo, mode="analytic")
    phase = Transfers([(topo.path(0, 2), 1 * GB, 0.0, 0, 2)])
    took = []

    def timed(transfers):
        start = env.now
        yield net.run_phase(transfers, key="p")
        took.append(env.now - start)

    def degrade_between():
        yield from timed(phase)
        net.scale_capacity(list(topo.path(0, 2)), 0.1)
        yield from timed(phase)
        yield from timed(Transfers([(topo.path(0, 2), 1 * GB, 0.0, 0, 2)]))

    env.process(degrade_between())
    env.run()
    assert took == pytest.approx([1.0, 10.0, 10.0], rel=ROUNDING)


def test_efficiency_scales_capacity_of_its_link_class_only():
    topo = line_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, efficiency={"nvlink": 0.5}, log=log)
    net.transfer(topo.path(0, 1), 5 * GB, 0.0, key="nvlink")  # 5 GB at 10 GB/s * 0.5
    net.transfer(topo.path(1, 2), 3 * GB, 0.0, key="ib")  # 3 GB at 1 GB/s, untouched
    env.run()
    assert end_times(log) == pytest.approx({"nvlink": 1.0, "ib": 3.0}, rel=ROUNDING)


@pytest.mark.parametrize("efficiency, field", [("{warp: 0.5}", "network.efficiency.warp"),
                                               ("{pcie: 0.0}", "network.efficiency.pcie"),
                                               ("{pcie: 1.5}", "network.efficiency.pcie")])
def test_a_bad_efficiency_is_refused_at_load(efficiency, field):
    """The link classes and their fractions are checked when the scenario is read (a sweep's validated points included),
    against the one set of classes, at the field's line, not by the network."""
    text = (f"cluster: {{topology: dgx-h100}}\nworkload:\n  - {{op: all_reduce, bytes: 1 MiB}}\n"
            f"network:\n  efficiency: {efficiency}\n")
    with pytest.raises(ScenarioError) as error:
        scenario_from_text(text, "s.yaml")
    assert (error.value.field, error.value.line) == (field, 5)
    if "warp" in efficiency:
        assert all(link_class in error.value.allowed for link_class in LINK_CLASSES)


def test_an_unknown_network_mode_is_refused_at_load_with_the_modes_allowed():
    text = "cluster: {topology: dgx-h100}\nnetwork: {model: packet}\nworkload:\n  - {op: all_reduce, bytes: 1 MiB}\n"
    with pytest.raises(ScenarioError) as error:
        scenario_from_text(text, "s.yaml")
    assert (error.value.field, error.value.line) == ("network.model", 2)
    assert all(mode in error.value.allowed for mode in NETWORK_MODES)


def test_two_concurrent_phases_sharing_a_link_each_take_longer_than_alone():
    # Alone, 1 GB over the 10 GB/s core takes 0.1 s. Together: both at 5 GB/s until the 1 GB phase ends at
    # 0.2 s; the 3 GB phase has 2 GB left at 10 GB/s and ends at 0.4 s (alone it would take 0.3 s).
    topo = dumbbell_topology()
    env = simpy.Environment()
    net = Network(env, topo)
    small = net.run_phase([(topo.path(0, 2), 1 * GB, 0.0)], key="small")
    large = net.run_phase([(topo.path(1, 3), 3 * GB, 0.0)], key="large")
    finished = {}
    small.callbacks.append(lambda _e: finished.setdefault("small", env.now))
    large.callbacks.append(lambda _e: finished.setdefault("large", env.now))
    env.run()
    assert finished == pytest.approx({"small": 0.2, "large": 0.4}, rel=ROUNDING)


def test_opposite_directions_of_a_link_do_not_contend():
    topo = dumbbell_topology()
    env = simpy.Environment()
    net = Network(env, topo)
    done = net.run_phase([(topo.path(0, 2), 1 * GB, 0.0), (topo.path(2, 0), 1 * GB, 0.0)])
    assert run_until_done(env, done) == pytest.approx(0.1, rel=ROUNDING)


def test_repeat_folding_equals_separate_steps_under_constant_rates():
    # Two flows share the core link (5 GB/s each); 3 steps of (latency 2 us, 0.5 GB) back to back equal one
    # phase of 1.5 GB with 6 us latency: 3 * (2e-6 + 0.5 / 5) s.
    topo = dumbbell_topology()
    paths = [topo.path(0, 2), topo.path(1, 3)]
    steps, latency, nbytes = 3, 2e-6, 0.5 * GB
    expected = steps * (latency + nbytes / (5 * GB))

    env = simpy.Environment()
    net = Network(env, topo)

    def stepwise():
        for _ in range(steps):
            yield net.run_phase([(path, nbytes, latency) for path in paths])

    assert run_until_done(env, env.process(stepwise())) == pytest.approx(expected, rel=ROUNDING)
    env = simpy.Environment()
    net = Network(env, topo)
    folded = net.run_phase([(path, steps * nbytes, steps * latency) for path in paths])
    assert run_until_done(env, folded) == pytest.approx(expected, rel=ROUNDING)


def test_a_phase_costs_one_resolve_however_many_flows_it_has():
    topo = dumbbell_topology()
    env = simpy.Environment()
    net = Network(env, topo)
    done = net.run_phase([(topo.path(i % 2, 2 + i % 2), 0.1 * GB, 0.0) for i in range(64)])
    assert run_until_done(env, done) == pytest.approx(64 * 0.1 / 10, rel=ROUNDING)
    assert (net.flows_simulated, net.resolves) == (64, 1)


def test_flows_posted_anywhere_within_one_instant_cost_one_resolve():
    # Transfers posted before the run, by a process, and by a process resumed later in the same instant all
    # start at t = 0 and are solved together: six equal flows over the core end together at 6 * 0.1 GB / 10 GB/s.
    topo = dumbbell_topology()
    env = simpy.Environment()
    net = Network(env, topo)
    path = topo.path(0, 2)
    net.transfer(path, 0.1 * GB)
    net.transfer(path, 0.1 * GB)

    def at_once():
        yield net.run_phase([(path, 0.1 * GB, 0.0)] * 2)

    def after_zero_delay():
        yield env.timeout(0)
        yield net.run_phase([(path, 0.1 * GB, 0.0)] * 2)

    env.process(at_once())
    env.process(after_zero_delay())
    env.run()
    assert env.now == pytest.approx(0.06, rel=ROUNDING)
    assert (net.resolves, net.wake_ups) == (1, 1)


def test_flows_due_together_up_to_float_dust_finish_in_one_event():
    # Three 1 GB flows share a-b (10 GB/s) and end at 1 GB / (10/3 GB/s) = 0.3 s; a 0.3 GB flow alone on b-c
    # (1 GB/s) also ends at 0.3 s, but the two times differ in the last bit of a double.
    topo = line_topology()
    assert GB / (10 * GB / 3) != (3 * 0.1 * GB) / GB
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    net.run_phase([(topo.path(0, 1), 1 * GB, 0.0)] * 3 + [(topo.path(1, 2), 3 * 0.1 * GB, 0.0)])
    env.run()
    assert set(log.to_frame()["end_s"]) == {env.now} and env.now == pytest.approx(0.3, rel=ROUNDING)
    assert net.wake_ups == 1


def test_a_flow_finishes_with_an_earlier_one_only_within_its_own_tolerance():
    # Alone on their links: a->b 1 GB at 10 GB/s ends at 0.1 s; b->a carries 1 GB * (1 + 0.5e-9), half its
    # tolerance (1e-9 of its size) later, so it ends with it; b->c carries 0.1 GB * (1 + 1.5e-9) at 1 GB/s,
    # 1.5 tolerances later: it is not ready at 0.1 s and ends on its own, logged after the other two.
    topo = line_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    net.run_phase([(topo.path(1, 2), 0.1 * GB * (1 + 1.5e-9), 0.0, 1, 2), (topo.path(0, 1), 1 * GB, 0.0, 0, 1),
                   (topo.path(1, 0), 1 * GB * (1 + 0.5e-9), 0.0, 1, 0)])
    env.run()
    frame = log.to_frame()
    assert list(frame["dst"]) == [1, 0, 2]
    assert list(frame["end_s"]) == pytest.approx([0.1, 0.1, 0.1 * (1 + 1.5e-9)], rel=ROUNDING)
    assert net.wake_ups == 2


def test_resolve_is_limited_to_the_component_that_changed():
    # Four long flows g0->g2 and two short flows g2->g3 share no directed link: starting and ending the short
    # ones re-solves only those two flows and leaves the long ones' finish time alone.
    topo = dumbbell_topology()
    env = simpy.Environment()
    net = Network(env, topo)
    long_phase = net.run_phase([(topo.path(0, 2), 1 * GB, 0.0)] * 4)

    def short_later():
        yield env.timeout(0.05)
        yield net.run_phase([(topo.path(2, 3), 1 * GB, 0.0)] * 2)

    short = env.process(short_later())
    assert run_until_done(env, long_phase) == pytest.approx(0.4, rel=ROUNDING)
    assert short.processed and (net.resolves, net.resolved_flows) == (2, 6)


def test_log_has_one_row_per_transfer_with_its_labels():
    topo = line_topology(latency=1e-6)
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)

    def later():
        yield env.timeout(1.0)
        yield net.run_phase([(topo.path(0, 1), 10 * GB, 1e-6, 0, 1), (topo.path(2, 1), 1 * GB, 1e-6, 2, 1)],
                            key="allgather")

    env.process(later())
    env.run()
    frame = log.to_frame().sort_values("src").reset_index(drop=True)
    assert list(frame["kind"]) == ["flow", "flow"] and list(frame["stream"]) == ["net", "net"]
    assert list(frame["rank"]) == [0, 2] and list(frame["dst"]) == [1, 1]
    assert list(frame["name"]) == ["allgather", "allgather"]
    assert list(frame["start_s"]) == [1.0, 1.0]
    assert list(frame["end_s"]) == pytest.approx([1.0 + 1e-6 + 1.0, 1.0 + 1e-6 + 1.0], rel=ROUNDING)
    assert list(frame["bytes"]) == [10 * GB, 1 * GB]


def test_max_min_matches_plain_progressive_filling_on_2000_random_flows():
    rng = np.random.default_rng(7)
    capacity = rng.uniform(1 * GB, 50 * GB, size=300)
    distinct = [tuple(rng.choice(300, size=rng.integers(5, 8), replace=False).tolist()) for _ in range(1500)]
    paths = distinct + [distinct[i] for i in rng.integers(0, 1500, size=500)]
    got = max_min_rates(paths, capacity)
    want = np.array(reference_max_min(paths, capacity))
    np.testing.assert_allclose(got, want, rtol=1e-9)
    load = np.zeros(300)
    for path, rate in zip(paths, got):
        load[list(path)] += rate
    assert np.all(load <= capacity * (1 + 1e-9))


@pytest.mark.parametrize("phase_size", [1, 10])
def test_network_matches_a_step_by_step_reference_on_random_traffic(phase_size):
    # A random 24-GPU graph; 150 transfers with random sizes and start latencies, each its own phase, or in
    # phases of 10 transfers of one size and latency (one cohort each, which splits as the rates part).
    rng = np.random.default_rng(3)
    graph = Wiring()
    names = [f"n{i}" for i in range(24)]
    for i in range(1, 24):
        add_link(graph, names[i], names[int(rng.integers(0, i))], bandwidth=float(rng.uniform(1, 20)) * GB,
                 latency=0.0, link_class="infiniband")
    for _ in range(10):
        a, b = rng.choice(24, size=2, replace=False)
        if not graph.has_edge(names[a], names[b]):
            add_link(graph, names[a], names[b], bandwidth=float(rng.uniform(1, 20)) * GB, latency=0.0,
                     link_class="ethernet")
    topo = Topology(name="random", wiring=graph, gpus=names, gpu_host=list(range(24)), gpu_local=[0] * 24)
    pairs = [tuple(int(gpu) for gpu in rng.choice(24, size=2, replace=False)) for _ in range(150)]
    paths = [topo.path(s, d) for s, d in pairs]
    sizes = np.repeat(rng.uniform(0.1, 5, size=150 // phase_size) * GB, phase_size)
    starts = np.repeat(np.where(rng.random(150 // phase_size) < 0.3, 0.0, rng.uniform(0, 2, size=150 // phase_size)),
                       phase_size)

    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    for first in range(0, 150, phase_size):
        net.run_phase([(paths[i], float(sizes[i]), float(starts[i]), *pairs[i])
                       for i in range(first, first + phase_size)], key=str(first // phase_size))
    env.run()
    frame = log.to_frame()
    got = sorted(zip(frame["key"], frame["src"], frame["dst"], frame["end_s"]))

    now, left, want = 0.0, sizes.copy(), {}
    while len(want) < 150:
        active = [i for i in range(150) if starts[i] <= now and i not in want]
        next_start = min((starts[i] for i in range(150) if starts[i] > now), default=np.inf)
        rates = reference_max_min([paths[i] for i in active], topo.link_bandwidth) if active else []
        step = min([next_start - now] + [left[i] / r for i, r in zip(active, rates)])
        now += step
        for i, r in zip(active, rates):
            left[i] -= r * step
            if left[i] <= 1e-9 * sizes[i]:
                want[i] = now
    want_rows = sorted((str(i // phase_size), *pairs[i], end) for i, end in want.items())
    assert [row[:3] for row in got] == [row[:3] for row in want_rows]
    assert [row[3] for row in got] == pytest.approx([row[3] for row in want_rows], rel=1e-8)
    assert net.resolves < 2 * 150


def test_a_phase_of_equal_transfers_keeps_one_heap_entry_while_their_rates_agree():
    # Star: 4 transfers of 1 GB on links of their own, 100 GB/s each: one cohort, one entry, all end at 10 ms.
    topo = star_topology(8)
    env = simpy.Environment()
    net = Network(env, topo)
    assert run_until_done(env, net.run_phase([(topo.path(i, 4 + i), 1 * GB, 0.0) for i in range(4)])) == 1e-2
    assert net.heap_entries == 1
    # Dumbbell: g0->g2 and g1->g3 share the 10 GB/s core (5 GB/s each), g0->g1 takes the 95 GB/s left on the
    # g0 edge: the cohort splits in two, one entry each; the core pair ends at 0.2 s, g0->g1 at 1/95 s.
    topo = dumbbell_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    run_until_done(env, net.run_phase([(topo.path(s, d), 1 * GB, 0.0, s, d) for s, d in ((0, 2), (1, 3), (0, 1))]))
    frame = log.to_frame()
    assert list(zip(frame["src"], frame["dst"])) == [(0, 1), (0, 2), (1, 3)]
    assert list(frame["end_s"]) == pytest.approx([1 / 95, 0.2, 0.2], rel=ROUNDING)
    assert net.heap_entries == 2


def test_identical_transfers_of_a_phase_are_logged_one_by_one_in_finish_then_posting_order():
    # a-b carries 10 GB/s, b-c 5 GB/s: the two 1 GB transfers a->b (the same path, bytes and latency: they
    # ride as one flow) get 5 GB/s each, the one b->c posted between them 5 GB/s, so all three are ready at
    # the same instant with the same float dust; the log keeps posting order a, b, a at 1 GB / 5 GB/s.
    graph = Wiring()
    add_link(graph, "a", "b", bandwidth=10 * GB, latency=0.0, link_class="nvlink")
    add_link(graph, "b", "c", bandwidth=5 * GB, latency=0.0, link_class="nvlink")
    topo = Topology(name="line", wiring=graph, gpus=["a", "b", "c"], gpu_host=[0, 1, 2], gpu_local=[0, 0, 0])
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    net.run_phase([(topo.path(0, 1), 1 * GB, 0.0, 0, 1, 0), (topo.path(1, 2), 1 * GB, 0.0, 1, 2, 0),
                   (topo.path(0, 1), 1 * GB, 0.0, 0, 1, 1)])
    env.run()
    frame = log.to_frame()
    assert list(frame["rank"]) == [0, 1, 0]
    assert list(frame["end_s"]) == [0.2, 0.2, 0.2] and env.now == pytest.approx(0.2, rel=ROUNDING)
    assert (net.resolves, net.resolved_flows, net.wake_ups) == (1, 3, 1)


def test_identical_transfers_cut_off_by_a_failed_link_each_continue_on_their_own_route():
    # g0 -> g1 over s0 - m0 - s1 or s0 - m1 - s1 (10 GB/s each). Two 1 GB transfers (channels 0 and 1)
    # share the first route at 5 GB/s; at 0.1 s s0-m0 fails with 0.5 GB left in each: both move to m1, each
    # on its own, keep 5 GB/s and end together at 0.2 s. A 1 GB transfer g1 -> g0 on the reverse route, alone at
    # 10 GB/s, ends at 0.1 s, at the failure.
    topo = diamond_topology()
    first = topo.path(0, 1, 0)
    assert first == topo.path(0, 1, 1) and topo.link_index[("s0", "m0")] in first
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    done = net.run_phase([(first, 1 * GB, 0.0, 0, 1, 0), (topo.path(1, 0), 1 * GB, 0.0, 1, 0, 0),
                          (first, 1 * GB, 0.0, 0, 1, 1)])
    fail_s0_m0_at(env, topo, net, 0.1)
    assert run_until_done(env, done) == pytest.approx(0.2, rel=ROUNDING)
    frame = log.to_frame()
    assert list(frame["rank"]) == [1, 0, 0]
    assert list(frame["end_s"]) == pytest.approx([0.1, 0.2, 0.2], rel=ROUNDING)
    detour = topo.link_index[("s0", "m1")]
    assert [detour in route for route in log.flow_routes()] == [False, True, True]
    assert net.wake_ups == 2  # the moved transfers still end together


def test_identical_transfers_still_in_their_latency_when_a_link_fails_start_apart_on_the_new_route():
    # The diamond: two 1 GB transfers g0 -> g1 (channels 0 and 1) wait 0.05 s of latency; s0-m0 fails at
    # 0.01 s, so both start on s0 - m1 - s1 as flows of their own, share its 10 GB/s and end at 0.05 + 0.2 s.
    topo = diamond_topology()
    first = topo.path(0, 1, 0)
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    done = net.run_phase([(first, 1 * GB, 0.05, 0, 1, 0), (first, 1 * GB, 0.05, 0, 1, 1)])
    fail_s0_m0_at(env, topo, net, 0.01)
    assert run_until_done(env, done) == pytest.approx(0.25, rel=ROUNDING)
    detour = topo.link_index[("s0", "m1")]
    assert [detour in route for route in log.flow_routes()] == [True, True]
    assert (net.resolves, net.resolved_flows, net.wake_ups) == (1, 2, 1)


@pytest.mark.parametrize(("mode", "phase_s"), [("flow", 1e-6 + 1 / (10 / 3)), ("analytic", 1e-6 + 3 / 10)])
def test_a_phase_parsed_once_and_posted_twice_runs_as_its_tuples_do(mode, phase_s):
    # Dumbbell: two identical 1 GB transfers g0 -> g2 and one g1 -> g3 share the 10 GB/s core (10/3 GB/s each
    # under max-min; the phase's 3 GB over it in analytic mode), after 1 us of latency; a GPU to itself finishes
    # after it.
    topo = dumbbell_topology()
    items = [(topo.path(0, 2), 1 * GB, 1e-6, 0, 2), (topo.path(1, 3), 1 * GB, 1e-6, 1, 3),
             (topo.path(0, 2), 1 * GB, 1e-6, 0, 2), (topo.path(0, 0), 0.0, 1e-6, 0, 0)]

    def rows(transfers):
        env = simpy.Environment()
        log = EventLog()
        net = Network(env, topo, log=log, mode=mode)

        def two_instances():
            yield net.run_phase(transfers, key="first")
            yield net.run_phase(transfers, key="second")

        env.process(two_instances())
        env.run()
        frame = log.to_frame()
        return env.now, frame[["name", "src", "dst", "start_s", "end_s", "bytes"]].values.tolist(), net.flows_simulated

    parsed = rows(Transfers(items))
    assert parsed == rows(items)
    assert parsed[0] == pytest.approx(2 * phase_s, rel=ROUNDING) and parsed[2] == 8


def test_a_component_met_again_with_the_same_sizes_reuses_its_solve_until_a_capacity_changes():
    # Three rounds of four 1 GB flows g0->g2 over the 10 GB/s core, each round ending at 4 * 0.1 s: the same
    # component each time, solved once; a degraded core (half) is solved anew and takes twice as long.
    topo = dumbbell_topology()
    env = simpy.Environment()
    net = Network(env, topo)

    def rounds():
        for _ in range(3):
            yield net.run_phase([(topo.path(0, 2), 1 * GB, 0.0)] * 2 + [(topo.path(1, 2), 1 * GB, 0.0)] * 2)
        net.scale_capacity([topo.link_index[("s0", "s1")]], 0.5)
        yield net.run_phase([(topo.path(0, 2), 1 * GB, 0.0)] * 2 + [(topo.path(1, 2), 1 * GB, 0.0)] * 2)

    env.run(env.process(rounds()))
    assert env.now == pytest.approx(3 * 0.4 + 0.8, rel=ROUNDING)
    assert (net.resolves, net.resolved_flows, net.max_min_solves) == (4, 16, 2)


def _rounds_on_the_core(net: Network, topo: Topology, counts: list[int], kept: list[int]):
    """Rounds of ``count`` 1 GB flows g0->g2 beside two g1->g3 over the 10 GB/s core (one component of two
    groups, all ending together); notes in ``kept`` how many rates are remembered after each round."""
    for count in counts:
        yield net.run_phase([(topo.path(0, 2), 1 * GB, 0.0)] * count + [(topo.path(1, 3), 1 * GB, 0.0)] * 2)
        assert net._solved_entries == sum(len(sizes) for _, sizes in net._solved)
        assert net._move_entries == sum(len(touched) + len(left_out)
                                        for (_, touched), (left_out, _) in net._moves.items())
        kept.append(net._solved_entries)


@pytest.mark.parametrize("entries, groups, solves", [(model.SOLVED_ENTRIES, model.CACHED_GROUPS, 3), (3, 4096, 6),
                                                     (1 << 22, 1, 6)])
def test_remembered_solves_stay_within_their_limits_and_give_the_same_times(monkeypatch, entries, groups, solves):
    # Six rounds meeting three components (1, 2, 3 flows beside 2) twice, each round (count + 2) * 0.1 s:
    # remembered (6 rates), the repeats are not solved again; with room for 3 rates (a solve keeps 2) each
    # solve is forgotten before the next, and components of more than one group are not kept at all.
    monkeypatch.setattr(model, "SOLVED_ENTRIES", entries)
    monkeypatch.setattr(model, "CACHED_GROUPS", groups)
    topo = dumbbell_topology()
    env = simpy.Environment()
    net = Network(env, topo)
    counts, kept = [1, 2, 3, 1, 2, 3], []
    env.run(env.process(_rounds_on_the_core(net, topo, counts, kept)))
    assert env.now == pytest.approx(sum(count + 2 for count in counts) * 0.1, rel=ROUNDING)
    assert max(kept) == min(entries - entries % 2, 6 if groups > 1 else 0)
    assert net.max_min_solves == solves


def test_idle_path_groups_are_dropped_when_a_capacity_changes():
    # A phase g0->g2 then one g1->g3, each alone on the core (0.1 s): both paths keep their groups while
    # idle; halving an edge link forgets the solves and the idle groups, and a later phase makes a new one.
    topo = dumbbell_topology()
    env = simpy.Environment()
    net = Network(env, topo)
    groups = []

    def phases():
        yield net.run_phase([(topo.path(0, 2), 1 * GB, 0.0)])
        yield net.run_phase([(topo.path(1, 3), 1 * GB, 0.0)])
        groups.append(len(net._groups))
        net.scale_capacity([topo.link_index[("g0", "s0")]], 0.5)
        groups.append(len(net._groups))
        yield net.run_phase([(topo.path(0, 2), 1 * GB, 0.0)])
        groups.append(len(net._groups))

    env.run(env.process(phases()))
    assert groups == [2, 0, 1]
    assert env.now == pytest.approx(0.3, rel=ROUNDING)


def star_topology(gpus: int) -> Topology:
    """``gpus`` GPUs g0, g1, ... each on a 100 GB/s NVLink to one switch s."""
    graph = Wiring()
    names = [f"g{index}" for index in range(gpus)]
    for name in names:
        add_link(graph, name, "s", bandwidth=100 * GB, latency=0.0, link_class="nvlink")
    return Topology(name="star", wiring=graph, gpus=names, gpu_host=list(range(gpus)), gpu_local=[0] * gpus)


def test_a_slow_flow_with_a_wide_tolerance_leaves_the_other_wake_ups_alone():
    # Star, 100 GB/s links. One link degraded to 1e-8 of it (1 kB/s) carries 1 GB: it would end at 1e6 s, its
    # tolerance 1e-3 s. k flows on links of their own end 1 us apart from 1 ms (each its bytes over 100 GB/s),
    # one per wake-up. One more flow alone, 100 GB/s x (1e6 - 5e-4) s of bytes, is ready long before it ends too:
    # it ends first, and the slow flow, ready 1e-3 s before its end, with it.
    k = 300
    topo = star_topology(2 * k + 4)
    slow, long = topo.path(2 * k, 2 * k + 1), topo.path(2 * k + 2, 2 * k + 3)
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    net.scale_capacity([slow[0]], 1e-8)
    ends = [1e-3 + index * 1e-6 for index in range(k)]
    long_end = 1e6 - 5e-4
    net.run_phase([(slow, 1 * GB, 0.0, 2 * k, 2 * k + 1), (long, 100 * GB * long_end, 0.0, 2 * k + 2, 2 * k + 3)]
                  + [(topo.path(index, k + index), 100 * GB * end, 0.0, index, k + index)
                     for index, end in enumerate(ends)])
    env.run()
    frame = log.to_frame()
    assert list(frame["src"]) == [*range(k), 2 * k + 2, 2 * k]
    assert list(frame["end_s"]) == pytest.approx([*ends, long_end, long_end], rel=ROUNDING)
    assert net.wake_ups == k + 1


def test_a_flow_moved_onto_a_running_group_as_it_finishes_leaves_the_group_rates_alone():
    # The diamond with s0-m0 at half capacity (5 GB/s): x, 0.5 GB over m0, ends at 0.1 s, the instant s0-m0
    # fails and moves it onto y's route over m1 (y: 10 GB alone at 10 GB/s, ending at 1.0 s). x finishes
    # there at once and y's rate never changes.
    topo = diamond_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    net.scale_capacity([topo.link_index[("s0", "m0")]], 0.5)
    fail_s0_m0_at(env, topo, net, 0.1)
    net.run_phase([(topo.path(0, 1, 0), 0.5 * GB, 0.0, 0, 1, 0)], key="x")
    net.run_phase([(diamond_detour(topo), 10 * GB, 0.0, 0, 1, 0)], key="y")
    env.run()
    assert end_times(log) == pytest.approx({"x": 0.1, "y": 1.0}, rel=ROUNDING)
    assert [topo.link_index[("s0", "m1")] in route for route in log.flow_routes()] == [True, True]  # x moved


def test_a_flow_whose_latency_ends_as_its_link_fails_starts_on_the_new_route():
    # The diamond: a 1 GB transfer g0 -> g1 over m0 waits 0.05 s of latency, and s0-m0 fails at 0.05 s. It
    # starts on s0 - m1 - s1, where a 2 GB flow has run alone since 0 (0.5 GB sent): they share 10 GB/s, so it
    # ends at 0.05 + 1 / 5 = 0.25 s and the other, 0.5 GB left then at 10 GB/s, at 0.3 s.
    topo = diamond_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    net.run_phase([(topo.path(0, 1, 0), 1 * GB, 0.05, 0, 1, 0)], key="moved")
    fail_s0_m0_at(env, topo, net, 0.05)
    net.run_phase([(diamond_detour(topo), 2 * GB, 0.0, 0, 1, 1)], key="other")
    env.run()
    assert end_times(log) == pytest.approx({"moved": 0.25, "other": 0.3}, rel=ROUNDING)
    assert [topo.link_index[("s0", "m1")] in route for route in log.flow_routes()] == [True, True]


def test_a_flow_finishes_within_its_tolerance_after_the_heap_is_compacted():
    # Line: a 30 GB flow on a-b (10 GB/s) shares it with 1,100 flows of 0.01 GB posted 1 ms after one another
    # ends (5 GB/s each, 2 ms): each rise of its rate leaves a stale heap entry behind the live one, so the
    # heap is compacted. It sends 0.02 GB per 3 ms, 22 GB by 3.3 s, and its last 8 GB alone, ending at 4.1 s.
    # Then b->a carries 1 GB (0.1 s) and b->c 0.1 GB * (1 + 0.5e-9) at 1 GB/s, half a tolerance later: it
    # ends with the first.
    topo = line_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    net.run_phase([(topo.path(0, 1), 30 * GB, 0.0, 0, 1)], key="long")
    heap_sizes = []

    def shorts():
        for _ in range(1100):
            heap_sizes.append(len(net._by_finish))
            yield net.run_phase([(topo.path(0, 1), 0.01 * GB, 0.0, 0, 1)], key="short")
            yield env.timeout(1e-3)
        yield env.timeout(4.1 - env.now)
        net.run_phase([(topo.path(1, 0), 1 * GB, 0.0, 1, 0), (topo.path(1, 2), 0.1 * GB * (1 + 0.5e-9), 0.0, 1, 2)],
                      key="last")

    env.process(shorts())
    env.run()
    frame = log.to_frame()
    assert max(heap_sizes) > 1024 > heap_sizes[-1]
    assert frame["end_s"].iloc[1099] == pytest.approx(3.3 - 1e-3, rel=1e-12)
    assert list(frame["key"].iloc[-3:]) == ["long", "last", "last"]
    assert list(frame["end_s"].iloc[-3:]) == pytest.approx([4.1, 4.2, 4.2], rel=1e-12)
    assert frame["end_s"].iloc[-1] == frame["end_s"].iloc[-2]


def test_a_collective_with_mirrors_is_parsed_once_and_posted_at_every_instance():
    # Dumbbell: a one-phase plan g0 -> g2 and its mirror g1 -> g3 run as one batch; both share the 10 GB/s
    # core, 1 GB each at 5 GB/s: 0.2 s an instance. The plan runner posts the same parsed batch each time,
    # and parses it again only when the routes change.
    topo = dumbbell_topology()
    plans = [[Phase((PhaseTransfer(0, 2, 1 * GB),))], [Phase((PhaseTransfer(1, 3, 1 * GB),))]]
    env = simpy.Environment()
    net = Network(env, topo)
    runner = PlanRunner(net, topo)
    posted = []
    run_phase = net.run_phase

    def recording(transfers, *, key="", load=None):
        posted.append(transfers)
        return run_phase(transfers, key=key, load=load)

    net.run_phase = recording

    def instances():
        yield from runner.run_plans(env, plans, "x")
        yield from runner.run_plans(env, plans, "x")
        topo.routes_version += 1
        yield from runner.run_plans(env, plans, "x")

    env.run(env.process(instances()))
    assert env.now == pytest.approx(0.6, rel=ROUNDING)
    assert all(isinstance(transfers, Transfers) and len(transfers) == 2 for transfers in posted)
    assert posted[0] is posted[1] and posted[2] is not posted[1]


def two_core_topology(per_side: int) -> tuple[Topology, list[str]]:
    """GPUs g0 .. on switch s0 and the next ``per_side`` on s1, 100 GB/s each; s0 and s1 joined over cores c0
    and c1 (100 GB/s each hop). Traffic goes over the core named in the returned list (switch it and forget
    the routes to route around a failed core)."""
    graph = Wiring()
    names = [f"g{index}" for index in range(2 * per_side)]
    for index, name in enumerate(names):
        add_link(graph, name, "s0" if index < per_side else "s1", bandwidth=100 * GB, latency=0.0,
                 link_class="nvlink")
    for core in ("c0", "c1"):
        add_link(graph, "s0", core, bandwidth=100 * GB, latency=0.0, link_class="infiniband")
        add_link(graph, core, "s1", bandwidth=100 * GB, latency=0.0, link_class="infiniband")
    topo = Topology(name="two-core", wiring=graph, gpus=names, gpu_host=list(range(2 * per_side)),
                    gpu_local=[0] * (2 * per_side))
    core = ["c0"]

    def route(_topo: Topology, src: int, dst: int, _channel: int) -> list[str]:
        ends = ["s0", "s1"] if src < per_side else ["s1", "s0"]
        middle = [ends[0]] if ends[0] == ("s0" if dst < per_side else "s1") else [ends[0], core[0], ends[1]]
        return [names[src], *middle, names[dst]]

    topo.router = route
    return topo, core


def test_a_link_shared_by_many_touched_groups_is_merged_once():
    # An incast of 3,000 GPUs into g0 over a star: 3,000 groups, each on its own uplink and on g0's downlink.
    # The component search takes the set of groups of each link once: 3,000 one-group uplink sets and the
    # downlink's set of 3,000 (taking the downlink's set for each group would merge 3,000 x 3,000 = 9 M).
    gpus = 3001
    topo = star_topology(gpus)
    link = topo.link_index
    env = simpy.Environment()
    net = Network(env, topo)
    net.run_phase([((link[(f"g{i}", "s")], link[("s", "g0")]), 1 * GB, 0.0) for i in range(1, gpus)])
    env.run(until=1e-9)
    groups = list(net._groups.values())
    taken: Counter[int] = Counter()

    class CountedSets(defaultdict):
        def get(self, key, default=None):
            taken[key] += 1
            return super().get(key, default)

        def __getitem__(self, key):
            taken[key] += 1
            return super().__getitem__(key)

    net._link_groups = CountedSets(set, net._link_groups)
    assert net._search(set(groups), set()) == sorted(groups, key=lambda group: group.number)
    assert len(taken) == gpus and set(taken.values()) == {1}


def test_a_cohort_partly_on_a_failed_link_moves_that_part_as_one_cohort():
    # g0 -> g3 and g1 -> g4 cross s0 -> c0 -> s1, g4 -> g1 and g5 -> g2 cross s1 -> c0 -> s0, g2 -> g0 and
    # g2 -> g1 stay under s0 (sharing g2's uplink): 1 GB each, one phase, two by two on a 100 GB/s hop, so all at
    # 50 GB/s, one cohort, one heap entry. At 5 ms s0-c0 fails (both ways): the four crossing it move to c1 with
    # 0.75 GB left, still two by two, as one cohort (one new entry, not one per flow), the two under s0 keep
    # theirs, and all end at 20 ms in one wake-up, the moved ones logged over c1.
    topo, core = two_core_topology(3)
    link = topo.link_index
    pairs = [(0, 3), (1, 4), (4, 1), (5, 2), (2, 0), (2, 1)]
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    done = net.run_phase([(topo.path(s, d), 1 * GB, 0.0, s, d, 0) for s, d in pairs])

    def fail():
        yield env.timeout(5e-3)
        core[0] = "c1"
        topo.forget_routes()
        net.take_down([link[("s0", "c0")], link[("c0", "s0")]])

    env.process(fail())
    assert run_until_done(env, done) == 0.02
    frame = log.to_frame()
    assert list(frame["end_s"]) == [0.02] * 6
    over_c1 = {link[("s0", "c1")], link[("c1", "s0")]}
    assert [bool(over_c1 & set(route)) for route in log.flow_routes()] == [True] * 4 + [False] * 2
    assert [len(route) for route in log.flow_routes()][4:] == [2, 2]
    assert (net.heap_entries, net.wake_ups) == (2, 1)


def test_a_phase_runs_to_the_last_bit_as_its_transfers_posted_one_by_one_through_faults():
    # Two-core fabric, 4 GPUs a side: 40 transfers of 0.5 or 1 GB (some repeated: twins), latency 0 or 1 ms,
    # across and within the sides. At 3 ms s0-c0 fails and traffic moves to c1; at 7 ms s1 -> c1 keeps 30%.
    # Posted as one phase (cohorts, twins) or as 40 single-transfer phases, every end time and route is equal.
    rng = np.random.default_rng(11)
    pairs = [tuple(int(gpu) for gpu in rng.choice(8, size=2, replace=False)) for _ in range(32)]
    sizes = rng.choice([0.5, 1.0], size=32) * GB
    latencies = rng.choice([0.0, 1e-3], size=32)
    repeated = rng.choice(32, size=8, replace=False)
    order = [*range(32), *repeated.tolist()]

    def run(one_phase: bool) -> list[tuple]:
        topo, core = two_core_topology(4)
        link = topo.link_index
        env = simpy.Environment()
        log = EventLog()
        net = Network(env, topo, log=log)
        items = [(topo.path(*pairs[i]), float(sizes[i]), float(latencies[i]), *pairs[i], 0) for i in order]
        for item in [items] if one_phase else [[item] for item in items]:
            net.run_phase(item)

        def faults():
            yield env.timeout(3e-3)
            core[0] = "c1"
            topo.forget_routes()
            net.take_down([link[("s0", "c0")], link[("c0", "s0")]])
            yield env.timeout(4e-3)
            net.scale_capacity([link[("s1", "c1")]], 0.3)

        env.process(faults())
        env.run()
        frame = log.to_frame()
        return sorted(zip(frame["src"], frame["dst"], frame["end_s"], map(tuple, log.flow_routes())))

    together, apart = run(True), run(False)
    assert len(together) == 40 and len({row[2] for row in together}) > 5
    assert together == apart


def recounted_max_min(paths: list[tuple[int, ...]], weight: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Progressive filling that recounts every link's load from the unfrozen groups each round (the solver
    before 2026-12), on the same arithmetic: the incremental solver must equal it to the last bit."""
    rate = np.full(len(paths), np.inf)
    unfrozen = {g for g, path in enumerate(paths) if path}
    remaining = {link: float(capacity[link]) for path in paths for link in path}
    while unfrozen:
        load: dict[int, float] = {}
        for g in sorted(unfrozen):
            for link in paths[g]:
                load[link] = load.get(link, 0.0) + weight[g]
        share = {link: max(remaining[link], 0.0) / load[link] for link in load}
        level = min(share.values())
        saturated = {link for link, value in share.items() if value <= level * (1.0 + 1e-12)}
        freezing = {g for g in unfrozen if saturated.intersection(paths[g])}
        frozen_load: dict[int, float] = {}
        for g in freezing:
            rate[g] = level
            for link in paths[g]:
                frozen_load[link] = frozen_load.get(link, 0.0) + weight[g]
        for link in load:
            remaining[link] -= level * frozen_load.get(link, 0.0)
        unfrozen -= freezing
    return rate


def test_incremental_max_min_equals_a_recount_of_every_round_to_the_bit():
    # Few distinct capacities (ties within a round), one of them degraded to an odd fraction, many levels.
    rng = np.random.default_rng(11)
    for _ in range(40):
        links = int(rng.integers(5, 60))
        capacity = rng.choice([50 * GB, 25 * GB, 450 * GB], size=links)
        capacity[int(rng.integers(links))] *= 0.37
        paths = [tuple(rng.choice(links, size=int(rng.integers(0, min(links, 6))), replace=False).tolist())
                 for _ in range(int(rng.integers(1, 200)))]
        weight = rng.integers(1, 9, size=len(paths)).astype(float)
        assert grouped_max_min_rates(paths, weight, capacity).tolist() == recounted_max_min(paths, weight, capacity
                                                                                            ).tolist()


def test_fractional_weights_end_the_solve_at_a_plain_recounts_rates():
    # Subtracting fractional weights leaves a residue on a link whose groups are all frozen; it won the minimum
    # share again and again, freezing nothing (the solve never ended).
    paths = [(4, 6), (3,), (0,), (0, 5), (4,), (6,), (3, 4), (1, 5)]
    weight = np.array([1.625, 1.618, 0.358, 2.948, 1.757, 0.119, 2.341, 2.937])
    capacity = np.array([0.672, 0.456, 0.35, 0.738, 0.356, 0.662, 0.682])
    assert grouped_max_min_rates(paths, weight, capacity) == pytest.approx(recounted_max_min(paths, weight,
                                                                                             capacity), rel=1e-12)


def test_groups_of_weight_zero_are_left_out_of_a_solve():
    # network/isolated.py indexes a phase's routes once and solves the active ones by giving the others weight 0.
    rng = np.random.default_rng(5)
    capacity = rng.choice([50 * GB, 12.5 * GB], size=40)
    paths = [tuple(rng.choice(40, size=4, replace=False).tolist()) for _ in range(300)]
    weight = rng.integers(0, 3, size=300).astype(float)
    lengths = np.full(300, 4)
    solved = Incidence.of(lengths, np.array(paths).reshape(-1)).rates(weight, capacity)
    kept = np.flatnonzero(weight > 0)
    assert solved[kept].tolist() == grouped_max_min_rates([paths[g] for g in kept], weight[kept], capacity).tolist()


@pytest.mark.parametrize("links", [40, 60_000, 2_000_000])
def test_incidence_numbers_and_sorts_links_as_unique_and_a_stable_sort_do(links):
    # The index numbers the crossed links by marking them (ids dense in their range) or sorting them (spread
    # thin) and sorts entries by an unsigned 16-bit radix sort where the compact ids fit (~48,000 crossed links
    # use the top bit), a 64-bit sort where they do not (~97,000); all must give np.unique's ids and the one
    # stable order.
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 6, size=40_000)
    entry_link = rng.integers(0, links, size=int(lengths.sum()))
    incidence = Incidence.of(lengths, entry_link)
    assert (incidence.links.size > 1 << 16) == (links > 100_000)
    ids, compact = np.unique(entry_link, return_inverse=True)
    assert incidence.links.tolist() == ids.tolist()
    assert incidence.entry_link.tolist() == compact.reshape(-1).tolist()
    assert incidence.by_link.tolist() == np.argsort(compact.reshape(-1), kind="mergesort").tolist()


def random_tree_topology(rng: np.random.Generator, nodes: int) -> Topology:
    """``nodes`` GPUs, each linked to a random earlier one (1-20 GB/s) and a few extra links (a graph with
    cycles whose routes share links unevenly)."""
    graph = Wiring()
    names = [f"n{i}" for i in range(nodes)]
    for i in range(1, nodes):
        add_link(graph, names[i], names[int(rng.integers(0, i))], bandwidth=float(rng.uniform(1, 20)) * GB,
                 latency=0.0, link_class="infiniband")
    for _ in range(nodes // 3):
        a, b = rng.choice(nodes, size=2, replace=False)
        if not graph.has_edge(names[a], names[b]):
            add_link(graph, names[a], names[b], bandwidth=float(rng.uniform(1, 20)) * GB, latency=0.0,
                     link_class="ethernet")
    return Topology(name="random", wiring=graph, gpus=names, gpu_host=list(range(nodes)), gpu_local=[0] * nodes)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_remembered_component_moves_give_the_searches_rows_to_the_bit(monkeypatch, seed):
    # Six random all-to-all-like shapes (4-7 GPUs of 24, each pair's bytes drawn, some paths twice with other
    # bytes) posted one after another by four streams, two of them the same shapes at other offsets, so that
    # components meet, split and join again and the streams repeat their moves; a link degraded mid-run.
    # Remembered moves and solves must give every row of the searches and fresh solves to the last bit.
    rng = np.random.default_rng(seed)
    topo = random_tree_topology(rng, 24)
    shapes = []
    for _ in range(6):
        gpus = rng.choice(24, size=int(rng.integers(4, 8)), replace=False).tolist()
        pairs = [(a, b) for a in gpus for b in gpus if a != b and rng.random() < 0.6]
        pairs += [pairs[int(i)] for i in rng.choice(len(pairs), size=len(pairs) // 4)]
        shapes.append([(topo.path(a, b), float(rng.uniform(0.1, 2)) * GB, 0.0, a, b) for a, b in pairs])
    streams = [(rng.permutation(6).tolist() * 3, float(rng.uniform(0, 0.3))) for _ in range(2)]
    streams += [(order, offset + float(rng.uniform(0.05, 0.5))) for order, offset in streams]
    degraded = int(rng.integers(0, topo.link_bandwidth.size))

    remembered, net = _streamed(topo, shapes, streams, degraded)
    monkeypatch.setattr(model, "CACHED_GROUPS", 0)
    searched, plain = _streamed(topo, shapes, streams, degraded)
    assert plain.max_min_solves == plain.resolves == net.resolves > net.max_min_solves
    assert net.searches < 0.9 * plain.searches
    assert remembered == searched


def _streamed(topo, shapes: list[list[tuple]], streams: list[tuple[list[int], float]],
              degraded: int | None = None) -> tuple[list[tuple], Network]:
    """Run ``streams`` (each an order of ``shapes`` posted one after another from its offset) on ``topo``, with
    link ``degraded`` halved at 1 s where given: the log's rows (key, src, dst, start, end) sorted, and the
    network, for its counters."""
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)

    def stream(order: list[int], offset: float, name: int):
        yield env.timeout(offset)
        for step, shape in enumerate(order):
            yield net.run_phase(shapes[shape], key=f"{name}.{step}")

    def degrade(link: int):
        yield env.timeout(1.0)
        net.scale_capacity([link], 0.5)

    for name, (order, offset) in enumerate(streams):
        env.process(stream(order, offset, name))
    if degraded is not None:
        env.process(degrade(degraded))
    env.run()
    frame = log.to_frame()
    return sorted(zip(frame["key"], frame["src"], frame["dst"], frame["start_s"], frame["end_s"])), net


@pytest.mark.parametrize("cached_groups", [model.CACHED_GROUPS, 0])
def test_a_remembered_move_answers_only_for_groups_still_on_their_links(monkeypatch, cached_groups):
    # Dumbbell. Path g0->g1 (g0-s0, s0-g1) runs two 1 GB flows, the second from 1 ms: its group grows, then
    # shrinks as the first ends at 19 ms (a remembered move: the group alone), and leaves its links as the
    # second ends at 20 ms. At 0.1 s a long g0->g2 flow takes g0-s0 beside the idle path, bound to 10 GB/s by the
    # core; at 0.2 s a new 1 GB flow g0->g1 gets the 90 GB/s left on g0-s0 (ends at 0.2 + 1/90 s), not 100 as
    # alone: its group left its links, so the move remembered from its old answer does not hold. A 4 GB flow
    # g2->g3 from 0.5 ms has its g2-s1 halved as the second g0->g1 flow starts: that search starts from the
    # touched link too, and its answer is no move of the g0->g1 group's (ends at 1 ms + 3.95 GB / 50 GB/s).
    monkeypatch.setattr(model, "CACHED_GROUPS", cached_groups)
    topo = dumbbell_topology()
    env = simpy.Environment()
    log = EventLog()
    net = Network(env, topo, log=log)
    near = topo.path(0, 1)

    def flows():
        net.run_phase([(near, 1 * GB, 0.0, 0, 1)], key="first")
        net.run_phase([(near, 1 * GB, 1e-3, 0, 1)], key="second")
        net.run_phase([(topo.path(2, 3), 4 * GB, 0.5e-3, 2, 3)], key="aside")
        yield env.timeout(1e-3)
        net.scale_capacity([topo.link_index[("g2", "s1")]], 0.5)
        yield env.timeout(0.099)
        net.run_phase([(topo.path(0, 2), 10 * GB, 0.0, 0, 2)], key="long")
        yield env.timeout(0.1)
        yield net.run_phase([(near, 1 * GB, 0.0, 0, 1)], key="late")

    env.run(env.process(flows()))
    ends = end_times(log)
    assert ends["late"] == pytest.approx(0.2 + 1 / 90, rel=ROUNDING)
    assert [ends[key] for key in ("first", "second", "aside")] == pytest.approx([0.019, 0.020, 0.08], rel=ROUNDING)


@pytest.mark.parametrize("moves", [model.MOVE_ENTRIES, 8])
def test_idents_and_moves_leave_the_remembered_rates_their_room(monkeypatch, moves):
    # A star of 8 GPUs (100 GB/s links) runs the same all-to-all of 56 flows, all of other sizes, four times:
    # the first makes 55 solves (the last flow alone meets the 1-group component it met before), of 1,589 rates
    # in all. With room for 3,000 rates the three repeats are answered from them, as they were before the sets'
    # idents and the moves were remembered (their entries, counted in the same room, made it forget each round);
    # moves that overflow their own room (8 entries) are forgotten alone.
    monkeypatch.setattr(model, "SOLVED_ENTRIES", 3000)
    monkeypatch.setattr(model, "MOVE_ENTRIES", moves)
    gpus = 8
    topo = star_topology(gpus)
    items = [(topo.path(a, b), (1 + 0.01 * (a * gpus + b)) * GB, 0.0) for a in range(gpus) for b in range(gpus)
             if a != b]
    env = simpy.Environment()
    net = Network(env, topo)

    def rounds():
        for _ in range(4):
            yield net.run_phase(items)

    env.run(env.process(rounds()))
    assert (net.resolves, net.max_min_solves, net._solved_entries) == (220, 55, 1589)
    assert net._move_entries <= moves


def _two_dgx_h100_step(tmp_path, capsys, *overrides: str) -> tuple[dict, str]:
    """The summary and the warnings of the 2-host DGX H100 step of Llama 3 8B at TP 8 under ``overrides``."""
    import json

    from simulator.cli import main

    out = tmp_path / "-".join(overrides).replace("=", "_").replace(".", "_")
    step = ["--set", "cluster.topology=dgx-h100-cluster", "--set", "cluster.nodes=2", "--set", "parallelism.tp=8",
            "--set", "training.global_batch=8", *[part for field in overrides for part in ("--set", field)]]
    assert main(["run", str(SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"), *step, "--out", str(out), "--quiet"]) == 0
    return json.loads((out / "summary.json").read_text()), capsys.readouterr().err


@pytest.mark.parametrize("parallel, comm", [(("parallelism.dp=2",), "dp"),
                                            (("parallelism.dp=1", "parallelism.pp=2"), "pp")], ids=["dp", "pp"])
def test_analytic_shares_a_nic_among_a_collectives_copies_folded_or_not(tmp_path, capsys, parallel, comm):
    """On two one-NIC DGX H100 hosts at TP 8 the 8 TP ranks' copies of each DP reduce-scatter and all-gather (DP 2:
    514.8 ms of comm_s.dp) and of each pipeline hand-off (PP 2: 12.13 ms of comm_s.pp) leave through the one NIC
    together: analytic shares it among them as the flow model does, to 1e-9, and the same whether the ranks fold or
    not, without a warning."""
    one_nic = ("cluster.nics_per_node=1", *parallel)
    flow, _ = _two_dgx_h100_step(tmp_path, capsys, *one_nic, "network.model=flow")
    folded, warned = _two_dgx_h100_step(tmp_path, capsys, *one_nic, "network.model=analytic")
    unfolded, _ = _two_dgx_h100_step(tmp_path, capsys, *one_nic, "network.model=analytic", "run.fold=false")
    assert folded["comm_s"][comm] == pytest.approx(flow["comm_s"][comm], rel=1e-9)
    assert folded["comm_s"][comm] == pytest.approx({"dp": 0.5148, "pp": 0.01213}[comm], rel=1e-3)
    assert (unfolded["comm_s"], unfolded["step_time_s"]) == (folded["comm_s"], folded["step_time_s"])
    assert "network.model" not in warned


def test_analytic_copies_share_a_nic_where_a_link_fault_unfolds_the_step(tmp_path, capsys):
    """The one NIC's link to the leaf at 99.9% of its bandwidth unfolds the analytic step (link faults fold on the
    flow model only): its 8 DP copies still share the NIC, so comm_s.dp moves by about that 0.1% (515.3 ms against
    514.8), not back to one copy's time at the NIC's full rate (66.3 ms)."""
    one_nic = ("cluster.nics_per_node=1", "parallelism.dp=2", "network.model=analytic")
    healthy, _ = _two_dgx_h100_step(tmp_path, capsys, *one_nic)
    faulty, _ = _two_dgx_h100_step(tmp_path, capsys, *one_nic,
                                   "faults.step.links=[{link: [h1/nic0, leaf0.r0], capacity: 0.999}]")
    assert "fold_off_reason" in faulty
    assert faulty["comm_s"]["dp"] == pytest.approx(healthy["comm_s"]["dp"], rel=2e-3)
    assert faulty["comm_s"]["dp"] == pytest.approx(0.5153, rel=1e-3)


def test_analytic_times_copies_on_their_own_nics_as_each_alone(tmp_path, capsys):
    """With a NIC per GPU (the DGX H100's 8, one per rail) the 8 TP ranks' DP copies cross no link in common: each
    takes the NIC's full rate, 66.2 ms of comm_s.dp, whether the ranks fold or not. The figures are pinned byte for
    byte: these copies meet on no link, so sharing links must not move them."""
    for fold in ("true", "false"):
        summary, _ = _two_dgx_h100_step(tmp_path, capsys, "parallelism.dp=2", "network.model=analytic",
                                        f"run.fold={fold}")
        assert (summary["comm_s"]["dp"], summary["step_time_s"]) == (0.06620470314893673, 0.31635003011603063)


@pytest.mark.parametrize("tp, pp, nics, stages", [(1, 8, 1, 8), (4, 2, 1, 2), (1, 8, 8, None), (8, 1, 1, None)])
def test_analytic_warns_where_different_stages_collectives_share_a_nic(capsys, tp, pp, nics, stages):
    """Analytic shares a NIC among one collective's copies (one stage's groups), not among different pipeline
    stages' collectives: on two one-NIC DGX H100 hosts at tp 1, pp 8, dp 2 each host's 8 stages' DP groups
    leave through its one NIC, comm_s.dp 64.5 ms against the flow model's 309.3 ms. One warning at
    `network.model` names the stages per NIC and the other overrides the check read; with a NIC per GPU, or one
    stage a host (TP 8, whose 8 DP groups are copies, counted), none."""
    from simulator.cli import main

    step = ["--set", "cluster.topology=dgx-h100-cluster", "--set", "cluster.nodes=2", "--set",
            f"cluster.nics_per_node={nics}", "--set", f"parallelism.tp={tp}", "--set", f"parallelism.pp={pp}",
            "--set", "parallelism.dp=2", "--set", "training.global_batch=16", "--set", "network.model=analytic"]
    assert main(["validate", str(SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"), *step, "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "share a NIC uncounted" in line]
    assert warned == ([] if stages is None else [
        "warning: command line: trainsim validate: --set network.model=analytic: analytic shares a link among the "
        "copies of one collective (one pipeline stage's groups) but not among different stages' collectives, and "
        f"host 0's DP groups of {stages} pipeline stages leave it through 1 NIC: up to {stages} stages' collectives "
        f"share a NIC uncounted, so the analytic figures may overstate its rate by up to {stages}x (with --set "
        f"cluster.topology=dgx-h100-cluster, --set cluster.nodes=2, --set cluster.nics_per_node={nics}, --set "
        f"parallelism.tp={tp}, --set parallelism.pp={pp}, --set parallelism.dp=2) (allowed: network.model: flow, "
        "which shares each NIC among all the traffic that crosses it)"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rounds_over_masks_and_over_index_ranges_give_the_same_rates_to_the_bit(monkeypatch, seed):
    # Few distinct capacities (ties within a round), one degraded to an odd fraction; whole, zero and fractional
    # weights (the last leave residues on links whose groups are all frozen).
    rng = np.random.default_rng(seed)
    for trial in range(30):
        links = int(rng.integers(5, 80))
        capacity = rng.choice([50 * GB, 25 * GB, 450 * GB], size=links)
        capacity[int(rng.integers(links))] *= 0.37
        paths = [tuple(rng.choice(links, size=int(rng.integers(0, min(links, 6))), replace=False).tolist())
                 for _ in range(int(rng.integers(1, 300)))]
        weight = rng.integers(0, 9, size=len(paths)).astype(float)
        if trial % 3 == 0:
            weight *= rng.uniform(0.1, 1.0, size=len(paths))
        solved = {}
        for entries in (1 << 30, -1):
            monkeypatch.setattr(maxmin, "DENSE_ENTRIES", entries)
            solved[entries] = grouped_max_min_rates(paths, weight, capacity).tobytes()
        assert solved[1 << 30] == solved[-1]


@pytest.mark.parametrize("entries", [1 << 30, -1])
@pytest.mark.parametrize(("weight", "capacity", "cause"), [
    ([1, 2], [1e9, np.nan], "capacity of link id 1 is nan"),
    ([np.inf, 2], [np.inf, 1e9], "capacity of link id 0 is inf; weight of group 0 is inf"),
])
def test_a_fill_whose_lowest_share_is_nan_names_the_cause_instead_of_looping(monkeypatch, entries, weight,
                                                                               capacity, cause):
    # A NaN share saturates no link; an alarm turns a fill that never ends into a failure.
    monkeypatch.setattr(maxmin, "DENSE_ENTRIES", entries)

    def stuck(signum, frame):
        raise TimeoutError("the fill was still running after 5 s")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(5)
    try:
        with pytest.raises(ValueError, match=re.escape(f"at the lowest fair share (nan bytes/s): {cause} (")):
            grouped_max_min_rates([(0, 1), (1,)], np.array(weight, dtype=float), np.array(capacity))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def plain_reach(paths: list[tuple[int, ...]], seeds: list[int], active: list[bool]) -> set[int]:
    """The active groups the seeds' links reach, one link and one group at a time."""
    links = {link for seed in seeds for link in paths[seed]}
    reached: set[int] = set()
    while True:
        fresh = {g for g, path in enumerate(paths) if active[g] and g not in reached and links.intersection(path)}
        if not fresh:
            return reached
        reached |= fresh
        links.update(link for g in fresh for link in paths[g])


def test_solves_within_the_mask_rounds_limit_never_sort_the_crossings_by_link(monkeypatch):
    # Rounds over masks read no entries sorted by link, so neither the index nor its cuts sort them (one sort
    # per re-solve of an unfolded EP 16 all-to-all's component); past DENSE_ENTRIES crossings the rounds over
    # index ranges sort them once, and a cut of that index derives its own without sorting again.
    sorts = Counter()
    argsort = np.argsort

    def counted(*args, **kwargs):
        sorts["argsort"] += 1
        return argsort(*args, **kwargs)

    monkeypatch.setattr(np, "argsort", counted)
    rng = np.random.default_rng(5)
    capacity = rng.choice([50 * GB, 12.5 * GB], size=60)
    paths = [tuple(rng.choice(60, size=3, replace=False).tolist()) for _ in range(120)]
    lengths = np.full(len(paths), 3)
    weight = rng.integers(1, 5, size=len(paths)).astype(float)
    kept = rng.random(len(paths)) < 0.7
    whole = Incidence.of(lengths, np.concatenate(paths))
    whole.rates(weight, capacity)
    whole.subset(kept).rates(weight[kept], capacity)
    assert sorts["argsort"] == 0
    monkeypatch.setattr(maxmin, "DENSE_ENTRIES", 100)
    whole = Incidence.of(lengths, np.concatenate(paths))
    whole.rates(weight, capacity)
    whole.subset(kept).rates(weight[kept], capacity)
    assert sorts["argsort"] == 1


@pytest.mark.parametrize("entries", [1 << 30, -1])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_incidence_cut_to_some_groups_solves_and_reaches_as_one_built_for_them(monkeypatch, seed, entries):
    # Sparse random paths over 200 links split the groups into several components; a cut keeps a random part
    # of the groups (its index keeps the links no kept group crosses). Solved by rounds over masks and over
    # index ranges (the latter read the cut's entries sorted by link).
    monkeypatch.setattr(maxmin, "DENSE_ENTRIES", entries)
    rng = np.random.default_rng(seed)
    capacity = rng.choice([50 * GB, 12.5 * GB, 100 * GB], size=200) * rng.uniform(0.5, 1.0, size=200)
    paths = [tuple(rng.choice(200, size=int(rng.integers(1, 4)), replace=False).tolist()) for _ in range(150)]
    lengths = np.array([len(path) for path in paths])
    whole = Incidence.of(lengths, np.concatenate(paths))
    for _ in range(20):
        kept = rng.random(150) < rng.uniform(0.2, 1.0)
        kept_paths = [path for path, keep in zip(paths, kept) if keep]
        cut = whole.subset(kept)
        built = Incidence.of(lengths[kept], np.concatenate(kept_paths))
        weight = rng.integers(1, 5, size=len(kept_paths)).astype(float)
        assert cut.rates(weight, capacity).tobytes() == built.rates(weight, capacity).tobytes()
        active = rng.random(len(kept_paths)) < 0.8
        seeds = rng.choice(len(kept_paths), size=3).tolist()
        reached = cut.reached(np.array(seeds), active)
        assert set(np.flatnonzero(reached).tolist()) == plain_reach(kept_paths, seeds, active.tolist())


@pytest.mark.parametrize("entries", [1 << 30, -1])
@pytest.mark.parametrize("seed", [1, 2])
def test_components_found_within_their_home_give_the_plain_searches_rows_to_the_bit(monkeypatch, seed, entries):
    # All-to-all-like shapes (4-7 GPUs of 24, each pair's bytes drawn) posted one after another by three
    # streams at other offsets: components meet, split and join. Where every touched group has one home, the
    # component is found within the home's incidence and solved on the home's incidence cut to it; finding it
    # by the set search and solving on an index built from its paths must give every row to the last bit,
    # whether rounds take masks or index ranges (the latter read the cut's entries sorted by link).
    monkeypatch.setattr(maxmin, "DENSE_ENTRIES", entries)
    rng = np.random.default_rng(seed)
    topo = random_tree_topology(rng, 24)
    shapes = []
    for _ in range(5):
        gpus = rng.choice(24, size=int(rng.integers(4, 8)), replace=False).tolist()
        pairs = [(a, b) for a in gpus for b in gpus if a != b and rng.random() < 0.7]
        shapes.append([(topo.path(a, b), float(rng.uniform(0.1, 2)) * GB, 0.0, a, b) for a, b in pairs])
    streams = [(rng.permutation(5).tolist() * 2, float(rng.uniform(0, 0.3))) for _ in range(3)]

    def run() -> list[tuple]:
        return _streamed(topo, shapes, streams)[0]

    within = Counter()
    found_within = Network._within

    def counted(self, home, touched):
        within["calls"] += 1
        return found_within(self, home, touched)

    monkeypatch.setattr(Network, "_within", counted)
    fast = run()

    def searched(self, home, touched):
        found = set(self._search(touched, set()))
        assert found <= set(home.groups), "a component search left its home"
        return np.array([group in found for group in home.groups], dtype=bool)

    monkeypatch.setattr(Network, "_within", searched)
    monkeypatch.setattr(model, "_cut", lambda home, kept: None)
    assert within["calls"] > 100
    assert fast == run()
