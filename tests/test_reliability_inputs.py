"""Inputs of the job simulation: every kind of bad input is one located line with exit status 2 and no
files; units and blast radii counted on the topology graph; failure processes against their means."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from simulator.cli import main
from simulator.reliability.blast import cluster_units
from simulator.reliability.components import FailureClass
from simulator.reliability.processes import draw_arrivals
from simulator.topology.loader import load_topology

BASE = """cluster:
  topology: dgx-h100-cluster
  nodes: 2
model:
  preset: llama3-8b
training:
  seq_len: 1024
  global_batch: 16
parallelism:
  tp: 8
run:
  horizon: 2 d
faults:
  components:
    gpu:
      mtbf: 1000 h
      repair: 4 h
checkpoint:
  interval: 30 min
storage:
  capacity: 1 PB
restart:
  spares: 1
"""

BAD = {
    "negative rate": (("      mtbf: 1000 h", "      rate: -3 per 54 d"), 16, "faults.components.gpu.rate"),
    "zero mtbf": (("      mtbf: 1000 h", "      mtbf: 0 h"), 16, "faults.components.gpu.mtbf"),
    "unknown class": (("    gpu:", "    warp_core:"), 15, "faults.components.warp_core"),
    "repair without unit": (("      repair: 4 h", "      repair: 4"), 17, "faults.components.gpu.repair"),
    "interval 0": (("  interval: 30 min", "  interval: 0 steps"), 19, "checkpoint.interval"),
    "horizon under a step": (("  horizon: 2 d", "  horizon: 1 ms"), 12, "run.horizon"),
    "checkpoint over capacity": (("  capacity: 1 PB", "  capacity: 10 GB"), 21, "storage.capacity"),
    "spares over cluster": (("  spares: 1", "  spares: 3"), 23, "restart.spares"),
    "shape without weibull": (("      repair: 4 h", "      shape: 0.7"), 15, "faults.components.gpu"),
    "degrade a gpu": (("      repair: 4 h", "      effect: degrade"), 17, "faults.components.gpu.effect"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_job_input_is_one_located_line(case, tmp_path, capsys):
    (old, new), line, field = BAD[case]
    assert old in BASE
    scenario = tmp_path / "job.yaml"
    scenario.write_text(BASE.replace(old, new))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.match(rf"^error: {re.escape(str(scenario))}:{line}: {re.escape(field)}: ", err), err
    assert not out.exists() or not any(out.iterdir())


def test_units_and_blast_radius_on_the_graph():
    topology = load_topology("dgx-h100-cluster", {"nodes": 64})
    units = cluster_units(topology)
    leaves = 2 * 8
    assert (units.count("gpu"), units.count("host"), units.count("nic")) == (512, 64, 512)
    assert (units.count("leaf_switch"), units.count("spine_switch")) == (leaves, 16)
    assert units.count("cable") == 512 + leaves * 16
    assert units.blast["gpu"][9] == (1,)
    assert sorted(len(hosts) for hosts in units.blast["leaf_switch"]) == [32] * leaves
    assert units.blast["leaf_switch"][0] == tuple(range(32))
    assert units.blast["spine_switch"][0] == ()
    assert sum(1 for hosts in units.blast["cable"] if hosts) == 512


@pytest.mark.parametrize("distribution, shape", [("exponential", 1.0), ("weibull", 0.7), ("weibull", 2.0)])
def test_failure_counts_follow_the_renewal_rate(distribution, shape):
    """Over a horizon of 200 MTBFs per unit, the count per unit is H / MTBF (renewal theorem) within 2%."""
    mtbf = 1000.0
    klass = FailureClass("x", "gpu", "replace", 1 / mtbf, distribution, shape, repair_s=60.0)
    arrivals = draw_arrivals(np.random.default_rng(1), (klass,), [64], 200 * mtbf)
    assert len(arrivals) / 64 == pytest.approx(200, rel=0.02)
    assert np.all(np.diff(arrivals.time_s) >= 0)
    assert arrivals.repair_s.mean() == pytest.approx(60.0, rel=0.05)
    assert math.isclose(float(arrivals.unit.max()), 63)
