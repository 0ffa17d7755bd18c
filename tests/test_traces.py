"""Trace replay: Kineto and Chakra JSON traces become step programs whose compute keeps its traced durations
and whose collectives are re-costed on the simulated cluster.

Expected figures: a ring all-reduce sends 2(p-1)/p x n bytes per GPU (Patarasuk and Yuan 2009; NCCL's
busbw factor); the two-rank traces' all-reduce and transfer between two single-GPU hosts take the closed form
`transfer_s` (latency + bytes / (link rate x efficiency)); elsewhere a collective's time on an idle network is
`collectives.execute.time_collective`, the same model the engine runs, so a re-costed trace must move by exactly
the difference of two such times.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pandas as pd
import pytest
from shared import (
    ALLREDUCE_BYTES,
    DATA,
    EVEN,
    EXACT,
    KINETO_2RANK,
    MESH,
    MIB,
    NCCL_SIMPLE_BASE_S,
    SCENARIOS,
    SEQ_2RANK,
    UNEVEN,
    all_to_all_2rank,
    allreduce_time,
    chakra_job,
    chakra_scenario,
    chakra_step,
    comms_args,
    copy_traces,
    cpu_only_profile,
    launched,
    p2p_job,
    p2p_node,
    run,
    seq_args,
    transfer_s,
    two_host_chakra_job,
    two_rank_scenario,
)

from simulator import load_scenario, simulate
from simulator.cli import main
from simulator.collectives.execute import time_collective
from simulator.config.loader import scenario_from_text
from simulator.errors import ScenarioError, TraceError
from simulator.simulation import network_settings
from simulator.topology.loader import scenario_topology
from simulator.workload.traces.kineto import read_kineto
from simulator.workload.traces.layout import TracedSizes, Transfer, dimensions
from simulator.workload.traces.model import ProcessGroup

CHAKRA_2RANK = SCENARIOS / "traces" / "chakra-2rank"


def refusal(text: str, folder: Path) -> ScenarioError:
    """The one-line refusal `run` of ``text`` in ``folder`` raises (the test fails if it runs)."""
    with pytest.raises(ScenarioError) as caught:
        run(text, folder)
    return caught.value


def test_two_rank_allreduce_is_recosted_and_a_slower_network_adds_exactly_its_extra_time(tmp_path):
    _, fast = run(two_rank_scenario("100 Gb/s"), tmp_path)
    _, slow = run(two_rank_scenario("25 Gb/s"), tmp_path)
    # a two-rank ring all-reduce: NCCL's base latency of a Simple ring (8.4 us), then a reduce-scatter step and an
    # all-gather step, each sending n / 2 both ways: 2.892 and 11.459 ms
    fast_ar, slow_ar = (NCCL_SIMPLE_BASE_S + 2 * transfer_s(rate, ALLREDUCE_BYTES / 2) for rate in (100e9, 25e9))
    # rank 1's GEMM (1100 us) gates the all-reduce, the optimizer kernel (200 us) follows it
    assert fast.summary["step_time_s"] == pytest.approx(1100e-6 + fast_ar + 200e-6, rel=EXACT)
    assert slow.summary["step_time_s"] - fast.summary["step_time_s"] == pytest.approx(slow_ar - fast_ar, rel=EXACT)
    assert fast.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(ALLREDUCE_BYTES, rel=EXACT)
    assert fast.summary["trace"]["traced_step_time_s"] == pytest.approx(4000e-6, rel=EXACT)


def test_kineto_streams_are_named_streams_in_the_timeline_and_the_trace(tmp_path):
    """Kineto numbers CUDA streams (`args.stream` 7 and 20 in these traces): the replay names them `stream 7`,
    so the trace's threads read `GPU 0 stream 7`; they read `GPU 0 7`, a number a user could not place."""
    out = tmp_path / "out"
    assert main(["run", str(SCENARIOS / "trace-allreduce-2rank.yaml"), "--out", str(out), "--quiet"]) == 0
    streams = set(pd.read_parquet(out / "timeline.parquet").query("kind != 'flow'")["stream"])
    assert streams == {"stream 7", "stream 20"}
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    threads = sorted(e["args"]["name"] for e in events if e["name"] == "thread_name")
    assert threads == ["GPU 0 stream 20", "GPU 0 stream 7", "GPU 1 stream 20", "GPU 1 stream 7"]


def test_trace_replicated_to_dp64_sends_the_ring_all_reduce_traffic(tmp_path):
    loaded, result = run(two_rank_scenario("100 Gb/s", dp=", dp: 64", nodes=64), tmp_path)
    p = 64
    assert result.summary["gpus"] == p
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(2 * (p - 1) / p * ALLREDUCE_BYTES, rel=EXACT)
    assert result.summary["step_time_s"] == pytest.approx(1100e-6 + allreduce_time(loaded, ALLREDUCE_BYTES, p)
                                                          + 200e-6, rel=EXACT)
    assert result.summary["simulated_ranks"] == 2 and result.summary["folded"] is True


def test_tokens_and_model_flops_give_throughput_and_mfu(tmp_path):
    knobs = ", dp: 64, tokens_per_step: 16384, model_flops_per_token: 4.8e10"
    _, result = run(two_rank_scenario("100 Gb/s", dp=knobs, nodes=64), tmp_path)
    step, tokens = result.summary["step_time_s"], 16384 * 64 / 2  # the traced 2-rank job's tokens, 32 times
    assert result.summary["tokens_per_s"] == pytest.approx(tokens / step, rel=EXACT)
    peak = 312e12  # A100 dense bf16 (the cluster's GPU), vendor datasheet
    assert result.summary["mfu"] == pytest.approx(tokens * 4.8e10 / 64 / step / peak, rel=EXACT)


def test_rates_a_trace_states_nothing_for_are_null_not_zero(tmp_path):
    """Without tokens the throughput and the model FLOP rates are unknown, null (as `hfu` without shapes), not
    the 0.0 a script averaging `mfu` over trace runs would take as measured; tokens alone give throughput."""
    _, untold = run(two_rank_scenario("100 Gb/s"), tmp_path)
    assert [untold.summary[key] for key in ("tokens_per_s", "tflops_per_gpu", "mfu")] == [None, None, None]
    _, tokens_only = run(two_rank_scenario("100 Gb/s", dp=", tokens_per_step: 8192"), tmp_path)
    assert tokens_only.summary["tokens_per_s"] == pytest.approx(8192 / tokens_only.summary["step_time_s"], rel=EXACT)
    assert tokens_only.summary["tflops_per_gpu"] is None and tokens_only.summary["mfu"] is None


def test_an_mfu_above_100_percent_is_warned_about(tmp_path):
    """Replicated or not, each GPU keeps its traced work and tokens scale with the GPUs, so MFU is right by
    construction; above 100% it showed with no warning, though the tokens or FLOPs given must be wrong."""
    knobs = ", dp: 8, tokens_per_step: 16384, model_flops_per_token: {}"
    _, claimed = run(two_rank_scenario("100 Gb/s", dp=knobs.format(4.8e10), nodes=8), tmp_path)
    assert claimed.summary["mfu"] > 1
    assert [warning.split(":")[0] for warning in claimed.summary["warnings"]] == [
        f"MFU {claimed.summary['mfu']:.0%} is above 100%"]
    assert "workload.tokens_per_step x model_flops_per_token" in claimed.summary["warnings"][0]
    plausible = 4.8e10 / claimed.summary["mfu"] / 2  # the same step at half the peak
    _, result = run(two_rank_scenario("100 Gb/s", dp=knobs.format(plausible), nodes=8), tmp_path)
    assert result.summary["mfu"] == pytest.approx(0.5, rel=EXACT) and result.summary["warnings"] == []


def test_unfolded_replication_agrees_with_folded(tmp_path):
    _, folded = run(two_rank_scenario("100 Gb/s", dp=", dp: 8", nodes=8), tmp_path)
    _, unfolded = run(two_rank_scenario("100 Gb/s", dp=", dp: 8", nodes=8, extra="run: {fold: false}\n"), tmp_path)
    assert unfolded.summary["simulated_ranks"] == 8
    assert unfolded.summary["step_time_s"] == pytest.approx(folded.summary["step_time_s"], rel=EXACT)
    assert unfolded.summary["traffic_bytes_per_gpu"] == pytest.approx(folded.summary["traffic_bytes_per_gpu"],
                                                                       rel=EXACT)


MOVED_MEMORY = 3.35e12 * 0.88 / (2.039e12 * 0.88)
"""HBM bandwidth x memory fraction, H100 SXM over A100 80GB (vendor datasheets, kernels.yaml memory.fraction)."""
RAMP_S = 2e-6
"""The H100's and the A100's ramp of every kernel kind (kernels.yaml <gemm|attention|memory>.ramp_time_s): launch and
tail, which no rate shortens."""
MOVED_ADAM_S = RAMP_S + (200e-6 - RAMP_S) * MOVED_MEMORY
"""The two-rank trace's Adam kernel (200 us on the H100) on the A100: its time beyond the H100's ramp
(kernels.yaml memory.ramp_time_s, 2 us) streams, moved by MOVED_MEMORY; the ramp is launch and tail, unmoved."""


def moved_gemm_s(ratio: float) -> float:
    """Rank 1's GEMM (1100 us on the H100) on the A100: its time beyond the ramp moved by ``ratio``."""
    return RAMP_S + (1100e-6 - RAMP_S) * ratio


def test_a_trace_moved_to_another_gpu_scales_each_kernel_by_what_bounds_it(tmp_path):
    """An H100 trace replayed on the A100 80GB: its GEMMs by the calibrated matmul plateaus (kernels.yaml: achievable x
    sustained clock), its Adam kernel by HBM bandwidth x memory fraction, not both by the dense bf16 peaks (3.17x),
    which would overstate the optimizer's slowdown."""
    loaded, result = run(two_rank_scenario("100 Gb/s", dp=", traced_gpu: h100-sxm"), tmp_path)
    matmul = 989e12 * 0.803 * 0.848 / (312e12 * 0.869 * 0.926)  # dense bf16 x achievable x sustained clock
    assert result.summary["trace"]["compute_scale"] == 1.0
    classes = result.summary["trace"]["gpu_move"]["classes"]
    assert [rates["precision"] for rates in classes["matmul"]["rates"]] == ["bf16"]
    assert classes["matmul"]["rates"][0]["duration_ratio"] == pytest.approx(matmul, rel=EXACT)
    assert classes["memory-bound"]["rates"][0]["duration_ratio"] == pytest.approx(MOVED_MEMORY, rel=EXACT)
    assert {kind: entry["ops"] for kind, entry in classes.items()} == {"matmul": 2, "attention": 0,
                                                                       "memory-bound": 2, "unknown": 0}
    # rank 1's GEMM (1100 us) gates the all-reduce, the optimizer kernel (200 us) follows it
    expected = moved_gemm_s(matmul) + MOVED_ADAM_S + allreduce_time(loaded, ALLREDUCE_BYTES, 2)
    assert result.summary["step_time_s"] == pytest.approx(expected, rel=EXACT)


FP32_GEMM = {"name": "volta_sgemm_128x64_nn"}
FP32_OPERANDS = {"args": {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["float", "float"]}}


@pytest.mark.parametrize("kernel, launcher", [(FP32_GEMM, {}), ({}, FP32_OPERANDS)],
                         ids=["named sgemm", "launched by an fp32 aten::mm"])
def test_a_moved_fp32_gemm_takes_the_fp32_peaks(tmp_path, kernel, launcher):
    """Every GEMM moved by the bf16 plateaus, 2.68x from the H100 SXM to the A100, though an fp32 one runs on the
    CUDA cores, 67 against 19.5 TFLOP/s: its precision is its launching op's `Input type`, else its name's."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    edit_event(traces / "rank1.json", 2, **kernel)  # rank 1's GEMM (1100 us), which gates the all-reduce
    edit_event(traces / "rank1.json", 0, **launcher)  # the aten::mm that launched it
    text = two_rank_scenario("100 Gb/s", dp=", traced_gpu: h100-sxm").replace(str(KINETO_2RANK), str(traces))
    loaded, result = run(text, tmp_path)
    fp32 = 67e12 * 0.803 * 0.848 / (19.5e12 * 0.869 * 0.926)  # fp32 peak x the (bf16) achievable x sustained clock
    if launcher:  # its recorded 4096^3 shape: 512 tiles of 256x128 in 5 waves of the A100's 108 SMs
        fp32 *= 540 / 512
    rates = result.summary["trace"]["gpu_move"]["classes"]["matmul"]["rates"]
    assert [(entry["precision"], entry["ops"]) for entry in rates] == [("bf16", 1), ("fp32", 1)]
    assert rates[1]["duration_ratio"] == pytest.approx(fp32, rel=EXACT)
    expected = moved_gemm_s(fp32) + MOVED_ADAM_S + allreduce_time(loaded, ALLREDUCE_BYTES, 2)
    assert result.summary["step_time_s"] == pytest.approx(expected, rel=EXACT)


@pytest.mark.parametrize("dims", [[[0, 4096], [4096, 1408]], [[2560, 4096], [4096, -1]], [[2560, 0], [0, 1408]]],
                         ids=["no rows", "negative columns", "empty reduction"])
def test_a_gemm_whose_recorded_shape_has_an_empty_side_moves_by_the_plateaus(tmp_path, dims):
    """A recorded matrix multiply with a side of 0 (or less) has no output to cut into waves: moved to an A100 it
    crashed with a ZeroDivisionError traceback (no tiles, so no waves), and an empty reduction (k = 0) took the
    waves of an output it never computed (rank 1's 1,100 us GEMM moved to 5.84 ms, not 2.97 ms). Such a shape is
    no shape, as an attention op's key with a side <= 0 is: the GEMM moves by the plateaus' ratio."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    edit_event(traces / "rank1.json", 0, args={"Input Dims": dims, "Input type": ["c10::BFloat16"] * 2})
    text = two_rank_scenario("100 Gb/s", dp=", traced_gpu: h100-sxm").replace(str(KINETO_2RANK), str(traces))
    loaded, result = run(text, tmp_path)
    matmul = 989e12 * 0.803 * 0.848 / (312e12 * 0.869 * 0.926)  # dense bf16 x achievable x sustained clock
    rates = result.summary["trace"]["gpu_move"]["classes"]["matmul"]["rates"]
    assert [("shape" in entry, entry["ops"]) for entry in rates] == [(False, 2)]
    expected = moved_gemm_s(matmul) + MOVED_ADAM_S + allreduce_time(loaded, ALLREDUCE_BYTES, 2)
    assert result.summary["step_time_s"] == pytest.approx(expected, rel=EXACT)


TF32_KERNELS = ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32",
                "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x256_16x3_nn_align4>"
                "(cutlass_80_tensorop_s1688gemm_128x256_16x3_nn_align4::Params)",
                "sm80_xmma_gemm_tf32f32_tf32f32_f32_nn_n_tilesize128x128x16")
"""TF32 GEMM kernels as real profiles name them; CUTLASS's fp32-input s1688gemm says tf32 nowhere."""


@pytest.mark.parametrize("name", TF32_KERNELS)
@pytest.mark.parametrize("dtype", ["float", ""], ids=["fp32 aten::mm", "no Input type"])
def test_a_moved_tf32_gemm_takes_the_tf32_peaks(name, dtype):
    """An fp32 matmul under allow_tf32 runs a tensor-core TF32 kernel, but its `Input type` float won and the
    move took the fp32 CUDA-core peaks: 0.962 from the H100 SXM to the B200 (67 against 75 TFLOP/s) where the
    tf32 peaks, at the calibrated bf16 plateau (tf32 has no `gemm.achievable` of its own), give 0.484. A kernel
    whose name says tf32, or CUTLASS's tensorop s1688gemm on fp32 inputs, is bounded at tf32."""
    from simulator.catalog.gpus import GPUS
    from simulator.workload.traces.gpu_move import GpuMove
    from simulator.workload.traces.model import TracedOp

    h100, b200 = GPUS["h100-sxm"], GPUS["b200"]
    move = GpuMove(1.0, h100, b200)
    op = TracedOp(0, name, "7", "compute", 0.0, 1e-3, dtype=dtype)
    # tf32 dense peaks x the bf16 plateau (tf32 has no MAMF of its own): kernels.yaml's achievable x sustained
    # clock, H100 SXM 0.803 x 0.848 (mamf-v2, msmf-h200-transfer), B200 0.776 x 0.815 (mamf-v2, msmf)
    tf32 = 494.5e12 * 0.803 * 0.848 / (1100e12 * 0.776 * 0.815)
    assert tf32 == pytest.approx(0.484, abs=5e-4)
    assert move.bound(op).precision == "tf32"
    # the B200's ramp (8 us, fitted on its GEMMs) replaces the H100's (2 us) on the time beyond it
    assert move.duration(op) == pytest.approx(8e-6 + (1e-3 - 2e-6) * tf32, rel=EXACT)


@pytest.mark.parametrize("cluster, short, long", [("a100-80gb", 1e-6, 2e-6 + 98e-6 * 2.682),
                                                   ("b200", 4e-6, 8e-6 + 98e-6 * 0.473)])
def test_a_moved_gemm_keeps_its_ramp_and_moves_the_time_beyond_it(cluster, short, long):
    """The roofline runs every kernel for its time at its rate plus its GPU's ramp (2 us; the B200's 8 us, fitted on its
    GEMMs). A bf16 GEMM of 100 us moved from the H100 SXM keeps the ramp, the cluster GPU's, and moves the 98 us
    beyond it by the matmul ratio; one of 1 us, all launch and tail, scales by the two ramps (1 us to the A100, 4 us
    to the B200)."""
    from simulator.catalog.gpus import GPUS
    from simulator.workload.traces.gpu_move import GpuMove
    from simulator.workload.traces.model import TracedOp

    gemm = "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NTN"
    move = GpuMove(1.0, GPUS["h100-sxm"], GPUS[cluster])
    ratio = move.ratio(move.bound(TracedOp(0, gemm, "7", "compute", 0.0, 1e-6)))
    durations = [move.duration(TracedOp(0, gemm, "7", "compute", 0.0, d)) for d in (1e-6, 100e-6)]
    ramp = 8e-6 if cluster == "b200" else 2e-6
    assert durations == pytest.approx([short, ramp + 98e-6 * ratio], rel=EXACT)
    assert durations[1] == pytest.approx(long, rel=1e-3)


@pytest.mark.parametrize("traced, cluster", [("h100-sxm", "a100-80gb"), ("a100-80gb", "h100-sxm")])
def test_a_gemm_moved_to_or_from_an_a100_takes_its_shapes_waves(traced, cluster):
    """The A100's GEMM kernels run one 256x128 (or 128x256) tile per SM in waves of 108 (kernels.yaml gemm.waves,
    the guide's wave quantization): a bf16 GEMM of 2,560 x 1,408 output cuts into 110 tiles, two waves of which the
    second holds 2 tiles, so it fills 2,560 x 1,408 / (216 x 256 x 128) = 0.509 of the slots. Moved with its
    recorded shape, its time beyond the ramp takes the ratio of the two GPUs' modelled plateaus for that shape,
    waves included, the modelled step's own GEMM time less its ramp; one of 2,304 x 1,536 output (108 tiles, one
    full wave) takes the plateaus' ratio."""
    from simulator.catalog.gpus import GPUS
    from simulator.workload.calibrated import calibrated_efficiency
    from simulator.workload.roofline import kernel_duration
    from simulator.workload.traces.gpu_move import GpuMove
    from simulator.workload.traces.model import TracedOp
    from simulator.workload.transformer import Kernel

    move = GpuMove(1.0, GPUS[traced], GPUS[cluster])
    plateaus = 989e12 * 0.803 * 0.848 / (312e12 * 0.869 * 0.926)  # dense bf16 x achievable x sustained clock
    waves = 2560 * 1408 / (2 * 108 * 256 * 128)
    assert waves == pytest.approx(0.509, abs=5e-4)
    expected = plateaus / waves if cluster.startswith("a100") else waves / plateaus
    name = "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NTN"

    def moved(shape: tuple[int, int, int, int]) -> float:
        op = TracedOp(0, name, "7", "compute", 0.0, 1e-3, gemm=shape, dtype="c10::BFloat16")
        return move.duration(op)

    assert moved((1, 2560, 1408, 4096)) == pytest.approx(2e-6 + 998e-6 * expected, rel=EXACT)
    assert moved((1, 2304, 1536, 4096)) == pytest.approx(2e-6 + 998e-6 * plateaus ** (1 if traced == "h100-sxm"
                                                                                        else -1), rel=EXACT)
    modelled = [kernel_duration(Kernel("gemm", 2.0 * 2560 * 1408 * 4096, 2 * (2560 * 4096 + 4096 * 1408
                                                                            + 2560 * 1408), "matmul", 1408,
                                       output=(1, 2560, 1408)), GPUS[gpu], "bf16", calibrated_efficiency(gpu)) - 2e-6
                for gpu in (traced, cluster)]
    assert modelled[1] / modelled[0] == pytest.approx(expected, rel=EXACT)
    rates = move.details([TracedOp(0, name, "7", "compute", 0.0, 1e-3, gemm=(1, 2560, 1408, 4096),
                                   dtype="c10::BFloat16")])["classes"]["matmul"]["rates"]
    assert [rate["shape"] for rate in rates] == [[1, 2560, 1408, 4096]]
    assert rates[0]["duration_ratio"] == pytest.approx(expected, rel=EXACT)


