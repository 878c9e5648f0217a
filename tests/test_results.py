import json
import math

import pytest

from accel_widgets import BurstResult, Config, ErrorInfo, RankSummary, StepRecord, TelemetrySample


def _steps(rank: int, totals: list[float], warmup: int = 1) -> list[StepRecord]:
    return [StepRecord(rank, i, float(i), data_s=t * 0.25, h2d_s=0.0, compute_s=t * 0.75, total_s=t, samples=32,
                       loss=1.0 / (i + 1), warmup=i < warmup) for i, t in enumerate(totals)]


def _rank(rank: int, samples: int, seconds: float) -> RankSummary:
    return RankSummary(rank, samples, seconds, 100 << 20, "rss", setup_s=0.5, first_step_s=2.0, device="cpu")


def make_result(**overrides) -> BurstResult:
    fields = dict(
        workload="w", config=Config(compile_mode="default"), status="ok", world_size=2, warmup_steps=1,
        steps=_steps(0, [2.0, 0.1, 0.1, 0.1]) + _steps(1, [2.0, 0.1, 0.3, 0.1]),
        telemetry=[TelemetrySample(0.5, "psutil", 50.0, 1 << 20, "cpu"), TelemetrySample(0.6, "psutil", 70.0, 1 << 20)],
        ranks=[_rank(0, 96, 0.3), _rank(1, 96, 0.5)], tokens_per_sample=8,
    )
    fields.update(overrides)
    return BurstResult(**fields)


def test_throughput_sums_ranks_and_step_time_takes_the_slowest_rank():
    result = make_result()
    assert result.samples_per_s == pytest.approx(96 / 0.3 + 96 / 0.5)
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * 8)
    assert result.step_times() == [0.1, 0.3, 0.1]
    assert result.step_time.median == pytest.approx(0.1)
    assert result.straggler_rank == 1


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


def test_summary_text_and_speedup():
    fast, slow = make_result(), make_result(ranks=[_rank(0, 96, 0.6), _rank(1, 96, 1.0)])
    assert fast.speedup_over(slow) == pytest.approx(2.0, rel=0.01)
    text = fast.summary()
    assert "samples/s" in text and "data wait 25%" in text and "compile" in text
    failed = make_result(status="failed", error=ErrorInfo("oom", "OutOfMemoryError: boom"))
    assert "OutOfMemoryError: boom" in failed.summary()
