"""Each link tier's busiest link in a step, and the tier whose links bind a kind of communication: what names the
network element behind exposed communication ('the leaf-spine links bind'), where the losses name only the
parallelism dimension.

A tier is the kinds of a link's two ends, each directed link counted on its own: GPU-NVSwitch, GPU-NIC, NIC-leaf,
leaf-spine, spine-core (switches by their tier; a graph's switches, which have none, are `switch`). A link carries
the bytes of every flow whose route crosses it (under a replica quotient, the flows that stand for their orbit load
every link of their links' orbits, as the trace's link tracks count them: metrics/link_load.py). A tier's busiest
link is the one that carries the most bytes over its line rate, the first by link order among equal ones; its
utilisation is over the step, and in transfers, over the time the transfers crossing it run (`transfers_crossing`:
of any kind over every flow, of one kind under a kind), one rule at both levels. Only the busiest link's figures
are kept: a folded step simulates one rank per stage with its collectives' mirrors, so its busiest links carry what
the unfolded step's do, where the tier's total would count only the simulated ranks' traffic.

A tier binds a kind of communication (the flows of the collectives of that category) where its busiest link (by bytes
over line rate: a link of fewer bytes whose transfers run bunched may run nearer line rate, and is not read, as reading
every link costs about the step's simulation on 8,192 GPUs) runs, while the transfers of that kind crossing it run (the
flows of every collective one of whose flows crosses it: `transfers_crossing`), within `BINDING_MARGIN` of the busiest
of every tier (`near_peak`), and that peak is itself within `BINDING_MARGIN` of what the link can carry (its class's
efficiency of line rate, degraded or not): where every link runs below what it carries, no link binds. A parameter
server's sides (parameter_server/summary.py) are judged by the same rule and code. Over the whole collective rather than
the link's own flows: at 2:1 a NIC's link that carries a ring hop inside its leaf runs at line rate while its flow
lasts, then idles while the same ring's hops across the spines finish, and does not bind; a parameter server's pushes
and pulls are each a transfer of one flow, so its server's link reads 94.0% of line rate while they cross it and binds.
Where the step's link faults make the figures approximate (simulation.py `approximation`), no tier is named.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from simulator.metrics.events import FlowParts, FlowRoutes
from simulator.metrics.intervals import covered, merge
from simulator.metrics.link_load import load_keys
from simulator.topology.graph import Topology
from simulator.units import four_digits

BINDING_MARGIN = 0.05
"""How far below the peak link's utilisation in transfers (a fraction of line rate) a link may run and still bind:
flows that share the link setting their pace keep it within a few percent of full, and a link that waits on
another runs far below it (a tier's here, a parameter server's side in parameter_server/summary.py)."""

LOAD_DIGITS = 9
"""Decimals of a link's utilisation over the step that rank links: links that carry the same bytes at the same
line rate, summed in another order, differ in the last bits, which would pick the busiest among equals."""
SWITCH_TIERS = {1: "leaf", 2: "spine", 3: "core"}
"""How a built fabric's switches are named by their tier."""
END_ORDER = ("gpu", "nvswitch", "pcie_switch", "host_bridge", "nic", "leaf", "spine", "core", "switch")
"""The order of a tier's two ends in its name: from the GPU outwards."""
TIER_LABELS = {"gpu": "GPU", "nvswitch": "NVSwitch", "pcie_switch": "PCIe switch", "host_bridge": "host bridge",
               "nic": "NIC"}
"""How the verdict names a tier's ends where they are not plain words."""


def link_tier(topology: Topology, link: int) -> str:
    """The tier of a directed link: its ends' kinds from the GPU outwards, 'leaf-spine', 'gpu-nvswitch'."""
    return _tier_name(_end_kind(topology, node) for node in topology.link_ends[link])


def _tier_name(ends) -> str:
    return "-".join(sorted(ends, key=END_ORDER.index))


