"""The comparison engine on scripted engines: interleaving, verdicts, the budget, failures, loaded windows, and
several configs at once. Held ranks for real: tests/engine/test_held.py; calibration: benchmarks/calibration.py."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

from accel_widgets import BurstOptions, Config
from accel_widgets.results.burst import BurstResult
from accel_widgets.search.bursts import Bursts
from accel_widgets.search.compare import (
    MAX_WINDOW_S,
    MIN_WINDOW_STEPS,
    WINDOW_S,
    WINDOW_SE,
    compare,
    measure_pairs,
    window_steps,
)
from accel_widgets.search.remeasure import MIN_STEPS, remeasure
from tests.panel.fakes import synthetic_result
from tests.search.machines import Machine, noisy
from tests.workloads import tiny_workload

A, B, C = Config(), Config(num_workers=2), Config(num_workers=2, pin_memory=True)


def run(machine: Machine, a: Config = A, b: Config = B, **kwargs: Any):
    kwargs.setdefault("budget_s", 120.0)
    return measure_pairs(tiny_workload(), [a, b], [(0, 1)], engine=machine, clock=machine.clock, steps=20,
                         **kwargs).comparisons[0]


def test_windows_interleave_in_balanced_blocks_and_a_drift_cancels() -> None:
    """A machine slowing 4% a window, B truly 1.5x: every block reads 1.5x, the verdict is faster."""
    machine = Machine(lambda config, call: 1000 * (1.5 if config == B else 1.0) * 0.96 ** call)
    found = run(machine)
    order = [config for config, _ in machine.calls]
    # The first bursts (in no block), then blocks back and forth: B A A B from the one opened last, A B B A.
    assert order[:10] == [A, B, B, A, A, B, A, B, B, A]
    assert found.firsts[0].config == A and found.firsts[1].config == B and len(found.windows) == 4 * 4
    assert found.verdict == "faster" and found.stopped.startswith("settled")
    assert all(r == pytest.approx(math.log(1.5)) for r in found.log_ratios)
    assert found.ratio == pytest.approx(1.5)
    assert len(found.counted) == 4  # the fewest blocks that bound anything
    assert [kwargs["steps"] for _, kwargs in machine.calls[:2]] == [20, 20]  # the first bursts: the asked length
    assert all(kwargs["steps"] >= MIN_WINDOW_STEPS for _, kwargs in machine.calls[2:])


def test_same_vs_same_settles_on_same_with_its_bound_and_the_noise_it_saw() -> None:
    found = run(Machine(noisy({}, sd=0.01)), A, A)
    assert found.same_config and found.verdict == "same"
    assert found.interval.reach < 0.05
    noise = found.noise
    assert noise is not None and noise.between > 0 and noise.dominant == "drift"  # synthetic steps do not spread
    assert min(found.window_ratios) < 1 < max(found.window_ratios)


def test_a_noisy_machine_ends_undecided_within_the_budget() -> None:
    machine = Machine(noisy({B: 1.02}, sd=0.15), overhead_s=0.5)
    found = run(machine, budget_s=30.0)
    assert found.verdict == "undecided" and found.stopped.startswith("budget")
    assert machine.now <= 30.0 * 1.1
    assert found.ratio is not None and found.interval.low < 1 < found.interval.high


def test_a_failing_window_ends_the_comparison_with_its_error() -> None:
    found = run(Machine(noisy({B: 1.2}), fail={4}))
    assert found.error == "RuntimeError: boom" and found.verdict == "undecided"
    assert found.stopped == "failed: RuntimeError: boom"


def test_a_window_beside_other_load_leaves_its_block_out_and_is_measured_again() -> None:
    machine = Machine(lambda config, call: 1000 * (1.3 if config == B else 1.0), loaded={3})
    found = run(machine)
    assert found.blocks[0].left_out.startswith("other load took")
    assert found.verdict == "faster" and len(found.counted) == 4 and len(found.blocks) == 5


def test_stop_ends_it_after_the_running_window() -> None:
    stop = threading.Event()
    machine = Machine(noisy({B: 1.01}, sd=0.2))
    original = machine.__call__

    def stopping(workload: Any, config: Config, **kwargs: Any) -> BurstResult:
        if len(machine.calls) == 5:
            stop.set()
        return original(workload, config, **kwargs)

    found = measure_pairs(tiny_workload(), [A, B], [(0, 1)], engine=stopping, clock=machine.clock, stop=stop,
                          steps=20).comparisons[0]
    assert found.stopped.startswith("stopped") and len(machine.calls) <= 7


def test_several_configs_spend_their_windows_where_a_verdict_is_open() -> None:
    """C is far faster than both: its pairs settle early and it leaves the sweeps, A against B goes on."""
    machine = Machine(noisy({C: 3.0}, sd=0.02))
    found = measure_pairs(tiny_workload(), [A, B, C], [(0, 1), (0, 2), (1, 2)], engine=machine, clock=machine.clock,
                          steps=20, budget_s=200.0).comparisons
    assert [f.verdict for f in found[1:]] == ["faster", "faster"]
    assert found[0].verdict in ("same", "undecided")
    assert len(found[0].counted) > len(found[1].counted)
    counts = {config: sum(c == config for c, _ in machine.calls) for config in (A, B, C)}
    assert counts[C] < counts[A] and counts[C] < counts[B]


def test_window_length_follows_the_first_burst() -> None:
    fast = synthetic_result(steps=20, step_s=0.002)
    slow = synthetic_result(steps=20, step_s=0.5)
    assert window_steps(fast) == math.ceil(WINDOW_S / 0.002)
    assert window_steps(slow) == max(MIN_WINDOW_STEPS, math.ceil(WINDOW_S / 0.5))
    # Steps alternating 20% either side (IQR 40% of the median, an SD of 30%) need (0.30 / WINDOW_SE)^2 of them ...
    spread = synthetic_result(steps=20, step_s=0.002, jitter=0.2)
    assert window_steps(spread) == math.ceil((0.4 / 1.349 / WINDOW_SE) ** 2) > WINDOW_S / 0.002
    wild = synthetic_result(steps=20, step_s=0.002, jitter=0.5)  # ... up to MAX_WINDOW_S of them
    assert window_steps(wild) == math.ceil(MAX_WINDOW_S / 0.002)
    assert window_steps(wild, WINDOW_S / 2) == math.ceil(MAX_WINDOW_S / 2 / 0.002)  # a ladder's shorter windows


def test_bad_arguments_fail_before_any_burst() -> None:
    machine = Machine(noisy({}))
    for kwargs, message in (({"budget_s": 0}, "budget_s"), ({"budget_s": math.inf}, "budget_s"),
                            ({"min_effect": 1.5}, "min_effect"), ({"min_effect": True}, "min_effect")):
        with pytest.raises(ValueError, match=message):
            compare(tiny_workload(), A, B, engine=machine, **kwargs)
    with pytest.raises(TypeError, match=r"accel_widgets\.Config"):
        compare(tiny_workload(), A, {"num_workers": 2}, engine=machine)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pairs"):
        measure_pairs(tiny_workload(), [A, B], [(0, 0)], engine=machine)
    assert machine.calls == []


def test_remeasure_is_the_comparison_of_a_run_and_its_baseline() -> None:
    machine = Machine(noisy({B: 1.4}))
    long_run = synthetic_result(B, steps=50)
    found = remeasure(tiny_workload(), long_run, A, engine=machine)
    assert found.verdict == "faster" and found.subject == B and found.reference == A
    assert machine.calls[0][1]["steps"] == 50 and machine.calls[0][1]["label"] == "re-measure: baseline"
    short = remeasure(tiny_workload(), B, A, engine=Machine(noisy({B: 1.4})))
    assert short.firsts[0].label == "re-measure: baseline" and len(short.firsts[0].step_times()) == MIN_STEPS


def test_a_search_gives_its_engine_options_only_where_it_adds_some() -> None:
    """An engine that fixes options of its own (a ``partial``) keeps them wherever the search adds none: a keyword
    given, even None, would replace them."""
    machine = Machine(lambda config, call: 1000.0)
    Bursts(machine, steps=5).run(tiny_workload(), A)
    Bursts(machine, steps=5).freeing(None).open(tiny_workload(), A)
    Bursts(machine, steps=5).freeing("data").run(tiny_workload(), A)
    measure_pairs(tiny_workload(), [A, B], [(0, 1)], engine=machine, clock=machine.clock, steps=5, budget_s=1.0,
                  timeout_s=30.0)
    added = [kwargs.get("options") for _, kwargs in machine.calls]
    assert added[:2] == [None, None] and added[2] == BurstOptions(freed="data")
    assert added[3:] and all(options == BurstOptions(timeout_s=30.0) for options in added[3:])


def test_a_config_opened_before_runs_first_and_the_first_block_goes_on_from_the_one_opened_last() -> None:
    """The panel's Run: the run's first burst came first, the baseline's is opened now; the first block then goes on
    from the baseline: baseline, run, run, baseline (A B B A), a drift over it cancelling still."""
    machine = Machine(lambda config, call: 1000 * (1.5 if config == B else 1.0) * 0.95 ** call)
    run_first = Bursts(machine, steps=20).open(tiny_workload(), B, label="run")
    found = measure_pairs(tiny_workload(), [A, B], [(0, 1)], engine=machine, clock=machine.clock, steps=20,
                          opened={1: run_first}, budget_s=120.0).comparisons[0]
    assert [config for config, _ in machine.calls[:6]] == [B, A, A, B, B, A]
    assert all(r == pytest.approx(math.log(1.5)) for r in found.log_ratios) and found.verdict == "faster"
