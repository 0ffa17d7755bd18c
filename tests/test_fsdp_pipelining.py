"""PyTorch FSDP under torch.distributed.pipelining (torchtitan's PP + FSDP, PyTorch 2.10 and later): each unit
all-gathered once per step (``reshard_after_forward=not pp_enabled``), the gradients accumulated unsharded (the
stage's ``set_requires_gradient_sync(False)`` on every backward) and each chunk's units reduce-scattered once, in
forward order, by the stage's REDUCE_GRAD after the chunk's last gradient action (after its backward send under
Schedule1F1B and ScheduleGPipe), the compute stream waiting for the last of them; and FSDP's no-sync without
pipelining. Counts, bytes, times and memory against their closed forms."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from shared import NCCL_SIMPLE_BASE_S

from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import get_model
from simulator.config.loader import scenario_from_text
from simulator.program.ops import CollectiveOp
from simulator.schedules.base import Action
from simulator.simulation import network_settings, run_step, step_program
from simulator.topology.loader import scenario_topology
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.memory import fsdp_pipelined_bytes, fsdp_working_set_bytes

LAYERS, PP, DP, M = 4, 2, 4, 4
ALPHA, BANDWIDTH = 3.4e-6, 450e9
"""dgx-h100's GPU-to-GPU NVLink latency and per-direction bandwidth (topologies/dgx-h100.yaml), efficiency 1."""
ALPHA_IB, NDR_BANDWIDTH = 2 * 6.5e-6, 50e9
"""dgx-h100-cluster's latency between the same GPU of two servers, on one rail leaf (topologies/dgx-h100-cluster.yaml:
two NIC-to-leaf links of 6.5 us; switch_latency is charged on switch-to-switch links, which this path has none
of), and an NDR NIC's 400 Gb/s per direction."""
BASE = NCCL_SIMPLE_BASE_S
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
PARAM_BYTES, GRAD_BYTES, SHARD_BYTES = 2, 4, 4
"""bf16 parameters gathered, gradients reduced in fp32 (bf16's gradient buffer, FSDP2's reduce_dtype), fp32
shards (FSDP2 keeps the parameter's own dtype)."""
COPY_RATE = get_gpu("h100-sxm").hbm_bandwidth * calibrated_efficiency("h100-sxm", "bf16").memory_peak
"""HBM bytes per second of FSDP's gradient copies: the calibrated rate of a memory-bound kernel."""
SCHEDULES = ["parallelism.pipeline.schedule=1f1b", "parallelism.pipeline.schedule=zb-h1",
             "parallelism.pipeline.schedule=gpipe"]


def _rank_ops(result, rank: int):
    frame = result.timeline
    return frame[(frame["kind"] != "flow") & (frame["rank"] == rank)].sort_values(["start_s", "end_s"])


def _dp(ops, prefix: str):
    return ops[(ops["category"] == "dp") & ops["name"].str.startswith(prefix)]


def _reduce_copy_seconds(units: dict[str, float]) -> float:
    """The stage's REDUCE_GRAD copies of ``units``' accumulated fp32 gradients into the reduce-scatter input
    (read and write 4 B per weight: Sharding.grad_copy_bytes), back to back on the compute stream."""
    return 2 * GRAD_BYTES * sum(units.values()) / COPY_RATE


def _backward_end(ops) -> float:
    """When the rank's last backward (with FSDP's copies into the accumulators) ends, before REDUCE_GRAD."""
    work = ops[(ops["category"] == "backward") & ~ops["name"].str.startswith("fsdp reduce copy")]
    return work["end_s"].max()


