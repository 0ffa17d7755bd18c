"""Layout search (`trainsim search SCENARIO.yaml`): enumerate (tp, cp, pp, dp, virtual stages, micro-batch,
ZeRO stage or FSDP, recompute) for the scenario's model, cluster and global batch; prune by arithmetic, by the
memory model and by dominance (a lighter recompute that fits), keeping every reason; rank the survivors by a
quick estimate and simulate the best `top` of them, plus seed 000's decision-tree choice, on an executor; rank
by simulated tokens/s and say where and why the winner and the tree disagree."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import ModelSpec
from simulator.config.loader import LoadedScenario, apply_overrides, load_scenario
from simulator.config.traces import TraceWorkload
from simulator.config.yaml_source import dotted, read_yaml, set_text
from simulator.errors import InputError, ScenarioError, SearchStopped, Terminated
from simulator.metrics.summary import IDLE_WITHOUT_PIPELINE
from simulator.scale import capped_topology, scenario_gpus
from simulator.scenario_checks import BatchConflict, data_parallel
from simulator.simulation import network_settings
from simulator.stops import raise_dropped
from simulator.sweep.decision_tree import TreeChoice, seed_tree_choice
from simulator.sweep.executors import Executor
from simulator.sweep.layouts import (
    CANDIDATE_FIELDS,
    SEARCHED_FIELDS,
    SPACE_FLAGS,
    ZERO2_HINT,
    Candidate,
    Checked,
    CollectiveTimes,
    Pruned,
    Pruning,
    SearchSpace,
    check_memory,
    ddp_turned_off,
    enumerate_candidates,
    nvlink_domain_gpus,
    structural_reason,
)
from simulator.sweep.options import Sharding
from simulator.sweep.results import CandidateStatus, PointStatus, ranked
from simulator.sweep.runner import PointTask, timed_point
from simulator.sweep.spec import point_key
from simulator.units import counted
from simulator.workload import memory_plan
from simulator.workload.experts import experts_split_problem
from simulator.workload.memory import state_bytes_per_param
from simulator.workload.memory_plan import GIB, rematerialized_activations
from simulator.workload.training import resolve_model

DEFAULT_TOP = 8
CANDIDATE_COLUMNS = ("tp", "cp", "pp", "dp", "ep", "virtual_stages", "micro_batch", "sharding", "recompute")
STOPPED_REASON = "not simulated: the search was stopped (Ctrl-C or SIGTERM) first"
"""The reason of a layout the search would have simulated, in the table a stopped search writes."""
REPORTED_METRICS = ("tokens_per_s", "mfu", "step_time_s", "peak_memory_gib", "bubble_fraction",
                    "bottleneck.verdict", "bottleneck.verdict_exposed_share")


@dataclass(frozen=True)
class SearchResult:
    """Every candidate with its status (`simulated`, `pruned`, `failed`) and reason, the best simulated row,
    the tree's choice, the comparison in words, and each option of the scenario's `parallelism.ddp` that
    layouts turned off, with the shardings that cannot take it (`ddp_turned_off`)."""

    table: pd.DataFrame
    winner: dict | None
    tree: TreeChoice
    tree_row: dict | None
    comparison: str
    ddp_turned_off: dict[str, list[str]] = field(default_factory=dict)


def _in_place_of_microbatches(loaded: LoadedScenario) -> str:
    """What a search takes for a scenario's fixed micro-batches: its global batch alone, or, where it gives none,
    a global batch in their place, the one they make on the scenario's dp where it resolves."""
    if loaded.scenario.training.global_batch is not None:
        return "global_batch alone (--set training.microbatches=null)"
    gpus = scenario_gpus(loaded)
    try:
        conflict = None if gpus is None else BatchConflict(
            loaded.scenario.training.microbatches or 0, loaded.scenario.training.micro_batch,
            data_parallel(loaded, gpus), 0)
    except InputError:
        conflict = None
    made = "" if conflict is None else f" ({conflict.product} here)"
    return f"global_batch in place of microbatches{made}"


