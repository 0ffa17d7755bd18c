"""Which parallel dimension each process group of a trace serves, for the metrics' traffic per kind: the one its
description names, else the one its ranks vary along in the traced job's layout.

The layout is Megatron-LM's and torchtitan's rank order: tensor parallelism innermost (TP groups are runs of consecutive
ranks), then context (or expert) and data parallelism, pipeline stages outermost (a stage is a run of consecutive
ranks). Each size is the scenario's `workload.traced_*`, else the one the trace's groups named for a single dimension
tell (a `TENSOR_MODEL_PARALLEL_GROUP` of 2 ranks: TP 2; a CP group's rank stride is the TP size), else inferred from the
groups named only by number: a stage is the smallest rank distance of a point-to-point transfer (neighbouring stages),
else the whole job; TP the size of the groups of consecutive ranks smaller than a stage (the TP groups every TP job's
trace uses), else 1, unless the CP or EP size is that length too, where the layout that holds every group whole is taken
(TP of the length, or TP 1) and neither or both are refused; TP 1 so inferred is refused where a numbered group that the
trace lists but no collective uses is such a run (TP groups whose traffic it does not record). A rank is then (t, r, p):
its place in its TP group, in the rest of its stage (context, expert and data parallelism, r), and its stage; a group
counts as the first of dp, cp, tp, pp that its ranks vary along, as a description naming several does: r varying over
the whole rest of a stage or with a stride is dp (refused where CP or EP of that size could own the group as well and
the trace does not tell their groups apart); over a run of consecutive values short of it cp or ep (both take the places
next to TP), whichever of the CP and EP sizes the run can be; t alone tp; p alone pp. The group of every rank counts as
dp (the default group: a DDP or FSDP job's gradients, a step's loss), unless the sizes leave the job no data parallelism
(TP x CP x PP = its ranks). A point-to-point transfer counts as the dimension its group's description names, else as CP
where its two ends are in one CP group (a ring attention's sends: a group described as CP, or the layout's CP group of
the declared or told sizes), else as PP; only the PP ones tell the stages. A group that runs all-to-alls is neither TP
nor DP (a Ulysses attention's or a token dispatch's): CP or EP, EP where one splits unevenly."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from simulator.errors import ScenarioError
from simulator.program.ops import CommCategory
from simulator.workload.traces.model import ProcessGroup

GROUP_WORDS: dict[str, CommCategory] = {"dp": "dp", "data": "dp", "fsdp": "dp", "ddp": "dp", "ep": "ep",
                                        "expert": "ep", "cp": "cp", "context": "cp", "tp": "tp", "tensor": "tp",
                                        "pp": "pp", "pipeline": "pp"}
"""Words of a process group's description (torchtitan's mesh names `dp_shard_cp`, Megatron-LM's
`TENSOR_MODEL_PARALLEL_GROUP`) -> the dimension they name."""
GROUP_KINDS: tuple[CommCategory, ...] = ("dp", "ep", "cp", "tp", "pp")
"""Which dimension a group serving several counts as: a group spanning data parallelism carries gradients
(`DATA_PARALLEL_GROUP_WITH_CP`, `dp_shard_cp`, `EXPERT_DATA_PARALLEL_GROUP`), one spanning experts their
tokens (`TENSOR_AND_EXPERT_PARALLEL_GROUP`)."""
SIZED_KINDS: tuple[CommCategory, ...] = ("tp", "pp", "cp", "ep")
"""The dimensions whose size `workload.traced_*` declares (PP: the number of stages)."""
RUN_KINDS: tuple[CommCategory, ...] = ("cp", "ep")
"""The dimensions that take the places next to TP in a stage (Megatron-LM's and torchtitan's order)."""
LAYOUT_ALLOWED = ("a Process Group Description naming the group's dimension, or workload.traced_tp and "
                  "traced_pp giving the traced job's layout")


@dataclass(frozen=True)
class TracedSizes:
    """The traced job's TP size, pipeline stages, CP and EP sizes, as the scenario declares them
    (`workload.traced_tp`, `traced_pp`, `traced_cp`, `traced_ep`), or as the trace's groups tell them; None
    where neither does."""

    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None


def named_kinds(description: str) -> set[CommCategory]:
    """The dimensions a group's description names among its words."""
    return {GROUP_WORDS[word] for word in re.split(r"[^a-z]+", description.lower()) if word in GROUP_WORDS}


