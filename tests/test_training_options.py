"""The `training:` option sets are defined once (config/training_options.py): every table keyed by one covers
exactly its members, the schema accepts each member and nothing else, and the optimizers' costs follow their
bytes per parameter exactly."""

from __future__ import annotations

import pytest

from simulator.config.loader import scenario_from_text
from simulator.config.training_options import (
    DEFAULT_GRAD_REDUCE,
    GRAD_REDUCE_BYTES,
    GRAD_REDUCE_DTYPES,
    OPTIMIZERS,
    PARAM_DTYPE,
    PRECISIONS,
    REDUCE_DTYPES_OF,
)
from simulator.topology.loader import scenario_topology
from simulator.workload.memory import OPTIMIZER_MOMENT_BYTES
from simulator.workload.memory_plan import stage_memory
from simulator.workload.training import (
    PRECISION_BYTES,
    UPDATE_BYTES_PER_PARAM,
    build_training_step,
    optimizer_bytes_per_param,
)

LLAMA_8B_DP8 = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 1, pp: 1, dp: 8, zero: 0}
"""


def test_tables_cover_each_option_set_exactly():
    assert tuple(PRECISION_BYTES) == PRECISIONS == tuple(DEFAULT_GRAD_REDUCE) == tuple(PARAM_DTYPE)
    assert tuple(GRAD_REDUCE_BYTES) == GRAD_REDUCE_DTYPES
    assert all(DEFAULT_GRAD_REDUCE[precision] in REDUCE_DTYPES_OF[precision] for precision in PRECISIONS)
    assert tuple(UPDATE_BYTES_PER_PARAM) == OPTIMIZERS
    assert tuple(OPTIMIZER_MOMENT_BYTES) == OPTIMIZERS


def _optimizer_costs(optimizer: str) -> tuple[float, float, float]:
    """(optimizer step seconds, optimizer state bytes, parameters) of the one pipeline stage."""
    loaded = scenario_from_text(LLAMA_8B_DP8, "inline.yaml", [f"training.optimizer={optimizer}"])
    step = build_training_step(loaded.scenario, scenario_topology(loaded))
    (breakdown, _), = stage_memory(loaded.scenario, step)
    return step.plan.optimizer_s[0], breakdown.optimizer, breakdown.params / 2


def test_each_optimizer_costs_its_bytes_per_parameter():
    """Mixed precision, no sharding: optimizer state = (4 B master + moments) per parameter; the step streams
    38, 38, 22 and 30 B per parameter through HBM with bf16 (update, gradient norm, master-to-bf16 copy), so
    its time scales by exactly those bytes."""
    costs = {optimizer: _optimizer_costs(optimizer) for optimizer in OPTIMIZERS}
    params = costs["adam"][2]
    for optimizer, (seconds, state, _) in costs.items():
        assert state == pytest.approx((4 + OPTIMIZER_MOMENT_BYTES[optimizer]) * params, rel=1e-12)
        assert seconds / costs["sgd"][0] == pytest.approx(optimizer_bytes_per_param(optimizer, "bf16") / 22.0,
                                                          rel=1e-12)
    assert costs["adamw"] == costs["adam"]
    assert costs["sgd_momentum"][1] == pytest.approx(2 * costs["sgd"][1], rel=1e-12)


def test_an_optimizer_outside_the_set_is_refused_at_load(validation_error):
    error = validation_error(LLAMA_8B_DP8, "training.optimizer=lion")
    assert error.field == "training.optimizer"
    assert all(optimizer in error.allowed for optimizer in OPTIMIZERS)


def test_none_unsets_fsdp_as_its_documented_default_and_every_refusal_says_so(validation_error):
    """docs list `fsdp`'s default as `none`, and `--set parallelism.fsdp=none` reads as left out, as `null` does (not
    "'none' is not a valid choice"), so the bundled FSDP scenario can be compared with DeepSpeed's `zero: 3`; every
    refusal, 'give zero or fsdp, not both' too, says how to unset it."""
    fsdp = LLAMA_8B_DP8.replace("zero: 0", "fsdp: full_shard")
    loaded = scenario_from_text(fsdp, "inline.yaml", ["parallelism.fsdp=none", "parallelism.zero=3"])
    assert (loaded.scenario.parallelism.fsdp, loaded.scenario.parallelism.zero_stage) == (None, 3)
    both = validation_error(fsdp, "parallelism.zero=3")
    assert (both.field, both.allowed) == ("parallelism.fsdp", "one of them; unset the other with fsdp: none or zero: 0")
    unknown = validation_error(fsdp, "parallelism.fsdp=off")
    assert unknown.problem == "'off' is not a valid choice"
    assert unknown.allowed == "none, full_shard, shard_grad_op, hybrid_shard or no_shard"


def test_a_sections_check_blaming_one_field_names_the_overrides_under_the_section(validation_error):
    """`give zero or fsdp, not both` is located at `fsdp`, the file's line, but failed because of `--set
    parallelism.zero=3`, which went unsaid (README: such checks name the overrides under the fields they read).
    A section's check across its fields names every override under the section."""
    fsdp = LLAMA_8B_DP8.replace("zero: 0", "fsdp: full_shard")
    both = validation_error(fsdp, "parallelism.zero=3")
    assert (both.field, both.problem) == ("parallelism.fsdp", "give zero or fsdp, not both (with --set "
                                                              "parallelism.zero=3)")
