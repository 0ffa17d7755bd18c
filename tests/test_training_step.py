"""A training step end to end: pipeline bubbles, TP traffic, DDP overlap, memory and layouts, with expected
values from the closed forms and the seed chapters (see tests/data and the reference figures quoted here)."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate
from simulator.catalog.models import get_model
from simulator.config.loader import scenario_from_text
from simulator.errors import ScenarioError
from simulator.schedules.registry import build_schedule

SYNTHETIC = """
cluster: {{topology: dgx-h100-cluster, nodes: 1}}
model: {{synthetic: {{stages: {p}, forward: 1 ms, backward: 2 ms}}}}
training: {{microbatches: {m}}}
parallelism: {{pp: {p}, dp: {dp}, pipeline: {{schedule: {schedule}, virtual_stages: {v}}}}}
"""


def synthetic(run_yaml, p, m, schedule="1f1b", v=1):
    return run_yaml(SYNTHETIC.format(p=p, m=m, dp=8 // p, schedule=schedule, v=v))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("factor", [1, 2, 4])
def test_bubble_fraction_equals_closed_form(run_yaml, schedule, p, factor):
    m = p * factor
    result = synthetic(run_yaml, p, m, schedule)
    expected = (p - 1) / (m + p - 1)
    assert result.summary["bubble_fraction"] == pytest.approx(expected, rel=1e-3)
    assert result.summary["step_time_s"] == pytest.approx((m + p - 1) * 3e-3, rel=1e-9)


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 4), (8, 2)])
@pytest.mark.parametrize("factor", [1, 2, 4])
def test_interleaved_bubble_equals_closed_form(run_yaml, p, v, factor):
    m = p * factor
    result = synthetic(run_yaml, p, m, "interleaved", v)
    assert result.summary["bubble_fraction"] == pytest.approx((p - 1) / (m * v + p - 1), rel=1e-3)


@pytest.mark.parametrize("p,m,v,expected", [
    (4, 8, 1, 0.273),   # seed 003: 3/11
    (8, 32, 1, 0.179),  # seed 000: 7/39
    (8, 128, 1, 0.052),  # seed 000: 7/135
    (8, 32, 2, 0.099),  # seed 000: 7/71
    (8, 32, 4, 0.052),  # seed 000 Q3: 7/135
])
def test_seed_bubble_cases(run_yaml, p, m, v, expected):
    result = synthetic(run_yaml, p, m, "interleaved" if v > 1 else "1f1b", v)
    assert result.summary["bubble_fraction"] == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zb_h1_idle_time_is_p_minus_1_times_f_plus_b_minus_w(run_yaml, p):
    m = 2 * p
    result = synthetic(run_yaml, p, m, "zb-h1")
    f, b_input, w = 1e-3, 1e-3, 1e-3  # backward 2 ms splits evenly into input-grad and weight-grad
    idle = result.summary["step_time_s"] - m * (f + b_input + w)
    assert idle == pytest.approx((p - 1) * (f + b_input - w), rel=1e-6)


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_each_stage_runs_its_schedule_in_order(run_yaml, schedule, v):
    result = synthetic(run_yaml, 4, 8, schedule, v)
    frame = result.timeline
    compute = frame[(frame["kind"] == "compute") & (frame["stream"] == "compute")
                    & frame["category"].isin(["forward", "backward", "weight_grad"])]
    expected = build_schedule(schedule, 4, 8, v)
    for stage in range(4):
        rows = compute[compute["rank"] == stage].sort_values("start_s", kind="stable")
        letters = [name.split()[0] for name in rows["name"]]
        wanted = [("B" if a.kind == "BW" else "Bi" if a.kind == "B" else a.kind) + str(a.microbatch)
                  for a in expected[stage]]
        assert letters == wanted


LLAMA_8B_DP8 = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 1, pp: 1, dp: 8, zero: 0}
"""


