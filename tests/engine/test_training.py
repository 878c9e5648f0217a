"""The training step and its knobs, run in-process (fast) where isolation is not the point."""

import dataclasses
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from accel_widgets import BurstEngine, BurstOptions, Config, Workload
from accel_widgets.engine.process import torch_threads
from accel_widgets.engine.timing import RESOLVE_EVERY_S, CudaTimeline, HostTimeline, StepClock
from accel_widgets.engine.training import (
    BatchFormatError,
    DieWithRank,
    batch_length,
    build_loop,
    eval_metrics,
    peak_memory_bytes,
    split_batch,
)
from accel_widgets.knobs import global_flags, parallel
from accel_widgets.knobs.data import copy_batch
from accel_widgets.knobs.parts import ON_DEVICE_BATCHES
from accel_widgets.knobs.plan import Plan, resolve
from tests.devices import cpu_device
from tests.workloads import TinyNet, conv_workload, fast_learning_workload, loss_fell, tiny_workload

#: These are CPU tests, and in-process CUDA would stay in pytest.
INPROCESS = BurstEngine(BurstOptions(isolation="inprocess", device=cpu_device()))


def burst(workload, config=None, **kwargs):
    kwargs.setdefault("steps", 6)
    return INPROCESS(workload, config or Config(), **kwargs)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_host_steps_tile_the_window_and_their_parts_add_up():
    clock = FakeClock()
    timer = StepClock(HostTimeline(clock), clock, origin=90.0)
    timer.start_step()
    with timer.waiting_for_data():
        clock.now += 0.25
    with timer.copying():
        clock.now += 0.05
    clock.now += 0.70
    timer.end_step()
    clock.now += 0.10  # between steps (emitting events): belongs to the next step, not to no step
    timer.start_step()
    clock.now += 0.40
    timer.end_step()
    first, second = timer.completed()
    assert (first.data_s, first.h2d_s, first.total_s) == pytest.approx((0.25, 0.05, 1.0))
    assert first.compute_s == pytest.approx(0.70)
    assert first.t == pytest.approx(11.0)
    assert second.total_s == pytest.approx(0.50)
    assert first.total_s + second.total_s == pytest.approx(clock.now - 100.0)
    assert timer.completed() == []


class FakeStream:
    """One CUDA stream on a fake GPU: work queued by the host runs in order, after the host queued it.

    A marker is reached when the stream has run everything queued before it, so markers behave like
    recorded CUDA events, with the same arithmetic the real timeline does on event timestamps.
    """

    look_every_s = 0.0

    def __init__(self, host: FakeClock) -> None:
        self.host, self.busy_until, self.synced = host, 0.0, 0

    def launch(self, seconds: float) -> None:
        self.busy_until = max(self.host.now, self.busy_until) + seconds

    def mark(self) -> float:
        return max(self.host.now, self.busy_until)

    def reached(self, marker: float) -> bool:
        return marker <= self.host.now

    def seconds_between(self, start: float, end: float) -> float:
        return end - start

    def release(self, marker: float) -> None:
        """A fake marker is a number."""

    def synchronize(self) -> None:
        self.synced += 1
        self.host.now = max(self.host.now, self.busy_until)


def gpu_step(timer, stream, clock, host_data_wait, copy_s, compute_s):
    timer.start_step()
    with timer.waiting_for_data():
        clock.now += host_data_wait
    with timer.copying():
        stream.launch(copy_s)
    stream.launch(compute_s)
    clock.now += 0.001  # the host only queues the kernels
    timer.end_step()