def test_a_gemm_recosted_on_an_a100_takes_its_shapes_waves():
    """`recost_gemms` gives a traced GEMM of recorded shape the kernel model's time on the cluster's GPU, but built
    its kernel without the output, so on an A100 a GEMM filling 0.509 of two waves (2,560 x 1,408, 110 tiles of
    256x128 on 108 SMs) ran as if it filled them: 126.4 us, against the modelled step's 246.3 us."""
    from simulator.catalog.gpus import get_gpu
    from simulator.workload.calibrated import calibrated_efficiency
    from simulator.workload.roofline import kernel_duration
    from simulator.workload.traces.program import gemm_duration
    from simulator.workload.transformer import Kernel

    a100 = get_gpu("a100-80gb")
    modelled = Kernel("gemm", 2.0 * 2560 * 1408 * 4096, 2 * (2560 * 4096 + 4096 * 1408 + 2560 * 1408), "matmul",
                      1408, output=(1, 2560, 1408))
    expected = kernel_duration(modelled, a100, "bf16", calibrated_efficiency("a100-80gb"))
    assert gemm_duration((1, 2560, 1408, 4096), "bf16", a100) == pytest.approx(expected, rel=EXACT)
    efficiency = calibrated_efficiency("a100-80gb")
    plateau = 312e12 * efficiency.matmul_peak * 1408 / (1408 + 64) * 2560 * 1408 / (2 * 108 * 256 * 128)
    assert expected == pytest.approx(modelled.flops / plateau + 2e-6, rel=EXACT)


@pytest.mark.parametrize("name, ratio", [("Memset (Device)", (3.35e12 * 0.88) / (7.7e12 * 0.88)),
                                         ("sdpa_sm90_flash_fprop", None), ("some_unnamed_kernel", 989 / 2250)],
                         ids=["memory-bound", "attention", "unknown"])
def test_only_a_moved_gemm_takes_the_b200s_ramp_fitted_on_gemms(name, ratio):
    """kernels.yaml's B200 ramp, 8 us, was fitted on cuBLAS GEMM timings alone (gemm-shapes); no source times a B200
    memory-bound, attention or other kernel's launch and tail, so a kernel of those classes moved from the H100 SXM
    to a B200 keeps the 2 us ramp every GPU takes unfitted: one of 1 us stays 1 us, one of 100 us takes 2 us plus
    its 98 us beyond the ramp moved by its class's ratio (HBM bandwidth x memory fraction, 3.35 against 7.7 TB/s; the
    bf16 peaks, 989 against 2,250 TFLOP/s)."""
    from simulator.catalog.gpus import GPUS
    from simulator.workload.traces.gpu_move import GpuMove
    from simulator.workload.traces.model import TracedOp

    move = GpuMove(1.0, GPUS["h100-sxm"], GPUS["b200"])
    op = TracedOp(0, name, "7", "compute", 0.0, 100e-6)
    ratio = ratio or move.ratio(move.bound(op))
    durations = [move.duration(TracedOp(0, name, "7", "compute", 0.0, d)) for d in (1e-6, 100e-6)]
    assert durations == pytest.approx([1e-6, 2e-6 + 98e-6 * ratio], rel=EXACT)
    assert move.ramps(move.bound(op).kind) == (2e-6, 2e-6) and move.ramps("matmul") == (2e-6, 8e-6)


DISTINCT_RAMPS_S = {"h100-sxm": {"gemm": 1e-6, "attention": 3e-6, "memory": 5e-6},
                    "h200": {"gemm": 2e-6, "attention": 7e-6, "memory": 11e-6}}
"""kernels.yaml ramps of each section, none equal to another, for a catalog built in a test: every attention and
memory ramp the real one holds is 2 us, so a mix-up of kinds changes no figure."""


@pytest.fixture
def distinct_ramps(monkeypatch):
    """The catalog with DISTINCT_RAMPS_S in place of the H100 SXM's and the H200's ramps, read through
    calibrated_efficiency as kernels.yaml is (its cache emptied before and after, so no other test sees them)."""
    import copy

    from simulator.workload import calibrated

    data = dict(calibrated.kernel_data())
    data["gpus"] = dict(data["gpus"])
    for gpu, ramps in DISTINCT_RAMPS_S.items():
        entry = data["gpus"][gpu] = copy.deepcopy(data["gpus"][gpu])
        for section, ramp in ramps.items():
            entry[section]["ramp_time_s"] = ramp
    monkeypatch.setattr(calibrated, "kernel_data", lambda: data)
    calibrated.calibrated_efficiency.cache_clear()
    yield
    calibrated.calibrated_efficiency.cache_clear()


def test_each_kernel_kind_takes_its_own_sections_ramp_modelled_and_moved(distinct_ramps):
    """kernels.yaml's gemm, attention and memory ramps are the roofline's matmul, attention and elementwise ramps,
    in the modelled step and in a moved trace (matmul, attention and memory-bound classes; a kernel of unknown
    kind the unmeasured 2 us). Every attention and memory ramp the catalog holds is 2 us, so swapping two kinds
    anywhere on the way passed every test; with a ramp of its own for each kind, a modelled H200 kernel takes its
    time at its plateau plus its kind's ramp, and a kernel moved from the H100 SXM to the H200 takes the H200's
    ramp of its kind plus its time beyond the H100's ramp of that kind moved by its ratio."""
    from simulator.catalog.gpus import GPUS
    from simulator.workload.calibrated import calibrated_efficiency
    from simulator.workload.roofline import attention_plateau
    from simulator.workload.stage_work import CostContext
    from simulator.workload.traces.gpu_move import GpuMove
    from simulator.workload.traces.model import TracedOp
    from simulator.workload.transformer import Kernel

    h100, h200 = GPUS["h100-sxm"], GPUS["h200"]
    efficiency = calibrated_efficiency("h200")
    gemm = Kernel("gemm", 2.0 * 4096**3, 3 * 2.0 * 4096**2, "matmul", 4096)
    attention = Kernel("attention", 1e12, 1e6, "attention", 2048)
    copy = Kernel("copy", 0.0, 1e8, "elementwise")
    at_plateau = {gemm: gemm.flops / (h200.peak("bf16") * efficiency.matmul_peak * 4096 / (4096 + 64)),
                  attention: attention.flops / (h200.peak("bf16") * attention_plateau(efficiency, 2048, False)),
                  copy: copy.hbm_bytes / (h200.hbm_bandwidth * efficiency.memory_peak)}
    modelled = {kernel: CostContext(h200, "bf16", efficiency).seconds((kernel,)) for kernel in at_plateau}
    assert modelled == pytest.approx({gemm: at_plateau[gemm] + 2e-6, attention: at_plateau[attention] + 7e-6,
                                      copy: at_plateau[copy] + 11e-6}, rel=EXACT)
    move = GpuMove(1.0, h100, h200)
    names = {"matmul": "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "attention": "sdpa_sm90_flash_fprop",
             "memory-bound": "Memset (Device)", "unknown": "some_unnamed_kernel"}
    ramps = {"matmul": (1e-6, 2e-6), "attention": (3e-6, 7e-6), "memory-bound": (5e-6, 11e-6),
             "unknown": (2e-6, 2e-6)}
    for kind, name in names.items():
        op = TracedOp(0, name, "7", "compute", 0.0, 100e-6)
        ramp, cluster_ramp = ramps[kind]
        assert move.bound(op).kind == kind and move.ramps(kind) == ramps[kind]
        assert move.duration(op) == pytest.approx(cluster_ramp + (100e-6 - ramp) * move.ratio(move.bound(op)),
                                                  rel=EXACT)
        within = TracedOp(0, name, "7", "compute", 0.0, ramp / 2)
        assert move.duration(within) == pytest.approx(cluster_ramp / 2, rel=EXACT)
        assert move.details([op])["classes"][kind]["ramp_time_s"] == {"from": ramp, "to": cluster_ramp}


@pytest.mark.parametrize("name", ["cutlass_tensorop_s1688gemm_f16_256x128_32x2_nn_align8",
                                  "cutlass_75_tensorop_s1688gemm_bf16_64x64_tn_align1"])
def test_a_half_precision_s1688gemm_is_not_taken_for_tf32(name):
    """CUTLASS names the input type of a half-precision s1688gemm (_f16, _bf16): its math is not TF32."""
    from simulator.workload.traces.gpu_move import gemm_precision
    from simulator.workload.traces.model import TracedOp

    assert gemm_precision(TracedOp(0, name, "7", "compute", 0.0, 1e-3)) == "bf16"


