"""summary.json of a training step: step time, throughput, MFU/HFU, bubbles, communication, memory, the
bottleneck among seed 000's constraints (compute, memory bandwidth, memory capacity, communication, and the
pipeline bubble or, without a pipeline, compute idle, and a replayed trace's host time: `Constraint`) and the
largest loss of the step (pipeline bubble, exposed communication of one kind, optimizer step, compute time lost
to SM contention with communication kernels, a MoE step's routing skew, the causal attention work of CP ranks
split without load balancing, a replayed trace's host time, a parameter-server worker's wait for other workers and
the servers, a rank's wait for slower ranks of its stage or for other stages to end the step)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from simulator.metrics.link_tiers import TIER_DETAIL
from simulator.metrics.step import (
    StepRows,
    communication_metrics,
    executed_flops,
    idle_after_last_op_s,
    optimizer_s,
    pipeline_bubble,
    replica_windows_s,
    schedule_bubble,
    traffic_bytes,
)
from simulator.parallel.folding import ranks_stood_for
from simulator.program.ops import COMM_CATEGORIES

if TYPE_CHECKING:
    from simulator.schedules.base import Schedule

SimulatedSpan = Literal["step", "run"]
"""What a training summary's simulated time spans: one training step, or a parameter-server run of several
iterations (the console's 'run time (6 iterations)')."""
WAIT_BOUND_SHARE = 0.30
"""Waits above this share of the step, the compute stream's idle time (exposed communication, pipeline bubble, idle),
make the larger of its two parts the binding constraint rather than compute (the seed chapter's rule of thumb for
communication: under ~10% scales well, over ~30% stop adding GPUs; a step idle that long in its bubble gains as
much from more micro-batches or an interleaved schedule as from faster GPUs)."""
MEMORY_BANDWIDTH_BOUND_SHARE = 0.5
"""Above this share of a micro-batch's compute time in blocks whose HBM time exceeds their math time, memory
bandwidth binds rather than compute: most of the compute then waits on HBM, not on the tensor cores."""

OOM_FIGURES = "invalid: the step does not fit in GPU memory"
"""What follows a job's ETTR and goodput where its healthy step is out of memory (`oom` in job_summary.json): the
job runs and warns, as `trainsim run` does with such a step, and its figures say they are no real job's."""


Constraint = Literal["compute", "memory_bandwidth", "memory_capacity", "communication", "bubble", "idle", "host"]
"""What binds a step (`bottleneck`): `bubble` is a pipeline's idle time, `idle` the same without a pipeline,
`host` a replayed trace's host time (host gaps, a CPU-only profile's ops)."""
VERDICT_NAMES: dict[Constraint, str] = {name: f"{name.replace('_', ' ')}-bound" for name in get_args(Constraint)}
"""How the verdict names each constraint: 'memory bandwidth-bound', 'idle-bound'..."""


LOSS_LABELS = {"pipeline_bubble": "pipeline bubble", "optimizer": "optimizer step", "moe_imbalance": "MoE routing skew",
               "cp_imbalance": "CP causal imbalance",
               "sm_contention": "SM contention", "host": "host time", "worker_wait": "worker wait",
               "finished_early": "idle after last iteration", "peer_wait": "wait for slower ranks",
               "stage_tail_wait": "wait for other stages",
               **{f"exposed_{kind}_comm": f"exposed {kind.upper()} communication" for kind in COMM_CATEGORIES}}
"""The losses a step is charged with, by key, and how the bottleneck's `verdict` and the console's rows name
them (the verdict never names those of NOT_A_LARGEST_LOSS)."""
IDLE_WITHOUT_PIPELINE = "compute idle"
"""How the verdict names the `pipeline_bubble` loss of a step of one pipeline stage, as the console's row does:
its compute stream waits for ZeRO-3 gathers, CP ranks of more attention work or stragglers, not for a pipeline."""


def loss_shares(step_time_s: float, comm: dict, bubble_s: float | None, optimizer_time_s: float,
                routing_skew_s: float | None = None, host_s: float | None = None,
                worker_wait_s: float | None = None, finished_early_s: float | None = None,
                sm_contention_s: float | None = None, cp_imbalance_s: float | None = None,
                peer_wait_s: float | None = None, stage_tail_wait_s: float | None = None) -> dict[str, float]:
    """Each loss as a share of the step: idle time of the pipeline window (one stage's too, where it waits on
    a collective; ``bubble_s`` None for a step that is not a pipeline program, `StepProgram.pipelined`: a
    parameter-server run), exposed communication per kind (mean over ranks of communication time no compute
    overlaps), the optimizer step and, for a MoE step, the expert compute its routing skew adds to every rank
    (``routing_skew_s``, `moe.hottest_rank_adds_s`; none without experts, None), for a step whose CP ranks do
    different causal attention work, the attention its slowest CP rank adds beyond the mean, which every rank
    waits for (``cp_imbalance_s``, `cp_imbalance.slowest_rank_adds_s`: the wait shows in the bubble's idle time
    and in exposed CP communication, which it overlaps as the routing skew does; none where the work is even,
    None; at pp > 1 both skews lengthen the step by more, (m + p - 1)/m times them with uniform stages), for a
    replayed trace, its host time on the compute stream (``host_s``, `host`; none for a modelled step, None)
    and, for a step that idles for another reason than a pipeline (a parameter-server run), the idle time with
    neither compute nor communication, split in two: inside its iterations (``worker_wait_s``, `worker_wait`: a
    worker's push
    done, the slowest worker's push or the servers' update not) and after its last one, until the slowest
    worker finishes (``finished_early_s``, `finished_early`: async and ssp); None with a pipeline; and, with the
    SM-contention model on, the compute time per GPU that communication kernels holding SMs stretched
    (``sm_contention_s``, `sm_contention`: `total_compute_slowdown_s`; none with `sm_contention: none`, None);
    and, for a built pipeline program (not a replayed trace) whose ranks idle after the pipeline window with no
    communication of their own, until the last rank of their stage ends (``peer_wait_s``, `peer_wait`: a wait for
    slower ranks of the stage) and after that until the step ends (``stage_tail_wait_s``, `stage_tail_wait`: with
    pp > 1, a wait for stages whose DP tail and optimizer step end later), the communication figures' keys of
    those names, none where 0 or None: so the wait is the exposed communication, the bubble's idle time without
    communication and these two."""
    if step_time_s <= 0:
        return {}
    seconds = {**({} if bubble_s is None else {"pipeline_bubble": bubble_s}), "optimizer": optimizer_time_s,
               **({} if routing_skew_s is None else {"moe_imbalance": routing_skew_s}),
               **({} if cp_imbalance_s is None else {"cp_imbalance": cp_imbalance_s}),
               **({} if sm_contention_s is None else {"sm_contention": sm_contention_s}),
               **({} if host_s is None else {"host": host_s}),
               **({} if worker_wait_s is None else {"worker_wait": worker_wait_s}),
               **({} if finished_early_s is None else {"finished_early": finished_early_s}),
               **({"peer_wait": peer_wait_s} if peer_wait_s else {}),
               **({"stage_tail_wait": stage_tail_wait_s} if stage_tail_wait_s else {}),
               **{f"exposed_{kind}_comm": comm["exposed_comm_s"][kind] for kind in COMM_CATEGORIES}}
    return {name: value / step_time_s for name, value in seconds.items()}


NOT_A_LARGEST_LOSS = frozenset({"finished_early"})
"""Losses the verdict never names as the largest: a parameter-server worker's idle time after its last
iteration is the end of an async run, not of its iterations, and the throughput the run reports
(`throughput_window_s`) leaves it out; a fast worker given more iterations would train through it."""

SHOWN_LOSS_SHARE = 0.0005
"""The least share of the step the verdict names a largest loss at: it gives shares to 0.1%, and a smaller
one (a 17.9-day step's optimizer, 0.002%) read 'largest single loss: optimizer step, 0.0% of the step'."""


def bottleneck(step_time_s: float, comm: dict, memory: dict, memory_bound_share: float, bubble: float,
               losses: dict[str, float] | None = None, *, pipeline_stages: int, span: SimulatedSpan = "step",
               schedule_bubble: float | None = None) -> dict:
    """Which constraint binds, with the evidence that decided it, and the step's largest loss with its share
    of the step, so that a compute-bound step that idles 27% in its pipeline bubble says so (with one
    ``pipeline_stages``, that it idles: IDLE_WITHOUT_PIPELINE). Exposed communication (``comm``'s
    `exposed_union_s`, every kind counted once) over WAIT_BOUND_SHARE of the step binds; so does a step whose
    compute stream idles more than WAIT_BOUND_SHARE of it (``comm``'s `wait_s`), bound by the larger of its
    parts: exposed communication, else the time with neither compute nor communication, `bubble` (`idle` with
    one stage), or `host` where a replayed trace's host ops fill at least half of that time and no less than
    the exposed communication (``comm``'s `host_s`: a CPU-only profile, or a step of launch gaps): host time is
    then the largest of the three parts, so faster host code is the remedy, not a faster network. The pipeline
    bubble's loss is no part of it: at pp = 1 it is mostly the compute stream waiting for ZeRO-3 gathers, exposed
    communication already. A parameter-server run's wait after a worker's last iteration (the `finished_early`
    loss, `evidence.finished_early_share`) is outside the throughput it reports, so the rules read shares of the
    workers' iterations, the run less that tail (`rule_shares`). The verdict names the time simulated by
    ``span``, as the console's first row does ('65.1% of the run' beside a parameter server's run time). A
    pipeline bubble named as the largest loss gives its share of the pipeline window beside the schedule's own
    (``schedule_bubble``, `schedule_bubble_fraction`) where the two differ at 0.1% (`_schedule_note`). With more
    than one stage the bubble ranks among the losses less its part spent waiting on exposed communication
    (`evidence.bubble_on_exposed_comm_share`, `bubble_on_exposed_comm`), which the exposed communication counts
    already, and the verdict naming it says that part (`exposed_part_note`)."""
    evidence = {
        "exposed_comm_share": comm["exposed_union_s"] / step_time_s if step_time_s else 0.0,
        "memory_bound_compute_share": memory_bound_share,
        "memory_use_share": memory["peak_memory_gib"] / memory["memory_capacity_gib"] if memory else 0.0,
        "bubble_fraction": bubble,
        "bubble_share": (losses or {}).get("pipeline_bubble", 0.0),
        **({"bubble_on_exposed_comm_share": bubble_on_exposed_comm(step_time_s, comm, losses, bubble,
                                                                   schedule_bubble)}
           if losses and "pipeline_bubble" in losses and pipeline_stages > 1 else {}),
        "wait_share": comm["wait_s"] / step_time_s if step_time_s else 0.0,
        "host_share": comm["host_s"] / step_time_s if step_time_s else 0.0,
        **({"finished_early_share": losses["finished_early"]} if losses and "finished_early" in losses else {}),
    }
    rule = rule_shares(evidence, span)
    binding: Constraint
    if memory.get("oom"):
        binding = "memory_capacity"
    elif rule.exposed > WAIT_BOUND_SHARE:
        binding = "communication"
    elif rule.wait > WAIT_BOUND_SHARE:
        idle_share = rule.wait - rule.exposed
        binding = ("communication" if rule.exposed >= idle_share else
                   "host" if 2 * rule.host >= idle_share and rule.host >= rule.exposed else
                   "bubble" if pipeline_stages > 1 else "idle")
    elif memory_bound_share > MEMORY_BANDWIDTH_BOUND_SHARE:
        binding = "memory_bandwidth"
    else:
        binding = "compute"
    result: dict = {"constraint": binding, "evidence": evidence}
    if losses:
        named = {key: share - (evidence.get("bubble_on_exposed_comm_share", 0.0) if key == "pipeline_bubble" else 0.0)
                 for key, share in losses.items() if key not in NOT_A_LARGEST_LOSS}
        name = max(named, key=lambda key: (named[key], key))
        result["largest_loss"] = {"name": name, "share_of_step": losses[name]}
        result["loss_shares"] = losses
        result["verdict_exposed_share"] = rule.exposed
        label = IDLE_WITHOUT_PIPELINE if name == "pipeline_bubble" and pipeline_stages == 1 else LOSS_LABELS[name]
        bound = VERDICT_NAMES[binding] + _bound_reason(binding, rule, losses, pipeline_stages)
        if losses[name] >= SHOWN_LOSS_SHARE:
            note = (_schedule_note(bubble, schedule_bubble) + exposed_part_note(evidence)
                    if name == "pipeline_bubble" and pipeline_stages > 1 else "")
            result["verdict"] = (f"{bound}; largest single loss: {label}, {100 * losses[name]:.1f}% of the {span}"
                                 + note)
        elif losses[name] > 0:  # a 'largest single loss' of '0.0%' read as a loss; it is none worth naming
            result["verdict"] = f"{bound}; no loss as large as 0.1% of the {span}"
        else:
            result["verdict"] = f"{bound}; no measurable loss"
    return result


def bubble_on_exposed_comm(step_time_s: float, comm: dict, losses: Mapping[str, float], bubble: float = 0.0,
                           schedule_bubble: float | None = None) -> float:
    """The share of the step the pipeline bubble (``losses``' `pipeline_bubble`) spends waiting on exposed
    communication: the bubble less the larger of two parts no transfer causes, clamped to 0 and to the bubble.
    One is the compute stream's idle time with no communication in flight before its window ends: ``comm``'s
    `wait_s` less its exposed communication, host time and the waits after the window (`peer_wait_s`,
    `stage_tail_wait_s`). The other is the schedule's own bubble (``schedule_bubble``, a share of the pipeline
    window as ``bubble`` is, scaled to the step as the loss is): a transfer in flight while the schedule leaves a
    stage idle anyway is exposed, but no stage waits on it. The bubble's idle time counts a transfer the compute
    stream waits on, which the exposed communication counts already: a Llama 3 405B step on 8,192 B200s idles
    58.8% of the step in its bubble, 6.2% the schedule's, 3.4% with no transfer in flight, so 52.6% waits on
    exposed transfers (DP 55.8% of the step)."""
    share = losses["pipeline_bubble"]
    if step_time_s <= 0:
        return 0.0
    idle_s = (comm["wait_s"] - comm["exposed_union_s"] - comm.get("host_s", 0.0) - comm.get("peer_wait_s", 0.0)
              - comm.get("stage_tail_wait_s", 0.0))
    scheduled = schedule_bubble * share / bubble if schedule_bubble is not None and bubble > 0 else 0.0
    return min(max(share - max(idle_s / step_time_s, scheduled), 0.0), share)


def exposed_part_note(evidence: Mapping[str, float]) -> str:
    """How much of a pipeline bubble named as the largest loss waits on exposed communication, where that is at
    least SHOWN_LOSS_SHARE of the step: ', of which 2.1% waiting on exposed communication'."""
    share = evidence.get("bubble_on_exposed_comm_share", 0.0)
    return f", of which {_percent(share)} waiting on exposed communication" if share >= SHOWN_LOSS_SHARE else ""


def _schedule_note(bubble: float, schedule_bubble: float | None) -> str:
    """The verdict's note on a pipeline bubble named as the largest loss: the bubble's share of the pipeline
    window beside the schedule's own, ' (20.2% of the pipeline window, the schedule alone 6.2%)' for Llama 3 405B
    on 8,192 GPUs, so that a bubble mostly of waits (hand-offs, exposed communication, stragglers) does not read as
    the schedule's; '' where the two read alike at 0.1% (the waits add nothing shown) or the schedule's is not
    known."""
    if schedule_bubble is None or _percent(bubble) == _percent(schedule_bubble):
        return ""
    return f" ({_percent(bubble)} of the pipeline window, the schedule alone {_percent(schedule_bubble)})"


SHOWN_STRAGGLERS = 2
"""The most slowed GPUs the verdict's straggler note names one by one; more read as a count and a range."""


def pace(low: float, high: float) -> str:
    """How compute at slowdown factors from ``low`` to ``high`` compares with nominal, as the outputs say it:
    'slower' from 1 up, '(faster)' below 1 (a drawn factor under the median), '(some faster)' across 1."""
    return "slower" if low >= 1 else "(faster)" if high <= 1 else "(some faster)"


def factor_text(factor: float) -> str:
    """A slowdown factor to 3 significant digits, or as many more (up to 9) as tell it from 1: '1.3', '1.001'
    (not '1', which reads as nominal speed)."""
    for digits in range(3, 10):
        text = f"{factor:.{digits}g}"
        if factor == 1 or text != "1":
            return text
    return text


def with_stragglers(bottleneck: dict, slowed_gpus: Mapping[str, Mapping],
                    waited_for: Collection[int] | None = None) -> dict:
    """The step's bottleneck with its wait for slower ranks and the GPUs slowed beyond nominal named in its
    verdict, where that wait is at least SHOWN_LOSS_SHARE of the step ('...; wait for slower ranks 9.2% of the
    step, for GPU 8's compute x1.3'; where that wait is the largest loss, the GPUs follow it: '...; largest single
    loss: wait for slower ranks, 43.8% of the step, for GPU 1's compute x2'), so that a straggler's cost beside a
    larger bubble or exposed communication does not read as the schedule's or the network's. ``slowed_gpus`` is
    summary.json's `faults.slowed_gpus` (GPU index -> `factor`); the slowest come first. ``waited_for`` (None:
    every GPU) are the GPUs of the replicas whose pipeline window ends last (`last_replicas_ranks`): a slowed GPU
    of a replica that waits itself (for a faulted link's transfers) is not what the wait is for, so the verdict
    names it not."""
    share = bottleneck.get("loss_shares", {}).get("peer_wait", 0.0)
    slowed = sorted(((entry["factor"], int(gpu)) for gpu, entry in slowed_gpus.items()
                     if entry["factor"] > 1 and (waited_for is None or int(gpu) in waited_for)),
                    key=lambda pair: (-pair[0], pair[1]))
    if share < SHOWN_LOSS_SHARE or not slowed or "verdict" not in bottleneck:
        return bottleneck
    if len(slowed) <= SHOWN_STRAGGLERS:
        whose = " and ".join(f"GPU {gpu}'s compute x{factor_text(factor)}" for factor, gpu in slowed)
    else:
        low, high = factor_text(slowed[-1][0]), factor_text(slowed[0][0])
        whose = f"{len(slowed):,} GPUs' compute x{low if low == high else f'{low} to x{high}'}"
    if bottleneck.get("largest_loss", {}).get("name") == "peer_wait":
        return {**bottleneck, "verdict": f"{bottleneck['verdict']}, for {whose}"}
    note = f"{LOSS_LABELS['peer_wait']} {_percent(share)} of the step, for {whose}"
    return {**bottleneck, "verdict": f"{bottleneck['verdict']}; {note}"}


@dataclass(frozen=True)
class RuleShares:
    """The shares the bound rules read, of the time named by ``of``: exposed communication, the compute
    stream's wait and its host time."""

    exposed: float
    wait: float
    host: float
    of: str


ITERATIONS = "workers' iterations"
"""What the bound rules' shares are of in a parameter-server run whose workers idle after their last iteration."""


def rule_shares(evidence: dict, span: SimulatedSpan) -> RuleShares:
    """The evidence's exposed communication, wait and host time as shares of the time the bound rules judge:
    the ``span`` simulated, or, for a parameter-server run whose workers idle after their last iteration
    (`finished_early_share` of at least SHOWN_LOSS_SHARE), its workers' iterations, the run less that tail,
    which its throughput leaves out. An async run whose fast workers finish early would otherwise read
    idle-bound for time no iteration spends, and its exposed communication be thinned by time it has none in.
    A smaller tail (a synchronous run's float noise) leaves the shares of the ``span``."""
    exposed, wait, host = evidence["exposed_comm_share"], evidence["wait_share"], evidence["host_share"]
    tail = evidence.get("finished_early_share", 0.0)
    if tail < SHOWN_LOSS_SHARE:
        return RuleShares(exposed, wait, host, span)
    iterations = 1.0 - tail
    return RuleShares(exposed / iterations, (wait - tail) / iterations, host / iterations, ITERATIONS)


IDLE_LOSSES = ("worker_wait",)
"""The losses that are, together, the wait the bound rules read (`rule_shares`) less its exposed
communication where a step has them (a parameter-server run's): the verdict's reason names that part by those
of them above zero, as its largest single loss does. Without them it is `IDLE_PART`, or `PIPELINED_IDLE_PART`
for a pipelined step: its bubble's idle time less the exposed communication that overlaps it, and any other
idle time; the bubble loss, measured over the pipeline window and overlapping exposed communication, is not
that part."""

IDLE_PART = "other idle"
"""How the verdict's reason names the wait less exposed communication of a step without a pipeline."""
PIPELINED_IDLE_PART = "bubble and other idle"
"""How it names that part of a pipelined step: mostly its bubble, which 'other idle' alone hides beside a
'pipeline bubble' loss of another figure (27.5% and 27.3% of the 2,048-GPU Llama 3 70B step)."""
PEER_WAIT_IDLE_PARTS = {IDLE_PART: "wait for slower ranks and other idle",
                        PIPELINED_IDLE_PART: "bubble, wait for slower ranks and other idle"}
"""How it names that part where the step's wait for slower ranks (`peer_wait`, a straggler's or a slowed link's)
is at least SHOWN_LOSS_SHARE of it, so that the straggler's share of the idle time is not read as bubble."""


def _bound_reason(binding: Constraint, rule: RuleShares, losses: dict[str, float], pipeline_stages: int) -> str:
    """Why the wait names the bound, for the verdict, where it does, by the comparison that decided it, in the
    shares the rules read (``rule``): ' (exposed communication 33.0% of the step > 30.0%)', ' (waits 61.6% of the
    step: exposed communication 27.2% > other idle 34.4%)', ' (waits 40.0% of the step: host time 20.0% > half of
    other idle 35.0%, > exposed communication 5.0%)', ' (waits 71.4% of the workers' iterations: worker wait
    46.5% > exposed communication 24.9%)'; '' for a bound the wait does not name. The losses overlap, so a bound
    beside a larger loss of another name ('communication-bound; largest single loss: pipeline bubble, 34.4% of
    the step') read as a contradiction without it. The idle part takes the names of the `IDLE_LOSSES` above zero
    in ``losses``, else `PIPELINED_IDLE_PART` with more than one of ``pipeline_stages``, else `IDLE_PART`, each
    naming the wait for slower ranks too where it is shown (`PEER_WAIT_IDLE_PARTS`)."""
    exposed, wait = rule.exposed, rule.wait
    if binding == "communication" and exposed > WAIT_BOUND_SHARE:
        digits, relation = _resolution(exposed, WAIT_BOUND_SHARE)
        return (f" (exposed communication {_percent(exposed, digits)} of the {rule.of} {relation} "
                f"{_percent(WAIT_BOUND_SHARE, digits)})")
    unnamed = PIPELINED_IDLE_PART if pipeline_stages > 1 else IDLE_PART
    if losses.get("peer_wait", 0.0) >= SHOWN_LOSS_SHARE:
        unnamed = PEER_WAIT_IDLE_PARTS[unnamed]
    idle = (" and ".join(LOSS_LABELS[name] for name in IDLE_LOSSES if losses.get(name)) or unnamed, wait - exposed)
    waits = f" (waits {_percent(wait)} of the {rule.of}: "
    if binding == "host":
        host = rule.host
        half_digits, half_relation = _resolution(host, idle[1] / 2)
        digits, relation = _resolution(host, exposed)
        return (f"{waits}host time {_percent(host, max(half_digits, digits))} {half_relation} half of {idle[0]} "
                f"{_percent(idle[1], half_digits)}, {relation} exposed communication {_percent(exposed, digits)})")
    parts = {"communication": [("exposed communication", exposed), idle],
             "bubble": [idle, ("exposed communication", exposed)]}
    parts["idle"] = parts["bubble"]
    if binding not in parts:
        return ""
    (larger, larger_share), (smaller, smaller_share) = parts[binding]
    digits, relation = _resolution(larger_share, smaller_share)
    return (f"{waits}{larger} {_percent(larger_share, digits)} {relation} {smaller} "
            f"{_percent(smaller_share, digits)})")


def without_reason(verdict: str, exposed_share: float | None) -> str:
    """A verdict without the bracketed reason of its bound, for a table of one line per step, where the reason
    ran its rows past 200 columns; a communication bound keeps the figure it sums, every kind's exposed
    communication together (``exposed_share``: the bottleneck's `verdict_exposed_share`, None where a record
    lacks it), so that it does not read as a contradiction beside a larger single loss of another name
    ('communication-bound (all exposed communication 31.2%); largest single loss: pipeline bubble, 17.4% of the
    step'). The loss's own bracket (a bubble's share of the pipeline window beside the schedule's) stays; the
    binding tier's (metrics/link_tiers.py `TIER_DETAIL`) goes, its name and oversubscription staying."""
    head, detail, tail = verdict.partition(TIER_DETAIL)
    if detail:
        verdict = head + tail.partition(")")[2]
    bound, bracket, rest = verdict.partition(" (")
    if not bracket or ";" in bound:
        return verdict
    _, _, after = rest.partition(")")
    if bound == VERDICT_NAMES["communication"] and exposed_share is not None:
        return f"{bound} (all exposed communication {_percent(exposed_share)}){after}"
    return bound + after


def _resolution(larger: float, smaller: float) -> tuple[int, str]:
    """The decimals of a percent (1 to 3) that tell ``larger`` from ``smaller``, and the relation the verdict
    prints between them: '>' where they differ at those decimals, '>=' where they do not, so that exposed
    communication of 30.04% reads '30.04% > 30.00%', not '30.0% > 30.0%'."""
    for digits in (1, 2, 3):
        if _percent(larger, digits) != _percent(smaller, digits):
            return digits, ">"
    return 1, ">="


def _percent(share: float, digits: int = 1) -> str:
    """A share of the step as the verdict gives it, to 0.1% unless told more ``digits``: '27.2%'."""
    return f"{100 * share:.{digits}f}%"


def training_summary(rows: StepRows, *, step_time_s: float, gpus: int, simulated: Sequence[int],
                     tokens_per_step: float, model_flops_per_step: float, peak_flops: float, memory: dict,
                     memory_bound_share: float, pipelined: bool = True, pipeline_stages: int = 1,
                     traffic_correction: Mapping[str, float] | None = None,
                     nominal_model_flops_per_step: float | None = None,
                     training_ranks: Collection[int] | None = None, span: SimulatedSpan = "step",
                     traced: bool = False, routing_skew_s: float | None = None,
                     sm_contention_s: float | None = None, schedule: Schedule | None = None,
                     cp_imbalance_s: float | None = None, stages: Mapping[int, int] | None = None,
                     replicas: Mapping[int, int] | None = None) -> dict:
    """The summary keys of a training step. FLOP rates are per GPU; MFU counts model FLOPs without recompute
    (with experts, only for the token-expert assignments the capacity kept, so dropping tokens never raises it),
    HFU the FLOPs the GPUs really executed (recompute included). ``nominal_model_flops_per_step`` (experts only)
    adds the nominal rates, top_k experts for every token, as Megatron-LM and papers count them. A step that is
    not ``pipelined`` has no bubble (StepProgram.pipelined): its idle time beside exposed communication is the
    `worker_wait` loss instead, and the idle time after a worker's last op the `finished_early` loss, so the
    losses and compute cover the step; the verdict of a step of one
    ``pipeline_stages`` calls its idle time compute idle. ``traffic_correction`` turns the flows into bytes
    sent (`traffic_bytes`). ``training_ranks`` (None: every rank) are the ranks whose times the communication
    figures and the losses average: the workers of a parameter-server run, whose waits are the run's losses
    (a server has no compute to hide a transfer behind, and its updates are what the workers wait for); the
    FLOP rates and the traffic stay per GPU of the whole run, servers included, which the run occupies.
    ``span`` is what ``step_time_s`` spans, which the bottleneck's verdict names (`SimulatedSpan`). A step that
    counts no executed FLOPs (a synthetic model's, a replayed trace's whose ops carry no shapes) has its hardware
    rate and HFU unknown, None (null in summary.json, empty in a sweep's table), not the 0 a script or a chart
    reads as measured; so are its `tokens_per_s` where it states no tokens (a synthetic model, a trace without
    `tokens_per_step`), and its `tflops_per_gpu` and MFU where it states no model FLOPs.
    ``routing_skew_s`` (experts only) is what the hottest EP rank's load adds to the step, a loss (`loss_shares`);
    so is ``sm_contention_s``, the compute time per GPU lost to SM contention (None: the model is off), and
    ``cp_imbalance_s``, what the slowest CP rank's causal attention adds (None: the CP ranks' work is even).
    ``schedule`` (a pipelined step of more than one stage) gives `schedule_bubble_fraction`, the bubble the
    schedule alone leaves with this run's pass times, with `uniform_stage_bubble_fraction`, the same at uniform
    stages (the closed forms'), and `stage_busy_s`, each pipeline rank's pass seconds in it
    (`metrics.step.schedule_bubble`). ``stages`` (rank -> pipeline stage; None: one stage) splits the idle time
    after the pipeline window into the waits for slower ranks of a rank's stage and for other stages
    (`communication_metrics`); ``replicas`` (rank -> data-parallel replica; None: one replica) ends each rank's
    pipeline window with its replica's passes, so that a replica's wait for a slower one (a straggler's) is that
    wait for slower ranks, not its bubble (`pipeline_bubble`)."""
    timed = rows if training_ranks is None else rows.of_ranks(training_ranks)
    built_pipeline = pipelined and not traced  # a replayed trace's kernels are no forward/backward passes
    comm = communication_metrics(timed, step_time_s, replica_windows_s(timed, replicas) if built_pipeline else None,
                                 stages)
    window_bubble = pipeline_bubble(timed, replicas) if pipelined else None
    bubble = 0.0 if window_bubble is None else window_bubble.fraction
    alone = (schedule_bubble(timed, schedule)
             if pipelined and pipeline_stages > 1 and schedule is not None else None)
    schedule_bubble_share = None if alone is None else alone.fraction
    flops_per_gpu = executed_flops(rows) / max(ranks_stood_for(simulated, rows.weights), 1)
    flops_known, tokens_known, model_flops_known = flops_per_gpu > 0, tokens_per_step > 0, model_flops_per_step > 0
    model_flops_per_gpu = model_flops_per_step / gpus
    summary = {
        "step_time_s": step_time_s,
        "tokens_per_s": (tokens_per_step / step_time_s if step_time_s else 0.0) if tokens_known else None,
        "tflops_per_gpu": (model_flops_per_gpu / step_time_s / 1e12 if step_time_s else 0.0) if model_flops_known
        else None,
        "hardware_tflops_per_gpu": (flops_per_gpu / step_time_s / 1e12 if step_time_s else 0.0) if flops_known
        else None,
        "mfu": (model_flops_per_gpu / (step_time_s * peak_flops) if step_time_s else 0.0) if model_flops_known
        else None,
        "hfu": (flops_per_gpu / (step_time_s * peak_flops) if step_time_s else 0.0) if flops_known else None,
        **(_nominal_rates(nominal_model_flops_per_step / gpus, step_time_s, peak_flops)
           if nominal_model_flops_per_step is not None else {}),
        "bubble_fraction": bubble,
        **({} if alone is None else {"schedule_bubble_fraction": alone.fraction,
                                     "uniform_stage_bubble_fraction": alone.uniform_fraction,
                                     "stage_busy_s": {str(stage): busy for stage, busy
                                                      in enumerate(alone.stage_busy_s)}}),
        "comm_ratio": comm["comm_ratio"],
        "exposed_comm_s": comm["exposed_comm_s"],
        "comm_s": comm["comm_s"],
        "traffic_bytes_per_gpu": traffic_bytes(rows, traffic_correction),
        **memory,
    }
    tail_s = None if pipelined else idle_after_last_op_s(timed, step_time_s)
    losses = loss_shares(step_time_s, comm, None if window_bubble is None else window_bubble.seconds,
                         optimizer_s(timed), routing_skew_s, comm["host_s"] if traced else None,
                         None if tail_s is None
                         else max(comm["wait_s"] - comm["exposed_union_s"] - comm["host_s"] - tail_s, 0.0), tail_s,
                         sm_contention_s, cp_imbalance_s, comm["peer_wait_s"] if built_pipeline else None,
                         comm["stage_tail_wait_s"] if built_pipeline else None)
    summary["bottleneck"] = bottleneck(step_time_s, comm, memory, memory_bound_share, bubble, losses,
                                       pipeline_stages=pipeline_stages, span=span,
                                       schedule_bubble=schedule_bubble_share)
    return summary


def _nominal_rates(flops_per_gpu: float, step_time_s: float, peak_flops: float) -> dict[str, float]:
    """`nominal_tflops_per_gpu` and `nominal_mfu`: the model's nominal FLOPs per GPU over the step."""
    return {"nominal_tflops_per_gpu": flops_per_gpu / step_time_s / 1e12 if step_time_s else 0.0,
            "nominal_mfu": flops_per_gpu / (step_time_s * peak_flops) if step_time_s else 0.0}


def sm_contention_summary(lost_s: dict[str, float], simulated_ranks: float) -> dict:
    """The compute time lost per GPU while communication kernels held SMs (engine/contention.py): seconds by
    the category of the holding collective (tp, dp, pp...) and in all; kernel seconds, so a loss that a
    pipeline bubble absorbs still counts. ``simulated_ranks``: how many ranks the simulated ones stand for where
    ``lost_s`` weighs each by it (a run folded by classes of unequal size), else their count."""
    ranks = max(simulated_ranks, 1)
    by_kind = {category: seconds / ranks for category, seconds in lost_s.items()}
    return {"compute_slowdown_s": by_kind, "total_compute_slowdown_s": sum(by_kind.values(), 0.0)}