def _end_kind(topology: Topology, node: str) -> str:
    attributes = topology.wiring.nodes[node]
    kind = attributes.get("kind", "switch")
    return SWITCH_TIERS.get(attributes.get("tier", 0), "switch") if kind == "switch" else kind


def link_tier_codes(topology: Topology) -> tuple[np.ndarray, list[str]]:
    """Each directed link's tier as a code into the tier names (in order of first appearance): the ends' kinds
    looked up once per node and once per pair of kinds, not once per link."""
    end_kind = {node: _end_kind(topology, node) for node in topology.wiring.nodes}
    code_of: dict[tuple[str, str], int] = {}
    codes = np.fromiter((code_of.setdefault((end_kind[u], end_kind[v]), len(code_of))
                         for u, v in topology.link_ends), dtype=np.int64, count=len(topology.link_ends))
    names = [_tier_name(pair) for pair in code_of]
    distinct = sorted(set(names))
    return np.array([distinct.index(name) for name in names], dtype=np.int64)[codes], distinct


def tier_words(tier: str) -> str:
    """A tier as the verdict names it: 'leaf-spine', 'GPU-NVSwitch'."""
    return "-".join(TIER_LABELS.get(end, end) for end in tier.split("-"))


def _busiest(per_link: np.ndarray, line_rate: np.ndarray, tier_of: np.ndarray, makespan_s: float) -> list[int]:
    """Per tier whose links carry bytes, its busiest link (the most bytes over line rate, the first by link order
    among equal ones), in tier-code order."""
    used = np.flatnonzero(per_link > 0)
    load = np.round(per_link[used] / line_rate[used] / makespan_s, LOAD_DIGITS)
    tiers = tier_of[used]
    order = np.lexsort((used, -load, tiers))
    first = np.ones(order.size, dtype=bool)
    first[1:] = tiers[order][1:] != tiers[order][:-1]
    return used[order[first]].tolist()


def _tier_figures(link: int, topology: Topology, rate: float, carried: float, makespan_s: float, transfers_s: float,
                  usable: float) -> dict:
    u, v = topology.link_ends[link]
    return {"busiest_link": f"{u}->{v}", "line_rate_bytes_per_s": rate, "bytes": carried,
            "utilisation": carried / (rate * makespan_s),
            "utilisation_in_transfers": carried / (rate * transfers_s) if transfers_s > 0 else 0.0,
            "usable_fraction": usable}


def near_peak(utilisation: float, peak: float) -> bool:
    """Whether a link running at ``utilisation`` of line rate while the transfers crossing it run binds them
    beside the peak link (``peak``, the same figure of the link nearest line rate): within `BINDING_MARGIN` of
    it. The one test of the tiers here and of a parameter server's sides (parameter_server/summary.py)."""
    return utilisation >= peak - BINDING_MARGIN


def transfers_crossing(keys: np.ndarray, crossing: np.ndarray) -> np.ndarray:
    """Which flows (``keys``, each flow's collective) belong to a transfer one of whose flows crosses a link
    (``crossing``, a mask or the indexes of those flows): the flows whose time a link's utilisation in
    transfers is taken over, here and on a parameter server's links."""
    return np.isin(keys, keys[crossing])


def binding_tiers(tiers: Mapping[str, Mapping]) -> list[str]:
    """The tiers whose busiest links bind the transfers ``tiers`` describes (`link_tiers` of their flows), nearest
    line rate first (the nearest the GPU among equal ones: a NIC's path at line rate is bound by the NIC's link
    before the fabric's): every tier within `BINDING_MARGIN` of the peak in transfers, where the peak link runs within
    `BINDING_MARGIN` of what it can carry; none where it does not (latency-bound transfers)."""
    if not tiers:
        return []
    order = sorted(tiers, key=lambda tier: (-round(tiers[tier]["utilisation_in_transfers"], LOAD_DIGITS),
                                            END_ORDER.index(tier.split("-")[-1]), tier))
    peak = tiers[order[0]]
    if peak["utilisation_in_transfers"] < peak["usable_fraction"] - BINDING_MARGIN:
        return []
    return [tier for tier in order
            if near_peak(tiers[tier]["utilisation_in_transfers"], peak["utilisation_in_transfers"])]