def test_an_fp8_gemm_moved_to_a_gpu_without_fp8_is_refused(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    edit_event(traces / "rank1.json", 2, name="sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128")
    text = two_rank_scenario("100 Gb/s", dp=", traced_gpu: h100-sxm").replace(str(KINETO_2RANK), str(traces))
    error = refusal(text, tmp_path)
    assert error.field == "cluster.gpu_model"
    assert "GPU 'a100-80gb' has no fp8 peak for the trace's fp8 GEMM kernels" in str(error)
    assert error.allowed == "a GPU with one: h100-sxm, h200, b200, gb200"


def test_chakra_two_ranks_recost_allreduce_and_send(tmp_path):
    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{CHAKRA_2RANK}/rank*.json', format: chakra-json}}\n"
    loaded, result = run(text, tmp_path)
    topology = scenario_topology(loaded)
    settings = network_settings(loaded, topology)
    common = {"efficiency": dict(settings.efficiency), "chunk_bytes": settings.chunk_bytes,
              "channels": settings.channels}
    all_reduce = time_collective(topology, "all_reduce", "auto", 2, 64 * 2**20, **common)
    transfer = time_collective(topology, "send_recv", "auto", 2, 8 * 2**20, **common)
    # rank 1's compute (1750 us) gates the all-reduce; optimizer 400 us; the transfer; 100 us after it
    assert result.summary["step_time_s"] == pytest.approx(1750e-6 + all_reduce + 400e-6 + transfer + 100e-6,
                                                          rel=EXACT)
    # the send 0 -> 1 reads as two pipeline stages of one rank, leaving no data parallelism: the all-reduce over
    # both stages counts as pp (2 x 1/2 x 64 MiB per GPU), as the traced dp of 1 and workload.dp's refusal say
    traffic = result.summary["traffic_bytes_per_gpu"]
    assert traffic["pp"] == pytest.approx(64 * 2**20 + 8 * 2**20 / 2, rel=EXACT) and traffic["dp"] == 0
    assert result.summary["trace"]["traced_dp"] == 1
    assert result.summary["bottleneck"]["largest_loss"]["name"] == "exposed_pp_comm"
    # an inference, not a declaration: the run says so, naming what declares it
    assert result.summary["warnings"] == [
        "the traced job's pipeline stages are inferred from its transfer from rank 0 to rank 1, not declared: 2 stages "
        "of 1 rank, so process group '0' (2 ranks) counts as pp; set workload.traced_pp to the traced job's stages "
        "(1 where it has no pipeline and the transfer is no pipeline hand-off)"]


def test_the_bundled_chakra_scenario_declares_its_data_parallel_job_and_its_gradients_count_as_dp(tmp_path):
    """Its all-reduce is the gradients' (the trace names it so), which read as pp from the send's two "stages"
    would be exposed pp communication; declared `traced_pp: 1`, it is dp, the send pp, with no warning."""
    loaded = load_scenario(SCENARIOS / "trace-chakra-2rank.yaml")
    assert loaded.scenario.workload.traced_pp == 1
    summary = simulate(loaded).summary
    assert summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(64 * 2**20, rel=EXACT)
    assert summary["traffic_bytes_per_gpu"]["pp"] == pytest.approx(8 * 2**20 / 2, rel=EXACT)
    assert summary["trace"]["traced_dp"] == 2 and summary["warnings"] == []


def rank_five(folder: Path, **info) -> Path:
    """The bundled rank 0's trace, its distributedInfo saying rank 5 (and ``info``) instead."""
    path = folder / "rank5.json"
    doc = json.loads((KINETO_2RANK / "rank0.json").read_text())
    doc["distributedInfo"] = {key: value for key, value in {**doc["distributedInfo"], "rank": 5, **info}.items()
                              if value is not None}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(("info", "message"), [
    ({}, "{path}: distributedInfo.rank: rank 5 is not one of the traced job's 2 ranks (distributedInfo.world_size) "
         "(allowed: a rank from 0 to 1)"),
    ({"world_size": None}, "{path}: traceEvents[8]: rank 5 runs a collective of group '0' whose members [0, 1] do "
                           "not include it (allowed: the traces of the group's members; a file's rank is its "
                           "distributedInfo.rank (Kineto), else its place in the file order, from 0)"),
])
def test_a_file_of_a_rank_outside_its_job_says_so_in_one_line(tmp_path, capsys, info, message):
    """A single file stating rank 5 of a 2-rank job: with the world size stated, the file's own rank is named;
    without it, the all-reduce whose group [0, 1] leaves rank 5 out is (compute alone would have replayed it as
    rank 5 of a 6-rank job)."""
    path = rank_five(tmp_path, **info)
    (tmp_path / "scenario.yaml").write_text(f"cluster: {{topology: ethernet-100g, nodes: 8}}\n"
                                            f"workload: {{trace: '{path}'}}\n")
    assert main(["run", str(tmp_path / "scenario.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {message.format(path=path)}\n"
    assert not (tmp_path / "out").exists()


def distributed_info(path: Path, **info) -> None:
    """Set (None: remove) fields of the `distributedInfo` of the Kineto trace at ``path``."""
    doc = json.loads(path.read_text())
    doc["distributedInfo"] = {key: value for key, value in {**doc["distributedInfo"], **info}.items()
                              if value is not None}
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(("traced", "named"), [
    ((0, 1, 3), "rank 2 of the traced job's 4 has no trace, between traced ranks 0-1, 3 (a file missing from "
                "workload.trace?): the traced process groups or transfers reach rank 2, taken as ready"),
    ((0, 1, 2), "rank 3 of the traced job's 4 has no trace, beside traced ranks 0-2: the traced process groups or "
                "transfers reach rank 3, taken as ready"),
])
def test_a_rank_missing_from_the_traced_set_that_a_traced_group_reaches_warns_naming_it(tmp_path, traced, named):
    """Files of three ranks of a 4-rank job (world_size 4; seq-2rank's two traces twice), each rank all-reducing
    with its data-parallel partner ([0, 2], [1, 3]): the missing file is named in one line, a hole between traced
    ranks as a file perhaps missing from the set, the last rank as taken as ready."""
    dp_partner_traces(tmp_path, traced)
    _, result = run(f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{tmp_path}/rank*.json'}}\n", tmp_path)
    assert [line for line in result.summary["warnings"] if "no trace" in line] == [
        f"{tmp_path / 'rank0.json'}: {named}"]


def test_chakra_process_group_metadata_as_a_list_holding_its_json_text_is_read(tmp_path):
    """`inputs.values` of the process-group metadata node as a JSON list holding the groups' JSON text
    (`["[{...}]"]`) was refused ("holds no list of process groups"); it reads as the converter's Python text
    does: group '0' is ranks [0, 1]."""
    chakra_job(tmp_path, {"0": [0, 1]}, {rank: [("all_reduce", "0", MIB)] for rank in (0, 1)})
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        nodes = json.loads(path.read_text())
        nodes[0]["inputs"]["values"] = ast.literal_eval(nodes[0]["inputs"]["values"])
        path.write_text(json.dumps(nodes))
    _, result = run(chakra_scenario(tmp_path), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(MIB, rel=EXACT)


def test_chakra_files_whose_names_number_other_ranks_than_their_order_warn(tmp_path):
    """Chakra files rank0, rank1 and rank3 (no file states its rank, so ranks are the files' order): rank3.json
    is rank 2, which one line says."""
    chakra_job(tmp_path, {"0": [0, 1, 2]}, {rank: [("all_reduce", "0", MIB)] for rank in (0, 1, 2)})
    (tmp_path / "rank2.json").rename(tmp_path / "rank3.json")
    _, result = run(chakra_scenario(tmp_path), tmp_path)
    assert [line for line in result.summary["warnings"] if "their order from 0" in line] == [
        f"{tmp_path / 'rank3.json'}: the files state no rank, so ranks are their order from 0, which the numbers in "
        "their names contradict: rank3.json is rank 2 (a file missing from workload.trace?)"]


def test_trace_files_are_named_by_their_normalised_paths(tmp_path):
    """A glob through a sibling folder ('other/../traces/rank*.json') finds the files by their normalised paths,
    which the warnings name."""
    from simulator.workload.traces.program import trace_files

    traces = copy_traces(KINETO_2RANK, tmp_path)
    (tmp_path / "other").mkdir()
    assert trace_files(f"other/../{traces.name}/rank*.json", tmp_path) == [traces / "rank0.json",
                                                                           traces / "rank1.json"]


def test_sm_contention_beside_a_trace_warns_that_it_changes_nothing(tmp_path):
    """`collectives.sm_contention` set beside a trace changes nothing (the traced durations include any
    slowdown already); it warns at its line, as a parameter-server run's ignored fields do."""
    text = two_rank_scenario("100 Gb/s").replace("{algorithm: ring}", "{algorithm: ring, sm_contention: nccl}")
    _, result = run(text, tmp_path)
    assert [line for line in result.summary["warnings"] if "sm_contention" in line] == [
        f"{tmp_path / 'scenario.yaml'}:2: collectives.sm_contention: a replayed trace's compute durations already "
        "include any slowdown from the NCCL kernels beside them: it changes nothing"]


def test_two_files_of_one_rank_are_refused_naming_both(tmp_path):
    """Both files state rank 0: the refusal named neither ("two trace files claim the same rank ([0, 0])")."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    distributed_info(traces / "rank1.json", rank=0)
    with pytest.raises(TraceError) as caught:
        run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert (caught.value.file, caught.value.field, caught.value.problem) == (
        str(traces / "rank1.json"), "distributedInfo.rank", f"the file states rank 0, as {traces / 'rank0.json'} does")


def test_one_rank_of_a_job_spans_the_world_size_its_trace_states(tmp_path):
    """Rank 0's trace of a 4-rank job (distributedInfo.world_size 4) whose all-reduce is of the group [0, 1]: the job
    spans 4 GPUs, not the 2 ranks the trace names; rank 0's GEMM (1000 us), the two-rank ring all-reduce (8.4 us base
    latency, then two steps of n/2 each way over 100 GbE: 2.892 ms), the optimizer (200 us)."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    distributed_info(traces / "rank0.json", world_size=4)
    text = two_rank_scenario("100 Gb/s", nodes=4).replace(f"{KINETO_2RANK}/rank*.json", f"{traces}/rank0.json")
    _, result = run(text, tmp_path)
    assert result.summary["gpus"] == 4 and result.summary["simulated_ranks"] == 1
    all_reduce = NCCL_SIMPLE_BASE_S + 2 * transfer_s(100e9, ALLREDUCE_BYTES / 2)
    assert result.summary["step_time_s"] == pytest.approx(1000e-6 + all_reduce + 200e-6, rel=EXACT)


@pytest.mark.parametrize(("edits", "where", "problem"), [
    ({"rank1.json": {"world_size": 4}}, "rank1.json: distributedInfo.world_size",
     "the traced job has 4 ranks here, but 2 in {traces}/rank0.json (distributedInfo.world_size)"),
    ({"rank0.json": {"rank": None}, "rank1.json": {"rank": 0}}, "rank1.json: distributedInfo.rank",
     "the file states rank 0, but {traces}/rank0.json states none, so ranks are the files' order, which makes this "
     "one rank 1"),
    ({"rank1.json": {"pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 2]}]}},
     "rank1.json: distributedInfo.pg_config[0]",
     "process group '0' has ranks [0, 2] and pg_size 2 of a 2-rank job (distributedInfo.world_size)"),
    ({"rank0.json": {"pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]},
      "rank1.json": {"pg_config": [{"pg_name": "0", "pg_desc": "", "pg_size": 2, "ranks": [1, 0]}]}},
     "rank1.json: distributedInfo.pg_config", "process group '0' has ranks [1, 0] here, but [0, 1] in "
     "{traces}/rank0.json"),
])
def test_traces_that_disagree_on_their_job_are_refused_in_one_line(tmp_path, edits, where, problem):
    """Each file's distributedInfo is taken at its word, and the files of one job must tell the same job. Rank 1's
    file saying 4 ranks where rank 0's says 2 was replayed as a 2-rank job; a file stating no rank beside one that
    does made the stated rank silently the file order's."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for file, info in edits.items():
        distributed_info(traces / file, **info)
    error = kineto_error(traces)
    assert (f"{Path(error.file).name}: {error.field}", error.problem) == (where, problem.format(traces=traces))


def test_a_file_stating_the_process_groups_beside_one_that_does_not_agrees_with_it(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    distributed_info(traces / "rank0.json", pg_config=[{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2,
                                                        "ranks": [0, 1]}])
    _, result = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(ALLREDUCE_BYTES, rel=EXACT)


def test_the_process_groups_the_profiler_states_give_members_and_descriptions(tmp_path):
    """distributedInfo.pg_config lists every group with all its ranks and its description: a 64-rank group of a 128-rank
    job whose ranks follow no stride, shortened in the kernel's args, takes its members from there (not refused, the
    ranks left out unknown), and its description there (not in the kernel's args) names its dimension (not counted as
    DP). Rank 0 alone: the ring of 64 sends 2 (p-1)/p n per GPU, as TP."""
    ranks = [*range(0, 58, 2), 57, *range(60, 128, 2)]
    assert len(ranks) == 64
    traces = copy_traces(KINETO_2RANK, tmp_path)
    comms_args(traces, 0, world=128, **{"Process Group Ranks": "[" + ", ".join(map(str, ranks[:29])) + ", ..., 126]",
                                        "Group size": 64, "Global rank stride": -1, "Process Group Description": None})
    distributed_info(traces / "rank0.json", pg_config=[
        {"pg_name": "0", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "backend_config": "cuda:nccl", "pg_size": 64,
         "ranks": ranks}])
    text = two_rank_scenario("100 Gb/s", nodes=128).replace(f"{KINETO_2RANK}/rank*.json", f"{traces}/rank0.json")
    _, result = run(text, tmp_path)
    p = 64
    assert result.summary["gpus"] == 128
    assert result.summary["traffic_bytes_per_gpu"]["tp"] == pytest.approx(2 * (p - 1) / p * ALLREDUCE_BYTES, rel=EXACT)


def test_a_group_beyond_the_stated_world_size_is_refused_at_its_event(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    comms_args(traces, 0, **{"Process Group Ranks": "[0, 1, 2, 3]", "Group size": 4})
    error = kineto_error(traces)
    assert (Path(error.file).name, error.field) == ("rank0.json", "traceEvents[8]")
    assert error.problem == (f"all_reduce of process group '0' of ranks 0-3, beyond the traced job's 2 ranks "
                             f"(distributedInfo.world_size of {traces / 'rank0.json'})")


def pipeline_transfer(folder: Path, **peers: dict) -> Path:
    """The bundled two-rank trace with its all-reduce turned into a pipeline transfer of the same 32 MiB: rank
    0 sends, rank 1 receives (record_param_comms `send` / `recv`, NCCL's SendRecv kernel); ``peers`` sets each
    rank's peer fields, by default the global `Dst Rank` / `Src Rank` that recent PyTorch writes."""
    traces = copy_traces(KINETO_2RANK, folder)
    for rank, collective in enumerate(("send", "recv")):
        path = traces / f"rank{rank}.json"
        doc = json.loads(path.read_text())
        doc["traceEvents"][4]["args"].update({"Collective name": collective},
                                             **peers.get(f"rank{rank}", {("Dst Rank", "Src Rank")[rank]: 1 - rank}))
        doc["traceEvents"][8]["name"] = "ncclDevKernel_SendRecv"
        path.write_text(json.dumps(doc))
    return traces


def four_rank_group_refusal(traces: Path, folder: Path) -> TraceError:
    """The error replaying ``traces`` (a pipeline transfer in a 4-rank process group) on four 100 Gb/s hosts."""
    text = two_rank_scenario("100 Gb/s", nodes=4).replace(str(KINETO_2RANK), str(traces))
    with pytest.raises(TraceError) as caught:
        run(text, folder)
    return caught.value


@pytest.mark.parametrize("peers", [{}, {"rank0": {"Rank": 1}, "rank1": {"Rank": 0}}, {"rank0": {}, "rank1": {}}],
                         ids=["global", "in-group", "two-rank-group"])
def test_a_pipeline_transfer_is_recosted_and_a_slower_inter_host_link_adds_exactly_its_extra_time(tmp_path, peers):
    """Kineto's NCCL send and receive kernels run on the cluster's network, not for their traced 2700 us, so a
    trace moved to a slower cluster re-costs its pipeline transfers as it does its collectives. The peer is the
    global `Dst Rank` / `Src Rank`, or (older PyTorch) `Rank` within the process group's ranks [0, 1], or,
    where neither is told, the other member of that two-rank group (as for a Chakra trace), not traced
    compute."""
    traces = pipeline_transfer(tmp_path, **peers)
    declared = ", traced_pp: 2"  # two stages, which the transfer alone would leave to inference, with its warning
    _, fast = run(two_rank_scenario("100 Gb/s", dp=declared).replace(str(KINETO_2RANK), str(traces)), tmp_path)
    _, slow = run(two_rank_scenario("25 Gb/s", dp=declared).replace(str(KINETO_2RANK), str(traces)), tmp_path)
    fast_p2p, slow_p2p = transfer_s(100e9), transfer_s(25e9)  # 2.870 and 11.437 ms
    # rank 1's GEMM (1100 us) posts the receive last; the optimizer kernel (200 us) follows the transfer
    assert fast.summary["step_time_s"] == pytest.approx(1100e-6 + fast_p2p + 200e-6, rel=EXACT)
    assert slow.summary["step_time_s"] - fast.summary["step_time_s"] == pytest.approx(slow_p2p - fast_p2p, rel=EXACT)
    assert fast.summary["traffic_bytes_per_gpu"]["pp"] == pytest.approx(ALLREDUCE_BYTES / 2, rel=EXACT)
    assert fast.summary["warnings"] == []


def test_stages_read_off_a_transfer_are_warned_of_unless_its_group_is_described_as_a_pipeline(tmp_path):
    """A transfer in a group named only by number may be a data-parallel job's send: the stages it gives are an
    inference, warned of; one in a group whose description names the pipeline tells them, with no warning."""
    traces = pipeline_transfer(tmp_path, rank0={"Dst Rank": 1, "Process Group Description": "undefined"},
                               rank1={"Src Rank": 0, "Process Group Description": "undefined"})
    text = two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces))
    (warning,) = run(text, tmp_path)[1].summary["warnings"]
    assert warning.startswith("the traced job's pipeline stages are inferred from its transfer from rank 0 to rank "
                              "1, not declared: 2 stages of 1 rank; set workload.traced_pp")
    for rank in (0, 1):
        edit = traces / f"rank{rank}.json"
        edit.write_text(edit.read_text().replace('"undefined"', '"PIPELINE_MODEL_PARALLEL_GROUP"'))
    _, described = run(text, tmp_path)
    assert described.summary["warnings"] == [] and described.summary["trace"]["traced_dp"] == 1


def test_a_tie_for_the_nearest_transfer_goes_to_the_one_in_a_group_described_as_a_pipeline():
    """Two transfers as near (2 ranks apart), one in a group named only by number from the lower rank and one in
    the pipeline's described group: the described one tells the stages, so they are no inference to warn of."""
    transfers = [Transfer(0, 2, ""), Transfer(1, 3, "PIPELINE_MODEL_PARALLEL_GROUP")]
    found = dimensions({}, 4, transfers, TracedSizes())
    assert found.stages_from is None and found.sizes.pp == 2
    assert dimensions({}, 4, transfers[:1], TracedSizes()).stages_from == transfers[0]


def test_one_pipeline_stage_traced_alone_runs_its_transfer_to_the_untraced_stage_on_the_network(tmp_path):
    """Rank 0's trace alone (one stage's profile): rank 1 is not simulated, the send still runs over the network
    between the two hosts once rank 0 reaches it, as a collective's untraced members' transfers do."""
    traces = pipeline_transfer(tmp_path)
    text = two_rank_scenario("25 Gb/s").replace(f"{KINETO_2RANK}/rank*.json", f"{traces}/rank0.json")
    _, result = run(text, tmp_path)
    # rank 0's GEMM 1000 us, the 32 MiB send, the optimizer kernel 200 us
    assert result.summary["step_time_s"] == pytest.approx(1000e-6 + transfer_s(25e9) + 200e-6, rel=EXACT)
    assert result.summary["gpus"] == 2 and result.summary["simulated_ranks"] == 1


def test_a_transfer_whose_peer_the_trace_does_not_tell_keeps_its_traced_time_and_says_so(tmp_path):
    traces = pipeline_transfer(tmp_path)
    for rank in (0, 1):
        comms_args(traces, rank, **{"Collective name": None, "Dst Rank": None, "Src Rank": None})
    _, result = run(two_rank_scenario("25 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    # the traced step: rank 1's GEMM from 20 us to 1120 us, its receive kernel 2700 us, the optimizer 200 us
    assert result.summary["step_time_s"] == pytest.approx(4000e-6, rel=EXACT)
    assert result.summary["trace"]["unknown_kernels"] == 0
    assert [warning.split(": ", 1)[1] for warning in result.summary["warnings"]] == [
        "traceEvents[8]: 1 point-to-point kernel replayed at the traced duration, not re-costed: the trace does "
        "not tell the peer (first: 'ncclDevKernel_SendRecv')"] * 2


def test_a_send_that_names_no_peer_is_blamed_for_its_receive_s_missing_partner(tmp_path):
    """Rank 0's send in a 4-rank process group tells neither `Dst Rank` nor `Rank`, rank 1's receive names
    rank 0 (`Src Rank`): the error blamed the receive ("rank 0's trace has 0 matching sends"), which rank 0's
    trace does have. It names the send, its file and event and the missing field."""
    traces = pipeline_transfer(tmp_path)
    for rank in (0, 1):
        comms_args(traces, rank, world=4, **{"Dst Rank": None, "Process Group Ranks": "[0, 1, 2, 3]",
                                             "Group size": 4})
    caught = four_rank_group_refusal(traces, tmp_path)
    assert (caught.file, caught.field) == (str(traces / "rank0.json"), "traceEvents[8]")
    assert caught.problem == (
        "send 'ncclDevKernel_SendRecv' names no peer (no 'Dst Rank', nor 'Rank' in its process group), so it was "
        "kept as traced compute and rank 1's 1st recv from rank 0 in process group '0' "
        f"({traces / 'rank1.json'}: traceEvents[8]) has no matching send")


@pytest.mark.parametrize(("groups", "pg_name", "kind"), [(MESH, "1", "tp"), (MESH, "0", "tp"), (None, "tp", "tp"),
                                                        (None, "1", "dp")])
def test_a_chakra_collective_counts_as_the_dimension_its_process_group_names(tmp_path, groups, pg_name, kind):
    """A Chakra collective counts as the dimension its group's description names (pg_desc of PyTorch's process-group
    metadata, else its name), as a Kineto trace's does, not as data-parallel whatever it is. The default group of
    a job whose mesh_tp spans both ranks (TP 2, no data parallelism: traced dp 1) varies along TP alone: tp."""
    for rank in (0, 1):
        chakra_step(tmp_path, rank, groups, pg_name)
    _, result = run(chakra_scenario(tmp_path), tmp_path)
    n = 64 * 2**20  # a two-rank ring all-reduce sends 2(p-1)/p x n = n per GPU
    assert result.summary["traffic_bytes_per_gpu"] == pytest.approx(
        {"tp": 0.0, "cp": 0.0, "pp": 0.0, "dp": 0.0, "ep": 0.0, kind: n}, rel=EXACT)


def test_a_chakra_trace_of_one_rank_runs_its_collectives_over_the_groups_the_metadata_lists(tmp_path):
    """Rank 0's Chakra trace alone: its all-reduce of the 4-rank default group ran over the one rank whose trace
    uses the group, free; the process-group metadata says the group spans ranks 0-3."""
    chakra_step(tmp_path, 0, [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": 4}], "0")
    loaded, result = run(chakra_scenario(tmp_path), tmp_path)
    p, n = 4, 64 * 2**20
    assert result.summary["gpus"] == p and result.summary["simulated_ranks"] == 1
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(2 * (p - 1) / p * n, rel=EXACT)
    assert result.summary["step_time_s"] == pytest.approx(1000e-6 + allreduce_time(loaded, n, p) + 100e-6, rel=EXACT)


@pytest.mark.parametrize(("cluster", "ranks", "algorithm", "sent"), [
    ("{topology: dgx-h100}", [0, 1, 2, 3], "ring", 1.5), ("{topology: dgx-h100}", [0, 1, 2, 3], "tree", 1.5),
    ("{topology: dgx-h100}", [0, 1, 2, 3], "nvls", 1.25),
    ("{topology: dgx-h100-cluster, nodes: 2}", [0, 1, 8, 9], "ring", 1.5),
    ("{topology: dgx-h100-cluster, nodes: 2}", [0, 1, 8, 9], "tree", 1.5),
    ("{topology: dgx-h100-cluster, nodes: 2}", [0, 1, 8, 9], "nvls", 2.0)])
def test_an_all_reduce_reports_the_bytes_its_gpus_send_not_the_load_that_times_it(tmp_path, cluster, ranks,
                                                                                  algorithm, sent):
    """Traffic per GPU of a 4-GPU all-reduce of n, rank 0 simulated (the others folded), in units of n. Ring:
    2 (p-1)/p = 1.5. Tree: each of the 2 x channels trees carries n/(2 channels) once up each edge and once down,
    3 edges of 4 GPUs, so 2 x 3 / 4 = 1.5 on the mean (an inner rank sends 2, a leaf or root 1). NVLS in one host:
    each GPU sends its share of every reduced slice and its stored slice, (p+1)/p = 1.25, not the 1.25/0.85 its
    flows carry to time the switch's in-switch efficiency. NVLS over 2 hosts of g = 2: (g+1)/g = 1.5 to the
    switch and 2 (h-1)/(g h) = 0.5 over the rail rings, 2.0 (its flows carried 1.5/0.85 + 0.5 = 2.26)."""
    group = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": ranks, "group_size": len(ranks)}]
    chakra_step(tmp_path, 0, group, "0")
    _, result = run(chakra_scenario(tmp_path, cluster, algorithm), tmp_path)
    n = 64 * 2**20
    assert result.summary["simulated_ranks"] == 1
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(sent * n, rel=EXACT)


def test_a_two_gpu_nvls_all_reduce_reports_the_bytes_each_gpu_sends(tmp_path):
    """Both ranks simulated: NVLS over p = 2 GPUs sends (p+1)/p n = 1.5 n from each (its flows carry 1.5/0.85 n),
    where the ring sends 2 (p-1)/p n = n (the default group of this TP 2 job counts as tp)."""
    for rank in (0, 1):
        chakra_step(tmp_path, rank, MESH, "0")
    _, result = run(chakra_scenario(tmp_path, algorithm="nvls"), tmp_path)
    assert result.summary["simulated_ranks"] == 2
    assert result.summary["traffic_bytes_per_gpu"]["tp"] == pytest.approx(1.5 * 64 * 2**20, rel=EXACT)


def test_a_chakra_file_outside_the_group_its_metadata_lists_says_how_it_got_its_rank(tmp_path):
    """A Chakra file states no rank: the one file of rank 5 is rank 0 by file order, outside the group [4, 7]."""
    chakra_step(tmp_path, 5, [{"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [4, 5, 6, 7], "group_size": 4}], "3")
    with pytest.raises(TraceError) as caught:
        run(chakra_scenario(tmp_path), tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'rank5.json'}: nodes[2]: rank 0 runs a collective of group '3' whose members [4, 5, 6, 7] do "
        "not include it (allowed: the traces of the group's members; a file's rank is its distributedInfo.rank "
        "(Kineto), else its place in the file order, from 0)")


@pytest.mark.parametrize(("values", "problem"), [
    ("['no groups here']", "the process-group metadata holds no list of process groups"),
    (str([json.dumps([{"pg_name": "0", "ranks": [0, 1], "group_size": 4}])]),
     "process group '0' lists ranks [0, 1] with group_size 4"),
])
def test_unreadable_chakra_process_group_metadata_is_refused_at_its_node(tmp_path, values, problem):
    chakra_step(tmp_path, 0, MESH, "0")
    path = tmp_path / "rank0.json"
    path.write_text(path.read_text().replace(json.dumps(str([json.dumps(MESH)])), json.dumps(values)))
    with pytest.raises(TraceError) as caught:
        run(chakra_scenario(tmp_path), tmp_path)
    assert caught.value.field == "nodes[0].inputs.values" and caught.value.problem == problem


def edit_event(path: Path, index: int, **changes) -> None:
    doc = json.loads(path.read_text())
    doc["traceEvents"][index].update(changes)
    path.write_text(json.dumps(doc))


def kineto_error(folder: Path) -> TraceError:
    with pytest.raises(TraceError) as caught:
        run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(folder)), folder.parent)
    return caught.value


def test_truncated_json_names_the_file(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    (traces / "rank1.json").write_text((KINETO_2RANK / "rank1.json").read_text()[:500])
    error = kineto_error(traces)
    assert error.file.endswith("rank1.json") and "not valid JSON" in error.problem


def test_missing_trace_events(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    (traces / "rank0.json").write_text('{"schemaVersion": 1}')
    error = kineto_error(traces)
    assert error.file.endswith("rank0.json") and error.field == "traceEvents"


@pytest.mark.parametrize("change,problem", [({"ts": None}, "has no timestamp"), ({"dur": -5}, "has duration -5"),
                                            ({"ts": True}, "has timestamp True"), ({"dur": True}, "has duration True"),
                                            ({"dur": 1e300}, "lasts 1e+294 s, more than a day")])
def test_bad_events_name_the_event_index(tmp_path, change, problem):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    edit_event(traces / "rank1.json", 2, **change)
    error = kineto_error(traces)
    assert error.file.endswith("rank1.json") and error.field == "traceEvents[2]" and problem in error.problem


def test_a_kernel_without_a_duration_is_refused_not_replayed_as_zero(tmp_path, capsys):
    """A complete event carries its `dur`; a kernel without one (a hand-edited or corrupt file) is refused, as
    every other malformed field is, not replayed as 0 us."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    doc = json.loads((traces / "rank1.json").read_text())
    del doc["traceEvents"][2]["dur"]
    (traces / "rank1.json").write_text(json.dumps(doc))
    error = kineto_error(traces)
    assert error.file.endswith("rank1.json") and error.field == "traceEvents[2]"
    assert "has no duration (dur)" in error.problem and "a complete event (ph X) carries its dur" in error.allowed
    scenario = tmp_path / "nodur.yaml"
    scenario.write_text(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_ranks_disagreeing_on_a_collective_size(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    doc = json.loads((traces / "rank1.json").read_text())
    doc["traceEvents"][4]["args"]["In msg nelems"] = 1000
    (traces / "rank1.json").write_text(json.dumps(doc))
    error = kineto_error(traces)
    assert error.file.endswith("rank1.json") and error.field == "traceEvents[8]"
    assert "2000 bytes on rank 1" in error.problem and "33554432 bytes on rank 0" in error.problem


def test_unknown_kernels_are_kept_as_compute_and_warned(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    edit_event(traces / "rank0.json", 2, name="my_custom_op_kernel")
    _, result = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert result.summary["trace"]["unknown_kernels"] == 1
    assert any("rank0.json: traceEvents[2]: 1 kernel of unknown kind kept as compute" in warning
               and "my_custom_op_kernel" in warning for warning in result.summary["warnings"])
    assert result.summary["step_time_s"] > 1300e-6


def test_a_moved_kernel_of_unknown_kind_keeps_the_bf16_peak_ratio_and_is_counted(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    edit_event(traces / "rank1.json", 2, name="my_custom_op_kernel")  # rank 1's GEMM, which gates the all-reduce
    text = two_rank_scenario("100 Gb/s", dp=", traced_gpu: h100-sxm").replace(str(KINETO_2RANK), str(traces))
    loaded, result = run(text, tmp_path)
    classes = result.summary["trace"]["gpu_move"]["classes"]
    assert classes["unknown"]["ops"] == 1 and classes["matmul"]["ops"] == 1
    assert classes["unknown"]["rates"][0]["duration_ratio"] == pytest.approx(989.0 / 312.0, rel=EXACT)  # bf16 peaks
    expected = moved_gemm_s(989.0 / 312.0) + MOVED_ADAM_S + allreduce_time(loaded, ALLREDUCE_BYTES, 2)
    assert result.summary["step_time_s"] == pytest.approx(expected, rel=EXACT)


def test_cli_reports_a_bad_trace_in_one_line(tmp_path, capsys):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    edit_event(traces / "rank0.json", 8, dur=-1)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rank0.json: traceEvents[8]:" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "out").exists()


def test_a_glob_matching_nothing_points_at_the_scenario_line(tmp_path):
    text = "cluster: {topology: dgx-h100}\nworkload:\n  trace: nothing/*.json\n"
    with pytest.raises(Exception) as caught:
        run(text, tmp_path)
    assert caught.value.field == "workload.trace" and caught.value.line == 3


def test_replication_refuses_a_trace_without_a_group_across_its_data_parallelism(tmp_path):
    """Each rank's collectives in a group of its own: two data-parallel replicas (TP, CP and PP 1) that no
    collective joins, so the trace tells no gradient traffic for more replicas to share."""
    traces = copy_traces(CHAKRA_2RANK, tmp_path)
    for rank in (0, 1):
        path = traces / f"rank{rank}.json"
        text = path.read_text().replace('"stringVal": "0"', f'"stringVal": "{rank}"')
        path.write_text(text.replace('"type": "COMM_SEND_NODE"', '"type": "COMP_NODE"').replace(
            '"type": "COMM_RECV_NODE"', '"type": "COMP_NODE"'))
    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{traces}/rank*.json', format: chakra-json, dp: 4}}\n"
    with pytest.raises(Exception) as caught:
        run(text, tmp_path)
    assert (caught.value.field, caught.value.problem) == (
        "workload.dp", "the traced job has data parallelism of 2 (its 2 ranks over TP 1 x CP 1 x PP 1) but no process "
        "group spans its data-parallel places, so the trace cannot tell the gradients' traffic of more replicas")


TORCH_TRACE = DATA / "traces" / "torch_cpu_step.json"
"""One training step of a 2-layer transformer profiled by torch.profiler on a CPU (tests/data/make_torch_trace.py)."""


def profiler_step_s() -> float:
    """The duration of the trace's ProfilerStep annotation, read straight from the file."""
    events = json.loads(TORCH_TRACE.read_text())["traceEvents"]
    return next(event["dur"] for event in events if event.get("name", "").startswith("ProfilerStep#")) * 1e-6


def test_torch_profiler_step_replays_in_its_traced_time(tmp_path):
    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{TORCH_TRACE}', format: kineto}}\n"
    _, result = run(text, tmp_path)
    traced = profiler_step_s()
    assert result.summary["trace"]["traced_step_time_s"] == pytest.approx(traced, rel=1e-6)
    # absolute timestamps (~5e6 s) carry ~1e-9 s rounding; the acceptance bound is 2 %
    assert result.summary["step_time_s"] == pytest.approx(traced, rel=1e-6)


def test_compute_scale_shrinks_only_the_ops_not_the_host_gaps(tmp_path):
    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{TORCH_TRACE}', compute_scale: 0.5}}\n"
    _, half = run(text, tmp_path)
    frame = half.timeline
    ops = frame[(frame["kind"] == "compute") & (frame["name"] != "host gap")]
    busy = float((ops["end_s"] - ops["start_s"]).sum())
    traced = half.summary["trace"]["traced_step_time_s"]
    assert 0.5 * traced < half.summary["step_time_s"] < traced
    assert half.summary["step_time_s"] == pytest.approx(traced - busy, rel=1e-6)


def test_a_kineto_trace_s_cpu_ops_are_host_time_that_traced_gpu_does_not_move(tmp_path):
    """A profile with no GPU activity replays its CPU ops (aten::linear 2 ms and aten::relu 0.5 ms on thread 1,
    aten::linear 4 ms on thread 2, in a 5 ms ProfilerStep). `traced_gpu: a100-80gb` on an H100 moved them by the
    GPUs' GEMM and HBM ratios (a 2.48 ms step); host time keeps its traced durations, as a Chakra trace's CPU ops
    do, so the step stays the traced 5 ms and gpu_move counts none of them."""
    text = ("cluster: {topology: dgx-h100, gpus: 1}\n"
            f"workload: {{trace: '{cpu_only_profile(tmp_path)}', traced_gpu: a100-80gb}}\n")
    _, result = run(text, tmp_path)
    assert result.summary["step_time_s"] == pytest.approx(5e-3, rel=EXACT)
    moved = result.summary["trace"]["gpu_move"]["classes"]
    assert sum(kind["ops"] for kind in moved.values()) == 0
    ops = result.timeline[result.timeline["name"].str.startswith("aten::")]
    assert len(ops) == 3 and (ops["category"] == "host").all()


def test_recost_gemms_leaves_a_cpu_only_trace_s_matrix_multiplies_as_host_time(tmp_path):
    """The torch step profiled on a CPU records its linears' shapes, but they ran on the host: `recost_gemms`
    gave its 9 forward linears an H100 GEMM's time (a host aten::mm became a 0.21 ms GPU kernel). They keep
    their traced time as the host time they are, the step is the traced one, and the run says so."""
    base = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{TORCH_TRACE}'"
    _, traced = run(base + "}\n", tmp_path)
    _, recosted = run(base + ", recost_gemms: true}\n", tmp_path)
    assert recosted.summary["trace"]["recosted_gemms"] == 0
    assert recosted.summary["step_time_s"] == traced.summary["step_time_s"]
    assert (recosted.timeline[recosted.timeline["name"] == "aten::linear"]["category"] == "host").all()
    assert [line for line in recosted.summary["warnings"] if "recost_gemms" in line] == [
        f"{TORCH_TRACE}: recost_gemms: the trace's matrix multiplies ran on the host (it records no GPU activity), so "
        "none is re-costed: host time keeps its traced durations"]


def test_back_to_back_kernels_get_no_host_gap_from_microsecond_rounding(tmp_path):
    """In the two-rank fixture every kernel starts exactly when the op it waits for ends (3720 = 1020 + 2700 us on rank
    0), so the replay has no host time, not a 4e-19 s gap op from a float sum of microseconds."""
    _, result = run(two_rank_scenario("100 Gb/s"), tmp_path)
    assert (result.timeline["category"] != "host").all()


def test_kernels_overlapping_on_one_stream_are_serialized_and_the_host_gap_after_them_is_not_counted_twice(
        tmp_path):
    """A GEMM at 0-1000 us and one at 500-1000 us on stream 7 (a CUDA stream cannot overlap them: a profiler's
    timestamps can), then the optimizer's kernel at 3500 us. The replay runs the second GEMM at 1000-1500 us; the
    host gap before the optimizer was measured from the second GEMM's traced end (2.5 ms, the overlap counted
    twice: a 4.2 ms step), it is from its serialized end (2.0 ms), so the replay on the traced GPU is the traced
    3.7 ms step; one warning names the first overlapping kernel."""
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
    kernels = [(gemm, 0, 1000), (gemm, 500, 500), ("multi_tensor_apply_kernel_adam", 3500, 200)]
    events = [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
               "args": {"stream": 7}} for name, ts, dur in kernels]
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": events}))
    text = f"cluster: {{topology: dgx-h100, gpus: 1}}\nworkload: {{trace: '{tmp_path}/rank0.json'}}\n"
    _, result = run(text, tmp_path)
    assert result.summary["trace"]["traced_step_time_s"] == pytest.approx(3700e-6, rel=EXACT)
    assert result.summary["step_time_s"] == pytest.approx(3700e-6, rel=EXACT)
    overlapping = [line for line in result.summary["warnings"] if "before the op ahead of it" in line]
    assert overlapping == [
        f"{tmp_path / 'rank0.json'}: traceEvents[1]: 'sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n' starts 500.0 us "
        "before the op ahead of it on stream 7 ends, beyond the 1 us of timestamp rounding (1 such op in 1 file of "
        "the trace, by up to 500.0 us): a CUDA stream runs its ops one after another, and so does the replay, "
        "measuring the host time after them from there"]


def test_a_truncated_gzip_trace_names_the_file(tmp_path):
    import gzip

    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in (0, 1):
        packed = gzip.compress((KINETO_2RANK / f"rank{rank}.json").read_bytes())
        (traces / f"rank{rank}.json.gz").write_bytes(packed[:300] if rank else packed)
    text = two_rank_scenario("100 Gb/s").replace(f"{KINETO_2RANK}/rank*.json", f"{traces}/rank*.json.gz")
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert caught.value.file.endswith("rank1.json.gz") and "not a complete gzip file" in caught.value.problem


@pytest.mark.parametrize("garbled", [b"plain text", b"\x1f\x8b\x05" + bytes(20)], ids=["not-gzip", "unknown-method"])
def test_a_json_gz_that_gzip_did_not_write_says_what_is_allowed(tmp_path, garbled):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank0.json.gz").write_bytes(gzip_of(KINETO_2RANK / "rank0.json"))
    (traces / "rank1.json.gz").write_bytes(garbled)
    text = two_rank_scenario("100 Gb/s").replace(f"{KINETO_2RANK}/rank*.json", f"{traces}/rank*.json.gz")
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert caught.value.file.endswith("rank1.json.gz") and caught.value.problem.startswith("not a gzip file (")
    assert caught.value.allowed == "a .json.gz file gzip wrote, or the JSON file named without .gz"


def gzip_of(path: Path) -> bytes:
    import gzip

    return gzip.compress(path.read_bytes())


def test_process_group_ranks_that_are_not_numbers(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    doc = json.loads((traces / "rank0.json").read_text())
    doc["traceEvents"][4]["args"]["Process Group Ranks"] = ["a", "b"]
    (traces / "rank0.json").write_text(json.dumps(doc))
    error = kineto_error(traces)
    assert error.file.endswith("rank0.json") and error.field == "traceEvents[8]"
    assert error.problem.startswith("process group ranks ['a', 'b']")


@pytest.mark.parametrize("size", [True, "lots", 1.5])
def test_a_size_that_is_not_a_count_is_refused_naming_its_field(tmp_path, size):
    """JSON's true is a bool, which Python would count as 1; 1.5 elements were taken as 3 bytes of bf16. The line
    named neither the arg ('message size 'lots' ... is not a count of elements') nor what is allowed."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    doc = json.loads((traces / "rank0.json").read_text())
    doc["traceEvents"][4]["args"]["In msg nelems"] = size
    (traces / "rank0.json").write_text(json.dumps(doc))
    error = kineto_error(traces)
    assert error.file.endswith("rank0.json") and error.field == "traceEvents[8]"
    assert error.problem == (f"message size 'In msg nelems' {size!r} of 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL' "
                             "is not a count of elements")
    assert error.allowed == "a whole number of elements >= 0, e.g. 16777216"


def test_a_message_beyond_a_petabyte_is_refused_at_its_event(tmp_path):
    """A traced size of 1e30 elements was replayed as a 2e30-byte all-reduce, times of 1e19 s."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    doc = json.loads((traces / "rank0.json").read_text())
    doc["traceEvents"][4]["args"]["In msg nelems"] = 1e30
    (traces / "rank0.json").write_text(json.dumps(doc))
    error = kineto_error(traces)
    assert error.file.endswith("rank0.json") and error.field == "traceEvents[8]"
    assert error.problem.startswith("message of 2e+30 bytes in 'ncclDevKernel_AllReduce") and "1 PiB" in error.allowed


def test_a_kineto_trace_with_nothing_to_replay(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    (traces / "rank1.json").write_text('{"traceEvents": [{"ph": "i", "name": "marker", "ts": 5}]}')
    error = kineto_error(traces)
    assert error.file.endswith("rank1.json") and error.field == "traceEvents"
    assert error.problem.startswith("nothing to replay in 1 event:")


def test_a_chakra_trace_of_metadata_alone_has_nothing_to_replay(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text('[{"id": 1, "name": "meta", "type": "METADATA_NODE"}]')
    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{path}', format: chakra-json}}\n"
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert caught.value.field == "nodes" and caught.value.problem.startswith("nothing to replay in 1 node:")


def test_an_unknown_trace_key_lists_the_trace_fields(tmp_path):
    """The workload is a list of collectives or a trace mapping; a mistyped trace key is answered with the trace's
    fields, not the collective list's keys (op, bytes, ...)."""
    from simulator.errors import ScenarioError

    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{KINETO_2RANK}/rank*.json', tp: 2}}\n"
    with pytest.raises(ScenarioError) as caught:
        scenario_from_text(text, source="s.yaml")
    assert str(caught.value) == ("s.yaml:2: workload.tp: unknown key 'tp' (allowed: trace, format, compute_scale, "
                                 "traced_gpu, dp, traced_tp, traced_pp, traced_cp, traced_ep, host_gaps, recost_gemms, "
                                 "tokens_per_step, model_flops_per_token)")


@pytest.mark.parametrize("section", ["parallelism: {tp: 2}", "training: {seq_len: 4096}"])
def test_training_step_sections_beside_a_trace_are_refused_not_ignored(section):
    from simulator.errors import ScenarioError

    name = section.split(":")[0]
    text = f"cluster: {{topology: dgx-h100}}\n{section}\nworkload: {{trace: '{KINETO_2RANK}/rank*.json'}}\n"
    with pytest.raises(ScenarioError) as caught:
        scenario_from_text(text, source="s.yaml")
    assert str(caught.value).startswith(f"s.yaml:2: {name}: a replayed trace brings its own step; {name} "
                                        "describes a modelled one and would be ignored (allowed: leave it out")


SEND_TO_RANK_1 = ('[{"id": 1, "name": "send", "type": "COMM_SEND_NODE", "attr": [{"name": "comm_dst", "int32Val": 1}, '
                  '{"name": "comm_size", "int64Val": 100}]}]')


def chakra_stage(gemm_us: int = 0) -> str:
    """Rank 0 of a pipeline in Chakra JSON: a GEMM of ``gemm_us`` (none for 0), a 32 MiB send to rank 1, then 100 us
    of compute that waits for it (a control dependency)."""
    send = {"id": 2, "name": "send activations", "type": "COMM_SEND_NODE",
            "attr": [{"name": "comm_dst", "int32Val": 1}, {"name": "comm_size", "int64Val": ALLREDUCE_BYTES}]}
    nodes = [{"id": 1, "name": "gemm", "type": "COMP_NODE", "durationMicros": gemm_us}, {**send, "dataDeps": [1]},
             {"id": 3, "name": "after", "type": "COMP_NODE", "ctrlDeps": [2], "durationMicros": 100}]
    return json.dumps(nodes if gemm_us else [send])


@pytest.mark.parametrize("gemm_us", [1000, 0])
def test_one_chakra_stage_traced_alone_sends_to_the_untraced_stage_over_the_network(tmp_path, gemm_us):
    """A Chakra send to a rank without a trace runs as a Kineto one does, the peer taken as ready, and warns, on a
    program whose only ops may be asynchronous (no IndexError in the engine's ordering). Without the GEMM the program
    is the send alone (no in-order stream at all)."""
    path = tmp_path / "rank0.json"
    path.write_text(chakra_stage(gemm_us))
    text = (f"cluster: {{topology: ethernet-100g, nodes: 2, nic_bandwidth: 25 Gb/s}}\n"
            f"workload: {{trace: '{path}', format: chakra-json, traced_pp: 2}}\n")
    _, result = run(text, tmp_path)
    # the GEMM, the 32 MiB send between the two hosts (closed form), the 100 us after it
    expected = (gemm_us + 100) * 1e-6 + transfer_s(25e9) if gemm_us else transfer_s(25e9)
    assert result.summary["step_time_s"] == pytest.approx(expected, rel=EXACT)
    assert result.summary["gpus"] == 2 and result.summary["simulated_ranks"] == 1
    assert result.summary["warnings"] == [
        f"{path}: nodes[{1 if gemm_us else 0}]: 1 point-to-point transfer with rank 1, which has no trace, run over "
        "the network as soon as this rank reaches them, the peer taken as ready"]


def garbled(nodes: list[dict]) -> list[dict]:
    """``launched``'s nodes with the launcher's inputs replaced by text that names no rank."""
    launcher, node = nodes
    return [{**launcher, "inputs": {**launcher["inputs"], "values": "['send']"}}, node]


IDLE = {"id": 2, "name": "idle", "type": "COMP_NODE", "durationMicros": 10}


def test_chakra_sends_and_receives_without_peers_take_them_from_their_launching_record_param_comms(tmp_path):
    """Chakra's converter writes no comm_dst / comm_src on the send and receive nodes it makes from a PyTorch execution
    trace, but keeps the record_param_comms op that launched each, whose inputs hold the peer's rank in the group
    (ProcessGroupNCCL::send passes its destination there): over pipeline group [1, 2, 3], rank 1 sends to group rank
    1 (rank 2), which receives from group rank 0 (rank 1) and then sends to group rank 2 (rank 3). The step is the
    two 32 MiB transfers one after the other, each the closed form between two hosts; rank 0 idles 10 us."""
    text = p2p_job(tmp_path, {0: [IDLE], 1: launched("send", "2", 1, 2, []),
                              2: [*launched("recv", "2", 0, 2, []), *launched("send", "2", 2, 4, [3])],
                              3: launched("recv", "2", 1, 2, [])})
    _, result = run(text, tmp_path)
    flows = result.timeline[result.timeline["kind"] == "flow"]
    assert list(zip(flows["src"], flows["dst"], flows["bytes"], strict=True)) == [
        (1, 2, ALLREDUCE_BYTES), (2, 3, ALLREDUCE_BYTES)]
    assert list(flows["start_s"]) == pytest.approx([0.0, transfer_s(25e9)], rel=EXACT)
    assert result.summary["step_time_s"] == pytest.approx(2 * transfer_s(25e9), rel=EXACT)


def test_chakra_sends_and_receives_of_a_two_rank_group_take_its_other_member_as_the_peer(tmp_path):
    """Without a record_param_comms node, the peer of a transfer in a process group of two ranks is the one that
    is not the file's own (its place in the file order): rank 0's send in group [0, 1] reaches rank 1, whose
    receive waits for it before 100 us of compute; the step is the transfer's closed form plus that compute."""
    after = {"id": 4, "name": "after", "type": "COMP_NODE", "dataDeps": [3], "durationMicros": 100}
    text = p2p_job(tmp_path, {0: launched("send", "3", None, 2, []), 1: [*launched("recv", "3", None, 2, []), after]})
    _, result = run(text, tmp_path)
    flows = result.timeline[result.timeline["kind"] == "flow"]
    assert list(zip(flows["src"], flows["dst"], flows["bytes"], strict=True)) == [(0, 1, ALLREDUCE_BYTES)]
    assert result.summary["step_time_s"] == pytest.approx(transfer_s(25e9) + 100e-6, rel=EXACT)


@pytest.mark.parametrize(("nodes", "field", "problem"), [
    (launched("send", "2", None, 2, []), "nodes[1]", "COMM_SEND_NODE 'ncclDevKernel_SendRecv' has no comm_dst, and "
     "its process group '2' has 3 ranks [1, 2, 3], so which is the peer is unknown without the record_param_comms "
     "node that launched it"),
    (launched("recv", "9", 0, 2, []), "nodes[2]", "COMM_RECV_NODE 'ncclDevKernel_SendRecv' has no comm_src, and the "
     "trace lists no members of its process group '9' (no process-group metadata for it)"),
    (launched("send", "2", 3, 2, []), "nodes[2]", "COMM_SEND_NODE 'ncclDevKernel_SendRecv' has no comm_dst, and its "
     "record_param_comms node (id 2) names rank 3 of process group '2', which has 3 ranks"),
    (launched("send", "", 1, 2, []), "nodes[2]", "COMM_SEND_NODE 'ncclDevKernel_SendRecv' has no comm_dst, and no "
     "process group: no pg_name, its record_param_comms node (id 2) names none, and the process-group metadata "
     "lists 3 groups"),
    (launched("send", "", None, 2, []), "nodes[1]", "COMM_SEND_NODE 'ncclDevKernel_SendRecv' has no comm_dst, and no "
     "process group: no pg_name, no record_param_comms node that launched it names one, and the process-group "
     "metadata lists 3 groups"),
    (garbled(launched("send", "2", 1, 2, [])), "nodes[2]", "COMM_SEND_NODE 'ncclDevKernel_SendRecv' has no "
     "comm_dst, and its record_param_comms node (id 2) names no rank before 'send' in its inputs, so which of the 3 "
     "ranks [1, 2, 3] of process group '2' is the peer is unknown"),
])
def test_a_chakra_transfer_whose_peer_the_trace_does_not_determine_is_refused_at_its_node(tmp_path, nodes, field,
                                                                                       problem):
    text = p2p_job(tmp_path, {0: nodes})
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert (caught.value.field, caught.value.problem) == (field, problem)
    assert caught.value.allowed == (
        "the peer rank as an attribute (comm_dst / comm_src), or the send's (receive's) launching record_param_comms "
        "node with its process group's members in the process-group metadata, or a process group of two ranks "
        "(pg_name, else the group the launching record_param_comms node names, else the process-group metadata's "
        "only group)")


def test_a_chakra_transfer_of_a_two_rank_group_without_the_file_s_rank_is_refused(tmp_path):
    """A Chakra file's rank is its place in the file order: a send of group '3' (ranks [0, 1]) in the third file,
    rank 2, which is not in the group, has no peer the group tells; refused, naming the rank and the group."""
    text = p2p_job(tmp_path, {0: [IDLE], 1: [IDLE], 2: launched("send", "3", None, 2, [])})
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert (Path(caught.value.file).name, caught.value.field) == ("rank2.json", "nodes[1]")
    assert caught.value.problem == ("send 'ncclDevKernel_SendRecv' names no peer, and rank 2 is not in its process "
                                    "group '3' of ranks [0, 1], whose other member would be the peer")


def test_a_chakra_error_spells_the_field_as_the_file_and_names_the_node_id(tmp_path):
    """The jsonizer writes camelCase (`dataDeps`): the error spells the field as the file does (a grep for the
    schema's `data_deps` finds nothing) and names the node by its id beside `nodes[2]`, an index a reader counting
    the metadata header reads as another node."""
    traces = copy_traces(CHAKRA_2RANK, tmp_path)
    path = traces / "rank0.json"
    path.write_text(path.read_text().replace('"dataDeps": ["2"]', '"dataDeps": ["99"]'))
    error = chakra_error(traces)
    assert error.file.endswith("rank0.json") and error.field == "nodes[2].dataDeps"
    assert error.problem == "node id 3: dependency '99' is not a node of the trace"
    path.write_text(path.read_text().replace('"dataDeps": ["99"]', '"dataDeps": ["2"]')
                    .replace('"durationMicros": "400"', '"durationMicros": "-4"'))
    error = chakra_error(traces)
    assert (error.field, error.problem) == ("nodes[2].durationMicros", "node id 3: -4 is negative")


def test_a_send_whose_receive_is_missing_is_refused_before_the_run(tmp_path):
    """A send whose receive is missing is refused naming the node, not run into the engine's deadlock report (exit
    status 1)."""
    traces = copy_traces(CHAKRA_2RANK, tmp_path)
    path = traces / "rank1.json"
    path.write_text(path.read_text().replace('"type": "COMM_RECV_NODE"', '"type": "COMP_NODE"'))
    error = chakra_error(traces)
    assert error.file.endswith("rank0.json") and error.field == "nodes[3]"
    assert error.problem == (f"send 'send activations' is rank 0's 1st send to rank 1, but rank 1's trace "
                             f"({traces / 'rank1.json'}) has 0 matching receives")
    assert error.allowed == "a receive on the peer for each send, matched by process group and order"


def test_transfers_match_in_order_whatever_their_tags(tmp_path):
    """Rank 0 sends 1 MiB with tag 0, then 1 MiB with tag 1; rank 1 receives tag 1, then tag 0. PyTorch's
    ProcessGroupNCCL ignores tags and NCCL pairs a communicator's sends and receives in order, so the first send
    meets the first receive: the two transfers run one after the other (the second send waits for the first on
    the pair's stream). Matched by tag, each receive waited for the other's send: a deadlock (exit 1)."""
    text = two_host_chakra_job(tmp_path, {
        0: [p2p_node(1, "send", 1, MIB, tag=0), p2p_node(2, "send", 1, MIB, tag=1)],
        1: [p2p_node(1, "recv", 0, MIB, tag=1), p2p_node(2, "recv", 0, MIB, tag=0, deps=(1,))]})
    _, result = run(text, tmp_path)
    assert result.summary["step_time_s"] == pytest.approx(2 * transfer_s(25e9, MIB), rel=EXACT)


def test_transfers_match_per_process_group(tmp_path):
    """Rank 0 sends 1 MiB in group a, then 2 MiB in group b; rank 1 receives b's 2 MiB, then a's 1 MiB. Each group is
    its own communicator, so each send meets its group's receive (matched by order alone they would disagree on the
    size): b's transfer runs at once, and a's, whose send is not held back by b's (another stream), when rank 1
    receives it after b's."""
    text = two_host_chakra_job(tmp_path, {
        0: [p2p_node(1, "send", 1, MIB, group="a"), p2p_node(2, "send", 1, 2 * MIB, group="b")],
        1: [p2p_node(1, "recv", 0, 2 * MIB, group="b"), p2p_node(2, "recv", 0, MIB, group="a", deps=(1,))]})
    _, result = run(text, tmp_path)
    assert result.summary["step_time_s"] == pytest.approx(transfer_s(25e9, 2 * MIB) + transfer_s(25e9, MIB),
                                                          rel=EXACT)


@pytest.mark.parametrize(("description", "kind"), [("mesh_cp", "cp"), ("undefined", "pp")])
def test_a_chakra_transfer_s_group_missing_from_the_metadata_is_described_as_its_launcher_records(
        tmp_path, description, kind):
    """Rank 0 sends 32 MiB to rank 1 in process group '9', which no process-group metadata lists; the launching
    record_param_comms nodes record the group as ('9', ``description``). The description is the launcher's, not the
    group's name '9', which names no dimension (so a pipeline hand-off): `mesh_cp` makes it the CP ring's,
    `undefined` names none."""
    for rank, kind_ in ((0, "send"), (1, "recv")):
        values = [[[7, 8, 0, ALLREDUCE_BYTES // 2, 2, "cuda:0"]], [12, True], ["9", description], 1 - rank, kind_,
                  [], [], 0, 1, 2]
        launcher = {"id": 1, "name": "record_param_comms", "type": "COMP_NODE",
                    "inputs": {"values": str(values), "shapes": "[]", "types": "[]"},
                    "attr": [{"name": "is_cpu_op", "boolVal": True}]}
        node = p2p_node(2, kind_, 1 - rank, ALLREDUCE_BYTES, deps=(1,))
        (tmp_path / f"rank{rank}.json").write_text(json.dumps([launcher, node]))
    text = (f"cluster: {{topology: ethernet-100g, nodes: 2, nic_bandwidth: 25 Gb/s}}\n"
            f"workload: {{trace: '{tmp_path}/rank*.json', format: chakra-json}}\n")
    _, result = run(text, tmp_path)
    assert result.summary["step_time_s"] == pytest.approx(transfer_s(25e9), rel=EXACT)
    assert result.summary["traffic_bytes_per_gpu"] == pytest.approx(
        {"tp": 0.0, "cp": 0.0, "pp": 0.0, "dp": 0.0, "ep": 0.0, kind: ALLREDUCE_BYTES / 2}, rel=EXACT)


def test_a_transfer_s_ends_that_disagree_on_the_size_in_one_group_are_refused_naming_the_group(tmp_path):
    """The same two transfers as above, all in group a: rank 1's first receive (2 MiB) is rank 0's first send
    (1 MiB), refused."""
    text = two_host_chakra_job(tmp_path, {
        0: [p2p_node(1, "send", 1, MIB, group="a"), p2p_node(2, "send", 1, 2 * MIB, group="a")],
        1: [p2p_node(1, "recv", 0, 2 * MIB, group="a"), p2p_node(2, "recv", 0, MIB, group="a", deps=(1,))]})
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert caught.value.problem == (f"send_recv of 2097152 bytes on rank 1 as transfer number 1 from rank 0 to rank 1 "
                                    f"in process group 'a', but send_recv of 1048576 bytes on rank 0 "
                                    f"({tmp_path / 'rank0.json'}: nodes[0])")


def chakra_error(folder: Path) -> TraceError:
    """The error replaying the Chakra traces of ``folder`` on a DGX H100."""
    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{folder}/rank*.json', format: chakra-json}}\n"
    with pytest.raises(TraceError) as caught:
        run(text, folder.parent)
    return caught.value


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("comm_size", '"1.5"', "comm_size '1.5' of 'send' is not a whole number of bytes"),
    ("comm_dst", "1.5", "comm_dst 1.5 of 'send' is not a rank"),
    ("comm_dst", "-1", "comm_dst -1 of 'send' is not a rank"),
])
def test_chakra_numbers_that_are_not_whole_or_not_ranks_are_refused(tmp_path, field, value, problem):
    path = tmp_path / "rank0.json"
    path.write_text(SEND_TO_RANK_1.replace('"int64Val": 100' if field == "comm_size" else '"int32Val": 1',
                                           f'"int64Val": {value}'))
    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{path}', format: chakra-json}}\n"
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert caught.value.field == "nodes[0]" and caught.value.problem == problem


@pytest.mark.parametrize(("kind", "problem"), [
    ('"COMP_NOD"', "unknown node type 'COMP_NOD'"), ("42", "unknown node type 42"), (None, "no node type")])
def test_chakra_node_types_that_are_not_chakra_s_are_refused(tmp_path, kind, problem):
    """A mistyped or missing node type is refused, not dropped without a word (a hand-written COMP_NOD of 300 us would
    leave the step 300 us short)."""
    node = '{"id": 1, "name": "fwd", "duration_micros": 300' + (f', "type": {kind}' if kind else "") + "}"
    (tmp_path / "rank0.json").write_text(SEND_TO_RANK_1.replace('[{"id": 1', '[' + node + ', {"id": 2'))
    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{tmp_path / 'rank0.json'}', format: chakra-json}}\n"
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert caught.value.field == "nodes[0].type" and caught.value.problem == problem
    assert caught.value.allowed.startswith("INVALID_NODE (0), METADATA_NODE (1)")
    assert caught.value.allowed.endswith("COMM_COLL_NODE (7)")


def test_a_folder_as_the_trace_says_so(tmp_path):
    text = f"cluster: {{topology: dgx-h100}}\nworkload:\n  trace: '{KINETO_2RANK}'\n"
    with pytest.raises(Exception) as caught:
        run(text, tmp_path)
    assert caught.value.field == "workload.trace" and caught.value.line == 3
    assert caught.value.problem == f"{str(KINETO_2RANK)!r} is a folder"
    assert caught.value.allowed == f"its files, one per rank: {str(KINETO_2RANK / '*.json')!r}"


def test_the_wrong_format_is_named(tmp_path):
    """A Kineto file read as Chakra and a Chakra jsonizer file read as Kineto are named as the other format, not
    'nodes[0].id: None is not an integer' or 'not valid JSON ... a truncated file?'."""
    as_chakra = (f"cluster: {{topology: dgx-h100}}\n"
                 f"workload: {{trace: '{KINETO_2RANK}/rank*.json', format: chakra-json}}\n")
    with pytest.raises(TraceError) as caught:
        run(as_chakra, tmp_path)
    assert caught.value.problem == "a PyTorch profiler (Kineto) trace, not a Chakra execution trace"
    as_kineto = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{CHAKRA_2RANK}/rank*.json'}}\n"
    with pytest.raises(TraceError) as caught:
        run(as_kineto, tmp_path)
    assert caught.value.problem.startswith("several JSON documents one after another, as Chakra's jsonizer writes")
    (tmp_path / "nodes.json").write_text('{"nodes": []}')
    with pytest.raises(TraceError) as caught:
        run(f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{tmp_path}/nodes.json'}}\n", tmp_path)
    assert caught.value.problem == ("no traceEvents list, and it looks like a Chakra execution trace (set "
                                    "workload.format: chakra-json)")


@pytest.mark.parametrize("shown", ["[" + ", ".join(map(str, range(30))) + ", ...]",
                                   "[" + ", ".join(map(str, range(29))) + ", ..., 63]"], ids=["older", "recent"])
def test_a_group_of_64_ranks_that_the_profiler_shortens_spans_64_ranks(tmp_path, shown):
    """PyTorch lists at most 30 of a group's ranks ('[0, ..., 29, ...]', recent versions '[0, ..., 28, ...,
    63]'); rank 0's trace of a 64-rank all-reduce was replayed over the 30 ranks shown."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    comms_args(traces, 0, world=64, **{"Process Group Ranks": shown, "Group size": 64})
    text = two_rank_scenario("100 Gb/s", nodes=64).replace(f"{KINETO_2RANK}/rank*.json", f"{traces}/rank0.json")
    loaded, result = run(text, tmp_path)
    p = 64
    assert result.summary["gpus"] == p and result.summary["simulated_ranks"] == 1
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(2 * (p - 1) / p * ALLREDUCE_BYTES, rel=EXACT)
    assert result.summary["step_time_s"] == pytest.approx(1000e-6 + allreduce_time(loaded, ALLREDUCE_BYTES, p)
                                                          + 200e-6, rel=EXACT)


def test_a_shortened_group_follows_the_stated_stride(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    shown = "[" + ", ".join(map(str, range(0, 58, 2))) + ", ..., 126]"
    comms_args(traces, 0, world=128, **{"Process Group Ranks": shown, "Group size": 64, "Global rank start": 0,
                                        "Global rank stride": 2})
    text = two_rank_scenario("100 Gb/s", nodes=128).replace(f"{KINETO_2RANK}/rank*.json", f"{traces}/rank0.json")
    _, result = run(text, tmp_path)
    p = 64  # ranks 0, 2, ..., 126 of the traced job of 128 (distributedInfo.world_size)
    assert result.summary["gpus"] == 128
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(2 * (p - 1) / p * ALLREDUCE_BYTES, rel=EXACT)


@pytest.mark.parametrize("args,problem", [
    ({"Process Group Ranks": "[0, 1, 5, ...]", "Group size": 64}, "its 64 members (Group size) do not follow one"),
    ({"Process Group Ranks": "[0, 1, ..., 28, ..., 70]", "Group size": 64}, "do not follow one stride"),
    ({"Process Group Ranks": "[0, 1, ...]", "Group size": None}, "no Group size says how many members it has"),
    ({"Process Group Ranks": "[0, 1]", "Group size": 4}, "list 2 ranks but its Group size is 4"),
    # PyTorch marks a group whose ranks follow no stride (0, 2, ..., 56, 57, 60, 62, ..., 126: 64 ranks) with
    # stride -1; shortened, it reads as 0, 2, ..., 126 and was replayed as that
    ({"Process Group Ranks": "[" + ", ".join(map(str, range(0, 58, 2))) + ", ..., 126]", "Group size": 64,
      "Global rank start": 0, "Global rank stride": -1}, "follow no single stride (Global rank stride -1)"),
    ({"Process Group Ranks": "[" + ", ".join(map(str, range(29))) + ", ..., 29]", "Group size": 30},
     "are marked shortened but show 30 ranks of a group of 30 (Group size)"),
    ({"Process Group Ranks": "[0, -1]"}, "are not rank numbers"),
])
def test_group_ranks_that_cannot_be_told_are_refused_at_their_event(tmp_path, args, problem):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    comms_args(traces, 0, **args)
    error = kineto_error(traces)
    assert error.file.endswith("rank0.json") and error.field == "traceEvents[8]" and problem in error.problem


def one_rank_of_eight(tmp_path: Path, **args):
    """Rank 0's trace as PyTorch versions without `Process Group Ranks` write it, replayed on 8 GPUs."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    comms_args(traces, 0, world=8, **{"Process Group Name": None, "Process Group Description": None,
                                      "Process Group Ranks": None, "Group size": 8, **args})
    text = two_rank_scenario("100 Gb/s", nodes=8).replace(f"{KINETO_2RANK}/rank*.json", f"{traces}/rank0.json")
    return run(text, tmp_path)


def test_a_group_without_a_rank_list_spans_its_size_from_the_stated_stride(tmp_path):
    """Before PyTorch listed a group's ranks, rank 0's trace of an 8-rank all-reduce replayed it on 1 GPU, free."""
    loaded, result = one_rank_of_eight(tmp_path, **{"Global rank start": 0, "Global rank stride": 1})
    p = 8
    assert result.summary["gpus"] == p
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(2 * (p - 1) / p * ALLREDUCE_BYTES, rel=EXACT)
    assert result.summary["step_time_s"] == pytest.approx(1000e-6 + allreduce_time(loaded, ALLREDUCE_BYTES, p)
                                                          + 200e-6, rel=EXACT)


def test_a_group_whose_members_cannot_be_told_is_refused_not_shrunk_to_the_traced_ranks(tmp_path):
    with pytest.raises(TraceError) as caught:
        one_rank_of_eight(tmp_path)
    assert caught.value.file.endswith("rank0.json") and caught.value.field == "traceEvents[8]"
    assert caught.value.problem == ("process group 'default' has 8 members (Group size), but the trace does not "
                                    "tell which and only rank 0 uses it")


def test_a_collective_missing_from_a_members_trace_is_refused_before_the_run(tmp_path):
    """Rank 1's trace without its all-reduce (a trace of another step, or cut short) ran into a deadlock at run
    time (exit status 1) that named neither file."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    doc = json.loads((traces / "rank1.json").read_text())
    doc["traceEvents"][8]["cat"] = "gpu_user_annotation"
    (traces / "rank1.json").write_text(json.dumps(doc))
    error = kineto_error(traces)
    assert error.file.endswith("rank0.json") and error.field == "traceEvents[8]"
    assert error.problem.startswith("all_reduce number 1 of process group '0' on rank 0 has no counterpart on rank 1")
    assert error.problem.endswith("rank1.json) issues 0 collectives of the group")


def host_synchronised(folder: Path) -> None:
    """The bundled traces with the optimizer waiting for the all-reduce through the host (cudaStreamSynchronize
    on the NCCL stream, as a gradient-norm .item() does) instead of a stream wait: the host returns 2 us after
    the all-reduce ends, launches Adam 3 us later, and Adam starts 5 us after that."""
    for rank, offset in ((0, 0), (1, 100)):
        path = folder / f"rank{rank}.json"
        doc = json.loads(path.read_text())
        events = doc["traceEvents"]
        returned = 3722 + offset
        events[10].update(name="cudaStreamSynchronize", ts=64, dur=returned - 64)
        events[11] = {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 20, "ts": 64,
                      "dur": returned - 64, "args": {"stream": 20, "correlation": 7}}
        events[12]["ts"] = returned + 3
        events[13]["ts"] = returned + 8
        path.write_text(json.dumps(doc))


def test_a_host_synchronisation_orders_the_ops_launched_after_it(tmp_path):
    """Adam, launched after the host waited for the all-reduce, kept its traced start: re-costed on a 4x slower
    NIC the all-reduce ran on while Adam did, and the step grew by less than the all-reduce."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    host_synchronised(traces)
    fast_loaded, fast = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    slow_loaded, slow = run(two_rank_scenario("25 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    fast_ar = allreduce_time(fast_loaded, ALLREDUCE_BYTES, 2)
    slow_ar = allreduce_time(slow_loaded, ALLREDUCE_BYTES, 2)
    # rank 1: GEMM 1100 us, the all-reduce, 10 us of host time from its traced end to Adam's start, Adam 200 us
    assert fast.summary["step_time_s"] == pytest.approx(1100e-6 + fast_ar + 10e-6 + 200e-6, rel=EXACT)
    assert slow.summary["step_time_s"] - fast.summary["step_time_s"] == pytest.approx(slow_ar - fast_ar, rel=EXACT)


def test_events_spanning_more_than_a_day_are_refused(tmp_path):
    """An Adam kernel stamped 1e12 us after the rest (a corrupted ts) made a step of 11.6 days of host gap."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    edit_event(traces / "rank1.json", 13, ts=1e12)
    error = kineto_error(traces)
    assert error.file.endswith("rank1.json") and error.field == "traceEvents"
    assert error.problem.startswith("the replayed events span 1e+06 s, more than a day")


def test_a_chakra_duration_beyond_a_day_is_refused_at_its_node(tmp_path):
    traces = copy_traces(CHAKRA_2RANK, tmp_path)
    path = traces / "rank0.json"
    path.write_text(path.read_text().replace('"durationMicros": "1500"', '"durationMicros": "100000000000"'))
    error = chakra_error(traces)
    assert error.file.endswith("rank0.json") and error.field == "nodes[0]"
    assert error.problem == "'forward GEMMs' lasts 1e+05 s, more than a day, longer than any training step"


@pytest.mark.parametrize("dtype,element", [("Float8_e4m3fnuz", 1), ("Short", 2), ("ComplexFloat", 8)])
def test_every_pytorch_scalar_type_of_a_collective_has_its_size(tmp_path, dtype, element):
    """AMD's fp8 (fnuz), int16 and complex all-reduces have their element sizes, not refused as an unknown data type."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for rank in (0, 1):
        comms_args(traces, rank, dtype=dtype)
    _, result = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == 16777216 * element  # 2 ranks: (p-1)/p x 2 = 1 x n


def test_an_nccl_kernel_name_gives_a_64_bit_integer_type(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for rank in (0, 1):
        comms_args(traces, rank, dtype=None)
        edit_event(traces / f"rank{rank}.json", 8, name="ncclDevKernel_AllReduce_Sum_i64_RING_LL")
    _, result = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == 16777216 * 8


def two_profiled_steps(folder: Path) -> None:
    """The bundled traces profiled over two steps, as `torch.profiler.schedule(active=2)` records: the step
    again 5 ms later (new correlation ids), each under a ProfilerStep#N annotation of the launching thread."""
    for rank in (0, 1):
        path = folder / f"rank{rank}.json"
        doc = json.loads(path.read_text())
        second = json.loads(json.dumps(doc["traceEvents"]))
        for event in second:
            event["ts"] += 5000
            args = event.get("args") or {}
            for key in ("correlation", "wait_on_cuda_event_record_corr_id"):
                if key in args:
                    args[key] += 100
        doc["traceEvents"] += second + [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": ts,
             "dur": 100} for step, ts in ((1, 0), (2, 5000))]
        path.write_text(json.dumps(doc))


def test_a_profile_of_two_steps_replays_its_last_step(tmp_path):
    """Both steps' kernels were replayed as one step: 9.37 ms for a 4.18 ms step."""
    _, one = run(two_rank_scenario("100 Gb/s"), tmp_path)
    traces = copy_traces(KINETO_2RANK, tmp_path)
    two_profiled_steps(traces)
    _, two = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert two.summary["step_time_s"] == pytest.approx(one.summary["step_time_s"], rel=EXACT)
    assert two.summary["ops_executed"] == one.summary["ops_executed"]
    assert two.summary["trace"]["traced_step_time_s"] == pytest.approx(4000e-6, rel=EXACT)


@pytest.mark.parametrize("description,kind", [
    ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("mesh_tp", "tp"), ("CONTEXT_PARALLEL_GROUP", "cp"),
    ("EXPERT_MODEL_PARALLEL_GROUP", "ep"), ("DATA_PARALLEL_GROUP_WITH_CP", "dp"), ("mesh_dp_shard_cp", "dp"),
    ("EXPERT_DATA_PARALLEL_GROUP", "dp"), ("TENSOR_AND_EXPERT_PARALLEL_GROUP", "ep"), ("default_pg", "dp")])
def test_a_collective_counts_as_the_dimension_its_group_description_names(tmp_path, description, kind):
    """Megatron-LM spells its groups out (TENSOR_MODEL_PARALLEL_GROUP): its TP all-reduces counted as DP, and
    torchtitan's FSDP over `dp_shard_cp` as CP."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for rank in (0, 1):
        comms_args(traces, rank, **{"Process Group Description": description})
    _, result = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert [name for name, nbytes in result.summary["traffic_bytes_per_gpu"].items() if nbytes] == [kind]


def test_an_unsupported_chakra_collective_lists_the_types_by_name(tmp_path):
    """The allowed list named only numbers and primitives ('0 (all_reduce), ..., 9 (all_reduce)'), not the
    CollectiveCommType names a trace writes and trainsim reads."""
    traces = copy_traces(CHAKRA_2RANK, tmp_path)
    path = traces / "rank0.json"
    path.write_text(path.read_text().replace('{"name": "comm_type", "int64Val": "0"}',
                                             '{"name": "comm_type", "stringVal": "GATHER"}'))
    error = chakra_error(traces)
    assert error.field == "nodes[1]"
    assert error.problem == "collective type 'GATHER' of 'all_reduce gradients' is not supported"
    assert error.allowed == ("ALL_REDUCE (0), REDUCE (1), ALL_GATHER (2), BROADCAST (5), ALL_TO_ALL (6), "
                             "REDUCE_SCATTER (7), REDUCE_SCATTER_BLOCK (8), BARRIER (9)")


@pytest.mark.parametrize(("collective", "kernel", "primitive"), [
    ("_broadcast_oop", "ncclDevKernel_Broadcast_RING_LL", "broadcast"),
    ("_reduce_oop", "ncclDevKernel_Reduce_Sum_bf16_RING_LL", "reduce"),
    ("all_gather_into_tensor_coalesced", "ncclDevKernel_AllGather_RING_LL", "all_gather"),
    ("coalesced", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all_reduce"),
])
def test_pytorch_collective_names_outside_the_common_ones_replay(tmp_path, collective, kernel, primitive):
    """ProcessGroupNCCL's `_broadcast_oop` / `_reduce_oop` (an all-gather / reduce-scatter of uneven sizes),
    `all_gather_into_tensor_coalesced` and `coalesced` replay as their kernels' collectives, not refused as
    collectives trainsim does not model."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for rank in (0, 1):
        comms_args(traces, rank, **{"Collective name": collective})
        edit_event(traces / f"rank{rank}.json", 8, name=kernel)
    assert [op.op for op in read_kineto(traces / "rank0.json").ops if op.name == kernel] == [primitive]
    _, result = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert result.summary["step_time_s"] > 0


@pytest.mark.parametrize("kernel", ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_SendRecv"])
def test_a_kineto_collective_of_an_unknown_name_is_refused_at_its_kernel(tmp_path, kernel):
    """A `Collective name` outside the known ones gave way to the kernel name's: a 'gather' on an AllReduce
    kernel ran as a 32 MiB all-reduce with no warning, and PyTorch's gather, NCCL's SendRecv kernel, as a
    transfer 'whose peer the trace does not tell'."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for rank in (0, 1):
        comms_args(traces, rank, **{"Collective name": "gather"})
        edit_event(traces / f"rank{rank}.json", 8, name=kernel)
    error = kineto_error(traces)
    assert (Path(error.file).name, error.field) == ("rank0.json", "traceEvents[8]")
    assert error.problem == f"NCCL kernel {kernel!r} runs collective 'gather', which trainsim does not model"
    assert error.allowed.startswith("allreduce, all_reduce, allreduce_coalesced, allgather, ")
    assert "gather" not in error.allowed.split(", ")


def test_an_nccl_kernel_naming_no_collective_lists_the_kernel_words(tmp_path):
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for rank in (0, 1):
        comms_args(traces, rank, **{"Collective name": None})
        edit_event(traces / f"rank{rank}.json", 8, name="ncclDevKernel_Generic_4")
    error = kineto_error(traces)
    assert (Path(error.file).name, error.field) == ("rank0.json", "traceEvents[8]")
    assert error.problem == "NCCL kernel 'ncclDevKernel_Generic_4': cannot tell which collective it runs"
    assert error.allowed == ("a kernel name with a word of allreduce, allgather, reducescatter, broadcast, reduce, "
                             "alltoall, sendrecv, send, recv (ncclDevKernel_AllReduce_Sum_bf16_RING_LL), or a "
                             "record_param_comms annotation")


def test_collectives_with_sequence_numbers_match_by_them_and_replay_recosted(tmp_path):
    """tests/data/traces/seq-2rank: a GEMM of 1000 us on stream 7 and, on the NCCL stream from 1000 us, all-reduces
    of 8 and 16 MiB (bf16) with PyTorch's `Seq` 41 and 42, back to back (no host gap between them)."""
    loaded, result = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(SEQ_2RANK)), tmp_path)
    expected = 1000e-6 + allreduce_time(loaded, 8 * MIB, 2) + allreduce_time(loaded, 16 * MIB, 2)
    assert result.summary["step_time_s"] == pytest.approx(expected, rel=EXACT)
    assert result.summary["trace"]["collective_matching"] == {"0": "seq"}


def test_chakra_collectives_match_by_group_and_order_and_the_summary_says_so(tmp_path):
    """Chakra's converter writes no number of a collective within its group (a node's `seq_id` attribute is
    PyTorch's autograd sequence number of the op), so its collectives match by pg_name and issue order, as the
    summary says per group; the bundled Kineto trace has no `Seq` either."""
    text = f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{CHAKRA_2RANK}/rank*.json', format: chakra-json}}\n"
    _, chakra = run(text, tmp_path)
    assert chakra.summary["trace"]["collective_matching"] == {"0": "order"}
    _, kineto = run(two_rank_scenario("100 Gb/s"), tmp_path)
    assert kineto.summary["trace"]["collective_matching"] == {"0": "order"}


def test_a_collective_the_profiler_dropped_on_one_rank_is_named_by_its_sequence_number(tmp_path):
    """Rank 1's trace lacks the kernel of seq 41 (a profiler buffer that overflowed). By order, rank 1's 16 MiB
    all-reduce would be taken for rank 0's 8 MiB one; by sequence number the missing one is named."""
    traces = copy_traces(SEQ_2RANK, tmp_path)
    doc = json.loads((traces / "rank1.json").read_text())
    del doc["traceEvents"][1]
    (traces / "rank1.json").write_text(json.dumps(doc))
    error = kineto_error(traces)
    assert (Path(error.file).name, error.field) == ("rank0.json", "traceEvents[1]")
    assert error.problem == (f"all_reduce seq 41 of process group '0' on rank 0 has no counterpart on rank 1, whose "
                             f"trace ({traces / 'rank1.json'}) has seq 42 of the group")
    for rank, index in ((0, 1), (0, 2), (1, 1)):
        seq_args(traces, rank, index, Seq=None)
    error = kineto_error(traces)
    assert (Path(error.file).name, error.field) == ("rank1.json", "traceEvents[1]")
    assert error.problem == (f"all_reduce of 16777216 bytes on rank 1 as number 1 of process group '0', but "
                             f"all_reduce of 8388608 bytes on rank 0 ({traces / 'rank0.json'}: traceEvents[1])")


def test_ranks_disagreeing_on_a_numbered_collective_name_it_and_both_events(tmp_path):
    traces = copy_traces(SEQ_2RANK, tmp_path)
    seq_args(traces, 1, 2, **{"Collective name": "_allgather_base", "Out msg nelems": 16777216})
    error = kineto_error(traces)
    assert (Path(error.file).name, error.field) == ("rank1.json", "traceEvents[2]")
    assert error.problem == (f"all_gather of 33554432 bytes on rank 1 as seq 42 of process group '0', but "
                             f"all_reduce of 16777216 bytes on rank 0 ({traces / 'rank0.json'}: traceEvents[2])")


def chakra_gathers(folder: Path, ranks: int, recorded: str, size: int, listed: list[int] | None = None) -> None:
    """Chakra traces of ``ranks`` ranks, each all-gathering a 4 MiB shard over process group 'g' launched by a
    record_param_comms node, as Chakra's converter writes them (no metadata, unless ``listed`` gives the group's
    ranks). ``recorded``: where the trace records the group's ``size``: 'attr' (a `pg_size` attribute on the
    node, PyTorch's execution-trace name for it), 'launcher' (the last argument its record_param_comms node
    records: RECORD_PARAM_COMMS_DATA's worldSize), or 'none' (an older PyTorch's record, split sizes last)."""
    for rank in range(ranks):
        tail = {"attr": [[], []], "launcher": [[], [], 0, 1, size], "none": [[], []]}[recorded]
        values = [[[7, 8, 0, 2 * MIB, 2, "cuda:0"]], [12, False], ["g", "undefined"], rank, "all_gather", *tail]
        gather = {"id": 3, "name": "all_gather", "type": "COMM_COLL_NODE", "ctrlDeps": [2],
                  "attr": [{"name": "comm_type", "int64Val": 2}, {"name": "comm_size", "int64Val": 4 * MIB},
                           {"name": "pg_name", "stringVal": "g"},
                           *([{"name": "pg_size", "int64Val": size}] if recorded == "attr" else [])]}
        launcher = {"id": 2, "name": "record_param_comms", "type": "COMP_NODE",
                    "inputs": {"values": str(values)}, "attr": [{"name": "is_cpu_op", "boolVal": True}]}
        meta = [{"pg_name": "g", "pg_desc": "undefined", "ranks": listed, "group_size": len(listed)}] if listed else []
        nodes = [{"id": 1, "name": "## process_group:init ##", "type": "METADATA_NODE",
                  "inputs": {"values": str([json.dumps(meta)])}}] if meta else []
        (folder / f"rank{rank}.json").write_text(json.dumps([*nodes, launcher, gather]))


GATHER_SCENARIO = ("cluster: {{topology: ethernet-100g, nodes: 4}}\ncollectives: {{algorithm: ring}}\n"
                   "workload: {{trace: '{}/rank*.json', format: chakra-json}}\n")


@pytest.mark.parametrize("recorded", ["attr", "launcher"])
def test_a_chakra_all_gather_gathers_from_the_group_size_its_trace_records(tmp_path, recorded):
    """Four ranks' traces, no process-group metadata: the group's recorded size (4) confirms that the ranks using
    it are all of it, and the 4 MiB shards gather 16 MiB: (p-1)/p x 16 MiB = 12 MiB per GPU."""
    chakra_gathers(tmp_path, 4, recorded, 4)
    loaded, result = run(GATHER_SCENARIO.format(tmp_path), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(12 * MIB, rel=EXACT)
    assert result.summary["step_time_s"] == pytest.approx(allreduce_time(loaded, 16 * MIB, 4, "all_gather"),
                                                          rel=EXACT)


@pytest.mark.parametrize(("recorded", "stated"), [
    ("attr", "pg_size"), ("launcher", "the size its record_param_comms node (id 2) records")])
def test_a_chakra_all_gather_of_a_larger_group_than_its_traced_ranks_is_refused(tmp_path, recorded, stated):
    """Two ranks' traces of a group whose record says it has 4 members, none listed: the group was taken as the
    two ranks that use it and gathered 8 MiB (4 MiB per GPU, half its 12 MiB), without a warning (the two
    traces were the whole job by the ranks they name); which two other ranks gather with them is unknown."""
    chakra_gathers(tmp_path, 2, recorded, 4)
    with pytest.raises(TraceError) as caught:
        run(GATHER_SCENARIO.format(tmp_path), tmp_path)
    assert caught.value.file.endswith("rank0.json") and caught.value.field == "nodes[1]"
    assert caught.value.problem == (f"process group 'g' has 4 members ({stated}), but the trace does not tell which "
                                    "and only ranks [0, 1] use it")


def test_a_chakra_all_gather_without_a_recorded_size_is_its_users(tmp_path):
    """An older PyTorch's record_param_comms records no group size: the group is the ranks that use it (here
    every rank of the job), 8 MiB gathered, 4 MiB per GPU."""
    chakra_gathers(tmp_path, 2, "none", 0)
    _, result = run(GATHER_SCENARIO.format(tmp_path), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(4 * MIB, rel=EXACT)


def test_a_chakra_group_size_unlike_its_listed_ranks_is_refused(tmp_path):
    chakra_gathers(tmp_path, 2, "launcher", 4, listed=[0, 1])
    with pytest.raises(TraceError) as caught:
        run(GATHER_SCENARIO.format(tmp_path), tmp_path)
    assert caught.value.file.endswith("rank0.json") and caught.value.field == "nodes[2]"
    assert caught.value.problem == ("'all_gather' records a process group of 4 ranks (the size its "
                                    "record_param_comms node (id 2) records), but the process-group metadata lists 2 "
                                    "ranks [0, 1] for 'g'")


def idle_tp_job(folder: Path) -> None:
    """TP 2 x DP 2 on four ranks, groups named only by number, whose traces record only the DP all-reduces (4 MiB):
    the metadata lists the TP groups [0, 1] and [2, 3], which no op uses (TP traffic the trace does not record:
    Transformer Engine's userbuffers)."""
    groups = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    dp_group = {0: "3", 1: "4", 2: "3", 3: "4"}
    chakra_job(folder, groups, {rank: [("all_reduce", dp_group[rank], 4 * MIB)] for rank in range(4)})


def test_tp_groups_listed_but_unused_refuse_a_tp_size_inferred_one(tmp_path):
    """The TP size read from the groups in use (the layout that replication and the groups' dimensions follow) is
    unknown where the listed run [0, 1] is unused, and refused naming traced_tp, not silently 1."""
    idle_tp_job(tmp_path)
    error = refusal(chakra_scenario(tmp_path), tmp_path)
    assert (error.field, error.allowed.split(":")[0]) == ("workload.trace", "workload.traced_tp")
    assert error.problem == ("process group '1' (ranks [0, 1]) is listed but used by no op; it is 2 consecutive ranks "
                             "inside a pipeline stage of 4, as a TP group is, and the groups in use tell no TP size: "
                             "TP 1 or 2 is unknown")


@pytest.mark.parametrize("tp", [1, 2])
def test_tp_groups_listed_but_unused_replay_with_the_declared_tp(tmp_path, tp):
    """Declared, either TP size replays the DP all-reduces: the two-rank ring's n = 4 MiB per GPU."""
    idle_tp_job(tmp_path)
    text = chakra_scenario(tmp_path).replace("format: chakra-json}", f"format: chakra-json, traced_tp: {tp}}}")
    _, result = run(text, tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(4 * MIB, rel=EXACT)


def test_numbered_groups_count_as_the_dimension_their_ranks_vary_along(tmp_path):
    """TP 2 x DP 2 on four ranks, groups named only by number: the runs of consecutive ranks [0, 1] and [2, 3] are TP
    (Megatron-LM's and torchtitan's order, TP innermost), the strided [0, 2] and [1, 3] DP. Each rank all-reduces 1
    MiB over its TP group and 4 MiB over its DP group; a two-rank ring sends 2(p-1)/p x n = n per GPU (every numbered
    group counted as DP would read 5 MiB)."""
    groups = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    tp_group, dp_group = {0: "1", 1: "1", 2: "2", 3: "2"}, {0: "3", 1: "4", 2: "3", 3: "4"}
    chakra_job(tmp_path, groups, {rank: [("all_reduce", tp_group[rank], MIB), ("all_reduce", dp_group[rank], 4 * MIB)]
                                  for rank in range(4)})
    _, result = run(chakra_scenario(tmp_path), tmp_path)
    traffic = result.summary["traffic_bytes_per_gpu"]
    assert (traffic["tp"], traffic["dp"]) == (pytest.approx(MIB, rel=EXACT), pytest.approx(4 * MIB, rel=EXACT))


def tp_pp_job(folder: Path) -> None:
    """TP 2 x PP 2 on four ranks: stage 0 (ranks 0, 1) all-reduces 1 MiB over its group of consecutive ranks and
    sends 2 MiB to the same place in stage 1, which receives it and all-reduces 1 MiB over its own group."""
    first = {rank: [("all_reduce", "1", MIB), ("send", rank + 2, 2 * MIB)] for rank in (0, 1)}
    second = {rank: [("recv", rank - 2, 2 * MIB), ("all_reduce", "2", MIB)] for rank in (2, 3)}
    chakra_job(folder, {"1": [0, 1], "2": [2, 3]}, first | second)


@pytest.mark.parametrize(("declared", "kind"), [("traced_tp: 2", "tp"), ("traced_tp: 1", "dp"),
                                                  ("traced_tp: 2, traced_pp: 2", "tp")])
def test_a_numbered_group_of_a_whole_pipeline_stage_is_refused_unless_the_layout_is_declared(tmp_path, declared, kind):
    """Transfers two ranks apart make stages of two ranks, and the groups [0, 1] and [2, 3] are whole stages: TP 2
    without DP, or DP 2 without TP. Declared, each rank's 1 MiB all-reduce sends n = 1 MiB per GPU of that kind;
    the transfers count as PP, 2 MiB over four GPUs."""
    tp_pp_job(tmp_path)
    assert str(refusal(chakra_scenario(tmp_path), tmp_path)) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.trace: process group '1' is all 2 ranks of a pipeline stage: "
        "tensor parallelism without data parallelism, or the other way round, is unknown (allowed: "
        "workload.traced_tp: 2 or 1 (the traced job's TP size), or Process Group Descriptions)")
    text = chakra_scenario(tmp_path).replace("format: chakra-json", f"format: chakra-json, {declared}")
    _, result = run(text, tmp_path)
    traffic = result.summary["traffic_bytes_per_gpu"]
    assert (traffic[kind], traffic["pp"]) == (pytest.approx(MIB, rel=EXACT), pytest.approx(MIB, rel=EXACT))


def kinds_of(groups: dict[str, list[int] | tuple[int, ...]], transfers: list[tuple[int, int]],
             all_to_alls: dict[str, bool] | None = None, **declared):
    """The dimensions of numbered ``groups`` of an 8-rank job with the sizes ``declared`` (tp=, cp=...), the
    groups ``all_to_alls`` names running all-to-alls (True: split unevenly)."""
    members = {name: ProcessGroup("undefined", tuple(ranks)) for name, ranks in groups.items()}
    return dimensions(members, 8, [Transfer(src, dst, "") for src, dst in transfers], TracedSizes(**declared),
                      all_to_alls=all_to_alls).groups


@pytest.mark.parametrize(("groups", "transfers", "declared", "kinds"), [
    # TP 2 x CP 2 x DP 2 on 8 ranks, one stage: [0, 1] sets TP 2, so r = rank % 8 // 2; [0, 2] runs r 0-1 of
    # 0-3 (CP, declared 2 with no EP), [0, 4] r 0, 2 (DP), [0, 2, 4, 6] all of r (DP with CP), every rank DP
    ({"tp": [0, 1], "cp": [0, 2], "dp": [0, 4], "dp_cp": [0, 2, 4, 6], "world": list(range(8))}, [],
     {"cp": 2, "ep": 1}, ["tp", "cp", "dp", "dp", "dp"]),
    # the same with EP 2 in CP's place (EP 2, CP 1)
    ({"tp": [0, 1], "ep": [0, 2]}, [], {"cp": 1}, ["tp", "ep"]),
    # CP 2 and EP 4 on 8 ranks of TP 1: each run counts as the one of its length
    ({"cp": [0, 1], "ep": [0, 1, 2, 3]}, [], {"tp": 1, "cp": 2, "ep": 4}, ["cp", "ep"]),
    # TP 2 x DP 2 x PP 2: a transfer 4 ranks apart makes stages of 4; [0, 4] varies the stage alone (PP),
    # Megatron-LM's model-parallel group [0, 1, 4, 5] the TP place first (TP)
    ({"tp": [0, 1], "dp": [0, 2], "pp": [0, 4], "mp": [0, 1, 4, 5]}, [(0, 4)], {}, ["tp", "dp", "pp", "tp"]),
])
def test_the_dimension_of_a_numbered_group_is_the_first_its_ranks_vary_along(groups, transfers, declared, kinds):
    found = kinds_of(groups, transfers, **declared)
    assert [found[name] for name in groups] == kinds


@pytest.mark.parametrize(("all_to_alls", "declared", "kinds"), [
    ({}, {}, ["dp", "dp"]), ({"ep": True}, {}, ["ep", "dp"]), ({"ep": True}, {"ep": 4}, ["ep", "dp"])])
def test_an_all_to_all_group_over_the_rest_of_a_stage_is_ep_not_dp(all_to_alls, declared, kinds):
    """TP 1 x EP 4 x PP 2 on 8 ranks (a transfer 4 ranks apart: stages of 4): the EP group [0, 1, 2, 3] has the
    ranks of the DP group, the whole rest of its stage. Its uneven all-to-alls (token dispatch) make it EP; DP
    runs none, so it stays DP, EP 4 declared or not. Both counted as DP."""
    found = kinds_of({"ep": [0, 1, 2, 3], "dp": (0, 1, 2, 3)}, [(0, 4)], all_to_alls, tp=1, **declared)
    assert [found["ep"], found["dp"]] == kinds


def test_a_group_over_the_rest_of_a_stage_that_ep_spans_unseen_is_refused_naming_traced_ep():
    """The same job with EP 4 declared: the DP group [0, 1, 2, 3] has the EP group's ranks. Where the EP group
    runs all-to-alls it is told apart and the other is DP (above); where none does (Megatron-LM's all-gather
    token dispatcher runs all-gathers and reduce-scatters, as a distributed optimizer's DP group does), which is
    which is unknown: refused naming traced_ep (both counted as DP)."""
    with pytest.raises(ScenarioError) as caught:
        kinds_of({"ep": [0, 1, 2, 3], "dp": (0, 1, 2, 3)}, [(0, 4)], tp=1, ep=4)
    assert caught.value.problem == (
        "process group 'ep' (ranks [0, 1, 2, 3]) spans its pipeline stage, as EP of 4 does beside DP, and runs no "
        "all-to-all: whether it is the EP group or the DP group is unknown")
    assert caught.value.allowed == ("workload.traced_ep where the traced job's EP is not 4, or a Process Group "
                                    "Description naming the group's dimension")


MESH_TP2_DP2 = {"tp0": ProcessGroup("mesh_tp", (0, 1)), "tp1": ProcessGroup("mesh_tp", (2, 3)),
                "dp0": ProcessGroup("mesh_dp", (0, 2)), "dp1": ProcessGroup("mesh_dp", (1, 3))}
"""A 4-rank job's groups as torchtitan's mesh describes them: TP 2, DP 2."""


@pytest.mark.parametrize(("declared", "field", "problem"), [
    ({"cp": 3}, "workload.traced_cp", "TP 2 x CP 3 does not divide the traced job's pipeline stages of 4 ranks"),
    ({"cp": 2}, "workload.traced_cp", "the trace's process group 'mesh_dp' is data-parallel over 2 ranks, but TP 2 x "
     "CP 2 x PP 1 on the traced job's 4 ranks leave data parallelism of 1"),
    ({"pp": 2}, "workload.traced_pp", "the trace's process group 'mesh_dp' is data-parallel over 2 ranks, but TP 2 x "
     "CP 1 x PP 2 on the traced job's 4 ranks leave data parallelism of 1"),
    ({"pp": 4}, "workload.traced_pp", "4 pipeline stages of 1 rank cannot hold the trace's TP groups of 2 ranks"),
])
def test_declared_sizes_that_cannot_hold_the_described_groups_are_refused_at_their_own_field(declared, field,
                                                                                              problem):
    """TP 2 x DP 2 described by the mesh: CP 3 does not divide the ranks (it was accepted); CP 2 or PP 2 leave no
    room for the data-parallel groups of 2 (accepted, the DP groups' traffic counted as dp of a job of DP 1); 4
    stages of one rank cannot hold the TP groups (refused naming traced_tp, which the scenario did not set)."""
    with pytest.raises(ScenarioError) as caught:
        dimensions(MESH_TP2_DP2, 4, [], TracedSizes(**declared))
    assert (caught.value.field, caught.value.problem) == (field, problem)


@pytest.mark.parametrize(("world", "declared"), [(2, {}), (4, {"pp": 2})])
def test_a_numbered_group_over_cp_ranks_that_fill_a_job_without_dp_is_refused_as_over_a_stage(world, declared):
    """TP 1 x CP 2 and no DP, in one stage or two: the numbered group [0, 1] runs no all-to-all, and is the CP group's
    or the gradients' (DATA_PARALLEL_GROUP_WITH_CP). Where it spans every rank (one stage) TP x CP x PP = the job's
    ranks leaves it no DP group, so it is refused as in two stages, not counted as the default group's DP unseen.
    Told apart by a group described as CP, it is DP."""
    groups = {"5": ProcessGroup("", (0, 1))}
    sizes = TracedSizes(tp=1, cp=2, ep=1, **declared)
    with pytest.raises(ScenarioError) as caught:
        dimensions(groups, world, [], sizes)
    assert (caught.value.field, caught.value.allowed.split(" ")[0]) == ("workload.trace", "workload.traced_cp")
    described = {"6": ProcessGroup("CONTEXT_PARALLEL_GROUP", (0, 1))}
    assert dimensions(groups, world, [], sizes, described).groups == {"5": "dp"}


def test_an_ep_dispatch_of_the_cp_size_does_not_tell_the_cp_groups_apart():
    """CP = EP = 4 in stages of 4 ranks (no TP, no DP): [0, 1, 2, 3] running uneven all-to-alls is EP's token
    dispatch, which tells the EP groups apart but not CP's; the numbered group of the same ranks running none is
    the CP group's or the gradients', refused naming traced_cp (it counted as DP, the dispatch taken to identify
    CP too)."""
    with pytest.raises(ScenarioError) as caught:
        kinds_of({"ep": [0, 1, 2, 3], "dp": (0, 1, 2, 3)}, [], {"ep": True}, tp=1, pp=2, cp=4, ep=4)
    assert caught.value.problem.startswith("process group 'dp' (ranks [0, 1, 2, 3]) spans its pipeline stage, as CP "
                                           "of 4 does (no DP)")
    assert kinds_of({"ep": [0, 1, 2, 3], "dp": (0, 1, 2, 3)}, [], {"ep": True}, tp=1, pp=2, cp=1, ep=4) == {
        "ep": "ep", "dp": "dp"}


@pytest.mark.parametrize(("declared", "transfers", "allowed", "telling", "told"), [
    ({"tp": 1, "pp": 4, "cp": 2}, [], "workload.traced_cp where the traced job's CP is not 2, or a Process Group "
     "Description naming the group's dimension", ({"ep": 1}, False, "cp"), ({}, True, None)),
    ({"tp": 1, "ep": 4}, [(0, 4)], "workload.traced_ep where the traced job's EP is not 4, or a Process Group "
     "Description naming the group's dimension", ({"cp": 1}, False, "ep"), ({"cp": 4}, True, None)),
])
def test_a_group_the_gradients_may_share_is_refused_unless_its_dimensions_all_to_alls_tell_it_apart(
        declared, transfers, allowed, telling, told):
    """The numbered group [0, 1] (CP 2 filling stages of 2 ranks) or [0, 1, 2, 3] (EP 4 beside DP in stages of 4) runs
    no all-to-all and may be that dimension's or the gradients': refused, the allowed text naming the size and the
    descriptions a user can give. An all-to-all group of that dimension tells them apart (not any all-to-all group
    of that size whatever it reads as): the group then counts as DP. One of the other reading does not: with EP 4
    and CP 4 an uneven dispatch reads as EP, not CP's; with CP 2 an uneven one reads as EP's: each leaves the
    numbered group refused."""
    size = 2 if "cp" in declared else 4
    ranks = tuple(range(size))
    with pytest.raises(ScenarioError) as caught:
        kinds_of({"dp": ranks}, transfers, **declared)
    assert caught.value.allowed == allowed
    more, uneven, kind = telling
    assert kinds_of({"dp": ranks, "a2a": list(ranks)}, transfers, {"a2a": uneven}, **declared, **more) == {
        "dp": "dp", "a2a": kind}
    more, uneven, _ = told
    with pytest.raises(ScenarioError) as caught:
        kinds_of({"dp": ranks, "a2a": list(ranks)}, transfers, {"a2a": uneven}, **{**declared, **more})
    assert caught.value.problem.startswith("process group 'dp'")


@pytest.mark.parametrize(("groups", "declared", "field", "problem"), [
    ({"1": (0, 1), "2": (0, 1, 2, 3)}, {}, "workload.trace",
     "process groups of 2 and 4 consecutive ranks ('1', '2'): which is tensor parallelism is unknown"),
    ({"1": (0, 1, 2)}, {"tp": 3}, "workload.traced_tp",
     "tensor parallelism of 3 does not divide the traced job's pipeline stages of 8 ranks"),
    ({"1": (0, 1), "2": (0, 2)}, {}, "workload.trace", "process group '2' (ranks [0, 2]) spans 2 consecutive places "
     "next to tensor parallelism in its pipeline stage: context or expert parallelism is unknown"),
])
def test_a_layout_that_cannot_be_told_is_refused(groups, declared, field, problem):
    with pytest.raises(ScenarioError) as caught:
        kinds_of(groups, [], **declared)
    assert (caught.value.field, caught.value.problem) == (field, problem)


def moe_job(folder: Path, named: dict[str, tuple[str, list[int]]] | None = None) -> None:
    """A 4-rank mixture-of-experts job without TP in Megatron-LM's order, its groups named only by number: expert
    parallelism over [0, 1] and [2, 3] (the places next to TP, as CP would be), expert data parallelism over
    [0, 2] and [1, 3], dense data parallelism over all four. Each rank all-reduces 1 MiB over its EP group, 2 MiB
    over its expert-DP group, 4 MiB over all ranks; ``named``: more groups the metadata lists (name: description,
    ranks), used by no collective."""
    groups = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3], "5": [0, 1, 2, 3]}
    chakra_job(folder, groups, {rank: [("all_reduce", "1" if rank < 2 else "2", MIB),
                                       ("all_reduce", "3" if rank % 2 == 0 else "4", 2 * MIB),
                                       ("all_reduce", "5", 4 * MIB)] for rank in range(4)},
               named=named)


@pytest.mark.parametrize(("declared", "kind"), [
    ("", "tp"), ("traced_tp: 1, traced_cp: 1", "ep"), ("traced_tp: 1, traced_cp: 1, traced_ep: 2", "ep"),
    ("traced_tp: 1, traced_cp: 2, traced_ep: 1", "cp")])
def test_numbered_groups_next_to_tp_count_as_the_cp_or_ep_the_declared_sizes_leave(tmp_path, declared, kind):
    """The groups [0, 1] and [2, 3] are TP by default (TP innermost); with no TP they take the places next to
    it, which CP and EP share, and count as the one whose declared size they can be. Per GPU: the two-rank rings
    send n (1 MiB over [0, 1], 2 MiB over [0, 2]), the 4-rank ring 2 (p-1)/p n = 6 MiB. The step is the three
    all-reduces one after another (each rank's chain, NCCL's Simple protocol), none sharing a link with another
    at the same time."""
    moe_job(tmp_path)
    text = chakra_scenario(tmp_path, protocol="simple").replace("format: chakra-json",
                                                                f"format: chakra-json, {declared}")
    loaded, result = run(text, tmp_path)
    traffic = result.summary["traffic_bytes_per_gpu"]
    assert (traffic[kind], traffic["dp"]) == (pytest.approx(MIB, rel=EXACT), pytest.approx(8 * MIB, rel=EXACT))
    expected = allreduce_time(loaded, MIB, 2) + allreduce_time(loaded, 2 * MIB, 2) + allreduce_time(loaded, 4 * MIB, 4)
    assert result.summary["step_time_s"] == pytest.approx(expected, rel=EXACT)


@pytest.mark.parametrize(("declared", "problem", "allowed"), [
    ("traced_tp: 1", "context or expert parallelism is unknown",
     "workload.traced_cp and traced_ep together (one alone leaves the other unknown): the traced job's CP and EP "
     "sizes (1 where it has none; 2 for this group's)"),
    ("traced_tp: 1, traced_ep: 2", "expert parallelism of 2, or context parallelism, whose size is not told",
     "workload.traced_cp: the traced job's CP size (1 where it has none)"),
    ("traced_tp: 1, traced_cp: 2, traced_ep: 2", "context and expert parallelism are both 2, so which it is is "
     "unknown", "Process Group Descriptions naming the group's dimension"),
    ("traced_tp: 1, traced_cp: 1, traced_ep: 1", "but the traced job's context parallelism is 1 and its expert "
     "parallelism 1", "Process Group Descriptions naming the group's dimension"),
])
def test_a_numbered_group_that_could_be_cp_or_ep_is_refused_naming_what_to_declare(tmp_path, declared, problem,
                                                                                    allowed):
    moe_job(tmp_path)
    text = chakra_scenario(tmp_path).replace("format: chakra-json", f"format: chakra-json, {declared}")
    refused = refusal(text, tmp_path)
    assert refused.field == "workload.trace"
    assert refused.problem.startswith("process group '1' (ranks [0, 1]) spans 2 consecutive places next to "
                                      "tensor parallelism in its pipeline stage")
    assert problem in refused.problem and refused.allowed.startswith(allowed)


def test_the_sizes_that_named_groups_tell_place_the_numbered_ones(tmp_path):
    """Megatron-LM names its groups: a TENSOR_MODEL_PARALLEL_GROUP and a CONTEXT_PARALLEL_GROUP of one rank each
    (TP 1, CP 1), listed by the metadata though no collective uses them, leave the places next to TP to EP; the
    numbered [0, 1] counts as EP with nothing declared (it counted as TP). A declared size that they contradict
    is refused at its line."""
    named = {"6": ("TENSOR_MODEL_PARALLEL_GROUP", [0]), "7": ("CONTEXT_PARALLEL_GROUP", [0])}
    moe_job(tmp_path, named)
    _, result = run(chakra_scenario(tmp_path), tmp_path)
    traffic = result.summary["traffic_bytes_per_gpu"]
    assert (traffic["ep"], traffic["tp"], traffic["dp"]) == (
        pytest.approx(MIB, rel=EXACT), 0.0, pytest.approx(8 * MIB, rel=EXACT))
    text = chakra_scenario(tmp_path).replace("format: chakra-json", "format: chakra-json, traced_tp: 2")
    assert str(refusal(text, tmp_path)) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.traced_tp: the trace's process group 'TENSOR_MODEL_PARALLEL_GROUP' "
        "has 1 rank, but the scenario declares TP of 2 (allowed: 1, as the trace's groups say, or traced_tp left out)")


def pairs_job(folder: Path, named: dict[str, tuple[str, list[int]]] | None = None) -> None:
    """Four ranks, their groups named only by number: each rank all-reduces 1 MiB over [0, 1] or [2, 3] and 2 MiB
    over [0, 2] or [1, 3]. TP 2 x CP 2 (no DP), or CP 2 x DP 2 (no TP), alike. ``named``: more groups the
    metadata lists (name: description, ranks), used by no collective."""
    chakra_job(folder, {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]},
               {rank: [("all_reduce", "1" if rank < 2 else "2", MIB), ("all_reduce", "3" if rank % 2 == 0 else "4",
                                                                       2 * MIB)] for rank in range(4)}, named=named)


@pytest.mark.parametrize(("job", "declared", "other"), [(pairs_job, "traced_cp: 2", "context"),
                                                         (moe_job, "traced_ep: 2", "expert")])
def test_a_run_of_consecutive_ranks_of_the_declared_cp_or_ep_size_is_not_taken_for_tp(tmp_path, job, declared,
                                                                                        other):
    """Runs of two consecutive ranks, [0, 1] and [2, 3], with CP (or EP) of 2 declared and TP not: TP 2 beside a
    CP (EP) of 2 over [0, 2] and [1, 3] (no DP), or no TP and a CP (EP) of 2 over the runs (DP over [0, 2]); both
    layouts hold every group whole, so it is refused naming traced_tp. They were taken for TP. Declared, the
    runs' 1 MiB all-reduces send the two-rank ring's n = 1 MiB per GPU of CP (EP), [0, 2]'s 2 MiB ones 2 MiB of
    DP."""
    job(tmp_path)
    text = chakra_scenario(tmp_path).replace("format: chakra-json", f"format: chakra-json, {declared}")
    assert str(refusal(text, tmp_path)) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.trace: process group '1' (ranks [0, 1]) is 2 consecutive ranks "
        f"inside a pipeline stage: tensor parallelism of 2, or {other} parallelism of 2 without TP, is unknown "
        "(allowed: workload.traced_tp: 2 or 1 (the traced job's TP size), or Process Group Descriptions)")
    kind = "cp" if other == "context" else "ep"
    layout = "traced_tp: 1, traced_cp: 1, traced_ep: 1".replace(f"{kind}: 1", f"{kind}: 2")
    _, result = run(text.replace(declared, layout), tmp_path)
    traffic = result.summary["traffic_bytes_per_gpu"]
    assert (traffic[kind], traffic["tp"]) == (pytest.approx(MIB, rel=EXACT), 0.0)


def test_a_numbered_reduction_over_the_cp_ranks_of_a_job_without_dp_is_refused_unless_cp_is_told_apart(tmp_path):
    """TP 2 x CP 2 declared (no DP): [0, 2] spans the whole rest of the stage, which CP fills, and all-reduces 2
    MiB. Megatron-LM reduces the gradients over DATA_PARALLEL_GROUP_WITH_CP, the CP group's ranks where DP is 1,
    and its CP group runs no all-to-all either (ring sends, Transformer Engine's all-gathers, the loss's
    all-reduce): refused naming traced_cp (it counted as CP). With the CP groups the metadata describes as
    CONTEXT_PARALLEL_GROUP (unused here), the numbered [0, 2] is the gradients': per GPU the two-rank rings' n,
    1 MiB of TP and 2 MiB of DP, no CP."""
    pairs_job(tmp_path)
    text = chakra_scenario(tmp_path).replace("format: chakra-json",
                                             "format: chakra-json, traced_tp: 2, traced_cp: 2, traced_ep: 1")
    assert str(refusal(text, tmp_path)) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.trace: process group '3' (ranks [0, 2]) spans its pipeline "
        "stage, as CP of 2 does (no DP), and runs no all-to-all: whether it is the CP group or the gradients' is "
        "unknown (allowed: workload.traced_cp where the traced job's CP is not 2, or a Process Group Description "
        "naming the group's dimension)")
    pairs_job(tmp_path, {"6": ("CONTEXT_PARALLEL_GROUP", [0, 2]), "7": ("CONTEXT_PARALLEL_GROUP", [1, 3])})
    _, result = run(text, tmp_path)
    traffic = result.summary["traffic_bytes_per_gpu"]
    assert (traffic["tp"], traffic["dp"], traffic["cp"]) == (
        pytest.approx(MIB, rel=EXACT), pytest.approx(2 * MIB, rel=EXACT), 0.0)


@pytest.mark.parametrize(("splits", "declared", "kind", "pair"), [
    (UNEVEN, "", "ep", 6 * MIB), ({rank: ("[2097152, 2097152]",) * 2 for rank in (0, 1)},
                                  "traced_cp: 2, traced_ep: 1", "cp", 4 * MIB),
    (EVEN, "traced_cp: 1", "ep", 4 * MIB)])
def test_an_all_to_all_is_cp_or_ep_by_its_splits_or_the_declared_sizes_never_dp(tmp_path, splits, declared, kind,
                                                                                pair):
    """Two ranks whose numbered group [0, 1] runs an all-to-all: neither TP nor DP runs one (it counted as DP, the
    group being every rank), so it is EP where its shares differ (a mixture of experts' token dispatch; a Ulysses
    attention's all-to-all splits evenly), else the CP or EP that the declared sizes leave. Per GPU, the
    all-to-all sends 4 MiB of that kind (evenly (p-1)/p x n; unevenly 6 and 2 MiB), the default group's two-rank
    ring all-reduce n = 16 MiB of DP, in a step of the GEMM and the two re-costed collectives back to back. The
    all-to-all's one phase lasts as long as its larger transfer, ``pair`` bytes: the time of an even all-to-all of
    2 x ``pair`` (it ran with even shares of 4 MiB whatever the splits)."""
    text = all_to_all_2rank(tmp_path, splits)
    if declared:
        text = text.replace("format: kineto", f"format: kineto, {declared}")
    loaded, result = run(text, tmp_path)
    traffic = result.summary["traffic_bytes_per_gpu"]
    assert (traffic[kind], traffic["dp"]) == (pytest.approx(4 * MIB, rel=EXACT), pytest.approx(16 * MIB, rel=EXACT))
    exchange, reduce = allreduce_time(loaded, 2 * pair, 2, "all_to_all"), allreduce_time(loaded, 16 * MIB, 2)
    assert result.summary["step_time_s"] == pytest.approx(1000e-6 + exchange + reduce, rel=EXACT)
    exposed = result.summary["exposed_comm_s"]
    assert (exposed[kind], exposed["dp"]) == (pytest.approx(exchange, rel=EXACT), pytest.approx(reduce, rel=EXACT))


DISPATCH_MIB = ((1, 8, 2, 2), (2, 1, 4, 2), (2, 2, 1, 6), (3, 2, 2, 1))
"""MiB rank i sends rank j in a 4-rank token dispatch (row i, column j): unequal rows and columns."""


def dispatch_4rank(folder: Path, ranks: tuple[int, ...] = (0, 1, 2, 3)) -> None:
    """Kineto traces of ``ranks`` of a 4-rank job whose one kernel is an all-to-all over every rank (group '9',
    described 'undefined'), its args as recent PyTorch writes them on an NCCL kernel: bf16 elements in and out,
    each rank's `In split size` its row of DISPATCH_MIB and `Out split size` its column, in elements."""
    folder.mkdir(parents=True, exist_ok=True)
    elements = MIB // 2
    for rank in ranks:
        sends = [share * elements for share in DISPATCH_MIB[rank]]
        receives = [row[rank] * elements for row in DISPATCH_MIB]
        args = {"device": rank, "stream": 20, "correlation": 1, "Collective name": "all_to_allv",
                "In msg nelems": sum(sends), "Out msg nelems": sum(receives), "dtype": "BFloat16", "Group size": 4,
                "Process Group Name": "9", "Process Group Description": "undefined",
                "Process Group Ranks": "[0, 1, 2, 3]", "In split size": str(sends), "Out split size": str(receives),
                "Seq": 1}
        kernel = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": 0, "tid": 20, "ts": 0,
                  "dur": 900, "args": args}
        doc = {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4}, "traceEvents": [kernel]}
        (folder / f"rank{rank}.json").write_text(json.dumps(doc))


def dispatch_scenario(folder: Path) -> str:
    return ("cluster: {topology: ethernet-100g, nodes: 4, nic_bandwidth: 100 Gb/s}\n"
            f"workload: {{trace: '{folder}/rank*.json', format: kineto}}\n")


def test_a_traced_all_to_all_runs_with_its_recorded_split_sizes(tmp_path):
    """Four single-GPU hosts, each rank's trace one uneven all-to-all (DISPATCH_MIB). NCCL's all-to-all sends to
    every peer at once, so the flows share the NICs and it lasts as long as its busiest NIC needs: rank 0 sends 12
    MiB (8 + 2 + 2) and rank 1 receives 12 (8 + 2 + 2), the closed form of a 12 MiB transfer after the grouped
    kernel's one base latency (NCCL's Simple 8.4 us). Per GPU it sends what its row sends to others, 37 / 4 MiB in
    the mean, as EP (an uneven all-to-all)."""
    dispatch_4rank(tmp_path)
    _, result = run(dispatch_scenario(tmp_path), tmp_path)
    assert result.summary["step_time_s"] == pytest.approx(NCCL_SIMPLE_BASE_S + transfer_s(100e9, 12 * MIB),
                                                          rel=EXACT)
    assert result.summary["traffic_bytes_per_gpu"]["ep"] == pytest.approx(37 / 4 * MIB, rel=EXACT)


def test_pairs_between_untraced_ranks_take_the_mean_of_the_told_ones(tmp_path):
    """Ranks 0 and 1 traced: their rows and columns tell every pair but 2 -> 3 and 3 -> 2, which take the mean
    of the ten told pairs between different ranks, (8 + 2 + 2 + 2 + 4 + 2 + 2 + 3 + 2 + 2) / 10 = 2.9 MiB: the
    ranks send 12, 8, 2 + 2 + 2.9 and 3 + 2 + 2.9 MiB, 34.8 / 4 in the mean, and the busiest NICs still carry
    12 MiB (rank 0's out, rank 1's in), after the grouped kernel's one 8.4 us base latency."""
    dispatch_4rank(tmp_path, (0, 1))
    _, result = run(dispatch_scenario(tmp_path), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["ep"] == pytest.approx(34.8 / 4 * MIB, rel=EXACT)
    assert result.summary["step_time_s"] == pytest.approx(NCCL_SIMPLE_BASE_S + transfer_s(100e9, 12 * MIB),
                                                          rel=EXACT)


def test_split_sizes_on_which_a_sender_and_its_receiver_disagree_are_refused(tmp_path):
    """Rank 2 says it receives 5 MiB from rank 1, whose row sends it 4 MiB: one line naming both traces."""
    dispatch_4rank(tmp_path)
    path = tmp_path / "rank2.json"
    doc = json.loads(path.read_text())
    doc["traceEvents"][0]["args"]["Out split size"] = str([share * MIB // 2 for share in (2, 5, 1, 2)])
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as caught:
        run(dispatch_scenario(tmp_path), tmp_path)
    assert str(caught.value) == (
        f"{path}: traceEvents[0]: all_to_all seq 1 of process group '9': rank 1 sends rank 2 5242880 bytes by rank "
        f"2's split sizes, but 4194304 bytes by rank 1's ({tmp_path / 'rank1.json'}: traceEvents[0]) (allowed: In "
        "split size and Out split size on which each sender and receiver agree)")


def test_an_evenly_split_all_to_all_of_untold_cp_and_ep_is_refused_naming_both(tmp_path):
    """A Ulysses attention's all-to-all and an evenly split token dispatch look alike: with neither size
    declared, refused in one line naming traced_cp and traced_ep."""
    text = all_to_all_2rank(tmp_path, EVEN)
    assert str(refusal(text, tmp_path)) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.trace: process group '5' (ranks [0, 1]) spans 2 consecutive places "
        "next to tensor parallelism in its pipeline stage: context or expert parallelism is unknown (allowed: "
        "workload.traced_cp and traced_ep together (one alone leaves the other unknown): the traced job's CP and EP "
        "sizes (1 where it has none; 2 for this group's), or Process Group Descriptions naming the group's "
        "dimension)")


def test_even_all_to_alls_of_different_sizes_are_refused_as_other_collectives_are(tmp_path):
    """Rank 1's even all-to-all has 2 Mi elements (4 MiB) in, rank 0's 4 Mi (8 MiB), neither listing splits (as
    Chakra's never do): refused as members disagreeing on the size, not on split sizes the traces do not have."""
    text = all_to_all_2rank(tmp_path, EVEN).replace("format: kineto", "format: kineto, traced_cp: 1")
    seq_args(tmp_path / "traces", 1, 1, **{"In msg nelems": 2**21, "Out msg nelems": 2**21})
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert (caught.value.problem, caught.value.allowed) == (
        f"all_to_all seq 1 of process group '5': 4194304 bytes on rank 1, but 8388608 bytes on rank 0 "
        f"({tmp_path / 'traces' / 'rank0.json'}: traceEvents[1])", "the same primitive and size on every member")


def test_a_cp_trace_of_two_ranks_has_no_data_parallelism_to_replicate(tmp_path):
    """A CP 2 trace of the two ranks has no data parallelism, and `dp: 4` is refused, not spread over four ranks (6 MiB
    of CP per GPU, as if its CP group were the gradients'). Split lists replicated: tests/test_trace_replication.py."""
    halves = {rank: ("[2097152, 2097152]",) * 2 for rank in (0, 1)}
    text = all_to_all_2rank(tmp_path / "cp", halves).replace(
        "format: kineto", "format: kineto, traced_cp: 2, traced_ep: 1, dp: 4").replace("nodes: 2", "nodes: 4")
    assert refusal(text, tmp_path / "cp").problem.startswith("the traced job has no data parallelism")


def cp_ring_job(folder: Path, ring_groups: str) -> None:
    """CP 2 x DP 2 on four ranks without TP or PP: each CP pair ([0, 1], [2, 3]) passes 1 MiB each way, as a ring
    attention's sends do, then each rank all-reduces 2 MiB over its numbered DP group ([0, 2], [1, 3]). The CP
    groups are "6" and "7"; ``ring_groups`` says how the trace tells them: "named" (described
    CONTEXT_PARALLEL_GROUP, the sends in them), "listed" (so described in the metadata, the sends in no group), or
    "numbered" (described "undefined", as the sends' groups)."""
    cp_group = {0: "6", 1: "6", 2: "7", 3: "7"}
    first = {0: "send", 1: "recv", 2: "send", 3: "recv"}
    second = {"send": "recv", "recv": "send"}
    in_group = {rank: [] if ring_groups == "listed" else [cp_group[rank]] for rank in range(4)}
    work = {rank: [(first[rank], rank ^ 1, MIB, *in_group[rank]), (second[first[rank]], rank ^ 1, MIB, *in_group[rank]),
                   ("all_reduce", "3" if rank % 2 == 0 else "4", 2 * MIB)] for rank in range(4)}
    described = "undefined" if ring_groups == "numbered" else "CONTEXT_PARALLEL_GROUP"
    chakra_job(folder, {"3": [0, 2], "4": [1, 3]}, work, named={"6": (described, [0, 1]), "7": (described, [2, 3])})


@pytest.mark.parametrize(("ring_groups", "declared"), [
    ("named", ""), ("listed", ""), ("numbered", "traced_tp: 1, traced_cp: 2")])
def test_a_context_parallel_ring_s_transfers_count_as_cp_and_do_not_make_pipeline_stages(tmp_path, ring_groups,
                                                                                         declared):
    """A transfer whose ends are in one CP group is the CP ring's, whether the transfer's group names CP, or a
    listed group does, or the declared TP and CP sizes make [0, 1] and [2, 3] CP groups (Megatron-LM's order).
    The transfers one rank apart made every rank a pipeline stage: they counted as PP, and so did the DP
    all-reduces (their ranks differ in the stage alone). Per GPU: 1 MiB of CP (2 MiB over the pair), the
    two-rank ring's n = 2 MiB of DP. The step: the two transfers one after the other (rank 0 sends first, then
    receives; rank 1 the other way round), then the all-reduce, no two sharing a link at once."""
    cp_ring_job(tmp_path, ring_groups)
    text = chakra_scenario(tmp_path, protocol="simple").replace("format: chakra-json",
                                                                f"format: chakra-json, {declared}")
    loaded, result = run(text, tmp_path)
    traffic = result.summary["traffic_bytes_per_gpu"]
    assert (traffic["cp"], traffic["dp"], traffic["pp"]) == (
        pytest.approx(MIB, rel=EXACT), pytest.approx(2 * MIB, rel=EXACT), 0.0)
    ring, reduce = 2 * allreduce_time(loaded, MIB, 2, "send_recv"), allreduce_time(loaded, 2 * MIB, 2)
    assert result.summary["step_time_s"] == pytest.approx(ring + reduce, rel=EXACT)
    exposed = result.summary["exposed_comm_s"]
    assert (exposed["cp"], exposed["dp"], exposed["pp"]) == (pytest.approx(ring, rel=EXACT),
                                                             pytest.approx(reduce, rel=EXACT), 0.0)


def test_a_transfer_of_a_cp_job_whose_tp_is_not_told_is_refused_naming_traced_tp(tmp_path):
    """With CP 2 declared but not TP, the numbered ring's transfer from 0 to 1 is CP's (TP 1: CP groups [0, 1])
    or a pipeline hand-off (TP 2: CP groups [0, 2]); refused, not guessed."""
    cp_ring_job(tmp_path, "numbered")
    text = chakra_scenario(tmp_path).replace("format: chakra-json", "format: chakra-json, traced_cp: 2")
    assert str(refusal(text, tmp_path)) == (
        f"{tmp_path / 'scenario.yaml'}:3: workload.trace: the traced job has context parallelism of 2 and a TP size "
        "not told, so whether its transfer from rank 0 to rank 1 is the CP ring's or a pipeline hand-off is unknown "
        "(its CP groups follow from the TP size) (allowed: workload.traced_tp: the traced job's TP size (1 where it "
        "has none), or Process Group Descriptions naming the CP groups)")


def test_chakra_errors_name_the_metadata_node_that_stated_the_groups(tmp_path):
    """A group's error named the last `process_group:init` node, here one that names no group (older PyTorch's
    pg_ids, which no node refers to), not the node that stated the group at fault (the first node)."""
    groups = [*MESH, {"pg_name": "2", "pg_desc": "mesh_cp", "ranks": [0, 5], "group_size": 2}]
    older = [{"pg_id": 0, "ranks": [], "group_size": 2}]
    for rank in range(2):
        chakra_step(tmp_path, rank, groups, "1")
        nodes = json.loads((tmp_path / f"rank{rank}.json").read_text())
        inputs = {"values": str([json.dumps(older)]), "shapes": "[[]]", "types": "['String']"}
        nodes.append({"id": 5, "name": "## process_group:init ##", "type": "METADATA_NODE", "inputs": inputs})
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(nodes))
    with pytest.raises(TraceError) as error:
        simulate(scenario_from_text(chakra_scenario(tmp_path)))
    assert str(error.value).startswith(f"{tmp_path / 'rank0.json'}: nodes[0].inputs.values: process group '2' has "
                                       "ranks 0, 5, beyond the traced job's 2 ranks")


def test_a_chakra_all_gathers_comm_size_is_its_shard(tmp_path):
    """Chakra's converter puts a collective's input bytes in `comm_size` (the sum of the input tensors of the
    record_param_comms op that launched it, mlcommons/chakra pytorch_node.py comm_size): an all-gather's is the
    rank's shard, which the replay counts as the gathered output, shard x group size, as a Kineto all-gather's
    `Out msg nelems` is. Two ranks all-gathering 4 MiB shards gather 8 MiB: each GPU sends (p-1)/p x 8 MiB =
    4 MiB, in the all-gather time of 8 MiB. It ran as an all-gather of 4 MiB (2 MiB per GPU)."""
    chakra_job(tmp_path, {"g": [0, 1]}, {rank: [("all_gather", "g", 4 * MIB)] for rank in (0, 1)})
    text = ("cluster: {topology: ethernet-100g, nodes: 2}\ncollectives: {algorithm: ring}\n"
            f"workload: {{trace: '{tmp_path}/rank*.json', format: chakra-json}}\n")
    loaded, result = run(text, tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(4 * MIB, rel=EXACT)
    assert result.summary["step_time_s"] == pytest.approx(allreduce_time(loaded, 8 * MIB, 2, "all_gather"), rel=EXACT)


def name_devices(traces: Path, devices: dict[str, str]) -> None:
    """Give each named file of ``traces`` Kineto's `deviceProperties` of one GPU, ``devices[file]``."""
    for name, device in devices.items():
        doc = json.loads((traces / name).read_text())
        doc["deviceProperties"] = [{"id": 0, "name": device}]
        (traces / name).write_text(json.dumps(doc))


@pytest.mark.parametrize("traced_gpu", ["h200", "a100-80gb"])
def test_a_traced_gpu_the_trace_contradicts_is_warned_naming_both(tmp_path, traced_gpu):
    """A trace whose files say they ran on an H100 SXM, given `traced_gpu: h200` (every kernel moved by the
    H200's rates) or the cluster's A100 (the H100's times kept under the A100's name), is warned of naming both:
    `_device_warnings` checks the files' devices where `traced_gpu` is set too."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    name_devices(traces, {"rank0.json": "NVIDIA H100 80GB HBM3", "rank1.json": "NVIDIA H100 80GB HBM3"})
    text = two_rank_scenario("100 Gb/s", dp=f", traced_gpu: {traced_gpu}").replace(str(KINETO_2RANK), str(traces))
    _, result = run(text, tmp_path)
    assert [warning for warning in result.summary["warnings"] if "deviceProperties" in warning] == [
        f"{traces / 'rank0.json'}: deviceProperties[0].name: the trace ran on an NVIDIA H100 80GB HBM3, "
        f"workload.traced_gpu says {traced_gpu}: the run takes its kernel times for {traced_gpu}'s, not "
        "h100-sxm's (set workload.traced_gpu: h100-sxm; 2 of the 2 files name it)"]


def test_every_files_device_is_checked_not_only_the_first_ones(tmp_path):
    """Rank 0 names the cluster's A100 and rank 1 an H100: every file's device is read, not only the first
    one's, so the H100 rank's kernels are warned of rather than kept at their durations in silence."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    name_devices(traces, {"rank0.json": "NVIDIA A100-SXM4-80GB", "rank1.json": "NVIDIA H100 80GB HBM3"})
    _, result = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert [warning for warning in result.summary["warnings"] if "deviceProperties" in warning] == [
        f"{traces / 'rank1.json'}: deviceProperties[0].name: the trace ran on an NVIDIA H100 80GB HBM3, the "
        "cluster's GPU is a100-80gb: its kernels keep the traced GPU's durations (set workload.traced_gpu: "
        "h100-sxm to move them)"]
    _, moved = run(two_rank_scenario("100 Gb/s", dp=", traced_gpu: h100-sxm").replace(str(KINETO_2RANK), str(traces)),
                   tmp_path)
    assert [warning for warning in moved.summary["warnings"] if "deviceProperties" in warning] == [
        f"{traces / 'rank0.json'}: deviceProperties[0].name: the trace ran on an NVIDIA A100-SXM4-80GB, "
        "workload.traced_gpu says h100-sxm: the run takes its kernel times for h100-sxm's, not a100-80gb's (set "
        "workload.traced_gpu: a100-80gb)"]


def test_kernels_overlapping_by_exactly_the_microsecond_of_rounding_do_not_warn(tmp_path):
    """Kernels at 1003 us for 500 us and at 1502 us on one stream overlap by 1 us, the rounding the warning
    tolerates: the float difference of 1503e-6 and 1502e-6 is above 1e-6, and they warned "1.0 us ... beyond
    the 1 us"."""
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
    events = [{"ph": "X", "cat": "kernel", "name": gemm, "pid": 0, "tid": 7, "ts": ts, "dur": 500,
               "args": {"stream": 7}} for ts in (1003, 1502)]
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": events}))
    text = f"cluster: {{topology: dgx-h100, gpus: 1}}\nworkload: {{trace: '{tmp_path}/rank0.json'}}\n"
    _, result = run(text, tmp_path)
    assert not [line for line in result.summary["warnings"] if "before the op ahead of it" in line]


def test_kernels_back_to_back_at_epoch_timestamps_replay_with_no_host_gap_or_overlap(tmp_path):
    """200 kernels of 500 us back to back stamped in microseconds since the epoch (16 digits, as Kineto writes
    them): scaled to seconds before taking the first ts away, such a stamp resolves ~0.24 us, and the replay read
    30 host gaps between them and a second pair a microsecond apart warned of a 1.2 us overlap."""
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
    first = 1621401187224009
    events = [{"ph": "X", "cat": "kernel", "name": gemm, "pid": 0, "tid": 7, "ts": first + 500 * i, "dur": 500,
               "args": {"stream": 7}} for i in range(200)]
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": events}))
    overlapping = [{**event, "ts": ts} for event, ts in zip(events, (first, first + 499))]
    (tmp_path / "rank1.json").write_text(json.dumps({"traceEvents": overlapping}))
    for file in ("rank0", "rank1"):
        text = f"cluster: {{topology: dgx-h100, gpus: 1}}\nworkload: {{trace: '{tmp_path}/{file}.json'}}\n"
        (tmp_path / file).mkdir()
        _, result = run(text, tmp_path / file)
        assert not (result.timeline["name"] == "host gap").any()
        assert not [line for line in result.summary["warnings"] if "before the op ahead of it" in line]


def test_trace_files_after_a_symlinked_folder_are_read_by_their_path(tmp_path):
    """A scenario folder reached through a symlink ('d/lnk' to 'real/scen') whose trace is '../x/rank*.json':
    normalising the path first dropped 'lnk/..' and found no file where the operating system finds them, in
    'real/x'; they are read by their path, and named normalised only where that is the same file: other files at
    the normalised paths, 'd/x', are not they."""
    from simulator.workload.traces.program import trace_files

    traces = copy_traces(KINETO_2RANK, tmp_path / "real")
    (tmp_path / "real" / "scen").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "lnk").symlink_to(tmp_path / "real" / "scen")
    (tmp_path / "other").mkdir()
    decoys = tmp_path / "d" / traces.name
    decoys.mkdir()
    for name in ("rank0.json", "rank1.json"):
        (decoys / name).write_text('{"traceEvents": []}')
    base = tmp_path / "d" / "lnk"
    assert trace_files(f"../{traces.name}/rank*.json", base) == [base / ".." / traces.name / "rank0.json",
                                                                 base / ".." / traces.name / "rank1.json"]
    assert trace_files(f"{tmp_path}/other/../real/{traces.name}/rank0.json", base) == [traces / "rank0.json"]


def dp_partner_traces(folder: Path, ranks: tuple[int, ...]) -> None:
    """Kineto files of ``ranks`` of a 4-rank job (world_size 4; seq-2rank's two traces twice), each rank
    all-reducing with its data-parallel partner ([0, 2], [1, 3])."""
    for rank in ranks:
        doc = json.loads((SEQ_2RANK / f"rank{rank % 2}.json").read_text())
        doc["distributedInfo"] |= {"rank": rank, "world_size": 4}
        for event in doc["traceEvents"][1:]:
            event["args"] |= {"Process Group Name": f"dp{rank % 2}", "Process Group Ranks": f"[{rank % 2}, "
                              f"{rank % 2 + 2}]", "Process Group Description": "undefined"}
        (folder / f"rank{rank}.json").write_text(json.dumps(doc))


def test_one_node_of_a_larger_job_is_not_taken_for_a_set_missing_files(tmp_path):
    """Files of ranks 0 and 1 of a 4-rank job (one node profiled) whose groups [0, 2] and [1, 3] reach ranks 2 and
    3: the warning guessed files missing from workload.trace, which a profile of one node is not; it says which
    ranks the groups reach and that they are taken as ready, and guesses a missing file only for a hole between
    traced ranks."""
    dp_partner_traces(tmp_path, (0, 1))
    _, result = run(f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{tmp_path}/rank*.json'}}\n", tmp_path)
    assert [line for line in result.summary["warnings"] if "no trace" in line] == [
        f"{tmp_path / 'rank0.json'}: ranks 2-3 of the traced job's 4 have no trace, beside traced ranks 0-1: the "
        "traced process groups or transfers reach ranks 2-3, taken as ready"]


def test_one_file_of_a_job_warns_once_that_the_ranks_its_groups_reach_are_taken_as_ready(tmp_path):
    """Rank 0's file alone (one rank profiled) is a trace of part of the job or a set missing a file, so it
    guesses neither, but says once that the rank its group [0, 2] reaches has no trace and is taken as ready (a
    forgotten file replayed silently, as if its rank were ready)."""
    dp_partner_traces(tmp_path, (0,))
    _, result = run(f"cluster: {{topology: dgx-h100}}\nworkload: {{trace: '{tmp_path}/rank*.json'}}\n", tmp_path)
    assert [line for line in result.summary["warnings"] if "no trace" in line] == [
        f"{tmp_path / 'rank0.json'}: rank 2 of the traced job's 4 has no trace, beside traced rank 0: the traced "
        "process groups or transfers reach rank 2, taken as ready"]


def test_a_missing_rank_that_transfers_reach_is_named_in_one_line(tmp_path):
    """Ranks 0 and 2 of a 3-rank job, rank 0 sending to rank 1 and rank 2 receiving from it: rank 1's missing
    file was named twice, by the line of the hole and by each file's line of transfers to ranks without a
    trace; the hole's line alone names it."""
    traces = pipeline_transfer(tmp_path, rank1={"Src Rank": 1})
    (traces / "rank1.json").rename(traces / "rank2.json")
    distributed_info(traces / "rank0.json", world_size=3)
    distributed_info(traces / "rank2.json", rank=2, world_size=3)
    _, result = run(two_rank_scenario("100 Gb/s", nodes=3).replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert [line for line in result.summary["warnings"] if "no trace" in line] == [
        f"{traces / 'rank0.json'}: rank 1 of the traced job's 3 has no trace, between traced ranks 0, 2 (a file "
        "missing from workload.trace?): the traced process groups or transfers reach rank 1, taken as ready"]


def test_a_send_that_names_no_peer_in_another_group_is_not_blamed_for_a_receive_s_missing_partner(tmp_path):
    """As above, but rank 0's send without a peer is of process group 'other', and rank 1's receive of group
    '0': the error blamed that send, which cannot be the receive's partner; it names the receive."""
    traces = pipeline_transfer(tmp_path)
    comms_args(traces, 0, world=4, **{"Dst Rank": None, "Process Group Ranks": "[0, 1, 2, 3]", "Group size": 4,
                                      "Process Group Name": "other"})
    comms_args(traces, 1, world=4, **{"Process Group Ranks": "[0, 1, 2, 3]", "Group size": 4})
    caught = four_rank_group_refusal(traces, tmp_path)
    assert (caught.file, caught.field) == (str(traces / "rank1.json"), "traceEvents[8]")
    assert caught.problem == (
        "recv 'ncclDevKernel_SendRecv' is rank 1's 1st recv from rank 0 in process group '0', but rank 0's trace "
        f"({traces / 'rank0.json'}) has 0 matching sends")


def test_the_overlap_warning_without_host_gaps_speaks_of_no_host_time(tmp_path):
    """With `host_gaps: false` the replay keeps no host time, and the overlap warning still said it measured
    the host time after the overlapping ops from their serialized end."""
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
    events = [{"ph": "X", "cat": "kernel", "name": gemm, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
               "args": {"stream": 7}} for ts, dur in ((0, 1000), (500, 500))]
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": events}))
    text = f"cluster: {{topology: dgx-h100, gpus: 1}}\nworkload: {{trace: '{tmp_path}/rank0.json', host_gaps: false}}\n"
    _, result = run(text, tmp_path)
    assert [line for line in result.summary["warnings"] if "before the op ahead of it" in line] == [
        f"{tmp_path / 'rank0.json'}: traceEvents[1]: 'sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n' starts 500.0 us "
        "before the op ahead of it on stream 7 ends, beyond the 1 us of timestamp rounding (1 such op in 1 file of "
        "the trace, by up to 500.0 us): a CUDA stream runs its ops one after another, and so does the replay"]


def test_traced_gpu_on_a_cpu_only_trace_warns_that_it_changes_nothing(tmp_path):
    """A profile with no GPU activity is host time, which `traced_gpu` does not move: it was taken without a
    word."""
    text = ("cluster: {topology: dgx-h100, gpus: 1}\n"
            f"workload: {{trace: '{cpu_only_profile(tmp_path)}', traced_gpu: a100-80gb}}\n")
    _, result = run(text, tmp_path)
    assert [line for line in result.summary["warnings"] if "traced_gpu" in line] == [
        f"{tmp_path / 'rank0.json'}: traced_gpu: the trace's ops ran on the host (it records no GPU activity), so "
        "traced_gpu changes nothing: host time keeps its traced durations"]


def test_a_replay_that_leaves_whole_hosts_idle_warns_with_the_dp_that_uses_them(tmp_path):
    """The two-rank Kineto trace (DP 2) on 8 single-GPU hosts runs on 2 GPUs: one warning names the 6 idle hosts and
    the workload.dp that replays it on all 8; with that dp, or on the 2 hosts it needs, none."""
    _, idle = run(two_rank_scenario("100 Gb/s", nodes=8), tmp_path)
    assert [line for line in idle.summary["warnings"] if "idle" in line] == [
        "the replay runs on 2 of the cluster's 8 GPUs; 6 of its 8 hosts idle: workload.dp: 8 replicates the traced "
        "job over 8 GPUs"]
    for text in (two_rank_scenario("100 Gb/s", nodes=8, dp=", dp: 8"), two_rank_scenario("100 Gb/s")):
        assert not [line for line in run(text, tmp_path)[1].summary["warnings"] if "idle" in line]


def test_a_replay_without_data_parallelism_on_idle_hosts_says_dp_cannot_use_them(tmp_path):
    text = (f"cluster: {{topology: dgx-h100-cluster, nodes: 2}}\n"
            f"workload: {{trace: '{CHAKRA_2RANK}/rank*.json', format: chakra-json}}\n")
    assert "the replay runs on 2 of the cluster's 16 GPUs; 1 of its 2 hosts idle: the traced job has no data " \
           "parallelism for workload.dp to replicate, so its step is the same on 1 host" in \
           run(text, tmp_path)[1].summary["warnings"]


def test_a_cp_size_that_leaves_the_default_group_unread_is_refused_in_one_line_naming_the_set(capsys):
    assert main(["validate", "trace-allreduce-2rank", "--set", "workload.traced_cp=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err[err.index("workload.trace: "):]) < 350
    assert ("whether it is the CP group or the gradients' is unknown (with --set workload.traced_cp=2) (allowed: "
            "workload.traced_cp where the traced job's CP is not 2, or a Process Group Description naming the "
            "group's dimension)") in err
