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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..engine.launcher import Engine, run_burst
from ..engine.request import DEFAULT_TIMEOUT_S, check_burst_request
from ..inputs.device import probe_device
from ..inputs.workload import Workload
from ..knobs import KNOBS, KnobValueError
from ..knobs.config import Config
from ..knobs.rules import ConfigError, check_config
from ..results.burst import BurstResult
from ..results.comparison import Comparison
from ..results.sweep import SweepPoint, SweepResult
from ..views.progress import ProgressSeries, result_line
from ..views.text import summary
from .bursts import Bursts, Contender
from .compare import DEFAULT_BUDGET_S, DEFAULT_MIN_EFFECT, _check, measure_pairs


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
        print("\n".join(summary(result).splitlines()[1:]), flush=True)
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
