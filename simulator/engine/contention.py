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
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import simpy

from simulator.collectives.channels import kernel_channels
from simulator.collectives.registry import ALGORITHMS
from simulator.program.contention import SmShare
from simulator.program.ops import CollectiveOp
from simulator.topology.graph import Topology


@dataclass(slots=True)
class _Kernel:
    """A kernel in flight: nominal seconds of work left at ``since``, its current rate, the share of its time
    SMs limit (``sm_bound``), the SMs it was launched without (``reserved``), its process, and whether an
    interrupt telling it of a new rate is on its way."""

    left: float
    rate: float
    since: float
    sm_bound: float
    reserved: int
    process: simpy.Process
    interrupting: bool = False


class NcclChannels:
    """The SMs the kernel of a collective holds on each member GPU: its own count when the program gives one,
    else the channels NCCL launches for the group: the NVLS channels for the algorithms the registry runs on
    them; inside one NVLink domain the NVLink channels, or the PCIe channels where the GPUs have no NVLink;
    across domains the network channels of each NIC the group's members drive on the busiest domain (a NIC
    that several members share counts once; collectives/channels.py). ``algorithm_of`` resolves `auto`. The
    count is worked out once per group object."""

    def __init__(self, share: SmShare, topology: Topology, algorithm_of: Callable[[CollectiveOp], str]):
        self.share = share
        self.topology = topology
        self.algorithm_of = algorithm_of
        self._counts: dict[int, tuple[tuple[int, ...], int]] = {}

    def __call__(self, op: CollectiveOp) -> int:
        if op.sms is not None:
            return op.sms
        if ALGORITHMS[self.algorithm_of(op)].nvls_channels:
            return self.share.nvls_channels
        known = self._counts.get(id(op.group))
        if known is None:
            known = self._counts[id(op.group)] = (op.group, kernel_channels(self.share, self.topology, op.group))
        return known[1]


RESERVED = "reserved"
"""The ``lost_s`` key of SMs a kernel was launched without while no communication kernel used them."""


class Contention:
    """Per GPU, the SMs communication kernels hold (by op category) and the compute-bound kernels running;
    ``lost_s`` sums, per category of the holding collective, the kernel-seconds compute lost to it (over the
    simulated ranks), and under RESERVED what kernels launched on fewer SMs lost while the SMs they left
    stood idle."""

    def __init__(self, env: simpy.Environment, share: SmShare, kernel_sms: Callable[[CollectiveOp], int]):
        self.env = env
        self.share = share
        self.kernel_sms = kernel_sms
        self._held: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._total: dict[int, int] = defaultdict(int)
        self._running: dict[int, list[_Kernel]] = defaultdict(list)
        self.lost_s: dict[str, float] = defaultdict(float)

    def _rate(self, held: int, kernel_sm_bound: float, reserved: int) -> float:
        """A kernel's speed when communication holds ``held`` SMs and it was launched without ``reserved``: the
        share of its time SMs limit runs at the SM rate, the rest at full speed."""
        rate = self.share.rate(max(held, reserved))
        return 1.0 if rate == 1.0 else 1.0 / (kernel_sm_bound / rate + 1.0 - kernel_sm_bound)

    def hold(self, op: CollectiveOp, ranks: Iterable[int], sign: int) -> None:
        """``op``'s kernel starts (``sign`` 1) or ends (-1) on ``ranks``: running kernels there whose rate this
        changes hear of it (a kernel whose rate stays, such as one launched without more SMs than are now held,
        keeps its timeout, so its end is not recomputed)."""
        sms = self.kernel_sms(op)
        if sms <= 0:
            return
        for rank in ranks:
            self._settle(rank)
            held = self._held[rank]
            held[op.category] += sign * sms
            if not held[op.category]:
                del held[op.category]
            total = self._total[rank] = self._total[rank] + sign * sms
            for kernel in self._running[rank]:
                rate = self._rate(total, kernel.sm_bound, kernel.reserved)
                if rate != kernel.rate:
                    kernel.rate = rate
                    if not kernel.interrupting:
                        kernel.interrupting = True
                        kernel.process.interrupt()

    def _settle(self, rank: int) -> None:
        """Book the work the rank's kernels did since their last change, and the time lost to each holder (the
        share of the SMs it holds) and to idle reserved SMs."""
        running = self._running[rank]
        if not running:
            return
        now = self.env.now
        held, total = self._held[rank], self._total[rank]
        for kernel in running:
            elapsed = now - kernel.since
            if elapsed > 0:
                kernel.left = max(kernel.left - elapsed * kernel.rate, 0.0)
                if kernel.rate < 1:
                    per_sm = elapsed * (1 - kernel.rate) / max(total, kernel.reserved)
                    for category, count in held.items():
                        self.lost_s[category] += count * per_sm
                    if kernel.reserved > total:
                        self.lost_s[RESERVED] += (kernel.reserved - total) * per_sm
            kernel.since = now

    def run(self, rank: int, duration: float, sm_bound: float = 1.0, reserved: int = 0):
        """Run a kernel of nominal ``duration`` on ``rank``, SM-bound for the share ``sm_bound`` of its time,
        launched without ``reserved`` SMs (a generator for the stream's process)."""
        env = self.env
        process = env.active_process
        assert process is not None
        kernel = _Kernel(duration, self._rate(self._total[rank], sm_bound, reserved), env.now, sm_bound, reserved,
                         process)
        running = self._running[rank]
        running.append(kernel)
        while True:
            try:
                yield env.timeout(kernel.left / kernel.rate)
                break
            except simpy.Interrupt:
                kernel.interrupting = False
        self._settle(rank)
        running.remove(kernel)
