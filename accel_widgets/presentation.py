"""How runs look wherever they are shown: the Jupyter panel, the HTML report and the terminal table.

Everything a person reads about a run is decided here once, so the faces cannot disagree:

- the comparison: each workload's baseline, every run's numbers against it, and the correctness guard's
  verdict against that same run, so a row's speed-up and its "changes training" always refer to one baseline;
- the text of every number (units, SI prefixes, significant digits), every label and run name;
- one colour per run, and the colours of statuses and findings;
- the timeline figure: device utilisation against time and step time against step (warm-up steps hollow,
  one trace per DDP rank, one line per GPU), built by the same functions for the panel's live
  ``FigureWidget`` and the report's static figure.

plotly is imported inside the functions that build figures, so importing this module (and the package)
stays cheap and works on a machine without it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .config import Config
from .guard import GuardVerdict, NoiseBand, check_training
from .results import BurstResult, StepRecord, TelemetrySample
from .stats import Summary
from .thresholds import THRESHOLDS

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

    from .diagnosis import Finding, Severity  # the diagnosis writes its numbers with si(): it imports this module

Row = dict[str, Any]
#: A table cell: the text shown and the text on hover ("" for none).
Cell = tuple[str, str]

MISSING = "–"
#: A finished run whose numbers cannot rank a knob (:attr:`~accel_widgets.results.BurstResult.reliability`): its
#: status and its speed-up carry this mark in every face.
UNRELIABLE = "⚠ unreliable"
UNRELIABLE_MARK = "⚠"
#: Title prefix of runs loaded from the run history rather than run in this session.
LOADED_MARK = "⟲ "
NAME_LIMIT = 40

#: plotly's default qualitative palette ("Plotly"), spelled out so a run's colour needs no plotly import.
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF",
           "#FECB52")
COLOURS = {"ok": "#2e7d32", "stopped": "#8a6d00", "warning": "#b35900", "error": "#c62828", "info": "#1565c0",
           "muted": "#777"}
FINDING_MARKS: dict[Severity, tuple[str, str]] = {
    "warn": ("⚠", COLOURS["warning"]), "info": ("ℹ", COLOURS["info"]), "good": ("✔", COLOURS["ok"]),
}


# -- names and colours -----------------------------------------------------------------------------
def run_colour(run: int) -> str:
    """The run's colour, the same in the panel's plots and table and in the report's figures."""
    return PALETTE[run % len(PALETTE)]


def run_name(run: int, label: str, workload: str | None = None) -> str:
    """Legend and axis name of a run: its index first (runs can share a label), then a shortened label,
    after the workload's name when one figure holds several workloads."""
    where = f"{workload}: " if workload else ""
    return f"#{run} {where}{shorten(label, NAME_LIMIT)}"


def row_title(row: Row) -> str:
    """A row's changes from the baseline, after its own label when that says more (a ladder rung)."""
    label, changes = str(row.get("label") or ""), str(row.get("changes") or "")
    if not label or label == changes:
        return changes
    return f"{label} (baseline)" if changes == "baseline" else f"{label}: {changes}"


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


# -- numbers ---------------------------------------------------------------------------------------
def number(value: float | None, spec: str, suffix: str = "") -> str:
    """``value`` in the format ``spec``; the missing mark where it is unknown."""
    return MISSING if value is None else f"{value:{spec}}{suffix}"


def decimals(value: float, digits: int = 3) -> int:
    """Decimals that show ``value`` with ``digits`` significant digits (none dropped before the point)."""
    if value == 0 or not math.isfinite(value):
        return digits - 1
    return max(0, digits - 1 - math.floor(math.log10(abs(value))))


