"""Read what a panel shows from its widgets, the way a user sees it: the runs table's text, a run's traces."""

from __future__ import annotations

import html
import re
from typing import Any

from accel_widgets.panel.table import RunsTable

_TAG = re.compile(r"<[^>]+>")


def cell_text(cell: Any) -> str:
    """The visible text of one HTML cell."""
    return html.unescape(_TAG.sub("", cell.value))


def header_text(table: RunsTable) -> list[str]:
    return [cell_text(cell) for cell in table.header]


def table_text(table: RunsTable) -> list[list[str]]:
    """The table's rows as text: "#run" (the checkbox's label), then every cell after the checkbox."""
    columns = len(table.header)
    body = table.widget.children[columns:]
    rows = [body[start:start + columns] for start in range(0, len(body), columns)]
    return [[row[0].children[1].description, *(cell_text(cell) for cell in row[1:])] for row in rows]


def traces(figure: Any, run: int, kind: str) -> list[Any]:
    """The run's traces of one kind ("legend", "util", "step", "warmup"), found by their meta."""
    return [t for t in figure.data if t.meta["run"] == run and t.meta["kind"] == kind]
