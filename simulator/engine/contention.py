"""Compute slowed while communication kernels hold SMs on the same GPU.

A collective's kernel holds its SMs on each member GPU from the collective's start to its end (NCCL: one CTA per
channel, each on its own SM; userbuffers TP overlap: the SMs its settings give it). Meanwhile every compute-bound kernel
on that GPU progresses at ``SmShare.rate(held)`` of its nominal speed; memory-bound kernels keep theirs, and an op that
runs both kinds (a transformer block), SM-bound for a share f of its nominal time, progresses at 1 / (f / rate + 1 - f).
When a collective starts or ends while a kernel runs, the kernel's remaining work is carried over at the new rate, so a
kernel overlapped for a known share of its time lasts exactly the closed-form longer time. A kernel that nothing
overlaps waits one timeout of its nominal duration, as without the model, so a step without overlapped communication is
unchanged to the last bit. A kernel may be launched on fewer SMs than the GPU has, leaving some to the communication
beside it (Transformer Engine launches the GEMMs its userbuffers overlap on the SMs the communication does not take): it
runs at the share the more restrictive of the two leaves it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

import simpy

from simulator.collectives.channels import kernel_channels
from simulator.collectives.names import AlgorithmName
from simulator.collectives.registry import ALGORITHMS
from simulator.engine.stepping import Urgent
from simulator.program.contention import SmShare, mixed_rate
from simulator.program.ops import CollectiveOp
from simulator.topology.graph import Topology


@dataclass(slots=True)
class Kernel:
    """A kernel in flight on ``gpu``: nominal seconds of work left at ``since``, its current rate, the share of
    its time SMs limit (``sm_bound``), the SMs it was launched without (``reserved``), the timeout at which it
    ends at that rate, and whether a new one is on its way (the rate changed)."""

    gpu: Gpu
    left: float
    rate: float
    since: float
    sm_bound: float
    reserved: int
    end: simpy.Timeout
    rescheduling: bool = False


class NcclChannels:
    """The SMs the kernel of a collective holds on each member GPU: its own count when the program gives one,
    else the channels NCCL launches for the group: the NVLS channels for the algorithms the registry runs on
    them; inside one NVLink domain the NVLink channels, or the PCIe channels where the GPUs have no NVLink;
    across domains the network channels of each NIC the group's members drive on the busiest domain (a NIC
    that several members share counts once; collectives/channels.py). ``algorithm_of`` resolves `auto`. The
    engine asks once per collective shape; the channels are worked out once per group's members."""

    def __init__(self, share: SmShare, topology: Topology, algorithm_of: Callable[[CollectiveOp], AlgorithmName]):
        self.share = share
        self.topology = topology
        self.algorithm_of = algorithm_of
        self._group_channels: dict[tuple[int, ...], int] = {}

    def __call__(self, op: CollectiveOp) -> int:
        if op.sms is not None:
            return op.sms
        if ALGORITHMS[self.algorithm_of(op)].nvls_channels:
            return self.share.nvls_channels
        channels = self._group_channels.get(op.group)
        if channels is None:
            channels = self._group_channels[op.group] = kernel_channels(self.share, self.topology, op.group)
        if op.op == "all_to_all" and op.pair_bytes and one_peer_each(op.pair_bytes):
            return p2p_channels(self.share, channels, op.group, self.topology)
        return channels


def one_peer_each(pair_bytes: tuple[tuple[float, ...], ...]) -> bool:
    """Whether every member of an all-to-all sends to one other member at most (a CP ring step: to the next)."""
    return all(sum(1 for nbytes in row if nbytes > 0) <= 1 for row in pair_bytes)


def p2p_channels(share: SmShare, group_channels: int, group: tuple[int, ...], topology: Topology) -> int:
    """The channels (one SM each) of a grouped send/receive in which each member of ``group`` sends to one peer
    and receives from one (a CP ring step), as NCCL's point-to-point kernel runs it: the communicator's p2p
    channels are its channels (``group_channels``, `kernel_channels`) rounded up to a power of two; a peer gets
    ``share.network_channels`` of them when the group spans NVLink domains (src/graph/paths.cc
    ncclTopoGetNchannels: NCCL_NCHANNELS_PER_NET_PEER, and ncclTopoComputeP2pChannelsPerPeer takes the least
    over the communicator's peers), else 2 per NVLink (or 2 over PCIe) rounded up to a power of two, at most the
    p2p channels (ncclTopoComputeP2pChannels): all of them, as the group's channels are those too; halved while
    they times the members exceed 4 times the p2p channels (src/enqueue.cc scheduleP2pTasksToPlan,
    nChannelsMax). A send and a receive of the same round share channels, so the pair holds one peer's."""
    total = _power_of_two_up(group_channels)
    spans_domains = len({topology.gpu_domain[rank] for rank in group}) > 1
    per_peer = share.network_channels if spans_domains else total
    while per_peer * len(group) > total * 4 and per_peer > 1:
        per_peer //= 2
    return per_peer


def _power_of_two_up(count: int) -> int:
    """The least power of two at or above ``count`` (NCCL's pow2Up)."""
    return 1 << max(count - 1, 0).bit_length()


RESERVED = "reserved"
"""The ``lost_s`` key of SMs a kernel was launched without while no communication kernel used them."""


@dataclass(slots=True)
class Gpu:
    """One GPU's SMs: those communication kernels hold, by op category and in all, and the compute-bound
    kernels running."""

    held: dict[str, int] = field(default_factory=dict)
    total: int = 0
    running: list[Kernel] = field(default_factory=list)
    weight: float = 1.0
    """How many ranks the GPU stands for in ``lost_s`` (a run folded by classes of unequal size)."""


