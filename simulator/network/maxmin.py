"""Max-min fair rates of flows over capacitated links, by progressive filling with numpy.

Every unfrozen flow grows at the same rate until some link runs out of capacity; the flows crossing that
link are frozen at the current level and the rest keep growing. Flows with the same set of links always end
at the same rate, so they are solved once as a group whose weight is the number of its members. A round
visits only the links still loaded and the link crossings of the links that saturate and the groups that
freeze, so a solve costs O(link crossings + rounds x links) however many distinct bottleneck levels it has
(an all-to-all whose flows the fabric hashes unevenly over the spines has dozens).
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

    Each group's links must be distinct.
    """
    lengths = np.fromiter(map(len, group_paths), dtype=np.int64, count=len(group_paths))
    entry_link = np.fromiter(chain.from_iterable(group_paths), dtype=np.int64, count=int(lengths.sum()))
    return flat_grouped_max_min_rates(lengths, entry_link, weight, capacity)


def flat_grouped_max_min_rates(lengths: np.ndarray, entry_link: np.ndarray, weight: np.ndarray,
                               capacity: np.ndarray) -> np.ndarray:
    """`grouped_max_min_rates` with the groups' links flat: group g's are the next ``lengths[g]`` of
    ``entry_link``."""
    return Incidence.of(lengths, entry_link).rates(weight, capacity)


