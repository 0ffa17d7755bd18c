"""Which collectives can meet on a link: prune folded mirrors that never share a link with simulated traffic,
and find the collectives whose links nothing else uses, so the engine can time them once and replay them. The
verdict is a `Sharing` kept beside the program: the program's ops are never changed.

Both are exact under the flow model: a flow's rate depends only on the flows it shares links with, so a mirror
whose links (and those of everything it touches) are disjoint from the simulated ranks' traffic cannot change
any simulated time, and a collective alone on its links always takes the same time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from simulator.engine.ordering import Ordering, ProgramOrder
from simulator.engine.plans import LinkTable, PlanCache
from simulator.engine.shapes import CollectiveShapes
from simulator.program.ops import CollectiveOp, Op

LinkSet = Callable[[CollectiveOp, tuple[int, ...]], frozenset[int]]
"""(op, group) -> the directed links its plan over ``group`` uses (for the op's size: `auto` may choose
differently for small and large messages, so every distinct size of a group is asked)."""


Mirrors = tuple[tuple[int, ...], ...]

MirrorLinks = Callable[[CollectiveOp, Mirrors], frozenset[int]]
"""(op, mirrors) -> the directed links its plans over all of ``mirrors`` use together."""

TimedApart = Callable[[CollectiveOp, Mirrors], bool]
"""(op, mirrors) -> whether a plan over one of ``mirrors`` may take another time in the run than the op's own
alone (engine/lockstep.py `copies_apart`)."""


@dataclass(frozen=True)
class Sharing:
    """The sharing analysis of one run: the mirrors each collective op keeps after pruning (by op id; an op
    without mirrors is absent) and the ids of the collective ops that run alone on their links."""

    mirrors: Mapping[int, Mirrors] = field(default_factory=dict)
    private: frozenset[int] = frozenset()

    def mirrors_of(self, op: CollectiveOp) -> Mirrors:
        return self.mirrors.get(op.id, ())


def kept_mirrors(ops: Sequence[Op], plans: PlanCache, shapes: CollectiveShapes | None = None) -> dict[int, Mirrors]:
    """The mirrors of each collective op connected, through shared links, to the traffic of the simulated
    ranks (by op id, for the ops that have mirrors). The search runs over the distinct tables of mirror link
    sets (`PlanCache.link_table`: the same mirrors at several sizes, or an all-gather and a reduce-scatter
    over one group, share one). ``shapes``: the index of ``ops``' collectives, when the caller has it."""
    shapes = shapes or CollectiveShapes.of(ops)
    if not any(op.mirrors for op in shapes.firsts):
        return {}
    reached: set[int] = set()
    tables: dict[int, LinkTable] = {}
    found: dict[tuple, int] = {}
    firsts: list[tuple[CollectiveOp, LinkTable | None]] = []
    of_shape: list[int] = []
    for op, gid in zip(shapes.firsts, shapes.group_of_shape):
        shape = (op.op, op.algorithm, op.root, op.nbytes, gid, op.protocol)
        index = found.get(shape)
        if index is None:
            index = found[shape] = len(firsts)
            reached |= plans.links(op, op.group)
            table = plans.link_table(op, op.mirrors) if op.mirrors else None
            if table is not None:
                tables.setdefault(id(table), table)
            firsts.append((op, table))
        of_shape.append(index)
    order = list(tables.values())
    starts = np.cumsum([0] + [len(table.sizes) for table in order])
    taken = _connected_sets(np.concatenate([table.sizes for table in order]),
                            np.concatenate([table.links for table in order]), reached)
    kept_of = {id(table): taken[start:end].tolist() for table, start, end in zip(order, starts, starts[1:])}
    interned: dict[Mirrors, Mirrors] = {}
    pruned: list[Mirrors] = []
    for op, table in firsts:
        mirrors = tuple(m for m, keep in zip(op.mirrors, kept_of[id(table)]) if keep) if table is not None else ()
        pruned.append(interned.setdefault(mirrors, mirrors))
    kept = [pruned[index] for index in of_shape]
    return {op.id: kept[shape] for op, shape in zip(shapes.ops, shapes.shape_of) if op.mirrors}


