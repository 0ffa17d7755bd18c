"""Step times of the cluster states a job passes through, each simulated once by the engine and cached.

A state is the number of data-parallel replicas in use (fewer than the layout's when an elastic job shrank),
the number of spine switches down, the links other degraded units (leaf switches, cables, NICs) took down and
the straggling GPUs with their slowdown. Spines down are simulated as the same fat tree with the leaf uplink
capacity scaled by (spines - down) / spines (the `oversubscription` parameter grows by spines / (spines -
down), spines counted over every pod): flows hash over spines, so losing one spreads its traffic over the
others; the step folds where the flow model's symmetry check passes on the scaled capacities (the bundled
16,384-GPU job's does with up to two spines down; TP 8 x DP 4 on hosts of 4 NICs under 2 spines does not).
Every spine down is every leaf's uplinks down, a state without a route where the job spans leaf groups (the
rails of one leaf group still join its hosts). Links down and stragglers are the step-fault engine's
(`faults.step` links and stragglers, added to the scenario's own): the step is exactly `simulate()` of the
scenario with those faults. NVSwitch trays down on GB200 NVL72 racks are their rack's GPU-to-NVSwitch links degraded
to the share of trays left (`nvswitch_tray_faults`), step faults as links down are. A state whose links leave some
GPU without a route has no step (None): the job cannot run in it. A straggling GPU is simulated as the first GPU of
its pipeline stage (`StepStates.representative`, not exact for stragglers in several replicas) where no link or
NVSwitch tray is down; while some are, whole units of replicas trade places where that is exact and stragglers
keep their GPUs elsewhere (`StepStates._placed`); a straggler keeps its own GPU where the scenario takes links
down of its own, and in a replayed trace (the traced ranks each run their own kernels). A straggler beyond a
shrunk job's GPUs slows nothing (`StepStates.state_of`). A shrunk job runs on a cluster of just the hosts it
uses, each replica keeping its micro-batches or taking its share of the global batch
(`restart.elastic_batch`, elastic.shrunk_scenario). The cache lives for the process, keyed by the
scenario's step-relevant sections (run.seed among them: it draws random stragglers and routing samples;
restart.elastic_batch) and the files beside it that they read (a trace's, by path, size and mtime: inputs.py),
so studies and notebooks that change only failure or checkpoint settings simulate each state once, within a
memory budget (`StateCache`). A state's step that a fold check unfolds beyond the scale limits is refused
before it is built unfolded (scale.refuse_unfolded), unless the job is forced.
"""

from __future__ import annotations

import bisect
import gc
import pickle
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import TYPE_CHECKING

import numpy as np

from simulator.config.faults import LinkFault, StepFaults, Straggler
from simulator.config.loader import LoadedScenario
from simulator.config.locate import located
from simulator.config.reliability import RestartConfig
from simulator.config.schema import ClusterConfig, RunConfig, Scenario
from simulator.errors import StepAborted, TrainsimError
from simulator.faults.rerouting import split
from simulator.faults.step import FoldShape, Slowdown, StepFaultPlan, fold_shape
from simulator.parallel.layout import Layout
from simulator.program.ops import TP_CATEGORY
from simulator.program.unfolding import UnfoldingGuard
from simulator.reliability.checkpoint import StepState
from simulator.reliability.elastic import hosts_at, shrunk_scenario, trace_replicas
from simulator.reliability.inputs import files_key
from simulator.reliability.perturbed import step_outcome, with_step_faults
from simulator.reliability.symmetry import StateSymmetry, state_symmetry
from simulator.scale import refold_refusal, refuse_unfolded
from simulator.simulation import PreparedStep, prepare_training, scenario_warnings, simulate_training
from simulator.topology.builders import Fabric
from simulator.topology.graph import Topology, both_ways
from simulator.topology.loader import scenario_topology

if TYPE_CHECKING:
    from simulator.engine.fold_policy import FoldedStep
    from simulator.engine.plans import PlanCache
    from simulator.parallel.folding import RankClasses
    from simulator.program.step import StepProgram
    from simulator.simulation import NetworkSettings

JOB_SECTIONS: dict = {"checkpoint": True, "storage": True, "description": True, "costs": True,
                      "restart": {name: True for name in RestartConfig.model_fields if name != "elastic_batch"},
                      "run": {name: True for name in RunConfig.model_fields if name != "seed"},
                      "faults": {"preset": True, "rate_multiplier": True, "repair_multiplier": True, "components": True,
                                 "maintenance": True}}
"""Scenario fields that do not change a step (`faults.step` does; run.fold/timeline do not change its time; `costs`
prices it after; run.seed does: it draws random stragglers and a MoE model's routing sample; restart.elastic_batch
sets a shrunk state's micro-batches)."""

CACHE_BYTES = 16 << 20
"""What the states cached in a process may hold, their entries counted pickled: ~4 KB a straggler state of the
64-GPU job (its summary; ~6x that in memory, ~25 KB), so ~4,000 states in ~100 MB: a study's later points find
every state an earlier point simulated (the 64-GPU PP 8 job's 117; the 1,685-state throttling job's too)."""


