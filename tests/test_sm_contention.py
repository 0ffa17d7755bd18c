"""Compute slowed while communication kernels hold SMs (engine/contention.py): closed forms of a kernel overlapped
for a known share of its time, no overlap leaves a run unchanged to the bit, NCCL's channel counts per kind of
collective, and the training step's summary of what the contention cost."""

from __future__ import annotations

import pytest

from simulator.engine.contention import NcclChannels
from simulator.errors import ScenarioError
from simulator.program.contention import SmShare
from simulator.program.ops import CollectiveOp, ComputeOp
from simulator.simulation import NetworkSettings, run_ops
from simulator.topology.loader import load_topology
from simulator.workload.calibrated import sm_share

SHARE = SmShare(sms=132, nvlink_channels=32, pcie_channels=2, network_channels=2, nvls_channels=16, max_channels=32)
KERNEL_S = 10e-3


def _ops(lead_s: float, nbytes: float, sms: int, sm_bound_share: float = 1.0) -> list:
    """Rank 0 computes one kernel of KERNEL_S; an all-reduce of ranks 0 and 1 (one host) starts once rank 1 has
    computed ``lead_s``, so it overlaps rank 0's kernel from ``lead_s`` on."""
    return [
        ComputeOp(id=0, rank=0, stream="compute", name="gemm", duration=KERNEL_S,
                  sm_bound_share=sm_bound_share),
        ComputeOp(id=1, rank=1, stream="compute", name="lead", duration=lead_s),
        CollectiveOp(id=2, rank=0, stream="comm", name="ar", op="all_reduce", group=(0, 1), nbytes=nbytes, key="ar",
                     sms=sms),
        CollectiveOp(id=3, rank=1, stream="comm", name="ar", op="all_reduce", group=(0, 1), nbytes=nbytes, key="ar",
                     deps=(1,), sms=sms),
    ]


def _run(ops, share: SmShare | None):
    result, _ = run_ops(load_topology("dgx-h100"), ops, NetworkSettings(), sm_share=share)
    frame = result.log.to_frame()
    row = lambda name: frame[(frame["name"] == name) & (frame["rank"] == 0)].iloc[0]  # noqa: E731
    return result, row("gemm"), row("ar")


def test_a_kernel_overlapped_for_part_of_its_time_takes_the_closed_form_longer():
    # 33 of 132 SMs held: the GEMM runs at 3/4 of its speed while the all-reduce runs, at full speed otherwise.
    result, gemm, ar = _run(_ops(2e-3, 256e6, sms=33), SHARE)
    overlap = ar["end_s"] - ar["start_s"]
    assert ar["start_s"] == pytest.approx(2e-3, rel=1e-12)
    assert ar["end_s"] < gemm["end_s"]  # the collective ends inside the kernel
    assert gemm["end_s"] - gemm["start_s"] == pytest.approx(KERNEL_S + overlap * 33 / 132, rel=1e-12)
    assert result.sm_lost_s == pytest.approx({"": overlap * 33 / 132}, rel=1e-12)


def test_a_kernel_inside_a_long_collective_runs_at_the_shared_rate_throughout_its_overlap():
    # The all-reduce outlasts the kernel: from 2 ms on the remaining 8 ms of work run at 3/4 speed.
    _, gemm, ar = _run(_ops(2e-3, 8e9, sms=33), SHARE)
    assert ar["end_s"] > gemm["end_s"]
    assert gemm["end_s"] == pytest.approx(2e-3 + 8e-3 / (99 / 132), rel=1e-12)


def test_no_overlap_changes_nothing_to_the_last_bit():
    # The collective starts after the kernel ends: the timelines with and without the model are identical.
    plain = _run(_ops(20e-3, 256e6, sms=33), None)[0].log.to_frame()
    shared, gemm, _ = _run(_ops(20e-3, 256e6, sms=33), SHARE)
    assert shared.log.to_frame().equals(plain)
    assert gemm["end_s"] == KERNEL_S
    assert shared.sm_lost_s == {}


def test_memory_bound_kernels_keep_their_speed():
    _, gemm, _ = _run(_ops(2e-3, 256e6, sms=33, sm_bound_share=0.0), SHARE)
    assert gemm["end_s"] == KERNEL_S


