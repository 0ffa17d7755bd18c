"""Kernel microbenchmarks on one GPU, the kernel-level source of simulator/catalog/kernels.yaml's measured entries.

Run on a machine with a CUDA GPU and PyTorch (trainsim itself never needs either):

    OUT=/some/dir python benchmarks/gpu_kernels.py [SECTION ...]      # all sections, or those named

It writes ``$OUT/gpu_kernels.json`` (every timing with its shape, the software versions and clocks) and
``$OUT/torch_gpu_step.json`` (a torch.profiler Chrome trace of one training step of a small decoder, with the
step's wall time measured unprofiled, for trace-replay tests). What it times, each between CUDA events after
warm-up, the median of repeated calls of at least ``MIN_TIME_S`` in all:

- bf16 GEMMs: square sizes, skinny ones (one side small) and the forward, input-gradient and weight-gradient
  GEMMs of Llama 3 8B / 70B / 405B and GPT-3 175B layers at their tensor-parallel widths, in the layouts the
  framework runs them (y = x W^T, dx = dy W, dW = dy^T x), on normally distributed data (zeros draw less power
  and run faster);
- the same 8192^3 GEMM back to back for ``SUSTAIN_S`` seconds, in samples of 100 GEMMs (~0.19 s each) with the
  SM clock and power after each, for the clock a GPU settles at under continuous load;
- scaled-dot-product attention forward and backward (cuDNN and flash back ends, causal and not) at the shapes of
  the FlashAttention-3 paper (16 heads of 128, batch x sequence = 16k tokens) and Llama 3 405B's per-GPU shape
  at TP 8 (16 query heads sharing one KV head, 8k tokens);
- memory-bound kernels: a streaming read (sum), a copy, an add, LayerNorm and RMSNorm forward and backward,
  softmax forward and backward over attention scores, dropout and SwiGLU;
- one GPU's share of a Llama 3 8B / 70B / 405B layer (TP 1 / 8 / 8, 8,192 tokens, no TP communication),
  forward and forward + backward, to check a whole layer's compute time against the sum of its kernels;
- fp8 (e4m3) GEMMs through torch._scaled_mm: square sizes, and 8192^3 and the Llama 3 405B TP-8 layer GEMMs
  steady;
- steady rates: the Llama 3 70B / 405B layer GEMMs, cuDNN's causal attention and the three layers, each back to
  back for ``STEADY_S`` seconds after one of warm-up, with the clock after (the rate at the power limit, where a
  training job runs; the short timings above may catch the boost clock); then (``steady_small``) attention at
  256 and 512 keys and without the mask at 1k and 2k, skinny GEMMs and small squares, and the HBM copy;
- (``sm_contention``, needs CuPy) 8192^3 GEMMs while a kernel on another stream holds 0 to 66 SMs, reading HBM
  or only spinning: what a GEMM loses beside communication kernels that hold SMs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

MIN_TIME_S = 0.04
SUSTAIN_S = 20.0
STEADY_S = 1.0
OUT = Path(os.environ.get("OUT", "/tmp/gpu_kernels"))
BF16 = torch.bfloat16
DEVICE = "cuda"

# name: (hidden, ffn, query heads, kv heads, head dim, vocab, gated MLP, tp, tokens per micro-batch)
LAYERS = {
    "llama3-8b-tp1": (4096, 14336, 32, 8, 128, 128256, True, 1, 8192),
    "llama3-70b-tp8": (8192, 28672, 64, 8, 128, 128256, True, 8, 8192),
    "llama3-405b-tp8": (16384, 53248, 128, 8, 128, 128256, True, 8, 8192),
    "gpt3-175b-tp8": (12288, 49152, 96, 96, 128, 51200, False, 8, 2048),
}


def probe(fn: Callable[[], object]) -> tuple[float, torch.cuda.Event, torch.cuda.Event]:
    """Seconds of one call of ``fn`` after three warm-up calls, with the pair of CUDA events that timed it."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3, start, end


