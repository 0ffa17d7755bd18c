"""A run's output folder: the columnar event log's DataFrame, trace.json levels (op slices, per-link
utilisation counter tracks, flow slices, gzip), the manifest, reruns that remove an earlier run's files,
Ctrl-C that leaves exactly one run, and `plot` refusing a folder that mixes runs.

Closed forms: a lone 1 GiB transfer between two DGX H100 nodes crosses the 400 Gb/s (50 GB/s) NIC at the
ideal efficiency, so the NIC link's utilisation over the run is (bytes / 50 GB/s) / run time in every bin.
"""

from __future__ import annotations

import gzip
import inspect
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pandas as pd
import pytest
from shared import REPO, SCENARIOS

import simulator
from simulator.cli import main
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.engine.groups import GroupIds
from simulator.metrics.events import COLUMNS, OP_ROW, EventLog, FlowBlock, FlowRoutes, arrow_table, decoded
from simulator.metrics.link_load import BINS, link_load
from simulator.metrics.step import grouped_sums
from simulator.report import run_folder
from simulator.report.run_folder import MANIFEST, file_digest, interrupts_held
from simulator.report.trace import write_trace
from simulator.simulation import simulate

SMALL = SCENARIOS / "allreduce-2x-dgx-h100.yaml"
PIPELINE = SCENARIOS / "schedule-1f1b-p4-m8.yaml"
TRAINING = SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"
NIC_BYTES_PER_S = 400e9 / 8
TRANSFER = """
cluster: {topology: dgx-h100-cluster, nodes: 2}
network: {model: flow, efficiency: ideal}
workload:
  - {name: p2p, op: send_recv, bytes: 1 GiB, src: 0, dst: 8}
"""
OLD_NUMBER_DTYPES = {"rank": "int64", "src": "int64", "dst": "int64", "microbatch": "int64", "start_s": "float64",
                     "end_s": "float64", "bytes": "float64", "flops": "float64"}
"""How the row-list event log built its DataFrame: columns of Python lists, then these dtypes."""


def one_run_only(out: Path) -> dict:
    """Assert ``out`` holds exactly the files its manifest names, each the very file written; return it."""
    manifest = json.loads((out / MANIFEST).read_text())
    present = {path.name for path in out.iterdir()}
    assert present == set(manifest["files"]) | {MANIFEST}
    for name, entry in manifest["files"].items():
        assert file_digest(out / name) == entry["sha256"], name
    assert not [path for path in out.parent.iterdir() if ".partial-" in path.name]
    return manifest


def trace_events(path: Path) -> list[dict]:
    data = path.read_bytes()
    return orjson.loads(gzip.decompress(data) if path.suffix == ".gz" else data)["traceEvents"]


# ----------------------------------------------------------------------------------------- event log

def test_event_log_frame_has_the_old_columns_and_dtypes():
    result = simulator.simulate(simulator.load_scenario(str(TRAINING)))
    frame = result.timeline
    assert tuple(frame.columns) == COLUMNS
    rebuilt = pd.DataFrame({name: frame[name].tolist() for name in COLUMNS}).astype(OLD_NUMBER_DTYPES)
    assert frame.dtypes.to_dict() == rebuilt.dtypes.to_dict()
    pd.testing.assert_frame_equal(frame, rebuilt)
    assert len(result.flow_routes) == (frame["kind"] == "flow").sum()


def test_event_log_rows_in_recording_order():
    log = EventLog()
    log.record("compute", 3, "compute", "fwd", "forward", 1, -1, 0.0, 1.5, flops=2.0)
    log.flow("k", 3, 4, 0.5, 2.0, 8.0, (7, 9))
    log.replayed_flows("j", 0.0, FlowBlock.of([4], [3], [2.0], [3.0], [16.0], FlowRoutes.of([(9, 7)])))
    frame = log.to_frame()
    assert frame["kind"].tolist() == ["compute", "flow", "flow"]
    assert frame["rank"].tolist() == [3, 3, 4]
    assert frame["stream"].tolist() == ["compute", "net", "net"]
    assert frame["microbatch"].tolist() == [1, -1, -1]
    assert frame["bytes"].tolist() == [0.0, 8.0, 16.0]
    assert frame["key"].tolist() == ["", "k", "j"]
    assert log.flow_routes() == [(7, 9), (9, 7)]


def test_replayed_flow_blocks_keep_recording_order_and_shift_times():
    """A replayed collective logs one block reference; the frame must hold its rows where they were logged,
    times moved on by the replay's start, between the single flows and op rows around them."""
    block = FlowBlock.of([1, 2], [2, 1], [0.0, 0.25], [0.5, 0.75], [8.0, 4.0],
                         FlowRoutes.of([(1, 3, 4), (2,)]))
    log = EventLog()
    log.flow("a", 0, 1, 0.0, 1.0, 2.0, (5, 8))
    log.replayed_flows("b", 1.0, block)
    log.record("collective", 1, "compute", "b", "", -1, -1, 1.0, 1.75, key="b")
    log.replayed_flows("c", 2.0, block)
    log.flow("d", 3, 4, 2.5, 3.0, 1.0, (6,))
    frame = log.to_frame()
    assert frame["kind"].tolist() == ["flow", "flow", "flow", "collective", "flow", "flow", "flow"]
    assert frame["key"].tolist() == ["a", "b", "b", "b", "c", "c", "d"]
    assert frame["start_s"].tolist() == [0.0, 1.0, 1.25, 1.0, 2.0, 2.25, 2.5]
    assert frame["end_s"].tolist() == [1.0, 1.5, 1.75, 1.75, 2.5, 2.75, 3.0]
    assert frame["rank"].tolist() == [0, 1, 2, 1, 1, 2, 3]
    assert log.flow_routes() == [(5, 8), (1, 3, 4), (2,), (1, 3, 4), (2,), (6,)]
    assert log.route_table().tolist() == log.flow_routes()
    assert len(log) == len(frame) == 7


def test_op_row_names_record_s_arguments_in_order_then_the_flows_before():
    """OP_ROW names the fields of `EventLog.record`'s tuples (``nbytes`` is the ``bytes`` column) and then how many
    flow rows came before the row, the field that places op rows among the flows."""
    arguments = [name for name in inspect.signature(EventLog.record).parameters if name != "self"]
    assert list(OP_ROW[:-1]) == ["bytes" if name == "nbytes" else name for name in arguments]
    assert OP_ROW[-1] == "flows_before"


