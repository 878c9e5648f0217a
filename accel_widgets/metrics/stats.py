"""Robust summaries of repeated timings, after torch.utils.benchmark's ``Measurement``.

Step times on a shared machine have outliers (GC, the OS, other tenants), so the centre is the
median and the spread the interquartile range; IQR/median >= 10% marks a measurement as noisy.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .thresholds import THRESHOLDS


@dataclass(frozen=True)
class Summary:
    """Median, quartiles and count of a sample of timings (seconds)."""

    n: int
    median: float
    q1: float
    q3: float
    mean: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def relative_iqr(self) -> float:
        return self.iqr / self.median if self.median > 0 else float("inf")

    @property
    def noisy(self) -> bool:
        """True when the spread is too large for the median to be trusted (too few steps count as noisy)."""
        return self.n < THRESHOLDS.min_steps_for_spread or self.relative_iqr >= THRESHOLDS.noisy_relative_iqr


def summarize(values: Sequence[float]) -> Summary:
    """Summary of ``values``; raises ValueError on an empty sequence."""
    if not values:
        raise ValueError("cannot summarise an empty list of timings")
    ordered = sorted(values)
    if len(ordered) == 1:
        v = ordered[0]
        return Summary(1, v, v, v, v)
    q1, median, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return Summary(len(ordered), median, q1, q3, statistics.fmean(ordered))
