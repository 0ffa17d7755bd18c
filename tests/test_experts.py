"""Mixture of experts and expert parallelism: presets against their published sizes, the all-to-all volume of
seed 000 (2 k n d elements per MoE layer in the forward), expert GEMMs sized by the routed tokens, capacity
drops equal to what the routing sample implies, skew slowing the step, and the checks on ep / top_k / CF."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from simulator.catalog.models import get_model
from simulator.config.loader import scenario_from_text
from simulator.config.moe import RoutingConfig
from simulator.workload.experts import ROUTING_STREAM
from simulator.workload.routing import sample_routing

SEQ, TP, EP = 4096, 2, 8
SCENARIO = f"""
cluster: {{topology: dgx-h100-cluster, nodes: 2}}
model:
  preset: mixtral-8x7b
  layers: 2
  moe: {{experts: 8, top_k: 2, routing: {{balance: uniform}}}}
training: {{seq_len: {SEQ}, microbatches: 1, precision: bf16}}
parallelism: {{tp: {TP}, pp: 1, ep: {EP}, sequence_parallel: true}}
run: {{seed: 3}}
"""
TOKENS = SEQ // TP  # tokens each TP rank routes (its sequence-parallel share)


def test_mixtral_preset_has_its_published_total_and_active_parameters():
    """Mistral AI, "Mixtral of Experts" (2024): 46.7B parameters, 12.9B active per token."""
    model = get_model("mixtral-8x7b")
    assert model.num_params() / 1e9 == pytest.approx(46.7, abs=0.05)
    assert model.active_params() / 1e9 == pytest.approx(12.9, abs=0.05)


def test_uniform_all_to_all_moves_2_k_n_d_elements_per_moe_layer_in_the_forward(run_yaml):
    frame = run_yaml(SCENARIO).timeline
    hidden, k = get_model("mixtral-8x7b").hidden, 2
    forward = frame[(frame["kind"] == "collective") & (frame["rank"] == 0)
                    & frame["key"].str.match(r"ep\.(dispatch|combine)\.fwd\.mb0\.vs0\.L0\.mlp\.")]
    assert len(forward) == 2
    assert float(forward["bytes"].sum()) == pytest.approx(2 * k * TOKENS * hidden * 2, rel=1e-12)
    flows = frame[(frame["kind"] == "flow") & (frame["src"] == 0) & frame["name"].isin(set(forward["key"]))]
    assert float(flows["bytes"].sum()) == pytest.approx((EP - 1) / EP * 2 * k * TOKENS * hidden * 2, rel=1e-12)


def test_ep_1_reports_no_all_to_all_bytes(run_yaml):
    """At ep 1 a rank routes its tokens to its own experts and no all-to-all runs, so the summary's bytes per
    layer are 0, not the 2 k n d of self-traffic the convention of ep > 1 counts on the diagonal, which read as
    network bytes; ep 8 keeps that convention (the same step's 2 k n d)."""
    hidden, k = get_model("mixtral-8x7b").hidden, 2
    one = run_yaml(SCENARIO, "parallelism.ep=1").summary
    assert one["moe"]["all_to_all_bytes_per_layer"] == 0.0 == one["traffic_bytes_per_gpu"]["ep"]
    assert run_yaml(SCENARIO).summary["moe"]["all_to_all_bytes_per_layer"] == pytest.approx(
        2 * k * TOKENS * hidden * 2, rel=1e-12)


def test_expert_gemms_are_sized_by_the_tokens_each_expert_receives(run_yaml):
    """Every rank runs the hottest EP rank's expert GEMMs (its step waits for that rank at the combine); its
    expert op records the FLOPs of the group's mean rank (EP 8 holds one expert a rank), what a GPU executes on
    average."""
    from simulator.config.loader import scenario_from_text
    from simulator.topology.loader import scenario_topology
    from simulator.workload.training import build_training_step

    result = run_yaml(SCENARIO, "model.moe.routing.balance=zipf")
    loads = result.summary["moe"]["expert_load_tokens"]
    hot = result.summary["moe"]["hottest_ep_rank"]
    frame = result.timeline
    op = frame[(frame["rank"] == 0) & (frame["name"] == "F0 L0.mlp experts")]
    model = get_model("mixtral-8x7b")
    per_token = 3 * 2 * model.hidden * model.moe.expert_ffn_hidden + 5 * model.moe.expert_ffn_hidden  # SwiGLU
    loaded = scenario_from_text(SCENARIO, "inline.yaml", ["model.moe.routing.balance=zipf"])
    blocks = build_training_step(loaded.scenario, scenario_topology(loaded)).plan.stages[0].blocks
    experts = next(block.experts for block in blocks if block.experts is not None)
    assert experts.forward_flops == pytest.approx(loads[hot] * per_token, rel=1e-12)
    assert experts.mean_load_share == pytest.approx(np.mean(loads) / loads[hot], rel=1e-12)
    assert experts.mean_load_share < 0.7
    assert float(op["flops"].sum()) == pytest.approx(np.mean(loads) * per_token, rel=1e-12)


def test_hfu_counts_what_the_gpus_execute_whatever_the_routing_skew(run_yaml):
    """Without drops the step's tokens make the same expert work however the router spreads them: the executed FLOPs per
    GPU (hardware_tflops_per_gpu x step time) of a Zipf-skewed step equal a uniform one's. Counting the hottest EP
    rank's experts on every GPU would make them 2.13 times more here (HFU 40.4% against MFU 27.8% on the bundled
    mixtral-8x7b-ep8, where it is 28.0%)."""
    def executed(summary):
        return summary["hardware_tflops_per_gpu"] * summary["step_time_s"]

    uniform = run_yaml(SCENARIO).summary
    skewed = run_yaml(SCENARIO, "model.moe.routing.balance=zipf").summary
    assert skewed["moe"]["dropped_token_fraction"] == 0.0 and skewed["moe"]["hottest_rank_load_over_mean"] > 1.5
    assert executed(skewed) == pytest.approx(executed(uniform), rel=1e-12)
    assert skewed["step_time_s"] > 1.2 * uniform["step_time_s"]


def _sample(capacity_factor: float, seed: int = 3):
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(ROUTING_STREAM,)))
    return sample_routing(RoutingConfig(balance="zipf", skew=1.0), 8, 2, capacity_factor, TOKENS, EP, rng)


