"""Tests of accel_widgets.views.report on hand-built results: no engine, no GPU, a few seconds."""

from __future__ import annotations

import csv
import dataclasses
import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from accel_widgets.analysis.compare import run_rows
from accel_widgets.knobs.config import Config
from accel_widgets.results.burst import BurstResult, ErrorInfo, RankSummary, StepRecord, TelemetrySample
from accel_widgets.views.report import (
    build_figures,
    comparison_rows,
    format_table,
    rows_to_dataframe,
    write_csv,
    write_json,
    write_report,
)
from accel_widgets.views.style import run_colour
from accel_widgets.views.table import PANEL_COLUMNS, REPORT_COLUMNS, row_cells
from accel_widgets.views.timeline import TIMELINE_TITLES, timeline
from tests.measured import as_measured
from tests.views.comparisons import comparison_of

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

MIB = 2**20


def make_result(workload: str = "mlp", config: Config | None = None, *, step_ms: float | list[float] = 10.0,
                data_ms: float = 2.0, h2d_ms: float = 1.0, samples_per_s: float = 100.0, ranks: int = 1,
                util: tuple[float, ...] = (50.0, 70.0), source: str = "psutil", label: str = "",
                warmup: int = 2, first_step_s: float = 0.5) -> BurstResult:
    """An ok result whose every number is known: ``ranks`` ranks, each at ``samples_per_s / ranks``."""
    config = config or Config()
    times = step_ms if isinstance(step_ms, list) else [step_ms] * 8
    steps = []
    for rank in range(ranks):
        steps += [StepRecord(rank, i, 0.1 * (i + 1), 0.0, 0.0, 0.1, 0.1, 64, warmup=True) for i in range(warmup)]
        steps += [StepRecord(rank, warmup + i, 1.0 + i * ms / 1e3, data_ms / 1e3, h2d_ms / 1e3,
                             (ms - data_ms - h2d_ms) / 1e3, ms / 1e3, 64, loss=1.0 / (i + 1))
                  for i, ms in enumerate(times)]
    telemetry = [TelemetrySample(t=1.0 + 0.01 * i, source=source, util_pct=u, mem_used_bytes=MIB, device="cpu" if
                                 source == "psutil" else "cuda:0") for i, u in enumerate(util)]
    summaries = [RankSummary(rank, int(samples_per_s / ranks * 8), 8.0, (100 + rank) * MIB, "rss", 0.1,
                             first_step_s, "cpu") for rank in range(ranks)]
    return as_measured(BurstResult(workload=workload, config=config, status="ok", world_size=ranks, warmup_steps=warmup,
                       steps=steps, telemetry=telemetry, ranks=summaries, tokens_per_sample=16,
                       environment={"torch": "2.13.0", "device": "cpu", "cpu_count": 16}, label=label))


def make_failed(workload: str = "mlp") -> BurstResult:
    error = ErrorInfo(kind="oom", message="CUDA out of memory. Tried to allocate 2 GiB\nsecond line", rank=0,
                      traceback="Traceback (most recent call last): ...")
    return BurstResult(workload=workload, config=Config(batch_size=4096), status="failed", error=error)


@pytest.fixture()
def runs() -> list[BurstResult]:
    """A faster run listed before the plain baseline, a noisy one, a DDP one and a failure."""
    fast = make_result(config=Config(num_workers=2), step_ms=5.0, data_ms=0.5, samples_per_s=200.0,
                       util=(80.0, 90.0))
    base = make_result()
    noisy = make_result(config=Config(precision="bf16"), step_ms=[6, 9, 6, 9, 6, 9, 6, 9], samples_per_s=150.0,
                        label="bf16 <try>")  # IQR 40% of the median: noisy, not yet unreliable
    ddp = make_result(config=Config(parallel="ddp", world_size=2), samples_per_s=180.0, ranks=2)
    base.warnings.append("only 8 measured steps")
    return [fast, base, noisy, ddp, make_failed()]


