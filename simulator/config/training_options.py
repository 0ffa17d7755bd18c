"""The option sets of the `training:` section, each defined once: the schema checks a scenario against them at
load, and the models that take them (workload/memory.py, workload/training.py, workload/transformer.py) key
their tables by them and name them in their errors."""

from __future__ import annotations

from typing import Literal, get_args

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
"""Training precision: the GEMMs' peak and the bytes of activations, weights and gradients (fp8 keeps 16-bit
weights and gradients)."""
Optimizer = Literal["adam", "adamw", "sgd", "sgd_momentum"]
"""The optimizer: its state per parameter (memory) and the bytes its step streams through HBM."""
Recompute = Literal["none", "selective", "full"]
"""Activation recomputation: none, the attention core only (selective), or each layer's whole forward (full)."""

PRECISIONS: tuple[Precision, ...] = get_args(Precision)
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
RECOMPUTE_MODES: tuple[Recompute, ...] = get_args(Recompute)
