"""`trainsim collective`'s time a size against its estimate (scale.py `collective_cost`, as the command computes it):
for each case, one size of one collective over every GPU of a `dgx-h100-cluster`, its ops and the transfers its plan
posts, the estimated CPU seconds, and the CPU and wall seconds `collective_sweep` took (the command's run of that
size), each also in microseconds an op or transfer. The constants the estimate reads (`scale.COLLECTIVE_EVENT_S`,
`scale.DIRECT_EVENT_S`) are read off the CPU column, which does not grow with the machine's load; the wall column
does, and the output prints the load.

    python benchmarks/collective_cost.py --write-doc docs/performance.md   # every case, flow and analytic
    python benchmarks/collective_cost.py --network flow --only tree        # a subset, printed only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from simulator.collective_sweep import collective_sweep
from simulator.scale import collective_cost, planned_collective
from simulator.topology.loader import load_topology
from simulator.units import parse_size

CASES = (
    ("all_reduce", "tree", 16, "64MiB"),
    ("all_reduce", "tree", 64, "1MiB"),
    ("all_reduce", "tree", 64, "64MiB"),
    ("all_reduce", "tree", 128, "64MiB"),
    ("all_reduce", "ring", 512, "64MiB"),
    ("all_reduce", "nvls", 512, "64MiB"),
    ("all_reduce", "hierarchical", 256, "64MiB"),
    ("all_gather", "auto", 512, "64MiB"),
    ("reduce_scatter", "auto", 512, "64MiB"),
    ("all_to_all", "auto", 16, "1MiB"),
    ("all_to_all", "auto", 32, "1MiB"),
    ("all_to_all", "auto", 64, "1MiB"),
)
"""(op, algorithm, DGX H100 hosts, size): trees, rings, NVLS and hierarchical plans whose sizes take a second or more,
and all-to-alls within a leaf (16 hosts) and across leaves."""


DOC_BEGIN = "<!-- collective_cost: generated section, begin -->"
DOC_END = "<!-- collective_cost: generated section, end -->"
HEADER = (f"{'op':<15}{'algorithm':<13}{'hosts':>6}{'size':>7}{'network':>9}{'events':>10}{'est. s':>8}"
          f"{'CPU s':>8}{'wall s':>8}{'CPU us':>8}{'wall us':>8}")
"""The printed table's columns: events are a size's ops and transfers, `est. s` the estimate in CPU seconds, `CPU us`
and `wall us` the measured seconds an event."""


def measure(op: str, algorithm: str, nodes: int, size: str, mode: str) -> dict:
    """One case: the algorithm its plan runs, its ops and transfers, the estimate (CPU seconds, `scale.collective_cost`,
    as the command computes it) and the CPU and wall seconds of the run."""
    topology = load_topology("dgx-h100-cluster", {"nodes": nodes})
    gpus, nbytes = topology.num_gpus, parse_size(size)
    planned = planned_collective(op, gpus, topology, [nbytes], algorithm, "auto", "calibrated", "auto")
    cost = collective_cost(op, gpus, gpus, None, planned, mode)
    wall, cpu = time.perf_counter(), time.process_time()
    collective_sweep(topology, {}, op=op, algorithm=algorithm, ranks=0, sizes=[nbytes], mode=mode)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"op": op, "algorithm": cost.algorithm, "hosts": nodes, "size": size, "network": mode,
            "events": cost.estimate.events, "estimate_s": cost.seconds, "cpu_s": cpu, "wall_s": wall}


def line(case: dict) -> str:
    """A case as a line of the printed table (`HEADER`)."""
    events = case["events"]
    return (f"{case['op']:<15}{case['algorithm']:<13}{case['hosts']:>6}{case['size']:>7}{case['network']:>9}"
            f"{events:>10,}{case['estimate_s']:>8.2f}{case['cpu_s']:>8.2f}{case['wall_s']:>8.2f}"
            f"{case['cpu_s'] / events * 1e6:>8.1f}{case['wall_s'] / events * 1e6:>8.1f}")


def markdown(cases: list[dict], loads: tuple[tuple[float, ...], tuple[float, ...]]) -> str:
    """The generated section of docs/performance.md: the machine, the load before and after, and a row a case."""
    before, after = (" / ".join(f"{load:.1f}" for load in each) for each in loads)
    lines = [DOC_BEGIN, "",
             f"`python benchmarks/collective_cost.py` on {platform.machine()}, {os.cpu_count()} cores, "
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average {before} before the runs and {after} after (a "
             "shared machine: other jobs ran alongside). A size's ops and transfers (events), the estimate in CPU "
             "seconds, and the CPU and wall seconds of the run, with the microseconds an event in brackets:", "",
             "| case | network | events | estimate, CPU s | CPU s (us) | wall s (us) |", "|---|---|---|---|---|---|"]
    for case in cases:
        events = case["events"]
        name = f"{case['algorithm']} {case['op'].replace('_', '-')} {case['size']}, {case['hosts']} hosts"
        lines.append(f"| {name} | {case['network']} | {events:,} | {case['estimate_s']:.2f} | "
                     f"{case['cpu_s']:.2f} ({case['cpu_s'] / events * 1e6:.1f}) | "
                     f"{case['wall_s']:.2f} ({case['wall_s'] / events * 1e6:.1f}) |")
    return "\n".join([*lines, "", DOC_END])


def write_doc(path: Path, section: str) -> None:
    """Replace the generated section of ``path`` with ``section``."""
    before, rest = path.read_text().split(DOC_BEGIN, 1)
    path.write_text(before + section + rest.split(DOC_END, 1)[1])


def main() -> None:
    """Each case in a fresh process, as the command runs it (a process's caches of routes and plans would serve the
    cases after the first on the same cluster), one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", choices=("flow", "analytic"), nargs="+", default=["flow", "analytic"])
    parser.add_argument("--only", nargs="+", default=[], help="cases whose op or algorithm is one of these")
    parser.add_argument("--write-doc", type=Path, metavar="PATH", help="rewrite the generated section of PATH")
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case is not None:
        print(json.dumps(measure(*CASES[args.case], args.network[0])))
        return
    before = os.getloadavg()
    print(HEADER, flush=True)
    cases = []
    for mode in args.network:
        for case, (op, algorithm, _, _) in enumerate(CASES):
            if not args.only or op in args.only or algorithm in args.only:
                measured = subprocess.run([sys.executable, __file__, "--case", str(case), "--network", mode],
                                          check=True, capture_output=True, text=True).stdout
                cases.append(json.loads(measured))
                print(line(cases[-1]), flush=True)
    section = markdown(cases, (before, os.getloadavg()))
    print(section)
    if args.write_doc:
        write_doc(args.write_doc, section)


if __name__ == "__main__":
    main()
