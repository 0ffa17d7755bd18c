"""Which failures interrupt a job with its cluster otherwise healthy: the share of each unit's failures that do,
read by the closed forms (the expected interruptions, the system MTBF, Young's and Daly's intervals, the two-level
optimum, a study's default grid) as the job's process counts them.

Every failure of a `replace` or `restart` class interrupts; no `straggle` one does. A `degrade` unit interrupts
where its links down leave some GPU without a route (`rerouting.split`, the check a state's step aborts on: the
job then takes the unit's blast radius, or waits for its repair): a leaf switch over single-NIC hosts, the NIC or
NIC-leaf cable of a one-NIC host, a leaf-spine cable under a single spine. The check runs exactly, on the
cluster with the scenario's own `faults.step` links down too, for the units a linear-time test does not clear
first (`RouteCuts`): on a 16,384-GPU fat tree the test clears every NIC, cable and leaf.

Spine switches are simulated as uplink capacity until the last one goes (states.py), so a spine interrupts only
when every other spine is down as it fails: where losing them all cuts the cluster, its share is the chance that
the others are each down, (1 - exp(-rate x repair)) per spine over the spine classes (exact for exponential
failure times, whatever the repair law: the failures whose repair covers an instant are a Poisson count of mean
rate x mean repair). An NVSwitch tray likewise degrades its rack's NVLink until the rack's last tray goes, which
interrupts where the rack then has no step (a lone rack: no route; `collectives.algorithm: nvls`: no switch to
reduce in): its share is the chance its rack's other trays are each down. Other coincidences (both NICs of a two-NIC
host, every uplink of a leaf) are left out: second order, as this one is.
"""

from __future__ import annotations

import math

import networkx as nx

from simulator.config.reliability import Effect
from simulator.faults.rerouting import split
from simulator.reliability.blast import ClusterUnits
from simulator.reliability.components import FailureClass
from simulator.reliability.states import cut_by_every_spine
from simulator.topology.graph import Topology, both_ways

Edge = tuple[str, str]


class RouteCuts:
    """Whether a unit's links down leave some GPU of ``topology`` without a route, the links ``down`` down as well:
    `split`, run only where a linear-time test on the healthy fabric does not clear the unit. The test: take the
    fabric (every node but the GPUs), its pendant nodes (one link: a NIC) aside, leaving its core; each NVLink
    domain reaches the core through its attachments (a core node, or a pendant's one neighbour). A unit that takes
    one node's every link (a NIC, a switch) and is not a cut vertex of the core, or one link that is no bridge of
    it, leaves the core connected; where every domain still has an attachment, every GPU reaches every other
    through the core, so the unit cuts nothing. Anything else (a cut vertex, a bridge, a domain left without an
    attachment, a core not connected to begin with, a graph of explicit links) is checked by `split`."""

    def __init__(self, topology: Topology, down: set[Edge]):
        self.topology, self.down, self.graph = topology, down, topology.graph
        self.fast = not topology.explicit_graph and self._prepare()

    def _prepare(self) -> bool:
        graph = self.graph
        fabric = nx.Graph((u, v) for u, v in graph.edges() if (u, v) not in self.down and
                          graph.nodes[u].get("kind") != "gpu" and graph.nodes[v].get("kind") != "gpu")
        self.parent = {node: next(iter(fabric[node])) for node in fabric if fabric.degree(node) == 1}
        self.core = fabric.subgraph(node for node in fabric if node not in self.parent)
        if not self.core or not nx.is_connected(self.core):
            return False
        domains: dict[object, set[tuple[str, str]]] = {}
        for gpu in self.topology.gpus:
            domain = graph.nodes[gpu].get("nvlink_domain")
            routes = domains.setdefault(gpu if domain is None else domain, set())
            for node in graph.successors(gpu):
                if (gpu, node) in self.down:
                    continue
                if node in self.core:
                    routes.add((node, node))
                elif node in self.parent and self.parent[node] in self.core:
                    routes.add((node, self.parent[node]))
        if not all(domains.values()):
            return False
        self.through: dict[str, list[set[tuple[str, str]]]] = {}
        """Per fabric node, the routes (attachment, core node) of each domain with a route through it."""
        for routes in domains.values():
            for node in {node for route in routes for node in route}:
                self.through.setdefault(node, []).append(routes)
        self.cut_vertices = set(nx.articulation_points(self.core))
        self.bridges = {frozenset(edge) for edge in nx.bridges(self.core)}
        return True

    def cuts(self, links: tuple[Edge, ...]) -> bool:
        """Whether taking down ``links`` (node pairs) too leaves some GPU without a route."""
        if self.fast and self._cleared(links):
            return False
        return bool(split(self.topology, self.down.union(both_ways(links))))

    def _cleared(self, links: tuple[Edge, ...]) -> bool:
        graph = self.graph
        ends = {frozenset(link) for link in links}
        node = links[0][0] if links else None
        if node is not None and ends == {frozenset((node, other)) for other in graph.successors(node)}:
            if node in self.cut_vertices or (node in self.core and len(self.core) == 1):
                return False
            return all(any(node not in route for route in routes) for routes in self.through.get(node, ()))
        if len(ends) != 1:
            return not ends
        a, b = tuple(links[0])
        if a in self.parent or b in self.parent:
            pendant = a if a in self.parent else b
            return all(any(route[0] != pendant for route in routes) for routes in self.through.get(pendant, ()))
        return a in self.core and b in self.core and frozenset((a, b)) not in self.bridges


