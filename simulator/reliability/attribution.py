"""Each cause's share of a slower state's extra time: the Shapley value of the causes over the state's sub-states.

A state with several causes in force (a spine down and a throttled GPU, a shrunk job with a slow cable) is
slower than healthy by its extra time per unit of healthy work, x = step / healthy-equivalent step - 1. The
sub-state of a subset of the causes is the state with only their degradations (and the shrink, where
`elastic_shrink` is among them); its x, floored at 0 (a state faster than healthy has no slow-step time), is
the subset's value, 0 for none. A cause's Shapley value is its marginal effect (the value with it less the
value without it) averaged over every order in which the causes could have come: a cause that slows no
sub-state it joins gets 0, and the values add up to the state's x. A sub-state with no route for some GPU
(possible only without the shrink: the job on all its hosts, some cut off by links down) takes the state's own
value: it could not train at all, so the causes it lacks cost it nothing more than the state does. A cause whose
Shapley value is negative (it lessens the others' slowdown more than it adds: an elastic shrink beside a
straggler, where the shrunk job with the straggler is faster than the straggler alone) gets 0, and the others'
positive values split the state's share: no cause is charged negative slow-step time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations
from math import factorial


def shapley(causes: Sequence[str], value: Callable[[frozenset[str]], float]) -> dict[str, float]:
    """Each cause's Shapley value under ``value`` (of a subset of ``causes``; of the empty one, 0), summed in a
    fixed order (``causes`` as given, subsets by size) so that it is deterministic."""
    n = len(causes)
    values: dict[frozenset[str], float] = {}

    def of(subset: frozenset[str]) -> float:
        if subset not in values:
            values[subset] = value(subset) if subset else 0.0
        return values[subset]

    result = {}
    for cause in causes:
        others = [other for other in causes if other != cause]
        total = 0.0
        for size in range(n):
            weight = factorial(size) * factorial(n - size - 1) / factorial(n)
            for subset in combinations(others, size):
                without = frozenset(subset)
                total += weight * (of(without | {cause}) - of(without))
        result[cause] = total
    return result


def cause_shares(share: float, causes: Sequence[str], extra: Callable[[frozenset[str]], float | None]
                 ) -> tuple[tuple[str, float], ...]:
    """Each cause's part of a state's extra time per unit of training time, ``share`` (1 - healthy-equivalent
    step / step), split by the Shapley values of ``extra`` (a subset's sub-state x, None without a route; of
    every cause, the state's own); the parts add up to ``share``. Nothing for a state faster than healthy
    (it has no slow-step time)."""
    if share < 0:
        return ()
    everything = frozenset(causes)
    whole = extra(everything)
    assert whole is not None, "the job trains only in a state with a route for every GPU"

    def value(subset: frozenset[str]) -> float:
        x = extra(subset)
        return max(whole if x is None else x, 0.0)

    values = {cause: max(part, 0.0) for cause, part in shapley(causes, value).items()}
    total = sum(values.values())
    if total <= 0:
        return tuple((cause, 0.0) for cause in causes)
    return tuple((cause, share * (values[cause] / total)) for cause in causes)