class Incidence:
    """Groups and the links they cross, indexed both ways: ``entry_link`` lists each group's links one group
    after another (compact link ids, ``links`` their ids in the capacity array), ``group_start`` where each
    group's begin, ``by_link`` the entries sorted by link and ``link_start`` where each link's begin, these two
    made on first use (among solves, only the index-range rounds of one past `DENSE_ENTRIES` crossings read
    them, and the subsets cut from one that has them; a phase's route index in `network/isolated.py` reads
    them whatever its size, to search and to drop shadowed links). The entries are sorted stably, so in one
    order whatever the algorithm: by numpy's radix sort where the compact ids fit in 16 bits (a tenth of a
    comparison sort's cost on an unfolded all-to-all's thousands of groups, which every end of its flows solves
    again). Built once, it solves any weights over the same groups (a phase's routes, `network/isolated.py`)."""

    __slots__ = ("_by_link", "_link_start", "entry_group", "entry_link", "group_start", "lengths", "links")

    def __init__(self, lengths: np.ndarray, entry_link: np.ndarray, links: np.ndarray,
                 by_link: np.ndarray | None = None):
        self.lengths = lengths
        self.entry_link = entry_link
        self.links = links
        self.entry_group = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
        self.group_start = np.concatenate(([0], np.cumsum(lengths)))
        self._by_link = by_link
        self._link_start: np.ndarray | None = None

    @property
    def by_link(self) -> np.ndarray:
        """The entries sorted stably by link."""
        if self._by_link is None:
            entry_link = self.entry_link
            self._by_link = np.argsort(entry_link.astype(np.uint16) if self.links.size <= 1 << 16 else entry_link,
                                       kind="stable")
        return self._by_link

    @property
    def link_start(self) -> np.ndarray:
        """Where each link's entries begin in `by_link`, and past the last, where they end."""
        if self._link_start is None:
            counts = np.bincount(self.entry_link, minlength=self.links.size)
            self._link_start = np.concatenate(([0], np.cumsum(counts)))
        return self._link_start

    def groups_on(self, links: np.ndarray) -> np.ndarray:
        """The groups crossing each of ``links`` (compact ids), link after link (a group once per link)."""
        link_start = self.link_start
        return self.entry_group[self.by_link[spans(link_start[links], link_start[links + 1])]]

    def entries_of(self, groups: np.ndarray) -> np.ndarray:
        """The entries (indices into ``entry_link``) of ``groups``, group after group."""
        return spans(self.group_start[groups], self.group_start[groups + 1])

    def subset(self, kept: np.ndarray) -> Incidence:
        """The incidence of the groups where the mask ``kept`` is true, in their order, over the same links (those
        no kept group crosses stay, unloaded: a solve never reads them): the entries sorted by link are these
        less the dropped ones, so no sort is needed; they are cut only where this incidence has them and the
        subset has more than `DENSE_ENTRIES` crossings (a smaller solve never reads them). A solve over it gives
        the rates a fresh `of` gives, to the bit, as a solve's arithmetic does not depend on how its links are
        numbered."""
        kept_entry = kept[self.entry_group]
        entry_link = self.entry_link[kept_entry]
        by_link = None
        if self._by_link is not None and entry_link.size > DENSE_ENTRIES:
            renumbered = np.cumsum(kept_entry) - 1
            by_link = renumbered[self._by_link[kept_entry[self._by_link]]]
        return Incidence(self.lengths[kept], entry_link, self.links, by_link)

    def reached(self, seeds: np.ndarray, active: np.ndarray) -> np.ndarray:
        """Which groups (a mask) the links of the groups ``seeds`` reach through ``active`` groups (a mask): the
        active groups on those links, then on the links those cross, and so on, a level at a time over every
        entry at once, until a level adds none or every active group is reached."""
        entry_group, entry_link = self.entry_group, self.entry_link
        link_reached = np.zeros(self.links.size, dtype=bool)
        link_reached[entry_link[self.entries_of(seeds)]] = True
        group_reached = np.zeros(self.lengths.size, dtype=bool)
        unreached = int(np.count_nonzero(active))
        while unreached:  # once every active group is reached, no level can add one
            hit = np.zeros(self.lengths.size, dtype=bool)
            hit[entry_group[link_reached[entry_link]]] = True
            fresh = hit & active & ~group_reached
            found = int(np.count_nonzero(fresh))
            if not found:
                break
            unreached -= found
            group_reached |= fresh
            if unreached:
                link_reached[entry_link[fresh[entry_group]]] = True
        return group_reached

    @classmethod
    def of(cls, lengths: np.ndarray, entry_link: np.ndarray) -> Incidence:
        """The incidence of groups whose links (ids into the capacity array) are flat in ``entry_link``: the
        links crossed are numbered in order of their ids, found by `distinct` (so a small component costs its
        own size, not the cluster's link count) and looked up in a table over the id range whose only slots
        written or read are the crossed links'."""
        bound = int(entry_link.max()) + 1 if entry_link.size else 0
        links = distinct(entry_link, bound)
        compact = np.empty(bound, dtype=np.int64)
        compact[links] = np.arange(links.size)
        return cls(np.asarray(lengths, dtype=np.int64), compact[entry_link], links)

    def rates(self, weight: np.ndarray, capacity: np.ndarray) -> np.ndarray:
        """Max-min fair rate of each member of each group, ``weight[g]`` flows in group ``g`` (0: the group is
        left out, and its rate is not one), ``capacity`` in bytes/s by link id; a group that crosses no link
        gets ``inf``."""
        rates = _progressive_fill(self, np.asarray(weight, dtype=float), np.asarray(capacity, dtype=float)[self.links])
        rates[self.lengths == 0] = np.inf
        return rates


def distinct(values: np.ndarray, bound: int) -> np.ndarray:
    """The distinct ``values`` (integers in ``range(bound)``), sorted: by marking them where they are many, else
    by a sort (numpy's hashing `unique` costs more either way)."""
    if 16 * values.size > bound:
        marked = np.zeros(bound, dtype=bool)
        marked[values] = True
        return np.flatnonzero(marked)
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if ordered.size else ordered


