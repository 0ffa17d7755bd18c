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