def test_op_columns_give_each_asked_column_of_the_op_rows_alone():
    log = EventLog()
    log.record("compute", 3, "compute", "fwd", "forward", 1, 0, 0.0, 1.5, 4.0, 2.0)
    log.flow("k", 3, 4, 0.5, 2.0, 8.0, (7, 9))
    log.record("collective", 5, "comm", "ar", "dp", -1, 1, 1.0, 2.5, 8.0, 0.0, "k")
    columns = log.op_columns(("rank", "key", "end_s", "src"))
    assert list(columns) == ["rank", "src", "end_s", "key"]
    assert columns["rank"].tolist() == [3, 5] and columns["rank"].dtype == np.int64
    assert columns["src"].tolist() == [-1, -1] and columns["end_s"].tolist() == [1.5, 2.5]
    assert columns["key"].tolist() == ["", "k"]
    assert decoded(*log.columns()["kind"]).tolist() == ["compute", "flow", "collective"]
    assert EventLog().op_columns(("rank", "name"))["rank"].tolist() == []


def test_op_columns_made_once_and_again_after_more_ops():
    """An op column is built once and kept (read-only) for the next reader, the step metrics' columns for the
    timeline; an op recorded after a read is in the next one, in every column."""
    log = EventLog()
    log.record("compute", 3, "compute", "fwd", "forward", 1, 0, 0.0, 1.5, 4.0, 2.0)
    first = log.op_columns(("rank", "name"))
    assert log.op_columns(("rank",))["rank"] is first["rank"] and not first["rank"].flags.writeable
    log.record("collective", 5, "comm", "ar", "dp", -1, 1, 1.0, 2.5, 8.0, 0.0, "k")
    assert log.op_columns(("rank", "name"))["name"].tolist() == ["fwd", "ar"]
    assert decoded(*log.columns()["rank"]).tolist() == [3, 5] and first["rank"].tolist() == [3]


def test_arrow_table_holds_the_log_s_text_ascii_or_not():
    """The Arrow table timeline.parquet is written from has each row's strings, whether a column's distinct
    strings are all ASCII (encoded in one piece) or not (encoded one by one)."""
    log = EventLog()
    log.record("compute", 0, "compute", "F0 ü — 数", "forward", 0, -1, 0.0, 1.0)
    log.flow("all_reduce", 0, 1, 0.5, 2.0, 8.0, (7,))
    log.record("compute", 1, "compute", "B0", "backward", 0, -1, 1.0, 2.0)
    table = arrow_table(log.columns())
    assert table.column("name").to_pylist() == ["F0 ü — 数", "all_reduce", "B0"]
    assert table.column("kind").to_pylist() == ["compute", "flow", "compute"]
    assert table.column("key").to_pylist() == ["", "all_reduce", ""]


def test_flow_columns_split_once_and_again_after_more_flows():
    """The flow rows are split into columns once and shared (read-only) by every reader; a flow or replay logged
    after a read is in the next one."""
    block = FlowBlock.of([1], [2], [0.0], [0.5], [8.0], FlowRoutes.of([(1, 3)]))
    log = EventLog()
    log.flow("a", 0, 1, 0.0, 1.0, 2.0, (5, 8))
    first = log.flow_columns()
    assert log.flow_columns()["bytes"] is first["bytes"] and not first["bytes"].flags.writeable
    log.replayed_flows("b", 1.0, block)
    log.flow("a", 3, 4, 2.5, 3.0, 1.0, (6,))
    again = log.flow_columns()
    assert again["key"].tolist() == ["a", "b", "a"] and again["src"].tolist() == [0, 1, 3]
    assert again["start_s"].tolist() == [0.0, 1.0, 2.5] and log.to_frame()["name"].tolist() == ["a", "b", "a"]
    assert first["key"].tolist() == ["a"]


def test_rows_moved_into_arrays_in_chunks_give_the_same_log(monkeypatch):
    """A log moves its rows into arrays every ROWS_PER_CHUNK rows: with chunks of two rows, op rows, single flows
    and a replay interleaved (a chunk moved mid-way, some rows pending when first read, more logged after a read)
    give every column, the routes and the DataFrame as one chunk holding every row does."""
    from simulator.metrics import events

    block = FlowBlock.of([1, 2], [2, 3], [0.0, 0.1], [0.5, 0.6], [8.0, 4.0], FlowRoutes.of([(1, 3), (4,)]))

    def logged() -> EventLog:
        log = EventLog()
        for index in range(5):
            log.record("compute", index, "compute", f"op{index}", "forward", index, -1, float(index), index + 0.5,
                       0.0, 2.0 * index)
            log.flow(f"k{index % 2}", index, index + 1, index + 0.25, index + 0.75, 8.0 * index, (index, index + 2))
            if index == 2:
                log.replayed_flows("r", 2.5, block)
                log.columns()
        return log

    whole = logged()
    monkeypatch.setattr(events, "ROWS_PER_CHUNK", 2)
    chunked = logged()
    assert len(chunked) == len(whole) == 12 and chunked._op_rows.pending == []
    for name, (values, distinct) in whole.columns().items():
        assert decoded(*chunked.columns()[name]).tolist() == decoded(values, distinct).tolist(), name
    assert chunked.flow_routes() == whole.flow_routes() and chunked.flow_keys()[1] == whole.flow_keys()[1]
    pd.testing.assert_frame_equal(chunked.to_frame(), whole.to_frame())


def test_group_ids_equal_tuples_share_an_id():
    ids = GroupIds()
    group = tuple(range(16))
    assert ids.id(group) == ids.id(tuple(range(16))) == 0
    assert ids.id((1, 2)) == 1
    assert ids.id(group) == 0


# ------------------------------------------------------------------------------------------- trace

