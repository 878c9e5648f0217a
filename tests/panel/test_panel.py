"""The panel's widget logic without a browser: set values, click buttons, read what the engine got and what shows.

A fake engine with ``run_burst``'s signature stands in for training (tests/panel/fakes.py); one test uses
the real engine on a tiny workload, and one stops a real burst.
"""

from __future__ import annotations

import html
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from accel_widgets import KNOBS, Config, StepRecord
from accel_widgets.knobs import GROUP_TITLES
from accel_widgets.panel import TuningPanel
from accel_widgets.panel.controller import FLUSH_INTERVAL_S
from accel_widgets.panel.plots import (
    BELOW_EXTRA_PX,
    MAX_TRACE_POINTS,
    MIN_WIDTH,
    NARROW_PX,
    SHORT_TITLES,
    Timeline,
)
from accel_widgets.panel.state import PanelState
from accel_widgets.panel.view import COMPARE_TABS, KNOBS_BESIDE_PX, KNOBS_MAX_PX
from accel_widgets.results.reliability import reliability
from accel_widgets.search.ladder import classic_ladder
from accel_widgets.views.style import run_colour
from accel_widgets.views.text import summary
from accel_widgets.views.timeline import timeline
from tests.panel.fakes import CPU, GPU1, WARMUP, FakeEngine, sample, synthetic_result
from tests.panel.reading import ChartPage, chart_rows, table_text, traces
from tests.workloads import tiny_workload

CUDA_ONLY = [name for name, knob in KNOBS.items() if knob.applies_to == ("cuda",)]


def make_panel(engine: FakeEngine | None = None, device=CPU, steps: int = 5) -> TuningPanel:
    return TuningPanel(tiny_workload(), engine=engine or FakeEngine(), device=device, steps=steps,
                       compare=False)  # one burst per run, as these tests count them (test_panel_features compares)


def run(panel: TuningPanel, button: str = "run_button") -> None:
    getattr(panel, button).click()
    panel.wait(timeout=30)
    assert not panel.running, "the action did not finish"


def status(panel: TuningPanel) -> str:
    return panel.status.value


def timeline_tab(panel: TuningPanel) -> Any:
    """Open the Compare tab with the report's timeline (hover, zoom) and return its figure."""
    tab = list(COMPARE_TABS).index("timeline")
    panel.compare.selected_index = tab
    (figure,) = panel.compare.children[tab].children
    return figure


def test_close_right_after_a_run_leaves_no_thread_of_the_panel_running() -> None:
    """The run's end schedules a fit estimate; close returns only once that, the action and live mode are gone."""
    before = set(threading.enumerate())
    panel = make_panel(FakeEngine())
    panel.run_button.click()
    panel.close()
    assert not panel.running
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []


# -- controls -----------------------------------------------------------------------------------------
def test_every_knob_has_a_control_with_its_help_grouped_as_the_registry() -> None:
    panel = make_panel()
    assert set(panel.controls.controls) == set(KNOBS)
    for name, control in panel.controls.controls.items():
        knob = KNOBS[name]
        assert control.input.tooltip == knob.what
        assert control.help.layout.display == "none"
        control.info.value = True
        assert control.help.layout.display is None
        for text in (knob.what, knob.why, knob.when):
            assert html.escape(text) in control.help.value
    # One family open at a time, in the registry's order; each family holds its own knobs.
    controls = panel.controls
    assert list(controls.tabs) == list(GROUP_TITLES) and controls.open == "data"
    assert [tab.tooltip for tab in controls.tabs.values()] == list(GROUP_TITLES.values())
    for group, family in controls.families.items():
        held = {box for child in family.box.children for box in (child, *getattr(child, "children", ()))}
        assert {k.name for k in KNOBS.values() if controls.controls[k.name].box in held} == \
            {k.name for k in KNOBS.in_group(group)}, group
    controls.tabs["compile"].value = True  # a click on a family opens it and closes the open one
    assert controls.open == "compile" and not controls.tabs["data"].value
    shown = [group for group, family in controls.families.items() if family.box.layout.display is None]
    assert shown == ["compile"]
    controls.tabs["compile"].value = False  # and a second click closes it
    assert controls.open is None and all(f.box.layout.display == "none" for f in controls.families.values())


