"""Notebooks execute headless: classes defined in cells (``__main__``) must train in workers."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize("name", ["quickstart.ipynb", "ddp.ipynb"])
def test_notebook_runs_top_to_bottom(name, tmp_path):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    resources = {"metadata": {"path": str(tmp_path)}}
    client = NotebookClient(notebook, timeout=240, kernel_name="python3", resources=resources)
    client.execute()
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = "".join(output.get("text", "") for cell in code_cells for output in cell.outputs)
    assert "samples/s" in outputs