def test_link_load_of_one_flow_spread_over_its_life():
    """2 GB over [0.25, 0.75] s of a 1 s run on a 4 GB/s link: 4 GB/s mean rate, utilisation 1 in the middle
    half, 0 outside; and a second link that only half the bytes cross shows 0.5."""
    start, end, nbytes = np.array([0.25, 0.25]), np.array([0.75, 0.75]), np.array([2e9, 1e9])
    load = link_load(start, end, nbytes, np.array([0, 1]), FlowRoutes.of([(0, 1), (1,)]), np.array([4e9, 6e9]),
                     {0, 1}, 1.0)
    assert load.links == (0, 1)
    middle = slice(BINS // 4, 3 * BINS // 4)
    np.testing.assert_allclose(load.utilisation[0, middle], 1.0, rtol=1e-9)
    np.testing.assert_allclose(load.utilisation[1, middle], 3e9 / 0.5 / 6e9, rtol=1e-9)
    assert np.abs(load.utilisation[:, : BINS // 4]).max() < 1e-9
    assert np.abs(load.utilisation[:, 3 * BINS // 4:]).max() < 1e-9
    np.testing.assert_allclose(load.utilisation[0].sum() * 4e9 / BINS, 2e9, rtol=1e-9)


def test_a_link_track_never_passes_the_line_rate_and_keeps_the_bytes():
    """A 4 GB/s link over a 1 s run: a 1 GB flow over [0, 0.5] s shares it with a 3 GB flow over [0, 1] s, which
    runs at 2 GB/s beside it and 4 GB/s after. At their mean rates the first half held 2 + 3 = 5 GB/s, 125% of
    the line rate (Mixtral's gathers showed an InfiniBand link at 133%), the second 75%. The excess moves on to
    the later bins, where the long flow really carried it: the link is full all along, 4 GB in all."""
    start, end, nbytes = np.array([0.0, 0.0]), np.array([0.5, 1.0]), np.array([1e9, 3e9])
    load = link_load(start, end, nbytes, np.array([0, 0]), FlowRoutes.of([(0,), (0,)]), np.array([4e9]), {0}, 1.0)
    np.testing.assert_allclose(load.utilisation[0], 1.0, rtol=1e-9)


def test_counter_track_of_a_lone_transfer_is_its_share_of_the_nic(tmp_path):
    scenario = tmp_path / "p2p.yaml"
    scenario.write_text(TRANSFER)
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out)]) == 0
    makespan = json.loads((out / "summary.json").read_text())["makespan_s"]
    counters: dict[str, list[float]] = {}
    for event in trace_events(out / "trace.json"):
        if event["ph"] == "C":
            counters.setdefault(event["name"], []).append(event["args"]["util"])
    nic_up = [name for name in counters if name.startswith("h0/nic") and "infiniband" in name]
    assert len(nic_up) == 1
    assert counters[nic_up[0]] == [round(2**30 / NIC_BYTES_PER_S / makespan, 3), 0.0]


@pytest.fixture(scope="module")
def pipelined_run(tmp_path_factory) -> Path:
    """The outputs of Llama 3 8B with two pipeline stages (real FLOPs, pipeline sends, DP buckets)."""
    out = tmp_path_factory.mktemp("pipelined") / "out"
    assert main(["run", str(TRAINING), "--out", str(out), "--quiet", "--set", "parallelism.pp=2",
                 "--set", "parallelism.dp=4"]) == 0
    return out


def test_trace_slices_are_the_ops_on_a_nanosecond_grid(pipelined_run):
    """Each op slice starts and ends at its op's times rounded to the nanosecond (ts and dur in microseconds with
    at most three decimals, read exactly), so ops that meet in the run meet in the trace; bytes and FLOPs are
    integers, absent where zero, and a compute slice has no bytes (its HBM bytes are the timeline's). The file
    holds only traceEvents: older Perfetto trace processors read a displayTimeUnit of "ns" as the unit of ts."""
    out = pipelined_run
    trace = json.loads((out / "trace.json").read_text(), parse_float=Decimal)
    assert list(trace) == ["traceEvents"]
    slices = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    timeline = pd.read_parquet(out / "timeline.parquet")
    ops = timeline[timeline["kind"] != "flow"]
    assert len(slices) == len(ops) > 1000 and (ops["flops"] > 0).any() and (ops["bytes"] > 0).any()
    for event, op in zip(slices, ops.itertuples(index=False)):
        start, end = event["ts"] * 1000, (event["ts"] + event["dur"]) * 1000
        assert start == round(op.start_s * 1e9) and end == round(op.end_s * 1e9), (event, op)
        shown_bytes = 0.0 if op.kind == "compute" else op.bytes
        for name, value in (("bytes", shown_bytes), ("flops", op.flops)):
            assert event.get("args", {}).get(name) == (round(value) or None), (name, event, op)


def test_a_rank_on_one_virtual_stage_names_it_on_its_threads(pipelined_run):
    """Without interleaving each rank's kernels work on one virtual stage: its threads say which, and only its
    slices of another stage would carry `chunk`; its pipeline sends and receives are its own ops, of its own
    stage, so none does. Every slice of an op with a virtual stage still tells it, one way or the other."""
    out = pipelined_run
    events = trace_events(out / "trace.json")
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    timeline = pd.read_parquet(out / "timeline.parquet")
    ops = timeline[timeline["kind"] != "flow"]
    stage_of = ops[(ops["kind"] == "compute") & (ops["chunk"] >= 0)].groupby("rank")["chunk"].unique()
    assert all(len(stages) == 1 for stages in stage_of)
    slices = [e for e in events if e["ph"] == "X"]
    carried = 0
    for event, op in zip(slices, ops.itertuples(index=False), strict=True):
        stage = int(stage_of[op.rank][0])
        assert threads[(event["pid"], event["tid"])].endswith(f" (virtual stage {stage})")
        if "chunk" in event.get("args", {}):
            assert event["args"]["chunk"] == op.chunk != stage
            carried += 1
        else:
            assert op.chunk in (stage, -1)
    assert carried == 0


SP_TP2 = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 4096, global_batch: 8, micro_batch: 1}
parallelism: {tp: 2, dp: 4, sequence_parallel: true}
"""


def test_compute_slices_carry_flops_not_hbm_bytes_and_collectives_their_payload(tmp_path):
    """The timeline holds each compute op's HBM bytes; the trace leaves them out of its compute slices (nearly
    each a distinct args object: 5.9% more trace for the 405B run) and keeps their FLOPs and the collectives'
    payloads."""
    result = simulate(scenario_from_text(SP_TP2, "inline.yaml"))
    frame = result.log.to_frame()
    frame = frame[frame.kind != "flow"]
    path = tmp_path / "trace.json"
    write_trace(path, result.log.columns(), result.topology, flows=False, load=None, compress=False)
    slices = [e for e in trace_events(path) if e["ph"] == "X"]
    compute = set(frame.name[frame.kind == "compute"])
    collective = frame[frame.kind == "collective"]
    assert (frame.bytes[frame.kind == "compute"] > 0).all() and len(collective)
    assert len(slices) == len(frame)
    computed = [e.get("args", {}) for e in slices if e["name"] in compute]
    assert not [args for args in computed if "bytes" in args]
    assert sum(args.get("flops", 0) for args in computed) == pytest.approx(frame.flops.sum(), rel=1e-9)
    payload = collective.groupby("name").bytes.max().round().astype(int).to_dict()
    carried = {e["name"]: e["args"]["bytes"] for e in slices if e["name"] in payload}
    assert carried == payload


def test_a_slice_of_another_stage_than_its_ranks_kernels_carries_it(tmp_path):
    """A rank whose kernels all work on virtual stage 0 names it on its threads; its one op of another stage
    (a collective on chunk 1) carries `chunk` on its slice, and no other slice does."""
    log = EventLog()
    log.record("compute", 0, "compute", "fwd", "forward", 0, 0, 0.0, 1e-6, 0.0, 1e9)
    log.record("compute", 0, "compute", "bwd", "backward", 0, 0, 1e-6, 3e-6, 0.0, 2e9)
    log.record("collective", 0, "dp", "rs", "dp", 0, 1, 3e-6, 4e-6, 1024.0, 0.0, "k")
    log.record("collective", 0, "dp", "ag", "dp", 0, 0, 4e-6, 5e-6, 1024.0, 0.0, "j")
    path = tmp_path / "trace.json"
    write_trace(path, log.columns(), SimpleNamespace(gpu_host=[0]), flows=False, load=None, compress=False)
    events = trace_events(path)
    threads = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    assert threads == ["GPU 0 compute (virtual stage 0)", "GPU 0 dp (virtual stage 0)"]
    carried = {e["name"]: e["args"].get("chunk") for e in events if e["ph"] == "X"}
    assert carried == {"fwd": None, "bwd": None, "rs": 1, "ag": None}


def test_a_run_of_one_virtual_stage_in_all_names_none(tmp_path):
    """Llama 3 8B, DP 8 on one DGX H100 (no pipeline) named its threads 'GPU 0 compute (virtual stage 0)' and
    'GPU 0 dp (virtual stage 0)': every op of such a run is on stage 0, so the name tells nothing, and its DP
    collectives are of no stage at all. Its threads are plain and no slice carries `chunk`."""
    log = EventLog()
    log.record("compute", 0, "compute", "fwd", "forward", 0, 0, 0.0, 1e-6, 0.0, 1e9)
    log.record("collective", 0, "dp", "rs", "dp", 0, 0, 1e-6, 2e-6, 1024.0, 0.0, "k")
    log.record("compute", 1, "compute", "fwd", "forward", 0, 0, 0.0, 1e-6, 0.0, 1e9)
    path = tmp_path / "trace.json"
    write_trace(path, log.columns(), SimpleNamespace(gpu_host=[0, 0]), flows=False, load=None, compress=False)
    events = trace_events(path)
    assert [e["args"]["name"] for e in events if e["name"] == "thread_name"] == [
        "GPU 0 compute", "GPU 0 dp", "GPU 1 compute"]
    assert not any("chunk" in e.get("args", {}) for e in events if e["ph"] == "X")


def test_trace_text_of_unusual_names_and_counts(tmp_path):
    """Names are JSON strings whatever they hold (quotes, backslashes, control and non-ASCII characters);
    counts beyond an int64 stay numbers; a rank without a virtual stage has plain thread names."""
    log = EventLog()
    odd = 'say "hi" \\ \t tab — ü\x01'
    log.record("compute", 2, "compute", odd, "forward", 0, -1, 0.0, 1e-6, 2.4, 3e19)
    log.record("collective", 0, "tp", "ar", "tp", 0, -1, 5e-7, 2e-6, 1024.0, 0.0, "k")
    path = tmp_path / "trace.json"
    write_trace(path, log.columns(), SimpleNamespace(gpu_host=[0, 0, 1]), flows=False, load=None, compress=False)
    events = trace_events(path)
    names = [e["args"]["name"] for e in events if e["ph"] == "M"]
    assert names == ["host 0", "GPU 0 tp", "host 1", "GPU 2 compute"]
    first, second = (e for e in events if e["ph"] == "X")
    assert (first["name"], first["args"], first["ts"], first["dur"]) == (odd, {"flops": 3e19}, 0, 1)
    assert (second["name"], second["cat"], second["args"], second["ts"], second["dur"]) == (
        "ar", "tp", {"bytes": 1024}, 0.5, 1.5)


def test_trace_counts_of_a_few_values_over_a_wide_range(tmp_path):
    """Byte and FLOP counts that repeat a few values spread far wider than the rows (numbered among their distinct
    values by bisection, not counted in their range) still give each slice its own counts, those beyond an int64
    as numbers."""
    sizes = [0.0, 3.0, 2.0**40, 5e18, 2.0**70]
    counts = [(sizes[row % 5], sizes[row // 5 % 5]) for row in range(200)]
    log = EventLog()
    for row, (nbytes, flops) in enumerate(counts):
        log.record("collective", 0, "tp", f"op {row}", "tp", 0, -1, row * 1e-6, (row + 0.5) * 1e-6, nbytes, flops,
                   f"k{row}")
    path = tmp_path / "trace.json"
    write_trace(path, log.columns(), SimpleNamespace(gpu_host=[0]), flows=False, load=None, compress=False)
    slices = [e for e in trace_events(path) if e["ph"] == "X"]
    assert [(e["name"], e.get("args", {})) for e in slices] == [
        (f"op {row}", {key: value for key, value in (("bytes", nbytes), ("flops", flops)) if value})
        for row, (nbytes, flops) in enumerate(counts)]


def overlapping_slices(events: list[dict]) -> list[tuple[str, str]]:
    """Pairs of slices on one thread that overlap without nesting (on the nanosecond grid Perfetto reads):
    the trace format forbids them, and Perfetto drops them."""
    threads: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for e in events:
        if e["ph"] == "X":
            start = round(e["ts"] * 1000)
            threads.setdefault((e["pid"], e["tid"]), []).append((start, start + round(e["dur"] * 1000), e["name"]))
    found = []
    for spans in threads.values():
        open_spans: list[tuple[int, str]] = []
        for start, end, name in sorted(spans, key=lambda span: (span[0], -span[1])):
            open_spans = [(until, outer) for until, outer in open_spans if until > start]
            found += [(outer, name) for until, outer in open_spans if end > until]
            open_spans.append((end, name))
    return found


def test_ops_of_one_stream_that_overlap_go_on_lanes_of_their_own(tmp_path):
    """A pipeline send from 0 to 2 us and a receive from 1 to 3 us on one stream overlap: the receive goes on a
    second lane (thread "GPU 0 pp, lane 2"), and the send from 2 to 4 us back on the first, free again at 2 us."""
    log = EventLog()
    log.record("collective", 0, "pp", "send 0", "pp", 0, -1, 0.0, 2e-6, 8.0, 0.0, "a")
    log.record("collective", 0, "pp", "recv 0", "pp", 0, -1, 1e-6, 3e-6, 8.0, 0.0, "b")
    log.record("collective", 0, "pp", "send 1", "pp", 1, -1, 2e-6, 4e-6, 8.0, 0.0, "c")
    path = tmp_path / "trace.json"
    write_trace(path, log.columns(), SimpleNamespace(gpu_host=[0]), flows=False, load=None, compress=False)
    events = trace_events(path)
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert [threads[e["tid"]] for e in events if e["ph"] == "X"] == ["GPU 0 pp", "GPU 0 pp, lane 2", "GPU 0 pp"]
    assert overlapping_slices(events) == []


def test_no_two_slices_of_a_thread_overlap_in_a_run_with_concurrent_pipeline_transfers(tmp_path):
    """Llama 3 8B on 4 stages (1F1B, 16 micro-batches): the middle stages' sends of one micro-batch overlap their
    receives of another on their `pp` stream (twice each); every op still has its slice, and no slice of a
    thread overlaps another."""
    out = tmp_path / "out"
    assert main(["run", str(TRAINING), "--out", str(out), "--quiet", "--set", "parallelism.pp=4",
                 "--set", "parallelism.dp=2", "--set", "run.trace=ops"]) == 0
    events = trace_events(out / "trace.json")
    timeline = pd.read_parquet(out / "timeline.parquet")
    assert sum(e["ph"] == "X" for e in events) == (timeline["kind"] != "flow").sum()
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"GPU 1 pp, lane 2 (virtual stage 1)", "GPU 2 pp, lane 2 (virtual stage 2)"} <= threads
    assert overlapping_slices(events) == []


def test_a_synthetic_pipeline_logs_its_handoffs_on_the_pp_stream(tmp_path):
    """The synthetic schedules' stage handoffs (zero-time ops on the async `pp` stream) are logged under `pp`,
    not one stream per op (`pp#25`): 4 stages have 8 trace threads, compute and pp each."""
    out = tmp_path / "out"
    assert main(["run", str(PIPELINE), "--out", str(out), "--quiet"]) == 0
    assert set(pd.read_parquet(out / "timeline.parquet")["stream"]) == {"compute", "pp"}
    events = trace_events(out / "trace.json")
    threads = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    assert len(threads) == 8 and "GPU 3 pp (virtual stage 3)" in threads
    # No flows, so no link carried anything: no "network links" process (it was there, empty).
    processes = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert processes == ["host 0"] and not any(e["ph"] == "C" for e in events)


def test_trace_levels_and_gzip(tmp_path):
    events = {}
    for level in ("ops", "ops+links", "full"):
        out = tmp_path / level
        assert main(["run", str(SMALL), "--out", str(out), "--set", f"run.trace={level}"]) == 0
        events[level] = trace_events(out / "trace.json")
    timeline = pd.read_parquet(tmp_path / "full" / "timeline.parquet")
    flows, ops = (timeline["kind"] == "flow").sum(), (timeline["kind"] != "flow").sum()
    count = {level: {ph: sum(e["ph"] == ph for e in found) for ph in "XC"} for level, found in events.items()}
    assert count["ops"] == {"X": ops, "C": 0}
    assert count["ops+links"]["X"] == ops and count["ops+links"]["C"] > 0
    assert count["full"] == {"X": ops + flows, "C": count["ops+links"]["C"]}
    zipped = tmp_path / "gz"
    for _ in range(2):
        assert main(["run", str(SMALL), "--out", str(zipped), "--set", "run.trace_compress=true"]) == 0
        assert {path.name for path in zipped.iterdir()} == {"summary.json", "timeline.parquet", "trace.json.gz",
                                                             MANIFEST}
        assert gzip.decompress((zipped / "trace.json.gz").read_bytes()) == (tmp_path / "ops+links" /
                                                                           "trace.json").read_bytes()


# ---------------------------------------------------------------------------------- output folders

def test_rerun_removes_the_files_of_an_earlier_run(tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(PIPELINE), "--out", str(out), "--set", "run.trace_compress=true"]) == 0
    first = one_run_only(out)
    assert main(["run", str(SMALL), "--out", str(out), "--set", "run.timeline=summary"]) == 0
    second = one_run_only(out)
    assert set(second["files"]) == {"summary.json"}
    assert second["scenario_sha256"] != first["scenario_sha256"]
    (out / "timeline.parquet").write_bytes(b"left by hand")
    assert main(["run", str(SMALL), "--out", str(out)]) == 0
    assert set(one_run_only(out)["files"]) == {"summary.json", "timeline.parquet", "trace.json"}


FOLDERS = {"search": ("candidates.csv", "candidates.parquet", "search.json"), "study": ("study.csv", "study.json"),
           "run": ("summary.json", "timeline.parquet", "trace.json"), "sweep": ("points.jsonl", "results.parquet")}
"""The files of each kind of output folder, a sweep's without a manifest."""
WRITERS = {"run": ["run", str(SMALL)], "search": ["search", str(TRAINING)],
           "study": ["study", "checkpoint-interval", str(TRAINING)], "sweep": ["sweep", "sweep.yaml"]}
