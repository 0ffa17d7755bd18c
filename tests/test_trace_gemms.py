"""Which GPU kernel of a Kineto trace takes a matrix multiply's recorded shape (`recost_gemms`, a trace's FLOPs),
on small hand-built traces: one CPU thread whose ops launch kernels on one stream, as torch.profiler records them
(cpu_op events, cudaLaunchKernel runtime events and kernels sharing a correlation id)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared import EXACT

from simulator import simulate
from simulator.catalog.gpus import get_gpu
from simulator.config.loader import scenario_from_text
from simulator.workload.traces.model import gemm_shape, kernel_kind
from simulator.workload.traces.program import gemm_duration

M = N = K = 4096
BF16_DIMS = [[M, K], [K, N]]
"""aten::mm's operands: [m, k] @ [k, n]."""
LINEAR_DIMS = [[M, K], [N, K], [N]]
"""aten::linear's: input [m, k], weight [n, k], bias [n]."""
GEMM_KERNEL = "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NTN"
SPLIT_K_REDUCE = ("void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, "
                  "false>(cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*)")
COPY_KERNEL = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase"
               "&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(float)#1}>")


class Trace:
    """A Kineto trace being written: CPU ops on thread 1, each kernel launched at a time inside them and run on
    stream 7 in launch order, back to back; the profiled step marked around all of it when replayed."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.gpu_time = 10_000.0

    def op(self, name: str, ts: float, dur: float, dims: list | None = None, types: list | None = None) -> int:
        """A CPU op; its position in traceEvents."""
        args = {} if dims is None else {"Input Dims": dims, "Input type": types or ["c10::BFloat16"] * len(dims)}
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                            "args": args})
        return len(self.events) - 1

    def kernel(self, name: str, launch_ts: float, dur: float) -> int:
        """A kernel launched at ``launch_ts``; its position in traceEvents."""
        correlation = len(self.events) + 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                            "ts": launch_ts, "dur": 1, "args": {"correlation": correlation}})
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": self.gpu_time,
                            "dur": dur, "args": {"stream": 7, "correlation": correlation}})
        self.gpu_time += dur
        return len(self.events) - 1

    def replay(self, folder: Path, recost: bool = True):
        """The trace replayed on one H200, with `recost_gemms` or not."""
        step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0,
                "dur": self.gpu_time}
        (folder / "rank0.json").write_text(json.dumps({"traceEvents": self.events + [step]}))
        path = folder / "scenario.yaml"
        text = ("cluster: {topology: dgx-h100, gpus: 1, gpu_model: h200}\n"
                f"workload: {{trace: rank0.json, recost_gemms: {str(recost).lower()}}}\n")
        path.write_text(text)
        return simulate(scenario_from_text(text, source=str(path)))


def kernel_rows(result, name: str):
    """The timeline's rows of the replayed kernels named ``name``, in order."""
    frame = result.timeline
    return frame[frame["name"] == name].reset_index(drop=True)


def durations(rows) -> list[float]:
    return list(rows["end_s"] - rows["start_s"])


def bf16_gemm_s() -> float:
    return gemm_duration((1, M, N, K), "bf16", get_gpu("h200"))


def test_of_two_ops_starting_together_the_inner_one_gives_its_shape(tmp_path):
    """aten::linear with fp32 inputs and the bf16 aten::mm inside it start at the same microsecond, the mm listed
    first: the GEMM took the linear's fp32 shape, 2936 us on the H200 instead of the mm's bf16 200.8 us."""
    trace = Trace()
    trace.op("aten::mm", 100, 50, BF16_DIMS)
    trace.op("aten::linear", 100, 60, LINEAR_DIMS, ["float", "float", "float"])
    trace.kernel(GEMM_KERNEL, 120, 180)
    result = trace.replay(tmp_path)
    gemm = kernel_rows(result, GEMM_KERNEL)
    assert durations(gemm) == pytest.approx([bf16_gemm_s()], rel=EXACT)
    assert bf16_gemm_s() == pytest.approx(200.8e-6, abs=0.1e-6)
    assert gemm.loc[0, "flops"] == 2 * M * N * K
    assert result.summary["trace"]["recosted_gemms"] == 1 and not result.summary["warnings"]


@pytest.mark.parametrize("mm_first", [True, False])
def test_of_two_ops_spanning_the_same_time_the_primitive_gemm_gives_its_shape(tmp_path, mm_first):
    """The bf16 aten::mm and the fp32 aten::linear around it start and end at the same microseconds: the op
    listed later was taken for the inner one, so with the mm first the GEMM took the linear's fp32 shape (2936
    us on the H200 instead of 200.8); an op that launches its GEMM itself is inner among equal spans."""
    trace = Trace()
    ops = [("aten::mm", BF16_DIMS, None), ("aten::linear", LINEAR_DIMS, ["float", "float", "float"])]
    for name, dims, types in ops if mm_first else ops[::-1]:
        trace.op(name, 100, 50, dims, types)
    trace.kernel(GEMM_KERNEL, 120, 180)
    result = trace.replay(tmp_path)
    assert durations(kernel_rows(result, GEMM_KERNEL)) == pytest.approx([bf16_gemm_s()], rel=EXACT)
    assert result.summary["trace"]["recosted_gemms"] == 1 and not result.summary["warnings"]


