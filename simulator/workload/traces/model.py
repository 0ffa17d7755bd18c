"""What an importer reads out of one rank's trace: its ops in issue order per stream, with the facts the
replay needs. Importers (kineto.py, chakra.py) produce these; program.py turns them into a step program."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Literal, NamedTuple

from simulator.collectives.names import Primitive
from simulator.config.training_options import Precision
from simulator.errors import TraceError
from simulator.units import MAX_MESSAGE_BYTES, MAX_STEP_DURATION_S, MESSAGE_ALLOWED

OpKind = Literal["compute", "collective", "send", "recv"]
GemmShape = tuple[int, int, int, int] | tuple[()]
"""(batch, m, n, k) of a matrix multiply, () where the op is not one or its shapes are not recorded."""


class ProcessGroup(NamedTuple):
    """What a trace states of a process group beside its collectives: its description (torch.distributed's
    `group_desc`, else its name), which names the parallelism it serves, and its members' global ranks."""

    description: str
    members: tuple[int, ...]


@dataclass(frozen=True)
class TracedOp:
    """One op of a traced rank. ``index`` is its event's position in the file (errors name it); ``deps`` are
    positions in the rank's op list of ops on other streams (or, in a Chakra graph, any node) it waits for.
    ``op`` is the primitive a communication op runs (send_recv for a send or a receive), None for compute. A
    collective has a per-rank ``nbytes`` (nccl-tests convention), a process ``group`` name and, where the trace
    tells them, the group's ``members`` and ``group_size`` (0 when not stated); a send or receive has its
    ``nbytes``, names its ``peer`` and, where the trace tells them, its ``group`` and the group's
    ``description``. A matrix multiply whose operand shapes the trace records has ``gemm`` =
    (batch, m, n, k) and its ``dtype``; an attention kernel whose launching PyTorch attention op records its
    operand shapes has that op's ``key_length`` (0 where not known: attention_key_length). ``seq`` is a
    collective's sequence number in its process group where the trace records it (PyTorch's `Seq`: every member
    numbers the group's collectives alike), -1 where not.
    ``uneven``: an all-to-all whose ranks send unequal shares (split sizes that differ: a mixture of experts'
    token dispatch; a Ulysses attention's all-to-all splits evenly), as far as the trace tells; ``sends`` and
    ``receives`` the bytes it sends each member of its group and receives from each, in group order, where the
    trace tells them (() where not: an even all-to-all). A send or receive whose trace tells only its process
    group, of two ranks, has ``peer`` -1 and the group's ``members`` until the rank's number is known
    (with_group_peers). ``group_inferred``: the op's own record names no group, and ``group`` is the only one
    its rank's process-group metadata lists (groups.py lets a name that the other end of a transfer records
    prevail over it). ``input_bytes``: ``nbytes`` is the rank's input, as Chakra's `comm_size` gives it (the
    converter sums the launching op's input tensors), where the convention counts the output: an all-gather's
    shard, which program.py multiplies by the group's size once its members are known. ``size_field``: where
    the trace states ``group_size`` without listing the members (Kineto's `Group size`, Chakra's `pg_size` or
    its launching node), for the refusal of a group whose traced users are fewer. ``host``: the op ran on the
    host, not the GPU (a Chakra CPU node, `is_cpu_op`; a Kineto CPU op of a trace with no GPU activity): host
    time, which moving the trace to another GPU leaves as traced."""

    index: int
    name: str
    stream: str
    kind: OpKind
    start_s: float
    duration_s: float
    op: Primitive | None = None
    nbytes: float = 0.0
    group: str = ""
    members: tuple[int, ...] = ()
    group_size: int = 0
    description: str = ""
    group_inferred: bool = False
    peer: int = -1
    seq: int = -1
    uneven: bool = False
    sends: tuple[float, ...] = ()
    receives: tuple[float, ...] = ()
    deps: tuple[int, ...] = ()
    gemm: GemmShape = ()
    dtype: str = ""
    key_length: int = 0
    input_bytes: bool = False
    size_field: str = ""
    host: bool = False

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class TracedRank:
    """One rank's trace. ``rank`` is its number as the file states it, -1 when it does not; ``world`` the traced
    job's size as it states it (Kineto's `distributedInfo.world_size`, Chakra's default process group), 0 when it
    does not, and ``world_field`` where it states it; ``groups`` the process groups it states by name (Kineto's
    `distributedInfo.pg_config`, Chakra's process-group metadata), and ``groups_field`` where. ``timed``: its
    start times are measurements (a profiler trace), so idle time between a stream's ops is real; ``events``
    counts the file's events (or nodes); ``unknown`` lists (event index, name) of kernels kept as compute
    because their kind is not recognised, ``untold_peers`` (event index, name, 'send' or 'recv' where the
    trace tells which end, else '', its annotation's process group name, else '') of point-to-point kernels
    kept as compute because the trace does not tell their peer; ``lost_shapes`` (event index, name) of matrix
    multiplies with
    recorded shapes that launched no GEMM kernel to take them, ``repeated_gemms`` (event index and name of the
    op, name of the kernel) of GEMM kernels after the first of an op with recorded shapes, which keep their
    traced time (kineto.py, launchers.py); ``window`` is the traced step's (start, end) where the trace
    marks it (a ProfilerStep annotation around host-only activity); ``device`` the GPU the trace names (every
    entry of Kineto's `deviceProperties` by one name, '' where it names none or several); ``ordered``: its
    rank is its place in the file order, the file stating none. ``stepless``: the trace marks no profiled step
    (no ProfilerStep annotation), so all of it is read as one step; ``unordered_streams``: the number of streams
    its GPU ops run on where they are two or more and no wait or synchronisation orders them (0 otherwise);
    ``undated`` (event index, name) of events that are not replayed and carry no valid duration, left out."""

    file: str
    rank: int
    ops: tuple[TracedOp, ...]
    timed: bool
    events: int
    unknown: tuple[tuple[int, str], ...] = ()
    untold_peers: tuple[tuple[int, str, str, str], ...] = ()
    lost_shapes: tuple[tuple[int, str], ...] = ()
    repeated_gemms: tuple[tuple[int, str, str], ...] = ()
    events_field: str = "traceEvents"
    window: tuple[float, float] | None = None
    world: int = 0
    world_field: str = ""
    groups: dict[str, ProcessGroup] = field(default_factory=dict)
    groups_field: str = ""
    device: str = ""
    ordered: bool = False
    stepless: bool = False
    unordered_streams: int = 0
    undated: tuple[tuple[int, str], ...] = ()

    def where(self, op: TracedOp) -> str:
        """The field that locates ``op`` in its file: traceEvents[i] or nodes[i]."""
        return f"{self.events_field}[{op.index}]"

    def span_s(self) -> float:
        """Traced step time: the marked window, else first op start to last op end."""
        if self.window is not None:
            return self.window[1] - self.window[0]
        if not self.ops:
            return 0.0
        return max(op.end_s for op in self.ops) - min(op.start_s for op in self.ops)


