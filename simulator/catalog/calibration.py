"""Compute-efficiency calibration per GPU: the roofline's plateau efficiencies, fitted to published runs.

A100 (a100-40gb, a100-80gb): fitted on two Megatron-LM SC21 Table 1 rows (1.7B on 32 GPUs and 18.4B on 256
GPUs, standard attention, full recompute) and checked on the other rows up to 512 GPUs; docs/validation.md
lists predicted vs published. Other GPUs keep the cost model's uncalibrated defaults until measured.
"""

from __future__ import annotations

from types import MappingProxyType

from simulator.workload.roofline import Efficiency

CALIBRATED = MappingProxyType({
    "a100-40gb": Efficiency(matmul_peak=0.64, attention_peak=0.50),
    "a100-80gb": Efficiency(matmul_peak=0.64, attention_peak=0.50),
})


def compute_efficiency(gpu_name: str) -> Efficiency:
    """The calibrated efficiencies of ``gpu_name``, or the defaults when it has not been calibrated."""
    return CALIBRATED.get(gpu_name, Efficiency())
