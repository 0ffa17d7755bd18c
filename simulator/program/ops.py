"""The op IR: what each rank's streams execute. Programs are lists of these, built before the clock starts.

Ops name their dependencies by id; an op runs when its dependencies are done and its stream is free (streams
are in-order queues, as CUDA streams are). A collective or point-to-point op appears once per member rank with
the same ``key``; it starts when the last member arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from simulator.collectives.names import AlgorithmChoice, Primitive, ProtocolChoice

COMPUTE_STREAM = "compute"
COMM_STREAM = "comm"

PipelineCategory = Literal["forward", "backward", "weight_grad", "recompute"]
"""The compute of a block pass on a pipeline stage: what a schedule places, and what the bubble is measured
between."""
CommCategory = Literal["tp", "cp", "pp", "dp", "ep"]
"""The communication of one parallelism dimension: the kinds the step's (exposed) communication is split into."""
Category = Literal[PipelineCategory, CommCategory, "optimizer", "compute", "host", "comm", ""]
"""What the metrics group an op by, the contract between the programs' producers and the metrics: a pipeline
pass, a dimension's communication, the optimizer step, a traced kernel (`compute`), a traced host gap (`host`),
a collective of a `workload:` list (`comm`), or none (an op built by hand)."""
PIPELINE_CATEGORIES: tuple[PipelineCategory, ...] = get_args(PipelineCategory)
COMM_CATEGORIES: tuple[CommCategory, ...] = get_args(CommCategory)
# The categories metrics and reports pick ops out by, named once: each annotation checks its value against the
# Literal, so a misspelt category fails mypy instead of matching nothing in a DataFrame.
FORWARD_CATEGORY: PipelineCategory = "forward"
BACKWARD_CATEGORY: PipelineCategory = "backward"
"""A full backward (B) or an input-grad backward (Bi), told apart by the op name's pass prefix."""
WEIGHT_GRAD_CATEGORY: PipelineCategory = "weight_grad"
RECOMPUTE_CATEGORY: PipelineCategory = "recompute"
OPTIMIZER_CATEGORY: Category = "optimizer"
HOST_CATEGORY: Category = "host"
TP_CATEGORY: CommCategory = "tp"


@dataclass(slots=True)
class Op:
    """Common fields: a unique ``id``, the ``rank`` and ``stream`` it runs on, a ``name``, dependencies, the
    ``category`` metrics group it by (`Category`), the pipeline ``microbatch`` and the virtual
    stage (model ``chunk``) it works on (-1: none)."""

    id: int
    rank: int
    stream: str
    name: str
    deps: tuple[int, ...] = ()
    category: Category = ""
    microbatch: int = -1
    chunk: int = -1


@dataclass(slots=True)
class ComputeOp(Op):
    """A kernel (or fused run of kernels) lasting ``duration`` seconds, doing ``flops`` and moving ``hbm_bytes``
    through HBM. ``sm_bound_share`` is the share of its nominal time in kernels that SMs, not HBM, limit: only those
    slow down while communication kernels hold SMs (0: memory-bound throughout); ``reserved_sms`` are SMs it is
    launched without, left to the communication overlapping it. The program builder passes the fields by
    position (parallel/program.py), so their order is kept (tests/test_ops.py)."""

    duration: float = 0.0
    flops: float = 0.0
    hbm_bytes: float = 0.0
    sm_bound_share: float = 1.0
    reserved_sms: int = 0


@dataclass(slots=True)
class CollectiveOp(Op):
    """One rank's part of a collective ``op`` over ``group`` (global GPU indices, group order).

    ``key`` is shared by every member's op; ``nbytes`` is the per-rank buffer size (nccl-tests convention).
    ``pair_bytes`` (an all_to_all whose pairs exchange different amounts, e.g. MoE dispatch) holds the bytes
    member i sends member j, in group order; ``nbytes`` is then the mean a member sends, itself included.
    Members without ops (folded ranks) are not waited for. ``mirrors`` are the groups of the same collective
    among folded replicas: their flows run alongside, so the fabric sees every replica's traffic (the engine
    runs those engine/sharing.py keeps). ``sms`` is how many SMs the collective's kernel holds on each member
    GPU while it runs (None: as many as NCCL launches channels for the group, engine/contention.py).
    ``copies`` are the groups of every other copy of the collective that runs beside it (the same collective of
    the equivalent ranks, `folding.mirror_images`), folded or not, where the builder names them: the analytic model
    shares each link among all of their transfers (`simulation.copy_phases`); () where unknown (a trace's).
    ``algorithm`` and ``protocol`` are what the collective asks for (`auto`: the run's default). The program
    builder passes the fields by position, as `ComputeOp`'s.
    """

    op: Primitive = "all_reduce"
    group: tuple[int, ...] = ()
    nbytes: float = 0.0
    key: str = ""
    algorithm: AlgorithmChoice = "auto"
    protocol: ProtocolChoice = "auto"
    root: int = 0
    mirrors: tuple[tuple[int, ...], ...] = ()
    pair_bytes: tuple[tuple[float, ...], ...] = ()
    sms: int | None = None
    copies: tuple[tuple[int, ...], ...] = ()