def test_a_block_part_memory_bound_slows_by_its_sm_bound_share():
    # SM-bound for 60% of its time: each overlapped nominal second takes 0.6 / 0.75 + 0.4 = 1.2 s.
    _, gemm, ar = _run(_ops(2e-3, 256e6, sms=33, sm_bound_share=0.6), SHARE)
    overlap = ar["end_s"] - ar["start_s"]
    assert gemm["end_s"] - gemm["start_s"] == pytest.approx(KERNEL_S + overlap * (1 - 1 / 1.2), rel=1e-12)


def test_nccl_channels_per_kind_of_collective():
    def counter(overrides):
        topology = load_topology("dgx-h100-cluster", {"nodes": 2, **overrides})
        return NcclChannels(SHARE, topology, lambda op: "ring" if op.algorithm == "auto" else op.algorithm)
    collective = lambda group, **kw: CollectiveOp(id=0, rank=group[0], stream="dp", name="c", group=group, **kw)  # noqa: E731
    channels = counter({})
    assert channels(collective(tuple(range(8)))) == 32  # NVLink: 2 per NVLink of 18, at most 32
    assert channels(collective((0, 8))) == 2  # one GPU per host: its NIC's 2 channels
    assert channels(collective((0, 1, 8, 9))) == 4  # two GPUs per host, each with its NIC
    assert channels(collective(tuple(range(16)))) == 16
    assert channels(collective(tuple(range(8)), algorithm="nvls")) == 16
    assert channels(collective((0, 8), sms=24)) == 24  # the program's own count (TP overlap) wins
    shared = counter({"nics_per_node": 2})  # four GPUs per NIC: the NICs, not the GPUs, set the count
    assert shared(collective((0, 1, 8, 9))) == 2
    assert shared(collective(tuple(range(16)))) == 4
    pcie = counter({"node": {"kind": "pcie_node"}})
    assert pcie(collective(tuple(range(8)))) == 2  # no NVLink inside the host
    assert pcie(collective(tuple(range(16)))) == 16
    with pytest.raises(ScenarioError, match="no SM count"):  # not silently without contention
        sm_share("v100")


def test_sm_shares_follow_the_published_sm_and_nvlink_counts(catalog_sources):
    # Every GPU's SMs as published, NCCL's NVLink channels (2 CTAs per NVLink, at most MAXCHANNELS) and its NVLS
    # channels by architecture (B200 held Hopper's 16, where NCCL runs 24 inside an NVLink domain).
    nccl = catalog_sources["nccl"]
    for gpu, sms in catalog_sources["sms"].items():
        share = sm_share(gpu)
        nvlink_channels = min(nccl["max_channels"], nccl["ctas_per_nvlink"] * catalog_sources["nvlinks"][gpu])
        assert (share.sms, share.nvlink_channels, share.max_channels) == (sms, nvlink_channels,
                                                                          nccl["max_channels"]), gpu
        assert share.nvls_channels == catalog_sources["nvls_channels"][gpu], gpu


STEP = """
cluster: {topology: dgx-h100-cluster, nodes: 4}
model: {layers: 8, hidden: 4096, heads: 32, kv_heads: 8, ffn_hidden: 14336, vocab: 32000, gated_mlp: true}
training: {seq_len: 4096, microbatches: 8, micro_batch: 1, precision: bf16}
parallelism: {tp: 8, pp: 2, dp: 2, sequence_parallel: true, tp_comm_overlap: true, zero: 1}
"""


def test_training_step_pays_for_overlapped_communication_and_says_what_it_cost(run_yaml):
    free = run_yaml(STEP, "collectives.sm_contention=none")
    paid = run_yaml(STEP)
    assert "sm_contention" not in free.summary
    lost = paid.summary["sm_contention"]
    # TP overlap (its kernels, and the SMs its GEMMs leave them when they do not run), DP buckets and pipeline
    # sends all cost some, and the step grows.
    grown = paid.summary["step_time_s"] - free.summary["step_time_s"]
    assert 0 < grown <= lost["total_compute_slowdown_s"] * (1 + 1e-9)  # the step grows by at most the compute lost
    assert set(lost["compute_slowdown_s"]) == {"tp", "reserved", "dp", "pp"}
    assert lost["total_compute_slowdown_s"] == pytest.approx(sum(lost["compute_slowdown_s"].values()), rel=1e-12)
    # Each rank's compute time grows by exactly what the summary says it lost.
    def compute_s(result):
        rows = result.timeline[result.timeline["kind"] == "compute"]
        return float((rows["end_s"] - rows["start_s"]).sum()) / result.summary["simulated_ranks"]
    assert compute_s(paid) - compute_s(free) == pytest.approx(lost["total_compute_slowdown_s"], rel=1e-9)


