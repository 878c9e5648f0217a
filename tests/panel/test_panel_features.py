"""The panel's history, correctness guard, TFLOP/s column, Profile and Tune, through its widgets.

Fakes stand in for the engine (tests/panel/fakes.py) and the tuner (here, calling the panel's engine
wrapper as :func:`accel_widgets.search.tuner.tune` does); one test profiles with the real engine.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from accel_widgets import Config, RayCluster
from accel_widgets.analysis.compare import run_rows
from accel_widgets.panel import TuningPanel, controller
from accel_widgets.panel.table import RunsTable
from accel_widgets.results.burst import BurstResult
from accel_widgets.results.comparison import Block, Comparison
from accel_widgets.results.history import RunHistory
from accel_widgets.results.tune import TuneResult, TuneStep
from accel_widgets.search.tuner import tune
from tests.measured import as_measured
from tests.panel.fakes import CPU, FakeEngine, synthetic_result
from tests.panel.reading import ChartPage, cell, chart_rows, header_text, table_text
from tests.workloads import tiny_workload


def make_panel(engine: Any = None, **kwargs: Any) -> TuningPanel:
    kwargs.setdefault("history", False)
    kwargs.setdefault("compare", False)  # one burst per run, as most tests count them (the last ones compare)
    return TuningPanel(tiny_workload(), engine=engine or FakeEngine(), device=CPU, steps=5, **kwargs)


def click(panel: TuningPanel, button: str) -> None:
    getattr(panel, button).click()
    panel.wait(timeout=60)
    assert not panel.running, "the action did not finish"


def nan_losses(result: BurstResult, from_step: int = 4) -> BurstResult:
    """The same burst, with the loss gone NaN from ``from_step`` on (what a broken fp16 run looks like)."""
    steps = [replace(s, loss=math.nan) if s.step >= from_step else s for s in result.steps]
    return replace(result, steps=steps)


def table_of(results: list[BurstResult]) -> RunsTable:
    """A runs table showing ``results``, as the panel renders it."""
    table = RunsTable(lambda run, shown: None)
    table.render(run_rows(results), hidden=set())
    return table


# -- run history -------------------------------------------------------------------------------------------
def test_every_finished_burst_is_recorded_ok_or_failed(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    panel = make_panel(FakeEngine(fail="worker"), history=str(path))
    click(panel, "run_button")  # fails
    panel.controls.controls["num_workers"].input.value = 1
    click(panel, "run_button")
    with RunHistory(path) as history:
        stored = history.runs()
    assert [(r.status, r.result.config) for r in reversed(stored)] == [("failed", Config()),
                                                                        ("ok", Config(num_workers=1))]
    assert len({r.fingerprint for r in stored}) == 1
    assert "Run history off" not in panel.status.value


def test_the_default_history_is_the_env_file_and_false_turns_it_off(private_history: Path) -> None:
    click(make_panel(history=None), "run_button")
    with RunHistory(private_history) as history:
        assert len(history.runs()) == 1
    panel = make_panel(history=False)
    assert panel.history is None and panel.load_button.disabled and "no run history" in panel.status.value
    click(panel, "run_button")
    with RunHistory(private_history) as history:
        assert len(history.runs()) == 1


def test_a_new_panel_on_the_same_file_loads_the_earlier_runs_once(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    first = make_panel(history=RunHistory(path))
    click(first, "run_button")
    first.controls.controls["num_workers"].input.value = 1
    click(first, "run_button")

    second = make_panel(history=str(path))
    click(second, "run_button")  # recorded too, so loading must not bring it back a second time
    click(second, "load_button")
    titles = [row[1] for row in table_text(second.table)]
    assert titles == ["baseline", "⟲ baseline", "⟲ workers 1"]
    assert sorted(second.loaded) == [1, 2] and "recorded" in second.loaded[1]
    assert second.runs[2].config == Config(num_workers=1)
    (loaded,) = [r for r in second.plots.chart.runs if r["run"] == 2]
    assert loaded["name"].startswith("#2 ⟲")
    assert len(chart_rows(second.plots.chart, 2, "step")) == len([s for s in second.runs[2].steps if not s.warmup])
    hover = cell(second.table, 2, "title")["title"]
    assert "recorded" in hover and "num_workers=1" in hover  # the origin and the long form on hover
    assert "Loaded 2 earlier runs" in second.status.value
    click(second, "load_button")
    assert len(second.runs) == 3 and "Loaded 0 earlier runs" in second.status.value
    assert "(3 already shown)" in second.status.value


def test_a_corrupt_history_file_is_reported_left_alone_and_the_panel_works(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_bytes(b"my precious notes, not a database\n" * 10)
    panel = make_panel(history=str(path))
    assert "Run history off" in panel.status.value and "not an SQLite file" in panel.status.value
    assert panel.history is None and panel.load_button.disabled
    with pytest.raises(RuntimeError, match="not an SQLite file"):
        panel.load_history()
    click(panel, "run_button")
    assert panel.runs[0].ok and "finished" in panel.status.value and "Run history off" in panel.status.value
    assert path.read_bytes() == b"my precious notes, not a database\n" * 10


# -- correctness guard and TFLOP/s -------------------------------------------------------------------------
def test_a_faster_run_whose_loss_goes_nan_is_marked_with_the_reasons() -> None:
    baseline = synthetic_result(steps=10, step_s=0.05)
    broken = nan_losses(synthetic_result(Config(precision="bf16"), steps=10, step_s=0.025))
    slower = nan_losses(synthetic_result(Config(num_workers=1), steps=10, step_s=0.1))
    table = table_of([baseline, broken, slower])
    statuses = [row[-1] for row in table_text(table)]
    assert statuses == ["ok", "faster but changes training", "changes training"]
    reasons = run_rows([baseline, broken, slower])[1].verdict.reasons
    assert any("NaN" in reason for reason in reasons)
    status = cell(table, 1, "status")
    assert "faster but changes training" in status["html"] and "NaN" in status["title"]  # the reasons on hover


def test_a_diverged_run_reads_diverged_with_why_not_as_a_speed_up() -> None:
    diverged = nan_losses(synthetic_result(Config(precision="bf16"), steps=10, step_s=0.025))
    diverged.error, diverged.status = diverged.divergence(), "diverged"  # as the engine marks it
    table = table_of([synthetic_result(steps=10, step_s=0.05), diverged])
    status = table_text(table)[1][-1]
    assert status.startswith("diverged: loss is NaN from step 4 (8 of 12 steps not finite): training diverged.")
    assert table_text(table)[1][2] == "1,280.0"  # the numbers stay visible (320 samples in 0.25 s)
    status = cell(table, 1, "status")["html"]
    assert "var(--jp-error-color1, #c62828)" in status and "font-weight: 600" in status


def test_the_panel_flags_a_run_that_changes_training() -> None:
    def engine(workload: Any, config: Config, **kwargs: Any) -> BurstResult:
        if config.precision == "bf16":
            return nan_losses(synthetic_result(config, step_s=0.02))
        return synthetic_result(config)

    panel = make_panel(engine)
    click(panel, "run_button")
    panel.controls.controls["precision"].input.value = "bf16"
    click(panel, "run_button")
    assert [row[-1] for row in table_text(panel.table)] == ["ok", "faster but changes training"]
    assert "Faster but changes training" in panel.diagnosis.value  # the reading says what the table says


def test_flops_and_mfu_are_shown_with_the_prefix_their_size_needs() -> None:
    cpu = synthetic_result(steps=10, step_s=0.05)  # 640 samples/s
    cpu = replace(cpu, ranks=[replace(r, flops_per_sample=1e9) for r in cpu.ranks])
    gpu = as_measured(replace(synthetic_result(Config(precision="bf16"), steps=10, step_s=0.05),
                              environment={"device_kind": "cuda", "device_name": "NVIDIA A100-SXM4-80GB"}))
    gpu = replace(gpu, ranks=[replace(r, flops_per_sample=312e12 * 0.5 / 640) for r in gpu.ranks])
    tiny = replace(cpu, ranks=[replace(r, flops_per_sample=1e5) for r in cpu.ranks])  # 0.064 GFLOP/s
    table = table_of([cpu, gpu, synthetic_result(), tiny])
    assert [row[9] for row in table_text(table)] == ["640 GFLOP/s", "156 TFLOP/s (50%)", "–", "64.0 MFLOP/s"]
    assert header_text(table)[9] == "FLOP/s (MFU)"


# -- profile -----------------------------------------------------------------------------------------------
def test_profile_runs_a_profiled_burst_and_shows_the_top_operators(tmp_path: Path) -> None:
    engine = FakeEngine()
    panel = make_panel(engine, profile_dir=tmp_path / "profiles")
    panel.controls.controls["num_workers"].input.value = 1
    assert panel.profile_view.layout.display == "none"
    click(panel, "profile_button")
    call = engine.calls[-1]
    assert call.config == Config(num_workers=1) and call.kwargs["steps"] == 5
    options = call.kwargs["options"]
    assert options.profile_steps == 5 and options.profile_dir == str(tmp_path / "profiles")
    view = panel.profile_view.value
    assert panel.profile_view.layout.display is None
    for text in ("aten::addmm", "aten::relu", "self CPU ms", "self device ms", "https://ui.perfetto.dev",
                 str(tmp_path / "profiles" / "fake-trace.json")):
        assert text in view, text
    assert "Profile finished" in panel.status.value and table_text(panel.table)[0][-1] == "ok"


def test_a_failed_profile_says_so_and_the_panel_keeps_working() -> None:
    panel = make_panel(FakeEngine(fail="worker"))
    click(panel, "profile_button")
    assert "No profile captured" in panel.profile_view.value and "deliberate failure" in panel.profile_view.value
    assert "failed" in panel.status.value
    click(panel, "profile_button")
    assert "aten::addmm" in panel.profile_view.value


@pytest.mark.slow
def test_a_real_profiled_burst_shows_operators_and_writes_the_trace(tmp_path: Path) -> None:
    panel = TuningPanel(tiny_workload(), steps=3, history=False, profile_steps=2, profile_dir=tmp_path)
    click(panel, "profile_button")
    (result,) = panel.runs
    assert result.ok, result.error
    capture = result.profile
    assert capture is not None and capture.steps == 2 and capture.top_operators
    assert Path(capture.trace_path).is_file() and Path(capture.trace_path).is_relative_to(tmp_path)
    assert capture.top_operators[0].name in panel.profile_view.value
    assert "https://ui.perfetto.dev" in panel.profile_view.value


# -- tune --------------------------------------------------------------------------------------------------
@dataclass
class FakeTuner:
    """Opens base, then each candidate, through the opener it is given, like ``tune``; keeps the second."""

    candidates: tuple[Config, ...] = (Config(num_workers=1), Config(num_workers=1, precision="bf16"))
    until_stop: bool = False
    raises: Exception | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, workload: Any, **kwargs: Any) -> TuneResult:
        self.calls.append(kwargs)
        if self.raises is not None:
            raise self.raises
        opener, stop, base = kwargs["opener"], kwargs["stop"], kwargs["base"]

        def first(config: Config) -> BurstResult:
            contender = opener(workload, config, f"tune: {config.label()}")
            contender.close()
            return contender.first

        bursts = [first(base)]
        decisions = []
        while True:
            for candidate in self.candidates:
                if stop.is_set():
                    break
                burst = first(candidate)
                bursts.append(burst)
                accepted = candidate == self.candidates[0]
                step = TuneStep("num_workers", 1, accepted, "faster" if accepted else "slower", [bursts[0], burst])
                decisions.append(step)
                kwargs["on_step"](step)
            if not self.until_stop or stop.is_set():
                break
        reason = "stopped: the stop event was set" if stop.is_set() else "every knob tried"
        return TuneResult(self.candidates[0], 150.0, 100.0, decisions, bursts, 1.0, reason,
                          confirmation=headline(base, self.candidates[0], (1.4, 1.5, 1.6, 1.5)))


def headline(start: Config, best: Config, ratios: tuple[float, ...]) -> Comparison:
    """The pick against the start in blocks whose windows read ``ratios`` (best over start)."""
    windows, blocks = [], []
    for ratio in ratios:
        offset = len(windows)
        windows += [synthetic_result(start, step_s=0.03)] * 2 + [synthetic_result(best, step_s=0.03 / ratio)] * 2
        blocks.append(Block((offset, offset + 1), (offset + 2, offset + 3)))
    return Comparison(start, best, 0.03, windows, blocks)


def test_tune_plots_each_burst_and_ends_with_the_best_config_in_the_controls(tmp_path: Path) -> None:
    engine, tuner = FakeEngine(), FakeTuner()
    panel = make_panel(engine, tuner=tuner, history=tmp_path / "h.sqlite")
    assert panel.budget.value == 60
    panel.budget.value = 30
    click(panel, "tune_button")
    (call,) = tuner.calls
    assert call["budget_s"] == 30 and call["base"] == Config() and call["steps"] == 5 and call["device"] is CPU
    assert [c.config for c in engine.calls] == [Config(), *tuner.candidates]
    assert all(c.kwargs["stop"] is call["stop"] for c in engine.calls)  # Stop reaches every burst
    assert [row[1].split(":")[0] for row in table_text(panel.table)] == ["tune"] * 3
    for run in range(3):
        assert chart_rows(panel.plots.chart, run, "step"), run
    assert panel.config == Config(num_workers=1)
    text = panel.status.value
    assert "Tune finished" in text and "num_workers=1" in text and "3 bursts" in text
    assert "faster: 1.50× [1.22–1.85] against the start" in text
    assert panel.progress.value == pytest.approx(1.0) and not panel.tune_button.disabled
    with RunHistory(tmp_path / "h.sqlite") as history:
        assert len(history.runs()) == 3


def test_stop_ends_a_tuning_within_a_second() -> None:
    engine, tuner = FakeEngine(pace_s=0.01), FakeTuner(until_stop=True)
    panel = make_panel(engine, tuner=tuner)
    panel.tune_button.click()
    deadline = time.monotonic() + 10
    while len(engine.calls) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert panel.running and panel.run_button.disabled and panel.profile_button.disabled
    with pytest.raises(RuntimeError, match="already running"):
        panel.profile()
    clicked = time.monotonic()
    panel.stop_button.click()
    assert panel.wait(timeout=5)
    assert time.monotonic() - clicked < 1.0
    assert "Tune stopped" in panel.status.value and "stopped: the stop event was set" in panel.status.value
    assert not panel.run_button.disabled


def test_a_tuner_that_raises_is_reported_and_the_panel_keeps_working() -> None:
    tuner = FakeTuner(raises=ValueError("unknown knob 'warp_speed'"))
    panel = make_panel(tuner=tuner)
    click(panel, "tune_button")
    assert "Tune failed: ValueError: unknown knob" in panel.status.value
    assert panel.config == Config()
    click(panel, "run_button")
    assert panel.runs[-1].ok


def test_the_default_tuner_is_the_real_one_and_an_empty_search_reads_plainly() -> None:
    assert inspect.signature(TuningPanel).parameters["tuner"].default is tune
    panel = make_panel(tuner=lambda workload, **kwargs: TuneResult(Config(), None, None, [], [], 0.0, "nothing"))
    click(panel, "tune_button")
    assert "Tune finished" in panel.status.value and "1.00×" in panel.status.value


# -- batch-size finder --------------------------------------------------------------------------------------

def test_find_batch_size_reports_each_try_and_shows_the_curve() -> None:
    """The finder through the panel's engine: a fake whose bursts fail past a batch of 64, like an OOM."""
    from accel_widgets import WorkerOutOfMemory
    from accel_widgets.results.burst import BurstResult, ErrorInfo

    class FitsUpTo64(FakeEngine):
        def __call__(self, workload, config, **kwargs):
            if (config.batch_size or 0) > 64:
                self.calls.append(config)
                error = ErrorInfo("oom", "CUDA out of memory", 0)
                raise WorkerOutOfMemory("rank 0: out of memory",
                                        BurstResult(workload="fake", config=config, status="failed", error=error))
            return super().__call__(workload, config, **kwargs)

    engine = FitsUpTo64()
    panel = make_panel(engine)
    statuses: list[str] = []
    panel.state.subscribe(lambda part: statuses.append(panel.state.status) if part == "status" else None)
    try:
        panel.set_config(Config(batch_size=16))
        panel.batch_button.click()
        assert panel.wait(30) is None and not panel.running  # the tries measure the batch size: no run
    finally:
        panel.close()
    search = panel.state.batch_search
    assert search is not None and search.largest_fitting == 64
    assert "the largest that fits is 64" in panel.state.status
    assert any(s.startswith("Batch size: 128 does not fit") for s in statuses), statuses
    assert panel.batch_view.layout.display is None and len(panel.batch_view.children) == 2
    table = panel.batch_view.children[1].value  # the tries, and the margin they were held to
    assert "margin: a size fits when its peak leaves 10% of" in table and "     128  no " in table
    assert panel.state.results == []  # tries are not runs of the table


