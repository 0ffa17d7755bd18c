"""Whether rank folding stays exact on the routed network: every folded replica's copy of a collective must
meet the links as the simulated copy does.

Folding simulates one rank per stage and lets the other ranks of the stage mirror it, which is exact only if
their collectives take the same time. A fabric that spreads flows over spines by hashing GPU indices can break
that: the two channels of one rank's ring may land on one spine uplink while those of its neighbour's ring
land on two, and on an oversubscribed fabric that uplink is the bottleneck, so the neighbour finishes first
and the folded step comes out too fast. The check compares, phase by phase, each collective's transfers with
those of every mirror image: the bytes of each transfer and, along its route, each link's bandwidth, class and
how many of the phase's transfers cross it. Equal shapes are equal by symmetry; where they differ, both plans
are timed alone on the links (network/isolated.py) and folding is off only if the times differ.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from itertools import chain

import numpy as np

from simulator.collectives.phases import Phase
from simulator.engine.groups import GroupIds
from simulator.engine.plans import PlanCache
from simulator.network.isolated import run_isolated
from simulator.program.ops import CollectiveOp, Op
from simulator.topology.graph import Topology

SAME_TIME = 1e-9
"""Relative difference below which two isolated timings are the same (float rounding of a differently ordered
max-min solve)."""


LOADS = 1 << 32
"""A link's place in a route shape packs its kind and its load into one integer, ``kind * LOADS + load``: a
phase has far fewer than 2**32 transfers, so the packing is one to one and shapes compare as plain ints."""


def link_kind_codes(topology: Topology) -> list[int]:
    """Each directed link's kind (bandwidth, class) as a dense id, times LOADS."""
    kinds: dict[tuple[float, str], int] = {}
    return [kinds.setdefault(kind, len(kinds)) * LOADS
            for kind in zip(topology.link_bandwidth.tolist(), topology.link_class)]


def route_shape(topology: Topology, phase: Phase, link_kinds: Sequence[int]) -> tuple:
    """What the network sees of ``phase`` up to renaming links: per transfer its bytes and, for each link of
    its route, its kind (``link_kinds``, `link_kind_codes`) and how many of the phase's transfers cross it;
    sorted, so the order of the transfers does not matter."""
    if not phase.transfers:
        return ()
    sources, destinations, sizes, channels = zip(*phase.transfers)
    paths = list(map(topology.path, sources, destinations, channels))
    place = {link: link_kinds[link] + load for link, load in Counter(chain.from_iterable(paths)).items()}
    return tuple(sorted(zip(sizes, [tuple(map(place.__getitem__, path)) for path in paths])))


def asymmetric_replicas(ops: Sequence[Op], plans: PlanCache, capacity: np.ndarray) -> str:
    """Why folding would not be exact ('' when every collective's mirrors take the time it takes). A mirror
    whose phases have the same route shapes as the simulated copy's is equal by symmetry; one whose shapes
    differ (an uplink shared by two of its flows, say) is timed alone on the links of ``capacity`` (bytes/s)
    beside the simulated copy, and differs when the times do (a shared uplink wide enough for both flows costs
    nothing). Each group is compared once per algorithm (message sizes change the bytes, not the routes); a
    group inside one NVLink domain never reaches the fabric's switches, so it is not compared. Pipeline
    send/recvs are not compared: a pair inside a leaf group in one replica and across the spines in another
    differs by a few hops of latency, and turning folding off for that unfolded the published SC21 and Llama 3
    cases into runs of tens of GiB; on the small fabric of tests/test_folding.py the folded step is 0.70% slow."""
    topology = plans.topology
    link_kinds = link_kind_codes(topology)
    group_ids = GroupIds()
    sized: set[tuple] = set()
    seen: set[tuple] = set()
    for op in ops:
        if not isinstance(op, CollectiveOp) or not op.mirrors:
            continue
        instance = (op.op, op.root, op.algorithm, op.nbytes, group_ids.id(op.group))
        if instance in sized:
            continue
        sized.add(instance)
        shape = (op.op, op.root, plans.resolved_algorithm(op, op.group), instance[-1])
        if shape in seen:
            continue
        seen.add(shape)
        if op.op == "send_recv" or len({topology.gpu_domain[rank] for rank in op.group}) == 1:
            continue
        phases = plans.phases(op, op.group)
        reference = tuple(route_shape(topology, phase, link_kinds) for phase in phases)
        timings: dict[tuple, float] = {}
        for mirror in op.mirrors:
            mirrored = plans.phases(op, mirror)
            shapes = tuple(route_shape(topology, phase, link_kinds) for phase in mirrored)
            if shapes == reference or shapes in timings:
                continue
            if not timings:
                timings[reference] = alone_s = run_isolated(topology, capacity, phases).duration_s
            mirror_s = timings[shapes] = run_isolated(topology, capacity, mirrored).duration_s
            if not math.isclose(mirror_s, alone_s, rel_tol=SAME_TIME):
                return (f"{op.op} {op.name!r} takes {alone_s * 1e3:.4g} ms over GPUs {list(op.group)} but "
                        f"{mirror_s * 1e3:.4g} ms over the equivalent {list(mirror)}: their flows share the "
                        "fabric's links unevenly (each flow hashed onto a spine by its ends)")
    return ""
