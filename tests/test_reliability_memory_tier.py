"""The in-memory checkpoint tier (`checkpoint.memory`) against closed forms and its refusals.

- Host failures only, one peer copy: every failure restores from peer memory or from a newer storage
  checkpoint, both every 2,000 steps of training, so the work lost per failure is X mod tau for exponential X:
  E = M - tau e^(-tau/M) / (1 - e^(-tau/M)), inside the 95% interval of the mean over the failures, and near
  tau / 2 (the snapshot's stall is 0.5 ms).
- A leaf switch over every host takes out each host and its peer: every restore falls back to storage, and the
  work lost per failure is the same closed form at the storage interval.
- A fall-back to storage after an in-memory restore loses the work kept since the storage checkpoint, counting
  what the in-memory restore lost once; too many snapshots are refused as too many checkpoints are.
- A failure restores from memory at the peer-memory load time, from storage at the storage's.
- A failure during a restart from memory that, with the hosts already out, leaves some snapshot without a copy
  falls back to storage; a memory restore keeps the storage tier's clock; an async write that ends during an
  in-memory stall is complete, at a failure or a planned stop; restores count restarts by their cause.
- An in-memory interval not shorter than the storage one (no snapshot would be taken) is refused, by `validate`
  too where both are in one unit; a stall that
  takes a large share of the training between snapshots is warned of.
- A job shrunk (elastic) to fewer hosts stalls for the copies those hosts hold.
- An in-memory interval within a tenth of the storage one (one snapshot between storage checkpoints) is warned of,
  and after the run a state met whose own steps put it at or past the storage one (no snapshot there).
- Without the tier the events have no `tier` column and the summary no `memory_checkpoint` (the bundled jobs'
  outputs are byte-identical to those before the tier existed); bad values are refused in one line.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from shared import LLAMA3_8B_ON_4_HOSTS

from simulator.cli import main
from simulator.config.loader import scenario_from_text
from simulator.units import format_duration

JOB = LLAMA3_8B_ON_4_HOSTS + """run: {horizon: 30 d, replications: 10, seed: 5}
faults:
  components:
    CLASS
checkpoint:
  interval: 12000 steps
  size: 16 GB
  memory: {interval: 2000 steps, replicas: 1, bandwidth: 1 TB/s}
