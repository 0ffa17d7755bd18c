"""How many channels NCCL runs a collective on, worked out in one place from one figure, and which NIC of a host
each channel takes (`first_member`).

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

from collections import defaultdict
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


def first_member(members: list[int], nic_of: Sequence[Hashable], channel: int) -> int:
    """The position in a host's ``members`` (in local order; ``nic_of[member]`` the NIC each drives) where
    ``channel``'s ring or tree chain enters the host, leaving it through the member before (cyclically):
    channel c takes the c-th of the NICs the members drive, in turn, and enters at that NIC's last member, so
    that where a NIC serves several members the channel leaves through it too, and every NIC carries as many
    channels as any other. NCCL's search does the same: channel c starts from the next NIC in turn
    (src/graph/search.cc, ncclTopoSearchRecNet) at a GPU local to it, and its ring returns to that NIC. With
    one member per NIC it is position c."""
    nics = list(dict.fromkeys(nic_of[member] for member in members))
    wanted = nics[channel % len(nics)]
    return max(position for position, member in enumerate(members) if nic_of[member] == wanted)