def _ring_seconds(nbytes: float) -> float:
    """A ring reduce-scatter (or all-gather) of ``nbytes`` over the DP group alone on the NVSwitch: NCCL's base
    latency, (N-1) latencies and (N-1)/N of the bytes through one link (Thakur et al.)."""
    return BASE + (DP - 1) * ALPHA + (DP - 1) / DP * nbytes / BANDWIDTH


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_unit_is_gathered_and_reduce_scattered_once_per_step(run_yaml, schedule):
    # m = 4 micro-batches: without pipelining FSDP would gather m (2U - 1) times and reduce-scatter m U times.
    result = run_yaml(PIPELINED_8B, schedule)
    for rank, units in enumerate(STAGE_UNITS):
        ops = _rank_ops(result, rank)
        gathers, scatters = _dp(ops, "all_gather params"), _dp(ops, "reduce_scatter grads")
        assert dict(zip(gathers["name"].str.removeprefix("all_gather params "), gathers["bytes"], strict=True)) \
            == {name: PARAM_BYTES * params for name, params in units.items()}
        # Schedule1F1B and ScheduleGPipe let FSDP gather each unit before its first forward (micro-batch 0);
        # the runtime's UNSHARD gathers every chunk before the rank's first action, for no micro-batch.
        assert set(gathers["microbatch"]) == ({-1} if schedule.endswith("zb-h1") else {0})
        assert list(scatters["name"].str.removeprefix("reduce_scatter grads ")) == list(units)  # forward order
        assert list(scatters["bytes"]) == [GRAD_BYTES * params for params in units.values()]
    per_rank = [(DP - 1) / DP * sum(units.values()) * (PARAM_BYTES + GRAD_BYTES) for units in STAGE_UNITS]
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(sum(per_rank) / PP, rel=1e-12)
    assert result.summary["layout"]["grad_sync"] == "after_last_backward"


def test_interleaved_chunks_each_reduce_after_their_own_last_backward(run_yaml):
    # v = 2: four virtual stages of one layer (the first with the embedding, the last with the head); each
    # rank's two chunks are separate FSDP roots, each reduce-scattered right after its own last backward (the
    # runtime's REDUCE_GRAD), and the rank's compute (the other chunk's backwards, or the optimizer) does not
    # resume before the last of them ends: the optimizer starts when the rank's last reduce-scatter ends.
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
            assert later["start_s"].min() >= own["end_s"].max() - 1e-12
        optimizer = ops[ops["name"] == "optimizer step"]
        assert optimizer["start_s"].iloc[0] == pytest.approx(scatters["end_s"].max(), abs=1e-12)


def test_runtime_schedules_unshard_each_chunk_before_the_first_action(run_yaml):
    # Interleaved (v = 2) runs on _PipelineScheduleRuntime, whose _add_unshard_reshard puts an UNSHARD of every chunk
    # (at most 3) before the rank's first action: rank 0's units, chunk 0's (embedding, L0) then chunk 2's (L2),
    # all-gathered back to back from the step's start, the first once FSDP2 has cast the embedding's fp32 shard to bf16
    # and copied it into its input (4 + 2, then 2 + 2 B per shard element), each alone on the NVSwitch (ring closed
    # form); the chunk's first action copies its units out (2 + 2 B per parameter, back to back on the compute stream)
    # and its first forward waits for them (_assert_unsharded); chunk 2's are copied out before chunk 2 runs.
    result = run_yaml(PIPELINED_8B, "parallelism.pipeline.schedule=interleaved",
                      "parallelism.pipeline.virtual_stages=2")
    ops = _rank_ops(result, 0)
    gathers = _dp(ops, "all_gather params")
    units = {"embedding": EMBEDDING, "L0": LAYER, "L2": LAYER}
    assert list(gathers["name"].str.removeprefix("all_gather params ")) == list(units)
    assert list(gathers["chunk"]) == [0, 0, 2]
    copy_in = (SHARD_BYTES + 3 * PARAM_BYTES) * EMBEDDING / DP / COPY_RATE
    ends = copy_in + np.cumsum([_ring_seconds(PARAM_BYTES * params) for params in units.values()])
    assert gathers["start_s"].iloc[0] == pytest.approx(copy_in, rel=1e-9)
    assert list(gathers["end_s"]) == pytest.approx(list(ends), rel=1e-9)
    copy_out = {name: 2 * PARAM_BYTES * params / COPY_RATE for name, params in units.items()}
    first_forward = ops[(ops["category"] == "forward") & (ops["chunk"] == 0) & (ops["kind"] == "compute")
                        & ~ops["name"].str.startswith("fsdp copy-")]["start_s"].min()
    assert first_forward == pytest.approx(max(ends[0] + copy_out["embedding"], ends[1]) + copy_out["L0"], rel=1e-9)
    chunk_2 = ops[ops["name"] == "fsdp copy-out L2"]
    assert chunk_2["start_s"].iloc[0] > first_forward