def search_layouts(scenario_path: str | Path, executor: Executor, *, space: SearchSpace | None = None,
                   top: int = DEFAULT_TOP, overrides: list[str] | None = None, force: bool = False,
                   on_progress: Callable[[int, int], None] | None = None,
                   on_phase: Callable[[str], None] | None = None,
                   on_layout: Callable[[str], None] | None = None) -> SearchResult:
    """Search the layouts of the training step in ``scenario_path``, a file or a bundled scenario's name (every
    candidate sets the fields the search varies, `SEARCHED_FIELDS`, and keeps the rest of its parallelism
    section as written, but the ddp options its sharding cannot take; `ep` is the scenario's unless the space
    gives it); ``force`` simulates candidates beyond the scale limits.
    ``on_progress(done, total)`` hears of each candidate simulated (the simulations take nearly all the time),
    ``on_phase`` of what the search does before and between its counts ('estimating 3,690 layouts'),
    ``on_layout`` of each layout as its simulation starts and as it ends, with its wall time (`_simulate`)."""
    phase = on_phase or (lambda activity: None)
    space = space or SearchSpace()
    if top < 1:
        raise ScenarioError(f"'{top}' is below 1", field="--top", allowed="a whole number, 1 or more")
    try:
        loaded = load_scenario(scenario_path, overrides)
    except ScenarioError as exc:
        if exc.field != "parallelism.ddp.reduce_every_microbatch":
            raise
        raise exc.rebuilt(allowed=f"{exc.allowed}; in a search, {ZERO2_HINT}") from None
    _refuse_sets_on_searched_fields(loaded)
    scenario = loaded.scenario
    if scenario.uses_parameter_servers:
        raise loaded.error(("parallelism", "strategy"), "a layout search tries collective layouts (TP, PP, ZeRO, "
                           "...), and parameter-server workers each hold the whole model: it could try none",
                           "collective: --set parallelism.strategy=collective --set ps=null")
    if isinstance(scenario.workload, TraceWorkload):
        raise loaded.error(("workload", "trace"), "a replayed trace (workload.trace) has no layout to search: its "
                           "process groups are the traced job's layout, which the replay keeps",
                           "a scenario of a model (model: {preset: llama3-70b}) and no workload.trace")
    if scenario.model is None or scenario.model.synthetic is not None:
        raise loaded.error(("model",), "a layout search needs a model (preset or dimensions)",
                           "model: {preset: llama3-70b}")
    if scenario.training.microbatches is not None:
        raise loaded.error(("training", "microbatches"), "a layout search splits the global batch over each "
                           "layout's dp x micro_batch, and fixed micro-batches would change its global batch with dp",
                           _in_place_of_microbatches(loaded))
    if scenario.training.global_batch is None:
        raise loaded.error(("training", "global_batch"), "a layout search needs the global batch",
                           "training: {global_batch: 512}")
    if scenario.run.horizon is not None:
        raise loaded.error(("run", "horizon"), "a layout search ranks layouts by their training step, and a "
                           "scenario with run.horizon runs each as a job over weeks",
                           "a scenario without run.horizon, or --set run.horizon=null")
    _refuse_expert_parallelism_without_experts(loaded, space.ep)
    model = resolve_model(scenario)
    _refuse_expert_parallelism_the_experts_do_not_split(loaded, space.ep, model)
    space = replace(space, ep=space.ep or (scenario.parallelism.ep,))
    tree_ep = scenario.parallelism.ep if scenario.parallelism.ep in space.ep else min(space.ep)
    topology = capped_topology(loaded, force)
    times = CollectiveTimes(topology, network_settings(loaded, topology))
    domain_gpus = nvlink_domain_gpus(topology)
    base = search_base(loaded.source, overrides)
    schedule = scenario.parallelism.pipeline.schedule
    memo: dict[Candidate, Checked] = {}

    def check(candidate: Candidate) -> Checked:
        if candidate not in memo:
            pruning = structural_reason(candidate, model.layers, scenario.training.global_batch or 0,
                                        topology.gpu_domain_array,
                                        scenario.parallelism.pipeline.first_last_fewer_layers,
                                        tuple(scenario.parallelism.order))
            memo[candidate] = (Checked(candidate, {}, pruning) if pruning is not None
                               else check_memory(base, candidate, schedule, times))
        return memo[candidate]

    candidates = enumerate_candidates(space, topology.num_gpus, domain_gpus)
    if not candidates:
        raise ScenarioError(f"no layout of the search space fits the {topology.num_gpus} GPUs",
                            field="--tp/--cp/--pp/--virtual-stages",
                            allowed="tp x cp x pp dividing the GPU count; virtual stages above 1 with pp above 1")
    space_layouts = set(candidates)
    phase(f"estimating {counted(len(candidates), 'layout')}")
    turned_off = ddp_turned_off((base.get("parallelism") or {}).get("ddp") or {}, candidates)
    checked = _prune(candidates, check, space)
    eager = scenario.training.kernels == "eager"
    grad_format = scenario.training.gradient_buffer_dtype(scenario.parallelism.deepspeed_zero3)
    state = state_bytes_per_param(scenario.training.precision, scenario.training.optimizer, grad_format, eager)
    layer_state = model.layer_params_per_ep_rank(tree_ep) * (state.param + state.grad + state.optimizer)
    layer_fits = layer_state <= get_gpu(topology.gpu_model).hbm_bytes
    tree = seed_tree_choice(topology.num_gpus, domain_gpus, model.layers, scenario.training.global_batch,
                            layer_fits, check, tree_ep, eager,
                            selective_saves_memory=rematerialized_activations(scenario.training) == "none",
                            fewer_on_ends=scenario.parallelism.pipeline.first_last_fewer_layers)
    chosen = top_survivors(checked, top)
    checked = [replace(c, pruning=Pruning(Pruned.BELOW_TOP, _not_chosen_reason(c, chosen, top)))
               if not c.reason and c not in chosen and c.candidate != tree.candidate else c for c in checked]
    if tree.candidate is not None:  # simulated whatever its rank, even where a lighter recompute dominates it
        checked = [c for c in checked if c.candidate != tree.candidate] + [check(tree.candidate)]
    runs: dict[Candidate, object] = {}
    phase("simulating the best")
    try:
        _simulate([c for c in checked if not c.reason], loaded, executor, force, on_progress, runs,
                  on_layout, schedule)
    except KeyboardInterrupt as stop:
        raise SearchStopped(_result(checked, runs, tree, space_layouts, overrides or [], schedule, turned_off),
                            terminated=isinstance(stop, Terminated)) from None
    return _result(checked, runs, tree, space_layouts, overrides or [], schedule, turned_off)


