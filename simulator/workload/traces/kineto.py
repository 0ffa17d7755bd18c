"""PyTorch profiler (Kineto) Chrome-trace JSON: one rank's trace into a TracedRank.

GPU activity (`kernel`, `gpu_memcpy`, `gpu_memset` events) runs per CUDA stream in start order. A `cuda_sync`
"Stream Wait Event" makes the next kernel of the waiting stream depend on the last kernel launched on
`wait_on_stream` before the recorded CUDA event (found through its correlation id), or, when the record is not in
the trace, on the last kernel of that stream to finish before the wait; where the trace records no such wait, or one
naming no stream, the host's cudaEventRecord / cudaStreamWaitEvent calls give it (_HostWaits); after a host
synchronisation (Stream, Event or Context Sync) the next kernel of each stream that the blocked thread launches
depends on the last one to end before it returned on the synchronised stream(s). NCCL kernels become collectives, or
sends and receives where the trace names their peer: the primitive, message size, data type, process group and peer
come from the kernel's own arguments (recent PyTorch) or from the `record_param_comms` CPU op that launched it
(matched through the launch's correlation id), the primitive and data type also from the kernel name
(`ncclDevKernel_AllReduce_Sum_bf16_RING_LL`). A trace with no GPU activity replays its outermost CPU ops as host
time (TracedOp.host), one stream per thread.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
import zlib
from collections.abc import Collection
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Literal, NamedTuple

import orjson

from simulator.collectives.names import Primitive
from simulator.errors import TraceError
from simulator.units import MAX_STEP_DURATION_S, counted
from simulator.workload.traces.launchers import GemmLaunchers, Spans, enclosing, gemm_depth, gemm_fields, key_length
from simulator.workload.traces.model import (
    OpKind,
    ProcessGroup,
    TracedOp,
    TracedRank,
    as_int,
    checked_duration,
    checked_message,
    kernel_kind,
    trace_error,
)

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver", "runtime")
US = 1e-6
WAIT_ROUNDING_S = 1e-6
"""How far after a Stream Wait Event a kernel of the stream it waits on may end and still be the one it waits
for, where the trace lacks the event's record: Kineto writes microseconds rounded one by one (and an epoch
timestamp in a float resolves 0.25 us), so the wait at a kernel's end can read up to a microsecond early."""

COLLECTIVE_NAMES: dict[str, Primitive] = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "_broadcast_oop": "broadcast", "_reduce_oop": "reduce",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "all_to_all": "all_to_all", "alltoall": "all_to_all",
    "alltoall_base": "all_to_all", "all_to_allv": "all_to_all", "barrier": "all_reduce",
    "send": "send_recv", "recv": "send_recv", "recv_any_source": "send_recv",
}
"""`record_param_comms` collective names (lower-cased) -> trainsim primitives (send_recv: a send or a receive).
ProcessGroupNCCL runs an all-gather or reduce-scatter of uneven sizes as `_broadcast_oop` / `_reduce_oop` on
Broadcast / Reduce kernels."""

MISREAD_COLLECTIVES = ("gather", "scatter")
"""`Collective name`s that trainsim does not model and whose kernel would pass for another collective: PyTorch
runs a gather or a scatter as NCCL's SendRecv kernel (a transfer whose peer is not told) and a gather on an
AllReduce kernel ran as an all-reduce."""

KERNEL_PRIMITIVES: dict[str, Primitive] = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter", "broadcast": "broadcast",
    "reduce": "reduce", "alltoall": "all_to_all", "sendrecv": "send_recv", "send": "send_recv", "recv": "send_recv"}
"""Words of NCCL kernel names (lower-cased) -> trainsim primitives."""

P2P_KINDS: dict[str, OpKind] = {"send": "send", "recv": "recv", "recv_any_source": "recv"}
"""`Collective name` of a point-to-point kernel -> which end of the transfer it is."""


DTYPE_BYTES = {"float": 4, "float32": 4, "f32": 4, "bfloat16": 2, "bf16": 2, "half": 2, "float16": 2, "f16": 2,
               "double": 8, "float64": 8, "f64": 8, "long": 8, "int64": 8, "i64": 8, "uint64": 8, "u64": 8,
               "int": 4, "int32": 4, "i32": 4, "uint32": 4, "u32": 4, "short": 2, "int16": 2, "uint16": 2,
               "byte": 1, "char": 1, "bool": 1, "uint8": 1, "int8": 1, "u8": 1, "i8": 1,
               "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
               "fp8": 1, "f8": 1, "f8e4m3": 1, "f8e5m2": 1,
               "complexhalf": 4, "complexfloat": 8, "complexdouble": 16}
"""Element bytes of PyTorch's ScalarType names (`dtype`, lower-cased) and of NCCL kernel-name type words."""


def cuda_stream(number: object) -> str:
    """The replayed stream of Kineto's CUDA stream ``number`` (`args.stream`): `stream 7`, so that the trace's
    threads and the timeline read `GPU 0 stream 7`, not a bare `GPU 0 7`."""
    return f"stream {number}"


