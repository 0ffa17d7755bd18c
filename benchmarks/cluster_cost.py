"""What a run costs per GPU of its cluster, whatever it simulates: building the cluster (graph, link arrays,
router) and a folded Llama 3 405B step (TP8 PP16, DP = GPUs / 128, `run.timeline: summary`), each in a fresh
process, CPU seconds and peak RSS growth per GPU. simulator/scale.py's CLUSTER_SECONDS_PER_GPU,
TOPOLOGY_BYTES_PER_GPU and MAX_GPUS come from these figures: a folded run's ops and flows shrink as DP grows,
its per-GPU structures do not.

    python benchmarks/cluster_cost.py                 # 16,384, 65,536 and 262,144 GPUs
    python benchmarks/cluster_cost.py --gpus 16384    # one size
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "llama3-405b-8192-gpus.yaml"


def measure(part: str, gpus: int) -> str:
    """One line: the part ('build' or 'run') at ``gpus`` GPUs, in this process."""
    from simulator.config.loader import load_scenario
    from simulator.simulation import simulate
    from simulator.topology.loader import scenario_topology

    dp = gpus // 128
    loaded = load_scenario(SCENARIO, [f"cluster.nodes={gpus // 8}", f"parallelism.dp={dp}",
                                      f"training.global_batch={max(2048, dp)}", "run.timeline=summary"])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.process_time()
    if part == "build":
        detail = f"links {len(scenario_topology(loaded).link_ends):,}"
    else:
        summary = simulate(loaded, force=True).summary
        detail = f"ops {summary['ops_executed']:,} flows {summary['flows_simulated']:,}"
    seconds = time.process_time() - start
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return (f"{part:5s} {gpus:>9,} GPUs  CPU {seconds:7.2f} s  {seconds / gpus * 1e6:6.1f} us/GPU  "
            f"RSS +{grown / 2**20:8.1f} MiB  {grown / gpus:6.0f} B/GPU  {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[16384, 65536, 262144])
    parser.add_argument("--part", choices=("build", "run"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        print(measure(args.part, args.gpus[0]), flush=True)
        return
    for part in ("build", "run"):
        for gpus in args.gpus:
            subprocess.run([sys.executable, __file__, "--part", part, "--gpus", str(gpus)], check=True, cwd=REPO)


if __name__ == "__main__":
    main()
