"""Ranks classed apart where a ring runs the other way round through every other host, or where a pipeline
hand-off's route meets other flows on one host's spine uplink and not on its mirrors' (engine/rank_classes.py).

MoE with EP 8 inside each of four DGX H100 hosts, TP 1, DP 32 and ZeRO-1: the gradients' reduce-scatter over all
32 GPUs is one ring per channel that runs k to k+1 through hosts 0 and 2 and k to k-1 through hosts 1 and 3
(collectives/ring.py `ring_order`), and the backward's all-to-alls inside each host run beside it. With one rank
per stage the all-to-all's mirrors on hosts 1 and 3 ended 0.7 us after its group on host 0, so the folded run fell
out of step and ran again unfolded. Classed by what their hosts carry, hosts 0 and 2 and hosts 1 and 3 each get a
representative (ranks 0 and 8), and the folded run is the unfolded one, rank for rank."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest
from shared import ALTERNATING, CP_FABRIC_TEMPLATE, CROSS_RAIL_PP, WRAP_ON_UNLIKE_SPINES, assert_same_figures

from simulator import simulation
from simulator.config.loader import scenario_from_text
from simulator.console.report import folding_text
from simulator.engine import fold_policy
from simulator.engine.fold_policy import (
    Deferred,
    FoldedStep,
    GivenUp,
    lane_step,
    meet_step,
    program_indexes,
    route_steps,
)
from simulator.engine.lockstep import Lockstep, OutOfStep
from simulator.engine.rank_classes import rank_classes, route_classes
from simulator.engine.shapes import CollectiveShapes
from simulator.faults.step import StepFaultPlan
from simulator.parallel.experts import ep_group, group_images
from simulator.parallel.folding import RankClasses, class_images, lane_classes, representatives
from simulator.parallel.layout import Layout
from simulator.program.step import StepProgram
from simulator.program.unfolding import Unfolding
from simulator.simulation import network_settings, plan_cache, prepare_training, run_step, simulate, step_program
from simulator.topology.loader import scenario_topology

BY_HOST_PARITY = RankClasses((0,) * 8 + (1,) * 8 + (0,) * 8 + (1,) * 8)
"""Positions 0-7 (host 0) and 16-23 (host 2) in one class, hosts 1 and 3 in the other."""


def test_ranks_are_classed_by_the_direction_of_the_ring_through_their_host():
    loaded = scenario_from_text(ALTERNATING, "inline.yaml", [])
    topology = scenario_topology(loaded)
    program = step_program(loaded, topology, fold=True)
    assert program.ranks == (0,)
    shapes, order = program_indexes(program)
    assert rank_classes(program, plan_cache(topology, network_settings(loaded, topology)), shapes, order) \
        == BY_HOST_PARITY


def test_each_class_mirrors_only_its_own_hosts():
    """An EP group's copies on the other three hosts: rank 0's group stands for host 2's, rank 8's (the other
    representative) for host 3's; a group with both representatives in it (the DP ring) has no copies."""
    layout = Layout(tp=1, dp=32)
    assert representatives(layout, True, BY_HOST_PARITY) == [0, 8]
    for rank, kept in ((0, (16,)), (8, (24,))):
        group = ep_group(layout, rank, 8)
        images = group_images(layout, rank, 8, expert_dp=False)
        assert [image[0] for image in images] == [first for first in (0, 8, 16, 24) if first != group[0]]
        assert tuple(image[0] for image in class_images(layout, BY_HOST_PARITY, group, images)) == kept


def test_the_all_to_all_beside_the_alternating_ring_folds_exactly_by_class():
    """Folded with a representative per class, step and summary equal the unfolded run's to 1e-9, and the two
    representatives' ops start and end when they do unfolded, to the bit. With one rank per stage the folded run
    keeps pace too: its all-to-alls send to every peer at once (run as p - 1 phases, the combine fell out of step
    with its mirrors there)."""
    text = ALTERNATING + "run: {timeline: full}\n"
    folded = simulate(scenario_from_text(text, "inline.yaml", []))
    unfolded = simulate(scenario_from_text(text, "inline.yaml", ["run.fold=false"]))
    assert folded.summary["folded"] and folded.summary["simulated_ranks"] == 2
    assert "fold_given_up" not in folded.summary and folding_text(folded.summary) == "2 of 32 ranks simulated (folded)"
    assert_same_figures(folded.summary, unfolded.summary, 1e-9, 1e-15)
    columns = ["rank", "key", "start_s", "end_s"]
    ops = folded.timeline[folded.timeline["kind"] != "flow"]
    assert set(ops["rank"]) == {0, 8}
    same = unfolded.timeline[(unfolded.timeline["kind"] != "flow") & unfolded.timeline["rank"].isin({0, 8})]
    ours_rows = ops[columns].sort_values(columns).to_numpy()
    theirs_rows = same[columns].sort_values(columns).to_numpy()
    assert np.array_equal(ours_rows, theirs_rows)

    loaded = scenario_from_text(ALTERNATING, "inline.yaml", [])
    topology = scenario_topology(loaded)
    settings = network_settings(loaded, topology)
    _, _, kept_pace = run_step(step_program(loaded, topology, fold=True), topology, settings)
    assert kept_pace.collectives == ""


