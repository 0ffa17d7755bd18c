"""Each out-of-memory remedy is computed, not ruled: every remedy offered over a grid of layouts is loaded as a user
pastes it (its `--set`s over the same scenario), passes `trainsim validate`'s checks and lowers the validated
peak memory per GPU by the amount its text prints, at least what the memory plan leaves out
(`memory_plan.UNMODELLED_BYTES`). Hand-written rules that restated the loader and the memory plan had offered
remedies that raised the peak (FSDP under pipelining), that the loader refused (cp leaving a dp that did not split
the batch), or that saved 0.15 GiB (ZeRO-3 on a MoE long sequence)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from shared import SCENARIOS

from simulator import load_scenario
from simulator.console.report import oom_line
from simulator.errors import InputError
from simulator.memory_remedies import candidates, memory_remedies, peak_memory, remedies_text
from simulator.preflight import validate
from simulator.reliability.elastic import shrunk_scenario, shrunk_settings
from simulator.reliability.simulate import validate_job
from simulator.scale import sized_topology
from simulator.topology.loader import scenario_topology
from simulator.workload import memory_plan
from simulator.workload.memory_plan import GIB

FUSED = str(SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml")
EAGER = str(SCENARIOS / "llama3-8b-dgx-h100-eager-fsdp.yaml")
MIXTRAL = str(SCENARIOS / "mixtral-8x7b-ep8.yaml")
SERVERS = str(SCENARIOS / "parameter-server-vs-allreduce.yaml")
BATCH = ["training.micro_batch=2", "training.global_batch=32"]
LONG = ["training.seq_len=131072", "training.micro_batch=1", "training.global_batch=8"]
THREE_NODES = ["cluster.topology=dgx-h100-cluster", "cluster.nodes=3", "parallelism.zero=1", "training.seq_len=98304",
               "parallelism.tp=4", "parallelism.cp=2", "training.global_batch=3"]
MOE_LONG = ["training.seq_len=131072", "training.global_batch=16"]
ELASTIC = ["cluster.topology=dgx-h100-cluster", "cluster.nodes=8", "cluster.node.kind=nvswitch_node",
           "cluster.node.gpus=1", "cluster.nics_per_node=1", "cluster.leaf_ports=4", "cluster.spines=2",
           "run.horizon=2 d", "restart.elastic=true", "restart.min_replicas=5"]
"""Eight one-GPU hosts, an elastic job that restarts on no fewer than 5 replicas: pp 2 or cp 2 with dp 4 lower
its step's peak, and `trainsim validate` refuses them (min_replicas above the replicas)."""

ALL_IN_FLIGHT = ["parallelism.zero=1", "parallelism.pp=2", "parallelism.dp=4", "training.micro_batch=2",
                 "training.global_batch=128"]
"""16 micro-batches on 2 stages: GPipe and looped-BFS hold all 16 micro-batches' activations, 1F1B and
interleaved about 2 at the same bubble."""

UNEVEN_IN_FLIGHT = [*ALL_IN_FLIGHT[:-1], "training.global_batch=120"]
"""15 micro-batches on 2 stages: interleaved runs them in max(1, 15 // 2) = 7 rounds and refuses them, 15 being
no multiple of 7."""


def validated_peak(path: str, overrides: list[str]) -> dict:
    """The memory entries `trainsim validate` gives the scenario with ``overrides`` (every check of a run, and of
    a job where it has a horizon)."""
    loaded = load_scenario(path, overrides)
    topology = sized_topology(loaded, force=False)
    verdict = validate(loaded, topology)
    if loaded.scenario.run.horizon is not None:
        validate_job(loaded, topology, verdict.step_floor_s, verdict.trace_sizes)
    return dict(verdict.memory)


def offered_settings(path: str, overrides: list[str]) -> list[tuple[str, ...]]:
    return [remedy.settings for remedy in memory_remedies(load_scenario(path, overrides))]


