import dataclasses
import itertools
import json
import math

import pytest

from accel_widgets import BurstResult, Config, ErrorInfo, RankSummary, StepRecord, TelemetrySample
from accel_widgets.knobs.compiling import CompileReport, GraphBreak, Recompile
from accel_widgets.views.text import summary
from tests.measured import as_measured


def _steps(rank: int, totals: list[float], warmup: int = 1) -> list[StepRecord]:
    return [StepRecord(rank, i, float(i), data_s=t * 0.25, h2d_s=0.0, compute_s=t * 0.75, total_s=t, samples=32,
                       loss=1.0 / (i + 1), warmup=i < warmup) for i, t in enumerate(totals)]


def _rank(rank: int, samples: int, seconds: float) -> RankSummary:
    return RankSummary(rank, samples, seconds, 100 << 20, "rss", setup_s=0.5, first_step_s=2.0, device="cpu")


def make_result(**overrides) -> BurstResult:
    fields = dict(
        workload="w", config=Config(compile_mode="default"), status="ok", world_size=2, warmup_steps=1,
        steps=_steps(0, [2.0, 0.1, 0.1, 0.1]) + _steps(1, [2.0, 0.1, 0.3, 0.1]),
        telemetry=[TelemetrySample(1.5, "psutil", 50.0, 1 << 20, "cpu"), TelemetrySample(2.5, "psutil", 70.0, 1 << 20)],
        ranks=[_rank(0, 96, 0.3), _rank(1, 96, 0.5)], tokens_per_sample=8,
    )
    fields.update(overrides)
    return as_measured(BurstResult(**fields))


def compile_report(breaks: int = 3, recompiles: int = 3) -> CompileReport:
    """What a rank's CompileWatch says of a model that prints in forward and gets a new length every step."""
    listed = (GraphBreak("Failed to trace builtin operator", "Dynamo does not know how to trace builtin operator "
                         "`print`", "Avoid calling builtin `print`.", "/src/model.py", 42, "forward", "print(x.shape)",
                         breaks),) if breaks else ()
    reasons = (Recompile("tensor 'x' size mismatch at index 1. expected 48, actual 64", "forward (model.py:40)",
                         recompiles),) if recompiles else ()
    return CompileReport("the whole model", 1 + breaks, breaks, listed, recompiles, reasons, 12.5)


def compiled_result(report: CompileReport | None = None) -> BurstResult:
    """``make_result`` whose ranks recorded ``report`` (a print in forward, a new shape every step by default)."""
    report = report or compile_report()
    return make_result(ranks=[dataclasses.replace(_rank(0, 96, 0.3), compile_report=report),
                              dataclasses.replace(_rank(1, 96, 0.5), compile_report=report)])


def test_throughput_sums_ranks_and_step_time_takes_the_slowest_rank():
    result = make_result()
    assert result.samples_per_s == pytest.approx(96 / 0.3 + 96 / 0.5)
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * 8)
    assert result.step_times() == [0.1, 0.3, 0.1]
    assert result.step_time.median == pytest.approx(0.1)


def test_shares_and_compile_time():
    result = make_result()
    assert result.data_wait_share == pytest.approx(0.25)
    assert result.compute_share == pytest.approx(0.75)
    assert result.compile_s == pytest.approx(2.0 - 0.1)
    assert make_result(config=Config()).compile_s is None
    assert result.mean_utilisation_pct == pytest.approx(60.0)


def test_json_round_trip_keeps_every_number_and_nan_losses():
    steps = _steps(0, [0.1, 0.1])
    steps[1] = StepRecord(0, 1, 1.0, 0.0, 0.0, 0.1, 0.1, 32, loss=float("nan"))
    failed = make_result(steps=steps, status="failed", error=ErrorInfo("exception", "ValueError: x", 1, "tb"))
    for original in (make_result(), failed):
        text = original.to_json()
        json.loads(text)  # strict JSON: no bare NaN
        assert "NaN" not in text
        loaded = BurstResult.from_json(text)
        assert loaded.samples_per_s == original.samples_per_s
        assert loaded.config == original.config
        assert loaded.error == original.error
        assert loaded.step_times() == original.step_times()
    assert math.isnan(BurstResult.from_json(failed.to_json()).losses()[1])


