"""The step clock: steps that tile the measured window, their parts (data wait, copy, compute) adding up exactly,
on the clock of whatever does the work: the host's wall clock on a CPU, CUDA events on a GPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

Clock = Callable[[], float]


@dataclass
class StepTiming:
    """One step on the timeline that does the work: ``data_s + h2d_s + compute_s == total_s`` exactly."""

    t: float
    data_s: float
    h2d_s: float
    total_s: float

    @property
    def compute_s(self) -> float:
        return max(0.0, self.total_s - self.data_s - self.h2d_s)


#: How often a GPU's pending steps are looked at (host seconds): each look queries CUDA events, and the
#: records leave for the caller in batches of ``worker.STEP_BATCH_S`` anyway.
RESOLVE_EVERY_S = 0.05


class Timeline(Protocol):
    """Markers on the clock of whatever runs the step's work (the host on a CPU, a CUDA stream on a GPU).

    ``look_every_s``: how often pending markers are worth asking about (host seconds).
    """

    look_every_s: float

    def mark(self) -> Any:
        """A marker placed after everything issued so far; it is *reached* once all of that has run."""

    def reached(self, marker: Any) -> bool:
        """Whether the work before ``marker`` has run, asked without waiting for it."""

    def seconds_between(self, start: Any, end: Any) -> float: ...

    def release(self, marker: Any) -> None:
        """``marker`` has been read for the last time: the timeline may place it again."""

    def synchronize(self) -> None:
        """Wait until every marker placed so far is reached."""


class HostTimeline:
    """The host's wall clock: on a CPU every op has finished before the next Python line runs."""

    look_every_s = 0.0  # every marker is reached when placed: asking costs nothing

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def mark(self) -> float:
        return self._clock()

    def reached(self, marker: float) -> bool:
        return True

    def seconds_between(self, start: float, end: float) -> float:
        return end - start

    def release(self, marker: float) -> None:
        """A host marker is a number: nothing to reuse."""

    def synchronize(self) -> None:
        """Nothing is in flight on the host."""


class CudaTimeline:
    """CUDA events on the current stream, so measuring never adds a host-device sync.

    The host runs ahead of the GPU; events are read only once the GPU has passed them
    (``Event.query``), so a config that avoids syncs is measured without one. Events come from a pool:
    creating one costs host time inside the measured window on every marker (five a step), a re-recorded
    one only its record, so a released marker is placed again and the steady state creates none.
    """

    look_every_s = RESOLVE_EVERY_S

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._free: list[Any] = []

    def mark(self) -> Any:
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def reached(self, marker: Any) -> bool:
        return bool(marker.query())

    def seconds_between(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3

    def release(self, marker: Any) -> None:
        self._free.append(marker)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self._device)


class _Interval:
    """Brackets part of a step with two markers (a class, not a generator: it runs twice a step)."""

    __slots__ = ("_begin", "_into", "_timeline")

    def __init__(self, timeline: Timeline, into: list[tuple[Any, Any]]) -> None:
        self._timeline, self._into = timeline, into

    def __enter__(self) -> None:
        self._begin = self._timeline.mark()

    def __exit__(self, *exc: object) -> None:
        self._into.append((self._begin, self._timeline.mark()))


@dataclass
class _OpenStep:
    start: Any
    data: list[tuple[Any, Any]] = field(default_factory=list)
    copies: list[tuple[Any, Any]] = field(default_factory=list)
    end: Any = None


class StepClock:
    """Times steps on one timeline so that they tile the measured window and their parts add up.

    Each step starts where the previous one ended, so the steps' totals sum to the window and nothing
    the loop does between steps escapes measurement. A step's parts are intervals on the same timeline:
    *data* runs from a marker placed before asking the loader for a batch to one placed after it
    arrived. On a GPU that interval is the time the GPU sat idle because of the loader, not the host's
    wait: a host running ahead (``sync_every`` != 1) hides its data wait behind queued kernels, and
    then the GPU sees no stall. *h2d* brackets the copy the same way; compute is the rest.

    Steps are resolved in batches, every ``timeline.look_every_s`` at most: one query of the newest end
    marker tells whether every pending step has run (markers on one stream are reached in order); only
    when it has not are the older ones queried. A resolved step's markers go back to the timeline, except
    its end, which is the next step's start and goes back with that step.
    """

    def __init__(self, timeline: Timeline, clock: Clock, origin: float) -> None:
        self._timeline, self._clock, self._origin = timeline, clock, origin
        timeline.synchronize()
        self._reference = timeline.mark()
        timeline.synchronize()
        self._reference_t = clock() - origin
        self._previous_end: Any = None
        self._open: _OpenStep | None = None
        self._pending: deque[_OpenStep] = deque()
        self._scanned_at = -float("inf")
        self.last_end: float | None = None  # on ``clock``: where the last resolved step ended

    def restart(self) -> None:
        """The next step starts at a fresh marker (after a pause that belongs to no step, e.g. a sync)."""
        if self._previous_end is not None and not (self._pending and self._pending[-1].end is self._previous_end):
            self._timeline.release(self._previous_end)  # resolved, and no step will start at it now
        self._previous_end = None

    def start_step(self) -> None:
        start = self._previous_end if self._previous_end is not None else self._timeline.mark()
        self._open = _OpenStep(start)

    def waiting_for_data(self) -> _Interval:
        return _Interval(self._timeline, self._require_open().data)

    def copying(self) -> _Interval:
        return _Interval(self._timeline, self._require_open().copies)

    def end_step(self) -> None:
        step = self._require_open()
        step.end = self._previous_end = self._timeline.mark()
        self._pending.append(step)
        self._open = None

    def synchronize(self) -> None:
        self._timeline.synchronize()

    def completed(self) -> list[StepTiming]:
        """Timings of the steps whose end the timeline has reached, looked at every ``look_every_s`` at
        most (the first call always looks); never waits."""
        if not self._pending:
            return []
        if self._timeline.look_every_s:
            now = self._clock()
            if now - self._scanned_at < self._timeline.look_every_s:
                return []
            self._scanned_at = now
        return self.reached()

    def flush(self) -> list[StepTiming]:
        """Wait for every pending step and return its timing."""
        self._timeline.synchronize()
        return self.reached()

    def reached(self) -> list[StepTiming]:
        """Timings of the steps whose end the timeline has reached, looked at now; never waits."""
        if self._pending and self._timeline.reached(self._pending[-1].end):
            return [self._resolve(self._pending.popleft()) for _ in range(len(self._pending))]
        out = []
        while self._pending and self._timeline.reached(self._pending[0].end):
            out.append(self._resolve(self._pending.popleft()))
        return out

    def _require_open(self) -> _OpenStep:
        if self._open is None:
            raise RuntimeError("start_step() must come first")
        return self._open

    def _resolve(self, step: _OpenStep) -> StepTiming:
        between = self._timeline.seconds_between
        data = sum(between(a, b) for a, b in step.data)
        h2d = sum(between(a, b) for a, b in step.copies)
        t = self._reference_t + between(self._reference, step.end)
        timing = StepTiming(t, data, h2d, between(step.start, step.end))
        for marker in (step.start, *(m for pair in (*step.data, *step.copies) for m in pair)):
            self._timeline.release(marker)
        self.last_end = self._origin + t
        return timing
