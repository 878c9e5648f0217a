"""The presentation layer on synthetic results: how numbers read, one baseline per row, one colour per run."""

from __future__ import annotations

import dataclasses
import math

import pytest

from accel_widgets import Config
from accel_widgets.analysis.compare import run_rows
from accel_widgets.analysis.guard import check_training, find_baseline
from accel_widgets.metrics.units import MISSING, decimals, si, significant
from accel_widgets.views.style import COMPARING_MARK, PALETTE, VERDICT_MARKS, run_colour, run_name
from accel_widgets.views.table import (
    COLUMNS,
    compact_title_cell,
    flops_text,
    same_within_pct,
    speedup_reading,
    speedup_text,
    status_cell,
    status_colour,
    step_text,
    title_cell,
)
from tests.panel.fakes import synthetic_result


def test_numbers_read_with_their_unit_prefix_and_three_significant_digits() -> None:
    assert [si(v, "FLOP/s") for v in (6.4e11, 1.56e14, 6.4e7, 999.7e9, 12.0, 2.5e18)] == [
        "640 GFLOP/s", "156 TFLOP/s", "64.0 MFLOP/s", "1.00 TFLOP/s", "12.0 FLOP/s", "2.50 EFLOP/s"]
    assert [significant(v) for v in (12345.6, 640.0, 64.0, 0.98, 0.0)] == ["12,346", "640", "64.0", "0.980", "0.00"]
    assert decimals(math.nan) == 2
    assert flops_text({"tflops": 156.0, "mfu_pct": 50.0}) == "156 TFLOP/s (50%)"
    assert flops_text({"tflops": 6.4e-5, "mfu_pct": None}) == "64.0 MFLOP/s"
    assert flops_text({"tflops": None}) == MISSING


def test_step_times_keep_the_medians_precision_and_mark_noise() -> None:
    assert step_text({"step_ms_median": 0.98, "step_ms_iqr": 0.3, "noisy": True}) == "0.980 ± 0.300 ~"
    assert step_text({"step_ms_median": 123.4, "step_ms_iqr": 5.6, "noisy": False}) == "123 ± 6"
    assert step_text({"step_ms_median": 10.0, "step_ms_iqr": 0.0, "noisy": False}) == "10.0 ± 0.0"
    assert step_text({"step_ms_median": None}) == MISSING


def test_names_and_colours() -> None:
    from plotly.colors import qualitative

    assert tuple(qualitative.Plotly) == PALETTE  # the colour plotly would give the run's first trace
    assert run_colour(0) == run_colour(len(PALETTE)) != run_colour(1)
    assert run_name(3, "+loader") == "#3 +loader" and run_name(3, "+loader", "mlp") == "#3 mlp: +loader"
    long = run_name(12, "x" * 60)
    assert long.startswith("#12 x") and long.endswith("…") and len(long) == len("#12 ") + 40


def with_nan_losses(result, from_step: int = 6):
    return dataclasses.replace(result, steps=[dataclasses.replace(s, loss=math.nan) if s.step >= from_step else s
                                              for s in result.steps])


def test_every_rows_speed_up_and_verdict_refer_to_the_same_baseline() -> None:
    """DDP runs are compared with the single-process plain run, for speed and for training alike: the
    guard's own choice (an fp32 run of the same world size) would judge the row against another run."""
    plain = synthetic_result()
    ddp = synthetic_result(Config(parallel="ddp", world_size=2), ranks=2, step_s=0.05)
    ddp_bf16 = with_nan_losses(synthetic_result(Config(parallel="ddp", world_size=2, precision="bf16"), ranks=2,
                                                step_s=0.025))
    results = [plain, ddp, ddp_bf16]
    assert find_baseline(ddp_bf16, results) is ddp  # what the guard alone would have picked
    rows = run_rows(results)
    for row in rows:
        assert row.baseline is plain and row.values["baseline"] == 0
        assert row.verdict == check_training(row.result, plain)
    assert rows[1].values["speedup"] == pytest.approx(2.0) and rows[1].verdict.status == "not_comparable"
    text, hover = status_cell(rows[1])
    assert text == "ok" and "training not checked: the run has 2 rank(s)" in hover
    # NaN needs no baseline
    assert rows[2].changes_training and status_cell(rows[2])[0] == "faster but changes training"


def test_rows_already_judged_keep_their_verdict_until_their_baseline_changes() -> None:
    first = synthetic_result(Config(num_workers=1))
    rows = run_rows([first, synthetic_result(Config(num_workers=2))])
    again = run_rows([first, rows[1].result, synthetic_result(Config(precision="bf16"))], judged=rows)
    assert again[0].verdict is rows[0].verdict and again[1].verdict is rows[1].verdict
    plain = synthetic_result()
    rebased = run_rows([first, rows[1].result, plain], judged=rows)  # the plain loop is now everyone's baseline
    assert all(row.baseline is plain for row in rebased) and rebased[0].verdict is not rows[0].verdict
    assert rebased[0].verdict == check_training(first, plain)


