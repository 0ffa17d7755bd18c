"""Job timelines with failures placed by hand (the seeded draw replaced), checked against what must happen at
those times: a degradation repaired while the job was restarting is over when the next one comes, and the
maintenance windows that fell inside one long restart are taken once, right after it, a restart keeps
every host in use whatever the hosts per replica, a regrow or maintenance stop right after a restart writes no
checkpoint, and a spare standing in that fails during a restart's warm-up starts it over."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from shared import ONE_GPU_HOSTS, RAILS, STEP_ONLY, WAIT_JOB, ZERO3_JOB, H

from simulator import simulate
from simulator.cli import main
from simulator.config.loader import scenario_from_text
from simulator.console.report import long_duration
from simulator.reliability import ahead
from simulator.reliability import simulate as reliability_simulate
from simulator.reliability.checkpoint import SegmentCosts
from simulator.reliability.events import JobEvents
from simulator.reliability.processes import Arrivals
from simulator.reliability.states import StateCache
from simulator.reliability.training import CheckpointClock

JOB = ONE_GPU_HOSTS + """run: {horizon: 30 h}
faults:
  components:
    gpu: {mtbf: 1000 d}
    spine_switch: {mtbf: 1000 d, repair: 1 h}
  maintenance: {every: 3 h}
restart: {detection: 0 s, reschedule: 0 s, launch: 0 s, warmup_steps: 0}
"""
GPU, SPINE = 0, 1
"""Class indices, in the order of `faults.components`."""


@pytest.fixture
def job_with(job_with):
    """conftest's `job_with`, on JOB unless ``text`` is given."""
    return lambda *rows, text=JOB: job_with(text, *rows)


@pytest.mark.parametrize(("nodes", "layout"), [(2, "tp: 4, dp: 4"), (3, "tp: 4, pp: 3, dp: 2")],
                         ids=["two-replicas-per-host", "a-replica-on-1.5-hosts"])
def test_every_host_stays_in_use_after_a_restart_whatever_the_hosts_per_replica(job_with, nodes, layout):
    """A software failure on a GPU of the last host at 1 h, 5 h and 9 h interrupts the job three times when a host holds
    two replicas (TP 4 on 8-GPU hosts) or a replica spans 1.5 hosts (TP 4 x PP 3): a restart keeps every host in use,
    not replicas x (hosts // replicas), 0 or 2 hosts, which would take every later failure of the last host for one
    of a host the job does not use (one interruption). Each restart row's step is the checkpoint's the job resumes
    from, as its failure row's."""
    text = f"""
cluster: {{topology: dgx-h100-cluster, nodes: {nodes}, leaf_ports: 2, spines: 2}}
model: {{layers: 6, hidden: 2048, heads: 16, vocab: 32000}}
training: {{seq_len: 1024, microbatches: 3}}
parallelism: {{{layout}}}
checkpoint: {{interval: 30 min}}
storage: {{capacity: 1 PB}}
run: {{horizon: 12 h}}
faults: {{components: {{software: {{mtbf: 1000 h}}}}}}
restart: {{detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0}}
"""
    last_gpu = 8 * nodes - 1
    job = job_with((1 * H, 0, last_gpu, 0.0), (5 * H, 0, last_gpu, 0.0), (9 * H, 0, last_gpu, 0.0), text=text)
    assert job.summary["interruptions"]["unexpected"]["mean"] == 3
    assert (job.events["kind"] == "restart").sum() == 3
    events = job.events
    checkpoints = events[events["kind"] == "checkpoint"]
    failures, restarts = events[events["kind"] == "failure"], events[events["kind"] == "restart"]
    for failure, restart in zip(failures.itertuples(), restarts.itertuples()):
        resumed = checkpoints[checkpoints["end_s"] <= failure.start_s]["step"].max()
        assert restart.step == failure.step == resumed > 0


def test_a_spine_repaired_during_a_restart_does_not_block_the_next_one(job_with):
    """A GPU fails at 1 h and its host is back at 11 h (no spare): the job restarts until then. Spine 0 fails
    at 2 h and is repaired at 3 h, inside the restart; spine 1 fails at 5 h until 25 h. Only one spine is
    ever down, so the job trains with one spine down from its restart until 25 h: slow-step time = that
    training time x (1 - healthy step / one-spine-down step). Before the fix spine 0 stayed down until the
    restart ended, spine 1 made 'every spine down' and was dropped, and the job met no slow step."""
    job = job_with((1 * H, GPU, 0, 10 * H), (2 * H, SPINE, 0, 1 * H), (5 * H, SPINE, 1, 20 * H))
    summary, events = job.summary, job.events
    assert [state["spines_down"] for state in summary["states"]] == [0, 1]
    healthy, degraded = (state["step_time_s"] for state in summary["states"])
    spines = events[events["kind"] == "degraded"]
    assert spines[["start_s", "end_s"]].to_numpy().tolist() == [[2 * H, 3 * H], [5 * H, 25 * H]]
    restarts = events[events["kind"] == "restart"]
    resumed = float(restarts["end_s"][restarts["cause"] == "failure"].max())
    stopped = restarts[(restarts["cause"] == "maintenance") & (restarts["end_s"] < 25 * H)]
    training = 25 * H - resumed - float((stopped["end_s"] - stopped["start_s"]).sum())
    # each stop cuts the step in flight (no checkpoint in 1000 d: the segment since the last restart is steps)
    ends = restarts["end_s"].to_numpy()
    cuts = sum((start - ends[index - 1]) % degraded for index, (start, end, cause) in
               enumerate(restarts[["start_s", "end_s", "cause"]].itertuples(index=False))
               if cause == "maintenance" and end < 25 * H and start >= resumed)
    assert 0 < cuts < len(stopped) * degraded
    expected = (training - cuts) * (1 - healthy / degraded)
    assert summary["time_s"]["slow_steps_s"]["mean"] == pytest.approx(expected, rel=1e-9)
    assert summary["slow_steps_by_cause_s"]["spine_switch"]["mean"] == pytest.approx(expected, rel=1e-9)


def test_windows_inside_one_restart_are_taken_once_after_it(job_with):
    """Maintenance every 3 h (windows at 1.5, 4.5, ..., 28.5 h); a GPU fails at 1 h and the job waits for
    its host until 11 h. The windows at 1.5, 4.5, 7.5 and 10.5 h fall inside that restart and are taken as
    one right after it, then 13.5 ... 28.5 h: 7 planned stops (it took four in a row at 11 h, 10 in all)."""
    job = job_with((1 * H, GPU, 0, 10 * H))
    assert job.summary["interruptions"]["planned"]["mean"] == 7
    events = job.events
    stops = events[(events["kind"] == "restart") & (events["cause"] == "maintenance")]["start_s"].to_numpy()
    assert stops[0] == pytest.approx(11 * H, abs=1.0)
    assert stops[1:] == pytest.approx([13.5 * H, 16.5 * H, 19.5 * H, 22.5 * H, 25.5 * H, 28.5 * H], abs=1e-6)


SPINE_JOB = ONE_GPU_HOSTS.replace("checkpoint: {interval: 1000 d}", "checkpoint: {interval: 30 min, size: 1 GB}") + """\
run: {horizon: 3 h}
faults:
  components:
    spine_switch: {mtbf: 1000 d, repair: 1 h}
restart: {detection: 0 s, reschedule: 0 s, launch: 0 s, warmup_steps: 0}
"""


def test_a_checkpoint_overdue_in_a_slower_state_comes_at_the_end_of_the_step_in_flight(job_with):
    """A checkpoint every 30 min is 31,100 healthy steps (57.9 ms) but 16,214 steps with a spine down (111 ms).
    Spine 0 fails at 1,440 s, 24,879.7 healthy steps in: the checkpoint is overdue and is triggered at the end of
    the step in flight, its last 0.3 step at the slower step (1,440.032 s, step 24,880), then every 16,214 slower
    steps; every checkpoint holds whole steps. Much earlier, the steps left to the trigger came out negative: the
    clock went back in time, logged a checkpoint there and trained that time again."""
    job = job_with((0.4 * H, 0, 0, 1 * H), text=SPINE_JOB)
    healthy, degraded = (state["step_time_s"] for state in job.summary["states"])
    checkpoints = job.events[job.events["kind"] == "checkpoint"]
    first = checkpoints.iloc[0]
    done = 0.4 * H / healthy
    assert first.step == math.ceil(done)
    assert first.start_s == pytest.approx(0.4 * H + (math.ceil(done) - done) * degraded, abs=1e-9)
    interval = round(1800 / degraded)
    assert checkpoints["step"].iloc[1] == first.step + interval
    assert (checkpoints["step"] == checkpoints["step"].round()).all()
    assert checkpoints["start_s"].is_monotonic_increasing and checkpoints["step"].is_monotonic_increasing