def test_the_compile_report_is_merged_over_ranks_and_survives_json():
    result = compiled_result()
    assert result.compile_report == compile_report()  # two ranks, the same account: counted once
    assert BurstResult.from_json(result.to_json()).compile_report == result.compile_report
    assert make_result().compile_report is None


def make_diverged(**overrides) -> BurstResult:
    """A finished burst whose rank 1 loss went NaN at step 2, marked the way the launcher marks it."""
    steps = _steps(0, [2.0, 0.1, 0.1, 0.1]) + [
        dataclasses.replace(s, loss=math.nan) if s.step >= 2 else s for s in _steps(1, [2.0, 0.1, 0.3, 0.1])]
    result = make_result(steps=steps, **overrides)
    result.error = result.divergence()
    result.status = "diverged"
    return result


def test_divergence_names_the_rank_and_step_and_keeps_the_numbers():
    assert make_result().divergence() is None
    result = make_diverged()
    assert result.nonfinite_losses() == ["loss is NaN from step 2 on rank 1 (2 of 4 steps not finite)"]
    assert result.error.kind == "diverged" and result.error.rank == 1
    assert result.error.message.startswith("loss is NaN from step 2 on rank 1 (2 of 4 steps not finite): training "
                                           "diverged. The throughput was measured, but a run that does not train")
    assert not result.ok  # numbers, but no valid speed-up
    assert result.samples_per_s == pytest.approx(96 / 0.3 + 96 / 0.5)
    inf = make_result(world_size=1, ranks=[_rank(0, 96, 0.3)],
                      steps=[dataclasses.replace(s, loss=-math.inf) for s in _steps(0, [2.0, 0.1])])
    assert inf.divergence().message.startswith("loss is -inf from step 0 (2 of 2 steps not finite)")
    assert inf.divergence().rank is None


def test_diverged_status_round_trips_json():
    original = make_diverged()
    loaded = BurstResult.from_json(original.to_json())
    assert loaded.status == "diverged" and loaded.error == original.error
    assert loaded.nonfinite_losses() == original.nonfinite_losses()


def _windowed(telemetry: list[TelemetrySample], steps: list[StepRecord] | None = None) -> BurstResult:
    """One rank; warm-up step 0 ends at 10.0 (a compile), measured steps 1-3 run from 10.0 to 10.3."""
    if steps is None:
        steps = [StepRecord(0, i, 10.0 + 0.1 * i, 0.0, 0.0, 0.1, 10.0 if i == 0 else 0.1, 32, warmup=i == 0)
                 for i in range(4)]
    return make_result(world_size=1, steps=steps, ranks=[_rank(0, 96, 0.3)], telemetry=telemetry)


def _host_sample(t: float, util: float, host: float, loader: float, iowait: float) -> TelemetrySample:
    return TelemetrySample(t, "psutil", util, 1 << 20, "cpu", host_util_pct=host, loader_util_pct=loader,
                           iowait_pct=iowait)


def test_telemetry_means_cover_the_measured_window_only():
    setup = [_host_sample(0.1 * k, util=5.0, host=95.0, loader=0.0, iowait=40.0) for k in range(100)]  # compiling
    measured = [_host_sample(10.0, 80.0, 90.0, 20.0, 2.0), _host_sample(10.15, 60.0, 70.0, 30.0, 4.0),
                _host_sample(10.3, 70.0, 95.0, 10.0, 0.0)]
    after = [_host_sample(10.4, 0.0, 50.0, 0.0, 0.0)]  # the profiler / teardown after the window
    result = _windowed(setup + measured + after)
    assert result.measured_window() == pytest.approx((10.0, 10.3))
    assert result.measured_telemetry() == measured
    assert result.mean_utilisation_pct == pytest.approx(70.0)
    assert result.loader_cpu_pct == pytest.approx(20.0)
    assert result.iowait_pct == pytest.approx(2.0)
    assert result.foreign_cpu_pct == pytest.approx((10.0 + 10.0 + 25.0) / 3)


def test_the_window_spans_every_rank():
    steps = [StepRecord(0, 1, 2.0, 0.0, 0.0, 0.5, 0.5, 32), StepRecord(1, 1, 2.2, 0.0, 0.0, 0.5, 0.5, 32),
             StepRecord(0, 2, 3.0, 0.0, 0.0, 1.0, 1.0, 32), StepRecord(1, 2, 3.4, 0.0, 0.0, 1.2, 1.2, 32)]
    result = _windowed([], steps)
    assert result.measured_window() == pytest.approx((1.5, 3.4))