def top_survivors(checked: list[Checked], top: int) -> list[Checked]:
    """The ``top`` survivors the search simulates: by estimate, those whose memory model's peak (the simulation's)
    leaves the room the memory plan leaves out before the `memory_tight` ones, which fill only places fewer
    layouts with room leave, ties by layout."""
    survivors = (c for c in checked if not c.reason)
    return sorted(survivors, key=lambda c: (c.memory_tight, -c.estimate_tokens_per_s, c.candidate))[:top]


def _not_chosen_reason(checked: Checked, chosen: list[Checked], top: int) -> str:
    """Why a survivor outside the ``chosen`` top ``top`` was not simulated: a tight one where they all have room
    (`top_survivors`), else its estimate ranks below theirs (`below_top_reason`)."""
    if checked.memory_tight and not chosen[-1].memory_tight:
        room = memory_plan.UNMODELLED_BYTES / GIB
        return (f"estimate {checked.estimate_tokens_per_s:,.0f} tokens/s, but its peak of "
                f"{checked.peak_memory_gib:,.2f} GiB leaves under the {room:.0f} GiB (at least) "
                f"the memory plan leaves out, and the top {top} are layouts with that room; not simulated (--top)")
    return below_top_reason(checked.estimate_tokens_per_s, top, chosen[-1].estimate_tokens_per_s)