STOP_JOB = ONE_GPU_HOSTS.replace("checkpoint: {interval: 1000 d}", "checkpoint: {interval: 1 h, size: 60 GB}").replace(
    "storage: {capacity: 1 PB}", "storage: {capacity: 1 PB, host_write: 0.25 GB/s}") + """\
run: {horizon: 12 h}
faults:
  components:
    software: {mtbf: 1000 d}
  maintenance: {every: 6 h, duration: 10 min}
restart: {detection: 1 min, reschedule: 2 min, launch: 3 min, warmup_steps: 0}
"""


@pytest.mark.parametrize("after_s", [30.0, 300.0], ids=["during-the-write", "during-the-maintenance"])
def test_a_failure_during_a_maintenance_stop_does_not_shorten_it(job_with, after_s):
    """Maintenance at 3 h and 9 h (every 6 h, the first after half a period): the job writes a 60 s checkpoint (60 GB at
    4 hosts x 0.25 GB/s) and stops for 10 min. A software failure 30 s or 5 min into the stop at 3 h leaves the stop
    its 11 min: the failure's 1 min detection overlaps the rest, and the job is back when it would have been without
    the failure. 30 s into the write the stop's checkpoint is lost, not counted: the job resumes from the one before
    (sync, every hour of training T: written at 2 T + 2 min) and loses the training since its trigger, 3 h - 2 x 60 s
    - 2 T."""
    quiet = job_with((13 * H, 0, 0, 0.0), text=STOP_JOB)
    struck = job_with((3 * H + after_s, 0, 0, 0.0), text=STOP_JOB)
    back = quiet.events[quiet.events["kind"] == "restart"]["end_s"].to_numpy()
    assert len(back) == 2
    assert struck.events[struck.events["kind"] == "restart"]["end_s"].to_numpy() == pytest.approx(back, abs=1e-6)
    parts, before = struck.summary["time_s"], quiet.summary["time_s"]
    for part in ("maintenance_s", "restart_s", "checkpoint_stall_s"):
        assert parts[part]["mean"] == pytest.approx(before[part]["mean"], abs=1e-6), part
    interval, step = quiet.summary["checkpoint"]["interval_s"], quiet.summary["step_time_s"]
    cycle = interval + 60.0  # k steps and the 60 s write
    cut_3 = ((3 * H) % cycle) % step  # the step in flight at each stop is cut: a checkpoint holds whole steps
    cut_9 = ((9 * H - back[0]) % cycle) % step
    assert before["lost_work_s"]["mean"] == pytest.approx(cut_3 + cut_9, abs=1e-6)
    lost = 3 * H - 2 * 60.0 - 2 * interval - cut_3 if after_s < 60 else 0.0
    assert parts["lost_work_s"]["mean"] == pytest.approx(before["lost_work_s"]["mean"] + lost, abs=1e-6)
    assert parts["productive_s"]["mean"] == pytest.approx(before["productive_s"]["mean"] - lost, abs=1e-6)
    assert ((struck.events["kind"] == "checkpoint_lost").sum() == 1) == (after_s < 60)


def test_the_restart_rows_count_every_planned_stop_and_span_the_restart_and_maintenance_time(job_with):
    """Maintenance at 3 h and 9 h (STOP_JOB) over a 9 h 5 min horizon: a software failure 5 min into the stop at 3 h
    makes its row a `failure` restart, and the horizon cuts the stop at 9 h. Both rows began with maintenance:
    counting `began == maintenance` gives `interruptions.planned`, 2, and the restart rows' spans add up to
    restart_s + maintenance_s."""
    job = job_with((3 * H + 300, 0, 0, 0.0), text=STOP_JOB.replace("horizon: 12 h", "horizon: 545 min"))
    summary, events = job.summary, job.events
    restarts = events[events["kind"] == "restart"]
    assert restarts[["cause", "began"]].to_numpy().tolist() == [["failure", "maintenance"],
                                                               ["maintenance", "maintenance"]]
    assert (restarts["began"] == "maintenance").sum() == summary["interruptions"]["planned"]["mean"] == 2
    assert restarts["end_s"].iloc[-1] == 545 * 60
    parts = summary["time_s"]
    spans = float((restarts["end_s"] - restarts["start_s"]).sum())
    assert spans == pytest.approx(parts["restart_s"]["mean"] + parts["maintenance_s"]["mean"], rel=1e-12)
    assert set(events["began"][events["kind"] != "restart"]) == {""}


def test_a_maintenance_stop_right_after_a_restart_writes_no_checkpoint(job_with):
    """A software failure at 2 h 55 min: its restart (1 min detection, 2 min rescheduling, 3 min launch, the read L)
    ends at E = 3 h 1 min + L, so the window due at 3 h is taken right after it. Nothing is trained since the
    checkpoint just loaded, so the stop writes none: 10 min of maintenance, then 2 + 3 min + L, and the stop's
    maintenance time is 10 min. The window at 9 h, after 6 h of training, still writes one: 60 s more maintenance,
    21 min in all."""
    job = job_with((2 * H + 55 * 60, 0, 0, 0.0), text=STOP_JOB)
    summary, events = job.summary, job.events
    load = summary["checkpoint"]["load_s"]
    end = 3 * H + 60 + load
    restarts = events[events["kind"] == "restart"][["cause", "start_s", "end_s"]].to_numpy().tolist()
    back = end + 600 + 120 + 180 + load
    assert restarts[:2] == [["failure", 2 * H + 55 * 60, pytest.approx(end, rel=1e-12)],
                            ["maintenance", pytest.approx(end, rel=1e-12), pytest.approx(back, rel=1e-12)]]
    written = events[events["kind"] == "checkpoint"]["start_s"].to_numpy()
    assert not ((written > 2 * H + 55 * 60) & (written < back)).any()
    assert summary["time_s"]["maintenance_s"]["mean"] == pytest.approx(600 + 660, rel=1e-12)


ELASTIC_JOB = ONE_GPU_HOSTS.replace("checkpoint: {interval: 1000 d}", "checkpoint: {interval: 10 min}") + """\
run: {horizon: 5 h}
faults:
  components:
    gpu: {mtbf: 1000 d, repair: 1 d}
restart: {detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true}
"""


def test_a_shrunk_job_faster_per_token_has_no_negative_slow_steps(job_with):
    """On these one-GPU hosts data parallelism costs more than it brings: 4 replicas take 64 ms for 4,096 tokens, 2
    replicas 24 ms for 2,048. Two hosts fail at 1 h (repaired in 100 h), and the elastic job runs on 2 replicas from
    its restart to the horizon: every step trains more tokens per second than a healthy one. That time is
    productive, not negative slow-step time: slow-step time 0 and ETTR the renewal's below (0.963), with goodput
    1.223 x the healthy throughput."""
    job = job_with((1 * H, GPU, 0, 100 * H), (1 * H, GPU, 1, 100 * H), text=ELASTIC_JOB)
    summary = job.summary
    steps = {state["replicas"]: state["step_time_s"] for state in summary["states"]}
    # each state's step is the plain step of its layout, simulated on its own
    assert steps[4] == simulate(scenario_from_text(ONE_GPU_HOSTS)).summary["step_time_s"]
    assert steps[2] == simulate(scenario_from_text(ONE_GPU_HOSTS, "inline.yaml", ["cluster.nodes=2",
                                                                                  "parallelism.dp=2"])).summary[
        "step_time_s"]
    assert steps[2] / 2048 < steps[4] / 4096
    parts = {part: value["mean"] for part, value in summary["time_s"].items()}
    assert parts["slow_steps_s"] == 0.0 and summary["slow_steps_by_cause_s"] == {}
    # The renewal by hand. Every host writes (and reads back) its shard at 25 GB/s (storage defaults), so with h
    # hosts a sync checkpoint stalls size / (h x 25 GB/s); it comes every round(10 min / step) steps. The first
    # n checkpoints of 4 replicas are written by 1 h; the work since the last is lost. The restart is the 1 min
    # detection plus the read on the 2 hosts left; then 2 replicas train to the horizon, stalling for each
    # whole checkpoint cycle (none is under way at 5 h: the last cycle is 538 s of its 600 s steps).
    horizon, failure, size = 5 * H, 1 * H, summary["checkpoint"]["size_bytes"]
    interval = {r: round(600.0 / steps[r]) * steps[r] for r in (2, 4)}
    write = {r: size / (r * 25e9) for r in (2, 4)}
    written = math.floor(failure / (interval[4] + write[4]))  # 5
    lost = failure - written * (interval[4] + write[4])  # 599.7 s
    restart = 60.0 + size / (2 * 25e9)
    shrunk_writes = math.floor((horizon - failure - restart) / (interval[2] + write[2]))  # 23
    assert (written, shrunk_writes) == (5, 23)
    stalls = written * write[4] + shrunk_writes * write[2]
    for part, expected in (("lost_work_s", lost), ("restart_s", restart), ("checkpoint_stall_s", stalls)):
        assert parts[part] == pytest.approx(expected, rel=1e-9), part
    productive = horizon - lost - restart - stalls
    assert summary["ettr"]["mean"] == pytest.approx(productive / horizon, rel=1e-9)
    # the tokens: the 4 replicas' checkpointed steps, then the shrunk job's steps of 2,048 to the horizon
    tokens = written * interval[4] / steps[4] * 4096 + (productive - written * interval[4]) / steps[2] * 2048
    assert summary["goodput_tokens_per_s"]["mean"] == pytest.approx(tokens / horizon, rel=1e-9)
    assert summary["ideal_tokens_per_s"] == pytest.approx(4096 / steps[4], rel=1e-12)