# -- status line ------------------------------------------------------------------------------------------------
def test_the_status_line_names_the_phase_a_long_first_step_is_in() -> None:
    """The launcher's phase events reach the status line as the CLI's progress line reads them."""
    from accel_widgets.results.burst import BurstPhase

    class CompilesFirst(FakeEngine):
        def __call__(self, workload, config, *, on_event=None, **kwargs):
            on_event(BurstPhase(0.1, 0, "setup"))
            on_event(BurstPhase(0.2, 0, "step"))
            time.sleep(0.4)  # the first step compiling: no step record yet
            return super().__call__(workload, config, on_event=on_event, **kwargs)

    panel = make_panel(CompilesFirst())
    page = ChartPage(panel.plots.chart)
    statuses: list[str] = []
    panel.state.subscribe(lambda part: statuses.append(panel.state.status) if part == "status" else None)
    panel.set_config(Config(compile_mode="default"))
    click(panel, "run_button")
    phases = [next((p for p in ("setting up", "compiling", "warming up", "measuring") if f": {p}" in s), None)
              for s in statuses]
    seen = [p for i, p in enumerate(phases) if p and p != phases[i - 1]]
    assert seen[:2] == ["setting up", "compiling"], statuses
    assert any("compiling" in s and "then warm-up and 5 steps: live on the timeline" in s for s in statuses), statuses
    # From the first warm-up step on the progress is on the timeline, in the points' own message: no status change.
    assert not {"warming up", "measuring"} & set(seen), statuses
    tickers = [m["ticker"]["text"] for _, m in page.messages if m.get("ticker")]
    # On this (fake) CPU the burst fills every core, so the measured window is announced, not counted live.
    assert any(": warming up" in t for t in tickers), tickers
    assert any(": measuring 5 steps: drawn when they end" in t for t in tickers), tickers
    assert panel.state.status.startswith("Burst finished")


