"""`workload.dp` on a model-parallel trace (workload/traces/program.py `_Replicas`): the traced job of d
data-parallel replicas (d = its ranks over TP x CP x PP) is copied dp / d times; its model-parallel groups (and
an HSDP shard group) and its transfers are copied into each copy, its data-parallel groups (the plain DP group,
Megatron-LM's DP-with-CP group, an expert-data-parallel group, an HSDP replicate group) widened across every
copy. A folded run simulates the traced ranks with each copied op's copies as mirrors, where a copy's own traffic
stays inside NVLink domains; elsewhere it unfolds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from shared import (
    EVEN,
    EXACT,
    MIB,
    NCCL_SIMPLE_BASE_S,
    SEQ_2RANK,
    UNEVEN,
    all_to_all_2rank,
    allreduce_time,
    chakra_job,
    run,
    seq_args,
)

from simulator.config.loader import scenario_from_text
from simulator.config.traces import TraceWorkload
from simulator.errors import ScenarioError
from simulator.topology.loader import scenario_topology
from simulator.workload.traces.program import read_traces, trace_program

TP_BYTES, STAGE_BYTES, GRADIENT_BYTES = MIB, 2 * MIB, 4 * MIB
ETHERNET_RATE = 100e9 / 8 * 0.94
"""ethernet-100g's NIC rate at the calibrated link efficiency (topologies/ethernet-100g.yaml), bytes/s."""


def ring_s(ranks: int, nbytes: float) -> float:
    """A ring all-reduce of ``nbytes`` over ``ranks`` one-GPU hosts of ethernet-100g: NCCL's base latency of a
    Simple ring (8.4 us), then 2(p-1) steps each carrying n / p between two hosts over the one switch (a 14 us
    path)."""
    return NCCL_SIMPLE_BASE_S + 2 * (ranks - 1) * (14e-6 + nbytes / ranks / ETHERNET_RATE)


def ring_bytes(ranks: int, nbytes: float) -> float:
    """What a ring all-reduce of ``nbytes`` sends per GPU: 2(p-1)/p x n."""
    return 2 * (ranks - 1) / ranks * nbytes