def test_without_measured_steps_every_sample_counts_and_an_empty_window_reads_nothing():
    samples = [TelemetrySample(0.5, "psutil", 30.0, 1 << 20), TelemetrySample(0.6, "psutil", 50.0, 1 << 20)]
    warmup_only = [StepRecord(0, 0, 5.0, 0.0, 0.0, 4.0, 4.0, 32, warmup=True)]  # failed after the first step
    failed = _windowed(samples, warmup_only)
    assert failed.measured_window() is None and failed.mean_utilisation_pct == pytest.approx(40.0)
    assert _windowed(samples).mean_utilisation_pct is None  # measured 10.0-10.3 s: no sample in it


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
    assert _gpu_window(3.0, mig + full).mean_utilisation_pct == pytest.approx(90.0)
    assert _gpu_window(3.0, mig).mean_utilisation_pct is None


def test_nvml_utilisation_counts_from_one_averaging_period_into_the_window():
    """NVML's reading at t averages the second before t: the first second's readings still hold the compile."""
    compile_idle = [_nvml(0.1 * k, 5.0) for k in range(100)]
    ramp = [_nvml(10.0 + 0.1 * k, 5.0 + 9.0 * k) for k in range(10)]  # still averaging the idle compile
    settled = [_nvml(11.0 + 0.1 * k, 95.0) for k in range(21)]
    result = _gpu_window(3.0, compile_idle + ramp + settled)
    assert result.measured_window() == pytest.approx((10.0, 13.0))
    assert result.mean_utilisation_pct == pytest.approx(95.0)  # the read-time window would say ~75%
    assert result.utilisation_note.startswith("NVML's readings taken at least 1 s into the measured window")
    assert "  util        95%" in summary(result)


def test_a_window_under_two_seconds_is_too_short_to_read_nvml_utilisation():
    result = _gpu_window(1.5, [_nvml(10.0 + 0.1 * k, 80.0) for k in range(16)])
    assert result.mean_utilisation_pct is None
    assert result.utilisation_note == ("too short to read: NVML's utilisation averages the last 1 s, and the measured "
                                       "window is 1.5 s (measure at least 2 s)")
    assert "  util        too short to read" in summary(result)
    assert _gpu_window(2.0, [_nvml(10.0 + 0.1 * k, 80.0) for k in range(21)]).mean_utilisation_pct == 80.0


def _on_gpus(config: Config, world_size: int, gpus: int) -> BurstResult:
    flops = 1e12  # per sample: rank 0 trains 96 samples in 0.3 s, every rank alike
    ranks = [dataclasses.replace(_rank(r, 96, 0.3), flops_per_sample=flops) for r in range(world_size)]
    return make_result(config=config, world_size=world_size, ranks=ranks,
                       environment={"device_kind": "cuda", "device_name": "NVIDIA H200",
                                    "gpus": ["NVIDIA H200"] * gpus})


def test_mfu_divides_by_every_gpu_the_burst_used():
    peak = 989.4e12  # H200 dense bf16
    dataparallel = _on_gpus(Config(parallel="dataparallel", precision="bf16"), world_size=1, gpus=4)
    assert dataparallel.gpus_used == 4  # one process, four GPUs
    assert dataparallel.mfu == pytest.approx(96 / 0.3 * 1e12 / (4 * peak))
    ddp = _on_gpus(Config(parallel="ddp", world_size=2, precision="bf16"), world_size=2, gpus=4)
    assert ddp.gpus_used == 2  # one GPU per rank, two of the four visible ones
    assert ddp.mfu == pytest.approx(2 * 96 / 0.3 * 1e12 / (2 * peak))
    single = _on_gpus(Config(precision="bf16"), world_size=1, gpus=4)
    assert single.gpus_used == 1 and single.mfu == pytest.approx(96 / 0.3 * 1e12 / peak)
    assert make_result().gpus_used == 0 and make_result().mfu is None  # a CPU burst


H200_MIB = 143_771  # NVML's total for one H200


