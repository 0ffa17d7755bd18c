"""Per-link utilisation over time, from the flow rows of a run: what trace.json shows as counter tracks.

Each flow is taken at its mean rate (bytes over its lifetime, latency included) on every directed link of its
route; the run is cut into `BINS` equal time bins and each bin holds the bytes that crossed the link in it,
divided by what the link's line rate could carry in that time. A bin is therefore exact in bytes per flow
lifetime, not in instantaneous rate: where max-min sharing changed a flow's rate mid-way, the bytes are spread
evenly over its life, and a bin that then holds more than the line rate passes the excess on to the next
(`within_line_rate`). The links shown are those the simulated ranks' flows use (folded mirror ranks add their
traffic to those links but not links of their own), at most `MAX_LINKS` of them, the busiest first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.metrics.events import FlowRoutes

BINS = 1000
"""Time bins over the run: enough to see each pipeline phase of a step, few enough to keep the trace small."""
MAX_LINKS = 256
"""Links with a counter track at most; the busiest by bytes carried are kept."""


@dataclass(frozen=True)
class LinkLoad:
    """Utilisation of ``links`` (directed link ids) in time bins starting at ``edges_s[:-1]``:
    ``utilisation[i, k]`` is the fraction of link ``links[i]``'s line rate used in bin ``k``."""

    links: tuple[int, ...]
    edges_s: np.ndarray
    utilisation: np.ndarray


def link_load(start_s: np.ndarray, end_s: np.ndarray, nbytes: np.ndarray, src: np.ndarray,
              routes: FlowRoutes, line_rate: np.ndarray, shown_ranks: set[int],
              makespan_s: float) -> LinkLoad:
    """Binned utilisation of the links on the routes of flows sent by ``shown_ranks``; the flow arrays and
    ``routes`` are aligned (one entry per flow), ``line_rate`` is bytes/s per directed link. A flow that stands
    for its orbit under a replica quotient (``routes.for_orbit``) loads its links' orbits: it is binned on the
    orbit representatives, and a link shows its own flows' load plus its representative's."""
    empty = LinkLoad((), np.array([0.0, makespan_s]), np.zeros((0, 1)))
    if not len(routes) or makespan_s <= 0:
        return empty
    link_ids = routes.links
    flow_of = np.repeat(np.arange(len(routes)), routes.lengths)
    shown = np.isin(src[flow_of], np.fromiter(shown_ranks, dtype=np.int64, count=len(shown_ranks)))
    candidates = np.unique(link_ids[shown])
    if candidates.size == 0:
        return empty
    keys, shares = load_keys(routes, flow_of, line_rate.size)
    carried = np.bincount(keys, weights=nbytes[flow_of], minlength=2 * line_rate.size)
    carried = carried[candidates] + carried[shares(candidates)]
    busiest = np.lexsort((candidates, -carried))[:MAX_LINKS]
    links = np.sort(candidates[busiest])
    needed = np.unique(np.concatenate((links, shares(links))))
    position = np.full(2 * line_rate.size, -1, dtype=np.int64)
    position[needed] = np.arange(needed.size)
    per_key = _binned(start_s, end_s, nbytes, position[keys], flow_of, needed.size, makespan_s)
    per_bin = per_key[position[links]] + per_key[position[shares(links)]]
    utilisation = within_line_rate(per_bin / (makespan_s / BINS * line_rate[links][:, None]))
    return LinkLoad(tuple(links.tolist()), np.linspace(0.0, makespan_s, BINS + 1), utilisation)


def within_line_rate(utilisation: np.ndarray) -> np.ndarray:
    """``utilisation`` (links x bins) with what a bin holds above the line rate carried into the next bins, and
    what is left at the end into the last bins below it, backwards: flows taken at their mean rate overstate a
    link where a flow that shared it at first ran faster later (Mixtral's dense and expert parameter gathers
    starting together showed an InfiniBand link at 133%), and the link carried those bytes later. Each link's
    bytes are kept: a bin never shows more than the line rate."""
    spread = utilisation.copy()
    carry = np.zeros(len(spread))
    for column in range(spread.shape[1]):
        total = spread[:, column] + carry
        spread[:, column] = np.minimum(total, 1.0)
        carry = total - spread[:, column]
    for column in range(spread.shape[1] - 1, -1, -1):
        if not carry.any():
            break
        room = np.minimum(1.0 - spread[:, column], carry)
        spread[:, column] += room
        carry -= room
    return spread


def load_keys(routes: FlowRoutes, flow_of: np.ndarray, count: int):
    """The key each (flow, link) pair loads: the link itself, or ``count`` + its orbit representative for a
    flow standing for its orbit; and the function giving each link's orbit key (``count`` + the link when there
    is no quotient: a key no pair loads, so it adds nothing)."""
    if routes.representative is None or routes.for_orbit is None:
        return routes.links, lambda links: count + links
    representative = routes.representative
    keys = np.where(routes.for_orbit[flow_of], count + representative[routes.links], routes.links)
    return keys, lambda links: count + representative[links]


def _binned(start_s: np.ndarray, end_s: np.ndarray, nbytes: np.ndarray, row_of_pair: np.ndarray,
            flow_of: np.ndarray, rows: int, makespan_s: float) -> np.ndarray:
    """Bytes per row and time bin (``rows`` x `BINS`) of the (flow, link) pairs whose row is not -1, each flow
    spread evenly over its lifetime."""
    keep = row_of_pair >= 0
    row, flow = row_of_pair[keep], flow_of[keep]
    starts, ends, sizes = start_s[flow], end_s[flow], nbytes[flow]
    width = makespan_s / BINS
    first = np.minimum((starts / width).astype(np.int64), BINS - 1)
    last = np.minimum((ends / width).astype(np.int64), BINS - 1)
    same = first == last
    duration = np.where(same, 1.0, ends - starts)
    rate = np.where(same, 0.0, sizes / duration)
    cells = rows * (BINS + 1)
    head = np.where(same, sizes, rate * ((first + 1) * width - starts))
    tail = np.where(same, 0.0, rate * (ends - last * width))
    per_bin = (np.bincount(row * (BINS + 1) + first, weights=head, minlength=cells)
               + np.bincount(row * (BINS + 1) + last, weights=tail, minlength=cells))
    middle = ~same & (last > first + 1)
    steps = (np.bincount(row[middle] * (BINS + 1) + first[middle] + 1, weights=rate[middle] * width,
                         minlength=cells)
             - np.bincount(row[middle] * (BINS + 1) + last[middle], weights=rate[middle] * width, minlength=cells))
    per_bin = per_bin.reshape(rows, BINS + 1) + np.cumsum(steps.reshape(rows, BINS + 1), axis=1)
    return per_bin[:, :BINS]
