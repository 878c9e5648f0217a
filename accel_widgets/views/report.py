"""Compare bursts: a terminal table, plotly figures, one offline HTML report, and CSV/JSON exports.

The numbers, their text, the run colours and names, the correctness guard's verdicts and the timeline
figure all come from :mod:`.presentation`, which the Jupyter panel reads too, so the terminal, the panel
and the report can never disagree. plotly and pandas are imported inside the functions that need them,
so importing this module (and the package) stays cheap and works on a machine that has neither.
"""

from __future__ import annotations

import csv
import html
import io
import json
import os
import pathlib
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..analysis.compare import Row, RunRow, best_run, run_rows
from ..analysis.compare import comparison_rows as comparison_rows  # re-exported: the rows the table functions take
from ..analysis.estimate import Estimate
from ..job.recipe import recipe_of
from ..results.burst import BurstResult
from ..results.comparison import Comparison
from ..results.headspace import Headspace
from .comparison import comparison_sentence
from .estimate import estimate_line
from .headspace import ceilings_html, headspace_lines
from .style import COLOURS, UNRELIABLE, run_colour, run_name, shorten
from .table import COLUMNS, REPORT_COLUMNS, STATUS, TEXT_COLUMNS, TITLE, row_cells, row_title, status_colour
from .text import findings_html, run_findings
from .timeline import step_times_only, timeline

if TYPE_CHECKING:
    import pandas
    from plotly.graph_objects import Figure

TABLE_WIDTH = 120
_WORKLOAD_WIDTH = 16


# -- text table ------------------------------------------------------------------------------------
def format_table(rows: list[Row]) -> str:
    """Fixed-width table of :func:`~accel_widgets.analysis.compare.comparison_rows` for a terminal, at most 120
    columns: "changes" absorbs the squeeze.

    The cells read as in the panel and the report. Under the table, one line per failed run gives its
    error, and one per unreliable run says why. A ``~`` after the step time marks a noisy measurement
    (IQR/median >= 10% or few steps); ``⚠`` after a speed-up, an unreliable one.
    """
    columns = [COLUMNS[key] for key in TEXT_COLUMNS]
    headers = [("", "#"), ("", "workload"), ("", "changes"), *(_two_lines(c.header) for c in columns),
               ("", "status")]
    cells = [
        [str(r["run"]), shorten(str(r["workload"]), _WORKLOAD_WIDTH), row_title(r),
         *(_text_cell(key, r) for key in TEXT_COLUMNS), UNRELIABLE if r.get("unreliable") else str(r["status"])]
        for r in rows
    ]
    widths = [max(len(top), len(bottom), *(len(c[i]) for c in cells)) for i, (top, bottom) in enumerate(headers)]
    room = TABLE_WIDTH - 2 * (len(headers) - 1) - sum(widths) + widths[2]
    widths[2] = max(len("changes"), min(widths[2], room))
    right = {0, *range(3, 3 + len(columns))}
    lines = [_line([h[0] for h in headers], widths, right), _line([h[1] for h in headers], widths, right),
             _line(["-" * w for w in widths], widths, right)]
    lines += [_line([c[0], c[1], shorten(c[2], widths[2]), *c[3:]], widths, right) for c in cells]
    lines += [shorten(f"#{r['run']} {r['status']}: {r['error']}", TABLE_WIDTH) for r in rows if r["error"]]
    lines += [shorten(f"#{r['run']} unreliable: {r['unreliable_why']}", TABLE_WIDTH)
              for r in rows if r.get("unreliable")]
    return "\n".join(line for line in lines if line)


def _two_lines(header: str) -> tuple[str, str]:
    """A header over the table's two header lines, broken at its last space: that keeps the numeric columns
    narrow, which is what lets "changes" keep a useful width."""
    top, _, bottom = header.rpartition(" ")
    return top, bottom


def _text_cell(key: str, row: Row) -> str:
    """A numeric cell; a step time without the noise mark keeps the mark's two characters, so right-aligned
    numbers stay aligned."""
    text = COLUMNS[key].text(row)
    return text + "  " if key == "step" and row["step_ms_median"] is not None and not row["noisy"] else text


def _line(cells: Sequence[str], widths: Sequence[int], right: set[int]) -> str:
    padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "  ".join(padded).rstrip()


