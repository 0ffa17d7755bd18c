"""The network model's modes, defined once: the schema checks `network.model` against them at load, the
`collective` command offers them, and the network model takes one. A module of its own so that the schema can
import it without the model (and the collectives that import the model)."""

from __future__ import annotations

from typing import Literal, get_args

NetworkMode = Literal["flow", "analytic"]
"""flow: transfers share directed links max-min fairly; analytic: no contention with other work, each link split
only among the transfers of one collective's phase, and of its copies' (`CollectiveOp.copies`), that cross it
(network/model.py `analytic_seconds`)."""
NETWORK_MODES: tuple[NetworkMode, ...] = get_args(NetworkMode)
