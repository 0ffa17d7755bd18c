"""`training.kernels: eager` with `parallelism.fsdp: full_shard`: PyTorch FSDP2's fully_shard as torchtitan runs it
(MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), no autocast), checked by hand on a small decoder:
the traffic per GPU, the copies around each all-gather and the gradient copies, the layer's kernels, the memory
parts and the refusals (docs/cost-model.md, "PyTorch eager", "Under FSDP")."""

from __future__ import annotations

import pytest
from shared import GIB

from simulator import load_scenario, simulate
from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import get_model
from simulator.cli import main
from simulator.config.loader import scenario_from_text
from simulator.errors import InputError
from simulator.simulation import network_settings
from simulator.sweep.layouts import CollectiveTimes, copy_outs_s, estimate_step_s
from simulator.topology.loader import scenario_topology
from simulator.workload.calibrated import calibrated_efficiency, contention_share
from simulator.workload.eager import eager_embedding_kernels, eager_head_kernels, eager_layer_kernels
from simulator.workload.memory import activation_bytes_per_layer
from simulator.workload.memory_plan import wrapped_units
from simulator.workload.training import build_training_step, resolve_model
from simulator.workload.transformer import AttentionCost, ShardShape

FSDP = """description: a small decoder on one DGX H100, PyTorch FSDP2 in eager
cluster: {topology: dgx-h100}
model: {layers: 4, hidden: 1024, heads: 16, vocab: 32000}
training: {seq_len: 2048, global_batch: 32, micro_batch: 4, precision: bf16, kernels: eager}
parallelism:
  dp: 8
  fsdp: full_shard
"""
"""Eight FSDP ranks of a 116M decoder (4 layers of 12,584,960 parameters, an untied 32,000-row table and output
layer), one micro-batch per step."""
RANKS = 8
TOKENS = 4 * 2048


def fsdp_summary(*overrides: str) -> dict:
    return simulate(scenario_from_text(FSDP, source="fsdp.yaml", overrides=list(overrides))).summary


def params() -> tuple[float, float, float]:
    """(all parameters N, one layer's, the head unit's: final norm and output layer)."""
    model = resolve_model(scenario_from_text(FSDP, source="fsdp.yaml").scenario)
    total = model.num_params()
    return total, model.layer_params(), total - model.layers * model.layer_params() - model.embedding_params()


@pytest.mark.parametrize(("overrides", "reduce_bytes", "microbatches"), [
    ((), 4, 1),
    (("training.grad_reduce_dtype=bf16",), 2, 1),
    (("training.global_batch=64",), 4, 2),
])
def test_each_gpu_sends_the_16_bit_gathers_and_the_reduce_dtypes_reduce_scatters(overrides, reduce_bytes,
                                                                                  microbatches):
    """Per micro-batch every unit is all-gathered in 16 bits for the forward and again for the backward (reshard
    after forward), but the head, which stays gathered from its forward to its backward, and reduce-scattered
    once in the reduce dtype: (n - 1)/n x (2 B x (N + N - head) + 4 B x N) with fp32 reduce, 2 B with bf16
    (753,792,256 B per GPU for one micro-batch at fp32)."""
    total, _, head = params()
    ring = (RANKS - 1) / RANKS
    expected = microbatches * ring * (2 * (total + total - head) + reduce_bytes * total)
    assert fsdp_summary(*overrides)["traffic_bytes_per_gpu"]["dp"] == pytest.approx(expected, rel=1e-12)
    if not overrides:
        assert expected == 753_792_256


