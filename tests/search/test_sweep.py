"""``aw.sweep``: the grid, its checks before any burst, every point against the base by the comparison engine (on the
scripted machine, tests/search/machines.py), failures kept, stop, the budget, the table, summary and figures."""

from __future__ import annotations

import math
import re
import threading
from typing import Any

import pytest

import accel_widgets as aw
from accel_widgets import BurstRequestError, Config, ConfigError, KnobValueError
from accel_widgets.results.burst import BurstResult
from accel_widgets.results.sweep import SweepPoint, SweepResult
from accel_widgets.search.compare import DEFAULT_MIN_EFFECT
from accel_widgets.search.sweep import grid_points
from accel_widgets.views.figures import sweep_figure
from accel_widgets.views.text import point_text, summary
from tests.search.machines import Machine, noisy
from tests.workloads import tiny_workload

WORKLOAD = tiny_workload()
COLUMNS = ["samples_per_s", "speedup", "speedup_low", "speedup_high", "verdict", "step_ms_median", "step_ms_iqr",
           "runs", "status", "error"]


def by_workers(config: Config, call: int) -> float:
    """1000 samples/s per loader worker plus one, doubled with pinned memory; 0.5% noise."""
    return 1000 * (1 + config.num_workers) * (2 if config.pin_memory else 1) * math.exp(
        0.005 * math.sin(call * 12.9898))


def sweep(machine: Machine, grid: dict[str, list[Any]], **kwargs: Any) -> aw.SweepResult:
    kwargs.setdefault("progress", False)
    kwargs.setdefault("budget_s", 200.0)
    return aw.sweep(WORKLOAD, grid, engine=machine, clock=machine.clock, steps=10, **kwargs)


def test_the_grid_is_the_cartesian_product_on_the_base_config() -> None:
    points = grid_points({"batch_size": [16, 32], "num_workers": [0, 2, 4]}, Config(precision="bf16"))
    assert [p.values for p in points] == [
        {"batch_size": b, "num_workers": n} for b in (16, 32) for n in (0, 2, 4)]
    assert points[4].config == Config(precision="bf16", batch_size=32, num_workers=2)
    assert points[4].label == "batch_size=32, num_workers=2"


@pytest.mark.parametrize(("grid", "base", "kwargs", "error", "message"), [
    ({"num_wrkers": [0, 2]}, None, {}, KnobValueError, "unknown knob 'num_wrkers' (did you mean 'num_workers'?)"),
    ({"num_workers": [0, -1]}, None, {}, KnobValueError, "sweep point num_workers=-1: "),
    ({"num_workers": []}, None, {}, KnobValueError, "sweep grid 'num_workers': give a non-empty list of values"),
    ({"precision": "bf16"}, None, {}, KnobValueError, "sweep grid 'precision': give a non-empty list of values"),
    ({}, None, {}, KnobValueError, "the grid is empty"),
    ({"compile_mode": ["default", "max-autotune"]}, Config(deterministic=True), {}, ConfigError,
     "sweep point compile_mode='max-autotune': compile_mode='max-autotune' picks kernels by timing"),
    ({"num_workers": [0]}, None, {"steps": 0}, BurstRequestError, "steps=0 is invalid"),
    ({"num_workers": [0]}, None, {"budget_s": 0}, ValueError, "budget_s=0 is invalid"),
    ({"num_workers": [0]}, None, {"min_effect": 1.5}, ValueError, "min_effect=1.5 is invalid"),
])
def test_a_bad_grid_fails_before_any_burst(grid: dict[str, Any], base: Config | None, kwargs: dict[str, Any],
                                          error: type[Exception], message: str) -> None:
    machine = Machine(by_workers)
    with pytest.raises(error) as info:
        aw.sweep(WORKLOAD, grid, base=base, engine=machine, progress=False, **kwargs)
    assert message in str(info.value)
    assert machine.calls == []


def test_every_point_is_measured_against_the_base_by_the_comparison_engine() -> None:
    """The base (the plain config) is no point of this grid: it is measured as a config of its own, first."""
    machine = Machine(by_workers)
    result = sweep(machine, {"num_workers": [1, 2]})
    assert [r.config for r in result.results] == [Config(), Config(num_workers=1), Config(num_workers=2)]
    assert [r.label for r in result.results] == ["base", "num_workers=1", "num_workers=2"]
    for point, true in zip(result.points, (2.0, 3.0), strict=True):
        comparison = point.comparison
        assert comparison is not None and comparison.verdict == "faster"
        assert comparison.reference == Config() and comparison.subject == point.config
        assert comparison.min_effect == DEFAULT_MIN_EFFECT
        assert result.speedup(point) == comparison.ratio == pytest.approx(true, rel=0.01)
        assert point.results[1:] == comparison.subject_windows and point.results[0] is result.results[
            result.points.index(point) + 1] is comparison.firsts[1]
    frame = result.frame()
    assert list(frame.columns) == ["num_workers", *COLUMNS]
    assert frame["verdict"].tolist() == ["faster", "faster"]
    assert (frame["speedup_low"] < frame["speedup"]).all() and (frame["speedup"] < frame["speedup_high"]).all()
    assert frame["speedup"].tolist() == pytest.approx([2.0, 3.0], rel=0.01)
    assert frame["samples_per_s"].tolist() == pytest.approx([2000, 3000], rel=0.01)  # medians over the windows
    assert frame["runs"].tolist() == [len(p.results) for p in result.points] and min(frame["runs"]) >= 8
    assert frame["status"].tolist() == ["ok", "ok"] and not result.stopped


