"""Human-readable summaries of a topology (`trainsim topo`): node and link counts, per-tier bisection, a drawing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from matplotlib.figure import Figure

from simulator.errors import TopologyError
from simulator.topology.graph import Topology
from simulator.units import counted, format_bandwidth, format_duration, four_digits

MAX_DRAWN_NODES = 512
_SWITCH_TIERS = {1: "leaf", 2: "spine", 3: "core"}
_ROLE_ORDER = ("GPU", "NVSwitch", "PCIe switch", "host bridge", "NIC", "leaf", "spine", "core", "switch")
_DRAW_LAYER = {"GPU": 0, "NVSwitch": -1, "PCIe switch": -1, "host bridge": -2, "NIC": 1, "leaf": 2, "spine": 3,
               "core": 4, "switch": 2}
_FABRIC_ROLES = {"NIC", "leaf", "spine", "core"}
"""The roles of the fabric's tiers, from the NICs up: a tier carries at most what the tiers below it carry."""
_PLURAL = {"leaf": "leaves", "spine": "spines"}
"""The switch roles with uplinks, as a tier's oversubscription names them."""
_SAME = 1e-9
"""Relative difference under which two tiers' bisections are the same (sums of link bandwidths)."""
_CLASS_COLOURS = {"nvlink": "tab:green", "pcie": "tab:orange", "infiniband": "tab:blue", "ethernet": "tab:purple",
                  "c2c": "tab:red"}


def _role(attrs: dict) -> str:
    kind = attrs["kind"]
    if kind == "switch":
        return _SWITCH_TIERS.get(int(attrs.get("tier") or 0), "switch")
    return {"gpu": "GPU", "nvswitch": "NVSwitch", "pcie_switch": "PCIe switch", "host_bridge": "host bridge",
            "nic": "NIC"}[kind]



_DOMAIN_NAMES = {"nvlink_domain": "NVLink domain", "host": "host"}
"""What a tier's figure is each of, by the node attribute both ends of its links share (`_shared_domain`)."""


def _shared_domain(a: dict, b: dict) -> tuple[str, object] | None:
    """The NVLink domain or host both ends of a link belong to (the attribute and its value), or None when the
    link leaves it."""
    for key in _DOMAIN_NAMES:
        if key in a and key in b and a[key] == b[key]:
            return (key, a[key])
    return None


def physical_links(topo: Topology) -> list[tuple[str, str, dict]]:
    """Each full-duplex link once, as (end a, end b, edge attributes), from the builder's plain dicts (the
    networkx graph took most of `topo describe`'s time on large clusters)."""
    return [(u, v, data) for (u, v), data in topo.wiring.edges.items() if u < v]


def tier_bisection(topo: Topology) -> list[tuple[str, tuple[tuple[float, int, str], ...]]]:
    """Per link tier (e.g. 'GPU-NVSwitch', 'leaf-spine'): half its per-direction capacity, per domain where local.

    In a folded Clos with links spread evenly, half the links of a tier cross a cut that splits the GPUs in two,
    so this is the tier's bisection bandwidth. Tiers inside a host or NVLink domain are reported per domain:
    each distinct value with the number of domains that have it and what they are ('nvlink_domain' or 'host'),
    largest first (a partly filled last rack has less than the full ones); a network tier is one value for the
    whole fabric, with a count of 0 and ''.
    """
    totals: dict[tuple[str, str], dict[tuple[str, object] | None, float]] = {}
    nodes = topo.wiring.nodes
    for u, v, data in physical_links(topo):
        first, second = sorted((_role(nodes[u]), _role(nodes[v])), key=_ROLE_ORDER.index)
        per_domain = totals.setdefault((first, second), {})
        domain = _shared_domain(nodes[u], nodes[v])
        per_domain[domain] = per_domain.get(domain, 0.0) + data["bandwidth"]
    result = []
    for roles in sorted(totals, key=lambda r: (_ROLE_ORDER.index(r[1]), _ROLE_ORDER.index(r[0]))):
        per_domain = totals[roles]
        if None in per_domain:
            values: tuple[tuple[float, int, str], ...] = ((sum(per_domain.values()) / 2, 0, ""),)
        else:
            counts = Counter((total / 2, domain[0]) for domain, total in per_domain.items() if domain is not None)
            values = tuple(sorted(((bandwidth, count, key) for (bandwidth, key), count in counts.items()),
                                  reverse=True))
        result.append(("-".join(roles), values))
    return result