def test_capacity_drops_what_the_routing_sample_implies(run_yaml):
    fractions = {}
    for cf in (1.0, 1.25):
        summary = run_yaml(SCENARIO, "model.moe.routing.balance=zipf", f"model.moe.capacity_factor={cf}").summary
        sample = _sample(cf)
        capacity = np.ceil(cf * TOKENS * 2 / 8)
        implied = np.maximum(sample.counts - capacity, 0).sum() / sample.counts.sum()
        assert summary["moe"]["dropped_token_fraction"] == pytest.approx(implied, rel=1e-12)
        fractions[cf] = implied
    assert fractions[1.0] > 0.1
    assert 0 < fractions[1.25] < fractions[1.0]
    assert run_yaml(SCENARIO, "model.moe.capacity_factor=1.0").summary["moe"]["dropped_token_fraction"] == 0.0


def test_mfu_counts_only_the_expert_work_the_capacity_kept_and_nominal_mfu_all_of_it(run_yaml):
    """CF 0.5, uniform routing: each expert keeps ceil(0.5 x 2048 x 2 / 8) = 256 of the 512 tokens each source rank
    sends it, half the token-expert assignments. The model FLOPs behind MFU lose half of the routed experts' 6 x
    layers x top_k x (one expert's weights) per token; `nominal_*` keeps top_k experts for every token. Dropping
    tokens shortens the step, so counting the dropped work would raise MFU to 1.7 x HFU; MFU stays at or below HFU
    (no recompute here: HFU adds only elementwise work and attention's full square)."""
    model = replace(get_model("mixtral-8x7b"), layers=2)
    gpus, tokens = 16, 8 * SEQ  # dp 8, one micro-batch of one sequence each
    nominal_per_token = 6 * (model.active_params() - model.embedding_params()) + 6 * 2 * model.hidden * SEQ
    kept_per_token = nominal_per_token - 0.5 * 6 * 2 * 2 * model.expert_params()
    dropped = run_yaml(SCENARIO, "model.moe.capacity_factor=0.5").summary
    step = dropped["step_time_s"]
    assert dropped["moe"]["dropped_token_fraction"] == 0.5
    assert dropped["tflops_per_gpu"] == pytest.approx(kept_per_token * tokens / gpus / step / 1e12, rel=1e-12)
    assert dropped["nominal_tflops_per_gpu"] == pytest.approx(nominal_per_token * tokens / gpus / step / 1e12,
                                                              rel=1e-12)
    assert dropped["mfu"] / dropped["nominal_mfu"] == pytest.approx(kept_per_token / nominal_per_token, rel=1e-12)
    assert dropped["mfu"] < dropped["hfu"] < dropped["nominal_mfu"]
    whole = run_yaml(SCENARIO).summary
    assert whole["nominal_mfu"] == whole["mfu"] and whole["nominal_tflops_per_gpu"] == whole["tflops_per_gpu"]
    assert whole["mfu"] > dropped["mfu"]


def test_same_seed_same_routing_other_seed_other_routing():
    assert np.array_equal(_sample(1.0).counts, _sample(1.0).counts)
    assert not np.array_equal(_sample(1.0).counts, _sample(1.0, seed=4).counts)


def test_skewed_routing_makes_the_step_slower_than_uniform(run_yaml):
    uniform = run_yaml(SCENARIO).summary
    skewed = run_yaml(SCENARIO, "model.moe.routing.balance=zipf").summary
    assert uniform["moe"]["hottest_rank_adds_s"] == 0.0
    assert skewed["moe"]["hottest_rank_load_over_mean"] > 1.5
    assert skewed["moe"]["hottest_rank_adds_s"] > 0.0
    assert skewed["step_time_s"] > 1.2 * uniform["step_time_s"]
    assert skewed["comm_s"]["ep"] > uniform["comm_s"]["ep"] > 0.0


