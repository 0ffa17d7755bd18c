"""A named list of bad inputs, each run through the `trainsim` entry point: the answer is one line on stderr,
the exit status says input (2) or runtime (1), nothing lands on stdout, no traceback, and no file is written.

The list holds the reported cases (unwritable or empty --out, plots into a folder that cannot be written or
with an unknown extension, deeply nested YAML, an alias bomb, a non-UTF-8 schedule CSV, `tp: true`, a self-loop
link, an override that sets a bad topology value), and the common mistakes around them.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from shared import REPO

from simulator.cli import main
from simulator.console.paths import output_folder
from simulator.errors import InputError
from simulator.report.run_folder import RUN_FOLDER

COMM = "cluster: {topology: dgx-h100}\nworkload:\n  - {op: all_reduce, bytes: 64 MiB}\n"
SYNTHETIC = ("cluster: {topology: dgx-h100}\nmodel: {synthetic: {stages: 2, forward: 1 ms, backward: 2 ms}}\n"
             "training: {microbatches: 2}\n")
CUSTOM = SYNTHETIC + "parallelism: {pp: 2, dp: 4, pipeline: {schedule: custom, table: TMP/table.csv}}\n"
PRESET = ("cluster: {topology: dgx-h100}\nmodel: {preset: llama3-8b, layers: 4}\n"
          "training: {seq_len: 1024, global_batch: 8}\n")
GRAPH = ("kind: graph\nnodes:\n  - {name: g0, kind: gpu}\n  - {name: g1, kind: gpu}\nlinks:\n"
         "  - {a: g0, b: g1, bandwidth: 100 GB/s, latency: 1 us, class: nvlink}\n")
HSDP_3_HOSTS = ("cluster: {topology: dgx-h100-cluster, nodes: 3}\nmodel: {preset: llama3-8b, layers: 6}\n"
                "training: {seq_len: 1024, global_batch: 24}\n")
"""Three DGX H100 with pp 3: GPU 0's host holds 3 of 8 DP ranks (dp 8: a traceback before the check), or DP
ranks 0 and 6 of [0, 6, 12, 18] (tp 2, dp 4) while 12 and 18 sit on two other hosts (this one simulated before the
check, with a shard group across hosts; hybrid_shard means sharding inside a domain, so it is refused on purpose)."""
LARGE_MOE = ("cluster: {topology: dgx-h100-cluster, nodes: 128}\nmodel: {preset: deepseek-v3-style, layers: 62}\n"
             "training: {seq_len: 4096, global_batch: 1024, recompute: full}\nparallelism:\n  pp: 16\n"
             "  order: [tp, cp, dp, pp]\n  pipeline: {first_last_fewer_layers: true}\n")
"""The DeepSeek-V3-style step on 1,024 GPUs (scenarios/deepseek-v3-style-1024-gpus.yaml) less its EP: with an EP
across hosts its run is estimated beyond the scale limits, which were checked before the layout's fit to the
model."""
UNFOLDING_JOB = "run: {horizon: 1 d}\nfaults: {components: {leaf_switch: {mtbf: 100 d, repair: 4 h}}}\n"
"""A day's job whose leaf-switch faults each unfold its step."""
SMALL_MOE = ("cluster: {topology: dgx-h100-cluster, nodes: 2}\nmodel: {layers: 8, hidden: 4096, heads: 32, moe: "
             "{experts: 64, top_k: 2, expert_ffn_hidden: 14336}}\ntraining: {seq_len: 1024, global_batch: 64}\n")
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))
PS = ("cluster: {topology: ethernet-100g, nodes: 3}\nmodel: {layers: 2, hidden: 256, heads: 4}\n"
      "training: {seq_len: 128, microbatches: 1}\nparallelism: {strategy: parameter_server}\n")
RUN = ["run", "TMP/s.yaml", "--out", "TMP/out"]
VALIDATE = ["validate", "TMP/s.yaml"]
SEARCH = ["search", "TMP/s.yaml", "--out", "TMP/out", "--executor", "serial"]


def scenario(text: str) -> dict[str, str]:
    return {"s.yaml": text}


