"""Traced ranks into a step program: compute replayed with its traced durations (scaled by the what-if
knobs), collectives and point-to-point transfers re-costed on the cluster, idle time that no dependency
explains kept as host time.

Ranks: a rank's number comes from its trace (`distributedInfo.rank`) or from the order of the files (names
sorted with their numbers compared as numbers); the job's size is what the traces state (`world_size`, Chakra's
default group), else the highest rank they name plus one, and files must agree on it. A process group's members
come from the trace where it lists them (Kineto's `pg_config` or `Process Group Ranks`, Chakra's process-group
metadata), otherwise they are the ranks whose traces use the group (with a warning where they are fewer than
the job's ranks and no trace gives the group's size). Members without a trace are not simulated:
like folded ranks, the rendezvous does not wait for them, but the collective's transfers still run over every
member. Collectives match across ranks by
group and sequence number where the trace records them (PyTorch's `Seq`), else by group and issue order (as
NCCL's communicators run them); transfers by their two ranks, process group and order (PyTorch's
ProcessGroupNCCL ignores tags; NCCL pairs a communicator's sends and receives in order), their sizes must agree.
A rank's sends to one peer over one process group that no recorded stream orders (Chakra's, on ASYNC_STREAMS)
leave in issue order, each after the one before (program/send_order.py), as the modelled pipeline's do; a
Kineto send keeps its recorded stream, which orders it as the job ran. Each collective counts as its group's
parallel dimension (layout.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from glob import has_magic
from pathlib import Path
from typing import NamedTuple

from simulator.catalog.gpus import GPUSpec, catalog_gpu_of, get_gpu
from simulator.collectives.names import Primitive
from simulator.config.traces import TraceWorkload
from simulator.config.training_options import MathPrecision
from simulator.errors import ScenarioError
from simulator.program.ops import HOST_CATEGORY, Category, CollectiveOp, ComputeOp, Op
from simulator.program.send_order import SendOrder
from simulator.program.step import StepProgram
from simulator.program.unfolding import Unfolding, UnfoldingGuard
from simulator.topology.graph import Topology
from simulator.units import counted
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.roofline import kernel_duration
from simulator.workload.traces.chakra import P2P_STREAM, read_chakra
from simulator.workload.traces.exchanges import TracedShares, pair_bytes
from simulator.workload.traces.gpu_move import PEAK_PRECISION, GpuMove, told_precision
from simulator.workload.traces.groups import settled_groups
from simulator.workload.traces.kineto import read_kineto
from simulator.workload.traces.layout import Dimensions, TracedSizes, Transfer, dimensions
from simulator.workload.traces.model import (
    ProcessGroup,
    TracedOp,
    TracedRank,
    trace_error,
    with_group_peers,
)
from simulator.workload.training import PRECISION_BYTES
from simulator.workload.transformer import Kernel

READERS: dict[str, Callable[[Path], TracedRank]] = {"kineto": read_kineto, "chakra-json": read_chakra}
ASYNC_STREAMS = frozenset({P2P_STREAM})
"""The replayed program's asynchronous streams (every op its own stream): Chakra's sends and receives, which run
as soon as their dependencies are done."""
STREAM_OVERLAP_JITTER_S = 1e-6
"""How far a kernel may start before the one ahead of it on its CUDA stream ends with no warning: Kineto writes
timestamps and durations in microseconds (older versions as whole numbers, each rounded on its own), so two
kernels back to back can seem to overlap by up to 1 us (pytorch/kineto#136 shows such overlaps); a stream runs
its kernels one after another, so a longer overlap is a trace the replay cannot reproduce as it is."""
TIMESTAMP_ROUNDING_S = 0.5e-9
"""Idle time below half of Kineto's timestamp resolution (1 ns) is the rounding of microsecond floats
(3720e-6 - (1020e-6 + 2700e-6) is not 0), not host time."""


def trace_files(pattern: str, base_dir: Path) -> list[Path]:
    """The files of ``pattern`` (relative to the scenario's folder), numbers in names compared as numbers, found
    by their paths as given (`..` after a symlinked folder is the link target's parent) and named normalised
    (`../s/../wt/x` is `../wt/x`) in errors and warnings where that is the same file (_named)."""
    path = Path(pattern) if Path(pattern).is_absolute() else base_dir / pattern
    if has_magic(str(path)):
        files = [match for match in path.parent.glob(path.name) if match.is_file()]
    else:
        files = [path] if path.is_file() else []
    if path.is_dir():
        raise ScenarioError(f"{pattern!r} is a folder", field="workload.trace",
                            allowed=f"its files, one per rank: {str(Path(pattern) / '*.json')!r}")
    if not files:
        raise ScenarioError(f"no trace file matches {pattern!r}", field="workload.trace",
                            allowed="a file or a glob, relative to the scenario's folder")
    return sorted(map(_named, files), key=lambda file: [int(part) if part.isdigit() else part
                                                        for part in re.split(r"(\d+)", file.name)])


def _named(file: Path) -> Path:
    """``file`` by its normalised path where that is the same file, else as it is (`lnk/..` after a symlink)."""
    normal = Path(os.path.normpath(file))
    return normal if normal.is_file() and os.path.samefile(normal, file) else file


def read_traces(config: TraceWorkload, base_dir: Path) -> list[TracedRank]:
    """Every rank's trace, each with its rank number (from the trace, else the file order)."""
    traced = [READERS[config.format](file) for file in trace_files(config.trace, base_dir)]
    if all(rank.rank >= 0 for rank in traced):
        claimed: dict[int, TracedRank] = {}
        for rank in traced:
            first = claimed.setdefault(rank.rank, rank)
            if first is not rank:
                raise trace_error(rank.file, "distributedInfo.rank", f"the file states rank {rank.rank}, as "
                                  f"{first.file} does", "one file per rank")
        return [with_group_peers(rank) for rank in sorted(traced, key=lambda rank: rank.rank)]
    unstated = next(rank for rank in traced if rank.rank < 0)
    for index, rank in enumerate(traced):
        if 0 <= rank.rank != index:
            raise trace_error(rank.file, "distributedInfo.rank", f"the file states rank {rank.rank}, but "
                              f"{unstated.file} states none, so ranks are the files' order, which makes this one "
                              f"rank {index}", "every file stating its rank (distributedInfo.rank), or none")
    return [with_group_peers(replace(rank, rank=index, ordered=True)) for index, rank in enumerate(traced)]


def trace_program(config: TraceWorkload, traced: list[TracedRank], topology: Topology, *,
                  fold: bool, guard: UnfoldingGuard | None = None) -> StepProgram:
    """The step program of the traced ranks on ``topology``, with the knobs of ``config``; folded where
    ``fold`` asks for it: only the traced ranks simulated, the copies that `workload.dp` adds mirrored on their
    ops, unless a copy's own traffic may meet the cluster unlike (_copies_unlike; ``guard`` hears why before the
    program is built unfolded)."""
    traced, settled = settled_groups(traced)
    world = traced_world = _world(traced)
    stated = _stated_groups(traced)
    members = _group_members(traced)
    traced = [_gathered(rank, members) for rank in traced]
    assumed = _assumed_members(traced, members, world)
    descriptions = {op.group: op.description for rank in traced for op in rank.ops if op.description}
    used = {group: ProcessGroup(descriptions.get(group, ""), ranks) for group, ranks in members.items()}
    transfers = [_transfer(rank.rank, op) for rank in traced for op in rank.ops if op.kind in ("send", "recv")]
    kinds = dimensions(used, world, transfers,
                       TracedSizes(config.traced_tp, config.traced_pp, config.traced_cp, config.traced_ep),
                       {name: group for name, group in stated.items() if name not in used}, _all_to_alls(traced))
    exchanging, group_descriptions = frozenset(_all_to_alls(traced)), {group: used[group].description
                                                                       for group in members}
    replicas = _replicas(config.dp, members, kinds, world, exchanging, group_descriptions)
    traced_dp = _traced_dp(members, kinds, world, exchanging, group_descriptions)
    groups = replicas.members(members)
    world = replicas.world
    if world > topology.num_gpus:
        job = f"dp {config.dp} gives {world} ranks" if config.dp else f"the traced job spans {world} ranks"
        plural = "s" if topology.num_gpus > 1 else ""
        raise ScenarioError(f"{job}; the cluster has only {topology.num_gpus} GPU{plural}",
                            field="workload.dp" if config.dp else "workload.trace",
                            allowed=f"a cluster of at least {world} GPUs")
    blocker = _copies_unlike(topology, replicas, members, transfers) if fold and replicas.copies > 1 else ""
    if blocker and guard is not None:
        guard(Unfolding("copies", blocker))
    fold = fold and not blocker
    gpu = get_gpu(topology.gpu_model)
    move = GpuMove(config.compute_scale, None if config.traced_gpu is None
                   else get_gpu(config.traced_gpu, where="workload.traced_gpu"), gpu)
    by_rank = {rank.rank: rank for rank in traced}
    simulated = sorted(by_rank) if fold or config.dp is None else list(range(world))
    sequenced = _sequenced(traced)
    builder = _Builder(groups, kinds, replicas, fold, sequenced, move, config.host_gaps,
                       gpu if config.recost_gemms else None)
    for rank in simulated:
        source = by_rank.get(rank % traced_world)
        if source is not None:
            builder.add_rank(rank, source)
    missing, missing_ranks = _missing_ranks(traced, members, traced_world)
    untraced = builder.check_transfers_matched(missing_ranks)
    builder.check_collectives_matched()
    builder.settle_exchanges()
    warnings = tuple(f"{rank.file}: {rank.events_field}[{rank.unknown[0][0]}]: "
                     f"{counted(len(rank.unknown), 'kernel')} of "
                     f"unknown kind kept as compute (first: {rank.unknown[0][1]!r})" for rank in traced if rank.unknown)
    warnings += tuple(f"{rank.file}: {rank.events_field}[{rank.untold_peers[0][0]}]: {len(rank.untold_peers)} "
                      f"point-to-point kernel{'s' if len(rank.untold_peers) > 1 else ''} replayed at the traced "
                      f"duration, not re-costed: the trace does not tell the peer (first: {rank.untold_peers[0][1]!r})"
                      for rank in traced if rank.untold_peers)
    warnings += _reading_warnings(traced, config.host_gaps)
    warnings += _stream_overlap_warnings(traced, config.host_gaps)
    warnings += _gemm_warnings(traced, config)
    warnings += _device_warnings(traced, config, gpu.name)
    warnings += _renumbered_files(traced) + missing
    warnings += settled + assumed + untraced
    warnings += _idle_hosts_warning(topology, world, traced_world, traced_dp, config)
    warnings += _inferred_stages_warning(kinds, used)
    details = {"trace": {"format": config.format, "files": len(traced), "events": sum(r.events for r in traced),
                         "traced_ranks": [rank.rank for rank in traced],
                         "traced_step_time_s": max(rank.span_s() for rank in traced) if traced[0].timed else None,
                         "compute_scale": config.compute_scale, "dp": config.dp, "traced_dp": traced_dp,
                         "unknown_kernels": sum(len(rank.unknown) for rank in traced),
                         "recosted_gemms": builder.recosted,
                         "collective_matching": {group: "seq" if group in sequenced else "order"
                                                 for group in sorted(kinds.groups)},
                         **({"gpu_move": move.details(op for rank in traced for op in rank.ops
                                                      if op.op is None and not builder.recosts(op))}
                            if config.traced_gpu else {})},
               **({"fold_off_reason": blocker} if blocker else {})}
    ranks = tuple(rank for rank in simulated if rank in builder.ranks)
    tokens = (config.tokens_per_step or 0) * replicas.copies
    return StepProgram(ops=tuple(builder.ops), world=world, ranks=ranks,
                       tokens_per_step=tokens, model_flops_per_step=tokens * (config.model_flops_per_token or 0.0),
                       peak_flops=gpu.peak(PEAK_PRECISION),
                       async_streams=ASYNC_STREAMS, folded=len(ranks) < world, warnings=warnings,
                       details=details, fold_off_check="copies")


def _renumbered_files(traced: list[TracedRank]) -> tuple[str, ...]:
    """One line where ranks are the files' order and the files' names number them otherwise (rank0, rank1,
    rank3: the third file is rank 2): a file missing from the set, or numbered from 1, would shift the ranks
    after it without a word. A name's rank number is the one number in which the names differ, taken as one
    where they are distinct and below twice the files' count (not a process id or a time)."""
    numbers = [tuple(map(int, re.findall(r"\d+", Path(rank.file).name))) for rank in traced]
    if not traced[0].ordered or len(traced) < 2 or len({len(found) for found in numbers}) != 1:
        return ()
    varying = [place for place in range(len(numbers[0])) if len({found[place] for found in numbers}) > 1]
    if len(varying) != 1:
        return ()
    named = [found[varying[0]] for found in numbers]
    if len(set(named)) != len(named) or max(named) >= 2 * len(named):
        return ()
    shifted = [(rank, number) for rank, number in zip(traced, named, strict=True) if number != rank.rank]
    if not shifted:
        return ()
    shown = ", ".join(f"{Path(rank.file).name} is rank {rank.rank}" for rank, _ in shifted[:3])
    more = f" and {counted(len(shifted) - 3, 'other')}" if len(shifted) > 3 else ""
    return (f"{shifted[0][0].file}: the files state no rank, so ranks are their order from 0, which the numbers in "
            f"their names contradict: {shown}{more} (a file missing from workload.trace?)",)


def _missing_ranks(traced: list[TracedRank], members: dict[str, tuple[int, ...]],
                   world: int) -> tuple[tuple[str, ...], frozenset[int]]:
    """The lines where ranks of the job have no trace, and those ranks: one for the ranks between traced ones
    (files 0, 1 and 3 of a 4-rank job), which seem to be files missing from the set, and one for the others that
    a traced process group of two or more reaches (files 0-1 of a 4-rank job whose groups [0, 2] and [1, 3]
    reach 2 and 3, or rank 0's file alone of a 2-rank job: the profile of part of a larger job as often as a set
    missing its last files, so it guesses neither; a trace of part of a job is one rank or a run of them).
    Each line names those of its ranks that the traced process groups and transfers reach: the replay takes
    them as ready, which a user who forgot a file hears."""
    ranks = sorted(rank.rank for rank in traced)
    grouped = {member for group in members.values() if len(group) > 1 for member in group}
    edges = sorted(rank for rank in grouped if rank < ranks[0] or rank > ranks[-1])
    holes = sorted(set(range(ranks[0], ranks[-1] + 1)) - set(ranks))
    reached = {member for group in members.values() for member in group}
    reached |= {op.peer for rank in traced for op in rank.ops if op.kind in ("send", "recv")}

    def line(untraced: list[int], where: str) -> str:
        named = [rank for rank in untraced if rank in reached]
        reach = (f"the traced process groups or transfers reach rank{'s' if len(named) > 1 else ''} "
                 f"{_spans(named)}, taken as ready" if named else "no traced process group or transfer reaches them")
        traced_ranks = f"traced rank{'s' if len(ranks) > 1 else ''} {_spans(ranks)}"
        return (f"{traced[0].file}: rank{'s' if len(untraced) > 1 else ''} {_spans(untraced)} of the traced job's "
                f"{world} {'have' if len(untraced) > 1 else 'has'} no trace, {where} {traced_ranks}"
                f"{' (a file missing from workload.trace?)' if where == 'between' else ''}: {reach}")

    lines = (*((line(holes, "between"),) if holes else ()), *((line(edges, "beside"),) if edges else ()))
    return lines, frozenset(holes) | frozenset(edges)


def _stream_overlaps(rank: TracedRank) -> list[tuple[TracedOp, float]]:
    """The ops of a profiled rank that start more than STREAM_OVERLAP_JITTER_S before the op ahead of them on
    their stream ends (an asynchronous stream's ops, each a stream of its own, apart), each with by how much:
    compared in whole nanoseconds, Kineto's resolution, so an overlap of exactly 1 us in microsecond floats
    (1503e-6 - 1502e-6 is above 1e-6) is the rounding it is."""
    if not rank.timed:
        return []
    ends: dict[str, float] = {}
    overlapping = []
    for op in rank.ops:
        if op.stream in ASYNC_STREAMS:
            continue
        if op.stream in ends and round((ends[op.stream] - op.start_s) * 1e9) > round(STREAM_OVERLAP_JITTER_S * 1e9):
            overlapping.append((op, ends[op.stream] - op.start_s))
        ends[op.stream] = max(ends.get(op.stream, op.end_s), op.end_s)
    return overlapping


def _inferred_stages_warning(kinds: Dimensions, groups: Mapping[str, ProcessGroup]) -> tuple[str, ...]:
    """A warning where the traced job's pipeline stages are read from a point-to-point transfer, not declared
    by `workload.traced_pp` (layout.py): a data-parallel job that sends between ranks reads as a pipeline, and
    its gradients' all-reduce over both "stages" as `pp`; it names the groups counted as `pp`."""
    transfer = kinds.stages_from
    if transfer is None:
        return ()
    stages = kinds.sizes.pp or 1
    per_stage = abs(transfer.src - transfer.dst)
    pipelined = [name for name, kind in sorted(kinds.groups.items()) if kind == "pp"]
    as_pp = (f", so process group{'s' if len(pipelined) > 1 else ''} "
             + ", ".join(f"{name!r} ({counted(len(groups[name].members), 'rank')})" for name in pipelined)
             + f" count{'' if len(pipelined) > 1 else 's'} as pp") if pipelined else ""
    return (f"the traced job's pipeline stages are inferred from its transfer from rank {transfer.src} to rank "
            f"{transfer.dst}, not declared: {stages} stages of {counted(per_stage, 'rank')}{as_pp}; set "
            "workload.traced_pp to the traced job's stages (1 where it has no pipeline and the transfer is no "
            "pipeline hand-off)",)


def _idle_hosts_warning(topology: Topology, world: int, traced_world: int, traced_dp: int | None,
                        config: TraceWorkload) -> tuple[str, ...]:
    """A warning where the replay leaves whole hosts of the cluster idle (its ``world`` ranks on the first GPUs),
    with the `workload.dp` that replicates the traced job (of ``traced_world`` ranks, data parallelism
    ``traced_dp``) over the most of them; none where a host is partly used (a two-rank trace on one 8-GPU host)."""
    used_hosts = topology.gpu_host[world - 1] + 1
    idle = topology.num_hosts - used_hosts
    if idle < 1:
        return ()
    used = (f"the replay runs on {world} of the cluster's {topology.num_gpus} GPUs; "
            f"{idle} of its {topology.num_hosts} hosts idle")
    if traced_dp is None or traced_dp < 2:
        return (f"{used}: the traced job has no data parallelism for workload.dp to replicate, so its step is the "
                f"same on {used_hosts} host{'s' if used_hosts > 1 else ''}",)
    per_replica = traced_world // traced_dp
    dp = topology.num_gpus // per_replica // traced_dp * traced_dp
    if dp <= (config.dp or traced_dp):
        return ()
    return (f"{used}: workload.dp: {dp} replicates the traced job over {dp * per_replica} GPUs",)


def _reading_warnings(traced: list[TracedRank], host_gaps: bool) -> tuple[str, ...]:
    """One line each, at the first file concerned, for what the files leave the replay to assume: no marked
    step (all of a file is one step), streams that no recorded wait orders (each keeps its traced idle time,
    or none), events left out for want of a duration (not replayed ops)."""
    warnings = []
    stepless = [rank for rank in traced if rank.stepless]
    if stepless:
        warnings.append(f"{stepless[0].file}: traceEvents: no ProfilerStep#N annotation marks a profiled step in "
                        f"{counted(len(stepless), 'file')} of the trace: each is replayed whole as one step (a "
                        "profile of several steps needs torch.profiler's schedule and prof.step())")
    unordered = [rank for rank in traced if rank.unordered_streams]
    if unordered:
        kept = ("each stream keeps its traced idle time as host time, so the step cannot shrink below the traced "
                "waits and re-costed collectives hardly move it" if host_gaps
                else "with host_gaps false the streams run unordered, a collective before the work it waits for")
        warnings.append(f"{unordered[0].file}: traceEvents: the GPU work runs on "
                        f"{unordered[0].unordered_streams} streams and no resolvable cross-stream wait is recorded "
                        "(no cuda_sync Stream Wait Event naming its streams, no cudaStreamWaitEvent call after a "
                        "cudaEventRecord, which Kineto writes since kineto#808, September 2023) in "
                        f"{counted(len(unordered), 'file')} of the trace: {kept}")
    undated = [rank for rank in traced if rank.undated]
    if undated:
        first = undated[0]
        index, name = first.undated[0]
        warnings.append(f"{first.file}: {first.events_field}[{index}]: "
                        f"{counted(sum(len(rank.undated) for rank in undated), 'event')} without a duration left out "
                        f"in {counted(len(undated), 'file')} of the trace, first: {name!r} (only replayed ops need "
                        "one)")
    return tuple(warnings)


def _stream_overlap_warnings(traced: list[TracedRank], host_gaps: bool) -> tuple[str, ...]:
    """One line for a trace whose ops overlap on one stream (_stream_overlaps), at its first file that has
    them: the replay runs a stream's ops one after another and, with ``host_gaps``, measures the host gap after
    them from that serialized end (_Builder.add_rank), so its step is the traced one only where a later gap
    absorbs the overlap."""
    found = [(rank, overlaps) for rank in traced if (overlaps := _stream_overlaps(rank))]
    if not found:
        return ()
    rank, overlaps = found[0]
    op, overlap = overlaps[0]
    total = sum(len(overlaps) for _, overlaps in found)
    worst = max(overlap for _, overlaps in found for _, overlap in overlaps)
    return (f"{rank.file}: {rank.where(op)}: {op.name!r} starts {overlap * 1e6:,.1f} us before the op ahead of it on "
            f"{op.stream} ends, beyond the {STREAM_OVERLAP_JITTER_S * 1e6:.0f} us of timestamp rounding "
            f"({counted(total, 'such op')} in {counted(len(found), 'file')} of the trace, by up to "
            f"{worst * 1e6:,.1f} us): a CUDA stream runs its ops one after another, and so does the replay"
            + (", measuring the host time after them from there" if host_gaps else ""),)


def _device_warnings(traced: list[TracedRank], config: TraceWorkload, cluster_gpu: str) -> tuple[str, ...]:
    """A warning for each GPU the trace's files name (Kineto's `deviceProperties`, every rank's, at the first
    file naming it) that contradicts what the run moves its kernels from: without `workload.traced_gpu`, a GPU
    other than the cluster's (its kernels keep the traced GPU's durations, as a trace of unknown GPU's do,
    docs/traces.md, and the run would label another GPU's step with the cluster's GPU); with it, a catalog GPU
    other than `traced_gpu` (the kernels move by the rates of a GPU they did not run on); and `traced_gpu` on
    a trace whose ops are all host time (a CPU-only profile's), which it does not move."""
    files_naming: dict[str, list[TracedRank]] = {}
    for rank in traced:
        if rank.device:
            files_naming.setdefault(rank.device, []).append(rank)
    warnings = []
    computed = [op for rank in traced for op in rank.ops if op.op is None]
    if config.traced_gpu is not None and computed and all(op.host for op in computed):
        warnings.append(f"{traced[0].file}: traced_gpu: the trace's ops ran on the host (it records no GPU "
                        "activity), so traced_gpu changes nothing: host time keeps its traced durations")
    for device, ranks in files_naming.items():
        known = catalog_gpu_of(device)
        where = f"{ranks[0].file}: deviceProperties[0].name: the trace ran on an {device}"
        also = f"; {len(ranks)} of the {len(traced)} files name it" if len(ranks) > 1 else ""
        if config.traced_gpu is None and known != cluster_gpu:
            remedy = (f"set workload.traced_gpu: {known} to move them" if known is not None else
                      "it is no catalog GPU, so workload.traced_gpu cannot move them")
            warnings.append(f"{where}, the cluster's GPU is {cluster_gpu}: its kernels keep the traced GPU's "
                            f"durations ({remedy}{also})")
        elif config.traced_gpu is not None and known is not None and known != config.traced_gpu:
            warnings.append(f"{where}, workload.traced_gpu says {config.traced_gpu}: the run takes its kernel "
                            f"times for {config.traced_gpu}'s, not {known}'s (set workload.traced_gpu: {known}{also})")
    return tuple(warnings)


def _gemm_warnings(traced: list[TracedRank], config: TraceWorkload) -> tuple[str, ...]:
    """What keeps matrix multiplies from their shapes, one line per file and kind: ops whose recorded shape
    reached no GEMM kernel (their FLOPs go uncounted, and their time uncosted with `recost_gemms`) and, with
    `recost_gemms`, GEMM kernels after an op's first (they keep their traced time); with `recost_gemms`, a trace
    that records no shapes at all, or whose matrix multiplies are all host time (a CPU-only trace's)."""
    warnings = []
    for rank in traced:
        if rank.lost_shapes:
            many = len(rank.lost_shapes) > 1
            warnings.append(f"{rank.file}: {rank.events_field}[{rank.lost_shapes[0][0]}]: {len(rank.lost_shapes)} "
                            f"matrix multipl{'ies' if many else 'y'} with recorded shapes reached no GEMM kernel (by "
                            f"name), so {'their' if many else 'its'} FLOPs are not counted"
                            + (f" and no kernel takes {'their' if many else 'its'} time from the kernel model"
                               if config.recost_gemms else "")
                            + f" (first: {rank.lost_shapes[0][1]!r})")
        if rank.repeated_gemms and config.recost_gemms:
            index, op, kernel = rank.repeated_gemms[0]
            ops, kernels = len({repeat[0] for repeat in rank.repeated_gemms}), len(rank.repeated_gemms)
            warnings.append(f"{rank.file}: {rank.events_field}[{index}]: {ops} matrix multipl"
                            f"{'ies' if ops > 1 else 'y'} launched more than one GEMM kernel: the first takes its "
                            f"shape and the kernel model's time, the other {kernels} "
                            f"{'keep their traced durations' if kernels > 1 else 'keeps its traced duration'} "
                            f"(first: {op!r}, then {kernel!r})")
    shaped = [op for rank in traced for op in rank.ops if op.gemm]
    if config.recost_gemms and shaped and all(op.host for op in shaped):
        warnings.append(f"{traced[0].file}: recost_gemms: the trace's matrix multiplies ran on the host (it records "
                        "no GPU activity), so none is re-costed: host time keeps its traced durations")
    elif config.recost_gemms and not shaped and not any(rank.lost_shapes for rank in traced):
        why = ("no matrix multiply in the trace records its operand shapes, so none is re-costed; profile with "
               "torch.profiler.profile(record_shapes=True)" if config.format == "kineto" else
               "trainsim reads matrix multiplies' operand shapes from Kineto traces alone, so none is re-costed")
        warnings.append(f"{traced[0].file}: recost_gemms: {why}")
    return tuple(warnings)


def gemm_duration(shape: tuple[int, int, int, int], precision: MathPrecision, gpu: GPUSpec) -> float:
    """The kernel model's time for a (batch, m, n, k) matrix multiply on ``gpu``: 2bmnk FLOPs at the peak of
    ``precision`` (tf32: the tensor cores' on fp32 operands), the two operands read and the product written
    once, its batch x m x n output in waves over ``gpu``'s SMs where its GEMMs run so (the A100's)."""
    batch, m, n, k = shape
    element = PRECISION_BYTES["fp32" if precision == "tf32" else precision]
    kernel = Kernel("gemm", flops=2.0 * batch * m * n * k,
                    hbm_bytes=batch * (m * k + k * n + m * n) * element, kind="matmul",
                    size_dim=min(m, n, k), output=(batch, m, n))
    return kernel_duration(kernel, gpu, precision, calibrated_efficiency(gpu.name))


def _world(traced: list[TracedRank]) -> int:
    """The traced job's number of ranks: as its traces state it, which must agree and hold every rank they name
    (files, process-group members, peers), else the highest rank they name plus one (a trace of part of a job
    knows only the ranks it meets)."""
    stated = [rank for rank in traced if rank.world]
    for rank in stated[1:]:
        if rank.world != stated[0].world:
            raise trace_error(rank.file, rank.world_field, f"the traced job has {rank.world} ranks here, but "
                              f"{stated[0].world} in {stated[0].file} ({stated[0].world_field})",
                              "traces of one job, alike in its size")
    named = [(rank, op, max((*op.members, op.peer), default=-1)) for rank in traced for op in rank.ops]
    highest = max([rank.rank for rank in traced] + [number for _, _, number in named])
    if not stated:
        return highest + 1
    world, where = stated[0].world, f"{stated[0].world_field} of {stated[0].file}"
    for rank in traced:
        if rank.rank >= world:
            raise trace_error(rank.file, rank.events_field, f"the file is rank {rank.rank}, beyond the traced "
                              f"job's {world} ranks ({where})", "a rank of the job: the file's distributedInfo.rank "
                              "(Kineto), else its place in the file order, from 0")
        for name, group in rank.groups.items():
            if max(group.members, default=0) >= world:
                raise trace_error(rank.file, rank.groups_field, f"process group {name!r} has ranks "
                                  f"{_spans(sorted(group.members))}, beyond the traced job's {world} ranks ({where})",
                                  f"ranks from 0 to {world - 1}")
    for rank, op, number in named:
        if number >= world:
            what = (f"{op.op} of process group {op.group!r} of ranks {_spans(sorted(op.members))}"
                    if op.kind == "collective"
                    else f"{op.kind} {'to' if op.kind == 'send' else 'from'} rank {op.peer}")
            raise trace_error(rank.file, rank.where(op), f"{what}, beyond the traced job's {world} ranks ({where})",
                              f"ranks from 0 to {world - 1}")
    return world


def _stated_groups(traced: list[TracedRank]) -> dict[str, ProcessGroup]:
    """Every process group the traces state (used in the step or not), by name: files that state the same group
    must agree on its members."""
    stated: dict[str, tuple[ProcessGroup, TracedRank]] = {}
    for rank in traced:
        for name, group in rank.groups.items():
            first, where = stated.setdefault(name, (group, rank))
            if first.members != group.members:
                raise trace_error(rank.file, rank.groups_field, f"process group {name!r} has ranks "
                                  f"{list(group.members)} here, but {list(first.members)} in {where.file}",
                                  "traces of one job, alike in its process groups")
    return {name: group for name, (group, _) in stated.items()}


def _group_members(traced: list[TracedRank]) -> dict[str, tuple[int, ...]]:
    """Members of each process group: as a trace tells them, else the ranks whose traces use the group, which
    must then be as many as the group's size where a trace states it."""
    listed: dict[str, tuple[int, ...]] = {}
    users: dict[str, set[int]] = {}
    for rank in traced:
        for op in rank.ops:
            if op.kind != "collective":
                continue
            users.setdefault(op.group, set()).add(rank.rank)
            if op.members:
                if op.group in listed and listed[op.group] != op.members:
                    raise trace_error(rank.file, rank.where(op), f"process group {op.group!r} has members "
                                      f"{list(op.members)} here and {list(listed[op.group])} elsewhere")
                if rank.rank not in op.members:
                    raise trace_error(rank.file, rank.where(op), f"rank {rank.rank} runs a collective of group "
                                      f"{op.group!r} whose members {list(op.members)} do not include it",
                                      "the traces of the group's members; a file's rank is its distributedInfo.rank "
                                      "(Kineto), else its place in the file order, from 0")
                listed[op.group] = op.members
    for rank in traced:
        for op in rank.ops:
            if op.kind == "collective" and op.group not in listed and op.group_size not in (0, len(users[op.group])):
                using = sorted(users[op.group])
                raise trace_error(rank.file, rank.where(op), f"process group {op.group!r} has {op.group_size} members "
                                  f"({op.size_field}), but the trace does not tell which and only "
                                  + (f"ranks {using} use it" if len(using) > 1 else f"rank {using[0]} uses it"),
                                  "a trace of every member, or one that lists the group's ranks (Kineto: Process "
                                  "Group Ranks, or Global rank start and stride; Chakra: process-group metadata)")
    return {group: listed.get(group, tuple(sorted(ranks))) for group, ranks in users.items()}


def _gathered(rank: TracedRank, members: dict[str, tuple[int, ...]]) -> TracedRank:
    """``rank`` with each collective whose bytes are its input (TracedOp.input_bytes: a Chakra all-gather's
    `comm_size`, the rank's shard) counted as the gathered output, the shard times its group's ``members``, as
    every collective's bytes are (nccl-tests convention: what a Kineto all-gather's `Out msg nelems` gives)."""
    if not any(op.input_bytes for op in rank.ops):
        return rank
    return replace(rank, ops=tuple(replace(op, nbytes=op.nbytes * len(set(members[op.group])), input_bytes=False)
                                   if op.input_bytes else op for op in rank.ops))


def _assumed_members(traced: list[TracedRank], members: dict[str, tuple[int, ...]], world: int) -> tuple[str, ...]:
    """One warning per process group that no trace lists the members of or gives a size, whose members are then
    the ranks whose traces use it (_group_members), fewer than the traced job's ``world``, where some of its
    ranks have no trace: the group may span them, whose part of its collectives' traffic is then not simulated.
    Where every rank has a trace, the ranks that use a group are all its members."""
    if {rank.rank for rank in traced} >= set(range(world)):
        return ()
    told = {op.group for rank in traced for op in rank.ops if op.kind == "collective" and (op.members or op.group_size)}
    warned: set[str] = set()
    warnings = []
    for rank in traced:
        for op in rank.ops:
            if op.kind != "collective" or op.group in told | warned or len(members[op.group]) >= world:
                continue
            warned.add(op.group)
            ranks = members[op.group]
            warnings.append(f"{rank.file}: {rank.where(op)}: process group {op.group!r}: no trace lists its members or "
                            f"its size, so it is taken as the rank{'s' if len(ranks) > 1 else ''} whose traces use it "
                            f"({_spans(list(ranks))}), {len(ranks)} of the traced job's {world}")
    return tuple(warnings)


def _sequenced(traced: list[TracedRank]) -> frozenset[str]:
    """The process groups whose collectives match across ranks by sequence number: those whose every collective
    on every traced rank records one (PyTorch's `Seq`); the others match by issue order."""
    collectives = [op for rank in traced for op in rank.ops if op.kind == "collective"]
    return frozenset({op.group for op in collectives} - {op.group for op in collectives if op.seq < 0})


def _all_to_alls(traced: list[TracedRank]) -> dict[str, bool]:
    """The process groups that run all-to-alls, each with whether any of them splits unevenly."""
    uneven: dict[str, bool] = {}
    for op in (op for rank in traced for op in rank.ops if op.kind == "collective" and op.op == "all_to_all"):
        uneven[op.group] = uneven.get(op.group, False) or op.uneven
    return uneven


def _transfer(rank: int, op: TracedOp) -> Transfer:
    """Rank ``rank``'s send or receive ``op`` as the transfer it is an end of."""
    return Transfer(rank, op.peer, op.description) if op.kind == "send" else Transfer(op.peer, rank, op.description)


@dataclass(frozen=True)
class _Replicas:
    """The traced job's copies that `workload.dp` asks for (one: not replicated). The traced job holds d
    data-parallel replicas of the model (_replicas); dp = N gives N / d copies of it, copy q of traced rank r
    being rank r + q x ``traced_world``: copies outermost, new replicas after the traced ones as
    parallel/layout.py puts dp last, so that inside a copy the traced order, and the hosts where the traced job
    fills whole ones, stand. A group in ``widened`` (a data-parallel group across the traced job's replicas)
    spans its members' copies in every copy; any other group (TP, CP, PP, EP, an HSDP shard group) and every
    point-to-point transfer is copied into each copy, the group named ``name@q`` in copy q >= 1. A widened
    group lists its traced members copy by copy, so that with one copy it is the traced group, order and all."""

    traced_world: int
    copies: int = 1
    widened: frozenset[str] = frozenset()

    @property
    def world(self) -> int:
        return self.traced_world * self.copies

    def copy_of(self, rank: int) -> int:
        """Which copy of the traced job ``rank`` is in."""
        return rank // self.traced_world

    def name(self, group: str, copy: int) -> str:
        """The name of traced ``group`` in ``copy``: one name for a widened group, which spans every copy."""
        return group if copy == 0 or group in self.widened else f"{group}@{copy}"

    def members(self, traced: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """Every group of every copy with its ranks, from the ``traced`` groups' members."""
        replicated: dict[str, tuple[int, ...]] = {}
        for group, ranks in traced.items():
            if group in self.widened:
                replicated[group] = tuple(rank for copy in range(self.copies) for rank in self.moved(ranks, copy))
            else:
                replicated |= {self.name(group, copy): self.moved(ranks, copy) for copy in range(self.copies)}
        return replicated

    def moved(self, ranks: tuple[int, ...], copy: int) -> tuple[int, ...]:
        """Traced ``ranks`` in ``copy``."""
        return tuple(rank + copy * self.traced_world for rank in ranks)

    def images(self, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """The copies of copy 0's ``ranks`` (a copied group, or a transfer's two ends) in the other copies: the
        mirrors of a folded run's op over them, which the engine runs beside it and its fold checks judge."""
        return tuple(self.moved(ranks, copy) for copy in range(1, self.copies))


DP_GROUPS_ALLOWED = ("data-parallel groups over all of the traced job's data-parallel places, or every s-th of them "
                     "(expert-data-parallel, HSDP replicate groups), or over a block of consecutive ones (HSDP shard "
                     "groups)")


class _Reach(NamedTuple):
    """How one slice of a group lies among the traced job's data-parallel places: 'across' every ``span``-th
    place from one below it (all of them for span 1), or 'inside' an aligned block of ``span`` consecutive
    places short of all (one place included)."""

    shape: str
    span: int


def _replicas(dp: int | None, members: dict[str, tuple[int, ...]], kinds: Dimensions, world: int,
              exchanging: frozenset[str], descriptions: dict[str, str]) -> _Replicas:
    """The copies of the traced job of ``world`` ranks that `workload.dp` = ``dp`` asks for. The traced job's
    data parallelism d is its ranks over TP x CP x PP as the layout read them (layout.py; never a group's size:
    Megatron-LM's DATA_PARALLEL_GROUP_WITH_CP spans d x CP ranks, an expert-data-parallel group fewer than d);
    a rank's data-parallel place is r // (TP x CP) mod d in its stage. Each group counted as dp is widened where
    in each of its slices (ranks alike but for their data-parallel place) it holds every place, or every s-th
    from one below s (_reach), and copied where it holds a block of consecutive places (an HSDP shard
    group, inside one replica's block); any other shape is refused, as is a trace whose d is 1 or that has no
    widened group (it tells no gradient traffic), a dp that is not a multiple of d, a group that would widen
    but runs all-to-alls (``exchanging``: a group described as data-parallel whose traced shares per pair, or even
    split, say nothing of more members), and a group whose description (``descriptions``) says HSDP shard or
    replicate where its shape says the other. Every s-th place (s > 1) is believed only beside what makes it
    so, a group over every place or groups over blocks of s (EP's, HSDP's shard groups): alone it is the sign of
    a misread layout (TP groups the trace does not record, read as TP 1). An expert-parallel group over every
    place of its slices leaves the traced job no expert data parallelism, whose gradients' traffic more copies
    would add: refused where dp > d."""
    if dp is None:
        return _Replicas(world)
    tp, pp, cp = kinds.sizes.tp or 1, kinds.sizes.pp or 1, _cp_size(members, kinds)
    if world % (tp * cp * pp):
        raise ScenarioError(f"the traced job's {world} ranks do not split into TP {tp} x CP {cp} x PP {pp}, so its "
                            "data parallelism is unknown", field="workload.dp",
                            allowed="workload.traced_tp, traced_cp and traced_pp: the traced job's layout")
    degree = world // (tp * cp * pp)
    layout = f"TP {tp} x CP {cp} x PP {pp} on {world} ranks"
    slices = {group: _slices(ranks, tp, cp, pp, world, degree) for group, ranks in members.items()}
    readings = {group: {_reach(places, degree) for places in group_slices.values()}
                for group, group_slices in slices.items()}
    widened = set()
    for group, ranks in members.items():
        if kinds.groups[group] != "dp" or degree < 2:
            continue
        shapes = {reading.shape if reading else None for reading in readings[group]}
        if shapes == {"across"} and group in exchanging:
            raise ScenarioError(f"process group {group!r} (ranks {_spans(sorted(set(ranks)))}) counts as data-parallel "
                                "and runs all-to-alls, whose shares more replicas cannot tell", field="workload.dp",
                                allowed="leave dp out, or Process Group Descriptions naming the group's dimension "
                                "(an all-to-all's group is CP's or EP's, copied into each replica)")
        if shapes == {"across"}:
            widened.add(group)
        elif shapes != {"inside"}:
            example = next(places for places in slices[group].values()
                           if (_reach(places, degree) or _Reach("", 0)).shape != "across")
            raise ScenarioError(f"process group {group!r} (ranks {_spans(sorted(set(ranks)))}) holds data-parallel "
                                f"places {_spans(example)} of the traced job's {degree} ({layout}), so how it grows "
                                "with dp is unknown", field="workload.dp", allowed=DP_GROUPS_ALLOWED)
        _check_hsdp_description(group, ranks, descriptions.get(group, ""), readings[group], degree, layout)
    if degree < 2:
        raise ScenarioError(f"the traced job has no data parallelism (its {counted(world, 'rank')} "
                            f"{'is' if world == 1 else 'are'} TP {tp} x CP {cp} x PP {pp}), so the trace cannot tell "
                            "the gradients' traffic of more replicas",
                            field="workload.dp", allowed="leave dp out, workload.traced_pp, traced_tp or traced_cp "
                            "where that layout (PP read from the point-to-point transfers) is not the traced job's, "
                            "or a trace of 2 or more data-parallel replicas")
    if not widened:
        raise ScenarioError(f"the traced job has data parallelism of {degree} (its {world} ranks over TP {tp} x CP "
                            f"{cp} x PP {pp}) but no process group spans its data-parallel places, so the trace cannot "
                            "tell the gradients' traffic of more replicas", field="workload.dp",
                            allowed="leave dp out, or a trace whose data-parallel groups' collectives (the "
                            "gradients') it records")
    _check_strides(widened, members, readings, degree, layout)
    if dp % degree:
        raise ScenarioError(f"dp {dp} is not a multiple of the traced job's data parallelism of {degree}",
                            field="workload.dp", allowed=f"multiples of {degree}")
    if dp > degree:
        _check_expert_data_parallelism(members, kinds, exchanging, readings, degree, layout)
    return _Replicas(world, dp // degree, frozenset(widened))


def _slices(ranks: tuple[int, ...], tp: int, cp: int, pp: int, world: int, degree: int) -> dict[tuple[int, ...],
                                                                                                list[int]]:
    """A group's ``ranks`` by slice (their TP place, CP place and stage), each slice's data-parallel places,
    sorted."""
    slices: dict[tuple[int, ...], list[int]] = {}
    for rank in sorted(set(ranks)):
        slices.setdefault((rank % tp, rank // tp % cp, rank * pp // world), []).append(rank // (tp * cp) % degree)
    return slices


def _check_hsdp_description(group: str, ranks: tuple[int, ...], description: str, readings: set[_Reach | None],
                            degree: int, layout: str) -> None:
    """Refuse a data-parallel group whose description says HSDP shard (torchtitan's `dp_shard`, the inner,
    consecutive places, copied) where its shape is every s-th place (s > 1, a replicate group's, widened), or
    says replicate (`dp_replicate`, widened) where its shape is a block of consecutive places: the shape would
    decide against the description, so the traced layout is not what the replay reads."""
    words = set(re.split(r"[^a-z]+", description.lower()))
    strided = next((reading.span for reading in readings if reading and reading.shape == "across" and reading.span > 1),
                   0)
    block = next((reading.span for reading in readings if reading and reading.shape == "inside" and reading.span > 1),
                 0)
    if "shard" in words and strided:
        found = f"every {_ordinal(strided)} of", "as an HSDP replicate group does (widened)"
    elif "replicate" in words and block:
        found = f"a block of {block} consecutive ones of", "as an HSDP shard group does (copied)"
    else:
        return
    raise ScenarioError(f"process group {group!r} (ranks {_spans(sorted(set(ranks)))}) is described as "
                        f"{description!r} but holds {found[0]} the traced job's {degree} data-parallel places "
                        f"({layout}), {found[1]}",
                        field="workload.dp", allowed="shard groups over blocks of consecutive data-parallel places "
                        "and replicate groups over every s-th (torchtitan's mesh order), or workload.traced_tp, "
                        "traced_cp and traced_pp giving the traced job's layout")


def _check_strides(widened: set[str], members: dict[str, tuple[int, ...]], readings: dict[str, set[_Reach | None]],
                   degree: int, layout: str) -> None:
    """Refuse a widened group over every s-th data-parallel place (s > 1) where no group spans every place and
    none spans blocks of s consecutive places (an EP group's, an HSDP shard group's): nothing in the trace then
    explains the stride, which is what TP groups the trace does not record (Transformer Engine's userbuffers)
    look like when the layout reads TP 1."""
    spanned = {reading for group_readings in readings.values() for reading in group_readings if reading}
    if _Reach("across", 1) in spanned:
        return
    for group in sorted(widened):
        stride = max(reading.span for reading in readings[group] if reading)
        if stride > 1 and _Reach("inside", stride) not in spanned:
            raise ScenarioError(f"process group {group!r} (ranks {_spans(sorted(set(members[group])))}) holds every "
                                f"{_ordinal(stride)} data-parallel place of the traced job's {degree} ({layout}), but "
                                f"no group holds every place or blocks of {stride} consecutive ones, so the traced "
                                "layout is in doubt", field="workload.dp",
                                allowed="workload.traced_tp (and traced_cp, traced_pp): the traced job's layout, "
                                "where the trace records no TP groups")


def _check_expert_data_parallelism(members: dict[str, tuple[int, ...]], kinds: Dimensions, exchanging: frozenset[str],
                                   readings: dict[str, set[_Reach | None]], degree: int, layout: str) -> None:
    """Refuse an expert-parallel group (counted as EP, or running all-to-alls) that holds every data-parallel
    place of each of its slices: the traced job's experts are then not replicated (expert data parallelism 1),
    so its expert-data-parallel groups are single ranks with no traffic, while a job of more replicas
    all-reduces its expert gradients over groups whose size the trace cannot tell."""
    for group, ranks in members.items():
        if (kinds.groups[group] == "ep" or group in exchanging) and readings[group] == {_Reach("across", 1)}:
            raise ScenarioError(f"process group {group!r} (ranks {_spans(sorted(set(ranks)))}) is expert-parallel "
                                f"over all of the traced job's {degree} data-parallel places ({layout}): the traced "
                                "job's expert data parallelism is 1, so the trace cannot tell the expert gradients' "
                                "traffic", field="workload.dp",
                                allowed=f"{degree} or dp left out, or a trace whose expert-parallel groups span "
                                "part of its data-parallel places")


def _copies_unlike(topology: Topology, replicas: _Replicas, members: dict[str, tuple[int, ...]],
                   transfers: list[Transfer]) -> str:
    """Why the copies of the traced job cannot fold onto its traced ranks ('' where they can). A copy's own
    traffic (its copied groups' collectives, its transfers) folds only where, in every copy, it stays inside one
    NVLink domain over the same links as the traced ranks': the copies then meet alike what the run simulates
    whole (the widened groups). Across the network a copy's hand-off may be hashed onto other spines, or
    straddle hosts where the traced ranks' does not (a traced job of 6 ranks on hosts of 8 GPUs), and the fold
    cannot vouch for it from the traced ranks, while the copies' ranks still join the widened groups when their
    own traffic is done (folded anyway, docs/traces.md: 0.3070 ms against 0.2574 ms unfolded, 0.7967 against
    1.0347). The engine's fold checks may catch such copies too; this names the copy's transfer first."""
    domains = topology.gpu_domain
    owned = [(f"process group {group!r}", ranks) for group, ranks in members.items()
             if group not in replicas.widened and len(set(ranks)) > 1]
    owned += [(f"transfer from rank {transfer.src} to rank {transfer.dst}", (transfer.src, transfer.dst))
              for transfer in dict.fromkeys(transfers)]
    for label, ranks in owned:
        traced = _hops(topology, ranks)
        for copy in range(replicas.copies):
            moved = replicas.moved(ranks, copy)
            which = f"copy {copy} of " if copy else ""
            if len({domains[gpu] for gpu in moved}) > 1:
                return (f"{which}the traced job's {label} crosses the network (GPUs {_spans(sorted(set(moved)))}): "
                        "a copy's own traffic folds only inside NVLink domains")
            if copy and _hops(topology, moved) != traced:
                return (f"{which}the traced job's {label} takes other links (GPUs {_spans(sorted(set(moved)))}) than "
                        f"the traced ranks' (GPUs {_spans(sorted(set(ranks)))})")
    return ""


def _hops(topology: Topology, ranks: tuple[int, ...]) -> list[list[tuple[float, str]]]:
    """The hops from the first of ``ranks`` to each of the others (`Topology.hop_signature`)."""
    return [topology.hop_signature(ranks[0], rank) for rank in ranks[1:]]


def _traced_dp(members: dict[str, tuple[int, ...]], kinds: Dimensions, world: int, exchanging: frozenset[str],
               descriptions: dict[str, str]) -> int | None:
    """The traced job's own data parallelism d: 1 where its ranks are its TP x CP x PP, else d where the reading
    of `workload.dp` takes it (_replicas with dp = d: a data-parallel group spans its d places), else None:
    without that check a trace that records no TP groups would read as TP 1, every rank a replica."""
    try:
        degree, left = divmod(world, (kinds.sizes.tp or 1) * (kinds.sizes.pp or 1) * _cp_size(members, kinds))
        if left:
            return None
        if degree > 1:
            _replicas(degree, members, kinds, world, exchanging, descriptions)
    except ScenarioError:
        return None
    return degree


def _cp_size(members: dict[str, tuple[int, ...]], kinds: Dimensions) -> int:
    """The traced job's CP size: declared or told (layout.py), else its CP groups' size, else 1."""
    if kinds.sizes.cp is not None:
        return kinds.sizes.cp
    sizes = sorted({len(set(members[group])) for group, kind in kinds.groups.items() if kind == "cp"})
    if len(sizes) > 1:
        raise ScenarioError(f"the trace's CP groups have {' and '.join(map(str, sizes))} ranks, so the traced job's "
                            "data parallelism is unknown", field="workload.dp",
                            allowed="workload.traced_cp: the traced job's CP size")
    return sizes[0] if sizes else 1


def _reach(places: list[int], degree: int) -> _Reach | None:
    """How sorted data-parallel ``places`` of one slice of a group lie among the traced job's ``degree``:
    every s-th place from one below s, an aligned block of consecutive places short of all, else None."""
    count = len(places)
    if count > 1 and degree % count == 0 and places == list(range(places[0], degree, degree // count)):
        return _Reach("across", degree // count)
    if degree % count == 0 and places[0] % count == 0 and places == list(range(places[0], places[0] + count)):
        return _Reach("inside", count)
    return None


class _End(NamedTuple):
    """One end of a point-to-point transfer: where its trace has it, and which transfer it is (the ``number``-th
    from ``src`` to ``dst`` in process ``group``, from 0)."""

    file: str
    where: str
    name: str
    src: int
    dst: int
    group: str
    number: int


class _Builder:
    """Ops of the simulated ranks, with collective keys matched across ranks."""

    def __init__(self, members: dict[str, tuple[int, ...]], kinds: Dimensions, replicas: _Replicas, fold: bool,
                 sequenced: frozenset[str], move: GpuMove, host_gaps: bool, gemm_gpu: GPUSpec | None):
        self.members = members
        self.kinds = kinds
        self.replicas = replicas
        self.mirrored = fold and replicas.copies > 1
        self.sequenced = sequenced
        self.move = move
        self.host_gaps = host_gaps
        self.gemm_gpu = gemm_gpu
        self.recosted = 0
        self.ops: list[Op] = []
        self.ranks: set[int] = set()
        self._sizes: dict[str, _First] = {}
        self._transfers: dict[str, dict[str, _End]] = {}
        self._joined: dict[str, tuple[str, int, set[int]]] = {}
        self._exchanges: dict[str, list[tuple[CollectiveOp, TracedShares]]] = {}
        self._sources: dict[int, TracedRank] = {}
        self._send_order = SendOrder()

    def add_rank(self, rank: int, source: TracedRank) -> None:
        self.ranks.add(rank)
        self._sources[rank] = source
        op_ids: list[int] = []
        stream_end: dict[str, float] = {}
        ends: list[float] = []
        counts: dict[tuple, int] = {}
        start = source.window[0] if source.window else min((op.start_s for op in source.ops), default=0.0)
        for op in source.ops:
            deps = tuple(op_ids[dep] for dep in op.deps)
            if source.timed and self.host_gaps:
                ready = max([stream_end.get(op.stream, start)] + [ends[dep] for dep in op.deps])
                ends.append(max(op.start_s, ready) + op.duration_s)
                stream_end[op.stream] = ends[-1]
                if op.start_s - ready > TIMESTAMP_ROUNDING_S:
                    self.ops.append(ComputeOp(id=len(self.ops), rank=rank, stream=op.stream, name="host gap",
                                              deps=deps, category="host", duration=op.start_s - ready))
                    deps = ()
            op_ids.append(len(self.ops))
            self.ops.append(self._op(rank, source, op, deps, counts))
        if source.window and stream_end and self.host_gaps:
            last = max(stream_end, key=lambda stream: stream_end[stream])
            if source.window[1] - stream_end[last] > TIMESTAMP_ROUNDING_S:
                self.ops.append(ComputeOp(id=len(self.ops), rank=rank, stream=last, name="host gap",
                                          category="host", duration=source.window[1] - stream_end[last]))

    def recosts(self, op: TracedOp) -> bool:
        """Whether ``op`` takes its time from the kernel model (`recost_gemms`: a GEMM kernel with its shape and
        precision), not from its traced duration moved to the cluster's GPU; host time (a CPU-only trace's
        matrix multiply) never does."""
        return self.gemm_gpu is not None and bool(op.gemm) and not op.host and told_precision(op) is not None

    def _op(self, rank: int, source: TracedRank, op: TracedOp, deps: tuple[int, ...], counts: dict) -> Op:
        if op.op is None:
            duration, flops = self.move.duration(op), 0.0
            category: Category = HOST_CATEGORY if op.host else "compute"
            if op.gemm:
                batch, m, n, k = op.gemm
                flops = 2.0 * batch * m * n * k
                precision = told_precision(op)
                if self.recosts(op):
                    assert self.gemm_gpu is not None and precision is not None
                    duration, category = gemm_duration(op.gemm, precision, self.gemm_gpu), "compute"
                    self.recosted += 1
            return ComputeOp(id=len(self.ops), rank=rank, stream=op.stream, name=op.name, deps=deps,
                             category=category, duration=duration, flops=flops)
        copy = self.replicas.copy_of(rank)
        name = self.replicas.name(op.group, copy) if op.kind == "collective" else op.group
        peer = op.peer + copy * self.replicas.traced_world
        if op.kind == "collective":
            group = self.members[name]
            by_seq = op.group in self.sequenced
            series: tuple = (name, f"seq{op.seq}") if by_seq else (name,)
        else:
            if peer == rank:
                raise trace_error(source.file, source.where(op), f"rank {rank} sends to itself")
            group = (rank, peer) if op.kind == "send" else (peer, rank)
            series = ("p2p", *group, op.group) if op.group else ("p2p", *group)
        counts[series] = counts.get(series, -1) + 1
        number = counts[series]
        key = f"{'.'.join(map(str, series))}#{number}"
        if op.kind != "collective":
            label = (f"transfer number {number + 1} from rank {group[0]} to rank {group[1]}"
                     + (f" in process group {op.group!r}" if op.group else ""))
        elif by_seq:
            label = f"seq {op.seq} of process group {op.group!r}" + (f" (kernel {number + 1})" if number else "")
        else:
            label = f"number {number + 1} of process group {op.group!r}"
        self._check_size(key, label, op, rank, source)
        if op.kind == "collective":
            self._joined.setdefault(key, (name, op.seq if by_seq else -1, set()))[2].add(rank)
        else:
            self._transfers.setdefault(key, {})[op.kind] = _End(source.file, source.where(op), op.name, group[0],
                                                                group[1], op.group, number)
            if op.kind == "send" and op.stream in ASYNC_STREAMS:
                deps = self._send_order.issue((rank, peer, op.group), len(self.ops), deps)
        mirrored = self.mirrored and (op.kind != "collective" or op.group not in self.replicas.widened)
        collective = CollectiveOp(id=len(self.ops), rank=rank, stream=op.stream, name=op.name, deps=deps,
                                  category=self.kinds.groups[op.group] if op.kind == "collective"
                                  else self.kinds.transfers[_transfer(source.rank, op)], op=op.op,
                                  group=group, nbytes=op.nbytes, key=key,
                                  mirrors=self.replicas.images(group) if mirrored else ())
        if op.op == "all_to_all":
            self._exchanges.setdefault(key, []).append((collective, TracedShares(
                rank, source.file, source.where(op), op.nbytes, op.sends, op.receives)))
        return collective

    def settle_exchanges(self) -> None:
        """Give each all-to-all whose traces list split sizes its bytes per pair (exchanges.pair_bytes), the
        same matrix on every member's op, and as ``nbytes`` the mean a member sends; an all-to-all without
        them stays even, its members agreeing on the size."""
        for key, parts in self._exchanges.items():
            group = parts[0][0].group
            pairs = pair_bytes(group, [shares for _, shares in parts], f"all_to_all {self._sizes[key].label}")
            for collective, _ in parts:
                if pairs:
                    collective.pair_bytes = pairs
                    collective.nbytes = sum(map(sum, pairs)) / len(group)

    def check_transfers_matched(self, missing: frozenset[int]) -> tuple[str, ...]:
        """Every send of a simulated rank has its receive on the peer, and the other way round: an end without
        its partner in the peer's trace would wait forever. A peer without a trace (one pipeline stage profiled
        alone) is not simulated: the transfer runs over the network between the two GPUs as soon as its traced
        end is reached, the peer taken as ready, as a collective's untraced members' transfers do; one warning
        per file says how many of its transfers did so, of peers other than the traced job's ``missing`` ranks
        (_missing_ranks' line names those)."""
        untraced: dict[str, list[tuple[str, int]]] = {}
        for ends in self._transfers.values():
            if len(ends) == 2:
                continue
            (kind, end), = ends.items()
            rank, peer = (end.src, end.dst) if kind == "send" else (end.dst, end.src)
            if peer not in self.ranks:
                if peer % self.replicas.traced_world not in missing:
                    untraced.setdefault(end.file, []).append((end.where, peer))
                continue
            partner, other = ("receive", "recv") if kind == "send" else ("send", "send")
            found = sum(other in sides and (sides[other].src, sides[other].dst, sides[other].group)
                        == (end.src, end.dst, end.group) for sides in self._transfers.values())
            grouped = f" in process group {end.group!r}" if end.group else ""
            this = (f"rank {rank}'s {_ordinal(end.number + 1)} {kind} {'to' if kind == 'send' else 'from'} rank "
                    f"{peer}{grouped}")
            untold = [(index, name) for index, name, told, group in self._sources[peer].untold_peers
                      if told in (other, "") and group in (end.group, "")]
            if not found and untold:
                index, name = untold[0]
                field = "Dst Rank" if other == "send" else "Src Rank"
                source = self._sources[peer]
                raise trace_error(source.file, f"{source.events_field}[{index}]", f"{other} {name!r} names no peer "
                                  f"(no {field!r}, nor 'Rank' in its process group), so it was kept as traced "
                                  f"compute and {this} ({end.file}: {end.where}) has no matching {partner}",
                                  f"the kernel's {field!r}, or its 'Rank' in the process group, or a process group "
                                  "of two ranks (whose other member is the peer)")
            raise trace_error(end.file, end.where, f"{kind} {end.name!r} is {this}, but rank {peer}'s trace "
                              f"({self._sources[peer].file}) has {found} matching {partner}{'s' if found != 1 else ''}",
                              f"a {partner} on the peer for each {kind}, matched by process group and order")
        return tuple(_untraced_warning(file, ends) for file, ends in untraced.items())

    def check_collectives_matched(self) -> None:
        """Every simulated member of a group issues each of the group's collectives: one that a member's trace
        lacks would wait for it forever, as NCCL would hang (traces of different steps, cut short, or missing a
        kernel the profiler dropped). Where the group's collectives carry sequence numbers, the error says which
        numbers the member's trace has."""
        for key, (group, seq, joined) in self._joined.items():
            absent = [member for member in self.members[group] if member in self.ranks and member not in joined]
            if not absent:
                continue
            first = self._sizes[key]
            theirs = [entry for entry in self._joined.values() if entry[0] == group and absent[0] in entry[2]]
            issued = (f"has seq {_spans(sorted({entry[1] for entry in theirs}))} of the group" if seq >= 0 and theirs
                      else f"issues {len(theirs)} collective{'s' if len(theirs) != 1 else ''} of the group")
            raise trace_error(first.file, first.where, f"{first.op} {first.label} on rank {first.rank} has no "
                              f"counterpart on rank {absent[0]}, whose trace ({self._sources[absent[0]].file}) "
                              f"{issued}",
                              "the same collectives of each group, in the same order, on every member")

    def _check_size(self, key: str, label: str, op: TracedOp, rank: int, source: TracedRank) -> None:
        """Every member must agree on a collective's (or a transfer's) primitive and size; an all-to-all's members
        may send different amounts, which settle_exchanges checks pair by pair."""
        first = self._sizes.setdefault(key, _First(op.nbytes, op.op, rank, source.file, source.where(op), label))
        if first.op != op.op or (first.nbytes != op.nbytes and op.op != "all_to_all"):
            raise trace_error(source.file, source.where(op), f"{op.op} of {op.nbytes:.0f} bytes on rank {rank} as "
                              f"{label}, but {first.op} of {first.nbytes:.0f} bytes on rank {first.rank} "
                              f"({first.file}: {first.where})", "the same primitive and size on every member")


class _First(NamedTuple):
    """A collective or transfer as the first rank to reach it in the build has it: the others must agree."""

    nbytes: float
    op: Primitive | None
    rank: int
    file: str
    where: str
    label: str


def _spans(numbers: list[int]) -> str:
    """Sorted numbers as runs: 1-4, 6, 9-10."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


def _untraced_warning(file: str, ends: list[tuple[str, int]]) -> str:
    """One file's transfers whose peers have no trace, (where, peer) each, in one line."""
    peers = sorted({peer for _, peer in ends})
    many = len(peers) > 1
    return (f"{file}: {ends[0][0]}: {len(ends)} point-to-point transfer{'s' if len(ends) > 1 else ''} with "
            f"rank{'s' if many else ''} {', '.join(map(str, peers))}, which {'have' if many else 'has'} no trace, "
            "run over the network as soon as this rank reaches them, the peer taken as ready")


def _ordinal(number: int) -> str:
    """1st, 2nd, 3rd, 4th... 11th, 12th, 13th, 21st."""
    suffix = "th" if number % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def throughput_warnings(summary: dict, peak_flops: float) -> list[str]:
    """An MFU above 100%: the model FLOPs the scenario claims for a step (workload.tokens_per_step x
    model_flops_per_token) exceed what the GPUs' dense bf16 peak executes in the replayed step. The replay keeps
    each GPU's traced work, so the figure is right by construction (replication adds GPUs and tokens alike);
    the numbers given, or the peak they are counted against, are not. Empty where the MFU is at most 100% or
    the scenario states no model FLOPs (`mfu` null)."""
    if summary["mfu"] is None or summary["mfu"] <= 1:
        return []
    return [f"MFU {summary['mfu']:.0%} is above 100%: workload.tokens_per_step x model_flops_per_token claim "
            f"{summary['tflops_per_gpu']:,.0f} TFLOP/s per GPU in the replayed step, above the GPU's dense "
            f"{PEAK_PRECISION} peak of {peak_flops / 1e12:,.0f} TFLOP/s; tokens_per_step counts the tokens of one "
            "step of the whole traced job (every rank it ran on), model_flops_per_token one token's model FLOPs "
            "(6N plus attention); a job in fp8 can exceed the bf16 peak"]
