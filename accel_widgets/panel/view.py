"""``TuningPanel``: the notebook face of accel_widgets, one panel to flip knobs, run bursts and compare them.

The panel is three parts: a plain :class:`~.state.PanelState` (the runs, which are shown, the config being
edited, the status line, progress), the :class:`~.controller.PanelController` whose actions run off the
kernel's main thread and change only that state, and this view, which builds the widgets, renders the state
whenever it changes and hands clicks to the controller. The numbers, colours, names and figure traces come
from :mod:`accel_widgets.views.table`, as in the HTML report.
"""

from __future__ import annotations

import html
import os
from collections.abc import Collection
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

from ..engine.forkserver import warm_up
from ..engine.launcher import BurstEngine, Engine, run_burst
from ..engine.request import BurstOptions, RayCluster
from ..inputs.device import DeviceInfo, probe_device
from ..inputs.workload import Workload
from ..knobs import data
from ..knobs.config import Config
from ..results.burst import BurstResult, ProfileCapture
from ..results.comparison import Comparison
from ..results.history import RunHistory
from ..results.tune import TuneResult
from ..search.tuner import tune
from ..views.figures import COMPARISONS, batch_size_figure, comparison_figures
from ..views.headspace import ceilings_html
from ..views.style import themed
from ..views.text import findings_html, summary
from ..views.timeline import TIMELINE_META, fit_step_axis, timeline
from .controller import HistoryArg, Length, PanelController, Tuner, length_kwargs
from .controls import KNOBS_PX, KnobControls
from .plots import MIN_WIDTH, WIDTH, Timeline, fit_timeline, sync_state
from .recipe import RecipeView
from .state import PanelState, Part, ProfileShown
from .table import RunsTable

PERFETTO_URL = "https://ui.perfetto.dev"
#: The Compare tabs: the report's comparison figures, then its timeline of the finished runs (hover, zoom).
COMPARE_TABS = {**COMPARISONS, "timeline": "Timeline (hover, zoom)"}
PROFILE_TOP = 10  # operators shown; the full list is in the trace
#: Narrower than this the knobs leave the live chart's side for a place under the runs table: the chart keeps two
#: readable subplots and the table stays right under it.
KNOBS_BESIDE_PX = MIN_WIDTH + KNOBS_PX + 10
KNOBS_MAX_PX = 318  # the live chart's height with one row of legend under it (timeline_chart.js)


def profile_html(shown: ProfileShown) -> str:
    """The top operators of a profiled burst as a small table and where its trace is, or why there is none."""
    capture: ProfileCapture | None = shown.capture
    if capture is None:
        why = f": {html.escape(shown.why_none)}" if shown.why_none else ""
        return f'<div style="color: {themed("warning")};">⚠ No profile captured{why}.</div>'
    head = "".join(f'<th style="text-align: {align}; padding: 1px 8px;">{name}</th>'
                   for name, align in (("operator", "left"), ("calls", "right"), ("self CPU ms", "right"),
                                       ("self device ms", "right")))
    rows = "".join(
        f'<tr><td style="padding: 1px 8px; max-width: 520px; overflow: hidden; text-overflow: ellipsis; '
        f'white-space: nowrap;" title="{html.escape(op.name)}"><code>{html.escape(op.name)}</code></td>'
        f'<td style="text-align: right; padding: 1px 8px;">{op.calls:,}</td>'
        f'<td style="text-align: right; padding: 1px 8px;">{op.self_cpu_ms:,.2f}</td>'
        f'<td style="text-align: right; padding: 1px 8px;">{op.self_device_ms:,.2f}</td></tr>'
        for op in capture.top_operators[:PROFILE_TOP])
    return (f'<div style="font-size: 0.9em; line-height: 1.3;"><b>Profile</b> of {capture.steps} steady-state '
            f'step{"s" if capture.steps != 1 else ""} (times summed over them)'
            f'<table style="border-collapse: collapse; margin: 4px 0;"><tr>{head}</tr>{rows}</table>'
            f"Trace: <code>{html.escape(capture.trace_path)}</code> · open in "
            f'<a href="{PERFETTO_URL}" target="_blank" rel="noopener">{PERFETTO_URL}</a></div>')


