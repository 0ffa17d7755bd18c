"""ZeRO-3 as the frameworks run it: PyTorch FSDP (`fsdp: full_shard | hybrid_shard`) all-gathers one wrapped unit
at a time (torchtitan wraps each layer, the embedding, and the final norm with the output layer, which keeps its
parameters from its forward to its backward), DeepSpeed (`zero: 3`) one block at a time; both reduce-scatter each
layer's gradients every micro-batch. Counts, bytes and the unsharded working set against their closed forms."""

from __future__ import annotations

import pytest
from shared import NCCL_SIMPLE_BASE_S

from simulator.catalog.models import get_model
from simulator.config.loader import scenario_from_text
from simulator.program.ops import COMPUTE_STREAM, CollectiveOp, ComputeOp
from simulator.simulation import step_program
from simulator.topology.loader import scenario_topology
from simulator.workload.memory import fsdp_working_set_bytes

LAYERS, DP, M = 4, 8, 2
SHARDED_8B = f"""
cluster: {{topology: dgx-h100}}
model: {{preset: llama3-8b, layers: {LAYERS}}}
training: {{seq_len: 1024, global_batch: {DP * M}, micro_batch: 1}}
parallelism: {{tp: 1, pp: 1, dp: {DP}}}
collectives: {{algorithm: ring}}
run: {{timeline: full}}
"""
MODEL = get_model("llama3-8b")
LAYER, EMBEDDING, HEAD = MODEL.layer_params(), MODEL.embedding_params(), MODEL.head_params()
UNITS = LAYERS + 2  # the layers, the embedding, the head (final norm and output layer)
BLOCKS = 2 * LAYERS + 2  # attention and MLP per layer, the embedding, the head


def _dp_collectives(run_yaml, sharding: str):
    result = run_yaml(SHARDED_8B, sharding)
    frame = result.timeline
    ours = frame[(frame["kind"] == "collective") & (frame["rank"] == 0) & (frame["category"] == "dp")]
    return result.summary, ours[ours["name"].str.startswith("all_gather params")], \
        ours[ours["name"].str.startswith("reduce_scatter grads")]


@pytest.mark.parametrize("sharding, gathers", [
    ("parallelism.fsdp=full_shard", M * (2 * UNITS - 1)),  # the head unit is not gathered again for its backward
    ("parallelism.fsdp=hybrid_shard", M * (2 * UNITS - 1)),
    ("parallelism.zero=3", M * 2 * BLOCKS),
])
def test_collectives_per_step_follow_the_framework(run_yaml, sharding, gathers):
    _, all_gathers, reduce_scatters = _dp_collectives(run_yaml, sharding)
    assert len(all_gathers) == gathers
    assert len(reduce_scatters) == M * UNITS


def test_fsdp_gathers_whole_units_and_sends_their_share(run_yaml):
    # Each all-gather carries one unit's bf16 parameters (the collective's gathered size); a ring all-gather
    # sends (dp - 1)/dp of it from every rank. The backward skips the head: 2 x params - head per micro-batch,
    # and each unit's gradients are reduce-scattered once per micro-batch, in fp32 (bf16's gradient buffer).
    summary, all_gathers, reduce_scatters = _dp_collectives(run_yaml, "parallelism.fsdp=full_shard")
    sizes = dict(zip(all_gathers["name"], all_gathers["bytes"], strict=False))
    assert sizes["all_gather params embedding"] == 2 * EMBEDDING
    assert sizes["all_gather params head"] == 2 * HEAD
    assert all(sizes[f"all_gather params L{layer}"] == 2 * LAYER for layer in range(LAYERS))
    assert set(all_gathers[all_gathers["name"] == "all_gather params head"]["microbatch"]) == set(range(M))
    assert len(all_gathers[all_gathers["name"] == "all_gather params head"]) == M
    scattered = dict(zip(reduce_scatters["name"], reduce_scatters["bytes"], strict=False))
    assert scattered == {"reduce_scatter grads embedding": 4 * EMBEDDING, "reduce_scatter grads head": 4 * HEAD,
                         **{f"reduce_scatter grads L{layer}": 4 * LAYER for layer in range(LAYERS)}}
    params = EMBEDDING + LAYERS * LAYER + HEAD
    sent = M * (2 * (2 * params - HEAD) + 4 * params) * (DP - 1) / DP
    assert summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(sent, rel=1e-12)


