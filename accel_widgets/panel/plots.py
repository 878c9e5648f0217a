"""The panel's timeline: device utilisation against time and step time against step, drawn on a canvas.

The panel must not move the numbers it shows. A plotly ``FigureWidget`` has no extendTraces: every update
resends each changed trace whole and the page lays the whole SVG figure out again. Measured in JupyterLab in
Chromium on a 2-core machine, a live plotly timeline took 70-85% of a core while the burst measured, and a burst
started from the panel reached 0.14-0.33 of the same burst headless (benchmarks/panel_observer.py). So the
timeline is a small canvas of its own (:class:`TimelineChart`, ``timeline_chart.js``):

- finished runs are its synced state, thinned to ``MAX_TRACE_POINTS`` per series (a reloaded page draws them);
- a running burst's points go as messages holding only what is new, as often as the controller flushes events
  (once a second) and only while the page says the chart is on screen (what it missed follows when it is back);
- the page draws at most once a second, the lowest and highest point of each pixel column of a long series,
  and nothing while the panel is scrolled away or its tab hidden; hovering names the nearest point;
- a burst that keeps every core busy is drawn live until its measured window starts, and that window once it
  has ended (:func:`~accel_widgets.panel.controller.holds_still`).

The report's plotly timeline (hover, zoom) is a Compare tab of the panel, drawn when looked at.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as w
import traitlets

from ..inputs.device import DeviceInfo
from ..results.burst import StepRecord, TelemetrySample
from ..views.style import run_colour
from ..views.timeline import (
    TIMELINE_HEIGHT,
    TIMELINE_MARGIN_B,
    TIMELINE_TITLES,
    device_groups,
    step_groups,
    utilisation_title,
)
from .state import Run, Ticker

WIDTH = 1180  # until the browser says how wide the panel is (see WidthProbe)
MIN_WIDTH = 460  # two readable subplots; narrower, the panel scrolls
#: Narrower than this, the timeline figure's legend goes under the plots and its subplot titles shorten, so two
#: subplots keep their room (the panel is ~570 px in a 1000 px JupyterLab with the file browser open).
NARROW_PX = 820
SHORT_TITLES = ("Utilisation", "Step time (log)")
LEGEND_BESIDE = {"orientation": "v", "x": 1.02, "y": 1, "xanchor": "left", "yanchor": "top", "yref": "paper"}
LEGEND_BELOW = {"orientation": "h", "x": 0, "y": 0, "xanchor": "left", "yanchor": "bottom", "yref": "container"}
BELOW_EXTRA_PX = 70  # the legend's room under the plots
MAX_TRACE_POINTS = 1500


def _bounded(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Thin a trace by a whole stride once it passes MAX_TRACE_POINTS.

    A 1 ms step over a minute-long burst is 60k points: more than a figure with hover can draw, and each of them
    is synced as widget state for a page reload. x, y and customdata of a trace always have the same length, so
    the same stride keeps them aligned.
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


class TimelineChart(anywidget.AnyWidget):
    """The timeline as the page draws it (``timeline_chart.js`` says what it is sent).

    ``runs``: the finished runs' points; ``hidden``: the runs the table's ticks hide; ``utilisation_title``:
    what the left axis measures; ``visible``: the page's to set, the chart is on screen and its tab shown.
    """

    _esm = Path(__file__).with_name("timeline_chart.js")
    runs = traitlets.List(traitlets.Dict()).tag(sync=True)
    hidden = traitlets.List(traitlets.Int()).tag(sync=True)
    utilisation_title = traitlets.Unicode("").tag(sync=True)
    visible = traitlets.Bool(False).tag(sync=True)


def step_rows(steps: Sequence[StepRecord]) -> list[list[Any]]:
    """Steps as the chart reads them: ``[rank, warm-up, step, ms]``, the time to 4 significant digits."""
    return [[s.rank, int(s.warmup), s.step, float(f"{s.total_s * 1e3:.4g}")] for s in steps]


def util_rows(samples: Sequence[TelemetrySample]) -> list[list[Any]]:
    """Telemetry as the chart reads it: ``[device, t, utilisation %, memory MiB]`` (utilisation None where a
    GPU does not report it); memory rides along for the hover, as in the report's figure."""
    return [[s.device, round(s.t, 3), None if s.util_pct is None else round(s.util_pct, 1),
             round(s.mem_used_bytes / 2**20)] for s in samples]


def run_points(run: Run, steps: Sequence[StepRecord], samples: Sequence[TelemetrySample]) -> dict[str, Any]:
    """One run's header with the given points of it: a "points" message, or a run of the chart's state."""
    return {"run": run.index, "name": run.name, "colour": run_colour(run.index), "ranks": run.ranks,
            "steps": step_rows(steps), "util": util_rows(samples)}