# -- figures ---------------------------------------------------------------------------------------
def build_figures(results: Sequence[BurstResult],
                  compared: Mapping[int, Comparison] | None = None) -> dict[str, Figure]:
    """The report's figures, in the order it shows them: "speedup" (per workload, ± IQR, noisy runs hatched),
    "waterfall" (what each ladder rung added), "breakdown" (where the median step goes, 100% stacked),
    "timeline" (the step-time half of the panel's figure: a log axis zoomed to the measured steps) and
    "utilisation" (one small panel per run, rather than the panel's overlaid utilisation). "waterfall" is left
    out when no workload has a run besides its baseline, and "utilisation" when no run has telemetry: an empty
    chart is only noise. The figures themselves are :mod:`.figures`' and :mod:`.presentation`'s.

    Every trace carries ``meta={"kind": ..., "run": i}`` (or ``"runs": [...]`` for a trace of several runs) so
    a test (or a notebook) can find a run's traces without relying on names or order.
    """
    from .figures import comparison_figures

    figures_of_runs = comparison_figures(results, compared=compared)
    several_workloads = len({r.workload for r in results}) > 1
    names = [run_name(i, r.label or r.config.label(), r.workload if several_workloads else None)
             for i, r in enumerate(results)]
    order = ("speedup", "waterfall", "breakdown", "timeline", "utilisation")
    figures = {**figures_of_runs, "timeline": step_times_only(timeline(results, names))}
    return {key: figures[key] for key in order if key in figures}


# -- HTML report -----------------------------------------------------------------------------------
_STYLE = f"""
body {{ font-family: system-ui, sans-serif; margin: 2em; color: {COLOURS["text"]}; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid {COLOURS["rule"]}; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
table.runs tbody tr:not(.ok) td, table.runs tr.changes-training td {{ background: {COLOURS["failed row"]}; }}
.figure {{ margin: 1.5em 0; }}
pre {{ background: {COLOURS["code"]}; padding: 0.6em; overflow-x: auto; }}
"""


