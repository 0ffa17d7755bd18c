"""The step program: the frozen, resolved plan of one training step, and the only thing the engine and the
metrics consume. Every workload source produces one: the transformer model (workload/transformer_program.py),
the parameter servers (parameter_server/program.py) and the trace importers (workload/traces/)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from simulator.config.yaml_source import FieldPath
from simulator.parallel.layout import Layout
from simulator.program.contention import SmShare
from simulator.program.ops import Op
from simulator.program.ps_plan import PsPlan
from simulator.program.unfolding import FoldCheck
from simulator.schedules.base import Schedule


@dataclass(frozen=True)
class StepProgram:
    """Per-rank ordered ops on streams with their dependencies (process groups live on the collectives), and
    what the metrics need to turn a timeline into a summary.

    ``ranks`` are the ranks that have ops; with folding each stands for the ranks of its pipeline stage (its
    TP, CP and DP peers run the same program), and the collectives' mirrors carry the other replicas' traffic.
    ``world`` is the number of GPUs the step spans. ``model_flops_per_step`` counts the model work the step
    did (MFU); ``nominal_model_flops_per_step``, with experts, the architecture's (top_k experts for every token,
    the capacity's drops included). Streams in ``async_streams`` run each op in its own
    process (isend/irecv); streams in ``serial_streams`` run one op at a time, first ready first
    run (a server applying updates).
    ``memory`` holds the summary's memory entries when the producer models memory (empty otherwise);
    ``details`` holds further summary entries that describe the step (``layout``, ``trace``...).
    ``layout`` is the TP x CP x PP x DP placement when the producer has one (stragglers fold by it).
    ``pipelined`` is false for a step whose ranks idle for another reason than a pipeline (a parameter-server
    worker waits for the servers, which exposed communication counts): its bubble is 0 and not a loss.
    ``sm_share`` (None: off) slows compute-bound kernels while communication kernels hold SMs on their GPU.
    ``parameter_server`` is a parameter-server run's plan, which its summary reads (None for other steps).
    ``training_ranks`` are the ranks that train when others only serve them (a parameter-server run's workers;
    None: every rank): the summary's communication times and losses are their means.
    ``fold_off_check`` is the check whose reason ``details['fold_off_reason']`` gives, where the producer built
    the step unfolded though asked to fold (the plan's, or a replicated trace's copies').
    ``exchanges`` puts collectives (by key) into exchanges, which the analytic model times as one collective
    each, whenever each of their collectives runs (a parameter-server iteration's pushes, and its pulls).
    """

    ops: tuple[Op, ...]
    world: int
    ranks: tuple[int, ...]
    tokens_per_step: float
    model_flops_per_step: float
    peak_flops: float
    nominal_model_flops_per_step: float | None = None
    async_streams: frozenset[str] = frozenset()
    serial_streams: frozenset[str] = frozenset()
    memory: Mapping[str, object] = field(default_factory=dict)
    memory_bound_share: float = 0.0
    folded: bool = False
    warnings: tuple[str, ...] = ()
    layout_warnings: tuple[tuple[FieldPath, str], ...] = ()
    """The layout's warnings as the step's plan gives them (`workload.training.layout_warnings`), the field
    apart: `simulation.py` locates them into ``warnings``."""
    details: Mapping[str, object] = field(default_factory=dict)
    layout: Layout | None = None
    pipelined: bool = True
    sm_share: SmShare | None = None
    parameter_server: PsPlan | None = None
    training_ranks: tuple[int, ...] | None = None
    fold_off_check: FoldCheck = "plan"
    exchanges: Mapping[str, str] = field(default_factory=dict)
    schedule: Schedule | None = None
    """The pipeline's action lists (p, m, v and placement in them), which the metrics run in the ideal executor
    with the run's own pass times for the schedule's own bubble (`schedule_bubble_fraction`); None where no
    pipeline schedule runs the step (a replayed trace, a parameter-server run)."""