def test_folds_refused_before_the_run_are_listed_with_the_check_that_refused_them(monkeypatch):
    """With `fold_verdict` refusing every program, the alternating case's classed fold (ranks 0 and 8) and then
    its stage fold (rank 0) are given up before any run: the summary lists both, in that order, with the check's
    short text and its reason, and the step runs unfolded with the stage fold's reason; the one-line `ranks` row
    gives the short why once, the stage fold given up 'for the same reason'."""
    monkeypatch.setattr(fold_policy, "fold_verdict", lambda *args: ({}, Unfolding("collectives", "refused")))
    summary = simulate(scenario_from_text(ALTERNATING, "inline.yaml", [])).summary
    assert not summary["folded"] and summary["simulated_ranks"] == 32 and summary["fold_off_reason"] == "refused"
    refused = {"why": "mirrored collectives would load the links differently", "reason": "refused"}
    assert summary["fold_given_up"] == [{"fold": "classes", "simulated_ranks": 2, **refused},
                                        {"fold": "stage", "simulated_ranks": 1, **refused}]
    assert folding_text(summary) == (
        "32 of 32 ranks simulated; the classes fold given up: mirrored collectives would load the links "
        "differently; the stage fold given up for the same reason")


BY_HOST = RankClasses((0,) * 8 + (1,) * 8)
"""Positions 0-7 (hosts 0 and 2) in one class, 8-15 (hosts 1 and 3) in the other."""
OUT_OF_STEP = "send_recv 'send bwd mb6' over GPUs [0, 16] ended on its mirrors between 56.87 ms and 57.05 ms"


def test_the_wrap_hand_off_meets_the_dp_ring_on_one_hosts_spine_uplink_only():
    """The fabric's hash: rank 0's wrap to rank 16 and its mirror from rank 8 to rank 24 both take spine 0 (one
    host per leaf group: the same offset hashes alike), but the DP ring's channel 0 runs 0 to 8 over spine 1 and
    8 to 0 over spine 0, so only host 1's wrap shares its uplink. Folded with one rank per stage, the wrap's
    mirror ended 0.178 ms after it (3 instances out of step); classed also by their hand-offs' route loads,
    hosts 0 and 2 and hosts 1 and 3 each get a representative, and by the NVLink loads alone none."""
    loaded = scenario_from_text(WRAP_ON_UNLIKE_SPINES, "inline.yaml", [])
    topology = scenario_topology(loaded)

    def spine(src: int, dst: int) -> list[tuple[str, str]]:
        return [ends for ends in map(topology.link_ends.__getitem__, topology.path(src, dst)) if "spine" in ends[1]]

    assert spine(0, 16) == [("leaf0.r0", "spine0")] and spine(8, 24) == [("leaf1.r0", "spine0")]
    assert spine(0, 8) == [("leaf0.r0", "spine1")] and spine(8, 0) == [("leaf1.r0", "spine0")]
    settings = network_settings(loaded, topology)
    plans = plan_cache(topology, settings)
    program = step_program(loaded, topology, fold=True)
    assert program.ranks == (0, 16)
    _, _, kept_pace = run_step(program, topology, settings, plans=plans)
    assert kept_pace.collectives == ""
    assert kept_pace.hand_offs.startswith(OUT_OF_STEP + " in the folded run (3 instances out of step, by up to "
                                          "178.5 us)")
    shapes, order = program_indexes(program)
    assert rank_classes(program, plans, shapes, order) is None
    assert list(route_classes(program, plans, shapes, order)) == [BY_HOST]
    prepared = prepare_training(loaded, topology, StepFaultPlan())
    routed = next(route_steps(prepared.build, prepared.step, plans, "flow", settings.efficiency, StepFaultPlan()))
    assert routed is not None and routed.program.ranks == (0, 8, 16, 24)


def test_the_wrap_on_unlike_spines_folds_exactly_by_route_class(monkeypatch):
    """The folded run, after its stage fold's hand-offs fell out of step, runs again classed by route loads (4 of
    32 ranks): step time equal to the unfolded run's to the bit, every figure of the summary to 1e-9, and the
    representatives' ops start and end when they do unfolded, to the bit."""
    text = WRAP_ON_UNLIKE_SPINES + "run: {timeline: full}\n"
    runs = _counting_runs(monkeypatch)
    folded = simulate(scenario_from_text(text, "inline.yaml", []))
    assert runs == [(0, 16), (0, 8, 16, 24)]  # the stage fold's ends predict none apart: the route classes run
    unfolded = simulate(scenario_from_text(text, "inline.yaml", ["run.fold=false"]))
    assert folded.summary["folded"] and folded.summary["simulated_ranks"] == 4
    assert folded.summary["fold_routes_reason"].startswith(OUT_OF_STEP)
    assert "fold_off_reason" not in folded.summary and unfolded.summary["simulated_ranks"] == 32
    assert folded.summary["step_time_s"] == unfolded.summary["step_time_s"]
    assert_same_figures(folded.summary, unfolded.summary, 1e-9, 1e-15, "fold_routes_reason")
    columns = ["rank", "key", "start_s", "end_s"]
    ops = folded.timeline[folded.timeline["kind"] != "flow"]
    assert set(ops["rank"]) == {0, 8, 16, 24}
    same = unfolded.timeline[(unfolded.timeline["kind"] != "flow") & unfolded.timeline["rank"].isin({0, 8, 16, 24})]
    assert np.array_equal(ops[columns].sort_values(columns).to_numpy(), same[columns].sort_values(columns).to_numpy())


WRAP_OVER_SHARED_NICS = WRAP_ON_UNLIKE_SPINES.replace(
    "spines: 2, oversubscription: 2}", "spines: 4, oversubscription: 2, nics_per_node: 4}\ncollectives: {channels: 2}")
"""The wrap case with two GPUs per NIC and four spines: host 0's wraps to host 2 leave its even GPUs over spine 3
and its odd GPUs over spine 1, so the TP rails of one host meet the fabric unlike, which classes of whole hosts
cannot tell apart."""
WRAP_LATE = "send_recv 'send bwd mb6' over GPUs [0, 16] ended on its mirrors between 57.8 ms and 58.15 ms"