SWEEP_RECORD = '{"index": 0, "key": "k", "status": "ok", "error": "", "metrics": {}}\n'
"""One line of a sweep's points.jsonl (`sweep/results.PointRecord`)."""


@pytest.mark.parametrize(("held", "command"), [
    ("search", "run"), ("study", "run"), ("sweep", "run"), ("run", "search"), ("run", "study"), ("run", "sweep"),
    ("sweep", "search")])
def test_a_command_refuses_a_folder_of_another_commands_results(tmp_path, capsys, held, command):
    """Each command refuses another command's folder before any work, in one line naming what it holds: `trainsim run
    --out` of a layout search's folder does not delete its candidates (the files its manifest lists), `search --out`
    leaves a run's alone, and a run into a sweep's folder (no manifest) does not leave the folder both."""
    out = tmp_path / "held"
    out.mkdir()
    for name in FOLDERS[held]:
        (out / name).write_text(name)
    if held == "sweep":
        (out / "points.jsonl").write_text(SWEEP_RECORD)
    else:
        listed = {name: {"bytes": len(name), "sha256": ""} for name in FOLDERS[held]}
        (out / MANIFEST).write_bytes(json.dumps({"files": listed}).encode())
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert main([*WRITERS[command], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    files = sorted({*FOLDERS[held], *([] if held == "sweep" else [MANIFEST])})
    what = {"search": "a layout search", "study": "a study", "run": "a run", "sweep": "a sweep"}[held]
    assert err.startswith(f"error: command line: trainsim {command}: --out: {out} holds {what}'s results "
                          f"({', '.join(files)}), which trainsim {command} would ")
    assert err.count("\n") == 1
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before


def sweep_refusal(out, capsys) -> str:
    """What `trainsim sweep --out out` prints as it refuses the folder (exit 2)."""
    assert main(["sweep", "sweep.yaml", "--out", str(out)]) == 2
    return capsys.readouterr().err


def test_a_sweeps_refusal_says_it_writes_beside_not_deletes(tmp_path, capsys):
    """`trainsim sweep --out` of a run's folder says the sweep writes its files beside the run's, not that it 'would
    delete' them: a sweep deletes nothing."""
    out = tmp_path / "held"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / MANIFEST).write_text('{"files": {"summary.json": {}}}')
    assert sweep_refusal(out, capsys) == (
        f"error: command line: trainsim sweep: --out: {out} holds a run's results (manifest.json, summary.json), "
        f"which trainsim sweep would write its files beside (allowed: a new folder, or one trainsim sweep wrote; "
        f"remove the files of {out} first to replace them)\n")


@pytest.mark.parametrize("name", ["results.csv", "results.parquet", "points.jsonl"])
def test_a_users_file_of_a_sweeps_name_is_no_sweep(tmp_path, capsys, name):
    """A sweep's folder is one whose points.jsonl holds a sweep's records, not any folder with a results.csv (or
    points.jsonl, results.parquet): beside a user's own such file without a manifest a run writes, and a sweep
    refuses it rather than overwrite it."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text("my own\n")
    assert sweep_refusal(out, capsys) == (
        f"error: command line: trainsim sweep: --out: {out} holds {name}, which no trainsim sweep wrote (no sweep's "
        f"points in points.jsonl) and trainsim sweep would overwrite (allowed: a new folder, or one trainsim sweep "
        f"wrote; remove the files of {out} first to replace them)\n")
    assert main(["run", str(SMALL), "--out", str(out), "--quiet"]) == 0
    assert (out / name).read_text() == "my own\n"


@pytest.mark.parametrize("manifest", [None, "not json"], ids=["killed", "corrupt-manifest"])
@pytest.mark.parametrize("kind", [run_folder.SEARCH_FOLDER, run_folder.STUDY_FOLDER], ids=["search", "study"])
def test_a_search_or_study_leaves_a_runs_names_in_a_folder_without_a_manifest(tmp_path, manifest, kind):
    """A search or a study into a folder without a readable manifest (a killed run's, or the user's own
    summary.json and trace.json) deleted every run output name it found there, exit 0: only `trainsim run`
    removes a run's names; the others remove their own and what a manifest of theirs listed."""
    out = tmp_path / "out"
    out.mkdir()
    for name in run_folder.RUN_OUTPUTS:
        (out / name).write_text("mine")
    if manifest is not None:
        (out / MANIFEST).write_text(manifest)
    run_folder.write_run_folder(out, {}, lambda stage: (stage / kind.files[0]).write_text("new"), kind)
    assert all((out / name).read_text() == "mine" for name in run_folder.RUN_OUTPUTS)
    assert (out / kind.files[0]).read_text() == "new"


def test_the_manifest_records_each_set_as_typed(tmp_path):
    """A run's `--set`s change its scenario without a trace in the scenario file: the manifest lists them as
    typed, in order, so the run can be reproduced; none, an empty list."""
    out = tmp_path / "out"
    assert main(["run", str(SMALL), "--out", str(out), "--quiet", "--set", "run.timeline=summary",
                 "--set", " run.seed=3"]) == 0
    assert one_run_only(out)["overrides"] == ["run.timeline=summary", "run.seed=3"]
    assert main(["run", str(SMALL), "--out", str(out), "--quiet"]) == 0
    assert one_run_only(out)["overrides"] == []


def test_rerun_removes_a_chart_plotted_into_the_folder(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "gantt.png"
    assert main(["run", str(PIPELINE), "--out", str(out)]) == 0
    assert main(["plot", "gantt", str(out)]) == 0
    assert main(["plot", "gantt", str(out), "-o", str(elsewhere)]) == 0
    assert json.loads((out / MANIFEST).read_text())["figures"] == ["gantt.png"]
    (out / "notes.txt").write_text("mine")
    assert main(["run", str(PIPELINE), "--out", str(out), "--set", "training.microbatches=4"]) == 0
    assert not (out / "gantt.png").exists() and elsewhere.exists() and (out / "notes.txt").exists()
    (out / "notes.txt").unlink()
    assert "figures" not in one_run_only(out)


def test_a_failure_while_writing_leaves_the_previous_run(tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert main(["run", str(PIPELINE), "--out", str(out)]) == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}

    def interrupted(path, *args, **kwargs):
        Path(path).write_bytes(b'{"traceEvents":[')
        raise KeyboardInterrupt

    monkeypatch.setattr("simulator.report.writers.write_trace", interrupted)
    assert main(["run", str(SMALL), "--out", str(out)]) == 130  # "interrupted", as after Ctrl-C
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    one_run_only(out)


def _run_with_the_console_stop_handlers(out: Path) -> int:
    """`trainsim run` of the small scenario into ``out`` with the handlers a console run has: Python's SIGINT
    handler (whatever a test before left) and the console script's SIGTERM handler; both restored after."""
    from simulator.cli import _interrupted_once

    handlers = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.SIGTERM: signal.signal(signal.SIGTERM, _interrupted_once)}
    try:
        return main(["run", str(SMALL), "--out", str(out), "--quiet"])
    finally:
        for held, handler in handlers.items():
            signal.signal(held, handler)


@pytest.mark.parametrize(("signum", "said", "status"), [(signal.SIGINT, "interrupted", 130),
                                                      (signal.SIGTERM, "terminated", 143)])
def test_a_stop_after_the_move_leaves_no_partial_folder_and_says_the_run_was_written(tmp_path, monkeypatch, capsys,
                                                                                     signum, said, status):
    """Ctrl-C (or SIGTERM) landing right after the move, as the temporary folder is removed, is held back until it
    is gone, and the command says the new run was written, as for a stop during the move."""
    out = tmp_path / "out"
    assert main(["run", str(PIPELINE), "--out", str(out)]) == 0
    remove = shutil.rmtree

    def pressed_first(path, *args, **kwargs):
        signal.raise_signal(signum)
        remove(path, *args, **kwargs)

    monkeypatch.setattr("simulator.report.run_folder.shutil.rmtree", pressed_first)
    capsys.readouterr()
    assert _run_with_the_console_stop_handlers(out) == status
    assert capsys.readouterr().err == f"{said}: the run's files were written to {out} before it stopped\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    assert one_run_only(out)["scenario"] == str(SMALL)


def test_interrupts_are_held_while_files_move():
    """Ctrl-C while a run's files move is held back, then handed to Python's handler: KeyboardInterrupt once the
    files are in. The test installs that handler: a suite started in a shell's background (`nohup land.sh &`)
    inherits SIGINT ignored, which the hold rightly drops, and the test failed there ('DID NOT RAISE')."""
    original = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts_held():
                os.kill(os.getpid(), signal.SIGINT)
                moved = True
        assert moved
    finally:
        signal.signal(signal.SIGINT, original)


def test_sigterm_is_held_while_files_move_and_handed_to_its_handler():
    """SIGTERM is held back as Ctrl-C is, then handed to the console script's handler: Terminated, a
    KeyboardInterrupt, and both signals ignored after it."""
    from simulator.cli import _interrupted_once
    from simulator.errors import Terminated

    handlers = {held: signal.signal(held, _interrupted_once) for held in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(Terminated):
            with interrupts_held():
                os.kill(os.getpid(), signal.SIGTERM)
                moved = True
        assert moved
        assert signal.getsignal(signal.SIGTERM) == signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        for held, handler in handlers.items():
            signal.signal(held, handler)


def test_a_press_held_back_goes_to_the_handler_it_was_held_from():
    """A press held back is handed on when the hold ends: the console script's handler raises KeyboardInterrupt and
    ignores every later press; an outer hold keeps it until its own end; SIG_IGN drops it."""
    from simulator.cli import _interrupted_once

    original = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, _interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            with interrupts_held():
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)  # a second press, ignored

        signal.signal(signal.SIGINT, signal.default_int_handler)
        with pytest.raises(KeyboardInterrupt):
            with interrupts_held():
                with interrupts_held():
                    os.kill(os.getpid(), signal.SIGINT)
                inner_ended = True
        assert inner_ended

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, original)