def test_a_skew_under_uniform_routing_is_warned_of_as_changing_nothing(capsys):
    """`routing.skew: 2` beside `balance: uniform` routes every expert k n / E tokens all the same: it is warned of
    as the other fields that change nothing, where it is set."""
    from simulator.cli import main

    problem = ("balance uniform gives every expert exactly k n / E tokens whatever the skew (skew shapes zipf and "
               "dirichlet routing): it changes nothing")
    text = SCENARIO.replace("balance: uniform}", "balance: uniform, skew: 2}")
    loaded = scenario_from_text(text, "moe.yaml", [])
    assert loaded.ignored_by_uniform_routing() == (f"moe.yaml:6: model.moe.routing.skew: {problem}",)
    assert scenario_from_text(SCENARIO, "moe.yaml", []).ignored_by_uniform_routing() == ()
    assert scenario_from_text(text, "moe.yaml", ["model.moe.routing.balance=zipf"]).ignored_by_uniform_routing() == ()
    assert main(["validate", "mixtral-8x7b-ep8", "--set", "model.moe.routing.balance=uniform", "--quiet"]) == 0
    assert capsys.readouterr().err == ""  # the file's skew is its zipf routing's, which the --set made uniform
    assert main(["validate", "mixtral-8x7b-ep8", "--set", "model.moe.routing={balance: uniform, skew: 2}",
                 "--quiet"]) == 0
    assert capsys.readouterr().err == (f"warning: command line: trainsim validate: --set model.moe.routing={{balance: "
                                       f"uniform, skew: 2}}: model.moe.routing.skew: {problem}\n")


def test_a_sweep_over_balance_and_skew_is_not_warned_of_skew_under_uniform(tmp_path):
    """A grid over balance [uniform, zipf] x skew [1, 2] is not warned of at its uniform points: the point's
    balance is in the sweep's table, as a microbatches axis's value is. A skew axis
    under the file's uniform balance is still warned of."""
    from simulator.config.loader import LoadedScenario, validate_as_json
    from simulator.config.schema import Scenario
    from simulator.sweep.spec import sweep_from_text

    base = tmp_path / "moe.yaml"
    base.write_text(SCENARIO)

    def warned(grid: str) -> list[tuple[str, ...]]:
        sweep = sweep_from_text(f"base: {base}\ngrid:\n{grid}", "sw.yaml")
        return [LoadedScenario(validate_as_json(Scenario, point.data), sweep.base_source, sweep.base_lines,
                               point.overrides).ignored_by_uniform_routing() for point in sweep.points]

    assert warned("  model.moe.routing.balance: [uniform, zipf]\n  model.moe.routing.skew: [1, 2]\n") == [()] * 4
    assert [len(found) for found in warned("  model.moe.routing.skew: [1, 2]\n")] == [1, 1]


def test_folded_and_unfolded_expert_parallel_steps_agree(run_yaml):
    """Same step and the same traffic, all-to-alls under skewed routing included: the folded run reports the
    mean over its EP group's members (engine/plans.py `send_excess`), not its representative's row of the
    dispatch matrix (EP rank 0 sends more than the mean here, by 35%)."""
    overrides = ("parallelism.ep=4", "model.moe.routing.balance=zipf")
    folded = run_yaml(SCENARIO, *overrides).summary
    unfolded_run = run_yaml(SCENARIO, *overrides, "run.fold=false")
    unfolded = unfolded_run.summary
    assert folded["simulated_ranks"] == 1 and unfolded["simulated_ranks"] == 16
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-12)
    assert folded["traffic_bytes_per_gpu"] == pytest.approx(unfolded["traffic_bytes_per_gpu"], rel=1e-12)
    frame = unfolded_run.timeline
    ep_keys = set(frame.loc[(frame["kind"] == "collective") & (frame["category"] == "ep"), "key"])
    rank0 = frame[(frame["kind"] == "flow") & (frame["src"] == 0) & frame["name"].isin(ep_keys)]["bytes"].sum()
    assert float(rank0) > 1.3 * folded["traffic_bytes_per_gpu"]["ep"]


def test_all_to_all_pairs_carry_the_tokens_the_routing_sends_them(run_yaml):
    """Skewed routing: each (sender, receiver) transfer of the forward dispatch carries the tokens the sender
    routes to the receiver's experts, and the combine sends the transpose back; the pairs differ (hot spots)."""
    ep, hidden = 4, get_model("mixtral-8x7b").hidden
    frame = run_yaml(SCENARIO, f"parallelism.ep={ep}", "model.moe.routing.balance=zipf").timeline
    rng = np.random.default_rng(np.random.SeedSequence(3, spawn_key=(ROUTING_STREAM,)))
    pairs = sample_routing(RoutingConfig(balance="zipf", skew=1.0), 8, 2, None, TOKENS, ep, rng).pair_tokens(ep)
    group = (0, 2, 4, 6)  # EP block of rank 0 in its DP group (TP 2: DP ranks are every other GPU)
    for which, matrix in (("dispatch", pairs), ("combine", pairs.T)):
        key = frame.loc[frame["key"].str.match(rf"ep\.{which}\.fwd\.mb0\.vs0\.L0\.mlp\."), "key"].iloc[0]
        flows = frame[(frame["kind"] == "flow") & (frame["name"] == key)]
        sent = {(group.index(s), group.index(d)): b for s, d, b in zip(flows["src"], flows["dst"], flows["bytes"])
                if s in group and d in group}
        expected = {(i, j): matrix[i, j] * hidden * 2 for i in range(ep) for j in range(ep) if i != j}
        assert sent == pytest.approx(expected, rel=1e-12)
    assert pairs[~np.eye(ep, dtype=bool)].max() > 1.5 * pairs[~np.eye(ep, dtype=bool)].min()


