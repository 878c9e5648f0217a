"""The runs table: one row per run, numbers from ``reporting.comparison_rows``, a checkbox per row for the plots.

A GridBox of plain ipywidgets (a Checkbox and HTML cells), so selecting what the plots show happens in
the table itself and works in any front end that runs standard ipywidgets 8. The numbers are the
same dicts the CLI table and the HTML report format, so the three can never disagree.

The status cell also carries the correctness guard's verdict: a run that is faster only because it
trains differently (NaN losses, a drifting loss curve) must not read as a plain "ok" next to its speed-up.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipywidgets as w

from ..guard import GuardVerdict, check_training, find_baseline
from ..reporting import comparison_rows
from ..results import BurstResult
from .plots import run_colour
from .state import row_title

Row = dict[str, Any]

_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, tooltip, css width)
    ("show", "tick to show the run in the plots", "64px"),
    ("changes from baseline", "what differs from the baseline run (a ladder rung's name first)", "minmax(240px, 4fr)"),
    ("samples/s", "steady-state throughput, summed over ranks", "90px"),
    ("speed-up", "throughput over the baseline run's", "80px"),
    ("step ms", "median step time ± IQR; ~ marks a noisy measurement (IQR/median ≥ 10%)", "120px"),
    ("util %", "mean device utilisation (GPU: NVML; CPU: the workers' share of the machine)", "60px"),
    ("data wait", "share of the step spent waiting for the data loader", "80px"),
    ("peak MiB", "peak memory (GPU allocator, or the workers' RSS on CPU)", "80px"),
    ("compile s", "extra time of the first step over a steady one (compiled runs)", "80px"),
    ("TFLOP/s", "model math sustained (forward + backward), summed over ranks; MFU % of the GPUs' dense peak "
                "in brackets where the peak is known; GFLOP/s below 0.01 TFLOP/s", "115px"),
    ("status", "ok, stopped, or failed with the error's first line; 'changes training' when the losses leave the "
               "fp32 baseline's (hover for why)", "minmax(90px, 1.5fr)"),
)
LOADED_MARK = "⟲ "  # title prefix of runs loaded from the history rather than run in this panel
_CELL = "padding: 2px 6px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis;"
_STATUS_COLOURS = {"ok": "#2e7d32", "stopped": "#8a6d00"}
_CHANGES_TRAINING_COLOUR = "#c62828"


def _number(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _step(row: Row) -> str:
    if row["step_ms_median"] is None:
        return "–"
    noise = " ~" if row["noisy"] else ""
    return f"{row['step_ms_median']:.1f} ± {row['step_ms_iqr']:.1f}{noise}"


def _flops(row: Row) -> str:
    """TFLOP/s with MFU; a small model on a CPU sustains far below 0.01 TFLOP/s, so that is shown in GFLOP/s
    rather than as a meaningless 0.00."""
    tflops = row["tflops"]
    if tflops is None:
        return "–"
    if tflops < 0.01:
        return f"{tflops * 1e3:.2g} GFLOP/s"
    mfu = f" ({row['mfu_pct']:.0f}%)" if row["mfu_pct"] is not None else ""
    return f"{tflops:,.2f}{mfu}"


def _status(row: Row) -> tuple[str, str]:
    """The status text and its hover: the guard's reasons when the run changes training."""
    verdict: GuardVerdict | None = row.get("guard")
    if verdict is not None and verdict.status == "changes_training":
        faster = row["speedup"] is not None and row["speedup"] > 1.0
        text = "faster but changes training" if faster else "changes training"
        return text, "\n".join(verdict.reasons)
    status = str(row["status"]) if not row["error"] else f"{row['status']}: {row['error']}"
    return status, status


def guard_verdicts(results: Sequence[BurstResult]) -> list[GuardVerdict]:
    """Each run's training check against the best fp32 baseline among the *other* runs (a run is never its
    own reference)."""
    return [check_training(result, find_baseline(result, [*results[:index], *results[index + 1:]]))
            for index, result in enumerate(results)]