def interrupting_shares(topology: Topology, units: ClusterUnits, classes: tuple[FailureClass, ...],
                        down: set[Edge], nvls: bool) -> tuple[tuple[float, ...], ...]:
    """Per class, per unit, the share of the unit's failures that interrupt the job with the cluster otherwise
    healthy (module docstring); ``down``: the links the scenario's own `faults.step` take down for good, both ways;
    ``nvls``: whether the scenario forces NVLS (a rack with every NVSwitch tray down then has no step)."""
    cuts: RouteCuts | None = None
    every_spine_cuts = None
    bare_racks: dict[str, bool] = {}
    shares: list[tuple[float, ...]] = []
    for klass in classes:
        count = units.count(klass.unit)
        if klass.effect.interrupts:
            shares.append((1.0,) * count)
        elif klass.effect is not Effect.DEGRADE:
            shares.append((0.0,) * count)
        elif klass.unit == "spine_switch":
            if every_spine_cuts is None:
                every_spine_cuts = bool(cut_by_every_spine(topology, down))
            share = _down_chance(classes, "spine_switch") ** (units.spines - 1) if every_spine_cuts else 0.0
            shares.append((share,) * count)
        elif klass.unit == "nvswitch_tray":
            cuts = cuts or RouteCuts(topology, down)
            others_down = _down_chance(classes, "nvswitch_tray") ** (units.nvswitch_trays - 1)
            rack_shares = []
            for unit in range(count):
                rack = units.nodes["nvswitch_tray"][unit]
                if rack not in bare_racks:
                    bare_racks[rack] = nvls or cuts.cuts(units.links("nvswitch_tray", unit))
                rack_shares.append(others_down if bare_racks[rack] else 0.0)
            shares.append(tuple(rack_shares))
        else:
            cuts = cuts or RouteCuts(topology, down)
            shares.append(tuple(float(cuts.cuts(units.links(klass.unit, unit))) for unit in range(count)))
    return tuple(shares)


def training_shares(units: ClusterUnits, classes: tuple[FailureClass, ...]) -> tuple[float, ...]:
    """Per class, the share of time the job can train as far as that class's outages go, the cluster otherwise
    healthy: for a `degrade` spine or NVSwitch tray class, whose units interrupt only as the last of their group
    (the spines, a rack's trays) goes, the chance they are not all down, 1 - (chance one is down)^(units in the
    group); 1 for another class. A spine's interruptions while the job trains are its rate of failing as the
    last one up (its share x 1 / (M + r)) over that share of time (2 spines of 10 h, 12 h repairs:
    M (M + 2r) / 2r = 14.2 h while training, 14.4 h simulated; 9.2 h at share x 1 / M)."""
    group = {"spine_switch": units.spines, "nvswitch_tray": units.nvswitch_trays}
    return tuple(1.0 - _down_chance(classes, klass.unit) ** group[klass.unit]
                 if klass.effect is Effect.DEGRADE and group.get(klass.unit) else 1.0 for klass in classes)


def _down_chance(classes: tuple[FailureClass, ...], unit: str) -> float:
    """The chance that a given unit of kind ``unit`` (a spine switch, an NVSwitch tray) is down at an instant,
    from its `degrade` classes, each up for M / (M + r) of the time (`processes.py`): 1 - prod M / (M + r)."""
    up = math.prod(1.0 / (1.0 + klass.rate_per_unit_s * klass.repair_s) for klass in classes
                   if klass.unit == unit and klass.effect is Effect.DEGRADE)
    return 1.0 - up
