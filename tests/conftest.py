"""Shared helpers: run a scenario given as YAML text, as a step or as a job; the session's notebooks started once
its tests are collected (tests/notebook_runs.py)."""

from __future__ import annotations

import math
from pathlib import Path

import notebook_runs
import numpy as np
import pytest
import yaml
from shared import DATA

from simulator import simulate
from simulator.config.loader import scenario_from_text
from simulator.console import progress

FOLDER = pytest.StashKey[Path]()
"""The folder an xdist controller hands its workers for the session's notebooks, made where it starts them (its
config's stash)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The notebooks' tests last (a stable order, the same in every xdist worker), so that the notebooks run beside
    every other test before those read what they left."""
    items.sort(key=lambda item: item.path.name == "test_notebooks.py")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the notebooks that the selected tests run (`-k pipeline`: the pipeline notebook alone), beside the
    tests before them; under pytest-xdist the controller starts them (pytest_xdist_node_collection_finished)."""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    paths = notebook_runs.selected([item.nodeid for item in session.items])
    if paths:
        _start(session.config, paths, notebook_runs.folder_name())


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Hand every xdist worker the name of the one folder the session's notebooks are written to (made where they
    start, so that a controller killed before its end leaves none behind where no notebook runs)."""
    config = node.config
    if FOLDER not in config.stash:
        config.stash[FOLDER] = notebook_runs.folder_name()
    node.workerinput[notebook_runs.WORKER_FOLDER] = str(config.stash[FOLDER])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Start the notebooks that the selected tests run once, when the first xdist worker has collected them (every
    worker collects the same tests, and none runs one before all have collected)."""
    config = node.config
    paths = notebook_runs.selected(ids)
    if paths and notebook_runs.RUNS not in config.stash:
        _start(config, paths, config.stash[FOLDER])


def _start(config: pytest.Config, paths: list[Path], folder: Path) -> None:
    """Start the session's notebooks, ended early where `-x` or `--maxfail` stops the session."""
    runs = config.stash[notebook_runs.RUNS] = notebook_runs.start(paths, folder)
    if config.option.maxfail:
        config.pluginmanager.register(notebook_runs.EndAtMaxfail(runs, config.option.maxfail))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """End the notebooks' runner, whether or not their tests read it, and remove what it wrote."""
    runs = session.config.stash.get(notebook_runs.RUNS, None)
    if runs is not None:
        runs.stop()


@pytest.fixture(autouse=True)
def no_heartbeat_lines(request, monkeypatch):
    """No progress heartbeat line (console/progress.py prints one every PLAIN_EVERY_S seconds of wall time off a
    terminal): on a loaded machine a test's command ran past 10 s and its captured stderr held one, which no test
    expects. Tests marked `heartbeat` (tests/test_console.py, which tests the lines) keep the real period."""
    if request.node.get_closest_marker("heartbeat") is None:
        monkeypatch.setattr(progress, "PLAIN_EVERY_S", math.inf)


@pytest.fixture(scope="session")
def catalog_sources() -> dict:
    """The published figures behind the catalog's constants (tests/data/catalog_sources.yaml)."""
    return yaml.safe_load((DATA / "catalog_sources.yaml").read_text())


@pytest.fixture
def run_yaml():
    """Simulate a scenario written inline; returns the Result."""

    def run(text: str, *overrides: str):
        return simulate(scenario_from_text(text, "inline.yaml", list(overrides)))

    return run


@pytest.fixture
def text_job():
    """Simulate the job of a scenario written inline (``settings`` as `--set` gives them); returns the JobResult.
    Which modules are imported changes no simulated figure, only the inputs the fuzz tests draw (Hypothesis draws
    literals of the loaded project modules: measured, tests/test_fuzz_cli.py alone and after importing
    simulator.reliability.simulate, the same input gave the same outputs)."""

    def run(text: str, *settings: str):
        from simulator.reliability.simulate import simulate_job

        return simulate_job(scenario_from_text(text, "job.yaml", list(settings)))

    return run


@pytest.fixture
def job_with(monkeypatch):
    """Simulate the job of a scenario written inline with exactly these failures, the seeded draw replaced:
    (time s, class index, unit, repair s) rows."""
    import simulator.reliability.simulate as job_simulation
    from simulator.reliability.processes import Arrivals

    def run(text: str, *rows):
        time, klass, unit, repair = (np.asarray(column) for column in zip(*rows))
        arrivals = Arrivals(time.astype(float), klass.astype(int), unit.astype(int), repair.astype(float))
        monkeypatch.setattr(job_simulation, "draw_arrivals", lambda rng, classes, counts, horizon: arrivals)
        return job_simulation.simulate_job(scenario_from_text(text, "job.yaml"))

    return run


@pytest.fixture
def validation_error():
    """The ScenarioError that loading and validating an inline scenario raises (the test fails if none)."""
    from simulator.errors import ScenarioError
    from simulator.preflight import validate
    from simulator.topology.loader import scenario_topology

    def check(text: str, *overrides: str) -> ScenarioError:
        with pytest.raises(ScenarioError) as info:
            loaded = scenario_from_text(text, "inline.yaml", list(overrides))
            validate(loaded, scenario_topology(loaded))
        return info.value

    return check


@pytest.fixture
def assert_located():
    """Checks that a validation error names its field and problem and points at its source."""
    return _assert_located


def _assert_located(error, overrides: tuple[str, ...], field: str, problem: str) -> None:
    """A validation error names ``field`` and ``problem`` and points at its source: the `--set` override that set
    the faulty value, or else a line of the scenario."""
    assert error.field == field
    assert problem in error.problem
    setting = next((item for item in overrides if item.split("=")[0] == field), None)
    if setting is not None:
        assert (error.file, error.line) == (f"--set {setting}", None)
    else:
        assert error.line is not None
