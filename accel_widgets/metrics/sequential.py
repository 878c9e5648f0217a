"""Speed-ups as anytime-valid intervals: the statistics every comparison of two configs rests on.

A comparison measures two configs in interleaved *blocks* (A B B A, then B A A B, ...): within a block each config
runs at positions whose mean is the same, so a drift of the machine that is linear over the block cancels from
the difference of their mean log rates. That difference is one observation, ``log(rate_b / rate_a)``; blocks are
independent replicates of it. Log ratios are the natural scale for speed-ups: 2x and 0.5x lie equally far from 1.

The interval is a *confidence sequence* (Lai 1976; Wang & Ramdas 2023, "Anytime-valid t-tests and confidence
sequences for Gaussian means with unknown variance"): with probability 1 - alpha it holds the true mean log
ratio at *every* number of blocks at once. So a comparison may look after every block and stop the moment its
verdict is settled, and its false alarms stay at alpha; a t-interval recomputed after each block and stopped when
it excludes 1 does not (the simulation in the tests shows ~3x its nominal rate). The price is width: the interval
is 1.5-2x a fixed-n t-interval's at 5-20 blocks, and it needs ``min_blocks`` blocks before it is finite.

The sequence comes from a nonnegative martingale under the null mean mu0: the likelihood ratio of the data's
scale-invariant part (its shape, whatever sigma is), mixed over the standardised effect theta = (mu - mu0) / sigma
with a N(0, 1/c) prior. With S = sum(x - mu0) and V = sum((x - mu0)^2) over n blocks it has the closed form

    M_n = sqrt(c / (c + n)) * (V / (V - S^2 / (n + c))) ** (n / 2),

and Ville's inequality bounds P(ever M_n >= 1/alpha) by alpha. Solving M_n < 1/alpha for mu0 gives an interval
centred on the mean, :func:`half_width`. ``c`` sets where it is tightest; ``MIXTURE_PRECISION`` puts that at the
5-20 blocks a comparison here affords. The guarantee assumes independent, roughly normal block observations; the
simulation in the tests checks that drift, outliers and a step change leave false verdicts under alpha.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ALPHA = 0.05
#: The mixture's precision c over the standardised effect (a N(0, 1/c) prior): 0.3 makes the interval finite from
#: 4 blocks and within ~1.7x a fixed-n t-interval from 8 to 20 blocks, where comparisons here end.
MIXTURE_PRECISION = 0.3

Verdict = Literal["faster", "slower", "same", "undecided"]
VERDICTS: tuple[Verdict, ...] = ("faster", "slower", "same", "undecided")


def half_width(n: int, spread: float, *, alpha: float = ALPHA, c: float = MIXTURE_PRECISION) -> float:
    """Half-width of the (1 - alpha) confidence sequence for a mean after ``n`` observations whose root mean squared
    deviation from their own mean is ``spread`` (the biased standard deviation); ``inf`` while too few observations
    can bound it.

    From M_n < 1/alpha with D = mean - mu0: D^2 (1 - K c / (n + c)) < (K - 1) spread^2, where
    K = exp(2 L / n) and L = log(1/alpha) + log((c + n) / c) / 2.
    """
    if n < 2:
        return math.inf
    bound = math.log(1 / alpha) + 0.5 * math.log((c + n) / c)
    k = math.exp(2 * bound / n)
    room = 1 - k * c / (n + c)
    if room <= 0:
        return math.inf
    return spread * math.sqrt((k - 1) / room)


def min_blocks(*, alpha: float = ALPHA, c: float = MIXTURE_PRECISION) -> int:
    """The fewest observations after which the interval is finite (4 at the defaults)."""
    n = 2
    while math.isinf(half_width(n, 1.0, alpha=alpha, c=c)):
        n += 1
    return n


@dataclass(frozen=True)
class Interval:
    """A speed-up (b over a) with its anytime-valid interval, all as ratios; ``n`` blocks behind it."""

    ratio: float
    low: float
    high: float
    n: int

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high) and self.low > 0

    @property
    def detectable(self) -> float:
        """The smallest effect this interval can tell from none, as a fraction (0.04: 4%): how far its wider side
        reaches from its centre."""
        if not self.bounded:
            return math.inf
        return max(self.high / self.ratio, self.ratio / self.low) - 1

    @property
    def reach(self) -> float:
        """How far from 1 the interval reaches, as a fraction: "same ±4%" reads 0.04."""
        if not self.bounded:
            return math.inf
        return max(self.high - 1, 1 - self.low, 0.0)


def interval(log_ratios: Sequence[float], *, alpha: float = ALPHA) -> Interval:
    """The speed-up and its (1 - alpha) confidence sequence from per-block log ratios (``inf`` bounds until
    :func:`min_blocks` blocks)."""
    n = len(log_ratios)
    if n == 0:
        return Interval(math.nan, 0.0, math.inf, 0)
    mean = math.fsum(log_ratios) / n
    spread = math.sqrt(math.fsum((x - mean) ** 2 for x in log_ratios) / n)
    width = half_width(n, spread, alpha=alpha)
    return Interval(math.exp(mean), _exp(mean - width), _exp(mean + width), n)


def _exp(x: float) -> float:
    return 0.0 if x == -math.inf else math.inf if x == math.inf else math.exp(x)


def verdict(found: Interval, min_effect: float) -> Verdict:
    """What the interval says, given the smallest effect worth the name.

    "same" when the whole interval lies within 1 ± ``min_effect`` (an effect there, if any, is too small to
    matter: Criterion.rs's noise threshold); otherwise "faster" or "slower" when it excludes 1; else
    "undecided". "same" goes first so that a tight interval around a 1% effect reads as no effect worth having.
    """
    if not found.bounded:
        return "undecided"
    if 1 - min_effect <= found.low and found.high <= 1 + min_effect:
        return "same"
    if found.low > 1:
        return "faster"
    if found.high < 1:
        return "slower"
    return "undecided"


def block_log_ratio(reference: Sequence[float], subject: Sequence[float]) -> float:
    """One block's observation: the subject's mean log rate minus the reference's, from the rates each measured in
    the block (two each in an A B B A block: positions whose mean is the same, so a linear drift cancels)."""
    if not reference or not subject or min(*reference, *subject) <= 0:
        raise ValueError("a block needs a positive rate of each config")
    return (math.fsum(map(math.log, subject)) / len(subject)
            - math.fsum(map(math.log, reference)) / len(reference))