def test_a_gemm_launched_by_a_linear_after_its_addmm_ended_warns_of_nothing_lost(tmp_path):
    """aten::linear [100, 200] around an aten::addmm [110, 130], the GEMM launched at 150 by the linear: the GEMM
    takes the linear's shape, yet the addmm was reported as a shape that reached no GEMM kernel, its FLOPs not
    counted, though they were (the linear's)."""
    trace = Trace()
    trace.op("aten::linear", 100, 100, LINEAR_DIMS)
    trace.op("aten::addmm", 110, 20, [[N], [M, K], [K, N]])
    trace.kernel(GEMM_KERNEL, 150, 180)
    result = trace.replay(tmp_path)
    assert kernel_rows(result, GEMM_KERNEL).loc[0, "flops"] == 2 * M * N * K
    assert result.summary["trace"]["recosted_gemms"] == 1 and not result.summary["warnings"]


def test_a_matrix_multiply_that_launched_nothing_ran_on_the_cpu_and_lost_no_shape(tmp_path):
    """An fp32 aten::mm of CPU tensors (a data loader's, a metric's) launches no kernel by design, and Kineto records no
    tensor's device: one during which its thread launched nothing on the GPU is not warned of as a shape that reached
    no GEMM kernel; one that launched a kernel not known for a GEMM is."""
    trace = Trace()
    trace.op("aten::mm", 50, 30, BF16_DIMS, ["float", "float"])
    trace.op("aten::mm", 100, 50, BF16_DIMS)
    trace.kernel(GEMM_KERNEL, 120, 180)
    trace.op("aten::mm", 200, 30, BF16_DIMS, ["float", "float"])
    result = trace.replay(tmp_path)
    assert result.summary["trace"]["recosted_gemms"] == 1 and not result.summary["warnings"]
    vendor = trace.op("aten::mm", 300, 50, BF16_DIMS)
    trace.kernel("vendor_kernel_a", 320, 180)
    assert [line for line in trace.replay(tmp_path).summary["warnings"] if "reached no GEMM kernel" in line] == [
        f"{tmp_path / 'rank0.json'}: traceEvents[{vendor}]: 1 matrix multiply with recorded shapes reached no GEMM "
        "kernel (by name), so its FLOPs are not counted and no kernel takes its time from the kernel model (first: "
        "'aten::mm')"]


@pytest.mark.parametrize("name", [
    "Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1_AF1EM1",
    "triton_tem_fused_mm_0", "triton_tem_fused_addmm_relu_3"])
def test_tensile_and_triton_template_gemms_are_matrix_multiplies_and_take_their_shape(tmp_path, name):
    """rocBLAS / hipBLASLt's Tensile kernels and Inductor's GEMM templates are GEMMs (a template is not elementwise for
    its 'triton'): the mm's shape reaches its kernel, which is re-costed."""
    trace = Trace()
    trace.op("aten::mm", 100, 50, BF16_DIMS)
    trace.kernel(name, 120, 180)
    result = trace.replay(tmp_path)
    assert kernel_kind(name) == "matmul"
    assert durations(kernel_rows(result, name)) == pytest.approx([bf16_gemm_s()], rel=EXACT)
    assert not result.summary["warnings"]


@pytest.mark.parametrize("name", ["triton_poi_fused_add_mul_0", "triton_red_fused_native_layer_norm_1",
                                  "triton_per_fused_sum_2"])
def test_other_triton_kernels_stay_elementwise(name):
    assert kernel_kind(name) == "elementwise"


@pytest.mark.parametrize("name", ["void at::native::upsample_bilinear2d_out_frame<float, float>(int, float, float)",
                                  "void at::native::upsample_trilinear3d_out_frame<c10::BFloat16, float>(int)",
                                  "void at::native::upsample_linear1d_out_frame<float, float>(int, float)"])
def test_upsampling_is_not_a_matrix_multiply(name):
    """'linear' made PyTorch's bilinear (and trilinear, linear) upsampling GEMMs."""
    assert kernel_kind(name) != "matmul"


def test_only_cudnns_dq_conversion_is_its_memory_streaming_helper():
    """cuDNN's attention backward converts dQ with convert_dq_to_16bits, which streams memory (elementwise: a
    moved trace scales it by HBM bandwidth); 'convert_dq' also took any convert_dqkv kernel (a dQKV conversion of
    another library)."""
    assert kernel_kind("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int)") == \
        "elementwise"
    assert kernel_kind("convert_dqkv_layout_kernel") == ""


