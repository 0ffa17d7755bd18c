"""The share of the machine a process may use (simulator/machine.py), read from fake cgroup (v2 and v1), cgroup
membership and meminfo files: cores from the affinity mask and the CPU quotas, memory from MemAvailable and the
memory limits less their usage, along the process's cgroup path; and every `--workers 0` counting its workers by
it."""

from __future__ import annotations

import os

import pytest
from shared import GIB

from simulator import machine, validation
from simulator.reliability import ahead
from simulator.sweep.executors import PoolExecutor


@pytest.fixture
def cgroup(tmp_path, monkeypatch):
    """A fake cgroup v2 folder, standing for /sys/fs/cgroup, the process in its root cgroup (a container's own
    namespace), on a host whose affinity mask holds 8 CPUs."""
    folder = tmp_path / "cgroup"
    folder.mkdir()
    membership = tmp_path / "membership"
    membership.write_text("0::/\n")
    monkeypatch.setattr(machine, "CGROUP_ROOT", folder)
    monkeypatch.setattr(machine, "MEMBERSHIP", membership)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    return folder


@pytest.mark.parametrize(("cpu_max", "cores"), [
    (None, 8), ("max 100000", 8), ("200000 100000", 2), ("150000 100000", 2), ("50000 100000", 1),
    ("1600000 100000", 8), ("garbled", 8),
])
def test_cores_are_the_affinity_mask_capped_by_the_cgroup_cpu_quota(cgroup, cpu_max, cores):
    """A quota of QUOTA/PERIOD CPUs rounded up caps the 8 CPUs of the mask; no file, `max` or a line that is
    not two numbers leaves the mask's count."""
    if cpu_max is not None:
        (cgroup / "cpu.max").write_text(cpu_max + "\n")
    assert machine.usable_cores() == cores
    assert machine.usable_cores(cgroup) == cores


def test_every_workers_0_counts_the_usable_cores(cgroup, monkeypatch):
    """`--workers 0` of sweep and search (the pool), of a job's states ahead and of validate-published all
    take the quota's 2 cores, not the host's 8."""
    (cgroup / "cpu.max").write_text("200000 100000\n")
    pool = PoolExecutor(0)
    try:
        assert pool.workers == 2
    finally:
        pool.close()
    assert ahead.cores() == 2 and ahead.cores(1) == 1
    (cgroup / "cpu.max").write_text("100000 100000\n")
    ran_in: list[int] = []
    monkeypatch.setattr(validation, "run_case", lambda path: ran_in.append(os.getpid()))
    validation.run_cases([cgroup], workers=0)
    assert ran_in == [os.getpid()]  # one core: the cases run in this process, no pool


def _meminfo(tmp_path, available_kib: int):
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       134217728 kB\nMemFree:         1000 kB\nMemAvailable:   {available_kib} kB\n")
    return path


@pytest.mark.parametrize(("limit", "usage", "room"), [
    (None, None, 100 * GIB), ("max", str(3 * GIB), 100 * GIB), (str(8 * GIB), str(3 * GIB), 5 * GIB),
    (str(8 * GIB), str(9 * GIB), 0), (str(512 * GIB), str(GIB), 100 * GIB),
])
def test_memory_is_memavailable_capped_by_the_cgroup_limit_less_its_usage(cgroup, tmp_path, limit, usage, room):
    """A container limited to 8 GiB using 3 GiB on a host with 100 GiB available has 5 GiB; `max` or no limit
    leaves the host's figure, and a limit above it too."""
    if limit is not None:
        (cgroup / "memory.max").write_text(limit + "\n")
        (cgroup / "memory.current").write_text(usage + "\n")
    assert machine.available_memory(meminfo=_meminfo(tmp_path, 100 * GIB >> 10)) == room


def test_memory_without_meminfo_is_the_cgroups_room_or_unknown(cgroup, tmp_path):
    missing = tmp_path / "no-meminfo"
    assert machine.available_memory(meminfo=missing) is None
    (cgroup / "memory.max").write_text(f"{8 * GIB}\n")
    (cgroup / "memory.current").write_text(f"{2 * GIB}\n")
    assert machine.available_memory(meminfo=missing) == 6 * GIB


