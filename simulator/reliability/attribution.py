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

Exact Shapley values ask for every sub-state, 2^k - 1 of them for k causes (on a small mixed job, a leaf, a
spine and a straggler class, they added 24% more steps with links down, each a full step): up to
EXACT_CAUSES causes they are exact; above, each cause's value is its leave-one-out effect instead (the state's
x less the x of the sub-state without it), k sub-states, and the positive ones split the share as above.
Where no cause's effect is positive (several stragglers each enough alone to slow the state as much as all
of them: removing any one leaves the state as slow), the share splits evenly between the causes: the parts
always add up to the state's share, and the slow time is never counted productive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations
from math import factorial

from simulator.errors import TrainsimError

EXACT_CAUSES = 3
"""The most causes in force whose shares are exact Shapley values (up to 2^3 - 1 = 7 sub-states, 6 besides the
state's own); with more, each cause's leave-one-out effect splits the share (`leave_one_out`: k sub-states, 5
instead of 31 for 5 causes)."""


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


def leave_one_out(causes: Sequence[str], value: Callable[[frozenset[str]], float]) -> dict[str, float]:
    """Each cause's leave-one-out effect under ``value``: the value of every cause less that of every cause but
    it (the cheaper attribution `cause_shares` takes above EXACT_CAUSES causes)."""
    everything = frozenset(causes)
    whole = value(everything)
    return {cause: whole - value(everything - {cause}) for cause in causes}


def even_shares(share: float, causes: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``share`` split evenly between ``causes`` (a state some sub-state of which could not be simulated, or
    one where no cause's effect is positive)."""
    return tuple((cause, share / len(causes)) for cause in causes)


def cause_shares(share: float, causes: Sequence[str], extra: Callable[[frozenset[str]], float | None],
                 refused: Callable[[str], None] | None = None) -> tuple[tuple[str, float], ...]:
    """Each cause's part of a state's extra time per unit of training time, ``share`` (1 - healthy-equivalent
    step / step), split by the Shapley values of ``extra`` (a subset's sub-state x, None without a route; of
    every cause, the state's own), or by their leave-one-out effects above EXACT_CAUSES causes; the parts add
    up to ``share``. Nothing for a state faster than healthy (it has no slow-step time). Where ``extra``
    raises for a sub-state (one refused: past the scale limits, say, or a shrunk cluster the scenario cannot
    have), ``share`` splits evenly between the causes and ``refused`` hears why: the state itself trains, and
    only its split is lost (the error ended the whole job; it still does without ``refused``)."""
    if share < 0:
        return ()
    try:
        return _split(share, causes, extra)
    except TrainsimError as exc:
        if refused is None:
            raise
        refused(str(exc))
        return even_shares(share, causes)


def _split(share: float, causes: Sequence[str], extra: Callable[[frozenset[str]], float | None]
           ) -> tuple[tuple[str, float], ...]:
    """`cause_shares` where every sub-state asked is simulated."""
    everything = frozenset(causes)
    whole = extra(everything)
    assert whole is not None, "the job trains only in a state with a route for every GPU"

    def value(subset: frozenset[str]) -> float:
        x = extra(subset)
        return max(whole if x is None else x, 0.0)

    split = shapley if len(causes) <= EXACT_CAUSES else leave_one_out
    values = {cause: max(part, 0.0) for cause, part in split(causes, value).items()}
    total = sum(values.values())
    if total <= 0:
        return even_shares(share, causes)
    return tuple((cause, share * (values[cause] / total)) for cause in causes)
