"""Bursts in real worker processes: isolation, live events, failures, teardown (leaks: see conftest)."""

import threading
import time
from pathlib import Path

import pytest
import torch

from accel_widgets import (
    BurstEngine,
    BurstOptions,
    BurstResult,
    BurstTimeout,
    Config,
    ConfigError,
    IsolationWarning,
    StepRecord,
    WorkerCrashed,
    WorkerError,
    WorkerOutOfMemory,
    Workload,
    WorkloadNotPicklable,
    run_burst,
)
from accel_widgets.analysis.diagnosis import diagnose
from accel_widgets.analysis.usage import loader_cpu_pct
from accel_widgets.engine.ranks import EXIT_GRACE_S
from accel_widgets.results.burst import BurstPhase, ProfileCapture
from accel_widgets.results.reliability import foreign_cpu_pct, reliability
from accel_widgets.views.text import summary
from tests.devices import cpu_device
from tests.workloads import (
    BreaksTheProfiler,
    DivergesAt,
    FailAt,
    FailsWhileProfiled,
    LockedDataset,
    SlowToExit,
    TinyNet,
    conv_workload,
    tiny_workload,
)


def test_burst_runs_in_a_worker_and_streams_every_step_live():
    events, arrival = [], []

    def on_event(event):
        events.append(event)
        arrival.append(time.perf_counter())

    started = time.perf_counter()
    result = run_burst(tiny_workload(), Config(), steps=10, on_event=on_event)
    finished = time.perf_counter()
    steps = [e for e in events if isinstance(e, StepRecord)]
    assert result.ok and len(steps) == 12 == len(result.steps)
    assert result.environment["pid"] != __import__("os").getpid()
    assert result.environment["start_method"] == "forkserver"
    assert result.samples_per_s > 0 and result.step_time.n == 10
    assert 0 < result.time_to_first_step_s < finished - started
    assert min(arrival) < finished - 0.005  # events arrived while the burst ran, not after it
    assert BurstResult.from_json(result.to_json()).samples_per_s == result.samples_per_s


def test_phase_changes_arrive_in_order_before_the_steps_they_produce():
    events = []
    run_burst(tiny_workload(), Config(world_size=2, parallel="ddp"), steps=5, on_event=events.append)
    for rank in (0, 1):
        mine = [e for e in events if getattr(e, "rank", None) == rank and isinstance(e, BurstPhase | StepRecord)]
        phases = [e.phase for e in mine if isinstance(e, BurstPhase)]
        assert phases[-2:] == ["step", "finishing"], phases
        assert set(phases) <= {"starting", "setup", "step", "finishing"}
        assert len(phases) <= 4  # one per change, never one per step
        first_step = next(i for i, e in enumerate(mine) if isinstance(e, StepRecord))
        assert any(isinstance(e, BurstPhase) and e.phase == "step" for e in mine[:first_step])
        times = [e.t for e in mine if isinstance(e, BurstPhase)]
        assert times == sorted(times) and times[0] >= 0


def test_the_users_model_is_never_touched():
    model = TinyNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    workload = tiny_workload(model)
    run_burst(workload, Config(), steps=5)
    with pytest.warns(IsolationWarning):
        run_burst(workload, Config(), steps=5, options=BurstOptions(isolation="inprocess"))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_worker_and_in_process_bursts_train_identically():
    workload = tiny_workload()
    in_worker = run_burst(workload, Config(), steps=6)
    in_process = run_burst(workload, Config(), steps=6, options=BurstOptions(isolation="inprocess"))
    assert in_worker.losses() == pytest.approx(in_process.losses(), abs=1e-6)


def test_locally_defined_classes_travel_by_value():
    class LocalNet(torch.nn.Module):  # not importable by name in the worker: cloudpickle ships it
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.layer(x)

    assert run_burst(tiny_workload(LocalNet()), Config(), steps=3).ok


def test_seconds_bound_bursts_stop_on_time():
    result = run_burst(tiny_workload(), Config(), seconds=0.5)
    assert result.ok
    assert 0.45 <= result.ranks[0].measured_s < 1.5
    assert result.step_time.n > 3


