"""A burst's use of the machine as :mod:`accel_widgets.analysis.usage` reads it from its records.

Energy: every expected value is worked out by hand from the traces below: counters preferred over power, power
integrated or (where NVML averages it) the settled readings averaged, devices summed, and no number where none can be
honest.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from accel_widgets import BurstResult, Config, StepRecord, TelemetrySample
from accel_widgets.analysis.compare import run_rows
from accel_widgets.analysis.usage import energy
from accel_widgets.metrics.energy import EnergyScope
from accel_widgets.metrics.units import MISSING
from accel_widgets.results.burst import RankSummary
from accel_widgets.views.table import COLUMNS, REPORT_COLUMNS
from accel_widgets.views.text import summary

NOT_MEASURED_HERE = "energy not measured here (no NVML, RAPL not readable)"


# -- energy -------------------------------------------------------------------------------------------
SAMPLES_PER_STEP = 32
MEASURED = 4  # steps of 0.5 s after one warm-up step: the measured window is [1.0, 3.0] s


def _steps() -> list[StepRecord]:
    warmup = [StepRecord(0, 0, 1.0, 0.0, 0.0, 1.0, 1.0, SAMPLES_PER_STEP, 1.0, warmup=True)]
    return warmup + [StepRecord(0, k, 1.0 + 0.5 * k, 0.0, 0.0, 0.5, 0.5, SAMPLES_PER_STEP, 1.0)
                     for k in range(1, MEASURED + 1)]


def _gpu(t: float, device: str = "cuda:0", *, counter_j: float | None = None, power_w: float | None = None,
         scope: EnergyScope | None = "gpu") -> TelemetrySample:
    return TelemetrySample(t=t, source="nvml", util_pct=90.0, mem_used_bytes=1, device=device, power_w=power_w,
                           energy_j=counter_j, energy_scope=scope)


def _result(telemetry: list[TelemetrySample], capability: str | None = None) -> BurstResult:
    rank = RankSummary(0, SAMPLES_PER_STEP * MEASURED, 2.0, 1, "cuda_allocator", 0.1, 1.0, "cuda:0")
    return BurstResult(workload="w", config=Config(), status="ok", warmup_steps=1, steps=_steps(),
                       telemetry=telemetry, ranks=[rank],
                       environment={"capability": capability} if capability is not None else {})


TICKS = [0.1 * k for k in range(0, 41)]  # 0 to 4 s at 10 Hz: warm-up, window and teardown
SAMPLES = SAMPLES_PER_STEP * MEASURED


def test_the_energy_counter_gives_joules_per_sample_and_is_preferred_over_power() -> None:
    # 250 W on the counter (offset: joules since the driver loaded); the power readings say 999 W and lose.
    result = _result([_gpu(t, counter_j=5e6 + 250.0 * t, power_w=999.0) for t in TICKS])
    used = energy(result)
    assert result.measured_window() == (1.0, 3.0)
    assert used.joules == pytest.approx(500.0)
    assert used.joules_per_sample == pytest.approx(500.0 / SAMPLES)
    assert used.samples_per_joule == pytest.approx(SAMPLES / 500.0)
    assert used.mean_power_w == pytest.approx(250.0)
    assert used.note == "GPU energy over the measured window, from NVML's energy counter"
    assert "energy      3.91 J/sample, 0.256 samples/J" in summary(result)


def test_without_a_counter_power_is_integrated_over_the_window_only() -> None:
    # 100 W, except 1000 W during warm-up and teardown (outside the window) and a 400 W tick inside it.
    def watts(t: float) -> float:
        return 400.0 if abs(t - 2.0) < 1e-9 else 100.0 if 1.0 <= t <= 3.0 else 1000.0

    # An A100 (compute capability 8.0): NVML reads its power instantaneously.
    result = _result([_gpu(round(t, 1), power_w=watts(round(t, 1))) for t in TICKS], capability="8.0")
    used = energy(result)
    # 100 W for 2 s, plus the 400 W tick's triangle: 300 W high, 0.2 s wide.
    assert used.joules == pytest.approx(200.0 + 300.0 * 0.2 / 2)
    assert used.joules_per_sample == pytest.approx(230.0 / SAMPLES)
    assert used.note == "GPU energy over the measured window, from NVML's power readings integrated"


def test_power_averaged_over_a_second_counts_only_readings_settled_inside_the_window() -> None:
    """A Hopper GPU's reading at t averages the second before t: those in the window's first second still
    hold the warm-up's 1000 W; the settled ones (2.0 to 3.0 s) are averaged over the window's 2 s."""
    def watts(t: float) -> float:
        return 400.0 if abs(t - 2.5) < 1e-9 else 100.0 if 2.0 <= t <= 3.0 else 1000.0

    result = _result([_gpu(round(t, 1), power_w=watts(round(t, 1))) for t in TICKS], capability="9.0")
    used = energy(result)
    assert used.joules == pytest.approx((10 * 100.0 + 400.0) / 11 * 2.0)
    assert used.note == ("GPU energy over the measured window, from NVML's power readings (1 s averages) "
                         "settled in the window, times its length")
    assert used.mean_power_w == pytest.approx((10 * 100.0 + 400.0) / 11)


def test_averaged_power_over_a_window_under_two_seconds_is_too_short_to_read() -> None:
    steps = _steps()[:4]  # the window is [1.0, 2.5]
    result = _result([_gpu(t, power_w=300.0) for t in TICKS], capability="9.0")
    result.steps = steps
    used = energy(result)
    assert used.joules is None and used.mean_power_w is None
    assert used.note == ("energy not measured: too short to read, NVML's power averages the last 1 s and "
                         "the measured window is 1.5 s")


def test_window_edges_between_ticks_are_interpolated() -> None:
    # Ticks every 0.4 s (0.0, 0.4, ... 4.0): both window edges (1.0 s, 3.0 s) fall between ticks.
    ticks = [0.4 * k for k in range(11)]
    counter = _result([_gpu(t, counter_j=100.0 * t * t) for t in ticks])  # a quadratic counter
    # Interpolated: at 1.0 between 0.8 (64) and 1.2 (144) -> 104; at 3.0 between 2.8 (784) and 3.2 (1024) -> 904.
    assert energy(counter).joules == pytest.approx(904.0 - 104.0)


def test_every_gpu_in_use_is_summed() -> None:
    telemetry = [s for t in TICKS for s in (_gpu(t, "cuda:0", counter_j=250.0 * t, power_w=1.0),
                                            _gpu(t, "cuda:1", power_w=100.0))]
    result = _result(telemetry)
    used = energy(result)
    assert used.joules == pytest.approx(500.0 + 200.0)
    assert used.joules_per_sample == pytest.approx(700.0 / SAMPLES)
    assert used.note == ("GPU energy over the measured window, summed over 2 GPUs, from NVML's energy counter and "
                         "NVML's power readings (1 s averages) settled in the window, times its length")


def test_a_gpu_whose_readings_do_not_cover_the_window_leaves_no_number() -> None:
    telemetry = [_gpu(t, "cuda:0", counter_j=250.0 * t) for t in TICKS]
    telemetry += [_gpu(t, "cuda:1", power_w=100.0) for t in TICKS if t < 2.5]  # lost mid-window
    result = _result(telemetry)
    used = energy(result)
    assert (used.joules, used.joules_per_sample, used.samples_per_joule, used.mean_power_w) == (None, None, None, None)
    assert used.note == "energy not measured: cuda:1's readings do not cover the measured window"


def test_mig_reports_no_energy_rather_than_the_whole_gpus() -> None:
    result = _result([_gpu(t, power_w=300.0, scope="mig") for t in TICKS])
    used = energy(result)
    assert used.joules is None and used.joules_per_sample is None
    assert used.note == "energy not measured: NVML reports power for the whole GPU, not per MIG instance"


def test_rapl_package_energy_is_measured_and_says_it_is_the_whole_package() -> None:
    cpu = [TelemetrySample(t=t, source="psutil", util_pct=50.0, mem_used_bytes=1, device="cpu",
                           energy_j=40.0 * t, energy_scope="cpu_package") for t in TICKS]
    result = _result(cpu)
    used = energy(result)
    assert used.joules == pytest.approx(80.0)
    assert "RAPL" in used.note and "the whole package" in used.note


def test_no_readings_show_the_missing_mark_and_say_why() -> None:
    cpu = [TelemetrySample(t=t, source="psutil", util_pct=50.0, mem_used_bytes=1, device="cpu") for t in TICKS]
    result = _result(cpu)
    used = energy(result)
    assert (used.joules, used.note) == (None, NOT_MEASURED_HERE)
    (row,) = run_rows([result])
    assert "energy" in REPORT_COLUMNS
    assert COLUMNS["energy"].cell(row.values) == (MISSING, NOT_MEASURED_HERE)


def test_the_table_cell_shows_joules_per_sample_and_the_hover_says_how() -> None:
    (row,) = run_rows([_result([_gpu(t, counter_j=250.0 * t) for t in TICKS])])
    assert COLUMNS["energy"].cell(row.values) == (
        "3.91", "GPU energy over the measured window, from NVML's energy counter\n0.256 samples/J, 250 W mean")


def test_energy_survives_json_and_old_results_still_load() -> None:
    result = _result([_gpu(t, counter_j=250.0 * t) for t in TICKS])
    used = energy(result)
    loaded = BurstResult.from_json(result.to_json())
    assert energy(loaded).joules == used.joules and energy(loaded).note == used.note
    old = json.loads(result.to_json())
    for sample in old["telemetry"]:
        del sample["energy_j"], sample["energy_scope"]
    stored_before = BurstResult.from_dict(old)
    assert stored_before.telemetry == [dataclasses.replace(s, energy_j=None, energy_scope=None)
                                       for s in result.telemetry]
    assert energy(stored_before).joules is None


def test_no_measured_steps_no_energy() -> None:
    result = dataclasses.replace(_result([_gpu(t, counter_j=250.0 * t) for t in TICKS]), steps=_steps()[:1])
    used = energy(result)
    assert (used.joules, used.note) == (None, "energy not measured: no measured steps")
