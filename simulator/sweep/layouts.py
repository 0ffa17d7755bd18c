"""Candidate layouts of a training step and how each is checked without running it: the structural rules
(degrees that divide the cluster, the layers and the batch; TP inside an NVLink domain), the memory model, and
a quick step-time estimate, from the kernels and the program's collectives each timed alone (the MoE all-to-alls
beside their copies in the stage's other EP groups), that ranks the survivors before the simulator decides."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from pydantic import ValidationError

from simulator.collectives.names import AlgorithmChoice, Primitive, ProtocolChoice
from simulator.config.loader import (
    DEEPSPEED_REFUSES_PIPELINING,
    deepspeed_zero2_under_pipelining,
    validate_as_json,
    validation_error,
)
from simulator.config.parallelism_options import SCHEDULE_FIELD
from simulator.config.schema import Scenario
from simulator.config.yaml_source import parse_field
from simulator.engine.contention import NcclChannels
from simulator.errors import InputError
from simulator.parallel.context import ContextAttention, gathered_kv_op, ring_step_pairs
from simulator.parallel.experts import (
    ep_group,
    expert_gradient_reduction,
    expert_param_gather,
    expert_shard_groups,
    group_images,
)
from simulator.parallel.layout import DIMENSIONS, Layout, degrees_name
from simulator.parallel.overlap import regathers_input, tp_op
from simulator.parallel.passes import Pass
from simulator.parallel.program import StepPlan
from simulator.parallel.sharding import replica_group, shard_group
from simulator.parallel.work import Block, TpPattern, bound_share, gradient_buckets, layer_units
from simulator.program.contention import SmShare
from simulator.program.ops import COMPUTE_STREAM, CollectiveOp
from simulator.schedules.base import Action, Placement, stage_rank
from simulator.schedules.registry import serves_chunks
from simulator.schedules.timing import ScheduleOrder, execute, schedule_order
from simulator.simulation import NetworkSettings, alone_seconds, chain_ends, plan_cache, together_ends
from simulator.sweep.fields import with_values
from simulator.sweep.options import (
    RECOMPUTES,
    SEARCH_CP,
    SEARCH_MICRO_BATCHES,
    SEARCH_SHARDINGS,
    SEARCH_VIRTUAL_STAGES,
    Recompute,
    Sharding,
)
from simulator.sweep.tp_overlap import overlapped_tp_s, split_backward_excess_s
from simulator.topology.graph import Topology
from simulator.workload.calibrated import contention_share
from simulator.workload.memory_plan import stage_memory, tight_fit
from simulator.workload.stage_work import layers_per_stage, unsplit_layers_text
from simulator.workload.training import TrainingStep, build_training_step, tp_domains

GIB = 2.0**30
CollectiveShape = tuple[Primitive, tuple[int, ...], float]
"""A collective as `CollectiveTimes` times it: (op, group, bytes per rank)."""
Exchange = tuple[Primitive, tuple[int, ...], float, tuple[tuple[float, ...], ...]]
"""An uneven all-to-all as `CollectiveTimes.beside` times it: (op, group, bytes per rank, bytes per pair)."""
Span = tuple[float, tuple[CollectiveShape, ...]]
"""Seconds during which the collectives named run beside the compute (`sharded_microbatch_spans`)."""
PASSES = (Pass.FORWARD, Pass.BACKWARD, Pass.RECOMPUTE)
"""The passes of a block a micro-batch runs (the recompute where it has one)."""
OPENING_GATHERS = 2
"""The units whose gathers open each forward under PyTorch FSDP: its first unit's gather and the second's,
queued behind it, hold the forward's start (`microbatch_starts_s`), so a slot's spans leave them out
(`spans_beside_compute`)."""


ZERO2_HINT = "--sharding zero2 runs DeepSpeed's ZeRO-2, which reduce-scatters every micro-batch"
"""How a search gets ZeRO-2, said where a `--set` of `zero` or `reduce_every_microbatch` is refused."""
SPACE_FLAGS = {"tp": "--tp", "cp": "--cp", "pp": "--pp", "ep": "--ep", "virtual_stages": "--virtual-stages",
               "micro_batch": "--micro-batch", "sharding": "--sharding", "recompute": "--recompute"}
"""Each dimension of a layout with the `trainsim search` flag that lists its values in the search space."""
_TP, _CP, _PP = SPACE_FLAGS["tp"], SPACE_FLAGS["cp"], SPACE_FLAGS["pp"]
SEARCHED_FIELDS: dict[str, str] = {
    "parallelism.tp": _TP, "parallelism.cp": _CP, "parallelism.pp": _PP,
    "parallelism.dp": f"{_TP}, {_CP} and {_PP} (dp takes the GPUs they leave)",
    "parallelism.sequence_parallel": f"{_TP} (sequence parallelism is on whenever tp > 1)",
    "parallelism.zero": f"{SPACE_FLAGS['sharding']}; {ZERO2_HINT}", "parallelism.fsdp": SPACE_FLAGS["sharding"],
    "training.micro_batch": SPACE_FLAGS["micro_batch"], "training.recompute": SPACE_FLAGS["recompute"],
}
"""The scenario fields the search varies, each with the flag that gives its values: every candidate sets them
(`Candidate.overrides`), so a `--set` of one would be dropped (`search` refuses it). Not the virtual stages,
which a `--set` of a V schedule needs beside it for the scenario to load (`--virtual-stages` gives the values)."""


@dataclass(frozen=True, order=True)
class Candidate:
    """One layout: parallel degrees, interleaving depth, micro-batch size, sharding, recompute and the expert
    parallelism that splits each MoE layer's experts over ranks of the DP x CP group (1 for dense models)."""

    tp: int
    cp: int
    pp: int
    dp: int
    virtual_stages: int
    micro_batch: int
    sharding: Sharding
    recompute: Recompute
    ep: int = 1

    def overrides(self, schedule: str, ddp: dict | None = None, named: bool = True) -> dict[str, object]:
        """The scenario fields this layout sets: ``schedule`` (the scenario's) where it runs this many chunks
        per rank, else Megatron's 1F1B, interleaved with virtual stages, left to the scenario where one stage runs
        the default 1F1B and the scenario names no schedule (``named`` false), so that the run's outputs name no
        schedule the scenario does not; sequence parallelism whenever tp > 1 (Megatron's practice); and of the
        base's ``ddp`` section, the sharding options its sharding cannot take turned off (`sharding_options`). The
        base's other `parallelism` fields stay as written; its `ep` is the space's default (`SearchSpace.ep`)."""
        runs = self.schedule(schedule)
        return {
            "parallelism.tp": self.tp, "parallelism.cp": self.cp, "parallelism.pp": self.pp,
            "parallelism.dp": self.dp, "parallelism.ep": self.ep, "parallelism.sequence_parallel": self.tp > 1,
            **({SCHEDULE_FIELD: runs} if self.pp > 1 or named or runs != "1f1b" else {}),
            "parallelism.pipeline.virtual_stages": self.virtual_stages,
            "parallelism.zero": int(self.sharding[-1]) if self.sharding != "fsdp" else 0,
            "parallelism.fsdp": "full_shard" if self.sharding == "fsdp" else None,
            **self.sharding_options(ddp or {}),
            "training.micro_batch": self.micro_batch, "training.recompute": self.recompute,
        }

    def sharding_options(self, ddp: dict) -> dict[str, object]:
        """The base's ``ddp`` options (its section as written) that this layout's sharding cannot take, turned
        off: `overlap_param_gather` but under ZeRO-1/2 (the published Llama 3 405B rows set it, which ZeRO-0 and
        FSDP refuse), `reduce_every_microbatch: true` but under ZeRO-2 and FSDP without a pipeline (pipelined
        FSDP reduces once per stage). ZeRO-2 reduce-scatters every micro-batch's gradients (DeepSpeed's ZeRO-2)
        unless the base chooses: left to Megatron's default it would hold ZeRO-1's memory and send its traffic,
        the same layout as ZeRO-1 searched twice."""
        options: dict[str, object] = {}
        if self.sharding == "zero2" and ddp.get("reduce_every_microbatch") is None:
            options["parallelism.ddp.reduce_every_microbatch"] = True
        if ddp.get("overlap_param_gather") and self.sharding not in ("zero1", "zero2"):
            options["parallelism.ddp.overlap_param_gather"] = False
        if ddp.get("reduce_every_microbatch") and not (self.sharding == "zero2"
                                                       or (self.sharding == "fsdp" and self.pp == 1)):
            options["parallelism.ddp.reduce_every_microbatch"] = None
        return options

    def schedule(self, base: str) -> str:
        """The pipeline schedule this layout runs from a scenario whose schedule is ``base``: that one where it
        runs this many chunks per rank, else Megatron's 1F1B, interleaved with virtual stages."""
        v = self.virtual_stages
        return base if serves_chunks(base, v) else "interleaved" if v > 1 else "1f1b"

    def label(self, schedule: str = "1f1b", base: str | None = None) -> str:
        """The layout in one line: its degrees spelled as `trainsim run` spells them (`degrees_name`), then the
        pipeline ``schedule`` it runs where that is neither 1F1B nor, with virtual stages, interleaved 1F1B (a V
        schedule's v2 and interleaved v4 are different algorithms) or differs from the scenario's ``base`` (the
        fallback `schedule` gives), the interleaving depth, micro-batch size, sharding and recompute: 'TP1 CP1
        PP2 DP4 v2 mb1 zero1 recompute=none' from an interleaved base ('... interleaved v2 ...' from a 1F1B one),
        'TP2 CP1 PP2 DP8 dualpipev v2 mb1 zero1 recompute=none', from a DualPipeV base 'TP2 CP1 PP2 DP8
        interleaved v4 mb1 zero1 recompute=none'."""
        differs = schedule not in ("1f1b", "interleaved") or (base is not None and schedule != base)
        named = f" {schedule}" if self.pp > 1 and differs else ""
        interleave = f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
        return (f"{degrees_name(self.tp, self.cp, self.pp, self.dp, self.ep)}{named}{interleave} "
                f"mb{self.micro_batch} {self.sharding} recompute={self.recompute}")


CANDIDATE_FIELDS = tuple(Candidate(1, 1, 1, 1, 1, 1, "zero0", "none").overrides(
    "1f1b", {"overlap_param_gather": True, "reduce_every_microbatch": True}))
"""Every field a candidate may set, in the order `trainsim run`'s `--set`s write them (`search.run_overrides`):
those of a ZeRO-0 layout from a base with both sharding options on, which it turns off."""


class Pruned(StrEnum):
    """Why the search did not simulate a layout, by kind: the one definition of the set (candidates.csv's
    `reason_kind`, the counts `trainsim search` prints), each kind with its words (`label`); each layout's own
    reason, with its figures, is a `Pruning`'s text."""

    label: str
    """The kind in words, as the search's summary prints it."""

    def __new__(cls, value: str, label: str) -> Pruned:
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label
        return member

    TP_SPANS_DOMAINS = "tp_spans_hosts", "a TP group spans NVLink domains"
    LAYERS_DO_NOT_SPLIT = "layers_do_not_split", "layers do not split over pp x virtual stages"
    BATCH_DOES_NOT_DIVIDE = "batch_does_not_divide", "global batch not a multiple of dp x micro-batch"
    EP_DOES_NOT_DIVIDE = "ep_does_not_divide", "ep does not divide dp x cp"
    REFUSED = "refused", "refused by the simulator's checks, or by every framework"
    OUT_OF_MEMORY = "out_of_memory", "out of memory"
    SAME_LAYOUT = "same_layout", "the same layout as another sharding (dp x cp = 1)"
    DOMINATED = "dominated", "dominated by a lighter recompute that fits"
    BELOW_TOP = "below_top", "estimate ranks below --top"


@dataclass(frozen=True)
class Pruning:
    """Why one layout was pruned: its kind and the reason in full, with its figures."""

    kind: Pruned
    reason: str


@dataclass(frozen=True)
class Checked:
    """A candidate after the checks: its scenario data, why it was pruned (None if it survived), its peak memory
    and estimated tokens/s (0 when not known), and whether that peak fits with less room than the memory plan
    leaves out (`memory_plan.tight_fit`; the memory model's peak is the simulation's)."""

    candidate: Candidate
    data: dict
    pruning: Pruning | None = None
    peak_memory_gib: float = 0.0
    estimate_tokens_per_s: float = 0.0
    memory_tight: bool = False

    @property
    def reason(self) -> str:
        """Why it was pruned, in full ('' if it survived)."""
        return self.pruning.reason if self.pruning is not None else ""


@dataclass(frozen=True)
class SearchSpace:
    """The values each dimension may take; empty tuples mean the defaults derived from the cluster and model
    (for `ep`, the base scenario's `parallelism.ep`)."""

    tp: tuple[int, ...] = ()
    cp: tuple[int, ...] = SEARCH_CP
    pp: tuple[int, ...] = ()
    virtual_stages: tuple[int, ...] = SEARCH_VIRTUAL_STAGES
    micro_batch: tuple[int, ...] = SEARCH_MICRO_BATCHES
    sharding: tuple[Sharding, ...] = SEARCH_SHARDINGS
    recompute: tuple[Recompute, ...] = RECOMPUTES
    ep: tuple[int, ...] = ()


def ddp_turned_off(ddp: dict, candidates: list[Candidate]) -> dict[str, list[str]]:
    """Each option of the base's ``ddp`` section (as written) that some of ``candidates`` turn off
    (`Candidate.sharding_options`), with the shardings whose layouts do: a sharding's name where all its layouts
    do, '<sharding> with pp > 1' where its pipelined ones alone do."""
    turned: dict[str, list[str]] = {}
    for sharding in dict.fromkeys(c.sharding for c in candidates):
        layouts = [c for c in candidates if c.sharding == sharding]
        for name in sorted({name for c in layouts for name in c.sharding_options(ddp)}):
            if name.rsplit(".", 1)[-1] not in ddp:
                continue
            off = [c for c in layouts if name in c.sharding_options(ddp)]
            whole = len(off) == len(layouts) or any(c.pp == 1 for c in off)
            turned.setdefault(name, []).append(sharding if whole else f"{sharding} with pp > 1")
    return turned