def below_top_reason(estimate: float, top: int, cut: float) -> str:
    """Why a survivor whose estimate is ``estimate`` tokens/s was not simulated, the ``top`` best ending at
    ``cut``: it ranks below them, or ties the last of them and lost the tie on its label's order."""
    if estimate >= cut:
        return (f"estimate {estimate:,.0f} tokens/s ties the last of the top {top} (cut at {cut:,.0f}), which "
                "comes first in layout order; not simulated (--top)")
    return f"estimate {estimate:,.0f} tokens/s ranks below the top {top} (cut at {cut:,.0f}); not simulated (--top)"


def _result(checked: list[Checked], runs: dict, tree: TreeChoice, space_layouts: set[Candidate],
            given: list[str], schedule: str, turned_off: dict[str, list[str]]) -> SearchResult:
    """The search's result from its checked candidates and those of them simulated (all, or those simulated
    before a stop); ``schedule`` the scenario's pipeline schedule, ``turned_off`` the ddp options layouts turned
    off (`ddp_turned_off`)."""
    table = _table(checked, runs, tree.candidate, space_layouts, given, schedule)
    # The tree's layout is simulated for the comparison even where the space (--tp, --pp, ...) leaves it out;
    # the winner is the space's: else a space with nothing that fits "agreed with the tree" and exited 0.
    simulated = ranked(table[(table["status"] == CandidateStatus.SIMULATED) & table["searched"]])
    winner = simulated.iloc[0].to_dict() if len(simulated) else None
    tree_rows = table[table["tree_choice"]]
    tree_row = tree_rows.iloc[0].to_dict() if len(tree_rows) else None
    searched = {name: {getattr(c, name) for c in space_layouts} for name in SPACE_FLAGS}
    return SearchResult(table, winner, tree, tree_row, compare(winner, tree_row, tree, searched), turned_off)


def _refuse_expert_parallelism_without_experts(loaded: LoadedScenario, given_ep: tuple[int, ...]) -> None:
    """Refuse an ep above 1 (the space's, given, or else the scenario's) for a model without experts: every
    candidate would fail on it, and the tree, seeded with it, would fit nothing."""
    model = loaded.scenario.model
    ep = max(given_ep or (loaded.scenario.parallelism.ep,))
    if ep == 1 or model is None or model.has_experts():
        return
    problem = f"ep {ep} needs a model with experts"
    allowed = "1 (model.moe is null: no experts)" if model.experts_dropped else "1, or add model.moe"
    if given_ep:
        raise ScenarioError(problem, field="--ep", allowed=allowed)
    raise loaded.error(("parallelism", "ep"), problem, f"{allowed}; or --ep 1")


def _refuse_expert_parallelism_the_experts_do_not_split(loaded: LoadedScenario, given_ep: tuple[int, ...],
                                                        model: ModelSpec) -> None:
    """Refuse an ep (the space's, given, or else the scenario's) that does not divide the model's experts: no
    layout takes it, and every candidate was pruned as 'ep does not divide dp x cp' instead."""
    if model.moe is None:
        return
    moe = model.moe
    problems = (experts_split_problem(moe, ep) for ep in given_ep or (loaded.scenario.parallelism.ep,))
    split = next(filter(None, problems), None)
    if split is None:
        return
    problem, allowed = split
    if given_ep:
        raise ScenarioError(problem, field="--ep", allowed=allowed)
    raise loaded.error(("parallelism", "ep"), problem, f"{allowed}; or --ep with them")


def search_base(path: str | Path, overrides: list[str] | None) -> dict:
    """The scenario as written (quantities keep their units), with the ``overrides``, writing only summary.json
    per run. Each candidate sets the fields the search varies (`Candidate.overrides`); the rest of the
    `parallelism` section (ddp, tp_comm_overlap, cp_algorithm, ...) stays as the user wrote it."""
    written, _ = read_yaml(path, ScenarioError)
    if not isinstance(written, dict):
        raise ScenarioError("the scenario is not a mapping of sections", file=str(path), allowed="a scenario file")
    data, _ = apply_overrides(written, overrides or [])
    data["run"] = {**(data.get("run") or {}), "timeline": "summary"}
    return data


