"""summary.json of a training step: step time, throughput, MFU/HFU, bubbles, communication, memory and the
bottleneck among the four constraints (compute, memory bandwidth, memory capacity, communication)."""

from __future__ import annotations

import pandas as pd

from simulator.metrics.step import bubble_fraction, communication_metrics, traffic_bytes

COMMUNICATION_BOUND_RATIO = 0.30
"""Exposed communication above this share of the step makes communication the binding constraint (the seed
chapter's rule of thumb: under ~10% scales well, over ~30% stop adding GPUs)."""


def bottleneck(step_time_s: float, comm: dict, memory: dict, memory_bound_share: float, bubble: float) -> dict:
    """Which constraint binds, with the evidence that decided it."""
    exposed = sum(comm["exposed_comm_s"].values())
    evidence = {
        "exposed_comm_share": exposed / step_time_s if step_time_s else 0.0,
        "memory_bound_compute_share": memory_bound_share,
        "memory_use_share": memory["peak_memory_gib"] / memory["memory_capacity_gib"] if memory else 0.0,
        "bubble_fraction": bubble,
    }
    if memory.get("oom"):
        binding = "memory_capacity"
    elif evidence["exposed_comm_share"] > COMMUNICATION_BOUND_RATIO:
        binding = "communication"
    elif memory_bound_share > 0.5:
        binding = "memory_bandwidth"
    else:
        binding = "compute"
    return {"constraint": binding, "evidence": evidence}


def training_summary(frame: pd.DataFrame, *, step_time_s: float, gpus: int, simulated_ranks: int,
                     tokens_per_step: float, model_flops_per_step: float, peak_flops: float, memory: dict,
                     memory_bound_share: float) -> dict:
    """The summary keys of a training step. FLOP rates are per GPU; MFU counts model FLOPs without recompute,
    HFU the FLOPs the GPUs really executed (recompute included)."""
    comm = communication_metrics(frame, step_time_s)
    bubble = bubble_fraction(frame)
    executed_flops = float(frame.loc[frame["kind"] == "compute", "flops"].sum()) / max(simulated_ranks, 1)
    model_flops_per_gpu = model_flops_per_step / gpus
    summary = {
        "step_time_s": step_time_s,
        "tokens_per_s": tokens_per_step / step_time_s if step_time_s else 0.0,
        "tflops_per_gpu": model_flops_per_gpu / step_time_s / 1e12 if step_time_s else 0.0,
        "hardware_tflops_per_gpu": executed_flops / step_time_s / 1e12 if step_time_s else 0.0,
        "mfu": model_flops_per_gpu / (step_time_s * peak_flops) if step_time_s else 0.0,
        "hfu": executed_flops / (step_time_s * peak_flops) if step_time_s else 0.0,
        "bubble_fraction": bubble,
        "comm_ratio": comm["comm_ratio"],
        "exposed_comm_s": comm["exposed_comm_s"],
        "comm_s": comm["comm_s"],
        "traffic_bytes_per_gpu": traffic_bytes(frame),
        **memory,
    }
    summary["bottleneck"] = bottleneck(step_time_s, comm, memory, memory_bound_share, bubble)
    return summary