@pytest.mark.parametrize(("overrides", "field", "problem"), [
    (["parallelism.ep=3"], "parallelism.ep", "does not divide the 8 experts"),
    (["parallelism.ep=8", "parallelism.tp=4"], "parallelism.ep", "does not divide dp x cp"),
    (["model.moe.top_k=9"], "model.moe.top_k", "top_k 9 is above the 8 experts"),
    (["model.moe.capacity_factor=0"], "model.moe.capacity_factor", "is not above 0"),
])
def test_bad_expert_settings_are_located_errors(validation_error, overrides, field, problem, assert_located):
    error = validation_error(SCENARIO, *overrides)
    assert_located(error, tuple(overrides), field, problem)


@pytest.mark.parametrize(("section", "expected"), [
    ("{experts: 64}", (64, 8, 2048, 1, None)),
    ("{capacity_factor: 1.25}", (256, 8, 2048, 1, 1.25)),
    ("{top_k: 4, shared_experts: 0, routing: {balance: zipf}}", (256, 4, 2048, 0, None)),
])
def test_a_moe_section_over_a_preset_keeps_the_fields_it_leaves_out(section, expected):
    """A field the section leaves out is the preset's: `moe: {experts: 64}` on deepseek-v3-style keeps
    its top-8 and its shared expert, and `moe: {capacity_factor: ...}` alone needs no `experts`."""
    from simulator.config.loader import scenario_from_text
    from simulator.workload.training import resolve_model

    text = f"cluster: {{topology: dgx-h100-cluster, nodes: 1}}\nmodel: {{preset: deepseek-v3-style, moe: {section}}}\n"
    moe = resolve_model(scenario_from_text(text, "inline.yaml").scenario).moe
    assert (moe.experts, moe.top_k, moe.expert_ffn_hidden, moe.shared_experts, moe.capacity_factor) == expected


@pytest.mark.parametrize(("preset", "ffn_hidden"), [("mixtral-8x7b", 14336), ("deepseek-v3-style", 18432)])
def test_moe_null_drops_a_presets_experts(preset, ffn_hidden):
    """`--set model.moe=null` drops the preset's experts, not only their routing: null is "no experts", the
    preset's dense twin with an `ffn_hidden`-wide MLP in every layer."""
    from simulator.config.loader import scenario_from_text
    from simulator.workload.training import resolve_model

    text = f"cluster: {{topology: dgx-h100-cluster, nodes: 1}}\nmodel: {{preset: {preset}}}\n"
    scenario = scenario_from_text(text, "inline.yaml", ["model.moe=null"]).scenario
    model = resolve_model(scenario)
    assert not scenario.model.has_experts()
    assert (model.moe, model.ffn_hidden, model.name) == (None, ffn_hidden, f"{preset} (dense)")
    assert model.num_params() == replace(get_model(preset), moe=None).num_params() < get_model(preset).num_params()


JOB = """
cluster: {topology: dgx-h100-cluster, nodes: 1}
model: {preset: mixtral-8x7b, layers: 2}
training: {seq_len: 2048, global_batch: 8, precision: bf16}
parallelism: {tp: 2, pp: 1, ep: 1, sequence_parallel: true, zero: 1}
run: {horizon: 2 h, replications: 1, seed: 0}
faults: {preset: llama3}
checkpoint: {interval: 30 min, mode: async}
restart: {detection: 2 min, reschedule: 3 min, launch: 5 min, warmup_steps: 10}
"""


def test_moe_null_is_a_value_that_dumps_digests_and_job_caches_see():
    """`moe: null` is a value (`experts_dropped`, dumped only when true), not known only from model_fields_set, which
    ==, model_dump and so the step cache's key and the manifest digest ignore: else a job of Mixtral's dense twin run
    after Mixtral's (or before) in one process would report the other's step time."""
    from simulator.config.loader import scenario_from_text
    from simulator.reliability.simulate import simulate_job
    from simulator.report.writers import scenario_digest

    def loaded(overrides):
        return scenario_from_text(JOB, "inline.yaml", overrides)

    moe, dense = loaded([]), loaded(["model.moe=null"])
    assert moe.scenario != dense.scenario
    assert scenario_digest(moe) != scenario_digest(dense)
    assert "experts_dropped" not in moe.scenario.model_dump()["model"]
    again = type(dense.scenario.model).model_validate(dense.scenario.model.model_dump())
    assert again == dense.scenario.model and not again.has_experts()
    steps = [simulate_job(job).summary["step_time_s"] for job in (moe, dense, loaded([]))]
    assert steps[0] == steps[2] > 1.1 * steps[1]


def test_experts_dropped_beside_a_moe_section_is_refused(validation_error, assert_located):
    error = validation_error(SCENARIO, "model.experts_dropped=true")
    assert_located(error, (), "model", "experts_dropped and a moe section contradict")


@pytest.mark.parametrize(("scenario", "field", "problem"), [
    ("llama3-8b-dgx-h100-eager-fsdp", "training.kernels", "eager kernels are modelled for dense layers"),
    ("parameter-server-vs-allreduce", "model.preset", "preset mixtral-8x7b is a mixture of experts"),
], ids=["eager", "parameter-servers"])
def test_a_presets_experts_are_refused_where_only_dense_layers_are_modelled_and_its_dense_twin_is_not(
        scenario, field, problem):
    """Eager kernels and parameter servers model dense layers: Mixtral's preset (experts of its own, no moe
    section) is refused at the field that asks for them; its dense twin (`moe: null`) loads, without experts."""
    from simulator.config.loader import load_scenario
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError) as info:
        load_scenario(scenario, ["model.preset=mixtral-8x7b"])
    assert (info.value.field, problem in info.value.problem) == (field, True)
    dense = load_scenario(scenario, ["model.preset=mixtral-8x7b", "model.moe=null"]).scenario
    assert dense.model.preset == "mixtral-8x7b" and not dense.model.has_experts()


