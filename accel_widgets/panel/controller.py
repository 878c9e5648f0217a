"""The panel's actions (Run burst, Run ladder, Profile, Tune, Load earlier runs, Stop): thin handlers that run
off the kernel's main thread and change only the :class:`~.state.PanelState`.

Threading: every action runs on one background thread, so the kernel stays free to answer the browser (and
the Stop button) while a burst trains in worker processes. The engine calls ``on_event`` on that thread;
events are batched and handed to the state at ~4 Hz, so the figure is redrawn a few times a second rather
than once per event. Only one action runs at a time. The run history is only touched from the action thread
too (the workload fingerprint builds the model, which can take a while).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypedDict

from ..analysis.compare import where_ran
from ..analysis.estimate import Estimate, estimate
from ..analysis.guard import cached_noise
from ..engine.launcher import Engine, Event, added_options
from ..engine.outcome import BurstError
from ..engine.request import BurstOptions
from ..inputs.device import DeviceInfo
from ..inputs.workload import Workload
from ..knobs import data
from ..knobs.config import Config
from ..knobs.rules import ConfigError
from ..results.batchsize import BatchSizeSearch, BatchTry
from ..results.burst import BurstResult, ErrorInfo, StepRecord, TelemetrySample
from ..results.comparison import Comparison
from ..results.headspace import Headspace
from ..results.history import HistoryError, RunHistory, workload_fingerprint
from ..results.noise import NoiseBand
from ..results.tune import TuneResult, TuneStep
from ..search.batchsize import find_batch_size
from ..search.bursts import Bursts, Contender, Failed
from ..search.compare import DEFAULT_BUDGET_S, WINDOW_S, Progress, measure_pairs
from ..search.headspace import headspace
from ..search.ladder import LADDER_WINDOW_S, classic_ladder, ladder_pairs
from ..search.remeasure import remeasure
from ..views.comparison import interval_text, outcome_text, verdict_text
from ..views.estimate import fit_text, measured_text
from ..views.headspace import headspace_lines
from ..views.progress import BurstProgress
from .state import PanelState, ProfileShown, Ticker

Tuner = Callable[..., TuneResult]
HistoryArg = RunHistory | str | os.PathLike[str] | Literal[False] | None

#: A running burst's events reach the state, and so the page, this often (and at every phase change): the
#: timeline's new points, the status line and the progress bar together, so the page draws one frame for all of
#: them. Measured in Chromium on a 2-core machine, every frame the page draws while a burst measures costs it
#: ~15 ms of CPU whatever changed (benchmarks/panel_observer.py): once a second reads as live and keeps the
#: view's cost to a few % of a core.
FLUSH_INTERVAL_S = 1.0
#: Phases in which the burst steps (warm-up, then the measured window): its progress is drawn on the timeline only.
STEPPING = ("warming up", "measuring")


def holds_still(config: Config, device: DeviceInfo) -> bool:
    """Whether the page holds still while a burst of ``config`` measures: when the burst keeps every core busy.

    A CPU burst does by construction (each rank runs cores / ranks intra-op threads); on a GPU the ranks' host
    threads and their loader workers may. On a machine whose every core the burst uses, each frame the browser
    draws is taken from the burst, and its threads wait for each other at every op: measured on 2 cores
    (benchmarks/panel_observer.py), one frame a second cost the burst 3-10%. So its points wait and are drawn
    when the measured window ends; warm-up and compile, which are not measured, stay live.
    """
    if device.kind == "cpu":
        return True
    return config.ranks * (1 + data.loader_workers(config)) >= device.cpu_count
#: Live mode waits this long after the last edit: a user typing "64" or clicking through a drop-down
#: starts one burst, not one per keystroke.
LIVE_DELAY_S = 0.5
#: How long the knobs stay still before the panel estimates whether the settings fit (a trace on fake tensors).
FIT_DELAY_S = 0.3


# -- plans -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanItem:
    """One burst an action will run: the label it is recorded under and its config."""

    label: str
    config: Config


def ladder_plan(workload: Workload, device: DeviceInfo, leave_out: Collection[str] = (),
                batch_search: BatchSizeSearch | None = None, ceilings: Headspace | None = None) -> list[PlanItem]:
    """The classic cumulative ladder (:func:`~accel_widgets.search.ladder.classic_ladder`) for this workload and
    device, but the rungs in ``leave_out``, as bursts to run in order, each recorded under its rung's name. The
    panel's last batch-size search says where memory is the limit (its +memory rung); its last ceilings, when they
    were measured for the ladder's baseline, which rungs have nothing to win."""
    ceilings = ceilings if ceilings is not None and ceilings.config == Config() else None
    rungs = classic_ladder(workload, device, leave_out=leave_out, batch_search=batch_search, headspace=ceilings)
    return [PlanItem(rung.name, rung.config) for rung in rungs]