def test_a_route_classed_run_that_falls_out_of_step_too_runs_unfolded():
    """The fallback after route classes: the stage-folded run's wrap falls out of step (5 instances, by up to
    357 us), route classes give one representative per host of each stage (4 of 32 ranks), and that run's
    mirrors fall out of step too (10 instances, by up to 357 us), so the step runs unfolded: every summary
    figure is the unfolded run's, the reason is the stage fold's, and no route reason is reported; both folds are
    listed as given up in the summary, each with the wrap's figures (each run stops at the wrap's first instance
    out of step, engine/lockstep.py `LockstepWatch`, so both give that instance), and in the printed line, each
    with its short why."""
    loaded = scenario_from_text(WRAP_OVER_SHARED_NICS, "inline.yaml", [])
    topology = scenario_topology(loaded)

    def spine(src: int, dst: int) -> list[str]:
        return [ends[1] for ends in map(topology.link_ends.__getitem__, topology.path(src, dst)) if "spine" in ends[1]]

    assert [spine(lane, lane + 16) for lane in range(4)] == [["spine3"], ["spine1"], ["spine3"], ["spine1"]]
    settings = network_settings(loaded, topology)
    prepared = prepare_training(loaded, topology, StepFaultPlan())
    assert prepared.step.program.ranks == (0, 16)
    routed = next(route_steps(prepared.build, prepared.step, prepared.plans, "flow", settings.efficiency,
                              StepFaultPlan()))
    assert routed is not None and routed.program.ranks == (0, 8, 16, 24)
    _, _, kept_pace = run_step(routed.program, topology, settings, plans=prepared.plans)
    assert kept_pace.collectives == ""
    assert kept_pace.hand_offs.startswith(WRAP_LATE + " in the folded run (10 instances out of step, by up to "
                                          "357 us)")
    folded = simulate(loaded).summary
    unfolded = simulate(scenario_from_text(WRAP_OVER_SHARED_NICS, "inline.yaml", ["run.fold=false"])).summary
    assert not folded["folded"] and folded["simulated_ranks"] == 32 and "fold_routes_reason" not in folded
    stopped = " in the folded run (the run stopped there, its first instance out of step, by 357 us)"
    assert folded.pop("fold_off_reason").startswith(WRAP_LATE + stopped)
    assert folding_text(folded) == (
        "32 of 32 ranks simulated; the stage fold given up: a hand-off fell out of step in its run; the routes fold "
        "given up for the same reason")
    stage, routes = folded.pop("fold_given_up")
    for entry, ranks in ((stage, 2), (routes, 4)):
        assert entry["fold"] == ("stage" if ranks == 2 else "routes") and entry["simulated_ranks"] == ranks
        assert entry["why"] == "a hand-off fell out of step in its run"
        assert entry["reason"].startswith(WRAP_LATE + stopped)
        apart = entry["out_of_step"]
        assert (apart["op"], apart["name"], apart["group"]) == ("send_recv", "send bwd mb6", [0, 16])
        assert [round(end * 1e3, 4) for end in apart["ended_s"]] == [57.7956, 58.1525]
        assert apart["stopped_at_s"] == apart["ended_s"][1] and "instances" not in apart
        assert apart["widest_s"] == pytest.approx(0.357e-3, abs=5e-7)
    assert folded == unfolded


@pytest.mark.parametrize("widest, shown", [(0.00099999, "1 ms"), (1234.5, "1,234 s")])
def test_an_out_of_step_gap_reads_as_the_console_writes_it(widest, shown):
    """The gap a fold reason gives (engine/lockstep.py `OutOfStep.reason`) is written as the console's ranks row
    writes it (units.py `format_seconds`): 0.99999 ms as '1 ms', not '1000 us'; 1234.5 s as '1,234 s', not
    '20.57 min'."""
    apart = OutOfStep(op="send_recv", name="send fwd mb0", group=(0, 16), earliest_s=1.0, latest_s=1.0 + widest,
                      instances=2, widest_s=widest, copies=((0, 16), (8, 24)), links=(2, 4))
    assert f"(2 instances out of step, by up to {shown})" in apart.reason()
    stopped = replace(apart, instances=1, stopped_at_s=1.0 + widest)
    assert f"(the run stopped there, its first instance out of step, by {shown})" in stopped.reason()