def test_the_knobs_that_cannot_act_here_fold_into_one_line_per_family_and_changes_show_on_the_families() -> None:
    panel = make_panel(device=CPU)
    data = panel.controls.families["data"]
    assert data.fold is not None and data.fold.description == "2 knobs act only on CUDA"
    folded = {name for name in CUDA_ONLY if panel.controls.controls[name].box in data.folded.children}
    assert folded == {"pin_memory", "non_blocking"} and data.folded.layout.display == "none"
    data.fold.value = True  # opens on demand: the knobs, disabled, each with its reason
    assert data.folded.layout.display is None and panel.controls.controls["pin_memory"].input.disabled
    assert panel.controls.families["float8"].fold.description == "1 knob acts only on CUDA"
    assert panel.controls.families["batch"].fold is None
    assert make_panel(device=GPU1).controls.families["data"].fold is None  # everything acts on a GPU

    panel.set_config(Config(num_workers=2, persistent_workers=True, precision="bf16"))
    tabs = panel.controls.tabs
    assert tabs["data"].description == "data ·2" and tabs["precision"].description == "precision ·1"
    assert tabs["data"].tooltip == "Data loading: workers 2, persistent" and tabs["batch"].description == "batch"
    assert "Changed: <span" in panel.controls.changed.value
    assert "workers 2, persistent, bf16" in panel.controls.changed.value
    panel.controls.controls["batch_size"].input.value = "many"  # a typed value that does not parse reads as typed
    assert "batch 'many'" in html.unescape(panel.controls.changed.value)
    panel.reset_button.click()
    assert "none (the baseline)" in panel.controls.changed.value and tabs["data"].description == "data"


def test_cuda_only_knobs_are_disabled_on_a_cpu_with_the_reason() -> None:
    panel = make_panel(device=CPU)
    for name, control in panel.controls.controls.items():
        assert control.input.disabled == (name in CUDA_ONLY), name
    note = panel.controls.controls["pin_memory"].note.value
    assert "only acts on CUDA" in note and "cpu" in note
    gpu_panel = make_panel(device=GPU1)
    assert not any(c.input.disabled for c in gpu_panel.controls.controls.values())


def test_fp16_on_a_cpu_without_fp16_units_carries_a_warning_but_can_run() -> None:
    panel = make_panel()
    precision = panel.controls.controls["precision"]
    assert ("fp16 ⚠", "fp16") in precision.input.options
    precision.input.value = "fp16"
    assert "⚠" in precision.note.value and "fp16" in precision.note.value
    assert "no fp16 units" in panel.validation.value
    assert not panel.run_button.disabled


def test_a_config_error_disables_run_and_says_why() -> None:
    panel = make_panel()
    parallel = panel.controls.controls["parallel"]
    assert ("dataparallel ✗", "dataparallel") in parallel.input.options
    parallel.input.value = "dataparallel"
    assert panel.run_button.disabled
    assert "needs at least 2 GPUs" in panel.validation.value
    with pytest.raises(ValueError, match="cannot run here"):
        panel.run_burst()
    parallel.input.value = "none"
    assert not panel.run_button.disabled and "✗" not in panel.validation.value


def test_an_invalid_typed_value_disables_run() -> None:
    panel = make_panel()
    batch = panel.controls.controls["batch_size"]
    batch.input.value = "many"
    assert panel.run_button.disabled and "batch_size" in panel.validation.value
    batch.input.value = ""
    assert not panel.run_button.disabled and panel.config.batch_size is None
    batch.input.value = "128"
    assert panel.config.batch_size == 128


def test_reset_returns_every_control_to_the_baseline() -> None:
    panel = make_panel()
    panel.set_config(Config(num_workers=2, precision="bf16", batch_size=64, compile_mode="default"))
    assert panel.config.label() == "batch_size=64, num_workers=2, precision=bf16, compile_mode=default"
    shown = {name: control.input.value for name, control in panel.controls.controls.items()}
    assert shown["num_workers"] == 2 and shown["precision"] == "bf16" and shown["batch_size"] == "64"
    panel.reset_button.click()
    assert panel.config == Config()
    controls = panel.controls.controls
    assert controls["batch_size"].input.value == "" and controls["num_workers"].input.value == 0


