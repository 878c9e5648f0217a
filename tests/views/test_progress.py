"""Live progress: the state a burst's events drive, its plain and live terminal lines, and the CLI showing them."""

from __future__ import annotations

import functools
import io
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

import accel_widgets.search.ladder
from accel_widgets import Config
from accel_widgets.cli import main
from accel_widgets.engine.launcher import Engine
from accel_widgets.results.burst import BurstPhase, BurstResult, RankSummary, StepRecord, TelemetrySample
from accel_widgets.views.progress import PHASES, BurstProgress, ProgressSeries, ProgressView


def step(step: int, t: float, *, warmup: bool = False, rank: int = 0) -> StepRecord:
    return StepRecord(rank=rank, step=step, t=t, data_s=0.0, h2d_s=0.0, compute_s=0.1, total_s=0.1, samples=32,
                      warmup=warmup)


def telemetry(t: float) -> TelemetrySample:
    return TelemetrySample(t=t, source="psutil", util_pct=50.0, mem_used_bytes=0)


def test_a_compiled_burst_goes_through_every_phase_from_its_events() -> None:
    progress = BurstProgress.for_burst(Config(compile_mode="default"), steps=4)
    script: list[tuple[object, str, bool]] = [
        (telemetry(0.1), "starting", False),
        (BurstPhase(0.2, 0, "setup"), "setting up", True),
        (BurstPhase(0.3, 1, "step"), "setting up", False),  # rank 1 does not count
        (BurstPhase(0.9, 0, "step"), "compiling", True),
        (BurstPhase(1.0, 0, "step"), "compiling", False),  # a repeat changes nothing
        (telemetry(20.0), "compiling", False),
        (step(0, 30.0, warmup=True), "warming up", True),
        (step(1, 30.1, warmup=True), "warming up", False),
        (step(2, 30.2, warmup=True), "warming up", False),
        (step(3, 30.3), "measuring", True),
        (step(3, 30.3, rank=1), "measuring", False),
        (step(4, 30.4), "measuring", False),
        (step(5, 30.5), "measuring", False),
    ]
    for event, phase, changed in script:
        assert progress.update(event) is changed, event
        assert progress.phase == phase, event
    view = progress.view(31.0)
    assert (view.done, view.target, view.unit, view.fraction) == (3, 4, "steps", 0.75)
    assert view.text() == "measuring 3/4 steps · 31.0 s"
    assert progress.update(step(6, 30.6)) and progress.phase == "finishing"  # the last measured step
    assert progress.view(31.2).fraction == 1.0
    assert not progress.update(BurstPhase(30.7, 0, "finishing"))
    assert (progress.warmup_steps, progress.measured_steps) == (3, 4)


def test_step_records_alone_give_the_phases_until_the_launcher_sends_phase_events() -> None:
    progress = BurstProgress.for_burst(Config(), steps=2)
    phases = []
    for event in (telemetry(0.5), step(0, 1.0, warmup=True), step(1, 1.1, warmup=True), step(2, 1.2), step(3, 1.3)):
        progress.update(event)
        phases.append(progress.phase)
    assert phases == ["starting", "warming up", "warming up", "measuring", "finishing"]


def test_an_eager_burst_is_warming_up_not_compiling_in_its_first_step() -> None:
    progress = BurstProgress.for_burst(Config(), steps=2)
    progress.update(BurstPhase(0.5, 0, "step"))
    assert progress.phase == "warming up"


def test_a_burst_bounded_by_seconds_counts_the_measured_window_on_the_burst_clock() -> None:
    progress = BurstProgress.for_burst(Config(), seconds=2.0)
    for event in (step(0, 1.0, warmup=True), step(1, 1.5, warmup=True), step(2, 2.0), step(3, 2.5)):
        progress.update(event)
    view = progress.view(3.0)
    assert (view.phase, view.done, view.target, view.unit, view.fraction) == ("measuring", 1.0, 2.0, "s", 0.5)
    assert view.text() == "measuring 1.0/2 s · 3.0 s"
    progress.update(BurstPhase(4.0, 0, "finishing"))  # the window's last records may still be on their way
    assert (progress.phase, progress.view(4.0).fraction) == ("finishing", 1.0)


def test_the_phase_never_moves_back_when_a_phase_event_arrives_late() -> None:
    progress = BurstProgress.for_burst(Config(compile_mode="default"), steps=5)
    progress.update(step(0, 1.0, warmup=True))
    assert not progress.update(BurstPhase(0.5, 0, "setup"))
    assert progress.phase == "warming up"