def with_group_peers(traced: TracedRank) -> TracedRank:
    """``traced`` with the peer of each send or receive that its trace leaves to its two-rank process group (a
    Chakra node without comm_dst / comm_src: chakra.py) set to the group's other member, now that the rank's
    number is known (a Chakra file's is its place in the file order); refused where the rank is not a member.
    A Kineto send or receive whose record names no peer, of a group of two ranks, is left to it too."""
    ops = list(traced.ops)
    for position, op in enumerate(ops):
        if op.kind not in ("send", "recv") or op.peer >= 0:
            continue
        others = sorted(set(op.members) - {traced.rank})
        if len(others) != 1:
            raise trace_error(traced.file, traced.where(op), f"{op.kind} {op.name!r} names no peer, and rank "
                              f"{traced.rank} is not in its process group {op.group!r} of ranks {list(op.members)}, "
                              "whose other member would be the peer", "the file's rank as a member of the group "
                              "(Kineto: its distributedInfo.rank; Chakra: its place in the file order, from 0), or the "
                              "peer rank (Kineto: Dst Rank / Src Rank; Chakra: comm_dst / comm_src)")
        ops[position] = replace(op, peer=others[0], members=())
    return replace(traced, ops=tuple(ops))


CPU_STREAM = "cpu"
"""The stream of a Chakra trace's CPU ops (`is_cpu_op`, TracedOp.host)."""
KERNEL_KINDS = (
    ("elementwise", re.compile(r"dot_do_o|convert_dq_to|convert_d(?:q|kv)_kernel|clear_dkvaccum|splitkv_combine|"
                               r"FlashAttnBwd(?:Pre|Post)process|FlashAttnFwdCombine", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("matmul", re.compile(r"gemm|matmul|cutlass|cublas|nvjet|[hiw]mma|xmma|addmm|(?<![a-z])(?<!upsample_)linear|"
                          r"bmm|cijk_|triton_tem", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|reduce|softmax|norm|gammabeta|dropout|copy|fill|cat|index|"
                               r"scatter|gather|embedding|adam|sgd|foreach|unrolled|pointwise|gelu|silu|relu|add|"
                               r"mul|radix|scan|unique|segment|triton", re.I)),
    ("memory", re.compile(r"memcpy|memset", re.I)),
)
"""Kernel kinds recognised by name, in this order (cuDNN's attention kernels name their wgmma instructions);
anything else is an unknown kernel (kept as compute, counted in warnings). gpu_move.py
scales a moved trace's kernels by the rate that bounds their kind. cuBLAS names its Hopper GEMMs
nvjet_* from CUDA 12.8, rocBLAS and hipBLASLt theirs Cijk_* (Tensile), Inductor its GEMM templates triton_tem_*
(tried before elementwise's 'triton'); 'linear' is a word of its own, not upsampling's bilinear or linear1d;
the attention backward's helpers stream memory, and are tried first (elementwise, not attention, though
FlashAttention-2 names them flash_bwd_*): cuDNN's dot_do_o and convert_dq_to_16bits, FlashAttention-2's
flash_bwd_dot_do_o, flash_bwd_convert_dq / _dkv and flash_bwd_clear_dkvaccum kernels, and its forward's
flash_fwd_splitkv_combine, and FlashAttention-3's kernels of the same jobs, flash::FlashAttnBwdPreprocess (dO.O,
clearing dQaccum), FlashAttnBwdPostprocessConvertdQ and FlashAttnFwdCombine (split-KV); PyTorch's
multi_tensor_apply kernels are elementwise by 'mul'; PyTorch's embedding backward sorts and scans (cub
radix_sort, scan, unique_by_key, partial segments)."""


@lru_cache(maxsize=65536)
def kernel_kind(name: str) -> str:
    """The kind of a kernel by its name, or '' when it is not recognised."""
    for kind, pattern in KERNEL_KINDS:
        if pattern.search(name):
            return kind
    return ""


GEMM_OPERANDS = {"aten::mm": 0, "aten::addmm": 1, "aten::addmm_": 1, "aten::_addmm_activation": 1, "aten::bmm": 0,
                 "aten::baddbmm": 1, "aten::matmul": 0, "aten::linear": 0}
"""PyTorch ops that are one matrix multiply, with the position of their first operand in `Input Dims`."""


def gemm_shape(name: str, dims: object) -> GemmShape:
    """(batch, m, n, k) of a matrix-multiply op from its operand shapes, () when it is not one or the
    shapes are not recorded, or a side is not positive (an empty multiply has no output to cut into tiles).
    linear multiplies by the transposed weight [n, k]."""
    first = GEMM_OPERANDS.get(name)
    if first is None or not isinstance(dims, list) or len(dims) < first + 2:
        return ()
    a, b = dims[first], dims[first + 1]
    if not (isinstance(a, list) and isinstance(b, list) and len(a) >= 2 and len(b) >= 2
            and all(isinstance(d, int) and d > 0 for d in a + b)):
        return ()
    rows = math.prod(a[:-1])
    if name == "aten::linear":
        return (1, rows, b[0], a[-1])
    if len(b) == 2:
        return (1, rows, b[1], a[-1])
    return (math.prod(b[:-2]), a[-2], b[-1], a[-1])


GEMM_PRECISIONS: dict[str, Precision] = {"float": "fp32", "c10::bfloat16": "bf16", "bfloat16": "bf16",
                                         "c10::half": "fp16", "half": "fp16"}
"""PyTorch `Input type` of a matrix multiply -> the precision whose peak bounds it."""
ATTENTION_KEYS = {
    "aten::scaled_dot_product_attention": (1, -2), "aten::_scaled_dot_product_flash_attention": (1, -2),
    "aten::_scaled_dot_product_efficient_attention": (1, -2), "aten::_scaled_dot_product_cudnn_attention": (1, -2),
    "aten::_cudnn_attention_forward": (1, -2), "aten::_flash_attention_forward": (1, -3),
    "aten::_efficient_attention_forward": (1, -3), "flash_attn::_flash_attn_forward": (1, -3),
    "aten::_scaled_dot_product_flash_attention_backward": (2, -2),
    "aten::_scaled_dot_product_efficient_attention_backward": (2, -2),
    "aten::_scaled_dot_product_cudnn_attention_backward": (2, -2), "aten::_cudnn_attention_backward": (2, -2),
    "aten::_flash_attention_backward": (2, -3), "aten::_efficient_attention_backward": (2, -3),
    "flash_attn::_flash_attn_backward": (2, -3),
}
"""PyTorch attention ops -> (position of the key among their `Input Dims`, the axis of its 4-d shape that is the
key length): the SDPA ops take (batch, heads, length, head dim), the flash and memory-efficient kernels' own ops
(batch, length, heads, head dim); a backward op's first operand is the output's gradient."""


def attention_key_length(name: str, dims: object) -> int:
    """The key length of an attention op from its operand shapes, 0 when it is not one, or its key is not a
    recorded 4-d shape (a variable-length batch packs its sequences into one 3-d tensor)."""
    operand = ATTENTION_KEYS.get(name)
    if operand is None or not isinstance(dims, list) or len(dims) <= operand[0]:
        return 0
    key = dims[operand[0]]
    if not (isinstance(key, list) and len(key) == 4 and all(isinstance(d, int) and d > 0 for d in key)):
        return 0
    return key[operand[1]]


def as_int(value: object) -> int:
    """An integer from a JSON number or its text (protobuf JSON writes 64-bit integers as strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (
            isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{value!r} is not an integer")
    return int(value)


def trace_error(file: str, where: str, problem: str, allowed: str = "") -> TraceError:
    """An error in a trace file at ``where`` (traceEvents[i], nodes[i]...)."""
    return TraceError(problem, field=where, allowed=allowed, file=file)


def checked_message(nbytes: float, file: str, where: str, name: str) -> float:
    """A traced collective's or transfer's bytes, refused beyond MAX_MESSAGE_BYTES as a scenario's are."""
    if nbytes > MAX_MESSAGE_BYTES:
        raise trace_error(file, where, f"message of {nbytes:.4g} bytes in {name!r} is more than 1 PiB, beyond any "
                          "GPU's memory", MESSAGE_ALLOWED)
    return nbytes


def checked_duration(seconds: float, file: str, where: str, name: str) -> float:
    """A traced op's duration, refused beyond MAX_STEP_DURATION_S as a scenario's times inside a step are."""
    if seconds > MAX_STEP_DURATION_S:
        raise trace_error(file, where, f"{name!r} lasts {seconds:.4g} s, more than a day, longer than any "
                          "training step", "a duration up to 1 d (86,400 s)")
    return seconds
