"""Shared helpers: run a scenario given as YAML text."""

from __future__ import annotations

import pytest

from simulator import simulate
from simulator.config.loader import scenario_from_text


@pytest.fixture
def run_yaml():
    """Simulate a scenario written inline; returns the Result."""

    def run(text: str, *overrides: str):
        return simulate(scenario_from_text(text, "inline.yaml", list(overrides)))

    return run


@pytest.fixture
def validation_error():
    """The ScenarioError that loading and validating an inline scenario raises (the test fails if none)."""
    from simulator.errors import ScenarioError
    from simulator.simulation import build_topology, validate

    def check(text: str, *overrides: str) -> ScenarioError:
        with pytest.raises(ScenarioError) as info:
            loaded = scenario_from_text(text, "inline.yaml", list(overrides))
            validate(loaded, build_topology(loaded))
        return info.value

    return check
