"""Faults inside a step: stragglers against the 1F1B closed form, folding kept exact, link failures rerouted or
aborting the step, GPU failures, the Python API for the job simulation, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from shared import (
    ALLREDUCE_BYTES,
    ALTERNATING,
    CP_FABRIC_TEMPLATE,
    DP_FABRIC,
    FABRIC_HAND_OFFS,
    SPINES,
    STRAGGLER_PIPELINE,
    WRAP_ON_UNLIKE_SPINES,
    allreduce_time,
    assert_same_figures,
    run,
    two_rank_scenario,
)

from simulator import simulate
from simulator.cli import main
from simulator.config.faults import GpuFailure, LinkFault, StepFaults, Straggler
from simulator.config.loader import scenario_from_text
from simulator.engine.fold_policy import SHARED_LINKS
from simulator.errors import StepAborted
from simulator.parallel.layout import Layout
from simulator.reliability.perturbed import perturbed_step
from simulator.schedules.registry import build_schedule
from simulator.simulation import prepare_training, step_faults
from simulator.topology.loader import scenario_topology
from simulator.units import seconds_alike

F, B = 1e-3, 2e-3
def one_slow_stage(p: int, m: int, k: int, factor: float) -> float:
    """1F1B with stage k's forward and backward ``factor`` times longer: the longest of two chains per stage j.
    Warm-up bound: the first micro-batch's forwards reach j, j is busy m (F_j + B_j), the last backward drains
    back to stage 0: sum_{i<j} (F_i + B_i) + m (F_j + B_j). Backward bound: j's first backward waits for the
    round trip of micro-batch 0 through the stages after it, then j is busy with its m backwards and its
    m - (p - j) remaining forwards: sum_{i != j} (F_i + B_i) + (m - p + j + 1) F_j + m B_j.
    Uniform stages give (m + p - 1)(F + B); a stage slowed 2x or more is always the binding j."""
    fs = [F * (factor if i == k else 1) for i in range(p)]
    bs = [B * (factor if i == k else 1) for i in range(p)]
    chains = []
    for j in range(p):
        chains.append(sum(fs[i] + bs[i] for i in range(j)) + m * (fs[j] + bs[j]))
        chains.append(sum(fs[i] + bs[i] for i in range(p) if i != j) + (m - p + j + 1) * fs[j] + m * bs[j])
    return max(chains)


def critical_path(p: int, m: int, k: int, factor: float) -> float:
    """The 1F1B action graph with per-stage durations, each action started when its stage is free and its
    input is there (an independent longest-path reference for factors where chains mix)."""
    schedule = build_schedule("1f1b", p, m, 1)
    done: dict[tuple[str, int, int], float] = {}
    free, index = [0.0] * p, [0] * p
    while any(index[s] < len(schedule[s]) for s in range(p)):
        for s in range(p):
            while index[s] < len(schedule[s]):
                action = schedule[s][index[s]]
                kind = "F" if action.kind == "F" else "B"
                deps = ([("F", action.microbatch, s - 1)] if s > 0 else []) if kind == "F" else \
                    [("F", action.microbatch, s)] + ([("B", action.microbatch, s + 1)] if s < p - 1 else [])
                if any(dep not in done for dep in deps):
                    break
                duration = (F if kind == "F" else B) * (factor if s == k else 1)
                free[s] = max([free[s]] + [done[dep] for dep in deps]) + duration
                done[(kind, action.microbatch, s)] = free[s]
                index[s] += 1
    return max(free)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 13), (8, 16)])
@pytest.mark.parametrize("factor", [2, 3])
def test_a_straggler_stage_slows_1f1b_as_its_chains_predict(p, m, factor):
    dp = 8 // p
    for k in range(p):
        gpu = k + p * (dp - 1)  # stage k of the last data-parallel replica (rank = stage + p x replica)
        text = STRAGGLER_PIPELINE.format(p=p, m=m, dp=dp, gpu=gpu, factor=factor, fold="true")
        result = simulate(scenario_from_text(text))
        assert result.summary["step_time_s"] == pytest.approx(one_slow_stage(p, m, k, factor), rel=1e-9)
        # one replica: nothing to fold it onto; two: the slow replica's ranks and the other's are every rank
        assert result.summary["folded"] is (dp == 1)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_mildly_slow_stage_matches_the_critical_path(k):
    result = simulate(scenario_from_text(STRAGGLER_PIPELINE.format(p=4, m=8, dp=2, gpu=k, factor=1.25, fold="false")))
    assert result.summary["step_time_s"] == pytest.approx(critical_path(4, 8, k, 1.25), rel=1e-9)
    assert critical_path(4, 8, k, 1.25) > one_slow_stage(4, 8, k, 1.25)  # chains mix: the formula is a bound


def test_a_swing_scales_each_kernel_by_the_factor_at_its_start():
    text = """
cluster: {topology: dgx-h100-cluster, nodes: 1}
model: {synthetic: {stages: 1, forward: 1 ms, backward: 2 ms}}
training: {microbatches: 1}
parallelism: {dp: 8}
faults: {step: {stragglers: [{gpus: all, slowdown: 1, swing: {amplitude: 0.5, period: 4 ms}}]}}
"""
    # forward at t = 0: 1 + 0.5 sin 0 = 1; backward at t = 1 ms, a quarter period: 1 + 0.5 sin(pi/2) = 1.5
    result = simulate(scenario_from_text(text))
    assert result.summary["step_time_s"] == pytest.approx(1e-3 + 1.5 * 2e-3, rel=1e-12)
    diurnal = text.replace("slowdown: 1, swing: {amplitude: 0.5, period: 4 ms}",
                           "slowdown: 1, swing: {amplitude: 0.02, period: 24 h, phase: 6 h}")
    assert simulate(scenario_from_text(diurnal)).summary["step_time_s"] == pytest.approx(1.02 * 3e-3, rel=1e-9)


TP_DP = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2}
model: {layers: 4, hidden: 4096, heads: 32, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {tp: 8, dp: 4}
"""


