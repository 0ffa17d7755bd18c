"""Failure-rate presets: published interruption tables turned into per-unit rates (docs/reliability.md).

`llama3`: Dubey et al., "The Llama 3 Herd of Models" (2024), Table 5: root causes of the 419 unexpected
interruptions of a 54-day snapshot of Llama 3 405B pre-training on 16,384 H100 GPUs (2,048 hosts of 8 GPUs),
plus 47 planned interruptions. Derivation: each cause's count is divided by the number of units of its class
on the reference cluster and by 54 days, so that a job on the same cluster expects exactly the published count
in 54 days; on another cluster the expectation scales with its unit counts. The reference cluster is the
bundled `dgx-h100-cluster` at 2,048 nodes (8 rails, 32 hosts per leaf, 16 spines): 16,384 GPUs and NICs,
2,048 hosts, 16,384 NIC-leaf + 512 x 16 leaf-spine = 24,576 cables. A `cable` is one link of the simulator's
topology, not a physical cable: each leaf-spine link of 100 GB/s stands for two bundled 400 Gb/s cables (32 NDR
uplinks a leaf), so the physical count would be 16,384 + 16,384 = 32,768 and the per-cable rate here is 1.33x a
per-physical-cable one (a fabric built of single 50 GB/s uplinks would see up to 1.33x too many). Software
causes (software bug, NCCL watchdog, dependency) are counted per GPU (one training process each), so they too
grow with the job.
Repair times are not published; the values below are assumptions (a GPU-class fault takes its host out for a
board swap and burn-in, a host part or a cable is quicker), stated here and in docs/reliability.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

DAY_S = 86400.0


@dataclass(frozen=True)
class PresetCause:
    """One row of a published table: its label, the component class it maps to, and its count."""

    label: str
    component: str
    count: int
    repair_s: float


@dataclass(frozen=True)
class FailurePreset:
    """A published interruption table, the window it covers and the units of the cluster it was seen on."""

    causes: tuple[PresetCause, ...]
    window_s: float
    reference_units: MappingProxyType
    planned_interruptions: int
    source: str
    gpu_model: str
    """The GPU (catalog name) of the cluster the table was seen on."""
    host_gpus: int
    """The GPUs of one of its hosts: a per-host rate is that of such a host."""

    def rate_per_unit_s(self, cause: PresetCause, unit: str) -> float:
        """Failures per unit per second of ``cause`` counted in ``unit``."""
        return cause.count / self.reference_units[unit] / self.window_s


_GPU_REPAIR_S = 2 * DAY_S
_HOST_PART_REPAIR_S = 1 * DAY_S
_LINK_REPAIR_S = 4 * 3600.0

LLAMA3 = FailurePreset(
    causes=(
        PresetCause("faulty GPU", "gpu", 148, _GPU_REPAIR_S),
        PresetCause("GPU HBM3 memory", "hbm", 72, _GPU_REPAIR_S),
        PresetCause("software bug", "software", 54, 0.0),
        PresetCause("network switch/cable", "switch_cable", 35, _LINK_REPAIR_S),
        PresetCause("host maintenance", "host_maintenance", 32, _HOST_PART_REPAIR_S),
        PresetCause("GPU SRAM memory", "gpu_sram", 19, _GPU_REPAIR_S),
        PresetCause("GPU system processor", "gpu_system_processor", 17, _GPU_REPAIR_S),
        PresetCause("NIC", "nic", 7, _LINK_REPAIR_S),
        PresetCause("NCCL watchdog timeouts", "nccl_watchdog", 7, 0.0),
        PresetCause("silent data corruption", "silent_data_corruption", 6, _GPU_REPAIR_S),
        PresetCause("GPU thermal interface + sensor", "gpu_thermal", 6, _GPU_REPAIR_S),
        PresetCause("SSD", "ssd", 3, _HOST_PART_REPAIR_S),
        PresetCause("power supply", "power_supply", 3, _HOST_PART_REPAIR_S),
        PresetCause("server chassis", "server_chassis", 2, _HOST_PART_REPAIR_S),
        PresetCause("IO expansion board", "io_expansion_board", 2, _HOST_PART_REPAIR_S),
        PresetCause("dependency", "dependency", 2, 0.0),
        PresetCause("CPU", "cpu", 2, _HOST_PART_REPAIR_S),
        PresetCause("system memory", "system_memory", 2, _HOST_PART_REPAIR_S),
    ),
    window_s=54 * DAY_S,
    # "cable": the reference topology's links (NIC-leaf and leaf-spine), not physical cables (see above)
    reference_units=MappingProxyType({"gpu": 16384, "host": 2048, "nic": 16384, "cable": 24576,
                                      "leaf_switch": 512, "spine_switch": 16}),
    planned_interruptions=47,
    source="Llama 3 paper (Dubey et al. 2024), Table 5: 419 unexpected interruptions in 54 days on 16,384 H100",
    gpu_model="h100-sxm",
    host_gpus=8,
)

FAILURE_PRESETS: MappingProxyType = MappingProxyType({"llama3": LLAMA3})
