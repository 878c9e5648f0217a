"""Launch a burst's rank processes, stream their events, and always clean up after them.

Why a forkserver with torch preloaded (measured on a 2-core machine, see the project notes): a cold
``spawn`` interpreter reaches its first step ~2.6 s after launch because every burst re-imports
torch; plain ``fork`` from a kernel that has used OpenMP deadlocks, and after CUDA init it is unsafe.
A forkserver imports torch (and ``torch._dynamo``, which the first optimizer step imports lazily for
~1 s) once, never runs OpenMP or CUDA itself, and forks each rank in ~10 ms with a fresh CUDA state.
Ranks are started with torch's own ``start_processes`` so a failing rank's traceback and the
teardown of its peers follow torch's machinery; the workload travels cloudpickled, by value.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import os
import queue
import shutil
import signal
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import cloudpickle
import psutil
import torch.multiprocessing as torch_mp
from torch import nn
from torch.multiprocessing.spawn import ProcessContext

from ..config import Config
from ..device import DeviceInfo, probe_device
from ..results import BurstResult, ErrorInfo, RankSummary, StepRecord, TelemetrySample
from ..validation import ConfigError, check_config
from ..workload import Workload
from .datacache import cache_root
from .events import RankDone, RankFailed, RankLosses, WorkerEvent
from .telemetry import TelemetrySampler
from .worker import BurstSpec, run_rank, worker_main

START_METHOD = "forkserver"
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch.optim", "cloudpickle", "numpy", "psutil",
                      "accel_widgets.engine.worker"]
DEFAULT_STEPS = 40
BURST_DIR_PREFIX = "accel-widgets-burst-"  # + the owning process id, so leftovers can be attributed
DEFAULT_TIMEOUT_S = 600.0
POLL_S = 0.02
TEARDOWN_GRACE_S = 0.5
FOREIGN_LOAD_WARN_PCT = 25.0

Event = StepRecord | TelemetrySample


class BurstError(RuntimeError):
    """A burst did not finish. ``result`` holds what was measured up to the failure."""

    def __init__(self, message: str, result: BurstResult) -> None:
        super().__init__(message)
        self.result = result


class WorkerError(BurstError):
    """A rank raised; the message carries that rank's own traceback."""


class WorkerOutOfMemory(WorkerError):
    """A rank ran out of device memory."""


class WorkerCrashed(BurstError):
    """A rank died without raising (a signal, e.g. the kernel's OOM killer, or a hard exit)."""


class BurstTimeout(BurstError):
    """The burst ran past its timeout (a hang, e.g. a rank stuck in a collective) and was stopped."""


class WorkloadNotPicklable(TypeError):
    """The workload cannot travel to a worker process; raised before any process starts."""


class IsolationWarning(UserWarning):
    """The burst runs in the calling process and loses crash/OOM/hang isolation."""


def forkserver_context() -> Any:
    ctx = torch_mp.get_context(START_METHOD)
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


def warm_up() -> None:
    """Start the preloaded forkserver now (a panel calls this when it opens) instead of at the first burst."""
    forkserver_context()
    from multiprocessing import forkserver

    forkserver.ensure_running()


