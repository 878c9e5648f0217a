"""``sweep``: run a grid of knob values, one burst per point (and repeat), and compare the points.

The panel and the ladder flip one knob at a time; some questions need a grid (batch size × loader
workers). Every point's config is built and checked before the first burst, so a typo in a knob name or
a value that cannot run here fails in a second, not after half the grid has run. A point that fails
while running is kept with its error and the sweep goes on. Repeats measure each point several times;
``interleave=True`` runs repeat r of every point before repeat r+1, so slow drift of the machine (thermal
throttling, another tenant) is spread over all points instead of biasing the ones that ran last.
"""

from __future__ import annotations

import itertools
import statistics
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..engine.launcher import run_burst
from ..engine.request import DEFAULT_TIMEOUT_S, check_burst_request
from ..inputs.device import probe_device
from ..inputs.workload import Workload
from ..knobs import KNOBS, KnobValueError
from ..knobs.config import Config
from ..knobs.rules import ConfigError, check_config
from ..metrics.stats import summarize
from ..results.burst import BurstResult
from ..views.progress import ProgressSeries, result_line
from .bursts import Bursts

if TYPE_CHECKING:
    import pandas as pd
    from plotly.graph_objects import Figure

Metric = Literal["samples_per_s", "speedup"]
METRIC_TITLES: dict[Metric, str] = {"samples_per_s": "samples/s", "speedup": "speed-up"}