def named_kind(description: str) -> CommCategory | None:
    """The dimension a group's description names (the first of GROUP_KINDS among its words), None if none."""
    named = named_kinds(description)
    return next((kind for kind in GROUP_KINDS if kind in named), None)


class Transfer(NamedTuple):
    """A point-to-point transfer as the layout sees it: its sender, its receiver and its process group's
    description ('' where the trace tells none)."""

    src: int
    dst: int
    description: str


@dataclass(frozen=True)
class Dimensions:
    """The dimension each process group of a trace (by name) and each of its point-to-point transfers counts as,
    each classified once."""

    groups: dict[str, CommCategory]
    transfers: dict[Transfer, CommCategory]
    sizes: TracedSizes = TracedSizes()
    """The traced job's layout as it was read: TP and pipeline stages (declared, told or inferred), CP and EP
    (declared or told; None where neither)."""
    stages_from: Transfer | None = None
    """The transfer, in a group whose description names no pipeline, whose ends' distance gave the stage size,
    where `traced_pp` does not declare it (None: declared, told by a pipeline group's transfer, or no pipeline
    transfer, one stage): an inference the run warns of."""


def _transfer_kind(transfer: Transfer, sizes: TracedSizes, cp_groups: tuple[frozenset[int], ...]) -> CommCategory:
    """The dimension a point-to-point transfer serves: the one its group's description names, else context
    parallelism where its two ends are in one CP group (a ring attention's sends in a group named only by
    number: the ends lie in a group described as CP, ``cp_groups``, or in a CP group of the job's TP and CP
    ``sizes``), else pipeline parallelism (neighbouring stages' hand-offs, where pipeline schedules put
    point-to-point transfers). A job of CP > 1 whose TP size is neither declared nor told, so that its CP groups
    are not known, is refused for such a transfer, naming `traced_tp`."""
    named = named_kind(transfer.description)
    if named is not None:
        return named
    ends = {transfer.src, transfer.dst}
    if any(ends <= members for members in cp_groups):
        return "cp"
    cp, tp = sizes.cp, sizes.tp
    if cp is None or cp == 1:
        return "pp"
    if tp is None:
        raise ScenarioError(f"the traced job has context parallelism of {cp} and a TP size not told, so whether "
                            f"its transfer from rank {transfer.src} to rank {transfer.dst} is the CP ring's or a "
                            "pipeline hand-off is unknown (its CP groups follow from the TP size)",
                            field="workload.trace", allowed="workload.traced_tp: the traced job's TP size (1 "
                            "where it has none), or Process Group Descriptions naming the CP groups")
    block = tp * cp
    return "cp" if transfer.src // block == transfer.dst // block and transfer.src % tp == transfer.dst % tp \
        else "pp"


