"""Compare bursts: plain comparison rows, a terminal table, plotly figures and one offline HTML report.

``comparison_rows`` is the single source of the numbers: the CLI table, the notebook panel, the HTML
report and the CSV all format the same plain dicts, so they can never disagree. plotly and pandas are
imported inside the functions that need them, so importing this module (and the package) stays cheap
and works on a machine that has neither.
"""

from __future__ import annotations

import csv
import html
import io
import json
import os
import pathlib
import statistics
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .config import Config
from .results import BurstResult, StepRecord, TelemetrySample

if TYPE_CHECKING:
    import pandas
    from plotly.graph_objects import Figure

Row = dict[str, Any]

TABLE_WIDTH = 120
_MISSING = "-"
_WORKLOAD_WIDTH = 16
_RANK_DASHES = ("solid", "dot", "dash", "dashdot", "longdash", "longdashdot")


# -- rows ------------------------------------------------------------------------------------------
def comparison_rows(results: Sequence[BurstResult], baseline: BurstResult | None = None) -> list[Row]:
    """One plain dict per run: what the CLI, the panel and the report all show.

    Speed-ups are only meaningful within one workload, so each workload gets its own baseline: the
    first ok run whose config is ``Config()`` (the plain loop), else its first ok run. An explicit
    ``baseline`` replaces the default for its own workload only. Unknown numbers are ``None``;
    ``noisy`` is always a bool (False when there are no measured steps to judge).
    """
    baselines = _default_baselines(results)
    if baseline is not None:
        baselines[baseline.workload] = baseline
    return [_row(i, result, baselines.get(result.workload)) for i, result in enumerate(results)]


def _default_baselines(results: Sequence[BurstResult]) -> dict[str, BurstResult]:
    """Per workload: the first ok plain-loop run, falling back to the first ok run."""
    chosen: dict[str, BurstResult] = {}
    plain = Config()
    for result in results:
        if not result.ok:
            continue
        current = chosen.get(result.workload)
        if current is None or (result.config == plain and current.config != plain):
            chosen[result.workload] = result
    return chosen


def _row(index: int, result: BurstResult, baseline: BurstResult | None) -> Row:
    step = result.step_time
    return {
        "run": index,
        "workload": result.workload,
        "label": result.label or result.config.label(),
        "changes": result.config.label(baseline.config if baseline is not None else None),
        "status": result.status,
        "samples_per_s": result.samples_per_s,
        "tokens_per_s": result.tokens_per_s,
        "speedup": result.speedup_over(baseline) if baseline is not None else None,
        "step_ms_median": step.median * 1e3 if step is not None else None,
        "step_ms_iqr": step.iqr * 1e3 if step is not None else None,
        "noisy": bool(step is not None and step.noisy),
        "util_pct": result.mean_utilisation_pct,
        "data_wait_pct": _pct(result.data_wait_share),
        "peak_mem_mib": result.peak_memory_bytes / 2**20 if result.peak_memory_bytes is not None else None,
        "compile_s": result.compile_s,
        "tflops": result.achieved_flops_per_s / 1e12 if result.achieved_flops_per_s else None,
        "mfu_pct": result.mfu * 100 if result.mfu is not None else None,
        "error": _first_line(result.error.message) if result.error is not None else "",
    }