def _levels(topo: Topology) -> tuple[dict[str, int], bool]:
    """Each node's height in the fabric and whether it comes from the switches' tiers: a built fabric's leaf,
    spine and core tiers (1, 2, 3; every other node 0), or, where a switch has no tier (a `graph` file), hops
    from the nearest GPU (a breadth-first search over the links)."""
    nodes = topo.wiring.nodes
    if all(attrs.get("tier") for attrs in nodes.values() if attrs["kind"] == "switch"):
        return {name: int(attrs.get("tier") or 0) for name, attrs in nodes.items()}, True
    neighbours: dict[str, list[str]] = {}
    for u, v in topo.wiring.edges:
        neighbours.setdefault(u, []).append(v)
    hops = {name: 0 for name, attrs in nodes.items() if attrs["kind"] == "gpu"}
    frontier = list(hops)
    while frontier:
        reached = []
        for node in frontier:
            for other in neighbours.get(node, ()):
                if other not in hops:
                    hops[other] = hops[node] + 1
                    reached.append(other)
        frontier = reached
    return hops, False


def switch_subscription(topo: Topology) -> tuple[dict[str, float], bool]:
    """Each switch's downlink : uplink ratio from the wiring, the capacity of its links to nodes below it over
    that of its links to nodes above it (a switch with no uplinks, the top tier, has none), and whether the
    heights are the switches' tiers (else hops from the GPUs, `_levels`). A partly filled leaf group's leaves
    have their hosts' NICs below and uplinks sized for every port above."""
    levels, tiered = _levels(topo)
    down: dict[str, float] = {}
    up: dict[str, float] = {}
    nodes = topo.wiring.nodes
    for u, v, data in physical_links(topo):
        if u not in levels or v not in levels or levels[u] == levels[v]:
            continue
        low, high = (u, v) if levels[u] < levels[v] else (v, u)
        if nodes[low]["kind"] == "switch":
            up[low] = up.get(low, 0.0) + data["bandwidth"]
        if nodes[high]["kind"] == "switch":
            down[high] = down.get(high, 0.0) + data["bandwidth"]
    return {switch: down.get(switch, 0.0) / capacity for switch, capacity in up.items()}, tiered


def link_subscription(topo: Topology, u: str, v: str) -> tuple[str, float] | None:
    """The switch at the lower end of link ``u``-``v`` (heights as `switch_subscription` reads them: a `graph`
    file's by hops from the GPUs) and its downlink : uplink ratio, the link one of its uplinks; None where the ends
    are at one height or the lower one is no switch with uplinks (a NIC, a GPU)."""
    levels, _ = _levels(topo)
    if u not in levels or v not in levels or levels[u] == levels[v]:
        return None
    low = u if levels[u] < levels[v] else v
    ratio = switch_subscription(topo)[0].get(low)
    return None if ratio is None else (low, ratio)


def _ratio(value: float) -> str:
    """A ratio N:1 to four significant digits, without an exponent: 2 -> '2:1', 1024 -> '1,024:1'."""
    return f"{four_digits(value)}:1"


