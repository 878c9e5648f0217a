"""``TuningPanel``: the notebook face of accel_widgets, one panel to flip knobs, run bursts and compare.

A thin view over the public API: the controls come from the knob registry, validation from
``check_config``, the runs from the injectable ``engine`` (``run_burst``), the numbers from
``reporting.comparison_rows``, the reading from :func:`.diagnosis.diagnose`, the training check from
:mod:`..guard`, the search from the injectable ``tuner`` (:func:`..tuner.tune`) and the memory across
sessions from a :class:`..history.RunHistory`.

Threading: every action runs on one background thread, so the kernel stays free to answer the
browser (and the Stop button) while a burst trains in worker processes. The engine calls
``on_event`` on that thread; events are batched and pushed to the figure at ~4 Hz from there.
Only one action runs at a time: the action buttons are disabled while it does. The history is only
touched from the action thread too (the workload fingerprint builds the model, which can take a while).
"""

from __future__ import annotations

import html
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import ipywidgets as w

from ..config import Config
from ..device import DeviceInfo, probe_device
from ..diagnosis import Finding, diagnose
from ..engine.launcher import BurstError, run_burst, warm_up
from ..guard import find_baseline
from ..history import HistoryError, RunHistory, workload_fingerprint
from ..results import BurstResult, ProfileCapture
from ..workload import Workload
from . import state
from .controls import KnobControls
from .plots import LivePlots
from .table import LOADED_MARK, RunsTable

Engine = Callable[..., BurstResult]
HistoryArg = RunHistory | str | os.PathLike[str] | Literal[False] | None
PERFETTO_URL = "https://ui.perfetto.dev"
PROFILE_TOP = 10  # operators shown; the full list is in the trace
ACTIONS_WIDTH = "310px"
_FINDING_ICONS = {"warn": ("⚠", "#b35900"), "info": ("ℹ", "#1565c0"), "good": ("✔", "#2e7d32")}


class TuneStepLike(Protocol):
    """What the panel reads of a :class:`..tuner.TuneStep` (structural, so tests can pass a fake tuner)."""

    knob: str
    value: Any
    accepted: bool
    speedup: float | None
    reason: str


class TuneOutcome(Protocol):
    """What the panel reads of a :class:`..tuner.TuneResult`."""

    best: Config
    best_samples_per_s: float | None
    baseline_samples_per_s: float | None
    ladder: Sequence[TuneStepLike]
    bursts: Sequence[BurstResult]
    wall_s: float
    stopped_reason: str


Tuner = Callable[..., TuneOutcome]


def _default_tuner(*args: Any, **kwargs: Any) -> TuneOutcome:
    """:func:`..tuner.tune`, imported on first use so opening a panel never pays for (or breaks on) the tuner."""
    from ..tuner import tune

    return tune(*args, **kwargs)


def tune_speedup(outcome: TuneOutcome) -> float:
    """The best config's gain over the start: the product of the accepted steps' interleaved speed-ups (the
    number to trust on a drifting machine, unlike the ratio of medians measured at different times)."""
    return math.prod(s.speedup for s in outcome.ladder if s.accepted and s.speedup is not None)


def profile_html(capture: ProfileCapture | None, why_none: str = "") -> str:
    """The top operators of a profiled burst as a small table, and where its trace is."""
    if capture is None:
        why = f": {html.escape(why_none)}" if why_none else ""
        return f'<div style="color: #b35900;">⚠ No profile captured{why}.</div>'
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


