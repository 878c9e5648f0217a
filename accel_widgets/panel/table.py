"""The panel's runs table: one row per run with its colour, its show tick and the cells every face shows.

The cells (their text, hover and colour) come from :mod:`accel_widgets.views.table`; the page lays them out
(``runs_table.js``): it fits the table to the width it is given by folding the least important columns into each
row's details, so the run's name, its speed-up and its status are never the ones cut, and it keeps the newest row in
view. One widget for the whole table: a table made of a widget per cell opens a view per cell in the page on every
run, which is work taken from the next burst.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from ..analysis.compare import RunRow
from ..views.style import COMPARING_MARK, run_colour, themed
from ..views.table import (
    COLUMNS,
    PANEL_COLUMNS,
    STATUS,
    TITLE,
    compact_title_cell,
    speedup_reading,
    status_cell,
    status_tone,
)

#: The order in which columns fold when the table does not fit (the first named folds first); the run's name, its
#: speed-up and its status never fold.
FOLD_ORDER = ("energy", "flops", "compile", "peak", "data_wait", "util", "step", "samples")
NEVER_FOLDED = ("title", "speedup", "status")
MAX_ROWS = 8  # past this many runs the table scrolls inside its box, the newest row in view
EMPTY = "No runs yet: Run burst or Run ladder."


def table_columns() -> list[dict[str, Any]]:
    """The table's columns as the page reads them: the run's changes, the numbers, the status."""
    fold = {key: len(FOLD_ORDER) - i for i, key in enumerate(FOLD_ORDER)} | dict.fromkeys(NEVER_FOLDED, 0)
    numbers = [{"key": key, "header": COLUMNS[key].header, "meaning": COLUMNS[key].meaning, "align": "right",
                "fold": fold[key]} for key in PANEL_COLUMNS]
    return [{"key": "title", "header": TITLE[0], "meaning": TITLE[1], "align": "left", "fold": 0}, *numbers,
            {"key": "status", "header": STATUS[0], "meaning": STATUS[1], "align": "left", "fold": 0}]


class RunsTableView(anywidget.AnyWidget):
    """The table as the page draws it (``runs_table.js`` says what it is sent); ``hidden`` is changed by the page
    when a tick is clicked."""

    _esm = Path(__file__).with_name("runs_table.js")
    _css = Path(__file__).with_name("runs_table.css")
    columns = traitlets.List(traitlets.Dict()).tag(sync=True)
    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    hidden = traitlets.List(traitlets.Int()).tag(sync=True)
    max_rows = traitlets.Int(MAX_ROWS).tag(sync=True)
    empty = traitlets.Unicode(EMPTY).tag(sync=True)


def _cell(text: str, hover: str, style: str = "") -> dict[str, str]:
    styled = f' style="{style}"' if style else ""
    return {"html": f"<span{styled}>{html.escape(text)}</span>", "title": hover if hover != text else ""}


def speedup_html(row: RunRow) -> dict[str, str]:
    """The speed-up cell: the value, the verdict's mark in its colour, the quiet "1 burst" hint and the live mark
    while the comparison takes repeats; the whole sentence on hover."""
    reading = speedup_reading(row.values)
    tone = f' style="color: {themed(reading.tone)};"' if reading.tone else ""
    value = f"<span{tone if not reading.mark else ''}>{html.escape(reading.value)}</span>"
    parts = [value]
    if reading.mark:
        parts.append(f"<b{tone}>{html.escape(reading.mark)}</b>")
    if reading.comparing:
        parts.append(f'<span class="aw-hint" title="still comparing">{COMPARING_MARK}</span>')
    if reading.flags:
        parts.append(html.escape(reading.flags))
    if reading.hint:
        parts.append(f'<span class="aw-hint">{html.escape(reading.hint)}</span>')
    return {"html": " ".join(parts), "title": reading.hover}


def row_data(row: RunRow) -> dict[str, Any]:
    """One run as the page reads it: its number, colour and every cell's HTML and hover text, in column order."""
    title = _cell(*compact_title_cell(row))
    numbers = [speedup_html(row) if key == "speedup" else _cell(*COLUMNS[key].cell(row.values))
               for key in PANEL_COLUMNS]
    weight = " font-weight: 600;" if row.changes_training else ""
    status = _cell(*status_cell(row), f"color: {themed(status_tone(row))};{weight}")
    return {"run": row.run, "label": f"#{row.run}", "colour": run_colour(row.run), "cells": [title, *numbers, status]}


class RunsTable:
    """Renders the rows; a tick or untick in the page calls ``on_toggle(run, shown)``."""

    def __init__(self, on_toggle: Callable[[int, bool], None]) -> None:
        self._on_toggle = on_toggle
        self.widget = RunsTableView(columns=table_columns())
        self.widget.observe(self._ticked, names="hidden")

    def render(self, rows: Sequence[RunRow], hidden: Collection[int]) -> None:
        """Show ``rows`` (a new baseline can change earlier rows' speed-ups and verdicts); the page gets them only
        when something in them changed."""
        data = [row_data(row) for row in rows]
        if data != self.widget.rows:
            self.widget.rows = data
        self.show(hidden)

    def show(self, hidden: Collection[int]) -> None:
        """Tick the runs the chart shows."""
        shown = sorted(hidden)
        if shown != self.widget.hidden:
            self.widget.hidden = shown

    def _ticked(self, change: dict[str, Any]) -> None:
        before, now = set(change["old"]), set(change["new"])
        for run in sorted(before ^ now):
            self._on_toggle(run, run not in now)