def test_status_cells_and_colours() -> None:
    ok, stopped = run_rows([synthetic_result(), synthetic_result(status="stopped")])
    assert status_cell(ok) == ("ok", "ok") and status_colour(ok) == "#2e7d32"
    assert status_colour(stopped) == "#8a6d00"
    (loaded,) = run_rows([synthetic_result(label="mine")], loaded={0: "recorded on Monday"})
    assert title_cell(loaded) == ("⟲ mine (baseline)", "⟲ mine (baseline)\nrecorded on Monday")


# -- the timeline's step axis ------------------------------------------------------------------------
def test_step_axis_spans_the_measured_steps_at_least_half_a_decade() -> None:
    from accel_widgets.views.timeline import log_ticks, step_axis_range

    low, high = step_axis_range([10.0, 10.0])
    assert (low + high) / 2 == pytest.approx(1.0) and high - low == pytest.approx(0.6)  # 0.5 decades + padding
    low, high = step_axis_range([0.1, 100.0])
    assert (low, high) == pytest.approx((-1.05, 2.05))
    assert log_ticks(0.7, 1.3) == pytest.approx([7, 10, 15])  # a narrow axis gets finer ticks
    assert log_ticks(-1.05, 2.05) == pytest.approx([0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100])
    assert log_ticks(-2, 5) == pytest.approx([0.01, 0.1, 1, 10, 100, 1e3, 1e4, 1e5])


def test_step_axis_refits_as_steps_stream_in_and_to_the_shown_runs_only() -> None:
    """As the panel builds its live figure: warm-up first (autorange), then measured steps, then a hidden run."""
    from accel_widgets.views.timeline import add_step_trace, fit_step_axis, timeline_figure

    fast, slow = synthetic_result(step_s=0.01), synthetic_result(step_s=0.1)
    figure = timeline_figure("utilisation %")
    warm = add_step_trace(figure, 0, "#0", rank=0, ranks=1, warmup=True,
                          steps=[dataclasses.replace(s, total_s=20.0) for s in fast.steps if s.warmup])
    fit_step_axis(figure)
    assert figure.layout.yaxis2.range is None  # nothing measured yet: plotly autoranges over the warm-up
    add_step_trace(figure, 0, "#0", rank=0, ranks=1, warmup=False, steps=fast.measured_steps())
    add_step_trace(figure, 1, "#1", rank=0, ranks=1, warmup=False, steps=slow.measured_steps())
    fit_step_axis(figure)
    assert figure.layout.yaxis2.range == pytest.approx((1 - 0.05, 2 + 0.05))  # 10 ms to 100 ms, padded
    note = f"step (▲ {len(warm.y)} warm-up/compile steps above the plot, slowest 20.0 s)"
    assert figure.layout.xaxis2.title.text == note
    figure.data[-1].visible = False  # the slow run is hidden
    fit_step_axis(figure)
    assert figure.layout.yaxis2.range == pytest.approx((1 - 0.25 - 0.05, 1 + 0.25 + 0.05))
    warm.visible = False
    fit_step_axis(figure)
    assert figure.layout.xaxis2.title.text == "step"


def test_a_gpu_window_too_short_for_nvml_reads_too_short_with_the_reason_on_hover() -> None:
    short = run_rows([synthetic_result(util=90, source="nvml", steps=10)])[0]  # a 0.5 s window
    text, hover = COLUMNS["util"].cell(short.values)
    assert text == "too short" and hover.startswith("too short to read: NVML's utilisation averages the last 1 s")
    long = run_rows([synthetic_result(util=90, source="nvml", steps=60)])[0]
    text, hover = COLUMNS["util"].cell(long.values)
    assert text == "90" and hover.startswith("NVML's readings taken at least 1 s into the measured window")


# -- the speed-up cell (issue #28's comparison keys, each optional) ------------------------------------------
def compared(speedup: float, low: float | None = None, high: float | None = None, verdict: str | None = None,
             **keys: object) -> dict:
    """A hand-made row as analysis/compare.py fills it: run 1 against baseline run 0."""
    interval = (low, high) if low is not None else None
    return {"run": 1, "baseline": 0, "speedup": speedup, "speedup_interval": interval, "verdict": verdict,
            "min_effect": 0.05, **keys}


def test_a_compared_speed_up_reads_as_its_interval_and_its_verdict() -> None:
    faster = speedup_reading(compared(1.23, 1.11, 1.35, "faster"))
    assert faster.text == "1.23× [1.11–1.35] ▲" and (faster.mark, faster.tone) == VERDICT_MARKS["faster"]
    assert "95% anytime-valid interval 1.11–1.35×: faster." in faster.hover and faster.hint == ""
    slower = speedup_reading(compared(0.80, 0.72, 0.88, "slower"))
    assert slower.text == "0.80× [0.72–0.88] ▼" and slower.tone == "error"
    undecided = speedup_reading(compared(1.05, 0.92, 1.20, "undecided"))
    assert undecided.text == "1.05× [0.92–1.20] ?" and "undecided" in undecided.hover and "±5%" in undecided.hover
    assert speedup_reading(compared(1.05, 0.92, 1.20)).text == "1.05× [0.92–1.20]"  # not judged yet: no mark


