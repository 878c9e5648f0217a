"""DDP bursts on the CPU (gloo, 2 ranks): the same worker code as one rank, and every fault torn down."""

import _thread
import contextlib
import functools
import ipaddress
import multiprocessing.forkserver
import os
import random
import re
import statistics
import threading
import time

import psutil
import pytest
import torch
import torch.nn.functional as F

from accel_widgets import BurstEngine, BurstOptions, Config, StepRecord, WorkerCrashed, WorkerError, Workload
from accel_widgets.analysis.compare import scaling_efficiency, straggler_rank
from accel_widgets.engine.launcher import SYNC_DEBUG_DDP_NOTE
from accel_widgets.engine.ranks import PUMP_TICK_S
from accel_widgets.engine.worker import STEP_BATCH_S
from tests.devices import cpu_device
from tests.workloads import FailAt, tiny_workload

DDP = Config(parallel="ddp", world_size=2)
run_burst = BurstEngine(BurstOptions(device=cpu_device()))  # gloo on the CPU, even where there are GPUs


def _burst_processes() -> list[psutil.Process]:
    """Every process forked from the forkserver (the ranks) and their descendants (loader workers)."""
    server = psutil.Process(multiprocessing.forkserver._forkserver._forkserver_pid)
    return server.children(recursive=True)


def listening_addresses(processes: list[psutil.Process]) -> set[str]:
    found = set()
    for process in processes:
        with contextlib.suppress(psutil.Error):
            found |= {c.laddr.ip for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN}
    return found


def test_two_ranks_stream_live_and_merge():
    latencies, ranks_seen = [], set()
    started = time.perf_counter()

    def on_event(event):
        if isinstance(event, StepRecord):
            latencies.append(time.perf_counter() - started - event.t)
            ranks_seen.add(event.rank)

    result = run_burst(tiny_workload(), DDP, steps=10, on_event=on_event)
    assert result.ok and ranks_seen == {0, 1}
    assert len(result.measured_steps(rank=0)) == len(result.measured_steps(rank=1)) == 10
    # A rank sends its steps at most STEP_BATCH_S after they end; the pump reads them once a tick.
    assert statistics.median(latencies) < PUMP_TICK_S + STEP_BATCH_S
    assert straggler_rank(result) in (0, 1)


def test_nothing_a_ddp_burst_opens_is_reachable_from_the_network():
    """The rendezvous is a file and gloo is pinned to loopback: every listening socket is on 127.0.0.0/8."""
    seen: list[set[str]] = []

    def on_event(event):  # the first measured step: the group is up, and the burst has a second to go
        if isinstance(event, StepRecord) and not event.warmup and event.rank == 0 and not seen:
            seen.append(listening_addresses(_burst_processes()))

    assert run_burst(tiny_workload(), DDP, seconds=1.0, on_event=on_event).ok
    assert seen[0], "the ranks were expected to listen for gloo's pair connections"
    assert all(ipaddress.ip_address(address).is_loopback for address in seen[0]), seen[0]
    assert not listening_addresses(_burst_processes())


@pytest.mark.slow
def test_bursts_bounded_by_seconds_agree_on_their_steps():
    """Ranks that each decided on their own clock disagreed by a step and hung in the extra all-reduce."""
    rng = random.Random(0)
    for _ in range(20):
        result = run_burst(tiny_workload(), DDP, seconds=rng.uniform(0.3, 0.5), options=BurstOptions(timeout_s=20))
        assert result.ok
        assert len(result.measured_steps(rank=0)) == len(result.measured_steps(rank=1)) > 0


def test_a_profiled_ddp_burst_finishes_with_rank_zeros_trace(tmp_path):
    result = run_burst(tiny_workload(), DDP, steps=4,
                       options=BurstOptions(profile_steps=2, profile_dir=str(tmp_path), timeout_s=60))
    assert result.ok and os.path.exists(result.profile.trace_path)
    assert any("addmm" in op.name or "linear" in op.name for op in result.profile.top_operators)


def test_scaling_efficiency_against_one_rank():
    single = run_burst(tiny_workload(), Config(), steps=10)
    double = run_burst(tiny_workload(), DDP, steps=10)
    efficiency = scaling_efficiency(double, single)
    assert efficiency == pytest.approx(double.samples_per_s / (2 * single.samples_per_s))
    assert scaling_efficiency(single, single) == pytest.approx(1.0)


def test_ranks_see_disjoint_shards_of_the_same_seeded_order():
    workload = tiny_workload()
    first, second = run_burst(workload, DDP, steps=4), run_burst(workload, DDP, steps=4)
    assert first.losses(rank=0) == second.losses(rank=0)
    assert first.losses(rank=0) != first.losses(rank=1)


def test_accumulation_under_ddp():
    result = run_burst(tiny_workload(), DDP.replace(grad_accum_steps=2, batch_size=16), steps=4)
    assert result.ok and result.ranks[0].measured_samples == 4 * 32


