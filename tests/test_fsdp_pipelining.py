"""PyTorch FSDP under torch.distributed.pipelining (torchtitan's PP + FSDP): each unit all-gathered once per step
(``reshard_after_forward=not pp_enabled``) and, without per-micro-batch sync (the stage's
``set_requires_gradient_sync(False)`` on every backward but its last), each chunk's units reduce-scattered once,
in forward order, after the chunk's last gradient action, the compute stream (and the gradient send that follows)
waiting for the last of them. Counts, bytes, times and memory against their closed forms."""

from __future__ import annotations

import pytest

from simulator.catalog.models import get_model
from simulator.schedules.base import Action
from simulator.workload.memory import fsdp_pipelined_bytes, fsdp_working_set_bytes

LAYERS, PP, DP, M = 4, 2, 4, 4
ALPHA, BANDWIDTH = 3.4e-6, 450e9
"""dgx-h100's GPU-to-GPU NVLink latency and per-direction bandwidth (topologies/dgx-h100.yaml), efficiency 1."""
PIPELINED_8B = f"""
cluster: {{topology: dgx-h100}}
network: {{efficiency: ideal}}
model: {{preset: llama3-8b, layers: {LAYERS}}}
training: {{seq_len: 1024, global_batch: {DP * M}, micro_batch: 1}}
parallelism: {{tp: 1, pp: {PP}, dp: {DP}, fsdp: full_shard}}
collectives: {{algorithm: ring}}
run: {{timeline: full}}
"""
MODEL = get_model("llama3-8b")
LAYER, EMBEDDING, HEAD = MODEL.layer_params(), MODEL.embedding_params(), MODEL.head_params()
STAGE_UNITS = ({"embedding": EMBEDDING, "L0": LAYER, "L1": LAYER}, {"L2": LAYER, "L3": LAYER, "head": HEAD})
"""Each pipeline rank's FSDP units (parameters) in forward order: rank 0 holds the embedding and layers 0-1,
rank 1 layers 2-3 and the head (final norm and output layer)."""
PARAM_BYTES, GRAD_BYTES = 2, 4
"""bf16 parameters gathered, gradients reduced in fp32 (bf16's gradient buffer, FSDP2's reduce_dtype)."""
SCHEDULES = ["parallelism.pipeline.schedule=1f1b", "parallelism.pipeline.schedule=zb-h1",
             "parallelism.pipeline.schedule=gpipe"]


def _rank_ops(result, rank: int):
    frame = result.timeline
    return frame[(frame["kind"] != "flow") & (frame["rank"] == rank)].sort_values(["start_s", "end_s"])


def _dp(ops, prefix: str):
    return ops[(ops["category"] == "dp") & ops["name"].str.startswith(prefix)]


def _ring_seconds(nbytes: float) -> float:
    """A ring reduce-scatter of ``nbytes`` over the DP group alone on the NVSwitch: (N-1) latencies and
    (N-1)/N of the bytes through one link (Thakur et al.)."""
    return (DP - 1) * ALPHA + (DP - 1) / DP * nbytes / BANDWIDTH


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_unit_is_gathered_and_reduce_scattered_once_per_step(run_yaml, schedule):
    # m = 4 micro-batches: without pipelining FSDP would gather m (2U - 1) times and reduce-scatter m U times.
    result = run_yaml(PIPELINED_8B, schedule)
    for rank, units in enumerate(STAGE_UNITS):
        ops = _rank_ops(result, rank)
        gathers, scatters = _dp(ops, "all_gather params"), _dp(ops, "reduce_scatter grads")
        assert dict(zip(gathers["name"].str.removeprefix("all_gather params "), gathers["bytes"], strict=True)) \
            == {name: PARAM_BYTES * params for name, params in units.items()}
        assert set(gathers["microbatch"]) == {0}
        assert list(scatters["name"].str.removeprefix("reduce_scatter grads ")) == list(units)  # forward order
        assert list(scatters["bytes"]) == [GRAD_BYTES * params for params in units.values()]
    per_rank = [(DP - 1) / DP * sum(units.values()) * (PARAM_BYTES + GRAD_BYTES) for units in STAGE_UNITS]
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(sum(per_rank) / PP, rel=1e-12)
    assert result.summary["layout"]["grad_sync"] == "after_last_backward"


