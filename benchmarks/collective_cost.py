"""`trainsim collective`'s time a size against its estimate (scale.py `collective_seconds`): for each case, one size
of one collective over every GPU of a `dgx-h100-cluster`, the transfers its plan posts, the estimated seconds, and
the CPU and wall seconds `collective_sweep` took (the command's run of that size), and each in microseconds an op or
transfer. The constants the estimate reads (`scale.COLLECTIVE_EVENT_S`, `scale.DIRECT_EVENT_S`) are read off the wall
column on the shared machine, as `scale.EVENTS_PER_MINUTE` is, with the load the table prints; the CPU column is
what a core of its own would take.

    python benchmarks/collective_cost.py                       # every case, flow and analytic (about two minutes)
    python benchmarks/collective_cost.py --network flow --only tree
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from simulator.collective_sweep import collective_sweep
from simulator.collectives.chunking import chunk_bytes
from simulator.collectives.phases import CollectiveRequest
from simulator.network.calibration import calibrated
from simulator.scale import chosen_transfers, collective_estimate, collective_seconds
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


def row(op: str, algorithm: str, nodes: int, size: str, mode: str) -> str:
    """One case's line: its plan's transfers, the estimate and the measured CPU and wall seconds."""
    topology = load_topology("dgx-h100-cluster", {"nodes": nodes})
    efficiency = {str(name): share for name, share in calibrated(topology.gpu_model).items()}
    nbytes = parse_size(size)
    request = CollectiveRequest(op, tuple(range(topology.num_gpus)), nbytes, chunk_bytes=chunk_bytes("auto"))
    chosen, transfers = chosen_transfers(request, topology, algorithm, "auto", efficiency)
    estimate = collective_estimate(op, topology.num_gpus, topology.num_gpus, None, transfers, mode)
    estimated_s = collective_seconds(estimate, chosen, mode)
    wall, cpu = time.perf_counter(), time.process_time()
    collective_sweep(topology, {}, op=op, algorithm=algorithm, ranks=0, sizes=[nbytes], mode=mode)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return (f"{op:<15}{chosen:<13}{nodes:>6}{size:>7}{mode:>9}{transfers:>10,}{estimated_s:>10.2f}{cpu:>9.2f}"
            f"{wall:>9.2f}{cpu / estimate.events * 1e6:>8.1f}{wall / estimate.events * 1e6:>8.1f}")


def main() -> None:
    """Each case in a fresh process, as the command runs it (a process's caches of routes and plans would serve the
    cases after the first on the same cluster), one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", choices=("flow", "analytic"), nargs="+", default=["flow", "analytic"])
    parser.add_argument("--only", nargs="+", default=[], help="cases whose op or algorithm is one of these")
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case is not None:
        print(row(*CASES[args.case], args.network[0]), flush=True)
        return
    print(f"load average {' / '.join(f'{load:.1f}' for load in os.getloadavg())}")
    print(f"{'op':<15}{'algorithm':<13}{'hosts':>6}{'size':>7}{'network':>9}{'transfers':>10}{'est. s':>10}"
          f"{'CPU s':>9}{'wall s':>9}{'CPU us':>8}{'wall us':>8}")
    for mode in args.network:
        for case, (op, algorithm, _, _) in enumerate(CASES):
            if not args.only or op in args.only or algorithm in args.only:
                subprocess.run([sys.executable, __file__, "--case", str(case), "--network", mode], check=True)
    print(f"load average {' / '.join(f'{load:.1f}' for load in os.getloadavg())}")


if __name__ == "__main__":
    main()
