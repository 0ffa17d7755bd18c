"""The one registry of collective algorithms, by name; `auto` (algorithm, protocol or both) resolves through
tuner.py's rule, and the protocol is applied to the algorithm's plan (protocols.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from simulator.collectives import (
    collnet_direct,
    direct,
    halving_doubling,
    hierarchical,
    nvls,
    nvls_sharp,
    protocols,
    ring,
    tree,
    userbuffers,
)
from simulator.collectives.chunking import check_chunk
from simulator.collectives.names import (
    POINT_TO_POINT,
    AlgorithmChoice,
    AlgorithmName,
    Primitive,
    Protocol,
    ProtocolChoice,
)
from simulator.collectives.phases import CollectiveRequest, Phase
from simulator.collectives.tuner import Choice, Weighing, unweighed, weighed
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

Planner = Callable[[CollectiveRequest, Topology], list[Phase]]
Checker = Callable[[CollectiveRequest, Topology], object]


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm: its ``plan``, the primitives (``ops``) it implements, whether NCCL runs it on
    its NVLS channels (``nvls_channels``, the SMs its kernel holds; engine/contention.py), and the ``check`` its
    plan starts with, which raises the algorithm's refusal of a request its ops include (None: it plans every
    such request). The check builds no transfers, so asking which algorithms run a request costs no plan."""

    plan: Planner
    ops: tuple[Primitive, ...]
    nvls_channels: bool = False
    check: Checker | None = None


ALGORITHMS: dict[AlgorithmName, Algorithm] = {
    "ring": Algorithm(ring.plan, ring.OPS),
    "tree": Algorithm(tree.plan, tree.OPS),
    "hierarchical": Algorithm(hierarchical.plan, hierarchical.OPS, check=hierarchical.rows_by_domain_or_host),
    "direct": Algorithm(direct.plan, direct.OPS),
    "halving_doubling": Algorithm(halving_doubling.plan, halving_doubling.OPS, check=halving_doubling.check),
    "nvls": Algorithm(nvls.plan, nvls.OPS, nvls_channels=True, check=nvls.check),
    "collnet_direct": Algorithm(collnet_direct.plan, collnet_direct.OPS, check=collnet_direct.hosts),
    "nvls_sharp": Algorithm(nvls_sharp.plan, nvls_sharp.OPS, nvls_channels=True, check=nvls_sharp.host_members),
    "userbuffers": Algorithm(userbuffers.plan, userbuffers.OPS),
    "ring_exchange": Algorithm(userbuffers.ring_exchange, userbuffers.RING_EXCHANGE_OPS),
}
"""name -> algorithm, one per names.py AlgorithmName. send_recv is one transfer, `direct`'s."""

def plan_collective(request: CollectiveRequest, topology: Topology, algorithm: AlgorithmChoice = "auto",
                    efficiency: Mapping[str, float] | None = None, protocol: ProtocolChoice = "simple"
                    ) -> list[Phase]:
    """Check ``request``, resolve ``algorithm`` and ``protocol`` (registered names, or "auto" for links that reach
    ``efficiency``; the protocol is Simple unless asked) and return its phases under that protocol. An algorithm
    that cannot run the request here is refused offering those that can (`runnable_algorithms`)."""
    check_request(request, topology)
    if len(request.ranks) < 2 or request.nbytes == 0:
        return []
    name, resolved = resolve(request, topology, algorithm, protocol, efficiency)
    chosen = refuse_unimplemented(request, topology, name)
    try:
        phases = chosen.plan(replace(request, protocol=resolved), topology)
    except ScenarioError as refused:
        if refused.field != "collectives.algorithm":
            raise
        raise refused.rebuilt(allowed=_offered(request, topology)) from None
    return protocols.apply(phases, name, resolved)


def refuse_unimplemented(request: CollectiveRequest, topology: Topology, name: AlgorithmName) -> Algorithm:
    """The algorithm ``name``, refused where it does not implement ``request``'s op, offering those that run it
    here (`_offered`: direct or auto for an all_to_all or a send_recv)."""
    chosen = ALGORITHMS[name]
    if request.op not in chosen.ops:
        raise ScenarioError(f"algorithm {name!r} does not implement {request.op}",
                            field="collectives.algorithm", allowed=_offered(request, topology))
    return chosen


