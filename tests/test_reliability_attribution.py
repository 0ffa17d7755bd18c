"""Slow-step time split by cause (attribution.py): Shapley values over the sub-states, by hand."""

from __future__ import annotations

import random
from itertools import combinations

import pytest
from shared import ONE_GPU_HOSTS

from simulator.config.loader import scenario_from_text
from simulator.errors import ScenarioError
from simulator.reliability import attribution
from simulator.reliability.attribution import cause_shares, shapley
from simulator.reliability.simulate import simulate_job, split_evenly_warning
from simulator.reliability.states import ClusterState


def table(values: dict[str, float | None]):
    """A value function from a table keyed by the causes' initials ('' for none)."""
    return lambda subset: values["".join(sorted(subset))]


def test_interacting_causes_split_by_their_shapley_values():
    """x(A) = 0.2, x(B) = 0.1, x(AB) = 0.5 (together worse than the sum): A gets (0.2 + (0.5 - 0.1)) / 2 = 0.3 and B
    (0.1 + (0.5 - 0.2)) / 2 = 0.2 of the state's x. The state's share 1 - 1/1.5 = 1/3 splits 0.3 : 0.2, A 0.2 and B
    2/15 of its training time (not 1/6 each, evenly)."""
    values = {"A": 0.2, "B": 0.1, "AB": 0.5}
    assert shapley(["A", "B"], table(values)) == pytest.approx({"A": 0.3, "B": 0.2}, abs=1e-15)
    parts = dict(cause_shares(1 / 3, ["A", "B"], table(values)))
    assert parts == pytest.approx({"A": 0.2, "B": 2 / 15}, rel=1e-12)


def test_a_cause_that_slows_nothing_gets_nothing():
    """Three causes; B slows no sub-state it joins (x(B) = x(BC) = 0, x(AB) = x(A), x(ABC) = x(AC)): 0 for B.
    A's marginals 0.3, 0.3 (after B), 0.6 (after C), 0.6 (after B and C) weighted 1/3, 1/6, 1/6, 1/3: 0.45;
    C's 0, 0.3, 0, 0.3 likewise: 0.15 (they add up to x(ABC) = 0.6)."""
    values = {"A": 0.3, "B": 0.0, "C": 0.0, "AB": 0.3, "AC": 0.6, "BC": 0.0, "ABC": 0.6}
    assert shapley(["A", "B", "C"], table(values)) == pytest.approx({"A": 0.45, "B": 0.0, "C": 0.15}, abs=1e-15)
    share = 1 - 1 / 1.6
    parts = dict(cause_shares(share, ["A", "B", "C"], table(values)))
    assert parts["B"] == 0.0
    assert parts == pytest.approx({"A": share * 0.75, "B": 0.0, "C": share * 0.25}, rel=1e-12)


def test_a_sub_state_without_a_route_counts_as_slow_as_the_state_and_a_faster_one_as_healthy():
    """x(A) has no route (None): it takes x(AB) = 0.4, so B, which adds nothing to it, gets (0.1 + 0) / 2 and A
    (0.4 + 0.3) / 2. A sub-state faster than healthy (x(A) = -0.2) counts 0: A gets (0 + 0.3) / 2, B
    (0.1 + 0.4) / 2, not a negative marginal against A's speed-up."""
    assert dict(cause_shares(0.25, ["A", "B"], table({"A": None, "B": 0.1, "AB": 0.4}))) == pytest.approx(
        {"A": 0.25 * 0.35 / 0.4, "B": 0.25 * 0.05 / 0.4}, rel=1e-12)
    assert dict(cause_shares(0.25, ["A", "B"], table({"A": -0.2, "B": 0.1, "AB": 0.4}))) == pytest.approx(
        {"A": 0.25 * 0.15 / 0.4, "B": 0.25 * 0.25 / 0.4}, rel=1e-12)


def test_one_cause_takes_the_whole_share_and_a_faster_state_none():
    """A single cause gets exactly the state's share (to the bit); a state faster than healthy has no parts."""
    assert cause_shares(0.123456789, ["A"], table({"A": 1 / (1 - 0.123456789) - 1})) == (("A", 0.123456789),)
    assert cause_shares(-0.1, ["A", "B"], table({})) == ()


def test_a_cause_that_offsets_another_gets_nothing_not_a_negative_part():
    """A shrink alone faster than healthy (x(B) = -0.05, counted 0) and the shrunk job with the straggler faster
    than the straggler alone (x(AB) = 0.129 < x(A) = 0.146): B's Shapley value, (0 + (0.129 - 0.146)) / 2 =
    -0.0085, would charge it negative slow-step time, so B gets 0 and A the state's whole share."""
    values = {"A": 0.146, "B": -0.05, "AB": 0.129}
    assert shapley(["A", "B"], table({**values, "B": 0.0}))["B"] == pytest.approx(-0.0085, abs=1e-15)
    assert dict(cause_shares(0.1, ["A", "B"], table(values))) == {"A": 0.1, "B": 0.0}


def test_above_the_exact_cap_each_cause_gets_its_leave_one_out_effect_from_as_many_sub_states():
    """Exact Shapley values over 4 causes ask all 15 sub-states; above EXACT_CAUSES (3) each cause's share is
    its leave-one-out effect, x(ABCD) less x without it, over 4 sub-states (and the state's own): here A
    0.8 - 0.5 = 0.3, B 0.8 - 0.7 = 0.1, C 0.8 - 0.8 = 0, D 0.8 - 0.6 = 0.2, which split the share 3 : 1 : 0 : 2."""
    values = {"ABCD": 0.8, "BCD": 0.5, "ACD": 0.7, "ABD": 0.8, "ABC": 0.6}
    asked: list[str] = []

    def extra(subset):
        asked.append("".join(sorted(subset)))
        return values[asked[-1]]

    parts = dict(cause_shares(0.6, ["A", "B", "C", "D"], extra))
    assert parts == pytest.approx({"A": 0.3, "B": 0.1, "C": 0.0, "D": 0.2}, rel=1e-12)
    assert sorted(set(asked)) == ["ABC", "ABCD", "ABD", "ACD", "BCD"]


