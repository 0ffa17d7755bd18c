"""Whether rank folding stays exact on the routed network: every folded replica's copy of a collective must
meet the links as the simulated copy does.

Folding simulates one rank per stage and lets the other ranks of the stage mirror it, which is exact only if
their collectives take the same time. A fabric that spreads flows over spines by hashing GPU indices can break
that: the two channels of one rank's ring may land on one spine uplink while those of its neighbour's ring
land on two, and on an oversubscribed fabric that uplink is the bottleneck, so the neighbour finishes first
and the folded step comes out too fast. The check compares, phase by phase, each collective's transfers with
those of every mirror image: the bytes of each transfer and, along its route, each link's bandwidth, class and
how many of the phase's transfers cross it. Equal shapes are equal by symmetry; where they differ, both plans
are timed alone on the links (network/isolated.py) and folding is off only if the times differ. Timing alone
cannot see what a mirror meets only in the step: a collective whose members send unlike amounts (a tree's
inner ranks and leaves) loads the ranks of a stage unlike, so every collective's mirrors must also meet that
load along their routes as the simulated copy does where the two may overlap (`unequal_traffic`), each
overlapping collective's load on its own (a sum of mirror images is alike on every lane), or folding is off.
A send/recv is compared here only in whether it stays inside one NVLink domain as each mirror does, and inside
domains that are not stars (a PCIe server) as other collectives are; its copies across the fabric are compared
after the run (engine/lockstep.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from itertools import chain

import numpy as np

from simulator.collectives.execute import phase_arrays
from simulator.collectives.phases import TRANSFER_ENDS, Phase, Transfer
from simulator.engine.ordering import ProgramOrder
from simulator.engine.plans import PlanCache
from simulator.engine.shapes import CollectiveShapes
from simulator.engine.sharing import InstanceColumns, Instances
from simulator.metrics.events import FlowRoutes
from simulator.network.isolated import run_isolated
from simulator.network.model import analytic_seconds
from simulator.program.ops import CollectiveOp, Op
from simulator.topology.graph import Topology
from simulator.units import durations_apart

SAME_TIME = 1e-9
"""Relative difference below which two isolated timings are the same (float rounding of a differently ordered
max-min solve)."""


LOADS = 1 << 32
"""A link's place in a route shape packs its kind and its load into one integer, ``kind * LOADS + load``: a
phase has far fewer than 2**32 transfers, so the packing is one to one."""

BATCH_TRANSFERS = 1 << 18
"""Most transfers whose route shapes are worked out in one array pass: a collective's mirrors go in batches of
about this many transfers, so the pass's memory does not grow with the number of mirrors."""


def link_kind_codes(topology: Topology) -> np.ndarray:
    """Each directed link's kind (bandwidth, class) as an id, times LOADS."""
    classes = {name: i for i, name in enumerate(dict.fromkeys(topology.link_class))}
    class_ids = np.fromiter(map(classes.__getitem__, topology.link_class), dtype=np.int64,
                            count=len(topology.link_class))
    bandwidth_ids = np.unique(topology.link_bandwidth, return_inverse=True)[1].reshape(-1)
    return (bandwidth_ids * len(classes) + class_ids) * LOADS


def route_shapes(topology: Topology, phases: Sequence[Phase], link_kinds: np.ndarray) -> list[bytes]:
    """What the network sees of each of ``phases`` up to renaming links, comparable across calls: per transfer
    its bytes and, for each link of its route, its kind (`link_kind_codes`) and how many of the phase's
    transfers cross it; as the table's width, then a table with a row per transfer (the bytes' bit pattern,
    then the route's links, padded with -1 to the phase's longest route) whose rows are sorted, so the order of
    the transfers does not matter. All the phases are worked out together, over arrays of every transfer and
    every link they cross."""
    sizes = np.array([len(phase.transfers) for phase in phases], dtype=np.int64)
    transfers = [t for phase in phases for t in phase.transfers]
    if not transfers:
        return [np.int64(0).tobytes()] * len(phases)
    lengths, links = routed(topology, transfers)
    of_phase = np.repeat(np.arange(len(phases)), sizes)
    _, crossing, load = np.unique(np.repeat(of_phase, lengths) * len(link_kinds) + links, return_inverse=True,
                                  return_counts=True)
    table = np.column_stack((np.array([t.nbytes for t in transfers], dtype=np.float64).view(np.int64),
                             padded(lengths, link_kinds[links] + load[crossing], -1)))
    table = table[np.lexsort((*table.T[::-1], of_phase))]
    widths = np.zeros(len(phases), dtype=np.int64)
    np.maximum.at(widths, of_phase, 1 + lengths)
    bounds = np.concatenate(([0], np.cumsum(sizes))).tolist()
    return [np.int64(width).tobytes() + table[start:end, :width].tobytes()
            for start, end, width in zip(bounds, bounds[1:], widths.tolist())]


