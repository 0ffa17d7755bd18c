"""Which parallel dimension each process group of a trace serves, for the metrics' traffic per kind: the one its
description names, else the one its ranks vary along in the traced job's layout.

The layout is Megatron-LM's and torchtitan's rank order: tensor parallelism innermost (TP groups are runs of
consecutive ranks), then context and data parallelism, pipeline stages outermost (a stage is a run of
consecutive ranks). The pipeline stage's size is `workload.traced_pp`'s share of the traced job, else the
smallest rank distance of a point-to-point transfer (neighbouring stages), else the whole job; the TP size is
`workload.traced_tp`, else the size of the groups of consecutive ranks smaller than a stage (the TP groups
every TP job's trace uses), else 1. A rank is then (t, r, p): its place in its TP group, in the rest of its
stage (context and data parallelism, r), and its stage; a group counts as the first of dp, cp, tp, pp that
its ranks vary along, as a description naming several does: r varying over the whole rest of a stage or with
a stride is dp, over a run of consecutive values short of it cp; t alone tp; p alone pp. The group of every
rank counts as dp (the default group: a DDP or FSDP job's gradients, a step's loss), unless the declared
sizes leave the job no data parallelism (TP x PP = its ranks).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from simulator.errors import ScenarioError
from simulator.program.ops import CommCategory

GROUP_WORDS: dict[str, CommCategory] = {"dp": "dp", "data": "dp", "fsdp": "dp", "ddp": "dp", "ep": "ep",
                                        "expert": "ep", "cp": "cp", "context": "cp", "tp": "tp", "tensor": "tp",
                                        "pp": "pp", "pipeline": "pp"}
"""Words of a process group's description (torchtitan's mesh names `dp_shard_cp`, Megatron-LM's
`TENSOR_MODEL_PARALLEL_GROUP`) -> the dimension they name."""
GROUP_KINDS: tuple[CommCategory, ...] = ("dp", "ep", "cp", "tp", "pp")
"""Which dimension a group serving several counts as: a group spanning data parallelism carries gradients
(`DATA_PARALLEL_GROUP_WITH_CP`, `dp_shard_cp`, `EXPERT_DATA_PARALLEL_GROUP`), one spanning experts their
tokens (`TENSOR_AND_EXPERT_PARALLEL_GROUP`)."""
LAYOUT_ALLOWED = ("a Process Group Description naming the group's dimension, or workload.traced_tp and "
                  "traced_pp giving the traced job's layout")


def named_kind(description: str) -> CommCategory | None:
    """The dimension a group's description names (the first of GROUP_KINDS among its words), None if none."""
    named = {GROUP_WORDS[word] for word in re.split(r"[^a-z]+", description.lower()) if word in GROUP_WORDS}
    return next((kind for kind in GROUP_KINDS if kind in named), None)


def group_kinds(members: dict[str, tuple[int, ...]], descriptions: dict[str, str], world: int,
                transfers: Iterable[tuple[int, int]], tp: int | None, pp: int | None) -> dict[str, CommCategory]:
    """The dimension each group counts as: the one its description names, else the one its ranks vary along
    in the layout of a ``world``-rank job with the given (or inferred) TP and PP sizes."""
    kinds = {group: named_kind(descriptions.get(group, "")) for group in members}
    unnamed = {group: ranks for group, ranks in members.items() if kinds[group] is None}
    if not unnamed:
        return {group: kind or "dp" for group, kind in kinds.items()}
    stage = _stage_size(world, list(transfers), pp)
    tensor = _tp_size(unnamed, stage, world, tp)
    no_dp = (tp is not None or pp is not None) and stage == tensor
    for group, ranks in unnamed.items():
        whole = len(set(ranks)) == world
        kinds[group] = _varying_kind(tuple(sorted(ranks)), tensor, stage) if no_dp or not whole else "dp"
    return {group: kind or "dp" for group, kind in kinds.items()}


def _stage_size(world: int, transfers: list[tuple[int, int]], pp: int | None) -> int:
    """Ranks per pipeline stage: the job's share of `traced_pp` stages, else the nearest pair of ranks that
    exchange point-to-point transfers (neighbouring stages), else the whole job."""
    if pp is not None:
        if world % pp:
            raise ScenarioError(f"the traced job spans {world} ranks, which do not split into {pp} pipeline stages",
                                field="workload.traced_pp", allowed=f"a divisor of {world}")
        return world // pp
    distances = [abs(src - dst) for src, dst in transfers if src != dst]
    if not distances:
        return world
    stage = min(distances)
    if world % stage:
        raise ScenarioError(f"the trace's nearest point-to-point transfer is {stage} ranks apart, which does not split "
                            f"its {world} ranks into pipeline stages, so its process groups' dimensions are unknown",
                            field="workload.trace", allowed=LAYOUT_ALLOWED)
    return stage


def _tp_size(groups: dict[str, tuple[int, ...]], stage: int, world: int, tp: int | None) -> int:
    """The TP size: `traced_tp`, else the size of the groups of consecutive ranks inside a stage and smaller
    than it, else 1. A group of a whole stage of consecutive ranks, where there is more than one stage and no
    smaller such group, could be TP (no DP) as well as DP (no TP): refused unless `traced_tp` says which."""
    if tp is not None:
        if stage % tp:
            raise ScenarioError(f"tensor parallelism of {tp} does not divide the traced job's pipeline stages of "
                                f"{stage} ranks", field="workload.traced_tp", allowed=f"a divisor of {stage}")
        return tp
    runs = {group: len(ranks) for group, ranks in groups.items()
            if len(ranks) > 1 and _stride(ranks) == 1 and min(ranks) // stage == max(ranks) // stage}
    sizes = sorted({size for size in runs.values() if size < stage})
    if len(sizes) > 1:
        raise ScenarioError(f"process groups of {' and '.join(map(str, sizes))} consecutive ranks "
                            f"({', '.join(repr(group) for group, size in runs.items() if size < stage)}): "
                            "which is tensor parallelism is unknown", field="workload.trace",
                            allowed="workload.traced_tp: the traced job's TP size, or Process Group Descriptions")
    if sizes:
        return sizes[0]
    whole = [group for group, size in runs.items() if size == stage]
    if whole and stage < world:
        raise ScenarioError(f"process group {whole[0]!r} is all {stage} ranks of a pipeline stage: tensor parallelism "
                            "without data parallelism, or the other way round, is unknown", field="workload.trace",
                            allowed=f"workload.traced_tp: {stage} or 1 (the traced job's TP size), or Process Group "
                            "Descriptions")
    return 1


def _varying_kind(ranks: tuple[int, ...], tp: int, stage: int) -> CommCategory:
    """The first of dp, cp, tp, pp that the group's ranks vary along, with TP groups of ``tp`` consecutive ranks
    inside pipeline stages of ``stage`` ranks; a group of one rank (no traffic) counts as dp."""
    places = [(rank % tp, rank % stage // tp, rank // stage) for rank in ranks]
    rest = sorted({place[1] for place in places})
    if len(rest) > 1:
        consecutive = rest == list(range(rest[0], rest[0] + len(rest)))
        return "cp" if consecutive and len(rest) < stage // tp else "dp"
    if len({place[0] for place in places}) > 1:
        return "tp"
    if len({place[2] for place in places}) > 1:
        return "pp"
    return "dp"


def _stride(ranks: tuple[int, ...]) -> int:
    """The step between a group's sorted ranks where it is one, else 0."""
    ordered = sorted(ranks)
    steps = {b - a for a, b in zip(ordered, ordered[1:], strict=False)}
    return steps.pop() if len(steps) == 1 else 0
