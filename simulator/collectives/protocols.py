"""NCCL's three protocols, as what each changes in an algorithm's plan: the phases and their transfers stay the
algorithm's, only what a step costs differs.

NCCL moves a collective's data with one of three protocols (src/device/prims_simple.h, prims_ll.h,
prims_ll128.h; read in NCCL 2.30.7):
- Simple stores a chunk into a slot of the receiver's buffer, fences memory and then raises a flag the receiver
  polls; a connection has 8 slots (NCCL_STEPS) and the sender waits for a slot's credit once all are in
  flight. It reaches the link's bandwidth, but every step pays the fence and the flag's round.
- LL (low latency) stores 8-byte lines of 4 bytes of data and a 4-byte flag: the receiver polls the data
  itself and no fence is needed, so a step costs least, but half of every line is flag.
- LL128 stores 128-byte lines of 120 bytes of data and an 8-byte flag, a warp at once, which relies on NVLink
  delivering the line whole: nearly the link's bandwidth (120/128) at a latency between the two. NCCL enables
  it by default only where the GPUs reach one another over NVLink (tuning.cc: the intra-node path no worse than
  NVB; and compute capability 7.0 or more, which every GPU of the catalog has).

What a protocol changes here (`ProtocolCost` on each phase, `apply`):
- latency per hop: a transfer's path latency stands for Simple's (the bundled topologies' NVLink and network
  latencies are NCCL's Simple ring latencies per hop, 3.4 us and 14 us); LL and LL128 scale it by the ratio of
  NCCL's own per-hop latencies (tuning.cc `hwLatencies`) for the algorithm and the kind of hop (NVLink, PCIe,
  network): an LL ring step over NVLink costs 0.6/3.4 of Simple's, over the network 2.7/14.
- bandwidth: each payload byte puts 1 / `PAYLOAD_FRACTION` bytes on the links (2 under LL, 128/120 under LL128),
  applied as load, as NVLS's in-switch efficiency is (collectives/nvls.py), so traffic sharing the links meets
  the link time the flags take; `Transfer.sent_share` keeps the payload for the traffic reports.
- the window's stall (`phases.window_stall`) is Simple's alone: LL and LL128 hand each line over with its flag as
  it is stored, and their per-hop latencies are NCCL's whole charge for a step.
Only the ring (all its primitives) and the tree's all-reduce run under LL and LL128, as in NCCL; NVLS, the NVLS
tree, CollNet and multi-node NVLS are Simple only (tuning.cc gives them no LL or LL128 bandwidth), and so are
the algorithms NCCL does not have (`hierarchical`, `halving_doubling`) and point-to-point `direct` (NCCL's LL
for small point-to-point messages, below NCCL_P2P_LL_THRESHOLD, is not modelled).

- the base latency: NCCL charges every collective, once per launch, a latency by algorithm and protocol on top of
  its hops' (tuning.cc `baseLatencies`: the kernel's start and the protocol's setup); `apply` puts it on the
  plan's first phase (`Phase.launch`) and the `auto` estimate adds the same `base_latency`.
NCCL's caps on LL's busbw (`llMaxBws`), on LL128's per channel (`perChMaxRingLL128Bws`, `perChMaxTreeLL128Bws`)
and on the tree's under every protocol (`perChMaxTreeBws`, of which it rates the LL tree at 1/3.8 and the LL128
tree at 120/128) weigh `auto`'s choice (tuner.py `nccl_capped`), not a plan's time.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.collectives.names import AlgorithmName, Primitive, Protocol
from simulator.collectives.phases import NET, NVLINK, PCI, SIMPLE, Phase, ProtocolCost, Transfer
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology

PAYLOAD_FRACTION: dict[Protocol, float] = {"simple": 1.0, "ll128": 120 / 128, "ll": 4 / 8}
"""The payload's share of the bytes a protocol puts on the wire: LL128's 128-byte line carries 120 bytes of data,
LL's 8-byte line 4 (src/device/prims_ll128.h, prims_ll.h)."""

HOP_LATENCY_US: dict[str, dict[Protocol, tuple[float, float, float]]] = {
    "ring": {"ll": (0.6, 1.0, 2.7), "ll128": (1.9, 2.5, 4.0), "simple": (3.4, 5.7, 14.0)},
    "tree": {"ll": (0.6, 1.0, 5.0), "ll128": (1.25, 1.9, 8.5), "simple": (4.0, 4.0, 14.0)},
}
"""NCCL's latency per hop (us) by algorithm, protocol and kind of hop (NVLink, PCIe, network): tuning.cc
`hwLatencies`, NCCL master of 2026-06-11. Only the ratios to Simple's are used."""

