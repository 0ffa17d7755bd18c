"""The phase IR: every collective algorithm turns into a list of phases of point-to-point transfers.

A phase is a batch of transfers that start together; the next phase starts when every transfer of this one
has finished (the step barrier of a ring or a tree level). ``repeat`` folds k identical consecutive steps
into one phase: each transfer then carries ``repeat`` times its bytes and pays ``repeat`` times its latency
per step, which equals k separate steps exactly whenever the rates stay constant over the phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from simulator.collectives.chunking import ChunkSetting
from simulator.collectives.names import Primitive, Protocol

if TYPE_CHECKING:
    from simulator.topology.graph import Topology

HopKind = int
"""What a transfer's path crosses, in NCCL's order of hardware (tuning.cc `NCCL_HW_*`): `NVLINK` inside an NVLink
domain, `PCI` inside a host without NVLink, `NET` between NVLink domains (hosts, or NVL72 racks)."""
NVLINK, PCI, NET = 0, 1, 2


HOP_KIND = ((PCI, NVLINK), (NET, NET))
"""The `HopKind` of a hop by whether it crosses NVLink domains, then whether both GPUs have NVLink: NET between
domains, else NVLINK where both have it, else PCI (read by `hop_kind` and `hop_kinds`)."""


def hop_kind(topology: Topology, src: int, dst: int) -> HopKind:
    """The `HopKind` from GPU ``src`` to GPU ``dst``, read item by item (`auto` asks for thousands of hops, one
    at a time)."""
    nvlink = topology.gpu_nvlink
    return HOP_KIND[topology.gpu_domain[src] != topology.gpu_domain[dst]][nvlink[src] and nvlink[dst]]


def hop_kinds(topology: Topology, src, dst) -> np.ndarray:
    """The `HopKind` of each transfer from ``src`` to ``dst`` (arrays of GPU indices)."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    domain, nvlink = topology.gpu_domain_array, topology.gpu_nvlink_array
    crosses, both = domain[src] != domain[dst], nvlink[src] & nvlink[dst]
    return np.array(HOP_KIND, dtype=np.int64)[crosses.astype(np.int64), both.astype(np.int64)]


class Transfer(NamedTuple):
    """``nbytes`` from GPU ``src`` to GPU ``dst`` (global GPU indices) over route ``channel``. A named tuple:
    plans of large groups make tens of thousands, and a frozen dataclass costs three times as much to build.

    ``sent_share`` is the part of ``nbytes`` that ``src`` really sends: below 1 where the load is made larger
    than the payload to time a slower transfer (NVLS: the in-switch efficiency; an all-gather's idle direction),
    so the reported traffic counts bytes sent while the flow model sees the load."""

    src: int
    dst: int
    nbytes: float
    channel: int = 0
    sent_share: float = 1.0


TRANSFER_ENDS = attrgetter("src", "dst", "channel")
"""A transfer's ``(src, dst, channel)``, the key of its route (`Topology.paths`)."""


@dataclass(frozen=True, slots=True)
class ProtocolCost:
    """What NCCL's protocol ``name`` changes in the cost of a phase (collectives/protocols.py): each transfer's
    path latency, which stands for Simple's, times ``latency_scale[kind]`` for the kind of hop it crosses; and
    whether continued chunk steps wait on Simple's window of slots (``windowed``). Its bandwidth is put in
    the transfers' load, not here (`protocols.apply`)."""

    name: Protocol = "simple"
    latency_scale: tuple[float, float, float] = (1.0, 1.0, 1.0)

    @property
    def windowed(self) -> bool:
        """Whether steps that continue open chunk streams pay `window_stall` (Simple) or nothing."""
        return self.name == "simple"


SIMPLE = ProtocolCost()
"""NCCL's Simple protocol: the path latencies and the window stall as they are."""


@dataclass(frozen=True, slots=True)
class Phase:
    """Transfers that run concurrently, ``repeat`` times back to back.

    ``pipelined`` marks ring steps, where a chunk moves on as soon as it arrives, hop after hop: over the
    ``repeat`` steps it crosses successive hops of the ring, so each transfer pays ``repeat`` times the mean
    path latency of the phase (NCCL's ring latency model) rather than its own hop's latency every step.
    ``min_latency`` is a floor on each transfer's latency per step, for algorithms whose fixed cost exceeds
    the path's (NVLS: the switch's multicast round trip).

    ``steps_in_flight`` w > 0 marks steps that continue chunk streams already open, with up to w chunk steps
    in flight per connection (NCCL's ``NCCL_STEPS``): a step's path latency overlaps the chunks ahead of it,
    so a transfer pays only `window_stall` per step, not its path latency (under Simple; nothing under LL and
    LL128).

    ``protocol`` is the NCCL protocol the phase runs under (`ProtocolCost`; Simple unless
    `protocols.apply` set another).

    ``launch`` is a latency every transfer pays once before its first step, not per repeat: NCCL's base latency
    of the collective, which `protocols.apply` puts on a plan's first phase, so the whole plan starts that much
    later.
    """

    transfers: tuple[Transfer, ...]
    repeat: int = 1
    pipelined: bool = False
    min_latency: float = 0.0
    steps_in_flight: int = 0
    protocol: ProtocolCost = SIMPLE
    launch: float = 0.0


def window_stall(latency: float, seconds: float, steps_in_flight: int) -> float:
    """Seconds a chunk step waits beyond its own transfer time ``seconds`` when ``steps_in_flight`` chunks may be
    in flight on a connection of one-way ``latency``: NCCL's Simple protocol reuses a slot once the chunk in it
    has crossed (latency + seconds) and been passed on by the receiver (seconds), and the receiver's credit has
    come back (latency), so a connection moves at most w chunks per 2 (latency + seconds); the stall is zero
    once seconds >= 2 latency / (w - 2), when the window hides the latency entirely."""
    return max(0.0, 2 * (latency + seconds) / steps_in_flight - seconds)


@dataclass(frozen=True, slots=True)
class CollectiveRequest:
    """What an algorithm is asked to plan.

    ``ranks`` are global GPU indices in group order (rank 0 of the group first); ``nbytes`` is the per-rank
    buffer size as nccl-tests counts it (for all_gather the gathered output, for all_to_all the total a rank
    sends); ``root`` is a position in ``ranks`` for broadcast/reduce; ``chunk_bytes`` is the pipelining
    chunk (None = no chunking; `auto`: NCCL's for ``protocol``, the protocol the plan runs under, which
    `registry.plan_collective` sets once it is resolved); ``channels`` is how many parallel rings/trees to use
    (0 = one per rail the group can use); ``pair_bytes`` sizes each pair of an uneven all_to_all (row = sender,
    group order); ``pxn`` lets an all_to_all's cross-rail transfers go through a PXN relay (`direct.all_pairs`).
    """

    op: Primitive
    ranks: tuple[int, ...]
    nbytes: float
    root: int = 0
    chunk_bytes: ChunkSetting = None
    channels: int = 0
    pair_bytes: tuple[tuple[float, ...], ...] = ()
    protocol: Protocol = "simple"
    pxn: bool = True