def _class_firsts(plans: PlanCache, op: CollectiveOp) -> list[int]:
    """The indices of ``op``'s mirrors to compare: the first of each class of translates by whole periods of
    the fabric's spine hash (`PlanCache.link_table`, the table `engine/sharing.py` reads too), but none of the
    group's own class when the group lies in the first periods. A translate meets links alike transfer for
    transfer, so its route shapes are its class's."""
    table = plans.link_table(op, op.mirrors)
    periods = plans.translations()
    own = None
    if periods is not None:
        first, shift = periods.split(np.array([op.group], dtype=np.int64))
        own = table.first_of.get(tuple(first[0].tolist())) if not shift[0] else None
    seen = {own}
    firsts = []
    for index, found in enumerate(table.classes.tolist()):
        if found not in seen:
            seen.add(found)
            firsts.append(index)
    return firsts


def _mirror_batches(phases: list[Phase], mirror_plans: Sequence[list[Phase]]) -> Iterator[range]:
    """The mirrors (as index ranges) whose route shapes are worked out in one pass: at least one, and no more
    than keep a pass within BATCH_TRANSFERS transfers beside those of ``phases``."""
    sizes = [sum(len(phase.transfers) for phase in plan) for plan in mirror_plans]
    per_mirror = max(1, max(sizes, default=1))
    room = max(1, (BATCH_TRANSFERS - sum(len(phase.transfers) for phase in phases)) // per_mirror)
    for start in range(0, len(mirror_plans), room):
        yield range(start, min(start + room, len(mirror_plans)))


def asymmetric_replicas(ops: Sequence[Op], plans: PlanCache, capacity: np.ndarray,
                        shapes: CollectiveShapes | None = None, order: ProgramOrder | None = None) -> str:
    """Why folding would not be exact ('' when every collective's mirrors take the time it takes). A mirror
    whose phases have the same route shapes as the simulated copy's is equal by symmetry; one whose shapes
    differ (an uplink shared by two of its flows, say) is timed alone on the links of ``capacity`` (bytes/s)
    beside the simulated copy, and differs when the times do (a shared uplink wide enough for both flows costs
    nothing). Each group is compared once per algorithm (message sizes change the bytes, not the routes), at
    the size of its first op that sends anything (an empty plan shows no routes); a group that lies inside one
    NVLink domain, as each of its mirrors does, never reaches the fabric's switches, so it is not compared where
    the domains are stars (`star_domains`; a mirror across two domains is: wrong images of an intra-host group
    would otherwise fold unchecked); nor is
    a group translated by whole periods of the fabric's spine hash from one already compared (`_Translates`).
    A send/recv (a pipeline hand-off) is compared by one test only: it and its mirrors must all stay inside one
    NVLink domain or all leave it (`_domain_crossing`); with pipeline stages not aligned to hosts one replica
    hands a stage on over NVLink and another over the NICs, and folding was 0.1-2.2% off (tp 4, pp 3, dp 2 on
    three hosts); pairs all inside domains that are not stars are compared as other collectives are. Pairs that
    all cross the fabric are not compared further here (turning folding off for them unfolded the published
    SC21 and Llama 3 cases into runs of tens of GiB): one inside a leaf group in one replica and across the
    spines in another differs by the hops and uplinks it takes (the step folded by stage 0.55% slow on the
    small fabric of tests/test_folding.py), which the lockstep check after the run compares (engine/lockstep.py:
    the step then folds again with the replicas' hosts classed by their hand-offs' hops, unfolds, or stands
    with a warning where it is too large unfolded).
    Last, every collective's mirrors must meet the unequal traffic as its group does (`unequally_met`).
    ``shapes``: the index of ``ops``' collectives, when the caller has it; ``order``: the program's ordering
    (what may overlap what; default: ``ops`` with no asynchronous stream), shared with the sharing analysis."""
    shapes = shapes or CollectiveShapes.of(ops)
    return unlike_routes(plans, capacity, shapes) or unequally_met(shapes, plans,
                                                                    order or ProgramOrder(ops, frozenset()))


def unlike_routes(plans: PlanCache, capacity: np.ndarray, shapes: CollectiveShapes) -> str:
    """Why some collective of ``shapes`` takes another time alone over a mirror than over its group on the flow
    model ('' when none does): the comparisons of `asymmetric_replicas` before the unequal traffic met."""
    topology = plans.topology
    link_kinds = link_kind_codes(topology)
    domains = np.asarray(topology.gpu_domain)
    star = star_domains(topology)
    translates = _Translates(plans, link_kinds)
    sized: set[tuple] = set()
    seen: set[tuple] = set()
    for op, gid in zip(shapes.firsts, shapes.group_of_shape):
        if not op.mirrors or not op.nbytes:
            continue
        instance = (op.op, op.root, op.algorithm, op.protocol, op.nbytes, gid)
        if instance in sized:
            continue
        sized.add(instance)
        algorithm = plans.resolved_algorithm(op, op.group)
        if (op.op, op.root, algorithm, gid) in seen:
            continue
        seen.add((op.op, op.root, algorithm, gid))
        inside = _inside_domains(domains, op)
        if op.op == "send_recv":
            verdict = _domain_crossing(domains, op)
            if verdict:
                return verdict
            if star or not inside:
                continue
        elif inside and star:
            continue
        if translates.known(op, algorithm):
            continue
        phases = plans.phases(op, op.group)
        reference = tuple(route_shapes(topology, phases, link_kinds))
        verdict = _mirror_verdict(plans, op, phases, reference, capacity, link_kinds)
        if verdict:
            return verdict
        translates.add(op, algorithm, reference)
    return ""


COPIES_LOAD = ", or in the load that the collective's copies put on them"
"""What `unlike_alone` adds to its reason where it timed the collective with its copies' load."""


def unlike_alone(plans: PlanCache, capacity: np.ndarray, shapes: CollectiveShapes) -> str:
    """Why folding would not be exact on the analytic model ('' when every collective's mirrors take the time
    its group takes): there no other work slows a collective, so its plan takes, phase after phase, its slowest
    transfer's latency plus bytes at its share of its route's links of ``capacity`` (bytes/s; a link split among
    the phase's own transfers over it, network/model.py `analytic_seconds`), and a mirror stands for its
    replica exactly when its plan takes the group's time.
    No mirror meets traffic there, so neither the route shapes nor the lockstep check after the run (flow model
    only) would see one that does not: a pipeline hand-off over NVLink in one replica and over the NICs in
    another (stages not aligned to hosts) left the folded step up to 0.9% off the unfolded one (tp 2, pp 3,
    dp 4 on three DGX hosts). Every collective shape is compared, each size apart (the slowest transfer of a
    phase may change with the bytes), against one mirror per class of translates by whole periods of the
    fabric's spine hash, which route alike; a pipeline send/recv as `asymmetric_replicas` compares it on the
    flow model: it and its mirrors must all stay inside one NVLink domain or all leave it (`_domain_crossing`),
    and pairs that all cross the fabric are not compared further (one inside a leaf group in one replica and
    across the spines in another differs by a hop's latency: 0.570753 against 0.571753 ms for SC21 1T's
    hand-off, which unfolded that run into one of ~57.5 GiB). Where a collective's copies cross its links
    (`PlanCache.copies_meet`), each phase is timed with the load of that phase of all of them on its links, and
    such a hand-off across the fabric is compared with its mirrors over like hops (those over other hops are the
    hop refold's, `fold_policy.hop_refold`): the fabric's spine hash can put two copies on one uplink, so copies
    over like hops take unlike times there (tp 8, pp 3, dp 2 on six one-NIC DGX H100 hosts in leaf groups of two
    with oversubscription 8: 5.725 ms over GPUs [8, 16], 11.44 over [9, 17]), which no class by hops parts."""
    topology = plans.topology
    domains = np.asarray(topology.gpu_domain)
    for op in shapes.firsts:
        if not op.mirrors:
            continue
        meet = plans.copies_meet(op)
        fabric = False
        if op.op == "send_recv":
            verdict = _domain_crossing(domains, op)
            if verdict:
                return verdict
            fabric = not _inside_domains(domains, op)
            if fabric and not meet:
                continue
        compared = _class_firsts(plans, op)
        if fabric:
            own_hops = topology.hop_signature(op.group[0], op.group[-1])
            compared = [index for index in compared
                        if topology.hop_signature(op.mirrors[index][0], op.mirrors[index][-1]) == own_hops]
        loads = (_copy_loads(topology, capacity.size, [plans.phases(op, group) for group in (op.group, *op.copies)])
                 if meet else [])
        own_s = _analytic_seconds(topology, capacity, plans.phases(op, op.group), loads)
        for index in compared:
            mirror = op.mirrors[index]
            mirror_s = _analytic_seconds(topology, capacity, plans.phases(op, mirror), loads)
            if not math.isclose(mirror_s, own_s, rel_tol=SAME_TIME):
                own, mirror_takes = durations_apart(own_s, mirror_s)
                return (f"{op.op} {op.name!r} takes {own} over GPUs {list(op.group)} but "
                        f"{mirror_takes} over the equivalent {list(mirror)} on the analytic model: the "
                        f"replicas' routes differ in hops or bandwidth{COPIES_LOAD if meet else ''}")
    return ""


def _analytic_seconds(topology: Topology, capacity: np.ndarray, phases: Sequence[Phase],
                      loads: Sequence[np.ndarray] = ()) -> float:
    """How long ``phases`` take one after another on the analytic model: per phase, its slowest transfer's
    `analytic_seconds` on ``capacity``, each link shared by the phase's load over the collective's copies where
    ``loads`` gives it (`_copy_loads`), the numbers network/model.py `_run_analytic` reads off the same items."""
    total = 0.0
    for index, phase in enumerate(phases):
        if not phase.transfers:
            continue
        arrays = phase_arrays(topology, phase)
        seconds = analytic_seconds(FlowRoutes.of_matrix(arrays.routes), arrays.nbytes, arrays.latency, capacity,
                                   load=loads[index] if index < len(loads) else None)
        total += float(seconds.max())
    return total


def _copy_loads(topology: Topology, links: int, plans: Sequence[Sequence[Phase]]) -> list[np.ndarray]:
    """Per phase index, the bytes each of the ``links`` carries in that phase of all ``plans`` (a collective's
    over its group and over each of its copies that meet it, `simulation.copy_phases`)."""
    loads = [np.zeros(links) for _ in range(max(map(len, plans)))]
    for plan in plans:
        for index, phase in enumerate(plan):
            if phase.transfers:
                arrays = phase_arrays(topology, phase)
                on_route = arrays.routes >= 0
                loads[index] += np.bincount(arrays.routes[on_route], minlength=links,
                                            weights=np.broadcast_to(arrays.nbytes[:, None], on_route.shape)[on_route])
    return loads


def unequal_traffic(shapes: CollectiveShapes, plans: PlanCache) -> dict[int, np.ndarray]:
    """Per collective shape whose members send unlike amounts (a tree's inner ranks and leaves, a skewed
    all-to-all; by index into ``shapes.firsts``), two columns over the directed links: the bytes it puts on each
    over its group and all its mirrors, and the company its transfers keep there (`_link_loads`): the load that
    makes the ranks of a stage unlike one another, which an unfolded run has and a folded run's mirrors do not
    wait for."""
    link_kinds = link_kind_codes(plans.topology)
    return {shape: _link_loads(plans.topology, link_kinds, [phase for plan in plans.mirrored_phases(op, op.mirrors)
                                                            for phase in plan])
            for shape, op in enumerate(shapes.firsts)
            if op.op != "send_recv" and op.nbytes and plans.send_excess(op) is not None}


def _link_loads(topology: Topology, link_kinds: np.ndarray, phases: Sequence[Phase]) -> np.ndarray:
    """Per directed link (a row each), the bytes ``phases`` put on it and an id of the company its transfers keep
    there (0: none). The bytes: per link and transfer size, how many times transfers of that size cross it
    (their phases' repeats, summed as integers), then per link those sizes times their counts (each product
    rounded once), summed in order of size: not exact, but in a fixed order, so the sum depends only on what
    crosses the link, not on how the phases split it. A tree's chain inside a host carries the same chunks in
    every host, over phases of other lengths where the host's place in the tree differs, and summed phase by
    phase in float host 1's load came out three units in the last place above host 0's (60442214.40000005
    against ...03 bytes, SC21 3.6B's geometry under trees), which refused the fold. Each distinct transfer is
    routed once, with how many times its phases run it in all (a plan's chunks repeat its transfers phase after
    phase: the published 76.1B step's DP trees post 1,488 transfers, 216 distinct).
    The company: which transfers cross the link, each by its bytes, how many times and its route (each link's
    kind and these bytes on it), equal ids for alike company. Bytes alone do not tell links apart whose totals
    match but whose transfers run at other rates: EP 8 over two hosts of a leaf group, PXN on, met a DP tree over
    four hosts whose inner hosts' NICs carry twice a leaf host's bytes, over hosts 0-1 as over 2-3 (one inner
    host, one leaf), yet the tree's flow out of host 0 on rail 2 climbs a spine uplink three of its flows cross
    and host 3's one it crosses alone, so they drained at other times and the dispatch over hosts 2-3 ended
    8.393 us after that over hosts 0-1 (tests/test_fold_equivalence.py)."""
    times: dict[Transfer, int] = {}
    for phase in phases:
        for t in phase.transfers:
            times[t] = times.get(t, 0) + phase.repeat
    loads = np.zeros((len(topology.link_class), 2))
    if not times:
        return loads
    lengths, links = routed(topology, list(times))
    sizes, size_of = np.unique(np.array([t.nbytes for t in times], dtype=np.float64), return_inverse=True)
    repeats = np.fromiter(times.values(), dtype=np.int64, count=len(times))
    pairs, where = np.unique(links * len(sizes) + np.repeat(size_of, lengths), return_inverse=True)
    counts = np.bincount(where, weights=np.repeat(repeats, lengths), minlength=len(pairs))
    loads[:, 0] = np.bincount(pairs // len(sizes), weights=sizes[pairs % len(sizes)] * counts,
                              minlength=len(loads))
    routes = padded(lengths, links, len(loads))
    carried = np.append(loads[:, 0], -1.0)[routes].view(np.int64)
    rows = np.column_stack((size_of, repeats, np.append(link_kinds, -1)[routes], carried))
    _, kind_of = np.unique(rows, axis=0, return_inverse=True)
    pairs = np.unique(links * len(rows) + np.repeat(kind_of.reshape(-1), lengths))
    link_of = pairs // len(rows)
    starts = np.flatnonzero(np.diff(link_of, prepend=-1))
    ids: dict[bytes, int] = {}
    for first, last in zip(starts.tolist(), [*starts[1:].tolist(), len(pairs)]):
        loads[link_of[first], 1] = ids.setdefault((pairs[first:last] % len(rows)).tobytes(), len(ids) + 1)
    return loads


RouteTable = tuple[int, np.ndarray, np.ndarray]
"""A plan's transfers as arrays: how many phases; per transfer its phase's index and its bytes; and its route's
links, padded to the plan's longest route with the id one past the last link."""


def route_table(topology: Topology, phases: Sequence[Phase]) -> RouteTable:
    """``phases`` routed once, to read what they meet of several loads (`unequal_shapes`)."""
    transfers = [(index, t) for index, phase in enumerate(phases) for t in phase.transfers]
    lengths, links = routed(topology, [t for _, t in transfers])
    heads = np.array([(index, t.nbytes) for index, t in transfers], dtype=np.float64).reshape(-1, 2)
    return len(phases), heads, padded(lengths, links, len(topology.link_class))


def routed(topology: Topology, transfers: Sequence[Transfer]) -> tuple[np.ndarray, np.ndarray]:
    """``transfers`` routed once: each one's number of links, and the links of every route one after another, in
    the transfers' order."""
    paths = topology.paths(map(TRANSFER_ENDS, transfers))
    lengths = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
    return lengths, np.fromiter(chain.from_iterable(paths), dtype=np.int64, count=int(lengths.sum()))


def padded(lengths: np.ndarray, values: np.ndarray, fill: int) -> np.ndarray:
    """Per route (``lengths``: its number of links, as `routed` gives them), a row of ``values`` (one per link of
    the routes, in order), padded with ``fill`` to the longest route."""
    table = np.full((len(lengths), int(lengths.max(initial=0))), fill, dtype=np.int64)
    table[np.repeat(np.arange(len(lengths)), lengths),
          np.arange(values.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = values
    return table


def unequal_shapes(table: RouteTable, loads: np.ndarray) -> bytes:
    """What a plan (its `route_table`) meets of the unequal traffic ``loads`` (`unequal_traffic`: one load per
    link, or a column of loads per link, one per collective shape): per phase, per transfer its bytes and those
    loads on each link of its route, in route order (-1 past its end), the transfers sorted; as bytes, equal
    exactly when two plans meet the loads alike phase by phase, transfer for transfer in one matching for all
    the columns together, so that they then meet the sum of any of the columns alike too."""
    phases, heads, links = table
    columns = loads if loads.ndim == 2 else loads[:, None]
    met = np.vstack((columns, np.full((1, columns.shape[1]), -1.0)))[links]
    rows = np.hstack((heads, met.reshape(len(heads), -1)))
    return (np.array([phases, rows.shape[1]], dtype=np.int64).tobytes()
            + rows[np.lexsort(rows.T[::-1])].tobytes())


def overlapping(shapes: CollectiveShapes, order: ProgramOrder, among: Sequence[int]
                 ) -> Callable[[int], list[tuple[int, ...]]]:
    """For a shape (index into ``shapes.firsts``), which of ``among`` may overlap its instances: per distinct
    combination met by one of its instances, those of ``among`` with an instance that may overlap it (by the
    program's ``order``), in order, none empty. Each instance is judged on its own overlaps, not on every shape
    some other instance meets, which would refuse more than is needed. Where the program is too large to order,
    each instance is judged on the ordering of its first rank's ops alone (`_rank_overlapping`)."""
    ordering = order.ordering
    if ordering is None:
        return _rank_overlapping(shapes, order, among)
    nodes: dict[int, list[int]] = {}
    for op, shape in zip(shapes.ops, shapes.shape_of):
        nodes.setdefault(shape, []).append(ordering.node_of_key[op.key])
    arrays = {shape: np.unique(np.array(found, dtype=np.int64)) for shape, found in nodes.items()}
    instances = InstanceColumns(ordering, [Instances.of(ordering, arrays[other]) for other in among])
    others = np.array(among, dtype=np.int64)

    def combinations(shape: int) -> list[tuple[int, ...]]:
        met = instances.meet(arrays[shape])
        return [tuple(others[row].tolist()) for row in _distinct_rows(met) if row.any()]

    return combinations


def _rank_overlapping(shapes: CollectiveShapes, order: ProgramOrder, among: Sequence[int]
                      ) -> Callable[[int], list[tuple[int, ...]]]:
    """`overlapping` for a program too large to order: an instance is judged on the ordering of the ops of its
    first rank (`ProgramOrder.rank_ordering`), which knows less of what happens before what than the program's
    but nothing false (an op of the rank is part of its collective's node). Another shape's instance with an op
    on that rank may overlap it where that ordering says so; one without is taken to overlap it. Judging every
    pair to overlap instead refused refolds of hundreds of ranks whose collectives run one after another on each
    rank (a CP exchange and the skewed all-to-all of its own host, on the DeepSeek search's candidate)."""
    keys: dict[int, set[str]] = {}
    first_rank: dict[str, int] = {}
    on_rank: dict[tuple[int, int], set[str]] = {}
    for op, shape in zip(shapes.ops, shapes.shape_of):
        keys.setdefault(shape, set()).add(op.key)
        first_rank.setdefault(op.key, op.rank)
        on_rank.setdefault((shape, op.rank), set()).add(op.key)
    others = np.array(among, dtype=np.int64)
    placed: dict[tuple[int, int], Instances | None] = {}

    def instances_on(rank: int, other: int) -> Instances | None:
        """``other``'s instances on ``rank``'s ordering, None where some of them have no op on the rank: one of
        those is taken to overlap, which puts ``other`` in every combination whatever the rest meet (instances
        of one shape share its group, so in a built program they are all on the rank or none is)."""
        if (other, rank) not in placed:
            there = on_rank.get((other, rank), set())
            local = order.rank_ordering(rank)
            placed[other, rank] = (Instances.of(local, np.array([local.node_of_key[key] for key in sorted(there)],
                                                                dtype=np.int64))
                                   if len(there) == len(keys[other]) else None)
        return placed[other, rank]

    def met_on(rank: int, shape: int) -> np.ndarray:
        """Per instance of ``shape`` whose first rank is ``rank`` (in sorted key order), which of ``among`` may
        overlap it."""
        local = order.rank_ordering(rank)
        judged = sorted(key for key in keys[shape] if first_rank[key] == rank)
        nodes = np.array([local.node_of_key[key] for key in judged], dtype=np.int64)
        met = np.zeros((len(judged), len(among)), dtype=bool)
        for column, other in enumerate(among):
            instances = instances_on(rank, other)
            met[:, column] = True if instances is None else instances.meet(local, nodes)
        return met

    def combinations(shape: int) -> list[tuple[int, ...]]:
        ranks = sorted({first_rank[key] for key in keys[shape]})
        met = np.vstack([met_on(rank, shape) for rank in ranks])
        return [tuple(others[row].tolist()) for row in _distinct_rows(met) if row.any()]

    return combinations


def _distinct_rows(met: np.ndarray) -> np.ndarray:
    """The distinct rows of the boolean table ``met`` in `np.unique`'s order (lexicographic, False first): each
    row packed into bytes, first column in the highest bit, so that comparing the bytes compares the rows (a
    tenth of the time `np.unique(axis=0)` takes over one field per column); a False column after the last
    changes no comparison and gives a table without columns a byte to pack."""
    packed = np.packbits(np.hstack((met, np.zeros((len(met), 1), dtype=bool))), axis=1)
    width = packed.shape[1]
    distinct = np.unique(packed.view(f"V{width}").reshape(-1)).view(np.uint8).reshape(-1, width)
    return np.unpackbits(distinct, axis=1, count=met.shape[1]).astype(bool)


def unequally_met(shapes: CollectiveShapes, plans: PlanCache, order: ProgramOrder,
                  apart: frozenset[int] = frozenset()) -> str:
    """Why folding would not be exact because a collective's mirror meets the unequal traffic
    (`unequal_traffic`) of the collectives that may overlap it otherwise than the simulated copy does ('' when
    every one meets it alike), instance by instance (`overlapping`), each overlapping collective's load a
    column of its own (`unequal_shapes`): their sum can cancel (two trees whose inner ranks are mirror images
    load every lane alike), and met alike column by column, any sum of them is met alike, so overlaps guessed
    too widely (an unordered program's) refuse more, never pass more. Timing alone cannot excuse this: the
    mirror meets that traffic only in the step (tests/test_fold_equivalence.py: a tree all-reduce over TP lanes
    whose inner ranks' NVLink ports carry twice a leaf's TP tree bytes ends 20 us later on those lanes).
    Pipeline send/recvs are not compared (see `asymmetric_replicas`); each shape is compared with one mirror per
    class of translates where the loads move with the translates (`_moves_with_translates`), else with every
    mirror. Copies whose every member is in ``apart`` (ranks a fold by classes simulates each as itself: the hosts
    near links down or degraded) are left out, their first other copy compared with every other: such a copy
    stands for no other and is run with all its traffic (NVSwitch trays down in rack 0 of three: rack 0's TP
    groups meet the DP tree otherwise than rack 1's, yet folded by the hosts near the trays, 24 of 48 ranks, the
    step is the unfolded one's to 1e-12, its step time to the bit, 1 or 4 trays down)."""
    loads = unequal_traffic(shapes, plans)
    if not loads:
        return ""
    topology = plans.topology
    among = sorted(loads)
    columns_of = {other: [2 * column, 2 * column + 1] for column, other in enumerate(among)}
    every_load = np.column_stack([loads[other] for other in among])
    periodic = _moves_with_translates(plans, every_load)
    overlaps = overlapping(shapes, order, among)
    for shape, op in enumerate(shapes.firsts):
        if op.op == "send_recv" or not op.mirrors or not op.nbytes:
            continue
        combinations = overlaps(shape)
        if not combinations:
            continue
        folded = [copy for copy in (op.group, *op.mirrors) if not apart.issuperset(copy)]
        if len(folded) < 2:
            continue
        group, others = (folded[0], folded[1:]) if apart else (op.group, [
            op.mirrors[index] for index in (_class_firsts(plans, op) if periodic else range(len(op.mirrors)))])
        own = route_table(topology, plans.phases(op, group))
        mirrored = [(mirror, route_table(topology, plans.phases(op, mirror))) for mirror in others]
        crossed, (own, *tables) = _on_links_crossed([own, *(table for _, table in mirrored)], len(every_load))
        mirrors = list(zip((mirror for mirror, _ in mirrored), tables))
        crossed_loads = every_load[crossed]
        for met_by in combinations:
            met_loads = crossed_loads[:, [column for other in met_by for column in columns_of[other]]]
            met = unequal_shapes(own, met_loads)
            for mirror, table in mirrors:
                if unequal_shapes(table, met_loads) != met:
                    return (f"{op.op} {op.name!r} over GPUs {list(group)} meets the traffic of collectives "
                            f"whose members send unlike amounts (a tree's inner ranks and leaves) otherwise than "
                            f"over the equivalent {list(mirror)}: the ranks of a stage are not alike")
    return ""


def _moves_with_translates(plans: PlanCache, loads: np.ndarray) -> bool:
    """Whether ``loads`` (a row per directed link) move onto themselves under the translation by one period of
    the fabric's spine hash, where a link has an image (or the fabric has none): only then does a mirror
    translated by whole periods meet them as its class's first does (`_class_firsts`). A tree over the hosts
    of every leaf group loads its inner hosts and its leaves unlike, which no translation keeps."""
    periods = plans.translations()
    if periods is None:
        return True
    step = periods.links(1)
    has = step >= 0
    return bool(np.array_equal(loads[has], loads[step[has]]))


def _on_links_crossed(tables: Sequence[RouteTable], links: int) -> tuple[np.ndarray, list[RouteTable]]:
    """The links that ``tables`` cross (of ``links`` in all), in order, and the tables with each route's links
    renumbered as their places among them (padding as the place one past the last): `unequal_shapes` then reads
    the loads of those links alone, the same values it reads of every link's."""
    every = np.unique(np.concatenate([table[2].reshape(-1) for table in tables]))
    crossed = every[every < links]
    return crossed, [(phases, heads, np.searchsorted(crossed, route)) for phases, heads, route in tables]


def star_domains(topology: Topology) -> bool:
    """Whether the GPUs of an NVLink domain reach each other as through one switch: every route between two of
    them is the source's own link in, then the destination's own link out, all those links of one bandwidth,
    latency and class (an NVSwitch server, an NVL72 rack; on every channel NCCL may use, read on the first two).
    Groups inside such domains meet links alike wherever they lie in them, so `asymmetric_replicas` need not
    compare them. A PCIe server is no star: GPUs under one PCIe switch reach each other in two hops, GPUs
    under two in four, through the host bridge, so a CP pair or a hand-off inside one host takes another time
    than its mirror across the host's switches (cp 2, pp 4, dp 3 on four hosts of six GPUs, three per switch:
    the folded step came out 60 ns slow, unchecked). The first domain stands for the others (`fold_blocker`
    folds only hosts of one size, built alike)."""
    members = np.flatnonzero(np.asarray(topology.gpu_domain) == topology.gpu_domain[0])
    src, dst = (pair.reshape(-1) for pair in np.meshgrid(members, members, indexing="ij"))
    src, dst = src[src != dst], dst[src != dst]
    if not src.size:
        return True
    for channel in (0, 1):
        routes, _ = topology.routes(src, dst, np.full(src.size, channel, dtype=np.int64))
        if (routes[:, :2] < 0).any() or (routes[:, 2:] >= 0).any():
            return False
        ins, outs = routes[:, 0], routes[:, 1]
        if (len(np.unique(ins)) != members.size or len(np.unique(outs)) != members.size
                or len(np.unique(np.column_stack((src, ins)), axis=0)) != members.size
                or len(np.unique(np.column_stack((dst, outs)), axis=0)) != members.size):
            return False
        links = np.concatenate((ins, outs))
        kinds = {(topology.link_bandwidth[link], topology.link_latency[link], topology.link_class[link])
                 for link in np.unique(links).tolist()}
        if len(kinds) > 1:
            return False
    return True


def _inside_domains(domains: np.ndarray, op: CollectiveOp) -> bool:
    """Whether ``op``'s group and each of its mirrors lie inside one NVLink domain (``domains``: each GPU's)."""
    placed = domains[np.array((op.group, *op.mirrors), dtype=np.int64)]
    return bool((placed == placed[:, :1]).all())


class UnalignedHandOff(str):
    """Why a fold is not exact where the blocker is a pipeline hand-off that stays inside one NVLink domain in one
    replica and leaves it in another (`_domain_crossing`): a verdict typed so that `fold_policy.fold_verdict` tells
    it from any other collective's by its type: a blocker of its own, which neither network model folds (the
    analytic one times the NVLink hop and the NIC hop apart too), so that the refusal of a step too large unfolded
    offers layouts that align the stages instead (simulator/stage_remedies.py)."""


def _domain_crossing(domains: np.ndarray, op: CollectiveOp) -> str:
    """Why ``op`` (a send/recv) and its mirrors are not alike in staying inside one NVLink domain ('' when all
    stay inside or all leave it): a hand-off over NVLink and its image over the NICs take unlike times."""
    placed = domains[np.array((op.group, *op.mirrors), dtype=np.int64)]
    inside = placed[:, 0] == placed[:, 1]
    if inside.all() or not inside.any():
        return ""
    unlike = list(op.mirrors[int(np.argmax(inside[1:] != inside[0]))])
    where = "stays inside" if inside[0] else "leaves"
    return UnalignedHandOff(
        f"{op.op} {op.name!r} over GPUs {list(op.group)} {where} one NVLink domain but its mirror over {unlike} does "
        "not: stages not aligned to NVLink domains hand on over NVLink in one replica and over the NICs in another")


def _mirror_verdict(plans: PlanCache, op: CollectiveOp, phases: list[Phase], reference: tuple[bytes, ...],
                    capacity: np.ndarray, link_kinds: np.ndarray) -> str:
    """Why ``op``'s mirrors do not take the time its group takes ('' when they do): each class of translates
    compared by route shapes with the group's (``reference``), and timed alone where they differ."""
    topology = plans.topology
    compared = _class_firsts(plans, op)
    mirror_phases = [plans.phases(op, op.mirrors[index]) for index in compared]
    timings: dict[tuple, float] = {}
    for batch in _mirror_batches(phases, mirror_phases):
        shapes_of = route_shapes(topology, [phase for index in batch for phase in mirror_phases[index]],
                                 link_kinds)
        done = 0
        for index in batch:
            mirrored = mirror_phases[index]
            mirror_shapes = tuple(shapes_of[done:done + len(mirrored)])
            done += len(mirrored)
            if mirror_shapes == reference or mirror_shapes in timings:
                continue
            if not timings:
                timings[reference] = alone_s = run_isolated(topology, capacity, phases).duration_s
            mirror_s = timings[mirror_shapes] = run_isolated(topology, capacity, mirrored).duration_s
            if not math.isclose(mirror_s, alone_s, rel_tol=SAME_TIME):
                own, mirror_takes = durations_apart(alone_s, mirror_s)
                return (f"{op.op} {op.name!r} takes {own} over GPUs {list(op.group)} but "
                        f"{mirror_takes} over the equivalent {list(op.mirrors[compared[index]])}: "
                        "their flows share the fabric's links unevenly (each flow hashed onto a spine by its "
                        "ends)")
    return ""


class _Translates:
    """The groups whose mirrors were found to take their group's time, by class of translates: a group and
    its mirrors moved together by whole periods of an exact translation (topology/periods.py: every link maps
    onto a link alike, and the spine hash moves routes with their ends) meet links alike transfer for transfer,
    so a later group of a known class whose mirrors are the same translates of the known group's, and over
    which the known op's plan has the known group's route shapes (the plan moved with the group), needs no
    comparison of its own (whatever its size: a group is compared once per algorithm)."""

    def __init__(self, plans: PlanCache, link_kinds: np.ndarray):
        periods = plans.translations()
        self.periods = periods if periods is not None and periods.exact else None
        self.plans = plans
        self.link_kinds = link_kinds
        self._known: dict[tuple, tuple[CollectiveOp, tuple[bytes, ...], np.ndarray]] = {}

    def _class(self, op: CollectiveOp, algorithm: str) -> tuple[tuple, np.ndarray] | None:
        """The class key of ``op``'s group (its translate in the first periods) and its mirrors moved as far."""
        if self.periods is None:
            return None
        first, shift = self.periods.split(np.array([op.group], dtype=np.int64))
        moved = np.array(op.mirrors, dtype=np.int64) - int(shift[0]) * self.periods.period
        return (op.op, op.root, algorithm, tuple(first[0].tolist())), moved

    def known(self, op: CollectiveOp, algorithm: str) -> bool:
        """Whether ``op``'s group (planned with ``algorithm``) is a translate of a known group, mirrors and all."""
        found = self._class(op, algorithm)
        if found is None or found[0] not in self._known:
            return False
        known, reference, mirrors = self._known[found[0]]
        plans = self.plans
        return (np.array_equal(mirrors, found[1]) and plans.resolved_algorithm(known, op.group) == algorithm
                and tuple(route_shapes(plans.topology, plans.phases(known, op.group), self.link_kinds)) == reference)

    def add(self, op: CollectiveOp, algorithm: str, reference: tuple[bytes, ...]) -> None:
        """``op``'s group, whose route shapes are ``reference``, takes the time its mirrors take (never an empty
        plan: `asymmetric_replicas` passes over ops that send nothing)."""
        found = self._class(op, algorithm)
        if found is not None:
            self._known.setdefault(found[0], (op, reference, found[1]))