def test_fsdp_prefetches_one_unit_ahead_in_the_backward_and_two_in_the_forward():
    # FSDP2: in the forward, unit k's all-gather is queued behind unit k-2's copy-out, which runs once unit k-3
    # has finished; in the backward, behind unit k's own copy-out, after unit k+1's backward (k-1 gathered
    # while k runs), and unit k+1's post-backward copy of its gradients into the reduce-scatter input. Units in
    # forward order: embedding, L0..L3, head. The gather waits for its copy-in, which waits for these.
    loaded = scenario_from_text(SHARDED_8B, "inline.yaml", ["parallelism.fsdp=full_shard"])
    ops = step_program(loaded, scenario_topology(loaded), fold=True).ops
    units = ["embedding", *(f"L{layer}" for layer in range(LAYERS)), "head"]

    def last_compute(mb: int, unit: str, prefix: str) -> int:
        return max(op.id for op in ops if isinstance(op, ComputeOp) and op.name.startswith(f"{prefix}{mb} {unit}")
                   and op.rank == 0)

    def gather_deps(phase: str, mb: int, unit: str) -> tuple[int, ...]:
        (op,) = [op for op in ops if isinstance(op, CollectiveOp) and op.rank == 0
                 and op.key.startswith(f"zero3.ag.{phase}.mb{mb}.vs0.{unit}.")]
        (copy_in,) = op.deps
        assert ops[copy_in].name == f"fsdp copy-in {unit}"
        return ops[copy_in].deps

    for k in range(3, len(units)):
        assert gather_deps("fwd", 1, units[k]) == (last_compute(1, units[k - 3], "F"),)
    backward = units[::-1]
    for k in range(3, len(backward)):
        assert gather_deps("bwd", 1, backward[k]) == (last_compute(1, backward[k - 2], "fsdp grad copy mb"),)


def test_fsdp_compute_waits_for_the_previous_reduce_scatter():
    # FSDP2's post_backward: the compute stream waits for the reduce-scatter issued before (the previous unit's)
    # before the next unit's backward continues, so at most one gradient reduce-scatter runs behind the compute.
    # After a micro-batch's backward the root's post-backward callback waits for its last one (the embedding's)
    # before the next forward, whose first compute op is the copy-out of the embedding's gather.
    loaded = scenario_from_text(SHARDED_8B, "inline.yaml", ["parallelism.fsdp=full_shard"])
    ops = [op for op in step_program(loaded, scenario_topology(loaded), fold=True).ops if op.rank == 0]
    scatters = [op.id for op in ops if isinstance(op, CollectiveOp) and op.key.startswith("grads.rs.")]
    assert len(scatters) == M * UNITS
    waits = [next(op for op in ops if op.id > rs and op.stream == COMPUTE_STREAM) for rs in scatters]
    assert not set(waits[0].deps) & set(scatters)
    for index, waiting in enumerate(waits[1:-1], start=1):  # the last one's successor is the optimizer (all)
        backward_ends = index % UNITS == UNITS - 1
        assert set(waiting.deps) & set(scatters) == {scatters[index] if backward_ends else scatters[index - 1]}
        assert (waiting.name == "fsdp copy-out embedding" and waiting.category == "forward") == backward_ends


