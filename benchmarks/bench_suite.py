"""Benchmark suite: wall time and peak memory of the simulator on the scale cases, one fresh process per case.

Each case is measured twice, both pinned to one core: `simulate()` (or `run_ops` for the all-reduce) in a
child process of its own (so its peak RSS is its own), and the whole command as a user runs it
(`trainsim run SCENARIO --out DIR` with the default outputs, or `trainsim collective`), wall and CPU time.
The parent prints one table row per case, the cost per GPU of the scaling series, optionally JSON, and can
rewrite the generated section of docs/performance.md.
Run: python benchmarks/bench_suite.py [--only NAME ...] [--repeat N] [--timeout S] [--json] [--write-doc PATH]
"""

from __future__ import annotations

import time

CHILD_START = time.perf_counter()

import argparse  # noqa: E402  (imported after the clock starts, so "total" covers imports too)
import compileall  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
LLAMA_405B = "llama3-405b-8192-gpus.yaml"
SCALING_GPUS = (1024, 2048, 4096, 8192, 16384)
DOC_BEGIN = "<!-- bench_suite: generated section, begin -->"
DOC_END = "<!-- bench_suite: generated section, end -->"


@dataclass(frozen=True)
class Case:
    """One benchmark: a scenario with overrides (or the all-reduce), its size and the scale issue's target."""

    name: str
    gpus: int
    scenario: str = ""
    overrides: tuple[str, ...] = ()
    target_s: float | None = None
    target_rss_mib: float | None = None
    series: str = ""
    note: str = ""
    trace_events: int = 0
    """Above 0: replay a synthetic Kineto trace of this many events (synthetic_trace.py); the target is then
    the import's (reading the files and building the step program)."""
    command_target_s: float | None = None
    command_ratio: float | None = None
    trace_limit_mb: float | None = None

    def command(self, out_dir: Path) -> list[str]:
        """The `trainsim` arguments a user would type for this case (default outputs into ``out_dir``); none
        for a trace case (its scenario lives in a folder the child makes)."""
        if self.trace_events:
            return []
        if self.scenario:
            sets = [arg for override in self.overrides for arg in ("--set", override)]
            return ["run", str(SCENARIOS / self.scenario), "--out", str(out_dir), *sets]
        return ["collective", "--topology", "dgx-h100-cluster", "--set", f"nodes={self.gpus // 8}", "--op",
                "all_reduce", "--algorithm", "ring", "--sizes", "1GiB", "--chunk", "none"]

    def targets(self) -> list[str]:
        """The case's targets in words."""
        found = []
        if self.target_s is not None:
            found.append(f"{'import' if self.trace_events else 'sim'} <= {self.target_s:g} s")
        if self.target_rss_mib is not None:
            found.append(f"RSS <= {self.target_rss_mib / 1024:g} GiB")
        if self.command_target_s is not None:
            found.append(f"command <= {self.command_target_s:g} s")
        if self.command_ratio is not None:
            found.append(f"command <= {self.command_ratio:g} x sim")
        if self.trace_limit_mb is not None:
            found.append(f"trace.json < {self.trace_limit_mb:g} MB")
        return found


def layout_405b(gpus: int) -> tuple[str, ...]:
    """Llama 3 405B with TP8 PP16 on ``gpus`` H100: 8 GPUs per node, DP = gpus / 128."""
    return (f"cluster.nodes={gpus // 8}", f"parallelism.dp={gpus // 128}")


def scaling_cases() -> list[Case]:
    """The 405B step at 1k..16k GPUs: global batch fixed (work per rank shrinks as DP grows) and
    16 micro-batches per replica (work per rank constant)."""
    cases = []
    for gpus in SCALING_GPUS:
        per_replica = 2048 // (gpus // 128)
        cases.append(Case(f"scale-gb2048-{gpus // 1024}k", gpus, LLAMA_405B, layout_405b(gpus), series="gb2048",
                          note=f"{per_replica} micro-batches per replica"))
    for gpus in SCALING_GPUS:
        cases.append(Case(f"scale-mb16-{gpus // 1024}k", gpus, LLAMA_405B,
                          layout_405b(gpus) + ("training.microbatches=16",), series="mb16",
                          note="16 micro-batches per replica"))
    return cases


