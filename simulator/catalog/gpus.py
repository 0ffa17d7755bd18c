"""GPU specifications shipped with trainsim: dense peak FLOP/s per precision, HBM capacity and bandwidth, board power.

Figures are dense (no 2:4 sparsity) vendor peaks for the SXM/HGX parts:
- A100 40GB / 80GB SXM: NVIDIA A100 datasheet (312 TFLOP/s BF16/FP16, 156 TF32, 19.5 FP32; HBM2 1,555 GB/s for
  40GB, HBM2e 2,039 GB/s for 80GB). No FP8 tensor cores.
- H100 SXM: NVIDIA H100 datasheet (989 BF16/FP16, 1,979 FP8, 494.5 TF32, 67 FP32; HBM3 3.35 TB/s).
- H200 SXM: NVIDIA H200 datasheet (same compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s).
- B200 (HGX): NVIDIA DGX/HGX B200 figures divided per GPU (2,250 BF16/FP16, 4,500 FP8, ~75 FP32) and NVIDIA's
  current per-GPU column for the HGX B200 (Blackwell datasheet: 180 GB HBM3e at 7.7 TB/s, TF32 2.2 PFLOPS with
  sparsity, so 1,100 dense). The driver agrees on the bandwidth: a 7,680-bit bus at 3,996 MHz DDR is 7.67 TB/s
  (pytorch/ao PR #4002); the earlier 8 TB/s assumed an 8,192-bit bus.
- GB200 (the Blackwell GPU of a GB200 NVL72 rack, run at 1,200 W against the HGX B200's 1,000 W): NVIDIA's GB200
  NVL72 rack figures (https://www.nvidia.com/en-us/data-center/gb200-nvl72/: FP16/BF16 Tensor Core 360 PFLOPS,
  FP8 720, TF32 180, all with sparsity, FP32 5,760 TFLOPS, up to 13.4 TB HBM3e at 576 TB/s) divided by its 72
  GPUs and the sparse figures by 2: 2,500 BF16/FP16, 5,000 FP8, 1,250 TF32, 80 FP32; 186 GB at 8 TB/s, which
  NVIDIA's current per-GPU column for the GB200 also gives (against the HGX B200's 7.7 TB/s on the same chip). G.
  Lockwood's per-variant table (glennklockwood.com/garden/processors/B200) gives the same 2,500 for the GB200
  variant at 1,200 W and 2,250 for the HGX one at 1,000 W.
HBM capacity is what the driver reports as the GPU's total memory (nvidia-smi ``memory.total``): A100-SXM4-40GB
40,960 MiB, A100-SXM4-80GB 81,920 MiB, H100 80GB HBM3 81,559 MiB, H200 143,771 MiB, B200 183,359 MiB, GB200
189,471 MiB (198,674,743,296 B = 185.0 GiB: the total nvidia-smi prints for each GPU of GB200 NVL72 compute
trays and NVL4 boards in public listings of driver 580; NVIDIA's 186 GB per GPU, the rack's "up to 13.4 TB" over
72, is within 0.6% of it read as GiB, not as 1e9 B, as the H100's "80 GB" is). The marketed sizes
are no reliable unit: the H100's "80 GB" is binary (five 16 GiB HBM3 stacks, S. Bekman, ml-engineering,
compute/accelerator/README.md, "Accelerator memory size and speed"; read as 80e9 bytes it would understate
what a training job can allocate by 5 GiB), while the B200's "192 GB" is decimal (its 183,359 MiB are 179 GiB,
192.3e9 bytes; NVIDIA's current "180 GB" is those 179 GiB), hence the driver's figure.
Board power is each part's maximum (its thermal design power, what a GPU draws at most while it computes): A100
SXM 400 W (A100 datasheet, "Max thermal design power"), H100 SXM and H200 SXM up to 700 W (their datasheets, "Max
TDP"), B200 1,000 W in HGX B200 and 1,200 W in a GB200 NVL72 rack (G. Lockwood's per-variant table, above). It
bounds the GPUs' energy (metrics/resources.py): hosts, network and cooling are not counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType

from simulator.errors import ScenarioError, lookup

PRECISIONS = ("fp8", "bf16", "fp16", "tf32", "fp32")


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model: dense peak FLOP/s by precision, HBM capacity (bytes), HBM bandwidth (bytes/s) and maximum
    board power (W).

    ``fp32`` is the CUDA-core (non-tensor) rate, used for elementwise kernels; ``tf32`` is the tensor-core rate.
    """

    name: str
    peak_flops: MappingProxyType = field(hash=False)
    hbm_bytes: float
    hbm_bandwidth: float
    board_power_w: float

    def peak(self, precision: str, where: str = "training.precision") -> float:
        """Dense peak FLOP/s at ``precision``; a precision this GPU lacks (fp8 on A100) is a ScenarioError."""
        if precision not in self.peak_flops:
            raise ScenarioError(
                f"GPU '{self.name}' has no {precision!r} peak",
                field=where,
                allowed=", ".join(self.peak_flops),
            )
        return self.peak_flops[precision]