# -- rows --------------------------------------------------------------------------------------------
def test_rows_numbers_against_plain_baseline(runs: list[BurstResult]) -> None:
    rows = comparison_rows(runs)
    fast, base, noisy, ddp, _ = rows
    assert [r["run"] for r in rows] == [0, 1, 2, 3, 4]
    assert base["changes"] == "baseline" and base["speedup"] == pytest.approx(1.0)
    assert fast["changes"] == "num_workers=2" and fast["speedup"] == pytest.approx(2.0)
    assert ddp["speedup"] == pytest.approx(1.8)
    assert fast["samples_per_s"] == pytest.approx(200.0) and fast["tokens_per_s"] == pytest.approx(3200.0)
    assert base["step_ms_median"] == pytest.approx(10.0) and base["step_ms_iqr"] == pytest.approx(0.0)
    assert base["data_wait_pct"] == pytest.approx(20.0) and fast["data_wait_pct"] == pytest.approx(10.0)
    assert base["util_pct"] == pytest.approx(60.0)
    assert base["peak_mem_mib"] == pytest.approx(100.0) and ddp["peak_mem_mib"] == pytest.approx(101.0)
    assert base["compile_s"] is None  # compile_mode="off": nothing to attribute to compiling
    assert base["noisy"] is False and noisy["noisy"] is True
    assert noisy["label"] == "bf16 <try>" and base["label"] == "baseline"
    assert base["error"] == ""


def test_failed_row_keeps_error_first_line_and_unknowns(runs: list[BurstResult]) -> None:
    failed = comparison_rows(runs)[-1]
    assert failed["status"] == "failed"
    assert failed["error"] == "CUDA out of memory. Tried to allocate 2 GiB"
    assert failed["changes"] == "batch_size=4096"
    for key in ("samples_per_s", "speedup", "step_ms_median", "util_pct", "data_wait_pct", "peak_mem_mib"):
        assert failed[key] is None


def test_speedup_is_per_workload_and_falls_back_to_first_ok_run() -> None:
    cnn_first = make_result("cnn", Config(precision="bf16"), samples_per_s=50.0)
    cnn_second = make_result("cnn", Config(precision="bf16", num_workers=4), samples_per_s=75.0)
    rows = comparison_rows([make_failed("cnn"), make_result(samples_per_s=1000.0), cnn_first, cnn_second])
    assert rows[1]["speedup"] == pytest.approx(1.0)
    assert rows[2]["speedup"] == pytest.approx(1.0) and rows[2]["changes"] == "baseline"
    assert rows[3]["speedup"] == pytest.approx(1.5) and rows[3]["changes"] == "num_workers=4"
    assert rows[0]["speedup"] is None
    assert rows[0]["changes"] == "batch_size=4096, precision=fp32"  # vs the cnn baseline's config


def test_explicit_baseline(runs: list[BurstResult]) -> None:
    rows = comparison_rows(runs, baseline=runs[0])
    assert rows[0]["changes"] == "baseline" and rows[0]["speedup"] == pytest.approx(1.0)
    assert rows[1]["changes"] == "num_workers=0" and rows[1]["speedup"] == pytest.approx(0.5)


def test_rows_take_each_runs_comparison_in_place_of_its_lone_ratio(runs: list[BurstResult]) -> None:
    """The rows every face prints from (the demo's, the notebooks') carry the comparison handed in: its blocks' ratio,
    interval and verdict, never the first bursts' lone ratio."""
    fast = runs[0]
    compared = {0: comparison_of(runs[1].config, fast.config, 1.4)}
    rows = comparison_rows(runs, compared=compared)
    assert rows[0]["speedup"] == pytest.approx(compared[0].ratio) and rows[0]["speedup"] != pytest.approx(2.0)
    assert rows[0]["verdict"] == "faster" and rows[0]["blocks"] == 6
    low, high = rows[0]["speedup_interval"]
    assert low < 1.4 < high
    assert "▲" in format_table(rows) and "▲" not in format_table(comparison_rows(runs))
    assert rows[2] == comparison_rows(runs)[2]  # a run not compared keeps its row


