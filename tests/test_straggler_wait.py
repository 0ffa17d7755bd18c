"""A straggler's cost in a step's losses: the ranks of the other data-parallel replicas wait for its replica
after their own pipeline window, a wait for slower ranks (`peer_wait`), not pipeline bubble; at pp = 1 a step
has no bubble; the verdict names the slowed GPU."""

from __future__ import annotations

import numpy as np
import pytest
from shared import STRAGGLER_PIPELINE

from simulator import simulate
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.metrics.step import StepRows, pipeline_bubble
from simulator.parallel.layout import Layout

F, B = 1e-3, 2e-3
"""Synthetic stages of forward F and backward B, one GPU at x2."""


def test_a_slow_replica_makes_the_others_wait_on_their_own_line_not_in_their_bubble():
    """1F1B, p = 4, m = 8, two replicas, stage 1 of replica 1 at x2. Replica 0 keeps its schedule: its window
    ends at (m + p - 1)(F + B) = 33 ms with (p - 1)/(m + p - 1) of it idle, as on a healthy step; replica 1's
    window is the step, the slow stage's backward chain, 53 ms: the other stages' F + B, then the slow stage's
    m - p + 2 forwards left and its m backwards, (p - 1)(F + B) + (m - p + 2) 2F + m 2B; its ranks idle for all
    but their m (F + B), twice that at the slow stage. Replica 0's ranks then idle to the step's end: 20 ms each,
    10 ms a rank on average, the waits for slower ranks of their stage and for the stage that ends last. The
    verdict names GPU 5."""
    p, m, slow_stage = 4, 8, 1
    gpu = slow_stage + p  # rank = stage + p x replica
    text = STRAGGLER_PIPELINE.format(p=p, m=m, dp=2, gpu=gpu, factor=2, fold="true")
    summary = simulate(scenario_from_text(text)).summary
    step = summary["step_time_s"]
    assert step == pytest.approx((p - 1) * (F + B) + (m - p + 2) * 2 * F + m * 2 * B, rel=1e-9)
    healthy_window = (m + p - 1) * (F + B)
    slow_idle = [step - m * (F + B) * (2 if stage == slow_stage else 1) for stage in range(p)]
    healthy_idle = (p - 1) / (m + p - 1) * healthy_window
    assert summary["bubble_fraction"] == pytest.approx(
        (p * (p - 1) / (m + p - 1) + sum(idle / step for idle in slow_idle)) / (2 * p), abs=1e-12)
    shares = summary["bottleneck"]["loss_shares"]
    assert shares["pipeline_bubble"] * step == pytest.approx((p * healthy_idle + sum(slow_idle)) / (2 * p), abs=1e-12)
    waits = (shares["peer_wait"] + shares["stage_tail_wait"]) * step
    assert waits == pytest.approx((step - healthy_window) / 2, abs=1e-12)
    assert shares["peer_wait"] > 0.1
    evidence = summary["bottleneck"]["evidence"]
    closed = shares["pipeline_bubble"] + shares["peer_wait"] + shares["stage_tail_wait"]
    assert evidence["wait_share"] == pytest.approx(closed, abs=1e-12)  # no communication to overlap
    assert summary["bottleneck"]["verdict"].endswith(
        f"; wait for slower ranks {100 * shares['peer_wait']:.1f}% of the step, for GPU {gpu}'s compute x2")
    assert "wait for slower ranks and other idle" in summary["bottleneck"]["verdict"]


def test_a_straggler_at_pp_1_is_a_wait_for_slower_ranks_and_no_bubble():
    """Data parallelism over 8 GPUs, one synthetic stage, GPU 1 at x2: the others finish their passes at F + B,
    GPU 1 at twice that, and they wait the difference, 7/8 of F + B a rank on average: all of it `peer_wait`,
    none of it bubble (there is no pipeline); the verdict names GPU 1 beside that loss."""
    text = STRAGGLER_PIPELINE.format(p=1, m=1, dp=8, gpu=1, factor=2, fold="true")
    summary = simulate(scenario_from_text(text)).summary
    shares = summary["bottleneck"]["loss_shares"]
    assert summary["bubble_fraction"] == 0.0 and shares["pipeline_bubble"] == 0.0
    assert shares["peer_wait"] * summary["step_time_s"] == pytest.approx(7 / 8 * (F + B), abs=1e-12)
    assert summary["bottleneck"]["verdict"].endswith(
        "largest single loss: wait for slower ranks, 43.8% of the step, for GPU 1's compute x2")