def _connected_sets(sizes: np.ndarray, links: np.ndarray, reached: set[int]) -> np.ndarray:
    """Whether each link set (``sizes[i]`` links each, laid end to end in ``links``) is joined to the
    ``reached`` links through chains of shared links: a breadth-first sweep over arrays, each round taking
    every set that holds a newly reached link (found by bisection in the sets' links sorted by link) and
    reaching the links of those sets not reached yet."""
    starts = np.concatenate(([0], np.cumsum(sizes)))
    by_link = np.argsort(links, kind="stable")
    sorted_links, holder = links[by_link], np.repeat(np.arange(len(sizes)), sizes)[by_link]
    frontier = np.array(sorted(reached), dtype=np.int64)
    is_reached = np.zeros(max(int(links.max(initial=-1)), int(frontier.max(initial=-1))) + 1, dtype=bool)
    is_reached[frontier] = True
    taken = np.zeros(len(sizes), dtype=bool)
    while frontier.size:
        hit = holder[_spans(np.searchsorted(sorted_links, frontier, side="left"),
                            np.searchsorted(sorted_links, frontier, side="right"))]
        hit = np.unique(hit[~taken[hit]])
        taken[hit] = True
        fresh = links[_spans(starts[hit], starts[hit + 1])]
        frontier = np.unique(fresh[~is_reached[fresh]])
        is_reached[frontier] = True
    return taken