# -- text table ----------------------------------------------------------------------------------------
def test_format_table_values_and_width(runs: list[BurstResult]) -> None:
    long = make_result(config=Config(num_workers=4, pin_memory=True, non_blocking=True, precision="bf16",
                                     tf32=True, compile_mode="max-autotune", optimizer_impl="fused"))
    table = format_table(comparison_rows([*runs, long]))
    lines = table.splitlines()
    assert all(len(line) <= 120 for line in lines), max(lines, key=len)
    for text in ("num_workers=2", "baseline", "bf16 <try>: precision=bf16", "2.00×", "200.0", "10.0 ± 0.0",
                 "20%", " 60 ", "failed", "#4 failed: CUDA out of memory"):
        assert text in table
    assert "…" in table  # the long changes were truncated
    noisy_line = next(line for line in lines if "bf16 <try>" in line)
    assert "7.50 ± 3.00 ~" in noisy_line
    base_line = next(line for line in lines if line.startswith("1 "))
    assert base_line.index("10.0 ± 0.0") + len("10.0 ± 0.0  ") == noisy_line.index("7.50 ± 3.00 ~") + len(
        "7.50 ± 3.00 ~")  # the noise mark's room is kept, so the numbers stay right-aligned
    assert lines[0].split() == ["step", "util", "data", "peak", "compile"]
    assert lines[1].split()[:3] == ["#", "workload", "changes"]
    assert lines[1].split()[3:] == ["samples/s", "speedup", "ms", "%", "wait", "MiB", "s", "status"]


def test_format_table_empty() -> None:
    assert format_table([]).splitlines()[1].startswith("#  workload  changes")


# -- figures -------------------------------------------------------------------------------------------
def _traces(fig: Figure, kind: str) -> list[Any]:
    return [t for t in fig.data if isinstance(t.meta, dict) and t.meta.get("kind") == kind]


def test_timeline_one_trace_per_run_per_subplot(runs: list[BurstResult]) -> None:
    fig = timeline(runs[:3], [f"#{i}" for i in range(3)])  # the panel's figure
    util, steps, warmups = _traces(fig, "util"), _traces(fig, "step"), _traces(fig, "warmup")
    assert [t.meta["run"] for t in util] == [0, 1, 2] and all(t.xaxis == "x" for t in util)
    assert [t.meta["run"] for t in steps] == [0, 1, 2] and all(t.xaxis == "x2" for t in steps)
    assert list(util[1].x) == [1.0, 1.01] and list(util[1].y) == [50.0, 70.0]
    assert list(steps[0].x) == list(range(2, 10)) and list(steps[0].y) == pytest.approx([5.0] * 8)
    assert steps[0].mode == "lines+markers"
    # warm-up steps: their own hollow-marker trace, not part of the measured line
    assert [t.meta["run"] for t in warmups] == [0, 1, 2] and all(t.xaxis == "x2" for t in warmups)
    assert list(warmups[0].x) == [0, 1] and warmups[0].mode == "markers"
    assert warmups[0].marker.symbol == "circle-open"
    for run in range(3):
        mine = [t for t in fig.data if t.meta["run"] == run]
        assert {t.legendgroup for t in mine} == {f"run{run}"}
        assert sum(bool(t.showlegend) for t in mine) == 1
        assert len({t.line.color for t in mine if t.mode != "markers"}) == 1
    assert len({util[r].line.color for r in range(3)}) == 3
    assert fig.layout.yaxis.title.text == "workers' CPU % of machine (psutil)"


def test_the_reports_timeline_is_the_step_times_across_the_whole_width(runs: list[BurstResult]) -> None:
    fig = build_figures(runs[:3])["timeline"]
    assert _traces(fig, "util") == [] and [t.meta["run"] for t in _traces(fig, "step")] == [0, 1, 2]
    assert fig.layout.xaxis2.domain == (0.0, 1.0) and fig.layout.xaxis.visible is False
    assert [a.text for a in fig.layout.annotations] == [TIMELINE_TITLES[1]] and fig.layout.annotations[0].x == 0.5


