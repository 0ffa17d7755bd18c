"""Which collectives can meet on a link: prune folded mirrors that never share a link with simulated traffic,
and find the collectives whose links nothing else uses, so the engine can time them once and replay them. The
verdict is a `Sharing` kept beside the program: the program's ops are never changed.

Both are exact under the flow model: a flow's rate depends only on the flows it shares links with, so a mirror
whose links (and those of everything it touches) are disjoint from the simulated ranks' traffic cannot change
any simulated time, and a collective alone on its links always takes the same time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from simulator.engine.groups import GroupIds
from simulator.program.ops import CollectiveOp, Op

LinkSet = Callable[[CollectiveOp, tuple[int, ...]], frozenset[int]]
"""(op, group) -> the directed links its plan over ``group`` uses (for the op's size: `auto` may choose
differently for small and large messages, so every distinct size of a group is asked)."""


Mirrors = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Sharing:
    """The sharing analysis of one run: the mirrors each collective op keeps after pruning (by op id; an op
    without mirrors is absent) and the ids of the collective ops that run alone on their links."""

    mirrors: Mapping[int, Mirrors] = field(default_factory=dict)
    private: frozenset[int] = frozenset()

    def mirrors_of(self, op: CollectiveOp) -> Mirrors:
        return self.mirrors.get(op.id, ())


def kept_mirrors(ops: Sequence[Op], links_of: LinkSet) -> dict[int, Mirrors]:
    """The mirrors of each collective op connected, through shared links, to the traffic of the simulated
    ranks (by op id, for the ops that have mirrors). The search runs over distinct link sets (the same mirror
    at several sizes, or an all-gather and a reduce-scatter over one group, use the same links): a third of
    the mirrors' links at 8,192 GPUs."""
    collectives = [op for op in ops if isinstance(op, CollectiveOp)]
    if not any(op.mirrors for op in collectives):
        return {}
    group_ids = GroupIds()
    reached: set[int] = set()
    candidates: dict[tuple, tuple[CollectiveOp, tuple[int, ...]]] = {}
    seen: set[tuple] = set()
    for op in collectives:
        shape = (op.op, op.algorithm, op.root, op.nbytes, group_ids.id(op.group))
        if shape in seen:
            continue
        seen.add(shape)
        reached |= links_of(op, op.group)
        for mirror in op.mirrors:
            candidates.setdefault((op.op, op.algorithm, op.root, op.nbytes, mirror), (op, mirror))
    holders: dict[frozenset[int], list[tuple]] = {}
    for key, (op, mirror) in candidates.items():
        holders.setdefault(links_of(op, mirror), []).append(key)
    by_link: dict[int, list[frozenset[int]]] = {}
    for links in holders:
        for link in links:
            by_link.setdefault(link, []).append(links)
    kept_links: set[frozenset[int]] = set()
    frontier = list(reached)
    while frontier:
        for links in by_link.get(frontier.pop(), ()):
            if links not in kept_links:
                kept_links.add(links)
                fresh = links - reached
                reached |= fresh
                frontier.extend(fresh)
    kept = {key for links in kept_links for key in holders[links]}
    pruned: dict[tuple, Mirrors] = {}
    kept_by_op: dict[int, Mirrors] = {}
    for op in collectives:
        if op.mirrors:
            shape = (op.op, op.algorithm, op.root, op.nbytes, group_ids.id(op.group))
            mirrors = pruned.get(shape)
            if mirrors is None:
                mirrors = pruned[shape] = tuple(m for m in op.mirrors if shape[:4] + (m,) in kept)
            kept_by_op[op.id] = mirrors
    return kept_by_op


def _no_other_group(_op: CollectiveOp, _group: tuple[int, ...]) -> frozenset[int]:
    """Links stand-in when a run has a single group and no mirrors: nothing else can share its links, so
    every link set may be taken as empty (routing every transfer only to learn that would cost O(flows))."""
    return frozenset()


def private_collectives(ops: Sequence[Op], links_of: LinkSet, async_streams: frozenset[str],
                        mirrors: Mapping[int, Mirrors]) -> frozenset[int]:
    """Ids of the collective ops (with their kept ``mirrors``) whose links no other group's traffic uses and
    whose instances never overlap (every member issues them from one in-order stream), so each one runs alone
    on its links."""
    collectives = [op for op in ops if isinstance(op, CollectiveOp)]
    op_mirrors = [mirrors.get(op.id, ()) for op in collectives]
    group_ids = GroupIds()
    op_group = [group_ids.id(op.group) for op in collectives]
    if len(set(op_group)) == 1 and not any(op_mirrors):
        links_of = _no_other_group
    streams: dict[int, set[tuple[int, str]]] = {}
    group_links: dict[int, set[int]] = {}
    seen: set[tuple] = set()
    shapes_seen: set[tuple] = set()
    for op, gid, kept in zip(collectives, op_group, op_mirrors):
        streams.setdefault(gid, set()).add((op.rank, op.stream))
        op_shape = (op.op, op.algorithm, op.root, op.nbytes, gid, id(kept))
        if op_shape in shapes_seen:
            continue
        shapes_seen.add(op_shape)
        for group in (op.group, *kept):
            member = group_ids.id(group)
            shape = (op.op, op.algorithm, op.root, op.nbytes, member)
            if shape not in seen:
                seen.add(shape)
                group_links.setdefault(member, set()).update(links_of(op, group))
    link_groups: dict[int, set[int]] = {}
    for gid, links in group_links.items():
        for link in links:
            link_groups.setdefault(link, set()).add(gid)
    verdicts: dict[int, bool] = {}
    private = []
    for op, gid, kept in zip(collectives, op_group, op_mirrors):
        verdict = verdicts.get(gid)
        if verdict is None:
            names = {stream for _, stream in streams[gid]}
            alone = all(len(link_groups[link]) == 1 for link in group_links[gid])
            verdict = verdicts[gid] = alone and len(names) == 1 and not names & async_streams
        if verdict and not kept:
            private.append(op.id)
    return frozenset(private)
