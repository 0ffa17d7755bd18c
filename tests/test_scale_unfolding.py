"""Steps asked to fold that a fold check unfolds (the plan's unbalanced context parallelism, the cluster, the
collectives' symmetry on the flow model, the step's faults, a job's spine-down state) are estimated again
unfolded and refused beyond the scale limits before the unfolded program is built, in one located line naming
why; `--force` runs them. The limits are lowered here to the folded step's estimate, so the folded run passes
and the unfolded one is beyond."""

from __future__ import annotations

import contextlib
import itertools

import pytest
from shared import star_graph

from simulator import scale, simulation, stage_remedies
from simulator.cli import main
from simulator.config.loader import load_scenario
from simulator.engine.fold_policy import LINKS_DURING_STEP
from simulator.errors import ScenarioError
from simulator.faults.step import StepFaultPlan
from simulator.memory_remedies import rebuilt
from simulator.parallel.layout import Layout
from simulator.program.unfolding import Unfolding
from simulator.reliability.simulate import simulate_job
from simulator.stage_remedies import aligned_stage_remedies, hands_on_alike
from simulator.topology.loader import scenario_topology

RAILS = """cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2}
model: {layers: 4, hidden: 4096, heads: 32, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {tp: 8, dp: 4}
run: {timeline: summary}
"""
SHARED_NICS = (RAILS.replace("spines: 2}", "spines: 2, nics_per_node: 4, oversubscription: 2}")
               + "collectives: {channels: 2}\n")
"""Four NICs per host under 2:1 spines: the replicas' all-reduces meet the fabric's links unevenly, and the
symmetry check unfolds the step (tests/test_reliability_states.py)."""
LINK_DOWN = "faults: {step: {links: [{link: [leaf0.r0, spine0], at: 1 ms}]}}\n"
NIC_DOWN_PP = (RAILS.replace("{tp: 8, dp: 4}", "{tp: 8, pp: 2, dp: 2}")
               + "faults: {step: {links: [{link: [leaf0.r0, h0/nic0]}]}}\n")
"""A NIC cable down from the step's start near hosts 0 and 1, one pipeline replica: the other replica's ranks
each share a DP group with a near rank, so every class of the links fold holds one rank."""
GRAPH = star_graph([0, 1, 2, 3])
UNBALANCED_CP = """cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 8192, microbatches: 1}
parallelism: {tp: 2, cp: 4, cp_load_balance: false}
run: {timeline: summary}
"""
"""Without load balancing, causal CP ranks do different attention work: the plan cannot fold
(tests/test_context_parallel.py)."""
ON_GRAPH = """cluster: {topology: graph.yaml}
model: {synthetic: {stages: 2, forward: 1 ms, backward: 2 ms, p2p_bytes: 1 MiB}}
training: {microbatches: 4}
parallelism: {pp: 2, dp: 2}
run: {timeline: summary}
"""


def _write(tmp_path, text: str) -> str:
    (tmp_path / "graph.yaml").write_text(GRAPH)
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return str(path)


def _limit_to_the_folded_step(monkeypatch, path: str, overrides: list[str]) -> scale.ScaleEstimate:
    """Lower the event limit to the folded step's estimate; the unfolded step's estimate, beyond it."""
    loaded = load_scenario(path, overrides)
    gpus = scenario_topology(loaded).num_gpus
    hosts = scale.scenario_hosts(loaded)
    folded = scale.estimate_scale(loaded.scenario, gpus, hosts)
    run = loaded.scenario.run.model_copy(update={"fold": False})
    unfolded = scale.estimate_scale(loaded.scenario.model_copy(update={"run": run}), gpus, hosts)
    assert folded is not None and unfolded is not None and folded.events < unfolded.events
    monkeypatch.setattr(scale, "MAX_EVENTS", folded.events)
    return unfolded


def _recording_builds(monkeypatch) -> list[bool]:
    """The `fold` of every step program the runs build."""
    builds: list[bool] = []
    build = simulation.step_program

    def recorded(loaded, topology, *, fold, guard=None, classes=None):
        builds.append(fold)
        return build(loaded, topology, fold=fold, guard=guard, classes=classes)

    monkeypatch.setattr(simulation, "step_program", recorded)
    return builds


