"""The one comparison engine: every speed-up anywhere is an interleaved, repeated measurement with an interval.

``compare(workload, a, b)`` measures ``b`` against ``a``; :func:`measure_pairs` does the same for several configs at
once (the ladder's rungs, each against the one before and the baseline). How:

- Each config gets a :class:`~accel_widgets.search.bursts.Contender`: its first window is an ordinary burst; with the
  default engine its ranks then stay (:class:`~accel_widgets.engine.held.HeldBurst`), so later windows pay neither
  process start nor compile, only a rebuild of the training state. The first bursts show at once but are in no
  block: they ran on a fresh process's state, where every repeat runs on state rebuilt behind a random heap spacer.
- Windows run in blocks that sweep the configs forward and back (A B B A, then B A A B; A B C C B A for three):
  every config's positions in a block have the same mean, so a drift of the machine that is linear over the block
  cancels from every pair's difference. A block's observation for a pair is the difference of the two configs'
  mean log rates (:func:`~accel_widgets.metrics.sequential.block_log_ratio`).
- Window length is sized from the config's first burst so a window averages its steps' noise: at least
  ``WINDOW_S`` of steps, and enough steps that their spread moves the window's rate by <= ``WINDOW_SE``.
- After every block, each pair's interval is an anytime-valid confidence sequence
  (:mod:`accel_widgets.metrics.sequential`): looking after each block does not inflate false alarms. A pair whose
  verdict is settled ("faster", "slower", "same") stops taking windows; a config none of whose pairs is open
  leaves the sweeps, so the repeats go where the verdict is still open.
- A block whose window shared the machine with other load past the unreliable threshold does not count (judged by
  the load, never by the speed it measured) and is measured again.
- Nothing starts that would end past ``budget_s`` at the durations measured so far; what is open then is
  "undecided", with the interval it reached.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..engine.launcher import Engine, run_burst
from ..engine.outcome import BurstError
from ..engine.request import BurstOptions
from ..inputs.workload import Workload
from ..knobs.base import Part
from ..knobs.config import Config
from ..results.burst import BurstResult
from ..results.comparison import Block, Comparison, too_loaded
from .bursts import Bursts, Contender

#: A window measures at least this long, so a hiccup of the machine (a GC, another tenant's burst) is averaged.
WINDOW_S = 1.0
#: ... and enough steps that their spread moves its mean step by at most this share (relative standard error).
WINDOW_SE = 0.01
#: ... but no longer than this many times ``window_s`` (3 s for a lone comparison's 1 s windows, 1.5 s for a ladder's
#: 0.5 s): more, shorter windows beat fewer, longer ones against drift, and a ladder's block holds every rung twice.
MAX_WINDOW_S = 3.0
MIN_WINDOW_STEPS = 3
#: A window ends once it has run this many times its planned length: sized from a first burst on a quiet machine, it
#: must not run 20x that when the machine slows (the budget is judged between windows).
WINDOW_CAP = 3.0
DEFAULT_BUDGET_S = 60.0
DEFAULT_MIN_EFFECT = 0.05


def window_steps(first: BurstResult, window_s: float = WINDOW_S) -> int:
    """Steps per window for a config, from its first burst's steps: ``window_s`` of them, more where their spread
    needs more to average (capped at ``MAX_WINDOW_S`` per second of ``window_s``: a five-rung ladder of 0.2 s steps
    whose windows grew to 3 s each had no block fit in the demo's 40 s)."""
    step = first.step_time
    if step is None or step.median <= 0:
        return MIN_WINDOW_STEPS
    spread = step.iqr / 1.349 / step.median
    wanted = max(window_s / step.median, (spread / WINDOW_SE) ** 2)
    longest = MAX_WINDOW_S * window_s / WINDOW_S
    return max(MIN_WINDOW_STEPS, min(math.ceil(wanted), math.ceil(longest / step.median)))


@dataclass
class _Entry:
    """One config in the measurement: its contender, window length and the windows' walls (for the budget)."""

    config: Config
    label: str
    freed: Part | None = None  # the part of its step a headspace variant makes free
    contender: Contender | None = None
    owned: bool = True  # opened here, so closed here
    steps: int = MIN_WINDOW_STEPS
    cap_s: float | None = None  # a window's measuring time at most (WINDOW_CAP times its plan)
    walls: list[float] = field(default_factory=list)
    error: str = ""

    def estimate_s(self) -> float:
        """What its next window will take: the median of its later windows, else its first burst's pace."""
        if self.walls:
            return statistics.median(self.walls)
        first = self.contender.first if self.contender is not None else None
        if first is None or first.step_time is None:
            return WINDOW_S
        warmup = first.warmup_steps + 1
        setup = first.ranks[0].setup_s if first.ranks else 0.0
        return (self.steps + warmup) * first.step_time.median + setup


@dataclass(frozen=True)
class Progress:
    """What a measurement has done so far, for a live view: the comparisons as they stand, each config's first
    burst so far (in the configs' order), windows run, the time used of the budget."""

    comparisons: list[Comparison]
    firsts: list[BurstResult]
    windows: int
    elapsed_s: float
    budget_s: float


@dataclass(frozen=True)
class Measured:
    """What :func:`measure_pairs` measured: a comparison per pair, each config's first burst (None for one that
    never started: a stop came first), and the wall time of it all."""

    comparisons: list[Comparison]
    firsts: list[BurstResult | None]
    wall_s: float


class _Measurement:
    """Configs measured in interleaved blocks until every pair's verdict is settled or the budget is spent."""

    def __init__(self, workload: Workload, entries: list[_Entry], pairs: Sequence[tuple[int, int]], *,
                 budget_s: float, min_effect: float, bursts: Bursts, clock: Callable[[], float],
                 on_progress: Callable[[Progress], None] | None, window_s: float = WINDOW_S,
                 budget_covers_firsts: bool = True) -> None:
        self.workload, self.entries, self.pairs, self.window_s = workload, entries, list(pairs), window_s
        self.budget_s, self.bursts, self.clock, self.on_progress = budget_s, bursts, clock, on_progress
        self.started = clock()
        self.budget_covers_firsts = budget_covers_firsts
        self.windows: list[BurstResult] = []
        self.comparisons = [Comparison(entries[a].config, entries[b].config, min_effect,
                                       reference_label=entries[a].label, subject_label=entries[b].label,
                                       freed=entries[b].freed)
                            for a, b in self.pairs]
        self.stopped = ""

    # -- running windows ---------------------------------------------------------------------------------
    def open(self, index: int, on_event: Callable[[object], None] | None) -> None:
        """The entry's first window (an ordinary burst), unless its contender came open."""
        entry = self.entries[index]
        if entry.contender is None:
            entry.contender = self.bursts.freeing(entry.freed).open(self.workload, entry.config, label=entry.label,
                                                                    on_event=on_event)
        first = entry.contender.first
        self.windows.append(first)
        if not first.ok:
            entry.error = _why(first)
        else:
            entry.steps = window_steps(first, self.window_s)
            step = first.step_time
            entry.cap_s = WINDOW_CAP * entry.steps * step.median if step is not None else None

    def window(self, index: int) -> bool:
        """One more window of the entry; False when it failed (its pairs then end with the error)."""
        entry = self.entries[index]
        assert entry.contender is not None
        before = self.clock()
        try:
            result = entry.contender.measure(entry.steps, label=f"{entry.label} · repeat", stop=self.bursts.stop,
                                             cap_s=entry.cap_s)
        except BurstError as exc:
            result = exc.result
        entry.walls.append(self.clock() - before)
        self.windows.append(result)
        if not result.ok:
            if result.status == "stopped" or self.bursts.stopped():
                self.stopped = "stopped: the stop event was set"
            else:
                entry.error = _why(result)
            return False
        return True

    # -- blocks ----------------------------------------------------------------------------------------
    def open_pairs(self) -> list[int]:
        return [k for k, comparison in enumerate(self.comparisons) if not self._closed(k)]

    def _closed(self, k: int) -> bool:
        a, b = self.pairs[k]
        return self.comparisons[k].settled or bool(self.entries[a].error or self.entries[b].error)

    def active(self) -> list[int]:
        """The entries some open pair still needs, in their order."""
        return sorted({i for k in self.open_pairs() for i in self.pairs[k]})

    def fits(self, indices: Sequence[int], *, each: int = 2) -> bool:
        """Whether ``each`` windows of these entries end within the budget at the pace so far."""
        needed = each * sum(self.entries[i].estimate_s() for i in indices)
        return self.clock() - self.started + needed <= self.budget_s

    def block(self, sweep: Sequence[int]) -> None:
        """Run ``sweep`` forward then back (each entry of it twice) and add the block to every pair measured in it."""
        positions: dict[int, list[int]] = {}
        order = [*sweep, *reversed(sweep)]
        for position, index in enumerate(order):
            if self.bursts.stopped() or self.stopped:
                self.stopped = self.stopped or "stopped: the stop event was set"
                return
            if self.entries[index].error:
                continue
            if not self.fits(order[position:], each=1):  # the pace so far says the block would end past the budget
                self.stopped = self._out_of_budget()
                return
            if self.window(index):
                positions.setdefault(index, []).append(len(self.windows) - 1)
            self._tell()
        self._add_block(positions)

    def _add_block(self, positions: dict[int, list[int]]) -> None:
        for k in self.open_pairs():
            a, b = self.pairs[k]
            mine_a, mine_b = positions.get(a, []), positions.get(b, [])
            if len(mine_a) != 2 or len(mine_b) != 2:
                continue  # a window of the pair failed: its block does not balance
            comparison = self.comparisons[k]
            offset = len(comparison.windows)
            comparison.windows += [self.windows[i] for i in (*mine_a, *mine_b)]
            why = next((w for i in (*mine_a, *mine_b) if (w := too_loaded(self.windows[i]))), "")
            comparison.blocks.append(Block((offset, offset + 1), (offset + 2, offset + 3), why))
        self._tell()

    def _tell(self) -> None:
        if self.on_progress is not None:
            firsts = [e.contender.first for e in self.entries if e.contender is not None]
            self.on_progress(Progress(self.comparisons, firsts, len(self.windows), self.clock() - self.started,
                                      self.budget_s))

    # -- the whole measurement -------------------------------------------------------------------------
    def run(self, on_event: Callable[[object], None] | None) -> Measured:
        try:
            self._run(on_event)
        finally:
            for entry in self.entries:
                if entry.owned and entry.contender is not None:
                    entry.contender.close()
        return self._finish()

    def _run(self, on_event: Callable[[object], None] | None) -> None:
        # The first bursts are in no block: each ran on a fresh process's state, not rebuilt behind a random heap
        # spacer as every repeat is, and carries that process's placement (15-25% here) and its first-in-process
        # costs; one such window in a block of repeats made the interval's spread. The first block sweeps back from
        # the config opened last (those handed in open ran before the rest), so the way there continues from it.
        ran = [i for i, entry in enumerate(self.entries) if entry.contender is not None]
        ran += [i for i in range(len(self.entries)) if i not in ran]
        for index in range(len(self.entries)):
            if self.bursts.stopped():
                self.stopped = "stopped: the stop event was set"
                return
            self.open(index, on_event)
            self._tell()
        if not self.budget_covers_firsts:
            self.started = self.clock()  # the budget is the repeats'
        backwards = True
        while not self.stopped:
            sweep = [index for index in ran if index in self.active()]
            if not sweep:
                return
            if not self.fits(sweep):
                self.stopped = self._out_of_budget()
                return
            self.block(list(reversed(sweep)) if backwards else sweep)
            backwards = not backwards

    def _out_of_budget(self) -> str:
        return (f"budget: {self.clock() - self.started:.1f} s of {self.budget_s:g} s used, and the next block would "
                "not fit at the pace measured so far")

    def _finish(self) -> Measured:
        wall = self.clock() - self.started
        for k, comparison in enumerate(self.comparisons):
            a, b = self.pairs[k]
            comparison.wall_s = wall
            comparison.firsts = [e.contender.first for e in (self.entries[a], self.entries[b]) if e.contender]
            comparison.error = self.entries[a].error or self.entries[b].error
            if comparison.error:
                comparison.stopped = f"failed: {comparison.error}"
            elif comparison.settled:
                comparison.stopped = f"settled after {len(comparison.counted)} blocks"
            else:
                comparison.stopped = self.stopped or "budget"
        firsts = [e.contender.first if e.contender is not None else None for e in self.entries]
        return Measured(self.comparisons, firsts, wall)


def _why(result: BurstResult) -> str:
    return result.error.message.strip().splitlines()[0] if result.error is not None and result.error.message.strip() \
        else f"burst {result.status}"


def measure_pairs(
    workload: Workload,
    configs: Sequence[Config],
    pairs: Sequence[tuple[int, int]],
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    min_effect: float = DEFAULT_MIN_EFFECT,
    steps: int | None = None,
    engine: Engine = run_burst,
    stop: threading.Event | None = None,
    labels: Sequence[str] | None = None,
    opened: dict[int, Contender] | None = None,
    on_event: Callable[[object], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    window_s: float = WINDOW_S,
    timeout_s: float | None = None,
    budget_covers_firsts: bool = True,
    freed: Sequence[Part | None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Measured:
    """Measure ``configs`` interleaved until every pair ``(reference, subject)`` of indices into them has its verdict,
    or ``budget_s`` is spent; one :class:`Comparison` per pair, in their order (:class:`Measured`).
    ``budget_covers_firsts=False`` starts the budget once every config's first burst is in (a ladder's first bursts
    are its rungs, compiles and all; the budget is what the repeats may add).

    ``steps``: the first window's measured steps (the engine's default when None); later windows are sized from
    it to last ``window_s``. ``timeout_s`` bounds each burst (the engine's default when None). ``opened`` maps
    indices to contenders already open (their first window measured: the panel's Run); those stay open for the
    caller, the rest are closed here. ``on_event`` sees the first windows' live events (their
    progress), ``on_progress`` each window and block as it lands. Setting ``stop`` ends it after the running window.
    ``freed``: per config, the part of its step a headspace variant makes free (None: the config as it is).
    """
    _check(budget_s, min_effect)
    if any(not (0 <= a < len(configs) and 0 <= b < len(configs)) or a == b for a, b in pairs):
        raise ValueError(f"pairs name two different configs by index into the {len(configs)} given: got {pairs}")
    names = list(labels) if labels is not None else [config.label() for config in configs]
    parts = list(freed) if freed is not None else [None] * len(configs)
    entries = [_Entry(config, names[i], parts[i]) for i, config in enumerate(configs)]
    for index, contender in (opened or {}).items():
        entries[index].contender, entries[index].owned = contender, False
    timeout = None if timeout_s is None else BurstOptions(timeout_s=timeout_s)  # None: the engine's own timeout
    measurement = _Measurement(workload, entries, pairs, budget_s=budget_s, min_effect=min_effect,
                               bursts=Bursts(engine, steps=steps, stop=stop, options=timeout), clock=clock,
                               on_progress=on_progress, window_s=window_s, budget_covers_firsts=budget_covers_firsts)
    return measurement.run(on_event)


def compare(
    workload: Workload,
    a: Config,
    b: Config,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    min_effect: float = DEFAULT_MIN_EFFECT,
    steps: int | None = None,
    engine: Engine = run_burst,
    stop: threading.Event | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> Comparison:
    """``b`` against ``a`` (the reference): interleaved windows until the verdict is settled or ``budget_s`` is spent.

    Returns a :class:`~accel_widgets.results.comparison.Comparison`: ``ratio`` (b's samples/s over a's),
    ``interval`` (its 95% anytime-valid confidence sequence, :mod:`accel_widgets.metrics.sequential`), ``verdict``
    ("faster", "slower", "same": the interval inside 1 ± ``min_effect``, or "undecided"), every window it ran, and
    ``interval.detectable``, the smallest effect it could have told from none. ``steps``: the first bursts'
    measured steps; ``engine`` is called like :func:`~accel_widgets.run_burst` (the default holds each config's ranks
    between windows). Bad arguments raise before any process starts.
    """
    for name, config in (("a", a), ("b", b)):
        if not isinstance(config, Config):
            raise TypeError(f"{name} must be an accel_widgets.Config, got {type(config).__name__}")
    return measure_pairs(workload, [a, b], [(0, 1)], budget_s=budget_s, min_effect=min_effect, steps=steps,
                         engine=engine, stop=stop, on_progress=on_progress).comparisons[0]


def _check(budget_s: float, min_effect: float) -> None:
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0 or math.isinf(budget_s):
        raise ValueError(f"budget_s={budget_s!r} is invalid: use a finite number of seconds > 0")
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)) or not 0 < min_effect < 1:
        raise ValueError(f"min_effect={min_effect!r} is invalid: use a fraction between 0 and 1, e.g. 0.05 for 5%")

