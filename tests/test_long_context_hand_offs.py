"""The published long-context row (TP 8, CP 16, PP 16, DP 8 on 2,048 DGX H100) folds inexactly, and why: its
pipeline hand-offs between two leaf groups hash onto the spines unevenly across the CP lanes of a stage. These
tests pin the cause on the fabric's routes and the spread the folded run reports, so that a change to either
is noticed, and, on a small analogue that runs unfolded in seconds, what an exact fold needs: the run folded
by stage replayed lane by lane is the unfolded one without SM contention, not with it, and the run folded by
CP lane (parallel/folding.py `lane_classes`) is the unfolded one with it (docs/architecture.md, rank folding:
lockstep)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from shared import SCENARIOS

from simulator import simulate
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.metrics.events import EventLog
from simulator.metrics.step import OP_COLUMNS, StepRows, communication_metrics, pipeline_bubble
from simulator.program.ops import CollectiveOp
from simulator.program.step import StepProgram
from simulator.scale import sized_topology
from simulator.simulation import network_settings, run_step, step_program
from simulator.topology.loader import scenario_topology

LONG_CONTEXT = SCENARIOS / "published" / "llama3-405b-long-context.yaml"
RANKS_PER_STAGE = 8 * 16
"""Order [tp, cp, pp, dp]: rank = tp + 8 cp + 128 pp + 2048 dp, so a stage's CP lane c on rail 0 is GPU
128 pp + 8 c, on host 16 pp + c; a leaf group holds 32 hosts, two stages."""


def _uplinks(topology, src_stage: int, dst_stage: int) -> dict[int, list[str]]:
    """Per CP lane (rail 0, replica 0), the leaf-to-spine uplinks its hand-off from ``src_stage`` to
    ``dst_stage`` takes (P2P sends run on one channel)."""
    uplinks = {}
    for lane in range(16):
        route = topology.path(RANKS_PER_STAGE * src_stage + 8 * lane, RANKS_PER_STAGE * dst_stage + 8 * lane)
        uplinks[lane] = [f"{a}>{b}" for a, b in map(topology.link_ends.__getitem__, route) if b.startswith("spine")]
    return uplinks


def test_hand_offs_across_leaf_groups_hash_several_lanes_onto_one_uplink():
    """Stages 1 and 2 sit in leaf groups 0 and 1. The spine is drawn from the source's place in its leaf group
    (hosts 16-31 for stage 1) and the destination's offset (+16 hosts, alike for every lane), so each lane
    draws its own spine: 16 draws onto 16 spines collide. Forward, lanes 5, 7, 13 and 14 share the uplink to
    spine 0: four flows on 100 GB/s (two NICs' worth, oversubscription 1) get 25 GB/s each, half of the
    50 GB/s NIC, while the representative's lane 0 shares spine 8 with lane 9 alone (50 GB/s each). A 33.6 MB
    activation slice (8,192 tokens x 16,384 x 2 B / TP 8) then takes 1.34 ms on those lanes against 0.67 ms.
    Backward (stage 2 to 1, offset -16) other lanes collide: three on spine 1 (lanes 0, 4, 12), at most three
    on any uplink. Within a leaf group (stage 0 to 1) no flow touches a spine."""
    loaded = load_scenario(LONG_CONTEXT)
    topology = sized_topology(loaded, False)
    forward = {lane: uplink for lane, (uplink,) in _uplinks(topology, 1, 2).items()}
    backward = {lane: uplink for lane, (uplink,) in _uplinks(topology, 2, 1).items()}
    shared = Counter(forward.values())
    assert sorted(lane for lane, uplink in forward.items() if shared[uplink] == 4) == [5, 7, 13, 14]
    assert forward[5] == "leaf0.r0>spine0" and shared[forward[0]] == 2 and max(shared.values()) == 4
    backward_shared = Counter(backward.values())
    assert max(backward_shared.values()) == 3 and backward_shared[backward[0]] == 3
    uplink = topology.link_index[("leaf0.r0", "spine0")]
    nic = topology.link_index[(topology.gpu_nic[128], "leaf0.r0")]
    assert topology.link_bandwidth[uplink] == 2 * topology.link_bandwidth[nic] == 100e9
    assert not any(_uplinks(topology, 0, 1).values())


def test_the_folded_long_context_step_reports_how_far_its_hand_offs_fell_out_of_step():
    """Folded, a hand-off ends when its slowest lane's does (collectives/execute.py `run_plans`): the first one
    out of step, stage 3's forward send of micro-batch 3, ends on its lanes between 173.1 ms and 173.2 ms, and
    1,328 hand-off instances do, by up to 1.071 ms (lanes 5, 7, 13 and 14 behind the others on every forward send
    across a leaf group). The folded step is 11.302001 s and its exposed pipeline communication 495.0 ms per GPU
    (11.299570 s and 488.8 ms before a rank's sends to one peer left in issue order, parallel/program.py
    `_send`). Unfolded the step is far beyond the scale limits, so the folded run stands with this warning and
    its stage fold in `fold_not_exact` with these figures; the fold by CP lane (256 ranks) is beyond the refold
    budget (scale.refold_refusal: 16 times the stage fold's ranks, and ~32.9 GiB), so it is given up before it is
    built, and the route classes by hops
    are none (every lane's hand-off crosses the spines over the same hops), so the finer route classes are listed
    as not tried; no collective other than a hand-off falls out of step. With every CP lane simulated (256 ranks, what
    --force runs, not run here: 225 s of CPU, 10.6 GiB) no mirror falls out of step; measured 2026-12-03 with the
    H100's bf16 GEMM share at 0.801, that step took 11.296940 s and its exposed pipeline communication 453.1 ms per
    GPU (the stage fold's 11.296903 s, 3.3e-6 short, and 487.1 ms). A change to the network model, the spine hash
    or the program moves these figures, and should be looked at here."""
    summary = simulate(load_scenario(LONG_CONTEXT)).summary
    assert summary["folded"] and "fold_off_reason" not in summary
    (warning,) = summary["warnings"]
    assert warning.startswith(
        "folded step not exact, and too large to simulate unfolded: send_recv 'send fwd mb3' over GPUs [384, 512] "
        "ended on its mirrors between 173.1 ms and 173.2 ms in the folded run (1,328 instances out of step, by up "
        "to 1.071 ms)")
    lanes, untried = summary["fold_given_up"]
    assert (untried["fold"], untried["simulated_ranks"], untried["why"]) == (
        "routes", None, "finer refolds are not tried where the step may not unfold")
    assert (lanes["fold"], lanes["simulated_ranks"], lanes["why"]) == ("lanes", 256, "the refold is too large to "
                                                                                  "simulate")
    assert lanes["reason"].startswith("the refold would cost 16 x the fold (256 ranks simulated against 16)")
    assert "x the fold's ranks; and beyond the limits too: " in lanes["reason"]  # it named the multiple alone
    not_exact = summary["fold_not_exact"]
    assert (not_exact["fold"], not_exact["simulated_ranks"], not_exact["why"]) == (
        "stage", 16, "a hand-off fell out of step in its run")
    figures = not_exact["out_of_step"]
    assert (figures["name"], figures["group"], figures["instances"]) == ("send fwd mb3", [384, 512], 1328)
    assert figures["widest_s"] == pytest.approx(1.07e-3, abs=5e-6)
    assert summary["step_time_s"] == pytest.approx(11.302001, abs=1e-6)
    assert summary["exposed_comm_s"]["pp"] == pytest.approx(0.4950, abs=1e-4)


SMALL_ANALOGUE = """
cluster: {topology: dgx-h100-cluster, nodes: 16, leaf_ports: 8, spines: 4}
model: {layers: 8, hidden: 4096, heads: 32, kv_heads: 8, vocab: 32000}
training: {seq_len: 32768, global_batch: 8, micro_batch: 1, precision: bf16}
parallelism:
  tp: 8
  cp: 4
  pp: 4
  dp: 1
  order: [tp, cp, pp, dp]
  cp_algorithm: all_gather
  cp_load_balance: true
  sequence_parallel: true
  tp_comm_overlap: true
  pipeline: {schedule: interleaved, virtual_stages: 2}
"""
"""The long-context row's mechanism at 128 GPUs (unfolded in seconds): leaf groups of 8 hosts hold two stages
of 4 hosts (one CP lane per host), so stage 1's hand-offs to stage 2 cross 4 spines whose uplinks carry two
NICs' worth, as the row's 16 spines do for its 32-host leaf groups."""
STAGE_GPUS = 32
"""Order [tp, cp, pp, dp]: rank = tp + 8 cp + 32 pp; a stage's GPU g is its lane (g // 8) on rail (g % 8)."""
MATCHED = ("rank", "name", "stream", "microbatch", "chunk")


def _folded_and_unfolded(*overrides: str):
    """SMALL_ANALOGUE run folded (kept folded whatever its lockstep says) and unfolded: (summary, log, lockstep,
    program) of the folded run and the unfolded Result."""
    loaded = scenario_from_text(SMALL_ANALOGUE, "inline.yaml", list(overrides))
    topology = scenario_topology(loaded)
    program = step_program(loaded, topology, fold=True)
    summary, log, kept_pace = run_step(program, topology, network_settings(loaded, topology))
    unfolded = simulate(scenario_from_text(SMALL_ANALOGUE, "inline.yaml", [*overrides, "run.fold=false"]))
    return summary, log, kept_pace, program, unfolded


def _lanes_replayed(program: StepProgram, log: EventLog) -> dict[str, np.ndarray]:
    """The folded run's op rows on every GPU of each stage, as if each lane differed from its representative
    only by its own hand-offs: a pipeline send/recv ends on a lane when that lane's flows do (the
    representative's row ends with the slowest lane's; a rail whose hand-off was pruned, on links of its own,
    ends with rail 0 of its lane), compute and TP collectives (on the host's NVLink) start on a lane when their
    dependencies and their stream's previous op have ended there and last as long as on the representative, and
    every other collective (the CP and DP x CP collectives gather every lane) starts and ends as it did."""
    rows = log.op_columns(("kind", "rank", "stream", "name", "category", "microbatch", "chunk", "start_s", "end_s",
                           "flops", "key"))
    of_op = {(rank, key) if key else (rank, name, stream, microbatch, chunk): index
             for index, (rank, key, name, stream, microbatch, chunk)
             in enumerate(zip(*(rows[column].tolist() for column in ("rank", "key", *MATCHED[1:]))))}
    flows = log.flow_columns(("key", "src", "dst", "end_s"))
    flow_end: dict[tuple[str, int], float] = {}
    for key, src, dst, end in zip(flows["key"].tolist(), flows["src"].tolist(), flows["dst"].tolist(),
                                  flows["end_s"].tolist()):
        for gpu in (src, dst):
            flow_end[(key, gpu)] = max(flow_end.get((key, gpu), 0.0), end)
    lanes = np.arange(STAGE_GPUS)
    ends: dict[int, np.ndarray] = {}
    last_on_stream: dict[tuple[int, str], int] = {}
    replayed: list[tuple[int, np.ndarray, np.ndarray]] = []
    for op in sorted(program.ops, key=lambda op: op.id):  # ids follow dependencies and stream order
        index = of_op[(op.rank, op.key) if isinstance(op, CollectiveOp) else
                      (op.rank, op.name, op.stream, op.microbatch, op.chunk)]
        start, end = float(rows["start_s"][index]), float(rows["end_s"][index])
        if isinstance(op, CollectiveOp) and op.category != "tp":
            starts, lane_ends = np.full(STAGE_GPUS, start), np.full(STAGE_GPUS, end)
            if op.op == "send_recv":
                gpus = op.rank + lanes
                own = np.array([flow_end.get((op.key, gpu), flow_end[(op.key, gpu - gpu % 8)]) for gpu in gpus])
                lane_ends = end + (own - own.max())
        else:
            waits = [*op.deps]
            if op.stream not in program.async_streams and (op.rank, op.stream) in last_on_stream:
                waits.append(last_on_stream[(op.rank, op.stream)])
            starts = np.max([ends[wait] for wait in waits], axis=0) if waits else np.full(STAGE_GPUS, start)
            lane_ends = starts + (end - start)
        last_on_stream[(op.rank, op.stream)] = op.id
        ends[op.id] = lane_ends
        replayed.append((index, starts, lane_ends))
    indices = np.repeat([index for index, _, _ in replayed], STAGE_GPUS)
    columns = {name: np.asarray(column)[indices] for name, column in rows.items()}
    columns["rank"] = columns["rank"] + np.tile(lanes, len(replayed))
    columns["start_s"] = np.concatenate([starts for _, starts, _ in replayed])
    columns["end_s"] = np.concatenate([lane_ends for _, _, lane_ends in replayed])
    return columns


def _in_order(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``rows`` sorted by rank, name, stream, micro-batch, chunk and start (rows of one op name in time order)."""
    order = np.lexsort([rows["start_s"], *(np.asarray(rows[column], dtype=str) if rows[column].dtype == object
                                           else rows[column] for column in reversed(MATCHED))])
    return {name: column[order] for name, column in rows.items()}


def test_without_sm_contention_the_folded_step_replayed_lane_by_lane_is_the_unfolded_one():
    """The small analogue without SM contention: 24 hand-offs end on their lanes up to 165.7 us apart, the
    representative goes on when its slowest lane does, and the next collective that touches shared links
    gathers every lane (the CP K/V all-gather after a forward receive; after a backward one, the CP collectives
    or the DP x CP gradient reduction), so the folded step is the unfolded one to the bit: each lane waits there
    for the slowest, which the representative played. Only the per-GPU figures differ: exposed pipeline
    communication 12.100 ms folded against 11.973 ms (12.133 against 12.006 while the TP overlap's ring exchange
    paid NCCL's base latency). Replaying the folded log lane by lane (`_lanes_replayed`)
    gives every op row of the 128 GPUs of the unfolded run to the bit, and so its exposed communication,
    communication ratio and bubble: the folded run holds what an exact per-lane account needs."""
    summary, log, kept_pace, program, unfolded = _folded_and_unfolded("collectives.sm_contention=none")
    assert not kept_pace.collectives and kept_pace.hand_offs.startswith(
        "send_recv 'send fwd mb0' over GPUs [32, 64] ended on its mirrors between 4.323 ms and 4.473 ms in the "
        "folded run (24 instances out of step, by up to 165.7 us)")
    assert summary["step_time_s"] == unfolded.summary["step_time_s"]
    assert summary["exposed_comm_s"]["pp"] == pytest.approx(0.0121004, abs=1e-7)
    assert unfolded.summary["exposed_comm_s"]["pp"] == pytest.approx(0.0119727, abs=1e-7)
    lanes = _in_order(_lanes_replayed(program, log))
    truth = _in_order(unfolded.log.op_columns(tuple(lanes)))
    for column in MATCHED:
        assert np.array_equal(lanes[column], truth[column])
    assert np.array_equal(lanes["start_s"], truth["start_s"]) and np.array_equal(lanes["end_s"], truth["end_s"])
    replayed = StepRows({column: lanes[column] for column in OP_COLUMNS}, {})
    figures = communication_metrics(replayed, summary["step_time_s"])
    assert figures["exposed_comm_s"] == unfolded.summary["exposed_comm_s"]
    assert figures["comm_ratio"] == unfolded.summary["comm_ratio"]
    assert pipeline_bubble(replayed).fraction == unfolded.summary["bubble_fraction"]


def test_the_step_folded_by_lane_is_the_unfolded_one_row_for_row_with_sm_contention():
    """What the stage fold cannot play, one rank per CP lane can (classes keyed by CP lane): the small analogue with SM
    contention on runs folded by stage, its hand-offs fall out of step, and it runs again with the 16 ranks of
    rail 0 (4 stages x 4 lanes), each lane's compute slowed by its own hand-offs' SMs; no mirror of that run
    falls out of step (the rails hash alike, the replicas are images). Its op rows, each repeated on the 8 rails
    of its lane, are every op row of the 128 GPUs of the unfolded run to the bit, and so is the step; the
    per-GPU figures are the unfolded ones up to the order of the sums (mean over 16 ranks against 128)."""
    loaded = scenario_from_text(SMALL_ANALOGUE, "inline.yaml", [])
    lanes = simulate(loaded)
    unfolded = simulate(scenario_from_text(SMALL_ANALOGUE, "inline.yaml", ["run.fold=false"]))
    assert lanes.summary["folded"] and lanes.summary["simulated_ranks"] == 16 and not lanes.summary["warnings"]
    assert lanes.summary["fold_lanes_reason"].startswith(
        "send_recv 'send fwd mb0' over GPUs [32, 64] ended on its mirrors between 4.426 ms and 4.576 ms")
    assert lanes.summary["step_time_s"] == unfolded.summary["step_time_s"]
    columns = (*MATCHED, "start_s", "end_s")
    rows = lanes.log.op_columns(columns)
    rails = np.tile(np.arange(8), len(rows["rank"]))
    on_rails = {name: np.repeat(np.asarray(column), 8) for name, column in rows.items()}
    on_rails["rank"] = on_rails["rank"] + rails
    ours, truth = _in_order(on_rails), _in_order(unfolded.log.op_columns(columns))
    for column in columns:
        assert np.array_equal(ours[column], truth[column])
    for figure in ("exposed_comm_s", "traffic_bytes_per_gpu"):
        assert lanes.summary[figure] == pytest.approx(unfolded.summary[figure], rel=1e-12)
    assert lanes.summary["bubble_fraction"] == pytest.approx(unfolded.summary["bubble_fraction"], rel=1e-12)
    lost = lanes.summary["sm_contention"]["compute_slowdown_s"]
    assert lost == pytest.approx(unfolded.summary["sm_contention"]["compute_slowdown_s"], rel=1e-12)


def test_sm_contention_makes_a_lanes_compute_depend_on_its_own_hand_offs():
    """With SM contention (NCCL's, the default and the long-context row's) the replay is not exact: a hand-off's
    kernel holds 2 of the 132 SMs on each lane until that lane's own flows end, so compute overlapping the lag
    runs at 130/132 of its speed on the lanes still sending and at full speed on the others, and lanes differ
    by more than their hand-offs' ends. The replay (which keeps each op's folded duration) is off from the
    unfolded rows by up to 1.34 us; the first row off is lane 3 of stage 3's 'F3 L3.attn gemm (first steps)',
    0.27 us late. Folded, the representative plays the slowest lane of every hand-off, its SMs held as long,
    which is no lane's run once compute depends on them: the folded step is 0.15 ns (1.1e-9) short of the
    unfolded one here (48 us long on the long-context row, measured before every collective paid NCCL's base
    latency), and the compute the pipeline kernels cost 69.97 us per GPU against 68.81 us (+1.7%; 69.48 against
    68.32 while the TP overlap's ring exchange paid NCCL's base latency)."""
    summary, log, kept_pace, program, unfolded = _folded_and_unfolded()
    assert "(24 instances out of step, by up to 165.7 us)" in kept_pace.hand_offs
    assert summary["step_time_s"] / unfolded.summary["step_time_s"] - 1 == pytest.approx(-1.106e-9, abs=5e-11)
    lost = summary["sm_contention"]["compute_slowdown_s"]["pp"], unfolded.summary["sm_contention"][
        "compute_slowdown_s"]["pp"]
    assert lost == pytest.approx((69.97e-6, 68.81e-6), abs=1e-8)
    lanes = _in_order(_lanes_replayed(program, log))
    truth = _in_order(unfolded.log.op_columns(tuple(lanes)))
    off = np.maximum(abs(lanes["start_s"] - truth["start_s"]), abs(lanes["end_s"] - truth["end_s"]))
    assert off.max() == pytest.approx(1.336e-6, abs=1e-8)
    first = np.flatnonzero(off > 1e-12)[np.argmin(truth["start_s"][off > 1e-12])]
    assert (truth["rank"][first], truth["name"][first]) == (120, "F3 L3.attn gemm (first steps)")
    assert lanes["end_s"][first] - truth["end_s"][first] == pytest.approx(0.272e-6, abs=1e-8)