storage: {host_write: 1 TB/s, host_read: 1 TB/s, write: 1 TB/s, read: 1 TB/s}
restart: {detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, spares: 4}
"""
HOST_CRASH = "host_crash: {unit: host, effect: replace, mtbf: 6 h, repair: 1 h}"
LEAF_DOWN = "leaf_down: {unit: leaf_switch, effect: replace, mtbf: 100 h, repair: 10 min}"


def exact_lost(mtbf_s: float, tau_s: float) -> float:
    """E[X mod tau] for X exponential with mean ``mtbf_s``."""
    return mtbf_s - tau_s * math.exp(-tau_s / mtbf_s) / (1.0 - math.exp(-tau_s / mtbf_s))


def failure_rows(job):
    frame = job.events
    return frame[frame["kind"] == "failure"]


def test_host_failures_restore_from_peer_memory_and_lose_half_its_interval(text_job):
    job = text_job(JOB.replace("CLASS", HOST_CRASH))
    summary = job.summary
    tau = 2000 * summary["step_time_s"]
    lost = summary["lost_work_per_failure_s"]
    exact = exact_lost(6 * 3600 / 4, tau)
    assert lost["ci95_low"] <= exact <= lost["ci95_high"]
    assert lost["mean"] == pytest.approx(tau / 2, rel=0.03)
    rows = failure_rows(job)
    rolled = rows[rows["tier"] != ""]
    assert set(rolled["tier"]) == {"memory", "storage"}
    assert (rolled["tier"] == "memory").mean() > 0.8  # storage where its checkpoint is the newer: 1 in 6 or so
    assert summary["memory_checkpoint"]["restores"]["memory"]["mean"] * 10 == completed_memory_restores(job)


def completed_memory_restores(job) -> int:
    """Restarts after a failure (by `cause`, as the summary counts them) completed within the horizon, from memory."""
    frame = job.events
    completed = frame[(frame["kind"] == "restart") & (frame["cause"] == "failure")
                      & (frame["end_s"] < job.summary["horizon_s"])]
    return int((completed["tier"] == "memory").sum())


def test_memory_restores_count_a_planned_stop_a_failure_strikes(text_job):
    """A failure during a maintenance stop's slow write (16 GB at 120 MB/s) makes its restart one after a failure
    (`cause`), though it began as maintenance (`began`): the summary counts its restore from memory."""
    job = text_job(JOB.replace("CLASS", HOST_CRASH + "\n  maintenance: {every: 2 h, duration: 10 min}")
                       .replace("host_write: 1 TB/s", "host_write: 120 MB/s")
                       .replace(" write: 1 TB/s", " write: 120 MB/s"))
    frame = job.events
    assert ((frame["kind"] == "restart") & (frame["cause"] == "failure") & (frame["began"] == "maintenance")).any()
    assert job.summary["memory_checkpoint"]["restores"]["memory"]["mean"] * 10 == completed_memory_restores(job)


def test_a_class_taking_out_every_peer_falls_back_to_storage(text_job):
    job = text_job(JOB.replace("CLASS", LEAF_DOWN))
    summary = job.summary
    rows = failure_rows(job)
    assert (rows["hosts"] == 4).all()
    assert set(rows["tier"]) <= {"storage", ""} and (rows["tier"] == "storage").any()
    assert summary["memory_checkpoint"]["restores"]["memory"]["mean"] == 0
    lost = summary["lost_work_per_failure_s"]
    exact = exact_lost(100 * 3600 / summary["failure_model"]["leaf_down"]["units"], 12000 * summary["step_time_s"])
    assert lost["ci95_low"] <= exact <= lost["ci95_high"]


def test_storage_restores_say_why_they_did_not_read_memory(text_job):
    """A host crash leaves its peer's copy: while training, a failure rolls back to storage only where its
    checkpoint is the newer (at most one in-memory interval of work lost); one finds no copy only during a
    restart, its host's peer already out. A leaf switch over every host takes each host and its peer, so any
    failure with a newer snapshot finds no copy. Each storage row says which, and the summary counts the
    completed restores by it."""
    for klass in (HOST_CRASH, LEAF_DOWN):
        job = text_job(JOB.replace("CLASS", klass))
        tau = 2000 * job.summary["step_time_s"]
        frame = job.events
        rows = failure_rows(job)
        storage = rows[rows["tier"] == "storage"]
        assert set(storage["storage_because"]) == {"newer", "copies_lost"}
        assert (rows[rows["tier"] == "memory"]["storage_because"] == "").all()
        assert (storage[storage["storage_because"] == "newer"]["lost_work_s"] <= tau + 1e-6).all()
        restarts = frame[frame["kind"] == "restart"]
        in_restart = [((restarts["replication"] == row.replication) & (restarts["start_s"] < row.start_s)
                       & (row.start_s < restarts["end_s"])).any()
                      for row in storage[storage["storage_because"] == "copies_lost"].itertuples()]
        assert all(in_restart) == (klass == HOST_CRASH)
        because = job.summary["memory_checkpoint"]["storage_because"]
        restores = job.summary["memory_checkpoint"]["restores"]["storage"]["mean"]
        assert because["newer"]["mean"] + because["copies_lost"]["mean"] == pytest.approx(restores)


def test_a_restart_loads_from_the_tier_it_restores(text_job):
    """Detection 1 min, nothing else but the load: the restart rows' lengths are 60 s plus the tier's load."""
    job = text_job(JOB.replace("CLASS", HOST_CRASH).replace("replications: 10", "replications: 1"))
    frame = job.events
    restarts = frame[(frame["kind"] == "restart") & (frame["began"] == "failure")]
    memory = job.summary["memory_checkpoint"]["load_s"]
    storage = job.summary["checkpoint"]["load_s"]
    assert memory == pytest.approx(16e9 / 32 / 1e12) and storage == pytest.approx(16e9 / 1e12)
    for tier, load in (("memory", memory), ("storage", storage)):
        rows = restarts[(restarts["tier"] == tier) & (restarts["end_s"] < job.summary["horizon_s"])]
        spans = (rows["end_s"] - rows["start_s"]).to_numpy()
        assert len(spans) and spans.min() == pytest.approx(60 + load, abs=1e-6)


def test_no_memory_tier_no_tier_column_nor_summary_figures(text_job):
    text = JOB.replace("CLASS", HOST_CRASH).replace("replications: 10", "replications: 1")
    job = text_job(text.replace("  memory: {interval: 2000 steps, replicas: 1, bandwidth: 1 TB/s}\n", ""))
    assert "tier" not in job.table.column_names
    assert "memory_checkpoint" not in job.summary


@pytest.mark.parametrize(("memory", "message"), [
    ("{interval: 2000 steps, replicas: 0}", "checkpoint.memory.replicas: 0 is below 1"),
    ("{interval: 0 steps}", "checkpoint.memory.interval:"),
    ("{interval: 10 min, bandwidth: 0 GB/s}", "checkpoint.memory.bandwidth:"),
    ("{replicas: 2}", "checkpoint.memory.interval:"),
    ("{interval: 10 min, copies: 2}", "checkpoint.memory.copies:"),
    ("{interval: 2000 steps, replicas: 4}",
     "checkpoint.memory.replicas: 4 copies on other hosts for a job on 4 hosts (allowed: 1 to 3)"),
])
def test_bad_memory_tier_values_are_refused_in_one_line(tmp_path, capsys, memory, message):
    scenario = tmp_path / "job.yaml"
    scenario.write_text(JOB.replace("CLASS", HOST_CRASH).replace(
        "{interval: 2000 steps, replicas: 1, bandwidth: 1 TB/s}", memory))
    assert main(["validate", str(scenario)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: {scenario}:13: {message}")


def test_a_fall_back_to_storage_after_a_memory_restore_loses_the_work_once():
    """1 s steps; storage every 10 steps (0.5 s stall), memory every 3 (0.1 s stall). Snapshots at steps 3 and 6
    (complete at 3.1 s and 6.2 s); a failure at 7.2 s that the peers survive rolls back to step 6, 1 s lost. The
    restart ends at 8 s; one step later a failure takes out the copies: back to step 0, the 7 s kept since then lost,
    the 1 s already lost not again: all 8 s of training lost."""
    from simulator.reliability.checkpoint import SegmentCosts
    from simulator.reliability.events import JobEvents
    from simulator.reliability.training import CheckpointClock

    costs = SegmentCosts(step_s=1.0, equivalent_step_s=1.0, tokens_per_step=1.0, interval_steps=10, mode="sync",
                         stall_s=0.5, write_s=0.5, slowdown=0.0, load_s=0.0, warmup_s=0.0, memory_interval_steps=3,
                         memory_stall_s=0.1, memory_load_s=0.0)
    events = JobEvents(tiered=True)
    clock = CheckpointClock(events)
    clock.advance(0.0, 7.2, costs)
    assert clock.steps == pytest.approx(7.0)
    assert clock.fail(7.2, memory_survives=True) == pytest.approx(1.0)
    assert (clock.steps, clock.restored_from, clock.saved) == (6.0, "memory", False)
    clock.advance(8.0, 9.0, costs)
    assert clock.fail(9.0, memory_survives=False) == pytest.approx(7.0)
    assert (clock.steps, clock.restored_from, clock.saved) == (0.0, "storage", True)
    assert clock.lost_wall == pytest.approx(clock.wall) == pytest.approx(8.0)
    table = events.table().to_pandas()
    assert list(zip(table["kind"], table["tier"], table["step"])) == [("checkpoint", "memory", 3.0),
                                                                      ("checkpoint", "memory", 6.0)]


def test_the_job_report_names_the_tier_and_its_restores(tmp_path, capsys):
    scenario = tmp_path / "job.yaml"
    scenario.write_text(JOB.replace("CLASS", HOST_CRASH).replace("replications: 10", "replications: 1")
                        .replace("30 d", "2 d"))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.strip().startswith("in memory")]
    assert row and "every 2,000 steps" in row[0] and "to 1 peer host" in row[0]
    # Host crashes leave every snapshot a copy: both storage restores are of the newer storage checkpoint, which
    # no failure at full size needs (not "a host and its peers out").
    said = " ".join(out.split())
    assert "2 from storage (2 where it was the newer, 0 where no in-memory copy survived;" in said
    assert "storage as rarely as you like at full size (no failure there needs it)" in said
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())["traceEvents"]
    tiers = {event["args"].get("tier") for event in trace if event.get("cat") == "checkpoint"}
    assert tiers == {"memory", "storage"}


def test_a_job_of_too_many_in_memory_snapshots_is_refused_at_their_interval(tmp_path, capsys):
    """A snapshot every step (276 ms) for 90 days is ~28 million events in one replication: refused before any
    runs, at checkpoint.memory.interval's line, with the snapshots counted."""
    scenario = tmp_path / "job.yaml"
    text = JOB.replace("CLASS", HOST_CRASH).replace("replications: 10", "replications: 1").replace("30 d", "90 d")
    scenario.write_text(text.replace("interval: 2000 steps, replicas", "interval: 1 step, replicas"))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {scenario}:13: checkpoint.memory.interval: the job would handle ~")
    assert "in-memory snapshots" in err and len(err.splitlines()) == 1