def load_json(path: Path) -> object:
    """A JSON document from ``path`` (gzip-compressed when it ends in .gz); unreadable JSON is a TraceError."""
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        return orjson.loads(data)
    except gzip.BadGzipFile as exc:
        raise trace_error(str(path), "", f"not a gzip file ({exc})",
                          "a .json.gz file gzip wrote, or the JSON file named without .gz") from None
    except OSError as exc:
        raise trace_error(str(path), "", f"cannot read the file ({exc.strerror or exc})") from None
    except (EOFError, zlib.error) as exc:
        raise trace_error(str(path), "", f"not a complete gzip file ({exc}); a truncated file?",
                          "a complete .json.gz file") from None
    except orjson.JSONDecodeError as exc:
        if _documents_in_a_row(data):
            raise trace_error(str(path), "", "several JSON documents one after another, as Chakra's jsonizer writes "
                              "(set workload.format: chakra-json for a Chakra trace)",
                              "one Chrome-trace JSON document") from None
        raise trace_error(str(path), "", f"not valid JSON ({exc}); a truncated file?",
                          "a complete Chrome-trace JSON document") from None


def _documents_in_a_row(data: bytes) -> bool:
    """Whether ``data`` starts with a complete JSON document that other text follows."""
    text = data.decode("utf-8", errors="replace").lstrip()
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return False
    return bool(text[end:].strip())


def _device_name(properties: object) -> str:
    """The GPU a Kineto trace ran on, as its `deviceProperties` name every visible device ('NVIDIA H200'); ''
    where it lists none (a CPU trace), names several, or is not a list of objects."""
    if not isinstance(properties, list):
        return ""
    names = {device.get("name") for device in properties if isinstance(device, dict)}
    name = names.pop() if len(names) == 1 else None
    return name if isinstance(name, str) else ""


def read_kineto(path: Path) -> TracedRank:
    """One rank's Kineto trace as a TracedRank (its rank from `distributedInfo`, when present)."""
    file = str(path)
    doc = load_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        chakra = isinstance(doc, list) or (isinstance(doc, dict) and ("nodes" in doc or "version" in doc))
        raise trace_error(file, "traceEvents", "no traceEvents list" + (", and it looks like a Chakra execution "
                          "trace (set workload.format: chakra-json)" if chakra else ""),
                          "a Chrome-trace object with traceEvents")
    events = doc["traceEvents"]
    rank, world, groups, only = _distributed_info(file, doc.get("distributedInfo"))
    parsed = _Parsed(file, events, groups, only)
    ops, unknown = parsed.gpu_ops() if parsed.gpu else (parsed.cpu_ops(), [])
    if not ops:
        raise trace_error(file, "traceEvents", f"nothing to replay in {counted(len(events), 'event')}: no GPU "
                          "kernel, memcpy or memset, and no CPU op (cat cpu_op) in the profiled step",
                          "a profiler trace of one training step")
    traced = TracedRank(file=file, rank=rank, ops=tuple(ops), timed=True, events=len(events), unknown=tuple(unknown),
                        untold_peers=tuple(parsed.untold_peers), lost_shapes=tuple(parsed.lost_shapes),
                        repeated_gemms=tuple(parsed.repeated_gemms), window=None if parsed.gpu else parsed.step_window,
                        world=world, world_field="distributedInfo.world_size", groups=groups,
                        groups_field="distributedInfo.pg_config", device=_device_name(doc.get("deviceProperties")),
                        stepless=not parsed.marked, unordered_streams=parsed.unordered_streams,
                        undated=tuple(parsed.undated))
    if traced.span_s() > MAX_STEP_DURATION_S:
        raise trace_error(file, "traceEvents", f"the replayed events span {traced.span_s():.4g} s, more than a day, "
                          "longer than any training step", "a profiler trace of one training step")
    return traced


def _distributed_info(file: str, info: object) -> tuple[int, int, dict[str, ProcessGroup], str]:
    """(rank, world size, process groups by name, the only group) as `distributedInfo` states them: -1, 0, none
    and '' where it does not. The rank must be one of the `world_size` ranks, and each group of `pg_config`
    (torch.distributed's configuration of every group the rank is a member of: `pg_name`, `pg_desc`, `pg_size`,
    `ranks`) `pg_size` distinct ranks of the job. The only group: the one `pg_config` lists where it lists one
    and no entry without a `pg_name`, as Chakra's process-group metadata (chakra.py), else ''."""
    if not isinstance(info, dict):
        return -1, 0, {}, ""
    rank, world = (_whole(info.get(key)) for key in ("rank", "world_size"))
    if rank is not None and world is not None and rank >= world:
        raise trace_error(file, "distributedInfo.rank", f"rank {rank} is not one of the traced job's {world} "
                          f"rank{'s' if world != 1 else ''} (distributedInfo.world_size)",
                          f"a rank from 0 to {world - 1}" if world else "a world_size of at least 1")
    configs = info.get("pg_config")
    groups: dict[str, ProcessGroup] = {}
    unnamed = False
    for index, config in enumerate(configs if isinstance(configs, list) else []):
        if not isinstance(config, dict) or config.get("pg_name") is None:
            unnamed = True
            continue
        name, ranks, size = str(config["pg_name"]), config.get("ranks"), config.get("pg_size")
        shown = _shown_numbers(ranks)
        members = shown[0] if shown is not None and not shown[2] else None
        if (members is None or not members or len(set(members)) != len(members)
                or (size is not None and _whole(size) != len(members))
                or (world is not None and max(members) >= world)):
            job = f" of a {world}-rank job (distributedInfo.world_size)" if world is not None else ""
            raise trace_error(file, f"distributedInfo.pg_config[{index}]", f"process group {name!r} has ranks "
                              f"{ranks!r} and pg_size {size!r}{job}", "pg_size distinct ranks of the job")
        groups[name] = ProcessGroup(str(config.get("pg_desc") or name), members)
    only = next(iter(groups)) if len(groups) == 1 and not unnamed else ""
    return -1 if rank is None else rank, world or 0, groups, only