def tp_dp_pp_job(folder: Path) -> None:
    """TP 2 x DP 2 x PP 2 on eight ranks in Megatron-LM's order (rank = tp + 2 dp + 4 pp), groups named only by
    number: stage 0 all-reduces 1 MiB over its TP pair, sends 2 MiB to the same place in stage 1 (rank + 4), then
    all-reduces its 4 MiB of gradients over its DP pair (ranks two apart); stage 1 receives, all-reduces over its
    TP pair, then its gradients over its DP pair."""
    tp = {rank: f"t{rank // 2}" for rank in range(8)}
    dp = {rank: f"d{rank % 2 + 2 * (rank // 4)}" for rank in range(8)}
    groups = {f"t{pair}": [2 * pair, 2 * pair + 1] for pair in range(4)} | {
        f"d{lane}": [lane % 2 + 4 * (lane // 2), lane % 2 + 4 * (lane // 2) + 2] for lane in range(4)}
    work = {rank: ([("all_reduce", tp[rank], TP_BYTES), ("send", rank + 4, STAGE_BYTES)] if rank < 4
                   else [("recv", rank - 4, STAGE_BYTES), ("all_reduce", tp[rank], TP_BYTES)])
            + [("all_reduce", dp[rank], GRADIENT_BYTES)] for rank in range(8)}
    chakra_job(folder, groups, work)


def dp_pp_job(folder: Path, stages: int) -> None:
    """DP 2 x ``stages`` pipeline stages (rank = dp + 2 pp): each stage receives 2 MiB from the one before, sends
    2 MiB to the one after, then all-reduces 4 MiB of gradients over its DP pair."""
    groups = {f"d{stage}": [2 * stage, 2 * stage + 1] for stage in range(stages)}
    work = {rank: ([("recv", rank - 2, STAGE_BYTES)] if rank >= 2 else [])
            + ([("send", rank + 2, STAGE_BYTES)] if rank < 2 * stages - 2 else [])
            + [("all_reduce", f"d{rank // 2}", GRADIENT_BYTES)] for rank in range(2 * stages)}
    chakra_job(folder, groups, work)


def cp_job(folder: Path) -> None:
    """CP 2 x DP 2 x PP 2 on eight ranks (rank = cp + 2 dp + 4 pp): stage 1 receives 2 MiB from stage 0; each CP
    pair passes 1 MiB each way (a ring attention's exchange); stage 0 sends on; then every rank all-reduces its
    4 MiB of gradients over its stage's DP-with-CP group of four (Megatron-LM's DATA_PARALLEL_GROUP_WITH_CP, the
    DP ranks of both CP places) and 1 MiB over its DP pair."""
    groups = {f"w{stage}": list(range(4 * stage, 4 * stage + 4)) for stage in range(2)} | {
        f"d{lane}": [lane % 2 + 4 * (lane // 2), lane % 2 + 4 * (lane // 2) + 2] for lane in range(4)}
    work = {}
    for rank in range(8):
        partner = rank ^ 1
        ring = ([("send", partner, MIB), ("recv", partner, MIB)] if rank % 2 == 0
                else [("recv", partner, MIB), ("send", partner, MIB)])
        work[rank] = (([("recv", rank - 4, STAGE_BYTES)] if rank >= 4 else []) + ring
                      + ([("send", rank + 4, STAGE_BYTES)] if rank < 4 else [])
                      + [("all_reduce", f"w{rank // 4}", GRADIENT_BYTES),
                         ("all_reduce", f"d{rank % 2 + 2 * (rank // 4)}", MIB)])
    chakra_job(folder, groups, work)


def edp_job(folder: Path) -> None:
    """EP 2 inside DP 4, PP 2 on eight ranks, groups described as Megatron-LM names them: each rank all-reduces
    1 MiB over its EXPERT_MODEL_PARALLEL_GROUP pair (ranks r, r + 1), its experts' 2 MiB of gradients over its
    EXPERT_DATA_PARALLEL_GROUP (ranks two apart: the DP places of its expert shard) and its dense 4 MiB over
    its stage's DATA_PARALLEL_GROUP of four; stage 0 sends 2 MiB to stage 1 between the first two."""
    named = ({f"ep{pair}": ("EXPERT_MODEL_PARALLEL_GROUP", [2 * pair, 2 * pair + 1]) for pair in range(4)}
             | {f"edp{lane}": ("EXPERT_DATA_PARALLEL_GROUP", [lane % 2 + 4 * (lane // 2), lane % 2 + 4 * (lane // 2)
                                                              + 2]) for lane in range(4)}
             | {f"dp{stage}": ("DATA_PARALLEL_GROUP", list(range(4 * stage, 4 * stage + 4))) for stage in range(2)})
    work = {rank: ([("recv", rank - 4, STAGE_BYTES)] if rank >= 4 else []) + [("all_reduce", f"ep{rank // 2}", MIB)]
            + ([("send", rank + 4, STAGE_BYTES)] if rank < 4 else [])
            + [("all_reduce", f"edp{rank % 2 + 2 * (rank // 4)}", 2 * MIB),
               ("all_reduce", f"dp{rank // 4}", GRADIENT_BYTES)] for rank in range(8)}
    chakra_job(folder, {}, work, named)


SHARDS = ([0, 1], [2, 3], [4, 5], [6, 7])
REPLICAS = ([0, 2], [1, 3], [4, 6], [5, 7])


def hsdp_job(folder: Path, shards: tuple[list[int], ...] = SHARDS, replicas: tuple[list[int], ...] = REPLICAS) -> None:
    """HSDP of 2 shards x 2 replicas, PP 2 on eight ranks, groups described as torchtitan's mesh names them:
    each rank all-reduces 4 MiB over its dp_shard pair (by default consecutive ranks: the inner dimension),
    stage 0 sends 2 MiB to stage 1, then each rank all-reduces 1 MiB over its dp_replicate pair (ranks two
    apart)."""
    shard_of = {rank: index for index, ranks in enumerate(shards) for rank in ranks}
    replica_of = {rank: index for index, ranks in enumerate(replicas) for rank in ranks}
    named = ({f"shard{index}": ("dp_shard", ranks) for index, ranks in enumerate(shards)}
             | {f"rep{index}": ("dp_replicate", ranks) for index, ranks in enumerate(replicas)})
    work = {rank: ([("recv", rank - 4, STAGE_BYTES)] if rank >= 4 else [])
            + [("all_reduce", f"shard{shard_of[rank]}", GRADIENT_BYTES)]
            + ([("send", rank + 4, STAGE_BYTES)] if rank < 4 else [])
            + [("all_reduce", f"rep{replica_of[rank]}", MIB)] for rank in range(8)}
    chakra_job(folder, {}, work, named)


class Job(NamedTuple):
    """A fixture: how it writes its traces, the layout knobs its scenario gives, its traced data parallelism and
    ranks."""

    write: Callable[[Path], None]
    knobs: str
    degree: int
    ranks: int = 8


JOBS = {"tp_dp_pp": Job(tp_dp_pp_job, "traced_tp: 2, traced_pp: 2", 2),
        "cp": Job(cp_job, "traced_tp: 1, traced_cp: 2, traced_pp: 2", 2),
        "edp": Job(edp_job, "traced_pp: 2", 4),
        "hsdp": Job(hsdp_job, "traced_pp: 2", 4),
        "dp_pp3": Job(lambda folder: dp_pp_job(folder, 3), "traced_tp: 1, traced_pp: 3", 2, 6)}


def scenario(folder: Path, knobs: str, dp: int | None, cluster: str = "", *, fold: bool = True,
             tokens: bool = False) -> str:
    """The traced job in ``folder`` replicated to ``dp`` (None: not replicated) on ``cluster`` (default:
    ethernet-100g hosts of one GPU each, enough for 64 ranks, every transfer across the one switch), ring
    collectives."""
    cluster = cluster or "topology: ethernet-100g, nodes: 64"
    knobs += (f", dp: {dp}" if dp else "") + (", tokens_per_step: 4096" if tokens else "")
    return (f"cluster: {{{cluster}}}\ncollectives: {{algorithm: ring, protocol: simple}}\n"
            + ("" if fold else "run: {fold: false}\n")
            + f"workload: {{trace: '{folder}/rank*.json', format: chakra-json, {knobs}}}\n")


def job(name: str, folder: Path) -> str:
    """The fixture ``name`` written into ``folder``; its layout knobs."""
    JOBS[name].write(folder)
    return JOBS[name].knobs


def program(folder: Path, text: str, fold: bool):
    path = folder / "scenario.yaml"
    path.write_text(text)
    loaded = scenario_from_text(text, source=str(path))
    workload = loaded.scenario.workload
    assert isinstance(workload, TraceWorkload)
    return trace_program(workload, read_traces(workload, folder), scenario_topology(loaded), fold=fold)


def test_copies_keep_model_parallel_groups_and_transfers_and_widen_the_gradients_groups(tmp_path):
    """dp 6 of the TP 2 x DP 2 x PP 2 job: three copies of the eight traced ranks, copy q offset by 8q. Rank 13
    (copy 1 of rank 5) receives from 9 (copy 1 of rank 1), all-reduces over its copy of the TP pair (12, 13)
    and its gradients over ranks 5, 7, 13, 15, 21, 23: its place in the model in every replica. Folded on DGX
    H100s (each copy one host, all its own traffic over NVLink), the traced ranks are simulated and carry their
    copies' TP pairs and transfers as mirrors; a widened group has none, its members all in it."""
    knobs = job("tp_dp_pp", tmp_path)
    cluster = "topology: dgx-h100-cluster, nodes: 3"
    unfolded = program(tmp_path, scenario(tmp_path, knobs, 6, cluster), fold=False)
    assert (unfolded.world, unfolded.ranks, unfolded.folded) == (24, tuple(range(24)), False)
    assert [(op.op, tuple(op.group), op.category, op.mirrors) for op in unfolded.ops if op.rank == 13] == [
        ("send_recv", (9, 13), "pp", ()), ("all_reduce", (12, 13), "tp", ()),
        ("all_reduce", (5, 7, 13, 15, 21, 23), "dp", ())]
    folded = program(tmp_path, scenario(tmp_path, knobs, 6, cluster), fold=True)
    assert (folded.world, folded.ranks, folded.folded) == (24, tuple(range(8)), True)
    assert [(op.op, tuple(op.group), op.mirrors) for op in folded.ops if op.rank == 5] == [
        ("send_recv", (1, 5), ((9, 13), (17, 21))), ("all_reduce", (4, 5), ((12, 13), (20, 21))),
        ("all_reduce", (5, 7, 13, 15, 21, 23), ())]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_dp_of_the_traced_degree_is_the_trace_itself(tmp_path, name):
    knobs = job(name, tmp_path)
    _, traced = run(scenario(tmp_path, knobs, None, tokens=True), tmp_path)
    _, same = run(scenario(tmp_path, knobs, JOBS[name].degree, tokens=True), tmp_path)
    for field in ("step_time_s", "traffic_bytes_per_gpu", "simulated_ranks", "gpus", "tokens_per_s"):
        assert same.summary[field] == traced.summary[field]


def test_the_ring_closed_form_is_the_simulators(tmp_path):
    loaded, _ = run(scenario(tmp_path, job("tp_dp_pp", tmp_path), None), tmp_path)
    for ranks in (2, 4, 8, 16):
        for nbytes in (MIB, GRADIENT_BYTES):
            assert allreduce_time(loaded, nbytes, ranks) == pytest.approx(ring_s(ranks, nbytes), rel=EXACT)


WIDENED = {"tp_dp_pp": lambda copies: [(2, 2 * copies, GRADIENT_BYTES)],
           "cp": lambda copies: [(4, 4 * copies, GRADIENT_BYTES), (2, 2 * copies, MIB)],
           "edp": lambda copies: [(2, 2 * copies, 2 * MIB), (4, 4 * copies, GRADIENT_BYTES)],
           "hsdp": lambda copies: [(2, 2 * copies, MIB)]}
"""Per fixture, the all-reduces that end the last stage's step and grow with the copies: (ranks traced, ranks
with ``copies`` copies, bytes). Everything before them is each copy's own, on hosts of its own."""
KEPT_DP = {"tp_dp_pp": 0.0, "cp": 0.0, "edp": 0.0, "hsdp": ring_bytes(2, GRADIENT_BYTES)}
"""Per fixture, the data-parallel traffic per GPU that stays as traced: the HSDP shard pairs' all-reduce."""


@pytest.mark.parametrize(("name", "copies"), [("tp_dp_pp", 2), ("tp_dp_pp", 8), ("cp", 2), ("cp", 4), ("edp", 2),
                                              ("hsdp", 2), ("hsdp", 4)])
def test_the_step_grows_by_the_widened_all_reduces_alone(tmp_path, name, copies):
    """Stage 1's data-parallel all-reduces end the step, after its receive and its own groups' collectives,
    which do not change with the copies: the step grows by each widened ring's time over its ranks with the
    copies less over its traced ranks (the TP 2 x DP 2 x PP 2 job's DP pair 2 -> 2N/2; the CP job's
    DP-with-CP group 4 -> 2N, its DP pair 2 -> N; the expert-data-parallel pair and the DP group of four each
    times the copies; HSDP's replicate pair, its shard pair kept), and the data-parallel traffic per GPU is
    theirs (with the HSDP shard pair's, unchanged)."""
    knobs = job(name, tmp_path)
    degree = JOBS[name].degree
    _, traced = run(scenario(tmp_path, knobs, None), tmp_path)
    _, grown = run(scenario(tmp_path, knobs, degree * copies), tmp_path)
    widened = WIDENED[name](copies)
    assert grown.summary["step_time_s"] - traced.summary["step_time_s"] == pytest.approx(
        sum(ring_s(ranks, nbytes) - ring_s(before, nbytes) for before, ranks, nbytes in widened), rel=1e-9, abs=1e-15)
    assert grown.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(
        KEPT_DP[name] + sum(ring_bytes(ranks, nbytes) for _, ranks, nbytes in widened), rel=EXACT)
    for kind in ("tp", "cp", "ep", "pp"):
        assert grown.summary["traffic_bytes_per_gpu"][kind] == pytest.approx(
            traced.summary["traffic_bytes_per_gpu"][kind], rel=EXACT)
    assert grown.summary["gpus"] == 8 * copies


@pytest.mark.parametrize(("name", "dp", "cluster", "folds"), [
    ("tp_dp_pp", 8, "topology: dgx-h100-cluster, nodes: 4", True),
    ("edp", 16, "topology: dgx-h100-cluster, nodes: 4", True),
    ("hsdp", 8, "topology: dgx-h100-cluster, nodes: 2", True),
    ("cp", 6, "topology: gb200-nvl72, racks: 1", True),
    ("dp_pp3", 8, "topology: gb200-nvl72, racks: 1", True),
    ("tp_dp_pp", 4, "topology: ethernet-100g, nodes: 16", False),
    ("cp", 4, "topology: dgx-h100-cluster, nodes: 3, nics_per_node: 2", True)])
@pytest.mark.parametrize("model", ["flow", "analytic"])
def test_folded_replication_agrees_with_unfolded(tmp_path, name, dp, cluster, folds, model):
    """Where each copy's own traffic stays inside NVLink domains, alike in every copy (a DGX H100 per copy, or two
    copies per DGX; copies of six ranks on an NVL72 rack, straddling its trays of four GPUs), the traced ranks
    stand for their copies; where it crosses the network (ethernet's one-GPU hosts) the step unfolds, saying
    why. Either way the folded run's figures are the unfolded run's."""
    knobs = job(name, tmp_path)
    cluster += f"}}\nnetwork: {{model: {model}"
    _, folded = run(scenario(tmp_path, knobs, dp, cluster), tmp_path)
    _, unfolded = run(scenario(tmp_path, knobs, dp, cluster, fold=False), tmp_path)
    traced = JOBS[name].ranks
    world = traced * dp // JOBS[name].degree
    assert (folded.summary["simulated_ranks"], unfolded.summary["simulated_ranks"]) == (traced if folds else world,
                                                                                        world)
    assert ("fold_off_reason" in folded.summary) is not folds
    assert folded.summary["step_time_s"] == pytest.approx(unfolded.summary["step_time_s"], rel=EXACT)
    assert folded.summary["traffic_bytes_per_gpu"] == pytest.approx(unfolded.summary["traffic_bytes_per_gpu"],
                                                                    rel=EXACT)


CROSSING = "a copy's own traffic folds only inside NVLink domains"


@pytest.mark.parametrize(("stages", "dp", "cluster", "reason"), [
    (3, 4, "topology: dgx-h100-cluster, nodes: 2",
     f"copy 1 of the traced job's transfer from rank 0 to rank 2 crosses the network (GPUs 6, 8): {CROSSING}"),
    (3, 8, "topology: dgx-h100-cluster, nodes: 3}\nnetwork: {model: analytic",
     f"copy 1 of the traced job's transfer from rank 0 to rank 2 crosses the network (GPUs 6, 8): {CROSSING}"),
    (3, 4, "topology: dgx-h100-cluster, nodes: 1, node: {kind: pcie_node, gpus: 12, gpus_per_switch: 4}",
     "copy 1 of the traced job's transfer from rank 0 to rank 2 takes other links (GPUs 6, 8) than the traced "
     "ranks' (GPUs 0, 2)"),
    (8, 6, "topology: dgx-h100-cluster, nodes: 6, leaf_ports: 3",
     f"the traced job's transfer from rank 6 to rank 8 crosses the network (GPUs 6, 8): {CROSSING}")])
def test_copies_whose_own_traffic_meets_the_cluster_unlike_unfold(tmp_path, stages, dp, cluster, reason):
    """DP 2 x PP 3 (six ranks) at dp 4 on DGX H100s: copy 1 straddles two hosts and hands stage 0 on over the NICs where
    the traced ranks use NVLink; so at dp 8 on three hosts on the analytic model (folded regardless, 0.3070 ms
    against 0.2574 ms unfolded). On one PCIe host of 12 GPUs, 4 per switch, at dp 4 copy 1's hand-off from GPU 6 to
    GPU 8 crosses two switches where the traced one from GPU 0 to GPU 2 stays under one (folded regardless, 0.9376 ms
    against 0.8096 ms). DP 2 x PP 8 (two hosts per copy) at dp 6 on leaf groups of three hosts: every copy hands on
    across the spines, copy 1 into another leaf group, where the other copies' gradient rings slow it (folded
    regardless, 0.7967 ms against 1.0347 ms). All unfold, naming the transfer, and the fold given up says why (not
    'ranks of a stage do different work')."""
    dp_pp_job(tmp_path, stages)
    knobs = f"traced_tp: 1, traced_pp: {stages}"
    _, folded = run(scenario(tmp_path, knobs, dp, cluster), tmp_path)
    _, unfolded = run(scenario(tmp_path, knobs, dp, cluster, fold=False), tmp_path)
    assert folded.summary["fold_off_reason"] == reason
    assert [(entry["why"], entry["reason"]) for entry in folded.summary["fold_given_up"]] == [
        ("the traced job's copies would use the cluster differently", reason)]
    assert folded.summary["simulated_ranks"] == unfolded.summary["simulated_ranks"] == 2 * stages * dp // 2
    assert folded.summary["step_time_s"] == unfolded.summary["step_time_s"]


def test_copies_simulated_beyond_the_limits_are_refused_at_workload_dp(tmp_path, monkeypatch):
    """DP 2 x PP 3 at dp 4 on two DGX H100s unfolds (above): 28 ops on 12 ranks where the traced job alone has 14
    on 6. A trace is not estimated before it is read, so the copies' ops were never checked against the limits;
    under a limit of 20 the traced job runs and its copies are refused at `workload.dp`, a smaller dp the
    remedy."""
    from simulator import scale

    monkeypatch.setattr(scale, "MAX_EVENTS", 20)
    dp_pp_job(tmp_path, 3)
    knobs, cluster = "traced_tp: 1, traced_pp: 3", "topology: dgx-h100-cluster, nodes: 2"
    run(scenario(tmp_path, knobs, None, cluster), tmp_path)
    with pytest.raises(ScenarioError) as caught:
        run(scenario(tmp_path, knobs, 4, cluster), tmp_path)
    assert caught.value.field == "workload.dp"
    assert caught.value.problem == ("this run is too large to simulate: its traces replay 28 ops on 12 simulated "
                                    "ranks of 16 GPUs (~0.2 GiB before their flows); ops + flows ~28 over the "
                                    "limit of 20")
    assert caught.value.allowed.startswith("a smaller dp, ")


def test_tokens_grow_with_the_copies(tmp_path):
    knobs = job("tp_dp_pp", tmp_path)
    _, grown = run(scenario(tmp_path, knobs, 8, "topology: dgx-h100-cluster, nodes: 4", tokens=True), tmp_path)
    assert grown.summary["tokens_per_s"] == pytest.approx(4096 * 4 / grown.summary["step_time_s"], rel=EXACT)


def refusal_line(text: str, folder: Path) -> str:
    with pytest.raises(ScenarioError) as caught:
        run(text, folder)
    return str(caught.value)


def test_dp_must_be_a_multiple_of_the_traced_data_parallelism(tmp_path):
    knobs = job("edp", tmp_path)
    text = scenario(tmp_path, knobs, 6, "topology: dgx-h100-cluster, nodes: 2")
    assert refusal_line(text, tmp_path) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.dp: dp 6 is not a multiple of the traced job's data parallelism "
        "of 4 (allowed: multiples of 4)")


def test_a_trace_without_data_parallelism_is_refused(tmp_path):
    """TP 2 x PP 2 on four ranks: no gradient collective in the trace, none invented."""
    first = {rank: [("all_reduce", "1", MIB), ("send", rank + 2, 2 * MIB)] for rank in (0, 1)}
    second = {rank: [("recv", rank - 2, 2 * MIB), ("all_reduce", "2", MIB)] for rank in (2, 3)}
    chakra_job(tmp_path, {"1": [0, 1], "2": [2, 3]}, first | second)
    text = ("cluster: {topology: dgx-h100}\n"
            f"workload: {{trace: '{tmp_path}/rank*.json', format: chakra-json, traced_tp: 2, dp: 4}}\n")
    assert refusal_line(text, tmp_path) == (
        f"{tmp_path / 'scenario.yaml'}:2: workload.dp: the traced job has no data parallelism (its 4 ranks are TP 2 "
        "x CP 1 x PP 2), so the trace cannot tell the gradients' traffic of more replicas (allowed: leave dp out, "
        "workload.traced_pp, traced_tp or traced_cp where that layout (PP read from the point-to-point transfers) is "
        "not the traced job's, or a trace of 2 or more data-parallel replicas)")


def test_a_data_parallel_group_neither_across_nor_inside_the_replicas_is_refused(tmp_path):
    """HSDP groups described as dp_shard over ranks 0 and 3 of a stage's four data-parallel places: neither
    every place, nor every second one (a replicate group's), nor a block of consecutive ones (a shard group's),
    so whether more replicas widen it or copy it is unknown."""
    hsdp_job(tmp_path, ([0, 3], [1, 2], [4, 7], [5, 6]), ([0, 1], [2, 3], [4, 5], [6, 7]))
    text = scenario(tmp_path, "traced_pp: 2", 8, "topology: dgx-h100-cluster, nodes: 2")
    assert refusal_line(text, tmp_path) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.dp: process group 'shard0' (ranks 0, 3) holds data-parallel "
        "places 0, 3 of the traced job's 4 (TP 1 x CP 1 x PP 2 on 8 ranks), so how it grows with dp is unknown "
        "(allowed: data-parallel groups over all of the traced job's data-parallel places, or every s-th of them "
        "(expert-data-parallel, HSDP replicate groups), or over a block of consecutive ones (HSDP shard groups))")


def ep_job(folder: Path, splits: dict[int, tuple[str, str]] = UNEVEN) -> str:
    """EP 2 inside DP 4 on four Kineto ranks (seq-2rank's two, twice): after a GEMM each EP pair [0, 1], [2, 3]
    all-to-alls 8 MiB per rank, the first of each pair splitting it as ``splits[0]`` says, the second as
    ``splits[1]`` (by default test_traces.UNEVEN: 6 MiB to the second, 2 MiB back), then the default group of all
    four all-reduces 16 MiB of gradients. The scenario's workload line, its knobs to follow."""
    for rank in range(4):
        doc = json.loads((SEQ_2RANK / f"rank{rank % 2}.json").read_text())
        doc["distributedInfo"] |= {"rank": rank, "world_size": 4}
        pair = [rank - rank % 2, rank - rank % 2 + 1]
        in_splits, out_splits = splits[rank % 2]
        exchange, reduce = (event["args"] for event in doc["traceEvents"][1:3])
        exchange |= {"Collective name": "all_to_allv", "Process Group Name": f"ep{pair[0]}", "Seq": 1,
                     "Process Group Description": "undefined", "Process Group Ranks": str(pair),
                     "In split size": in_splits, "Out split size": out_splits}
        reduce |= {"Group size": 4, "Process Group Ranks": "[0, 1, 2, 3]"}
        for event in doc["traceEvents"]:
            event["args"]["device"] = rank
        (folder / f"rank{rank}.json").write_text(json.dumps(doc))
    return f"workload: {{trace: '{folder}/rank*.json', format: kineto, traced_ep: 2"


def test_an_uneven_all_to_all_is_copied_with_its_shares(tmp_path):
    """EP 2 inside DP 4, its all-to-alls sending 6 MiB one way and 2 MiB the other: at dp 8 each copy keeps its EP pairs
    and their shares (4 MiB of EP per GPU, as traced), not groups widened to members whose shares nothing says; dp 4
    is the trace itself, and folded on one DGX H100 (the copy's pairs on NVLink beside the traced ones, their
    mirrors) equals unfolded. (EP 2 over the two ranks of DP 2 leaves no expert data parallelism and is refused.)"""
    workload = ep_job(tmp_path)
    head = "cluster: {topology: dgx-h100}\ncollectives: {algorithm: auto}\n"
    _, traced = run(f"{head}{workload}}}\n", tmp_path)
    _, same = run(f"{head}{workload}, dp: 4}}\n", tmp_path)
    assert same.summary["step_time_s"] == traced.summary["step_time_s"]
    _, folded = run(f"{head}{workload}, dp: 8}}\n", tmp_path)
    _, unfolded = run(f"{head}run: {{fold: false}}\n{workload}, dp: 8}}\n", tmp_path)
    assert (folded.summary["simulated_ranks"], unfolded.summary["simulated_ranks"]) == (4, 8)
    assert folded.summary["step_time_s"] == pytest.approx(unfolded.summary["step_time_s"], rel=EXACT)
    for result in (traced, folded, unfolded):
        assert result.summary["traffic_bytes_per_gpu"]["ep"] == pytest.approx(4 * MIB, rel=EXACT)


def test_equal_split_sizes_replicate_as_an_even_all_to_all(tmp_path):
    """PyTorch's list-form all_to_all records one split per tensor, equal or not: at dp 8 the EP 2 inside DP 4 job is
    copied twice, and the all-to-all of 8 MiB in equal halves replicates as the even one does, each copy keeping its
    EP pairs (1/2 x 8 = 4 MiB of EP per GPU), with the same step time, not refused for listing splits."""
    halves = {rank: ("[2097152, 2097152]",) * 2 for rank in (0, 1)}
    results = []
    for name, splits in (("split", halves), ("even", EVEN)):
        (tmp_path / name).mkdir()
        workload = ep_job(tmp_path / name, splits)
        text = f"cluster: {{topology: dgx-h100}}\ncollectives: {{algorithm: auto}}\n{workload}, traced_cp: 1, dp: 8}}\n"
        results.append(run(text, tmp_path / name)[1].summary)
    assert results[0]["traffic_bytes_per_gpu"]["ep"] == pytest.approx(4 * MIB, rel=EXACT)
    assert results[0]["step_time_s"] == results[1]["step_time_s"]


def test_a_data_parallel_group_running_all_to_alls_is_refused(tmp_path):
    """The uneven all-to-all's group described as dp_shard: it counts as data-parallel and spans both traced
    replicas, so it would widen, but its shares say nothing of what more members send."""
    text = all_to_all_2rank(tmp_path, UNEVEN).replace("format: kineto", "format: kineto, dp: 4")
    for rank in (0, 1):
        seq_args(tmp_path / "traces", rank, 1, **{"Process Group Description": "dp_shard"})
    assert refusal_line(text.replace("nodes: 2", "nodes: 4"), tmp_path) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.dp: process group '5' (ranks 0-1) counts as data-parallel and "
        "runs all-to-alls, whose shares more replicas cannot tell (allowed: leave dp out, or Process Group "
        "Descriptions naming the group's dimension (an all-to-all's group is CP's or EP's, copied into each "
        "replica))")


def test_an_expert_group_over_every_data_parallel_place_is_refused_beyond_the_trace(tmp_path):
    """EP 4 over DP 4 (TP 1, PP 1): each rank all-to-alls 8 MiB over its EXPERT_MODEL_PARALLEL_GROUP of all four
    ranks and all-reduces 4 MiB over its DATA_PARALLEL_GROUP; its EXPERT_DATA_PARALLEL_GROUPs are single ranks.
    The traced job's expert data parallelism is 1, so a job of more replicas all-reduces its expert gradients
    over groups whose size the trace cannot tell: dp 8 and 16 are refused (they ran, dp 8 in 0.0672 ms, faster
    than the traced 0.0689 ms, the expert gradients' all-reduce missing); dp 4 is the trace itself."""
    named = ({"ep": ("EXPERT_MODEL_PARALLEL_GROUP", [0, 1, 2, 3]), "dp": ("DATA_PARALLEL_GROUP", [0, 1, 2, 3])}
             | {f"edp{rank}": ("EXPERT_DATA_PARALLEL_GROUP", [rank]) for rank in range(4)})
    chakra_job(tmp_path, {}, {rank: [("all_to_all", "ep", 8 * MIB), ("all_reduce", "dp", 4 * MIB)]
                              for rank in range(4)}, named)

    def text(dp: int | None) -> str:
        return scenario(tmp_path, "traced_ep: 4", dp, "topology: dgx-h100-cluster, nodes: 2").replace(
            "algorithm: ring, protocol: simple", "algorithm: auto")

    _, traced = run(text(None), tmp_path)
    _, same = run(text(4), tmp_path)
    assert same.summary["step_time_s"] == traced.summary["step_time_s"]
    for dp in (8, 16):
        assert refusal_line(text(dp), tmp_path) == (
            f"{tmp_path / 'scenario.yaml'}:3: workload.dp: process group 'ep' (ranks 0-3) is expert-parallel over "
            "all of the traced job's 4 data-parallel places (TP 1 x CP 1 x PP 1 on 4 ranks): the traced job's expert "
            "data parallelism is 1, so the trace cannot tell the expert gradients' traffic (allowed: 4 or dp left "
            "out, or a trace whose expert-parallel groups span part of its data-parallel places)")


def test_strided_groups_that_nothing_in_the_trace_explains_are_refused(tmp_path):
    """TP 2 x DP 2 whose trace records no TP groups (Transformer Engine's userbuffers), its DP groups [0, 2] and [1, 3]
    numbered: the layout reads TP 1 and DP 4, the groups every 2nd place, which no group over every place or over
    blocks of 2 explains. Refused at every dp, naming traced_tp (not 'not a multiple of 4' at dp 2, nor the trace
    itself run at dp 4, where a TP 2 x DP 2 job at DP 4 is two copies); with traced_tp: 2, dp 4 runs two copies on 8
    GPUs."""
    chakra_job(tmp_path, {"a": [0, 2], "b": [1, 3]}, {rank: [("all_reduce", "ab"[rank % 2], 4 * MIB)]
                                                      for rank in range(4)})
    cluster = "topology: dgx-h100-cluster, nodes: 2"
    for dp in (2, 4):
        assert refusal_line(scenario(tmp_path, "traced_pp: 1", dp, cluster), tmp_path) == (
            f"{tmp_path / 'scenario.yaml'}:3: workload.dp: process group 'a' (ranks 0, 2) holds every 2nd "
            "data-parallel place of the traced job's 4 (TP 1 x CP 1 x PP 1 on 4 ranks), but no group holds every "
            "place or blocks of 2 consecutive ones, so the traced layout is in doubt (allowed: workload.traced_tp "
            "(and traced_cp, traced_pp): the traced job's layout, where the trace records no TP groups)")
    _, told = run(scenario(tmp_path, "traced_tp: 2", 4, cluster, fold=False), tmp_path)
    assert told.summary["simulated_ranks"] == 8


@pytest.mark.parametrize(("shards", "replicas", "found"), [
    (([0, 2], [1, 3], [4, 6], [5, 7]), ([0, 1], [2, 3], [4, 5], [6, 7]),
     "'shard0' (ranks 0, 2) is described as 'dp_shard' but holds every 2nd of the traced job's 4 data-parallel "
     "places (TP 1 x CP 1 x PP 2 on 8 ranks), as an HSDP replicate group does (widened)"),
    (([0], [1], [2], [3], [4], [5], [6], [7]), ([0, 1], [2, 3], [4, 5], [6, 7]),
     "'rep0' (ranks 0-1) is described as 'dp_replicate' but holds a block of 2 consecutive ones of the traced job's "
     "4 data-parallel places (TP 1 x CP 1 x PP 2 on 8 ranks), as an HSDP shard group does (copied)")])
def test_an_hsdp_group_whose_shape_contradicts_its_description_is_refused(tmp_path, shards, replicas, found):
    """HSDP groups are judged by shape (shard groups copied, replicate groups widened); a strided dp_shard group
    or a consecutive dp_replicate one says the traced layout is not what the replay reads, and is refused (the
    strided shard groups were widened and the consecutive replicate groups copied)."""
    hsdp_job(tmp_path, shards, replicas)
    text = scenario(tmp_path, "traced_pp: 2", 8, "topology: dgx-h100-cluster, nodes: 2")
    assert refusal_line(text, tmp_path) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.dp: process group {found} (allowed: shard groups over blocks of "
        "consecutive data-parallel places and replicate groups over every s-th (torchtitan's mesh order), or "
        "workload.traced_tp, traced_cp and traced_pp giving the traced job's layout)")


def test_a_replicated_job_too_big_for_the_cluster_is_refused_by_its_dp(tmp_path):
    knobs = job("tp_dp_pp", tmp_path)
    assert refusal_line(scenario(tmp_path, knobs, 16, "topology: dgx-h100-cluster, nodes: 2"), tmp_path) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.dp: dp 16 gives 64 ranks; the cluster has only 16 GPUs (allowed: "
        "a cluster of at least 64 GPUs)")


def test_the_bytes_a_gpu_sends_are_a_whole_number(tmp_path):
    """EP 4 x DP 8 on eight Kineto ranks (an all-to-all of 2 MiB per rank in [0-3] and [4-7], then an 8 MiB
    all-reduce in each data-parallel pair [i, i + 4]), replicated to dp 16 on two DGX H100: each pair widens to
    four ranks, whose NVLS all-reduce on 8 channels sends 1.5 x 8 MiB per GPU (on NCCL's count, 2 x 8 MiB, a sum
    without float noise). The flows' shares and the folded run's corrections summed to 12582911.999999998 bytes
    a GPU; the bytes sent are whole."""
    for rank in range(8):
        kernels = [("sm90_xmma_gemm_bf16", 500, 7, {})]
        kernels += [("ncclDevKernel_AllToAll_bf16", 100, 20, {
            "Collective name": "all_to_all", "In msg nelems": 1048576, "Out msg nelems": 1048576,
            "Process Group Name": f"ep{rank // 4}", "Process Group Ranks": str(list(range(rank // 4 * 4,
                                                                                          rank // 4 * 4 + 4)))}),
                    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 100, 20, {
                        "Collective name": "allreduce", "In msg nelems": 4194304, "Out msg nelems": 4194304,
                        "Process Group Name": f"dp{rank % 4}", "Process Group Ranks": str([rank % 4, rank % 4 + 4])})]
        events = [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": 1000 * number,
                   "dur": dur, "args": {"stream": stream, "dtype": "BFloat16", "Process Group Description": "undefined",
                                        **args}} for number, (name, dur, stream, args) in enumerate(kernels)]
        doc = {"distributedInfo": {"rank": rank, "world_size": 8}, "traceEvents": events}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(doc))
    text = (f"cluster: {{topology: dgx-h100-cluster, nodes: 2}}\ncollectives: {{channels: 8}}\n"
            f"workload: {{trace: '{tmp_path}/rank*.json', traced_ep: 4, traced_cp: 1, dp: 16}}\n")
    _, result = run(text, tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == 1.5 * 8 * MIB


def test_a_sum_of_bytes_is_snapped_to_a_whole_number_only_within_float_noise():
    """The snapping of the bytes a GPU sends moves float noise (2e-16 of the sum), at most 1e-12 of it: a real
    half byte of a sum below 5e11 bytes is kept."""
    from simulator.metrics.step import _whole_if_noise

    assert _whole_if_noise(12582911.999999998) == 12 * MIB
    assert _whole_if_noise(100.5) == 100.5
    assert _whole_if_noise(1e11 + 0.5) == 1e11 + 0.5
