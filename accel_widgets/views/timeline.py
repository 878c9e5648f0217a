"""The timeline figure: device utilisation against time and step time against step (warm-up steps hollow,
one trace per DDP rank, one line per GPU), as the report and the panel's Compare tab draw it with plotly.

plotly is imported inside the functions that build figures, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..metrics.units import significant
from ..results.burst import BurstResult, StepRecord, TelemetrySample
from .style import run_colour

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

TIMELINE_HEIGHT = 380
TIMELINE_META = "accel_widgets timeline"  # the figure's layout.meta: what a face reflowing figures looks for
TIMELINE_MARGIN_B = 45
TIMELINE_TITLES = ("Device utilisation (hover: memory)", "Step time (hollow: warm-up / compile)")
_UTILISATION_TITLES = {"nvml": "GPU utilisation % (NVML)", "psutil": "workers' CPU % of machine (psutil)"}
_DASHES = ("solid", "dot", "dash", "dashdot", "longdash", "longdashdot")
_LOG_TICKS = [m * 10.0**e for e in range(-2, 7) for m in (1, 2, 5)]
_STEPS_AT = {"row": 1, "col": 2}
_UTILISATION_AT = {"row": 1, "col": 1}
#: The step axis spans at least this many decades (a flat line still gets two labelled ticks), padded by the other.
_MIN_DECADES = 0.5
_PAD_DECADES = 0.05
#: Tick mantissas by the decades the step axis spans: finer labels on a zoomed axis, sparser on a wide one.
_MANTISSAS = ((1.5, (1, 1.5, 2, 3, 5, 7)), (4.0, (1, 2, 5)), (math.inf, (1,)))
STEP_AXIS = "step"  # the step subplot's x title; a note on warm-up steps off the top joins it


#: NVML's GPM metrics drawn beside utilisation, thinner, in the run's colour: (trace kind, sample field, name, dash).
ACTIVITY_TRACES = (("sm_active", "sm_active_pct", "SM active", "dot"),
                   ("tensor_active", "tensor_active_pct", "tensor active", "dash"))
#: The traces of the utilisation half: a device's utilisation line and its GPM lines.
UTILISATION_KINDS = frozenset({"util", *(kind for kind, *_ in ACTIVITY_TRACES)})
ACTIVITY_NOTE = "; dotted: SM active, dashed: tensor cores active (NVML GPM)"


def utilisation_title(sources: Collection[str], activity: bool = False) -> str:
    """Say what the utilisation axis measures: a GPU's busy share and a CPU share are not comparable; with
    ``activity``, that the GPM lines beside it say how busy the SMs and tensor cores were inside that time."""
    kinds = set(sources)
    note = ACTIVITY_NOTE if activity else ""
    if len(kinds) == 1:
        return _UTILISATION_TITLES.get(next(iter(kinds)), "utilisation %") + note
    return ("utilisation % (GPU: NVML, CPU: workers' share of machine)" if kinds else "utilisation %") + note


def has_activity(samples: Iterable[TelemetrySample]) -> bool:
    """Whether any sample carries NVML's GPM readings (a Hopper or newer GPU)."""
    return any(getattr(s, field) is not None for s in samples for _, field, _, _ in ACTIVITY_TRACES)


def timeline_figure(utilisation: str) -> Figure:
    """The empty timeline: utilisation against time (left), step time against step (right, log scale).

    ``utilisation`` is the left axis's title (:func:`utilisation_title`). Runs are added with
    :func:`add_run_legend`, :func:`add_step_trace` and :func:`add_utilisation_trace`.
    """
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, subplot_titles=TIMELINE_TITLES)
    figure.update_layout(
        height=TIMELINE_HEIGHT, template="plotly_white", margin={"l": 60, "r": 10, "t": 40, "b": TIMELINE_MARGIN_B},
        legend={"title": {"text": "runs"}, "x": 1.02, "y": 1}, hovermode="closest",
        uirevision="keep",  # keep the user's zoom while data streams in
        meta=TIMELINE_META,
    )
    figure.update_xaxes(title_text="time since launch (s)", **_UTILISATION_AT)
    figure.update_yaxes(title_text=utilisation, range=[0, 105], **_UTILISATION_AT)
    figure.update_xaxes(title_text=STEP_AXIS, **_STEPS_AT)
    # Log scale: a compile step can be 1000x a steady one. Plain 1-2-5 labels, not plotly's digit-only ones.
    figure.update_yaxes(title_text="step time (ms, log)", type="log", tickvals=_LOG_TICKS,
                        ticktext=[f"{v:g}" for v in _LOG_TICKS], **_STEPS_AT)
    return figure


