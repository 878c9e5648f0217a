"""Auto-tuner: search the knob space for the highest samples/s within a time budget.

Why coordinate ascent in the classic order rather than the exhaustive grid: the grid grows as the product
of every knob's values (four knobs of two or three values is already 24 bursts), while the knobs that
matter mostly act on different parts of the step (workers on data wait, precision on compute, the
optimizer and syncs on Python overhead). Walking them one at a time from the best config so far finds
the top of the grid in a fraction of the bursts. The order is the ladder's (:data:`~accel_widgets.knobs.GROUPS`):
the large effects come first, so later knobs are judged on the step they will really run in.

How a candidate is judged on a machine whose speed drifts (other jobs, clocks, caches):

- interleaved A/B: current, candidate, current (, candidate, current ...), each candidate burst against
  the mean of the current bursts either side of it, so a linear drift cancels;
- it is accepted only when its median speedup clears both ``MIN_GAIN`` and the noise, estimated from the
  bursts' own step-time spread and, after repeats, from the spread between rounds;
- a gain is accepted only once it held over ``CONFIRM_ROUNDS`` rounds (one lucky round is how a knob that
  cannot act "won" +35%); a clear loss needs one; a close contender is repeated, up to ``MAX_ROUNDS`` rounds;
- a burst whose numbers cannot rank a knob (:attr:`~accel_widgets.results.burst.BurstResult.reliability`: a step
  spread or other load past the thresholds) is measured again, never compared;
- a knob whose code path never ran in the starting burst (no scaled_dot_product_attention for
  ``sdpa_backend``, no convolution for ``channels_last``: :attr:`~accel_widgets.knobs.Knob.needs`) cannot
  change the step and is not tried;
- numeric knobs (and ``compile_mode``, ordered by aggressiveness) walk away from the current value and
  stop going further in a direction at the first value that does not win;
- a failed burst is a loss with the error as its reason; with ``guard=True`` a candidate whose losses
  leave the fp32 baseline's (:func:`~accel_widgets.analysis.guard.check_training`) is rejected however fast it is.
  "Leave" is judged against what reseeding the baseline's data moves its loss by, measured only when the
  precision's tolerance alone would reject a candidate (random augmentation: loader workers change which
  draw each item gets), once per workload (:func:`measure_noise`).

The headline is measured, not multiplied: every accepted step was kept because it looked good, so the
product of their speedups inflates. Once the search ends, the best config and the starting one run as
interleaved pairs (A/B, B/A, ... ``FINAL_PAIRS`` of them where time allows) and the median of the pairs'
ratios, with its spread, is :attr:`TuneResult.speedup`. The search keeps ``FINAL_BUDGET_SHARE`` of the
budget for them, and no burst starts that would end past the budget at the duration bursts of its kind
(compiled or not) took so far.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..analysis.guard import (
    NOISE_RESEEDS,
    GuardVerdict,
    NoiseBand,
    cached_noise,
    check_training,
    find_baseline,
    keep_noise,
    noise_band,
)
from ..engine.launcher import run_burst
from ..inputs.device import DeviceInfo, probe_device
from ..inputs.workload import Workload
from ..knobs import GROUPS, KNOBS, CodePaths, SearchContext, compiling
from ..knobs.config import Config
from ..knobs.data import data_seed
from ..knobs.rules import ConfigError, check_config, knob_availability
from ..results.burst import BurstResult
from ..results.history import RunHistory, workload_fingerprint
from .bursts import Bursts

#: Smallest speedup worth a knob: below it a change is within what the same config moves between bursts
#: on a quiet machine (the repeatability benchmark), and a knob that buys less is not worth keeping.
MIN_GAIN = 0.03
#: Noise estimates are standard errors; a gain must clear this many of them to count.
NOISE_Z = 2.0
#: Rounds (candidate + current burst) a close contender gets before it is rejected as "no clear gain".
MAX_ROUNDS = 3
#: Rounds a gain must hold over before it is accepted: one round can always look good.
CONFIRM_ROUNDS = 2
#: Times a burst that cannot rank a knob (unreliable: a busy machine) is run again before the step is not judged.
REMEASURES = 2
#: Interleaved pairs (starting config, best config) that measure the headline; noisy hosts need ~12
#: (/work/shared/notes/measuring-on-a-noisy-host.md). Fewer where the budget has no room for them.
FINAL_PAIRS = 12
#: Share of the budget the search leaves for the final pairs.
FINAL_BUDGET_SHARE = 0.3
#: What a first compiled burst is assumed to cost on top of an eager one before any has run: a cold inductor
#: compile of a small model took 16 s on a 2-core CPU here, ~25 s for ResNet-18 / GPT-124M on an H200.
COMPILE_ALLOWANCE_S = 20.0

@dataclass(frozen=True)
class TuneStep:
    """One decision: a knob value tried (or skipped) against the best config at that point.

    ``speedup`` is the candidate's median samples/s over the interleaved bursts of the current config
    (``None`` when it was not measured); ``results`` are those bursts in run order, current and candidate
    (the first may be the previous step's last burst, reused because it ran just before).
    """

    knob: str
    value: Any
    accepted: bool
    speedup: float | None
    reason: str
    results: list[BurstResult]


@dataclass(frozen=True)
class PairedComparison:
    """The best config against the starting one, measured side by side: ``ratios`` are the best's samples/s over
    the start's in each interleaved pair (the order alternating: start first, then best first, ...)."""

    ratios: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def spread(self) -> tuple[float, float]:
        """The ratios' interquartile range (the lowest and highest with fewer than four pairs)."""
        if len(self.ratios) < 4:
            return min(self.ratios), max(self.ratios)
        quartiles = statistics.quantiles(self.ratios, n=4, method="inclusive")
        return quartiles[0], quartiles[2]

    def text(self) -> str:
        low, high = self.spread
        return f"{self.median:.2f}x ({low:.2f}-{high:.2f} over {len(self.ratios)} interleaved pairs)"


@dataclass
class TuneResult:
    """The best config found, every decision on the way (``decisions``) and every burst run (``bursts``).

    ``confirmation`` measures the best config against the starting one side by side after the search, and
    :attr:`speedup` is its median ratio; ``best_samples_per_s`` and ``baseline_samples_per_s`` are medians over
    those same pairs (over all bursts of those configs when there are none; ``None`` when none finished).
    ``noise`` is the band the guard judged a candidate by, when one needed it (its reseeded baseline bursts
    count in ``wall_s`` and the budget, but are not in ``bursts``: they trained on other data).
    """

    best: Config
    best_samples_per_s: float | None
    baseline_samples_per_s: float | None
    decisions: list[TuneStep]
    bursts: list[BurstResult]
    wall_s: float
    stopped_reason: str
    noise: NoiseBand | None = None
    confirmation: PairedComparison | None = None

    @property
    def speedup(self) -> float | None:
        """What the best config gains over the starting one: the median ratio of the final interleaved pairs;
        1.0 when the best is the start; None when the pairs could not run (stopped, no time left)."""
        if self.confirmation is not None:
            return self.confirmation.median
        return 1.0 if not self.decisions or not any(s.accepted for s in self.decisions) else None

    def summary(self) -> str:
        """Lines a person reads: the result, then each decision (+ marks the accepted ones)."""
        rates = ", ".join(f"{name} {rate:,.1f} samples/s" for name, rate in
                          (("baseline", self.baseline_samples_per_s), ("best", self.best_samples_per_s))
                          if rate is not None)
        if self.confirmation is not None:
            measured = f"{self.confirmation.text()}; {rates}"
        elif self.speedup is not None:
            measured = f"no knob beat the starting config; {rates}"
        else:
            measured = f"speedup not confirmed side by side; {rates}"
        head = (f"best: {self.best.label()} ({measured}), {len(self.bursts)} bursts in {self.wall_s:.1f} s; "
                f"{self.stopped_reason}")
        return "\n".join([head, *(f"  {'+' if s.accepted else ' '} {s.knob}={s.value!r}: {s.reason}"
                                  for s in self.decisions)])


def tune(
    workload: Workload,
    *,
    budget_s: float = 120.0,
    knobs: Sequence[str] | Mapping[str, Sequence[Any]] | None = None,
    base: Config | None = None,
    steps: int = 20,
    device: DeviceInfo | None = None,
    engine: Callable[..., BurstResult] = run_burst,
    clock: Callable[[], float] = time.perf_counter,
    guard: bool = True,
    on_step: Callable[[TuneStep], None] | None = None,
    stop: threading.Event | None = None,
    history: RunHistory | None = None,
) -> TuneResult:
    """Search ``knobs`` for the config with the highest samples/s, starting from ``base`` (``Config()``).

    ``knobs``: knob names (their values come from the registry: the choices, or a few candidates such as
    num_workers 0, 1, 2, 4 ... up to the cores), or a mapping of names to the values to try; values named
    in a mapping are measured even where ``check_config`` warns (fp16 on a CPU without fp16 units), which
    are otherwise skipped. ``None`` searches every knob except those whose owner leaves them out of searches
    (:attr:`~accel_widgets.knobs.Search.left_out`: they change what is trained, or never speed a step up). Knobs
    that cannot act on ``device`` and values ``check_config`` rejects are skipped with the reason in the decisions.

    Every burst runs ``steps`` measured steps through ``engine`` (called like ``run_burst`` with ``steps``,
    ``label`` and ``stop``). No burst starts once it would end past ``budget_s`` on ``clock`` (at the
    median duration of the bursts of its kind so far); the search leaves ``FINAL_BUDGET_SHARE`` of it for the
    final interleaved pairs of the best and the starting config, whose median ratio is the result's
    ``speedup``. The starting config's burst always runs; the code paths its step ran decide which knobs can
    act at all (the others are not tried, with the reason). Setting ``stop`` ends the running burst and the
    search. A failing burst never raises: it is recorded and the candidate loses. ``history`` keeps the
    guard's noise band for later searches of the same workload (it is kept in this process either way).
    """
    device = device or probe_device()
    base = base or Config()
    check_config(base, device)  # a start that cannot run here, or a knob that does not exist, is the caller's
    plan = _plan(knobs)  # error: both raise before any burst
    search = _Search(workload, Bursts(engine, steps=steps, stop=stop), device, clock, budget_s, guard, on_step,
                     history)
    best = base
    if search.can_run(1):
        start = search.run_reliable(base)
        if not _measured(start):
            search.stopped = f"the starting config's burst did not finish: {_error(start)}"
        search.paths = start.code_paths
    for name, values in plan:
        if search.stopped:
            break
        best = search.tune_knob(name, values, best, named=knobs is not None)
    stopped = search.stopped or "done: every knob was searched"
    confirmation = search.confirm(base, best) if best != base else None
    if confirmation is not None:
        stopped += f"; the pick measured against the start in {len(confirmation.ratios)} interleaved pairs"
    elif best != base:
        stopped += "; no pair of the pick and the start could run, so its speedup is not confirmed"
    pairs = search.final_pairs
    return TuneResult(best, _median_rate(pairs or search.bursts, best), _median_rate(pairs or search.bursts, base),
                      search.decisions, search.bursts, clock() - search.started, stopped, search.noise, confirmation)


def measure_noise(
    workload: Workload, baseline: BurstResult, *, engine: Callable[..., BurstResult] = run_burst,
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


def _plan(knobs: Sequence[str] | Mapping[str, Sequence[Any]] | None) -> list[tuple[str, tuple[Any, ...] | None]]:
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


class _Search:
    """The state of one tuning run: bursts so far, their durations on the clock, the decisions, why it stopped."""

    def __init__(self, workload: Workload, bursts: Bursts, device: DeviceInfo, clock: Callable[[], float],
                 budget_s: float, guard: bool, on_step: Callable[[TuneStep], None] | None,
                 history: RunHistory | None) -> None:
        self.workload, self.device, self.history = workload, device, history
        self.clock, self.budget_s, self.guard, self.on_step = clock, budget_s, guard, on_step
        self.engine = bursts.engine  # the caller's: each burst through it is timed for the budget
        self.runner = replace(bursts, engine=self.timed)
        self.stop = bursts.stop
        self.noise: NoiseBand | None = None
        self.started = clock()
        self.bursts: list[BurstResult] = []
        self.durations: dict[bool, list[float]] = {False: [], True: []}  # seconds per burst, by "it compiles"
        self.decisions: list[TuneStep] = []
        self.final_pairs: list[BurstResult] = []
        self.paths: CodePaths | None = None  # what the starting burst's step ran
        self.stopped = ""

    # -- bursts and the budget ------------------------------------------------------------------
    def estimate(self, config: Config) -> float:
        """Seconds a burst of ``config`` will take: the median of the bursts of its kind (compiled or eager) so
        far; a first compiled one, an eager one's plus ``COMPILE_ALLOWANCE_S``."""
        compiles = compiling.compiled(config)
        same, eager = self.durations[compiles], self.durations[False] or self.durations[True]
        if same:
            return statistics.median(same)
        typical = statistics.median(eager) if eager else 0.0
        return typical + (COMPILE_ALLOWANCE_S if compiles and self.durations[False] else 0.0)

    def can_run(self, bursts: int, config: Config | None = None, *, final: bool = False) -> bool:
        """Whether ``bursts`` more bursts (of ``config``'s kind) fit in the budget, less the share kept for the final
        pairs unless these are them; says why not."""
        if self.stop is not None and self.stop.is_set():
            self.stopped = "stopped: the stop event was set"
            return False
        each = self.estimate(config if config is not None else Config())
        elapsed = self.clock() - self.started
        budget = self.budget_s if final else self.budget_s * (1 - FINAL_BUDGET_SHARE)
        if elapsed + bursts * each > budget:
            kept = "" if final else " (the rest is kept to confirm the pick side by side)"
            self.stopped = (f"budget: {elapsed:.1f} s of {self.budget_s:g} s used, and {bursts} more burst(s) of "
                            f"~{each:.1f} s would not fit{kept}")
            return False
        return True

    def run(self, config: Config) -> BurstResult:
        """One burst of the search; a BurstError becomes its (failed) result."""
        result = self.runner.run(self.workload, config, label=f"tune: {config.label()}")
        self.bursts.append(result)
        return result

    def run_reliable(self, config: Config, *, final: bool = False) -> BurstResult:
        """A burst whose numbers can rank a knob: one that cannot (a busy machine) is run again, up to
        ``REMEASURES`` times while the budget allows; the last one is returned either way."""
        result = self.run(config)
        for _ in range(REMEASURES):
            if not _measured(result) or result.reliability.reliable or not self.can_run(1, config, final=final):
                break
            result = self.run(config)
        return result

    def timed(self, workload: Workload, config: Config, **burst: Any) -> BurstResult:
        """A burst through the caller's engine, its duration counted for the budget (bursts of this search and of
        the guard's noise band alike)."""
        before = self.clock()
        try:
            return self.engine(workload, config, **burst)
        finally:
            self.durations[compiling.compiled(config)].append(self.clock() - before)

    def confirm(self, base: Config, best: Config) -> PairedComparison | None:
        """The best config against the starting one in interleaved pairs, as many as the rest of the budget holds
        (up to ``FINAL_PAIRS``); None when not one pair could run."""
        if self.stop is not None and self.stop.is_set():
            return None
        pair_s = self.estimate(base) + self.estimate(best)
        room = self.budget_s - (self.clock() - self.started)
        planned = min(FINAL_PAIRS, int(room // pair_s) if pair_s > 0 else FINAL_PAIRS)
        ratios = []
        for index in range(planned):
            order = (base, best) if index % 2 == 0 else (best, base)
            pair = {}
            for config in order:
                if not self.can_run(1, config, final=True):
                    break
                pair[config] = self.run_reliable(config, final=True)
            if len(pair) < 2:
                break
            self.final_pairs.extend(pair.values())
            if all(_measured(r) and r.reliability.reliable for r in pair.values()):
                ratios.append(_rate(pair[best]) / _rate(pair[base]))
        return PairedComparison(tuple(ratios)) if ratios else None

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
        baseline = find_baseline(run, self.bursts)
        verdict = check_training(run, baseline)
        if baseline is None or not verdict.beyond_tolerance or check_training(run, None).status == "changes_training":
            return verdict
        noise = cached_noise(self.fingerprint, baseline, self.history)
        if noise is None:
            if not self.can_run(NOISE_RESEEDS + 1):  # the reseeded bursts, then the round's closing burst
                return None
            noise = measure_noise(self.workload, baseline, engine=self.timed, history=self.history,
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
    def tune_knob(self, name: str, values: tuple[Any, ...] | None, best: Config, *, named: bool) -> Config:
        """Try ``name``'s values against ``best``; returns the best config after this knob."""
        available, why = knob_availability(name, self.device)
        if not available:
            self.record(TuneStep(name, None, False, None, f"skipped: {why}", []))
            return best
        idle = KNOBS[name].idle_on(self.paths) if self.paths is not None else ""
        if idle:
            self.record(TuneStep(name, None, False, None, f"not tried: {idle}: it cannot change this step", []))
            return best
        left_out = KNOBS[name].search.left_out
        if not named and left_out:
            self.record(TuneStep(name, None, False, None, f"left out: {left_out}; name it in knobs= to "
                                 "search it", []))
            return best
        explicit = values is not None
        context = SearchContext(best, self.workload, self.device)
        values = values if values is not None else candidate_values(name, context)
        ordered = is_ordered(name)
        for direction in _directions(name, values, context):
            won = False
            for value in direction:
                step = self.try_value(name, value, best, explicit=explicit)
                if step is None:
                    return best
                if step.accepted:
                    best, won = best.replace(**{name: value}), True
                elif step.results:
                    break  # measured and lost: further in this direction is not tried
            if won and ordered:
                break  # it gained going this way, so going the other way would lose
        return best

    def try_value(self, name: str, value: Any, best: Config, *, explicit: bool) -> TuneStep | None:
        """The step for one value (skipped, or measured in a duel); ``None`` once the search has to stop."""
        candidate = best.replace(**{name: value})
        try:
            warnings = check_config(candidate, self.device)
        except ConfigError as exc:
            return self.record(TuneStep(name, value, False, None, f"skipped: {exc}", []))
        new = [w for w in warnings if w not in check_config(best, self.device)]
        if new and not explicit:
            return self.record(TuneStep(name, value, False, None, f"skipped: {new[0]} (name the value in "
                                        "knobs={...} to measure it anyway)", []))
        step = self.duel(name, value, best, candidate)
        return None if step is None else self.record(step)

    def duel(self, name: str, value: Any, current: Config, candidate: Config) -> TuneStep | None:
        """Interleave current, candidate, current ... until the judgement is clear (or rounds/budget run out)."""
        last = self.bursts[-1] if self.bursts else None
        lead = last if last is not None and _measured(last) and last.config == current else None
        if not self.can_run(1, candidate) or not self.can_run(1 if lead is not None else 2, current):
            return None
        if lead is None:
            lead = self.run_reliable(current)
        results = [lead]

        def unjudged(burst: BurstResult) -> TuneStep:
            return TuneStep(name, value, False, None, f"not judged: a burst of the current config did not finish "
                            f"({_error(burst)})", results)

        if not _measured(lead):
            return unjudged(lead)
        rounds: list[tuple[BurstResult, BurstResult, BurstResult]] = []
        while True:
            challenger = self.run_reliable(candidate)
            results.append(challenger)
            if not _measured(challenger):
                return TuneStep(name, value, False, None, f"burst {challenger.status}: {_error(challenger)}", results)
            if self.guard:
                verdict = self.guard_verdict(challenger)
                if verdict is None:
                    return None
                if verdict.status in ("changes_training", "cannot_tell"):  # a pick must be known to train the same
                    said = "changes training" if verdict.status == "changes_training" else "training not checked"
                    return TuneStep(name, value, False, None, f"{said}: " + "; ".join(verdict.reasons), results)
            after = self.run_reliable(current)
            results.append(after)
            if not _measured(after):
                return unjudged(after)
            unreliable = [r for r in (lead, challenger, after) if not r.reliability.reliable]
            if unreliable:  # measured again REMEASURES times and still busy: no ranking from these numbers
                return TuneStep(name, value, False, None, "not judged: the machine was too busy to rank it "
                                f"({unreliable[0].reliability.text()}); re-run when it is quiet", results)
            rounds.append((lead, challenger, after))
            lead = after
            judgement = _judge(rounds)
            if judgement.decided or len(rounds) == MAX_ROUNDS or not (
                    self.can_run(1, candidate) and self.can_run(1, current)):
                return TuneStep(name, value, judgement.accepted, judgement.speedup, judgement.reason, results)


@dataclass(frozen=True)
class _Judgement:
    accepted: bool
    decided: bool
    speedup: float
    reason: str


def _judge(rounds: list[tuple[BurstResult, BurstResult, BurstResult]]) -> _Judgement:
    """Accept, reject, or call it close, from interleaved (current, candidate, current) rounds.

    Each round's ratio is the candidate's samples/s over the mean of the current bursts either side (a
    linear drift cancels); the speedup is the median ratio. Noise: a burst's median step time moves by
    about relative IQR / sqrt(steps) (its standard error, within the burst), combined over the three
    bursts of a round and the rounds; after repeats, the spread between rounds counts too, since load
    from other processes changes between bursts more than within one.
    """
    ratios = [_rate(x) / ((_rate(a) + _rate(b)) / 2) for a, x, b in rounds]
    speedup = statistics.median(ratios)
    variances = [_relative_se(x) ** 2 + (_relative_se(a) ** 2 + _relative_se(b) ** 2) / 4 for a, x, b in rounds]
    noise = NOISE_Z * math.sqrt(statistics.fmean(variances) / len(rounds))
    if len(ratios) > 1:
        noise = max(noise, NOISE_Z * statistics.stdev(ratios) / math.sqrt(len(ratios)))
    bar = max(MIN_GAIN, noise)
    measured = f"{speedup - 1:+.1%} (noise ±{noise:.1%}, {len(rounds)} round{'s' if len(rounds) > 1 else ''})"
    if speedup >= 1 + bar and len(rounds) >= CONFIRM_ROUNDS:
        return _Judgement(True, True, speedup, f"faster: {measured}")
    if speedup >= 1 + bar and len(rounds) < CONFIRM_ROUNDS:
        return _Judgement(False, False, speedup, f"looks faster: {measured}; a gain must hold over "
                                                 f"{CONFIRM_ROUNDS} rounds")
    if speedup + noise < 1 + MIN_GAIN:
        return _Judgement(False, True, speedup, f"{'slower' if speedup < 1 else 'no clear gain'}: {measured}")
    return _Judgement(False, False, speedup, f"within noise: {measured}; a gain needs {bar:+.1%}")


def _relative_se(result: BurstResult) -> float:
    summary = result.step_time
    return summary.relative_iqr / math.sqrt(summary.n) if summary is not None else 0.0


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
