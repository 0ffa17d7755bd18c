"""The link classes and the named efficiency profiles over them, defined once and importing nothing: every link
of a topology has a class (the builders choose it, an explicit graph's link names it), and `network.efficiency`
gives each its fraction of line rate, or names a profile (network/calibration.py). In config/, importing nothing,
so that the schema keys that section by it without loading the topology code, and the topology reads it in the
direction the data flows."""

from __future__ import annotations

from typing import Literal, get_args

LinkClass = Literal["nvlink", "pcie", "infiniband", "ethernet", "c2c"]
LINK_CLASSES: tuple[LinkClass, ...] = get_args(LinkClass)
EfficiencyProfile = Literal["calibrated", "ideal"]
"""`network.efficiency` by name (and `trainsim collective --efficiency`): the measured fraction of line rate of
each class, or line rate everywhere (network/calibration.py)."""