@pytest.mark.parametrize("gpus,ranks", [("[9]", 4), ("[0]", 4), ("all", 1)])
def test_straggler_folding_equals_the_unfolded_run(gpus, ranks):
    """A GPU slowed alone is simulated as itself beside one rank of each other class by its replica (its TP group's
    other ranks, its DP group's, the rest), each weighted by its class's size: every figure is the unfolded run's
    (one rank per stage playing the slow replica gave bubble 0.0 against 0.378 and exposed dp 16.31 against
    17.57 ms at GPU 9). Slowed all alike, one rank stands for every one."""
    faults = f"faults.step.stragglers=[{{gpus: {gpus}, slowdown: 2}}]"
    folded = simulate(scenario_from_text(TP_DP, "inline.yaml", [faults])).summary
    unfolded = simulate(scenario_from_text(TP_DP, "inline.yaml", [faults, "run.fold=false"])).summary
    healthy = simulate(scenario_from_text(TP_DP, "inline.yaml")).summary
    assert folded["folded"] is True and folded["simulated_ranks"] == ranks
    own = {key: value for key, value in folded.items() if key != "replica_quotient"}  # the fold's, with 1 rank
    assert_same_figures(own, unfolded, rel=1e-9, absolute=1e-12)
    assert folded["step_time_s"] > healthy["step_time_s"] * 1.05


@pytest.mark.parametrize("stragglers,weights", [
    ("[{gpus: [8, 9, 10, 11, 12, 13, 14, 15], slowdown: 2}]", {"0": 24, "8": 8}),
    ("[{gpus: all, slowdown: 1.1}, {gpus: [8, 9, 10, 11, 12, 13, 14, 15], slowdown: 2}]", {"0": 24, "8": 8}),
    ("[{gpus: all, slowdown: 1.1}, {gpus: [9], slowdown: 2}]", {"0": 21, "1": 3, "8": 7, "9": 1}),
], ids=["host", "host-on-background", "gpu-on-background"])
def test_a_slow_replica_is_singled_out_by_as_few_coordinates_as_will_do(stragglers, weights):
    """A whole slow TP group (host 1) is one replica of its DP coordinate: 2 ranks, every figure the unfolded run's
    (keyed by all three coordinates its 8 GPUs would be 8 replicas and the step would run unfolded, 32 ranks, though
    GPU 9 alone folds). A background slowdown on every GPU is each stage's common slowdown, the slow replica told
    apart from it."""
    overrides = [f"faults.step.stragglers={stragglers}"]
    folded = simulate(scenario_from_text(TP_DP, "inline.yaml", overrides)).summary
    unfolded = simulate(scenario_from_text(TP_DP, "inline.yaml", [*overrides, "run.fold=false"])).summary
    assert folded["folded"] is True and folded["rank_weights"] == weights
    assert_same_figures(folded, unfolded, rel=1e-9, absolute=1e-12)


@pytest.mark.parametrize("text,ranks,quotient", [(ALTERNATING, 2, None), (DP_FABRIC, 4, {"replicas": 16,
                                                                                         "replicas_sent": 1})],
                         ids=["classes", "quotient"])
def test_a_gpu_failure_after_the_step_keeps_the_classes_and_the_replica_quotient(text, ranks, quotient):
    """A GPU failure aborts the step at its time whichever ranks are simulated, so a step whose only fault is one
    folds as it does healthy: by the NVLink classes of the alternating ring (2 ranks), and with the replica
    quotient (16 replicas, the first one's flows sent), every figure the unfolded run's; one during the step
    aborts it at the same time folded or not."""
    after = "faults.step.gpu_failures=[{gpu: 9, at: 10 s}]"
    folded = simulate(scenario_from_text(text, "inline.yaml", [after])).summary
    unfolded = simulate(scenario_from_text(text, "inline.yaml", [after, "run.fold=false"])).summary
    assert folded["folded"] is True and folded["simulated_ranks"] == ranks
    assert folded.get("replica_quotient") == quotient
    own = {key: value for key, value in folded.items() if key != "replica_quotient"}
    assert_same_figures(own, unfolded, rel=1e-9, absolute=1e-12)
    during = "faults.step.gpu_failures=[{gpu: 9, at: 10 ms}]"
    aborted = []
    for fold in ("true", "false"):
        with pytest.raises(StepAborted) as caught:
            simulate(scenario_from_text(text, "inline.yaml", [during, f"run.fold={fold}"]))
        aborted.append(str(caught.value))
    assert aborted[0] == aborted[1] == "step aborted at 0.01 s: GPU 9 (h1/gpu1) failed"


SHARED_NICS = """
cluster: {topology: dgx-h100-cluster, nodes: 8, nics_per_node: 2}
model: {layers: 4, hidden: 4096, heads: 32, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 4, pp: 4, dp: 4, order: [tp, cp, pp, dp]}
"""
"""Two stages on each host, each TP group of four GPUs behind one NIC, which its hand-offs and DP rings share."""
UNEVEN_SPINES = ("cluster.leaf_ports=2", "cluster.spines=2")
"""SHARED_NICS in leaf groups of two hosts: the DP rings' flows hash onto the two spines unevenly."""