def _refuse_sets_on_searched_fields(loaded: LoadedScenario) -> None:
    """A `--set` of a field the search varies (the same field, a section holding it, or a field under it)
    refused at the `--set`, naming the flag that gives its values: every candidate writes over it, and the
    search ranked layouts without it."""
    for override in loaded.overrides:
        for name, flag in SEARCHED_FIELDS.items():
            if override.overlaps(tuple(name.split("."))):
                raise override.error(f"the search sets {name} in every layout it tries", dotted(override.path),
                                     f"a field the search does not vary; for {name}: {flag}")


def _one_rank_layout(sharding: Sharding, shardings: tuple[Sharding, ...]) -> Sharding:
    """The sharding that stands for ``sharding`` in a layout with one data-parallel rank (dp x cp = 1): the ZeRO
    stages then shard nothing and are one layout, the first of ``shardings``; PyTorch FSDP is its own, whose fp32
    shards and one-rank unshard and reduce copies fully_shard keeps there too (Sharding.fp32_shards)."""
    return next(kept for kept in shardings if (kept == "fsdp") == (sharding == "fsdp"))


def _prune(candidates: list[Candidate], check, space: SearchSpace) -> list[Checked]:
    """Check each candidate; for one layout, once a recompute option fits, the heavier ones are dominated; with
    one data-parallel rank (dp x cp = 1) the ZeRO stages are the same layout, so only the space's first of them
    is kept (_one_rank_layout)."""
    result = []
    fitting: dict[Candidate, str] = {}
    for candidate in candidates:
        kept = _one_rank_layout(candidate.sharding, space.sharding)
        if candidate.dp * candidate.cp == 1 and candidate.sharding != kept:
            result.append(Checked(candidate, {}, Pruning(Pruned.SAME_LAYOUT, f"same layout as {kept}: with dp x "
                                                                             "cp = 1 ZeRO has nothing to shard")))
            continue
        key = replace(candidate, recompute="none")
        if key in fitting:
            result.append(Checked(candidate, {}, Pruning(Pruned.DOMINATED, f"dominated: recompute={fitting[key]} "
                                                                           "fits with the same layout and does less "
                                                                           "work")))
            continue
        checked = check(candidate)
        if not checked.reason:
            fitting[key] = candidate.recompute
        result.append(checked)
    return result


def _simulate(survivors: list[Checked], loaded: LoadedScenario, executor: Executor, force: bool,
              on_progress: Callable[[int, int], None] | None, runs: dict[Candidate, object],
              on_layout: Callable[[str], None] | None = None, schedule: str = "") -> None:
    """Simulate ``survivors`` into ``runs`` as each finishes, so that a stop leaves those finished there; the progress
    hears of none done first (a count from the start, not only once the first layout finishes). ``on_layout`` hears
    'search: simulating LABEL' as a layout is handed to a worker and 'search: LABEL simulated in S s wall' (or failed)
    as it ends, and why where it ran again (`runner.refold_clause`) (``schedule`` the scenario's, which labels name): a
    layout whose fold falls out of step runs again refolded (Llama 3 70B TP4 PP8 DP8 on 256 GPUs: 54 s of CPU, where TP8
    PP2 DP16, folded, takes 2 s), and the count alone stays at '0/3 points' for minutes meanwhile."""
    tasks = [PointTask(index, point_key(c.data), c.data, loaded.source, loaded.lines, None, force=force)
             for index, c in enumerate(survivors)]
    labels = [c.candidate.label(c.candidate.schedule(schedule), schedule) for c in survivors]
    if on_progress is not None:
        on_progress(0, len(tasks))
    finished = (executor.map_unordered(timed_point, tasks) if on_layout is None else
                executor.map_unordered(timed_point, tasks, lambda task: on_layout(
                    f"search: simulating {labels[task.index]}")))
    for timed in finished:
        record = timed.record
        runs[survivors[record.index].candidate] = record
        if on_layout is not None:
            status = CandidateStatus.SIMULATED if record.status == PointStatus.OK else CandidateStatus.FAILED
            on_layout(f"search: {labels[record.index]} {status} {timed.done_text()}")
        raise_dropped()
        if on_progress is not None:
            on_progress(len(runs), len(tasks))