GRID = [
    (FUSED, ["parallelism.zero=0", *BATCH]),
    (FUSED, ["parallelism.zero=1", *BATCH]),
    (FUSED, ["parallelism.zero=1", "parallelism.ddp.overlap_param_gather=true", *BATCH]),
    (FUSED, ["parallelism.zero=2", "parallelism.ddp.reduce_every_microbatch=false", *BATCH]),
    (FUSED, ["parallelism.zero=1", "parallelism.ddp.reduce_every_microbatch=false", *BATCH]),
    (FUSED, ["parallelism.zero=0", "training.grad_accumulation_fusion=true", *BATCH]),
    (FUSED, ["parallelism.zero=0", "parallelism.fsdp=shard_grad_op", "parallelism.ddp.reduce_every_microbatch=false",
             *BATCH]),
    (FUSED, ["parallelism.zero=1", "parallelism.tp=8", "parallelism.dp=1", "training.micro_batch=16",
             "training.global_batch=32"]),
    (FUSED, ["parallelism.zero=0", "parallelism.pp=2", "parallelism.dp=4", "parallelism.pipeline.virtual_stages=4",
             "parallelism.pipeline.schedule=interleaved", *BATCH]),
    # under 1F1B FSDP keeps the weights and gradients unsharded through the step: full_shard raised ZeRO-1's peak
    (FUSED, ["parallelism.zero=1", "parallelism.pp=2", "parallelism.dp=4", "training.seq_len=65536", *BATCH]),
    (FUSED, ["parallelism.zero=0", "parallelism.fsdp=hybrid_shard", "training.seq_len=16384", *BATCH]),
    (FUSED, [*LONG, "parallelism.cp=2", "parallelism.dp=4"]),
    (FUSED, [*LONG, "parallelism.cp=2", "parallelism.dp=null"]),
    (FUSED, [*THREE_NODES, "parallelism.dp=3"]),
    (EAGER, ["parallelism.fsdp=null", *BATCH]),
    (EAGER, ["parallelism.fsdp=null", "parallelism.pp=8", "parallelism.dp=1", "training.micro_batch=16",
             "training.global_batch=32"]),
    (EAGER, ["training.seq_len=65536", "training.micro_batch=1", "training.global_batch=8"]),
    (MIXTRAL, MOE_LONG),
    (FUSED, [*ELASTIC, "parallelism.zero=1", *BATCH]),
    (SERVERS, ["training.seq_len=65536", "training.micro_batch=1"]),
    (FUSED, [*ALL_IN_FLIGHT, "parallelism.pipeline.schedule=gpipe"]),
    (FUSED, [*ALL_IN_FLIGHT, "parallelism.pipeline.schedule=looped-bfs", "parallelism.pipeline.virtual_stages=2"]),
    (FUSED, [*UNEVEN_IN_FLIGHT, "parallelism.pipeline.schedule=looped-bfs", "parallelism.pipeline.virtual_stages=2"]),
]


@pytest.mark.parametrize("path,overrides", GRID,
                         ids=lambda value: ",".join(value) if isinstance(value, list) else Path(value).stem)
def test_every_remedy_loads_and_lowers_the_peak_by_what_it_prints(path, overrides):
    before = validated_peak(path, overrides)
    assert before["oom"]
    offered = memory_remedies(load_scenario(path, overrides))
    assert offered
    for remedy in offered:
        after = validated_peak(path, [*overrides, *remedy.settings])
        saved = before["peak_memory_gib"] - after["peak_memory_gib"]
        assert saved > 0 and saved >= memory_plan.UNMODELLED_BYTES / GIB, (remedy.text, saved)
        left = ("fits" if not after["oom"]
                else f"still {after['peak_memory_gib']:,.1f} of {after['memory_capacity_gib']:,.1f} GiB")
        assert remedy.text == (" ".join(f"--set {setting}" for setting in remedy.settings)
                               + f" (-{saved:,.1f} GiB, {left}{f': {remedy.note}' if remedy.note else ''})")


