"""`faults.step` resolved against the cluster: which GPUs are slowed and by how much, which directed links fail
or degrade when, which GPUs fail when; and whether rank folding stays exact under the stragglers.

Random stragglers draw from a generator seeded by `run.seed` and the entry's position, so the same scenario
and seed always slow the same GPUs by the same factors.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

import numpy as np

from simulator.config.faults import LinkFault, SlowdownDraw, StepFaults, Straggler
from simulator.config.reliability import MAX_SLOWDOWN, MIN_SLOWDOWN
from simulator.errors import ScenarioError
from simulator.parallel.folding import RankClasses
from simulator.parallel.folding import representatives as folding_representatives
from simulator.parallel.layout import Layout
from simulator.topology.graph import Topology

STRAGGLER_STREAM = 0x53544550
"""Mixed into the seed of straggler draws, so other users of `run.seed` draw independent numbers."""


@dataclass(frozen=True)
class Slowdown:
    """A GPU's compute slowdown: ``factor`` times the product of its periodic swings (amplitude, period,
    phase), each evaluated at the simulated time a kernel starts."""

    factor: float = 1.0
    swings: tuple[tuple[float, float, float], ...] = ()

    def at(self, time_s: float) -> float:
        """The slowdown factor of a kernel starting at ``time_s``."""
        value = self.factor
        for amplitude, period, phase in self.swings:
            value *= 1.0 + amplitude * math.sin(2.0 * math.pi * (time_s + phase) / period)
        return value

    def times(self, other: Slowdown) -> Slowdown:
        """Both slowdowns at once: the factors' product, held within [MIN_SLOWDOWN, MAX_SLOWDOWN] (two entries of
        1000 on one GPU made a factor of a million, past the bound each entry is held to), the swings of both."""
        factor = min(max(self.factor * other.factor, MIN_SLOWDOWN), MAX_SLOWDOWN)
        return Slowdown(factor, self.swings + other.swings)

    @property
    def nominal(self) -> bool:
        """Whether the GPU runs at its own speed throughout."""
        return self.factor == 1.0 and not self.swings


NOMINAL = Slowdown()


@dataclass(frozen=True)
class LinkEvent:
    """From ``at_s`` the links between the node pairs ``edges`` keep ``capacity`` of their bandwidth (0: down),
    until ``until_s`` when they come back at full bandwidth (None: to the step's end); where ``every_s`` is set, the
    same again from each ``at_s + k every_s`` to ``until_s + k every_s``, ``count`` times in all (None: to the step's
    end)."""

    at_s: float
    edges: tuple[tuple[str, str], ...]
    capacity: float
    label: str
    until_s: float | None = None
    every_s: float | None = None
    count: int | None = None

    def times(self) -> Iterator[tuple[float, float | None]]:
        """Each (start, end) of the fault in turn (end None: to the step's end); endless where it repeats to the
        step's end."""
        if self.every_s is None:
            yield self.at_s, self.until_s
            return
        assert self.until_s is not None, "a repeating fault ends each time"
        k = 0
        while self.count is None or k < self.count:
            yield self.at_s + k * self.every_s, self.until_s + k * self.every_s
            k += 1

    def describe(self) -> dict:
        """The fault as the summary reports it, with `until_s`, `every_s` and `count` only where set (`every_s`
        without `count`: it repeats to the step's end)."""
        timing = {"until_s": self.until_s, "every_s": self.every_s, "count": self.count}
        return {"link": self.label, "at_s": self.at_s, **{key: value for key, value in timing.items()
                                                           if value is not None}, "capacity": self.capacity}

    @property
    def from_start(self) -> bool:
        """Whether the fault holds for the whole step: the cluster's own link, for every plan and check."""
        return self.at_s == 0 and self.until_s is None

    @property
    def timed(self) -> bool:
        """Whether the fault changes the network during the step: it strikes after the start or comes back."""
        return not self.from_start


@dataclass(frozen=True)
class GpuEvent:
    """GPU ``gpu`` fails at ``at_s``."""

    at_s: float
    gpu: int


@dataclass(frozen=True)
class StepFaultPlan:
    """Faults of one step on a concrete cluster: slowdown per slowed GPU, link and GPU events by time."""

    slowdowns: tuple[tuple[int, Slowdown], ...] = ()
    links: tuple[LinkEvent, ...] = ()
    gpu_failures: tuple[GpuEvent, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.slowdowns or self.links or self.gpu_failures)

    def slowdown_of(self) -> dict[int, Slowdown]:
        """The slowdown of each slowed GPU, by GPU index."""
        return dict(self.slowdowns)

    def describe(self, topology: Topology) -> dict:
        """The faults as the summary reports them."""
        return {
            "slowed_gpus": {str(gpu): {"factor": s.factor, "swings": [list(w) for w in s.swings]}
                            for gpu, s in self.slowdowns},
            "links": [event.describe() for event in self.links],
            "gpu_failures": [{"gpu": event.gpu, "name": topology.gpus[event.gpu], "at_s": event.at_s}
                             for event in self.gpu_failures],
        }


def resolve_step_faults(faults: StepFaults, topology: Topology, seed: int) -> StepFaultPlan:
    """Check `faults.step` against ``topology`` and resolve it; a ScenarioError names the offending entry's
    field (the caller locates it in the scenario)."""
    slowdowns: dict[int, Slowdown] = {}
    for index, entry in enumerate(faults.stragglers):
        for gpu, slowdown in _straggler(entry, index, topology.num_gpus, seed).items():
            slowdowns[gpu] = slowdowns.get(gpu, NOMINAL).times(slowdown)
    links = tuple(sorted((_link_event(entry, f"faults.step.links[{index}]", topology)
                          for index, entry in enumerate(faults.links)), key=lambda event: event.at_s))
    failures = []
    for index, failure in enumerate(faults.gpu_failures):
        if failure.gpu >= topology.num_gpus:
            raise ScenarioError(f"unknown GPU index {failure.gpu}", field=f"faults.step.gpu_failures[{index}].gpu",
                                allowed=f"0 to {topology.num_gpus - 1}")
        failures.append(GpuEvent(failure.at, failure.gpu))
    failures.sort(key=lambda event: (event.at_s, event.gpu))
    kept = tuple(sorted((gpu, s) for gpu, s in slowdowns.items() if not s.nominal))
    return StepFaultPlan(kept, links, tuple(failures))


def _straggler(entry: Straggler, index: int, num_gpus: int, seed: int) -> dict[int, Slowdown]:
    rng = np.random.default_rng([STRAGGLER_STREAM, index, seed % 2**63])
    if entry.gpus == "all":
        gpus = list(range(num_gpus))
    elif entry.gpus is not None:
        bad = [gpu for gpu in entry.gpus if not 0 <= gpu < num_gpus]
        if bad:
            raise ScenarioError(f"unknown GPU index {bad[0]}", field=f"faults.step.stragglers[{index}].gpus",
                                allowed=f"0 to {num_gpus - 1}")
        gpus = sorted(set(entry.gpus))
    else:
        count = max(1, round((entry.fraction or 0.0) * num_gpus))
        gpus = sorted(rng.choice(num_gpus, size=count, replace=False).tolist())
    factors = _factors(entry, len(gpus), rng)
    swings = () if entry.swing is None else ((entry.swing.amplitude, entry.swing.period, entry.swing.phase),)
    return {gpu: Slowdown(factor, swings) for gpu, factor in zip(gpus, factors)}


def _factors(entry: Straggler, count: int, rng: np.random.Generator) -> list[float]:
    """The entry's fixed factor for every GPU, or one draw per GPU (the schema makes exactly one of them set)."""
    if entry.draw is None:
        return [float(entry.slowdown or 1.0)] * count
    return draw_factors(entry.draw, count, rng).tolist()


def draw_factors(draw: SlowdownDraw, shape: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Slowdown factors of the given shape from ``draw``: uniform between low and high, or lognormal, whose
    tails are held within [MIN_SLOWDOWN, MAX_SLOWDOWN], the bounds a given factor is held to (median 1 and
    sigma 2 would draw a factor above 1000 for one GPU in 3,600, and one below 1/1000 as often)."""
    if draw.low is not None and draw.high is not None:
        return rng.uniform(draw.low, draw.high, shape)
    factors = float(draw.median or 1.0) * np.exp(float(draw.sigma or 0.0) * rng.standard_normal(shape))
    return np.clip(factors, MIN_SLOWDOWN, MAX_SLOWDOWN)


def _example_link(graph) -> str:
    """A link of this graph to show in an error, between two switches where there is one (leaf0.r0, spine0 on
    a fat tree; h0/gpu0, h0/nvswitch inside one host)."""
    def switches(edge: tuple[str, str]) -> int:
        return sum(graph.nodes[node].get("tier") is not None for node in edge)
    edges = sorted(graph.edges, key=lambda edge: (-switches(edge), edge))
    return f"[{edges[0][0]}, {edges[0][1]}]" if edges else "none in this topology"


def _link_event(entry: LinkFault, path: str, topology: Topology) -> LinkEvent:
    graph = topology.graph
    if entry.link is not None:
        a, b = entry.link
        for node in (a, b):
            if node not in graph:
                raise ScenarioError(f"unknown node {node!r}", field=f"{path}.link",
                                    allowed="node names of the topology graph (trainsim topo describe lists "
                                            f"them), e.g. {_example_link(graph)}")
        if not graph.has_edge(a, b):
            neighbours = ", ".join(sorted(graph.successors(a))[:8])
            raise ScenarioError(f"no link between {a} and {b}", field=f"{path}.link",
                                allowed=f"a neighbour of {a}: {neighbours}")
        return LinkEvent(entry.at, ((a, b),), entry.capacity, f"{a}-{b}", entry.until, entry.every, entry.count)
    switch = entry.uplinks_of or ""
    tier = graph.nodes[switch].get("tier") if switch in graph else None
    if tier is None and topology.explicit_graph and switch in graph and graph.nodes[switch].get("kind") == "switch":
        raise ScenarioError(f"{switch!r} is a switch of a graph topology, and a graph's switches have no tiers to "
                            "tell its uplinks by", field=f"{path}.uplinks_of",
                            allowed=f"one entry per link, link: [{switch}, <neighbour>]")
    if tier is None:
        switches = sorted(n for n, data in graph.nodes(data=True) if data.get("tier") is not None)
        raise ScenarioError(f"{switch!r} is not a switch of the topology", field=f"{path}.uplinks_of",
                            allowed=", ".join(switches[:8]) + (", ..." if len(switches) > 8 else "")
                            if switches else "none here")
    up = tuple((switch, n) for n in sorted(graph.successors(switch)) if (graph.nodes[n].get("tier") or 0) > tier)
    if not up:
        raise ScenarioError(f"{switch} has no uplinks (it is a top-tier switch)", field=f"{path}.uplinks_of",
                            allowed="a leaf or spine below another tier")
    return LinkEvent(entry.at, up, entry.capacity, f"uplinks of {switch}", entry.until, entry.every, entry.count)


def alike_in_stages(plan: StepFaultPlan, layout: Layout) -> bool:
    """Whether ``plan`` leaves the ranks of every pipeline stage alike: no link faults, and each stage's ranks
    slowed alike (or none of them). Any fold of the step then stays as exact as without faults, by stage or by
    classes of a stage's ranks (the classed and refolded steps of engine/fold_policy.py), each simulated rank
    slowed as its stage is; a GPU failure aborts the step at its time whichever ranks are simulated."""
    if plan.links:
        return False
    slowed = plan.slowdown_of()
    return all(len({slowed.get(rank, NOMINAL) for rank in layout.stage_ranks(stage)}) == 1
               for stage in range(layout.pp))


@dataclass(frozen=True)
class SlowReplica:
    """Where stragglers that do not slow each stage's ranks alike sit: the ranks whose coordinates along ``dims``
    (of TP, CP and DP) are ``coords``, slowed alike in each stage, every other rank of a stage slowed as its
    stage's others are (the common slowdown: nominal, or a background slowdown on every GPU). One GPU gives all
    three dimensions; a whole slow TP group (a slow host) DP and CP only."""

    dims: tuple[str, ...]
    coords: tuple[int, ...]

    def key(self, layout: Layout, rank: int) -> tuple[bool, ...]:
        """Which of the slow replica's coordinates ``rank`` shares."""
        coords = layout.coords(rank)
        return tuple(coords[dim] == own for dim, own in zip(self.dims, self.coords))

    def rank_in(self, layout: Layout, stage: int) -> int:
        """The first rank of the slow replica in pipeline ``stage``."""
        return layout.rank_of(pp=stage, **dict(zip(self.dims, self.coords)))


REPLICA_DIMS = ("tp", "cp", "dp")
"""The coordinates that tell a pipeline stage's ranks apart."""


@lru_cache(maxsize=4)
def slow_replica(plan: StepFaultPlan, layout: Layout) -> SlowReplica | None:
    """The slow replica of ``plan``'s stragglers (`SlowReplica`), singled out by as few coordinates as will do
    (coarsest first, so a slow TP group is one replica of DP and CP coordinates, not eight of all three); None
    where the stragglers slow every stage's ranks alike or no one replica holds them all (two GPUs of a TP group
    slowed unlike, or GPUs of two DP replicas). Kept for the last few plans: a step asks it of one plan several
    times (its fold shape, slowdowns and classes), each ~0.02 s over the 16,384 ranks of the bundled job, the
    ranks' replica coordinates read once per layout (`_replicas_in_stages`)."""
    if alike_in_stages(plan, layout):
        return None
    slowed = plan.slowdown_of()
    dims = [dim for dim in REPLICA_DIMS if layout.degree(dim) > 1]
    for size in range(1, len(dims) + 1):
        for chosen in combinations(dims, size):
            found = _singled_out(slowed, _replicas_in_stages(layout, chosen), chosen)
            if found is not None:
                return found
    return None


@lru_cache(maxsize=8)
def _replicas_in_stages(layout: Layout, dims: tuple[str, ...]) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]:
    """Each pipeline stage's ranks in rank order, each with its coordinates along ``dims`` (its replica of those
    dimensions). Kept per layout, as every straggler state of a job asks `slow_replica` of a new plan: reading the
    coordinates per plan costs ~0.07 s of each such state of the bundled 16,384-GPU job."""
    def replica(rank: int) -> tuple[int, ...]:
        coords = layout.coords(rank)
        return tuple(coords[dim] for dim in dims)

    return tuple(tuple((rank, replica(rank)) for rank in layout.stage_ranks(stage)) for stage in range(layout.pp))


def _singled_out(slowed: dict[int, Slowdown], stages: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...],
                 dims: tuple[str, ...]) -> SlowReplica | None:
    """The replica of ``dims`` coordinates whose ranks are slowed otherwise than the rest, where in each stage
    (``stages``: `_replicas_in_stages`) the ranks of every replica of ``dims`` are slowed alike (``slowed``: each
    slowed rank's slowdown) and all but that one alike; None otherwise. Of two replicas slowed unlike (a degree
    of 2), the one with the larger factor is the slow one: either way each is a class of its own."""
    odd: set[tuple[int, ...]] = set()
    for ranks in stages:
        by_replica: dict[tuple[int, ...], set[Slowdown]] = {}
        for rank, replica in ranks:
            by_replica.setdefault(replica, set()).add(slowed.get(rank, NOMINAL))
        if any(len(held) > 1 for held in by_replica.values()):
            return None
        counts = Counter(next(iter(held)) for held in by_replica.values())
        if len(counts) > 2 or (len(counts) == 2 and len(by_replica) > 2 and min(counts.values()) > 1):
            return None
        if len(counts) == 2:
            rare = min(counts, key=lambda slowdown: (counts[slowdown], -slowdown.factor))
            odd |= {replica for replica, held in by_replica.items() if rare in held}
    return SlowReplica(dims, odd.pop()) if len(odd) == 1 else None


FoldShape = tuple[bool, bool, SlowReplica | None]
"""What of a step's faults decides how it folds (`fold_shape`)."""


def fold_shape(plan: StepFaultPlan, layout: Layout) -> FoldShape:
    """What of ``plan`` decides how a step of ``layout`` folds (engine/fold_policy.py): whether it has link
    faults, whether every stage's ranks are slowed alike, and else its slow replica (`slow_replica`; None where
    no one replica holds the stragglers). Two plans of one shape take the same folding path and build the same
    programs; only the slowdowns the simulated ranks take differ (`fold_policy.refaulted`)."""
    alike = alike_in_stages(plan, layout)
    return bool(plan.links), alike, None if alike else slow_replica(plan, layout)


def straggler_classes(plan: StepFaultPlan, layout: Layout, tp_apart: bool = False) -> RankClasses | None:
    """The classes of a stage's ranks that a step with stragglers in one pipeline replica simulates apart: keyed
    by which of the slow replica's coordinates each rank shares (`slow_replica`: one GPU's rank a class of one;
    a rank of its TP group waits for it at every TP collective, one of its DP group at every gradient reduction,
    the rest only through those). The summary's per-GPU means then weigh each representative by its class's size
    (parallel/folding.py `rank_weights`), the slow rank as one GPU. None where there is no such replica.

    ``tp_apart``: key every rank also by its TP coordinate, for a step whose TP all-gathers run as ring exchanges
    against their GEMMs (`tp_comm_overlap`, parallel/overlap.py): each rank then trades chunks with its own
    neighbours (a pair, then every other rank along the ring), so a TP rank waits for the slow GPU, or for a rank
    waiting on it at a DP reduction, by where it sits along the ring, not alike with its TP mates (4 racks of GB200
    trays, TP 4 x PP 2 x DP 8, GPU 5 x1.5: keyed without it, 8 ranks, the step time exact and bubble 0.48226
    against 0.48161 unfolded, exposed TP 0.714 against 0.725 ms; keyed only in the slow GPU's own TP group, the DP
    communication still 3.6 us off). Where the slow replica is a whole TP group (a slow host: `SlowReplica.dims`
    without TP), every rank of a ring waits alike and the TP coordinate parts no class."""
    replica = slow_replica(plan, layout)
    if replica is None:
        return None
    by_tp = tp_apart and "tp" in replica.dims
    return RankClasses.keyed([(*replica.key(layout, rank), layout.coords(rank)["tp"] if by_tp else 0)
                              for rank in layout.stage_ranks(0)], unequal=True)


def folded_slowdowns(plan: StepFaultPlan, layout: Layout, ranks: Sequence[int]) -> tuple[dict[int, Slowdown], bool,
                                                                                          str]:
    """How the stragglers of ``plan`` (without link faults, which unfold a step first) fold onto the simulated
    ``ranks``: (slowdown of each, whether that is exact only if no
    replica's traffic shares a link with theirs, why folding is off ('' when it is on)).

    Every rank of a stage slowed alike keeps the replicas identical: each simulated rank is slowed as its stage
    is, however many a stage has. Stragglers that all lie in one pipeline replica (one TP, CP and DP coordinate)
    fold onto one representative per stage, which then play the slow replica: the others wait for it at every
    collective they share, so the step time is exact when their traffic never meets it elsewhere (checked on the
    program's links by the caller), but the per-GPU figures are the slow replica's; folded by the classes of
    `straggler_classes` (or its finer classes by TP coordinate too, ``tp_apart``), the slow replica's ranks are
    simulated as themselves beside a rank of each other class, which asks no such isolation: the class-mates are
    held to their representatives as in any classed fold.
    Other simulated ranks are refused (a guard: the step builds no others under such stragglers)."""
    slowed = plan.slowdown_of()
    if alike_in_stages(plan, layout):
        return {rank: slowed[rank] for rank in ranks if not slowed.get(rank, NOMINAL).nominal}, False, ""
    replica = slow_replica(plan, layout)
    if replica is None:
        return {}, False, "stragglers in more than one pipeline replica"
    if any(list(ranks) == folding_representatives(layout, True, straggler_classes(plan, layout, tp_apart))
           for tp_apart in (False, True)):
        return {rank: slowed[rank] for rank in ranks if rank in slowed}, False, ""
    if list(ranks) != folding_representatives(layout, True):
        return {}, False, "stragglers in one pipeline replica fold onto one rank per stage or per class only"
    return ({rank: slowed[gpu] for rank, gpu in ((rank, replica.rank_in(layout, stage))
                                                for stage, rank in enumerate(ranks)) if gpu in slowed},
            True, "")