def free_port() -> int:
    """A free TCP port on loopback for one burst's rendezvous (never a fixed 29500: bursts may overlap)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _prepare_profile_dir(path: str) -> str:
    """Traces outlive the burst (its temp dir is removed), so they go to a directory the user chose."""
    os.makedirs(path, exist_ok=True)
    return os.path.abspath(path)


def pickle_workload(workload: Workload, spec: BurstSpec) -> bytes:
    """Serialise by value; on failure say what cannot travel and how to fix it."""
    try:
        return cloudpickle.dumps((workload, spec))
    except Exception as exc:
        raise WorkloadNotPicklable(
            f"the workload cannot be sent to a worker process ({type(exc).__name__}: {exc}). Open files, locks, "
            "sockets, generators and live database handles cannot travel between processes: build them inside "
            "the Dataset/model lazily, or move the code into an importable module and pass a factory. As a last "
            "resort run_burst(..., isolation='inprocess') trains in this process without crash isolation."
        ) from exc


@dataclass
class _Collected:
    """Events gathered from the ranks while the burst runs."""

    steps: list[StepRecord] = field(default_factory=list)
    losses: dict[int, list[float]] = field(default_factory=dict)
    ranks: dict[int, RankSummary] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    errors: list[RankFailed] = field(default_factory=list)
    exit_codes: list[int | None] = field(default_factory=list)
    first_step_at: float | None = None

    def handle(self, event: WorkerEvent, on_event: Callable[[Event], None] | None, now: float) -> None:
        if isinstance(event, StepRecord):
            self.steps.append(event)
            if self.first_step_at is None:
                self.first_step_at = now
            if on_event is not None:
                on_event(event)
        elif isinstance(event, RankLosses):
            self.losses[event.rank] = event.values
        elif isinstance(event, RankDone):
            self.ranks[event.summary.rank] = event.summary
            self.environment = self.environment or event.environment
            self.warnings.extend(w for w in event.warnings if w not in self.warnings)
        elif isinstance(event, RankFailed):
            self.errors.append(event)

    def steps_with_losses(self) -> list[StepRecord]:
        """Steps with the loss values that were read after the step event went out (sync_every > 1)."""
        patched = []
        for record in self.steps:
            values = self.losses.get(record.rank, [])
            if record.loss is None and record.step < len(values):
                record = replace(record, loss=values[record.step])
            patched.append(record)
        return patched

    def root_cause(self) -> RankFailed | None:
        """The first rank to fail for its own reason, not a peer reporting that the failed rank vanished.

        None when no rank raised for its own reason: then a rank that died silently is the cause.
        """
        own = [e for e in self.errors if not e.peer_failure]
        if own:
            return min(own, key=lambda e: e.t)
        if self.errors and not self.crashed_ranks():
            return min(self.errors, key=lambda e: e.t)
        return None

    def crashed_ranks(self) -> list[tuple[int, int]]:
        """``(rank, exit code)`` of ranks that exited non-zero without sending an error event."""
        reported = {e.rank for e in self.errors}
        return [(rank, code) for rank, code in enumerate(self.exit_codes)
                if code not in (0, None) and rank not in reported]


def run_burst(
    workload: Workload,
    config: Config | None = None,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    warmup_steps: int | None = None,
    on_event: Callable[[Event], None] | None = None,
    stop: threading.Event | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    isolation: Literal["process", "inprocess"] = "process",
    cache_dir: str | None = None,
    label: str = "",
    device: DeviceInfo | None = None,
    profile_steps: int = 0,
    profile_dir: str = "accel_widgets_profiles",
) -> BurstResult:
    """Train ``workload`` under ``config`` for a short timed burst and return what was measured.

    Runs ``steps`` measured steps (default 40) or for ``seconds``, after ``warmup_steps`` unmeasured
    ones (default 2, or 3 when compiling). ``on_event`` receives every step record and telemetry sample
    live, on the calling thread. Setting ``stop`` ends the burst early (status "stopped").
    ``profile_steps`` > 0 records that many extra steady-state steps with torch.profiler after the
    measured window (rank 0) and writes the trace under ``profile_dir`` (``result.profile``). Raises
    :class:`ConfigError` before starting anything if the config cannot run here, and a
    :class:`BurstError` subclass (with ``.result``) if the burst fails, times out or crashes.
    """
    called_at = time.perf_counter()
    config = config or Config()
    device = device or probe_device()
    config_warnings = check_config(config, device)
    if steps is None and seconds is None:
        steps = DEFAULT_STEPS
    if (steps is not None and steps < 1) or (seconds is not None and seconds <= 0):
        raise ValueError(f"a burst needs steps >= 1 or seconds > 0 (got steps={steps}, seconds={seconds})")
    if warmup_steps is None:
        warmup_steps = 3 if config.compile_mode != "off" else 2
    if warmup_steps < 1:
        raise ValueError("warmup_steps must be >= 1: the first step always pays one-off costs")
    spec = BurstSpec(
        config=config, steps=steps, seconds=seconds, warmup_steps=warmup_steps, clock_origin=called_at,
        cache_dir=cache_dir or str(cache_root()), threads_per_rank=max(1, device.cpu_count // config.ranks),
        device_kind=device.kind, temp_dir="", master_port=free_port() if config.parallel == "ddp" else None,
        profile_steps=profile_steps, profile_dir=_prepare_profile_dir(profile_dir) if profile_steps else "",
    )
    result = BurstResult(workload=workload.name, config=config, status="ok", world_size=config.ranks,
                         warmup_steps=warmup_steps, tokens_per_sample=workload.tokens_per_sample,
                         warnings=list(config_warnings), label=label,
                         environment={"driver": device.driver, "gpus": [g.name for g in device.gpus],
                                      "start_method": START_METHOD if isolation == "process" else "inprocess"})
    if isolation == "inprocess":
        return _run_in_process(workload, spec, result, on_event, stop, called_at)
    if isolation != "process":
        raise ValueError(f"isolation={isolation!r} is invalid: use 'process' or 'inprocess'")
    return _run_in_workers(workload, spec, result, on_event, stop, timeout_s, device, called_at)


def _run_in_workers(
    workload: Workload, spec: BurstSpec, result: BurstResult, on_event: Callable[[Event], None] | None,
    stop: threading.Event | None, timeout_s: float, device: DeviceInfo, called_at: float,
) -> BurstResult:
    warm_up()  # returns at once; the server imports torch while we pickle
    temp_dir = tempfile.mkdtemp(prefix=f"{BURST_DIR_PREFIX}{os.getpid()}-")
    spec = replace(spec, temp_dir=temp_dir)
    samples: queue.SimpleQueue[TelemetrySample] = queue.SimpleQueue()
    sampler = TelemetrySampler(clock_origin=called_at, on_sample=samples.put,
                               gpu_indices=[g.nvml_index for g in device.gpus[: spec.config.ranks]])
    events = forkserver_context().Queue()
    context: ProcessContext | None = None
    collected = _Collected()
    try:
        payload = pickle_workload(workload, spec)
        context = _start_ranks(payload, events, spec.config.ranks)
        for pid in context.pids():
            sampler.watch(pid)
        sampler.start()
        outcome = _collect(context, events, samples, collected, on_event, stop, called_at + timeout_s)
    finally:
        result.telemetry = sampler.stop()
        if context is not None:
            _terminate(context)
            _drain(events, collected, None)
            _remove_error_files(context)
        events.close()
        events.join_thread()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return _finish(result, collected, outcome, called_at, timeout_s)


def _start_ranks(payload: bytes, events: Any, ranks: int) -> ProcessContext:
    try:
        return torch_mp.start_processes(worker_main, args=(payload, events), nprocs=ranks, join=False,
                                        start_method=START_METHOD)
    except (BrokenPipeError, EOFError, ConnectionError) as exc:
        raise RuntimeError(
            "the worker process could not start. If this runs from a script, put the code that calls run_burst "
            "under `if __name__ == '__main__':` -- multiprocessing re-imports the main script in each worker "
            "(notebooks need nothing)."
        ) from exc


def _collect(
    context: ProcessContext, events: Any, samples: queue.SimpleQueue[TelemetrySample], collected: _Collected,
    on_event: Callable[[Event], None] | None, stop: threading.Event | None, deadline: float,
) -> str:
    """Pump events to the caller until every rank is done; returns how the burst ended."""
    while True:
        _drain(events, collected, on_event, timeout=POLL_S)
        while not samples.empty():
            sample = samples.get()
            if on_event is not None:
                on_event(sample)
        if stop is not None and stop.is_set():
            return "stopped"
        # Exit codes are read at the first failure, before teardown signals blur who died first.
        codes = [process.exitcode for process in context.processes]
        if any(code not in (0, None) for code in codes):
            collected.exit_codes = codes
            _drain(events, collected, on_event, timeout=0.2)
            return "failed"
        if all(code == 0 for code in codes):
            _drain(events, collected, on_event)
            return "exited"
        if time.perf_counter() > deadline:
            return "timeout"


def _drain(events: Any, collected: _Collected, on_event: Callable[[Event], None] | None,
           timeout: float = 0.0) -> None:
    """Handle every queued event; wait up to ``timeout`` for the first one."""
    block = timeout > 0
    while True:
        try:
            event = events.get(block, timeout) if block else events.get_nowait()
        except (queue.Empty, OSError, ValueError, EOFError):
            return
        block = False
        collected.handle(event, on_event, time.perf_counter())


def _terminate(context: ProcessContext) -> None:
    """Stop every rank and its DataLoader workers: SIGTERM, a short grace, then SIGKILL."""
    family: list[psutil.Process] = []
    for process in context.processes:
        if process.pid is None:
            continue
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(process.pid)
            family.extend(parent.children(recursive=True))
            family.append(parent)
    for member in family:
        with contextlib.suppress(psutil.Error):
            member.terminate()
    _, alive = psutil.wait_procs(family, timeout=TEARDOWN_GRACE_S)
    for member in alive:
        with contextlib.suppress(psutil.Error):
            member.kill()
    psutil.wait_procs(alive, timeout=TEARDOWN_GRACE_S)
    for process in context.processes:
        process.join(timeout=TEARDOWN_GRACE_S)


def _remove_error_files(context: ProcessContext) -> None:
    """torch's per-rank error files live in the system temp dir; they are ours to delete."""
    for path in context.error_files:
        with contextlib.suppress(OSError):
            os.remove(path)


