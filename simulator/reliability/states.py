"""Step times of the cluster states a job passes through, each simulated once by the engine and cached.

A state is the number of data-parallel replicas in use (fewer than the layout's when an elastic job shrank)
and the number of spine switches down. Spines down are simulated as the same fat tree with the leaf uplink
capacity scaled by (spines - down) / spines (the `oversubscription` parameter grows by spines / (spines -
down)): flows hash over spines, so losing one spreads its traffic over the others. A shrunk job keeps each
replica's micro-batches (the global batch shrinks with it) on a cluster of just the hosts it uses. The cache
lives for the process, keyed by the scenario's step-relevant sections, so studies and notebooks that change
only failure or checkpoint settings simulate each state once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from simulator.config.loader import LoadedScenario
from simulator.config.schema import ClusterConfig
from simulator.reliability.checkpoint import StepState
from simulator.simulation import Result, build_topology, simulate_training
from simulator.topology.graph import Topology

JOB_SECTIONS: dict = {"checkpoint": True, "storage": True, "restart": True, "run": True, "description": True,
                      "faults": {"preset": True, "rate_multiplier": True, "components": True, "maintenance": True}}
"""Scenario fields that do not change a step (`faults.step` does; run.fold/timeline do not change its time)."""

_CACHE: OrderedDict[tuple[str, ClusterState | None], tuple[StepState, dict]] = OrderedDict()
_CACHE_SIZE = 64


@dataclass(frozen=True, order=True)
class ClusterState:
    """What the job runs on: data-parallel replicas in use and spine switches down."""

    replicas: int
    spines_down: int = 0


def _step_state(result: Result, topology: Topology) -> StepState:
    summary = result.summary
    exposed = summary["exposed_comm_s"]
    network = sum(seconds for category, seconds in exposed.items() if category != "tp")
    params = topology.params
    host_bandwidth = (params.get("nics_per_node") or params.get("nics_per_tray") or 0) * params.get("nic_bandwidth", 0)
    if params.get("kind") not in ("cluster", "nvl72") or len(set(topology.gpu_domain)) == 1:
        host_bandwidth = 0.0
    step_s = summary["step_time_s"]
    return StepState(step_s=step_s, tokens_per_step=summary["tokens_per_s"] * step_s,
                     exposed_network_share=network / step_s if step_s else 0.0, hosts=topology.num_hosts,
                     gpus=topology.num_gpus, host_network_bandwidth=float(host_bandwidth))


class StepStates:
    """The step of each cluster state of one scenario, simulated on first use; the healthy one at once."""

    def __init__(self, loaded: LoadedScenario, topology: Topology) -> None:
        self.loaded = loaded
        self.topology = topology
        self.key = loaded.scenario.model_dump_json(exclude=JOB_SECTIONS)
        self.healthy_step, self.healthy_summary = self._cached(None, lambda: (loaded, topology))
        layout = self.healthy_summary["layout"]
        self.healthy = ClusterState(int(layout["dp"]))
        self.microbatches = int(layout["microbatches"])

    def __call__(self, state: ClusterState) -> StepState:
        if state == self.healthy:
            return self.healthy_step
        return self._cached(state, lambda: self._scenario_of(state))[0]

    def _cached(self, state: ClusterState | None, scenario) -> tuple[StepState, dict]:
        key = (self.key, state)
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        from simulator.engine.faults import FaultHooks
        from simulator.simulation import step_faults

        loaded, topology = scenario()
        result = simulate_training(loaded, topology, FaultHooks(topology, step_faults(loaded, topology)))
        entry = (_step_state(result, topology), result.summary)
        _CACHE[key] = entry
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
        return entry

    def _scenario_of(self, state: ClusterState) -> tuple[LoadedScenario, Topology]:
        """The scenario of a degraded or shrunk state: the healthy one with cluster and layout overrides."""
        scenario = self.loaded.scenario
        overrides = scenario.cluster.overrides()
        update: dict = {}
        if state.spines_down:
            spines = self.topology.params["spines"]
            overrides["oversubscription"] = (self.topology.params["oversubscription"] * spines
                                             / (spines - state.spines_down))
        if state.replicas != self.healthy.replicas:
            overrides["nodes"] = state.replicas * (self.topology.num_hosts // self.healthy.replicas)
            update["parallelism"] = scenario.parallelism.model_copy(update={"dp": state.replicas})
            update["training"] = scenario.training.model_copy(update={"microbatches": self.microbatches,
                                                                      "global_batch": None})
        update["cluster"] = ClusterConfig(topology=scenario.cluster.topology, **overrides)
        loaded = LoadedScenario(scenario.model_copy(update=update), self.loaded.source, self.loaded.lines)
        return loaded, build_topology(loaded)
