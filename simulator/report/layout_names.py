"""A run's layout named from its summary.json alone, as its first line and a Gantt chart's title name it.

Apart from report/outputs.py because the console names every run's layout and must not import pandas to do it
(a run under `run.timeline: summary` imports neither pandas nor pyarrow)."""

from __future__ import annotations

from simulator.config.schema import ZERO_STAGE_NAMES
from simulator.parallel.layout import DIMENSIONS, Layout, degrees_name
from simulator.units import counted


def run_layout(summary: dict) -> Layout:
    """The 4D layout the run used, from summary['layout']."""
    info = summary["layout"]
    order = tuple(info.get("order", DIMENSIONS))
    return Layout(tp=int(info.get("tp", 1)), cp=int(info.get("cp", 1)), pp=int(info.get("pp", 1)),
                  dp=int(info.get("dp", 1)), order=order)


def parallel_degrees(summary: dict) -> str:
    """The run's parallel degrees, as the console's layout line and a Gantt chart's title both name them:
    'TP8 CP1 PP16 DP128', then EP from the summary's `moe` where above 1 (the experts' split of the DP x CP ranks,
    which summary['layout'] does not hold; a MoE layout read without it looks expert-replicated)."""
    layout = run_layout(summary)
    return degrees_name(layout.tp, layout.cp, layout.pp, layout.dp, int((summary.get("moe") or {}).get("ep", 1)))


def layout_name(summary: dict) -> str:
    """The run's layout as its first line and a Gantt chart's title both name it: the parallel degrees, then the
    sharding where the layout names one ('TP1 CP1 PP1 DP8 FSDP full_shard (ZeRO-3)'), then the pipeline schedule
    where it names one ('TP1 CP1 PP4 DP2 DDP, dualpipev v2')."""
    sharding = sharding_name(summary)
    named = f"{parallel_degrees(summary)} {sharding}" if sharding else parallel_degrees(summary)
    schedule = schedule_name(summary)
    return f"{named}, {schedule}" if schedule else named


def schedule_name(summary: dict) -> str:
    """The pipeline schedule the run ran: summary['layout']'s `schedule` ('1f1b', 'custom: table.csv'), then its
    chunks per rank where above 1 ('interleaved v2'); '' where the layout names no schedule (one pipeline stage
    and none given, a parameter server, a trace)."""
    layout = summary.get("layout") or {}
    if "schedule" not in layout:
        return ""
    chunks = int(layout.get("virtual_stages", 1))
    return f"{layout['schedule']} v{chunks}" if chunks > 1 else str(layout["schedule"])


def sharding_name(summary: dict) -> str:
    """How the run shards its data-parallel state, as its first line names it: 'DDP', 'ZeRO-1' .. 'ZeRO-3'
    (`ZERO_STAGE_NAMES`), or PyTorch FSDP by the scenario's strategy with the ZeRO stage it runs as ('FSDP
    full_shard (ZeRO-3)'), a hybrid one with its shard groups' size ('FSDP hybrid_shard (ZeRO-3, HSDP shards of
    8 ranks)'); '' where the layout names no ZeRO stage (a parameter server, a trace)."""
    layout = summary.get("layout") or {}
    if "zero_stage" not in layout:
        return ""
    stage = ZERO_STAGE_NAMES[int(layout["zero_stage"])]
    if "fsdp" not in layout:
        return stage
    shards = f", HSDP shards of {counted(layout['shard_ranks'], 'rank')}" if "shard_ranks" in layout else ""
    return f"FSDP {layout['fsdp']} ({stage}{shards})"


def stands_for(weight: int) -> str:
    """How many GPUs a folded rank stands for, in words ("stands for 1 GPU", "stands for 152 GPUs")."""
    return f"stands for {counted(weight, 'GPU')}"
