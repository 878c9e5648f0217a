"""The runs table: the state's rows (:func:`~accel_widgets.analysis.compare.run_rows`) as widgets, with a
checkbox per row that shows or hides the run in the plots.

A GridBox of plain ipywidgets (a Checkbox and HTML cells), so selecting what the plots show happens in the
table itself and works in any front end that runs standard ipywidgets 8. The cells' text, hover, colours
and the correctness guard's verdict are the report's: this module only lays them out.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Collection, Sequence

import ipywidgets as w

from ..analysis.compare import RunRow
from ..views.style import COLOURS, run_colour
from ..views.table import COLUMNS, PANEL_COLUMNS, STATUS, TITLE, row_cells, status_colour

# A number column is as wide as its widest value or the longest word of its header, which wraps ("data" over
# "wait"): so the whole table fits the ~970 px a 1400 px JupyterLab window with its file browser leaves.
# The free width goes to the run's name and its status, cut with an ellipsis (hover shows the whole).
_WIDTHS = {key: "min-content" for key in PANEL_COLUMNS} | {"title": "minmax(140px, 4fr)",
                                                           "status": "minmax(80px, 1.5fr)"}
# (header, its hover text, column width, alignment): numbers are right-aligned under a header aligned with them.
_HEADERS = (("show", "tick to show the run in the plots", "64px", "left"), (*TITLE, _WIDTHS["title"], "left"),
            *((COLUMNS[key].header, COLUMNS[key].meaning, _WIDTHS[key], "right") for key in PANEL_COLUMNS),
            (*STATUS, _WIDTHS["status"], "left"))
_CELL = "padding: 2px 5px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis;"
_HEADER = "padding: 2px 5px; font-weight: 600; line-height: 1.25;"
_ROW_EDGE = f"1px solid {COLOURS['rule']}"


class RunsTable:
    """Renders the rows; a tick or untick calls ``on_toggle(run, shown)``.

    Each row's widgets are made once and then only given new text: a table rebuilt from new widgets on every
    run would open a widget per cell in the page each time, which is work taken from the next burst.
    """

    def __init__(self, on_toggle: Callable[[int, bool], None]) -> None:
        self._on_toggle = on_toggle
        self.checkboxes: list[w.Checkbox] = []
        self._cells_of: list[list[w.HTML]] = []  # each row's cells after its checkbox, reused across renders
        self._lines: list[w.HBox] = []  # each row's first cell: its colour and checkbox
        self.header = [w.HTML(f'<div style="{_HEADER} text-align: {align};" title="{html.escape(tip)}">'
                              f"{html.escape(name)}</div>", layout=w.Layout(align_self="flex-end"))
                       for name, tip, _, align in _HEADERS]
        self.widget = w.GridBox(self.header, layout=w.Layout(
            grid_template_columns=" ".join(width for _, _, width, _ in _HEADERS), grid_gap="0px 0px",
            width="100%", overflow="auto hidden"))  # in a narrow window the table scrolls rather than losing columns
        self.empty = w.HTML('<i style="color: #777;">No runs yet: Run burst or Run ladder.</i>')

    def render(self, rows: Sequence[RunRow], hidden: Collection[int]) -> None:
        """Show ``rows`` (a new baseline can change earlier rows' speed-ups and verdicts): new text where it
        changed, new widgets only for rows not shown before."""
        for row in rows:
            texts = self._cells_html(row)
            if row.run < len(self._cells_of):
                for cell, text in zip(self._cells_of[row.run], texts, strict=True):
                    if cell.value != text:
                        cell.value = text
            else:
                self._add_row(row.run, texts)
        self.show(hidden)
        children = [*self.header, *(widget for run in range(len(rows))
                                    for widget in (self._lines[run], *self._cells_of[run]))]
        if len(children) != len(self.widget.children):
            self.widget.children = children
        self.empty.layout.display = "none" if rows else None

    def show(self, hidden: Collection[int]) -> None:
        """Tick the runs the plots show."""
        for run, box in enumerate(self.checkboxes):
            box.value = run not in hidden

    def _add_row(self, run: int, texts: list[str]) -> None:
        box = w.Checkbox(value=True, indent=False, layout=w.Layout(width="auto"), description=f"#{run}",
                         tooltip="show this run in the plots")
        box.observe(lambda change, run=run: self._on_toggle(run, bool(change["new"])), names="value")
        self.checkboxes.append(box)
        swatch = w.HTML(f'<span style="display: inline-block; width: 10px; height: 10px; margin-top: 9px; '
                        f'background: {run_colour(run)}; border-radius: 2px;"></span>',
                        layout=w.Layout(width="14px"))
        self._lines.append(w.HBox([swatch, box], layout=w.Layout(border_top=_ROW_EDGE)))
        self._cells_of.append([w.HTML(text, layout=w.Layout(border_top=_ROW_EDGE, overflow="hidden"))
                               for text in texts])

    @staticmethod
    def _cells_html(row: RunRow) -> list[str]:
        *cells, status = row_cells(row, PANEL_COLUMNS)
        styled = [(text, hover, f"text-align: {'left' if index == 0 else 'right'};")
                  for index, (text, hover) in enumerate(cells)]
        weight = " font-weight: 600;" if row.changes_training else ""
        styled.append((*status, f"text-align: left; color: {status_colour(row)};{weight}"))
        out = []
        for text, hover, style in styled:
            title = f' title="{html.escape(hover)}"' if hover else ""
            out.append(f'<div style="{_CELL} {style}"{title}>{html.escape(text)}</div>')
        return out