def test_interleaved_chunks_each_reduce_after_their_own_last_backward(run_yaml):
    # v = 2: four virtual stages of one layer (the first with the embedding, the last with the head); each
    # rank's two chunks are separate FSDP roots, each reduce-scattered after its own last backward, and the
    # rank's compute (the other chunk's backwards, or the optimizer) resumes when the last of them ends.
    result = run_yaml(PIPELINED_8B, "parallelism.pipeline.schedule=interleaved",
                      "parallelism.pipeline.virtual_stages=2")
    chunks = {0: {0: ["embedding", "L0"], 2: ["L2"]}, 1: {1: ["L1"], 3: ["L3", "head"]}}
    for rank, held in chunks.items():
        ops = _rank_ops(result, rank)
        scatters = _dp(ops, "reduce_scatter grads")
        assert len(_dp(ops, "all_gather params")) == len(scatters) == sum(len(units) for units in held.values())
        for vstage, units in held.items():
            last_backward = ops[(ops["category"] == "backward") & (ops["chunk"] == vstage)]["end_s"].max()
            own = scatters[scatters["chunk"] == vstage]
            assert list(own["name"].str.removeprefix("reduce_scatter grads ")) == units
            assert own["start_s"].min() == pytest.approx(last_backward, abs=1e-12)
            later = ops[(ops["stream"] == "compute") & (ops["start_s"] >= last_backward)]
            assert later["start_s"].min() == pytest.approx(own["end_s"].max(), abs=1e-12)


def test_compute_and_gradient_send_wait_for_the_last_reduce_scatter(run_yaml):
    # Rank 1 (layers 2-3 and the head): its last backward ends, then its three reduce-scatters run back to back
    # on the dp stream, each alone on the NVSwitch (ring closed form); the gradient send of that backward and
    # the next compute op (the optimizer) start when the last one ends.
    result = run_yaml(PIPELINED_8B)
    ops = _rank_ops(result, 1)
    backward_end = ops[ops["category"] == "backward"]["end_s"].max()
    scatters = _dp(ops, "reduce_scatter grads")
    expected_end = backward_end + sum(_ring_seconds(GRAD_BYTES * params) for params in STAGE_UNITS[1].values())
    assert scatters["end_s"].max() == pytest.approx(expected_end, rel=1e-9)
    send = ops[(ops["stream"] == "pp") & (ops["microbatch"] == M - 1) & ops["name"].str.contains("bwd")]
    assert send["start_s"].min() == pytest.approx(expected_end, rel=1e-9)
    optimizer = ops[ops["name"] == "optimizer step"]
    assert optimizer["start_s"].iloc[0] == pytest.approx(expected_end, rel=1e-9)


def test_per_microbatch_sync_keeps_the_reduce_scatters_but_gathers_once(run_yaml):
    # An explicit `reduce_every_microbatch: true` reduce-scatters every unit after every micro-batch's backward,
    # as FSDP2 without no_sync, but the units stay gathered for the step (reshard_after_forward=False).
    result = run_yaml(PIPELINED_8B, "parallelism.ddp.reduce_every_microbatch=true")
    for rank, units in enumerate(STAGE_UNITS):
        ops = _rank_ops(result, rank)
        assert len(_dp(ops, "all_gather params")) == len(units)
        assert len(_dp(ops, "reduce_scatter grads")) == M * len(units)
    per_rank = [(DP - 1) / DP * sum(units.values()) * (PARAM_BYTES + M * GRAD_BYTES) for units in STAGE_UNITS]
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(sum(per_rank) / PP, rel=1e-12)
    assert result.summary["layout"]["grad_sync"] == "every_microbatch"


def test_pipelined_memory_holds_the_stage_unsharded(run_yaml):
    # Under pipelining a rank holds its chunk's parameters unsharded (bf16) for the whole step and, without
    # per-micro-batch sync, its accumulated unsharded gradients in fp32; with sync, the gradients of the two
    # largest neighbouring units (the one produced, the one being reduce-scattered). Sharded model state is
    # ZeRO-3's either way.
    deferred = run_yaml(PIPELINED_8B).summary["memory_per_stage_gib"]
    synced = run_yaml(PIPELINED_8B, "parallelism.ddp.reduce_every_microbatch=true").summary["memory_per_stage_gib"]
    for stage, units in enumerate(STAGE_UNITS):
        params = sum(units.values())
        pairs = max(a + b for a, b in zip(units.values(), [*list(units.values())[1:], 0.0], strict=True))
        assert deferred[stage]["buffers"] * 2**30 == pytest.approx(params * (PARAM_BYTES + GRAD_BYTES), rel=1e-12)
        assert synced[stage]["buffers"] * 2**30 == pytest.approx(params * PARAM_BYTES + pairs * GRAD_BYTES,
                                                                 rel=1e-12)
        assert deferred[stage]["grads"] * 2**30 == pytest.approx(params * GRAD_BYTES / DP, rel=1e-12)


