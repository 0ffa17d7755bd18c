"""The cyclic garbage collector is paused once, at the entry points (simulator/collector.py): the simulation
beneath `simulate()` and `collective_sweep()` runs with it off, and it is back on afterwards."""

from __future__ import annotations

import gc
import weakref

import simulator.collective_sweep as collective_module
import simulator.preflight as preflight
import simulator.simulation as simulation
from simulator import load_scenario, simulate
from simulator.collective_sweep import collective_sweep
from simulator.metrics.events import EventLog
from simulator.topology.loader import scenario_topology

COMM = "cluster: {topology: dgx-h100}\nworkload:\n  - {op: all_reduce, bytes: 64 MiB}\n"


def _spy(module, monkeypatch, name: str = "run_ops") -> list[bool]:
    """Record whether the collector is on each time ``module`` calls its function ``name`` (runs ops, by
    default)."""
    seen: list[bool] = []
    real = getattr(module, name)

    def spied(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spied)
    return seen


def test_simulate_and_collective_sweep_run_with_the_collector_paused(monkeypatch, tmp_path):
    assert gc.isenabled()
    in_simulate, in_sweep = _spy(simulation, monkeypatch), _spy(collective_module, monkeypatch)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(COMM)
    simulate(load_scenario(str(scenario)))
    collective_sweep("dgx-h100", {}, op="all_reduce", algorithm="ring", ranks=8, sizes=[2**20])
    assert (in_simulate, in_sweep) == ([False], [False]) and gc.isenabled()


def test_validate_builds_the_program_with_the_collector_paused(monkeypatch, tmp_path):
    """`trainsim validate` builds the step program a run builds, as large, so it pauses the collector too."""
    seen = _spy(preflight, monkeypatch, "prepare_training")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("cluster: {topology: dgx-h100}\nmodel: {layers: 2, hidden: 512, heads: 8, vocab: 1000}\n"
                        "training: {seq_len: 512, microbatches: 2}\nparallelism: {tp: 8}\n")
    loaded = load_scenario(str(scenario))
    preflight.validate(loaded, scenario_topology(loaded))
    assert seen == [False] and gc.isenabled()


def test_an_event_log_read_as_columns_is_freed_without_the_collector():
    """A log whose flows were read as columns holds the table it split them into; the table's reference back
    to the log made the pair a cycle, so with the collector paused every finished run's rows stayed until
    `gc.collect` (a 16,384-GPU job's straggler state left ~0.6 M tuples, 0.35 s to collect)."""
    log = EventLog()
    log.flow("k", 0, 1, 0.0, 1.0, 8.0, (0, 1))
    assert list(log.flow_columns()["bytes"]) == [8.0]
    freed = weakref.ref(log)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del log
        assert freed() is None
    finally:
        if enabled:
            gc.enable()
