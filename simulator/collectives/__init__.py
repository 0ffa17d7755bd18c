"""Collective algorithms as phase plans, their registry and `auto` rule, and the executor on the network model."""

from simulator.collectives.busbw import algorithm_bandwidth, bus_bandwidth, bus_bandwidth_factor
from simulator.collectives.execute import run_plan, run_plans, time_collective
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.collectives.registry import ALGORITHMS, PRIMITIVES, choose_algorithm, plan_collective

__all__ = [
    "ALGORITHMS", "PRIMITIVES", "CollectiveRequest", "Phase", "Transfer", "algorithm_bandwidth", "bus_bandwidth",
    "bus_bandwidth_factor", "choose_algorithm", "plan_collective", "run_plan", "run_plans", "time_collective",
]