CASES = {
    "plan": (UNBALANCED_CP, 4, "parallelism.cp_load_balance",
             "context parallelism without causal load balancing (CP ranks do different attention work)",
             "true (every CP rank then does the same attention work)", [True]),
    "cluster": (ON_GRAPH, 1, "cluster", "explicit graph topology (links may differ between equivalent ranks)",
                "a generated topology whose hosts have equal GPU counts", []),
    "collectives": (SHARED_NICS, 1, "cluster", "all_reduce 'all_reduce bucket 0' takes 2.181 ms over GPUs",
                    "network.model: analytic (each collective alone: replicas whose routes take equal times fold)",
                    [True]),
    "changing": (RAILS + LINK_DOWN, 6, "faults.step", LINKS_DURING_STEP,
                 "link faults for the whole step (from its start, without until: they fold by the hosts near them)",
                 [True]),
    "links": (NIC_DOWN_PP, 6, "faults.step", "links down: every class holds one rank (the ranks of the hosts near "
              "them apart, the others by rail and by the near ranks their groups hold) (2 of 4 hosts near)",
              "link faults near fewer hosts (each rank of a host near them is simulated apart)", [True]),
}


SIZE_ADVICE = {"plan": " (cluster.gpus)", "cluster": "", "collectives": " (cluster.nodes)",
               "changing": " (cluster.nodes)", "links": " (cluster.nodes)"}
"""Each case's cluster's own size parameter (one DGX H100: its GPUs; a graph: none), which the advice names (it
said cluster.nodes whatever the topology)."""