def _last_backward_send(ops):
    return ops[(ops["stream"] == "pp") & (ops["microbatch"] == M - 1) & ops["name"].str.contains("bwd")]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_single_stage_schedules_reduce_after_the_backward_send(run_yaml, schedule):
    # Rank 1 (layers 2-3 and the head) under Schedule1F1B / ScheduleGPipe: the last backward's gradient send
    # starts when the backward ends (it does not wait for any reduce-scatter) and takes one NVLink latency plus
    # its bytes; the schedule waits for it before perform_reduce_grad, which copies each unit's accumulated
    # gradients into its reduce-scatter input on the compute stream; the three reduce-scatters then run back
    # to back on the dp stream, each alone on the NVSwitch (ring closed form); the optimizer waits for the last.
    result = run_yaml(PIPELINED_8B, f"parallelism.pipeline.schedule={schedule}")
    ops = _rank_ops(result, 1)
    backward_end = _backward_end(ops)
    send = _last_backward_send(ops)
    assert send["start_s"].min() == pytest.approx(backward_end, abs=1e-12)
    send_end = backward_end + ALPHA + send["bytes"].iloc[0] / BANDWIDTH
    assert send["end_s"].max() == pytest.approx(send_end, rel=1e-9)
    scatters = _dp(ops, "reduce_scatter grads")
    copied = send_end + _reduce_copy_seconds(STAGE_UNITS[1])
    assert scatters["start_s"].min() == pytest.approx(copied, rel=1e-9)
    expected_end = copied + sum(_ring_seconds(GRAD_BYTES * params) for params in STAGE_UNITS[1].values())
    assert scatters["end_s"].max() == pytest.approx(expected_end, rel=1e-9)
    optimizer = ops[ops["name"] == "optimizer step"]
    assert optimizer["start_s"].iloc[0] == pytest.approx(expected_end, rel=1e-9)


def test_runtime_schedules_reduce_after_the_last_weight_gradients(run_yaml):
    # zb-h1 runs on _PipelineScheduleRuntime: REDUCE_GRAD follows the chunk's last W (its B's send long gone),
    # so rank 1's reduce-scatters start when that W and the copies into their inputs end, and the optimizer
    # waits for the last of them.
    result = run_yaml(PIPELINED_8B, "parallelism.pipeline.schedule=zb-h1")
    ops = _rank_ops(result, 1)
    last_w = ops[ops["category"] == "weight_grad"]["end_s"].max()
    scatters = _dp(ops, "reduce_scatter grads")
    copied = last_w + _reduce_copy_seconds(STAGE_UNITS[1])
    assert scatters["start_s"].min() == pytest.approx(copied, rel=1e-9)
    expected_end = copied + sum(_ring_seconds(GRAD_BYTES * params) for params in STAGE_UNITS[1].values())
    assert scatters["end_s"].max() == pytest.approx(expected_end, rel=1e-9)
    assert ops[ops["name"] == "optimizer step"]["start_s"].iloc[0] == pytest.approx(expected_end, rel=1e-9)


def test_per_microbatch_sync_is_refused_under_pipelining(validation_error, run_yaml):
    # torch.distributed.pipelining turns FSDP's gradient sync off on every backward: reducing every micro-batch
    # is no PyTorch runtime's (ZeRO-2 with per-micro-batch reduce-scatters stays, as Llama 3's own runtime).
    error = validation_error(PIPELINED_8B, "parallelism.ddp.reduce_every_microbatch=true")
    assert error.field == "parallelism.ddp.reduce_every_microbatch"
    zero2 = run_yaml(PIPELINED_8B, "parallelism.fsdp=shard_grad_op", "parallelism.ddp.reduce_every_microbatch=true")
    assert len(_dp(_rank_ops(zero2, 0), "reduce_scatter grads")) == M * len(STAGE_UNITS[0])