class _Parsed:
    """A trace's complete events sorted by kind, each with its index in traceEvents."""

    def __init__(self, file: str, events: list, groups: dict[str, ProcessGroup], only: str):
        self.file = file
        self.groups = groups
        self.only = only
        self.gpu: list[tuple[int, dict]] = []
        self.cpu: list[tuple[int, dict]] = []
        self.comms: dict[object, list[tuple[float, float, dict]]] = {}
        self.cpu_spans: dict[object, list[tuple[float, float, tuple[int, dict]]]] = {}
        self.launches: dict[object, tuple[float, object]] = {}
        self.waits: list[dict] = []
        self.syncs: list[dict] = []
        self.step_window: tuple[float, float] | None = None
        self.gpu_steps: dict[str, float] = {}
        self.stream_calls: list[tuple[float, object, str, object]] = []
        self.undated: list[tuple[int, str]] = []
        self.unordered_streams = 0
        self.untold_peers: list[tuple[int, str, str, str]] = []
        self.lost_shapes: list[tuple[int, str]] = []
        self.repeated_gemms: list[tuple[int, str, str]] = []
        origin = _origin_us(events)
        for index, event in enumerate(events):
            if not isinstance(event, dict):
                raise trace_error(file, f"traceEvents[{index}]", "an event is not an object")
            if event.get("ph") != "X":
                continue
            ts, dur = event.get("ts"), event.get("dur")
            if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                problem = "has no timestamp" if ts is None else f"has timestamp {ts!r}"
                raise trace_error(file, f"traceEvents[{index}]", f"event {event.get('name')!r} {problem}",
                                  "a numeric ts in microseconds")
            ts = event["ts"] = ts - origin
            category = event.get("cat", "")
            if not isinstance(dur, (int, float)) or isinstance(dur, bool) or dur < 0:
                if category not in GPU_CATEGORIES:
                    self.undated.append((index, str(event.get("name", ""))))
                    continue
                raise _undated(file, index, event)
            checked_duration(dur * US, file, f"traceEvents[{index}]", str(event.get("name", "")))
            args = event.get("args") or {}
            name = str(event.get("name", ""))
            if category in GPU_CATEGORIES:
                self.gpu.append((index, event))
            elif category in RUNTIME_CATEGORIES and "correlation" in args:
                self.launches[args["correlation"]] = (ts, event.get("tid"))
                if name.startswith(("cudaEventRecord", "cudaStreamWaitEvent")):
                    self.stream_calls.append((ts, event.get("tid"), name, args["correlation"]))
            elif category == "cuda_sync":
                (self.waits if "wait_on_stream" in args else self.syncs).append(event)
            elif category == "user_annotation" and name.startswith("ProfilerStep#"):
                self.step_window = _later(self.step_window, ts, dur)
            elif category == "gpu_user_annotation" and name.startswith("ProfilerStep#"):
                self.gpu_steps[name] = min(self.gpu_steps.get(name, ts * US), ts * US)
            elif category == "cpu_op":
                self.cpu.append((index, event))
                self.cpu_spans.setdefault(event.get("tid"), []).append((ts, ts + dur, (index, event)))
                if event.get("name") == "record_param_comms":
                    self.comms.setdefault(event.get("tid"), []).append((ts, ts + dur, args))
        replayed = [index for index, _ in self.undated if not self.gpu and events[index].get("cat") == "cpu_op"]
        if replayed:
            raise _undated(file, replayed[0], events[replayed[0]])

    @property
    def marked(self) -> bool:
        """Whether the trace marks its profiled steps (a ProfilerStep#N annotation, on the host or the GPU)."""
        return self.step_window is not None or bool(self.gpu_steps)

    @property
    def gpu_step_start(self) -> float | None:
        """When the last step the GPU rows mark begins (s): the earliest of its `gpu_user_annotation`s, which
        Kineto writes one per stream. Only the start tells: Kineto stretches such an annotation over the kernels
        that the host's ProfilerStep range launches itself: not the backward pass's (autograd's thread launches
        them) nor those under a nested annotation (the optimizer's Optimizer.step), which end after it."""
        return max(self.gpu_steps.values(), default=None)

    def gpu_ops(self) -> tuple[list[TracedOp], list[tuple[int, str]]]:
        """GPU ops per stream in start order, cross-stream waits as dependencies, NCCL kernels as collectives
        and transfers; a GEMM kernel with the shape of the matrix multiply that launched it, an attention kernel
        with the key length of the attention op that launched it (launchers.py)."""
        comms = {tid: Spans(spans) for tid, spans in self.comms.items()}
        launched: dict[object, list[float]] = {}
        for _, event in self.gpu:
            launch = self.launches.get((event.get("args") or {}).get("correlation"))
            if launch is not None:
                launched.setdefault(launch[1], []).append(launch[0])
        cpu = {tid: Spans(spans, gemm_depth) for tid, spans in self.cpu_spans.items()}
        launchers = GemmLaunchers(cpu, launched)
        ordered = sorted(self._in_step(self.gpu), key=lambda item: (item[1]["ts"], item[0]))
        ops: list[TracedOp] = []
        unknown: list[tuple[int, str]] = []
        by_stream: dict[str, list[int]] = {}
        for index, event in ordered:
            args = event.get("args") or {}
            stream = cuda_stream(args.get("stream", event.get("tid", 0)))
            name = str(event.get("name", ""))
            nccl = name.lower().startswith("nccl")
            op = self._communication(index, event, args, name, stream, comms) if nccl else None
            if op is None:
                kind = kernel_kind(name)
                if event.get("cat") == "kernel" and not nccl and not kind:
                    unknown.append((index, name))
                launch = self.launches.get(args.get("correlation"))
                fields = launchers.fields(launch, name) if kind == "matmul" else \
                    {"key_length": key_length(cpu, launch)} if kind == "attention" else {}
                op = TracedOp(index, name, stream, "compute", event["ts"] * US, event["dur"] * US, **fields)
            by_stream.setdefault(stream, []).append(len(ops))
            ops.append(op)
        low, high = self.step_window or (float("-inf"), float("inf"))
        self.lost_shapes = launchers.lost(lambda ts: low <= ts * US <= high)
        self.repeated_gemms = launchers.repeated
        return self._with_waits(ops, by_stream, ordered), unknown

    def _in_step(self, gpu: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
        """The GPU ops of the profiled step: those launched inside the last ProfilerStep annotation where the
        trace marks steps (a profile of several steps replays its last), ops without a recorded launch by their
        start from the annotation's; in a GPU-only export (no host annotation) those that start once the last
        ProfilerStep annotation of the GPU rows begins (gpu_step_start); all of them where no step is marked or
        none was launched inside it."""
        if self.step_window is None:
            if self.gpu_step_start is None:
                return gpu
            first = self.gpu_step_start
            return [(index, event) for index, event in gpu if first <= event["ts"] * US] or gpu
        low, high = self.step_window
        kept = []
        for index, event in gpu:
            launch = self.launches.get((event.get("args") or {}).get("correlation"))
            if low <= launch[0] * US <= high if launch is not None else low <= event["ts"] * US:
                kept.append((index, event))
        return kept or gpu

    def _communication(self, index: int, event: dict, args: dict, name: str, stream: str,
                       comms: dict[object, Spans[dict]]) -> TracedOp | None:
        """An NCCL kernel as a collective, or as a send or receive where the trace tells its peer; None for a
        point-to-point kernel whose peer it does not tell (replayed as traced compute, listed in
        ``untold_peers``)."""
        where = f"traceEvents[{index}]"
        info = args if "Collective name" in args else enclosing(comms, self.launches.get(args.get("correlation")))
        primitive, dtype = _from_kernel_name(name)
        if info is not None:
            primitive = self._annotated(info, primitive, name, where)
            dtype = str(info.get("dtype", dtype)).lower()
        if primitive == "send_recv":
            transfer = self._transfer(index, event, name, stream, info, dtype)
            if transfer is None:
                told = P2P_KINDS.get(str(info.get("Collective name", "")).lower(), "") if info is not None else ""
                named = str(info.get("Process Group Name", "")) if info is not None else ""
                self.untold_peers.append((index, name, told, named))
            return transfer
        if not primitive:
            raise trace_error(self.file, where, f"NCCL kernel {name!r}: cannot tell which collective it runs",
                              f"a kernel name with a word of {', '.join(KERNEL_PRIMITIVES)} "
                              "(ncclDevKernel_AllReduce_Sum_bf16_RING_LL), or a record_param_comms annotation")
        if info is None:
            raise trace_error(self.file, where, f"NCCL kernel {name!r} has no message size",
                              "kernel args or a record_param_comms op with 'In msg nelems'")
        group, inferred = self._group(info)
        stated, description = self._stated(group, info)
        members = self._members_of(stated, info, where, name)
        size = _whole(info.get("Group size")) or len(members)
        nbytes = self._message_bytes(info, primitive, dtype, name, where)
        shares = self._shares(info, nbytes, size, name, where) if primitive == "all_to_all" else _Shares()
        return TracedOp(index, name, stream, "collective", event["ts"] * US, event["dur"] * US,
                        op=primitive, nbytes=nbytes, group=group, members=members, group_size=size,
                        size_field="Group size",
                        description=description, group_inferred=inferred, seq=_sequence(info),
                        uneven=shares.uneven, sends=shares.sends, receives=shares.receives)

    def _annotated(self, info: dict, primitive: Primitive | Literal[""], name: str,
                   where: str) -> Primitive | Literal[""]:
        """The primitive that an NCCL kernel's annotation names (`Collective name`), else the kernel name's: a
        name outside COLLECTIVE_NAMES (PyTorch's `coalesced` for a batch of collectives) is the kernel's
        collective, unless it is one of MISREAD_COLLECTIVES or the kernel name tells none, which are refused."""
        collective = info.get("Collective name")
        if collective in (None, ""):
            return primitive
        known = COLLECTIVE_NAMES.get(str(collective).lower())
        if known is not None:
            return known
        if not primitive or str(collective).lower() in MISREAD_COLLECTIVES:
            raise trace_error(self.file, where, f"NCCL kernel {name!r} runs collective {collective!r}, which trainsim "
                              "does not model", ", ".join(COLLECTIVE_NAMES))
        return primitive

    def _shares(self, info: dict, nbytes: float, size: int, name: str, where: str) -> _Shares:
        """An all-to-all's bytes to and from each member, in group order, from its `In split size` and `Out split
        size` (PyTorch's text of a list, "[]" where a side splits evenly, shortened with "..." beyond 30 members).
        all_to_allv's splits count rows of its tensors, the list form all_to_all's elements: either way a share
        is its split times the input's row (`In msg nelems` over the input's splits, else `Out msg nelems` over
        the output's) of ``nbytes`` / `In msg nelems` bytes an element; an even side is its message over the
        members. Where neither side is listed, or a list is shortened, the shares are not told (even)."""
        lists = []
        for field in ("In split size", "Out split size"):
            shown = _shown_numbers(info.get(field))
            if shown is None or (shown[0] and not shown[2] and size and len(shown[0]) != size):
                raise trace_error(self.file, where, f"{field} {info.get(field)!r} of {name!r} is not a count per "
                                  f"member of its group of {size}", f"{size} whole numbers such as [4, 0, 2, 2], "
                                  "or [] (an even split)")
            lists.append(shown)
        uneven = any(len(set(head + tail)) > 1 for head, tail, _ in lists)
        (sent, _, cut_in), (received, _, cut_out) = lists
        if cut_in or cut_out or not (sent or received):
            return _Shares(uneven=uneven)
        members = len(sent or received)
        in_elements = float(info["In msg nelems"])
        out_elements = _message_count(info.get("Out msg nelems"), in_elements)
        element = nbytes / in_elements if in_elements else 0.0
        rows, nelems = (sent, in_elements) if sent else (received, out_elements)
        row = element * nelems / sum(rows) if sum(rows) else 0.0
        return _Shares(tuple(share * row for share in sent) if sent else (nbytes / members,) * members,
                       tuple(share * row for share in received) if received
                       else (element * out_elements / members,) * members, uneven)

    def _transfer(self, index: int, event: dict, name: str, stream: str, info: dict | None,
                  dtype: str) -> TracedOp | None:
        """An NCCL send or receive kernel as a transfer to or from its peer, None where the trace does not tell
        the direction and the peer. The direction is the `Collective name` (send, recv); the peer the global
        `Dst Rank` of a send or `Src Rank` of a receive (recent PyTorch), else `Rank` (the peer's rank in the
        process group, as older versions write it) through the group's members, else, in a group of two ranks,
        its other member (peer -1 and the group's members until the file's rank is known: with_group_peers). A
        kernel that no single send or recv annotates (batch_isend_irecv may fuse several into one launch) stays
        traced compute."""
        kind = P2P_KINDS.get(str(info.get("Collective name", "")).lower()) if info is not None else None
        if info is None or kind is None:
            return None
        where = f"traceEvents[{index}]"
        group, inferred = self._group(info)
        stated, description = self._stated(group, info)
        peer = _whole(info.get("Dst Rank" if kind == "send" else "Src Rank"))
        pair: tuple[int, ...] = ()
        if peer is None:
            members = self._members_of(stated, info, where, name)
            in_group = _whole(info.get("Rank"))
            peer = members[in_group] if in_group is not None and in_group < len(members) else None
            pair = members if peer is None and len(set(members)) == 2 else ()
        if peer is None and not pair:
            return None
        return TracedOp(index, name, stream, kind, event["ts"] * US, event["dur"] * US, op="send_recv",
                        nbytes=self._message_bytes(info, "send_recv", dtype, name, where), group=group,
                        description=description, group_inferred=inferred, peer=-1 if peer is None else peer,
                        members=pair)

    def _group(self, info: dict) -> tuple[str, bool]:
        """An NCCL kernel's process group and whether it is inferred: its annotation's `Process Group Name`; else
        the only group of `pg_config` (the rank's groups: a rank of one group communicates in it), inferred;
        else '' (groups.py settles it from the other traces or refuses)."""
        named = str(info.get("Process Group Name", ""))
        return named or self.only, not named and bool(self.only)

    def _stated(self, group: str, info: dict) -> tuple[ProcessGroup | None, str]:
        """The process group the trace states under the name ``group`` (None if it states none), and the
        description of an NCCL kernel's group: its annotation's (``info``), else the stated group's."""
        stated = self.groups.get(group)
        return stated, str(info.get("Process Group Description", stated.description if stated is not None else ""))

    def _members_of(self, stated: ProcessGroup | None, info: dict, where: str, name: str) -> tuple[int, ...]:
        """The members of an NCCL kernel's group: the ``stated`` group's, else those its annotation ``info``
        lists (`_members`)."""
        return stated.members if stated is not None else _members(info, self.file, where, name)

    def _message_bytes(self, info: dict, primitive: Primitive, dtype: str, name: str, where: str) -> float:
        """Bytes per rank in the nccl-tests convention: `Out msg nelems` of an all-gather, else `In msg nelems`,
        times the element size of ``dtype``."""
        if "In msg nelems" not in info:
            raise trace_error(self.file, where, f"NCCL kernel {name!r} has no message size",
                              "kernel args or a record_param_comms op with 'In msg nelems'")
        element = DTYPE_BYTES.get(dtype.lower())
        if element is None:
            raise trace_error(self.file, where, f"unknown data type {dtype!r} of {name!r}", ", ".join(DTYPE_BYTES))
        field = "Out msg nelems" if primitive == "all_gather" else "In msg nelems"
        count = info.get(field)
        if (not isinstance(count, (int, float)) or isinstance(count, bool) or count < 0
                or (isinstance(count, float) and not count.is_integer())):
            raise trace_error(self.file, where, f"message size {field!r} {count!r} of {name!r} is not a count of "
                              "elements", "a whole number of elements >= 0, e.g. 16777216")
        return checked_message(float(count) * element, self.file, where, name)

    def _with_waits(self, ops: list[TracedOp], by_stream: dict[str, list[int]],
                    ordered: list[tuple[int, dict]]) -> list[TracedOp]:
        """Add each stream-wait's dependency to the first op of the waiting stream that starts after it, and
        each host synchronisation's (Stream, Event or Context Sync: the host blocks until the GPU work is done)
        to the first op of each stream that the blocked thread launches after it returns, on the last op to end
        by then on the synchronised stream (every stream but for a Stream Sync). A wait the trace records with no
        stream waited on (-1 or no stream id), or every wait of a trace with no Stream Wait Event, comes from the
        host's calls (_HostWaits); one naming a stream with no op in the step adds none. ``unordered_streams`` is
        set where two or more streams are left with no dependency at all: a single one, a wait's or a host
        synchronisation's, clears it.
        A stream runs its kernels in launch order, so starts, ends and launch times grow along each stream."""
        launches = [self.launches.get((event.get("args") or {}).get("correlation"), (float("-inf"), None))
                    for _, event in ordered]
        starts = {stream: [ops[i].start_s for i in members] for stream, members in by_stream.items()}
        ends = {stream: [ops[i].end_s for i in members] for stream, members in by_stream.items()}
        launched = {stream: [launches[i][0] for i in members] for stream, members in by_stream.items()}
        extra: dict[int, list[int]] = {}
        for event in self.syncs:
            args = event.get("args") or {}
            returned = event["ts"] + event["dur"]
            call = self.launches.get(args.get("correlation"))
            synced = cuda_stream(args.get("stream"))
            sources = [synced] if event.get("name") == "Stream Sync" and synced in by_stream else list(by_stream)
            for stream, members in by_stream.items():
                first = bisect.bisect_left(launched[stream], returned)
                if first == len(members) or (call is not None and launches[members[first]][1] != call[1]):
                    continue
                for source in sources:
                    before = bisect.bisect_right(ends[source], returned * US) - 1
                    if source != stream and before >= 0:
                        extra.setdefault(members[first], []).append(by_stream[source][before])
        untold: dict[object, str] = {}
        for event in self.waits:
            args = event.get("args") or {}
            waiting, source = cuda_stream(args.get("stream", event.get("tid"))), cuda_stream(args["wait_on_stream"])
            ts = event["ts"] * US
            if _whole(args["wait_on_stream"]) is None:
                untold[args.get("correlation")] = waiting
            if waiting not in by_stream or source not in by_stream:
                continue
            target = bisect.bisect_left(starts[waiting], ts)
            record = self.launches.get(args.get("wait_on_cuda_event_record_corr_id"))
            if record is not None:
                before = bisect.bisect_right(launched[source], record[0]) - 1
            else:
                before = bisect.bisect_right(ends[source], ts + WAIT_ROUNDING_S) - 1
            if target < len(by_stream[waiting]) and before >= 0:
                extra.setdefault(by_stream[waiting][target], []).append(by_stream[source][before])
        host_waits = _HostWaits(self.stream_calls, [(launch[0], launch[1], ops[i].stream)
                                                    for i, launch in enumerate(launches)])
        for ts, tid, name, correlation in self.stream_calls:
            if name.startswith("cudaStreamWaitEvent") and (correlation in untold or not self.waits):
                wait = host_waits.dependency(ts, tid, untold.get(correlation, ""), by_stream.keys())
                if wait is not None:
                    waiting, source, recorded = wait
                    target = bisect.bisect_left(launched[waiting], ts)
                    before = bisect.bisect_right(launched[source], recorded) - 1
                    if target < len(by_stream[waiting]) and before >= 0:
                        extra.setdefault(by_stream[waiting][target], []).append(by_stream[source][before])
        self.unordered_streams = len(by_stream) if len(by_stream) > 1 and not extra else 0
        return [op if i not in extra else _replace_deps(op, extra[i]) for i, op in enumerate(ops)]

    def cpu_ops(self) -> list[TracedOp]:
        """Outermost CPU ops per thread, in start order, within the profiled step (the last ProfilerStep
        annotation) where one is marked: a trace with no GPU activity runs on the host (TracedOp.host)."""
        ops: list[TracedOp] = []
        ends: dict[object, float] = {}
        low, high = self.step_window or (float("-inf"), float("inf"))
        for index, event in sorted(self.cpu, key=lambda item: (item[1]["ts"], -item[1]["dur"], item[0])):
            tid = event.get("tid", 0)
            ts, dur = event["ts"], event["dur"]
            if ts < ends.get(tid, float("-inf")) or not low <= ts * US <= high:
                continue
            ends[tid] = ts + dur
            ops.append(TracedOp(index, str(event.get("name", "")), f"cpu thread {tid}", "compute", ts * US, dur * US,
                                host=True, **gemm_fields(event)))
        return ops


class _HostWaits:
    """Cross-stream waits rebuilt from the host's CUDA calls, for a trace that records no `cuda_sync` Stream Wait
    Event or one whose streams it leaves untold (-1): Kineto before pytorch#119478 and on CUDA 12.9+ before
    kineto#1552. The runtime calls name no stream, so the host's order tells them: a cudaEventRecord records on
    the stream of the latest kernel launched before it (PyTorch records an event right after the work it
    marks), and a cudaStreamWaitEvent makes the stream of the next kernel its thread launches wait for the
    latest event recorded before it on another stream. Kineto before kineto#808 (September 2023) left the
    cudaEventRecord calls out of its runtime events, so a profile that old has waits but no records, and
    nothing is rebuilt."""

    def __init__(self, calls: list[tuple[float, object, str, object]],
                 launches: list[tuple[float, object, str]]):
        ordered = sorted((ts, stream) for ts, _, stream in launches if ts != float("-inf"))
        self.times = [ts for ts, _ in ordered]
        self.streams = [stream for _, stream in ordered]
        threads: dict[object, list[tuple[float, str]]] = {}
        for ts, tid, stream in sorted(launches, key=lambda launch: launch[0]):
            threads.setdefault(tid, []).append((ts, stream))
        self.threads = {tid: ([ts for ts, _ in items], [stream for _, stream in items])
                        for tid, items in threads.items()}
        self.records = sorted((ts, self._stream_before(ts)) for ts, _, name, _ in calls
                              if name.startswith("cudaEventRecord"))
        self.record_times = [ts for ts, _ in self.records]

    def _stream_before(self, ts: float) -> str:
        """The stream of the latest kernel launched before host time ``ts`` ('' where none was)."""
        before = bisect.bisect_left(self.times, ts) - 1
        return self.streams[before] if before >= 0 else ""

    def dependency(self, ts: float, tid: object, waiting: str,
                   streams: Collection[str]) -> tuple[str, str, float] | None:
        """(waiting stream, source stream, host time of the event's record) of the cudaStreamWaitEvent at host
        time ``ts`` on thread ``tid``; ``waiting`` where the trace tells it, else the stream of the thread's next
        launch. None where no launch or no record on another stream tells them. The walk back passes over
        records on the waiting stream itself for an older one on another stream: where the event waited for is
        not the latest recorded on another stream (one recorded long before, or the passed-over one), the
        dependency falls on other work than the job waited for."""
        if waiting not in streams:
            times, launched = self.threads.get(tid, ([], []))
            after = bisect.bisect_right(times, ts)
            if after == len(times):
                return None
            waiting = launched[after]
        for record in range(bisect.bisect_left(self.record_times, ts) - 1, -1, -1):
            recorded, source = self.records[record]
            if source and source != waiting:
                return waiting, source, recorded
        return None


def _later(window: tuple[float, float] | None, ts: float, dur: float) -> tuple[float, float]:
    """The later of a step ``window`` (seconds) and the annotation at ``ts`` lasting ``dur`` (microseconds)."""
    return window if window is not None and ts * US < window[0] else (ts * US, (ts + dur) * US)


def _undated(file: str, index: int, event: dict) -> TraceError:
    """The refusal of a replayed event without a valid duration."""
    dur = event.get("dur")
    problem = "has no duration (dur)" if dur is None else f"has duration {dur!r}"
    return trace_error(file, f"traceEvents[{index}]", f"event {event.get('name')!r} {problem}",
                       "a duration >= 0 microseconds: a complete event (ph X) carries its dur")


def _origin_us(events: list) -> int:
    """The whole microsecond of the trace's first timestamp, which every timestamp is taken from while still in
    microseconds: a timestamp since the epoch (16 digits) scaled to seconds first resolves only ~0.24 us, and
    kernels back to back read as overlaps or host gaps of that size."""
    stamps = [event["ts"] for event in events if isinstance(event, dict) and event.get("ph") == "X"
              and isinstance(event.get("ts"), (int, float)) and not isinstance(event.get("ts"), bool)
              and math.isfinite(event["ts"])]
    return math.floor(min(stamps)) if stamps else 0


def _replace_deps(op: TracedOp, deps: list[int]) -> TracedOp:
    return replace(op, deps=tuple(sorted(set(op.deps) | set(deps))))


@lru_cache(maxsize=4096)
def _from_kernel_name(name: str) -> tuple[Primitive | Literal[""], str]:
    """(primitive, dtype) from an NCCL kernel name such as ncclDevKernel_AllReduce_Sum_bf16_RING_LL; "" where
    the name tells neither."""
    words = [word.lower() for word in re.split(r"[_\W]+", name)]
    primitive: Primitive | Literal[""] = next((KERNEL_PRIMITIVES[word] for word in words if word in KERNEL_PRIMITIVES),
                                              "")
    dtype = next((word for word in words if word in DTYPE_BYTES), "")
    return primitive, dtype


def _members(info: dict, file: str, where: str, name: str) -> tuple[int, ...]:
    """A collective's process-group ranks, () when the trace does not tell them. PyTorch writes `Process Group
    Ranks` as the text of a list and shortens a group of more than 30 ranks with '...' ("[0, 1, ..., 28, ...,
    63]", or in older versions "[0, ..., 29, ...]"); older versions write no list at all. The members then come
    from `Group size` and the group's stride (`Global rank start` and `Global rank stride`, else the shown
    ranks'), which the shown ranks must follow. A complete list must have `Group size` ranks where that is given.

    The ranks the profiler leaves out cannot be read, only vouched for: PyTorch writes a `Global rank stride` of
    -1 for a group whose ranks follow no single stride, so such a group shortened is refused, and a shortened
    list must leave out at least one of its `Group size` ranks."""
    value = info.get("Process Group Ranks")
    shown = _shown_numbers(value)
    if shown is None:
        raise trace_error(file, where, f"process group ranks {value!r} of {name!r} are not rank numbers",
                          "a list of ranks such as [0, 1] or its text \"[0, 1]\"")
    head, tail, shortened = shown
    size = _whole(info.get("Group size"))
    if head and not shortened:
        if size is not None and size != len(head):
            raise trace_error(file, where, f"process group ranks {value!r} of {name!r} list {len(head)} ranks but "
                              f"its Group size is {size}", "as many ranks as the Group size")
        return head
    start = _whole(info.get("Global rank start"))
    stride = _whole(info.get("Global rank stride"))
    if start is None and head:
        start = head[0]
    if shortened and info.get("Global rank stride") in (-1, "-1"):
        raise trace_error(file, where, f"process group ranks {value!r} of {name!r} are shortened by the profiler "
                          "and follow no single stride (Global rank stride -1), so the ranks left out are unknown",
                          "a group of at most 30 ranks, or a strided group (as every group of a device mesh)")
    if shortened and size is not None and size <= len(head) + len(tail):
        raise trace_error(file, where, f"process group ranks {value!r} of {name!r} are marked shortened but show "
                          f"{len(head) + len(tail)} ranks of a group of {size} (Group size)",
                          "a shortened list leaves out some of the group's ranks")
    if stride is None and len(head) > 1:
        stride = head[1] - head[0]
    members: tuple[int, ...] = ()
    if size is not None and start is not None and stride is not None and stride > 0:
        members = tuple(range(start, start + stride * size, stride))
    if shortened and (not members or members[:len(head)] != head or (tail and members[-len(tail):] != tail)):
        unknown = ("no Group size says how many members it has" if size is None
                   else f"its {size} members (Group size) do not follow one stride, so the others are unknown")
        raise trace_error(file, where, f"process group ranks {value!r} of {name!r} are shortened by the profiler "
                          f"and {unknown}", "a group of at most 30 ranks, or a strided group (as every group of a "
                          "device mesh) with its Group size")
    return members


def _shown_numbers(value: object) -> tuple[tuple[int, ...], tuple[int, ...], bool] | None:
    """The numbers a list the profiler writes shows (`Process Group Ranks`, `In split size`: whole numbers, the
    text of a list or a list), as (before the first '...', after the last one, whether it is shortened);
    ((), (), False) when not given, None when they are not whole numbers."""
    if value is None:
        return (), (), False
    if isinstance(value, str):
        words = [word.strip() for word in value.strip().strip("[]").split(",") if word.strip()]
        if not all(word == "..." or word.isdigit() for word in words):
            return None
        parts = "|".join(words).split("...")
        head, tail = (tuple(int(rank) for rank in part.split("|") if rank) for part in (parts[0], parts[-1]))
        return head, tail if len(parts) > 1 else (), len(parts) > 1
    if isinstance(value, list) and all(isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0
                                       for rank in value):
        return tuple(value), (), False
    return None


def _message_count(value: object, default: float) -> float:
    """A message's element count (`Out msg nelems`), ``default`` where the args do not give one."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else default


def _sequence(info: dict) -> int:
    """A collective's `Seq` (PyTorch's count of the process group's collectives on this rank, which every member
    keeps alike), -1 where the trace has none."""
    seq = _whole(info.get("Seq"))
    return -1 if seq is None else seq


class _Shares(NamedTuple):
    """What a rank's trace tells of an all-to-all's shares: the bytes it sends each member and receives from
    each, in group order (() where not told), and whether they differ (as far as shortened lists show)."""

    sends: tuple[float, ...] = ()
    receives: tuple[float, ...] = ()
    uneven: bool = False


def _whole(value: object) -> int | None:
    """A whole number >= 0 of the trace's args (a JSON number or its text), None when absent or not one."""
    try:
        number = as_int(value)
    except ValueError:
        return None
    return number if number >= 0 else None
