"""The panel's logic without widgets: what each control offers, whether a config can run, burst plans,
live-event batching and progress.

Kept free of ipywidgets and plotly so every rule here is tested directly and the widget modules stay a
thin skin: they only copy these answers onto widgets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..config import Config
from ..device import DeviceInfo
from ..knobs import Knob
from ..ladder import classic_ladder
from ..results import BurstResult, ErrorInfo, StepRecord, TelemetrySample
from ..validation import ConfigError, check_config
from ..workload import Workload

ControlKind = Literal["bool", "choice", "int", "optional"]
Event = StepRecord | TelemetrySample

FLUSH_INTERVAL_S = 0.25  # ~4 Hz: smooth enough to watch, rare enough not to flood the comm channel


# -- controls --------------------------------------------------------------------------------------
def control_kind(knob: Knob) -> ControlKind:
    """Which input a knob needs: a checkbox, a drop-down, a bounded integer box, or free text for "or None"."""
    if knob.choices is not None:
        return "choice"
    if knob.kind is bool:
        return "bool"
    if knob.allow_none or knob.kind is not int:
        return "optional"
    return "int"


@dataclass(frozen=True)
class Note:
    """What this machine says about one knob value on its own: it cannot run, or it runs but hurts."""

    severity: Literal["error", "warning"]
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


def choice_notes(knob: Knob, device: DeviceInfo) -> dict[Any, Note]:
    """Notes for each choice of a choice knob, to mark impossible or harmful values in its drop-down."""
    notes = {}
    for value in knob.choices or ():
        note = value_note(knob.name, value, device)
        if note is not None:
            notes[value] = note
    return notes


def choice_label(value: Any, note: Note | None) -> str:
    """Drop-down text: the value, marked ✗ when it cannot run here and ⚠ when it runs but hurts."""
    if note is None:
        return str(value)
    return f"{value} {'✗' if note.severity == 'error' else '⚠'}"


def help_text(knob: Knob) -> dict[str, str]:
    """The registry's own explanation, in the order a user reads it."""
    return {"what": knob.what, "why": knob.why, "when": knob.when, "values": knob.valid_values_text()}


# -- validation ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Validation:
    """Whether the current settings can run here: an error blocks Run, warnings only inform."""

    error: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


def validate(build: Callable[[], Config], device: DeviceInfo) -> tuple[Config | None, Validation]:
    """Build the config from the controls and check it; a bad value or rule becomes the error text."""
    try:
        config = build()
    except ValueError as exc:  # KnobValueError from a typed value
        return None, Validation(error=str(exc))
    try:
        return config, Validation(warnings=tuple(check_config(config, device)))
    except ConfigError as exc:
        return config, Validation(error=str(exc))


# -- layout ----------------------------------------------------------------------------------------
def balanced_columns(heights: Sequence[float], columns: int) -> list[list[int]]:
    """Split items, in order, into at most ``columns`` contiguous runs with the smallest tallest run.

    The registry's group order is the tuning order, so groups stay in order; only the breaks move.
    """
    count = len(heights)
    columns = max(1, min(columns, count))
    best: tuple[float, list[list[int]]] | None = None

    def split(start: int, left: int, done: list[list[int]]) -> None:
        nonlocal best
        if left == 1:
            parts = [*done, list(range(start, count))]
            tallest = max(sum(heights[i] for i in part) for part in parts)
            if best is None or tallest < best[0]:
                best = (tallest, parts)
            return
        for end in range(start + 1, count - left + 2):
            split(end, left - 1, [*done, list(range(start, end))])

    split(0, columns, [])
    assert best is not None
    return best[1]


# -- plans -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanItem:
    """One burst an action will run: the label it is recorded under and its config."""

    label: str
    config: Config


def ladder_plan(workload: Workload, device: DeviceInfo) -> list[PlanItem]:
    """The classic cumulative ladder for this workload and device, as bursts to run in order."""
    return [PlanItem(rung.name, rung.config) for rung in classic_ladder(workload, device)]


