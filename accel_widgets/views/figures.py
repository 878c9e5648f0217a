"""Figures read at a glance: speed-ups per workload, the ladder as a waterfall, where the step goes, utilisation
per run, the workshop's folklore against what its comparisons measured, and a search's records: samples/s by batch
size (:func:`batch_size_figure`), a sweep's grid (:func:`sweep_figure`).

Each takes the comparison rows (:func:`~accel_widgets.analysis.compare.comparison_rows`) and, where it needs raw
steps or telemetry, the results they came from, so the report, the panel and a notebook draw the same
figure from the same numbers. Runs keep their colour and ``#n`` name from :mod:`.presentation`; every trace
carries ``meta`` with its ``kind`` and its run (``run``) or runs (``runs``), so tests find traces without
relying on names or order. plotly is imported inside the functions, as everywhere in the package.

Spread: a speed-up's whiskers are its comparison's 95% anytime-valid interval (:mod:`accel_widgets.search.compare`),
where the run was compared with its baseline; a run that was not is one burst against one burst, drawn without
whiskers and labelled so: the drift between bursts, the largest noise here, is in no single ratio. The baseline
itself is 1 by definition.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..analysis.compare import Row, comparison_rows, with_comparison
from ..analysis.usage import mean_activity_pct, mean_utilisation_pct
from ..metrics.sequential import Interval
from ..metrics.units import bytes_text
from ..results.batchsize import MEMORY_FAILURES, BatchSizeSearch
from ..results.burst import BurstResult
from ..results.comparison import Comparison
from ..results.sweep import BASE, SweepPoint, SweepResult
from .comparison import interval_text, verdict_text
from .style import COLOURS, PALETTE, STEP_PART_COLOURS, UNRELIABLE, VERDICT_MARKS, run_colour, run_name, shorten
from .table import same_within_pct, speedup_reading
from .text import point_text
from .timeline import has_activity, utilisation_title

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

NOISY_PATTERN = "/"  # hatch of a noisy run's bar
NOISY_MARK = "~ noisy"
UNRELIABLE_PATTERN = "x"  # cross-hatch of an unreliable run's bar, drawn faded: it measured the machine as much
UNRELIABLE_OPACITY = 0.45
_FACET_GAP_PX = 65  # the facet above's tick labels, then this facet's title
_BAR_PX = 30
_SPEEDUP_TICKS = [0.1, 0.2, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 50, 100]
_COMPONENTS = tuple((part, name, STEP_PART_COLOURS[part])
                    for part, name in (("data_s", "data wait"), ("h2d_s", "h2d copy"), ("compute_s", "compute")))
_GRID_COLUMNS = 3
_SMALL_PANEL_PX = 170
_TITLE_CHARS = 34
_WATERFALL_COLOURS = {"increasing": COLOURS["ok"], "decreasing": COLOURS["error"], "totals": COLOURS["totals"]}
_LAYOUT = {"template": "plotly_white", "hovermode": "closest"}


#: The comparison figures by key, with the title of the panel's tab that shows each.
COMPARISONS = {"speedup": "Speed-up", "waterfall": "Ladder waterfall", "breakdown": "Where the step goes",
               "utilisation": "Utilisation per run"}


def comparison_figures(results: Sequence[BurstResult], keys: Collection[str] = tuple(COMPARISONS),
                       compared: Mapping[int, Comparison] | None = None) -> dict[str, Figure]:
    """The figures that compare finished runs, keyed as :data:`COMPARISONS` (the report shows them around the
    timeline, the panel in its Compare tabs), only those in ``keys`` built; ``compared`` maps a run to its
    comparison with its baseline (the speed-up's interval). "waterfall" is left out when no workload has a run
    besides its baseline, and "utilisation" when no run has telemetry: an empty chart is only noise."""
    rows = [with_comparison(row, (compared or {}).get(i)) for i, row in enumerate(comparison_rows(results))]
    builders: dict[str, Callable[[], Figure | None]] = {
        "speedup": lambda: speedup_figure(rows),
        "waterfall": lambda: waterfall_figure(rows) if any(len(ladder(g)) > 1 for g in by_workload(rows).values())
        else None,
        "breakdown": lambda: breakdown_figure(results, rows),
        "utilisation": lambda: utilisation_figure(results, rows) if any(r.telemetry for r in results) else None,
    }
    figures = {key: build() for key, build in builders.items() if key in keys}
    return {key: figure for key, figure in figures.items() if figure is not None}


# -- numbers ---------------------------------------------------------------------------------------
def speedup_whiskers(row: Row) -> tuple[float, float]:
    """How far the interval reaches below and above the speed-up (0, 0 without one: a lone ratio, or the baseline)."""
    interval = row.get("speedup_interval")
    if interval is None or row["speedup"] is None:
        return 0.0, 0.0
    low, high = interval
    return float(row["speedup"]) - low, high - float(row["speedup"])


def by_workload(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Rows grouped by workload, workloads in order of first appearance, runs in run (ladder) order."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(str(row["workload"]), []).append(row)
    return groups


def ladder(rows: Sequence[Row]) -> list[Row]:
    """One workload's runs with a speed-up, from its baseline: the baseline first, the others in run order."""
    measured = [r for r in rows if r["speedup"] is not None]
    return sorted(measured, key=lambda r: (r["run"] != r["baseline"], r["run"]))


def _short_name(row: Row) -> str:
    return run_name(int(row["run"]), str(row["label"]))


def _rows_by_run(rows: Sequence[Row]) -> dict[int, Row]:
    return {int(r["run"]): r for r in rows}


# -- speed-up bars ---------------------------------------------------------------------------------
def speedup_figure(rows: Sequence[Row]) -> Figure:
    """Speed-up over each workload's baseline: one facet per workload, runs in ladder order, a 1× line.

    Workloads hundreds of times apart in samples/s share one axis this way, since a speed-up has no unit.
    Whiskers: the comparison's interval (:func:`speedup_whiskers`), the verdict's mark beside the number; a run
    not compared reads "1 burst". A noisy run's bar is hatched and labelled "~ noisy"; an unreliable run's
    (other load, a stalling machine: :func:`~accel_widgets.results.reliability.reliability`) is cross-hatched,
    faded and labelled "⚠ unreliable", so it never reads as a plain speed-up.
    """
    from plotly.subplots import make_subplots

    groups = {w: ladder(g) for w, g in by_workload(rows).items() if ladder(g)}
    runs = _rows_by_run(rows)
    heights = [len(g) for g in groups.values()] or [1]
    figure = make_subplots(rows=len(heights), cols=1, shared_xaxes=True, row_heights=heights,
                           subplot_titles=list(groups) or ["no run with a speed-up"],
                           vertical_spacing=_spacing(len(heights), _height(heights)))
    for index, (workload, shown) in enumerate(groups.items(), start=1):
        figure.add_trace(_speedup_bars(workload, shown, runs), row=index, col=1)
        figure.update_yaxes(autorange="reversed", row=index, col=1)
    top = max((r["speedup"] + speedup_whiskers(r)[1] for g in groups.values() for r in g), default=1.0)
    figure.add_vline(x=1.0, line={"color": "#444", "dash": "dash", "width": 1}, row="all", col=1)
    figure.update_xaxes(range=[0, max(1.2, top * 1.18)], ticksuffix="×", showticklabels=True)
    figure.update_xaxes(title_text="speed-up over the workload's baseline (whiskers: 95% interval of the comparison; "
                        "hatched: noisy; crossed, faded: unreliable)",
                        row=len(heights), col=1)
    figure.update_layout(**_LAYOUT, title="Speed-up per workload", height=_height(heights), showlegend=False,
                         margin={"l": 10, "r": 20, "t": 70, "b": 50}, bargap=0.25)
    return figure


def _speedup_bars(workload: str, shown: Sequence[Row], runs: dict[int, Row]) -> Any:
    import plotly.graph_objects as go

    whiskers = [speedup_whiskers(r) for r in shown]
    return go.Bar(
        x=[r["speedup"] for r in shown], y=[_short_name(r) for r in shown], orientation="h",
        error_x={"type": "data", "symmetric": False, "array": [above for _, above in whiskers],
                 "arrayminus": [below for below, _ in whiskers], "color": "#333", "thickness": 1.2, "width": 4},
        marker={"color": [run_colour(int(r["run"])) for r in shown],
                "opacity": [UNRELIABLE_OPACITY if r.get("unreliable") else 1.0 for r in shown],
                "pattern": {"shape": [_pattern(r) for r in shown], "fgcolor": "#222", "solidity": 0.2}},
        text=[_bar_text(r) for r in shown],
        textposition="inside", insidetextanchor="start",
        textfont={"color": [_text_colour(run_colour(int(r["run"]))) for r in shown]},
        customdata=[[speedup_reading(r).hover, r["samples_per_s"]] for r in shown],
        hovertemplate="%{y}: %{customdata[0]} (%{customdata[1]:,.1f} samples/s)<extra></extra>",
        meta={"kind": "speedup", "workload": workload, "runs": [int(r["run"]) for r in shown],
              "noisy": [bool(r["noisy"]) for r in shown], "unreliable": [bool(r.get("unreliable")) for r in shown]},
    )


def _bar_text(row: Row) -> str:
    """The cell's value and verdict mark, then the noise mark: "1.23× [1.11–1.35] ▲", "1.25× (1 burst) ⚠ unreliable"."""
    reading = speedup_reading(row)
    hint = f"({reading.hint})" if reading.hint else ""
    return " ".join(part for part in (reading.value, reading.mark, hint, _mark(row)) if part)


def _pattern(row: Row) -> str:
    return UNRELIABLE_PATTERN if row.get("unreliable") else NOISY_PATTERN if row["noisy"] else ""


def _mark(row: Row) -> str:
    return UNRELIABLE if row.get("unreliable") else NOISY_MARK if row["noisy"] else ""


def _text_colour(background: str) -> str:
    """White on a dark bar, near-black on a light one: plotly's own choice loses to a noisy run's hatching."""
    red, green, blue = (int(background[i:i + 2], 16) for i in (1, 3, 5))
    return "#222" if 0.299 * red + 0.587 * green + 0.114 * blue > 150 else "white"


def _height(bars_per_facet: Sequence[int]) -> int:
    return 130 + _FACET_GAP_PX * len(bars_per_facet) + _BAR_PX * max(sum(bars_per_facet), 1)


def _spacing(facets: int, height: int) -> float:
    """Vertical room between facets for the next facet's title, as plotly wants it: a share of the height."""
    return min(_FACET_GAP_PX / height, 0.9 / max(facets - 1, 1)) if facets > 1 else 0.0


# -- ladder waterfall ------------------------------------------------------------------------------
def waterfall_figure(rows: Sequence[Row]) -> Figure:
    """Each workload's ladder as a waterfall: from its baseline (1×), what every later run added to the
    speed-up over the run before it, to the last run's speed-up. One facet per workload with at least two
    runs. Hover gives each step's own samples/s ratio over the step before."""
    from plotly.subplots import make_subplots

    groups = {w: shown for w, g in by_workload(rows).items() if len(shown := ladder(g)) > 1}
    heights = [len(g) + 1 for g in groups.values()] or [1]
    figure = make_subplots(rows=len(heights), cols=1, shared_xaxes=True, row_heights=heights,
                           subplot_titles=list(groups) or ["no workload with more than its baseline"],
                           vertical_spacing=_spacing(len(heights), _height(heights)))
    for index, (workload, shown) in enumerate(groups.items(), start=1):
        figure.add_trace(_waterfall(workload, shown), row=index, col=1)
        figure.update_yaxes(autorange="reversed", row=index, col=1)
    figure.add_vline(x=1.0, line={"color": "#444", "dash": "dash", "width": 1}, row="all", col=1)
    figure.update_xaxes(ticksuffix="×", showticklabels=True)
    figure.update_xaxes(title_text="speed-up over the baseline, step by step", row=len(heights), col=1)
    figure.update_layout(**_LAYOUT, title="Ladder: what each rung added", height=_height(heights),
                         showlegend=False, margin={"l": 10, "r": 20, "t": 70, "b": 50})
    return figure


def _waterfall(workload: str, shown: Sequence[Row]) -> Any:
    import plotly.graph_objects as go

    speedups = [float(r["speedup"]) for r in shown]
    steps = [b - a for a, b in itertools.pairwise(speedups)]
    ratios = [b / a for a, b in itertools.pairwise(speedups)]
    return go.Waterfall(
        orientation="h", measure=["absolute", *["relative"] * len(steps), "total"],
        y=[*(_short_name(r) for r in shown), "= final"], x=[speedups[0], *steps, 0.0],
        text=["1.00× baseline", *(f"{d:+.2f}×" for d in steps), f"{speedups[-1]:.2f}×"], textposition="outside",
        customdata=[speedups[0], *ratios, speedups[-1]],
        hovertemplate="%{y}: ×%{customdata:.2f}<extra></extra>",
        increasing={"marker": {"color": _WATERFALL_COLOURS["increasing"]}},
        decreasing={"marker": {"color": _WATERFALL_COLOURS["decreasing"]}},
        totals={"marker": {"color": _WATERFALL_COLOURS["totals"]}},
        connector={"line": {"color": "#999", "width": 1}},
        meta={"kind": "waterfall", "workload": workload, "runs": [int(r["run"]) for r in shown]},
    )


# -- where the step goes ---------------------------------------------------------------------------
def step_breakdown(result: BurstResult) -> dict[str, float] | None:
    """Median data wait, host-to-device copy and compute of the measured steps, in ms (None without steps)."""
    steps = result.measured_steps()
    if not steps:
        return None
    return {attribute: statistics.median(getattr(s, attribute) for s in steps) * 1e3
            for attribute, _, _ in _COMPONENTS}


def breakdown_figure(results: Sequence[BurstResult], rows: Sequence[Row]) -> Figure:
    """Where a steady step goes: data wait / h2d copy / compute as shares of the median step (100% stacked
    bars, one per run, grouped by workload); hover gives the milliseconds.

    Shares, not milliseconds, because workloads far apart in step time would otherwise leave most bars as
    slivers; the ms are one hover away.
    """
    import plotly.graph_objects as go

    several = len(by_workload(rows)) > 1
    shown = [(row, parts) for group in by_workload(rows).values() for row in group
             if (parts := step_breakdown(results[int(row["run"])])) is not None and sum(parts.values()) > 0]
    names = [run_name(int(r["run"]), str(r["label"]), str(r["workload"]) if several else None) for r, _ in shown]
    figure = go.Figure()
    for attribute, label, colour in _COMPONENTS:
        ms = [parts[attribute] for _, parts in shown]
        shares = [100 * parts[attribute] / sum(parts.values()) for _, parts in shown]
        figure.add_trace(go.Bar(
            y=names, x=shares, customdata=ms, orientation="h", name=label, marker_color=colour,
            texttemplate="%{x:.0f}%", textposition="inside", insidetextanchor="middle",
            hovertemplate=f"%{{y}}: {label} %{{customdata:.3g}} ms (%{{x:.0f}}%)<extra></extra>",
            meta={"kind": attribute, "runs": [int(r["run"]) for r, _ in shown]},
        ))
    figure.update_layout(**_LAYOUT, barmode="stack", title="Where the median step goes",
                         xaxis={"title": "share of the median step (hover: ms)", "range": [0, 100],
                                "ticksuffix": "%"},
                         yaxis={"autorange": "reversed"}, height=150 + _BAR_PX * max(len(shown), 1),
                         legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "traceorder": "normal"},
                         uniformtext={"minsize": 9, "mode": "hide"},
                         margin={"l": 10, "r": 20, "t": 80, "b": 50})
    return figure