def spans(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The indices of the ranges ``starts[i]:stops[i]``, one range after another."""
    sizes = stops - starts
    ends = np.cumsum(sizes)
    return np.repeat(starts - (ends - sizes), sizes) + np.arange(int(ends[-1]) if ends.size else 0)


DENSE_ENTRIES = 4096
"""Largest solve (link crossings) whose rounds take masks over all its crossings rather than index ranges of the
saturated links and freezing groups: a round of an all-to-all's component of a few hundred groups is then a
dozen numpy calls, not some forty; past it, the ranges' cost in the touched entries alone wins."""


def _progressive_fill(incidence: Incidence, weight: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Progressive filling: each round, the fair share of each link still loaded is its remaining capacity over
    the weight of the unfrozen groups on it; the groups on the links at the smallest share (within a relative
    `TIE_TOLERANCE`) freeze at it, and their weight and usage leave their links. Past `DENSE_ENTRIES` crossings
    only the entries of the links that saturate and of the groups that freeze are visited, each once, and only
    the links those groups cross change share, so a solve costs O(entries + rounds x links) with a small
    constant on the links (a minimum and a comparison); at or below it each round masks every crossing and
    recomputes every link's share from whole arrays (O(rounds x entries), a dozen numpy calls a round: a link
    no frozen group leaves keeps its remaining capacity and load, so its share is the one it had, to the bit).
    Where weights are whole flow counts (every caller in the engine) loads are exact in floating point, so they
    equal a recount of the unfrozen entries each round to the last bit. The round that freezes the last groups
    ends the solve; a link left with load but no unfrozen group (fractional weights' rounding) leaves the search
    instead of looping. A round where no link saturates (the lowest share is NaN) raises `ValueError` rather
    than loop."""
    entry_group, entry_link = incidence.entry_group, incidence.entry_link
    entry_weight = weight[entry_group]
    load = np.bincount(entry_link, weights=entry_weight, minlength=capacity.size)
    remaining = capacity.copy()
    rate = np.zeros(weight.size)
    frozen = (weight <= 0) | (incidence.lengths == 0)
    unfrozen = weight.size - int(np.count_nonzero(frozen))
    dense = entry_link.size <= DENSE_ENTRIES
    with np.errstate(divide="ignore", invalid="ignore"):  # entered once: it costs as much as a round's update
        share = np.where(load > 0, np.maximum(remaining, 0.0) / load, np.inf)
        while unfrozen:
            level = share.min()
            saturated = share <= level * (1.0 + TIE_TOLERANCE)
            if dense:
                crossed = np.zeros(weight.size, dtype=bool)
                crossed[entry_group[saturated[entry_link]]] = True
                crossed &= ~frozen
                freezing = crossed.nonzero()[0]  # under 1 us a call on ~180 groups, about a third of np.flatnonzero's
            else:
                crossing = incidence.groups_on(np.flatnonzero(saturated))
                freezing = distinct(crossing[~frozen[crossing]], weight.size)
            if not freezing.size:  # only frozen groups left there: a residue of fractional weights' subtractions
                if not saturated.any():
                    raise ValueError(_unsolvable(level, incidence, weight, capacity))
                share[saturated] = np.inf
                load[saturated] = 0.0  # no unfrozen group on them: their share stays inf when every share is recomputed
                continue
            rate[freezing] = level
            unfrozen -= freezing.size
            if not unfrozen:
                break
            frozen[freezing] = True
            if dense:
                entries = crossed[entry_group]
                leaving = np.bincount(entry_link[entries], weights=entry_weight[entries], minlength=capacity.size)
                remaining -= level * leaving
                load -= leaving
                share = np.where(load > 0, np.maximum(remaining, 0.0) / load, np.inf)
                continue
            entries = incidence.entries_of(freezing)
            freed = entry_link[entries]
            touched = distinct(freed, capacity.size)
            leaving = np.bincount(freed, weights=entry_weight[entries], minlength=capacity.size)[touched]
            remaining[touched] -= level * leaving
            load[touched] -= leaving
            share[touched] = np.inf
            kept = touched[load[touched] > 0]
            share[kept] = np.maximum(remaining[kept], 0.0) / load[kept]
    return rate


def _unsolvable(level: float, incidence: Incidence, weight: np.ndarray, capacity: np.ndarray) -> str:
    """Why a round saturated no link: the capacities (by link id) and weights (by group) that are NaN, infinite
    or negative, any of which can make the lowest fair share NaN."""
    causes = [f"capacity of link id {int(incidence.links[i])} is {capacity[i]}" for i in _improper(capacity)]
    causes += [f"weight of group {g} is {weight[g]}" for g in _improper(weight)]
    return (f"max-min fill: no link saturates at the lowest fair share ({level} bytes/s): "
            f"{'; '.join(causes[:5]) or 'a share went NaN'} (allowed: finite, non-negative capacities and weights)")


def _improper(values: np.ndarray) -> list[int]:
    """Positions of the NaN, infinite or negative ``values``."""
    return np.flatnonzero(~(np.isfinite(values) & (values >= 0))).tolist()