class Length(TypedDict):
    """A burst's length as the engine's keywords (``**length``): measured steps, or seconds of measuring; one of
    them is None."""

    steps: int | None
    seconds: float | None


def length_kwargs(unit: str, value: float) -> Length:
    """Burst length as the engine's keywords: a number of measured steps, or seconds of measuring."""
    if unit == "steps":
        return Length(steps=max(1, round(value)), seconds=None)
    if unit == "seconds":
        return Length(steps=None, seconds=max(0.1, float(value)))
    raise ValueError(f"burst length unit must be 'steps' or 'seconds', got {unit!r}")


def failed_result(workload: Workload, item: PlanItem, exc: BaseException) -> BurstResult:
    """A result for a burst that raised without one (bad config, unpicklable workload), so it gets a row."""
    kind = "config" if isinstance(exc, ConfigError) else "exception"
    return BurstResult(workload=workload.name, config=item.config, status="failed", label=item.label,
                       error=ErrorInfo(kind, f"{type(exc).__name__}: {exc}"))


# -- live events -----------------------------------------------------------------------------------
@dataclass
class Batch:
    """Events received since the previous flush."""

    steps: list[StepRecord] = field(default_factory=list)
    samples: list[TelemetrySample] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.steps or self.samples)


class EventBatcher:
    """Collects a burst's live events and says when the next flush to the state is due.

    The engine calls ``on_event`` for every step and every telemetry sample; drawing each would send a
    comm message per event. Flushing every ``FLUSH_INTERVAL_S`` keeps the plots live with one frame's worth of
    messages a second. Thread-safe, though the engine calls it from one thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = Batch()
        self._last_flush = time.monotonic()

    def add(self, event: Event) -> bool:
        """Queue ``event``; True when a flush is due (the caller then calls :meth:`take`)."""
        with self._lock:
            if isinstance(event, StepRecord):
                self._pending.steps.append(event)
            elif isinstance(event, TelemetrySample):
                self._pending.samples.append(event)
            return time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S

    def take(self) -> Batch:
        """Everything queued since the last take, and restart the flush interval."""
        with self._lock:
            batch, self._pending = self._pending, Batch()
            self._last_flush = time.monotonic()
            return batch


# -- the controller --------------------------------------------------------------------------------
def open_history(history: HistoryArg) -> tuple[RunHistory | None, str]:
    """The run history to record to, or ``None`` and why it cannot be used ("" when it was turned off)."""
    if history is False:
        return None, ""
    if isinstance(history, RunHistory):
        return history, ""
    try:
        return RunHistory(None if history is None else Path(history)), ""
    except HistoryError as exc:
        return None, str(exc)


class PanelController:
    """Starts the panel's actions on the action thread and turns what happens into state changes.

    ``engine`` is an :class:`~accel_widgets.engine.launcher.Engine`: ``run_burst``, or for example
    ``BurstEngine(BurstOptions(isolation="inprocess"))`` for a workload that cannot be pickled;
    ``tuner`` like :func:`~accel_widgets.search.tuner.tune`. Every finished burst is recorded in ``history``.
    """

    def __init__(self, workload: Workload, state: PanelState, *, engine: Engine, tuner: Tuner, history: HistoryArg,
                 profile_steps: int, profile_dir: str) -> None:
        self.workload = workload
        self.state = state
        self.profile_steps = profile_steps
        self.profile_dir = profile_dir
        self._engine = engine
        self._on_cluster = False
        self._tuner = tuner
        self.history, problem = open_history(history)
        self._history_off_why = problem or "the panel was opened with history=False"
        self._fingerprint: str | None = None
        self._noise_fingerprint: str | None = None
        self._shown_ids: set[int] = set()  # history ids already in the table (recorded here or loaded)
        self._thread: threading.Thread | None = None
        self.last_run: BurstResult | None = None  # the last run the latest action finished
        self._stop = threading.Event()
        self._stop_requested_at: float | None = None
        self._live_timer: threading.Timer | None = None
        self._live_length: Callable[[], Length] = lambda: Length(steps=20, seconds=None)
        self._live_restart = threading.Lock()  # one restart at a time: stop, wait, start
        self._fit_timers: list[threading.Timer] = []  # the newest last; a cancelled one may not have ended
        self._fit_asked = 0  # the newest estimate asked for: an older one that ends later is not shown
        self._fitted: tuple[Config, Estimate] | None = None  # the last settings traced, and their estimate
        self._peaks: dict[Config, tuple[int, str]] = {}  # settings -> the last finished burst's peak and its kind
        state.noise_of = self._known_noise
        state.subscribe(self._edited)
        state.set_history(self.history is not None, problem)
        state.set_status("Ready." if self.history is not None else "Ready (no run history).")
        self._schedule_fit()

    # -- actions ----------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.state.action is not None

    def run_burst(self, length: Length, budget_s: float | None = DEFAULT_BUDGET_S) -> None:
        """A burst of the settings, then, when the table has a baseline for it, the comparison engine measures the
        two again, interleaved, for up to ``budget_s``: the row's speed-up tightens into an interval and a verdict
        (None: the burst alone)."""
        plan = [PlanItem("", self.state.runnable_config())]
        self._start("Burst", lambda: self._run_compared("Burst", plan, length, budget_s))

    def run_ladder(self, length: Length, leave_out: Collection[str] = (),
                   budget_s: float | None = DEFAULT_BUDGET_S) -> None:
        """The classic ladder, one burst per rung, then every rung compared with the one before and the baseline,
        interleaved, for up to ``budget_s``."""
        plan = ladder_plan(self.workload, self.state.device, leave_out, self.state.batch_search,
                           self.state.headspace)
        self._start("Ladder", lambda: self._run_compared("Ladder", plan, length, budget_s))

    def profile(self, length: Length) -> None:
        config = self.state.runnable_config()
        self._start("Profile", lambda: self._run_profile(config, length))

    def tune(self, budget_s: float, steps: int) -> None:
        base = self.state.runnable_config()
        self._start("Tune", lambda: self._run_tune(base, budget_s, steps))

    def find_batch_size(self, steps: int) -> None:
        config = self.state.runnable_config()
        self._start("Batch size", lambda: self._run_batch_search(config, steps))

    def headspace(self, budget_s: float = DEFAULT_BUDGET_S) -> None:
        """The ceilings of the settings: each part of their step made free, against them as they are, interleaved,
        for up to ``budget_s``; the row of bars under the runs table shows them, the ladder and the tuner read them."""
        config = self.state.runnable_config()
        self._start("Ceilings", lambda: self._run_headspace(config, budget_s))

    def remeasure(self, budget_s: float = DEFAULT_BUDGET_S) -> None:
        """Compare the run the reading is about with its baseline again, for up to ``budget_s``."""
        run = self.state.remeasurable()
        if run is None:
            raise RuntimeError("nothing to re-measure: the reading's run has no baseline to compare it with")
        row = self.state.rows[run]
        self._start("Re-measure", lambda: self._run_remeasure(run, row.result, row.baseline, budget_s))

    def load_history(self) -> None:
        if self.history is None:
            raise RuntimeError(f"no run history: {self._history_off_why}")
        self._start("Load", self._run_load)

    def set_live(self, on: bool, length: Callable[[], Length]) -> None:
        """Live mode: while on, every edit of the knobs stops the burst in flight and, once the knobs have
        been still for LIVE_DELAY_S, starts a burst of the new settings (``length()`` long) that replaces
        the previous live run. Turning it on starts one; turning it off lets the running burst finish."""
        self._live_length = length
        self.state.set_live(on)
        if on:
            self._schedule_live()
        else:
            self._cancel_live()

    def pin(self) -> None:
        """Keep the live run in the table and the plots: the next live burst adds a run of its own."""
        run = self.state.live_run
        if run is not None:
            self.state.pin(run)

    def close(self) -> None:
        """Stop live mode, the running action and every fit estimate (the last one its end scheduled), and wait for
        each: nothing of the panel keeps running once this returns (an estimate already tracing is waited for)."""
        live = self._live_timer
        self.set_live(False, self._live_length)
        self.stop()
        self.wait()
        for timer in [*self._fit_timers, *([live] if live is not None else [])]:
            timer.cancel()
            timer.join()

    def stop(self) -> None:
        if self.running and not self._stop.is_set():
            self._stop_requested_at = time.monotonic()
            self._stop.set()
            self.state.set_status("Stopping…")

    def wait(self, timeout: float | None = None) -> bool:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.running

    # -- live mode --------------------------------------------------------------------------------
    def _edited(self, part: str) -> None:
        """State listener: an edit of the knobs asks whether the new settings fit, and in live mode (re)starts the
        countdown to a new burst."""
        if part == "draft":
            self._schedule_fit()
            if self.state.live:
                self._schedule_live()

    # -- will it fit ------------------------------------------------------------------------------
    def _schedule_fit(self, *, edited: bool = True) -> None:
        """Estimate the settings' peak once the knobs have been still for FIT_DELAY_S, off the kernel's thread (a
        step traced on fake tensors: a fraction of a second for a small model, seconds for a large one). Without an
        edit (an action ended) settings traced before keep their estimate: only the measured peak beside it is new,
        and a trace then would take the CPU of the burst the user starts next."""
        for earlier in self._fit_timers:
            earlier.cancel()
        if edited:
            self._fitted = None
        self._fit_asked += 1
        timer = threading.Timer(FIT_DELAY_S, self._estimate_fit, args=(self._fit_asked,))
        timer.name, timer.daemon = "accel-widgets-fit", True
        self._fit_timers = [*(each for each in self._fit_timers if each.is_alive()), timer]
        timer.start()

    def _estimate_fit(self, asked: int) -> None:
        """The fit line of the settings: shown before a burst runs, never traced while one measures (the trace would
        take the burst's CPU); settings that cannot run here have none (their error says why). Once a burst of the
        settings has finished, its measured peak is said beside the estimate: how far it was for this workload."""
        if self.running:
            self.state.set_fit("")
            return
        try:
            config = self.state.runnable_config()
        except ValueError:
            self.state.set_fit("")
            return
        try:
            fitted = self._fitted
            found = fitted[1] if fitted is not None and fitted[0] == config else estimate(
                self.workload, config, device=self.state.device)
            self._fitted = (config, found)
            text = fit_text(found)
            if config in self._peaks:  # a burst of these settings has run: how far the estimate was, here
                text += f"; {measured_text(found, *self._peaks[config])}"
        except Exception as exc:  # an op fake tensors cannot run, a dataset without a sample: say why, carry on
            first = str(exc).splitlines()[0] if str(exc) else ""
            text = f"no memory estimate: {type(exc).__name__}{': ' + first if first else ''}"
        if asked == self._fit_asked:
            self.state.set_fit(text)

    def _schedule_live(self) -> None:
        self._cancel_live()
        timer = threading.Timer(LIVE_DELAY_S, self._restart_live)
        timer.name, timer.daemon = "accel-widgets-live", True
        self._live_timer = timer
        timer.start()

    def _cancel_live(self) -> None:
        timer, self._live_timer = self._live_timer, None
        if timer is not None:
            timer.cancel()

    def _restart_live(self) -> None:
        """The knobs have been still: stop what runs, then start a live burst of the settings they show."""
        with self._live_restart:
            if not self.state.live:
                return
            self.stop()
            self.wait()
            if not self.state.live:
                return
            try:
                plan = [PlanItem("live", self.state.runnable_config())]
            except ValueError as exc:
                self.state.set_status(f"Live: waiting for settings that can run ({exc}).")
                return
            length = self._live_length()
            try:
                self._start("Live", lambda: self._run_plan("Live", plan, length, live=True))
            except RuntimeError:  # the user started an action in the meantime: it wins
                return

    # -- the action thread ------------------------------------------------------------------------
    def _start(self, what: str, body: Callable[[], str]) -> None:
        """Run ``body`` on the action thread; its return value is the final status line."""
        with self.state.lock:
            self.state.begin_action(what)  # raises while another action runs
            self.last_run = None
            self._stop = threading.Event()
            self._stop_requested_at = None
            self._thread = threading.Thread(target=self._run_action, args=(what, body),
                                            name="accel-widgets-panel", daemon=True)
            self._thread.start()

    def _run_action(self, what: str, body: Callable[[], str]) -> None:
        """Run the action and keep the panel usable whatever happens."""
        try:
            self.state.set_status(body())
        except Exception as exc:  # a bug of the panel itself: say so in the panel, then let the thread report it
            self.state.set_status(f"Panel error in {what}: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.state.end_action()
            self._schedule_fit(edited=False)  # the settings as the action left them (the tuner's best)

    def _run_plan(self, what: str, plan: list[PlanItem], length: Length, *, live: bool = False) -> str:
        """Run each planned burst in turn (Run burst, Run ladder, a live burst)."""
        for index, item in enumerate(plan):
            if self._stop.is_set():
                break
            position = f" {index + 1}/{len(plan)}" if len(plan) > 1 else ""
            self._burst(f"{what}{position}", item, length,
                        lambda fraction, index=index: (index + fraction) / len(plan), live=live)
        return self._final_status(what, len(plan))

    def _run_compared(self, what: str, plan: list[PlanItem], length: Length, budget_s: float | None) -> str:
        """Each planned burst in turn, its ranks held (Run burst, Run ladder); then the comparison engine measures
        them again, interleaved, until each run's verdict against its baseline (and a ladder's rung against the rung
        before it) is settled or ``budget_s`` is spent. The table shows each first burst at once and its interval
        as the blocks arrive; Stop ends the comparison and keeps what it measured. Without a budget, each burst
        alone, as it always was."""
        if budget_s is None:
            return self._run_plan(what, plan, length)
        contenders: list[tuple[int, Contender]] = []
        try:
            for index, item in enumerate(plan):
                if self._stop.is_set():
                    break
                position = f" {index + 1}/{len(plan)}" if len(plan) > 1 else ""
                run, contender = self._held_burst(f"{what}{position}", item, length,
                                                  lambda fraction, index=index: (index + fraction) / len(plan))
                contenders.append((run, contender))
            not_compared = self._compare(contenders, budget_s, ladder=len(plan) > 1) if not self._stop.is_set() else ""
        finally:
            for _, contender in contenders:
                contender.close()
        return self._final_status(what, len(plan)) + (f" Not compared: {not_compared}." if not_compared else "")

    def _compare(self, contenders: list[tuple[int, Contender]], budget_s: float, *, ladder: bool) -> str:
        """The comparison of the runs just measured. One run: with its baseline's config (a held burst of it, opened
        here), where both ran where the panel runs now. A ladder: its rungs with each other, each against the one
        before and the first; a rung's row shows its comparison with the first rung where that is its baseline's
        config. Returns why a run was not compared ("" when it was, or had nothing to be compared with)."""
        ok = [(run, contender) for run, contender in contenders if contender.first.ok]
        if ladder:
            if len(ok) < 2 or ok[0][0] != contenders[0][0]:
                return ""  # a ladder whose first rung failed has nothing to read its rungs against
            order = [run for run, _ in ok]
            configs = [contender.config for _, contender in ok]
            opened = {index: contender for index, (_, contender) in enumerate(ok)}
            pairs = ladder_pairs(len(ok))
        else:
            if not ok:
                return ""
            run, contender = ok[0]
            baseline = self.state.rows[run].values["baseline"]
            if baseline is None or baseline == run:
                return ""
            if why := self._not_comparable(contender.first, self.state.rows[baseline].result):
                return why
            order, configs = [baseline, run], [self.state.rows[baseline].result.config, contender.config]
            opened, pairs = {1: contender}, [(0, 1)]
        measured = measure_pairs(self.workload, configs, pairs, budget_s=budget_s, engine=self._engine,
                                 stop=self._stop, labels=[self.state.runs[run].name for run in order], opened=opened,
                                 on_progress=self._comparing(order, pairs, budget_s),
                                 window_s=LADDER_WINDOW_S if ladder else WINDOW_S)
        self._show(measured.comparisons, pairs, order, comparing=False)
        return ""

    def _comparing(self, order: list[int], pairs: list[tuple[int, int]], budget_s: float) -> Callable[[Progress], None]:
        """What each block of a comparison shows: every run's interval against its baseline (live), and one status
        line with the time used of the budget."""
        def show(now: Progress) -> None:
            self._show(now.comparisons, pairs, order, comparing=True)
            counted = max((len(c.counted) for c in now.comparisons), default=0)
            self.state.set_progress(min(1.0, now.elapsed_s / budget_s))
            names = " and ".join(self.state.runs[run].name for run in order) if len(order) <= 2 else "the rungs"
            self.state.set_status(f"Comparing {names}: {counted} block{'s' if counted != 1 else ''}, "
                                  f"{now.elapsed_s:.0f} s of {budget_s:g} s (Stop keeps the intervals so far)",
                                  busy=not self._stop.is_set())
        return show

    def _show(self, comparisons: list[Comparison], pairs: list[tuple[int, int]], order: list[int], *,
              comparing: bool) -> None:
        """Each run's comparison with its baseline into its row: the pairs against the first config, where that
        config is the run's baseline's."""
        rows = self.state.rows
        for (reference, subject), comparison in zip(pairs, comparisons, strict=True):
            run = order[subject]
            baseline = rows[run].values["baseline"] if run < len(rows) else None
            if reference != 0 or baseline is None or not comparison.counted:
                continue
            if rows[baseline].result.config == comparison.reference:
                self.state.set_comparison(run, comparison, comparing=comparing and not comparison.settled)

    def _run_profile(self, config: Config, length: Length) -> str:
        self.state.show_profile(None)
        profile = BurstOptions(profile_steps=self.profile_steps, profile_dir=self.profile_dir)
        result = self._burst("Profile", PlanItem("", config), length, lambda fraction: fraction, options=profile)
        why = f"the burst ended {result.status}"
        if result.error is not None and result.error.message.strip():
            why += f" ({result.error.message.strip().splitlines()[0]})"
        self.state.show_profile(ProfileShown(result.profile, why))
        if result.profile is None:
            return self._final_status("Profile", 1)
        return f"Profile finished: top operators below; trace {result.profile.trace_path}."

    def _run_tune(self, base: Config, budget_s: float, steps: int) -> str:
        """The tuner's search: each config's first burst is a run of the table (plotted and recorded live, its ranks
        held for the comparisons that follow); the comparisons' windows are not runs, as a re-measure's are not."""
        started = time.monotonic()
        bursts = 0

        def progress(_fraction: float) -> float:
            return min(1.0, (time.monotonic() - started) / budget_s)

        def opener(workload: Workload, config: Config, label: str) -> Contender:
            nonlocal bursts
            bursts += 1
            return self._held_burst(f"Tune · burst {bursts}", PlanItem(label, config),
                                    {"steps": steps, "seconds": None}, progress)[1]

        def on_step(step: TuneStep) -> None:
            verdict = "kept" if step.accepted else "rejected"
            self.state.set_status(f"Tune: {step.knob}={step.value!r} {verdict} ({step.reason})",
                                  busy=not self._stop.is_set())

        try:
            ceilings = self.state.headspace if self.state.headspace is not None and \
                self.state.headspace.config == base else None  # the ceilings of the tuner's start, when measured
            outcome = self._tuner(self.workload, budget_s=budget_s, base=base, steps=steps, device=self.state.device,
                                  engine=self._engine, stop=self._stop, on_step=on_step, opener=opener,
                                  headspace=ceilings)
        except Exception as exc:  # a base the tuner refuses, or a tuner bug: the panel must survive it
            return f"Tune failed: {type(exc).__name__}: {exc}"
        self.state.set_tune_result(outcome)
        self.state.set_progress(1.0)
        self.state.set_config(outcome.best)
        rates = ""
        if outcome.best_samples_per_s is not None and outcome.baseline_samples_per_s is not None:
            rates = f"; {outcome.baseline_samples_per_s:,.1f} → {outcome.best_samples_per_s:,.1f} samples/s"
        stopped = "stopped" if self._stop.is_set() else "finished"
        confirmation = outcome.confirmation
        gain = (f"{outcome_text(confirmation)} against the start" if confirmation is not None
                else "1.00× (no knob beat the start)" if outcome.speedup is not None
                else "its speed-up over the start not measured")
        return (f"Tune {stopped}: best {outcome.best.label()}, {gain}{rates} "
                f"({len(outcome.bursts)} bursts in {outcome.wall_s:.0f} s; {outcome.stopped_reason}). "
                "The controls now show it.")

    def _run_batch_search(self, config: Config, steps: int) -> str:
        """Grow the batch size from the current settings in worker processes until it no longer fits (on a CPU,
        the finder's RSS cap); each try is reported on the status line, the curve is shown at the end. The
        tries are not runs of the table: they measure the batch size, not the knobs."""
        self.state.show_batch_search(None)

        def on_try(tried: BatchTry) -> None:
            verdict = "fits" if tried.fits else f"does not fit ({tried.why_not})" if tried.why_not else "does not fit"
            rate = f", {tried.samples_per_s:,.0f} samples/s" if tried.samples_per_s else ""
            self.state.set_status(f"Batch size: {tried.batch_size:,} {verdict}{rate}", busy=not self._stop.is_set())

        try:
            search = find_batch_size(self.workload, config, steps=steps, device=self.state.device,
                                     engine=self._engine, on_try=on_try, stop=self._stop)
        except Exception as exc:  # a config or workload the finder refuses: the panel must survive it
            return f"Batch size search failed: {type(exc).__name__}: {exc}"
        self.state.set_progress(1.0)
        self.state.show_batch_search(search)
        if search.largest_fitting is None:
            return f"Batch size: no size fit ({search.stopped_reason})."
        return (f"Batch size: the largest that fits is {search.largest_fitting:,}, the fastest {search.fastest:,} "
                f"({len(search.tries)} tries in {search.wall_s:.0f} s). Set batch_size to try it.")

    def _run_headspace(self, config: Config, budget_s: float) -> str:
        """Measure the ceilings of ``config``: what its step would be with each part free, by the comparison engine;
        each block is reported on the status line, the bars are shown at the end (the windows are not runs of the
        table: they measure the parts, not the knobs)."""
        def progress(now: Progress) -> None:
            counted = max((len(c.counted) for c in now.comparisons), default=0)
            self.state.set_progress(min(1.0, now.elapsed_s / budget_s))
            self.state.set_status(f"Ceilings of {config.label()}: {counted} block{'s' if counted != 1 else ''}, "
                                  f"{now.elapsed_s:.0f} s of {budget_s:g} s", busy=not self._stop.is_set())

        try:
            found = headspace(self.workload, config, budget_s=budget_s, device=self.state.device,
                              engine=self._engine, stop=self._stop, on_progress=progress)
        except Exception as exc:  # a config the parts refuse, a burst that fails: the panel must survive it
            return f"Ceilings failed: {type(exc).__name__}: {exc}"
        self.state.set_progress(1.0)
        self.state.show_headspace(found)
        return f"Ceilings of {config.label()} ({found.wall_s:.0f} s): " + " ".join(headspace_lines(found))

    def _run_remeasure(self, run: int, result: BurstResult, baseline: BurstResult | None, budget_s: float) -> str:
        """The run's and its baseline's configs measured again, interleaved, by the comparison engine: the interval
        and verdict replace the row's speed-up. Its bursts are not runs of the table (they measure one run again),
        so they are not plotted or recorded."""
        name = self.state.runs[run].name
        if baseline is not None and (why := self._not_comparable(result, baseline)):
            return f"Re-measure of {name}: not measured: {why}."
        base = self.state.rows[run].values["baseline"]
        order = [run if base is None else int(base), run]
        comparison = remeasure(self.workload, result, baseline or result, budget_s=budget_s, engine=self._engine,
                               stop=self._stop, on_progress=self._comparing(order, [(0, 1)], budget_s))
        self.state.set_comparison(run, comparison, comparing=False)
        self.state.set_progress(1.0)
        if not comparison.counted:
            return f"Re-measure of {name} {'stopped' if self._stop.is_set() else 'ended'}: {comparison.stopped}."
        return f"Re-measured {name} against its baseline: {verdict_text(comparison)} {interval_text(comparison)}."

    def _run_load(self) -> str:
        """Add the stored runs of this workload's fingerprint, oldest first, skipping those already shown."""
        self.state.set_status("Load: reading the run history", busy=True)
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
        self.state.add_loaded([(run.label, run.result, f"loaded from {history.path}, recorded {run.created_at}")
                               for run in fresh])
        self._shown_ids.update(run.id for run in fresh)
        self.state.set_progress(1.0)
        skipped = len(stored) - len(fresh)
        already = f" ({skipped} already shown)" if skipped else ""
        return f"Loaded {len(fresh)} earlier run{'s' if len(fresh) != 1 else ''} of this workload{already}."

    def use_engine(self, engine: Engine, *, on_cluster: bool) -> None:
        """Run the next actions' bursts through ``engine``, on a Ray cluster or not (the panel's "Run on" choice); an
        action running keeps the engine it started with, and the choice is disabled meanwhile."""
        self._engine, self._on_cluster = engine, on_cluster

    def _not_comparable(self, run: BurstResult, baseline: BurstResult) -> str:
        """Why the comparison engine, which interleaves both configs where the panel runs now, would not measure what
        these two runs measured ("" when it would): each ran somewhere else, or both elsewhere than now."""
        mine, theirs = where_ran(run), where_ran(baseline)
        if bool(mine) == bool(theirs) == self._on_cluster:
            return ""
        if bool(mine) != bool(theirs):
            return (f"it ran {mine or 'on this machine'} and its baseline {theirs or 'on this machine'}, and a "
                    "comparison interleaves both configs in one place")
        now = "on the Ray cluster" if self._on_cluster else "on this machine"
        return (f"it and its baseline ran {mine or 'on this machine'}, and the panel runs {now}: set Run on to where "
                "they ran")

    def _burst(self, what: str, item: PlanItem, length: Length, progress: Callable[[float], float], *,
               live: bool = False, options: BurstOptions | None = None) -> BurstResult:
        """One burst through the engine, streamed into the state, then finished there and recorded (a live
        burst that was stopped by the next edit is not: it measured nothing the user asked for). ``options``: what
        this burst adds to the engine's (a profile)."""
        def call(on_event: Callable[[Event], None]) -> BurstResult:
            return self._engine(self.workload, item.config, **length, on_event=on_event, stop=self._stop,
                                label=item.label, **added_options(options))

        return self._streamed(what, item, length, progress, call, live=live)[1]

    def _held_burst(self, what: str, item: PlanItem, length: Length,
                    progress: Callable[[float], float]) -> tuple[int, Contender]:
        """A burst like :meth:`_burst` whose ranks stay (with the default engine) for the comparison that follows;
        returns its run and its contender, which the caller closes."""
        opened: list[Contender] = []

        def call(on_event: Callable[[Event], None]) -> BurstResult:
            bursts = Bursts(self._engine, steps=length["steps"], seconds=length["seconds"], stop=self._stop)
            opened.append(bursts.open(self.workload, item.config, label=item.label, on_event=on_event))
            return opened[0].first

        run, result = self._streamed(what, item, length, progress, call)
        return run, opened[0] if opened else Failed(item.config, result)

    def _streamed(self, what: str, item: PlanItem, length: Length, progress: Callable[[float], float],
                  call: Callable[[Callable[[Event], None]], BurstResult], *,
                  live: bool = False) -> tuple[int, BurstResult]:
        """``call(on_event)`` run as one run of the table: its events streamed into the state, its result finished
        there and recorded; returns the run's index and its result."""
        label = f"live: {item.config.label()}" if live else item.label or item.config.label()
        run = self.state.begin_run(label, item.config.ranks, live=live)
        prefix = f"{what} · {self.state.runs[run].name}"
        batcher = EventBatcher()
        tracker = BurstProgress.for_burst(item.config, steps=length["steps"], seconds=length["seconds"])
        started = time.monotonic()
        holding = holds_still(item.config, self.state.device)

        def flush() -> None:
            """The batch's events to the state. From the first warm-up step to the last measured one the burst's
            progress goes with them to the timeline, drawn in the frame the page draws for the points anyway; the
            status line and progress bar stay still meanwhile, since each change of theirs is a frame more the page
            draws while the burst is measured (before that, while it sets up or compiles, they tick). A burst that
            holds the page still gets one frame as its window starts, saying so, and the window's points at its end."""
            batch = batcher.take()
            view = tracker.view(time.monotonic() - started)  # the CLI's progress line, in words
            stepping = view.phase in STEPPING
            text = view.text()
            if holding and view.phase == "measuring":
                text = f"{view.goal_text()}: drawn when they end, so that drawing takes no core from them"
            ticker = Ticker(f"{prefix}: {text}", progress(view.fraction)) if stepping else None
            if batch or ticker is not None:
                self.state.add_events(run, batch.steps, batch.samples, ticker)
            if stepping:
                return
            self.state.set_progress(progress(view.fraction))
            if not self._stop.is_set():
                later = f" (then warm-up and {view.goal_text().removeprefix('measuring ')}: live on the timeline)"
                self.state.set_status(f"{prefix}: {view.text()}{later if view.phase != 'finishing' else ''}",
                                      busy=True)

        def on_event(event: Event) -> None:
            phase_changed = tracker.update(event)
            due = batcher.add(event)
            if holding and tracker.phase == "measuring" and not phase_changed:
                return  # the window's events wait in the batcher until it ends
            if due or phase_changed:
                flush()

        self.state.set_status(f"{prefix}: starting", busy=True)
        try:
            result = call(on_event)
        except BurstError as exc:
            result = exc.result
        except Exception as exc:  # a bad config or workload must not take the panel down
            result = failed_result(self.workload, item, exc)
        flush()
        self.state.finish_run(run, result)
        self.last_run = result
        if result.ok and result.peak_memory_bytes and result.memory_kind:
            self._peaks[item.config] = (result.peak_memory_bytes, result.memory_kind)
        if not (live and result.status == "stopped"):
            self._record(result)
        return run, result

    def _final_status(self, what: str, planned: int) -> str:
        if self._stop.is_set():
            took = ""
            if self._stop_requested_at is not None:
                took = f" (stop took {time.monotonic() - self._stop_requested_at:.2f} s)"
            return f"{what} stopped{took}."
        results = self.state.results
        last = results[-1] if results else None
        if last is not None and last.error is not None and not last.ok:
            first_line = last.error.message.strip().splitlines()[0] if last.error.message.strip() else ""
            return f"{what} finished; the last run {last.status}: {first_line}"
        return f"{what} finished: {planned} run{'s' if planned > 1 else ''} added to the table."

    # -- history ----------------------------------------------------------------------------------
    def _history_failed(self, exc: Exception) -> None:
        """Carry on without the history, and keep saying why under the status line."""
        self.history = None
        self._history_off_why = str(exc)
        self.state.set_history(False, str(exc))

    def _known_noise(self, baseline: BurstResult) -> NoiseBand | None:
        """The noise band measured for this workload and baseline earlier (by Tune, in this process or the
        run history), so the table's guard uses it too; looking it up runs no burst."""
        if self._noise_fingerprint is None:
            try:
                self._noise_fingerprint = self._workload_fingerprint() or workload_fingerprint(self.workload)
            except Exception:  # a workload that cannot be fingerprinted has no band: the precision floor stands
                return None
        return cached_noise(self._noise_fingerprint, baseline, self.history)

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