def planned_transfers(request: CollectiveRequest, topology: Topology, algorithm: AlgorithmName,
                      protocol: Protocol) -> int:
    """The transfers of `plan_collective`'s phases of ``request`` as ``algorithm`` under ``protocol`` (as
    `resolve` chose them; `protocols.apply` adds no transfer, a tree's protocol sizes its chunks), a tree
    all-reduce's counted without building its phases (`tree.all_reduce_transfers`: over 4,096 DGX A100 hosts
    the phases took seconds)."""
    if algorithm != "tree" or request.op != "all_reduce":
        return sum(len(phase.transfers) for phase in plan_collective(request, topology, algorithm, protocol=protocol))
    check_request(request, topology)
    if len(request.ranks) < 2 or request.nbytes == 0:
        return 0
    return tree.all_reduce_transfers(replace(request, protocol=protocol), topology)


def runnable_algorithms(request: CollectiveRequest, topology: Topology) -> list[AlgorithmName]:
    """The registered algorithms that plan ``request`` on ``topology``: each that implements its op and whose
    own check (SHARP switches, NVLink SHARP, hosts of equal share, a power-of-two group...) passes: the check
    its plan runs, so that no list kept beside the checks can disagree with them, and no plan is built (a
    direct plan over 4,096 GPUs is 16.8 M transfers)."""
    able = []
    for name, entry in ALGORITHMS.items():
        if request.op not in entry.ops:
            continue
        if entry.check is not None:
            try:
                entry.check(request, topology)
            except ScenarioError:
                continue
        able.append(name)
    return able


def _offered(request: CollectiveRequest, topology: Topology) -> str:
    """What a refusal of an algorithm offers instead: the algorithms that run ``request`` here, or auto."""
    return ", ".join(runnable_algorithms(request, topology)) + " or auto"


def resolve(request: CollectiveRequest, topology: Topology, algorithm: AlgorithmChoice,
            protocol: ProtocolChoice = "simple", efficiency: Mapping[str, float] | None = None) -> Choice:
    """The algorithm and protocol that run ``request``: a send_recv is one direct transfer under Simple, what
    else it asks refused as an algorithm that does not implement an op is (`refuse_unimplemented`) and a protocol
    its algorithm does not run (`protocols.check`); otherwise `choose`'s choice of what is `auto` on links that
    reach ``efficiency`` (the network model's; None: line rate), a protocol asked for checked against the
    algorithm. `direct` chosen for a collective runs point to point under Simple whatever protocol was asked."""
    return resolve_weighing(request, topology, algorithm, protocol, efficiency)[0]


def resolve_weighing(request: CollectiveRequest, topology: Topology, algorithm: AlgorithmChoice,
                     protocol: ProtocolChoice = "simple", efficiency: Mapping[str, float] | None = None
                     ) -> tuple[Choice, Weighing | None]:
    """`resolve`'s choice and what `auto` weighed to make it (tuner.py `weighed`; None where nothing was weighed,
    `unweighed`), from one weighing."""
    if request.op in POINT_TO_POINT and protocol != "auto":
        protocols.check("direct", request.op, protocol, request.ranks, topology)
    if request.op == "send_recv":
        if algorithm != "auto":
            refuse_unimplemented(request, topology, algorithm)
        return Choice("direct", "simple"), None
    weighing: Weighing | None = None
    chosen = unweighed(request, topology, algorithm, protocol)
    if chosen is None:
        weighing = weighed(request, topology, efficiency, algorithm, protocol)
        chosen = weighing.choice
    if chosen.algorithm == "direct":
        return Choice("direct", "simple"), weighing
    if protocol != "auto":
        protocols.check(chosen.algorithm, request.op, protocol, request.ranks, topology)
    return chosen, weighing


def check_request(request: CollectiveRequest, topology: Topology) -> None:
    """Reject a request no algorithm can plan, naming the field and what would be accepted."""
    ranks = request.ranks
    if not ranks or len(set(ranks)) != len(ranks):
        raise ScenarioError(f"group {ranks} must list distinct GPUs", field="group", allowed="distinct GPU indices")
    if min(ranks) < 0 or max(ranks) >= topology.num_gpus:
        raise ScenarioError(f"group {ranks} names a GPU the cluster lacks", field="group",
                            allowed=f"GPU indices 0..{topology.num_gpus - 1}")
    if request.op == "send_recv" and len(ranks) != 2:
        raise ScenarioError(f"send_recv takes (src, dst), got {ranks}", field="group", allowed="two GPU indices")
    if not (math.isfinite(request.nbytes) and request.nbytes >= 0):
        raise ScenarioError(f"size {request.nbytes!r} is not a byte count", field="nbytes",
                            allowed="zero or a positive size")
    if not 0 <= request.root < len(ranks):
        raise ScenarioError(f"root {request.root} is not a position in the group", field="root",
                            allowed=f"0..{len(ranks) - 1}")
    check_chunk(request.chunk_bytes)
    if request.channels < 0:
        raise ScenarioError(f"channels {request.channels} is negative", field="collectives.channels",
                            allowed="0 (one per rail) or a positive count")
