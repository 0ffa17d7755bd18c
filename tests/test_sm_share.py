"""The SM-bound share of each compute op comes from the kernels that part of a block runs (engine/contention.py
slows only that share while communication kernels hold SMs): a part of known GEMM and memory-bound seconds
overlapped for a known time takes its closed form, and over every pass the parts' SM-bound seconds add up to
the pass's own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import get_model
from simulator.config.loader import scenario_from_text
from simulator.parallel.passes import Pass
from simulator.parallel.program import ProgramBuilder
from simulator.parallel.work import Block, StageWork
from simulator.program.ops import CollectiveOp, ComputeOp
from simulator.simulation import NetworkSettings, run_ops
from simulator.topology.loader import load_topology
from simulator.workload.calibrated import calibrated_efficiency, sm_share, tp_overlap
from simulator.workload.roofline import kernels_duration, sm_bound_duration
from simulator.workload.training import build_training_step
from simulator.workload.transformer import ShardShape, layer_kernels

H100 = sm_share("h100-sxm")
TWO_GPUS = """
cluster: {topology: dgx-h100, gpus: 2}
model: {preset: llama3-8b, layers: 1}
training: {seq_len: 2048, microbatches: 1, micro_batch: 1}
parallelism: {tp: 2, sequence_parallel: true, tp_comm_overlap: true}
"""
# The hand-made block: its forward is a leading GEMM of 2 ms and a trailing one of 3 ms, both SM-bound, that
# TP overlap runs against its all-gather and reduce-scatter, and between them 5 ms, of which a 1 ms GEMM is
# SM-bound and 4 ms of memory-bound kernels are not: that part's share is 0.2 (the whole forward's is 0.6).
LEADING_S, TRAILING_S, REST_GEMM_S, REST_MEMORY_S = 2e-3, 3e-3, 1e-3, 4e-3
FORWARD_S = LEADING_S + TRAILING_S + REST_GEMM_S + REST_MEMORY_S
PART = Block(name="part", layer=0, forward_s=FORWARD_S, backward_input_s=0.0, backward_weight_s=0.0,
             tp_bytes=256e6, sm_bound_s=(LEADING_S + TRAILING_S + REST_GEMM_S, 0.0, 0.0, 0.0),
             overlap_gemm_s=(LEADING_S, TRAILING_S, 0.0, 0.0), overlap_gemm_sm_s=(LEADING_S, TRAILING_S, 0.0, 0.0))


def _plan(text: str, *overrides: str):
    loaded = scenario_from_text(text, "inline.yaml", list(overrides))
    topology = load_topology(loaded.scenario.cluster.topology, loaded.scenario.cluster.overrides())
    return build_training_step(loaded.scenario, topology).plan, topology


def test_the_part_between_overlapped_gemms_slows_by_its_own_sm_bound_share():
    plan, topology = _plan(TWO_GPUS)
    plan = replace(plan, stages=(StageWork((PART,), 0.0),), tp_overlap=tp_overlap())
    ops = ProgramBuilder(plan).build()
    compute = {op.name: op for op in ops if isinstance(op, ComputeOp) and op.rank == 0}
    rest = compute["F0 part"]
    assert rest.duration == pytest.approx(REST_GEMM_S + REST_MEMORY_S, rel=1e-12)
    assert rest.sm_bound_share == pytest.approx(REST_GEMM_S / (REST_GEMM_S + REST_MEMORY_S), rel=1e-12)
    assert compute["F0 part gemm (last step)"].sm_bound_share == 1.0
    # An all-reduce of both GPUs on a stream of its own starts with the part (after the GEMM beside the
    # all-gather's ring exchange) and ends inside it, its kernel holding 32 of 132 SMs.
    tails = [op.id for op in ops if op.name == "F0 part gemm (last step)"]
    ops += [CollectiveOp(id=len(ops) + rank, rank=rank, stream="dp", name="ar", op="all_reduce", group=(0, 1),
                         nbytes=256e6, key="ar", deps=(tail,), sms=32) for rank, tail in enumerate(tails)]
    result, _ = run_ops(topology, ops, NetworkSettings(), sm_share=H100)
    frame = result.log.to_frame()
    row = lambda name: frame[(frame["name"] == name) & (frame["rank"] == 0)].iloc[0]  # noqa: E731
    part, ar = row("F0 part"), row("ar")
    assert part["start_s"] == ar["start_s"] and ar["end_s"] < part["end_s"]
    # For the all-reduce's time L the part's SM-bound fifth runs at r = 100/132 of its speed, the rest at full
    # speed: each overlapped nominal second takes 0.2 / r + 0.8 (the whole forward's 0.6 would give 0.6 / r + 0.4).
    overlap = ar["end_s"] - ar["start_s"]
    r = (H100.sms - 32) / H100.sms
    share = REST_GEMM_S / (REST_GEMM_S + REST_MEMORY_S)
    assert part["end_s"] - part["start_s"] - rest.duration == pytest.approx(
        overlap * (1 - 1 / (share / r + 1 - share)), rel=1e-9)


DENSE = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 8192, microbatches: 4, micro_batch: 1, grad_accumulation_fusion: false}
parallelism: {tp: 4, cp: 2, pp: 2, sequence_parallel: true, tp_comm_overlap: true,
              pipeline: {schedule: zb-h1}}
"""
MOE = """
cluster: {topology: dgx-h100}
model: {preset: mixtral-8x7b, layers: 2, moe: {experts: 8, top_k: 2}}
training: {seq_len: 4096, microbatches: 2, micro_batch: 1}
parallelism: {tp: 2, ep: 4, sequence_parallel: true, tp_comm_overlap: true}
"""