def significant(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, thousands separated: 640, 64.0, 0.640, 12,345."""
    return f"{value:,.{decimals(value, digits)}f}"


_SI_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str) -> str:
    """``value`` with the SI prefix that leaves 1 to 999 before the point: 640 GFLOP/s, 156 TFLOP/s."""
    rounded = float(f"{value:.3g}")  # 999.7e9 is 1.00 T, not 1,000 G
    for scale, prefix in _SI_PREFIXES:
        if abs(rounded) >= scale:
            return f"{significant(rounded / scale)} {prefix}{unit}"
    return f"{significant(rounded)} {unit}"


def step_text(row: Row) -> str:
    """Median step time ± IQR in ms, both to the median's precision; `` ~`` marks a noisy measurement."""
    median = row.get("step_ms_median")
    if median is None:
        return MISSING
    places = decimals(median)
    noise = " ~" if row.get("noisy") else ""
    return f"{median:.{places}f} ± {row['step_ms_iqr']:.{places}f}{noise}"


def speedup_text(row: Row) -> str:
    """The speed-up; "p" when it is a paired re-measure's median, ⚠ when the run is unreliable."""
    if row["speedup"] is None:
        return MISSING
    paired = " p" if row.get("paired") else ""
    mark = f" {UNRELIABLE_MARK}" if row.get("unreliable") else ""
    return f"{row['speedup']:.2f}×{paired}{mark}"


def paired_note(row: Row) -> str:
    if not row.get("paired"):
        return ""
    q1, q3, pairs = row["paired"]
    return f"median of {pairs} interleaved pairs with the baseline, IQR {q1:.2f}×-{q3:.2f}×"


def flops_text(row: Row) -> str:
    """Model FLOP/s with the prefix its size needs, and the MFU in brackets where the GPU's peak is known."""
    tflops = row.get("tflops")
    if tflops is None:
        return MISSING
    mfu = f" ({row['mfu_pct']:.0f}%)" if row.get("mfu_pct") is not None else ""
    return si(tflops * 1e12, "FLOP/s") + mfu


# -- the comparison --------------------------------------------------------------------------------
def comparison_rows(results: Sequence[BurstResult], baseline: BurstResult | None = None) -> list[Row]:
    """One plain dict of numbers per run: what the terminal table, the CSV and every other face start from.

    Speed-ups are only meaningful within one workload, so each workload gets its own baseline: the
    first ok run whose config is ``Config()`` (the plain loop), else its first ok run. An explicit
    ``baseline`` replaces the default for its own workload only. ``baseline`` in a row is the index of
    the run its speed-up refers to (``None`` when there is none among ``results``). Unknown numbers are
    ``None``; ``noisy`` is always a bool (False when there are no measured steps to judge).
    """
    return _rows(results, _baselines(results, baseline))


def _rows(results: Sequence[BurstResult], baselines: Sequence[BurstResult | None]) -> list[Row]:
    index = {id(result): i for i, result in enumerate(results)}
    return [_row(i, result, chosen, index.get(id(chosen)))
            for i, (result, chosen) in enumerate(zip(results, baselines, strict=True))]


def _baselines(results: Sequence[BurstResult], baseline: BurstResult | None) -> list[BurstResult | None]:
    """Each run's baseline: per workload, the first ok plain-loop run, else the first ok run."""
    chosen: dict[str, BurstResult] = {}
    plain = Config()
    for result in results:
        if not result.ok:
            continue
        current = chosen.get(result.workload)
        if current is None or (result.config == plain and current.config != plain):
            chosen[result.workload] = result
    if baseline is not None:
        chosen[baseline.workload] = baseline
    return [chosen.get(result.workload) for result in results]


def _row(index: int, result: BurstResult, baseline: BurstResult | None, baseline_index: int | None) -> Row:
    step = result.step_time
    return {
        "run": index,
        "workload": result.workload,
        "label": result.label or result.config.label(),
        "changes": result.config.label(baseline.config if baseline is not None else None),
        "baseline": baseline_index,
        "status": result.status,
        "samples_per_s": result.samples_per_s,
        "tokens_per_s": result.tokens_per_s,
        "speedup": result.speedup_over(baseline) if baseline is not None else None,
        "step_ms_median": step.median * 1e3 if step is not None else None,
        "step_ms_iqr": step.iqr * 1e3 if step is not None else None,
        "noisy": bool(step is not None and step.noisy),
        # Measured on a shared or stalling machine: not ranked, not shown as a plain speed-up (thresholds.py).
        "unreliable": result.status == "ok" and not result.reliability.reliable,
        "unreliable_why": result.reliability.text(),
        "util_pct": result.mean_utilisation_pct,
        "util_note": result.utilisation_note,
        "data_wait_pct": result.data_wait_share * 100 if result.data_wait_share is not None else None,
        "peak_mem_mib": result.peak_memory_bytes / 2**20 if result.peak_memory_bytes is not None else None,
        "compile_s": result.compile_s,
        "tflops": result.achieved_flops_per_s / 1e12 if result.achieved_flops_per_s else None,
        "mfu_pct": result.mfu * 100 if result.mfu is not None else None,
        "mfu_basis": result.mfu_basis,
        "joules_per_sample": result.joules_per_sample,
        "samples_per_joule": result.samples_per_joule,
        "mean_power_w": result.mean_power_w,
        "energy_note": result.energy_note,
        "error": _first_line(result.error.message) if result.error is not None else "",
    }


def _first_line(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True)
class RunRow:
    """One run as the panel's and the report's tables show it.

    ``values`` are its :func:`comparison_rows` numbers, ``baseline`` the run they are measured against
    and ``verdict`` the correctness guard's reading against that same run (its reading is
    ``diagnose(result, baseline, verdict=verdict)``). ``loaded`` is the hover note of a run loaded from
    the run history.
    """

    result: BurstResult
    baseline: BurstResult | None
    values: Row
    verdict: GuardVerdict
    loaded: str | None = None

    @property
    def run(self) -> int:
        return int(self.values["run"])

    @property
    def changes_training(self) -> bool:
        return self.verdict.status == "changes_training"

    def title(self) -> Cell:
        title = row_title(self.values)
        if self.loaded is None:
            return title, title
        return LOADED_MARK + title, f"{LOADED_MARK}{title}\n{self.loaded}"

    def cells(self, columns: Iterable[str]) -> list[Cell]:
        """The title, the named :data:`COLUMNS` and the status, as (text, hover) pairs."""
        return [self.title(), *(COLUMNS[key].cell(self.values) for key in columns), self.status()]

    def status(self) -> Cell:
        """The outcome, and the guard's reasons on hover when the run changes training.

        A diverged run keeps its own status ("diverged: loss is NaN from step ...") because it says more
        than the guard's "changes training"; any other run the guard flags is marked, faster or not.
        """
        values = self.values
        if self.changes_training and values["status"] != "diverged":
            faster = values["speedup"] is not None and values["speedup"] > 1.0
            return "faster but changes training" if faster else "changes training", "\n".join(self.verdict.reasons)
        text = f"{values['status']}: {values['error']}" if values["error"] else str(values["status"])
        if values["unreliable"]:
            return UNRELIABLE, (f"finished, but unreliable: {values['unreliable_why']}.\nRe-measure it paired with "
                                "its baseline (Re-measure in the panel, aw.remeasure) before ranking it.")
        unchecked = values["status"] == "ok" and self.verdict.status in ("not_comparable", "no_baseline", "cannot_tell")
        return text, f"{text}\ntraining not checked: {self.verdict.reasons[-1]}" if unchecked else text

    def status_colour(self) -> str:
        """Green for ok, amber for stopped or unreliable, red for anything that did not train as it should."""
        status = str(self.values["status"])
        if self.changes_training or status not in ("ok", "stopped"):
            return COLOURS["error"]
        return COLOURS["warning"] if self.values["unreliable"] else COLOURS[status]


def run_rows(results: Sequence[BurstResult], *, loaded: Mapping[int, str] | None = None,
             judged: Sequence[RunRow] = (),
             noise_of: Callable[[BurstResult], NoiseBand | None] | None = None,
             paired: Mapping[int, Summary] | None = None) -> list[RunRow]:
    """Every run's table row, each judged by the guard against the baseline of its own speed-up.

    ``loaded`` maps the index of each run loaded from the run history to its hover note. ``judged`` are
    rows built before from the same runs (the panel's table before its latest run): a run whose baseline
    is still the same keeps its verdict, so the guard judges each run once, not once per table update.
    ``noise_of(baseline)`` gives the baseline's measured noise band when one is known (the guard then
    tolerates what reseeding the data moves the loss by, not only the precision's floor). ``paired`` maps a
    run re-measured against its baseline (:func:`~accel_widgets.remeasure.remeasure`) to its paired speed-ups:
    that number replaces the row's, and the row is reliable again when the pairs agree.
    """
    notes = loaded or {}
    baselines = _baselines(results, None)
    rows = [with_paired(values, (paired or {}).get(i)) for i, values in enumerate(_rows(results, baselines))]
    return [RunRow(result, chosen, values, _verdict(result, chosen, judged[i] if i < len(judged) else None,
                                                    noise_of),
                   notes.get(i))
            for i, (result, chosen, values) in enumerate(zip(results, baselines, rows, strict=True))]


def with_paired(values: Row, ratio: Summary | None) -> Row:
    """A row whose speed-up is its re-measure's paired median (with its quartiles): believed over the single
    burst's, and reliable when the pairs spread less than ``THRESHOLDS.paired_max_relative_iqr``."""
    if ratio is None:
        return values
    agree = ratio.relative_iqr < THRESHOLDS.paired_max_relative_iqr
    why = "" if agree else f"its {ratio.n} paired re-measures spread {ratio.relative_iqr:.0%} of their median"
    return {**values, "speedup": ratio.median, "paired": (ratio.q1, ratio.q3, ratio.n),
            "unreliable": not agree, "unreliable_why": why}


def _verdict(result: BurstResult, baseline: BurstResult | None, before: RunRow | None,
             noise_of: Callable[[BurstResult], NoiseBand | None] | None) -> GuardVerdict:
    if before is not None and before.result is result and before.baseline is baseline:
        return before.verdict
    noise = noise_of(baseline) if noise_of is not None and baseline is not None else None
    return check_training(result, baseline, noise)


# -- table columns ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One numeric column: its header, what it means (the header's hover) and how a row's cell reads."""

    header: str
    meaning: str
    text: Callable[[Row], str]
    hover: Callable[[Row], str] | None = None

    def cell(self, row: Row) -> Cell:
        return self.text(row), self.hover(row) if self.hover is not None else ""


def util_text(row: Row) -> str:
    """The mean utilisation, or "too short" where the window was shorter than NVML's readings can tell."""
    if row["util_pct"] is None and str(row.get("util_note") or "").startswith("too short"):
        return "too short"
    return number(row["util_pct"], ".0f")


def _noise_note(row: Row) -> str:
    return "noisy: IQR/median ≥ 10% or fewer than 4 steps" if row.get("noisy") else ""


def _energy_note(row: Row) -> str:
    """How the energy was read (or why it was not), then samples per joule and the mean power."""
    note = str(row.get("energy_note") or "")
    if row.get("joules_per_sample") is None:
        return note
    power = f", {significant(row['mean_power_w'])} W mean" if row.get("mean_power_w") is not None else ""
    return f"{note}\n{significant(row['samples_per_joule'])} samples/J{power}"


TITLE = ("changes from baseline", "what differs from the baseline run (a ladder rung's name first)")
STATUS = ("status", "ok, stopped, or failed with the error's first line; 'diverged' when a loss went NaN/inf (numbers "
                    "measured, but it did not train); 'changes training' when the losses leave the baseline run's; "
                    "'unreliable' when other load or a stalling machine spread the steps too much to rank it "
                    "(hover for why)")
COLUMNS: dict[str, Column] = {
    "samples": Column("samples/s", "steady-state throughput, summed over ranks",
                      lambda r: number(r["samples_per_s"], ",.1f")),
    "tokens": Column("tokens/s", "steady-state tokens per second, for workloads that count tokens",
                     lambda r: number(r["tokens_per_s"], ",.0f")),
    "speedup": Column("speedup", "throughput over the baseline run's; ⚠ marks an unreliable run (hover its status), "
                      "'p' one re-measured in pairs with its baseline (hover: the pairs' quartiles)",
                      lambda r: speedup_text(r), lambda r: paired_note(r)),
    "step": Column("step ms", "median step time ± IQR; ~ marks a noisy measurement (IQR/median ≥ 10%)", step_text,
                   _noise_note),
    "util": Column("util %", "mean device utilisation (GPU: NVML, from 1 s into the measured window: its readings "
                   "average the last second; CPU: the workers' share of the machine)", util_text,
                   lambda r: str(r.get("util_note") or "")),
    "data_wait": Column("data wait", "share of the step spent waiting for the data loader",
                        lambda r: number(r["data_wait_pct"], ".0f", "%")),
    "peak": Column("peak MiB", "peak memory (GPU allocator, or the workers' RSS on CPU)",
                   lambda r: number(r["peak_mem_mib"], ",.0f")),
    "compile": Column("compile s", "extra time of the first step over a steady one (compiled runs)",
                      lambda r: number(r["compile_s"], ".1f")),
    "flops": Column("FLOP/s (MFU)", "model math sustained (forward + backward), summed over ranks; MFU, the share "
                    "of the GPUs' dense peak, in brackets where the peak is known; each FLOP at the peak of the math "
                    "it ran in (hover)", flops_text, lambda r: str(r.get("mfu_basis") or "")),
    "energy": Column("J/sample", "energy per trained sample over the measured window: NVML on a GPU (summed over "
                     "the GPUs in use), RAPL on the CPU (the whole package, every process on it, not only the "
                     "burst); hover for how it was read or why it was not",
                     lambda r: MISSING if r["joules_per_sample"] is None else significant(r["joules_per_sample"]),
                     _energy_note),
}
#: The numeric columns each face shows, in order, between the title and the status.
PANEL_COLUMNS = ("samples", "speedup", "step", "util", "data_wait", "peak", "compile", "flops", "energy")
REPORT_COLUMNS = ("samples", "tokens", "speedup", "step", "util", "data_wait", "peak", "compile", "flops", "energy")
TEXT_COLUMNS = ("samples", "speedup", "step", "util", "data_wait", "peak", "compile")


# -- findings --------------------------------------------------------------------------------------
def findings_html(findings: Sequence[Finding]) -> str:
    """A run's findings as an HTML list: mark, title, the numbers read and the knob to try."""
    items = []
    for finding in findings:
        mark, colour = FINDING_MARKS[finding.severity]
        knob = f" → try <code>{html.escape(finding.knob)}</code>" if finding.knob else ""
        items.append(f'<li style="margin-bottom: 4px;"><span style="color: {colour};">{mark}</span> '
                     f"<b>{html.escape(finding.title)}</b>: {html.escape(finding.detail)}{knob}</li>")
    body = "".join(items) or "<li>Nothing stands out.</li>"
    return f'<ul style="padding-left: 18px; margin: 4px 0;">{body}</ul>'


# -- the timeline figure ---------------------------------------------------------------------------
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


def utilisation_title(sources: Collection[str]) -> str:
    """Say what the utilisation axis measures: a GPU's busy share and a CPU share are not comparable."""
    kinds = set(sources)
    if len(kinds) == 1:
        return _UTILISATION_TITLES.get(next(iter(kinds)), "utilisation %")
    return "utilisation % (GPU: NVML, CPU: workers' share of machine)" if kinds else "utilisation %"


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


def timeline(results: Sequence[BurstResult], names: Sequence[str]) -> Figure:
    """The timeline of finished runs, named ``names``: the figure the panel builds live, built at once."""
    figure = timeline_figure(utilisation_title({t.source for r in results for t in r.telemetry}))
    for run, (result, name) in enumerate(zip(results, names, strict=True)):
        add_run_legend(figure, run, name)
        for index, (device, samples) in enumerate(device_groups(result.telemetry).items()):
            add_utilisation_trace(figure, run, name, device=device, index=index, samples=samples)
        for (rank, warmup), steps in step_groups(result.steps).items():
            add_step_trace(figure, run, name, rank=rank, ranks=max(1, result.world_size), warmup=warmup,
                           steps=steps)
    fit_step_axis(figure)
    return figure


def step_times_only(figure: Figure) -> Figure:
    """``figure`` (a :func:`timeline`) without its utilisation half, the step times across the whole width: the
    report draws utilisation per run, one small panel each, rather than every run overlaid in one."""
    figure.data = tuple(trace for trace in figure.data if trace.meta.get("kind") != "util")
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