def test_the_copies_around_each_gather_and_the_reduce_scatters_input_by_hand():
    """FSDP2's copies, memory-bound at the H100's HBM rate: before each gather of a layer (12,584,960 parameters)
    its fp32 shard cast to bf16 and copied into the all-gather input, (4 + 2 + 2 + 2) B / 8 per parameter, on
    FSDP2's copy-in stream; after it the copy-out of the whole output into the unsharded parameters, 2 + 2 B, on
    the compute stream; after each block's backward chunk_cat's cast of its fresh bf16 gradient into the fp32
    reduce-scatter input, 2 + 4 B (the MLP block: two linears and its norm's weight, 8,389,632 parameters). The
    fused kernels keep the same fp32 shards (FSDP2's, whatever the kernels): the same copy-in and copy-out."""
    timeline = simulate(scenario_from_text(FSDP, source="fsdp.yaml")).timeline
    ops = timeline[(timeline["rank"] == 0) & (timeline["kind"] == "compute")]
    seconds = dict(zip(ops["name"], ops["end_s"] - ops["start_s"], strict=False))
    _, layer, _ = params()
    rate = get_gpu("h100-sxm").hbm_bandwidth * calibrated_efficiency("h100-sxm").memory_peak
    assert seconds["fsdp copy-in L0"] == pytest.approx(layer * 10 / RANKS / rate, rel=1e-9)
    assert seconds["fsdp copy-out L0"] == pytest.approx(layer * 4 / rate, rel=1e-9)
    stream = dict(zip(ops["name"], ops["stream"], strict=False))
    assert (stream["fsdp copy-in L0"], stream["fsdp copy-out L0"]) == ("fsdp_copy_in", "compute")
    mlp = 2 * 1024 * 4096 + 1024
    assert seconds["fsdp grad copy mb0 L0.mlp"] == pytest.approx(mlp * 6 / rate, rel=1e-9)
    fused = simulate(scenario_from_text(FSDP, source="fsdp.yaml", overrides=["training.kernels=fused"])).timeline
    fused = fused[(fused["rank"] == 0) & (fused["kind"] == "compute")]
    fused_seconds = dict(zip(fused["name"], fused["end_s"] - fused["start_s"], strict=False))
    # fp32 shards under fused kernels too: the same cast before the copy into the all-gather input.
    assert fused_seconds["fsdp copy-in L0"] == pytest.approx(seconds["fsdp copy-in L0"], rel=1e-12)
    assert fused_seconds["fsdp copy-out L0"] == pytest.approx(seconds["fsdp copy-out L0"], rel=1e-12)


def test_the_layers_run_in_16_bits_without_autocasts_casts():
    """Without autocast the layer has no weight, bias, input or weight-gradient cast and no AccumulateGrad add;
    the norms read and write 16 bits (2 x 2 B per element forward), the residual add reads two 16-bit tensors
    and writes one (6 B) and its backward adds the skip's gradient (6 B) with no cast after it; the loss still
    runs on logits.float(), and the embedding table and its gradient are 16-bit."""
    model = get_model("llama3-8b")
    shard = ShardShape(1, 4096, eager=True, fsdp_weights=True, framework_copies=True, fused_grad_accumulation=False)
    layer = eager_layer_kernels(model, shard, "none", AttentionCost.for_kernel("flash"))
    kernels = {k.name: k for k in (*layer.forward, *layer.backward_input, *layer.backward_weight)}
    assert not [name for name in kernels if "cast" in name or "accumulate" in name]
    elements = 4096 * model.hidden
    assert kernels["input_norm"].hbm_bytes == 2 * 2 * elements
    assert kernels["attn_residual"].hbm_bytes == 6 * elements
    assert kernels["attn_residual.bwd"].hbm_bytes == 6 * elements
    head = eager_head_kernels(model, shard)
    casts = [k.name for k in (*head.forward, *head.backward_input, *head.backward_weight) if "cast" in k.name]
    assert casts == ["cross_entropy.cast", "cross_entropy.cast.bwd"]
    embedding = eager_embedding_kernels(model, shard)
    zero = next(k for k in embedding.backward_weight if k.name == "embedding.grad_zero")
    assert zero.hbm_bytes == 2 * model.vocab * model.hidden
    autocast = ShardShape(1, 4096, eager=True)
    assert {k.name for k in eager_layer_kernels(model, autocast, "none", AttentionCost.for_kernel("flash")).forward
            if k.name.endswith(".cast_weight")}


