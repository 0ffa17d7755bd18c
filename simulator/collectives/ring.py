"""Ring algorithms: all-reduce, reduce-scatter and all-gather over one ring per channel, and the
pipelined chain (a ring cut open at the root) for broadcast and reduce.

Across hosts the rings are rail-aligned as NCCL builds them: inside each host a channel's ring enters and
leaves through GPUs whose local indices match those of the neighbouring hosts, so every cross-host hop
stays on one rail, and the channels take the host's NICs in turn, so that every NIC carries as many rings as
any other (`first_member`).

The "host" of a ring is an NVLink domain (`group_by_domain`): a DGX server, or a whole GB200 NVL72 rack of 18
trays, which NCCL under MNNVL treats as one node with the NICs of all its trays (a ring crosses the rack's
NVLink once and leaves it through any of its members' NICs).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import replace
from itertools import chain, repeat

from simulator.catalog.calibration import max_channels, network_channels_per_nic
from simulator.collectives.channels import first_member
from simulator.collectives.chunking import ChunkSetting, pipeline_chunk
from simulator.collectives.names import ALGORITHM_OPS, Protocol
from simulator.collectives.phases import CollectiveRequest, Phase, Transfer
from simulator.collectives.tree import chunk_count, pipelined_phases
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

OPS = ALGORITHM_OPS["ring"]

RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1, "all_gather": lambda n: n - 1}
"""Ring steps per op for n ranks; each step moves nbytes / n per rank (split over the channels)."""


def group_by_host(ranks: tuple[int, ...], topology: Topology) -> list[list[int]]:
    """The group's members per host, hosts in order of first appearance, members by local index."""
    hosts: dict[int, list[int]] = {}
    host_of, local = topology.gpu_host, topology.gpu_local
    for rank in ranks:
        hosts.setdefault(host_of[rank], []).append(rank)
    return [members if len(members) == 1 else sorted(members, key=local.__getitem__) for members in hosts.values()]


def group_by_domain(ranks: tuple[int, ...], topology: Topology) -> list[list[int]]:
    """The group's members per NVLink domain, domains in order of first appearance, members by their index in
    the domain (`Topology.gpu_domain_local`): `group_by_host` where every domain is one host, and where any member
    has lost every link to its NVSwitches (every NVSwitch tray of a GB200 rack down: its trays then reach each
    other over their NICs, hosts of their own again, `nvls.switches_up`). One such rack sends the whole group,
    every rack of it, to planning by host (tray), as NCCL's MNNVL check is all or nothing for a communicator
    (src/mnnvl.cc ncclMnnvlCheck: any rank whose fabric is not up turns MNNVL off for every rank)."""
    from simulator.collectives.nvls import switches_up  # nvls builds on this module

    if not switches_up(ranks, topology):
        return group_by_host(ranks, topology)
    domains: dict[int, list[int]] = {}
    domain_of, local = topology.gpu_domain, topology.gpu_domain_local
    for rank in ranks:
        domains.setdefault(domain_of[rank], []).append(rank)
    return [members if len(members) == 1 else sorted(members, key=local.__getitem__)
            for members in domains.values()]


def rails_used(topology: Topology, hosts: list[list[int]]) -> int:
    """Distinct rails a group spanning hosts (or NVLink domains) can leave each on: the NICs of the hosts its
    members sit on there (a host's ``topology.rails``; a GB200 rack's members on 18 trays: 72), at most its
    smallest member count, since only that many distinct exit GPUs exist, at most the fewest NICs its members
    drive on any one host (`nics_used`: NCCL's topology holds only the communicator's GPUs, src/graph/topo.cc
    ncclTopoGetSystem adding those of its ranks and never a GPU outside it, paths.cc ncclTopoTrimSystem removing
    those of other NVLink domains, and its search finds the channels over the NICs local to those GPUs,
    search.cc ncclTopoSelectNets, each host's count cut to the fewest of any rank's), and at most the ring
    channels NCCL's search looks for (`ring_search_channels`)."""
    host = topology.gpu_host
    rails = topology.rails * min(len({host[rank] for rank in members}) for members in hosts)
    return domain_rails(rails, min(len(members) for members in hosts), nics_used(topology, hosts))


def domain_rails(rails: int, fewest_members: int, fewest_nics: int) -> int:
    """`rails_used` from the NICs of the hosts the group's members sit on in a domain (the fewest of any domain),
    the fewest members any domain holds and the fewest NICs they drive on one (`fewest_nics`); also read by
    scale.py, which counts flows before the cluster is built."""
    return min(usable_rails(rails, fewest_members), fewest_nics, ring_search_channels())


