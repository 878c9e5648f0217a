"""A burst whose ranks stay: the first measured window as :func:`~accel_widgets.engine.launcher.run_burst` gives it,
then one more window each time it is asked, until it is closed.

Why: a comparison measures each config many times, interleaved with the others (:mod:`accel_widgets.search.compare`).
Starting a burst afresh for each repeat pays the process start, the setup and, with ``torch.compile``, a compile
each time (7 s against a 1 s window for the demos on this CPU, with a warm cache); a held rank pays them once. Each
later window still trains on state built afresh (:func:`~accel_widgets.engine.worker._measure_held` says why), so
repeats stay independent draws of the config's speed rather than one process's luck measured again.

Between windows the ranks wait on a pipe, idle, their telemetry paused: another config's window meanwhile shares
the machine with nothing of theirs but their memory. Held ranks die with their owner like any rank, and
:meth:`HeldBurst.close` (or leaving the ``with`` block) ends them and everything they started.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from ..inputs.workload import Workload
from ..knobs.config import Config
from ..results.burst import BurstResult
from .events import MeasureAgain
from .launcher import pickle_workload, prepare_burst
from .outcome import finish, oom_kill_count
from .ranks import EXIT_GRACE_S, Collected, Event, RankGroup, shielded
from .request import BurstOptions, BurstRequest, BurstRequestError


class HeldBurst:
    """One config's ranks, kept to measure window after window.

    Opening it runs the burst's first window exactly as ``run_burst(workload, config, steps=..., ...)`` does and
    keeps that result in :attr:`first` (a first window that fails raises the same :class:`BurstError` subclass,
    after everything is ended). :meth:`measure` then has every rank build its training state afresh, warm it up and
    measure ``steps`` more steps; the window's result is a :class:`BurstResult` like any burst's, on the same clock
    as the first. A window that fails, times out or is stopped ends the held ranks (:attr:`alive` turns False).
    ``options`` are ``run_burst``'s (``freed`` holds a headspace variant of the config), but for the isolation: held
    ranks are processes.
    """

    def __init__(self, workload: Workload, config: Config | None = None, *, steps: int | None = None,
                 seconds: float | None = None, on_event: Callable[[Event], None] | None = None,
                 stop: threading.Event | None = None, label: str = "", options: BurstOptions | None = None) -> None:
        if not isinstance(config, Config | None):
            raise TypeError(f"config must be an accel_widgets.Config, got {type(config).__name__}")
        request = BurstRequest(steps, seconds, options or BurstOptions())
        if request.options.isolation != "process":
            raise BurstRequestError("a held burst keeps its ranks as processes: isolation='inprocess' cannot be held")
        if request.options.cluster is not None:
            raise BurstRequestError("a held burst keeps its ranks on this machine: a cluster runs one-off bursts")
        called_at = time.perf_counter()
        spec, result = prepare_burst(workload, config, request, called_at=called_at, label=label)
        self._template = dataclasses.replace(result, warnings=list(result.warnings))
        self._ranks = RankGroup(spec, held=True)
        self._timeout_s = request.options.timeout_s
        self._windows = 0
        self.alive = False
        self.first = self._open(workload, result, on_event, stop, called_at)

    @property
    def config(self) -> Config:
        return self._template.config

    @property
    def warmup_steps(self) -> int:
        """The warm-up a window gets by default: the config's own (more when compiling)."""
        return self._template.warmup_steps

    def _open(self, workload: Workload, result: BurstResult, on_event: Callable[[Event], None] | None,
              stop: threading.Event | None, called_at: float) -> BurstResult:
        collected = Collected(oom_kills_before=oom_kill_count())
        try:
            payload, notes = pickle_workload(workload, self._ranks.spec)
            result.warnings.extend(notes)
            self._template.warnings.extend(notes)
            self._ranks.start(payload)
            outcome = self._ranks.collect(collected, on_event, stop, called_at + self._timeout_s)
        except BaseException:
            shielded(lambda: self._ranks.tear_down(collected), reraise_interrupt=False)
            raise
        return self._settle(result, collected, outcome, called_at)

    def measure(self, steps: int, *, warmup_steps: int | None = None, on_event: Callable[[Event], None] | None = None,
                stop: threading.Event | None = None, label: str = "", cap_s: float | None = None) -> BurstResult:
        """One more window of ``steps`` measured steps after ``warmup_steps`` (default: the config's), on training
        state built afresh; a single rank stops early once ``cap_s`` seconds of them have passed (a window sized on
        a quiet machine must not run 20x its length when the machine slows: a budget is judged between windows).
        Raises like ``run_burst`` when it fails (and the ranks are then gone)."""
        if not self.alive:
            raise RuntimeError("this held burst's ranks are gone (closed, failed or stopped): open a new one")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps={steps!r} is invalid: use an integer >= 1")
        self._windows += 1
        warmup = warmup_steps or self.warmup_steps
        result = dataclasses.replace(self._template, warmup_steps=warmup, warnings=list(self._template.warnings),
                                     environment=dict(self.first.environment),
                                     label=label or self._template.label)
        called_at = time.perf_counter()
        collected = Collected(oom_kills_before=oom_kill_count())
        try:
            self._ranks.measure_again(MeasureAgain(self._windows, steps, warmup, cap_s))
            outcome = self._ranks.collect(collected, on_event, stop, called_at + self._timeout_s)
        except BaseException:
            self.alive = False
            shielded(lambda: self._ranks.tear_down(collected), reraise_interrupt=False)
            raise
        result.telemetry = collected.telemetry
        return self._settle(result, collected, outcome, called_at)

    def _settle(self, result: BurstResult, collected: Collected, outcome: str, called_at: float) -> BurstResult:
        """The window's result; ranks that did not deliver it are ended first (then it raises or says why)."""
        if outcome == "delivered":
            self.alive = True
            self._ranks.pause()
            if not result.telemetry:
                result.telemetry = collected.telemetry
        else:
            self.alive = False
            shielded(lambda: setattr(result, "telemetry", self._ranks.tear_down(collected)), reraise_interrupt=True)
        return finish(result, collected, outcome, called_at, self._timeout_s)

    def close(self) -> None:
        """Tell the ranks to finish, give them a moment to leave cleanly, then end whatever is left. Idempotent."""
        if self._ranks.ended:
            return

        alive, self.alive = self.alive, False

        def end() -> None:
            if alive:
                self._ranks.finish(EXIT_GRACE_S)
            self._ranks.tear_down(Collected())

        shielded(end, reraise_interrupt=True)

    def __enter__(self) -> HeldBurst:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