def dimensions(groups: dict[str, ProcessGroup], world: int, transfers: Iterable[Transfer], declared: TracedSizes,
               stated: Mapping[str, ProcessGroup] | None = None,
               all_to_alls: Mapping[str, bool] | None = None) -> Dimensions:
    """The dimension each of ``groups`` counts as: the one its description names, else the one its ranks vary
    along in the layout of a ``world``-rank job with the sizes ``declared``, else told by the descriptions of
    these and the other ``stated`` groups (those the traces list but no collective uses, by name), else inferred
    (a TP size inferred 1 is refused where a numbered stated group is shaped as TP's, _refuse_idle_tp). Each
    of the ``transfers`` is classified once (_transfer_kind); only those that serve pipeline parallelism tell the
    stages. ``all_to_alls``: the groups that run all-to-alls, each with whether one splits unevenly; neither TP
    nor DP runs one, so such a group is CP (a Ulysses attention's) or EP (a token dispatch), EP where it splits
    unevenly."""
    stated = stated or {}
    listed = [*groups.values(), *stated.values()]
    sizes = _told_sizes(declared, listed)
    cp_groups = tuple(frozenset(group.members) for group in listed if named_kinds(group.description) == {"cp"})
    kinds = {transfer: _transfer_kind(transfer, sizes, cp_groups) for transfer in dict.fromkeys(transfers)}
    pipeline = [transfer for transfer, kind in kinds.items() if kind == "pp"]
    all_to_alls = all_to_alls or {}
    identified = _identified(listed, [(groups[name], uneven) for name, uneven in all_to_alls.items() if name in groups],
                             sizes)
    named = {name: named_kind(group.description) for name, group in groups.items()}
    unnamed = {name: group.members for name, group in groups.items() if named[name] is None}
    stage, stages_from = _stage_size(world, pipeline, sizes.pp)
    if declared.pp is not None and declared.tp is None and sizes.tp is not None and stage % sizes.tp:
        raise ScenarioError(f"{declared.pp} pipeline stages of {_ranks(stage)} cannot hold the trace's TP groups of "
                            f"{_ranks(sizes.tp)}", field="workload.traced_pp",
                            allowed="a number of stages whose ranks TP "
                            f"{sizes.tp} divides: a divisor of {world // sizes.tp}")
    tensor = _tp_size(unnamed, stage, world, sizes, all_to_alls)
    _check_declared_room(declared, listed, world, stage, tensor, sizes.cp)
    if sizes.tp is None and tensor == 1:
        _refuse_idle_tp(stated, stage)
    return Dimensions(_group_kinds(named, unnamed, world, stage, tensor, sizes, all_to_alls, identified),
                      kinds, TracedSizes(tensor, world // stage, sizes.cp, sizes.ep), stages_from)


def _check_declared_room(declared: TracedSizes, listed: list[ProcessGroup], world: int, stage: int, tensor: int,
                         cp: int | None) -> None:
    """Refuse, at its own line, a declared CP size that does not divide a pipeline stage beside TP, and declared
    sizes that leave the traced job less data parallelism than a group the trace describes as data-parallel
    alone spans (TP 2 x CP 2 on 4 ranks beside `mesh_dp` groups of 2): the trace and the scenario describe
    different jobs. The refusal names the first declared of traced_cp, traced_pp and traced_tp."""
    if declared.cp is not None and stage % (tensor * declared.cp):
        raise ScenarioError(f"TP {tensor} x CP {declared.cp} does not divide the traced job's pipeline stages of "
                            f"{_ranks(stage)}", field="workload.traced_cp",
                            allowed=f"a divisor of {stage // tensor}" if stage % tensor == 0 else "traced_cp left out")
    field = next((kind for kind in ("cp", "pp", "tp") if getattr(declared, kind) is not None), None)
    if field is None:
        return
    degree = stage // (tensor * (cp or 1))
    for group in listed:
        size = len(set(group.members))
        if named_kinds(group.description) == {"dp"} and size > 1 and degree % size:
            raise ScenarioError(f"the trace's process group {group.description!r} is data-parallel over "
                                f"{_ranks(size)}, but TP {tensor} x CP {cp or 1} x PP {world // stage} on the traced "
                                f"job's {_ranks(world)} leave data parallelism of {degree}",
                                field=f"workload.traced_{field}", allowed=f"sizes that leave the trace's data-parallel "
                                f"groups room, or traced_{field} left out")


def _identified(listed: list[ProcessGroup], exchanging: list[tuple[ProcessGroup, bool]],
                sizes: TracedSizes) -> frozenset[CommCategory]:
    """CP and EP where the trace tells their groups apart from the gradients' groups of the same ranks: a group
    described as that dimension alone, or one of the ``exchanging`` groups (those running all-to-alls: a Ulysses
    attention's, a token dispatch's, each with whether one splits unevenly) that its description, else its size
    alone (_run_reading), gives that dimension: with CP and EP of one size, an EP group's uneven dispatch
    identifies EP, not CP."""
    named = {kind for group in listed for kind in RUN_KINDS if named_kinds(group.description) == {kind}}
    exchanged = {named_kind(group.description) or _run_reading(len(set(group.members)), sizes, uneven)
                 for group, uneven in exchanging}
    return frozenset(named | {kind for kind in RUN_KINDS if kind in exchanged})


def _group_kinds(named: dict[str, CommCategory | None], unnamed: dict[str, tuple[int, ...]], world: int, stage: int,
                 tensor: int, sizes: TracedSizes, all_to_alls: Mapping[str, bool],
                 identified: frozenset[CommCategory]) -> dict[str, CommCategory]:
    """The dimension each group counts as: the one its description ``named``, else its ranks' in pipeline stages
    of ``stage`` ranks with TP ``tensor`` (``unnamed``: those groups' ranks); ``identified``: the dimensions among
    CP and EP whose groups the trace tells apart (_identified). The group of every rank is dp (the default group)
    but where the TP, PP and CP sizes, declared or read, leave the job no data parallelism (TP x CP x PP = its
    ranks, as the traced dp in the summary and `workload.dp`'s refusal read them): it is then classified as any
    group (over two pipeline stages of one rank each, pp), so a CP that spans the job is refused as one that fills
    a stage is (_varying_kind)."""
    kinds = dict(named)
    no_dp = tensor * (sizes.cp or 1) * (world // stage) == world
    for name, ranks in unnamed.items():
        default = len(set(ranks)) == world and name not in all_to_alls
        kinds[name] = (_varying_kind(name, tuple(sorted(ranks)), tensor, stage, sizes, all_to_alls.get(name),
                                     identified) if no_dp or not default else "dp")
    return {name: kind or "dp" for name, kind in kinds.items()}


def _told_sizes(declared: TracedSizes, groups: list[ProcessGroup]) -> TracedSizes:
    """Each size as declared, else as the groups whose description names that dimension alone tell it (their
    size, where they agree; PP: the number of stages a pipeline group spans), TP also as the rank stride of such
    CP groups (CP takes the places next to TP). A declared size that such groups contradict is refused: the
    trace and the scenario describe different jobs."""
    told: dict[CommCategory, dict[int, str]] = {}
    strides: set[int] = set()
    for group in groups:
        dims = named_kinds(group.description)
        if len(dims) == 1 and group.members:
            kind = dims.pop()
            told.setdefault(kind, {}).setdefault(len(set(group.members)), group.description)
            if kind == "cp" and len(group.members) > 1:
                strides.add(_stride(group.members))
    sizes = {}
    for kind in SIZED_KINDS:
        value, sizes_told = getattr(declared, kind), told.get(kind, {})
        if value is not None and sizes_told and set(sizes_told) != {value}:
            size, description = next((size, desc) for size, desc in sizes_told.items() if size != value)
            raise ScenarioError(f"the trace's process group {description!r} has {_ranks(size)}, but the scenario "
                                f"declares {kind.upper()} of {value}", field=f"workload.traced_{kind}",
                                allowed=f"{size}, as the trace's groups say, or traced_{kind} left out")
        sizes[kind] = value if value is not None else next(iter(sizes_told)) if len(sizes_told) == 1 else None
    if sizes["tp"] is None and len(strides) == 1 and 0 not in strides:
        sizes["tp"] = strides.pop()
    return TracedSizes(**sizes)


def _stage_size(world: int, transfers: list[Transfer], pp: int | None) -> tuple[int, Transfer | None]:
    """Ranks per pipeline stage: the job's share of `traced_pp` stages, else the nearest pair of ranks that
    exchange point-to-point transfers (neighbouring stages; of pairs as near, one in a group described as a
    pipeline first), else the whole job; with the transfer that told it
    where its group's description does not name a pipeline (None where none did, or one that did)."""
    if pp is not None:
        if world % pp:
            raise ScenarioError(f"the traced job spans {_ranks(world)}, which do not split into {pp} pipeline stages",
                                field="workload.traced_pp", allowed=f"a divisor of {world}")
        return world // pp, None
    apart = [transfer for transfer in transfers if transfer.src != transfer.dst]
    if not apart:
        return world, None
    nearest = min(apart, key=lambda transfer: (abs(transfer.src - transfer.dst),
                                               named_kind(transfer.description) != "pp", transfer.src, transfer.dst))
    stage = abs(nearest.src - nearest.dst)
    if world % stage:
        raise ScenarioError(f"the trace's nearest point-to-point transfer is {stage} ranks apart, which does not split "
                            f"its {world} ranks into pipeline stages, so its process groups' dimensions are unknown",
                            field="workload.trace", allowed=LAYOUT_ALLOWED)
    return stage, None if named_kind(nearest.description) == "pp" else nearest


def _tp_size(groups: dict[str, tuple[int, ...]], stage: int, world: int, sizes: TracedSizes,
             all_to_alls: Mapping[str, bool]) -> int:
    """The TP size: `traced_tp` (or as the trace's groups tell it), else the size of the groups of consecutive
    ranks inside a stage and smaller than it, else 1. A group of a whole stage of consecutive ranks, where there
    is more than one stage and no smaller such group, could be TP (no DP) as well as DP (no TP): refused unless
    `traced_tp` says which. So is a run whose length is the CP or EP size (declared or told), which could be TP
    or, without TP, CP or EP, unless only one of the two readings makes every group one of its layout's
    (_fitting_tp). A group running all-to-alls (CP's or EP's) is no TP group."""
    tp = sizes.tp
    if tp is not None:
        if stage % tp:
            raise ScenarioError(f"tensor parallelism of {tp} does not divide the traced job's pipeline stages of "
                                f"{_ranks(stage)}", field="workload.traced_tp", allowed=f"a divisor of {stage}")
        return tp
    runs = {group: len(ranks) for group, ranks in groups.items() if group not in all_to_alls
            and len(ranks) > 1 and _stride(ranks) == 1 and min(ranks) // stage == max(ranks) // stage}
    lengths = sorted({size for size in runs.values() if size < stage})
    if len(lengths) > 1:
        raise ScenarioError(f"process groups of {' and '.join(map(str, lengths))} consecutive ranks "
                            f"({', '.join(repr(group) for group, size in runs.items() if size < stage)}): "
                            "which is tensor parallelism is unknown", field="workload.trace",
                            allowed="workload.traced_tp: the traced job's TP size, or Process Group Descriptions")
    if lengths:
        return _fitting_tp(groups, next(group for group, size in runs.items() if size == lengths[0]), stage, world,
                           sizes)
    whole = [group for group, size in runs.items() if size == stage]
    if whole and stage < world:
        raise ScenarioError(f"process group {whole[0]!r} is all {stage} ranks of a pipeline stage: tensor parallelism "
                            "without data parallelism, or the other way round, is unknown", field="workload.trace",
                            allowed=f"workload.traced_tp: {stage} or 1 (the traced job's TP size), or Process Group "
                            "Descriptions")
    return 1


def _refuse_idle_tp(stated: Mapping[str, ProcessGroup], stage: int) -> None:
    """Refuse a TP size inferred 1 (neither declared nor told, and no group in use shaped as TP's) where a group
    that the trace lists but no collective uses (``stated``), named only by number, is a run of consecutive ranks
    inside a pipeline stage and shorter than it, as a TP group is: the TP groups of a job whose TP traffic the
    trace does not record (Transformer Engine's userbuffers, a trace without its forward) look so, and TP 1 would
    then be a guess. (A numbered group carrying pipeline transfers spans two stages; one carrying CP's is in a CP
    group whose stride tells TP.)"""
    for name, group in stated.items():
        ranks = sorted(set(group.members))
        if (named_kind(group.description) is None and 1 < len(ranks) < stage and _stride(tuple(ranks)) == 1
                and ranks[0] // stage == ranks[-1] // stage):
            raise ScenarioError(f"process group {name!r} (ranks {ranks}) is listed but used by no op; it is "
                                f"{len(ranks)} consecutive ranks inside a pipeline stage of {stage}, as a TP group "
                                f"is, and the groups in use tell no TP size: TP 1 or {len(ranks)} is unknown",
                                field="workload.trace", allowed="workload.traced_tp: the traced job's TP size (1 "
                                "where it has none), or Process Group Descriptions naming the groups' dimensions")


def _fitting_tp(groups: dict[str, tuple[int, ...]], run: str, stage: int, world: int, sizes: TracedSizes) -> int:
    """The TP size where the runs of consecutive ranks inside a stage are as long as ``run``, one of them: that
    length, or 1 where the CP or EP size is that length too (the runs are then CP or EP groups of a job without
    TP), whichever alone makes every group of more than one rank a whole group of its layout (_fits); refused
    where both do, or neither."""
    ranks = sorted(groups[run])
    length = len(ranks)
    shared = [kind for kind in RUN_KINDS if getattr(sizes, kind) == length]
    if not shared:
        return length
    inner = length
    fitting = [tp for tp in (length, 1) if stage % (tp * inner) == 0
               and all(_fits(members, tp, inner, stage, world) for members in groups.values() if len(set(members)) > 1)]
    if len(fitting) == 1:
        return fitting[0]
    names = " or ".join({"cp": "context", "ep": "expert"}[kind] for kind in shared)
    raise ScenarioError(f"process group {run!r} (ranks {ranks}) is {length} consecutive ranks inside a "
                        f"pipeline stage: tensor parallelism of {length}, or {names} parallelism of {length} without "
                        "TP, is unknown", field="workload.trace",
                        allowed=f"workload.traced_tp: {length} or 1 (the traced job's TP size), or Process Group "
                        "Descriptions")


def _fits(ranks: tuple[int, ...], tp: int, inner: int, stage: int, world: int) -> bool:
    """Whether ``ranks`` are a whole group of the layout of TP ``tp``, then ``inner`` places (CP or EP), then the
    rest of a stage of ``stage`` ranks, then the stages: every rank that differs from one of them only along the
    places they vary along is one of them (a group of 2 of a stage's 4 data-parallel places is no group)."""
    places = [(rank % tp, rank // tp % inner, rank % stage // (tp * inner), rank // stage) for rank in ranks]
    extents = (tp, inner, stage // (tp * inner), world // stage)
    varying = [len({place[axis] for place in places}) > 1 for axis in range(4)]
    whole = 1
    for axis, varies in enumerate(varying):
        whole *= extents[axis] if varies else 1
    return len(set(ranks)) == whole


def _varying_kind(name: str, ranks: tuple[int, ...], tp: int, stage: int, sizes: TracedSizes,
                  uneven: bool | None, identified: frozenset[CommCategory]) -> CommCategory:
    """The first of dp, cp (or ep), tp, pp that the group's ranks vary along, with TP groups of ``tp``
    consecutive ranks inside pipeline stages of ``stage`` ranks; a group of one rank (no traffic) counts as dp.
    ``uneven``: None where the group runs no all-to-all, else whether one splits unevenly; a group running them
    over the whole rest of a stage is CP or EP, not DP. One running none there is DP, but where CP or EP of
    that size (declared or told) has no group the trace tells apart (``identified``): refused (_gradients_or)."""
    places = [(rank % tp, rank % stage // tp, rank // stage) for rank in ranks]
    rest = sorted({place[1] for place in places})
    if len(rest) > 1:
        if rest != list(range(rest[0], rest[0] + len(rest))):
            return "dp"
        if len(rest) == stage // tp and uneven is None:
            filling = [kind for kind in RUN_KINDS if getattr(sizes, kind) == len(rest) and kind not in identified]
            if filling:
                raise _gradients_or(name, ranks, len(rest), filling[0])
            return "dp"
        return _run_kind(name, ranks, len(rest), sizes, uneven is True)
    if len({place[0] for place in places}) > 1:
        return "tp"
    if len({place[2] for place in places}) > 1:
        return "pp"
    return "dp"


def _gradients_or(name: str, ranks: tuple[int, ...], length: int, kind: CommCategory) -> ScenarioError:
    """The refusal of a numbered group over the whole rest of its stage, running no all-to-all, where CP or EP
    (``kind``) of that ``length`` spans those ranks too: its collectives cannot tell its own group from the
    gradients'. Megatron-LM reduces gradients over DATA_PARALLEL_GROUP_WITH_CP, the CP group's ranks where DP is 1,
    while its CP group runs all-gathers and reduce-scatters (Transformer Engine's all_gather variant) and the
    loss's all-reduce; where EP spans a stage's data-parallel ranks, its all-gather token dispatcher runs
    all-gathers and reduce-scatters over the DP group's ranks. What tells the others apart (they are then the
    gradients') is what _identified reads: a group described as that dimension alone, or one running all-to-alls
    that its description, else its size and splits (_run_reading), give that dimension; the allowed text names
    the two a user can give: the size, or the descriptions."""
    group = f"process group {name!r} (ranks {list(ranks)}) spans its pipeline stage"
    if kind == "cp":
        problem = (f"{group}, as CP of {length} does (no DP), and runs no all-to-all: whether it is the CP group or "
                   "the gradients' is unknown")
    else:
        problem = (f"{group}, as EP of {length} does beside DP, and runs no all-to-all: whether it is the EP group or "
                   "the DP group is unknown")
    return ScenarioError(problem, field="workload.trace",
                         allowed=f"workload.traced_{kind} where the traced job's {kind.upper()} is not {length}, or a "
                         "Process Group Description naming the group's dimension", reads=(f"workload.traced_{kind}",))


def _run_reading(length: int, sizes: TracedSizes, uneven: bool) -> CommCategory | None:
    """CP or EP, whichever alone of the two sizes (a size not told being any) can be ``length`` for a group over
    that many places next to TP (EP alone where its all-to-alls split ``uneven``ly); None where both or neither
    can."""
    could_cp, could_ep = sizes.cp in (None, length) and not uneven, sizes.ep in (None, length)
    if could_cp == could_ep:
        return None
    return "cp" if could_cp else "ep"


def _run_kind(name: str, ranks: tuple[int, ...], length: int, sizes: TracedSizes, uneven: bool) -> CommCategory:
    """A group over ``length`` consecutive places next to TP (short of its stage's, or all of them where the
    group runs all-to-alls): context parallelism, or expert parallelism (Megatron-LM and torchtitan
    put both there), whichever of the two sizes can be ``length`` (EP alone where an all-to-all of the group
    splits ``uneven``ly, as CP's never do); refused where both can (a size not told can be any) or neither."""
    reading = _run_reading(length, sizes, uneven)
    if reading is not None:
        return reading
    could_cp = sizes.cp in (None, length) and not uneven
    group = (f"process group {name!r} (ranks {list(ranks)}) spans {length} consecutive places next to tensor "
             "parallelism in its pipeline stage")
    describe = "Process Group Descriptions naming the group's dimension"
    if not could_cp:
        why = (f"its all-to-alls split unevenly, as context parallelism's do not, and the traced job's expert "
               f"parallelism is {sizes.ep}" if uneven
               else f"the traced job's context parallelism is {sizes.cp} and its expert parallelism {sizes.ep}")
        raise ScenarioError(f"{group}, but {why}", field="workload.trace", allowed=describe)
    if sizes.cp is not None and sizes.ep is not None:
        raise ScenarioError(f"{group}: context and expert parallelism are both {length}, so which it is is unknown",
                            field="workload.trace", allowed=describe)
    for told, kind, other, untold in ((sizes.cp, "context", "expert", "ep"), (sizes.ep, "expert", "context", "cp")):
        if told is not None:
            raise ScenarioError(f"{group}: {kind} parallelism of {length}, or {other} parallelism, whose size is not "
                                "told", field="workload.trace", allowed=f"workload.traced_{untold}: the traced job's "
                                f"{untold.upper()} size (1 where it has none), or {describe}")
    raise ScenarioError(f"{group}: context or expert parallelism is unknown", field="workload.trace",
                        allowed=f"workload.traced_cp and traced_ep together (one alone leaves the other unknown): the "
                        f"traced job's CP and EP sizes (1 where it has none; {length} for this group's), or {describe}")


def _ranks(count: int) -> str:
    """'1 rank', '2 ranks'."""
    return f"{count} rank{'s' if count != 1 else ''}"


def _stride(ranks: tuple[int, ...]) -> int:
    """The step between a group's sorted ranks where it is one, else 0."""
    ordered = sorted(ranks)
    steps = {b - a for a, b in zip(ordered, ordered[1:], strict=False)}
    return steps.pop() if len(steps) == 1 else 0
