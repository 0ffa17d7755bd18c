"""What a user is told of a batch or a schedule that runs other than the file reads (simulator/scenario_checks.py):
micro-batches that disagree with the global batch, refused where the file gives both and stated where a `--set` of
the micro-batches changed the file's global batch (a user read the file's 32 and 94,701 tokens/s of 128 sequences);
and `schedule: interleaved` on one chunk per rank, which holds more than 1F1B for the same bubble."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest
from shared import SCENARIOS

from simulator.cli import main
from simulator.schedules.base import PLACEMENT_NAMES, PLACEMENT_SITTING, PLACEMENTS, Placement

DP8 = SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"
"""global_batch: 32, micro_batch: 1 on dp 8: 4 micro-batches a step."""


def _dp8_with(tmp_path: Path, training: str) -> Path:
    """The DP 8 scenario with ``training`` added to its training section, written under ``tmp_path``."""
    path = tmp_path / "dp8.yaml"
    text = DP8.read_text()
    assert "global_batch: 32," in text
    path.write_text(text.replace("global_batch: 32,", f"global_batch: 32, {training},"))
    return path


def test_a_file_giving_microbatches_that_disagree_with_its_global_batch_is_refused(tmp_path, capsys):
    """16 micro-batches of 1 on 8 replicas are 128 sequences, not the 32 the same file says: it ran 128 a step."""
    path = _dp8_with(tmp_path, "microbatches: 16")
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}:7: training.microbatches: microbatches 16 x micro_batch 1 x dp 8 = 128 sequences a step, not "
        "global_batch 32 (allowed: one of the two, or microbatches: 4 for global_batch: 32)\n")
    agreeing = _dp8_with(tmp_path, "microbatches: 4")
    assert main(["validate", str(agreeing), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_parameter_servers_count_their_workers_in_place_of_dp(tmp_path, capsys):
    """A parameter-server file with global_batch 16 and microbatches 4 (32 sequences an iteration: 4 micro-batches
    on each of 8 workers) is refused as a collective step is, the workers in dp's place, and a global batch the
    workers do not divide names them too."""
    path = tmp_path / "ps.yaml"
    path.write_text("cluster: {topology: dgx-h100-cluster, nodes: 2}\nmodel: {preset: megatron-1.7b}\n"
                    "training: {seq_len: 2048, micro_batch: 1, global_batch: 16, microbatches: 4}\n"
                    "parallelism: {strategy: parameter_server}\nps: {servers: 1, iterations: 1}\n")
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}:3: training.microbatches: microbatches 4 x micro_batch 1 x workers 8 = 32 sequences an "
        "iteration, not global_batch 16 (allowed: one of the two, or microbatches: 2 for global_batch: 16)\n")
    assert main(["validate", str(path), "--set", "training.microbatches=2", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    unset = ["--set", "training.microbatches=null"]
    assert main(["validate", str(path), *unset, "--set", "training.global_batch=20"]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim validate: --set training.global_batch=20: global_batch 20 is not a multiple "
        "of micro_batch x workers = 8 (allowed: multiples of 8)\n")


def test_a_set_of_the_microbatches_over_the_files_global_batch_states_the_batch_it_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(DP8), "--set", "training.microbatches=2", "--out", str(out), "--quiet"]) == 0
    warning = ("--set training.microbatches=2: microbatches 2 x micro_batch 1 x dp 8 = 16 sequences a step, "
               "overriding the file's global_batch 32")
    assert capsys.readouterr().err == f"warning: command line: trainsim run: {warning}\n"
    assert json.loads((out / "summary.json").read_text())["warnings"] == [warning]
    assert main(["validate", str(DP8), "--set", "training.microbatches=4", "--quiet"]) == 0  # the same batch
    assert capsys.readouterr().err == ""


def test_a_set_global_batch_that_the_files_microbatches_override_is_refused(tmp_path, capsys):
    """The file's micro-batches win, so the `--set` changed nothing; with them unset it runs."""
    path = _dp8_with(tmp_path, "microbatches: 4")
    assert main(["validate", str(path), "--set", "training.global_batch=64"]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim validate: --set training.global_batch=64: the file's microbatches override "
        "it: microbatches 4 x micro_batch 1 x dp 8 = 32 sequences, not 64 (allowed: --set training.microbatches=null "
        "with it, or microbatches: 8 for global_batch: 64)\n")
    assert main(["validate", str(path), "--set", "training.global_batch=64", "--set", "training.microbatches=null",
                 "--quiet"]) == 0


