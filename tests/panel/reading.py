"""Read what a panel shows from its widgets, the way a user sees it: the runs table's text, a run's traces."""

from __future__ import annotations

import html
import re
import time
from typing import Any

from accel_widgets.panel.table import RunsTable

_TAG = re.compile(r"<[^>]+>")


def html_text(markup: str) -> str:
    """The visible text of an HTML fragment."""
    return html.unescape(_TAG.sub("", markup))


def header_text(table: RunsTable) -> list[str]:
    """The headers as the page shows them: "run" (the tick and number), then one per column."""
    return ["run", *(column["header"] for column in table.widget.columns)]


def table_text(table: RunsTable) -> list[list[str]]:
    """The table's rows as text, as the page draws them: "#run", then every cell after it."""
    return [[row["label"], *(html_text(cell["html"]) for cell in row["cells"])] for row in table.widget.rows]


def cell(table: RunsTable, run: int, key: str) -> dict[str, str]:
    """One cell of a run's row as the page gets it: its ``html`` and its hover ``title``."""
    index = [column["key"] for column in table.widget.columns].index(key)
    (row,) = [row for row in table.widget.rows if row["run"] == run]
    return row["cells"][index]


def traces(figure: Any, run: int, kind: str) -> list[Any]:
    """The run's traces of one kind ("legend", "util", "step", "warmup"), found by their meta."""
    return [t for t in figure.data if t.meta["run"] == run and t.meta["kind"] == kind]


def chart_rows(chart: Any, run: int, kind: str) -> list[list[Any]]:
    """A finished run's points in the timeline chart's state: "step" and "warmup" rows ``[rank, warm-up, step,
    ms]``, "util" rows ``[device, t, %, MiB]``."""
    (held,) = [r for r in chart.runs if r["run"] == run]
    if kind == "util":
        return held["util"]
    return [row for row in held["steps"] if bool(row[1]) == (kind == "warmup")]


class ChartPage:
    """What the timeline chart's page holds, kept as ``timeline_chart.js`` keeps it: the finished runs from the
    chart's synced state, a running run's points from the messages the kernel sends (points, forget), and whether
    it is on screen. The page's side of :class:`~accel_widgets.panel.plots.TimelineChart` without a browser;
    ``messages`` counts what was sent, for the tests of the send budget."""

    def __init__(self, chart: Any, *, visible: bool = True) -> None:
        self.chart = chart
        self.streamed: dict[int, dict[str, Any]] = {}
        self.messages: list[tuple[float, dict[str, Any]]] = []
        chart.send = self.receive
        chart.visible = visible

    def receive(self, message: dict[str, Any], buffers: Any = None) -> None:
        self.messages.append((time.monotonic(), message))
        if message["kind"] == "points":
            held = self.streamed.setdefault(message["run"], {"steps": [], "util": []})
            held["steps"] += message["steps"]
            held["util"] += message["util"]
        elif message["kind"] == "forget":
            self.streamed.pop(message["run"], None)

    def runs(self) -> dict[int, dict[str, Any]]:
        """Every run the page draws: the synced state's, and the streamed ones not in it yet."""
        finished = {r["run"]: {"steps": r["steps"], "util": r["util"]} for r in self.chart.runs}
        return {**{run: held for run, held in self.streamed.items() if run not in finished}, **finished}

    def steps(self, run: int, *, warmup: bool = False) -> list[list[Any]]:
        return [row for row in self.runs().get(run, {}).get("steps", []) if bool(row[1]) == warmup]
