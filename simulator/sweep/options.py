"""Option sets of the studies, defined once for the library and the command line (kept light: the CLI imports
it to build its parser)."""

from __future__ import annotations

from typing import Literal, get_args

from simulator.config.training_options import RECOMPUTE_MODES, Recompute

Sharding = Literal["zero0", "zero1", "zero2", "fsdp"]
SHARDINGS: tuple[Sharding, ...] = get_args(Sharding)
RECOMPUTES: tuple[Recompute, ...] = RECOMPUTE_MODES
"""Recompute options (`training.recompute`'s set) from the least extra compute to the most: a lighter one that
fits dominates."""
STUDY_CHARTS = ("sweep", "heatmap", "busbw", "front")
"""`trainsim plot` charts drawn from a sweep or search folder (report/study_plots.py)."""