TIER_DETAIL = " (the busiest, "
"""How the verdict's note on the binding tier opens its bracket of figures, which a table of one line per step
leaves out (metrics/summary.py `without_reason`)."""
OVERSUBSCRIPTION = {"leaf-spine": "oversubscription", "spine-core": "core_oversubscription"}
"""The builder parameter that oversubscribes each tier, which the verdict quotes where it is not 1:1."""


def step_link_tiers(parts: FlowParts, kind_of_key: np.ndarray, kind_names: list[str], topology: Topology,
                    makespan_s: float, usable: np.ndarray) -> dict:
    """A step's `link_tiers` entry: per tier crossed by the flows (``parts``, the log's), its busiest link (the
    most bytes over line rate, the first by link order among equal ones) with its name, line rate, bytes,
    utilisation over ``makespan_s`` and in transfers (over the time the transfers of any kind crossing it run,
    `transfers_crossing`) and what it can carry
    (``usable``: each directed link's usable bytes/s over its line rate), keyed by tier in name order; and under
    `by_kind` the same of the flows of each kind of communication apart (``kind_of_key``: each key code's index
    into ``kind_names``, whose '' is none), in transfers over the time that kind's transfers crossing the link run
    (`transfers_crossing`), with the time all of that kind's run (`transfer_s`) and the tiers that bind it
    (`binding_tiers`). A replayed block's links are read once, weighed by its replays of each kind."""
    width, count = len(kind_names), len(topology.line_rate)
    flows = _Flows(parts, kind_of_key, width)
    present = [code for code in sorted(range(width), key=kind_names.__getitem__)
               if kind_names[code] and flows.per_kind[code] > 0]
    entry: dict = {"tiers": {}, "by_kind": {}}
    line_rate = np.asarray(topology.line_rate, dtype=float)
    tier_of, tier_names = link_tier_codes(topology)
    per_kind = flows.link_bytes(count) if makespan_s > 0 else np.zeros((count, width))
    per_link = per_kind.sum(axis=1)
    for link in _busiest(per_link, line_rate, tier_of, makespan_s):
        entry["tiers"][tier_names[tier_of[link]]] = _tier_figures(
            link, topology, float(line_rate[link]), float(per_link[link]), makespan_s,
            flows.crossing_transfers_s(link, None, count),
            float(usable[link]))
    entry["tiers"] = dict(sorted(entry["tiers"].items()))
    for code in present:
        tiers = dict(sorted(
            (tier_names[tier_of[link]], _tier_figures(link, topology, float(line_rate[link]),
                                                      float(per_kind[link, code]), makespan_s,
                                                      flows.crossing_transfers_s(link, code, count),
                                                      float(usable[link])))
            for link in _busiest(per_kind[:, code], line_rate, tier_of, makespan_s)))
        entry["by_kind"][kind_names[code]] = {"transfer_s": flows.window_s(code), "tiers": tiers,
                                              "binding": binding_tiers(tiers)}
    return entry