# -- compare tabs -------------------------------------------------------------------------------------------------
def test_the_compare_tabs_draw_the_reports_figures_of_the_finished_runs() -> None:
    panel = make_panel()
    assert panel.compare.layout.display == "none"  # nothing to compare yet
    click(panel, "ladder_button")
    assert panel.compare.layout.display is None
    assert panel.compare.selected_index is None  # no figure is laid out until a tab is opened
    panel.compare.selected_index = 0
    speedup = panel.compare.children[0].children[0]
    assert {t.meta["kind"] for t in speedup.data} >= {"speedup"}
    assert sorted(r for t in speedup.data if t.meta.get("kind") == "speedup" for r in t.meta["runs"]) == \
        list(range(len(panel.runs)))
    panel.compare.selected_index = 2  # where the step goes: drawn when first looked at
    breakdown = panel.compare.children[2].children[0]
    assert {t.meta["kind"] for t in breakdown.data} == {"data_s", "h2d_s", "compute_s"}
    click(panel, "run_button")  # a new run: the shown tab is drawn again, with it
    assert panel.compare.children[2].children[0] is not breakdown
    panel.plots.probe.width = 900  # measured after the tabs were drawn: they are refitted, not left at 1180
    assert panel.compare.children[2].children[0].layout.width == 900
    panel.compare.selected_index = 0
    assert panel.compare.children[0].children[0].layout.width == 900