# name: (files to write, command line, exit status, words the one line must hold)
CASES: dict[str, tuple[dict[str, str | bytes], list[str], int, str]] = {
    # scenario text
    "yaml-syntax": (scenario("cluster: {topology: dgx-h100\n"), RUN, 2, "s.yaml:2: YAML syntax error"),
    "tab-indent": (scenario("cluster:\n\ttopology: dgx-h100\n"), RUN, 2,
                   "s.yaml:2: YAML syntax error at column 1: found character '\\t' that cannot start any token "
                   "(allowed: the keys of one section indented alike, deeper than the key above them (spaces, "
                   "not tabs))"),
    "misindented-key": (scenario("cluster:\n  topology: dgx-h100\n model: {preset: llama3-8b}\n"), RUN, 2,
                        "s.yaml:3: YAML syntax error at column 2: expected <block end>, but found '<block mapping "
                        "start>' (allowed: the keys of one section indented alike"),
    "key-under-a-value": (scenario("cluster:\n  topology: dgx-h100\n    nodes: 2\n"), RUN, 2,
                          "s.yaml:3: YAML syntax error at column 10: mapping values are not allowed here (allowed: "
                          "a key at its section's indentation (not deeper, under a key that has a value)"),
    "complex-key": (scenario("? [a, b]\n: 1\n" + COMM), RUN, 2, "a key must be a plain value"),
    "duplicate-key": (scenario(COMM + "cluster: {topology: dgx-h100}\n"), RUN, 2, "key given twice"),
    "empty-file": (scenario(""), RUN, 2, "a scenario must be a mapping"),
    "list-file": (scenario("- 1\n- 2\n"), RUN, 2, "a scenario must be a mapping"),
    "not-utf8": ({"s.yaml": b"cluster: {topology: dgx-h100}\n# caf\xe9\n"}, RUN, 2, "s.yaml:2: byte 0xe9 is not UTF-8"),
    "missing-file": ({}, RUN, 2, "cannot read file: No such file or directory (allowed: a readable file)"),
    "scenario-is-folder": ({"s.yaml/x": "1"}, RUN, 2, "cannot read file: Is a directory (allowed: a readable file)"),
    # a required field left out says what it takes, as a wrong value there does
    "missing-cluster": (scenario("workload:\n  - {op: all_reduce, bytes: 64 MiB}\n"), RUN, 2,
                        "s.yaml:1: cluster: required field is missing (allowed: a section such as {topology: "),
    "missing-topology": (scenario("cluster: {nodes: 2}\nworkload:\n  - {op: all_reduce, bytes: 64 MiB}\n"), RUN, 2,
                         "s.yaml:1: cluster.topology: required field is missing (allowed: a bundled topology's "
                         "name"),
    "missing-bytes": (scenario("cluster: {topology: dgx-h100}\nworkload:\n  - {op: all_reduce}\n"), RUN, 2,
                      "s.yaml:3: workload[0].bytes: required field is missing (allowed: B, KB, MB, GB, TB, PB, KiB, "),
    "missing-op": (scenario("cluster: {topology: dgx-h100}\nworkload:\n  - {bytes: 1 MiB}\n"), RUN, 2,
                   "workload[0].op: required field is missing (allowed: broadcast, reduce, all_reduce, "),
    "model-without-layers": (scenario("cluster: {topology: dgx-h100}\nmodel: {hidden: 1024, heads: 8}\n"), RUN, 2,
                             "s.yaml:2: model: a model needs a preset, or at least layers, hidden and heads; layers "
                             "missing (allowed: {preset: llama3-8b}, {layers: 32, hidden: 4096, heads: 32} or "
                             "{synthetic: {stages, forward, backward}})"),
    "model-and-synthetic": (scenario("cluster: {topology: dgx-h100}\nmodel: {preset: llama3-8b, synthetic: "
                                     "{stages: 2, forward: 1 ms, backward: 1 ms}}\n"), RUN, 2,
                            "model: give either synthetic costs or a model (preset/dimensions/moe), not both "
                            "(allowed: {synthetic: {...}} alone, or a preset and/or dimensions)"),
    "missing-backward": (scenario("cluster: {topology: dgx-h100}\nmodel: {synthetic: {stages: 2, forward: 1 ms}}\n"
                                  "training: {microbatches: 2}\n"), RUN, 2,
                         "model.synthetic.backward: required field is missing (allowed: ns, us, ms, s, min, h, d)"),
    "deep-nesting": (scenario("cluster: " + "[" * 5000 + "]" * 5000 + "\n"), RUN, 2, "nested deeper than 64"),
    "deep-mapping": (scenario("run:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 100))), RUN, 2,
                     "nested deeper than 64"),
    "alias-bomb": (scenario(ALIAS_BOMB), RUN, 2, "values once aliases are expanded"),
    "recursive-alias": (scenario("cluster: &c {topology: *c}\n"), RUN, 2, "levels through aliases"),
    "unknown-section": (scenario(COMM + "netwrok: {model: flow}\n"), RUN, 2, "unknown key 'netwrok'"),
    "nothing-to-run": (scenario("cluster: {topology: dgx-h100}\n"), RUN, 2, "nothing to simulate"),
    "model-and-workload": (scenario(COMM + "model: {preset: llama3-8b}\n"), RUN, 2,
                           "s.yaml:4: model: a workload list already says what to simulate"),
    "model-and-trace": (scenario("cluster: {topology: dgx-h100}\nworkload:\n  trace: rank*.json\n"
                                 "model: {preset: llama3-8b}\n"), RUN, 2,
                        "s.yaml:4: model: a replayed trace (workload.trace) brings its own step; model describes a "
                        "modelled one (allowed: leave model out"),
    # strict types
    "tp-true": (scenario(PRESET + "parallelism: {tp: true}\n"), RUN, 2,
                "s.yaml:4: parallelism.tp: expected a whole number, got true"),
    "tp-string": (scenario(PRESET + "parallelism: {tp: '2'}\n"), RUN, 2, "parallelism.tp: expected a whole number"),
    "tp-float": (scenario(PRESET + "parallelism: {tp: 2.0}\n"), RUN, 2, "parallelism.tp: expected a whole number"),
    "layers-true": (scenario(PRESET.replace("layers: 4", "layers: true")), RUN, 2, "model.layers: expected a whole"),
    "microbatches-false": (scenario(SYNTHETIC.replace("microbatches: 2", "microbatches: false")), RUN, 2,
                           "training.microbatches: expected a whole number"),
    "seed-true": (scenario(COMM + "run: {seed: true}\n"), RUN, 2, "run.seed: expected a whole number"),
    "seed-negative": (scenario(COMM + "run: {seed: -1}\n"), RUN, 2,
                      "s.yaml:4: run.seed: -1 is below 0 (allowed: a value >= 0)"),

    # a seed or a count beyond 64 bits ran the whole step and failed writing summary.json with a traceback;
    # an infinite compute_scale, a traceback while binning link loads
    "seed-beyond-64-bits": (scenario(COMM + "run: {seed: 100000000000000000000000}\n"), RUN, 2,
                            "s.yaml:4: run.seed: 100000000000000000000000 is beyond 64-bit integers (allowed: a "
                            "whole number from -2^63 to 2^63 - 1)"),
    "override-beyond-64-bits": (scenario(COMM), RUN + ["--set", "cluster.gpus=-100000000000000000000000"], 2,
                                "command line: trainsim run: --set cluster.gpus=-100000000000000000000000: "
                                "-100000000000000000000000 is beyond 64-bit integers"),
    "infinite-factor": (scenario("cluster: {topology: dgx-h100}\nworkload: {trace: t.json, compute_scale: .inf}\n"),
                        RUN, 2, "s.yaml:2: workload.compute_scale: expected a finite number, got inf"),
    "nan-efficiency": (scenario(COMM + "network: {efficiency: {nvlink: .nan}}\n"), RUN, 2,
                       "s.yaml:4: network.efficiency.nvlink: expected a finite number, got nan"),
    # a synthetic pass or a fault time of 1e300 s ran, its trace.json clock overflowing
    "step-duration-beyond-a-day": (scenario(SYNTHETIC.replace("forward: 1 ms", "forward: 1e300 s")), RUN, 2,
                                   "s.yaml:2: model.synthetic.forward: duration '1e300 s' is more than a day, longer "
                                   "than any training step (allowed: a duration up to 1 d, e.g. 3 ms)"),
    # an explicit pp: 1 was taken for "left out" and the run had 2 stages
    "synthetic-explicit-pp-one": (scenario(SYNTHETIC + "parallelism: {pp: 1, dp: 4}\n"), VALIDATE, 2,
                                  "s.yaml:4: parallelism.pp: pp 1 differs from the synthetic model's 2 stages "
                                  "(allowed: 2 (or leave it out))"),
    "fold-one": (scenario(COMM + "run: {fold: 1}\n"), RUN, 2, "run.fold: expected true or false"),
    # YAML 1.1's yes/no/on/off were read as booleans, so `fold: yes` ran though the types are strict
    "fold-yes": (scenario(COMM + "run: {fold: yes}\n"), RUN, 2,
                 "s.yaml:4: run.fold: expected true or false, got 'yes' (allowed: true, false)"),
    "fold-off-override": (scenario(COMM), RUN + ["--set", "run.fold=off"], 2,
                          "command line: trainsim run: --set run.fold=off: expected true or false, got 'off' "
                          "(allowed: true, false)"),
    # messages echoed Python's True and None where the user typed YAML's true and null
    "tp-null-override": (scenario(COMM), RUN + ["--set", "parallelism.tp=null"], 2,
                         "error: command line: trainsim run: --set parallelism.tp=null: expected a whole number, got "
                         "null (allowed: an integer >= 1, 1 where not given)\n"),
    "cluster-null-override": (scenario(COMM), RUN + ["--set", "cluster=null"], 2,
                              "error: command line: trainsim run: --set cluster=null: expected a mapping, got null "
                              "(allowed: a YAML mapping such as {key: value})\n"),
    "repeat-false-override": (scenario(COMM), RUN + ["--set", "workload[0].repeat=false"], 2,
                              "error: command line: trainsim run: --set workload[0].repeat=false: expected a whole "
                              "number, got false (allowed: an integer from 1 to 100,000, 1 where not "
                              "given)\n"),
    "bytes-null": (scenario(COMM.replace("64 MiB", "null")), RUN, 2,
                   "s.yaml:3: workload[0].bytes: expected a size with a unit, got null (allowed: B, KB, MB, GB, TB, "
                   "PB, KiB, MiB, GiB, TiB, PiB)\n"),
    "channels-true": (scenario(COMM + "collectives: {channels: true}\n"), RUN, 2, "collectives.channels: expected"),
    "repeat-true": (scenario(COMM.replace("64 MiB}", "64 MiB, repeat: true}")), RUN, 2,
                    "workload[0].repeat: expected a whole number"),
    "root-string": (scenario(COMM.replace("64 MiB}", "64 MiB, op: broadcast, root: '1'}").replace(
        "op: all_reduce, ", "")), RUN, 2, "workload[0].root: expected a whole number"),
    "nodes-true": (scenario(COMM.replace("dgx-h100}", "dgx-h100-cluster, nodes: true}")), RUN, 2,
                   "cluster.nodes: expected a whole number"),
    # values
    "negative-dp": (scenario(PRESET + "parallelism: {dp: -1}\n"), RUN, 2, "parallelism.dp"),
    "zero-four": (scenario(PRESET + "parallelism: {zero: 4}\n"), RUN, 2, "parallelism.zero"),
    "zero-and-fsdp": (scenario(PRESET + "parallelism: {zero: 1, fsdp: full_shard}\n"), RUN, 2,
                      "s.yaml:4: parallelism.fsdp: give zero or fsdp, not both"),
    "reduce-every-microbatch-without-sharded-gradients": (
        scenario(PRESET + "parallelism:\n  zero: 1\n  ddp: {reduce_every_microbatch: true}\n"), RUN, 2,
        "s.yaml:6: parallelism.ddp.reduce_every_microbatch: applies to sharded gradients (ZeRO-2 and 3), not ZeRO "
        "stage 1"),
    "deepspeed-zero3-without-per-microbatch-sync": (
        scenario(PRESET + "parallelism:\n  zero: 3\n  ddp: {reduce_every_microbatch: false}\n"), RUN, 2,
        "s.yaml:6: parallelism.ddp.reduce_every_microbatch: DeepSpeed ZeRO-3 (zero: 3) reduce-scatters every "
        "micro-batch's gradients"),
    "per-microbatch-sync-under-torch-pipelining": (
        scenario(PRESET + "parallelism:\n  pp: 2\n  fsdp: full_shard\n  ddp: {reduce_every_microbatch: true}\n"),
        RUN, 2, "s.yaml:7: parallelism.ddp.reduce_every_microbatch: torch.distributed.pipelining turns PyTorch "
        "FSDP's gradient sync off on every backward"),
    "fsdp-with-fused-grad-accumulation": (
        scenario("cluster: {topology: dgx-h100}\nmodel: {preset: llama3-8b, layers: 4}\ntraining:\n  seq_len: 1024\n"
                 "  global_batch: 8\n  grad_accumulation_fusion: true\nparallelism: {fsdp: full_shard}\n"), RUN, 2,
        "s.yaml:6: training.grad_accumulation_fusion: PyTorch FSDP (parallelism.fsdp: full_shard) has no gradient "
        "accumulation fused into the weight-gradient GEMMs"),
    "pipelined-fsdp-beyond-three-chunks": (
        scenario(PRESET + "parallelism:\n  pp: 2\n  fsdp: full_shard\n  pipeline: {schedule: interleaved, "
                 "virtual_stages: 4}\n"), RUN, 2, "s.yaml:7: parallelism.pipeline.virtual_stages: 4 chunks per "
        "rank: PyTorch FSDP under torch.distributed.pipelining keeps at most 3 stages unsharded"),
    "pipelined-fsdp-synthetic-depth": (
        scenario(SYNTHETIC + "parallelism:\n  fsdp: full_shard\n  ddp: {reduce_every_microbatch: true}\n"), RUN, 2,
        "s.yaml:6: parallelism.ddp.reduce_every_microbatch: torch.distributed.pipelining turns PyTorch FSDP's "
        "gradient sync off"),
    # a synthetic model has fixed stage costs and no experts: ep and a moe section were silently ignored
    "synthetic-with-ep": (scenario(SYNTHETIC + "parallelism: {pp: 2, ep: 2}\n"), RUN, 2,
                          "s.yaml:4: parallelism.ep: ep 2 needs a model with experts; a synthetic model has none"),
    # nor layers, heads or a sequence: tp and cp took GPUs and changed nothing (the same step time as tp 1)
    # a layout the model cannot take was refused as too large to simulate, with advice to shrink the batch, where
    # the estimate ran first: EP 512 over 256 experts, EP 128 over DP 64, a layer split, heads, a sequence shard
    "ep-beyond-experts-on-a-large-cluster": (scenario(LARGE_MOE + "  ep: 512\n"), RUN, 2,
                                             "s.yaml:8: parallelism.ep: ep 512 does not divide the 256 experts"),
    # a job whose states unfold, and a study of it, estimated their unfolded steps before the layout's check
    "ep-beyond-experts-in-an-unfolding-job": (scenario(LARGE_MOE + "  ep: 512\n" + UNFOLDING_JOB), RUN, 2,
                                              "s.yaml:8: parallelism.ep: ep 512 does not divide the 256 experts"),
    "ep-beyond-experts-in-an-unfolded-job": (
        scenario(LARGE_MOE + "  ep: 512\nrun: {horizon: 1 d, fold: false}\n"), RUN, 2,
        "s.yaml:8: parallelism.ep: ep 512 does not divide the 256 experts"),
    "ep-beyond-experts-in-an-unfolding-study": (
        scenario(LARGE_MOE + "  ep: 512\n" + UNFOLDING_JOB), ["study", "mtbf", "TMP/s.yaml", "--out", "TMP/st"], 2,
        "s.yaml:8: parallelism.ep: ep 512 does not divide the 256 experts"),
    "ep-beyond-dp-on-a-large-cluster": (scenario(LARGE_MOE + "  ep: 128\n"), VALIDATE, 2,
                                        "s.yaml:8: parallelism.ep: ep 128 does not divide dp x cp = 64 x 1 = 64"),
    "layers-beyond-stages-on-a-large-cluster": (
        scenario(LARGE_MOE.replace("layers: 62", "layers: 61") + "  ep: 64\n"), RUN, 2,
        "s.yaml:5: parallelism.pp: 63 (61 layers + 2 with first_last_fewer_layers) do not split evenly over pp x "
        "virtual_stages = 16 stages"),
    # an ep that does not divide the experts: the search pruned each candidate as 'ep does not divide dp x cp'
    # and exited 1 with its files written
    "search-ep-beyond-experts": (scenario(SMALL_MOE), ["search", "TMP/s.yaml", "--out", "TMP/out", "--ep", "4,7"], 2,
                                 "error: command line: trainsim search: --ep: ep 7 does not divide the 64 experts "
                                 "(allowed: divisors of 64)"),
    "search-scenario-ep-beyond-experts": (scenario(SMALL_MOE + "parallelism: {ep: 5}\n"), SEARCH, 2,
                                          "s.yaml:4: parallelism.ep: ep 5 does not divide the 64 experts (allowed: "
                                          "divisors of 64; or --ep with them)"),
    "synthetic-with-tp": (scenario(SYNTHETIC + "parallelism: {pp: 2, tp: 2, dp: 2}\n"), RUN, 2,
                          "s.yaml:4: parallelism.tp: tp 2 has no effect on a synthetic model: its stage times are "
                          "given whole, with no layers' matrices to split (allowed: 1, or a model with dimensions or "
                          "a preset)"),
    "synthetic-with-cp": (scenario(SYNTHETIC + "parallelism:\n  pp: 2\n  cp: 4\n  dp: 1\n"), RUN, 2,
                          "s.yaml:6: parallelism.cp: cp 4 has no effect on a synthetic model"),
    "zipf-without-skew": (scenario(SMALL_MOE.replace("14336}", "14336, routing: {balance: zipf, skew: 0}}")), RUN, 2,
                          "s.yaml:2: model.moe.routing.skew: 0 is not above 0 (allowed: a value > 0, or balance: "
                          "uniform for routing without skew)"),
    "uniform-with-skew-0": (scenario(SMALL_MOE.replace("14336}", "14336, routing: {balance: uniform, skew: 0}}")), RUN,
                            2, "s.yaml:2: model.moe.routing.skew: 0 is not above 0 (allowed: a value > 0, balance "
                            "uniform ignores the skew: leave it out)"),
    "synthetic-with-moe": (scenario(SYNTHETIC.replace("2 ms}}", "2 ms}, moe: {experts: 8}}")), RUN, 2,
                           "s.yaml:2: model: give either synthetic costs or a model (preset/dimensions/moe)"),
    "hsdp-shard-does-not-divide": (scenario(HSDP_3_HOSTS + "parallelism: {pp: 3, dp: 8, fsdp: hybrid_shard}\n"),
                                   RUN, 2, "s.yaml:4: parallelism.fsdp: hybrid_shard shards over GPU 0's 3 of the 8 "
                                   "DP x CP ranks in its NVLink domain, which does not divide them into equal shard "
                                   "groups (DP x CP group [0, 3, 6, 9, 12, 15, 18, 21]: 3 in domain 0, 3 in domain 1, "
                                   "2 in domain 2)"),
    "hsdp-shard-spans-hosts": (
        scenario(HSDP_3_HOSTS + "parallelism: {tp: 2, pp: 3, dp: 4, fsdp: hybrid_shard}\n"), RUN, 2,
        "s.yaml:4: parallelism.fsdp: hybrid_shard's shard group [12, 18] spans NVLink domains (DP x CP group "
        "[0, 6, 12, 18]: 2 in domain 0, 1 in domain 1, 1 in domain 2)"),
    "bad-precision": (scenario(PRESET.replace("seq_len", "precision: fp4, seq_len")), RUN, 2,
                      "'fp4' is not a valid choice"),
    "bad-timeline": (scenario(COMM + "run: {timeline: some}\n"), RUN, 2, "'some' is not a valid choice"),
    "unknown-schedule": (scenario(SYNTHETIC + "parallelism: {pp: 2, pipeline: {schedule: 2f2b}}\n"), RUN, 2,
                         "parallelism.pipeline.schedule"),
    "bare-number-bytes": (scenario(COMM.replace("64 MiB", "1024")), RUN, 2, "has no unit"),
    "negative-bytes": (scenario(COMM.replace("64 MiB", "-5 GB")), RUN, 2, "workload[0].bytes"),
    "nan-bytes": (scenario(COMM.replace("64 MiB", "nan GB")), RUN, 2, "workload[0].bytes"),
    "gpu-out-of-range": (scenario(COMM.replace("64 MiB}", "64 MiB, group: [0, 9]}")), RUN, 2, "do not exist"),
    "send-to-self": (scenario(COMM.replace("all_reduce, bytes: 64 MiB}", "send_recv, bytes: 1 MiB, src: 1, dst: 1}")),
                     RUN, 2, "two different GPUs"),
    "send-recv-with-another-group": (scenario(COMM.replace("all_reduce, bytes: 64 MiB}",
                                                           "send_recv, bytes: 1 GiB, group: [0, 4], src: 0, dst: 5}")),
                                     RUN, 2, "s.yaml:3: workload[0].group: group [0, 4] contradicts src 0 and dst 5: "
                                     "a send_recv's group is the two GPUs it sends between (allowed: all, or "
                                     "[0, 5])\n"),
    "send-recv-with-group-alone": (scenario(COMM.replace("all_reduce, bytes: 64 MiB}",
                                                         "send_recv, bytes: 1 GiB, group: [0, 4]}")),
                                   RUN, 2, "s.yaml:3: workload[0].src: send_recv needs src, a GPU index (allowed: src "
                                   "and dst GPU indices"),
    "send-recv-without-dst": (scenario(COMM.replace("all_reduce, bytes: 64 MiB}", "send_recv, bytes: 1 GiB, src: 0}")),
                              RUN, 2, "s.yaml:3: workload[0].dst: send_recv needs dst, a GPU index (allowed: src and "
                              "dst GPU indices"),
    "dst-on-a-collective": (scenario(COMM.replace("64 MiB}", "64 MiB, dst: 3}")), RUN, 2,
                            "s.yaml:3: workload[0].dst: dst applies to send_recv only, not all_reduce (allowed: "
                            "group: all, a list of GPU indices or a range A-B for all_reduce)\n"),
    "after-unknown": (scenario(COMM.replace("64 MiB}", "64 MiB, after: [nope]}")), RUN, 2, "not an earlier item"),
    "efficiency-above-one": (scenario(COMM + "network: {efficiency: {nvlink: 2}}\n"), RUN, 2,
                             "network.efficiency.nvlink: 2 is above 1 (allowed: a value <= 1)"),  # was '1.0'
    "size-override-in-e-notation": (scenario(COMM), RUN + ["--set", "workload[0].bytes=1e12"], 2,
                                    "--set workload[0].bytes=1e12: size 1e12 has no unit"),  # was '1000000000000.0'
    "rate-multiplier-zero": (scenario(COMM), RUN + ["--set", "faults.rate_multiplier=0"], 2,
                             "--set faults.rate_multiplier=0: 0 is not above 0 (allowed: a value > 0)\n"),  # was '0.0'
    "unknown-preset": (scenario(PRESET.replace("llama3-8b", "llama9")), RUN, 2, "llama9"),
    "tp-not-dividing-heads": (scenario(PRESET.replace("layers: 4", "layers: 4, hidden: 1536, heads: 12, kv_heads: 12")
                                       + "parallelism: {tp: 8, dp: 1}\n"), RUN, 2, "does not divide 12 attention"),
    "global-batch-not-multiple": (scenario(PRESET.replace("global_batch: 8", "global_batch: 9")), RUN, 2,
                                  "not a multiple"),
    "ps-no-server-hosts": (scenario(PS + "ps: {servers: 0}\n"), RUN, 2,
                           "s.yaml:5: ps.servers: 0 server hosts: a parameter-server run needs at least one"),
    "ps-no-servers": (scenario(PS + "ps: {mode: sync}\n"), RUN, 2,
                      "s.yaml:5: ps.servers: required field is missing (allowed: a count of server hosts such as 2 "
                      "(the cluster's last hosts), or a list of host indices such as [0, 3])"),
    "ps-no-section": (scenario(PS), RUN, 2, "s.yaml:4: parallelism.strategy: parameter_server needs a ps: section"),
    "ps-more-servers-than-hosts": (scenario(PS + "ps: {servers: 4}\n"), RUN, 2,
                                   "ps.servers: 4 servers: more servers than the cluster's 3 hosts"),
    "ps-staleness-without-ssp": (scenario(PS + "ps: {servers: 1, mode: async, staleness: 2}\n"), RUN, 2,
                                 "ps.staleness: staleness applies to mode ssp, not async"),
    "ps-negative-staleness": (scenario(PS + "ps: {servers: 1, mode: ssp, staleness: -1}\n"), RUN, 2,
                              "ps.staleness: staleness -1 is negative"),
    "unknown-topology": (scenario(COMM.replace("dgx-h100", "dgx-h900")), RUN, 2, "unknown topology 'dgx-h900'"),
    # schedule tables
    "custom-without-table": (scenario(SYNTHETIC + "parallelism: {pp: 2, pipeline: {schedule: custom}}\n"), RUN, 2,
                             "needs a CSV action table"),
    "csv-not-utf8": ({"s.yaml": CUSTOM, "table.csv": b"F0,F1,BW0,BW1\nF0,\xff\n"}, RUN, 2,
                     "table.csv:2: parallelism.pipeline.table: byte 0xff is not UTF-8"),
    "csv-bad-cell": ({"s.yaml": CUSTOM, "table.csv": "F0,F1,BW0,BW1\nF0,X1\n"}, RUN, 2, "table.csv:2:"),
    "csv-missing-forward": ({"s.yaml": CUSTOM, "table.csv": "# p = 2\nF0,F1,BW0,BW1\n\nF0,BW0,BW1\n"}, RUN, 2,
                            "table.csv:4: parallelism.pipeline.table: rank 1 never runs F1"),
    "csv-missing-file": (scenario(CUSTOM), RUN, 2, "s.yaml:4: parallelism.pipeline.table: cannot read "),
    "csv-more-ranks-than-pp": ({"s.yaml": CUSTOM, "table.csv": "F0,F1,BW0,BW1\n" * 3}, RUN, 2,
                               "s.yaml:4: parallelism.pipeline.table: the schedule table "),
    "csv-other-v": ({"s.yaml": CUSTOM, "table.csv": "F0,F1,F0c1,F1c1,BW0c1,BW1c1,BW0,BW1\n" * 2}, RUN, 2,
                    "s.yaml:4: parallelism.pipeline.table: the schedule table "),
    "csv-deadlock": ({"s.yaml": CUSTOM, "table.csv": "# p = 2\nF0,BW0,F1,BW1\nF1,BW1,F0,BW0\n"}, RUN, 2,
                     "table.csv:2: parallelism.pipeline.table: the schedule cannot run: pipeline schedule deadlocks "
                     "in the loop placement: no action can start (rank 0 at BW0; rank 1 at F1)"),
    "csv-stray-chunk": ({"s.yaml": CUSTOM, "table.csv": "F0,F1,BW0,BW1\nF0,B0,F1,B1,W0,W1c5\n"}, RUN, 2,
                        "table.csv:2: parallelism.pipeline.table: rank 1 runs no action of chunk 1, though W1c5 on "
                        "line 2 makes the table 6 chunks per rank (its largest chunk + 1)"),
    "csv-stray-microbatch": ({"s.yaml": CUSTOM, "table.csv": "F0,F1,BW0,BW1\nF0,BW0,F1,BW1,F5\n"}, RUN, 2,
                             "table.csv:2: parallelism.pipeline.table: rank 1 runs no action of micro-batch 2, "
                             "though F5 on line 2 makes the table 6 micro-batches"),
    "csv-late-placement": ({"s.yaml": CUSTOM, "table.csv": "F0,F1,BW0,BW1\nplacement,v\nF0,F1,BW0,BW1\n"}, RUN,
                           2, "table.csv:2: parallelism.pipeline.table: the placement row must be the table's first "
                           "row; rank 0's row on line 1 comes before it (allowed: one row placement,loop or "
                           "placement,v, before the ranks' rows)"),
    "csv-second-placement": ({"s.yaml": CUSTOM, "table.csv": "placement,v\nplacement,loop\nF0,F1,BW0,BW1\n"
                              "F0,F1,BW0,BW1\n"}, RUN, 2, "table.csv:2: parallelism.pipeline.table: the placement "
                             "row must be the table's first row; one on line 1 comes before it"),
    # topology files and overrides
    "self-loop-link": ({"t.yaml": GRAPH.replace("b: g1", "b: g0"), "s.yaml": COMM.replace("dgx-h100", "TMP/t.yaml")},
                       RUN, 2, "t.yaml:6: links[0].b: link from 'g0' to itself"),
    "negative-latency-in-file": ({"t.yaml": "kind: nvswitch_node\ngpus: 8\nnvlink_latency: -1 us\n",
                                  "s.yaml": COMM.replace("dgx-h100", "TMP/t.yaml")}, RUN, 2,
                                 "t.yaml:3: nvlink_latency: '-1 us' is negative"),
    "unknown-topology-kind": ({"t.yaml": "kind: torus\n", "s.yaml": COMM.replace("dgx-h100", "TMP/t.yaml")}, RUN, 2,
                              "t.yaml:1: kind: unknown topology kind 'torus'"),
    "unknown-nvls-in-file": ({"t.yaml": "kind: nvswitch_node\ngpus: 8\nnvls: nvswitch4\n",
                              "s.yaml": COMM.replace("dgx-h100", "TMP/t.yaml")}, RUN, 2,
                             "t.yaml:3: nvls: 'nvswitch4' is not supported (did you mean nvswitch3?) "
                             "(allowed: none, nvswitch3)"),
    "group-range-unicode-digit": (scenario(COMM.replace("64 MiB}", "64 MiB, group: '²-3'}")), RUN, 2,
                                  "s.yaml:3: workload[0].group: cannot read group '²-3'"),
    "group-a-number": (scenario(COMM.replace("64 MiB}", "64 MiB, group: 5}")), RUN, 2,
                       "s.yaml:3: workload[0].group: expected a group of GPUs, got 5 (allowed: all, a list of GPU "
                       "indices, or a range like 0-7)"),
    "group-range-huge": (scenario(COMM.replace("64 MiB}", "64 MiB, group: 0-99999999999}")), RUN, 2,
                         "s.yaml:3: workload[0].group: range '0-99999999999' names more GPUs than a cluster holds"),
    "unknown-gpu-in-file": ({"t.yaml": "kind: nvswitch_node\ngpus: 8\ngpu_model: h100-typo\n",
                             "s.yaml": PRESET.replace("dgx-h100", "TMP/t.yaml")}, RUN, 2,
                            "t.yaml:3: gpu_model: 'h100-typo' is not supported (allowed: a100-40gb, "),
    "unknown-gpu-cluster-key": (scenario("cluster:\n  topology: dgx-h100\n  gpu_model: h100-typo\n"
                                         + PRESET.split("\n", 1)[1]), RUN, 2,
                                "s.yaml:3: cluster.gpu_model: 'h100-typo' is not supported (allowed: a100-40gb, "),
    "unknown-sharp-override": (scenario(COMM.replace("dgx-h100}", "dgx-h100-cluster}")),
                               RUN + ["--set", "cluster.sharp=sharpv2"], 2,
                               "command line: trainsim run: --set cluster.sharp=sharpv2: 'sharpv2' is not supported "
                               "(did you mean sharpv3?) (allowed: none, sharpv3)"),
    "too-many-nodes": (scenario(COMM.replace("dgx-h100}", "dgx-h100-cluster, nodes: 200000}")), RUN, 2,
                       "cluster.nodes: 200000 is beyond what a cluster holds"),
    "negative-latency-override": (scenario(COMM), RUN + ["--set", "cluster.nvlink_latency=-1us"], 2,
                                  "command line: trainsim run: --set cluster.nvlink_latency=-1us: '-1us' is negative"),
    "negative-latency-cluster-key": (scenario("cluster:\n  topology: dgx-h100\n  nvlink_latency: -2 us\n"
                                              + COMM.split("\n", 1)[1]), RUN, 2,
                                     "s.yaml:3: cluster.nvlink_latency: '-2 us' is negative"),
    "tp-true-override": (scenario(PRESET), RUN + ["--set", "parallelism.tp=true"], 2,
                         "command line: trainsim run: --set parallelism.tp=true: expected a whole number"),
    "override-unknown-key": (scenario(PRESET), RUN + ["--set", "parallelism.tpp=2"], 2,
                             "command line: trainsim run: --set parallelism.tpp=2: unknown key 'tpp'"),
    "override-unknown-section": (scenario(PRESET), RUN + ["--set", "paralelism.tp=2"], 2,
                                 "command line: trainsim run: --set paralelism.tp=2: unknown key 'paralelism'"),
    "override-past-a-list": (scenario(COMM), RUN + ["--set", "workload[3].bytes=1MiB"], 2,
                             "command line: trainsim run: --set workload[3].bytes=1MiB: workload has no item "
                             "[3] (it has 1) "
                             "(allowed: index 0, or a whole list as workload)"),
    # an index into a list the scenario lacks said "expected a list, got {'0': 'tp'}"; into a section, "unknown
    # key '0'"; into a trace's mapping, the trace's keys; a key of a list, "has no item [trace]"
    "override-index-of-an-absent-list": (scenario(PRESET), RUN + ["--set", "parallelism.order[0]=tp"], 2,
                                         "command line: trainsim run: --set parallelism.order[0]=tp: "
                                         "parallelism.order has "
                                         "no item [0] (the scenario gives no parallelism.order) (allowed: a whole "
                                         "list as parallelism.order)"),
    "override-index-of-an-absent-nested-list": (
        scenario(SYNTHETIC), RUN + ["--set", "faults.step.stragglers[0].gpus[0]=1"], 2,
        "--set faults.step.stragglers[0].gpus[0]=1: faults.step.stragglers has no item [0] (the scenario gives no "
        "faults.step.stragglers)"),
    "override-index-of-a-section": (scenario(PRESET), RUN + ["--set", "model[0]=1"], 2,
                                    "command line: trainsim run: --set model[0]=1: model is a section here, not "
                                    "a list (allowed: its "
                                    "keys: preset, layers,"),
    "override-index-of-a-value": (scenario(PRESET), RUN + ["--set", "parallelism.tp[0]=1"], 2,
                                  "--set parallelism.tp[0]=1: parallelism.tp is a single value, not a list "
                                  "(allowed: a value "
                                  "for parallelism.tp itself)"),
    "override-key-of-a-list": (scenario(COMM), RUN + ["--set", "workload.trace=x"], 2,
                               "command line: trainsim run: --set workload.trace=x: workload is a list here, "
                               "not a section (allowed: "
                               "its items, workload[0])"),
    "override-index-of-a-trace": (scenario("cluster: {topology: dgx-h100}\nworkload: {trace: t.json}\n"),
                                  RUN + ["--set", "workload[0].bytes=1MiB"], 2,
                                  "--set workload[0].bytes=1MiB: workload is a section here, not a list "
                                  "(allowed: its keys: trace,"),
    # a million channels made a million ring flows per hop: over two minutes without an answer
    "channels-beyond-nccl": (scenario(COMM + "collectives: {channels: 1000000}\n"), RUN, 2,
                             "s.yaml:4: collectives.channels: 1000000 channels are more than NCCL runs (MAXCHANNELS) "
                             "(allowed: 0, one per rail, or 1 to 32)"),
    "stragglers-not-a-list": (scenario(SYNTHETIC + "faults: {step: {stragglers: {gpus: [0]}}}\n"), RUN, 2,
                              "s.yaml:4: faults.step.stragglers: expected a list, got {\"gpus\": [0]} (allowed: a YAML "
                              "list"),  # said 'Input should be a valid array'
    # accepted, and the run printed a step of 5.085e+297 s; a GPU 1000 times slower than its peers has failed
    "straggler-slowdown-1e300": (scenario(SYNTHETIC + "faults: {step: {stragglers: [{gpus: [0], slowdown: 1e300}]}}\n"),
                                 RUN, 2, "s.yaml:4: faults.step.stragglers[0].slowdown: slowdown 1e+300 is more than "
                                 "1000: a GPU that much slower than its peers has failed (model it as a GPU failure) "
                                 "(allowed: a factor from 1 to 1000, e.g. 2 for half speed)"),
    # every refusal of one slowdown field gives the one range it allows: -2 read "a value > 0", 0.5 "a factor from
    # 1 to 1000"; a straggle class's 0.7 read "a value > 1", its 1e300 "a factor up to 1000"
    "straggler-slowdown-negative": (
        scenario(SYNTHETIC + "faults: {step: {stragglers: [{gpus: [0], slowdown: -2}]}}\n"), RUN, 2,
        "s.yaml:4: faults.step.stragglers[0].slowdown: slowdown -2 is below 1: a straggler's kernels last slowdown "
        "times their nominal time (allowed: a factor from 1 to 1000, e.g. 2 for half speed)\n"),
    "straggle-class-slowdown-below-one": (
        scenario(SYNTHETIC + "run: {horizon: 2 d}\nfaults: {components: {x: {unit: gpu, effect: straggle, "
                 "slowdown: 0.7, mtbf: 9 d, repair: 1 h}}}\n"), RUN, 2,
        "s.yaml:5: faults.components.x.slowdown: slowdown 0.7 does not slow the GPU: a straggle class's GPUs run "
        "their compute slowdown times longer (allowed: a factor above 1, up to 1000, e.g. 1.3)\n"),
    "straggle-class-slowdown-one": (
        scenario(SYNTHETIC + "run: {horizon: 2 d}\nfaults: {components: {x: {unit: gpu, effect: straggle, "
                 "slowdown: 1, mtbf: 9 d, repair: 1 h}}}\n"), RUN, 2,
        "s.yaml:5: faults.components.x.slowdown: slowdown 1 does not slow the GPU: a straggle class's GPUs run "
        "their compute slowdown times longer (allowed: a factor above 1, up to 1000, e.g. 1.3)\n"),
    "straggle-class-slowdown-1e300": (
        scenario(SYNTHETIC + "run: {horizon: 2 d}\nfaults: {components: {x: {unit: gpu, effect: straggle, "
                 "slowdown: 1e300, mtbf: 9 d, repair: 1 h}}}\n"), RUN, 2,
        "s.yaml:5: faults.components.x.slowdown: slowdown 1e+300 is more than 1000: a GPU that much slower than its "
        "peers has failed (model it as a GPU failure) (allowed: a factor above 1, up to 1000, e.g. 1.3)\n"),
    "straggler-draw-high-1e300": (
        scenario(SYNTHETIC + "faults:\n  step:\n    stragglers:\n      - gpus: [0]\n"
                 "        draw: {distribution: uniform, low: 1, high: 1e300}\n"), RUN, 2,
        "s.yaml:8: faults.step.stragglers[0].draw.high: slowdown 1e+300 is more than 1000"),
    # drew factors of 1e-56 beside ones capped at 1000 (a GPU whose kernels took no time)
    "straggler-draw-sigma-50": (
        scenario(SYNTHETIC + "faults:\n  step:\n    stragglers:\n      - gpus: [0]\n"
                 "        draw: {distribution: lognormal, median: 1, sigma: 50}\n"), RUN, 2,
        "s.yaml:8: faults.step.stragglers[0].draw.sigma: 50 is above 2.3 (allowed: a value <= 2.3)"),
    "straggler-slowdown-1e-300": (
        scenario(SYNTHETIC + "faults: {step: {stragglers: [{gpus: [0], slowdown: 1e-300}]}}\n"), RUN, 2,
        "s.yaml:4: faults.step.stragglers[0].slowdown: slowdown 1e-300 is below 1: a straggler's kernels last "
        "slowdown times their nominal time, so 1e-300 would make the GPU 1e+300 times faster (allowed: a factor "
        "from 1 to 1000, e.g. 2 for half speed)"),
    # a slowdown below 1 would make the GPU faster than nominal ("GPU 1 compute x0.5 slower")
    "straggler-slowdown-half": (
        scenario(SYNTHETIC + "faults: {step: {stragglers: [{gpus: [1], slowdown: 0.5}]}}\n"), RUN, 2,
        "s.yaml:4: faults.step.stragglers[0].slowdown: slowdown 0.5 is below 1: a straggler's kernels last "
        "slowdown times their nominal time, so 0.5 would make the GPU 2 times faster (allowed: a factor from 1 "
        "to 1000, e.g. 2 for half speed)"),
    # read "slowdown 0.999 ... would make the GPU 1 times faster", and 0.9999999 "slowdown 1 is below 1"
    "straggler-slowdown-just-below-one": (
        scenario(SYNTHETIC + "faults: {step: {stragglers: [{gpus: [1], slowdown: 0.999}]}}\n"), RUN, 2,
        "s.yaml:4: faults.step.stragglers[0].slowdown: slowdown 0.999 is below 1: a straggler's kernels last "
        "slowdown times their nominal time, so 0.999 would make the GPU 1.001 times faster (allowed: a factor "
        "from 1 to 1000, e.g. 2 for half speed)"),
    "straggler-slowdown-a-hair-below-one": (
        scenario(SYNTHETIC + "faults: {step: {stragglers: [{gpus: [1], slowdown: 0.9999999}]}}\n"), RUN, 2,
        "s.yaml:4: faults.step.stragglers[0].slowdown: slowdown 0.9999999 is below 1: a straggler's kernels last "
        "slowdown times their nominal time, so 0.9999999 would make the GPU 1.0000001 times faster"),

    "override-list-item-value": (scenario(COMM), RUN + ["--set", "workload[0].root=9"], 2,
                                 "command line: trainsim run: --set workload[0].root=9: root 9 is not a "
                                 "position in the group"),
    "override-non-ascii-digit": (scenario(PRESET), RUN + ["--set", "a.\u00b2=1"], 2,
                                 "command line: trainsim run: --set a.\u00b2=1: unknown key 'a'"),
    "override-not-a-path": (scenario(PRESET), RUN + ["--set", "parallelism[tp]=2"], 2,
                            "--set parallelism[tp]=2: 'parallelism[tp]' is not a field path"),
    "override-without-equals": (scenario(PRESET), RUN + ["--set", "parallelism.tp"], 2,
                                "command line: trainsim run: --set: 'parallelism.tp' has no '='"),
    "strict-out-of-memory": (scenario("cluster: {topology: dgx-h100}\nmodel: {preset: llama3-8b}\n"
                                      "training: {seq_len: 4096, global_batch: 8}\nparallelism: {dp: 8}\n"),
                             [*VALIDATE, "--strict"], 2, "s.yaml:4: parallelism: OUT OF MEMORY"),
    "override-into-value": (scenario(PRESET), RUN + ["--set", "training.seq_len.x=1"], 2,
                            "--set training.seq_len.x=1: training.seq_len has no sub-fields"),
    # output paths and other commands
    "out-empty": (scenario(COMM), ["run", "TMP/s.yaml", "--out", ""], 2, "--out: the output folder is empty"),
    "out-is-file": ({**scenario(COMM), "out": "x"}, RUN, 2, "exists and is not a folder"),
    "out-unwritable": (scenario(COMM), ["run", "TMP/s.yaml", "--out", "/proc/trainsim-out"], 2,
                       "--out: cannot write /proc/trainsim-out: /proc is not writable (allowed: a path inside a "
                       "writable folder)"),
    "plot-unknown-extension": ({}, ["plot", "gantt", "TMP/out", "-o", "TMP/g.xyz"], 2, "unknown image format '.xyz'"),
    "plot-unwritable": ({}, ["plot", "gantt", "TMP/out", "-o", "/proc/g.png"], 2,
                        "--output: cannot write /proc/g.png: /proc is not writable (allowed: a path inside a writable "
                        "folder)"),
    "plot-missing-folder": ({}, ["plot", "gantt", "TMP/out"], 2, "OUTDIR: no such folder"),
    # a file as OUTDIR was blamed on the default --output inside it, which no one gave
    "plot-outdir-is-file": ({"out": "x"}, ["plot", "gantt", "TMP/out"], 2, "OUTDIR: is a file, not a run folder"),
    "plot-memory-outdir-is-file": ({"out": "x"}, ["plot", "memory", "TMP/out"], 2,
                                   "OUTDIR: is a file, not a run folder"),
    # a study's, a sweep's and a search's charts said 'has no study.json' / 'has no results.parquet' of a
    # folder that does not exist, as if it were there with the wrong files
    "plot-goodput-missing-folder": ({}, ["plot", "goodput", "TMP/out"], 2, "OUTDIR: no such folder"),
    # sweep, heatmap and front read a table file as well as its folder: 'no such folder' of a missing
    # results.parquet read as if the file could not be given
    "plot-sweep-missing-folder": ({}, ["plot", "sweep", "TMP/out"], 2, "OUTDIR: no such file or folder"),
    "plot-sweep-missing-file": ({}, ["plot", "sweep", "TMP/out/results.parquet"], 2,
                                "OUTDIR: no such file or folder"),
    "plot-front-missing-folder": ({}, ["plot", "front", "TMP/out"], 2, "OUTDIR: no such file or folder"),
    "plot-busbw-missing-file": ({}, ["plot", "busbw", "TMP/table.json"], 2, "OUTDIR: no such file or folder"),
    "plot-not-a-run": ({"out/summary.json": "[]", "out/timeline.parquet": "x"}, ["plot", "memory", "TMP/out",
                                                                                   "-o", "TMP/m.png"], 2, "OUTDIR"),
    "topo-unknown": ({}, ["topo", "describe", "dgx-h900"], 2, "unknown topology 'dgx-h900'"),
    "topo-draw-extension": ({}, ["topo", "draw", "dgx-h100", "-o", "TMP/t.gif"], 2, "unknown image format '.gif'"),
    "collective-too-many-ranks": ({}, ["collective", "--topology", "dgx-h100", "--ranks", "9"], 2,
                                  "9 ranks do not fit"),
    "unknown-option": ({}, ["run", "TMP/s.yaml", "--out", "TMP/out", "--frobnicate"], 2,
                       "trainsim run: unrecognized arguments: --frobnicate (allowed: --help, --out, --set"),
    # refused by the command the user was in, with its options (it listed the top-level commands), and of a
    # command whose positional argument picks what it draws, the options that one reads (it listed every chart's)
    "plot-unknown-option": ({}, ["plot", "heatmap", "TMP/out", "--metric", "mfu"], 2,
                            "error: command line: trainsim plot: unrecognized arguments: --metric mfu (allowed: "
                            "--help, --output, --x, --y, --value: the options of a heatmap chart)\n"),
    "plot-gantt-unknown-option": ({}, ["plot", "gantt", "TMP/out", "--bogus"], 2,
                                  "error: command line: trainsim plot: unrecognized arguments: --bogus (allowed: "
                                  "--help, --output, --by, --window, --ranks: the options of a gantt chart)\n"),
    "topo-describe-unknown-option": ({}, ["topo", "describe", "dgx-h100", "--bogus"], 2,
                                     "error: command line: trainsim topo: unrecognized arguments: --bogus (allowed: "
                                     "--help, --set, --force: the options of topo describe)\n"),
    # describe ignored it without a word
    "topo-describe-output": ({}, ["topo", "describe", "dgx-h100", "-o", "TMP/t.png"], 2,
                             "error: command line: trainsim topo: --output: not read by topo describe (allowed: topo "
                             "draw)\n"),
    # an empty --output was taken for none given and saved the default image
    "topo-draw-empty-output": ({}, ["topo", "draw", "dgx-h100", "-o", ""], 2,
                               "error: command line: trainsim topo: --output: cannot tell the image format of '' "
                               "(allowed: .png"),
    "plot-empty-output": ({}, ["plot", "gantt", "TMP/out", "-o", ""], 2,
                          "error: command line: trainsim plot: --output: cannot tell the image format of '' "
                          "(allowed: .png"),
    "unknown-command": ({}, ["simulate"], 2, "invalid choice 'simulate' (allowed: run, validate, scenarios"),
    "collective-bare-size": ({}, ["collective", "--topology", "dgx-h100", "--sizes", "1024"], 2,
                             "error: command line: trainsim collective: --sizes: size '1024' has no unit"),
    "collective-unknown-op": ({}, ["collective", "--topology", "dgx-h100", "--op", "bogus"], 2,
                              "error: command line: trainsim collective: --op: unknown collective 'bogus'"),
    "collective-algorithm-for-op": ({}, ["collective", "--topology", "dgx-h100", "--op", "all_gather",
                                         "--algorithm", "tree"], 2,
                                    "error: command line: trainsim collective: --algorithm: algorithm 'tree' does not "
                                    "implement all_gather"),
    # an item's own algorithm is blamed on the item (it was 's.yaml:1: collectives.algorithm', a section the
    # file does not have); the run default still on its own line
    "workload-item-algorithm-for-op": (scenario(COMM.replace("all_reduce, bytes: 64 MiB",
                                                             "broadcast, bytes: 1 MiB, algorithm: nvls")), RUN, 2,
                                       "s.yaml:3: workload[0].algorithm: algorithm 'nvls' does not implement "
                                       "broadcast"),
    "workload-item-hierarchical-uneven": (scenario(
        "cluster: {topology: dgx-h100-cluster, nodes: 2}\nworkload:\n"
        "  - {op: all_reduce, bytes: 1 MiB}\n  - {op: all_reduce, bytes: 1 MiB, group: [0, 1, 8],"
        " algorithm: hierarchical}\n"), VALIDATE, 2, "s.yaml:4: workload[1].algorithm: hierarchical all_reduce"),
    "workload-default-algorithm-for-op": (scenario(COMM.replace("all_reduce, bytes: 64 MiB", "broadcast, bytes: 1 MiB")
                                                   + "collectives: {algorithm: nvls}\n"), VALIDATE, 2,
                                          "s.yaml:4: collectives.algorithm: algorithm 'nvls' does not implement"),
    # NCCL's protocols: one set checked at load, and what an algorithm cannot run with blamed on who asked
    "protocol-unknown": (scenario(COMM + "collectives: {protocol: ll256}\n"), VALIDATE, 2,
                         "s.yaml:4: collectives.protocol: 'll256' is not a valid choice"),
    "workload-item-protocol-for-algorithm": (scenario(COMM.replace("bytes: 64 MiB",
                                                                   "bytes: 64 MiB, algorithm: nvls, protocol: ll")),
                                             RUN, 2, "s.yaml:3: workload[0].protocol: protocol 'll' does not run "
                                             "nvls all_reduce"),
    "workload-default-protocol-for-algorithm": (scenario(COMM + "collectives: {algorithm: nvls, protocol: ll128}\n"),
                                                VALIDATE, 2, "s.yaml:4: collectives.protocol: protocol 'll128' does "
                                                "not run nvls all_reduce"),
    "ll128-over-pcie": (scenario("cluster: {topology: dgx-h100-cluster, nodes: 1, node: {kind: pcie_node}}\n"
                                 "workload:\n  - {op: all_reduce, bytes: 1 MiB, protocol: ll128}\n"), VALIDATE, 2,
                        "s.yaml:3: workload[0].protocol: protocol 'll128' does not run ring all_reduce"),
    "collective-unknown-protocol": ({}, ["collective", "--topology", "dgx-h100", "--protocol", "ll64"], 2,
                                    "error: command line: trainsim collective: --protocol: unknown protocol 'll64'"),
    # Megatron-LM asserts the distributed optimizer; it was accepted and ignored with ZeRO 0 and 3
    "overlap-param-gather-with-plain-ddp": (scenario(PRESET + "parallelism: {ddp: {overlap_param_gather: true}}\n"),
                                            VALIDATE, 2, "s.yaml:4: parallelism.ddp.overlap_param_gather: needs "
                                            "ZeRO-1/2 (Megatron-LM's distributed optimizer, as it asserts)"),
    "overlap-param-gather-with-zero-3": (scenario(PRESET + "parallelism: {zero: 3, ddp: {overlap_param_gather: "
                                                           "true}}\n"), VALIDATE, 2,
                                         "ZeRO-3 gathers each unit's parameters before its use already (allowed: "
                                         "false or left out; true with zero: 1 | 2 or fsdp: shard_grad_op)"),
    "size-beyond-a-petabyte": (scenario(COMM.replace("64 MiB", "1e30 B")), RUN, 2,
                               "s.yaml:3: workload[0].bytes: size '1e30 B' is more than 1 PiB, beyond any GPU's "
                               "memory (allowed: a size up to 1 PiB (2^50 B), e.g. 64 MiB)"),
    # ran a 0.5-byte all-reduce, where `trainsim collective --sizes 0.5B` is refused
    "size-below-a-byte": (scenario(COMM.replace("64 MiB", "0.5 B")), VALIDATE, 2,
                          "s.yaml:3: workload[0].bytes: size '0.5 B' is 0.5 B, not whole bytes "
                          "(allowed: 0 B, or whole bytes from 1 B up to 1 PiB (2^50 B), e.g. 64 MiB)"),
    "p2p-bytes-below-a-byte": (scenario(SYNTHETIC.replace("2 ms}", "2 ms, p2p_bytes: 1e-3 B}")), VALIDATE, 2,
                               "s.yaml:2: model.synthetic.p2p_bytes: size '1e-3 B' is 0.001 B, not whole bytes"),
    # ran a 1.5-byte all-reduce, where `trainsim collective --sizes 1.5B` is refused
    "size-of-a-fraction-of-a-byte": (scenario(COMM.replace("64 MiB", "1.5 B")), VALIDATE, 2,
                                     "s.yaml:3: workload[0].bytes: size '1.5 B' is 1.5 B, not whole bytes"),
    "bucket-beyond-a-petabyte": (scenario(PRESET + "parallelism: {ddp: {bucket: 2 PiB}}\n"), RUN, 2,
                                 "s.yaml:4: parallelism.ddp.bucket: size '2 PiB' is more than 1 PiB"),
    # was accepted and ran each gradient tensor as its own bucket; PyTorch and Megatron-LM take a cap of 1 B or more
    "bucket-of-zero-bytes": (scenario(PRESET + "parallelism: {ddp: {bucket: 0 MiB}}\n"), VALIDATE, 2,
                             "s.yaml:4: parallelism.ddp.bucket: size '0 MiB' is no bucket: a bucket holds at least 1 B "
                             "(allowed: whole bytes from 1 B up to 1 PiB (2^50 B), e.g. 25 MiB)"),
    # offered "0 B, or whole bytes from 1 B", the buffers' text, though a 0 B bucket is refused
    "bucket-of-half-a-byte": (scenario(PRESET + "parallelism: {ddp: {bucket: 0.5 B}}\n"), VALIDATE, 2,
                              "s.yaml:4: parallelism.ddp.bucket: size '0.5 B' is 0.5 B, not whole bytes "
                              "(allowed: whole bytes from 1 B up to 1 PiB (2^50 B), e.g. 25 MiB)"),
    "collective-size-beyond-a-petabyte": ({}, ["collective", "--topology", "dgx-h100", "--sizes", "1e30B"], 2,
                                          "error: command line: trainsim collective: --sizes: size '1e30B' is more "
                                          "than 1 PiB"),
    # 800,000 GPUs ran on for minutes, building the cluster and planning, until memory ran out
    "collective-on-too-many-gpus": ({}, ["collective", "--topology", "dgx-h100-cluster", "--set", "nodes=100000"], 2,
                                    "error: command line: trainsim collective: --topology: dgx-h100-cluster has "
                                    "800,000 GPUs, too many to "
                                    "time a collective on in seconds"),
    "collective-unknown-topology": ({}, ["collective", "--topology", "dgx-h900"], 2,
                                    "error: command line: trainsim collective: --topology: unknown topology "
                                    "'dgx-h900'"),  # <input>:
    "topo-unknown-topology": ({}, ["topo", "describe", "dgx-h900"], 2,
                              "error: command line: trainsim topo: TOPOLOGY: unknown topology 'dgx-h900'"),  # <input>:
    "collective-chunk-without-unit": ({}, ["collective", "--topology", "dgx-h100", "--chunk", "-1"], 2,
                                      "error: command line: trainsim collective: --chunk: size '-1' has no unit"),
    "study-without-intervals-or-failures": (scenario("cluster: {topology: dgx-h100, gpus: 8}\nmodel: {preset: "
                                                     "llama3-8b}\ntraining: {seq_len: 2048, global_batch: 8}\n"
                                                     "parallelism: {tp: 8}\nrun: {horizon: 1 d}\n"),
                                            ["study", "checkpoint-interval", "TMP/s.yaml", "--out", "TMP/st"], 2,
                                            "error: command line: trainsim study: --intervals: the job expects no "
                                            "failure, so it "
                                            "has no Daly interval to build the default grid around"),
    "study-negative-interval": ({}, ["study", "checkpoint-interval", "llama3-405b-16k-job", "--out", "TMP/st",
                                     "--intervals", "-5min,10min"], 2,
                                "error: command line: trainsim study: --intervals: '-5min,10min' needs positive, "
                                "finite values "
                                "(allowed: durations with units or whole steps, e.g. 5min,10min,30min,1h or "
                                "10steps,20steps)"),
    # 'cannot read '5'', where the unit was all it lacked, and 'cannot read '1,x'' for one bad value of a list
    "study-interval-without-unit": ({}, ["study", "checkpoint-interval", "llama3-405b-16k-job", "--out", "TMP/st",
                                         "--intervals", "5"], 2,
                                    "error: command line: trainsim study: --intervals: duration '5' has no unit "
                                    "(allowed: durations "
                                    "with units or whole steps, e.g. 5min,10min,30min,1h or 10steps,20steps)"),
    # '5min,,10min' ran 5 and 10 min, and '0.5,,1' two multipliers, where search and collective refuse the gap
    "study-empty-interval": ({}, ["study", "checkpoint-interval", "llama3-405b-16k-job", "--out", "TMP/st",
                                  "--intervals", "5min,,10min"], 2,
                             "error: command line: trainsim study: --intervals: '5min,,10min' has an empty item "
                             "between commas "
                             "(allowed: durations with units or whole steps, e.g. 5min,10min,30min,1h or "
                             "10steps,20steps)"),
    "study-empty-multiplier": ({}, ["study", "mtbf", "llama3-405b-16k-job", "--out", "TMP/st", "--multipliers",
                                    "0.5,1,"], 2,
                               "error: command line: trainsim study: --multipliers: '0.5,1,' has an empty item between "
                               "commas "
                               "(allowed: numbers, e.g. 0.5,1,2,4)"),
    # was "cannot read size ''"
    "collective-empty-size": ({}, ["collective", "--topology", "dgx-h100", "--sizes", "1MiB,,2MiB"], 2,
                              "error: command line: trainsim collective: --sizes: '1MiB,,2MiB' has an empty item "
                              "between commas "
                              "(allowed: e.g. 1MiB,64MiB)"),
    "study-multiplier-not-a-number": ({}, ["study", "mtbf", "llama3-405b-16k-job", "--out", "TMP/st",
                                           "--multipliers", "1,x"], 2,
                                      "error: command line: trainsim study: --multipliers: 'x' is not a number "
                                      "(allowed: numbers, "
                                      "e.g. 0.5,1,2,4)"),
    "study-interval-twice": ({}, ["study", "checkpoint-interval", "llama3-405b-16k-job", "--out", "TMP/st",
                                  "--intervals", "10min,600s"], 2,
                             "error: command line: trainsim study: --intervals: '10min,600s' gives 600 s twice "
                             "(allowed: distinct "
                             "values, durations with units or whole steps, e.g. 5min,10min,30min,1h or "
                             "10steps,20steps)"),
    "study-multiplier-twice": ({}, ["study", "mtbf", "llama3-405b-16k-job", "--out", "TMP/st",
                                    "--multipliers", "1,1,2"], 2,
                               "error: command line: trainsim study: --multipliers: '1,1,2' gives 1 twice (allowed: "
                               "distinct "
                               "values, numbers, e.g. 0.5,1,2,4)"),
    "collnet-without-sharp": (scenario("cluster: {topology: dgx-h100-cluster}\ncollectives: {algorithm: collnet_direct}"
                                       "\nworkload:\n  - {op: all_reduce, bytes: 64 MiB}\n"), RUN, 2,
                              "s.yaml:2: collectives.algorithm: collnet_direct needs a group across hosts on SHARP "
                              "switches: dgx-h100-cluster has no SHARP switches"),
    "nvls-sharp-training-without-sharp": (scenario(PRESET.replace("dgx-h100", "dgx-h100-cluster, nodes: 2")
                                                   + "parallelism: {tp: 2, dp: 8}\n"
                                                   + "collectives: {algorithm: nvls_sharp}\n"), RUN, 2,
                                          "s.yaml:5: collectives.algorithm: nvls_sharp needs"),
    "collnet-training-without-sharp": (scenario(PRESET.replace("dgx-h100", "dgx-h100-cluster, nodes: 2")
                                                .replace("global_batch: 8", "global_batch: 16")
                                                + "parallelism: {tp: 1, dp: 16}\n"
                                                + "collectives: {algorithm: collnet_direct}\n"), RUN, 2,
                                       "s.yaml:5: collectives.algorithm: collnet_direct needs"),
    "sharp-on-ethernet": (scenario(COMM.replace("dgx-h100}", "ethernet-100g, sharp: sharpv3}")), RUN, 2,
                          "s.yaml:1: cluster.sharp: sharpv3 runs in InfiniBand switches"),
    "collective-sharp-on-plain-fabric": ({}, ["collective", "--topology", "dgx-h100-cluster", "--algorithm",
                                              "nvls_sharp"], 2, "has no SHARP switches"),
}


def materialise(tmp_path: Path, files: dict[str, str | bytes], argv: list[str]) -> list[str]:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("TMP/", f"{tmp_path}/"))
    return [arg.replace("TMP/", f"{tmp_path}/") for arg in argv]


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_list_is_long_enough():
    assert len(CASES) >= 50


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_answers_in_one_line_and_writes_nothing(name, tmp_path, capsys):
    files, argv, status, words = CASES[name]
    argv = materialise(tmp_path, files, argv)
    before = tree(tmp_path)
    assert main(argv) == status
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    assert captured.err.endswith("\n") and captured.err.count("\n") == 1, captured.err
    assert re.match(r"^(error|simulation error): ", captured.err), captured.err
    assert words in captured.err, captured.err
    assert tree(tmp_path) == before