UNFOLDED_70B = ("model.preset=llama3-70b", "cluster.nodes=128", "parallelism.pp=4", "parallelism.dp=32",
                "training.global_batch=256", "parallelism.pipeline.first_last_fewer_layers=false", "run.fold=false")

def allreduce_cases() -> list[Case]:
    """The 1 GiB ring all-reduce over 1k..16k GPUs: at 16k within 3 s, growing at most linearly (the outputs
    issue); the whole `trainsim collective` command at 1k within 0.6 s."""
    cases = []
    for gpus in SCALING_GPUS:
        cases.append(Case(f"allreduce-1GiB-{gpus // 1024}k", gpus, series="allreduce",
                          target_s=3.0 if gpus == 16384 else 5.0 if gpus == 1024 else None,
                          command_target_s=0.6 if gpus == 1024 else None,
                          note="ring, flow model, calibrated, no chunking"))
    return cases


THROTTLING_JOB = ("faults.components.throttling={unit: gpu, effect: straggle, slowdown: 1.3, mtbf: 5000 h, "
                  "repair: 1 d}", "network.model=analytic", "run.replications=2")
"""The bundled job with docs/reliability.md's GPU throttling class, whose straggler states fold on the analytic
model: two replications meet ~68 sets of slowed stages, each a step simulated (100 replications meet 1,685)."""


CASES: tuple[Case, ...] = (
    Case("llama3-8b", 8, "llama3-8b-dgx-h100-dp8.yaml"),
    Case("megatron-76b", 1024, "megatron-sc21-76.1b.yaml", target_s=3.0),
    Case("llama3-405b-8k", 8192, LLAMA_405B, target_s=5.0, command_target_s=6.0, command_ratio=1.3,
         trace_limit_mb=15.0),
    Case("llama3-405b-16k", 16384, LLAMA_405B, layout_405b(16384), target_s=10.0, target_rss_mib=4096,
         command_target_s=8.0, note="1F1B"),
    Case("llama3-405b-16k-interleaved", 16384, LLAMA_405B,
         layout_405b(16384) + ("parallelism.pipeline.schedule=interleaved", "parallelism.pipeline.virtual_stages=2"),
         target_s=10.0, target_rss_mib=4096, note="interleaved, v=2 (as Llama 3 ran it)"),
    Case("llama3-405b-long-context", 16384, "published/llama3-405b-long-context.yaml", target_s=10.0,
         note="TP8 CP16 PP16 DP8, seq 131,072, all-gather CP, interleaved v=2"),
    Case("moe-deepseek-v3-style-1k", 1024, "deepseek-v3-style-1024-gpus.yaml", target_s=10.0,
         note="256 experts top-8, PP16 EP8 (in NVLink) DP64, full recompute, Dirichlet routing"),
    *allreduce_cases(),
    Case("trace-kineto-100k", 8, target_s=5.0, trace_events=100_000,
         note="synthetic 8-rank Kineto trace on dgx-h100; target on the import"),
    *scaling_cases(),
    Case("llama3-405b-16k-job", 16384, "llama3-405b-16k-job.yaml", target_s=10.0, command_target_s=10.0,
         note="job: 100 replications of 54 d, llama3 preset, step simulated once"),
    Case("llama3-405b-16k-job-throttling", 16384, "llama3-405b-16k-job.yaml", THROTTLING_JOB,
         note="job with docs/reliability.md's throttling class, analytic, 2 replications (~68 straggler states)"),
    Case("llama3-70b-unfolded", 1024, LLAMA_405B, UNFOLDED_70B, target_s=120.0,
         note="TP8 PP4 DP32, seq 8192, gb 256, run.fold=false"),
)


