import dataclasses
import json
import math

import pytest

from accel_widgets import BurstResult, Config, StepRecord
from accel_widgets.knobs.compiling import CompileReport, GraphBreak, Recompile
from accel_widgets.results.burst import ErrorInfo, RankSummary, TelemetrySample
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


#: A burst's host samples: compiling (a busy machine, idle workers) until 10.0 s, measured to 10.3 s, then teardown.
HOST_SETUP = [_host_sample(0.1 * k, util=5.0, host=95.0, loader=0.0, iowait=40.0) for k in range(100)]
HOST_MEASURED = [_host_sample(10.0, 80.0, 90.0, 20.0, 2.0), _host_sample(10.15, 60.0, 70.0, 30.0, 4.0),
            _host_sample(10.3, 70.0, 95.0, 10.0, 0.0)]
HOST_AFTER = [_host_sample(10.4, 0.0, 50.0, 0.0, 0.0)]  # the profiler / teardown after the window


def test_the_measured_window_and_its_telemetry_leave_setup_and_teardown_out():
    result = _windowed(HOST_SETUP + HOST_MEASURED + HOST_AFTER)
    assert result.measured_window() == pytest.approx((10.0, 10.3))
    assert result.measured_telemetry() == HOST_MEASURED


def test_the_window_spans_every_rank():
    steps = [StepRecord(0, 1, 2.0, 0.0, 0.0, 0.5, 0.5, 32), StepRecord(1, 1, 2.2, 0.0, 0.0, 0.5, 0.5, 32),
             StepRecord(0, 2, 3.0, 0.0, 0.0, 1.0, 1.0, 32), StepRecord(1, 2, 3.4, 0.0, 0.0, 1.2, 1.2, 32)]
    result = _windowed([], steps)
    assert result.measured_window() == pytest.approx((1.5, 3.4))