@pytest.mark.parametrize("zero,expected_gb", [(0, 128.5), (1, 44.2), (2, 30.1), (3, 16.1)])
def test_model_state_memory_matches_seed_003(run_yaml, zero, expected_gb):
    """Seed 003: Llama-3.1-8B (8.03e9 params), 8 GPUs, mixed precision + Adam, counting 16-bit gradients (2 + 2 +
    12 B per parameter): bf16 reduced in bf16 (--grad-reduce-in-bf16)."""
    summary = run_yaml(LLAMA_8B_DP8, f"parallelism.zero={zero}", "training.grad_reduce_dtype=bf16").summary
    gib = summary["memory_breakdown_gib"]
    state_gb = (gib["params"] + gib["grads"] + gib["optimizer"]) * 2**30 / 1e9
    assert state_gb == pytest.approx(expected_gb, rel=0.01)


@pytest.mark.parametrize("zero,factor", [(0, 2.0), (1, 2.0), (2, 2.0), (3, 3.0)])
def test_data_parallel_traffic_per_gpu(run_yaml, zero, factor):
    """DP and ZeRO-1/2 move 2 (N-1)/N x the parameters' bytes per GPU per step (a ring all-reduce, or a
    reduce-scatter and an all-gather), ZeRO-3 3 (N-1)/N (one micro-batch: two gathers and a reduce-scatter),
    exactly. The ring is asked for: on NVLink SHARP `auto` all-reduces in the switch, (N+1)/N x params.
    Gradients reduced in bf16, as parameters are gathered (test_grad_reduce.py ties the default fp32 buffer's
    bytes)."""
    summary = run_yaml(LLAMA_8B_DP8, f"parallelism.zero={zero}", "collectives.algorithm=ring",
                       "training.grad_reduce_dtype=bf16").summary
    param_bytes = get_model("llama3-8b").num_params() * 2  # 8.03e9 parameters in bf16
    assert summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(factor * 7 / 8 * param_bytes, rel=1e-9)


@pytest.mark.parametrize("grad_reduce_dtype,grad_bytes", [("fp32", 4), ("bf16", 2)])
def test_a_ddp_bucket_closes_at_its_size_in_the_gradient_buffers_bytes(run_yaml, grad_reduce_dtype, grad_bytes):
    """A bucket closes once its gradients hold `ddp.bucket` bytes in the buffer's format (`grad_reduce_dtype`),
    not in the parameters' `precision`: with bf16 training and the default fp32 buffer a 200 MiB bucket closes
    after its first 235 MB MLP weight (58.7e6 gradients x 4 B), where counting 2 B per gradient would hold it
    open past 400 MiB of fp32."""
    bucket = 200 * 2**20
    frame = run_yaml(LLAMA_8B_DP8, "parallelism.ddp.bucket=200 MiB", "collectives.algorithm=ring",
                     f"training.grad_reduce_dtype={grad_reduce_dtype}").timeline
    buckets = frame[(frame["kind"] == "collective") & (frame["rank"] == 0) & (frame["category"] == "dp")]
    closed = buckets["bytes"].iloc[:-1]
    assert (closed >= bucket).all()
    assert closed.min() < 2 * bucket
    assert buckets["bytes"].sum() == get_model("llama3-8b").num_params() * grad_bytes


def test_tensor_parallel_all_reduces_match_seed_003(run_yaml):
    """Seed 003: Llama-3.1-8B, TP = 8, 8192 tokens: 4 all-reduces of ~67 MB per layer, 128 per micro-batch."""
    result = run_yaml("""
cluster: {topology: dgx-h100}
model: {preset: llama3-8b}
training: {seq_len: 8192, global_batch: 1, micro_batch: 1}
parallelism: {tp: 8, dp: 1}
""")
    frame = result.timeline
    layer_all_reduces = frame[(frame["kind"] == "collective") & (frame["rank"] == 0) & (frame["category"] == "tp")
                              & frame["name"].str.contains(r"all_reduce L\d+\.", regex=True)]
    assert len(layer_all_reduces) == 128
    assert set(layer_all_reduces["bytes"]) == {8192 * 4096 * 2}