def test_every_required_field_says_what_it_takes():
    """Each field a scenario must give, found by walking the schema so that fields added later are checked too,
    has an answer for "(allowed: ...)" when it is left out: "required field is missing" alone left a new user
    guessing what `cluster.topology` or a workload item's `bytes` takes."""
    from pydantic import BaseModel

    from simulator.config.field_paths import model_in
    from simulator.config.loader import _what_it_takes
    from simulator.config.schema import Scenario

    def required(model: type[BaseModel], path: tuple) -> list[tuple]:
        found = []
        for name, info in model.model_fields.items():
            if info.is_required():
                found.append(path + (name,))
            listed, section = model_in(info.annotation, in_list=True), model_in(info.annotation)
            if isinstance(listed, type) and listed is not section:
                found += required(listed, path + (name, 0))
            if isinstance(section, type):
                found += required(section, path + (name,))
        return found

    paths = required(Scenario, ())
    assert ("cluster", "topology") in paths and ("workload", 0, "bytes") in paths
    assert [path for path in paths if not _what_it_takes(Scenario, path)] == []


def test_a_closed_pipe_ends_quietly():
    """`trainsim topo describe ... | head -0`: the reader is gone before the first line; no traceback."""
    with subprocess.Popen([sys.executable, "-m", "simulator.cli", "topo", "describe", "dgx-h100-cluster"],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:  # closes stderr
        process.stdout.close()
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=60) == 141
    assert stderr == ""


