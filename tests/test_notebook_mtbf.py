"""notebooks/mtbf_checkpoint_interval.ipynb runs top to bottom (nbclient) with this checkout's simulator, and
shows the interruption table against the paper, the interval curves and the sync/async comparison."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "mtbf_checkpoint_interval.ipynb"


def test_mtbf_notebook_runs_top_to_bottom(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    text = "\n".join(output.get("text", "") or str(output.get("data", {}).get("text/plain", ""))
                     for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", []))
    assert "unexpected: paper 419" in text
    assert "daly_interval_s" in text
    assert "async" in text
    assert any(output.get("data", {}).get("image/png") for cell in notebook.cells
               for output in cell.get("outputs", []))
