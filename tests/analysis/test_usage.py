"""A burst's use of the machine as :mod:`accel_widgets.analysis.usage` reads it from its records: utilisation and GPM
activity from the settled readings of the measured window, the host's CPUs, MFU over the GPUs in use, memory beyond
the peak, energy.

Energy: every expected value is worked out by hand from the traces below: counters preferred over power, power
integrated or (where NVML averages it) the settled readings averaged, devices summed, and no number where none can be
honest.
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from accel_widgets import BurstResult, Config, StepRecord
from accel_widgets.analysis.compare import run_rows
from accel_widgets.analysis.usage import (
    activity_text,
    allocator_slack_share,
    energy,
    iowait_pct,
    loader_cpu_pct,
    mean_activity_pct,
    mean_utilisation_pct,
    mfu,
    model_state_bytes,
    peak_reserved_bytes,
    utilisation_note,
)
from accel_widgets.metrics.energy import EnergyScope
from accel_widgets.metrics.units import MISSING
from accel_widgets.results.burst import RankSummary, TelemetrySample
from accel_widgets.views.table import COLUMNS, REPORT_COLUMNS
from accel_widgets.views.text import summary
from tests.results.test_burst import HOST_AFTER, HOST_MEASURED, HOST_SETUP, _rank, _windowed, make_result

NOT_MEASURED_HERE = "energy not measured here (no NVML, RAPL not readable)"


# -- the device's time, the host's CPUs ------------------------------------------------------------------------------
def test_the_means_cover_the_measured_window_only():
    result = _windowed(HOST_SETUP + HOST_MEASURED + HOST_AFTER)
    assert mean_utilisation_pct(result) == pytest.approx(70.0)
    assert loader_cpu_pct(result) == pytest.approx(20.0)
    assert iowait_pct(result) == pytest.approx(2.0)
    assert mean_utilisation_pct(make_result()) == pytest.approx(60.0)  # the workers' CPU share on a CPU burst


def test_without_measured_steps_every_sample_counts_and_an_empty_window_reads_nothing():
    samples = [TelemetrySample(0.5, "psutil", 30.0, 1 << 20), TelemetrySample(0.6, "psutil", 50.0, 1 << 20)]
    warmup_only = [StepRecord(0, 0, 5.0, 0.0, 0.0, 4.0, 4.0, 32, warmup=True)]  # failed after the first step
    failed = _windowed(samples, warmup_only)
    assert failed.measured_window() is None and mean_utilisation_pct(failed) == pytest.approx(40.0)
    assert mean_utilisation_pct(_windowed(samples)) is None  # measured 10.0-10.3 s: no sample in it


def _gpu_window(seconds: float, telemetry: list[TelemetrySample]) -> BurstResult:
    """A warm-up step (a 10 s compile) ending at 10.0, then measured steps of 0.1 s for ``seconds``."""
    measured = round(seconds / 0.1)
    steps = [StepRecord(0, 0, 10.0, 0.0, 0.0, 10.0, 10.0, 32, warmup=True)]
    steps += [StepRecord(0, i, 10.0 + 0.1 * i, 0.0, 0.0, 0.1, 0.1, 32) for i in range(1, measured + 1)]
    return make_result(world_size=1, steps=steps, ranks=[_rank(0, 32 * measured, seconds)], telemetry=telemetry)


def _nvml(t: float, util: float | None, device: str = "cuda:0") -> TelemetrySample:
    return TelemetrySample(round(t, 3), "nvml", util, 5 << 30, device)


def test_a_gpu_without_utilisation_readings_is_left_out_of_the_mean():
    mig = [_nvml(10.0 + 0.1 * k, None) for k in range(31)]
    full = [_nvml(10.0 + 0.1 * k, 90.0, "cuda:1") for k in range(31)]
    assert mean_utilisation_pct(_gpu_window(3.0, mig + full)) == pytest.approx(90.0)
    assert mean_utilisation_pct(_gpu_window(3.0, mig)) is None


def test_nvml_utilisation_counts_from_one_averaging_period_into_the_window():
    """NVML's reading at t averages the second before t: the first second's readings still hold the compile."""
    compile_idle = [_nvml(0.1 * k, 5.0) for k in range(100)]
    ramp = [_nvml(10.0 + 0.1 * k, 5.0 + 9.0 * k) for k in range(10)]  # still averaging the idle compile
    settled = [_nvml(11.0 + 0.1 * k, 95.0) for k in range(21)]
    result = _gpu_window(3.0, compile_idle + ramp + settled)
    assert result.measured_window() == pytest.approx((10.0, 13.0))
    assert mean_utilisation_pct(result) == pytest.approx(95.0)  # the read-time window would say ~75%
    assert utilisation_note(result).startswith("NVML's readings taken at least 1 s into the measured window")
    assert "  util        95%" in summary(result)


def test_a_window_under_two_seconds_is_too_short_to_read_nvml_utilisation():
    result = _gpu_window(1.5, [_nvml(10.0 + 0.1 * k, 80.0) for k in range(16)])
    assert mean_utilisation_pct(result) is None
    assert utilisation_note(result) == ("too short to read: NVML's utilisation averages the last 1 s, and the measured "
                                       "window is 1.5 s (measure at least 2 s)")
    assert "  util        too short to read" in summary(result)
    assert mean_utilisation_pct(_gpu_window(2.0, [_nvml(10.0 + 0.1 * k, 80.0) for k in range(21)])) == 80.0


def _on_gpus(config: Config, world_size: int, gpus: int) -> BurstResult:
    flops = 1e12  # per sample: rank 0 trains 96 samples in 0.3 s, every rank alike
    ranks = [dataclasses.replace(_rank(r, 96, 0.3), flops_per_sample=flops) for r in range(world_size)]
    return make_result(config=config, world_size=world_size, ranks=ranks,
                       environment={"device_kind": "cuda", "device_name": "NVIDIA H200",
                                    "gpus": ["NVIDIA H200"] * gpus})


def test_mfu_divides_by_every_gpu_the_burst_used():
    peak = 989.4e12  # H200 dense bf16
    dataparallel = _on_gpus(Config(parallel="dataparallel", precision="bf16"), world_size=1, gpus=4)
    assert mfu(dataparallel) == pytest.approx(96 / 0.3 * 1e12 / (4 * peak))  # one process, four GPUs
    ddp = _on_gpus(Config(parallel="ddp", world_size=2, precision="bf16"), world_size=2, gpus=4)
    assert mfu(ddp) == pytest.approx(2 * 96 / 0.3 * 1e12 / (2 * peak))  # one GPU per rank, two of the four
    single = _on_gpus(Config(precision="bf16"), world_size=1, gpus=4)
    assert mfu(single) == pytest.approx(96 / 0.3 * 1e12 / peak)
    assert mfu(make_result()) is None  # a CPU burst


H200_MIB = 143_771  # NVML's total for one H200


def _cuda_rank(rank: int, allocated_mib: int, reserved_mib: int | None, state_mib: int | None = None) -> RankSummary:
    return RankSummary(rank, 96, 0.3, allocated_mib << 20, "cuda_allocator", 0.5, 2.0, "NVIDIA H200",
                       peak_reserved_bytes=None if reserved_mib is None else reserved_mib << 20,
                       model_state_bytes=None if state_mib is None else state_mib << 20)


def test_reserved_against_allocated_reads_the_allocators_slack_per_rank():
    """At an H200's sizes: a rank whose allocator held 131,000 MiB for a peak of 98,250 MiB allocated kept 25% of what
    the device gave it unused at its busiest (fragmentation: what expandable segments shrink)."""
    result = make_result(ranks=[_cuda_rank(0, 98_250, 131_000), _cuda_rank(1, 120_000, 124_000)])
    assert result.peak_memory_bytes == 120_000 << 20 and peak_reserved_bytes(result) == 131_000 << 20
    assert peak_reserved_bytes(result) < H200_MIB << 20
    assert allocator_slack_share(result) == pytest.approx(1 - 98_250 / 131_000)  # the worse of the two ranks
    line = next(line for line in summary(result).splitlines() if line.lstrip().startswith("peak mem"))
    assert line.endswith("120,000 MiB (cuda_allocator) per rank: the busiest of 2; reserved 131,000 MiB (25% of it "
                         "never allocated at once)")
    again = BurstResult.from_json(result.to_json())
    assert peak_reserved_bytes(again) == peak_reserved_bytes(result) and allocator_slack_share(again) == \
        allocator_slack_share(result)
    assert peak_reserved_bytes(make_result(ranks=[_cuda_rank(0, 10, 12), _cuda_rank(1, 10, None)])) is None
    assert allocator_slack_share(make_result()) is None  # RSS on a CPU: no allocator to read


def test_training_state_is_counted_per_rank_and_said_in_the_summary():
    ddp = make_result(ranks=[_cuda_rank(0, 80_000, 90_000, 64_000), _cuda_rank(1, 80_000, 90_000, 64_000)])
    fsdp = make_result(ranks=[_cuda_rank(0, 48_000, 52_000, 32_000), _cuda_rank(1, 50_000, 52_000, 32_000)],
                       config=Config(parallel="fsdp", world_size=2))
    assert model_state_bytes(fsdp) == 32_000 << 20 and model_state_bytes(ddp) == 64_000 << 20
    assert "parameters sharded" in summary(fsdp) and "model state 32,000 MiB" in summary(fsdp)


# -- GPM: how busy the chip was inside "utilisation" ----------------------------------------------------------------
def test_gpm_activity_is_averaged_over_the_intervals_inside_the_measured_window():
    from tests.measured import H200_FP32_ACTIVITY, h200_result

    result = h200_result(activity=H200_FP32_ACTIVITY)
    start, end = result.measured_window()
    inside = [b for b, a in itertools.pairwise(result.telemetry) if b.t >= start and a.t <= end]
    assert len(inside) >= 13  # 3 s of 0.2 s intervals, the partial ones at either end left out
    assert mean_activity_pct(result, "sm_active_pct") == pytest.approx(61.0)
    assert mean_activity_pct(result, "tensor_active_pct") == pytest.approx(12.0)
    assert mean_activity_pct(result, "dram_bw_pct") == pytest.approx(35.0)
    text = "SM active 61%, tensor cores active 12%, SM occupancy 25%, DRAM bandwidth 35% (NVML GPM)"
    assert activity_text(result) == text
    assert utilisation_note(result).endswith(f"(each averages the time before it was read); {text}")
    assert f"  util        98%; {text}" in summary(result)
    again = BurstResult.from_json(result.to_json())
    assert activity_text(again) == text  # stored raw, read back the same


def test_warm_up_activity_is_not_averaged_in_and_no_gpm_reads_as_nothing():
    from tests.measured import H200_FP32_ACTIVITY, h200_result

    result = h200_result(activity=H200_FP32_ACTIVITY)
    start, _ = result.measured_window()
    busy_warm_up = [dataclasses.replace(t, tensor_active_pct=95.0) if t.t < start else t for t in result.telemetry]
    busy = dataclasses.replace(result, telemetry=busy_warm_up)
    assert mean_activity_pct(busy, "tensor_active_pct") == pytest.approx(12.0)
    plain = h200_result()
    assert mean_activity_pct(plain, "sm_active_pct") is None and activity_text(plain) == ""
    assert "GPM" not in utilisation_note(plain) and "  util        98%\n" in summary(plain) + "\n"


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
