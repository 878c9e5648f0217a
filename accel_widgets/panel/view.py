"""``TuningPanel``: the notebook face of accel_widgets, one panel to flip knobs, run bursts and compare.

A thin view over the public API: the controls come from the knob registry, validation from
``check_config``, the runs from the injectable ``engine`` (``run_burst``), the numbers from
``report.comparison_rows`` and the reading from :func:`.diagnosis.diagnose`.

Threading: every action runs on one background thread, so the kernel stays free to answer the
browser (and the Stop button) while a burst trains in worker processes. The engine calls
``on_event`` on that thread; events are batched and pushed to the figure at ~4 Hz from there.
Only one action runs at a time: the Run buttons are disabled while it does.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ..config import Config
from ..device import DeviceInfo, probe_device
from ..diagnosis import Finding, diagnose
from ..engine.launcher import BurstError, run_burst, warm_up
from ..guard import find_baseline
from ..results import BurstResult
from ..workload import Workload
from . import state
from .controls import KnobControls
from .plots import LivePlots
from .table import RunsTable

Engine = Callable[..., BurstResult]

ACTIONS_WIDTH = "310px"
_FINDING_ICONS = {"warn": ("⚠", "#b35900"), "info": ("ℹ", "#1565c0"), "good": ("✔", "#2e7d32")}


class TuningPanel:
    """Explore every knob of the registry against ``workload`` and compare what each one did.

    ``engine`` has ``run_burst``'s signature (tests inject a fake); ``device`` defaults to this
    machine; ``steps`` is the initial burst length. ``runs`` lists every BurstResult so far, ``config``
    is what the controls say now, and ``wait()`` blocks until the running action ends.
    """

    def __init__(self, workload: Workload, *, engine: Engine = run_burst, device: DeviceInfo | None = None,
                 steps: int = 20) -> None:
        self.workload = workload
        self.device = device or probe_device()
        self.runs: list[BurstResult] = []
        self.update_times: list[float] = []  # monotonic time of each push to the figure (rate checks)
        self._engine = engine
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
        config, validation = state.validate(self.controls.config, self.device)
        if config is None or not validation.ok:
            raise ValueError(f"the current settings cannot run here: {validation.error}")
        self._start("Burst", [state.PlanItem("", config)])

    def run_ladder(self) -> None:
        """Start the classic ladder (baseline, +loader, +precision, +compile, +rest), one burst per rung."""
        self._start("Ladder", state.ladder_plan(self.workload, self.device))

    def stop(self) -> None:
        """Ask the running burst to stop (the engine ends it within a second) and skip the rest of a ladder."""
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
        for button in (self.run_button, self.ladder_button, self.stop_button, self.reset_button):
            button.layout = w.Layout(width="148px")
        self.run_button.on_click(lambda _: self.run_burst())
        self.ladder_button.on_click(lambda _: self.run_ladder())
        self.stop_button.on_click(lambda _: self.stop())
        self.reset_button.on_click(lambda _: self.reset())
        self.validation = w.HTML()
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="100%"))
        self.status = w.HTML()
        self._status("Ready.")

    def _assemble(self) -> w.VBox:
        device = self.device
        where = (f"{len(device.gpus)} × {device.name}" if device.has_cuda
                 else f"{device.cpu_name}, {device.cpu_count} cores, no GPU")
        header = w.HTML(f'<div style="font-size: 1.15em; padding-bottom: 4px; border-bottom: 1px solid #e0e0e0;">'
                        f"<b>accel_widgets tuning panel</b> · workload "
                        f"<code>{html.escape(self.workload.name)}</code> · {html.escape(where)}</div>",
                        layout=w.Layout(margin="0 0 4px 0"))
        length = w.HBox([w.HTML("Burst length", layout=w.Layout(width="95px")), self.length_value, self.length_unit])
        actions = w.VBox(
            [length, w.HBox([self.run_button, self.ladder_button]), w.HBox([self.stop_button, self.reset_button]),
             self.progress, self.status, self.validation],
            layout=w.Layout(width=ACTIONS_WIDTH, min_width=ACTIONS_WIDTH, padding="0 0 0 10px",
                            border_left="1px solid #e0e0e0"),
        )
        controls = w.VBox([self.controls.widget], layout=w.Layout(flex="1 1 auto"))
        top = w.HBox([controls, actions], layout=w.Layout(width="100%", align_items="flex-start"))
        runs_title = w.HTML("<b>Runs</b> <small>(tick to show in the plots; hover a header for its meaning)</small>",
                            layout=w.Layout(margin="8px 0 0 0"))
        root = w.VBox([header, top, self.plots.figure, runs_title, self.table.widget, self.table.empty,
                       self.diagnosis], layout=w.Layout(width="100%", max_width="1400px"))
        # Stable CSS hooks for browser tests and user styling; ipywidgets' own classes are generic.
        for widget, name in ((root, "panel"), (self.run_button, "run-burst"), (self.ladder_button, "run-ladder"),
                             (self.stop_button, "stop"), (self.status, "status"), (self.table.widget, "runs"),
                             (self.plots.figure, "plots")):
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
            self.run_button.disabled = running or not self._validation.ok
            self.ladder_button.disabled = running
            self.stop_button.disabled = not running

    # -- actions ----------------------------------------------------------------------------------
    def _start(self, what: str, plan: list[state.PlanItem]) -> None:
        length = state.length_kwargs(self.length_unit.value, self.length_value.value)
        with self._lock:
            if self.running:
                raise RuntimeError("an action is already running: Stop it or wait() for it first")
            self._stop = threading.Event()
            self._stop_requested_at = None
            self._thread = threading.Thread(target=self._run_plan, args=(what, plan, length),
                                            name="accel-widgets-panel", daemon=True)
            self._thread.start()
            self._sync_buttons()

    def _run_plan(self, what: str, plan: list[state.PlanItem], length: dict[str, Any]) -> None:
        """The action thread: run each planned burst in turn, keep the panel usable whatever happens."""
        try:
            for index, item in enumerate(plan):
                if self._stop.is_set():
                    break
                self._run_one(what, index, plan, item, length)
            self._status(self._final_status(what, len(plan)))
        except Exception as exc:  # a bug of the panel itself: say so in the panel, then let the thread report it
            self._status(f"Panel error: {html.escape(f'{type(exc).__name__}: {exc}')}")
            raise
        finally:
            with self._lock:
                self._thread = None
                self._sync_buttons()

    def _run_one(self, what: str, index: int, plan: list[state.PlanItem], item: state.PlanItem,
                 length: dict[str, Any]) -> None:
        run = len(self.runs)
        label = item.label or item.config.label()
        name = state.run_name(run, label)
        position = f" {index + 1}/{len(plan)}" if len(plan) > 1 else ""
        prefix = f"{what}{position} · {html.escape(name)}"
        self.plots.start_run(run, name, item.config.ranks)
        batcher = state.EventBatcher()
        tracker = state.ProgressTracker(length["steps"], length["seconds"])

        def flush() -> None:
            batch = batcher.take()
            tracker.observe(batch.steps)
            if batch:
                self.plots.extend(run, batch)
                self.update_times.append(time.monotonic())
            self.progress.value = (index + tracker.fraction) / len(plan)
            if not self._stop.is_set():
                self._status(f"{prefix}: {tracker.describe()}", busy=True)

        def on_event(event: state.Event) -> None:
            if batcher.add(event):
                flush()

        self._status(f"{prefix}: starting", busy=True)
        try:
            result = self._engine(self.workload, item.config, **length, on_event=on_event, stop=self._stop,
                                  label=item.label)
        except BurstError as exc:
            result = exc.result
        except Exception as exc:  # a bad config or workload must not take the panel down
            result = state.failed_result(self.workload, item, exc)
        flush()
        self.runs.append(result)
        self.table.update(self.runs)
        baseline = find_baseline(result, self.runs[:-1])  # the fp32 run it should train like, if there is one
        self.diagnosis.value = self._diagnosis_html(run, label, diagnose(result, baseline))
        self.plots.sync_state()

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

    def _status(self, text: str, busy: bool = False) -> None:
        """The status line; its text is HTML-escaped by the callers that include user text."""
        spinner = '<i class="fa fa-spinner fa-spin"></i> ' if busy else ""
        self.status.value = f'<div style="font-size: 0.95em;">{spinner}{text}</div>'

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