def test_moe_null_leaves_no_experts_for_expert_parallelism(validation_error, assert_located):
    error = validation_error(SCENARIO, "model.moe=null")
    assert_located(error, (), "parallelism.ep", "ep 8 needs a model with experts")


@pytest.mark.parametrize(("text", "overrides", "field", "problem"), [
    (SCENARIO.replace("experts: 8, top_k: 2, ", ""), ["model.moe.experts=1"], "model.moe.experts",
     "1 experts are fewer than the preset's top_k 2"),
    (SCENARIO.replace("mixtral-8x7b", "llama3-8b").replace("experts: 8, ", ""), [], "model.moe.experts",
     "model.moe needs the number of experts"),
], ids=["below-top-k", "no-experts"])
def test_experts_missing_or_below_the_presets_top_k_are_located(validation_error, assert_located, text, overrides,
                                                                field, problem):
    assert_located(validation_error(text, *overrides), tuple(overrides), field, problem)


def test_expert_optimizer_state_is_sharded_over_the_expert_data_parallel_group():
    """Distributed optimizer over 64 DP ranks with EP 8: the routed experts' 12 B/param of optimizer state split
    over their 8 expert-data-parallel ranks, everything else over all 64 (Megatron-Core)."""
    from simulator.parallel.sharding import Sharding
    from simulator.workload.memory import rank_memory, routed_params
    from simulator.workload.transformer import ShardShape

    model = get_model("deepseek-v3-style")
    shard = ShardShape(1, 4096, 1, 1, False, dtype_bytes=2)
    breakdown = rank_memory(model, shard, layers=4, in_flight=1, sharding=Sharding(stage=1, degree=64),
                            first_stage=False, last_stage=False, ep=8)
    routed = routed_params(model, 4, 8)
    assert routed == 4 * 256 * 3 * 7168 * 2048 / 8
    dense = breakdown.params / 2 - routed
    assert breakdown.optimizer == pytest.approx(12 * routed / 8 + 12 * dense / 64, rel=1e-12)
    assert breakdown.grads == pytest.approx(4 * (routed + dense), rel=1e-12)  # bf16: the fp32 gradient buffer


def test_moe_activations_count_the_routed_tokens_and_their_experts_intermediates():
    """Per layer and micro-batch: the dense layer's terms without the MLP intermediates, plus for each routed
    token its dispatched copy (d h) and its expert's gated intermediates (3 d f_e), plus the shared expert's."""
    from dataclasses import replace

    from simulator.workload.memory import activation_bytes_per_layer
    from simulator.workload.transformer import ShardShape

    model = get_model("deepseek-v3-style")
    shard = ShardShape(1, 4096, 1, 1, False, dtype_bytes=2)
    dense = replace(model, moe=None)
    n, d, h, f_e, ffn = 4096, 2, model.hidden, model.moe.expert_ffn_hidden, model.ffn_hidden
    without_mlp = activation_bytes_per_layer(dense, shard, "selective") - n * 3 * d * ffn
    routed = 1.3 * 8 * n
    expected = without_mlp + routed * (d * h + 3 * d * f_e) + n * 3 * d * f_e
    assert activation_bytes_per_layer(model, shard, "selective", routed) == pytest.approx(expected, rel=1e-12)
    uniform = without_mlp + 8 * n * (d * h + 3 * d * f_e) + n * 3 * d * f_e
    assert activation_bytes_per_layer(model, shard, "selective") == pytest.approx(uniform, rel=1e-12)


def test_bundled_moe_scenarios_fit_in_memory():
    from simulator import load_scenario
    from simulator.preflight import validate
    from simulator.topology.loader import scenario_topology

    for name in ("deepseek-v3-style-1024-gpus", "mixtral-8x7b-ep8"):
        loaded = load_scenario(name)
        verdict = validate(loaded, scenario_topology(loaded))
        assert not verdict.memory["oom"], name


ZERO_BUBBLE = SCENARIO.replace("microbatches: 1", "microbatches: 4").replace(
    f"pp: 1, ep: {EP}", "pp: 2, ep: 4, pipeline: {schedule: zb-h1}")