MIN_JOB = ONE_GPU_HOSTS.replace("checkpoint: {interval: 1000 d}", "checkpoint: {interval: 10 min}") + """\
run: {horizon: 20 h}
faults:
  components:
    gpu: {mtbf: 1000 d, repair: 10 h}
    software: {mtbf: 1000 d}
restart: {detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true, min_replicas: 3}
"""
SOFTWARE = 1


def test_an_elastic_job_waits_for_repair_below_its_minimum_and_regrows_at_the_next_restart(job_with):
    """DP 4 on one-GPU hosts, no spares, `min_replicas: 3`. GPU 0 fails at 1 h (back at 11 h): the job restarts
    on 3 replicas. GPU 1 fails at 2 h (back at 12 h): 2 hosts are left, below the minimum, so the restart waits
    until 11 h and relaunches on 3 (without the minimum it ran on 2 from 2 h). A software failure at 14 h finds
    4 hosts (the one back at 12 h is a spare): the job grows back to 4. One shrink, one regrow; running time on 3
    replicas = (2 h - first relaunch) + (14 h - second), on 4 the rest of the horizon less the restarts."""
    job = job_with((1 * H, GPU, 0, 10 * H), (2 * H, GPU, 1, 10 * H), (14 * H, SOFTWARE, 0, 0.0), text=MIN_JOB)
    summary, events = job.summary, job.events
    restarts = events[events["kind"] == "restart"][["start_s", "end_s"]].to_numpy()
    assert restarts[:, 0].tolist() == [1 * H, 2 * H, 14 * H]
    load = restarts[1, 1] - 11 * H
    assert 0 < load < 1 and restarts[0, 1] == pytest.approx(1 * H + 60 + load, abs=1e-9)
    assert {state["replicas"] for state in summary["states"]} == {3, 4}
    replicas = summary["replicas"]
    assert replicas["sizes"] == [3, 4]
    assert (replicas["shrinks"]["mean"], replicas["regrows"]["mean"]) == (1, 1)
    running = {int(size): value["mean"] for size, value in replicas["running_s"].items()}
    assert running[3] == pytest.approx(2 * H - restarts[0, 1] + 14 * H - restarts[1, 1], abs=1e-6)
    assert running[4] == pytest.approx(1 * H + 20 * H - restarts[2, 1], abs=1e-6)
    assert sum(running.values()) + summary["time_s"]["restart_s"]["mean"] == pytest.approx(20 * H, abs=1e-6)
    # only the second restart waits: from its detection's end to the first host back
    assert summary["restart_waiting_for_hosts_s"]["mean"] == pytest.approx(11 * H - (2 * H + 60), abs=1e-9)
    assert job.warnings[0].endswith("more spares or a lower restart.min_replicas cut it (the elastic job waits below "
                                    "its smallest size, its restart.min_replicas, 3 replicas)")


@pytest.mark.parametrize(("min_replicas", "knobs"), [
    (3, "more spares or a lower restart.min_replicas cut it (the elastic job waits below its smallest size, its "
        "restart.min_replicas, 3 replicas)"),
    (2, "more spares cut it (the elastic job waits below its smallest size, 3 replicas)"),
    (None, "more spares cut it (the elastic job waits below its smallest size, 3 replicas)")])
def test_an_elastic_jobs_waiting_warning_names_min_replicas_only_where_it_sets_the_smallest_size(min_replicas,
                                                                                                 knobs):
    """An elastic job whose smallest size is 3 replicas waited 2 h per replication of a 20 h horizon (10%), half
    of its 4 h of restarts. A lower `restart.min_replicas` lowers that size only where it is the minimum; with
    `min_replicas: 2` (or none), 3 is the smallest for memory or EP, which the minimum cannot lower."""
    from simulator.reliability.summary import waiting_warning

    summary = {"restart_waiting_for_hosts_s": {"mean": 2 * H}, "horizon_s": 20 * H,
               "time_s": {"restart_s": {"mean": 4 * H}}, "replicas": {"sizes": [3, 4]}, "elastic": True,
               "spare_hosts": 0}
    assert waiting_warning(summary, min_replicas) == (
        "restarts waited 2 h per replication for spare or repaired hosts, 10.0% of the horizon (50% of the restart "
        f"time; over 5% warns): the spare pool is too small (restart.spares: 0); {knobs}")


GROW_JOB = RAILS.replace("checkpoint: {interval: 30 min}", "checkpoint: {interval: 1000 d}") + """\
run: {horizon: 8 h}
faults:
  components:
    gpu: {mtbf: 1000 d, repair: 2 h}
  maintenance: {every: 10 h}
restart: {detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true}
"""


def test_goodput_and_ettr_count_a_shrunk_job_by_its_throughput(job_with):
    """TP 8 x DP 4 on four DGX H100, no checkpoint but the maintenance stop's at 5 h. GPU 0 fails at 1 h (its
    host back at 3 h): the hour at 4 replicas is lost, the job runs on 3 from its restart t1 to 5 h, and the
    maintenance stop's restart, ending at t2, finds the repaired host: 4 replicas to the 8 h horizon. By hand,
    with r = tokens per second of each state: goodput x horizon = (5 h - t1) r3 + (8 h - t2) r4, and ETTR x
    horizon = (5 h - t1) r3 / r4 + (8 h - t2) (3 replicas train 3/4 of the tokens in a shorter step, their
    data-parallel reduction over fewer hosts: r3 / r4 = 0.84, each r that of `simulate()` of the layout)."""
    job = job_with((1 * H, GPU, 0, 2 * H), text=GROW_JOB)
    summary, events = job.summary, job.events
    (t0, t1), (t4, t2) = events[events["kind"] == "restart"][["start_s", "end_s"]].to_numpy().tolist()
    assert (t0, t4) == (1 * H, 5 * H)
    rate = {state["replicas"]: state["tokens_per_step"] / state["step_time_s"] for state in summary["states"]}
    for replicas in (3, 4):  # each state's throughput is the plain step's of its layout, simulated on its own
        alone = simulate(scenario_from_text(RAILS, "inline.yaml", [f"cluster.nodes={replicas}",
                                                                    f"parallelism.dp={replicas}"])).summary
        assert rate[replicas] == pytest.approx(alone["tokens_per_s"], rel=1e-12)
    step_3 = next(state["step_time_s"] for state in summary["states"] if state["replicas"] == 3)
    cut = (5 * H - t1) % step_3  # the maintenance stop cuts the step in flight: a checkpoint holds whole steps
    at_3, at_4 = 5 * H - t1 - cut, 8 * H - t2
    assert summary["goodput_tokens_per_s"]["mean"] * 8 * H == pytest.approx(at_3 * rate[3] + at_4 * rate[4],
                                                                             rel=1e-9)
    assert summary["ettr"]["mean"] * 8 * H == pytest.approx(at_3 * rate[3] / rate[4] + at_4, rel=1e-9)
    assert summary["time_s"]["lost_work_s"]["mean"] == pytest.approx(1 * H + cut, abs=1e-6)
    assert summary["slow_steps_by_cause_s"]["elastic_shrink"]["mean"] == pytest.approx(
        at_3 * (1 - rate[3] / rate[4]), rel=1e-9)
    replicas = summary["replicas"]
    assert (replicas["shrinks"]["mean"], replicas["regrows"]["mean"]) == (1, 1)
    assert {size: value["mean"] for size, value in replicas["running_s"].items()} == pytest.approx(
        {"4": 1 * H + at_4, "3": at_3 + cut}, abs=1e-6)


def test_losing_the_last_spine_stops_the_job_until_a_repair(job_with):
    """One-GPU hosts under two leaves joined by two spines. Spine 0 fails at 1 h (back at 2 h), spine 1 at 1.5 h
    (back at 4.5 h): with both down no GPU of one leaf reaches the other's, so the job is interrupted at 1.5 h (a
    spine_switch interruption, no host taken) and its restart waits for spine 0 at 2 h (the 1 min detection overlaps
    the wait); then it trains with one spine down until 4.5 h."""
    job = job_with((1 * H, 0, 0, 1 * H), (1.5 * H, 0, 1, 3 * H), text=SPINE_JOB.replace("3 h", "6 h"))
    summary, events = job.summary, job.events
    failures = events[events["kind"] == "failure"]
    assert failures[["cause", "start_s", "hosts"]].to_numpy().tolist() == [["spine_switch", 1.5 * H, 0]]
    restart = events[events["kind"] == "restart"][["start_s", "end_s"]].to_numpy().tolist()
    load = summary["checkpoint"]["load_s"]
    assert restart == [pytest.approx([1.5 * H, 2 * H + load], abs=1e-9)]
    assert summary["interruptions"]["by_cause"]["spine_switch"]["mean"] == 1
    assert [state["spines_down"] for state in summary["states"]] == [0, 1]
    degraded = events[events["kind"] == "degraded"][["start_s", "end_s"]].to_numpy().tolist()
    assert degraded == [[1 * H, 2 * H], [1.5 * H, 4.5 * H]]


