"""The transfer model: flow-level max-min fair sharing of directed links, and a contention-free analytic mode."""

from simulator.network.maxmin import grouped_max_min_rates, max_min_rates
from simulator.network.model import MODES, FlowRequest, Network, effective_capacity

__all__ = ["MODES", "FlowRequest", "Network", "effective_capacity", "grouped_max_min_rates", "max_min_rates"]
