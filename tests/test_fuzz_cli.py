"""Fuzzing the whole command: scenario files, topology files and schedule tables, mutated at random (hypothesis,
derandomized so the run is repeatable), each run through `trainsim run --quiet`. Whatever the input, the
command either succeeds and writes its outputs, or prints one line (no traceback) with status 2 (input) or 1
(runtime) and writes nothing."""

from __future__ import annotations

import io
import itertools
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared import CLUSTER_TOPOLOGY, COMM_SCENARIO, TRAINING_SCENARIO, mutated

from simulator.cli import main

FUZZ_SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                HealthCheck.function_scoped_fixture])
ACTIONS = ["F0", "F1", "BW0", "BW1", "B0", "B1", "W0", "W1", "F0c1", "F2", "X", "", " ", "#", "f1", "bw0"]
CUSTOM_SCENARIO = {
    "cluster": {"topology": "dgx-h100"},
    "model": {"synthetic": {"stages": 2, "forward": "1 ms", "backward": "2 ms", "p2p_bytes": "1 MiB"}},
    "training": {"microbatches": 2},
    "parallelism": {"pp": 2, "dp": 4, "pipeline": {"schedule": "custom", "table": "CASE/table.csv"}},
}
_counter = itertools.count()


def run_command(folder: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into a fresh folder (CASE/ in them names it), run the command on s.yaml and check the
    answer's shape."""
    case = folder / f"case{next(_counter)}"
    case.mkdir()
    for name, content in files.items():
        (case / name).write_bytes(content.replace(b"CASE/", f"{case}/".encode()))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["run", str(case / "s.yaml"), "--out", str(case / "out"), "--quiet"])
    message = err.getvalue()
    assert out.getvalue() == "" and "Traceback" not in message
    if status == 0:
        assert (case / "out" / "summary.json").is_file()
        assert all(line.startswith("warning: ") for line in message.splitlines()), message
    else:
        assert status in (1, 2), status
        assert message.count("\n") == 1 and message.startswith("error: " if status == 2 else ("error: ",
                                                                                               "simulation error: "))
        assert not (case / "out").exists()


def dump(data: object) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


@FUZZ_SETTINGS
@given(st.sampled_from([COMM_SCENARIO, TRAINING_SCENARIO]).flatmap(mutated))
def test_fuzzed_scenarios(tmp_path, scenario):
    run_command(tmp_path, {"s.yaml": dump(scenario)})


@FUZZ_SETTINGS
@given(mutated({"kind": "cluster", **CLUSTER_TOPOLOGY}))
def test_fuzzed_topology_files(tmp_path, topology):
    scenario = {"cluster": {"topology": "CASE/t.yaml"}, "workload": [{"op": "all_reduce", "bytes": "16 MiB"}]}
    run_command(tmp_path, {"s.yaml": dump(scenario), "t.yaml": dump(topology)})


@FUZZ_SETTINGS
@given(st.lists(st.lists(st.sampled_from(ACTIONS), max_size=6), max_size=4), st.binary(max_size=3),
       st.integers(0, 40))
def test_fuzzed_schedule_tables(tmp_path, rows, junk, cut):
    table = "\n".join(",".join(row) for row in rows).encode()
    table = table[:cut] + junk + table[cut:]
    run_command(tmp_path, {"s.yaml": dump(CUSTOM_SCENARIO), "table.csv": table})