UNDER_ONE_LEAF = ONE_GPU_HOSTS.replace("checkpoint: {interval: 1000 d}", "checkpoint: {interval: 10 min}") + """\
run: {horizon: 10 h}
faults:
  components:
    gpu: {mtbf: 1000 d, repair: 2 h}
    spine_switch: {mtbf: 1000 d, repair: 5 h}
    software: {mtbf: 1000 d}
restart: {detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true}
"""


@pytest.mark.parametrize("cores", [1, 2], ids=["one-core", "two-cores"])
def test_a_job_shrunk_under_one_leaf_keeps_running_without_spines_and_relaunches_where_it_can(job_with, monkeypatch,
                                                                                             cores):
    """GPUs 0 and 1 fail at 1 h (back at 3 h): the elastic job runs on 2 replicas, two hosts under one leaf. Both spines
    fail at 1.5 h and 1.6 h (back at 6.5 h, 6.6 h): that job needs none and trains on (no interruption). A software
    failure at 4 h finds 4 hosts, but 4 or 3 replicas span both leaves with no spine up: it relaunches on the 2 that
    can run, not waiting for the spines, and a software failure at 8 h grows it back to 4. One shrink, one regrow.
    The states met are the same on one core and on two, where the states ahead are simulated in a worker (the two
    rounds' forecast lists no state the job never asks)."""
    monkeypatch.setattr(reliability_simulate, "cores", lambda workers=0: cores)
    monkeypatch.setattr(ahead, "cores", lambda workers=0: cores)
    monkeypatch.setattr("simulator.reliability.states._CACHE", StateCache())
    job = job_with((1 * H, 0, 0, 2 * H), (1 * H, 0, 1, 2 * H), (1.5 * H, 1, 0, 5 * H), (1.6 * H, 1, 1, 5 * H),
                   (4 * H, 2, 0, 0.0), (8 * H, 2, 0, 0.0), text=UNDER_ONE_LEAF)
    summary, events = job.summary, job.events
    assert summary["interruptions"]["by_cause"]["spine_switch"]["mean"] == 0
    restarts = events[events["kind"] == "restart"][["start_s", "end_s"]].to_numpy()
    assert restarts[:, 0].tolist() == [1 * H, 4 * H, 8 * H]
    assert (restarts[:, 1] - restarts[:, 0] < 61).all()  # detection and load: no wait for the spines
    met = {(state["replicas"], state["spines_down"]) for state in summary["states"]}
    assert met == {(4, 0), (3, 0), (2, 0), (2, 1), (2, 2)}  # 3: planned at 1 h before the second GPU failed
    replicas = summary["replicas"]
    assert (replicas["shrinks"]["mean"], replicas["regrows"]["mean"]) == (1, 1)
    running = {int(size): value["mean"] for size, value in replicas["running_s"].items()}
    assert running[2] == pytest.approx(8 * H - restarts[0, 1] - (restarts[1, 1] - restarts[1, 0]), abs=1e-6)


def test_a_job_with_sub_states_writes_the_same_bytes_on_one_worker_and_two(tmp_path, monkeypatch):
    """The job above (states with two causes, whose slow-step split asks sub-states) run with --workers 1 and
    --workers 2 (two cores however many this machine has): its second forecast round once put the costs of a
    state it asked (4 replicas, 1 spine down) among the job's own, so job_summary.json listed it on two workers
    only. Both runs write the same files, byte for byte."""
    rows = ((1 * H, 0, 0, 2 * H), (1 * H, 0, 1, 2 * H), (1.5 * H, 1, 0, 5 * H), (1.6 * H, 1, 1, 5 * H),
            (4 * H, 2, 0, 0.0), (8 * H, 2, 0, 0.0))
    time, klass, unit, repair = (np.asarray(column) for column in zip(*rows))
    arrivals = Arrivals(time.astype(float), klass.astype(int), unit.astype(int), repair.astype(float))
    monkeypatch.setattr(reliability_simulate, "draw_arrivals", lambda rng, classes, counts, horizon: arrivals)
    monkeypatch.setattr(ahead, "usable_cores", lambda: 2)
    monkeypatch.setattr(ahead, "memory_room", lambda workers, each=0: workers)  # not the host's free memory
    scenario = tmp_path / "job.yaml"
    scenario.write_text(UNDER_ONE_LEAF)

    def written(workers: int) -> list[bytes]:
        monkeypatch.setattr("simulator.reliability.states._CACHE", StateCache())
        out = tmp_path / f"workers-{workers}"
        assert main(["run", str(scenario), "--quiet", "--out", str(out), "--workers", str(workers)]) == 0
        return [(out / file).read_bytes() for file in ("job_events.parquet", "job_summary.json")]

    assert written(2) == written(1)


def test_every_spine_down_on_one_leaf_group_is_the_step_without_its_leaf_spine_links(job_with):
    """TP 4 x DP 4 on two DGX H100 under one leaf group (8 rail leaves, 2 spines): both spines down at 1.5 h leave
    every host joined through the rails (PXN: a GPU sends over NVLink to the peer on the other rail), so the job
    trains on, no interruption, at the step of the scenario with every leaf-spine link down (to the bit)."""
    text = RAILS.replace("nodes: 4", "nodes: 2").replace("tp: 8, dp: 4", "tp: 4, dp: 4") + """\
run: {horizon: 3 h}
faults:
  components:
    spine_switch: {mtbf: 1000 d, repair: 1 h}
restart: {detection: 0 s, reschedule: 0 s, launch: 0 s, warmup_steps: 0}
"""
    job = job_with((1 * H, 0, 0, 1 * H), (1.5 * H, 0, 1, 1 * H), text=text)
    summary = job.summary
    assert summary["interruptions"]["unexpected"]["mean"] == 0
    steps = {state["spines_down"]: state["step_time_s"] for state in summary["states"]}
    uplinks = ", ".join(f"{{uplinks_of: leaf0.r{rail}}}" for rail in range(8))
    cut = simulate(scenario_from_text(text, "job.yaml", [STEP_ONLY, f"faults.step.links=[{uplinks}]"])).summary
    assert steps[2] == cut["step_time_s"]
    # the collectives' neighbours are rail-aligned here: no traffic on the spines, so no route changes, and the
    # step replays its collectives' timings as the healthy one does (1 ulp apart when links down from the start
    # made every collective run as flows, simulation.py `replays`)
    assert steps[2] == steps[0]


SYNTHETIC_JOB = ELASTIC_JOB.replace("model: {layers: 2, hidden: 2048, heads: 16, vocab: 32000}",
                                    "model: {synthetic: {stages: 1, forward: 1 ms, backward: 2 ms}}").replace(
    "training: {seq_len: 1024, microbatches: 1}", "training: {microbatches: 2}").replace(
    "checkpoint: {interval: 10 min}", "checkpoint: {interval: 10 min, size: 10 GB}")


def test_a_synthetic_models_job_counts_goodput_in_healthy_steps(job_with):
    """Synthetic stage costs have no tokens (the job divided by their zero tokens per step and crashed). A step
    is 2 micro-batches x (1 + 2) ms = 6 ms on any DP (no gradients to reduce); its work is its replicas'
    micro-batches. DP 4 on one-GPU hosts, two hosts fail at 1 h: the elastic job restarts on 2 replicas, whose
    6 ms step does half the healthy step's work (healthy-equivalent 3 ms: slow-step share 1/2). By hand: sync
    checkpoints every round(600 s / 6 ms) = 100,000 steps, written at 25 GB/s a host: 10 GB in 0.1 s on 4 hosts,
    0.2 s on 2. floor(3600 / 600.1) = 5 written by 1 h, 599.5 s lost; restart 60 s + 0.2 s read; then 23 cycles
    of 600.2 s in the 14,339.8 s left. Token figures are null (n/a), goodput counts healthy-equivalent steps."""
    job = job_with((1 * H, GPU, 0, 100 * H), (1 * H, GPU, 1, 100 * H), text=SYNTHETIC_JOB)
    summary = job.summary
    steps = {state["replicas"]: state["step_time_s"] for state in summary["states"]}
    assert steps[2] == steps[4] == 0.006 and {state["tokens_per_step"] for state in summary["states"]} == {None}
    assert summary["tokens_per_step"] is None and summary["ideal_tokens_per_s"] is None
    assert summary["goodput_tokens_per_s"] is None
    horizon, lost, restart, stalls = 5 * H, 599.5, 60.2, 5 * 0.1 + 23 * 0.2
    parts = {part: value["mean"] for part, value in summary["time_s"].items()}
    for part, expected in (("lost_work_s", lost), ("restart_s", restart), ("checkpoint_stall_s", stalls)):
        assert parts[part] == pytest.approx(expected, rel=1e-9), part
    shrunk = horizon - lost - restart - stalls - 5 * 600.0  # 14,335.2 s trained on 2 replicas
    assert summary["slow_steps_by_cause_s"]["elastic_shrink"]["mean"] == pytest.approx(shrunk / 2, rel=1e-9)
    assert summary["ettr"]["mean"] == pytest.approx((5 * 600.0 + shrunk / 2) / horizon, rel=1e-9)  # 0.565
    assert summary["ideal_steps_per_s"] == pytest.approx(1 / 0.006, rel=1e-12)
    assert summary["goodput_steps_per_s"]["mean"] == pytest.approx((5 * 600.0 + shrunk / 2) / 0.006 / horizon,
                                                                   rel=1e-9)