def test_a_failure_during_a_restart_from_memory_counts_the_hosts_already_out(text_job):
    """Two hosts, one peer copy each, 30 min detection: a second host failing during a restart from memory
    takes out the only copy of the first one's snapshot, so that restart falls back to storage."""
    text = (JOB.replace("CLASS", HOST_CRASH.replace("6 h", "2 h")).replace("nodes: 4", "nodes: 2")
            .replace("dp: 4", "dp: 2").replace("detection: 1 min", "detection: 30 min")
            .replace("replications: 10", "replications: 2").replace("30 d", "10 d").replace("spares: 4", "spares: 2"))
    frame = text_job(text).events
    seconds = []
    for _, rows in frame.groupby("replication"):
        failures = rows[rows["kind"] == "failure"]
        restarts = rows[rows["kind"] == "restart"]
        for start in failures[failures["tier"] == "memory"]["start_s"]:
            end = restarts[restarts["start_s"] == start]["end_s"].max()
            during = failures[(failures["start_s"] > start) & (failures["start_s"] < end)]
            seconds.extend(zip(during["hosts"], during["tier"]))
    assert seconds and all(tier == "storage" for hosts, tier in seconds if hosts == 1)


def unit_clock(mode: str = "sync", write_s: float = 0.5, memory_stall_s: float = 0.1):
    """1 s steps; storage every 10 steps, memory every 3."""
    from simulator.reliability.checkpoint import SegmentCosts
    from simulator.reliability.events import JobEvents
    from simulator.reliability.training import CheckpointClock

    costs = SegmentCosts(step_s=1.0, equivalent_step_s=1.0, tokens_per_step=1.0, interval_steps=10, mode=mode,
                         stall_s=0.5 if mode == "sync" else 0.1, write_s=write_s, slowdown=0.0, load_s=0.0,
                         warmup_s=0.0, memory_interval_steps=3, memory_stall_s=memory_stall_s, memory_load_s=0.0)
    events = JobEvents(tiered=True)
    return CheckpointClock(events), events, costs