def test_timeline_gpu_axis_and_per_rank_traces() -> None:
    ddp = make_result(config=Config(parallel="ddp", world_size=2), ranks=2, source="nvml")
    fig = timeline([ddp], ["#0"])
    assert fig.layout.yaxis.title.text == "GPU utilisation % (NVML)"
    assert sorted(t.meta["rank"] for t in _traces(fig, "step")) == [0, 1]
    assert sorted(t.meta["rank"] for t in _traces(fig, "warmup")) == [0, 1]


def test_timeline_zooms_the_step_axis_to_measured_steps_and_counts_warmups_above() -> None:
    compiled = make_result(config=Config(compile_mode="default"), step_ms=[9.0, 10.0, 11.0, 10.0], warmup=2)
    compiled.steps[0] = dataclasses.replace(compiled.steps[0], total_s=30.0)  # the compile step
    fig = build_figures([make_result(step_ms=20.0), compiled])["timeline"]
    axis = fig.layout.yaxis2
    low, high = axis.range
    assert axis.type == "log" and axis.autorange is False
    assert 10**low < 9.0 and 10**high > 20.0 and 10**high < 30.0  # the measured steps only, padded
    assert all(10**low <= v <= 10**high for v in axis.tickvals) and len(axis.tickvals) >= 2
    assert [t.meta["run"] for t in _traces(fig, "warmup")] == [0, 1]  # warm-up points stay in the data
    assert max(_traces(fig, "warmup")[1].y) == pytest.approx(30_000.0)
    assert fig.layout.xaxis2.title.text == "step (▲ 4 warm-up/compile steps above the plot, slowest 30.0 s)"


def test_speedup_waterfall_and_breakdown(runs: list[BurstResult]) -> None:
    figures = build_figures(runs)
    assert list(figures) == ["speedup", "waterfall", "breakdown", "timeline", "utilisation"]
    (bars,) = _traces(figures["speedup"], "speedup")
    assert bars.orientation == "h" and bars.meta["runs"] == [1, 0, 2, 3]  # the baseline first; the failed run has none
    assert list(bars.x) == pytest.approx([1.0, 2.0, 1.5, 1.8])
    assert bars.meta["noisy"] == [False, False, True, False] and bars.text[2] == "1.50× (1 burst) ~ noisy"
    (steps,) = _traces(figures["waterfall"], "waterfall")
    assert list(steps.x[:4]) == pytest.approx([1.0, 1.0, -0.5, 0.3])
    breakdown = figures["breakdown"]
    assert breakdown.layout.barmode == "stack"
    by_kind = {t.meta["kind"]: t for t in breakdown.data}
    assert by_kind["data_s"].meta["runs"] == [0, 1, 2, 3]
    assert list(by_kind["data_s"].customdata) == pytest.approx([0.5, 2.0, 2.0, 2.0])  # ms, on hover
    assert list(by_kind["data_s"].x) == pytest.approx([10.0, 20.0, 2.0 / 7.5 * 100, 20.0])  # % of the median step
    assert list(by_kind["compute_s"].customdata) == pytest.approx([3.5, 7.0, 4.5, 7.0])
    assert [t.meta["run"] for t in _traces(figures["utilisation"], "util")] == [0, 1, 2, 3]


def test_single_run_report_leaves_out_empty_figures() -> None:
    figures = build_figures([make_result(util=())])
    assert list(figures) == ["speedup", "breakdown", "timeline"]