def powers_of_two(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit``."""
    return tuple(2**k for k in range(limit.bit_length()) if 2**k <= limit)


def nvlink_domain_gpus(topology: Topology) -> int:
    """How many GPUs share the largest NVLink domain: a host's on a DGX (8), the whole rack on GB200 NVL72 (72,
    where a compute tray holds 4; a shorter last rack, `last_rack_trays`, holds fewer)."""
    return int(np.bincount(topology.gpu_domain_array).max())


def tp_spans_domains(layout: Layout, domains: np.ndarray) -> Pruning | None:
    """Why a layout's TP groups leave their NVLink domain (None where every group stays inside one), by the rule
    `trainsim run` warns by (`tp_domains`: any group, not GPU 0's alone, so 16-GPU groups over two 72-GPU racks,
    one of which straddles them, are caught): naming a straddling group's GPUs and its domains (rank r in
    ``domains[r]``)."""
    spanned = tp_domains(layout, domains)
    if spanned == 1:
        return None
    group = next(group for group in (layout.group("tp", rank) for rank in range(layout.world))
                 if len(set(domains[list(group)].tolist())) > 1)
    ids = sorted(set(domains[list(group)].tolist()))
    sizes = sorted({int(np.count_nonzero(domains == d)) for d in ids})
    if sizes == [1]:
        return Pruning(Pruned.TP_SPANS_DOMAINS,
                       f"TP {layout.tp} spans NVLink domains: the TP group of GPUs {_gpus(group)} shares no NVLink "
                       "(a host without NVLink), so its collectives would run over PCIe or the network every "
                       "layer (seed rule 1)")
    each = f"{sizes[0]} GPUs each" if len(sizes) == 1 else f"{' and '.join(map(str, sizes))} GPUs"
    return Pruning(Pruned.TP_SPANS_DOMAINS,
                   f"TP {layout.tp} spans NVLink domains: the TP group of GPUs {_gpus(group)} spans {spanned} "
                   f"NVLink domains ({_first_few(ids)}, of {each}), so its collectives would leave the NVLink "
                   "domain every layer (seed rule 1)")


def _gpus(group: tuple[int, ...]) -> str:
    """A group's GPUs: 'a to b' where they are numbered together, else the first few."""
    together = list(group) == list(range(group[0], group[0] + len(group)))
    return f"{group[0]} to {group[-1]}" if together and len(group) > 2 else _first_few(group)


def _first_few(values: Sequence[int]) -> str:
    """Up to four of ``values``, then '...' where there are more."""
    return ", ".join(map(str, values[:4])) + (", ..." if len(values) > 4 else "")