class StateCache:
    """Each state's step and summary simulated in this process, by the scenario's step key and the state, for
    a job's replications and a study's later points to find: the least recently used dropped once the entries,
    counted pickled (`CACHE_BYTES`), pass ``budget`` bytes (the newest kept whatever its size)."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        self.budget = budget
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, ClusterState | None], tuple[tuple[StepState | None, dict], int]] = \
            OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __getitem__(self, key: tuple[str, ClusterState | None]) -> tuple[StepState | None, dict]:
        return self._entries[key][0]

    def __len__(self) -> int:
        return len(self._entries)

    def used(self, key: tuple[str, ClusterState | None]) -> tuple[StepState | None, dict]:
        """The entry of ``key``, now the most recently used."""
        self._entries.move_to_end(key)
        return self[key]

    def store(self, key: tuple[str, ClusterState | None], entry: tuple[StepState | None, dict]
              ) -> tuple[StepState | None, dict]:
        """Keep ``entry`` under ``key``, dropping the least recently used beyond the budget; the entry."""
        size = len(pickle.dumps(entry, pickle.HIGHEST_PROTOCOL))
        if key in self._entries:
            self.bytes -= self._entries.pop(key)[1]
        self._entries[key] = entry, size
        self.bytes += size
        while self.bytes > self.budget and len(self._entries) > 1:
            self.bytes -= self._entries.popitem(last=False)[1][1]
        return entry

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


_CACHE = StateCache()


@dataclass(frozen=True, order=True)
class ClusterState:
    """What the job runs on: data-parallel replicas in use, spine switches down, other links down (node
    pairs, sorted), straggling GPUs (representative GPU, slowdown; sorted) and NVSwitch trays down (a GB200
    NVL72 rack's NVSwitch node, how many of its trays are down; sorted)."""

    replicas: int
    spines_down: int = 0
    links_down: tuple[tuple[str, str], ...] = ()
    slow_gpus: tuple[tuple[int, float], ...] = ()
    nvswitch_trays_down: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        """What differs from a healthy cluster, in words ('' for none but the replicas)."""
        parts = [(self.spines_down, "spine switch(es) down"), (len(self.links_down), "link(s) down"),
                 (len(self.slow_gpus), "straggling GPU(s)"),
                 (sum(down for _, down in self.nvswitch_trays_down), "NVSwitch tray(s) down")]
        return ", ".join(f"{count} {what}" for count, what in parts if count)


def _replicas_and_microbatches(summary: dict) -> tuple[int, int]:
    """A step's data-parallel replicas and micro-batches per replica, from its summary: a modelled step's layout,
    or a replayed trace's replicas (`elastic.trace_replicas`), each the traced step's work (one micro-batch: the
    trace is replayed as a whole)."""
    layout = summary.get("layout")
    if layout is None:
        return trace_replicas(summary["trace"]["dp"], summary["trace"]["traced_dp"]), 1
    return int(layout["dp"]), int(layout["microbatches"])


def _step_state(summary: dict, topology: Topology) -> StepState:
    exposed = summary["exposed_comm_s"]
    network = sum(seconds for category, seconds in exposed.items() if category != TP_CATEGORY)
    host_bandwidth = topology.host_nic_bandwidth if len(set(topology.gpu_domain)) > 1 else 0.0
    step_s = summary["step_time_s"]
    replicas, microbatches = _replicas_and_microbatches(summary)
    # The tokens of a step are whole: the rate times the step time, rounded back (4194303.9999999995 otherwise);
    # a trace that states none (`tokens_per_s` null) has 0, which the job's summary reports as n/a.
    return StepState(step_s=step_s, tokens_per_step=float(round((summary["tokens_per_s"] or 0.0) * step_s)),
                     microbatches=replicas * microbatches,
                     exposed_network_share=network / step_s if step_s else 0.0, hosts=topology.num_hosts,
                     gpus=topology.num_gpus, host_network_bandwidth=float(host_bandwidth))


def step_key(loaded: LoadedScenario) -> str:
    """The cache key of a scenario's steps: its step sections, the files beside it that they read (inputs.py;
    the sections name a trace by its glob alone) and the scenario's own file, which the step's layout warnings
    are located at (a step cached from another file with the same sections named that file's line)."""
    return f"{loaded.scenario.model_dump_json(exclude=JOB_SECTIONS)}\n{files_key(loaded)}\n{loaded.source}"


class StepStates:
    """The step of each cluster state of one scenario, simulated on first use; the healthy one at once, from
    ``healthy`` when the caller has built it already (`prepare_training`). Unless ``force``, a step that a fold
    check unfolds beyond the scale limits is refused before it is built. ``merge_rotations``: states with links
    down that are rotations of each other take one step (`merged`); off, each is simulated (the outputs are the
    same: tests compare them)."""

    def __init__(self, loaded: LoadedScenario, topology: Topology, *, force: bool = False,
                 healthy: PreparedStep | None = None, merge_rotations: bool = True) -> None:
        self.loaded = loaded
        self.topology = topology
        self.force = force
        self.spines = _spines(topology)
        self.key = step_key(loaded)
        self._network: tuple[NetworkSettings, PlanCache] | None = None
        self._programs: dict[RankClasses | None, StepProgram] = {}
        self._folds: dict[FoldShape, FoldedStep] = {}
        self._ahead: dict[ClusterState, StepState | None] = {}
        """The steps of the states simulated ahead of the job (reliability/ahead.py), kept for the job's life
        whatever the budget of the process's cache (`StateCache`): moved there by the second forecast, or put
        there at once, a job of more states than it holds (~4,000 straggler states of the 64-GPU job, fewer on
        larger clusters) lost steps before it met them and simulated them again. One met stays too, since a
        rotation of it may be met later. The step alone (~0.2 KB pickled): its summary (~24 KB, which the job
        does not read) goes to the bounded cache (`simulated_ahead`)."""
        self._refused: dict[ClusterState, bytes] = {}
        """States whose simulation ahead raised, and the error pickled, raised afresh where the job meets the state
        (a stored error raised again would keep each raise's frames): a result, not simulated again (before, each
        was simulated again before the second round and where met)."""
        self.on_simulating: Callable[[ClusterState | None], None] | None = None
        """Hears of each state other than the healthy one as its step starts being simulated in this process, and
        None once it is done: a job's progress says which state a replication is simulating (a degraded state of
        2,048 GPUs takes minutes)."""
        healthy_step, summary = self._cached(None, lambda: (loaded, topology), healthy)
        warnings = scenario_warnings(loaded, topology)
        self.healthy_summary = {**summary, "scenario": loaded.source,
                                **({"warnings": [*warnings, *summary.get("warnings", ())]} if warnings else {})}
        """The healthy step's summary, naming this scenario's file (the cached step may be another file's with
        the same step sections), the scenario's own warnings first (`scenario_warnings`)."""
        if healthy_step is None:
            raise StepAborted(self.healthy_summary["aborted_at_s"], self.healthy_summary["reason"])
        self.healthy_step: StepState = healthy_step
        replicas, self.microbatches = _replicas_and_microbatches(self.healthy_summary)
        self.healthy = ClusterState(replicas)
        layout = self.healthy_summary.get("layout")
        self.layout = None if layout is None else Layout(int(layout["tp"]), int(layout["cp"]), int(layout["pp"]),
                                                         int(layout["dp"]), tuple(layout["order"]))
        """The modelled step's layout; None for a replayed trace, whose ranks need not do alike work."""
        self.merges = merge_rotations
        """Whether states with links down that are rotations of each other take one step (`merged`)."""
        self._symmetry: StateSymmetry | str | None = None
        self._rotations: dict[ClusterState, ClusterState] = {}
        """Each state `_rotated` so far, and the least of its rotations (64 images a state on the 16,384-GPU job),
        which is its own."""
        self._stand_ins: dict[tuple[int, int, Slowdown | None], int] = {}
        """Each `representative` by replicas, pipeline stage and own slowdown (None: none)."""
        self._replicas_aligned: dict[int, bool] = {}
        """Per job size (replicas), whether its data-parallel replicas are `_fabric_aligned`."""
        self._touched: dict[tuple[frozenset[tuple[str, str]], frozenset[str]], frozenset[int]] = {}
        """The `touched_replicas` of each set of links down and NVSwitch nodes with trays down."""

    def symmetry(self) -> StateSymmetry | str:
        """The rotations proven to map the job's step onto itself (reliability/symmetry.py), or why none is: found
        when first asked (a job with no state with links down never asks)."""
        if self._symmetry is None:
            self._symmetry = self._found_symmetry()
        return self._symmetry

    def _found_symmetry(self) -> StateSymmetry | str:
        from simulator.simulation import network_settings, plan_cache, step_program

        def healthy() -> tuple[StepProgram, PlanCache]:
            loaded, topology = self.loaded, self.topology
            if self._network is None:
                settings = network_settings(loaded, topology)
                self._network = settings, plan_cache(topology, settings)
            program = next(iter(self._programs.values()), None) or step_program(loaded, topology, fold=True)
            return program, self._network[1]

        return state_symmetry(self.topology, self.layout, not self.loaded.scenario.faults.step.empty, healthy)

    def merged(self, state: ClusterState) -> ClusterState:
        """The state whose step ``state``'s is: its links down rotated to the least of their images where the job's
        step is proven to rotate (`symmetry`) and the state has links down alone (no straggler, spine or NVSwitch
        tray down, every replica in use); else ``state`` itself."""
        return self._rotated(state) if self.merges else state

    def _rotated(self, state: ClusterState) -> ClusterState:
        if (not state.links_down or state.spines_down or state.slow_gpus or state.nvswitch_trays_down
                or state.replicas != self.healthy.replicas):
            return state
        symmetry = self.symmetry()
        if isinstance(symmetry, str):
            return state
        if state not in self._rotations:
            least = replace(state, links_down=symmetry.representative(state.links_down))
            self._rotations[state] = self._rotations.setdefault(least, least)
        return self._rotations[state]

    def symmetry_figures(self, met: Iterable[ClusterState]) -> dict | None:
        """job_summary.json's `link_states` for the states ``met``: how many have links down and how many steps
        they are (one per class of rotations), the rotations proven (`symmetry`) or why none is; None where no
        state has links down."""
        linked = [state for state in met if state.links_down]
        if not linked:
            return None
        symmetry = self.symmetry()
        return {"states": len(linked), "steps": len({self._rotated(state) for state in linked}),
                "rotations": None if isinstance(symmetry, str) else symmetry.describe(),
                "not_merged_because": symmetry if isinstance(symmetry, str) else None}

    def __call__(self, state: ClusterState) -> StepState | None:
        """The state's step; None when its links down leave some GPU without a route."""
        if state == self.healthy:
            return self.healthy_step
        return self.entry(state)[0]

    def entry(self, state: ClusterState) -> tuple[StepState | None, dict]:
        """The step of a state other than the healthy one, and its summary (or the reason it has no step): that of
        the state it is `merged` into. The summary, which may name the representative's GPUs and links (a reason
        without a route), carries the step between processes (reliability/ahead.py) and reaches no output: the
        job reads the `StepState` alone (times, tokens, micro-batches, counts of hosts and GPUs), and a rotation
        of a state without a route has none either."""
        merged = self.merged(state)
        return self._cached(merged, lambda: self._scenario_of(merged))

    def known(self, state: ClusterState) -> bool:
        """Whether the state's step is at hand: the healthy one, cached, or simulated ahead (its `merged` state's)."""
        merged = self.merged(state)
        return merged == self.healthy or (self.key, merged) in _CACHE or merged in self._ahead

    def settled(self, state: ClusterState) -> bool:
        """Whether the state's step is `known` or its simulation ahead raised: nothing to simulate before the job
        meets it."""
        return self.known(state) or self.merged(state) in self._refused

    def ahead_entry(self, state: ClusterState) -> tuple[StepState | None, dict]:
        """The `entry` of a state simulated ahead of the job, here or in a worker (reliability/ahead.py): its
        `merged` state's, simulated now and kept nowhere (`simulated_ahead` keeps it in the job's process)."""
        merged = self.merged(state)
        return self._fresh(merged, lambda: self._scenario_of(merged))

    def simulated_ahead(self, state: ClusterState, result: tuple[StepState | None, dict] | TrainsimError) -> None:
        """The `ahead_entry` of ``state``, or the error simulating it raised, from this process or a worker: its
        step kept for when the job meets it (the whole entry cached while the cache holds it), or the error, raised
        there."""
        merged = self.merged(state)
        if isinstance(result, TrainsimError):
            self._refused[merged] = pickle.dumps(result.with_traceback(None))
        else:
            self._ahead[merged] = result[0]
            self._store((self.key, merged), result)

    def foreseen_step(self, state: ClusterState) -> StepState | None:
        """The step of a `known` state as a forecast reads it (reliability/ahead.py): one simulated ahead stays
        kept, and the cache's order of use stays as the job left it."""
        merged = self.merged(state)
        if merged == self.healthy:
            return self.healthy_step
        return self._ahead[merged] if merged in self._ahead else _CACHE[self.key, merged][0]

    @cached_property
    def _unit_gpus(self) -> int | None:
        """The GPUs of a relabelling unit: the fewest consecutive data-parallel replicas that fill whole hosts and
        NVLink domains and lie each inside one leaf group and pod or hold whole ones (`_fabric_aligned`), which may
        trade places exactly; None where they may not (a straggler then keeps its own GPU): a replayed trace, links down
        of the scenario's own (fixed places), data parallelism not the outermost dimension (a replica's lane is then no
        physical place: a straggler so moved under `order: [tp, dp, cp, pp]` made a step 0.33% longer), experts split
        (EP above 1: EP groups are not alike, a x1.5 GPU on hosts 4-5 of TP 8 x DP 6 x EP 2 gave a step 1.9e-4 shorter
        than on hosts 2-3), or the scenario's own stragglers unlike from unit to unit."""
        layout = self.layout
        if layout is None or self.loaded.scenario.faults.step.links or layout.order[-1] != "dp":
            return None
        if int((self.healthy_summary.get("moe") or {}).get("ep", 1)) > 1:
            return None
        replica, topology = layout.world // layout.dp, self.topology
        groups = [np.asarray(topology.gpu_host[:layout.world]), np.asarray(topology.gpu_domain[:layout.world])]
        gpus = np.arange(layout.world)
        unit = next(span * replica for span in range(1, layout.dp + 1) if layout.dp % span == 0
                    and all(_within_blocks(group, gpus // (span * replica)) for group in groups)
                    and self._fabric_aligned(gpus // (span * replica)))
        own = self._own_stragglers
        if any(own.get(gpu) != own.get(gpu % unit) for gpu in range(layout.world)):
            return None
        return unit

    def _fabric_aligned(self, blocks: np.ndarray) -> bool:
        """Whether the blocks ``blocks`` (one per GPU of the job, in GPU order) lie each inside one leaf group and
        one pod of the fabric, or hold each leaf group and pod whole: blocks straddling leaf groups are not alike
        (TP 8 x PP 2 x DP 6 on 12 DGX H100 with `leaf_ports: 3`: a x1.5 GPU on hosts 8-9, one replica over two
        leaf groups, ran a step 3.7e-4 longer with leaf 1's rail 0 down than on hosts 0-1, 5.1e-4 with nothing
        down). True without a fabric of leaves."""
        fabric = self.topology.router
        if not isinstance(fabric, Fabric) or not fabric.leaf:
            return True
        leaf = np.asarray(fabric.leaf[:len(blocks)])
        groups = (leaf // fabric.rails, np.asarray(fabric.leaf_pod)[leaf])
        return all(_within_blocks(group, blocks) or _within_blocks(blocks, group) for group in groups)

    def _stood_in(self, slow: dict[int, float], replicas: int) -> dict[int, float]:
        """The stragglers ``slow`` (GPU: factor) of a state with no link or NVSwitch tray down on ``replicas``
        replicas, each on its `representative` in the job's layout at that size (a shrunk job's GPUs are its
        first hosts', their coordinates its own); several on one stand-in keep the largest factor."""
        stood: dict[int, float] = {}
        for gpu, factor in slow.items():
            stand_in = self.representative(gpu, replicas)
            stood[stand_in] = max(stood.get(stand_in, 1.0), factor)
        return stood

    def representative(self, gpu: int, replicas: int | None = None) -> int:
        """The GPU a straggler on ``gpu`` is simulated on in a state with no link or NVSwitch tray down, the job on
        ``replicas`` replicas (None: all): the first GPU of its pipeline stage in the job's layout at that size that the
        scenario's own `faults.step` slows as it slows ``gpu`` (at full speed for most; one state per distinct own
        slowdown, so `fraction: 1.0` or `all` keeps one). The step is the real GPU's to the bit for one straggler in the
        cases tests/test_straggler_places.py runs; not where stragglers sit in several replicas: they then stand in as
        one (TP 8 x PP 2 x DP 4 on 8 DGX H100, GPUs 40 and 48 x1.5: 0.94% off their own GPUs' step), which keeps the
        states one per set of stages slowed (relabelling whole replicas instead, exact, made 626 states where this makes
        30 on `llama3-70b-2k-job` with its spine, leaf and throttling classes, 1 replication). ``gpu`` itself where the
        replicas at that size straddle leaf groups or pods (not `_fabric_aligned`: a x1.5 GPU on hosts 8-9 of TP 8 x PP
        2 x DP 6 on 12 DGX H100 with `leaf_ports: 3` stood in on GPU 0 with a step 5.1e-4 shorter), where the scenario
        takes links down of its own (fixed places), and in a replayed trace, whose ranks each run their own traced
        kernels."""
        layout = self.layout
        if layout is None or self.loaded.scenario.faults.step.links:
            return gpu
        replicas = layout.dp if replicas is None else replicas
        layout = replace(layout, dp=replicas)
        if replicas not in self._replicas_aligned:
            ranks = np.arange(layout.world)
            self._replicas_aligned[replicas] = self._fabric_aligned(ranks // layout.rank_of(dp=1) % replicas)
        if not self._replicas_aligned[replicas]:
            return gpu
        stage, own = layout.coords(gpu)["pp"], self._own_stragglers.get(gpu)
        if (replicas, stage, own) not in self._stand_ins:
            self._stand_ins[replicas, stage, own] = next(rank for rank in layout.stage_ranks(stage)
                                                         if self._own_stragglers.get(rank) == own)
        return self._stand_ins[replicas, stage, own]

    def _placed(self, slow: dict[int, float], touched: frozenset[int]) -> dict[int, float]:
        """The stragglers ``slow`` (GPU: factor) where the state simulates them: those in a unit (`_unit_gpus`)
        that no replica of ``touched`` is in relabelled unit by unit, the k-th such unit holding a straggler
        becoming the k-th such unit, each straggler's place inside it kept; those in a touched unit at their own
        GPU (a straggler near a link or tray down is not one far from it). Whole units trade places, alike in
        hosts, NVLink domains, leaf groups and pods; in the cases tests/test_straggler_places.py runs (DGX H100
        with NICs or leaves down, GB200 racks with trays down) the step is the real GPUs' to the bit."""
        unit = self._unit_gpus
        if unit is None or self.layout is None:
            return slow
        replicas = unit * self.layout.dp // self.layout.world
        touched_units = {replica // replicas for replica in touched}
        holding = sorted({gpu // unit for gpu in slow} - touched_units)
        free = (index for index in range(self.layout.world // unit) if index not in touched_units)
        moved = dict(zip(holding, free))
        return {moved[gpu // unit] * unit + gpu % unit if gpu // unit in moved else gpu: factor
                for gpu, factor in slow.items()}

    def touched_replicas(self, links: Iterable[tuple[str, str]], trays: Iterable[str]) -> frozenset[int]:
        """The data-parallel replicas with a GPU in an NVLink domain (a host; a GB200 NVL72 rack) that ``links``
        down or the NVSwitch ``trays`` down touch: a link the domains of its ends on a host (a NIC-leaf cable its
        NIC's), or where neither end is on one the domains of every host below it (a leaf-spine cable its leaf's;
        a spine's are its leaves'), a rack's NVSwitch node the domain of its GPUs."""
        if self.layout is None:
            return frozenset()
        key = frozenset(links), frozenset(trays)
        if key not in self._touched:
            hosts = {host for link in key[0] for host in self._hosts_at(link)}
            hosts.update(host for tray in key[1] for host in self._hosts_below(tray))
            domains = {self.topology.gpu_domain[gpu] for host in hosts for gpu in self.topology.host_gpus(host)}
            self._touched[key] = frozenset(self.layout.coords(gpu)["dp"] for gpu in self._domain_gpus(domains))
        return self._touched[key]

    def _hosts_at(self, link: tuple[str, str]) -> set[int]:
        """The hosts of ``link``'s ends, or where neither is on a host those below its ends."""
        nodes = self.topology.wiring.nodes
        hosts = {host for end in link if (host := nodes[end].get("host")) is not None}
        return hosts or {host for end in link for host in self._hosts_below(end)}

    def _hosts_below(self, node: str) -> set[int]:
        """The hosts of ``node``'s neighbours on a host (a leaf's NICs, an NVSwitch node's GPUs)."""
        nodes = self.topology.wiring.nodes
        return {host for peer in self.topology.graph.successors(node) if (host := nodes[peer].get("host")) is not None}

    def _domain_gpus(self, domains: set[int]) -> list[int]:
        """The GPUs of the NVLink domains ``domains``."""
        return [gpu for gpu, domain in enumerate(self.topology.gpu_domain) if domain in domains]

    def world_gpus(self, replicas: int) -> int:
        """The GPUs of the job on ``replicas`` replicas: its first hosts' (elastic.shrunk_scenario)."""
        if replicas == self.healthy.replicas:
            return self.topology.num_gpus
        return bisect.bisect_left(self.topology.gpu_host,
                                  hosts_at(self.topology.num_hosts, self.healthy.replicas, replicas))

    def state_of(self, replicas: int, degradations: Iterable[Degradation]) -> ClusterState:
        """The cluster state of the job on ``replicas`` replicas with ``degradations`` in force; a GPU slowed by
        several keeps the largest factor. A straggling GPU beyond the job's GPUs (a shrunk job's: `world_gpus`)
        slows nothing; those within them are `_placed` given the replicas the state's links and NVSwitch trays
        down touch (a tray down on rack 1 and a x1.5 GPU on rack 1 made a step 1.3% longer than with that GPU on
        rack 0, 18 to 19% with 7 trays down); with no link or tray down they are `_stood_in` by representatives,
        and a shrunk job whose scenario has stragglers of its own keeps them on their GPUs."""
        degradations = list(degradations)
        spines: set[int] = set()
        links: set[tuple[str, str]] = set()
        trays: dict[str, set[int]] = {}
        for degradation in degradations:
            if degradation.spine is not None:
                spines.add(degradation.spine)
            if degradation.nvswitch_tray is not None:
                switch, tray = degradation.nvswitch_tray
                trays.setdefault(switch, set()).add(tray)
            links.update(degradation.links)
        world = self.world_gpus(replicas)
        slow: dict[int, float] = {}
        for degradation in degradations:
            for gpu in degradation.gpus:
                if gpu < world:
                    slow[gpu] = max(slow.get(gpu, 1.0), degradation.slowdown)
        if slow and (replicas == self.healthy.replicas or not self._own_stragglers):
            slow = (self._placed(slow, self.touched_replicas(links, trays)) if links or trays
                    else self._stood_in(slow, replicas))
        return ClusterState(replicas, len(spines), tuple(sorted(links)), tuple(sorted(slow.items())),
                            tuple(sorted((switch, len(down)) for switch, down in trays.items())))

    @cached_property
    def _own_stragglers(self) -> dict[int, Slowdown]:
        """The slowdown of each GPU the scenario's own `faults.step` slows (by index, `fraction` or `all`: drawn as
        its step is)."""
        from simulator.simulation import step_faults

        if not self.loaded.scenario.faults.step.stragglers:
            return {}
        return step_faults(self.loaded, self.topology).slowdown_of()

    def _cached(self, state: ClusterState | None, scenario, prepared: PreparedStep | None = None
                ) -> tuple[StepState | None, dict]:
        """The step of ``state`` (None: the healthy one) and its summary, from the cache, simulated ahead (cached
        again, for a study's later points, with no summary where the cache dropped it: none but the healthy
        step's is read) or simulated now; the error its simulation ahead raised, raised afresh."""
        key = (self.key, state)
        if key in _CACHE:
            return _CACHE.used(key)
        if state in self._refused:
            raise pickle.loads(self._refused[state])
        if state in self._ahead:
            return self._store(key, (self._ahead[state], {}))
        return self._store(key, self._fresh(state, scenario, prepared))

    def _fresh(self, state: ClusterState | None, scenario, prepared: PreparedStep | None = None
               ) -> tuple[StepState | None, dict]:
        """The step of ``state`` and its summary, simulated now (`_simulated`), told to `on_simulating`. After a
        state's run the youngest generation of the cyclic garbage collector (paused for the job,
        simulator/collector.py) is collected: each straggler state of the 16,384-GPU job left ~0.13 GB of cyclic
        garbage (220 GB over the 1,685 states of docs/reliability.md's throttling example), most of it its event
        log, since freed as it goes (metrics/events.py); what stays for the collector (~33 k objects a state: the
        run's stepping closures, its isolated runs' environments) takes ~0.01 s and keeps the job at ~0.6 GB."""
        if state is not None and self.on_simulating is not None:
            self.on_simulating(state)
        entry = self._simulated(state, scenario, prepared)
        if state is not None:
            gc.collect(0)
            if self.on_simulating is not None:
                self.on_simulating(None)
        return entry

    def _simulated(self, state: ClusterState | None, scenario, prepared: PreparedStep | None
                   ) -> tuple[StepState | None, dict]:
        """The step of ``state`` and its summary, simulated. A function of its own so that the state's scenario,
        topology and faults are garbage when `_cached` collects: collected while they were still its locals, a
        link state's topology (in a cycle with its rerouter) and what it holds survived into an older
        generation, which the paused collector never collects again, so each degraded state's stayed for the
        rest of the job (19 topologies alive after a 19-state job, 0.07 GB more resident a state at 64 GPUs)."""
        from simulator.engine.faults import FaultHooks
        from simulator.simulation import step_faults

        loaded, topology = scenario()
        cut = self._cut_by_spines(topology, state)
        if cut:
            return None, {"aborted_at_s": 0.0, "reason": f"every spine switch down: {cut}"}
        bare = self._bare_rack_under_nvls(state)
        if bare:
            return None, {"aborted_at_s": 0.0, "reason": f"every NVSwitch tray of {bare} down, and "
                                                          "collectives.algorithm: nvls"}
        guard = None if self.force else state_guard(loaded, topology, state)
        faults = step_faults(loaded, topology)
        if state is None:
            prepared = prepared or prepare_training(loaded, topology, faults, guard)
            self._network = prepared.settings, prepared.plans
            if prepared.step.program.folded:
                self._programs[prepared.step.classes] = prepared.step.program
        elif topology is self.topology and not faults.links and self.layout is not None:
            prepared = self._shared_fold(loaded, faults, guard)
        budget = partial(refold_refusal, loaded, topology.num_gpus, force=self.force, topology=topology)
        outcome = step_outcome(lambda: simulate_training(loaded, topology, FaultHooks(topology, faults),
                                                         guard=guard, prepared=prepared, budget=budget,
                                                         link_tiers=state is None))
        if outcome.summary is None:
            return None, {"aborted_at_s": outcome.aborted_at_s, "reason": outcome.reason}
        return _step_state(outcome.summary, topology), outcome.summary

    def _shared_fold(self, loaded: LoadedScenario, faults: StepFaultPlan, guard: UnfoldingGuard | None
                     ) -> PreparedStep:
        """The step of a state on the job's own cluster (stragglers; the replicas and links as healthy) under
        ``faults`` (no link faults: those reroute the plans they meet), prepared from what the job's states
        share: the cluster's network settings and plan cache, each folded program (step programs do not read
        `faults.step`) and each fold by the faults' `fold_shape`, with only its slowdowns taken anew
        (`fold_policy.refaulted`). Exactly the step `prepare_training` would make for it, at its run's cost."""
        from simulator.engine.fold_policy import folded_step, refaulted
        from simulator.simulation import network_settings, plan_cache, step_program

        topology = self.topology
        if self._network is None:
            settings = network_settings(loaded, topology)
            self._network = settings, plan_cache(topology, settings)
        settings, plans = self._network

        def build(fold: bool, classes: RankClasses | None) -> StepProgram:
            program = self._programs.get(classes) if fold else None
            if program is None:
                program = step_program(loaded, topology, fold=fold, guard=guard, classes=classes)
                if program.folded:
                    self._programs[classes] = program
            return program

        assert self.layout is not None, "a replayed trace's states are prepared afresh"
        shape = fold_shape(faults, self.layout)
        step = self._folds.get(shape)
        if step is None:
            step = located(loaded, lambda: folded_step(build, topology, plans, settings.mode,
                                                       dict(settings.efficiency), faults, loaded.scenario.run.fold,
                                                       guard))
            self._folds[shape] = step
        else:
            step = refaulted(step, faults)
        return PreparedStep(settings, plans, step, build)

    @property
    def fold_built(self) -> bool:
        """Whether a straggler state has folded the job's step yet (`_shared_fold`): the first one builds that
        fold, which `ahead.FOLDED_STRAGGLER_FOLD_S_PER_EVENT` times; later ones take it."""
        return bool(self._folds)

    @staticmethod
    def _store(key: tuple[str, ClusterState | None], entry: tuple[StepState | None, dict]
               ) -> tuple[StepState | None, dict]:
        return _CACHE.store(key, entry)

    def _bare_rack_under_nvls(self, state: ClusterState | None) -> str:
        """The first rack of ``state`` with every NVSwitch tray down where the scenario forces NVLS ('' for
        none): its GPUs have no switch to reduce in (`nvls.switches_up`), and NCCL with NCCL_ALGO=NVLS alone
        does not fall back there (enqueue.cc: "no algorithm/protocol available", ncclInvalidUsage; its tuner
        does, which `auto` models), so the state has no step: the job waits in a restart for a tray's repair,
        as for a state without a route. Before, a job with such a class was refused at load, a lone rack too."""
        if state is None or not nvls_forced(self.loaded.scenario):
            return ""
        trays = self.topology.params.get("nvswitch_trays", 0)
        return next((rack for rack, down in state.nvswitch_trays_down if down >= trays), "")

    def _cut_by_spines(self, topology: Topology, state: ClusterState | None) -> str:
        """With every spine down, which GPUs of the state's cluster no longer reach each other ('' for none:
        the rails of one leaf group still join its hosts), read off the wiring: a job spanning leaf groups is
        not built (an unfolded step where every host is near the links down) only to abort at its start."""
        if state is None or not 0 < self.spines <= state.spines_down:
            return ""
        return cut_by_every_spine(topology)

    def _scenario_of(self, state: ClusterState) -> tuple[LoadedScenario, Topology]:
        """The scenario and cluster of a degraded, straggling or shrunk state (`state_scenario`)."""
        return state_scenario(self.loaded, self.topology, state, self.healthy.replicas, self.microbatches)


def state_scenario(loaded: LoadedScenario, topology: Topology, state: ClusterState, replicas: int,
                   microbatches: int) -> tuple[LoadedScenario, Topology]:
    """The scenario and cluster of a degraded, straggling or shrunk state of the job ``loaded`` on ``topology``
    (``replicas`` replicas of ``microbatches`` micro-batches when healthy): the healthy one with cluster and
    layout overrides (a shrunk job's, some spines down's oversubscription) and the state's links down and
    stragglers added to its `faults.step` (on a shrunk job's cluster, the state's and the scenario's own outside
    it dropped: faults_within). It keeps the healthy one's `--set` overrides (or sweep axes), so an error in a
    value one of them wrote names it, as the healthy step's would. The one both a state's step
    (`StepStates`) and its size up front (`ahead.LinkStateSizes`) are built on."""
    scenario = loaded.scenario
    shrunk = state.replicas != replicas
    if shrunk:
        scenario = shrunk_scenario(scenario, topology, replicas, microbatches, state.replicas)
    spines = _spines(topology)
    if 0 < state.spines_down < spines:
        overrides = {**scenario.cluster.overrides(), "oversubscription": (
            topology.params["oversubscription"] * spines / (spines - state.spines_down))}
        scenario = scenario.model_copy(update={"cluster": ClusterConfig(topology=scenario.cluster.topology,
                                                                        **overrides)})
    own_loaded = replace(loaded, scenario=scenario)
    on_own = (scenario.cluster == loaded.scenario.cluster and not state.links_down
              and not state.nvswitch_trays_down and not scenario.faults.step.links)
    state_topology = topology if on_own else scenario_topology(own_loaded)
    links = tuple(LinkFault(link=pair) for pair in state.links_down if state_topology.wiring.has_edge(*pair))
    links += nvswitch_tray_faults(state_topology, state.nvswitch_trays_down)
    if 0 < spines <= state.spines_down:
        links += tuple(LinkFault(link=pair) for pair in spine_links(state_topology))
    stragglers = tuple(Straggler(gpus=(gpu,), slowdown=factor) for gpu, factor in state.slow_gpus
                       if gpu < state_topology.num_gpus)
    own = scenario.faults.step
    if shrunk:
        own = faults_within(own, state_topology)
    if links or stragglers or own != scenario.faults.step:
        faults = own.model_copy(update={"links": own.links + links, "stragglers": own.stragglers + stragglers})
        own_loaded = with_step_faults(own_loaded, faults)
    return own_loaded, state_topology


def _within_blocks(groups: np.ndarray, blocks: np.ndarray) -> bool:
    """Whether each group of ``groups`` (a number per GPU) lies within one block of ``blocks`` (one per GPU)."""
    return len(np.unique(groups)) == np.unique(np.stack([groups, blocks]), axis=1).shape[1]


def _spines(topology: Topology) -> int:
    """The spine switches (tier 2) of the cluster's fabric."""
    return sum(1 for attributes in topology.wiring.nodes.values() if attributes.get("tier") == 2)


def spine_links(topology: Topology) -> list[tuple[str, str]]:
    """Every link between a leaf switch (tier 1) and a spine (tier 2), leaf first, in wiring order (none on a
    cluster of one leaf)."""
    nodes = topology.wiring.nodes
    return [(low, high) for low, high in topology.wiring.edges
            if nodes[low].get("tier") == 1 and nodes[high].get("tier") == 2]


def cut_by_every_spine(topology: Topology, down: Iterable[tuple[str, str]] = ()) -> str:
    """Which GPUs of ``topology`` no longer reach each other with every leaf-spine link down, and the directed
    links ``down`` too ('' for none: `split`)."""
    return split(topology, set(down) | set(both_ways(spine_links(topology))))


def nvls_forced(scenario: Scenario) -> bool:
    """Whether ``scenario`` forces NVLS (`collectives.algorithm: nvls`): a rack with every NVSwitch tray down then
    has no step (`StepStates._bare_rack_under_nvls`), where `auto` falls back as NCCL's tuner does."""
    return scenario.collectives.algorithm == "nvls"


def nvswitch_tray_faults(topology: Topology, trays_down: tuple[tuple[str, int], ...]) -> tuple[LinkFault, ...]:
    """The link faults of NVSwitch trays down on GB200 NVL72 racks (``trays_down``: a rack's NVSwitch node, how
    many of its trays are down): the node stands for the rack's `nvswitch_trays` trays, each GPU's link to it for
    its NVLinks, spread evenly over them, so k trays down leave each link of the rack (T - k) / T of its
    bandwidth, every tray down takes it down. Racks a shrunk job no longer uses are skipped."""
    trays = topology.params.get("nvswitch_trays", 0)
    capacity = {switch: (trays - down) / trays for switch, down in trays_down}
    return tuple(LinkFault(link=(switch, gpu), capacity=capacity[switch]) for switch, gpu in topology.wiring.edges
                 if switch in capacity)


class LinksFollowRacks:
    """Links down (node pairs) moved with their hardware when a restart regroups a GB200 NVL72 job's racks onto
    the first ones (`JobProcess._places`: a rack's NVSwitch node -> the one whose place it takes): a shrunk
    cluster is built anew, so its node names denote positions, and a NIC of rack 2's first tray (`h8/nic0`)
    is `h4/nic0` once the job runs on racks 1 and 2 as its racks 0 and 1. A node on a host (a NIC, a GPU) moves
    to the node in its place on the host in its tray's place; a leaf switch to the leaf its NICs' images hang
    from, where one does (else it cannot follow: its hosts now sit under several leaves); other nodes (spines)
    stay. A link with an end on a rack that left, or that cannot follow, is dropped, as the rack's trays down
    are; matched by name, a NIC down on rack 2 was dropped from the job shrunk onto 2 racks (no `h8` there) and
    one on rack 1 slowed the tray that took rack 2's place."""

    def __init__(self, topology: Topology, racks: tuple[tuple[str, tuple[int, ...]], ...]):
        nodes = topology.wiring.nodes
        self.hosts_of = dict(racks)
        self.on_host: dict[int, list[str]] = {}
        for name, attributes in nodes.items():
            if attributes.get("host") is not None:
                self.on_host.setdefault(attributes["host"], []).append(name)
        self.place = {name: (host, index) for host, names in self.on_host.items() for index, name in enumerate(names)}
        graph = topology.graph
        self.nics_of = {name: tuple(sorted(peer for peer in graph.successors(name) if peer in self.place))
                        for name, attributes in nodes.items() if attributes.get("tier") == 1}
        self.leaf_of = {nic: leaf for leaf, nics in self.nics_of.items() for nic in nics}

    def __call__(self, moves: dict[str, str], links: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """``links`` where the racks moved by ``moves`` put their hardware (those that cannot follow dropped)."""
        hosts = {old: new for switch, target in moves.items()
                 for old, new in zip(self.hosts_of[switch], self.hosts_of[target])}
        moved = [tuple(self._moved(node, hosts) for node in link) for link in links]
        return tuple(sorted((a, b) for a, b in moved if a is not None and b is not None))

    def _moved(self, node: str, hosts: dict[int, int]) -> str | None:
        if node in self.place:
            host, index = self.place[node]
            return self.on_host[hosts[host]][index] if host in hosts else None
        if node in self.nics_of:
            images = {self.leaf_of.get(self._moved(nic, hosts) or "") for nic in self.nics_of[node]}
            return images.pop() if len(images) == 1 else None
        return node


def state_guard(loaded: LoadedScenario, topology: Topology, state: ClusterState | None) -> UnfoldingGuard:
    """The refusal of the step of ``state`` (None: the healthy one) unfolded beyond the scale limits, as a plain
    run's, naming it."""
    differs = state.describe() if state is not None else ""
    step = f"the job's step with {differs}" if differs else "the job's step"
    return lambda unfolding: refuse_unfolded(loaded, topology.num_gpus, unfolding, step, topology)


def faults_within(faults: StepFaults, topology: Topology) -> StepFaults:
    """The scenario's `faults.step` on a shrunk job's cluster: those on GPUs, links and switches it no longer
    uses dropped. They sit on the hosts the job gave up, as the failures of units beyond its hosts (ignored) and
    the state's own stragglers and links down (dropped); kept, GPU 3 of a job shrunk to 3 GPUs ended the job
    with 'unknown GPU index 3'. A straggler by `fraction` or `all` applies to the smaller cluster; one left with
    no GPU stays in place (empty), so the later entries keep their index and with it their random draws."""
    def on_cluster(entry: Straggler) -> Straggler:
        if not isinstance(entry.gpus, tuple):
            return entry
        return entry.model_copy(update={"gpus": tuple(gpu for gpu in entry.gpus if gpu < topology.num_gpus)})

    def linked(entry: LinkFault) -> bool:
        return topology.graph.has_edge(*entry.link) if entry.link is not None else entry.uplinks_of in topology.graph

    return faults.model_copy(update={
        "stragglers": tuple(map(on_cluster, faults.stragglers)),
        "links": tuple(entry for entry in faults.links if linked(entry)),
        "gpu_failures": tuple(entry for entry in faults.gpu_failures if entry.gpu < topology.num_gpus)})


@dataclass(frozen=True)
class Degradation:
    """What one degraded or straggling unit does to the cluster: a spine down (its index), links down, its GPUs
    slowed by ``slowdown`` (`StepStates.state_of` places them), or an NVSwitch tray down (its rack's NVSwitch
    node, its index)."""

    spine: int | None = None
    links: tuple[tuple[str, str], ...] = ()
    gpus: tuple[int, ...] = ()
    slowdown: float = 1.0
    nvswitch_tray: tuple[str, int] | None = None