# -- runs -----------------------------------------------------------------------------------------------
def test_run_burst_sends_the_controls_config_and_length_to_the_engine() -> None:
    engine = FakeEngine()
    panel = make_panel(engine)
    panel.controls.controls["num_workers"].input.value = 2
    panel.controls.controls["precision"].input.value = "bf16"
    panel.length_value.value = 7
    run(panel)
    call = engine.calls[-1]
    assert call.config == Config(num_workers=2, precision="bf16")
    assert call.kwargs["steps"] == 7 and call.kwargs["seconds"] is None and call.kwargs["label"] == ""
    assert call.kwargs["stop"] is not None and not call.kwargs["stop"].is_set()
    panel.length_unit.value = "seconds"
    panel.length_value.value = 2.5
    run(panel)
    assert engine.calls[-1].kwargs["steps"] is None and engine.calls[-1].kwargs["seconds"] == 2.5
    assert [r.config for r in panel.runs] == [Config(num_workers=2, precision="bf16")] * 2
    assert "finished" in status(panel)


def test_table_rows_and_plot_traces_show_what_the_engine_emitted() -> None:
    engine = FakeEngine()
    panel = make_panel(engine, steps=6)
    run(panel)
    panel.controls.controls["num_workers"].input.value = 1
    run(panel)
    rows = table_text(panel.table)
    assert [r[0] for r in rows] == ["#0", "#1"]
    assert rows[0][1] == "baseline" and rows[1][1] == "workers 1"
    assert rows[0][3] == "1.00×" and rows[1][-1] == "ok"
    chart = panel.plots.chart
    for run_index, events in enumerate(engine.emitted):
        steps = [e for e in events if hasattr(e, "rank")]
        samples = [e for e in events if hasattr(e, "util_pct")]
        measured, warmup, util = (chart_rows(chart, run_index, kind) for kind in ("step", "warmup", "util"))
        assert [row[2] for row in measured] == [s.step for s in steps if not s.warmup]
        assert [row[3] for row in measured] == pytest.approx([s.total_s * 1e3 for s in steps if not s.warmup],
                                                             rel=1e-3)
        assert [row[2] for row in warmup] == list(range(WARMUP))
        assert [row[1] for row in util] == pytest.approx([s.t for s in samples], abs=1e-3)
        assert [row[2] for row in util] == pytest.approx([s.util_pct for s in samples], abs=0.1)
        assert [row[3] for row in util] == pytest.approx([s.mem_used_bytes / 2**20 for s in samples], abs=1)
        (held,) = [r for r in chart.runs if r["run"] == run_index]
        assert held["colour"] == run_colour(run_index) and held["name"] == panel.state.runs[run_index].name
    assert run_colour(0) != run_colour(1)
    assert chart.utilisation_title == "workers' CPU % of machine (psutil)"
    assert "Reading of #1" in panel.diagnosis.value


def test_the_timeline_tab_is_the_reports_timeline_built_by_the_same_functions() -> None:
    """The report shows this figure's step-time half (its utilisation is per run there, in small panels)."""
    panel = make_panel(FakeEngine(), steps=6)
    run(panel)
    panel.set_config(Config(parallel="ddp", world_size=2))
    run(panel)
    static = timeline(panel.runs, [shown.name for shown in panel.state.runs])

    def described(figure: Any) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        return {(t.meta["run"], t.meta["kind"], t.meta.get("rank"), t.meta.get("device")):
                (t.name, t.mode, t.line.color, t.line.dash, t.marker.symbol, t.marker.color, t.opacity, t.xaxis,
                 t.showlegend, t.hovertemplate, tuple(t.x), tuple(t.y), tuple(t.customdata or ()))
                for t in figure.data}

    figure = timeline_tab(panel)
    shown = described(figure)
    assert shown == described(static) and len(shown) == (2 + 1 * 2) + (2 + 2 * 2)  # legend, util, ranks x 2 kinds
    for axis in ("yaxis", "yaxis2", "xaxis", "xaxis2"):
        assert figure.layout[axis].title.text == static.layout[axis].title.text
    assert figure.layout.yaxis2.type == static.layout.yaxis2.type == "log"