@pytest.mark.parametrize("text, overrides, gpu, ranks", [
    (TP_DP, ("parallelism.pp=2", "parallelism.dp=2", "training.microbatches=4"), 8, 8),
    (SHARED_NICS, (), 5, 16),
    (SHARED_NICS, UNEVEN_SPINES, 5, None),
], ids=["pp-dp", "shared-nics", "out-of-step"])
def test_a_slow_replica_whose_traffic_shares_links_refolds_by_its_classes(text, overrides, gpu, ranks):
    """Stragglers in one replica whose hand-offs and DP rings share NICs with the other replicas' traffic: one rank
    per stage cannot play the slow replica (its mirrors meet the slow traffic), so the stage fold is given up and the
    step refolds by the slow replica's classes with every mirror kept, the lockstep check after the run comparing
    every copy. Where each kept pace, every figure is the unfolded run's (TP 8 x PP 2 x DP 2: 8 of 32 ranks;
    TP 4 x PP 4 x DP 4 on 2 NICs a host: 16 of 64); where one fell out of step (in leaf groups of two hosts a DP
    all-reduce's copies ended 15.33 and 16.86 ms in: class-mates met the slow replica's flows unlike), the step runs
    unfolded, saying so."""
    setup = [*overrides, f"faults.step.stragglers=[{{gpus: [{gpu}], slowdown: 1.5}}]"]
    folded = simulate(scenario_from_text(text, "inline.yaml", setup)).summary
    unfolded = simulate(scenario_from_text(text, "inline.yaml", [*setup, "run.fold=false"])).summary
    healthy = simulate(scenario_from_text(text, "inline.yaml", list(overrides))).summary
    assert folded["fold_given_up"][0]["reason"] == SHARED_LINKS
    if ranks is None:
        assert folded["folded"] is False and folded["fold_given_up"][1]["fold"] == "stragglers"
        assert folded["fold_given_up"][1]["why"] == "a collective fell out of step in its run"
    else:
        assert folded["folded"] is True and folded["simulated_ranks"] == ranks and "fold_off_reason" not in folded
        loaded = scenario_from_text(text, "inline.yaml", setup)
        topology = scenario_topology(loaded)
        assert prepare_training(loaded, topology, step_faults(loaded, topology)).step.every_mirror
    assert_same_figures(folded, unfolded, rel=1e-12, absolute=1e-12, reason="" if ranks else "fold_off_reason")
    assert folded["step_time_s"] > healthy["step_time_s"]


def test_stragglers_in_two_replicas_switch_folding_off():
    two = simulate(scenario_from_text(TP_DP, "inline.yaml", ["faults.step.stragglers=[{gpus: [9, 10], slowdown: 2}]"]))
    assert two.summary["fold_off_reason"] == "stragglers in more than one pipeline replica"


def test_stragglers_in_one_replica_fold_on_the_analytic_model():
    """The layout whose slow replica shares links with the other's refolds with every mirror kept on the flow
    model (above); on the analytic model every transfer runs alone, so the other ranks only wait for the slow one
    at the collectives they share, and the step folded by the slow replica's classes (its rank, its TP group's
    others, its DP group's, the rest: 4 per stage) gives every figure of the unfolded run (folded by stage, bubble
    0.344 against 0.504)."""
    setup = ["parallelism.pp=2", "parallelism.dp=2", "training.microbatches=4", "network.model=analytic",
             "faults.step.stragglers=[{gpus: [8], slowdown: 2}]"]
    folded = simulate(scenario_from_text(TP_DP, "inline.yaml", setup)).summary
    unfolded = simulate(scenario_from_text(TP_DP, "inline.yaml", [*setup, "run.fold=false"])).summary
    healthy = simulate(scenario_from_text(TP_DP, "inline.yaml", setup[:-1])).summary
    assert folded["folded"] is True and folded["simulated_ranks"] == 8 and "fold_off_reason" not in folded
    assert folded["rank_weights"] == {"0": 1, "1": 7, "8": 1, "9": 7, "16": 1, "17": 7, "24": 1, "25": 7}
    assert_same_figures(folded, unfolded, rel=1e-9, absolute=1e-12)
    assert folded["step_time_s"] > healthy["step_time_s"] * 1.05


def test_a_straggler_refold_is_exact_where_the_stage_folds_hand_offs_cross_other_hops():
    """Tp 8, pp 3, dp 2 on the analytic model, hand-offs of one replica inside a leaf group and of the other
    across the spines, GPU 32 (replica 1, stage 1) x1.5: folded by stage the step stood not exact, 26.62 against
    25.99 ms unfolded; folded by the slow replica's classes every simulated hand-off's copies cross its hops, and
    every figure is the unfolded run's."""
    setup = [*HOPS, "faults.step.stragglers=[{gpus: [32], slowdown: 1.5}]"]
    folded = simulate(scenario_from_text(FABRIC_HAND_OFFS, "inline.yaml", setup)).summary
    unfolded = simulate(scenario_from_text(FABRIC_HAND_OFFS, "inline.yaml", [*setup, "run.fold=false"])).summary
    assert folded["folded"] is True and folded["simulated_ranks"] == 12 and "fold_not_exact" not in folded
    assert_same_figures(folded, unfolded, rel=1e-9, absolute=1e-12)


LANES = ("cluster.nodes=8", "cluster.leaf_ports=2", "parallelism.tp=4", "parallelism.cp=4", "parallelism.pp=2",
         "parallelism.dp=2", "parallelism.cp_algorithm=all_gather", "collectives.protocol=simple")