def test_a_memory_restore_keeps_the_storage_tier_clock():
    """Snapshots at steps 3, 6, 9; a failure during the step-9 snapshot goes back to step 6. The storage
    checkpoint still comes at step 10, one interval after the last one (step 0), not 10 steps after the restore."""
    clock, events, costs = unit_clock()
    clock.advance(0.0, 9.25, costs)
    clock.fail(9.25, memory_survives=True)
    assert (clock.steps, clock.restored_from) == (6.0, "memory")
    clock.advance(10.0, 30.0, costs)
    table = events.table().to_pandas()
    storage = table[(table["kind"] == "checkpoint") & (table["tier"] == "storage")]
    assert list(storage["step"])[:2] == [10.0, 20.0]


def test_an_async_write_ending_during_an_in_memory_stall_is_complete():
    """Async: the step-10 write (3.05 s from 13.1 s) ends at 16.15 s, inside the 1 s step-13 snapshot stall
    (16.1 s to 17.1 s). A failure at 16.5 s keeps that checkpoint: the job goes back to step 10, not to the
    older step-9 snapshot."""
    clock, events, costs = unit_clock("async", write_s=3.05, memory_stall_s=1.0)
    clock.advance(0.0, 16.5, costs)
    assert clock.write_end == pytest.approx(16.15)
    clock.fail(16.5, memory_survives=True)
    assert clock.mark.steps == 10.0 and clock.steps == 10.0
    table = events.table().to_pandas()
    assert not ((table["kind"] == "checkpoint_lost") & (table["step"] == 10.0)).any()