def describe_topology(topo: Topology, changed: tuple[str, ...] = ()) -> str:
    """A multi-line text summary: the file's description (said to be the file's where ``changed`` names the
    parameters other than its size that a `--set` changed, which it may no longer fit: a DGX H100's text over
    B200 GPUs), GPUs and hosts
    (and the hosts a fabric is wired for, `fabric_hosts`), nodes per
    kind (with the first and last node name, the names `faults.step` links take), link groups, bisection
    bandwidth per tier (the switch tiers' those of the wiring), a fabric tier whose switches have more below than
    above them oversubscribed (by the worst switch's downlink : uplink ratio, with the fabric's bisection against
    the narrowest tier below), one with no switch oversubscribed above what the tiers below it carry (a leaf
    group partly populated: its uplinks are sized for every port) under-subscribed, an oversubscribed spine-core
    tier what each pod has to the others, and for switches without tiers (a `graph` file's) the worst ratio."""
    per_host = Counter(topo.gpu_host)
    sizes = sorted(set(per_host.values()))
    lines = [f"topology {topo.name} ({topo.params.get('kind', 'custom')}): {topo.num_gpus} GPUs ({topo.gpu_model})"
             f" on {counted(topo.num_hosts, 'host')}, {'/'.join(map(str, sizes))} GPUs per host, "
             f"{counted(topo.rails, 'rail')}"]
    wired = topo.params.get("fabric_hosts")
    if wired:
        lines[0] += f", fabric wired for {counted(wired, 'host')}"
    if topo.params.get("description"):
        text = ' '.join(str(topo.params['description']).split())
        lines.append(f"  the file's description, before --set {', '.join(changed)}: {text}" if changed else f"  {text}")
    roles: Counter[str] = Counter()
    names: dict[str, list[str]] = {}
    for name, attrs in topo.wiring.nodes.items():
        role = _role(attrs)
        roles[role] += 1
        names.setdefault(role, [name, name])[1] = name
    lines.append("nodes (count, first and last name: what `faults.step` links name):")
    lines += [f"  {role:<12} {roles[role]:>7}  {names[role][0]}" + (f" .. {names[role][1]}" if roles[role] > 1 else "")
              for role in _ROLE_ORDER if roles[role]]
    groups = Counter((data["link_class"], data["bandwidth"], data["latency"]) for _, _, data in physical_links(topo))
    lines.append("links (full duplex; bandwidth per direction, latency per link):")
    for (link_class, bandwidth, latency), count in sorted(groups.items()):
        lines.append(f"  {link_class:<11} {count:>7} x {format_bandwidth(bandwidth):>10}  {format_duration(latency)}")
    lines.append("bisection bandwidth per tier (per direction):")
    ratios, tiered = switch_subscription(topo)
    worst: dict[str, float] = {}
    for switch, ratio in ratios.items():
        role = _role(topo.wiring.nodes[switch])
        worst[role] = max(worst.get(role, 0.0), ratio)
    below: tuple[str, float] | None = None
    for tier, values in tier_bisection(topo):
        (bandwidth, domains, key), *others = values
        scope = _scope(domains, key)
        if wired and set(tier.split("-")) <= set(_SWITCH_TIERS.values()):
            scope += f", as wired for {counted(wired, 'host')}"
        if set(tier.split("-")) <= _FABRIC_ROLES and below is not None:
            scope += _subscription(tier, bandwidth, below, worst.get(tier.split("-")[0], 0.0), topo)
            if bandwidth < below[1]:
                below = tier, bandwidth
        elif set(tier.split("-")) <= _FABRIC_ROLES:
            below = tier, bandwidth
        text = f"  {tier:<24} {format_bandwidth(bandwidth):>10}  ({scope})"
        lines.append(", ".join([text, *(f"{format_bandwidth(each)} ({_scope(count, key)})"
                                        for each, count, key in others)]))
    if not tiered and ratios:
        lines.append(_untiered_subscription(ratios))
    return "\n".join(lines)


def _subscription(tier: str, bandwidth: float, below: tuple[str, float], worst: float, topo: Topology) -> str:
    """How a fabric tier's switches and bisection compare with what the tiers below carry: oversubscribed by its
    worst switch's downlink : uplink ratio (the ratio `oversubscription` sets), with the fabric's bisection
    against the narrowest tier below, which differs when a leaf group or pod is partly filled; under-subscribed
    where no switch is oversubscribed and the tier's bisection exceeds the one below."""
    against = f"the {below[0]} tier's {format_bandwidth(below[1])}"
    if worst > 1 + _SAME:
        if bandwidth < below[1] * (1 - _SAME):
            bisection = f"the fabric's bisection {_ratio(below[1] / bandwidth)} against {against}"
        elif bandwidth > below[1] * (1 + _SAME):
            bisection = f"the fabric's bisection above {against}"
        else:
            bisection = f"the fabric's bisection even with {against}"
        text = f"; oversubscribed {_ratio(worst)} at its {_PLURAL[tier.split('-')[0]]}, {bisection}"
        return text + (f"; pod to pod: {_pod_uplinks(topo)}" if tier == "spine-core" else "")
    if bandwidth > below[1] * (1 + _SAME):
        return f"; under-subscribed: carries at most {against}"
    if bandwidth < below[1] * (1 - _SAME):
        return f"; no switch oversubscribed, the fabric's bisection {_ratio(below[1] / bandwidth)} against {against}"
    return ""