def _counting_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The simulated ranks of each run of a step that `simulate` makes, in order."""
    runs: list[tuple[int, ...]] = []
    real = simulation.run_step

    def counted(program: StepProgram, *args, **kwargs):
        runs.append(program.ranks)
        return real(program, *args, **kwargs)

    monkeypatch.setattr(simulation, "run_step", counted)
    return runs


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, ...] | None]]:
    """The refolds `simulate` tries after a folded run's hand-offs fell out of step, in order, each with the
    ranks it simulates (None where it did not apply); route classes as `route_step`, one entry per proposal
    drawn from `route_steps`."""
    tried: list[tuple[str, tuple[int, ...] | None]] = []

    def record(name: str, found: FoldedStep | Deferred | None) -> FoldedStep | Deferred | None:
        tried.append((name, None if found is None else found.ranks if isinstance(found, Deferred)
                      else found.program.ranks))
        return found

    def recorded(name: str, step: Callable[..., FoldedStep | None]) -> Callable[..., FoldedStep | None]:
        return lambda *args: record(name, step(*args))

    real_routes = fold_policy.route_steps
    monkeypatch.setattr(fold_policy, "route_steps",
                        lambda *args: (record("route_step", found) for found in real_routes(*args)))
    for name in ("lane_step", "meet_step"):
        monkeypatch.setattr(fold_policy, name, recorded(name, getattr(fold_policy, name)))
    return tried


@pytest.mark.parametrize("tp, cp, lanes, ended", [
    (4, 2, (0, 4, 16, 20), "46.38 ms and 46.55 ms"),
    (2, 4, (0, 2, 4, 6, 16, 18, 20, 22), "41.96 ms and 42.31 ms")])
def test_hand_offs_apart_on_hosts_and_on_lanes_fold_exactly_by_their_meet(monkeypatch, tp, cp, lanes, ended):
    """The wrap case with TP x CP on each host: folded by stage, the wrap's copies in CP lane 0 on hosts 0 and 1
    ended apart (the spine hash tells the hosts apart, not the lanes), so route classes are proposed first (4 of
    32 ranks: 0 and 8, 16 and 24), then the lanes, then their meet, one rank per lane of each host (8 or 16 of 32
    ranks). The stage fold's run showed a host's lanes' copies of the wrap ending apart, and each host's, so the
    route classes and the lanes are deferred (run, each fell out of step at that wrap) and the meet runs first,
    keeps pace, and refutes both by its ends: the stage fold and the meet run, route classes and lanes neither
    built nor run. The step is the unfolded one to the bit,
    as are the representatives' ops, and every figure of the summary is within 1e-12 (per-GPU averages summed
    over the simulated ranks and over all 32)."""
    text = WRAP_ON_UNLIKE_SPINES.replace("tp: 8,", f"tp: {tp}, cp: {cp},")
    loaded = scenario_from_text(text, "inline.yaml", [])
    topology = scenario_topology(loaded)
    prepared = prepare_training(loaded, topology, StepFaultPlan())
    assert prepared.step.program.ranks == (0, 16)
    _, _, kept_pace = run_step(prepared.step.program, topology, network_settings(loaded, topology),
                               plans=prepared.plans)
    assert kept_pace.hand_offs_within_lanes and kept_pace.collectives == ""
    layout = Layout(tp=tp, cp=cp, pp=2, dp=2)
    met = RankClasses((0,) * 8 + (1,) * 8).meet(lane_classes(layout))
    assert met == RankClasses(tuple(position // tp for position in range(16)))  # one per lane (TP group) of a host
    tried = _recording(monkeypatch)
    runs = _counting_runs(monkeypatch)
    folded = simulate(scenario_from_text(text + "run: {timeline: full}\n", "inline.yaml", []))
    simulated = tuple(range(0, 32, tp))
    assert tried == [("route_step", (0, 8, 16, 24)), ("lane_step", lanes), ("meet_step", simulated)]
    assert runs == [(0, 16), simulated]
    refuted = "class-mates' hand-offs end apart unfolded"
    assert [(entry["fold"], entry["simulated_ranks"], entry["why"]) for entry in folded.summary["fold_given_up"]] == [
        ("stage", 2, "a hand-off fell out of step in its run"), ("routes", 4, refuted), ("lanes", len(lanes), refuted)]
    unfolded = simulate(scenario_from_text(text + "run: {timeline: full}\n", "inline.yaml", ["run.fold=false"]))
    assert folded.summary["folded"] and folded.summary["simulated_ranks"] == len(simulated)
    assert folded.summary["fold_meet_reason"].startswith(
        f"send_recv 'send bwd mb6' over GPUs [0, 16] ended on its mirrors between {ended} in the folded run (the "
        "run stopped there")
    assert folded.summary["step_time_s"] == unfolded.summary["step_time_s"]
    assert_same_figures(folded.summary, unfolded.summary, 1e-12, 1e-18, "fold_meet_reason")
    columns = ["rank", "key", "start_s", "end_s"]
    ops = folded.timeline[folded.timeline["kind"] != "flow"]
    assert set(ops["rank"]) == set(simulated)
    same = unfolded.timeline[(unfolded.timeline["kind"] != "flow") & unfolded.timeline["rank"].isin(simulated)]
    assert np.array_equal(ops[columns].sort_values(columns).to_numpy(), same[columns].sort_values(columns).to_numpy())


def _meet_stands_as_unfolded(summary: dict, text: str) -> None:
    """The wrap case's meet (8 of 32 ranks) stands, every figure of ``summary`` the unfolded run's of ``text``."""
    unfolded = simulate(scenario_from_text(text, "inline.yaml", ["run.fold=false"])).summary
    assert summary["folded"] and summary["simulated_ranks"] == 8
    assert summary["step_time_s"] == unfolded["step_time_s"]
    assert_same_figures(summary, unfolded, 1e-12, 1e-18, "fold_meet_reason")


def _route_run_drifting(monkeypatch) -> None:
    """Make the route classes' run (ranks 0, 8, 16, 24) report a collective other than a hand-off out of step."""
    real = simulation.run_step

    def drifting(program: StepProgram, *args, **kwargs) -> tuple[dict, object, Lockstep]:
        summary, log, kept_pace = real(program, *args, **kwargs)
        return summary, log, replace(kept_pace, collectives="drifted") if program.ranks == (0, 8, 16, 24) \
            else kept_pace

    monkeypatch.setattr(simulation, "run_step", drifting)