class Timeline:
    """What the chart has been given: the finished runs as its state, a running run's points as they come.

    ``probe`` measures the panel's width for the Compare figures and the control columns (the chart measures
    its own).
    """

    def __init__(self, device: DeviceInfo) -> None:
        self.chart = TimelineChart(utilisation_title=utilisation_title({"nvml" if device.has_cuda else "psutil"}))
        self.probe = WidthProbe(layout=w.Layout(width="100%", height="0px"))
        self._sent: dict[int, tuple[int, int]] = {}  # running run -> (steps, samples) the page holds
        self._settled: tuple[tuple[int, int], ...] = ()  # (run, id of its result) in the chart's state

    def stream(self, runs: Sequence[Run], ticker: Ticker | None = None) -> None:
        """Send the running runs' new points, with the measuring burst's progress line (``ticker``; None clears
        it), only while the page shows the chart: what it does not get while scrolled away goes with the next
        send once it is back. One message per send, so the page draws it in one frame."""
        if not self.chart.visible:
            return
        for run in runs:
            if run.result is not None:
                continue
            steps_sent, samples_sent = self._sent.get(run.index, (0, 0))
            steps, samples = run.steps[steps_sent:], run.samples[samples_sent:]
            if steps or samples or run.index not in self._sent:
                # The progress line goes with the points, and goes away with the first points sent without it.
                message = {"kind": "points", **run_points(run, steps, samples), "ticker": None if ticker is None
                           else {"text": ticker.text, "fraction": round(ticker.fraction, 4)}}
                self.chart.send(message)
                self._sent[run.index] = (len(run.steps), len(run.samples))

    def clear_ticker(self) -> None:
        """The action has ended: no progress line on the timeline."""
        self.chart.send({"kind": "ticker", "ticker": None})

    def settle(self, runs: Sequence[Run]) -> None:
        """Put every finished run into the chart's state (once per finished run): it replaces what was streamed."""
        done = tuple((run.index, id(run.result)) for run in runs if run.result is not None)
        if done == self._settled:
            return
        self._settled = done
        finished = [run for run in runs if run.result is not None]
        self.chart.runs = [run_points(run, *thinned_points(run)) for run in finished]
        for run in finished:
            self._sent.pop(run.index, None)
        sources = {s.source for run in runs for s in run.samples}
        if len(sources) == 1:
            self.chart.utilisation_title = utilisation_title(sources)

    def forget(self, run: int) -> None:
        """Take ``run`` out of the chart: a live run replaced by the next one (same index, drawn anew)."""
        self._sent.pop(run, None)
        self.chart.send({"kind": "forget", "run": run})

    def show(self, hidden: Collection[int]) -> None:
        """Draw only the runs that are not hidden (the runs table's ticks)."""
        self.chart.hidden = sorted(hidden)


def thinned_points(run: Run) -> tuple[list[StepRecord], list[TelemetrySample]]:
    """A finished run's steps and samples, each rank's (measured, warm-up) steps and each device's samples
    thinned to MAX_TRACE_POINTS on their own, so a short series is never thinned by a long one's stride."""
    steps = [s for group in step_groups(run.steps).values() for s in _bounded(tuple(group))]
    samples = [s for group in device_groups(run.samples).values() for s in _bounded(tuple(group))]
    return steps, samples


def sync_state(figure: Any) -> None:
    """Copy a ``FigureWidget`` into its widget state, so a view created later (a page reload) is current.

    plotly only copies the figure into the widget's synced state when the figure itself is displayed; inside a
    box it never is, and later views would start from the figure as it was built.
    """
    figure._repr_mimebundle_()


def fit_timeline(figure: Any, width: int) -> None:
    """The report's timeline ``width`` pixels wide, never narrower than MIN_WIDTH; narrower than NARROW_PX with
    the legend under the plots and short subplot titles, so both subplots keep their room."""
    width = max(MIN_WIDTH, width)
    narrow = width < NARROW_PX
    figure.update_layout(width=width, legend=LEGEND_BELOW if narrow else LEGEND_BESIDE,
                         height=TIMELINE_HEIGHT + (BELOW_EXTRA_PX if narrow else 0),
                         margin={"b": TIMELINE_MARGIN_B + (BELOW_EXTRA_PX if narrow else 0)})
    for annotation, title, short in zip(figure.layout.annotations, TIMELINE_TITLES, SHORT_TITLES, strict=False):
        annotation.text = short if narrow else title