@pytest.mark.parametrize("name", [
    "void flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, "
    "cutlass::bfloat16_t>>(Flash_bwd_params)",
    "void flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2>>(Flash_bwd_params, int)",
    "void flash_bwd_convert_dkv_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2>>(Flash_bwd_params)",
    "void flash_bwd_clear_dkvaccum<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2>>(Flash_bwd_params)",
    "void flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>, 4, 1, true>(Flash_fwd_params)"])
def test_flashattention2s_memory_streaming_helpers_are_not_attention(name):
    """FlashAttention-2's backward helpers (dO.O, the dQ / dKV conversions, the dKV accumulator's clearing) and
    its split-KV combine stream memory like cuDNN's dot_do_o and convert_dq_to, but 'flash' made them attention,
    so a moved trace scaled them by the attention ratio."""
    assert kernel_kind(name) == "elementwise"
    assert kernel_kind("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>(Flash_bwd_params)") \
        == "attention"


@pytest.mark.parametrize("name", [
    "void cutlass::device_kernel<flash::FlashAttnBwdPreprocess<...>>",
    "void cutlass::device_kernel<flash::FlashAttnBwdPostprocessConvertdQ<...>>",
    "void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128> >, 5, 256, 1, false, "
    "true, cutlass::bfloat16_t, float, cutlass::arch::Sm90> >"])
def test_flashattention3s_memory_streaming_helpers_are_not_attention(name):
    """FlashAttention-3 (Hopper) splits the same jobs off its attention kernels: dO.O with dQaccum's clearing, the
    dQ accumulator's conversion to 16 bits and the split-KV combine stream memory, but 'flash' made them attention
    (FlashAttention-2's names only were tried first). Its attention kernel stays attention."""
    assert kernel_kind(name) == "elementwise"
    assert kernel_kind("void cutlass::device_kernel<flash::enable_sm90<flash::FlashAttnFwdSm90<...>>>") == "attention"


@pytest.mark.parametrize("name, dims, shape", [
    ("aten::_addmm_activation", [[N], [M, K], [K, N], [], [], []], (1, M, N, K)),
    ("aten::addmm_", [[M, N], [M, K], [K, N], [], []], (1, M, N, K)),
    ("aten::addmm", [[N], [M, K], [K, N], [], []], (1, M, N, K)),
])
def test_every_addmm_is_a_matrix_multiply(name, dims, shape):
    """aten::_addmm_activation (a linear with GELU or ReLU fused in cuBLASLt's epilogue) and the in-place aten::addmm_
    carry their shape: their GEMM kernels are re-costed and counted in the FLOPs."""
    assert gemm_shape(name, dims) == shape


def test_a_shape_that_reaches_no_gemm_kernel_is_warned_once_with_a_count(tmp_path):
    """Two linears (each an aten::addmm inside an aten::linear) whose kernels are of a kind not known (neither is a GEMM
    by its name) do not lose their shapes silently: one warning counts the two matrix multiplies (the linear and the
    addmm inside it are one) and names the first."""
    trace = Trace()
    trace.op("aten::linear", 100, 100, LINEAR_DIMS)
    first = trace.op("aten::addmm", 110, 80, [[N], [M, K], [K, N]])
    trace.kernel("vendor_kernel_a", 120, 180)
    trace.op("aten::linear", 300, 100, LINEAR_DIMS)
    trace.op("aten::addmm", 310, 80, [[N], [M, K], [K, N]])
    trace.kernel("vendor_kernel_b", 320, 180)
    trace.op("aten::mm", 500, 50, BF16_DIMS)
    trace.kernel(GEMM_KERNEL, 520, 180)
    result = trace.replay(tmp_path)
    assert result.summary["trace"]["recosted_gemms"] == 1
    lost = [line for line in result.summary["warnings"] if "reached no GEMM kernel" in line]
    assert lost == [f"{tmp_path / 'rank0.json'}: traceEvents[{first}]: 2 matrix multiplies with recorded shapes "
                    "reached no GEMM kernel (by name), so their FLOPs are not counted and no kernel takes their "
                    "time from the kernel model (first: 'aten::addmm')"]
    plain = [line for line in trace.replay(tmp_path, recost=False).summary["warnings"] if "no GEMM kernel" in line]
    assert plain == [lost[0].replace(" and no kernel takes their time from the kernel model", "")]