HOPS = ("network.model=analytic", "cluster.oversubscription=8")


def _stragglers(layout: Layout | None, stage: int = 0, factor: float = 1.3) -> str:
    """A `faults.step.stragglers` override slowing every GPU of pipeline ``stage`` of ``layout`` by ``factor``
    (None: every GPU)."""
    gpus = "all" if layout is None else str(layout.stage_ranks(stage))
    return f"faults.step.stragglers=[{{gpus: {gpus}, slowdown: {factor}}}]"


@pytest.mark.parametrize("text, overrides, layout, ranks, reason", [
    (ALTERNATING, (), None, 2, ""),  # classes by NVLink loads (the ring's direction through each host)
    (WRAP_ON_UNLIKE_SPINES, (), Layout(tp=8, pp=2, dp=2, order=("tp", "cp", "dp", "pp")), 4,
     "fold_routes_reason"),  # route classes after the stage fold's run, stage 0 slowed
    (CP_FABRIC_TEMPLATE, LANES, Layout(tp=4, cp=4, pp=2, dp=2), 8, "fold_lanes_reason"),  # one rank per CP lane
    (FABRIC_HAND_OFFS, HOPS, Layout(tp=8, pp=3, dp=2), 6, "fold_routes_reason"),  # analytic: hops, before any run
], ids=["classes", "routes", "lanes", "hops"])
def test_stragglers_alike_on_every_rank_of_a_stage_refold_exactly(text, overrides, layout, ranks, reason):
    """Stragglers that slow every rank of a stage alike leave the replicas and the ranks of a class alike, so the
    classed step and every refold stay exact, each representative slowed as its stage is: folded, every figure is the
    unfolded run's, and the stragglers slow the step (not run unfolded, nor left folded by stage, not exact)."""
    stragglers = _stragglers(layout)
    folded = simulate(scenario_from_text(text, "inline.yaml", [*overrides, stragglers])).summary
    unfolded = simulate(scenario_from_text(text, "inline.yaml", [*overrides, stragglers, "run.fold=false"])).summary
    healthy = simulate(scenario_from_text(text, "inline.yaml", list(overrides))).summary
    assert folded["folded"] and folded["simulated_ranks"] == ranks and "fold_off_reason" not in folded
    assert "fold_not_exact" not in folded and (not reason or reason in folded)
    assert_same_figures(folded, unfolded, 1e-9, 1e-15, reason)
    assert folded["step_time_s"] > healthy["step_time_s"]


def test_stragglers_alike_in_every_stage_keep_the_replica_quotient():
    """Sixteen two-host replicas, one per leaf group (tests/test_replicas.py): with every GPU slowed alike the
    folded run sends the first replica's flows only (it sent every replica's under any step fault), and gives
    the unfolded step and traffic per GPU."""
    stragglers = _stragglers(None, factor=1.1)
    folded = simulate(scenario_from_text(DP_FABRIC, "inline.yaml", [stragglers])).summary
    unfolded = simulate(scenario_from_text(DP_FABRIC, "inline.yaml", [stragglers, "run.fold=false"])).summary
    assert folded["folded"] and folded["replica_quotient"] == {"replicas": 16, "replicas_sent": 1}
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-9)
    assert folded["traffic_bytes_per_gpu"] == pytest.approx(unfolded["traffic_bytes_per_gpu"], rel=1e-12)


def test_random_stragglers_follow_the_seed():
    faults = "faults.step.stragglers=[{fraction: 0.25, draw: {distribution: uniform, low: 1.1, high: 1.3}}]"
    runs = [simulate(scenario_from_text(TP_DP, "inline.yaml", [faults, f"run.seed={seed}"])).summary["faults"]
            for seed in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0]["slowed_gpus"] != runs[2]["slowed_gpus"]
    assert len(runs[0]["slowed_gpus"]) == 8
    assert all(1.1 <= gpu["factor"] <= 1.3 for gpu in runs[0]["slowed_gpus"].values())
    lognormal = "faults.step.stragglers=[{gpus: all, draw: {distribution: lognormal, median: 1.2, sigma: 0.1}}]"
    factors = [gpu["factor"] for gpu in simulate(scenario_from_text(TP_DP, "inline.yaml", [lognormal]))
               .summary["faults"]["slowed_gpus"].values()]
    assert len(factors) == 32 and len(set(factors)) == 32
    assert sorted(factors)[15] == pytest.approx(1.2, rel=0.03)  # a 32-draw median: standard error 2.2%


def test_a_lognormal_draw_is_held_within_the_bounds_a_given_slowdown_is_refused_beyond():
    """A given factor outside [1/1000, 1000] is refused at load; a lognormal draw's tails cannot be, so they are
    held there: median 1000 puts half the draws above 1000, median 1/1000 half below it (sigma at its bound,
    2.3, so those halves are wide: a draw 1.7 sigma out is 50 times beyond the median)."""
    import numpy as np

    from simulator.config.faults import SlowdownDraw
    from simulator.config.reliability import MAX_SLOWDOWN, MIN_SLOWDOWN
    from simulator.faults.step import draw_factors

    assert (MIN_SLOWDOWN, MAX_SLOWDOWN) == (1e-3, 1000.0)
    for median, bound in ((1000.0, MAX_SLOWDOWN), (1e-3, MIN_SLOWDOWN)):
        draw = SlowdownDraw(distribution="lognormal", median=median, sigma=2.3)
        factors = draw_factors(draw, 1000, np.random.default_rng(0))
        assert MIN_SLOWDOWN <= factors.min() and factors.max() <= MAX_SLOWDOWN
        assert 400 < int((factors == bound).sum()) < 600


