"""The HBM bytes a compute op carries into the timeline's `bytes` column: the figure the cost model times it by,
for the block passes (split into several ops or not), FSDP's copies and the optimizer step."""

from __future__ import annotations

import pytest
from shared import SCENARIOS

from simulator.catalog.gpus import get_gpu
from simulator.config.loader import load_scenario, scenario_from_text
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
    frame = simulate(loaded).log.to_frame()
    compute = frame[frame.kind == "compute"]
    assert len(compute) > 0
    assert (compute.bytes > 0).all()


def test_a_parameter_server_worker_s_passes_carry_their_kernel_bytes():
    loaded = load_scenario(SCENARIOS / "parameter-server-vs-allreduce.yaml")
    ops = [op for op in step_program(loaded, scenario_topology(loaded), fold=True).ops
           if isinstance(op, ComputeOp) and op.category in ("forward", "backward")]
    assert ops and all(op.hbm_bytes > 0 for op in ops)