def test_split_k_recosts_the_gemm_kernel_and_keeps_the_reduction_traced(tmp_path):
    """cuBLAS's split-K GEMM launches its GEMM kernel and a splitKreduce_kernel from one aten::mm (the reduction's
    name carries 'cublas', a GEMM kind by name): the first takes the shape and the model's time, the reduction
    keeps its traced 15 us, and the run says that the op launched a second GEMM kernel."""
    trace = Trace()
    op = trace.op("aten::mm", 100, 50, BF16_DIMS)
    trace.kernel(GEMM_KERNEL, 110, 180)
    trace.kernel(SPLIT_K_REDUCE, 120, 15)
    result = trace.replay(tmp_path)
    assert durations(kernel_rows(result, GEMM_KERNEL)) == pytest.approx([bf16_gemm_s()], rel=EXACT)
    reduce = kernel_rows(result, SPLIT_K_REDUCE)
    assert durations(reduce) == pytest.approx([15e-6], rel=EXACT) and reduce.loc[0, "flops"] == 0
    assert result.summary["trace"]["recosted_gemms"] == 1
    assert result.summary["warnings"] == [
        f"{tmp_path / 'rank0.json'}: traceEvents[{op}]: 1 matrix multiply launched more than one GEMM kernel: the "
        f"first takes its shape and the kernel model's time, the other 1 keeps its traced duration (first: "
        f"'aten::mm', then {SPLIT_K_REDUCE!r})"]
    assert not trace.replay(tmp_path, recost=False).summary["warnings"]


def test_autocasts_copies_inside_a_linear_keep_their_traced_time(tmp_path):
    """Under autocast aten::linear (fp32 inputs) casts its input and weight to bf16 (two copy kernels inside
    aten::to), then runs aten::addmm: the addmm's GEMM kernel takes the bf16 shape, the copies keep their traced
    durations and carry no FLOPs."""
    trace = Trace()
    trace.op("aten::linear", 100, 200, LINEAR_DIMS, ["float", "float", "float"])
    for start in (105, 140):
        trace.op("aten::to", start, 30, [[M, K]], ["float"])
        trace.op("aten::copy_", start + 5, 20, [[M, K], [M, K]], ["c10::BFloat16", "float"])
        trace.kernel(COPY_KERNEL, start + 10, 40)
    trace.op("aten::addmm", 180, 100, [[N], [M, K], [K, N]])
    trace.kernel(GEMM_KERNEL, 190, 180)
    result = trace.replay(tmp_path)
    copies = kernel_rows(result, COPY_KERNEL)
    assert durations(copies) == pytest.approx([40e-6, 40e-6], rel=EXACT) and (copies["flops"] == 0).all()
    assert durations(kernel_rows(result, GEMM_KERNEL)) == pytest.approx([bf16_gemm_s()], rel=EXACT)
    assert result.summary["trace"]["recosted_gemms"] == 1 and not result.summary["warnings"]


def test_recost_gemms_on_a_trace_without_shapes_says_why_nothing_is_recosted(tmp_path):
    """A trace recorded without record_shapes=True re-costs no GEMM, and says why."""
    trace = Trace()
    trace.op("aten::mm", 100, 50)
    trace.kernel(GEMM_KERNEL, 120, 180)
    result = trace.replay(tmp_path)
    assert result.summary["trace"]["recosted_gemms"] == 0
    assert result.summary["warnings"] == [
        f"{tmp_path / 'rank0.json'}: recost_gemms: no matrix multiply in the trace records its operand shapes, so "
        "none is re-costed; profile with torch.profiler.profile(record_shapes=True)"]
    assert not trace.replay(tmp_path, recost=False).summary["warnings"]


@pytest.mark.parametrize("kernel, precision", [("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "tf32"),
                                               ("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x32", "fp32")],
                         ids=["tf32-kernel", "fp32-kernel"])
def test_a_recosted_fp32_gemm_runs_tf32_where_its_kernel_says_so(tmp_path, kernel, precision):
    """An fp32 aten::mm of 4096^3 under allow_tf32 launches a TF32 tensor-core kernel: `recost_gemms` costs it at
    the H200's tf32 peak (494.5 TFLOP/s dense: 399.6 us), as the GPU move bounds it, where it took the CUDA
    cores' fp32 peak (67 TFLOP/s: 2,936.3 us, 7.3x slower). An fp32 kernel by name stays fp32. The replayed
    duration is held to those figures first, so that the code before fails on the duration it replays, not on
    `gemm_duration` taking no tf32."""
    trace = Trace()
    trace.op("aten::mm", 100, 50, BF16_DIMS, ["float", "float"])
    trace.kernel(kernel, 120, 400)
    result = trace.replay(tmp_path)
    replayed = durations(kernel_rows(result, kernel))
    assert replayed == pytest.approx([{"tf32": 399.6e-6, "fp32": 2936.3e-6}[precision]], abs=0.1e-6)
    assert replayed == pytest.approx([gemm_duration((1, M, N, K), precision, get_gpu("h200"))], rel=EXACT)
    assert result.summary["trace"]["recosted_gemms"] == 1