def pin_to_one_core() -> int | None:
    """Pin this process to the lowest core it may use; None where the OS has no affinity call."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def one_core_prefix() -> list[str]:
    """`taskset -c CORE` for the lowest core this process may use, where taskset exists."""
    if shutil.which("taskset") and hasattr(os, "sched_getaffinity"):
        return ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
    return []


def trace_check(out_dir: Path) -> dict:
    """Size of the run's trace and whether it parses as Chrome-trace JSON with op slices and counter tracks."""
    import orjson

    path = out_dir / "trace.json"
    if not path.is_file():
        return {}
    try:
        events = orjson.loads(path.read_bytes())["traceEvents"]
        valid = all(isinstance(e, dict) and "ph" in e for e in events) and any(e["ph"] == "X" for e in events)
        counters = len({e["name"] for e in events if e["ph"] == "C"})
    except (orjson.JSONDecodeError, KeyError, TypeError):
        valid, counters = False, 0
    return {"trace_mb": path.stat().st_size / 1e6, "trace_valid": valid, "trace_counter_tracks": counters}


def byte_compile() -> None:
    """Byte-compile the package once, as `pip install` does: the commands then load cached bytecode as on a user's
    machine, even where PYTHONDONTWRITEBYTECODE (set on our build machine) stops Python from caching it."""
    compileall.compile_dir(REPO / "simulator", quiet=1)


def run_command(case: Case, timeout_s: float) -> dict:
    """The whole command as a user runs it, pinned to one core: wall and CPU time (user + system), and for a
    run the size and validity of its trace.json."""
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        out_dir = Path(scratch) / "out"
        command = [*one_core_prefix(), sys.executable, "-m", "simulator.cli", *case.command(out_dir)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
        except subprocess.TimeoutExpired:
            return {"error": f"command stopped after {timeout_s:.0f} s"}
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return {"command_s": wall, "command_cpu_s": cpu, **trace_check(out_dir)}


def run_scenario(case: Case) -> dict:
    """Load and simulate one training scenario; the simulate() call is timed on its own."""
    import simulator

    loaded = simulator.load_scenario(SCENARIOS / case.scenario, list(case.overrides))
    if loaded.scenario.run.horizon is not None:
        return run_job(loaded)
    start, cpu = time.perf_counter(), time.process_time()
    summary = simulator.simulate(loaded).summary
    simulate_s, simulate_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"simulate_s": simulate_s, "simulate_cpu_s": simulate_cpu_s, "ops_executed": summary["ops_executed"],
            "flows_simulated": summary["flows_simulated"], "simulated_ranks": summary["simulated_ranks"],
            "step_time_s": summary["step_time_s"], "tflops_per_gpu": summary["tflops_per_gpu"],
            "mfu": summary["mfu"]}


def run_job(loaded) -> dict:
    """A job simulation (run.horizon): the step simulated once, then every replication and the event table
    (built on first use); timed together."""
    from simulator.reliability.simulate import simulate_job

    start, cpu = time.perf_counter(), time.process_time()
    job = simulate_job(loaded)
    events = job.table.num_rows
    simulate_s, simulate_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    step = job.step_summary
    return {"simulate_s": simulate_s, "simulate_cpu_s": simulate_cpu_s, "ops_executed": step["ops_executed"],
            "flows_simulated": step["flows_simulated"], "simulated_ranks": step["simulated_ranks"],
            "step_time_s": step["step_time_s"], "tflops_per_gpu": step["tflops_per_gpu"], "mfu": step["mfu"],
            "job_events": events, "ettr": job.summary["ettr"]["mean"]}