PROGRESS_EVERY_TENTH_S = ("import sys; from simulator.console import progress; progress.PLAIN_EVERY_S = 0.1; "
                          "from simulator.cli import console; sys.argv[0] = 'trainsim'; sys.exit(console())")
"""`trainsim` with its plain progress lines (stderr off a terminal) every tenth of a second: the first says the
engine is simulating."""


def test_ctrl_c_prints_interrupted_exits_130_and_writes_nothing(tmp_path):
    """SIGINT while the 8,192-GPU scenario, with 256 micro-batches per step (about a minute of simulation), is being
    simulated (sent once its first progress line is read, not after a fixed sleep, which a loaded machine could spend
    still importing): one line, status 130, no output folder. The child gets the default SIGINT disposition (a test
    run in the background of a shell would hand it SIGINT ignored, as a terminal never does). A failure prints all
    the child said, and when the signal was sent (``readline`` alone would lose the lines written before the first
    was read: `first_line`)."""
    out = tmp_path / "out"
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-c", PROGRESS_EVERY_TENTH_S, "run",
                                "scenarios/llama3-405b-8192-gpus.yaml", "--out", str(out),
                                "--set", "training.global_batch=16384"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = first_line(process.stderr)
    assert first.startswith("simulating: ") and first.endswith(" elapsed\n"), first
    sent_s = time.monotonic() - started
    process.send_signal(signal.SIGINT)
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # the stop lost: what the child said, all the same
        process.kill()
        stdout, stderr = process.communicate()
    said = (f"status {process.returncode}, SIGINT sent {sent_s:.1f} s after the start; stderr:\n{first}{stderr}\n"
            f"stdout:\n{stdout}")
    assert process.returncode == 130, said
    *progress, last = stderr.splitlines()
    assert stdout == "" and last == "interrupted", said
    assert all(line.startswith("simulating: ") and line.endswith(" elapsed") for line in progress), said
    assert list(tmp_path.iterdir()) == [], said