DDP_TWO_NODES = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b}
training: {seq_len: 2048, global_batch: 32, micro_batch: 1}
parallelism: {tp: 8, dp: 2}
"""


def test_ddp_overlap_hides_part_of_the_gradient_all_reduce(run_yaml):
    overlapped = run_yaml(DDP_TWO_NODES).summary
    serial = run_yaml(DDP_TWO_NODES, "parallelism.ddp.overlap=false").summary
    assert overlapped["exposed_comm_s"]["dp"] < overlapped["comm_s"]["dp"]
    assert serial["exposed_comm_s"]["dp"] == pytest.approx(serial["comm_s"]["dp"], rel=1e-6)
    assert overlapped["step_time_s"] < serial["step_time_s"]


def test_bucket_size_sweep_shows_both_ends_of_the_trade_off(run_yaml):
    exposed = {bucket: run_yaml(DDP_TWO_NODES, f"parallelism.ddp.bucket={bucket}").summary["exposed_comm_s"]["dp"]
               for bucket in ("64 KiB", "25 MiB", "4 GiB")}
    assert exposed["64 KiB"] > exposed["25 MiB"] < exposed["4 GiB"]


def test_tp16_across_two_nodes_steps_slower_than_tp8_dp2(run_yaml):
    """Seed 000 Q5 at step level: TP must stay inside the NVLink domain."""
    base = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b}
training: {seq_len: 4096, global_batch: 16, micro_batch: 1}
"""
    tp16 = run_yaml(base + "parallelism: {tp: 16, dp: 1}\n").summary
    tp8 = run_yaml(base + "parallelism: {tp: 8, dp: 2}\n").summary
    assert tp16["step_time_s"] > tp8["step_time_s"]
    # 2.6 x with NCCL's NVLS tree across the two hosts, which auto weighs as NCCL does (over 3 x by ring)
    assert tp16["exposed_comm_s"]["tp"] > 2 * tp8["exposed_comm_s"]["tp"]


def test_out_of_memory_is_a_result_naming_stage_and_breakdown(run_yaml):
    summary = run_yaml("""
cluster: {topology: dgx-h100}
model: {preset: llama3-70b}
training: {seq_len: 4096, global_batch: 8, micro_batch: 1}
parallelism: {tp: 8, dp: 1}
""").summary
    assert summary["oom"] is True and summary["peak_memory_rank"] == 0
    assert summary["peak_memory_gib"] > summary["memory_capacity_gib"]
    assert summary["bottleneck"]["constraint"] == "memory_capacity"
    assert set(summary["memory_breakdown_gib"]) == {"params", "grads", "optimizer", "activations", "buffers"}


@pytest.mark.parametrize("override,field", [
    ("parallelism.tp=3", "parallelism"),
    ("parallelism.dp=3", "parallelism.dp"),
    ("training.global_batch=12", "training.global_batch"),
    ("parallelism.pipeline.schedule=nope", "parallelism.pipeline.schedule"),
])
def test_layout_errors_name_the_field(run_yaml, override, field):
    with pytest.raises(ScenarioError) as error:
        run_yaml(LLAMA_8B_DP8, override)
    assert error.value.field == field
    if field == override.split("=")[0]:  # the override set the faulty value itself: it is the location
        assert (error.value.file, error.value.line) == (f"--set {override}", None)
    else:  # a check across the section's fields: at the section's line, naming the override under it
        assert error.value.file == "inline.yaml" and error.value.line is not None
        assert error.value.problem.endswith(f" (with --set {override})")


