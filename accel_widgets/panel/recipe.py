""""Use in my code": the best run's settings as code in the user's own style, under the runs table.

Built when clicked (a style picked), never on a tick: the view only says which run is best as runs finish. The code
is shown in a text area to copy from, with a "Copy as code" button that puts it on the clipboard in the browser.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import anywidget
import ipywidgets as w
import traitlets

from ..analysis.compare import RunRow, best_run
from ..inputs.workload import Workload
from ..job.recipe import recipe
from ..knobs.base import STYLES, Style
from ..views.comparison import no_best_run_text

#: What each style's button says.
STYLE_LABELS: dict[Style, str] = {"pytorch": "plain PyTorch", "hf": "Hugging Face", "lightning": "Lightning",
                                  "accelerate": "Accelerate"}


class CopyButton(anywidget.AnyWidget):
    """A button that copies ``text`` to the clipboard in the browser (the kernel has no clipboard to reach)."""

    _esm = """
    export default {
      render({ model, el }) {
        const button = document.createElement("button");
        button.className = "jupyter-button widget-button";
        button.textContent = "Copy as code";
        button.title = "copy the code above to the clipboard";
        button.onclick = async () => {
          await navigator.clipboard.writeText(model.get("text"));
          button.textContent = "Copied";
          setTimeout(() => { button.textContent = "Copy as code"; }, 1500);
        };
        el.appendChild(button);
      },
    };
    """
    text = traitlets.Unicode("").tag(sync=True)


class RecipeView:
    """The "Use in my code" button (naming the best run) and, once clicked, the code of the style picked."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.best: RunRow | None = None
        self.shown_run: int | None = None  # the run whose code is shown
        self.button = w.Button(description="Use in my code", icon="code", disabled=True, layout=w.Layout(width="auto"),
                               tooltip=f"no run to take yet: {no_best_run_text([])}")
        self.styles = w.ToggleButtons(options=[(STYLE_LABELS[style], style) for style in STYLES], value="pytorch",
                                      tooltips=["a plain PyTorch loop (no accel_widgets import)",
                                                "transformers.TrainingArguments(...)", "lightning.Trainer(...)",
                                                "accelerate.Accelerator(...)"])
        self.code = w.Textarea(layout=w.Layout(width="100%", height="320px"))
        self.copy = CopyButton()
        self.note = w.HTML()
        self.box = w.VBox([self.styles, self.note, self.code, self.copy], layout=w.Layout(display="none"))
        self.widget = w.VBox([self.button, self.box], layout=w.Layout(margin="6px 0 0 0"))
        self.button.on_click(lambda _: self.open())
        self.styles.observe(lambda _: self._write(), names="value")

    def render(self, rows: Sequence[RunRow]) -> None:
        """Name the best run of ``rows`` on the button, or say on it why there is none yet (nothing is built here)."""
        best = self.best = best_run(rows)
        self.button.disabled = best is None
        self.button.description = (f"Use #{best.run} in my code" if best is not None else "Use in my code")
        self.button.tooltip = (f"#{best.run} {best.values['label']}: its settings in your own training code"
                               if best is not None else f"no run to take yet: {no_best_run_text(rows)}")

    def open(self) -> None:
        """Show the best run's code in the style picked (what the button does)."""
        if self.best is None:
            return
        self.shown_run = self.best.run
        self.box.layout.display = None
        self._write()

    def _write(self) -> None:
        if self.shown_run is None or self.best is None:
            return
        made = recipe(self.best.result.config, self.workload, self.styles.value)
        self.code.value = self.copy.text = made.code
        missing = "".join(f"<li><code>{html.escape(knob)}</code>: {html.escape(instead)}</li>"
                          for knob, instead in made.missing.items())
        self.note.value = (f"<small>#{self.best.run} {html.escape(str(self.best.values['label']))}"
                           + (f"; no equivalent here for:<ul>{missing}</ul>" if missing else "") + "</small>")