@pytest.mark.parametrize("sharding, waits", [("parallelism.fsdp=full_shard", True), ("parallelism.zero=3", False)])
def test_fsdp_next_forward_gathers_after_the_last_reduce_scatter(sharding, waits):
    # torchtitan accumulates gradients with FSDP2's is_last_backward left true: the root's post-backward callback
    # makes the compute stream wait for the backward's last reduce-scatter and the next forward's root pre-forward
    # makes the all-gather streams wait for the compute stream, so micro-batch 1's first gather (the embedding's)
    # starts after micro-batch 0's embedding reduce-scatter. DeepSpeed has no such wait.
    loaded = scenario_from_text(SHARDED_8B, "inline.yaml", [sharding])
    ops = [op for op in step_program(loaded, scenario_topology(loaded), fold=True).ops if op.rank == 0]
    (last,) = [op.id for op in ops if isinstance(op, CollectiveOp) and op.key.startswith("grads.rs.embedding.vs0.op0.")]
    first = next(op for op in ops if isinstance(op, CollectiveOp) and op.key.startswith("zero3.ag.fwd.mb1."))
    # FSDP's gather waits for its copy-in, which the all-gather streams' wait holds
    deps = [dep for op in ops if op.id in first.deps and op.name.startswith("fsdp copy-in ") for dep in op.deps]
    assert (last in [*first.deps, *deps]) is waits


HSDP_8B = (SHARDED_8B.replace("{topology: dgx-h100}", "{topology: dgx-h100-cluster, nodes: 2}\n"
                                                      "network: {efficiency: ideal}")
           .replace(f"dp: {DP}}}", "dp: 16, fsdp: hybrid_shard}")
           .replace(f"global_batch: {DP * M}", f"global_batch: {16 * M}"))
"""Two DGX H100 hosts, DP 16 under hybrid_shard: each host's 8 GPUs a shard group, GPU g of the two hosts a
replica group of 2, joined by g's rail (ideal network efficiency: closed forms)."""
BASE, RAIL_LATENCY, NDR_BANDWIDTH = NCCL_SIMPLE_BASE_S, 2 * 6.5e-6, 50e9
"""NCCL's base latency of a Simple ring; dgx-h100-cluster's latency between like GPUs of two servers on one rail
leaf (two NIC-to-leaf links of 6.5 us); an NDR NIC's 400 Gb/s per direction."""


def test_hsdp_optimizer_waits_for_the_last_backward_s_replica_all_reduces(run_yaml):
    """FSDP2's HSDP without pipelining, as torchtitan runs it (set_requires_all_reduce(is_last), is_last_backward
    left true): every micro-batch's post_backward reduce-scatters each unit over its host; only the last one's
    foreach_reduce then all-reduces the shard across the replicas on all_reduce_stream and records the post-reduce
    event there, and the root's post-backward callback (finalize_backward -> _wait_for_post_backward) makes the
    compute stream wait for every unit's post-reduce and all-reduce events (torch/distributed/fsdp/_fully_shard/
    _fsdp_param_group.py, _fsdp_state.py): the optimizer starts when the last all-reduce ends. The program
    already did so (the optimizer waits for every dp and dp_all_reduce op). Hand-derived: one all-reduce per unit
    of params x 4 B / 8, each a ring of 2 over the rail, b + 2 a + n / B; the embedding's, issued last, starts
    when its reduce-scatter ends and ends 9.8 ms after the backward's last op (its last gradient copy), exposed;
    the step is its end plus the optimizer."""
    frame = run_yaml(HSDP_8B).timeline
    ours = frame[(frame["rank"] == 0) & (frame["kind"] != "flow")]
    reduces = ours[ours["name"].str.startswith("all_reduce shard ")]
    params = {"embedding": EMBEDDING, "head": HEAD, **{f"L{layer}": LAYER for layer in range(LAYERS)}}
    assert sorted(reduces["name"].str.removeprefix("all_reduce shard ")) == sorted(params)
    assert list(reduces["bytes"]) == [4 * params[name.removeprefix("all_reduce shard ")] / 8
                                      for name in reduces["name"]]
    closed_form = BASE + 2 * RAIL_LATENCY + reduces["bytes"] / NDR_BANDWIDTH
    assert (reduces["end_s"] - reduces["start_s"]).to_numpy() == pytest.approx(closed_form.to_numpy(), rel=1e-9)
    (scatter_end,) = ours[ours["name"] == "reduce_scatter grads embedding"]["end_s"].iloc[-1:]
    last = reduces[reduces["name"] == "all_reduce shard embedding"].iloc[0]
    assert last.start_s == pytest.approx(scatter_end, rel=1e-12)
    assert last.end_s == reduces["end_s"].max()
    backward_end = ours[ours["category"] == "backward"]["end_s"].max()
    assert last.end_s - backward_end > 5e-3
    (optimizer,) = ours[ours["name"] == "optimizer step"].itertuples()
    assert optimizer.start_s == pytest.approx(last.end_s, abs=1e-12)
    assert frame["end_s"].max() == pytest.approx(optimizer.end_s, abs=1e-12)


