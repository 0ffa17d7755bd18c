"""Max-min fair rates of flows over capacitated links, by progressive filling with numpy.

Every unfrozen flow grows at the same rate until some link runs out of capacity; the flows crossing that
link are frozen at the current level and the rest keep growing. Flows with the same set of links always end
at the same rate, so they are solved once as a group whose weight is the number of its members. One round
costs O(links + unfrozen link crossings) through ``np.bincount``; the number of rounds is the number of
distinct bottleneck levels, which is small for the symmetric traffic of collectives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain

import numpy as np

TIE_TOLERANCE = 1e-12
"""Links whose fair share is within this relative distance of the lowest one saturate in the same round."""


def max_min_rates(paths: Sequence[Iterable[int]], capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each flow, given each flow's link ids and every link's capacity (bytes/s).

    A flow that crosses no link has no limit and gets ``inf``.
    """
    group_of_path: dict[tuple[int, ...], int] = {}
    flow_group = np.empty(len(paths), dtype=np.int64)
    for flow, path in enumerate(paths):
        key = tuple(sorted(set(path)))
        group = group_of_path.get(key)
        if group is None:
            group = group_of_path[key] = len(group_of_path)
        flow_group[flow] = group
    group_paths = list(group_of_path)
    weight = np.bincount(flow_group, minlength=len(group_paths)).astype(float)
    return grouped_max_min_rates(group_paths, weight, capacity)[flow_group]


def grouped_max_min_rates(group_paths: Sequence[Sequence[int]], weight: np.ndarray,
                          capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each member of each group; ``weight[g]`` flows share group ``g``'s links.

    Each group's links must be distinct. This is the form the network model calls directly once it has
    grouped its active flows by route.
    """
    lengths = np.fromiter((len(p) for p in group_paths), dtype=np.int64, count=len(group_paths))
    entry_link = np.fromiter(chain.from_iterable(group_paths), dtype=np.int64, count=int(lengths.sum()))
    return flat_grouped_max_min_rates(lengths, entry_link, weight, capacity)


def flat_grouped_max_min_rates(lengths: np.ndarray, entry_link: np.ndarray, weight: np.ndarray,
                               capacity: np.ndarray) -> np.ndarray:
    """`grouped_max_min_rates` with the groups' links flat: group g's are the next ``lengths[g]`` of
    ``entry_link``."""
    entry_group = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    links, entry_link = np.unique(entry_link, return_inverse=True)
    rates = _progressive_fill(entry_link.reshape(-1), entry_group, np.asarray(weight, dtype=float),
                              np.asarray(capacity, dtype=float)[links])
    rates[lengths == 0] = np.inf
    return rates


def _progressive_fill(entry_link: np.ndarray, entry_group: np.ndarray, weight: np.ndarray,
                      capacity: np.ndarray) -> np.ndarray:
    """Progressive filling on a link-group incidence list (compact link ids 0..len(capacity)-1).

    Each round drops the links no unfrozen group crosses any more, so later rounds only touch live links.
    """
    rate = np.zeros(weight.size)
    frozen = np.zeros(weight.size, dtype=bool)
    remaining = capacity.copy()
    entry_weight = weight[entry_group]
    while entry_link.size:
        load = np.bincount(entry_link, weights=entry_weight, minlength=remaining.size)
        loaded = load > 0
        if not loaded.all():
            live = np.flatnonzero(loaded)
            relabel = np.zeros(remaining.size, dtype=np.int64)
            relabel[live] = np.arange(live.size)
            entry_link, remaining, load = relabel[entry_link], remaining[live], load[live]
        share = np.maximum(remaining, 0.0) / load
        level = share.min()
        saturated = share <= level * (1.0 + TIE_TOLERANCE)
        freezing = entry_group[saturated[entry_link]]
        frozen[freezing] = True
        rate[freezing] = level
        leaving = frozen[entry_group]
        remaining -= level * np.bincount(entry_link[leaving], weights=entry_weight[leaving], minlength=remaining.size)
        staying = ~leaving
        entry_link, entry_group, entry_weight = entry_link[staying], entry_group[staying], entry_weight[staying]
    return rate
