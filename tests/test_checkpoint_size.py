"""A checkpoint holds what the scenario's framework saves for its layout and precision, no gradients
(checkpoint.layout_bytes_per_param): 14 B a parameter under Megatron-LM and DeepSpeed, 12 B under PyTorch FSDP2, as
docs/reliability.md says, not 16 B for every layout."""

from __future__ import annotations

import pytest

from simulator.config.loader import load_scenario
from simulator.reliability.checkpoint import checkpoint_bytes, layout_bytes_per_param
from simulator.reliability.simulate import _checkpoint_size
from simulator.workload.training import resolve_model


@pytest.mark.parametrize(("scenario", "settings", "per_param"), [
    ("llama3-70b-2k-job", [], 14.0),  # FSDP1 shard_grad_op: bf16 weights, fp32 master, Adam's m and v
    ("llama3-8b-dgx-h100-dp8", [], 14.0),  # Megatron-LM's distributed optimizer (ZeRO-1)
    ("llama3-8b-dgx-h100-dp8", ["parallelism.zero=3"], 14.0),  # DeepSpeed ZeRO-3
    ("llama3-8b-dgx-h100-dp8", ["training.precision=fp16"], 14.0),
    ("llama3-8b-dgx-h100-zero3", [], 12.0),  # FSDP2 full_shard: fp32 shards, no master copy
    ("llama3-70b-torchtitan-pp-fsdp", [], 12.0),
    ("llama3-8b-dgx-h100-eager-fsdp", [], 12.0),
    ("llama3-8b-dgx-h100-dp8", ["training.precision=fp32"], 12.0),
    ("llama3-8b-dgx-h100-dp8", ["training.optimizer=sgd"], 6.0),
    ("llama3-8b-dgx-h100-dp8", ["training.optimizer=sgd_momentum"], 10.0),
])
def test_a_checkpoint_holds_what_the_layouts_framework_saves(scenario, settings, per_param):
    assert layout_bytes_per_param(load_scenario(scenario, settings).scenario) == per_param


def test_the_job_sizes_its_checkpoint_from_its_layout_unless_told():
    """Llama 3 70B under FSDP shard_grad_op: 70.55e9 x 14 B = 0.988 TB (1.129 TB at 16 B); an explicit `bytes_per_param`
    or `size` still wins."""
    loaded = load_scenario("llama3-70b-2k-job")
    params = resolve_model(loaded.scenario).num_params()
    assert _checkpoint_size(loaded) == params * 14
    assert _checkpoint_size(load_scenario("llama3-70b-2k-job", ["checkpoint.bytes_per_param=16"])) == params * 16
    told = load_scenario("llama3-70b-2k-job", ["checkpoint.size=1 TB"]).scenario
    assert checkpoint_bytes(told, params) == 1e12
