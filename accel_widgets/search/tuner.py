"""Auto-tuner: search the knob space for the highest samples/s within a time budget.

Why coordinate ascent in the classic order rather than the exhaustive grid: the grid grows as the product
of every knob's values (four knobs of two or three values is already 24 bursts), while the knobs that
matter mostly act on different parts of the step (workers on data wait, precision on compute, the
optimizer and syncs on Python overhead). Walking them one at a time from the best config so far finds
the top of the grid in a fraction of the bursts. The order is the ladder's (:data:`~accel_widgets.knobs.GROUPS`):
the large effects come first, so later knobs are judged on the step they will really run in.

How a candidate is judged: in a duel with the best config so far, measured by the comparison engine
(:mod:`accel_widgets.search.compare`), the one every speed-up of this package comes from.

- The best config's contender stays open from duel to duel (with the default engine its ranks are held: it is set up
  and compiled once, not once per candidate). Each candidate gets its own, opened with an ordinary first burst.
- With ``guard=True`` the guard reads that first burst before any comparison window is spent on the candidate: one
  whose losses leave the fp32 baseline's (:func:`~accel_widgets.analysis.guard.check_training`) is rejected however
  fast it is. "Leave" is judged against what reseeding the baseline's data moves its loss by, measured only when the
  precision's tolerance alone would reject a candidate (random augmentation: loader workers change which draw each
  item gets), once per workload (:func:`measure_noise`).
- The duel is the comparison engine's: after the candidate's first burst (in no block, as every first burst), blocks
  of both configs' windows (best, candidate, candidate, best: balanced, so a linear drift cancels) until the verdict
  against ``MIN_GAIN`` is settled or the duel's budget is spent. A candidate is kept only on "faster";
  "same", "slower" and "undecided" leave the best as it was, each with its interval in the decision's reason.
- A duel may spend an equal share of what is left of the search's budget among the duels still ahead (one per
  direction of each knob left), and never less than room for ``MIN_DUEL_BLOCKS`` blocks at the pace measured (a clear
  effect settles sooner and leaves the rest to the duels after it).
- A knob whose code path never ran in the starting burst (no scaled_dot_product_attention for ``sdpa_backend``, no
  convolution for ``channels_last``: :attr:`~accel_widgets.knobs.Knob.needs`) cannot change the step and is not tried.
- Numeric knobs (and ``compile_mode``, ordered by aggressiveness) walk away from the current value and stop going
  further in a direction at the first value that is not kept.
- A failed window loses the duel with the error as its reason.

The headline is measured, not multiplied: every kept step was kept because it looked good, so the product of their
speed-ups inflates. Once the search ends, the pick is compared with the starting config by the same engine, in the
share of the budget the search keeps for it (``FINAL_BUDGET_SHARE``): :attr:`TuneResult.confirmation`, whose ratio is
:attr:`TuneResult.speedup`. The starting config's contender is held for it where memory allows (``HOLD_SHARE``), else
opened again. No burst or block starts that would end past the budget at the durations measured so far.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from ..analysis.guard import (
    NOISE_RESEEDS,
    GuardVerdict,
    cached_noise,
    check_training,
    find_baseline,
    keep_noise,
    noise_band,
)
from ..analysis.usage import peak_reserved_bytes
from ..engine.launcher import Engine, run_burst
from ..engine.outcome import BurstError
from ..inputs.device import DeviceInfo, probe_device
from ..inputs.workload import Workload
from ..knobs import GROUPS, KNOBS, CodePaths, SearchContext, compiling
from ..knobs.config import Config
from ..knobs.data import data_seed
from ..knobs.rules import ConfigError, check_config, knob_availability
from ..metrics.sequential import min_blocks
from ..results.burst import BurstResult
from ..results.comparison import Comparison
from ..results.headspace import Headspace
from ..results.history import RunHistory, workload_fingerprint
from ..results.noise import NoiseBand
from ..results.tune import TuneResult, TuneStep
from ..views.comparison import outcome_text
from .bursts import Bursts, Contender
from .compare import WINDOW_S, measure_pairs, window_steps

#: Opens a config's contender, its first burst measured: ``opener(workload, config, label)``.
Opener = Callable[[Workload, Config, str], Contender]

#: Smallest speed-up worth a knob, the comparison's margin: a candidate whose interval lies within 1 ± this is "same"
#: (a knob that buys less is not worth keeping), and only "faster" keeps one.
MIN_GAIN = 0.03
#: Share of the budget the search leaves for measuring the pick against the starting config.
FINAL_BUDGET_SHARE = 0.3
#: The fewest blocks a duel is given room for: those after which the interval is finite, the first point where any
#: verdict can be reached (a clear effect settles there; the equal share of the budget gives more where it allows).
MIN_DUEL_BLOCKS = min_blocks()
#: The starting config's ranks stay open for the final comparison only while they take at most this share of the
#: device's memory: during a duel three configs' ranks are alive (the start's, the best's, the candidate's).
HOLD_SHARE = 0.25
#: What a first compiled burst is assumed to cost on top of an eager one before any has run: a cold inductor
#: compile of a small model took 16 s on a 2-core CPU here, ~25 s for ResNet-18 / GPT-124M on an H200.
COMPILE_ALLOWANCE_S = 20.0


def tune(
    workload: Workload,
    *,
    budget_s: float = 120.0,
    knobs: Sequence[str] | Mapping[str, Sequence[Any]] | None = None,
    base: Config | None = None,
    steps: int = 20,
    device: DeviceInfo | None = None,
    engine: Engine = run_burst,
    clock: Callable[[], float] = time.perf_counter,
    guard: bool = True,
    on_step: Callable[[TuneStep], None] | None = None,
    stop: threading.Event | None = None,
    history: RunHistory | None = None,
    opener: Opener | None = None,
    headspace: Headspace | None = None,
) -> TuneResult:
    """Search ``knobs`` for the config with the highest samples/s, starting from ``base`` (``Config()``).

    ``knobs``: knob names (their values come from the registry: the choices, or a few candidates such as
    num_workers 0, 1, 2, 4 ... up to the cores), or a mapping of names to the values to try; values named
    in a mapping are measured even where ``check_config`` warns (fp16 on a CPU without fp16 units), which
    are otherwise skipped. ``None`` searches every knob except those whose owner leaves them out of searches
    (:attr:`~accel_widgets.knobs.Search.left_out`: they change what is trained, or never speed a step up). Knobs
    that cannot act on ``device`` and values ``check_config`` rejects are skipped with the reason in the decisions.

    Each config's first burst runs ``steps`` measured steps through ``engine`` (called like ``run_burst``; the
    default holds each config's ranks between the comparison's windows); the comparison engine sizes the windows after
    it. Nothing starts that would end past ``budget_s`` on ``clock`` at the durations measured so far; the search
    leaves ``FINAL_BUDGET_SHARE`` of it for comparing the pick with the starting config, whose ratio is the result's
    ``speedup``. The starting config's burst always runs; the code paths its step ran decide which knobs can act at
    all (the others are not tried, with the reason). Setting ``stop`` ends the running window and the search. A
    failing burst never raises: it is recorded and the candidate loses. ``history`` keeps the guard's noise band for
    later searches of the same workload (it is kept in this process either way). ``opener(workload, config, label)``
    opens a config's contender in place of ``engine`` (the panel's: each first burst becomes a run of its table).
    ``headspace``: the start's ceilings (:func:`~accel_widgets.search.headspace.headspace`); a knob whose part's
    ceiling reads "same" is not tried, with the reason ("data loading costs at most 3% here: ...").
    """
    device = device or probe_device()
    base = base or Config()
    check_config(base, device)  # a start that cannot run here, or a knob that does not exist, is the caller's
    plan = _plan(knobs)  # error: both raise before any burst
    search = _Search(workload, Bursts(engine, steps=steps, stop=stop), device, clock, budget_s, guard, on_step,
                     history, plan, named=knobs is not None, opener=opener, headspace=headspace)
    try:
        best = search.run(base)
        confirmation = search.confirm(base) if best != base else None
    finally:
        search.close()
    stopped = search.stopped or "done: every knob was searched"
    if confirmation is not None:
        stopped += f"; the pick measured against the start ({confirmation.stopped})"
    elif best != base:
        stopped += f"; {search.unconfirmed or 'stopped'}, so its speed-up over the start is not measured"
    windows = (confirmation.subject_windows, confirmation.reference_windows) if confirmation is not None else ([], [])
    return TuneResult(best, _median_rate(windows[0] or search.bursts, best),
                      _median_rate(windows[1] or search.bursts, base), search.decisions, search.bursts,
                      clock() - search.started, stopped, search.noise, confirmation)


def measure_noise(
    workload: Workload, baseline: BurstResult, *, engine: Engine = run_burst,
    history: RunHistory | None = None, fingerprint: str | None = None, stop: threading.Event | None = None,
) -> NoiseBand | None:
    """What reseeding ``baseline``'s data moves its loss by (a :class:`~accel_widgets.analysis.guard.NoiseBand`, for
    :func:`~accel_widgets.analysis.guard.check_training`): the band kept earlier
    (:func:`~accel_widgets.analysis.guard.cached_noise`), or one measured now and kept in this process and in
    ``history``.

    Measuring runs ``NOISE_RESEEDS`` bursts of the baseline's config, each with another data seed next to the
    workload's (same weights, other data order and augmentation draws), long enough to cover the baseline's
    trajectory. ``engine`` is called like :func:`~accel_widgets.run_burst` (the default: a worker process per
    burst). A burst that fails is left out; ``None`` when none finished or ``stop`` was set: the precision's
    tolerance then stands alone. ``fingerprint`` saves recomputing
    :func:`~accel_widgets.results.history.workload_fingerprint`, which builds the model.
    """
    fingerprint = fingerprint or workload_fingerprint(workload)
    band = cached_noise(fingerprint, baseline, history)
    if band is not None:
        return band
    bursts = Bursts(engine, steps=len(baseline.losses()), stop=stop)  # measured steps covering the baseline's
    reseeded: dict[int, BurstResult] = {}
    for seed in (data_seed(workload) + k for k in range(1, NOISE_RESEEDS + 1)):
        if bursts.stopped():
            return None
        reseeded[seed] = bursts.run(dataclasses.replace(workload, data_seed=seed), baseline.config,
                                    label=f"guard: baseline, data seed {seed}")
    band = noise_band(baseline, reseeded)
    if band is not None:
        keep_noise(fingerprint, baseline, band, history)
    return band


Plan = list[tuple[str, tuple[Any, ...] | None]]


def _plan(knobs: Sequence[str] | Mapping[str, Sequence[Any]] | None) -> Plan:
    """Knob names with their explicit values (``None``: built-in), in the classic order; bad names raise."""
    if knobs is None:
        wanted: dict[str, tuple[Any, ...] | None] = dict.fromkeys(KNOBS)
    elif isinstance(knobs, Mapping):
        wanted = {name: tuple(KNOBS[name].check(v) for v in values) for name, values in knobs.items()}
    else:
        wanted = {KNOBS[name].name: None for name in knobs}
    registry_order = list(KNOBS)
    ordered = sorted(wanted, key=lambda n: (GROUPS.index(KNOBS[n].group), registry_order.index(n)))
    return [(name, wanted[name]) for name in ordered]


@dataclass(eq=False)
class _Tracked:
    """A contender of the search (:class:`~accel_widgets.search.bursts.Contender`): every window it measures lands in
    the search's bursts, and its walls in its own pace. ``first`` is the window the next comparison opens its first
    block with: the first burst, then a window measured just before each later comparison (:meth:`lead`), so no
    comparison reuses a window from minutes before. ``failed`` is the window that failed, after which it measures no
    more."""

    contender: Contender
    search: _Search
    config: Config = field(init=False)
    first: BurstResult = field(init=False)
    walls: list[float] = field(default_factory=list)
    failed: BurstResult | None = None

    def __post_init__(self) -> None:
        self.config, self.first = self.contender.config, self.contender.first
        self.failed = None if _measured(self.first) else self.first

    def measure(self, steps: int, *, label: str = "", stop: threading.Event | None = None,
                cap_s: float | None = None) -> BurstResult:
        before = self.search.clock()
        try:
            result = self.contender.measure(steps, label=label, stop=stop, cap_s=cap_s)
        except BurstError as exc:
            self._record(exc.result, before)
            raise
        self._record(result, before)
        return result

    def _record(self, result: BurstResult, before: float) -> None:
        self.walls.append(self.search.clock() - before)
        self.search.bursts.append(result)
        if not result.ok and self.failed is None:
            self.failed = result

    def window_s(self) -> float:
        """What its next window will take: the median of its windows so far, else its first burst's pace (setup,
        warm-up and a window's steps)."""
        if self.walls:
            return statistics.median(self.walls)
        step = self.first.step_time
        if step is None:
            return WINDOW_S
        setup = self.first.ranks[0].setup_s if self.first.ranks else 0.0
        return (window_steps(self.first) + self.first.warmup_steps + 1) * step.median + setup

    def close(self) -> None:
        self.contender.close()


