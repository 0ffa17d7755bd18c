"""What `trainsim run` and `trainsim validate` print: a short table of a run's headline figures (the
collective table of a communication-only run, the job table of a job over weeks), the loud out-of-memory line and
`validate`'s peak memory per GPU.

Reads only summary.json's keys and shows those present, so a summary that gains or loses keys still prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from simulator.metrics.summary import LOSS_LABELS, OOM_FIGURES, SHOWN_LOSS_SHARE, factor_text, pace
from simulator.program.ops import COMM_CATEGORIES
from simulator.report.layout_names import layout_name
from simulator.schedules.base import Placement, rank_stages, stage_rank
from simulator.schedules.registry import closed_form_bubble
from simulator.units import (
    counted,
    durations_alike,
    expected_count,
    format_duration,
    format_memory,
    format_seconds,
    format_size,
    four_digits,
    number_ranges,
    rounds_to,
    seconds_alike,
)

if TYPE_CHECKING:
    from simulator.config.loader import LoadedScenario
    from simulator.simulation import FoldDropped, Rerun
    from simulator.topology.graph import Topology


def step_seconds(value: float) -> str:
    """A step's time in seconds with its trailing zeros (`seconds_alike`, as every time of the step's table reads:
    '227.0 ms' above 'dp 103.7 ms'), and from a minute on in the unit that reads it at a glance
    (`format_duration`, as the job's figures are): a 1,546,021 s step read only in seconds, now '(17.89 d)'."""
    return seconds_alike(value) + (f" ({format_duration(value)})" if value >= MINUTE_S else "")


MINUTE_S = 60.0
"""From this long on, a step's time is given in minutes, hours or days too."""


def _share(value: float) -> str:
    """A fraction as a percentage to 0.1%; a positive one below 0.05% is '<0.1%', not '0.0%', which reads as none
    (the pipeline hand-offs' 828 us of a 1.7 s step printed 'pp 828.2 us (0.0%)'); one short of the whole by
    under 0.05% is '>99.9%', not '100.0%', which reads as nothing lost (a job losing 14.3 s of a day to
    checkpoints printed 'ETTR 100.0%')."""
    if 0 < value < 0.0005:
        return "<0.1%"
    if 0.9995 <= value < 1:
        return ">99.9%"
    return f"{100 * value:,.1f}%"


def _hfu(summary: dict) -> str:
    """HFU, or n/a for a trace whose ops carry no shapes: its executed FLOPs are unknown, not zero (summary.json's
    `hfu` is null there). A trace's counted FLOPs are its matrix multiplies' alone (attention and
    the rest are not counted), so its HFU is a lower bound and says so; where that share of peak falls below the
    MFU, whose model FLOPs count attention too, HFU (which counts all the executed FLOPs, recompute besides the
    model's) is at least the MFU, and the matrix multiplies' share is named as theirs: 'HFU >= 25.5%' beside
    'MFU 28.0%' on the H200 trace read as HFU below MFU. An MFU above 100% (warned as wrong: the scenario's model
    FLOPs overstate the work, `throughput_warnings`) bounds nothing, and 'HFU >= MFU' beside 'MFU 280.5%' claimed
    the hardware ran at 280% of peak: there the matrix multiplies' share alone is the bound."""
    if "trace" in summary and not summary.get("hardware_tflops_per_gpu"):
        return "HFU n/a: no op shapes in the trace"
    if "trace" in summary and summary["hfu"] < summary.get("mfu", 0.0) <= 1:
        return f"HFU >= MFU; the matrix multiplies alone {_share(summary['hfu'])} of peak"
    if "trace" in summary:
        return f"HFU >= {_share(summary['hfu'])}: matrix multiplies only"
    return f"HFU {_share(summary['hfu'])}"


MOVED_CLASSES = {"matmul": "GEMMs", "attention": "attention", "memory-bound": "memory-bound", "unknown": "unknown"}
"""How the moved row names each kernel class of workload/traces/gpu_move.py."""


def gpu_move_text(move: dict, recosted: int = 0) -> str | None:
    """A trace moved to another GPU (summary.json's `trace.gpu_move`) in one line: from which GPU to which and
    each class's kernels with the factor on their durations, 'from h200 to h100-sxm: 51 GEMMs x1.043, 8 attention
    x1.099-1.124, 267 memory-bound x1.449'; the table read only 'trace on dgx-h100 (1 h100-sxm GPU)'. None where
    nothing moved: traced on the cluster's GPU ('from h200 to h200'), or no class with both ops and rates (the
    row ended 'from h200 to h100-sxm: '). GEMMs re-costed from their shapes (`recosted`, `recost_gemms`) are not
    scaled, so `move` counts none of them: the line says how many there are instead ('51 GEMMs re-costed')."""
    if move["from"] == move["to"]:
        return None
    parts = [f"{recosted:,} GEMM{'s' if recosted != 1 else ''} re-costed"] if recosted else []
    for kind, entry in move["classes"].items():
        ratios = sorted(rate["duration_ratio"] for rate in entry["rates"])
        if entry["ops"] and ratios:
            factor = f"x{ratios[0]:.4g}" + (f"-{ratios[-1]:.4g}" if f"{ratios[-1]:.4g}" != f"{ratios[0]:.4g}" else "")
            parts.append(f"{entry['ops']:,} {MOVED_CLASSES.get(kind, kind)} {factor}")
    return f"from {move['from']} to {move['to']}: " + ", ".join(parts) if parts else None


def _bubble_text(summary: dict) -> str:
    """The pipeline bubble on both its bases: of the pipeline window (up to the last forward or backward; the
    closed forms' measure) beside the schedule's own bubble (`schedule_bubble_fraction`: the ideal executor's
    with the run's pass times, no waits), and of the step (the bottleneck row's). 'pipeline bubble 50.0% of the
    pipeline window' above 'largest single loss: pipeline bubble, 45.9% of the step' read as two answers to one
    question, and a Llama 3 405B step's 20.2% of the window (8,192 GPUs) as its schedule's, which alone leaves
    6.2%. The step's share says how much of it waits on exposed communication (`bubble_on_exposed_comm`), which
    the exposed communication rows count too."""
    schedule = summary.get("schedule_bubble_fraction")
    alone = f"; the schedule alone {_share(schedule)}{_uneven_stages_text(summary)}" if schedule is not None else ""
    text = (f"{_share(summary['bubble_fraction'])} of the pipeline window (idle on the compute stream, waits "
            f"included{alone})")
    bottleneck = summary.get("bottleneck") or {}
    step_share = (bottleneck.get("loss_shares") or {}).get("pipeline_bubble")
    on_comm = float((bottleneck.get("evidence") or {}).get("bubble_on_exposed_comm_share") or 0.0)
    waiting = f", of which {_share(on_comm)} waiting on exposed communication" if on_comm >= SHOWN_LOSS_SHARE else ""
    return text + (f", {_share(step_share)} of the whole step{waiting}" if step_share is not None else "")


UNEVEN_STAGE_SHARE = 0.001
"""Below this the schedule's bubble is the uniform-stage one and the stages even: the row names no slow stage."""
CLOSED_FORM_TOLERANCE = 1e-9
"""How near the uniform-stage bubble a closed form not exact at the run's m must come to be printed beside it."""


def _uneven_stages_text(summary: dict) -> str:
    """The bubble at uniform stages (`uniform_stage_bubble_fraction`, with the schedule's closed form where it
    equals it, `closed_form_bubble`) and, where the schedule's own bubble is above it, which pipeline rank lifts
    it and by how much it is slower than the others' mean (`stage_busy_s`), naming the embedding or output layer
    it holds: the README's Llama 3 8B at pp 4, m 64 reads 13.7% against the textbook's 3/67 = 4.5%, all of it
    the last stage's 128,256-word output layer. No setting is suggested: `pipeline.first_last_fewer_layers`
    needs layers + 2 to split over pp x v where a running layout without it has the layers split, which only 2
    stages allow, and there it splits them alike."""
    uniform = summary.get("uniform_stage_bubble_fraction")
    by_stage = summary.get("stage_busy_s") or {}
    busy = [float(by_stage[stage]) for stage in sorted(by_stage, key=int)]
    if uniform is None or len(busy) < 2:
        return ""
    layout = summary.get("layout") or {}
    p, m, v = len(busy), int(layout.get("microbatches", 0)), int(layout.get("virtual_stages", 1))
    form = closed_form_bubble(str(layout.get("schedule")), p, m, v) if m else None
    closed = (f" = {form.formula} = {form.numerator}/{form.denominator}"
              if form and (form.exact or abs(form.fraction - uniform) < CLOSED_FORM_TOLERANCE) else "")
    text = f"; {_share(uniform)} at uniform stages{closed}"
    slowest = max(range(p), key=busy.__getitem__)
    others = (sum(busy) - busy[slowest]) / (p - 1)
    excess = busy[slowest] / others - 1 if others > 0 else 0.0
    if summary["schedule_bubble_fraction"] - uniform < UNEVEN_STAGE_SHARE or excess < UNEVEN_STAGE_SHARE:
        return text
    placement = layout.get("placement", "loop")
    ends = [part for stage, part in ((0, "the embedding"), (p * v - 1, "the output layer"))
            if stage_rank(stage, p, placement) == slowest] if layout.get("model", "synthetic") != "synthetic" else []
    held = f", with {' and '.join(ends)}," if ends else ""
    name = _pipeline_rank_name(slowest, p, v, placement)
    return text + f": {name}{held} is {_share(excess)} slower than the others' mean"


def _pipeline_rank_name(rank: int, p: int, v: int, placement: Placement) -> str:
    """Pipeline rank ``rank`` named by what it holds: 'the first stage', 'the last stage', 'stage 1' with one
    stage a rank; 'pipeline rank 3 (stages 3, 4)' with several, where the V's rank p - 1 holds the middle two."""
    if v == 1:
        return {0: "the first stage", p - 1: "the last stage"}.get(rank, f"stage {rank}")
    return f"pipeline rank {rank} (stages {', '.join(map(str, rank_stages(rank, p, v, placement)))})"


def _idle_text(fraction: float) -> str:
    """The compute idle of a step without a pipeline and the window it is a share of: '0.0% of the forward/backward
    window'. A bare '0.0%' beside 'exposed communication dp 43.42 ms (3.0%)' read as a contradiction, where the
    compute stream stands still for the DP tail after that window."""
    return f"{_share(fraction)} of the forward/backward window"


def _bottleneck(value: object) -> str:
    """The bottleneck's own sentence (`verdict`) when the summary has one, else the binding constraint and the
    largest single loss with its share of the step, worded as the verdict is."""
    if not isinstance(value, dict):
        return str(value)
    if isinstance(value.get("verdict"), str):
        return value["verdict"]
    text = str(value.get("constraint", "")).replace("_", " ")
    loss = value.get("largest_loss")
    if isinstance(loss, dict) and "name" in loss:
        share = loss.get("share_of_step")
        text += (f"; largest single loss: {loss['name']}"
                 + (f" ({_share(share)} of the step)" if share is not None else ""))
    return text


def oom_line(summary: dict, loaded: LoadedScenario, topology: Topology | None = None) -> str:
    """The out-of-memory message of a summary ('' when the run fits), with the remedies for ``loaded`` on
    ``topology`` (its cluster, built where not given): each a setting the loader takes that lowers the peak, by
    how much (`memory_remedies`)."""
    if not summary.get("oom"):
        return ""
    from simulator.memory_remedies import memory_remedies, remedies_text

    tried = remedies_text(memory_remedies(loaded, topology), whole_model=loaded.scenario.uses_parameter_servers)
    larger = _larger_gpus(summary["peak_memory_gib"], topology.gpu_model if topology else summary.get("gpu_model"))
    return (f"OUT OF MEMORY: {summary['peak_memory_gib']:,.1f} GiB needed{_peak_place(summary)}, the GPU holds "
            f"{summary['memory_capacity_gib']:.1f} GiB (try {tried}){larger}")


def _larger_gpus(peak_gib: float, current: str | None) -> str:
    """The catalog GPUs that hold a peak of ``peak_gib`` (a layout's memory per GPU does not depend on the GPU), as
    a clause of the out-of-memory line: '; the same layout fits h200 (140.4 GiB), b200 (179.1 GiB) (trainsim
    gpus)', '' where none does."""
    from simulator.catalog.gpus import GPUS
    from simulator.workload.memory_plan import GIB

    fitting = [f"{name} ({spec.hbm_bytes / GIB:.1f} GiB)" for name, spec in GPUS.items()
               if name != current and spec.hbm_bytes / GIB >= peak_gib]
    return f"; the same layout fits {', '.join(fitting)} (trainsim gpus)" if fitting else ""


def tight_memory_line(summary: dict) -> str:
    """The warning of a summary whose peak fits with less room than the memory plan leaves out
    (its `memory_tight`, `memory_plan.tight_fit`), '' otherwise."""
    from simulator.workload import memory_plan

    if not summary.get("memory_tight"):
        return ""
    peak, capacity = summary["peak_memory_gib"], summary["memory_capacity_gib"]
    floor = memory_plan.UNMODELLED_BYTES / memory_plan.GIB
    digits = _digits_below(capacity - peak, floor)
    return (f"{peak:,.{digits}f} GiB of the GPU's {capacity:,.{digits}f} GiB{_peak_place(summary)} leaves "
            f"{capacity - peak:.{digits}f} GiB, less than the memory plan leaves out (at least {floor:.0f} GiB: the "
            "CUDA context, NCCL's buffers, the allocator's fragmentation: docs/training-step.md): a real GPU may run "
            "out of memory")


def _digits_below(value: float, floor: float, least: int = 2, most: int = 6) -> int:
    """The decimals, from ``least``, that print ``value`` (below ``floor``) as less than ``floor``: 0.998 GiB
    left under a 1 GiB floor reads 0.998, not 1.00; ``most`` where even they round it up to the floor."""
    digits = least
    while digits < most and round(value, digits) >= floor:
        digits += 1
    return digits


def _peak_place(summary: dict) -> str:
    """Where the fullest GPU is: " on pipeline stage 2 (rank 16)"; a rank holding several virtual stages
    (interleaved, the V of zbv and dualpipev) with all of them, " on rank 0 (stages 0, 7)", named by
    `held_stages` as the memory chart's legend and the Gantt rows are; " on rank 3" without stages."""
    from simulator.report.outputs import held_stages

    stage, rank = summary.get("peak_memory_stage"), summary.get("peak_memory_rank")
    if stage is None:
        return f" on rank {rank}" if rank is not None else ""
    held = held_stages(summary, int(stage))
    if len(held) > 1:
        return f" on rank {rank} (stages {', '.join(map(str, held))})"
    return f" on pipeline stage {stage} (rank {rank})"


def memory_line(summary: dict) -> str:
    """The peak memory per GPU against the GPU's capacity, where it is and its three largest parts, for
    `trainsim validate` ('' where nothing is modelled: a communication-only workload, a trace, synthetic costs)."""
    peak = summary.get("peak_memory_gib")
    if not peak:
        return ""
    capacity = summary["memory_capacity_gib"]
    parts = sorted(summary.get("memory_breakdown_gib", {}).items(), key=lambda part: -part[1])
    largest = ", ".join(f"{name} {format_memory(size)}" for name, size in parts[:3] if size)
    fits = ", OUT OF MEMORY" if summary.get("oom") else ""
    return (f"peak memory per GPU: {format_memory(peak)} of {capacity:.1f} GiB ({_share(peak / capacity)}{fits})"
            f"{_peak_place(summary)}; largest parts: {largest}")


STATE_PARTS = ("params", "grads", "optimizer")
"""The parts of the model state, in the order the ZeRO paper sums their bytes per parameter (2 + 2 + K)."""
PAPER_GRAD_BYTES = 2.0
"""The gradient bytes per parameter of the ZeRO paper's mixed-precision sum (2 + 2 + K)."""


def model_state_line(summary: dict) -> str:
    """`trainsim validate`'s line of the fullest rank's model state (weights, gradients and optimizer state,
    `memory_breakdown_gib`) as the ZeRO paper sums it (`model_state`): bytes per parameter times the parameters
    of the rank's tp x pp shard, each sharded part over its ranks: 'model state per GPU: params 0.22 + grads 0.22
    + optimizer 1.30 = 1.74 GiB = 1.867 GB (2+2+12 = 16 B x 7.47e9 parameters, over dp 64)' at ZeRO-3,
    '(2+2+12/64 = 4.19 B x 7.47e9 parameters)' at ZeRO-1, '(... 16 B x 4.41e9 parameters of a tp 8 x pp 2
    shard, over dp 2)' for Llama 3 70B; and where bf16 keeps its gradients in fp32, that and the setting for the
    paper's 2 B. The memory line's three largest parts left ZeRO-3's 0.22 GiB of params and grads out of sight,
    and 'over 2 GPUs' alone read as the whole model over 2. '' without a `model_state` (a synthetic or MoE
    model, a trace)."""
    state = summary.get("model_state")
    parts = summary.get("memory_breakdown_gib") or {}
    if not state:
        return ""
    total_gib = sum(float(parts.get(part, 0.0)) for part in STATE_PARTS)
    per, sharded, ranks = state["bytes_per_parameter"], set(state["sharded"]), int(state["shard_ranks"])
    terms = [f"{per[part]:g}" for part in STATE_PARTS]
    layout = summary.get("layout") or {}
    shard = [f"{axis} {layout[axis]:,}" for axis in ("tp", "pp") if int(layout.get(axis, 1)) > 1]
    parameters = f"{_parameter_count(float(state['parameters']))} parameters" + (
        f" of a {' x '.join(shard)} shard" if shard else "")
    if sharded == set(STATE_PARTS):
        over = f"dp {ranks:,}" if ranks == int(layout.get("dp", 0)) else f"{ranks:,} ranks"
        sum_text = f"{'+'.join(terms)} = {sum(per[part] for part in STATE_PARTS):g} B x {parameters}, over {over}"
    else:
        held = sum(per[part] / (ranks if part in sharded else 1) for part in STATE_PARTS)
        sum_text = "+".join(term + (f"/{ranks:,}" if part in sharded else "") for term, part in zip(terms, STATE_PARTS,
                                                                                               strict=True))
        sum_text += f" = {held:.3g} B x {parameters}"
    grads = per["grads"]
    fp32_grads = (f"; bf16 training keeps fp32 gradients ({grads:g} B, not the ZeRO paper's {PAPER_GRAD_BYTES:g}: "
                  "--set training.grad_reduce_dtype=bf16 for it)"
                  if state["precision"] == "bf16" and per["params"] == PAPER_GRAD_BYTES and grads > PAPER_GRAD_BYTES
                  else "")
    held_parts = " + ".join(f"{part} {float(parts.get(part, 0.0)):,.2f}" for part in STATE_PARTS)
    return (f"model state per GPU: {held_parts} = {total_gib:,.2f} GiB = {total_gib * 2**30 / 1e9:,.4g} GB "
            f"({sum_text}){fp32_grads}")


def _parameter_count(count: float) -> str:
    """A parameter count to three significant digits as the papers write it: 4.41e9, 1.2e6."""
    mantissa, exponent = f"{count:.2e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def cluster_gpus(summary: dict) -> str:
    """The run's GPUs, counted and named as the catalog names their model: '16,384 h100-sxm GPUs', '1 h200 GPU'
    (the cluster's name alone says nothing of its GPUs: `cluster.gpu_model` may set any)."""
    model = summary.get("gpu_model")
    return counted(summary.get("gpus", "?"), f"{model} GPU" if model else "GPU")


def _layout_line(summary: dict) -> str:
    """A run's first line: its model, cluster, GPUs, parallel degrees, sharding, pipeline schedule (where the
    summary names one) and micro-batches per step."""
    layout = summary.get("layout") or {}
    what = layout.get("model") or ("trace" if "trace" in summary else "model")
    head = f"{what} on {summary.get('topology', '?')} ({cluster_gpus(summary)}"
    if not layout:
        return head + ")"
    kernels = f", {layout['kernels']} kernels" if "kernels" in layout else ""
    microbatches = counted(layout.get("microbatches", "?"), "micro-batch", "micro-batches")
    return f"{head}, {layout_name(summary)}, {microbatches} per step{kernels})"


def _given_up_text(entry: dict, before: dict | None = None) -> str:
    """One fold given up (an entry of summary.json's `fold_given_up`) in a clause: which, and its short `why`
    ('the stage fold given up: the step's faults differ across replicas'); 'for the same reason' where the entry
    ``before`` it gave the same why. The check's sentence and the figures of a run out of step stay in
    summary.json, so that the `ranks` row stays one line."""
    if before is not None and before["why"] == entry["why"]:
        return f"the {entry['fold']} fold given up for the same reason"
    return f"the {entry['fold']} fold given up: {entry['why']}"


def rerun_line(notice: FoldDropped | Rerun) -> str:
    """The line on stderr as a fold is given up for falling out of step (`simulation.FoldDropped`), in words for a
    user who never read how folding works: the run simulated one rank for each set of alike GPUs, their copies fell
    out of step (by how much, at which collective), so the step runs again on more ranks to keep its figures
    exact; the check's sentence and the instance's ends stay in summary.json's `fold_given_up`. Then, as the run
    after it starts (`simulation.Rerun`), what it simulates and about how long it takes."""
    from simulator.simulation import Rerun

    if isinstance(notice, Rerun):
        return f"note: simulating the step again on {notice.size}{' (every rank)' if notice.unfolded else ''}"
    apart = notice.given_up.get("out_of_step")
    found = f" {_out_of_step_text(apart)}" if apart else ""
    return (f"note: the step was simulated with one rank standing for each set of alike GPUs, but their copies "
            f"fell out of step{found}, so it is simulated again on more ranks to keep the figures exact (details: "
            "summary.json's fold_given_up)")


def _out_of_step_text(apart: dict) -> str:
    """The first collective instance out of step of a fold's run (an entry's `out_of_step`) in a clause: by how
    much, then which instance (a hand-off by its sender and receiver, another collective by its group) and, where
    the run stopped at it, that it did, else how many instances of its kind were out of step: 'by up to 1 us
    (hand-off 'send fwd mb0', GPUs 24 -> 32, 192 instances)'."""
    gap = format_seconds(apart["widest_s"])
    group = apart["group"]
    which = (f"hand-off {apart['name']!r}, GPUs {group[0]} -> {group[-1]}" if apart["op"] == "send_recv"
             else f"{apart['op']} {apart['name']!r} over GPUs {group}")
    if "stopped_at_s" in apart:
        return f"by {gap} ({which}; the run stopped there)"
    return f"by up to {gap} ({which}, {counted(apart['instances'], 'instance')})"


def _not_exact_text(entry: dict) -> str:
    """The fold that ran and stands though not exact (summary.json's `fold_not_exact`) in a clause: 'folded by
    stage, not exact: 1,328 hand-offs out of step by up to 1.071 ms', or with its why where its run did not fall
    out of step (known before the run: its hand-offs' copies cross other hops). A fold whose run fell out of step
    stands only for hand-offs, and only where that run went to its end (simulation.py: other collectives out of
    step unfold the step or refuse it, and a run stops only where its fold is given up), so its figures count
    hand-off instances."""
    apart = entry.get("out_of_step")
    if not apart:
        return f"folded by {entry['fold']}, not exact: {entry['why']}"
    count = counted(apart["instances"], "hand-off")
    return f"folded by {entry['fold']}, not exact: {count} out of step by up to {format_seconds(apart['widest_s'])}"


def _weights_text(weights: dict[str, int] | None) -> str:
    """How many GPUs each simulated rank of a fold by classes of unequal size stands for (the summary's
    `rank_weights`), heaviest first: ', ranks 0, 8 standing for 16 GPUs each, 16, 24 for 8'; '' without weights."""
    if not weights:
        return ""
    by_weight: dict[int, list[int]] = {}
    for rank, weight in weights.items():
        by_weight.setdefault(weight, []).append(int(rank))
    (weight, ranks), *lighter = sorted(by_weight.items(), reverse=True)
    each = "s" if len(ranks) > 1 else ""
    text = f", rank{each} {number_ranges(sorted(ranks))} standing for {weight:,} GPUs{' each' if each else ''}"
    return text + "".join(f", {number_ranges(sorted(ranks))} for {weight:,}" for weight, ranks in lighter)


def folding_text(summary: dict) -> str:
    """The `ranks` row, one line: how many ranks the run simulated of its GPUs (with the GPUs each stands for
    under `rank_weights`), then the fold that stands though not exact (`fold_not_exact`) with how many hand-offs
    fell out of step by up to how much, else each fold given up on the way (`fold_given_up`) with its short why.
    The refolds given up before a fold that stands not exact, the checks' sentences and the first instance out
    of step are in summary.json (and the run's warning). '' for a summary without simulated ranks."""
    ranks = summary.get("simulated_ranks")
    if ranks is None:
        return ""
    not_exact = summary.get("fold_not_exact")
    text = f"{ranks:,} of {counted(summary.get('gpus', '?'), 'rank')} simulated" + (
        " (folded)" if summary.get("folded") and not not_exact else "") + _weights_text(summary.get("rank_weights"))
    if not_exact:
        return f"{text}; {_not_exact_text(not_exact)}"
    given_up = summary.get("fold_given_up") or []
    return text + "".join(f"; {_given_up_text(entry, before)}" for entry, before in zip(given_up, [None, *given_up]))


def _label_table() -> Table:
    """An empty table of label (bold) and value rows, without a header: the shape of the headline tables."""
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    return table


def resources_row(resources: dict) -> tuple[str, str]:
    """A step's GPU time, GPU energy and cost, per million tokens where the step has tokens, else per step:
    ('per 1M tokens', '0.02436 GPU-h, 0.01705 kWh (700 W a GPU, board power), 0.0609 USD')."""
    per = "_per_million_tokens" if resources.get("gpu_hours_per_million_tokens") is not None else "_per_step"
    power = (f"{four_digits(resources['gpu_power_w'])} W a GPU"
             + (", board power" if resources["gpu_power_source"] == "board power" else ""))
    parts = [f"{four_digits(resources['gpu_hours' + per])} GPU-h",
             f"{four_digits(resources['gpu_energy_kwh' + per])} kWh ({power})"]
    if "cost" + per in resources:
        parts.append(f"{four_digits(resources['cost' + per])} {resources['currency']}")
    return ("per 1M tokens" if per == "_per_million_tokens" else "per step"), ", ".join(parts)


def training_table(summary: dict) -> Table:
    """Step time, throughput, FLOP rates, bubble, exposed communication per kind, a parameter-server worker's
    wait beside it, a MoE step's routing skew, uneven CP ranks' attention, the waits for slower ranks and for
    other stages after the pipeline window, peak memory, bottleneck, and where a fold was given up on the way or
    the one that stands is not exact, the ranks simulated and why (`folding_text`)."""
    table = _label_table()
    step = summary.get("step_time_s")
    ps = summary.get("parameter_server")
    if step is not None:
        table.add_row(f"run time ({counted(ps['iterations'], 'iteration')})" if ps else "step time", step_seconds(step))
    move = (summary.get("trace") or {}).get("gpu_move")
    moved = gpu_move_text(move, summary["trace"].get("recosted_gemms") or 0) if move else None
    if moved:
        table.add_row("moved", moved)
    untold = "trace" in summary and summary.get("tokens_per_s") is None
    synthetic = (summary.get("layout") or {}).get("model") == "synthetic"
    if untold:
        table.add_row("throughput", "n/a (the trace states no tokens: set workload.tokens_per_step and "
                                    "model_flops_per_token)")
    elif synthetic:
        table.add_row("throughput", "n/a (synthetic stage costs: no tokens, FLOPs or memory)")
    elif "tokens_per_s" in summary and not ps:
        table.add_row("throughput", f"{summary['tokens_per_s']:,.0f} tokens/s")
    if summary.get("tflops_per_gpu") is not None and not synthetic:
        rates = [f"MFU {_share(summary['mfu'])}" if "mfu" in summary else "",
                 _hfu(summary) if "hfu" in summary else ""]
        extra = ", ".join(rate for rate in rates if rate)
        table.add_row("TFLOP/s per GPU", f"{summary['tflops_per_gpu']:.1f}" + (f" ({extra})" if extra else ""))
        if summary.get("nominal_tflops_per_gpu", summary["tflops_per_gpu"]) != summary["tflops_per_gpu"]:
            dropped = (summary.get("moe") or {}).get("dropped_token_fraction", 0.0)
            table.add_row("nominal TFLOP/s per GPU", f"{summary['nominal_tflops_per_gpu']:.1f} (MFU "
                          f"{_share(summary['nominal_mfu'])}; top_k for every token, {_share(dropped)} dropped)")
    if summary.get("resources"):
        table.add_row(*resources_row(summary["resources"]))
    if "bubble_fraction" in summary and "trace" in summary:
        table.add_row("compute idle", "n/a (measured over forward and backward passes, which a replayed trace's "
                                      "kernels are not; the timeline shows each rank's waits)")
    elif "bubble_fraction" in summary and not ps:
        pipelined = (summary.get("layout") or {}).get("pp", 1) > 1
        table.add_row("pipeline bubble" if pipelined else "compute idle",
                      _bubble_text(summary) if pipelined else _idle_text(summary["bubble_fraction"]))
    exposed = summary.get("exposed_comm_s") or {}
    if exposed and step:
        shown = [text for kind in COMM_CATEGORIES
                 if (text := _exposed_text(kind, exposed.get(kind, 0.0), (summary.get("comm_s") or {}).get(kind, 0.0),
                                           step))]
        table.add_row("exposed communication", ", ".join(shown) + _exposed_union_text(summary, exposed, step)
                      if shown else "none")
    contention = summary.get("sm_contention") or {}
    if step and contention.get("total_compute_slowdown_s", 0.0) > 0:
        table.add_row(LOSS_LABELS["sm_contention"], _contention_text(contention, step))
    shares = (summary.get("bottleneck") or {}).get("loss_shares") or {}
    if step and shares.get("peer_wait", 0.0) >= SHOWN_LOSS_SHARE:
        table.add_row(LOSS_LABELS["peer_wait"], f"{seconds_alike(shares['peer_wait'] * step)} "
                      f"({_share(shares['peer_wait'])}; mean per rank: its own work done, idle until the slowest rank "
                      "of its stage ends)")
    if step and shares.get("stage_tail_wait", 0.0) >= SHOWN_LOSS_SHARE:
        table.add_row(LOSS_LABELS["stage_tail_wait"], f"{seconds_alike(shares['stage_tail_wait'] * step)} "
                      f"({_share(shares['stage_tail_wait'])}; mean per rank: its stage done, idle until the stage "
                      "whose DP tail and optimizer step end last ends the step)")
    if ps and step and shares.get("worker_wait") is not None:
        table.add_row(LOSS_LABELS["worker_wait"], f"{seconds_alike(shares['worker_wait'] * step)} "
                      f"({_share(shares['worker_wait'])}; in its iterations, for slower workers or server updates)")
    if ps and step and shares.get("finished_early", 0.0) >= SHOWN_LOSS_SHARE:
        table.add_row(LOSS_LABELS["finished_early"], f"{seconds_alike(shares['finished_early'] * step)} "
                      f"({_share(shares['finished_early'])}; waiting for the slowest worker, outside the throughput "
                      "window)")
    if summary.get("moe") and step:
        table.add_row("routing skew", _routing_skew_text(summary["moe"], step))
    if summary.get("cp_imbalance") and step:
        table.add_row("CP imbalance", _cp_imbalance_text(summary["cp_imbalance"], step))
    if "peak_memory_gib" in summary and "memory_capacity_gib" in summary and not synthetic:
        peak, capacity = summary["peak_memory_gib"], summary["memory_capacity_gib"]
        text = f"{format_memory(peak)} of {capacity:.1f} GiB ({_share(peak / capacity)})"
        table.add_row("peak memory", f"[bold red]{text}, OUT OF MEMORY[/]" if summary.get("oom") else text)
    if summary.get("faults"):
        table.add_row("step faults", _step_faults(summary["faults"], summary["step_time_s"]))
    if "bottleneck" in summary:
        table.add_row("bottleneck", _bottleneck(summary["bottleneck"]))
    if summary.get("fold_given_up") or summary.get("fold_not_exact") or summary.get("rank_weights"):
        table.add_row("ranks", folding_text(summary))
    return table


def _exposed_text(kind: str, exposed_s: float, comm_s: float, step_s: float) -> str:
    """One kind's communication on the critical path and what of it overlapped compute: 'dp 43.42 ms (3.0%; 75.78
    ms hidden)', 'cp none (792.7 ms hidden)' for a ring wholly under attention (which the row left out, as if
    the run had no CP traffic), '' for a kind that did not communicate; the hidden part only where it shows at
    four significant digits."""
    hidden = comm_s - exposed_s
    shows_hidden = hidden > 0 and format_seconds(comm_s) != format_seconds(exposed_s)
    if not exposed_s:
        return f"{kind} none ({seconds_alike(comm_s)} hidden)" if comm_s > 0 else ""
    return (f"{kind} {seconds_alike(exposed_s)} ({_share(exposed_s / step_s)}"
            f"{f'; {seconds_alike(hidden)} hidden' if shows_hidden else ''})")


def _exposed_union_text(summary: dict, exposed: dict, step_s: float) -> str:
    """The step's exposed communication with the kinds' overlaps counted once, the figure the verdict reads, where
    it differs from the sum of the kinds' shares: '; 23.4% of the step in all, overlaps counted once' (TP exposed
    beside DP counted in both: tp 20.5% + pp 0.1% + dp 3.7% read as 24.3% against the verdict's 23.4%); '' else."""
    union = ((summary.get("bottleneck") or {}).get("evidence") or {}).get("exposed_comm_share")
    if union is None or sum(1 for seconds in exposed.values() if seconds > 0) < 2:
        return ""
    if _share(union) == _share(sum(exposed.values()) / step_s):
        return ""
    return f"; {_share(union)} of the step in all, overlaps counted once"


def _contention_text(contention: dict, step_s: float) -> str:
    """The compute time per GPU that communication kernels stretched by holding SMs, in all and by the kind of
    the holding communication: '8.907 ms compute lost per GPU (12.2%; pp 8.907 ms)'. Kernel seconds, not a step
    saving: a stretch that a pipeline bubble absorbs counts, and the step may grow by less or by more
    (docs/cost-model.md)."""
    total = contention["total_compute_slowdown_s"]
    kinds = ", ".join(f"{kind} {seconds_alike(seconds)}"
                      for kind, seconds in contention["compute_slowdown_s"].items() if seconds > 0)
    return f"{seconds_alike(total)} compute lost per GPU ({_share(total / step_s)}; {kinds})"


def _routing_skew_text(moe: dict, step_s: float) -> str:
    """What a MoE step's routing skew adds to it, the expert compute every rank waits for on the hottest EP
    rank beyond the mean load: '383.4 ms (21.2%; hottest EP rank 1.54x the mean load)', 'none' where the load is
    even; at ep 1, where one rank holds every expert and waits for no other, the uneven GEMM sizes of its
    experts."""
    added_s = moe["hottest_rank_adds_s"]
    if added_s <= 0:
        return "none"
    if moe.get("ep") == 1:
        return (f"{seconds_alike(added_s)} ({_share(added_s / step_s)}; uneven expert GEMMs, no EP group: "
                f"hottest expert {moe['hottest_expert_load_over_mean']:.2f}x the mean load)")
    return (f"{seconds_alike(added_s)} ({_share(added_s / step_s)}; hottest EP rank "
            f"{moe['hottest_rank_load_over_mean']:.2f}x the mean load)")


def _cp_imbalance_text(imbalance: dict, step_s: float) -> str:
    """What the causal attention of CP ranks split without load balancing adds to the step, the attention every
    rank waits for on the slowest CP rank beyond the mean: '6.908 ms (9.5%; CP rank 3 1.75x the mean attention,
    parallelism.cp_load_balance: true evens it)'."""
    added_s = imbalance["slowest_rank_adds_s"]
    return (f"{seconds_alike(added_s)} ({_share(added_s / step_s)}; CP rank {imbalance['slowest_cp_rank']} "
            f"{imbalance['slowest_rank_load_over_mean']:.2f}x the mean attention, parallelism.cp_load_balance: true "
            "evens it)")


SHOWN_FAULTS = 4
"""The most slowed GPUs and failed links the `step faults` row names one by one; more print as a count."""


def _factor_range(low: float, high: float) -> str:
    """Slowdown factors from ``low`` to ``high`` as the `step faults` row prints them: one where they print alike
    ('1.5', not '1.5 to x1.5')."""
    low_text, high_text = factor_text(low), factor_text(high)
    return low_text if low_text == high_text else f"{low_text} to x{high_text}"


def _repeats(link: dict) -> str:
    """How a link fault repeats, as the `step faults` row says it ('' for one that does not)."""
    if link.get("every_s") is None:
        return ""
    return f", every {format_seconds(link['every_s'])} " + (f"({counted(link['count'], 'time')})" if link.get("count")
                                                            else "to the step's end")


def _step_faults(faults: dict, end_s: float) -> str:
    """What `faults.step` did to the step (summary.json's `faults`), so that a run with a straggler and a failed
    link does not print as a healthy one: the slowdown factors of a few slowed GPUs by index, of many as a count
    and range, each said slower or faster (`pace`); each link's state and times (from, to where it comes back,
    how it repeats; a few, then a count), a time at or after the step's end ``end_s`` said so (the link changed
    nothing), and the routes that took a detour; GPU failures after the step's end (one before it aborts the
    step)."""
    parts = []
    slowed = sorted((int(gpu), entry) for gpu, entry in (faults.get("slowed_gpus") or {}).items())
    if slowed:
        factors = sorted(entry["factor"] for _, entry in slowed)
        text = (", ".join(f"GPU {gpu} compute x{factor_text(entry['factor'])} {pace(entry['factor'], entry['factor'])}"
                          for gpu, entry in slowed)
                if len(slowed) <= SHOWN_FAULTS
                else f"{len(slowed):,} GPUs' compute x{_factor_range(factors[0], factors[-1])} "
                     f"{pace(factors[0], factors[-1])}")
        parts.append(text + (" (with a swing)" if any(entry["swings"] for _, entry in slowed) else ""))
    links = faults.get("links") or []
    shown = [f"{link['link']} {'down' if link['capacity'] == 0 else 'degraded to ' + _share(link['capacity'])} "
             + (f"from {format_seconds(link['at_s'])}" if link["at_s"] else "from the start")
             + (f" to {format_seconds(link['until_s'])}" if link.get("until_s") is not None else "")
             + _repeats(link)
             + (", after the step's end" if link["at_s"] and link["at_s"] >= end_s else "")
             for link in links[:SHOWN_FAULTS]]
    if len(links) > SHOWN_FAULTS:
        shown.append(f"{len(links) - SHOWN_FAULTS:,} more links")
    if shown:
        rerouted = faults.get("rerouted_routes", 0)
        parts.append(", ".join(shown) + (f" ({counted(rerouted, 'route')} rerouted)" if rerouted else ""))
    parts += [f"GPU {failure['gpu']} ({failure['name']}) fails at {format_seconds(failure['at_s'])}, after the "
              "step's end" for failure in faults.get("gpu_failures") or []]
    return "; ".join(parts) or "none"


def _histogram(counts: list[int], unit: str, counted_things: str) -> str:
    """A histogram of 0, 1, 2, ...: its mean and largest value, and when few values occur how many
    ``counted_things`` each has ('144 gradients at 0'; a bare '(0: 144)' left the reader to guess which is which)."""
    total = sum(counts)
    mean = sum(value * count for value, count in enumerate(counts)) / total if total else 0.0
    pairs = [f"{count:,} at {value}" for value, count in enumerate(counts) if count]
    shown = f" ({counted_things}: {', '.join(pairs)})" if len(pairs) <= 6 else ""
    return f"mean {mean:.2f}, max {len(counts) - 1} {unit}{shown}"


def add_parameter_server_rows(table: Table, ps: dict) -> None:
    """A parameter-server run's rows, added to its training table so that the two read as one, aligned: mode and
    placement, iteration times (the mean and range over workers, or the one time where every worker's reads alike),
    throughput, server links and bytes (as the collective table writes sizes), the links' busy shares over the run
    and while the pushes and pulls cross them, and which side's links bind, staleness, lag."""
    mode = ps["mode"] + (f" (staleness {ps['staleness']})" if "staleness" in ps else "")
    table.add_row("parameter servers", f"{mode}, {counted(len(ps['server_hosts']), 'server host')} "
                  f"({counted(len(ps['server_gpus']), 'GPU')}), {counted(ps['workers'], 'worker')}, "
                  f"{counted(ps['iterations'], 'iteration')}")
    times = ps["iteration_s"]
    fastest, slowest = seconds_alike(times["min"]), seconds_alike(times["max"])
    table.add_row("iteration time", f"{seconds_alike(times['mean'])} mean over workers ({fastest} to {slowest})"
                  if fastest != slowest else f"{slowest} on every worker (to four digits)")
    table.add_row("throughput", f"{ps['samples_per_s']:,.1f} samples/s, {ps['tokens_per_s']:,.0f} tokens/s "
                  f"(first {seconds_alike(ps['throughput_window_s'])}, every worker training)")
    servers, workers = ps["server_links"], ps["worker_links"]
    table.add_row("server traffic", f"{format_size(ps['server_traffic_bytes_per_iteration'])} per iteration, "
                  f"server links' mean {_share(servers['mean_utilisation'])} busy over the run, "
                  f"{_share(servers['mean_utilisation_in_transfers'])} while pushes and pulls cross them "
                  f"(worker links' mean {_share(workers['mean_utilisation_in_transfers'])}); "
                  f"{_binding_clause(ps['binding_links'])}")
    ring = ps.get("allreduce")
    if ring:
        table.add_row("vs ring all-reduce", f"exchange {seconds_alike(ps['exchange_s'])} against "
                      f"{seconds_alike(ring['time_s'])} alone; busiest link "
                      f"{format_size(ps['busiest_link_bytes_per_iteration'])} against "
                      f"{format_size(ring['busiest_link_bytes'])} per iteration")
    table.add_row("staleness", _histogram(ps["staleness_histogram"], "updates", "gradients"))
    table.add_row("lag behind slowest", _histogram(ps["lag_histogram"], "iterations", "worker iterations"))


def _binding_clause(side: str) -> str:
    """`parameter_server.binding_links` as a clause: 'server links bind', 'server and worker links bind',
    'neither side's links bind'."""
    return {"both": "server and worker links bind", "neither": "neither side's links bind"}.get(
        side, f"{side} links bind")


def collective_table(summary: dict) -> Table:
    """A communication-only run: per workload item, its size in the largest binary unit it reaches (1 B, 64 KiB,
    1 GiB), its time, bus bandwidth, and the algorithm and protocol that ran it."""
    table = Table(box=None, padding=(0, 2))
    left = ("name", "op", "algorithm", "protocol")
    for name in ("name", "op", "ranks", "size", "time", "algbw GB/s", "busbw GB/s", "algorithm", "protocol"):
        table.add_column(name, justify="left" if name in left else "right")
    for row in summary.get("collectives", []):
        table.add_row(str(row["name"]), str(row["op"]), str(row["ranks"]), format_size(row["bytes"]),
                      format_seconds(row["time_s"]), f"{row['algbw_GBps']:.1f}", f"{row['busbw_GBps']:.1f}",
                      str(row.get("algorithm", "")), str(row.get("protocol", "")))
    return table


WIDEST_GRID = 1000
"""The most characters a line of a grid (`collective_table`) takes off a terminal."""


def _print_table(console: Console, table: Table, *, whole: bool = False) -> None:
    """Print ``table``; off a terminal without the blanks rich pads each line's last cell with, so a log or a
    pipe gets no trailing spaces, and, where ``whole``, at the table's natural width however wide: a grid's
    cells are names and figures, which fitting it to the console's 120 characters cut ('collnet_dire…')."""
    if console.is_terminal:
        console.print(table)
        return
    width = console.width
    if whole:
        console.width = max(width, console.measure(table, options=console.options.update_width(WIDEST_GRID)).maximum)
    try:
        with console.capture() as captured:
            console.print(table)
    finally:
        console.width = width
    console.file.write("".join(f"{line.rstrip()}\n" for line in captured.get().splitlines()))


def print_run_report(summary: dict, console: Console) -> None:
    """The table that ends a run: a training step's figures under its layout line (one line, left for the terminal
    to wrap), or the collective table, under the makespan line and, when `faults.step` acted, the `step faults`
    line (a communication-only run's link faults are no less real)."""
    if "step_time_s" in summary:
        console.print(_layout_line(summary), highlight=False, soft_wrap=True)
        table = training_table(summary)
        if "parameter_server" in summary:
            add_parameter_server_rows(table, summary["parameter_server"])
        _print_table(console, table)
    else:
        console.print(f"{summary.get('topology', '?')} ({cluster_gpus(summary)}), makespan "
                      f"{format_seconds(summary.get('makespan_s', 0.0))}", highlight=False)
        if summary.get("faults"):
            console.print(f"step faults: {_step_faults(summary['faults'], summary.get('makespan_s', 0.0))}",
                          highlight=False)
        _print_table(console, collective_table(summary), whole=True)


TIME_LOST = (("restart_s", "restarts"), ("lost_work_s", "work redone"), ("checkpoint_stall_s", "checkpoint stalls"),
             ("checkpoint_slowdown_s", "checkpoint slowdown"), ("slow_steps_s", "slow steps"),
             ("maintenance_s", "maintenance"))
"""job_summary.json's `time_s` parts other than productive time, in the order the job table lists them."""


RESTART_PARTS = (("detection_s", "detection"), ("reschedule_and_launch_s", "rescheduling and launch"),
                 ("load_s", "load"), ("warmup_s", "warm-up"))
"""job_summary.json's `restart` parts, in the order the job table lists those that take time."""


def _mean_ci(interval: dict, text) -> str:
    """A replications' mean and, when there is one, its 95% interval, each formatted by ``text``."""
    if interval.get("ci95_low") is None:
        return text(interval["mean"])
    return f"{text(interval['mean'])} (95%: {text(interval['ci95_low'])} to {text(interval['ci95_high'])})"


def long_duration(seconds: float) -> str:
    """A duration of a job's scale: hours, minutes or seconds, whichever reads best, chosen by the value as
    rounded (a restart of 3,597 s printed '60.0 min', 59.9996 s '60 s': they are '1.0 h' and '1.0 min')."""
    if float(f"{seconds / 60:.1f}") >= 60:
        return f"{seconds / 3600:,.1f} h"
    if rounds_to(seconds, 60):
        return f"{seconds / 60:.1f} min"
    return format_seconds(seconds)


def count_text(replications: int) -> Callable[[float], str]:
    """How a job's counts read: one replication's as the whole numbers they are ('0 unexpected'), several
    replications' as their means with one decimal (the row then says 'means:', `means_prefix`)."""
    if replications == 1:
        return lambda value: f"{round(value):,}"
    return lambda value: f"{value:,.1f}"


def means_prefix(replications: int) -> str:
    """'means: ' before a row of counts averaged over several replications, '' for one replication's counts."""
    return "" if replications == 1 else "means: "


def _regrowing(replicas: dict, count: Callable[[float], str]) -> str:
    """The restarts an elastic job took only to regrow, those a failure cut short, and their time ('' for none),
    the counts as ``count`` writes them."""
    restarts, cut = replicas["regrow_restarts"]["mean"], replicas["regrow_restarts_cut_short"]["mean"]
    if not restarts and not cut:
        return ""
    short = f", {count(cut)} more cut short by a failure" if cut else ""
    return f", {count(restarts)} restarts to regrow ({long_duration(replicas['regrow_restart_s']['mean'])}{short})"


def skipped_sizes_text(out_of_memory_gib: dict[str, float], capacity_gib: float | None) -> str:
    """The smaller sizes an elastic job skips because its step does not fit in GPU memory there, with the peak
    memory per GPU on the largest of them against the GPU's ('' for none)."""
    if not out_of_memory_gib or capacity_gib is None:
        return ""
    largest = max(out_of_memory_gib, key=int)
    skipped = number_ranges(sorted(map(int, out_of_memory_gib)))
    return (f"{skipped} skipped, out of memory: {out_of_memory_gib[largest]:,.1f} GiB per GPU on {largest}, the GPU "
            f"holds {capacity_gib:.1f} GiB")


def _weibull(entries: Iterable[dict]) -> bool:
    """Whether any of these `failure_model` classes fails by a Weibull of shape other than 1."""
    return any(entry.get("shape", 1.0) != 1.0 for entry in entries)


def _weibull_expectation(job: dict) -> str:
    """Where a class that interrupts (`interrupting_units` above 0) fails by a Weibull of shape other than 1, the
    interruptions the exponential closed form expects (job_summary.json's `expected_unexpected_interruptions`,
    units x rate x horizon), named as that: the simulated count departs from it (shape 0.5 on 8 GPUs at MTBF
    80 h with a spare host over 30 d, 200 replications: 61.2 simulated, 95% 59.3 to 63.1, 72.0 by the closed
    form); '' otherwise, as where only classes that slow the job are Weibull (`slowdowns_text` names theirs)."""
    interrupting = (entry for entry in job.get("failure_model", {}).values()
                    if entry.get("interrupting_units", 0) > 0)
    if not _weibull(interrupting) or job.get("expected_unexpected_interruptions") is None:
        return ""
    return (f"; the exponential closed form expects {expected_count(job['expected_unexpected_interruptions'])} (a "
            "Weibull shape other than 1 departs from it)")


def _simulated_slowdowns(entry: dict) -> str:
    """A class's mean simulated count of degradations or stragglers per replication (`simulated_slowdowns`), to
    read beside the count it expects: ' (simulated 6.34)'; '' where the summary has none."""
    simulated = (entry.get("simulated_slowdowns") or {}).get("mean")
    return "" if simulated is None else f" (simulated {expected_count(simulated)})"


def slowdowns_text(job: dict) -> str:
    """The degradations and stragglers the job's classes expect over the horizon (`failure_model`'s
    `expected_in_horizon` less its `expected_interruptions`, per class) beside the mean count the replications
    met (`simulated_slowdowns`), and how much slower the slowed steps are
    than the healthy one (`states` at full size), where a class only slows the job. Where such a class is
    Weibull of shape other than 1 the count is named the exponential closed form's, which the simulation departs
    from. '' without such classes."""
    slowing = {(entry.get("label") or name): entry for name, entry in job.get("failure_model", {}).items()
               if entry["effect"] in ("degrade", "straggle")
               and entry["expected_in_horizon"] > entry["expected_interruptions"]}
    if not slowing:
        return ""
    classes = ", ".join(f"{label} {expected_count(entry['expected_in_horizon'] - entry['expected_interruptions'])}"
                        + _simulated_slowdowns(entry) for label, entry in slowing.items())
    if _weibull(slowing.values()):
        classes += " (the exponential closed form: a Weibull shape other than 1 departs from it)"
    healthy, full = job["step_time_s"], max((state["replicas"] for state in job.get("states", [])), default=0)
    slowed = sorted(state["step_time_s"] for state in job.get("states", [])
                    if state["replicas"] == full and state["step_time_s"] > healthy)
    if not slowed:
        return f"expected over the horizon: {classes}"
    steps = format_seconds(slowed[0]) + (f" to {format_seconds(slowed[-1])}" if len(slowed) > 1 else "")
    over = f"+{slowed[0] / healthy - 1:.1%}" + (f" to +{slowed[-1] / healthy - 1:.1%}" if len(slowed) > 1 else "")
    return (f"expected over the horizon: {classes}; slowed step {steps} ({over} over the healthy "
            f"{format_seconds(healthy)})")


def job_resources_text(resources: dict) -> str:
    """A job's GPU-hours held, those that kept no progress, per million tokens trained, and its cost: '101,376 GPU-h
    (2,112 GPUs held, 64 of them spares), 4,791 lost (4.7%); 0.4623 GPU-h per 1M tokens trained; 202,752 USD
    (0.9246 USD per 1M tokens)'."""
    hours, spares = resources["gpu_hours"], resources["spare_gpus"]
    held = counted(resources["gpus_held"], "GPU") + (f" held, {spares:,} of them spares" if spares else " held")
    text = (f"{four_digits(hours)} GPU-h ({held}), "
            f"{four_digits(resources['gpu_hours_lost'])} lost ({_share(resources['gpu_hours_lost'] / hours)})")
    if resources["gpu_hours_per_million_tokens"] is not None:
        text += f"; {four_digits(resources['gpu_hours_per_million_tokens'])} GPU-h per 1M tokens trained"
    if "cost" in resources:
        per_million = resources["cost_per_million_tokens"]
        currency = resources["currency"]
        text += (f"; {four_digits(resources['cost'])} {currency}"
                 + ("" if per_million is None else f" ({four_digits(per_million)} {currency} per 1M tokens)"))
    return text


def job_table(job: dict) -> Table:
    """A job over weeks: ETTR, goodput against the healthy step's throughput, interruptions (the three most
    frequent causes), the time lost by kind with its share of the horizon (the restarts' with the part of it
    spent waiting for hosts), the work redone per failure and the restart's parts (and the mean wait for hosts
    per failure), an elastic job's shrinks, regrows (the restarts taken only to regrow, and their time), sizes
    (those skipped for memory), policies and running time on each replica count, and the checkpoint interval
    against Young's and Daly's."""
    table = _label_table()
    horizon, ideal = job["horizon_s"], job["ideal_tokens_per_s"]
    if ideal is None:  # no tokens (synthetic stage costs): goodput in healthy steps
        rate, goodput, ideal = "tokens/s n/a", job["goodput_steps_per_s"], job["ideal_steps_per_s"]

        def text(value: float) -> str:
            return f"{value:.4g} healthy-equivalent steps/s"
    else:
        rate, goodput = f"{ideal:,.0f} tokens/s", job["goodput_tokens_per_s"]

        def text(value: float) -> str:
            return f"{value:,.0f} tokens/s"
    invalid = f"; {OOM_FIGURES}" if job.get("oom") else ""
    table.add_row("healthy step", f"{step_seconds(job['step_time_s'])}, {rate}")
    table.add_row("ETTR", _mean_ci(job["ettr"], _share) + invalid)
    table.add_row("goodput", _mean_ci(goodput, text) + f", {_share(goodput['mean'] / ideal)} of healthy" + invalid)
    interruptions, labels = job["interruptions"], job.get("failure_model", {})
    count, means = count_text(job["replications"]), means_prefix(job["replications"])
    causes = sorted(((name, value) for name, value in interruptions["by_cause"].items() if value["mean"] > 0),
                    key=lambda item: (-item[1]["mean"], item[0]))[:3]
    most = ", ".join(f"{labels.get(name, {}).get('label', name)} {count(value['mean'])}" for name, value in causes)
    mtbf = f" (MTBF {long_duration(job['mtbf_s'])})" if job.get("mtbf_s") else ""
    table.add_row("interruptions", means + _mean_ci(interruptions["unexpected"], count)
                  + f" unexpected{mtbf}, {count(interruptions['planned']['mean'])} planned"
                  + (f"; most: {most}" if most else "") + _weibull_expectation(job))
    slowdowns = slowdowns_text(job)
    if slowdowns:
        table.add_row("slowdowns", slowdowns)
    times = job["time_s"]
    waiting = (job.get("restart_waiting_for_hosts_s") or {}).get("mean") or 0.0
    of_which = {"restart_s": f"; {long_duration(waiting)} of it waiting for hosts"} if waiting else {}
    lost = [f"{label} {long_duration(times[part]['mean'])} ({_share(times[part]['mean'] / horizon)}"
            f"{of_which.get(part, '')})" for part, label in TIME_LOST if times.get(part, {}).get("mean")]
    table.add_row("time lost", ", ".join(lost) or "none")
    if job.get("resources"):
        table.add_row("GPU time", job_resources_text(job["resources"]))
    per_failure = job["lost_work_per_failure_s"]
    if per_failure["mean"] is not None:
        restart = job["restart"]
        parts = ", ".join(f"{label} {long_duration(restart[part])}" for part, label in RESTART_PARTS if restart[part])
        unexpected = job["interruptions"]["unexpected"]["mean"]
        wait = (f", and {long_duration(waiting / unexpected)} waiting for hosts on average" if waiting and unexpected
                else "")
        at_hand = "spares" if job.get("spare_hosts") else "its hosts"
        parts = "; ".join(part for part in ("" if job.get("spare_hosts") else "no spares", parts) if part)
        redone = durations_alike(per_failure[key] for key in ("mean", "ci95_low", "ci95_high")
                                 if per_failure[key] is not None)
        table.add_row("per failure", _mean_ci(per_failure, redone) + " of work redone, then a restart of "
                      f"{long_duration(restart['total_s'])} with {at_hand} at hand" + (f" ({parts})" if parts else "")
                      + wait)
    replicas = job.get("replicas")
    if job.get("elastic") and replicas:
        running = ", ".join(f"{counted(int(size), 'replica')} {long_duration(value['mean'])} "
                            f"({_share(value['mean'] / horizon)})"
                            for size, value in replicas["running_s"].items() if value["mean"])
        skipped = skipped_sizes_text(replicas["out_of_memory_gib"], replicas["memory_capacity_gib"])
        table.add_row("elastic", f"{means}{count(replicas['shrinks']['mean'])} shrinks, "
                      f"{count(replicas['regrows']['mean'])} regrows{_regrowing(replicas, count)} "
                      f"(sizes {number_ranges(replicas['sizes'])}"
                      f"{'; ' + skipped if skipped else ''}; {replicas['elastic_batch']}, "
                      f"regrow {replicas['regrow']}); running on " + (running or "none"))
    checkpoint = job["checkpoint"]
    interval: Callable[[float], str] = format_duration
    optimum = ""
    if job.get("young_interval_s") is not None:
        interval = durations_alike([checkpoint["interval_s"], *young_daly_durations(job)])
        optimum = f"; {young_daly_text(job, interval)}"
        if min(job["young_interval_s"], job["daly_interval_s"]) > horizon:
            optimum += f", both longer than the {horizon_span(horizon)} horizon: no checkpoint pays within it"
    table.add_row("checkpoints", f"{checkpoint['mode']} every {counted(checkpoint['interval_steps'], 'step')} "
                  f"({interval(checkpoint['interval_s'])}{_none_written(job)}), "
                  f"{format_seconds(checkpoint['cost_s'])} of training each" + optimum)
    memory = job.get("memory_checkpoint")
    if memory is not None:
        restores, because = memory["restores"], memory["storage_because"]
        table.add_row("in memory", f"every {counted(memory['interval_steps'], 'step')} "
                      f"({format_seconds(memory['interval_s'])}) to {counted(memory['replicas'], 'peer host')}, "
                      f"{format_seconds(memory['stall_s'])} of training each, load {format_seconds(memory['load_s'])}"
                      f"; {means}{count(restores['memory']['mean'])} restores from memory, "
                      f"{count(restores['storage']['mean'])} from storage ({count(because['newer']['mean'])} "
                      f"where it was the newer, {count(because['copies_lost']['mean'])} where no in-memory copy "
                      "survived; Young and Daly: the storage tier alone)"
                      + (f"; {two_level_text(memory['two_level'], copies_lost=because['copies_lost']['mean'])}"
                         if memory.get("two_level") else ""))
    return table


def _none_written(job: dict) -> str:
    """Where the checkpoint interval and its write outlast the horizon, that the job writes no checkpoint in it but
    those of its planned stops that completed (`checkpoints_written`, a replication's mean): 'every 849,049 steps
    (100 d)' read as a job that checkpoints, beside the warning that it writes none
    (`simulate.interval_past_horizon`); a stop whose write the horizon or a failure cuts writes none either."""
    checkpoint, horizon = job["checkpoint"], job["horizon_s"]
    if checkpoint["interval_s"] + checkpoint["write_s"] < horizon:
        return ""
    written = job["checkpoints_written"]["mean"]
    stops = f" but {expected_count(written, 'at a planned stop', 'at planned stops')}" if written else ""
    return f"; none written in the {horizon_span(horizon)} horizon{stops}"


def two_level_text(optimum: dict, interval: Callable[[float], str] = seconds_alike,
                   copies_lost: float = 0.0, lost_where: str = "") -> str:
    """The first-order two-level optimum of a job_summary.json's `memory_checkpoint.two_level` (two_level.py): the
    two intervals and each tier's MTBF, or storage alone where the tier buys nothing and the one MTBF every failure
    then rolls back to storage with (not one "recovered from memory"); the intervals read as ``interval`` writes
    them. Its MTBFs are those of the job at full size, so where no failure there needs storage it says so, and,
    where the job's restores found no in-memory copy all the same (``copies_lost`` a replication, its
    `storage_because.copies_lost`: a host and its peers out at once during a restart, or the job shrunk onto
    fewer hosts than its copies need), that those need it: "as rarely as you like" would roll each of them back
    far; ``lost_where`` says whose restores they are where the line is not one job's (a study's ' at the best
    interval'). Restores from storage because it was the newer copy need nothing of it, and are not counted here."""
    memory, storage = optimum["memory_interval_s"], optimum["storage_interval_s"]
    if memory is None:
        rate = sum(1.0 / mtbf for mtbf in (optimum["memory_mtbf_s"], optimum["storage_mtbf_s"]) if mtbf is not None)
        mtbf = f"; MTBF {long_duration(1.0 / rate)}, every failure from storage" if rate > 0 else ""
        return f"two-level optimum storage alone every {interval(storage)} (the tier buys nothing to first order{mtbf})"
    if storage is None and copies_lost > 0:
        text = (f"memory every {interval(memory)}, storage as rarely as you like only at full size: "
                f"{expected_count(copies_lost)} restores a replication{lost_where} found no in-memory copy (a host and "
                "its peers out at once, during a restart or with the job shrunk), each back to the last storage "
                "checkpoint")
    elif storage is None:
        text = (f"memory every {interval(memory)}, storage as rarely as you like at full size "
                "(no failure there needs it)")
    else:
        text = f"memory every {interval(memory)}, storage every {interval(storage)}"
    mtbfs = ", ".join(f"{long_duration(mtbf)} {label}" for mtbf, label in (
        (optimum["memory_mtbf_s"], "recovered from memory"), (optimum["storage_mtbf_s"], "needing storage"))
        if mtbf is not None)
    return f"two-level optimum {text} (MTBF {mtbfs})"


def young_daly_text(figures: dict, interval: Callable[[float], str] = seconds_alike) -> str:
    """Young's and Daly's intervals of a job_summary.json or study curve as their formulas give them
    (`summary.formula_intervals`), each said to be floored where it falls below the async write floor
    (`summary.write_floor_steps`, one step at least: x 2 the 405B job's rates, 'Young 8.991 s, Daly 8.986 s (both
    floored to 1 step, 10.18 s)', where 10.18 s alone read as sqrt(2 C M)), and, where the write takes more than
    a step, the cost C they take (`summary.young_daly_cost_s`): the scenario's cost per checkpoint beside them is
    that of its own interval, which may wait for the write (22.30 s against C 8.3 ms on the 405B job
    checkpointing every step). The intervals read as ``interval`` writes them (a study line: in the unit of the
    interval it tried)."""
    young, daly = formula_figures(figures)
    text = f"Young {interval(young)}, Daly {interval(daly)}"
    steps = figures.get("write_floor_steps") or 0
    floored = floored_names(figures)
    which = "both" if len(floored) == 2 else "".join(floored)
    if steps > 1:
        floor = f"{counted(steps, 'step')}, {interval(figures['write_floor_s'])}"
        held = f"{which} floored to the write's {floor}" if floored else f"{floor}, or more"
        text += (f" (for C {seconds_alike(figures['young_daly_cost_s'])} a checkpoint once the interval holds the "
                 f"write: {held})")
    elif floored:
        text += f" ({which} floored to 1 step, {interval(figures['write_floor_s'])})"
    return text


def formula_figures(figures: dict) -> tuple[float, float]:
    """Young's and Daly's intervals of a job_summary.json or study curve before the write floor
    (`young_formula_s`, `daly_formula_s`)."""
    return figures["young_formula_s"], figures["daly_formula_s"]


def floored_names(figures: dict) -> list[str]:
    """Which of Young's and Daly's intervals of a job_summary.json or study curve the write floor raised."""
    young, daly = formula_figures(figures)
    return [name for name, value, used in (("Young's", young, figures["young_interval_s"]),
                                           ("Daly's", daly, figures["daly_interval_s"])) if value < used]


def young_daly_durations(figures: dict) -> list[float]:
    """The durations `young_daly_text` prints: Young's and Daly's intervals and the floor where it names it."""
    named = (figures.get("write_floor_steps") or 0) > 1 or floored_names(figures)
    return [*formula_figures(figures), *([figures["write_floor_s"]] if named else [])]


def horizon_span(horizon_s: float) -> str:
    """A job's horizon: in days from a day up, else as `long_duration` (a 2 h horizon is not 0.08333 days)."""
    days = f"{horizon_s / 86400:,.4g}"
    return f"{days} {'day' if days == '1' else 'days'}" if horizon_s >= 86400 else long_duration(horizon_s)


def print_job_report(job: dict, step: dict, console: Console) -> None:
    """The table that ends a job run: the healthy step's layout line (``step``, its summary; one line, as a run's,
    left for the terminal to wrap), then the job's."""
    console.print(f"{_layout_line(step)}, {horizon_span(job['horizon_s'])}, "
                  f"{counted(job['replications'], 'replication')}", highlight=False, soft_wrap=True)
    _print_table(console, job_table(job))
