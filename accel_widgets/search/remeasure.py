"""Re-measure a run paired with its baseline: interleaved bursts, the ratio of each pair, and its spread.

A run marked unreliable (:attr:`~accel_widgets.results.burst.BurstResult.reliability`) shared the machine with other
load, or its steps spread past half their median: its speed-up measured the neighbours as much as the knob.
Two bursts measured minutes apart cannot tell a 5% effect on such a machine either (the same loop moves
±20% between bursts here). What can: bursts interleaved baseline, run, baseline, run, ..., baseline, each
run burst against the mean of the baseline bursts either side of it, so a drift over the minutes cancels and
a neighbour that comes and goes lands on both sides of a pair alike. The median of those ratios, with its
interquartile range, is the number to believe -- as the tuner judges its candidates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..engine.launcher import run_burst
from ..inputs.workload import Workload
from ..knobs.config import Config
from ..metrics.stats import Summary, summarize
from ..results.burst import BurstResult
from .bursts import Bursts

DEFAULT_PAIRS = 4
MIN_STEPS = 20  # a re-measure gets at least this many measured steps per burst, whatever the run had


def paired_ratios(rates: Sequence[float]) -> list[float]:
    """Each run burst's rate over the mean of the baseline bursts either side of it, for rates measured
    baseline, run, baseline, run, ..., baseline (``2 * pairs + 1`` of them, none zero)."""
    if len(rates) < 3 or len(rates) % 2 == 0:
        raise ValueError(f"paired rates alternate baseline, run, ..., baseline: got {len(rates)} rates")
    return [rates[i] / ((rates[i - 1] + rates[i + 1]) / 2) for i in range(1, len(rates) - 1, 2)]


@dataclass
class PairedComparison:
    """A run's config against its baseline's, measured in interleaved pairs.

    ``results`` are the bursts in run order (baseline first and last); ``ratios`` each run burst's samples/s
    over its two neighbouring baseline bursts' mean, for the pairs whose three bursts all finished.
    """

    config: Config
    baseline: Config
    results: list[BurstResult] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    stopped: bool = False

    @property
    def speedup(self) -> Summary | None:
        """Median paired ratio with its quartiles; None before a pair has been measured."""
        return summarize(self.ratios) if self.ratios else None

    @property
    def unreliable_bursts(self) -> int:
        return sum(not r.reliability.reliable for r in self.results if r.ok)

    def summary(self) -> str:
        """One line: the paired speed-up with its spread and what it rests on."""
        ratio = self.speedup
        if ratio is None:
            return f"{self.config.label(self.baseline)}: no pair measured ({len(self.results)} bursts)"
        shaky = f", {self.unreliable_bursts} of {len(self.results)} bursts unreliable" if self.unreliable_bursts else ""
        return (f"{self.config.label(self.baseline)}: {ratio.median:.3f}x paired (IQR {ratio.q1:.3f}-{ratio.q3:.3f}, "
                f"{ratio.n} pair{'s' if ratio.n != 1 else ''}{shaky})")


def remeasure(
    workload: Workload,
    run: BurstResult | Config,
    baseline: BurstResult | Config,
    *,
    pairs: int = DEFAULT_PAIRS,
    steps: int | None = None,
    engine: Callable[..., BurstResult] = run_burst,
    stop: threading.Event | None = None,
    on_burst: Callable[[BurstResult, int, int], None] | None = None,
) -> PairedComparison:
    """Measure ``run``'s config against ``baseline``'s in ``pairs`` interleaved pairs (``2 * pairs + 1`` bursts).

    ``steps``: measured steps per burst; by default as many as the run measured, at least ``MIN_STEPS``.
    ``engine`` is called like :func:`~accel_widgets.run_burst`; a burst that fails leaves its pair out.
    ``on_burst(result, done, planned)`` is told of each burst (the panel's progress); setting ``stop`` ends the
    comparison after the running burst, with the pairs measured so far.
    """
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"pairs={pairs!r} is invalid: use an integer >= 1")
    config = run.config if isinstance(run, BurstResult) else run
    reference = baseline.config if isinstance(baseline, BurstResult) else baseline
    if steps is None:
        measured = len(run.step_times()) if isinstance(run, BurstResult) else 0
        steps = max(MIN_STEPS, measured)
    bursts = Bursts(engine, steps=steps, stop=stop)
    comparison = PairedComparison(config, reference)
    planned = 2 * pairs + 1
    for index in range(planned):
        if bursts.stopped():
            comparison.stopped = True
            break
        which, label = (reference, "baseline") if index % 2 == 0 else (config, "run")
        result = bursts.run(workload, which, label=f"re-measure: {label}")
        comparison.results.append(result)
        if on_burst is not None:
            on_burst(result, index + 1, planned)
    comparison.ratios = _finished_pairs(comparison.results)
    return comparison


def _finished_pairs(results: Sequence[BurstResult]) -> list[float]:
    """The ratios of the pairs whose three bursts (baseline, run, baseline) all finished with a throughput."""
    ratios = []
    for i in range(1, len(results) - 1, 2):
        trio = results[i - 1:i + 2]
        if all(r.ok and r.samples_per_s for r in trio):
            ratios += paired_ratios([r.samples_per_s or 0.0 for r in trio])
    return ratios