@pytest.mark.parametrize(("signum", "said", "status"), [(signal.SIGINT, "interrupted", 130),
                                                      (signal.SIGTERM, "terminated", 143)])
def test_ctrl_c_while_the_files_move_in_says_they_were_written(tmp_path, monkeypatch, capsys, signum, said, status):
    """Ctrl-C (or SIGTERM) while a run's files are moved into its folder is held back until they are all there: the
    folder holds the new complete run, and `trainsim run` exits 130 (143) saying its files were written."""
    out = tmp_path / "out"
    replace, pressed = os.replace, []

    def pressing_replace(source, target):
        if not pressed:
            pressed.append(os.kill(os.getpid(), signum))
        replace(source, target)

    monkeypatch.setattr(run_folder.os, "replace", pressing_replace)
    assert _run_with_the_console_stop_handlers(out) == status
    assert capsys.readouterr().err == f"{said}: the run's files were written to {out} before it stopped\n"
    assert pressed and one_run_only(out)["scenario"] == str(SMALL)


def test_a_stop_python_dropped_while_the_files_were_written_is_raised_before_they_move_in(tmp_path):
    """A Ctrl-C whose KeyboardInterrupt Python dropped while a run's files were written (raised in a ``__del__`` or
    a weakref callback, kept by the console script's hook: simulator/stops.py) is raised before the files move in:
    nothing written, no temporary folder left."""
    from contextlib import suppress

    from simulator.stops import kept_for_later, raise_dropped

    def write(stage: Path) -> None:
        (stage / "summary.json").write_text("{}")
        kept_for_later(print, SimpleNamespace(exc_value=KeyboardInterrupt()))

    try:
        with pytest.raises(KeyboardInterrupt):
            run_folder.write_run_folder(tmp_path / "out", {}, write)
        assert list(tmp_path.iterdir()) == []
    finally:
        with suppress(KeyboardInterrupt):
            raise_dropped()