def test_gpu_data_wait_is_what_the_gpu_sees_and_parts_add_up_to_the_step():
    clock = FakeClock()
    stream = FakeStream(clock)
    timer = StepClock(stream, clock, origin=99.0)
    # GPU idle, the loader makes it wait 5 ms: a stall the GPU sees.
    gpu_step(timer, stream, clock, host_data_wait=0.005, copy_s=0.002, compute_s=0.020)
    # The host ran ahead: it waits 5 ms for data while the GPU still computes the previous step.
    gpu_step(timer, stream, clock, host_data_wait=0.005, copy_s=0.002, compute_s=0.020)
    assert timer.completed() == []  # the GPU has not reached either end marker: nothing waited for it
    assert stream.synced == 2  # only at construction, never per step
    first, second = timer.flush()
    assert first.data_s == pytest.approx(0.005)
    assert second.data_s == pytest.approx(0.0)  # hidden behind queued work: the GPU never waited
    for step in (first, second):
        assert step.data_s + step.h2d_s + step.compute_s == pytest.approx(step.total_s)
        assert step.h2d_s == pytest.approx(0.002)
    assert first.total_s + second.total_s == pytest.approx(second.t - (first.t - first.total_s))
    assert second.compute_s == pytest.approx(0.020)


class FakeEvent:
    """A CUDA event on a fake GPU timeline: ``at`` is when the GPU reaches it (ms)."""

    timeline: ClassVar[list[float]] = []
    done_until = 0.0

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = None

    def record(self) -> None:
        self.at = FakeEvent.timeline.pop(0)

    def query(self) -> bool:
        return self.at <= FakeEvent.done_until

    def elapsed_time(self, other: "FakeEvent") -> float:
        return other.at - self.at


