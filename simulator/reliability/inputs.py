"""The files beside a scenario that its step reads, as part of the keys of the job's process-wide caches.

A scenario's text names a replayed trace by its glob, a custom schedule table and a topology file by their paths,
each relative to the scenario's folder: the same text in runA/job.yaml and runB/job.yaml, or before and after a
trace file is edited in a notebook session, reads other files. Keyed on the text alone, the second job took the
first one's steps (`states.StepStates`) and elastic sizes (`elastic.elastic_sizes`). Each file counts by its
absolute path, size and modification time in nanoseconds (`os.stat`), not a hash of its bytes: a job's traces can
be gigabytes that a study's every point would read again to look its steps up, while a stat costs microseconds
and changes with any write (a copy of the same bytes elsewhere is simulated again, which costs time, not truth).
"""

from __future__ import annotations

from pathlib import Path

from simulator.config.loader import LoadedScenario
from simulator.config.locate import located
from simulator.config.traces import TraceWorkload
from simulator.topology.loader import resolve_topology_path
from simulator.workload.traces.program import trace_files


def read_files(loaded: LoadedScenario) -> tuple[Path, ...]:
    """The files the scenario's step reads, resolved from its folder: its topology file (a bundled one's too),
    its schedule table if any, and a replayed trace's files (none matching refused, located, as the step would)."""
    scenario = loaded.scenario
    folder = Path(loaded.source).parent
    files = [resolve_topology_path(scenario.cluster.topology, folder)]
    table = scenario.parallelism.pipeline.table
    if table is not None:
        files.append(folder / table)
    workload = scenario.workload
    if isinstance(workload, TraceWorkload):
        files += located(loaded, lambda: trace_files(workload.trace, folder))
    return tuple(files)


def files_key(loaded: LoadedScenario) -> str:
    """The files of `read_files`, each as its absolute path, size and modification time (ns), one line each."""
    lines = []
    for file in read_files(loaded):
        path = file.resolve()
        stat = path.stat() if path.is_file() else None
        lines.append(f"{path} {stat.st_size if stat else -1} {stat.st_mtime_ns if stat else -1}")
    return "\n".join(lines)