def test_the_default_length_is_run_bursts_and_a_view_before_measuring_shows_no_progress() -> None:
    progress = BurstProgress.for_burst(Config())
    view = progress.view(0.25)
    assert (progress.steps, view.fraction, view.text()) == (40, 0.0, "starting · 0.2 s")
    assert ProgressView("starting", 0.0, 0.0, 0.0, "s").fraction == 0.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_without_a_terminal_each_phase_change_is_one_plain_line_plus_a_heartbeat() -> None:
    out, clock = io.StringIO(), FakeClock()
    series = ProgressSeries("rung", 3, steps=2, stream=out, heartbeat_s=10.0, clock=clock)
    series.begin("+compile", Config(compile_mode="default"))
    clock.now += 1.0
    series.on_event(BurstPhase(1.0, 0, "step"))
    for seconds in range(1, 25):  # a 24-second compile, telemetry ten times a second
        for tenth in range(10):
            clock.now = 101.0 + seconds + tenth / 10
            series.on_event(telemetry(clock.now - 100.0))
    clock.now = 126.0
    for event in (step(0, 26.0, warmup=True), step(1, 26.1), step(2, 26.2)):
        series.on_event(event)
    series.end()
    assert out.getvalue().splitlines() == [
        "  rung 1/3 +compile · starting · 0.0 s",
        "  rung 1/3 +compile · compiling · 1.0 s",
        "  rung 1/3 +compile · compiling · 11.0 s",
        "  rung 1/3 +compile · compiling · 21.0 s",
        "  rung 1/3 +compile · warming up · 26.0 s",
        "  rung 1/3 +compile · measuring 1/2 steps · 26.0 s",
        "  rung 1/3 +compile · finishing · 26.0 s",
    ]


class Terminal(io.StringIO):
    """A stream that says it is a terminal, so rich draws a live line on it."""

    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_live_line_is_redrawn_at_most_four_times_a_second_and_erased_at_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TTY_INTERACTIVE", "TTY_COMPATIBLE", "NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    out, clock = Terminal(), FakeClock()
    series = ProgressSeries("burst", 2, steps=1000, stream=out, clock=clock)
    series.begin("num_workers=2", Config(num_workers=2))
    series.on_event(step(0, 0.5, warmup=True))
    for i in range(1, 1001):  # a thousand measured steps over two seconds
        clock.now = 100.5 + i * 0.002
        series.on_event(step(i, clock.now - 100.0))
    series.end()
    text = out.getvalue()
    assert "\x1b[" in text  # drawn in place with control codes
    assert "burst 1/2 num_workers=2 · measuring 126/1000 steps · 0.8 s" in text
    redraws = text.count("· measuring ")
    assert 8 <= redraws <= 10  # 2 s at 4 Hz, plus the change into measuring
    assert "· finishing · 2.5 s" in text
    assert text.endswith("\x1b[1A\x1b[2K")  # the line is erased: the result line takes its place


def fake_ladder_engine(record: list[str]) -> Engine:
    """A run_burst stand-in that emits a warm-up and two measured steps, then returns an ok result: the n-th rung
    (its repeats too) runs at n x 100 samples/s, steadily."""
    def engine(workload: object, config: Config, *, label: str, on_event: Callable[[object], None] | None,
               steps: int, **_: object) -> BurstResult:
        record.append(label)
        for event in (BurstPhase(0.0, 0, "setup"), step(0, 0.1, warmup=True), step(1, 0.2), step(2, 0.3)):
            if on_event is not None:
                on_event(event)
        rungs = list(dict.fromkeys(name.split(" · ")[0] for name in record))
        rate = 100.0 * (rungs.index(label.split(" · ")[0]) + 1)
        return BurstResult(workload="wl", config=config, status="ok", label=label, steps=[step(1, 0.2), step(2, 0.3)],
                           ranks=[RankSummary(0, int(rate), 1.0, 0, "rss", 0.0, 0.1, "cpu")])
    return engine


def test_the_demo_shows_a_progress_line_per_rung_then_its_result(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    ran: list[str] = []
    monkeypatch.setattr(accel_widgets.cli, "run_ladder",
                        functools.partial(accel_widgets.search.ladder.run_ladder, engine=fake_ladder_engine(ran)))
    code = main(["demo", "--workloads", "mlp", "--no-compile", "--steps", "2", "--budget", "10",
                 "--report", f"{tmp_path}/r.html"])
    out = capsys.readouterr().out.splitlines()
    rungs = len(dict.fromkeys(label for label in ran if "repeat" not in label))
    assert code == 0 and rungs >= 3 and len(ran) > rungs  # each rung's burst, then the repeats of the comparison
    first = out.index(f"  rung 1/{rungs} baseline · starting · 0.0 s")
    lines = out[first:first + 6]
    assert [line.split(" · ")[1] for line in lines[:5]] == ["starting", "setting up", "warming up",
                                                            "measuring 1/2 steps", "finishing"]
    assert lines[5].startswith("  baseline") and "samples/s" in lines[5]
    assert out[first + 6].startswith(f"  rung 2/{rungs} +loader · starting")
    assert out[first + 11].startswith("  +loader") and "2.00x" in out[first + 11]  # one burst against the baseline
    assert f"  comparing the {rungs} rungs, interleaved, for up to 10 s ..." in out
    assert any(line.startswith("  +loader    vs previous:") for line in out)  # the ladder read by its comparisons


def test_a_real_burst_through_the_cli_shows_its_phases_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--demo", "mlp", "--steps", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("baseline [mlp-small] ok")  # progress goes to stderr, stdout keeps the results
    lines = [line.removeprefix("  baseline · ") for line in captured.err.splitlines()
             if line.startswith("  baseline · ")]
    phases = [next(phase for phase in PHASES if line.startswith(phase)) for line in lines]
    seen = [phase for phase, _ in itertools.groupby(phases)]
    assert seen[0] == "starting" and seen[-1] == "finishing" and "measuring" in seen
    assert seen == sorted(seen, key=PHASES.index)
    assert "\x1b" not in captured.err
