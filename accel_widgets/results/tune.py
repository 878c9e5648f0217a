"""What a tuning found: the best config, every decision on the way and every window run.

Plain data, like a :class:`~accel_widgets.results.burst.BurstResult`: the tuner that decides is
:mod:`accel_widgets.search.tuner`; how the record reads in words is the views'
(:func:`accel_widgets.views.text.summary`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..knobs.config import Config
from .burst import BurstResult
from .comparison import Comparison
from .noise import NoiseBand


@dataclass(frozen=True)
class TuneStep:
    """One decision: a knob value tried (or skipped) against the best config at that point.

    ``comparison`` is the duel's measurement by the comparison engine (None when the value was skipped, failed its
    first burst or was rejected by the guard before any comparison); ``results`` are the step's windows in run
    order: the candidate's first burst, then the comparison's windows of both configs.
    """

    knob: str
    value: Any
    accepted: bool
    reason: str
    results: list[BurstResult] = field(default_factory=list)
    comparison: Comparison | None = None

    @property
    def speedup(self) -> float | None:
        """The candidate's samples/s over the best config's, from the comparison's blocks (None without any)."""
        return self.comparison.ratio if self.comparison is not None else None


@dataclass
class TuneResult:
    """The best config found, every decision on the way (``decisions``) and every window run (``bursts``).

    ``confirmation`` is the pick measured against the starting config by the comparison engine after the search, and
    :attr:`speedup` its ratio; ``best_samples_per_s`` and ``baseline_samples_per_s`` are medians over its windows
    (over all windows of those configs when it has none; ``None`` when none finished). ``noise`` is the band the guard
    judged a candidate by, when one needed it (its reseeded baseline bursts count in ``wall_s`` and the budget, but
    are not in ``bursts``: they trained on other data).
    """

    best: Config
    best_samples_per_s: float | None
    baseline_samples_per_s: float | None
    decisions: list[TuneStep]
    bursts: list[BurstResult]
    wall_s: float
    stopped_reason: str
    noise: NoiseBand | None = None
    confirmation: Comparison | None = None

    @property
    def speedup(self) -> float | None:
        """What the pick gains over the starting config: the final comparison's ratio; 1.0 when the pick is the
        start; None when that comparison could not run (stopped, no time left)."""
        if self.confirmation is not None:
            return self.confirmation.ratio
        return 1.0 if not any(s.accepted for s in self.decisions) else None
