"""Where the CPU of a job command goes: `trainsim run` of a scenario with `run.horizon`, split into its parts.

Each run is a fresh process pinned to one core that runs the command as `python -m simulator.cli` would (the
same `main`, then the console script's exit), with the job simulation's pieces wrapped in CPU timers: imports,
loading, the topology, the healthy step (StepStates, pandas' import included), failure units and arrivals, the
job processes, the summary, the event table, writing the outputs, and the interpreter's exit (the process's CPU
after `main` returned). The best of `--repeat` runs is kept per part. Optionally rewrites the generated section of
docs/performance.md.
Run: python benchmarks/bench_job.py [--scenario PATH] [--repeat N] [--write-doc PATH]
"""

from __future__ import annotations

import time

CHILD_START = time.process_time()

import argparse  # noqa: E402  (imported after the clock starts, so "imports" covers these too)
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from bench_suite import byte_compile, machine, pin_to_one_core, write_doc  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "llama3-405b-16k-job.yaml"
DOC_BEGIN = "<!-- bench_job: generated section, begin -->"
DOC_END = "<!-- bench_job: generated section, end -->"
PARTS = ("imports", "loading", "topology", "healthy step", "units and arrivals", "job processes", "summary",
         "event table", "writing outputs", "exit")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(scenario: str, out_dir: str) -> None:
    """Run the job command once with timers around its parts; print them as JSON (exit measured outside)."""
    sys.path.insert(0, str(REPO))
    import gc

    import simulator.cli as cli
    import simulator.reliability.report as report
    import simulator.reliability.simulate as job
    from simulator.config import loader

    parts = dict.fromkeys(PARTS, 0.0)
    parts["imports"] = time.process_time() - CHILD_START

    def timed(part: str, function):
        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                parts[part] += time.process_time() - start
        return wrapper

    loader.load_scenario = timed("loading", loader.load_scenario)
    job.scenario_topology = timed("topology", job.scenario_topology)
    job.StepStates = timed("healthy step", job.StepStates)
    job.cluster_units = timed("units and arrivals", job.cluster_units)
    job.draw_arrivals = timed("units and arrivals", job.draw_arrivals)
    job.job_summary = timed("summary", job.job_summary)
    job.JobEvents.table = timed("event table", job.JobEvents.table)
    report.write_job_outputs = timed("writing outputs", report.write_job_outputs)
    job.simulate_job = timed("job processes", job.simulate_job)
    cli.main(["run", scenario, "--out", out_dir], exiting=True)
    inside = ("topology", "healthy step", "units and arrivals", "summary")
    parts["job processes"] -= sum(parts[part] for part in inside)
    gc.freeze()
    print(json.dumps({"parts": parts, "cpu_at_end_s": own_cpu_s()}))


def measure(scenario: Path) -> dict[str, float]:
    """One fresh pinned process: CPU per part, the exit as the process's CPU after `main`."""
    with tempfile.TemporaryDirectory(prefix="bench-job-") as scratch:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, __file__, "--child", str(scenario), str(Path(scratch) / "out")],
                              capture_output=True, text=True, cwd=REPO, check=True, preexec_fn=pin_to_one_core)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    parts = report["parts"]
    parts["exit"] = max(0.0, total - report["cpu_at_end_s"])
    parts["whole command"] = total
    return parts


def markdown(scenario: Path, best: dict[str, float], repeat: int, started: str) -> str:
    rows = [f"| {part} | {best[part]:.2f} |" for part in (*PARTS, "whole command")]
    return "\n".join([
        DOC_BEGIN, "",
        f"`python benchmarks/bench_job.py --repeat {repeat} --write-doc docs/performance.md` on "
        f"`{scenario.relative_to(REPO)}`, best of {repeat} fresh processes pinned to one core, CPU seconds "
        f"(user + system). Machine at the start: {started}. At the end: {machine()}.", "",
        "| part | CPU s |", "|---|---|", *rows, "", DOC_END])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write-doc", type=Path)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    byte_compile()
    started = machine()
    runs = [measure(args.scenario.resolve()) for _ in range(args.repeat)]
    best = {part: min(run[part] for run in runs) for part in runs[0]}
    for part, seconds in best.items():
        print(f"{part:20s} {seconds:6.2f} s CPU")
    if args.write_doc:
        write_doc(args.write_doc, markdown(args.scenario.resolve(), best, args.repeat, started), DOC_BEGIN, DOC_END)


if __name__ == "__main__":
    main()