def test_a_planned_stop_during_an_in_memory_stall_keeps_an_async_write_ended_in_it():
    """The same write, ended at 16.15 s inside the snapshot stall; a maintenance stop at 16.5 s keeps it: a failure
    at 30 s, while the stop's own checkpoint is written, goes back to step 10 and loses 3 s."""
    clock, events, costs = unit_clock("async", write_s=3.05, memory_stall_s=1.0)
    clock.advance(0.0, 16.5, costs)
    clock.stop_cleanly(16.5, 40.0, costs)
    assert clock.mark.steps == 10.0
    assert clock.fail(30.0) == pytest.approx(3.0) and clock.steps == 10.0
    table = events.table().to_pandas()
    assert ((table["kind"] == "checkpoint") & (table["step"] == 10.0) & (table["tier"] == "storage")).sum() == 1


def test_an_in_memory_interval_not_shorter_than_the_storage_one_is_refused(tmp_path, capsys):
    scenario = tmp_path / "job.yaml"
    scenario.write_text(JOB.replace("CLASS", HOST_CRASH).replace("interval: 2000 steps, replicas", "interval: 12000 "
                                                                 "steps, replicas"))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: {scenario}:13: checkpoint.memory.interval: 12,000 steps is not shorter than "
                          "checkpoint.interval (12,000 steps)")
    assert err.endswith("(allowed: fewer than 12,000 steps)")


@pytest.mark.parametrize(("storage", "memory", "message"), [
    ("12000 steps", "20000 steps", "20,000 steps is not shorter than checkpoint.interval (12,000 steps)"),
    ("30 min", "45 min", "45 min is not shorter than checkpoint.interval (30 min)"),
    # A study's grid point: the refusal read '(113.1617 s)', now rounded as every other duration.
    ("113.1617 s", "5 min", "5 min is not shorter than checkpoint.interval (1.886 min)"),
    ("30 min", "1800.6 s", "30.01 min is not shorter than checkpoint.interval (30 min)"),
    ("1800.06 s", "1800.07 s", "30.0012 min is not shorter than checkpoint.interval (30.001 min)"),
])
def test_validate_refuses_an_in_memory_interval_not_shorter_in_the_same_unit(tmp_path, capsys, storage, memory,
                                                                             message):
    """Two intervals in one unit compare without the step time: `trainsim validate` refuses them as `run` does."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(JOB.replace("CLASS", HOST_CRASH).replace("interval: 12000 steps", f"interval: {storage}")
                        .replace("interval: 2000 steps", f"interval: {memory}"))
    assert main(["validate", str(scenario)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: {scenario}:13: checkpoint.memory.interval: {message}")


def test_a_snapshot_stall_large_against_its_interval_is_warned_of(tmp_path, capsys):
    """16 GB over 32 GPUs to 1 peer at 1 GB/s: 0.5 s each 2,000 steps (552 s) is under the share; at 1 MB/s,
    500 s is 91% of it."""
    scenario = tmp_path / "job.yaml"
    text = JOB.replace("CLASS", HOST_CRASH).replace("replications: 10", "replications: 1").replace("30 d", "1 d")
    for bandwidth, warned in (("1 GB/s", False), ("1 MB/s", True)):
        scenario.write_text(text.replace("bandwidth: 1 TB/s}", f"bandwidth: {bandwidth}}}"))
        assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 0
        captured = capsys.readouterr()
        assert ("each in-memory snapshot stalls training" in captured.out + captured.err) is warned


SHRINKING = """
cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1,
          leaf_ports: 2, spines: 2, oversubscription: 2}