def test_a_jobs_workers_ahead_fit_the_containers_memory_not_the_hosts(cgroup, tmp_path, monkeypatch):
    """The job's workers, each counted at the job's resident size (600 MiB), fit the 8 GiB container's 1.8 GiB
    left, 3 of them, not the 128 GiB host's MemAvailable, all 6."""
    monkeypatch.setattr(machine, "MEMINFO", _meminfo(tmp_path, 120 * GIB >> 10))
    monkeypatch.setattr(ahead, "_resident_bytes", lambda: 600 << 20)
    assert ahead.memory_room(6) == 6
    (cgroup / "memory.max").write_text(f"{8 * GIB}\n")
    (cgroup / "memory.current").write_text(f"{8 * GIB - (1900 << 20)}\n")
    assert ahead.memory_room(6) == 3


def _write(folder, files: dict[str, str]):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text + "\n")


def test_a_v2_cgroup_path_takes_the_tightest_quota_and_memory_of_its_parents(cgroup, tmp_path):
    """A process in /user.slice/job.scope of the host's hierarchy (no namespace of its own: Slurm, systemd-run) is held
    to the tightest quota and memory of its cgroup and its parents, not to /sys/fs/cgroup's own files, the host's,
    where neither limit is seen."""
    (tmp_path / "membership").write_text("0::/user.slice/job.scope\n")
    _write(cgroup / "user.slice", {"cpu.max": "300000 100000", "memory.max": str(16 * GIB),
                                   "memory.current": str(4 * GIB), "memory.stat": f"anon 1\ninactive_file {GIB}"})
    _write(cgroup / "user.slice" / "job.scope", {"cpu.max": "max 100000", "memory.max": str(20 * GIB),
                                                 "memory.current": str(2 * GIB)})
    assert machine.usable_cores() == 3
    assert machine.available_memory(meminfo=_meminfo(tmp_path, 100 * GIB >> 10)) == 13 * GIB
    _write(cgroup / "user.slice" / "job.scope", {"cpu.max": "150000 100000", "memory.max": str(6 * GIB)})
    assert machine.usable_cores() == 2
    assert machine.available_memory(meminfo=_meminfo(tmp_path, 100 * GIB >> 10)) == 4 * GIB


def test_cgroup_v1_quota_and_memory_are_read_from_their_hierarchies(cgroup, tmp_path):
    """cgroup v1 (cpu.cfs_quota_us over cpu.cfs_period_us; memory.limit_in_bytes less memory.usage_in_bytes, less
    total_inactive_file's page cache) is read, so a v1 container does not count the host. A container without its own
    namespace names its host's path, not mounted there: its hierarchy's root is its own cgroup."""
    (tmp_path / "membership").write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    _write(cgroup / "cpu,cpuacct", {"cpu.cfs_quota_us": "250000", "cpu.cfs_period_us": "100000"})
    _write(cgroup / "memory", {"memory.limit_in_bytes": str(8 * GIB), "memory.usage_in_bytes": str(5 * GIB),
                               "memory.stat": f"cache {GIB}\ntotal_inactive_file {GIB}"})
    assert machine.usable_cores() == 3
    assert machine.available_memory(meminfo=_meminfo(tmp_path, 100 * GIB >> 10)) == 4 * GIB
    _write(cgroup / "cpu,cpuacct", {"cpu.cfs_quota_us": "-1"})
    _write(cgroup / "memory", {"memory.limit_in_bytes": "9223372036854771712"})
    assert machine.usable_cores() == 8
    assert machine.available_memory(meminfo=_meminfo(tmp_path, 100 * GIB >> 10)) == 100 * GIB


@pytest.mark.parametrize("usage", [None, "garbage", ""])
def test_a_memory_limit_whose_usage_cannot_be_read_still_caps(cgroup, tmp_path, usage):
    """memory.max caps the memory available even where memory.current cannot be read: 8 GiB, not the host's 100."""
    (cgroup / "memory.max").write_text(f"{8 * GIB}\n")
    if usage is not None:
        (cgroup / "memory.current").write_text(usage)
    assert machine.available_memory(meminfo=_meminfo(tmp_path, 100 * GIB >> 10)) == 8 * GIB
