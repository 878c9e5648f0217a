"""What a comparison of two configs measured: their interleaved windows, the blocks they form, and, derived from
those alone, the speed-up with its anytime-valid interval, the verdict and where the noise came from.

Plain data, like a :class:`~accel_widgets.results.burst.BurstResult`: every number is a property of the windows, so
a comparison read back from its parts reads exactly like the live one. How it reads in words, in a table cell or
in a figure is the views' (:mod:`accel_widgets.views.comparison`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..knobs.base import Part
from ..knobs.config import Config
from ..metrics.sequential import Interval, Verdict, block_log_ratio, interval, verdict
from ..metrics.thresholds import THRESHOLDS
from .burst import BurstResult
from .reliability import load_attribution, other_load_pct

#: The normal distribution's IQR in standard deviations: a step-time IQR over this is the steps' spread as an SD.
IQR_PER_SD = 1.349


@dataclass(frozen=True)
class Block:
    """One interleaved block: which of the comparison's windows measured the reference and which the subject (an
    A B B A block: two each, at positions with the same mean), and why it does not count, if it does not."""

    reference: tuple[int, ...]
    subject: tuple[int, ...]
    left_out: str = ""


@dataclass(frozen=True)
class NoiseSources:
    """What moved the comparison's numbers, each as a relative standard deviation of one block's log ratio.

    ``between`` is what the blocks' log ratios actually spread; ``within`` what the windows' own step-time spread
    explains of it (a window of n steps whose steps spread s averages to s / sqrt(n)); ``drift`` the rest: the
    machine moving between windows (other tenants, clocks, memory placement). ``other_load_pct`` is the mean share
    of the machine that processes outside the measurement took during the windows, ``clock_spread`` how much
    the GPU's SM clock moved between windows (relative SD; None without NVML clocks) and ``clock_limits`` how many
    windows NVML said ran with their clocks held down, by reason ("power cap": 3).
    """

    between: float
    within: float
    drift: float
    other_load_pct: float | None
    clock_spread: float | None
    clock_limits: dict[str, int] = field(default_factory=dict)

    @property
    def dominant(self) -> str:
        """The largest source: "clocks" (windows whose GPU clocks NVML held down), "drift", "steps" (the windows' own
        step spread) or "other load"."""
        if self.clock_limits:
            return "clocks"
        load = (self.other_load_pct or 0.0) / 100
        candidates = {"drift": self.drift, "steps": self.within,
                      "other load": load if load * 100 >= THRESHOLDS.other_load_notice_pct else 0.0}
        return max(candidates, key=lambda name: candidates[name])


@dataclass
class Comparison:
    """``subject`` against ``reference``, measured in interleaved blocks by :func:`accel_widgets.compare`.

    ``windows`` are the measured windows of either config, block by block (each a :class:`BurstResult`, measured on
    held ranks' rebuilt state); ``blocks`` say which of them form each block. The speed-up is the
    subject's samples/s over the reference's. ``stopped`` says why measuring ended ("settled", or the budget, a
    stop, a failure), ``error`` what failed when a config could not be measured; ``firsts`` are the two configs'
    first bursts (an ordinary burst each: steps from the first, losses, the code paths it ran), in no block: they ran
    on a fresh process's state. ``freed``: the part of the step the subject made free (a headspace ceiling: the
    reference's config with that part free), None for a config as it is.
    """

    reference: Config
    subject: Config
    min_effect: float
    windows: list[BurstResult] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    stopped: str = ""
    error: str = ""
    wall_s: float = 0.0
    reference_label: str = ""
    subject_label: str = ""
    firsts: list[BurstResult] = field(default_factory=list)  # each config's first burst, reference then subject
    freed: Part | None = None

    # -- the blocks ------------------------------------------------------------------------------------
    @property
    def counted(self) -> list[Block]:
        return [block for block in self.blocks if not block.left_out]

    def _rates(self, indices: tuple[int, ...]) -> list[float]:
        return [self.windows[i].samples_per_s or 0.0 for i in indices]

    @property
    def log_ratios(self) -> list[float]:
        """One observation per counted block: the subject's mean log rate minus the reference's."""
        return [block_log_ratio(self._rates(b.reference), self._rates(b.subject)) for b in self.counted]

    @property
    def window_ratios(self) -> list[float]:
        """Each subject window's rate over the mean of its block's reference windows: the spread a single burst
        against a single burst would have shown ("this machine moves it 0.91-1.24x from burst to burst")."""
        ratios = []
        for block in self.counted:
            reference = statistics.fmean(self._rates(block.reference))
            ratios += [rate / reference for rate in self._rates(block.subject)]
        return ratios

    # -- what they say ---------------------------------------------------------------------------------
    @property
    def interval(self) -> Interval:
        """The speed-up with its 95% anytime-valid interval (unbounded until enough blocks counted)."""
        return interval(self.log_ratios)

    @property
    def ratio(self) -> float | None:
        """Subject over reference, samples/s: the geometric mean of the blocks' ratios (None before a block)."""
        return self.interval.ratio if self.counted else None

    @property
    def verdict(self) -> Verdict:
        return verdict(self.interval, self.min_effect) if not self.error else "undecided"

    @property
    def settled(self) -> bool:
        return self.verdict != "undecided"

    @property
    def same_config(self) -> bool:
        """The subject is the reference's config, trained as it is: what it measures is this machine's noise floor."""
        return self.subject == self.reference and self.freed is None

    @property
    def noise(self) -> NoiseSources | None:
        """Where the noise came from (None before two blocks counted)."""
        ratios = self.log_ratios
        if len(ratios) < 2:
            return None
        between = statistics.pstdev(ratios)
        within = math.sqrt(statistics.fmean(self._within_variance(block) for block in self.counted))
        windows = [self.windows[i] for block in self.counted for i in (*block.reference, *block.subject)]
        loads = [load for w in windows if (load := other_load_pct(w)) is not None]
        clocks = [c for w in windows if (c := _mean_clock(w)) is not None]
        clock_spread = statistics.pstdev(clocks) / statistics.fmean(clocks) if len(clocks) >= 2 else None
        limits: dict[str, int] = {}
        for window in windows:
            for reason in {r for t in window.measured_telemetry() for r in t.clock_limits or ()}:
                limits[reason] = limits.get(reason, 0) + 1
        return NoiseSources(between, within, math.sqrt(max(0.0, between ** 2 - within ** 2)),
                            statistics.fmean(loads) if loads else None, clock_spread, limits)

    def _within_variance(self, block: Block) -> float:
        """The variance of the block's log ratio that its windows' step spread alone would give."""
        def variance(index: int) -> float:
            step = self.windows[index].step_time
            if step is None or step.n < 2 or step.median <= 0:
                return 0.0
            return (step.iqr / IQR_PER_SD / step.median) ** 2 / step.n

        reference, subject = block.reference, block.subject
        return (sum(map(variance, reference)) / len(reference) ** 2
                + sum(map(variance, subject)) / len(subject) ** 2)

    @property
    def reference_windows(self) -> list[BurstResult]:
        return [self.windows[i] for block in self.blocks for i in block.reference]

    @property
    def subject_windows(self) -> list[BurstResult]:
        return [self.windows[i] for block in self.blocks for i in block.subject]


def _mean_clock(window: BurstResult) -> float | None:
    clocks = [t.sm_clock_mhz for t in window.measured_telemetry() if t.sm_clock_mhz]
    return statistics.fmean(clocks) if clocks else None


def too_loaded(window: BurstResult) -> str:
    """Why a window's block cannot count, from what the machine did besides it (never from its speed, which would
    bias the comparison): other load past the unreliable threshold. "" when it can."""
    load = other_load_pct(window)
    if load is not None and load >= THRESHOLDS.unreliable_other_load_pct:
        return f"other load took {load:.0f}% of the machine ({load_attribution(window)})"
    return ""