def test_more_than_three_chunks_per_rank_are_refused(validation_error):
    # The runtime keeps at most 3 stages unsharded (_add_unshard_reshard's max_active_stages) and gathers the
    # rest again as the schedule cycles; that is not modelled, so 4 chunks per rank are refused at load.
    error = validation_error(PIPELINED_8B, "parallelism.pipeline.schedule=interleaved",
                             "parallelism.pipeline.virtual_stages=4")
    assert error.field == "parallelism.pipeline.virtual_stages"


def test_pipelined_memory_holds_the_stage_unsharded(run_yaml):
    # Under pipelining a rank holds its chunk's parameters unsharded (bf16) for the whole step and its
    # accumulated unsharded gradients in fp32; sharded model state is ZeRO-3's.
    memory = run_yaml(PIPELINED_8B).summary["memory_per_stage"]
    for stage, units in enumerate(STAGE_UNITS):
        params = sum(units.values())
        assert memory[stage]["buffers_gib"] * 2**30 == pytest.approx(params * (PARAM_BYTES + GRAD_BYTES), rel=1e-12)
        assert memory[stage]["grads_gib"] * 2**30 == pytest.approx(params * GRAD_BYTES / DP, rel=1e-12)


def test_pipelined_memory_walks_the_chunks_lifetimes():
    # Chunks of 10, 20 and 40 parameters (2-byte parameters, 4-byte gradients). Chunk 1's last backward comes
    # before chunk 2's first forward: its parameters resharded and its gradients freed by then, so the peak is
    # at chunk 2's backward, chunk 0's parameters beside chunk 2's parameters and gradients: 10 x 2 + 40 x 6
    # (chunk 1's parameters kept to the end would add 20 x 2, its gradients 20 x 4 more).
    actions = [Action("F", 0, 0), Action("F", 0, 1), Action("BW", 0, 1), Action("F", 0, 2), Action("BW", 0, 2),
               Action("BW", 0, 0)]
    assert fsdp_pipelined_bytes(actions, [[10.0], [20.0], [40.0]], 2, 4) == 10 * 2 + 40 * 6
    # Zero-bubble: an input-grad B allocates no weight gradients, the accumulator lives from the chunk's first
    # W. Chunk 0's B comes while chunk 1 (40) is whole; its W only after chunk 1's last W: counting the B as a
    # gradient action would hold chunk 0's gradients beside chunk 1's (50 x 2 + 50 x 4 = 300, not 260).
    split = [Action("F", 0, 0), Action("F", 0, 1), Action("B", 0, 1), Action("B", 0, 0), Action("W", 0, 1),
             Action("W", 0, 0)]
    assert fsdp_pipelined_bytes(split, [[10.0], [40.0]], 2, 4) == 50 * 2 + 40 * 4


def test_interleaved_chunks_free_their_gradients_before_the_other_accumulates(run_yaml):
    # docs/training-step.md: interleaved at m = p, a chunk's gradients are freed before the other chunk's
    # accumulate. p = 2, v = 2, m = 2 (global batch 8 over dp 4): rank 0 holds chunk 0 (embedding, L0) and
    # chunk 1 (L2); chunk 1's two backwards come before chunk 0's first, after which chunk 1 is resharded and
    # its gradients reduced, so the peak is the larger of (both chunks' bf16 parameters, chunk 1's fp32
    # gradients) and (chunk 0's parameters and gradients), never both chunks' gradients at once.
    result = run_yaml(PIPELINED_8B, "parallelism.pipeline.schedule=interleaved",
                      "parallelism.pipeline.virtual_stages=2", f"training.global_batch={DP * PP}")
    first, second = EMBEDDING + LAYER, LAYER
    expected = max((first + second) * PARAM_BYTES + second * GRAD_BYTES, first * (PARAM_BYTES + GRAD_BYTES))
    buffers = result.summary["memory_per_stage"][0]["buffers_gib"] * 2**30
    assert buffers == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("fold", ["true", "false"])
