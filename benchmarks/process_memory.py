"""A benchmark process's own peak memory, in a module that imports nothing of the simulator: bench_suite's child
reads it after its case, and importing it from bench_collective (which imports the simulation modules) moved
those imports out of the timed `simulate()` window (the 405B 8k `simulate()` 2.31 -> 2.12 s of CPU, its
command / `simulate()` ratio 1.15 -> 1.33 without the command changing by as much)."""

from __future__ import annotations

import resource
import sys


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB: on Linux its own high-water mark (`VmHWM`), since
    `ru_maxrss` of a process started by `subprocess` is at least its parent's peak (Linux keeps the larger of
    the two across exec), so bench_suite's second child of a case read the peak of the suite itself after it
    parsed the first run's trace.json (llama3-70b-unfolded: 4,638 MiB against its own 2,886); elsewhere
    `ru_maxrss` (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 2**10
    except (OSError, StopIteration):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10
