"""Precision: fp16 dynamic loss scaling over a multi-step run (skipped steps from a seeded overflow rate, the
scale halving on each overflow), and the precision checks (loss scaling only with fp16, fp8 only where the GPU
has it)."""

from __future__ import annotations

import pytest

from simulator.config.precision import LossScalingConfig
from simulator.workload.loss_scaling import loss_scaling_summary, overflow_draws

SCENARIO = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 2}
training:
  seq_len: 2048
  microbatches: 1
  precision: fp16
  loss_scaling: {steps: 1000, overflow_rate: 0.01}
parallelism: {tp: 8}
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_percent_overflow_skips_about_one_percent_of_1000_steps(run_yaml, seed):
    """Binomial(1000, 0.01): 10 skipped steps, standard deviation 3.1; within 2 sd (0.6 %)."""
    report = run_yaml(SCENARIO, f"run.seed={seed}").summary["loss_scaling"]
    assert report["skipped_steps"] == int(overflow_draws(LossScalingConfig(overflow_rate=0.01), seed).sum())
    assert report["skipped_fraction"] == pytest.approx(0.01, abs=0.0062)
    assert report["useful_step_fraction"] == 1 - report["skipped_fraction"]


def test_each_overflow_halves_the_scale_and_clean_runs_double_it():
    no_growth = LossScalingConfig(steps=1000, overflow_rate=0.02, growth_interval=10_000)
    report = loss_scaling_summary(no_growth, 5)
    assert report["final_scale"] == 65536.0 / 2 ** report["skipped_steps"]
    clean = loss_scaling_summary(LossScalingConfig(steps=1000, overflow_rate=0.0, growth_interval=100), 5)
    assert clean["skipped_steps"] == 0 and clean["final_scale"] == 65536.0 * 2**10


def test_same_seed_same_skipped_steps_other_seed_others():
    config = LossScalingConfig(steps=1000, overflow_rate=0.01)
    assert (overflow_draws(config, 3) == overflow_draws(config, 3)).all()
    assert (overflow_draws(config, 3) != overflow_draws(config, 4)).any()


@pytest.mark.parametrize(("text", "overrides", "field", "problem"), [
    (SCENARIO, ["training.precision=bf16"], "training", "loss_scaling applies to fp16"),
    (SCENARIO.replace("dgx-h100", "dgx-a100"), ["training.precision=fp8", "training.loss_scaling=null"],
     "training.precision", "has no 'fp8' peak"),
])
def test_precision_misuse_is_a_located_error(validation_error, text, overrides, field, problem, assert_located):
    error = validation_error(text, *overrides)
    assert_located(error, tuple(overrides), field, problem)