RING_SEARCH_CHANNELS = 16
"""The ring channels NCCL's search finds across GB200 NVL72 racks, each through a NIC of its own: it adds channels
at one speed until their bandwidth covers the GPU's (src/graph/search.cc ncclTopoCompute: nChannels * bwInter >=
totalBw), the GPU's NVLink in NCCL's model 18 links x 40.1 GB/s (topo.h SM100_NVLINK_BW) = 721.8 GB/s, each
channel at a 400G NIC's 45.1 GB/s (sm100SpeedArrayInter): 16. Not MAXCHANNELS / 2, the search's own cap, which is
32 (device.h MAXCHANNELS 64; init.cc ringGraph->maxChannels)."""


def ring_search_channels() -> int:
    """The most ring channels across NVLink domains, `RING_SEARCH_CHANNELS`, under the catalog's channel cap
    (``nccl.max_channels``): at most 16 distinct NICs carry a ring between racks. At 32 channels, 20 racks' ring
    ran 242 and 458 GB/s at 1 and 4 GiB, against 219 and 346 measured (16: 223 and 394)."""
    return min(RING_SEARCH_CHANNELS, max_channels())


def usable_rails(rails: int, fewest_members: int) -> int:
    """`rails_used` from the host's rail count and the fewest members any one host of the group holds (also read
    by scale.py, which counts flows before the cluster is built)."""
    return max(1, min(rails, fewest_members))


def cross_host_channels(rails: int) -> int:
    """The rings of a group spanning hosts that can use ``rails`` rails (`channel_count` unasked)."""
    return max(network_channels_per_nic(), rails)


def nics_used(topology: Topology, hosts: list[list[int]]) -> int:
    """The fewest distinct NICs the members of any one host (or domain) drive (`fewest_nics`)."""
    nic = topology.gpu_nic
    return fewest_nics([nic[rank] for rank in members] for members in hosts)


def fewest_nics(nics_by_host: Iterable[Iterable[Hashable]]) -> int:
    """The fewest distinct NICs among each host's (or domain's) members' NICs: members may share a NIC
    (`nics_per_node` below the GPUs per node). Also read by scale.py, which names each member's NIC from the
    host's shape (`HostShape.nic`) before the cluster is built."""
    return min(len(set(nics)) for nics in nics_by_host)


def channel_count(request: CollectiveRequest, topology: Topology, hosts: list[list[int]]) -> int:
    """``request.channels`` when set (> 0); else across hosts one ring per rail the group can use, and at
    least the channels NCCL runs through one NIC (extra rings share a rail but are separate flows; see
    channels.py); else 1."""
    if request.channels > 0:
        return request.channels
    if len(hosts) < 2:
        return 1
    return cross_host_channels(rails_used(topology, hosts))


def ring_order(hosts: list[list[int]], topology: Topology, channel: int) -> list[int]:
    """One channel's ring: hosts in turn, alternating direction, each entered at the local index the
    previous host left from, so that cross-host hops join GPUs with equal local indices (one rail: across GB200
    racks whose members sit on several trays, equal indices in the rack); the first host is entered at its
    `first_member` for the channel. Hosts that hold unequal local indices take
    `uneven_ring_order`."""
    if len(hosts) == 1:
        members = hosts[0]
        start = channel % len(members)
        return members[start:] + members[:start]
    host = topology.gpu_host
    spans_hosts = any(len({host[member] for member in members}) > 1 for members in hosts)
    local = topology.gpu_domain_local if spans_hosts else topology.gpu_local
    ends = uneven_ends(hosts, local, topology.gpu_nic, channel)
    if ends is not None:
        return uneven_ring_order(hosts, local, ends)
    order: list[int] = []
    exit_local: int | None = None
    for index, members in enumerate(hosts):
        if len(members) > 1:
            locals_ = [local[r] for r in members]
            start = (locals_.index(exit_local) if exit_local is not None and exit_local in locals_
                     else first_member(members, topology.gpu_nic, channel))
            members = (members[start:] + members[:start] if index % 2 == 0
                       else members[start::-1] + members[:start:-1])
        order += members
        exit_local = local[members[-1]]
    return order


def uneven_ends(hosts: list[list[int]], local: list[int], nic_of: Sequence[Hashable],
                channel: int) -> tuple[int, int] | None:
    """The local indices where ``channel``'s ring enters and leaves the first host of a group whose hosts hold
    unequal local indices (8 + 4 GPUs), chosen by NIC among the indices every host holds as `first_member`
    chooses them: in at a GPU on the channel's NIC (`channel_nic`), out at the one before it, on the same NIC
    where that NIC serves two of them, else on the NIC before. So every NIC those indices drive takes one ring
    in and one out a round, on every host (the others enter where the previous host left), as NCCL's search,
    run on each host, picks each channel's NICs there: 12 ranks (8 + 4) on 2 DGX H100 hosts with 4 NICs run a 1 GiB
    all-reduce in 19.80 ms at line rate. None where every host holds the same local
    indices (`ring_order` then enters each host where the previous one left) or fewer than two are held by
    every host."""
    held = [{local[member] for member in members} for members in hosts]
    if all(indices == held[0] for indices in held):
        return None
    common = set.intersection(*held)
    if len(common) < 2:
        return None
    shared = [member for member in hosts[0] if local[member] in common]
    enter = first_member(shared, nic_of, channel)
    return local[shared[enter]], local[shared[enter - 1]]