def test_stragglers_on_one_gpu_multiply_within_the_bound():
    """Entries naming the same GPU multiply: 2 x 3 = 6, exactly one entry of 6's step. Two entries of 1000 made a
    factor of a million (a 5,085 s step) past the bound each entry is held to; their product is held at 1000,
    the step of one entry of 1000."""
    def run(*factors):
        entries = ", ".join(f"{{gpus: [0], slowdown: {factor}}}" for factor in factors)
        return simulate(scenario_from_text(SPINES, "inline.yaml", [f"faults.step.stragglers=[{entries}]"])).summary
    assert run(2, 3)["faults"]["slowed_gpus"]["0"]["factor"] == 6.0
    assert run(2, 3)["step_time_s"] == run(6)["step_time_s"]
    capped = run(1000, 1000)
    assert capped["faults"]["slowed_gpus"]["0"]["factor"] == 1000.0
    assert capped["step_time_s"] == run(1000)["step_time_s"]


def test_one_spine_link_down_reroutes_and_lengthens_the_data_parallel_time():
    healthy = simulate(scenario_from_text(SPINES))
    broken = simulate(scenario_from_text(SPINES, "inline.yaml", ["faults.step.links=[{link: [leaf0.r0, spine0]}]"]))
    summary = broken.summary
    assert summary["faults"]["rerouted_routes"] > 0
    assert summary["comm_s"]["dp"] > healthy.summary["comm_s"]["dp"] * 1.2
    assert summary["step_time_s"] > healthy.summary["step_time_s"]
    assert summary["folded"] and summary["simulated_ranks"] == 3  # hosts 0 and 1 apart, 2 and 3 one rail's class
    topology = broken.topology
    down = {topology.link_index[("leaf0.r0", "spine0")], topology.link_index[("spine0", "leaf0.r0")]}
    flows = broken.timeline[broken.timeline["kind"] == "flow"]
    for src, dst in set(zip(flows["src"], flows["dst"])):
        for channel in range(4):
            assert down.isdisjoint(topology.path(int(src), int(dst), channel))


def test_a_link_failing_mid_step_moves_its_flows_and_costs_less_than_failing_at_the_start():
    def dp_time(at):
        faults = f"faults.step.links=[{{link: [leaf0.r0, spine0], at: {at}}}]"
        return simulate(scenario_from_text(SPINES, "inline.yaml", [faults])).summary["comm_s"]["dp"]

    healthy = simulate(scenario_from_text(SPINES)).summary["comm_s"]["dp"]
    assert healthy < dp_time("15 ms") < dp_time("0 s")
    assert dp_time("1 s") == pytest.approx(healthy, rel=1e-12)  # after the step: no effect


def test_a_degraded_link_slows_the_flows_crossing_it():
    healthy = simulate(scenario_from_text(SPINES)).summary["comm_s"]["dp"]
    faults = "faults.step.links=[{link: [leaf0.r0, spine0], capacity: 0.25}]"
    degraded = simulate(scenario_from_text(SPINES, "inline.yaml", [faults])).summary
    assert degraded["comm_s"]["dp"] > healthy * 1.2
    assert degraded["faults"]["rerouted_routes"] == 0


RAILS = """
cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: nvswitch_node, gpus: 2}, nics_per_node: 2,
          leaf_ports: 2, spines: 2, oversubscription: 2}
model: {layers: 2, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {tp: 2, dp: 4}
"""
"""TP 2 in each of four 2-GPU hosts with a NIC per GPU, DP 4 across them: one rail's DP ring crosses h1/nic0."""


def test_ranks_waiting_for_a_faulted_rail_are_a_named_loss_that_closes_the_wait():
    """With h1/nic0's cable down, rail 0's DP collectives slow and the other rail's ranks, done with their own
    work, idle to the step's end with no transfer of their own: the `peer_wait` loss holds that time, so the
    compute stream's wait is the exposed communication and it (no bubble idles without communication here), to
    1e-9 s; the console prints it. A healthy step has no such time and no such key."""
    import io

    from rich.console import Console

    from simulator.console.report import training_table

    healthy = simulate(scenario_from_text(RAILS)).summary
    assert "peer_wait" not in healthy["bottleneck"]["loss_shares"]
    fault = ["faults.step.links=[{link: [h1/nic0, leaf0.r0]}]"]
    summary = simulate(scenario_from_text(RAILS, "inline.yaml", fault)).summary
    step, bottleneck = summary["step_time_s"], summary["bottleneck"]
    evidence, peer_wait = bottleneck["evidence"], bottleneck["loss_shares"]["peer_wait"]
    assert summary["step_time_s"] > 1.5 * healthy["step_time_s"]
    assert peer_wait > 0.05 and "stage_tail_wait" not in bottleneck["loss_shares"]
    assert (evidence["wait_share"] - evidence["exposed_comm_share"] - peer_wait) * step == pytest.approx(0, abs=1e-9)
    console = Console(file=io.StringIO(), width=400)
    console.print(training_table(summary))
    assert f"wait for slower ranks {seconds_alike(peer_wait * step)}" in " ".join(console.file.getvalue().split())