def _untiered_subscription(ratios: dict[str, float]) -> str:
    """The worst downlink : uplink ratio of switches without tiers (a `graph` file's), below and above by hops
    from the nearest GPU: the switch and its ratio, or that none is oversubscribed."""
    switch = max(sorted(ratios), key=ratios.__getitem__)
    counts = counted(len(ratios), "switch", "switches")
    if ratios[switch] > 1 + _SAME:
        return (f"switch downlink : uplink (below and above by hops from the GPUs): oversubscribed "
                f"{_ratio(ratios[switch])} at {switch}, the worst of {counts} with uplinks")
    return (f"switch downlink : uplink (below and above by hops from the GPUs): none oversubscribed, "
            f"{counts} with uplinks")


def _pod_uplinks(topo: Topology) -> str:
    """Each pod's spine-core capacity per direction (what all its GPUs share to reach the other pods), each distinct
    value with the number of pods that have it, largest first."""
    per_pod: dict[object, float] = {}
    nodes = topo.wiring.nodes
    for u, v, data in physical_links(topo):
        spine = next((end for end in (u, v) if _role(nodes[end]) == "spine"), None)
        if spine is not None and "core" in (_role(nodes[u]), _role(nodes[v])):
            per_pod[nodes[spine]["pod"]] = per_pod.get(nodes[spine]["pod"], 0.0) + data["bandwidth"]
    counts = Counter(per_pod.values())
    return ", ".join(f"{format_bandwidth(bandwidth)} out of each of {counted(count, 'pod')}" if count > 1
                     else f"{format_bandwidth(bandwidth)} out of 1 pod"
                     for bandwidth, count in sorted(counts.items(), reverse=True))


def _scope(domains: int, key: str) -> str:
    """What one bisection figure covers: each of ``domains`` NVLink domains or hosts (``key``, the attribute its
    links' ends share; 'each of' above one), or the whole fabric (0)."""
    if not domains:
        return "whole fabric"
    return f"each of {counted(domains, _DOMAIN_NAMES[key])}" if domains > 1 else f"1 {_DOMAIN_NAMES[key]}"


def draw_topology(topo: Topology, path: str | Path) -> Path:
    """Draw a small topology as a layered PNG (GPUs in the middle, NVLink/PCIe below, network above).

    Uses a bare matplotlib Figure (Agg canvas), so no pyplot state or display is involved.
    """
    if topo.graph.number_of_nodes() > MAX_DRAWN_NODES:
        raise TopologyError(f"topology {topo.name} has {topo.graph.number_of_nodes():,} nodes, too many to draw",
                            field="nodes",
                            allowed=f"at most {MAX_DRAWN_NODES} nodes (GPUs, switches, NICs): fewer servers, or "
                                    "topo describe")
    layers: dict[int, list[str]] = {}
    for node, attrs in topo.graph.nodes(data=True):
        layers.setdefault(_DRAW_LAYER[_role(attrs)], []).append(node)
    widest = max(len(members) for members in layers.values())
    position = {node: ((i + 0.5) * widest / len(members), layer)
                for layer, members in layers.items() for i, node in enumerate(members)}
    figure = Figure(figsize=(min(4 + widest * 0.35, 40), 2 + 1.2 * len(layers)))
    axes = figure.subplots()
    for u, v, data in physical_links(topo):
        (x0, y0), (x1, y1) = position[u], position[v]
        axes.plot([x0, x1], [y0, y1], color=_CLASS_COLOURS.get(data["link_class"], "grey"), linewidth=0.6,
                  alpha=0.7, zorder=1)
    for layer, members in layers.items():
        axes.scatter([position[n][0] for n in members], [layer] * len(members), s=30, zorder=2,
                     color="black" if layer == 0 else "white", edgecolors="black")
    for link_class, colour in _CLASS_COLOURS.items():
        if link_class in topo.link_class:
            axes.plot([], [], color=colour, label=link_class)
    axes.set_yticks(sorted(layers), [_role(topo.graph.nodes[layers[k][0]]) for k in sorted(layers)])
    axes.set_xticks([])
    axes.set_title(f"{topo.name}: {counted(topo.num_gpus, 'GPU')}, {counted(topo.num_hosts, 'host')}")
    classes = axes.get_legend_handles_labels()[1]
    if classes:  # a lone GPU has no links to label; below the axes, where no node is (upper right hid the last GPU)
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, 0), ncol=len(classes), fontsize="small", frameon=False)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path
