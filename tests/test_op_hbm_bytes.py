"""The HBM bytes a compute op carries into the timeline's `bytes` column: the figure the cost model times it by,
for the block passes (split into several ops or not), FSDP's copies and the optimizer step."""

from __future__ import annotations

import re

import pytest
from shared import SCENARIOS

from simulator.catalog.gpus import get_gpu
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.parallel.passes import Pass
from simulator.program.ops import ComputeOp
from simulator.simulation import simulate, step_program
from simulator.topology.loader import scenario_topology
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.training import build_training_step

FSDP_PP_TP_OVERLAP = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1, recompute: full}
parallelism: {tp: 4, pp: 2, dp: 2, sequence_parallel: true, tp_comm_overlap: true, fsdp: full_shard,
              pipeline: {schedule: 1f1b}}
"""
"""Pipelined FSDP with TP overlap and full recompute: the passes split into GEMM chunks, ring steps, dgrad and
wgrad ops, plus FSDP's copies."""

ZB_ZERO1 = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 2, pp: 2, dp: 2, sequence_parallel: true, zero: 1, pipeline: {schedule: zb-h1}}
"""
"""A zero-bubble schedule (input- and weight-gradient passes apart) under ZeRO-1."""

PASS_CATEGORIES = ("forward", "backward", "weight_grad", "recompute")


def _program_and_plan(text: str):
    loaded = scenario_from_text(text, "inline.yaml")
    topology = scenario_topology(loaded)
    plan = build_training_step(loaded.scenario, topology).plan
    ops = [op for op in step_program(loaded, topology, fold=True).ops if isinstance(op, ComputeOp)]
    return plan, ops


@pytest.mark.parametrize("text", [FSDP_PP_TP_OVERLAP, ZB_ZERO1], ids=["fsdp-pp-tp-overlap", "zb-h1-zero1"])
def test_a_rank_s_pass_ops_carry_its_blocks_kernel_bytes_every_micro_batch(text):
    plan, ops = _program_and_plan(text)
    for rank in sorted({op.rank for op in ops}):
        pp_rank = plan.layout.coords(rank)["pp"]
        blocks = [block for vstage in plan.rank_stages(pp_rank) for block in plan.stages[vstage].blocks]
        expected = plan.microbatches * sum(sum(block.hbm_bytes) for block in blocks)
        passes = [op for op in ops if op.rank == rank and op.category in PASS_CATEGORIES
                  and not op.name.startswith("fsdp ")]
        assert expected > 0
        assert sum(op.hbm_bytes for op in passes) == pytest.approx(expected, rel=1e-9)
        assert all(op.hbm_bytes > 0 for op in passes if op.duration > 0)


def test_fsdp_copies_and_the_optimizer_carry_the_bytes_their_time_is_costed_by():
    _, ops = _program_and_plan(FSDP_PP_TP_OVERLAP)
    rate = get_gpu("h100-sxm").hbm_bandwidth * calibrated_efficiency("h100-sxm", "bf16").memory_peak
    copies = [op for op in ops if op.name.startswith("fsdp ")]
    optimizer = [op for op in ops if op.category == "optimizer"]
    assert copies and optimizer
    for op in copies + optimizer:
        assert op.hbm_bytes > 0
        assert op.duration == pytest.approx(op.hbm_bytes / rate, rel=1e-12)


def test_the_timeline_bytes_of_compute_rows_are_the_ops_hbm_bytes():
    loaded = scenario_from_text(ZB_ZERO1, "inline.yaml")
    result = simulate(loaded)
    frame = result.log.to_frame()
    compute = frame[frame.kind == "compute"]
    ops: dict[tuple[int, str, int, int], float] = {}
    for op in step_program(loaded, result.topology, fold=True).ops:
        if isinstance(op, ComputeOp):
            assert ops.setdefault((op.rank, op.name, op.microbatch, op.chunk), op.hbm_bytes) == op.hbm_bytes
    assert len(compute) > 0
    for row in compute.itertuples():
        assert row.bytes == ops[(row.rank, row.name, row.microbatch, row.chunk)], row.name


SP_TP2 = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 4096, global_batch: 8, micro_batch: 1}
parallelism: {tp: 2, dp: 4, sequence_parallel: true}
"""
"""Sequence parallelism: each backward's dgrad and wgrad GEMMs run apart, beside the input's all-gather."""