def test_the_figure_fits_and_the_knobs_sit_beside_the_chart_where_both_fit() -> None:
    panel = make_panel()
    run(panel)
    assert timeline_tab(panel).layout.width == 1180  # until measured
    # The chart, the knobs and the runs table share one wrapping row; only the flex order moves the knobs, so the
    # page builds no view again for it.
    main = [panel._chart_box, panel.knobs, panel.table.widget, panel.ceilings]  # the ceilings' bars under the table
    assert list(panel._main.children) == main
    order = {"chart": panel._chart_box.layout, "knobs": panel.knobs.layout, "table": panel.table.widget.layout,
             "ceilings": panel.ceilings.layout}
    for width, beside in ((KNOBS_BESIDE_PX, True), (KNOBS_BESIDE_PX - 1, False), (1400, True)):
        panel.plots.probe.width = width  # what the probe's front end reports
        assert panel.knobs_beside == beside, width
        assert sorted(order, key=lambda part: int(order[part].order)) == (  # a tie keeps the children's order
            ["chart", "knobs", "table", "ceilings"] if beside else ["chart", "table", "ceilings", "knobs"]), width
        assert (order["knobs"].max_height == f"{KNOBS_MAX_PX}px") == beside  # beside, never taller than the chart
        assert list(panel._main.children) == main
    panel.plots.probe.width = KNOBS_BESIDE_PX - 100
    assert order["chart"].flex == "1 1 100%"  # the chart takes the whole line, the table the next
    panel.plots.probe.width = NARROW_PX
    figure = timeline_tab(panel)
    layout = figure.layout
    wide_height = layout.height
    panel.plots.probe.width = MIN_WIDTH - 100
    assert layout.width == MIN_WIDTH  # never narrower than two readable subplots need
    # Narrow: the legend under the plots (with room made for it), short subplot titles.
    assert layout.legend.orientation == "h" and layout.legend.yref == "container"
    assert layout.height == wide_height + BELOW_EXTRA_PX
    assert [a.text for a in layout.annotations] == list(SHORT_TITLES)
    panel.plots.probe.width = NARROW_PX
    assert layout.legend.orientation == "v" and layout.height == wide_height
    assert "Step time" in layout.annotations[1].text and layout.annotations[1].text != SHORT_TITLES[1]
    assert figure._widget_layout["width"] == NARROW_PX  # a page reload's view starts at that width



def test_unticking_a_run_hides_its_traces() -> None:
    panel = make_panel()
    run(panel)
    run(panel)
    panel.table.widget.hidden = [0]  # the page unticks run 0
    assert panel.state.hidden == {0} and panel.plots.chart.hidden == [0]
    figure = timeline_tab(panel)
    assert all(t.visible is False for t in figure.data if t.meta["run"] == 0)
    assert all(t.visible is True for t in figure.data if t.meta["run"] == 1)
    run(panel)  # a new run keeps the old one hidden, in the plots and in the table
    assert panel.table.widget.hidden == [0]
    assert panel.plots.chart.hidden == [0]
    assert all(t.visible is False for t in timeline_tab(panel).data if t.meta["run"] == 0)
    panel.table.widget.hidden = []
    assert panel.plots.chart.hidden == []


def test_ddp_gets_one_step_trace_per_rank() -> None:
    panel = make_panel()
    panel.set_config(Config(parallel="ddp", world_size=2))
    run(panel)
    assert sorted({row[0] for row in chart_rows(panel.plots.chart, 0, "step")}) == [0, 1]
    ranks = traces(timeline_tab(panel), 0, "step")
    assert sorted(t.meta["rank"] for t in ranks) == [0, 1]
    assert {t.line.dash for t in ranks} == {"solid", "dot"}
    assert sorted(t.name for t in ranks) == [f"#0 parallel=ddp, world_size=2 rank {rank}" for rank in (0, 1)]