def enumerate_candidates(space: SearchSpace, world: int, domain_gpus: int) -> list[Candidate]:
    """Every combination whose degrees multiply to the cluster size, in a fixed order. TP goes one power of two
    past the NVLink domain (``domain_gpus``), so that the rule keeping it inside is visible among the pruned
    layouts."""
    tps = space.tp or powers_of_two(2 * domain_gpus)
    found: list[Candidate] = []
    for tp in tps:
        for cp in space.cp:
            rest = world // (tp * cp) if world % (tp * cp) == 0 else 0
            pps = space.pp or tuple(d for d in range(1, rest + 1) if rest % d == 0)
            for pp in pps:
                if not rest or rest % pp:
                    continue
                for v in space.virtual_stages:
                    if v > 1 and pp == 1:
                        continue
                    for mb in space.micro_batch:
                        for sharding in space.sharding:
                            for recompute in space.recompute:
                                found.extend(Candidate(tp, cp, pp, rest // pp, v, mb, sharding, recompute, ep)
                                             for ep in space.ep or (1,))
    return found


def structural_reason(c: Candidate, layers: int, global_batch: int, domains: np.ndarray,
                      fewer_on_ends: bool, order: tuple[str, ...] = DIMENSIONS) -> Pruning | None:
    """Why a layout cannot run, from arithmetic alone (None when it may): ``domains`` each GPU's NVLink domain
    (`Topology.gpu_domain_array`), ``order`` the scenario's placement order. What the pipeline schedule needs of
    the micro-batch count (a multiple of max(1, m // pp) for the looping interleaved ones, m >= 2p for DualPipeV)
    is left to the schedule itself, which check_memory builds."""
    spans = tp_spans_domains(Layout(c.tp, c.cp, c.pp, c.dp, order), domains)
    if spans is not None:
        return spans
    stages = c.pp * c.virtual_stages
    if not layers_per_stage(layers, stages, fewer_on_ends):
        return Pruning(Pruned.LAYERS_DO_NOT_SPLIT, f"{unsplit_layers_text(layers, stages, fewer_on_ends)} over pp x "
                                                   f"virtual_stages = {stages} stages")
    if global_batch % (c.dp * c.micro_batch):
        return Pruning(Pruned.BATCH_DOES_NOT_DIVIDE,
                       f"global batch {global_batch} is not a multiple of dp x micro_batch = {c.dp * c.micro_batch}")
    if (c.dp * c.cp) % c.ep:
        return Pruning(Pruned.EP_DOES_NOT_DIVIDE,
                       f"ep {c.ep} does not divide dp x cp = {c.dp * c.cp} (experts split over data-parallel ranks)")
    return None


def check_memory(base: dict, c: Candidate, schedule: str, times: CollectiveTimes) -> Checked:
    """Build the candidate's step on ``times``' topology: refused by the simulator's own checks (among them the
    schedule's own requirements) or as DeepSpeed's ZeRO-2 under pipelining, which no framework trains (the
    loader's warning, `deepspeed_zero2_under_pipelining`), out of memory, or a survivor with its peak memory and
    estimated throughput (``times`` the scenario's network, which times the candidate's collectives)."""
    ddp = (base.get("parallelism") or {}).get("ddp") or {}
    named = "schedule" in ((base.get("parallelism") or {}).get("pipeline") or {})
    overrides = c.overrides(schedule, ddp, named)
    data = with_values(base, {parse_field(name): value for name, value in overrides.items()})
    try:
        scenario = validate_as_json(Scenario, data)  # as the loader validates: YAML's strings fill enum fields
        if deepspeed_zero2_under_pipelining(scenario.parallelism):
            return Checked(c, data, Pruning(Pruned.REFUSED, f"refused: zero2 with pp {c.pp} is DeepSpeed's ZeRO-2: "
                                                            f"{DEEPSPEED_REFUSES_PIPELINING}"))
        step = build_training_step(scenario, times.topology)
    except ValidationError as exc:  # a check across fields at load (pipelined FSDP's limits): its one line
        problem = validation_error(exc, Scenario, "", {}).problem
        return Checked(c, data, Pruning(Pruned.REFUSED, f"refused: {problem}"))
    except (InputError, ValueError) as exc:
        problem = getattr(exc, "problem", str(exc).splitlines()[0])
        return Checked(c, data, Pruning(Pruned.REFUSED, f"refused: {problem}"))
    peak = max(breakdown.total for breakdown, _ in stage_memory(scenario, step))
    if peak > step.gpu.hbm_bytes:
        needed = f"{peak / GIB:,.1f} GiB > {step.gpu.hbm_bytes / GIB:,.1f} GiB HBM"
        return Checked(c, data, Pruning(Pruned.OUT_OF_MEMORY, f"out of memory: {needed}"), peak / GIB)
    share = contention_share(scenario.collectives.sm_contention, step.gpu.name)
    seconds = estimate_step_s(step, times, share)
    return Checked(c, data, None, peak / GIB, step.tokens_per_step / seconds, tight_fit(peak, step.gpu.hbm_bytes))


def estimate_step_s(step: TrainingStep, times: CollectiveTimes, share: SmShare | None = None) -> float:
    """A quick step time for ranking, not a prediction. Each collective in it is built as the program builds it and
    timed alone on the idle network (`CollectiveTimes`), but for the MoE all-to-alls, timed beside their copies in the
    stage's other EP groups (`CollectiveTimes.with_copies`); contention between collectives, and with the other groups'
    copies of the rest, is left to the simulator; the SMs that overlapped data-parallel collectives take from the
    compute are charged by the engine's rule (`SmShare.overlap_delay`; ``share`` None: not at all). Per micro-batch,
    each pipeline rank's kernels plus its blocking TP and CP collectives (`blocking_collectives_s`; under Transformer
    Engine's TP overlap what the overlapped TP collectives add, `overlapped_tp_s`) and its MoE blocks'
    all-to-alls (`expert_exchange_s`); under ZeRO-3 its units' parameter gathers and per-micro-batch reduce-scatters
    (`sharded_microbatch_spans`) run beside that work, slowing its kernels by the SMs of every collective running
    (`sharded_toll_s`), FSDP's gradient copies (`grad_copies_s`), its compute's waits in the backward for the previous
    unit's reduce-scatter and the next unit's gather (`backward_waits_s`) and what its forward's blocking collectives
    outlast their alone times by beside the gather under way (`forward_sharing_s`), and its backward's TP collectives
    beside the reduce-scatter and gather under way (`backward_sharing_s`), join it, and the longer of the two fills the
    micro-batch's slot; PyTorch FSDP's collectives run over the rank's shard group
    (`shard_group`, a block of the DP x CP group under HSDP) and the routed experts' over theirs. The pipeline
    is the plan's schedule run on the ideal executor with each virtual stage's forward, input-grad and
    weight-grad actions
    (`stage_actions_s`) stretched to its rank's slot and the slowest hop between ranks (`pipeline_ends_s`): its
    fill, drain and exposed hand-offs are the schedule's own. Then what the gradient reduction over the DP x CP
    group leaves after each rank's last action (`reduction_tail_s`, less the time the rank ends before the last;
    pipelined FSDP's reduce-scatters of each rank's chunk 0 after it, `chunk_reductions_s`; under HSDP each
    shard's all-reduce across its replicas after its reduce-scatter), the routed experts'
    reduction and gather (`expert_state_s`), the optimizer step and ZeRO-1/2's parameter all-gather after it. ZeRO-3
    gathering every micro-batch adds what the forwards' starts wait for (`microbatch_starts_s`, the slowest
    rank's). Pipelined FSDP's once-per-step gathers add what they delay the pipeline's fill by
    (`unshard_delay_s`), and the reduce-scatters of a rank's later chunks, which hold its compute stream amid
    the drain, the longest rank's for each chunk. PyTorch FSDP's no-sync (`no_sync`) walks each micro-batch's
    gathers across its passes (`gather_waits_s`), beside which its backward's blocking TP collectives run
    (`backward_sharing_s`), and its last micro-batch, which reduce-scatters as its backward goes, takes the slot
    and tail of one reducing every micro-batch."""
    plan = step.plan
    layout, sharding = plan.layout, plan.sharding
    slots, tails, gathers, starts = [], [], [], []
    actions: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * len(plan.stages)
    split_grads = [0.0] * len(plan.stages)
    chunk_reductions = ([chunk_reductions_s(plan, times, pp_rank) for pp_rank in range(layout.pp)]
                        if sharding.stage_reduces_grads else [])
    for pp_rank in range(layout.pp):
        rank = layout.rank_of(pp=pp_rank)
        blocks = [block for vstage in plan.rank_stages(pp_rank) for block in plan.stages[vstage].blocks]
        compute, sm_bound = kernels_s(blocks)
        toll = (hand_off_toll_s(plan, times, pp_rank, share, compute, sm_bound)
                if share is not None and compute > 0 else 0.0)
        own = {vstage: stage_actions_s(plan, times, vstage, rank, share) for vstage in plan.rank_stages(pp_rank)}
        for vstage, stage_actions in with_hand_off_toll(own, toll).items():
            actions[vstage] = stage_actions
            split_grads[vstage] = split_backward_excess_s(plan, times, plan.stages[vstage].blocks, rank, share)
        work = plain = sum(sum(actions[vstage]) for vstage in plan.rank_stages(pp_rank))
        params = sum(block.params for block in blocks)
        gather = (data_parallel_s(plan, times, rank, "all_gather", [params], sharding.param_bytes)
                  if sharding.stage in (1, 2) else 0.0)
        tail_plan, last_slot = plan, 0.0
        if sharding.stage == 3:
            slot = sharded_slot_s(plan, times, rank, blocks, share, work)
            unit_work = sharded_unit_work(plan, times, rank, blocks)
            if no_sync(plan):
                # the last micro-batch reduces as it goes: its slot and tail are those of one that always does, but
                # for its forward's opening. That slot leaves its first OPENING_GATHERS gathers to the forward's
                # start, which under no-sync microbatch_starts_s charges the first micro-batch alone; the last
                # waits for them as a steady micro-batch does: the steady forward's first waits in gather_walk
                tail_plan = replace(plan, sharding=replace(sharding, reduce_every_microbatch=True))
                opening = gather_walk(plan, times, rank, unit_work)[2][:OPENING_GATHERS]
                last_slot = sharded_slot_s(tail_plan, times, rank, blocks, share, work, plan) + sum(opening) - slot
            work = slot
            starts.append(microbatch_starts_s(plan, times, rank, unit_work))
        elif sharding.sharded_grad_steps:
            work = reduced_every_microbatch_slot_s(plan, times, rank, blocks, share, work)
        slots.append(work)
        tails.append(last_slot + reduction_tail_s(tail_plan, times, rank, share,
                                                  (work + last_slot) / plain if plain > 0 else 1.0).seconds
                     + (chunk_reductions[pp_rank][0] if chunk_reductions else 0.0))
        gathers.append(gather)
    ends = pipeline_ends_s(plan, times, actions, slots, split_grads)
    pipeline = max(ends)
    # a rank that ends before the last has that long for its gradient reduction's tail
    exposed = max(end + tail for end, tail in zip(ends, tails, strict=True)) - pipeline
    experts = max(expert_state_s(step, times, pp_rank) for pp_rank in range(layout.pp))
    optimizer = max(plan.optimizer_s)
    if sharding.stage == 3:
        after = max(starts) if sharding.reshard_after_forward else unshard_delay_s(plan, times)
        # a chunk's reduction holds its rank's compute stream amid the drain (all but chunk 0, which ends last)
        after += sum(max(chunks[c] for chunks in chunk_reductions) for c in range(1, plan.virtual_stages)
                     ) if chunk_reductions else 0.0
    else:
        after = max(gathers) if sharding.stage else 0.0
    return pipeline + exposed + experts + optimizer + after


def reduced_every_microbatch_slot_s(plan: StepPlan, times: CollectiveTimes, rank: int, blocks: list[Block],
                                    share: SmShare | None, actions_s: float) -> float:
    """Seconds of ``rank``'s micro-batch slot under DeepSpeed's ZeRO-2 (``actions_s`` its pipeline actions'
    seconds): every micro-batch the program reduce-scatters each layer's gradients over the shard group as its
    backward finishes them (`ProgramBuilder._grads_done`), beside the compute, whose kernels their SMs slow
    (`sharded_toll_s`); the slot is the longer of the actions with that toll and the reduce-scatters back to
    back. The backward's TP collectives take what they outlast their alone times by beside the reduce-scatters
    under way (`layer_reductions_sharing_s`). The last micro-batch's are the reduction's tail
    (`reduction_tail_s`)."""
    sharding = plan.sharding
    group = shard_group(plan.layout, rank, sharding.degree)
    if len(group) == 1:
        return actions_s
    shapes: list[CollectiveShape] = [("reduce_scatter", group, params * sharding.grad_bytes)
                                     for _, _, params in layer_units(blocks).values()]
    spans: list[Span] = [(times.seconds(*shape), (shape,)) for shape in shapes]
    compute, sm_bound = kernels_s(blocks)
    toll = sharded_toll_s(spans, times, share, compute, sm_bound) if share is not None else 0.0
    shared = layer_reductions_sharing_s(plan, times, rank, group, share)
    return max(actions_s + toll + shared, sum(seconds for seconds, _ in spans))


def layer_reductions_sharing_s(plan: StepPlan, times: CollectiveTimes, rank: int, group: tuple[int, ...],
                               share: SmShare | None) -> float:
    """Seconds per micro-batch ``rank``'s backward TP collectives outlast their alone times by beside ZeRO-2's
    reduce-scatters of each layer's gradients over ``group`` under way, which cross NVLink where the group has
    several members in a host (`TpBesideBuckets`, each layer's sent as its last block's weight-gradient kernels
    end, `ProgramBuilder._grads_done`); each chunk's backward walked on its own (0 without TP, under
    Transformer Engine's TP overlap, whose collectives are not walked, or where no two members of ``group``
    share an NVLink domain, `shares_a_domain`: the TP collectives then take their alone times)."""
    layout = plan.layout
    if layout.tp == 1 or plan.tp_overlap is not None or not shares_a_domain(times.topology, group):
        return 0.0
    shared = 0.0
    for vstage in plan.rank_stages(layout.coords(rank)["pp"]):
        blocks = plan.stages[vstage].blocks[::-1]
        layers: dict[int, tuple[list[int], float]] = {}
        for index, block in enumerate(blocks):
            if block.params > 0:
                keys, params = layers.get(block.layer, ([], 0.0))
                layers[block.layer] = ([*keys, index], params + block.params)
        reductions = sorted(((keys, params * plan.sharding.grad_bytes) for keys, params in layers.values()),
                            key=lambda layer: layer[0][-1])
        beside = TpBesideBuckets(plan, times, rank, group, reductions)
        clock = 0.0
        for index, block in enumerate(blocks):
            clock = beside.walk(block, clock, (Pass.BACKWARD, Pass.RECOMPUTE), share, index)
        shared += beside.shared
    return shared


def sharded_slot_s(plan: StepPlan, times: CollectiveTimes, rank: int, blocks: list[Block], share: SmShare | None,
                   actions_s: float, copies: StepPlan | None = None) -> float:
    """Seconds of ``rank``'s micro-batch slot under ZeRO-3 (``blocks`` its stage's, ``actions_s`` its pipeline
    actions' seconds): its units' gathers and reduce-scatters run beside its work (`sharded_microbatch_spans`),
    slowing its kernels by the SMs of every collective running (`sharded_toll_s`, `sharded_slowdown`: charged
    for the kernels' share of the compute stream's time, beside its blocking collectives, MoE all-to-alls,
    copy-outs and gradient copies, `unslowed_s`); FSDP's gradient copies
    (`grad_copies_s`, ``copies``' where given: the step's own, spread over its micro-batches), its copy-outs, its
    compute's waits for the gathers (`gather_waits_s`) and, in the backward, for the previous unit's
    reduce-scatter (`backward_waits_s`), what its backward's EP combines (`backward_exchange_sharing_s`), its
    forward's blocking collectives (`forward_sharing_s`) and its backward's TP collectives (`backward_sharing_s`)
    outlast their alone times by beside the collectives under way join it; the slot is
    the longer of that and the collectives beside the compute. What each forward's start waits for is charged apart
    (`microbatch_starts_s`)."""
    unit_work = sharded_unit_work(plan, times, rank, blocks)
    beside_compute = spans_beside_compute(plan, rank, sharded_microbatch_spans(plan, times, rank, unit_work),
                                          unit_work)
    copies = copies or plan
    sharded_toll, slowed = sharded_slowdown(beside_compute, times, share, blocks,
                                            unslowed_s(plan, times, rank, blocks, unit_work, copies))
    return max(actions_s + sharded_toll + grad_copies_per_microbatch_s(copies, blocks)
               + sum(unit.copy_out_s for unit in unit_work)
               + gather_waits_s(plan, times, rank, unit_work, slowed)
               + backward_waits_s(plan, times, rank, unit_work, slowed)
               + backward_exchange_sharing_s(plan, times, rank, blocks, unit_work)
               + forward_sharing_s(plan, times, rank, blocks, slowed)
               + backward_sharing_s(plan, times, rank, blocks, unit_work, slowed),
               sum(seconds for seconds, _ in beside_compute))


def unslowed_s(plan: StepPlan, times: CollectiveTimes, rank: int, blocks: list[Block], units: list[ShardedUnit],
               copies: StepPlan | None = None) -> float:
    """Seconds per micro-batch ``rank``'s compute stream spends under ZeRO-3 (``blocks``, split into ``units``) in
    work the engine does not slow by the SMs of the collectives beside it (`sharded_slowdown`): its blocking TP
    and CP collectives (`blocking_collectives_s`), MoE all-to-alls (`block_exchanges_s`), and FSDP2's copy-outs
    and gradient copies (`grad_copies_s`, ``copies``' where given), copies the program launches with no SM-bound
    share."""
    blocking = sum(blocking_collectives_s(plan, times, block, rank) + block_exchanges_s(plan, times, block, rank,
                                                                                      PASSES)
                   for block in blocks)
    return (blocking + sum(unit.copy_out_s for unit in units)
            + grad_copies_per_microbatch_s(copies or plan, blocks))


def grad_copies_per_microbatch_s(plan: StepPlan, blocks: list[Block]) -> float:
    """Seconds of PyTorch FSDP's gradient copies of ``blocks`` (their routed experts' included where FSDP2
    shards them) per micro-batch of ``plan``: its step's (`grad_copies_s`) spread over its micro-batches."""
    copied = sum(block.params for block in blocks) + sharded_expert_params(plan, blocks)
    return grad_copies_s(plan, copied) / plan.microbatches


def gather_waits_s(plan: StepPlan, times: CollectiveTimes, rank: int, units: list[ShardedUnit],
                   slowed: float = 1.0) -> float:
    """Seconds per micro-batch PyTorch FSDP's compute on ``rank`` waits for its units' gathers (``units`` in
    forward order) under no-sync, in the steady state (`gather_walk`), its forward's opening included (what the
    first micro-batch waits for beyond it is `microbatch_starts_s`'s). Where every micro-batch reduce-scatters,
    none: its collectives' spans (`sharded_microbatch_spans`), the forward's gathers among them, bound the slot,
    and its backward's waits are `backward_waits_s`'s."""
    if not no_sync(plan):
        return 0.0
    return sum(sum(waits) for waits in gather_walk(plan, times, rank, units, slowed)[2:])


def no_sync(plan: StepPlan) -> bool:
    """Whether PyTorch FSDP accumulates the unsharded gradients and reduce-scatters each unit in the last
    backward (its no-sync without pipelining: `Sharding.defers_unit_grads`, resharding after each forward)."""
    return plan.sharding.defers_unit_grads and plan.sharding.reshard_after_forward


def gather_walk(plan: StepPlan, times: CollectiveTimes, rank: int, units: list[ShardedUnit],
                slowed: float = 1.0) -> list[list[float]]:
    """Seconds PyTorch FSDP's compute on ``rank`` waits for each unit's gather under no-sync (`no_sync`: no
    reduce-scatter in the backwards but the last), ``units`` in forward order, over two micro-batches back to
    back, the first and one in the steady state: [first forward, first backward, steady forward, steady
    backward] (`walked_gathers`)."""
    return walked_gathers(plan, times, rank, units, slowed).waits


@dataclass(frozen=True)
class WalkedGathers:
    """`walked_gathers`' clock over two micro-batches under no-sync, per pass ([first forward, first backward,
    steady forward, steady backward]): ``waits`` for each unit's gather, where each unit's work ``starts`` (after
    its wait; the backward's units in backward order) and the collectives on the all-gather stream as (start,
    end, shape), in issue order."""

    waits: list[list[float]]
    starts: list[list[float]]
    gathers: list[tuple[float, float, CollectiveShape]]


def walked_gathers(plan: StepPlan, times: CollectiveTimes, rank: int, units: list[ShardedUnit],
                   slowed: float = 1.0) -> WalkedGathers:
    """PyTorch FSDP's gathers on ``rank`` under no-sync walked across the passes of two micro-batches back to
    back (``units`` in forward order). Each gather is the unit's copy-in, then its dense all-gather and its
    routed experts', one after another on the all-gather stream (the head's backward gathers nothing: it stays
    gathered). The gathers are issued in the units' order across the passes and micro-batches (FSDP2's
    prefetch, `ProgramBuilder._zero3_gather`): a forward's once the unit three before it has finished, a
    backward's once the unit two before it has; each unit's work (``slowed`` times its own: the SM toll) waits
    for its gather. Where the gathers outlast the compute beside them (a layer's routed experts gathered over a
    NIC), the pass runs at the gathers' pace, and the unit's MoE all-to-alls, on its compute stream, run while
    the next gather is awaited (mixtral-8x7b's layers, tp 2 dp 8 ep 4 full_shard over two DGX H100: a layer's
    forward every 5.90 ms, its dense and expert gathers', of which its compute stream's 3.80 ms, the dispatch's
    and combine's 0.16 ms among them, leave 2.10 ms waiting); the next forward's first gathers run beside the
    backward's last units."""
    sharding = plan.sharding
    group = shard_group(plan.layout, rank, sharding.degree)
    gathered = [unit for unit in units if unit.params > 0]

    def gather_shapes(unit: ShardedUnit) -> tuple[float, list[CollectiveShape]]:
        dense: list[CollectiveShape] = ([("all_gather", group, unit.params * sharding.param_bytes)]
                                        if len(group) > 1 else [])
        return copy_in_s(plan, unit.params), dense + ([unit.experts[0]] if unit.experts is not None else [])

    forward = [(slowed * unit.forward_s, gather_shapes(unit), 3) for unit in gathered]
    backward = [(slowed * unit.backward_s, None if unit.head and sharding.gather_per_layer else gather_shapes(unit),
                 2) for unit in reversed(gathered)]
    clock = copied = queued = 0.0
    ends: list[float] = []  # where each unit's work ended, in issue order
    walked, starts, gathers = [], [], []
    for work in (forward, backward, forward, backward):
        waits, began = [], []
        for seconds, gather, lag in work:
            if gather is not None:  # the copy-in on its own stream, then the gathers
                copy_in, shapes = gather
                copied = max(copied, ends[-lag] if len(ends) >= lag else 0.0) + copy_in
                queued = max(queued, copied)
                for shape in shapes:
                    gathers.append((queued, queued + times.seconds(*shape), shape))
                    queued = gathers[-1][1]
                waits.append(max(queued - clock, 0.0))
                clock = max(clock, queued)
            began.append(clock)
            clock += seconds
            ends.append(clock)
        walked.append(waits)
        starts.append(began)
    return WalkedGathers(walked, starts, gathers)


class BesideGathers:
    """Blocking collectives timed on an estimate's clock beside the FSDP collectives under way (``gathers``: start,
    end and the collectives started together then, a list the caller may extend as it walks): a collective that
    starts while entry k moves data is timed with the ones since entry k began, one after another beside it
    (`CollectiveTimes.beside`, the engine's flow model); one outside every entry takes its time alone. The
    forward's walk and the backward's (`forward_sharing_s`, `backward_sharing_s`) share it."""

    def __init__(self, times: CollectiveTimes,
                 gathers: list[tuple[float, float, tuple[CollectiveShape, ...]]]) -> None:
        self.times, self.gathers = times, gathers
        self.chain: list[tuple[float, CollectiveShape]] = []  # the collectives since the entry under way began
        self.chained, self.chain_end = -1, 0.0  # which entry that is; where the chain's last collective ended

    def time(self, clock: float, shape: CollectiveShape) -> tuple[float, float]:
        """(seconds the collective starting at ``clock`` takes, seconds it takes alone)."""
        alone = took = self.times.seconds(*shape)
        under_way = next((k for k, (start, end, _) in enumerate(self.gathers) if start <= clock < end), -1)
        if under_way >= 0:
            if under_way != self.chained:
                self.chain, self.chained, self.chain_end = [], under_way, self.gathers[under_way][0]
            self.chain.append((clock - self.chain_end, shape))
            took = self.times.beside(self.gathers[under_way][2], tuple(self.chain))
            self.chain_end = clock + took
        return took, alone


def backward_sharing_s(plan: StepPlan, times: CollectiveTimes, rank: int, blocks: list[Block],
                       units: list[ShardedUnit], slowed: float = 1.0) -> float:
    """Seconds per micro-batch PyTorch FSDP's backward on ``rank`` (``blocks``, split into ``units`` in forward
    order) loses to its blocking TP collectives sharing links with the FSDP collectives under way, as
    `forward_sharing_s` charges the forward's. Under no-sync (`no_sync`) those are the parameter gathers on the
    all-gather stream: a backward's gather starts once the unit two before it in issue order has finished
    (`walked_gathers`), so while a unit's backward runs, the next unit's gather is under way (llama3-8b, tp 2 dp
    8 full_shard over 2 hosts: a 4 MiB TP all-gather, 0.057 ms alone, takes 0.193 ms beside a layer's gather,
    0.68 ms a micro-batch over 4 layers); the steady micro-batch's backward is walked from each unit's start on
    that clock, and the routed experts' gathers are not timed against it, as in the forward. Reducing every
    micro-batch, each unit's backward but the first runs beside the reduce-scatters of the unit before it and
    the gathers of the unit after it, started together as it begins (`backward_collectives`): llama3-8b tp 2 dp
    16 over four hosts, a unit's first TP all-gather, 0.057 ms alone, takes 0.33 ms beside them. Each unit's
    walk: its backward copy-out, then per block its TP collective before the kernels, its kernels (``slowed``
    times their own, the SM toll), the one after, each collective timed with those since the collectives under
    way began one after another beside them (`BesideGathers`); nothing over a one-rank shard group."""
    sharding, layout = plan.sharding, plan.layout
    shards = shard_group(layout, rank, sharding.degree)
    if not (sharding.fsdp and sharding.reshard_after_forward) or layout.tp == 1 or plan.tp_overlap is not None \
            or len(shards) == 1:
        return 0.0
    backward = [(unit, work) for unit, work in zip(unit_blocks(plan, blocks), units, strict=True)
                if work.params > 0][::-1]
    if no_sync(plan):
        walked = walked_gathers(plan, times, rank, units, slowed)
        dense = BesideGathers(times, [(start, end, (shape,)) for start, end, shape in walked.gathers
                                      if shape[1] == shards])
        return sum(_backward_tp_excess(plan, times, rank, unit, dense, start + (
            0.0 if work.head else copy_out_s(plan, work.params)), slowed)
                   for (unit, work), start in zip(backward, walked.starts[3], strict=True))
    if not sharding.reduce_every_microbatch:
        return 0.0
    works = [work for _, work in backward]
    excess = 0.0
    for index, (unit, work) in enumerate(backward[1:], start=1):
        running = backward_collectives(plan, shards, works, index)
        if running:
            beside = BesideGathers(times, [(0.0, max(times.together(*running)), running)])
            excess += _backward_tp_excess(plan, times, rank, unit, beside, work.copy_out_s / 2, slowed)
    return excess


def _backward_tp_excess(plan: StepPlan, times: CollectiveTimes, rank: int, unit: list[Block],
                        beside: BesideGathers, clock: float, slowed: float) -> float:
    """Seconds the blocking TP collectives of ``unit``'s backward, walked from ``clock``, outlast their alone
    times by beside the collectives of ``beside`` (`backward_sharing_s`)."""
    group = plan.layout.group("tp", rank)
    excess = 0.0
    for block in reversed(unit):
        for before in (True, False):
            op = tp_op(block.tp_pattern, True, before, plan.sequence_parallel) if block.tp_bytes > 0 else None
            if op is not None:
                took, alone = beside.time(clock, (op, group, block.tp_bytes))
                excess += took - alone
                clock += took
            if before:
                clock += slowed * (block.backward_input_s + block.backward_weight_s + block.recompute_s)
    return excess


def chunk_reductions_s(plan: StepPlan, times: CollectiveTimes, pp_rank: int) -> list[float]:
    """Seconds of pipelined FSDP's reductions of each of pipeline rank ``pp_rank``'s chunks (chunk 0 first),
    whose last the rank's compute waits for: the chunk's units' reduce-scatters one after another over their
    shard groups (their routed experts' after each where FSDP2 shards them) and, under HSDP, each reduced
    shard's all-reduce across its replicas on its own stream (`unit_reductions`, `reductions_end_s`), timed
    alone (`_chunk_grad_sync`)."""
    rank = plan.layout.rank_of(pp=pp_rank)
    return [max(reductions_end_s(times, [(0.0, unit_reductions(plan, rank, unit))
                                         for unit in unit_blocks(plan, list(plan.stages[vstage].blocks))]))
            for vstage in plan.rank_stages(pp_rank)]


def unshard_delay_s(plan: StepPlan, times: CollectiveTimes) -> float:
    """Seconds pipelined FSDP's parameter gathers (once per step, `reshard_after_forward` false) delay the
    step: how much later the first micro-batch's forward leaves the last virtual stage than without them. It
    runs the chain of that forward through the virtual stages, each taking the stage's forward kernels and
    blocking TP and CP collectives after the previous stage's (the pipeline's fill, on whose end the step
    waits), while each rank's gathers (a unit's routed experts' after it where FSDP2 shards them), timed
    alone one after another on its prefetch stream, start with the step. Under Schedule1F1B and ScheduleGPipe
    (``single_stage_loop``) a unit waits for its own gather (and its experts') and the gather of unit k waits
    for unit k - 3's forward (FSDP2's implicit prefetch, `_zero3_gather`); under the
    runtime's other schedules every unit of the rank's chunks is gathered at the step's start, chunk by chunk,
    and a chunk's first forward waits for all of its own (`_unshard_chunks`); FSDP2's copy-outs are charged on
    the compute stream apart (`copy_outs_s`). The units the rank gathers while
    an earlier stage computes cost nothing, so only what outlasts the fill is charged: the first rank's first
    units, and any rank whose gathers are slower than its forward."""
    layout = plan.layout
    ready: dict[int, float] = {}  # per pipeline rank, when its prefetch stream has gathered what it queued
    plain = gathered = 0.0  # the first micro-batch's forward: where it ends without the gathers, and with them
    for vstage, stage in enumerate(plan.stages):
        rank = layout.rank_of(pp=stage_rank(vstage, layout.pp, plan.placement))
        group = shard_group(layout, rank, plan.sharding.degree)
        units = []  # per layer (FSDP unit), in forward order: its gathers (its experts' after), its forward
        for unit in unit_blocks(plan, list(stage.blocks)):
            params = sum(block.params for block in unit)
            experts = expert_unit_shapes(plan, rank, unit)
            units.append(((times.seconds("all_gather", group, params * plan.sharding.param_bytes) if params > 0
                           else 0.0) + (times.seconds(*experts[0]) if experts is not None else 0.0),
                          sum(block.forward_s + blocking_collectives_s(plan, times, block, rank, (Pass.FORWARD,))
                              for block in unit)))
        plain += sum(forward for _, forward in units)
        if plan.single_stage_loop:
            ends: list[float] = []
            queue = ready.get(rank, 0.0)
            for gather, forward in units:
                queue = max(queue, ends[-3] if len(ends) >= 3 else 0.0) + gather
                gathered = max(gathered, queue) + forward
                ends.append(gathered)
            ready[rank] = queue
        else:
            ready[rank] = ready.get(rank, 0.0) + sum(gather for gather, _ in units)
            gathered = max(gathered, ready[rank]) + sum(forward for _, forward in units)
    return gathered - plain


def pipeline_ends_s(plan: StepPlan, times: CollectiveTimes, actions: list[tuple[float, float, float]],
                    slots: list[float], split_grads: list[float]) -> list[float]:
    """When each pipeline rank's last action ends: the plan's schedule, the per-rank actions the program runs,
    on the ideal executor (schedules/timing.py), each virtual stage's forward, input-grad and weight-grad
    actions lasting ``actions`` of it (`stage_actions_s`, with the hand-offs' toll, `with_hand_off_toll`)
    stretched so that each rank's per micro-batch work is its slot in ``slots`` (what the slot holds beyond
    those, ZeRO-3's waits and tolls, shared in proportion), and a hand-off between ranks arriving one hop
    (`hand_off_s`) after its action ends; the backward hand-off of the action that finishes a chunk's
    gradients also takes what it shares the sender's NIC with their buckets for (`hand_offs_beside_buckets_s`).
    The MoE all-to-alls and the hand-offs' toll sit in the forwards and
    input grads, not in the weight grads a zero-bubble schedule postpones into its bubbles. So the fill, drain
    and exposed hand-offs are the schedule's own: a zero-bubble schedule's W fills what 1F1B leaves idle, and
    where one stage is heavier the others wait for it rather than for their hand-offs. The schedule's order
    is compiled once per schedule (`_compiled_order`): a search times the same ones many times. An input-grad
    action apart from its weight grads (a zero-bubble B) lasts ``split_grads`` of its virtual stage longer than
    the input grads of a whole backward (`split_backward_excess_s`), stretched as the rest."""
    f, b, w = [0.0] * len(plan.stages), [0.0] * len(plan.stages), [0.0] * len(plan.stages)
    whole = [0.0] * len(plan.stages)
    for pp_rank, slot in enumerate(slots):
        vstages = plan.rank_stages(pp_rank)
        raw = sum(sum(actions[vstage]) for vstage in vstages)
        stretch = slot / raw if raw > 0 else 0.0
        for vstage in vstages:
            f[vstage], b[vstage], w[vstage] = (seconds * stretch for seconds in actions[vstage])
            whole[vstage] = b[vstage] + w[vstage]
            b[vstage] += split_grads[vstage] * stretch
    order = _compiled_order(tuple(tuple(rank) for rank in plan.schedule), plan.virtual_stages, plan.placement)
    hop = hand_off_s(plan, times)
    slower = {index: hop + excess for index, excess in hand_offs_beside_buckets_s(plan, times, order).items()}
    _, ends = execute(order, f, b, w, hop, slower, whole)
    return [ends[last] if last >= 0 else 0.0 for last in order.last]


def hand_offs_beside_buckets_s(plan: StepPlan, times: CollectiveTimes, order: ScheduleOrder) -> dict[int, float]:
    """What the backward hand-off of the action that finishes a chunk's gradients takes beyond its alone time,
    by the action's index in ``order``: DDP's and ZeRO-1/2's gradient buckets (`gradient_buckets`, filled over
    the rank's chunks in the order their gradients are finished, as the program fills them) go out as their
    last block's gradients are finished, so those the action's last block completes start on the `dp` stream
    as its send starts on the `pp` stream, and where both cross the sender's NIC the send shares it
    (`CollectiveTimes.together`, the buckets as one reduction of their bytes over the DP x CP group). On the
    drain every chunk's last micro-batch passes such a hand-off at each hop of its chain. A backward that keeps
    its weight gradients apart (a zero-bubble W) finishes them after its send, and ZeRO-3 reduces otherwise:
    nothing. Without overlap (`ddp.overlap: false`, which the search's candidates keep from the scenario as
    written) nothing is charged, and ZeRO-2 reducing every micro-batch (whose sends all share the NIC with its
    reductions) is timed as buckets after the last."""
    layout, sharding = plan.layout, plan.sharding
    if sharding.stage == 3 or not sharding.overlap:
        return {}
    finals: dict[tuple[int, int], int] = {}  # (pipeline rank, chunk) -> index of the action finishing its grads
    for index, (action, pp_rank) in enumerate(zip(order.actions, order.ranks, strict=True)):
        if action.kind in ("W", "BW"):
            finals[pp_rank, action.chunk] = index
    excess: dict[int, float] = {}
    for pp_rank in range(layout.pp):
        sender = layout.rank_of(pp=pp_rank)
        group = layout.combined_group(("dp", "cp"), sender)
        if len(group) == 1:
            continue
        vstages = plan.rank_stages(pp_rank)
        ready = [((vstage, index), block) for vstage in reversed(vstages)
                 for index, block in reversed(list(enumerate(plan.stages[vstage].blocks)))]
        buckets = gradient_buckets(ready, sharding.grad_bytes, sharding.bucket_bytes)
        closing: dict[int, float] = {}  # per virtual stage: the bytes of the buckets that start as it finishes
        for keys, nbytes in buckets:
            vstage, index = keys[-1]
            if index == min((i for i, block in enumerate(plan.stages[vstage].blocks) if block.params > 0), default=-1):
                closing[vstage] = closing.get(vstage, 0.0) + nbytes
        for chunk, vstage in enumerate(vstages):
            index = finals.get((pp_rank, chunk), -1)
            if vstage == 0 or index < 0 or order.actions[index].kind != "BW" or vstage not in closing:
                continue
            receiver = _stage_peer(plan, sender, vstage - 1)
            nbytes = plan.stages[vstage].p2p_bytes
            if receiver == sender or nbytes <= 0:
                continue
            send: CollectiveShape = ("send_recv", (sender, receiver), nbytes)
            beside: CollectiveShape = (sharding.grad_reduction, group, closing[vstage])
            excess[index] = max(times.together(send, beside)[0] - times.seconds(*send), 0.0)
    return excess


@lru_cache(maxsize=64)
def _compiled_order(schedule: tuple[tuple[Action, ...], ...], v: int, placement: Placement) -> ScheduleOrder:
    """The ideal executor's order of ``schedule`` (each rank's actions; v chunks per rank, ``placement``)."""
    return schedule_order([list(rank) for rank in schedule], v, placement)


def stage_actions_s(plan: StepPlan, times: CollectiveTimes, vstage: int, rank: int,
                    share: SmShare | None) -> tuple[float, float, float]:
    """Seconds of virtual stage ``vstage``'s forward, input-grad backward and weight-grad backward of one
    micro-batch on ``rank`` (its pipeline rank's representative): the blocks' kernels of each pass, their
    blocking TP and CP collectives and their MoE all-to-alls (`block_exchanges_s`), the backward's (and the
    recompute's, which runs before the input grads) with the input grads; a weight-grad pass has none
    (`Pass.sends_activations`), so a schedule that postpones it into the bubbles hides no communication. A
    schedule that keeps the backward whole runs the last two together."""
    forward = grads = weights = 0.0
    backward = (Pass.BACKWARD, Pass.RECOMPUTE)
    for block in plan.stages[vstage].blocks:
        forward += (block.forward_s + blocking_collectives_s(plan, times, block, rank, (Pass.FORWARD,), share)
                    + block_exchanges_s(plan, times, block, rank, (Pass.FORWARD,)))
        grads += (block.backward_input_s + block.recompute_s
                  + blocking_collectives_s(plan, times, block, rank, backward, share)
                  + block_exchanges_s(plan, times, block, rank, backward))
        weights += block.backward_weight_s
    return forward, grads, weights


def with_hand_off_toll(actions: dict[int, tuple[float, float, float]],
                       toll: float) -> dict[int, tuple[float, float, float]]:
    """A rank's virtual stages' (forward, input-grad, weight-grad) seconds with ``toll``, what its hand-offs
    take from its compute stream per micro-batch (`hand_off_toll_s`), shared over its forwards and input
    grads in proportion: a send follows one of those and a receive precedes one, and a weight-grad action
    neither sends nor receives."""
    sending = sum(forward + grads for forward, grads, _ in actions.values())
    scale = 1 + toll / sending if sending > 0 else 1.0
    return {vstage: (forward * scale, grads * scale, weights)
            for vstage, (forward, grads, weights) in actions.items()}


def hand_off_s(plan: StepPlan, times: CollectiveTimes) -> float:
    """Seconds of the slowest stage-to-stage hand-off: the program's send between the ranks of the first TP, CP
    and DP coordinates holding two consecutive virtual stages, the sending stage's activation
    (`StageWork.p2p_bytes`: 1/t of it per TP rank), timed alone on the idle network as the engine times it;
    the first hop of each kind is timed (inside one NVLink domain, or across to another over the NICs), each
    way. A turn on one rank (the V placement) is free, as in the program. Exact where every hop is of one kind,
    as where each stage spans whole hosts; where they mix, every hop is charged at the slower kind (an upper
    bound). The search's layouts run sequence parallelism whenever tp > 1, so no receiver re-gathers its
    activation over TP."""
    layout = plan.layout
    domain = times.topology.gpu_domain
    first_of_kind: dict[bool, tuple[int, int, int]] = {}
    for vstage in range(len(plan.stages) - 1):
        sender = layout.rank_of(pp=stage_rank(vstage, layout.pp, plan.placement))
        receiver = layout.rank_of(pp=stage_rank(vstage + 1, layout.pp, plan.placement))
        if sender != receiver:
            first_of_kind.setdefault(domain[sender] == domain[receiver], (vstage, sender, receiver))
    slowest = 0.0
    for vstage, sender, receiver in first_of_kind.values():
        forward = times.seconds("send_recv", (sender, receiver), plan.stages[vstage].p2p_bytes)
        backward = times.seconds("send_recv", (receiver, sender), plan.stages[vstage + 1].p2p_bytes)
        slowest = max(slowest, forward, backward)
    return slowest


def hand_off_toll_s(plan: StepPlan, times: CollectiveTimes, pp_rank: int, share: SmShare,
                    compute_s: float, sm_bound: float) -> float:
    """Seconds per micro-batch pipeline rank ``pp_rank``'s hand-offs take from its compute stream though they
    run on their own (the `pp` stream, Megatron-LM's overlapped P2P): each send and receive of its chunks'
    activations and gradients holds SMs for as long as it runs, which slows the ``compute_s`` seconds of
    kernels beside it (SM-bound for the share ``sm_bound``) by the engine's rule (`SmShare.overlap_delay`),
    and a send starts as its action ends, when the rank's next action opens with its blocking TP or CP
    collective (`opening_collective`; after a forward a backward, after a backward a forward, as in the
    steady state) while every member of that collective's group sends its own hop: where they share links the
    collective runs longer than alone, by what `CollectiveTimes.together` gives. Where a rank waits for its
    input anyway, this is hidden in its wait; on the slowest rank, which never waits, it lengthens every slot
    (measured on Llama-3-8B tp 2 pp 2 v 2: 37 us on each 57 us all-gather a send meets on NVLink)."""
    layout = plan.layout
    rank = layout.rank_of(pp=pp_rank)
    last = len(plan.stages) - 1
    hops, delay, held = 0.0, 0.0, 0
    for vstage in plan.rank_stages(pp_rank):
        # (sending stage, receiving stage, the pass the sender's next action runs) of each hand-off of the chunk
        transfers = [(vstage - 1, vstage, None), (vstage + 1, vstage, None),
                     (vstage, vstage + 1, Pass.BACKWARD), (vstage, vstage - 1, Pass.FORWARD)]
        for src, dst, following in transfers:
            if not (0 <= src <= last and 0 <= dst <= last):
                continue
            nbytes = plan.stages[src].p2p_bytes
            pair = (_stage_peer(plan, rank, src), _stage_peer(plan, rank, dst))
            if pair[0] == pair[1] or nbytes <= 0:
                continue
            hops += times.seconds("send_recv", pair, nbytes)
            held = max(held, times.sms("send_recv", pair, nbytes, share))
            opening = opening_collective(plan, rank, vstage, following) if following is not None else None
            if opening is not None:
                op, group, opening_bytes = opening
                sends: tuple[CollectiveShape, ...] = tuple(
                    ("send_recv", (member, _stage_peer(plan, member, dst)), nbytes) for member in group)
                delay += times.together(opening, *sends)[0] - times.seconds(op, group, opening_bytes)
    return delay + (share.overlap_delay(hops, held, compute_s, sm_bound) if hops > 0 else 0.0)


def _stage_peer(plan: StepPlan, rank: int, vstage: int) -> int:
    """The rank with ``rank``'s TP, CP and DP coordinates that holds virtual stage ``vstage``."""
    coords = plan.layout.coords(rank)
    coords["pp"] = stage_rank(vstage, plan.layout.pp, plan.placement)
    return plan.layout.rank_of(**coords)


def opening_collective(plan: StepPlan, rank: int, vstage: int, phase: Pass) -> CollectiveShape | None:
    """The blocking collective ``rank``'s ``phase`` (forward or backward) of virtual stage ``vstage`` opens
    with, as the program builder orders it: the first block's (the last one's in the backward, through its
    recompute where that runs first) CP gather of the K/V, else the TP collective its pattern puts before the
    pass; None where a kernel comes first (or Transformer Engine's TP overlap runs the collective as a ring
    exchange against a GEMM)."""
    layout = plan.layout
    blocks = plan.stages[vstage].blocks
    if not blocks:
        return None
    block = blocks[0] if phase is Pass.FORWARD else blocks[-1]
    if phase is Pass.BACKWARD and block.recompute_s > 0:
        if not plan.recompute_comm:
            return None
        phase = Pass.RECOMPUTE
    if layout.cp > 1 and block.cp_bytes > 0:
        return gathered_kv_op(phase, gather=True), layout.group("cp", rank), block.cp_bytes
    op = tp_op(block.tp_pattern, phase.input_grads, True, plan.sequence_parallel)
    if layout.tp == 1 or block.tp_bytes <= 0 or op is None or plan.tp_overlap is not None:
        return None
    return op, layout.group("tp", rank), block.tp_bytes


class ReductionTail(NamedTuple):
    """What a rank's gradient reduction adds after its last action (`reduction_tail_s`): ``after`` the seconds it
    outlasts the action by, ``shared`` the seconds the cool-down's TP collectives lose beside the buckets under
    way, which end the action that much later than its actions timed alone (`TpBesideBuckets`)."""

    after: float
    shared: float = 0.0

    @property
    def seconds(self) -> float:
        """Both: the tail from the end of the rank's actions timed alone."""
        return self.after + self.shared


def reduction_tail_s(plan: StepPlan, times: CollectiveTimes, rank: int, share: SmShare | None,
                     stretch: float = 1.0) -> ReductionTail:
    """Seconds ``rank``'s gradient reduction outlasts the rank's last action by. The program's
    reduction collectives queue on the data-parallel stream, each sent as its gradients are finished: DDP's
    and ZeRO-1/2's buckets (`gradient_buckets`; all of them at the end without overlap), ZeRO-3's
    reduce-scatter of each FSDP unit (its first block's backward finishes it), a chunk's in the action that
    finishes its gradients. The rank's actions from the first of those on run back to back (`_cool_down`),
    each block with its blocking TP and CP collectives: under interleaving a chunk's last backward is followed
    by a round more of the chunk before it (p micro-batches where m is a multiple of p), so the later chunks' buckets
    go out well before the end. The kernels' SMs slow the kernels beside them
    (`SmShare.overlap_delay`): the last reduction starts that much later, unless the queue already ended
    later. Where every micro-batch reduce-scatters, its slot holds the reductions and their toll: only the
    last unit's is left. Under HSDP each unit's reduced shards (dense and routed experts') are then all-reduced
    across their replicas in the last backward, each on its own stream once its reduce-scatter ends
    (`unit_reductions`, `reductions_end_s`), on the cool-down's clock ``stretch``ed to the slot (the slot's
    seconds over its actions': FSDP's toll, copies and waits spread over the micro-batch); what that chain
    outlasts the rank's last action by is the tail where it is longer. So is a one-rank shard group's: it
    reduce-scatters no dense unit, but its routed experts' reductions and the replicas' all-reduces still run
    (tp 8 on a DGX H100), and, reducing in the last backward alone, the routed experts' reduce-scatters there.
    Pipelined FSDP reduces after the chunk
    (`estimate_step_s`), and stages without weights have nothing to reduce: no tail there. With DDP's overlap
    and tp above 1 the cool-down's TP collectives share NVLink with the buckets under way (`TpBesideBuckets`):
    what they outlast their alone times by moves the rank's last action later (`ReductionTail.shared`), and the
    buckets leave as that walk sends them (one walk: the buckets are filled from the cool-down's actions
    first, `_cool_down_actions`)."""
    layout, sharding = plan.layout, plan.sharding
    group = shard_group(layout, rank, sharding.degree)
    if sharding.stage_reduces_grads or (len(group) == 1 and sharding.stage != 3):
        return ReductionTail(0.0)
    beside = None
    if not sharding.sharded_grad_steps and sharding.overlap and layout.tp > 1 and plan.tp_overlap is None:
        finishing = [block for _, _, blocks, final in _cool_down_actions(plan, rank) if final for block in blocks]
        beside = TpBesideBuckets(plan, times, rank, group,
                                 gradient_buckets(enumerate(finishing), sharding.grad_bytes, sharding.bucket_bytes))
    ready, finished, clock, compute, sm_bound = _cool_down(plan, times, rank, share, beside)
    shared = beside.shared if beside is not None else 0.0
    clock -= shared
    replicated = 0.0
    if sharding.sharded_grad_steps:
        units = layer_units(reversed(ready))
        firsts = {block.layer: index for index, block in enumerate(ready) if block.params > 0}
        queue = [(finished[index], units[layer][2] * sharding.grad_bytes)
                 for layer, index in firsts.items()] if len(group) > 1 else []
        if (replica_group(layout, rank, sharding.degree) or len(group) == 1
                or (not sharding.reduce_every_microbatch and sharded_expert_params(plan, ready) > 0)):
            replicated = max(reductions_end_s(times, [(stretch * finished[index], unit_reductions(
                plan, rank, [block for block in ready if block.layer == layer])) for layer, index in firsts.items()]
            )) - stretch * clock
    else:
        buckets = gradient_buckets(enumerate(ready), sharding.grad_bytes, sharding.bucket_bytes)
        queue = [(finished[keys[-1]] if sharding.overlap else clock, nbytes) for keys, nbytes in buckets]
        if beside is not None:
            queue = [(start, nbytes) for (start, _, _), (_, nbytes) in zip(beside.sent, buckets, strict=True)]
    if not queue:  # stages without weights (a synthetic model's), or a one-rank shard group: its chain alone
        return ReductionTail(max(replicated, 0.0))
    end, last, busy = 0.0, 0.0, 0.0
    for ready_s, nbytes in queue:
        last = times.seconds(sharding.grad_reduction, group, nbytes)
        end = max(end, ready_s) + last
        busy += last
    if sharding.sharded_grad_steps and sharding.reduce_every_microbatch:
        # the slots hold every reduce-scatter and its SMs' toll but the last unit's
        return ReductionTail(max(last, replicated))
    delay = 0.0
    if share is not None and compute > 0:
        held = times.sms(sharding.grad_reduction, group, queue[0][1], share)
        delay = share.overlap_delay(min(busy, clock), held, compute, sm_bound / compute)
    return ReductionTail(max(end - clock - shared, delay + last, replicated), shared)


_ACTION_PASSES: dict[str, tuple[Pass, ...]] = {
    "F": (Pass.FORWARD,), "B": (Pass.BACKWARD_INPUT, Pass.RECOMPUTE), "BW": (Pass.BACKWARD, Pass.RECOMPUTE),
    "W": (Pass.BACKWARD_WEIGHT,)}
"""The passes of a block each kind of pipeline action runs."""


def _cool_down(plan: StepPlan, times: CollectiveTimes, rank: int, share: SmShare | None,
               buckets: TpBesideBuckets | None = None) -> tuple[list[Block], list[float], float, float, float]:
    """The actions of ``rank`` from the first that finishes a chunk's gradients to its last, run back to back
    on its compute stream: (the blocks whose gradients those actions finish, in the order they finish, when
    each finishes, the actions' seconds, their kernels' seconds, the SM-bound seconds of these). With
    ``buckets``, each block's backward TP collectives take what they outlast their alone times by beside the
    gradient buckets' reductions under way (`TpBesideBuckets`), each bucket sent as its last block's kernels end."""
    ready: list[Block] = []
    finished, clock, compute, sm_bound = [], 0.0, 0.0, 0.0
    for kind, passes, blocks, final in _cool_down_actions(plan, rank):
        for block in blocks:
            kernels = sum(block.pass_seconds(phase) for phase in passes)
            talking = tuple(phase for phase in passes if phase.sends_activations)
            if buckets is not None and kind != "F":
                clock = buckets.walk(block, clock, passes, share, len(ready) if final else None)
            else:
                clock += kernels + (blocking_collectives_s(plan, times, block, rank, talking, share)
                                    if talking else 0.0)
            compute += kernels
            sm_bound += sum(block.sm_bound_seconds(phase) for phase in passes)
            if final:
                ready.append(block)
                finished.append(clock)
    return ready, finished, clock, compute, sm_bound


def _cool_down_actions(plan: StepPlan, rank: int
                       ) -> Iterator[tuple[str, tuple[Pass, ...], list[Block], bool]]:
    """The actions of ``rank`` from the first that finishes a chunk's gradients to its last (`_cool_down`):
    each action's kind, passes, blocks in the order it runs them, and whether it finishes its chunk's
    gradients."""
    pp_rank = plan.layout.coords(rank)["pp"]
    actions, stages = plan.schedule[pp_rank], plan.rank_stages(pp_rank)
    finals = {action.chunk: index for index, action in enumerate(actions) if action.kind in ("W", "BW")}
    for index in range(min(finals.values()), len(actions)):
        action = actions[index]
        blocks = list(plan.stages[stages[action.chunk]].blocks)
        yield (action.kind, _ACTION_PASSES[action.kind], blocks if action.kind == "F" else blocks[::-1],
               index == finals[action.chunk])


def shares_a_domain(topology: Topology, group: tuple[int, ...]) -> bool:
    """Whether two members of ``group`` (ranks, GPU r for rank r) share an NVLink domain, so that a collective
    over the group crosses that domain's NVLink."""
    domains = topology.gpu_domain_array[list(group)]
    return len(set(domains.tolist())) < len(group)


class TpBesideBuckets:
    """A rank's blocking TP collectives in its last backward timed beside the gradient buckets' reductions over
    its DP x CP group under way (DDP's, and ZeRO's reducing once a step, with overlap, on the data-parallel
    stream; `BesideGathers`, the engine's flow model): where the group has several members in a host the
    reduction's ring crosses NVLink, and a TP collective that starts while a bucket moves data there shares the
    GPUs' NVLink ports with it (where no two members share an NVLink domain, nothing does: the TP collectives
    take their alone times, and the walk only sends the buckets). Llama 3 8B, tp 2 dp 16 over four DGX H100s,
    one micro-batch of 2 sequences: the step's TP collectives take 9.3 ms more than with the reduction after the
    backward (exposed TP 35.8 ms against 26.5), all of it in the backward the buckets run beside. Each bucket is
    sent once its last block's gradients are finished and the bucket before it has ended (``buckets``:
    `gradient_buckets` over the cool-down's finished blocks by index)."""

    def __init__(self, plan: StepPlan, times: CollectiveTimes, rank: int, group: tuple[int, ...],
                 buckets: list[tuple[list[int], float]]) -> None:
        self.plan, self.times, self.rank, self.group = plan, times, rank, group
        self.waiting = list(buckets)
        self.sent: list[tuple[float, float, tuple[CollectiveShape, ...]]] = []
        self.beside = BesideGathers(times, self.sent)
        self.crossed = shares_a_domain(times.topology, group)  # else the TP collectives take their alone times
        self.shared = 0.0  # seconds the TP collectives walked so far outlast their alone times by

    def _finished(self, index: int, clock: float) -> None:
        """Send every bucket whose last block is the ``index``-th finished, at ``clock``."""
        while self.waiting and self.waiting[0][0][-1] <= index:
            _, nbytes = self.waiting.pop(0)
            shape: CollectiveShape = (self.plan.sharding.grad_reduction, self.group, nbytes)
            start = max(self.sent[-1][1] if self.sent else 0.0, clock)
            self.sent.append((start, start + self.times.seconds(*shape), (shape,)))

    def walk(self, block: Block, clock: float, passes: tuple[Pass, ...], share: SmShare | None,
             final: int | None) -> float:
        """When ``block``'s ``passes`` of a backward action started at ``clock`` end, walked in the program's
        order: the recompute (with its CP gather and TP collectives where the recompute runs them), then the
        backward's CP gather, the TP collective before its kernels, the kernels, the one after them, what the
        input's re-gather adds (`regather_s`) and the CP reduce-scatter; the TP collectives timed beside the
        buckets under way (what they outlast their alone times by added to ``shared``), the rest alone
        (`blocking_collectives_s`). Where its gradients are the ``final``-th finished, the buckets that waited
        for them are sent as its weight-gradient kernels end, before the TP collective after them (as the
        program sends them)."""
        plan, times = self.plan, self.times
        ring = block.context if block.context is not None and block.context.ring else None
        gathers = plan.layout.cp > 1 and block.cp_bytes > 0 and ring is None
        tp = plan.layout.tp > 1 and block.tp_bytes > 0
        cp_group = plan.layout.group("cp", self.rank)
        for phase in sorted(passes, key=lambda phase: phase is not Pass.RECOMPUTE):
            talks = phase.sends_activations and (
                phase is not Pass.RECOMPUTE or (plan.recompute_comm and block.recompute_s > 0))
            if talks and gathers:
                clock += times.seconds(gathered_kv_op(phase, gather=phase.input_grads), cp_group, block.cp_bytes)
            if talks and tp:
                clock = self._tp(block, phase, True, clock)
            clock += block.pass_seconds(phase)
            if ring is not None and phase.sends_activations:
                clock += ring_exposed_s(plan, times, ring, self.rank, phase, share)
            if phase.weight_grads and final is not None:
                self._finished(final, clock)
            if talks and tp:
                clock = self._tp(block, phase, False, clock)
            if phase is Pass.BACKWARD and tp:
                clock += regather_s(plan, times, block, self.rank, share)
            if phase is Pass.BACKWARD and gathers:
                clock += times.seconds(gathered_kv_op(phase, gather=False), cp_group, block.cp_bytes)
        return clock

    def _tp(self, block: Block, phase: Pass, before: bool, clock: float) -> float:
        """When the TP collective ``block``'s TP pattern puts ``before`` (or after) pass ``phase``, started at
        ``clock`` beside the buckets under way, ends (none: ``clock``)."""
        op = tp_op(block.tp_pattern, phase.input_grads, before, self.plan.sequence_parallel)
        if op is None:
            return clock
        shape: CollectiveShape = (op, self.plan.layout.group("tp", self.rank), block.tp_bytes)
        took, alone = self.beside.time(clock, shape) if self.crossed else (self.times.seconds(*shape),) * 2
        self.shared += took - alone
        return clock + took


def blocking_collectives_s(plan: StepPlan, times: CollectiveTimes, block: Block, rank: int,
                           wanted: tuple[Pass, ...] = PASSES, share: SmShare | None = None) -> float:
    """Seconds of ``block``'s blocking TP and CP collectives per micro-batch on ``rank`` in the ``wanted``
    passes, placed as the program builder places them around its forward, its backward and, where the
    recompute runs them again, its recompute: on each side the collective its TP pattern puts there (`tp_op`)
    over the rank's TP group, and with CP's ``all_gather`` algorithm the K/V gathers before and the
    gradients' reduce-scatter after (`gathered_kv_op`) over its CP group; with ring attention, what of the K/V
    ring the attention beside it does not cover (`ring_exposed_s`); with sequence parallelism, what the
    backward's re-gather of the block's input adds (`regather_s`; ``share`` the SM rule it is charged by).
    Under Transformer Engine's TP overlap, what the overlapped TP collectives add beside their GEMMs
    (`overlapped_tp_s`) takes the place of the TP collectives and the re-gather."""
    layout = plan.layout
    passes = [phase for phase in wanted
              if phase is not Pass.RECOMPUTE or (plan.recompute_comm and block.recompute_s > 0)]
    seconds = 0.0
    if plan.tp_overlap is not None:
        seconds += sum(overlapped_tp_s(plan, times, block, rank, phase, share) for phase in passes)
    elif layout.tp > 1 and block.tp_bytes > 0:
        group = layout.group("tp", rank)
        tp_ops = (tp_op(block.tp_pattern, phase.input_grads, before, plan.sequence_parallel)
                  for phase in passes for before in (True, False))
        seconds += sum(times.seconds(op, group, block.tp_bytes) for op in tp_ops if op is not None)
        if Pass.BACKWARD in wanted:
            seconds += regather_s(plan, times, block, rank, share)
    if block.context is not None and block.context.ring:
        seconds += sum(ring_exposed_s(plan, times, block.context, rank, phase, share) for phase in wanted)
    elif layout.cp > 1 and block.cp_bytes > 0:
        group = layout.group("cp", rank)
        cp_ops = [gathered_kv_op(phase, gather=phase.input_grads) for phase in passes]
        if Pass.BACKWARD in passes:
            cp_ops.append(gathered_kv_op(Pass.BACKWARD, gather=False))
        seconds += sum(times.seconds(op, group, block.cp_bytes) for op in cp_ops)
    return seconds


def regather_s(plan: StepPlan, times: CollectiveTimes, block: Block, rank: int, share: SmShare | None) -> float:
    """Seconds the backward of ``block`` on ``rank`` loses to re-gathering its input over the TP group
    (`regathers_input`: sequence parallelism saves a column-parallel linear's input sharded). The program runs
    the gather on the `tp` stream beside the input-gradient GEMMs, whose kernels it slows by its SMs (the
    engine's rule, `SmShare.overlap_delay`; ``share`` None: not at all), and the weight-gradient GEMMs wait
    for it: the longer of the gather and the slowed GEMMs, less the GEMMs. Under Transformer Engine's TP
    overlap (`tp_overlap`) the bulk overlap runs it with other SMs, timed by `overlapped_tp_s` instead."""
    layout = plan.layout
    if (layout.tp == 1 or block.tp_bytes <= 0 or plan.tp_overlap is not None
            or not regathers_input(block.tp_pattern, plan.sequence_parallel)):
        return 0.0
    group = layout.group("tp", rank)
    gather = times.seconds("all_gather", group, block.tp_bytes)
    dgrad_s, dgrad_sm = block.overlap_gemm_s[3], block.overlap_gemm_sm_s[3]
    slowed = dgrad_s
    if share is not None and dgrad_s > 0:
        held = times.sms("all_gather", group, block.tp_bytes, share)
        slowed += share.overlap_delay(gather, held, dgrad_s, dgrad_sm / dgrad_s)
    return max(gather, slowed) - dgrad_s


def ring_exposed_s(plan: StepPlan, times: CollectiveTimes, context: ContextAttention, rank: int,
                   phase: Pass, share: SmShare | None) -> float:
    """Seconds ring attention's K/V ring adds to pass ``phase`` of a block on ``rank``: the program runs the
    ring's cp - 1 steps one after another, each a grouped send/receive of one block (K/V, with their gradients
    twice the bytes in the backward) from every CP rank to the next over the path between the two
    (`ring_step_pairs`: one NIC between hosts), beside the attention on every block but the last, which waits
    for the last step (`BlockPasses._context_pass`), so what the ring, or the attention beside it, outlasts that
    attention timed alone by is exposed. Each step's kernel holds the SMs of a send/receive pair
    (`CollectiveTimes.sms`), which slow that attention by the engine's rule (`SmShare.overlap_delay`; ``share``
    None: not at all)."""
    core_s, _, core_sm_s = context.core(phase)
    if core_s <= 0:
        return 0.0
    cp_rank = plan.layout.coords(rank)["cp"]
    beside = core_s * context.share(cp_rank) * (1 - context.last_step_share(cp_rank))
    group = plan.layout.group("cp", rank)
    block_bytes = context.ring_block_bytes(phase)
    pairs = ring_step_pairs(len(group), block_bytes)
    ring_s = (context.cp - 1) * times.seconds("all_to_all", group, block_bytes, pair_bytes=pairs, algorithm="direct")
    slowed = beside
    if share is not None and beside > 0:
        held = times.sms("all_to_all", group, block_bytes, share, pair_bytes=pairs, algorithm="direct")
        slowed += share.overlap_delay(ring_s, held, beside, bound_share(core_sm_s, core_s))
    return max(ring_s, slowed) - beside


def data_parallel_s(plan: StepPlan, times: CollectiveTimes, rank: int, op: Primitive, units: list[float],
                    bytes_per_param: float) -> float:
    """Seconds of collective ``op`` over ``rank``'s shard group (`shard_group`: its DP x CP group, a block of it
    under HSDP), once for each of ``units`` (parameters, ``bytes_per_param`` each per rank), one after another
    (0 over one rank)."""
    group = shard_group(plan.layout, rank, plan.sharding.degree)
    return sum(times.seconds(op, group, params * bytes_per_param) for params in units) if len(group) > 1 else 0.0


@dataclass(frozen=True)
class ShardedUnit:
    """One unit ZeRO-3 gathers and reduce-scatters on its own (`unit_blocks`), with its compute stream's work per
    micro-batch, beside which the FSDP collectives run: its kernels, blocking TP and CP collectives and MoE
    all-to-alls (`block_exchanges_s`), in the forward, and in the backward (its recompute included) with its
    gradients' FSDP copies, each with FSDP2's copy-out of its gathers in that pass (``copy_out_s`` the two
    together, `copy_outs_s`); ``head`` where it holds the output layer, which FSDP keeps gathered from its
    forward to its backward; ``experts`` the all-gather and gradient reduce-scatter of its routed experts over
    their own shard group where PyTorch FSDP2 shards them with it (`expert_unit_shapes`)."""

    params: float
    forward_s: float
    backward_s: float
    head: bool
    copy_out_s: float = 0.0
    experts: tuple[CollectiveShape, CollectiveShape] | None = None


def sharded_unit_work(plan: StepPlan, times: CollectiveTimes, rank: int, blocks: list[Block]) -> list[ShardedUnit]:
    """The units of ``blocks`` on ``rank`` in forward order, as the program builder splits them: one FSDP unit
    per layer (a layer's blocks together), else (DeepSpeed) one block at a time."""
    backward = (Pass.BACKWARD, Pass.RECOMPUTE)
    units = []
    for unit in unit_blocks(plan, blocks):
        params, expert_params = sum(block.params for block in unit), sharded_expert_params(plan, unit)
        copied = params + expert_params
        head = any(block.tp_pattern is TpPattern.HEAD for block in unit)
        experts = expert_unit_shapes(plan, rank, unit)
        forward_copy, backward_copy = (dense + routed for dense, routed in zip(
            copy_outs_s(plan, params, head), copy_outs_s(plan, expert_params, head, one_rank=experts is None)))
        units.append(ShardedUnit(
            params=params,
            forward_s=sum(block.forward_s + blocking_collectives_s(plan, times, block, rank, (Pass.FORWARD,))
                          + block_exchanges_s(plan, times, block, rank, (Pass.FORWARD,)) for block in unit)
            + forward_copy,
            backward_s=sum(block.backward_input_s + block.backward_weight_s + block.recompute_s
                           + blocking_collectives_s(plan, times, block, rank, backward)
                           + block_exchanges_s(plan, times, block, rank, backward) for block in unit)
            + grad_copies_s(plan, copied) / plan.microbatches + backward_copy,
            head=head, copy_out_s=forward_copy + backward_copy, experts=experts))
    return units


def sharded_expert_params(plan: StepPlan, blocks: list[Block]) -> float:
    """The routed-expert parameters among ``blocks`` (one FSDP unit's) that PyTorch FSDP2 gathers, copies and
    reduces with the unit (Sharding.shards_experts); 0 otherwise."""
    if not plan.sharding.shards_experts:
        return 0.0
    return sum(block.experts.params for block in blocks if block.experts is not None)


def expert_unit_shapes(plan: StepPlan, rank: int,
                       blocks: list[Block]) -> tuple[CollectiveShape, CollectiveShape] | None:
    """The all-gather of the routed experts among ``blocks`` (one FSDP unit's) and the reduce-scatter of their
    gradients over their own shard group (`expert_shard_groups`), where PyTorch FSDP2 shards them with their
    layer's unit (`ProgramBuilder._expert_gather`, `_expert_reduce`); None otherwise, or over one rank."""
    params = sharded_expert_params(plan, blocks)
    ep = next((block.experts.ep for block in blocks if block.experts is not None), 1)
    if params <= 0:
        return None
    sharding = plan.sharding
    group, _ = expert_shard_groups(plan.layout, rank, ep, sharding.degree)
    if len(group) == 1:
        return None
    return ("all_gather", group, params * sharding.param_bytes), ("reduce_scatter", group, params * sharding.grad_bytes)


def unit_reductions(plan: StepPlan, rank: int, blocks: list[Block]) -> list[tuple[CollectiveShape | None,
                                                                                 CollectiveShape | None]]:
    """One FSDP unit's (``blocks``') gradient reductions in the step's last reduction as the program issues them
    (`ProgramBuilder._grads_done`, `_chunk_grad_sync`), per shard (its dense parameters', then its routed
    experts' where FSDP2 shards them): (the reduce-scatter over its shard group, HSDP's all-reduce of the
    reduced shard across its replicas, 1/size of the shard group of the gradients), each None where there is
    none (a one-rank shard group; full_shard, or experts that one shard group alone holds: no replicas)."""
    sharding = plan.sharding
    shards: list[tuple[tuple[int, ...], tuple[int, ...], float]] = []
    params = sum(block.params for block in blocks)
    if params > 0:
        shards.append((shard_group(plan.layout, rank, sharding.degree),
                       replica_group(plan.layout, rank, sharding.degree), params))
    experts = sharded_expert_params(plan, blocks)
    if experts > 0:
        ep = next(block.experts.ep for block in blocks if block.experts is not None)
        shards.append((*expert_shard_groups(plan.layout, rank, ep, sharding.degree), experts))
    return [((sharding.grad_reduction, group, params * sharding.grad_bytes) if len(group) > 1 else None,
             ("all_reduce", replicas, sharding.replica_reduce_bytes(params, group)) if replicas else None)
            for group, replicas, params in shards]


def reductions_end_s(times: CollectiveTimes,
                     units: list[tuple[float, list[tuple[CollectiveShape | None, CollectiveShape | None]]]]
                     ) -> tuple[float, float]:
    """When a rank's unit reductions end on the reduce-scatter stream and on HSDP's all-reduce stream, ``units``
    in issue order as (when the unit's gradients are ready, its `unit_reductions`), each timed alone: each
    reduce-scatter queues on its stream once ready, each all-reduce on its own (FSDP2's ``all_reduce_stream``)
    once its reduce-scatter has ended."""
    scattered = reduced = 0.0
    for ready, shards in units:
        scattered = max(scattered, ready)
        for scatter, all_reduce in shards:
            scattered += times.seconds(*scatter) if scatter is not None else 0.0
            if all_reduce is not None:
                reduced = max(reduced, scattered) + times.seconds(*all_reduce)
    return scattered, reduced


def expert_unit_s(times: CollectiveTimes, unit: ShardedUnit, which: int) -> float:
    """Seconds of ``unit``'s experts' all-gather (``which`` 0) or reduce-scatter (1) alone; 0 without them."""
    return times.seconds(*unit.experts[which]) if unit.experts is not None else 0.0


def copy_out_s(plan: StepPlan, params: float, one_rank: bool | None = None) -> float:
    """Seconds of FSDP2's copy-out of one gather of a unit of ``params`` parameters on the compute stream
    (`Sharding.gather_copy_bytes` at ``grad_copy_rate``), or over a one-rank shard group of fp32 shards its
    unshard copy in the copy-out's place (`Sharding.unshard_copy_bytes`); 0 where none is charged. The
    copy-in, on its own stream, is `copy_in_s`, charged where the gather waits for it. ``one_rank``: whether
    the parameters' shard group is one rank (routed experts over their own group); by default the plan's."""
    sharding = plan.sharding
    _, copy_out = sharding.gather_copy_bytes()
    if copy_out <= 0 or params <= 0:
        return 0.0
    if sharding.degree == 1 if one_rank is None else one_rank:
        return params * sharding.unshard_copy_bytes() / sharding.grad_copy_rate if sharding.fp32_shards else 0.0
    return params * copy_out / sharding.grad_copy_rate


def copy_in_s(plan: StepPlan, params: float) -> float:
    """Seconds of FSDP2's copy-in of one gather of a unit of ``params`` parameters, on its own stream before the
    gather, which waits for it (`Sharding.gather_copy_bytes` at ``grad_copy_rate``: 1/degree of the unit, 10 B
    per element from fp32 shards); 0 where none is charged or nothing is gathered (a one-rank shard group)."""
    sharding = plan.sharding
    copy_in, _ = sharding.gather_copy_bytes()
    if copy_in <= 0 or params <= 0 or sharding.degree == 1:
        return 0.0
    return params * copy_in / sharding.grad_copy_rate


def copy_outs_s(plan: StepPlan, params: float, head: bool, one_rank: bool | None = None) -> tuple[float, float]:
    """Seconds per micro-batch of FSDP2's copy-outs of a unit (`copy_out_s`, ``one_rank`` its) in its forward
    and in its backward: after each gather, every micro-batch's forward's and, but the ``head``'s (kept
    gathered), its backward's; without ``reshard_after_forward`` (pipelined FSDP) once per step, before its
    first forward, spread over the micro-batches' forwards."""
    seconds = copy_out_s(plan, params, one_rank)
    if not plan.sharding.reshard_after_forward:
        return seconds / plan.microbatches, 0.0
    return seconds, 0.0 if head else seconds


def unit_blocks(plan: StepPlan, blocks: list[Block]) -> list[list[Block]]:
    """``blocks`` split into the units ZeRO-3 gathers on their own, in forward order: one FSDP unit per layer (a
    layer's blocks together), else (DeepSpeed) one block at a time."""
    grouped: dict[int, list[Block]] = {}
    for index, block in enumerate(blocks):
        grouped.setdefault(block.layer if plan.sharding.gather_per_layer else index, []).append(block)
    return list(grouped.values())


def sharded_microbatch_spans(plan: StepPlan, times: CollectiveTimes, rank: int,
                             units: list[ShardedUnit]) -> list[Span]:
    """ZeRO-3's collectives beside the compute on ``rank`` per micro-batch, as spans of (seconds, the collectives
    running in them). Each of ``units`` (forward order) is gathered for its forward and, but the head, again for
    its backward (once per step when it stays gathered under pipelining). Reduce-scattering every
    micro-batch, the backward gathers the second unit as the first starts and each later one as the unit two
    before it (in backward order) finishes, beside that unit's reduce-scatter on the other stream
    (`CollectiveTimes.together`: both while the shorter runs, then the longer alone); FSDP's no-sync defers the
    reduce-scatters to the step's end."""
    sharding = plan.sharding
    group = shard_group(plan.layout, rank, plan.sharding.degree)
    shaped = [u for u in units if u.params > 0]
    dense = shaped if len(group) > 1 else []  # a one-rank shard group gathers and reduces no dense unit
    gathers: list[CollectiveShape] = [("all_gather", group, u.params * sharding.param_bytes) for u in dense]
    reductions: list[CollectiveShape] = [(sharding.grad_reduction, group, u.params * sharding.grad_bytes)
                                         for u in dense]
    experts = [u.experts for u in shaped if u.experts is not None]
    reductions_alone: list[Span] = [(times.seconds(*r), (r,)) for r in [*(e[1] for e in experts), *reductions]]
    if not sharding.reshard_after_forward:
        return reductions_alone if sharding.reduce_every_microbatch else []
    spans: list[Span] = [(times.seconds(*g), (g,)) for g in [*gathers, *(e[0] for e in experts)]]
    regathered = [g for g, u in zip(gathers, dense) if not (u.head and sharding.gather_per_layer)]
    if not sharding.reduce_every_microbatch:
        return spans + [(times.seconds(*g), (g,)) for g in [*(e[0] for e in experts), *regathered]]
    return [*spans, *_backward_spans(times, [e[0] for e in experts], [e[1] for e in experts]),
            *_backward_spans(times, regathered, reductions)]


def _backward_spans(times: CollectiveTimes, gathers: list[CollectiveShape],
                    reductions: list[CollectiveShape]) -> list[Span]:
    """The backward's spans of units' ``gathers`` and ``reductions`` (forward order): the second unit's gather
    (in backward order) alone, then each unit's reduce-scatter beside the gather of the unit two after it."""
    if not reductions:
        return []
    backward_gathers, backward_reductions = gathers[::-1], reductions[::-1]
    spans: list[Span] = [(times.seconds(*backward_gathers[0]), (backward_gathers[0],))] if backward_gathers else []
    for index, reduction in enumerate(backward_reductions):
        gather = backward_gathers[index + 1] if index + 1 < len(backward_gathers) else None
        if gather is None:
            spans.append((times.seconds(*reduction), (reduction,)))
            continue
        gathered, reduced = times.together(gather, reduction)
        spans += [(min(gathered, reduced), (gather, reduction)),
                  (abs(reduced - gathered), (reduction,) if reduced > gathered else (gather,))]
    return spans


def backward_waits_s(plan: StepPlan, times: CollectiveTimes, rank: int, units: list[ShardedUnit],
                     slowed: float = 1.0) -> float:
    """Seconds per micro-batch PyTorch FSDP's compute stream waits in the backward on ``rank`` when it
    reduce-scatters every micro-batch's gradients. As a unit's backward ends (``units`` in forward order, run
    in reverse), its reduce-scatter starts and, beside it, the gather of the unit two after it in backward order
    (`sharded_microbatch_spans`: `CollectiveTimes.together`); the compute runs the next unit's backward, then
    waits for that reduce-scatter (`_grads_done`, FSDP2's post-backward) and, before the unit after, for that
    gather: the gap is whichever of the two ends later, less the next unit's backward, ``slowed`` times its own
    (the SMs of the collectives beside it slow its kernels: `sharded_toll_s`, spread over the micro-batch's). A
    gather larger than a layer's (the embedding's, last in backward order) is waited for though the
    reduce-scatter beside it is not. The last unit's reduce-scatter is waited for only in the next micro-batch
    (the step's last: `reduction_tail_s`)."""
    sharding = plan.sharding
    group = shard_group(plan.layout, rank, plan.sharding.degree)
    if not (sharding.fsdp and sharding.reduce_every_microbatch):
        return 0.0
    backward = [u for u in reversed(units) if u.params > 0]
    regathered = [u for u in backward if sharding.reshard_after_forward and not u.head]
    waits = 0.0
    for index, (unit, following) in enumerate(zip(backward, backward[1:])):
        reduction: CollectiveShape = (sharding.grad_reduction, group, unit.params * sharding.grad_bytes)
        beside = regathered[index + 1] if index + 1 < len(regathered) else None
        if len(group) == 1:  # no dense reduce-scatter or gather: only the unit's experts' reduce-scatter
            ends: tuple[float, ...] = (0.0,)
        elif beside is not None:
            ends = times.together(reduction, ("all_gather", group, beside.params * sharding.param_bytes))
        else:
            ends = (times.seconds(*reduction),)
        waits += max(max(ends) + expert_unit_s(times, unit, 1) - slowed * following.backward_s, 0.0)
    return waits


def backward_collectives(plan: StepPlan, group: tuple[int, ...], backward: list[ShardedUnit],
                         index: int) -> tuple[CollectiveShape, ...]:
    """The FSDP collectives that start together as the backward of ``backward[index]`` begins (units in backward
    order), reducing every micro-batch (`backward_waits_s`): the reduce-scatters of the unit before it, dense
    over the shard group ``group`` where it has several members, then its routed experts', and the gathers of
    the unit after it (the head stays gathered where each layer is a unit)."""
    sharding = plan.sharding
    dense = len(group) > 1
    done = backward[index - 1]
    regathered = [work for work in backward if not (work.head and sharding.gather_per_layer)]
    running: list[CollectiveShape] = []
    if dense:
        running.append((sharding.grad_reduction, group, done.params * sharding.grad_bytes))
    if done.experts is not None:
        running.append(done.experts[1])
    beside = regathered[index] if index < len(regathered) else None
    if beside is not None and dense:
        running.append(("all_gather", group, beside.params * sharding.param_bytes))
    if beside is not None and beside.experts is not None:
        running.append(beside.experts[0])
    return tuple(running)


def backward_exchange_sharing_s(plan: StepPlan, times: CollectiveTimes, rank: int, blocks: list[Block],
                                units: list[ShardedUnit]) -> float:
    """Seconds per micro-batch the backward's EP combines on ``rank`` (``blocks``, split into ``units`` in
    forward order) outlast their alone times by where they share links with the FSDP collectives that start
    beside them, reducing every micro-batch: as a unit's backward ends, its reduce-scatters and the gathers of
    the unit two after it start (`backward_collectives`), and the next unit's backward opens, after its copy-out,
    with its MoE block's combine (`CollectiveTimes.beside`: the reduce-scatters and gathers, the routed
    experts' with the dense ones, started together; the combine after the copy-out). Where the FSDP
    collectives and the EP group both cross the NICs (full_shard over several hosts) the combine slows."""
    sharding = plan.sharding
    if not (sharding.fsdp and sharding.reshard_after_forward and sharding.reduce_every_microbatch):
        return 0.0
    group = shard_group(plan.layout, rank, sharding.degree)
    backward = [(work, unit) for unit, work in zip(unit_blocks(plan, blocks), units, strict=True) if work.params > 0]
    backward.reverse()
    works = [work for work, _ in backward]
    excess = 0.0
    for index, (work, unit) in enumerate(backward[1:], start=1):
        moe = next((block.experts for block in unit
                    if block.experts is not None and block.experts.exchanges(Pass.BACKWARD)), None)
        if moe is None:
            continue
        running = backward_collectives(plan, group, works, index)
        combine: Exchange = ("all_to_all", ep_group(plan.layout, rank, moe.ep), moe.dispatch_bytes,
                             moe.pairs("combine", backward=True))
        if running:  # after the unit's backward copy-out, as long as its forward's (a MoE layer is not the head)
            excess += times.beside(running, ((work.copy_out_s / 2, combine),)) - times.seconds(*combine)
    return excess


def forward_sharing_s(plan: StepPlan, times: CollectiveTimes, rank: int, blocks: list[Block],
                      slowed: float = 1.0) -> float:
    """Seconds per micro-batch PyTorch FSDP's forward on ``rank`` (``blocks``, in forward order) loses to its
    blocking collectives sharing links with the parameter gathers on the prefetch stream. The gather of unit k
    starts once the gather before it has ended and unit k - 3's last forward kernel has (FSDP2's implicit
    prefetch, `_zero3_gather`; before that unit's closing TP collective), so while a unit computes, the gather of
    the unit two ahead is under way. Where the DP x CP group has several members in an NVLink domain the
    gather's ring crosses NVLink too, and a TP collective that starts while the gather moves data there shares
    the GPUs' NVLink ports with it (Llama-3-70B, tp 2 cp 2 dp 128: a 64 MiB reduce-scatter over the TP pair,
    0.10 ms alone, takes 0.37 ms). Walks the forward on the estimate's clock, kernels ``slowed`` times their own
    (the SM toll, `sharded_toll_s`, spread over the micro-batch's kernels), each unit waiting for its gather (which
    waits for its copy-in, `copy_in_s`) and its copy-out (`copy_out_s`), and
    times the blocking collectives since the gather under way began one after another beside it
    (`CollectiveTimes.beside`, the engine's flow model): what they outlast their alone times by (nothing
    before the gather leaves its start-up latency, or after it ends)."""
    sharding = plan.sharding
    group = shard_group(plan.layout, rank, plan.sharding.degree)
    if not (sharding.fsdp and sharding.reshard_after_forward) or len(group) == 1:
        return 0.0
    units = [(unit, sum(block.params for block in unit)) for unit in unit_blocks(plan, blocks)]
    shapes: list[CollectiveShape] = [("all_gather", group, params * sharding.param_bytes)
                                     for _, params in units if params > 0]
    copy_ins = [copy_in_s(plan, params) for _, params in units if params > 0]
    gathers: list[tuple[float, float, tuple[CollectiveShape, ...]]] = []  # (start, end, (shape,)): prefetch stream
    ends: list[float] = []  # where each gathered unit's last kernel ends
    copied = 0.0  # where the copy-in stream's last copy-in ends

    def queue() -> None:
        """Start every gather whose turn has come: its copy-in after the one before and unit k - 3, the gather
        after its copy-in and the gather before."""
        nonlocal copied
        while len(gathers) < min(len(shapes), len(ends) + 3):
            k = len(gathers)
            copied = max(copied, ends[k - 3] if k >= 3 else 0.0) + copy_ins[k]
            start = max(gathers[-1][1] if gathers else 0.0, copied)
            gathers.append((start, start + times.seconds(*shapes[k]), (shapes[k],)))

    clock = excess = 0.0
    beside = BesideGathers(times, gathers)
    queue()
    for unit, params in units:
        if params > 0:
            clock = max(clock, gathers[len(ends)][1]) + copy_out_s(plan, params)
        steps = [step for block in unit for step in forward_steps(plan, times, block, rank)]
        last_kernel = max(index for index, step in enumerate(steps) if isinstance(step, float))
        for index, step in enumerate(steps):
            if isinstance(step, float):
                clock += slowed * step
                if index == last_kernel and params > 0:
                    ends.append(clock)
                    queue()
                continue
            took, alone = beside.time(clock, step)
            excess += took - alone
            clock += took
    return excess


def forward_steps(plan: StepPlan, times: CollectiveTimes, block: Block, rank: int) -> list[float | CollectiveShape]:
    """The forward of ``block`` on ``rank`` as the program builder runs it on the compute stream, in order: its
    blocking collectives (`CollectiveShape`s: CP's gathered K/V, then the TP collective its pattern puts before
    the kernels) and its kernels' seconds (with what ring attention's ring outlasts the attention by,
    `ring_exposed_s`), then the TP collective after. Under Transformer Engine's TP overlap the TP collectives run
    against GEMMs, timed alone by `overlapped_tp_s`, and are left out."""
    layout = plan.layout
    steps: list[float | CollectiveShape] = []
    if layout.cp > 1 and block.cp_bytes > 0 and not (block.context is not None and block.context.ring):
        steps.append((gathered_kv_op(Pass.FORWARD, gather=False), layout.group("cp", rank), block.cp_bytes))
    tp = layout.tp > 1 and block.tp_bytes > 0 and plan.tp_overlap is None
    before, after = (tp_op(block.tp_pattern, False, side, plan.sequence_parallel) if tp else None
                     for side in (True, False))
    if before is not None:
        steps.append((before, layout.group("tp", rank), block.tp_bytes))
    ring = (ring_exposed_s(plan, times, block.context, rank, Pass.FORWARD, None)
            if block.context is not None and block.context.ring else 0.0)
    steps.append(block.forward_s + ring)
    if after is not None:
        steps.append((after, layout.group("tp", rank), block.tp_bytes))
    return steps


def microbatch_starts_s(plan: StepPlan, times: CollectiveTimes, rank: int, units: list[ShardedUnit]) -> float:
    """Seconds per step the forwards' starts hold ``rank``'s compute under ZeRO-3 gathering every micro-batch
    (``units`` in forward order): a forward waits for its first unit's gather and then for the second's (queued
    behind it), each after its copy-in (`copy_in_s`), less the first unit's forward. Every forward does
    (FSDP2's root pre-forward makes the all-gather streams wait for the compute stream: the search's ZeRO-3 is
    PyTorch FSDP's). Under PyTorch FSDP without
    pipelining each forward after the first also waits, before its gathers, for the previous backward's last
    reduce-scatter, the first unit's, alone (FSDP2's root post-backward callback, `ProgramBuilder._end_backward`;
    the reduce-scatter before it is `backward_waits_s`'s, the step's last backward's
    `reduction_tail_s`'s). Under no-sync (`no_sync`) no reduce-scatter holds them, and a forward's first gathers
    run beside the backward before it: what the first micro-batch waits for beyond one in the steady state
    (`gather_walk`), whose waits `gather_waits_s` charges to every slot."""
    sharding, m = plan.sharding, plan.microbatches
    group = shard_group(plan.layout, rank, plan.sharding.degree)
    shaped = [u for u in units if u.params > 0]
    if not shaped:
        return 0.0
    if no_sync(plan):
        walked = [sum(waits) for waits in gather_walk(plan, times, rank, units)]
        return sum(walked[:2]) - sum(walked[2:])

    def gathered_s(unit: ShardedUnit) -> float:
        """Seconds of the unit's dense gather (none over a one-rank shard group)."""
        return times.seconds("all_gather", group, unit.params * sharding.param_bytes) if len(group) > 1 else 0.0

    first = shaped[0]
    copied = copy_in_s(plan, first.params)
    opening = copied + gathered_s(first)
    if len(shaped) > 1:
        copied += copy_in_s(plan, shaped[1].params)
        second = max(opening, copied) + gathered_s(shaped[1]) + expert_unit_s(times, shaped[1], 0)
        opening += max(second - opening - first.forward_s, 0.0)
    waits = (times.seconds(sharding.grad_reduction, group, first.params * sharding.grad_bytes)
             if waits_for_last_reduction(plan) and len(group) > 1 else 0.0)
    return m * opening + (m - 1) * waits


def waits_for_last_reduction(plan: StepPlan) -> bool:
    """Whether each forward after the first waits for the previous backward's last reduce-scatter: PyTorch FSDP
    reduce-scattering every micro-batch without pipelining (`ProgramBuilder._end_backward`)."""
    sharding = plan.sharding
    return sharding.fsdp and sharding.reduce_every_microbatch and plan.layout.pp == 1


def spans_beside_compute(plan: StepPlan, rank: int, spans: list[Span], units: list[ShardedUnit]) -> list[Span]:
    """Of ``spans`` (`sharded_microbatch_spans` of ``units`` on ``rank``: the forward's gathers first, one per
    unit with parameters, the backward's last reduce-scatter last), those that run beside the compute: under
    PyTorch FSDP not the first two units' gathers, which each forward's start waits for, nor the backward's last
    reduce-scatter where the next forward waits for it (`microbatch_starts_s`). Over a one-rank shard group
    there are neither (the spans are the routed experts' alone): all of them."""
    if not (plan.sharding.fsdp and plan.sharding.reshard_after_forward):
        return spans
    if len(shard_group(plan.layout, rank, plan.sharding.degree)) == 1:
        return spans
    opening = min(OPENING_GATHERS, sum(1 for unit in units if unit.params > 0))
    return spans[opening:-1] if waits_for_last_reduction(plan) else spans[opening:]


def kernels_s(blocks: list[Block]) -> tuple[float, float]:
    """Seconds of ``blocks``' kernels per micro-batch, every pass's (the recompute's included), and the share of
    them that is SM-bound (0 where there are none): what the SMs of collectives running beside them slow."""
    compute = sum(block.forward_s + block.backward_input_s + block.backward_weight_s + block.recompute_s
                  for block in blocks)
    sm_bound = sum(block.sm_bound_seconds(phase) for block in blocks for phase in PASSES)
    return compute, sm_bound / compute if compute > 0 else 0.0


def sharded_slowdown(spans: list[Span], times: CollectiveTimes, share: SmShare | None,
                     blocks: list[Block], blocking_s: float) -> tuple[float, float]:
    """ZeRO-3's SM toll per micro-batch on ``blocks``' kernels (`sharded_toll_s` over ``spans``; none where
    ``share`` is None) and the factor it slows them by: 1 + the toll over their seconds (`kernels_s`). The
    collectives run beside the compute stream's kernels and its ``blocking_s`` seconds of work the engine does
    not slow (it slows a kernel by its SM-bound share; `unslowed_s`: blocking TP and CP collectives, MoE
    all-to-alls, FSDP2's copy-outs and gradient copies): each span is charged for the kernels' share of that
    time. The gradient copies count: a unit's reduce-scatter and the gather beside it start after the copy of
    its gradients, but a layer's unit copies each block's as its backward ends, and the pair runs on past the
    first (Llama-3-8B tp 2 dp 16 over four hosts: a layer's 3.36 ms reduce-scatter past its MLP's copy)."""
    compute, sm_bound = kernels_s(blocks)
    if share is None or compute <= 0:
        return 0.0, 1.0
    toll = sharded_toll_s(spans, times, share, compute, sm_bound, compute / (compute + blocking_s))
    return toll, 1 + toll / compute


def sharded_toll_s(spans: list[Span], times: CollectiveTimes, share: SmShare,
                   compute_s: float, sm_bound: float, kernel_share: float = 1.0) -> float:
    """Seconds ZeRO-3's collectives beside ``compute_s`` seconds of kernels (SM-bound for the share
    ``sm_bound``) add to them by the SMs their NCCL kernels hold (`SmShare.overlap_delay`), span by span of
    ``spans`` (`sharded_microbatch_spans`), each for the share ``kernel_share`` of it that the compute stream
    runs kernels in: where the backward's gather and reduce-scatter run together, both kernels' SMs; at most
    what the compute loses run under the most held throughout."""
    held = [sum(times.sms(*shape, share) for shape in running) for _, running in spans]
    if not spans or compute_s <= 0:
        return 0.0
    total = sum(share.overlap_delay(kernel_share * seconds, sms, compute_s, sm_bound)
                for (seconds, _), sms in zip(spans, held))
    together = kernel_share * sum(seconds for seconds, _ in spans)
    return min(total, share.overlap_delay(together, max(held), compute_s, sm_bound))


def grad_copies_s(plan: StepPlan, params: float) -> float:
    """Seconds per step of PyTorch FSDP's copies of ``params`` weights' fresh gradients on the compute stream
    (`Sharding.grad_copy_bytes` over the step's micro-batches, at ``grad_copy_rate``; 0 where none are
    charged)."""
    sharding, m = plan.sharding, plan.microbatches
    if sharding.grad_copy_rate <= 0:
        return 0.0
    return params * sum(sum(sharding.grad_copy_bytes(mb == 0, mb == m - 1, plan.layout.pp > 1))
                        for mb in range(m)) / sharding.grad_copy_rate


def expert_exchange_s(step: TrainingStep, times: CollectiveTimes, pp_rank: int) -> float:
    """Seconds per micro-batch that pipeline rank ``pp_rank`` spends in its MoE blocks' all-to-alls, all of
    them exposed (they hold the compute stream). Each pass that exchanges tokens (`ExpertWork.exchanges`: the
    forward, a full recompute, the backward) runs a dispatch and a combine over the EP group of the stage's
    first rank (`ep_group`), one sending the routing sample's bytes per pair and the other their transpose, as
    the program's ops do, each timed beside its copies in the stage's other EP groups that share a link with
    it (`CollectiveTimes.with_copies`)."""
    plan = step.plan
    first = plan.layout.rank_of(pp=pp_rank)
    return sum(block_exchanges_s(plan, times, block, first, PASSES)
               for vstage in plan.rank_stages(pp_rank) for block in plan.stages[vstage].blocks)


def block_exchanges_s(plan: StepPlan, times: CollectiveTimes, block: Block, rank: int,
                      phases: tuple[Pass, ...]) -> float:
    """Seconds per micro-batch of ``block``'s MoE all-to-alls in ``phases`` on ``rank`` (0 for a dense
    block): a dispatch and a combine over ``rank``'s EP group per pass that exchanges tokens, timed beside the
    copies the stage's other EP groups run at the same moment (`group_images`), as `expert_exchange_s` says."""
    experts = block.experts
    passes = sum(experts.exchanges(phase) for phase in phases) if experts is not None else 0
    if experts is None or not passes:
        return 0.0
    group = ep_group(plan.layout, rank, experts.ep)
    copies = group_images(plan.layout, rank, experts.ep, expert_dp=False)
    return passes * sum(times.with_copies(("all_to_all", group, experts.dispatch_bytes,
                                           experts.pairs(which, backward=False)), copies)
                        for which in ("dispatch", "combine"))


def expert_state_s(step: TrainingStep, times: CollectiveTimes, pp_rank: int) -> float:
    """Seconds pipeline rank ``pp_rank``'s routed experts add to the step outside the pipeline: their gradients
    reduced over the expert-data-parallel group after the last micro-batch and, under ZeRO, their parameters
    gathered after the optimizer step (the program's `expert_gradient_reduction` and `expert_param_gather`),
    each timed alone (`CollectiveTimes`). Neither overlaps the backward: the reduction waits for every MoE block's
    gradients."""
    plan = step.plan
    rank = plan.layout.rank_of(pp=pp_rank)
    experts = [block.experts for vstage in plan.rank_stages(pp_rank) for block in plan.stages[vstage].blocks
               if block.experts is not None]
    wanted = [expert_gradient_reduction(plan.layout, rank, experts, plan.sharding)]
    if plan.sharding.stage:
        wanted.append(expert_param_gather(plan.layout, rank, experts, plan.sharding))
    return sum(times.seconds(c.op, c.group, c.nbytes) for c in wanted if c is not None)


class CollectiveTimes:
    """Collectives planned with a run's collective settings and run alone on its idle network, as the engine
    times a collective that shares no link (`simulation.run_alone`); each shape once, since the candidates that
    differ only in sharding, recompute or interleaving exchange the same tokens over the same groups, and a
    64-wide all-to-all takes a few tenths of a second to time."""

    def __init__(self, topology: Topology, settings: NetworkSettings):
        self.topology = topology
        self.settings = settings
        self._plans = plan_cache(topology, settings)
        self._seconds: dict[tuple, float] = {}
        self._ends: dict[tuple[CollectiveShape | Exchange, ...], tuple[float, ...]] = {}
        self._with_copies: dict[tuple[Exchange, tuple[tuple[int, ...], ...]], float] = {}
        self._beside: dict[tuple[tuple[CollectiveShape, ...], tuple[tuple[float, CollectiveShape | Exchange], ...]],
                           float] = {}
        self._channels: dict[SmShare, NcclChannels] = {}
        self._sms: dict[tuple[SmShare, Primitive, tuple[int, ...], float, tuple[tuple[float, ...], ...],
                              AlgorithmChoice], int] = {}

    def seconds(self, op: Primitive, group: tuple[int, ...], nbytes: float,
                pair_bytes: tuple[tuple[float, ...], ...] = (), algorithm: AlgorithmChoice = "auto",
                protocol: ProtocolChoice = "auto") -> float:
        """Seconds of collective ``op`` over ``group``, ``nbytes`` per rank (``pair_bytes``: an uneven
        all-to-all's bytes per pair; ``algorithm`` and ``protocol``: the ones the program asks for)."""
        key = (op, group, nbytes, pair_bytes, algorithm, protocol)
        if key not in self._seconds:
            item = _collective(op, group, nbytes, pair_bytes, algorithm, protocol)
            self._seconds[key] = alone_seconds(self.topology, self.settings, self._plans.phases(item, group))
        return self._seconds[key]

    def with_copies(self, shape: Exchange, copies: tuple[tuple[int, ...], ...]) -> float:
        """Seconds of the collective ``shape`` (op, group, bytes per rank, bytes per pair) started together with
        its copies over the groups ``copies`` (the same op and bytes), as the other groups of its pipeline stage
        run it at the same moment of the same program: those of them whose plans share a link with its plan
        (`PlanCache.links`), where the fabric's spine hash lays their flows on the links of its own. Its alone
        time where none does (groups inside their hosts, or crossing the NICs on rails of their own)."""
        op, group, nbytes, pairs = shape
        if not copies:  # no plan to meet: its links need not be worked out
            return self.seconds(op, group, nbytes, pairs)
        key = (shape, copies)
        if key not in self._with_copies:
            links = self._plans.links
            own = links(_collective(op, group, nbytes, pairs), group)
            meeting = tuple((op, copy, nbytes, pairs) for copy in copies
                            if own & links(_collective(op, copy, nbytes, pairs), copy))
            self._with_copies[key] = (self.together(shape, *meeting)[0] if meeting
                                      else self.seconds(op, group, nbytes, pairs))
        return self._with_copies[key]

    def together(self, *shapes: CollectiveShape | Exchange) -> tuple[float, ...]:
        """When each of the collectives ``shapes`` (op, group, bytes per rank) ends, started together on the idle
        network, sharing its links as the engine shares them between collectives on different streams."""
        if shapes not in self._ends:
            self._ends[shapes] = together_ends(self.topology, self.settings, [self._phases(s) for s in shapes])
        return self._ends[shapes]

    def beside(self, running: tuple[CollectiveShape, ...],
               chain: tuple[tuple[float, CollectiveShape | Exchange], ...]) -> float:
        """Seconds the last collective of ``chain`` takes where the collectives of ``chain`` run one after another
        on one stream, each ``wait`` seconds (its pair's first) after the one before it ended, and the
        collectives ``running`` start together with the first wait, on the idle network (`simulation.chain_ends`):
        they share links with what of them is still under way. Waits are keyed to the nanosecond, so that the
        identical layers of a model, whose clocks differ by float rounding, share one timing."""
        key = (running, tuple((round(wait, 9), shape) for wait, shape in chain))
        if key not in self._beside:
            ends = chain_ends(self.topology, self.settings, [self._phases(shape) for shape in running],
                              [(wait, self._phases(shape)) for wait, shape in key[1]])
            self._beside[key] = ends[-1] - (ends[-2] if len(ends) > 1 else 0.0) - key[1][-1][0]
        return self._beside[key]

    def _phases(self, shape: CollectiveShape | Exchange) -> list:
        op, group, nbytes = shape[:3]
        return self._plans.phases(_collective(op, group, nbytes, shape[3] if len(shape) > 3 else ()), group)

    def sms(self, op: Primitive, group: tuple[int, ...], nbytes: float, share: SmShare,
            pair_bytes: tuple[tuple[float, ...], ...] = (), algorithm: AlgorithmChoice = "auto") -> int:
        """The SMs the kernel of collective ``op`` over ``group``, ``nbytes`` per rank, holds on each member, as
        the engine counts them (`NcclChannels`, with the algorithm the run would choose; ``pair_bytes`` and
        ``algorithm`` as `seconds` takes them: a CP ring step holds a send/receive pair's)."""
        key = (share, op, group, nbytes, pair_bytes, algorithm)
        if key not in self._sms:
            channels = self._channels.get(share)
            if channels is None:
                plans = self._plans
                channels = self._channels[share] = NcclChannels(
                    share, self.topology, lambda item: plans.resolved_algorithm(item, item.group))
            self._sms[key] = channels(_collective(op, group, nbytes, pair_bytes, algorithm))
        return self._sms[key]


def _collective(op: Primitive, group: tuple[int, ...], nbytes: float,
                pair_bytes: tuple[tuple[float, ...], ...] = (), algorithm: AlgorithmChoice = "auto",
                protocol: ProtocolChoice = "auto") -> CollectiveOp:
    """The program's op for collective ``op`` over ``group`` (what `CollectiveTimes` plans and counts)."""
    return CollectiveOp(id=0, rank=group[0], stream=COMPUTE_STREAM, name=op, op=op, group=group, nbytes=nbytes,
                        pair_bytes=pair_bytes, algorithm=algorithm, protocol=protocol)