def run_overrides(data: dict, given: list[str]) -> list[str]:
    """The `--set` values with which `trainsim run` of the searched scenario runs a candidate's scenario ``data``
    as the search ran it: the search's own ``given`` ones, then each field the candidate sets, one by one
    (`CANDIDATE_FIELDS`: a label such as 'TP4 CP1 PP1 DP16 mb1 fsdp' says nothing of the sequence parallelism
    and schedule it sets; setting only its degrees ran Llama-3-70B's TP4 DP16 FSDP layout without sequence
    parallelism: 91.5 GiB, out of memory, where the search had simulated 61.5 GiB). The whole parallelism
    section, set at once, dropped the user's own `--set parallelism.ddp...` again. A ``given`` one of a field the
    candidate writes is left out: the candidate's value (the given one, or what its sharding turned it to)
    follows, and the command said `overlap_param_gather=true` and `=false` both."""
    sets, written = [], set()
    for name in CANDIDATE_FIELDS:
        section: object = data
        for part in name.split("."):
            section = section.get(part, _ABSENT) if isinstance(section, dict) else _ABSENT
        if section is not _ABSENT:
            sets.append(set_text(name, section))
            written.add(name)
    return [*(item for item in given if item.split("=", 1)[0].strip() not in written), *sets]


_ABSENT = object()
"""A field a candidate's scenario does not hold (the ddp options its sharding leaves as written)."""


def _table(checked: list[Checked], runs: dict, tree: Candidate | None, space: set[Candidate],
           given: list[str], base_schedule: str) -> pd.DataFrame:
    """One row per candidate; `schedule` the pipeline schedule it runs (from the scenario's ``base_schedule``);
    `searched` says whether it is a layout of the searched space (the tree's layout, simulated for the
    comparison, may lie outside it and never wins); `memory_tight` whether its simulated peak fits with less
    room than the memory plan leaves out (the summary's `memory_tight`); `overrides`, for a layout that got as far
    as the memory check, the `--set` values that run it (`run_overrides`, a JSON list, as a sweep's table holds
    its points' overrides)."""
    rows = []
    for c in checked:
        schedule = c.candidate.schedule(base_schedule)
        row: dict = {"label": c.candidate.label(schedule, base_schedule),
                     **{name: getattr(c.candidate, name) for name in CANDIDATE_COLUMNS}, "schedule": schedule}
        record = runs.get(c.candidate)
        status = (CandidateStatus.PRUNED if c.reason else CandidateStatus.STOPPED if record is None else
                  CandidateStatus.SIMULATED if record.status == PointStatus.OK else CandidateStatus.FAILED)
        row.update(status=status.value, reason=c.reason or (record.error if record is not None else STOPPED_REASON),
                   reason_kind=c.pruning.kind.value if c.pruning is not None else None,
                   memory_model_peak_gib=c.peak_memory_gib or None,
                   estimate_tokens_per_s=c.estimate_tokens_per_s or None, tree_choice=c.candidate == tree,
                   searched=c.candidate in space)
        metrics = record.metrics if record is not None else {}
        row.update({name: metrics.get(name) for name in REPORTED_METRICS})
        row["memory_tight"] = bool(metrics.get("memory_tight"))
        row["overrides"] = json.dumps(run_overrides(c.data, given)) if c.data else None
        rows.append(row)
    return pd.DataFrame(rows)


def _idle(row: dict) -> str:
    """A layout's idle share of its compute stream, named as the run's printout names it: a pipeline's bubble,
    or, with one stage, compute idle (waits for ZeRO-3 gathers and the like, no pipeline)."""
    name = "bubble" if row["pp"] > 1 else IDLE_WITHOUT_PIPELINE
    return f"{name} {100 * row['bubble_fraction']:.1f}%"