def test_each_gpu_gets_its_own_utilisation_line_and_the_axis_says_nvml() -> None:
    state, plots = PanelState(GPU1), Timeline(GPU1)
    page = ChartPage(plots.chart)
    run = state.begin_run("ddp", ranks=2)
    samples = [replace(sample(0.1 * i, source="nvml"), device=f"cuda:{i % 2}") for i in range(6)]
    state.add_events(run, [], samples[:2])
    plots.stream(state.runs)
    state.add_events(run, [], samples[2:])
    plots.stream(state.runs)
    streamed = page.runs()[0]["util"]
    assert sorted({row[0] for row in streamed}) == ["cuda:0", "cuda:1"] and len(streamed) == 6
    state.finish_run(run, synthetic_result(source="nvml"))
    plots.settle(state.runs)
    assert sorted({row[0] for row in chart_rows(plots.chart, 0, "util")}) == ["cuda:0", "cuda:1"]
    assert plots.chart.utilisation_title == "GPU utilisation % (NVML)"


def test_live_updates_are_batched_to_one_a_second() -> None:
    engine = FakeEngine(pace_s=0.005)  # ~2 events every 5 ms: 400 events/s
    panel = make_panel(engine, steps=600)
    redraws: list[str] = []
    panel.state.subscribe(lambda part: redraws.append(part))
    started = time.monotonic()
    run(panel)
    elapsed = time.monotonic() - started
    events = len(engine.emitted[0])
    pushes = redraws.count("points")  # each one is a frame the page draws
    assert pushes >= elapsed / FLUSH_INTERVAL_S - 2, (pushes, elapsed)  # live: about once a second
    assert pushes <= elapsed / FLUSH_INTERVAL_S + 4, (pushes, elapsed)  # and the phase changes, never per event
    assert pushes < events / 100
    assert redraws.count("status") <= pushes + 8  # the status line changes with the points, in the same frame


def test_long_bursts_keep_each_series_bounded_and_aligned() -> None:
    panel = make_panel(FakeEngine(), steps=4000)
    run(panel)
    measured = chart_rows(panel.plots.chart, 0, "step")
    util = chart_rows(panel.plots.chart, 0, "util")
    assert len(chart_rows(panel.plots.chart, 0, "warmup")) == WARMUP  # a short series is never thinned by a long one
    for rows, x in ((measured, 2), (util, 1)):
        assert 0 < len(rows) <= MAX_TRACE_POINTS
        xs = [row[x] for row in rows]
        assert xs == sorted(xs) and xs[-1] > 3000 * (1 if rows is measured else 0.05)
    assert [row[3] for row in util] == pytest.approx([100 + (row[1] - 0.5) / 0.05 for row in util], abs=1)


@pytest.mark.slow
def test_a_running_burst_sends_only_new_points_a_few_times_a_second_and_nothing_off_screen() -> None:
    """The observer must not cost the measurement: the page gets each point once, about once a second, and nothing
    while it does not show the chart; what it missed follows when it is back."""
    engine = FakeEngine(pace_s=0.005, until_stop=True)
    panel = make_panel(engine, device=GPU1, steps=250)  # a GPU burst leaves cores free: its window is drawn live
    page = ChartPage(panel.plots.chart)
    try:
        panel.run_burst()
        assert engine.started.wait(5)
        time.sleep(3.2)
        with panel.state.lock:
            sent = [m for _, m in page.messages if m["kind"] == "points"]
            assert 2 <= len(sent) <= 3.2 / FLUSH_INTERVAL_S + 3, len(sent)
            rows = [row for m in sent for row in m["steps"]]
            assert len(rows) == len({(row[0], row[2]) for row in rows})  # every step once
        panel.plots.chart.visible = False  # scrolled away
        before = len(page.messages)
        time.sleep(2.2)
        assert len(page.messages) == before
        panel.plots.chart.visible = True  # back: the missed points at once
        with panel.state.lock:
            held = len(page.steps(0)) + len(page.steps(0, warmup=True))
            assert held == len(panel.state.runs[0].steps)
    finally:
        panel.stop()
        panel.wait(10)


