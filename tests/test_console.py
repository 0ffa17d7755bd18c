"""What `trainsim run` and `validate` print: the report table holds the summary's own figures, an
out-of-memory run says so loudly (and `validate --strict` refuses it), `--quiet` prints nothing, a
communication-only run prints its collective table, `--version`, and bundled scenarios run by name from any
folder and are listed by `trainsim scenarios`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from shared import DATA, REPO, SCENARIOS

from simulator import cli as cli_module
from simulator.cli import main
from simulator.config import bundled
from simulator.console import progress as progress_module
from simulator.console.progress import PLAIN_EVERY_S, Heartbeat, PlainProgress, RunProgress
from simulator.engine.fold_policy import LINKS_DURING_STEP

pytestmark = pytest.mark.heartbeat
"""These tests check the progress lines themselves, at their real period (tests/conftest.py)."""

LLAMA_8B = "llama3-8b-dgx-h100-dp8"


def test_run_report_shows_the_summary_figures(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(SCENARIOS / f"{LLAMA_8B}.yaml"), "--out", str(out), "--set", "run.timeline=summary"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    summary = json.loads((out / "summary.json").read_text())
    lines = {line.split("  ")[1].strip(): line.strip() for line in captured.out.splitlines()
             if line.startswith("  ") and len(line.split("  ")) > 2}
    assert lines["step time"].endswith(f"{summary['step_time_s']:.4g} s")
    assert f"{summary['tokens_per_s']:,.0f} tokens/s" in lines["throughput"]
    assert f"{summary['tflops_per_gpu']:.1f} (MFU {100 * summary['mfu']:.1f}%" in lines["TFLOP/s per GPU"]
    assert lines["compute idle"].endswith(f"{100 * summary['bubble_fraction']:.1f}% of the forward/backward window")
    dp_ms = summary["exposed_comm_s"]["dp"] * 1e3
    assert f"dp {dp_ms:.4g} ms" in lines["exposed communication"]
    assert (f"{summary['peak_memory_gib']:.1f} GiB of {summary['memory_capacity_gib']:.1f} GiB"
            in lines["peak memory"])
    assert "OUT OF MEMORY" not in captured.out
    verdict = summary["bottleneck"].get("verdict", summary["bottleneck"]["constraint"])
    assert f"bottleneck {' '.join(verdict.split())}" in " ".join(captured.out.split())  # wrapped onto more lines
    assert "ranks" not in lines  # its fold holds: nothing given up
    assert captured.out.splitlines()[0] == ("llama3-8b on dgx-h100 (8 h100-sxm GPUs, TP1 CP1 PP1 DP8 ZeRO-1, "
                                            "4 micro-batches per step)")
    assert all(line == line.rstrip() for line in captured.out.splitlines()), "trailing blanks in a pipe"


def test_a_ranks_row_says_which_folds_were_given_up_and_why_in_one_line():
    """The report's `ranks` row, only where the summary lists folds given up (`fold_given_up`) or a fold that
    stands though not exact (`fold_not_exact`): the ranks simulated of the GPUs, then each fold given up with its
    short why, or the one not exact with how many hand-offs fell out of step by up to how much. The checks'
    sentences and the first instance's figures stay in summary.json, so that the published long-context run's row
    stays one line."""
    import io

    from rich.console import Console

    from simulator.console.report import training_table

    def printed(summary: dict, width: int = 400) -> list[str]:
        console = Console(file=io.StringIO(), width=width)
        console.print(training_table(summary))
        return [" ".join(line.split()) for line in console.file.getvalue().splitlines()]

    summary = {"step_time_s": 1.0, "simulated_ranks": 32, "gpus": 32, "folded": False}
    assert printed(summary) == ["step time 1.000 s"]
    summary["fold_given_up"] = [{"fold": "stage", "simulated_ranks": 2, "why": "the cluster is not symmetric",
                                 "reason": "hosts with different GPU counts"}]
    assert printed(summary)[1] == ("ranks 32 of 32 ranks simulated; the stage fold given up: the cluster is not "
                                   "symmetric")
    long_context = {"step_time_s": 11.3, "simulated_ranks": 16, "gpus": 16_384, "folded": True,
                    "fold_given_up": [{"fold": "lanes", "simulated_ranks": 32, "why": "the refold is too large to "
                                       "simulate", "reason": "the refold would simulate 32 ranks ..."},
                                      {"fold": "routes", "simulated_ranks": None, "why": "finer refolds are not "
                                       "tried where the step may not unfold", "reason": "route classes by ..."}],
                    "fold_not_exact": {"fold": "stage", "simulated_ranks": 16,
                                       "why": "a hand-off fell out of step in its run", "reason": "send_recv ...",
                                       "out_of_step": {"op": "send_recv", "name": "send fwd mb3", "group": [3, 4],
                                                       "ended_s": [0.5, 0.50107], "instances": 1328,
                                                       "widest_s": 1.07e-3}}}
    row = "ranks 16 of 16,384 ranks simulated; folded by stage, not exact: 1,328 hand-offs out of step by up to 1.07 ms"
    assert printed(long_context, width=120)[1:] == [row]  # one line on a terminal
    analytic = {**long_context, "fold_given_up": [], "fold_not_exact": {
        "fold": "stage", "simulated_ranks": 16, "why": "the replicas' hand-offs cross other hops", "reason": "..."}}
    assert printed(analytic)[1] == ("ranks 16 of 16,384 ranks simulated; folded by stage, not exact: the replicas' "
                                    "hand-offs cross other hops")


@pytest.mark.parametrize(("slowest_s", "binding", "iteration", "traffic"), [
    # A synchronous run's workers end their iterations nanoseconds apart: the one time, not a range of two alike.
    (0.5863364984739692, "server", "iteration time 586.3 ms on every worker (to four digits)",
     "server traffic 147.7 GiB per iteration, server links' mean 33.8% busy over the run, 94.0% while pushes and pulls "
     "cross them (worker links' mean 31.3%); server links bind"),
    (0.61, "neither", "iteration time 586.3 ms mean over workers (586.3 ms to 610.0 ms)",
     "server traffic 147.7 GiB per iteration, server links' mean 33.8% busy over the run, 94.0% while pushes and pulls "
     "cross them (worker links' mean 31.3%); neither side's links bind"),
    (0.61, "both", "iteration time 586.3 ms mean over workers (586.3 ms to 610.0 ms)",
     "server traffic 147.7 GiB per iteration, server links' mean 33.8% busy over the run, 94.0% while pushes and pulls "
     "cross them (worker links' mean 31.3%); server and worker links bind"),
])
def test_parameter_server_rows_give_one_time_where_workers_are_alike_and_sizes_with_their_unit(slowest_s, binding,
                                                                                                iteration, traffic):
    """The parameter-server rows give the iteration time's range over workers only where its ends read apart,
    and the bytes per iteration as the collective table writes sizes (147.7 GiB and 9.233 GiB, not 147.72 and
    9.23 GiB beside the training table's one-decimal memory), and whose links bind as a clause (`both`, `neither`)."""
    import io

    from rich.console import Console

    from simulator.console.report import _label_table, add_parameter_server_rows

    ps = {"mode": "sync", "server_hosts": ["h3"], "server_gpus": list(range(24, 32)), "workers": 24,
          "iterations": 6, "iteration_s": {"min": 0.5863364930148045, "mean": 0.5863364977915736, "max": slowest_s},
          "samples_per_s": 163.7, "tokens_per_s": 335_316.0, "throughput_window_s": 3.518,
          "server_traffic_bytes_per_iteration": 158_614_142_976.0,
          "server_links": {"mean_utilisation": 0.3381, "mean_utilisation_in_transfers": 0.9399},
          "worker_links": {"mean_utilisation": 0.1127, "mean_utilisation_in_transfers": 0.3133},
          "binding_links": binding,
          "exchange_s": 0.4201, "allreduce": {"time_s": 0.01707, "busiest_link_bytes": 5_540_000_000.0},
          "busiest_link_bytes_per_iteration": 9_913_383_936.0, "staleness_histogram": [144], "lag_histogram": [144]}
    table = _label_table()
    add_parameter_server_rows(table, ps)
    console = Console(file=io.StringIO(), width=400)
    console.print(table)
    lines = [" ".join(line.split()) for line in console.file.getvalue().splitlines()]
    assert lines[1] == iteration
    assert lines[3] == traffic
    assert lines[4] == ("vs ring all-reduce exchange 420.1 ms against 17.07 ms alone; busiest link 9.233 GiB "
                        "against 5.16 GiB per iteration")


@pytest.mark.parametrize(("fold", "ranks", "out_of_step", "said"), [
    # A run read to its end: the widest gap, the first instance's hand-off by sender and receiver, and how many
    # instances fell out of step (GPT-3 175B on 1,024 A100s before its stage fold saw its hops up front).
    ("stage", 8, {"op": "send_recv", "name": "send fwd mb0", "group": [24, 32],
                  "ended_s": [0.25741388780827257, 0.2574148878082726], "instances": 192, "widest_s": 1e-6},
     "by up to 1 us (hand-off 'send fwd mb0', GPUs 24 -> 32, 192 instances)"),
    # A run stopped at its first instance out of step (`stopped_at_s`, no `instances`: engine/lockstep.py
    # `LockstepWatch`): that instance's own gap, not a count of instances it never reached (the DeepSeek-V3-style
    # DualPipeV class fold's figures).
    ("classes", 32, {"op": "send_recv", "name": "recv bwd mb0", "group": [512, 448],
                     "ended_s": [2.289274, 2.289308], "stopped_at_s": 2.289308, "widest_s": 3.4e-5},
     "by 34 us (hand-off 'recv bwd mb0', GPUs 512 -> 448; the run stopped there)"),
    # Another collective is named by its group.
    ("stage", 4, {"op": "all_reduce", "name": "grad bucket 0", "group": [0, 8, 16, 24],
                  "ended_s": [0.5, 0.5002], "stopped_at_s": 0.5002, "widest_s": 2e-4},
     "by 200 us (all_reduce 'grad bucket 0' over GPUs [0, 8, 16, 24]; the run stopped there)"),
])
def test_a_rerun_note_says_in_plain_words_why_the_step_runs_again(fold, ranks, out_of_step, said):
    """The stderr note of a fold given up out of step says, without the folding vocabulary, that one rank stood for
    alike GPUs, that their copies fell out of step (by how much, where) and that the step runs again for exact
    figures; the check's sentence and the instance's ends stay in summary.json (`fold_given_up`)."""
    from simulator.console.report import rerun_line
    from simulator.simulation import FoldDropped, Rerun

    entry = {"fold": fold, "simulated_ranks": ranks, "why": "a hand-off fell out of step in its run", "reason": "...",
             "out_of_step": out_of_step}
    assert rerun_line(FoldDropped(entry)) == (
        f"note: the step was simulated with one rank standing for each set of alike GPUs, but their copies fell out "
        f"of step {said}, so it is simulated again on more ranks to keep the figures exact (details: summary.json's "
        "fold_given_up)")
    assert rerun_line(Rerun(True, "64 of 64 ranks, 1,010 ops")) == (
        "note: simulating the step again on 64 of 64 ranks, 1,010 ops (every rank)")


def test_out_of_memory_is_loud_and_strict_validate_refuses_it(tmp_path, capsys):
    """Plain DDP of Llama 3 8B needs 153.6 GiB per GPU (docs/training-step.md): OOM on an 80 GB H100."""
    scenario = str(SCENARIOS / f"{LLAMA_8B}.yaml")
    oom = ["--set", "parallelism.zero=0"]
    assert main(["run", scenario, "--out", str(tmp_path / "out"), "--set", "run.timeline=summary", *oom]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: OUT OF MEMORY: 153.6 GiB needed on pipeline stage 0 (rank 0), "
                                   "the GPU holds 79.6 GiB")
    assert "OUT OF MEMORY" in captured.out  # and in the table's memory row
    # the catalog GPUs that hold the same layout's 153.6 GiB (an H200's 140.4 does not)
    assert "; the same layout fits b200 (179.1 GiB), gb200 (185.0 GiB) (trainsim gpus)\n" in captured.err
    assert main(["validate", scenario, *oom]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: OUT OF MEMORY: 153.6 GiB")
    said = "valid (8 h100-sxm GPUs on dgx-h100), but it does not fit in GPU memory (--strict refuses it)\n"
    assert said in captured.out
    assert main(["validate", scenario, "--strict", *oom]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"error: {scenario}:8: parallelism: OUT OF MEMORY: 153.6 GiB")
    assert main(["validate", scenario, "--strict"]) == 0
    # Located at the layout, the refusal names every override: a micro-batch set by --set made it 132.0 GiB at
    # the file's parallelism line, which shows a layout that fits, and the line did not say what changed.
    assert main(["validate", scenario, "--strict", "--set", "training.micro_batch=4", *oom]) == 2
    assert "(with --set training.micro_batch=4, --set parallelism.zero=0) (allowed: a layout that fits in GPU " \
           "memory)\n" in capsys.readouterr().err


HOSTS2 = ["cluster.topology=dgx-h100-cluster", "cluster.nodes=2", "parallelism.dp=16", "training.global_batch=256"]


def remedies_offered(line: str, *prefixes: str) -> list[str]:
    """The settings of the out-of-memory line's remedies that set a field starting with one of ``prefixes``."""
    remedies = line[line.index("(try ") + len("(try "):].split("; ")
    return [remedy.split(" (-")[0] for remedy in remedies if any(f"--set {p}" in remedy for p in prefixes)]


@pytest.mark.parametrize("sharding,offered", [
    (["parallelism.zero=0"], ["--set parallelism.zero=3"]),
    (["parallelism.zero=2"], ["--set parallelism.zero=3"]),
    (["parallelism.zero=3"], []),
    (["parallelism.fsdp=full_shard"], []),
    (["parallelism.fsdp=hybrid_shard"], []),
    (["parallelism.fsdp=hybrid_shard", *HOSTS2], ["--set parallelism.fsdp=full_shard"]),
], ids=lambda value: ",".join(value) if isinstance(value, list) and value and "=" in value[0] else None)
def test_out_of_memory_remedies_leave_out_the_sharding_already_done(tmp_path, capsys, sharding, offered):
    """A layout already sharded to ZeRO-3 or FSDP's full_shard is not told to shard further, nor is hybrid_shard on one
    8-GPU host, whose NVLink domain holds every DP rank (full_shard would hold as much); hybrid_shard on two hosts,
    sharded inside each NVLink domain only, is told full_shard: run and validate print the same line."""
    scenario = str(SCENARIOS / f"{LLAMA_8B}.yaml")
    settings = ["parallelism.zero=0", "training.micro_batch=16", "training.global_batch=128", *sharding]
    too_big = [arg for setting in settings for arg in ("--set", setting)]
    assert main(["validate", scenario, *too_big]) == 0
    validated = capsys.readouterr().err.split("\n")[0]
    assert "OUT OF MEMORY" in validated
    assert remedies_offered(validated, "parallelism.zero", "parallelism.fsdp") == offered
    assert main(["run", scenario, "--out", str(tmp_path / "out"), "--set", "run.timeline=summary", *too_big]) == 0
    assert capsys.readouterr().err.split("\n")[0] == validated


@pytest.mark.parametrize("settings,offered", [
    (["training.recompute=full"], []),
    (["training.recompute=selective"], ["--set training.recompute=full"]),
    (["training.recompute=none"], ["--set training.recompute=full"]),
    (["training.recompute=none", "training.attention=standard"], ["--set training.recompute=full"]),
])
def test_out_of_memory_remedies_leave_out_what_the_layout_already_does(capsys, settings, offered):
    """A 70B user at micro_batch 1 was told to try "recompute, ..., a smaller micro_batch": micro_batch is at
    least 1, and the recompute they tried, selective, kept the peak at 81.4 GiB (flash attention keeps no score
    matrix for it to drop). The remedies name only steps that save memory: full recompute past none or
    selective (under standard attention selective saves less than full and fits no better), no micro_batch
    below 1."""
    scenario = str(SCENARIOS / f"{LLAMA_8B}.yaml")
    sets = [arg for setting in ["parallelism.zero=0", *settings] for arg in ("--set", setting)]
    assert main(["validate", scenario, *sets]) == 0
    line = next(line for line in capsys.readouterr().err.splitlines() if "OUT OF MEMORY" in line)
    assert remedies_offered(line, "training.recompute") == offered
    assert remedies_offered(line, "training.micro_batch") == []


def test_a_tiny_model_s_memory_is_printed_in_mib(tmp_path, capsys):
    """A 2-layer model of hidden 256 holds 46 MiB per GPU: `validate` and the run's table print it in MiB, not '0.0
    GiB'."""
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text("cluster: {topology: dgx-h100}\nmodel: {layers: 2, hidden: 256, heads: 4, vocab: 1000}\n"
                        "training: {seq_len: 128, global_batch: 8}\nparallelism: {dp: 8}\n")
    assert main(["validate", str(scenario)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert re.match(r"  peak memory per GPU: \d+\.\d MiB of 79\.6 GiB \(0\.1%\).*; largest parts: optimizer "
                    r"\d+\.\d MiB, ", line), line
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--set", "run.timeline=summary"]) == 0
    assert re.search(r"peak memory +\d+\.\d MiB of 79\.6 GiB", capsys.readouterr().out)


ZERO_PAPER_7B = """
cluster: {topology: dgx-a100-cluster, nodes: 8}
model: {preset: megatron-7.5b}
training: {seq_len: 1024, global_batch: 64, micro_batch: 1, precision: fp16, recompute: full}
parallelism: {tp: 1, pp: 1, dp: 64, zero: 0}
"""


@pytest.mark.parametrize("settings,line", [
    (["parallelism.zero=3"], "params 0.22 + grads 0.22 + optimizer 1.30 = 1.74 GiB = 1.867 GB (2+2+12 = 16 B x 7.47e9 "
                             "parameters, over dp 64)"),
    (["parallelism.zero=1"], "params 13.91 + grads 13.91 + optimizer 1.30 = 29.12 GiB = 31.27 GB (2+2+12/64 = 4.19 "
                             "B x 7.47e9 parameters)"),
    (["parallelism.zero=1", "training.precision=bf16"],
     "params 13.91 + grads 27.82 + optimizer 1.30 = 43.03 GiB = 46.21 GB (2+4+12/64 = 6.19 B x 7.47e9 parameters); "
     "bf16 training keeps fp32 gradients (4 B, not the ZeRO paper's 2: --set training.grad_reduce_dtype=bf16 for it)"),
    (["parallelism.zero=1", "training.precision=bf16", "training.grad_reduce_dtype=bf16"],
     "params 13.91 + grads 13.91 + optimizer 1.30 = 29.12 GiB = 31.27 GB (2+2+12/64 = 4.19 B x 7.47e9 "
     "parameters)"),
])
def test_validate_sums_the_model_state_as_the_zero_paper_does(tmp_path, capsys, settings, line):
    """The ZeRO paper's 7.5B model (Megatron's, 7.468e9 parameters) on 64 GPUs, fp16 with Adam (K = 12): model state
    per GPU (2 + 2 + K) Psi / Nd under ZeRO-3, 16 x 7.468e9 / 64 = 1.867e9 B = 1.74 GiB (the paper's 1.875 GB at
    Psi = 7.5e9), each part 2 or 12 B x Psi / 64 (0.22 and 1.30 GiB), which the memory line's three largest parts
    leave out; ZeRO-1 (2 + 2 + K / Nd) Psi = 4.1875 x 7.468e9 = 31.27 GB. bf16 keeps its gradients in fp32 by
    default, 4 B: (2 + 4 + 12/64) Psi = 46.21 GB, and the line says so and how to get the paper's 2 B."""
    scenario = tmp_path / "zero.yaml"
    scenario.write_text(ZERO_PAPER_7B)
    assert main(["validate", str(scenario), *(arg for setting in settings for arg in ("--set", setting))]) == 0
    assert capsys.readouterr().out.splitlines()[2] == f"  model state per GPU: {line}"


def test_validate_names_the_shard_whose_parameters_the_model_state_counts(capsys):
    """Llama 3 70B at tp 8 x pp 2 x dp 2 under FSDP (fp32 weights and gradients, Adam: 4 + 4 + 8 = 16 B a
    parameter): a rank of stage 0 holds 40 of the 80 layers at 1/8 each, 40 x 855.6e6 / 8 = 4.278e9, and the
    embedding's 128,256 x 8,192 / 8 = 0.131e9, 4.41e9 parameters; sharded over dp 2 that is
    16 x 4.41e9 / 2 = 35.28 GB, not 16 B a parameter over 2 GPUs of the whole model."""
    scenario = str(SCENARIOS / "llama3-70b-torchtitan-pp-fsdp.yaml")
    assert main(["validate", scenario]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith(
        "= 35.28 GB (4+4+8 = 16 B x 4.41e9 parameters of a tp 8 x pp 2 shard, over dp 2)")


def test_validate_prints_the_peak_memory_per_gpu(capsys):
    """`validate` prints the peak per GPU, the GPU's capacity and what fills it, the figures of the run's summary
    (preflight.validate), out of memory or not, for someone sizing a rental, not only 'valid'."""
    from simulator import load_scenario
    from simulator.preflight import validate
    from simulator.scale import sized_topology

    scenario = str(SCENARIOS / f"{LLAMA_8B}.yaml")
    loaded = load_scenario(scenario, [])
    memory = validate(loaded, sized_topology(loaded, force=False)).memory
    assert main(["validate", scenario]) == 0
    valid, line, state = capsys.readouterr().out.splitlines()
    assert valid == f"{scenario}: valid (8 h100-sxm GPUs on dgx-h100)"
    assert state.startswith("  model state per GPU: params 14.96 + grads 29.92 + optimizer 11.22 = 56.09 GiB")
    peak, capacity = memory["peak_memory_gib"], memory["memory_capacity_gib"]
    head = f"  peak memory per GPU: {peak:.1f} GiB of {capacity:.1f} GiB ({100 * peak / capacity:.1f}%) on pipeline"
    assert line.startswith(head + " stage 0 (rank 0); largest parts: ")
    parts = [part.rsplit(" ", 2) for part in line.split("largest parts: ")[1].split(", ")]
    breakdown = memory["memory_breakdown_gib"]
    assert [name for name, _, _ in parts] == sorted(breakdown, key=lambda name: -breakdown[name])[:3]
    assert all(f"{breakdown[name]:.1f}" == size and unit == "GiB" for name, size, unit in parts)
    assert main(["validate", scenario, "--set", "parallelism.zero=0"]) == 0
    assert "%, OUT OF MEMORY) on pipeline stage 0 (rank 0)" in capsys.readouterr().out
    # thousands of GiB read with separators, as every other count the CLI prints ('462874.3 GiB' did not)
    assert main(["validate", scenario, "--set", "training.seq_len=100000000"]) == 0
    captured = capsys.readouterr()
    thousands = r"\d{1,3}(,\d{3})+\.\d"
    assert re.search(rf"peak memory per GPU: {thousands} GiB of 79\.6 GiB \({thousands}%", captured.out)
    assert re.match(rf"warning: OUT OF MEMORY: {thousands} GiB needed", captured.err)
    for unmodelled in ("schedule-1f1b-p4-m8", "allreduce-2x-dgx-h100"):  # synthetic costs, collectives only
        assert main(["validate", str(SCENARIOS / f"{unmodelled}.yaml")]) == 0
        assert capsys.readouterr().out.count("\n") == 1


@pytest.mark.parametrize(("schedule", "virtual_stages", "stages"), [
    ("zbv", 2, "0, 7"), ("interleaved", 2, "0, 4"), ("interleaved", 4, "0, 4, 8, 12")])
def test_the_peak_memory_of_a_rank_holding_several_stages_names_them_all(tmp_path, capsys, schedule,
                                                                         virtual_stages, stages):
    """In the V of zbv rank 0 holds stages 0 and 7: validate and the out-of-memory warning name both, as the memory
    chart does, not "on pipeline stage 0 (rank 0)" as if rank 0 held stage 0 alone; interleaved, rank 0 holds every
    p-th stage. The stages are the memory chart's and the Gantt's (`held_stages`)."""
    scenario = tmp_path / "pipeline.yaml"
    scenario.write_text("cluster: {topology: dgx-h100}\nmodel: {preset: llama3-8b}\n"
                        "training: {seq_len: 4096, global_batch: 8, micro_batch: 1}\n"
                        f"parallelism: {{tp: 2, pp: 4, pipeline: {{schedule: {schedule}, "
                        f"virtual_stages: {virtual_stages}}}}}\n")
    assert main(["validate", str(scenario)]) == 0
    assert f") on rank 0 (stages {stages}); largest parts: " in capsys.readouterr().out
    assert main(["validate", str(scenario), "--set", "training.seq_len=32768"]) == 0
    captured = capsys.readouterr()
    assert f"OUT OF MEMORY) on rank 0 (stages {stages}); largest parts: " in captured.out
    assert f" GiB needed on rank 0 (stages {stages}), the GPU holds " in captured.err


def test_validate_counts_the_gpus_a_trace_spans_as_the_run_does(tmp_path, capsys):
    """The two-rank Chakra trace on a DGX H100: `validate` says '2 GPUs', as the run does, not the host's '8 GPUs'."""
    assert main(["validate", "trace-chakra-2rank"]) == 0
    assert capsys.readouterr().out == "trace-chakra-2rank: valid (2 of the 8 h100-sxm GPUs on dgx-h100)\n"
    assert main(["run", "trace-chakra-2rank", "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.startswith("trace on dgx-h100 (2 h100-sxm GPUs)\n")


def test_quiet_prints_nothing_and_still_writes(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(SCENARIOS / "schedule-1f1b-p4-m8.yaml"), "--out", str(out), "--quiet"]) == 0
    assert main(["validate", str(SCENARIOS / "schedule-1f1b-p4-m8.yaml"), "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")
    assert (out / "summary.json").is_file()


def test_communication_run_prints_its_collective_table(tmp_path, capsys):
    assert main(["run", str(SCENARIOS / "allreduce-2x-dgx-h100.yaml"), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for row in summary["collectives"]:
        line = next(line for line in text.splitlines() if line.split() and line.split()[0] == row["name"])
        assert line.split()[-4:] == [f"{row['algbw_GBps']:.1f}", f"{row['busbw_GBps']:.1f}", row["algorithm"],
                                     row["protocol"]]
    assert all(line == line.rstrip() for line in text.splitlines()), "trailing blanks in a pipe"


def test_the_collective_table_gives_each_size_in_a_unit_it_reads_in(tmp_path, capsys):
    """Each size takes the largest binary unit it reaches, to 4 significant digits (3000 B: 2.93 KiB), not MiB
    throughout (1 B as 9.537e-07 MiB, 1 GiB as 1,024 MiB), while summary.json keeps bytes."""
    scenario = tmp_path / "sizes.yaml"
    scenario.write_text("cluster: {topology: dgx-h100-cluster, nodes: 2}\nworkload:\n"
                        "  - {name: one, op: all_reduce, bytes: 1 B, group: 0-7}\n"
                        "  - {name: odd, op: all_reduce, bytes: 3000 B, group: 0-7}\n"
                        "  - {name: big, op: all_reduce, bytes: 1 GiB, group: all}\n"
                        "  - {name: empty, op: all_reduce, bytes: 0 B, group: all}\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.split()}
    assert {name: rows[name][3:5] for name in ("one", "odd", "big", "empty")} == {
        "one": ["1", "B"], "odd": ["2.93", "KiB"], "big": ["1", "GiB"], "empty": ["0", "B"]}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [row["bytes"] for row in summary["collectives"]] == [1, 3000, 2**30, 0]


def test_progress_off_a_terminal_is_a_plain_line_every_ten_seconds(capsys):
    """Off a terminal no bar is drawn: a plain line at most every PLAIN_EVERY_S seconds, the first that long
    after the start, each phase's count in its own words."""
    now = [0.0]
    plain = PlainProgress("replications", "simulating the job", clock=lambda: now[0])
    for now[0], done in ((0.0, 1), (9.9, 5), (10.0, 12), (19.0, 20)):
        plain(done, 100)
    now[0] = 3725.0
    plain.show(420, 1_685, "states", "simulating straggler states ahead")
    plain(0, 0)
    assert capsys.readouterr() == ("", "simulating the job: 12/100 replications (12%), 0:00:10 elapsed\n"
                                       "simulating straggler states ahead: 420/1,685 states (24%), 1:02:05 elapsed\n")


def test_run_progress_off_a_terminal_prints_plain_lines_unless_quiet(capsys):
    with RunProgress(enabled=True) as progress:
        assert progress.bar is None and progress.plain is not None
        progress.plain.last -= PLAIN_EVERY_S
        progress(1024, 4096)
        progress.doing("writing outputs")
        assert progress.bar is None
    assert capsys.readouterr() == ("", "simulating: 1,024/4,096 ops (25%), 0:00:00 elapsed\n")
    assert RunProgress(enabled=False).plain is None


def test_plain_progress_says_what_the_run_does_between_counts(capsys, monkeypatch):
    """A job's replication simulating a degraded state for minutes gives no count: the activity a `RunProgress` sets
    (`RunProgress.doing`) names the state on the next due line, and `beat` (the heartbeat's call, here made by the
    test: the thread waits a day) prints one whenever PLAIN_EVERY_S have passed, with or without a count since."""
    monkeypatch.setattr(progress_module, "BEAT_S", 86_400.0)
    now = [0.0]
    with RunProgress(enabled=True, unit="replications", description="simulating the job") as progress:
        assert progress.plain is not None
        plain = progress.plain
        plain.clock = lambda: now[0]
        plain.started = plain.last = 0.0
        progress.doing("simulating the healthy step")
        now[0] = PLAIN_EVERY_S
        plain.beat()
        progress(0, 2)
        progress.doing("replication 1/2: simulating a new cluster state (8 link(s) down)")
        plain.beat()
        now[0] = 2 * PLAIN_EVERY_S
        plain.beat()
        now[0] = 3 * PLAIN_EVERY_S
        progress.doing("")
    assert capsys.readouterr().err == (
        "simulating the job: simulating the healthy step, 0:00:10 elapsed\n"
        "simulating the job: 0/2 replications (0%), replication 1/2: simulating a new cluster state (8 link(s) down),"
        " 0:00:20 elapsed\n"
        "simulating the job: 0/2 replications (0%), 0:00:30 elapsed\n")


@contextmanager
def _states_ahead_counted_at_5_s(monkeypatch, now: list[float]):
    """A plain (piped) job progress on the clock ``now`` (no heartbeat thread), started at 0 s, whose states ahead
    are counted with ``eta`` from 0 of 41 at 5 s: the progress and its count."""
    monkeypatch.setattr(progress_module, "BEAT_S", 86_400.0)
    with RunProgress(enabled=True, unit="replications", description="simulating the job") as progress:
        assert progress.plain is not None
        progress.plain.clock = lambda: now[0]
        progress.plain.started = progress.plain.last = 0.0
        counted = progress.counting("states", "simulating cluster states ahead", eta=True)
        now[0] = 5.0
        counted(0, 41)
        yield progress, counted


def test_the_states_ahead_count_tells_the_time_left_once_one_state_has_run(capsys, monkeypatch):
    """A phase counted with ``eta`` (the job's states ahead, which a 16,384-GPU job counts to 19,663 over hours) gives,
    once one is done, the time the rest take at its rate since its count of none: one state in 150 s, 40 left, 6,000
    s; none before the first is done, and none for the replications after."""
    now = [0.0]
    with _states_ahead_counted_at_5_s(monkeypatch, now) as (progress, counted):
        assert progress.plain is not None
        now[0] = PLAIN_EVERY_S
        progress.plain.beat()
        now[0] = 155.0
        counted(1, 41)
        now[0] = 165.0
        progress(0, 2)
    assert capsys.readouterr().err == (
        "simulating cluster states ahead: 0/41 states (0%), 0:00:10 elapsed\n"
        "simulating cluster states ahead: 1/41 states (2%), 0:02:35 elapsed, about 1:40:00 left\n"
        "simulating the job: 0/2 replications (0%), 0:02:45 elapsed\n")


def test_the_first_time_left_shares_the_rest_between_the_workers(capsys, monkeypatch):
    """The first state ahead is simulated in the job's process alone, and the rest over the workers: a count that says 8
    workers share the rest gives an eighth of its time times the 40 left, 0:12:30, not 1:40:00 whatever --workers;
    the counts after it go by the rate so far."""
    now = [0.0]
    with _states_ahead_counted_at_5_s(monkeypatch, now) as (_, counted):
        now[0] = 155.0
        counted.sharing(8)
        counted(1, 41)
        now[0] = 175.0
        counted(9, 41)
    assert capsys.readouterr().err == (
        "simulating cluster states ahead: 1/41 states (2%), 0:02:35 elapsed, about 0:12:30 left\n"
        "simulating cluster states ahead: 9/41 states (21%), 0:02:55 elapsed, about 0:10:04 left\n")


def test_plain_progress_heartbeat_prints_while_no_count_comes(capsys, monkeypatch):
    """Off a terminal a RunProgress starts a heartbeat thread, which prints the due line though the run reports
    nothing (here the clock past PLAIN_EVERY_S and the thread looking every millisecond), and stops at close."""
    monkeypatch.setattr(progress_module, "BEAT_S", 0.001)
    with RunProgress(enabled=True, unit="replications", description="simulating the job") as progress:
        assert progress.plain is not None
        plain = progress.plain
        plain.clock = lambda: plain.started
        progress.doing("replication 1/2: simulating a new cluster state (8 link(s) down)")
        plain.clock = lambda: plain.started + PLAIN_EVERY_S  # due: only the heartbeat prints from here
        waited = time.monotonic()
        while "elapsed" not in (err := capsys.readouterr().err) and time.monotonic() - waited < 60:
            time.sleep(0.01)
    assert err == ("simulating the job: replication 1/2: simulating a new cluster state (8 link(s) down), "
                   "0:00:10 elapsed\n")
    assert progress.heartbeat is None


@pytest.mark.parametrize("label", ["sweep", "search"])
def test_a_piped_sweep_or_search_prints_while_a_point_runs(label, capsys, monkeypatch):
    """Off a terminal a sweep's and a search's plain progress has a heartbeat, which prints the due line every
    PLAIN_EVERY_S as documented though no point finishes (here every line due, the thread looking every millisecond),
    and stops with the printer; without it a search would say nothing for its first minute, a one-point sweep nothing
    for 21 s."""
    from simulator.sweep.runner import progress_printer

    monkeypatch.setattr(progress_module, "BEAT_S", 0.001)
    monkeypatch.setattr(progress_module, "PLAIN_EVERY_S", 0.0)
    update, stop, _ = progress_printer(False, label)
    assert isinstance(update, RunProgress)
    line = rf"{label}: 0/9 points \(0%\), \d+:\d\d:\d\d elapsed\n"
    try:
        update(0, 9)  # on a loaded machine the heartbeat may print its count-less line before the count comes
        assert re.fullmatch(rf"({label}: \d+:\d\d:\d\d elapsed\n)*{line}", capsys.readouterr().err)
        heartbeat = update.heartbeat
        assert heartbeat is not None and heartbeat.alive
        waited = time.monotonic()
        while not (err := capsys.readouterr().err) and time.monotonic() - waited < 30:
            time.sleep(0.01)
    finally:
        stop()
    assert re.match(line, err), err
    assert update.heartbeat is None and not heartbeat.alive


def test_the_heartbeat_thread_blocks_the_stop_signals():
    """Ctrl-C and SIGTERM must reach the process through the main thread: ahead.py blocks them there across a
    worker's fork, and the heartbeat, not blocking them, took one whose handler then ran inside that window."""
    masks = []
    heard = threading.Event()

    def beat():
        masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))
        heard.set()

    heartbeat = Heartbeat(beat, lambda: 0.001)
    heartbeat.start()
    assert heard.wait(60)
    heartbeat.stop()
    assert not heartbeat.alive
    assert {signal.SIGINT, signal.SIGTERM} <= masks[0]
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


class _HeldStderr:
    """A stderr whose writes take a lock of their own, as Python's buffered stderr does: the first write from a
    thread other than the main one waits inside it, the lock held, until ``release`` is set. In a forked child a
    write that finds the lock held raises instead of blocking for ever (the thread holding it is not there)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parent = os.getpid()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.lines: list[str] = []
        self.written = threading.Condition()

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> None:
        if not self.lock.acquire(blocking=os.getpid() == self.parent):
            raise RuntimeError("stderr's lock was held when this process was forked")
        try:
            if threading.current_thread() is not threading.main_thread() and not self.entered.is_set():
                self.entered.set()
                self.release.wait()
            with self.written:
                self.lines.append(text)
                self.written.notify_all()
        finally:
            self.lock.release()

    def flush(self) -> None:
        pass


_RELEASED_AT_FORK: list[threading.Event] = []
"""Set as this process starts to fork (registered after console/progress.py's hooks, so called before them)."""
os.register_at_fork(before=lambda: [event.set() for event in _RELEASED_AT_FORK])


def _writes_a_line() -> None:
    sys.stderr.write("a worker's line\n")


def test_a_worker_forked_while_a_progress_line_is_written_does_not_block(monkeypatch):
    """A worker forked by ahead.py while the job's heartbeat thread writes its line would hold stderr's lock in a copy
    with no thread to release it, and block for ever on its first write to stderr (or its flush on the way out). Here
    the heartbeat's due line is held mid-write until the fork begins: the fork waits for that beat to end and the
    thread with it, the worker writes its line, and the parent's heartbeat, started again at the run's next report,
    goes on printing its lines."""
    from multiprocessing import get_context

    stderr = _HeldStderr()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(progress_module, "BEAT_S", 0.001)
    _RELEASED_AT_FORK.append(stderr.release)
    try:
        with RunProgress(enabled=True, unit="replications", description="simulating the job") as progress:
            assert progress.plain is not None
            plain = progress.plain
            plain.clock = lambda: plain.started + PLAIN_EVERY_S
            assert stderr.entered.wait(60)  # the heartbeat is writing its line, stderr's lock held
            worker = get_context("fork").Process(target=_writes_a_line)
            worker.start()
            worker.join(60)
            assert progress.heartbeat is not None and not progress.heartbeat.alive  # no thread beside the fork
            progress.doing("replication 1/2")  # the run's next report starts it again (no line due)
            plain.clock = lambda: plain.started + 2 * PLAIN_EVERY_S  # due: only the heartbeat prints from here
            with stderr.written:
                assert stderr.written.wait_for(lambda: len(stderr.lines) == 2, 60)
    finally:
        _RELEASED_AT_FORK.remove(stderr.release)
    assert worker.exitcode == 0
    assert stderr.lines == ["simulating the job: 0:00:10 elapsed\n",
                            "simulating the job: replication 1/2, 0:00:20 elapsed\n"]


def test_a_heartbeat_whose_fork_hook_was_interrupted_starts_again():
    """A Ctrl-C inside the fork hook's join (CPython reports it and drops it; ahead.py and the sweep's pool block it
    across their forks, another forker may not) leaves the heartbeat's thread ended: the heartbeat is forgotten, not
    left marked alive (where `resume` would never start another and no line would come for the rest of the run), and
    the next report starts it again."""
    beats = threading.Semaphore(0)
    heartbeat = Heartbeat(beats.release, lambda: 0.001)
    heartbeat.start()
    try:
        thread = heartbeat._thread
        assert thread is not None

        def interrupted(timeout: float | None = None) -> None:
            raise KeyboardInterrupt

        thread.join = interrupted
        with pytest.raises(KeyboardInterrupt):
            progress_module._halted_for_fork()
        del thread.join
        thread.join(60)
        assert not heartbeat.alive
        heartbeat.resume()
        while beats.acquire(blocking=False):
            pass
        assert heartbeat.alive and beats.acquire(timeout=60)
    finally:
        heartbeat.stop()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the system's threads are read from Linux's /proc")
def test_a_heartbeat_ended_for_a_fork_has_left_the_systems_threads():
    """Python's join returns a moment before the system's thread has exited, and Python 3.12 counts the
    system's threads at a fork: the thread was still listed after 3 halts in 4, and 3.12 warned of a fork
    beside a thread at about half the fork rounds after a heartbeat had run. The fork hook waits it out."""
    for _ in range(20):
        heartbeat = Heartbeat(lambda: None, lambda: 0.001)
        heartbeat.start()
        thread = heartbeat._thread
        assert thread is not None
        try:
            progress_module._halted_for_fork()
            assert not os.path.exists(f"/proc/self/task/{thread.native_id}")
        finally:
            heartbeat.stop()


def test_a_sweep_bar_keeps_no_thread_of_rich_and_redraws_while_the_pool_runs_its_first_points(monkeypatch):
    """On a terminal the sweep's bar keeps no refresh thread of rich's alive while the pool forks its workers (a worker
    forked mid-write would hold stderr's lock for ever): it is redrawn by a Heartbeat, which the pool starts again
    once its workers are forked: at the pool's first wait on them the one thread beside the main one is the
    heartbeat's."""
    import pty

    from simulator.sweep import executors
    from simulator.sweep.executors import PoolExecutor
    from simulator.sweep.runner import progress_printer

    threads_before = set(threading.enumerate())
    beside: list[list[str]] = []
    wait = executors.wait

    def waited(pipes):
        beside.append(sorted(thread.name for thread in set(threading.enumerate()) - threads_before))
        return wait(pipes)

    monkeypatch.setattr(executors, "wait", waited)
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        monkeypatch.setenv("TERM", "xterm-256color")
        update, stop, _ = progress_printer(False)
        pool = PoolExecutor(2)
        results: list[int] = []
        try:
            for result in pool.map_unordered(abs, [-1, -2]):
                results.append(result)
                update(len(results), 2)
        finally:
            pool.close()
            stop()
    os.close(master)
    assert sorted(results) == [1, 2] and beside[0] == ["progress-heartbeat"]
    assert set(threading.enumerate()) <= threads_before


def test_a_warning_reaches_stderr_in_one_write(monkeypatch):
    """`print` wrote a warning's text and its newline apart, and the heartbeat's line could land between them."""
    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)

    monkeypatch.setattr(sys, "stderr", Recorder())
    cli_module._warn_line("a worker ended early")
    assert writes == ["warning: a worker ended early\n"]


def test_validate_of_a_plain_step_imports_no_job_module():
    """preflight imported the job simulation's modules for every scenario (334 modules, about 0.1 s of each
    validate) to refuse a trace job's idle GPUs; they load for a replayed trace only."""
    scenario = bundled.resolve_scenario("llama3-8b-dgx-h100-dp8")
    code = ("import sys\nfrom simulator.cli import main\n"
            f"code = main(['validate', {str(scenario)!r}])\n"
            "print(code, [m for m in sys.modules if m.startswith('simulator.reliability')])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "0 []"


def test_plain_progress_says_100_percent_only_when_all_are_done(capsys):
    """The share is floored: 199 of 200 points read '(99%)', not a rounded '(100%)' while one still runs."""
    now = [0.0]
    plain = PlainProgress("points", "sweep", clock=lambda: now[0])
    now[0] = PLAIN_EVERY_S
    plain(199, 200)
    now[0] += PLAIN_EVERY_S
    plain(200, 200)
    assert capsys.readouterr().err == ("sweep: 199/200 points (99%), 0:00:10 elapsed\n"
                                       "sweep: 200/200 points (100%), 0:00:20 elapsed\n")


@pytest.mark.parametrize(("command", "line"), [
    (["run", str(DATA / "small-job.yaml"), "--set", "run.replications=3"], "simulating the job: 3/3 replications"),
    (["sweep", str(DATA / "sweep_200.yaml"), "--executor", "serial"], "sweep: 200/200 points"),
])
def test_a_long_command_piped_says_how_far_it_got(command, line, tmp_path, monkeypatch, capsys):
    """A job (or a sweep, a search, a study, a run) with its output piped prints plain progress lines on stderr (here
    one at every count, PLAIN_EVERY_S set to 0), none with --quiet."""
    monkeypatch.setattr(progress_module, "PLAIN_EVERY_S", 0.0)
    assert main([*command, "--out", str(tmp_path / "out")]) == 0
    assert f"{line} (100%)" in capsys.readouterr().err
    assert main([*command, "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert "elapsed" not in capsys.readouterr().err


@pytest.mark.parametrize(("command", "line"), [
    (["run", str(DATA / "small-job.yaml")], "simulating the job: 1/1 replications (100%), writing outputs, "),
    (["run", str(SCENARIOS / "schedule-1f1b-p4-m8.yaml")], "simulating: 116/116 ops (100%), writing outputs, "),
])
def test_a_piped_run_says_when_it_writes_its_outputs(command, line, tmp_path, monkeypatch, capsys):
    """The plain line says the 'writing outputs' phase (while a large job writes its events, not only that the
    replications are done): a run and a job say it the same way, after their last count, which a run of fewer than
    1,024 ops gets too (the engine reports its last)."""
    monkeypatch.setattr(progress_module, "PLAIN_EVERY_S", 0.0)
    assert main([*command, "--out", str(tmp_path / "out")]) == 0
    lines = [text for text in capsys.readouterr().err.splitlines() if text.endswith(" elapsed")]
    assert lines[-1].startswith(line)


def test_a_long_step_reads_in_days_too_and_a_negligible_largest_loss_is_none():
    """A 1,546,021 s step reads in days too, as the job's figures do, not in seconds alone; with its optimizer step
    0.002% of it the verdict names no largest loss, not 'optimizer step, 0.0% of the step'."""
    from simulator.console.report import step_seconds
    from simulator.metrics.summary import bottleneck

    assert [step_seconds(value) for value in (1.5, 59.0, 1_546_021.0)] == ["1.500 s", "59.00 s",
                                                                           "1,546,021 s (17.89 d)"]
    comm = {"exposed_comm_s": {"dp": 0.0}, "exposed_union_s": 0.0, "wait_s": 0.0, "host_s": 0.0}

    def verdict(share: float) -> str:
        return bottleneck(100.0, comm, {}, 0.0, 0.0, {"optimizer": share}, pipeline_stages=1)["verdict"]

    assert [verdict(share) for share in (0.00002, 0.0005, 0.0)] == [
        "compute-bound; no loss as large as 0.1% of the step",
        "compute-bound; largest single loss: optimizer step, 0.1% of the step", "compute-bound; no measurable loss"]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("trainsim ")


def test_an_uninstalled_tree_words_its_version_alike_in_version_and_the_manifest(capsys, monkeypatch):
    """`--version` printed 'unknown (not installed)' where manifest.json recorded 'unknown': two lookups of one
    fact. One function words it for both."""
    import importlib.metadata

    from simulator.report.run_folder import trainsim_version

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == "trainsim unknown (not installed)\n"
    assert trainsim_version() == "unknown (not installed)"


def test_bundled_scenarios_are_listed_with_their_descriptions(capsys):
    assert main(["scenarios"]) == 0
    text = capsys.readouterr().out
    files = sorted(SCENARIOS.glob("*.yaml"))
    assert bundled.bundled_scenarios() == [path.stem for path in files]
    for path in files:
        first_sentence = " ".join(yaml.safe_load(path.read_text())["description"].split()).split(". ")[0]
        line = next(line for line in text.splitlines() if line.split()[0] == path.stem)
        assert " ".join(line.split()[1:]) == first_sentence.removesuffix("."), path.stem  # none ends in '.'
        # one line of a terminal beside its name: trace-h200-step's first sentence held the profiled model's
        # whole recipe, 256 characters, in parentheses
        assert len(first_sentence) <= 100, path.stem


def test_a_bundled_scenario_runs_by_name_from_any_folder(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "simulator.cli", "run", LLAMA_8B, "--out", "out", "--quiet",
                                "--set", "run.timeline=summary"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (completed.returncode, completed.stdout, completed.stderr) == (0, "", "")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["scenario"] == str(SCENARIOS / f"{LLAMA_8B}.yaml")


def test_a_bundled_scenario_runs_by_name_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    """`trainsim run NAME --out NAME` writes its outputs into a folder called NAME; running the same command
    again runs the scenario again (it read the folder as the scenario: "cannot read file: Is a directory")."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["run", LLAMA_8B, "--out", LLAMA_8B, "--quiet", "--set", "run.timeline=summary"]) == 0
    summary = json.loads((tmp_path / LLAMA_8B / "summary.json").read_text())
    assert summary["scenario"] == str(SCENARIOS / f"{LLAMA_8B}.yaml")


def test_an_unknown_scenario_name_lists_the_bundled_ones(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "llama3-8b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: llama3-8b: no such file, and no bundled scenario named 'llama3-8b' (did you "
                          "mean llama3-8b-dgx-h100-dp8, llama3-8b-dgx-h100-eager-fsdp or llama3-8b-dgx-h100-zero3?) "
                          "(allowed: ")
    assert LLAMA_8B in err


def test_a_wheel_installs_the_scenarios_where_it_looks_for_them():
    """pyproject's data-files put scenarios/ (with the traces and tables its scenarios refer to) under
    <prefix>/share/trainsim/scenarios, the folder used when the package does not sit in a source tree."""
    data_files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    installed = {Path(target) / path.name for target, patterns in data_files.items() for pattern in patterns
                 for path in REPO.glob(pattern)}
    for path in SCENARIOS.rglob("*"):  # each file a scenario may refer to lands at its place under share/trainsim
        assert not path.is_file() or Path("share/trainsim") / path.relative_to(REPO) in installed, path
    assert bundled.INSTALLED_DIR == Path(sys.prefix) / "share" / "trainsim" / "scenarios"
    assert bundled.BUNDLED_DIR == SCENARIOS


@pytest.mark.parametrize("name", bundled.bundled_scenarios())
def test_every_bundled_scenario_validates_by_name(name, capsys):
    assert main(["validate", name, "--quiet"]) == 0


def _drawn_on_a_terminal(monkeypatch, draw, **bar) -> bytes:
    """What a RunProgress(enabled=True, **bar) writes while ``draw(progress)`` runs with stderr on a
    pseudo-terminal (rich draws no live display on a dumb terminal), read after the bar has stopped."""
    import pty
    import select

    master, slave = pty.openpty()
    drawn = b""
    with os.fdopen(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        monkeypatch.setenv("TERM", "xterm-256color")
        with RunProgress(enabled=True, **bar) as progress:
            draw(progress)
        terminal.flush()  # the bar is stopped: nothing more is written
        while select.select([master], [], [], 0.5)[0]:
            drawn += os.read(master, 65536)
    os.close(master)
    return drawn


def test_progress_bar_draws_on_a_terminal(monkeypatch):
    """With stderr on a pseudo-terminal, a run past one second shows the phase and the op count."""
    def draw(progress):
        progress(1024, 4096)
        assert progress.bar is None  # not yet a second
        progress.started -= 10
        progress(2048, 4096)
        assert progress.bar is not None
        progress.bar.refresh()

    drawn = _drawn_on_a_terminal(monkeypatch, draw)
    assert b"2,048/4,096 ops" in drawn and b"simulating" in drawn


def test_job_progress_bar_counts_replications(monkeypatch):
    """A job's bar counts replications, not ops (`trainsim run` of a scenario with run.horizon)."""
    def draw(progress):
        progress.started -= 10
        progress(1_500, 2_000)
        assert progress.bar is not None
        progress.bar.refresh()

    drawn = _drawn_on_a_terminal(monkeypatch, draw, unit="replications", description="simulating the job")
    assert b"1,500/2,000 replications" in drawn and b"simulating the job" in drawn


def test_job_progress_bar_counts_the_states_simulated_ahead_then_the_replications(monkeypatch):
    """A job whose straggler states are simulated ahead counts them in its bar first (the 16,384-GPU throttling
    job sat at 0 replications for the ~25 minutes they took), then its replications."""
    def draw(progress):
        progress.started -= 10
        progress.counting("states", "simulating straggler states ahead")(420, 1_685)
        assert progress.bar is not None
        progress.bar.refresh()
        progress(3, 100)
        progress.bar.refresh()

    drawn = _drawn_on_a_terminal(monkeypatch, draw, unit="replications", description="simulating the job")
    assert b"420/1,685 states" in drawn and b"simulating straggler states ahead" in drawn
    assert b"3/100 replications" in drawn


def test_the_states_ahead_bar_tells_the_time_left_once_one_state_has_run(monkeypatch):
    """On a terminal too: 420 states in the 420 s since the count of none, 1,265 left."""
    def draw(progress):
        progress.started -= 10
        counted = progress.counting("states", "simulating cluster states ahead", eta=True)
        began = float(int(progress.started) + 10)  # whole seconds: began + 420 - began is 420 to the bit
        monkeypatch.setattr(progress_module.time, "monotonic", lambda: began)
        counted(0, 1_685)
        monkeypatch.setattr(progress_module.time, "monotonic", lambda: began + 420)
        counted(420, 1_685)
        progress.bar.refresh()

    drawn = _drawn_on_a_terminal(monkeypatch, draw, unit="replications", description="simulating the job")
    assert b"420/1,685 states" in drawn and b"about 0:21:05 left" in drawn


def test_the_states_ahead_bar_keeps_its_count_on_an_80_column_terminal_in_a_round(monkeypatch):
    """A job's round of states ahead is named on the bar (reliability/simulate.py `round_text`): 'round 1 of 2:
    the states trained or restarted in' pushed the bar and its count off an 80-column terminal. Round 1 says a
    second may follow, which its count and time left do not hold ('round 1' alone read as the whole)."""
    from simulator.reliability.simulate import round_text

    def draw(progress):
        progress.started -= 10
        progress.counting("states", "simulating cluster states ahead", eta=True)(2, 8)
        progress.doing(round_text(1))
        progress.bar.refresh()

    monkeypatch.setenv("COLUMNS", "80")
    drawn = _drawn_on_a_terminal(monkeypatch, draw, unit="replications", description="simulating the job")
    assert b"simulating cluster states ahead: round 1 of up to 2" in drawn and b"2/8 states" in drawn


def test_job_progress_bar_names_the_state_a_replication_simulates(monkeypatch):
    """On a terminal the bar's label says what the job does between counts (`doing`), until told '' again."""
    def draw(progress):
        progress.started -= 10
        progress(0, 2)
        progress.doing("replication 1/2: simulating a new cluster state (8 link(s) down)")
        assert progress.bar is not None
        progress.bar.refresh()
        assert progress.bar.tasks[0].description.endswith("a new cluster state (8 link(s) down)")
        progress.doing("")
        assert progress.bar.tasks[0].description == "simulating the job"

    drawn = _drawn_on_a_terminal(monkeypatch, draw, unit="replications", description="simulating the job")
    assert b"simulating the job: replication 1/2: simulating a new cluster state" in drawn


def test_the_engine_reports_its_last_count():
    """The engine reports its last count beside every 1,024th op, so a run of 38,381 ops reaches 'writing outputs' at
    38,381, not at 37,888 ('37,888/38,381 ops (98%), writing outputs', the bar filled by hand)."""
    from simulator import load_scenario, simulate

    heard = []
    loaded = load_scenario(str(SCENARIOS / "schedule-1f1b-p4-m8.yaml"), ["training.microbatches=100"])
    simulate(loaded, progress=lambda done, total: heard.append((done, total)))
    assert heard == [(1024, 1404), (1404, 1404)]


def test_a_run_writing_its_outputs_says_so_on_a_full_bar(monkeypatch, tmp_path):
    """On a terminal, a plain run's bar says 'writing outputs' after the count's description, as a job's does, full
    from the engine's last count (116/116 ops)."""
    import pty

    seen = []
    close = RunProgress.close

    def closed(progress):
        tasks = progress.bar.tasks if progress.bar is not None else []
        seen.append([(task.completed, task.total, task.description) for task in tasks])
        close(progress)

    monkeypatch.setattr(RunProgress, "close", closed)
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        monkeypatch.setenv("TERM", "xterm-256color")
        assert main(["run", str(SCENARIOS / "schedule-1f1b-p4-m8.yaml"), "--out", str(tmp_path / "out")]) == 0
    os.close(master)
    assert seen == [[(116, 116, "simulating: writing outputs")]]


def test_a_trace_without_tokens_says_so_instead_of_zero_throughput(tmp_path, capsys):
    """A replayed trace states no tokens or model FLOPs: the table says so, not '0 tokens/s' and 'MFU 0.0%'."""
    assert main(["run", str(SCENARIOS / "trace-allreduce-2rank.yaml"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "trace on ethernet-100g (2 a100-80gb GPUs)"
    assert "n/a (the trace states no tokens: set workload.tokens_per_step" in out
    assert "TFLOP/s per GPU" not in out and "0 tokens/s" not in out


def test_a_trace_prints_compute_idle_as_unknown_not_zero(tmp_path, capsys):
    """A replayed trace's kernels are not forward or backward passes, so its bubble_fraction has no window and is 0: the
    table prints compute idle as unknown, not 'compute idle 0.0%', though rank 0 of the bundled two-rank trace waits
    100 us of its 4.192 ms step for rank 1 at the all-reduce; summary.json keeps bubble_fraction 0."""
    out_dir = tmp_path / "out"
    assert main(["run", str(SCENARIOS / "trace-allreduce-2rank.yaml"), "--out", str(out_dir)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "compute idle" in line)
    assert row.split("compute idle")[1].strip().startswith("n/a (measured over forward and backward passes")
    assert json.loads((out_dir / "summary.json").read_text())["bubble_fraction"] == 0.0


def test_a_trace_without_op_shapes_prints_hfu_as_unknown_not_zero(tmp_path, capsys):
    """With tokens and model FLOPs given, a trace whose ops have no shapes has unknown executed FLOPs, not zero: HFU is
    n/a in the table (not 'MFU 31.4%, HFU 0.0%'), and summary.json's hfu and hardware_tflops_per_gpu are null, not
    0.0, which a script would read as measured."""
    out_dir = tmp_path / "out"
    assert main(["run", str(SCENARIOS / "trace-allreduce-2rank.yaml"), "--out", str(out_dir),
                 "--set", "workload.tokens_per_step=8192", "--set", "workload.model_flops_per_token=100000000"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "TFLOP/s per GPU" in line)
    assert "(MFU " in row and row.rstrip().endswith("HFU n/a: no op shapes in the trace)")
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["hfu"] is None and summary["hardware_tflops_per_gpu"] is None and summary["mfu"] > 0


def test_a_trace_with_op_shapes_prints_hfu_as_a_lower_bound(tmp_path, capsys):
    """A trace counts its matrix multiplies' FLOPs alone (attention and the rest are not), so its HFU is a lower bound
    and says so (the H200 step's 25.5% printed plainly would read as all the work its hardware did). That share is
    below the step's MFU (28.0%, whose model FLOPs count causal attention too), and 'MFU 28.0%, HFU >= 25.5%' would
    read as HFU below MFU, which counts fewer FLOPs by definition: the row says HFU is at least the MFU and gives the
    25.5% as the matrix multiplies' share of peak. Where the MFU is above 100% (an overstated model_flops_per_token,
    warned as wrong) the row does not claim 'HFU >= MFU', which would put HFU at 280% or more."""
    from simulator.console.report import _hfu

    out_dir = tmp_path / "out"
    assert main(["run", str(SCENARIOS / "trace-h200-step.yaml"), "--out", str(out_dir)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "TFLOP/s per GPU" in line)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert 0 < summary["hfu"] < summary["mfu"]
    assert row.rstrip().endswith(f"(MFU {100 * summary['mfu']:.1f}%, HFU >= MFU; the matrix multiplies alone "
                                 f"{100 * summary['hfu']:.1f}% of peak)")
    counted = {**summary, "mfu": summary["hfu"] / 2}  # matrix multiplies above the MFU: they bound HFU
    assert _hfu(counted) == f"HFU >= {100 * summary['hfu']:.1f}%: matrix multiplies only"
    overstated = {**summary, "mfu": 2.805}  # model FLOPs overstated: warned as wrong, so no bound on HFU
    assert _hfu(overstated) == f"HFU >= {100 * summary['hfu']:.1f}%: matrix multiplies only"


def test_a_synthetic_model_says_so_instead_of_zero_throughput(tmp_path, capsys):
    """Synthetic stage costs have no tokens, FLOPs or memory: the table says so for the bundled schedule studies, not '0
    tokens/s', 'MFU 0.0%' and '0.0 GiB of 79.6 GiB'."""
    assert main(["run", str(SCENARIOS / "schedule-1f1b-p4-m8.yaml"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "n/a (synthetic stage costs: no tokens, FLOPs or memory)" in out
    assert "TFLOP/s per GPU" not in out and "tokens/s" not in out and "peak memory" not in out
    # 3/11, the closed form for GPipe-like fill and drain at p = 4, m = 8, of the window the forwards and
    # backwards span, beside the schedule's own (the same: nothing waits); the bottleneck row gives the same idle
    # time as a share of the step, which the bubble's row says beside it, so that two shares of one idle time (50.0%
    # of the window above 45.9% of the step on a deeper run) read as the same time, not as contradicting; the
    # synthetic stages are uniform, so the schedule's bubble is its uniform-stage one and no stage is named.
    assert ("pipeline bubble          27.3% of the pipeline window (idle on the compute stream, waits included; the"
            in out)
    assert "alone 27.3%; 27.3% at uniform stages = (p-1)/(m+p-1) = 3/11), 27.3% of the whole step" in out


def test_one_gpu_and_one_micro_batch_read_in_the_singular():
    from simulator.console.report import _layout_line

    summary = {"topology": "dgx-h100", "gpus": 1,
               "layout": {"model": "m", "tp": 1, "cp": 1, "pp": 1, "dp": 1, "microbatches": 1}}
    assert _layout_line(summary) == "m on dgx-h100 (1 GPU, TP1 CP1 PP1 DP1, 1 micro-batch per step)"


@pytest.mark.parametrize("sharding, named", [
    ({"zero_stage": 0}, "DP8 DDP,"), ({"zero_stage": 1}, "DP8 ZeRO-1,"), ({"zero_stage": 3}, "DP8 ZeRO-3,"),
    ({"zero_stage": 3, "fsdp": "full_shard"}, "DP8 FSDP full_shard (ZeRO-3),"),
    ({"zero_stage": 2, "fsdp": "shard_grad_op"}, "DP8 FSDP shard_grad_op (ZeRO-2),"),
    ({"zero_stage": 3, "fsdp": "hybrid_shard", "shard_ranks": 4},
     "DP8 FSDP hybrid_shard (ZeRO-3, HSDP shards of 4 ranks),"),
    ({"zero_stage": 3, "fsdp": "hybrid_shard", "shard_ranks": 1},
     "DP8 FSDP hybrid_shard (ZeRO-3, HSDP shards of 1 rank),"),
    ({}, "DP8, 4 micro-batches")])
def test_the_first_line_names_the_sharding(sharding, named):
    """`llama3-8b-dgx-h100-zero3` opened with 'TP1 CP1 PP1 DP8', its FSDP full shard nowhere in the line."""
    from simulator.console.report import _layout_line

    summary = {"topology": "dgx-h100", "gpus": 8,
               "layout": {"model": "m", "tp": 1, "cp": 1, "pp": 1, "dp": 8, "microbatches": 4, **sharding}}
    assert named in _layout_line(summary)


def test_a_run_records_its_fsdp_strategy_for_the_first_line():
    from simulator import load_scenario
    from simulator.topology.loader import scenario_topology
    from simulator.workload.memory_plan import layout_summary
    from simulator.workload.training import build_training_step

    loaded = load_scenario("scenarios/llama3-8b-dgx-h100-zero3.yaml")
    fsdp = loaded.scenario.parallelism.fsdp
    layout = layout_summary(build_training_step(loaded.scenario, scenario_topology(loaded)), fsdp)
    assert (layout["zero_stage"], layout["fsdp"]) == (3, "full_shard")


def test_the_moved_row_prints_only_where_kernels_moved_to_another_gpu():
    """The moved row prints only where kernels moved to another GPU: not for a trace traced on the cluster's own GPU
    ('moved from h200 to h200: 51 GEMMs x1, ...'), nor one with no class holding both ops and rates (a row ending
    'from h200 to h100-sxm: ')."""
    from rich.console import Console

    from simulator.console.report import training_table

    def printed(move: dict) -> str:
        console = Console(width=200, record=True)
        console.print(training_table({"step_time_s": 1.0, "trace": {"gpu_move": move}}))
        return console.export_text()

    gemms = {"ops": 51, "rates": [{"duration_ratio": 1.045}]}
    assert "moved" in printed({"from": "h200", "to": "h100-sxm", "classes": {"matmul": gemms}})
    assert "moved" not in printed({"from": "h200", "to": "h200", "classes": {"matmul": gemms}})
    assert "moved" not in printed({"from": "h200", "to": "h100-sxm",
                                   "classes": {"matmul": {"ops": 0, "rates": []}}})


def test_a_share_too_small_for_a_tenth_of_a_percent_is_not_printed_as_none():
    """Pipeline hand-offs exposing 828.2 us of a 1.707 s step (Llama 3 8B, pp 2 interleaved on one DGX H100): 0.0485%
    prints as '<0.1%', not 'pp 828.2 us (0.0%)', which reads as nothing exposed; a share of exactly 0 and one that
    rounds up to 0.1% keep their figures."""
    from rich.console import Console

    from simulator.console.report import training_table

    summary = {"step_time_s": 1.707, "exposed_comm_s": {"pp": 828.2e-6, "dp": 0.9e-3, "tp": 0.0},
               "bubble_fraction": 0.0}
    console = Console(width=200, record=True)
    console.print(training_table(summary))
    text = console.export_text()
    assert "exposed communication    pp 828.2 us (<0.1%), dp 900.0 us (0.1%)" in text
    assert "compute idle             0.0% of the forward/backward window" in text


def test_communication_hidden_under_compute_is_shown_beside_the_exposed():
    """A CP ring wholly overlapped with attention showed nowhere in the console, only in summary.json's comm_s:
    the row names it with its hidden time, and a kind partly hidden its hidden part (none where the two print
    alike)."""
    from rich.console import Console

    from simulator.console.report import training_table

    summary = {"step_time_s": 2.0, "bubble_fraction": 0.0,
               "comm_s": {"cp": 0.7927, "dp": 0.1192, "tp": 0.4704, "ep": 0.0, "pp": 0.0},
               "exposed_comm_s": {"cp": 0.0, "dp": 0.04342, "tp": 0.47039999999, "ep": 0.0, "pp": 0.0}}
    console = Console(width=200, record=True)
    console.print(training_table(summary))
    assert ("exposed communication    tp 470.4 ms (23.5%), cp none (792.7 ms hidden), dp 43.42 ms (2.2%; 75.78 ms "
            "hidden)") in console.export_text()


def test_the_exposed_row_gives_the_verdict_s_figure_where_kinds_overlap():
    """llama3-70b-torchtitan-pp-fsdp: TP 20.5% + PP 0.1% + DP 3.7% of the step exposed add up to 24.3%, while the
    verdict's 23.4% counts TP and DP exposed at once a single time: the row gives that figure too, and leaves it out
    where the kinds' shares add up to it."""
    from rich.console import Console

    from simulator.console.report import training_table

    exposed = {"tp": 1.347, "pp": 5.617e-3, "dp": 0.2406, "cp": 0.0, "ep": 0.0}

    def row(union_s: float) -> str:
        summary = {"step_time_s": 6.585, "bubble_fraction": 0.0, "exposed_comm_s": exposed,
                   "bottleneck": {"evidence": {"exposed_comm_share": union_s / 6.585}}}
        console = Console(width=300, record=True)
        console.print(training_table(summary))
        return next(line.rstrip() for line in console.export_text().splitlines() if "exposed communication" in line)

    assert row(1.541).endswith("dp 240.6 ms (3.7%); 23.4% of the step in all, overlaps counted once")
    assert row(sum(exposed.values())).endswith("dp 240.6 ms (3.7%)")


def test_a_long_duration_takes_the_unit_of_its_rounded_value():
    """A duration takes the unit of its value rounded to the digits shown: 3,597 s reads in hours (not '60.0 min') and
    59.9996 s in minutes (not '60 s')."""
    from simulator.console.report import long_duration

    assert [long_duration(s) for s in (3597.0, 3600.0, 3500.0, 59.9996, 59.96, 90.0)] == [
        "1.0 h", "1.0 h", "58.3 min", "1.0 min", "59.96 s", "1.5 min"]


def test_a_moe_layout_line_names_its_expert_parallelism():
    """Mixtral-8x7B's run opened with 'TP2 CP1 PP1 DP16', its scenario's EP 8 nowhere in the printout."""
    from simulator.console.report import _layout_line

    summary = {"topology": "dgx-h100-cluster", "gpus": 32, "moe": {"ep": 8},
               "layout": {"model": "mixtral-8x7b", "tp": 2, "cp": 1, "pp": 1, "dp": 16, "microbatches": 4}}
    assert _layout_line(summary) == ("mixtral-8x7b on dgx-h100-cluster (32 GPUs, TP2 CP1 PP1 DP16 EP8, "
                                     "4 micro-batches per step)")
    summary["moe"]["ep"] = 1
    assert "DP16, 4 micro-batches" in _layout_line(summary)


def test_a_run_with_step_faults_prints_them(tmp_path, capsys):
    """faults-straggler-and-spine-link prints its straggler and its failed link in the table, not only in summary.json's
    `faults`. Its spine link down mid-step unfolds the step: the stage fold (one rank, one stage) is given up before
    its run, which summary.json's `fold_given_up` and the `ranks` row say."""
    assert main(["run", "faults-straggler-and-spine-link", "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if "step faults" in line)
    assert row.split("step faults")[1].strip() == ("GPU 1 compute x2 slower; leaf0.r0-spine0 down from 5 ms "
                                                   "(4 routes rerouted)")
    ranks = next(index for index, line in enumerate(lines) if line.strip().startswith("ranks "))
    assert " ".join(lines[ranks].split()) == (
        "ranks 4 of 4 ranks simulated; the stage fold given up: the step's link faults change mid-step")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["fold_given_up"] == [{"fold": "stage", "simulated_ranks": 1, "why": "the step's link faults "
                                         "change mid-step", "reason": LINKS_DURING_STEP}]
    assert summary["fold_off_reason"] == LINKS_DURING_STEP
    assert (summary["simulated_ranks"], summary["gpus"]) == (4, 4)


def test_many_slowed_gpus_and_links_print_as_counts():
    from simulator.console.report import _step_faults

    faults = {"slowed_gpus": {str(gpu): {"factor": 1 + gpu / 100, "swings": [[0.015, 86400.0, 50400.0]]}
                              for gpu in range(10)},
              "links": [{"link": f"leaf{i}.r0-spine0", "at_s": 0.0, "capacity": 0.5} for i in range(6)],
              "gpu_failures": [], "rerouted_routes": 0}
    assert _step_faults(faults, 0.04) == (
        "10 GPUs' compute x1 to x1.09 slower (with a swing); leaf0.r0-spine0 degraded to 50.0% from the start, "
        "leaf1.r0-spine0 degraded to 50.0% from the start, leaf2.r0-spine0 degraded to 50.0% from the start, "
        "leaf3.r0-spine0 degraded to 50.0% from the start, 2 more links")


def test_faster_gpus_and_link_events_after_the_step_say_so():
    """A drawn factor below 1 is a faster GPU, not 'x0.939 slower'; a link event at or after the step's end
    changed nothing, and says so as a GPU failure then does."""
    from simulator.console.report import _step_faults

    faults = {"slowed_gpus": {"2": {"factor": 0.9391, "swings": []}, "10": {"factor": 1.3, "swings": []}},
              "links": [{"link": "h0/nic0-leaf0.r0", "at_s": 10.0, "capacity": 0.5},
                        {"link": "h1/nic0-leaf0.r1", "at_s": 0.02, "capacity": 0.0}],
              "gpu_failures": [], "rerouted_routes": 0}
    assert _step_faults(faults, 0.0407) == (
        "GPU 2 compute x0.939 (faster), GPU 10 compute x1.3 slower; h0/nic0-leaf0.r0 degraded to 50.0% from 10 s, "
        "after the step's end, h1/nic0-leaf0.r1 down from 20 ms")
    many = {"slowed_gpus": {str(gpu): {"factor": 0.9 + gpu / 20, "swings": []} for gpu in range(6)},
            "links": [], "gpu_failures": []}
    assert _step_faults(many, 0.04) == "6 GPUs' compute x0.9 to x1.15 (some faster)"
    fewer = {**many, "slowed_gpus": {str(gpu): {"factor": 0.9 - gpu / 100, "swings": []} for gpu in range(6)}}
    assert _step_faults(fewer, 0.04) == "6 GPUs' compute x0.85 to x0.9 (faster)"


def test_a_communication_only_run_with_a_link_fault_prints_it(tmp_path, capsys):
    """A `workload:` run with a failed link prints it, as summary.json's `faults` holds it: four one-GPU hosts, one 256
    MiB all-reduce, leaf0.r0-spine0 down at 1 ms (its 7 routes through that link move)."""
    scenario = tmp_path / "ar.yaml"
    scenario.write_text(
        "cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1,\n"
        "          leaf_ports: 2, spines: 2, oversubscription: 2}\n"
        "workload:\n"
        "  - {name: ar, op: all_reduce, bytes: 256 MiB, group: all}\n"
        "faults: {step: {links: [{link: [leaf0.r0, spine0], at: 1 ms}]}}\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("dgx-h100-cluster (4 h100-sxm GPUs), makespan ")
    assert lines[1] == "step faults: leaf0.r0-spine0 down from 1 ms (7 routes rerouted)"


def test_every_kind_of_run_names_its_gpu_model(tmp_path, capsys):
    """Every header names the GPU model as the catalog does, for a model's step, a job and a trace replayed on an H200
    (`cluster.gpu_model: h200`, not 'trace on dgx-h100 (1 GPU)'), and summary.json (step, trace) and job_summary.json
    (job) carry it as `gpu_model`."""
    trace = tmp_path / "trace"
    assert main(["run", str(SCENARIOS / "trace-h200-step.yaml"), "--out", str(trace)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "trace on dgx-h100 (1 h200 GPU)"
    assert json.loads((trace / "summary.json").read_text())["gpu_model"] == "h200"
    job = tmp_path / "job"
    assert main(["run", str(DATA / "small-job.yaml"), "--out", str(job),
                 "--set", "cluster.gpu_model=b200"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("llama3-8b on dgx-h100 (8 b200 GPUs, TP8 ")
    assert json.loads((job / "job_summary.json").read_text())["gpu_model"] == "b200"
    assert json.loads((job / "summary.json").read_text())["gpu_model"] == "b200"
    assert main(["validate", str(SCENARIOS / "trace-h200-step.yaml")]) == 0
    assert capsys.readouterr().out.endswith("valid (1 h200 GPU on dgx-h100)\n")


def test_a_summary_only_run_imports_neither_pandas_nor_pyarrow(tmp_path):
    """`trainsim run` under `run.timeline: summary` writes summary.json and prints its report from the log's
    columns: importing pandas (0.2 s of CPU) to name the layout on the first line made the 405B 8k command 1.35x
    its simulate() against the 1.3x target (90d048d imported report/outputs.py for the degrees)."""
    scenario = SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"
    code = ("import sys\nfrom simulator.cli import main\n"
            f"code = main(['run', {str(scenario)!r}, '--out', {str(tmp_path / 'out')!r}, "
            "'--set', 'run.timeline=summary'])\n"
            "print(code, 'pandas' in sys.modules, 'pyarrow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "0 False False"


@pytest.mark.parametrize(("interval", "text"), [
    ({"mean": 695.3, "ci95_low": 0.0, "ci95_high": 6285.0}, "695.3 s (95%: 0 s to 6,285 s)"),
    ({"mean": 0.0021, "ci95_low": 0.0, "ci95_high": 0.0042}, "2.100 ms (95%: 0 s to 4.200 ms)"),
    ({"mean": 0.5, "ci95_low": 0.0, "ci95_high": 1.2}, "500.0 ms (95%: 0 s to 1.200 s)"),
    ({"mean": 0.0, "ci95_low": 0.0, "ci95_high": 0.0}, "0 s (95%: 0 s to 0 s)"),
])
def test_a_zero_duration_reads_0_s_in_a_range(interval, text):
    """Zero has no magnitude to pick a unit by, so every duration of zero reads `0 s`, one rule for every
    figure: a range's lower bound beside seconds (`per failure 695.3 s (95%: 0 s to 6,285 s)`, not `0 us`) and
    an all-zero range alike."""
    from simulator.console.report import _mean_ci, format_seconds, seconds_alike
    from simulator.units import format_duration

    assert _mean_ci(interval, seconds_alike) == text
    assert format_seconds(0.0) == format_duration(0.0) == "0 s"


def test_a_moe_steps_routing_skew_has_its_row():
    """The routing skew of mixtral-8x7b-ep8 adds 382.5 ms to its 1.798 s step, which summary.json's `moe` gives, and
    the console prints it in a row of its own; an even load prints none."""
    from rich.console import Console

    from simulator.console.report import training_table

    moe = {"hottest_rank_adds_s": 0.3825358988709303, "hottest_rank_load_over_mean": 1.5417}
    console = Console(width=200, record=True)
    console.print(training_table({"step_time_s": 1.798, "moe": moe}))
    console.print(training_table({"step_time_s": 1.798, "moe": {**moe, "hottest_rank_adds_s": 0.0}}))
    lines = [" ".join(line.split()) for line in console.export_text().splitlines()]
    assert "routing skew 382.5 ms (21.3%; hottest EP rank 1.54x the mean load)" in lines
    assert "routing skew none" in lines


def test_a_moe_step_at_ep_1_words_its_skew_as_uneven_expert_gemms():
    """At ep 1 one rank holds every expert and waits for no hotter rank, so its routing skew (37.1 ms of
    `mixtral-8x7b-ep8` at `parallelism.ep=1`) is its experts' uneven GEMM sizes, not 'hottest EP rank 1.00x'."""
    from rich.console import Console

    from simulator.console.report import training_table

    moe = {"ep": 1, "hottest_rank_adds_s": 0.0371, "hottest_rank_load_over_mean": 1.0,
           "hottest_expert_load_over_mean": 1.5362}
    console = Console(width=200, record=True)
    console.print(training_table({"step_time_s": 1.627, "moe": moe}))
    lines = [" ".join(line.split()) for line in console.export_text().splitlines()]
    assert ("routing skew 37.10 ms (2.3%; uneven expert GEMMs, no EP group: hottest expert 1.54x the mean load)"
            in lines)


def test_cp_ranks_of_uneven_causal_work_have_their_row():
    """Llama 3 8B over CP 4 without load balancing (16k tokens, 2 layers, DP 2 on one DGX H100): the attention
    the slowest CP rank adds beyond the mean, 6.908 ms of the 72.71 ms step, prints as its own row, not only
    as compute idle."""
    from rich.console import Console

    from simulator.console.report import training_table

    imbalance = {"cp": 4, "slowest_cp_rank": 3, "slowest_rank_adds_s": 0.006908, "slowest_rank_load_over_mean": 1.75}
    console = Console(width=200, record=True)
    console.print(training_table({"step_time_s": 0.07271, "cp_imbalance": imbalance}))
    lines = [" ".join(line.split()) for line in console.export_text().splitlines()]
    assert ("CP imbalance 6.908 ms (9.5%; CP rank 3 1.75x the mean attention, parallelism.cp_load_balance: true "
            "evens it)" in lines)


def test_a_parameter_server_runs_worker_wait_has_its_row():
    """The bundled parameter-server run's workers idle 229.3 ms of its 3.52 s in their iterations with no transfer
    of their own (`worker_wait`, 6.5%), which the console prints beside the exposed DP communication; under async
    (2.527 s) they wait about 31.6 ms in their iterations and 266.8 ms after their last one (`finished_early`), its own
    row, which a sync run, whose workers finish together, does not print; nor does a step without parameter
    servers print either row."""
    from rich.console import Console

    from simulator.console.report import training_table

    def rows(summary: dict, step: float = 3.5195) -> list[str]:
        console = Console(width=200, record=True)
        console.print(training_table({"step_time_s": step, **summary}))
        return [" ".join(line.split()) for line in console.export_text().splitlines()]

    ps = {"parameter_server": {"iterations": 6}}
    losses = {"bottleneck": {"loss_shares": {"exposed_dp_comm": 0.6509, "worker_wait": 0.065154,
                                             "finished_early": 1e-9}}}
    sync = rows({**losses, **ps})
    assert "worker wait 229.3 ms (6.5%; in its iterations, for slower workers or server updates)" in sync
    assert not any(line.startswith("idle after last iteration") for line in sync)
    asynchronous = {"bottleneck": {"loss_shares": {"exposed_dp_comm": 0.4865, "worker_wait": 0.0125,
                                                   "finished_early": 0.10557}}}
    lines = rows({**asynchronous, **ps}, 2.5272)
    assert any(line.startswith("worker wait 31.59 ms (1.2%;") for line in lines), lines
    assert ("idle after last iteration 266.8 ms (10.6%; waiting for the slowest worker, outside the throughput "
            "window)" in lines)
    assert not any(line.startswith(("worker wait", "idle after")) for line in rows(asynchronous))


def test_the_layout_search_tree_names_a_tiny_model_s_memory_in_mib():
    """The search's tree gives a tiny model's memory for DP over every GPU in MiB, not '(0.0 GiB)'."""
    from simulator.sweep.decision_tree import seed_tree_choice
    from simulator.sweep.layouts import Checked

    choice = seed_tree_choice(8, 8, 2, 8, True, lambda candidate: Checked(candidate, {}, None, 0.044))
    assert choice.steps[0].endswith("(45.1 MiB): DP over every GPU"), choice.steps


def test_the_step_table_keeps_trailing_zeros_so_its_times_read_alike():
    """Every time in the step's table keeps four significant digits, zeros included: a 227 ms step read '227 ms'
    above exposed communication of '103.7 ms', as if known to fewer digits."""
    import io

    from rich.console import Console

    from simulator.console.report import training_table

    summary = {"step_time_s": 0.227, "exposed_comm_s": {"dp": 0.1037, "tp": 0.02}, "comm_s": {"dp": 0.13, "tp": 0.02}}
    console = Console(file=io.StringIO(), width=300)
    console.print(training_table(summary))
    lines = [" ".join(line.split()) for line in console.file.getvalue().splitlines()]
    assert lines[0] == "step time 227.0 ms"
    assert lines[1] == "exposed communication tp 20.00 ms (8.8%), dp 103.7 ms (45.7%; 26.30 ms hidden)"
