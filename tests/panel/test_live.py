"""Live mode, at the state level: every edit stops the burst in flight and, once the knobs are still, runs
the new settings; the newest live run replaces the previous one in the plots and the table; pinned runs stay.

A fake engine stands in for the workers (tests/panel/fakes.py); the real-browser test clicks Live once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from accel_widgets import Config
from accel_widgets.panel import TuningPanel
from accel_widgets.panel.controller import LIVE_DELAY_S
from accel_widgets.results.history import RunHistory
from tests.devices import cpu_device
from tests.panel.fakes import CPU, FakeEngine
from tests.panel.reading import ChartPage
from tests.workloads import tiny_workload


def make_panel(engine: FakeEngine, **kwargs) -> TuningPanel:
    kwargs.setdefault("history", False)
    return TuningPanel(tiny_workload(), engine=engine, device=CPU, steps=5, compare=False, **kwargs)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_live_runs_the_settings_after_the_knobs_are_still_and_replaces_the_previous_live_run() -> None:
    engine = FakeEngine(until_stop=True, pace_s=0.01)
    panel = make_panel(engine)
    page = ChartPage(panel.plots.chart)
    try:
        turned_on = time.monotonic()
        panel.live_button.value = True  # the toggle, as a click sets it
        wait_for(lambda: len(engine.calls) == 1)
        assert time.monotonic() - turned_on >= LIVE_DELAY_S * 0.9
        wait_for(lambda: len(panel.state.runs[0].steps) > 3)
        # Three quick edits while the first live burst runs: it stops, and one burst of the last edit follows.
        for workers in (1, 2, 3):
            panel.set_config(Config(num_workers=workers))
            time.sleep(LIVE_DELAY_S / 5)
        wait_for(lambda: len(engine.calls) == 2)
        assert engine.calls[0].kwargs["stop"].is_set()
        assert engine.calls[1].config == Config(num_workers=3)
        wait_for(lambda: len(panel.state.runs[0].steps) > 3 and panel.state.runs[0].name.endswith("num_workers=3"))
        assert len(panel.state.runs) == 1 and panel.state.runs[0].live
        assert panel.state.results == []  # the replaced run left the table; the new one is still running
        # The live chart holds the new run's points only: the replaced run's were taken out.
        wait_for(lambda: len(page.steps(0)) > 0)
        with panel.state.lock:
            assert 0 < len(page.steps(0)) <= len([s for s in panel.state.runs[0].steps if not s.warmup])
        assert {"kind": "forget", "run": 0} in [message for _, message in page.messages]
    finally:
        panel.close()
    assert len(engine.calls) == 2 and not panel.running and panel.state.results[0].status == "stopped"


def test_a_pinned_live_run_stays_and_the_next_edit_adds_a_run() -> None:
    engine = FakeEngine()
    panel = make_panel(engine)
    try:
        panel.live = True
        wait_for(lambda: len(engine.calls) == 1 and not panel.running and panel.state.results)
        assert panel.state.live_run == 0 and not panel.pin_button.disabled
        panel.pin_button.click()
        assert panel.state.live_run is None and panel.pin_button.disabled
        panel.set_config(Config(batch_size=16))
        wait_for(lambda: len(engine.calls) == 2 and not panel.running and len(panel.state.results) == 2)
        assert [r.config for r in panel.state.results] == [Config(), Config(batch_size=16)]
        # A live run with an ordinary run after it stays as well.
        panel.live = False
        panel.set_config(Config(batch_size=8))
        time.sleep(LIVE_DELAY_S * 2)
        assert len(engine.calls) == 2  # live is off: an edit runs nothing
        panel.run_burst()
        panel.wait(10)
        panel.live = True
        wait_for(lambda: len(engine.calls) == 4 and not panel.running and len(panel.state.results) == 4)
        assert [r.config.batch_size for r in panel.state.results] == [None, 16, 8, 8]
    finally:
        panel.close()


def test_an_edit_that_cannot_run_waits_and_live_off_cancels_the_countdown() -> None:
    engine = FakeEngine()
    panel = make_panel(engine)
    try:
        panel.state.edit("memory_fraction", "2.5")  # out of range: nothing can run
        panel.live = True
        wait_for(lambda: "Live: waiting for settings that can run" in panel.state.status)
        assert engine.calls == []
        panel.state.edit("memory_fraction", "")
        panel.live = False  # within the countdown: it is cancelled
        time.sleep(LIVE_DELAY_S * 2)
        assert engine.calls == [] and not panel.live_button.value
    finally:
        panel.close()


def test_live_runs_are_recorded_unless_the_next_edit_stopped_them(tmp_path: Path) -> None:
    history = RunHistory(tmp_path / "runs.sqlite")
    engine = FakeEngine(until_stop=True, pace_s=0.01)
    panel = make_panel(engine, history=history)
    try:
        panel.live = True
        wait_for(lambda: len(engine.calls) == 1)
        panel.set_config(Config(num_workers=2))  # stops the first live burst
        wait_for(lambda: len(engine.calls) == 2)
        engine.until_stop = False  # the second ends by itself
        wait_for(lambda: not panel.running and len(panel.state.results) == 1)
    finally:
        panel.close()
    recorded = history.runs()
    assert [run.result.config for run in recorded] == [Config(num_workers=2)]  # the stopped one is not there
    assert recorded[0].result.status == "ok"



def test_live_with_real_workers_stops_each_burst_at_the_next_edit_and_leaves_nothing() -> None:
    """Edits faster than bursts end, with the real engine: every replaced burst is stopped in its workers,
    the last settings run to their end, and the leak checks (conftest) find no process, thread or file."""
    from accel_widgets import run_burst

    panel = TuningPanel(tiny_workload(), engine=run_burst, device=cpu_device(), steps=5, history=False)
    try:
        panel.length_unit.value, panel.length_value.value = "seconds", 30  # far longer than the test waits
        panel.live = True
        wait_for(lambda: panel.running and panel.state.runs and panel.state.runs[-1].steps, timeout=30)
        for workers in (1, 0, 2):
            panel.set_config(Config(num_workers=workers))
            time.sleep(LIVE_DELAY_S * 1.5)  # past the countdown: each edit stops a running burst
        wait_for(lambda: panel.running and panel.state.runs[-1].steps and "num_workers=2" in panel.state.runs[-1].name,
                 timeout=30)
        assert len(panel.state.runs) == 1  # every live run took the same place
    finally:
        panel.close()
    result = panel.state.results[-1]
    assert result.config == Config(num_workers=2) and result.status == "stopped" and result.steps