def _finish(result: BurstResult, collected: _Collected, outcome: str, called_at: float,
            timeout_s: float) -> BurstResult:
    result.steps = collected.steps_with_losses()
    result.ranks = [collected.ranks[r] for r in sorted(collected.ranks)]
    result.environment = {**collected.environment, **result.environment}
    result.warnings.extend(w for w in collected.warnings if w not in result.warnings)
    result.wall_s = time.perf_counter() - called_at
    foreign = result.foreign_cpu_pct
    if foreign is not None and foreign >= FOREIGN_LOAD_WARN_PCT:
        result.warnings.append(
            f"other processes used ~{foreign:.0f}% of this machine's CPU during the burst: its timings are "
            "unreliable (intra-op threads stall when their cores are taken). Re-run when the machine is quiet."
        )
    if collected.first_step_at is not None:
        result.time_to_first_step_s = collected.first_step_at - called_at
    all_done = len(collected.ranks) == result.world_size
    cause = collected.root_cause()
    if outcome == "exited" and all_done:
        return result
    if outcome == "failed" and all_done and cause is None:
        # Every rank delivered its complete measurement before one died in teardown: keep the numbers.
        result.warnings.append(f"{_crash_message(*collected.crashed_ranks()[0])} (after finishing its burst)")
        return result
    if outcome == "stopped" or (outcome == "exited" and cause is None):
        result.status = "stopped"
        result.error = ErrorInfo("stopped", "stopped before the end of the burst (Stop or an interrupt)")
        return result
    if outcome == "timeout":
        result.status = "timeout"
        result.error = ErrorInfo("timeout", f"no result within timeout_s={timeout_s:g} s: the burst was stopped "
                                 "(a hang, e.g. a rank waiting in a collective, or a burst longer than the timeout)")
        raise BurstTimeout(result.error.message, result)
    result.status = "failed"
    if cause is None:
        crashed = collected.crashed_ranks()
        rank, code = crashed[0] if crashed else (None, None)
        result.error = ErrorInfo("crash", _crash_message(rank, code), rank)
        raise WorkerCrashed(result.error.message, result)
    result.error = ErrorInfo("oom" if cause.kind == "oom" else "exception", cause.message, cause.rank, cause.traceback)
    error_cls = WorkerOutOfMemory if cause.kind == "oom" else WorkerError
    raise error_cls(f"rank {cause.rank} failed: {cause.message}\n\n-- rank {cause.rank} traceback --\n"
                    f"{cause.traceback}", result)