def test_a_failing_rank_is_named_with_its_own_traceback():
    started = time.perf_counter()
    with pytest.raises(WorkerError) as info:
        run_burst(tiny_workload(FailAt("raise", at_call=4, rank=1)), DDP, steps=20)
    assert time.perf_counter() - started < 5.0
    error = info.value
    assert error.result.error.rank == 1
    assert "rank 1 failed: ValueError: deliberate failure at call 4" in str(error)
    assert "Connection closed by peer" not in error.result.error.traceback


def test_a_killed_rank_takes_the_group_down():
    with pytest.raises(WorkerCrashed, match="rank 0 was killed by SIGKILL") as info:
        run_burst(tiny_workload(FailAt("kill", at_call=4, rank=0)), DDP, steps=20)
    assert info.value.result.error.rank == 0


def test_a_rank_stuck_in_a_collective_fails_on_the_groups_timeout_naming_the_stuck_rank():
    started = time.perf_counter()
    with pytest.raises(WorkerError, match="collective waited past") as info:
        run_burst(tiny_workload(FailAt("hang", at_call=4, rank=1)), DDP, steps=20, options=BurstOptions(timeout_s=4.0))
    assert re.search(r"\(rank 1 was in workloads.py:\d+ in forward: time.sleep\(3600\)\)", str(info.value))
    assert time.perf_counter() - started < 4.0  # the group's own timeout (half the burst's) fired first


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


def test_keyboard_interrupt_in_the_caller_stops_all_ranks(ctrl_c: None) -> None:
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
    ("changes", "expect"),
    [
        ({"num_workers": 1, "persistent_workers": True}, frozenset()),
        ({"data_cache": "memmap"}, frozenset()),
        ({"precision": "bf16", "sync_every": 0, "optimizer_impl": "foreach", "set_to_none": False},
         frozenset({"bf16", "zeroed"})),
        ({"script_loss": True, "deterministic": True, "channels_last": True},
         frozenset({"deterministic", "channels_last"})),
    ],
    ids=lambda c: ",".join(c) if isinstance(c, dict) else "",
)
def test_knobs_act_in_every_ddp_rank(changes, expect, tmp_path):
    """Each knob is checked where it acts, in both ranks: the model fails its forward, the optimizer its step and
    the loss its call unless the knob acted there; the dataset says which processes read it."""
    from tests.workloads import ForeachSGD, KnobsActed, ReadersRecorded, scripted_only

    readers = tmp_path / "readers"
    readers.mkdir()
    optimizer = ((lambda params: ForeachSGD(params, lr=0.01, foreach=False)) if "optimizer_impl" in changes
                 else (lambda params: torch.optim.SGD(params, lr=0.01)))
    workload = Workload(model=functools.partial(KnobsActed, expect), batch_size=8, optimizer=optimizer,
                        dataset=ReadersRecorded(str(readers)), name="knobs-acted",
                        loss_fn=scripted_only if changes.get("script_loss") else F.cross_entropy)
    live_losses = []
    cache = BurstOptions(cache_dir=str(tmp_path / "cache"))
    result = run_burst(workload, DDP.replace(**changes), steps=4, options=cache,
                       on_event=lambda e: live_losses.append(e.loss) if isinstance(e, StepRecord) and not e.warmup
                       else None)
    assert result.ok, result.error
    assert len(result.ranks) == 2
    if changes.get("num_workers"):  # the ranks and a loader worker of each read items
        assert len(list(readers.iterdir())) >= 4
    if changes.get("data_cache") == "memmap":
        assert all(rank.cache is not None and rank.cache.mode == "memmap" for rank in result.ranks)
    if changes.get("sync_every") == 0:  # read back once, at the end: no loss travels with a step record
        assert live_losses and all(loss is None for loss in live_losses)
        assert all(s.loss is not None for s in result.measured_steps())


def test_a_rank_dying_after_it_finished_keeps_the_measurement():
    """gloo can abort a rank in teardown after it sent its summary: the measurement is complete, keep it."""
    from accel_widgets.engine.outcome import finish
    from accel_widgets.engine.ranks import Collected
    from accel_widgets.results.burst import BurstResult
    from tests.results.test_burst import _rank

    collected = Collected(ranks={0: _rank(0, 96, 0.3), 1: _rank(1, 96, 0.5)}, exit_codes=[0, -6])
    result = finish(BurstResult("w", DDP, "ok", world_size=2), collected, "failed", time.perf_counter(), 60.0)
    assert result.ok and result.samples_per_s > 0
    assert any("rank 1 was killed by SIGABRT" in w and "after finishing" in w for w in result.warnings)


def test_sync_debug_under_ddp_says_it_does_not_cover_torch_distributed():
    """torch's sync-debug mode watches its CUDA calls only: a passing DDP burst vouches for nothing NCCL does."""
    ddp = run_burst(tiny_workload(), DDP, steps=2, options=BurstOptions(sync_debug=True))
    assert ddp.ok and SYNC_DEBUG_DDP_NOTE in ddp.warnings and "torch.distributed's" in SYNC_DEBUG_DDP_NOTE
    assert SYNC_DEBUG_DDP_NOTE not in run_burst(tiny_workload(), Config(), steps=2,
                                                options=BurstOptions(sync_debug=True)).warnings
    assert SYNC_DEBUG_DDP_NOTE not in run_burst(tiny_workload(), DDP, steps=2).warnings
