"""Energy per sample: the window arithmetic, RAPL over a fake sysfs tree, and BurstResult's numbers.

Every expected value is worked out by hand from the traces below, so the tests pin the arithmetic itself:
counters differenced at the interpolated window edges, power integrated by the trapezoid rule and
clipped to the window, devices summed, and no number where none can be honest.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from accel_widgets import BurstResult, Config, StepRecord, TelemetrySample
from accel_widgets.analysis.compare import run_rows
from accel_widgets.metrics.energy import RaplCounter, counter_energy_j, integrated_energy_j, value_at
from accel_widgets.metrics.units import MISSING
from accel_widgets.results.burst import EnergyScope, RankSummary
from accel_widgets.views.table import COLUMNS, REPORT_COLUMNS

NOT_MEASURED_HERE = "energy not measured here (no NVML, RAPL not readable)"


# -- the arithmetic --------------------------------------------------------------------------------
def test_value_at_interpolates_inside_the_readings_and_never_extrapolates() -> None:
    points = [(0.0, 10.0), (1.0, 20.0), (3.0, 0.0)]
    assert [value_at(points, t) for t in (0.0, 0.25, 1.0, 2.0, 3.0)] == [10.0, 12.5, 20.0, 10.0, 0.0]
    assert value_at(points, -0.1) is None and value_at(points, 3.1) is None and value_at([], 0.0) is None


def test_a_counter_is_differenced_at_the_interpolated_window_edges() -> None:
    counter = [(0.0, 1000.0), (1.0, 1100.0), (2.0, 1300.0), (3.0, 1300.0)]  # joules since the driver loaded
    assert counter_energy_j(counter, 0.5, 2.5) == pytest.approx(1300.0 - 1050.0)
    assert counter_energy_j(counter, 1.0, 2.0) == pytest.approx(200.0)
    assert counter_energy_j(counter, 0.5, 3.5) is None  # the readings stop before the window ends


def test_power_is_integrated_by_trapezoids_clipped_to_the_window() -> None:
    flat = [(float(t), 100.0) for t in range(11)]
    assert integrated_energy_j(flat, 2.5, 7.5) == pytest.approx(500.0)
    ramp = [(float(t), 10.0 * t) for t in range(11)]  # linear: the trapezoid rule is exact
    assert integrated_energy_j(ramp, 2.5, 4.5) == pytest.approx(5 * (4.5**2 - 2.5**2))
    peak = [(0.0, 100.0), (1.0, 200.0), (2.0, 100.0), (3.0, 1000.0)]  # the 1000 W after the window is left out
    # Edges at 0.5 s and 1.5 s read 150 W; two half-second trapezoids (150 + 200) / 2 * 0.5 each.
    assert integrated_energy_j(peak, 0.5, 1.5) == pytest.approx(175.0)
    assert integrated_energy_j(peak, -0.5, 1.5) is None


# -- RAPL over a fake sysfs tree -------------------------------------------------------------------
def _domain(root: Path, name: str, label: str, energy_uj: int, max_uj: int = 10**9) -> Path:
    domain = root / name
    domain.mkdir(parents=True)
    (domain / "name").write_text(label + "\n")
    (domain / "energy_uj").write_text(f"{energy_uj}\n")
    (domain / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return domain


def _set(domain: Path, energy_uj: int) -> None:
    (domain / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def powercap(tmp_path: Path) -> dict[str, Path]:
    """Two packages (package 0 near its wrap), a core subdomain and a psys domain that must not be added."""
    return {
        "package-0": _domain(tmp_path, "intel-rapl:0", "package-0", 900_000, max_uj=1_000_000),
        "core": _domain(tmp_path, "intel-rapl:0:0", "core", 5_000),
        "package-1": _domain(tmp_path, "intel-rapl:1", "package-1", 2_000_000),
        "psys": _domain(tmp_path, "intel-rapl:2", "psys", 7_000_000),
    }


def test_rapl_sums_the_packages_and_unwraps_a_counter_that_wrapped(powercap: dict[str, Path]) -> None:
    counter = RaplCounter.open(powercap["package-0"].parent)
    assert counter is not None
    assert counter.read_j() == 0.0
    _set(powercap["package-0"], 100_000)  # wrapped past 1 J: 0.1 J to the wrap, 0.1 J after it
    _set(powercap["package-1"], 2_500_000)
    _set(powercap["core"], 9_000_000)  # a subdomain: part of package 0, never added
    _set(powercap["psys"], 9_000_000)  # the whole platform: never added
    assert counter.read_j() == pytest.approx(0.2 + 0.5)
    _set(powercap["package-0"], 400_000)
    assert counter.read_j() == pytest.approx(0.2 + 0.5 + 0.3)


def test_rapl_is_none_where_it_cannot_be_read(powercap: dict[str, Path], tmp_path: Path) -> None:
    assert RaplCounter.open(tmp_path / "no-powercap") is None
    (powercap["package-1"] / "energy_uj").unlink()
    (powercap["package-1"] / "energy_uj").mkdir()  # unreadable even for root, as energy_uj is for users
    assert RaplCounter.open(powercap["package-0"].parent) is None


# -- BurstResult ------------------------------------------------------------------------------------
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
    assert result.measured_window() == (1.0, 3.0)
    assert result.energy_j == pytest.approx(500.0)
    assert result.joules_per_sample == pytest.approx(500.0 / SAMPLES)
    assert result.samples_per_joule == pytest.approx(SAMPLES / 500.0)
    assert result.mean_power_w == pytest.approx(250.0)
    assert result.energy_note == "GPU energy over the measured window, from NVML's energy counter"
    assert "energy      3.91 J/sample, 0.256 samples/J" in result.summary()


def test_without_a_counter_power_is_integrated_over_the_window_only() -> None:
    # 100 W, except 1000 W during warm-up and teardown (outside the window) and a 400 W tick inside it.
    def watts(t: float) -> float:
        return 400.0 if abs(t - 2.0) < 1e-9 else 100.0 if 1.0 <= t <= 3.0 else 1000.0

    # An A100 (compute capability 8.0): NVML reads its power instantaneously.
    result = _result([_gpu(round(t, 1), power_w=watts(round(t, 1))) for t in TICKS], capability="8.0")
    # 100 W for 2 s, plus the 400 W tick's triangle: 300 W high, 0.2 s wide.
    assert result.energy_j == pytest.approx(200.0 + 300.0 * 0.2 / 2)
    assert result.joules_per_sample == pytest.approx(230.0 / SAMPLES)
    assert result.energy_note == "GPU energy over the measured window, from NVML's power readings integrated"


def test_power_averaged_over_a_second_counts_only_readings_settled_inside_the_window() -> None:
    """A Hopper GPU's reading at t averages the second before t: those in the window's first second still
    hold the warm-up's 1000 W; the settled ones (2.0 to 3.0 s) are averaged over the window's 2 s."""
    def watts(t: float) -> float:
        return 400.0 if abs(t - 2.5) < 1e-9 else 100.0 if 2.0 <= t <= 3.0 else 1000.0

    result = _result([_gpu(round(t, 1), power_w=watts(round(t, 1))) for t in TICKS], capability="9.0")
    assert result.energy_j == pytest.approx((10 * 100.0 + 400.0) / 11 * 2.0)
    assert result.energy_note == ("GPU energy over the measured window, from NVML's power readings (1 s averages) "
                                  "settled in the window, times its length")
    assert result.mean_power_w == pytest.approx((10 * 100.0 + 400.0) / 11)


def test_averaged_power_over_a_window_under_two_seconds_is_too_short_to_read() -> None:
    steps = _steps()[:4]  # the window is [1.0, 2.5]
    result = _result([_gpu(t, power_w=300.0) for t in TICKS], capability="9.0")
    result.steps = steps
    assert result.energy_j is None and result.mean_power_w is None
    assert result.energy_note == ("energy not measured: too short to read, NVML's power averages the last 1 s and "
                                  "the measured window is 1.5 s")


def test_window_edges_between_ticks_are_interpolated() -> None:
    # Ticks every 0.4 s (0.0, 0.4, ... 4.0): both window edges (1.0 s, 3.0 s) fall between ticks.
    ticks = [0.4 * k for k in range(11)]
    counter = _result([_gpu(t, counter_j=100.0 * t * t) for t in ticks])  # a quadratic counter
    # Interpolated: at 1.0 between 0.8 (64) and 1.2 (144) -> 104; at 3.0 between 2.8 (784) and 3.2 (1024) -> 904.
    assert counter.energy_j == pytest.approx(904.0 - 104.0)


def test_every_gpu_in_use_is_summed() -> None:
    telemetry = [s for t in TICKS for s in (_gpu(t, "cuda:0", counter_j=250.0 * t, power_w=1.0),
                                            _gpu(t, "cuda:1", power_w=100.0))]
    result = _result(telemetry)
    assert result.energy_j == pytest.approx(500.0 + 200.0)
    assert result.joules_per_sample == pytest.approx(700.0 / SAMPLES)
    assert result.energy_note == ("GPU energy over the measured window, summed over 2 GPUs, from NVML's energy "
                                  "counter and NVML's power readings (1 s averages) settled in the window, times its "
                                  "length")


def test_a_gpu_whose_readings_do_not_cover_the_window_leaves_no_number() -> None:
    telemetry = [_gpu(t, "cuda:0", counter_j=250.0 * t) for t in TICKS]
    telemetry += [_gpu(t, "cuda:1", power_w=100.0) for t in TICKS if t < 2.5]  # lost mid-window
    result = _result(telemetry)
    assert (result.energy_j, result.joules_per_sample, result.samples_per_joule, result.mean_power_w) == (
        None, None, None, None)
    assert result.energy_note == "energy not measured: cuda:1's readings do not cover the measured window"


def test_mig_reports_no_energy_rather_than_the_whole_gpus() -> None:
    result = _result([_gpu(t, power_w=300.0, scope="mig") for t in TICKS])
    assert result.energy_j is None and result.joules_per_sample is None
    assert result.energy_note == "energy not measured: NVML reports power for the whole GPU, not per MIG instance"


def test_rapl_package_energy_is_measured_and_says_it_is_the_whole_package() -> None:
    cpu = [TelemetrySample(t=t, source="psutil", util_pct=50.0, mem_used_bytes=1, device="cpu",
                           energy_j=40.0 * t, energy_scope="cpu_package") for t in TICKS]
    result = _result(cpu)
    assert result.energy_j == pytest.approx(80.0)
    assert "RAPL" in result.energy_note and "the whole package" in result.energy_note


def test_no_readings_show_the_missing_mark_and_say_why() -> None:
    cpu = [TelemetrySample(t=t, source="psutil", util_pct=50.0, mem_used_bytes=1, device="cpu") for t in TICKS]
    result = _result(cpu)
    assert (result.energy_j, result.energy_note) == (None, NOT_MEASURED_HERE)
    (row,) = run_rows([result])
    assert "energy" in REPORT_COLUMNS
    assert COLUMNS["energy"].cell(row.values) == (MISSING, NOT_MEASURED_HERE)


def test_the_table_cell_shows_joules_per_sample_and_the_hover_says_how() -> None:
    (row,) = run_rows([_result([_gpu(t, counter_j=250.0 * t) for t in TICKS])])
    assert COLUMNS["energy"].cell(row.values) == (
        "3.91", "GPU energy over the measured window, from NVML's energy counter\n0.256 samples/J, 250 W mean")


def test_energy_survives_json_and_old_results_still_load() -> None:
    result = _result([_gpu(t, counter_j=250.0 * t) for t in TICKS])
    loaded = BurstResult.from_json(result.to_json())
    assert loaded.energy_j == result.energy_j and loaded.energy_note == result.energy_note
    old = json.loads(result.to_json())
    for sample in old["telemetry"]:
        del sample["energy_j"], sample["energy_scope"]
    stored_before = BurstResult.from_dict(old)
    assert stored_before.telemetry == [dataclasses.replace(s, energy_j=None, energy_scope=None)
                                       for s in result.telemetry]
    assert stored_before.energy_j is None


def test_no_measured_steps_no_energy() -> None:
    result = dataclasses.replace(_result([_gpu(t, counter_j=250.0 * t) for t in TICKS]), steps=_steps()[:1])
    assert (result.energy_j, result.energy_note) == (None, "energy not measured: no measured steps")
