"""A synthetic PyTorch profiler (Kineto) trace of a data-parallel job, for timing the trace importer.

Per rank: GEMM and elementwise kernels on stream 7, each with its `cudaLaunchKernel` runtime event; every
tenth kernel, an NCCL all-reduce of 25 MiB (bf16) on stream 20 that waits for the compute stream (a
`cuda_sync` Stream Wait Event), its process group and size in the kernel's args as recent PyTorch writes them.
"""

from __future__ import annotations

from pathlib import Path

import orjson

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
BUCKET_ELEMENTS = 25 * 2**20 // 2


def rank_events(rank: int, ranks: int, events: int) -> list[dict]:
    """About ``events`` trace events of one rank."""
    out: list[dict] = []
    gpu_ts = 0.0
    correlation = 0
    kernels = 0
    while len(out) < events:
        correlation += 1
        kernels += 1
        name, dur = (GEMM, 180.0) if kernels % 3 else (ELEMENTWISE, 12.0)
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                    "ts": correlation * 5.0, "dur": 4.0, "args": {"correlation": correlation}})
        out.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": gpu_ts, "dur": dur,
                    "args": {"device": rank, "stream": 7, "correlation": correlation}})
        gpu_ts += dur + 2.0
        if kernels % 10 == 0:
            correlation += 1
            out.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 20,
                        "ts": gpu_ts, "dur": 0, "args": {"stream": 20, "wait_on_stream": 7}})
            out.append({"ph": "X", "cat": "kernel", "name": ALLREDUCE, "pid": 0, "tid": 20, "ts": gpu_ts,
                        "dur": 300.0, "args": {"device": rank, "stream": 20, "correlation": correlation,
                                               "Collective name": "allreduce", "In msg nelems": BUCKET_ELEMENTS,
                                               "Out msg nelems": BUCKET_ELEMENTS, "dtype": "BFloat16",
                                               "Process Group Name": "0",
                                               "Process Group Ranks": list(range(ranks))}})
    return out


def write_kineto_trace(folder: Path, ranks: int, events: int) -> list[Path]:
    """One Kineto JSON file per rank under ``folder``, ``events`` events in all; the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for rank in range(ranks):
        doc = {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks},
               "traceEvents": rank_events(rank, ranks, events // ranks)}
        path = folder / f"rank{rank}.json"
        path.write_bytes(orjson.dumps(doc))
        files.append(path)
    return files
