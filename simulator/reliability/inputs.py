"""The files beside a scenario that its step reads, as part of the keys of the job's process-wide caches.

A scenario's text names a replayed trace by its glob, a custom schedule table and a topology file by their paths,
each relative to the scenario's folder: the same text in runA/job.yaml and runB/job.yaml, or before and after a
trace file is edited in a notebook session, reads other files. Keyed on the text alone, the second job took the
first one's steps (`states.StepStates`) and elastic sizes (`elastic.elastic_sizes`). Each file counts by its
absolute path, size and modification time in nanoseconds (`os.stat`), not a hash of its bytes: a job's traces can
be gigabytes that a study's every point would read again to look its steps up, while a stat costs microseconds
and changes with any write (a copy of the same bytes elsewhere is simulated again, which costs time, not truth).

A sweep's point key (`sweep.spec.point_key`) outlives the process, so it digests the files' bytes instead
(`contents_key`): a resumed sweep reuses a point only for the same files, wherever they lie and whatever their
times.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from simulator.config.loader import LoadedScenario
from simulator.config.locate import located
from simulator.config.yaml_source import FieldPath
from simulator.errors import InputError
from simulator.topology.loader import names_a_file, resolve_topology_path
from simulator.workload.traces.program import trace_files


@dataclass(frozen=True)
class FileField:
    """A scenario field whose text names files relative to the scenario's folder: ``files`` resolves its text to
    the files the step reads, ``names_a_file`` tells a path from a name that is not one (a bundled topology)."""

    path: FieldPath
    files: Callable[[LoadedScenario, str, Path], list[Path]]
    names_a_file: Callable[[str], bool] = lambda text: True


FILE_FIELDS = (
    FileField(("cluster", "topology"), lambda loaded, text, folder: [resolve_topology_path(text, folder)],
              names_a_file),
    FileField(("parallelism", "pipeline", "table"), lambda loaded, text, folder: [folder / text]),
    FileField(("workload", "trace"),
              lambda loaded, text, folder: located(loaded, lambda: trace_files(text, folder))),
)
"""The fields whose text names files relative to the scenario's folder, in the order `read_files` lists them:
the typed scenario's (`read_files`) and a sweep's raw data (`sweep.spec.absolute_files`) both read these."""


def read_files(loaded: LoadedScenario) -> tuple[Path, ...]:
    """The files the scenario's step reads, resolved from its folder: its topology file (a bundled one's too),
    its schedule table if any, and a replayed trace's files (none matching refused, located, as the step would)."""
    folder = Path(loaded.source).parent
    files: list[Path] = []
    for field in FILE_FIELDS:
        node: object = loaded.scenario
        for part in field.path:
            node = getattr(node, part, None)
        if isinstance(node, str):
            files += field.files(loaded, node, folder)
    return tuple(files)


def files_key(loaded: LoadedScenario) -> str:
    """The files of `read_files`, each as its absolute path, size and modification time (ns), one line each."""
    lines = []
    for file in read_files(loaded):
        path = file.resolve()
        stat = path.stat() if path.is_file() else None
        lines.append(f"{path} {stat.st_size if stat else -1} {stat.st_mtime_ns if stat else -1}")
    return "\n".join(lines)


def contents_key(loaded: LoadedScenario, digests: dict[Path, str]) -> str:
    """The files of `read_files`, each as its path relative to the scenario's folder (its name where it lies
    elsewhere: a bundled topology, whose name the scenario holds) and the
    SHA-256 of its bytes, one line each; a bundled topology counts by its bytes too (an edited checkout's file, or
    another trainsim's, is another fabric). A file missing, or a name no file answers to, is its error's text,
    so that the point runs again, and fails as the step would, once the file is there. ``digests``: the files
    hashed so far, by absolute path (a sweep's points share their files)."""
    folder = Path(loaded.source).parent
    try:
        files = read_files(loaded)
    except InputError as exc:
        return f"unreadable: {exc.problem}"
    lines = []
    for file in files:
        path = file.resolve()
        if path not in digests:
            digests[path] = _sha256(path) if path.is_file() else "absent"
        shown = file.relative_to(folder).as_posix() if file.is_relative_to(folder) else file.name
        lines.append(f"{shown} {digests[path]}")
    return "\n".join(lines)


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