def test_folded_and_unfolded_agree_under_contention(run_yaml):
    folded = run_yaml(STEP)
    unfolded = run_yaml(STEP, "run.fold=false")
    assert folded.summary["step_time_s"] == pytest.approx(unfolded.summary["step_time_s"], rel=1e-12)
    assert folded.summary["sm_contention"]["compute_slowdown_s"] == pytest.approx(
        unfolded.summary["sm_contention"]["compute_slowdown_s"], rel=1e-9)


def test_a_step_without_overlapped_communication_is_unchanged_to_the_bit(run_yaml):
    # TP 8 alone without sequence parallelism: every collective blocks the compute stream, so no kernel ever runs
    # beside one (with it the backward re-gathers each block's input beside its input-gradient GEMMs).
    text = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 2048, microbatches: 2, micro_batch: 1}
parallelism: {tp: 8, sequence_parallel: false}
"""
    free = run_yaml(text, "collectives.sm_contention=none")
    paid = run_yaml(text)
    assert paid.timeline.equals(free.timeline)
    assert paid.summary["step_time_s"] == free.summary["step_time_s"]
    assert paid.summary["sm_contention"]["total_compute_slowdown_s"] == 0


def test_a_step_without_communication_loses_no_compute_seconds_as_a_float(run_yaml):
    """Nothing to contend with: the loss is 0.0 s, a float as in every other summary, not the int 0 of a sum of no
    terms."""
    lost = run_yaml("cluster: {topology: dgx-h100, gpus: 1}\nmodel: {preset: llama3-8b}\n"
                    "training: {seq_len: 1024, microbatches: 1}\n").summary["sm_contention"]
    assert lost == {"compute_slowdown_s": {}, "total_compute_slowdown_s": 0.0}
    assert isinstance(lost["total_compute_slowdown_s"], float)


SYNTHETIC_SENDS = """
cluster: {topology: dgx-h100}
model: {synthetic: {stages: 4, forward: 2 ms, backward: 4 ms, p2p_bytes: 256MiB}}
training: {microbatches: 8}
parallelism: {pp: 4, dp: 2, pipeline: {schedule: looped-bfs, virtual_stages: 2}}
"""


def test_the_compute_sends_stretch_is_a_loss_and_a_console_row(run_yaml):
    """A synthetic study's sends slow the forwards they overlap: the compute seconds lost are a share of the step
    among the losses, and the console prints them, as it does for every model."""
    import io

    from rich.console import Console

    from simulator.console.report import seconds_alike, training_table

    paid = run_yaml(SYNTHETIC_SENDS)
    lost_s = paid.summary["sm_contention"]["total_compute_slowdown_s"]
    step_s = paid.summary["step_time_s"]
    assert lost_s > 0.1 * step_s  # the 1 ms forwards beside a 256 MiB send and receive run ~1.35 ms
    shares = paid.summary["bottleneck"]["loss_shares"]
    assert shares["sm_contention"] == pytest.approx(lost_s / step_s, rel=1e-12)
    console = Console(file=io.StringIO(), width=400)
    console.print(training_table(paid.summary))
    rows = [" ".join(line.split()) for line in console.file.getvalue().splitlines()]
    assert [row for row in rows if row.startswith("SM contention")] == [
        f"SM contention {seconds_alike(lost_s)} compute lost per GPU ({100 * lost_s / step_s:.1f}%; "
        f"pp {seconds_alike(lost_s)})"]
    free = run_yaml(SYNTHETIC_SENDS, "collectives.sm_contention=none")
    assert "sm_contention" not in free.summary["bottleneck"]["loss_shares"]