def _can_hold(first: BurstResult, device: DeviceInfo) -> bool:
    """Whether a config's ranks may stay open while the search goes on: their memory (as its first burst measured it)
    is at most ``HOLD_SHARE`` of the GPU's, or on a CPU of the memory available besides them. Unknown memory is not
    held."""
    held = peak_reserved_bytes(first) or first.peak_memory_bytes
    if not held:
        return False
    if first.memory_kind == "cuda_allocator" and device.gpus:
        return held <= HOLD_SHARE * min(gpu.memory_bytes for gpu in device.gpus)
    return held * first.world_size <= HOLD_SHARE * psutil.virtual_memory().available


class _Search:
    """The state of one tuning run: the contenders open (the start's, the best's), every window so far, the decisions,
    why it stopped."""

    def __init__(self, workload: Workload, bursts: Bursts, device: DeviceInfo, clock: Callable[[], float],
                 budget_s: float, guard: bool, on_step: Callable[[TuneStep], None] | None,
                 history: RunHistory | None, plan: Plan, *, named: bool, opener: Opener | None = None,
                 headspace: Headspace | None = None) -> None:
        self.opener, self.headspace = opener, headspace
        self.workload, self.device, self.history, self.plan, self.named = workload, device, history, plan, named
        self.clock, self.budget_s, self.guard, self.on_step = clock, budget_s, guard, on_step
        self.runner, self.stop = bursts, bursts.stop
        self.noise: NoiseBand | None = None
        self.started = clock()
        self.bursts: list[BurstResult] = []
        self.first_bursts: list[BurstResult] = []  # the guard's baselines: first bursts, as long as a candidate's
        self.firsts: dict[bool, list[float]] = {False: [], True: []}  # first bursts' seconds, by "it compiles"
        self.decisions: list[TuneStep] = []
        self.paths: CodePaths | None = None  # what the starting burst's step ran
        self.start: _Tracked | None = None  # the starting config's contender, while it is held
        self.current: _Tracked | None = None  # the best config's
        self.position = 0  # the knob of the plan being searched
        self.left_here = 0  # its directions still to try, the current one included
        self.stopped = ""
        self.unconfirmed = ""  # why the pick could not be measured against the start

    # -- contenders and the budget ------------------------------------------------------------------
    def open(self, config: Config) -> _Tracked:
        """The config's contender, its first burst run (and recorded) now."""
        before = self.clock()
        label = f"tune: {config.label()}"
        contender = (self.opener(self.workload, config, label) if self.opener is not None
                     else self.runner.open(self.workload, config, label=label))
        self.firsts[compiling.compiled(config)].append(self.clock() - before)
        self.bursts.append(contender.first)
        self.first_bursts.append(contender.first)
        return _Tracked(contender, self)

    def first_s(self, config: Config) -> float:
        """Seconds a first burst of ``config`` will take: the median of the first bursts of its kind (compiled or
        eager) so far; a first compiled one, an eager one's plus ``COMPILE_ALLOWANCE_S``."""
        compiles = compiling.compiled(config)
        same, eager = self.firsts[compiles], self.firsts[False] or self.firsts[True]
        if same:
            return statistics.median(same)
        typical = statistics.median(eager) if eager else 0.0
        return typical + (COMPILE_ALLOWANCE_S if compiles and self.firsts[False] else 0.0)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def search_left(self) -> float:
        """Seconds the search may still spend, less the share kept for measuring the pick against the start."""
        return self.budget_s * (1 - FINAL_BUDGET_SHARE) - self.elapsed()

    @staticmethod
    def floor_s(a: _Tracked, b: _Tracked | None = None) -> float:
        """Room for ``MIN_DUEL_BLOCKS`` blocks of two configs (each block: two windows of each), at their pace (``b``
        unknown yet: at ``a``'s)."""
        return MIN_DUEL_BLOCKS * 2 * (a.window_s() + (b or a).window_s())

    def fits(self, seconds: float, what: str) -> bool:
        """Whether ``seconds`` more fit the search's share of the budget; says why not (or that a stop came)."""
        if self.stop is not None and self.stop.is_set():
            self.stopped = "stopped: the stop event was set"
            return False
        if seconds > self.search_left():
            self.stopped = (f"budget: {self.elapsed():.1f} s of {self.budget_s:g} s used, and {what} "
                            f"(~{seconds:.1f} s) would not fit (the rest is kept to measure the pick against the "
                            "start)")
            return False
        return True

    def ahead(self, best: Config) -> int:
        """The duels still ahead, the one about to run included, counted on ``best``: one per direction of each knob
        still to search (a value further in a direction is tried only after the one before it was kept, and a kept
        one settled as "faster", which a clear effect does in few blocks)."""
        later = self.plan[self.position + 1:]
        return self.left_here + sum(len(self.choices(name, values, best)[0]) for name, values in later)

    def duel_budget(self, candidate: _Tracked) -> float:
        """What the duel may spend: an equal share of what is left among the duels ahead, at least room for
        ``MIN_DUEL_BLOCKS`` blocks, at most what is left."""
        assert self.current is not None
        left = self.search_left()
        return min(left, max(left / max(1, self.ahead(self.current.config)), self.floor_s(self.current, candidate)))

    def ready(self, contender: _Tracked) -> _Tracked:
        """``contender`` able to measure the next comparison's windows: as it is, or, where a window of it failed, the
        config opened again. A stop leaves it as it is."""
        if contender.failed is None:
            return contender
        if self.stop is not None and self.stop.is_set():
            return contender
        contender.close()
        fresh = self.open(contender.config)
        if self.start is contender:
            self.start = fresh
        if self.current is contender:
            self.current = fresh
        return fresh

    # -- the guard ----------------------------------------------------------------------------------
    @functools.cached_property
    def fingerprint(self) -> str:
        """The workload's, for the guard's noise band: computed (it builds the model) only once one is needed."""
        return workload_fingerprint(self.workload)

    def guard_verdict(self, run: BurstResult) -> GuardVerdict | None:
        """The guard's verdict on ``run``; ``None`` when it needs a noise band whose bursts do not fit the budget.

        The precision's tolerance is asked first: what passes it passes any band (a band only widens the
        tolerance), so the band's bursts are spent only on a candidate it would reject for its trajectory
        alone (not for NaN, a skipping scaler or frozen augmentation), and once per workload.
        """
        baseline = find_baseline(run, self.first_bursts)
        verdict = check_training(run, baseline)
        if baseline is None or not verdict.beyond_tolerance or check_training(run, None).status == "changes_training":
            return verdict
        noise = cached_noise(self.fingerprint, baseline, self.history)
        if noise is None:
            assert self.current is not None
            needed = NOISE_RESEEDS * self.first_s(baseline.config) + self.floor_s(self.current)
            if not self.fits(needed, f"the guard's noise band ({NOISE_RESEEDS} bursts) and the duel after it"):
                return None
            noise = measure_noise(self.workload, baseline, engine=self.runner.engine, history=self.history,
                                  fingerprint=self.fingerprint, stop=self.stop)
        if noise is None:
            return verdict
        self.noise = noise
        return check_training(run, baseline, noise)

    def record(self, step: TuneStep) -> TuneStep:
        self.decisions.append(step)
        if self.on_step is not None:
            self.on_step(step)
        return step

    # -- the search -----------------------------------------------------------------------------
    def run(self, base: Config) -> Config:
        """Open the starting config, then search the plan's knobs in order; returns the best config found."""
        if self.stop is not None and self.stop.is_set():
            self.stopped = "stopped: the stop event was set"
            return base
        start = self.open(base)
        if start.failed is not None:
            self.stopped = f"the starting config's burst did not finish: {_error(start.first)}"
            start.close()
            return base
        self.paths = start.first.code_paths
        self.start = self.current = start
        for position, (name, values) in enumerate(self.plan):
            if self.stopped:
                break
            self.position = position
            self.tune_knob(name, values)
        return self.current.config

    def choices(self, name: str, values: tuple[Any, ...] | None, best: Config) -> tuple[list[list[Any]], str]:
        """The groups of values to try for knob ``name`` from ``best`` (a value not kept ends its group), or why
        none is tried."""
        available, why = knob_availability(name, self.device)
        if not available:
            return [], f"skipped: {why}"
        idle = KNOBS[name].idle_on(self.paths) if self.paths is not None else ""
        if idle:
            return [], f"not tried: {idle}: it cannot change this step"
        closed = self.headspace.closes(name) if self.headspace is not None else None
        if closed is not None:
            return [], f"not tried: {closed.closed_text}"
        left_out = KNOBS[name].search.left_out
        if not self.named and left_out:
            return [], f"left out: {left_out}; name it in knobs= to search it"
        context = SearchContext(best, self.workload, self.device)
        return _directions(name, values if values is not None else candidate_values(name, context), context), ""

    def tune_knob(self, name: str, values: tuple[Any, ...] | None) -> None:
        """Try ``name``'s values against the best config, keeping each that is faster."""
        assert self.current is not None
        directions, why = self.choices(name, values, self.current.config)
        if why:
            self.record(TuneStep(name, None, False, why))
            return
        for index, direction in enumerate(directions):
            self.left_here = len(directions) - index
            kept = False
            for value in direction:
                step = self.try_value(name, value, explicit=values is not None)
                if step is None:
                    return
                if step.accepted:
                    kept = True
                elif step.results:
                    break  # measured and not kept: further in this direction is not tried
            if kept and is_ordered(name):
                return  # it gained going this way, so going the other way would lose

    def try_value(self, name: str, value: Any, *, explicit: bool) -> TuneStep | None:
        """The step for one value (skipped, or measured in a duel); ``None`` once the search has to stop."""
        assert self.current is not None
        best = self.current.config
        candidate = best.replace(**{name: value})
        try:
            warnings = check_config(candidate, self.device)
        except ConfigError as exc:
            return self.record(TuneStep(name, value, False, f"skipped: {exc}"))
        new = [w for w in warnings if w not in check_config(best, self.device)]
        if new and not explicit:
            return self.record(TuneStep(name, value, False, f"skipped: {new[0]} (name the value in knobs={{...}} to "
                                        "measure it anyway)"))
        if not self.fits(self.first_s(candidate) + self.floor_s(self.current), "another candidate's first burst and "
                         f"{MIN_DUEL_BLOCKS} blocks"):
            return None
        mark = len(self.bursts)
        contender = self.open(candidate)
        step = None
        try:
            step = self.duel(name, value, contender, mark)
        finally:
            if step is None or not step.accepted:
                contender.close()
        return None if step is None else self.record(step)

    def duel(self, name: str, value: Any, candidate: _Tracked, mark: int) -> TuneStep | None:
        """Judge the candidate (its first burst opened): the guard first, then the comparison with the best config."""
        def step(accepted: bool, reason: str, comparison: Comparison | None = None) -> TuneStep:
            return TuneStep(name, value, accepted, reason, self.bursts[mark:], comparison)

        if candidate.failed is not None:
            return step(False, f"burst {candidate.failed.status}: {_error(candidate.failed)}")
        if self.guard:
            verdict = self.guard_verdict(candidate.first)
            if verdict is None:
                return None
            if verdict.status in ("changes_training", "cannot_tell"):  # a pick must be known to train the same
                said = "changes training" if verdict.status == "changes_training" else "training not checked"
                return step(False, f"{said}: " + "; ".join(verdict.reasons))
        assert self.current is not None
        deadline = self.clock() + self.duel_budget(candidate)
        current = self.ready(self.current)
        if current.failed is not None:
            return step(False, f"not judged: a burst of the current config did not finish ({_error(current.failed)})")
        comparison = self.compare((candidate, current), 1, deadline - self.clock())
        if comparison is None:
            return step(False, "not judged: the duel's budget ran out before its first block")
        if comparison.stopped.startswith("stopped"):
            self.stopped = comparison.stopped
        if comparison.error:
            failed = candidate.failed or current.failed
            whose = "burst" if candidate.failed is not None else "not judged: a burst of the current config"
            return step(False, f"{whose} {failed.status if failed else 'failed'}: {comparison.error}", comparison)
        accepted = comparison.verdict == "faster"
        if accepted:
            self.promote(candidate)
        return step(accepted, _reason(comparison), comparison)

    def compare(self, pair: tuple[_Tracked, _Tracked], reference: int, budget_s: float) -> Comparison | None:
        """The config of ``pair[1 - reference]`` against ``pair[reference]`` by the comparison engine, both open (their
        first bursts in no block); None when no budget is left for it."""
        if budget_s <= 0:
            return None
        measured = measure_pairs(self.workload, [c.config for c in pair], [(reference, 1 - reference)],
                                 budget_s=budget_s, min_effect=MIN_GAIN, engine=self.runner.engine, stop=self.stop,
                                 labels=[f"tune: {c.config.label()}" for c in pair], opened=dict(enumerate(pair)),
                                 clock=self.clock)
        return measured.comparisons[0]

    def promote(self, candidate: _Tracked) -> None:
        """``candidate`` is the best config now; the one it replaces is closed, unless it is the starting config and
        its memory allows holding it for the final comparison."""
        replaced, self.current = self.current, candidate
        if replaced is None:
            return
        if replaced is self.start and _can_hold(replaced.first, self.device):
            return
        if replaced is self.start:
            self.start = None
        replaced.close()

    def confirm(self, base: Config) -> Comparison | None:
        """The pick against the starting config, by the comparison engine in what is left of the budget; None (with
        the reason in ``unconfirmed``) when it cannot run."""
        best = self.current
        if best is None or (self.stop is not None and self.stop.is_set()):
            return None
        start_s = self.start.window_s() if self.start is not None else self.first_s(base)
        if 3 * (start_s + best.window_s()) > self.budget_s - self.elapsed():  # a fresh window of each, one block
            self.unconfirmed = "no time was left for a block of the pick and the start"
            return None
        if self.start is None:
            self.start = self.open(base)  # its first burst is the fresh window
        else:
            self.ready(self.start)
        start = self.start
        if start.failed is not None:
            self.unconfirmed = f"the starting config's burst did not finish ({_error(start.failed)})"
            return None
        best = self.ready(best)
        if best.failed is not None:
            self.unconfirmed = f"the pick's burst did not finish ({_error(best.failed)})"
            return None
        comparison = self.compare((start, best), 0, self.budget_s - self.elapsed())
        if comparison is None:
            self.unconfirmed = "no time was left for a block"
        return comparison

    def close(self) -> None:
        """End every contender still open."""
        for contender in {id(c): c for c in (self.start, self.current) if c is not None}.values():
            contender.close()