def test_same_reads_as_its_bound_the_larger_distance_of_the_ends_from_one_rounded_up() -> None:
    same = speedup_reading(compared(0.99, 0.96, 1.04, "same"))
    assert same.text == "same ±4%" and same.tone == "muted" and same.mark == ""  # 1 - 0.96 is 0.0400...04 in floats
    assert "No measurable effect here: within ±4%" in same.hover and "inside ±5%" in same.hover
    assert speedup_reading(compared(1.01, 0.985, 1.031, "same")).text == "same ±4%"  # 3.1% bounds at 4%
    assert speedup_reading(compared(1.0, 0.99, 1.002, "same")).text == "same ±1%"
    assert same_within_pct(0.97, 1.02) == 3


def test_a_config_identical_to_its_baseline_reads_as_the_noise_floor_never_a_speed_up() -> None:
    floor = speedup_reading(compared(1.14, 0.91, 1.24, "faster", same_config=True))
    assert floor.text == "same config: 0.91–1.24×" and floor.mark == "" and floor.tone == "muted"
    assert "this machine moves it 0.91–1.24× from burst to burst" in floor.hover and "not a speed-up" in floor.hover
    one = speedup_reading(compared(1.14, same_config=True))
    assert one.text == "same config: 1.14×" and one.hint == "1 burst"
    # Compared, but in too few blocks for an interval: the hint says the blocks, not one burst.
    early = speedup_reading(compared(1.14, None, None, "undecided", same_config=True, blocks=2))
    assert early.text == "same config: 1.14×" and early.hint == "2 blocks"


def test_while_repeats_arrive_the_cell_carries_the_live_mark() -> None:
    live = speedup_reading(compared(1.10, 0.98, 1.30, "undecided", comparing=True))
    assert live.comparing and live.text == f"1.10× [0.98–1.30] ? {COMPARING_MARK}"
    assert live.hover.startswith("Still comparing")
    assert not speedup_reading(compared(1.10, 0.98, 1.30, "undecided", comparing=False)).comparing


def test_without_a_comparison_the_single_ratio_reads_as_before_with_a_quiet_hint() -> None:
    for row in ({"run": 1, "baseline": 0, "speedup": 1.23}, compared(1.23)):  # the keys absent, or None
        single = speedup_reading(row)
        assert (single.text, single.hint) == ("1.23×", "1 burst") and "one burst against one burst" in single.hover
    # Plain text has no quiet style: the terminal's and the report's tables say the hint in brackets.
    assert speedup_text({"run": 1, "baseline": 0, "speedup": 1.25, "unreliable": True}) == "1.25× ⚠ (1 burst)"
    assert speedup_text({"run": 0, "baseline": 0, "speedup": 1.0}) == "1.00×"
    baseline = speedup_reading({"run": 0, "baseline": 0, "speedup": 1.0})
    assert (baseline.text, baseline.hint) == ("1.00×", "")
    assert speedup_reading({"run": 1, "baseline": None, "speedup": None}).text == MISSING


def test_every_speed_up_cell_stays_short_enough_to_fit_beside_the_others() -> None:
    """The panel folds the other columns before the speed-up: the cell itself must stay within 26 characters."""
    rows = [compared(12.34, 10.01, 14.56, "faster", comparing=True, unreliable=True),
            compared(1.14, 0.91, 1.24, same_config=True, comparing=True), compared(0.99, 0.81, 1.19, "same")]
    assert max(len(speedup_reading(row).text) for row in rows) <= 26


def test_the_panels_title_is_the_short_form_with_the_whole_config_on_hover() -> None:
    plain = synthetic_result()
    loader = synthetic_result(Config(num_workers=2, persistent_workers=True), label="+loader")
    own = synthetic_result(Config(num_workers=2, precision="bf16"))
    rows = run_rows([plain, loader, own])
    assert [compact_title_cell(row)[0] for row in rows] == ["baseline", "+loader: workers 2, persistent",
                                                            "workers 2, bf16"]
    hover = compact_title_cell(rows[1])[1]
    assert hover == "+loader: num_workers=2, persistent_workers=True\nwhole config: num_workers=2, " \
                    "persistent_workers=True"
    assert compact_title_cell(rows[0])[1].endswith("whole config: every knob at its default")
    (loaded,) = run_rows([synthetic_result(label="mine")], loaded={0: "recorded on Monday"})
    assert compact_title_cell(loaded)[0] == "⟲ mine (baseline)"


def test_a_comparison_too_short_for_an_interval_reads_as_undecided_with_its_blocks() -> None:
    early = speedup_reading(compared(1.07, verdict="undecided", blocks=2, comparing=True))
    assert early.text == f"1.07× ? {COMPARING_MARK}" and early.hint == "2 blocks"
    assert "too few yet for an interval" in early.hover and "1 burst" not in early.hover