GLOBAL_JOB = RAILS.replace("checkpoint: {interval: 30 min}", "checkpoint: {interval: 1000 d}").replace(
    "microbatches: 1", "microbatches: 3") + """\
run: {horizon: 8 h}
faults:
  components:
    gpu: {mtbf: 1000 d, repair: 100 h}
restart: {detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true, elastic_batch: BATCH}
"""


def _plain_step(*settings: str) -> dict:
    """The summary of `simulate()` of RAILS with ``settings``."""
    return simulate(scenario_from_text(RAILS, "inline.yaml", list(settings))).summary


@pytest.mark.parametrize("batch", ["keep_global", "keep_per_replica"])
def test_a_shrunk_job_keeps_its_global_or_its_per_replica_batch(job_with, batch):
    """TP 8 x DP 4 on four DGX H100, 3 micro-batches per replica (a global batch of 12). GPU 0 fails at 1 h
    (its host away for the rest of the 8 h horizon, no checkpoint before: the hour is lost) and the job restarts
    on 3 replicas: 1 min detection + the checkpoint read by 3 hosts at 25 GB/s each. keep_global: each replica
    runs 12 / 3 = 4 micro-batches, the 12,288 tokens of a healthy step in a longer one; that step is the 3-host
    step of one micro-batch plus 3 micro-batches' forward and backward, u each (a micro-batch more adds u before
    the last backward, which the gradient reduction overlaps; u = the one-host step of 2 micro-batches less that of
    1). keep_per_replica: 3 micro-batches, 9,216 tokens. By hand, with t the restart's end: goodput x horizon =
    (8 h - t) x tokens / step, ETTR x horizon = (8 h - t) x healthy-equivalent time, slow-step time (all
    elastic_shrink's) the rest of (8 h - t) when the state trains slower per token than the healthy one."""
    job = job_with((1 * H, GPU, 0, 100 * H), text=GLOBAL_JOB.replace("BATCH", batch))
    summary = job.summary
    states = {state["replicas"]: state for state in summary["states"]}
    healthy = states[4]
    assert healthy["tokens_per_step"] == pytest.approx(12 * 1024, rel=1e-12)
    u = _plain_step("cluster.nodes=1", "parallelism.dp=1", "training.microbatches=2")["step_time_s"] - _plain_step(
        "cluster.nodes=1", "parallelism.dp=1", "training.microbatches=1")["step_time_s"]
    one = _plain_step("cluster.nodes=3", "parallelism.dp=3", "training.microbatches=1")["step_time_s"]
    microbatches, tokens = (4, 12 * 1024) if batch == "keep_global" else (3, 9 * 1024)
    assert states[3]["step_time_s"] == pytest.approx(one + (microbatches - 1) * u, rel=1e-12)
    assert states[3]["step_time_s"] == _plain_step("cluster.nodes=3", "parallelism.dp=3",
                                                   f"training.microbatches={microbatches}")["step_time_s"]
    assert states[3]["tokens_per_step"] == pytest.approx(tokens, rel=1e-12)
    restart = 60.0 + summary["checkpoint"]["size_bytes"] / (3 * 25e9)
    (start, end), = job.events[job.events["kind"] == "restart"][["start_s", "end_s"]].to_numpy().tolist()
    assert (start, end) == (1 * H, pytest.approx(1 * H + restart, rel=1e-12))
    shrunk = 8 * H - end
    equivalent = shrunk * healthy["step_time_s"] / states[3]["step_time_s"] * tokens / healthy["tokens_per_step"]
    assert summary["goodput_tokens_per_s"]["mean"] * 8 * H == pytest.approx(
        shrunk / states[3]["step_time_s"] * tokens, rel=1e-9)
    assert summary["ettr"]["mean"] * 8 * H == pytest.approx(min(equivalent, shrunk), rel=1e-9)
    slow = summary["slow_steps_by_cause_s"].get("elastic_shrink", {"mean": 0.0})["mean"]
    assert slow == pytest.approx(max(shrunk - equivalent, 0.0), rel=1e-9, abs=1e-9)
    if batch == "keep_global":  # same tokens in a longer step: 1 - 26.72 / 27.18 ms of the time is slow
        assert slow == pytest.approx(shrunk * 0.0171, rel=0.01)
    assert summary["replicas"]["elastic_batch"] == batch


REGROW_JOB = GROW_JOB.replace("maintenance: {every: 10 h}", "maintenance: {every: 100 h}").replace(
    "elastic: true}", "elastic: true, regrow: REGROW}")


@pytest.mark.parametrize("regrow", ["on_repair", "next_restart"])
def test_a_job_regrows_on_repair_or_at_its_next_restart(job_with, regrow):
    """TP 8 x DP 4 on four DGX H100, no checkpoint before the horizon (8 h) but those a regrow writes, no
    maintenance in it. Hosts 0 and 1 fail at 1 h (back at 3 h and 5 h): the job restarts on 2 replicas
    (detection d = 1 min + the read by 2 hosts, L2). on_repair: at 3 h host 0 is back and 3 replicas fit: the
    job writes a checkpoint from its 2 hosts (W2) and restarts on 3, without detection (reading on 3 hosts,
    L3); at 5 h the same to 4 (W3 + L4). One shrink (4 -> 2) and two regrows, both restarts taken to
    regrow, their time W2 + L3 + W3 + L4; running on 4: 1 h + (8 h - 5 h - W3 - L4), on 3: 2 h - W2 - L3, on
    2: 2 h - d - L2. next_restart: no restart comes, the job runs on 2 replicas from 1 h + d + L2 to 8 h."""
    job = job_with((1 * H, GPU, 0, 2 * H), (1 * H, GPU, 8, 4 * H), text=REGROW_JOB.replace("REGROW", regrow))
    summary, events = job.summary, job.events
    size = summary["checkpoint"]["size_bytes"]
    write = read = {hosts: size / (hosts * 25e9) for hosts in (2, 3, 4)}  # per-host write and read: 25 GB/s
    restarts = events[events["kind"] == "restart"][["cause", "start_s", "end_s"]].to_numpy().tolist()
    first = ["failure", 1 * H, pytest.approx(1 * H + 60 + read[2], rel=1e-12)]
    replicas = summary["replicas"]
    running = {int(count): value["mean"] for count, value in replicas["running_s"].items()}
    if regrow == "next_restart":
        assert restarts == [first]
        assert (replicas["shrinks"]["mean"], replicas["regrows"]["mean"]) == (1, 0)
        assert running == pytest.approx({4: 1 * H, 2: 7 * H - 60 - read[2]}, abs=1e-6)
        assert replicas["regrow_restarts"]["mean"] == 0
        return
    regrow_3, regrow_4 = write[2] + read[3], write[3] + read[4]
    assert restarts == [first, ["regrow", 3 * H, pytest.approx(3 * H + regrow_3, rel=1e-12)],
                        ["regrow", 5 * H, pytest.approx(5 * H + regrow_4, rel=1e-12)]]
    assert (replicas["shrinks"]["mean"], replicas["regrows"]["mean"]) == (1, 2)
    assert replicas["regrow_restarts"]["mean"] == 2
    assert replicas["regrow_restart_s"]["mean"] == pytest.approx(regrow_3 + regrow_4, rel=1e-12)
    assert summary["time_s"]["restart_s"]["mean"] == pytest.approx(60 + read[2] + regrow_3 + regrow_4, rel=1e-12)
    assert running == pytest.approx({4: 1 * H + 3 * H - regrow_4, 3: 2 * H - regrow_3, 2: 2 * H - 60 - read[2]},
                                    abs=1e-6)
    checkpoints = events[events["kind"] == "checkpoint"][["start_s", "end_s"]].to_numpy().ravel().tolist()
    assert checkpoints == pytest.approx([3 * H, 3 * H + write[2], 5 * H, 5 * H + write[3]], rel=1e-12)
    step = {state["replicas"]: state["step_time_s"] for state in summary["states"]}
    cut = {2: running[2] % step[2], 3: running[3] % step[3]}  # each regrow's stop cuts the step in flight
    # the first hour, and the steps in flight at 3 h and 5 h: a checkpoint holds whole steps
    assert summary["time_s"]["lost_work_s"]["mean"] == pytest.approx(1 * H + cut[2] + cut[3], abs=1e-6)
    rate = {state["replicas"]: state["tokens_per_step"] / state["step_time_s"] for state in summary["states"]}
    trained = {4: running[4] - 1 * H, 3: running[3] - cut[3], 2: running[2] - cut[2]}  # the hour on 4 is lost
    assert summary["goodput_tokens_per_s"]["mean"] * 8 * H == pytest.approx(
        sum(trained[count] * rate[count] for count in trained), rel=1e-9)


