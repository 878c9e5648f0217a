"""DDP bursts on the CPU (gloo, 2 ranks): the same worker code as one rank, and every fault torn down."""

import _thread
import socket
import statistics
import threading
import time

import pytest

from accel_widgets import BurstTimeout, Config, StepRecord, WorkerCrashed, WorkerError, run_burst
from accel_widgets.engine import launcher
from tests.workloads import FailAt, tiny_workload

DDP = Config(parallel="ddp", world_size=2)


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        # As any server would: a connection killed mid-burst leaves TIME_WAIT, which is not a listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture
def recorded_port(monkeypatch):
    """The rendezvous port each burst picked, to check it is free again afterwards."""
    ports = []
    original = launcher.free_port

    def record() -> int:
        ports.append(original())
        return ports[-1]

    monkeypatch.setattr(launcher, "free_port", record)
    return ports


def test_two_ranks_stream_live_and_merge(recorded_port):
    latencies, ranks_seen = [], set()
    started = time.perf_counter()

    def on_event(event):
        if isinstance(event, StepRecord):
            latencies.append(time.perf_counter() - started - event.t)
            ranks_seen.add(event.rank)

    result = run_burst(tiny_workload(), DDP, steps=10, on_event=on_event)
    assert result.ok and ranks_seen == {0, 1}
    assert len(result.measured_steps(rank=0)) == len(result.measured_steps(rank=1)) == 10
    assert statistics.median(latencies) < 0.05  # a rank's step reaches the caller within 50 ms
    assert result.straggler_rank in (0, 1)
    assert _port_is_free(recorded_port[0])


def test_scaling_efficiency_against_one_rank():
    single = run_burst(tiny_workload(), Config(), steps=10)
    double = run_burst(tiny_workload(), DDP, steps=10)
    efficiency = double.scaling_efficiency(single)
    assert efficiency == pytest.approx(double.samples_per_s / (2 * single.samples_per_s))
    assert single.scaling_efficiency(single) == pytest.approx(1.0)


def test_ranks_see_disjoint_shards_of_the_same_seeded_order():
    workload = tiny_workload()
    first, second = run_burst(workload, DDP, steps=4), run_burst(workload, DDP, steps=4)
    assert first.losses(rank=0) == second.losses(rank=0)
    assert first.losses(rank=0) != first.losses(rank=1)


def test_accumulation_under_ddp():
    result = run_burst(tiny_workload(), DDP.replace(grad_accum_steps=2, batch_size=16), steps=4)
    assert result.ok and result.ranks[0].measured_samples == 4 * 32


def test_a_failing_rank_is_named_with_its_own_traceback(recorded_port):
    started = time.perf_counter()
    with pytest.raises(WorkerError) as info:
        run_burst(tiny_workload(FailAt("raise", at_call=4, rank=1)), DDP, steps=20)
    assert time.perf_counter() - started < 5.0
    error = info.value
    assert error.result.error.rank == 1
    assert "rank 1 failed: ValueError: deliberate failure at call 4" in str(error)
    assert "Connection closed by peer" not in error.result.error.traceback
    assert _port_is_free(recorded_port[0])


def test_a_killed_rank_takes_the_group_down():
    with pytest.raises(WorkerCrashed, match="rank 0 was killed by SIGKILL") as info:
        run_burst(tiny_workload(FailAt("kill", at_call=4, rank=0)), DDP, steps=20)
    assert info.value.result.error.rank == 0


def test_a_rank_stuck_in_a_collective_is_stopped_by_the_timeout(recorded_port):
    started = time.perf_counter()
    with pytest.raises(BurstTimeout):
        run_burst(tiny_workload(FailAt("hang", at_call=4, rank=1)), DDP, steps=20, timeout_s=4.0)
    assert time.perf_counter() - started < 8.0
    assert _port_is_free(recorded_port[0])


def test_stop_tears_down_every_rank_quickly():
    stop = threading.Event()
    pressed = []

    def on_event(event):
        if isinstance(event, StepRecord) and event.step == 3 and not stop.is_set():
            stop.set()
            pressed.append(time.perf_counter())

    result = run_burst(tiny_workload(FailAt("hang", at_call=8, rank=1)), DDP, steps=100, on_event=on_event, stop=stop)
    assert result.status == "stopped"
    assert time.perf_counter() - pressed[0] < 2.0


def test_keyboard_interrupt_in_the_caller_stops_all_ranks():
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    started = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_burst(tiny_workload(FailAt("hang", at_call=3, rank=0)), DDP, steps=100)
    finally:
        timer.cancel()
        timer.join()
    assert time.perf_counter() - started < 1.5 + 2.0


def test_the_next_ddp_burst_works_after_faults():
    with pytest.raises(WorkerError):
        run_burst(tiny_workload(FailAt("raise", at_call=2, rank=0)), DDP, steps=5)
    assert run_burst(tiny_workload(), DDP, steps=3).ok


def test_one_rank_ddp_still_wraps_the_model_to_measure_its_overhead():
    result = run_burst(tiny_workload(), Config(parallel="ddp", world_size=1), steps=4)
    assert result.ok and len(result.ranks) == 1
    assert result.environment["model_wrappers"] == ["DistributedDataParallel", "TinyNet"]


@pytest.mark.parametrize(
    "changes",
    [
        {"num_workers": 1, "data_cache": "memmap", "persistent_workers": True},
        {"precision": "bf16", "sync_every": 0, "optimizer_impl": "foreach", "set_to_none": False},
        {"script_loss": True, "deterministic": True},
    ],
    ids=lambda c: ",".join(c),
)
def test_knobs_compose_with_ddp(changes):
    result = run_burst(tiny_workload(), DDP.replace(**changes), steps=4)
    assert result.ok and len(result.ranks) == 2


def test_channels_last_composes_with_ddp():
    from tests.workloads import conv_workload

    assert run_burst(conv_workload(), DDP.replace(channels_last=True), steps=3).ok



def test_a_rank_dying_after_it_finished_keeps_the_measurement():
    """gloo can abort a rank in teardown after it sent its summary: the measurement is complete, keep it."""
    from accel_widgets.engine.launcher import _Collected, _finish
    from accel_widgets.results import BurstResult
    from tests.test_results import _rank

    collected = _Collected(ranks={0: _rank(0, 96, 0.3), 1: _rank(1, 96, 0.5)}, exit_codes=[0, -6])
    result = _finish(BurstResult("w", DDP, "ok", world_size=2), collected, "failed", time.perf_counter(), 60.0)
    assert result.ok and result.samples_per_s > 0
    assert any("rank 1 was killed by SIGABRT" in w and "after finishing" in w for w in result.warnings)
