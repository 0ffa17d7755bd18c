"""Rank folding: which ranks get a program, and every folded replica's copy of a collective's group.

Ranks of one pipeline stage run the same program at the same times when nothing breaks the symmetry, so one
representative per stage is simulated. Its collectives keep their real groups and carry mirrors, the groups
the equivalent ranks run the same collective in, so links shared between replicas see all of their traffic
(engine/sharing.py then drops the mirrors that can never meet simulated traffic). A group of whole dimensions
moves with cyclic shifts of the coordinates; a slice of the DP x CP group (an HSDP shard group, a block of
consecutive members; its replica group, every k-th member; an EP or expert-DP group) does not, since a shift
carries a block across two blocks: its images are the other slices of the same kind.

Where the ranks of a stage are not all alike (a ring that runs one way round through every other host: the
classing rule is engine/rank_classes.py), folding simulates one representative per class and stage
(`RankClasses`), and each group carries as mirrors only the images that its class stands for (`class_images`).
Classes of unequal size (refolds by hand-off route) weigh each representative by its class's size in the
summary's per-GPU means (`rank_weights`).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from simulator.parallel.layout import Layout


@dataclass(frozen=True)
class RankClasses:
    """The classes of ranks that folding simulates apart: ``of_position[i]`` is the class of the i-th rank of
    every pipeline stage (`Layout.stage_ranks` order, the same TP, CP and DP coordinates in every stage),
    classes numbered in order of their first position. Each class's first rank of each stage is its
    representative there; the other ranks of the class mirror it."""

    of_position: tuple[int, ...]

    @cached_property
    def firsts(self) -> tuple[int, ...]:
        """Each class's first position, in class order."""
        return tuple(self.of_position.index(number) for number in range(max(self.of_position) + 1))

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        """How many positions each class holds, in class order: how many ranks of its stage its representative
        stands for."""
        return tuple(np.bincount(np.array(self.of_position)).tolist())

    @property
    def equal(self) -> bool:
        """Whether every class holds as many positions (each representative then weighs the same in a mean)."""
        return len(set(self.sizes)) == 1

    @staticmethod
    def keyed(keys: Sequence[Hashable], unequal: bool = False) -> RankClasses | None:
        """The classes of positions with equal ``keys``, numbered in order of first position; None where they are
        one class, or of unequal sizes unless ``unequal`` allows them (the summary's per-GPU figures then weigh
        each representative by its class's size, `rank_weights`)."""
        numbers: dict[Hashable, int] = {}
        classes = RankClasses(tuple(numbers.setdefault(key, len(numbers)) for key in keys))
        return None if len(numbers) == 1 or not (unequal or classes.equal) else classes

    def meet(self, other: RankClasses) -> RankClasses | None:
        """The coarsest classes finer than both these and ``other`` (positions alike in both, the intersections
        of their classes), of any sizes."""
        return RankClasses.keyed(list(zip(self.of_position, other.of_position)), unequal=True)


def lane_classes(layout: Layout) -> RankClasses:
    """One class per context-parallel lane: a stage-folded run times one rank per stage, so a pipeline hand-off
    ends when the slowest of its lanes' flows does; where the lanes' hand-offs cross the spines on uplinks of
    unlike load (the published long-context row), each lane goes on at its own end, its compute slowed by its own
    hand-off's SMs, until a collective gathers the lanes. Classed by lane, each lane's representative (rail 0,
    replica 0) is timed under its own hand-offs and SM holds, and only the TP rails and DP replicas, whose
    hand-offs hash alike, are folded onto it."""
    return RankClasses(tuple(cp_lanes(layout)[np.array(layout.stage_ranks(0), dtype=np.int64)].tolist()))


