"""Each out-of-memory remedy is a setting the loader accepts beside the scenario's other fields and that lowers
the peak memory per GPU of the layout that ran: every remedy of a grid of layouts is loaded, validated and its
peak compared (the line offered ZeRO/FSDP at dp x cp = 1, where they shard over one rank and eager refuses fsdp,
and ZeRO-3 beside settings the loader refuses with it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import load_scenario
from simulator.console.report import oom_line
from simulator.preflight import validate
from simulator.scale import sized_topology
from simulator.workload.memory import memory_remedies, remedies

SCENARIOS = Path(__file__).parent.parent / "scenarios"
FUSED = str(SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml")
EAGER = str(SCENARIOS / "llama3-8b-dgx-h100-eager-fsdp.yaml")
BATCH = ["training.micro_batch=2", "training.global_batch=32"]


def peak_and_shard_ranks(path: str, overrides: list[str]) -> tuple[float, int, int]:
    """The validated layout's peak memory per GPU (GiB), its DP x CP ranks and those its sharding shards over
    (fewer under hybrid sharding across NVLink domains)."""
    loaded = load_scenario(path, overrides)
    memory = validate(loaded, sized_topology(loaded, force=False)).memory
    layout = memory["layout"]
    shard_ranks = layout["dp"] * layout["cp"]
    return memory["peak_memory_gib"], shard_ranks, layout.get("shard_ranks", shard_ranks)


@pytest.mark.parametrize("path,overrides", [
    (FUSED, ["parallelism.zero=0"]),
    (FUSED, ["parallelism.zero=1"]),
    (FUSED, ["parallelism.zero=1", "parallelism.ddp.overlap_param_gather=true"]),
    (FUSED, ["parallelism.zero=2", "parallelism.ddp.reduce_every_microbatch=false"]),
    (FUSED, ["parallelism.zero=0", "parallelism.ddp.reduce_every_microbatch=false"]),
    (FUSED, ["parallelism.zero=1", "parallelism.ddp.reduce_every_microbatch=false"]),
    (FUSED, ["parallelism.zero=0", "training.grad_accumulation_fusion=true"]),
    (FUSED, ["parallelism.zero=0", "parallelism.fsdp=shard_grad_op"]),
    (FUSED, ["parallelism.zero=1", "parallelism.tp=8", "parallelism.dp=1"]),
    (FUSED, ["parallelism.zero=0", "parallelism.cp=8", "parallelism.dp=1"]),
    (FUSED, ["parallelism.zero=0", "parallelism.pp=2", "parallelism.dp=4", "parallelism.pipeline.virtual_stages=4",
             "parallelism.pipeline.schedule=interleaved"]),
    # under 1F1B FSDP keeps the weights and gradients unsharded through the step: full_shard raised ZeRO-1's peak
    (FUSED, ["parallelism.zero=1", "parallelism.pp=2", "parallelism.dp=4"]),
    (FUSED, ["parallelism.zero=0", "parallelism.pp=2", "parallelism.dp=4"]),
    # hybrid_shard on one 8-GPU host shards over all DP ranks: full_shard was offered, at 170.0 GiB either way
    (FUSED, ["parallelism.zero=0", "parallelism.fsdp=hybrid_shard", "training.seq_len=16384"]),
    (EAGER, ["parallelism.fsdp=null"]),
    (EAGER, ["parallelism.fsdp=null", "parallelism.pp=8", "parallelism.dp=1"]),
    (EAGER, ["parallelism.fsdp=null", "training.attention=standard"]),
], ids=lambda value: ",".join(value) if isinstance(value, list) else Path(value).stem)
def test_every_remedy_loads_and_lowers_the_peak(path, overrides):
    before, shard_ranks, hybrid_ranks = peak_and_shard_ranks(path, [*overrides, *BATCH])
    scenario = load_scenario(path, [*overrides, *BATCH]).scenario
    offered = remedies(scenario.parallelism, scenario.training, shard_ranks, hybrid_ranks)
    assert offered
    for choices in offered:
        for remedy in choices:
            if not remedy.settings:
                continue
            settings = [f"{field}={value}" for field, value in remedy.settings]
            after, _, _ = peak_and_shard_ranks(path, [*overrides, *BATCH, *settings])
            assert after < before, (remedy.text, before, after)


@pytest.mark.parametrize("path,overrides,expected", [
    (FUSED, ["parallelism.zero=1", "parallelism.tp=8", "parallelism.dp=1"],
     "recompute: full, more tp or pp, a smaller micro_batch"),
    (FUSED, ["parallelism.zero=1", "parallelism.ddp.overlap_param_gather=true"],
     "zero: 2 with ddp.reduce_every_microbatch: true, recompute: full, more tp or pp, a smaller micro_batch"),
    (EAGER, ["parallelism.fsdp=null", "parallelism.pp=8", "parallelism.dp=1"],
     "recompute: full, more pp, a smaller micro_batch"),
])
def test_no_sharding_is_offered_where_it_has_nothing_to_shard_over_or_is_refused(path, overrides, expected):
    """At dp x cp = 1 ZeRO and FSDP shard over one rank (and eager refuses fsdp there); beside
    overlap_param_gather (ZeRO-1/2's) ZeRO-3 and FSDP are refused, and ZeRO-2 saves on ZeRO-1 only reducing every
    micro-batch."""
    _, shard_ranks, hybrid_ranks = peak_and_shard_ranks(path, [*overrides, *BATCH])
    scenario = load_scenario(path, [*overrides, *BATCH]).scenario
    assert memory_remedies(scenario.parallelism, scenario.training, shard_ranks, hybrid_ranks) == expected


LONG = ["training.seq_len=131072", "training.micro_batch=1", "training.global_batch=8"]


@pytest.mark.parametrize("overrides,expected", [
    (["parallelism.cp=2", "parallelism.dp=4"], "cp: 4 with dp: 2"),
    (["parallelism.cp=2", "parallelism.dp=null"], "cp: 4"),
    (["parallelism.cp=1", "parallelism.dp=null", "parallelism.cp_load_balance=false"], "cp: 2"),
])
def test_more_cp_is_offered_where_activations_are_the_largest_part_and_lowers_the_peak(overrides, expected):
    """A long sequence's activations (303.3 GiB of 359.5 at seq 131072 cp 2 on eight H100s) no sharding touches:
    the line offers the next cp that divides the DP x CP ranks and splits the sequence, which loads and lowers
    the peak (it offered only ZeRO-3/FSDP, recompute and more tp or pp)."""
    loaded = load_scenario(FUSED, [*LONG, *overrides])
    memory = validate(loaded, sized_topology(loaded, force=False)).memory
    assert max(memory["memory_breakdown_gib"].items(), key=lambda part: part[1])[0] == "activations"
    line = oom_line(dict(memory), loaded.scenario.parallelism, loaded.scenario.training)
    assert f", {expected}, " in line
    layout = memory["layout"]
    offered = remedies(loaded.scenario.parallelism, loaded.scenario.training, layout["dp"] * layout["cp"],
                       activations_largest=True)
    context = next(choice for choices in offered for choice in choices if choice.text == expected)
    after, _, _ = peak_and_shard_ranks(FUSED, [*LONG, *overrides, *(f"{f}={v}" for f, v in context.settings)])
    assert after < memory["peak_memory_gib"]


def test_more_cp_is_not_offered_where_activations_are_not_the_largest_part():
    """The 8B dp8 step at micro_batch 1 peaks on its gradients (29.9 GiB over 19.0 GiB of activations): more cp
    would split the smaller part only."""
    loaded = load_scenario(FUSED, ["training.micro_batch=1", "training.global_batch=32"])
    memory = dict(validate(loaded, sized_topology(loaded, force=False)).memory)
    assert max(memory["memory_breakdown_gib"].items(), key=lambda part: part[1])[0] != "activations"
    memory["oom"] = True
    assert "cp:" not in oom_line(memory, loaded.scenario.parallelism, loaded.scenario.training)


def test_zero_1_accumulating_unsharded_gradients_is_offered_zero_3_reducing_every_microbatch():
    """ZeRO-3 refuses `ddp.reduce_every_microbatch: false`, so beside it no ZeRO remedy was offered, though ZeRO-3
    reducing every micro-batch loads and lowers the peak (the grid above checks it)."""
    overrides = ["parallelism.zero=1", "parallelism.ddp.reduce_every_microbatch=false", *BATCH]
    _, shard_ranks, hybrid_ranks = peak_and_shard_ranks(FUSED, overrides)
    scenario = load_scenario(FUSED, overrides).scenario
    assert memory_remedies(scenario.parallelism, scenario.training, shard_ranks, hybrid_ranks).startswith(
        "zero: 3 with ddp.reduce_every_microbatch: true or fsdp: full_shard with zero: 0, ")


THREE_NODES = ["cluster.topology=dgx-h100-cluster", "cluster.nodes=3", "parallelism.zero=1", "training.seq_len=98304",
               "parallelism.tp=4", "parallelism.cp=2"]


@pytest.mark.parametrize("overrides,expected", [
    (["parallelism.dp=3", "training.global_batch=3"], "cp: 6 with dp: 1"),
    (["parallelism.dp=null", "training.global_batch=3"], "cp: 6"),
])
def test_more_cp_leaves_a_dp_that_splits_the_global_batch(overrides, expected):
    """DP 3 x CP 2 with a global batch of 3: cp 3 leaves dp 2, which the loader refuses (3 is no multiple of
    micro_batch x dp = 2); cp 6 leaves dp 1, which loads and lowers the peak."""
    loaded = load_scenario(FUSED, [*THREE_NODES, *overrides])
    memory = validate(loaded, sized_topology(loaded, force=False)).memory
    layout = memory["layout"]
    offered = remedies(loaded.scenario.parallelism, loaded.scenario.training, layout["dp"] * layout["cp"],
                       activations_largest=True)
    context = [choice for choices in offered for choice in choices if choice.text.startswith("cp:")]
    assert [choice.text for choice in context] == [expected]
    after, _, _ = peak_and_shard_ranks(FUSED, [*THREE_NODES, *overrides,
                                               *(f"{f}={v}" for f, v in context[0].settings)])
    assert after < memory["peak_memory_gib"]


@pytest.mark.parametrize("path,overrides", [
    (EAGER, ["training.seq_len=65536", "training.micro_batch=1", "training.global_batch=8"]),
    (str(SCENARIOS / "parameter-server-vs-allreduce.yaml"), ["training.seq_len=65536", "training.micro_batch=1"]),
    (FUSED, ["training.seq_len=65537", "training.micro_batch=1", "training.global_batch=8"]),
    (FUSED, ["training.seq_len=65536", "training.micro_batch=2", "training.global_batch=16"]),
], ids=lambda value: ",".join(value) if isinstance(value, list) else Path(value).stem)
def test_more_cp_is_not_offered_where_the_loader_refuses_it_or_a_larger_micro_batch_halves_first(path, overrides):
    """No cp under eager kernels (which refuse it), parameter-server workers (each holds the whole model), a
    sequence no larger cp splits evenly, or a micro-batch above 1 (halving it comes first, without CP's traffic)."""
    scenario = load_scenario(path, overrides).scenario
    line = memory_remedies(scenario.parallelism, scenario.training, 8, activations_largest=True)
    assert "cp:" not in line, line
