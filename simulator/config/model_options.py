"""The option sets of a model's shape that a scenario may give (`model.norm`), defined once: the schema checks a
scenario against them at load, the catalog's presets use them and the cost model (workload/transformer.py,
workload/eager.py) keys its tables by them."""

from __future__ import annotations

from typing import Literal, get_args

Norm = Literal["rmsnorm", "layernorm"]
"""The normalisation layers of a model (RMSNorm: a scale; LayerNorm: a scale and a shift)."""
NORMS: tuple[Norm, ...] = get_args(Norm)