def test_the_line_offers_the_remedies_that_fit_without_more_compute_first_then_the_most_saving():
    overrides = ["parallelism.zero=0", *BATCH]
    memory = validated_peak(FUSED, overrides)
    offered = memory_remedies(load_scenario(FUSED, overrides))
    order = [(not remedy.fits, remedy.fits and remedy.costs_compute, -remedy.saved_bytes) for remedy in offered]
    assert order == sorted(order)
    assert oom_line(memory, load_scenario(FUSED, overrides)).endswith(
        f"(try {'; '.join(remedy.text for remedy in offered)}); the same layout fits b200 (179.1 GiB), gb200 (185.0 "
        "GiB) (trainsim gpus)")


DEEPSEEK_CUT = ["cluster.nodes=2", "parallelism.pp=2", "model.layers=6", "training.global_batch=16"]
"""The DeepSeek-V3-style step on 16 H100 (PP 2, DP 8, EP 8): its expert-data-parallel group is one rank, which holds
the routed experts' optimizer state whole (86.1 GiB of 79.6); cp 8 saves 3.0 GiB and leaves 83.1."""


def test_where_one_rank_holds_the_experts_state_more_gpus_at_the_same_ep_are_offered_first():
    """`DEEPSEEK_CUT`'s one-rank expert-data-parallel group holds the routed experts' state whole (86.1 GiB of
    79.6): twice the nodes at the same ep put it over two ranks and fit (-24.8 GiB, 61.3 GiB), so that comes first,
    saving what validate's peak says, with the group it gives; every other remedy leaves the peak over the GPU
    (cp 8: -3.0 GiB, 83.1 GiB)."""
    path = str(SCENARIOS / "deepseek-v3-style-1024-gpus.yaml")
    before = validated_peak(path, DEEPSEEK_CUT)
    offered = memory_remedies(load_scenario(path, DEEPSEEK_CUT))
    assert offered[0].settings == ("cluster.nodes=4",) and offered[0].fits
    assert "expert-data-parallel group of 1 rank (tp x dp x cp / ep = 1 x 8 x 1 / 8)" in offered[0].text
    after = validated_peak(path, [*DEEPSEEK_CUT, "cluster.nodes=4"])
    assert offered[0].saved_bytes / GIB == pytest.approx(before["peak_memory_gib"] - after["peak_memory_gib"],
                                                         abs=0.01)
    assert all(not remedy.fits for remedy in offered[1:])
    assert "(-3.0 GiB, still 83.1 of 79.6 GiB)" in remedies_text(offered)


def test_where_no_single_setting_fits_the_line_says_so_with_what_each_leaves():
    """Llama 3 70B as the parameter-server run's workers: 305.7 GiB of 79.6; full recompute saves 38.9 GiB and
    leaves 266.8, no remedy to paste and expect to fit. Each worker holds the whole model, so more GPUs do not
    lower its peak: the line asks for a larger GPU or a smaller model, where a run with a layout asks for more
    GPUs."""
    overrides = ["model.preset=llama3-70b"]
    loaded = load_scenario(SERVERS, overrides)
    offered = memory_remedies(loaded)
    assert offered and not any(remedy.fits for remedy in offered)
    line = oom_line(validated_peak(SERVERS, overrides), loaded)
    assert line.startswith("OUT OF MEMORY: 305.7 GiB needed on rank 0, the GPU holds 79.6 GiB (try a larger GPU or "
                           "a smaller model: no single setting weighed fits, the most each saves: ")
    assert "--set training.recompute=full (-38.9 GiB, still 266.8 of 79.6 GiB)" in line
    assert "more GPUs" not in line
    assert "the same layout fits" not in line  # no catalog GPU holds 305.7 GiB
    assert remedies_text(offered).startswith("a larger GPU or more GPUs: no single setting weighed fits")


