"""What the engine needs to slow compute while communication kernels hold SMs (engine/contention.py).

NCCL runs every collective and send/recv as a kernel of one CTA per channel, each CTA on an SM of its own that
no compute kernel shares while it runs; Transformer Engine's userbuffers overlap of the TP collectives holds a
set number of SMs the same way. A compute-bound kernel sharing the GPU with such kernels progresses at
(SMs - held) / SMs of its speed. ``SmShare`` is the GPU's SM count and the NCCL channel counts per kind of
collective, taken from simulator/catalog/kernels.yaml.
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

    def rate(self, held: int) -> float:
        """The speed of a compute-bound kernel while communication kernels hold ``held`` SMs (one SM at least
        stays with the compute)."""
        return (self.sms - min(held, self.sms - 1)) / self.sms
