"""What the panel shows, as plain data: the runs, which of them the plots show, the config being edited,
the status line, the progress of the running action and the last reading.

The controller (:mod:`.controller`) changes it from the action thread, the view (:mod:`.view`) renders it,
and tests drive it without a widget. Every change tells the listeners which part changed, so the view
redraws only that part. Changes and the listeners' redraws run under one re-entrant lock: a redraw always
reads the state it was told about, even when the action thread and the kernel's thread change it at once
(without that, a button redrawn from a stale "running" could stay disabled for good).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..analysis.compare import RunRow, run_rows
from ..analysis.diagnosis import Finding, Severity, diagnose
from ..inputs.device import DeviceInfo
from ..knobs import KNOBS, Knob
from ..knobs.config import Config
from ..knobs.rules import RULES, ConfigError, check_config, knob_availability
from ..results.burst import BurstResult, ProfileCapture, StepRecord, TelemetrySample
from ..results.comparison import Comparison
from ..results.noise import NoiseBand
from ..views.comparison import comparison_sentence
from ..views.style import LOADED_MARK, run_name

if TYPE_CHECKING:
    from ..results.batchsize import BatchSizeSearch
    from ..results.headspace import Headspace
    from ..results.tune import TuneResult

Part = Literal["runs", "points", "shown", "draft", "status", "progress", "action", "reading", "profile", "live",
               "replaced", "batch", "headspace", "fit"]
Listener = Callable[[Part], None]
ControlKind = Literal["bool", "choice", "int", "optional"]


# -- the config being edited -----------------------------------------------------------------------
def control_kind(knob: Knob) -> ControlKind:
    """How the draft holds a knob's value, and so which input it needs: a checkbox, a drop-down, a bounded
    integer box, or free text for the knobs that take "or None" (typed text is parsed when the config is built)."""
    if knob.choices is not None:
        return "choice"
    if knob.kind is bool:
        return "bool"
    if knob.allow_none or knob.kind is not int:
        return "optional"
    return "int"


@dataclass(frozen=True)
class Note:
    """What this machine says about one knob: it cannot act here, its value cannot run, or it runs but hurts."""

    severity: Literal["unavailable", "error", "warning"]
    message: str


def value_note(name: str, value: Any, device: DeviceInfo) -> Note | None:
    """Judge ``name=value`` alone against the baseline, so a control can carry its own warning.

    Only warnings the change adds are reported: a rule that already fires for the baseline is not this
    knob's doing.
    """
    baseline = Config()
    try:
        changed = baseline.replace(**{name: value})
    except ValueError as exc:
        return Note("error", str(exc))
    try:
        warnings = check_config(changed, device)
    except ConfigError as exc:
        return Note("error", str(exc))
    added = [w for w in warnings if w not in check_config(baseline, device)]
    return Note("warning", " ".join(added)) if added else None


def rule_notes(config: Config, device: DeviceInfo) -> dict[str, Note]:
    """What the rules say about the whole of ``config``, under the knobs that make each rule fire.

    Judged on the whole config, not one value against the baseline, so every note follows every edit:
    raising num_workers clears the note under prefetch_factor that num_workers=0 put there. A rule's message
    goes under those of its knobs that ``config`` moves off their defaults (the user's doing); a rule that
    fires with all of them at their defaults goes under all of them. Errors come before warnings.
    """
    found: dict[str, list[tuple[str, str]]] = {}
    for rule in sorted(RULES, key=lambda rule: rule.severity != "error"):
        if rule.applies(config, device):
            moved = [name for name in rule.knobs if getattr(config, name) != KNOBS[name].default]
            for name in moved or rule.knobs:
                found.setdefault(name, []).append((rule.severity, rule.message(config, device)))
    return {name: Note("error" if said[0][0] == "error" else "warning", " ".join(text for _, text in said))
            for name, said in found.items()}


@dataclass(frozen=True)
class Validation:
    """Whether the edited config can run here: an error blocks Run, warnings only inform."""

    error: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


class Draft:
    """The config being edited: every knob's value as its control holds it (text for the "optional" knobs,
    so a half-typed value is kept rather than lost) and what this machine says about it."""

    def __init__(self, device: DeviceInfo) -> None:
        self.device = device
        self.raw: dict[str, Any] = {name: _raw(knob, knob.default) for name, knob in KNOBS.items()}
        self._availability = {name: knob_availability(name, device) for name in KNOBS}
        self.notes: dict[str, Note | None] = self._judge()
        self.validation = self._validate()

    def available(self, name: str) -> bool:
        return self._availability[name][0]

    def config(self) -> Config:
        """The Config the draft describes; raises KnobValueError for an invalid typed value."""
        return Config(**{name: self._value(name) for name in KNOBS})

    def set(self, name: str, raw: Any) -> bool:
        """Take one control's value; False when it was the value already (nothing to redraw)."""
        if self.raw[name] == raw:
            return False
        self.raw[name] = raw
        self.notes = self._judge()  # every knob's: a rule's note can come or go with another knob's edit
        self.validation = self._validate()
        return True

    def set_config(self, config: Config) -> bool:
        changed = [self.set(name, _raw(knob, getattr(config, name))) for name, knob in KNOBS.items()]
        return any(changed)

    def _value(self, name: str) -> Any:
        knob = KNOBS[name]
        return knob.parse(self.raw[name]) if control_kind(knob) == "optional" else self.raw[name]

    def _judge(self) -> dict[str, Note | None]:
        """Each knob's note: why it is off here, else why its value is invalid, else what the rules say about
        the config as a whole (judged with any invalid value at its default)."""
        values: dict[str, Any] = {}
        notes: dict[str, Note | None] = {}
        for name, knob in KNOBS.items():
            available, reason = self._availability[name]
            if not available:
                notes[name] = Note("unavailable", reason)
            try:
                values[name] = knob.check(self._value(name))
            except ValueError as exc:  # KnobValueError from typed text or a value set from code
                notes.setdefault(name, Note("error", str(exc)))
        by_rules = rule_notes(Config(**values), self.device)
        return {name: notes.get(name) or by_rules.get(name) for name in KNOBS}

    def _validate(self) -> Validation:
        try:
            config = self.config()
        except ValueError as exc:  # KnobValueError from a typed value
            return Validation(error=str(exc))
        try:
            return Validation(warnings=tuple(check_config(config, self.device)))
        except ConfigError as exc:
            return Validation(error=str(exc))