@dataclass
class BusyMachine:
    """Bursts at 32/step_s samples/s: the second one measured while another job took 40% of the machine (its
    steps stable, but the load past the threshold), everything after it quiet, the run 1.25x the baseline."""

    calls: list[Config] = field(default_factory=list)

    def __call__(self, workload: Any, config: Config, **kwargs: Any) -> BurstResult:
        self.calls.append(config)
        step_s = 0.04 if config == Config(num_workers=1) else 0.05
        if len(self.calls) == 2:
            return synthetic_result(config, step_s=step_s, util=40, foreign=40)
        return synthetic_result(config, step_s=step_s)


def test_an_unreliable_run_is_marked_and_a_re_measure_gives_it_an_interval_and_a_verdict() -> None:
    engine = BusyMachine()
    panel = make_panel(engine)
    assert panel.remeasure_button.disabled  # nothing to compare with yet
    click(panel, "run_button")
    panel.set_config(Config(num_workers=1))
    click(panel, "run_button")
    row = table_text(panel.table)[1]
    assert row[3] == "1.25× ⚠ 1 burst" and row[-1] == "⚠ unreliable"
    status_hover = cell(panel.table, 1, "status")["title"]
    assert "other load took 40% of the machine" in status_hover and "Re-measure" in status_hover
    assert "Unreliable measurement" in panel.diagnosis.value
    assert not panel.remeasure_button.disabled and panel.remeasure_button.button_style == "warning"
    click(panel, "remeasure_button")
    repeats = engine.calls[2:]
    # Both configs' first bursts (in no block), then balanced blocks until the verdict settles: 4 blocks, 8 windows
    # each.
    assert repeats.count(Config()) == repeats.count(Config(num_workers=1)) == 1 + 8 and len(repeats) == 18
    assert len(panel.runs) == 2  # the re-measure's bursts are not runs of the table
    row = table_text(panel.table)[1]
    assert row[3] == "1.25× [1.25–1.25] ▲" and row[-1] == "ok"  # its interval, not its lone burst, ranks it now
    assert "Re-measured #1 num_workers=1 against its baseline: faster 1.25× [1.25–1.25]" in panel.status.value
    assert "Compared with its baseline" in panel.diagnosis.value and "faster" in panel.diagnosis.value