def test_zero_bubble_weight_pass_splits_a_moe_block_into_its_experts_and_the_rest(run_yaml):
    """A W of a MoE block runs the hottest EP rank's experts' weight gradients (3 GEMMs of 2 h f per routed
    token), then the router's (2 n h E for this TP rank's n tokens), with no all-to-all; B (input gradients)
    and W together compute what the full backward of 1F1B does."""
    model = get_model("mixtral-8x7b")
    hidden, ffn, experts = model.hidden, model.moe.expert_ffn_hidden, 8
    result = run_yaml(ZERO_BUBBLE, "model.moe.routing.balance=zipf")
    frame = result.timeline
    moe = result.summary["moe"]
    mean_tokens = sum(moe["expert_load_tokens"]) / moe["ep"]  # an EP rank's mean, which its expert ops count
    compute = frame[(frame["kind"] == "compute") & (frame["microbatch"] == 0) & frame["name"].str.contains(" L1.mlp")]
    compute = compute[compute["rank"] == compute["rank"].min()]  # one of the stage's classes of hosts
    weight = compute[compute["category"] == "weight_grad"].set_index("name")
    assert list(weight.index) == ["W0 L1.mlp experts", "W0 L1.mlp"]
    assert weight.loc["W0 L1.mlp experts", "flops"] == pytest.approx(mean_tokens * 3 * 2 * hidden * ffn, rel=1e-12)
    assert weight.loc["W0 L1.mlp", "flops"] == pytest.approx(2 * TOKENS * hidden * experts, rel=1e-12)
    assert weight.loc["W0 L1.mlp experts", "end_s"] == weight.loc["W0 L1.mlp", "start_s"]
    all_to_alls = frame[(frame["kind"] == "collective") & frame["key"].str.startswith("ep.")]
    assert set(all_to_alls["key"].str.split(".").str[2]) == {"fwd", "bwi", "bwd"}
    full = run_yaml(ZERO_BUBBLE, "model.moe.routing.balance=zipf", "parallelism.pipeline.schedule=1f1b").timeline
    full_backward = full[(full["kind"] == "compute") & (full["microbatch"] == 0) & (full["category"] == "backward")
                         & full["name"].str.contains(" L1.mlp")]
    full_backward = full_backward[full_backward["rank"] == full_backward["rank"].min()]
    split = compute[compute["category"].isin(("backward", "weight_grad"))]
    assert float(split["flops"].sum()) == pytest.approx(float(full_backward["flops"].sum()), rel=1e-12)


def test_a_very_skewed_dirichlet_routes_every_token_without_a_numpy_warning():
    """Concentration 1/skew = 0.001 leaves experts with popularity 0 (log 0 = -inf) without numpy's 'divide by zero'
    RuntimeWarning on the user's terminal; every token still picks top_k experts."""
    import warnings

    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sample = sample_routing(RoutingConfig(balance="dirichlet", skew=1000.0), 8, 2, None, 512, 4, rng)
    assert sample.counts.sum() == 4 * 512 * 2
    assert (sample.counts <= 512).all()  # distinct experts per token: at most one pick of each per token


def test_expert_gradients_are_summed_over_the_tp_ranks_holding_the_same_experts():
    """Each TP rank holds its experts whole and runs them on its own tokens, so the expert-data-parallel group
    takes every TP coordinate (Megatron-Core's tp x dp x cp / ep ranks with expert TP 1): it held only the
    ranks of one TP coordinate, so the TP ranks' partial expert gradients were never summed and the
    distributed optimizer sharded expert state over tp times fewer ranks."""
    from simulator.parallel.experts import expert_dp_group, expert_sharding
    from simulator.parallel.layout import Layout
    from simulator.parallel.sharding import Sharding

    layout = Layout(tp=2, dp=8)
    group = expert_dp_group(layout, 0, 4)
    assert len(group) == 2 * 8 // 4 and set(layout.group("tp", 0)) <= set(group)
    assert all(expert_dp_group(layout, member, 4) == group for member in group)
    assert expert_sharding(Sharding(stage=1, degree=8), ep=4, tp=2).degree == 4


@pytest.mark.parametrize("overlap_param_gather", [False, True])
def test_distributed_optimizer_gathers_the_expert_parameters_it_updated_in_shards(run_yaml, overlap_param_gather):
    """ZeRO-1 reduce-scatters the routed experts' gradients over the expert-data-parallel group, so each rank updates
    only its shard of its experts: the updated parameters come back by an all-gather over that group (after the
    optimizer, or with ``overlap_param_gather`` at the next forward, before the experts run); without it 3/4 of the
    experts' parameters per rank here would never be gathered."""
    from simulator.parallel.experts import expert_dp_group
    from simulator.parallel.layout import Layout

    result = run_yaml(SCENARIO, "parallelism.ep=4", "parallelism.zero=1",
                      f"parallelism.ddp.overlap_param_gather={str(overlap_param_gather).lower()}")
    frame = result.timeline
    ops = frame[(frame["kind"] == "collective") & (frame["rank"] == 0)]
    reduced = ops[ops["name"] == "reduce_scatter expert grads"]
    gathered = ops[ops["name"] == "all_gather expert params"]
    assert len(gathered) == (2 if overlap_param_gather else 1)  # one per MoE block, or one after the optimizer
    model = get_model("mixtral-8x7b")
    expert_params = 2 * 2 * 3 * model.hidden * model.moe.expert_ffn_hidden  # 2 layers x 2 experts a rank (8 / 4)
    assert float(gathered["bytes"].sum()) == pytest.approx(expert_params * 2, rel=1e-12)  # bf16
    assert float(reduced["bytes"].sum()) == pytest.approx(expert_params * 4, rel=1e-12)  # fp32 gradients
    group = expert_dp_group(Layout(tp=TP, dp=8), 0, 4)
    flows = frame[(frame["kind"] == "flow") & (frame["src"] == 0) & frame["name"].isin(set(gathered["key"]))]
    assert float(flows["bytes"].sum()) == pytest.approx((len(group) - 1) / len(group) * expert_params * 2, rel=1e-12)
    experts = frame[(frame["rank"] == 0) & (frame["name"] == "F0 L0.mlp experts")]
    if overlap_param_gather:
        assert float(experts["start_s"].iloc[0]) >= float(gathered["end_s"].min())
    else:
        step = frame[(frame["rank"] == 0) & (frame["name"] == "optimizer step")]
        assert float(gathered["start_s"].iloc[0]) >= float(step["end_s"].iloc[0])


