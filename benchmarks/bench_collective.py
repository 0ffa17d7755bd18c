"""Benchmark: a 1 GiB ring all-reduce over 1,024 GPUs (128 DGX H100 nodes) on the flow-level network model.

Prints the wall time of building the cluster and of simulating the collective, the peak resident memory and
the simulated flows per second. Target: the simulation itself within 5 s on one core.
Run: python benchmarks/bench_collective.py [--nodes 128] [--size 1GiB] [--algorithm ring] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time

from process_memory import peak_rss_mib

from simulator.collectives.busbw import bus_bandwidth_factor
from simulator.network.calibration import calibrated
from simulator.program.ops import COMM_STREAM, CollectiveOp
from simulator.simulation import NetworkSettings, run_ops
from simulator.topology.loader import load_topology
from simulator.units import parse_size


def all_reduce_ops(ranks: int, nbytes: float, algorithm: str) -> list[CollectiveOp]:
    """One all-reduce over GPUs 0..ranks-1, one op per member."""
    group = tuple(range(ranks))
    return [CollectiveOp(id=rank, rank=rank, stream=COMM_STREAM, name="all_reduce", op="all_reduce", group=group,
                         nbytes=nbytes, key="all_reduce", algorithm=algorithm) for rank in group]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per measurement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128, help="DGX H100 nodes (8 GPUs each)")
    parser.add_argument("--size", default="1GiB", help="per-rank buffer")
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--repeat", type=int, default=3, help="simulations to time; the best is reported")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    topology = load_topology("dgx-h100-cluster", {"nodes": args.nodes})
    build_s = time.perf_counter() - start
    nbytes = parse_size(args.size)
    settings = NetworkSettings(mode="flow", efficiency=tuple(sorted(calibrated(topology.gpu_model).items())),
                               algorithm=args.algorithm)
    best_s, result, network = float("inf"), None, None
    for _ in range(args.repeat):
        ops = all_reduce_ops(topology.num_gpus, nbytes, args.algorithm)
        start = time.perf_counter()
        result, network = run_ops(topology, ops, settings)
        best_s = min(best_s, time.perf_counter() - start)
    flows = int(network.flows_simulated + result.replayed_flows)
    algbw = nbytes / result.makespan_s / 1e9
    print(f"cluster          dgx-h100-cluster, {args.nodes} nodes, {topology.num_gpus} GPUs "
          f"(built in {build_s:.2f} s)")
    print(f"collective       all_reduce {args.size} algorithm={args.algorithm}, flow model, calibrated")
    print(f"simulated time   {result.makespan_s * 1e3:.3f} ms (algbw {algbw:.1f} GB/s, busbw "
          f"{algbw * bus_bandwidth_factor('all_reduce', topology.num_gpus):.1f} GB/s)")
    print(f"wall time        {best_s:.3f} s (best of {args.repeat})")
    print(f"flows simulated  {flows} ({flows / best_s:,.0f} flows/s)")
    print(f"peak RSS         {peak_rss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