def run_allreduce(case: Case) -> dict:
    """The collective benchmark's 1 GiB ring all-reduce over ``case.gpus`` GPUs, built the same way, with the
    cyclic garbage collector paused as `trainsim collective` pauses it (collective_sweep.py): measured without
    the pause, the collections walking the cluster's routes grew the 16k point faster than the GPUs."""
    from bench_collective import all_reduce_ops

    from simulator.collector import collector_paused
    from simulator.network.calibration import calibrated
    from simulator.simulation import NetworkSettings, run_ops
    from simulator.topology.loader import load_topology

    topology = load_topology("dgx-h100-cluster", {"nodes": case.gpus // 8})
    settings = NetworkSettings(mode="flow", efficiency=tuple(sorted(calibrated(topology.gpu_model).items())),
                               algorithm="ring")
    ops = all_reduce_ops(topology.num_gpus, 2**30, "ring")
    start, cpu = time.perf_counter(), time.process_time()
    with collector_paused():
        result, network = run_ops(topology, ops, settings)
    simulate_s, simulate_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"simulate_s": simulate_s, "simulate_cpu_s": simulate_cpu_s, "ops_executed": result.ops_executed,
            "flows_simulated": int(network.flows_simulated + result.replayed_flows),
            "simulated_ranks": topology.num_gpus, "step_time_s": result.makespan_s, "tflops_per_gpu": None,
            "mfu": None}


def run_trace(case: Case) -> dict:
    """Import and replay a synthetic Kineto trace of ``case.trace_events`` events: the import (files to step
    program) and the replay (engine and metrics) timed apart."""
    import tempfile

    from synthetic_trace import write_kineto_trace

    from simulator.config.loader import scenario_from_text
    from simulator.simulation import network_settings, run_step
    from simulator.topology.loader import scenario_topology
    from simulator.workload.traces.program import read_traces, trace_program

    with tempfile.TemporaryDirectory() as folder:
        write_kineto_trace(Path(folder), case.gpus, case.trace_events)
        loaded = scenario_from_text("cluster: {topology: dgx-h100}\nworkload: {trace: 'rank*.json'}\n",
                                    source=str(Path(folder) / "scenario.yaml"))
        topology = scenario_topology(loaded)
        start, cpu = time.perf_counter(), time.process_time()
        program = trace_program(loaded.scenario.workload, read_traces(loaded.scenario.workload, Path(folder)),
                                topology, fold=True)
        import_s, import_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        start, cpu = time.perf_counter(), time.process_time()
        summary, _, _ = run_step(program, topology, network_settings(loaded, topology))
        simulate_s, simulate_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"import_s": import_s, "import_cpu_s": import_cpu_s, "simulate_s": simulate_s,
            "simulate_cpu_s": simulate_cpu_s,
            "ops_executed": summary["ops_executed"],
            "flows_simulated": summary["flows_simulated"], "simulated_ranks": summary["simulated_ranks"],
            "step_time_s": summary["step_time_s"], "tflops_per_gpu": None, "mfu": None}


def child(name: str) -> int:
    """Run one case in this (fresh) process and print its measurements as one JSON line."""
    from process_memory import peak_rss_mib

    core = pin_to_one_core()
    case = next(c for c in CASES if c.name == name)
    if case.trace_events:
        measured = run_trace(case)
    else:
        measured = run_scenario(case) if case.scenario else run_allreduce(case)
    measured.update(total_s=time.perf_counter() - CHILD_START, peak_rss_mib=peak_rss_mib(), core=core)
    print(json.dumps(measured))
    return 0


