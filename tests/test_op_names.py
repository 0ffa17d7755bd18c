"""Every op name the program builders make matches a pattern docs/outputs.md ("Op names") lists, read from the
doc, so a name the doc does not list fails here; and every pattern the doc lists is matched by a name one of the
cases makes, so the doc holds no pattern no program makes."""

from __future__ import annotations

import re
from functools import cache

import pytest
from shared import REPO, SCENARIOS

from simulator.config.loader import load_scenario, scenario_from_text
from simulator.simulation import step_program
from simulator.topology.loader import scenario_topology

PLACEHOLDERS = {
    "#": r"\d+",
    "<pass>": "(?:F|B|Bi|W|R)",
    "<block>": r"(?:stage|embedding|head|L\d+\.attn|L\d+\.mlp)",
    "<unit>": r"(?:embedding|head|L\d+|L\d+\.experts)",
    "<dir>": "(?:fwd|bwd)",
    "<op>": "(?:all_reduce|all_gather|reduce_scatter|all_to_all)",
}
"""What each placeholder of the doc's patterns stands for, as its prose defines it."""

INLINE = {
    "tp-overlap-fsdp-pp": """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1, recompute: full}
parallelism: {tp: 4, pp: 2, dp: 2, sequence_parallel: true, tp_comm_overlap: true, fsdp: full_shard,
              pipeline: {schedule: 1f1b}}
""",
    "zbv-split-backward": """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 8}
training: {seq_len: 1024, global_batch: 16, micro_batch: 1}
parallelism: {tp: 2, pp: 2, dp: 2, sequence_parallel: true, pipeline: {schedule: zbv, virtual_stages: 2}}
""",
    "context-ring": """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 8192, global_batch: 4, micro_batch: 1}
parallelism: {tp: 2, cp: 2, dp: 2, sequence_parallel: true}
""",
    "context-all-gather": """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 8192, global_batch: 4, micro_batch: 1}
parallelism: {tp: 2, cp: 2, dp: 2, sequence_parallel: true, cp_algorithm: all_gather}
""",
    "hybrid-shard-one-rank-groups": """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 1024, global_batch: 4, micro_batch: 1}
parallelism: {tp: 8, dp: 2, fsdp: hybrid_shard}
""",
    "zero1-overlap-param-gather": """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 2, dp: 4, zero: 1, ddp: {overlap_param_gather: true}}
""",
    "parameter-server-async": """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: megatron-1.7b}
training: {seq_len: 1024, micro_batch: 1, microbatches: 2}
parallelism: {strategy: parameter_server}
ps: {servers: 1, mode: async, iterations: 2}
""",
}
"""Each inline case makes names the scenario files do not: the K/V all-gather (`cp_algorithm: all_gather`);
FSDP's one-rank shard groups inside each 8-GPU TP domain (their unshard copies and reduce copy-outs, and the
all-reduce of each shard across the two replicas); ZeRO-1's parameter gathers per bucket deferred to the next
forward; an asynchronous parameter server's per-worker updates."""
SCENARIO_FILES = ["llama3-70b-torchtitan-pp-fsdp", "llama3-8b-dgx-h100-zero3", "mixtral-8x7b-ep8",
                  "megatron-sc21-76.1b", "schedule-dualpipev-p4-m8", "parameter-server-vs-allreduce"]


def doc_patterns() -> list[re.Pattern]:
    """The patterns of the doc's "Op names" list items: the code spans before each item's colon."""
    text = (REPO / "docs" / "outputs.md").read_text()
    section = text.split("\n## Op names\n", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^- (.*?)(?=^- |^\S|\Z)", section, re.M | re.S)
    patterns = []
    for item in items:
        head = re.match(r"((?:`[^`]+`(?:,\s*)?)+):", " ".join(item.split()))
        assert head, item
        for name in re.findall(r"`([^`]+)`", head.group(1)):
            regex = re.escape(name)
            for placeholder, value in PLACEHOLDERS.items():
                regex = regex.replace(re.escape(placeholder), value)
            patterns.append(re.compile(regex))
    return patterns


def test_the_doc_lists_patterns_with_known_placeholders_only():
    patterns = doc_patterns()
    assert len(patterns) > 30
    assert not [p.pattern for p in patterns if "<" in p.pattern.replace("(?:", "")]


@cache
def op_names(case: str) -> frozenset[str]:
    """The names of the ops case ``case``'s step program makes, with a parameter-server run's ring all-reduce
    it is compared with."""
    loaded = (scenario_from_text(INLINE[case], "inline.yaml") if case in INLINE
              else load_scenario(SCENARIOS / f"{case}.yaml"))
    program = step_program(loaded, scenario_topology(loaded), fold=True)
    compared = program.parameter_server.comparison if program.parameter_server is not None else ()
    return frozenset(op.name for op in (*program.ops, *compared))


@pytest.mark.parametrize("case", [*INLINE, *SCENARIO_FILES])
def test_every_op_name_matches_a_pattern_the_doc_lists(case):
    patterns = doc_patterns()
    assert not sorted(name for name in op_names(case) if not any(p.fullmatch(name) for p in patterns))


def test_every_pattern_the_doc_lists_names_an_op_of_some_case():
    names = set().union(*(op_names(case) for case in [*INLINE, *SCENARIO_FILES]))
    assert not [p.pattern for p in doc_patterns() if not any(p.fullmatch(name) for name in names)]