@pytest.mark.parametrize("overlap_param_gather", [False, True])
def test_expert_parameters_are_gathered_when_tp_alone_forms_the_expert_data_parallel_group(run_yaml,
                                                                                         overlap_param_gather):
    """With dp = cp = 1 and tp 8 the expert-data-parallel group is the TP group: ZeRO-1 reduce-scatters the
    experts' gradients over it, so their parameters must come back by an all-gather whether or not it overlaps
    the next forward. The gather after the optimizer sat under the dense DP guard and was skipped."""
    result = run_yaml(SCENARIO, "cluster.nodes=1", "parallelism.tp=8", "parallelism.ep=1", "parallelism.dp=1",
                      "parallelism.zero=1",
                      f"parallelism.ddp.overlap_param_gather={str(overlap_param_gather).lower()}")
    frame = result.timeline
    ops = frame[(frame["kind"] == "collective") & (frame["rank"] == 0)]
    reduced = ops[ops["name"] == "reduce_scatter expert grads"]
    gathered = ops[ops["name"] == "all_gather expert params"]
    model = get_model("mixtral-8x7b")
    expert_params = 2 * 8 * 3 * model.hidden * model.moe.expert_ffn_hidden  # 2 layers x 8 experts, whole per rank
    assert float(reduced["bytes"].sum()) == pytest.approx(expert_params * 4, rel=1e-12)  # fp32 gradients
    assert float(gathered["bytes"].sum()) == pytest.approx(expert_params * 2, rel=1e-12)  # bf16 parameters


def test_zero_3_keeps_the_experts_weights_whole_and_gathers_what_their_optimizer_updated(run_yaml):
    """The step never gathers a routed expert's weights before its GEMMs and reduce-scatters the experts'
    gradients once, after the last micro-batch, so under ZeRO-3 the experts' weights and gradients are whole
    on every rank and only their optimizer state is sharded; the updated shards are all-gathered after the
    optimizer. Memory sharded their weights over the expert-data-parallel group at ZeRO-3 (and gradients at
    ZeRO-2) while no gather ever brought them back: mixtral-8x7b-ep8 at zero: 3 held 2.7 GiB of weights per
    GPU instead of 10.6."""
    from simulator.parallel.sharding import Sharding
    from simulator.workload.memory import rank_memory, routed_params
    from simulator.workload.transformer import ShardShape

    model = get_model("deepseek-v3-style")
    shard = ShardShape(1, 4096, 1, 1, False, dtype_bytes=2)
    breakdown = rank_memory(model, shard, layers=4, in_flight=1, sharding=Sharding(stage=3, degree=64),
                            first_stage=False, last_stage=False, ep=8)
    routed = routed_params(model, 4, 8)
    whole = rank_memory(model, shard, layers=4, in_flight=1, first_stage=False, last_stage=False, ep=8)
    dense = whole.params / 2 - routed
    assert breakdown.params == pytest.approx(2 * (routed + dense / 64), rel=1e-12)
    assert breakdown.grads == pytest.approx(4 * (routed + dense / 64), rel=1e-12)
    assert breakdown.optimizer == pytest.approx(12 * (routed / 8 + dense / 64), rel=1e-12)

    frame = run_yaml(SCENARIO, "parallelism.ep=4", "parallelism.zero=3").timeline
    ops = frame[(frame["kind"] == "collective") & (frame["rank"] == 0)]
    gathered = ops[ops["name"] == "all_gather expert params"]
    step = frame[(frame["rank"] == 0) & (frame["name"] == "optimizer step")]
    mixtral = get_model("mixtral-8x7b")
    assert float(gathered["bytes"].sum()) == pytest.approx(2 * 2 * 3 * mixtral.hidden * mixtral.moe.expert_ffn_hidden
                                                           * 2, rel=1e-12)
    assert float(gathered["start_s"].iloc[0]) >= float(step["end_s"].iloc[0])


def test_expert_optimizer_state_is_sharded_over_tp_when_dp_and_cp_are_one(run_yaml):
    """dp = cp = 1 with tp 8 under ZeRO-1: the step reduce-scatters the experts' gradients over the TP-formed
    expert-data-parallel group and updates an eighth of them per rank, so the memory holds an eighth of their
    optimizer state. The memory model dropped ZeRO whenever dp x cp was 1 and counted it whole (32.0 GiB)."""
    summary = run_yaml(SCENARIO, "cluster.nodes=1", "parallelism.tp=8", "parallelism.ep=1", "parallelism.dp=1",
                       "parallelism.zero=1").summary
    unsharded = run_yaml(SCENARIO, "cluster.nodes=1", "parallelism.tp=8", "parallelism.ep=1", "parallelism.dp=1",
                         "parallelism.zero=0").summary
    model = get_model("mixtral-8x7b")
    routed = 2 * 8 * 3 * model.hidden * model.moe.expert_ffn_hidden  # 2 layers x 8 experts, whole on every rank
    saved = unsharded["memory_per_stage"][0]["optimizer_gib"] - summary["memory_per_stage"][0]["optimizer_gib"]
    assert saved * 2**30 == pytest.approx(12 * routed * 7 / 8, rel=1e-9)


