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

HEIGHT = 380
WIDTH = 1180  # fixed: the widget renders before it is attached, so autosize would fall back to 700 px
_DASHES = ("solid", "dot", "dash", "dashdot", "longdash", "longdashdot")
_UTIL_TITLES = {"nvml": "GPU utilisation % (NVML)", "psutil": "workers' CPU % of machine (psutil)"}
MAX_TRACE_POINTS = 1500
_LOG_TICKS = [m * 10.0**e for e in range(-2, 7) for m in (1, 2, 5)]
Key = tuple[int, str, Any]


def _bounded(values: tuple[float, ...]) -> tuple[float, ...]:
    """Thin a trace by a whole stride once it passes MAX_TRACE_POINTS.

    Every flush resends a changed trace whole (FigureWidget has no extendTraces), so a 1 ms step over a
    minute-long burst would otherwise push 60k points four times a second. x, y and customdata of a
    trace always have the same length, so the same stride keeps them aligned.
    """
    stride = -(-len(values) // MAX_TRACE_POINTS)  # ceiling division
    return values[::stride] if stride > 1 else values


def run_colour(run: int) -> str:
    palette = qualitative.Plotly
    return palette[run % len(palette)]


class LivePlots:
    """Owns the FigureWidget and the map from (run, kind, rank or device) to its trace."""

    def __init__(self, device: DeviceInfo) -> None:
        figure = make_subplots(
            rows=1, cols=2, horizontal_spacing=0.08,
            subplot_titles=("Device utilisation (hover: memory)", "Step time (hollow: warm-up / compile)"),
        )
        figure.update_layout(
            height=HEIGHT, width=WIDTH, template="plotly_white", margin={"l": 60, "r": 10, "t": 40, "b": 45},
            legend={"title": {"text": "runs"}, "x": 1.02, "y": 1}, hovermode="closest",
            uirevision="keep",  # keep the user's zoom while data streams in
        )
        figure.update_xaxes(title_text="time since launch (s)", row=1, col=1)
        figure.update_yaxes(title_text=_UTIL_TITLES["nvml" if device.has_cuda else "psutil"], range=[0, 105],
                            row=1, col=1)
        figure.update_xaxes(title_text="step", row=1, col=2)
        # Log scale: a compile step can be 1000x a steady one. Plain 1-2-5 labels, not plotly's digit-only ones.
        figure.update_yaxes(title_text="step time (ms, log)", type="log", tickvals=_LOG_TICKS,
                            ticktext=[f"{v:g}" for v in _LOG_TICKS], row=1, col=2)
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
        memory: dict[Key, list[float]] = {}
        for sample in batch.samples:
            key = (run, "util", sample.device)
            xs, ys = points.setdefault(key, ([], []))
            xs.append(sample.t)
            ys.append(sample.util_pct)
            memory.setdefault(key, []).append(sample.mem_used_bytes / 2**20)
        added = [key for key in points if key not in self._traces]
        for key in added:
            self._add_trace(key)
        if added:
            self.sync_state()  # a view created from here on (a page reload) must already hold the new traces
        with self.figure.batch_update():
            for key, (xs, ys) in points.items():
                trace = self._traces[key]
                trace.x = _bounded((*(trace.x or ()), *xs))
                trace.y = _bounded((*(trace.y or ()), *ys))
                if key in memory:  # memory rides along as hover data: a third axis made the plot unreadable
                    trace.customdata = _bounded((*(trace.customdata or ()), *memory[key]))
        self._retitle(batch)

    def sync_state(self) -> None:
        """Copy the figure into its widget state, so a view created later (a page reload) is current.

        plotly only copies the figure into the widget's synced state when the figure itself is
        displayed; inside a VBox it never is, and later views would start from the empty figure. Called
        when traces are added and after each run, not per flush: streamed points reach live views as
        restyles, and a full copy at 4 Hz would resend every run's points each time.
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
        """The run's traces of one kind ("legend", "util", "step", "warmup"), for tests and notebooks."""
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
        devices = len(self.traces(run, "util"))  # one line per GPU of a multi-GPU run, told apart by dash
        trace = go.Scatter(mode="lines", line={"color": colour, "width": 2, "dash": _DASHES[devices % len(_DASHES)]},
                           customdata=[],
                           hovertemplate=f"{name} {sub}: %{{y:.0f}}% busy, %{{customdata:,.0f}} MiB at %{{x:.1f}} s"
                           "<extra></extra>", **common)
        self.figure.add_trace(trace, row=1, col=1)
        self._traces[key] = self.figure.data[-1]

    def _retitle(self, batch: Batch) -> None:
        """Name what the utilisation axis measures from the samples themselves (NVML may be unavailable)."""
        sources = {s.source for s in batch.samples}
        if len(sources) == 1 and self._util_source not in sources:
            (source,) = sources
            self._util_source = source
            self.figure.layout.yaxis.title.text = _UTIL_TITLES[source]
