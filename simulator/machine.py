"""The share of the machine this process may use: its cores and its free memory, as a container or a shared
host limits them, not as the host has them.

Every `--workers 0` (sweep, search, validate-published, a job's states simulated ahead) counts its workers with
`usable_cores`, and a job sizes its forked workers with `available_memory`: `os.cpu_count()` and the host's
MemAvailable are the host's, so a container given 2 CPUs and 8 GB on a 64-core, 128 GB host started 64 workers,
each as large as the job, and met its CPU throttling and its out-of-memory killer. The limits are read from the
cgroup v2 files of the process's cgroup as a container sees them (`/sys/fs/cgroup`); a file that is absent or
says `max` sets no limit.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
"""The cgroup v2 folder whose limits apply: a container's own cgroup, mounted there."""
MEMINFO = Path("/proc/meminfo")


def usable_cores(cgroup: Path | None = None) -> int:
    """The cores this process may keep busy: the CPUs it may run on (its affinity mask: `taskset`, a cpuset),
    fewer where the cgroup's CPU quota (`cpu.max`: `QUOTA PERIOD` in microseconds) grants less time, rounded up
    (a quota of 1.5 CPUs keeps 2 workers busy); at least 1. ``cgroup``: the cgroup folder (default CGROUP)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    fields = _first_line((cgroup or CGROUP) / "cpu.max").split()
    if len(fields) != 2 or not all(field.isdigit() for field in fields) or int(fields[1]) == 0:
        return max(1, count)
    return max(1, min(count, math.ceil(int(fields[0]) / int(fields[1]))))


def available_memory(cgroup: Path | None = None, meminfo: Path | None = None) -> int | None:
    """The bytes this process may still allocate: the host's MemAvailable, less where the cgroup's memory limit
    (`memory.max`) leaves less above its usage (`memory.current`); None where neither is known (no
    /proc/meminfo, no limit). ``cgroup``, ``meminfo``: the files' places (default CGROUP, MEMINFO)."""
    host = _meminfo_available(meminfo or MEMINFO)
    folder = cgroup or CGROUP
    limit, usage = _first_line(folder / "memory.max"), _first_line(folder / "memory.current")
    if not (limit.isdigit() and usage.isdigit()):
        return host
    room = max(0, int(limit) - int(usage))
    return room if host is None else min(host, room)


def _meminfo_available(meminfo: Path) -> int | None:
    """The host's MemAvailable in bytes, None where the file does not say."""
    try:
        with open(meminfo) as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _first_line(path: Path) -> str:
    """A cgroup file's first line, stripped; empty where it cannot be read."""
    try:
        with open(path) as lines:
            return lines.readline().strip()
    except OSError:
        return ""