def test_unreliable_runs_are_marked_in_the_text_table_and_the_speed_up_figure() -> None:
    from accel_widgets.analysis.compare import comparison_rows
    from accel_widgets.views.figures import speedup_figure
    from accel_widgets.views.report import format_table

    runs = [synthetic_result(), synthetic_result(Config(num_workers=1), step_s=0.04, util=40, foreign=40)]
    rows = comparison_rows(runs)
    text = format_table(rows)
    assert "⚠ unreliable" in text and "#1 unreliable: other load took 40% of the machine" in text
    (bars,) = [t for t in speedup_figure(rows).data if t.meta and t.meta.get("kind") == "speedup"]
    assert bars.meta["unreliable"] == [False, True] and bars.text[1] == "1.25× (1 burst) ⚠ unreliable"
    assert bars.marker.pattern.shape[1] == "x" and bars.marker.opacity[1] < 1


# -- a run compared with its baseline ----------------------------------------------------------------------------
def test_a_run_is_compared_with_its_baseline_and_its_row_tightens_live() -> None:
    engine = FakeEngine(speedups={Config(num_workers=1): 1.5})
    panel = make_panel(engine, compare=True)
    click(panel, "run_button")
    assert len(engine.calls) == 1  # the first run is the baseline: nothing to compare it with
    seen: list[tuple[Any, bool]] = []
    panel.state.subscribe(lambda part: seen.append((panel.state.rows[-1].values.get("verdict"),
                                                    1 in panel.state.comparing)) if part == "runs" else None)
    panel.set_config(Config(num_workers=1))
    click(panel, "run_button")
    assert len(panel.runs) == 2  # the comparison's bursts are not runs of the table
    labels = [call.kwargs["label"] for call in engine.calls[1:]]
    assert labels[:2] == ["", "#0 baseline"] and {"#0 baseline · repeat", "#1 num_workers=1 · repeat"} <= set(labels)
    row = table_text(panel.table)[1]
    assert row[3] == "1.50× [1.50–1.50] ▲" and 1 not in panel.state.comparing
    assert (None, True) in seen or ("undecided", True) in seen  # the row showed the comparison while it ran
    assert "Compared with its baseline" in panel.diagnosis.value and "faster" in panel.diagnosis.value
    assert panel.state.compared[1].verdict == "faster" and panel.state.compared[1].reference == Config()


