"""The notebooks a test session runs, executed by a process of their own that starts once the tests are collected:
each notebook top to bottom with nbclient in a fresh kernel (cwd notebooks/), all of them side by side. The suite
runs its tests on one core; the notebooks run beside the tests before tests/test_notebooks.py on the other cores,
and that file's tests read what they left instead of stopping the suite for them while the notebooks run.

Run as a script, it executes the notebooks named after the pid of the session that started it and its output
folder and writes, for each, the executed notebook (`<stem>.ipynb`) or the error that stopped it (`<stem>.error`)."""

from __future__ import annotations

import asyncio
import os
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


@dataclass(frozen=True)
class NotebookRuns:
    """The process executing ``paths`` and the folder it writes them to."""

    paths: tuple[Path, ...]
    folder: Path
    process: subprocess.Popen

    def results(self) -> dict[Path, nbformat.NotebookNode | str]:
        """Each notebook executed, or the error that stopped it, once the process has ended."""
        self.process.wait()
        found: dict[Path, nbformat.NotebookNode | str] = {}
        for path in self.paths:
            executed, error = self.folder / f"{path.stem}.ipynb", self.folder / f"{path.stem}.error"
            if executed.exists():
                found[path] = nbformat.read(executed, as_version=4)
            elif error.exists():
                found[path] = error.read_text()
            else:
                log = (self.folder / "runner.log").read_text()
                found[path] = f"the notebook runner ended (exit status {self.process.returncode}) first:\n{log}"
        return found

    def stop(self) -> None:
        """End the runner where the session ends before the notebooks' tests read them, and remove its folder.
        SIGKILL, since nbclient catches SIGTERM and would finish the notebooks first; the kernels, each in a session
        of its own, end within ~2 s of the runner (ipykernel watches its parent's pid)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


RUNS = pytest.StashKey[NotebookRuns]()
"""The session's notebooks executing, where it selected tests/test_notebooks.py's (its config's stash)."""


def selected(session: pytest.Session) -> list[Path]:
    """The notebooks that the session's selected tests run (`-k pipeline`: the pipeline notebook alone)."""
    return sorted({item.callspec.params["path"] for item in session.items
                   if getattr(item, "originalname", None) == "test_notebook_runs_and_draws"})


def started(session: pytest.Session) -> NotebookRuns:
    """The session's notebooks executing, started once its tests were collected."""
    return session.config.stash[RUNS]


def start(paths: list[Path]) -> NotebookRuns:
    """Start executing ``paths`` in a process of their own (a session of its own, away from the terminal's
    Ctrl-C), its output and its kernels' in the folder's runner.log rather than in a test's captured output."""
    folder = Path(tempfile.mkdtemp(prefix="trainsim-notebooks-"))
    with (folder / "runner.log").open("w") as log:
        process = subprocess.Popen([sys.executable, __file__, str(os.getpid()), str(folder), *map(str, paths)],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    return NotebookRuns(tuple(paths), folder, process)


async def _execute(path: Path, folder: Path) -> None:
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    try:
        await NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                             resources={"metadata": {"path": str(path.parent)}}).async_execute()
    except Exception:
        (folder / f"{path.stem}.error").write_text(traceback.format_exc())
    else:
        nbformat.write(notebook, folder / f"{path.stem}.ipynb")


async def _execute_all(session: int, folder: Path, paths: list[Path]) -> None:
    """Execute ``paths`` side by side; where the ``session`` that started them (its pid, given by `start`, so
    that a session killed while this process imports counts as gone) is no longer its parent (killed before
    `NotebookRuns.stop` could end this process), remove ``folder`` and end at once, the kernels ending with this
    process (they watch their parent)."""
    running = asyncio.gather(*(_execute(path, folder) for path in paths))
    while not running.done():
        await asyncio.wait([running], timeout=1.0)
        if os.getppid() != session:
            shutil.rmtree(folder, ignore_errors=True)
            os._exit(1)


if __name__ == "__main__":
    asyncio.run(_execute_all(int(sys.argv[1]), Path(sys.argv[2]), [Path(argument) for argument in sys.argv[3:]]))