def test_a_point_whose_config_is_the_base_is_the_reference() -> None:
    machine = Machine(by_workers)
    result = sweep(machine, {"num_workers": [0, 2]})
    assert [r.label for r in result.results] == ["num_workers=0", "num_workers=2"]  # no separate base
    base, two = result.points
    assert base.comparison is None and two.comparison is not None
    assert two.comparison.reference == base.config == Config()
    assert base.results[1:] == two.comparison.reference_windows and base.results[0] is result.results[0]
    frame = result.frame()
    assert frame["verdict"].tolist() == ["base", "faster"] and frame["speedup"].tolist()[0] == 1.0
    assert math.isnan(frame["speedup_low"][0]) and frame["speedup"][1] == pytest.approx(3.0, rel=0.01)


def test_the_points_are_interleaved_so_a_drift_of_the_machine_cancels() -> None:
    """The machine slows 3% a window and num_workers=2 is truly 1.5x: every block reads exactly 1.5x."""
    machine = Machine(lambda config, call: 1000 * (1.5 if config.num_workers == 2 else 1.0) * 0.97 ** call)
    result = sweep(machine, {"num_workers": [0, 2]})
    assert [config.num_workers for config, _ in machine.calls[:4]] == [0, 2, 2, 0]
    comparison = result.points[1].comparison
    assert comparison is not None and comparison.verdict == "faster"
    assert comparison.log_ratios == pytest.approx([math.log(1.5)] * len(comparison.counted))


def test_a_point_within_noise_reads_same_and_a_noisy_one_undecided_when_the_budget_runs_out() -> None:
    result = sweep(Machine(noisy({}, sd=0.005)), {"pin_memory": [False, True]})
    assert result.frame()["verdict"].tolist() == ["base", "same"]
    assert re.fullmatch(r"same within ±[1-5]%", point_text(result, result.points[1]))

    machine = Machine(noisy({Config(pin_memory=True): 1.03}, sd=0.15))
    result = sweep(machine, {"pin_memory": [False, True]}, budget_s=40.0)
    point = result.points[1]
    assert point.comparison is not None and point.comparison.stopped.startswith("budget")
    assert result.frame()["verdict"].tolist() == ["base", "undecided"]
    assert point_text(result, point).startswith(f"undecided after {len(point.comparison.counted)} blocks: ")


@pytest.mark.parametrize("budget", [10.0, 30.0, 90.0])
def test_the_budget_is_honoured_within_ten_percent_after_the_first_bursts(budget: float) -> None:
    machine = Machine(noisy({Config(num_workers=1): 1.02}, sd=0.1))
    seen: list[float] = []
    result = sweep(machine, {"num_workers": [0, 1, 2]}, budget_s=budget,
                   on_point=lambda point, first: seen.append(machine.now))
    assert machine.now - seen[-1] <= budget * 1.1
    assert result.points[1].comparison is not None and result.points[1].comparison.stopped.startswith("budget")


def test_a_failing_point_is_kept_with_its_error_and_the_sweep_goes_on() -> None:
    machine = Machine(by_workers, fail={2})  # num_workers=1's first burst
    seen: list[tuple[str, str]] = []
    result = sweep(machine, {"num_workers": [0, 1, 2]},
                   on_point=lambda point, first: seen.append((point.label, first.status)))
    assert seen == [("num_workers=0", "ok"), ("num_workers=1", "failed"), ("num_workers=2", "ok")]
    frame = result.frame()
    assert frame["status"].tolist() == ["ok", "failed", "ok"]
    assert frame["error"].tolist() == ["", "RuntimeError: boom", ""]
    assert frame["samples_per_s"].isna().tolist() == [False, True, False]
    assert [result.verdict(p) for p in result.points] == ["base", None, "faster"]
    assert point_text(result, result.points[1]) == "failed: RuntimeError: boom"
    assert frame["speedup"].tolist()[2] == pytest.approx(3.0, rel=0.01)


def test_a_stop_ends_the_sweep_and_the_points_left_read_not_run() -> None:
    stop = threading.Event()
    machine = Machine(by_workers)
    result = sweep(machine, {"num_workers": [0, 1, 2]}, stop=stop, on_point=lambda point, first: stop.set())
    assert len(machine.calls) == 1 and result.stopped
    assert [p.status for p in result.points] == ["ok", "not run", "not run"]
    assert all(p.comparison is None for p in result.points)
    assert point_text(result, result.points[1]) == "not run"


