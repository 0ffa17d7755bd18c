"""Rank folding: which ranks get a program, and every folded replica's copy of a collective's group.

Ranks of one pipeline stage run the same program at the same times when nothing breaks the symmetry, so one
representative per stage is simulated. Its collectives keep their real groups and carry mirrors, the same
group shifted onto every equivalent rank, so links shared between replicas see all of their traffic
(engine/sharing.py then drops the mirrors that can never meet simulated traffic).
"""

from __future__ import annotations

import numpy as np

from simulator.parallel.layout import Layout


def representatives(layout: Layout, fold: bool) -> list[int]:
    """The ranks that get a program: all of them, or with folding the first rank of each pipeline stage."""
    if fold:
        return [layout.rank_of(pp=stage) for stage in range(layout.pp)]
    return list(range(layout.world))


def mirror_images(layout: Layout, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every equivalent rank's copy of ``group`` other than the group itself, first occurrence kept: the TP,
    CP and DP coordinates of its members shifted (cyclically) by the offset from the group's first member to
    that rank, pipeline coordinates kept. Computed for all equivalent ranks at once with numpy (a coordinate
    ``c`` shifted by ``s`` read off the table ``moved[s, c]`` of each dimension); an image is known again by
    its sorted members' bytes (a dict lookup per rank, not np.unique's sort of whole rows). Only the ranks at
    coordinate 0 of each dimension whose shift maps the group onto itself (a TP group's tp) are shifted onto:
    the others repeat an image of a lower rank (rank order is the order of first occurrence)."""
    members = np.array(group, dtype=np.int64)
    first = group[0]
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
    keys = np.ascontiguousarray(np.sort(images, axis=1)).view(np.dtype((np.void, images.itemsize * len(group))))
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