PIPELINED = """cluster: {topology: dgx-h100}
model: {preset: llama3-8b}
training: {seq_len: 2048, global_batch: 16, micro_batch: 1}
parallelism: {tp: 1, pp: 4, dp: 2, zero: 1, pipeline: {schedule: SCHEDULE, virtual_stages: V}}
"""
"""Llama 3 8B in 4 stages on one DGX H100, 8 micro-batches a step."""


def test_interleaved_on_one_chunk_per_rank_is_warned_of_naming_1f1b(tmp_path, capsys):
    """ScheduleInterleaved1F1B on one chunk warms up with 2(p-r-1) forwards: rank 0 holds 7 micro-batches where
    1F1B holds 4, with the same bubble (a sweep over v read as if memory fell from v = 1 to v = 2)."""
    path = tmp_path / "pp4.yaml"
    path.write_text(PIPELINED.replace("SCHEDULE", "interleaved").replace("V", "1"))
    assert main(["validate", str(path), "--quiet"]) == 0
    assert capsys.readouterr().err == (
        f"warning: {path}:4: parallelism.pipeline.virtual_stages: interleaved on 1 chunk per rank has 1F1B's bubble "
        "but a deeper warm-up: rank 0 holds 7 micro-batches' activations (2(p-r-1)+1 at p = 4) where 1F1B holds 4 "
        "(p-r) (allowed: schedule: 1f1b for the same step in less memory, or virtual_stages of 2 or more)\n")
    for schedule, chunks in (("interleaved", "2"), ("1f1b", "1")):
        path.write_text(PIPELINED.replace("SCHEDULE", schedule).replace("V", chunks))
        assert main(["validate", str(path), "--quiet"]) == 0
        assert capsys.readouterr().err == ""


def test_fewer_micro_batches_than_stages_are_warned_of_once_with_the_bubble_they_give(tmp_path, capsys):
    """1F1B at p = 4 over 2 micro-batches never fills its pipeline: (p-1)/(m+p-1) = 60% of it idles at uniform
    stages, and validate warns of it once; the bubble is the schedule's, so a --set of the schedule or of its
    virtual stages is named beside the micro-batches'; at m = p it fills, and nothing is said."""
    path = tmp_path / "pp4.yaml"
    path.write_text(PIPELINED.replace("SCHEDULE", "1f1b").replace("V", "1"))
    assert main(["validate", str(path), "--quiet", "--set", "training.global_batch=4"]) == 0
    assert capsys.readouterr().err == (
        "warning: command line: trainsim validate: --set training.global_batch=4: the pipeline never fills with 2 "
        "micro-batches over 4 stages: each rank idles while the others run, a 1f1b bubble of 60.0% at uniform stages "
        "(backward 2x forward) (allowed: at least 4 micro-batches, one a rank, to fill it)\n")
    assert main(["validate", str(path), "--quiet", "--set", "training.global_batch=4", "--set",
                 "parallelism.pipeline.schedule=zbv", "--set", "parallelism.pipeline.virtual_stages=2"]) == 0
    assert capsys.readouterr().err == (
        "warning: command line: trainsim validate: --set training.global_batch=4: the pipeline never fills with 2 "
        "micro-batches over 4 ranks (8 virtual stages, 2 a rank in a V): each rank idles while the others run, a zbv "
        "bubble of 45.5% at uniform stages "
        "(backward 2x forward) (with --set parallelism.pipeline.schedule=zbv, --set "
        "parallelism.pipeline.virtual_stages=2) (allowed: at least 6 micro-batches, 3p/2 rounded down for zbv, to "
        "fill it)\n")
    synthetic = tmp_path / "synthetic.yaml"
    synthetic.write_text("cluster: {topology: dgx-h100}\nmodel: {synthetic: {stages: 4, forward: 1 ms, backward: "
                         "2 ms}}\ntraining: {microbatches: 1}\nparallelism: {dp: 2, pipeline: {schedule: gpipe}}\n")
    assert main(["validate", str(synthetic), "--quiet"]) == 0
    assert capsys.readouterr().err == (
        f"warning: {synthetic}:3: training.microbatches: the pipeline never fills with 1 micro-batch over 4 stages: "
        "each rank idles while the others run, a gpipe bubble of 75.0% at uniform stages (backward 2x forward) "
        "(allowed: at least 4 micro-batches, one a rank, to fill it)\n")
    assert main(["validate", str(path), "--quiet", "--set", "training.global_batch=8"]) == 0
    assert capsys.readouterr().err == ""


