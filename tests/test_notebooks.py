"""Every notebook in notebooks/ runs top to bottom with nbclient (cwd notebooks/, a fresh kernel) and draws its
figures; the pipeline notebook also asserts its bubble fractions against the closed forms inside the notebook,
and the Llama 3 405B notebook its table (TFLOP/s per GPU from 6N + causal attention over the step time, MFU,
the error against the published figure, the losses) against each run's summary, so a wrong figure fails here.
The notebooks run side by side, each in its own kernel, in a process that starts once the session's tests are
collected (tests/notebook_runs.py, started by tests/conftest.py, once for all pytest-xdist workers): they run
beside the tests before this file's, which run last and read what they left."""

from __future__ import annotations

from pathlib import Path

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
@pytest.mark.parametrize("cwd", [NOTEBOOKS.parent, NOTEBOOKS], ids=["from the root", "from notebooks"])
def test_a_notebook_finds_the_repository_root_from_either_folder(path, cwd, monkeypatch):
    """The MTBF notebook put Path("..") on sys.path and read its scenario through it, so it ran only from
    notebooks/; each notebook defines REPO, the checkout's root from the root or from notebooks/, and reaches
    the repository's files through it alone."""
    sources = [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]
    definition = next((line for source in sources for line in source.splitlines() if line.startswith("REPO = ")),
                      None)
    assert definition is not None, f"{path.name} does not define REPO"
    assert not any('Path("..")' in source for source in sources), f"{path.name} reads files through Path('..')"
    monkeypatch.chdir(cwd)
    namespace: dict = {"Path": Path}
    exec(definition, namespace)
    assert namespace["REPO"].resolve() == NOTEBOOKS.parent