def test_a_refuted_refold_that_would_have_unfolded_the_step_leaves_the_meet_standing(monkeypatch):
    """The wrap case with TP 4 x CP 2, its route classes' run made to report a collective other than a hand-off
    out of step. Run in order, the route classes run first and so end the tries: the step unfolds (32 ranks).
    Deferred, they are refuted by the meet's run and never run, so the meet stands instead: a fold that kept pace
    in its own run, every figure the unfolded run's."""
    text = WRAP_ON_UNLIKE_SPINES.replace("tp: 8,", "tp: 4, cp: 2,")
    _route_run_drifting(monkeypatch)
    runs = _counting_runs(monkeypatch)
    summary = simulate(scenario_from_text(text, "inline.yaml", [])).summary
    met = tuple(range(0, 32, 4))
    assert runs == [(0, 16), met]
    assert [(entry["fold"], entry["simulated_ranks"]) for entry in summary["fold_given_up"]] == [
        ("stage", 2), ("routes", 4), ("lanes", 4)]
    _meet_stands_as_unfolded(summary, text)


def test_a_deferred_refold_not_refuted_runs_after_the_one_that_kept_pace(monkeypatch):
    """The wrap case with TP 4 x CP 2, the meet's ends made to refute nothing (`refold_evidence.refuted`): after
    the meet keeps pace, the deferred route classes and lanes are built and run in the order proposed, each falls
    out of step at the wrap, and the meet stands, every figure the unfolded run's; the folds given up are those
    the refolds run in order give, in that order."""
    from simulator.engine import refold_evidence

    text = WRAP_ON_UNLIKE_SPINES.replace("tp: 8,", "tp: 4, cp: 2,")
    monkeypatch.setattr(refold_evidence, "refuted", lambda *args: "")
    runs = _counting_runs(monkeypatch)
    summary = simulate(scenario_from_text(text, "inline.yaml", [])).summary
    met = tuple(range(0, 32, 4))
    assert runs == [(0, 16), met, (0, 8, 16, 24), (0, 4, 16, 20)]
    assert [(entry["fold"], entry["simulated_ranks"], entry["why"]) for entry in summary["fold_given_up"]] == [
        (fold, ranks, "a hand-off fell out of step in its run") for fold, ranks in (("stage", 2), ("routes", 4),
                                                                                    ("lanes", 4))]
    _meet_stands_as_unfolded(summary, text)


def test_a_meet_that_falls_out_of_step_too_runs_unfolded(monkeypatch):
    """The wrap over shared NICs with TP 4 x CP 2: a host's even and odd GPUs hash their wraps onto two spines,
    which neither hosts nor lanes (GPUs 0-3 and 4-7) part, so route classes, lanes and their meet (8 of 32 ranks)
    each fall out of step and the step runs unfolded: every summary figure is the unfolded run's, the reason is
    the stage fold's, and no refold's reason is reported; the folds given up are listed in the order proposed,
    each stopped at the wrap's first instance out of step (it fell out of step 5 times by stage, 10 by route class
    and by lane, 14 by their meet, when each ran to its end). Every instance before it kept pace, so each folded
    run is the unfolded one up to there and stops where the unfolded run's last copy of that wrap ends (its 16
    copies, `pp.bwd.mb6.vs2.*`, end between 47.31 ms and 47.67 ms)."""
    text = WRAP_OVER_SHARED_NICS.replace("tp: 8,", "tp: 4, cp: 2,")
    tried = _recording(monkeypatch)
    folded = simulate(scenario_from_text(text, "inline.yaml", [])).summary
    assert tried == [("route_step", (0, 8, 16, 24)), ("lane_step", (0, 4, 16, 20)),
                     ("meet_step", (0, 4, 8, 12, 16, 20, 24, 28))]
    unfolded_run = simulate(scenario_from_text(text, "inline.yaml", ["run.fold=false"]))
    unfolded, timeline = unfolded_run.summary, unfolded_run.timeline
    copies = timeline[(timeline["kind"] == "collective") & timeline["key"].str.startswith("pp.bwd.mb6.vs2.")]
    assert copies["key"].nunique() == 16 and "send bwd mb6" in set(copies["name"])
    ended = [float(copies["end_s"].min()), float(copies["end_s"].max())]
    assert not folded["folded"] and folded["simulated_ranks"] == 32
    assert not {"fold_lanes_reason", "fold_routes_reason", "fold_meet_reason"} & folded.keys()
    assert folded.pop("fold_off_reason").startswith(
        "send_recv 'send bwd mb6' over GPUs [0, 16] ended on its mirrors between 47.31 ms and 47.67 ms in the "
        "folded run (the run stopped there")
    given_up = folded.pop("fold_given_up")
    assert [(entry["fold"], entry["simulated_ranks"], entry["out_of_step"]["ended_s"],
             entry["out_of_step"]["stopped_at_s"]) for entry in given_up] == [
        (fold, ranks, ended, ended[1]) for fold, ranks in (("stage", 2), ("routes", 4), ("lanes", 4), ("meet", 8))]
    assert {entry["why"] for entry in given_up} == {"a hand-off fell out of step in its run"}
    assert folded == unfolded


def test_each_fold_dropped_is_told_once_as_the_next_run_is_built(monkeypatch):
    """The wrap over shared NICs with TP 4 x CP 2, the meet not deferred (`refold_evidence.predicted_apart`
    made to pass it): route classes and lanes are deferred, the meet runs first and falls out of step, then route
    classes and lanes run in order and do too, and the step runs unfolded. `fold_given_up` lists them in the order
    proposed (routes, lanes, meet), while `on_rerun` hears of each fold dropped once, in the order the runs fell
    out of step, before each next run: the lanes' too, which run last."""
    from simulator.engine import refold_evidence
    from simulator.simulation import FoldDropped, Rerun

    real = refold_evidence.predicted_apart
    monkeypatch.setattr(refold_evidence, "predicted_apart",
                        lambda classes, *args: len(set(classes.of_position)) != 4 and real(classes, *args))
    heard: list[FoldDropped | Rerun] = []
    loaded = scenario_from_text(WRAP_OVER_SHARED_NICS.replace("tp: 8,", "tp: 4, cp: 2,"), "inline.yaml", [])
    summary = simulate(loaded, on_rerun=heard.append).summary
    assert not summary["folded"]
    assert [entry["fold"] for entry in summary["fold_given_up"]] == ["stage", "routes", "lanes", "meet"]
    told = [(notice.given_up["fold"], notice.given_up["simulated_ranks"]) if isinstance(notice, FoldDropped)
            else notice.unfolded for notice in heard]
    assert told == [("stage", 2), False, ("meet", 8), False, ("routes", 4), False, ("lanes", 4), True]


