"""Benchmark suite: wall time and peak memory of the simulator on the scale cases, one fresh process per case.

Each case runs in its own child process (so its peak RSS is its own), pinned to one core where the OS allows;
the parent prints one table row per case, the cost per GPU of the scaling series, and optionally JSON.
Run: python benchmarks/bench_suite.py [--only NAME ...] [--repeat N] [--timeout S] [--json]
"""

from __future__ import annotations

import time

CHILD_START = time.perf_counter()

import argparse  # noqa: E402  (imported after the clock starts, so "total" covers imports too)
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
LLAMA_405B = "llama3-405b-8192-gpus.yaml"
SCALING_GPUS = (1024, 2048, 4096, 8192, 16384)


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

CASES: tuple[Case, ...] = (
    Case("llama3-8b", 8, "llama3-8b-dgx-h100-dp8.yaml"),
    Case("megatron-76b", 1024, "megatron-sc21-76.1b.yaml", target_s=3.0),
    Case("llama3-405b-8k", 8192, LLAMA_405B, target_s=5.0),
    Case("llama3-405b-16k", 16384, LLAMA_405B, layout_405b(16384), target_s=10.0, target_rss_mib=4096,
         note="1F1B"),
    Case("llama3-405b-16k-interleaved", 16384, LLAMA_405B,
         layout_405b(16384) + ("parallelism.pipeline.schedule=interleaved", "parallelism.pipeline.virtual_stages=2"),
         target_s=10.0, target_rss_mib=4096, note="interleaved, v=2 (as Llama 3 ran it)"),
    Case("allreduce-1GiB", 1024, target_s=5.0, note="ring, flow model, calibrated"),
    Case("trace-kineto-100k", 8, target_s=5.0, trace_events=100_000,
         note="synthetic 8-rank Kineto trace on dgx-h100; target on the import"),
    *scaling_cases(),
    Case("llama3-70b-unfolded", 1024, LLAMA_405B, UNFOLDED_70B, target_s=120.0,
         note="TP8 PP4 DP32, seq 8192, gb 256, run.fold=false"),
)


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def pin_to_one_core() -> int | None:
    """Pin this process to the lowest core it may use; None where the OS has no affinity call."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def run_scenario(case: Case) -> dict:
    """Load and simulate one training scenario; the simulate() call is timed on its own."""
    import simulator

    loaded = simulator.load_scenario(SCENARIOS / case.scenario, list(case.overrides))
    start = time.perf_counter()
    summary = simulator.simulate(loaded).summary
    simulate_s = time.perf_counter() - start
    return {"simulate_s": simulate_s, "ops_executed": summary["ops_executed"],
            "flows_simulated": summary["flows_simulated"], "simulated_ranks": summary["simulated_ranks"],
            "step_time_s": summary["step_time_s"], "tflops_per_gpu": summary["tflops_per_gpu"],
            "mfu": summary["mfu"]}


def run_allreduce(case: Case) -> dict:
    """The collective benchmark's 1 GiB ring all-reduce over ``case.gpus`` GPUs, built the same way."""
    from bench_collective import all_reduce_ops

    from simulator.network.calibration import resolve_efficiency
    from simulator.simulation import NetworkSettings, run_ops
    from simulator.topology.loader import load_topology

    topology = load_topology("dgx-h100-cluster", {"nodes": case.gpus // 8})
    settings = NetworkSettings(mode="flow", efficiency=tuple(sorted(resolve_efficiency("calibrated").items())),
                               algorithm="ring")
    ops = all_reduce_ops(topology.num_gpus, 2**30, "ring")
    start = time.perf_counter()
    result, network = run_ops(topology, ops, settings)
    simulate_s = time.perf_counter() - start
    return {"simulate_s": simulate_s, "ops_executed": result.ops_executed,
            "flows_simulated": int(network.flows_simulated + result.replayed_flows),
            "simulated_ranks": topology.num_gpus, "step_time_s": result.makespan_s, "tflops_per_gpu": None,
            "mfu": None}


def run_trace(case: Case) -> dict:
    """Import and replay a synthetic Kineto trace of ``case.trace_events`` events: the import (files to step
    program) and the replay (engine and metrics) timed apart."""
    import tempfile

    from synthetic_trace import write_kineto_trace

    from simulator.config.loader import scenario_from_text
    from simulator.simulation import build_topology, network_settings, run_step
    from simulator.workload.traces.program import read_traces, trace_program

    with tempfile.TemporaryDirectory() as folder:
        write_kineto_trace(Path(folder), case.gpus, case.trace_events)
        loaded = scenario_from_text("cluster: {topology: dgx-h100}\nworkload: {trace: 'rank*.json'}\n",
                                    source=str(Path(folder) / "scenario.yaml"))
        topology = build_topology(loaded)
        start = time.perf_counter()
        program = trace_program(loaded.scenario.workload, read_traces(loaded.scenario.workload, Path(folder)),
                                topology, fold=True)
        import_s = time.perf_counter() - start
        start = time.perf_counter()
        summary, _, _ = run_step(program, topology, network_settings(loaded))
        simulate_s = time.perf_counter() - start
    return {"import_s": import_s, "simulate_s": simulate_s, "ops_executed": summary["ops_executed"],
            "flows_simulated": summary["flows_simulated"], "simulated_ranks": summary["simulated_ranks"],
            "step_time_s": summary["step_time_s"], "tflops_per_gpu": None, "mfu": None}


def child(name: str) -> int:
    """Run one case in this (fresh) process and print its measurements as one JSON line."""
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
    """Run ``case`` ``repeat`` times, each in a fresh process; keep the run with the fastest simulate()."""
    runs = []
    for _ in range(repeat):
        run = run_case(case, timeout_s)
        if "error" in run:
            return run
        runs.append(run)
    return min(runs, key=lambda run: run["simulate_s"])


@dataclass
class Row:
    """A case with its measurements and its verdict against the target."""

    case: Case
    measured: dict = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        """Ops executed per second of simulate() wall time."""
        return self.measured["ops_executed"] / self.measured["simulate_s"]

    def verdict(self) -> str:
        """'met' / 'MISSED' against the case's time (and memory) target, '-' without one."""
        if "error" in self.measured:
            return "MISSED" if self.case.target_s is not None else "-"
        if self.case.target_s is None:
            return "-"
        ok = self.measured.get("import_s", self.measured["simulate_s"]) <= self.case.target_s
        if self.case.target_rss_mib is not None:
            ok = ok and self.measured["peak_rss_mib"] <= self.case.target_rss_mib
        return "met" if ok else "MISSED"

    def target(self) -> str:
        """The scale issue's target for this case, in words."""
        if self.case.target_s is None:
            return ""
        text = f"<= {self.case.target_s:g} s"
        if self.case.target_rss_mib is not None:
            text += f", <= {self.case.target_rss_mib / 1024:g} GiB"
        return text

    def as_dict(self) -> dict:
        """Case, measurements and verdict for --json."""
        out = {"case": self.case.name, "gpus": self.case.gpus, "overrides": list(self.case.overrides),
               "note": self.case.note, "target": self.target(), "verdict": self.verdict(), **self.measured}
        if "error" not in self.measured:
            out["events_per_s"] = self.events_per_s
        return out


def format_table(rows: list[Row]) -> str:
    """The results as a fixed-width table."""
    header = ("case", "GPUs", "sim s", "total s", "RSS MiB", "ops", "flows", "ops/s", "step s", "TFLOP/s",
              "target", "verdict")
    lines = []
    for row in rows:
        m = row.measured
        if "error" in m:
            lines.append((row.case.name, f"{row.case.gpus:,}", m["error"], "", "", "", "", "", "", "",
                          row.target(), row.verdict()))
            continue
        tflops = "-" if m["tflops_per_gpu"] is None else f"{m['tflops_per_gpu']:.0f}"
        lines.append((row.case.name, f"{row.case.gpus:,}", f"{m['simulate_s']:.2f}", f"{m['total_s']:.2f}",
                      f"{m['peak_rss_mib']:.0f}", f"{m['ops_executed']:,}", f"{m['flows_simulated']:,}",
                      f"{row.events_per_s:,.0f}", f"{m['step_time_s']:.4g}", tflops, row.target(), row.verdict()))
    widths = [max(len(str(line[i])) for line in (header, *lines)) for i in range(len(header))]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths))
                     for line in (header, *lines))


