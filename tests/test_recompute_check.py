"""Selective recompute (Megatron's core-attention recompute) drops the attention's stored s x s scores; flash
attention stores none, so the recompute saves no memory and still runs every layer's attention forward again in
the backward. Llama 3 8B, DP 8 on one DGX H100 (the bundled llama3-8b-dgx-h100-dp8 layout): with flash
attention the step's memory is the same with selective recompute as without, its compute 40.31 ms longer per
GPU, and the run says so in one warning line; with standard attention, or full recompute, it saves memory and
nothing is said."""

from __future__ import annotations

import pytest

from simulator.config.loader import scenario_from_text
from simulator.preflight import validate
from simulator.program.ops import ComputeOp
from simulator.recompute_check import recompute_seconds
from simulator.scale import sized_topology
from simulator.simulation import step_program
from simulator.units import format_duration

LLAMA_8B_DP8 = """cluster: {{topology: dgx-h100}}
model: {{preset: llama3-8b}}
training: {{seq_len: 4096, global_batch: 32, micro_batch: 1, recompute: {recompute}, attention: {attention}}}
parallelism: {{tp: 1, pp: 1, dp: 8, zero: 1}}
"""


def _checked(tmp_path, recompute: str, attention: str = "flash"):
    """The scenario loaded, its validate verdict and its step program."""
    loaded = scenario_from_text(LLAMA_8B_DP8.format(recompute=recompute, attention=attention),
                                source=str(tmp_path / "s.yaml"))
    topology = sized_topology(loaded, force=False)
    return loaded, validate(loaded, topology), step_program(loaded, topology, fold=True)


def _compute_s(program) -> float:
    return sum(op.duration for op in program.ops if isinstance(op, ComputeOp) and op.rank == 0)


def test_selective_recompute_under_flash_attention_saves_nothing_and_says_what_it_costs(tmp_path):
    _, selective, program = _checked(tmp_path, "selective")
    _, none, plain = _checked(tmp_path, "none")
    assert selective.memory == none.memory
    cost = _compute_s(program) - _compute_s(plain)
    assert recompute_seconds(program)[0] == pytest.approx(cost, rel=1e-12)
    assert cost == pytest.approx(40.31e-3, abs=0.01e-3)
    share = cost / _compute_s(program)
    assert [line for line in selective.warnings if "training.recompute" in line] == [
        f"{tmp_path / 's.yaml'}:3: training.recompute: selective recompute saves no memory under flash attention, "
        "which stores no s x s attention scores for it to drop, and runs every layer's attention forward again in "
        f"the backward: {format_duration(cost)} of compute per step on the busiest GPU ({share:.1%} of its "
        "compute) (allowed: none (the same memory, less time) or full (less memory))"]
    assert not [line for line in none.warnings if "training.recompute" in line]


@pytest.mark.parametrize(("recompute", "attention"), [("selective", "standard"), ("full", "flash")])
def test_a_recompute_that_saves_memory_is_not_warned_of(tmp_path, recompute, attention):
    _, verdict, _ = _checked(tmp_path, recompute, attention)
    _, kept, _ = _checked(tmp_path, "none", attention)
    assert verdict.memory["peak_memory_gib"] < kept.memory["peak_memory_gib"]
    assert not [line for line in verdict.warnings if "training.recompute" in line]


PIPELINED_8B = """cluster: {{topology: dgx-h100}}
model: {{preset: llama3-8b}}
training: {{seq_len: 4096, global_batch: 32, micro_batch: 1, recompute: {recompute}}}
parallelism: {{tp: 1, pp: 4, dp: 2, zero: 1, pipeline: {{schedule: {schedule}, virtual_stages: {chunks}}}}}
"""


@pytest.mark.parametrize(("schedule", "chunks", "warned"), [("zb-h1", 1, True), ("zbv", 2, False),
                                                             ("1f1b", 1, False)])
def test_full_recompute_where_deferred_weight_gradients_set_the_peak_says_it_saves_little(tmp_path, schedule,
                                                                                          chunks, warned):
    """Under zb-h1 each deferred W keeps its layer's GEMM inputs, which full recompute rebuilt, so the peak is
    47.41 GiB without it and 46.46 with (less than the 1 GiB an out-of-memory remedy must save): the run says so
    with both peaks and the recompute's cost. Under zbv here (35.30 against 50.25 GiB) and 1F1B full recompute
    saves memory and nothing is said."""
    def checked(recompute: str):
        loaded = scenario_from_text(PIPELINED_8B.format(recompute=recompute, schedule=schedule, chunks=chunks),
                                    source=str(tmp_path / "s.yaml"))
        topology = sized_topology(loaded, force=False)
        return validate(loaded, topology), step_program(loaded, topology, fold=True)

    (full, program), (none, _) = checked("full"), checked("none")
    lines = [line for line in full.warnings if "training.recompute" in line]
    if not warned:
        assert full.memory["peak_memory_gib"] < none.memory["peak_memory_gib"] and lines == []
        return
    peak, without = full.memory["peak_memory_gib"], none.memory["peak_memory_gib"]
    assert (peak, without) == (pytest.approx(46.46, abs=0.005), pytest.approx(47.41, abs=0.005))
    seconds = recompute_seconds(program)[0]
    assert lines == [
        f"{tmp_path / 's.yaml'}:3: training.recompute: full recompute saves {without - peak:.2f} GiB under "
        f"{schedule} (peak {peak:.2f} GiB, {without:.2f} GiB without), whose deferred W's keep the GEMM inputs "
        "the recompute rebuilt, and runs every layer's forward again in the backward: "
        f"{format_duration(seconds)} of compute per step on the busiest GPU "
        f"({seconds / recompute_seconds(program)[1]:.1%} of its compute) (allowed: none (about the same memory, "
        "less time), or full under a schedule without deferred W's (1f1b, interleaved))"]