def add_run_legend(figure: Figure, run: int, name: str, visible: bool = True) -> Any:
    """The run's one legend entry, toggling all its traces: a data-less trace of its own, so the legend
    reads the same whichever of the run's traces (telemetry or steps) has data first."""
    colour = run_colour(run)
    figure.add_trace(_scatter(x=[None], y=[None], mode="lines+markers", name=name, legendgroup=f"run{run}",
                              showlegend=True, line={"color": colour}, marker={"size": 4, "color": colour},
                              meta={"run": run, "kind": "legend"}, visible=visible), **_STEPS_AT)
    return figure.data[-1]


def step_groups(steps: Iterable[StepRecord]) -> dict[tuple[int, bool], list[StepRecord]]:
    """Steps by (rank, warm-up): each group is one trace, warm-up steps kept out of the measured line."""
    groups: dict[tuple[int, bool], list[StepRecord]] = {}
    for step in steps:
        groups.setdefault((step.rank, step.warmup), []).append(step)
    return dict(sorted(groups.items(), key=lambda item: (item[0][0], not item[0][1])))


def step_points(steps: Sequence[StepRecord]) -> tuple[list[int], list[float]]:
    """(step number, step time in ms) of each step."""
    return [s.step for s in steps], [s.total_s * 1e3 for s in steps]


def add_step_trace(figure: Figure, run: int, name: str, *, rank: int, ranks: int, warmup: bool,
                   steps: Sequence[StepRecord], visible: bool = True) -> Any:
    """One rank's measured steps as a line (dashed by rank), or its warm-up steps as hollow, faded markers in
    the run's colour (so they read as that run's while staying out of the line)."""
    colour = run_colour(run)
    rank_name = f"{name} rank {rank}" if ranks > 1 else name
    x, y = step_points(steps)
    common: dict[str, Any] = {"x": x, "y": y, "name": rank_name, "legendgroup": f"run{run}", "showlegend": False,
                              "visible": visible, "meta": {"run": run, "kind": "warmup" if warmup else "step",
                                                           "rank": rank}}
    if warmup:
        trace = _scatter(mode="markers", opacity=0.7, marker={"symbol": "circle-open", "size": 9, "color": colour,
                                                              "line": {"width": 2}},
                         hovertemplate=f"{rank_name} warm-up step %{{x}}: %{{y:.3g}} ms<extra></extra>", **common)
    else:
        trace = _scatter(mode="lines+markers", line={"color": colour, "dash": _DASHES[rank % len(_DASHES)]},
                         marker={"size": 4, "color": colour},
                         hovertemplate=f"{rank_name} step %{{x}}: %{{y:.3g}} ms<extra></extra>", **common)
    figure.add_trace(trace, **_STEPS_AT)
    return figure.data[-1]


def device_groups(samples: Iterable[TelemetrySample]) -> dict[str, list[TelemetrySample]]:
    """Telemetry by device: each device (each GPU of a multi-GPU run) is one line."""
    groups: dict[str, list[TelemetrySample]] = {}
    for sample in samples:
        groups.setdefault(sample.device, []).append(sample)
    return groups


def utilisation_points(samples: Sequence[TelemetrySample]) -> tuple[list[float], list[float], list[float]]:
    """(time, utilisation %, memory MiB) of each sample; memory rides along as hover data (a third axis made
    the plot unreadable)."""
    return [s.t for s in samples], [s.util_pct for s in samples], [s.mem_used_bytes / 2**20 for s in samples]


def add_utilisation_trace(figure: Figure, run: int, name: str, *, device: str, index: int,
                          samples: Sequence[TelemetrySample], visible: bool = True) -> Any:
    """One device's utilisation line; the run's ``index``-th device gets the ``index``-th dash."""
    x, y, memory = utilisation_points(samples)
    figure.add_trace(_scatter(
        x=x, y=y, customdata=memory, mode="lines", name=name, legendgroup=f"run{run}", showlegend=False,
        visible=visible, line={"color": run_colour(run), "width": 2, "dash": _DASHES[index % len(_DASHES)]},
        meta={"run": run, "kind": "util", "device": device},
        hovertemplate=f"{name} {device}: %{{y:.0f}}% busy, %{{customdata:,.0f}} MiB at %{{x:.1f}} s<extra></extra>",
    ), **_UTILISATION_AT)
    return figure.data[-1]


def activity_points(samples: Sequence[TelemetrySample], field: str) -> tuple[list[float], list[float | None]]:
    """(time, GPM reading %) of each sample that has one."""
    shown = [s for s in samples if getattr(s, field) is not None]
    return [s.t for s in shown], [getattr(s, field) for s in shown]


def add_activity_traces(figure: Figure, run: int, name: str, *, device: str, samples: Sequence[TelemetrySample],
                        visible: bool = True, **at: int) -> list[Any]:
    """One device's "SM active" and "tensor active" lines (NVML GPM), thin, dotted and dashed in the run's colour,
    in the utilisation subplot (``at``: another figure's row and col); none for a device without GPM readings."""
    added = []
    for kind, field, label, dash in ACTIVITY_TRACES:
        x, y = activity_points(samples, field)
        if not x:
            continue
        figure.add_trace(_scatter(
            x=x, y=y, mode="lines", name=f"{name} {label}", legendgroup=f"run{run}", showlegend=False,
            visible=visible, opacity=0.8, line={"color": run_colour(run), "width": 1, "dash": dash},
            meta={"run": run, "kind": kind, "device": device},
            hovertemplate=f"{name} {device}: {label} %{{y:.0f}}% at %{{x:.1f}} s<extra></extra>",
        ), **(at or _UTILISATION_AT))
        added.append(figure.data[-1])
    return added