def run_case(case: Case, timeout_s: float) -> dict:
    """One fresh child process for ``case``; a child past ``timeout_s`` is killed and reported as such."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", case.name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_of(case: Case, repeat: int, timeout_s: float) -> dict:
    """Run ``case`` ``repeat`` times, each in a fresh process, and its whole command as often; keep the
    fastest simulate() and the fastest command."""
    runs, commands = [], []
    for _ in range(repeat):
        run = run_case(case, timeout_s)
        if "error" in run:
            return run
        runs.append(run)
        if not case.command(Path()):
            continue
        command = run_command(case, timeout_s)
        if "error" in command:
            return command
        commands.append(command)
    best_command = min(commands, key=lambda run: run["command_s"]) if commands else {}
    return {**min(runs, key=lambda run: run["simulate_s"]), **best_command}


@dataclass
class Row:
    """A case with its measurements and its verdict against the target."""

    case: Case
    measured: dict = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        """Ops executed per second of simulate() wall time."""
        return self.measured["ops_executed"] / self.measured["simulate_s"]

    def missed(self) -> list[str]:
        """The case's targets this measurement misses, judged on CPU time (user + system) of the pinned
        process: on a shared machine its wall time also counts the time other work held the core."""
        case, m = self.case, self.measured
        timed, key = ("import", "import_cpu_s") if case.trace_events else ("sim", "simulate_cpu_s")
        checks = [(case.target_s, lambda: m[key] <= case.target_s, f"{timed} <= {case.target_s} s"),
                  (case.target_rss_mib, lambda: m["peak_rss_mib"] <= case.target_rss_mib, "RSS"),
                  (case.command_target_s, lambda: m["command_cpu_s"] <= case.command_target_s,
                   f"command <= {case.command_target_s} s"),
                  (case.command_ratio, lambda: m["command_cpu_s"] <= case.command_ratio * m["simulate_cpu_s"],
                   f"command <= {case.command_ratio} x sim"),
                  (case.trace_limit_mb, lambda: m.get("trace_valid") and m["trace_mb"] < case.trace_limit_mb,
                   "trace")]
        return [name for target, ok, name in checks if target is not None and not ok()]

    def verdict(self) -> str:
        """'met' / 'MISSED (...)' against the case's targets, '-' without one."""
        if not self.case.targets():
            return "-"
        if "error" in self.measured:
            return "MISSED"
        missed = self.missed()
        return f"MISSED ({'; '.join(missed)})" if missed else "met"

    def target(self) -> str:
        """The case's targets, in words."""
        return ", ".join(self.case.targets())

    def as_dict(self) -> dict:
        """Case, measurements and verdict for --json."""
        out = {"case": self.case.name, "gpus": self.case.gpus, "overrides": list(self.case.overrides),
               "note": self.case.note, "target": self.target(), "verdict": self.verdict(), **self.measured}
        if "error" not in self.measured:
            out["events_per_s"] = self.events_per_s
        return out


HEADER = ("case", "GPUs", "sim s", "sim CPU s", "command s", "command CPU s", "command / sim (CPU)", "trace MB",
          "RSS MiB", "ops", "flows", "ops/s", "step s", "TFLOP/s", "target", "verdict")


def table_lines(rows: list[Row]) -> list[tuple[str, ...]]:
    """One tuple of cells per row, in HEADER order."""
    lines = []
    for row in rows:
        m = row.measured
        if "error" in m:
            lines.append((row.case.name, f"{row.case.gpus:,}", m["error"], *[""] * 11, row.target(), row.verdict()))
            continue
        tflops = "-" if m["tflops_per_gpu"] is None else f"{m['tflops_per_gpu']:.0f}"
        trace = f"{m['trace_mb']:.1f}" if "trace_mb" in m else "-"
        command = (f"{m['command_s']:.2f}", f"{m['command_cpu_s']:.2f}",
                   f"{m['command_cpu_s'] / m['simulate_cpu_s']:.2f}") if "command_s" in m else ("-", "-", "-")
        lines.append((row.case.name, f"{row.case.gpus:,}", f"{m['simulate_s']:.2f}", f"{m['simulate_cpu_s']:.2f}",
                      *command, trace,
                      f"{m['peak_rss_mib']:.0f}", f"{m['ops_executed']:,}", f"{m['flows_simulated']:,}",
                      f"{row.events_per_s:,.0f}", f"{m['step_time_s']:.4g}", tflops, row.target(), row.verdict()))
    return lines


def format_table(rows: list[Row]) -> str:
    """The results as a fixed-width table."""
    lines = table_lines(rows)
    widths = [max(len(str(line[i])) for line in (HEADER, *lines)) for i in range(len(HEADER))]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths))
                     for line in (HEADER, *lines))


def machine() -> str:
    """Cores, CPU model, memory, Python, date and load average, for the record."""
    model = "unknown CPU"
    memory = "unknown memory"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    except OSError:
        pass
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    return (f"{os.cpu_count()} cores ({model}), {memory}, Python {platform.python_version()}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average (1/5/15 min) {load}")


