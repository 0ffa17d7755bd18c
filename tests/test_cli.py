"""The `trainsim` command line: outputs of `run`, determinism, `validate`, `topo describe`, `collective --json`,
refusal of a deadlocking schedule, and the one-line, status-2 answer to every kind of user mistake (with no
files written).

Expected figures: DGX H100 = 8 GPUs per host, NDR NIC 400 Gb/s = 50 GB/s per direction (vendor datasheets).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from shared import CP_FABRIC_TEMPLATE, CROSS_RAIL_PP, DATA, REPO, SCENARIOS

from simulator.cli import main
from simulator.config.loader import as_typed
from simulator.scale import PROCESS_BYTES

SCENARIO = SCENARIOS / "allreduce-2x-dgx-h100.yaml"
OUTPUTS = {"summary.json", "timeline.parquet", "trace.json", "manifest.json"}
ERROR_LINE = re.compile(r"^error: (?P<where>command line: trainsim [\w-]+|[^:]+(?::\d+)?): (?P<rest>.+)$")


CPU_LIMIT_S = 60
"""CPU seconds a `trainsim` child may use (each command here needs about one): a hang that spins is killed
after that much work whatever the machine's load. A wall-clock limit of 60 s failed a healthy run once, on 2
cores shared at load 8."""
WALL_LIMIT_S = 600
"""Wall seconds a child may take: a hang that waits without spinning still fails, however loaded the machine."""


def _limit_cpu() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))


def trainsim(*args: str, cwd: Path = REPO, env: dict | None = None):
    """Run the real console entry point in a fresh interpreter, within CPU_LIMIT_S and WALL_LIMIT_S."""
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=WALL_LIMIT_S, env={**os.environ, **(env or {})}, preexec_fn=_limit_cpu)


def snapshot(folder: Path) -> dict[str, bytes] | None:
    """Every file under ``folder`` with its bytes; None when the folder does not exist."""
    if not folder.exists():
        return None
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


# --------------------------------------------------------------------------------------------------- run

@pytest.fixture(scope="module")
def run_outputs(tmp_path_factory) -> Path:
    """`trainsim run` of SCENARIO, in this process (its entry point in a fresh interpreter, and another hash seed, is
    test_same_scenario_gives_identical_outputs's): nothing on stderr."""
    out = tmp_path_factory.mktemp("run") / "out"
    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        assert main(["run", str(SCENARIO), "--out", str(out)]) == 0
    assert errors.getvalue() == ""
    return out


def test_a_unit_error_lists_every_unit_the_parser_reads():
    """1 PiB is the cap on a message size and parsed, but the allowed units of an unknown one stopped at TiB."""
    from simulator.errors import InputError
    from simulator.units import SIZE_UNITS, parse_quantity

    assert parse_quantity("1 PiB", "size") == 2.0**50 and parse_quantity("2 PB/s", "bandwidth") == 2e15
    with pytest.raises(InputError) as refused:
        parse_quantity("1 XB", "size")
    assert refused.value.allowed.split(", ") == list(SIZE_UNITS)
    with pytest.raises(InputError) as refused:
        parse_quantity("1 Xb/s", "bandwidth")
    assert "k, M, G, T, P prefixes" in refused.value.allowed


def test_run_writes_the_three_outputs(run_outputs):
    assert {path.name for path in run_outputs.iterdir()} == OUTPUTS
    summary = json.loads((run_outputs / "summary.json").read_text())
    assert (summary["topology"], summary["gpus"]) == ("dgx-h100-cluster", 16)
    assert [row["name"] for row in summary["collectives"]] == ["dp-allreduce", "tp-node0", "tp-node1", "p2p"]
    timeline = pd.read_parquet(run_outputs / "timeline.parquet")
    assert summary["makespan_s"] == pytest.approx(timeline["end_s"].max(), rel=1e-12)
    assert set(timeline["rank"]) == set(range(16))


def test_trace_has_a_process_per_host_and_a_thread_per_gpu_stream(run_outputs):
    trace = json.loads((run_outputs / "trace.json").read_text())
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert processes == {0: "host 0", 1: "host 1", 2: "network links (utilisation of line rate)"}
    threads = {e["args"]["name"]: e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    timeline = pd.read_parquet(run_outputs / "timeline.parquet")
    ops = timeline[timeline["kind"] != "flow"]
    expected = {f"GPU {rank} {stream}": rank // 8 for rank, stream in
                ops[["rank", "stream"]].drop_duplicates().itertuples(index=False)}
    assert threads == expected
    assert {"GPU 0 p2p", "GPU 8 p2p", "GPU 15 comm"} <= set(threads)
    spans = [e for e in events if e.get("ph") == "X"]
    assert len(spans) == len(ops)


def test_same_scenario_gives_identical_outputs(run_outputs, tmp_path):
    """A second run (another process, hash seed 2) and a third (in-process, as the fixture's) write the same
    bytes as the fixture's run."""
    again = tmp_path / "again"
    completed = trainsim("run", str(SCENARIO), "--out", str(again), env={"PYTHONHASHSEED": "2"})
    assert completed.returncode == 0, completed.stderr
    assert main(["run", str(SCENARIO), "--out", str(tmp_path / "third")]) == 0
    first = pd.read_parquet(run_outputs / "timeline.parquet")
    for other in (again, tmp_path / "third"):
        pd.testing.assert_frame_equal(first, pd.read_parquet(other / "timeline.parquet"), check_exact=True)
        assert snapshot(other) == snapshot(run_outputs)


def test_run_into_existing_folder_twice_is_identical(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(SCENARIO), "--out", str(out)]) == 0
    before = snapshot(out)
    assert main(["run", str(SCENARIO), "--out", str(out)]) == 0
    assert snapshot(out) == before
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"wrote {out}")


def test_a_fold_given_up_mid_run_is_said_on_stderr_before_the_next_build_and_run(tmp_path, capsys, monkeypatch):
    """The moment a run gives up its fold (its mirrors out of step), one line on stderr says which fold and why,
    before the next program is built (the 2,048-GPU 70B step at 4:1 builds its refold for most of a minute), and
    one more what the run then simulates, as it starts, whatever --quiet; stdout and the outputs are those of a
    run that says nothing. The refold's flows are estimated at the given-up run's flows per op: ~2,248 against
    the 2,212 it simulates (1.02 times)."""
    import simulator.simulation as simulation

    scenario = tmp_path / "cross_rail.yaml"
    scenario.write_text(CROSS_RAIL_PP)
    said_at: list[tuple[str, str]] = []
    run_step, step_program = simulation.run_step, simulation.step_program

    def watched_run(*args, **kwargs):
        said_at.append(("run", sys.stderr.getvalue()))
        return run_step(*args, **kwargs)

    def watched_build(*args, **kwargs):
        said_at.append(("build", sys.stderr.getvalue()))
        return step_program(*args, **kwargs)

    monkeypatch.setattr(simulation, "run_step", watched_run)
    monkeypatch.setattr(simulation, "step_program", watched_build)
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    gave_up = ("note: the step was simulated with one rank standing for each set of alike GPUs, but their copies "
               "fell out of step by 33.47 us (hand-off 'recv bwd mb3', GPUs 8 -> 4; the run stopped there), so it "
               "is simulated again on more ranks to keep the figures exact (details: summary.json's "
               "fold_given_up)\n")
    again = "note: simulating the step again on 8 of 64 ranks, 1,010 ops and ~2,248 flows (estimated), under a " \
            "minute\n"
    assert said_at == [("build", ""), ("run", ""), ("build", gave_up), ("run", gave_up + again)]
    assert capsys.readouterr() == ("", gave_up + again)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["flows_simulated"] == 2212
    assert main(["run", str(scenario), "--out", str(tmp_path / "again")]) == 0
    assert capsys.readouterr().err == gave_up + again
    assert snapshot(tmp_path / "again") == snapshot(tmp_path / "out")


def test_a_refold_of_a_step_too_large_to_unfold_is_said_on_stderr_too(tmp_path, capsys, monkeypatch):
    """Where the step may not run unfolded (its estimate beyond the limits: here the guard refuses every unfolded
    step) and the refold budget lets a refold run (a multiple of 4 takes the CP lanes' 8 ranks against the class
    fold's 4), that run of the step again is said as every other one is, as the README promises. Its flows are
    estimated at the class fold's flows per op, which ran to its end: ~22,128 against 13,376 (1.65 times)."""
    import simulator.scale as scale

    refuse_unfolded = scale.refuse_unfolded

    def too_large_unfolded(loaded, gpus, unfolding, *args, **kwargs):
        if unfolding.ranks is None:
            raise loaded.error(("cluster",), "this run is too large to simulate unfolded")
        return refuse_unfolded(loaded, gpus, unfolding, *args, **kwargs)

    monkeypatch.setattr(scale, "refuse_unfolded", too_large_unfolded)
    monkeypatch.setattr(scale, "REFOLD_COST_MULTIPLE", 4)
    scenario = tmp_path / "cp_fabric.yaml"
    scenario.write_text(CP_FABRIC_TEMPLATE)
    overrides = ("cluster.nodes=8", "cluster.leaf_ports=2", "parallelism.tp=4", "parallelism.cp=4",
                 "parallelism.pp=2", "parallelism.dp=2", "parallelism.cp_algorithm=all_gather",
                 "collectives.protocol=simple")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet",
                 *(part for setting in overrides for part in ("--set", setting))]) == 0
    assert capsys.readouterr().err == (
        "note: the step was simulated with one rank standing for each set of alike GPUs, but their copies fell out "
        "of step by up to 178.5 us (hand-off 'recv bwd mb3', GPUs 16 -> 0, 2 instances), so it is simulated again "
        "on more ranks to keep the figures exact (details: summary.json's fold_given_up)\n"
        "note: simulating the step again on 8 of 64 ranks, 2,980 ops and ~22,128 flows (estimated), under a "
        "minute\n")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["simulated_ranks"], summary["flows_simulated"]) == (8, 13376)