def test_a_section_check_names_each_kind_of_override_as_the_user_wrote_it():
    """A check across a section stays at its line and names what wrote under it: a `--set`, a sweep axis at its
    line, a command's option with the value as typed (not 'command line')."""
    from simulator.config.loader import OptionSetting, Override, located_error

    overrides = (Override(("checkpoint", "size"), "--set checkpoint.size=1TB"),
                 Override(("checkpoint", "interval"), "sweep.yaml", line=4, field="axes[0]"),
                 OptionSetting("--intervals", ("checkpoint", "interval"), 60.0, "1min").override())
    error = located_error(("checkpoint",), "too slow", "", "job.yaml", {("checkpoint",): 7}, overrides)
    assert (error.file, error.line) == ("job.yaml", 7)
    assert error.problem == "too slow (with --set checkpoint.size=1TB, sweep.yaml:4, --intervals 1min)"


def test_heads_must_divide_by_tp(run_yaml):
    with pytest.raises(ScenarioError) as error:
        run_yaml(LLAMA_8B_DP8, "parallelism.tp=8", "parallelism.dp=1", "model.heads=4", "model.kv_heads=4")
    assert error.value.field == "parallelism.tp"


def test_same_scenario_same_timeline(run_yaml):
    first = run_yaml(DDP_TWO_NODES).timeline
    second = run_yaml(DDP_TWO_NODES).timeline
    assert first.equals(second)


def test_folded_and_unfolded_agree_on_256_gpus_with_tp_pp_dp(run_yaml):
    """The scale issue's check: TP x PP x DP on 256 GPUs, one rank per stage simulated vs all 256. Each
    two-host replica has a leaf group of its own, so the replicas are exact images of each other under the spine
    hash (replicas sharing a leaf group can land on the spines differently, and fold exactly only where that
    costs nothing). The traffic agrees to rounding: the TP collectives run under LL128, whose flows carry 128/120 of
    the payload that the reports take back off, summed over other ranks in the two runs."""
    text = """
cluster: {topology: dgx-h100-cluster, nodes: 32, leaf_ports: 2}
model: {preset: llama3-8b, layers: 8}
training: {seq_len: 2048, global_batch: 64, micro_batch: 1}
parallelism: {tp: 4, pp: 4, dp: 16, sequence_parallel: true, zero: 1}
"""
    folded = run_yaml(text).summary
    unfolded = run_yaml(text, "run.fold=false").summary
    assert (folded["simulated_ranks"], unfolded["simulated_ranks"]) == (4, 256)
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-9)
    assert folded["traffic_bytes_per_gpu"] == pytest.approx(unfolded["traffic_bytes_per_gpu"], rel=1e-12)


def test_folding_switches_itself_off_on_an_explicit_graph(run_yaml, tmp_path):
    graph = tmp_path / "two.yaml"
    graph.write_text("""
kind: graph
nodes:
  - {name: sw, kind: switch}
  - {name: g0, kind: gpu, host: 0}
  - {name: g1, kind: gpu, host: 1}
links:
  - {a: g0, b: sw, bandwidth: 100 GB/s, latency: 1 us, class: nvlink}
  - {a: g1, b: sw, bandwidth: 50 GB/s, latency: 1 us, class: nvlink}
""")
    summary = run_yaml(f"""
cluster: {{topology: {graph}}}
model: {{synthetic: {{stages: 2, forward: 1 ms, backward: 2 ms, p2p_bytes: 1 MiB}}}}
training: {{microbatches: 4}}
parallelism: {{pp: 2}}
""").summary
    assert summary["folded"] is False and "graph" in summary["fold_off_reason"]
    assert summary["simulated_ranks"] == 2


def test_tp_across_hosts_is_allowed_and_warned_about(run_yaml):
    summary = run_yaml("""
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 1024, global_batch: 1, micro_batch: 1}
parallelism: {tp: 16, dp: 1}
""").summary
    assert any("spans 2 NVLink domains" in warning for warning in summary["warnings"])


