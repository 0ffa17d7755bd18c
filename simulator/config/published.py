"""The `published:` section: the published measurement a scenario of scenarios/published/ reproduces.

`trainsim validate-published` runs every such scenario and writes docs/validation.md from them, so the
reference figure, its source and whether anything was fitted on it live next to the scenario that checks it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from simulator.config.sections import Section

Metric = Literal["tflops_per_gpu", "megatron_tflops_per_gpu", "busbw_gbps"]
"""Figures a case can be compared on: the summary's model TFLOP/s per GPU (6N + causal attention), TFLOP/s per
GPU counted with Megatron-LM's formula (SC21, full recompute), or the first collective's nccl-tests busbw."""


class PublishedConfig(Section):
    """`source` (paper, table, row), `metric` and published `value` (TFLOP/s per GPU or GB/s), the relative
    `tolerance` the test allows, and `fitted`: "no", or what was fitted on this case."""

    source: str
    metric: Metric
    value: float = Field(gt=0)
    tolerance: float = Field(default=0.08, gt=0, lt=1)
    fitted: str = "no"