class TuningPanel:
    """Explore every knob of the registry against ``workload`` and compare what each one did.

    ``engine`` has ``run_burst``'s signature (tests inject a fake); ``device`` defaults to this
    machine; ``steps`` is the initial burst length. ``runs`` lists every BurstResult so far, ``config``
    is what the controls say now, and ``wait()`` blocks until the running action ends.

    ``history``: where every finished burst is recorded, so a restarted kernel can load it again: a
    :class:`RunHistory`, a path, ``None`` for the default file (``$ACCEL_WIDGETS_HISTORY`` or
    ``./accel_widgets_history.sqlite``) or ``False`` for none. A history that cannot be used is reported
    in the status line and the panel carries on without it. ``tuner`` has :func:`..tuner.tune`'s
    signature (tests inject a fake). Profile runs ``profile_steps`` profiled steps and writes the trace
    under ``profile_dir``.
    """

    def __init__(self, workload: Workload, *, engine: Engine = run_burst, device: DeviceInfo | None = None,
                 steps: int = 20, history: HistoryArg = None, tuner: Tuner = _default_tuner,
                 profile_steps: int = 5, profile_dir: str | os.PathLike[str] = "accel_widgets_profiles") -> None:
        self.workload = workload
        self.device = device or probe_device()
        self.runs: list[BurstResult] = []
        self.loaded: dict[int, str] = {}  # run index -> hover note, for runs loaded from the history
        self.update_times: list[float] = []  # monotonic time of each push to the figure (rate checks)
        self._engine = engine
        self._tuner = tuner
        self.profile_steps = profile_steps
        self.profile_dir = str(profile_dir)
        self.tune_result: TuneOutcome | None = None
        self._history_problem = ""
        self.history = self._open_history(history)
        self._fingerprint: str | None = None
        self._shown_ids: set[int] = set()  # history ids already in the table (recorded here or loaded)
        self._thread: threading.Thread | None = None
        # Guards the action thread's start and end against the button state: without it, a button update
        # computed on one thread just before the other thread finished could leave Run disabled for good.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._stop_requested_at: float | None = None
        self._validation = state.Validation()

        self.controls = KnobControls(self.device, self._on_control_change)
        self.plots = LivePlots(self.device)
        self.table = RunsTable(self.plots.show_runs)
        self._build_actions(steps)
        self.diagnosis = w.HTML(layout=w.Layout(margin="10px 0 0 0"))
        self.profile_view = w.HTML(layout=w.Layout(margin="6px 0 0 0", display="none"))
        self.root = self._assemble()
        self._revalidate()
        if engine is run_burst:
            warm_up()  # the forkserver imports torch now, so the first burst starts fast

    # -- public API -------------------------------------------------------------------------------
    @property
    def config(self) -> Config:
        """The config the controls describe (raises KnobValueError for an invalid typed value)."""
        return self.controls.config()

    def set_config(self, config: Config) -> None:
        """Show ``config`` in the controls, as if the user had set each one."""
        self.controls.set_config(config)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run_burst(self) -> None:
        """Start one burst of the current settings (what the Run burst button does)."""
        plan = [state.PlanItem("", self._runnable_config())]
        length = self._length()
        self._start("Burst", lambda: self._run_plan("Burst", plan, length))

    def run_ladder(self) -> None:
        """Start the classic ladder (baseline, +loader, +precision, +compile, +rest), one burst per rung."""
        plan = state.ladder_plan(self.workload, self.device)
        length = self._length()
        self._start("Ladder", lambda: self._run_plan("Ladder", plan, length))

    def profile(self) -> None:
        """Start one burst of the current settings with ``profile_steps`` profiled steps after the measured
        ones, then show its top operators and trace (what the Profile button does)."""
        config = self._runnable_config()
        length = self._length()
        self._start("Profile", lambda: self._run_profile(config, length))

    def tune(self) -> None:
        """Start the auto-tuner from the current settings within the budget control's seconds (the Tune
        button); every burst it runs joins the table as it finishes, and the best config ends up in the
        controls."""
        base = self._runnable_config()
        budget = float(self.budget.value)
        steps = self._length()["steps"] or 20  # the tuner measures steps; a seconds length keeps its default
        self._start("Tune", lambda: self._run_tune(base, budget, int(steps)))

    def load_history(self) -> None:
        """Add the history's runs of this workload that the table does not show yet (Load earlier runs)."""
        if self.history is None:
            raise RuntimeError(f"no run history: {self._history_problem or 'the panel was opened with history=False'}")
        self._start("Load", self._run_load)

    def stop(self) -> None:
        """Ask the running burst to stop (the engine ends it within a second) and end a ladder or a tuning."""
        if self.running and not self._stop.is_set():
            self._stop_requested_at = time.monotonic()
            self._stop.set()
            self._status("Stopping…")

    def reset(self) -> None:
        """Set every control back to the baseline config (the plain training loop)."""
        self.set_config(Config())

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the running action finishes; False if ``timeout`` passed first."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.running

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        self.plots.sync_state()  # the figure's widget state must be current before a view is created
        return self.root._repr_mimebundle_(**kwargs)

    # -- layout -----------------------------------------------------------------------------------
    def _build_actions(self, steps: int) -> None:
        self.length_unit = w.Dropdown(options=["steps", "seconds"], value="steps", layout=w.Layout(width="90px"),
                                      tooltip="measure a number of steps, or for a number of seconds")
        self.length_value = w.BoundedFloatText(value=steps, min=1, max=100_000, step=1,
                                               tooltip="burst length (after the warm-up steps)",
                                               layout=w.Layout(width="75px"))
        self.run_button = w.Button(description="Run burst", button_style="primary", icon="play",
                                   tooltip="one timed burst of the settings above")
        self.ladder_button = w.Button(description="Run ladder", icon="forward",
                                      tooltip="baseline → +loader → +precision → +compile → +rest, cumulative")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True,
                                    tooltip="stop the running burst (within a second) and the rest of a ladder")
        self.reset_button = w.Button(description="Reset to baseline",
                                     tooltip="set every knob back to the plain training loop")
        self.profile_button = w.Button(description="Profile", icon="search",
                                       tooltip="one burst of the settings above, then torch.profiler on a few "
                                               "more steps: the top operators and a trace for Perfetto")
        self.tune_button = w.Button(description="Tune", icon="magic",
                                    tooltip="search the knobs from the settings above for the fastest config "
                                            "that trains like the baseline, within the budget")
        self.budget = w.BoundedFloatText(value=60, min=5, max=86_400, step=10, layout=w.Layout(width="75px"),
                                         tooltip="the tuner starts no burst that would end past this many seconds")
        self.load_button = w.Button(description="Load earlier runs", icon="history",
                                    tooltip="add this workload's runs recorded in the history file (⟲ in the "
                                            "table) that are not shown yet")
        for button in (self.run_button, self.ladder_button, self.stop_button, self.reset_button,
                       self.profile_button, self.tune_button):
            button.layout = w.Layout(width="148px")
        self.load_button.layout = w.Layout(width="300px")
        self.run_button.on_click(lambda _: self.run_burst())
        self.ladder_button.on_click(lambda _: self.run_ladder())
        self.stop_button.on_click(lambda _: self.stop())
        self.reset_button.on_click(lambda _: self.reset())
        self.profile_button.on_click(lambda _: self.profile())
        self.tune_button.on_click(lambda _: self.tune())
        self.load_button.on_click(lambda _: self.load_history())
        self.validation = w.HTML()
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="100%"))
        self.status = w.HTML()
        self._status("Ready." if self.history is not None else "Ready (no run history).")

    def _assemble(self) -> w.VBox:
        device = self.device
        where = (f"{len(device.gpus)} × {device.name}" if device.has_cuda
                 else f"{device.cpu_name}, {device.cpu_count} cores, no GPU")
        header = w.HTML(f'<div style="font-size: 1.15em; padding-bottom: 4px; border-bottom: 1px solid #e0e0e0;">'
                        f"<b>accel_widgets tuning panel</b> · workload "
                        f"<code>{html.escape(self.workload.name)}</code> · {html.escape(where)}</div>",
                        layout=w.Layout(margin="0 0 4px 0"))
        length = w.HBox([w.HTML("Burst length", layout=w.Layout(width="95px")), self.length_value, self.length_unit])
        budget = w.HBox([w.HTML("Tune budget", layout=w.Layout(width="95px")), self.budget,
                         w.HTML("seconds", layout=w.Layout(margin="0 0 0 6px"))])
        actions = w.VBox(
            [length, w.HBox([self.run_button, self.ladder_button]), w.HBox([self.stop_button, self.reset_button]),
             budget, w.HBox([self.profile_button, self.tune_button]), self.load_button,
             self.progress, self.status, self.validation],
            layout=w.Layout(width=ACTIONS_WIDTH, min_width=ACTIONS_WIDTH, padding="0 0 0 10px",
                            border_left="1px solid #e0e0e0"),
        )
        controls = w.VBox([self.controls.widget], layout=w.Layout(flex="1 1 auto"))
        top = w.HBox([controls, actions], layout=w.Layout(width="100%", align_items="flex-start"))
        runs_title = w.HTML("<b>Runs</b> <small>(tick to show in the plots; hover a header for its meaning)</small>",
                            layout=w.Layout(margin="8px 0 0 0"))
        root = w.VBox([header, top, self.plots.figure, runs_title, self.table.widget, self.table.empty,
                       self.diagnosis, self.profile_view], layout=w.Layout(width="100%", max_width="1400px"))
        # Stable CSS hooks for browser tests and user styling; ipywidgets' own classes are generic.
        for widget, name in ((root, "panel"), (self.run_button, "run-burst"), (self.ladder_button, "run-ladder"),
                             (self.stop_button, "stop"), (self.status, "status"), (self.table.widget, "runs"),
                             (self.plots.figure, "plots"), (self.profile_button, "profile"),
                             (self.tune_button, "tune"), (self.load_button, "load-history"),
                             (self.profile_view, "profile-view")):
            widget.add_class(f"aw-{name}")
        return root

    # -- validation -------------------------------------------------------------------------------
    def _on_control_change(self, _name: str) -> None:
        self._revalidate()

    def _revalidate(self) -> None:
        """Show what this machine says about the current settings; an error disables Run burst."""
        _, self._validation = state.validate(self.controls.config, self.device)
        parts = []
        if self._validation.error:
            parts.append(f'<div style="color: #c62828;">✗ {html.escape(self._validation.error)}</div>')
        parts += [f'<div style="color: #b35900;">⚠ {html.escape(text)}</div>' for text in self._validation.warnings]
        self.validation.value = f'<div style="font-size: 0.9em; line-height: 1.3;">{"".join(parts)}</div>'
        self._sync_buttons()

    def _sync_buttons(self) -> None:
        with self._lock:
            running = self.running
            for button in (self.run_button, self.profile_button, self.tune_button):
                button.disabled = running or not self._validation.ok
            self.ladder_button.disabled = running
            self.load_button.disabled = running or self.history is None
            self.stop_button.disabled = not running

    def _runnable_config(self) -> Config:
        config, validation = state.validate(self.controls.config, self.device)
        if config is None or not validation.ok:
            raise ValueError(f"the current settings cannot run here: {validation.error}")
        return config

    def _length(self) -> dict[str, Any]:
        return state.length_kwargs(self.length_unit.value, self.length_value.value)

    # -- actions ----------------------------------------------------------------------------------
    def _start(self, what: str, body: Callable[[], str]) -> None:
        """Run ``body`` on the action thread; its return value is the final status line."""
        with self._lock:
            if self.running:
                raise RuntimeError("an action is already running: Stop it or wait() for it first")
            self._stop = threading.Event()
            self._stop_requested_at = None
            self.progress.value = 0.0
            self._thread = threading.Thread(target=self._run_action, args=(what, body),
                                            name="accel-widgets-panel", daemon=True)
            self._thread.start()
            self._sync_buttons()

    def _run_action(self, what: str, body: Callable[[], str]) -> None:
        """The action thread: run the action, keep the panel usable whatever happens."""
        try:
            self._status(body())
        except Exception as exc:  # a bug of the panel itself: say so in the panel, then let the thread report it
            self._status(f"Panel error in {what}: {html.escape(f'{type(exc).__name__}: {exc}')}")
            raise
        finally:
            with self._lock:
                self._thread = None
                self._sync_buttons()

    def _run_plan(self, what: str, plan: list[state.PlanItem], length: dict[str, Any]) -> str:
        """Run each planned burst in turn (Run burst, Run ladder)."""
        for index, item in enumerate(plan):
            if self._stop.is_set():
                break
            position = f" {index + 1}/{len(plan)}" if len(plan) > 1 else ""
            self._burst(f"{what}{position}", item, length,
                        lambda fraction, index=index: (index + fraction) / len(plan))
        return self._final_status(what, len(plan))

    def _run_profile(self, config: Config, length: dict[str, Any]) -> str:
        self.profile_view.layout.display = "none"
        result = self._burst("Profile", state.PlanItem("", config), length, lambda fraction: fraction,
                             profile_steps=self.profile_steps, profile_dir=self.profile_dir)
        why = f"the burst ended {result.status}"
        if result.error is not None and result.error.message.strip():
            why += f" ({result.error.message.strip().splitlines()[0]})"
        self.profile_view.value = profile_html(result.profile, why)
        self.profile_view.layout.display = None
        if result.profile is None:
            return self._final_status("Profile", 1)
        return (f"Profile finished: top operators below; trace <code>{html.escape(result.profile.trace_path)}"
                f'</code> (open in <a href="{PERFETTO_URL}" target="_blank" rel="noopener">{PERFETTO_URL}</a>).')

    def _run_tune(self, base: Config, budget_s: float, steps: int) -> str:
        """The tuner's search, each of its bursts run through :meth:`_burst` so they plot and record live."""
        started = time.monotonic()
        bursts = 0

        def progress(_fraction: float) -> float:
            return min(1.0, (time.monotonic() - started) / budget_s)

        def engine(workload: Workload, config: Config, *, steps: int | None = None, seconds: float | None = None,
                   label: str = "", **_ignored: Any) -> BurstResult:
            # The panel's own stop event and live events, whatever the tuner passes: Stop must reach the burst.
            nonlocal bursts
            bursts += 1
            length = {"steps": steps, "seconds": seconds}
            return self._burst(f"Tune · burst {bursts}", state.PlanItem(label, config), length, progress)

        def on_step(step: TuneStepLike) -> None:
            verdict = "kept" if step.accepted else "rejected"
            self._status(f"Tune: {html.escape(f'{step.knob}={step.value!r}')} {verdict} "
                         f"({html.escape(step.reason)})", busy=not self._stop.is_set())

        try:
            outcome = self._tuner(self.workload, budget_s=budget_s, base=base, steps=steps, device=self.device,
                                  engine=engine, stop=self._stop, on_step=on_step)
        except Exception as exc:  # a base the tuner refuses, or a tuner bug: the panel must survive it
            return f"Tune failed: {html.escape(f'{type(exc).__name__}: {exc}')}"
        self.tune_result = outcome
        self.progress.value = 1.0
        self.set_config(outcome.best)
        rates = ""
        if outcome.best_samples_per_s is not None and outcome.baseline_samples_per_s is not None:
            rates = f"; {outcome.baseline_samples_per_s:,.1f} → {outcome.best_samples_per_s:,.1f} samples/s"
        stopped = "stopped" if self._stop.is_set() else "finished"
        return (f"Tune {stopped}: best <code>{html.escape(outcome.best.label())}</code>, "
                f"{tune_speedup(outcome):.2f}× over the start{rates} ({len(outcome.bursts)} bursts in "
                f"{outcome.wall_s:.0f} s; {html.escape(outcome.stopped_reason)}). The controls now show it.")

    def _run_load(self) -> str:
        """Add the stored runs of this workload's fingerprint, oldest first, skipping those already shown."""
        self._status("Load: reading the run history", busy=True)
        fingerprint = self._workload_fingerprint()
        history = self.history
        if fingerprint is None or history is None:
            return "Load: no run history."
        try:
            stored = history.runs(fingerprint=fingerprint)
        except HistoryError as exc:
            self._history_failed(exc)
            return "Load failed."
        fresh = [run for run in reversed(stored) if run.id not in self._shown_ids]
        for done, stored_run in enumerate(fresh):
            run, result = len(self.runs), stored_run.result
            name = state.run_name(run, LOADED_MARK + stored_run.label)
            self.plots.start_run(run, name, max(1, result.world_size))
            self.plots.extend(run, state.Batch(steps=list(result.steps), samples=list(result.telemetry)))
            self.runs.append(result)
            self.loaded[run] = f"loaded from {history.path}, recorded {stored_run.created_at}"
            self._shown_ids.add(stored_run.id)
            self.progress.value = (done + 1) / len(fresh)
        if fresh:
            self.table.update(self.runs, self.loaded)
            self.plots.sync_state()
        skipped = len(stored) - len(fresh)
        already = f" ({skipped} already shown)" if skipped else ""
        return f"Loaded {len(fresh)} earlier run{'s' if len(fresh) != 1 else ''} of this workload{already}."

    def _burst(self, what: str, item: state.PlanItem, length: dict[str, Any], progress: Callable[[float], float],
               **extra: Any) -> BurstResult:
        """One burst through the engine, plotted live, then added to the table and recorded in the history."""
        run = len(self.runs)
        label = item.label or item.config.label()
        name = state.run_name(run, label)
        prefix = f"{what} · {html.escape(name)}"
        self.plots.start_run(run, name, item.config.ranks)
        batcher = state.EventBatcher()
        tracker = state.ProgressTracker(length["steps"], length["seconds"])

        def flush() -> None:
            batch = batcher.take()
            tracker.observe(batch.steps)
            if batch:
                self.plots.extend(run, batch)
                self.update_times.append(time.monotonic())
            self.progress.value = progress(tracker.fraction)
            if not self._stop.is_set():
                self._status(f"{prefix}: {tracker.describe()}", busy=True)

        def on_event(event: state.Event) -> None:
            if batcher.add(event):
                flush()

        self._status(f"{prefix}: starting", busy=True)
        try:
            result = self._engine(self.workload, item.config, **length, on_event=on_event, stop=self._stop,
                                  label=item.label, **extra)
        except BurstError as exc:
            result = exc.result
        except Exception as exc:  # a bad config or workload must not take the panel down
            result = state.failed_result(self.workload, item, exc)
        flush()
        self.runs.append(result)
        self.table.update(self.runs, self.loaded)
        baseline = find_baseline(result, self.runs[:-1])  # the fp32 run it should train like, if there is one
        self.diagnosis.value = self._diagnosis_html(run, label, diagnose(result, baseline))
        self.plots.sync_state()
        self._record(result)
        return result

    def _final_status(self, what: str, planned: int) -> str:
        if self._stop.is_set():
            took = ""
            if self._stop_requested_at is not None:
                took = f" (stop took {time.monotonic() - self._stop_requested_at:.2f} s)"
            return f"{what} stopped{took}."
        last = self.runs[-1] if self.runs else None
        if last is not None and last.error is not None and not last.ok:
            first_line = last.error.message.strip().splitlines()[0] if last.error.message.strip() else ""
            return f"{what} finished; the last run {last.status}: {html.escape(first_line)}"
        return f"{what} finished: {planned} run{'s' if planned > 1 else ''} added to the table."

    # -- history ----------------------------------------------------------------------------------
    def _open_history(self, history: HistoryArg) -> RunHistory | None:
        if history is False:
            return None
        if isinstance(history, RunHistory):
            return history
        try:
            return RunHistory(None if history is None else Path(history))
        except HistoryError as exc:
            self._history_problem = str(exc)
            return None

    def _history_failed(self, exc: Exception) -> None:
        """Carry on without the history, and keep saying why in the status line."""
        self._history_problem = str(exc)
        self.history = None
        self._sync_buttons()

    def _workload_fingerprint(self) -> str | None:
        """Computed once, on the action thread (it builds the model); None when the history is off."""
        if self.history is not None and self._fingerprint is None:
            try:
                self._fingerprint = workload_fingerprint(self.workload)
            except Exception as exc:  # a model that fails to build must not cost the run its table row
                self._history_failed(HistoryError(f"cannot fingerprint the workload for the run history: "
                                                  f"{type(exc).__name__}: {exc}"))
        return self._fingerprint if self.history is not None else None

    def _record(self, result: BurstResult) -> None:
        fingerprint = self._workload_fingerprint()
        history = self.history
        if fingerprint is None or history is None:
            return
        try:
            self._shown_ids.add(history.record(result, fingerprint=fingerprint))
        except HistoryError as exc:
            self._history_failed(exc)

    def _status(self, text: str, busy: bool = False) -> None:
        """The status line; its text is HTML-escaped by the callers that include user text. A history
        problem stays under it, so a lost history is never silent."""
        spinner = '<i class="fa fa-spinner fa-spin"></i> ' if busy else ""
        problem = ""
        if self._history_problem:
            problem = (f'<div style="color: #b35900; font-size: 0.85em; line-height: 1.2;">⚠ Run history off: '
                       f"{html.escape(self._history_problem)}</div>")
        self.status.value = f'<div style="font-size: 0.95em;">{spinner}{text}</div>{problem}'

    @staticmethod
    def _diagnosis_html(run: int, label: str, findings: list[Finding]) -> str:
        items = []
        for finding in findings:
            icon, colour = _FINDING_ICONS[finding.severity]
            knob = f" → try <code>{html.escape(finding.knob)}</code>" if finding.knob else ""
            items.append(f'<li style="margin-bottom: 4px;"><span style="color: {colour};">{icon}</span> '
                         f"<b>{html.escape(finding.title)}</b>: {html.escape(finding.detail)}{knob}</li>")
        body = "".join(items) or "<li>Nothing stands out.</li>"
        return (f'<div style="font-size: 0.9em; line-height: 1.3;"><b>Reading of '
                f"{html.escape(state.run_name(run, label))}</b>"
                f'<ul style="padding-left: 18px; margin: 4px 0;">{body}</ul></div>')