def _spec(name: str, hbm_bytes: float, hbm_bandwidth: float, board_power_w: float, **tflops: float) -> GPUSpec:
    peaks = {precision: tflops[precision] * 1e12 for precision in PRECISIONS if precision in tflops}
    return GPUSpec(name, MappingProxyType(peaks), hbm_bytes, hbm_bandwidth, board_power_w)


_A100_TFLOPS = dict(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5)
_H100_TFLOPS = dict(fp8=1979.0, bf16=989.0, fp16=989.0, tf32=494.5, fp32=67.0)
MIB = 2.0**20

GPUS: MappingProxyType = MappingProxyType({
    spec.name: spec
    for spec in (
        _spec("a100-40gb", 40960 * MIB, 1.555e12, 400.0, **_A100_TFLOPS),
        _spec("a100-80gb", 81920 * MIB, 2.039e12, 400.0, **_A100_TFLOPS),
        _spec("h100-sxm", 81559 * MIB, 3.35e12, 700.0, **_H100_TFLOPS),
        _spec("h200", 143771 * MIB, 4.8e12, 700.0, **_H100_TFLOPS),
        _spec("b200", 183359 * MIB, 7.7e12, 1000.0, fp8=4500.0, bf16=2250.0, fp16=2250.0, tf32=1100.0, fp32=75.0),
        _spec("gb200", 189471 * MIB, 8.0e12, 1200.0, fp8=5000.0, bf16=2500.0, fp16=2500.0, tf32=1250.0, fp32=80.0),
    )
})


_SXM_DATASHEET = "NVIDIA {} Tensor Core GPU datasheet, SXM form factor: max thermal design power (TDP) {}"
_BLACKWELL_TABLE = "G. Lockwood, glennklockwood.com/garden/processors/B200, per-variant table: {} at {}"
BOARD_POWER_SOURCES: MappingProxyType = MappingProxyType({
    "a100-40gb": _SXM_DATASHEET.format("A100", "400 W"),
    "a100-80gb": _SXM_DATASHEET.format("A100", "400 W"),
    "h100-sxm": _SXM_DATASHEET.format("H100", "up to 700 W"),
    "h200": _SXM_DATASHEET.format("H200", "up to 700 W"),
    "b200": _BLACKWELL_TABLE.format("the HGX B200", "1,000 W"),
    "gb200": _BLACKWELL_TABLE.format("the GB200 NVL72's B200", "1,200 W"),
})
"""Where each catalog GPU's board power comes from, as `trainsim gpus NAME` cites it."""


DEVICE_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bGB200\b", "gb200"), (r"\bB200\b", "b200"), (r"\bH200\b", "h200"), (r"\bH100\b(?!.*(PCIe|NVL))", "h100-sxm"),
    (r"\bA100\b.*80GB", "a100-80gb"), (r"\bA100\b", "a100-40gb"))
"""The catalog GPU of a device name as CUDA reports it (`cudaDeviceProp.name`, which a Kineto trace's
`deviceProperties` records: 'NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-80GB'), patterns tried in order. The
H100 PCIe and H100 NVL (PCIe cards of 80 and 94 GB) and the GH200's H100 ('NVIDIA GH200 480GB': 96 or 144 GB)
are no catalog GPU."""


def catalog_gpu_of(device: str) -> str | None:
    """The catalog GPU ``device`` (a CUDA device name) is, None where it is none of them (an H100 PCIe or NVL, a
    GH200, an L40S)."""
    return next((name for pattern, name in DEVICE_NAMES if re.search(pattern, device)), None)


def gpu_names() -> tuple[str, ...]:
    """Names of the GPUs in the catalog, in catalog order."""
    return tuple(GPUS)


def get_gpu(name: str, where: str = "cluster.gpu_model") -> GPUSpec:
    """The catalog entry for ``name``; an unknown name is a ScenarioError listing the known ones."""
    return lookup(GPUS, name, "GPU", where)
