"""The option sets of a model's shape that a scenario may give (`model.norm`), defined once: the schema checks a
scenario against them at load, the catalog's presets use them and the cost model (workload/transformer.py,
workload/eager.py) keys its tables by them."""

from __future__ import annotations

from typing import Literal, get_args

Norm = Literal["rmsnorm", "layernorm"]
"""The normalisation layers of a model (RMSNorm: a scale; LayerNorm: a scale and a shift)."""
NORMS: tuple[Norm, ...] = get_args(Norm)

SYNTHETIC_NO_OPS: dict[tuple[str, str], str] = {
    ("parallelism", "ddp"): "a synthetic model has no gradients to reduce",
    ("parallelism", "zero"): "a synthetic model has no model state to shard",
    ("parallelism", "fsdp"): "a synthetic model has no parameters to shard or gather",
    ("training", "precision"): "a synthetic model gives its stages' times and holds no weights, which no "
                               "precision changes",
    ("training", "optimizer"): "a synthetic model has no optimizer state or step",
    ("training", "grad_reduce_dtype"): "a synthetic model has no gradients to reduce",
}
"""The fields a synthetic model (`model.synthetic`: fixed per-stage times, no parameters, memory or gradients)
cannot be changed by, with why: a scenario or a sweep axis that sets one is warned once (it changed nothing in a
sweep's points but their number)."""