def test_a_moe_long_sequence_is_not_offered_zero_3_for_its_tenth_of_a_gib():
    """Mixtral at seq 131072 peaks on its 572 GiB of activations; ZeRO-3 shards only the dense weights' share
    of its 40 GiB of model state beyond ZeRO-1 (the experts are sharded over their expert-DP group either way):
    a saving under what the memory plan leaves out, which the line offered ('zero: 3 or fsdp: full_shard, ...')."""
    before = validated_peak(MIXTRAL, MOE_LONG)["peak_memory_gib"]
    zero_3 = validated_peak(MIXTRAL, [*MOE_LONG, "parallelism.zero=3"])["peak_memory_gib"]
    assert 0 < before - zero_3 < memory_plan.UNMODELLED_BYTES / GIB
    offered = offered_settings(MIXTRAL, MOE_LONG)
    assert offered and not any("parallelism.zero=3" in settings for settings in offered)


def test_the_least_saving_is_what_the_memory_plan_leaves_out_as_it_stands(monkeypatch):
    """The floor a remedy must save is the memory plan's figure read at use: with the plan leaving out 100 GiB,
    Mixtral's long sequence is offered full recompute, cp 8 and tp 4 (287 to 531 GiB saved), no longer pp 2 nor
    FSDP (19.8 and 17.1 GiB)."""
    offered = offered_settings(MIXTRAL, MOE_LONG)
    monkeypatch.setattr(memory_plan, "UNMODELLED_BYTES", 100 * GIB)
    assert offered_settings(MIXTRAL, MOE_LONG) == [
        ("training.recompute=full",), ("parallelism.cp=8",), ("parallelism.tp=4",)] == offered[:3]


@pytest.mark.parametrize("path,overrides", [
    (FUSED, ["parallelism.zero=3", *BATCH]),
    (FUSED, ["parallelism.zero=0", "parallelism.fsdp=full_shard", *BATCH]),
    (FUSED, ["parallelism.zero=0", "parallelism.fsdp=hybrid_shard", "training.seq_len=16384", *BATCH]),
], ids=["zero-3", "full_shard", "hybrid_shard-one-host"])
def test_no_sharding_is_offered_that_saves_nothing(path, overrides):
    """Sharded to ZeRO-3 or full_shard already, or hybrid_shard over one 8-GPU host's NVLink domain, which holds
    every DP rank (full_shard holds as much, and was offered): no sharding remedy."""
    offered = offered_settings(path, overrides)
    assert offered and not any(setting.startswith(("parallelism.zero", "parallelism.fsdp"))
                               for settings in offered for setting in settings)


def test_cp_leaves_a_dp_that_splits_the_global_batch():
    """DP 3 x CP 2 with a global batch of 3: cp 4 does not divide the DP x CP ranks, and cp 3 would leave dp 2,
    which the loader refuses (3 is no multiple of micro_batch x dp = 2); cp 6 leaves dp 1, which loads and lowers
    the peak (the grid checks it)."""
    offered = offered_settings(FUSED, [*THREE_NODES, "parallelism.dp=3"])
    assert [settings for settings in offered if settings[0].startswith("parallelism.cp")] == [
        ("parallelism.cp=6", "parallelism.dp=1")]


@pytest.mark.parametrize("path,overrides", [
    (EAGER, ["training.seq_len=65536", "training.micro_batch=1", "training.global_batch=8"]),
    (SERVERS, ["training.seq_len=65536", "training.micro_batch=1"]),
    (FUSED, ["training.seq_len=65537", "training.micro_batch=1", "training.global_batch=8"]),
], ids=["eager", "parameter-server", "odd-sequence"])
def test_no_cp_is_offered_where_the_loader_refuses_it(path, overrides):
    """Eager kernels refuse cp, a parameter-server worker holds the whole model, and no cp splits a sequence
    of 65,537 tokens evenly."""
    offered = offered_settings(path, overrides)
    assert offered and not any(setting.startswith("parallelism.cp") for settings in offered for setting in settings)