def test_memory_parts_per_gpu_by_hand():
    """fp32 shards of the weights and gradients and Adam's fp32 moments over 8 ranks (4 N / 8, 4 N / 8, 8 N / 8);
    FSDP's buffers at their peak, the head's post-backward: layer 3 prefetched (2 B x 12,584,960), the head's
    16-bit gradients and their fp32 reduce-scatter input (2 + 4 B x 32,769,024): 221,784,064 B. The embedding's
    backward peaks lower, max(4 T + 4 L, 6 T) = 196,608,000 B: FSDP2 reshards a unit, then drops the previous
    reduce-scatter input, then allocates the next, so its parameters with both inputs (2 T + 4 (T + L) =
    246,947,840 B) never exist. Beyond the fused FSDP step's activations only the loss's fp32
    tensors (14 - 4 B per logit), the layers saving no weight copy and a 16-bit stream."""
    total, layer, head = params()
    memory = fsdp_summary()["memory_breakdown_gib"]
    assert (memory["params"], memory["grads"], memory["optimizer"]) == pytest.approx(
        (4 * total / RANKS / GIB, 4 * total / RANKS / GIB, 8 * total / RANKS / GIB), rel=1e-12)
    table = 32000 * 1024
    assert memory["buffers"] * GIB == pytest.approx(2 * layer + 6 * head, rel=1e-12)
    assert 2 * layer + 6 * head == 221_784_064
    assert max(4 * table + 4 * layer, 6 * table) == 196_608_000
    fused = fsdp_summary("training.kernels=fused")["memory_breakdown_gib"]
    assert (memory["activations"] - fused["activations"]) * GIB == pytest.approx(10 * TOKENS * 32000, rel=1e-12)
    reduced_in_bf16 = fsdp_summary("training.grad_reduce_dtype=bf16")["memory_breakdown_gib"]
    assert reduced_in_bf16["grads"] == memory["grads"]


def test_a_gated_fsdp_layer_keeps_silus_output_but_no_weight_copies():
    """Llama 3 8B, one layer, 2,048 tokens: under FSDP eager keeps, beyond the fused count, SiLU's output alone
    (2 B x T x 14,336); autocast's fp32 norm inputs and 16-bit weight copies are not there."""
    model, tokens = get_model("llama3-8b"), 2048
    extra = (activation_bytes_per_layer(model, ShardShape(1, tokens, eager=True, fsdp_weights=True))
             - activation_bytes_per_layer(model, ShardShape(1, tokens)))
    assert extra == 2 * tokens * 14336


@pytest.mark.parametrize(("override", "field", "names"), [
    ("parallelism.fsdp=shard_grad_op", "parallelism.fsdp", "full_shard or hybrid_shard"),
    ("parallelism.fsdp=no_shard", "parallelism.fsdp", "full_shard or hybrid_shard"),
    ("parallelism.zero=1", "parallelism.zero", "fsdp: full_shard"),
])
def test_eager_refuses_the_sharding_it_does_not_model_naming_full_shard(override, field, names):
    overrides = [override] + (["parallelism.fsdp=null"] if "zero" in override else [])
    with pytest.raises(InputError) as refused:
        scenario_from_text(FSDP, source="fsdp.yaml", overrides=overrides)
    assert refused.value.field == field
    assert names in refused.value.allowed


def test_a_16_bit_reduce_is_fsdps_and_refused_without_it():
    scenario_from_text(FSDP, source="fsdp.yaml", overrides=["training.grad_reduce_dtype=bf16"])
    with pytest.raises(InputError) as refused:
        scenario_from_text(FSDP, source="fsdp.yaml", overrides=["training.grad_reduce_dtype=bf16",
                                                                 "parallelism.fsdp=null"])
    assert refused.value.field == "training.grad_reduce_dtype"
    assert "fsdp: full_shard" in refused.value.allowed


def test_a_refusal_is_one_line_with_file_line_and_field_and_exit_2(tmp_path, capsys):
    path = tmp_path / "fsdp.yaml"
    path.write_text(FSDP.replace("fsdp: full_shard", "fsdp: shard_grad_op"))
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert f"{path}:7" in lines[0] and "parallelism.fsdp" in lines[0]


def test_pipelined_fsdp_stages_hand_on_a_16_bit_stream_and_fold_exactly():
    """Under FSDP the residual stream is 16-bit, so pipeline hand-offs send what the fused step's do (eager DDP's
    fp32 stream sends twice that); the folded run (one rank per stage) equals the unfolded one."""
    pipelined = ("parallelism.pp=2", "parallelism.dp=4", "training.global_batch=64")
    eager = fsdp_summary(*pipelined)
    assert eager["traffic_bytes_per_gpu"]["pp"] > 0
    assert eager["traffic_bytes_per_gpu"]["pp"] == fsdp_summary(*pipelined, "training.kernels=fused")[
        "traffic_bytes_per_gpu"]["pp"]
    assert eager["step_time_s"] == fsdp_summary(*pipelined, "run.fold=false")["step_time_s"]