@dataclass
class SweepPoint:
    """One point of the grid: the swept knobs' values, the config they make, and its bursts (one per repeat)."""

    values: dict[str, Any]
    config: Config
    results: list[BurstResult] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``batch_size=32, num_workers=2``: the swept knobs only (the rest is the sweep's base)."""
        return ", ".join(f"{name}={value}" for name, value in self.values.items())

    @property
    def ok(self) -> bool:
        """Every repeat ran and finished ok: only then is the point's number a clean measurement."""
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def status(self) -> str:
        """"ok", "not run" (the sweep was stopped first), or the status of the first repeat that was not ok."""
        if not self.results:
            return "not run"
        return next((r.status for r in self.results if not r.ok), "ok")

    @property
    def error(self) -> str:
        """The first line of the first failing repeat's error ("" when none failed)."""
        failed = next((r for r in self.results if not r.ok and r.error is not None), None)
        return failed.error.message.strip().splitlines()[0] if failed and failed.error.message.strip() else ""

    @property
    def samples_per_s(self) -> float | None:
        """Median throughput over the repeats that finished ok (robust to one disturbed repeat)."""
        rates = [r.samples_per_s for r in self.results if r.ok and r.samples_per_s is not None]
        return statistics.median(rates) if rates else None

    def step_times(self) -> list[float]:
        """Measured step times of the repeats that finished ok, pooled."""
        return [t for r in self.results if r.ok for t in r.step_times()]


@dataclass
class SweepResult:
    """A finished (or stopped) sweep: its points in grid order and every burst in the order it ran.

    Speed-ups are relative to the **first point that finished ok**: it is measured in the same session
    as the rest, and a grid written in the natural order starts at the values being improved on. ``base``
    only sets the knobs the grid does not sweep; to compare with it, put its values first in the grid.
    """

    workload: str
    knobs: list[str]
    points: list[SweepPoint]
    results: list[BurstResult]
    repeats: int
    stopped: bool = False

    @property
    def baseline(self) -> SweepPoint | None:
        """The point speed-ups refer to: the first that finished ok."""
        return next((p for p in self.points if p.samples_per_s is not None and p.ok), None)

    def speedup(self, point: SweepPoint) -> float | None:
        reference = self.baseline
        if reference is None or point.samples_per_s is None or not reference.samples_per_s:
            return None
        return point.samples_per_s / reference.samples_per_s

    def rows(self) -> list[dict[str, Any]]:
        """One plain dict per point: the knob values, then the numbers (None where unknown)."""
        rows = []
        for point in self.points:
            times = point.step_times()
            step = summarize(times) if times else None
            rows.append({
                **point.values,
                "samples_per_s": point.samples_per_s,
                "speedup": self.speedup(point),
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

        columns = [*self.knobs, "samples_per_s", "speedup", "step_ms_median", "step_ms_iqr", "runs", "status",
                   "error"]
        return pd.DataFrame(self.rows(), columns=columns)

    def figure(self, metric: Metric = "samples_per_s") -> Figure:
        """The metric over the grid: a line for one knob, a heatmap for two, parallel coordinates for more."""
        if metric not in METRIC_TITLES:
            raise ValueError(f"metric={metric!r} is invalid: use one of {', '.join(METRIC_TITLES)}")
        values = [row[metric] for row in self.rows()]
        if len(self.knobs) == 1:
            return self._line(metric, values)
        if len(self.knobs) == 2:
            return self._heatmap(metric, values)
        return self._parallel_coordinates(metric, values)

    def _line(self, metric: Metric, values: list[float | None]) -> Figure:
        import plotly.graph_objects as go

        name = self.knobs[0]
        x = [str(p.values[name]) for p in self.points]
        figure = go.Figure(go.Scatter(x=x, y=values, mode="lines+markers", name=METRIC_TITLES[metric]))
        figure.update_layout(title=f"{METRIC_TITLES[metric]} by {name}", xaxis={"title": name, "type": "category"},
                             yaxis_title=METRIC_TITLES[metric], height=360)
        return figure

    def _heatmap(self, metric: Metric, values: list[float | None]) -> Figure:
        """Rows: the first knob's values; columns: the second's. A point that did not finish is left blank."""
        import plotly.graph_objects as go

        rows, columns = self.knobs
        row_values = _unique(p.values[rows] for p in self.points)
        column_values = _unique(p.values[columns] for p in self.points)
        cell = {(str(p.values[rows]), str(p.values[columns])): v for p, v in zip(self.points, values, strict=True)}
        z = [[cell.get((str(r), str(c))) for c in column_values] for r in row_values]
        text = [[_metric_text(metric, v) for v in row] for row in z]
        figure = go.Figure(go.Heatmap(z=z, x=[str(c) for c in column_values], y=[str(r) for r in row_values],
                                      text=text, texttemplate="%{text}", colorscale="Blues",
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


def _schedule(points: int, repeats: int, interleave: bool) -> list[tuple[int, int]]:
    """``(point, repeat)`` in the order they run: each point's repeats together, or round by round."""
    if interleave:
        return [(p, r) for r in range(repeats) for p in range(points)]
    return [(p, r) for p in range(points) for r in range(repeats)]


def sweep(
    workload: Workload,
    grid: Mapping[str, Sequence[Any]],
    *,
    base: Config | None = None,
    steps: int | None = None,
    seconds: float | None = None,
    repeats: int = 1,
    interleave: bool = False,
    engine: Callable[..., BurstResult] = run_burst,
    on_point: Callable[[SweepPoint, BurstResult], None] | None = None,
    stop: threading.Event | None = None,
    progress: bool = True,
) -> SweepResult:
    """Run every point of ``grid`` (knob name → values; the cartesian product) as a burst on ``base``.

    ``aw.sweep(wl, {"batch_size": [16, 32, 64], "num_workers": [0, 2, 4]}, steps=20)`` runs nine bursts.
    Knob names, values, ``steps``/``seconds`` and ``repeats`` are checked, and every point's config against
    this device, before the first burst: :class:`KnobValueError`, :class:`ConfigError` or
    :class:`BurstRequestError` name the point. ``engine`` is called like :func:`run_burst` (with ``steps``,
    ``seconds``, ``label``, ``stop`` and ``on_event``); a burst that raises a :class:`BurstError` is kept with
    its error and the sweep goes on. ``on_point(point, result)`` is called after every burst. Setting ``stop``
    ends the running burst and starts no other (their points read "not run"). ``progress`` shows a line per
    burst on stdout, as the CLI's ladder does.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid: use an integer, repeats >= 1")
    check_burst_request(steps, seconds, None, DEFAULT_TIMEOUT_S, 0)
    points = grid_points(grid, base)
    device = probe_device()
    for point in points:
        try:
            check_config(point.config, device)
        except ConfigError as exc:
            raise ConfigError(f"sweep point {_spell(point.values)}: {exc}") from None
    display = ProgressSeries("burst", len(points) * repeats, steps=steps, seconds=seconds) if progress else None
    result = SweepResult(workload.name, list(grid), points, [], repeats)
    bursts = Bursts(engine, steps=steps, seconds=seconds, stop=stop)
    try:
        for index, repeat in _schedule(len(points), repeats, interleave):
            if bursts.stopped():
                break
            point = points[index]
            burst = _run_point(workload, point, repeat, repeats, bursts, display)
            point.results.append(burst)
            result.results.append(burst)
            if display is not None:
                reference = result.baseline
                print(result_line(burst, reference.results[0] if reference else None), flush=True)
            if on_point is not None:
                on_point(point, burst)
    finally:
        if display is not None:
            display.end()
    result.stopped = bursts.stopped()
    return result


def _run_point(workload: Workload, point: SweepPoint, repeat: int, repeats: int, bursts: Bursts,
               display: ProgressSeries | None) -> BurstResult:
    """One burst of ``point``, its progress on ``display``; a failing one comes back as its (failed) result."""
    name = point.label + (f" (repeat {repeat + 1}/{repeats})" if repeats > 1 else "")
    if display is None:
        return bursts.run(workload, point.config, label=point.label)
    display.begin(name, point.config)
    try:
        return bursts.run(workload, point.config, label=point.label, on_event=display.on_event)
    finally:
        display.end()
