"""Live progress of bursts: what a burst is doing now, and one terminal line per burst that says so.

A cold ``torch.compile`` takes tens of seconds before the first step record exists, and a terminal that
prints nothing meanwhile looks hung. :class:`BurstProgress` turns the events ``run_burst(on_event=...)``
delivers (step records, telemetry, the launcher's :class:`~accel_widgets.results.burst.BurstPhase`) into a phase,
step counts and a fraction; it holds no clock and no UI, so the panel's status line and the terminal read
the same state. :class:`ProgressSeries` draws it for a series of bursts (a ladder's rungs, a sweep's
points): one live ``rich`` line on an interactive terminal, plain phase-change lines anywhere else (CI logs,
pipes, notebooks), which carry no control codes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Literal

from ..analysis.compare import speedup
from ..engine.request import DEFAULT_STEPS
from ..knobs import compiling
from ..knobs.config import Config
from ..results.burst import BurstPhase, BurstResult, PhaseName, StepRecord

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

DisplayPhase = Literal["starting", "setting up", "compiling", "warming up", "measuring", "finishing"]
#: The order a burst goes through its phases; the displayed phase never moves back in it.
PHASES: tuple[DisplayPhase, ...] = ("starting", "setting up", "compiling", "warming up", "measuring", "finishing")
_RANK: dict[DisplayPhase, int] = {phase: i for i, phase in enumerate(PHASES)}
_SEPARATOR = " · "


@dataclass(frozen=True)
class ProgressView:
    """What a display shows at one moment: the phase, the time so far, and the measured window's progress.

    ``done`` and ``target`` count measured steps (``unit="steps"``) or measured seconds (``unit="s"``);
    ``fraction`` is ``done / target`` clipped to [0, 1]: 0 until measuring starts, since setup and compile
    times cannot be known in advance, and 1 once finishing (the last step records may still be on their way).
    """

    phase: DisplayPhase
    elapsed_s: float
    done: float
    target: float
    unit: Literal["steps", "s"]

    @property
    def fraction(self) -> float:
        if self.phase == "finishing":
            return 1.0
        return min(1.0, max(0.0, self.done / self.target)) if self.target > 0 else 0.0

    def text(self) -> str:
        """``compiling · 12.3 s``, ``measuring 24/40 steps · 15.0 s`` or ``measuring 3.2/10 s · 15.0 s``."""
        if self.phase != "measuring":
            return f"{self.phase}{_SEPARATOR}{self.elapsed_s:.1f} s"
        done = f"{int(self.done)}/{int(self.target)} steps" if self.unit == "steps" else \
            f"{self.done:.1f}/{self.target:g} s"
        return f"measuring {done}{_SEPARATOR}{self.elapsed_s:.1f} s"

    def goal_text(self) -> str:
        """What the measured window will be, without the numbers that change while it runs: ``measuring 40 steps``."""
        return f"measuring {int(self.target)} steps" if self.unit == "steps" else f"measuring {self.target:g} s"


@dataclass
class BurstProgress:
    """The progress of one burst, fed with the events ``run_burst`` hands to ``on_event``.

    Only rank 0 counts (DDP ranks step in lock-step, and a step record arrives per rank). The phase comes
    from rank 0's :class:`BurstPhase` events where the launcher sends them, and from the step records alone
    otherwise ("starting" until the first warm-up step has finished then). A compiled config's first
    warm-up step is shown as "compiling": it is the step that pays for the compile. In a burst bounded by
    steps, the last measured step starts "finishing" (FLOP counting, profiling, teardown follow it).
    ``update`` is O(1): step records arrive in thousands.
    """

    compiles: bool
    steps: int | None = DEFAULT_STEPS
    seconds: float | None = None
    phase: DisplayPhase = "starting"
    rank_phase: PhaseName = "starting"
    warmup_steps: int = 0
    measured_steps: int = 0
    window_start: float | None = None  # burst clock: the end of the last warm-up step
    last_measured_t: float | None = None

    @classmethod
    def for_burst(cls, config: Config, *, steps: int | None = None, seconds: float | None = None) -> BurstProgress:
        """The progress of ``run_burst(workload, config, steps=steps, seconds=seconds)``, with its defaults."""
        if steps is None and seconds is None:
            steps = DEFAULT_STEPS
        return cls(compiles=compiling.compiled(config), steps=steps, seconds=seconds)

    def update(self, event: object) -> bool:
        """Take one event (anything ``on_event`` receives); True when the displayed phase changed."""
        if isinstance(event, StepRecord):
            if event.rank != 0:
                return False
            self._count(event)
        elif isinstance(event, BurstPhase):
            if event.rank != 0:
                return False
            self.rank_phase = event.phase
        else:
            return False
        derived = self._derive()
        if _RANK[derived] <= _RANK[self.phase]:
            return False
        self.phase = derived
        return True

    def _count(self, record: StepRecord) -> None:
        if record.warmup:
            self.warmup_steps += 1
            self.window_start = record.t
            return
        if self.window_start is None:  # no warm-up record came: the window began when this step did
            self.window_start = record.t - record.total_s
        self.measured_steps += 1
        self.last_measured_t = record.t

    def _derive(self) -> DisplayPhase:
        if self.rank_phase == "finishing":
            return "finishing"
        if self.measured_steps:
            return "finishing" if self.steps is not None and self.measured_steps >= self.steps else "measuring"
        if self.warmup_steps:
            return "warming up"
        if self.rank_phase == "step":
            return "compiling" if self.compiles else "warming up"
        return "setting up" if self.rank_phase == "setup" else "starting"

    @property
    def measured_s(self) -> float:
        """Seconds of the measured window so far, on the burst's clock (rank 0's last measured step)."""
        if self.window_start is None or self.last_measured_t is None:
            return 0.0
        return max(0.0, self.last_measured_t - self.window_start)

    def view(self, elapsed_s: float) -> ProgressView:
        """The display's numbers, ``elapsed_s`` seconds after the burst was started (the caller's clock)."""
        if self.steps is not None:
            return ProgressView(self.phase, elapsed_s, self.measured_steps, self.steps, "steps")
        return ProgressView(self.phase, elapsed_s, self.measured_s, self.seconds or 0.0, "s")


def result_line(result: BurstResult, baseline: BurstResult | None) -> str:
    """The one line a finished burst leaves in the terminal: throughput, its lone speed-up marked as one burst's, and
    step time, or why not."""
    name = result.label or result.config.label()
    if not result.ok:
        message = result.error.message if result.error else result.status
        return f"  {name:<10} {result.status}: {message.splitlines()[0]}"
    lone = speedup(result, baseline) if baseline is not None and baseline.ok else None
    # One burst against one: said so, the comparison's interval and verdict follow once it has measured.
    ratio = f"{lone:5.2f}x (1 burst)" if lone is not None else f"{'-':>6}{'':10}"
    step = result.step_time
    step_text = f"{step.median * 1e3:8.2f} ms/step" if step is not None else ""
    return f"  {name:<10} {result.samples_per_s:10,.1f} samples/s {ratio} {step_text}"


class ProgressSeries:
    """Progress lines for a series of bursts, one at a time: ``begin`` a burst, feed ``on_event``, ``end`` it.

    On an interactive terminal (as ``rich`` judges ``stream``) each burst is one live line, redrawn at most
    every ``refresh_s`` (4 Hz: each redraw is CPU the caller takes from the burst) and erased by ``end``,
    so the caller's result line takes its place. Elsewhere a plain line is written when the phase changes
    (at most six per burst), and while one phase lasts, one every ``heartbeat_s``, so a CI log shows a
    cold compile is alive without filling up.
    """

    def __init__(self, kind: str, total: int, *, steps: int | None = None, seconds: float | None = None,
                 stream: IO[str] | None = None, refresh_s: float = 0.25, heartbeat_s: float = 15.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        from rich.console import Console

        self.kind, self.total, self.steps, self.seconds = kind, total, steps, seconds
        self.refresh_s, self.heartbeat_s, self.clock = refresh_s, heartbeat_s, clock
        self.console: Console = Console(file=stream or sys.stdout, highlight=False)
        self.count = 0
        self.title = ""
        self.progress: BurstProgress | None = None
        self.live: Live | None = None
        self.started = self.last_drawn = 0.0

    def begin(self, name: str, config: Config) -> None:
        """Open the next burst's line (closing the previous one, if still open)."""
        self.end()
        self.count += 1
        self.title = f"{self.kind} {self.count}/{self.total} {name}" if self.total > 1 else name
        self.progress = BurstProgress.for_burst(config, steps=self.steps, seconds=self.seconds)
        self.started = self.clock()
        if self.console.is_interactive:
            from rich.live import Live

            self.live = Live(self._renderable(), console=self.console, auto_refresh=False, transient=True)
            self.live.start(refresh=True)
        else:
            self._write()
        self.last_drawn = self.started

    def on_event(self, event: object) -> None:
        """Pass to ``run_burst(on_event=...)``: updates the state, redraws when the phase changed or it is time."""
        if self.progress is None:
            return
        changed = self.progress.update(event)
        now = self.clock()
        if self.live is not None:
            if changed or now - self.last_drawn >= self.refresh_s:
                self.live.update(self._renderable(), refresh=True)
                self.last_drawn = now
        elif changed or now - self.last_drawn >= self.heartbeat_s:
            self._write()
            self.last_drawn = now

    def end(self) -> None:
        """Close the open line, if any: the live line is erased, for the result line to take its place."""
        if self.live is not None:
            self.live.stop()
            self.live = None
        self.progress = None

    def _view(self) -> ProgressView:
        assert self.progress is not None
        return self.progress.view(self.clock() - self.started)

    def _write(self) -> None:
        self.console.file.write(f"  {self.title}{_SEPARATOR}{self._view().text()}\n")
        self.console.file.flush()

    def _renderable(self) -> RenderableType:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        view = self._view()
        line = Table.grid(padding=(0, 1))
        line.add_row(f"  {self.title}{_SEPARATOR}{view.text()}",
                     ProgressBar(total=1.0, completed=view.fraction, width=12))  # an 80-column line holds both
        return line