def test_a_scenario_from_text_and_a_sweep_point_get_remedies_as_a_file_does():
    """Without a file to read again, the remedies are built from the data the scenario was validated from
    (`LoadedScenario.written`): a scenario from text, and a sweep point's data with its axes."""
    from simulator.config.loader import LoadedScenario, scenario_from_text, validate_as_json
    from simulator.config.schema import Scenario

    overrides = ["parallelism.zero=0", *BATCH]
    expected = offered_settings(FUSED, overrides)
    from_text = scenario_from_text(Path(FUSED).read_text(), FUSED, overrides)
    assert [remedy.settings for remedy in memory_remedies(from_text)] == expected
    assert from_text.written is not None
    scenario = validate_as_json(Scenario, from_text.written)
    point = LoadedScenario(scenario, FUSED, {}, (), (scenario, from_text.written))
    assert [remedy.settings for remedy in memory_remedies(point)] == expected


def test_no_remedy_is_offered_whose_step_warns_of_a_new_field():
    """TP 16 on two 8-GPU hosts loads and lowers the peak (199.1 -> 167.3 GiB), but its TP group spans two NVLink
    domains, a layout warning the scenario's step did not give: the line leaves it out (it would fit the 405B
    with TP 32 across four domains, and crawl)."""
    overrides = ["cluster.topology=dgx-h100-cluster", "cluster.nodes=2", "parallelism.tp=8", "parallelism.dp=2",
                 *LONG]
    loaded = load_scenario(FUSED, [*overrides, "parallelism.tp=16", "parallelism.dp=1"])
    verdict = validate(loaded, sized_topology(loaded, force=False))
    assert verdict.memory["peak_memory_gib"] < validated_peak(FUSED, overrides)["peak_memory_gib"] - 30
    assert [warning.split(":")[0] for warning in verdict.warnings] == ["--set parallelism.tp=16"]  # located there
    base = load_scenario(FUSED, overrides)
    assert validate(base, sized_topology(base, force=False)).warnings == ()
    offered = offered_settings(FUSED, overrides)
    assert offered and not any(setting.startswith("parallelism.tp") for settings in offered for setting in settings)


def test_a_tp_group_across_hosts_is_offered_no_tp_across_more_hosts():
    """Llama 3 405B (the bundled 8,192-GPU preset) on 16 DGX H100 with TP 16, already across two hosts' NVLink domains
    (its step warns of it), PP 1, DP 8: a remedy that spreads the TP group over more NVLink domains is left out,
    though the step's warning names the same field, so `--set parallelism.tp=128 --set parallelism.dp=1` (-163.2 GiB,
    fits: a TP group over all sixteen hosts no one would run) is not offered, and FSDP's full_shard (-140.0 GiB)
    leads."""
    preset = str(SCENARIOS / "llama3-405b-8192-gpus.yaml")
    overrides = ["cluster.nodes=16", "parallelism.tp=16", "parallelism.pp=1", "parallelism.dp=8",
                 "training.global_batch=64"]
    loaded = load_scenario(preset, overrides)
    assert [warning.split(":")[0] for warning in validate(loaded, sized_topology(loaded, force=False)).warnings] == [
        "--set parallelism.tp=16"]
    offered = offered_settings(preset, overrides)
    assert offered[0] == ("parallelism.fsdp=full_shard",)
    assert not any(setting.startswith("parallelism.tp") for settings in offered for setting in settings)
    assert ("parallelism.pp=8", "parallelism.dp=1") in offered  # the other layout knobs are still weighed


