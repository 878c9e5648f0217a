"""How a search runs each of its many bursts: one value the tuner, the sweep, the batch-size finder, the ladder and
comparisons hand down instead of the same five parameters each; and the configs a comparison measures again and
again (:class:`Contender`). The engine is any :class:`~accel_widgets.engine.launcher.Engine`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..engine.held import HeldBurst
from ..engine.launcher import Engine, added_options, run_burst
from ..engine.outcome import BurstError
from ..engine.request import BurstOptions
from ..inputs.workload import Workload
from ..knobs.base import Part
from ..knobs.config import Config
from ..results.burst import BurstResult


class Contender(Protocol):
    """One config a comparison measures window after window: its first window (an ordinary burst) and more on
    request, until closed. :meth:`measure` raises a :class:`~accel_widgets.engine.outcome.BurstError` when a
    window fails."""

    config: Config
    first: BurstResult

    def measure(self, steps: int, *, label: str = "", stop: threading.Event | None = None,
                cap_s: float | None = None) -> BurstResult: ...

    def close(self) -> None: ...


@dataclass
class FreshBursts:
    """A contender whose every window is a burst of its own through ``engine``: what an engine other than
    ``run_burst`` gives (a :class:`~accel_widgets.engine.launcher.BurstEngine`, a fake), paying setup and compile
    each time.
    A window is bound by its steps (an engine takes steps or seconds, not both), so ``cap_s`` is not applied.
    ``options``: those the search adds to every burst (:attr:`Bursts.options`)."""

    engine: Engine
    workload: Workload
    config: Config
    first: BurstResult
    options: BurstOptions | None = None

    def measure(self, steps: int, *, label: str = "", stop: threading.Event | None = None,
                cap_s: float | None = None) -> BurstResult:
        result = self.engine(self.workload, self.config, steps=steps, seconds=None, label=label, stop=stop,
                             on_event=None, **added_options(self.options))
        if not result.ok:
            raise BurstError(result.error.message if result.error is not None else f"burst {result.status}", result)
        return result

    def close(self) -> None:
        """Nothing is held between its windows."""


@dataclass
class Failed:
    """A config whose first window did not finish: nothing to measure again."""

    config: Config
    first: BurstResult

    def measure(self, steps: int, *, label: str = "", stop: threading.Event | None = None,
                cap_s: float | None = None) -> BurstResult:
        raise BurstError(f"the first burst of {self.config.label()} did not finish", self.first)

    def close(self) -> None:
        """Nothing was started that is still running."""


@dataclass(frozen=True)
class Bursts:
    """Bursts through ``engine`` (:func:`~accel_widgets.engine.launcher.run_burst`, or any other
    :class:`~accel_widgets.engine.launcher.Engine`), each ``steps`` measured steps or ``seconds`` of measuring
    (neither: the engine's default), ending early when ``stop`` is set. ``options``: what the search adds to every
    burst's options (a timeout it was given, a headspace's freed part); None adds nothing, and the engine is then
    not given ``options`` at all, so one that fixes its own (a ``partial``) keeps them."""

    engine: Engine = run_burst
    steps: int | None = None
    seconds: float | None = None
    stop: threading.Event | None = None
    options: BurstOptions | None = None

    def run(self, workload: Workload, config: Config, *, label: str = "",
            on_event: Callable[[Any], None] | None = None, stop: threading.Event | None = None) -> BurstResult:
        """One burst; a failing one comes back as its failed result (a search judges it, it never raises).
        ``stop`` replaces the search's own for this burst (the batch-size finder's memory watch ends one try)."""
        try:
            return self.engine(workload, config, steps=self.steps, seconds=self.seconds, label=label,
                               stop=stop or self.stop, on_event=on_event, **added_options(self.options))
        except BurstError as exc:
            return exc.result

    def open(self, workload: Workload, config: Config, *, label: str = "",
             on_event: Callable[[Any], None] | None = None) -> Contender:
        """A contender for ``config``, its first window measured (this search's length) like :meth:`run`'s burst.

        The default engine holds its ranks between windows (:class:`~accel_widgets.engine.held.HeldBurst`: setup and
        compile paid once); any other engine runs a fresh burst per window. A first window that does not finish
        gives a contender that cannot measure again (its ``first`` says why)."""
        if self.engine is not run_burst:
            first = self.run(workload, config, label=label, on_event=on_event)
            if not first.ok:
                return Failed(config, first)
            return FreshBursts(self.engine, workload, config, first, self.options)
        try:
            held = HeldBurst(workload, config, steps=self.steps, seconds=self.seconds, label=label,
                             on_event=on_event, stop=self.stop, options=self.options)
        except BurstError as exc:
            return Failed(config, exc.result)
        if not held.first.ok:
            held.close()
            return Failed(config, held.first)
        return held

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def freeing(self, part: Part | None) -> Bursts:
        """The same bursts, ``part`` of each step made free (None: the config as it is)."""
        if part is None and self.options is None:  # adding nothing stays adding nothing: the engine's own options hold
            return self
        return replace(self, options=replace(self.options or BurstOptions(), freed=part))