def _crash_message(rank: int | None, exit_code: int | None) -> str:
    who = "a rank" if rank is None else f"rank {rank}"
    if exit_code is not None and exit_code < 0:
        how = f"was killed by {signal.Signals(-exit_code).name}"
    else:
        how = f"exited with code {exit_code}" if exit_code is not None else "died"
    return (f"{who} {how} without raising an exception. If it was SIGKILL, the likely cause is the operating "
            "system's out-of-memory killer: use a smaller batch_size or fewer num_workers")


def _run_in_process(
    workload: Workload, spec: BurstSpec, result: BurstResult, on_event: Callable[[Event], None] | None,
    stop: threading.Event | None, called_at: float,
) -> BurstResult:
    """The explicit fallback for workloads that cannot be pickled: same loop, no isolation."""
    if spec.config.parallel == "ddp":
        raise ConfigError("isolation='inprocess' runs in the caller: DDP needs isolation='process'")
    warnings.warn(
        "run_burst(isolation='inprocess') trains in this process: a crash or out-of-memory takes this kernel down, "
        "a hang cannot be timed out, and on a GPU this process initialises CUDA (DDP can then no longer be "
        "launched from it). Numbers are comparable; safety is not.",
        IsolationWarning,
        stacklevel=3,
    )
    collected = _Collected()
    private = _with_private_model(workload)
    try:
        run_rank(0, private, spec, lambda event: collected.handle(event, on_event, time.perf_counter()),
                 should_stop=stop.is_set if stop is not None else lambda: False)
        outcome = "exited"
    except Exception as exc:
        collected.errors.append(RankFailed.from_exception(0, time.perf_counter() - called_at, exc))
        outcome = "failed"
    if outcome == "exited" and stop is not None and stop.is_set():
        outcome = "stopped"
    return _finish(result, collected, outcome, called_at, 0.0)


def _with_private_model(workload: Workload) -> Workload:
    """The user's model must never be trained in place; the dataset is only read, so it is shared."""
    if not isinstance(workload.model, nn.Module):
        return workload
    try:
        model = copy.deepcopy(workload.model)
    except Exception as exc:
        raise WorkloadNotPicklable(
            f"isolation='inprocess' needs a private copy of the model, and copy.deepcopy failed ({exc}). "
            "Pass a zero-argument model factory instead of an instance."
        ) from exc
    return replace(workload, model=model)


def leftover_temp_files(owner_pid: int | None = None) -> list[str]:
    """torch/multiprocessing leftovers a burst must never leave in the system temp dir (used by tests).

    Burst dirs carry the launching process id; ``owner_pid`` restricts them to one launcher.
    """
    root = tempfile.gettempdir()
    owner = "" if owner_pid is None else f"{owner_pid}-"
    patterns = ("pytorch-errorfile-*", "torchelastic_*", f"{BURST_DIR_PREFIX}{owner}*")
    return sorted(p for pattern in patterns for p in glob.glob(os.path.join(root, pattern)))