def test_a_burst_that_fills_every_core_is_drawn_when_its_window_ends_not_while_it_measures() -> None:
    """A CPU burst uses every core, so the page draws its measured window once, after it: one frame as the window
    starts (the warm-up's points and a line saying why the view waits), none while it measures."""
    engine = FakeEngine(pace_s=0.005)
    panel = make_panel(engine, device=CPU, steps=400)
    page = ChartPage(panel.plots.chart)
    window: list[float] = []
    original = engine.__call__

    def timed(*args, on_event=None, **kwargs):
        def note(event):
            if isinstance(event, StepRecord) and not event.warmup and not window:
                window.append(time.monotonic())
            on_event(event)
        result = original(*args, on_event=note, **kwargs)
        window.append(time.monotonic())
        return result

    panel.controller._engine = timed
    run(panel)
    start, end = window
    assert end - start > 1.5  # long enough for the live view to have sent one a second
    during = [m for t, m in page.messages if start + 0.3 < t < end - 0.3]  # the last step starts "finishing"
    assert during == []
    tickers = [m["ticker"]["text"] for _, m in page.messages if m.get("ticker")]
    assert any("drawn when they end" in text for text in tickers)
    assert len(page.steps(0)) == 400  # all of the window, once it ended


def test_compare_figures_are_built_only_for_the_tab_the_user_opens() -> None:
    panel = make_panel()
    run(panel, "ladder_button")
    assert panel.compare.layout.display is None and panel.compare.selected_index is None
    assert all(not box.children for box in panel.compare.children)  # nothing laid out until a tab is opened
    panel.compare.selected_index = 0
    assert panel.compare.children[0].children and not panel.compare.children[1].children


def test_buttons_while_running_and_only_one_action_at_a_time() -> None:
    engine = FakeEngine(until_stop=True, pace_s=0.01)
    panel = make_panel(engine)
    panel.run_button.click()
    assert engine.started.wait(5)
    assert panel.running
    assert panel.run_button.disabled and panel.ladder_button.disabled and not panel.stop_button.disabled
    with pytest.raises(RuntimeError, match="already running"):
        panel.run_ladder()
    panel.stop_button.click()
    assert panel.wait(timeout=5)
    assert not panel.run_button.disabled and not panel.ladder_button.disabled and panel.stop_button.disabled


def test_stop_sets_the_event_and_the_status_says_stopped() -> None:
    engine = FakeEngine(until_stop=True, pace_s=0.01)
    panel = make_panel(engine)
    panel.run_button.click()
    assert engine.started.wait(5)
    time.sleep(0.3)
    clicked = time.monotonic()
    panel.stop_button.click()
    assert panel.wait(timeout=5)
    assert time.monotonic() - clicked < 1.0
    assert engine.calls[0].kwargs["stop"].is_set()
    assert "stopped" in status(panel)
    assert panel.runs[0].status == "stopped" and table_text(panel.table)[0][-1].startswith("stopped")


def test_a_failing_engine_shows_the_error_and_the_panel_keeps_working() -> None:
    engine = FakeEngine(fail="worker")
    panel = make_panel(engine)
    run(panel)
    assert panel.runs[0].status == "failed"
    assert table_text(panel.table)[0][-1] == "failed: ValueError: deliberate failure at call 3"
    assert "deliberate failure" in status(panel) and "Burst failed" in panel.diagnosis.value
    run(panel)
    assert panel.runs[1].ok and "finished" in status(panel)


def test_an_engine_raising_without_a_result_still_gets_a_failed_row() -> None:
    panel = make_panel(FakeEngine(fail="plain"))
    run(panel)
    assert table_text(panel.table)[0][-1] == "failed: RuntimeError: the fake engine broke"
    run(panel)
    assert [r.status for r in panel.runs] == ["failed", "ok"]


def test_run_ladder_runs_the_classic_rungs_in_order() -> None:
    engine = FakeEngine()
    panel = make_panel(engine)
    run(panel, "ladder_button")
    rungs = classic_ladder(tiny_workload(), CPU)
    assert [c.config for c in engine.calls] == [r.config for r in rungs]
    assert [c.kwargs["label"] for c in engine.calls] == [r.name for r in rungs]
    assert [row[1].split(":")[0] for row in table_text(panel.table)] == ["baseline", *(r.name for r in rungs[1:])]
    assert panel.progress.value == pytest.approx(1.0)


