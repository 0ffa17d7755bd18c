"""Option sets of the studies, defined once for the library and the command line (kept light: the CLI imports
it to build its parser)."""

from __future__ import annotations

from typing import Literal

Sharding = Literal["zero0", "zero1", "zero2", "fsdp"]
Recompute = Literal["none", "selective", "full"]
SHARDINGS: tuple[Sharding, ...] = ("zero0", "zero1", "zero2", "fsdp")
RECOMPUTES: tuple[Recompute, ...] = ("none", "selective", "full")
"""Recompute options from the least extra compute to the most: a lighter one that fits dominates."""
STUDY_CHARTS = ("sweep", "heatmap", "busbw", "front")
"""`trainsim plot` charts drawn from a sweep or search folder (report/study_plots.py)."""