def write_report(results: Sequence[BurstResult], path: str | os.PathLike[str], *,
                 title: str = "accel_widgets report", notes: Sequence[str] = (),
                 compared: Mapping[int, Comparison] | None = None,
                 comparisons: Sequence[tuple[str, str, Comparison]] = (), headspaces: Sequence[Headspace] = (),
                 estimates: Sequence[Estimate] = ()) -> pathlib.Path:
    """Write one self-contained HTML file (plotly.js inlined once) that opens offline; return its path.

    The table and the diagnoses are the panel's: the same cells, colours and verdicts, each run judged
    once against the baseline its speed-up refers to. ``compared`` maps a run to its comparison with that
    baseline (its interval and verdict replace the lone ratio); ``comparisons`` are more to say in words
    (subject, reference, comparison: a ladder's rung against the one before). ``headspaces`` and ``estimates`` are
    what was asked before tuning: each config's ceilings (the bars the panel draws, and one line per ceiling) and
    whether it fits (one line each). The file is written to a temporary sibling and renamed, so a reader never sees
    half a report.
    """
    rows = run_rows(results, compared=compared)
    figures = build_figures(results, compared)
    figure_html = [
        fig.to_html(full_html=False, include_plotlyjs=n == 0, div_id=f"figure-{key}")
        for n, (key, fig) in enumerate(figures.items())
    ]
    body = [
        f"<h1>{html.escape(title)}</h1>",
        _environment_html(results),
        _before_tuning_html(headspaces, estimates),
        "<h2>Comparison</h2>",
        _table_html(rows),
        _comparisons_html(rows, comparisons),
        _diagnosis_html(rows),
        _recipe_html(rows),
        _warnings_html(rows),
        _errors_html(rows),
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


def _table_html(rows: Sequence[RunRow]) -> str:
    """The panel's runs table with the run number and workload in front; the run's colour edges its number."""
    headers = [("#", "run number, as in the figures"), ("workload", "what was trained"), TITLE,
               *((COLUMNS[key].header, COLUMNS[key].meaning) for key in REPORT_COLUMNS), STATUS]
    head = "".join(f'<th title="{html.escape(meaning)}">{html.escape(name)}</th>' for name, meaning in headers)
    body = "".join(_row_html(row) for row in rows)
    note = ("<p><small>A speed-up in brackets is its 95% anytime-valid interval from interleaved repeats of the run "
            "and its baseline (aw.compare); &#9650; faster, &#9660; slower, ? undecided, \"same &plusmn;4%\" no "
            "measurable effect; \"1 burst\" is one burst against one burst, with the drift between bursts in no "
            "number. ~ after a step time: noisy (IQR/median &ge; 10% or fewer than 4 steps). &#9888;: unreliable, "
            "the steps spread past half their median or other load took a quarter of the machine (hover its status; "
            "re-measure it against its baseline: aw.remeasure).</small></p>")
    return f"<table class=\"runs\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


def _row_html(row: RunRow) -> str:
    classes = str(row.values["status"]) + (" changes-training" if row.changes_training else "")
    first = (f'<td class="num" style="border-left: 4px solid {run_colour(row.run)};">{row.run}</td>'
             f"<td>{html.escape(str(row.values['workload']))}</td>")
    *cells, status = row_cells(row, REPORT_COLUMNS)
    texts = [_cell_html(text, hover, numeric=index > 0) for index, (text, hover) in enumerate(cells)]
    texts.append(_cell_html(*status, numeric=False, style=f"color: {status_colour(row)};"))
    return f'<tr class="{html.escape(classes)}">{first}{"".join(texts)}</tr>'


def _cell_html(text: str, hover: str, *, numeric: bool, style: str = "") -> str:
    attributes = ' class="num"' if numeric else ""
    if hover and hover != text:
        attributes += f' title="{html.escape(hover)}"'
    if style:
        attributes += f' style="{style}"'
    return f"<td{attributes}>{html.escape(text.strip())}</td>"


def _before_tuning_html(headspaces: Sequence[Headspace], estimates: Sequence[Estimate]) -> str:
    """What could be won and what fits, asked before tuning: each headspace's bars and lines, each estimate's line."""
    parts = []
    for found in headspaces:
        lines = "".join(f"<li>{html.escape(line)}</li>" for line in headspace_lines(found))
        parts.append(f"<h3>Ceilings of {html.escape(found.workload)} ({html.escape(found.config.label())})</h3>\n"
                     f"{ceilings_html(found)}\n<ul>{lines}</ul>")
    if estimates:
        lines = "".join(f"<li>{html.escape(estimate_line(found))}</li>" for found in estimates)
        parts.append(f"<h3>Will it fit (estimated on fake tensors)</h3>\n<ul>{lines}</ul>")
    return "<h2>Before tuning</h2>\n" + "\n".join(parts) if parts else ""


def _comparisons_html(rows: Sequence[RunRow], more: Sequence[tuple[str, str, Comparison]]) -> str:
    """Each comparison in one sentence: every compared run against its baseline, then the others given."""
    def name(run: int) -> str:
        return run_name(run, str(rows[run].values["label"]))

    sentences = [comparison_sentence(row.comparison, name(row.run), name(int(row.values["baseline"])))
                 for row in rows if row.comparison is not None and row.values["baseline"] is not None]
    sentences += [comparison_sentence(comparison, subject, reference) for subject, reference, comparison in more]
    if not sentences:
        return ""
    return "<h2>Comparisons</h2>\n<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in sentences) + "</ul>"


def _diagnosis_html(rows: Sequence[RunRow]) -> str:
    """Each run's reading against its baseline (guard, compile payback included); warnings come below."""
    sections = []
    for row in rows:
        findings = run_findings(row.result, row.baseline, row.verdict)
        if findings:
            sections.append(f"<h3>#{row.run} {html.escape(str(row.values['label']))}</h3>{findings_html(findings)}")
    return "<h2>Diagnosis</h2>\n" + "\n".join(sections) if sections else ""


def _recipe_html(rows: Sequence[RunRow]) -> str:
    """The best run's settings as plain PyTorch to paste: what to do with the report's answer."""
    best = best_run(rows)
    if best is None:
        return ""
    label = html.escape(str(best.values["label"]))
    return (f"<h2>Use in your code</h2>\n<p>#{best.run} {label}, the fastest run that trains as its baseline does, as "
            "plain PyTorch with no accel_widgets import (for Hugging Face, Lightning or Accelerate: "
            "<code>accel-widgets export --as hf|lightning|accelerate</code>, or <code>aw.recipe(config, workload, "
            f"style)</code>):</p>\n<pre>{html.escape(recipe_of(best.result).code)}</pre>")


def _warnings_html(rows: Sequence[RunRow]) -> str:
    items = [f"<li>#{row.run} {html.escape(str(row.values['label']))}: {html.escape(warning)}</li>"
             for row in rows for warning in row.result.warnings]
    return f"<h2>Warnings</h2>\n<ul>{''.join(items)}</ul>" if items else ""


def _errors_html(rows: Sequence[RunRow]) -> str:
    """Full message and the root-cause rank's traceback of each failed run, folded away."""
    items = []
    for row in rows:
        error = row.result.error
        if error is None:
            continue
        where = f" (rank {error.rank})" if error.rank is not None else ""
        summary = html.escape(f"#{row.run} {row.values['label']}: {error.kind}{where}")
        detail = html.escape("\n\n".join(p for p in (error.message, error.traceback) if p))
        items.append(f"<details><summary>{summary}</summary><pre>{detail}</pre></details>")
    return "<h2>Errors</h2>\n" + "\n".join(items) if items else ""


def _notes_html(notes: Sequence[str]) -> str:
    return "<h2>Notes</h2>\n" + "\n".join(f"<p>{html.escape(n)}</p>" for n in notes) if notes else ""


# -- data exports ----------------------------------------------------------------------------------
def rows_to_dataframe(rows: Sequence[Row]) -> pandas.DataFrame:
    """The rows as a pandas DataFrame, for notebooks (pandas is imported here, not with the package)."""
    import pandas

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