def test_cuda_timeline_reads_events_only_once_the_gpu_passed_them(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    # reference, step start, data begin, data end, copy begin, copy end, step end (ms on the GPU timeline)
    FakeEvent.timeline = [0.0, 10.0, 10.0, 14.0, 14.0, 16.0, 30.0]
    FakeEvent.done_until = 0.0
    clock = FakeClock()
    timer = StepClock(CudaTimeline(torch.device("cuda", 0)), clock, origin=99.0)
    timer.start_step()
    with timer.waiting_for_data():
        clock.now += 0.004
    with timer.copying():
        pass
    timer.end_step()
    assert timer.completed() == []  # the GPU has not reached the end marker: no sync forced
    FakeEvent.done_until = 30.0
    assert timer.completed() == []  # looked at again only RESOLVE_EVERY_S later
    clock.now += RESOLVE_EVERY_S + 1e-9
    (timing,) = timer.completed()
    assert (timing.total_s, timing.data_s, timing.h2d_s) == pytest.approx((0.020, 0.004, 0.002))
    assert timing.t == pytest.approx(1.0 + 0.030)
    assert len(synced) == 2  # only at construction, never per step


def plan_of(config: Config) -> Plan:
    """``config`` resolved for this machine's CPU, as a burst resolves it."""
    return resolve(config, cpu_device(), tiny_workload())


class TickingClock(FakeClock):
    """A host clock that moves 2 ms each time it is read: the loop's steps take that long."""

    def __call__(self) -> float:
        self.now += 0.002
        return self.now


class CountedEvent:
    """A CUDA event on a fake GPU that runs ``lag`` host seconds behind the host: counts creations and queries."""

    created = 0
    queries = 0
    lag = 0.0
    clock: ClassVar[FakeClock | None] = None

    def __init__(self, enable_timing: bool = False) -> None:
        CountedEvent.created += 1
        self.at = None

    def record(self) -> None:
        self.at = CountedEvent.clock.now + CountedEvent.lag

    def query(self) -> bool:
        CountedEvent.queries += 1
        return self.at <= CountedEvent.clock.now

    def elapsed_time(self, other: "CountedEvent") -> float:
        return (other.at - self.at) * 1e3


@pytest.fixture
def counted_events(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", CountedEvent)
    def synchronize(device=None) -> None:
        if CountedEvent.lag:
            CountedEvent.clock.now += CountedEvent.lag

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    CountedEvent.created = CountedEvent.queries = 0
    CountedEvent.clock = FakeClock()
    return CountedEvent


@pytest.mark.parametrize("lag", [0.0, 0.05])  # a synced loop; a host 50 ms ahead of the GPU (sync_every=0)
def test_the_step_clock_reuses_its_cuda_events_and_resolves_steps_in_batches(counted_events, lag):
    """Five markers a step used to be five new CUDA events a step, each created inside the measured window."""
    counted_events.lag = lag
    clock = counted_events.clock
    timer = StepClock(CudaTimeline(torch.device("cuda", 0)), clock, origin=99.0)
    timings = []
    for _ in range(1000):
        timer.start_step()
        with timer.waiting_for_data():
            clock.now += 0.0005
        with timer.copying():
            clock.now += 0.0001
        clock.now += 0.002
        timer.end_step()
        timings += timer.completed()
    timings += timer.flush()
    assert len(timings) == 1000
    assert sum(t.total_s for t in timings) == pytest.approx(1000 * 0.0026)
    assert all(t.data_s == pytest.approx(0.0005) and t.h2d_s == pytest.approx(0.0001) for t in timings)
    # the pool holds what is in flight: ~lag / step time steps of five markers, plus the reference
    in_flight = 5 * (lag / 0.0026 + RESOLVE_EVERY_S / 0.0026 + 2) + 1
    assert counted_events.created <= in_flight
    steps_per_look = RESOLVE_EVERY_S / 0.0026
    assert counted_events.queries <= 1000 / steps_per_look * (steps_per_look + 2)  # not two or more per step
    if lag == 0.0:  # everything reached: one query per look, not one per step
        assert counted_events.queries <= 1000 / steps_per_look + 2


def test_a_training_loop_on_the_cuda_timeline_creates_no_event_in_steady_state(counted_events):
    """The real loop's markers (data, copy, end) on the pooled timeline: after warm-up no event is created."""
    counted_events.lag, counted_events.clock = 0.0, TickingClock()
    with tempfile.TemporaryDirectory() as cache:
        loop, _ = build_loop(tiny_workload(), plan_of(Config()), torch.device("cpu"), 0, cache_dir=cache,
                             emit=lambda event: None, clock_origin=time.perf_counter())
        loop.step_clock = StepClock(CudaTimeline(torch.device("cuda", 0)), counted_events.clock, origin=99.0)
        first_step_s, _ = loop.warm_up(2)
        after_warm_up = counted_events.created
        with torch_threads(1):
            window = loop.measure(100, None, first_step_s)
            pool = counted_events.created
            loop.measure(300, None, first_step_s)
    # pending steps are looked at every RESOLVE_EVERY_S (of 2 ms steps): the pool holds that many steps of 5 markers
    steps_per_look = round(RESOLVE_EVERY_S / 0.002) + 1
    assert window.steps == 100 and after_warm_up <= 11 and pool - after_warm_up <= 5 * steps_per_look
    assert counted_events.created == pool  # 300 more steps, not one event more (it was 5 a step)


def test_the_measured_window_closes_at_the_last_steps_end_not_after_the_final_loss_read(monkeypatch):
    """sync_every=0 reads every loss after the last step (on a GPU, a wait for the queued work): not a step. The read
    takes a second: five tiny steps stay under it even on a loaded host (0.32 s was seen beside the other xdist
    worker), so a window that counted the read cannot pass."""
    read_s = 1.0
    records = []
    with tempfile.TemporaryDirectory() as cache:
        loop, _ = build_loop(tiny_workload(), plan_of(Config(sync_every=0)), torch.device("cpu"), 0, cache_dir=cache,
                             emit=records.append, clock_origin=time.perf_counter())
        first_step_s, _ = loop.warm_up(2)
        read_losses = loop._read_losses

        def slow_read() -> None:
            time.sleep(read_s)
            read_losses()

        monkeypatch.setattr(loop, "_read_losses", slow_read)
        window = loop.measure(5, None, first_step_s)
    measured = [r for r in records if getattr(r, "warmup", True) is False]
    assert len(measured) == 5 and all(r.loss is not None for r in records[-5:] if hasattr(r, "loss")) is not None
    steps_total = sum(r.total_s for r in measured)
    assert window.seconds < read_s and window.seconds == pytest.approx(steps_total, rel=0.05, abs=0.005)


class CountedReads(torch.utils.data.Dataset):
    """Items that count how often they are read, in this process (the loop runs in-process here)."""

    reads = 0

    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        CountedReads.reads += 1
        return torch.full((16,), float(index % 7)), index % 3


def test_a_data_free_loop_reads_a_few_batches_once_then_trains_on_them_with_no_wait_and_no_copy():
    """The headspace's data-free variant: the loader is read for ON_DEVICE_BATCHES batches when the loop is built,
    then never again; the steps cycle those batches, waiting for nothing and copying nothing."""
    CountedReads.reads = 0
    workload = Workload(model=TinyNet(), dataset=CountedReads(), loss_fn=F.cross_entropy, batch_size=4)
    plan = dataclasses.replace(resolve(Config(), cpu_device(), workload), freed="data")
    records = []
    with tempfile.TemporaryDirectory() as cache:
        loop, _ = build_loop(workload, plan, torch.device("cpu"), 0, cache_dir=cache, emit=records.append,
                             clock_origin=time.perf_counter())
        built = CountedReads.reads
        first_step_s, _ = loop.warm_up(2)
        window = loop.measure(20, None, first_step_s)
    assert built >= ON_DEVICE_BATCHES * 4 and CountedReads.reads == built  # (plus the keyed data's probe)
    steps = [r for r in records if getattr(r, "warmup", True) is False]
    assert window.steps == 20 and len(steps) == 20 and all(r.h2d_s == 0.0 for r in steps)
    assert sum(r.data_s for r in steps) < 0.02 * sum(r.total_s for r in steps)


def test_a_host_free_loop_reads_no_loss_in_its_steps_and_marks_only_their_ends(counted_events, monkeypatch):
    """The host-free variant on a GPU timeline: one marker a step (its end) instead of five, no phase set per step,
    and the losses read once, after the window, whatever sync_every says."""
    counted_events.lag, counted_events.clock = 0.0, TickingClock()
    phases = []
    with tempfile.TemporaryDirectory() as cache:
        plans = {freed: dataclasses.replace(plan_of(Config(sync_every=1)), freed=freed) for freed in (None, "host")}
        created = {}
        for freed, plan in plans.items():
            loop, _ = build_loop(tiny_workload(), plan, torch.device("cpu"), 0, cache_dir=cache,
                                 emit=lambda event: None, clock_origin=time.perf_counter(), set_phase=phases.append)
            loop.step_clock = StepClock(CudaTimeline(torch.device("cuda", 0)), counted_events.clock, origin=99.0)
            reads = []
            read_losses = loop._read_losses
            monkeypatch.setattr(loop, "_read_losses", lambda read_losses=read_losses, reads=reads: (
                reads.append(1), read_losses()))
            first_step_s, _ = loop.warm_up(2)
            phases.clear()
            reads.clear()
            before = counted_events.created
            with torch_threads(1):
                loop.measure(200, None, first_step_s)
            created[freed] = counted_events.created - before
            if freed == "host":
                assert len(reads) == 1 and phases == []  # the losses once, at the window's end
            else:
                assert len(reads) == 201 and len(phases) == 400  # every step's loss, two phases a step
    assert created["host"] < created[None] / 3


def test_dataparallel_peak_memory_is_the_busiest_gpus_not_device_zeros(monkeypatch):
    """DataParallel gathers outputs and the loss on GPU 0, but its replicas' activations can peak elsewhere."""
    peaks = {0: 3 << 30, 1: 5 << 30, 2: 4 << 30}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: peaks[device.index])
    cuda0 = torch.device("cuda", 0)
    dataparallel = parallel.devices_used(Config(parallel="dataparallel"), cuda0)
    assert dataparallel == [torch.device("cuda", i) for i in range(3)]
    assert peak_memory_bytes(dataparallel) == 5 << 30
    assert peak_memory_bytes(parallel.devices_used(Config(), cuda0)) == 3 << 30
    assert parallel.devices_used(Config(parallel="dataparallel"), torch.device("cpu")) == [torch.device("cpu")]


def test_batch_helpers():
    batch = copy_batch([torch.zeros(4, 3, 2, 2), {"y": torch.ones(4)}], torch.device("cpu"), Config(),
                       channels_last=True)
    assert batch[0].is_contiguous(memory_format=torch.channels_last)
    assert batch_length(batch[1]) == 4
    with pytest.raises(BatchFormatError, match="3 elements"):
        split_batch([1, 2, 3])


def test_flags_and_threads_are_restored():
    before = (torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
              torch.backends.cuda.matmul.fp32_precision, torch.get_num_threads())
    with global_flags(Config(tf32=True, cudnn_benchmark=True)), torch_threads(1):
        assert torch.backends.cudnn.benchmark and torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.get_num_threads() == 1
    with global_flags(Config(deterministic=True)):
        assert torch.are_deterministic_algorithms_enabled()
    after = (torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
             torch.backends.cuda.matmul.fp32_precision, torch.get_num_threads())
    assert after == before


def test_steps_warmup_and_losses_are_all_reported():
    result = burst(tiny_workload(), steps=5, options=BurstOptions(warmup_steps=2))
    assert [s.step for s in result.steps] == list(range(7))
    assert [s.warmup for s in result.steps] == [True, True] + [False] * 5
    assert all(s.samples == 32 for s in result.steps)
    assert result.ranks[0].measured_samples == 5 * 32
    assert all(loss is not None for loss in result.losses())


def test_every_burst_starts_from_the_same_weights_and_data_order():
    first, second = burst(tiny_workload()), burst(tiny_workload())
    assert first.losses() == second.losses()


def test_gradient_accumulation_matches_one_big_batch():
    """2 x 16 accumulated must train like 1 x 32: same data order, loss scaled by 1/k."""
    workload = tiny_workload(optimizer=lambda p: torch.optim.SGD(p, lr=0.5))
    big = burst(workload, Config(batch_size=32))
    accumulated = burst(workload, Config(batch_size=16, grad_accum_steps=2))
    assert accumulated.losses() == pytest.approx(big.losses(), abs=1e-5)
    assert accumulated.steps[0].samples == 32


def test_sync_every_zero_still_reports_every_loss_at_the_end():
    live = []
    result = burst(tiny_workload(), Config(sync_every=0), on_event=live.append)
    assert live[0].loss is None  # the first step's record leaves at once: its loss is read only at the end
    assert all(loss is not None for loss in result.losses())
    assert result.losses() == burst(tiny_workload()).losses()


@pytest.mark.parametrize(
    "config",
    [
        Config(precision="bf16"),
        Config(precision="fp16"),
        Config(script_loss=True),
        Config(set_to_none=False),
        Config(optimizer_impl="foreach", sync_every=3),
        Config(data_cache="memory"),
        Config(deterministic=True),
        Config(optimizer_impl="fused"),
        Config(pin_memory=True, non_blocking=True, tf32=True, cudnn_benchmark=True, empty_cache=True),
    ],
    ids=lambda c: c.label(),
)
def test_cpu_knobs_train(config):
    result = burst(fast_learning_workload(), config, steps=8)
    assert result.ok
    losses = result.losses()
    assert all(torch.isfinite(torch.tensor(losses)))
    assert loss_fell(losses), losses


def test_cuda_only_knobs_on_cpu_run_and_say_they_did_nothing():
    result = burst(tiny_workload(), Config(pin_memory=True, memory_fraction=0.5))
    assert result.ok
    assert any("only act on CUDA" in w for w in result.warnings)


def test_channels_last_conv_model_trains():
    assert burst(conv_workload(), Config(channels_last=True)).ok


def test_models_returning_dicts_work_through_the_loss_function():
    class DictNet(TinyNet):
        def forward(self, x):
            return {"logits": super().forward(x), "aux": x.sum()}

    workload = Workload(model=DictNet(), dataset=tiny_workload().dataset, batch_size=32,
                        loss_fn=lambda out, y: F.cross_entropy(out["logits"], y))
    assert burst(workload).ok


def test_dataset_smaller_than_a_batch_is_a_clear_error():
    workload = Workload(model=nn.Linear(2, 1), dataset=(torch.zeros(8, 2), torch.zeros(8, 1)),
                        loss_fn=F.mse_loss, batch_size=16)
    result = None
    with pytest.raises(Exception, match="fewer than one batch of 16") as info:
        burst(workload)
    result = info.value.result
    assert result.status == "failed"


def test_untraceable_loss_under_script_loss_is_a_clear_error():
    workload = tiny_workload()
    workload.loss_fn = lambda out, y: F.cross_entropy(out, y)  # lambdas cannot be scripted
    with pytest.raises(Exception, match="cannot be compiled by TorchScript"):
        burst(workload, Config(script_loss=True))


def test_in_process_bursts_leave_the_callers_random_state_alone():
    workload = tiny_workload()
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    burst(workload)
    assert torch.equal(torch.rand(3), expected)


class Overflowing(TinyNet):
    """Activations beyond fp16's range (65504): fp16 autocast produces inf, so the scaler skips steps."""

    def forward(self, x):
        return super().forward(x * 1e5)


def test_fp16_scaler_skips_are_counted():
    overflowing = burst(tiny_workload(Overflowing()), Config(precision="fp16"), steps=4)
    assert overflowing.ranks[0].scaler_skipped_steps >= 1
    healthy = burst(tiny_workload(), Config(precision="fp16"), steps=4)
    assert healthy.ranks[0].scaler_skipped_steps == 0
    assert burst(tiny_workload(), Config(), steps=2).ranks[0].scaler_skipped_steps is None


_ORPHAN = """
import multiprocessing, os, sys, time
from accel_widgets.engine.training import DieWithRank

def worker(rank_pid, ready):
    DieWithRank(rank_pid, lambda worker_id: ready.set())(0)
    time.sleep(60)

def rank(pids, ready):
    child = multiprocessing.get_context("fork").Process(target=worker, args=(os.getpid(), ready))
    child.start()
    pids.put(child.pid)
    ready.wait(30)
    os._exit(0)  # the rank dies (as under a teardown SIGKILL) with its loader worker still running

if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    pids, ready = ctx.SimpleQueue(), ctx.Event()
    r = ctx.Process(target=rank, args=(pids, ready))
    r.start()
    worker_pid = pids.get()
    r.join(30)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{worker_pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        if state in ("gone", "Z"):  # killed (a zombie until init reaps it)
            print("gone")
            sys.exit(0)
        time.sleep(0.05)
    os.kill(worker_pid, 9)
    print("orphan")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_PDEATHSIG)")
def test_a_loader_worker_dies_with_its_rank_and_one_whose_rank_is_gone_exits(tmp_path):
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ACCEL_WIDGETS_PRESTART": "0"})
    assert done.stdout.strip() == "gone", done.stdout + done.stderr

    child = multiprocessing.get_context("fork").Process(target=DieWithRank(os.getpid() + 10**6, None), args=(0,))
    child.start()
    child.join(10)
    assert child.exitcode == 1  # its rank is not its parent any more: it exits before the user's init runs


def test_an_evaluation_batch_gives_a_loss_or_named_metrics_and_anything_else_names_the_eval_fn():
    def accuracy(model, batch):
        return {"loss": torch.tensor(0.5), "accuracy": 0.75}

    assert eval_metrics(torch.tensor([2.0]), None) == {"loss": 2.0}
    assert eval_metrics(accuracy(None, None), accuracy) == {"loss": 0.5, "accuracy": 0.75}
    with pytest.raises(BatchFormatError, match=r"eval_fn=.*accuracy gave 'per_item' as a Tensor: return a loss"):
        eval_metrics({"per_item": torch.ones(3)}, accuracy)