def test_a_refold_whose_other_collectives_fall_out_of_step_unfolds_at_once(monkeypatch):
    """The rule of the first folded run holds for refolds: on the wrap over shared NICs with TP 4 x CP 2, where
    route classes, lanes and their meet run in turn (above; each deferred when drawn, the stage fold's run having
    shown class-mates' copies of the wrap ending apart, then run in order as none keeps pace), a route run
    reported with a collective other than a hand-off out of step ends the tries, and the step runs unfolded with
    the stage fold's reason."""
    text = WRAP_OVER_SHARED_NICS.replace("tp: 8,", "tp: 4, cp: 2,")
    _route_run_drifting(monkeypatch)
    tried = _recording(monkeypatch)
    summary = simulate(scenario_from_text(text, "inline.yaml", [])).summary
    assert tried == [("route_step", (0, 8, 16, 24)), ("lane_step", (0, 4, 16, 20)),
                     ("meet_step", (0, 4, 8, 12, 16, 20, 24, 28))]
    assert not summary["folded"] and summary["simulated_ranks"] == 32
    assert not {"fold_lanes_reason", "fold_routes_reason", "fold_meet_reason"} & summary.keys()
    assert summary["fold_off_reason"].startswith("send_recv 'send bwd mb6' over GPUs [0, 16] ended on its mirrors "
                                                 "between 47.31 ms and 47.67 ms in the folded run (the run stopped "
                                                 "there")
    assert [(entry["fold"], entry["simulated_ranks"]) for entry in summary["fold_given_up"]] == [("stage", 2),
                                                                                                ("routes", 4)]


def test_no_meet_where_one_refold_did_not_run_or_refines_the_other():
    """The meet runs only after both refolds ran: with one (no CP lanes, say) it would be that one's classes again;
    with lanes finer than the route classes, it is the lanes'. A meet of classes of unequal size is one too (its
    run weighs each representative by its class's size)."""
    lanes = RankClasses((0, 1) * 8)
    hosts = RankClasses((0,) * 8 + (1,) * 8)
    by_host_and_lane = RankClasses((0, 1) * 4 + (2, 3) * 4)
    assert lanes.meet(hosts) == by_host_and_lane == by_host_and_lane.meet(lanes) == by_host_and_lane.meet(hosts)
    assert lanes.meet(RankClasses((0,) * 4 + (1,) * 12)) == RankClasses((0, 1) * 2 + (2, 3) * 6)
    folded = cast(FoldedStep, SimpleNamespace(classes=None, program=SimpleNamespace(layout=None)))

    def never(*args: object) -> StepProgram:
        raise AssertionError("no program is built")

    def ran(classes: RankClasses) -> FoldedStep:
        return cast(FoldedStep, SimpleNamespace(classes=classes))

    unused = (None, "flow", {})
    assert meet_step(never, folded, [ran(lanes)], *unused, StepFaultPlan()) is None
    assert meet_step(never, folded, [ran(hosts), ran(by_host_and_lane)], *unused, StepFaultPlan()) is None


def test_every_refold_is_judged_as_the_first_fold_is_ordered_or_not(monkeypatch):
    """`_refined_step`'s rule, with `fold_verdict` refusing every program: on the wrap case with TP 4 x CP 2
    (folded by stage, each refold small enough to order) route classes, lanes and their meet all run when
    judged by the real check and are refused by the refusing one; with no ordering (as for the DeepSeek
    candidate's 128 ranks) they are refused too, where route classes and lanes, which refine the stage fold, ran
    unjudged before; and so are lanes that cut across a step classed by NVLink loads (the CP fabric of
    tests/test_folding.py: hosts 0 and 3, hosts 1 and 2 of each stage): given up, with the check's reason."""
    loaded = scenario_from_text(WRAP_ON_UNLIKE_SPINES.replace("tp: 8,", "tp: 4, cp: 2,"), "inline.yaml", [])
    prepared = prepare_training(loaded, scenario_topology(loaded), StepFaultPlan())
    build, folded = prepared.build, prepared.step
    judged = (prepared.plans, "flow", prepared.settings.efficiency)

    def refolds() -> list[tuple[int, ...] | GivenUp | None]:
        routes = next(route_steps(build, folded, *judged, StepFaultPlan()), None)
        lanes = lane_step(build, folded, *judged, StepFaultPlan())
        ran = [step for step in (routes, lanes) if isinstance(step, FoldedStep)]
        met = meet_step(build, folded, ran, *judged, StepFaultPlan()) if len(ran) == 2 else None
        return [step.program.ranks if isinstance(step, FoldedStep) else step for step in (routes, lanes, met)]

    cp_loaded = scenario_from_text(CP_FABRIC_TEMPLATE, "inline.yaml", [
        "cluster.nodes=8", "cluster.leaf_ports=2", "parallelism.tp=4", "parallelism.cp=4", "parallelism.pp=2",
        "parallelism.dp=2", "parallelism.cp_algorithm=all_gather", "collectives.protocol=simple"])
    classed = prepare_training(cp_loaded, scenario_topology(cp_loaded), StepFaultPlan())
    assert classed.step.classes == RankClasses((0,) * 8 + (1,) * 16 + (0,) * 8)
    assert folded.classes is None and folded.program.ranks == (0, 16)
    assert refolds() == [(0, 8, 16, 24), (0, 4, 16, 20), (0, 4, 8, 12, 16, 20, 24, 28)]

    def refuse(*args: object) -> tuple[dict, Unfolding]:
        return {}, Unfolding("collectives", "refused")

    refused = Unfolding("collectives", "refused")
    monkeypatch.setattr(fold_policy, "fold_verdict", refuse)
    assert refolds() == [GivenUp("routes", 4, refused), GivenUp("lanes", 4, refused), None]
    monkeypatch.setattr(fold_policy, "program_indexes", lambda program: (CollectiveShapes.of(program.ops),
                                                                         SimpleNamespace(ordering=None,
                                                                                         skipped_when_asked=None)))
    assert refolds() == [GivenUp("routes", 4, refused), GivenUp("lanes", 4, refused), None]
    assert lane_step(classed.build, classed.step, classed.plans, "flow", classed.settings.efficiency,
                     StepFaultPlan()) == GivenUp("lanes", 8, refused)


