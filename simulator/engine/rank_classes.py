"""Which ranks of a pipeline stage folding must simulate apart: the symmetry classing rule.

Folding lets one rank stand for every rank of its stage, which is exact only where each of them meets the same
loads on its links. A collective that spans several hosts need not load every host alike: NCCL's ring runs one
way round through every other host (collectives/ring.py `ring_order`, so that its hops between hosts stay on one
rail), so a host's NVLink links carry k to k+1 on one host and k to k-1 on the next. A collective whose mirrors
lie on other hosts than its group (an expert-parallel all-to-all inside each host) and that may run beside such a
ring then meets it one way on half of the hosts and the other way on the rest, and ends at other times there
(14 us apart on the DeepSeek search's candidates, docs/architecture.md). So hosts are classed by what the links
of each of them carry of every such collective, and ranks by the classes of their hosts in every stage; folding
then simulates one representative per class and stage (parallel/folding.py `RankClasses`).

What a host carries of a collective is, per phase of its plan over every copy of its group (the group and its
mirrors), the transfers inside the host: both ends' indices in the host and the bytes; and, where its NVLink domain
holds other hosts (a GB200 rack's trays), the transfers it sends to them and receives from them over NVLink: its own
end's index and the bytes. A DP ring with two replicas per rack hops from one replica's tray to the other's over
NVLink and on to the next rack over the NICs, so one replica's GPUs send it over their NVLink ports and the other's
receive it there: read inside trays alone, one rank would stand for both and the TP collectives beside the ring
fall out of step (TP 8 x PP 4 on racks of 64 GPUs; tests/test_folding.py). For
a group with members on more than one host of some NVLink domain, each host is read also by the transfers leaving
its domain over its NICs: its own end's index, the bytes and the copy of the group it runs in (`_flow_codes`).
With the rings built rack by rack every tray's NVLink ports and NICs carry alike, but each tray sends to and
receives from its own peer tray of the next rack, and the fabric hashes each flow onto a spine by its hosts: read
by NVLink alone one rank stood for every tray of its stage, and the DP reduce-scatter would fall out of step (TP 8
x PP 4 x DP 4 on two racks of 16 trays; tests/test_folding.py). The hosts of one copy end it together, so only
hosts of unlike copies part: one rank per stage and tray of a TP group (8 of 128 ranks there, 2 of 32 where two
replicas share a rack; the bundled GB200 job, TP 4 x PP 2 x DP 36 on four racks of 18 trays, one class a stage,
the stage fold's 2 of 288), every figure the unfolded step's whether or not a rotation by whole periods of the hash
maps the wiring onto itself. Where some stage's hand-off stays inside its NVLink domain in one copy and leaves it
in another (`_hands_on_unlike`), such classes keep those trays together and the stage fold they leave is refused;
there, where a rotation maps the wiring onto itself, a transfer leaving the domain is read by its route's place in
the period of the hash instead, and such a fold simulates one rank per tray and stage, but for trays that a
rotation of the whole step by whole periods of the hash maps onto each other, which share a class (`_placed`: TP 8
x PP 2 x DP 9 on two racks of 18 trays, 36 of 144 ranks). Only
collectives that span several hosts are read (one inside a host is moved from host to host whole), and only those
that may overlap (engine/ordering.py) a collective that sends inside hosts and has mirrors on other hosts: where
nothing mirrored meets a ring on NVLink, its direction changes no simulated time. What else the NICs carry is left
to the checks of engine/symmetry.py: a tree's hosts carry unlike loads there by role, and classing by them would
simulate a rank of every host of a large job. Classes of unequal size are not used there: the fold then stays one
rank per stage, as the lockstep check after the run (engine/lockstep.py) guards.

Where that check finds only pipeline hand-offs out of step, hosts are classed also by the hops their hand-offs
between hosts take, then also by what they meet on them, then also by their places in the other collectives' plans
between hosts (`route_classes`): a replica's hand-off may cross the spines where another's stays in its leaf group,
and the fabric hashes each flow onto a spine by its hosts, their rails' difference and its channel, so one host's
hand-off can share a leaf's uplink with another collective's flows where its mirrors' do not (the DeepSeek search's
interleaved wrap from stage 15 to stage 0, docs/architecture.md), then also by their places in the period of the
spine hash, whose translates route alike, where the classes before are alike at every place (a DP ring leaves every
leaf group from its last hosts, over the spines). Those classes may be of unequal size: each representative then
stands for its class's size of ranks (parallel/folding.py `rank_weights`), which the summary's per-GPU means weigh
it by. The finest are hosts: where two ranks of one host hand on between the same two hosts over other rails, their
flows climb other leaves' uplinks and meet other collectives' cross-rail flows unlike, no refold holds and the step
runs unfolded (tests/test_folding.py `test_cross_rail_contention_unlike_between_lanes_or_groups_runs_unfolded`).

Under links down from the step's start, ranks are classed by their rail and, on the hosts near the links down,
by host, elsewhere also by the near ranks their groups hold (`link_fault_classes`): only flows to or from those
hosts take detours.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from simulator.engine.ordering import ProgramOrder
from simulator.engine.plans import PlanCache
from simulator.engine.shapes import CollectiveShapes
from simulator.engine.symmetry import link_kind_codes, overlapping, padded, routed
from simulator.parallel.experts import expert_group_numbers
from simulator.parallel.folding import RankClasses, representatives
from simulator.parallel.layout import Layout
from simulator.program.ops import CollectiveOp
from simulator.program.step import StepProgram
from simulator.topology.builders import Fabric
from simulator.topology.graph import Topology
from simulator.topology.periods import Rotation


def rank_classes(program: StepProgram, plans: PlanCache, shapes: CollectiveShapes, order: ProgramOrder,
                 between_hosts: bool = True) -> RankClasses | None:
    """The classes of ranks that ``program`` (folded, one representative per stage) must simulate apart by the
    loads their NVLink links carry, None where its ranks are all alike or the classes are of unequal size (the
    stage fold then runs, guarded by the lockstep check after it). Only a program that simulates its layout's
    representatives is classed (a trace simulates the ranks it has). ``between_hosts``: read also what hosts
    send one another over NVLink inside their domain (the module's docstring); the links-down fold leaves it out
    (its classes by the hosts near the links down, certified by the lockstep check after the run, fold TP 4 x PP 2
    x DP 4 on two GB200 racks with trays down exactly onto 24 of 32 ranks, where these would part every rank,
    tests/test_nvl72_rack_faults.py)."""
    host = np.asarray(plans.topology.gpu_host, dtype=np.int64)
    columns = _stage_hosts(program, host)
    if columns is None:
        return None
    nvlink = _nvlink_signatures(plans, shapes, order, host, between_hosts)
    return RankClasses.keyed([tuple(nvlink.get(h, ()) for h in column) for column in columns])


def route_classes(program: StepProgram, plans: PlanCache, shapes: CollectiveShapes, order: ProgramOrder,
                  hops_only: bool = False) -> Iterator[RankClasses]:
    """The classes to fold ``program`` (folded, one representative per stage) again by where its run's hand-offs
    fell out of step, coarsest first, each worked out only when drawn, where the one before fell out of step in its
    run: hosts classed by the hops their pipeline hand-offs' copies take (`_hop_signatures`: one representative per
    kind of hand-off route, weighted by how many ranks it stands for), then also by the loads the copies meet on
    those hops (`_route_signatures`, which took 183 s on the published SC21 529.6B row against none for the hops),
    then also by their places in the plans of the other collectives between hosts (`_place_signatures`: a DP tree's
    heights and depths), then also by their places in the period of the spine hash where the classes before are
    alike at every place (`_period_classes`), then one class per host of each stage (route loads counted before the
    run need not tell apart hosts whose hand-offs meet other flows at other times); each beside the hosts' NVLink
    loads (`_nvlink_signatures`), each proposal finer than or equal to the one before (keyed by its signatures and
    the earlier ones'; by host the finest), so that none simulates fewer ranks than the one before; classes of
    unequal size allowed but for the last, a proposal equal to an earlier one left out. With ``hops_only``, the
    classes by hops alone, if any. On the published SC21 145.6B row (24 replicas, 5 of which hand on across the
    spines) hops give two classes per stage, 16 of 1,536 ranks, and that run keeps pace; loads give seven (replicas
    0 and 23 and each crossing replica apart), 56 ranks; hosts 192. On the SC21 76.1B step (DP trees over 32 hosts,
    interleaved) the loads give two classes per stage, which fall out of step, and places five (the two roots
    together, then per height 1 to 4 in one tree the hosts that are leaves in the other: 16, 8, 4 and 2 hosts), 20
    of 1,024 ranks, which keep pace. On the Llama 3 70B step on 2,048 GPUs with TP 8 x PP 4 and the spines at 4:1,
    only the places in the leaf group part hosts: 32 ranks against 256 by host."""
    host = np.asarray(plans.topology.gpu_host, dtype=np.int64)
    columns = _stage_hosts(program, host)
    if columns is None:
        return
    nvlink = _nvlink_signatures(plans, shapes, order, host)
    keys: list[tuple] = [tuple(nvlink.get(h, ()) for h in column) for column in columns]
    proposed: list[RankClasses] = []
    signatures = (lambda: _hop_signatures(plans, shapes, host), lambda: _route_signatures(plans, shapes, order, host),
                  lambda: _place_signatures(plans, shapes, host))
    for signature_of in signatures[:1] if hops_only else signatures:
        signature = signature_of()
        keys = [(key, tuple(signature.get(h, b"") for h in column)) for key, column in zip(keys, columns)]
        classes = RankClasses.keyed(keys, unequal=True)
        if classes is not None and classes not in proposed:
            proposed.append(classes)
            yield classes
    by_period = None if hops_only else _period_classes(plans, host, columns, keys)
    if by_period is not None and by_period not in proposed:
        proposed.append(by_period)
        yield by_period
    by_host = None if hops_only else RankClasses.keyed(columns)
    if by_host is not None and by_host not in proposed:
        yield by_host


def link_fault_classes(program: StepProgram, topology: Topology, down: Sequence[tuple[str, str]],
                       nvlink: RankClasses | None) -> RankClasses | None:
    """The classes to fold ``program`` (folded, one representative per stage) by under the links ``down`` from
    the step's start: ranks keyed in every stage by their index in their host (their rail) and, where their host
    is near a link down (`hosts_near`), by the host itself, and elsewhere by the near ranks each of their groups
    holds (`_near_members`); beside the NVLink classes ``nvlink`` (`rank_classes`). Far from the links down a
    rank's flows detour only to or from the near hosts, so its collectives meet the detours as its class-mates'
    do where their groups hold the same near ranks: the checks do not compare a mate whose group holds a near
    representative, since that group is simulated as the representative's (keyed by rail alone, TP 16 over two
    hosts, DP 8, a leaf down: the step time exact, the DP communication 2.1% high). Near them a detour is picked
    by a hash of its ends, so near hosts differ (keyed by rail alone there, the fold onto 64 of 512 ranks under a
    leaf down fell out of step at a hand-off: hosts 0 and 8 of the failed leaf's group met other flows). A
    proposal, held to the checks of any classed fold (`fold_policy.link_fault_step`). Under a leaf down on 2,048
    GPUs in leaf groups of 32 hosts (TP 8 in a host) it simulates 288 ranks: the leaf group's 256 and one per rail
    and stage (every far rank of a rail and stage is in one DP group)."""
    host = np.asarray(topology.gpu_host, dtype=np.int64)
    local = np.asarray(topology.gpu_local, dtype=np.int64)
    layout = program.layout
    if layout is None or _stage_hosts(program, host) is None:
        return None
    near = hosts_near(topology, down)
    shared = _near_members(program, host, near)
    stages = np.array([layout.stage_ranks(stage) for stage in range(layout.pp)], dtype=np.int64).T
    base = [()] * len(stages) if nvlink is None else [(number,) for number in nvlink.of_position]
    keys = [(*key, tuple((int(local[rank]), int(host[rank]) if host[rank] in near else None, shared.get(rank, ()))
                         for rank in ranks.tolist())) for key, ranks in zip(base, stages)]
    return RankClasses.keyed(keys, unequal=True)


def _near_members(program: StepProgram, host: np.ndarray, near: set[int]) -> dict[int, tuple[tuple[int, ...], ...]]:
    """Per rank off the ``near`` hosts, the ranks on them that each of its collectives' groups holds (every copy
    of every collective of ``program``: its group and mirrors), sorted; ranks whose groups hold no near rank are
    left out. Two ranks of one rail whose groups hold other near ranks meet the detours unlike (TP 16 over two
    hosts, DP 8, a leaf down: the DP groups of even and odd hosts hold other near ranks, and their DP
    communication took 8.4 against 6.8 ms)."""
    groups = {copy for op in program.ops if isinstance(op, CollectiveOp) for copy in (op.group, *op.mirrors)}
    found: dict[int, set[tuple[int, ...]]] = {}
    for group in groups:
        members = tuple(sorted(rank for rank in group if host[rank] in near))
        if members:
            for rank in group:
                if host[rank] not in near:
                    found.setdefault(rank, set()).add(members)
    return {rank: tuple(sorted(members)) for rank, members in found.items()}


class LinkFaultRanks:
    """How many ranks a step folded by `link_fault_classes` simulates under some links down, counted from the
    layout and the cluster alone (no step built, no route read), NVLink classes aside: one per pipeline stage
    for each position in a stage that has a rank on a host near them (each its own class), and one per stage
    for each class of the other positions keyed as the fold keys them: by their rails across the stages and the
    near ranks that each of their ranks' groups holds (`_near_members`), the groups being the layout's TP, CP
    and DP x CP (gradient) groups and, with ``ep`` > 1, the EP and expert-DP groups (`experts.ep_group`,
    `experts.expert_dp_group`; a far position's pipeline group is its own ranks, all far). With TP 16 over two
    hosts and DP 8 under a leaf down, 48 ranks, as the fold; by rail alone it counted 40; with TP 8, DP 16 and
    EP 8, 72, where without the EP groups it counted 40. HSDP's shard and replica groups need no reading of their
    own: a far rank's shard group lies on its host (one across hosts is refused), all far, and its replica group
    holds the near ranks of its DP x CP group at its place in their shard groups, which its rail fixes, so the
    DP x CP group and the rails part the ranks as those groups do (tests/test_link_fault_folding.py's HSDP
    cases). What a job's refusal of its degraded states sizes them by before it simulates
    any (reliability/simulate.py), once per state it foresees: ~2 ms of CPU per set of hosts near at 16,384 GPUs
    (0.45 s for the 512 leaves, which leave 64 such sets; by rail alone 0.35 s)."""

    def __init__(self, layout: Layout, topology: Topology, ep: int = 1) -> None:
        self.topology = topology
        self.pp = layout.pp
        self.stages = np.array([layout.stage_ranks(stage) for stage in range(layout.pp)], dtype=np.int64).T
        self.gpu_host = np.asarray(topology.gpu_host, dtype=np.int64)
        rails = np.asarray(topology.gpu_local, dtype=np.int64)[self.stages]
        self.patterns = np.unique(rails, axis=0, return_inverse=True)[1].reshape(-1)
        self.groups = [_layout_groups(layout, dims) for dims in (("tp",), ("cp",), ("dp", "cp"))
                       if math.prod(layout.degree(dim) for dim in dims) > 1]
        if ep > 1:
            self.groups += [_numbered_groups(numbers) for numbers in expert_group_numbers(layout, ep)]
        self.hosts = int(self.gpu_host.max()) + 1
        self.counted: dict[frozenset[int], int] = {}
        self._around: dict[str, tuple[int, ...]] = {}

    def __call__(self, down: Sequence[tuple[str, str]]) -> int:
        """The ranks simulated under the links ``down`` (node pairs), counted once per set of hosts near them
        (every cable of a leaf, to its hosts or its spines, leaves the leaf's hosts near)."""
        near_hosts = frozenset(host for node in {node for edge in down for node in edge}
                               for host in self._hosts_around(node))
        if near_hosts not in self.counted:
            self.counted[near_hosts] = self._count(near_hosts)
        return self.counted[near_hosts]

    def _count(self, near_hosts: frozenset[int]) -> int:
        mask = np.zeros(self.hosts, dtype=bool)
        mask[sorted(near_hosts)] = True
        near = mask[self.gpu_host]
        near_position = near[self.stages].any(axis=1)
        shared = self._near_members(near)[self.stages[~near_position]]
        patterns = self.patterns[~near_position]
        holding = shared.any(axis=1)
        classes = np.unique(patterns[~holding]).size + _distinct_rows(np.column_stack((patterns, shared))[holding])
        return self.pp * (int(near_position.sum()) + classes)

    def _near_members(self, near: np.ndarray) -> np.ndarray:
        """Per rank, the near ranks (``near``: per GPU) that each of its groups holds, as `_near_members` keys
        them: one number per distinct set of near ranks, a rank's distinct ones sorted and read as the digits of
        one number, 0 for none. Only the groups that hold a near rank are read (a NIC down at 16,384 GPUs, its
        leaf's hosts near: 160 of 2,176)."""
        near_ranks = np.flatnonzero(near)
        sets = np.full((len(near), len(self.groups)), -1, dtype=np.int64)
        numbers: dict[tuple[int, ...], int] = {}
        for kind, (rows, row_of) in enumerate(self.groups):
            holding = np.unique(row_of[near_ranks])
            of_group = np.full(len(rows), -1, dtype=np.int64)
            of_group[holding] = [numbers.setdefault(tuple(members[near[members]].tolist()), len(numbers))
                                 for members in rows[holding]]
            sets[:, kind] = of_group[row_of]
        touched = np.flatnonzero((sets >= 0).any(axis=1))
        distinct = np.sort(sets[touched], axis=1)
        distinct[:, :-1][distinct[:, :-1] == distinct[:, 1:]] = -1
        codes = np.zeros(len(near), dtype=np.int64)
        codes[touched] = (np.sort(distinct, axis=1) + 1) @ (len(numbers) + 1) ** np.arange(len(self.groups))
        return codes

    def _hosts_around(self, node: str) -> tuple[int, ...]:
        """`hosts_near` one end of a link, remembered per node: a job's forecast counts the ranks of every state
        it foresees (19,663 on the 16,384-GPU job with a leaf switch class, ~1.3 ms each when every call walked
        each leaf's hosts again)."""
        if node not in self._around:
            self._around[node] = tuple(sorted(hosts_near(self.topology, [(node, node)])))
        return self._around[node]


def hosts_near(topology: Topology, down: Sequence[tuple[str, str]]) -> set[int]:
    """The hosts near the links ``down`` (node pairs): a host with a node at either end of one (a NIC's cable),
    or wired to a switch at either end (a leaf's hosts, for a leaf's links or a cable to its spine)."""
    graph = topology.graph
    ends = {node for edge in down for node in edge}
    around = ends | {neighbour for node in ends if graph.nodes[node].get("host") is None
                     for neighbour in graph.successors(node)}
    return {graph.nodes[node]["host"] for node in around if graph.nodes[node].get("host") is not None}


def _stage_hosts(program: StepProgram, host: np.ndarray) -> list[tuple[int, ...]] | None:
    """Per position in a pipeline stage (`Layout.stage_ranks` order), the hosts (``host`` of each GPU) of its
    ranks in every stage; None where ``program`` is not folded with one representative per stage of its layout."""
    layout = program.layout
    if layout is None or not program.folded or program.ranks != tuple(representatives(layout, True)):
        return None
    stages = np.array([host[np.array(layout.stage_ranks(stage), dtype=np.int64)] for stage in range(layout.pp)])
    return [tuple(column.tolist()) for column in stages.T]


def _nvlink_signatures(plans: PlanCache, shapes: CollectiveShapes, order: ProgramOrder, host: np.ndarray,
                       between_hosts: bool = True) -> Mapping[int, tuple[bytes | int, ...]]:
    """Per host, what its NVLink links carry of the collectives that span hosts and load them unlike, where
    something mirrored on other hosts may meet them (empty where none do); ``between_hosts``: also what it sends
    to and receives from the other hosts of its NVLink domain."""
    topology = plans.topology
    domain = np.asarray(topology.gpu_domain) if between_hosts else host
    kinds = _multi_host_kinds(shapes, plans, host, domain)
    several_a_domain = between_hosts and bool(kinds) and domain.max() < host.max()
    fabric = _rotating_fabric(topology) if several_a_domain and _hands_on_unlike(shapes, domain) else None
    carried = {kind: _carried(plans, shapes.firsts[shapes_of[0]], host, np.asarray(topology.gpu_local), domain,
                              between_hosts, fabric) for kind, shapes_of in kinds.items()}
    unlike = {kind: loads for kind, (loads, _) in carried.items() if len(set(loads.values())) > 1}
    if not unlike:
        return {}
    met = _met_by_mirrored(shapes, order, [shape for kind in unlike for shape in kinds[kind]], host)
    relevant = [kind for kind in unlike if met.intersection(kinds[kind])]
    signatures = {h: tuple(unlike[kind].get(h, b"") for kind in relevant) for h in range(int(host.max()) + 1)}
    leaving = set().union(*(carried[kind][1] for kind in relevant))
    return _placed(signatures, leaving, fabric, host) if relevant else {}


def _placed(signatures: dict[int, tuple[bytes, ...]], leaving: set[int], fabric: Fabric | None, host: np.ndarray
            ) -> Mapping[int, tuple[bytes | int, ...]]:
    """``signatures`` with each host of ``leaving`` (those whose transfers leave their NVLink domain) keyed also
    by its place in the step's rotation period: the fewest whole periods of ``fabric``'s spine hash whose rotation
    maps every host's signature onto its image's, every host where none does (each such host then apart from
    every other); ``signatures`` as they are where there is no such fabric (their transfers leaving a domain keyed
    by their copy, `_flow_codes`). The signatures read the routes leaving a domain by their codes
    (`_flow_codes`), which a rotation keeps, so hosts a rotation of the step maps onto each other are keyed
    alike, and only they: on four GB200 racks the DP rings run one way through one rack and the other way
    through the next, and rotated by two racks the step is its own image (TP 8 x PP 2 x DP 18: 36 of 288 ranks,
    one a tray of two racks); on two racks none is, and every tray is simulated apart (TP 8 x PP 2 x DP 9, 36 of
    144)."""
    if not leaving or fabric is None:
        return signatures
    hosts = len(signatures)
    period = int(host[fabric.shift_gpus])
    turns = hosts // period
    shift = next((k * period for k in range(1, turns) if turns % k == 0
                  and all(signatures[h] == signatures[(h + k * period) % hosts] for h in range(hosts))), hosts)
    return {h: (*signature, h % shift) if h in leaving else signature for h, signature in signatures.items()}


def _route_signatures(plans: PlanCache, shapes: CollectiveShapes, order: ProgramOrder, host: np.ndarray
                      ) -> dict[int, bytes]:
    """Per host, the hops its pipeline hand-offs between hosts take and the loads they meet on them, where the copies of
    a hand-off (its group and mirrors) take unlike hops or meet unlike loads: per hand-off shape and combination of
    collectives between hosts that may overlap its instances (`overlapping`), for each copy with an end on the host,
    that end's role and index in the host and, link by link along the copy's route, the link's kind (bandwidth and
    class, its hop signature) and how many transfers between hosts of its own copies and of the overlapping
    collectives' copies cross it (empty where every copy takes the same hops and meets the same loads). A copy
    routed inside its leaf group takes fewer hops than one across the spines, so the replica whose hand-off crosses
    the spines is simulated apart from one whose hand-off does not. The fabric hashes each flow onto a spine by
    its hosts and rails (topology/builders.py `Fabric`), so one host's hand-off can share an uplink with another
    collective's flows where its mirrors' do not, and end later (docs/architecture.md). The counts of a combination
    are summed, so loads that are mirror images can cancel and leave hosts unparted that meet them unlike
    (engine/symmetry.py judges each load on its own for that reason): these classes are a proposal, not a guard; a
    refold on classes too coarse is held to the same checks as any fold (`fold_verdict` before its run, the lockstep
    check after it), and where it fails them the next refold or the unfolded step runs."""
    topology = plans.topology
    local = np.asarray(topology.gpu_local, dtype=np.int64)
    between = [shape for shape, op in enumerate(shapes.firsts)
               if op.nbytes and len(np.unique(host[np.array(op.group, dtype=np.int64)])) > 1]
    hand_offs = [shape for shape in between if shapes.firsts[shape].op == "send_recv"]
    routes = {shape: _copy_routes(plans, shapes.firsts[shape], host) for shape in between}
    counts = {shape: crossed for shape, (_, crossed) in routes.items()}
    overlaps = overlapping(shapes, order, between)
    kinds = np.append(link_kind_codes(topology), -1)
    found: dict[int, list[bytes]] = {}
    for shape in hand_offs:
        op, table = shapes.firsts[shape], routes[shape][0]
        ends = np.array([(copy[0], copy[-1]) for copy in (op.group, *op.mirrors)], dtype=np.int64)
        for number, met_by in enumerate([(), *overlaps(shape)]):
            load = np.hstack((kinds[table], np.append(sum((counts[other] for other in met_by), counts[shape]),
                                                      -1)[table]))
            if (load == load[0]).all():
                continue
            for (src, dst), row in zip(ends.tolist(), load):
                entry = np.concatenate(([shape, number, local[src], local[dst]], row)).tobytes()
                found.setdefault(int(host[src]), []).append(b"s" + entry)
                found.setdefault(int(host[dst]), []).append(b"r" + entry)
    return {h: b"".join(sorted(entries)) for h, entries in found.items()}


def _hop_signatures(plans: PlanCache, shapes: CollectiveShapes, host: np.ndarray) -> dict[int, tuple]:
    """Per host, the hops its pipeline hand-offs' copies take (`Topology.hop_signatures`), where the copies of a
    hand-off (its group and mirrors) take unlike hops: per such hand-off shape, for each copy with an end on the
    host, that end's role and index in the host and the copy's hops (empty where every hand-off's copies take the
    same hops).
    A copy routed inside its leaf group crosses fewer hops than one across the spines, and ends a switch hop's
    latency sooner alone."""
    topology = plans.topology
    local = np.asarray(topology.gpu_local, dtype=np.int64)
    found: dict[int, list[tuple]] = {}
    for shape, op in enumerate(shapes.firsts):
        if op.op != "send_recv" or not op.nbytes or not op.mirrors:
            continue
        copies = (op.group, *op.mirrors)
        hops = topology.hop_signatures([copy[0] for copy in copies], [copy[-1] for copy in copies])
        if len(set(hops)) == 1:
            continue
        for copy, route in zip(copies, hops):
            entry = (shape, int(local[copy[0]]), int(local[copy[-1]]), route)
            found.setdefault(int(host[copy[0]]), []).append(("s", *entry))
            found.setdefault(int(host[copy[-1]]), []).append(("r", *entry))
    return {h: tuple(sorted(entries)) for h, entries in found.items()}


def _place_signatures(plans: PlanCache, shapes: CollectiveShapes, host: np.ndarray) -> dict[int, tuple]:
    """Per host, its place in the plans of the collectives other than hand-offs that span several hosts: per such
    shape and phase of its plan over its group, how many transfers between hosts of each size the host sends and
    receives (nothing where every host of the group sends and receives alike in every phase; a host in no group that
    differs is absent, which `route_classes` keys as b""). A ring loads every host alike; NCCL's double binary tree
    does not (collectives/tree.py `double_binary_tree`): a root's NICs carry 2 tree edges where the others' carry 4,
    and an edge starts at its child's height (up) or its parent's depth (down), so a host's phases tell its heights
    and depths in both trees, which tree aside (the second mirrors the first, and each carries half the bytes).
    Hosts whose hand-offs meet the trees' flows at other times are then simulated apart, while hosts of like places
    in the trees (a leaf of one tree that is a parent of leaves in the other, 16 of 32 hosts) keep one
    representative."""
    found: dict[int, Counter] = {}
    for shape, op in enumerate(shapes.firsts):
        members = host[np.array(op.group, dtype=np.int64)]
        if op.op == "send_recv" or not op.nbytes or len(np.unique(members)) == 1:
            continue
        loads: dict[int, Counter] = {int(h): Counter() for h in members.tolist()}
        for number, phase in enumerate(plans.phases(op, op.group)):
            for transfer in phase.transfers:
                src, dst = int(host[transfer.src]), int(host[transfer.dst])
                if src != dst:
                    loads[src][(shape, number, "s", transfer.nbytes, phase.repeat)] += 1
                    loads[dst][(shape, number, "r", transfer.nbytes, phase.repeat)] += 1
        if len({frozenset(load.items()) for load in loads.values()}) > 1:
            for h, load in loads.items():
                found.setdefault(h, Counter()).update(load)
    return {h: tuple(sorted(load.items())) for h, load in found.items()}


def _period_classes(plans: PlanCache, host: np.ndarray, columns: Sequence[tuple[int, ...]], keys: Sequence[tuple]
                    ) -> RankClasses | None:
    """The positions (``columns``: their hosts in every stage) classed by their hosts' places in the period of the
    spine hash beside their ``keys`` (the signatures before), where those keys are alike at every place (so the
    step's hand-offs and collectives between hosts look alike under a translation by whole periods, as far as the
    signatures tell); None where the fabric has no period or the keys part hosts at one place (NCCL's trees number
    hosts from the first, so a host's place in them is not its translate's: classed by both, 52 of 64 ranks fell
    out of step on tests/test_fold_equivalence.py's trees on two leaves)."""
    place = _period_signatures(plans, host)
    if not place:
        return None
    alone = [tuple(place[h] for h in column) for column in columns]
    classes = RankClasses.keyed(list(zip(keys, alone)), unequal=True)
    return classes if classes == RankClasses.keyed(alone, unequal=True) else None


def _period_signatures(plans: PlanCache, host: np.ndarray) -> dict[int, int]:
    """Per host, its place in the period of the fabric's spine hash (a leaf group, a pod with three tiers): its
    first GPU's index modulo the period's GPUs (nothing where the fabric has no translations or one period only).
    A translation by whole periods moves every route onto its translate's links (topology/periods.py), so hosts at
    one place of their periods meet the same loads wherever the step is alike under that translation (a DP ring
    over hosts in turn, whose hops across the spines leave every period from its last host), which the lockstep
    check after the run certifies; hosts at other places need not: with oversubscribed spines a DP ring's hop
    across them is slower than those inside a leaf group, so the hand-offs of a period's last hosts meet it longer."""
    periods = plans.translations()
    gpus = len(host)
    if periods is None or periods.period >= gpus:
        return {}
    first = np.full(int(host.max()) + 1, gpus, dtype=np.int64)
    np.minimum.at(first, host, np.arange(gpus, dtype=np.int64))
    return {h: int(gpu % periods.period) for h, gpu in enumerate(first.tolist())}


def _copy_routes(plans: PlanCache, op: CollectiveOp, host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``op``'s plan over each copy of its group (the group, then its mirrors), routed once (symmetry.py
    `routed`): per copy, the links of its transfers' routes in plan order, padded with one past the last link id
    to the longest; and how many of its transfers between hosts, over every copy, cross each directed link."""
    topology = plans.topology
    copies = [[t for phase in plans.phases(op, copy) for t in phase.transfers] for copy in (op.group, *op.mirrors)]
    transfers = [t for copy in copies for t in copy]
    lengths, links = routed(topology, transfers)
    between = np.array([host[t.src] != host[t.dst] for t in transfers], dtype=bool)
    per_copy = np.diff(np.append(0, np.cumsum(lengths))[np.cumsum([0, *map(len, copies)])])
    crossed = np.bincount(links[np.repeat(between, lengths)], minlength=len(topology.link_class))
    return padded(per_copy, links, len(topology.link_class)), crossed


def _multi_host_kinds(shapes: CollectiveShapes, plans: PlanCache, host: np.ndarray, domain: np.ndarray
                      ) -> dict[tuple, list[int]]:
    """The collectives whose groups span several hosts with more than one member on some host or NVLink domain
    (one member per domain sends nothing over NVLink; pipeline hand-offs aside: a send loads its two ends alike
    wherever it lies), by kind (primitive, root, algorithm, group), each with its shapes (indices into
    ``shapes.firsts``), the first that sends anything first."""
    kinds: dict[tuple, list[int]] = {}
    spanning: dict[int, bool] = {}
    for shape, op in enumerate(shapes.firsts):
        if op.op == "send_recv":
            continue
        group = shapes.group_of_shape[shape]
        if group not in spanning:
            members = np.array(op.group, dtype=np.int64)
            per_host = np.unique(host[members], return_counts=True)[1]
            per_domain = np.unique(domain[members], return_counts=True)[1]
            spanning[group] = len(per_host) > 1 and (per_host.max() > 1 or per_domain.max() > 1)
        if not spanning[group]:
            continue
        kind = (op.op, op.root, plans.resolved_algorithm(op, op.group), group)
        kinds.setdefault(kind, []).append(shape)
    ordered = {kind: sorted(found, key=lambda shape: not shapes.firsts[shape].nbytes) for kind, found in kinds.items()}
    return {kind: found for kind, found in ordered.items() if shapes.firsts[found[0]].nbytes}


def _carried(plans: PlanCache, op: CollectiveOp, host: np.ndarray, local: np.ndarray, domain: np.ndarray,
             between_hosts: bool, fabric: Fabric | None = None) -> tuple[dict[int, bytes], set[int]]:
    """What each host's NVLink links carry of ``op`` over its group and every mirror: per phase, the transfers
    inside the host as (phase, sender's index in the host, receiver's, bytes), and those to or from another host
    of its NVLink domain with -1 for the index of the end there, and with ``between_hosts`` where ``op``'s group
    has members on more than one host of some domain, those leaving the domain with -2 - the route's code
    (`_flow_codes` over ``fabric``, or the copy's number without one) for the index of the other end, sorted, as
    bytes (empty for a host the collective crosses without such a transfer); and the hosts with transfers leaving
    their domain."""
    parts = [np.zeros((0, 5))]
    copies = (op.group, *op.mirrors)
    members = np.array(op.group, dtype=np.int64)
    trays = np.unique(np.column_stack((domain[members], host[members])), axis=0)
    nic_ends = between_hosts and np.unique(trays[:, 0], return_counts=True)[1].max() > 1
    crossed = np.unique(host[np.concatenate([np.array(copy, dtype=np.int64) for copy in copies])])
    carried = dict.fromkeys(crossed.tolist(), b"")
    for number, group in enumerate(copies):
        for index, phase in enumerate(plans.phases(op, group)):
            transfers = np.array(phase.transfers, dtype=np.float64).reshape(-1, 5)
            src, dst = transfers[:, 0].astype(np.int64), transfers[:, 1].astype(np.int64)
            inside = host[src] == host[dst]
            parts.append(np.column_stack((host[src], np.full(len(src), index), local[src], local[dst],
                                          transfers[:, 2]))[inside])
            across = ~inside & (domain[src] == domain[dst])
            phase_of = np.full(len(src), index)
            parts.append(np.column_stack((host[src], phase_of, local[src], np.full(len(src), -1),
                                          transfers[:, 2]))[across])
            parts.append(np.column_stack((host[dst], phase_of, np.full(len(src), -1), local[dst],
                                          transfers[:, 2]))[across])
            if nic_ends:
                leaving = domain[src] != domain[dst]
                source, destination = _flow_codes(fabric, src, dst, transfers[:, 3].astype(np.int64), local, number)
                parts.append(np.column_stack((host[src], phase_of, local[src], -2 - destination,
                                              transfers[:, 2]))[leaving])
                parts.append(np.column_stack((host[dst], phase_of, -2 - source, local[dst],
                                              transfers[:, 2]))[leaving])
    table = np.concatenate(parts)
    table = table[np.lexsort(table.T[::-1])]
    bounds = np.flatnonzero(np.diff(table[:, 0], prepend=-1, append=-1))
    carried.update((int(table[start, 0]), table[start:end, 1:].tobytes()) for start, end in zip(bounds, bounds[1:]))
    leaving = np.minimum(table[:, 2], table[:, 3]) <= -2
    return carried, set(np.unique(table[leaving, 0]).astype(np.int64).tolist())


CHANNEL_CODES = 1 << 16
"""Channels a route's code (`_flow_codes`) tells apart, far beyond NCCL's 32."""


def _hands_on_unlike(shapes: CollectiveShapes, domain: np.ndarray) -> bool:
    """Whether some pipeline hand-off stays inside its NVLink domain (``domain`` of each GPU) in one copy and
    leaves it in another (stages not aligned to the domains: TP 8 x PP 2 x DP 9 on two racks of 18 trays, where
    the fifth replica's stages straddle the racks), so that the classes must part its trays from the others',
    which the copy key does not (`_flow_codes`): it keys them alike, the stage fold runs and its check refuses
    the unlike hand-offs (symmetry.py `UnalignedHandOff`), 144 ranks where the rotation's classes fold onto 36
    with every figure the unfolded step's."""
    for op in shapes.firsts:
        if op.op == "send_recv" and op.mirrors:
            ends = domain[np.array((op.group, *op.mirrors), dtype=np.int64)]
            inside = ends[:, 0] == ends[:, 1]
            if inside.any() and not inside.all():
                return True
    return False


def _rotating_fabric(topology: Topology) -> Fabric | None:
    """``topology``'s router where its rotations by whole periods of the spine hash map the wiring onto itself
    (topology/periods.py `Rotation`) and the hash's offsets wrap around its hosts alone (no hosts wired beyond
    them, `fabric_hosts`): a route's code (`_flow_codes`) then tells it from its rotations' routes by nothing
    but its place; None elsewhere."""
    fabric = topology.router
    if not isinstance(fabric, Fabric) or Rotation.of(topology) is None:
        return None
    return fabric if fabric.flow_keys == max(fabric.flow_key) + 1 else None


def _flow_codes(fabric: Fabric | None, src: np.ndarray, dst: np.ndarray, channel: np.ndarray, local: np.ndarray,
                copy: int) -> tuple[np.ndarray, np.ndarray]:
    """Per transfer between hosts, what `_carried` reads its route by beside its own end, with the index in its
    host of the source's end (the code its receiver keys by) and of the destination's (its sender's). Where
    ``fabric`` is None (`_nvlink_signatures` passes one only where stages hand on unlike, `_hands_on_unlike`, and
    the fabric rotates, `_rotating_fabric`), the number of the copy the transfer runs in (``copy``: its group or a
    mirror): every host of a copy ends it together, when its last flow ends, wherever those flows cross the
    spines, so the routes part only hosts of unlike copies (four racks of 16 trays in leaf groups of 18 at TP 8 x
    PP 4 x DP 8: 8 of 256 ranks, one per stage and tray of a TP group; keyed by the hosts at the other ends, every
    tray apart, 64; the bundled GB200 job, TP 4 x PP 2 x DP 36 on four racks of 18 trays, each its own period of
    the hash: 2 of 288, 36 keyed by the fabric below, with the same figures). Over ``fabric``: the source's place
    in the period of the spine hash, the destination's offset from it and the channel, as the `Fabric` router
    mixes them; a rotation by whole periods moves such a route onto its image's links, so two trays at one place
    of their racks that send their rings to like offsets carry alike, where the hosts themselves part every tray
    of a job of several racks."""
    ends = int(local.max()) + 1
    if fabric is None:
        return copy * ends + local[src], copy * ends + local[dst]
    key = np.asarray(fabric.flow_key, dtype=np.int64)
    route = ((key[src] % fabric.shift_period) * fabric.flow_keys + (key[dst] - key[src]) % fabric.flow_keys
             ) * CHANNEL_CODES + channel
    return route * ends + local[src], route * ends + local[dst]


def _met_by_mirrored(shapes: CollectiveShapes, order: ProgramOrder, among: Sequence[int], host: np.ndarray
                     ) -> set[int]:
    """Those of ``among`` (shapes) that may overlap an instance of a collective that sends inside hosts and has
    mirrors on other hosts (`_mirrored_inside_hosts`)."""
    met_by = overlapping(shapes, order, among)
    return {other for shape, op in enumerate(shapes.firsts) if _mirrored_inside_hosts(op, host)
            for combination in met_by(shape) for other in combination}


def _mirrored_inside_hosts(op: CollectiveOp, host: np.ndarray) -> bool:
    """Whether ``op`` has two members on one host (so that it meets NVLink loads; a transfer between hosts
    leaves by the NIC) and a mirror on other hosts than its group (a copy on the same hosts, another TP lane's
    ring, meets what its group meets)."""
    placed = host[np.array(op.group, dtype=np.int64)]
    if len(np.unique(placed)) == len(placed):
        return False
    own = set(placed.tolist())
    return any(set(host[np.array(mirror, dtype=np.int64)].tolist()) != own for mirror in op.mirrors)


def _distinct_rows(rows: np.ndarray) -> int:
    """How many distinct rows the integer matrix ``rows`` holds."""
    ordered = rows[np.lexsort(rows.T)]
    return min(len(rows), 1) + int((ordered[1:] != ordered[:-1]).any(axis=1).sum())


def _numbered_groups(numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The groups of ranks that share a number (``numbers``: per rank, every group as large), as
    `_layout_groups` gives them: one row each with its ranks ascending, and each rank's row."""
    row = np.unique(numbers, return_inverse=True)[1].reshape(-1)
    return np.argsort(row, kind="stable").reshape(row.max() + 1, -1), row


def _layout_groups(layout: Layout, dims: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Every group of ``layout``'s ranks that differ only in ``dims`` (`Layout.combined_group`), one row each with
    its ranks ascending, and each rank's row."""
    ranks = np.arange(layout.world, dtype=np.int64)
    base, offsets = ranks.copy(), np.zeros(1, dtype=np.int64)
    for dim in dims:
        stride, degree = layout.stride(dim), layout.degree(dim)
        base -= (ranks // stride) % degree * stride
        offsets = (offsets[:, None] + stride * np.arange(degree)).reshape(-1)
    starts, row = np.unique(base, return_inverse=True)
    return np.sort(starts[:, None] + offsets, axis=1), row.reshape(-1)