class Contention:
    """Per GPU, the SMs communication kernels hold (by op category) and the compute-bound kernels running;
    ``lost_s`` sums, per category of the holding collective, the kernel-seconds compute lost to it (over the
    simulated ranks, each weighed by ``weights``, how many ranks it stands for, where a run folded by classes of
    unequal size gives them: parallel/folding.py `rank_weights`), and under RESERVED what kernels launched on
    fewer SMs lost while the SMs they left stood idle.

    A kernel is started with `start`, waited for on its ``end`` (which may move: wait on the kernel's ``end``
    as it is after `start`, whose callbacks move along) and closed with `finish` first thing when it fires; a
    collective's kernel takes its SMs with `hold` and gives them back with `release`."""

    def __init__(self, env: simpy.Environment, share: SmShare, kernel_sms: Callable[[CollectiveOp], int],
                 weights: Mapping[int, int] | None = None):
        self.env = env
        self.share = share
        self.kernel_sms = kernel_sms
        self._gpus: dict[int, Gpu] = defaultdict(Gpu)
        self._gpus.update((rank, Gpu(weight=weight)) for rank, weight in (weights or {}).items())
        self._sm_rates = [share.rate(held) for held in range(share.sms)]
        """``share.rate`` of each count of SMs held below the GPU's (beyond, the rate of one SM left)."""
        self.lost_s: dict[str, float] = defaultdict(float)

    def _rate(self, held: int, kernel_sm_bound: float, reserved: int) -> float:
        """A kernel's speed when communication holds ``held`` SMs and it was launched without ``reserved``: the
        share of its time SMs limit runs at the SM rate, the rest at full speed."""
        rates = self._sm_rates
        return mixed_rate(rates[min(max(held, reserved), len(rates) - 1)], kernel_sm_bound)

    def hold(self, ranks: Iterable[int], category: str, sms: int) -> None:
        """A collective's kernel of ``category`` starts on ``ranks``, holding ``sms`` SMs on each (`kernel_sms`
        of the op)."""
        self._change(ranks, category, sms)

    def release(self, ranks: Iterable[int], category: str, sms: int) -> None:
        """The kernel `hold` started (the same ranks, in the same order) ends."""
        self._change(ranks, category, -sms)

    def _change(self, ranks: Iterable[int], category: str, change: int) -> None:
        """The SMs ``category`` holds on ``ranks`` change by ``change``: running kernels there whose rate this
        changes hear of it (a kernel whose rate stays, such as one launched without more SMs than are now held,
        keeps its timeout, so its end is not recomputed)."""
        gpus = self._gpus
        for rank in ranks:
            gpu = gpus[rank]
            running = gpu.running
            if running:
                self._settle(gpu)
            held = gpu.held
            count = held[category] = held.get(category, 0) + change
            if not count:
                del held[category]
            total = gpu.total = gpu.total + change
            for kernel in running:
                rate = self._rate(total, kernel.sm_bound, kernel.reserved)
                if rate != kernel.rate:
                    kernel.rate = rate
                    if not kernel.rescheduling:
                        kernel.rescheduling = True
                        Urgent(self.env, partial(self._reschedule, kernel))

    def _settle(self, gpu: Gpu) -> None:
        """Book the work the GPU's kernels did since their last change, and the time lost to each holder (the
        share of the SMs it holds) and to idle reserved SMs."""
        now = self.env._now
        held, total, lost = gpu.held, gpu.total, self.lost_s
        for kernel in gpu.running:
            elapsed = now - kernel.since
            if elapsed > 0:
                rate = kernel.rate
                kernel.left = max(kernel.left - elapsed * rate, 0.0)
                if rate < 1:
                    per_sm = elapsed * (1 - rate) / max(total, kernel.reserved) * gpu.weight
                    for category, count in held.items():
                        lost[category] += count * per_sm
                    if kernel.reserved > total:
                        lost[RESERVED] += (kernel.reserved - total) * per_sm
            kernel.since = now

    def start(self, rank: int, duration: float, sm_bound: float = 1.0, reserved: int = 0) -> Kernel:
        """Start a kernel of nominal ``duration`` on ``rank``, SM-bound for the share ``sm_bound`` of its time,
        launched without ``reserved`` SMs (at full speed while no SMs are held or reserved)."""
        env, gpu = self.env, self._gpus[rank]
        rate = self._rate(gpu.total, sm_bound, reserved) if gpu.total or reserved else 1.0
        kernel = Kernel(gpu, duration, rate, env._now, sm_bound, reserved, env.timeout(duration / rate))
        gpu.running.append(kernel)
        return kernel

    def finish(self, kernel: Kernel) -> None:
        """``kernel`` has ended: book its last stretch (and the other running kernels'), and let it go. A kernel
        that ran alone at full speed has nothing to book."""
        running = kernel.gpu.running
        if kernel.rate < 1 or len(running) > 1:
            self._settle(kernel.gpu)
        running.remove(kernel)

    def _reschedule(self, kernel: Kernel, _event: simpy.Event) -> None:
        """The kernel's rate changed (an urgent event, at the time of the change, as an interrupt would be): it
        now ends after its work left at its new rate; its former timeout fires with no callbacks."""
        kernel.rescheduling = False
        former = kernel.end
        kernel.end = self.env.timeout(kernel.left / kernel.rate)
        kernel.end.callbacks, former.callbacks = former.callbacks, []
