"""The link classes, defined once and importing nothing: every link of a topology has one (the builders choose
it, an explicit graph's link names it), and `network.efficiency` gives each its fraction of line rate
(network/calibration.py). In config/, importing nothing, so that the schema keys that section by it without
loading the topology code, and the topology reads it in the direction the data flows."""

from __future__ import annotations

from typing import Literal, get_args

LinkClass = Literal["nvlink", "pcie", "infiniband", "ethernet", "c2c"]
LINK_CLASSES: tuple[LinkClass, ...] = get_args(LinkClass)
