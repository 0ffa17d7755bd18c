"""ZeRO-2 with `ddp.reduce_every_microbatch`: each micro-batch's gradients reduce-scattered as the backward
produces them, only the shard accumulated (PyTorch FSDP outside no_sync, DeepSpeed ZeRO-2; Llama 3's FSDP)."""

from __future__ import annotations

import pytest

from simulator.catalog.models import get_model

LLAMA_8B_ZERO2 = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b}
training: {seq_len: 1024, global_batch: 32, micro_batch: 1}
parallelism: {tp: 1, pp: 1, dp: 8, zero: 2}
collectives: {algorithm: ring}
"""
PARAM_BYTES = get_model("llama3-8b").num_params() * 2
GRAD_BYTES = get_model("llama3-8b").num_params() * 4
"""bf16 weights gathered, gradients reduced in Megatron-LM's fp32 buffer (training.grad_reduce_dtype)."""


def test_every_micro_batch_reduce_scatters_its_gradients(run_yaml):
    # m = 4 micro-batches: 4 ring reduce-scatters of the whole gradient and one all-gather of the weights after
    # the optimizer, each moving 7/8 of the bytes per GPU: 7/8 (m grads + params), against 7/8 (grads + params).
    accumulated = run_yaml(LLAMA_8B_ZERO2).summary
    sharded = run_yaml(LLAMA_8B_ZERO2, "parallelism.ddp.reduce_every_microbatch=true")
    assert accumulated["traffic_bytes_per_gpu"]["dp"] == pytest.approx(7 / 8 * (GRAD_BYTES + PARAM_BYTES), rel=1e-12)
    assert sharded.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(7 / 8 * (4 * GRAD_BYTES + PARAM_BYTES),
                                                                          rel=1e-12)
    frame = sharded.timeline
    scatters = frame[(frame["kind"] == "collective") & (frame["rank"] == 0) & (frame["category"] == "dp")
                     & frame["name"].str.startswith("reduce_scatter grads")]
    units = 32 + 2  # one per layer (PyTorch FSDP's unit: attention and MLP together), the embedding and the head
    assert len(scatters) == 4 * units
    assert not frame["name"].str.contains("bucket").any()


def test_sharded_gradients_take_zero2_memory_under_accumulation(run_yaml):
    # Seed 003: Llama-3.1-8B on 8 GPUs, ZeRO-1 44.2 GB, ZeRO-2 30.1 GB. Accumulating the whole gradient keeps
    # ZeRO-1's memory; reducing every micro-batch keeps ZeRO-2's, plus two layers of unsharded gradients
    # waiting for their reduce-scatter (2 x 218.1e6 params x 2 B) in place of two 25 MiB buckets. The seed counts
    # 16-bit gradients: bf16 reduced in bf16.
    def state_and_buffers(*overrides):
        gib = run_yaml(LLAMA_8B_ZERO2, "training.grad_reduce_dtype=bf16", *overrides).summary["memory_breakdown_gib"]
        return (gib["params"] + gib["grads"] + gib["optimizer"]) * 2**30 / 1e9, gib["buffers"] * 2**30

    accumulated, bucket_bytes = state_and_buffers()
    sharded, gradient_bytes = state_and_buffers("parallelism.ddp.reduce_every_microbatch=true")
    assert accumulated == pytest.approx(44.2, rel=0.01)
    assert sharded == pytest.approx(30.1, rel=0.01)
    assert bucket_bytes == 2 * 25 * 2**20
    assert gradient_bytes == pytest.approx(2 * 218.1e6 * 2, rel=1e-3)


@pytest.mark.parametrize("zero", [0, 1])
def test_reduce_every_microbatch_needs_sharded_gradients(validation_error, zero):
    error = validation_error(LLAMA_8B_ZERO2, f"parallelism.zero={zero}",
                             "parallelism.ddp.reduce_every_microbatch=true")
    assert error.field == "parallelism.ddp.reduce_every_microbatch"
    assert f"not ZeRO stage {zero}" in error.problem


@pytest.mark.parametrize(("overrides", "warned"), [
    ((), True),  # m = 4, accumulated whole: ZeRO-1's step exactly
    (("parallelism.ddp.reduce_every_microbatch=true",), False),  # DeepSpeed's ZeRO-2
    (("parallelism.ddp.reduce_every_microbatch=false",), False),  # asked for
    (("training.global_batch=8",), False),  # one micro-batch: its gradients are sharded after the backward
    (("parallelism.fsdp=shard_grad_op", "parallelism.zero=0"), False),  # FSDP1's own shard_grad_op
])
def test_zero2_that_runs_as_zero1_says_so_naming_the_option(overrides, warned):
    """`zero: 2` left to accumulate whole gradients over several micro-batches holds, sends and takes exactly what
    `zero: 1` does: the run warns once, at the field, naming the option that makes it ZeRO-2."""
    from simulator.config.loader import scenario_from_text
    from simulator.preflight import validate
    from simulator.topology.loader import scenario_topology

    loaded = scenario_from_text(LLAMA_8B_ZERO2, "inline.yaml", list(overrides))
    warnings = [warning for warning in validate(loaded, scenario_topology(loaded)).warnings
                if "ZeRO-1's memory" in warning]
    assert warnings == ([
        "inline.yaml:5: parallelism.zero: zero: 2 with ddp.reduce_every_microbatch left out accumulates whole "
        "gradients and reduce-scatters them once per step (Megatron-LM's distributed optimizer), so it holds "
        "ZeRO-1's memory and sends its traffic (allowed: parallelism.ddp.reduce_every_microbatch: true for "
        "DeepSpeed's ZeRO-2 (each micro-batch's gradients reduce-scattered, only the shard kept), or zero: 1 for "
        "the same step)"] if warned else [])