def test_a_tp_group_other_than_gpu_0s_across_racks_counts(tmp_path):
    """Two GB200 NVL72 racks (72 GPUs each) with Llama 3 405B at TP 8, DP 18: every TP group sits in one rack. TP 16, DP
    9 keeps GPU 0's group in rack 0 but puts group 4 (GPUs 64-79) on both racks: the most domains any TP group spans
    counts, not GPU 0's group alone, so the step warns and the remedy `--set parallelism.tp=16 --set
    parallelism.dp=9` (-448.6 GiB) is left out."""
    path = tmp_path / "nvl8.yaml"
    path.write_text("cluster: {topology: gb200-nvl72, racks: 2}\nmodel: {preset: llama3-405b}\n"
                    "training: {seq_len: 8192, global_batch: 144, micro_batch: 1}\n"
                    "parallelism: {tp: 8, pp: 1, dp: 18}\n")
    spread = load_scenario(str(path), ["parallelism.tp=16", "parallelism.dp=9"])
    warnings = validate(spread, sized_topology(spread, force=False)).warnings
    assert len(warnings) == 1
    assert warnings[0].startswith("--set parallelism.tp=16: a TP group of 16 GPUs spans 2 NVLink domains")
    offered = offered_settings(str(path), [])
    assert offered and not any(setting.startswith("parallelism.tp") for settings in offered for setting in settings)


def test_an_elastic_job_is_offered_no_layout_that_leaves_fewer_replicas_than_it_needs():
    """pp 2 and cp 2 with dp 4 each lower the elastic job's peak by 19 GiB or more (the grid checks what is
    offered), but leave 4 replicas where `restart.min_replicas` asks for 5: `trainsim validate` refuses both."""
    overrides = [*ELASTIC, "parallelism.zero=1", *BATCH]
    for layout in (["parallelism.pp=2", "parallelism.dp=4"], ["parallelism.cp=2", "parallelism.dp=4"]):
        with pytest.raises(InputError, match="min_replicas 5 is above the layout's 4 replicas"):
            validated_peak(FUSED, [*overrides, *layout])
    offered = offered_settings(FUSED, overrides)
    assert offered and not any("parallelism.dp=4" in settings for settings in offered)


def test_a_copy_with_another_scenario_has_no_data_to_rebuild_from():
    """`LoadedScenario.written` describes only the scenario validated from it: a copy with another scenario (a
    shrunk job's) has none, so no remedy is weighed on the data of a job it no longer describes."""
    loaded = load_scenario(FUSED, BATCH)
    assert loaded.written is not None
    assert replace(loaded, source="elsewhere.yaml").written is loaded.written
    shrunk = loaded.scenario.model_copy(update={"training": loaded.scenario.training.model_copy(
        update={"micro_batch": 1})})
    assert replace(loaded, scenario=shrunk).written is None
    assert memory_remedies(replace(loaded, scenario=shrunk)) is None


def test_the_line_says_so_where_nothing_was_weighed():
    """No setting weighed (a scenario not built from its data) is not 'no single setting ... saves 1 GiB'."""
    weighed_none = remedies_text(())
    unweighed = remedies_text(None)
    assert weighed_none.startswith("no single setting the checks take saves 1 GiB")
    assert unweighed != weighed_none and "no setting weighed" in unweighed


def test_no_pipeline_stage_is_offered_without_a_layer():
    """Llama 3 8B's 32 layers on pp 8 x dp 8: dp's factors 2, 4 and 8 would make pp 16, 32 and 64; 64 stages
    for 32 layers is not offered."""
    loaded = load_scenario(FUSED, ["cluster.topology=dgx-h100-cluster", "cluster.nodes=8", "parallelism.pp=8",
                                   "parallelism.dp=8", "training.global_batch=64"])
    pipelines = [settings for group in candidates(loaded, peak_memory(loaded, scenario_topology(loaded)))
                 for settings in group if settings[0].startswith("parallelism.pp")]
    assert pipelines == [("parallelism.pp=16", "parallelism.dp=4"), ("parallelism.pp=32", "parallelism.dp=2")]


