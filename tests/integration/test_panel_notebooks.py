"""The panel notebooks execute headless, top to bottom, with short bursts on the CPU.

Without a front end the widgets still work on the kernel side (buttons are clicked with ``.click()``),
so this checks the notebooks' code and the panel's kernel-side behaviour; the browser test
(tests/integration/test_panel_in_a_browser.py) checks the rendering. tuning.ipynb runs in the browser only
(tests/integration/test_panel_on_one_screen.py checks what it prints there).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PLOTLY = "application/vnd.plotly.v1+json"


def execute(name: str, tmp_path: Path, **parameters: object) -> tuple[str, set[str]]:
    """Run the notebook, its cell tagged "parameters" replaced by ``parameters`` where given (papermill's
    convention); return its text output and the MIME types it displayed."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    if parameters:
        (cell,) = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
        cell.source = "\n".join(f"{key} = {value!r}" for key, value in parameters.items())
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    text = "".join(output.get("text", "") for output in outputs)
    text += "".join(output.get("data", {}).get("text/markdown", "") for output in outputs)
    mimes = {mime for output in outputs for mime in output.get("data", {})}
    return text, mimes


@pytest.mark.slow
def test_workshop_notebook_compares_every_group_with_the_folklore(tmp_path: Path) -> None:
    """Without the compile lesson's cold compile (tests/engine/test_compile.py compiles), at 6 steps a first burst
    and a budget that ends each comparison after its first bursts: what the lessons print is what is checked here,
    the engine's blocks and verdicts in tests/search/test_compare.py and the figures in tests/views/test_figures.py."""
    text, mimes = execute("workshop.ipynb", tmp_path, STEPS=6, BUDGET=1, LEAVE_OUT=("compile",))
    lines = text.splitlines()
    (floor,) = [line for line in lines if line.startswith("The noise floor: ")]
    assert floor.startswith(("The noise floor: this machine moves the same config ", "The noise floor: undecided"))
    for title in ("Data loading", "Mixed precision", "Batch", "torch.compile", "Python overhead", "System", "Parallel"):
        assert f"### {title}: the knobs" in text
        assert any(line.startswith(title) and "folklore" in line for line in lines), title
    measured = [line for line in lines if "; measured here: " in line]
    assert len(measured) == 6  # every lesson but the one left out, each with its verdict
    verdicts = ("faster", "slower", "no measurable effect here (within ±", "undecided", "not compared")
    assert all(any(verdict in line.split("; measured here: ")[1] for verdict in verdicts) for line in measured)
    assert "Why it may differ here" in text and "Skipped here" in text
    assert "torch.compile: left out of this run" in text
    assert PLOTLY in mimes


@pytest.mark.slow
def test_whatif_notebook_sweeps_and_plots(tmp_path: Path) -> None:
    """A budget that ends each comparison after its first bursts and two of the caches: the sweeps' blocks and
    verdicts are checked in tests/search/test_sweep.py, every cache in tests/data/test_cache.py; here what the notebook
    prints and draws."""
    text, mimes = execute("whatif.ipynb", tmp_path, BATCH_SIZES=[32], WORKERS=[0, 2], STEPS=5, BUDGET=1,
                          CACHES=["none", "shards"])
    assert text.count("samples/s") >= 4 and "speedup" in text
    assert "sweep of data_cache on image-small against batch_size=32" in text  # every cache against the plain read
    assert PLOTLY in mimes
    assert "streaming, num_workers=0" in text and "streaming, num_workers=2" in text
    assert "data_cache=shards" in text


@pytest.mark.slow
def test_huggingface_notebook_trains_a_transformers_model_on_dict_batches(tmp_path: Path) -> None:
    # The comparisons end after their first bursts; the ladder's precision rung is left out too (the panel runs bf16).
    text, mimes = execute("huggingface.ipynb", tmp_path, BUDGET=1, LEAVE_OUT=("+compile", "+precision"))
    assert WIDGET_VIEW in mimes
    assert "baseline [tiny-gpt2] ok" in text and "precision=bf16 [tiny-gpt2] ok" in text
    assert "tokens/s" in text and "+loader" in text and "+rest" in text