@pytest.mark.parametrize(("sharding", "pp", "every"), [
    ("fsdp: shard_grad_op", 1, True),  # FSDP2 (and FSDP1 outside no_sync) reduce-scatters every backward
    ("fsdp: shard_grad_op", 4, False),  # torch.distributed.pipelining's no-sync, reduced once per stage
    ("fsdp: full_shard", 1, True),
    ("fsdp: full_shard", 4, False),
    ("zero: 2", 1, False),  # Megatron-LM's distributed optimizer accumulates
    ("zero: 3", 4, True),  # DeepSpeed ZeRO-3
])
def test_reduce_every_microbatch_left_out_follows_the_framework(sharding, pp, every):
    from simulator.config.loader import scenario_from_text

    text = LLAMA_8B_ZERO2.replace("zero: 2", sharding).replace("pp: 1", f"pp: {pp}").replace("dp: 8", "dp: 2")
    parallelism = scenario_from_text(text, "inline.yaml").scenario.parallelism
    assert parallelism.reduce_every_microbatch(pp) is every


def test_fsdp_shard_grad_op_holds_zero2_memory_by_default(run_yaml):
    """PyTorch FSDP's SHARD_GRAD_OP without pipelining keeps only the gradient shard across micro-batches, as
    `reduce_every_microbatch: true` asks, not the whole fp32 gradient as Megatron's ZeRO-2 does."""
    fsdp = ("parallelism.zero=0", "parallelism.fsdp=shard_grad_op")
    left_out = run_yaml(LLAMA_8B_ZERO2, *fsdp).summary
    every = run_yaml(LLAMA_8B_ZERO2, *fsdp, "parallelism.ddp.reduce_every_microbatch=true").summary
    assert left_out["memory_breakdown_gib"] == every["memory_breakdown_gib"]
    assert left_out["traffic_bytes_per_gpu"] == every["traffic_bytes_per_gpu"]
    assert left_out["memory_breakdown_gib"]["buffers"] < GRAD_BYTES / 8 / 2**30


@pytest.mark.parametrize(("scenario", "overrides", "field", "supported"), [
    (None, ("parallelism.zero=3",), "parallelism.zero",
     "fsdp: full_shard (torchtitan runs FSDP under pipelining), zero: 0 to 2, or pp: 1"),
    (None, ("parallelism.ddp.reduce_every_microbatch=true",), "parallelism.ddp.reduce_every_microbatch",
     "fsdp: shard_grad_op with this true for ZeRO-2 under pipelining (as Llama 3's own runtime runs it), left out "
     "for Megatron-LM's ZeRO-2, or pp: 1"),
    (None, ("parallelism.zero=0", "parallelism.fsdp=shard_grad_op", "parallelism.ddp.reduce_every_microbatch=true"),
     None, None),  # Llama 3's own runtime
    (None, ("parallelism.zero=3", "parallelism.pp=1", "parallelism.dp=8"), None, None),
    ("schedule-1f1b-p4-m8", ("parallelism.zero=3",), None, None),  # a synthetic model: zero changes nothing
])
def test_deepspeed_sharding_under_pipelining_is_warned_once_at_its_field(scenario, overrides, field, supported):
    """DeepSpeed's PipelineEngine refuses ZeRO-2 and ZeRO-3 and Megatron-FSDP does not pipeline: `zero: 3`, `zero: 2`
    reducing every micro-batch (DeepSpeed's ZeRO-2), with pp > 1 are simulated with one warning at the field that
    names the route that trains (``scenario`` None: Llama-3-8B at pp 2). A synthetic model's sharding changes
    nothing, which is its one warning there, not this one besides."""
    from simulator.config.loader import load_scenario, scenario_from_text
    from simulator.simulation import scenario_warnings
    from simulator.topology.loader import scenario_topology

    loaded = (scenario_from_text(LLAMA_8B_ZERO2.replace("pp: 1, dp: 8", "pp: 2, dp: 4"), "inline.yaml",
                                 list(overrides))
              if scenario is None else load_scenario(scenario, list(overrides)))
    warnings = [warning for warning in scenario_warnings(loaded, scenario_topology(loaded))
                if "pipeline parallelism" in warning]
    if field is None:
        assert warnings == []
        return
    assert len(warnings) == 1
    assert f"--set {field}=" in warnings[0] and "DeepSpeed refuses it with pipeline parallelism" in warnings[0]
    assert warnings[0].endswith(f"(allowed: {supported})")


def test_zero2_that_runs_as_zero1_under_pipelining_names_fsdp_for_zero2():
    """Under pipelining DeepSpeed's ZeRO-2 is refused (see above): the ZeRO-1 warning names the route that trains."""
    from simulator.config.loader import scenario_from_text
    from simulator.preflight import validate
    from simulator.topology.loader import scenario_topology

    loaded = scenario_from_text(LLAMA_8B_ZERO2.replace("pp: 1, dp: 8", "pp: 2, dp: 4"), "inline.yaml")
    warnings = [warning for warning in validate(loaded, scenario_topology(loaded)).warnings
                if "ZeRO-1's memory" in warning]
    assert len(warnings) == 1
    assert warnings[0].endswith(
        "(allowed: fsdp: shard_grad_op with parallelism.ddp.reduce_every_microbatch: true for ZeRO-2 under "
        "pipelining (Llama 3's own runtime; DeepSpeed's ZeRO-2 refuses pipelining), or zero: 1 for the same step)")
