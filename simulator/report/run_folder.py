"""Output folders that cannot lie: a run's files are written into a temporary folder beside `--out` and moved
in only once all of them exist, with a manifest.json naming them; files an earlier run left that this run
did not write are removed (charts `plot` saved into the folder included: it lists them in the manifest);
readers check the manifest before trusting a folder.

The move is a handful of renames within one file system, done with Ctrl-C and SIGTERM held back, and the old
manifest is removed first and the new one written last: a run interrupted before the move leaves the previous
complete run, one interrupted during it the new complete run, and a killed one (SIGKILL) at worst a folder
without a manifest, which `plot` refuses.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import orjson

from simulator.errors import STOP_SIGNALS, InterruptedWritten, ScenarioError, Terminated
from simulator.report.atomic import write_bytes
from simulator.stops import raise_dropped

if TYPE_CHECKING:
    import pandas as pd

MANIFEST = "manifest.json"
RUN_OUTPUTS = ("summary.json", "timeline.parquet", "faults.parquet", "trace.json", "trace.json.gz", "job_summary.json",
               "job_events.parquet")
"""Files `trainsim run` may write (a step or a job); any of them not written by the latest run is stale and
removed."""
NO_TIMELINE = " (run.timeline: summary writes none; run it again with --set run.timeline=full or per-stage)"
NO_JOB_TIMELINE = " (a job over weeks writes its events, not a step's timeline: run the step without run.horizon)"
"""Why a folder lacks the timeline a chart reads, and what to do: a step's, and a job's."""
FIGURES = "figures"
"""Manifest key: the images `trainsim plot` saved into the run folder (removed by the next run into it)."""
OUTDIR_FIELD = "OUTDIR"
OUTDIR_ALLOWED = "a folder written by `trainsim run SCENARIO --out DIR` (with its manifest.json)"


class FolderKind(NamedTuple):
    """A kind of output folder: what it holds, in words, the command that writes it, the file that tells it apart
    for its charts (`marker`), those that tell it apart in a manifest's list or, for a sweep (no manifest), in the
    folder (`files`), and its charts."""

    what: str
    command: str
    marker: str
    files: tuple[str, ...]
    charts: str


SWEEP_FOLDER = FolderKind("a sweep", "trainsim sweep", "results.parquet",
                          ("points.jsonl", "results.parquet", "results.csv"),
                          "its charts are `trainsim plot sweep`, `heatmap` and `busbw`")
SEARCH_FOLDER = FolderKind("a layout search", "trainsim search", "candidates.parquet",
                           ("candidates.parquet", "candidates.csv", "search.json"),
                           "its chart is `trainsim plot front`")
STUDY_FOLDER = FolderKind("a study", "trainsim study", "study.json", ("study.json", "study.csv"),
                          "its chart is `trainsim plot goodput`")
RUN_FOLDER = FolderKind("a run", "trainsim run", "timeline.parquet", RUN_OUTPUTS,
                        "its charts are `trainsim plot gantt` and `memory`")
FOLDER_KINDS = (SWEEP_FOLDER, SEARCH_FOLDER, STUDY_FOLDER, RUN_FOLDER)
"""Every kind of output folder, one per command that writes one (a step's run and a job's are both `trainsim
run`'s, each replacing the other)."""
FOLDER_CHARTS = {kind.marker: f"{kind.what}'s folder: {kind.charts}" for kind in FOLDER_KINDS}
"""The file that tells each kind of output folder apart, and the charts that read it: a chart given another
kind's folder says which it is (`plot gantt` of a search's folder said 'this run wrote no summary.json')."""


def other_kind(out_dir: Path, needed: tuple[str, ...]) -> str | None:
    """What ``out_dir`` is, with its charts, where it holds another kind's file than the ``needed`` ones; None
    where it holds none (or is not a folder)."""
    return next((kind for marker, kind in FOLDER_CHARTS.items()
                 if marker not in needed and (Path(out_dir) / marker).is_file()), None)


def trainsim_version() -> str:
    """The installed trainsim version, as `--version` prints it and manifest.json records it ('unknown (not
    installed)' when running from a source tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainsim")
    except PackageNotFoundError:
        return "unknown (not installed)"


def file_digest(path: Path) -> str:
    """SHA-256 of a file, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold back SIGINT and SIGTERM for the duration (main thread only), then hand the first that came to the
    handler it was held back from: Python's raises KeyboardInterrupt, the console script's raise it (Terminated
    for SIGTERM) and ignore later ones, an outer hold holds it in turn, SIG_IGN ignores it (SIG_DFL, or a handler
    set outside Python: KeyboardInterrupt for SIGINT, the default end of the process for SIGTERM). Raising
    KeyboardInterrupt here instead put the console script's handler back where it had switched to ignoring,
    so that a second press printed a traceback at exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[signal.Signals] = []
    previous = {signum: signal.signal(signum, lambda signum, _frame: received.append(signal.Signals(signum)))
                for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if not received:
        return
    signum, handler = received[0], previous[received[0]]
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_IGN:
        return
    elif signum == signal.SIGTERM and handler == signal.SIG_DFL:
        signal.raise_signal(signum)
    else:
        raise KeyboardInterrupt


def _manifest(out_dir: Path) -> dict:
    """The folder's current manifest, or an empty one when it has none readable."""
    try:
        manifest = orjson.loads((out_dir / MANIFEST).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _previous_files(out_dir: Path) -> set[str]:
    """Plain file names the folder's current manifest lists: the run's files and the figures `plot` saved
    beside them (`record_figure`)."""
    manifest = _manifest(out_dir)
    listed = [*(manifest.get("files") or ()), *(manifest.get(FIGURES) or ())]
    return {name for name in listed if isinstance(name, str) and name == Path(name).name and not name.startswith(".")}


def earlier_files(out_dir: Path) -> set[str] | None:
    """The files of the results ``out_dir`` holds by its manifest (the files and figures it lists, the manifest
    included), which a rerun of the same command replaces; None where it has no readable manifest."""
    return ({*_previous_files(out_dir), MANIFEST} if _manifest(out_dir) else None)


def folder_kind(out_dir: Path) -> tuple[FolderKind, list[str]] | None:
    """The kind of results ``out_dir`` holds with their files: a search's, a study's or a run's where its manifest
    lists their files (the manifest included), a sweep's where it has no manifest and its points.jsonl holds a
    sweep's records (a user's own results.csv there is no sweep's); None where it holds none of these (or is no
    folder)."""
    manifest = _manifest(out_dir)
    if manifest:
        listed = set(manifest.get("files") or ())
        kind = next((kind for kind in FOLDER_KINDS if kind is not SWEEP_FOLDER and listed & set(kind.files)), None)
        return None if kind is None else (kind, sorted({*listed, MANIFEST}))
    if not _holds_sweep_records(out_dir):
        return None
    return SWEEP_FOLDER, [name for name in SWEEP_FOLDER.files if (out_dir / name).is_file()]


def _holds_sweep_records(out_dir: Path) -> bool:
    """Whether ``out_dir``'s points.jsonl holds a record a sweep wrote (`sweep/results.read_records`; its module
    imports pandas, which a run into a folder without that file does not)."""
    if not (out_dir / SWEEP_FOLDER.files[0]).is_file():
        return False
    from simulator.sweep.results import read_records

    return bool(read_records(out_dir))


def other_results(out_dir: Path, kind: FolderKind) -> tuple[str, str] | None:
    """Why ``kind``'s command may not write into ``out_dir``, with what it may write into, where the folder holds
    another command's results: writing would delete the files its manifest lists (`trainsim run --out` of a
    search's folder deleted its candidates, exit 0, no word) or mix its files with another's (a sweep deletes
    nothing, but writes beside them); or, for a sweep, where files of a sweep's names lie there that no sweep
    wrote (it overwrote a user's results.csv); None where it holds none or ``kind``'s own (a rerun of the same
    command replaces them)."""
    out_dir = Path(out_dir)
    found = folder_kind(out_dir)
    allowed = f"a new folder, or one {kind.command} wrote; remove the files of {out_dir} first to replace them"
    if found is None:
        foreign = [name for name in SWEEP_FOLDER.files if (out_dir / name).is_file()]
        if kind is not SWEEP_FOLDER or not foreign:
            return None
        return (f"{out_dir} holds {', '.join(foreign)}, which no trainsim sweep wrote (no sweep's points in "
                f"{SWEEP_FOLDER.files[0]}) and {kind.command} would overwrite", allowed)
    held, files = found
    if held is kind:
        return None
    harm = "would write its files beside" if SWEEP_FOLDER in (held, kind) else "would delete"
    return f"{out_dir} holds {held.what}'s results ({', '.join(files)}), which {kind.command} {harm}", allowed


def record_figure(out_dir: Path, figure: Path) -> None:
    """Add ``figure`` to the manifest's figures when it was saved inside the run folder ``out_dir``, so that
    the next run into that folder removes it with the rest of this run's files (a chart of an earlier run
    must not sit beside a new run). The manifest is replaced in one rename."""
    out_dir, figure = Path(out_dir), Path(figure)
    if figure.resolve().parent != out_dir.resolve():
        return
    manifest = _manifest(out_dir)
    if not manifest:
        return
    names = [name for name in manifest.get(FIGURES) or () if name != figure.name]
    manifest[FIGURES] = sorted([*names, figure.name])
    write_bytes(out_dir / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def write_run_folder(out_dir: Path, identity: dict, write: Callable[[Path], None],
                     kind: FolderKind = RUN_FOLDER) -> list[str]:
    """Call ``write(stage)`` to write ``kind``'s files into a fresh temporary folder beside ``out_dir``, add
    manifest.json (``identity`` plus each file's size and SHA-256), then move everything into ``out_dir`` and
    remove the stale files of an earlier run: those its manifest lists and ``kind``'s own names (a search or a
    study into a folder without a readable manifest deleted the run's names found there, a user's summary.json
    included). Returns the file names written, manifest last. On any error or
    Ctrl-C before the move, ``out_dir`` is left as it was and the temporary folder is removed; Ctrl-C during
    the move is held back to its end and then raised as InterruptedWritten: the folder holds the new run, as it
    does for a stop landing after the move, while the temporary folder goes (that one said only 'interrupted'
    before). The temporary folder's removal is held back too: a stop landing in it left a `.NAME.partial-*`
    folder beside ``out_dir`` (1 stop in 12 at the moment the files were written, on a loaded machine). A stop
    that Python dropped while the files were written (simulator/stops.py) is raised before the move."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    moved = False
    try:
        try:
            write(stage)
            names = sorted(path.name for path in stage.iterdir() if path.is_file())
            files = {name: {"bytes": (stage / name).stat().st_size, "sha256": file_digest(stage / name)}
                     for name in names}
            (stage / MANIFEST).write_bytes(orjson.dumps({**identity, "files": files},
                                                        option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
            raise_dropped()
            out_dir.mkdir(exist_ok=True)
            stale = (_previous_files(out_dir) | set(kind.files)) - set(names) - {MANIFEST}
            with interrupts_held():
                (out_dir / MANIFEST).unlink(missing_ok=True)
                for name in names:
                    os.replace(stage / name, out_dir / name)
                for name in sorted(stale):
                    (out_dir / name).unlink(missing_ok=True)
                os.replace(stage / MANIFEST, out_dir / MANIFEST)
                moved = True
            return [*names, MANIFEST]
        finally:
            with interrupts_held():
                shutil.rmtree(stage, ignore_errors=True)
    except KeyboardInterrupt as stop:
        if not moved:
            raise
        raise InterruptedWritten(out_dir, terminated=isinstance(stop, Terminated)) from None


def outdir_error(out_dir: Path, problem: str, allowed: str = OUTDIR_ALLOWED) -> ScenarioError:
    """An OUTDIR argument that `plot` and the readers cannot use, blamed on it; ``allowed`` says what it should
    be: a run folder unless a study chart's reader names its own (a sweep or search folder, a JSON file)."""
    return ScenarioError(problem, field=OUTDIR_FIELD, allowed=allowed, file=str(out_dir))


def read_parquet_table(path: Path, out_dir: Path, allowed: str = OUTDIR_ALLOWED) -> pd.DataFrame:
    """The Parquet file ``path`` as a DataFrame; one that cannot be read is an error blamed on ``out_dir``."""
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a corrupt file
        raise outdir_error(out_dir, f"{path.name} is not readable ({type(exc).__name__})", allowed) from None


def checked_manifest(out_dir: Path, needed: tuple[str, ...], allowed: str = OUTDIR_ALLOWED) -> dict:
    """The folder's manifest, after checking that it lists every file in ``needed``, that every file it lists
    is there, that the ``needed`` ones are the very files the run wrote (size and SHA-256), and that no other
    run output lies beside them. Anything else is a ScenarioError on OUTDIR, saying what the folder should be
    (``allowed``: a `trainsim run` folder, or a study's or a search's that a chart reads)."""
    out_dir = Path(out_dir)

    def refuse(problem: str) -> ScenarioError:
        return outdir_error(out_dir, problem, allowed)

    if not out_dir.is_dir():
        raise refuse("is a file, not a run folder" if out_dir.exists() else "no such folder")
    path = out_dir / MANIFEST
    if not path.is_file():
        raise refuse(other_kind(out_dir, needed)
                     or "has no manifest.json (not a complete trainsim run, or written before manifests)")
    try:
        manifest = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise refuse(f"manifest.json is not readable JSON ({exc})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise refuse("manifest.json lists no files")
    for name in needed:
        if name not in files:
            why = "" if name != "timeline.parquet" else NO_JOB_TIMELINE if "job_summary.json" in files else NO_TIMELINE
            raise refuse(other_kind(out_dir, needed) or f"this run wrote no {name}{why}")
    for name, entry in sorted(files.items()):
        target = out_dir / str(name)
        if not target.is_file():
            raise refuse(f"{name} of this run is missing (incomplete folder)")
        expected = entry if isinstance(entry, dict) else {}
        if name in needed and (target.stat().st_size != expected.get("bytes")
                               or file_digest(target) != expected.get("sha256")):
            raise refuse(f"{name} is not the file this run wrote (mixed or edited folder)")
    strangers = [name for name in RUN_OUTPUTS if name not in files and (out_dir / name).exists()]
    if strangers:
        raise refuse(f"{', '.join(strangers)} {'belongs' if len(strangers) == 1 else 'belong'} to another run "
                     "(mixed folder)")
    return manifest
