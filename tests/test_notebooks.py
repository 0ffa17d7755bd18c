"""Every notebook in notebooks/ runs top to bottom with nbclient (cwd notebooks/, a fresh kernel) and draws its
figures; the pipeline notebook also asserts its bubble fractions against the closed forms inside the notebook,
and the Llama 3 405B notebook its table (TFLOP/s per GPU from 6N + causal attention over the step time, MFU,
the error against the published figure, the losses) against each run's summary, so a wrong figure fails here.
The notebooks run side by side, each in its own kernel, in a process that starts once the session's tests are
collected (tests/notebook_runs.py, started by tests/conftest.py, once for all pytest-xdist workers): they run
beside the tests before this file's, which run last and read what they left."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import notebook_runs
import pytest

NOTEBOOKS = notebook_runs.NOTEBOOKS


def _images(notebook) -> int:
    return sum(1 for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
               if "image/png" in output.get("data", {}))


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda path: path.stem)
def test_notebook_runs_and_draws(path, request):
    """The notebook executed top to bottom in a fresh kernel, read once the session's runner has ended."""
    notebook = notebook_runs.result(notebook_runs.folder_of(request.config), path)
    if isinstance(notebook, str):
        pytest.fail(f"{path.name} stopped:\n{notebook}", pytrace=False)
    assert _images(notebook) >= 1, f"{path.name} drew no figure"


def test_the_studies_notebooks_are_there():
    assert {"pipeline_bubbles", "collectives", "llama3_405b"} <= {path.stem for path in NOTEBOOKS.glob("*.ipynb")}


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda path: path.stem)
@pytest.mark.parametrize("where", ["root", "notebooks", "elsewhere"])
def test_a_notebook_finds_the_repository_from_any_folder(path, where, tmp_path, monkeypatch):
    """The MTBF notebook put Path("..") on sys.path and read its scenario through it, so it ran only from
    notebooks/, and every notebook ran only from there or the root (a student's own folder got 'cannot read file');
    each notebook's setup cell defines REPO, the folder holding scenarios/: this checkout's from the root or
    notebooks/ (its simulator package first on sys.path), the imported trainsim's from anywhere else."""
    sources = [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]
    setup = next((source for source in sources if "\nREPO = " in source), None)
    assert setup is not None, f"{path.name} does not define REPO"
    assert not any('Path("..")' in source for source in sources), f"{path.name} reads files through Path('..')"
    cwd = {"root": NOTEBOOKS.parent, "notebooks": NOTEBOOKS, "elsewhere": tmp_path}[where]
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", list(sys.path))
    namespace: dict = {}
    exec("\n".join(line for line in setup.splitlines() if not line.startswith("%")), namespace)
    assert namespace["CHECKOUT"] == (None if where == "elsewhere" else NOTEBOOKS.parent)
    assert (namespace["REPO"] / "scenarios").is_dir()
    if where != "elsewhere":
        assert sys.path[0] == str(NOTEBOOKS.parent)
        assert namespace["REPO"].resolve() == NOTEBOOKS.parent


def test_the_notebooks_a_session_runs_are_read_off_its_test_ids():
    """An xdist controller sees its workers' test ids alone: the notebooks it starts are those ids name."""
    ids = ["tests/test_notebooks.py::test_notebook_runs_and_draws[pipeline_bubbles]",
           "tests/test_notebooks.py::test_the_studies_notebooks_are_there",
           "tests/test_cli.py::test_run[pipeline_bubbles]"]
    assert notebook_runs.selected(ids) == [NOTEBOOKS / "pipeline_bubbles.ipynb"]
    assert (NOTEBOOKS / "pipeline_bubbles.ipynb").exists()


def test_a_runner_that_ends_without_a_notebook_says_why(tmp_path):
    """A notebook's test waits on the runner's lock, which the runner's end frees however it ends; a runner that
    ended before writing the notebook leaves its log as the test's failure, rather than a test waiting forever."""
    runs = notebook_runs.start([tmp_path / "missing.ipynb"], tmp_path / "runs")
    try:
        said = notebook_runs.result(runs.folder, tmp_path / "missing.ipynb")
    finally:
        runs.stop()
    assert isinstance(said, str) and said.startswith("the notebook runner ended first:")
    assert "FileNotFoundError" in said and "missing.ipynb" in said


def _report(outcome: str) -> pytest.TestReport:
    return pytest.TestReport("tests/test_x.py::test_x", ("tests/test_x.py", 0, "test_x"), {}, outcome, None, "call")


def test_a_session_stopped_by_maxfail_ends_its_runner_at_once(tmp_path):
    """Under `-x` a worker waiting on the runner's lock would keep the session alive until the notebooks finish:
    the session's failures reaching --maxfail end the runner, and the waiting test fails at once."""
    sleeping = tmp_path / "sleeps.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time; time.sleep(120)")]),
                   sleeping)
    runs = notebook_runs.start([sleeping], tmp_path / "runs")
    try:
        ending = notebook_runs.EndAtMaxfail(runs, maxfail=2)
        ending.pytest_runtest_logreport(_report("failed"))
        ending.pytest_runtest_logreport(_report("passed"))
        assert runs.process.poll() is None
        ending.pytest_runtest_logreport(_report("failed"))
        runs.process.wait(timeout=10)
        said = notebook_runs.result(runs.folder, sleeping)
    finally:
        runs.stop()
    assert isinstance(said, str) and said.startswith("the notebook runner ended first:")


def test_a_controller_makes_no_folder_for_a_selection_without_notebooks(tmp_path, monkeypatch):
    """An xdist controller hands its workers the notebooks' folder before they collect, by name: only starting
    the notebooks makes it, so a controller killed (SIGKILL, `timeout`) where none runs leaves no folder."""
    import conftest

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    node = SimpleNamespace(config=SimpleNamespace(stash=pytest.Stash()), workerinput={})
    conftest.pytest_configure_node(node)
    named = Path(node.workerinput[notebook_runs.WORKER_FOLDER])
    assert named.parent == tmp_path and list(tmp_path.iterdir()) == []


def test_a_finished_runner_removes_its_folder_once_its_session_is_gone(tmp_path):
    """A runner whose notebooks are written frees its lock and waits for the session that started it, which ends
    it; where that session was killed instead, the runner removes the folder itself."""
    folder = tmp_path / "runs"
    starting = f"import notebook_runs, pathlib; notebook_runs.start([], pathlib.Path({str(folder)!r}))"
    subprocess.run([sys.executable, "-c", starting], cwd=Path(__file__).parent, check=True)
    deadline = time.monotonic() + 30
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not folder.exists()


def test_a_failing_notebooks_message_has_no_colour_codes():
    traceback = "\x1b[0;31mValueError\x1b[0m: boom\n\x1b[1;32m----> 1\x1b[0m raise ValueError('boom')"
    assert notebook_runs.without_colours(traceback) == "ValueError: boom\n----> 1 raise ValueError('boom')"