def test_a_run_into_its_own_earlier_folder_says_it_replaced_it_and_what_it_removed(tmp_path, capsys):
    """A rerun replaces `trainsim run`'s own results, as a search, a study and a sweep reuse theirs (another
    command's are refused), and says so on stderr with the earlier files it removed: a summary-only rerun leaves
    no timeline of the earlier run beside its summary; a first run into a new folder says nothing."""
    out = tmp_path / "out"
    assert main(["run", str(SCENARIO), "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["run", str(SCENARIO), "--out", str(out), "--quiet", "--set", "run.timeline=summary"]) == 0
    assert capsys.readouterr().err == (f"note: replaced the earlier run's results in {out}; removed its "
                                       "timeline.parquet, trace.json, which this run does not write\n")
    assert sorted(path.name for path in out.iterdir()) == ["manifest.json", "summary.json"]
    assert main(["run", str(SCENARIO), "--out", str(out), "--quiet", "--set", "run.timeline=summary"]) == 0
    assert capsys.readouterr().err == f"note: replaced the earlier run's results in {out}\n"


# ------------------------------------------------------------------------------------- validate, topo, collective

def test_run_resumes_the_collector_unless_the_process_exits_after_it(tmp_path, capsys):
    """In-process callers get the cyclic collector back after a run; the console script (``exiting``) leaves it
    off after a one-run command, since the first collection would only walk the run's garbage before the
    process ends, and on for the others. (``exiting`` also installs the console script's Ctrl-C handler, which
    must not outlive this test: a later in-process Ctrl-C test then met a handler that ignored its press.)"""
    assert gc.isenabled()
    assert main(["run", str(SCENARIO), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert gc.isenabled()
    handler = signal.getsignal(signal.SIGINT)
    try:
        assert main(["scenarios"], exiting=True) == 0 and gc.isenabled()
        assert main(["run", str(SCENARIO), "--out", str(tmp_path / "b"), "--quiet"], exiting=True) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()
        signal.signal(signal.SIGINT, handler)


def test_validate_ok(capsys):
    assert main(["validate", str(SCENARIO)]) == 0
    assert capsys.readouterr().out.strip().endswith("valid (16 h100-sxm GPUs on dgx-h100-cluster)")


HYBRID_TP8 = """cluster: {topology: dgx-h100-cluster}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 8, dp: 2, fsdp: hybrid_shard}
run: {timeline: summary}
"""


def test_hybrid_shard_with_tp_filling_the_domain_warns(tmp_path, capsys):
    """TP 8 on 8-GPU DGX H100s leaves one DP rank per NVLink domain: hybrid_shard's shard group is one GPU and the run
    holds plain data parallelism's model state. The warning names why, on stderr and in summary.json; with TP 4 two
    DP ranks share a domain and nothing is said."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(HYBRID_TP8)
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err == (f"warning: {scenario}:4: parallelism.fsdp: hybrid_shard shards within an NVLink domain, and TP 8 "
                   "fills GPU 0's 8-GPU domain, so its shard group is one rank: it shards nothing and each GPU holds "
                   "the model state of plain data parallelism (fsdp: full_shard shards across domains)\n")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["warnings"] == [err.removeprefix("warning: ").strip()]
    assert main(["validate", str(scenario), "--set", "parallelism.tp=4", "--set", "parallelism.dp=4"]) == 0
    assert "hybrid_shard" not in capsys.readouterr().err


def test_a_tp_group_spread_by_the_placement_order_is_warned_at_tp_naming_the_order(tmp_path, capsys):
    """`--set parallelism.order=[dp, pp, cp, tp]` spreads each TP group of 8 over both hosts: the warning read
    `parallelism.tp: a TP group of 8 GPUs spans 2 NVLink domains; ...`, with no location (every other warning
    has one) and no word of the order that caused it. It is located at tp's line, naming the override."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(HYBRID_TP8.replace(", fsdp: hybrid_shard", ""))
    assert main(["validate", str(scenario), "--set", "parallelism.order=[dp, pp, cp, tp]"]) == 0
    assert capsys.readouterr().err == (
        f"warning: {scenario}:4: parallelism.tp: a TP group of 8 GPUs spans 2 NVLink domains; its collectives cross "
        "the network every layer (with --set parallelism.order=[dp, pp, cp, tp])\n")


TP_OVERLAP = """cluster: {topology: dgx-h100-cluster}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 8, dp: 2, sequence_parallel: true,
              tp_comm_overlap: true}
"""


def test_tp_comm_overlap_with_a_tp_group_across_hosts_is_refused_at_the_overlap(tmp_path, capsys):
    """Transformer Engine's userbuffers map the TP peers' buffers inside one NVLink domain and have no path over
    InfiniBand (TransformerEngine issue #1071); a TP group spread over both hosts by the order was accepted and
    its "overlap" ran the userbuffers transfers over the NICs (a 16-GPU TP step 2.8x slower than without it).
    Inside a host it stays valid."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TP_OVERLAP)
    assert main(["validate", str(scenario)]) == 0
    capsys.readouterr()
    assert main(["validate", str(scenario), "--set", "parallelism.order=[dp, pp, cp, tp]"]) == 2
    assert capsys.readouterr().err == (
        f"error: {scenario}:5: parallelism.tp_comm_overlap: TP communication overlap (Transformer Engine's "
        "userbuffers) runs inside one NVLink domain, and a TP group of 8 GPUs spans 2 NVLink domains (with --set "
        "parallelism.order=[dp, pp, cp, tp]) (allowed: a TP group inside one NVLink domain, or tp_comm_overlap: "
        "false)\n")


SPLIT_HOST_GRAPH = """kind: graph
nodes:
  - {name: g0, kind: gpu, host: 0}
  - {name: g1, kind: gpu, host: 0}
  - {name: g2, kind: gpu, host: 1}
  - {name: g3, kind: gpu, host: 0}
  - {name: sw, kind: switch}
links:
""" + "".join(f"  - {{a: g{gpu}, b: sw, bandwidth: 50 GB/s, latency: 1 us, class: infiniband}}\n" for gpu in range(4))


def test_the_hybrid_shard_warning_says_what_fills_the_domain_only_when_it_does(tmp_path, capsys):
    """GPUs 0, 1 and 3 on one host of a graph, TP 2 x DP 2: GPU 0's domain holds no other rank of its DP group (GPU 2),
    but TP 2 x PP 1 covers only GPUs 0 and 1 of it; the warning names what the layout's groups show, not "TP 2 x PP 1
    fill GPU 0's 3-GPU domain"."""
    (tmp_path / "split.yaml").write_text(SPLIT_HOST_GRAPH)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(HYBRID_TP8.replace("dgx-h100-cluster", "split.yaml").replace("tp: 8", "tp: 2"))
    assert main(["validate", str(scenario)]) == 0
    err = capsys.readouterr().err
    assert ("hybrid_shard shards within an NVLink domain, and the other 2 GPUs of GPU 0's 3-GPU domain hold "
            "ranks of other DP x CP groups, so its shard group is one rank") in err
    assert "fill" not in err


def test_topo_describe_cluster(capsys):
    assert main(["topo", "describe", "dgx-h100-cluster"]) == 0
    text = capsys.readouterr().out
    assert "16 GPUs (h100-sxm) on 2 hosts, 8 GPUs per host, 8 rails" in text
    assert re.search(r"infiniband\s+16 x\s+50 GB/s", text)


def test_topo_describe_with_override(capsys):
    assert main(["topo", "describe", "dgx-h100-cluster", "--set", "nodes=4"]) == 0
    assert "32 GPUs (h100-sxm) on 4 hosts" in capsys.readouterr().out


@pytest.mark.parametrize("sets", [["node={gpus: 4}", "nics_per_node=4"], ["node.gpus=4", "nics_per_node=4"]])
def test_topo_set_reads_its_values_as_run_set_does(capsys, sets):
    """`topo --set` values are YAML, and a dotted name sets one key of a parameter, as `run --set cluster.node...`:
    a mapping merged into the file's node, which keeps its GPU model."""
    assert main(["topo", "describe", "dgx-h100-cluster", *[f"--set={item}" for item in sets]]) == 0
    assert "8 GPUs (h100-sxm) on 2 hosts, 4 GPUs per host, 4 rails" in capsys.readouterr().out


@pytest.mark.parametrize(("command", "sets", "message"), [
    (["topo", "describe", "dgx-h100-cluster"], ["nodes=2", "node.gpu_model=h999"],
     "trainsim topo: --set node.gpu_model=h999: 'h999' is not supported"),
    (["collective", "--topology", "dgx-h100-cluster", "--sizes", "1MB"], ["node={gpu_model: h999}"],
     "trainsim collective: --set node={gpu_model: h999}: node.gpu_model: 'h999' is not supported"),
    (["topo", "describe", "dgx-h100-cluster"], ["nodes=2", "nodes.x=1"],
     "trainsim topo: --set nodes.x=1: nodes is not a section"),
])
def test_a_bad_topology_set_is_refused_at_that_set(capsys, command, sets, message):
    assert main([*command, *[f"--set={item}" for item in sets]]) == 2
    assert f"error: command line: {message} (allowed: " in capsys.readouterr().err


def test_collective_json_keys(capsys):
    assert main(["collective", "--topology", "dgx-h100", "--sizes", "4MiB,8.2MB,16MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    # a byte count, not 4194304.0, and 8.2 MB (8199999.999999999 parsed) rounded, not cut to 8,199,999
    assert [row["bytes"] for row in rows] == [4 * 2**20, 8_200_000, 16 * 2**20]
    assert all(isinstance(row["bytes"], int) for row in rows)
    for row in rows:
        assert set(row) == {"op", "algorithm", "resolved_algorithm", "protocol", "resolved_protocol", "ranks", "bytes",
                            "time_s", "algbw_GBps", "busbw_GBps"}
        # auto inside one NVLink-SHARP domain (below 4 MiB the LL ring's 0.6 us hops beat NVLS's 25 us)
        assert (row["resolved_algorithm"], row["resolved_protocol"]) == ("nvls", "simple")
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9, rel=1e-12)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * 7 / 8, rel=1e-12)


def test_collective_reads_its_topology_once(monkeypatch, capsys):
    """`trainsim collective` reads the topology file once: the sweep builds the file it was handed, the one whose GPU
    count refuses a large cluster."""
    import simulator.topology.loader as loader

    reads: list[str] = []
    read_yaml = loader.read_yaml
    monkeypatch.setattr(loader, "read_yaml", lambda path, error: reads.append(str(path)) or read_yaml(path, error))
    assert main(["collective", "--topology", "dgx-h100-cluster", "--set", "nodes=2", "--sizes", "1MiB"]) == 0
    assert [Path(path).name for path in reads] == ["dgx-h100-cluster.yaml"]
    assert "ranks=16" in capsys.readouterr().out


def test_collective_table(capsys):
    assert main(["collective", "--topology", "dgx-h100", "--sizes", "1MiB:4MiB"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "# all_reduce algorithm=auto protocol=auto ranks=8"
    assert len(lines) == 2 + 3


def test_collective_names_the_algorithm_auto_chose_per_size(capsys):
    """`auto` switches algorithm with the size (on two DGX A100s: the tree for small messages, the rail-aligned ring at
    a few MiB); each row of the table and the JSON names the algorithm and protocol that ran, as NCCL_DEBUG=INFO
    does, not just `auto`, so a kink in the busbw curve has its explanation."""
    args = ["collective", "--topology", "dgx-a100-cluster", "--set", "nodes=2", "--sizes", "64KiB,4MiB"]
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].split()[-2:] == ["algorithm", "protocol"]
    assert [line.split()[-2:] for line in lines[2:]] == [["tree", "ll"], ["ring", "ll128"]]
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(row["algorithm"], row["resolved_algorithm"]) for row in rows] == [("auto", "tree"), ("auto", "ring")]
    assert main([*args, "--json", "--algorithm", "tree"]) == 0
    assert {row["resolved_algorithm"] for row in json.loads(capsys.readouterr().out)} == {"tree"}


# ----------------------------------------------------------------------------------------------------- deadlock

DEADLOCKED_TABLE = "F0,BW0,F1,BW1\nF1,BW1,F0,BW0\n"
DEADLOCKED_SCENARIO = """\
cluster: {{topology: dgx-h100}}
model:
  synthetic: {{stages: 2, forward: 1 ms, backward: 2 ms, p2p_bytes: 16 MiB}}
training: {{microbatches: 2}}
parallelism:
  tp: 4
  pp: 2
  pipeline: {{schedule: custom, table: {table}}}
"""


def test_a_custom_schedule_that_would_deadlock_is_refused_before_running(tmp_path):
    """Stage 0 runs micro-batch 0 first and stage 1 micro-batch 1 first: each would wait for the other's P2P.
    The table is tried in the exact schedule executor first, so the run never starts (the engine's own
    deadlock report is tested in test_scenarios_comm.py)."""
    (tmp_path / "table.csv").write_text(DEADLOCKED_TABLE)
    scenario = tmp_path / "dead.yaml"
    scenario.write_text(DEADLOCKED_SCENARIO.format(table=tmp_path / "table.csv"))
    for command in (("validate", str(scenario)), ("run", str(scenario), "--out", str(tmp_path / "out"))):
        completed = trainsim(*command)
        assert completed.returncode == 2
        assert completed.stderr.count("\n") == 1 and "Traceback" not in completed.stderr
        assert "parallelism.pipeline.table: the schedule cannot run" in completed.stderr
        assert "rank 0 at BW0" in completed.stderr and "rank 1 at F1" in completed.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------------- bad input


def test_a_scenario_file_named_like_a_flag_keeps_its_line_and_field(tmp_path, monkeypatch, capsys):
    """A flag is marked on the error itself, not read off a file name starting with '--': `trainsim validate --
    --x.yaml` locates the file's unknown key at its line and field, not on the command line; a --set still names its
    key once."""
    monkeypatch.chdir(tmp_path)
    Path("--x.yaml").write_text("cluster:\n  topology: dgx-h100\nparallelism:\n  tpp: 2\n")
    assert main(["validate", "--", "--x.yaml"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: --x.yaml:4: parallelism.tpp: unknown key 'tpp' (did you mean tp or pp?) (allowed: ")
    Path("--x.yaml").write_text("cluster:\n  topology: dgx-h100\n")
    assert main(["validate", "--set", "parallelism.tpp=2", "--", "--x.yaml"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: command line: trainsim validate: --set parallelism.tpp=2: unknown key 'tpp' (did you mean tp or pp?) "
        "(allowed: ")

GOOD_WORKLOAD = "workload:\n  - {op: all_reduce, bytes: 1 GiB}\n"
BAD_INPUTS = {
    # name: (files to write, expected location, field, words in the problem, words in "allowed" or None)
    "yaml-syntax": ({"s.yaml": "cluster: {topology: dgx-h100\n" + GOOD_WORKLOAD},
                    "s.yaml:2", None, "YAML syntax error", None),
    "unknown-section": ({"s.yaml": "cluster: {topology: dgx-h100}\nnetwrok: {model: flow}\n" + GOOD_WORKLOAD},
                        "s.yaml:2", "netwrok", "unknown key 'netwrok'", "network"),
    "unknown-item-key": ({"s.yaml": "cluster: {topology: dgx-h100}\nworkload:\n  - {op: all_reduce, bytse: 1 GiB}\n"},
                         "s.yaml:3", "workload[0].bytse", "unknown key 'bytse'", "bytes"),
    "wrong-type": ({"s.yaml": "cluster: {topology: dgx-h100}\nworkload:\n  - {op: all_reduce, bytes: 1 GiB, "
                              "repeat: many}\n"}, "s.yaml:3", "workload[0].repeat", "integer", None),
    "bad-choice": ({"s.yaml": "cluster: {topology: dgx-h100}\nnetwork:\n  model: packet\n" + GOOD_WORKLOAD},
                   "s.yaml:3", "network.model", "'packet' is not a valid choice", "analytic"),
    "bare-number": ({"s.yaml": "cluster: {topology: dgx-h100}\nworkload:\n  - op: all_reduce\n    bytes: 1024\n"},
                    "s.yaml:4", "workload[0].bytes", "has no unit", "GiB"),
    "unknown-unit": ({"s.yaml": "cluster: {topology: dgx-h100}\nworkload:\n  - {op: all_reduce, bytes: 1 GiB/s}\n"},
                     "s.yaml:3", "workload[0].bytes", "unknown unit", "MiB"),
    "zero-bandwidth": ({"t.yaml": "kind: nvswitch_node\ngpus: 8\nnvlink_bandwidth: 0 GB/s\n",
                        "s.yaml": "cluster: {topology: TMP/t.yaml}\n" + GOOD_WORKLOAD},
                       "t.yaml:3", "nvlink_bandwidth", "must be positive", "a positive value"),
    "negative-bandwidth": ({"t.yaml": "kind: cluster\nnodes: 2\nnic_bandwidth: -400 Gb/s\n",
                            "s.yaml": "cluster: {topology: TMP/t.yaml}\n" + GOOD_WORKLOAD},
                           "t.yaml:3", "nic_bandwidth", "must be positive", "a positive value"),
    "bad-override": ({"s.yaml": "cluster: {topology: dgx-h100-cluster, nodes: 0}\n" + GOOD_WORKLOAD},
                     "s.yaml:1", "cluster.nodes", "must be positive", "a positive value"),
    "missing-gpus": ({"s.yaml": "cluster: {topology: dgx-h100}\nworkload:\n  - op: all_reduce\n    bytes: 1 GiB\n"
                               "    group: [0, 3, 9]\n"}, "s.yaml:5", "workload[0].group", "[9] do not exist", "0..7"),
    "missing-range": ({"s.yaml": "cluster: {topology: dgx-h100}\nworkload:\n  - {op: all_reduce, bytes: 1 GiB, "
                                 "group: 4-11}\n"}, "s.yaml:3", "workload[0].group", "do not exist", "0..7"),
    "unknown-topology": ({"s.yaml": "cluster: {topology: dgx-h900}\n" + GOOD_WORKLOAD},
                         "s.yaml:1", "cluster.topology", "unknown topology 'dgx-h900'", "dgx-h100"),
}


def write_case(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text.replace("TMP/", f"{tmp_path}/"))
    return tmp_path / "s.yaml"


def assert_one_error_line(stderr: str, where: str | None, field: str | None, problem: str, allowed: str | None):
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and stderr.endswith("\n"), stderr
    match = ERROR_LINE.match(lines[0])
    assert match, lines[0]
    if where is not None:
        assert match["where"].endswith(where), lines[0]
    rest = match["rest"]
    if field is not None:
        assert rest.startswith(f"{field}: "), lines[0]
    assert problem in rest, lines[0]
    if allowed is not None:
        assert re.search(r" \(allowed: [^)]*" + re.escape(allowed), rest), lines[0]


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
@pytest.mark.parametrize("command", ["run", "validate"])
def test_bad_input_is_one_line_status_2_and_writes_nothing(case, command, tmp_path, capsys):
    files, where, field, problem, allowed = BAD_INPUTS[case]
    scenario = write_case(tmp_path, files)
    out = tmp_path / "out"
    args = [command, str(scenario)] + (["--out", str(out)] if command == "run" else [])
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_error_line(captured.err, where, field, problem, allowed)
    assert not out.exists()


def test_bad_input_leaves_an_existing_out_folder_unchanged(tmp_path, capsys):
    files, where, field, problem, allowed = BAD_INPUTS["missing-gpus"]
    scenario = write_case(tmp_path, files)
    out = tmp_path / "out"
    assert main(["run", str(SCENARIO), "--out", str(out)]) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert main(["run", str(scenario), "--out", str(out)]) == 2
    assert_one_error_line(capsys.readouterr().err, where, field, problem, allowed)
    assert snapshot(out) == before


def test_bad_input_through_the_console_script(tmp_path):
    """The installed entry point, in its own process: status 2, one line, no traceback, no files."""
    scenario = write_case(tmp_path, BAD_INPUTS["bare-number"][0])
    completed = trainsim("run", str(scenario), "--out", str(tmp_path / "out"))
    assert completed.returncode == 2 and completed.stdout == ""
    assert_one_error_line(completed.stderr, *BAD_INPUTS["bare-number"][1:])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, field, problem, allowed", [
    (["--ranks", "9"], "--ranks", "9 ranks do not fit dgx-h100 (8 GPUs)", "2..8"),
    (["--set", "gpus=16384", "--ranks", "16385"], "--ranks", "16,385 ranks do not fit dgx-h100 (16,384 GPUs)",
     "2..16,384"),  # the range read 2..16384 beside the problem's 16,384
    (["--sizes", "1024"], None, "has no unit", "MiB"),
    (["--chunk", "0B"], "--chunk", "chunk '0B' is not positive", "whole bytes from 1 B up to 1 PiB"),  # said 0.0
    (["--sizes", "1MiB:1e30B"], "--sizes", "size '1e30B' is more than 1 PiB, beyond any GPU's memory",
     "a size up to 1 PiB"),  # ran, with times of 1e19 s
    (["--sizes", "1e-9B"], "--sizes", "sizes '1e-9B' must be 1 B or more", "e.g. 1MiB,64MiB"),  # ran: bytes 0
    (["--sizes", "0.5B:1KiB"], "--sizes", "size range '0.5B:1KiB' must go up from a size of 1 B or more",
     "e.g. 1MiB:8GiB"),
    # accepted, though the message above says whole bytes, and a scenario's `bytes: 1.5 B` is refused
    (["--sizes", "1MiB,1.5B"], "--sizes", "size '1.5B' is 1.5 B, not whole bytes", "whole bytes, e.g. 1MiB,64MiB"),
    (["--sizes", "1.5B:1KiB"], "--sizes", "size '1.5B' is 1.5 B, not whole bytes", "whole bytes, e.g. 1MiB:8GiB"),
    (["--set", "gpus=0"], "--set gpus=0", "0 must be positive", "a positive value"),
    (["--set", "gpus=1"], "--topology", "dgx-h100 has 1 GPU: a collective needs two or more",
     "a topology of 2 GPUs or more"),  # said 'allowed: 2..1'
    (["--op", "send_recv", "--algorithm", "tree"], "--algorithm", "algorithm 'tree' does not implement send_recv",
     "direct or auto"),
    (["--op", "send_recv", "--protocol", "ll"], "--protocol",
     "protocol 'll' does not run direct send_recv on this group", "simple or auto"),
    (["--op", "all_to_all", "--protocol", "ll128"], "--protocol",  # ran as Simple, the protocol ignored
     "protocol 'll128' does not run direct all_to_all on this group", "simple or auto"),
])
def test_collective_bad_arguments(args, field, problem, allowed, capsys):
    assert main(["collective", "--topology", "dgx-h100", "--json", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_error_line(captured.err, None, field, problem, allowed)


NODES_RANGE = "an integer from 1 to 131,072, 2 where not given"
"""What dgx-h100-cluster's `nodes` takes, as a bad value's refusal says."""


@pytest.mark.parametrize("command", [["topo", "describe", "dgx-h100-cluster"],
                                     ["collective", "--topology", "dgx-h100-cluster", "--sizes", "1MiB"]])
@pytest.mark.parametrize("override, error", [
    ("nodes=0", "--set nodes=0: 0 must be positive (allowed: a positive value)"),
    ("nodes=2.5", "--set nodes=2.5: expected a whole number, got 2.5 (allowed: " + NODES_RANGE + ")"),
    ("nics_per_node=9", "--set nics_per_node=9: 9 NICs per node but 8 GPUs (allowed: 1 to 8)"),
    ("node.bogus=4", "--set node.bogus=4: unknown parameter 'bogus' (allowed: gpus, nvlink_bandwidth,"),
    ("bogus=4", "--set bogus=4: unknown override 'bogus' for topology kind 'cluster' (allowed: nodes, node,"),
    ("9=1", "--set 9=1: unknown override '9' for topology kind 'cluster' (allowed: nodes, node,"),
    ("node[0]=1", "--set node[0]=1: "),
])
def test_a_bad_topology_override_is_located_at_its_set(command, override, error, capsys):
    """`topo` and `collective` locate a bad --set value on the command line of the command, at the override, as
    `trainsim run` does, not at the bundled topology file the user did not write ('.../dgx-h100-cluster.yaml
    (override): nodes: ...')."""
    assert main([*command, "--set", override]) == 2
    assert capsys.readouterr().err.startswith(f"error: command line: trainsim {command[0]}: {error}")


@pytest.mark.parametrize("command", [["topo", "describe", "dgx-h100-cluster"],
                                     ["collective", "--topology", "dgx-h100-cluster", "--sizes", "1MiB"]])
@pytest.mark.parametrize("override, error", [
    ("nodes.x=3", "nodes is not a section (allowed: " + NODES_RANGE + ")"),
    ("nodes=1e3", "expected a whole number, got 1e3 (allowed: " + NODES_RANGE + ")"),
    ("nodes=null", "expected a whole number, got null (allowed: " + NODES_RANGE + ")"),
])
def test_a_topology_set_is_refused_in_run_set_words(command, override, error, capsys):
    """`topo` and `collective` refuse a bad `--set` in `trainsim run --set`'s words: `nodes.x=3` as "nodes is not a
    section" (not "expected a whole number, got {'x': 3}"), `nodes=1e3` without a value the user did not write (not
    "got 1000.0"), and `nodes=null` as set to null (not "missing required parameter")."""
    assert main([*command, "--set", override]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim {command[0]}: --set {override}: {error}\n"


@pytest.mark.parametrize("override, error", [
    ("cluster.nodes=1e3", "expected a whole number, got 1e3 (allowed: an integer from 1 to 131,072, 2 where not "
                          "given)"),
    ("cluster.nodes=null", "expected a whole number, got null (allowed: an integer from 1 to 131,072, 2 where not "
                           "given)"),
    ("parallelism.tp=1e3", "expected a whole number, got 1e3 (allowed: an integer >= 1, 1 where not given)"),
    ("parallelism.tp=null", "expected a whole number, got null (allowed: an integer >= 1, 1 where not given)"),
    ("parallelism.zero=null", "expected a whole number, got null (allowed: an integer from 0 to 3, 0 where not given)"),
])
def test_a_scenario_set_is_named_as_typed(override, error, capsys):
    """`run --set` named the value YAML read, not the one typed: `cluster.nodes=1e3` "got 1000.0", a field set
    to null "got None", and a topology's parameter set to null "missing required parameter"."""
    assert main(["validate", str(SCENARIO), "--set", override]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim validate: --set {override}: {error}\n"


ALL_REDUCE_ON = "cluster: {{topology: {topology}, nodes: 2}}\nworkload:\n  - {{op: all_reduce, bytes: 64 MiB}}\n"


def test_a_set_moves_a_file_s_dgx_cluster_to_gb200_racks_once_its_nodes_is_set_to_null(tmp_path, capsys):
    """`--set cluster.nodes=null` drops the file's `nodes`, which gb200-nvl72 lacks; without it the file's
    `nodes` is refused at its line, offering that `--set` and the rack's size parameter. A file that names
    gb200-nvl72 itself is offered the rack's parameters alone; a null for a parameter the kind has stays its
    value (`test_a_scenario_set_is_named_as_typed`)."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(ALL_REDUCE_ON.format(topology="dgx-h100-cluster"))
    switch = ["validate", str(scenario), "--set", "cluster.topology=gb200-nvl72", "--set", "cluster.racks=2"]
    refusal = f"error: {scenario}:1: cluster.nodes: unknown override 'nodes' for topology kind 'nvl72' (allowed: "
    assert main(switch) == 2
    assert capsys.readouterr().err.startswith(f"{refusal}--set cluster.nodes=null to drop the file's nodes, --set "
                                              "cluster.racks=N to size gb200-nvl72; or its parameters: racks, trays, ")
    assert main([*switch, "--set", "cluster.nodes=null"]) == 0
    assert capsys.readouterr().out.startswith(f"{scenario}: valid (144 gb200 GPUs on gb200-nvl72)")
    scenario.write_text(ALL_REDUCE_ON.format(topology="gb200-nvl72"))
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err.startswith(f"{refusal}racks, trays, ")


@pytest.mark.parametrize("command", [["validate", "{scenario}", "--set", "cluster.nodez=null"],
                                     ["topo", "describe", "dgx-h100-cluster", "--set", "nodez=null"]],
                         ids=["scenario", "topology"])
def test_a_null_on_a_misspelt_cluster_key_is_refused(command, tmp_path, capsys):
    """A null drops only a key the scenario's file gives (`nodes` left over from another topology): on any other
    key the topology lacks it is refused as the misspelt name it is, listing the kind's parameters."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(ALL_REDUCE_ON.format(topology="dgx-h100-cluster"))
    assert main([part.format(scenario=scenario) for part in command]) == 2
    assert ("unknown override 'nodez' for topology kind 'cluster' (did you mean node or nodes?) (allowed: nodes, "
            "node, ") in capsys.readouterr().err


def test_every_key_a_set_topology_lacks_is_named_in_one_refusal(tmp_path, capsys):
    """A GB200 file's `racks` and `last_rack_trays` moved to DGX servers are both offered a `--set ...=null` in
    the refusal of the first, and both dropped run."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text("cluster: {topology: gb200-nvl72, racks: 2, last_rack_trays: 9}\n"
                        "workload:\n  - {op: all_reduce, bytes: 64 MiB}\n")
    switch = ["validate", str(scenario), "--set", "cluster.topology=dgx-h100-cluster"]
    assert main(switch) == 2
    assert capsys.readouterr().err.startswith(
        f"error: {scenario}:1: cluster.racks: unknown override 'racks' for topology kind 'cluster' (allowed: --set "
        "cluster.racks=null --set cluster.last_rack_trays=null to drop the file's racks and last_rack_trays, --set "
        "cluster.nodes=N to size dgx-h100-cluster; or its parameters: nodes, node, ")
    assert main([*switch, "--set", "cluster.racks=null", "--set", "cluster.last_rack_trays=null"]) == 0
    assert capsys.readouterr().out.startswith(f"{scenario}: valid (16 h100-sxm GPUs on dgx-h100-cluster)")


@pytest.mark.parametrize("command", [["validate"], ["run", "--out", "{tmp}"]])
@pytest.mark.parametrize("override, error", [
    ("cluster.nvlink_bandwidth=-1", "--set cluster.nvlink_bandwidth=-1: bandwidth -1 has no unit (allowed: "),
    ("cluster.nodes=0", "--set cluster.nodes=0: unknown override 'nodes' for topology kind 'nvswitch_node' "
                        "(allowed: "),
])
def test_a_scenario_cluster_set_the_topology_refuses_is_located_at_its_set(command, override, error, tmp_path,
                                                                            capsys):
    """A scenario's `--set cluster.X` that the topology refuses is rebuilt as a TopologyError that keeps its mark of a
    flag (every copy of an error keeps its location whole, `InputError.rebuilt`), so `validate` and `run` print it on
    the command line, not as 'error: --set cluster.X=v: cluster.X: ...' off it."""
    args = [part.format(tmp=tmp_path / "out") for part in command]
    assert main([args[0], "llama3-8b-dgx-h100-dp8", *args[1:], "--set", override]) == 2
    assert capsys.readouterr().err.startswith(f"error: command line: trainsim {command[0]}: {error}")


@pytest.mark.parametrize("command, where", [(["topo", "describe"], "trainsim topo: TOPOLOGY"),
                                            (["collective", "--sizes", "1MiB", "--topology"],
                                             "trainsim collective: --topology")])
def test_a_missing_topology_file_says_what_is_allowed(command, where, tmp_path, capsys):
    """A path that is no file (missing, or a folder) is refused naming the option and what it takes, as a scenario's
    cluster.topology is, not just 'error: nothere.yaml: cannot read file: No such file or directory'."""
    for path in (tmp_path / "nothere.yaml", tmp_path):
        assert main([*command, str(path)]) == 2
        assert capsys.readouterr().err == (f"error: command line: {where}: no topology file {path} (allowed: a "
                                           "bundled topology's name, or a YAML file's path relative to the working "
                                           "folder)\n")


@pytest.mark.parametrize("chunk", ["0 B", "-1 MiB", "1e30 B", "4 parsecs", "0.5 B", "1e-20 B"])
def test_a_chunk_is_checked_once_for_the_scenario_and_the_collective_command(chunk, capsys):
    """`collectives.chunk` and `trainsim collective --chunk` had a check each, with different words ('chunk 0.0'
    against "chunk '0B'"), and only the scenario's ran it, at planning time. A chunk under 1 B or of part of a
    byte was accepted (a tree all-reduce with chunks of 1e-20 B took 3.6e26 us)."""
    assert main(["validate", "allreduce-2x-dgx-h100", "--set", f"collectives.chunk={chunk}"]) == 2
    scenario = capsys.readouterr().err.split(f": --set collectives.chunk={chunk}: ", 1)[1]
    assert main(["collective", "--topology", "dgx-h100", "--chunk", chunk]) == 2
    flag = capsys.readouterr().err.split(": --chunk: ", 1)[1]
    assert scenario == flag and flag.endswith("(allowed: auto for NCCL's chunk of the protocol, whole bytes from 1 B "
                                              "up to 1 PiB such as 512 KiB, or none (off) to turn chunking off)\n")


def test_the_collective_command_moves_an_error_onto_its_flag_with_every_other_part_kept(monkeypatch):
    """An error in a field the collective command fills from a flag is moved onto that flag through
    `InputError.rebuilt`, every other part kept (the line too), not only the problem and allowed values. No error
    that reaches it carries a line in practice: one is made to, here."""
    from simulator import cli, collective_sweep
    from simulator.errors import ScenarioError

    def refusing(*_args, **_kwargs):
        raise ScenarioError("refused", field="collectives.protocol", allowed="simple, ll", line=4)

    monkeypatch.setattr(collective_sweep, "collective_sweep", refusing)
    args = cli._parser().parse_args(["collective", "--topology", "dgx-h100"])
    with pytest.raises(ScenarioError) as caught:
        args.func(args)
    moved = caught.value
    assert (moved.problem, moved.field, moved.allowed, moved.line) == ("refused", "--protocol", "simple, ll", 4)


def test_chunking_off_reads_as_yaml_writes_it():
    """`chunk: off` is YAML's false, and reads as chunking off, not as 'expected a size with a unit, got False'."""
    from simulator.config.loader import scenario_from_text

    for written in ("off", "false", "none", "'off'"):
        loaded = scenario_from_text(f"cluster: {{topology: dgx-h100}}\ncollectives: {{chunk: {written}}}\n"
                                    "workload:\n  - {op: all_reduce, bytes: 64 MiB}\n")
        assert loaded.scenario.collectives.chunk is None


@pytest.mark.parametrize("args, error", [
    (["collective", "--topology", "dgx-h100", "--ranks", "0"],
     "trainsim collective: --ranks: '0' is below 2 (allowed: a whole number, 2 or more)"),
    # --ranks 1 passed the flag's check, then was told '1 ranks do not fit dgx-h100 (8 GPUs)', which it does
    (["collective", "--topology", "dgx-h100", "--ranks", "1"],
     "trainsim collective: --ranks: '1' is below 2 (allowed: a whole number, 2 or more)"),
    (["collective", "--topology", "dgx-h100", "--efficiency", "0.5"],  # offered 'a mapping', which no flag takes
     "trainsim collective: --efficiency: invalid choice '0.5' (allowed: calibrated, ideal)"),
    (["sweep", "SWEEP", "--out", "OUT", "--workers", "-3"],
     "trainsim sweep: --workers: '-3' is below 0 (allowed: a whole number, 0 or more)"),
    (["sweep", "SWEEP", "--out", "OUT", "--max-points", "0"],
     "trainsim sweep: --max-points: '0' is below 1 (allowed: a whole number, 1 or more)"),
    (["validate-published", "--jobs", "-3"],  # 0 is all cores, as --workers 0, whose old name it is
     "trainsim validate-published: --jobs: '-3' is below 0 (allowed: a whole number, 0 or more)"),
    (["validate-published", "--workers", "-3"],
     "trainsim validate-published: --workers: '-3' is below 0 (allowed: a whole number, 0 or more)"),
    (["validate-published", "--workers", "2", "--jobs", "2"],
     "trainsim validate-published: --jobs: the old name of --workers; give one of them (allowed: --workers N "
     "alone)"),  # the flag named once: the field is --jobs
    (["search", "S", "--out", "OUT", "--workers", "x"],
     "trainsim search: --workers: 'x' is not a whole number (allowed: a whole number, 0 or more)"),
    (["search", "S", "--out", "OUT", "--top", "x"],  # argparse's own 'invalid int value: 'x'', nothing allowed
     "trainsim search: --top: 'x' is not a whole number (allowed: a whole number, 1 or more)"),
    (["search", "S", "--out", "OUT", "--top", "0"],
     "trainsim search: --top: '0' is below 1 (allowed: a whole number, 1 or more)"),
    (["search", "S", "--out", "OUT", "--pp", "1,0"],
     "trainsim search: --pp: '1,0' has a value below 1 (allowed: whole numbers of 1 or more, comma-separated, "
     "e.g. 1,2,4)"),
    (["search", "S", "--out", "OUT", "--tp", "2,x"],
     "trainsim search: --tp: '2,x' is not a comma list of whole numbers (allowed: whole numbers of 1 or more, "
     "comma-separated, e.g. 1,2,4)"),
    (["search", "S", "--out", "OUT", "--sharding", "zero1,zero9"],
     "trainsim search: --sharding: 'zero9' is not a choice (did you mean zero0, zero1 or zero2?) (allowed: a comma "
     "list of zero0, zero1, zero2, fsdp)"),
    (["study", "mtbf2", "S", "--out", "OUT"],  # was 'study: study:'
     "trainsim study: kind: invalid choice 'mtbf2' (did you mean mtbf?) (allowed: checkpoint-interval, "
     "memory-interval, mtbf)"),
])
def test_counts_on_the_command_line_are_checked(tmp_path, capsys, args, error):
    """Counts on the command line are checked: --ranks 0 (else every GPU runs, as if the flag were absent), --workers -3
    (else the Dask LocalCluster waits for workers forever, the local pool a ValueError traceback), --max-points -1
    (else every sweep is refused) and validate-published --jobs -3 (else the cases run serially). Each refusal says
    what the flag allows, as every other bad input does (argparse's own names neither, only 'argument --ranks')."""
    args = [str(tmp_path / "out") if arg == "OUT" else arg for arg in args]
    assert main(args) == 2
    assert capsys.readouterr().err == f"error: command line: {error}\n"
    assert not (tmp_path / "out").exists()


def test_a_steps_run_refuses_the_workers_of_a_job(tmp_path, capsys):
    """`trainsim run --workers 3` of a step (no run.horizon) was accepted and ignored, as if it had capped
    something; it is a job's option, refused as a chart's option given to another chart is."""
    out = tmp_path / "out"
    assert main(["run", str(SCENARIOS / "schedule-1f1b-p4-m8.yaml"), "--out", str(out), "--workers", "3"]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim run: --workers: a step runs in this one process; --workers sets a job's "
        "processes, which simulate its cluster states ahead (run.horizon) (allowed: --workers with a scenario that "
        "sets run.horizon, none for a step)\n")
    assert not out.exists()


@pytest.mark.parametrize("command, refused_by_argparse, refused_by_the_command", [
    ("search", (["--top", "0"], "--top"), (["--tp", "3"], "--tp/--cp/--pp/--virtual-stages")),
    ("study", (["--workers", "-1"], "--workers"), (["--intervals", "5min,,"], "--intervals")),
    ("collective", (["--ranks", "0"], "--ranks"), (["--op", "bogus"], "--op")),
])
def test_a_flag_is_located_alike_whether_argparse_or_its_command_refuses_it(command, refused_by_argparse,
                                                                           refused_by_the_command, tmp_path, capsys):
    """argparse's refusals and the command's own checks of its flags both name the command line, the command, then the
    flag (`command line: trainsim search: --top: ...`), never the flag without the command."""
    base = {"search": ["search", "llama3-8b-dgx-h100-dp8", "--out", str(tmp_path / "out")],
            "study": ["study", "checkpoint-interval", "llama3-405b-16k-job", "--out", str(tmp_path / "out")],
            "collective": ["collective", "--topology", "dgx-h100"]}[command]
    for flags, flag in (refused_by_argparse, refused_by_the_command):
        assert main([*base, *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: command line: trainsim {command}: {flag}: ") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, error", [
    ([], "trainsim: the following arguments are required: command (allowed: run, validate, scenarios, gpus, "
         "collective, plot, sweep, validate-published, search, study, topo; `trainsim --help` says what each takes)"),
    (["plot"], "trainsim plot: the following arguments are required: chart, OUTDIR (allowed: `trainsim plot --help` "
               "says what each takes)"),
    (["run", "S"], "trainsim run: the following arguments are required: --out (allowed: `trainsim run --help` says "
                   "what each takes)"),
])
def test_a_missing_argument_says_where_to_find_what_it_takes(capsys, args, error):
    """Bare `trainsim`, a new user's first try, says what is allowed as every other refusal does (the commands, or the
    help that lists the arguments), not only 'the following arguments are required: command'."""
    assert main(args) == 2
    assert capsys.readouterr().err == f"error: command line: {error}\n"


def test_topo_describe_bad_file(tmp_path, capsys):
    (tmp_path / "t.yaml").write_text("kind: cluster\nnodes: 2\nnic_bandwidth: 400\n")
    assert main(["topo", "describe", str(tmp_path / "t.yaml")]) == 2
    assert_one_error_line(capsys.readouterr().err, "t.yaml:3", "nic_bandwidth", "has no unit", "Gb/s")


@pytest.mark.parametrize("level,files", [
    ("full", {"summary.json", "timeline.parquet", "trace.json", "manifest.json"}),
    ("per-stage", {"summary.json", "timeline.parquet", "trace.json", "manifest.json"}),
    ("summary", {"summary.json", "manifest.json"}),
])
def test_timeline_levels(tmp_path, level, files):
    out = tmp_path / level
    scenario = SCENARIOS / "schedule-1f1b-p4-m8.yaml"
    assert main(["run", str(scenario), "--out", str(out), "--set", f"run.timeline={level}"]) == 0
    assert {path.name for path in out.iterdir()} == files
    if level == "per-stage":
        frame = pd.read_parquet(out / "timeline.parquet")
        assert set(frame["kind"]) <= {"compute", "collective"}
        assert sorted(frame.loc[frame["kind"] == "compute", "rank"].unique()) == [0, 1, 2, 3]


def test_set_reaches_list_items(tmp_path):
    """`--set workload[0].bytes=...` (or `workload.0.bytes`) sets that item's field, as a sweep axis does."""
    from simulator.config.loader import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text("cluster: {topology: dgx-h100}\nworkload:\n  - {op: all_reduce, bytes: 64 MiB}\n"
                    "  - {op: all_gather, bytes: 1 MiB}\n")
    for key in ("workload[1].bytes", "workload.1.bytes"):
        workload = load_scenario(path, [f"{key}=8 MiB"]).scenario.workload
        assert [item.bytes for item in workload] == [64 * 2**20, 8 * 2**20]


def test_set_reads_numbers_as_a_scenario_file_does(tmp_path, capsys):
    """`--set workload.model_flops_per_token=1e8` reads a number, as scenario files do, not YAML 1.1's text (where 1e8
    and 1.0e8 are strings: "expected a number, got '1e8'"). A value nested too deep is one located line."""
    from simulator.config.loader import load_scenario

    scenario = SCENARIO.parent / "trace-allreduce-2rank.yaml"
    for text in ("1e8", "1.0e8", "100000000"):
        workload = load_scenario(scenario, [f"workload.model_flops_per_token={text}"]).scenario.workload
        assert workload.model_flops_per_token == 1e8
    assert main(["validate", str(scenario), "--set", "run.seed=" + "[" * 100]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: command line: trainsim validate: --set run.seed=[[") and error.count("\n") == 1


def test_field_paths_reach_mapping_keys_written_as_digits():
    """`--set faults.components.1.mtbf=...` sets the key "1" of a mapping (parse_field reads `1` as an index);
    an error on such a key finds its own line."""
    from simulator.config.yaml_source import line_of, parse_field, set_field

    data = {"faults": {"components": {"1": {"mtbf": "3 h"}}}, "workload": [{"bytes": 1}]}
    set_field(data, parse_field("faults.components.1.mtbf"), "2 h")
    set_field(data, parse_field("workload.0.bytes"), 2)
    assert data == {"faults": {"components": {"1": {"mtbf": "2 h"}}}, "workload": [{"bytes": 2}]}
    lines = {("node",): 3, ("node", "7"): 7}
    assert line_of(lines, parse_field("node.7")) == 7


def test_topo_describe_refuses_a_million_gpus_unless_forced(capsys):
    """The size is read from the parameters: the refusal comes before the minutes of building the graph."""
    assert main(["topo", "describe", "dgx-h100-cluster", "--set", "nodes=131072"]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim topo: TOPOLOGY: dgx-h100-cluster has 1,048,576 GPUs, too many to describe in "
        "seconds (building it takes minutes) (allowed: at most 32,768 GPUs: a smaller cluster (--set), or pass "
        "--force)\n")
    assert main(["topo", "draw", "dgx-h100-cluster", "--set", "nodes=4097"]) == 2
    assert "trainsim topo: TOPOLOGY: dgx-h100-cluster has 32,776 GPUs, too many to draw" in capsys.readouterr().err
    assert main(["topo", "describe", "dgx-h100-cluster", "--set", "nodes=4", "--force"]) == 0
    assert "32 GPUs (h100-sxm) on 4 hosts" in capsys.readouterr().out


def test_the_collective_refusal_states_its_measured_cost(capsys):
    """The refusal above 32,768 GPUs gives the measured figures (topology/size.py: one 1 GiB size at 65,536 GPUs takes
    9-20 s and 0.7-0.8 GB), the default sizes' minutes among them, not a guess of minutes and 8 GB."""
    assert main(["collective", "--topology", "dgx-h100-cluster", "--set", "nodes=4097", "--op", "all_reduce",
                 "--sizes", "1GiB"]) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim collective: --topology: dgx-h100-cluster has 32,776 GPUs, too many to time a "
        "collective on in seconds (at 65,536 GPUs an all-reduce of the default 11 sizes took 3 min and 3.1 GB, one "
        "1 GiB size 11 s with ring, 20 s with auto, and 0.7-0.8 GB) (allowed: at most 32,768 GPUs: a smaller cluster "
        "(--set), or pass --force)\n")


def test_collective_help_names_the_ops_of_each_algorithm(capsys):
    """`--algorithm`'s help says which ops each algorithm implements, so that a refusal is no surprise."""
    assert main(["collective", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "tree (all_reduce, broadcast, reduce); " in text
    assert "direct (all_to_all, all_gather, reduce_scatter, all_reduce, broadcast, reduce, send_recv)" in text


A2A_8K = ["collective", "--topology", "dgx-h100-cluster", "--set", "nodes=1024", "--op", "all_to_all", "--sizes",
          "1MiB"]
"""An all-to-all over 8,192 GPUs: 67.1 M flows a size."""


def test_the_collective_command_refuses_a_size_past_the_scale_limits_before_it_runs(capsys):
    """An op whose flows or memory a size pass the limits a run has (scale.py) is refused with its estimate and what
    to change, before anything is simulated."""
    assert main(A2A_8K) == 2
    assert capsys.readouterr().err == (
        "error: command line: trainsim collective: --topology: all_to_all over 8,192 GPUs is too large to simulate: "
        "~8,192 ops, ~67,100,672 flows, ~44.0 GiB of memory a size; ops + flows ~67,108,864 over the limit of "
        "20,000,000 and memory ~44.0 GiB over the limit of 16 GiB (allowed: fewer ranks (--ranks N, or a smaller "
        "cluster: --set nodes=N) or another --op; or pass --force)\n")


def test_the_collective_command_refuses_from_the_gpu_count_before_it_builds_the_cluster(monkeypatch, capsys):
    """Where the GPU count alone already passes the limits (an all-to-all's flows need no plan; rings are fewer
    than a tree posts), the refusal comes before the cluster is built (seconds at 8,192 GPUs)."""
    monkeypatch.setattr("simulator.topology.loader.build_source", lambda _spec: pytest.fail("the cluster was built"))
    assert main(A2A_8K) == 2
    assert "all_to_all over 8,192 GPUs is too large to simulate" in capsys.readouterr().err


def test_the_collective_command_counts_a_size_with_the_transfers_its_plan_posts(monkeypatch, capsys):
    """A size is counted with the plan the sweep runs, not as rings: 16 H100s' tree all-reduce of 1 MiB (LL128,
    auto's protocol for it) posts 1,920 transfers (measured: a workload run's flows_simulated), where 2 a member
    (32) were counted; under a limit of 200 ops + flows the rings' 144 passed."""
    monkeypatch.setattr("simulator.scale.MAX_EVENTS", 200)
    assert main(["collective", "--topology", "dgx-h100-cluster", "--set", "nodes=2", "--algorithm", "tree",
                 "--sizes", "1MiB"]) == 2
    assert "all_reduce over 16 GPUs is too large to simulate: ~16 ops, ~1,920 flows" in capsys.readouterr().err


def test_the_collective_command_runs_past_the_scale_limits_with_force(monkeypatch, capsys):
    """--force runs what the limits refuse: 16 GPUs' all-to-all under a limit of 100 ops + flows."""
    monkeypatch.setattr("simulator.scale.MAX_EVENTS", 100)
    args = ["collective", "--topology", "dgx-h100-cluster", "--op", "all_to_all", "--sizes", "1MiB", "--ranks", "16"]
    assert main(args) == 2
    assert "--ranks: all_to_all over 16 GPUs is too large to simulate" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
    assert "ranks=16" in capsys.readouterr().out


def test_the_collective_command_counts_a_flow_of_the_analytic_model_at_its_own_memory(monkeypatch, capsys):
    """The analytic model holds about twice the memory a flow (scale.COMM_FLOW_BYTES: 1,024 GPUs' all-to-all of
    1 MiB peaked at 1.6 GB where 0.78 GiB was estimated): 16 GPUs' all-to-all, 240 flows, 0.51 MB under analytic,
    0.31 MB under flow beyond the process's `PROCESS_BYTES`, against a limit of 0.4 MB beyond them."""
    monkeypatch.setattr("simulator.scale.MAX_MEMORY_BYTES", PROCESS_BYTES + 400_000)
    args = ["collective", "--topology", "dgx-h100-cluster", "--op", "all_to_all", "--sizes", "1MiB"]
    assert main([*args, "--network", "analytic"]) == 2
    assert "all_to_all over 16 GPUs is too large to simulate" in capsys.readouterr().err
    assert main([*args, "--network", "flow"]) == 0


@pytest.mark.parametrize("network", ["flow", "analytic"])
def test_the_collective_command_says_how_long_a_slow_size_will_take(monkeypatch, capsys, network):
    """Where a size is estimated at several seconds or more, the CPU time a size takes is said before it starts: 16
    GPUs' all-to-all, 256 ops + flows, at 256 a minute, a direct plan's rate under the network model
    (scale.DIRECT_EVENT_S; the other model's and a tree's rates at zero would say nothing)."""
    other = "analytic" if network == "flow" else "flow"
    monkeypatch.setattr("simulator.scale.DIRECT_EVENT_S", {network: 60 / 256, other: 0.0})
    monkeypatch.setattr("simulator.scale.COLLECTIVE_EVENT_S", {network: 0.0, other: 0.0})
    assert main(["collective", "--topology", "dgx-h100-cluster", "--op", "all_to_all", "--sizes", "1MiB,2MiB",
                 "--network", network]) == 0
    assert capsys.readouterr().err == (
        "trainsim collective: about 0:01:00 of CPU a size, 2 sizes (~256 ops + flows, ~256 a CPU minute)\n")


@pytest.mark.parametrize("network", ["flow", "analytic"])
def test_the_collective_command_times_a_tree_by_the_transfers_its_plan_posts(monkeypatch, capsys, network):
    """The time said before a tree all-reduce runs counts the transfers of the plan the sweep runs (16 H100s' tree of
    1 MiB under LL128, auto's protocol for it: 1,920 transfers, counted here from its phases, and 16 ops) at a
    collective's own rate under the network model (scale.COLLECTIVE_EVENT_S), not a training run's; a direct plan (an
    all-to-all's) has a rate of its own (scale.DIRECT_EVENT_S), untouched here."""
    from simulator.collectives.chunking import chunk_bytes
    from simulator.collectives.phases import CollectiveRequest
    from simulator.collectives.registry import plan_collective
    from simulator.topology.loader import load_topology

    topology = load_topology("dgx-h100-cluster", {"nodes": 2})
    request = CollectiveRequest("all_reduce", tuple(range(16)), 2**20, chunk_bytes=chunk_bytes("auto"))
    events = 16 + sum(len(phase.transfers) for phase in plan_collective(request, topology, "tree", protocol="ll128"))
    assert events == 1_936
    monkeypatch.setattr("simulator.scale.COLLECTIVE_EVENT_S", {network: 60 / events})
    assert main(["collective", "--topology", "dgx-h100-cluster", "--algorithm", "tree", "--protocol", "ll128",
                 "--sizes", "1MiB", "--network", network]) == 0
    assert capsys.readouterr().err == (
        f"trainsim collective: about 0:01:00 of CPU a size, 1 size (~{events:,} ops + flows, ~{events:,} a CPU "
        "minute)\n")


def test_the_collective_command_out_of_memory_names_its_own_remedies(monkeypatch, capsys):
    """Out of memory, `trainsim collective` names what it can change, not a scenario's fields."""
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("simulator.collective_sweep.collective_sweep", exhausted)
    assert main(["collective", "--topology", "dgx-h100", "--sizes", "1MiB"]) == 1
    assert capsys.readouterr().err == (
        "error: out of memory (try fewer ranks (--ranks N, or a smaller cluster: --set) or another --op)\n")


@pytest.mark.parametrize("command, args, line", [
    ("_cmd_topo", ["topo", "describe", "dgx-h100"], "error: out of memory (try a smaller cluster (--set))\n"),
    ("_cmd_plot", ["plot", "gantt", "out"], "error: out of memory\n")])
def test_a_command_out_of_memory_names_its_own_remedies_or_none(command, args, line, monkeypatch, capsys):
    """`topo` and `plot` offered a scenario's remedies (run.fold, micro-batches) out of memory: topo names a
    smaller cluster, plot nothing."""
    def exhausted(_args):
        raise MemoryError

    monkeypatch.setattr(f"simulator.cli.{command}", exhausted)
    assert main(args) == 1
    assert capsys.readouterr().err == line


def test_plot_help_names_every_command_that_writes_an_outdir(capsys):
    """goodput is drawn from a `trainsim study` folder, so OUTDIR's help names study among the writers."""
    assert main(["plot", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("OUTDIR folder written by `trainsim run` (gantt, memory), `study` (goodput), `sweep` or `search` "
            "(busbw: also a `trainsim collective --json` file)") in text


def test_the_collective_table_of_a_run_cuts_no_name(tmp_path, capsys):
    """The SHARP scenario's table is 122 characters wide: fitted to 120 off a terminal, it cuts no name (not
    'collnet-dire…' for the item and 'collnet_dire…' for the algorithm that ran it)."""
    assert main(["run", "allreduce-sharp-dgx-h100", "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.lstrip().startswith("collnet"))
    assert row.split()[0] == "collnet-direct" and row.split()[-2:] == ["collnet_direct", "simple"]
    assert not any("\u2026" in line for line in lines)


def test_every_subcommand_and_argument_says_what_it_is():
    """`trainsim validate --help` showed a bare `scenario` and `--set a.b=VALUE`, `collective --help` an `--op`
    without the collectives it takes, `topo --help` a bare `file` and `-o`: each subcommand has a description
    and each of its arguments a help text, and `collective`'s lists the names it accepts."""
    from simulator.cli import _parser
    from simulator.collectives.names import ALGORITHM_CHOICES, PRIMITIVES, PROTOCOL_CHOICES

    subcommands = next(action for action in _parser()._actions if isinstance(action, argparse._SubParsersAction))
    bare = [f"{name} {action.dest}" for name, parser in subcommands.choices.items() for action in parser._actions
            if not action.help]
    assert bare == []
    assert [name for name, parser in subcommands.choices.items() if not parser.description] == []
    # the top-level help ends with the first commands to try: each is one the parser takes
    shown = re.findall(r"`trainsim ([^`]+)`", _parser().epilog or "")
    assert [command.split()[0] for command in shown] == ["scenarios", "validate", "run", "COMMAND"]
    for command in shown[:-1]:
        assert _parser().parse_args(command.split()).command == command.split()[0]
    helps = {action.dest: action.help for action in subcommands.choices["collective"]._actions}
    for dest, names in (("op", PRIMITIVES), ("algorithm", ALGORITHM_CHOICES), ("protocol", PROTOCOL_CHOICES)):
        assert [name for name in names if name not in helps[dest]] == []


def test_run_help_names_the_files_a_step_and_a_job_write(tmp_path, capsys):
    """`trainsim run --help` listed only a step's files (and only in `trainsim --help`); a job writes others."""
    job = DATA / "small-job.yaml"
    written = set()
    for scenario, out in ((SCENARIO, tmp_path / "step"), (job, tmp_path / "job")):
        assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
        written |= {path.name for path in out.iterdir()}
    assert main(["run", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert {"job_summary.json", "timeline.parquet"} <= written
    assert [name for name in sorted(written) if name not in shown] == []


@pytest.mark.parametrize("command, shown", [
    ("sweep", "--max-points N refuse sweeps with more points (default 10,000)"),
    ("collective", "--sizes SIZES LOW:HIGH (doubling) or a comma list, with units (default 1MiB:1GiB)"),
])
def test_help_gives_the_defaults_the_command_applies(capsys, command, shown):
    """`trainsim sweep --help` gives --max-points' limit (a 12,000-point sweep is refused at it) and `trainsim
    collective --help` --sizes' default (1 MiB to 1 GiB), each from the constant the command uses."""
    assert main([command, "--help"]) == 0
    assert shown in " ".join(capsys.readouterr().out.split())  # however wide the terminal wraps it


def test_every_commands_worker_count_is_shown_alike(capsys):
    """validate-published's help read '[--workers WORKERS] [--jobs N]', the same count under two names; every
    command that takes --workers shows it as '--workers N', as benchmarks/search_accuracy.py does."""
    for command in ("run", "sweep", "validate-published", "search", "study"):
        assert main([command, "--help"]) == 0
        shown = capsys.readouterr().out
        assert "[--workers N]" in shown and "WORKERS" not in shown, command


def test_validate_published_replaces_its_report_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    """A report whose writing fails halfway (here a text that cannot be encoded; a signal or a full disk alike) leaves
    the earlier report as it was, not cut to nothing by write_text."""
    from simulator import validation

    out = tmp_path / "validation.md"
    out.write_text("the earlier report\n")
    monkeypatch.setattr(validation, "run_cases", lambda paths, workers: [])
    monkeypatch.setattr(validation, "render", lambda results: "# new report\n\udcff")
    with pytest.raises(UnicodeEncodeError):
        main(["validate-published", "--out", str(out)])
    assert out.read_text() == "the earlier report\n"
    assert [path.name for path in tmp_path.iterdir()] == ["validation.md"]


@pytest.mark.parametrize("problem, typed, named", [
    ("2p = 8, got 1", "training.microbatches=+1", "2p = 8, got +1"),
    ("got 1.", "training.microbatches=+1", "got +1."),
    ("got 10 of got 1", "training.microbatches=+1", "got 10 of got +1"),
    ("got 1.5 of got 1, got 1_000", "training.microbatches=0x1", "got 1.5 of got 0x1, got 1_000"),
    ("got 1000.0", "cluster.nodes=1e3", "got 1e3"),
    ("got 1000.05 or got 1000.0", "cluster.nodes=1e3", "got 1000.05 or got 1e3"),
    ("forgot None, got None", "cluster.nodes=null", "forgot None, got null"),
    ("got Nonesuch", "cluster.nodes=null", "got Nonesuch"),
    ("size 1000000000000.0 has no unit", "checkpoint.size=1e12", "size 1e12 has no unit"),  # a float, without 'got'
    ("+1 is below 1", "training.microbatches=+1", "+1 is below 1"),  # a whole number only after 'got'
])
def test_a_set_value_is_named_as_typed_only_where_the_problem_quotes_it_whole(problem, typed, named):
    """`as_typed` replaced the value as YAML read it anywhere it began another token: `+1` turned "got 10" into
    "got +10", `1e3` "got 1000.05" into "got 1e35"."""
    assert as_typed(problem, typed) == named
