"""Re-measuring a run paired with its baseline: the interleaving, the arithmetic of each pair, and the edges."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from accel_widgets import BurstError, Config
from accel_widgets.results.burst import BurstResult, ErrorInfo
from accel_widgets.search.remeasure import MIN_STEPS, paired_ratios, remeasure
from tests.panel.fakes import synthetic_result
from tests.workloads import tiny_workload

RUN = Config(num_workers=2)


@dataclass
class Scripted:
    """An engine whose bursts run at scripted rates: ``rate(config, call)`` samples/s; ``fail`` call numbers raise."""

    rate: Any
    fail: set[int] = field(default_factory=set)
    calls: list[tuple[Config, dict[str, Any]]] = field(default_factory=list)

    def __call__(self, workload: Any, config: Config, **kwargs: Any) -> BurstResult:
        self.calls.append((config, kwargs))
        call = len(self.calls)
        result = synthetic_result(config, step_s=32 / self.rate(config, call))  # 32 samples per step
        if call in self.fail:
            failed = BurstResult(workload="fake", config=config, status="failed", error=ErrorInfo("exception", "x"))
            raise BurstError("failed", failed)
        return result


def test_each_pair_is_the_run_over_the_mean_of_the_baselines_either_side() -> None:
    assert paired_ratios([100.0, 150.0, 100.0]) == [1.5]
    assert paired_ratios([100.0, 120.0, 140.0, 210.0, 160.0]) == pytest.approx([1.0, 1.4])
    with pytest.raises(ValueError, match="alternate"):
        paired_ratios([100.0, 150.0])


def test_bursts_interleave_baseline_and_run_and_a_drift_cancels() -> None:
    """The machine slows by 5% a burst (a neighbour ramping up): each pair still reads the true 1.5x."""
    engine = Scripted(lambda config, call: (150.0 if config == RUN else 100.0) * 0.95 ** call)
    done: list[tuple[int, int]] = []
    comparison = remeasure(tiny_workload(), RUN, Config(), pairs=3, engine=engine,
                           on_burst=lambda result, n, planned: done.append((n, planned)))
    assert [config for config, _ in engine.calls] == [Config(), RUN, Config(), RUN, Config(), RUN, Config()]
    assert done == [(n, 7) for n in range(1, 8)]
    assert all(kwargs["steps"] == MIN_STEPS and kwargs["label"].startswith("re-measure") for _, kwargs in engine.calls)
    assert comparison.ratios == pytest.approx([1.5 / ((1 + 0.95**2) / 2) * 0.95] * 3, rel=1e-6)
    speedup = comparison.speedup
    assert speedup is not None and speedup.n == 3 and speedup.median == pytest.approx(1.5, rel=0.002)
    assert "paired (IQR" in comparison.summary()


def test_a_run_measured_longer_is_re_measured_as_long_and_a_failed_burst_drops_its_pairs() -> None:
    long_run = synthetic_result(RUN, steps=60)
    engine = Scripted(lambda config, call: 100.0, fail={3})  # the second baseline burst fails
    comparison = remeasure(tiny_workload(), long_run, synthetic_result(), pairs=2, engine=engine)
    assert {kwargs["steps"] for _, kwargs in engine.calls} == {60}
    assert len(comparison.results) == 5 and comparison.results[2].status == "failed"
    assert comparison.ratios == []  # both pairs lean on the failed burst
    assert comparison.speedup is None and "no pair measured" in comparison.summary()


def test_stop_ends_the_comparison_with_the_pairs_so_far() -> None:
    stop = threading.Event()
    engine = Scripted(lambda config, call: (stop.set() if call == 3 else None) or 100.0)
    comparison = remeasure(tiny_workload(), RUN, Config(), pairs=4, engine=engine, stop=stop)
    assert comparison.stopped and len(comparison.results) == 3 and comparison.ratios == [1.0]


@pytest.mark.parametrize("pairs", [0, -1, 2.5, True])
def test_a_bad_pair_count_is_refused_before_any_burst(pairs: Any) -> None:
    engine = Scripted(lambda config, call: 100.0)
    with pytest.raises(ValueError, match="pairs="):
        remeasure(tiny_workload(), RUN, Config(), pairs=pairs, engine=engine)
    assert engine.calls == []
