"""How a search runs each of its many bursts: one value the tuner, the sweep, the batch-size finder, the ladder and
re-measures hand down instead of the same five parameters each."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..engine.launcher import BurstError, run_burst
from ..inputs.workload import Workload
from ..knobs.config import Config
from ..results.burst import BurstResult

Engine = Callable[..., BurstResult]


@dataclass(frozen=True)
class Bursts:
    """Bursts through ``engine`` (:func:`~accel_widgets.engine.launcher.run_burst`, or anything that takes its
    ``steps``, ``seconds``, ``label``, ``stop`` and ``on_event``),
    each ``steps`` measured steps or ``seconds`` of measuring (neither: the engine's default), ending early when
    ``stop`` is set."""

    engine: Engine = run_burst
    steps: int | None = None
    seconds: float | None = None
    stop: threading.Event | None = None

    def run(self, workload: Workload, config: Config, *, label: str = "",
            on_event: Callable[[Any], None] | None = None, stop: threading.Event | None = None) -> BurstResult:
        """One burst; a failing one comes back as its failed result (a search judges it, it never raises).
        ``stop`` replaces the search's own for this burst (the batch-size finder's memory watch ends one try)."""
        try:
            return self.engine(workload, config, steps=self.steps, seconds=self.seconds, label=label,
                               stop=stop or self.stop, on_event=on_event)
        except BurstError as exc:
            return exc.result

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def lasting(self, steps: int) -> Bursts:
        """The same bursts, ``steps`` measured steps each."""
        return replace(self, steps=steps, seconds=None)