@pytest.mark.parametrize(
    "config",
    [
        Config(num_workers=2, persistent_workers=True, prefetch_factor=4),
        Config(num_workers=1, data_cache="memmap"),
        Config(data_cache="memmap", precision="bf16", grad_accum_steps=2, sync_every=0),
    ],
    ids=lambda c: c.label(),
)
def test_data_loading_knobs_work_in_workers(config):
    result = run_burst(tiny_workload(), config, steps=6)
    assert result.ok and result.ranks[0].measured_samples == 6 * 32 * config.grad_accum_steps


def test_a_rank_slow_to_exit_after_delivering_keeps_its_result():
    """The rank sent its summary, then hung in exit: the burst used to end in a BurstTimeout at the deadline."""
    started = time.perf_counter()
    result = run_burst(tiny_workload(SlowToExit), Config(), steps=4, options=BurstOptions(timeout_s=30))
    elapsed = time.perf_counter() - started
    assert result.ok and result.ranks[0].measured_samples == 4 * 32
    assert any(w.startswith(f"rank 0 delivered the result but had not exited {EXIT_GRACE_S:g} s later")
               for w in result.warnings)
    assert elapsed < EXIT_GRACE_S + 15


def test_a_raising_worker_reports_its_own_traceback():
    with pytest.raises(WorkerError) as info:
        run_burst(tiny_workload(FailAt("raise", at_call=4)), Config(), steps=10)
    error = info.value
    assert "rank 0 failed: ValueError: deliberate failure at call 4" in str(error)
    assert "in forward" in error.result.error.traceback
    assert error.result.status == "failed" and len(error.result.steps) == 3  # the steps before the failure


def test_out_of_memory_is_reported_as_such_with_advice():
    with pytest.raises(WorkerOutOfMemory, match="smaller batch_size"):
        run_burst(tiny_workload(FailAt("oom")), Config(), steps=10)


def test_a_killed_worker_is_reported_as_a_crash():
    with pytest.raises(WorkerCrashed, match=r"rank 0 was killed by SIGKILL from outside the burst") as info:
        run_burst(tiny_workload(FailAt("kill")), Config(), steps=10)
    assert info.value.result.error.kind == "crash"


def test_a_hanging_worker_is_stopped_by_the_timeout_naming_the_line_it_hung_in():
    started = time.perf_counter()
    hung = r"\(rank 0 was in workloads.py:\d+ in forward: time.sleep\(3600\)\)$"
    with pytest.raises(BurstTimeout, match=hung) as info:
        run_burst(tiny_workload(FailAt("hang")), Config(), steps=10, options=BurstOptions(timeout_s=2.0))
    assert time.perf_counter() - started < 6.0
    assert info.value.result.status == "timeout"


def test_stop_ends_the_burst_within_a_second():
    stop = threading.Event()
    stopped_at = []

    def on_event(event):
        if isinstance(event, StepRecord) and event.step == 3 and not stop.is_set():
            stop.set()
            stopped_at.append(time.perf_counter())

    result = run_burst(tiny_workload(FailAt("hang", at_call=8)), Config(), steps=100, on_event=on_event, stop=stop)
    assert result.status == "stopped"
    assert time.perf_counter() - stopped_at[0] < 1.0


def test_config_errors_come_before_any_process_starts():
    with pytest.raises(ConfigError, match="needs at least 2 GPUs"):
        run_burst(tiny_workload(), Config(parallel="dataparallel"), options=BurstOptions(device=cpu_device()))


def test_options_set_over_others_win_field_by_field():
    base = BurstOptions(isolation="inprocess", timeout_s=20, device=cpu_device())
    assert BurstOptions().over(base) == base
    assert BurstOptions(freed="data", timeout_s=5).over(base) == BurstOptions(
        isolation="inprocess", timeout_s=5, device=cpu_device(), freed="data")


