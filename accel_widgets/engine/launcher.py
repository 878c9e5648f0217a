"""Launch a burst's rank processes, stream their events, and always clean up after them.

Ranks are forked from the preloaded forkserver (:mod:`.forkserver` says why) with torch's own
``start_processes``, so a failing rank's traceback and the teardown of its peers follow torch's
machinery; the workload travels cloudpickled, by value. Nothing a burst starts outlives it or its
caller: teardown survives repeated Ctrl-C, ranks die with the process that launched them, and the
temp dirs of callers that were killed are removed by the next burst.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import multiprocessing.connection
import os
import queue
import re
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import psutil
from torch import nn
from torch.multiprocessing.spawn import ProcessContext, _wrap  # torch's rank wrapper: tracebacks to an error file

from ..data.cache import cache_root
from ..inputs.device import DeviceInfo, probe_device, worker_env
from ..inputs.workload import Workload
from ..knobs.config import Config
from ..knobs.plan import resolve
from ..knobs.rules import ConfigError
from ..results.burst import BurstPhase, BurstResult, ErrorInfo, RankSummary, StepRecord, TelemetrySample
from .events import EventChannel, Phase, RankDone, RankFailed, RankLosses, StepBatch, WorkerEvent
from .forkserver import MP_DIR_PREFIX, RANK_NAME_PREFIX, START_METHOD, forkserver_context, warm_up
from .payload import pickle_for_ranks
from .request import DEFAULT_TIMEOUT_S, BurstRequest
from .stacks import where_stuck
from .telemetry import TelemetrySampler
from .worker import BurstSpec, run_rank, worker_main

BURST_DIR_PREFIX = "accel-widgets-burst-"  # + the owning process id, so leftovers can be attributed
#: How often the caller wakes once steps stream: on a machine whose cores the ranks' threads fill, each
#: wake-up of this process preempts one of them. Measured on a 2-core machine (benchmarks/harness_overhead.py),
#: each tick of the pump cost ~0.7 ms of CPU; at 5 Hz events still reach ``on_event`` within a tick and a rank's
#: batch (``worker.STEP_BATCH_S``), which no live view here needs faster (the panel draws once a second).
PUMP_TICK_S = 0.2
TEARDOWN_GRACE_S = 0.5
#: Once every rank has delivered its result, how long its processes get to exit on their own (loader workers
#: joining, a compile worker pool, a large CUDA context) before they are ended and the result kept.
EXIT_GRACE_S = 3.0
COLLECTIVE_TIMEOUT_SHARE = 0.5  # a DDP collective fails after this share of the burst's timeout

Event = StepRecord | TelemetrySample | BurstPhase
SYNC_DEBUG_DDP_NOTE = ("sync_debug covers the host-device syncs of torch's CUDA calls, not torch.distributed's: "
                       "NCCL collectives and DDP's gradient buckets are not checked, so a burst that passes says "
                       "nothing about them")


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


def inductor_cache_dir(cache_dir: str) -> str:
    """Where the ranks keep compiled kernels: a private (0700) directory under the project's cache root.

    torch's own default is one shared, world-readable directory in the system temp dir. A directory the
    user chose with ``TORCHINDUCTOR_CACHE_DIR`` wins; torch's default, which the caller's environment
    holds once anything compiled in this process, does not count as a choice.
    """
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    torch_default = os.path.join(tempfile.gettempdir(), "torchinductor_")
    if chosen and not os.path.abspath(chosen).startswith(torch_default):
        return chosen
    path = os.path.join(cache_dir, "inductor")
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _prepare_profile_dir(path: str) -> str:
    """Traces outlive the burst (its temp dir is removed), so they go to a directory the user chose."""
    os.makedirs(path, exist_ok=True)
    return os.path.abspath(path)


def pickle_workload(workload: Workload, spec: BurstSpec) -> tuple[bytes, list[str]]:
    """Serialise by value, the user's modules' code as this process holds it now (:mod:`.payload`); returns the
    bytes and a note per user module that travels by name instead. On failure say what cannot travel and how to
    fix it."""
    try:
        return pickle_for_ranks((workload, spec))
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
    phases: list[Phase] = field(default_factory=list)  # what each rank was doing when the burst ended
    where: dict[int, str] = field(default_factory=dict)  # where a stuck rank was, from its stacks (stacks.py)
    oom_kills_before: int | None = None
    first_step_at: float | None = None

    def handle(self, event: WorkerEvent, on_event: Callable[[Event], None] | None, now: float) -> None:
        if isinstance(event, StepBatch):
            for record in event.records:
                self.handle(record, on_event, now)
        elif isinstance(event, StepRecord):
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
            self.warnings.extend(w for w in event.warnings if w not in self.warnings)

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
        """``(rank, exit code)`` of ranks that ended without finishing and without sending an error event.

        Exit code 0 counts: ranks ignore Ctrl-C, so a rank that exits cleanly before reporting its
        result was ended by the workload itself (``os._exit(0)``), never by an interrupt.
        """
        reported = {e.rank for e in self.errors}
        return [(rank, code) for rank, code in enumerate(self.exit_codes)
                if code is not None and rank not in reported and (code != 0 or rank not in self.ranks)]

    def where_ranks_were(self, besides: int | None = None) -> str:
        """'rank 1 was waiting for its DataLoader ...' for every rank still running when the burst ended."""
        running = [rank for rank, code in enumerate(self.exit_codes) if code is None and rank != besides]
        parts = [self.where.get(rank) or f"rank {rank} was {self.phases[rank].describe()}" for rank in running
                 if rank < len(self.phases)]
        return "; ".join(parts)


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
    sync_debug: bool = False,
) -> BurstResult:
    """Train ``workload`` under ``config`` for a short timed burst and return what was measured.

    Runs ``steps`` measured steps (default 40) or for ``seconds``, after ``warmup_steps`` unmeasured
    ones (default 2, or 3 when compiling). ``on_event`` receives every step record and telemetry sample
    live, on the calling thread, and a :class:`~accel_widgets.results.burst.BurstPhase` when a rank starts,
    sets up, steps or finishes (worker isolation), so a progress display can name a long first step.
    Setting ``stop`` ends the burst early (status "stopped").
    ``profile_steps`` > 0 records that many extra steady-state steps with torch.profiler after the
    measured window (rank 0) and writes the trace under ``profile_dir`` (``result.profile``).
    ``sync_debug=True`` runs the measured steps under torch's CUDA sync-debug mode "error": a hidden
    host-device sync (anything but the loss read ``sync_every`` asks for) fails the burst with the
    traceback of the line that synced; torch.distributed's own syncs (NCCL collectives, DDP's bucket
    and buffer traffic) are outside that mode, so under DDP it vouches for the rest of the step only (the
    result's warnings say so). Raises :class:`BurstRequestError` or :class:`ConfigError` before
    starting anything if an argument is unusable (steps and seconds together too) or the config cannot
    run here, and a
    :class:`BurstError` subclass (with ``.result``) if the burst fails, times out or crashes; a loss
    that turns NaN/inf raises nothing and ends with status "diverged".
    """
    request = BurstRequest(steps, seconds, warmup_steps, timeout_s, profile_steps, profile_dir, sync_debug)
    if not isinstance(config, Config | None):
        raise TypeError(f"config must be an accel_widgets.Config, got {type(config).__name__}: pass "
                        "Config(precision='bf16'), or Config(**knobs) for a dict of knob values")
    if isolation not in ("process", "inprocess"):
        raise ValueError(f"isolation={isolation!r} is invalid: use 'process' or 'inprocess'")
    called_at = time.perf_counter()
    plan = resolve(config or Config(), device or probe_device(), workload)
    request = request.resolved(plan.warmup_steps)
    cache_dir = cache_dir or str(cache_root())
    owner = psutil.Process()
    spec = BurstSpec(
        plan=plan, request=replace(request, profile_dir=_prepare_profile_dir(profile_dir) if profile_steps else ""),
        environment={**os.environ, **worker_env()}, clock_origin=called_at, cache_dir=cache_dir,
        owner_pid=owner.pid, owner_started=owner.create_time(), inductor_cache_dir=inductor_cache_dir(cache_dir),
        collective_timeout_s=timeout_s * COLLECTIVE_TIMEOUT_SHARE,
    )
    notes = [SYNC_DEBUG_DDP_NOTE] if sync_debug and plan.group is not None else []
    result = BurstResult(workload=workload.name, config=plan.config, status="ok", world_size=plan.ranks,
                         warmup_steps=request.warmup_steps or 0, tokens_per_sample=workload.tokens_per_sample,
                         warnings=[*plan.warnings, *notes], label=label, facts=plan.facts,
                         environment={"driver": plan.device.driver, "gpus": [g.name for g in plan.device.gpus],
                                      "start_method": START_METHOD if isolation == "process" else "inprocess"})
    if isolation == "inprocess":
        return _run_in_process(workload, spec, result, on_event, stop, called_at)
    return _run_in_workers(workload, spec, result, on_event, stop, called_at)


def _run_in_workers(
    workload: Workload, spec: BurstSpec, result: BurstResult, on_event: Callable[[Event], None] | None,
    stop: threading.Event | None, called_at: float,
) -> BurstResult:
    warm_up()  # returns at once; the server imports torch while we pickle
    remove_orphaned_burst_dirs()
    temp_dir = tempfile.mkdtemp(prefix=f"{BURST_DIR_PREFIX}{os.getpid()}-")
    spec = replace(spec, temp_dir=temp_dir)
    samples: queue.SimpleQueue[TelemetrySample] = queue.SimpleQueue()
    sampler = TelemetrySampler(clock_origin=called_at, on_sample=samples.put,
                               gpus=[(g.index, g.nvml_key) for g in spec.plan.gpus])
    mp_context = forkserver_context()
    events = EventChannel(mp_context)
    phases = mp_context.Array("b", spec.plan.ranks, lock=False)  # one Phase per rank, written by the rank
    context: ProcessContext | None = None
    collected = _Collected(oom_kills_before=oom_kill_count())

    def tear_down() -> None:
        result.telemetry = sampler.stop()
        if context is not None:
            _terminate(context)
            _drain(events, collected, None)
        events.close()
        shutil.rmtree(temp_dir, ignore_errors=True)

    try:
        payload, notes = pickle_workload(workload, spec)
        result.warnings.extend(notes)
        context = _start_ranks(payload, events, phases, spec.plan.ranks, temp_dir)
        events.close_writer()
        for pid in context.pids():
            sampler.watch(pid)
        sampler.start()
        watch = _PhaseWatch(phases, called_at)
        outcome = _collect(context, events, watch, samples, collected, on_event, stop,
                           called_at + spec.request.timeout_s)
        collected.where = where_stuck(outcome, context.processes, collected.steps, [p.describe() for p in watch.now()],
                                      temp_dir, time.perf_counter() - called_at)
    except BaseException:
        _shielded(tear_down, reraise_interrupt=False)
        raise
    _shielded(tear_down, reraise_interrupt=True)
    return _finish(result, collected, outcome, called_at, spec.request.timeout_s)


def _shielded(cleanup: Callable[[], None], *, reraise_interrupt: bool) -> None:
    """Run ``cleanup`` to its end even when Ctrl-C is pressed again meanwhile.

    A second interrupt must not abandon teardown halfway (ranks left running, temp dirs left behind): on the
    main thread SIGINT is held back until the cleanup is done, then re-raised unless an exception (the first
    interrupt, usually) is already on its way out.
    """
    if threading.current_thread() is not threading.main_thread():
        cleanup()  # signals are only ever delivered to the main thread
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        cleanup()
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if held and reraise_interrupt:
        raise KeyboardInterrupt


def _start_ranks(payload: bytes, events: EventChannel, phases: Any, ranks: int, temp_dir: str) -> ProcessContext:
    """Fork every rank from the preloaded server, the way ``torch.multiprocessing.start_processes`` does
    (its ``_wrap`` writes a rank's traceback to an error file, its ``ProcessContext`` holds the ranks), but
    with each process named as a rank: the server then does not run the caller's main script again in
    it (:func:`.forkserver.prepare_rank`), so a script may call run_burst at top level, with no main guard.
    The error files live in the burst's temp dir, which teardown removes."""
    context = forkserver_context()
    processes, error_files = [], []
    try:
        for rank in range(ranks):
            error_file = os.path.join(temp_dir, f"rank-{rank}.error")
            process = context.Process(target=_wrap, name=f"{RANK_NAME_PREFIX}{rank}",
                                      args=(worker_main, rank, (payload, events, phases), error_file))
            process.start()
            processes.append(process)
            error_files.append(error_file)
    except BaseException:
        for process in processes:
            process.kill()
            process.join()
        raise
    return ProcessContext(processes, error_files)


def _collect(
    context: ProcessContext, events: EventChannel, watch: _PhaseWatch, samples: queue.SimpleQueue[TelemetrySample],
    collected: _Collected, on_event: Callable[[Event], None] | None, stop: threading.Event | None, deadline: float,
) -> str:
    """Pump events to the caller until every rank is done; returns how the burst ended.

    Until the first step record arrives, each message wakes the pump (a progress line shows setup and
    the first step at once). From then on it sleeps ``PUMP_TICK_S`` at a time and reads what the ranks
    wrote meanwhile, so steps streaming in never wake it; a rank process that ends wakes it at once.
    """
    codes: list[int | None] = [None] * len(context.processes)
    delivered_at: float | None = None
    while True:
        if collected.first_step_at is None:
            _drain(events, collected, on_event, timeout=PUMP_TICK_S, watch=watch)
        else:
            # Only running ranks' sentinels: an ended rank's stays ready and would end every wait.
            running = [p.sentinel for p, code in zip(context.processes, codes, strict=True) if code is None]
            multiprocessing.connection.wait(running, timeout=PUMP_TICK_S)
            _drain(events, collected, on_event, watch=watch)
        while not samples.empty():
            sample = samples.get()
            if on_event is not None:
                on_event(sample)
        if stop is not None and stop.is_set():
            return "stopped"
        # Exit codes and phases are read at the first failure, before teardown blurs who died first.
        codes = [process.exitcode for process in context.processes]
        if _ended_unfinished(codes, collected):
            _drain(events, collected, on_event, timeout=0.2, watch=watch)  # its last events may still be in the pipe
            if _ended_unfinished(codes, collected):
                collected.exit_codes, collected.phases = codes, watch.now()
                return "failed"
        if all(code == 0 for code in codes):
            _drain(events, collected, on_event, watch=watch)
            collected.exit_codes = codes
            return "exited"
        if delivered_at is None and len(collected.ranks) == len(codes):
            delivered_at = time.perf_counter()
        if delivered_at is not None and time.perf_counter() - delivered_at > EXIT_GRACE_S:
            collected.exit_codes, collected.phases = codes, watch.now()
            return "slow_exit"  # every result is in: teardown ends the ranks that are still running
        if time.perf_counter() > deadline:
            collected.exit_codes, collected.phases = codes, watch.now()
            return "timeout"


def _ended_unfinished(codes: list[int | None], collected: _Collected) -> bool:
    """A rank has ended without delivering its result (it failed, or something ended its process)."""
    return any(code is not None and (code != 0 or rank not in collected.ranks) for rank, code in enumerate(codes))


def _drain(events: EventChannel, collected: _Collected, on_event: Callable[[Event], None] | None,
           timeout: float = 0.0, watch: _PhaseWatch | None = None) -> None:
    """Handle every waiting event; wait up to ``timeout`` for the first one.

    Everything waiting is read out of the pipe before any of it is handed to ``on_event``: a slow
    callback must never leave the pipe full, or the ranks would block writing and train slower.
    Phase changes keep the order they happened in: a rank enters a phase before it sends what that phase
    produces, so they go first (read before and after the pipe); it sends its last step records before it
    finishes, so "finishing" goes after them, and only once it was seen before the pipe was read.
    """
    tell = on_event or _nobody
    finishing = watch.changes(finishing=True) if watch is not None else []
    waiting: list[WorkerEvent] = []
    while True:
        try:
            event = events.get(timeout)
        except (OSError, ValueError, EOFError):  # every rank is gone and the pipe is empty, or closed
            break
        if event is None:
            break
        waiting.append(event)
        timeout = 0.0
    entered = [change for change in finishing if change.phase != "finishing"]
    entered += watch.changes(finishing=False) if watch is not None else []
    for change in entered:
        tell(change)
    for event in waiting:
        collected.handle(event, on_event, time.perf_counter())
    for change in finishing:
        if change.phase == "finishing":
            tell(change)


def _nobody(event: Event) -> None:
    """What ``_drain`` tells of phase changes when the caller passed no ``on_event``."""


class _PhaseWatch:
    """The ranks' shared phase array read as events: one ``BurstPhase`` per change of a rank's phase."""

    def __init__(self, phases: Any, clock_origin: float) -> None:
        self._phases, self._origin = phases, clock_origin
        self._seen: list[str | None] = [None] * len(phases)

    def now(self) -> list[Phase]:
        return [Phase(value) for value in self._phases]

    def changes(self, *, finishing: bool) -> list[BurstPhase]:
        """The phases entered since the last call; with ``finishing=False`` a finishing rank is left to a
        later call (its last events may not have been read yet)."""
        t = time.perf_counter() - self._origin
        changed = []
        for rank, phase in enumerate(self.now()):
            name = phase.public_name
            if name != self._seen[rank] and (finishing or name != "finishing"):
                self._seen[rank] = name
                changed.append(BurstPhase(t, rank, name))
        return changed


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
    alive = _wait_gone(family, TEARDOWN_GRACE_S)
    for member in alive:  # e.g. a workload that traps SIGTERM
        with contextlib.suppress(psutil.Error):
            member.kill()
    _wait_gone(alive, TEARDOWN_GRACE_S)
    for process in context.processes:
        process.join(timeout=TEARDOWN_GRACE_S)


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited; returns those still running after ``timeout``.

    A process that has exited but not been reaped yet (a zombie: a loader worker whose rank has not
    called wait) is gone for our purposes; psutil's ``wait_procs`` would wait out the grace for it.
    """
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in processes if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.005)


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _finish(result: BurstResult, collected: _Collected, outcome: str, called_at: float,
            timeout_s: float) -> BurstResult:
    result.steps = collected.steps_with_losses()
    result.ranks = [collected.ranks[r] for r in sorted(collected.ranks)]
    result.environment = {**collected.environment, **result.environment}
    result.warnings.extend(w for w in collected.warnings if w not in result.warnings)
    result.wall_s = time.perf_counter() - called_at
    if collected.first_step_at is not None:
        result.time_to_first_step_s = collected.first_step_at - called_at
    all_done = len(collected.ranks) == result.world_size
    cause = collected.root_cause()
    if all_done and (outcome in ("exited", "slow_exit") or (outcome == "failed" and cause is None)):
        if outcome == "slow_exit":
            slow = [str(rank) for rank, code in enumerate(collected.exit_codes) if code is None]
            who = f"rank {slow[0]}" if len(slow) == 1 else f"ranks {', '.join(slow)}"
            result.warnings.append(f"{who} delivered the result but had not exited {EXIT_GRACE_S:g} s later "
                                   "(loader workers, a compile pool or a CUDA context slow to close?): ended, and "
                                   "the result kept")
        if outcome == "failed":
            # Every rank delivered its complete measurement before one died in teardown: keep the numbers.
            rank, code = collected.crashed_ranks()[0]
            result.warnings.append(f"{_crash_message(rank, code, collected)} "
                                   "(after finishing its burst)")
        # A NaN/inf loss is the model's outcome, not the engine's: keep the numbers, raise nothing, but say so.
        result.error = result.divergence()
        if result.error is not None:
            result.status = "diverged"
        return result
    if outcome == "stopped":
        result.status = "stopped"
        result.error = ErrorInfo("stopped", "stopped before the end of the burst (Stop or an interrupt)"
                                 + "".join(f"; {where}" for where in collected.where.values()))
        return result
    if outcome == "timeout":
        result.status = "timeout"
        where = collected.where_ranks_were()
        result.error = ErrorInfo("timeout", f"no result within timeout_s={timeout_s:g} s: the burst was stopped"
                                 + (f" ({where})" if where else ""))
        raise BurstTimeout(result.error.message, result)
    result.status = "failed"
    if cause is None:
        crashed = collected.crashed_ranks()
        rank, code = crashed[0] if crashed else (None, None)
        result.error = ErrorInfo("crash", _crash_message(rank, code, collected), rank)
        raise WorkerCrashed(result.error.message, result)
    message = cause.message
    if cause.peer_failure and (where := collected.where_ranks_were(besides=cause.rank)):
        message += f" ({where})"
    kind = cause.kind if cause.kind in ("oom", "exit") else "exception"
    result.error = ErrorInfo(kind, message, cause.rank, cause.traceback)
    error_cls = WorkerOutOfMemory if cause.kind == "oom" else WorkerError
    raise error_cls(f"rank {cause.rank} failed: {message}\n\n-- rank {cause.rank} traceback --\n"
                    f"{cause.traceback}", result)


def _crash_message(rank: int | None, exit_code: int | None, collected: _Collected) -> str:
    """Why a rank vanished without raising, saying only what the evidence supports."""
    who = "a rank" if rank is None else f"rank {rank}"
    if exit_code is None:
        return f"{who} died without raising an exception"
    if rank is not None and rank < len(collected.phases) and collected.phases[rank] == Phase.STARTING:
        return (f"{who} died while starting, before the burst's code ran (exit code {exit_code}). If this process "
                "started a multiprocessing forkserver before importing accel_widgets, the ranks come from that "
                "server, which runs your main script again in each of them: import accel_widgets first")
    if exit_code == 0:
        return (f"{who} exited (code 0) before finishing its burst, without raising an exception: the workload "
                "or a library it calls ended the process (os._exit(0)?)")
    if exit_code > 0:
        return (f"{who} exited with code {exit_code} without raising a Python exception: the workload or a "
                f"native library ended the process (os._exit({exit_code}) or a C-level exit())")
    name = signal.Signals(-exit_code).name
    if -exit_code != signal.SIGKILL:
        return f"{who} was killed by {name}" + (" (a crash in native code)" if name in _CRASH_SIGNALS else "")
    kills_now = oom_kill_count()
    before = collected.oom_kills_before
    if before is not None and kills_now is not None and kills_now > before:
        return (f"{who} was killed by SIGKILL from the kernel's out-of-memory killer (its OOM kill count rose "
                "during the burst): use a smaller batch_size or fewer num_workers")
    known = "no out-of-memory kill was recorded" if kills_now is not None else "the OOM killer cannot be checked here"
    return f"{who} was killed by SIGKILL from outside the burst ({known})"


_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed in this memory cgroup (None: cannot tell).

    Read before a burst and after a rank died of SIGKILL: only a rise is evidence of the OOM killer.
    """
    for path in _memory_event_files():
        with contextlib.suppress(OSError, ValueError), open(path) as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


def _memory_event_files() -> list[str]:
    """cgroup v2's memory.events for this process's cgroup, then cgroup v1's memory.oom_control."""
    files = []
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as fh:
        for line in fh:
            hierarchy, _, path = line.strip().partition("::")
            if hierarchy == "0" and path:
                files.append(os.path.join("/sys/fs/cgroup", path.lstrip("/"), "memory.events"))
    files += ["/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"]
    return files


def _run_in_process(
    workload: Workload, spec: BurstSpec, result: BurstResult, on_event: Callable[[Event], None] | None,
    stop: threading.Event | None, called_at: float,
) -> BurstResult:
    """The explicit fallback for workloads that cannot be pickled: same loop, no isolation."""
    if spec.plan.group is not None:
        raise ConfigError("isolation='inprocess' runs in the caller: DDP and FSDP ranks need isolation='process'")
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


def remove_orphaned_burst_dirs() -> list[str]:
    """Delete the temp dirs of owners that are gone (killed before they could clean up after themselves).

    Burst dirs and an owner's multiprocessing dir are named after the owner's pid; the owner counts as
    gone when no process has that pid, or when the process that has it started after the dir was made
    (the pid was recycled).
    """
    removed = []
    pattern = re.compile(f"(?:{re.escape(BURST_DIR_PREFIX)}|{re.escape(MP_DIR_PREFIX)})" + r"(\d+)-")
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "accel-widgets-*")):
        match = pattern.match(os.path.basename(path))
        if match is None or _owner_alive(int(match.group(1)), path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _owner_alive(pid: int, path: str) -> bool:
    try:
        owner = psutil.Process(pid)
        return owner.status() != psutil.STATUS_ZOMBIE and owner.create_time() <= os.stat(path).st_mtime + 1.0
    except (psutil.Error, OSError):
        return False


def leftover_temp_files(owner_pid: int | None = None) -> list[str]:
    """torch/multiprocessing leftovers a burst must never leave in the system temp dir (used by tests).

    Burst dirs carry the launching process id; ``owner_pid`` restricts them to one launcher.
    """
    root = tempfile.gettempdir()
    owner = "" if owner_pid is None else f"{owner_pid}-"
    patterns = ("pytorch-errorfile-*", "torchelastic_*", f"{BURST_DIR_PREFIX}{owner}*")
    return sorted(p for pattern in patterns for p in glob.glob(os.path.join(root, pattern)))
