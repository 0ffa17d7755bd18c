"""The CPU op of a Kineto trace that launched each GPU kernel, the matrix-multiply shapes those ops hand to
their kernels (for `recost_gemms` and a trace's FLOPs), and the key length of attention kernels (for a trace
moved to another GPU: gpu_move.py).

A kernel is launched (a runtime call sharing its correlation id) inside nested CPU ops of one thread; the
innermost of them launched it. A matrix multiply with recorded shapes gives its shape to the first GEMM kernel
(by name: model.py kernel_kind) it launched: not to the casts that autocast launches inside aten::linear (their
innermost op is aten::copy_), nor to a second GEMM kernel of the same op (split-K's reduction), which keeps its
traced time. What does not fit is told, for the run's warnings: shapes that reached no GEMM kernel, and the GEMM
kernels after an op's first. A matrix multiply during which its thread launched nothing on the GPU ran on the CPU
(a multiply of CPU tensors launches no kernel by design, and Kineto records no tensor's device): it lost no shape.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from itertools import accumulate
from typing import Generic, TypeVar

from simulator.workload.traces.model import GEMM_OPERANDS, attention_key_length, gemm_shape

Payload = TypeVar("Payload")
Launch = tuple[float, object]
"""A kernel's launch: (the runtime call's start in microseconds, its thread)."""


class Spans(Generic[Payload]):
    """CPU ops of one thread (start, end, payload), to find the innermost one around a launch. Sorted by start,
    the longer first where two start together (an op and the first op inside it often do), and where two span
    the same time, by ``depth`` of their payloads (the deeper later: inner), with the furthest end reached so
    far, so a search from the last start before the launch meets the innermost op first and stops as soon as
    nothing earlier can contain the launch. ``parents``: each op's innermost enclosing op (its position), -1 for
    an outermost one."""

    def __init__(self, spans: list[tuple[float, float, Payload]], depth: Callable[[Payload], int] | None = None):
        spans.sort(key=lambda span: (span[0], -span[1], depth(span[2]) if depth else 0))
        self.starts = [span[0] for span in spans]
        self.spans = spans
        self.reach = list(accumulate((span[1] for span in spans), max))
        self.parents: list[int] = []
        open_ops: list[int] = []
        for _, end, _ in spans:
            while open_ops and spans[open_ops[-1]][1] < end:
                open_ops.pop()
            self.parents.append(open_ops[-1] if open_ops else -1)
            open_ops.append(len(self.parents) - 1)

    def innermost(self, ts: float) -> int:
        """The position of the innermost op that contains ``ts``, -1 where none does."""
        position = bisect.bisect_right(self.starts, ts) - 1
        while position >= 0 and self.reach[position] >= ts:
            if self.spans[position][1] >= ts:
                return position
            position -= 1
        return -1

    def around(self, ts: float) -> Payload | None:
        """The payload of the innermost op that contains ``ts``."""
        position = self.innermost(ts)
        return self.spans[position][2] if position >= 0 else None

    def enclosing(self, position: int) -> list[int]:
        """The op at ``position`` and the ops around it, innermost first."""
        chain = []
        while position >= 0:
            chain.append(position)
            position = self.parents[position]
        return chain


def enclosing(spans_by_thread: dict[object, Spans[Payload]], launch: Launch | None) -> Payload | None:
    """The payload of the innermost CPU op on the launching thread that contains the launch time."""
    if launch is None:
        return None
    spans = spans_by_thread.get(launch[1])
    return spans.around(launch[0]) if spans is not None else None


def key_length(spans_by_thread: dict[object, Spans[tuple[int, dict]]], launch: Launch | None) -> int:
    """The key length of the attention kernel launched at ``launch``: that of the innermost PyTorch attention op
    with recorded shapes around the launch on its thread (a cuDNN kernel's aten::_cudnn_attention_forward inside
    aten::scaled_dot_product_attention), 0 where none is."""
    if launch is None or launch[1] not in spans_by_thread:
        return 0
    spans = spans_by_thread[launch[1]]
    for position in spans.enclosing(spans.innermost(launch[0])):
        event = spans.spans[position][2][1]
        length = attention_key_length(str(event.get("name", "")), (event.get("args") or {}).get("Input Dims"))
        if length:
            return length
    return 0


PRIMITIVE_GEMMS = frozenset(GEMM_OPERANDS) - {"aten::linear", "aten::matmul"}
"""The matrix multiplies that launch their GEMM themselves; aten::linear and aten::matmul call one of them."""


def gemm_depth(payload: tuple[int, dict]) -> int:
    """How deep a CPU op sits among ops that span the same time: a matrix multiply that launches its GEMM itself
    inside anything else (an aten::linear, a profiler's record function), so its shape and type are the kernel's
    (a bf16 aten::mm, not the fp32 aten::linear around it under autocast)."""
    return 1 if str(payload[1].get("name", "")) in PRIMITIVE_GEMMS else 0


def gemm_fields(event: dict) -> dict:
    """gemm and dtype of a CPU op that is a matrix multiply with recorded shapes (else nothing)."""
    args = event.get("args") or {}
    shape = gemm_shape(str(event.get("name", "")), args.get("Input Dims"))
    if not shape:
        return {}
    types = args.get("Input type") or [""]
    return {"gemm": shape, "dtype": str(types[0]) if isinstance(types, list) else ""}


class GemmLaunchers:
    """Hands each matrix multiply's shape to the first GEMM kernel it launched, kernel by kernel in start order.
    ``ops``: each thread's CPU ops, their payload (position in traceEvents, event). ``launches``: each thread's
    launches of GPU work (the start of each runtime call that a GPU event names by its correlation id, in
    microseconds). ``repeated``: (position of the op, its name, the kernel's name) of each GEMM kernel after an
    op's first, kept at its traced time."""

    def __init__(self, ops: dict[object, Spans[tuple[int, dict]]], launches: dict[object, list[float]]):
        self.ops = ops
        self.launches = {thread: sorted(times) for thread, times in launches.items()}
        self.taken: set[tuple[object, int]] = set()
        self.reached: set[tuple[object, int]] = set()
        self.repeated: list[tuple[int, str, str]] = []

    def fields(self, launch: Launch | None, kernel: str) -> dict:
        """gemm and dtype for the GEMM kernel ``kernel`` launched at ``launch``: its launcher's shape, where that is
        a matrix multiply with recorded shapes whose first GEMM kernel this is (else nothing)."""
        if launch is None or launch[1] not in self.ops:
            return {}
        ts, thread = launch
        spans = self.ops[thread]
        position = spans.innermost(ts)
        self.reached.update((thread, around) for around in spans.enclosing(position))
        if position < 0:
            return {}
        index, event = spans.spans[position][2]
        fields = gemm_fields(event)
        if not fields:
            return {}
        if (thread, position) in self.taken:
            self.repeated.append((index, str(event.get("name", "")), kernel))
            return {}
        self.taken.add((thread, position))
        return fields

    def lost(self, in_step: Callable[[float], bool]) -> list[tuple[int, str]]:
        """(position in traceEvents, name) of the matrix multiplies with recorded shapes that start in the
        profiled step (``in_step`` of their start, microseconds) and launched no GEMM kernel, in file order: those
        around no GEMM kernel's launch, but for one that a matrix multiply with recorded shapes inside it stands
        for (an aten::linear's shape goes through the aten::addmm it runs, which alone is counted), and for one
        inside a matrix multiply that took a GEMM kernel itself (an aten::addmm that ended before the GEMM its
        aten::linear launched); nor one during which its thread launched nothing on the GPU (`on_the_gpu`)."""
        lost = []
        for thread, spans in self.ops.items():
            shaped = [position for position, (start, end, (_, event)) in enumerate(spans.spans)
                      if in_step(start) and gemm_fields(event) and self.on_the_gpu(thread, start, end)]
            outer = {around for position in shaped for around in spans.enclosing(spans.parents[position])}
            taken = {position for owner, position in self.taken if owner == thread}
            lost += [spans.spans[position][2] for position in shaped
                     if (thread, position) not in self.reached and position not in outer
                     and taken.isdisjoint(spans.enclosing(spans.parents[position]))]
        return sorted((index, str(event.get("name", ""))) for index, event in lost)

    def on_the_gpu(self, thread: object, start: float, end: float) -> bool:
        """Whether ``thread`` launched GPU work between ``start`` and ``end`` (microseconds): a CPU op during which
        it launched none ran on the CPU (a matrix multiply of CPU tensors), and no kernel was its to reach."""
        times = self.launches.get(thread, [])
        first = bisect.bisect_left(times, start)
        return first < len(times) and times[first] <= end