def compare(winner: dict | None, tree_row: dict | None, tree: TreeChoice,
            searched: dict[str, set] | None = None) -> str:
    """Where and why the search's winner and the decision tree's choice disagree, in a few sentences;
    ``searched`` the values of each dimension the space held (`SPACE_FLAGS`), which a tree's layout outside the
    space and faster than the winner is told apart by."""
    if winner is None:
        if tree_row is not None and tree_row["status"] == CandidateStatus.SIMULATED:
            return (f"no layout of the searched space survived the checks and simulated; the decision tree's "
                    f"{tree_row['label']}, outside it, runs {tree_row['tokens_per_s']:,.0f} tokens/s")
        return "no layout survived the checks and simulated"
    if tree_row is None or tree.candidate is None:
        return f"the decision tree finds no layout that fits ({tree.steps[-1]}); the search's best is {winner['label']}"
    if tree_row["status"] == CandidateStatus.STOPPED:  # its reason, STOPPED_REASON, says 'not simulated' again
        return (f"the decision tree's {tree_row['label']} was not simulated (the search was stopped first); "
                f"the search's best is {winner['label']}")
    if tree_row["status"] != CandidateStatus.SIMULATED:
        return (f"the decision tree's {tree_row['label']} was not simulated ({tree_row['status']}: "
                f"{tree_row['reason']}); the search's best is {winner['label']}")
    unsharded = (all(row["dp"] * row["cp"] == 1 for row in (winner, tree_row))
                 and (winner["sharding"] == "fsdp") == (tree_row["sharding"] == "fsdp"))
    differ = [f"{name} {tree_row[name]} -> {winner[name]}" for name in CANDIDATE_COLUMNS
              if tree_row[name] != winner[name] and name != "dp" and not (name == "sharding" and unsharded)]
    if not differ:  # the same layout (with one data-parallel rank the ZeRO stages' names differ, nothing else)
        return f"the search agrees with the decision tree: {tree_row['label']}"
    gain = winner["tokens_per_s"] / tree_row["tokens_per_s"] - 1 if tree_row.get("tokens_per_s") else float("nan")
    profiles = (f"They differ in {'; '.join(differ)}. Tree: {tree_row['bottleneck.verdict']}, {_idle(tree_row)}, "
                f"MFU {100 * tree_row['mfu']:.1f}%. Search: {winner['bottleneck.verdict']}, {_idle(winner)}, MFU "
                f"{100 * winner['mfu']:.1f}%.")
    if gain < 0 and not tree_row.get("searched", True):
        faster = tree_row["tokens_per_s"] / winner["tokens_per_s"] - 1
        return (f"the decision tree's {tree_row['label']}, outside the searched space, runs "
                f"{tree_row['tokens_per_s']:,.0f} tokens/s, {100 * faster:.1f}% faster than the search's "
                f"{winner['label']} ({winner['tokens_per_s']:,.0f} tokens/s). {profiles} "
                f"{_widen(tree_row, searched or {})}")
    return (f"the search's {winner['label']} runs {winner['tokens_per_s']:,.0f} tokens/s, {100 * gain:+.1f}% vs "
            f"the decision tree's {tree_row['label']} ({tree_row['tokens_per_s']:,.0f} tokens/s). {profiles} The "
            f"tree stops at the first layout that fits in memory (lightest recompute, then smallest TP, then "
            f"smallest PP with m >= 4p); it never weighs throughput.")


def _widen(tree_row: dict, searched: dict[str, set]) -> str:
    """The flags whose values left the tree's layout out of the searched space, as the sentence that says so."""
    outside = [f"{flag} (its {name} {tree_row[name]} was not tried)" for name, flag in SPACE_FLAGS.items()
               if name in searched and tree_row[name] not in searched[name]]
    return f"Widen {' and '.join(outside)} to search it." if outside else "Widen the space to search it."

