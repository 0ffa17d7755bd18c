"""fp16 dynamic loss scaling over a multi-step run (seed 001, 3.6.2): every step draws whether its gradients
overflow; an overflowing step is skipped (its forward and backward ran, its update is dropped) and halves the
scale, `growth_interval` clean steps in a row double it. Draws come from the run's seed, so the same scenario
gives the same skipped steps."""

from __future__ import annotations

import numpy as np

from simulator.config.precision import LossScalingConfig

LOSS_SCALING_STREAM = 0x6C7373
"""Spawn key of the overflow generator under the run's seed."""


def overflow_draws(config: LossScalingConfig, seed: int) -> np.ndarray:
    """Per step, whether its gradients overflow."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(LOSS_SCALING_STREAM,)))
    return rng.random(config.steps) < config.overflow_rate


def loss_scaling_summary(config: LossScalingConfig, seed: int) -> dict:
    """The summary's `loss_scaling` entry: steps, skipped steps and their share, the scale's range and end."""
    scale = low = config.initial_scale
    clean = 0
    overflows = overflow_draws(config, seed)
    for overflow in overflows:
        if overflow:
            scale /= 2.0
            low = min(low, scale)
            clean = 0
        else:
            clean += 1
            if clean == config.growth_interval:
                scale *= 2.0
                clean = 0
    skipped = int(overflows.sum())
    return {"steps": config.steps, "overflow_rate": config.overflow_rate, "skipped_steps": skipped,
            "skipped_fraction": skipped / config.steps, "useful_step_fraction": 1.0 - skipped / config.steps,
            "initial_scale": config.initial_scale, "min_scale": low, "final_scale": scale}
