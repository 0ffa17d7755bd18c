"""Sweep benchmark: the 200-point acceptance sweep (tests/data/sweep_200.yaml) as a user runs it, whole command
(`trainsim sweep ... --quiet`), on the serial executor, the local process pool (every core) and a Dask
LocalCluster of 2 workers (its start-up included): wall time, points per second, and the pool's speed-up over
serial. Each run writes into a fresh folder, so no point is reused.
Run: python benchmarks/bench_sweep.py [--write-doc docs/performance.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "tests" / "data" / "sweep_200.yaml"
POINTS = 200
RUNS = (("serial", ["--executor", "serial"]), ("local pool", ["--executor", "local"]),
        ("dask, 2 workers", ["--executor", "dask", "--workers", "2"]))
DOC_BEGIN = "<!-- bench_sweep: generated section, begin -->"
DOC_END = "<!-- bench_sweep: generated section, end -->"


def time_sweep(arguments: list[str]) -> float:
    """Wall seconds of one `trainsim sweep` into a fresh folder."""
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "simulator.cli", "sweep", str(SWEEP), "--out", f"{folder}/out",
                        "--quiet", *arguments], cwd=REPO, check=True, capture_output=True)
        return time.perf_counter() - started


def markdown(rows: list[tuple[str, float]], load: tuple[float, float, float]) -> str:
    serial = dict(rows)["serial"]
    lines = [DOC_BEGIN, "",
             f"`python benchmarks/bench_sweep.py` on {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average "
             f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} before the runs (a shared machine: other jobs ran "
             "alongside). The 200-point sweep of `tests/data/sweep_200.yaml` (90 simulated pipeline steps, 110 "
             "refused layouts), whole command:", "",
             "| executor | wall (s) | points/s | vs serial |", "|---|---|---|---|"]
    for name, seconds in rows:
        lines.append(f"| {name} | {seconds:.1f} | {POINTS / seconds:.1f} | {serial / seconds:.2f}x |")
    lines += ["", DOC_END]
    return "\n".join(lines)


def write_doc(path: Path, section: str) -> None:
    text = path.read_text()
    if DOC_BEGIN in text:
        before, rest = text.split(DOC_BEGIN, 1)
        text = before + section + rest.split(DOC_END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Sweeps\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-doc", type=Path, metavar="PATH", help="rewrite the generated section of PATH")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    rows = [(name, time_sweep(arguments)) for name, arguments in RUNS]
    section = markdown(rows, load)
    print(section)
    if args.write_doc:
        write_doc(args.write_doc, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
