"""How many channels NCCL runs a collective on, worked out in one place from one figure, and where each channel
crosses a host: the NIC it takes (`channel_nic`), where a ring enters (`first_member`), a tree's chain
(`tree_chain`) and the GPUs that take its child hosts (`child_receivers`), as NCCL's src/graph places them.

Across hosts NCCL's graph search finds one ring channel through each NIC the group drives, at least one, and
ncclTopoPostset (src/graph/connect.cc, "Duplication should be complete now": nChannels = min(MAXCHANNELS,
nChannels * 2)) always doubles them, each copy with its own network connection (so its own ECMP hash); NCCL's
INFO log of a one-GPU-per-node job shows "Channel 00/02" and "Channel 01/02". That per-NIC count is
``nccl.network_channels_per_nic`` in simulator/catalog/kernels.yaml, with its sources, and two models read it:

- the ring model (ring.py ``channel_count``, through catalog/calibration.py ``network_channels_per_nic``) runs
  one ring per rail the group can use across hosts and at least one NIC's channels; only that floor of the
  doubling is modelled (a group that can use r >= 2 rails runs r rings, not NCCL's 2r);
- the SM contention model (engine/contention.py) holds one SM per channel on each member while the kernel runs:
  ``kernel_channels``, every channel NCCL launches (``SmShare.network_channels`` per NIC, read by
  workload/calibrated.py ``sm_share``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence

from simulator.program.contention import SmShare
from simulator.topology.graph import Topology


def kernel_channels(share: SmShare, topology: Topology, group: tuple[int, ...]) -> int:
    """The channels (one SM each) of an NCCL ring or tree kernel on each member of ``group``: inside one NVLink
    domain the NVLink channels, or the PCIe channels where the GPUs have no NVLink; across domains the network
    channels of each NIC the members drive on the busiest domain (a NIC several members share counts once), at
    most ``share.max_channels``."""
    nics: dict[int, set[str]] = defaultdict(set)
    for rank in group:
        nics[topology.gpu_domain[rank]].add(topology.gpu_nic[rank])
    if len(nics) == 1:
        nvlink = topology.gpu_nvlink
        return share.nvlink_channels if all(nvlink[rank] for rank in group) else share.pcie_channels
    return min(share.max_channels, share.network_channels * max(map(len, nics.values())))


def channel_nic(members: list[int], nic_of: Sequence[Hashable], channel: int) -> Hashable:
    """The NIC of a host that ``channel`` crosses hosts through: the c-th of the NICs its ``members`` (in local
    order) drive, in order of first appearance, in turn, so that every NIC carries as many channels as any
    other. NCCL's search does the same: channel c starts from the next NIC in turn (src/graph/search.cc,
    ncclTopoSearchRecNet, ``nets[(nChannels + i) % netCount]``, the NICs listed GPU by GPU: by
    ncclTopoPrefNetsChannelFirst, or under MNNVL by ncclTopoPrefNetsGpuFirst, the same order where every GPU has
    a NIC of its own)."""
    nics = list(dict.fromkeys(nic_of[member] for member in members))
    return nics[channel % len(nics)]


def first_member(members: list[int], nic_of: Sequence[Hashable], channel: int) -> int:
    """The position in a host's ``members`` (in local order; ``nic_of[member]`` the NIC each drives) where
    ``channel``'s ring enters the host, leaving it through the member before (cyclically), so that over a round
    of channels (one per NIC, `channel_nic`) every NIC takes as many rings in as out. Where every NIC serves two
    or more members the ring enters at the last member of the channel's NIC and leaves through the same NIC, as
    NCCL's search first asks (src/graph/search.cc ncclTopoSearchCheckNet, crossNic 0: back to the NIC it
    started from). Where some NIC serves one member only, that cannot hold for every NIC at once (the member
    before a lone member's belongs to another NIC, which would then send two rings and some NIC none), so the
    ring enters at the first member of the channel's NIC and leaves through the last member of the NIC before,
    so over a round each NIC takes in its own channel's ring and sends out the next NIC's. NCCL's search then
    lets a ring leave through another NIC (crossNic 2, the default of NCCL_CROSS_NIC) and pairs its channels
    instead: the next channel enters through the NIC this one left by and leaves through the one it entered by.
    Both send and receive one ring through every NIC a round, all the flows see, and the rotation also holds
    for an odd number of NICs. The rule reads the NICs of the group's members, not of the host, so a partial
    group on a host (ranks 0-4 with 2 NICs: GPU 4 alone on NIC 1) takes it too. With one member per NIC it is
    position c."""
    wanted = channel_nic(members, nic_of, channel)
    positions = [position for position, member in enumerate(members) if nic_of[member] == wanted]
    served = Counter(nic_of[member] for member in members)
    return positions[-1] if min(served.values()) > 1 else positions[0]


def tree_chain(members: list[int], nic_of: Sequence[Hashable], channel: int) -> list[int]:
    """``channel``'s chain through a host's ``members`` (in local order; ``nic_of[member]`` the NIC each drives)
    in a tree across hosts, NCCL's treeIntra: it starts at the first member of the channel's NIC
    (`channel_nic`), the GPU NCCL's search enters from that NIC (search.cc ncclTopoSearchRecNet tries the NIC's
    net.localGpu first, topo.cc ncclTopoGetLocalGpu: its first local GPU whose own NIC it is), and goes on
    through the members in local order, cyclically (search.cc ncclTopoSearchNextGpuSort: behind NVSwitches the
    TREE pattern tries only the next GPU; BALANCED_TREE, which tries the previous first, needs a second GPU on the
    channel's NIC, so with a NIC per GPU the search falls back to TREE). The first GPU talks to the parent host
    (connect.cc ncclTopoPreset: treeToParent is treeIntra[0]); the last is a leaf."""
    wanted = channel_nic(members, nic_of, channel)
    start = next(position for position, member in enumerate(members) if nic_of[member] == wanted)
    return members[start:] + members[:start]


def child_receivers(chain: list[int], nic_of: Sequence[Hashable]) -> tuple[int, int]:
    """The GPUs of a host's tree ``chain`` (`tree_chain`) that receive from its first and its second child host
    (NCCL's treeToChild0 and treeToChild1, connect.cc ncclTopoPreset; a child is the first where its position
    in the binary tree is below its parent's, trees.cc ncclGetBtree). Under NCCL's TREE pattern both are the
    chain's first GPU; under BALANCED_TREE, which the search keeps where the chain's second GPU reaches the
    same NIC (search.cc ncclTopoSearchCheckNet: it must return to the NIC the first one did), the second GPU
    takes the first child, halving the first GPU's share of the NIC's traffic."""
    if len(chain) > 1 and nic_of[chain[1]] == nic_of[chain[0]]:
        return chain[1], chain[0]
    return chain[0], chain[0]