def test_refolds_too_large_to_order_that_the_check_refuses_unfold_the_step(monkeypatch):
    """End to end, the same rule: the wrap case with TP 4 x CP 2, no program ordered (`ORDERING_BUDGET_BYTES` 0, as
    beyond the ordering's budget) and a check that passes the stage fold but refuses every refold, asking for their
    ordering as the real check does. The stage fold runs and its wrap falls out of step; route classes and lanes are
    deferred unbuilt (the stage fold's run showed class-mates' copies of the wrap ending apart in each), so their
    meet is proposed first and refused before its run, then each of them is built and refused (unjudged, route
    classes would keep pace), and the step runs unfolded: the folds given up say so in the order proposed, the
    refused ones `unordered`, not only the program that ran in `ordering_skipped`."""
    from simulator.engine import ordering

    real = fold_policy.fold_verdict

    def refuse_refolds(program: StepProgram, *args: object) -> tuple[dict, Unfolding | None]:
        if program.ranks != (0, 16):
            assert args[-1].ordering is None  # type: ignore[attr-defined]
            return {}, Unfolding("collectives", "refused")
        return real(program, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ordering, "ORDERING_BUDGET_BYTES", 0)
    monkeypatch.setattr(fold_policy, "fold_verdict", refuse_refolds)
    summary = simulate(scenario_from_text(WRAP_ON_UNLIKE_SPINES.replace("tp: 8,", "tp: 4, cp: 2,"), "inline.yaml",
                                          [])).summary
    assert not summary["folded"] and summary["simulated_ranks"] == 32
    assert [(entry["fold"], entry["simulated_ranks"], entry["why"], entry.get("unordered", False))
            for entry in summary["fold_given_up"]] == [
        ("stage", 2, "a hand-off fell out of step in its run", False),
        ("routes", 4, "mirrored collectives would load the links differently", True),
        ("lanes", 4, "mirrored collectives would load the links differently", True),
        ("meet", 8, "mirrored collectives would load the links differently", True)]