def test_a_huge_micro_batch_routes_a_bounded_sample_scaled_to_all_its_tokens(monkeypatch):
    """A billion tokens per rank would draw Gumbel keys for hours: a rank draws at most MAX_ROUTING_KEYS // experts
    tokens and scales the counts: with a budget of 8 x 512 keys over 8 experts, 512 tokens are drawn and the counts
    are exactly (10,000 / 512) x that draw's, summing to 10,000 tokens x top 2 per rank. At or below the budget
    nothing is scaled: the draw is the full sample (the same generator state gives the same counts)."""
    import simulator.workload.routing as routing

    monkeypatch.setattr(routing, "MAX_ROUTING_KEYS", 8 * 512)
    zipf = RoutingConfig(balance="zipf", skew=1.0)
    scaled = sample_routing(zipf, 8, 2, None, 10_000, 4, np.random.default_rng(5)).counts
    drawn = sample_routing(zipf, 8, 2, None, 512, 4, np.random.default_rng(5)).counts
    assert drawn.sum(axis=1).tolist() == [512 * 2] * 4
    assert scaled == pytest.approx(drawn * (10_000 / 512), rel=1e-12)
    assert scaled.sum(axis=1) == pytest.approx([10_000 * 2] * 4, rel=1e-12)


def test_fsdp_fp32_shards_optimizer_charges_experts_the_state_memory_holds_for_them():
    """Under PyTorch FSDP's fp32 shards (full_shard) the dense parameters are fp32 shards updated in place (32 B
    per parameter with Adam), and so are the routed experts, fully sharded over the ranks holding them as
    torchtitan shards them (here tp1 dp8 ep8: one rank holds each expert, so a one-rank shard, whole): 4 + 4 +
    8 B of state each, updated at 32 B. They kept 16-bit weights whole with an fp32 master (2 + 4 + 12 B, 38 B
    to update) as Megatron-Core's distributed optimizer does, memory and the optimizer's charge alike (one DGX
    H100, 8 experts top-2)."""
    from simulator.config.loader import scenario_from_text
    from simulator.topology.loader import scenario_topology
    from simulator.workload.calibrated import calibrated_efficiency
    from simulator.workload.memory import rank_params, routed_params
    from simulator.workload.memory_plan import stage_memory
    from simulator.workload.training import build_training_step

    text = """
cluster: {topology: dgx-h100}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000, moe: {experts: 8, top_k: 2}}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 1, dp: 8, ep: 8, fsdp: full_shard}
"""
    loaded = scenario_from_text(text, "inline.yaml", [])
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    (memory, _), = stage_memory(loaded.scenario, step)
    assert step.model is not None
    routed = routed_params(step.model, 4, 8)
    dense = rank_params(step.model, 1, 4, first_stage=True, last_stage=True, ep=8) - routed
    assert memory.params == pytest.approx(dense * 4 / 8 + routed * 4, rel=1e-12)
    assert memory.optimizer == pytest.approx(dense * 8 / 8 + routed * 8, rel=1e-12)
    bandwidth = step.gpu.hbm_bandwidth * calibrated_efficiency(step.gpu.name, "bf16").memory_peak
    assert step.plan.optimizer_s[0] * bandwidth == pytest.approx(dense / 8 * 32 + routed * 32, rel=1e-12)


@pytest.mark.parametrize(("override", "framework", "supported"), [
    ("parallelism.sequence_parallel=false", "Megatron-Core, whose MoE placement the step follows, refuses to train it",
     "sequence_parallel: true, or tp: 1"),
    ("parallelism.zero=3", "DeepSpeed, whose ZeRO-3 this is, refuses it", "fsdp: full_shard")])
def test_a_moe_layout_no_framework_trains_is_warned_at_its_field(override, framework, supported):
    """MoE with tp > 1 and no sequence parallelism (Megatron-Core's MoELayer raises in training) and DeepSpeed's
    ZeRO-3 with experts (its engine asserts 'MoE not supported with Stage 3') are layouts no framework trains:
    each is warned at its field with the route that trains, and the step still runs."""
    from simulator import load_scenario
    from simulator.simulation import scenario_warnings
    from simulator.topology.loader import scenario_topology

    loaded = load_scenario("mixtral-8x7b-ep8", [override])
    warnings = scenario_warnings(loaded, scenario_topology(loaded))
    assert len(warnings) == 1
    assert warnings[0].startswith(f"--set {override}: ")
    assert framework in warnings[0]
    assert f"(allowed: {supported}" in warnings[0]
    for fine in (load_scenario("mixtral-8x7b-ep8"),
                 load_scenario("mixtral-8x7b-ep8", ["parallelism.sequence_parallel=false", "parallelism.tp=1"])):
        assert scenario_warnings(fine, scenario_topology(fine)) == ()


def test_a_capacity_that_drops_more_than_half_the_assignments_warns_with_the_share(run_yaml):
    """Uniform routing, 512 assignments per expert and source rank: CF 0.5 keeps 256 (half dropped, at the
    threshold: no warning), CF 0.4 keeps ceil(0.4 x 2048 x 2 / 8) = 205, dropping 1 - 205/512 = 60.0%."""
    def dropping(summary: dict) -> list[str]:
        return [line for line in summary["warnings"] if "token-expert assignments" in line]

    assert dropping(run_yaml(SCENARIO, "model.moe.capacity_factor=0.5").summary) == []
    warned = dropping(run_yaml(SCENARIO, "model.moe.capacity_factor=0.4").summary)
    assert len(warned) == 1 and ("model.moe.capacity_factor=0.4: the capacity (205 assignments per expert and "
                                 "source rank) drops 60.0% of the token-expert assignments, more than 50%") in warned[0]