class _Flows:
    """A log's flows for `step_link_tiers`: the single flows' (flow, link) pairs keyed once, the replayed
    blocks' pairs once per block, and each flow's and replay's kind code."""

    def __init__(self, parts: FlowParts, kind_of_key: np.ndarray, width: int):
        self.parts, self.width = parts, width
        self.flow_of = np.repeat(np.arange(len(parts.routes)), parts.routes.lengths)
        self.flow_kind = kind_of_key[parts.key_codes]
        self.replay_kind = kind_of_key[parts.replay_key]
        blocks = parts.blocks
        self.pool = FlowRoutes.joined([block.routes for block in blocks])
        sizes = np.array([len(block) for block in blocks], dtype=np.int64)
        self.block_of = np.repeat(np.arange(len(blocks)), sizes)
        self.pool_of = np.repeat(np.arange(len(self.pool)), self.pool.lengths)
        self.pool_start = np.concatenate([block.start_s for block in blocks] or [np.empty(0)])
        self.pool_end = np.concatenate([block.end_s for block in blocks] or [np.empty(0)])
        self.per_kind = (np.bincount(self.flow_kind, minlength=width)
                         + np.bincount(self.replay_kind, weights=sizes[parts.replay_block], minlength=width))
        """How many flows of each kind code."""
        self._keys: tuple | None = None
        self._unions: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        """Each block's flows' union of intervals, flat, with each interval's block."""

    def keys(self, count: int):
        """The single flows' (flow, link) pairs' load keys and the orbit keys' function (metrics/link_load.py)."""
        if self._keys is None:
            self._keys = load_keys(self.parts.routes, self.flow_of, count)
        return self._keys

    def link_bytes(self, count: int) -> np.ndarray:
        """Bytes each directed link carries (``count`` x kind codes), per kind code."""
        parts, width = self.parts, self.width
        keys, shares = self.keys(count)
        per_key = np.bincount(keys * width + self.flow_kind[self.flow_of], weights=parts.nbytes[self.flow_of],
                              minlength=2 * count * width).reshape(2 * count, width).astype(float)
        replays = np.bincount(parts.replay_block * width + self.replay_kind,
                              minlength=len(parts.blocks) * width).reshape(len(parts.blocks), width)
        pool_bytes = np.concatenate([block.nbytes for block in parts.blocks] or [np.empty(0)])
        for code in np.flatnonzero(replays.any(axis=0)).tolist():
            weights = (pool_bytes * replays[self.block_of, code])[self.pool_of]
            per_key[:count, code] += np.bincount(self.pool.links, weights=weights, minlength=count)
        return per_key[:count] + per_key[shares(np.arange(count))]

    def window_s(self, code: int) -> float:
        """The time the flows of kind ``code`` run, together."""
        return self._keys_window_s(self.flow_kind == code, self.replay_kind == code)

    def crossing_transfers_s(self, link: int, code: int | None, count: int) -> float:
        """The time the transfers of kind ``code`` (None: of every kind) that cross ``link`` run
        (`transfers_crossing`): the flows of every collective one of whose flows loads the link (itself, its orbit)
        or whose replayed block crosses it, together."""
        keys, shares = self.keys(count)
        singles = self.flow_of[(keys == link) | (keys == shares(np.array([link]))[0])]
        blocks = np.unique(self.block_of[np.unique(self.pool_of[self.pool.links == link])])
        parts = self.parts
        crossed = np.isin(parts.replay_block, blocks)
        if code is not None:
            singles = singles[self.flow_kind[singles] == code]
            crossed &= self.replay_kind == code
        replays = np.flatnonzero(crossed)
        codes = np.concatenate((parts.key_codes, parts.replay_key))
        rows = transfers_crossing(codes, np.concatenate((singles, len(parts.key_codes) + replays)))
        return self._keys_window_s(rows[:len(parts.key_codes)], rows[len(parts.key_codes):])

    def _keys_window_s(self, rows: np.ndarray, replays: np.ndarray) -> float:
        """The time the single flows ``rows`` marks and the replays ``replays`` marks run, together: each block's
        flows' union once, shifted by each marked replay."""
        parts = self.parts
        if self._unions is None:
            unions = [merge(block.start_s, block.end_s) for block in parts.blocks]
            self._unions = (np.repeat(np.arange(len(unions)), [len(union[0]) for union in unions]).astype(np.int64),
                            np.concatenate([union[0] for union in unions] or [np.empty(0)]),
                            np.concatenate([union[1] for union in unions] or [np.empty(0)]))
        block_of, union_start, union_end = self._unions
        starts, ends = self._replayed(block_of, union_start, union_end, replays)
        return covered(np.concatenate((parts.start_s[rows], starts)), np.concatenate((parts.end_s[rows], ends)))

    def _replayed(self, block_of: np.ndarray, start_s: np.ndarray, end_s: np.ndarray, replays: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """The intervals ``start_s``-``end_s`` (sorted by their blocks, ``block_of``) copied into each replay that
        ``replays`` marks of their block, shifted by its time."""
        parts = self.parts
        per_block = np.bincount(block_of, minlength=len(parts.blocks))
        first = np.cumsum(per_block) - per_block
        blocks, shifts = parts.replay_block[replays], parts.replay_shift_s[replays]
        sizes = per_block[blocks]
        at = np.repeat(first[blocks] - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))
        shift = np.repeat(shifts, sizes)
        return start_s[at] + shift, end_s[at] + shift


