"""Held bursts for real: ranks that stay after their first window and measure more, each window on training state
built afresh, idle and unsampled between windows, and gone when closed, failed or stopped."""

from __future__ import annotations

import threading

import psutil
import pytest

import accel_widgets as aw
from accel_widgets.engine.held import HeldBurst
from tests.devices import cpu_device
from tests.workloads import FailsOnceFlagged, tiny_workload


def _ranks_and_workers(held: HeldBurst) -> list[psutil.Process]:
    family = []
    for process in held._ranks.context.processes:
        rank = psutil.Process(process.pid)
        family += [rank, *rank.children(recursive=True)]
    return family


def test_a_held_burst_measures_window_after_window_on_rebuilt_state() -> None:
    with HeldBurst(tiny_workload(), aw.Config(num_workers=1), steps=5,
                   options=aw.BurstOptions(device=cpu_device())) as held:
        assert held.first.ok and len(held.first.step_times()) == 5
        workers_before = {p.pid for p in _ranks_and_workers(held)}
        windows = [held.measure(8, label="again") for _ in range(2)]
        workers_after = {p.pid for p in _ranks_and_workers(held)}
    for window in windows:
        assert window.ok and window.label == "again" and len(window.step_times()) == 8
        assert window.warmup_steps == held.warmup_steps and window.ranks[0].setup_s > 0  # built again, warmed up
        assert window.samples_per_s and window.ranks[0].code_paths == held.first.ranks[0].code_paths
        assert window.losses()[:7] == held.first.losses()  # same weights and data order every window (2 + 5 steps)
    # Each window's loader worker replaced the last one's: a rank never has two sets competing for the cores.
    assert len(workers_after) == len(workers_before) == 2 and workers_after != workers_before
    # One clock for the whole held burst, and nothing is sampled while it waits.
    assert windows[0].steps[0].t > held.first.steps[-1].t
    first_end, second_start = windows[0].measured_window()[1], windows[1].steps[0].t
    assert not [s for s in windows[1].telemetry if first_end + 0.5 < s.t < second_start - 0.5]
    assert not held.alive


def test_a_held_ddp_burst_measures_its_windows_on_every_rank() -> None:
    with HeldBurst(tiny_workload(), aw.Config(parallel="ddp", world_size=2), steps=4,
                   options=aw.BurstOptions(device=cpu_device())) as held:
        window = held.measure(6)
    assert window.ok and window.world_size == 2 and {r.rank for r in window.ranks} == {0, 1}
    assert len(window.step_times()) == 6


def test_a_failing_window_raises_and_ends_the_held_ranks(tmp_path) -> None:
    flag = tmp_path / "fail"
    held = HeldBurst(tiny_workload(FailsOnceFlagged(str(flag))), aw.Config(), steps=3,
                     options=aw.BurstOptions(device=cpu_device()))
    family = _ranks_and_workers(held)
    flag.touch()
    with pytest.raises(aw.WorkerError, match="flagged to fail") as caught:
        held.measure(3)
    assert caught.value.result.status == "failed" and not held.alive
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    with pytest.raises(RuntimeError, match="ranks are gone"):
        held.measure(3)
    held.close()  # idempotent after a failure


def test_stop_during_a_window_ends_it_and_the_ranks() -> None:
    stop = threading.Event()
    held = HeldBurst(tiny_workload(), aw.Config(), steps=3, options=aw.BurstOptions(device=cpu_device()))

    def stopping(event: object) -> None:
        if isinstance(event, aw.StepRecord) and not event.warmup:
            stop.set()

    window = held.measure(100_000, on_event=stopping, stop=stop)
    assert window.status == "stopped" and not held.alive
    held.close()


def test_a_first_window_that_fails_raises_like_run_burst_and_leaves_nothing(tmp_path) -> None:
    flag = tmp_path / "fail"
    flag.touch()
    with pytest.raises(aw.WorkerError, match="flagged to fail"):
        HeldBurst(tiny_workload(FailsOnceFlagged(str(flag))), aw.Config(), steps=3,
                  options=aw.BurstOptions(device=cpu_device()))
    with HeldBurst(tiny_workload(), aw.Config(), steps=3, options=aw.BurstOptions(device=cpu_device())) as held, \
            pytest.raises(ValueError, match="steps"):
        held.measure(0)


def test_a_window_ends_at_its_time_cap_on_a_machine_slower_than_planned() -> None:
    with HeldBurst(tiny_workload(), aw.Config(), steps=3, options=aw.BurstOptions(device=cpu_device())) as held:
        window = held.measure(10_000_000, cap_s=0.5)
    assert window.ok and 0 < len(window.step_times()) < 10_000_000
    assert 0.45 < window.ranks[0].measured_s < 1.5 and window.samples_per_s


def test_a_held_burst_refuses_to_train_in_the_caller() -> None:
    """Held ranks wait between windows as processes: there is no in-process form of that, so it is refused before
    anything starts."""
    with pytest.raises(aw.BurstRequestError, match="isolation='inprocess' cannot be held"):
        HeldBurst(tiny_workload(), aw.Config(), steps=3, options=aw.BurstOptions(isolation="inprocess"))
