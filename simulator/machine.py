"""The share of the machine this process may use: its cores and its free memory, as a container or a shared
host limits them, not as the host has them.

Every `--workers 0` (sweep, search, validate-published, a job's states simulated ahead) counts its workers with
`usable_cores`, and a job sizes its forked workers with `available_memory`: `os.cpu_count()` and the host's
MemAvailable are the host's, so a container given 2 CPUs and 8 GB on a 64-core, 128 GB host started 64 workers,
each as large as the job, and met its CPU throttling and its out-of-memory killer. The limits are those of the
process's cgroup, named in /proc/self/cgroup, and of each of its parents (a `systemd-run -p CPUQuota` slice, a
Slurm job's cgroup on a host without a private cgroup namespace), the tightest winning: cgroup v2 (`cpu.max`,
`memory.max`) or v1 (`cpu.cfs_quota_us`, `memory.limit_in_bytes`), whichever hierarchy holds the controller. A
file that is absent or says `max` (v1: -1, or its huge unlimited figure) sets no limit.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the cgroup hierarchies are mounted: the v2 one itself, or one folder per v1 hierarchy."""
MEMBERSHIP = Path("/proc/self/cgroup")
"""The process's cgroup in each hierarchy: `ID:CONTROLLERS:PATH` lines (v2: `0::PATH`)."""
MEMINFO = Path("/proc/meminfo")

Controller = Literal["cpu", "memory"]
V1_FILES = {"cpu": ("cpu.cfs_quota_us", "cpu.cfs_period_us"),
            "memory": ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")}
"""A v1 hierarchy's files: the CPU quota and period in microseconds; the memory limit, usage and the memory.stat
line of its reclaimable page cache."""
V2_FILES = {"memory": ("memory.max", "memory.current", "inactive_file")}


def usable_cores(root: Path | None = None, membership: Path | None = None) -> int:
    """The cores this process may keep busy: the CPUs it may run on (its affinity mask: `taskset`, a cpuset),
    fewer where a CPU quota of its cgroup or a parent's grants less time, rounded up (a quota of 1.5 CPUs keeps
    2 workers busy); at least 1. ``root``, ``membership``: the files' places (default CGROUP_ROOT, MEMBERSHIP)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    version, folders = _cgroup_folders("cpu", root or CGROUP_ROOT, membership or MEMBERSHIP)
    for folder in folders:
        if version == 2:
            fields = _first_line(folder / "cpu.max").split()
            quota, period = (_whole(fields[0]), _whole(fields[1])) if len(fields) == 2 else (None, None)
        else:
            quota_file, period_file = V1_FILES["cpu"]
            quota, period = _whole(_first_line(folder / quota_file)), _whole(_first_line(folder / period_file))
        if quota is not None and period:
            count = min(count, math.ceil(quota / period))
    return max(1, count)


def available_memory(root: Path | None = None, meminfo: Path | None = None,
                     membership: Path | None = None) -> int | None:
    """The bytes this process may still allocate: the host's MemAvailable, less where a memory limit of its
    cgroup or a parent's leaves less above that cgroup's usage, its reclaimable page cache (inactive_file of
    memory.stat) not counted as used; a limit whose usage cannot be read leaves the limit itself. None where
    nothing is known (no /proc/meminfo, no limit). ``root``, ``meminfo``, ``membership``: the files' places
    (default CGROUP_ROOT, MEMINFO, MEMBERSHIP)."""
    room = _meminfo_available(meminfo or MEMINFO)
    version, folders = _cgroup_folders("memory", root or CGROUP_ROOT, membership or MEMBERSHIP)
    limit_file, usage_file, cache_line = (V2_FILES if version == 2 else V1_FILES)["memory"]
    for folder in folders:
        limit = _whole(_first_line(folder / limit_file))
        if limit is None:
            continue
        usage = _whole(_first_line(folder / usage_file))
        left = limit if usage is None else limit - max(0, usage - _stat(folder / "memory.stat", cache_line))
        room = max(0, left) if room is None else min(room, max(0, left))
    return room


def _cgroup_folders(controller: Controller, root: Path, membership: Path) -> tuple[int, list[Path]]:
    """The cgroup version that holds ``controller`` and the folders of this process's cgroup and its parents,
    root first, those that exist: a v1 hierarchy listing it (mounted at ROOT/CONTROLLERS) where there is one,
    else the v2 hierarchy at ROOT. A container without its own cgroup namespace sees its host's path, not
    mounted inside it: the hierarchy's root folder, its own cgroup, is then the one found."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    v1 = v2 = None
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        if controller in fields[1].split(","):
            v1 = (root / fields[1], fields[2])
        elif fields[0] == "0" and not fields[1]:
            v2 = (root, fields[2])
    version, (base, path) = (1, v1) if v1 else (2, v2 or (root, "/"))
    parts = [part for part in path.split("/") if part]
    return version, [folder for folder in (base.joinpath(*parts[:depth]) for depth in range(len(parts) + 1))
                     if folder.is_dir()]


def _whole(text: str) -> int | None:
    """A cgroup figure as a whole number of 0 or more; None for `max`, -1, an unlimited v1 figure (at least 2^62)
    or anything else."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value < 1 << 62 else None


def _stat(path: Path, name: str) -> int:
    """The figure on ``name``'s line of a memory.stat file; 0 where it is not there."""
    try:
        with open(path) as lines:
            for line in lines:
                fields = line.split()
                if len(fields) == 2 and fields[0] == name:
                    return _whole(fields[1]) or 0
    except OSError:
        return 0
    return 0


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
