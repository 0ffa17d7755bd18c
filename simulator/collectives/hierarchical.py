"""Two-level (hierarchical) collectives: rings inside each host, and per-rail collectives across hosts
among the GPUs that share a local position, all rails in parallel.

A "host" here is an NVLink domain (`ring.group_by_domain`): a DGX server, or a whole GB200 NVL72 rack, whose
members on its 18 trays reach each other over NVLink and leave it on their own NICs; the position is the
GPU's index in the domain. With g group members per domain and N domains, all-reduce costs
2(g-1) a_in + 2(g-1)/g n b_in + 2(N-1) a_out + 2(N-1)/N (n/g) b_out.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.collectives.names import ALGORITHM_OPS
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.collectives.ring import group_by_domain, group_by_host, merge_parallel, ring_phase
from simulator.collectives.tree import binomial_phases
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS = ALGORITHM_OPS["hierarchical"]


def host_grid(request: CollectiveRequest, topology: Topology, name: str = "hierarchical") -> list[list[int]]:
    """Members per NVLink domain (rows), the same count g on every domain; column j is rail j's group across
    domains. An uneven group is refused in the name of algorithm ``name``, the one the user asked for, and by what
    the rows group: an NVLink domain where a row spans hosts (a GB200 NVL72 rack's trays), else a host (as rows
    are where a rack's NVSwitches are down, `ring.group_by_domain`)."""
    hosts = group_by_domain(request.ranks, topology)
    sizes = sorted({len(members) for members in hosts})
    if len(sizes) > 1:
        host = topology.gpu_host
        spans = any(len({host[rank] for rank in members}) > 1 for members in hosts)
        unit = "NVLink domain (rack)" if spans else "host"
        raise ScenarioError(f"{name} {request.op} needs the same number of group members on every {unit}, "
                            f"got {', '.join(map(str, sizes))}", field="collectives.algorithm")
    return hosts


def even_rows(by_domain: list[list[int]], by_host: Callable[[], list[list[int]]]) -> list[list[int]]:
    """hierarchical's rows of a group from its members per NVLink domain, ``by_domain``, and per host, ``by_host``
    (asked only where the domains hold unequal counts): by domain, else by host where only the hosts hold equal
    counts (a GB200 job whose last rack is partly used, `last_rack_trays`); the domains' where neither is even.
    The plan (`rows_by_domain_or_host`) and the scale estimate before the build (scale.py) both group so."""
    if len({len(members) for members in by_domain}) > 1:
        hosts = by_host()
        if len({len(members) for members in hosts}) == 1:
            return hosts
    return by_domain


def rows_by_domain_or_host(request: CollectiveRequest, topology: Topology) -> list[list[int]]:
    """hierarchical's rows on ``topology`` (`even_rows`), refused where neither the NVLink domains nor the hosts
    hold equal counts (`host_grid`). NCCL has no hierarchical algorithm to follow."""
    rows = even_rows(group_by_domain(request.ranks, topology), lambda: group_by_host(request.ranks, topology))
    return rows if len({len(members) for members in rows}) == 1 else host_grid(request, topology)


def _rings(rings: list[list[int]], nbytes_per_step: float, steps: int, *, rails: bool) -> list[Phase]:
    """All ``rings`` stepping together ``steps`` times; rail rings (``rails``) run on their rail's channel."""
    if steps == 0 or len(rings[0]) < 2:
        return []
    return [ring_phase(rings, nbytes_per_step, steps, channels=None if rails else [0] * len(rings))]


def _root_host_star(members: list[int], root: int, nbytes: float, *, toward_root: bool) -> list[Phase]:
    """Root sends its host mates their 1/g piece (scatter), or gathers theirs (``toward_root``)."""
    others = [r for r in members if r != root]
    if not others:
        return []
    pairs = [(r, root) if toward_root else (root, r) for r in others]
    return [Phase(tuple(Transfer(a, b, nbytes) for a, b in pairs))]


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """Intra-host rings + per-rail inter-host rings (binomial trees for broadcast/reduce), rails in parallel."""
    if request.op not in OPS:
        raise ScenarioError(f"algorithm 'hierarchical' does not implement {request.op}",
                            field="collectives.algorithm")
    hosts = rows_by_domain_or_host(request, topology)
    g, count = len(hosts[0]), len(hosts)
    rails = [[members[j] for members in hosts] for j in range(g)]
    piece = request.nbytes / g
    if request.op == "all_reduce":
        return (_rings(hosts, piece, g - 1, rails=False) + _rings(rails, piece / count, 2 * (count - 1), rails=True)
                + _rings(hosts, piece, g - 1, rails=False))
    if request.op == "reduce_scatter":
        return _rings(hosts, piece, g - 1, rails=False) + _rings(rails, piece / count, count - 1, rails=True)
    if request.op == "all_gather":
        return _rings(rails, piece / count, count - 1, rails=True) + _rings(hosts, piece, g - 1, rails=False)
    root = request.ranks[request.root]
    root_host = next(h for h, members in enumerate(hosts) if root in members)
    toward_root = request.op == "reduce"
    across = merge_parallel([binomial_phases(tuple(rail), root_host, piece, toward_root=toward_root, channel=j)
                             for j, rail in enumerate(rails)]) if count > 1 else []
    star = _root_host_star(hosts[root_host], root, piece, toward_root=toward_root)
    if toward_root:
        return _rings(hosts, piece, g - 1, rails=False) + across + star
    return star + across + _rings(hosts, piece, g - 1, rails=False)