def _reason(comparison: Comparison) -> str:
    """A duel's verdict in words, with its interval: why the candidate was kept or not."""
    words = outcome_text(comparison)
    if comparison.verdict == "same":
        return f"no gain worth keeping: {words}"
    if comparison.verdict != "undecided":
        return words
    if comparison.stopped.startswith("budget"):
        return f"{words}, the budget ran out"
    return f"{words}; {comparison.stopped}"


# -- candidate values ---------------------------------------------------------------------------------
def candidate_values(name: str, context: SearchContext) -> tuple[Any, ...]:
    """The values a search tries for knob ``name``: its owner's candidates (:attr:`Knob.search`), else its
    choices or both booleans; always within the knob's range."""
    knob = KNOBS[name]
    declared = knob.search.values
    if declared is None:
        values = knob.choices if knob.choices is not None else (False, True) if knob.kind is bool else ()
    else:
        values = declared(context) if callable(declared) else declared
    return tuple(v for v in values if v is None or ((knob.minimum is None or v >= knob.minimum)
                                                    and (knob.maximum is None or v <= knob.maximum)))


def is_ordered(name: str) -> bool:
    """Whether the knob's values have a direction a search walks (numeric knobs, unless the owner says)."""
    knob = KNOBS[name]
    return knob.search.ordered if knob.search.ordered is not None else knob.kind in (int, float)