def first_line(stream) -> str:
    """The first line of a child's text pipe, read a byte at a time from its file descriptor: ``readline`` would read a
    block into the pipe's buffer, which ``communicate`` then skips (it reads the descriptor), so the lines the child
    had written by then would be missing from what a failure prints."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(stream.fileno(), 1)
        if not byte:
            break
        line += byte
    return line.decode()


def dropped_ctrl_c(module: str, name: str) -> str:
    """A `trainsim` child with Ctrl-C pressed while a dropped generator's cleanup runs, just before ``name`` of
    ``module`` (a function or a class's method) is called: Python runs the handler there, and reports the
    KeyboardInterrupt it raises as 'Exception ignored' and drops it, as it does one raised in a weakref callback
    (a run's own: the step's program order leaving simulation.py's `_SHARING` as `simulate()` returns), a
    `__del__` or a fork hook."""
    return f"""
import importlib, signal, sys
from simulator.cli import console

*owners, name = "{name}".split(".")
where = importlib.import_module("{module}")
for owner in owners:
    where = getattr(where, owner)
called = getattr(where, name)

def cleaned_up():
    try:
        yield
    finally:
        signal.raise_signal(signal.SIGINT)

def called_after_a_cleanup(*args, **kwargs):
    steps = cleaned_up()
    next(steps)
    del steps
    return called(*args, **kwargs)

setattr(where, name, called_after_a_cleanup)
sys.argv[0] = "trainsim"
sys.exit(console())
"""


def trainsim_with_a_dropped_ctrl_c(module: str, name: str, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """`trainsim ARGS` with a Ctrl-C dropped before ``module.name`` runs (`dropped_ctrl_c`), and all it said."""
    process = subprocess.run([sys.executable, "-c", dropped_ctrl_c(module, name), *args], cwd=REPO,
                             capture_output=True, text=True, timeout=300,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return process, f"status {process.returncode}; stderr:\n{process.stderr}\nstdout:\n{process.stdout}"


def test_ctrl_c_that_lands_in_a_cleanup_still_ends_the_run(tmp_path):
    """A Ctrl-C that Python drops where it lands (code run at deallocation), here as the engine starts, still ends
    the run: `interrupted`, status 130, nothing written."""
    out = tmp_path / "out"
    process, said = trainsim_with_a_dropped_ctrl_c("simulator.engine.engine", "Engine.run", "run",
                                                   "scenarios/schedule-1f1b-p4-m8.yaml", "--out", str(out), "--quiet")
    assert (process.returncode, process.stderr, process.stdout) == (130, "interrupted\n", ""), said
    assert list(tmp_path.iterdir()) == [], said


def test_ctrl_c_dropped_after_a_runs_last_safe_point_is_not_silent(tmp_path):
    """A Ctrl-C dropped once the run's files are in place (here as its warnings are checked) ends the command as it
    would have there: `interrupted`, status 130, the folder written whole."""
    out = tmp_path / "out"
    process, said = trainsim_with_a_dropped_ctrl_c("simulator.cli", "_warn", "run",
                                                   "scenarios/schedule-1f1b-p4-m8.yaml", "--out", str(out), "--quiet")
    assert (process.returncode, process.stderr, process.stdout) == (130, "interrupted\n", ""), said
    assert sorted(path.name for path in out.iterdir()) == ["manifest.json", "summary.json", "timeline.parquet",
                                                            "trace.json"], said


def test_ctrl_c_dropped_in_a_serial_sweep_stops_it_after_that_point(tmp_path):
    """A Ctrl-C dropped as a serial sweep's first point simulates (no run folders, so no `RunProgress` and no folder
    move to raise it) stops the sweep once that point is journalled: its own `interrupted` line, status 130, only
    the points finished by then in its results."""
    import pandas as pd

    out = tmp_path / "out"
    process, said = trainsim_with_a_dropped_ctrl_c("simulator.engine.engine", "Engine.run", "sweep",
                                                   "tests/data/sweep_200.yaml", "--executor", "serial", "--out",
                                                   str(out), "--quiet")
    assert process.returncode == 130, said
    assert process.stderr == (f"interrupted: the finished points are in {out}/results.parquet; run again to "
                              "resume\n"), said
    results = pd.read_parquet(out / "results.parquet")
    assert (results["status"] == "ok").sum() == 1, said
    assert len(results) < 200, said


def integer_fields(model: type, path: tuple = ()) -> list[tuple]:
    """Every field of the schema that takes an integer, as a path (list items as index 0), found by walking the
    models, so that fields added later are checked too. Fields with their own parser (a checkpoint interval: "N
    steps" or a duration) are left to it (test_a_parsed_integer_field_refuses_booleans_and_bare_numbers)."""
    import types
    import typing

    from pydantic import BaseModel, BeforeValidator

    found = []
    for name, field in model.model_fields.items():
        child = path + (name,)
        if any(isinstance(rule, BeforeValidator) for rule in field.metadata):
            continue
        union = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
        for member in typing.get_args(field.annotation) if union else (field.annotation,):
            inner = typing.get_args(member) if typing.get_origin(member) is list else ()
            if isinstance(member, type) and issubclass(member, BaseModel):
                found += integer_fields(member, child)
            elif inner and isinstance(inner[0], type) and issubclass(inner[0], BaseModel):
                found += integer_fields(inner[0], child + (0,))
            elif member is int:
                found.append(child)
    return found


def field_only(loc: tuple) -> tuple:
    """A pydantic error location without the union members it names (`list[CollectiveItem]`, `TraceWorkload`)."""
    return tuple(part for part in loc if isinstance(part, int) or not ("[" in part or part[:1].isupper()))


def test_a_parsed_integer_field_refuses_booleans_and_bare_numbers():
    from pydantic import ValidationError

    from simulator.config.schema import Scenario

    for value in (True, "4", 4):
        with pytest.raises(ValidationError) as caught:
            Scenario.model_validate({"checkpoint": {"interval": value}})
        assert any(error["loc"] == ("checkpoint", "interval") and "unit" in error["msg"]
                   for error in caught.value.errors()), caught.value.errors()


def test_every_integer_field_refuses_booleans_and_strings():
    """Strict types: `true` or "4" where an integer is expected is an error at that field, never a 1 or a 4."""
    from pydantic import ValidationError

    from simulator.config.schema import Scenario

    fields = integer_fields(Scenario)
    assert ("parallelism", "tp") in fields and ("workload", 0, "repeat") in fields and len(fields) >= 15
    for path in fields:
        for value in (True, "4"):
            data: dict = {}
            node: dict | list = data
            for part, following in zip(path, path[1:]):
                child: dict | list = [] if isinstance(following, int) else {}
                if isinstance(node, list):
                    node.append(child)
                else:
                    node[part] = child
                node = child
            if isinstance(node, list):
                node.append(value)
            else:
                node[path[-1]] = value
            with pytest.raises(ValidationError) as caught:
                Scenario.model_validate(data)
            kinds = {error["type"] for error in caught.value.errors() if field_only(error["loc"])[:len(path)] == path}
            assert kinds & {"int_type", "int_parsing"}, (path, value, caught.value.errors())


@pytest.mark.parametrize("text, line, field", [
    (SYNTHETIC + "parallelism: {pp: 2, order: [tp, tp, pp, dp]}\n", 4, "parallelism.order"),
    (PS, 4, "parallelism.strategy"),
    (PS.replace("strategy: parameter_server}", "strategy: parameter_server, tp: 3}") + "ps: {servers: 1}\n", 4,
     "parallelism.tp"),
    (PS + "ps: {servers: 1, mode: async, staleness: 2}\n", 5, "ps.staleness"),
    (PRESET + "parallelism: {pp: 2, fsdp: full_shard, pipeline: {schedule: interleaved, virtual_stages: 4}}\n", 4,
     "parallelism.pipeline.virtual_stages"),
    (PRESET + "parallelism: {pp: 2, fsdp: full_shard, ddp: {reduce_every_microbatch: true}}\n", 4,
     "parallelism.ddp.reduce_every_microbatch"),
])
def test_checks_across_the_fields_of_a_scenario_are_made_when_it_is_read(text, line, field):
    """The parallelism order, the parameter-server pairing and worker rules and pipelined FSDP's limits are facts
    of the scenario alone: refused when it is read (so a sweep's validated points exclude them), not when the step
    is built."""
    from simulator.config.loader import scenario_from_text
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError) as caught:
        scenario_from_text(text, "s.yaml")
    assert (caught.value.line, caught.value.field) == (line, field)


def test_a_table_of_another_size_names_its_rows_and_the_overrides_that_sized_the_step(tmp_path, capsys):
    """The fault is the scenario's pairing of a table with its sizes: the error is at the scenario's table line,
    names the table's rows and every override that set p, m or v."""
    argv = materialise(tmp_path, {"s.yaml": CUSTOM, "table.csv": "# p = 2\n" + "F0,F1,BW0,BW1\n" * 2},
                       [*VALIDATE, "--set", "training.microbatches=4"])
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path}/s.yaml:4: parallelism.pipeline.table: the schedule table is for p = 2, m = 2, v = 1 "
        f"({tmp_path}/table.csv, its rows on lines 2-3); the scenario asks for p = 2, m = 4, v = 1 (with --set "
        "training.microbatches=4) (allowed: parallelism.pp: 2, 2 micro-batches (training.microbatches, or a "
        "global_batch of dp x micro_batch x 2) and parallelism.pipeline.virtual_stages: 1; or a table for p = 2, "
        "m = 4, v = 1)\n")


@pytest.mark.parametrize(("error", "shown"), [
    (OSError(errno.EROFS, "Read-only file system"), "cannot write OUT: it is not writable (Read-only file system)"),
    (OSError(errno.ENOENT, "No such file or directory"), "cannot write OUT: it is not writable (allowed"),
])
def test_an_unwritable_out_names_the_path_given_and_why(error, shown, tmp_path, monkeypatch):
    """An --out folder that exists but takes no new entry is refused naming the path given and that it is not
    writable, with the system's reason where that says more (a read-only mount), not where it misleads (/proc's
    'No such file or directory' of a folder that exists)."""
    def refuse(**_):
        raise error
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(InputError) as refused:
        output_folder(str(tmp_path), RUN_FOLDER)
    assert shown.replace("OUT", str(tmp_path)) in str(refused.value)