def markdown(rows: list[Row], command: str, started: str, scaling: str) -> str:
    """The generated section of docs/performance.md: how it was run, on what, and the table."""
    lines = [DOC_BEGIN, "",
             f"`{command}`. Machine at the start: {started}. At the end: {machine()}. Every case is pinned to "
             "one core (`taskset`, `os.sched_setaffinity`). \"sim\" is the `simulate()` call (`run_ops` for "
             "the all-reduce) inside a fresh process, \"command\" the whole `trainsim run` (default outputs) or "
             "`trainsim collective` as a user types it, imports and writing included. The machine was shared "
             "with other work, so wall times carry its load; the verdicts use CPU time (user + system), which "
             "on a dedicated core is the wall time.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in line) + " |" for line in table_lines(rows)]
    if scaling:
        lines += ["", "```", scaling, "```"]
    lines += ["", DOC_END]
    return "\n".join(lines)


def write_doc(path: Path, section: str, begin: str = DOC_BEGIN, end: str = DOC_END) -> None:
    """Replace the generated section of ``path`` (between the markers), or append it when there is none."""
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


SERIES_TITLES = {"gb2048": "global batch 2048", "mb16": "16 micro-batches per replica",
                 "allreduce": "1 GiB ring all-reduce"}


def format_scaling(rows: list[Row]) -> str:
    """Per scaling series: simulate() CPU time per GPU, the growth exponent between neighbouring sizes and
    from the smallest to the largest (1 = linear in GPUs, the scale issue's limit)."""
    key = "simulate_cpu_s"
    lines = []
    for series in sorted({row.case.series for row in rows if row.case.series}):
        points = [row for row in rows if row.case.series == series and "error" not in row.measured]
        if not points:
            continue
        lines.append(f"series {series} ({SERIES_TITLES[series]}):")
        previous = None
        for row in points:
            cpu = row.measured[key]
            exponent = ""
            if previous is not None:
                growth = math.log(cpu / previous.measured[key])
                exponent = f"  exponent {growth / math.log(row.case.gpus / previous.case.gpus):+.2f}"
            lines.append(f"  {row.case.gpus:>6,} GPUs  sim CPU {cpu:7.2f} s  {cpu / row.case.gpus * 1e6:8.1f} us/GPU"
                         f"  command CPU {row.measured['command_cpu_s']:6.2f} s{exponent}")
            previous = row
        if len(points) > 1:
            first, last = points[0], points[-1]
            overall = (math.log(last.measured[key] / first.measured[key])
                       / math.log(last.case.gpus / first.case.gpus))
            lines.append(f"  overall exponent {overall:+.2f} (target: at most linear in GPUs, <= 1: "
                         f"{'met' if overall <= 1 else 'MISSED'})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the selected cases, one fresh process each, and print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="cases to run (a name, or a prefix such as 'scale-'); "
                             f"all: {', '.join(c.name for c in CASES)}")
    parser.add_argument("--repeat", type=int, default=1, help="fresh runs per case; the fastest is reported")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a case is stopped")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--write-doc", type=Path, metavar="PATH",
                        help="also rewrite the generated section of PATH (docs/performance.md)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    cases = [case for case in CASES
             if not args.only or any(case.name == name or case.name.startswith(name) for name in args.only)]
    if not cases:
        parser.error(f"no case matches {args.only}; choose from: {', '.join(c.name for c in CASES)}")
    byte_compile()
    started = machine()
    rows = []
    for case in cases:
        rows.append(Row(case, best_of(case, args.repeat, args.timeout)))
        print(f"done {case.name}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
        return 0
    print(format_table(rows))
    scaling = format_scaling(rows)
    if scaling:
        print()
        print(scaling)
    if args.write_doc:
        typed = "python benchmarks/bench_suite.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_doc(args.write_doc, markdown(rows, typed.strip(), started, scaling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