def test_where_only_lanes_ran_the_meet_takes_a_classed_steps_own_classes_for_the_hosts():
    """On the CP fabric of tests/test_folding.py the folded step is classed by NVLink loads (hosts 0 and 3, hosts
    1 and 2 of each stage: 4 of 64 ranks), which route classes may add nothing to (`route_steps` then gives none):
    where only the lanes ran (8 ranks) and fell out of step, the meet is one rank per CP lane of each of those
    classes (16 ranks); without a refold run, or with a stage fold and one refold, none."""
    loaded = scenario_from_text(CP_FABRIC_TEMPLATE, "inline.yaml", [
        "cluster.nodes=8", "cluster.leaf_ports=2", "parallelism.tp=4", "parallelism.cp=4", "parallelism.pp=2",
        "parallelism.dp=2", "parallelism.cp_algorithm=all_gather", "collectives.protocol=simple"])
    prepared = prepare_training(loaded, scenario_topology(loaded), StepFaultPlan())
    build, folded = prepared.build, prepared.step
    judged = (prepared.plans, "flow", prepared.settings.efficiency)
    assert folded.program.ranks == (0, 8, 16, 24)
    lanes = lane_step(build, folded, *judged, StepFaultPlan())
    assert lanes is not None and lanes.program.ranks == (0, 4, 8, 12, 16, 20, 24, 28)
    met = meet_step(build, folded, [lanes], *judged, StepFaultPlan())
    assert met is not None and met.classes == RankClasses(tuple(position // 4 for position in range(32)))
    assert met.program.ranks == (0, 4, 8, 12, 32, 36, 40, 44, 16, 20, 24, 28, 48, 52, 56, 60)
    assert meet_step(build, folded, [], *judged, StepFaultPlan()) is None
    assert meet_step(build, replace(folded, classes=None), [lanes], *judged, StepFaultPlan()) is None


def test_a_classed_steps_route_refolds_class_the_stage_fold_it_was_classed_from():
    """A step classed by NVLink loads keeps the stage fold it was classed from, with its indexes, so that its route
    refolds (`route_steps`) class that fold's ranks without building it or ordering its collectives again (the
    DeepSeek-V3-style DualPipeV step at global batch 2048 would build its 36,377-op stage fold twice); dropped, the
    stage fold is built again, and the refolds drawn are the same."""
    loaded = scenario_from_text(CP_FABRIC_TEMPLATE, "inline.yaml", [
        "cluster.nodes=8", "cluster.leaf_ports=2", "parallelism.tp=4", "parallelism.cp=4", "parallelism.pp=2",
        "parallelism.dp=2", "parallelism.cp_algorithm=all_gather", "collectives.protocol=simple"])
    prepared = prepare_training(loaded, scenario_topology(loaded), StepFaultPlan())
    folded = prepared.step
    assert folded.kind == "classes" and folded.stage_fold is not None
    assert folded.stage_fold.program.ranks == (0, 16) and folded.stage_fold.order.ordering is not None
    built: list[RankClasses | None] = []

    def build(fold: bool, classes: RankClasses | None) -> StepProgram:
        built.append(classes)
        return prepared.build(fold, classes)

    judged = (prepared.plans, "flow", prepared.settings.efficiency, StepFaultPlan())
    kept = [step if not isinstance(step, FoldedStep) else step.program.ranks
            for step in route_steps(build, folded, *judged)]
    assert None not in built
    built.clear()
    rebuilt = [step if not isinstance(step, FoldedStep) else step.program.ranks
               for step in route_steps(build, replace(folded, stage_fold=None), *judged)]
    assert built[0] is None and rebuilt == kept


def test_route_classes_come_from_the_signature_and_fall_back_to_hosts(monkeypatch):
    """On the cross-rail fabric the route signatures (the hops alone, and with the loads met on them: the same
    classes, proposed once) put a stage's replicas 0 and 2 in one class and 1 and 3 in the other (two
    representatives per stage), and classing by host, proposed after them, gives each replica its own (four).
    Where the signatures give no classes at all (here, stubbed) ranks are classed by host alone: the fallback that
    the DeepSeek search candidate's fold (docs/studies.md) rests on."""
    loaded = scenario_from_text(CROSS_RAIL_PP, "inline.yaml", [])
    topology = scenario_topology(loaded)
    plans = plan_cache(topology, network_settings(loaded, topology))
    program = step_program(loaded, topology, fold=True)
    shapes, order = program_indexes(program)
    by_host = RankClasses((0,) * 4 + (1,) * 4 + (2,) * 4 + (3,) * 4)
    assert rank_classes(program, plans, shapes, order) is None
    assert list(route_classes(program, plans, shapes, order)) == [RankClasses((0, 0, 0, 0, 1, 1, 1, 1) * 2),
                                                                  by_host]
    monkeypatch.setattr("simulator.engine.rank_classes._route_signatures", lambda *args: {})
    monkeypatch.setattr("simulator.engine.rank_classes._hop_signatures", lambda *args: {})
    assert list(route_classes(program, plans, shapes, order)) == [RankClasses((0, 0, 0, 0, 1, 1, 1, 1) * 2),
                                                                  by_host]
    monkeypatch.setattr("simulator.engine.rank_classes._period_signatures", lambda *args: {})
    assert list(route_classes(program, plans, shapes, order)) == [by_host]


RING_ACROSS_OVERSUBSCRIBED_SPINES = """
cluster: {topology: dgx-h100-cluster, nodes: 16, leaf_ports: 4, spines: 4, oversubscription: 4}
model: {layers: 8, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 4096, microbatches: 8, precision: bf16}
parallelism: {tp: 8, pp: 2, zero: 1, order: [tp, cp, pp, dp]}
"""
"""16 DGX H100 in leaf groups of four over spines at 4:1; TP 8 in a host, PP 2, DP 8: replica r on hosts 2r and
2r + 1, two replicas per leaf group. Each stage's DP ring runs over its hosts in turn and crosses the spines from
the last replica of every leaf group only, a hop that outlasts those inside a leaf group: replica 1's backward
hand-off from host 3 shares its NIC's uplink with the ring's hop from host 3 to host 5 (103 us unfolded), where
replica 0's from host 1 has it to itself (58 us)."""


def test_hand_offs_apart_by_place_in_the_leaf_group_fold_exactly_by_that_place(monkeypatch):
    """The stage fold's backward hand-off falls out of step (replica 1's copy meets its DP ring's crossing of the
    spines, replica 0's does not); hops, loads and places in the ring part no hosts, so the hosts' places in their
    leaf group (the period of the spine hash) are proposed before one class per host: 4 of 128 ranks, which keep
    pace, every figure of the summary the unfolded run's within 1e-12 (by host it would be 16 ranks); the fold's
    flows are sent for two of the eight replicas, the first leaf group's (engine/replicas.py)."""
    tried = _recording(monkeypatch)
    loaded = scenario_from_text(RING_ACROSS_OVERSUBSCRIBED_SPINES, "inline.yaml", [])
    folded = simulate(loaded).summary
    unfolded = simulate(scenario_from_text(RING_ACROSS_OVERSUBSCRIBED_SPINES, "inline.yaml", ["run.fold=false"]))
    assert [entry for entry in tried if entry[1] is not None] == [("route_step", (0, 16, 8, 24))]
    assert folded["folded"] and folded["simulated_ranks"] == 4 and "fold_off_reason" not in folded
    assert folded["fold_routes_reason"].startswith("send_recv 'recv bwd mb7' over GPUs [8, 0] ended on its mirrors")
    assert folded.pop("replica_quotient") == {"replicas": 8, "replicas_sent": 2}
    assert folded["step_time_s"] == unfolded.summary["step_time_s"]
    assert_same_figures(folded, unfolded.summary, 1e-12, 1e-15, "fold_routes_reason")