def test_library_warnings_are_dropped_where_they_are_raised(tmp_path: Path) -> None:
    """A warning raised from torch's own files (its internal deprecations) never reaches the result; the user's
    and accel_widgets' own (from any file) do."""
    import warnings

    import torch

    from accel_widgets.engine.worker import _collected_warnings

    class CacheWarning(UserWarning):
        """Stands for accel_widgets' own warning raised from another file."""

    CacheWarning.__module__ = "accel_widgets.data.cache"

    inside_torch = compile("import warnings\nwarnings.warn('script_method is deprecated', DeprecationWarning)",
                           str(Path(torch.__file__).parent / "jit" / "_script.py"), "exec")
    with _collected_warnings() as caught:
        exec(inside_torch, {})
        warnings.warn("your model does something odd", UserWarning, stacklevel=1)  # from this file
        exec(compile("import warnings\nwarnings.warn('frozen', W)", torch.__file__, "exec"),
             {"W": CacheWarning})
    assert caught() == ["UserWarning: your model does something odd", "CacheWarning: frozen"]


# -- HTML report ---------------------------------------------------------------------------------------
class _Parser(HTMLParser):
    """Collects script sources and table cells; raises nothing on well-formed input."""

    def __init__(self) -> None:
        super().__init__()
        self.script_srcs: list[str] = []
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.script_srcs += [v or "" for k, v in attrs if k == "src"]
        self._in_cell = tag == "td"

    def handle_endtag(self, tag: str) -> None:
        self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells.append(data)


@pytest.fixture()
def report(tmp_path: Path, runs: list[BurstResult]) -> tuple[Path, str]:
    path = write_report(runs, tmp_path / "out" / "report.html", title="Speed <check>",
                        notes=["Measured on a shared runner & noisy."])
    return path, path.read_text(encoding="utf-8")


def test_report_is_one_offline_file(report: tuple[Path, str]) -> None:
    path, text = report
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == ["report.html"]  # no temp file left
    assert text.count("* plotly.js v") == 1
    assert text.count("Plotly.newPlot") == 5
    parser = _Parser()
    parser.feed(text)
    parser.close()
    assert parser.script_srcs == []  # nothing loaded from a CDN or anywhere else


def test_report_content(report: tuple[Path, str]) -> None:
    _, text = report
    parser = _Parser()
    parser.feed(text)
    assert {"num_workers=2", "baseline", "bf16 <try>: precision=bf16", "200.0", "2.00× (1 burst)", "10.0 ± 0.0",
            "failed: CUDA out of memory. Tried to allocate 2 GiB", "2.13.0"} <= set(parser.cells)
    assert "Speed &lt;check&gt;" in text and "bf16 &lt;try&gt;" in text and "Speed <check>" not in text
    assert "only 8 measured steps" in text
    assert "Measured on a shared runner &amp; noisy." in text
    assert "Traceback (most recent call last)" in text