def test_an_engine_keeps_its_options_under_those_a_search_adds():
    """A ``partial(run_burst, options=...)`` would lose its options to the headspace's ``freed``: the engine lays
    what is added over its own, and hands them to the engine it wraps (``run_burst`` by default)."""
    given = []
    assert BurstEngine(BurstOptions()).engine is run_burst
    engine = BurstEngine(BurstOptions(isolation="inprocess", timeout_s=20),
                         lambda workload, config, **kwargs: given.append(kwargs["options"]))
    engine(tiny_workload(), Config(), steps=2, seconds=None, on_event=None, stop=None, label="")
    engine(tiny_workload(), Config(), steps=2, seconds=None, on_event=None, stop=None, label="",
           options=BurstOptions(freed="data"))
    assert given == [BurstOptions(isolation="inprocess", timeout_s=20),
                     BurstOptions(isolation="inprocess", timeout_s=20, freed="data")]


def test_bad_burst_lengths_are_rejected():
    with pytest.raises(ValueError, match="steps >= 1"):
        run_burst(tiny_workload(), steps=0)
    with pytest.raises(ValueError, match="isolation='thread' is invalid: use 'process' or 'inprocess'"):
        BurstOptions(isolation="thread")  # type: ignore[arg-type]  # refused when made, before any burst


def test_a_loss_that_goes_nan_ends_diverged_with_its_numbers():
    result = run_burst(tiny_workload(DivergesAt(at_call=4)), Config(), steps=4)  # 2 warm-up steps, then 4
    assert result.status == "diverged" and not result.ok
    assert result.error.kind == "diverged"
    assert result.error.message.startswith("loss is NaN from step 3 (3 of 6 steps not finite): training diverged.")
    assert result.samples_per_s > 0 and result.step_time.n == 4
    assert summary(result).startswith("baseline [tiny] diverged: loss is NaN from step 3")
    assert "Training diverged" in [f.title for f in diagnose(result)]


def test_unpicklable_workload_says_what_to_do_and_in_process_fallback_works():
    workload = Workload(model=TinyNet(), dataset=LockedDataset(), loss_fn=torch.nn.functional.cross_entropy,
                        batch_size=32)
    with pytest.raises(WorkloadNotPicklable, match="isolation='inprocess'"):
        run_burst(workload, steps=3)
    with pytest.warns(IsolationWarning, match="a crash or out-of-memory takes this kernel down"):
        assert run_burst(workload, steps=3, options=BurstOptions(isolation="inprocess")).ok


def test_the_engine_recovers_after_failures():
    with pytest.raises(WorkerCrashed):
        run_burst(tiny_workload(FailAt("kill", at_call=1)), Config(), steps=3)
    assert run_burst(tiny_workload(), Config(), steps=3).ok


def test_channels_last_in_a_worker():
    assert run_burst(conv_workload(), Config(channels_last=True), steps=3).ok


def test_two_ddp_ranks_are_the_same_worker_code():
    result = run_burst(tiny_workload(), Config(parallel="ddp", world_size=2), steps=5,
                       options=BurstOptions(device=cpu_device()))
    assert result.ok and [r.rank for r in result.ranks] == [0, 1]
    assert {s.rank for s in result.steps} == {0, 1}
    assert result.samples_per_s == pytest.approx(sum(r.measured_samples / r.measured_s for r in result.ranks))
    assert result.environment["threads_per_rank"] == 1


def test_telemetry_samples_the_worker_on_the_burst_clock():
    result = run_burst(tiny_workload(), Config(), seconds=1.0, options=BurstOptions(device=cpu_device()))
    assert len(result.telemetry) >= 5
    assert all(sample.source == "psutil" for sample in result.telemetry)
    last_step = result.steps[-1].t
    assert any(0 < sample.t <= last_step for sample in result.telemetry)
    assert max(sample.util_pct for sample in result.telemetry) > 10


def test_foreign_cpu_load_during_a_burst_makes_it_unreliable_and_is_named(alone):
    """Its hog runs with the machine to itself: beside other tests it starved their bursts (a neighbour's tiny burst
    ran 34 steps in 2 s, not ~1,000)."""
    import subprocess
    import sys

    with alone():
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            result = run_burst(tiny_workload(), Config(), seconds=2.5, options=BurstOptions(device=cpu_device()))
        finally:
            hog.kill()
            hog.wait()
    assert foreign_cpu_pct(result) > 20
    assert not reliability(result).reliable
    assert "python -c" in reliability(result).text(), reliability(result).text()  # the hog, by what it runs
    assert "unreliable" in summary(result)


