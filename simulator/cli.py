"""The `trainsim` command line: a thin layer over the library; user mistakes exit with status 2 and one line."""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.collectives.names import ALGORITHM_CHOICES, ALGORITHM_OPS, PRIMITIVES, PROTOCOL_CHOICES
from simulator.collector import collector_paused
from simulator.console.paths import COMMAND_LINE, chosen_figure_file, command_line, on_command_line, output_folder
from simulator.errors import (
    LIST_OF,
    STOP_SIGNALS,
    ExecutorError,
    InputError,
    InterruptedWritten,
    ScenarioError,
    SearchStopped,
    SimulationError,
    Terminated,
    WorkerKilled,
    did_you_mean,
)
from simulator.network.calibration import PROFILES as EFFICIENCY_PROFILES
from simulator.network.modes import NETWORK_MODES
from simulator.stops import forget_dropped, kept_for_later, raise_dropped
from simulator.sweep.options import (
    CSV_COLUMNS,
    DEFAULT_MAX_POINTS,
    EXECUTORS,
    GANTT_ROWS,
    RECOMPUTES,
    SEARCH_CP,
    SEARCH_MICRO_BATCHES,
    SEARCH_SHARDINGS,
    SEARCH_VIRTUAL_STAGES,
    SHARDINGS,
    STUDIES,
    STUDY_CHARTS,
    ExecutorName,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from simulator.collectives.names import AlgorithmName
    from simulator.config.loader import LoadedScenario
    from simulator.config.yaml_source import FieldPath
    from simulator.reliability.study import IntervalGrid
    from simulator.scale import CollectiveCost
    from simulator.topology.graph import Topology

EXIT_INPUT = 2
"""A user's input is wrong (scenario, topology, table, option): one located line on stderr."""
EXIT_RUNTIME = 1
"""The run could not finish (deadlock, a file that could not be written, memory): one line on stderr."""
EXIT_INTERRUPTED = 130
"""Ctrl-C, as a shell reports a process ended by SIGINT (128 + 2)."""
EXIT_TERMINATED = 143
"""SIGTERM (`kill PID`, a scheduler's stop), as a shell reports a process ended by it (128 + 15)."""
EXIT_BROKEN_PIPE = 141
"""The reader of stdout went away (`trainsim topo describe ... | head`), as a shell reports SIGPIPE (128 + 13)."""
FORESEEING = "foreseeing cluster states"
"""The bar's phase while a job's first pass over its replications finds the straggler and degraded states to
simulate ahead."""
CHECKING_SIZES = "checking elastic sizes"
"""The bar's phase while an elastic job's smaller sizes are checked at load (`elastic.elastic_sizes`: 127 of a
16,384-GPU job, seconds with nothing else on the screen)."""


@collector_paused()
def _cmd_run(args: argparse.Namespace) -> int:
    """One run, the cyclic garbage collector paused throughout: loading and writing keep the run's large
    heap alive as well (simulator/collector.py)."""
    from simulator import load_scenario
    from simulator.report.run_folder import RUN_FOLDER, earlier_files

    out = output_folder(args.out, RUN_FOLDER)
    loaded = load_scenario(args.scenario, args.set)
    earlier = earlier_files(out)
    if loaded.scenario.run.horizon is not None:
        code = _run_job(loaded, out, quiet=args.quiet, force=args.force,
                        workers=0 if args.workers is None else args.workers)
        _replaced_line(out, earlier)
        return code
    if args.workers is not None:
        from simulator.console.paths import option_error

        raise option_error("--workers", "a step runs in this one process; --workers sets a job's processes, which "
                           "simulate its cluster states ahead (run.horizon)",
                           "--workers with a scenario that sets run.horizon, none for a step")
    from simulator import simulate
    from simulator.console.progress import RunProgress
    from simulator.report.writers import write_outputs
    from simulator.simulation import FoldDropped, Rerun

    with RunProgress(enabled=not args.quiet) as progress:
        def rerunning(notice: FoldDropped | Rerun) -> None:
            from simulator.console.report import rerun_line  # rich, imported only where a fold is given up

            progress.say(rerun_line(notice))
            progress.anew("" if isinstance(notice, Rerun) else "building the step again")

        result = simulate(loaded, force=args.force, progress=progress, on_rerun=rerunning)
        progress.doing("writing outputs")
        files = write_outputs(out, result, loaded)
    _replaced_line(out, earlier)
    _warn("run", result.summary.get("warnings", []), result.summary, loaded, result.topology)
    if not args.quiet:
        from rich.console import Console

        from simulator.console.report import print_run_report

        print_run_report(result.summary, Console(highlight=False, width=None if sys.stdout.isatty() else 120))
        print(f"wrote {args.out}: {', '.join(files)} ({len(result.log):,} events simulated)")
    return 0


def _replaced_line(out: Path, earlier: set[str] | None) -> None:
    """Say on stderr that the run replaced an earlier run's results in ``out`` (``earlier``: its files, None where
    the folder held none), naming those it removed that this run does not write: a rerun replaces its own
    command's results as a search, a study and a sweep do theirs, and a user who reruns into a folder learns
    that its earlier files are gone."""
    from simulator.report.run_folder import earlier_files

    if earlier is None:
        return
    removed = sorted(earlier - (earlier_files(out) or set()))
    gone = f"; removed its {', '.join(removed)}, which this run does not write" if removed else ""
    _stderr_line(f"note: replaced the earlier run's results in {out}{gone}")


def _warn(command: str, warnings: list[str] | tuple[str, ...], memory: dict, loaded: LoadedScenario,
          topology: Topology | None = None) -> None:
    """Layout warnings on stderr (one the library located at a flag on ``command``'s command line, as its errors
    are: `_at_command`), a peak that fits with less room than the memory plan leaves out (`tight_memory_line`),
    and an out-of-memory verdict in bold red where stderr is a terminal (the console report, and rich, imported
    only for those), with the remedies computed for ``loaded`` on ``topology`` (built where not given:
    `oom_line`)."""
    for warning in warnings:
        _stderr_line(f"warning: {on_command_line(warning, f'trainsim {command}', _flags(loaded))}")
    if memory.get("memory_tight"):
        from simulator.console.report import tight_memory_line

        _stderr_line(f"warning: {tight_memory_line(memory)}")
    if memory.get("oom"):
        from rich.console import Console

        from simulator.console.report import oom_line

        line = oom_line(memory, loaded, topology)
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"warning: {line}", style="bold red")


STUDY_OPTIONS = ("--intervals", "--multipliers")
"""The options of `trainsim study` that write into its points' scenarios (reliability/study.py
`study_point_scenario`), where their warnings may be located."""


