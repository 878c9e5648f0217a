"""Notebooks execute headless: classes defined in cells (``__main__``), or in a module of the notebook edited under
``%autoreload``, train in workers as the kernel holds them."""

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.workloads import MODELS

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["quickstart.ipynb", "ddp.ipynb"])
def test_notebook_runs_top_to_bottom(name, tmp_path):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    resources = {"metadata": {"path": str(tmp_path)}}
    client = NotebookClient(notebook, timeout=240, kernel_name="python3", resources=resources)
    client.execute()
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = "".join(output.get("text", "") for cell in code_cells for output in cell.outputs)
    assert "samples/s" in outputs




@pytest.mark.slow
def test_autoreload_edits_train_in_the_next_burst(tmp_path, monkeypatch):
    """The notebook loop: %autoreload 2, the model's module imported before accel_widgets, a burst, the module
    edited: the next bursts (one rank; DDP x 2 with a loader worker each) train the edited code, as calling Net() in
    the kernel does. (output - target)^2 is 1 before the edit and 4 after it."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # the edit keeps the file's size: no stale .pyc either
    (tmp_path / "models.py").write_text(MODELS.format(output=1.0, target=0.0))
    cells = [
        "%load_ext autoreload\n%autoreload 2",
        "import json\nimport torch.nn.functional as F\nfrom models import Net, Data",
        "import accel_widgets as aw\n\ndef workload():\n"
        "    return aw.Workload(model=Net, dataset=Data(), loss_fn=F.mse_loss, batch_size=4)",
        "print('before', json.dumps(aw.run_burst(workload(), steps=1).losses(rank=0)))",
        f"import pathlib\npathlib.Path('models.py').write_text({MODELS.format(output=3.0, target=1.0)!r})",
        "single = aw.run_burst(workload(), steps=1)\n"
        "ddp = aw.run_burst(workload(), aw.Config(parallel='ddp', world_size=2, num_workers=1), steps=1)\n"
        "print('after', json.dumps([single.losses(rank=0), ddp.losses(rank=0), ddp.losses(rank=1)]))",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    NotebookClient(notebook, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = dict(line.split(" ", 1) for cell in notebook.cells for output in cell.outputs
                   for line in output.get("text", "").splitlines() if line.startswith(("before", "after")))
    assert json.loads(printed["before"]) == [1.0] * 3
    assert json.loads(printed["after"]) == [[4.0] * 3] * 3