def cells(row: Row) -> list[tuple[str, str]]:
    """(text, full text for the hover) of each column after the checkbox."""
    title = row_title(row)
    loaded = row.get("loaded")
    if loaded is not None:
        title = LOADED_MARK + title
    return [
        (title, f"{title}\n{loaded}" if loaded else title),
        (_number(row["samples_per_s"], ",.1f"), ""),
        (_number(row["speedup"], ".2f", "×"), ""),
        (_step(row), "noisy: IQR/median ≥ 10% or fewer than 4 steps" if row["noisy"] else ""),
        (_number(row["util_pct"], ".0f"), ""),
        (_number(row["data_wait_pct"], ".0f", "%"), ""),
        (_number(row["peak_mem_mib"], ",.0f"), ""),
        (_number(row["compile_s"], ".1f"), ""),
        (_flops(row), ""),
        _status(row),
    ]


class RunsTable:
    """Renders the rows and reports the ticked runs through ``on_select(set_of_run_indices)``."""

    def __init__(self, on_select: Callable[[set[int]], None]) -> None:
        self._on_select = on_select
        self.rows: list[Row] = []
        self.checkboxes: list[w.Checkbox] = []
        self._header = [w.HTML(f'<div style="{_CELL} font-weight: 600;" title="{html.escape(tip)}">'
                               f"{html.escape(name)}</div>") for name, tip, _ in _COLUMNS]
        self.widget = w.GridBox(self._header, layout=w.Layout(
            grid_template_columns=" ".join(width for _, _, width in _COLUMNS), grid_gap="0px 0px",
            width="100%", overflow="hidden"))
        self.empty = w.HTML('<i style="color: #777;">No runs yet: Run burst or Run ladder.</i>')

    @property
    def selected(self) -> set[int]:
        return {run for run, box in enumerate(self.checkboxes) if box.value}

    def update(self, results: Sequence[BurstResult], loaded: Mapping[int, str] | None = None) -> None:
        """Rebuild the rows from all results (a new baseline can change earlier rows' speed-ups and verdicts).

        ``loaded`` maps the index of each run loaded from the history to its hover note (when it was recorded).
        """
        self.rows = comparison_rows(results)
        for row, verdict in zip(self.rows, guard_verdicts(results), strict=True):
            row["guard"] = verdict
            row["loaded"] = (loaded or {}).get(row["run"])
        while len(self.checkboxes) < len(self.rows):
            box = w.Checkbox(value=True, indent=False, layout=w.Layout(width="auto"),
                             description=f"#{len(self.checkboxes)}", tooltip="show this run in the plots")
            box.observe(lambda _: self._on_select(self.selected), names="value")
            self.checkboxes.append(box)
        children: list[w.Widget] = list(self._header)
        for row, box in zip(self.rows, self.checkboxes, strict=True):
            children += [self._show_cell(row["run"], box), *self._cells(row)]
        self.widget.children = children
        self.empty.layout.display = "none" if self.rows else None

    def text(self) -> list[list[str]]:
        """The table as text, row by row (tests and notebooks read what the user sees)."""
        return [[f"#{row['run']}", *(text for text, _ in cells(row))] for row in self.rows]

    @staticmethod
    def _show_cell(run: int, box: w.Checkbox) -> w.HBox:
        swatch = w.HTML(f'<span style="display: inline-block; width: 10px; height: 10px; margin-top: 9px; '
                        f'background: {run_colour(run)}; border-radius: 2px;"></span>',
                        layout=w.Layout(width="14px"))
        return w.HBox([swatch, box], layout=w.Layout(border_top="1px solid #e0e0e0"))

    @staticmethod
    def _cells(row: Row) -> list[w.HTML]:
        colour = _STATUS_COLOURS.get(str(row["status"]), "#c62828")
        out = []
        for index, (text, hover) in enumerate(cells(row)):
            align = "left" if index in (0, len(_COLUMNS) - 2) else "right"
            style = f"{_CELL} text-align: {align};"
            if index == len(_COLUMNS) - 2:
                changes = row["guard"].status == "changes_training"
                style += f" color: {_CHANGES_TRAINING_COLOUR if changes else colour};"
                style += " font-weight: 600;" if changes else ""
            title = f' title="{html.escape(hover)}"' if hover else ""
            out.append(w.HTML(f'<div style="{style}"{title}>{html.escape(text)}</div>',
                              layout=w.Layout(border_top="1px solid #e0e0e0", overflow="hidden")))
        return out
