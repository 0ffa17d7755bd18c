"""Data flows one way (config -> cluster -> program -> engine -> metrics -> reports): a layer's import does not
load the layers after it, and the names-only modules the first layers read agree with the registries."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import get_args

from shared import REPO

from simulator.collectives.names import AlgorithmName
from simulator.collectives.registry import ALGORITHMS
from simulator.config.parallelism_options import BuiltinSchedule
from simulator.metrics.events import RowKind
from simulator.program.ops import COMM_STREAM, COMPUTE_STREAM
from simulator.schedules.registry import SCHEDULES


def modules_loaded_by(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def loaded_under(modules: set[str], *packages: str) -> list[str]:
    """The members of ``modules`` that are one of ``packages`` or inside one."""
    return sorted(name for name in modules if any(name == p or name.startswith(f"{p}.") for p in packages))


def test_reading_the_schema_loads_no_algorithm_schedule_parallel_layer_or_engine():
    loaded = modules_loaded_by("import simulator.config.schema")
    assert loaded_under(loaded, "simpy", "numpy", "networkx", "simulator.collectives.registry",
                        "simulator.collectives.execute", "simulator.network.model", "simulator.schedules",
                        "simulator.parallel", "simulator.workload", "simulator.catalog", "simulator.topology",
                        "simulator.program") == []


def test_the_names_modules_list_every_registered_algorithm_and_schedule_in_order():
    assert tuple(ALGORITHMS) == get_args(AlgorithmName)
    assert tuple(SCHEDULES) == get_args(BuiltinSchedule)


def test_the_catalog_reads_data_and_imports_none_of_its_consumers():
    loaded = modules_loaded_by("import simulator.catalog.calibration")
    assert loaded_under(loaded, "simulator.parallel", "simulator.program", "simulator.workload",
                        "simulator.collectives", "simulator.engine") == []


def test_the_collective_command_starts_without_the_workload_builders_or_the_schema():
    loaded = modules_loaded_by("import simulator.collective_sweep")
    assert loaded_under(loaded, "simulator.workload", "simulator.parallel.builder_core", "simulator.parallel.overlap",
                        "simulator.config.schema", "pydantic") == []


BEFORE_THE_ORCHESTRATOR = ("catalog", "collectives", "config", "engine", "faults", "metrics", "network", "parallel",
                           "parameter_server", "program", "schedules", "topology", "workload")
"""The packages the run's orchestrator (simulation.py) calls, which therefore never call it back."""


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level, in functions or for type checking alone."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return names


def test_no_layer_the_orchestrator_calls_imports_it():
    importers = sorted(str(path.relative_to(REPO)) for package in BEFORE_THE_ORCHESTRATOR
                       for path in (REPO / "simulator" / package).rglob("*.py")
                       if "simulator.simulation" in imported_modules(path))
    assert importers == []


def _compares_column_to(node: ast.AST, spelt: dict[str, set[str]]) -> bool:
    """Whether ``node`` compares a column (``frame["kind"]``) with one of the strings ``spelt`` lists for it."""
    if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Subscript)
            and isinstance(node.left.slice, ast.Constant)):
        return False
    words = spelt.get(node.left.slice.value, set())
    return any(isinstance(right, ast.Constant) and right.value in words for right in node.comparators)


def test_the_logs_rows_are_selected_by_the_defined_kinds_and_streams():
    """A `kind` or `stream` column compared with a string spelt out selects no rows, silently, once the string
    changes (a misspelt constant is an error): row kinds come from metrics/events.py, streams from
    program/ops.py."""
    spelt = {"kind": set(get_args(RowKind)), "stream": {COMPUTE_STREAM, COMM_STREAM}}
    found = [f"{path.relative_to(REPO)}:{node.lineno}" for path in sorted((REPO / "simulator").rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text())) if _compares_column_to(node, spelt)]
    assert found == []


def test_a_step_without_links_down_never_loads_networkx():
    """networkx serves the detours around links down alone (faults/rerouting.py), so a healthy step's simulate()
    spares its import (~0.1 s of CPU): the NVLS check looks for a rerouter without importing its module."""
    loaded = modules_loaded_by("import simulator\n"
                               "simulator.simulate(simulator.load_scenario('scenarios/llama3-8b-dgx-h100-dp8.yaml'))")
    assert loaded_under(loaded, "networkx") == []