def test_report_table_reads_as_the_panels_rows(report: tuple[Path, str], runs: list[BurstResult]) -> None:
    """The report's cells are the panel's (one function makes both), with the run number and workload in front."""
    _, text = report
    body = text[text.index("<tbody>"):text.index("</tbody>")]
    shown = [[html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
             for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]
    rows = run_rows(runs)
    assert shown == [[str(row.run), "mlp", *(cell for cell, _ in row_cells(row, REPORT_COLUMNS))] for row in rows]
    for row in rows:
        panel_cells = row_cells(row, PANEL_COLUMNS)
        assert set(panel_cells) <= set(row_cells(row, REPORT_COLUMNS))
        assert f'border-left: 4px solid {run_colour(row.run)};">{row.run}</td>' in body


# -- exports -------------------------------------------------------------------------------------------
def test_csv_and_json_round_trip(tmp_path: Path, runs: list[BurstResult]) -> None:
    rows = comparison_rows(runs)
    with write_csv(rows, tmp_path / "rows.csv").open(newline="", encoding="utf-8") as handle:
        read = list(csv.DictReader(handle))
    assert [r["label"] for r in read] == [r["label"] for r in rows]
    assert float(read[0]["samples_per_s"]) == pytest.approx(200.0) and read[4]["samples_per_s"] == ""
    loaded = [BurstResult.from_dict(d) for d in json.loads(write_json(runs, tmp_path / "runs.json").read_text())]
    assert [r.samples_per_s for r in loaded] == [r.samples_per_s for r in runs]
    assert loaded[4].error == runs[4].error


def test_rows_to_dataframe(runs: list[BurstResult]) -> None:
    frame = rows_to_dataframe(comparison_rows(runs))
    assert frame.shape[0] == 5 and frame.loc[0, "speedup"] == pytest.approx(2.0)


def test_import_does_not_load_plotly() -> None:
    code = ("import sys, accel_widgets.views.report as r; "
            "r.format_table(r.comparison_rows([])); "
            "assert 'plotly' not in sys.modules and 'pandas' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_report_of_no_runs(tmp_path: Path) -> None:
    text = write_report([], tmp_path / "empty.html").read_text(encoding="utf-8")
    assert text.count("* plotly.js v") == 1 and "<h2>Errors</h2>" not in text


def test_report_carries_each_runs_diagnosis(tmp_path):
    from accel_widgets.views.report import write_report
    from tests.panel.fakes import synthetic_result

    base = synthetic_result(label="baseline")
    broken = synthetic_result(Config(precision="bf16"), label="bf16")
    broken.steps = [dataclasses.replace(s, loss=float("nan")) if s.step > 5 else s for s in broken.steps]
    text = write_report([base, broken], tmp_path / "r.html").read_text()
    assert "<h2>Diagnosis</h2>" in text and "Faster but changes training" in text and "FLOP/s (MFU)" in text
    assert '<tr class="ok changes-training">' in text  # the guard's verdict is in the table too, marked
    assert ">changes training</td>" in text


def make_diverged(config: Config | None = None, **kwargs: Any) -> BurstResult:
    """A finished run whose loss went NaN from its third measured step, marked as the launcher marks it."""
    result = make_result(config=config, **kwargs)
    result.steps = [dataclasses.replace(s, loss=float("nan")) if s.step >= 4 else s for s in result.steps]
    result.error = result.divergence()
    result.status = "diverged"
    return result


def test_a_diverged_run_is_never_the_baseline_and_keeps_its_numbers() -> None:
    diverged = make_diverged(samples_per_s=300.0)  # the plain config, listed first and fastest
    rows = comparison_rows([diverged, make_result(config=Config(num_workers=2))])
    assert rows[0]["status"] == "diverged" and rows[0]["samples_per_s"] == pytest.approx(300.0)
    assert rows[0]["error"].startswith("loss is NaN from step 4 (6 of 8 steps not finite): training diverged.")
    assert rows[1]["changes"] == "baseline" and rows[1]["speedup"] == pytest.approx(1.0)  # the ok run is the baseline
    assert rows[0]["changes"] == "num_workers=0"


def test_report_shows_a_diverged_run_in_table_diagnosis_and_errors(tmp_path: Path) -> None:
    text = write_report([make_result(), make_diverged(Config(precision="bf16"), label="bf16")],
                        tmp_path / "r.html").read_text(encoding="utf-8")
    parser = _Parser()
    parser.feed(text)
    assert any(c.startswith("diverged: loss is NaN from step 4") for c in parser.cells)
    assert '<tr class="diverged changes-training">' in text  # styled like every row that is not ok
    assert "<b>Training diverged</b>: loss is NaN from step 4 (6 of 8 steps not finite)" in text
    assert "#1 bf16: diverged</summary>" in text


def test_report_ends_with_the_best_runs_settings_as_plain_pytorch(report: tuple[Path, str]) -> None:
    """The fastest run that trains as its baseline (#0 here, 2.00x) as code to paste, with the batch it trained."""
    _, text = report
    section = text[text.index("<h2>Use in your code</h2>"):]
    assert section.startswith("<h2>Use in your code</h2>\n<p>#0 num_workers=2, the fastest run")
    assert "def train(model, dataset, loss_fn, make_optimizer, steps, seed=0" in section
    assert "num_workers=2,  # With 0 workers" in section and "batch_size=64,  # samples per micro-batch" in section