def uneven_ring_order(hosts: list[list[int]], local: list[int], ends: tuple[int, int]) -> list[int]:
    """A ring over hosts that hold unequal local indices: hosts in turn, each entered at the index the previous
    one left from and left at the other of ``ends`` (`uneven_ends`), its other members in between in local
    order, so every hop between hosts stays on one rail. When every ring entered a partial host at its first
    index and left at its last, each of its NICs carried one direction only: 10 ranks (8 + 2) on 2 DGX H100
    hosts ran a 1 GiB all-reduce at one NIC's busbw, 49.9 GB/s, not two NICs' 100."""
    order: list[int] = []
    for index, members in enumerate(hosts):
        enter, leave = ends if index % 2 == 0 else ends[::-1]
        indices = [local[member] for member in members]
        start = indices.index(enter)
        middle = [member for member in members[start:] + members[:start] if local[member] not in ends]
        order += [members[start], *middle, members[indices.index(leave)]]
    return order


def ring_phase(rings: list[list[int]], nbytes_per_step: float, steps: int,
               channels: list[int] | None = None) -> Phase:
    """One phase: every ring member sends ``nbytes_per_step`` to its successor, ``steps`` times; ring k runs
    on ``channels[k]`` (default: channel k)."""
    channels = channels or list(range(len(rings)))
    transfers = tuple(chain.from_iterable(
        map(Transfer, ring, ring[1:] + ring[:1], repeat(nbytes_per_step), repeat(channel))
        for channel, ring in zip(channels, rings)))
    return Phase(transfers, repeat=steps, pipelined=True)


def chain_phases(order: list[int], nbytes: float, chunk_bytes: ChunkSetting, channel: int, *,
                 toward_root: bool, protocol: Protocol = "simple") -> list[Phase]:
    """Pipelined chain from ``order[0]`` (or toward it): with L chunks, N-1+L-1 steps of one chunk
    (`pipeline_chunk` under ``protocol``)."""
    hops = len(order) - 1
    if toward_root:
        edges = [(order[i + 1], order[i], channel, hops - 1 - i) for i in range(hops)]
    else:
        edges = [(order[i], order[i + 1], channel, i) for i in range(hops)]
    return pipelined_phases(edges, nbytes, chunk_count(nbytes, pipeline_chunk(chunk_bytes, protocol, nbytes)))


def plan(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """Ring all-reduce / reduce-scatter / all-gather as ONE phase (``repeat`` = ring steps); broadcast and
    reduce as a pipelined chain along each channel's ring, the buffer split over the channels."""
    if request.op not in OPS:
        raise ScenarioError(f"algorithm 'ring' does not implement {request.op}", field="collectives.algorithm")
    size = len(request.ranks)
    hosts = group_by_domain(request.ranks, topology)
    channels = channel_count(request, topology, hosts)
    rings = [ring_order(hosts, topology, c) for c in range(channels)]
    if request.op in RING_STEPS:
        return [ring_phase(rings, request.nbytes / (size * channels), RING_STEPS[request.op](size))]
    root = request.ranks[request.root]
    per_channel = request.nbytes / channels
    chains = []
    for channel, ring in enumerate(rings):
        start = ring.index(root)
        chains.append(chain_phases(ring[start:] + ring[:start], per_channel, request.chunk_bytes, channel,
                                   toward_root=request.op == "reduce", protocol=request.protocol))
    return merge_parallel(chains)


def chain_step(request: CollectiveRequest, topology: Topology) -> list[Phase]:
    """One step of `plan`'s broadcast or reduce chains at once, for the tuner's estimate (`tuner.plan_load`): on
    every channel each edge of the chain from (or toward) the root carries that channel's share of the buffer,
    as every edge carries a chunk in the steps the chains stream; each channel's edges in the order they carry
    their first chunk."""
    hosts = group_by_domain(request.ranks, topology)
    channels = channel_count(request, topology, hosts)
    root = request.ranks[request.root]
    transfers = []
    for channel in range(channels):
        ring = ring_order(hosts, topology, channel)
        start = ring.index(root)
        order = ring[start:] + ring[:start]
        pairs = zip(order[:0:-1], order[-2::-1]) if request.op == "reduce" else zip(order, order[1:])
        transfers += [Transfer(src, dst, request.nbytes / channels, channel) for src, dst in pairs]
    return [Phase(tuple(transfers))]


def merge_parallel(plans: list[list[Phase]]) -> list[Phase]:
    """Run same-shaped plans side by side: phase i of the result holds phase i of every plan."""
    if len(plans) == 1:
        return plans[0]
    return [replace(group[0], transfers=tuple(t for phase in group for t in phase.transfers))
            for group in zip(*plans)]