def _first_line(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[0] if lines else ""


def _pct(share: float | None) -> float | None:
    return share * 100 if share is not None else None


# -- text table ------------------------------------------------------------------------------------
def _number(key: str, spec: str, suffix: str = "") -> Callable[[Row], str]:
    """Formatter for one numeric cell; ``-`` where the number is unknown."""

    def cell(row: Row) -> str:
        value = row.get(key)
        return _MISSING if value is None else f"{value:{spec}}{suffix}"

    return cell


def _step_cell(row: Row) -> str:
    """Median ± IQR, with ``~`` after it when the spread is too large to trust the median.

    Every cell reserves the mark's two characters so right-aligned numbers stay aligned.
    """
    if row.get("step_ms_median") is None:
        return _MISSING
    mark = " ~" if row.get("noisy") else "  "
    return f"{row['step_ms_median']:.2f} ± {row['step_ms_iqr']:.2f}{mark}"


def _run_text(row: Row) -> str:
    """The changes, prefixed by the run's own label when that says something the changes do not."""
    label, changes = row.get("label") or "", row.get("changes") or ""
    return changes if not label or label == changes else f"{label} ({changes})"


# (header, cell) of the right-aligned columns between "changes" and "status"; a header's "\n" splits
# it over the text table's two header lines, which is what lets "changes" keep a useful width.
_NUMERIC_COLUMNS: tuple[tuple[str, Callable[[Row], str]], ...] = (
    ("samples/s", _number("samples_per_s", ",.1f")),
    ("speedup\n×", _number("speedup", ".2f", "×")),
    ("step ms", _step_cell),
    ("util\n%", _number("util_pct", ".1f")),
    ("data\nwait %", _number("data_wait_pct", ".1f")),
    ("peak\nMiB", _number("peak_mem_mib", ",.0f")),
    ("compile\ns", _number("compile_s", ".1f")),
)


def format_table(rows: list[Row]) -> str:
    """Fixed-width table for a terminal, at most 120 columns: "changes" absorbs the squeeze.

    Under the table, one line per failed run gives its error, since the table only has room for the
    status. A ``~`` after the step time marks a noisy measurement (IQR/median >= 10% or few steps).
    """
    headers = [("", h) if "\n" not in h else tuple(h.split("\n"))
               for h in ("#", "workload", "changes", *(h for h, _ in _NUMERIC_COLUMNS), "status")]
    cells = [
        [str(r["run"]), _truncate(str(r["workload"]), _WORKLOAD_WIDTH), _run_text(r),
         *(fmt(r) for _, fmt in _NUMERIC_COLUMNS), str(r["status"])]
        for r in rows
    ]
    widths = [max(len(top), len(bottom), *(len(c[i]) for c in cells)) for i, (top, bottom) in enumerate(headers)]
    room = TABLE_WIDTH - 2 * (len(headers) - 1) - sum(widths) + widths[2]
    widths[2] = max(len("changes"), min(widths[2], room))
    right = {0, *range(3, 3 + len(_NUMERIC_COLUMNS))}
    lines = [_line([h[0] for h in headers], widths, right), _line([h[1] for h in headers], widths, right),
             _line(["-" * w for w in widths], widths, right)]
    lines += [_line([c[0], c[1], _truncate(c[2], widths[2]), *c[3:]], widths, right) for c in cells]
    lines += [_truncate(f"#{r['run']} {r['status']}: {r['error']}", TABLE_WIDTH) for r in rows if r["error"]]
    return "\n".join(line for line in lines if line)


def _line(cells: Sequence[str], widths: Sequence[int], right: set[int]) -> str:
    padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "  ".join(padded).rstrip()


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


# -- figures ---------------------------------------------------------------------------------------
def build_figures(results: Sequence[BurstResult]) -> dict[str, Figure]:
    """The report's three figures: "timeline", "throughput" and "breakdown".

    Every trace carries ``meta={"run": i, "kind": ...}`` so a test (or a panel) can find a run's traces
    without relying on names or order.
    """
    rows = comparison_rows(results)
    names = [_run_name(row, results) for row in rows]
    return {
        "timeline": _timeline(results, names),
        "throughput": _throughput(rows, names),
        "breakdown": _breakdown(results, names),
    }


def _run_name(row: Row, results: Sequence[BurstResult]) -> str:
    """Legend/axis name: index first, so two runs with the same label stay distinct categories."""
    several_workloads = len({r.workload for r in results}) > 1
    prefix = f"#{row['run']} {row['workload']}: " if several_workloads else f"#{row['run']} "
    return prefix + _truncate(str(row["label"]), 48)


def _colour(index: int) -> str:
    from plotly.colors import qualitative

    palette = qualitative.Plotly
    return palette[index % len(palette)]


def _utilisation_title(results: Sequence[BurstResult]) -> str:
    """Say what the utilisation axis measures: a GPU busy share and a CPU share are not comparable."""
    sources = {t.source for r in results for t in r.telemetry}
    if sources == {"nvml"}:
        return "GPU utilisation (NVML) %"
    if sources == {"psutil"}:
        return "worker CPU utilisation (% of machine)"
    return "utilisation % (GPU: NVML, CPU: worker share of machine)" if sources else "utilisation %"


def _timeline(results: Sequence[BurstResult], names: Sequence[str]) -> Figure:
    """Utilisation over time (left) and step time per step (right); one legend entry per run."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Device utilisation", "Step time"))
    for index, (result, name) in enumerate(zip(results, names, strict=True)):
        traces = _utilisation_traces(index, result, name) + _step_traces(index, result, name)
        for position, (trace, column) in enumerate(traces):
            trace.update(legendgroup=f"run{index}", showlegend=position == 0)
            fig.add_trace(trace, row=1, col=column)
    fig.update_xaxes(title_text="time (s)", row=1, col=1)
    fig.update_yaxes(title_text=_utilisation_title(results), row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)
    fig.update_yaxes(title_text="step time (ms)", row=1, col=2)
    fig.update_layout(height=460, legend_title_text="run (click to toggle)", hovermode="closest")
    return fig


def _utilisation_traces(index: int, result: BurstResult, name: str) -> list[tuple[Any, int]]:
    """One line per device (several when a run samples several GPUs)."""
    import plotly.graph_objects as go

    devices: dict[str, list[TelemetrySample]] = {}
    for sample in result.telemetry:
        devices.setdefault(sample.device, []).append(sample)
    several = len(devices) > 1
    return [
        (go.Scatter(
            x=[s.t for s in samples], y=[s.util_pct for s in samples], mode="lines",
            name=f"{name} {device}" if several else name,
            line={"color": _colour(index), "dash": _RANK_DASHES[n % len(_RANK_DASHES)]},
            meta={"run": index, "kind": "util", "device": device},
        ), 1)
        for n, (device, samples) in enumerate(devices.items())
    ]


def _step_traces(index: int, result: BurstResult, name: str) -> list[tuple[Any, int]]:
    """Measured steps as lines per rank; warm-up steps as hollow markers that stay out of the line."""
    ranks = sorted({s.rank for s in result.steps})
    several = len(ranks) > 1
    traces = []
    for rank in ranks:
        rank_name = f"{name} rank {rank}" if several else name
        dash = _RANK_DASHES[rank % len(_RANK_DASHES)]
        for warmup in (True, False):
            steps = [s for s in result.steps if s.rank == rank and s.warmup == warmup]
            if steps:
                traces.append((_step_scatter(steps, index, rank, warmup, rank_name, dash), 2))
    return traces


def _step_scatter(steps: list[StepRecord], index: int, rank: int, warmup: bool, name: str, dash: str) -> Any:
    """Warm-up markers keep the run's colour (so they read as that run's) but are hollow and faded."""
    import plotly.graph_objects as go

    colour = _colour(index)
    common = {"x": [s.step for s in steps], "y": [s.total_s * 1e3 for s in steps],
              "meta": {"run": index, "kind": "warmup" if warmup else "step", "rank": rank}}
    if warmup:
        marker = {"symbol": "circle-open", "color": colour, "size": 8, "line": {"width": 1.5}}
        return go.Scatter(mode="markers", name=f"{name} (warm-up)", marker=marker, opacity=0.6, **common)
    return go.Scatter(mode="lines+markers", name=name, line={"color": colour, "dash": dash},
                      marker={"color": colour, "size": 4}, **common)


def _throughput(rows: Sequence[Row], names: Sequence[str]) -> Figure:
    """Samples/s per run with the speed-up over its workload's baseline written on the bar."""
    import plotly.graph_objects as go

    shown = [(row, name) for row, name in zip(rows, names, strict=True) if row["samples_per_s"] is not None]
    fig = go.Figure(go.Bar(
        x=[row["samples_per_s"] for row, _ in shown], y=[name for _, name in shown], orientation="h",
        text=[f"{row['speedup']:.2f}×" if row["speedup"] is not None else "" for row, _ in shown],
        textposition="auto", marker_color=[_colour(row["run"]) for row, _ in shown],
        meta={"kind": "throughput", "runs": [row["run"] for row, _ in shown]},
    ))
    fig.update_layout(title="Throughput (speed-up over the workload's baseline)", xaxis_title="samples/s",
                      height=160 + 36 * max(len(shown), 1), yaxis={"autorange": "reversed"})
    return fig


