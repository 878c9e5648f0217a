"""``sweep``: a grid of knob values, every point measured against the sweep's base by the comparison engine.

The panel and the ladder flip one knob at a time; some questions need a grid (batch size × loader
workers). Every point's config is built and checked before the first burst, so a typo in a knob name or
a value that cannot run here fails in a second, not after half the grid has run. Each config then runs its first
burst (a point that fails is kept with its error and the sweep goes on), and the comparison engine
(:func:`~accel_widgets.search.compare.measure_pairs`) measures every point against the base, interleaved, until each
verdict is settled or the budget is spent: each point's speed-up is an interval and a verdict, never one burst
against another.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..engine.launcher import Engine, run_burst
from ..engine.request import DEFAULT_TIMEOUT_S, check_burst_request
from ..inputs.device import probe_device
from ..inputs.workload import Workload
from ..knobs import KNOBS, KnobValueError
from ..knobs.config import Config
from ..knobs.rules import ConfigError, check_config
from ..metrics.stats import summarize
from ..results.burst import BurstResult
from ..results.comparison import Comparison
from ..views.comparison import interval_text, outcome_text, verdict_text
from ..views.progress import ProgressSeries, result_line
from .bursts import Bursts, Contender
from .compare import DEFAULT_BUDGET_S, DEFAULT_MIN_EFFECT, _check, measure_pairs

if TYPE_CHECKING:
    import pandas as pd
    from plotly.graph_objects import Figure

Metric = Literal["samples_per_s", "speedup"]
METRIC_TITLES: dict[Metric, str] = {"samples_per_s": "samples/s", "speedup": "speed-up"}
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

    def point_text(self, point: SweepPoint) -> str:
        """What the point measured against the base, in words: ``faster: 1.45× [1.30–1.62]``, ``same within ±3%``,
        ``base``, ``failed: <why>`` (its own burst), ``not compared: <why>`` (the base's), ``not run``."""
        if point.status != "ok" and point.error:
            return f"{point.status}: {point.error}"
        if point.config == self.base:
            return BASE if point.results else "not run"
        if point.comparison is None:
            return "not run" if not point.results else "not compared"
        return outcome_text(point.comparison)

    def summary(self) -> str:
        """Lines a person reads: what was swept against what, then each point's samples/s and verdict."""
        head = (f"sweep of {' × '.join(self.knobs)} on {self.workload} against {self.base.label()}, "
                f"{len(self.points)} points{', stopped' if self.stopped else ''}")
        lines = [head]
        for point in self.points:
            rate = f"{point.samples_per_s:,.1f} samples/s, " if point.samples_per_s is not None else ""
            lines.append(f"  {point.label}: {rate}{self.point_text(point)}")
        return "\n".join(lines)

    def figure(self, metric: Metric = "samples_per_s") -> Figure:
        """The metric over the grid: a line for one knob, a heatmap for two, parallel coordinates for more. The
        speed-up's line has the interval as whiskers and every cell or point its verdict on hover."""
        if metric not in METRIC_TITLES:
            raise ValueError(f"metric={metric!r} is invalid: use one of {', '.join(METRIC_TITLES)}")
        rows = self.rows()
        values = [row[metric] for row in rows]
        if len(self.knobs) == 1:
            return self._line(metric, values, rows)
        if len(self.knobs) == 2:
            return self._heatmap(metric, values)
        return self._parallel_coordinates(metric, values)

    def _cell_text(self, metric: Metric, point: SweepPoint, value: float | None) -> str:
        """A cell's text: the number, and for the speed-up its interval or verdict (``1.45×<br>[1.30–1.62]``,
        ``same ±3%``, ``base``)."""
        if metric != "speedup" or value is None:
            return _metric_text(metric, value)
        if point.config == self.base:
            return BASE
        comparison = point.comparison
        if comparison is None:
            return "–"
        if comparison.verdict == "same":
            return verdict_text(comparison)
        return interval_text(comparison).replace(" [", "<br>[").replace(" (", "<br>(")

    def _line(self, metric: Metric, values: list[float | None], rows: list[dict[str, Any]]) -> Figure:
        import plotly.graph_objects as go

        name = self.knobs[0]
        x = [str(p.values[name]) for p in self.points]
        error_y = None
        if metric == "speedup":
            high = [row["speedup_high"] - v if row["speedup_high"] is not None and v is not None else None
                    for row, v in zip(rows, values, strict=True)]
            low = [v - row["speedup_low"] if row["speedup_low"] is not None and v is not None else None
                   for row, v in zip(rows, values, strict=True)]
            error_y = {"type": "data", "symmetric": False, "array": high, "arrayminus": low}
        hover = [f"{p.label}: {self.point_text(p)}" for p in self.points]
        figure = go.Figure(go.Scatter(x=x, y=values, mode="lines+markers", name=METRIC_TITLES[metric],
                                      error_y=error_y, hovertext=hover, hoverinfo="text+y"))
        figure.update_layout(title=f"{METRIC_TITLES[metric]} by {name}" + (f" against {self.base.label()} (95% "
                                                                            "interval)" if error_y else ""),
                             xaxis={"title": name, "type": "category"}, yaxis_title=METRIC_TITLES[metric],
                             height=360)
        return figure

    def _heatmap(self, metric: Metric, values: list[float | None]) -> Figure:
        """Rows: the first knob's values; columns: the second's. A point that did not finish is left blank."""
        import plotly.graph_objects as go

        rows, columns = self.knobs
        row_values = _unique(p.values[rows] for p in self.points)
        column_values = _unique(p.values[columns] for p in self.points)
        key = [(str(p.values[rows]), str(p.values[columns])) for p in self.points]
        cell = dict(zip(key, values, strict=True))
        said = {k: self._cell_text(metric, p, v) for k, p, v in zip(key, self.points, values, strict=True)}
        hover = {k: f"{p.label}: {self.point_text(p)}" for k, p in zip(key, self.points, strict=True)}
        grid = [[(str(r), str(c)) for c in column_values] for r in row_values]
        z = [[cell.get(k) for k in line] for line in grid]
        text = [[said.get(k, "–") for k in line] for line in grid]
        figure = go.Figure(go.Heatmap(z=z, x=[str(c) for c in column_values], y=[str(r) for r in row_values],
                                      text=text, texttemplate="%{text}", colorscale="Blues",
                                      customdata=[[hover.get(k, "") for k in line] for line in grid],
                                      hovertemplate="%{customdata}<extra></extra>",
                                      colorbar={"title": METRIC_TITLES[metric]}))
        figure.update_layout(title=f"{METRIC_TITLES[metric]}: {rows} × {columns}", height=360,
                             xaxis={"title": columns, "type": "category"}, yaxis={"title": rows, "type": "category"})
        return figure

    def _parallel_coordinates(self, metric: Metric, values: list[float | None]) -> Figure:
        """One axis per knob and one for the metric; categorical knobs (strings, bools, None) become ticks."""
        import plotly.graph_objects as go

        dimensions = [_dimension(name, [p.values[name] for p in self.points]) for name in self.knobs]
        measured = [v if v is not None else float("nan") for v in values]
        dimensions.append({"label": METRIC_TITLES[metric], "values": measured})
        figure = go.Figure(go.Parcoords(line={"color": measured, "colorscale": "Blues", "showscale": True},
                                        dimensions=dimensions))
        figure.update_layout(title=f"{METRIC_TITLES[metric]} over {', '.join(self.knobs)}", height=420)
        return figure


def _unique(values: Iterable[Any]) -> list[Any]:
    """The distinct values in first-seen order, told apart by how they are shown (1 and True are two)."""
    seen: dict[str, Any] = {}
    for value in values:
        seen.setdefault(str(value), value)
    return list(seen.values())


def _metric_text(metric: Metric, value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}x" if metric == "speedup" else f"{value:,.0f}"


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _dimension(name: str, values: list[Any]) -> dict[str, Any]:
    """A parcoords axis: numbers as they are; anything else as evenly spaced ticks named by their values."""
    if all(_numeric(v) for v in values):
        return {"label": name, "values": values}
    ticks = [str(c) for c in _unique(values)]
    return {"label": name, "values": [ticks.index(str(v)) for v in values], "tickvals": list(range(len(ticks))),
            "ticktext": ticks}


def grid_points(grid: Mapping[str, Sequence[Any]], base: Config | None = None) -> list[SweepPoint]:
    """The cartesian product of ``grid``, each point's config built and validated on ``base``.

    Raises :class:`KnobValueError` for an unknown knob, an empty or non-list value list, or a value the knob
    refuses, naming the point; the first knob varies slowest (``itertools.product`` order).
    """
    if not grid:
        raise KnobValueError("the grid is empty: give at least one knob and its values, e.g. {'num_workers': [0, 2]}")
    for name, values in grid.items():
        KNOBS[name]  # an unknown name raises, naming the closest knob and the known ones
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise KnobValueError(f"sweep grid {name!r}: give a non-empty list of values, got {values!r}")
    base = base or Config()
    points = []
    for combination in itertools.product(*grid.values()):
        values = dict(zip(grid, combination, strict=True))
        try:
            config = base.replace(**values)
        except KnobValueError as exc:
            raise KnobValueError(f"sweep point {_spell(values)}: {exc}") from None
        points.append(SweepPoint(values, config))
    return points


def _spell(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in values.items())


def sweep(
    workload: Workload,
    grid: Mapping[str, Sequence[Any]],
    *,
    base: Config | None = None,
    steps: int | None = None,
    seconds: float | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    min_effect: float = DEFAULT_MIN_EFFECT,
    engine: Engine = run_burst,
    on_point: Callable[[SweepPoint, BurstResult], None] | None = None,
    stop: threading.Event | None = None,
    progress: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> SweepResult:
    """Measure every point of ``grid`` (knob name → values; the cartesian product, set on ``base``) against ``base``.

    ``aw.sweep(wl, {"batch_size": [16, 32, 64], "num_workers": [0, 2]}, steps=20)``: each of the six points and the
    base (unless it is one of them) runs a first burst of ``steps`` measured steps (or ``seconds``), then the
    comparison engine measures the points against the base, interleaved, until every verdict against ``min_effect``
    is settled or ``budget_s`` (on ``clock``, after the first bursts) is spent. Knob names, values, the burst length,
    the budget and every point's config against this device are checked before the first burst:
    :class:`KnobValueError`, :class:`ConfigError`, :class:`BurstRequestError` or ``ValueError`` name the problem.
    ``engine`` is called like :func:`run_burst` (the default holds each config's ranks between its windows); a point
    that fails is kept with its error and the sweep goes on. ``on_point(point, first)`` is called after each point's
    first burst. Setting ``stop`` ends the running window and starts no other (points not started read "not run").
    ``progress`` shows a line per first burst on stdout, as the CLI's ladder does, then each point's verdict.
    """
    _check(budget_s, min_effect)
    check_burst_request(steps, seconds, None, DEFAULT_TIMEOUT_S, 0)
    points = _checked_points(grid, base)
    base = base or Config()
    owners: list[SweepPoint | None] = list(points)
    if all(point.config != base for point in points):
        owners.insert(0, None)  # the base is measured as a config of its own
    reference = next(i for i, owner in enumerate(owners) if owner is None or owner.config == base)
    configs = [base if owner is None else owner.config for owner in owners]
    labels = ["base" if owner is None else owner.label for owner in owners]
    result = SweepResult(workload.name, list(grid), points, [], base, budget_s)
    bursts = Bursts(engine, steps=steps, seconds=seconds, stop=stop)
    display = ProgressSeries("burst", len(configs), steps=steps, seconds=seconds) if progress else None
    contenders: list[Contender] = []
    try:
        for config, label, owner in zip(configs, labels, owners, strict=True):
            if bursts.stopped():
                break
            contender = _open(workload, config, label, bursts, display)
            contenders.append(contender)
            result.results.append(contender.first)
            if owner is not None:
                owner.results = [contender.first]
                if on_point is not None:
                    on_point(owner, contender.first)
        if len(contenders) == len(configs) and not bursts.stopped():
            pairs = [(reference, i) for i in range(len(configs)) if i != reference]
            measured = measure_pairs(workload, configs, pairs, budget_s=budget_s, min_effect=min_effect,
                                     engine=engine, stop=stop, labels=labels, opened=dict(enumerate(contenders)),
                                     clock=clock)
            _assign(owners, reference, pairs, measured.comparisons)
    finally:
        for contender in contenders:
            contender.close()
        if display is not None:
            display.end()
    result.stopped = bursts.stopped()
    if display is not None:
        print("\n".join(result.summary().splitlines()[1:]), flush=True)
    return result


def _checked_points(grid: Mapping[str, Sequence[Any]], base: Config | None) -> list[SweepPoint]:
    """The grid's points, every config checked against this device (a point that cannot run here raises, named)."""
    points = grid_points(grid, base)
    device = probe_device()
    for point in points:
        try:
            check_config(point.config, device)
        except ConfigError as exc:
            raise ConfigError(f"sweep point {_spell(point.values)}: {exc}") from None
    return points


def _open(workload: Workload, config: Config, label: str, bursts: Bursts, display: ProgressSeries | None) -> Contender:
    """A config's contender, its first burst on ``display`` (then its result line, throughput only: a speed-up comes
    with its interval, once the comparisons are measured)."""
    if display is None:
        return bursts.open(workload, config, label=label)
    display.begin(label, config)
    try:
        contender = bursts.open(workload, config, label=label, on_event=display.on_event)
    finally:
        display.end()
    print(result_line(contender.first, None), flush=True)
    return contender


def _assign(owners: list[SweepPoint | None], reference: int, pairs: list[tuple[int, int]],
            comparisons: list[Comparison]) -> None:
    """Each point's comparison and bursts: its first burst, then its comparison's windows; the base point's windows
    are those of the comparison that ran longest (the base ran in every block while any pair was open, and pairs only
    close)."""
    for (_, index), comparison in zip(pairs, comparisons, strict=True):
        owner = owners[index]
        if owner is not None:
            owner.comparison = comparison
            owner.results = [*owner.results[:1], *comparison.subject_windows]
    base = owners[reference]
    if base is not None and comparisons:
        longest = max(comparisons, key=lambda comparison: len(comparison.blocks))
        base.results = [*base.results[:1], *longest.reference_windows]
