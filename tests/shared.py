"""Scenarios and checks that several test modules use, imported as `from shared import ...` (tests/ is on the path
when pytest runs; there is no tests package)."""

from __future__ import annotations

import math

RAILS = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2}
model: {layers: 4, hidden: 4096, heads: 32, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {tp: 8, dp: 4}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
"""
"""Four DGX hosts in two leaf groups of two (eight rails, two spines), a replica per host: a rotation by two
replicas moves leaf group 0 onto leaf group 1."""

ONE_GPU_HOSTS = """
cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1,
          leaf_ports: 2, spines: 2, oversubscription: 2}
model: {layers: 2, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {dp: 4}
checkpoint: {interval: 1000 d}
storage: {capacity: 1 PB}
"""
"""Four hosts of one GPU each under two leaves (two spines, oversubscribed 2:1), a replica a host."""

LLAMA3_8B_ON_4_HOSTS = """
cluster: {topology: dgx-h100-cluster, nodes: 4}
model: {preset: llama3-8b}
training: {seq_len: 2048, global_batch: 16}
parallelism: {tp: 8, dp: 4}
"""
"""The step of the jobs with an in-memory tier (test_reliability_memory_tier.py, test_reliability_two_level.py):
32 GPUs, a replica a host."""


def _figures(summary: dict, path: str = "") -> dict[str, object]:
    """Every leaf of ``summary`` by its path, the fold's own entries (the folds given up, the ranks' weights among them)
    left out."""
    if isinstance(summary, dict):
        return {key: value for name, entry in summary.items()
                if name not in ("folded", "simulated_ranks", "ops_executed", "flows_simulated", "fold_given_up",
                                "rank_weights")
                for key, value in _figures(entry, f"{path}.{name}").items()}
    return {path: summary}


def assert_same_figures(folded: dict, unfolded: dict, rel: float, absolute: float, reason: str = "") -> None:
    """Every figure of the folded summary equals the unfolded one's (floats within ``rel`` / ``absolute``), the
    folded run's ``reason`` entry (why it refolded) its only extra."""
    ours, theirs = _figures(folded), _figures(unfolded)
    assert ours.keys() - ({f".{reason}"} if reason else set()) == theirs.keys()
    for path, value in theirs.items():
        if isinstance(value, float):
            assert math.isclose(ours[path], value, rel_tol=rel, abs_tol=absolute), path
        else:
            assert ours[path] == value, path