@pytest.mark.parametrize(("overrides", "group"), [
    (("parallelism.dp=1", "cluster.gpus=1", "training.global_batch=4"), "dp x cp = 1"),
    (("cluster.topology=dgx-h100-cluster", "cluster.nodes=2", "model.layers=8", "parallelism.pp=8", "parallelism.dp=2",
      "parallelism.fsdp=hybrid_shard"), "in its NVLink domain = 1"),
])
def test_eager_fsdp_over_a_one_rank_shard_group_is_refused(overrides, group):
    """torchtitan applies fully_shard only over more than one rank, else it trains under autocast; a one-rank shard
    group (one data-parallel rank, or HSDP with one of them per host) would drop autocast's costs and charge none of
    FSDP's (the H200 step 13.123 ms against eager DDP's 14.670 ms), so it is refused."""
    with pytest.raises(InputError) as refused:
        fsdp_summary(*overrides)
    assert refused.value.field == "parallelism.fsdp"
    assert group in refused.value.problem
    assert "dp x cp > 1" in refused.value.allowed


def test_the_copy_in_is_a_copy_in_its_pass_not_communication():
    """FSDP2's copy-in is an HBM copy on its own stream: counted in the forward or backward it gathers for, as the
    copy-out and the gradient copies are, so the data-parallel communication is the collectives alone (counting the
    copy-ins, comm_s.dp of Llama 3 8B eager FSDP would read 619.5 ms against the fused step's 606.6)."""
    timeline = simulate(scenario_from_text(FSDP, source="fsdp.yaml")).timeline
    copy_ins = timeline[timeline["name"].str.startswith("fsdp copy-in")]
    assert len(copy_ins) > 0
    assert set(copy_ins["category"]) == {"forward", "backward"}
    assert set(timeline[timeline["category"] == "dp"]["kind"]) == {"collective"}


@pytest.mark.parametrize(("override", "field", "says"), [
    ("parallelism.tp=2", "parallelism.tp", "plain DDP or FSDP"),
    ("parallelism.cp=2", "parallelism.cp", "plain DDP or FSDP"),
    ("training.precision=fp32", "training.kernels", "FSDP's param_dtype"),
])
def test_eager_fsdps_refusals_name_fsdp_not_autocast_alone(override, field, says):
    """Under FSDP there is no autocast: the tp/cp and precision refusals say what eager models with FSDP too."""
    with pytest.raises(InputError) as refused:
        scenario_from_text(FSDP, source="fsdp.yaml", overrides=[override])
    assert refused.value.field == field
    assert says in refused.value.problem


def test_the_searchs_estimate_charges_eager_fsdps_copy_outs_as_the_program_does():
    """The search's estimate takes FSDP2's copy-outs from the bytes the program builder charges them with (copy_outs_s,
    Sharding.gather_copy_bytes): the same seconds per step as rank 0's copy-out ops, the fp32 shards' included; and
    its step time for Llama 3 8B eager FSDP (dp 8) comes within 1.5% of the simulated one (without the copies 3.3%
    short, 74,896 against 72,403 tokens/s)."""
    loaded = load_scenario("llama3-8b-dgx-h100-eager-fsdp")
    topology = scenario_topology(loaded)
    step = build_training_step(loaded.scenario, topology)
    result = simulate(loaded)
    timeline = result.timeline
    ops = timeline[(timeline["rank"] == 0) & timeline["name"].str.startswith("fsdp copy-out")]
    units = wrapped_units(step, 0)
    per_microbatch = sum(sum(copy_outs_s(step.plan, params, head=index == len(units) - 1))
                         for index, params in enumerate(units))
    assert step.plan.microbatches * per_microbatch == pytest.approx((ops["end_s"] - ops["start_s"]).sum(), rel=1e-9)
    estimate_s = estimate_step_s(step, CollectiveTimes(topology, network_settings(loaded, topology)),
                                 contention_share(loaded.scenario.collectives.sm_contention, step.gpu.name))
    assert estimate_s == pytest.approx(result.summary["step_time_s"], rel=0.015)
