"""The transformer model as a producer of the step program: resolve the training step, build every simulated
rank's ops with the program builder, and attach what the metrics need (tokens, model FLOPs, memory)."""

from __future__ import annotations

from pathlib import Path

from simulator.config.schema import Scenario
from simulator.parallel.folding import RankClasses
from simulator.parallel.program import ASYNC_STREAMS, ProgramBuilder, plan_fold_blocker
from simulator.program.step import StepProgram
from simulator.program.unfolding import Unfolding, UnfoldingGuard
from simulator.topology.graph import Topology
from simulator.workload.calibrated import contention_share
from simulator.workload.loss_scaling import loss_scaling_summary
from simulator.workload.memory_plan import layout_summary, memory_bound_share, overlap_summary, step_memory
from simulator.workload.training import build_training_step


def transformer_program(scenario: Scenario, topology: Topology, base_dir: Path, *, fold: bool,
                        guard: UnfoldingGuard | None = None, classes: RankClasses | None = None) -> StepProgram:
    """The scenario's training step as a step program; ``base_dir`` is the scenario's folder (custom schedule
    tables are looked up there), ``fold`` simulates one representative rank per pipeline stage where the plan's
    ranks of a stage do the same work (``guard`` hears why not before the program is built unfolded), with
    ``classes`` one per class and stage where the ranks of a stage are not all alike (engine/rank_classes.py, or
    one per CP lane: parallel/folding.py `lane_classes`)."""
    step = build_training_step(scenario, topology, base_dir)
    blocker = plan_fold_blocker(step.plan) if fold else ""
    if blocker and guard is not None:
        guard(Unfolding("plan", blocker))
    fold = fold and not blocker
    builder = ProgramBuilder(step.plan, fold=fold, classes=classes,
                             copies=scenario.network.model == "analytic")
    ops = builder.build()
    layout = step.plan.layout
    ranks = tuple(builder.representatives())
    memory = step_memory(scenario, step)
    return StepProgram(ops=tuple(ops), world=topology.num_gpus, ranks=ranks,
                       tokens_per_step=step.tokens_per_step, model_flops_per_step=step.model_flops_per_step,
                       nominal_model_flops_per_step=step.nominal_model_flops_per_step,
                       peak_flops=step.gpu.peak(scenario.training.precision), async_streams=ASYNC_STREAMS,
                       memory=memory, memory_bound_share=memory_bound_share(step), folded=fold,
                       layout_warnings=step.warnings,
                       details={"layout": layout_summary(step, scenario.parallelism.fsdp),
                                "overlaps": overlap_summary(step),
                                **({"moe": dict(step.moe)} if step.moe else {}),
                                **({"cp_imbalance": dict(step.cp_imbalance)} if step.cp_imbalance else {}),
                                **({"loss_scaling": loss_scaling_summary(scenario.training.loss_scaling,
                                                                         scenario.run.seed)}
                                   if scenario.training.loss_scaling else {}),
                                **({"fold_off_reason": blocker} if blocker else {})},
                       layout=layout, schedule=step.plan.schedule,
                       sm_share=contention_share(scenario.collectives.sm_contention, step.gpu.name))