@pytest.mark.parametrize("case", CASES)
def test_a_step_unfolded_beyond_the_limits_is_refused_before_it_is_built(case, monkeypatch, tmp_path, capsys):
    """Each route that unfolds a step asked to fold: one located line at the field of the check, naming the reason the
    run's `fold_off_reason` gives and the unfolded estimate (4 GPUs of a graph; 32 GPUs, TP 8 x DP 4; 8 GPUs, TP 2 x
    CP 4), and no unfolded program built or run (the cluster's check comes before any build, the plan's inside the
    folded build before its ops, the others after the folded program)."""
    text, line, field, reason, advice, built = CASES[case]
    path = _write(tmp_path, text)
    unfolded = _limit_to_the_folded_step(monkeypatch, path, [])
    builds = _recording_builds(monkeypatch)
    out = tmp_path / "out"
    assert main(["run", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: {path}:{line}: {field}: this run is too large to simulate unfolded ({reason}")
    assert (f"): {unfolded.describe()}; ops + flows ~{unfolded.events:,} over the limit of {scale.MAX_EVENTS:,} "
            f"(allowed: {advice}") in err
    assert err.endswith(f"a smaller cluster{SIZE_ADVICE[case]}; or pass --force)")
    assert builds == built and not out.exists()


@pytest.mark.parametrize("case", CASES)
def test_force_runs_the_unfolded_step(case, monkeypatch, tmp_path, capsys):
    """`--force` runs the step unfolded, every GPU a simulated rank, with the reason the refusal named."""
    text, _, _, reason, _, _ = CASES[case]
    path = _write(tmp_path, text)
    unfolded = _limit_to_the_folded_step(monkeypatch, path, [])
    summary = simulation.simulate(load_scenario(path), force=True).summary
    assert summary["folded"] is False and summary["fold_off_reason"].startswith(reason)
    assert summary["simulated_ranks"] == unfolded.simulated_ranks == summary["gpus"]


def test_a_folded_step_under_the_lowered_limits_runs_folded(monkeypatch, tmp_path):
    """The same cluster and layout without the asymmetry: folded, one simulated rank (TP 8 x DP 4, no PP), the
    guard never asked, one program built."""
    path = _write(tmp_path, RAILS)
    _limit_to_the_folded_step(monkeypatch, path, [])
    builds = _recording_builds(monkeypatch)
    summary = simulation.simulate(load_scenario(path)).summary
    assert summary["folded"] is True and summary["simulated_ranks"] == 1 and "fold_off_reason" not in summary
    assert builds == [True]


SPINE_JOB = RAILS + """checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
faults:
  components:
    spine: {unit: spine_switch, effect: degrade, mtbf: 2 h, repair: 1 h}
"""


def test_a_job_state_with_a_spine_down_that_unfolds_is_refused(monkeypatch, tmp_path):
    """4 NICs per host under 2 spines: the healthy step folds, but one spine down doubles the uplinks' oversubscription
    and the symmetry check unfolds that state's step. Beyond the limits the job is refused when it meets the state,
    before building it unfolded; `force` runs it, and the state's step is the slower one."""
    path = _write(tmp_path, SPINE_JOB)
    overrides = ["cluster.nics_per_node=4", "run.horizon=1 d", "run.replications=1"]
    _limit_to_the_folded_step(monkeypatch, path, overrides)
    with pytest.raises(ScenarioError) as refused:
        simulate_job(load_scenario(path, overrides))
    assert refused.value.field == "cluster", str(refused.value)
    assert refused.value.problem.startswith("the job's step with 1 spine switch(es) down is too large to simulate "
                                            "unfolded (all_reduce 'all_reduce bucket 0' takes")
    states = simulate_job(load_scenario(path, overrides), force=True).summary["states"]
    healthy, spine_down = states[0], next(state for state in states if state["spines_down"] == 1)
    assert spine_down["step_time_s"] > healthy["step_time_s"]


@pytest.mark.parametrize("case", CASES)
def test_validate_refuses_what_the_run_refuses(case, monkeypatch, tmp_path, capsys):
    """`trainsim validate` checks the program the run would build, folded where the run folds it, so it gives
    the run's refusal line; `validate --force` passes it."""
    text, line, field, reason, _, _ = CASES[case]
    path = _write(tmp_path, text)
    _limit_to_the_folded_step(monkeypatch, path, [])
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}:{line}: {field}: this run is too large to simulate unfolded ({reason}")
    assert main(["validate", path, "--force", "--quiet"]) == 0


CLASSED_CP = """cluster: {topology: dgx-h100-cluster, nodes: 2, node: {kind: nvswitch_node, gpus: 2}, nics_per_node: 1}
model: {layers: 2, hidden: 1024, heads: 8, vocab: 32000}
training: {seq_len: 8192, microbatches: 2}
parallelism: {cp: 2, dp: 2}
collectives: {algorithm: ring}
"""
"""Two hosts of two GPUs: CP groups (0, 1) and (2, 3), one inside each host; the gradients' all-reduce over all
four ranks is one ring (asked for: `auto` takes NCCL's tree there, whose chains run the same way in every
host), which runs one way through host 0's NVLink and the other way through host 1's (collectives/ring.py),
beside the CP rings: the healthy step folds with a representative per host (engine/rank_classes.py)."""
THROTTLE = """run: {horizon: 1 d, replications: 1}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
faults: {components: {throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 2 h, repair: 1 h}}}
"""
SHARES_LINKS = "stragglers in one replica whose traffic shares links with the other replicas'"


def test_straggler_states_of_a_classed_step_are_judged_on_the_program_they_run(monkeypatch, tmp_path):
    """The healthy step of CLASSED_CP simulates ranks 0 and 2, one per class, and has no mirrors at all: each class's CP
    ring stands only for itself and the all-reduce spans every rank. Stragglers in one replica fold onto one rank per
    stage or per straggler class only, so a straggler on GPU 0 is not folded on the classed program. A straggler
    state slows one rank of a stage, which `folded_step` never classes by NVLink loads: it judges one rank per stage,
    rank 0, whose CP ring (0, 1) is mirrored by (2, 3) on host 1, whose NVLink links the all-reduce's ring also
    takes: the slow replica's traffic meets another's, so the state refolds by the slow replica's classes, which are
    every rank (CP 2 x DP 2), and runs unfolded, all 4 ranks. The blocker, asked of the one-rank-per-stage program,
    names the sharing, the state's own run the classes, and a job whose unfolded states are beyond the scale limits
    is refused at its straggle class, for the reason the state's run gives, before it draws a failure, not when a
    replication meets the state."""
    from dataclasses import replace

    import simulator.reliability.simulate as job_simulation
    from simulator.config.loader import scenario_from_text
    from simulator.engine.fold_policy import EVERY_RANK_A_CLASS, fold_with_faults, straggler_blocker
    from simulator.faults.step import Slowdown

    loaded = scenario_from_text(CLASSED_CP)
    topology = scenario_topology(loaded)
    faults = simulation.step_faults(loaded, topology)
    healthy = simulation.prepare_training(loaded, topology, faults)
    classed = healthy.step.program
    assert classed.ranks == (0, 2) and not any(getattr(op, "mirrors", ()) for op in classed.ops)
    slowed = replace(faults, slowdowns=((0, Slowdown(1.5)),))
    unfolding = fold_with_faults(slowed, classed, healthy.plans, healthy.settings.mode, healthy.step.shapes)[1]
    assert unfolding is not None and unfolding.reason == (
        "stragglers in one pipeline replica fold onto one rank per stage or per class only")
    shared = straggler_blocker(healthy.step, healthy.build, healthy.plans, healthy.settings.mode, faults, 1.5)
    assert shared is not None and shared.shares_links and shared.reason == SHARES_LINKS
    state = simulation.simulate(scenario_from_text(
        CLASSED_CP + "faults: {step: {stragglers: [{gpus: [0], slowdown: 1.5}]}}\n")).summary
    assert (state["folded"], state["fold_off_reason"], state["simulated_ranks"]) == (False, EVERY_RANK_A_CLASS, 4)

    path = _write(tmp_path, CLASSED_CP + THROTTLE)
    _limit_to_the_folded_step(monkeypatch, path, [])
    classed_fold = scale._classes_estimate(load_scenario(path), 4, 2)  # the healthy step's fold by classes runs
    assert classed_fold is not None
    monkeypatch.setattr(scale, "MAX_EVENTS", classed_fold.events)
    drawn: list[int] = []
    monkeypatch.setattr(job_simulation, "draw_arrivals", lambda *args: drawn.append(1))
    with pytest.raises(ScenarioError) as refused:
        simulate_job(load_scenario(path))
    assert refused.value.field == "faults.components.throttle" and not drawn
    assert refused.value.problem.startswith(f"a throttle failure slows a pipeline stage, and each such state is "
                                            f"simulated as an unfolded step ({EVERY_RANK_A_CLASS}): ")


def test_validate_says_a_step_runs_unfolded_for_minutes_with_its_size_and_why(capsys):
    """DeepSeek-V3-style at ep 16 without PXN: `run` simulates all 1,024 ranks, 1,042,880 ops, for minutes.
    validate builds that program unfolded already and says so, with the run's size estimate and why the fold is
    off (the all-to-alls' cross-rail flows meet other collectives on the spines), without simulating, not just
    `valid` and the memory line."""
    assert main(["validate", "scenarios/deepseek-v3-style-1024-gpus.yaml", "--set", "parallelism.ep=16",
                 "--set", "network.pxn=false"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("  runs unfolded: 1,024 of 1,024 ranks, 1,042,880 ops and ~")
    assert lines[2].endswith(" flows (estimated), about 3 minutes")
    assert lines[3].startswith("  not folded: all_to_all 'ep dispatch L0.mlp' over GPUs [0, 1, 2, 3,")
    assert main(["validate", "scenarios/deepseek-v3-style-1024-gpus.yaml"]) == 0  # folded: nothing more to say
    assert len(capsys.readouterr().out.splitlines()) == 2


def size_lines(out: str) -> list[str]:
    """The lines of `validate`'s output after its memory line, less its one model-state line (the ZeRO sum that
    validate prints for a modelled step since 90343e97): the run's size, if it says one."""
    lines = out.splitlines()[2:]
    model_state = [line for line in lines if line.startswith("  model state per GPU: ")]
    assert len(model_state) == 1
    return [line for line in lines if line not in model_state]


def test_validate_says_so_of_a_step_run_unfolded_by_request(capsys, monkeypatch):
    """run.fold: false is unfolded without a reason to give; the line's minutes are its events over
    EVENTS_PER_MINUTE (lowered here so that eight ranks reach it)."""
    monkeypatch.setattr(scale, "EVENTS_PER_MINUTE", 100)
    assert main(["validate", "llama3-8b-dgx-h100-dp8", "--set", "run.fold=false"]) == 0
    size = size_lines(capsys.readouterr().out)
    assert len(size) == 1 and size[0].startswith("  runs unfolded: 8 of 8 ranks, ")
    ops, flows = (int(word.strip("~").replace(",", "")) for word in size[0].split()[6:10:3])
    assert size[0].endswith(f"about {(ops + flows) / 100:,.0f} minutes")


def test_validate_says_one_minute_in_the_singular(capsys, monkeypatch):
    """A step whose events make one minute's worth reads "about 1 minute", not "about 1 minutes"."""
    monkeypatch.setattr(scale, "EVENTS_PER_MINUTE", 100)
    assert main(["validate", "llama3-8b-dgx-h100-dp8", "--set", "run.fold=false"]) == 0
    [size] = size_lines(capsys.readouterr().out)
    ops, flows = (int(word.strip("~").replace(",", "")) for word in size.split()[6:10:3])
    monkeypatch.setattr(scale, "EVENTS_PER_MINUTE", ops + flows)
    assert main(["validate", "llama3-8b-dgx-h100-dp8", "--set", "run.fold=false"]) == 0
    assert size_lines(capsys.readouterr().out)[0].endswith(" flows (estimated), about 1 minute")


def test_validate_says_how_long_a_parameter_server_run_takes_at_its_own_rate(capsys, monkeypatch):
    """A parameter-server run's events cost ~8 times a training step's (every flow re-solves the pushes sharing the
    server NICs): 32 hosts at 10 iterations, ~0.5 M events, run ~2 minutes, which validate says. The line divides by
    `PS_EVENTS_PER_MINUTE` (lowered here so that the bundled 4-host run reaches it)."""
    monkeypatch.setattr(scale, "PS_EVENTS_PER_MINUTE", 1_000)
    assert main(["validate", "parameter-server-vs-allreduce"]) == 0
    size = capsys.readouterr().out.splitlines()[2:]
    assert len(size) == 1 and size[0].startswith("  runs unfolded: 32 of 32 ranks, ")
    ops, flows = (int(word.strip("~").replace(",", "")) for word in size[0].split()[6:10:3])
    assert size[0].endswith(f"about {(ops + flows) / 1_000:,.0f} minutes")


UNALIGNED_STAGES = """cluster: {topology: gb200-nvl72, racks: 2, trays: 6}
model: {preset: llama3-8b, layers: 24}
training: {seq_len: 1024, global_batch: 12, micro_batch: 1}
parallelism: {tp: 4, pp: 4, dp: 3, order: [tp, cp, pp, dp], pipeline: {schedule: interleaved, virtual_stages: 2}}
run: {timeline: summary}
collectives: {algorithm: ring}
"""
"""Replicas of 16 GPUs on racks of 24: replica 0 hands stage 1 on to stage 2 inside rack 0, replica 1 across the
racks (the 288-GPU Llama 3 70B case, tp 8 pp 4 on four full racks, in small). The DP all-reduces run as rings: as
`auto`'s trees (chains of a rack's members under a tree of racks) they post more transfers than the estimate before
the build counts, and the step was refused for its size on the built cluster before its stages were checked."""


def _first_unfolding(loaded) -> Unfolding | None:
    """The first unfolding the step of ``loaded`` hears before it is built unfolded, None where it folds."""
    heard: list[Unfolding] = []

    def refuse(unfolding: Unfolding) -> None:
        heard.append(unfolding)
        raise ScenarioError(unfolding.reason)

    with contextlib.suppress(ScenarioError):
        simulation.prepare_training(loaded, scenario_topology(loaded), StepFaultPlan(), guard=refuse)
    return heard[0] if heard else None


def test_stages_not_aligned_to_nvlink_domains_are_offered_layouts_that_align_them(monkeypatch, tmp_path, capsys):
    """Stages not aligned to the NVLink domains unfold a step on the analytic model (on the flow model the classes
    of ranks fold this one, its replicas apart), so the refusal blames pp and offers the layouts that align them,
    computed from the scenario (pp, tp, the rack's trays, each with the dp that keeps the GPUs), not
    `network.model: analytic`, which it offered on the flow model and which refused the same way. Each remedy
    offered, applied as pasted, leaves no hand-off unaligned."""
    model = "analytic"
    path = _write(tmp_path, UNALIGNED_STAGES)
    _limit_to_the_folded_step(monkeypatch, path, [f"network.model={model}"])
    assert main(["run", path, "--out", str(tmp_path / "out"), "--set", f"network.model={model}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}:4: parallelism.pp: this run is too large to simulate unfolded (send_recv ")
    assert "stages not aligned to NVLink domains hand on over NVLink in one replica and over the NICs in another" in err
    offered = ("--set parallelism.pp=3 --set parallelism.dp=4; --set parallelism.tp=2 --set parallelism.dp=6; "
               "--set cluster.trays=4 --set parallelism.dp=2")
    assert err.endswith(f"(allowed: stages aligned to NVLink domains: {offered}; or pass --force)")
    for remedy in offered.split("; "):
        settings = [f"network.model={model}", *remedy.replace("--set ", "").split()]
        unfolding = _first_unfolding(load_scenario(path, settings))
        assert unfolding is None or unfolding.check != "stages", (remedy, unfolding)


def _hands_on_alike_by_walking(layout: Layout, domain: int) -> bool:
    """The reference for `hands_on_alike`: every rank's coordinates walked, stage by stage."""
    for stage in range(layout.pp if layout.pp > 1 else 0):
        inside = {rank // domain == layout.rank_of(**{**layout.coords(rank), "pp": (stage + 1) % layout.pp}) // domain
                  for rank in range(layout.world) if layout.coords(rank)["pp"] == stage}
        if len(inside) > 1:
            return False
    return True


def test_stages_hand_on_alike_by_arithmetic_as_by_walking_every_rank():
    """Counted per stage over the ranks at once, whether the hand-offs stay inside NVLink domains alike agrees
    with walking every rank's coordinates (1.3 s of CPU at 131,328 GPUs), over the orders, small degrees and
    domain sizes, each answer found both ways."""
    answers = set()
    for order in itertools.permutations(("tp", "cp", "pp", "dp")):
        for tp, cp, pp, dp in itertools.product((1, 2, 4), (1, 3), (1, 2, 3, 4), (1, 2, 3)):
            layout = Layout(tp=tp, cp=cp, pp=pp, dp=dp, order=order)
            for domain in (1, 2, 4, 6, 8, 72):
                walked = _hands_on_alike_by_walking(layout, domain)
                assert hands_on_alike(layout, domain) == walked, (layout, domain)
                answers.add(walked)
    assert answers == {True, False}


@pytest.mark.parametrize("given_dp", [True, False])
def test_layouts_that_align_stages_build_each_candidate_once(monkeypatch, tmp_path, given_dp):
    """Each candidate layout's `--set`s are built into a scenario once, which both the layout's checks and the
    alignment read: 46 builds for the three remedies offered where the scenario gives dp, none of them twice; where
    it gives no dp a candidate's `--set`s are its one field, built once too (31)."""
    built: list[tuple[str, ...]] = []

    def counted(loaded, settings):
        built.append(tuple(settings))
        return rebuilt(loaded, settings)

    monkeypatch.setattr(stage_remedies, "rebuilt", counted)
    scenario = UNALIGNED_STAGES if given_dp else UNALIGNED_STAGES.replace(", dp: 3", "")
    assert len(aligned_stage_remedies(load_scenario(_write(tmp_path, scenario)))) == 3
    assert len(built) == len(set(built)) == (46 if given_dp else 31)


def test_layouts_that_align_stages_keep_a_batch_given_by_its_micro_batches(tmp_path):
    """A scenario that gives the micro-batches and no global batch makes its batch on its replicas: each layout
    offered to align the stages changes dp, so it sets the micro-batches that keep the 12 sequences (it offered
    pp 3 with dp 4 and left 4 micro-batches: 16 sequences)."""
    scenario = UNALIGNED_STAGES.replace("global_batch: 12", "microbatches: 4")
    assert aligned_stage_remedies(load_scenario(_write(tmp_path, scenario))) == (
        ("parallelism.pp=3", "parallelism.dp=4", "training.microbatches=3"),
        ("parallelism.tp=2", "parallelism.dp=6", "training.microbatches=2"),
        ("cluster.trays=4", "parallelism.dp=2", "training.microbatches=6"))