def test_a_straggler_among_the_ranks_waiting_for_a_faulted_rail_is_not_named_for_the_wait():
    """The faulted rail above with GPU 7 at x1.001: the ranks wait for the rail's transfers (the wait for slower
    ranks is the link's, 9.8% of the step with or without the straggler), and GPU 7's replica ends its window
    before replica 1's, so the verdict names no straggler beside that wait; the step faults row prints the factor
    with the digits that tell it from 1."""
    import io

    from rich.console import Console

    from simulator.console.report import training_table

    setup = ["faults.step.links=[{link: [h1/nic0, leaf0.r0]}]", "faults.step.stragglers=[{gpus: [7], slowdown: 1.001}]"]
    summary = simulate(scenario_from_text(RAILS, "inline.yaml", setup)).summary
    assert summary["bottleneck"]["loss_shares"]["peer_wait"] > 0.05
    assert "GPU 7" not in summary["bottleneck"]["verdict"]
    console = Console(file=io.StringIO(), width=400)
    console.print(training_table(summary))
    assert "GPU 7 compute x1.001 slower" in " ".join(console.file.getvalue().split())


PIPELINE_OVER_SPINES = """
cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1,
          leaf_ports: 2, spines: 2, oversubscription: 2}
model: {layers: 8, hidden: 4096, heads: 32, vocab: 32000}
training: {seq_len: 4096, microbatches: 8}
parallelism: {pp: 4}
"""


@pytest.mark.parametrize("at", ["100 ms", "150 ms"])
def test_a_mid_step_degrade_slows_the_analytic_pipeline_as_it_does_the_flow_one(at):
    """Pipeline hand-offs over the spines, every leaf-spine link down to 1% at ``at``, between hand-offs (the
    analytic model times a transfer at its start): each runs alone, so the analytic model's step is the flow
    model's. The analytic network kept the healthy timing of the
    hand-offs it had posted before the degrade (at 100 ms: 0.26058 s, the healthy step, for 1.07021 s)."""
    links = ", ".join(f"{{link: [leaf{leaf}.r0, spine{spine}], at: {at}, capacity: 0.01}}"
                      for leaf in range(2) for spine in range(2))
    faults = f"faults.step.links=[{links}]"
    steps = {model: simulate(scenario_from_text(PIPELINE_OVER_SPINES, "inline.yaml",
                                                [faults, f"network.model={model}"])).summary["step_time_s"]
             for model in ("analytic", "flow")}
    healthy = simulate(scenario_from_text(PIPELINE_OVER_SPINES, "inline.yaml", ["network.model=analytic"]))
    assert steps["analytic"] == pytest.approx(steps["flow"], rel=1e-12)
    assert steps["analytic"] > 3 * healthy.summary["step_time_s"]


def test_all_uplinks_of_a_leaf_down_abort_the_step_with_the_reason(tmp_path, capsys):
    with pytest.raises(StepAborted) as aborted:
        simulate(scenario_from_text(SPINES, "inline.yaml", ["faults.step.links=[{uplinks_of: leaf0.r0, at: 2 ms}]"]))
    assert aborted.value.at_s == pytest.approx(2e-3)
    assert aborted.value.reason == "uplinks of leaf0.r0 down: h0/gpu0 cannot reach h2/gpu0"
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SPINES + "faults: {step: {links: [{uplinks_of: leaf0.r0}]}}\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "simulation error: step aborted at 0 s: uplinks of leaf0.r0 down: h0/gpu0 cannot reach h2/gpu0"
    assert not (tmp_path / "out").exists()


def test_a_gpu_failure_aborts_the_step_only_if_it_comes_before_the_end():
    healthy = simulate(scenario_from_text(SPINES)).summary["step_time_s"]
    with pytest.raises(StepAborted, match=r"step aborted at 0.005 s: GPU 2 \(h2/gpu0\) failed"):
        simulate(scenario_from_text(SPINES, "inline.yaml", ["faults.step.gpu_failures=[{gpu: 2, at: 5 ms}]"]))
    late = simulate(scenario_from_text(SPINES, "inline.yaml", ["faults.step.gpu_failures=[{gpu: 2, at: 1 s}]"]))
    assert late.summary["step_time_s"] == healthy


def test_the_job_simulation_api_returns_outcomes_and_caches_by_faults():
    loaded = scenario_from_text(TP_DP)
    slow = StepFaults(stragglers=(Straggler(gpus=(9,), slowdown=2.0),))
    assert hash(slow) == hash(StepFaults(stragglers=(Straggler(gpus=(9,), slowdown=2.0),)))
    outcome = perturbed_step(loaded, slow)
    assert outcome.folded and outcome.step_time_s == pytest.approx(
        simulate(scenario_from_text(TP_DP, "inline.yaml", ["faults.step.stragglers=[{gpus: [9], slowdown: 2}]"]))
        .summary["step_time_s"], rel=1e-12)
    failed = perturbed_step(loaded, StepFaults(gpu_failures=(GpuFailure(gpu=3, at="1 ms"),)))
    assert (failed.step_time_s, failed.aborted_at_s, failed.reason) == (None, 1e-3, "GPU 3 (h0/gpu3) failed")
    # a rail's leaf cut off: its GPUs reach the fabric over NVLink through their peers' NICs (PXN), slower
    rail = perturbed_step(loaded, StepFaults(links=(LinkFault(uplinks_of="leaf0.r0"),)))
    healthy = perturbed_step(loaded, StepFaults()).step_time_s
    assert rail.step_time_s > healthy and rail.summary["faults"]["rerouted_routes"] > 0
    pod = StepFaults(links=tuple(LinkFault(uplinks_of=f"leaf0.r{rail}") for rail in range(8)))
    split = perturbed_step(loaded, pod)
    assert split.aborted_at_s == 0 and "cannot reach" in split.reason


