"""``aw.sweep``: the grid, its checks before any burst, interleaved repeats, failures kept, the table and figures."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import accel_widgets as aw
from accel_widgets import BurstError, BurstRequestError, Config, ConfigError, KnobValueError
from accel_widgets.results.burst import BurstResult, ErrorInfo, RankSummary, StepRecord
from accel_widgets.search.sweep import SweepPoint, SweepResult, grid_points
from tests.measured import as_measured
from tests.workloads import tiny_workload

WORKLOAD = tiny_workload()


def crafted(config: Config, label: str, *, rate: float, step_ms: list[float]) -> BurstResult:
    """An ok result measuring ``rate`` samples/s (one rank, 1 s window) and the given step times."""
    steps = [StepRecord(0, i, 0.1 * i, 0.0, 0.0, ms / 1e3, ms / 1e3, 32) for i, ms in enumerate(step_ms)]
    return as_measured(BurstResult(workload="tiny", config=config, status="ok", label=label, steps=steps,
                       ranks=[RankSummary(0, int(rate), 1.0, 0, "rss", 0.0, 0.1, "cpu")]))


class FakeEngine:
    """Stands in for run_burst: records each call; ``rates`` maps a config to its samples/s (or an error)."""

    def __init__(self, rate: Callable[[Config], float | str]) -> None:
        self.rate, self.calls = rate, []

    def __call__(self, workload: Any, config: Config, *, steps: int | None, seconds: float | None, label: str,
                 stop: threading.Event | None, on_event: Callable[[object], None] | None) -> BurstResult:
        self.calls.append(label)
        rate = self.rate(config)
        if isinstance(rate, str):
            failed = BurstResult(workload="tiny", config=config, status="failed", label=label,
                                 error=ErrorInfo("oom", f"{rate}\nsecond line", rank=0))
            raise BurstError(rate, failed)
        count = len([c for c in self.calls if c == label])
        return crafted(config, label, rate=rate, step_ms=[10.0 * count, 20.0 * count, 30.0 * count])


def by_batch(config: Config) -> float:
    return float(config.batch_size * 10 + config.num_workers)


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
    ({"num_workers": [0]}, None, {"repeats": 0}, ValueError, "repeats=0 is invalid"),
])
def test_a_bad_grid_fails_before_any_burst(grid: dict[str, Any], base: Config | None, kwargs: dict[str, Any],
                                          error: type[Exception], message: str) -> None:
    engine = FakeEngine(by_batch)
    with pytest.raises(error) as info:
        aw.sweep(WORKLOAD, grid, base=base, engine=engine, progress=False, **kwargs)
    assert message in str(info.value)
    assert engine.calls == []


@pytest.mark.parametrize(("interleave", "order"), [
    (False, ["num_workers=0", "num_workers=0", "num_workers=2", "num_workers=2", "num_workers=4", "num_workers=4"]),
    (True, ["num_workers=0", "num_workers=2", "num_workers=4", "num_workers=0", "num_workers=2", "num_workers=4"]),
])
def test_interleaved_repeats_run_round_by_round(interleave: bool, order: list[str]) -> None:
    engine = FakeEngine(lambda c: 100.0)
    result = aw.sweep(WORKLOAD, {"num_workers": [0, 2, 4]}, base=Config(batch_size=16), repeats=2,
                      interleave=interleave, engine=engine, progress=False)
    assert engine.calls == order
    assert [r.label for r in result.results] == order
    assert [len(p.results) for p in result.points] == [2, 2, 2]


def test_a_failing_point_is_kept_with_its_error_and_the_sweep_goes_on() -> None:
    engine = FakeEngine(lambda c: "CUDA out of memory" if c.batch_size == 32 else by_batch(c))
    seen: list[tuple[str, str]] = []
    result = aw.sweep(WORKLOAD, {"batch_size": [16, 32, 64]}, engine=engine, progress=False,
                      on_point=lambda point, burst: seen.append((point.label, burst.status)))
    assert seen == [("batch_size=16", "ok"), ("batch_size=32", "failed"), ("batch_size=64", "ok")]
    frame = result.frame()
    assert frame["status"].tolist() == ["ok", "failed", "ok"]
    assert frame["error"].tolist() == ["", "CUDA out of memory", ""]
    assert frame["samples_per_s"].isna().tolist() == [False, True, False]
    assert frame["speedup"].tolist()[2] == pytest.approx(640 / 160)


def test_the_frame_has_one_row_per_point_with_medians_over_repeats() -> None:
    rates = {0: [100.0, 130.0, 90.0], 2: [200.0, 260.0, 180.0]}
    engine = FakeEngine(lambda c: rates[c.num_workers].pop(0))
    result = aw.sweep(WORKLOAD, {"num_workers": [0, 2]}, base=Config(batch_size=16), repeats=3, engine=engine,
                      progress=False)
    frame = result.frame()
    assert list(frame.columns) == ["num_workers", "samples_per_s", "speedup", "step_ms_median", "step_ms_iqr",
                                   "runs", "status", "error"]
    assert frame["num_workers"].tolist() == [0, 2]
    assert frame["samples_per_s"].tolist() == [100.0, 200.0]  # medians of three repeats
    assert frame["speedup"].tolist() == [1.0, 2.0]  # against the first point
    # Step times pooled over the repeats: 10,20,30 / 20,40,60 / 30,60,90 ms -> median 30, quartiles 20 and 60.
    assert frame["step_ms_median"].tolist() == pytest.approx([30.0, 30.0])
    assert frame["step_ms_iqr"].tolist() == pytest.approx([40.0, 40.0])
    assert frame["runs"].tolist() == [3, 3] and frame["status"].tolist() == ["ok", "ok"]
    assert result.baseline is result.points[0]


def test_a_stop_ends_the_sweep_and_the_points_left_read_not_run() -> None:
    stop = threading.Event()
    engine = FakeEngine(by_batch)
    result = aw.sweep(WORKLOAD, {"batch_size": [16, 32, 64]}, engine=engine, stop=stop, progress=False,
                      on_point=lambda point, burst: stop.set())
    assert engine.calls == ["batch_size=16"] and result.stopped
    assert [p.status for p in result.points] == ["ok", "not run", "not run"]


def test_with_progress_each_burst_ends_in_its_result_line(capsys: pytest.CaptureFixture[str]) -> None:
    aw.sweep(WORKLOAD, {"batch_size": [16, 32]}, engine=FakeEngine(by_batch), steps=3)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "  burst 1/2 batch_size=16 · starting · 0.0 s"
    assert lines[1].startswith("  batch_size=16") and "160.0 samples/s  1.00x" in lines[1]
    assert lines[2] == "  burst 2/2 batch_size=32 · starting · 0.0 s"
    assert lines[3].startswith("  batch_size=32") and "320.0 samples/s  2.00x" in lines[3]


def sweep_of(grid: dict[str, list[Any]]) -> SweepResult:
    return aw.sweep(WORKLOAD, grid, base=Config(batch_size=16), engine=FakeEngine(
        lambda c: 100.0 * (1 + c.num_workers) * (2 if c.pin_memory else 1)), progress=False)


def test_one_knob_is_a_line_two_a_heatmap_more_parallel_coordinates() -> None:
    line = sweep_of({"num_workers": [0, 1]}).figure("speedup")
    assert line.data[0].type == "scatter" and list(line.data[0].y) == [1.0, 2.0]
    assert list(line.data[0].x) == ["0", "1"]

    heatmap = sweep_of({"num_workers": [0, 1, 2], "pin_memory": [False, True]}).figure()
    assert heatmap.data[0].type == "heatmap"
    assert [list(row) for row in heatmap.data[0].z] == [[100.0, 200.0], [200.0, 400.0], [300.0, 600.0]]
    assert list(heatmap.data[0].y) == ["0", "1", "2"] and list(heatmap.data[0].x) == ["False", "True"]

    grid = {"num_workers": [0, 1], "pin_memory": [False, True], "precision": ["fp32", "bf16"]}
    parallel = sweep_of(grid).figure()
    assert parallel.data[0].type == "parcoords"
    workers, pinned, precision, metric = parallel.data[0].dimensions
    assert list(workers.values) == [0, 0, 0, 0, 1, 1, 1, 1] and workers.tickvals is None
    assert list(pinned.ticktext) == ["False", "True"] and list(pinned.values) == [0, 0, 1, 1, 0, 0, 1, 1]
    assert list(precision.ticktext) == ["fp32", "bf16"] and list(precision.tickvals) == [0, 1]
    assert metric.label == "samples/s" and list(metric.values)[:3] == [100.0, 100.0, 200.0]


def test_a_point_that_did_not_finish_leaves_its_cell_blank() -> None:
    result = SweepResult("tiny", ["num_workers", "pin_memory"],
                         [SweepPoint({"num_workers": 0, "pin_memory": False}, Config())], [], 1)
    assert [list(row) for row in result.figure().data[0].z] == [[None]]
    with pytest.raises(ValueError, match="metric='mfu' is invalid"):
        result.figure("mfu")  # type: ignore[arg-type]


def test_a_small_real_sweep() -> None:
    result = aw.sweep(WORKLOAD, {"batch_size": [16, 32], "num_workers": [0]}, steps=3, progress=False)
    frame = result.frame()
    assert frame["batch_size"].tolist() == [16, 32] and frame["status"].tolist() == ["ok", "ok"]
    assert (frame["samples_per_s"] > 0).all() and frame["speedup"].tolist()[0] == 1.0
    assert [r.config.batch_size for r in result.results] == [16, 32]
    assert all(r.measured_steps() and len(r.measured_steps()) == 3 for r in result.results)
