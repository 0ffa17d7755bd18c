"""`workload.dp` on a model-parallel trace: the traced job's model-parallel groups and transfers copied into
each new data-parallel replica, its data-parallel groups widened to every replica (program.py `_Replicas`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_traces import EXACT, allreduce_time, chakra_job, run

from simulator.config.loader import scenario_from_text
from simulator.topology.loader import scenario_topology
from simulator.workload.traces.program import read_traces, trace_program

MIB = 2**20
TP_BYTES, STAGE_BYTES, GRADIENT_BYTES = MIB, 2 * MIB, 4 * MIB
TRACED = 8
"""The traced job: TP 2 x DP 2 x PP 2 in the traces' rank order (workload/traces/layout.py, Megatron-LM's):
rank = tp + 2 dp + 4 pp."""


def tp_pp_dp_job(folder: Path) -> None:
    """Chakra traces of TP 2 x DP 2 x PP 2 on eight ranks, groups named only by number: stage 0 (ranks 0-3)
    all-reduces 1 MiB over its TP pair, sends 2 MiB to the same place in stage 1 (rank + 4), then all-reduces
    its 4 MiB of gradients over its DP pair (ranks two apart); stage 1 receives, all-reduces over its TP pair,
    then its gradients over its DP pair."""
    tp = {rank: f"t{rank // 2}" for rank in range(TRACED)}
    dp = {rank: f"d{rank % 2 + 2 * (rank // 4)}" for rank in range(TRACED)}
    groups = {f"t{pair}": [2 * pair, 2 * pair + 1] for pair in range(4)} | {
        f"d{lane}": [lane % 2 + 4 * (lane // 2), lane % 2 + 4 * (lane // 2) + 2] for lane in range(4)}
    work = {rank: ([("all_reduce", tp[rank], TP_BYTES), ("send", rank + 4, STAGE_BYTES)] if rank < 4
                   else [("recv", rank - 4, STAGE_BYTES), ("all_reduce", tp[rank], TP_BYTES)])
            + [("all_reduce", dp[rank], GRADIENT_BYTES)] for rank in range(TRACED)}
    chakra_job(folder, groups, work)


def scenario(folder: Path, dp: int | None, *, fold: bool = True) -> str:
    """The job on ethernet-100g hosts of one GPU each, as many as the replicated job's ranks (every transfer
    crosses the one switch, so any GPUs of a group are alike), ring collectives."""
    gpus = TRACED * (dp or 2) // 2
    knobs = "traced_tp: 2, traced_pp: 2, tokens_per_step: 4096" + (f", dp: {dp}" if dp else "")
    return (f"cluster: {{topology: ethernet-100g, nodes: {gpus}}}\ncollectives: {{algorithm: ring}}\n"
            + ("" if fold else "run: {fold: false}\n")
            + f"workload: {{trace: '{folder}/rank*.json', format: chakra-json, {knobs}}}\n")


def program(folder: Path, dp: int, fold: bool):
    path = folder / "scenario.yaml"
    path.write_text(scenario(folder, dp))
    loaded = scenario_from_text(path.read_text(), source=str(path))
    workload = loaded.scenario.workload
    return trace_program(workload, read_traces(workload, folder), scenario_topology(loaded), fold=fold)


def test_replicas_copy_model_parallel_groups_and_transfers_and_widen_the_gradients_groups(tmp_path):
    """dp 6 of a job of DP 2: three copies of the eight traced ranks, copy q offset by 8q. Rank 13 (copy 1 of
    rank 5) all-reduces over its copy of the TP pair (12, 13), receives from 9 (copy 1 of rank 1), and
    all-reduces its gradients over ranks 5, 7, 13, 15, 21, 23: every rank of its place in the model."""
    tp_pp_dp_job(tmp_path)
    unfolded = program(tmp_path, 6, fold=False)
    assert (unfolded.world, unfolded.ranks, unfolded.folded) == (24, tuple(range(24)), False)
    ops = [op for op in unfolded.ops if op.rank == 13]
    assert [(op.op, tuple(op.group), op.category) for op in ops] == [
        ("send_recv", (9, 13), "pp"), ("all_reduce", (12, 13), "tp"), ("all_reduce", (5, 7, 13, 15, 21, 23), "dp")]
    folded = program(tmp_path, 6, fold=True)
    assert (folded.world, folded.ranks, folded.folded) == (24, tuple(range(TRACED)), True)
    assert unfolded.tokens_per_step == folded.tokens_per_step == 4096 * 3


def test_dp_of_the_traced_degree_is_the_trace_itself(tmp_path):
    tp_pp_dp_job(tmp_path)
    _, traced = run(scenario(tmp_path, None), tmp_path)
    _, same = run(scenario(tmp_path, 2), tmp_path)
    for field in ("step_time_s", "traffic_bytes_per_gpu", "simulated_ranks", "tokens_per_s"):
        assert same.summary[field] == traced.summary[field]


@pytest.mark.parametrize(("dp", "hosts"), [(4, None), (8, None), (8, "dgx-h100-cluster, nodes: 4")])
def test_folded_replication_agrees_with_unfolded(tmp_path, dp, hosts):
    """On one-GPU hosts, and on DGX H100s where each copy fills one host (TP and PP over NVLink, the gradients'
    rings across hosts)."""
    tp_pp_dp_job(tmp_path)
    texts = [scenario(tmp_path, dp, fold=fold) for fold in (True, False)]
    if hosts:
        texts = [text.replace(f"ethernet-100g, nodes: {TRACED * dp // 2}", hosts) for text in texts]
        assert all(hosts in text for text in texts)
    _, folded = run(texts[0], tmp_path)
    _, unfolded = run(texts[1], tmp_path)
    assert (folded.summary["simulated_ranks"], unfolded.summary["simulated_ranks"]) == (TRACED, TRACED * dp // 2)
    assert folded.summary["step_time_s"] == pytest.approx(unfolded.summary["step_time_s"], rel=EXACT)
    assert folded.summary["traffic_bytes_per_gpu"] == pytest.approx(unfolded.summary["traffic_bytes_per_gpu"],
                                                                    rel=EXACT)


def test_the_gradients_ring_grows_with_the_replicas_and_the_rest_does_not(tmp_path):
    """Stage 1's gradient all-reduce ends the step, after its receive and its TP all-reduce, which do not change
    with the replicas: the step grows by the ring all-reduce's time over N ranks less over 2. A ring sends
    2(N-1)/N x n per GPU; on one switch each of its 2(N-1) steps carries n / N between two hosts (ethernet-100g's
    14 us path, 100 Gb/s at the calibrated 0.94), after NCCL's base latency of a Simple ring (8.4 us)."""
    tp_pp_dp_job(tmp_path)
    _, two = run(scenario(tmp_path, None), tmp_path)
    for replicas in (4, 16):
        loaded, grown = run(scenario(tmp_path, replicas), tmp_path)
        ring = 8.4e-6 + 2 * (replicas - 1) * (14e-6 + GRADIENT_BYTES / replicas / (100e9 / 8 * 0.94))
        assert allreduce_time(loaded, GRADIENT_BYTES, replicas) == pytest.approx(ring, rel=EXACT)
        assert grown.summary["step_time_s"] - two.summary["step_time_s"] == pytest.approx(
            ring - allreduce_time(loaded, GRADIENT_BYTES, 2), rel=EXACT)
        traffic = grown.summary["traffic_bytes_per_gpu"]
        assert traffic["dp"] == pytest.approx(2 * (replicas - 1) / replicas * GRADIENT_BYTES, rel=EXACT)
        assert traffic["tp"] == pytest.approx(TP_BYTES, rel=EXACT)
        assert traffic["pp"] == pytest.approx(STAGE_BYTES / 2, rel=EXACT)