@pytest.mark.parametrize("faults,line,field,problem", [
    ("stragglers: [{gpus: [40], slowdown: 2}]", 9, "faults.step.stragglers[0].gpus", "unknown GPU index 40"),
    ("stragglers: [{gpus: [1], slowdown: 0}]", 9, "faults.step.stragglers[0].slowdown",
     "slowdown 0 is below 1: a straggler's kernels last slowdown times their nominal time (allowed: a factor from 1 "
     "to 1000, e.g. 2 for half speed)"),
    ("stragglers: [{gpus: [1], slowdown: -2}]", 9, "faults.step.stragglers[0].slowdown",
     "slowdown -2 is below 1: a straggler's kernels last slowdown times their nominal time (allowed: a factor from 1 "
     "to 1000, e.g. 2 for half speed)"),
    ("links: [{link: [leaf0.r0, spine9]}]", 9, "faults.step.links[0].link", "unknown node 'spine9'"),
    ("links: [{link: [leaf0.r0, leaf1.r0]}]", 9, "faults.step.links[0].link", "no link between"),
    ("links: [{uplinks_of: spine0}]", 9, "faults.step.links[0].uplinks_of", "no uplinks"),
    ("links: [{link: [leaf0.r0, spine0], at: 5}]", 9, "faults.step.links[0].at", "has no unit"),
    ("gpu_failures: [{gpu: 4, at: 1 ms}]", 9, "faults.step.gpu_failures[0].gpu", "unknown GPU index 4"),
    ("stragglers: [{gpus: some, slowdown: 2}]", 9, "faults.step.stragglers[0].gpus",
     "expected a list of GPU indices or all, got 'some' (allowed: [0, 5], all)"),
    ("stragglers: [{gpus: [1.5], slowdown: 2}]", 9, "faults.step.stragglers[0].gpus",
     "expected a list of GPU indices or all, got [1.5] (allowed: [0, 5], all)"),
])
def test_bad_fault_input_is_one_located_line(tmp_path, capsys, faults, line, field, problem):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(SPINES.lstrip("\n") + "faults:\n  step:\n    " + faults + "\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: {scenario}:{line}: {field}: ")
    assert problem in err
    assert not (tmp_path / "out").exists()


def test_link_faults_apply_to_workload_lists_too():
    text = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
