"""Each link tier's busiest link in a step, and the tier whose links bind a kind of communication: what names the
network element behind exposed communication ('the leaf-spine links bind'), where the losses name only the
parallelism dimension.

A tier is the kinds of a link's two ends, in both directions: GPU-NVSwitch, GPU-NIC, NIC-leaf, leaf-spine,
spine-core (switches by their tier; a graph's switches, which have none, are `switch`). A link carries the bytes
of every flow whose route crosses it (under a replica quotient, the flows that stand for their orbit load every
link of their links' orbits, as the trace's link tracks count them: metrics/link_load.py). A tier's busiest link
is the one that carries the most bytes over its line rate, the first by link order among equal ones; its
utilisation is over the step, and in transfers, over the time some flow crosses it. Only the busiest link's
figures are kept: a folded step simulates one rank per stage with its collectives' mirrors, so its busiest links
carry what the unfolded step's do, where the tier's total would count only the simulated ranks' traffic.

A tier binds a kind of communication (the flows of the collectives of that category) where its busiest link runs,
over the time that kind's transfers run, within `BINDING_MARGIN` of the busiest of every tier, and that peak is
itself within `BINDING_MARGIN` of what the link can carry (its class's efficiency of line rate, degraded or not):
transfers that spend their time in latency leave every link far below it, and then no link binds. Over the
kind's time rather than each link's own: at 2:1 a NIC's link that carries a ring hop inside its leaf runs at line
rate while its flow lasts, then idles while the hops across the spines finish, and does not bind.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from simulator.metrics.events import FlowRoutes
from simulator.metrics.intervals import covered
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
    ends = sorted((_end_kind(topology, node) for node in topology.link_ends[link]), key=END_ORDER.index)
    return "-".join(ends)


def _end_kind(topology: Topology, node: str) -> str:
    attributes = topology.wiring.nodes[node]
    kind = attributes.get("kind", "switch")
    return SWITCH_TIERS.get(attributes.get("tier", 0), "switch") if kind == "switch" else kind


def tier_words(tier: str) -> str:
    """A tier as the verdict names it: 'leaf-spine', 'GPU-NVSwitch'."""
    return "-".join(TIER_LABELS.get(end, end) for end in tier.split("-"))


def link_tiers(routes: FlowRoutes, nbytes: np.ndarray, start_s: np.ndarray, end_s: np.ndarray, topology: Topology,
               makespan_s: float, usable: np.ndarray, window_s: float | None = None) -> dict[str, dict]:
    """Per tier crossed by the flows (``routes`` and the flow arrays aligned), its busiest link (the most bytes
    over line rate, the first by link order among equal ones): its name, line rate, bytes, utilisation over
    ``makespan_s`` and in transfers, over the time its own flows cross it or, given ``window_s``, over that time
    (a kind's transfers), and what it can carry (``usable``: each directed link's usable bytes/s over its line
    rate); keyed by tier in name order."""
    count = len(topology.line_rate)
    if not len(routes) or makespan_s <= 0:
        return {}
    flow_of = np.repeat(np.arange(len(routes)), routes.lengths)
    keys, shares = load_keys(routes, flow_of, count)
    carried = np.bincount(keys, weights=nbytes[flow_of], minlength=2 * count)
    per_link = carried[:count] + carried[shares(np.arange(count))]
    line_rate = np.asarray(topology.line_rate, dtype=float)
    used = np.flatnonzero(per_link > 0)
    load = np.round(per_link[used] / line_rate[used] / makespan_s, LOAD_DIGITS)
    tiers: dict[str, dict] = {}
    for link in used[np.lexsort((used, -load))].tolist():
        tier = link_tier(topology, link)
        if tier in tiers:
            continue
        u, v = topology.link_ends[link]
        rate, carried_bytes = float(line_rate[link]), float(per_link[link])
        if window_s is None:
            pairs = (keys == link) | (keys == shares(np.array([link]))[0])
            busy = covered(start_s[flow_of[pairs]], end_s[flow_of[pairs]])
        else:
            busy = window_s
        tiers[tier] = {"busiest_link": f"{u}->{v}", "line_rate_bytes_per_s": rate, "bytes": carried_bytes,
                       "utilisation": carried_bytes / (rate * makespan_s),
                       "utilisation_in_transfers": carried_bytes / (rate * busy) if busy > 0 else 0.0,
                       "usable_fraction": float(usable[link])}
    return dict(sorted(tiers.items()))


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
            if tiers[tier]["utilisation_in_transfers"] >= peak["utilisation_in_transfers"] - BINDING_MARGIN]


TIER_DETAIL = " (the busiest, "
"""How the verdict's note on the binding tier opens its bracket of figures, which a table of one line per step
leaves out (metrics/summary.py `without_reason`)."""
OVERSUBSCRIPTION = {"leaf-spine": "oversubscription", "spine-core": "core_oversubscription"}
"""The builder parameter that oversubscribes each tier, which the verdict quotes where it is not 1:1."""


def step_link_tiers(routes: FlowRoutes, flows: Mapping[str, np.ndarray], kinds: np.ndarray, topology: Topology,
                    makespan_s: float, usable: np.ndarray) -> dict:
    """A step's `link_tiers` entry, its flows' tiers (``flows``: the log's flow columns, aligned with ``routes``),
    with the flows of each kind of communication apart (``kinds``: each flow's collective's category, '' for
    none) under `by_kind`, each with the tiers that bind it (`binding_tiers`)."""
    start, end, nbytes = flows["start_s"], flows["end_s"], flows["bytes"]
    entry: dict = {"tiers": link_tiers(routes, nbytes, start, end, topology, makespan_s, usable), "by_kind": {}}
    for kind in sorted(set(kinds.tolist()) - {""}):
        rows = np.flatnonzero(kinds == kind)
        taken = routes.taken(rows)
        if routes.for_orbit is not None:
            taken = FlowRoutes(taken.lengths, taken.links, routes.representative, routes.for_orbit[rows])
        window = covered(start[rows], end[rows])
        tiers = link_tiers(taken, nbytes[rows], start[rows], end[rows], topology, makespan_s, usable, window)
        entry["by_kind"][kind] = {"transfer_s": window, "tiers": tiers, "binding": binding_tiers(tiers)}
    return entry


def with_binding_tier(bottleneck: dict, entry: Mapping, params: Mapping) -> dict:
    """The bottleneck with the tier that binds its largest loss named in its verdict, where that loss is one
    kind's exposed communication and a tier binds it ('...; DP transfers bound by the leaf-spine links,
    oversubscribed 2:1 (the busiest, leaf0.r0->spine1, at 92.2% of line rate while they cross it, usable 94.0%)'),
    with the other tiers within `BINDING_MARGIN` of it, and under `binding_tier` (kind, tier and its busiest
    link's figures); the bottleneck as it was else.
    ``params`` are the topology's builder parameters, which give a tier's oversubscription."""
    name = (bottleneck.get("largest_loss") or {}).get("name", "")
    kind = name.removeprefix("exposed_").removesuffix("_comm")
    by_kind = entry["by_kind"].get(kind) if name.startswith("exposed_") else None
    if not by_kind or not by_kind["binding"] or "verdict" not in bottleneck:
        return bottleneck
    tier = by_kind["binding"][0]
    figures = by_kind["tiers"][tier]
    ratio = float(params.get(OVERSUBSCRIPTION.get(tier, ""), 1))
    others = "".join(f"; the {tier_words(other)} links within {100 * BINDING_MARGIN:.0f} points of it"
                     for other in by_kind["binding"][1:])
    note = (f"{kind.upper()} transfers bound by the {tier_words(tier)} links"
            + (f", oversubscribed {four_digits(ratio)}:1" if ratio != 1 else "")
            + f"{TIER_DETAIL}{figures['busiest_link']}, at {100 * figures['utilisation_in_transfers']:.1f}% of line "
            f"rate while they cross it, usable {100 * figures['usable_fraction']:.1f}%{others})")
    return {**bottleneck, "verdict": f"{bottleneck['verdict']}; {note}",
            "binding_tier": {"kind": kind, "tier": tier, **figures}}