def test_a_sub_state_refused_splits_the_state_evenly_and_says_why():
    """A sub-state that cannot be simulated (its step refused past the scale limits, say) does not end the whole job:
    the state's share splits evenly between its causes, and the refusal is heard; without a listener it is raised."""
    def extra(subset):
        if subset == frozenset("A"):
            raise ScenarioError("too large", field="faults.components")
        return {"B": 0.1, "AB": 0.4}["".join(sorted(subset))]

    heard: list[str] = []
    assert dict(cause_shares(0.3, ["A", "B"], extra, heard.append)) == pytest.approx({"A": 0.15, "B": 0.15},
                                                                                     rel=1e-12)
    assert len(heard) == 1 and "too large" in heard[0]
    with pytest.raises(ScenarioError):
        cause_shares(0.3, ["A", "B"], extra)


def test_the_even_split_warning_counts_its_states_and_names_the_first_with_its_replicas():
    """It read '7 cluster states is split evenly between its causes', and its first state as '2 link(s) down'
    on a job shrunk to 3 replicas, leaving the replicas out; one state is counted in the singular."""
    shrunk = ClusterState(3, links_down=(("a", "b"), ("c", "d")))
    whole = ClusterState(4, spines_down=1, slow_gpus=((0, 1.5),))
    assert split_evenly_warning({whole: "too large", shrunk: "refused"}) == (
        "the slow-step time of 2 cluster states is split evenly between the causes in force, not by their "
        "effects: a state with fewer of them could not be simulated (first: 3 replicas, 2 link(s) down: refused)")
    assert "of 1 cluster state is split" in (split_evenly_warning({whole: "too large"}) or "")
    assert split_evenly_warning({}) is None


def test_causes_each_enough_alone_above_the_exact_cap_split_the_share_evenly_not_drop_it():
    """Four stragglers each enough alone to slow the state as much as all four: removing any one leaves the
    slowdown unchanged, so every leave-one-out effect is 0, and above the exact cap the share splits evenly
    rather than being counted productive (three causes, exact, get 1/9 each)."""
    parts = dict(cause_shares(1 / 3, list("ABCD"), lambda subset: 0.5 if subset else 0.0))
    assert parts == pytest.approx(dict.fromkeys("ABCD", 1 / 12), rel=1e-12)


def _random_game(rng: random.Random, causes: str, monotone: bool):
    """A value for every subset of ``causes``: sums of random gains per cause (monotone), or random values,
    some below 0 and some None (no route), and the whole state above 0; with it the state's share."""
    gains = {cause: rng.choice([0.0, rng.uniform(0, 0.5)]) for cause in causes}
    values: dict[str, float | None] = {}
    for size in range(1, len(causes) + 1):
        for subset in combinations(causes, size):
            key = "".join(subset)
            if monotone:
                values[key] = sum(gains[cause] for cause in subset) * rng.choice([1.0, 1 / size])
            else:
                values[key] = rng.choice([None, rng.uniform(-0.3, 1.0)])
    values[causes] = rng.uniform(0.01, 1.0)
    return table(values), 1 - 1 / (1 + values[causes])


@pytest.mark.parametrize("monotone", [True, False], ids=["monotone", "non-monotone"])
def test_the_parts_always_add_up_to_the_states_share(monotone):
    """Random games of 1 to 6 causes (a fixed seed), exact below and at EXACT_CAUSES, leave-one-out above:
    each part at least 0, and the parts add up to the state's share."""
    rng = random.Random(38)
    for _ in range(300):
        causes = "ABCDEF"[:rng.randint(1, 6)]
        value, share = _random_game(rng, causes, monotone)
        parts = dict(cause_shares(share, list(causes), value))
        assert min(parts.values()) >= 0
        assert sum(parts.values()) == pytest.approx(share, rel=1e-12)


FIVE_STRAGGLERS = ONE_GPU_HOSTS + """run: {horizon: 10 d, replications: 2, seed: 1}
faults:
  components:
""" + "".join(f"    throttle_{name}: {{unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 100 h, repair: 48 h}}\n"
              for name in "abcde")


def test_a_job_with_more_stragglers_than_the_exact_cap_keeps_all_its_slow_step_time(monkeypatch):
    """Five straggle classes on four one-GPU hosts, often four or more throttled at once, each as slow alone as
    all together: the split above the cap keeps all the slow-step time exact Shapley values give (27,579 s, ETTR
    0.968)."""
    capped = simulate_job(scenario_from_text(FIVE_STRAGGLERS)).summary
    monkeypatch.setattr(attribution, "EXACT_CAUSES", 5)
    exact = simulate_job(scenario_from_text(FIVE_STRAGGLERS)).summary
    slow = capped["time_s"]["slow_steps_s"]["mean"]
    assert slow == pytest.approx(exact["time_s"]["slow_steps_s"]["mean"], rel=1e-12)
    assert sum(cause["mean"] for cause in capped["slow_steps_by_cause_s"].values()) == pytest.approx(slow, rel=1e-12)
    assert capped["ettr"]["mean"] == pytest.approx(exact["ettr"]["mean"], rel=1e-12)