workload: [{name: ar, op: all_reduce, bytes: 1 GiB, group: all, algorithm: ring}]
"""
    healthy = simulate(scenario_from_text(text)).summary["makespan_s"]
    faults = "faults.step.links=[{link: [h0/nic0, leaf0.r0], capacity: 0.5}]"
    degraded = simulate(scenario_from_text(text, "inline.yaml", [faults])).summary
    # the all-reduce is bound by that rail's NIC: its bandwidth term doubles, its latency term does not
    assert healthy * 1.95 < degraded["makespan_s"] < healthy * 2
    assert degraded["faults"]["links"] == [{"link": "h0/nic0-leaf0.r0", "at_s": 0.0, "capacity": 0.5}]


def test_a_straggler_in_a_replayed_trace_slows_its_kernels_and_unfolds_the_replicas(tmp_path):
    loaded, healthy = run(two_rank_scenario("100 Gb/s", dp=", dp: 8", nodes=8), tmp_path)
    faults = "faults: {step: {stragglers: [{gpus: [1], slowdown: 2}]}}\n"
    _, slow = run(two_rank_scenario("100 Gb/s", dp=", dp: 8", nodes=8, extra=faults), tmp_path)
    assert slow.summary["fold_off_reason"] == "stragglers in a step without a parallel layout"
    assert slow.summary["simulated_ranks"] == 8 and healthy.summary["folded"] is True
    # rank 1's GEMM (1100 us) gates the all-reduce and its optimizer kernel (200 us) follows: both twice as long
    assert slow.summary["step_time_s"] == pytest.approx(2 * 1100e-6 + allreduce_time(loaded, ALLREDUCE_BYTES, 8)
                                                        + 2 * 200e-6, rel=1e-9)


def test_validate_checks_the_step_faults(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SPINES + "faults: {step: {gpu_failures: [{gpu: 9}]}}\n")
    assert main(["validate", str(scenario)]) == 2
    assert "faults.step.gpu_failures[0].gpu: unknown GPU index 9 (allowed: 0 to 3)" in capsys.readouterr().err


def test_an_unknown_node_is_answered_with_a_link_of_this_topology(tmp_path, capsys):
    """On one DGX host there is no leaf or spine: the refusal shows a link that exists there (it suggested
    leaf0.r0, spine0 whatever the topology)."""
    scenario = tmp_path / "one_host.yaml"
    scenario.write_text("cluster: {topology: dgx-h100}\nworkload: [{name: ar, op: all_reduce, bytes: 1 MiB, "
                        "group: all}]\nfaults: {step: {links: [{link: [leaf0.r0, spine0]}]}}\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {scenario}:3: faults.step.links[0].link: unknown node 'leaf0.r0' (allowed: node names of the "
        "topology graph (trainsim topo describe lists them), e.g. [h0/gpu0, h0/nvswitch])")


def test_step_fault_resolution_raises_a_plain_field_error_that_the_top_locates():
    """faults/step.py names the field and leaves the file and line to config/locate.located (it took the scenario's
    locator and built located errors itself)."""
    from simulator.errors import ScenarioError
    from simulator.faults.step import resolve_step_faults
    from simulator.topology.loader import load_topology

    topology = load_topology("dgx-h100")
    with pytest.raises(ScenarioError) as caught:
        resolve_step_faults(StepFaults(stragglers=(Straggler(gpus=[3, 8], slowdown=2),)), topology, seed=0)
    assert (caught.value.field, caught.value.file, caught.value.line) == ("faults.step.stragglers[0].gpus", "", None)


def test_stragglers_fold_onto_their_classes_representatives_only():
    """One slow GPU of TP 4 x PP 2 x DP 4 folds onto the representatives of its straggler classes, keyed by the slow
    replica's coordinates or by TP coordinate too (`tp_apart`), and onto no other set of ranks: one stray rank
    beside either set is refused, naming the ranks it folds onto."""
    from simulator.faults.step import Slowdown, StepFaultPlan, folded_slowdowns, straggler_classes
    from simulator.parallel.folding import representatives
    from simulator.parallel.layout import Layout

    layout = Layout(tp=4, pp=2, dp=4, order=("tp", "cp", "pp", "dp"))
    plan = StepFaultPlan(slowdowns=((5, Slowdown(1.5)),))
    refused = "stragglers in one pipeline replica fold onto one rank per stage or per class only"
    for tp_apart in (False, True):
        ranks = representatives(layout, True, straggler_classes(plan, layout, tp_apart))
        assert folded_slowdowns(plan, layout, ranks) == ({5: Slowdown(1.5)}, False, "")
        stray = next(rank for rank in range(layout.world) if rank not in ranks)
        assert folded_slowdowns(plan, layout, sorted([*ranks, stray]))[2] == refused


def test_the_slow_replica_of_each_new_plan_reads_no_coordinates_of_the_layout_again(monkeypatch):
    """A job's straggler states each ask `slow_replica` of a new plan on one layout: the ranks' coordinates along
    the replica dimensions are read once per layout and kept, so a later plan reads none (on TP 8 x PP 16 x DP 128
    reading them for each plan took ~0.07 s of each state's ~2 s), and the plan's slow replica is the same."""
    from simulator.faults.step import Slowdown, SlowReplica, StepFaultPlan, slow_replica

    layout = Layout(tp=4, pp=4, dp=8, order=("tp", "cp", "pp", "dp"))
    first = StepFaultPlan(slowdowns=((layout.rank_of(pp=1), Slowdown(1.3)),))
    assert slow_replica(first, layout) == SlowReplica(("tp", "dp"), (0, 0))
    read = []
    coords = Layout.coords
    monkeypatch.setattr(Layout, "coords", lambda self, rank: read.append(rank) or coords(self, rank))
    later = StepFaultPlan(slowdowns=tuple((layout.rank_of(pp=stage), Slowdown(1.3)) for stage in (0, 2, 3)))
    assert slow_replica(later, layout) == SlowReplica(("tp", "dp"), (0, 0))
    assert read == []


PIPELINED = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 8}
training: {seq_len: 4096, global_batch: 32, micro_batch: 1, precision: bf16, recompute: none}
parallelism: {tp: 1, pp: 4, dp: 4, zero: 1, ddp: {bucket: 25 MiB, overlap: true}, pipeline: {schedule: 1f1b}}
"""
"""A healthy pp 4 x dp 4 step: stage 0's DP tail and optimizer step end after the pipeline window, the other
stages' during the drain."""


def test_a_healthy_pipeline_waits_for_other_stages_not_for_slower_ranks():
    """With no fault, every rank of a stage ends with its stage: the idle time after the pipeline window is the
    wait for the stage that ends last (`stage_tail_wait`), none of it a wait for slower ranks (`peer_wait`); the
    compute stream's wait is the exposed communication, the idle time in the window without communication and
    these two, to 1e-9 s; folded and unfolded runs agree; the console prints it."""
    import io

    from rich.console import Console

    from simulator.console.report import training_table
    from simulator.metrics.intervals import uncovered
    from simulator.metrics.step import (
        COMPUTE_CATEGORIES,
        StepRows,
        communication_metrics,
        replica_windows_s,
        stream_compute,
    )
    from simulator.program.ops import COMM_CATEGORIES

    folded = simulate(scenario_from_text(PIPELINED)).summary
    result = simulate(scenario_from_text(PIPELINED, "inline.yaml", ["run.fold=false"]))
    summary, step = result.summary, result.summary["step_time_s"]
    shares = summary["bottleneck"]["loss_shares"]
    assert "peer_wait" not in shares and "peer_wait" not in folded["bottleneck"]["loss_shares"]
    assert shares["stage_tail_wait"] > 0.05
    assert folded["bottleneck"]["loss_shares"]["stage_tail_wait"] * folded["step_time_s"] == pytest.approx(
        shares["stage_tail_wait"] * step, abs=1e-9)
    rows = StepRows.of(result.log)
    window = max(replica_windows_s(rows).values())  # one replica: the step's window
    comm = communication_metrics(rows, step, replica_windows_s(rows))
    ops, compute = rows.ops, stream_compute(rows.ops) & np.isin(rows.ops["category"], COMPUTE_CATEGORIES)
    busy = compute | np.isin(ops["category"], COMM_CATEGORIES)
    in_window = np.mean([uncovered(np.array([0.0]), np.array([window]), ops["start_s"][busy & (ops["rank"] == rank)],
                                   ops["end_s"][busy & (ops["rank"] == rank)]) for rank in np.unique(ops["rank"])])
    closed = comm["exposed_union_s"] + in_window + shares["stage_tail_wait"] * step
    assert summary["bottleneck"]["evidence"]["wait_share"] * step == pytest.approx(closed, abs=1e-9)
    console = Console(file=io.StringIO(), width=400)
    console.print(training_table(summary))
    assert f"wait for other stages {seconds_alike(shares['stage_tail_wait'] * step)}" in " ".join(
        console.file.getvalue().split())