def _cuda_rank(rank: int, allocated_mib: int, reserved_mib: int | None, state_mib: int | None = None) -> RankSummary:
    return RankSummary(rank, 96, 0.3, allocated_mib << 20, "cuda_allocator", 0.5, 2.0, "NVIDIA H200",
                       peak_reserved_bytes=None if reserved_mib is None else reserved_mib << 20,
                       model_state_bytes=None if state_mib is None else state_mib << 20)


def test_reserved_against_allocated_reads_the_allocators_slack_per_rank():
    """At an H200's sizes: a rank whose allocator held 131,000 MiB for a peak of 98,250 MiB allocated kept 25% of what
    the device gave it unused at its busiest (fragmentation: what expandable segments shrink)."""
    result = make_result(ranks=[_cuda_rank(0, 98_250, 131_000), _cuda_rank(1, 120_000, 124_000)])
    assert result.peak_memory_bytes == 120_000 << 20 and result.peak_reserved_bytes == 131_000 << 20
    assert result.peak_reserved_bytes < H200_MIB << 20
    assert result.allocator_slack_share == pytest.approx(1 - 98_250 / 131_000)  # the worse of the two ranks
    line = next(line for line in summary(result).splitlines() if line.lstrip().startswith("peak mem"))
    assert line.endswith("120,000 MiB (cuda_allocator) per rank: the busiest of 2; reserved 131,000 MiB (25% of it "
                         "never allocated at once)")
    again = BurstResult.from_json(result.to_json())
    assert again.peak_reserved_bytes == result.peak_reserved_bytes and again.allocator_slack_share == \
        result.allocator_slack_share
    assert make_result(ranks=[_cuda_rank(0, 10, 12), _cuda_rank(1, 10, None)]).peak_reserved_bytes is None
    assert make_result().allocator_slack_share is None  # RSS on a CPU: no allocator to read


def test_training_state_is_counted_per_rank_and_said_in_the_summary():
    ddp = make_result(ranks=[_cuda_rank(0, 80_000, 90_000, 64_000), _cuda_rank(1, 80_000, 90_000, 64_000)])
    fsdp = make_result(ranks=[_cuda_rank(0, 48_000, 52_000, 32_000), _cuda_rank(1, 50_000, 52_000, 32_000)],
                       config=Config(parallel="fsdp", world_size=2))
    assert fsdp.model_state_bytes == 32_000 << 20 and ddp.model_state_bytes == 64_000 << 20
    assert "parameters sharded" in summary(fsdp) and "model state 32,000 MiB" in summary(fsdp)


# -- GPM: how busy the chip was inside "utilisation" ----------------------------------------------------------------
def test_gpm_activity_is_averaged_over_the_intervals_inside_the_measured_window():
    from tests.measured import H200_FP32_ACTIVITY, h200_result

    result = h200_result(activity=H200_FP32_ACTIVITY)
    start, end = result.measured_window()
    inside = [b for b, a in itertools.pairwise(result.telemetry) if b.t >= start and a.t <= end]
    assert len(inside) >= 13  # 3 s of 0.2 s intervals, the partial ones at either end left out
    assert result.mean_sm_active_pct == pytest.approx(61.0) and result.mean_tensor_active_pct == pytest.approx(12.0)
    assert result.mean_activity_pct("dram_bw_pct") == pytest.approx(35.0)
    text = "SM active 61%, tensor cores active 12%, SM occupancy 25%, DRAM bandwidth 35% (NVML GPM)"
    assert result.activity_text() == text
    assert result.utilisation_note.endswith(f"(each averages the time before it was read); {text}")
    assert f"  util        98%; {text}" in summary(result)
    again = BurstResult.from_json(result.to_json())
    assert again.activity_text() == text  # stored raw, read back the same


def test_warm_up_activity_is_not_averaged_in_and_no_gpm_reads_as_nothing():
    from tests.measured import H200_FP32_ACTIVITY, h200_result

    result = h200_result(activity=H200_FP32_ACTIVITY)
    start, _ = result.measured_window()
    busy_warm_up = [dataclasses.replace(t, tensor_active_pct=95.0) if t.t < start else t for t in result.telemetry]
    assert dataclasses.replace(result, telemetry=busy_warm_up).mean_tensor_active_pct == pytest.approx(12.0)
    plain = h200_result()
    assert plain.mean_sm_active_pct is None and plain.activity_text() == ""
    assert "GPM" not in plain.utilisation_note and "  util        98%\n" in summary(plain) + "\n"
