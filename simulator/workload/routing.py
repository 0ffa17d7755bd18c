"""Token routing of a mixture-of-experts layer: which experts the tokens of one micro-batch pick, how many each
expert keeps under its capacity, and how the load falls on the EP ranks.

The sample covers one expert-parallel group for one micro-batch: ``ep`` source ranks with ``tokens`` tokens
each, every token picking ``top_k`` distinct experts. `uniform` routing is the ideal router (every expert gets
exactly k n / E of every rank's tokens); `zipf` and `dirichlet` fix an expert popularity and draw each token's
top_k without replacement in proportion to it (Gumbel top-k), from the run's seeded generator, so the same
seed gives the same sample. One sample stands for every MoE layer and micro-batch of the step.

Capacity (seed 000, 21.8.3): each expert accepts at most CF x n x k / E tokens from each source rank's n tokens
(the per-rank capacity of Megatron's token-drop policy); the rest are dropped and pass by on the residual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from simulator.config.moe import RoutingConfig

GUMBEL_CHUNK = 1 << 16
"""Tokens drawn at a time, to bound the memory of the Gumbel matrix (chunk x experts)."""
MAX_ROUTING_KEYS = 1 << 24
"""Gumbel keys (tokens x experts) a sample draws per source rank: a rank with more tokens routes
MAX_ROUTING_KEYS // experts of them and scales its counts up to all (65,536 tokens of 256 experts, 2 million of
8; a billion-token micro-batch drew for hours). The scaled counts keep the sample's popularity; their relative
noise is that of the tokens drawn (2% per expert at 256 experts, top 8), above the full sample's."""


def popularity(routing: RoutingConfig, experts: int, rng: np.random.Generator) -> np.ndarray:
    """Probability of each expert being picked, by the routing's balance and skew."""
    if routing.balance == "zipf":
        weights = 1.0 / np.arange(1, experts + 1, dtype=np.float64) ** routing.skew
    elif routing.balance == "dirichlet":
        weights = rng.dirichlet(np.full(experts, 1.0 / routing.skew))
    else:
        weights = np.ones(experts)
    return weights / weights.sum()


@dataclass(frozen=True, eq=False)
class RoutingSample:
    """Assignments per (source rank, expert) of one micro-batch in one EP group, before and after capacity.
    Equal only to itself (its arrays have no one truth value), so a cache may key a step's MoE block on it."""

    counts: np.ndarray
    capacity: float
    top_k: int

    @cached_property
    def kept(self) -> np.ndarray:
        """Assignments each expert accepts from each source rank: min(count, capacity) (read-only)."""
        kept = np.minimum(self.counts, self.capacity)
        kept.flags.writeable = False
        return kept

    @property
    def dropped_fraction(self) -> float:
        """Share of the token-expert assignments dropped by the capacity limit."""
        total = float(self.counts.sum())
        return 1.0 - float(self.kept.sum()) / total if total else 0.0

    def expert_load(self) -> np.ndarray:
        """Tokens each expert computes (kept, summed over source ranks)."""
        return self.kept.sum(axis=0)

    def rank_load(self, ep: int) -> np.ndarray:
        """Tokens each EP rank's experts compute; rank j holds experts j E/ep .. (j+1) E/ep - 1."""
        return self.expert_load().reshape(ep, -1).sum(axis=1)

    def pair_tokens(self, ep: int) -> np.ndarray:
        """Tokens source rank i sends to EP rank j in the dispatch (kept assignments of i's tokens to the
        experts j holds): the all-to-all's matrix, row = sender; the combine sends the transpose back."""
        return self.kept.reshape(ep, ep, -1).sum(axis=2)

    def hottest_rank(self, ep: int) -> int:
        """The EP rank with the most tokens to compute (the first of equals)."""
        return int(np.argmax(self.rank_load(ep)))


def sample_routing(routing: RoutingConfig, experts: int, top_k: int, capacity_factor: float | None, tokens: int,
                   ranks: int, rng: np.random.Generator) -> RoutingSample:
    """Route ``tokens`` tokens on each of ``ranks`` source ranks to ``top_k`` of ``experts`` experts (at most
    MAX_ROUTING_KEYS // experts of them drawn, the counts scaled to all)."""
    capacity = math.inf if capacity_factor is None else math.ceil(capacity_factor * tokens * top_k / experts)
    if routing.balance == "uniform":
        counts = np.full((ranks, experts), tokens * top_k / experts)
        return RoutingSample(counts, capacity, top_k)
    with np.errstate(divide="ignore"):  # an expert a very skewed Dirichlet never picks: log 0 = -inf, never drawn
        log_p = np.log(popularity(routing, experts, rng))
    drawn = min(tokens, max(1, MAX_ROUTING_KEYS // experts))
    counts = np.zeros((ranks, experts))
    for rank in range(ranks):
        for start in range(0, drawn, GUMBEL_CHUNK):
            size = min(GUMBEL_CHUNK, drawn - start)
            keys = log_p + rng.gumbel(size=(size, experts))
            picks = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
            counts[rank] += np.bincount(picks.ravel(), minlength=experts)
    return RoutingSample(counts * (tokens / drawn) if drawn < tokens else counts, capacity, top_k)