def test_the_shrink_settings_write_the_shrunk_scenario():
    """`shrunk_settings` over the job's data load as the scenario `shrunk_scenario` builds."""
    loaded = load_scenario(FUSED, [*ELASTIC, "parallelism.zero=1", *BATCH])
    topology = scenario_topology(loaded)
    assert topology.num_hosts == 8
    settings = shrunk_settings(loaded.scenario, topology, 8, 2, 5)
    assert load_scenario(FUSED, [*ELASTIC, "parallelism.zero=1", *BATCH, *settings]).scenario == shrunk_scenario(
        loaded.scenario, topology, 8, 2, 5)


@pytest.mark.parametrize("batch", ["microbatches: 4, micro_batch: 1", "microbatches: 2, micro_batch: 2"])
def test_a_file_with_microbatches_and_a_global_batch_is_offered_remedies_that_keep_its_batch(tmp_path, batch):
    """A file that gives both micro-batches and the global batch: a remedy that changes dp or micro_batch sets the
    micro-batches that keep the global batch, so the batch check takes it as pasted (tp 2 with dp 4 alone would leave
    'microbatches 4 x micro_batch 1 x dp 4 = 16' against global_batch 32, refused)."""
    text = Path(FUSED).read_text().replace("global_batch: 32, micro_batch: 1", f"global_batch: 32, {batch}")
    path = tmp_path / "con.yaml"
    path.write_text(text)
    overrides = ["training.seq_len=8192"]
    assert validated_peak(str(path), overrides)["oom"]
    offered = memory_remedies(load_scenario(str(path), overrides))
    assert any("parallelism.dp=4" in remedy.settings for remedy in offered)
    for remedy in offered:
        validated_peak(str(path), [*overrides, *remedy.settings])


@pytest.mark.parametrize("schedule,chunks,same_bubble", [("gpipe", 1, "1f1b"), ("looped-bfs", 2, "interleaved")])
def test_a_schedule_holding_every_micro_batch_is_offered_the_one_of_its_bubble(schedule, chunks, same_bubble):
    """GPipe and looped-BFS hold every micro-batch's activations; 1F1B and interleaved run the same bubble with
    about p in flight (this Llama 3 8B: 368.3 GiB under GPipe, 67.7 GiB under 1F1B), and were
    never offered: only recompute and sharding were."""
    overrides = [*ALL_IN_FLIGHT, f"parallelism.pipeline.schedule={schedule}",
                 f"parallelism.pipeline.virtual_stages={chunks}"]
    assert validated_peak(FUSED, overrides)["oom"]
    offered = offered_settings(FUSED, overrides)
    assert (f"parallelism.pipeline.schedule={same_bubble}",) in offered
    assert not validated_peak(FUSED, [*overrides, f"parallelism.pipeline.schedule={same_bubble}"])["oom"]


def test_looped_bfs_with_micro_batches_interleaved_refuses_is_offered_1f1b_before_recompute():
    """Interleaved needs m a multiple of its max(1, m // p) rounds: 15 micro-batches on 2 stages make 7 rounds, which
    15 is no multiple of, so looped-BFS is offered 1F1B on one chunk, which fits at about its bubble, before recompute
    (+33% compute) and sharding."""
    overrides = [*UNEVEN_IN_FLIGHT, "parallelism.pipeline.schedule=looped-bfs", "parallelism.pipeline.virtual_stages=2"]
    offered = memory_remedies(load_scenario(FUSED, overrides))
    settings = [remedy.settings for remedy in offered]
    fallback = ("parallelism.pipeline.schedule=1f1b", "parallelism.pipeline.virtual_stages=1")
    assert fallback in settings
    assert offered[settings.index(fallback)].fits
    recompute = [index for index, remedy in enumerate(offered) if remedy.costs_compute]
    assert recompute and settings.index(fallback) < min(recompute)