def test_pipelined_memory_walks_the_chunks_lifetimes():
    # Two chunks of 10 and 20 parameters; chunk 1's last backward comes before chunk 0's first: chunk 1's
    # gradients are freed before chunk 0's accumulate, its parameters resharded before chunk 0's last backward.
    actions = [Action("F", 0, 0), Action("F", 0, 1), Action("BW", 0, 1), Action("BW", 0, 0)]
    assert fsdp_pipelined_bytes(actions, [[10.0], [20.0]], 2, 4, accumulate=True) == 30 * 2 + 20 * 4
    assert fsdp_pipelined_bytes(actions, [[10.0], [20.0]], 2, 4, accumulate=False) == 30 * 2 + 20 * 4
    # Zero-bubble: an input-grad B allocates no weight gradients; the accumulator lives from the first W.
    split = [Action("F", 0), Action("F", 1), Action("B", 0), Action("B", 1), Action("W", 0), Action("W", 1)]
    assert fsdp_pipelined_bytes(split, [[10.0, 5.0]], 2, 4, accumulate=True) == 15 * 2 + 15 * 4
    assert fsdp_pipelined_bytes(split, [[10.0, 5.0]], 2, 4, accumulate=False) == 15 * 2 + 15 * 4


def test_hybrid_shard_all_reduces_each_shard_after_its_reduce_scatter(run_yaml):
    # Two DGX H100: dp 8 (stride 2 under tp, cp, pp, dp), shards of 4 GPUs on each host, 2 replicas. After the
    # last backward each unit's reduce-scatter is followed by the all-reduce of its shard across the replicas,
    # and the compute stream waits for the last all-reduce.
    text = PIPELINED_8B.replace("dgx-h100}", "dgx-h100-cluster, nodes: 2}").replace(f"dp: {DP}", "dp: 8") \
        .replace("full_shard", "hybrid_shard").replace(f"global_batch: {DP * M}", f"global_batch: {8 * M}")
    result = run_yaml(text)
    ops = _rank_ops(result, 1)
    collectives = _dp(ops, "")
    collectives = collectives[~collectives["name"].str.startswith("all_gather")]
    names = [f"{kind} {unit}" for unit in STAGE_UNITS[1] for kind in ("reduce_scatter grads", "all_reduce shard")]
    assert list(collectives["name"]) == names
    assert list(collectives["bytes"]) == [GRAD_BYTES * params / share for params in STAGE_UNITS[1].values()
                                          for share in (1, 4)]
    optimizer = ops[ops["name"] == "optimizer step"]
    assert optimizer["start_s"].iloc[0] == pytest.approx(collectives["end_s"].iloc[-1], abs=1e-12)


def test_bundled_torchtitan_scenario_sends_each_stage_once_per_step():
    # llama3-70b-torchtitan-pp-fsdp: TP 8, PP 2, FSDP 2; every GPU sends (N-1)/N = 1/2 of its stage's
    # parameters per TP rank once as bf16 (all-gathers) and once as fp32 (reduce-scatters) per step.
    from simulator import load_scenario, simulate
    from simulator.workload.memory import rank_params

    summary = simulate(load_scenario("llama3-70b-torchtitan-pp-fsdp", ["run.timeline=summary"])).summary
    model = get_model("llama3-70b")
    stages = [rank_params(model, 8, model.layers // 2, first_stage=stage == 0, last_stage=stage == 1)
              for stage in range(2)]
    assert summary["layout"]["grad_sync"] == "after_last_backward"
    assert summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(
        sum(params / 2 * (PARAM_BYTES + GRAD_BYTES) for params in stages) / 2, rel=1e-12)
    assert not summary["oom"]


def test_explicit_no_sync_without_pipelining(run_yaml):
    # pp 1 with `reduce_every_microbatch: false` (FSDP2's set_requires_gradient_sync(False) under gradient
    # accumulation): the units reshard after each forward and backward as usual, m (2U - 1) gathers, but the
    # gradients are accumulated unsharded and each unit reduce-scattered once, after the last backward.
    text = PIPELINED_8B.replace(f"pp: {PP}, dp: {DP}", "pp: 1, dp: 8").replace(f"{DP * M}", f"{8 * M}")
    result = run_yaml(text, "parallelism.ddp.reduce_every_microbatch=false")
    ops = _rank_ops(result, 0)
    units = {"embedding": EMBEDDING, **{f"L{layer}": LAYER for layer in range(LAYERS)}, "head": HEAD}
    assert len(_dp(ops, "all_gather params")) == M * (2 * len(units) - 1)
    scatters = _dp(ops, "reduce_scatter grads")
    assert list(scatters["name"].str.removeprefix("reduce_scatter grads ")) == list(units)
    assert scatters["start_s"].min() == pytest.approx(ops[ops["category"] == "backward"]["end_s"].max(), abs=1e-12)
    working = fsdp_working_set_bytes(list(units.values()), PARAM_BYTES, 0.0)
    assert result.summary["memory_breakdown_gib"]["buffers"] * 2**30 == pytest.approx(
        working + sum(units.values()) * GRAD_BYTES, rel=1e-12)
    assert result.summary["layout"]["grad_sync"] == "after_last_backward"