def test_every_placement_is_listed_named_and_worded_apart():
    """Every placement a pipeline's chunks can sit in (the `Placement` type, which the schedules and a custom
    table's placement row draw from) is in the option set, named and worded (schedules/base.py), and no two share
    a name or a wording, so that errors and the unfilled warning tell them apart."""
    placements = set(get_args(Placement))
    assert set(PLACEMENTS) == set(PLACEMENT_NAMES) == set(PLACEMENT_SITTING) == placements
    assert len(set(PLACEMENT_NAMES.values())) == len(set(PLACEMENT_SITTING.values())) == len(placements)


@pytest.mark.parametrize(("schedule", "chunks", "depth"), [
    ("1f1b", 1, "4 stages"),
    ("looped-bfs", 2, "4 ranks (8 virtual stages, 2 a rank, looped)"),
    ("looped-bfs", 4, "4 ranks (16 virtual stages, 4 a rank, looped)"),
    ("zbv", 2, "4 ranks (8 virtual stages, 2 a rank in a V)"),
    ("interleaved", 2, "4 ranks (8 virtual stages, 2 a rank, looped)"),
])
def test_an_unfilled_pipeline_names_its_ranks_and_virtual_stages(tmp_path, capsys, schedule, chunks, depth):
    """Under 2 micro-batches, a pipeline of 4 ranks is said to be one of 4 stages where each rank holds one,
    and of 4 ranks with their virtual stages and how they sit where each holds more (zbv's V, looped-bfs's loop):
    it needs a micro-batch a rank to fill, whatever its chunks. Interleaved runs them as PyTorch does (one round
    of 2), where it refused m not a multiple of p, and its bubble reads 'an interleaved bubble'."""
    path = tmp_path / "pp4.yaml"
    path.write_text(PIPELINED.replace("SCHEDULE", schedule).replace("V", str(chunks)))
    assert main(["validate", str(path), "--quiet", "--set", "training.global_batch=4"]) == 0
    err = capsys.readouterr().err
    assert f"the pipeline never fills with 2 micro-batches over {depth}: each rank idles" in err
    assert f" {'an' if schedule == 'interleaved' else 'a'} {schedule} bubble of " in err
    filling = "6 micro-batches, 3p/2 rounded down for zbv" if schedule == "zbv" else "4 micro-batches, one a rank"
    assert err.endswith(f"(allowed: at least {filling}, to fill it)\n")


