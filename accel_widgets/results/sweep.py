"""What a sweep measured: its grid's points, each config's windows and its comparison against the sweep's base.

Plain data, like a :class:`~accel_widgets.results.burst.BurstResult`: the sweep that runs the grid is
:mod:`accel_widgets.search.sweep`; how the record reads in words and as a figure is the views'
(:func:`accel_widgets.views.text.summary`, :func:`accel_widgets.views.figures.sweep_figure`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..knobs.config import Config
from ..metrics.stats import summarize
from .burst import BurstResult
from .comparison import Comparison

if TYPE_CHECKING:
    import pandas as pd

#: The verdict column of the point whose config is the base: it is the reference, not measured against itself.
BASE = "base"


@dataclass
class SweepPoint:
    """One point of the grid: the swept knobs' values, the config they make, its windows (the first burst, then the
    comparison's) and its comparison against the sweep's base (None for the base itself, or before one ran)."""

    values: dict[str, Any]
    config: Config
    results: list[BurstResult] = field(default_factory=list)
    comparison: Comparison | None = None

    @property
    def label(self) -> str:
        """``batch_size=32, num_workers=2``: the swept knobs only (the rest is the sweep's base)."""
        return ", ".join(f"{name}={value}" for name, value in self.values.items())

    @property
    def ok(self) -> bool:
        """Every window ran and finished ok: only then is the point's number a clean measurement."""
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def status(self) -> str:
        """"ok", "not run" (the sweep was stopped first), or the status of the first window that was not ok."""
        if not self.results:
            return "not run"
        return next((r.status for r in self.results if not r.ok), "ok")

    @property
    def error(self) -> str:
        """The first line of the first failing window's error ("" when none failed)."""
        failed = next((r for r in self.results if not r.ok and r.error is not None), None)
        return failed.error.message.strip().splitlines()[0] if failed and failed.error.message.strip() else ""

    @property
    def samples_per_s(self) -> float | None:
        """Median throughput over the windows that finished ok (robust to one disturbed window)."""
        rates = [r.samples_per_s for r in self.results if r.ok and r.samples_per_s is not None]
        return statistics.median(rates) if rates else None

    def step_times(self) -> list[float]:
        """Measured step times of the windows that finished ok, pooled."""
        return [t for r in self.results if r.ok for t in r.step_times()]


@dataclass
class SweepResult:
    """A finished (or stopped) sweep: its points in grid order, and each config's first burst in the order they ran
    (``results``; the base's first when the base is no point of the grid). Every later window is in the points'
    comparisons.

    Speed-ups are against ``base``, the config the grid's values are set on: each point's comes from the comparison
    engine, within ``budget_s`` of measuring after the first bursts. A point whose config is the base is the
    reference (1.0, verdict "base").
    """

    workload: str
    knobs: list[str]
    points: list[SweepPoint]
    results: list[BurstResult]
    base: Config
    budget_s: float
    stopped: bool = False

    @property
    def compared(self) -> dict[int, Comparison]:
        """Each compared point's comparison by the index of its config's first burst in ``results``: what the
        comparison table takes (``comparison_rows(swept.results, compared=swept.compared)``)."""
        found = {point.config: point.comparison for point in self.points if point.comparison is not None}
        return {index: found[result.config] for index, result in enumerate(self.results) if result.config in found}

    def speedup(self, point: SweepPoint) -> float | None:
        """The point's samples/s over the base's, from its comparison's blocks (1.0 for the base itself)."""
        if point.config == self.base:
            return 1.0 if point.samples_per_s is not None else None
        return point.comparison.ratio if point.comparison is not None else None

    def verdict(self, point: SweepPoint) -> str | None:
        """"faster", "slower", "same", "undecided" against the base; "base" for the base; None when not compared."""
        if point.config == self.base:
            return BASE if point.results else None
        comparison = point.comparison
        return comparison.verdict if comparison is not None and not comparison.error else None

    def rows(self) -> list[dict[str, Any]]:
        """One plain dict per point: the knob values, then the numbers (None where unknown). ``speedup_low`` and
        ``speedup_high`` bound the speed-up (95%, anytime-valid) once enough blocks did."""
        rows = []
        for point in self.points:
            times = point.step_times()
            step = summarize(times) if times else None
            found = point.comparison.interval if point.comparison is not None else None
            bounded = found is not None and found.bounded
            rows.append({
                **point.values,
                "samples_per_s": point.samples_per_s,
                "speedup": self.speedup(point),
                "speedup_low": found.low if bounded else None,
                "speedup_high": found.high if bounded else None,
                "verdict": self.verdict(point),
                "step_ms_median": step.median * 1e3 if step is not None else None,
                "step_ms_iqr": step.iqr * 1e3 if step is not None else None,
                "runs": len(point.results),
                "status": point.status,
                "error": point.error,
            })
        return rows

    def frame(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame, one row per point (pandas is imported here, not with the package)."""
        import pandas as pd

        columns = [*self.knobs, "samples_per_s", "speedup", "speedup_low", "speedup_high", "verdict",
                   "step_ms_median", "step_ms_iqr", "runs", "status", "error"]
        return pd.DataFrame(self.rows(), columns=columns)