def test_wait_returns_the_run_the_action_finished_last() -> None:
    panel = make_panel(FakeEngine())
    assert panel.wait() is None  # nothing ran yet
    panel.run_burst()
    burst = panel.wait(timeout=30)
    assert burst is panel.runs[-1] and burst.ok and summary(burst).startswith("baseline [tiny] ok")
    panel.run_ladder()
    last_rung = panel.wait(timeout=30)
    assert last_rung is panel.runs[-1] and last_rung.label == classic_ladder(tiny_workload(), CPU)[-1].name

    slow = make_panel(FakeEngine(until_stop=True, pace_s=0.01))
    slow.run_burst()
    assert slow.wait(timeout=0.2) is None and slow.running  # the timeout passed first
    slow.stop()
    stopped = slow.wait(timeout=5)
    assert stopped is slow.runs[-1] and stopped.status == "stopped"


def test_stop_during_a_ladder_skips_the_remaining_rungs() -> None:
    engine = FakeEngine(until_stop=True, pace_s=0.01)
    panel = make_panel(engine)
    panel.ladder_button.click()
    assert engine.started.wait(5)
    panel.stop()
    assert panel.wait(timeout=5)
    assert len(engine.calls) == 1 and "Ladder stopped" in status(panel)


# -- display ---------------------------------------------------------------------------------------------
def test_the_panel_displays_as_its_root_widget_with_the_figure_state_current() -> None:
    panel = make_panel()
    run(panel)
    bundle = panel._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == panel.root.model_id
    # A page loaded now (a reload) draws the finished run from the chart's synced state alone.
    synced = panel.plots.chart.get_state()["runs"]
    assert [r["run"] for r in synced] == [0] and len(synced[0]["steps"]) == len(panel.state.runs[0].steps)


def test_the_live_figure_is_an_anywidget_which_plotly_does_not_install() -> None:
    """Why pyproject names anywidget: plotly's FigureWidget is an AnyWidget, and plotly lists anywidget only in
    its dev extras."""
    import importlib.metadata

    import anywidget

    panel = make_panel()
    run(panel)
    assert isinstance(timeline_tab(panel), anywidget.AnyWidget) and isinstance(panel.plots.chart, anywidget.AnyWidget)
    plotly_needs = importlib.metadata.requires("plotly") or []
    assert not [r for r in plotly_needs if r.startswith("anywidget") and "extra ==" not in r]


def test_importing_the_package_does_not_import_the_ui() -> None:
    code = ("import sys, accel_widgets as aw; assert 'ipywidgets' not in sys.modules and 'plotly' not in sys.modules; "
            "assert aw.TuningPanel.__name__ == 'TuningPanel'; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


# -- the real engine -------------------------------------------------------------------------------------
def test_a_real_short_burst_fills_the_panel() -> None:
    panel = TuningPanel(tiny_workload(), steps=5)
    run(panel)
    (result,) = panel.runs
    assert result.ok, result.error
    assert len(chart_rows(panel.plots.chart, 0, "step")) == 5
    # A real burst on a shared machine can be unreliable (other load): then the table says so, not "ok".
    assert table_text(panel.table)[0][-1] == ("ok" if reliability(result).reliable else "⚠ unreliable")
    assert "finished" in status(panel)


def test_stopping_a_real_burst_takes_under_a_second() -> None:
    panel = TuningPanel(tiny_workload(), steps=5)
    panel.length_unit.value = "seconds"
    panel.length_value.value = 60
    panel.run_button.click()
    page = ChartPage(panel.plots.chart)
    deadline = time.monotonic() + 60
    while not page.steps(0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert page.steps(0), "no measured step reached the live chart"
    clicked = time.monotonic()
    panel.stop_button.click()
    assert panel.wait(timeout=10)
    assert time.monotonic() - clicked < 1.0
    assert panel.runs[0].status == "stopped" and "stopped" in status(panel)