def _uniform_timing(schedule: str, p: int, m: int):
    """The ideal executor's run of ``schedule`` at the unfilled warning's uniform stages."""
    from simulator.scenario_checks import UNFILLED_COSTS
    from simulator.schedules.registry import build_schedule
    from simulator.schedules.timing import simulate_schedule

    v = 2 if schedule in ("zbv", "looped-bfs") else 1
    return simulate_schedule(build_schedule(schedule, p, m, v), *UNFILLED_COSTS)


@pytest.mark.parametrize("p", [3, 4, 5, 6, 8])
@pytest.mark.parametrize("schedule", ["zb-h1", "looped-bfs", "zbv"])
def test_a_pipeline_fills_where_more_micro_batches_stop_shortening_its_idle(schedule, p):
    """`filling_microbatches` is where the ideal executor's idle time per rank, at uniform stages, stops falling
    as micro-batches are added: one a rank for zb-h1 and looped-bfs, 3p/2 rounded down for zbv (at p = 4: 3, 2,
    1.5, 1.5 units of idle at m = 4, 5, 6, 7)."""
    from simulator.schedules.registry import filling_microbatches

    def idle(m: int) -> float:
        return max(_uniform_timing(schedule, p, m).idle_per_rank)

    filling = filling_microbatches(schedule, p).microbatches
    assert idle(filling + 1) == pytest.approx(idle(filling), abs=1e-12)
    assert all(idle(m) > idle(m + 1) for m in range(1, filling))


@pytest.mark.parametrize("p", [3, 4, 5, 6, 8])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_fill_at_one_micro_batch_a_rank_by_convention(schedule, p):
    """GPipe's and 1F1B's idle per rank is (p-1)(F+B+W) at every m, so no m stops shortening it: their threshold
    is p by convention, the fewest micro-batches that keep every rank busy at some instant (below it, some rank
    holds no micro-batch at every instant)."""
    from simulator.schedules.registry import filling_microbatches

    def every_rank_busy_at_once(m: int) -> bool:
        lines = _uniform_timing(schedule, p, m).timeline
        starts = [action.start for line in lines for action in line]
        return any(all(any(action.start <= t < action.end for action in line) for line in lines) for t in starts)

    filling = filling_microbatches(schedule, p)
    assert {max(_uniform_timing(schedule, p, m).idle_per_rank) for m in range(1, 2 * p)} == {3.0 * (p - 1)}
    assert filling.rule == "one a rank"
    assert not every_rank_busy_at_once(filling.microbatches - 1)
    assert every_rank_busy_at_once(filling.microbatches)


def test_zbv_is_warned_of_below_three_halves_of_its_ranks_in_micro_batches(tmp_path, capsys):
    """zbv's idle per rank keeps falling past m = p, to m = 3p/2: at p = 4, m = 4 and 5 fill the pipeline (every
    rank is busy at some instant) but leave each rank idle for 3 and 2 forwards' time where m = 6 leaves 1.5, and
    are warned of so, with the 20.0% and 11.8% bubbles the executor gives them; m = 6 is not warned of."""
    path = tmp_path / "pp4.yaml"
    path.write_text(PIPELINED.replace("SCHEDULE", "zbv").replace("V", "2"))
    for batch, m, idle, bubble in ((8, 4, 3, "20.0%"), (10, 5, 2, "11.8%")):
        assert main(["validate", str(path), "--quiet", "--set", f"training.global_batch={batch}"]) == 0
        assert capsys.readouterr().err == (
            f"warning: command line: trainsim validate: --set training.global_batch={batch}: {m} micro-batches over "
            f"4 ranks (8 virtual stages, 2 a rank in a V) leave each rank idle for {idle} forwards' time where 6 "
            f"leave it 1.5, a zbv bubble of {bubble} at uniform stages (backward 2x forward) (allowed: at least 6 "
            "micro-batches, 3p/2 rounded down for zbv, past which more idle no less)\n")
    assert main(["validate", str(path), "--quiet", "--set", "training.global_batch=12"]) == 0
    assert capsys.readouterr().err == ""
