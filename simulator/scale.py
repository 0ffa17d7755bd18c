"""Scale refused before it explodes: what a run will need (GPUs, simulated ranks, ops, flows, memory),
estimated from the scenario and the topology's parameters before anything large is built, and the refusal of
runs beyond the limits, with the estimate and what to change; `sized_topology` builds a run's cluster only
once its layout fits the GPU count, the cluster is within MAX_GPUS and its estimate within the limits.

The estimate counts the per-rank program the way `program/` builds it (a forward, a backward and a recompute
op per block and micro-batch, split around the TP collectives as the builder splits them; TP/SP, EP, CP, P2P and
DP collectives; folded mirror groups), and each collective's flows the way its plan posts them (a group across
hosts runs a ring per channel, collectives/ring.py's count, an EP all-to-all or a userbuffers kernel a transfer
to every other member, a ring exchange one per member, beside the folded replicas that meet it, of which a
replica quotient sends only the first DP replicas'), within about a factor of two (tests/test_scale.py compares
it with real programs and runs). A folded run's ops and flows stop growing with DP; building the cluster and
the run's per-GPU structures does not, so clusters beyond MAX_GPUS are refused by their size. With
`collectives.algorithm: hierarchical` the phases of collectives/hierarchical.py are counted; otherwise every
collective counts as NCCL's ring would post it, but for the all-reduces that may run as trees (DDP buckets, TP
groups across NVLink domains, a `workload:` item's; `may_run_trees`): before the cluster is built they count as
rings too, a lower bound, and once it is built (`sized_topology`, `validate`) as the plans the tuner picks for
each size post them (`_planned_transfers`; a tree posts a phase per stretch of its pipeline: the SC21 18.4B
step, 15,672 flows estimated, 15,488 simulated). A TP all-reduce across hosts, ring or tree, counts its copies
in the other replicas for its all-reduces that run beside other dimensions' traffic joining them (`_tp_beside`:
SC21 7.5B at TP 16, rings under `auto`, 243,344 of 243,344 flows; under pipelining those of the schedule's
actions that may run beside a hand-off, `_tp_beside_pipeline`), and so do the DDP buckets' copies in the
other TP lanes and CP's rings' copies, for those beside the traffic that joins them (`_dp_beside`,
`_cp_ring_beside`). A TP all-reduce inside a host counts every
copy of its stage beside DP rings across hosts that hop on NVLink, which join them all (SC21 7.5B: 47,244 of
46,316 flows, 29,513 counting one group). The trays of a GB200 NVL72 rack are one NVLink domain, counted as a
host: a group across them keeps the copies the rack's other groups join to it (TP 8 x DP 9 on one rack: 4,056 of
3,993 flows, 1,387 counting one copy). Where a GB200 step folds by its trays' classes (`_folds_by_trays`), the
classes engine/rank_classes.py keys are counted (`_tray_classes`), each tray's groups with the copies that meet them
(the bundled job's step cut to 4 layers: one class a stage, 2 ranks, ops exact, flows 1.015 of the run); where
its stages straddle the racks of a fabric that does not rotate the run unfolds, and so is it estimated.
`--force` runs past the limits.

A step asked to fold is estimated folded, but for a MoE step whose gathers meet a skewed router's all-to-alls
unlike their mirrors, which the fold check will unfold and which is estimated unfolded (`_skew_unfolds`: the
deferred expert gathers of `mixtral-8x7b-ep8` cut to 2 layers, 6,016 of 6,016 ops; the stage fold's ranks post
352); when a fold check unfolds it anyway (the plan's context parallelism,
the cluster, the collectives' symmetry on the flow model, the step's faults: program/unfolding.py),
`refuse_unfolded` estimates it again unfolded before the unfolded program is built, refusing it at the gathers'
field with the same advice where they are why.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from simulator.collectives.hierarchical import even_rows
from simulator.collectives.names import AlgorithmChoice, AlgorithmName, Primitive, ProtocolChoice, run_choice
from simulator.collectives.ring import cross_host_channels, domain_rails, fewest_nics, usable_rails
from simulator.collectives.tree import nccl_nodes
from simulator.config.loader import LoadedScenario
from simulator.config.locate import located
from simulator.config.schema import CollectiveItem, ParallelismConfig, Scenario
from simulator.config.traces import TraceWorkload
from simulator.config.training_options import Recompute, grad_buffer_bytes
from simulator.engine.replicas import shift_step
from simulator.errors import ScenarioError
from simulator.network.modes import NetworkMode
from simulator.parallel.experts import ep_group, expert_group_numbers, expert_shard_groups
from simulator.parallel.layout import Layout
from simulator.parallel.sharding import hybrid_degree, replica_group, shard_group
from simulator.topology.graph import Topology
from simulator.topology.loader import scenario_source_or_none, scenario_topology
from simulator.topology.size import SIZE_PARAMETERS, HostShape, host_shape, topology_gpus
from simulator.units import counted
from simulator.workload.calibrated import tp_overlap
from simulator.workload.training import PRECISION_BYTES, tp_domains

if TYPE_CHECKING:
    from simulator.collectives.phases import CollectiveRequest
    from simulator.config.yaml_source import FieldPath
    from simulator.engine.fold_policy import FoldedStep
    from simulator.program.step import StepProgram
    from simulator.program.unfolding import FoldCheck, Unfolding

MAX_MEMORY_BYTES = 16 * 2**30
"""Refuse runs estimated to need more memory than this (16 GiB; the 8,192-GPU Llama 3 405B run needs ~1 GiB)."""
MAX_EVENTS = 20_000_000
"""Refuse runs estimated to simulate more ops plus flows than this (about ten minutes of simulation; the
8,192-GPU Llama 3 405B run has ~0.4 M)."""
EVENTS_PER_MINUTE = MAX_EVENTS // 10
"""Ops plus flows a run simulates in about a minute, as MAX_EVENTS assumes: a conservative round figure (MAX_EVENTS
// 10, 30 us an event), not a measured rate. From this many on, `validate` says how long a step that runs unfolded
will take (the DeepSeek-V3-style step at ep 16, ~1.0 M ops and ~12 M flows unfolded, ran about 4 minutes on the
shared 2-core machine, ~18 us an event of wall time)."""

PS_EVENTS_PER_MINUTE = EVENTS_PER_MINUTE // 8
"""`EVENTS_PER_MINUTE` for a parameter-server run, whose pushes all share the server GPUs' NICs, so that each
flow that starts or ends re-solves the rates of thousands: measured on the shared 2-core machine (load 12 to 15,
2026-12-06) at ~266 k ops plus flows a minute, a 32-host run (4 server hosts) 10 s and a 64-host run (8) 42 s
an iteration beyond the first, which took 22 and 77 s (the DeepSeek-V3-style step ran ~1.7 M a minute
alongside)."""

CLUSTER_SECONDS_PER_GPU = 133e-6
"""CPU seconds a run spends per GPU of its cluster whatever it simulates: building the graph, link arrays and
router (~18 us), the network model and the per-rank structures of the layout, folding and replica quotient. Measured
by benchmarks/cluster_cost.py on 2026-12-04 (shared 2-core Xeon): the 405B step (TP8 PP16, DP = GPUs / 128,
folded, run.timeline summary) took 3.25 s at 16,384 GPUs (198 us a GPU, 42 k ops and 165 k flows included),
8.98 s at 65,536 (137 us; 11 k ops, 86 k flows) and 34.8 s at 262,144 (133 us; 3.5 k ops, 13 k flows): a
folded run's ops and flows shrink as DP grows, its per-GPU structures do not."""
TOPOLOGY_BYTES_PER_GPU = 8_100
"""Memory per GPU of the cluster and the run's per-GPU structures (same measurement: peak RSS grew by 504 MiB at
65,536 GPUs, 2,029 MiB at 262,144; the graph alone ~2.9 kB a GPU)."""
MAX_GPUS = 2**18
"""Refuse clusters of more GPUs than this, whatever the folding: 262,144 GPUs, the largest measured, cost ~35 s
and ~2 GiB before the step's own ops and flows; a million would take over two minutes and ~8 GiB
(`CLUSTER_SECONDS_PER_GPU`, `TOPOLOGY_BYTES_PER_GPU`), while a folded run's ops and flows stay few."""
PROCESS_BYTES = 200 * 2**20
"""Memory a run holds whatever it simulates, beside its cluster: Python, numpy, pandas, the simulator's modules and
the reports' writers (a 116-op step with its full timeline peaked at 110 MiB; a line fitted through the GB200
step's peaks (full timeline) against its ops and flows meets zero at ~230 MiB). `OP_BYTES` has the measurements."""
OP_BYTES = 650
"""An op object, its SimPy process state and its log record, without its timeline row. `OP_BYTES`, `FLOW_BYTES`,
`TRACE_BYTES_PER_ROW` and `PROCESS_BYTES` come from the peak RSS (`/usr/bin/time -v`) of `trainsim run` against
the estimate's ops and flows, one step a run, `run.timeline` summary and full, measured 2026-12-07 on the shared
2-core machine at a load of 8 to 15 (docs/performance.md has the table). An event's cost between two sizes: the
GB200 job's step (TP 4, PP 2, one rank a tray) the costliest, 661 B between 4 racks of 8 layers (207,252 ops and
flows, 194 MiB) and 16 racks of 16 (742,896, 532 MiB) with no timeline, 542 B with it (4 racks of 8 layers to 16
of 32: 338 and 981 MiB); a dense DGX H100 step unfolded (Llama 3 8B, DP 64 to 512) 357 B with no timeline and
579 B with it; the 405B step folded 600 B with it; a MoE step's all-to-alls (DeepSeek-V3-style, 32 ranks folded)
~230 B an event its run posts with no timeline. An op and a flow are charged alike: the cost differs more between
kinds of run than between ops and flows. With the full timeline the estimate is 1.07 to 1.40 times the measured
peaks (1.35 at 1.45 M events of the GB200 step), 1.27 to 2.65 times without it, but for the 405B step folded
(1.6 to 2.1 with the timeline, 3.4 without, ~335 MiB of it its mirror entries) and the DeepSeek-V3-style step's
full timeline, 0.96: its estimate counts 0.56 of the flows its run posts."""
FLOW_BYTES = 650
"""A flow's network state and its log record, without its timeline row (`OP_BYTES` has the measurements)."""
COMM_FLOW_BYTES: dict[NetworkMode, int] = {"flow": 700, "analytic": 1_500}
"""A communication run's flow (a `workload:` list's, `trainsim collective`'s) under each network model: the
analytic model holds about twice the flow model's, measured 2026-12-06 (shared 2-core machine, load 5-8) as the
peak RSS of `trainsim collective --topology dgx-h100-cluster --op all_to_all --sizes 1MiB --network analytic`
over 512 and 1,024 GPUs (261,632 and 1,047,552 flows: 452 and 1,596 MB, 1,455 B a flow between them; under
flow, 269 MB at 512 GPUs)."""
COLLECTIVE_EVENT_S: dict[NetworkMode, float] = {"flow": 3e-6, "analytic": 4e-6}
"""CPU seconds `trainsim collective` spends on each op and transfer of a size under each network model
(`collective_seconds`): a collective alone is planned once and its phases run back to back on an idle network, under
flow those of 512 transfers or more in the array form (network/isolated.py). Measured by
benchmarks/collective_cost.py (docs/performance.md, which has the figures): trees, rings, NVLS and hierarchical plans
over 16 to 512 DGX H100 hosts, trees, the largest, 2 to 5 us. CPU time, not wall time: it does not grow with the
machine's load, where the wall time on a loaded shared machine is several times it and varies more between runs."""
DIRECT_EVENT_S: dict[NetworkMode, float] = {"flow": 20e-6, "analytic": 10e-6}
"""`COLLECTIVE_EVENT_S` of a direct plan (an all-to-all's): it posts every member's transfer to every other in one
phase, whose flows across leaves share links with all the others and finish at tens of instants (71 over 32 DGX
H100 hosts, 77 over 64), at each of which the flow model solves the rates of the whole phase again: 14 to 23 us an
op or transfer across leaves under flow, 7 to 10 us under analytic (same measurement; within a leaf, 16 hosts, 4
instants and about a tree's cost under flow)."""
TRACE_BYTES_PER_ROW = 150
"""A row of the timeline while timeline.parquet and trace.json are written (`run.timeline: full` writes every op
and flow): the dense step unfolded peaked 68 MiB higher with its full timeline than without for 323,072 more rows
(221 B a row, beside ~95 MiB whatever the rows), the GB200 step 132 MiB higher at 513,864 rows (8 racks of 16
layers), the DeepSeek-V3-style step 360 MiB at 966,967 (`OP_BYTES` has the measurements)."""
MIRROR_ENTRY_BYTES = 8
"""One rank index in a folded collective's mirror groups."""
RECOMPUTE_SHARE = {"none": 0.0, "selective": 0.5, "full": 1.0}
"""Recompute ops per block and micro-batch: selective recomputes the attention core, full every block."""


@dataclass(frozen=True)
class ScaleEstimate:
    """What a run is expected to need; compared with the limits before it is built."""

    gpus: int
    simulated_ranks: int
    ops: int
    flows: int
    memory_bytes: float
    folded: bool
    tp_host_gpus: int = 0
    """The GPUs of an NVLink domain (a host; a GB200 NVL72 rack) when TP groups cross domains (their collectives
    then run on the network: a ring per channel and most of the flows), else 0."""
    tp_order: bool = False
    """Whether TP groups cross domains because of `parallelism.order` (TP not innermost), not their degree."""
    trees: bool = False
    """Whether the tuner runs some all-reduce as a tree, whose plan posts a phase per stretch of its pipeline
    (`_planned_transfers`)."""
    unfolded_by: FieldPath | None = None
    """The field whose gathers the fold check will find meeting a skewed router's all-to-alls unlike their
    mirrors, running a step asked to fold unfolded, as estimated (`_skew_unfolds`); None where it folds as asked."""
    lower_bound: bool = False
    """Whether the count stopped once past the limits (`estimate_scale`'s ``stop_past_limits``): the run needs at
    least these flows and this memory."""

    @property
    def about(self) -> str:
        """How the flows, events and memory are read: '~', or 'at least ' for a `lower_bound`."""
        return "at least " if self.lower_bound else "~"

    @property
    def events(self) -> int:
        """Ops and flows together, the simulated events the limit counts."""
        return self.ops + self.flows

    def over_limits(self) -> bool:
        """Whether the run needs more than MAX_MEMORY_BYTES or MAX_EVENTS."""
        return self.memory_bytes > MAX_MEMORY_BYTES or self.events > MAX_EVENTS

    def beyond(self) -> str:
        """Which limits the estimate passes, each with its value against the limit: what a refusal names ('' for
        none). A refusal gave the estimate and both limits, leaving the user to find which one it passed."""
        over = []
        if self.events > MAX_EVENTS:
            over.append(f"ops + flows {self.about}{self.events:,} over the limit of {MAX_EVENTS:,}")
        if self.memory_bytes > MAX_MEMORY_BYTES:
            over.append(f"memory {self.about}{self.memory_bytes / 2**30:,.1f} GiB over the limit of "
                        f"{MAX_MEMORY_BYTES / 2**30:,.3g} GiB")
        return " and ".join(over)

    def describe(self) -> str:
        """The estimate in words, for the refusal message."""
        return (f"{self.gpus:,} GPUs, {self.simulated_ranks:,} simulated ranks "
                f"({'folded' if self.folded else 'not folded'}), ~{self.ops:,} ops, {self.about}{self.flows:,} "
                f"flows, {self.about}{self.memory_bytes / 2**30:,.1f} GiB of memory")


def _limit_flows() -> float:
    """Flows past both limits whatever else a run holds (MAX_EVENTS, and MAX_MEMORY_BYTES beyond PROCESS_BYTES at
    FLOW_BYTES a flow): where the DDP buckets' trees alone pass them, a refusal stops counting (`estimate_scale`'s
    ``stop_past_limits``) and names both."""
    return max(MAX_EVENTS, (MAX_MEMORY_BYTES - PROCESS_BYTES) / FLOW_BYTES)


def _dp_collectives(par: ParallelismConfig, m: int, blocks: float, units: float, buckets: float,
                    expert_dp: bool = False, gathers: float = 1.0, moe_layers: float = 0.0,
                    head: bool = False) -> float:
    """Data-parallel collectives of one rank per step. ZeRO-3 all-gathers each block (DeepSpeed) or each wrapped
    unit (PyTorch FSDP: a layer, a MoE layer's routed experts, the embedding, the head) in every forward and
    backward, but for the head's backward (where ``head``: its unit among ``units``, which stays gathered from
    its forward to its backward, parallel/program.py `_zero3_gather`), and reduce-scatters each unit's
    gradients every micro-batch, or, PyTorch FSDP without `ddp.reduce_every_microbatch` (its no-sync), once in
    the last backward; under pipelining PyTorch FSDP gathers each unit once a step and reduce-scatters it once,
    after its chunk's last backward. Plain DDP all-reduces its buckets (`_ddp_buckets`: the embedding's and
    the head's tensors among them). ZeRO-1/2 reduce-scatters the buckets, or, where ZeRO-2 (`zero: 2`,
    `fsdp: shard_grad_op`) reduces every micro-batch's gradients (`ddp.reduce_every_microbatch`), each unit
    every micro-batch in their place (parallel/program.py `_grads_done`), and gathers the parameters once
    after the optimizer (`_data_parallel`), or with `ddp.overlap_param_gather` bucket by bucket in the next
    forward (``gathers``: `_param_gather_buckets`, parallel/overlap.py `_deferred_param_gathers`). With
    routed experts reduced over an expert-data-parallel group of several ranks (``expert_dp``), their
    gradients are reduced once a step besides and, under ZeRO-1/2, their parameters gathered once or,
    deferred, once for each of the rank's ``moe_layers`` (parallel/block_passes.py)."""
    if par.pipelined_fsdp(par.pp):
        return units * 2
    every = par.reduce_every_microbatch(par.pp)
    if par.gathers_per_unit:
        return units * 2 * m - (m if head else 0.0) + (units * m if every else units)
    if par.zero == 3:
        return blocks * 2 * m + units * m
    if par.zero_stage not in (1, 2):
        return buckets + (1.0 if expert_dp else 0.0)
    reductions = units * m if every else buckets
    expert_gathers = moe_layers if par.ddp.overlap_param_gather else 1.0
    return reductions + gathers + (1.0 + expert_gathers if expert_dp else 0.0)


def _param_gather_buckets(par: ParallelismConfig, layer_blocks: tuple[float, float], layers: float,
                          param_bytes: float, pp: int, embedding: float, head: float) -> float:
    """The parameter gathers a rank posts per step under ZeRO-1/2 (one after the optimizer, or with
    `ddp.overlap_param_gather` one per bucket that its stage's blocks fill in forward order, a bucket closing at
    the block that brings it to `ddp.bucket` bytes: parallel/overlap.py `_deferred_param_gathers`), averaged over
    the ``pp`` stages as `_ddp_buckets` averages the gradients' buckets: the first stage's ``embedding`` block
    first, then ``layers`` layers of ``layer_blocks`` (a layer's attention and MLP parameters), the last stage's
    ``head`` last."""
    if not par.ddp.overlap_param_gather:
        return 1.0
    attention, mlp = layer_blocks
    return _ddp_buckets((mlp, attention), layers, param_bytes, par.ddp.bucket, pp, (embedding,), (head,))


def _fsdp_copies(par: ParallelismConfig, m: int, blocks: float, units: float, same_bytes: bool,
                 head: bool) -> float:
    """PyTorch FSDP2's copies of one rank per step (parallel/program.py), compute ops beside its collectives:
    each block's gradient copy every micro-batch (`_grad_copy`, Sharding.grad_copy_bytes), but for the first
    micro-batch's where the gradients accumulate unsharded in the training precision (``same_bytes``: autograd's
    gradient is the accumulator) unless that backward is also the one that reduces them, and, where they are
    accumulated under pipelining, its reduce copy once (`_reduce_copies`); with `full_shard | hybrid_shard` a
    copy-in and a copy-out around each all-gather of its ``units`` gathered over more than one rank
    (`_gather_copied_in`, `_copy_out`): every forward's and every backward's, or once a step under pipelining;
    where the dense units are gathered (``head``), none in the head's backward, its unit staying gathered from its
    forward."""
    pipelined = par.pipelined_fsdp(par.pp)
    accumulated = not par.reduce_every_microbatch(par.pp)
    reduce_copy = accumulated and par.pp > 1
    first_skipped = accumulated and same_bytes and (m > 1 or reduce_copy)
    copies = blocks * (m - first_skipped + reduce_copy)
    if par.gathers_per_unit:
        copies += 2 * (units if pipelined else units * 2 * m - (m if head else 0.0))
    return copies


def _hybrid_degree(layout: Layout, hosts: HostShape | None) -> int:
    """HSDP's shard group size: rank 0's DP x CP ranks in its NVLink domain (parallel/sharding.py `hybrid_degree`,
    the program's rule, with ``hosts``' domains of consecutive GPUs for the topology's); 0 where they are the
    whole group (one host: no replicas)."""
    if hosts is None:
        return 0
    degree = hybrid_degree(layout, lambda rank: rank // hosts.domain)
    return degree if degree < layout.dp * layout.cp else 0


def _cp_collectives(par: ParallelismConfig, recompute: Recompute) -> int:
    """Context-parallel collectives of one rank per layer and micro-batch (parallel/context.py): a ring of cp - 1
    steps (or one K/V all-gather) for the forward, another for a full recompute (a selective one keeps the
    gathered K/V), and for the backward a ring, or an all-gather and the gradients' reduce-scatter."""
    if par.cp_algorithm == "ring":
        return (2 + (recompute == "full")) * (par.cp - 1)
    return 3 + (recompute == "full")


def _cp_ring_splits(recompute: Recompute) -> int:
    """Compute ops ring attention adds per layer and micro-batch (parallel/block_passes.py `_context_pass`): each
    pass that runs the K/V ring (`_cp_collectives`) splits its attention block into the rest, the core beside
    the ring's steps and the core's last block after them, two parts more."""
    return 2 * (2 + (recompute == "full"))


def _tp_splits(par: ParallelismConfig, recompute: Recompute, moe: bool,
               backward: float) -> tuple[float, Counter[str]]:
    """Per layer and micro-batch (two blocks, attention and MLP), the compute ops TP adds by splitting a block's
    pass around its collectives, and the TP collectives by the plan that posts them (`TP_PLANS`), as the builder
    posts them (parallel/overlap.py). Without sequence parallelism an all-reduce after each block's forward and
    backward (a MoE block's an all-gather). With it, per block: the forward's all-gather and reduce-scatter; the
    backward's all-gather, the input's all-gather again and the reduce-scatter, the pass split into the rest, the
    input-gradient and the weight-gradient GEMMs; a ``moe`` layer's MLP block runs its routed experts on the
    whole sequence with no TP collective (`TpPattern.EXPERTS`). With `tp_comm_overlap`, each all-gather before
    a GEMM is a ring exchange (and a pair swap where it aggregates) beside the GEMM's first steps and then its
    last step, the forward's reduce-scatter a userbuffers kernel each of `chunks` GEMM chunks, and the
    backward's input all-gather and reduce-scatter userbuffers kernels too. A full recompute runs the forward's
    collectives again (counted without the overlap; with it they are not). A split backward (``backward``
    passes a block, `_backward_passes`) runs the same three parts, the rest and the input-gradient GEMM in its
    B and the weight-gradient GEMM as its W, so the parts its W pass adds are taken off."""
    again = recompute == "full"
    if not par.sequence_parallel:
        return 0, Counter(ring=4 + 2 * again)
    split = 3 - backward  # the parts beyond the block's `1 + backward` passes
    if not par.tp_comm_overlap:
        blocks = 1 if moe else 2
        return blocks * split, Counter(ring=blocks * (5 + 2 * again))
    overlap = tp_overlap()
    aggregate = overlap.aggregate and par.tp % 2 == 0 and par.tp > 2
    compute = split + 2 + overlap.chunks + 2  # the split pass; GEMM steps of both exchanges; the RS chunks
    plans = Counter(exchange=2, userbuffers=overlap.chunks + 2, **({"pair": 2} if aggregate else {}))
    return 2 * compute, Counter({plan: 2 * count for plan, count in plans.items()})


def _tp_ends(par: ParallelismConfig) -> int:
    """The TP collectives of the embedding and the head per micro-batch, which the first and the last stage post
    beside the layers' (parallel/overlap.py `tp_op`, none of them recomputed): the embedding's all-reduce after its
    forward and the head's after its backward; with sequence parallelism the embedding's reduce-scatter, the
    head's all-gather before its forward and reduce-scatter after its backward, and the all-gather of its input
    again in its backward (`_head_splits`)."""
    return 4 if par.sequence_parallel else 2


def _backward_passes(par: ParallelismConfig, m: int, table: Path | None = None) -> float:
    """Backward ops per block and micro-batch, on average over the pipeline's ranks: one for a whole backward
    (BW), two where the schedule splits it into its input-grad (B) and weight-grad (W) passes, as the schedule
    of ``m`` micro-batches does for each rank (ZB-H1 splits p of the m backwards on every rank but rank 0, rank
    r's first r and last p - r, zero_bubble.py's head and tail: p 4, m 8, 1.375, the step's 128 ops; zbv and
    interleaved-zb split every one). A custom table's
    own actions are read from ``table``, its path resolved from the scenario's folder; where that path is not
    known, or the table cannot be read, every backward counts as split, an upper bound (its own check reports a
    table that cannot be read). One for a named schedule that cannot be built (its own check reports it)."""
    from simulator.schedules.registry import build_schedule

    pp, v = par.pp, par.pipeline.virtual_stages
    try:
        if par.pipeline.table is not None:
            if table is None:
                return 2.0
            schedule = build_schedule(par.pipeline.schedule, pp, m, v, table)
        else:
            schedule = build_schedule(par.pipeline.schedule, pp, m, v)
    except ScenarioError:
        return 2.0 if par.pipeline.table is not None else 1.0
    backwards = sum(action.kind in ("B", "W", "BW") for actions in schedule for action in actions)
    return backwards / (pp * m * v)


def _head_splits(par: ParallelismConfig, backward: float) -> float:
    """Compute ops the head's backward adds per micro-batch with sequence parallelism, which saves its input
    sharded (parallel/overlap.py `_column_backward`): the pass split into the rest and the input-gradient GEMM
    beside the input's all-gather, then the weight-gradient GEMM after it, two parts more; one where the backward
    is split (the weight gradients are a pass of their own). ``backward`` is `_backward_passes`' average over
    the pipeline's ranks, so the head's backwards count as split in the pipeline-wide share ``backward`` - 1,
    not as its own stage's schedule splits them."""
    if par.tp < 2 or not par.sequence_parallel:
        return 0
    return 3 - backward


def _head_bulk(par: ParallelismConfig) -> int:
    """The head's TP collectives per micro-batch that `tp_comm_overlap` runs as userbuffers kernels beside its
    backward's GEMMs (parallel/overlap.py `_column_backward`: the input's all-gather again and the input
    gradient's reduce-scatter); its forward's all-gather stays NCCL's, as the embedding's reduce-scatter."""
    return 2 if par.tp_comm_overlap and par.sequence_parallel else 0


def _tp_beyond_layers(par: ParallelismConfig, pp: int, v: int) -> float:
    """The TP collectives of a rank per micro-batch beside its layers', on average over the ``pp`` stages: the
    embedding's and the head's (`_tp_ends`) and, without sequence parallelism, Megatron's scatter-gather, an
    all-gather of the slices of every hand-off a stage receives (parallel/program.py `_receive`; ``v`` virtual
    stages a rank)."""
    gathers = 2 * (pp * v - 1) / pp if pp > 1 and not par.sequence_parallel else 0.0
    return _tp_ends(par) / pp + gathers


TP_PLANS = ("ring", "userbuffers", "exchange", "pair")
"""How a TP collective posts its transfers: `ring`, NCCL's (the TP group's `CollectiveShape`); `userbuffers`,
one phase of every member to every other (collectives/userbuffers.py); `exchange`, the ring exchange, one transfer
per member of its ring (every other TP rank where the overlap aggregates, else all); `pair`, the aggregating
overlap's pair swap, two transfers."""


def _tp_transfers(par: ParallelismConfig, plans: dict[str, float], ring: float) -> float:
    """The transfers a TP collective posts on average over ``plans`` (`TP_PLANS`), NCCL's ring posting
    ``ring``."""
    tp = par.tp
    exchange = tp // 2 if plans.get("pair") else tp
    per_plan = {"ring": ring, "userbuffers": tp * (tp - 1), "exchange": exchange, "pair": 2}
    return sum(count * per_plan[plan] for plan, count in plans.items()) / max(sum(plans.values()), 1)


def _ep_all_to_alls(recompute: Recompute) -> int:
    """EP all-to-alls of one rank per MoE layer and micro-batch (parallel/experts.py): the dispatch and the
    combine in the forward and again, reversed, in the backward, and in a full recompute's forward."""
    return 4 + 2 * (recompute == "full")


BUCKET_LAYERS = 64
"""Layers whose DDP buckets `_buckets` fills one by one; a stage of more repeats their count per layer."""


def _bucket_sizes(tensors: tuple[float, ...], layers: float, grad_bytes: float, bucket: float
                  ) -> tuple[list[float], float]:
    """The bytes of the DDP buckets that up to `BUCKET_LAYERS` of ``layers`` layers of a rank's ``tensors`` (a
    layer's, elements, in forward order) fill as parallel/work.gradient_buckets fills them, in reverse (a bucket
    closes at the tensor that brings it to ``bucket`` bytes, so a tensor larger than a bucket closes one alone;
    `ddp.bucket: 0 B`: one per tensor), and how many times their count repeats over ``layers``."""
    return _filled([], [], layers, tensors, grad_bytes, bucket), layers / _walked(layers)


def _walked(layers: float) -> int:
    """The layers of a stage `_bucket_sizes` walks: at most `BUCKET_LAYERS`."""
    return max(1, min(round(layers), BUCKET_LAYERS))


def _filled(first: list[float], last: list[float], layers: float,
            tensors: tuple[float, ...], grad_bytes: float, bucket: float) -> list[float]:
    """The bytes of the buckets that ``first``'s tensors, then `_walked` layers of ``tensors`` (each in
    reverse), then ``last``'s fill, a bucket closing at the tensor that brings it to ``bucket`` bytes."""
    sizes, size = [], 0.0
    walk = [*first, *[tensor for tensor in reversed(tensors) if tensor > 0] * _walked(layers), *last]
    for tensor in walk:
        if tensor <= 0:
            continue
        size += tensor * grad_bytes
        if size >= bucket:
            sizes.append(size)
            size = 0.0
    return sizes + ([size] if size > 0 else [])


def _ddp_buckets(tensors: tuple[float, ...], layers: float, grad_bytes: float, bucket: float, pp: int,
                 opening: tuple[float, ...], closing: tuple[float, ...]) -> float:
    """Buckets a rank fills on average over the ``pp`` stages (`_bucket_sizes`), walking the last stage's
    ``opening`` tensors first, then ``layers`` layers' ``tensors``, the first stage's ``closing`` ones last: the
    gradients as parallel/work.gradient_buckets fills them in the order the last backward finishes the blocks
    (the head opens, the embedding closes: SC21 7.5B at TP 16, 2 layers, fills 2 buckets), or the parameters'
    deferred gathers in forward order (the embedding opens, the head closes). Past `BUCKET_LAYERS` the layers'
    buckets repeat and the ends add what they add to the walked ones."""
    sizes, times = _bucket_sizes(tensors, layers, grad_bytes, bucket)

    def count(first: tuple[float, ...], last: tuple[float, ...]) -> float:
        ends = len(_filled([*reversed(first)], [*reversed(last)], layers, tensors, grad_bytes, bucket))
        return len(sizes) * times + ends - len(sizes)

    if pp == 1:
        return count(opening, closing)
    return (count(opening, ()) + count((), closing) + (pp - 2) * count((), ())) / pp


@dataclass(frozen=True)
class CollectiveShape:
    """One collective of a parallel dimension as the flow model runs it: its ``members``, the ``transfers`` its
    plan posts (a ring per channel across hosts, ring.py's channel count; the members inside one host), and the
    ``replicas`` of it per pipeline stage a folded run simulates beside it (the mirrors that meet the simulated
    traffic on the network: engine/sharing.py prunes the others, and those inside other hosts never meet it)."""

    members: int
    transfers: float
    replicas: int
    joined: bool = False
    """Whether the replicas that meet it are joined to it by another dimension across hosts (DP's rings on
    the same rails), so that they lie in other DP replicas rather than beside it in its own."""
    beside: float = 1.0
    """The share of its collectives that run beside the traffic joining its replicas to it: the others run alone
    on their links and post their own transfers only (engine/sharing.py `private_collectives` replays them)."""

    @property
    def folded_transfers(self) -> float:
        """The transfers a folded run posts for one of its collectives on average: its own and, for the share
        `beside`, those of its replicas."""
        return self.transfers * (1 + self.beside * (self.replicas - 1))


def _first_group(layout: Layout, kind: str, ep: int, degree: int = 0, rank: int = 0) -> tuple[int, ...]:
    """Rank 0's (or ``rank``'s) group of ``kind``: its EP block of the DP x CP group for `ep`
    (parallel/experts.py); under HSDP (``degree``, the shard group's size, below the DP x CP group's; 0: no HSDP)
    for ``dp`` its shard group and for ``replicas`` the ranks at its place in the other shard groups
    (parallel/sharding.py); for ``experts`` and ``expert_replicas`` those of its routed experts under PyTorch
    FSDP2 (`expert_shard_groups`)."""
    size = layout.dp * layout.cp
    if kind in ("experts", "expert_replicas"):
        return expert_shard_groups(layout, rank, ep, degree or size)[kind == "expert_replicas"]
    if kind == "replicas":
        return replica_group(layout, rank, degree or size)
    if kind == "dp":
        return shard_group(layout, rank, degree) if 0 < degree < size else layout.combined_group(("dp", "cp"), rank)
    return ep_group(layout, rank, ep) if kind == "ep" else layout.group(kind, rank)


def _domain_copies(layout: Layout, kinds: Iterable[str], hosts: HostShape, ep: int, degree: int) -> dict[str, int]:
    """The copies of each of ``kinds``' groups (each inside one NVLink domain) in rank 0's domain that meet its
    simulated traffic there: every such group of several members crosses its GPUs' NVLink ports, so a copy of
    one kind's group that shares a GPU with a copy of another's is reached (engine/sharing.py: connected
    through shared links), and so on: under TP 2 HSDP's shard group of the host's DP ranks reaches every TP pair
    of the host, and they every other shard group there. A ring across domains reaches further through its
    hops inside them, which this leaves to `_collective_shapes`' rules for the kinds that cross."""
    domain = range(hosts.domain)
    linking = [kind for kind in kinds if len(_first_group(layout, kind, ep, degree)) > 1]
    reached, frontier = {0}, [0]
    while frontier:
        rank = frontier.pop()
        for kind in linking:
            for member in _first_group(layout, kind, ep, degree, rank):
                if member in domain and member not in reached:
                    reached.add(member)
                    frontier.append(member)
    return {kind: len({_first_group(layout, kind, ep, degree, rank) for rank in reached}) for kind in kinds}


def _collective_shapes(layout: Layout, kinds: Iterable[str], hosts: HostShape | None,
                       ep: int = 1, channels: int = 0, degree: int = 0, pxn: bool = True
                       ) -> dict[str, CollectiveShape]:
    """The `CollectiveShape` of each kind's collectives (a P2P send is one transfer; an EP all-to-all posts one
    to every other member, collectives/direct.py, on no extra channel). A group across hosts keeps the replicas
    that share its NICs; when another dimension crosses hosts too, its collectives join replicas on other hosts
    to the simulated ones, on the rails they use (on every rail when one of them uses them all), so the sharing
    search reaches that share of every dimension's replicas; an EP group with several members on a host sends
    flows that turn rails between hosts: through its own members on the destination's rail under PXN
    (``pxn``, `network.pxn`; collectives/direct.py), staying on its rails as the other groups' do, and without
    PXN over every spine, hashed by the rails' difference (topology/builders.py `Fabric`), so that they share
    spine links with every copy of the group, all kept (a bound: Mixtral EP 8 keeps 0.90 of it). A group inside
    one NVLink domain (a host; the trays of a GB200 NVL72 rack, whose NVSwitch joins them as a host's does) keeps
    the copies there that the domain's other groups join to it (`_domain_copies`), and so does a pipeline's
    hand-off inside one domain, every copy sent. A hand-off is one
    flow for its send op and its receive op together, inside a domain or across (TP 8 PP 3 on one GB200 rack:
    13,640 of 13,619 flows; Llama 3 8B on two DGX H100 at TP 8 PP 2 across them: 2,592 of 2,592).
    ``channels`` (`collectives.channels`, 0: NCCL's choice) is the rings of every ring collective, inside a host
    too, as ring.py's `channel_count` reads it."""
    groups = {kind: _first_group(layout, kind, ep, degree) for kind in kinds if kind != "pp"}
    per_host = {kind: Counter(rank // hosts.gpus for rank in group) if hosts is not None else Counter()
                for kind, group in groups.items()}
    crossing = {kind: min(counts.values()) for kind, counts in per_host.items()
                if len(counts) > 1 and hosts is not None and _domains(groups[kind], hosts) > 1}
    rails_of = {kind: _group_rails(groups[kind], hosts, fewest) for kind, fewest in crossing.items()
                } if hosts is not None else {}
    shapes = {"pp": CollectiveShape(1, 0.5, 1)}  # a hand-off's send and receive ops post one flow together
    inside = [kind for kind in groups if kind not in crossing]
    domain = hosts or _pipelined_host(layout)
    copies = _domain_copies(layout, inside, domain, ep, degree) if domain is not None else {}
    if layout.pp > 1 and domain is not None and _domains(layout.group("pp", 0), domain) == 1:
        joined = _domain_copies(layout, [*inside, "pp"], domain, ep, degree)["pp"]
        shapes["pp"] = CollectiveShape(1, 0.5, joined)  # every copy of a hand-off joined to it is sent
    for kind, group in groups.items():
        members = len(group)
        peers = members - 1 if kind == "ep" else channels or 1
        if kind not in crossing or hosts is None:
            shapes[kind] = CollectiveShape(members, members * peers, copies.get(kind, 1))
            continue
        rails = rails_of[kind]
        replicas = layout.world // layout.pp // members
        if len(crossing) > 1:
            rails_joined = max(rails_of.values())
            kept = replicas * rails_joined // hosts.rails
        else:
            kept = hosts.gpus // crossing[kind] * rails // hosts.rails
        if kind == "ep" and crossing[kind] > 1 and hosts.rails > 1 and not pxn:
            kept = replicas  # its flows turn rails between hosts, hashed over every spine: they meet every copy
        in_domain = min(Counter(rank // hosts.domain for rank in group).values())
        if in_domain > 1 and any(len(other) > 1 for name, other in groups.items() if name not in crossing):
            kept = max(kept, hosts.domain // in_domain)  # its hops inside a domain cross the lanes of a group there
        transfers = members * (peers if kind == "ep" or channels else _ring_channels(group, hosts))
        shapes[kind] = CollectiveShape(members, transfers, min(replicas, max(1, kept)), len(crossing) > 1)
    return shapes


def _pipelined_host(layout: Layout) -> HostShape | None:
    """A cluster of one host as one NVLink domain, where its pipeline's hand-offs run beside TP or CP
    collectives throughout the step: they meet on the GPUs' NVLink ports, so the copies the host's groups join
    are kept (TP 2 DP 2 PP 2 on a DGX H100: 2,612 flows estimated, 2,588 run, 1,274 counting one copy); None
    elsewhere, where a lone stage's collectives or hand-offs without TP meet their copies only beside the DP
    buckets at the step's end (PP 2 DP 4: 202 flows run, 196 estimated)."""
    if layout.pp > 1 and layout.tp * layout.cp > 1:
        return HostShape(layout.world, 1, layout.world)
    return None


def _group_rails(group: tuple[int, ...], hosts: HostShape, fewest: int) -> int:
    """The rails a group across hosts drives, ``fewest`` members on some host: at most that many and the fewest
    NICs its members drive on one host (members share a NIC where a host has fewer NICs than GPUs), as ring.py
    counts them (`ring.domain_rails` without the search's cap)."""
    return min(usable_rails(hosts.rails, fewest),
               fewest_nics(map(hosts.nic, members) for members in _members_by(group, hosts.gpus)))


def _ring_channels(group: tuple[int, ...], hosts: HostShape) -> int:
    """The rings ring.py runs for ``group`` across hosts (`ring.channel_count` unasked), which it plans by NVLink
    domain: one inside one domain (the trays of one NVL72 rack); across domains one per NIC of the hosts its
    members sit on in a domain, at most the fewest members of any domain and the fewest NICs they drive on one
    (`ring.domain_rails`, `ring.fewest_nics`)."""
    domains = _members_by(group, hosts.domain)
    if len(domains) == 1:
        return 1
    trays = min(len({rank // hosts.gpus for rank in members}) for members in domains)
    nics = fewest_nics(map(hosts.nic, members) for members in domains)
    return cross_host_channels(domain_rails(hosts.rails * trays, min(map(len, domains)), nics))


def _hierarchical_transfers(layout: Layout, kind: str, hosts: HostShape, all_reduce: bool, ep: int,
                            degree: int) -> int:
    """The transfers of a collective of ``kind``'s group (`_first_group`: HSDP's shard group for ``dp``) as
    collectives/hierarchical.py plans it: a phase of one transfer per member for the rings inside its rows (two
    around an all-reduce, where a row holds two members or more), and one for the rails' rings across them
    (where the group spans rows). Its rows are NVLink domains (a GB200 rack's trays are one), or hosts where only
    the hosts hold equal counts (`hierarchical.even_rows`)."""
    group = _first_group(layout, kind, ep, degree)
    spanned = len(even_rows(_members_by(group, hosts.domain), lambda: _members_by(group, hosts.gpus)))
    return len(group) * ((spanned > 1) + (len(group) > spanned) * (2 if all_reduce else 1))


def _domains(group: tuple[int, ...], hosts: HostShape) -> int:
    """The NVLink domains (hosts; GB200 NVL72 racks) ``group``'s members sit in."""
    return len({rank // hosts.domain for rank in group})


def _members_by(group: tuple[int, ...], size: int) -> list[list[int]]:
    """``group``'s members per block of ``size`` consecutive GPUs (a host or an NVLink domain), blocks in order of
    first appearance."""
    blocks: dict[int, list[int]] = {}
    for rank in group:
        blocks.setdefault(rank // size, []).append(rank)
    return list(blocks.values())


TREE_ALGORITHMS = ("auto", "tree")
"""Choices under which a DP all-reduce may run as NCCL's double binary tree (the tuner picks it for small
buckets), a plan that no shift of the replicas maps onto itself: engine/replicas.py then finds no quotient
(SC21 310.1B, DP 15)."""


def may_run_trees(scenario: Scenario) -> bool:
    """Whether the run may post all-reduces as trees: the DDP or TP all-reduces of a training step, or a
    `workload:` item's, under `TREE_ALGORITHMS`. Their plans' transfers are counted once the cluster is built
    (`estimate_scale`'s ``topology``)."""
    if scenario.uses_parameter_servers:
        return False
    if scenario.model is not None:
        return _dp_may_run_trees(scenario) or _tp_may_run_trees(scenario)
    return isinstance(scenario.workload, list) and any(
        item.op == "all_reduce" and run_choice(item.algorithm, scenario.collectives.algorithm) in TREE_ALGORITHMS
        for item in scenario.workload)


def _dp_may_run_trees(scenario: Scenario) -> bool:
    """Whether the step's data-parallel collectives are DDP all-reduces that may run as trees (`TREE_ALGORITHMS`)."""
    return scenario.parallelism.zero_stage == 0 and scenario.collectives.algorithm in TREE_ALGORITHMS


def _tp_may_run_trees(scenario: Scenario) -> bool:
    """Whether the step's TP collectives are all-reduces (no sequence parallelism) that may run as trees
    (`TREE_ALGORITHMS`): the tuner picks them where the TP group spans NVLink domains."""
    par = scenario.parallelism
    return par.tp > 1 and not par.sequence_parallel and scenario.collectives.algorithm in TREE_ALGORITHMS


def _first_bucket_blocks(ready: Iterable[tuple[float, ...]], grad_bytes: float, bucket: float) -> int:
    """How many of the blocks in ``ready`` (each a block's tensors, elements, in the order the last backward
    finishes them: the head's, then each layer's MLP and attention blocks from the last layer on) finish before
    the first DDP bucket closes (parallel/work.gradient_buckets: it closes at the tensor that brings it to
    ``bucket`` bytes), the one that closes it included; one past them all where it never closes."""
    size, count = 0.0, 0
    for count, tensors in enumerate(ready, start=1):
        size += sum(tensor for tensor in tensors if tensor > 0) * grad_bytes
        if size >= bucket:
            return count
    return count + 1


def _tp_beside_dp(par: ParallelismConfig, m: int, recompute: Recompute, layers: int, first_bucket: int,
                  gathered_ahead: int) -> float:
    """The share of a rank's TP all-reduces (`_tp_splits` without sequence parallelism: two in each forward,
    backward and full recompute of a layer, one a block; and the embedding's and the head's, `_tp_ends`) that run
    while its data-parallel collectives do, which
    join the TP group's copies in the other DP replicas to it: every one under ZeRO-3 (gathers in every pass)
    or gradients reduced every micro-batch (their reductions run on into the next one's passes), none where the
    gradients are reduced after the backward (`ddp.overlap: false`), else those of the last micro-batch's
    backward from the first bucket on: ``first_bucket`` (`_first_bucket_blocks`) counts the head and the blocks
    of the ``layers`` layers whose backward fills it, their all-reduces run alone but for the backward's of
    the block that closes it (a full recompute's comes before its backward); and with
    `ddp.overlap_param_gather` the first micro-batch's forward ones that run while the deferred parameter gathers
    do (``gathered_ahead``, `_gathered_ahead`). The SC21 7.5B step at TP 16: 139 of 872 ran beside the buckets,
    the rest alone (with ZeRO-2 reducing every micro-batch 799 of 872)."""
    if par.zero_stage == 3 or par.reduce_every_microbatch(par.pp):
        return 1.0
    per_block = 1 + (recompute == "full")
    per_microbatch = (2 * per_block + 2) * layers + _tp_ends(par)
    return (_tp_after_first_bucket(par, recompute, layers, first_bucket) + gathered_ahead) / per_microbatch / m


def _tp_after_first_bucket(par: ParallelismConfig, recompute: Recompute, layers: int, first_bucket: int) -> int:
    """The TP all-reduces of a rank's last backward over its ``layers`` layers that run while its DDP buckets
    are reduced (`ddp.overlap`): those of the blocks after the one whose backward closes the first bucket
    (``first_bucket``: `_first_bucket_blocks`, the head counted first), a full recompute's with them, and the
    backward's of the block that closes it; none without the overlap or where no bucket closes in it."""
    per_block = 1 + (recompute == "full")
    closing = first_bucket - 1  # the layer block that closes it, after the head
    if not par.ddp.overlap or closing > 2 * layers:
        return 0
    return per_block * 2 * layers if closing == 0 else 1 + per_block * (2 * layers - closing)


def _gathered_ahead(par: ParallelismConfig, layer_blocks: tuple[float, float], layers: int, param_bytes: float,
                    embedding: float, head: float) -> int:
    """A rank's first forward's TP all-reduces (the embedding's and one a layer block's) that run while its
    deferred parameter gathers do (`ddp.overlap_param_gather` under ZeRO-1/2: `_param_gather_buckets`), which
    join the TP group's copies in the other DP replicas to it: those of the blocks ahead of the last bucket's, as
    each block waits for its own bucket and the next one's gather runs beside it; the last bucket's blocks run
    after every gather. Assumes the gathers keep pace with the forward."""
    if not (par.ddp.overlap_param_gather and par.zero_stage in (1, 2)):
        return 0
    opened, size = 0, 0.0  # the block the last bucket opens at, and its bytes
    for index, params in enumerate([embedding, *layer_blocks * layers, head]):
        if params <= 0:
            continue
        opened = opened if size else index
        size += params * param_bytes
        if size >= par.ddp.bucket:
            size = 0.0
    return opened  # the blocks ahead of it each post one forward all-reduce (the head's follows its backward)


def _dp_beside(par: ParallelismConfig, collectives: float, gathers: float) -> float:
    """The share of a one-stage rank's ``collectives`` data-parallel collectives (DDP buckets, and ZeRO-1/2's
    ``gathers`` of the parameters) that run beside the TP collectives across NVLink domains which join their
    copies in the other TP lanes to them (CP's rings among them): with `ddp.overlap` every bucket but the last,
    which closes at the embedding after the last backward's TP collectives and CP rings, assuming the buckets'
    reductions keep pace with the backward (small buckets that queue past its last TP collective run alone and
    are over-counted: SC21 7.5B at TP 16, 4 layers, one micro-batch and 8 MiB buckets, flows 1.030); none after
    the backward, nor the gather after the optimizer; with `ddp.overlap_param_gather` every deferred gather but
    the first, which runs before the first forward's TP collective (parallel/overlap.py
    `_deferred_param_gathers`). The others run alone and post their own transfers only (engine/sharing.py
    `private_collectives`: SC21 7.5B at TP 16, one micro-batch and 2 layers, the last of 2 buckets 16 flows, the
    first 256)."""
    buckets = collectives - gathers
    deferred = gathers - 1 if par.ddp.overlap_param_gather else 0.0
    return ((buckets - 1 if par.ddp.overlap else 0.0) + deferred) / collectives


def _cp_ring_beside(par: ParallelismConfig, layout: Layout, m: int, recompute: Recompute, layers: int,
                    first_bucket: int) -> float:
    """The share of a rank's CP ring steps (`_cp_collectives`: the ring of each layer's forward, full recompute
    and backward) that run beside traffic of another dimension, which joins the ring's copies to it: every one
    beside a pipeline's hand-offs; beside the gradients' reductions (the TP all-reduces run between the rings,
    never beside them) the same share as the TP all-reduces' (`_tp_beside_dp`): every one where the gradients
    are reduced in every pass, none after the backward, else the last micro-batch's rings of the recompute and
    the backward of the attention blocks after the one whose backward closes the first bucket (``first_bucket``:
    `_first_bucket_blocks`). SC21 7.5B at TP 16 and CP 8 over 4 layers, 2 micro-batches: 42 of 168."""
    if layout.pp > 1 or par.zero_stage == 3 or par.reduce_every_microbatch(par.pp):
        return 1.0
    closing = first_bucket - 1  # the layer block that closes it, after the head; attention blocks even
    if not par.ddp.overlap or closing > 2 * layers:
        return 0.0
    full = recompute == "full"
    return (layers - closing // 2) * (1 + full) / (layers * (2 + full)) / m


def _tp_beside(par: ParallelismConfig, layout: Layout, m: int, recompute: Recompute, layers: int, first_bucket: int,
               gathered_ahead: int = 0) -> float:
    """The share of a rank's TP all-reduces that run beside traffic of another dimension, which joins the TP
    group's copies to it (across hosts on the rails, inside an NVLink domain through the GPUs' ports: a GB200
    rack's DP ring joins every TP group of the rack): under pipelining those of the actions beside a hand-off
    or the buckets (`_tp_beside_pipeline`), else the gradients' reductions over the DP x CP group
    (parallel/program.py's, over CP alone at DP 1) the share of `_tp_beside_dp`. A CP ring's steps end before
    the attention block's all-reduce, so they join none (SC21 7.5B at TP 16 and CP 8, DP 1: 11 of 48 ran beside,
    all after the first bucket)."""
    if layout.pp > 1:
        return _tp_beside_pipeline(par, layout, m, recompute, layers, first_bucket, gathered_ahead)
    return _tp_beside_dp(par, m, recompute, layers, first_bucket, gathered_ahead) if layout.dp * layout.cp > 1 else 0.0


def _tp_beside_pipeline(par: ParallelismConfig, layout: Layout, m: int, recompute: Recompute, layers: int,
                        first_bucket: int, gathered_ahead: int = 0) -> float:
    """`_tp_beside` under pipelining: the TP all-reduces (and Megatron's scatter-gathers) of the schedule's
    actions that may run while a hand-off into or out of their rank is in flight (schedules/handoff_overlap.py),
    and of the actions beside none, a rank's last backward's from its first DDP bucket on
    (`_tp_after_first_bucket`, a pipelined rank's blocks counted without the head, as its first stage holds
    none), on a rank whose last backward is not the first stage's at least the last layer's backward all-reduce,
    which follows the gradients that close the last bucket (the first stage's embedding closes it after every
    TP all-reduce); every one under ZeRO-3 or gradients reduced every micro-batch, or where the schedule is a
    table or does not take the layout (its own check reports it). Without sequence parallelism a
    forward posts two a layer and one more (the embedding's all-reduce on the first stage, the gather of the
    received activation on the others), a backward two a layer and block recomputed and one more (the head's,
    or the gather of the received gradient). With one micro-batch the stages run one after the other and only
    the buckets join them: SC21 7.5B at TP 16 and PP 2, 4 layers, 6 of 28 beside the buckets. With
    `ddp.overlap_param_gather` a rank's first forwards (of its first micro-batch, one a chunk) post
    ``gathered_ahead`` (`_gathered_ahead` over the rank's layers) beside its deferred parameter gathers too,
    each forward at most its own."""
    from simulator.schedules.base import rank_stages
    from simulator.schedules.handoff_overlap import named_beside_handoffs
    from simulator.schedules.registry import build_schedule

    buckets = layout.dp * layout.cp > 1
    if (buckets and (par.zero_stage == 3 or par.reduce_every_microbatch(par.pp))) or par.pipeline.table is not None:
        return 1.0
    name, pp, v = par.pipeline.schedule, layout.pp, par.pipeline.virtual_stages
    try:
        schedule, flags = build_schedule(name, pp, m, v), named_beside_handoffs(name, pp, m, v)
    except ScenarioError:
        return 1.0
    chunk_layers = layers / v
    per_block = 1 + (recompute == "full")
    placement = schedule.placement
    blocks_to_first_bucket = first_bucket + 1  # a pipelined rank's blocks hold no head, which the count starts at
    after = _tp_after_first_bucket(par, recompute, layers, blocks_to_first_bucket) if buckets else 0
    total = beside = 0.0
    for rank, (actions, row) in enumerate(zip(schedule, flags, strict=True)):
        backwards = [index for index, action in enumerate(actions) if action.kind in ("B", "BW")]
        last = backwards[-1] if backwards else -1
        ends_on_layer = buckets and last >= 0 and rank_stages(rank, pp, v, placement)[actions[last].chunk] > 0
        ahead = float(gathered_ahead if buckets else 0)  # first forwards' all-reduces left beside the gathers
        for index, (action, flag) in enumerate(zip(actions, row, strict=True)):
            if action.kind == "W":
                continue
            count = 2 * chunk_layers * (1 if action.kind == "F" else per_block) + 1
            total += count
            gathering = min(ahead, count) if action.kind == "F" and action.microbatch == 0 else 0
            ahead -= gathering
            if flag:
                beside += count
            elif index == last:
                beside += min(max(after, int(ends_on_layer)), count)
            else:
                beside += gathering
    return beside / total if total else 0.0


class PlannedCount(NamedTuple):
    """`_planned_transfers`'s count of an all-reduce's plans over its sizes."""

    transfers: float
    """The transfers posted, on average over the sizes."""
    lower_bound: bool
    """Whether sizes were left uncounted (the count stopped at ``enough``)."""
    trees: bool
    """Whether the tuner runs some counted size as a tree."""


def _planned_transfers(scenario: Scenario, topology: Topology, group: tuple[int, ...], sizes: list[float],
                       item: CollectiveItem | None = None, enough: float = math.inf) -> PlannedCount | None:
    """The transfers an all-reduce over ``group`` (a DP bucket's, a TP group's, or a `workload:` ``item``'s) posts
    on average over ``sizes`` bytes, as the run posts them: the algorithm and protocol the tuner picks for each
    size (`registry.resolve`, on the scenario's efficiencies, where the item or the scenario leaves them `auto`:
    `run_choice`), and the transfers of that plan's phases (`registry.planned_transfers`), a ring's where it
    picks a ring; None for no size, or where the choice or the plan is refused (the run's own checks report it,
    located at its field). NCCL's tree posts each stretch of its pipeline's steps as a phase of its active
    edges, up and down, on every channel: over 16 DGX A100 hosts, 2 members a host, 1,488 transfers where a
    ring per channel posts 64. Sizes are counted most frequent first, and counting stops once the average
    reaches ``enough`` with the sizes not yet counted as none: a lower bound from there (over 4,096 DGX A100
    hosts each size took ~0.2 s of CPU)."""
    from simulator.collectives.phases import CollectiveRequest
    from simulator.network.calibration import resolve_efficiency

    collectives = scenario.collectives
    efficiency = {str(name): share
                  for name, share in resolve_efficiency(scenario.network.efficiency, topology.gpu_model).items()}
    counted = 0.0
    skipped = trees = False
    for size, times in Counter(sizes).most_common():
        if counted >= enough * len(sizes):
            skipped = True
            break
        request = CollectiveRequest("all_reduce", group, size, chunk_bytes=collectives.chunk,
                                    channels=collectives.channels)
        try:
            algorithm, transfers = chosen_transfers(
                request, topology, run_choice(item.algorithm if item else None, collectives.algorithm),
                run_choice(item.protocol if item else None, collectives.protocol), efficiency)
        except ScenarioError:
            return None
        counted += times * transfers
        trees = trees or algorithm == "tree"
    return PlannedCount(counted / len(sizes), skipped, trees) if sizes else None


def chosen_transfers(request: CollectiveRequest, topology: Topology, algorithm: AlgorithmChoice,
                     protocol: ProtocolChoice, efficiency: Mapping[str, float]) -> tuple[AlgorithmName, int]:
    """The algorithm the tuner runs ``request`` as (``algorithm`` and ``protocol`` as asked, `auto` chosen by
    `registry.resolve`) and the transfers its plan posts (`registry.planned_transfers`; a tree's in closed form);
    a refused choice raises the plan's ScenarioError."""
    from simulator.collectives.registry import planned_transfers, resolve

    chosen, chosen_protocol = resolve(request, topology, algorithm, protocol, efficiency)
    return chosen, planned_transfers(request, topology, chosen, chosen_protocol)


def _quotient_step(layout: Layout, hosts: HostShape | None) -> int:
    """The data-parallel replicas a folded run sends the flows of (engine/replicas.py `_shift_step`): the fewest
    whose shift moves every GPU by whole periods of the fabric's spine hash, when DP is outermost over the whole
    cluster; 0 when no shift is a symmetry (every replica then sends)."""
    return shift_step(layout, hosts.period if hosts is not None else 0)


def _quotient_shape(layout: Layout, step: int, kind: str, shape: CollectiveShape, ep: int,
                    degree: int = 0) -> CollectiveShape:
    """``shape`` under the replica quotient of ``step`` replicas: of a group that spans ``span`` DP replicas,
    only the transfers from the first ``step`` are sent (a DP ring's step / dp), and of its copies per stage
    one per orbit of the shift: those in the first ``step`` replicas, or, where the copies that meet it lie one
    to each other replica (`CollectiveShape.joined`), that share of them."""
    if kind == "pp":
        return shape
    stride = layout.stride("dp")
    span = len({rank // stride % layout.dp for rank in _first_group(layout, kind, ep, degree)})
    kept = max(step, span)
    copies = (shape.replicas * kept if shape.joined else layout.world // layout.pp // shape.members * kept
              ) // layout.dp
    return replace(shape, transfers=shape.transfers * min(step, span) / span,
                   replicas=min(shape.replicas, max(1, copies)))


def _rank_classes(comm: dict[str, float], shapes: dict[str, CollectiveShape], tp_beside_dp_rings: bool,
                  tp_stages_across: bool) -> int:
    """Ranks a folded run simulates per stage: two where EP all-to-alls run beside rings across hosts, whose
    direction alternates from host to host (engine/rank_classes.py classes the hosts by it: the bundled MoE
    runs simulate two ranks a stage), where TP collectives inside a host, mirrored on the other hosts, run
    beside DP rings across hosts of three members or more a host (``tp_beside_dp_rings``; with two, a host's
    channels carry both directions alike: SC21 3.6B, TP 2 and 4 DP members a host, simulates two ranks, 7.5B,
    TP 4 and 2, one), or where TP groups span NVLink domains with several members in each, their rings
    hopping on NVLink one way in one domain and the other way in the next, on several pipeline stages whose TP
    collectives run beside one another, which takes several micro-batches (``tp_stages_across``: SC21 7.5B at
    TP 16 and PP 2 simulates GPUs 0 and 8 of each stage, one at PP 1 or with one micro-batch, whose stages run
    one after the other; a TP group across the trays of one GB200 rack stays in its domain: one), else one."""
    rings_across = any(shapes[kind].transfers > shapes[kind].members for kind, count in comm.items()
                       if count and kind not in ("ep", "pp"))
    return 2 if (comm["ep"] and rings_across) or tp_beside_dp_rings or tp_stages_across else 1


class TrayClasses(NamedTuple):
    """What a step folded by its NVLink domains' trays simulates (`_tray_classes`)."""

    classes: int
    """Classes per pipeline stage: one per distinct column of hosts that a position of a stage sits on."""
    held: dict[str, int]
    """Per kind of collective, the groups per stage that hold a class's representative (its first position)."""


def _folds_by_trays(scenario: Scenario, layout: Layout, hosts: HostShape | None, tp_inside: bool,
                    dp_beside_tp: bool) -> bool:
    """Whether a folded step runs folded by engine/rank_classes.py's classes of trays (`_tray_classes`): on the flow
    model (the analytic model runs no classed fold) without step faults, where an NVLink domain holds several hosts
    (a GB200 NVL72 rack's trays) and the DP x CP group spans several domains with several trays in one, so that
    each tray's NVLink ports and NICs carry its rings to and from trays of its own (rank_classes.py
    `_carried`: a tray is read by the copies of the rings it holds), and where its collectives may overlap a TP
    collective inside a tray, mirrored on the other trays (``tp_inside``, ``dp_beside_tp``: rank_classes.py
    `_met_by_mirrored`; with `ddp.overlap: false` at PP 1 nothing mirrored meets the rings, and the stage fold
    runs); and where each domain's trays are at most the rings' channels, every tray then entered or left by some
    channel's ring: with more (18 trays a rack, 16 channels) trays that carry alike leave classes of unequal size,
    which the fold does not use (the stage fold runs, and unfolds where its lanes fall out of step), unless stages
    straddle the domains (`_stages_straddle_domains`), where the step's rotation parts the trays. MoE, HSDP
    and synthetic steps are left to the stage fold's count (the guard, `refuse_unfolded`,
    weighs the classes the run finds)."""
    if (hosts is None or hosts.domain <= hosts.gpus or scenario.network.model != "flow"
            or not scenario.faults.step.empty or not (tp_inside and dp_beside_tp)):
        return False
    group = _first_group(layout, "dp", 1)
    trays: dict[int, set[int]] = {}
    for rank in group:
        trays.setdefault(rank // hosts.domain, set()).add(rank // hosts.gpus)
    stages = np.array([layout.stage_ranks(stage) for stage in range(layout.pp)], dtype=np.int64)
    straddle = _stages_straddle_domains(stages, hosts.domain, scenario.parallelism.pipeline.virtual_stages > 1)
    return len(trays) > 1 and 1 < max(map(len, trays.values())) and (
        straddle or max(map(len, trays.values())) <= _ring_channels(group, hosts))


def _tray_classes(layout: Layout, hosts: HostShape, wraps: bool) -> TrayClasses | None:
    """The classes of a step folded by trays (`_folds_by_trays`), as engine/rank_classes.py keys them (where
    every position of a stage is of one class, the stage fold runs, one rank a stage). Where the stages hand
    on alike (`_stages_straddle_domains`), by the copy key: a tray is read by the copies of the DP rings it holds,
    the TP and CP coordinates of its GPUs, so positions part only by the trays of a TP group they sit on (the
    bundled GB200 job's step at 4 racks: one class a stage, 2 of 288 ranks; TP 8 over two trays, two a stage);
    where some stage's hand-off stays in its rack in one replica and leaves it in another, by the step's
    rotation: positions whose ranks sit on the same hosts in every stage, or on hosts the rotation
    (`_step_rotation`) maps onto each other (TP 8 x PP 2 x DP 9 on two racks of 18 trays: 36 of 144 ranks). Beside
    the classes, the TP, CP and DP x CP groups per stage that a position of each tray holds, each simulated with
    its own transfers: a class-mate's copies of a representative's, which the DP rings over NVLink meet, run as
    its kept mirrors (the other copies are mirrors too). Where a DP x CP ring hops between CP lanes inside a tray
    (`_rings_turn_lanes`) the copy key parts the racks too, by parity (the ring's direction) on an even number of
    racks, each apart on an odd one. None where stages straddle the domains but the fabric does not rotate (the
    spine hash's period does not divide the GPUs: racks of 16 trays in leaf groups of 18): nothing parts the
    trays there, the stage fold refuses the unlike hand-offs and the run unfolds (192 of 192 ranks on 3 racks)."""
    stages = np.array([layout.stage_ranks(stage) for stage in range(layout.pp)], dtype=np.int64)
    if _stages_straddle_domains(stages, hosts.domain, wraps):
        if not (hosts.period and layout.world % hosts.period == 0):
            return None
        keys = stages.T % _step_rotation(layout, hosts) // hosts.gpus
    else:
        ranks = np.arange(layout.world, dtype=np.int64)
        lanes = np.full(-(-layout.world // hosts.gpus) * hosts.gpus, -1, dtype=np.int64)
        lanes[ranks] = ranks // layout.stride("tp") % layout.tp + layout.tp * (ranks // layout.stride("cp") % layout.cp)
        keys = lanes.reshape(-1, hosts.gpus)[stages.T // hosts.gpus].reshape(stages.shape[1], -1)
        if _rings_turn_lanes(layout, hosts):
            racks = stages.T // hosts.domain
            keys = np.hstack((keys, racks % 2 if (layout.world // hosts.domain) % 2 == 0 else racks))
    classes = len(np.unique(keys, axis=0))
    firsts = np.sort(np.unique(stages.T // hosts.gpus, axis=0, return_index=True)[1])
    representatives = stages[:, firsts].reshape(-1)
    held = {"pp": len(firsts)}
    for kind, dims in (("tp", ("tp",)), ("cp", ("cp",)), ("dp", ("dp", "cp"))):
        base = representatives.copy()
        for dim in dims:
            base -= representatives // layout.stride(dim) % layout.degree(dim) * layout.stride(dim)
        held[kind] = len(np.unique(base)) // layout.pp
    return TrayClasses(classes, held)


def _rings_turn_lanes(layout: Layout, hosts: HostShape) -> bool:
    """Whether the DP x CP ring hops inside a tray between GPUs of unlike TP and CP lanes (several of its CP
    positions in one tray): the ring runs one way through a rack's trays and the other way through the next
    rack's, so those lanes carry it one way in one rack and the other way in the next, which engine/rank_classes.py's
    copy key parts (two racks of 4 trays at TP 2 x CP 2 x PP 2 x DP 4: rack 0 and rack 1, 4 of 32 ranks); where the
    members of a tray share their lanes (TP 2 x DP 32, two replicas a tray) either way reads alike."""
    group = np.array(_first_group(layout, "dp", 1), dtype=np.int64)
    cp_lanes: dict[int, set[int]] = {}
    for rank in group.tolist():
        cp_lanes.setdefault(rank // hosts.gpus, set()).add(rank // layout.stride("cp") % layout.cp)
    return len({rank // hosts.domain for rank in group.tolist()}) > 1 and max(map(len, cp_lanes.values())) > 1


def _stages_straddle_domains(stages: np.ndarray, domain: int, wraps: bool) -> bool:
    """Whether some pipeline hand-off between the ranks ``stages`` (per stage, its ranks by position) stays inside
    its NVLink domain (``domain`` GPUs) at one position and leaves it at another, the wrap from the last stage to
    the first counted where ``wraps`` (interleaved schedules); engine/rank_classes.py `_hands_on_unlike` reads
    it on the step's hand-offs."""
    placed = stages // domain
    inside = placed[1:] == placed[:-1]
    if wraps:
        inside = np.vstack((inside, placed[:1] == placed[-1:]))
    return bool((inside.any(axis=1) & ~inside.all(axis=1)).any())


def _step_rotation(layout: Layout, hosts: HostShape) -> int:
    """The GPUs by which a step folded by trays shifts onto itself, as engine/rank_classes.py `_placed` finds it on
    the built cluster: the fewest whole periods of the spine hash that span an even number of NVLink domains (the
    DP rings run one way through a rack's trays and the other way through the next rack's), divide the GPUs and
    move each rank onto a rank of its own TP, CP and pipeline coordinates (DP outermost); every GPU where none does
    (an odd number of racks: every tray apart)."""
    world = layout.world
    stride = layout.stride("dp")
    if not hosts.period or stride * layout.degree("dp") != world:
        return world
    shift = math.lcm(hosts.period, 2 * hosts.domain, stride)
    return shift if shift < world and world % shift == 0 else world


DEFERRED_GATHERS: FieldPath = ("parallelism", "ddp", "overlap_param_gather")
FSDP_GATHERS: FieldPath = ("parallelism", "fsdp")
SKEW_UNFOLDING_ADVICE: dict[FieldPath, str] = {DEFERRED_GATHERS: "false, gathering after the optimizer",
                                               FSDP_GATHERS: "shard_grad_op, gathering once a step"}
"""The fields whose gathers `_skew_unfolds` names, each with what to set it to so that its gathers leave the
all-to-alls alone."""


def skew_advice(field: FieldPath) -> str:
    """What folds a step whose gathers at ``field`` meet a skewed router's all-to-alls unlike their mirrors, as
    both the estimate's refusal and the fold check's give it."""
    return (f"gathers beside the all-to-alls that fold ({'.'.join(field)}: {SKEW_UNFOLDING_ADVICE[field]}; or "
            "model.moe.routing.balance: uniform, or network.model: analytic)")


def _skew_unfolds(scenario: Scenario, layout: Layout, hosts: HostShape | None, degree: int,
                  moe_layers: int) -> FieldPath | None:
    """The field whose gathers unfold a folded MoE step on the flow model, None where none does: a skewed router
    (`model.moe.routing.balance` other than uniform) makes the EP all-to-alls load each EP position's GPUs
    unlike, and a gather that overlaps them (ZeRO-1/2's deferred expert gathers, `ddp.overlap_param_gather`,
    and PyTorch FSDP's of the experts, each of a rank's ``moe_layers`` in the forward after the previous layer's
    all-to-alls, so two at least; FSDP's of its dense shard group, every unit's in every pass) meets that load
    otherwise over a copy whose members hold other EP positions (the routed experts' groups hold one position
    each; an HSDP shard group of a host's DP ranks holds others than the next host's) wherever it crosses links
    the all-to-alls load: GPUs' NVLink ports where both groups have members sharing a domain, their NICs where
    both span domains. The fold check then runs the step unfolded (engine/symmetry.py `unequally_met`)."""
    par, moe = scenario.parallelism, scenario.model.moe if scenario.model is not None else None
    if (moe is None or moe.routing.balance == "uniform" or par.ep < 2 or scenario.network.model != "flow"
            or layout.dp * layout.cp < 2):
        return None
    kinds: list[tuple[str, FieldPath]] = []
    if moe_layers > 1 and layout.tp * layout.dp * layout.cp > par.ep and (
            par.gathers_per_unit or (par.zero_stage in (1, 2) and par.ddp.overlap_param_gather)):
        kinds.append(("experts", FSDP_GATHERS if par.gathers_per_unit else DEFERRED_GATHERS))
    if par.gathers_per_unit:
        kinds.append(("dp", FSDP_GATHERS))
    domain = hosts.domain if hosts is not None else layout.world
    position = expert_group_numbers(layout, par.ep)[1] % par.ep  # each rank's place in its EP group

    def spread(group: tuple[int, ...]) -> tuple[bool, bool]:
        """Whether ``group`` has members sharing a domain, and whether it spans domains."""
        per_domain = Counter(rank // domain for rank in group)
        return max(per_domain.values()) > 1, len(per_domain) > 1

    ep_inside, ep_across = spread(_first_group(layout, "ep", par.ep))
    for kind, field in kinds:
        group = _first_group(layout, kind, par.ep, degree)
        inside, across = spread(group)
        if len(group) < 2 or not ((inside and ep_inside) or (across and ep_across)):
            continue
        held, seen = sorted(position[list(group)].tolist()), set(group)
        for rank in layout.stage_ranks(0):  # the stage's groups of this kind, each once
            if rank not in seen:
                copy = _first_group(layout, kind, par.ep, degree, rank)
                seen.update(copy)
                if sorted(position[list(copy)].tolist()) != held:
                    return field
    return None


def _layout(par: ParallelismConfig, gpus: int) -> Layout:
    """The layout of a step of ``par`` on ``gpus`` GPUs: DP fills what TP x CP x PP leave where it is not set."""
    dp = par.dp or max(gpus // (par.tp * par.cp * par.pp), 1)
    return Layout(tp=par.tp, cp=par.cp, pp=par.pp, dp=dp, order=tuple(par.order))


def _skew_field(loaded: LoadedScenario, gpus: int) -> FieldPath | None:
    """The field whose gathers meet a skewed router's all-to-alls unlike their mirrors in the step of ``loaded``
    on ``gpus`` GPUs (`_skew_unfolds`), None where none does."""
    from simulator.workload.training import resolve_model

    scenario = loaded.scenario
    if scenario.model is None or scenario.model.synthetic is not None or scenario.model.moe is None:
        return None
    hosts, layout = scenario_hosts(loaded), _layout(scenario.parallelism, gpus)
    degree = _hybrid_degree(layout, hosts) if scenario.parallelism.hybrid_shard else 0
    return _skew_unfolds(scenario, layout, hosts, degree, round(resolve_model(scenario).layers / layout.pp))


def _training_estimate(scenario: Scenario, gpus: int, fold: bool, hosts: HostShape | None,
                       topology: Topology | None = None, stop_past_limits: bool = False,
                       replica_quotient: bool = True, table: Path | None = None) -> ScaleEstimate:
    from simulator.workload.training import resolve_model

    par, training = scenario.parallelism, scenario.training
    model = scenario.model
    tp, cp, pp, v = par.tp, par.cp, par.pp, par.pipeline.virtual_stages
    layout = _layout(par, gpus)
    dp = layout.dp
    synthetic = model.synthetic if model is not None else None
    tensors: tuple[float, ...] = ()
    head_tensors: tuple[float, ...] = ()
    embedding_tensors: tuple[float, ...] = ()
    ready: list[tuple[float, ...]] = []  # a rank's blocks' tensors as its last backward finishes them
    layer_blocks = (0.0, 0.0)  # a layer's attention and MLP parameters on a rank
    if synthetic is not None:
        layers, blocks = synthetic.stages, float(synthetic.stages * v)
        recomputed = blocks
        moe = False
    else:
        from simulator.workload.experts import moe_tensors
        from simulator.workload.memory import embedding_rank_params
        from simulator.workload.stage_work import layer_tensors

        spec = resolve_model(scenario)
        layers, blocks = spec.layers, 2.0 * spec.layers + 2
        recomputed = 2.0 * spec.layers  # the embedding and the head are not recomputed
        attention, mlp = layer_tensors(spec, tp)
        if spec.moe is not None:  # its buckets and gathers carry all but its routed experts
            mlp = moe_tensors(spec)
        tensors = attention + mlp
        layer_blocks = (sum(attention), sum(mlp))
        head_tensors = (float(spec.norm_params()), (spec.head_params() - spec.norm_params()) / tp)
        embedding_tensors = (embedding_rank_params(spec, tp),)
        ready = [head_tensors] * (pp == 1) + [mlp, attention] * round(spec.layers / pp)
        moe = spec.moe is not None
    m = training.microbatches or max(1, (training.global_batch or 1) // max(training.micro_batch * dp, 1))
    blocks_per_rank, layers_per_rank = blocks / pp, layers / pp
    backward = _backward_passes(par, m, table)
    split_compute, tp_plans = (_tp_splits(par, training.recompute, moe, backward) if tp > 1 and synthetic is None
                               else (0.0, Counter[str]()))
    if moe:  # a MoE block runs its routed experts as a part of their own in each pass that runs them
        split_compute += 2 + (training.recompute == "full")
    if cp > 1 and par.cp_algorithm == "ring" and synthetic is None:
        split_compute += _cp_ring_splits(training.recompute)
    compute = m * (blocks_per_rank * (1 + backward) + recomputed / pp * RECOMPUTE_SHARE[training.recompute]
                   + layers_per_rank * split_compute + (_head_splits(par, backward) / pp if synthetic is None else 0))
    grad_bytes = grad_buffer_bytes(training.precision, training.gradient_buffer_dtype(par.deepspeed_zero3))
    degree = _hybrid_degree(layout, hosts) if par.hybrid_shard else 0
    dense_units, expert_units = (layers + 2.0) / pp, layers_per_rank if moe and par.gathers_per_unit else 0.0
    skewed = _skew_unfolds(scenario, layout, hosts, degree, round(layers_per_rank)) if fold else None
    fold = fold and skewed is None
    gathers = _param_gather_buckets(par, layer_blocks, layers_per_rank, PRECISION_BYTES[training.precision], pp,
                                    sum(embedding_tensors), sum(head_tensors)) if par.zero_stage in (1, 2) else 0.0
    comm = {
        "tp": m * (layers_per_rank * sum(tp_plans.values()) + _tp_beyond_layers(par, pp, v)) if tp_plans else 0.0,
        "ep": m * layers_per_rank * _ep_all_to_alls(training.recompute) if moe and par.ep > 1 else 0.0,
        "cp": m * layers_per_rank * _cp_collectives(par, training.recompute) if cp > 1 else 0.0,
        "pp": m * 4 * (pp * v - 1) / pp if pp > 1 else 0.0,
        "dp": _dp_collectives(par, m, blocks_per_rank, dense_units,
                              _ddp_buckets(tensors, layers_per_rank, grad_bytes, par.ddp.bucket, pp, head_tensors,
                                           embedding_tensors), moe and tp * dp * cp > par.ep, gathers,
                              layers_per_rank, synthetic is None)
        if dp * cp > 1 else 0.0,
    }
    if expert_units:  # FSDP2's expert units, at DP 1 too: over their own shard group, or copies in its place
        expert_collectives = _dp_collectives(par, m, 0.0, expert_units, 0.0)
        if len(_first_group(layout, "experts", par.ep, degree)) > 1:
            comm["experts"] = expert_collectives
        else:
            compute += expert_collectives
    if par.fsdp is not None and synthetic is None:
        sharded = len(shard_group(layout, 0, degree or dp * cp)) > 1
        gathered = dense_units * sharded + expert_units * ("experts" in comm)
        compute += _fsdp_copies(par, m, blocks_per_rank, gathered, grad_bytes == PRECISION_BYTES[training.precision],
                                sharded)
        if par.gathers_per_unit and not sharded:  # a one-rank shard group copies where it would gather or reduce
            compute += _dp_collectives(par, m, blocks_per_rank, dense_units, 0.0, head=True)
            comm["dp"] = 0.0
    if degree:  # HSDP: each unit's shards all-reduced across the replicas once a step
        comm["replicas"] = dense_units
        if expert_units and _first_group(layout, "expert_replicas", par.ep, degree):
            comm["expert_replicas"] = expert_units
    if synthetic is not None:  # fixed costs: no TP, CP or DP traffic, and P2P free unless it has bytes
        compute += comm["pp"] / 2 if synthetic.p2p_bytes <= 0 else 0.0  # a free hand-off per receive
        comm = {kind: count if kind == "pp" and synthetic.p2p_bytes > 0 else 0.0 for kind, count in comm.items()}
    shapes = _collective_shapes(layout, comm, hosts, par.ep, scenario.collectives.channels, degree,
                                scenario.network.pxn)
    if scenario.collectives.algorithm == "hierarchical" and hosts is not None:
        all_reduce = {"tp": not par.sequence_parallel, "cp": False, "dp": par.zero_stage == 0}
        shapes.update({kind: replace(shapes[kind], transfers=_hierarchical_transfers(layout, kind, hosts, reduce,
                                                                                   par.ep, degree))
                       for kind, reduce in all_reduce.items() if shapes[kind].members > 1})
    tp_collectives = {plan: layers_per_rank * count for plan, count in tp_plans.items()}
    if tp_plans:
        bulk = _head_bulk(par) / pp
        tp_collectives["ring"] = tp_collectives.get("ring", 0.0) + _tp_beyond_layers(par, pp, v) - bulk
        if bulk:
            tp_collectives["userbuffers"] = tp_collectives.get("userbuffers", 0.0) + bulk
    shapes["tp"] = replace(shapes["tp"], transfers=_tp_transfers(par, tp_collectives, shapes["tp"].transfers))
    if par.cp_algorithm == "ring":  # a ring step posts one transfer a member, to the next (collectives/direct.py)
        shapes["cp"] = replace(shapes["cp"], transfers=cp)
    trees = lower_bound = False
    if topology is not None and comm["dp"] and _dp_may_run_trees(scenario) and synthetic is None:
        sizes, _ = _bucket_sizes(tensors, layers_per_rank, grad_bytes, par.ddp.bucket)
        flows_per_transfer = (pp * comm["dp"] * shapes["dp"].replicas if fold
                              else gpus * comm["dp"] / shapes["dp"].members)
        enough = _limit_flows() / flows_per_transfer if stop_past_limits else math.inf
        counted = _planned_transfers(scenario, topology, _first_group(layout, "dp", par.ep, degree), sizes,
                                     enough=enough)
        if counted is not None:
            lower_bound, trees = counted.lower_bound, counted.trees
            shapes["dp"] = replace(shapes["dp"], transfers=counted.transfers)
    tp_group = layout.group("tp", 0)
    if hosts is not None and _domains(tp_group, hosts) > 1:  # copies joined to rank 0's through TP's rings
        if shapes["dp"].joined and pp == 1 and not moe and comm["dp"] and not (
                par.zero_stage == 3 or par.reduce_every_microbatch(pp)):
            shapes["dp"] = replace(shapes["dp"], beside=_dp_beside(par, comm["dp"], gathers))
        if shapes["cp"].joined and comm["cp"] and par.cp_algorithm == "ring":
            shapes["cp"] = replace(shapes["cp"], beside=_cp_ring_beside(
                par, layout, m, training.recompute, round(layers_per_rank),
                _first_bucket_blocks(ready, grad_bytes, par.ddp.bucket)))
    tp_all_reduces = comm["tp"] and not par.sequence_parallel and not moe and synthetic is None
    dp_group = _first_group(layout, "dp", par.ep, degree)
    dp_per_host = Counter(rank // hosts.gpus for rank in dp_group) if hosts else {}
    dp_per_domain = Counter(rank // hosts.domain for rank in dp_group) if hosts else {}
    tp_joined_inside = (hosts is not None and len(dp_per_host) > 1 and min(dp_per_domain.values()) > 1 and tp > 1
                        and _domains(tp_group, hosts) == 1)

    @cache
    def beside() -> float:
        """`_tp_beside` of the layout, worked out only where it is read (a pipeline's costs CPU for its schedule)."""
        return _tp_beside(par, layout, m, training.recompute, round(layers_per_rank),
                          _first_bucket_blocks(ready, grad_bytes, par.ddp.bucket),
                          _gathered_ahead(par, layer_blocks, round(layers_per_rank),
                                          PRECISION_BYTES[training.precision], sum(embedding_tensors),
                                          sum(head_tensors)))

    if tp_all_reduces and tp_joined_inside:  # DP rings across hosts hop on NVLink: they join every TP group
        # of the domain (a GB200 rack's DP ring over its trays, every TP group of the rack)
        shapes["tp"] = replace(shapes["tp"], replicas=layout.world // pp // tp, joined=True)
    tp_per_domain = Counter(rank // hosts.domain for rank in tp_group) if hosts else Counter()
    tp_stages_across = (pp > 1 and m > 1 and bool(comm["tp"]) and len(tp_per_domain) > 1
                        and min(tp_per_domain.values()) > 1)
    if not fold:
        ranks = gpus
    elif scenario.network.model == "flow":
        ranks = pp * _rank_classes(comm, shapes, tp_joined_inside and min(dp_per_host.values()) > 2 and beside() > 0,
                                   tp_stages_across)
    else:  # the analytic model runs no classed fold
        ranks = pp
    tp_inside = bool(comm["tp"]) and hosts is not None and max(Counter(r // hosts.gpus for r in tp_group).values()) > 1
    dp_beside_tp = pp > 1 or _tp_beside_dp(par, m, training.recompute, round(layers_per_rank),
                                           _first_bucket_blocks(ready, grad_bytes, par.ddp.bucket), 0) > 0
    by_trays = (fold and hosts is not None and bool(comm["dp"]) and synthetic is None and not moe and not degree
                and _folds_by_trays(scenario, layout, hosts, tp_inside, dp_beside_tp))
    trays = _tray_classes(layout, hosts, par.pipeline.virtual_stages > 1) if by_trays and hosts is not None else None
    if by_trays and trays is None:  # stages straddle the racks of a fabric that does not rotate: the run unfolds
        return _training_estimate(scenario, gpus, False, hosts, topology, stop_past_limits, replica_quotient, table)
    if trays is not None:
        ranks = pp * trays.classes
    if tp_all_reduces and shapes["tp"].joined:  # rings whose copies in other replicas another dimension joins
        shapes["tp"] = replace(shapes["tp"], beside=beside())
    if (topology is not None and tp_all_reduces and _tp_may_run_trees(scenario)
            and nccl_nodes(topology, tp_group) > 1):  # a MoE block's TP collective is an all-gather
        activation = training.micro_batch * training.seq_len / cp * spec.hidden * PRECISION_BYTES[training.precision]
        planned = _planned_transfers(scenario, topology, tp_group, [activation])
        if planned is not None and planned.trees:  # its copies met by others' traffic
            trees = True
            shapes["tp"] = replace(shapes["tp"], transfers=planned.transfers, beside=beside())
    ops = ranks * (compute + sum(comm.values()) + 1)
    if trays is not None:  # each representative's groups simulated, beside the copies that meet them
        flows = pp * sum(count * shapes[kind].transfers * max(trays.held.get(kind, 1), shapes[kind].folded_transfers
                                                              / max(shapes[kind].transfers, 1))
                         for kind, count in comm.items())
        mirrors = pp * sum(comm.values()) * tp * cp * dp * 2
    elif fold:
        quotient = _quotient_step(layout, hosts) if replica_quotient and scenario.network.model == "flow" \
            and scenario.faults.step.empty \
            and not _dp_may_run_trees(scenario) else 0
        if quotient:
            shapes = {kind: _quotient_shape(layout, quotient, kind, shape, par.ep, degree)
                      for kind, shape in shapes.items()}
        flows = pp * sum(count * shapes[kind].folded_transfers for kind, count in comm.items())
        mirrors = pp * sum(comm.values()) * tp * cp * dp * 2
    else:
        flows = gpus * sum(count * shapes[kind].transfers / shapes[kind].members for kind, count in comm.items())
        mirrors = 0.0
    estimate = replace(_estimate(scenario, gpus, ranks, ops, flows, mirrors, fold), trees=trees,
                       lower_bound=lower_bound, unfolded_by=skewed)
    if hosts is not None and tp_domains(layout, np.arange(layout.world) // hosts.domain) > 1:
        return replace(estimate, tp_host_gpus=hosts.domain, tp_order=tp <= hosts.domain)
    return estimate


PS_GPUS_PER_SERVER = 8
"""Server GPUs per server host assumed before the topology is built (a DGX-class host)."""


def _ps_estimate(scenario: Scenario, gpus: int) -> ScaleEstimate:
    """A parameter-server run: per worker and iteration a forward, a backward, and a push and a pull to every
    server GPU (two ops and one flow each), and a sum or an update per push on the server; in sync mode each
    server GPU's update of the summed pushes besides (parameter_server/program.py `build_ops`)."""
    ps = scenario.ps
    assert ps is not None  # the schema pairs strategy parameter_server with a ps: section
    hosts = ps.servers if isinstance(ps.servers, int) else len(ps.servers)
    endpoints = min(gpus, max(hosts, 1) * PS_GPUS_PER_SERVER)
    workers = max(gpus - endpoints, 1)
    ops = ps.iterations * (workers * (2 + endpoints * 5) + endpoints * (ps.mode == "sync"))
    flows = ps.iterations * workers * endpoints * 2
    return _estimate(scenario, gpus, gpus, ops, flows, 0.0, False)


def _comm_estimate(scenario: Scenario, items: list[CollectiveItem], gpus: int,
                   hosts: HostShape | None, topology: Topology | None = None) -> ScaleEstimate:
    """A `workload:` list: an op per member of each item, and the transfers it posts without its plan
    (`_ring_flows`). Given the built ``topology``, an all-reduce that may run as a tree (`TREE_ALGORITHMS`)
    counts its plan's transfers (`_planned_transfers`)."""
    ops = flows = 0.0
    trees = False
    for item in items:
        members = tuple(range(gpus)) if item.group == "all" else tuple(item.group)
        ops += (2 if item.op == "send_recv" else len(members)) * item.repeat
        planned = _planned_transfers(scenario, topology, members, [item.bytes], item) if (
            topology is not None and item.op == "all_reduce" and _plannable(members, topology)
            and run_choice(item.algorithm, scenario.collectives.algorithm) in TREE_ALGORITHMS) else None
        if planned is not None:
            trees = trees or planned.trees
            flows += item.repeat * planned.transfers
        else:
            flows += item.repeat * _ring_flows(item.op, members, hosts)
    return replace(_estimate(scenario, gpus, gpus, ops, flows, 0.0, False, COMM_FLOW_BYTES[scenario.network.model]),
                   trees=trees)


def _ring_flows(op: Primitive, members: tuple[int, ...], hosts: HostShape | None) -> int:
    """The transfers one ``op`` over ``members`` posts as counted without its plan: one for a send_recv, p(p-1)
    for an all-to-all (one phase, collectives/direct.py), else one per member on each of its rings
    (`_ring_channels`: one inside a host, or NVLink domain; across them ring.py's channels: 8 a member over DGX
    H100 hosts, where 1 or 2 were counted)."""
    if op == "send_recv":
        return 1
    if op == "all_to_all":
        return len(members) * (len(members) - 1)
    return len(members) * (_ring_channels(members, hosts) if hosts is not None else 1)


def collective_estimate(op: Primitive, ranks: int, gpus: int, hosts: HostShape | None,
                        transfers: int | None = None, mode: NetworkMode = "flow") -> ScaleEstimate:
    """What `trainsim collective` needs for one size of ``op`` over GPUs 0 .. ``ranks`` - 1 (a send_recv's two
    ends) of a cluster of ``gpus`` GPUs made of ``hosts``: an op per member and ``transfers``, the flows its plan
    posts (`chosen_transfers`), else those a `workload:` item of it counts without the built cluster
    (`_ring_flows`: rings, a lower bound where the tuner picks trees), each flow held as the network ``mode``
    holds it (`COMM_FLOW_BYTES`), with no timeline written."""
    members = (0, ranks - 1) if op == "send_recv" else tuple(range(ranks))
    flows = _ring_flows(op, members, hosts) if transfers is None else transfers
    return _sized(gpus, len(members), len(members), flows, 0.0, False, 0.0, COMM_FLOW_BYTES[mode])


def collective_seconds(estimate: ScaleEstimate, algorithm: AlgorithmName, mode: NetworkMode) -> float:
    """About how many CPU seconds `trainsim collective` takes on a size of ``estimate`` (`collective_estimate`) whose
    plan runs as ``algorithm`` under the network ``mode``: its ops and transfers at `COLLECTIVE_EVENT_S`, a direct
    plan's at `DIRECT_EVENT_S`."""
    return estimate.events * (DIRECT_EVENT_S if algorithm == "direct" else COLLECTIVE_EVENT_S)[mode]


@dataclass(frozen=True)
class CollectiveCost:
    """What `trainsim collective` expects a size to take: its `collective_estimate`, the algorithm its plan runs and
    the CPU seconds it takes (`collective_seconds`)."""

    estimate: ScaleEstimate
    algorithm: AlgorithmName
    seconds: float


def planned_collective(op: Primitive, ranks: int, topology: Topology, sizes: Iterable[float],
                       algorithm: AlgorithmChoice, protocol: ProtocolChoice, efficiency: str,
                       chunk: object) -> tuple[int, AlgorithmName] | None:
    """The most transfers a size of ``op`` over GPUs 0 .. ``ranks`` - 1 of the built ``topology`` posts, as
    `trainsim collective`'s sweep plans it, and the algorithm that plan runs: the algorithm and protocol the tuner
    picks for the size under the ``efficiency`` profile and the ``chunk`` given (`chosen_transfers`: 262,112 for
    8,192 GPUs' all-reduce of 1 MiB as a tree, where rings counted 16,384). None for an all-to-all and a send_recv,
    whose direct transfers `collective_estimate` counts without a plan; a refused choice raises ScenarioError."""
    from simulator.collectives.chunking import chunk_bytes
    from simulator.collectives.phases import CollectiveRequest
    from simulator.network.calibration import resolve_efficiency

    if op in ("all_to_all", "send_recv"):
        return None
    shares = {str(name): share for name, share in resolve_efficiency(efficiency, topology.gpu_model).items()}
    chunking = chunk_bytes(chunk)
    plans = (chosen_transfers(CollectiveRequest(op, tuple(range(ranks)), size, chunk_bytes=chunking), topology,
                              algorithm, protocol, shares) for size in set(sizes))
    chosen, transfers = max(plans, key=lambda plan: plan[1])
    return transfers, chosen


def collective_cost(op: Primitive, ranks: int, gpus: int, hosts: HostShape | None,
                    planned: tuple[int, AlgorithmName] | None, mode: NetworkMode) -> CollectiveCost:
    """The cost of `trainsim collective`'s slowest size of ``op`` over ``ranks`` of ``gpus`` GPUs under ``mode``:
    with ``planned`` (`planned_collective`) its plan's transfers and algorithm; without, the flows a `workload:` item
    of the op counts (`collective_estimate`), direct transfers for an all-to-all or a send_recv, else rings."""
    flows, algorithm = planned or (None, "direct" if op in ("all_to_all", "send_recv") else "ring")
    estimate = collective_estimate(op, ranks, gpus, hosts, flows, mode)
    return CollectiveCost(estimate, algorithm, collective_seconds(estimate, algorithm, mode))


def _plannable(members: tuple[int, ...], topology: Topology) -> bool:
    """Whether a `workload:` item's ``members`` are distinct GPUs of ``topology``, which its plan needs (the
    workload's own checks name the others, located, once the estimate lets the run go on)."""
    return len(set(members)) == len(members) > 1 and all(0 <= member < topology.num_gpus for member in members)


def _estimate(scenario: Scenario, gpus: int, ranks: int, ops: float, flows: float, mirrors: float,
              fold: bool, flow_bytes: int = FLOW_BYTES) -> ScaleEstimate:
    written = {"full": ops + flows, "per-stage": ops, "summary": 0.0}[scenario.run.timeline]
    return _sized(gpus, ranks, ops, flows, mirrors, fold, written, flow_bytes)


def _sized(gpus: int, ranks: int, ops: float, flows: float, mirrors: float, fold: bool,
           written: float, flow_bytes: int = FLOW_BYTES) -> ScaleEstimate:
    """The estimate of a run of these counts, its memory theirs with ``written`` timeline rows and
    ``flow_bytes`` a flow."""
    memory = (_fixed_bytes(gpus) + ops * OP_BYTES + flows * flow_bytes + mirrors * MIRROR_ENTRY_BYTES
              + written * TRACE_BYTES_PER_ROW)
    return ScaleEstimate(gpus, ranks, math.ceil(ops), math.ceil(flows), memory, fold)


def _fixed_bytes(gpus: int) -> float:
    """Memory a run on ``gpus`` GPUs holds however few ops and flows it simulates: the process and the cluster."""
    return PROCESS_BYTES + gpus * TOPOLOGY_BYTES_PER_GPU


def estimate_scale(scenario: Scenario, gpus: int, hosts: HostShape | None = None,
                   topology: Topology | None = None, stop_past_limits: bool = False,
                   replica_quotient: bool = True, table: Path | None = None) -> ScaleEstimate | None:
    """The estimate of a run of ``scenario`` on a cluster of ``gpus`` GPUs made of ``hosts`` (None: collectives
    stay inside one host); None for a trace workload, whose size is its trace file's (a trace holds its ops
    already, so it cannot grow past them). Given the built cluster (``topology``), the all-reduces that may run
    as trees (`may_run_trees`) count the transfers of the plans the tuner picks (`_planned_transfers`); without
    it they count as rings, fewer (the published SC21 7.5B step with `collectives.algorithm: tree`: 46,508 flows
    estimated, 662,412 on the built cluster).
    ``stop_past_limits``: stop counting the DDP buckets' trees once their flows alone pass both limits
    (`_limit_flows`), for a refusal, which then gives a lower bound where sizes were left uncounted
    (`ScaleEstimate.lower_bound`). ``replica_quotient``: a folded flow-model step without step faults counts the
    replica quotient's flows (engine/replicas.py); False counts every copy, as a step that stragglers in one
    replica keep from the quotient (`every_mirror_refold`). ``table``: a custom schedule table's path
    (`scenario_table`), whose backward actions are counted (`_backward_passes`)."""
    if scenario.uses_parameter_servers:
        return _ps_estimate(scenario, gpus)
    if scenario.model is not None:
        return _training_estimate(scenario, gpus, scenario.run.fold, hosts, topology, stop_past_limits,
                                  replica_quotient, table)
    if isinstance(scenario.workload, list):
        return _comm_estimate(scenario, scenario.workload, gpus, hosts, topology)
    return None


def scenario_gpus(loaded: LoadedScenario) -> int | None:
    """The GPU count of the scenario's cluster from the topology file's parameters (None: unknown until built)."""
    source = scenario_source_or_none(loaded)
    return topology_gpus(source) if source is not None else None


def scenario_table(loaded: LoadedScenario) -> Path | None:
    """The path of the scenario's custom schedule table from the scenario file's folder (`PipelineConfig.table_path`,
    as the step's build reads it); None without a table."""
    return loaded.scenario.parallelism.pipeline.table_path(Path(loaded.source).parent)


def scenario_hosts(loaded: LoadedScenario) -> HostShape | None:
    """The host shape of the scenario's cluster from the topology file's parameters (None: one host, or unknown)."""
    source = scenario_source_or_none(loaded)
    return host_shape(source) if source is not None else None


def advice(estimate: ScaleEstimate, scenario: Scenario, sizes: tuple[str, ...]) -> str:
    """What to change to bring a run under the limits, most effective first; ``sizes``: the cluster's size
    parameters (`_size_parameters`)."""
    steps = []
    innermost = "TP innermost, inside one NVLink domain (parallelism.order starting with tp)"
    if estimate.tp_order:
        steps.append(innermost)
    elif estimate.tp_host_gpus:
        steps.append(f"TP inside one NVLink domain (parallelism.tp at most {estimate.tp_host_gpus}, the GPUs of "
                     "a host or NVL72 rack)" + ("" if scenario.parallelism.order[0] == "tp" else f" and {innermost}"))
    if scenario.uses_parameter_servers:
        steps.append("fewer iterations (ps.iterations)")
    elif estimate.unfolded_by is not None:
        steps.append(skew_advice(estimate.unfolded_by))
    elif not estimate.folded and scenario.model is not None:
        steps.append("fold the ranks (run.fold: true)")
    if estimate.trees:
        steps.append("rings for the all-reduces (collectives.algorithm: ring; a tree posts a phase per stretch of "
                     "its pipeline)")
    if scenario.model is not None and not scenario.uses_parameter_servers:
        steps.append("fewer micro-batches (training.global_batch or training.microbatches) or layers")
    if scenario.run.timeline == "full":
        steps.append("write less (run.timeline: summary)")
    steps.append(f"a smaller cluster{_named(sizes)}")
    return "; ".join(steps) + "; or pass --force"


def _named(sizes: tuple[str, ...]) -> str:
    """The cluster's size parameters as advice names them: ' (cluster.racks or cluster.trays)', '' for none."""
    return f" ({' or '.join(f'cluster.{name}' for name in sizes)})" if sizes else ""


def _size_field(loaded: LoadedScenario, sizes: tuple[str, ...]) -> tuple[str, ...]:
    """The size parameter of ``sizes`` the scenario set, the field a refusal of its cluster's size points at;
    else `cluster`."""
    written = [name for name in sizes if name in loaded.scenario.cluster.overrides()]
    return ("cluster", written[0]) if written else ("cluster",)


def _cause(estimate: ScaleEstimate, loaded: LoadedScenario, sizes: tuple[str, ...]) -> tuple[str, ...]:
    """The field most to blame: unfolded ranks; else TP groups across NVLink domains (their degree, or the order
    that places them so); else the cluster when the ops alone
    would fit (the flows, mirrors and graph grow with it); else the work of the step (model and batch) or the
    workload list."""
    scenario = loaded.scenario
    if scenario.uses_parameter_servers:
        return ("ps", "iterations")
    if estimate.unfolded_by is not None:
        return estimate.unfolded_by
    if not estimate.folded and scenario.model is not None:
        return ("run", "fold")
    if estimate.tp_host_gpus:
        return ("parallelism", "order") if estimate.tp_order else ("parallelism", "tp")
    if estimate.ops <= MAX_EVENTS and estimate.ops * OP_BYTES <= MAX_MEMORY_BYTES:
        return _size_field(loaded, sizes)
    return ("model",) if scenario.model is not None else ("workload",)


def _size_parameters(loaded: LoadedScenario) -> tuple[str, ...]:
    """The parameters of the scenario's topology kind that set its GPU count (`SIZE_PARAMETERS`; none when the
    topology cannot be read, whose build reports it)."""
    source = scenario_source_or_none(loaded)
    return SIZE_PARAMETERS.get(source.kind, ()) if source is not None else ()


def refuse_too_many_gpus(loaded: LoadedScenario, gpus: int, weigh: Callable[[], str] | None = None) -> None:
    """Raise a located ScenarioError when the cluster has more than MAX_GPUS GPUs: building it and the run's
    per-GPU structures alone would take minutes, however few ops and flows a folded step posts. It is located
    at the size parameter the scenario set (else at `cluster`) and names the ones its topology kind has;
    ``weigh`` gives `validate`'s memory line of the step, planned without the cluster, which it then ends with
    (`preflight.unbuilt_step_text`; '' for none)."""
    if gpus > MAX_GPUS:
        sizes = _size_parameters(loaded)
        memory = weigh() if weigh is not None else ""
        raise loaded.error(_size_field(loaded, sizes), f"a cluster of {gpus:,} GPUs is too large to simulate (~"
                                  f"{gpus * CLUSTER_SECONDS_PER_GPU:,.0f} s and ~"
                                  f"{gpus * TOPOLOGY_BYTES_PER_GPU / 2**30:,.1f} GiB before the first op); the "
                                  f"limit is {MAX_GPUS:,} GPUs" + (
                                      f"; its step planned on the topology's parameters, without building it: "
                                      f"{memory}" if memory else ""),
                           f"a cluster of at most {MAX_GPUS:,} GPUs{_named(sizes)}; or pass --force")


def refuse_if_too_large(loaded: LoadedScenario, gpus: int, topology: Topology | None = None
                        ) -> ScaleEstimate | None:
    """Estimate the run (on the built ``topology`` where given) and raise a located ScenarioError, with the
    estimate and advice, beyond the limits (counted only until past them: `estimate_scale`'s
    ``stop_past_limits``). A job's step (`run.horizon`) is estimated as the job runs it, folded as it asks and
    with no step timeline (`_as_run`): the one check of a job's healthy step folded, as of a plain run."""
    scenario = _as_run(loaded.scenario)
    estimate = estimate_scale(scenario, gpus, scenario_hosts(loaded), topology, stop_past_limits=True,
                              table=scenario_table(loaded))
    if estimate is not None and estimate.over_limits():
        sizes = _size_parameters(loaded)
        raise loaded.error(_cause(estimate, loaded, sizes), f"this run is too large to simulate: "
                                                             f"{estimate.describe()}; {estimate.beyond()}",
                           advice(estimate, scenario, sizes))
    return estimate


def refuse_large_trace(loaded: LoadedScenario, gpus: int, program: StepProgram,
                       unfolded_by: tuple[FieldPath, str] | None = None) -> None:
    """Raise a located ScenarioError when a replayed trace's step ``program`` on ``gpus`` GPUs holds more ops
    than the limits allow. A trace is not estimated before it is read (`estimate_scale`: its ops are its files'),
    but `workload.dp`'s copies, simulated where their traffic leaves NVLink domains, multiply them: the program
    is checked once built, before the engine runs it, its ops alone (its flows are posted as its collectives
    run). Located at `workload.dp` where the copies are simulated, else at `workload.trace`. ``unfolded_by``
    (field, what): a job's states that replay ``program`` unfolded, its copies' ops as many as the traced ranks'
    (each copy replays the same traces), refused at that field naming them."""
    workload = loaded.scenario.workload
    if not isinstance(workload, TraceWorkload):
        return
    ops, ranks, folded = len(program.ops), len(program.ranks), program.folded
    if unfolded_by is not None:
        if not folded:
            return
        ops, ranks, folded = math.ceil(ops * program.world / ranks), program.world, False
    estimate = _estimate(loaded.scenario, gpus, ranks, ops, 0.0, 0.0, folded)
    if not estimate.over_limits():
        return
    if unfolded_by is not None:
        field, states = unfolded_by
        raise loaded.error(field, f"{states} replay the trace unfolded (a trace has no layout to fold them by): "
                           f"{ops:,} ops on {counted(ranks, 'rank')} (~{estimate.memory_bytes / 2**30:,.1f} GiB "
                           f"before their flows); {estimate.beyond()}", "a smaller workload.dp, or --force")
    replicated = workload.dp is not None and not program.folded  # copies simulated, not mirrored
    raise loaded.error(("workload", "dp") if replicated else ("workload", "trace"),
                       f"this run is too large to simulate: its traces replay {ops:,} ops on "
                       f"{counted(len(program.ranks), 'simulated rank')} of {counted(gpus, 'GPU')} (~"
                       f"{estimate.memory_bytes / 2**30:,.1f} GiB before their flows); {estimate.beyond()}",
                       ("a smaller dp, or one whose copies each fill NVLink domains alike (mirrored, not simulated); "
                        if replicated else "") + "traces of one step; or pass --force")


UNFOLDING_FIELDS: dict[FoldCheck, tuple[str, ...]] = {
    "plan": ("parallelism", "cp_load_balance"), "copies": ("workload", "dp"), "cluster": ("cluster",),
    "stages": ("parallelism", "pp"), "collectives": ("cluster",),
    "faults": ("faults", "step"), "changing": ("faults", "step"), "links": ("faults", "step"), "classes": ("cluster",),
    "aligned": ("faults", "step")}
"""The field blamed when a fold check unfolds a step too large unfolded (the collectives' replicas meet the
cluster's links unevenly)."""
UNFOLDING_ADVICE: dict[FoldCheck, str] = {
    "plan": "true (every CP rank then does the same attention work)",
    "copies": "a dp whose copies each fill NVLink domains alike, or a smaller dp",
    "cluster": "a generated topology whose hosts have equal GPU counts",
    "stages": ("a layout whose tp x cp x pp divides, or is a multiple of, the GPUs of an NVLink domain (a host or "
               "NVL72 rack)"),
    "collectives": "network.model: analytic (each collective alone: replicas whose routes take equal times fold)",
    "faults": ("step faults that keep the replicas alike (links down from the step's start only; stragglers "
               "slowing whole stages)"),
    "changing": ("link faults for the whole step (from its start, without until: they fold by the hosts near "
                 "them)"),
    "links": "link faults near fewer hosts (each rank of a host near them is simulated apart)",
    "classes": "network.model: analytic (each collective alone: no ranks simulated apart by their NVLink loads)",
    "aligned": ("step faults that leave each stage's ranks alike (stragglers or links down that slow or reach "
                "whole stages: no ranks of a stage classed apart)"),
}
"""What to change so that the check passes."""


def unfolded_beyond_limits(loaded: LoadedScenario, gpus: int, topology: Topology | None = None
                           ) -> ScaleEstimate | None:
    """The estimate of the step of ``loaded`` simulated unfolded on ``gpus`` GPUs when it is beyond the limits,
    else None (None too for a trace, whose size is its file's): the one rule by which a step that a fold
    check unfolds, or a job's step or states that run unfolded, are refused. A job (`run.horizon`) writes no
    step timeline, so its steps are estimated without one. ``topology``: the built cluster (`estimate_scale`)."""
    estimate = _unfolded_estimate(loaded, gpus, topology)
    return estimate if estimate is not None and estimate.over_limits() else None


def _unfolded_estimate(loaded: LoadedScenario, gpus: int, topology: Topology | None = None
                       ) -> ScaleEstimate | None:
    """The estimate of the step of ``loaded`` simulated unfolded on ``gpus`` GPUs (None for a trace). A job
    (`run.horizon`) writes no step timeline, so its steps are estimated without one."""
    return estimate_scale(_as_run(loaded.scenario, fold=False), gpus, scenario_hosts(loaded), topology,
                          table=scenario_table(loaded))


def _as_run(scenario: Scenario, **run: object) -> Scenario:
    """``scenario`` with the ``run`` settings given, and as its step is simulated: a job (`run.horizon`) writes
    no step timeline, which its estimates then do not count."""
    job = {"timeline": "summary"} if scenario.run.horizon is not None else {}
    if not (run or job):
        return scenario
    return scenario.model_copy(update={"run": scenario.run.model_copy(update={**run, **job})})


def classed_estimate(loaded: LoadedScenario, gpus: int, ranks: int, topology: Topology | None = None
                     ) -> ScaleEstimate | None:
    """The estimate of the step of ``loaded`` on ``gpus`` GPUs folded by classes onto ``ranks`` ranks (a job's
    state with links down, `rank_classes.LinkFaultRanks`): the unfolded step's ops and flows in the share
    ``ranks`` of the GPUs simulates, beside the whole cluster and the mirrors of the folded step (such a fold
    compares every mirror). None for a trace. ``topology``: the built cluster (`estimate_scale`)."""
    estimator = classed_estimator(loaded, gpus, topology)
    return None if estimator is None else estimator(ranks)


def classed_estimator(loaded: LoadedScenario, gpus: int, topology: Topology | None = None
                      ) -> Callable[[int], ScaleEstimate] | None:
    """`classed_estimate` as a function of the ranks, the unfolded and folded estimates it scales worked out once
    (~0.3 s at 16,384 GPUs: a job's forecast sizes every state it foresees). None for a trace. ``topology``:
    the built cluster (`estimate_scale`)."""
    unfolded = _unfolded_estimate(loaded, gpus, topology)
    scenario = loaded.scenario
    folded = estimate_scale(scenario.model_copy(update={"run": scenario.run.model_copy(
        update={"fold": True, "timeline": "summary"})}), gpus, scenario_hosts(loaded), topology,
        table=scenario_table(loaded))
    if unfolded is None or folded is None:
        return None
    whole = unfolded
    fixed = _fixed_bytes(gpus)
    mirrors = max(folded.memory_bytes - fixed - folded.ops * OP_BYTES - folded.flows * FLOW_BYTES, 0.0)

    def estimate(ranks: int) -> ScaleEstimate:
        share = ranks / gpus
        return ScaleEstimate(gpus, ranks, math.ceil(whole.ops * share), math.ceil(whole.flows * share),
                             fixed + (whole.memory_bytes - fixed) * share + mirrors, True)

    return estimate


def unfolded_size_lines(loaded: LoadedScenario, gpus: int, step: FoldedStep, topology: Topology | None = None
                        ) -> tuple[str, ...]:
    """Where the run of ``step`` (the program `validate` built, folded where the run folds it) simulates every
    rank and its estimate reaches EVENTS_PER_MINUTE (`PS_EVENTS_PER_MINUTE` for parameter servers): what it
    simulates (ranks, ops, the estimate's flows), about how long, and why it is not folded (the DeepSeek-V3-style
    step at ep 16 runs minutes unfolded). Nothing for a
    folded step or a trace (its size is its files'). ``topology``: the built cluster (`estimate_scale`)."""
    program = step.program
    if program.folded or isinstance(loaded.scenario.workload, TraceWorkload):
        return ()
    estimate = _unfolded_estimate(loaded, gpus, topology)
    if estimate is None or _minutes(loaded, len(program.ops) + estimate.flows) < 1:
        return ()
    size = run_size_text(loaded, gpus, len(program.ranks), len(program.ops), topology, unfolded=estimate)
    return (f"runs unfolded: {size}", *([f"not folded: {step.off_reason}"] if step.off_reason else []))


def _minutes(loaded: LoadedScenario, events: int) -> float:
    """About how many minutes a run of ``events`` ops and flows takes (`EVENTS_PER_MINUTE`, or
    `PS_EVENTS_PER_MINUTE` for parameter servers)."""
    return events / (PS_EVENTS_PER_MINUTE if loaded.scenario.uses_parameter_servers else EVENTS_PER_MINUTE)


def run_size_text(loaded: LoadedScenario, gpus: int, ranks: int, ops: int, topology: Topology | None = None,
                  flows_per_op: float | None = None, unfolded: ScaleEstimate | None = None) -> str:
    """A run of the step of ``loaded`` on ``gpus`` GPUs simulating ``ranks`` ranks and ``ops`` ops (its built
    program's), in words: '512 of 512 ranks, 280,576 ops and ~3,690,455 flows (estimated), about 2 minutes'
    (`validate` of the 7.5B step unfolded on 64 DGX A100 hosts; 'under a minute' below half of one). Unfolded, the flows
    are the unfolded estimate's; folded onto fewer ranks, they are ``ops`` times ``flows_per_op``, the rate of
    the run given up before it, as the share of the unfolded estimate falls far short of a refold's (the 70B
    step at 4:1 refolded onto 256 of 2,048 ranks simulates 3,348,608 flows, 7.2 times that share). The ranks
    and ops alone where no rate or estimate sizes the flows (a trace, a fold onto fewer ranks without
    ``flows_per_op``). ``unfolded``: the unfolded estimate where the caller has made it (`unfolded_size_lines`),
    not made again."""
    size = f"{ranks:,} of {counted(gpus, 'rank')}, {ops:,} ops"
    if ranks < gpus:
        flows = None if flows_per_op is None else math.ceil(ops * flows_per_op)
    else:
        estimate = unfolded if unfolded is not None else _unfolded_estimate(loaded, gpus, topology)
        flows = None if estimate is None else estimate.flows
    if flows is None:
        return size
    minutes = _minutes(loaded, ops + flows)
    when = f"about {counted(round(minutes), 'minute')}" if minutes >= 0.5 else "under a minute"
    return f"{size} and ~{flows:,} flows (estimated), {when}"


def refuse_unfolded(loaded: LoadedScenario, gpus: int, unfolding: Unfolding, step: str = "this run",
                    topology: Topology | None = None) -> None:
    """Refuse the step of ``loaded``, asked to fold and estimated so, that ``unfolding`` runs unfolded, when its
    estimate unfolded is beyond the limits (`unfolded_beyond_limits`), or that it runs folded by classes onto
    `Unfolding.ranks` ranks, when that fold's estimate is (`_classes_estimate`): a located ScenarioError at the
    field of the check that failed (`_unfolding_blame`), naming why, raised before the program is built. ``step`` names
    it (a job's state); ``topology``: the built cluster (`estimate_scale`)."""
    if unfolding.ranks is not None:
        classed = _classes_estimate(loaded, gpus, unfolding.ranks, topology)
        if classed is not None and classed.over_limits():
            field, fix = _unfolding_blame(loaded, gpus, unfolding)
            raise loaded.error(field, f"{step} is too large to simulate folded by classes ({unfolding.reason}): "
                               f"{classed.describe()}; {classed.beyond()}", f"{fix}; or pass --force")
        return
    estimate = unfolded_beyond_limits(loaded, gpus, topology)
    if estimate is None:
        return
    field, fix = _unfolding_blame(loaded, gpus, unfolding)
    raise loaded.error(field, f"{step} is too large to simulate unfolded ({unfolding.reason}): "
                       f"{estimate.describe()}; {estimate.beyond()}", f"{fix}; or pass --force")


def _unfolding_blame(loaded: LoadedScenario, gpus: int, unfolding: Unfolding) -> tuple[FieldPath, str]:
    """The field a step that ``unfolding`` runs unfolded is refused at, and what to change: where its mirrored
    collectives meet unlike traffic because gathers overlap a skewed router's all-to-alls (`_skew_field`), the
    gathers' field and `skew_advice`, as the estimate's refusal gives them; else the check's (`UNFOLDING_FIELDS`,
    `_unfolding_advice`)."""
    skewed = _skew_field(loaded, gpus) if unfolding.check == "collectives" else None
    if skewed is not None:
        return skewed, f"{skew_advice(skewed)}; a smaller cluster{_named(_size_parameters(loaded))}"
    return UNFOLDING_FIELDS[unfolding.check], _unfolding_advice(loaded, unfolding)


def _classes_estimate(loaded: LoadedScenario, gpus: int, ranks: int, topology: Topology | None = None
                      ) -> ScaleEstimate | None:
    """The estimate of the step of ``loaded`` folded by classes of ranks onto ``ranks`` ranks (a job's step with
    its step timeline off): the folded estimate where it counts those ranks (`_folds_by_trays`), else the
    unfolded step's ops and memory in the share ``ranks`` of the GPUs simulates (`classed_estimate`) beside every
    flow of it: each representative's groups are simulated with the copies that meet them (the GB200 job's step
    at 4 racks: 83,664 flows of the unfolded estimate's 86,544). None for a trace."""
    folded = estimate_scale(_as_run(loaded.scenario), gpus, scenario_hosts(loaded), topology,
                            table=scenario_table(loaded))
    if folded is None or folded.simulated_ranks == ranks:
        return folded
    classed, unfolded = classed_estimate(loaded, gpus, ranks, topology), _unfolded_estimate(loaded, gpus, topology)
    if classed is None or unfolded is None:
        return classed
    return replace(classed, flows=unfolded.flows,
                   memory_bytes=classed.memory_bytes + (unfolded.flows - classed.flows) * FLOW_BYTES)


def _unfolding_advice(loaded: LoadedScenario, unfolding: Unfolding) -> str:
    """What removes the blocker ``unfolding`` names: for stages not aligned to NVLink domains, the layouts that
    align them (simulator/stage_remedies.py, each checked to align them), as no network model or smaller cluster of the
    same layout folds them; else the check's advice (`UNFOLDING_ADVICE`) or a smaller cluster."""
    from simulator.stage_remedies import aligned_stage_remedies, stage_remedies_text

    if unfolding.check == "stages":
        remedies = aligned_stage_remedies(loaded)
        return (f"stages aligned to NVLink domains: {stage_remedies_text(remedies)}" if remedies
                else UNFOLDING_ADVICE["stages"])
    return f"{UNFOLDING_ADVICE[unfolding.check]}; a smaller cluster{_named(_size_parameters(loaded))}"


REFOLD_COST_MULTIPLE = 2
"""Where the step may not run unfolded, a refold is tried only while it simulates at most this many times the
fold's ranks: a refold runs after the fold, whose answer the user then has (not exact, by how much it says), so a
refold that doubles the ranks at most keeps the command within about three times the fold's run. Measured on the
published rows (2026-12-04): the hop refold of SC21 310.1B (64 of the stage fold's 16 ranks) took the command
from 7.5 s and 0.47 GB to 24 s and 1.7 GB to move the step by 8e-6 s of 37 s; 529.6B's (140 of 35) from 40 s and
2.5 GB to 79 s and 5.1 GB and fell out of step, changing nothing."""


def refold_refusal(loaded: LoadedScenario, gpus: int, ranks: int, force: bool = False,
                   topology: Topology | None = None) -> str:
    """Why a refold of the step of ``loaded`` (asked to fold and estimated so) that simulates ``ranks`` ranks is
    not tried, '' where it is: more than `REFOLD_COST_MULTIPLE` times the ranks the fold simulates, or the folded
    estimate's ops, flows and memory beyond the process's and the cluster's, each times ``ranks`` over the ranks it
    simulates, beyond the limits. Flows grow with the ranks too: a refold's representatives send their own copies
    of what the fold mirrored, pruned or replayed (the long-context row by CP lane, 16 times the stage fold's
    ranks, posted or replayed 24.1 M flows against its 1.74 M). The budget of refolds tried where the step may not
    run unfolded (`program/unfolding.RefoldBudget`); where both refuse it, the reason names each (it named the
    multiple alone). ``force`` (--force) skips the limits but not the multiple: the analytic
    model's hop refold (`fold_policy.hop_refold`) runs in place of the stage fold whose estimate --force let
    through, and unbounded it simulated 320 of the published SC21 1T row's 3,072 ranks on that model (5 x its
    stage fold: 118 s of CPU and 7.1 GB against 19.6 s and 1.5 GB), a cost the forced estimate never showed.
    ``topology``: the built cluster (`estimate_scale`)."""
    folded = estimate_scale(loaded.scenario, gpus, scenario_hosts(loaded), topology, table=scenario_table(loaded))
    if folded is None or not folded.folded:
        return ""
    times = ranks / max(folded.simulated_ranks, 1)
    refusals = []
    if times > REFOLD_COST_MULTIPLE:
        refusals.append(f"the refold would cost {times:.3g} x the fold ({ranks:,} ranks simulated against "
                        f"{folded.simulated_ranks:,}); where the step may not unfold, a refold is tried within "
                        f"{REFOLD_COST_MULTIPLE} x the fold's ranks")
    estimate = refold_estimate(folded, gpus, ranks)
    if not force and estimate.over_limits():
        refusals.append(f"{estimate.describe()}; {estimate.beyond()}")
    return "; and beyond the limits too: ".join(refusals)


def every_mirror_refold(loaded: LoadedScenario, gpus: int, ranks: int, topology: Topology | None = None
                        ) -> ScaleEstimate | None:
    """The estimate of the step of ``loaded`` on ``gpus`` GPUs refolded onto ``ranks`` ranks with every mirror
    kept (a straggler state whose slow replica's traffic shares links with the other replicas',
    fold_policy.straggler_step): the stage fold counting every copy of its collectives (no replica quotient, which
    such stragglers rule out), times ``ranks`` over its ranks (`refold_estimate`). A job writes no step timeline.
    The 2,048-GPU Llama 3 70B job, 16 ranks: ~54,268 ops and ~415,424 flows, against 54,268 and 384,800 run (the
    share of the unfolded step, `classed_estimate`, counts 29,192 flows). Its flows are at most the unfolded
    step's: every copy of a collective is posted once, whichever rank it is a group or a mirror of, where the
    fold's own scaled by the ranks would count the copies its new representatives hold again (TP 8 PP 2 DP 2 on 4
    DGX H100 hosts, GPU 0 slowed, 8 ranks: 1,888 flows estimated, 1,816 run, 2,832 scaled). None for a trace."""
    scenario = loaded.scenario

    def estimated(fold: bool) -> ScaleEstimate | None:
        return estimate_scale(scenario.model_copy(update={"run": scenario.run.model_copy(
            update={"fold": fold, "timeline": "summary"})}), gpus, scenario_hosts(loaded), topology,
            replica_quotient=False, table=scenario_table(loaded))

    folded = estimated(True)
    if folded is None:
        return None
    refold = refold_estimate(folded, gpus, ranks)
    unfolded = estimated(False)
    excess = refold.flows - unfolded.flows if unfolded is not None else 0
    if excess <= 0:
        return refold
    return replace(refold, flows=refold.flows - excess, memory_bytes=refold.memory_bytes - excess * FLOW_BYTES)


def refold_estimate(folded: ScaleEstimate, gpus: int, ranks: int) -> ScaleEstimate:
    """The ``folded`` estimate of a step on ``gpus`` GPUs refolded to simulate ``ranks`` ranks: its ops, flows
    and memory beyond the process's and the cluster's (`_fixed_bytes`), each times ``ranks`` over the ranks the
    fold simulates."""
    times = ranks / max(folded.simulated_ranks, 1)
    fixed = _fixed_bytes(gpus)
    return replace(folded, simulated_ranks=ranks, ops=math.ceil(folded.ops * times),
                   flows=math.ceil(folded.flows * times),
                   memory_bytes=fixed + (folded.memory_bytes - fixed) * times)


def sized_topology(loaded: LoadedScenario, force: bool = False, weigh: Callable[[], str] | None = None
                   ) -> Topology:
    """The scenario's cluster, built only once a training layout's degrees multiply to its GPU count and split
    its global batch, and the run's estimate is within the limits (both from the topology's parameters when
    they tell the GPU count, else after building it: a million-GPU cluster takes tens of seconds to build),
    for a plain run and a job alike (a job's healthy step, `refuse_if_too_large`); a
    run that may post all-reduces as trees (`may_run_trees`) is estimated again on the built cluster, with the
    plans the tuner picks; ``force`` skips the limits, not the layout's check. ``weigh``: what a refusal of the
    cluster by its size gives of the step's memory (`refuse_too_many_gpus`)."""
    gpus = scenario_gpus(loaded)
    if gpus is not None:
        located(loaded, lambda: refuse_wrong_layout(loaded.scenario, gpus))
        if not force:
            located(loaded, lambda: refuse_too_many_gpus(loaded, gpus, weigh))
            located(loaded, lambda: refuse_if_too_large(loaded, gpus))
    topology = scenario_topology(loaded)
    if gpus is None:
        located(loaded, lambda: refuse_wrong_layout(loaded.scenario, topology.num_gpus))
        if not force:
            located(loaded, lambda: refuse_too_many_gpus(loaded, topology.num_gpus))
    if (gpus is None or may_run_trees(loaded.scenario)) and not force:
        located(loaded, lambda: refuse_if_too_large(loaded, topology.num_gpus, topology))
    return topology


def capped_topology(loaded: LoadedScenario, force: bool = False) -> Topology:
    """The scenario's cluster, refused beyond MAX_GPUS unless ``force``: before it is built where the topology's
    parameters tell its GPU count, else once built. For the commands that check the step on that cluster by their
    own rules (a layout search): without it, it built a 262,272-GPU cluster and ran for minutes."""
    gpus = scenario_gpus(loaded)
    if gpus is not None and not force:
        located(loaded, lambda: refuse_too_many_gpus(loaded, gpus))
    topology = scenario_topology(loaded)
    if gpus is None and not force:
        located(loaded, lambda: refuse_too_many_gpus(loaded, topology.num_gpus))
    return topology


def refuse_wrong_layout(scenario: Scenario, gpus: int) -> None:
    """A training step's parallel degrees checked against the cluster's ``gpus``, its global batch against
    the data-parallel degree they leave, and the layout against the model (heads, layers, sequence, experts;
    parameter servers place their own workers and servers)."""
    if scenario.model is not None and not scenario.uses_parameter_servers:
        from simulator.workload.training import (
            check_model_layout,
            microbatch_count,
            pipeline_depth,
            resolve_layout,
            resolve_model,
        )

        layout = resolve_layout(scenario, gpus, pipeline_depth(scenario))
        microbatch_count(scenario, layout.dp)
        if scenario.model.synthetic is None:
            check_model_layout(scenario, resolve_model(scenario), layout)
