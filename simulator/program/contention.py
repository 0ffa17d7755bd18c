"""What the engine needs to slow compute while communication kernels hold SMs (engine/contention.py).

NCCL runs every collective and send/recv as a kernel of one CTA per channel, each CTA on an SM of its own that
no compute kernel shares while it runs; Transformer Engine's userbuffers overlap of the TP collectives holds a
set number of SMs the same way. A compute-bound kernel sharing the GPU with such kernels progresses at
(SMs - held) / SMs of its speed, or, where the GPU's slowdown was measured, at the measured rate: a GPU at its
power limit clocks the SMs left to the compute higher, so it loses less than their share. ``SmShare`` is the
GPU's SM count, the NCCL channel counts per kind of collective and any measured rates, taken from
simulator/catalog/kernels.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SmShare:
    """The GPU's ``sms`` and the CTAs (one SM each) an NCCL kernel launches: ``nvlink_channels`` for a group
    inside one NVLink domain, ``pcie_channels`` for a group inside one host without NVLink,
    ``network_channels`` per NIC the group drives on a host for a group that spans hosts, ``nvls_channels`` for
    NVLink SHARP, at most ``max_channels``."""

    sms: int
    nvlink_channels: int
    pcie_channels: int
    network_channels: int
    nvls_channels: int
    max_channels: int
    measured: tuple[tuple[int, float], ...] = ()
    """(SMs held, speed of a compute-bound kernel) measured on this GPU, from (0, 1) up, the speeds not
    increasing; empty where nothing was measured."""

    def rate(self, held: int) -> float:
        """The speed of a compute-bound kernel while communication kernels hold ``held`` SMs (one SM at least
        stays with the compute): (SMs - held) / SMs, or linear between the measured points and, beyond the last,
        its speed shrinking with the SMs left."""
        held = min(held, self.sms - 1)
        if not self.measured:
            return (self.sms - held) / self.sms
        for (low, low_rate), (high, high_rate) in zip(self.measured, self.measured[1:]):
            if held <= high:
                return low_rate + (held - low) / (high - low) * (high_rate - low_rate)
        last, last_rate = self.measured[-1]
        return last_rate * (self.sms - held) / (self.sms - last)

    def overlap_delay(self, overlap_s: float, held: int, compute_s: float, sm_bound: float) -> float:
        """How much longer ``compute_s`` seconds of compute, SM-bound for the share ``sm_bound`` of them, take
        while communication kernels holding ``held`` SMs run beside them for ``overlap_s`` seconds: the
        engine's rule in closed form, T + L (1 - rate) for an overlap L (`mixed_rate`), until the compute runs
        under the communication throughout (T / rate). The layout search charges its estimate this way."""
        rate = mixed_rate(self.rate(held), sm_bound)
        return min(overlap_s * (1.0 - rate), compute_s * (1.0 / rate - 1.0))


def mixed_rate(sm_rate: float, sm_bound: float) -> float:
    """The speed of a kernel SM-bound for the share ``sm_bound`` of its time when its SM-bound part runs at
    ``sm_rate``: the rest (HBM-bound) keeps its speed."""
    return 1.0 if sm_rate == 1.0 else 1.0 / (sm_bound / sm_rate + 1.0 - sm_bound)