def test_the_dp_straggler_scenario_without_its_link_fault_has_no_bubble():
    """`faults-straggler-and-spine-link` with its link fault off and GPU 1 at x1.3: the three other ranks idle
    while GPU 1 runs its backward; a step of one stage has no pipeline bubble, so that idle time is the wait for
    slower ranks."""
    scenario = load_scenario("faults-straggler-and-spine-link",
                             ["faults.step.links=[]", "faults.step.stragglers=[{gpus: [1], slowdown: 1.3}]"])
    summary = simulate(scenario).summary
    shares = summary["bottleneck"]["loss_shares"]
    assert summary["bubble_fraction"] == 0.0 and shares["pipeline_bubble"] == 0.0
    assert shares["peer_wait"] > 0.01
    assert "for GPU 1's compute x1.3" in summary["bottleneck"]["verdict"]


PP2_DP4 = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {layers: 8, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 2048, micro_batch: 1, microbatches: 8}
parallelism: {tp: 2, pp: 2, dp: 4, order: [tp, cp, dp, pp], pipeline: {schedule: 1f1b}}
"""
"""16 H100 on two DGX hosts, TP 2 x PP 2 x DP 4, the stages across the hosts."""


def _idle_between(starts: np.ndarray, ends: np.ndarray, begin: float, end: float) -> float:
    """The time in [begin, end] that no interval (starts, ends) covers, by a sweep over them in start order."""
    idle, reached = 0.0, begin
    for start, stop in sorted(zip(starts.tolist(), ends.tolist())):
        if stop <= reached or start >= end:
            continue
        idle += max(start - reached, 0.0)
        reached = max(reached, stop)
    return idle + max(end - reached, 0.0)


def test_the_replicas_beside_a_straggler_keep_their_bubble_and_wait_on_their_own_line():
    """GPU 8 (stage 1 of replica 0) at x1.3: the other three replicas finish their passes about 9 ms before
    replica 0 and wait for its gradients. By hand from the timeline, each rank's time with no op of its own from
    its replica's last pass to the last op of its stage, weighed by the GPUs it stands for, is the `peer_wait`
    loss (4.536 ms a rank); those replicas' bubble is a healthy step's (18.9% of the window) within what the
    schedule's own bubble moves with the slower passes (17.4% to 18.3%), where it read 33.2% with their wait in
    it; the verdict names GPU 8 beside that wait."""
    layout = Layout(tp=2, pp=2, dp=4, order=("tp", "cp", "dp", "pp"))
    healthy = simulate(scenario_from_text(PP2_DP4)).summary
    straggler = ["faults.step.stragglers=[{gpus: [8], slowdown: 1.3}]"]
    result = simulate(scenario_from_text(PP2_DP4, "inline.yaml", straggler))
    summary, step = result.summary, result.summary["step_time_s"]
    weights = {int(rank): weight for rank, weight in summary["rank_weights"].items()}
    ops = StepRows.of(result.log).ops
    mine = {rank: ops["rank"] == rank for rank in weights}
    passes = np.isin(ops["category"], ("forward", "backward"))
    replica_end = {replica: max(float(ops["end_s"][mine[rank] & passes].max()) for rank in weights
                                if layout.coords(rank)["dp"] == replica)
                   for replica in {layout.coords(rank)["dp"] for rank in weights}}
    stage_end = {stage: max(float(ops["end_s"][mine[rank]].max()) for rank in weights
                            if layout.coords(rank)["pp"] == stage) for stage in (0, 1)}
    waits = {rank: _idle_between(ops["start_s"][mine[rank]], ops["end_s"][mine[rank]],
                                 replica_end[layout.coords(rank)["dp"]], stage_end[layout.coords(rank)["pp"]])
             for rank in weights}
    by_hand = sum(weights[rank] * wait for rank, wait in waits.items()) / 16
    shares = summary["bottleneck"]["loss_shares"]
    assert shares["peer_wait"] * step == pytest.approx(by_hand, abs=1e-12)
    assert by_hand == pytest.approx(4.536e-3, abs=1e-6)
    others = [rank for rank in weights if layout.coords(rank)["dp"] != 0]
    replicas = {rank: layout.coords(rank)["dp"] for rank in others}
    bubble = pipeline_bubble(StepRows.of(result.log).of_ranks(others), replicas)
    schedule_moves = summary["schedule_bubble_fraction"] - healthy["schedule_bubble_fraction"]
    assert abs(bubble.fraction - healthy["bubble_fraction"]) < schedule_moves
    assert summary["bubble_fraction"] < 0.22 and shares["pipeline_bubble"] < healthy["bottleneck"]["loss_shares"][
        "pipeline_bubble"]
    assert summary["bottleneck"]["verdict"].endswith(
        f"; wait for slower ranks {100 * shares['peer_wait']:.1f}% of the step, for GPU 8's compute x1.3")