RENDEZVOUS_JOB = REGROW_JOB.replace("REGROW", "on_repair").replace("reschedule: 0 s, launch: 0 s",
                                                                   "reschedule: 3 min, launch: 5 min")


@pytest.mark.parametrize("case", ["back-during-a-failures-restart", "back-during-a-regrows-rendezvous",
                                  "back-after-a-regrows-rendezvous"])
def test_hosts_back_before_a_restarts_rendezvous_join_it(job_with, case):
    """The on_repair job above with 3 min rescheduling and 5 min launch: a restart re-forms the group when
    launch begins (detection d = 1 min, or the regrow's write W, then rescheduling), with every host back by
    then, and launches, loads (L) and warms up on it; a host back later waits for the next restart. Host 0
    fails at 1 h. Back 2 min later, inside its restart's detection and rescheduling: the job relaunches on all 4
    replicas, no shrink (it shrank to 3 and regrew at once, a restart more). Host 1 failing at 1 h too (2
    replicas left), host 0 back at 3 h and host 1 at 3 h + 2 min: one regrow, 2 -> 4, host 1 joining the regrow's
    rendezvous at 3 h + W2 + 3 min (it regrew to 3, then again to 4: a regrow per host). Host 1 back at
    3 h + 6 min instead, after that rendezvous, during its launch: the group re-forms then (rendezvous at
    3 h + 9 min) and launches on 4, still one regrow restart, 6 + 3 + 5 min + L4 (it regrew to 3, then at the end
    of that restart to 4: W2 + 8 min + L3 + 8 min + L4, two regrows)."""
    rows = {"back-during-a-failures-restart": [(1 * H, GPU, 0, 120.0)],
            "back-during-a-regrows-rendezvous": [(1 * H, GPU, 0, 2 * H), (1 * H, GPU, 8, 2 * H + 120)],
            "back-after-a-regrows-rendezvous": [(1 * H, GPU, 0, 2 * H), (1 * H, GPU, 8, 2 * H + 360)]}[case]
    job = job_with(*rows, text=RENDEZVOUS_JOB)
    summary, events = job.summary, job.events
    size = summary["checkpoint"]["size_bytes"]
    write = read = {hosts: size / (hosts * 25e9) for hosts in (2, 3, 4)}  # per-host write and read: 25 GB/s
    assert write[2] < 120  # host 1 back at 3 h + 2 min is inside the regrow's write and rescheduling
    restarts = events[events["kind"] == "restart"][["cause", "start_s", "end_s"]].to_numpy().tolist()
    replicas = summary["replicas"]
    counts = (replicas["shrinks"]["mean"], replicas["regrows"]["mean"], replicas["regrow_restarts"]["mean"])
    if case == "back-during-a-failures-restart":
        assert restarts == [["failure", 1 * H, pytest.approx(1 * H + 60 + 180 + 300 + read[4], rel=1e-12)]]
        assert counts == (0, 0, 0)
        return
    first = ["failure", 1 * H, pytest.approx(1 * H + 60 + 180 + 300 + read[2], rel=1e-12)]
    if case == "back-during-a-regrows-rendezvous":
        regrow = write[2] + 180 + 300 + read[4]
        assert restarts == [first, ["regrow", 3 * H, pytest.approx(3 * H + regrow, rel=1e-12)]]
        assert counts == (1, 1, 1)
    else:
        regrow = 360 + 180 + 300 + read[4]
        assert restarts == [first, ["regrow", 3 * H, pytest.approx(3 * H + regrow, rel=1e-12)]]
        assert counts == (1, 1, 1)
    assert replicas["regrow_restart_s"]["mean"] == pytest.approx(regrow, rel=1e-12)
    assert replicas["regrow_restarts_cut_short"]["mean"] == 0


def test_an_elastic_job_waits_for_repair_rather_than_run_out_of_memory(job_with):
    """The ZeRO-3 job whose step fits in an H100's memory on 4 and 3 replicas, not on 2 or 1
    (test_reliability_states): GPUs 0 and 1 fail at 1 h, host 0 back at 3 h, host 1 at 5 h. The 2 hosts left
    would hold 2 replicas, out of memory: the restart waits for host 0 and re-forms on 3 at 3 h + 3 min
    rescheduling, then launches (5 min), loads on 3 hosts (L3) and warms up (10 steps); it never runs on 2 (it
    did, from 1 h + 10 min). It stays on 3 to the horizon (no restart after host 1 is back)."""
    job = job_with((1 * H, GPU, 0, 2 * H), (1 * H, GPU, 1, 4 * H), text=ZERO3_JOB)
    summary, events = job.summary, job.events
    step = {state["replicas"]: state["step_time_s"] for state in summary["states"]}
    assert set(step) == {3, 4}
    end = 3 * H + 180 + 300 + summary["checkpoint"]["size_bytes"] / (3 * 25e9) + 10 * step[3]
    restarts = events[events["kind"] == "restart"][["cause", "start_s", "end_s"]].to_numpy().tolist()
    assert restarts == [["failure", 1 * H, pytest.approx(end, rel=1e-12)]]
    running = {int(count): value["mean"] for count, value in summary["replicas"]["running_s"].items()}
    assert running == pytest.approx({4: 1 * H, 3: 48 * H - end}, rel=1e-12)


def test_a_synthetic_job_keeping_its_global_batch_runs_twice_the_micro_batches_at_half_the_replicas(job_with):
    """The synthetic job above with 3 micro-batches of 0.5 + 1.5 ms per step on DP 4 (a global batch of 12 that
    4, 3, 2 and 1 replicas split), keeping its global batch: shrunk to 2 replicas at 1 h, each runs 6
    micro-batches, a 12 ms step of the healthy 6 ms step's work (slow-step share 1/2, as half the work in 6 ms
    with keep_per_replica). Checkpoints every round(600 s / 12 ms) = 50,000 steps, 0.2 s each on 2 hosts: the
    same 5 written by 1 h, 599.5 s lost, 60.2 s restart and 23 cycles as above, so ETTR and goodput in steps are
    the same closed forms."""
    text = SYNTHETIC_JOB.replace("elastic: true}", "elastic: true, elastic_batch: keep_global}").replace(
        "forward: 1 ms, backward: 2 ms", "forward: 0.5 ms, backward: 1.5 ms").replace(
        "training: {microbatches: 2}", "training: {microbatches: 3}")
    job = job_with((1 * H, GPU, 0, 100 * H), (1 * H, GPU, 1, 100 * H), text=text)
    summary = job.summary
    steps = {state["replicas"]: state["step_time_s"] for state in summary["states"]}
    # 3 replicas (4 micro-batches each): planned at 1 h before the second GPU failed
    assert steps == pytest.approx({4: 3 * 0.002, 3: 4 * 0.002, 2: 6 * 0.002}, rel=1e-12)
    horizon, lost, restart, stalls = 5 * H, 599.5, 60.2, 5 * 0.1 + 23 * 0.2
    shrunk = horizon - lost - restart - stalls - 5 * 600.0
    assert summary["slow_steps_by_cause_s"]["elastic_shrink"]["mean"] == pytest.approx(shrunk / 2, rel=1e-9)
    assert summary["ettr"]["mean"] == pytest.approx((5 * 600.0 + shrunk / 2) / horizon, rel=1e-9)
    assert summary["goodput_steps_per_s"]["mean"] == pytest.approx((5 * 600.0 + shrunk / 2) / 0.006 / horizon,
                                                                   rel=1e-9)