CONTEXT_RING = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 8192, global_batch: 4, micro_batch: 1}
parallelism: {tp: 2, cp: 2, dp: 2, sequence_parallel: true}
"""
"""Ring attention: the attention core in two ops beside the K/V ring."""

MOE = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
model:
  preset: mixtral-8x7b
  layers: 2
  moe: {experts: 8, top_k: 2, capacity_factor: 1.25, routing: {balance: zipf, skew: 1.0}}
training: {seq_len: 2048, global_batch: 16, micro_batch: 1, grad_reduce_dtype: bf16}
parallelism: {tp: 2, ep: 8, sequence_parallel: true, zero: 1}
"""
"""A MoE block: the routed experts an op of their own between the all-to-alls."""

PASS_LETTERS = {"F": Pass.FORWARD, "R": Pass.RECOMPUTE, "B": Pass.BACKWARD}
OP_NAME = re.compile(r"(?P<pass>[FRB])(?P<mb>\d+) (?P<block>\S+)(?: (?P<part>.+))?")


def _part_bytes(block, phase: Pass, part: str, cp_rank: int) -> float:
    """The HBM bytes of the kernels behind the part ``part`` of pass ``phase`` of ``block``, all its ops together,
    on a rank of context-parallel rank ``cp_rank``."""
    backward = phase is Pass.BACKWARD
    if part == "dgrad":
        return block.overlap_gemm_bytes[3]
    if part == "wgrad":
        return block.column_wgrad_bytes
    if part == "gemm steps":
        return block.overlap_gemm_bytes[2 if backward else 0]
    if part == "gemm chunks":
        return block.overlap_gemm_bytes[3 if backward else 1]
    if part == "attention":
        return block.context.core_bytes(phase) * block.context.share(cp_rank)
    assert part == "experts", part
    return block.experts.part_bytes(phase)


@pytest.mark.parametrize("text,parts", [(SP_TP2, {"dgrad", "wgrad"}),
                                        (FSDP_PP_TP_OVERLAP, {"dgrad", "wgrad", "gemm steps", "gemm chunks"}),
                                        (CONTEXT_RING, {"dgrad", "wgrad", "attention"}),
                                        (MOE, {"dgrad", "wgrad", "experts"})],
                         ids=["sp", "tp-overlap", "context-ring", "moe"])
def test_each_op_of_a_split_pass_carries_its_own_kernels_bytes(text, parts):
    """A pass split into ops (the dgrad and wgrad GEMMs, TP-overlap GEMM steps and chunks, ring attention, routed
    experts) gives each part its own kernels' HBM bytes, not the pass's bytes shared by time: the llama3-8b TP2 SP
    MLP's dgrad moves 3.02e8 B in 0.73 ms, where the pass's mean rate would give it 5.73e8."""
    plan, ops = _program_and_plan(text)
    rank = ops[0].rank
    found: dict[tuple[int, int, str, str], float] = {}
    for op in ops:
        match = OP_NAME.fullmatch(op.name)
        if op.rank != rank or match is None or match["part"] is None:
            continue
        part = re.sub(r"^(gemm) \((?:first|last) steps?\)$", r"\1 steps", match["part"])
        part = re.sub(r"^(gemm) \(chunk \d+ of \d+\)$", r"\1 chunks", part)
        part = "attention" if part.startswith("attention") else part
        key = (op.chunk, int(match["mb"]), f"{match['pass']} {match['block']}", part)
        found[key] = found.get(key, 0.0) + op.hbm_bytes
    assert {key[3] for key in found} == parts
    for (vstage, _, name, part), nbytes in found.items():
        letter, block_name = name.split(" ")
        block = next(b for b in plan.stages[vstage].blocks if b.name == block_name)
        expected = _part_bytes(block, PASS_LETTERS[letter], part, plan.layout.coords(rank)["cp"])
        assert expected > 0
        assert nbytes == pytest.approx(expected, rel=1e-12), (name, part)


def test_a_parameter_server_worker_s_passes_carry_their_kernel_bytes():
    loaded = load_scenario(SCENARIOS / "parameter-server-vs-allreduce.yaml")
    ops = [op for op in step_program(loaded, scenario_topology(loaded), fold=True).ops
           if isinstance(op, ComputeOp) and op.category in ("forward", "backward")]
    assert ops and all(op.hbm_bytes > 0 for op in ops)