model: {layers: 2, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {dp: 4}
checkpoint: {interval: 4000 steps, size: 12 GB, memory: {interval: 1000 steps, replicas: 3, bandwidth: 10 GB/s}}
storage: {capacity: 1 PB}
run: {horizon: 2 d, replications: 1, seed: 5}
restart: {elastic: true}
faults: {components: {host_crash: {unit: host, effect: replace, mtbf: 4 d, repair: 20 h}}}
"""


def test_a_shrunk_job_stalls_for_the_copies_its_own_hosts_hold(text_job):
    """One GPU a host, no spares: each host failure shrinks the job (4, 3, 2, then 1 host). Each snapshot's stall
    is 12 GB / g x min(3 replicas, g - 1 peers) / 10 GB/s on the g hosts it runs on: 0.9, 0.8, 0.6 s and none
    on one host (the copies of the full size, 3, were charged on every size: 1.2, 1.8 and 3.6 s)."""
    job = text_job(SHRINKING)
    assert {state["replicas"] for state in job.summary["states"]} == {1, 2, 3, 4}
    frame = job.events
    snapshots = frame[(frame["kind"] == "checkpoint") & (frame["tier"] == "memory")]
    stalls = sorted({round(stall, 9) for stall in snapshots["end_s"] - snapshots["start_s"]})
    assert stalls == [round(12e9 / g * min(3, g - 1) / 10e9, 9) for g in (1, 2, 3, 4)]


@pytest.mark.parametrize("memory, warned", [("11000 steps", True), ("10700 steps", False), ("2000 steps", False)])
def test_an_in_memory_interval_near_the_storage_one_is_warned_of(tmp_path, capsys, memory, warned):
    """Storage every 12,000 steps: snapshots every 11,000 (92%) warn that one falls between two storage
    checkpoints; 10,700 (89%) and 2,000 do not."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(JOB.replace("CLASS", HOST_CRASH).replace("replications: 10", "replications: 1")
                        .replace("30 d", "1 d").replace("interval: 2000 steps", f"interval: {memory}"))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert ("are 92% of the storage interval (12,000 steps; from 90% warns)" in " ".join(captured.err.split())) \
        is warned


def test_a_state_whose_in_memory_interval_reaches_the_storage_one_is_warned_of(tmp_path, capsys):
    """Snapshots every 50 s (916 healthy steps of 54.6 ms) beside storage every 4,000 steps: shrunk to one
    one-GPU host the step is 5.08 ms, 50 s is 9,841 steps, and no snapshot is taken there (each storage checkpoint
    restarts their count); the job says so after the run, at checkpoint.memory's line. On 2 hosts (24.2 ms)
    50 s is 2,064 steps, under 4,000."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(SHRINKING.replace("memory: {interval: 1000 steps", "memory: {interval: 50 s"))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err == (f"warning: {scenario}:7: checkpoint.memory.interval: in 1 cluster state the job met, the "
                   "in-memory interval is not shorter than the storage one in that state's steps (1 replica: "
                   "9,841 steps against 4,000): each storage checkpoint restarts the snapshots' count, so the tier "
                   "took no snapshot there (allowed: both intervals in one unit (durations, or steps), shorter by "
                   "more than a step)\n")
    summary = json.loads((tmp_path / "out" / "job_summary.json").read_text())
    assert [state["replicas"] for state in summary["states"]] == [1, 2, 3, 4]
    one_host, two_hosts = (state["step_time_s"] for state in summary["states"][:2])
    assert round(50 / one_host) == 9_841 and round(50 / two_hosts) == 2_064
    events = pd.read_parquet(tmp_path / "out" / "job_events.parquet")
    snapshots = events[(events["kind"] == "checkpoint") & (events["tier"] == "memory")]
    assert not (snapshots["end_s"] == snapshots["start_s"]).any()  # on one host a snapshot would stall nothing


STUDY_JOB = (JOB.replace("CLASS", HOST_CRASH)
             .replace("horizon: 30 d, replications: 10", "horizon: 1 d, replications: 2")
             .replace("interval: 2000 steps, replicas", "interval: 30 steps, replicas"))
"""Daly's interval 13.13 s (C = 16 ms, M = 1.5 h) in steps of 276.1 ms: the default grid's 12, 17 and 24 steps are
not longer than the in-memory tier's 30."""