def test_a_failure_during_a_regrows_write_loses_it_and_restarts_with_detection(job_with):
    """The on_repair job above loses host 0 at 1 h (back at 3 h): it runs on 3 replicas from 1 h + d + L3. At 3 h it
    stops to regrow, and host 2 fails 0.1 s into the checkpoint write (longer than that on 3 hosts): the write is
    lost (a checkpoint_lost row, no checkpoint), so is the training since the restart at 1 h, and the restart goes on
    as a failure's: detection d = 1 min from 3 h + 0.1 s, then the read on the 3 hosts left (host 0 back, host 2
    away): one restart row from 3 h, cause failure; one restart taken to regrow that a failure cut short, 0.1 s of
    it; no regrow, and no restart counted as one that regrew."""
    job = job_with((1 * H, GPU, 0, 2 * H), (3 * H + 0.1, GPU, 16, 100 * H),
                   text=REGROW_JOB.replace("REGROW", "on_repair"))
    summary, events = job.summary, job.events
    read = summary["checkpoint"]["size_bytes"] / (3 * 25e9)
    assert read > 0.1  # the write on 3 hosts (as long as the read) outlasts 0.1 s
    restarts = events[events["kind"] == "restart"][["cause", "start_s", "end_s"]].to_numpy().tolist()
    assert restarts == [["failure", 1 * H, pytest.approx(1 * H + 60 + read, rel=1e-12)],
                        ["failure", 3 * H, pytest.approx(3 * H + 0.1 + 60 + read, rel=1e-12)]]
    lost = events[events["kind"] == "checkpoint_lost"][["start_s", "end_s"]].to_numpy().tolist()
    assert lost == [[3 * H, 3 * H + 0.1]] and (events["kind"] == "checkpoint").sum() == 0
    assert summary["time_s"]["lost_work_s"]["mean"] == pytest.approx(3 * H - 60 - read, rel=1e-9)
    replicas = summary["replicas"]
    assert (replicas["shrinks"]["mean"], replicas["regrows"]["mean"]) == (1, 0)
    assert (replicas["regrow_restarts"]["mean"], replicas["regrow_restarts_cut_short"]["mean"]) == (0, 1)
    assert replicas["regrow_restart_s"]["mean"] == pytest.approx(0.1, rel=1e-9)


@pytest.mark.parametrize("case", ["on_repair", "next_restart", "on_repair-struck"])
def test_a_host_back_during_a_restarts_launch_re_forms_its_group_on_repair(job_with, case):
    """The rendezvous job above (no checkpoint before the horizon) loses host 0 at 1 h, back 6 min later: after its
    restart's rendezvous (1 h + d + 3 min = 1 h 4 min), during its launch. on_repair: the group re-forms at once, as
    torchelastic agents restart their workers when a node waits at the rendezvous: rendezvous at 1 h 9 min, 5 min
    launch, the read on 4 hosts (L4): one restart, no shrink, no regrow, no checkpoint, the first hour the only lost
    work (not a relaunch on 3 at 1 h 9 min + L3 and a regrow to 4 at once, 1 h 17 min + L3 + L4). next_restart: the
    host waits for the next restart (none comes): 3 replicas from 1 h 9 min + L3 to the horizon. Struck: host 2 fails
    at 1 h 10 min, in the re-formed group's launch: the restart goes on as the failure's, 1 min detection, 3 min
    rescheduling, 5 min launch and the read on the 3 hosts left (host 0 back, host 2 away): back at 1 h 19 min + L3,
    one shrink."""
    rows = [(1 * H, GPU, 0, 360.0)] + ([(1 * H + 600, GPU, 16, 100 * H)] if case == "on_repair-struck" else [])
    text = RENDEZVOUS_JOB if case != "next_restart" else RENDEZVOUS_JOB.replace("on_repair", "next_restart")
    job = job_with(*rows, text=text)
    summary, events = job.summary, job.events
    read = {hosts: summary["checkpoint"]["size_bytes"] / (hosts * 25e9) for hosts in (3, 4)}  # 25 GB/s a host
    end = {"on_repair": 1 * H + 840 + read[4], "next_restart": 1 * H + 840 + read[3] - 300,
           "on_repair-struck": 1 * H + 1140 + read[3]}[case]
    restarts = events[events["kind"] == "restart"][["cause", "start_s", "end_s"]].to_numpy().tolist()
    assert restarts == [["failure", 1 * H, pytest.approx(end, rel=1e-12)]]
    assert (events["kind"] == "checkpoint").sum() == 0 and (events["kind"] == "checkpoint_lost").sum() == 0
    assert summary["time_s"]["lost_work_s"]["mean"] == pytest.approx(1 * H, rel=1e-12)
    replicas = summary["replicas"]
    shrinks = 0 if case == "on_repair" else 1
    assert (replicas["shrinks"]["mean"], replicas["regrows"]["mean"], replicas["regrow_restarts"]["mean"]) == (
        shrinks, 0, 0)
    running = {int(count): value["mean"] for count, value in replicas["running_s"].items()}
    assert running == pytest.approx({4: 1 * H + 8 * H - end} if case == "on_repair"
                                    else {4: 1 * H, 3: 8 * H - end}, abs=1e-6)


def test_an_async_checkpoint_being_written_does_not_save_the_job():
    """Async, 1 s steps, a trigger every 10 steps, a 0.5 s snapshot, then a 30 s background write. At 10.5 s the
    write of step 10 is under way and no step has been trained since its trigger, yet the job is not saved: the
    last durable checkpoint is step 0's (a regrow then writes its own). A failure at 11.5 s rolls back to step 0:
    saved, with 11 s of training lost (the 10 steps before the trigger and the one trained during the write)."""
    costs = SegmentCosts(step_s=1.0, equivalent_step_s=1.0, tokens_per_step=1.0, interval_steps=10, mode="async",
                         stall_s=0.5, write_s=30.0, slowdown=0.0, load_s=0.0, warmup_s=0.0)
    clock = CheckpointClock(JobEvents())
    assert clock.saved
    clock.advance(0.0, 10.5, costs)
    assert (clock.steps, clock.saved, clock.write_end) == (10.0, False, 40.5)
    clock.advance(10.5, 11.5, costs)
    assert clock.fail(11.5) == 11.0
    assert (clock.steps, clock.saved) == (0.0, True)


def test_checkpoints_hold_whole_steps_after_state_changes_mid_step():
    """Sync, a trigger every 100 steps: 0.1 s steps to 25.9 s, then 0.7 s steps, the state changing again at 32.1 s to
    another of 0.7 s steps. Each change falls mid-step; the checkpoints hold whole steps: the third 300, not
    300.00000000000006 (the steps left to the trigger added to a fractional count)."""
    def costs(step_s: float) -> SegmentCosts:
        return SegmentCosts(step_s=step_s, equivalent_step_s=step_s, tokens_per_step=1.0, interval_steps=100,
                            mode="sync", stall_s=0.5, write_s=0.5, slowdown=0.0, load_s=0.0, warmup_s=0.0)

    events = JobEvents()
    clock = CheckpointClock(events)
    for start, end, step_s in [(0.0, 25.9, 0.1), (25.9, 32.1, 0.7), (32.1, 300.0, 0.7)]:
        clock.advance(start, end, costs(step_s))
    steps = events.table().column("step").to_pylist()
    assert steps == [100.0, 200.0, 300.0, 400.0, 500.0, 600.0] and clock.mark.steps == 600.0


REJOIN_JOB = UNDER_ONE_LEAF.replace("reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true}",
                                    "reschedule: 3 min, launch: 5 min, warmup_steps: 0, elastic: true, "
                                    "regrow: on_repair}")
M = 60.0


@pytest.mark.parametrize("case", ["spine-repaired-before-the-host", "spines-lost-before-the-host"])
def test_a_restart_judges_a_larger_sizes_route_when_the_host_returns(job_with, case):
    """One-GPU hosts under two leaves, two spines (3 or 4 replicas span both leaves, 2 sit under one), on_repair,
    1 min detection, 3 min rescheduling, 5 min launch. GPUs 0 and 1 fail at 1 h (host 0 back at 3 h 6 min, host 1
    never): the job restarts on 2 replicas. A software failure at 3 h restarts it: rendezvous at 3 h 4 min on the
    2 hosts in hand, launch and the read on 2 hosts (L2) to 3 h 9 min + L2; host 0 is back at 3 h 6 min, during
    launch, and 3 replicas could re-form the group if their GPUs have a route then.
    Spine repaired before the host: both spines fail at 2 h, spine 0 is back at 3 h 5 min: at 3 h 6 min one spine
    is up, so the group re-forms on 3 (rendezvous 3 h 9 min, launch, L3): one restart 3 h to 3 h 14 min + L3.
    Judged at 3 h, with both spines down, it stayed on 2 and regrew at once after (3 h 9 min + L2 + 8 min + L3).
    Spines lost before the host: both fail at 3 h 5 min (back at 5 h 5 min): at 3 h 6 min 3 replicas have no
    route, so the restart ends on 2 at 3 h 9 min + L2, and the job regrows when spine 0 is back (its checkpoint
    written on 2 hosts, W2, then 8 min and L3). Judged at 3 h, it re-formed at 3 h 6 min only to form on 2 again:
    3 h 14 min + L2."""
    repaired = case == "spine-repaired-before-the-host"
    spines = ([(2 * H, 1, 0, 1 * H + 5 * M), (2 * H + 10, 1, 1, 100 * H)] if repaired
              else [(3 * H + 5 * M, 1, 0, 2 * H), (3 * H + 5 * M + 1, 1, 1, 2 * H)])
    rows = sorted([(1 * H, 0, 0, 2 * H + 6 * M), (1 * H, 0, 1, 100 * H), (3 * H, 2, 0, 0.0), *spines])
    job = job_with(*rows, text=REJOIN_JOB)
    summary, events = job.summary, job.events
    size = summary["checkpoint"]["size_bytes"]
    read = write = {hosts: size / (hosts * 25e9) for hosts in (2, 3)}  # per-host write and read: 25 GB/s
    restarts = events[events["kind"] == "restart"][["cause", "start_s", "end_s"]].to_numpy().tolist()
    first = ["failure", 1 * H, pytest.approx(1 * H + 9 * M + read[2], rel=1e-12)]
    if repaired:
        assert restarts == [first, ["failure", 3 * H, pytest.approx(3 * H + 14 * M + read[3], rel=1e-12)]]
    else:
        regrow = 5 * H + 5 * M
        assert restarts == [first, ["failure", 3 * H, pytest.approx(3 * H + 9 * M + read[2], rel=1e-12)],
                            ["regrow", regrow, pytest.approx(regrow + write[2] + 8 * M + read[3], rel=1e-12)]]
    replicas = summary["replicas"]
    assert (replicas["shrinks"]["mean"], replicas["regrows"]["mean"]) == (1, 1)