def test_with_progress_each_first_burst_ends_in_its_result_line_and_the_verdicts_follow(
        capsys: pytest.CaptureFixture[str]) -> None:
    sweep(Machine(by_workers), {"num_workers": [0, 1]}, progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "  burst 1/2 num_workers=0 · starting · 0.0 s"
    assert lines[1].startswith("  num_workers=0") and "samples/s      -" in lines[1]  # no lone ratio
    assert lines[2] == "  burst 2/2 num_workers=1 · starting · 0.0 s"
    assert lines[3].startswith("  num_workers=1")
    assert lines[4].startswith("  num_workers=0: ") and lines[4].endswith(", base")
    assert re.fullmatch(r"  num_workers=1: [\d,.]+ samples/s, faster: 2\.\d\d× \[\d\.\d\d–\d\.\d\d\]", lines[5])


def test_the_summary_says_what_each_point_measured_against_the_base() -> None:
    result = sweep(Machine(by_workers), {"num_workers": [1]})
    head, line = summary(result).splitlines()
    assert head == "sweep of num_workers on tiny against baseline, 1 points"
    assert re.fullmatch(r"  num_workers=1: [\d,.]+ samples/s, faster: 2\.\d\d× \[\d\.\d\d–\d\.\d\d\]", line)


def test_one_knob_is_a_line_with_the_interval_as_whiskers_two_a_heatmap_more_parallel_coordinates() -> None:
    line = sweep_figure(sweep(Machine(by_workers), {"num_workers": [0, 1]}), "speedup")
    (trace,) = line.data
    assert trace.type == "scatter" and list(trace.x) == ["0", "1"] and trace.y[0] == 1.0
    assert trace.y[1] == pytest.approx(2.0, rel=0.01)
    assert trace.error_y.array[0] is None and 0 < trace.error_y.array[1] < 0.5 and trace.error_y.arrayminus[1] > 0
    assert trace.hovertext[0] == "num_workers=0: base" and trace.hovertext[1].startswith("num_workers=1: faster: 2.")

    two = sweep(Machine(by_workers), {"num_workers": [0, 1, 2], "pin_memory": [False, True]})
    heatmap = sweep_figure(two, "speedup")
    assert heatmap.data[0].type == "heatmap"
    z = [value for row in heatmap.data[0].z for value in row]
    assert z[0] == 1.0 and z == pytest.approx([1.0, 2.0, 2.0, 4.0, 3.0, 6.0], rel=0.02)
    assert list(heatmap.data[0].y) == ["0", "1", "2"] and list(heatmap.data[0].x) == ["False", "True"]
    text = [list(row) for row in heatmap.data[0].text]
    assert text[0][0] == "base" and re.fullmatch(r"2\.\d\d×<br>\[\d\.\d\d–\d\.\d\d\]", text[0][1])
    assert heatmap.data[0].customdata[0][1].startswith("num_workers=0, pin_memory=True: faster: 2.")

    grid = {"num_workers": [0, 1], "pin_memory": [False, True], "precision": ["fp32", "bf16"]}
    parallel = sweep_figure(sweep(Machine(by_workers), grid))
    assert parallel.data[0].type == "parcoords"
    workers, pinned, precision, metric = parallel.data[0].dimensions
    assert list(workers.values) == [0, 0, 0, 0, 1, 1, 1, 1] and workers.tickvals is None
    assert list(pinned.ticktext) == ["False", "True"] and list(pinned.values) == [0, 0, 1, 1, 0, 0, 1, 1]
    assert list(precision.ticktext) == ["fp32", "bf16"] and list(precision.tickvals) == [0, 1]
    assert metric.label == "samples/s" and list(metric.values)[:3] == pytest.approx([1000, 1000, 2000], rel=0.01)


def test_a_point_that_did_not_finish_leaves_its_cell_blank() -> None:
    result = SweepResult("tiny", ["num_workers", "pin_memory"],
                         [SweepPoint({"num_workers": 0, "pin_memory": False}, Config(num_workers=0, pin_memory=False))],
                         [], Config(num_workers=4), 60.0)
    assert [list(row) for row in sweep_figure(result).data[0].z] == [[None]]
    assert [list(row) for row in sweep_figure(result, "speedup").data[0].text] == [["–"]]
    with pytest.raises(ValueError, match="metric='mfu' is invalid"):
        sweep_figure(result, "mfu")  # type: ignore[arg-type]


def test_a_small_real_sweep() -> None:
    """Two points on held ranks, the first the base: first bursts of 3 steps, then what a 3 s budget allows."""
    result = aw.sweep(WORKLOAD, {"batch_size": [16, 32]}, base=Config(batch_size=16), steps=3, budget_s=3.0,
                      progress=False)
    frame = result.frame()
    assert frame["batch_size"].tolist() == [16, 32] and frame["status"].tolist() == ["ok", "ok"]
    assert (frame["samples_per_s"] > 0).all() and frame["speedup"].tolist()[0] == 1.0
    assert frame["verdict"].tolist()[0] == "base"
    assert [r.config.batch_size for r in result.results] == [16, 32]
    assert all(isinstance(r, BurstResult) and len(r.measured_steps()) == 3 for r in result.results)
    comparison = result.points[1].comparison
    assert comparison is not None and not comparison.error and result.results[1] in comparison.firsts