# -- utilisation small multiples -------------------------------------------------------------------
def utilisation_figure(results: Sequence[BurstResult], rows: Sequence[Row]) -> Figure:
    """One small panel per run (grouped by workload), device utilisation against time on a shared 0-100
    axis, its mean in the panel's title: fifteen runs overlaid in one panel read as one tangle."""
    from plotly.subplots import make_subplots

    shown = [row for group in by_workload(rows).values() for row in group if results[int(row["run"])].telemetry]
    several = len(by_workload(rows)) > 1
    columns = max(1, min(_GRID_COLUMNS, len(shown)))
    grid_rows = max(1, math.ceil(len(shown) / columns))
    height = 90 + _SMALL_PANEL_PX * grid_rows
    titles = [_panel_title(row, results[int(row["run"])], several) for row in shown] or ["no telemetry"]
    figure = make_subplots(rows=grid_rows, cols=columns, shared_yaxes="all", subplot_titles=titles,
                           horizontal_spacing=0.04, vertical_spacing=min(0.3, 75 / height))
    for index, row in enumerate(shown):
        _add_device_lines(figure, row, results[int(row["run"])], index // columns + 1, index % columns + 1)
    figure.update_yaxes(range=[0, 105], tickvals=[0, 50, 100])
    figure.update_annotations(font={"size": 11})
    figure.update_layout(**_LAYOUT, height=height, showlegend=False, margin={"l": 40, "r": 20, "t": 80, "b": 40},
                         title=utilisation_title({t.source for r in results for t in r.telemetry},
                                                 has_activity(t for r in results for t in r.telemetry))
                         + " per run, against time since launch (s)")
    return figure


def _panel_title(row: Row, result: BurstResult, several: bool) -> str:
    name = run_name(int(row["run"]), str(row["label"]), str(row["workload"]) if several else None)
    mean = mean_utilisation_pct(result)
    sm, tensor = mean_activity_pct(result, "sm_active_pct"), mean_activity_pct(result, "tensor_active_pct")
    parts = [f"mean {mean:.0f}%" if mean is not None else "", f"SM {sm:.0f}%" if sm is not None else "",
             f"tensor {tensor:.0f}%" if tensor is not None else ""]
    return " · ".join([shorten(name, _TITLE_CHARS), *filter(None, parts)])


def _add_device_lines(figure: Figure, row: Row, result: BurstResult, grid_row: int, grid_col: int) -> None:
    import plotly.graph_objects as go

    from .timeline import add_activity_traces, device_groups, utilisation_points

    run = int(row["run"])
    for index, (device, samples) in enumerate(device_groups(result.telemetry).items()):
        x, y, memory = utilisation_points(samples)
        figure.add_trace(go.Scatter(
            x=x, y=y, customdata=memory, mode="lines", name=f"#{run} {device}",
            line={"color": run_colour(run), "width": 1.5, "dash": ("solid", "dot", "dash")[index % 3]},
            hovertemplate=f"#{run} {device}: %{{y:.0f}}%, %{{customdata:,.0f}} MiB at %{{x:.1f}} s<extra></extra>",
            meta={"run": run, "kind": "util", "device": device}), row=grid_row, col=grid_col)
        add_activity_traces(figure, run, f"#{run}", device=device, samples=samples, row=grid_row, col=grid_col)


# -- the workshop: folklore against this machine ---------------------------------------------------
NOISE_FLOOR_FILL = "rgba(120,120,120,0.16)"


@dataclass(frozen=True)
class Lesson:
    """One workshop lesson: the folklore's promised speed-up range and the comparison that tests it on this machine.

    ``comparison`` measures the lesson's config against the baseline (:func:`accel_widgets.compare`: interleaved
    blocks until a 95% interval settles a verdict or the budget is spent); None when the lesson's knob could not act
    here or was left out. A comparison of the baseline with itself is the noise floor: what this machine does to one
    config from burst to burst, the spread a lone ratio would be read against.
    """

    title: str
    folklore: tuple[float, float]
    folklore_text: str
    comparison: Comparison | None = None

    def speedup(self) -> Interval | None:
        """The measured speed-up with its interval (unbounded while too few blocks counted); None when nothing was
        compared: the lesson was skipped, a config failed, or no block counted."""
        found = self.comparison
        if found is None or found.error or found.ratio is None:
            return None
        return found.interval

    def noise_floor(self) -> tuple[float, float] | None:
        """For a lesson that compares the baseline with itself: the lowest and highest rate of one burst over its
        block's other bursts of the same config, how far this machine moves one config (None for any other lesson,
        or before a block counted)."""
        found = self.comparison
        if found is None or not found.same_config or not (ratios := found.window_ratios):
            return None
        return min(ratios), max(ratios)

    def bursts(self) -> tuple[list[BurstResult], list[BurstResult]]:
        """Every burst the baseline and the lesson's config measured, block by block (left-out blocks too: they show
        what other load did); each config's first burst alone when no block ran."""
        found = self.comparison
        if found is None:
            return [], []
        if found.blocks:
            return found.reference_windows, found.subject_windows
        return found.firsts[:1], found.firsts[1:2]

    def headline(self) -> str:
        """What was measured, in the words printed beside the folklore: the noise floor's burst-to-burst range, "no
        measurable effect here (within ±4%)", or the interval and its verdict."""
        found = self.comparison
        if found is None:
            return "not measured here"
        if found.error:
            return f"not compared ({found.error})"
        if found.ratio is None:
            return f"undecided: {_no_block(found)}"
        if (floor := self.noise_floor()) is not None:
            return (f"this machine moves the same config {floor[0]:.2f}–{floor[1]:.2f}× from burst to burst "
                    f"({interval_text(found)}, {verdict_text(found)})")
        if found.verdict == "same":
            return f"no measurable effect here (within ±{same_within_pct(found.interval.low, found.interval.high)}%)"
        return f"{interval_text(found)}, {found.verdict}"


def _no_block(comparison: Comparison) -> str:
    """Why a comparison has no counted block: its blocks were left out for other load, or none was run."""
    left_out = [block.left_out for block in comparison.blocks if block.left_out]
    if left_out:
        return f"no block counted ({len(left_out)} left out: {left_out[0]})"
    return f"no block counted ({comparison.stopped or 'none run'})"


def _point_text(comparison: Comparison) -> str:
    """The chart's label of a measured lesson: "1.42× faster", "same ±4%", "1.03× undecided"."""
    if comparison.verdict == "same":
        return verdict_text(comparison)
    return f"{comparison.ratio:.2f}× {verdict_text(comparison)}"


def _unmeasured_text(lesson: Lesson) -> str:
    """The chart's label where a lesson has no measured speed-up (its hover gives the whole reason)."""
    if lesson.comparison is None:
        return "skipped here"
    return "not compared" if lesson.comparison.error else "undecided: no block counted"


def folklore_figure(lessons: Sequence[Lesson]) -> Figure:
    """Per lesson, the folklore's range as a band and the speed-up measured here as a point with its comparison's
    95% interval as whiskers and its verdict beside it, on a log axis (0.5× and 2× are as far from 1× as each other).
    The noise floor lesson's burst-to-burst range is a shaded band around 1× across every lesson: a lone ratio inside
    it says nothing. A lesson without a measured speed-up says why where its point would be."""
    import plotly.graph_objects as go

    titles = [lesson.title for lesson in lessons]
    measured = [(lesson, comparison, found) for lesson in lessons
                if (comparison := lesson.comparison) is not None and (found := lesson.speedup()) is not None]
    unmeasured = [lesson for lesson in lessons if lesson.speedup() is None]
    floor = next((f for lesson in lessons if (f := lesson.noise_floor()) is not None), None)
    figure = go.Figure()
    figure.add_trace(go.Bar(
        y=titles, base=[lesson.folklore[0] for lesson in lessons], orientation="h", width=0.55,
        x=[max(hi - lo, hi * 0.04) for lo, hi in (lesson.folklore for lesson in lessons)],
        marker={"color": COLOURS["promise"], "line": {"color": PALETTE[4], "width": 1}},
        name="folklore promises", customdata=[lesson.folklore_text for lesson in lessons],
        hovertemplate="%{y}: folklore %{customdata}<extra></extra>", meta={"kind": "folklore"}))
    whiskers = [(found.ratio - found.low, found.high - found.ratio) if found.bounded else (0.0, 0.0)
                for _, _, found in measured]
    figure.add_trace(go.Scatter(
        y=[lesson.title for lesson, _, _ in measured], x=[found.ratio for _, _, found in measured],
        mode="markers+text",
        error_x={"type": "data", "symmetric": False, "array": [above for _, above in whiskers],
                 "arrayminus": [below for below, _ in whiskers], "thickness": 1.5, "width": 6},
        marker={"size": 11, "color": [COLOURS[VERDICT_MARKS[c.verdict][1]] for _, c, _ in measured]},
        text=[_point_text(c) for _, c, _ in measured], textposition="top center",
        name="measured here (95% interval, verdict)", customdata=[lesson.headline() for lesson, _, _ in measured],
        hovertemplate="%{y}: %{customdata}<extra></extra>",
        meta={"kind": "measured", "verdicts": [c.verdict for _, c, _ in measured]}))
    values = [v for lesson in lessons for v in lesson.folklore] + list(floor or ())
    values += [v for _, _, found in measured for v in (found.ratio, found.low, found.high) if 0 < v < math.inf]
    low, high = min([*values, 1.0]) / 1.5, max([*values, 1.0]) * 1.5
    if unmeasured:  # at the left edge, clear of the 1× line and the bands
        figure.add_trace(go.Scatter(
            y=[lesson.title for lesson in unmeasured], x=[low * 1.05] * len(unmeasured), mode="text",
            name="not measured", text=[_unmeasured_text(lesson) for lesson in unmeasured],
            customdata=[lesson.headline() for lesson in unmeasured], textposition="middle right",
            textfont={"color": COLOURS["muted"]}, showlegend=False, hovertemplate="%{y}: %{customdata}<extra></extra>",
            meta={"kind": "unmeasured"}))
    if floor is not None:
        figure.add_vrect(x0=floor[0], x1=floor[1], fillcolor=NOISE_FLOOR_FILL, line_width=0, layer="below",
                         showlegend=True, name=f"noise floor: the same config {floor[0]:.2f}–{floor[1]:.2f}× "
                                               "burst to burst")
    figure.add_vline(x=1.0, line={"color": "#444", "dash": "dash", "width": 1})
    figure.update_layout(**_LAYOUT, title="Folklore vs. this machine", height=160 + 50 * max(len(lessons), 1),
                         xaxis={"type": "log", "range": [math.log10(low), math.log10(high)], "ticksuffix": "×",
                                "tickvals": [t for t in _SPEEDUP_TICKS if low <= t <= high],
                                "title": "speed-up over the baseline (log; whiskers: 95% anytime-valid interval)"},
                         yaxis={"autorange": "reversed"}, legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
                         margin={"l": 10, "r": 20, "t": 100, "b": 50})
    return figure


def step_distributions(lessons: Sequence[Lesson]) -> Figure:
    """Each compared lesson's step times side by side: every burst of the baseline's and every burst of the lesson's
    config (:meth:`Lesson.bursts`), as boxes on a log axis, so a speed-up can be seen against the spread it is read
    from. Boxes mark outliers only: a comparison's bursts hold hundreds of steps."""
    import plotly.graph_objects as go

    def step_ms(bursts: Sequence[BurstResult]) -> list[float]:
        return [t * 1e3 for burst in bursts for t in burst.step_times()]

    shown = [(lesson.title, [step_ms(side) for side in lesson.bursts()]) for lesson in lessons]
    shown = [(title, sides) for title, sides in shown if all(sides)]
    figure = go.Figure()
    for side, (kind, name, colour) in enumerate((("baseline_steps", "baseline", COLOURS["neutral"]),
                                                 ("lesson_steps", "with the lesson's knob", COLOURS["info"]))):
        figure.add_trace(go.Box(x=[title for title, sides in shown for _ in sides[side]],
                                y=[ms for _, sides in shown for ms in sides[side]], name=name, marker_color=colour,
                                boxpoints="outliers", marker={"size": 4}, meta={"kind": kind}))
    figure.update_layout(**_LAYOUT, boxmode="group",
                         title="Step times of every burst each comparison ran, baseline vs. each lesson",
                         yaxis={"type": "log", "title": "step time (ms, log)"}, height=420,
                         legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
                         margin={"l": 60, "r": 20, "t": 80, "b": 60})
    return figure


# -- a batch-size search ----------------------------------------------------------------------------------------------
def batch_size_figure(search: BatchSizeSearch) -> Figure:
    """samples/s against batch size (log2 axis), the sizes that did not fit marked at the bottom, peak memory on the
    right axis with the cap and the margin, and the largest fit annotated. Traces carry ``meta["kind"]``."""
    from plotly.subplots import make_subplots

    figure = make_subplots(specs=[[{"secondary_y": True}]])
    figure.update_layout(template="plotly_white", height=380, hovermode="closest",
                         title={"text": f"{search.workload}: samples/s by batch size"},
                         margin={"l": 60, "r": 60, "t": 60, "b": 45}, legend={"x": 1.08, "y": 1})
    for trace, on_memory_axis in _batch_traces(search):
        figure.add_trace(trace, secondary_y=on_memory_axis)
    sizes = [t.batch_size for t in search.tries] or [1]
    ticks = [1 << k for k in range(min(sizes).bit_length() - 1, max(sizes).bit_length())]
    per = "per DDP rank, " if search.config.ranks > 1 else ""
    figure.update_xaxes(type="log", title_text=f"batch size ({per}log2 axis)", tickvals=ticks,
                        ticktext=[f"{v:,}" for v in ticks])
    figure.update_yaxes(title_text="samples/s", rangemode="tozero", secondary_y=False)
    figure.update_yaxes(title_text=f"peak memory (MiB, {search.memory_kind})", rangemode="tozero", showgrid=False,
                        secondary_y=True)
    _memory_lines(figure, search)
    if search.largest_fitting is not None:
        figure.add_vline(x=search.largest_fitting, line={"dash": "dot", "color": COLOURS["ok"]})
        figure.add_annotation(text=f"largest fit {search.largest_fitting:,}", x=math.log10(search.largest_fitting),
                              yref="paper", y=1, yanchor="bottom", showarrow=False, font={"color": COLOURS["ok"]})
    return figure


def _memory_lines(figure: Figure, search: BatchSizeSearch) -> None:
    """The cap and the margin's line on the memory axis, each labelled, where the search had them."""
    if search.cap_bytes is not None:
        figure.add_hline(y=search.cap_bytes / 2**20, line={"dash": "dash", "color": COLOURS["error"]},
                         secondary_y=True)
        figure.add_annotation(text=f"cap {bytes_text(search.cap_bytes)}", xref="paper", x=0, yref="y2",
                              y=search.cap_bytes / 2**20, xanchor="left", yanchor="bottom", showarrow=False,
                              font={"color": COLOURS["error"]})
    allowed = search.peak_allowed_bytes
    if search.margin and allowed is not None:
        figure.add_hline(y=allowed / 2**20, line={"dash": "dot", "color": COLOURS["warning"]}, secondary_y=True)
        figure.add_annotation(text=f"{search.margin:.0%} margin", xref="paper", x=1, yref="y2", y=allowed / 2**20,
                              xanchor="right", yanchor="top", showarrow=False, font={"color": COLOURS["warning"]})


def _batch_traces(search: BatchSizeSearch) -> list[tuple[Any, bool]]:
    """(trace, on the memory axis) of the figure: the throughput curve (and the one under the setting that made
    room), the sizes that did not fit, peak memory."""
    import plotly.graph_objects as go

    curve = search.curve()
    failed = sorted((t for t in search.tries if t.failure in MEMORY_FAILURES), key=lambda t: t.batch_size)
    measured = sorted((t for t in search.tries if t.peak_memory_bytes is not None), key=lambda t: t.batch_size)
    roomy = search.curve(search.room_setting) if search.room_setting else []
    room = [(go.Scatter(x=[t.batch_size for t in roomy], y=[t.samples_per_s for t in roomy], mode="lines+markers",
                        name=f"with {search.room_setting}", line={"color": PALETTE[2], "dash": "dash"},
                        meta={"kind": "samples_per_s_with_room"},
                        hovertemplate="batch %{x:,}: %{y:,.4g} samples/s<extra></extra>"), False)] if roomy else []
    return [*room,
        (go.Scatter(x=[t.batch_size for t in curve], y=[t.samples_per_s for t in curve], mode="lines+markers",
                    name="samples/s", line={"color": PALETTE[0]}, meta={"kind": "samples_per_s"},
                    hovertemplate="batch %{x:,}: %{y:,.4g} samples/s<extra></extra>"), False),
        (go.Scatter(x=[t.batch_size for t in failed], y=[0] * len(failed), mode="markers", name="does not fit",
                    marker={"symbol": "x", "size": 11, "color": COLOURS["error"]}, text=[t.why_not for t in failed],
                    meta={"kind": "does_not_fit"}, hovertemplate="batch %{x:,}: %{text}<extra></extra>"), False),
        (go.Scatter(x=[t.batch_size for t in measured], y=[(t.peak_memory_bytes or 0) / 2**20 for t in measured],
                    mode="markers", name="peak memory", marker={"symbol": "diamond-open", "color": "#777"},
                    meta={"kind": "peak_memory"}, hovertemplate="batch %{x:,}: %{y:,.0f} MiB<extra></extra>"), True),
    ]


# -- a sweep ----------------------------------------------------------------------------------------------------------
#: What a sweep's figure can show over its grid.
SweepMetric = Literal["samples_per_s", "speedup"]
SWEEP_METRICS: dict[SweepMetric, str] = {"samples_per_s": "samples/s", "speedup": "speed-up"}


def sweep_figure(swept: SweepResult, metric: SweepMetric = "samples_per_s") -> Figure:
    """``metric`` over a sweep's grid: a line for one knob, a heatmap for two, parallel coordinates for more. The
    speed-up's line has the interval as whiskers and every cell or point its verdict on hover."""
    if metric not in SWEEP_METRICS:
        raise ValueError(f"metric={metric!r} is invalid: use one of {', '.join(SWEEP_METRICS)}")
    rows = swept.rows()
    values = [row[metric] for row in rows]
    if len(swept.knobs) == 1:
        return _sweep_line(swept, metric, values, rows)
    if len(swept.knobs) == 2:
        return _sweep_heatmap(swept, metric, values)
    return _sweep_parallel_coordinates(swept, metric, values)


def _sweep_cell_text(swept: SweepResult, metric: SweepMetric, point: SweepPoint, value: float | None) -> str:
    """A cell's text: the number, and for the speed-up its interval or verdict (``1.45×<br>[1.30–1.62]``,
    ``same ±3%``, ``base``)."""
    if metric != "speedup" or value is None:
        return _sweep_metric_text(metric, value)
    if point.config == swept.base:
        return BASE
    comparison = point.comparison
    if comparison is None:
        return "–"
    if comparison.verdict == "same":
        return verdict_text(comparison)
    return interval_text(comparison).replace(" [", "<br>[").replace(" (", "<br>(")


def _sweep_line(swept: SweepResult, metric: SweepMetric, values: list[float | None],
                rows: list[dict[str, Any]]) -> Figure:
    """One knob: the metric by its values, the speed-up with its interval as whiskers."""
    import plotly.graph_objects as go

    name = swept.knobs[0]
    x = [str(p.values[name]) for p in swept.points]
    error_y = None
    if metric == "speedup":
        high = [row["speedup_high"] - v if row["speedup_high"] is not None and v is not None else None
                for row, v in zip(rows, values, strict=True)]
        low = [v - row["speedup_low"] if row["speedup_low"] is not None and v is not None else None
               for row, v in zip(rows, values, strict=True)]
        error_y = {"type": "data", "symmetric": False, "array": high, "arrayminus": low}
    hover = [f"{p.label}: {point_text(swept, p)}" for p in swept.points]
    figure = go.Figure(go.Scatter(x=x, y=values, mode="lines+markers", name=SWEEP_METRICS[metric],
                                  error_y=error_y, hovertext=hover, hoverinfo="text+y"))
    figure.update_layout(title=f"{SWEEP_METRICS[metric]} by {name}" + (f" against {swept.base.label()} (95% "
                                                                        "interval)" if error_y else ""),
                         xaxis={"title": name, "type": "category"}, yaxis_title=SWEEP_METRICS[metric],
                         height=360)
    return figure


def _sweep_heatmap(swept: SweepResult, metric: SweepMetric, values: list[float | None]) -> Figure:
    """Two knobs. Rows: the first knob's values; columns: the second's. A point that did not finish is left blank."""
    import plotly.graph_objects as go

    rows, columns = swept.knobs
    row_values = _unique(p.values[rows] for p in swept.points)
    column_values = _unique(p.values[columns] for p in swept.points)
    key = [(str(p.values[rows]), str(p.values[columns])) for p in swept.points]
    cell = dict(zip(key, values, strict=True))
    said = {k: _sweep_cell_text(swept, metric, p, v) for k, p, v in zip(key, swept.points, values, strict=True)}
    hover = {k: f"{p.label}: {point_text(swept, p)}" for k, p in zip(key, swept.points, strict=True)}
    grid = [[(str(r), str(c)) for c in column_values] for r in row_values]
    z = [[cell.get(k) for k in line] for line in grid]
    text = [[said.get(k, "–") for k in line] for line in grid]
    figure = go.Figure(go.Heatmap(z=z, x=[str(c) for c in column_values], y=[str(r) for r in row_values],
                                  text=text, texttemplate="%{text}", colorscale="Blues",
                                  customdata=[[hover.get(k, "") for k in line] for line in grid],
                                  hovertemplate="%{customdata}<extra></extra>",
                                  colorbar={"title": SWEEP_METRICS[metric]}))
    figure.update_layout(title=f"{SWEEP_METRICS[metric]}: {rows} × {columns}", height=360,
                         xaxis={"title": columns, "type": "category"}, yaxis={"title": rows, "type": "category"})
    return figure


def _sweep_parallel_coordinates(swept: SweepResult, metric: SweepMetric, values: list[float | None]) -> Figure:
    """Three knobs or more: one axis per knob and one for the metric; categorical knobs (strings, bools, None) become
    ticks."""
    import plotly.graph_objects as go

    dimensions = [_dimension(name, [p.values[name] for p in swept.points]) for name in swept.knobs]
    measured = [v if v is not None else float("nan") for v in values]
    dimensions.append({"label": SWEEP_METRICS[metric], "values": measured})
    figure = go.Figure(go.Parcoords(line={"color": measured, "colorscale": "Blues", "showscale": True},
                                    dimensions=dimensions))
    figure.update_layout(title=f"{SWEEP_METRICS[metric]} over {', '.join(swept.knobs)}", height=420)
    return figure


def _unique(values: Iterable[Any]) -> list[Any]:
    """The distinct values in first-seen order, told apart by how they are shown (1 and True are two)."""
    seen: dict[str, Any] = {}
    for value in values:
        seen.setdefault(str(value), value)
    return list(seen.values())


def _sweep_metric_text(metric: SweepMetric, value: float | None) -> str:
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
