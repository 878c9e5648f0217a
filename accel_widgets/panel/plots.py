"""The live figure: device utilisation over time (left) and step time per step (right), one colour per run.

One plotly ``FigureWidget`` built complete (both subplots, axes, titles) before anything displays it,
then only extended: traces are added when a run's first rank or device reports and grown in batches
inside ``batch_update`` (one comm message per flush, not per event). Every trace carries
``meta={"run", "kind", ...}`` so tests, the browser and the runs table find a run's traces without
relying on names or order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ..device import DeviceInfo
from .state import Batch

HEIGHT = 400
_DASHES = ("solid", "dot", "dash", "dashdot", "longdash", "longdashdot")
_UTIL_TITLES = {"nvml": "GPU utilisation % (NVML)", "psutil": "workers' CPU % of machine (psutil)"}
Key = tuple[int, str, Any]


def run_colour(run: int) -> str:
    palette = qualitative.Plotly
    return palette[run % len(palette)]


class LivePlots:
    """Owns the FigureWidget and the map from (run, kind, rank or device) to its trace."""

    def __init__(self, device: DeviceInfo) -> None:
        figure = make_subplots(
            rows=1, cols=2, specs=[[{"secondary_y": True}, {}]], horizontal_spacing=0.11,
            subplot_titles=("Device utilisation (dotted: memory)", "Step time (hollow: warm-up / compile)"),
        )
        figure.update_layout(
            height=HEIGHT, template="plotly_white", margin={"l": 60, "r": 20, "t": 40, "b": 40},
            legend={"orientation": "v", "x": 1.01, "y": 1, "title": {"text": "runs"}}, hovermode="closest",
            uirevision="keep",  # keep the user's zoom while data streams in
        )
        figure.update_xaxes(title_text="time since launch (s)", row=1, col=1)
        figure.update_yaxes(title_text=_UTIL_TITLES["nvml" if device.has_cuda else "psutil"], range=[0, 105],
                            row=1, col=1, secondary_y=False)
        figure.update_yaxes(title_text="memory (MiB)", row=1, col=1, secondary_y=True, showgrid=False,
                            rangemode="tozero")
        figure.update_xaxes(title_text="step", row=1, col=2)
        figure.update_yaxes(title_text="step time (ms, log)", type="log", row=1, col=2)
        self.figure = go.FigureWidget(figure)
        self._traces: dict[Key, Any] = {}
        self._names: dict[int, str] = {}
        self._ranks: dict[int, int] = {}
        self._hidden: set[int] = set()
        self._util_source: str | None = None

    # -- streaming --------------------------------------------------------------------------------
    def start_run(self, run: int, name: str, ranks: int = 1) -> None:
        """Register a run before its first events: one legend entry that toggles all its traces.

        The entry is a data-less trace of its own, so the legend reads the same whichever of the run's
        traces (telemetry or steps) happens to arrive first.
        """
        self._names[run] = name
        self._ranks[run] = ranks
        self.figure.add_trace(go.Scatter(
            x=[None], y=[None], mode="lines+markers", name=name, legendgroup=f"run{run}",
            line={"color": run_colour(run)}, marker={"size": 4, "color": run_colour(run)},
            meta={"run": run, "kind": "legend", "sub": None}, visible=run not in self._hidden,
        ), row=1, col=2)
        self._traces[(run, "legend", None)] = self.figure.data[-1]

    def extend(self, run: int, batch: Batch) -> None:
        """Append a flush worth of events to the run's traces: new traces first, then one batched update."""
        points: dict[Key, tuple[list[float], list[float]]] = {}
        for step in batch.steps:
            key = (run, "warmup" if step.warmup else "step", step.rank)
            xs, ys = points.setdefault(key, ([], []))
            xs.append(step.step)
            ys.append(step.total_s * 1e3)
        for sample in batch.samples:
            for kind, value in (("util", sample.util_pct), ("mem", sample.mem_used_bytes / 2**20)):
                xs, ys = points.setdefault((run, kind, sample.device), ([], []))
                xs.append(sample.t)
                ys.append(value)
        for key in points:
            if key not in self._traces:
                self._add_trace(key)
        self._retitle(batch)
        with self.figure.batch_update():
            for key, (xs, ys) in points.items():
                trace = self._traces[key]
                trace.x = (*(trace.x or ()), *xs)
                trace.y = (*(trace.y or ()), *ys)

    def sync_state(self) -> None:
        """Copy the figure into its widget state, so a view created later (a page reload) is current.

        plotly only copies the figure into the widget's synced state when the figure itself is
        displayed; inside a VBox it never is, and later views would start from the empty figure.
        """
        self.figure._repr_mimebundle_()

    # -- selection --------------------------------------------------------------------------------
    def show_runs(self, runs: Iterable[int]) -> None:
        """Show only these runs' traces (the runs table's selection)."""
        shown = set(runs)
        self._hidden = set(self._names) - shown
        with self.figure.batch_update():
            for (run, _, _), trace in self._traces.items():
                trace.visible = run not in self._hidden

    def traces(self, run: int, kind: str) -> list[Any]:
        """The run's traces of one kind ("util", "mem", "step", "warmup"), for tests and notebooks."""
        return [t for (r, k, _), t in self._traces.items() if r == run and k == kind]

    # -- construction -----------------------------------------------------------------------------
    def _add_trace(self, key: Key) -> None:
        run, kind, sub = key
        name = self._names.get(run, f"#{run}")
        colour = run_colour(run)
        common: dict[str, Any] = {
            "x": [], "y": [], "legendgroup": f"run{run}", "meta": {"run": run, "kind": kind, "sub": sub},
            "visible": run not in self._hidden, "showlegend": False, "name": name,
        }
        if kind in ("step", "warmup"):
            rank_name = f"{name} rank {sub}" if self._ranks.get(run, 1) > 1 else name
            if kind == "warmup":
                trace = go.Scatter(mode="markers", opacity=0.7, marker={"symbol": "circle-open", "size": 9,
                                                                         "color": colour, "line": {"width": 2}},
                                   hovertemplate=f"{rank_name} warm-up step %{{x}}: %{{y:.1f}} ms<extra></extra>",
                                   **common)
            else:
                trace = go.Scatter(mode="lines+markers", line={"color": colour, "dash": _DASHES[sub % len(_DASHES)]},
                                   marker={"size": 4, "color": colour},
                                   hovertemplate=f"{rank_name} step %{{x}}: %{{y:.1f}} ms<extra></extra>", **common)
            self.figure.add_trace(trace, row=1, col=2)
            self._traces[key] = self.figure.data[-1]
            return
        if kind == "util":
            trace = go.Scatter(mode="lines", line={"color": colour, "width": 2},
                               hovertemplate=f"{name} {sub}: %{{y:.0f}}% at %{{x:.1f}} s<extra></extra>", **common)
        else:
            trace = go.Scatter(mode="lines", line={"color": colour, "width": 1, "dash": "dot"}, opacity=0.6,
                               hovertemplate=f"{name} {sub} memory: %{{y:,.0f}} MiB at %{{x:.1f}} s<extra></extra>",
                               **common)
        self.figure.add_trace(trace, row=1, col=1, secondary_y=kind == "mem")
        self._traces[key] = self.figure.data[-1]

    def _retitle(self, batch: Batch) -> None:
        """Name what the utilisation axis measures from the samples themselves (NVML may be unavailable)."""
        sources = {s.source for s in batch.samples}
        if len(sources) == 1 and self._util_source not in sources:
            (source,) = sources
            self._util_source = source
            self.figure.layout.yaxis.title.text = _UTIL_TITLES[source]