#: The "Run on" choice, for a panel given a cluster.
RUN_HERE, RUN_ON_CLUSTER = "this machine", "Ray cluster"


class TuningPanel:
    """Explore every knob of the registry against ``workload`` and compare what each one did.

    ``engine`` is called like :func:`~accel_widgets.run_burst` (for example
    ``aw.BurstEngine(aw.BurstOptions(isolation="inprocess"))`` for a workload that cannot be pickled);
    ``device`` defaults to this machine; ``steps`` is the initial burst length. ``runs`` lists every
    finished BurstResult, ``config`` is what the controls say now, and ``wait()`` blocks until the running
    action ends and returns the last run it finished. ``state`` is everything the panel shows, as plain data.

    ``history``: where every finished burst is recorded, so a restarted kernel can load it again: a
    :class:`RunHistory`, a path, ``None`` for the default file (``$ACCEL_WIDGETS_HISTORY`` or
    ``./accel_widgets_history.sqlite``) or ``False`` for none. A history that cannot be used is reported
    under the status line and the panel carries on without it. ``tuner`` is called like
    :func:`~accel_widgets.tune`. Profile runs ``profile_steps`` profiled steps and writes the trace under
    ``profile_dir``.

    ``cluster``: a Ray cluster the panel may run on (:class:`~accel_widgets.RayCluster`); its "Run on" choice then
    sends every burst, comparison, ladder and search there or keeps them on this machine, and each run's row says
    where it ran.
    """

    def __init__(self, workload: Workload, *, engine: Engine = run_burst, device: DeviceInfo | None = None,
                 steps: int = 20, history: HistoryArg = None, tuner: Tuner = tune,
                 profile_steps: int = 5, profile_dir: str | os.PathLike[str] = "accel_widgets_profiles",
                 compare: bool = True, budget_s: float = 60.0, cluster: RayCluster | None = None) -> None:
        if cluster is not None and not isinstance(cluster, RayCluster):
            raise TypeError(f"cluster must be an accel_widgets.RayCluster, got {type(cluster).__name__}")
        self.workload = workload
        self.device = device or probe_device()
        self.state = PanelState(self.device)
        self.controller = PanelController(workload, self.state, engine=engine, tuner=tuner, history=history,
                                          profile_steps=profile_steps, profile_dir=str(profile_dir))
        self._build_actions(steps)
        self._engines = ({RUN_HERE: engine, RUN_ON_CLUSTER: BurstEngine(BurstOptions(cluster=cluster), engine)}
                         if cluster is not None else {})
        self.run_on.observe(lambda change: self.controller.use_engine(
            self._engines[change["new"]], on_cluster=change["new"] == RUN_ON_CLUSTER), names="value")
        self.compare_runs.value = compare
        self.budget.value = budget_s
        self.controls = KnobControls(self.state.draft, self.state.edit, self.reset_button)
        self.plots = Timeline(self.device)
        self._width = WIDTH  # until the browser says how wide the panel is
        self.table = RunsTable(self.state.set_shown)
        self.recipe = RecipeView(workload)
        self.diagnosis = w.HTML(layout=w.Layout(margin="10px 0 0 0"))
        self.profile_view = w.HTML(layout=w.Layout(margin="6px 0 0 0", display="none"))
        # Every section closed until the user opens one: a figure no one looks at is never laid out in the page.
        self.compare = w.Accordion(children=[w.VBox() for _ in COMPARE_TABS], titles=list(COMPARE_TABS.values()),
                                   selected_index=None, layout=w.Layout(display="none", margin="8px 0 0 0"))
        self.compare.observe(lambda _: self._render_compare(), names="selected_index")
        self._compared: dict[int, tuple[int, ...]] = {}  # tab -> the finished runs its figure shows
        self.root = self._assemble()
        with self.state.lock:
            self.state.subscribe(self._render)
            for part in ("draft", "action", "status", "progress", "fit"):
                self._render(part)
        self.plots.probe.observe(self._fit, names="width")
        self.plots.chart.observe(self._chart_shown, names="visible")
        if engine is run_burst:
            warm_up()  # the forkserver imports torch now, so the first burst starts fast

    # -- public API -------------------------------------------------------------------------------
    @property
    def runs(self) -> list[BurstResult]:
        return self.state.results

    @property
    def loaded(self) -> dict[int, str]:
        """Run index -> hover note, for the runs loaded from the run history."""
        return self.state.loaded

    @property
    def history(self) -> RunHistory | None:
        return self.controller.history

    @property
    def compared(self) -> dict[int, Comparison]:
        """Run index -> its comparison with its baseline, for the runs that have one (the table's intervals)."""
        return dict(self.state.compared)

    @property
    def tune_result(self) -> TuneResult | None:
        return self.state.tune_result

    @property
    def config(self) -> Config:
        """The config the controls describe (raises KnobValueError for an invalid typed value)."""
        return self.state.draft.config()

    def set_config(self, config: Config) -> None:
        """Show ``config`` in the controls, as if the user had set each one."""
        self.state.set_config(config)

    @property
    def running(self) -> bool:
        return self.controller.running

    def run_burst(self) -> None:
        """Start one burst of the current settings (what the Run burst button does); once it has a row, it is
        compared with its baseline, interleaved, for up to the budget box's seconds: the row's speed-up becomes an
        interval and a verdict as the repeats arrive (Stop keeps what they measured)."""
        self.controller.run_burst(self._length(), self._comparison_budget())

    def run_ladder(self, leave_out: Collection[str] = ()) -> None:
        """Start the classic ladder (baseline, +loader, +precision, +compile, +rest), one burst per rung, but the
        rungs named in ``leave_out`` (``{"+compile"}``: a cold compile costs tens of seconds on a CPU); then every
        rung is compared with the one before and the baseline within the budget box's seconds."""
        self.controller.run_ladder(self._length(), leave_out, self._comparison_budget())

    def profile(self) -> None:
        """Start one burst of the current settings with ``profile_steps`` profiled steps after the measured
        ones, then show its top operators and trace (what the Profile button does)."""
        self.controller.profile(self._length())

    def tune(self) -> None:
        """Start the auto-tuner from the current settings within the budget control's seconds (the Tune
        button); every burst it runs joins the table as it finishes, and the best config ends up in the
        controls."""
        steps = self._length()["steps"] or 20  # the tuner measures steps; a seconds length keeps its default
        self.controller.tune(float(self.budget.value), int(steps))

    def find_batch_size(self) -> None:
        """Start the batch-size finder from the current settings (the Find batch size button): tries growing
        batch sizes in worker processes, then shows samples/s against batch size and the largest that fits."""
        self.controller.find_batch_size(int(self._length()["steps"] or 8))

    def remeasure(self) -> None:
        """Compare the run the reading is about with its baseline again, interleaved, within the budget box's
        seconds (the Re-measure button): its row then shows the interval and verdict."""
        self.controller.remeasure(self._budget())

    def headspace(self) -> None:
        """Measure the ceilings of the current settings within the budget box's seconds (the Ceilings button): each
        part of the step made free (the data; the gradients' exchange under DDP/FSDP; the host's work on a GPU)
        against the settings as they are; the bars appear under the runs table, and the ladder and the tuner leave
        out what a "same" ceiling closes."""
        self.controller.headspace(self._budget())

    def _budget(self) -> float:
        """The one budget the user sets: Tune's search, and what each comparison may spend."""
        return float(self.budget.value)

    def _comparison_budget(self) -> float | None:
        """What a run's comparison with its baseline may spend; None while Compare is off (one burst each)."""
        return self._budget() if self.compare_runs.value else None

    def load_history(self) -> None:
        """Add the history's runs of this workload that the table does not show yet (Load earlier runs)."""
        self.controller.load_history()

    def stop(self) -> None:
        """Ask the running burst to stop (the engine ends it within a second) and end a ladder or a tuning."""
        self.controller.stop()

    @property
    def live(self) -> bool:
        """Live mode (the Live toggle): every change of a knob stops the burst in flight and, ~0.5 s after
        the last change, runs the new settings; the newest live run replaces the previous one unless pinned."""
        return self.state.live

    @live.setter
    def live(self, on: bool) -> None:
        self.controller.set_live(on, self._length)

    def pin(self) -> None:
        """Keep the live run (the Pin button): the next live burst adds a run instead of replacing it."""
        self.controller.pin()

    def close(self) -> None:
        """Turn live mode off, stop the running action and wait for it to end."""
        self.controller.close()

    def reset(self) -> None:
        """Set every control back to the baseline config (the plain training loop)."""
        self.set_config(Config())

    def wait(self, timeout: float | None = None) -> BurstResult | None:
        """Block until the running action finishes and return the last run it finished (``aw.summary(panel.wait())``
        after ``panel.run_burst()``); None when it finished no run (Load earlier runs, Find batch size) or when
        ``timeout`` passed first (``panel.running`` is then still True)."""
        return self.controller.last_run if self.controller.wait(timeout) else None

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        return self.root._repr_mimebundle_(**kwargs)

    # -- rendering --------------------------------------------------------------------------------
    def _render(self, part: Part) -> None:
        """Show the part of the state that changed (called under the state's lock).

        The timeline gets a running burst's new points and each finished run once; the Compare tab looked at
        is drawn again only when no action runs: laying a plotly figure out in the page while a burst measures
        (or between a ladder's rungs) would cost the burst the CPU it takes.
        """
        state = self.state
        if part == "draft":
            self.controls.render(state.draft)
            self.validation.value = self._validation_html()
            self._render_buttons()
        elif part in ("action", "live"):
            self._render_buttons()
            if part == "action" and state.action is None:
                self.plots.clear_ticker()
                self._render_compare()  # the action has ended: the figure looked at catches up, once
        elif part == "replaced" and state.replaced is not None:
            self.plots.forget(state.replaced)
        elif part == "status":
            self.status.value = self._status_html()
        elif part == "progress":
            self.progress.value = state.progress
        elif part == "points":
            self.plots.stream(state.runs, state.ticker)
        elif part == "runs":
            self.plots.stream(state.runs)
            self.plots.settle(state.runs)
            self.table.render(state.rows, state.hidden)
            self.recipe.render(state.rows)
            if state.action is None:
                self._render_compare()
        elif part == "shown":
            self.plots.show(state.hidden)
            self.table.show(state.hidden)
        elif part == "reading" and state.reading is not None:
            self._render_buttons()  # Re-measure acts on the run the reading is about
            findings = findings_html(state.reading.findings, themed)
            self.diagnosis.value = (f'<div style="font-size: 0.9em; line-height: 1.3;"><b>Reading of '
                                    f"{html.escape(state.reading.name)}</b>{findings}</div>")
        elif part == "batch":
            self._render_batch_search()
        elif part == "headspace":
            found = state.headspace
            self.ceilings.value = "" if found is None else ceilings_html(found, themed)
            self.ceilings.layout.display = "none" if found is None else None
        elif part == "fit":
            colour = themed("warning" if state.fit.startswith(("does not fit", "no memory")) else "muted")
            self.controls.controls[data.SIZES_MEMORY].show_aside(state.fit, colour)
        elif part == "profile":
            self.profile_view.layout.display = "none" if state.profile is None else None
            self.profile_view.value = "" if state.profile is None else profile_html(state.profile)

    def _chart_shown(self, change: dict[str, Any]) -> None:
        """The page shows the timeline again (scrolled back, tab shown): send what it missed meanwhile."""
        if change["new"]:
            with self.state.lock:
                self.plots.stream(self.state.runs)

    def _fit(self, change: dict[str, Any]) -> None:
        """The browser measured the panel's width: fit the figures to it and put the knobs beside the live chart
        where both fit, else under the runs table (under the lock, as every redraw)."""
        width = int(change["new"])
        with self.state.lock:
            self._width = width
            # Figures drawn before the browser measured (runs loaded at start) were drawn at the default width.
            for box in (*self.compare.children, self.batch_view):
                for figure in box.children:
                    if isinstance(figure, go.FigureWidget):
                        self._fit_figure(figure)
            self._place_knobs(beside=width >= KNOBS_BESIDE_PX)

    def _place_knobs(self, *, beside: bool) -> None:
        """The knobs beside the live chart, or under the runs table: the chart and the table stay together. Only
        the boxes' flex order and sizes change, so no view in the page is built again for it (a view moved while
        the page still builds it, as when a resize or a theme change reports widths in a burst, fails to draw)."""
        self.knobs_beside = beside
        self._chart_box.layout.flex = "1 1 0%" if beside else "1 1 100%"
        self.knobs.layout.order = "1" if beside else "3"
        self.knobs.layout.border_left = f"1px solid {themed('rule')}" if beside else "none"
        self.knobs.layout.padding = "0 0 0 10px" if beside else "6px 0 0 0"
        # Beside the chart the knobs never make its row taller than the chart: an open family scrolls in its place.
        self.knobs.layout.max_height = f"{KNOBS_MAX_PX}px" if beside else "none"
        self.knobs.layout.overflow = "hidden auto" if beside else "visible"

    def _render_buttons(self) -> None:
        running, ok = self.state.action is not None, self.state.draft.validation.ok
        for button in (self.run_button, self.profile_button, self.tune_button, self.batch_button,
                       self.ceilings_button):
            button.disabled = running or not ok
        self.ladder_button.disabled = running
        self.load_button.disabled = running or not self.state.history_on
        target = self.state.remeasurable()
        self.remeasure_button.disabled = running or target is None
        if target is not None:
            unreliable = self.state.rows[target].values["unreliable"]
            self.remeasure_button.button_style = "warning" if unreliable else ""
            self.remeasure_button.tooltip = (f"measure {self.state.runs[target].name} again, interleaved with its "
                                             "baseline, for up to the budget's seconds: an interval and a verdict")
        self.stop_button.disabled = not running
        self.run_on.disabled = running
        self.live_button.value = self.state.live
        self.pin_button.disabled = self.state.live_run is None

    def _validation_html(self) -> str:
        """What this machine says about the current settings; an error disables Run burst."""
        validation = self.state.draft.validation
        parts = []
        if validation.error:
            parts.append(f'<div style="color: {themed("error")};">✗ {html.escape(validation.error)}</div>')
        parts += [f'<div style="color: {themed("warning")};">⚠ {html.escape(text)}</div>'
                  for text in validation.warnings]
        return f'<div style="font-size: 0.9em; line-height: 1.3;">{"".join(parts)}</div>'

    def _status_html(self) -> str:
        state = self.state
        # A still mark, not a spinning icon: an animation repaints the page every frame while a burst measures.
        spinner = "⏳ " if state.busy else ""
        problem = ""
        if state.history_problem:
            problem = (f'<div style="color: {themed("warning")}; font-size: 0.85em; line-height: 1.2;">⚠ Run '
                       f"history off: {html.escape(state.history_problem)}</div>")
        # One line, cut with its whole text on hover: a status that wrapped to a second line and back as it changes
        # would move the chart and the runs table under it, and the page would lay them out again each time.
        text = html.escape(spinner + state.status)
        return (f'<div style="font-size: 0.95em; white-space: nowrap; overflow: hidden; text-overflow: ellipsis;" '
                f'title="{text}">{text}</div>{problem}')

    def _render_compare(self) -> None:
        """Draw the selected Compare tab's figure (the report's) from the finished runs, once per change and only
        when a tab is selected: a tab not looked at costs nothing, and a ladder's rungs do not rebuild four
        figures each."""
        results = self.state.results
        self.compare.layout.display = None if results else "none"
        tab = self.compare.selected_index
        shown = tuple(id(result) for result in results)  # a live run replaced keeps the count, not the ids
        if tab is None or not results or self._compared.get(tab) == shown:
            return
        key = list(COMPARE_TABS)[tab]
        if key == "timeline":
            figure = self._timeline_figure(results)
        else:
            # only the tab looked at
            figure = comparison_figures(results, keys=(key,), compared=self.state.compared).get(key)
        if figure is None:
            why = "needs a ladder (runs besides the baseline)" if key == "waterfall" else "has nothing to show yet"
            self.compare.children[tab].children = (w.HTML(f"<i>This figure {why}.</i>"),)
        else:
            widget = go.FigureWidget(figure)
            self._fit_figure(widget)
            self.compare.children[tab].children = (widget,)
        self._compared = {tab: shown}

    def _timeline_figure(self, results: list[BurstResult]) -> go.Figure:
        """The report's timeline of the finished runs, the runs unticked in the table hidden."""
        figure = timeline(results, [run.name for run in self.state.runs if run.result is not None])
        for trace in figure.data:
            trace.visible = trace.meta["run"] not in self.state.hidden
        fit_step_axis(figure)
        return figure

    def _fit_figure(self, figure: go.FigureWidget) -> None:
        """A figure of the panel as wide as the panel is drawn; the timeline with its narrow layout too."""
        if figure.layout.meta == TIMELINE_META:
            fit_timeline(figure, self._width)
        else:
            figure.layout.width = max(MIN_WIDTH, self._width)
        sync_state(figure)

    def _render_batch_search(self) -> None:
        """The finder's curve and its table of tries, under the runs; hidden until a search has finished."""
        search = self.state.batch_search
        if search is None:
            self.batch_view.children, self.batch_view.layout.display = (), "none"
            return
        figure = go.FigureWidget(batch_size_figure(search))
        self._fit_figure(figure)
        self.batch_view.children = (figure, w.HTML(f"<pre style='font-size: 0.85em;'>{html.escape(summary(search))}"
                                                   "</pre>"))
        self.batch_view.layout.display = None

    def _live_toggled(self, change: dict[str, Any]) -> None:
        if bool(change["new"]) != self.state.live:
            self.live = bool(change["new"])

    def _length(self) -> Length:
        return length_kwargs(self.length_unit.value, self.length_value.value)

    # -- layout -----------------------------------------------------------------------------------
    def _build_actions(self, steps: int) -> None:
        self.length_unit = w.Dropdown(options=["steps", "seconds"], value="steps", layout=w.Layout(width="92px"),
                                      tooltip="measure a number of steps, or for a number of seconds")
        self.length_value = w.BoundedFloatText(value=steps, min=1, max=100_000, step=1,
                                               tooltip="burst length (after the warm-up steps)",
                                               layout=w.Layout(width="70px"))
        self.run_button = w.Button(description="Run burst", button_style="primary", icon="play",
                                   tooltip="one timed burst of the knobs' settings")
        self.ladder_button = w.Button(description="Run ladder", icon="forward",
                                      tooltip="baseline → +loader → +precision → +compile → +rest, cumulative")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop",
                                    tooltip="stop the running burst (within a second) and the rest of a ladder")
        self.reset_button = w.Button(description="Reset", icon="undo",
                                     tooltip="set every knob back to the plain training loop")
        self.profile_button = w.Button(description="Profile", icon="search",
                                       tooltip="one burst of the settings above, then torch.profiler on a few "
                                               "more steps: the top operators and a trace for Perfetto")
        self.tune_button = w.Button(description="Tune", icon="magic",
                                    tooltip="search the knobs from the settings above for the fastest config "
                                            "that trains like the baseline, within the budget")
        self.budget = w.BoundedFloatText(value=60, min=5, max=86_400, step=10, layout=w.Layout(width="70px"),
                                         tooltip="the budget, in seconds: the tuner's search, and what each "
                                                 "comparison of a run with its baseline may spend")
        self.compare_runs = w.Checkbox(value=True, description="Compare", indent=False,
                                       layout=w.Layout(width="auto", margin="0 0 4px 8px"),
                                       tooltip="after each run, measure it again against its baseline, interleaved, "
                                               "within the budget: its speed-up becomes an interval and a verdict "
                                               "(off: one burst each, a lone ratio)")
        self.batch_button = w.Button(description="Find batch size", icon="arrows-h",
                                     tooltip="try growing batch sizes of the settings above in worker processes: "
                                             "the largest that fits (on a CPU, under half the free RAM) and "
                                             "samples/s at each size")
        self.live_button = w.ToggleButton(description="Live", icon="bolt", value=False,
                                          tooltip="every change of a knob re-runs the burst (~0.5 s after the last "
                                                  "change); the newest live run replaces the previous one")
        self.pin_button = w.Button(description="Pin", icon="thumb-tack", disabled=True,
                                   tooltip="keep the live run: the next live burst adds a run of its own")
        self.remeasure_button = w.Button(description="Re-measure", icon="balance-scale", disabled=True,
                                         tooltip="measure the run in the reading again, interleaved with its "
                                                 "baseline: the paired speed-up and its spread")
        self.ceilings_button = w.Button(description="Ceilings", icon="tachometer",
                                        tooltip="the most each part of the step could win: the settings with the "
                                                "data (the gradients' exchange, the host's work) made free, measured "
                                                "against them as they are within the budget; the ladder and Tune "
                                                "then leave out what cannot help")
        self.run_on = w.ToggleButtons(options=[RUN_HERE, RUN_ON_CLUSTER], value=RUN_HERE,
                                      style={"button_width": "auto"}, tooltips=["every burst's ranks on this machine",
                                                "every burst's ranks as Ray actors on the cluster, one fresh burst "
                                                "per comparison window"],
                                      layout=w.Layout(width="auto", margin="0 0 4px 0", flex="0 0 auto"))
        self.load_button = w.Button(description="Load earlier runs", icon="history",
                                    tooltip="add this workload's runs recorded in the history file (⟲ in the "
                                            "table) that are not shown yet")
        for button in (self.run_button, self.ladder_button, self.stop_button, self.profile_button,
                       self.tune_button, self.live_button, self.pin_button, self.remeasure_button, self.batch_button,
                       self.ceilings_button, self.load_button):
            button.layout = w.Layout(width="auto", margin="0 4px 4px 0", flex="0 0 auto")
        self.reset_button.layout = w.Layout(width="auto", flex="0 0 auto")
        self.run_button.on_click(lambda _: self.run_burst())
        self.ladder_button.on_click(lambda _: self.run_ladder())
        self.stop_button.on_click(lambda _: self.stop())
        self.reset_button.on_click(lambda _: self.reset())
        self.profile_button.on_click(lambda _: self.profile())
        self.tune_button.on_click(lambda _: self.tune())
        self.load_button.on_click(lambda _: self.load_history())
        self.live_button.observe(self._live_toggled, names="value")
        self.pin_button.on_click(lambda _: self.pin())
        self.batch_button.on_click(lambda _: self.find_batch_size())
        self.ceilings_button.on_click(lambda _: self.headspace())
        self.remeasure_button.on_click(lambda _: self.remeasure())
        self.batch_view = w.VBox(layout=w.Layout(display="none", margin="6px 0 0 0"))
        self.validation = w.HTML()
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0,
                                        layout=w.Layout(width="160px", flex="0 0 auto", margin="0 8px 0 0"))
        self.status = w.HTML()

    def _assemble(self) -> w.VBox:
        """The panel laid out around its loop, flip a knob, press Run, watch, read: the actions on top with the
        progress and the status line, then the live chart with the knobs beside it (under the runs table where the
        panel is too narrow for both), then the runs table, so one screen holds what a burst is watched with."""
        device = self.device
        where = (f"{len(device.gpus)} × {device.name}" if device.has_cuda
                 else f"{device.cpu_name}, {device.cpu_count} cores, no GPU")
        group = w.Layout(align_items="center", flex="0 0 auto", margin="0 12px 0 0", overflow="visible")
        label = w.Layout(margin="0 4px 4px 0", flex="0 0 auto")
        unit = w.Layout(margin="0 0 4px 4px", flex="0 0 auto")
        header = w.HTML(f'<div style="font-size: 0.85em; color: {themed("muted")}; white-space: nowrap;">'
                        f"accel_widgets · <code>{html.escape(self.workload.name)}</code> · {html.escape(where)}</div>",
                        layout=w.Layout(flex="0 0 auto", margin="0 0 4px auto"))
        actions = w.HBox(
            [w.HBox([self.run_button, self.stop_button, self.ladder_button], layout=group),
             w.HBox([self.tune_button, self.budget, w.HTML("s", layout=unit), self.compare_runs], layout=group),
             w.HBox([w.HTML("Burst", layout=label), self.length_value, self.length_unit], layout=group),
             *([w.HBox([w.HTML("on", layout=label), self.run_on], layout=group)] if self._engines else []),
             w.HBox([self.live_button, self.pin_button, self.profile_button, self.remeasure_button, self.batch_button,
                     self.ceilings_button, self.load_button],
                    layout=w.Layout(flex_flow="row wrap", flex="0 1 auto", overflow="visible")),
             header],
            layout=w.Layout(flex_flow="row wrap", align_items="center", width="100%", overflow="visible"))
        for box in actions.children[1:3]:  # an input's own margin is beside it, not under it
            for widget in box.children:
                if isinstance(widget, w.BoundedFloatText | w.Dropdown):
                    widget.layout.margin = "0 0 4px 0"
        self.status.layout = w.Layout(flex="1 1 0%", min_width="0")
        status_line = w.HBox([self.progress, self.status],
                             layout=w.Layout(align_items="center", width="100%", margin="0 0 4px 0"))
        self.knobs = w.VBox([self.controls.widget, self.validation],
                            layout=w.Layout(width=f"{KNOBS_PX}px", min_width=f"{KNOBS_PX}px", flex="0 0 auto"))
        self.plots.chart.layout = w.Layout(width="100%", min_width="0", overflow="hidden")
        self._chart_box = w.VBox([self.plots.chart], layout=w.Layout(min_width=f"{MIN_WIDTH}px", order="0"))
        self.table.widget.layout = w.Layout(width="100%", flex="1 1 100%", margin="4px 0 0 0", order="2")
        # The ceilings' bars right under the table, before the knobs when these wrap under it (same order, later).
        self.ceilings = w.HTML(layout=w.Layout(width="100%", flex="1 1 100%", margin="4px 0 0 0", order="2",
                                               display="none"))
        # One wrapping row: the chart and the knobs, then the runs table on a line of its own; narrow, the knobs go
        # after the table. Before the kernel has answered a resize, the knobs wrap under the chart in the browser.
        self._main = w.HBox([self._chart_box, self.knobs, self.table.widget, self.ceilings],
                            layout=w.Layout(flex_flow="row wrap", align_items="flex-start", width="100%",
                                            overflow="visible"))
        self._place_knobs(beside=True)
        root = w.VBox([self.plots.probe, actions, status_line, self._main, self.recipe.widget, self.diagnosis,
                       self.compare, self.profile_view, self.batch_view],
                      layout=w.Layout(width="100%", max_width="1400px"))
        # Stable CSS hooks for browser tests and user styling; ipywidgets' own classes are generic.
        for widget, name in ((root, "panel"), (self.run_button, "run-burst"), (self.ladder_button, "run-ladder"),
                             (self.stop_button, "stop"), (self.status, "status"), (self.table.widget, "runs"),
                             (self.plots.chart, "plots"),
                             (self.profile_button, "profile"),
                             (self.tune_button, "tune"), (self.load_button, "load-history"),
                             (self.live_button, "live"), (self.pin_button, "pin"),
                             (self.remeasure_button, "remeasure"),
                             (self.batch_button, "find-batch-size"), (self.batch_view, "batch-view"),
                             (self.ceilings_button, "headspace"), (self.ceilings, "ceilings"),
                             (self.compare, "compare"), (self.recipe.button, "use-in-my-code"),
                             (self.recipe.styles, "recipe-styles"), (self.recipe.code, "recipe-code"),
                             (self.profile_view, "profile-view"), (actions, "actions"), (self.knobs, "knobs"),
                             (self.reset_button, "reset")):
            widget.add_class(f"aw-{name}")
        return root