def test_deepspeed_compute_does_not_wait_for_reduce_scatters():
    # The wait is FSDP2's post_backward; DeepSpeed ZeRO-3 (zero: 3 without fsdp) reduce-scatters the same units
    # but its compute never depends on them.
    loaded = scenario_from_text(SHARDED_8B, "inline.yaml", ["parallelism.zero=3"])
    ops = [op for op in step_program(loaded, scenario_topology(loaded), fold=True).ops if op.rank == 0]
    scatters = {op.id for op in ops if isinstance(op, CollectiveOp) and op.key.startswith("grads.rs.")}
    assert scatters
    compute = [op for op in ops if op.stream == COMPUTE_STREAM and op.id > min(scatters)]
    assert not any(set(op.deps) & scatters for op in compute[:-1])  # the last is the optimizer (waits for all)


def test_fsdp_working_set_closed_forms():
    # Uniform units u, parameters p bytes, reduce dtype g bytes: forward u p (running) + 2 u p (two all-gather
    # outputs); backward 2 u p (running, prefetched) + u p (its fresh gradients) + u g (the next unit's
    # reduce-scatter input); post-backward u p (prefetched) + u p + u g (the gradients copied into their own
    # input, once the running unit is resharded and the next unit's input dropped).
    units = [1.0e8] * 6
    assert fsdp_working_set_bytes(units, 2, 2) == 3 * 1e8 * 2 + 1e8 * 2
    assert fsdp_working_set_bytes(units, 2, 4) == 3 * 1e8 * 2 + 1e8 * 4
    assert fsdp_working_set_bytes(units, 4, 0) == 3 * 1e8 * 4
    assert fsdp_working_set_bytes([1.0e8], 2, 4) == 1e8 * 2 + 1e8 * 4
    # a large last unit: its post-backward (the previous unit prefetched, its gradients and their input)
    assert fsdp_working_set_bytes([1.0e8, 5.0e8], 2, 4) == 1e8 * 2 + 5e8 * (2 + 4)


def test_fsdp_memory_counts_the_unsharded_working_set(run_yaml):
    # Llama 3 8B units: embedding E < head H (its norm too), each larger than a layer L. With fp32 reduce-scatters
    # (bf16's buffer) the largest set is the head's post-backward: the last layer prefetched, the head's bf16
    # gradients and their fp32 reduce-scatter input, 2 L + (2 + 4) H bytes (FSDP2 reshards the head and drops
    # the previous input before allocating it; the embedding's 2 E + 4 (E + L), counted before, never exists).
    fsdp, _, _ = _dp_collectives(run_yaml, "parallelism.fsdp=full_shard")
    deepspeed, _, _ = _dp_collectives(run_yaml, "parallelism.zero=3")
    assert EMBEDDING < HEAD and LAYER < EMBEDDING
    assert fsdp["memory_breakdown_gib"]["buffers"] * 2**30 == pytest.approx(2 * LAYER + 6 * HEAD, rel=1e-12)
    # DeepSpeed: two gathered layers (memory.unsharded_layers_bytes). Both shard the whole state over the 8 ranks:
    # FSDP2 fp32 shards, their fp32 gradients and the moments (4 + 4 + 8 B), DeepSpeed 16-bit weights, its bf16
    # gradient partitions (communication_data_type) and the fp32 master copy with the moments (2 + 2 + 12 B).
    assert deepspeed["memory_breakdown_gib"]["buffers"] * 2**30 == pytest.approx(2 * LAYER * 2, rel=1e-12)
    for part, fsdp_bytes, deepspeed_bytes in (("params", 4, 2), ("grads", 4, 2), ("optimizer", 8, 12)):
        assert fsdp["memory_breakdown_gib"][part] * deepspeed_bytes == pytest.approx(
            deepspeed["memory_breakdown_gib"][part] * fsdp_bytes, rel=1e-12)