def timed(fn: Callable[[], object], min_time: float = MIN_TIME_S) -> dict[str, float]:
    """Seconds per call of ``fn`` on the GPU: median and minimum of single calls between CUDA events, and the
    mean of the same calls issued back to back (what a stream of kernels sees)."""
    once, start, end = probe(fn)
    calls = max(5, min(500, int(min_time / max(once, 1e-6))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for begin, finish in events:
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    single = [begin.elapsed_time(finish) / 1e3 for begin, finish in events]
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return {"median_s": statistics.median(single), "min_s": min(single),
            "back_to_back_s": start.elapsed_time(end) / 1e3 / calls, "calls": calls}


def operands(m: int, n: int, k: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Normally distributed bf16 operands of an (m, n, k) GEMM in ``layout``: 'fwd' x[m,k] W[n,k]^T, 'dgrad'
    dy[m,k] W[k,n], 'wgrad' dy[k,m]^T x[k,n] (zeros draw less power and run faster)."""
    a = torch.randn(k, m, device=DEVICE, dtype=BF16).t() if layout == "wgrad" else \
        torch.randn(m, k, device=DEVICE, dtype=BF16)
    b = torch.randn(n, k, device=DEVICE, dtype=BF16).t() if layout == "fwd" else \
        torch.randn(k, n, device=DEVICE, dtype=BF16)
    return a, b


def gemm(m: int, n: int, k: int, layout: str) -> dict[str, object]:
    """One (m, n, k) bf16 GEMM in ``layout`` (`operands`), timed."""
    result = timed(partial(torch.mm, *operands(m, n, k, layout)))
    return {"m": m, "n": n, "k": k, "layout": layout, **result,
            "tflops": 2 * m * n * k / result["median_s"] / 1e12}


def layer_shapes(name: str) -> list[tuple[str, int, int, int, str]]:
    """(GEMM, m, n, k, layout) of the forward, input-gradient and weight-gradient GEMMs of one transformer layer
    of ``name`` (and its LM head) on one GPU."""
    hidden, ffn, heads, kv_heads, head_dim, vocab, gated, tp, tokens = LAYERS[name]
    shapes = {"qkv": ((heads + 2 * kv_heads) * head_dim // tp, hidden), "proj": (hidden, heads * head_dim // tp),
              "fc1": ((2 if gated else 1) * ffn // tp, hidden), "fc2": (hidden, ffn // tp),
              "head": (vocab // tp, hidden)}
    return [row for gemm_name, (out_features, in_features) in shapes.items()
            for row in ((gemm_name, tokens, out_features, in_features, "fwd"),
                        (gemm_name, tokens, in_features, out_features, "dgrad"),
                        (gemm_name, out_features, in_features, tokens, "wgrad"))]


def layer_gemms(name: str) -> list[dict[str, object]]:
    """``name``'s layer GEMMs (`layer_shapes`), timed."""
    return [{"model": name, "gemm": gemm_name, **gemm(m, n, k, layout)}
            for gemm_name, m, n, k, layout in layer_shapes(name)]


def gpu_state() -> dict[str, float | None]:
    """SM clock (MHz), power (W), temperature (C) and memory clock (MHz) now, from nvidia-smi (None where it
    reports none)."""
    names = ("sm_mhz", "power_w", "temperature_c", "mem_mhz")
    query = "clocks.sm,power.draw,temperature.gpu,clocks.mem"
    line = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    values = line[0].split(",") if line else []
    state: dict[str, float | None] = dict.fromkeys(names)
    for name, value in zip(names, values):
        try:
            state[name] = float(value)
        except ValueError:
            pass
    return state


def attempt(fn: Callable[..., dict[str, object]], *args: object) -> dict[str, object]:
    """``fn(*args)``, or the arguments with the error where this software stack cannot run it (an attention back
    end that lacks a shape, say), so that one refusal does not lose the other measurements."""
    try:
        return fn(*args)
    except Exception as error:
        return {"arguments": [str(arg) for arg in args], "error": f"{type(error).__name__}: {error}"}


class TensorParallelLayer(nn.Module):
    """One GPU's share of a Llama layer under tensor parallelism, without the TP communication: RMSNorm,
    the QKV GEMM, causal GQA attention, the output projection, RMSNorm and the SwiGLU MLP, bf16 weights."""

    def __init__(self, name: str) -> None:
        super().__init__()
        hidden, ffn, heads, kv_heads, head_dim, _, _, tp, _ = LAYERS[name]
        self.heads, self.kv_heads, self.head_dim = heads // tp, max(1, kv_heads // tp), head_dim
        linear = partial(nn.Linear, bias=False, device=DEVICE, dtype=BF16)
        self.norm1 = nn.RMSNorm(hidden, device=DEVICE, dtype=BF16)
        self.norm2 = nn.RMSNorm(hidden, device=DEVICE, dtype=BF16)
        self.qkv = linear(hidden, (self.heads + 2 * self.kv_heads) * head_dim)
        self.proj = linear(self.heads * head_dim, hidden)
        self.fc1, self.fc2 = linear(hidden, 2 * ffn // tp), linear(ffn // tp, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq, batch, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        q, k, v = (t.view(seq, batch, -1, self.head_dim).permute(1, 2, 0, 3) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.proj(attended.permute(2, 0, 1, 3).reshape(seq, batch, -1))
        gate, up = self.fc1(self.norm2(x)).chunk(2, -1)
        return x + self.fc2(F.silu(gate) * up)


def tensor_parallel_layers() -> list[dict[str, object]]:
    """Forward and forward + backward seconds of one GPU's share of a Llama layer (`TensorParallelLayer`) at its
    TP width and 8,192 tokens, cuDNN attention."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for name in ("llama3-8b-tp1", "llama3-70b-tp8", "llama3-405b-tp8"):
        layer = TensorParallelLayer(name)
        tokens = LAYERS[name][-1]
        x = torch.randn(tokens, 1, LAYERS[name][0], device=DEVICE, dtype=BF16, requires_grad=True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            forward = timed(partial(layer, x))
            both = timed(lambda layer=layer, x=x: layer(x).sum().backward())
        rows.append({"layer": name, "tokens": tokens, "forward": forward, "forward_backward": both})
    return rows


def steady(fn: Callable[[], object], flops: float | None, seconds: float = STEADY_S) -> dict[str, object]:
    """``fn``'s rate under continuous load: called back to back for ``seconds`` after one second of warm-up, in
    batches timed between CUDA events, the median batch and the GPU's state after it (the clock a training
    job's kernels run at: the GPU at its power limit); its TFLOP/s where ``flops`` is given."""
    once, start, end = probe(fn)
    batch = max(1, int(0.05 / max(once, 1e-6)))
    per_call, began = [], time.perf_counter()
    while time.perf_counter() - began < 1.0 + seconds:
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        torch.cuda.synchronize()
        if time.perf_counter() - began > 1.0:
            per_call.append(start.elapsed_time(end) / 1e3 / batch)
    seconds_per_call = statistics.median(per_call)
    rate = {} if flops is None else {"steady_tflops": flops / seconds_per_call / 1e12}
    return {"steady_s": seconds_per_call, **rate, "batches": len(per_call), **gpu_state()}


def steady_attention(seq: int, batch: int, kv_heads: int, causal: bool = True) -> dict[str, object]:
    """Steady forward and backward rates of cuDNN's attention, 16 query heads of 128, FLOPs counted as
    FlashAttention counts them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        q = torch.randn(batch, 16, seq, 128, device=DEVICE, dtype=BF16, requires_grad=True)
        k, v = (torch.randn(batch, kv_heads, seq, 128, device=DEVICE, dtype=BF16, requires_grad=True)
                for _ in range(2))
        forward = partial(F.scaled_dot_product_attention, q, k, v, is_causal=causal, enable_gqa=kv_heads != 16)
        out = forward()
        flops = 4 * batch * 16 * seq * seq * 128 / (2 if causal else 1)
        backward = partial(torch.autograd.grad, out, (q, k, v), torch.randn_like(out), retain_graph=True)
        return {"seq": seq, "batch": batch, "kv_heads": kv_heads, "causal": causal,
                "forward": steady(forward, flops), "backward": steady(backward, 2.5 * flops)}


def steady_kernels() -> dict[str, list[dict[str, object]]]:
    """Steady rates (`steady`) of the Llama 3 70B and 405B layer GEMMs, cuDNN's causal attention (head dim 128)
    and the three TP layers' forward + backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gemms = [{"model": name, "gemm": gemm_name, "m": m, "n": n, "k": k, "layout": layout,
               **steady(partial(torch.mm, *operands(m, n, k, layout)), 2 * m * n * k)}
             for name in ("llama3-70b-tp8", "llama3-405b-tp8")
             for gemm_name, m, n, k, layout in layer_shapes(name)]
    attention_rows = [steady_attention(seq, max(1, 16384 // seq) if kv_heads == 16 else 1, kv_heads)
                      for seq, kv_heads in ((1024, 16), (2048, 16), (4096, 16), (8192, 16), (16384, 16),
                                            (32768, 16), (8192, 1))]
    layers = []
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for name in ("llama3-8b-tp1", "llama3-70b-tp8", "llama3-405b-tp8"):
            layer = TensorParallelLayer(name)
            x = torch.randn(LAYERS[name][-1], 1, LAYERS[name][0], device=DEVICE, dtype=BF16, requires_grad=True)
            layers.append({"layer": name, "forward_backward": steady(lambda layer=layer, x=x: layer(x).sum().backward(),
                                                                     None, seconds=3.0)})
    return {"gemm": gemms, "attention": attention_rows, "layers": layers}


def steady_small_kernels() -> dict[str, list[dict[str, object]]]:
    """Steady rates of what the first runs timed only in bursts: cuDNN's causal attention at 256 and 512 keys
    and without the mask at 1k and 2k (the mask's cost on short sequences), skinny GEMMs (one side 64 to 2,048
    of 8,192) and small squares (the tile factor and the ramp), and the 2 GiB HBM copy."""
    attention_rows = [steady_attention(256, 64, 16), steady_attention(512, 32, 16),
                      steady_attention(1024, 16, 16, causal=False), steady_attention(2048, 8, 16, causal=False)]
    shapes = [(m, 8192, 8192) for m in (64, 128, 256, 512, 1024, 2048)] + \
        [(8192, 8192, k) for k in (128, 256, 512, 1024, 2048)] + [(n, n, n) for n in (1024, 2048, 4096)]
    gemms = [{"m": m, "n": n, "k": k, "layout": "fwd",
              **steady(partial(torch.mm, *operands(m, n, k, "fwd")), 2 * m * n * k)} for m, n, k in shapes]
    source = torch.randn(1 << 30, device=DEVICE, dtype=BF16)
    target = torch.empty_like(source)
    copy = steady(partial(target.copy_, source), None, seconds=3.0)
    return {"attention": attention_rows, "gemm": gemms,
            "copy": {"bytes": 4 * source.numel(), **copy, "gbps": 4 * source.numel() / copy["steady_s"] / 1e9}}


HOLD_KERNEL = r"""
extern "C" __global__ void hold(const float* buffer, long long length, long long cycles, int stream_memory,
                                float* sink) {
    extern __shared__ float scratch[];
    long long start = clock64();
    long long index = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float total = 0.0f;
    while (clock64() - start < cycles) {
        if (stream_memory) {
            total += buffer[index];
            index += (long long)gridDim.x * blockDim.x;
            if (index >= length) index -= length;
        } else {
            total = total * 0.999f + 1.0f;
        }
    }
    scratch[threadIdx.x] = total;
    if (total == -1.0f) sink[0] = scratch[threadIdx.x];
}
"""
"""A kernel that holds its SMs for ``cycles`` of the SM clock: one block per SM (it asks for most of the SM's
shared memory, so no GEMM block fits beside it), reading HBM in a grid-stride loop as NCCL's copy loops do, or
only spinning."""


def sm_contention(size: int = 8192, seconds: float = 2.0) -> list[dict[str, object]]:
    """Steady rate of ``size``^3 bf16 GEMMs on one stream while `HOLD_KERNEL` holds 0 to 66 SMs on another
    (NCCL's channels hold SMs so: one CTA per channel on an SM of its own), reading HBM or not: the compute
    slowdown engine/contention.py charges while communication kernels hold SMs."""
    import cupy

    module = cupy.RawModule(code=HOLD_KERNEL)
    hold = module.get_function("hold")
    shared_bytes = 200 * 1024
    hold.max_dynamic_shared_size_bytes = shared_bytes
    buffer = cupy.ones(1 << 28, dtype=cupy.float32)
    sink = cupy.zeros(1, dtype=cupy.float32)
    a, b = operands(size, size, size, "fwd")
    gemm_stream, hold_stream = torch.cuda.Stream(), torch.cuda.Stream()
    cycles = 5_000_000   # ~3 ms a launch at the power limit's clock
    rows = []
    for stream_memory in (1, 0):
        for sms in (0, 8, 16, 24, 32, 66):
            with torch.cuda.stream(gemm_stream):
                began = time.perf_counter()
                samples = []
                while time.perf_counter() - began < 1.0 + seconds:
                    if sms:
                        with cupy.cuda.ExternalStream(hold_stream.cuda_stream):
                            for _ in range(40):
                                hold((sms,), (512,), (buffer, cupy.int64(buffer.size), cupy.int64(cycles),
                                                      cupy.int32(stream_memory), sink),
                                     shared_mem=shared_bytes)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record(gemm_stream)
                    for _ in range(40):
                        torch.mm(a, b)
                    end.record(gemm_stream)
                    torch.cuda.synchronize()
                    if time.perf_counter() - began > 1.0:
                        samples.append(start.elapsed_time(end) / 1e3 / 40)
            seconds_per_gemm = statistics.median(samples)
            rows.append({"held_sms": sms, "hold_reads_hbm": bool(stream_memory), "gemm_s": seconds_per_gemm,
                         "tflops": 2 * size**3 / seconds_per_gemm / 1e12, "samples": len(samples), **gpu_state()})
    return rows


def fp8_gemms() -> dict[str, object]:
    """fp8 (e4m3) GEMMs through torch._scaled_mm with unit scales and a bf16 output, as Transformer Engine's fp8
    linears run them: square sizes timed, and the 8192^3 one and the Llama 3 405B TP-8 layer GEMMs steady."""
    def scaled(m: int, n: int, k: int) -> Callable[[], object]:
        a = torch.randn(m, k, device=DEVICE).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=DEVICE).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=DEVICE)
        return partial(torch._scaled_mm, a, b, scale_a=one, scale_b=one, out_dtype=BF16)

    square = []
    for size in (2048, 4096, 8192, 16384):
        result = timed(scaled(size, size, size))
        square.append({"m": size, "n": size, "k": size, **result,
                       "tflops": 2 * size**3 / result["median_s"] / 1e12})
    layers = [{"gemm": name, "m": m, "n": n, "k": k, "layout": layout,
               **steady(scaled(m, n, k), 2 * m * n * k)}
              for name, m, n, k, layout in layer_shapes("llama3-405b-tp8")]
    return {"square": square, "steady_8192": steady(scaled(8192, 8192, 8192), 2 * 8192**3, seconds=10.0),
            "layers": layers}


def sustained(size: int = 8192) -> list[dict[str, float]]:
    """TFLOP/s of ``size``^3 GEMMs back to back over ``SUSTAIN_S``, per sample of 100 GEMMs, with the GPU's state
    after each sample."""
    a, b = torch.randn(size, size, device=DEVICE, dtype=BF16), torch.randn(size, size, device=DEVICE, dtype=BF16)
    flops = 2 * size**3
    samples, began = [], time.perf_counter()
    while time.perf_counter() - began < SUSTAIN_S:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            torch.mm(a, b)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        samples.append({"t_s": time.perf_counter() - began, "tflops": 100 * flops / seconds / 1e12, **gpu_state()})
    return samples


def attention(backend: str, batch: int, q_heads: int, kv_heads: int, seq: int, head_dim: int,
              causal: bool) -> dict[str, object]:
    """Forward and backward of scaled-dot-product attention on ``backend``; FLOPs counted as FlashAttention
    counts them (4 b h s^2 d forward, halved by a causal mask; the backward 2.5 forwards)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(batch, q_heads, seq, head_dim, device=DEVICE, dtype=BF16, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq, head_dim, device=DEVICE, dtype=BF16, requires_grad=True)
    v = torch.randn(batch, kv_heads, seq, head_dim, device=DEVICE, dtype=BF16, requires_grad=True)
    gqa = {"enable_gqa": True} if kv_heads != q_heads else {}
    row = {"backend": backend, "batch": batch, "q_heads": q_heads, "kv_heads": kv_heads, "seq": seq,
           "head_dim": head_dim, "causal": causal}
    with sdpa_kernel(getattr(SDPBackend, backend)):
        forward = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
        grad = torch.randn_like(out)
        backward = timed(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
    flops = 4 * batch * q_heads * seq * seq * head_dim / (2 if causal else 1)
    return {**row, "forward": forward, "backward": backward,
            "forward_tflops": flops / forward["median_s"] / 1e12,
            "backward_tflops": 2.5 * flops / backward["median_s"] / 1e12}


def memory_kernels() -> list[dict[str, object]]:
    """Memory-bound kernels with the bytes each moves at least (reads + writes, bf16)."""
    rows = []

    def add(name: str, shape: tuple[int, ...], bytes_moved: float, fn: Callable[[], object]) -> None:
        result = timed(fn)
        rows.append({"kernel": name, "shape": list(shape), "bytes": bytes_moved, **result,
                     "gbps": bytes_moved / result["median_s"] / 1e9})

    big = torch.randn(1 << 30, device=DEVICE, dtype=BF16)
    other = torch.empty_like(big)
    size = big.numel() * 2
    add("read_sum", tuple(big.shape), size, partial(torch.sum, big, dtype=torch.float32))
    add("copy", tuple(big.shape), 2 * size, partial(other.copy_, big))
    add("add", tuple(big.shape), 3 * size, partial(torch.add, big, other))
    for hidden in (1024, 4096, 8192, 16384):
        rows_count = (1 << 27) // hidden
        x = torch.randn(rows_count, hidden, device=DEVICE, dtype=BF16, requires_grad=True)
        weight = torch.ones(hidden, device=DEVICE, dtype=BF16, requires_grad=True)
        bias = torch.zeros(hidden, device=DEVICE, dtype=BF16, requires_grad=True)
        tensor_bytes = x.numel() * 2
        norms = (("layernorm", partial(F.layer_norm, x, (hidden,), weight, bias)),
                 ("rmsnorm", partial(F.rms_norm, x, (hidden,), weight)))
        for name, norm in norms:
            add(f"{name}_forward", (rows_count, hidden), 2 * tensor_bytes, norm)
            out = norm()
            add(f"{name}_backward", (rows_count, hidden), 3 * tensor_bytes,
                partial(torch.autograd.grad, out, (x, weight), torch.randn_like(out), retain_graph=True))
    scores = torch.randn(32, 2048, 2048, device=DEVICE, dtype=BF16, requires_grad=True)
    score_bytes = scores.numel() * 2
    add("softmax_forward", tuple(scores.shape), 2 * score_bytes, partial(torch.softmax, scores, -1))
    probs = torch.softmax(scores, -1)
    add("softmax_backward", tuple(scores.shape), 3 * score_bytes,
        partial(torch.autograd.grad, probs, scores, torch.randn_like(probs), retain_graph=True))
    add("dropout_forward", tuple(scores.shape), 2 * score_bytes, partial(F.dropout, scores, 0.1, training=True))
    gate = torch.randn(8192, 53248 // 8, device=DEVICE, dtype=BF16)
    up = torch.randn_like(gate)
    add("swiglu_forward", tuple(gate.shape), 3 * gate.numel() * 2, lambda: F.silu(gate) * up)
    return rows


class Block(nn.Module):
    """A pre-norm decoder layer: causal self-attention through SDPA and a GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def profiled_step(out: Path) -> dict[str, object]:
    """One training step of a 4-layer decoder (width 1024, 16 heads, 4 x 2048 tokens, vocabulary 32,000, bf16
    autocast, fused AdamW) profiled with torch.profiler into ``out``; its wall time measured over ten steps
    unprofiled first."""
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    width, heads, layers, batch, seq, vocab = 1024, 16, 4, 4, 2048, 32000
    model = nn.Sequential(nn.Embedding(vocab, width), *(Block(width, heads) for _ in range(layers)),
                          nn.LayerNorm(width), nn.Linear(width, vocab)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=DEVICE)

    def step() -> None:
        with torch.autocast("cuda", dtype=BF16):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(10):
        began = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - began)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=1)) as profiler:
        for _ in range(3):
            step()
            torch.cuda.synchronize()
            profiler.step()
    profiler.export_chrome_trace(str(out))
    return {"width": width, "heads": heads, "layers": layers, "batch": batch, "seq": seq, "vocab": vocab,
            "parameters": sum(p.numel() for p in model.parameters()), "step_wall_s": walls,
            "step_wall_median_s": statistics.median(walls), "trace_bytes": out.stat().st_size}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    results: dict[str, object] = {
        "env": {"gpu": props.name, "sms": props.multi_processor_count, "memory_bytes": props.total_memory,
                "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "nvidia_smi": subprocess.run(["nvidia-smi", "-q", "-d", "CLOCK,POWER"], capture_output=True,
                                             text=True).stdout},
        "state_before": gpu_state(),
    }
    sections: dict[str, Callable[[], object]] = {
        "gemm_square": lambda: [gemm(n, n, n, "fwd") for n in (256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384)],
        "gemm_skinny": lambda: [gemm(m, 8192, 8192, "fwd") for m in (64, 128, 256, 512, 1024, 2048)]
        + [gemm(8192, 8192, k, "fwd") for k in (128, 256, 512, 1024, 2048)],
        "gemm_layers": lambda: [row for name in LAYERS for row in layer_gemms(name)],
        "fp8": fp8_gemms,
        "attention": lambda: [attempt(attention, backend, max(1, 16384 // seq), 16, 16, seq, head_dim, causal)
                              for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION")
                              for head_dim in (128, 64) for causal in (True, False)
                              for seq in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
        + [attempt(attention, backend, 1, 16, 1, 8192, 128, True)
           for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION")],
        "memory": memory_kernels,
        "layers": tensor_parallel_layers,
        "sustained": sustained,
        "steady": steady_kernels,
        "steady_small": steady_small_kernels,
        "sm_contention": sm_contention,
        "profiled_step": lambda: profiled_step(OUT / "torch_gpu_step.json"),
    }
    chosen = sys.argv[1:] or list(sections)
    for name, section in ((name, sections[name]) for name in chosen):
        began = time.perf_counter()
        try:
            results[name] = section()
        except Exception as error:  # one failed section must not lose the others' figures
            results[name] = {"error": f"{type(error).__name__}: {error}"}
        torch.cuda.empty_cache()
        print(f"{name}: {time.perf_counter() - began:.1f} s", flush=True)
        (OUT / "gpu_kernels.json").write_text(json.dumps(results, indent=1))
    results["state_after"] = gpu_state()
    (OUT / "gpu_kernels.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