@pytest.mark.parametrize("text", [DENSE, MOE], ids=["tp-overlap-cp-zb", "moe"])
def test_each_pass_splits_its_sm_bound_seconds_over_its_parts(text):
    # TP overlap's GEMMs and the rest between them, the CP ring's attention core and the rest, the MoE experts
    # and the rest, zero-bubble's input and weight gradients: each op's share times its seconds adds up, over
    # the ops of one pass of one block, to the SM-bound seconds of that pass's kernels.
    plan, _ = _plan(text)
    ops = [op for op in ProgramBuilder(plan, fold=True).build() if isinstance(op, ComputeOp) and op.microbatch == 0]
    checked, shares, weights = 0, set(), []
    for vstage, work in enumerate(plan.stages):
        for block in work.blocks:
            for phase in Pass:
                base = phase.op_name(0, block.name)
                parts = [op for op in ops if op.chunk == vstage and (op.name == base or op.name.startswith(base + " "))
                         and op.rank == ops_rank(ops, vstage)]
                if not parts:
                    continue
                checked += 1
                shares.update(round(op.sm_bound_share, 6) for op in parts)
                weights += [op.sm_bound_share for op in parts if phase is Pass.BACKWARD_WEIGHT]
                assert sum(op.sm_bound_share * op.duration for op in parts) == pytest.approx(
                    block.sm_bound_seconds(phase), rel=1e-9, abs=1e-15), (base, phase)
    assert checked >= 8 and len(shares) > 4  # many passes, and the parts' shares differ
    # Weight gradients with the unfused gradient accumulation's memory-bound adds are not all SM-bound.
    assert text == MOE or 0.5 < min(weights) < 1


def test_each_backward_pass_takes_the_sm_bound_seconds_of_its_own_kernels():
    # The attention and MLP blocks' input- and weight-gradient passes take the SM-bound seconds of the layer's
    # input- and weight-gradient kernels of that block (the attention block runs the layer's kernels from
    # input_norm to attn_residual), the full backward both; the CP attention core takes the attention kernel
    # of the input gradients in B and in the full backward, and nothing in W (it has no weights).
    plan, _ = _plan(DENSE)
    model, gpu = get_model("llama3-8b"), get_gpu("h100-sxm")
    efficiency = calibrated_efficiency(gpu.name, "bf16")
    kernels = layer_kernels(model, ShardShape(1, 8192, tp=4, cp=2, sequence_parallel=True,
                                              fused_grad_accumulation=False))
    attention = {"input_norm", "qkv_proj", "attention", "out_proj", "attn_residual"}
    blocks = {block.name: block for work in plan.stages for block in work.blocks}

    def bound(of_pass, in_attention: bool) -> float:
        return sm_bound_duration(tuple(k for k in of_pass if (k.name.split(".")[0] in attention) == in_attention),
                                 gpu, "bf16", efficiency)

    # One absolute anchor for the kernels the expectations are built from: the MLP's weight-gradient GEMMs are
    # gate, up and down, 2 t h f / tp FLOPs each over the t = 8,192 / cp tokens the TP rank gathers.
    mlp_wgrad = [k for k in kernels.backward_weight if k.kind == "matmul" and k.name.split(".")[0] not in attention]
    assert sum(k.flops for k in mlp_wgrad) == pytest.approx(3 * 2 * (8192 / 2) * model.hidden * model.ffn_hidden / 4,
                                                             rel=1e-12)
    for name, in_attention in (("L1.attn", True), ("L1.mlp", False)):
        block = blocks[name]
        inputs, weights = bound(kernels.backward_input, in_attention), bound(kernels.backward_weight, in_attention)
        assert inputs > 0 and weights > 0
        assert block.sm_bound_seconds(Pass.BACKWARD_INPUT) == pytest.approx(inputs, rel=1e-12)
        assert block.sm_bound_seconds(Pass.BACKWARD_WEIGHT) == pytest.approx(weights, rel=1e-12)
        assert block.sm_bound_seconds(Pass.BACKWARD) == pytest.approx(inputs + weights, rel=1e-12)
    core = tuple(k for k in kernels.backward_input if k.name == "attention.bwd")
    figures = (kernels_duration(core, gpu, "bf16", efficiency), sum(k.flops for k in core),
               sm_bound_duration(core, gpu, "bf16", efficiency))
    context = blocks["L1.attn"].context
    assert context is not None and figures[0] > 0
    assert context.core(Pass.BACKWARD_INPUT) == pytest.approx(figures, rel=1e-12)
    assert context.core(Pass.BACKWARD) == pytest.approx(figures, rel=1e-12)
    assert context.core(Pass.BACKWARD_WEIGHT) == (0.0, 0.0, 0.0)


def ops_rank(ops, vstage: int) -> int:
    """The first simulated rank that runs virtual stage ``vstage``."""
    return next(op.rank for op in ops if op.chunk == vstage)
