"""The `training.loss_scaling:` section: fp16 dynamic loss scaling over a multi-step run."""

from __future__ import annotations

from pydantic import Field

from simulator.config.sections import Section


class LossScalingConfig(Section):
    """Dynamic loss scaling (fp16 only): the run of `steps` steps starts at `initial_scale`; a step whose
    gradients overflow (probability `overflow_rate`, drawn from the run's seed) is skipped and halves the scale;
    `growth_interval` clean steps in a row double it (PyTorch GradScaler's defaults: 65536, 2000)."""

    steps: int = Field(default=1000, ge=1, le=10_000_000)
    overflow_rate: float = Field(default=0.0, ge=0, le=1)
    initial_scale: float = Field(default=65536.0, gt=0)
    growth_interval: int = Field(default=2000, ge=1)