@pytest.mark.parametrize("spares", [0, 2])
def test_the_wait_for_hosts_is_the_part_of_restart_time_after_detection_until_hosts_return(job_with, spares):
    """DP 4 on one-GPU hosts. GPU 0 fails at 1 h (its host back at 11 h), GPU 1 at 5 h (back at 15 h). Without
    spares the first restart waits from its detection's end (1 h 2 min) until the second failure starts it over,
    and that one from 5 h 2 min until both hosts are back (15 h): 14 h - 4 min of waiting, all of the restart
    time but detection, rescheduling, launch and load (14 h 8 min + load). With 2 spares the hosts are in hand:
    no wait, two restarts of 10 min + load. The parts still add up to the horizon."""
    text = WAIT_JOB.replace("warmup_steps: 0", f"warmup_steps: 0, spares: {spares}")
    summary = job_with((1 * H, 0, 0, 10 * H), (5 * H, 0, 1, 10 * H), text=text).summary
    waiting, restart = summary["restart_waiting_for_hosts_s"]["mean"], summary["time_s"]["restart_s"]["mean"]
    load = summary["restart"]["load_s"]
    if spares:
        assert waiting == 0.0
        assert restart == pytest.approx(2 * (10 * 60 + load), rel=1e-12)
    else:
        assert waiting == pytest.approx(14 * H - 4 * 60, rel=1e-12)
        assert restart == pytest.approx(14 * H + 8 * 60 + load, rel=1e-12)
    assert sum(value["mean"] for value in summary["time_s"].values()) == pytest.approx(30 * H, rel=1e-12)


@pytest.mark.parametrize("waited_min", [89, 91])
def test_restarts_that_mostly_wait_for_hosts_warn_above_5_percent_of_the_horizon(job_with, tmp_path, capsys,
                                                                                 waited_min):
    """GPU 0 fails at 1 h and its host is back after 2 min of detection and ``waited_min`` minutes, no spares:
    the wait is 89 or 91 min of the 30 h horizon (1.5 h, 5%, is the threshold). Above it `trainsim run` warns
    on stderr, naming the figure and the knobs, summary.json's warnings keep it, and the job table gives the
    wait within the restarts and per failure; below it none of them does."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(WAIT_JOB)
    job_with((1 * H, 0, 0, (2 + waited_min) * 60.0), text=WAIT_JOB)  # the failure placed, for the CLI too
    assert main(["run", str(scenario), "--out", str(tmp_path / "job")]) == 0
    printed = capsys.readouterr()
    out = " ".join(printed.out.split())
    warnings = json.loads((tmp_path / "job" / "summary.json").read_text())["warnings"]
    job = json.loads((tmp_path / "job" / "job_summary.json").read_text())
    assert job["restart_waiting_for_hosts_s"]["mean"] == pytest.approx(waited_min * 60.0, rel=1e-12)
    share = waited_min / 60 / 30
    restart = job["time_s"]["restart_s"]["mean"]
    assert f"{long_duration(waited_min * 60.0)} of it waiting for hosts" in out
    assert f"{long_duration(waited_min * 60.0)} waiting for hosts on average" in out  # one failure
    warning = (f"restarts waited {waited_min / 60:.4g} h per replication for spare or repaired hosts, {share:.1%} "
               f"of the horizon ({waited_min * 60 / restart:.0%} of the restart time; over 5% warns): the spare pool "
               "is too small (restart.spares: 0); more spares or restart.elastic: true cut it")
    if waited_min > 90:
        assert warnings == [warning] and f"warning: {warning}" in printed.err
    else:
        assert warnings == [] and "waited" not in printed.err


SPARE_JOB = WAIT_JOB.replace("warmup_steps: 0", "warmup_steps: 10, spares: 2")
"""The one-GPU-host job above with 10 warm-up steps and two spare hosts."""


@pytest.mark.parametrize("case", ["in-the-warm-up", "in-the-detection"])
def test_a_spare_standing_in_that_fails_during_the_warm_up_starts_the_restart_over(job_with, case):
    """GPU 0 fails at 1 h; its host goes to repair and a spare stands in its slot from the restart's rendezvous (2 min
    detection + 3 min rescheduling), through the 5 min launch, the load L and the warm-up W. The spare's GPU failing
    halfway through the warm-up interrupts that restart: it starts over with detection, on the second spare, and ends
    a whole restart (10 min + L + W) after that failure; two interruptions, each sending a host to repair (the slot
    is not counted as out until the restart ends, which would ignore the failure). The same slot failing 1 min after
    1 h, during detection, hits the host already out: ignored, one restart."""
    parts = job_with((1 * H, GPU, 0, 10 * H), text=SPARE_JOB).summary["restart"]
    assert parts["warmup_s"] > 0
    restart = 10 * 60 + parts["load_s"] + parts["warmup_s"]
    again = {"in-the-warm-up": 1 * H + restart - parts["warmup_s"] / 2, "in-the-detection": 1 * H + 60}[case]
    job = job_with((1 * H, GPU, 0, 10 * H), (again, GPU, 0, 10 * H), text=SPARE_JOB)
    events = job.events
    restarts = events[events["kind"] == "restart"][["cause", "start_s", "end_s"]].to_numpy().tolist()
    failures = events[events["kind"] == "failure"][["start_s", "hosts"]].to_numpy().tolist()
    if case == "in-the-warm-up":
        assert restarts == [["failure", 1 * H, pytest.approx(again + restart, rel=1e-12)]]
        assert failures == [[1 * H, 1], [again, 1]]
    else:
        assert restarts == [["failure", 1 * H, pytest.approx(1 * H + restart, rel=1e-12)]]
        assert failures == [[1 * H, 1]]
    assert job.summary["interruptions"]["unexpected"]["mean"] == len(failures)
    assert job.summary["time_s"]["lost_work_s"]["mean"] == pytest.approx(1 * H, rel=1e-12)


def test_a_spine_down_that_slows_no_step_is_charged_no_slow_step_time(job_with):
    """TP 4 x DP 4 on two DGX H100 under one leaf group: the collectives stay on the rails, so a spine down slows no
    step, alone or beside a throttled GPU (x1.5). GPU 0 throttled from 1 h to 5 h, spine 0 down from 2 h to 4 h, no
    checkpoint or failure to cut the training: all 4 h of slow training is throttling's, 4 h x (1 - healthy step /
    throttled step), and the spine's is 0."""
    text = RAILS.replace("nodes: 4", "nodes: 2").replace("tp: 8, dp: 4", "tp: 4, dp: 4").replace(
        "interval: 30 min", "interval: 1000 d") + """\
run: {horizon: 6 h}
faults:
  components:
    spine_switch: {mtbf: 1000 d, repair: 1 h}
    throttling: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 1000 d, repair: 1 h}
restart: {detection: 0 s, reschedule: 0 s, launch: 0 s, warmup_steps: 0}
"""
    summary = job_with((1 * H, 1, 0, 4 * H), (2 * H, 0, 0, 2 * H), text=text).summary
    steps = {(state["spines_down"], bool(state["slow_gpus"])): state["step_time_s"] for state in summary["states"]}
    assert steps[1, True] == steps[0, True] > steps[0, False]
    by_cause = {cause: value["mean"] for cause, value in summary["slow_steps_by_cause_s"].items()}
    assert by_cause["spine_switch"] == 0.0
    assert by_cause["throttling"] == pytest.approx(4 * H * (1 - steps[0, False] / steps[0, True]), rel=1e-9)
    assert by_cause["throttling"] == summary["time_s"]["slow_steps_s"]["mean"]