def format_scaling(rows: list[Row]) -> str:
    """Per scaling series: simulate() wall time per GPU, the growth exponent between neighbouring sizes and
    from the smallest to the largest (1 = linear in GPUs, the scale issue's limit)."""
    lines = []
    for series in sorted({row.case.series for row in rows if row.case.series}):
        points = [row for row in rows if row.case.series == series and "error" not in row.measured]
        if not points:
            continue
        lines.append(f"series {series} ({points[0].case.note if series == 'mb16' else 'global batch 2048'}):")
        previous = None
        for row in points:
            wall = row.measured["simulate_s"]
            exponent = ""
            if previous is not None:
                growth = math.log(wall / previous.measured["simulate_s"])
                exponent = f"  exponent {growth / math.log(row.case.gpus / previous.case.gpus):+.2f}"
            lines.append(f"  {row.case.gpus:>6,} GPUs  {wall:7.2f} s  {wall / row.case.gpus * 1e6:8.1f} us/GPU  "
                         f"{row.case.note}{exponent}")
            previous = row
        if len(points) > 1:
            first, last = points[0], points[-1]
            overall = (math.log(last.measured["simulate_s"] / first.measured["simulate_s"])
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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    cases = [case for case in CASES
             if not args.only or any(case.name == name or case.name.startswith(name) for name in args.only)]
    if not cases:
        parser.error(f"no case matches {args.only}; choose from: {', '.join(c.name for c in CASES)}")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