def _breakdown(results: Sequence[BurstResult], names: Sequence[str]) -> Figure:
    """Median data wait / host-to-device copy / compute per step: where a steady step's time goes."""
    import plotly.graph_objects as go

    shown = [(i, name, steps) for i, (r, name) in enumerate(zip(results, names, strict=True))
             if (steps := r.measured_steps())]
    fig = go.Figure()
    for attribute, label in (("data_s", "data wait"), ("h2d_s", "h2d copy"), ("compute_s", "compute")):
        fig.add_trace(go.Bar(
            x=[name for _, name, _ in shown], name=label,
            y=[statistics.median(getattr(s, attribute) for s in steps) * 1e3 for _, _, steps in shown],
            meta={"kind": attribute, "runs": [i for i, _, _ in shown]},
        ))
    fig.update_layout(barmode="stack", title="Median step breakdown", yaxis_title="ms per step", height=440)
    return fig


# -- HTML report -----------------------------------------------------------------------------------
# (header, cell) of the HTML comparison table: the text table's columns plus what a page has room for.
_HTML_COLUMNS: tuple[tuple[str, Callable[[Row], str]], ...] = (
    ("#", lambda r: str(r["run"])),
    ("workload", lambda r: str(r["workload"])),
    ("label", lambda r: str(r["label"])),
    ("changes", lambda r: str(r["changes"])),
    *_NUMERIC_COLUMNS[:1],
    ("tokens/s", _number("tokens_per_s", ",.0f")),
    *_NUMERIC_COLUMNS[1:],
    ("TFLOP/s", _number("tflops", ".3f")),
    ("MFU %", _number("mfu_pct", ".1f")),
    ("status", lambda r: str(r["status"])),
    ("error", lambda r: str(r["error"])),
)

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:not(.ok) td { background: #fdecea; }
.figure { margin: 1.5em 0; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
"""


def write_report(results: Sequence[BurstResult], path: str | os.PathLike[str], *,
                 title: str = "accel_widgets report", notes: Sequence[str] = ()) -> pathlib.Path:
    """Write one self-contained HTML file (plotly.js inlined once) that opens offline; return its path.

    The file is written to a temporary sibling and renamed, so a reader never sees half a report.
    """
    rows = comparison_rows(results)
    figures = build_figures(results)
    figure_html = [
        fig.to_html(full_html=False, include_plotlyjs=n == 0, div_id=f"figure-{key}")
        for n, (key, fig) in enumerate(figures.items())
    ]
    body = [
        f"<h1>{html.escape(title)}</h1>",
        _environment_html(results),
        "<h2>Comparison</h2>",
        _table_html(rows),
        _diagnosis_html(results, rows),
        _warnings_html(results, rows),
        _errors_html(results, rows),
        "<h2>Figures</h2>",
        *(f'<div class="figure">{fragment}</div>' for fragment in figure_html),
        _notes_html(notes),
    ]
    page = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(part for part in body if part) + "\n</body>\n</html>\n")
    return _write_atomic(path, page)


def _environment_html(results: Sequence[BurstResult]) -> str:
    """The first run's environment: the report is only comparable on the machine it describes."""
    environment = results[0].environment if results else {}
    if not environment:
        return ""
    items = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                    for k, v in environment.items())
    return f"<h2>Environment</h2>\n<table>{items}</table>"


def _table_html(rows: Sequence[Row]) -> str:
    numeric = {h for h, _ in _NUMERIC_COLUMNS} | {"tokens/s", "#", "TFLOP/s", "MFU %"}
    head = "".join(f"<th>{html.escape(h.replace(chr(10), ' '))}</th>" for h, _ in _HTML_COLUMNS)
    body = "".join(
        f'<tr class="{html.escape(str(row["status"]))}">'
        + "".join(_cell_html(fmt(row), h in numeric) for h, fmt in _HTML_COLUMNS)
        + "</tr>"
        for row in rows
    )
    note = "<p><small>~ after a step time: noisy (IQR/median &ge; 10% or fewer than 4 steps).</small></p>"
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


def _cell_html(text: str, numeric: bool) -> str:
    attribute = ' class="num"' if numeric else ""
    return f"<td{attribute}>{html.escape(text.strip())}</td>"


_SEVERITY_MARK = {"warn": "&#9888;", "info": "&#8505;", "good": "&#10003;"}


def _diagnosis_html(results: Sequence[BurstResult], rows: Sequence[Row]) -> str:
    """Each run's reading against its fp32 baseline (guard, compile payback included); warnings come below."""
    from .diagnosis import diagnose
    from .guard import find_baseline

    sections = []
    for result, row in zip(results, rows, strict=True):
        findings = [f for f in diagnose(result, find_baseline(result, results)) if f.title != "Engine warning"]
        if not findings:
            continue
        items = "".join(
            f"<li>{_SEVERITY_MARK[f.severity]} <b>{html.escape(f.title)}</b>: {html.escape(f.detail)}"
            + (f" &rarr; try <code>{html.escape(f.knob)}</code>" if f.knob else "") + "</li>"
            for f in findings)
        sections.append(f"<h3>#{row['run']} {html.escape(str(row['label']))}</h3><ul>{items}</ul>")
    return "<h2>Diagnosis</h2>\n" + "\n".join(sections) if sections else ""


def _warnings_html(results: Sequence[BurstResult], rows: Sequence[Row]) -> str:
    items = [f"<li>#{row['run']} {html.escape(str(row['label']))}: {html.escape(warning)}</li>"
             for result, row in zip(results, rows, strict=True) for warning in result.warnings]
    return f"<h2>Warnings</h2>\n<ul>{''.join(items)}</ul>" if items else ""


def _errors_html(results: Sequence[BurstResult], rows: Sequence[Row]) -> str:
    """Full message and the root-cause rank's traceback of each failed run, folded away."""
    items = []
    for result, row in zip(results, rows, strict=True):
        if result.error is None:
            continue
        where = f" (rank {result.error.rank})" if result.error.rank is not None else ""
        summary = html.escape(f"#{row['run']} {row['label']}: {result.error.kind}{where}")
        detail = html.escape("\n\n".join(p for p in (result.error.message, result.error.traceback) if p))
        items.append(f"<details><summary>{summary}</summary><pre>{detail}</pre></details>")
    return "<h2>Errors</h2>\n" + "\n".join(items) if items else ""


def _notes_html(notes: Sequence[str]) -> str:
    return "<h2>Notes</h2>\n" + "\n".join(f"<p>{html.escape(n)}</p>" for n in notes) if notes else ""


# -- data exports ----------------------------------------------------------------------------------
def rows_to_dataframe(rows: Sequence[Row]) -> pandas.DataFrame:
    """The rows as a pandas DataFrame, for notebooks; pandas is optional, so it is imported here."""
    try:
        import pandas
    except ImportError as err:
        raise ImportError("rows_to_dataframe needs pandas, which is not installed: pip install pandas") from err
    return pandas.DataFrame(list(rows))


def write_csv(rows: Sequence[Row], path: str | os.PathLike[str]) -> pathlib.Path:
    """The comparison rows as CSV (unknown numbers as empty cells), written atomically."""
    fields = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    return _write_atomic(path, buffer.getvalue())


def write_json(results: Sequence[BurstResult], path: str | os.PathLike[str]) -> pathlib.Path:
    """The full raw results (``BurstResult.to_dict`` each), so every number can be recomputed later."""
    return _write_atomic(path, json.dumps([r.to_dict() for r in results], indent=1) + "\n")


def _write_atomic(path: str | os.PathLike[str], text: str) -> pathlib.Path:
    """Write to a temporary file next to ``path`` and rename it over: readers see old or new, never half.

    The temporary name is made unique by hand (not ``mkstemp``) so the file gets the umask's normal mode.
    """
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