def test_a_remedy_that_fits_without_more_compute_is_listed_before_recompute_that_saves_more():
    """GPipe with 4 micro-batches on 2 stages: full recompute saves 63.0 GiB and 1F1B 49.7 GiB, both fit; recompute
    came first, though it runs a third more compute and 1F1B runs the same step."""
    overrides = [*ALL_IN_FLIGHT[:-1], "training.global_batch=32", "parallelism.pipeline.schedule=gpipe"]
    offered = memory_remedies(load_scenario(FUSED, overrides))
    assert offered[0].settings == ("parallelism.pipeline.schedule=1f1b",) and offered[0].fits
    assert any(remedy.costs_compute and remedy.fits and remedy.saved_bytes > offered[0].saved_bytes
               for remedy in offered)


PIPELINED = [(path, overrides) for path, overrides in GRID
             if any(setting.startswith("parallelism.pp=") for setting in overrides)]


@pytest.mark.parametrize("path,overrides", PIPELINED,
                         ids=lambda value: ",".join(value) if isinstance(value, list) else Path(value).stem)
def test_no_remedy_of_a_pipelined_step_is_a_layout_no_framework_trains(path, overrides):
    """DeepSpeed's ZeRO-2 (`zero: 2` reducing every micro-batch) and ZeRO-3 refuse pipelining and Megatron-FSDP does
    not pipeline: a remedy that would make such a layout, which the run warns of, is not offered (both were, on the
    interleaved and the GPipe steps)."""
    for settings in offered_settings(path, overrides):
        assert not load_scenario(path, [*overrides, *settings]).unframed_fields(), settings


def test_a_remedy_warned_of_at_another_unframed_field_is_not_offered(monkeypatch):
    """The remedy filter compared how many choices no framework trains, so one that traded the warned `zero: 3`
    for DeepSpeed's ZeRO-2 at `ddp.reduce_every_microbatch` (one each) was offered; it compares which fields."""
    import simulator.memory_remedies as remedies

    loaded = load_scenario("llama3-8b-dgx-h100-dp8")
    before = remedies.Peak(80 * GIB, 80 * GIB, None, unframed=frozenset({"parallelism.zero"}))
    for warned, offered in ((frozenset({"parallelism.ddp.reduce_every_microbatch"}), False),
                            (frozenset({"parallelism.zero"}), True)):
        monkeypatch.setattr(remedies, "peak_memory", lambda *_, warned=warned: replace(
            before, bytes=70 * GIB, unframed=warned))
        remedy = remedies._tried(loaded, scenario_topology(loaded), before, (), ("training.micro_batch=1",))
        assert (remedy is not None) == offered


def test_zero_1_the_bundled_scenarios_own_setting_is_offered_where_zero_0_runs_out():
    """Llama 3 8B on 8 H100 at ZeRO-0 (the bundled scenario as its comment says to run it): bf16 params 2 B +
    fp32 gradients 4 B + Adam's 12 B per parameter for 8.03e9 parameters, 14.96 + 29.92 + 89.75 GiB, with
    19.0 GiB of activations, 153.6 GiB of 79.6. ZeRO-1 shards the 89.75 GiB of optimizer state over the 8 ranks,
    saving 7/8 of it, 78.5 GiB, and leaves 75.1 GiB: the one setting that fits, which the list once left out
    for ZeRO-2 with a second setting."""
    offered = {remedy.settings: remedy for remedy in memory_remedies(load_scenario(FUSED, ["parallelism.zero=0"]))}
    zero_1 = offered[("parallelism.zero=1",)]
    optimizer_gib = 12 * 8.030261248e9 / GIB
    assert zero_1.saved_bytes / GIB == pytest.approx(optimizer_gib * 7 / 8, abs=0.05)
    assert zero_1.text == "--set parallelism.zero=1 (-78.5 GiB, fits)"
    assert zero_1.peak_bytes / GIB == pytest.approx(75.1, abs=0.05)