def test_the_same_config_again_reads_as_the_noise_floor_and_compare_off_as_one_burst() -> None:
    engine = FakeEngine()
    panel = make_panel(engine, compare=True)
    click(panel, "run_button")
    click(panel, "run_button")
    assert table_text(panel.table)[1][3].startswith("same config: 1.00–1.00×")
    panel.compare_runs.value = False
    calls = len(engine.calls)
    click(panel, "run_button")
    assert len(engine.calls) == calls + 1 and table_text(panel.table)[2][3] == "same config: 1.00× 1 burst"


def test_a_ladder_compares_its_rungs_and_each_row_reads_against_the_baseline_rung() -> None:
    from accel_widgets.search.ladder import classic_ladder

    rungs = classic_ladder(tiny_workload(), CPU)
    engine = FakeEngine(speedups={rung.config: 1.0 + 0.5 * index for index, rung in enumerate(rungs)})
    panel = make_panel(engine, compare=True)
    click(panel, "ladder_button")
    assert len(panel.runs) == len(rungs) > 2
    for index in range(1, len(rungs)):
        comparison = panel.state.compared[index]
        assert comparison.verdict == "faster" and comparison.ratio == pytest.approx(1.0 + 0.5 * index)
    assert "Ladder finished" in panel.status.value


# -- before tuning: will it fit, and the ceilings -----------------------------------------------------------------
def wait_for(condition: Any, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_the_fit_line_sits_under_batch_size_before_a_burst_and_follows_the_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A step traced on fake tensors once the knobs are still: "fits on this machine with N GiB to spare" under the
    batch_size control, again for new settings, none for settings that cannot run here, and once a burst of the
    settings has run, its measured peak beside the estimate."""
    panel = make_panel()
    aside = panel.controls.controls["batch_size"].aside
    try:
        assert wait_for(lambda: panel.state.fit.startswith("fits on this machine")), panel.state.fit
        assert aside.layout.display is None and "to spare (peak " in aside.value and "estimated)" in aside.value
        first = panel.state.fit
        panel.set_config(Config(batch_size=100_000))
        assert wait_for(lambda: panel.state.fit not in ("", first)), panel.state.fit
        assert panel.state.fit.startswith("fits on this machine")
        panel.set_config(Config(parallel="dataparallel"))  # no GPU here: the settings cannot run, so no estimate
        assert wait_for(lambda: panel.state.fit == "") and aside.layout.display == "none"
        panel.set_config(Config(batch_size=100_000))
        assert wait_for(lambda: panel.state.fit.startswith("fits on this machine")), panel.state.fit
        traced = []
        monkeypatch.setattr(controller, "estimate", lambda *args, **kwargs: traced.append(args))
        click(panel, "run_button")  # the fake's burst peaks at 150 MiB of RSS: said beside the estimate after it
        assert wait_for(lambda: "; measured 0.15 GiB, estimated " in panel.state.fit), panel.state.fit
        assert panel.state.fit.startswith("fits on this machine") and panel.state.fit.endswith("%)")
        assert traced == []  # the settings traced before the burst keep their estimate: no trace after it
    finally:
        panel.close()


def test_ceilings_are_measured_for_the_settings_and_drawn_as_bars_under_the_runs_table() -> None:
    """The Ceilings button: the settings with the data free against them as they are (the fake engine's data-free
    bursts twice as fast), by the comparison engine; the bars appear under the table and the status says each."""
    panel = make_panel(FakeEngine(freed_speedups={"data": 2.0}), budget_s=10)
    try:
        assert panel.ceilings.layout.display == "none"
        click(panel, "ceilings_button")
    finally:
        panel.close()
    found = panel.state.headspace
    assert found is not None and found.ceilings["data"].room is True
    assert found.ceilings["data"].comparison.ratio == pytest.approx(2.0, rel=0.05)
    assert panel.ceilings.layout.display is None and panel.ceilings.value.count('class="aw-ceiling"') == 3
    assert panel.state.status.startswith("Ceilings of baseline (") and "Data free: " in panel.state.status
    assert panel.state.results == []  # the windows measure the parts, not the knobs: no run of the table
    main = panel._main.children
    assert main.index(panel.ceilings) == main.index(panel.table.widget) + 1


def test_the_ladder_leaves_out_a_rung_whose_ceiling_reads_same() -> None:
    """The panel's ladder reads the ceilings of its baseline: a data ceiling at 1x closes the loader's rung."""
    from accel_widgets.panel.controller import ladder_plan
    from tests.results.test_headspace import headspace_of

    same = headspace_of({"data": [1.0, 1.01, 0.99, 1.0, 1.005, 0.998]})
    plain = [item.label for item in ladder_plan(tiny_workload(), CPU)]
    read = [item.label for item in ladder_plan(tiny_workload(), CPU, ceilings=same)]
    assert "+loader" in plain and read == [label for label in plain if label != "+loader"]
    other = headspace_of({"data": [1.0, 1.01, 0.99, 1.0, 1.005, 0.998]}, Config(num_workers=1))
    assert [item.label for item in ladder_plan(tiny_workload(), CPU, ceilings=other)] == plain  # not its baseline


def test_the_reading_of_a_run_is_read_again_with_its_configs_ceilings() -> None:
    """Measured after the run, the ceilings of its config size its limiter: the fake's data-free bursts twice as fast
    make half the step the data's, which the step's own clock did not see."""
    panel = make_panel(FakeEngine(freed_speedups={"data": 2.0}), budget_s=10)
    try:
        click(panel, "run_button")
        assert panel.state.reading.findings[0].title.startswith("Compute-bound")
        click(panel, "ceilings_button")
    finally:
        panel.close()
    limiter = panel.state.reading.findings[0]
    assert limiter.title == "Data-bound" and "50% of the step goes to data loading" in limiter.detail, limiter
    assert "can win at most 2.00× here" in limiter.detail and "Data-bound" in panel.diagnosis.value


# -- where the bursts run ---------------------------------------------------------------------------
def _box_of(root: Any, widget: Any) -> Any:
    """The box in the panel's tree that holds ``widget`` itself."""
    for child in getattr(root, "children", ()):
        if child is widget:
            return root
        if (found := _box_of(child, widget)) is not None:
            return found
    return None


def test_a_panel_given_a_cluster_runs_there_or_here_as_its_run_on_choice_says() -> None:
    """"Run on" is there only where the panel was given a cluster; each choice sends every burst of the next actions
    where it says, with the options the panel adds kept. A run's baseline is one of its own place (a comparison
    interleaves its bursts in one place): the first run on the cluster is the cluster's, the next is compared with
    it there; a Re-measure from the other place says why it cannot."""
    plain = make_panel()
    assert _box_of(plain.root, plain.run_on) is None
    with pytest.raises(TypeError, match=r"cluster must be an accel_widgets\.RayCluster, got str"):
        make_panel(cluster="10.0.0.1:6379")
    cluster = RayCluster(address="10.0.0.1:6379", placement="STRICT_SPREAD")
    engine = FakeEngine()
    panel = make_panel(engine, cluster=cluster, compare=True)
    assert _box_of(panel.root, panel.run_on) is not None and panel.run_on.value == "this machine"
    click(panel, "run_button")
    assert len(engine.calls) == 1 and engine.calls[0].kwargs["options"].cluster is None
    panel.run_on.value = "Ray cluster"
    click(panel, "run_button")
    panel.set_config(Config(batch_size=64))
    click(panel, "run_button")
    there = engine.calls[1:]
    assert len(there) > 2 and all(call.kwargs["options"].cluster == cluster for call in there)  # runs and windows
    assert [row.values["changes"] for row in panel.state.rows] == [
        "baseline", "baseline, on 1 Ray node", "batch_size=64, on 1 Ray node"]
    assert [row.values["baseline"] for row in panel.state.rows] == [0, 1, 1]
    assert panel.state.rows[2].values["blocks"] > 0, "compared with the cluster's baseline, on the cluster"
    click(panel, "profile_button")
    profiled = engine.calls[-1].kwargs["options"]
    assert profiled.cluster == cluster and profiled.profile_steps > 0  # the panel's own options kept
    panel.run_on.value = "this machine"
    calls = len(engine.calls)
    click(panel, "remeasure_button")
    assert len(engine.calls) == calls and ("it and its baseline ran on 1 Ray node, and the panel runs on this "
                                           "machine: set Run on to where they ran") in panel.status.value
    click(panel, "run_button")
    assert engine.calls[-1].kwargs["options"].cluster is None