MARKED_RUN = """
import sys
from pathlib import Path

from simulator.cli import console
from simulator.console import progress
from simulator.report import run_folder

marks, enter, digest = Path(sys.argv[1]), progress.RunProgress.__enter__, run_folder.file_digest


def entering(self):
    (marks / "simulating").touch()
    return enter(self)


def digesting(path):
    (marks / "written").touch()
    return digest(path)


progress.RunProgress.__enter__, run_folder.file_digest = entering, digesting
sys.argv = ["trainsim", *sys.argv[2:]]
sys.exit(console())
"""
"""`trainsim` that marks where it got to with a file: `simulating` as its progress starts, the scenario loaded,
`written` once its files are in the temporary folder, before they move into --out."""


@pytest.mark.parametrize("moment", ["simulating", "written"])
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sigint_midway_leaves_exactly_one_run(tmp_path, moment, signum, status):
    """Interrupt `trainsim run` (Ctrl-C or SIGTERM) at several moments into a folder holding another run (once it marks
    that it got there, not after fixed sleeps, which a loaded machine could spend still importing): wherever it
    lands, the folder holds one complete run (the old or the new one) and no temporary folder."""
    out, marks = tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    assert main(["run", str(SMALL), "--out", str(out)]) == 0
    old = one_run_only(out)
    child = subprocess.Popen([sys.executable, "-c", MARKED_RUN, str(marks), "run", str(TRAINING), "--out", str(out)],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (marks / moment).exists() and child.poll() is None:
        time.sleep(0.001)
    assert (marks / moment).exists()
    child.send_signal(signum)
    assert child.wait(timeout=120) in (0, status)
    manifest = one_run_only(out)
    assert manifest["scenario"] in (old["scenario"], str(TRAINING))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["marks", "out"]


def test_plot_refuses_a_mixed_or_incomplete_folder(tmp_path, capsys):
    out, other = tmp_path / "out", tmp_path / "other"
    assert main(["run", str(PIPELINE), "--out", str(out)]) == 0
    assert main(["run", str(PIPELINE), "--out", str(other), "--set", "training.microbatches=4"]) == 0
    (out / "timeline.parquet").write_bytes((other / "timeline.parquet").read_bytes())
    capsys.readouterr()
    assert main(["plot", "gantt", str(out), "-o", str(tmp_path / "g.png")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "timeline.parquet is not the file this run wrote" in error
    (other / MANIFEST).unlink()
    assert main(["plot", "gantt", str(other), "-o", str(tmp_path / "g.png")]) == 2
    assert "has no manifest.json" in capsys.readouterr().err
    (out / "timeline.parquet").unlink()
    assert main(["run", str(PIPELINE), "--out", str(out)]) == 0
    (out / "trace.json.gz").write_bytes(b"")
    capsys.readouterr()
    assert main(["plot", "gantt", str(out), "-o", str(tmp_path / "g.png")]) == 2
    assert "OUTDIR: trace.json.gz belongs to another run (mixed folder)" in capsys.readouterr().err
    assert not (tmp_path / "g.png").exists()


def test_manifest_names_the_run(tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(PIPELINE), "--out", str(out), "--set", "run.seed=7"]) == 0
    manifest = one_run_only(out)
    assert manifest["seed"] == 7
    assert manifest["scenario"] == str(PIPELINE)
    assert manifest["trainsim_version"] == run_folder.trainsim_version()
    assert len(manifest["scenario_sha256"]) == 64


def heavy_modules_after(args: list[str]) -> list[str]:
    """Which of pandas, matplotlib, pyarrow, pyarrow.compute (whose import costs some 25 ms) and rich a fresh
    `trainsim ARGS` process has imported at its end."""
    code = ("import sys\nfrom simulator.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(name for name in ('pandas', 'matplotlib', 'pyarrow', 'pyarrow.compute', 'rich')"
            " if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))


@pytest.mark.parametrize("args", [["--help"], ["collective", "--topology", "dgx-h100-cluster", "--set", "nodes=2",
                                              "--sizes", "1MiB"]])
def test_help_and_collective_load_neither_pandas_nor_matplotlib(args):
    assert heavy_modules_after(args) == []


def test_a_run_that_writes_no_timeline_builds_no_frame(tmp_path):
    """The summary comes from the log's columns: without a timeline to write, pandas is never imported."""
    assert heavy_modules_after(["run", str(TRAINING), "--set", "run.timeline=summary", "--out", str(tmp_path / "out"),
                                "--quiet"]) == []
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["manifest.json", "summary.json"]


@pytest.mark.parametrize("trace", ["ops+links", "full"])
def test_the_timeline_and_trace_are_written_without_pandas_and_read_back_as_the_frame(tmp_path, trace):
    """timeline.parquet (the whole timeline, the default) and the trace, with or without flow slices, are
    written from the log's columns by Arrow without importing pandas or pyarrow.compute; read back, the parquet
    is the log's DataFrame row for row, with its dtypes."""
    out = tmp_path / "out"
    assert heavy_modules_after(["run", str(TRAINING), "--set", f"run.trace={trace}", "--out", str(out),
                                "--quiet"]) == ["pyarrow"]
    frame = simulate(load_scenario(TRAINING)).timeline
    assert len(frame) > 100 and (frame["kind"] == "flow").any()
    pd.testing.assert_frame_equal(pd.read_parquet(out / "timeline.parquet"), frame, check_exact=True)


def test_grouped_sums_are_pandas_groupby_sums_to_the_bit():
    """Kahan-compensated per label in row order, as pandas' groupby sum: values of very different sizes, where a
    plain running sum (and numpy's pairwise one) come out different in the last bits."""
    rng = np.random.default_rng(3)
    values = (rng.uniform(0, 1, 20_000) * 10.0 ** rng.integers(-8, 9, 20_000)).tolist()
    labels = rng.integers(0, 5, 20_000).tolist()
    expected = pd.Series(values).groupby(labels).sum().to_dict()
    sums = grouped_sums(labels, values)
    assert sums == expected
    plain: dict[int, float] = {}
    for label, value in zip(labels, values):
        plain[label] = plain.get(label, 0.0) + value
    assert plain != expected


@pytest.mark.parametrize("values", [
    [1.0, math.inf, 2.0], [1.0, math.nan, 2.0], [math.inf, -math.inf, 1.0], [1.0, -math.inf, 2.0], [math.nan],
    [math.nan, math.inf, 3.0], [math.inf, 1.0, math.nan, -math.inf], [1e308, 1e308, -1e308, 5.0],
])
def test_grouped_sums_treat_inf_and_nan_as_pandas_does(values):
    """NaN skipped (a label with only NaN sums to 0.0) and a compensation made infinite or NaN by an infinity or
    an overflow dropped, as pandas' group_sum does: label 0 takes the case's values, interleaved with label 1's
    finite ones (labels out of sorted order, so that pandas adds them with its Cython kernel)."""
    labels = [0, 1] * len(values)
    interleaved = [value for case_value in values for value in (case_value, 0.5)]
    expected = pd.Series(interleaved).groupby(labels).sum().to_dict()
    sums = grouped_sums(labels, interleaved)
    assert sums.keys() == expected.keys()
    assert all(sums[label] == expected[label] or (math.isnan(sums[label]) and math.isnan(expected[label]))
               for label in sums)


def test_a_failed_write_leaves_nothing_and_raises_its_own_error(tmp_path):
    """The temporary file is removed on error, and a writer that already removed it still sees its own error
    (not the cleanup's FileNotFoundError); the target stays untouched."""
    from simulator.report.atomic import write_through_temporary

    target = tmp_path / "out.json"
    target.write_text("old")

    def fail_after_removing(tmp: Path) -> None:
        tmp.unlink()
        raise ValueError("writer failed")

    for write in (fail_after_removing, lambda tmp: (tmp.write_text("half"), 1 / 0)):
        with pytest.raises((ValueError, ZeroDivisionError)) as info:
            write_through_temporary(target, write)
        assert not isinstance(info.value, FileNotFoundError)
        assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_zero_byte_collective_writes_strict_json(tmp_path):
    """0 bytes in 0 s gave algbw and busbw Infinity, which summary.json held as the bare word `Infinity`: not
    JSON (orjson, jq and JavaScript refuse it). nccl-tests prints 0 for such a row."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text("cluster: {topology: dgx-h100}\nworkload: [{name: empty, op: all_reduce, bytes: 0 B}]\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    row = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())["collectives"][0]
    assert (row["bytes"], row["time_s"], row["algbw_GBps"], row["busbw_GBps"]) == (0.0, 0.0, 0.0, 0.0)
