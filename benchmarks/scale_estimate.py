"""simulator/scale.py's estimate against what the run posts: for every bundled and published scenario (or those
named), the estimated ops and flows beside the summary's `ops_executed` and `flows_simulated`, and their ratios.
A job scenario runs its step (`run.horizon` dropped); a scenario the limits refuse is shown refused.

    python benchmarks/scale_estimate.py                                   # every scenario (about ten minutes)
    python benchmarks/scale_estimate.py llama3-405b-16k-job published/megatron-sc21-7.5b
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from simulator import scale
from simulator.config.loader import load_scenario
from simulator.errors import InputError
from simulator.simulation import simulate

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def row(name: str) -> str:
    """The scenario's line of the table."""
    path = SCENARIOS / f"{name}.yaml"
    loaded = load_scenario(path)
    gpus = scale.scenario_gpus(loaded) or 0
    estimate = scale.estimate_scale(loaded.scenario, gpus, scale.scenario_hosts(loaded),
                                    table=scale.scenario_table(loaded))
    if loaded.scenario.run.horizon is not None:
        loaded = load_scenario(path, ["run.horizon=null"])
    start = time.perf_counter()
    try:
        summary = simulate(loaded).summary
    except InputError as error:
        return f"{name:40s} {gpus:>7,} refused: {error.problem[:100]}"
    seconds = time.perf_counter() - start
    ops, flows = summary["ops_executed"], summary["flows_simulated"]
    sent = summary.get("replica_quotient", {}).get("replicas_sent", "")
    if estimate is None:
        return (f"{name:40s} {gpus:>7,} {'-':>9s} {ops:>9,} {'':>5s} {'-':>10s} {flows:>10,} {'':>5s} "
                f"{sent!s:>4s} {seconds:6.1f}")
    return (f"{name:40s} {gpus:>7,} {estimate.ops:>9,} {ops:>9,} {estimate.ops / max(ops, 1):5.2f} "
            f"{estimate.flows:>10,} {flows:>10,} {estimate.flows / max(flows, 1):5.2f} {sent!s:>4s} {seconds:6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="scenario names under scenarios/ (default: all)")
    names = parser.parse_args().names or sorted(
        str(path.relative_to(SCENARIOS).with_suffix("")) for path in
        [*SCENARIOS.glob("*.yaml"), *SCENARIOS.glob("published/*.yaml")])
    print(f"{'scenario':40s} {'GPUs':>7s} {'est ops':>9s} {'ops':>9s} {'ratio':>5s} {'est flows':>10s} "
          f"{'flows':>10s} {'ratio':>5s} {'sent':>4s} {'sim s':>6s}")
    for name in names:
        print(row(name), flush=True)


if __name__ == "__main__":
    main()