def _spans(lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """The indices of the ranges [low, high) laid end to end."""
    lengths = highs - lows
    return np.arange(int(lengths.sum())) + np.repeat(lows - (np.cumsum(lengths) - lengths), lengths)


def _one_group(_op: CollectiveOp, _group: tuple[int, ...]) -> frozenset[int]:
    """Links stand-in when a run has a single group and no mirrors: its instances may meet each other on the
    members' links and nothing else can meet them, so one common link stands for all (routing every transfer
    only to learn that would cost O(flows)); instances on two streams that may overlap are then not private."""
    return frozenset({0})


def private_collectives(ops: Sequence[Op], links_of: LinkSet, async_streams: frozenset[str],
                        mirrors: Mapping[int, Mirrors], mirror_links: MirrorLinks | None = None,
                        shapes: CollectiveShapes | None = None, order: ProgramOrder | None = None,
                        timed_apart: TimedApart | None = None) -> frozenset[int]:
    """Ids of the collective ops whose instance runs alone on its links: no instance of other traffic that may
    overlap it in time (engine/ordering.py) uses a link of its own or of its kept ``mirrors``, and its mirrors
    do not share its own links. Such an instance's time is its time on an idle network, and its mirrors, on
    links nothing running meanwhile uses, change no simulated time: the engine times it once per shape and
    replays it without them. ``mirror_links`` gives the links of an op's kept mirrors together (default: the
    union of ``links_of`` over them); ``shapes`` is the index of ``ops``' collectives and ``order`` the ordering
    of ``ops`` with ``async_streams`` (shared with the fold symmetry check), when the caller has them.
    Replaying without the mirrors is exact only where each mirror takes the op's time alone, as the fold
    symmetry check makes sure for every collective but pipeline hand-offs, and beside the other mirrors: an op
    whose kept mirrors ``timed_apart`` flags (a hand-off whose mirror crosses the spines where it stays in a
    leaf group, or mirrors that share a link with one another) is never private, so it ends when its slowest
    copy does, as it does where other traffic may overlap it, and the lockstep check compares its copies."""
    shapes = shapes or CollectiveShapes.of(ops)
    if not shapes.ops:
        return frozenset()
    group_of_shape = shapes.group_of_shape
    if not mirrors and len(set(group_of_shape)) == 1:
        links_of = _one_group
    shape_of: dict[str, tuple] = {}
    streams: dict[int, set[str]] = {}
    member: dict[int, int] = {}
    footprints: dict[tuple, tuple[frozenset[int], frozenset[int]]] = {}
    apart: set[tuple] = set()
    made: dict[tuple[int, int], tuple] = {}
    """Each shape by its index in ``shapes`` (which fixes every field of it but the mirrors) and its mirrors'
    identity: made and hashed once, not once per op."""
    for op, index in zip(shapes.ops, shapes.shape_of):
        kept = mirrors.get(op.id, ())
        gid = group_of_shape[index]
        shape = made.get((index, id(kept)))
        if shape is None:
            shape = made[index, id(kept)] = (op.op, op.algorithm, op.root, op.nbytes, gid, id(kept), op.protocol)
            if shape not in footprints:
                mirrored = (mirror_links(op, kept) if mirror_links is not None
                            else frozenset().union(*(links_of(op, mirror) for mirror in kept)))
                footprints[shape] = (links_of(op, op.group), mirrored)
                if kept and timed_apart is not None and timed_apart(op, kept):
                    apart.add(shape)
        shape_of.setdefault(op.key, shape)
        streams.setdefault(gid, set()).add(op.stream)
        member.setdefault(gid, op.rank)
    shapes_on: dict[int, dict[tuple, None]] = {}
    for shape, (own, mirrored) in footprints.items():
        for link in own | mirrored:
            shapes_on.setdefault(link, {})[shape] = None
    private = _private_instances(order or ProgramOrder(ops, async_streams), shape_of, streams, footprints, shapes_on,
                                 member)
    if apart:
        private = {key for key in private if shape_of[key] not in apart}
    return frozenset(op.id for op in shapes.ops if op.key in private)


def _private_instances(order: ProgramOrder, shape_of: dict[str, tuple], streams: dict[int, set[str]],
                       footprints: dict[tuple, tuple[frozenset[int], frozenset[int]]],
                       shapes_on: dict[int, dict[tuple, None]], member: dict[int, int]) -> set[str]:
    """Keys of the instances that no other instance sharing their links may overlap. A group alone on its
    links whose instances all come from one in-order stream (``streams``, by group id) qualifies without asking
    the ordering; an instance whose own links carry some of its mirrors never does (its time depends on them).
    The others are decided a shape at a time: all its instances against each conflicting shape's, as arrays.
    Where the program is too large to order, a group alone on its links whose instances run on several streams
    (the TP collectives beside sequence parallelism's re-gathers) is decided on the ordering of the ops of one
    of its ranks (``member``, by group id), which knows less of what happens before what than the program's."""
    groups_on = {link: {shape[4] for shape in on} for link, on in shapes_on.items()}
    alone_on_links = {shape for shape, (own, mirrored) in footprints.items()
                      if not mirrored and all(len(groups_on[link]) == 1 for link in own)}
    conflicts = partial(_conflicting, footprints, shapes_on)
    serial = {shape for shape in alone_on_links
              if len(streams[shape[4]]) == 1 and not streams[shape[4]] & order.async_streams}
    private = {key for key, shape in shape_of.items() if shape in serial}
    if len(private) == len(shape_of):
        return private
    keys: dict[tuple, list[str]] = {}
    for key, shape in shape_of.items():
        keys.setdefault(shape, []).append(key)
    undecided = [shape for shape in keys if shape not in serial and not footprints[shape][0] & footprints[shape][1]]
    ordering = order.ordering
    if ordering is not None:
        return private | _alone(ordering, keys, undecided, conflicts)
    of_group: dict[int, dict[tuple, list[str]]] = {}
    for shape, shape_keys in keys.items():
        of_group.setdefault(shape[4], {})[shape] = shape_keys
    for group, shapes in _by_group(shape for shape in undecided if shape in alone_on_links).items():
        local = order.rank_ordering(member[group])
        group_keys = of_group[group]
        if all(key in local.node_of_key for shape_keys in group_keys.values() for key in shape_keys):
            private |= _alone(local, group_keys, shapes, conflicts)
    return private


def _by_group(shapes: Iterable[tuple]) -> dict[int, list[tuple]]:
    """``shapes`` by their group's id."""
    found: dict[int, list[tuple]] = {}
    for shape in shapes:
        found.setdefault(shape[4], []).append(shape)
    return found


def _conflicting(footprints: dict[tuple, tuple[frozenset[int], frozenset[int]]],
                 shapes_on: dict[int, dict[tuple, None]], shape: tuple) -> Iterator[tuple]:
    """The shapes with a link in common with ``shape``'s own or mirrored links (``shape`` among them), each
    once, as they are asked for: a search that stops at the first conflict never gathers the rest (in a
    parameter-server step every push shares a server NIC with thousands of others)."""
    seen: set[tuple] = set()
    own, mirrored = footprints[shape]
    for link in sorted(own | mirrored):
        for other in shapes_on[link]:
            if other not in seen:
                seen.add(other)
                yield other


def _alone(ordering: Ordering, keys: dict[tuple, list[str]], undecided: Iterable[tuple],
           conflicts: Callable[[tuple], Iterable[tuple]]) -> set[str]:
    """Keys of the instances of the ``undecided`` shapes that no instance of a conflicting shape (``keys``:
    the instances of every shape concerned) may overlap by ``ordering``. A shape's search stops once every
    instance of it has met one, so its cost is the shapes it asks, not all those it shares a link with."""
    nodes = {shape: np.array([ordering.node_of_key[key] for key in shape_keys], dtype=np.int64)
             for shape, shape_keys in keys.items()}
    by_place: dict[tuple, Instances] = {}
    found: set[str] = set()
    for shape in undecided:
        alone = np.arange(len(keys[shape]))
        for other in conflicts(shape):
            placed = by_place.get(other)
            if placed is None:
                placed = by_place[other] = Instances.of(ordering, nodes[other])
            alone = alone[~placed.meet(ordering, nodes[shape][alone])]
            if not alone.size:
                break
        found.update(keys[shape][index] for index in alone)
    return found


@dataclass(frozen=True)
class Instances:
    """A shape's instances: on each in-order component their positions and nodes, in order, and those with no
    place (asynchronous)."""

    placed: dict[int, tuple[np.ndarray, np.ndarray]]
    floating: np.ndarray

    @staticmethod
    def of(ordering: Ordering, nodes: np.ndarray) -> Instances:
        components, positions = ordering.first_component[nodes], ordering.first_position[nodes]
        order = np.lexsort((positions, components))
        components, positions, nodes = components[order], positions[order], nodes[order]
        bounds = np.flatnonzero(components[1:] != components[:-1]) + 1
        groups = zip(np.split(components, bounds), np.split(positions, bounds), np.split(nodes, bounds))
        placed = {int(on[0]): (at, members) for on, at, members in groups if on[0] >= 0}
        return Instances(placed, nodes[components < 0])

    def meet(self, ordering: Ordering, nodes: np.ndarray) -> np.ndarray:
        """For each of ``nodes``, whether one of these instances other than itself may overlap it. On one
        component the instances that happen before a node form a prefix and those after it a suffix, so only
        the first one not before it needs checking (a node's own position is its latest on its component,
        so the bisection passes it)."""
        met = np.zeros(len(nodes), dtype=bool)
        for component, (positions, members) in self.placed.items():
            index = np.searchsorted(positions, ordering.clocks[nodes, component], side="right")
            inside = np.flatnonzero(index < len(members))
            met[inside] |= ~ordering.before_each(nodes[inside], members[index[inside]])
        if len(self.floating):
            met |= ordering.any_concurrent(nodes, self.floating)
        return met


class InstanceColumns:
    """Several shapes' `Instances` (one column each), each in-order component's placements of them all laid end
    to end in column order, so that `meet` asks of every column at once what `Instances.meet` asks of one: one
    bisection and one `Ordering.before_each` per component instead of one per column and component (the fold
    check asks it of every collective shape against each of up to dozens of shapes)."""

    def __init__(self, ordering: Ordering, columns: Sequence[Instances]):
        self.ordering = ordering
        self.count = len(columns)
        self.floating = [(column, found.floating) for column, found in enumerate(columns) if len(found.floating)]
        by_component: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
        for column, found in enumerate(columns):
            for component, (positions, members) in found.placed.items():
                by_component.setdefault(component, []).append((column, positions.astype(np.int64), members))
        self.stride = max([int(ordering.clocks.max(initial=-1))]
                          + [int(positions[-1]) for parts in by_component.values() for _, positions, _ in parts]) + 2
        """More than any clock or position: a column's keys (column * stride + position) lie below the next's."""
        self.components: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for component, parts in by_component.items():
            present = np.array([column for column, _, _ in parts], dtype=np.int64)
            keys = np.concatenate([column * self.stride + positions for column, positions, _ in parts])
            ends = np.cumsum([len(members) for _, _, members in parts])
            members = np.concatenate([members for _, _, members in parts])
            self.components.append((component, present, keys, ends, members))

    def meet(self, nodes: np.ndarray) -> np.ndarray:
        """For each of ``nodes`` (a row) and each column, whether one of the column's instances other than the
        node itself may overlap it: `Instances.meet` of every column, side by side."""
        ordering = self.ordering
        met = np.zeros((len(nodes), self.count), dtype=bool)
        for component, present, keys, ends, members in self.components:
            clocks = ordering.clocks[nodes, component].astype(np.int64)
            index = np.searchsorted(keys, present * self.stride + clocks[:, None], side="right")
            rows, places = np.nonzero(index < ends)
            found = index[rows, places]
            overlap = ~ordering.before_each(nodes[rows], members[found])
            met[rows[overlap], present[places[overlap]]] = True
        for column, floating in self.floating:
            met[:, column] |= ordering.any_concurrent(nodes, floating)
        return met