def _directions(name: str, values: tuple[Any, ...], context: SearchContext) -> list[list[Any]]:
    """Values to try, grouped so a loss ends the group: ordered knobs up then down, others one group each."""
    knob = KNOBS[name]
    now = getattr(context.config, name)
    if not is_ordered(name):
        return [[v] for v in dict.fromkeys(values) if v != now]

    def key(value: Any) -> float:
        if knob.search.rank is not None:
            return knob.search.rank(value, context)
        if knob.choices is not None:
            return knob.choices.index(value)
        return value

    unique = sorted(dict.fromkeys(values), key=key)
    up = [v for v in unique if key(v) > key(now)]
    down = [v for v in reversed(unique) if key(v) < key(now)]
    return [d for d in (up, down) if d]


# -- reading results ------------------------------------------------------------------------------------
def _rate(result: BurstResult) -> float:
    return result.samples_per_s or 0.0


def _measured(result: BurstResult) -> bool:
    """Finished, with a throughput to compare (a stopped or failed burst has none worth comparing)."""
    return result.ok and _rate(result) > 0


def _error(result: BurstResult) -> str:
    return result.error.message if result.error is not None else f"status {result.status}, no throughput"


def _median_rate(bursts: list[BurstResult], config: Config) -> float | None:
    rates = [_rate(b) for b in bursts if b.config == config and _measured(b)]
    return statistics.median(rates) if rates else None