def _raw(knob: Knob, value: Any) -> Any:
    if control_kind(knob) == "optional":
        return "" if value is None else str(value)
    return value


# -- runs ------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One run of the panel: its name, the events plotted so far, its result once it has finished, and the
    hover note of a run loaded from the run history. ``live``: the live run, which the next live burst
    replaces unless the user pins it."""

    index: int
    name: str
    ranks: int
    steps: list[StepRecord] = field(default_factory=list)
    samples: list[TelemetrySample] = field(default_factory=list)
    result: BurstResult | None = None
    loaded: str | None = None
    live: bool = False


@dataclass(frozen=True)
class Ticker:
    """A measuring burst's progress as the timeline shows it, with its points: the line and the done fraction."""

    text: str
    fraction: float


@dataclass(frozen=True)
class Reading:
    """The plain-language reading of one run."""

    run: int
    name: str
    findings: list[Finding]


@dataclass(frozen=True)
class ProfileShown:
    """A profiled burst's capture, or why there is none."""

    capture: ProfileCapture | None
    why_none: str = ""


class PanelState:
    """Everything the panel shows; see the module docstring for who changes it and who reads it."""

    def __init__(self, device: DeviceInfo) -> None:
        self.device = device
        self.draft = Draft(device)
        self.runs: list[Run] = []
        self.rows: list[RunRow] = []
        self.hidden: set[int] = set()
        self.status = ""
        self.busy = False
        self.history_on = False
        self.history_problem = ""
        self.progress = 0.0
        self.action: str | None = None
        self.reading: Reading | None = None
        self.ticker: Ticker | None = None  # the measuring burst's progress, shown on the timeline
        self.profile: ProfileShown | None = None
        self.tune_result: TuneResult | None = None
        self.batch_search: BatchSizeSearch | None = None
        #: The ceilings last measured (the row of bars under the runs table; the ladder and the tuner read them).
        self.headspace: Headspace | None = None
        #: Whether the settings fit, from a step traced on fake tensors before any burst ("" while none is known).
        self.fit = ""
        self.live = False  # Live mode: every edit of the knobs starts a new burst (the controller's doing)
        self.replaced: int | None = None  # the run whose slot the newest live run took (the plots drop it)
        #: The baseline's measured noise band, when one is known (the controller looks it up; no bursts).
        self.noise_of: Callable[[BurstResult], NoiseBand | None] | None = None
        #: Runs compared with their baseline by the comparison engine: run index -> the comparison so far, and the
        #: runs whose repeats are still arriving.
        self.compared: dict[int, Comparison] = {}
        self.comparing: set[int] = set()
        self.lock = threading.RLock()
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(part)`` after every change, under the state's lock."""
        self._listeners.append(listener)

    # -- derived ----------------------------------------------------------------------------------
    @property
    def results(self) -> list[BurstResult]:
        """Every finished run's result, in run order (a running burst is always the last run)."""
        return [run.result for run in self.runs if run.result is not None]

    @property
    def loaded(self) -> dict[int, str]:
        """Run index -> hover note, for the runs loaded from the run history."""
        return {run.index: run.loaded for run in self.runs if run.loaded is not None}

    def runnable_config(self) -> Config:
        """The edited config, when it can run here; the error says why not."""
        with self.lock:
            if not self.draft.validation.ok:
                raise ValueError(f"the current settings cannot run here: {self.draft.validation.error}")
            return self.draft.config()

    # -- the config being edited ------------------------------------------------------------------
    def edit(self, name: str, raw: Any) -> None:
        with self.lock:
            if self.draft.set(name, raw):
                self._changed("draft")

    def set_config(self, config: Config) -> None:
        with self.lock:
            if self.draft.set_config(config):
                self._changed("draft")

    # -- runs -------------------------------------------------------------------------------------
    def begin_run(self, label: str, ranks: int, *, live: bool = False) -> int:
        """A new run, shown before its first event; returns its index.

        A live run takes the place of the previous live run when that is still the newest run (same
        index, so the same colour and tick), which leaves the plots and the table; a live run with other
        runs after it, or one the user pinned, stays. Any other run keeps every live run before it.
        """
        with self.lock:
            if live and self.runs and self.runs[-1].live:
                index = self.runs[-1].index
                self.runs[index] = Run(index, run_name(index, label), ranks, live=True)
                self.compared.pop(index, None)
                self.replaced = index
                self._rejudge()
                self._changed("replaced")
            else:
                for run in self.runs:
                    run.live = False
                index = len(self.runs)
                self.runs.append(Run(index, run_name(index, label), ranks, live=live))
            self._changed("runs")
            return index

    def set_live(self, on: bool) -> None:
        with self.lock:
            if on != self.live:
                self.live = on
                self._changed("live")

    def pin(self, run: int) -> None:
        """Keep ``run``: the next live burst gets a run of its own instead of replacing it."""
        with self.lock:
            if self.runs[run].live:
                self.runs[run].live = False
                self._changed("live")

    @property
    def live_run(self) -> int | None:
        """The run the next live burst would replace, if any."""
        return next((run.index for run in self.runs if run.live), None)

    def add_events(self, run: int, steps: Sequence[StepRecord], samples: Sequence[TelemetrySample],
                   ticker: Ticker | None = None) -> None:
        """A running run's new events, and, while it measures, its progress as the timeline shows it."""
        with self.lock:
            self.runs[run].steps.extend(steps)
            self.runs[run].samples.extend(samples)
            self.ticker = ticker
            self._changed("points")

    def finish_run(self, run: int, result: BurstResult) -> None:
        """Record the run's result: the table's rows are judged again (a new baseline can change earlier rows),
        and the run's reading is the one its row implies."""
        with self.lock:
            self.runs[run].result = result
            self._rejudge()
            self.reading = self._read(run)
            self._changed("runs")
            self._changed("reading")

    def add_loaded(self, stored: Sequence[tuple[str, BurstResult, str]]) -> None:
        """Runs loaded from the run history, as (label, result, hover note), with every event they recorded."""
        with self.lock:
            for label, result, note in stored:
                index = len(self.runs)
                self.runs.append(Run(index, run_name(index, LOADED_MARK + label), max(1, result.world_size),
                                     list(result.steps), list(result.telemetry), result, note))
            self._rejudge()
            self._changed("runs")

    def set_shown(self, run: int, shown: bool) -> None:
        with self.lock:
            hidden = self.hidden - {run} if shown else self.hidden | {run}
            if hidden != self.hidden:
                self.hidden = hidden
                self._changed("shown")

    # -- the running action -----------------------------------------------------------------------
    def begin_action(self, what: str) -> None:
        with self.lock:
            if self.action is not None:
                raise RuntimeError("an action is already running: Stop it or wait() for it first")
            self.action = what
            self.progress = 0.0
            self._changed("action")
            self._changed("progress")

    def end_action(self) -> None:
        with self.lock:
            self.action = None
            self.ticker = None
            self._changed("action")

    def set_status(self, text: str, busy: bool = False) -> None:
        """The status line, plain text (the view escapes it)."""
        with self.lock:
            self.status, self.busy = text, busy
            self._changed("status")

    def set_history(self, on: bool, problem: str = "") -> None:
        """Whether runs are recorded, and why not when the history failed: that stays under the status line,
        so a lost history is never silent."""
        with self.lock:
            self.history_on, self.history_problem = on, problem
            self._changed("status")
            self._changed("action")  # whether Load earlier runs can start

    def set_progress(self, fraction: float) -> None:
        with self.lock:
            self.progress = fraction
            self._changed("progress")

    def show_profile(self, shown: ProfileShown | None) -> None:
        with self.lock:
            self.profile = shown
            self._changed("profile")

    def show_batch_search(self, search: BatchSizeSearch | None) -> None:
        with self.lock:
            self.batch_search = search
            self._changed("batch")

    def show_headspace(self, found: Headspace | None) -> None:
        """The ceilings last measured; the reading is read again with them when they are its run's config's (its
        limiter sized by them, the families they close left out of its advice)."""
        with self.lock:
            self.headspace = found
            self._changed("headspace")
            if self.reading is not None and self.reading.run < len(self.rows):
                compared = [f for f in self.reading.findings if f.title.startswith("Compared with its baseline")]
                fresh = self._read(self.reading.run)
                self.reading = Reading(fresh.run, fresh.name, [*compared, *fresh.findings])
                self._changed("reading")

    def set_fit(self, text: str) -> None:
        with self.lock:
            if text != self.fit:
                self.fit = text
                self._changed("fit")

    def set_tune_result(self, outcome: TuneResult) -> None:
        with self.lock:
            self.tune_result = outcome

    # -- internals --------------------------------------------------------------------------------
    def set_comparison(self, run: int, comparison: Comparison, *, comparing: bool) -> None:
        """``run``'s comparison with its baseline as it stands: its row shows the interval and verdict (live while
        ``comparing``), and its reading says them in a sentence."""
        with self.lock:
            self.compared[run] = comparison
            (self.comparing.add if comparing else self.comparing.discard)(run)
            self._rejudge()
            self._changed("runs")
            if self.reading is not None and self.reading.run == run and comparison.counted:
                row = self.rows[run]
                baseline = self.runs[int(row.values["baseline"])].name if row.values["baseline"] is not None else ""
                sentence = comparison_sentence(comparison, self.runs[run].name, baseline or "its baseline")
                severity: Severity = {"faster": "good", "same": "info"}.get(comparison.verdict, "warn")
                finding = Finding(severity, "Compared with its baseline" + (" (so far)" if comparing else ""),
                                  sentence)
                kept = [f for f in self.reading.findings if not f.title.startswith("Compared with its baseline")]
                self.reading = Reading(run, self.reading.name, [finding, *kept])
                self._changed("reading")

    def _read(self, run: int) -> Reading:
        """``run``'s reading: its diagnosis against its row's baseline, with the ceilings last measured when they
        were measured for its config."""
        row = self.rows[run]
        ceilings = self.headspace if self.headspace is not None and self.headspace.config == row.result.config \
            else None
        return Reading(run, self.runs[run].name, diagnose(row.result, row.baseline, verdict=row.verdict,
                                                          headspace=ceilings))

    def remeasurable(self) -> int | None:
        """The run a Re-measure would pair with its baseline: the one the reading is about, when it finished and
        has a baseline other than itself."""
        reading = self.reading
        if reading is None or reading.run >= len(self.rows):
            return None
        row = self.rows[reading.run]
        return reading.run if row.result.ok and row.baseline is not None and row.baseline is not row.result else None

    def _rejudge(self) -> None:
        self.rows = run_rows(self.results, loaded=self.loaded, judged=self.rows, noise_of=self.noise_of,
                             compared=self.compared, comparing=self.comparing)

    def _changed(self, part: Part) -> None:
        for listener in self._listeners:
            listener(part)