def timeline(results: Sequence[BurstResult], names: Sequence[str]) -> Figure:
    """The timeline of finished runs, named ``names``: the figure the panel builds live, built at once."""
    samples = [t for r in results for t in r.telemetry]
    figure = timeline_figure(utilisation_title({t.source for t in samples}, has_activity(samples)))
    for run, (result, name) in enumerate(zip(results, names, strict=True)):
        add_run_legend(figure, run, name)
        for index, (device, samples) in enumerate(device_groups(result.telemetry).items()):
            add_utilisation_trace(figure, run, name, device=device, index=index, samples=samples)
            add_activity_traces(figure, run, name, device=device, samples=samples)
        for (rank, warmup), steps in step_groups(result.steps).items():
            add_step_trace(figure, run, name, rank=rank, ranks=max(1, result.world_size), warmup=warmup,
                           steps=steps)
    fit_step_axis(figure)
    return figure


def step_times_only(figure: Figure) -> Figure:
    """``figure`` (a :func:`timeline`) without its utilisation half, the step times across the whole width: the
    report draws utilisation per run, one small panel each, rather than every run overlaid in one."""
    figure.data = tuple(trace for trace in figure.data if trace.meta.get("kind") not in UTILISATION_KINDS)
    figure.layout.annotations = [annotation for annotation in figure.layout.annotations
                                 if annotation.text == TIMELINE_TITLES[1]]
    figure.layout.annotations[0].x = 0.5
    figure.update_xaxes(visible=False, **_UTILISATION_AT)
    figure.update_yaxes(visible=False, **_UTILISATION_AT)
    figure.update_xaxes(domain=[0.0, 1.0], **_STEPS_AT)
    return figure


def step_axis_range(measured_ms: Collection[float]) -> tuple[float, float]:
    """The step axis's range in log10 units (plotly's for a log axis): the measured steps, padded, never
    narrower than :data:`_MIN_DECADES`. Warm-up steps are left out: one 30 s compile step would flatten
    every steady step onto one line."""
    low, high = math.log10(min(measured_ms)), math.log10(max(measured_ms))
    widen = max(0.0, _MIN_DECADES - (high - low)) / 2
    return low - widen - _PAD_DECADES, high + widen + _PAD_DECADES


def log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 style tick values (ms) inside the log10 range [low, high], finer the narrower it is."""
    mantissas = next(m for span, m in _MANTISSAS if high - low <= span)
    return [m * 10.0**e for e in range(math.floor(low), math.ceil(high) + 1) for m in mantissas
            if low <= math.log10(m * 10.0**e) <= high]


def fit_step_axis(figure: Figure) -> None:
    """Zoom the step axis to the visible runs' measured steps and say how many warm-up steps lie above it.

    Warm-up points stay in the figure (zoom out or double-click to see them); a note in the step axis's title
    (below the plot, where it hides no point) names how many lie above and the slowest. Until a measured step
    exists, the axis autoranges over whatever there is. Called
    after every change (the panel calls it per flush), it touches the layout only when the range moves, so
    streaming points does not resend the layout.
    """
    measured = _visible_points(figure, "step")
    if not measured:
        return
    low, high = step_axis_range(measured)
    above = [ms for ms in _visible_points(figure, "warmup") if math.log10(ms) > high]
    note = (f" (▲ {len(above)} warm-up/compile step{'s' if len(above) > 1 else ''} above the plot, slowest "
            f"{_duration(max(above))})" if above else "")
    if figure.layout.yaxis2.range != (low, high):
        ticks = log_ticks(low, high)
        figure.update_yaxes(range=[low, high], autorange=False, tickvals=ticks, ticktext=[f"{v:g}" for v in ticks],
                            **_STEPS_AT)
    if figure.layout.xaxis2.title.text != STEP_AXIS + note:
        figure.update_xaxes(title_text=STEP_AXIS + note, **_STEPS_AT)


def _visible_points(figure: Figure, kind: str) -> list[float]:
    return [y for trace in figure.data if trace.meta and trace.meta.get("kind") == kind
            and trace.visible in (True, None) for y in (trace.y or ()) if y is not None and y > 0]


def _duration(ms: float) -> str:
    return f"{significant(ms / 1e3)} s" if ms >= 1e3 else f"{significant(ms)} ms"


def _scatter(**kwargs: Any) -> Any:
    import plotly.graph_objects as go

    return go.Scatter(**kwargs)