def test_hybrid_shard_all_reduces_each_shard_after_its_reduce_scatter(run_yaml, fold):
    # Two DGX H100: dp 8 (stride 2 under tp, cp, pp, dp), shards of 4 GPUs on each host, 2 replicas. After the
    # last backward's send (1F1B) each unit's reduce-scatter runs on the dp stream, back to back (ring closed
    # form on the NVSwitch), and the all-reduce of its shard across the replicas on its own stream (FSDP2's
    # all_reduce_stream, which waits for the reduce-scatter stream): it starts when its reduce-scatter and the
    # all-reduce before it have ended, and takes a ring of 2 over NDR (two latencies, the shard's bytes through
    # the 50 GB/s NIC); the next reduce-scatter does not wait for it. The compute stream waits for the last
    # all-reduce. Folded or not, the same times.
    text = PIPELINED_8B.replace("dgx-h100}", "dgx-h100-cluster, nodes: 2}").replace(f"dp: {DP}", "dp: 8") \
        .replace("full_shard", "hybrid_shard").replace(f"global_batch: {DP * M}", f"global_batch: {8 * M}")
    result = run_yaml(text, f"run.fold={fold}")
    ops = _rank_ops(result, 1)
    scatters, reduces = _dp(ops, "reduce_scatter grads"), _dp(ops, "all_reduce shard")
    assert list(scatters["name"].str.removeprefix("reduce_scatter grads ")) == list(STAGE_UNITS[1])
    assert list(reduces["name"].str.removeprefix("all_reduce shard ")) == list(STAGE_UNITS[1])
    assert list(scatters["bytes"]) == [GRAD_BYTES * params for params in STAGE_UNITS[1].values()]
    assert list(reduces["bytes"]) == [GRAD_BYTES * params / 4 for params in STAGE_UNITS[1].values()]
    send = _last_backward_send(ops)
    copied = send["end_s"].max() + _reduce_copy_seconds(STAGE_UNITS[1])
    assert scatters["start_s"].iloc[0] == pytest.approx(copied, rel=1e-9)
    scatter_end = scatters["start_s"].iloc[0]
    reduce_end = 0.0
    for params, scatter, reduce in zip(STAGE_UNITS[1].values(), scatters.itertuples(), reduces.itertuples(),
                                       strict=True):
        assert scatter.start_s == pytest.approx(scatter_end, rel=1e-9)
        scatter_end = scatter.start_s + _ring_seconds(GRAD_BYTES * params)
        assert scatter.end_s == pytest.approx(scatter_end, rel=1e-9)
        assert reduce.start_s == pytest.approx(max(scatter_end, reduce_end), rel=1e-9)
        reduce_end = reduce.start_s + BASE + 2 * ALPHA_IB + GRAD_BYTES * params / 4 / NDR_BANDWIDTH
        assert reduce.end_s == pytest.approx(reduce_end, rel=1e-9)
    assert scatters["start_s"].iloc[1] < reduces["end_s"].iloc[0]  # the next reduce-scatter overlaps
    optimizer = ops[ops["name"] == "optimizer step"]
    assert optimizer["start_s"].iloc[0] == pytest.approx(reduce_end, abs=1e-12)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_single_stage_schedules_wait_for_every_backward_send(schedule):
    # ScheduleGPipe waits for all its bwd_sends_to_wait, Schedule1F1B for each cooldown send, before
    # perform_reduce_grad. Rank 1's backward send of micro-batch m - 2 made 5000 times larger (both ends of the
    # transfer) takes the NVLink alone: one latency plus 5000 times the bytes at 450 GB/s (93.21 ms). Sends to
    # one peer leave in issue order (parallel/program.py `_send`), so the last backward's send starts when it
    # ends, not when its backward does, and takes one latency plus its bytes (22.04 us); the first
    # reduce-scatter starts when that send ends and the stage has copied its gradients into the reduce-scatter
    # inputs.
    loaded = scenario_from_text(PIPELINED_8B, "inline.yaml", [f"parallelism.pipeline.schedule={schedule}"])
    topology = scenario_topology(loaded)
    program = step_program(loaded, topology, fold=False)
    first_send = next(op for op in program.ops if isinstance(op, CollectiveOp) and op.rank == 1
                      and op.stream == "pp" and op.name == f"send bwd mb{M - 2}")
    ops = tuple(replace(op, nbytes=op.nbytes * 5000) if isinstance(op, CollectiveOp) and op.key == first_send.key
                else op for op in program.ops)
    _, log, _ = run_step(replace(program, ops=ops), topology, network_settings(loaded, topology))
    frame = log.to_frame()
    rank_ops = _rank_ops(type("Run", (), {"timeline": frame}), 1)
    sends = rank_ops[(rank_ops["stream"] == "pp") & rank_ops["name"].str.contains("bwd")]
    send = sends[sends["microbatch"] == M - 2].iloc[0]
    last = sends[sends["microbatch"] == M - 1].iloc[0]
    assert send["end_s"] == pytest.approx(send["start_s"] + ALPHA + first_send.nbytes * 5000 / BANDWIDTH, rel=1e-9)
    assert last["start_s"] == send["end_s"]
    assert last["end_s"] == pytest.approx(send["end_s"] + ALPHA + first_send.nbytes / BANDWIDTH, rel=1e-9)
    scatters = _dp(rank_ops, "reduce_scatter grads")
    copied = last["end_s"] + _reduce_copy_seconds(STAGE_UNITS[1])
    assert scatters["start_s"].min() == pytest.approx(copied, rel=1e-9)


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
    # pp 1 with `reduce_every_microbatch: false` (FSDP2's set_requires_gradient_sync(False) on every micro-batch
    # but the last): the units reshard after each forward and backward as usual, m (2U - 1) gathers; the
    # gradients are accumulated unsharded and, in the last backward, FSDP's post-backward hooks copy each unit's
    # accumulator into its reduce-scatter input and reduce-scatter it as its backward ends, in backward order,
    # on the in-order dp stream: each starts when its unit's last backward op and copy and the reduce-scatter
    # before it have ended, the first long before the backward is over.
    text = PIPELINED_8B.replace(f"pp: {PP}, dp: {DP}", "pp: 1, dp: 8").replace(f"{DP * M}", f"{8 * M}")
    result = run_yaml(text, "parallelism.ddp.reduce_every_microbatch=false")
    ops = _rank_ops(result, 0)
    units = {"embedding": EMBEDDING, **{f"L{layer}": LAYER for layer in range(LAYERS)}, "head": HEAD}
    assert len(_dp(ops, "all_gather params")) == M * (2 * len(units) - 1)
    scatters = _dp(ops, "reduce_scatter grads")
    assert list(scatters["name"].str.removeprefix("reduce_scatter grads ")) == list(reversed(units))
    assert list(scatters["bytes"]) == [GRAD_BYTES * params for params in reversed(units.values())]
    backwards = ops[ops["category"] == "backward"]
    previous_end = 0.0
    for unit, (start, end) in zip(reversed(units), zip(scatters["start_s"], scatters["end_s"], strict=True),
                                  strict=True):
        last = backwards["name"].str.startswith((f"B{M - 1} {unit}", f"fsdp grad copy mb{M - 1} {unit}"))
        unit_end = backwards[last]["end_s"].max()
        assert start == pytest.approx(max(unit_end, previous_end), abs=1e-12)
        previous_end = end
    assert scatters["start_s"].iloc[0] < backwards["end_s"].max()
    working = fsdp_working_set_bytes(list(units.values()), PARAM_BYTES, 0.0)
    assert result.summary["memory_breakdown_gib"]["buffers"] * 2**30 == pytest.approx(
        working + sum(units.values()) * GRAD_BYTES, rel=1e-12)
    assert result.summary["layout"]["grad_sync"] == "after_last_backward"