@pytest.fixture(scope="module")
def healthy_study_step_s() -> float:
    """STUDY_JOB's healthy step time (s), as its job simulates it."""
    from simulator.reliability.simulate import prepare_job

    return prepare_job(scenario_from_text(STUDY_JOB)).healthy.step_s


def test_a_study_s_default_grid_leaves_out_intervals_not_longer_than_the_memory_tier(tmp_path, capsys):
    """The default grid of a job with an in-memory tier held intervals below it, and the study then refused its
    own point, blaming the tier ('5 min is not shorter than checkpoint.interval (113.1617 s)'): those are left
    out, and the grid's line says how many."""
    from simulator.reliability.study import DEFAULT_GRID_FACTORS, default_grid

    grid = default_grid(scenario_from_text(STUDY_JOB))
    nearest = [round(grid.centre_s * factor / grid.step_s) for factor in DEFAULT_GRID_FACTORS]
    assert nearest[:3] == [12, 17, 24] and min(nearest[3:]) > 30
    assert (grid.steps, grid.memory_steps, grid.under_memory) == (tuple(nearest[3:]), 30, 3)
    scenario = tmp_path / "job.yaml"
    scenario.write_text(STUDY_JOB)
    assert main(["study", "checkpoint-interval", str(scenario), "--out", str(tmp_path / "study"), "--quiet"]) == 0
    assert "(3 not longer than the in-memory interval (30 steps) left out)" in capsys.readouterr().out
    points = json.loads((tmp_path / "study" / "study.json").read_text())["curves"][0]["points"]
    assert [point["interval_steps"] for point in points] == nearest[3:]


@pytest.mark.parametrize("arguments, message, in_steps", [
    (["--intervals", "5s,10s,30s"], "5 s = 18 steps of 275.9 ms is not longer than checkpoint.memory.interval "
     "(30 steps): each storage checkpoint restarts the snapshots' count, so none would be taken (allowed: intervals "
     "longer than 30 steps)", {5.0: 18}),
    (["--set", "checkpoint.memory.interval=10 s", "--intervals", "20 s,10 steps"],
     "10 steps is not longer than checkpoint.memory.interval (10 s = 36 steps of 275.9 ms): each storage checkpoint "
     "restarts the snapshots' count, so none would be taken (allowed: intervals longer than 10 s)", {10.0: 36}),
    (["--set", "checkpoint.memory.interval=1 min"], "Daly's interval (13.13 s) x 4 is not longer than "
     "checkpoint.memory.interval (1 min), so every default point would be refused (allowed: intervals longer than "
     "1 min)", {}),
])
def test_a_study_point_not_longer_than_the_memory_tier_is_refused_at_intervals(tmp_path, capsys, arguments, message,
                                                                               in_steps, healthy_study_step_s):
    """An --intervals point at or below the in-memory interval is refused at --intervals, naming the point (in steps
    where the two are in different units: a duration's nearest whole steps of the healthy step), as a point given
    twice is, not blamed on the tier's --set."""
    assert f"of {format_duration(healthy_study_step_s)}" in message or not in_steps
    for seconds, steps in in_steps.items():
        assert round(seconds / healthy_study_step_s) == steps
    scenario = tmp_path / "job.yaml"
    scenario.write_text(STUDY_JOB)
    out = tmp_path / "study"
    assert main(["study", "checkpoint-interval", str(scenario), "--out", str(out), "--quiet", *arguments]) == 2
    assert capsys.readouterr().err == f"error: command line: trainsim study: --intervals: {message}\n"
    assert not out.exists()
