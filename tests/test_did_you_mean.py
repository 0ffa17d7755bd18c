"""A misspelt key or value is refused in its one line with the allowed names close to it named first:
`errors.close_names` and the rendering of every `InputError` and argparse refusal that lists what is allowed."""

from __future__ import annotations

import pytest
from shared import SCENARIOS

from simulator.cli import main
from simulator.errors import ScenarioError, close_names

SCENARIO = SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"


@pytest.mark.parametrize(("given", "allowed", "meant"), [
    ("allreduce", "broadcast, reduce, all_reduce, reduce_scatter", ["all_reduce"]),
    ("h100", "a100-40gb, a100-80gb, h100-sxm, h200, b200, gb200", ["h100-sxm"]),
    ("a100", "a100-40gb, a100-80gb, h100-sxm, h200", ["a100-40gb", "a100-80gb"]),
    ("dgx-h10", "dgx-a100, dgx-h100, dgx-h100-cluster, or a path to a YAML file", ["dgx-h100", "dgx-a100"]),
    ("gpu", "gpus, nvlink_bandwidth, nvlink_latency, gpu_model, nvls", ["gpu_model"]),
    ("gpus", "gpu, hbm, gpu_sram, gpu_system_processor, nic", ["gpu"]),
    ("llama3", "llama3-8b, llama3-70b, llama3-405b, gpt3-175b", ["llama3-8b", "llama3-70b", "llama3-405b"]),
    ("megatron", "megatron-1.7b, megatron-3.6b, megatron-7.5b, megatron-18.4b, llama3-8b", []),
    ("LL128x", "simple, ll128, ll or auto", ["ll128"]),
    ("ful", "a comma list of none, selective, full", ["full"]),
    ("zero9", "a comma list of zero0, zero1, zero2, fsdp", ["zero0", "zero1", "zero2"]),
    ("zero9", "zero0, zero1, zero2, zero3, fsdp", []),
    ("1f1f", "gpipe, 1f1b, interleaved, zb-h1", ["1f1b"]),
    ("global_bacth", "seq_len, global_batch, micro_batch", ["global_batch"]),
    ("nodez", "nodes, node, nics_per_node", ["node", "nodes"]),
    ("mtbf2", "checkpoint-interval, memory-interval, mtbf", ["mtbf"]),
    ("tp", "cp, ep, pp", []),
    ("10min,600s", "distinct values, durations with units or whole steps, e.g. 5min,10min,30min,1h", []),
    ("ring", "ring, tree", []),
    ("banana", "ring, tree, auto", []),
])
def test_close_names_are_the_likely_meant_ones(given, allowed, meant):
    assert close_names(given, allowed) == meant


def test_an_error_names_the_close_name_before_the_allowed_list():
    error = ScenarioError("unknown collective 'allreduce'", field="op", allowed="broadcast, all_reduce, all_gather")
    assert str(error) == ("<input>: op: unknown collective 'allreduce' (did you mean all_reduce?) "
                          "(allowed: broadcast, all_reduce, all_gather)")
    said = ScenarioError("unknown unit 'gib' in '1 gib': units are case-sensitive (GiB)", field="size",
                         allowed="B, KB, MB, GB, KiB, MiB, GiB")
    assert "did you mean" not in str(said)
    far = ScenarioError("unknown collective 'shuffle'", field="op", allowed="broadcast, all_reduce, all_gather")
    assert "did you mean" not in str(far)


def test_a_misspelt_key_in_a_file_is_named(tmp_path, capsys):
    scenario = tmp_path / "misspelt.yaml"
    scenario.write_text(SCENARIO.read_text().replace("global_batch", "global_bacth"))
    assert main(["validate", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert ": training.global_bacth: unknown key 'global_bacth' (did you mean global_batch?) (allowed: seq_len, " in err


@pytest.mark.parametrize(("setting", "hint"), [
    ("cluster.gpu_model=h100", "'h100' is not supported (did you mean h100-sxm?) (allowed: a100-40gb"),
    ("cluster.topology=dgx-h10", "unknown topology 'dgx-h10' (did you mean dgx-h100, dgx-a100 or dgx-h200?) (allowed"),
    ("model.preset=llama3-7b", "unknown model preset 'llama3-7b' (did you mean llama3-70b or llama3-8b?) (allowed"),
    ("parallelism.pipeline.schedule=1f1f", "unknown schedule '1f1f' (did you mean 1f1b?) (allowed: gpipe"),
    ("parallelism.pipelin.schedule=1f1b", "unknown key 'pipelin' (did you mean pipeline?) (allowed: strategy"),
    ("cluster.gpu=h100-sxm", "unknown override 'gpu' for topology kind 'nvswitch_node' (did you mean gpu_model?)"),
    ("faults.components.gpus.mtbf=1h", "unknown component class 'gpus'; a class of your own needs a unit "
     "(did you mean gpu?)"),
    ("model.preset=llama3", "unknown model preset 'llama3' (did you mean llama3-8b, llama3-70b or llama3-405b?)"),
    ("collectives.protocol=LL128x", "'LL128x' is not a valid choice (did you mean ll128?) (allowed: simple"),
])
def test_a_misspelt_set_is_named(setting, hint, capsys):
    assert main(["validate", str(SCENARIO), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--set {setting}: {hint}" in err


@pytest.mark.parametrize(("arguments", "hint"), [
    (["collective", "--topology", "dgx-h100", "--op", "allreduce"],
     "--op: unknown collective 'allreduce' (did you mean all_reduce?) (allowed: broadcast"),
    (["collective", "--topology", "dgx-h100", "--efficiency", "calibrate"],
     "--efficiency: invalid choice 'calibrate' (did you mean calibrated?) (allowed: "),
    (["run", str(SCENARIO), "--out", "x", "--wrokers", "2"],
     "unrecognized arguments: --wrokers 2 (did you mean --workers?) (allowed: --help"),
    (["plt", "gantt"], "command: invalid choice 'plt' (did you mean plot?) (allowed: run"),
    (["search", str(SCENARIO), "--recompute", "none,ful"],
     "--recompute: 'ful' is not a choice (did you mean full?) (allowed: a comma list of none, selective, full)"),
    (["run", "llama3-8b-dgx-h100-dp9", "--out", "x"], "error: llama3-8b-dgx-h100-dp9: no such file, and no bundled "
     "scenario named 'llama3-8b-dgx-h100-dp9' (did you mean llama3-8b-dgx-h100-dp8 or llama3-8b-dgx-h100-zero3?)"),
])
def test_a_misspelt_flag_or_flag_value_is_named(arguments, hint, capsys):
    assert main(arguments) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and hint in err


def test_a_case_cut_short_names_each_case_it_begins(capsys):
    folder = SCENARIOS / "published"
    assert main(["validate-published", "--folder", str(folder), "--case", "llama3-405b"]) == 2
    assert ("no case 'llama3-405b' in " f"{folder} (did you mean llama3-405b-16384-gpus, llama3-405b-8192-gpus or "
            "llama3-405b-long-context?) (allowed: ") in capsys.readouterr().err