def test_profile_capture_writes_a_trace_naming_the_models_operators(tmp_path):
    import json

    result = run_burst(tiny_workload(), Config(), steps=5,
                       options=BurstOptions(profile_steps=3, profile_dir=str(tmp_path)))
    capture = result.profile
    assert capture is not None and capture.steps == 3
    names = {op.name for op in capture.top_operators}
    assert {"aten::addmm", "aten::mm"} & names  # the linear layers' matmuls
    trace = json.loads(Path(capture.trace_path).read_text())
    assert any(event.get("name") == "aten::addmm" for event in trace["traceEvents"])
    assert len(result.measured_steps()) == 5  # the profiled steps are not part of the measurement
    assert BurstResult.from_json(result.to_json()).profile == capture


@pytest.mark.parametrize(("model", "error"), [
    (FailsWhileProfiled, "OutOfMemoryError: CUDA out of memory while profiling (the profiler's buffers)"),
    (BreaksTheProfiler, "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED: cupti initialization failed"),
])
def test_a_profile_that_fails_keeps_the_measured_burst_and_says_why(tmp_path, model, error):
    result = run_burst(tiny_workload(model), Config(), steps=5,
                       options=BurstOptions(profile_steps=3, profile_dir=str(tmp_path)))
    assert result.ok and len(result.measured_steps()) == 5 and result.samples_per_s > 0
    assert result.profile == ProfileCapture(3, "", [], error=error)
    assert any(w == f"UserWarning: profiling failed ({error}): the burst's measurement is kept, without a trace"
               for w in result.warnings)
    assert list(tmp_path.iterdir()) == []  # no partial trace
    assert BurstResult.from_json(result.to_json()).profile == result.profile


def test_a_profiler_that_cannot_start_under_ddp_still_pairs_the_peers_steps(tmp_path):
    """Rank 0 takes the profiled steps without the profiler: rank 1's collectives have their partner."""
    options = BurstOptions(profile_steps=2, profile_dir=str(tmp_path), device=cpu_device(), timeout_s=60)
    result = run_burst(tiny_workload(BreaksTheProfiler), Config(parallel="ddp", world_size=2), steps=3, options=options)
    assert result.ok and result.profile is not None and result.profile.error.startswith("RuntimeError: CUPTI")


def test_host_telemetry_attributes_cpu_to_the_loader_workers():
    from accel_widgets import demo_workload

    result = run_burst(demo_workload("image"), Config(num_workers=2), seconds=1.5)
    assert loader_cpu_pct(result) > 5  # per-item augmentation runs in the loader worker processes
    sample = result.telemetry[-1]
    assert len(sample.cpu_per_core_pct) >= 1 and sample.iowait_pct is not None
    assert loader_cpu_pct(BurstResult.from_json(result.to_json())) == loader_cpu_pct(result)


def test_fast_steps_streaming_in_wake_the_caller_per_tick_not_per_message():
    """On a machine whose cores the rank's threads fill, every wake-up of the caller preempts one of them.

    The tiny workload takes ~1,000 steps a second and its rank sends a message every ``STEP_BATCH_S``:
    a pump that woke for each (as it did) blocked ~80 times a second; ticking, it wakes ~1/PUMP_TICK_S.
    """
    import resource

    from accel_widgets.engine.ranks import PUMP_TICK_S

    before = resource.getrusage(resource.RUSAGE_THREAD)
    started = time.monotonic()
    result = run_burst(tiny_workload(), Config(), seconds=2.0, on_event=lambda event: None)
    lasted = time.monotonic() - started
    wakes = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before.ru_nvcsw
    # Many steps a message (a busy machine runs fewer: the rank still sends every STEP_BATCH_S), one wake a tick
    # of the whole call, plus starting the rank and its first events.
    assert result.ok and len(result.steps) > 40
    assert wakes <= lasted / PUMP_TICK_S + 30, (wakes, lasted)