def _flags(loaded: LoadedScenario, options: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The flags a warning about ``loaded`` may be located at: its `--set`s, and the command's ``options`` that
    write into its scenario."""
    return (*(override.file for override in loaded.overrides if override.at_flag), *options)


def _warn_line(warning: str) -> None:
    """One warning on stderr as it happens (a worker simulating cluster states ahead lost mid-job)."""
    _stderr_line(f"warning: {warning}")


def _stderr_line(line: str) -> None:
    """``line`` on stderr in one write: `print` writes the text and its newline apart, and a job's progress
    heartbeat (console/progress.py) could put its own line between the two."""
    sys.stderr.write(f"{line}\n")


def _run_job(loaded, out: Path, *, quiet: bool, force: bool, workers: int) -> int:
    """A job over weeks (`run.horizon`): its healthy step's warnings (out of memory among them) as a plain run
    gives them and the job's known before it runs (an interval that writes no checkpoint), printed as soon as
    that step is simulated, before the job (which can take minutes); then its outputs, the warning that its
    restarts mostly waited for hosts, where they did, and that some state took no in-memory snapshot, and (unless
    ``quiet``) its table of figures."""
    from simulator.console.progress import RunProgress
    from simulator.reliability.report import run_job

    with RunProgress(enabled=not quiet, unit="replications", description="simulating the job") as progress:
        ahead = progress.counting("states", "simulating cluster states ahead", eta=True)
        job, files = run_job(loaded, out, force=force, progress=progress, workers=workers,
                             states_progress=ahead, states_sharing=ahead.sharing,
                             foresight_progress=progress.counting("replications", FORESEEING),
                             sizes_progress=progress.counting("sizes", CHECKING_SIZES, passing=True),
                             workers_warning=_warn_line, activity=progress.doing,
                             on_healthy_step=lambda summary: _warn("run", summary.get("warnings", []), summary,
                                                                   loaded))
    for late in (job.waiting, job.idle_memory, job.split_evenly):
        if late is not None:
            _warn_line(late)
    if not quiet:
        from rich.console import Console

        from simulator.console.report import print_job_report

        print_job_report(job.summary, job.step_summary,
                         Console(highlight=False, width=None if sys.stdout.isatty() else 120))
        print(f"wrote {out}: {', '.join(files)} ({job.table.num_rows:,} rows of job events)")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from simulator import load_scenario
    from simulator.console.report import memory_line, model_state_line, oom_line, skipped_sizes_text
    from simulator.preflight import unbuilt_step_text, validate
    from simulator.scale import sized_topology
    from simulator.units import counted, number_ranges
    from simulator.workload.memory_plan import GIB

    loaded = load_scenario(args.scenario, args.set)
    topology = sized_topology(loaded, force=args.force, weigh=lambda: unbuilt_step_text(loaded))
    verdict = validate(loaded, topology, force=args.force)
    skipped = ""
    warnings = list(verdict.warnings)
    if loaded.scenario.run.horizon is not None:
        from simulator.console.progress import RunProgress
        from simulator.reliability.simulate import (
            fixed_size_warning,
            interval_past_horizon,
            preset_warning,
            validate_job,
        )

        with RunProgress(enabled=not args.quiet, unit="sizes", description=CHECKING_SIZES) as progress:
            job = validate_job(loaded, topology, verdict.step_floor_s, verdict.trace_sizes, force=args.force,
                               sizes_progress=progress)
        sizes = job.sizes
        text = skipped_sizes_text(sizes.out_of_memory_gib(), sizes.capacity_bytes / GIB)
        skipped = f"elastic sizes: {number_ranges(sizes.sizes)}; {text}" if text else ""
        known = (fixed_size_warning(loaded, sizes), interval_past_horizon(loaded, None),
                 preset_warning(loaded, topology), job.no_progress)
        warnings += [warning for warning in known if warning is not None]
    if args.strict and verdict.memory.get("oom"):
        line = oom_line(dict(verdict.memory), loaded, topology)
        raise loaded.error(("parallelism",), line, "a layout that fits in GPU memory", every_override=True)
    _warn("validate", warnings, dict(verdict.memory), loaded, topology)
    if not args.quiet:
        gpus = counted(topology.num_gpus, f"{topology.gpu_model} GPU")
        if verdict.gpus not in (None, topology.num_gpus):  # a trace of fewer ranks than the cluster has
            gpus = f"{verdict.gpus:,} of the {gpus}"
        fits = ", but it does not fit in GPU memory (--strict refuses it)" if verdict.memory.get("oom") else ""
        print(f"{args.scenario}: valid ({gpus} on {topology.name}){fits}")
        for memory in (memory_line(dict(verdict.memory)), model_state_line(dict(verdict.memory))):
            if memory:
                print(f"  {memory}")
        for line in verdict.size:
            print(f"  {line}")
        if skipped:
            print(f"  {skipped}")
    return 0


def _cmd_scenarios(args: argparse.Namespace) -> int:
    from simulator.config.bundled import BUNDLED_DIR, bundled_scenarios, scenario_description

    names = bundled_scenarios()
    width = max(map(len, names), default=0)
    print(f"bundled scenarios in {BUNDLED_DIR} (run one by name: trainsim run NAME --out DIR)")
    for name in names:
        print(f"  {name:<{width}}  {scenario_description(name)}")
    return 0


def _cmd_gpus(args: argparse.Namespace) -> int:
    from simulator.catalog.gpus import get_gpu
    from simulator.console.paths import option_error
    from simulator.report.gpu_catalog import gpu_detail, gpu_table

    if args.name is None:
        print(gpu_table())
        return 0
    try:
        get_gpu(args.name, "NAME")
    except ScenarioError as exc:
        raise option_error("NAME", exc.problem, exc.allowed) from None
    print(gpu_detail(args.name))
    return 0


@dataclass(frozen=True)
class TopologySets:
    """`trainsim topo` and `collective`'s `--set NAME=VALUE`s: their values read as `trainsim run --set`'s (YAML, a
    dotted name setting a key inside a parameter: `node.gpu_model=h200`), for `read_topology`, and each as typed,
    to locate an error in what it set."""

    values: dict
    typed: tuple[tuple[FieldPath, str], ...]

    @classmethod
    def read(cls, items: list[str]) -> TopologySets:
        """The `--set`s ``items``; one without '=' or whose name is no field path is refused at the flag."""
        from simulator.config.loader import set_flag
        from simulator.config.yaml_source import SplitNumber, is_field_path, override_value, parse_field, set_field

        values: dict = {}
        typed = []
        for item in items:
            if "=" not in item:
                raise InputError(f"{item!r} has no '='", field="--set", allowed="--set name=value")
            name, raw = (part.strip() for part in item.split("=", 1))
            if not is_field_path(name):
                raise InputError(f"{name!r} is not a field path", file=set_flag(item),
                                 allowed="a parameter, or a key in one: nodes, node.gpu_model", at_flag=True)
            path = parse_field(name)
            try:
                set_field(values, path, override_value(raw))
            except SplitNumber as split:
                raise InputError(split.problem, file=set_flag(item), allowed=split.allowed, at_flag=True) from None
            except ValueError as exc:
                raise InputError(str(exc), file=set_flag(item), allowed="a key inside a parameter that is a mapping "
                                 "(node.gpu_model)", at_flag=True) from None
            typed.append((path, set_flag(item)))
        return cls(values, tuple(typed))

    def warn_kept_node(self, topology: Topology, prog: str) -> None:
        """Warn, at ``prog``'s `--set` of its `gpu_model`, of a GPU changed without the NVLink bandwidth or NVLink SHARP
        that go with it (`topology/loader.kept_node_problem`), as a scenario's `cluster` override is warned."""
        from simulator.config.yaml_source import dotted
        from simulator.console.paths import command_line
        from simulator.topology.loader import kept_node_problem

        found = kept_node_problem(self.values, topology)
        if found is not None:
            path, problem, allowed = found
            located = self.located(InputError(problem, field=dotted(path), allowed=allowed))
            _warn_line(f"{command_line(prog)}: {located}")

    def located(self, exc: InputError) -> InputError:
        """A topology error about a value a `--set` gave, located at the last `--set` that set it (as `trainsim
        run` locates a scenario's), not at the topology file the user did not write; a key a merged node keeps
        from the file stays at the file's line."""
        from simulator.config.loader import as_typed
        from simulator.config.yaml_source import parse_field
        from simulator.topology.loader import set_by

        path = parse_field(exc.field)
        if not set_by(self.values, path):
            return exc
        flags = [(parts, flag) for parts, flag in self.typed if parts[:len(path)] == path[:len(parts)]]
        if not flags:
            return exc
        parts, flag = flags[-1]
        problem = as_typed(exc.problem, flag.removeprefix("--set ")) if parts == path else exc.problem
        return exc.rebuilt(problem=problem, file=flag, line=None, at_flag=True)


COLLECTIVE_FLAGS = {"op": "--op", "collectives.algorithm": "--algorithm", "collectives.protocol": "--protocol",
                    "collectives.chunk": "--chunk", "topology": "--topology"}
"""The scenario fields `trainsim collective` fills from its flags, for naming the flag in an error."""


COLLECTIVE_COST = ("time a collective on in seconds (at 65,536 GPUs an all-reduce of the default 11 sizes took 3 min "
                   "and 3.1 GB, one 1 GiB size 11 s with ring, 20 s with auto, and 0.7-0.8 GB)")
"""Why `trainsim collective` refuses a cluster beyond MAX_QUICK_GPUS, as measured (topology/size.py)."""


def _cmd_collective(args: argparse.Namespace) -> int:
    from simulator.collective_sweep import collective_sweep, format_table
    from simulator.console.progress import RunProgress, clock
    from simulator.topology.loader import build_source, read_topology
    from simulator.topology.size import topology_gpus
    from simulator.units import parse_size_range

    sets = TopologySets.read(args.set)
    try:
        sizes = parse_size_range(args.sizes)
    except InputError as exc:
        raise exc.located(field_prefix="--sizes") from None
    try:
        cluster = read_topology(args.topology, sets.values)
        _refuse_large_cluster(cluster, "--topology", COLLECTIVE_COST, force=args.force)
        _refuse_large_collective(args, cluster, topology_gpus(cluster))
        topology = build_source(cluster)
        sets.warn_kept_node(topology, "trainsim collective")
        cost = _refuse_large_collective(args, cluster, topology.num_gpus, _planned_flows(args, topology, sizes))
        if cost is not None and cost.seconds >= SLOW_SIZE_S:
            events = cost.estimate.events
            _stderr_line(f"trainsim collective: about {clock(cost.seconds)} of CPU a size, {len(sizes)} size"
                         f"{'s' if len(sizes) > 1 else ''} (~{events:,} ops + flows, "
                         f"~{round(events / cost.seconds * 60):,} a CPU minute)")
        with RunProgress(enabled=True, unit="sizes", description=f"timing {args.op}") as progress:
            rows = collective_sweep(topology, {}, op=args.op, algorithm=args.algorithm, protocol=args.protocol,
                                    ranks=args.ranks, sizes=sizes, efficiency=args.efficiency, mode=args.network,
                                    chunk=args.chunk, pxn=args.pxn == "on", progress=progress,
                                    explain=args.explain)
    except InputError as exc:
        if exc.file or exc.field not in COLLECTIVE_FLAGS:
            raise sets.located(exc) from None
        raise exc.rebuilt(field=COLLECTIVE_FLAGS[exc.field]) from None
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0


def _cmd_validate_published(args: argparse.Namespace) -> int:
    from simulator.report.atomic import write_bytes
    from simulator.validation import (
        DEFAULT_FOLDER,
        DEFAULT_REPORT,
        outside_summary,
        published_cases,
        render,
        result_line,
        run_cases,
    )

    folder = Path(args.folder) if args.folder else DEFAULT_FOLDER
    out = Path(args.out) if args.out else DEFAULT_REPORT
    paths = published_cases(folder, args.case)
    if not args.case and not out.parent.is_dir():
        raise InputError(f"no folder {out.parent} to write the report into", field="--out",
                         allowed="a file in an existing folder")
    results = run_cases(paths, workers=_published_workers(args))
    for result in results:
        print(result_line(result))
    print(outside_summary(results))
    if not args.case:  # the report moved in whole: a write stopped halfway left the earlier one cut short
        write_bytes(out, render(results).encode())
        print(f"wrote {out}")
    return 0 if all(result.within for result in results) else 1


def _published_workers(args: argparse.Namespace) -> int:
    """validate-published's worker processes: --workers, or the deprecated --jobs (its name before the CLI
    called parallel worker processes --workers everywhere), with a note on stderr."""
    if args.jobs is None:
        return PUBLISHED_WORKERS if args.workers is None else int(args.workers)
    if args.workers is not None:
        from simulator.console.paths import option_error

        raise option_error("--jobs", "the old name of --workers; give one of them", "--workers N alone")
    print("trainsim validate-published: --jobs is deprecated, use --workers", file=sys.stderr)
    return int(args.jobs)


COLLECTIVE_REMEDIES = "fewer ranks (--ranks N, or a smaller cluster: {sizes}) or another --op"
"""What `trainsim collective` offers where a size is too large, refused or out of memory; ``sizes``: the
cluster's size parameters (`--set nodes=N`), or `--set` where they are not known."""
SLOW_SIZE_S = 2.0
"""From this many CPU seconds a size on (`scale.collective_cost`), `trainsim collective` says how long each will
take before it starts: on a core of its own a size takes about its CPU time, on a loaded machine several times it
(1,024 ranks' all-to-all of 1 MiB, ~1 M flows, is announced at about 20 s of CPU)."""


def _refuse_large_collective(args: argparse.Namespace, spec, gpus: int | None,
                             planned: tuple[int, AlgorithmName] | None = None) -> CollectiveCost | None:
    """Refuse, before it runs, `trainsim collective`'s op over more ops and flows or memory a size than the scale
    limits allow a run (scale.py `collective_cost`), unless --force; else return what its slowest size is expected
    to cost. ``planned``: the most flows a size's plan posts and the algorithm it runs (`_planned_flows`); without
    them (None) the rings a `workload:` item of the op counts (an all-to-all's or a send_recv's direct transfers),
    fewer than a tree posts, so that from the GPU count alone (the cluster not yet built) a refusal is already sure.
    An op or a rank count the sweep refuses is left to it (None)."""
    from simulator.console.paths import option_error
    from simulator.scale import collective_cost
    from simulator.topology.size import SIZE_PARAMETERS, host_shape

    if gpus is None:
        return None
    ranks = args.ranks or gpus
    if args.op not in PRIMITIVES or not 2 <= ranks <= gpus:
        return None
    cost = collective_cost(args.op, ranks, gpus, host_shape(spec), planned, args.network)
    estimate = cost.estimate
    if estimate.over_limits() and not args.force:
        hosts = " or ".join(f"--set {name}=N" for name in SIZE_PARAMETERS.get(spec.kind, ()))
        raise option_error("--ranks" if args.ranks else "--topology",
                           f"{args.op} over {estimate.simulated_ranks:,} GPUs is too large to simulate: "
                           f"~{estimate.ops:,} ops, ~{estimate.flows:,} flows, "
                           f"~{estimate.memory_bytes / 2**30:,.1f} GiB of memory a size; {estimate.beyond()}",
                           f"{COLLECTIVE_REMEDIES.format(sizes=hosts or '--set')}; or pass --force")
    return cost


def _planned_flows(args: argparse.Namespace, topology, sizes: list[float]) -> tuple[int, AlgorithmName] | None:
    """`scale.planned_collective` of `trainsim collective`'s op on the built ``topology``: the most transfers a size
    posts and the algorithm that plan runs; None where it needs no plan, and where the sweep refuses the op, its
    choices or its ranks (the sweep names what it refuses)."""
    from simulator.scale import planned_collective

    ranks = args.ranks or topology.num_gpus
    if (args.op not in PRIMITIVES or not 2 <= ranks <= topology.num_gpus
            or args.algorithm not in ALGORITHM_CHOICES or args.protocol not in PROTOCOL_CHOICES):
        return None
    try:
        return planned_collective(args.op, ranks, topology, sizes, args.algorithm, args.protocol, args.efficiency,
                                  args.chunk)
    except ScenarioError:
        return None


def _refuse_large_cluster(spec, option: str, purpose: str, *, force: bool) -> None:
    """Refuse, before building it, a cluster beyond MAX_QUICK_GPUS (read off the topology's parameters, given by
    the command's ``option``) that the command would spend minutes on, unless ``force``."""
    from simulator.console.paths import option_error
    from simulator.topology.size import MAX_QUICK_GPUS, topology_gpus

    gpus = topology_gpus(spec)
    if gpus is not None and gpus > MAX_QUICK_GPUS and not force:
        raise option_error(option, f"{spec.name} has {gpus:,} GPUs, too many to {purpose}",
                           f"at most {MAX_QUICK_GPUS:,} GPUs: a smaller cluster (--set), or pass --force")


TOPO_FILE = "TOPOLOGY"
"""`trainsim topo`'s topology argument, as its usage names it and an error in it is located."""
TOPO_PICTURE = "topology.png"
"""`trainsim topo draw`'s image without --output."""


@dataclass(frozen=True)
class ReadBy:
    """The options of a command that only some values of its positional ``argument`` read (`plot`'s chart,
    `topo`'s action): for each option, by its dest, those values. Options it does not name are read by every
    value. An option given to a value that does not read it is refused (`refuse_unread`), and an unknown option
    is refused listing only the options the value given reads (`_Parser`)."""

    argument: str
    options: dict[str, tuple[str, ...]]
    noun: str
    """A value (or several joined by 'or') as the refusal names it: 'a {} chart'."""

    def reads(self, dest: str, value: str | None) -> bool:
        return value is None or value in self.options.get(dest, (value,))

    def named(self, values: tuple[str, ...]) -> str:
        return self.noun.format(" or ".join(values))

    def refuse_unread(self, args: argparse.Namespace) -> None:
        """Refuse an option given (not left at None or False) that the value of ``argument`` does not read."""
        value = getattr(args, self.argument)
        for option, values in self.options.items():
            if getattr(args, option) not in (None, False) and not self.reads(option, value):
                raise InputError(f"not read by {self.named((value,))}", field="--" + option.replace("_", "-"),
                                 allowed=self.named(values))


TOPO_OPTIONS = ReadBy("action", {"output": ("draw",)}, "topo {}")
"""The `trainsim topo` options only some of its actions read: --output, the picture that draw saves."""


def _cmd_topo(args: argparse.Namespace) -> int:
    from simulator.console.paths import option_error
    from simulator.errors import TopologyError
    from simulator.topology.describe import describe_topology, draw_topology
    from simulator.topology.loader import build_source, read_topology
    from simulator.topology.size import SIZE_PARAMETERS

    TOPO_OPTIONS.refuse_unread(args)
    sets = TopologySets.read(args.set)
    try:
        spec = read_topology(args.file, sets.values)
    except InputError as exc:
        if exc.file:
            raise sets.located(exc) from None
        raise option_error(TOPO_FILE, exc.problem, exc.allowed) from None
    _refuse_large_cluster(spec, TOPO_FILE, f"{args.action} in seconds (building it takes minutes)",
                          force=args.force)
    try:
        topology = build_source(spec)
    except InputError as exc:
        raise sets.located(exc) from None
    sets.warn_kept_node(topology, "trainsim topo")
    if args.action == "describe":
        sizes = SIZE_PARAMETERS.get(str(topology.params.get("kind")), ())
        changed = tuple(name for name in (item.split("=", 1)[0].strip() for item in args.set) if name not in sizes)
        print(describe_topology(topology, changed))
    else:
        try:
            output = chosen_figure_file(args.output, TOPO_PICTURE)
            draw_topology(topology, output)
        except TopologyError as exc:
            raise option_error(TOPO_FILE, exc.problem, exc.allowed) from None
        print(f"wrote {output}")
    return 0


def _cmd_study(args: argparse.Namespace) -> int:
    """A study's points, and its lines; a checkpoint-interval study without --intervals runs `default_grid`'s (a
    memory-interval one `memory_grid`'s), printed first (the healthy step's warnings then come with the grid,
    before the points)."""
    from simulator.reliability.study import (
        DEFAULT_MULTIPLIERS,
        default_grid,
        memory_grid,
        parse_intervals,
        parse_multipliers,
        refuse_sets_on_varied_field,
        run_study,
        write_study,
    )
    from simulator.report.run_folder import STUDY_FOLDER

    out = output_folder(args.out, STUDY_FOLDER)
    intervals: Sequence[float | str] = parse_intervals(args.intervals) if args.intervals is not None else []
    multipliers = (parse_multipliers(args.multipliers) if args.multipliers is not None
                   else list(DEFAULT_MULTIPLIERS[args.study]))
    from simulator import load_scenario
    from simulator.console.progress import RunProgress

    loaded = load_scenario(args.scenario, args.set)  # the points change no layout or training

    def warn(summary: dict) -> None:
        _warn("study", summary.get("warnings", []), summary, loaded)

    on_healthy_step: Callable[[dict], None] | None = warn
    grids = {"checkpoint-interval": default_grid, "memory-interval": memory_grid}
    if args.study in grids and args.intervals is None:
        refuse_sets_on_varied_field(loaded, args.study)  # before the grid, which takes seconds; else run_study's
        grid = grids[args.study](loaded, args.force, warn, multipliers)
        print(_grid_line(grid))
        intervals, on_healthy_step = grid.intervals_s, None

    flags = _flags(loaded, STUDY_OPTIONS)

    def warn_points(warned: list[dict]) -> None:
        _warn("study", [f"{_point_name(w)}: {on_command_line(w['warning'], 'trainsim study', flags)}"
                        for w in warned], {}, loaded)

    with RunProgress(enabled=not args.quiet, unit="points", description="simulating the study") as progress:
        ahead = progress.counting("states", "simulating cluster states ahead", eta=True)
        study = run_study(args.scenario, args.set, intervals, multipliers, force=args.force, progress=progress,
                          on_healthy_step=on_healthy_step, on_point_warnings=warn_points,
                          on_scenario_warnings=lambda warned: _warn("study", warned, {}, loaded), workers=args.workers,
                          states_progress=ahead, states_sharing=ahead.sharing,
                          foresight_progress=progress.counting("replications", FORESEEING),
                          workers_warning=_warn_line, study=args.study)
    files = write_study(out, study)
    for curve in study["curves"]:
        if curve["warnings"]:
            where = _point_name({"rate_multiplier": curve["rate_multiplier"],
                                 "interval_s": curve["warnings_interval_s"]})
            _warn("study", [f"{where}: {on_command_line(warning, 'trainsim study', flags)}"
                            for warning in curve["warnings"]], {}, loaded)
        print(_study_line(curve))
        for line in _study_table(curve, loaded.scenario.costs.currency):
            print(f"  {line}")
    print(f"wrote {args.out}: {', '.join(files)}")
    return 0


def _point_name(point: dict) -> str:
    """A study point as its warnings name it: 'rate x 1, interval 10 min' (format_duration, as the intervals
    the warnings quote: a 60 d point read 'interval 5,184,000 s' before '... every 60 d is longer than ...')."""
    from simulator.units import format_duration

    return f"rate x {point['rate_multiplier']:g}, interval {format_duration(point['interval_s'])}"


def _grid_line(grid: IntervalGrid) -> str:
    """The default intervals of a checkpoint-interval study: how many run and the range they span over the Daly
    interval they are built around, and each in whole steps with its duration; where they are not the 9 planned
    points (`DEFAULT_GRID_FACTORS`), why: how many rounding to whole steps merged or raised to one step or the
    async write floor, the point added below that floor, how many were left out past the horizon or not longer
    than the in-memory interval. Its durations are read side by side, so keep their trailing zeros
    (`seconds_alike`: '591.0 s' beside '295.5 s', not '591 s')."""
    from simulator.reliability.study import DEFAULT_GRID_FACTORS
    from simulator.units import counted, seconds_alike

    points = ", ".join(f"{steps:,} ({seconds_alike(steps * grid.step_s)})" for steps in grid.steps)
    low, high = (steps * grid.step_s / grid.centre_s for steps in (grid.steps[0], grid.steps[-1]))
    merged = (len(DEFAULT_GRID_FACTORS) - len(grid.steps) + (grid.cliff_steps is not None) - grid.past_horizon
              - grid.past_storage - grid.under_memory)
    rounded = [f"{counted(merged, 'point')} merged in rounding"] if merged else []
    if grid.past_horizon:
        rounded.append(f"{grid.past_horizon} past run.horizon left out")
    if grid.past_storage:
        rounded.append(f"{grid.past_storage} not below the storage interval left out")
    if grid.under_memory:
        rounded.append(f"{grid.under_memory} not longer than the in-memory interval "
                       f"({counted(grid.memory_steps, 'step')}) left out")
    if grid.clamped and grid.floor_steps > 1:
        rounded.append(f"{grid.clamped} below the {counted(grid.floor_steps, 'step')} that hold the async write "
                       f"raised to them")
    elif grid.clamped:
        rounded.append(f"{grid.clamped} below half a step raised to one step")
    if grid.cliff_steps is not None:
        rounded.append(f"{counted(grid.cliff_steps, 'step')} kept below them: checkpoints that wait for the write")
    rate = f" at rate x {grid.rate_multiplier:.3g}" if grid.rate_multiplier != 1 else ""
    ran = (f"intervals (no --intervals): {counted(len(grid.steps), 'point')} from {low:.3g} to {high:.3g} times "
           f"{grid.centre} {seconds_alike(grid.centre_s)}{rate}")
    rounding = f"in ratios of sqrt 2 rounded to whole steps of {seconds_alike(grid.step_s)}"
    if rounded:
        rounding = (f"of {len(DEFAULT_GRID_FACTORS)} planned from 1/4 to 4 times it {rounding} "
                    f"({', '.join(rounded)})")
    return f"{ran}, {rounding}: {points} steps"


FEW_REPLICATIONS = 3
"""Replications below which a study line says its 95% interval is too few to read: with 2, Student's t of one
degree of freedom (12.7) spans ETTR 0% to 100%."""


def _study_line(curve: dict) -> str:
    """One multiplier's line: its system MTBF, the best interval tried (or, with one interval, that interval and
    its ETTR's 95% interval: an `mtbf` study's point is no optimum, said too few where `FEW_REPLICATIONS`), the
    checkpoint cost C that Young's and Daly's intervals take (sqrt(2 C M) checks by hand), Young's and Daly's
    intervals, all of these
    intervals in one unit (`durations_alike`: 'interval 20 min; Young 805 s' had them compared across units);
    the ETTR marked invalid where the healthy step is out of memory, as a job's table marks it."""
    from simulator.console.report import long_duration
    from simulator.metrics.summary import OOM_FIGURES
    from simulator.units import durations_alike, format_seconds

    cost = (f", C {format_seconds(curve['young_daly_cost_s'])}" if curve.get("young_daly_cost_s") is not None
            and curve["young_interval_s"] is not None else "")
    mtbf = f" (MTBF {long_duration(curve['mtbf_s'])}{cost})" if curve["mtbf_s"] is not None else ""
    steps, edge = _steps_and_edge(curve)
    in_unit = durations_alike(_printed_intervals(curve))
    interval = in_unit(curve["best_interval_s"])
    few = (f", {curve['replications']} replications: too few for an interval worth reading"
           if (curve.get("replications") or FEW_REPLICATIONS) < FEW_REPLICATIONS else "")
    if len(curve["points"]) == 1:
        point = curve["points"][0]
        spread = (f", 95%: {100 * point['ettr_ci95_low']:.2f}% to {100 * point['ettr_ci95_high']:.2f}%{few}"
                  if point["ettr_ci95_low"] is not None else "")
        result = f"interval {interval}, {steps} (ETTR {100 * curve['best_ettr']:.2f}%{spread})"
    elif curve["flat"]:
        ettr = [100 * point["ettr"] for point in curve["points"]]
        best = next(point for point in curve["points"] if point["interval_s"] == curve["best_interval_s"])
        result = (f"flat within the 95% intervals: ETTR {min(ettr):.2f}% to {max(ettr):.2f}% over the "
                  f"{len(ettr)} intervals tried, all inside the best's 95% interval "
                  f"({100 * best['ettr_ci95_low']:.2f}% to {100 * best['ettr_ci95_high']:.2f}%{few}); highest at "
                  f"{interval}, {steps}")
    else:
        result = (f"best interval {interval}, {steps} (ETTR {100 * curve['best_ettr']:.2f}%){edge}"
                  f"{_paired_text(curve, in_unit)}")
    invalid = f"; {OOM_FIGURES}" if curve.get("oom") else ""
    return f"rate x {curve['rate_multiplier']:g}{mtbf}: {result}{invalid}; {_optimum_text(curve, in_unit)}"


def _paired_text(curve: dict, interval: Callable[[float], str]) -> str:
    """The neighbours the best point is not told apart from by the paired 95% interval of their ETTR difference
    (`study.paired_differences`), in percentage points of ETTR (pp: a difference of two percentages), with the
    fitted optimum, the better figure then; '' where it is told apart from both."""
    close = [point for point in curve.get("best_against_neighbours", ()) if not point["told_apart"]]
    if not close:
        return ""
    spans = ", ".join(f"{interval(point['interval_s'])} ({100 * point['ci95_low']:+.3f} to "
                      f"{100 * point['ci95_high']:+.3f} pp)" for point in close)
    fitted = curve.get("fitted_optimum_s")
    read = f"; read the fitted optimum, {interval(fitted)}" if fitted is not None else ""
    return f", not told apart from {spans} by the paired 95% interval of its ETTR less theirs{read}"


def _printed_intervals(curve: dict) -> list[float]:
    """The intervals a study curve's line prints: the best tried, Young's and Daly's where failures interrupt the
    job and the write floor where the line names it (`young_daly_durations`), and the two-level optimum's
    intervals with an in-memory tier (`two_level_text`)."""
    from simulator.console.report import young_daly_durations

    young_daly = young_daly_durations(curve) if curve["young_interval_s"] is not None else []
    two_level = curve.get("two_level") or {}
    tiers = [two_level[key] for key in ("memory_interval_s", "storage_interval_s") if two_level.get(key) is not None]
    return [curve["best_interval_s"], *young_daly, *tiers]


def _optimum_text(curve: dict, interval: Callable[[float], str]) -> str:
    """Young's and Daly's intervals (and with an in-memory tier the two-level optimum, with the restores of the
    best point that found no in-memory copy, said to be the best interval's, not the curve's), or why there are
    none: no failure interrupts the job. Its degradations and stragglers, where it expects some, are named with
    their count: they cost time though they take no restart, so "no failures expected" alone would mislead."""
    from simulator.console.report import horizon_span, two_level_text, young_daly_text
    from simulator.units import expected_count

    if curve["young_interval_s"] is not None:
        two_level = curve.get("two_level")
        lost = curve.get("best_copies_lost") or 0.0
        return young_daly_text(curve, interval) + (
            f"; {two_level_text(two_level, interval, lost, ' at the best interval')}" if two_level else "")
    if not curve["expected_slowdowns"]:
        return "no failures expected, so no Young or Daly interval"
    expected = expected_count(curve["expected_slowdowns"], "degradation or straggler", "degradations or stragglers")
    slowdowns = f"{expected} in {horizon_span(curve['horizon_s'])}"
    return (f"no failure expected that interrupts the job, only {slowdowns} (slower steps, no restart), so no Young or "
            "Daly interval")


RESOURCE_COLUMNS = (("gpu_hours_per_million_tokens", "GPU-h per 1M tokens"),
                    ("cost_per_million_tokens", "cost per 1M tokens"))
"""study.csv's resource columns the per-interval table prints where the points have them (a job with tokens;
the cost where `costs.gpu_hour_price` is given), with their heading; four significant digits, as the console's
rows (a cost per million tokens is often under 0.10)."""


def _study_table(curve: dict, currency: str) -> list[str]:
    """The lines of a curve's per-interval table, one per interval tried (none with one interval, which the study
    line gives whole): its duration (one unit for all, `durations_alike`), whole steps, ETTR with its 95%
    interval, goodput (tokens/s, or healthy-equivalent steps/s where the step states no tokens) and, where the
    points have them, GPU-hours and cost per million tokens (`RESOURCE_COLUMNS`, in ``currency``). The line named
    the best interval only: what a 30-minute interval costs against Young's was in study.csv alone."""
    from simulator.units import durations_alike, four_digits

    points = sorted(curve["points"], key=lambda point: point["interval_s"])
    if len(points) < 2:
        return []
    in_unit = durations_alike([point["interval_s"] for point in points])
    tokens = any(point.get("goodput_tokens_per_s") is not None for point in points)
    goodput = "goodput_tokens_per_s" if tokens else "goodput_steps_per_s"
    number = "{:,.0f}" if tokens else "{:,.4g}"
    resources = [(key, f"{heading} ({currency})" if key.startswith("cost") else heading)
                 for key, heading in RESOURCE_COLUMNS if any(point.get(key) is not None for point in points)]
    header = ["interval", "steps", "ETTR (95% interval)",
              f"goodput {'tokens/s' if tokens else 'healthy-equivalent steps/s'} (95% interval)",
              *(heading for _, heading in resources)]
    rows = [header]
    for point in points:
        ettr = "n/a" if point.get("ettr") is None else f"{100 * point['ettr']:.2f}%"
        if point.get("ettr_ci95_low") is not None:
            ettr += f" ({100 * point['ettr_ci95_low']:.2f}% to {100 * point['ettr_ci95_high']:.2f}%)"
        rate = "n/a" if point.get(goodput) is None else number.format(point[goodput])
        if point.get(f"{goodput}_ci95_low") is not None:
            rate += (f" ({number.format(point[f'{goodput}_ci95_low'])} to "
                     f"{number.format(point[f'{goodput}_ci95_high'])})")
        rows.append([in_unit(point["interval_s"]), f"{point['interval_steps']:,}", ettr, rate,
                     *("" if point.get(key) is None else four_digits(point[key]) for key, _ in resources)])
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    return ["  ".join(cell.rjust(width) if column in (0, 1) else cell.ljust(width)
                      for column, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]


def _steps_and_edge(curve: dict) -> tuple[str, str]:
    """The best interval's whole steps (what the job ran: the interval asked for, rounded) and, where it is the
    shortest or longest of several tried, that the optimum may lie beyond them ('1min' printed as 61.17 s, and
    the best at the edge of the grid read as the optimum); not shorter where the shortest is one step, at the
    async write floor (`write_floor_steps`) or within a step of Young's interval or below it (Llama 3 70B's
    study from Young's 4.944 min was told its optimum may be shorter)."""
    from simulator.units import counted

    points = curve["points"]
    best = next(point for point in points if point["interval_s"] == curve["best_interval_s"])
    steps = counted(best["interval_steps"], "step")
    tried = sorted({point["interval_s"] for point in points})
    if len(tried) < 2 or tried[0] < best["interval_s"] < tried[-1]:
        return steps, ""
    if best["interval_s"] == tried[-1]:
        return steps, ", the longest tried: the optimum may be longer"
    # a checkpoint every step is as often as a job checkpoints
    if best["interval_steps"] <= 1:
        return steps, ""
    if best["interval_steps"] <= (curve.get("write_floor_steps") or 0):
        return steps, ", the shortest tried: at the async write floor, below which each checkpoint waits for the write"
    young = curve.get("young_interval_s")
    if young is not None and best["interval_s"] <= young + best["interval_s"] / best["interval_steps"]:
        return steps, ", the shortest tried: within a step of Young's interval or below it"
    return steps, ", the shortest tried: the optimum may be shorter"


def _plot_goodput(args: argparse.Namespace) -> int:
    from simulator.reliability.plots import goodput_figure, load_study
    from simulator.report.outputs import save_figure
    from simulator.report.run_folder import record_figure

    study = load_study(Path(args.outdir))
    output = chosen_figure_file(args.output, str(Path(args.outdir) / "goodput.png"))
    save_figure(goodput_figure(study), output)
    record_figure(Path(args.outdir), output)
    print(f"wrote {output}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from simulator.report.gantt import gantt_figure
    from simulator.report.memory_timeline import memory_figure
    from simulator.report.outputs import load_run_outputs, save_figure
    from simulator.report.run_folder import record_figure

    PLOT_OPTIONS.refuse_unread(args)
    if args.chart == "goodput":
        return _plot_goodput(args)
    if args.chart in STUDY_CHARTS:
        from simulator.report.study_plots import default_heatmap_axes, default_sweep_x, study_figure

        x, y = args.x, args.y
        if args.chart == "sweep" and x is None:
            x = default_sweep_x(Path(args.outdir))
            print(f"--x {x}: the one field the sweep varies")
        if args.chart == "heatmap" and args.value is not None and (x is None or y is None):
            x, y = default_heatmap_axes(Path(args.outdir), x, y)
            filled = [f"{flag} {name}" for flag, name, given in (("--x", x, args.x), ("--y", y, args.y)) if not given]
            print(f"{' '.join(filled)}: the {'two fields' if len(filled) == 2 else 'other field'} the sweep varies")
        figure = study_figure(args.chart, Path(args.outdir), x=x, y=y, hue=args.hue, value=args.value,
                              log_x=args.log_x)
        folder = Path(args.outdir) if Path(args.outdir).is_dir() else Path(args.outdir).parent
        output = chosen_figure_file(args.output, str(folder / f"{args.chart}.png"))
        save_figure(figure, output)
        record_figure(folder, output)
        print(f"wrote {output}")
        return 0
    # a given --output is checked before the run is read; the default one inside OUTDIR after, so that an OUTDIR
    # that is no run folder is refused as such (it was blamed on the --output no one gave)
    given = chosen_figure_file(args.output, "") if args.output is not None else None
    run = load_run_outputs(Path(args.outdir))
    output = given or chosen_figure_file(None, str(Path(args.outdir) / f"{args.chart}.png"))
    if args.chart == "gantt":
        ranks = _run_ranks(args.ranks, run)
        window = _window(args.window)
        end_s = float(run.timeline["end_s"].max()) if len(run.timeline) else 0.0
        if end_s <= 0:
            from simulator.report.run_folder import outdir_error

            raise outdir_error(Path(args.outdir), "every op of this run ends at 0 s: a Gantt chart has no time to draw",
                               "the folder of a run whose ops take time")
        if window is not None and window[0] >= end_s:
            raise InputError(f"{args.window!r} starts after the run's last op ends, at {end_s:.6g} s",
                             field="--window", allowed=f"a window that starts before {end_s:.6g} s")
        figure = gantt_figure(run.timeline, run.summary, by=args.by or GANTT_ROWS[0], ranks=ranks, window=window)
    else:
        ranks = _run_ranks(args.ranks, run)
        if not run.summary.get("peak_memory_gib"):
            from simulator.report.run_folder import outdir_error

            raise outdir_error(Path(args.outdir), "this run models no memory (synthetic per-stage costs report it as "
                                                  "0 GiB): its chart would be flat lines at 0",
                               "the folder of a run of a model with dimensions or a preset")
        figure = memory_figure(run.timeline, run.summary, ranks=ranks)
    save_figure(figure, output)
    record_figure(Path(args.outdir), output)
    print(f"wrote {output}")
    return 0


PLOT_OPTIONS = ReadBy("chart", {"by": ("gantt",), "window": ("gantt",), "ranks": ("gantt", "memory"),
                               "x": ("sweep", "heatmap"), "y": ("sweep", "heatmap"), "hue": ("sweep",),
                               "value": ("heatmap",), "log_x": ("sweep",)}, "a {} chart")
"""The `trainsim plot` options each chart reads; the others are refused rather than silently ignored."""


def _run_ranks(text: str | None, run) -> list[int] | None:
    """--ranks of a run's chart: ranks the run has, each with ops of its own (not folded away)."""
    from simulator.report.outputs import refuse_ranks_without_ops

    ranks = _ranks(text)
    gpus = int(run.summary.get("gpus", 0))
    if ranks is not None and any(not 0 <= rank < gpus for rank in ranks):
        raise InputError(f"{text!r} names ranks the run does not have", field="--ranks", allowed=f"0..{gpus - 1}")
    refuse_ranks_without_ops(ranks or (), run.timeline, "--ranks")
    return ranks


def _window(text: str | None) -> tuple[float, float] | None:
    """--window START:END (durations with units, e.g. 0:5ms or 1.2s:1.4s) in seconds."""
    from simulator.report.gantt import WINDOW_RULE, window_problem
    from simulator.units import parse_duration

    if text is None:
        return None
    parts = text.split(":")
    allowed = f"START:END with units, e.g. 0:5ms or 1.2s:1.4s, {WINDOW_RULE}"
    if len(parts) != 2:
        raise InputError(f"{text!r} is not START:END", field="--window", allowed=allowed)
    try:
        low, high = (parse_duration(part.strip() or "0") for part in parts)
    except InputError as exc:
        raise exc.rebuilt(field="--window", allowed=allowed) from None
    problem = window_problem(low, high)
    if problem:
        raise InputError(f"{text!r}: {problem}", field="--window", allowed=allowed)
    return low, high


def _ranks(text: str | None) -> list[int] | None:
    """--ranks 0,2,4 or 0-7 (inclusive ranges, low to high), in the order given."""
    if text is None:
        return None
    ranks: list[int] = []
    allowed = "e.g. 0,2,4 or 0-7, each range from low to high"
    for part in text.split(","):
        bounds = [bound.strip() for bound in part.split("-")]
        if not 1 <= len(bounds) <= 2 or not all(bound.isascii() and bound.isdigit() for bound in bounds):
            raise InputError(f"{text!r} is not a rank list", field="--ranks", allowed=allowed)
        low, high = int(bounds[0]), int(bounds[-1])
        if high < low:
            raise InputError(f"{part!r} is a range from high to low", field="--ranks", allowed=allowed)
        ranks += list(range(low, high + 1))
    return ranks


def shared_steps_note(shared: int, executor: ExecutorName, workers: int) -> str:
    """The note that ``shared`` job points of a sweep share their cluster states' steps, where the local pool of
    ``workers`` would simulate them in each worker (a 4-point sweep took 105.0 s on a pool of 2 against 42.2 s
    serial, docs/studies.md); '' otherwise."""
    if shared < 2 or executor != "local" or workers < 2:
        return ""
    return (f"note: {shared:,} job points share their cluster states' steps (the same step sections): --executor "
            f"serial simulates each once, and ahead on every core, where each of the {workers:,} local workers "
            "simulates them again")


SHOWN_REASONS = 3
"""How many reasons of one status the sweep's end line prints, each with its first point and how many share it;
the rest are counted."""


def _cmd_sweep(args: argparse.Namespace) -> int:
    from simulator.config.loader import set_flag
    from simulator.report.run_folder import SWEEP_FOLDER
    from simulator.sweep.console_table import format_sweep_table
    from simulator.sweep.executors import check_executor_options, make_executor
    from simulator.sweep.runner import progress_printer, run_sweep
    from simulator.sweep.spec import load_sweep
    from simulator.units import counted

    check_executor_options(args.executor, args.workers, args.scheduler)
    out = output_folder(args.out, SWEEP_FOLDER)
    sweep = load_sweep(args.sweep, max_points=args.max_points, overrides=args.set)
    for warning in sweep.warnings:
        _warn_line(warning)
    executor = make_executor(args.executor, args.workers, args.scheduler)
    note = shared_steps_note(sweep.shared_steps, args.executor, executor.workers)
    if note:
        _stderr_line(note)
    update, stop, say = progress_printer(args.quiet)
    try:
        report = run_sweep(sweep, out, executor, point_outputs=args.point_outputs, force=args.force,
                           on_progress=update, on_point=say, csv_columns=args.csv_columns)
    except KeyboardInterrupt as exc:
        stop()
        word, code = _stopped_by(exc)
        print(f"{word}: the finished points are in {out}/results.parquet; run again to resume", file=sys.stderr)
        return code
    except WorkerKilled as exc:
        raise WorkerKilled(f"{exc}; the finished points are in {out}/results.parquet; run again to resume") from None
    finally:
        stop()
        executor.close()
    counts = ", ".join(f"{count} {status}" for status, count in report.statuses.items())
    print(f"sweep: {counted(len(sweep.points), 'point')} ({counts}; {report.reused} reused) on "
          f"{counted(executor.workers, f'{args.executor} worker')}; wrote {out}/results.parquet, {out}/results.csv")
    for status, groups in report.reasons.items():
        for reason, points in groups[:SHOWN_REASONS]:
            others = len(points) - 1
            print(f"  {status}: point {points[0]}" + (f" (and {counted(others, 'other')})" if others else "") +
                  f": {on_command_line(reason, 'trainsim sweep', map(set_flag, args.set))}")
        if rest := groups[SHOWN_REASONS:]:
            print(f"  {status}: {counted(sum(len(points) for _, points in rest), 'point')} more, for "
                  f"{counted(len(rest), 'other reason')}: see {out}/results.csv's error column")
    table = "" if args.quiet else format_sweep_table(report.results, out)
    if table:
        print(table)
    return 0


def _refused(problem: str, allowed: str) -> argparse.ArgumentTypeError:
    """An argparse type's refusal with what the flag allows, as every other bad input says it
    (`_Parser.error` puts it on the one line)."""
    return argparse.ArgumentTypeError(f"{problem} (allowed: {allowed})")


INT_LIST_ALLOWED = "whole numbers of 1 or more, comma-separated, e.g. 1,2,4"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise _refused(f"{text!r} is not a comma list of whole numbers", INT_LIST_ALLOWED) from None
    if any(value < 1 for value in values):
        raise _refused(f"{text!r} has a value below 1", INT_LIST_ALLOWED)
    return values


def _at_least(minimum: int):
    """An argparse type: a whole number no smaller than ``minimum`` (a negative worker count made the Dask
    LocalCluster wait forever for workers, and the local pool raise a traceback)."""
    allowed = f"a whole number, {minimum} or more"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _refused(f"{text!r} is not a whole number", allowed) from None
        if value < minimum:
            raise _refused(f"{text!r} is below {minimum}", allowed)
        return value
    return parse


def _listed(values: tuple[object, ...]) -> str:
    """``values`` as a comma list, the way the list options take them (`--cp 1,2`)."""
    return ",".join(map(str, values))


def _choice_list(choices: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(text.split(","))
        bad = [value for value in values if value not in choices]
        if bad:
            allowed = f"{LIST_OF}{', '.join(choices)}"
            raise _refused(f"{bad[0]!r} is not a choice{did_you_mean(bad[0], allowed)}", allowed)
        return values
    return parse


def _cmd_search(args: argparse.Namespace) -> int:
    from simulator.console.progress import RunProgress
    from simulator.report.run_folder import SEARCH_FOLDER
    from simulator.sweep.executors import check_executor_options, make_executor
    from simulator.sweep.layouts import SPACE_FLAGS, SearchSpace
    from simulator.sweep.report import format_search, write_search
    from simulator.sweep.results import simulations_done
    from simulator.sweep.runner import progress_printer
    from simulator.sweep.search import search_layouts

    check_executor_options(args.executor, args.workers, args.scheduler)
    out = output_folder(args.out, SEARCH_FOLDER)
    given = {name: getattr(args, name) for name in SPACE_FLAGS if getattr(args, name) is not None}
    executor = make_executor(args.executor, args.workers, args.scheduler)
    update, stop, say = progress_printer(args.quiet, "search")
    stopped: SearchStopped | None = None
    try:
        result = search_layouts(args.scenario, executor, space=SearchSpace(**given), top=args.top,
                                overrides=args.set, force=args.force, on_progress=update,
                                on_phase=update.doing if isinstance(update, RunProgress) else None, on_layout=say)
    except SearchStopped as exc:
        stopped, result = exc, exc.result
    except WorkerKilled as exc:
        raise WorkerKilled(f"{exc}; the search wrote nothing; run it again, with fewer --workers if memory is "
                           "short") from None
    finally:
        stop()
        executor.close()
    files = write_search(out, result, args.scenario, args.set)
    if stopped is not None:
        done, of = simulations_done(result.table["status"])
        word, code = _stopped_by(stopped)
        return _fail(f"{word}: the search stopped after {done} of {of} layout simulations; "
                     f"wrote {out}: {', '.join(files)} (the rest 'stopped' in candidates.csv); "
                     "run again to search anew", code)
    print(format_search(result, args.scenario))
    print(f"wrote {out}: {', '.join(files)} (candidates: every layout, with why it was pruned)")
    if result.winner is None:  # a script must tell this from a search that found a layout
        return _fail(f"error: no layout of the search fits and simulates; {out}/candidates.csv says why each "
                     "was pruned or failed", EXIT_RUNTIME)
    return 0


class _VersionAction(argparse.Action):
    """`--version`, with the installed version looked up only when asked (importlib.metadata costs tens of
    milliseconds at every start otherwise)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from simulator.report.run_folder import trainsim_version

        print(f"trainsim {trainsim_version()}")
        parser.exit()


ARGUMENT_ERROR = re.compile(r"argument (?P<field>[^:]+): (?P<problem>.*)", re.S)
"""argparse's refusal of one argument's value: "argument --ranks: '0' is below 2 (allowed: ...)"."""
UNRECOGNIZED_IN = "_unrecognized_in"
"""The namespace attribute naming the innermost parser left with arguments it does not take."""
CHOICES = re.compile(r"invalid choice: (?P<value>'[^']*') \(choose from (?P<choices>.*)\)", re.S)


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors in the same one-line form as every other error (status 2): a refused
    value as `command line: FLAG: problem (allowed: ...)`, argparse's own choices among them. ``read_by``: the
    options only some values of a positional argument read (`ReadBy`)."""

    def __init__(self, *args, read_by: ReadBy | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read_by = read_by

    def _arguments_allowed(self) -> str:
        """What a command missing an argument takes: its subcommands, else what its help lists."""
        commands = next((action.choices for action in self._actions
                         if isinstance(action, argparse._SubParsersAction)), None)
        listed = f"{', '.join(commands)}; " if commands else ""
        return f"{listed}`{self.prog} --help` says what each takes"

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, noting on the namespace the innermost (sub)command left with arguments it does not
        take, so that `parse_args` refuses them with that command's options rather than the top level's."""
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(namespace, UNRECOGNIZED_IN):
            setattr(namespace, UNRECOGNIZED_IN, self)
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        refusing = vars(namespace).pop(UNRECOGNIZED_IN, self)
        if extras:
            options = refusing._options(namespace)
            refusing.exit(EXIT_INPUT, f"error: {command_line(refusing.prog)}: unrecognized arguments: "
                                      f"{' '.join(extras)}{did_you_mean(extras[0], options)} (allowed: {options})\n")
        return namespace

    def _options(self, namespace: argparse.Namespace) -> str:
        """The options this command takes, each by its long name: those the value given of its positional
        argument reads, where only some values read some (`trainsim plot gantt` lists --by, not --hue), with
        that value named."""
        if self.read_by is None:
            return ", ".join(action.option_strings[-1] for action in self._actions if action.option_strings)
        value = getattr(namespace, self.read_by.argument, None)
        options = ", ".join(action.option_strings[-1] for action in self._actions
                            if action.option_strings and self.read_by.reads(action.dest, value))
        return options if value is None else f"{options}: the options of {self.read_by.named((value,))}"

    def error(self, message: str):
        argument = ARGUMENT_ERROR.fullmatch(_one_line(message))
        if argument is None:  # a missing argument: bare `trainsim` said "required: command" and named none
            self.exit(EXIT_INPUT, f"error: {command_line(self.prog)}: {_one_line(message)} (allowed: "
                                  f"{self._arguments_allowed()})\n")
        field, problem = argument["field"], argument["problem"]
        choice = CHOICES.fullmatch(problem)
        if choice is not None:
            choices = choice['choices'].replace(chr(39), '')
            hint = did_you_mean(choice['value'].strip(chr(39)), choices)
            problem = f"invalid choice {choice['value']}{hint} (allowed: {choices})"
        self.exit(EXIT_INPUT, f"error: {command_line(self.prog)}: {field}: {problem}\n")


COLLECTIVE_SIZES = "1MiB:1GiB"
"""`trainsim collective`'s message sizes without --sizes: 1 MiB to 1 GiB, doubling."""
SCENARIO_HELP = "a scenario file, or the name of a bundled one (trainsim scenarios)"
EXECUTOR_HELP = "local process pool (default), serial (this process) or dask"
WORKERS_HELP = "pool or LocalCluster workers (default, or 0: all cores)"
AHEAD_WORKERS_HELP = ("a job's processes simulating its cluster states ahead (default, or 0: all cores, as many as "
                      "the free memory holds)")
SCHEDULER_HELP = "Dask scheduler address (default: start a LocalCluster)"
PUBLISHED_WORKERS = 1
"""validate-published's default worker processes: one, the cases one after another (each may hold GiBs)."""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainsim", description="Simulate GPU clusters training large models.",
                     epilog="Start with `trainsim scenarios`, then `trainsim validate NAME` and `trainsim run NAME "
                            "--out DIR`; `trainsim COMMAND --help` for a command's options.")
    parser.add_argument("--version", action=_VersionAction, help="show the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a scenario (one step, or a job over run.horizon) and write its outputs",
                         description="Run a scenario. One step writes summary.json and, unless run.timeline is "
                                     "summary, timeline.parquet and trace.json; a job (run.horizon) writes "
                                     "job_summary.json, job_events.parquet, trace.json (its events) and summary.json "
                                     "(its healthy step). Each run folder ends with manifest.json.")
    run.add_argument("scenario", help=SCENARIO_HELP)
    run.add_argument("--out", required=True, help="output folder")
    run.add_argument("--set", action="append", default=[], metavar="a.b=VALUE", help="override a scenario field")
    run.add_argument("--quiet", action="store_true", help="print nothing but warnings and errors")
    run.add_argument("--force", action="store_true", help="run even beyond the scale limits (memory, ops)")
    run.add_argument("--workers", type=_at_least(0), default=None, metavar="N", help=AHEAD_WORKERS_HELP)
    run.set_defaults(func=_cmd_run, one_run=True, oom_remedies=RUN_REMEDIES)

    validate = sub.add_parser("validate", help="check a scenario and its topology without running it",
                              description="Check a scenario and its topology without running it: every check a "
                                          "run makes before the clock starts. Prints the peak memory per GPU "
                                          "against the GPU's capacity and its largest parts; a layout that does "
                                          "not fit is a warning, an error with --strict.")
    validate.add_argument("scenario", help=SCENARIO_HELP)
    validate.add_argument("--set", action="append", default=[], metavar="a.b=VALUE", help="override a scenario field")
    validate.add_argument("--strict", action="store_true", help="a run that does not fit in memory is an error")
    validate.add_argument("--quiet", action="store_true", help="print nothing but warnings and errors")
    validate.add_argument("--force", action="store_true", help="check even beyond the scale limits")
    validate.set_defaults(func=_cmd_validate, oom_remedies=RUN_REMEDIES)

    scenarios = sub.add_parser("scenarios", help="list the bundled scenarios (run them by name)",
                               description="List the bundled scenarios, each with the first sentence of its "
                                           "description; any command that takes a scenario takes one of these "
                                           "names, from any folder.")
    scenarios.set_defaults(func=_cmd_scenarios)

    gpus = sub.add_parser("gpus", help="list the catalog's GPUs: peaks, HBM, NVLink, kernel efficiencies, sources",
                          description="List the GPUs a scenario's gpu_model takes, with the dense peaks MFU is "
                                      "measured against, HBM capacity and bandwidth, NVLink per direction and the "
                                      "kernel efficiencies the cost model uses, each naming its source; with NAME, "
                                      "one GPU and the full citations of its sources.")
    gpus.add_argument("name", nargs="?", metavar="NAME", help="one catalog GPU (h100-sxm, h200, b200, ...)")
    gpus.set_defaults(func=_cmd_gpus)

    coll = sub.add_parser("collective", help="time one collective over a size range, like nccl-tests",
                          description="Time one collective alone on an idle cluster, once per size, and print "
                                      "an nccl-tests-like table: size, time, algbw and busbw (GB/s = 1e9 B/s), "
                                      "and the algorithm and protocol that ran (docs/collectives.md).")
    coll.add_argument("--topology", required=True, help="bundled topology name or YAML file")
    coll.add_argument("--op", default="all_reduce", help=f"the collective: {', '.join(PRIMITIVES)} (default "
                                                         "all_reduce; send_recv: GPU 0 to the group's last)")
    coll.add_argument("--algorithm", default="auto",
                      help=f"auto (default: the rule's choice for each size) or one that implements the op: "
                           f"{_implemented_ops()}")
    coll.add_argument("--protocol", default="auto",
                      help=f"NCCL protocol: {', '.join(PROTOCOL_CHOICES)} (default auto; send_recv and all_to_all run "
                           "simple alone)")
    coll.add_argument("--ranks", type=_at_least(2), default=0,
                      help="number of GPUs, 2 or more (default: all); send_recv runs two, GPU 0 to GPU RANKS-1")
    coll.add_argument("--sizes", default=COLLECTIVE_SIZES,
                      help=f"LOW:HIGH (doubling) or a comma list, with units (default {COLLECTIVE_SIZES})")
    coll.add_argument("--set", action="append", default=[], metavar="PARAM=VALUE", help="topology parameter")
    coll.add_argument("--efficiency", choices=list(EFFICIENCY_PROFILES), default="calibrated",
                      help="calibrated (default) or ideal (line rate); per link class only in a scenario's "
                           "network.efficiency")
    coll.add_argument("--network", default="flow", choices=NETWORK_MODES,
                      help="flow (default: flows share links max-min fairly) or analytic (no contention between "
                           "collectives)")
    coll.add_argument("--pxn", default="on", choices=("on", "off"),
                      help="on (default, as NCCL): an all_to_all's cross-rail transfers between hosts go over "
                           "NVLink to the GPU on the destination's rail and out of its NIC; off: from the "
                           "sender's own NIC (network.pxn in a scenario)")
    coll.add_argument("--chunk", default="auto",
                      help="pipelining chunk size (default auto: NCCL's for the protocol; 'none' = off)")
    coll.add_argument("--explain", action="store_true",
                      help="say why auto picked each size's algorithm and protocol: every candidate's estimated time "
                           "and the rule (the lowest wins); in --json each row's 'auto'")
    coll.add_argument("--json", action="store_true", help="print JSON objects instead of a table")
    coll.add_argument("--force", action="store_true",
                      help="run even on more than 32,768 GPUs or beyond the scale limits (memory, ops + flows)")
    coll.set_defaults(func=_cmd_collective, one_run=True, oom_remedies=COLLECTIVE_REMEDIES.format(sizes="--set"))

    plot = sub.add_parser("plot", help="draw a run's Gantt chart or memory timeline, or a study's charts",
                          description="Draw a chart of a folder that trainsim wrote: gantt and memory of a "
                                      "run, goodput of a study, sweep, heatmap and busbw of a sweep, front of a "
                                      "layout search (docs/plots.md).",
                          read_by=PLOT_OPTIONS)
    plot.add_argument("chart", choices=["gantt", "memory", "goodput", *STUDY_CHARTS], help="the chart to draw")
    plot.add_argument("outdir", metavar="OUTDIR", help="folder written by `trainsim run` (gantt, memory), `study` "
                      "(goodput), `sweep` or `search` (busbw: also a `trainsim collective --json` file)")
    plot.add_argument("-o", "--output", default=None, help="image file (default: OUTDIR/CHART.png)")
    plot.add_argument("--by", choices=GANTT_ROWS, default=None, help="gantt: rows (default: stage)")
    plot.add_argument("--window", default=None, metavar="START:END", help="gantt: time window, e.g. 0:5ms")
    plot.add_argument("--ranks", default=None, metavar="0,2,4-7",
                      help="gantt: these ranks, one row each; memory: one curve each (default: one rank per stage)")
    plot.add_argument("--x", default=None, help="sweep/heatmap: column on the x axis")
    plot.add_argument("--y", default=None, help="sweep/heatmap: column on the y axis")
    plot.add_argument("--hue", default=None, help="sweep: one line per value of this column")
    plot.add_argument("--value", default=None, help="heatmap: the column shown by colour")
    plot.add_argument("--log-x", action="store_true", help="sweep: logarithmic x axis")
    plot.set_defaults(func=_cmd_plot)

    sweep = sub.add_parser("sweep", help="run every point of a sweep file; results in OUT/results.parquet",
                           description="Run every point of a sweep file (a base scenario and the fields to vary: "
                                       "grid, zip and random axes, constraints); one row per point in "
                                       "OUT/results.parquet and OUT/results.csv (docs/studies.md).")
    sweep.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file")
    sweep.add_argument("--out", required=True, help="output folder (a re-run resumes, skipping finished points)")
    sweep.add_argument("--executor", choices=EXECUTORS, default=EXECUTORS[0],
                       help=EXECUTOR_HELP)
    sweep.add_argument("--workers", type=_at_least(0), default=0, metavar="N", help=WORKERS_HELP)
    sweep.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786", help=SCHEDULER_HELP)
    sweep.add_argument("--set", action="append", default=[], metavar="a.b=VALUE",
                       help="override a field of the base scenario, before the axes (not one an axis sets)")
    sweep.add_argument("--max-points", type=_at_least(1), default=DEFAULT_MAX_POINTS, metavar="N",
                       help=f"refuse sweeps with more points (default {DEFAULT_MAX_POINTS:,})")
    sweep.add_argument("--point-outputs", action="store_true", help="write each point's outputs in OUT/points/")
    sweep.add_argument("--csv-columns", choices=CSV_COLUMNS, default=CSV_COLUMNS[0],
                       help="results.csv's metrics: readable (default) leaves out the link tiers' and auto's "
                            "per-collective detail, all writes every one; results.parquet holds every one")
    sweep.add_argument("--force", action="store_true",
                       help="run points even beyond the scale limits (and again those refused before)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar, no per-point lines and no results table")
    sweep.set_defaults(func=_cmd_sweep, oom_remedies=RUN_REMEDIES)

    published = sub.add_parser("validate-published",
                                help="run every case of scenarios/published/ and regenerate docs/validation.md",
                                description="Simulate every case of scenarios/published/, print each against its "
                                            "published figure and regenerate docs/validation.md; exit status 1 "
                                            "when one is outside its tolerance.")
    published.add_argument("--folder", default=None,
                           help="folder of published cases (default: the bundled scenarios/published)")
    published.add_argument("--out", default=None,
                           help="report to write (default: docs/validation.md beside the bundled scenarios)")
    published.add_argument("--workers", type=_at_least(0), default=None, metavar="N",
                           help="processes simulating the cases at once (default 1; 0: all cores)")
    published.add_argument("--jobs", type=_at_least(0), default=None, metavar="N",
                           help="deprecated: the old name of --workers")
    published.add_argument("--case", action="append", default=[], metavar="NAME",
                           help="run only this case (file name without .yaml); the report is not written")
    published.set_defaults(func=_cmd_validate_published, oom_remedies="one case at a time (--case)")

    search = sub.add_parser("search", help="search parallel layouts for a scenario's model, cluster and batch",
                            description="Search the parallel layouts of a scenario's model, cluster and batch: "
                                        "prune, estimate, simulate the best. Exit status 0 when a layout "
                                        "simulated, 1 when none fits or simulates (the files written say why), "
                                        "2 for bad input.")
    search.add_argument("scenario", help=SCENARIO_HELP + "; its model, cluster and training batch")
    search.add_argument("--out", required=True,
                        help="output folder: candidates.parquet/.csv, search.json, manifest.json")
    search.add_argument("--top", type=_at_least(1), default=8, metavar="N",
                        help="survivors simulated, best estimates first (default 8)")
    search.add_argument("--set", action="append", default=[], metavar="a.b=VALUE", help="override a scenario field")
    search.add_argument("--executor", choices=EXECUTORS, default=EXECUTORS[0], help=EXECUTOR_HELP)
    search.add_argument("--workers", type=_at_least(0), default=0, metavar="N", help=WORKERS_HELP)
    search.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786", help=SCHEDULER_HELP)
    search.add_argument("--force", action="store_true", help="simulate candidates even beyond the scale limits")
    search.add_argument("--quiet", action="store_true",
                        help="no progress bar over the simulated candidates (the results are printed all the same)")
    defaults = {"tp": "powers of two up to twice the NVLink domain's GPUs", "cp": _listed(SEARCH_CP),
                "pp": "every divisor of GPUs / (tp x cp)", "ep": "the scenario's parallelism.ep",
                "virtual-stages": _listed(SEARCH_VIRTUAL_STAGES), "micro-batch": _listed(SEARCH_MICRO_BATCHES)}
    for name, default in defaults.items():
        search.add_argument(f"--{name}", type=_int_list, default=None, metavar="N,N,...",
                            help=f"{name} values to try (default: {default})")
    search.add_argument("--sharding", type=_choice_list(SHARDINGS), default=None, metavar=",".join(SHARDINGS),
                        help=f"shardings to try (default: {_listed(SEARCH_SHARDINGS)}); zero2 is DeepSpeed's, "
                             "reducing every micro-batch's gradients, unless the scenario sets "
                             "parallelism.ddp.reduce_every_microbatch; DeepSpeed refuses pipelining, so its layouts "
                             "with pp > 1 are pruned")
    search.add_argument("--recompute", type=_choice_list(RECOMPUTES), default=None, metavar=",".join(RECOMPUTES),
                        help=f"recompute options to try (default: {_listed(RECOMPUTES)})")
    search.set_defaults(func=_cmd_search, oom_remedies=RUN_REMEDIES)

    study = sub.add_parser("study", help="job studies: ETTR and goodput against the checkpoint interval "
                                         "(and failure-rate multipliers), with Young's and Daly's intervals",
                           description="Rerun a job simulation (a scenario with run.horizon) for every checkpoint "
                                       "interval and failure-rate multiplier: ETTR and goodput of each, the best "
                                       "interval, and Young's and Daly's intervals (docs/reliability.md); draw it "
                                       "with trainsim plot goodput.")
    study.add_argument("study", choices=STUDIES, metavar="kind",
                       help="checkpoint-interval: against --intervals; memory-interval: against --intervals as "
                            "checkpoint.memory.interval (the in-memory tier's); mtbf: for each of --multipliers")
    study.add_argument("scenario", help=SCENARIO_HELP + " with run.horizon")
    study.add_argument("--out", required=True, help="output folder: study.json, study.csv")
    study.add_argument("--intervals", default=None, metavar="5min,10min,...",
                       help="checkpoint intervals, durations or whole steps (10steps) (checkpoint-interval: "
                            "default 1/4 to 4 times the job's Daly "
                            "interval at the geometric mean of --multipliers, in ratios of sqrt 2, whole steps, "
                            "printed; memory-interval: the same around the two-level in-memory optimum, below "
                            "the storage interval; mtbf: default the scenario's own)")
    study.add_argument("--multipliers", default=None, metavar="0.5,1,2",
                       help="failure-rate multipliers of the scenario's own rates (default 1; mtbf: default "
                            "0.5,1,2)")
    study.add_argument("--set", action="append", default=[], metavar="a.b=VALUE", help="override a scenario field")
    study.add_argument("--force", action="store_true", help="run points even beyond the job-event and scale limits")
    study.add_argument("--quiet", action="store_true", help="no progress bar (the results are printed all the same)")
    study.add_argument("--workers", type=_at_least(0), default=0, metavar="N", help=AHEAD_WORKERS_HELP)
    study.set_defaults(func=_cmd_study, oom_remedies=RUN_REMEDIES)

    topo = sub.add_parser("topo", help="describe or draw a topology",
                          description="Describe a topology (its nodes with the names faults.step links use, its "
                                      "link classes, its bisection bandwidth per tier) or draw a small one.",
                          read_by=TOPO_OPTIONS)
    topo.add_argument("action", choices=["describe", "draw"],
                      help="describe: counts, link classes, bisection bandwidth per tier; draw: a picture")
    topo.add_argument("file", metavar=TOPO_FILE, help="bundled topology name or YAML file")
    topo.add_argument("-o", "--output", default=None, help=f"draw: image file (default {TOPO_PICTURE})")
    topo.add_argument("--set", action="append", default=[], metavar="PARAM=VALUE",
                      help="topology parameter, e.g. nodes=16")
    topo.add_argument("--force", action="store_true",
                      help="describe or draw even beyond the size limit (minutes for a million GPUs)")
    topo.set_defaults(func=_cmd_topo, oom_remedies="a smaller cluster (--set)")
    return parser


def _implemented_ops() -> str:
    """Each algorithm with the ops it implements, for `trainsim collective --help`."""
    return "; ".join(f"{name} ({', '.join(ops)})" for name, ops in ALGORITHM_OPS.items())


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _fail(message: str, status: int) -> int:
    print(_one_line(message), file=sys.stderr)
    return status


def _interrupted_once(signum: int, _frame: object) -> None:
    """Ctrl-C or SIGTERM in a process that ends after `main`: KeyboardInterrupt (Terminated for SIGTERM) once,
    every later one of either ignored, so that a second press while the first is handled (workers ended,
    temporary outputs removed, the interpreter's exit) neither prints a traceback nor kills the process halfway
    (Python's handler raised it there, and at exit the default one ended the process by SIGINT, status -2).
    Without it, SIGTERM ended the process at once and left its pool's workers blocked on their pipes. One that
    Python drops where it lands (code run at deallocation) is raised again at the run's next safe point
    (stops.py, whose hook `main` installs for the command)."""
    for held in STOP_SIGNALS:
        signal.signal(held, signal.SIG_IGN)
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def _ignore_interrupts(exiting: bool) -> None:
    """In a process that ends after `main`, every later Ctrl-C or SIGTERM ignored: it is stopping already,
    whichever handler raised the KeyboardInterrupt it stops on."""
    if exiting:
        for held in STOP_SIGNALS:
            signal.signal(held, signal.SIG_IGN)


def _stopped_by(exc: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped a command, in a word, and its exit status: SIGTERM (`Terminated`, or one held back while a
    run's files moved into place) or Ctrl-C."""
    if isinstance(exc, Terminated) or (isinstance(exc, (InterruptedWritten, SearchStopped)) and exc.terminated):
        return "terminated", EXIT_TERMINATED
    return "interrupted", EXIT_INTERRUPTED


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush into a closed pipe stays quiet."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass


NEGATIVE_VALUE = re.compile(r"-\.?\d")
"""A command-line value that starts with a minus sign: '-5min', '-1', '-.5,1'."""


def _negative_values_attached(argv: list[str]) -> list[str]:
    """`--intervals -5min` read as `--intervals=-5min`: argparse takes a value starting with '-' that is not a
    bare number for an option and stops at 'expected one argument', where the command would say what is wrong
    with the value (a negative interval, a size without a unit)."""
    result: list[str] = []
    for arg in argv:
        previous = result[-1] if result else ""
        if (NEGATIVE_VALUE.match(arg) and previous.startswith("--") and "=" not in previous and previous != "--"
                and "--" not in result):
            result[-1] = f"{previous}={arg}"
        else:
            result.append(arg)
    return result


def _at_command(exc: InputError, command: str) -> InputError:
    """An error in a flag's value (one no file holds, one already put on the command line, or one the library
    located at the flag: `--set a.b=v: problem`, `--intervals: 60 d: problem`) located as argparse locates its own
    refusals: `command line: trainsim COMMAND: FLAG: problem`. The command's checks named the flag alone
    (`command line: --tp: ...`) where argparse's named the command as well."""
    where = command_line(f"trainsim {command}")
    if exc.at_flag:
        problem = f"{exc.shown_field}: {exc.problem}" if exc.shown_field else exc.problem
        return exc.rebuilt(problem=problem, field=exc.file, file=where, line=None, at_flag=False)
    if exc.file != COMMAND_LINE and (exc.file or not exc.field.startswith("-")):
        return exc
    return exc.rebuilt(file=where, line=None)


RUN_REMEDIES = "run.fold: true, fewer micro-batches or run.timeline: summary"
"""What an out-of-memory error offers for a command that runs a scenario (each command's ``oom_remedies``)."""


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """Entry point of the `trainsim` console script: every failure ends as one line on stderr and an exit
    status (2 input, 1 runtime, 130 interrupted, 143 terminated), never a traceback. A stop that Python dropped
    and no safe point of the command raised (stops.py) is raised as the command returns, its outputs then in
    place, whole. ``exiting``: the process ends right after (the console script), which then stops on Ctrl-C
    and SIGTERM once (`_interrupted_once`) and keeps a dropped stop (`kept_for_later`) for the command; a
    command that makes one run (`run`, `collective`) then leaves the cyclic collector off to the end: switching
    it back on started a full collection that walked the 173k objects of cyclic garbage the 405B 8,192-GPU run
    leaves (0.12-0.14 s CPU) only to free memory the exit frees anyway."""
    try:
        args = _parser().parse_args(_negative_values_attached(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help, --version and usage errors end here, having printed their text
        return exc.code if isinstance(exc.code, int) else EXIT_INPUT
    unraisable_hook = sys.unraisablehook
    if exiting:
        for held in STOP_SIGNALS:
            signal.signal(held, _interrupted_once)
        sys.unraisablehook = partial(kept_for_later, unraisable_hook)
    if exiting and getattr(args, "one_run", False):
        gc.disable()
    try:
        code = args.func(args)
        raise_dropped()
        return code
    except InputError as exc:
        return _fail(f"error: {_at_command(exc, args.command)}", EXIT_INPUT)
    except SimulationError as exc:
        return _fail(f"simulation error: {exc}", EXIT_RUNTIME)
    except ExecutorError as exc:
        return _fail(f"error: {exc}", EXIT_RUNTIME)
    except InterruptedWritten as exc:
        _ignore_interrupts(exiting)
        word, status = _stopped_by(exc)
        return _fail(f"{word}: the run's files were written to {exc.out_dir} before it stopped", status)
    except KeyboardInterrupt as exc:
        _ignore_interrupts(exiting)
        return _fail(*_stopped_by(exc))
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except MemoryError:
        remedies = getattr(args, "oom_remedies", None)
        return _fail(f"error: out of memory{f' (try {remedies})' if remedies else ''}", EXIT_RUNTIME)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"error: {where}{exc.strerror or exc}", EXIT_RUNTIME)
    finally:
        sys.unraisablehook = unraisable_hook
        forget_dropped()


def console() -> int:
    """The `trainsim` console script: `main` for a process that ends after it, then the objects still alive
    frozen out of the garbage collector, so that the collections the interpreter runs at exit do not walk the
    heap a large run leaves behind (0.25 s CPU after the 16,384-GPU job). In-process callers of `main` keep a
    normal collector."""
    code = main(exiting=True)
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(console())
