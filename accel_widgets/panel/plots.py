"""The live figure: the report's timeline (:func:`~accel_widgets.presentation.timeline_figure`) as a plotly
``FigureWidget`` that grows while a burst runs, as wide as the panel is drawn.

Built complete (both subplots, axes, titles) before anything displays it, then only extended: a run gets its
legend entry when it starts, a trace when its first rank or device reports (built by the same functions
as the report's), and its points in batches inside ``batch_update`` (one comm message per flush, not per
event), the step axis refitted to the measured steps in the same update. Every trace carries
``meta={"run", "kind", ...}`` so the browser and tests find a run's traces without relying on names or order.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import anywidget
import ipywidgets as w
import plotly.graph_objects as go
import traitlets

from ..device import DeviceInfo
from ..presentation import (
    add_run_legend,
    add_step_trace,
    add_utilisation_trace,
    device_groups,
    fit_step_axis,
    step_groups,
    step_points,
    timeline_figure,
    utilisation_points,
    utilisation_title,
)
from .state import Run

WIDTH = 1180  # until the browser says how wide the panel is (see WidthProbe)
MIN_WIDTH = 460  # two readable subplots; narrower, the panel scrolls
#: Narrower than this, the legend goes under the plots and the subplot titles shorten, so two subplots
#: keep their room (the panel is ~570 px in a 1000 px JupyterLab with the file browser open).
NARROW_PX = 820
SHORT_TITLES = ("Utilisation", "Step time (log)")
LEGEND_BESIDE = {"orientation": "v", "x": 1.02, "y": 1, "xanchor": "left", "yanchor": "top", "yref": "paper"}
LEGEND_BELOW = {"orientation": "h", "x": 0, "y": 0, "xanchor": "left", "yanchor": "bottom", "yref": "container"}
BELOW_EXTRA_PX = 70  # the legend's room under the plots
MAX_TRACE_POINTS = 1500
Key = tuple[int, str, Any]  # (run, "steps" or "util", (rank, warm-up) or device)


def _bounded(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Thin a trace by a whole stride once it passes MAX_TRACE_POINTS.

    Every flush resends a changed trace whole (FigureWidget has no extendTraces), so a 1 ms step over a
    minute-long burst would otherwise push 60k points four times a second. x, y and customdata of a
    trace always have the same length, so the same stride keeps them aligned.
    """
    stride = -(-len(values) // MAX_TRACE_POINTS)  # ceiling division
    return values[::stride] if stride > 1 else values


class WidthProbe(anywidget.AnyWidget):
    """An empty full-width strip that tells the kernel how wide the panel is drawn, in pixels.

    The FigureWidget cannot size itself: its view is drawn before it is attached to the page, so plotly's
    autosize finds no room and falls back to 700 px, and nothing resizes it later. The browser knows the
    room: a ResizeObserver (so a resized window or side bar counts too) reports it here, and the figure is
    given that width. A few lines of front-end code with no build step is what anywidget is for.
    """

    _esm = """
    export default {
      render({ model, el }) {
        let timer = null;
        const observer = new ResizeObserver(([entry]) => {
          clearTimeout(timer);
          timer = setTimeout(() => {
            const width = Math.round(entry.contentRect.width);
            if (width > 0 && width !== model.get("width")) {
              model.set("width", width);
              model.save_changes();
            }
          }, 150);
        });
        observer.observe(el);
        return () => { clearTimeout(timer); observer.disconnect(); };
      },
    };
    """
    width = traitlets.Int(0).tag(sync=True)


class LivePlots:
    """Owns the FigureWidget and draws the state's runs into it: whatever is new since the last draw.

    ``probe`` goes right above the figure in the panel; :meth:`fit` gives the figure the width it reports.
    """

    def __init__(self, device: DeviceInfo) -> None:
        figure = timeline_figure(utilisation_title({"nvml" if device.has_cuda else "psutil"}))
        figure.update_layout(width=WIDTH, legend=LEGEND_BESIDE)
        self._titles = tuple(annotation.text for annotation in figure.layout.annotations)
        self._height, self._bottom = figure.layout.height, figure.layout.margin.b
        self.figure = go.FigureWidget(figure)
        self.probe = WidthProbe(layout=w.Layout(width="100%", height="0px"))
        self._traces: dict[Key, Any] = {}
        self._drawn: dict[int, tuple[int, int]] = {}  # run -> (steps, samples) already in the figure
        self._source: str | None = None

    def draw(self, runs: Sequence[Run], hidden: Collection[int]) -> None:
        """Add the runs not drawn yet and the events they received since the last draw.

        A rank or device seen for the first time gets a trace built with its points (by the report's
        functions); the points of traces that exist are appended in one batched update.
        """
        added = False
        extend: list[tuple[Any, list[Any], list[float], list[float] | None]] = []
        sources: set[str] = set()
        for run in runs:
            visible = run.index not in hidden
            if run.index not in self._drawn:
                add_run_legend(self.figure, run.index, run.name, visible=visible)
                self._drawn[run.index] = (0, 0)
                added = True
            steps_done, samples_done = self._drawn[run.index]
            steps, samples = run.steps[steps_done:], run.samples[samples_done:]
            self._drawn[run.index] = (len(run.steps), len(run.samples))
            sources.update(s.source for s in samples)
            for (rank, warmup), group in step_groups(steps).items():
                key = (run.index, "steps", (rank, warmup))
                if key in self._traces:
                    extend.append((self._traces[key], *step_points(group), None))
                else:
                    self._traces[key] = add_step_trace(self.figure, run.index, run.name, rank=rank, ranks=run.ranks,
                                                       warmup=warmup, steps=_bounded(tuple(group)),
                                                       visible=visible)
                    added = True
            for device, group in device_groups(samples).items():
                key = (run.index, "util", device)
                if key in self._traces:
                    extend.append((self._traces[key], *utilisation_points(group)))
                else:
                    devices = sum(1 for r, kind, _ in self._traces if r == run.index and kind == "util")
                    self._traces[key] = add_utilisation_trace(self.figure, run.index, run.name, device=device,
                                                              index=devices, samples=_bounded(tuple(group)),
                                                              visible=visible)
                    added = True
        if added:
            self.sync_state()  # a view created from here on (a page reload) must already hold the new traces
        with self.figure.batch_update():
            for trace, x, y, memory in extend:
                trace.x, trace.y = _bounded((*trace.x, *x)), _bounded((*trace.y, *y))
                if memory is not None:
                    trace.customdata = _bounded((*trace.customdata, *memory))
            fit_step_axis(self.figure)
        self._retitle(sources)

    def forget(self, run: int) -> None:
        """Take ``run``'s traces out of the figure: a live run replaced by the next one; its slot is drawn
        again from the new run's events."""
        self.figure.data = tuple(trace for trace in self.figure.data if trace.meta["run"] != run)
        self._traces = {key: trace for key, trace in self._traces.items() if key[0] != run}
        self._drawn.pop(run, None)
        self.sync_state()

    def show(self, hidden: Collection[int]) -> None:
        """Show only the runs that are not hidden (the runs table's ticks); the step axis fits the shown ones."""
        with self.figure.batch_update():
            for trace in self.figure.data:
                trace.visible = trace.meta["run"] not in hidden
            fit_step_axis(self.figure)

    def fit(self, width: int) -> None:
        """Draw the figure ``width`` pixels wide (what the probe measured), never narrower than MIN_WIDTH;
        narrower than NARROW_PX with the legend under the plots and short subplot titles."""
        width = max(MIN_WIDTH, width)
        narrow = width < NARROW_PX
        with self.figure.batch_update():
            self.figure.layout.width = width
            self.figure.layout.legend.update(LEGEND_BELOW if narrow else LEGEND_BESIDE)
            self.figure.layout.height = self._height + (BELOW_EXTRA_PX if narrow else 0)
            self.figure.layout.margin.b = self._bottom + (BELOW_EXTRA_PX if narrow else 0)
            for annotation, title, short in zip(self.figure.layout.annotations, self._titles, SHORT_TITLES,
                                                strict=False):
                annotation.text = short if narrow else title
        self.sync_state()  # a page reload's view starts from the widget state: it must have the width too

    def sync_state(self) -> None:
        """Copy the figure into its widget state, so a view created later (a page reload) is current.

        plotly only copies the figure into the widget's synced state when the figure itself is
        displayed; inside a VBox it never is, and later views would start from the empty figure. Called
        when traces are added and after each run, not per flush: streamed points reach live views as
        restyles, and a full copy at 4 Hz would resend every run's points each time.
        """
        self.figure._repr_mimebundle_()

    def _retitle(self, sources: set[str]) -> None:
        """Name what the utilisation axis measures from the samples themselves (NVML may be unavailable)."""
        if len(sources) == 1 and self._source not in sources:
            (self._source,) = sources
            self.figure.layout.yaxis.title.text = utilisation_title(sources)