BASE_LATENCY_US: dict[str, dict[Protocol, float]] = {
    "ring": {"ll": 6.6, "ll128": 14.0, "simple": 8.4},
    "tree": {"ll": 6.8, "ll128": 14.0, "simple": 8.4},
}
"""NCCL's base latency of a collective (us) by algorithm and protocol: tuning.cc `baseLatencies`, NCCL master of
2026-06-11. NVLS, the NVLS tree and CollNet have none there: their fixed cost is in their own latencies (nvls.py
`LATENCY`, catalog/sharp.py)."""

GROUPED_P2P_BASE_LATENCY_US = BASE_LATENCY_US["ring"]["simple"]
"""The base latency (us) of an all-to-all, NCCL's grouped sends and receives in one kernel under Simple
(enqueue.cc `scheduleP2pTasksToPlan`): NCCL's tuner costs no point-to-point kernel, so this is what it charges a
Simple kernel's start and the protocol's setup in a collective (`BASE_LATENCY_US`, the ring's and the tree's
8.4 us), paid once by the kernel, its peers' transfers then each paying their own path latency at once."""

BASE_LATENCY_ALGORITHMS: dict[AlgorithmName, str] = {
    "ring": "ring", "tree": "tree", "hierarchical": "ring", "halving_doubling": "ring"}
"""The algorithms that pay a base latency, by the row of `BASE_LATENCY_US` they read: NCCL's ring and tree, and the
collective kernels NCCL does not have, launched as one kernel like its ring. `direct` pays none here
(send/receive, NCCL's point-to-point, which its tuner does not cost; its all-to-all pays
`GROUPED_P2P_BASE_LATENCY_US`, direct.py), nor do the algorithms with their own fixed latency."""

PROTOCOL_ALGORITHMS: dict[AlgorithmName, tuple[Primitive, ...]] = {
    "ring": ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"), "tree": ("all_reduce",)}
"""The algorithms that run under LL and LL128, and for which primitives (NCCL's ring and its tree all-reduce)."""


def cost(algorithm: AlgorithmName, protocol: Protocol) -> ProtocolCost:
    """What ``protocol`` changes in the phases of ``algorithm`` (Simple: nothing)."""
    if protocol == "simple":
        return SIMPLE
    table = HOP_LATENCY_US["tree" if algorithm == "tree" else "ring"]
    own, simple = table[protocol], table["simple"]
    scale = (own[NVLINK] / simple[NVLINK], own[PCI] / simple[PCI], own[NET] / simple[NET])
    return ProtocolCost(protocol, scale)


def base_latency(algorithm: AlgorithmName, protocol: Protocol) -> float:
    """Seconds NCCL's base latency adds once to a collective that ``algorithm`` runs under ``protocol``."""
    row = BASE_LATENCY_ALGORITHMS.get(algorithm)
    return 0.0 if row is None else BASE_LATENCY_US[row][protocol] * 1e-6


def ll128_enabled(ranks: tuple[int, ...], topology: Topology) -> bool:
    """Whether NCCL enables LL128 for a group: every member has NVLink (LL128 needs lines delivered whole)."""
    nvlink = topology.gpu_nvlink
    return all(nvlink[rank] for rank in ranks)


def available(algorithm: AlgorithmName, op: Primitive, ranks: tuple[int, ...], topology: Topology
              ) -> tuple[Protocol, ...]:
    """The protocols NCCL runs ``algorithm``'s ``op`` over ``ranks`` with, Simple first."""
    if op not in PROTOCOL_ALGORITHMS.get(algorithm, ()):
        return ("simple",)
    return ("simple", "ll128", "ll") if ll128_enabled(ranks, topology) else ("simple", "ll")


def check(algorithm: AlgorithmName, op: Primitive, protocol: Protocol, ranks: tuple[int, ...],
          topology: Topology) -> None:
    """Refuse ``protocol`` where NCCL would not run ``algorithm``'s ``op`` with it, naming what it would."""
    able = available(algorithm, op, ranks, topology)
    if protocol not in able:
        raise ScenarioError(f"protocol {protocol!r} does not run {algorithm} {op} on this group",
                            field="collectives.protocol", allowed=f"{', '.join(able)} or auto")


def apply(phases: list[Phase], algorithm: AlgorithmName, protocol: Protocol) -> list[Phase]:
    """``algorithm``'s ``phases`` under ``protocol``: each phase costed by its `ProtocolCost`, each transfer
    loading its links with its payload over the protocol's `PAYLOAD_FRACTION` (sending the payload), and the
    first phase started after the `base_latency`."""
    if protocol != "simple":
        protocol_cost, fraction = cost(algorithm, protocol), PAYLOAD_FRACTION[protocol]
        phases = [replace(phase, protocol=protocol_cost,
                          transfers=tuple(Transfer(src, dst, nbytes / fraction, channel, sent_share * fraction)
                                          for src, dst, nbytes, channel, sent_share in phase.transfers))
                  for phase in phases]
    launch = base_latency(algorithm, protocol)
    if phases and launch:
        phases = [replace(phases[0], launch=launch), *phases[1:]]
    return phases