def tier_oversubscription(topology: Topology, tier: str, busiest_link: str) -> str:
    """How the verdict names a binding tier's oversubscription (', oversubscribed 2:1'), '' where it is 1:1: a
    built fabric's from the builder parameter that sets it (`OVERSUBSCRIPTION`), a `graph` file's from its wiring,
    the downlink : uplink capacity at the switch below the tier's busiest link ('u->v'), named (', oversubscribed
    2:1 at leaf0': two 50 GB/s NIC links down, one 50 GB/s uplink; topology/describe.py `link_subscription`)."""
    if not topology.explicit_graph:
        ratio = float(topology.params.get(OVERSUBSCRIPTION.get(tier, ""), 1))
        return f", oversubscribed {four_digits(ratio)}:1" if ratio != 1 else ""
    from simulator.topology.describe import link_subscription

    below = link_subscription(topology, *busiest_link.split("->"))
    if below is None or below[1] <= 1 + OVERSUBSCRIBED_FROM:
        return ""
    return f", oversubscribed {four_digits(below[1])}:1 at {below[0]}"


OVERSUBSCRIBED_FROM = 1e-9
"""How far above 1:1 a graph switch's downlink : uplink ratio must be to be named (rounding of summed capacities)."""


def with_binding_tier(bottleneck: dict, entry: Mapping, topology: Topology) -> dict:
    """The bottleneck with the tier that binds its largest loss named in its verdict, where the step is
    communication-bound, that loss is one kind's exposed communication and a tier binds it ('...; DP transfers bound
    by the leaf-spine links, oversubscribed 2:1 (the busiest, leaf0.r0->spine1, at 92.2% of line rate while they
    run, usable 94.0%)'), with the other tiers within `BINDING_MARGIN` of it, and under `binding_tier` (kind,
    tier and its busiest link's figures); the bottleneck as it was else, and where the entry's figures are
    approximate (`approximate_because`: link faults in the step).
    ``topology``: the run's cluster, which gives a tier's oversubscription (`tier_oversubscription`)."""
    name = (bottleneck.get("largest_loss") or {}).get("name", "")
    kind = name.removeprefix("exposed_").removesuffix("_comm")
    by_kind = entry["by_kind"].get(kind) if name.startswith("exposed_") else None
    if (not by_kind or not by_kind["binding"] or "verdict" not in bottleneck or entry.get("approximate_because")
            or bottleneck.get("constraint") != "communication"):
        return bottleneck
    tier = by_kind["binding"][0]
    figures = by_kind["tiers"][tier]
    others = "".join(f"; the {tier_words(other)} links within {100 * BINDING_MARGIN:.0f} points of it"
                     for other in by_kind["binding"][1:])
    note = (f"{kind.upper()} transfers bound by the {tier_words(tier)} links"
            + tier_oversubscription(topology, tier, figures["busiest_link"])
            + f"{TIER_DETAIL}{figures['busiest_link']}, at {100 * figures['utilisation_in_transfers']:.1f}% of line "
            f"rate while they run, usable {100 * figures['usable_fraction']:.1f}%{others})")
    return {**bottleneck, "verdict": f"{bottleneck['verdict']}; {note}",
            "binding_tier": {"kind": kind, "tier": tier, **figures}}