def length_kwargs(unit: str, value: float) -> dict[str, int | float | None]:
    """Burst length as the engine's keywords: a number of measured steps, or seconds of measuring."""
    if unit == "steps":
        return {"steps": max(1, round(value)), "seconds": None}
    if unit == "seconds":
        return {"steps": None, "seconds": max(0.1, float(value))}
    raise ValueError(f"burst length unit must be 'steps' or 'seconds', got {unit!r}")


def failed_result(workload: Workload, item: PlanItem, exc: BaseException) -> BurstResult:
    """A result for a burst that raised without one (bad config, unpicklable workload), so it gets a row."""
    kind = "config" if isinstance(exc, ConfigError) else "exception"
    message = f"{type(exc).__name__}: {exc}"
    return BurstResult(workload=workload.name, config=item.config, status="failed", label=item.label,
                       error=ErrorInfo(kind, message))


def run_name(run: int, label: str, limit: int = 40) -> str:
    """Legend and table name of a run: its index (runs can share a label) and a shortened label."""
    short = label if len(label) <= limit else label[: limit - 1] + "…"
    return f"#{run} {short}"


def row_title(row: dict[str, Any]) -> str:
    """The row's changes from the baseline, after its own label when that says more (a ladder rung)."""
    label, changes = str(row.get("label") or ""), str(row.get("changes") or "")
    if not label or label == changes:
        return changes
    return f"{label} (baseline)" if changes == "baseline" else f"{label}: {changes}"


# -- live events -----------------------------------------------------------------------------------
@dataclass
class Batch:
    """Events received since the previous flush."""

    steps: list[StepRecord] = field(default_factory=list)
    samples: list[TelemetrySample] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.steps or self.samples)


class EventBatcher:
    """Collects a burst's live events and says when the next flush to the front end is due.

    The engine calls ``on_event`` for every step and every 10 Hz telemetry sample; pushing each one to
    the browser would send a comm message per event. Batching to ``interval_s`` keeps the plots live
    with a handful of messages a second. Thread-safe, though the engine calls it from one thread.
    """

    def __init__(self, interval_s: float = FLUSH_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending = Batch()
        self._last_flush = clock()

    def add(self, event: Event) -> bool:
        """Queue ``event``; True when a flush is due (the caller then calls :meth:`take`)."""
        with self._lock:
            if isinstance(event, StepRecord):
                self._pending.steps.append(event)
            elif isinstance(event, TelemetrySample):
                self._pending.samples.append(event)
            return self._clock() - self._last_flush >= self._interval

    def take(self) -> Batch:
        """Everything queued since the last take, and restart the flush interval."""
        with self._lock:
            batch, self._pending = self._pending, Batch()
            self._last_flush = self._clock()
            return batch


class ProgressTracker:
    """How far one burst is, from the step events alone (rank 0 speaks for the group)."""

    def __init__(self, steps: int | None, seconds: float | None) -> None:
        self.steps, self.seconds = steps, seconds
        self.warmup_seen = 0
        self.measured_seen = 0
        self._first_t: float | None = None
        self._last_t: float | None = None

    def observe(self, steps: Sequence[StepRecord]) -> None:
        for record in steps:
            if record.rank != 0:
                continue
            if record.warmup:
                self.warmup_seen += 1
                continue
            self.measured_seen += 1
            start = record.t - record.total_s
            self._first_t = start if self._first_t is None else min(self._first_t, start)
            self._last_t = record.t if self._last_t is None else max(self._last_t, record.t)

    @property
    def measured_s(self) -> float:
        if self._first_t is None or self._last_t is None:
            return 0.0
        return self._last_t - self._first_t

    @property
    def fraction(self) -> float:
        """Share of the measured part done: warm-up and compile steps are not counted as progress."""
        if self.steps:
            return min(1.0, self.measured_seen / self.steps)
        if self.seconds:
            return min(1.0, self.measured_s / self.seconds)
        return 0.0

    def describe(self) -> str:
        if self.measured_seen == 0:
            return f"warm-up step {self.warmup_seen} done" if self.warmup_seen else "starting the workers"
        if self.steps:
            return f"step {self.measured_seen}/{self.steps}"
        return f"{self.measured_s:.1f} s of {self.seconds:g} s ({self.measured_seen} steps)"