def cp_lanes(layout: Layout) -> np.ndarray:
    """Each rank's context-parallel lane (its CP coordinate)."""
    return (np.arange(layout.world) // layout.stride("cp")) % layout.cp


def representatives(layout: Layout, fold: bool, classes: RankClasses | None = None) -> list[int]:
    """The ranks that get a program: all of them, or with folding the first rank of each pipeline stage, or of
    each class in each stage (``classes``), stage by stage."""
    if not fold:
        return list(range(layout.world))
    if classes is None:
        return [layout.rank_of(pp=stage) for stage in range(layout.pp)]
    return [ranks[position] for stage in range(layout.pp) for ranks in [layout.stage_ranks(stage)]
            for position in classes.firsts]


def rank_weights(layout: Layout, classes: RankClasses | None) -> dict[int, int] | None:
    """How many ranks each representative under ``classes`` stands for (its class's size: a rank of every pipeline
    stage each), the weights of the per-GPU means of a run folded by them; None where every representative stands
    for as many (one per stage, or classes of equal size), whose plain mean over the simulated ranks is the
    unfolded run's."""
    if classes is None or classes.equal:
        return None
    return dict(zip(representatives(layout, True, classes), classes.sizes * layout.pp))


def ranks_stood_for(ranks: Collection[int], weights: Mapping[int, int] | None) -> int:
    """How many GPUs the simulated ``ranks`` stand for: one each, or where a fold by classes of unequal size
    weighs them (`rank_weights`), their weights' sum; what the per-GPU means divide by."""
    return len(ranks) if weights is None else sum(weights[rank] for rank in ranks)


def _stage_positions(layout: Layout, ranks: np.ndarray) -> np.ndarray:
    """Each of ``ranks``' position in its pipeline stage (its index in `Layout.stage_ranks`)."""
    stride = layout.stride("pp")
    return ranks // (stride * layout.pp) * stride + ranks % stride


def _at_position(layout: Layout, ranks: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The ranks at ``positions`` in the pipeline stages of ``ranks`` (`_stage_positions` inverted)."""
    stride = layout.stride("pp")
    stages = ranks // stride % layout.pp
    return positions // stride * stride * layout.pp + stages * stride + positions % stride


def class_images(layout: Layout, classes: RankClasses, group: tuple[int, ...],
                 images: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """The images of ``group`` (all of its folded copies, as `mirror_images` gives them) that its simulated
    members stand for under ``classes``: those with no representative in them whose first member's class has
    its representative (in that member's stage) in ``group``, so that each image is mirrored by exactly one
    simulated group."""
    if not images:
        return images
    orbit = (group, *images)
    owner = np.full(layout.world, -1, dtype=np.int64)
    owner[np.concatenate([np.array(image, dtype=np.int64) for image in orbit])] = np.repeat(
        np.arange(len(orbit)), [len(image) for image in orbit])
    firsts = np.array([min(image) for image in images], dtype=np.int64)
    of_position = np.array(classes.of_position, dtype=np.int64)
    class_firsts = np.array(classes.firsts, dtype=np.int64)
    standing_for = owner[_at_position(layout, firsts, class_firsts[of_position[_stage_positions(layout, firsts)]])]
    if (standing_for < 0).any():
        raise ValueError(f"internal error: a class representative lies in none of the copies of group "
                         f"{list(group)}, so its folded replicas cannot be classed")
    simulated = np.zeros(layout.world, dtype=bool)
    simulated[np.array(representatives(layout, True, classes), dtype=np.int64)] = True
    return tuple(image for image, own in zip(images, (standing_for == 0).tolist())
                 if own and not simulated[np.array(image, dtype=np.int64)].any())


def unlike_images(layout: Layout, classes: RankClasses, group: tuple[int, ...],
                  images: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Per image of ``group``, whether its ranks span other classes than the group's (classes by stage position,
    `_stage_positions`; a class held more or fewer times, or at other places, is alike). A folded collective starts
    every copy when its simulated members are ready and releases them all when the last copy ends
    (collectives/execute.py `run_plans`), so a mirror is its unfolded copy exactly where that copy would start
    with its group: where its ranks' classes are the group's, the last of them is ready when the group's last is.
    An image of another class than any of the group's, or lacking one of them, holds ranks that the unfolded run
    may ready at other times, which the lockstep check, comparing the copies' ends, cannot see. Vectorised over the
    images: O(their ranks)."""
    if not images:
        return np.zeros(0, dtype=bool)
    own = np.unique(classes_of(layout, classes, group))
    theirs = classes_of(layout, classes, images)
    slot = np.full(len(classes.sizes), -1, dtype=np.int64)
    slot[own] = np.arange(own.size)
    at = slot[theirs]
    held = np.zeros((len(images), own.size), dtype=bool)
    rows = np.broadcast_to(np.arange(len(images))[:, None], at.shape)
    held[rows[at >= 0], at[at >= 0]] = True
    return np.asarray((at < 0).any(axis=1) | ~held.all(axis=1))


def unheld_representative(layout: Layout, classes: RankClasses, groups: Sequence[tuple[int, ...]]
                          ) -> tuple[int, int, int] | None:
    """The first member of ``groups`` whose class's representative in its stage is not in its group, as (the
    group's index, the member, the representative); None where every member's is. A folded collective starts when
    its simulated members are ready and does not wait for a member with no op on the simulated ranks
    (program/ops.py), so it times such a member as its representative only where that representative is in the
    group. Vectorised over the groups: O(their ranks)."""
    if not groups:
        return None
    members = np.concatenate([np.array(group, dtype=np.int64) for group in groups])
    index = np.repeat(np.arange(len(groups)), [len(group) for group in groups])
    of_position = np.array(classes.of_position, dtype=np.int64)
    heads = np.array(classes.firsts, dtype=np.int64)[of_position[_stage_positions(layout, members)]]
    chosen = _at_position(layout, members, heads)
    outside = np.flatnonzero(~np.isin(index * layout.world + chosen, index * layout.world + members))
    if not outside.size:
        return None
    first = int(outside[0])
    return int(index[first]), int(members[first]), int(chosen[first])


def classes_of(layout: Layout, classes: RankClasses, ranks: Sequence[int] | Sequence[Sequence[int]]) -> np.ndarray:
    """The class of each of ``ranks`` (any shape) under ``classes``: its stage position's."""
    return np.asarray(classes.of_position, dtype=np.int64)[_stage_positions(layout, np.asarray(ranks, dtype=np.int64))]


def class_copies(layout: Layout, classes: RankClasses, orbit: Sequence[tuple[int, ...]]
                 ) -> list[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]]:
    """Per representative under ``classes`` that ``orbit`` (every copy of one collective: a group and its mirrors
    in the run folded by stage) reaches, its copy and its class-mates' other copies, where it has such: a run
    folded by ``classes`` times each mate as its representative, whether the mate's copy is a mirror there or
    the group of another class's representative (a CP pair inside a host for one rank of a class and across
    hosts for another), so every one of them must take the representative's copy's time."""
    holder = np.full(layout.world, -1, dtype=np.int64)
    for index, copy in enumerate(orbit):
        holder[np.array(copy, dtype=np.int64)] = index
    of_position = np.array(classes.of_position, dtype=np.int64)
    found = []
    for rank in representatives(layout, True, classes):
        own = int(holder[rank])
        positions = np.flatnonzero(of_position == of_position[_stage_positions(layout, np.array([rank]))[0]])
        held = np.unique(holder[_at_position(layout, np.full(positions.size, rank), positions)])
        mates = tuple(orbit[index] for index in held.tolist() if index not in (own, -1))
        if own >= 0 and mates:
            found.append((orbit[own], mates))
    return found


def mirror_images(layout: Layout, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every equivalent rank's copy of ``group`` other than the group itself, first occurrence kept: a slice of
    the DP x CP group as `_slice_images` lists them, any other group shifted (`_shifted_images`)."""
    members = np.array(group, dtype=np.int64)
    kind = _slice_kind(layout, members)
    if kind is not None:
        return _slice_images(layout, members, *kind)
    return _shifted_images(layout, members)


def _slice_images(layout: Layout, members: np.ndarray, size: int, strided: bool) -> tuple[tuple[int, ...], ...]:
    """The other slices of the kind of ``members`` in the DP x CP groups of their pipeline stage: blocks of
    ``size`` consecutive members, or with ``strided`` every (n / ``size``)-th member. Every rank of the stage
    lies in one of them, so they are the equivalent ranks' copies; listed in rank order of first occurrence
    (by lowest member), members in rank order."""
    combined = np.array(layout.combined_group(("dp", "cp"), int(members[0])), dtype=np.int64)
    offsets = combined - combined[0]
    parts = offsets.reshape(size, -1).T if strided else offsets.reshape(-1, size)
    stage = np.array(layout.stage_ranks(layout.coords(int(members[0]))["pp"]), dtype=np.int64)
    at_origin = np.ones(len(stage), dtype=bool)
    for dim in ("dp", "cp"):
        at_origin &= (stage // layout.stride(dim)) % layout.degree(dim) == 0
    images = (stage[at_origin][:, None, None] + parts[None]).reshape(-1, size)
    images = images[np.argsort(images[:, 0], kind="stable")]
    own = tuple(np.sort(members).tolist())
    return tuple(image for image in map(tuple, images.tolist()) if image != own)


def _slice_kind(layout: Layout, members: np.ndarray) -> tuple[int, bool] | None:
    """(size, strided) when ``members`` are a slice of their DP x CP group that cyclic shifts would misplace: a
    block of consecutive members at a multiple of its size, or every k-th member from one of the first k; None
    for any other group, a cyclic shift of which is an equivalent rank's group (its DP and CP coordinates each
    all equal or mapped onto themselves by a shift along their dimension). Any other subset of the DP x CP
    group has no known images: an error in the program builder."""
    if all(_constant_along(layout, members, dim) or _shifts_onto_itself(layout, members, dim) for dim in ("dp", "cp")):
        return None
    combined = layout.combined_group(("dp", "cp"), int(members[0]))
    ordered = tuple(np.sort(members).tolist())
    size, step = len(ordered), len(combined) // len(ordered)
    if ordered[0] in combined and size * step == len(combined):
        start = combined.index(ordered[0])
        if start % size == 0 and combined[start:start + size] == ordered:
            return size, False
        if start < step and combined[start::step] == ordered:
            return size, True
    raise ValueError(f"internal error: group {list(ordered)} is neither whole dimensions nor a block or stride "
                     "slice of its DP x CP group, so its folded replicas are unknown (the program builder makes "
                     "only such groups; the step's checks refuse HSDP layouts that would need others)")


def _shifted_images(layout: Layout, members: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """Every equivalent rank's copy of the group ``members`` other than the group itself, first occurrence
    kept: the TP, CP and DP coordinates of its members shifted (cyclically) by the offset from the group's
    first member to that rank, pipeline coordinates kept. Computed for all equivalent ranks at once with numpy
    (a coordinate ``c`` shifted by ``s`` read off the table ``moved[s, c]`` of each dimension); an image is
    known again by its sorted members' bytes (a dict lookup per rank, not np.unique's sort of whole rows). Only
    the ranks at coordinate 0 of each dimension whose shift maps the group onto itself (a TP group's tp) are
    shifted onto: the others repeat an image of a lower rank (rank order is the order of first occurrence)."""
    first = int(members[0])
    equivalents = np.array(layout.stage_ranks(layout.coords(first)["pp"]), dtype=np.int64)
    for dim in layout.order:
        if dim != "pp" and _shifts_onto_itself(layout, members, dim):
            equivalents = equivalents[(equivalents // layout.stride(dim)) % layout.degree(dim) == 0]
    images = np.zeros((len(equivalents), len(members)), dtype=np.int64)
    for dim in layout.order:
        degree, stride = layout.degree(dim), layout.stride(dim)
        own = (members // stride) % degree
        if dim == "pp":
            images += own * stride
            continue
        shift = (equivalents // stride - first // stride) % degree
        moved = (np.arange(degree)[:, None] + np.arange(degree)) % degree * stride
        images += moved[shift[:, None], own]
    keys = np.ascontiguousarray(np.sort(images, axis=1)).view(np.dtype((np.void, images.itemsize * len(members))))
    first_rows: dict[object, int] = {}
    for index, key in enumerate(keys.ravel().tolist()):
        first_rows.setdefault(key, index)
    first_rows.pop(np.sort(members).tobytes(), None)
    return tuple(map(tuple, images[list(first_rows.values())].tolist()))


def _shifts_onto_itself(layout: Layout, members: np.ndarray, dim: str) -> bool:
    """Whether moving every member one step along ``dim`` (cyclically) gives the same set of ranks, so that
    every shift along ``dim`` does (a degree of 1 trivially)."""
    degree, stride = layout.degree(dim), layout.stride(dim)
    own = (members // stride) % degree
    moved = members + ((own + 1) % degree - own) * stride
    return set(moved.tolist()) == set(members.tolist())


def _constant_along(layout: Layout, members: np.ndarray, dim: str) -> bool:
    """Whether every member has the same coordinate along ``dim``."""
    return len(set(((members // layout.stride(dim)) % layout.degree(dim)).tolist())) == 1