def test_dp_must_be_a_multiple_of_the_traced_data_parallelism(tmp_path):
    tp_pp_dp_job(tmp_path)
    path = tmp_path / "scenario.yaml"
    with pytest.raises(Exception) as caught:
        run(scenario(tmp_path, 5), tmp_path)
    assert str(caught.value) == (f"{path}:3: workload.dp: dp 5 is not a multiple of the traced job's data "
                                 "parallelism of 2 (allowed: multiples of 2)")


def test_a_trace_without_data_parallelism_is_refused(tmp_path):
    """TP 2 x PP 2 on four ranks: no gradient collective in the trace, none invented."""
    first = {rank: [("all_reduce", "1", MIB), ("send", rank + 2, 2 * MIB)] for rank in (0, 1)}
    second = {rank: [("recv", rank - 2, 2 * MIB), ("all_reduce", "2", MIB)] for rank in (2, 3)}
    chakra_job(tmp_path, {"1": [0, 1], "2": [2, 3]}, first | second)
    text = (f"cluster: {{topology: ethernet-100g, nodes: 16}}\n"
            f"workload: {{trace: '{tmp_path}/rank*.json', format: chakra-json, traced_tp: 2, dp: 4}}\n")
    with pytest.raises(Exception) as caught:
        run(text, tmp_path)
    assert caught.value.field == "workload.dp" and "has no data parallelism" in caught.value.problem