def test_a_layout_warning_keeps_its_field_apart_from_its_problem(tmp_path):
    """The step's plan gives a layout warning as (field, problem), which the run locates at the field's line, not as one
    'parallelism.tp: ...' string that the run would split again at its first ': '."""
    from simulator.topology.loader import scenario_topology
    from simulator.workload.training import build_training_step

    loaded = scenario_from_text("""
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 1024, global_batch: 1, micro_batch: 1}
parallelism: {tp: 16, dp: 1}
""", "tp16.yaml")
    step = build_training_step(loaded.scenario, scenario_topology(loaded), tmp_path)
    assert step.warnings == ((("parallelism", "tp"), "a TP group of 16 GPUs spans 2 NVLink domains; its collectives "
                              "cross the network every layer"),)


def test_tp_inside_an_nvl72_rack_is_not_warned_about(run_yaml):
    """An NVL72 rack is one NVLink domain over 18 trays (hosts): TP 8 across trays stays on NVLink."""
    summary = run_yaml("""
cluster: {topology: gb200-nvl72}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 1024, global_batch: 9, micro_batch: 1}
parallelism: {tp: 8, dp: 9}
""").summary
    assert summary["warnings"] == []


def test_folding_is_exact_on_a_pcie_box_where_groups_share_switch_links(run_yaml, tmp_path):
    """Inside a PCIe server GPU pairs share switch and bridge links, so in-host groups need mirrors too."""
    box = tmp_path / "pcie.yaml"
    box.write_text("kind: pcie_node\ngpus: 8\ngpus_per_switch: 2\npcie_bandwidth: 32 GB/s\npcie_latency: 2 us\n")
    text = f"""
cluster: {{topology: {box}}}
model: {{preset: llama3-8b, layers: 4}}
training: {{seq_len: 1024, global_batch: 8, micro_batch: 1}}
parallelism: {{tp: 2, dp: 4, zero: 3}}
"""
    folded = run_yaml(text).summary
    unfolded = run_yaml(text, "run.fold=false").summary
    assert folded["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-9)
    assert folded["traffic_bytes_per_gpu"] == unfolded["traffic_bytes_per_gpu"]


LLAMA_8B_PP4 = """
cluster: {{topology: dgx-h100}}
model: {{preset: llama3-8b}}
training: {{seq_len: 2048, micro_batch: 1, microbatches: {m}}}
parallelism: {{pp: 4, dp: 2, pipeline: {{schedule: 1f1b}}}}
collectives: {{sm_contention: none}}
run: {{timeline: summary}}
"""


@pytest.mark.parametrize("m", [8, 32])
def test_real_model_bubble_is_paced_by_the_head_stage(run_yaml, m):
    """Why real-model pipelines idle above (p-1)/(m+p-1): the last stage also runs the output head and the loss
    (here Llama 3 8B's 128k vocabulary: 49.3 ms against 38.3 ms per micro-batch), so it paces the steady state
    and the window is m T_last + (p-1) T_mid. The bubble predicted from the plan's stage times matches the
    simulated one within 0.001 (P2P latency on the fill and drain is the rest). The stage times are nominal, so
    the sends' and the gradient all-reduce's SM contention, which would slow the kernels they overlap, is off."""
    from pathlib import Path

    from simulator.config.loader import scenario_from_text
    from simulator.topology.loader import scenario_topology
    from simulator.workload.training import build_training_step

    text, p = LLAMA_8B_PP4.format(m=m), 4
    loaded = scenario_from_text(text, "inline.yaml")
    stages = build_training_step(loaded.scenario, scenario_topology(loaded), Path(".")).plan.stages
    work = [sum(b.forward_s + b.backward_input_s + b.backward_weight_s + b.recompute_s for b in stage.blocks)
            for stage in stages]
    assert work[3] > 1.25 * work[1]
    predicted = 1 - m * sum(work) / p / (m * work[3] + (p - 1) * work[1])
    simulated = run_yaml(text).summary["bubble_fraction"]
    assert simulated == pytest.approx(predicted, abs=1e-3)
    assert simulated > (p - 1) / (m + p - 1) + 0.08


PIPELINE_TP2 = """
cluster: {topology: dgx-a100-cluster, nodes: 2}
model: {preset: megatron-1.7b, layers: 4}
training: {seq_len: 2048, global_batch: 4, micro_batch: 2, precision: fp16}
parallelism: {tp: 8, pp: 2, dp: 1}
run: {timeline: full}
"""


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_scattered_pipeline_activations_are_gathered_over_tp_without_sequence_parallelism(run_yaml,
                                                                                          sequence_parallel):
    # Each TP rank sends b s h / t (2 x 2048 x 2304 x 2 B / 8) to the next stage. Without sequence parallelism
    # the receiver all-gathers the whole activation over its TP group (Megatron's scatter/gather, SC21 4.1)
    # before the first block: one gather per received forward activation and backward gradient, 2 x 2 here.
    frame = run_yaml(PIPELINE_TP2, f"parallelism.sequence_parallel={str(sequence_parallel).lower()}").timeline
    activation = 2 * 2048 * 2304 * 2
    received = frame[(frame["kind"] == "collective") & frame["name"].str.startswith("recv ")]
    gathers = frame[(frame["kind"] == "collective") & frame["name"].str.startswith("pp gather ")]
    assert set(received["bytes"]) == {activation / 8}
    if sequence_parallel:
        assert gathers.empty
        return
    assert set(gathers["bytes"]) == {activation} and set(gathers["category"]) == {"pp"}
    assert len(gathers[gathers["rank"] == 0]) == 2 and len(gathers[gathers["rank"] == 8]) == 2


def test_a_pipeline_send_is_logged_on_the_sender_as_the_send():
    """Each member of a collective is logged under its own op: the sending rank's row of a pipeline transfer
    was the receiver's ('recv fwd mb0', the receiver's virtual stage), so the timeline and trace showed every
    sender receiving."""
    timeline = simulate(load_scenario("llama3-8b-dgx-h100-dp8",
                                      ["parallelism.pp=2", "parallelism.dp=4", "run.fold=false"])).timeline
    sends = timeline[(timeline["kind"] == "collective") & (timeline["category"] == "pp")]
    first = sends[sends["key"] == sends["key"].iloc[0]].set_index("rank")
    assert first.loc[0, "name"] == "send fwd mb0" and first.loc[0, "chunk"] == 0
    assert first.loc[1, "name"] == "recv fwd mb0" and first.loc[1, "chunk"] == 1


@pytest.mark.parametrize("override,expected", [
    ("cluster.nodes=2", "inline.yaml:5: parallelism.dp: tp x cp x pp x dp = 1 x 1 x 2 x 4 = 8 does not equal the "
     "cluster's 16 GPUs (with --set cluster.nodes=2) (allowed: dp 8 at tp x cp x pp = 2, or degrees whose product "
     "is 16)"),
    ("parallelism.pipeline.schedule=zbv", "inline.yaml:6: parallelism.pipeline.virtual_stages: schedule 'zbv' "
     "keeps two chunks per rank (a V), got virtual_stages = 1 (with --set parallelism.pipeline.schedule=zbv) "
     "(allowed: 2)"),
    ("parallelism.pipeline.virtual_stages=3", "inline.yaml:5: parallelism.pp: 32 layers do not split evenly over "
     "pp x virtual_stages = 6 stages (with --set parallelism.pipeline.virtual_stages=3) (allowed: pp x "
     "virtual_stages dividing the layers (or layers + 2 with first_last_fewer_layers))"),
])
def test_a_cross_field_check_names_the_override_of_a_field_it_read(override, expected):
    """A check that fails because of a `--set` of another field than the one it is located at names it: the
    cluster's GPU count read by the layout's product at `parallelism.dp`, the schedule read by the V's check at
    `virtual_stages`, the virtual stages read by the layers' split at `pp` (each was named only under the failing
    path: none was)."""
    text = """
cluster: {topology: dgx-h100-cluster, nodes: 1}
model: {preset: llama3-8b}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 1, pp: 2, dp: 4,
              pipeline: {schedule: 1f1b}}
"""
    with pytest.raises(ScenarioError) as error:
        simulate(scenario_from_text(text, "inline.yaml", [override]))
    assert error.value.render() == expected


def test_a_cross_field_check_at_an_override_names_the_overrides_of_the_fields_it_read():
    """Located at the override of the field it fails at (pp), the layers' split still names the override of the
    virtual stages, which makes the 12 stages with it, and not the one of dp, which it does not read."""
    text = """
cluster: {topology: dgx-h100-cluster, nodes: 1}
model: {preset: llama3-8b}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 1, pp: 2, dp: 4, pipeline: {schedule: interleaved}}
"""
    overrides = ["parallelism.dp=2", "parallelism.pp=4", "parallelism.pipeline.virtual_stages=3"]
    with pytest.raises(ScenarioError) as error:
        simulate(scenario_from_text(text, "inline.yaml", overrides))
    assert error.value.render() == (
        "--set parallelism.pp=4: 32 layers do not split evenly over pp x virtual_stages = 12 stages (with --set "
        "parallelism.pipeline.virtual_stages=3) (allowed: pp x virtual_stages dividing the layers (or layers + 2 "
        "with first_last_fewer_layers))")


@pytest.mark.parametrize("overrides,expected", [
    (["parallelism.tp=8"], "mixtral-8x7b-ep8.yaml:12: parallelism.ep: ep 8 does not divide dp x cp = 4 x 1 = 4 ranks "
     "(with --set parallelism.tp=8) (allowed: divisors of 4)"),
    (["cluster.nodes=1"], "mixtral-8x7b-ep8.yaml:12: parallelism.ep: ep 8 does not divide dp x cp = 4 x 1 = 4 ranks "
     "(with --set cluster.nodes=1) (allowed: divisors of 4)"),
    (["model.moe.experts=6"], "mixtral-8x7b-ep8.yaml:12: parallelism.ep: ep 8 does not divide the 6 experts "
     "(with --set model.moe.experts=6) (allowed: divisors of 6)"),
    (["model.ffn_hidden=14337"], "mixtral-8x7b-ep8.yaml:12: parallelism.tp: tp 2 does not divide ffn_hidden 14337 "
     "(with --set model.ffn_hidden=14337) (allowed: a divisor of ffn_hidden)"),
])
def test_a_layout_check_names_the_override_that_changed_what_it_divides(overrides, expected):
    """The layout's divisibility checks, located at the degree, name a `--set` of what they divide: the GPUs and
    degrees dp x cp derives from (`ep` against dp x cp went unsaid with `--set parallelism.tp=8`), the expert
    count and the MLP's width."""
    with pytest.raises(ScenarioError) as error:
        simulate(load_scenario("mixtral-8x7b-ep8", overrides))
    assert error.value.render().endswith(expected)


def test_a_dp_that_does_not_fill_the_cluster_names_no_override_it_did_not_read():
    """The dp check reads tp, cp, pp and the cluster, so its error names no `--set parallelism.zero=1` (or of the
    pipeline's schedule), which has no part in the product."""
    text = """
cluster: {topology: dgx-h100-cluster, nodes: 1}
model: {preset: llama3-8b}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 1, pp: 2, dp: 8}
"""
    with pytest.raises(ScenarioError) as error:
        simulate(scenario_from_text(text, "inline.yaml", ["parallelism.zero=1", "parallelism.tp=1"]))
    assert error.value.render() == (
        "inline.yaml:5: parallelism.dp: tp x cp x pp x dp = 1 x 1 x 2 x 8 = 16 does not equal the cluster's 8 GPUs "
        "(with --set parallelism.tp=1) (allowed: dp 4 at tp x cp x pp = 2, or degrees whose product is 8)")
