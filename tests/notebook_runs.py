"""The notebooks a test session runs, executed by a process of their own that starts once the tests are collected:
each notebook top to bottom with nbclient in a fresh kernel (cwd notebooks/), all of them side by side, beside the
tests, whose workers (pytest-xdist) take the cores the notebooks leave; tests/test_notebooks.py's tests, collected
last, read what the notebooks left instead of stopping the suite for them while they run. Under pytest-xdist the
session's controller starts them, once, into a folder it hands to every worker; without xdist the session itself.

Run as a script, it executes the notebooks named after the pid of the session that started it, its output folder
and the descriptor of the lock on the folder's `runner.lock` that `start` takes for it, and writes, for each, the
executed notebook (`<stem>.ipynb`) or the error that stopped it (`<stem>.error`, without the traceback's colour
codes); it holds the lock until it has written them all, then waits for the session, and removes the folder where
the session is gone before ending it (a controller killed by SIGKILL or SIGTERM)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

CELL_TIMEOUT_S = 300
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TEST_NAME = "test_notebook_runs_and_draws"
WORKER_FOLDER = "trainsim_notebooks"
"""The key of the notebooks' folder in an xdist worker's `workerinput`."""


@dataclass(frozen=True)
class NotebookRuns:
    """The process executing a session's notebooks and the folder it writes them to."""

    folder: Path
    process: subprocess.Popen

    def end(self) -> None:
        """End the runner, freeing its lock: the notebooks' tests waiting on it read its log at once. SIGKILL, since
        nbclient catches SIGTERM and would finish the notebooks first; the kernels, each in a session of its own,
        end within ~2 s of the runner (ipykernel watches its parent's pid)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """End the runner as the session ends, whether or not the notebooks' tests read them, and remove its
        folder."""
        self.end()
        shutil.rmtree(self.folder, ignore_errors=True)


class EndAtMaxfail:
    """A plugin of the session that started the runner, ending it once as many tests failed as `-x` or
    `--maxfail` allow: under pytest-xdist a worker already waiting on the runner's lock would otherwise keep the
    stopping session alive until the notebooks finish (its test then fails, the runner having ended first)."""

    def __init__(self, runs: NotebookRuns, maxfail: int) -> None:
        self.runs, self.maxfail, self.failed = runs, maxfail, 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Count the failed reports as pytest-xdist's controller does, and end the runner at ``maxfail``."""
        self.failed += report.failed
        if self.failed >= self.maxfail:
            self.runs.end()


RUNS = pytest.StashKey[NotebookRuns]()
"""The session's notebooks executing, where it selected tests/test_notebooks.py's (the starting config's stash)."""


def result(folder: Path, path: Path) -> nbformat.NotebookNode | str:
    """The notebook ``path`` executed, or the error that stopped it, once the runner writing ``folder`` has ended
    (its lock file free: a process's locks go with it, however it ends)."""
    with (folder / "runner.lock").open() as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
    executed, error = folder / f"{path.stem}.ipynb", folder / f"{path.stem}.error"
    if executed.exists():
        return nbformat.read(executed, as_version=4)
    if error.exists():
        return error.read_text()
    return f"the notebook runner ended first:\n{(folder / 'runner.log').read_text()}"


def folder_of(config: pytest.Config) -> Path:
    """The folder the session's notebooks are written to: the one the controller handed to this xdist worker, or
    the one this session started them into."""
    worker = getattr(config, "workerinput", None)
    return Path(worker[WORKER_FOLDER]) if worker is not None else config.stash[RUNS].folder


def selected(nodeids: list[str]) -> list[Path]:
    """The notebooks that the tests ``nodeids`` run (`-k pipeline`: the pipeline notebook alone)."""
    pattern = re.compile(rf"::{TEST_NAME}\[(.+)\]$")
    return sorted({NOTEBOOKS / f"{found.group(1)}.ipynb" for found in map(pattern.search, nodeids) if found})


def start(paths: list[Path], folder: Path) -> NotebookRuns:
    """Make ``folder`` and start executing ``paths`` into it in a process of their own (a session of its own, away
    from the terminal's Ctrl-C), its output and its kernels' in the folder's runner.log rather than in a test's
    captured output. The runner's lock is taken here, before any test can ask for it, and handed to the runner
    alone."""
    folder.mkdir()
    lock = os.open(folder / "runner.lock", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with (folder / "runner.log").open("w") as log:
            process = subprocess.Popen([sys.executable, __file__, str(os.getpid()), str(folder), str(lock),
                                        *map(str, paths)],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, pass_fds=(lock,))
    finally:
        os.close(lock)
    return NotebookRuns(folder, process)


def folder_name() -> Path:
    """A folder, not yet made, for a session's notebooks: `start` makes it, so that a session that runs none makes
    none (its controller hands the name to its workers before they collect)."""
    return Path(tempfile.gettempdir()) / f"trainsim-notebooks-{os.getpid()}-{secrets.token_hex(4)}"


def without_colours(text: str) -> str:
    """``text`` without the ANSI colour codes that IPython puts in a cell's traceback."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


async def _execute(path: Path, folder: Path) -> None:
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    try:
        await NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                             resources={"metadata": {"path": str(path.parent)}}).async_execute()
    except Exception:
        (folder / f"{path.stem}.error").write_text(without_colours(traceback.format_exc()))
    else:
        nbformat.write(notebook, folder / f"{path.stem}.ipynb")


async def _execute_all(session: int, folder: Path, lock: int, paths: list[Path]) -> None:
    """Execute ``paths`` side by side, then free the ``lock`` (a notebook that cannot be read ends this process
    instead) and wait; where the ``session`` that started them (its pid, given by `start`, so that a session killed
    while this process imports counts as gone) is no longer its parent (killed before `NotebookRuns.stop` could
    end this process), remove ``folder`` and end at once, the kernels ending with this process (they watch their
    parent)."""
    running = asyncio.gather(*(_execute(path, folder) for path in paths))
    while os.getppid() == session and not running.done():
        await asyncio.wait([running], timeout=1.0)
    if running.done():
        running.result()
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)
    while os.getppid() == session:
        await asyncio.sleep(1.0)
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(1)


if __name__ == "__main__":
    asyncio.run(_execute_all(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]),
                             [Path(argument) for argument in sys.argv[4:]]))
