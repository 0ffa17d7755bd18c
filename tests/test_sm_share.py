"""The SM-bound share of each compute op comes from the kernels that part of a block runs (engine/contention.py
slows only that share while communication kernels hold SMs): a part of known GEMM and memory-bound seconds
overlapped for a known time takes its closed form, and over every pass the parts' SM-bound seconds add up to
the pass's own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.catalog.calibration import sm_share, tp_overlap
from simulator.config.loader import scenario_from_text
from simulator.parallel.passes import Pass
from simulator.parallel.program import ProgramBuilder
from simulator.parallel.work import Block, StageWork
from simulator.program.ops import CollectiveOp, ComputeOp
from simulator.simulation import NetworkSettings, run_ops
from simulator.topology.loader import load_topology
from simulator.workload.training import build_training_step

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
    plan = replace(plan, stages=(StageWork((PART,), 0.0),), tp_overlap=tp_overlap("h100-sxm"))
    ops = ProgramBuilder(plan).build()
    compute = {op.name: op for op in ops if isinstance(op, ComputeOp) and op.rank == 0}
    rest = compute["F0 part"]
    assert rest.duration == pytest.approx(REST_GEMM_S + REST_MEMORY_S, rel=1e-12)
    assert rest.sm_bound_share == pytest.approx(REST_GEMM_S / (REST_GEMM_S + REST_MEMORY_S), rel=1e-12)
    assert compute["F0 part gemm"].sm_bound_share == 1.0
    # An all-reduce of both GPUs on a stream of its own starts with the part (after the all-gather's exposed
    # last chunk) and ends inside it, its kernel holding 32 of 132 SMs.
    tails = [op.id for op in ops if op.name == "tp all_gather part (last chunk)"]
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
PASSES = {"F": Pass.FORWARD, "B": Pass.BACKWARD, "Bi": Pass.BACKWARD_INPUT, "W": Pass.BACKWARD_WEIGHT,
          "R": Pass.RECOMPUTE}


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
            for prefix, phase in PASSES.items():
                base = f"{prefix}0 {block.name}"
                parts = [op for op in ops if op.chunk == vstage and (op.name == base or op.name.startswith(base + " "))
                         and op.rank == ops_rank(ops, vstage)]
                if not parts:
                    continue
                checked += 1
                shares.update(round(op.sm_bound_share, 6) for op in parts)
                weights += [op.sm_bound_share for op in parts if prefix == "W"]
                assert sum(op.sm_bound_share * op.duration for op in parts) == pytest.approx(
                    block.sm_bound_seconds(phase), rel=1e-9, abs=1e-15), (base, phase)
    assert checked >= 8 and len(shares) > 4  # many passes, and the parts' shares differ
    # Weight gradients with the unfused gradient accumulation's memory-bound adds are not all SM-bound.
    assert text == MOE or 0.5 < min(weights) < 1


@pytest.mark.parametrize("text", [DENSE, MOE], ids=["cp", "moe"])
def test_the_backward_pass_is_its_input_and_weight_gradient_passes(text):
    # Each pass takes the figures the Pass registry says it computes: a block's, a MoE block's routed experts'
    # and the CP attention core's backward is exactly its input-gradient pass plus its weight-gradient pass.
    plan, _ = _plan(text)
    blocks = [block for work in plan.stages for block in work.blocks]
    figures = [block.context.core for block in blocks if block.context is not None]
    figures += [block.experts.part for block in blocks if block.experts is not None]
    assert figures
    for block in blocks:
        assert block.sm_bound_seconds(Pass.BACKWARD) == pytest.approx(
            block.sm_bound_seconds(Pass.BACKWARD_INPUT) + block.sm_bound_seconds(Pass.BACKWARD_WEIGHT), rel=1e-12)
    for of_pass in figures:
        whole, inputs, weights = (of_pass(phase) for phase in (Pass.BACKWARD, Pass.BACKWARD_INPUT,
                                                               Pass.BACKWARD_WEIGHT))
        assert whole == pytest.approx(tuple(i + w for i, w in zip(inputs, weights, strict=True)), rel=1e-12)


def ops_rank(ops, vstage: int) -> int:
    """The first simulated rank that runs virtual stage ``vstage``."""
    return next(op.rank for op in ops if op.chunk == vstage)
