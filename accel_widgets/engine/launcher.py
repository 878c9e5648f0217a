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
import os
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import psutil
from torch import nn

from ..data.cache import cache_root
from ..inputs.device import DeviceInfo, probe_device, worker_env
from ..inputs.workload import Workload
from ..knobs.base import Part
from ..knobs.config import Config
from ..knobs.plan import resolve
from ..knobs.rules import ConfigError
from ..results.burst import BurstResult, ErrorInfo
from .events import Phase, RankFailed
from .forkserver import START_METHOD
from .payload import pickle_for_ranks
from .ranks import EXIT_GRACE_S, Collected, Event, RankGroup, shielded
from .request import DEFAULT_TIMEOUT_S, BurstRequest
from .worker import BurstSpec, run_rank

COLLECTIVE_TIMEOUT_SHARE = 0.5  # a DDP collective fails after this share of the burst's timeout

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
    freed: Part | None = None,
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
    result's warnings say so). ``freed`` trains a headspace variant of the config, one part of its step made free
    (``"data"``, ``"communication"``, ``"host"``: :mod:`accel_widgets.knobs.parts`; ``aw.headspace`` compares them
    with the config as it is). Raises :class:`BurstRequestError` or :class:`ConfigError` before
    starting anything if an argument is unusable (steps and seconds together too) or the config cannot
    run here, and a
    :class:`BurstError` subclass (with ``.result``) if the burst fails, times out or crashes; a loss
    that turns NaN/inf raises nothing and ends with status "diverged".
    """
    request = BurstRequest(steps, seconds, warmup_steps, timeout_s, profile_steps, profile_dir, sync_debug, freed)
    if not isinstance(config, Config | None):
        raise TypeError(f"config must be an accel_widgets.Config, got {type(config).__name__}: pass "
                        "Config(precision='bf16'), or Config(**knobs) for a dict of knob values")
    if isolation not in ("process", "inprocess"):
        raise ValueError(f"isolation={isolation!r} is invalid: use 'process' or 'inprocess'")
    called_at = time.perf_counter()
    spec, result = prepare_burst(workload, config, request, called_at=called_at, device=device, cache_dir=cache_dir,
                                 label=label, isolation=isolation)
    if isolation == "inprocess":
        return _run_in_process(workload, spec, result, on_event, stop, called_at)
    return _run_in_workers(workload, spec, result, on_event, stop, called_at)


def prepare_burst(workload: Workload, config: Config | None, request: BurstRequest, *, called_at: float,
                  device: DeviceInfo | None = None, cache_dir: str | None = None, label: str = "",
                  isolation: Literal["process", "inprocess"] = "process") -> tuple[BurstSpec, BurstResult]:
    """Resolve the config for this machine once and describe the burst: what its ranks are given (the spec, on the
    clock that starts at ``called_at``) and the result it will fill in. Raises :class:`ConfigError` for a config
    that cannot run here, before any process starts."""
    plan = resolve(config or Config(), device or probe_device(), workload, freed=request.freed)
    request = request.resolved(plan.warmup_steps)
    cache_dir = cache_dir or str(cache_root())
    owner = psutil.Process()
    profile_dir = _prepare_profile_dir(request.profile_dir) if request.profile_steps else ""
    spec = BurstSpec(
        plan=plan, request=replace(request, profile_dir=profile_dir),
        environment={**os.environ, **worker_env()}, clock_origin=called_at, cache_dir=cache_dir,
        owner_pid=owner.pid, owner_started=owner.create_time(), inductor_cache_dir=inductor_cache_dir(cache_dir),
        collective_timeout_s=request.timeout_s * COLLECTIVE_TIMEOUT_SHARE,
    )
    notes = [SYNC_DEBUG_DDP_NOTE] if request.sync_debug and plan.group is not None else []
    result = BurstResult(workload=workload.name, config=plan.config, status="ok", world_size=plan.ranks,
                         warmup_steps=request.warmup_steps or 0, tokens_per_sample=workload.tokens_per_sample,
                         warnings=[*plan.warnings, *notes], label=label, facts=plan.facts, freed=plan.freed,
                         environment={"driver": plan.device.driver, "gpus": [g.name for g in plan.device.gpus],
                                      "start_method": START_METHOD if isolation == "process" else "inprocess"})
    return spec, result


def _run_in_workers(
    workload: Workload, spec: BurstSpec, result: BurstResult, on_event: Callable[[Event], None] | None,
    stop: threading.Event | None, called_at: float,
) -> BurstResult:
    ranks = RankGroup(spec)
    collected = Collected(oom_kills_before=oom_kill_count())

    def tear_down() -> None:
        result.telemetry = ranks.tear_down(collected)

    try:
        payload, notes = pickle_workload(workload, ranks.spec)
        result.warnings.extend(notes)
        ranks.start(payload)
        outcome = ranks.collect(collected, on_event, stop, called_at + spec.request.timeout_s)
    except BaseException:
        shielded(tear_down, reraise_interrupt=False)
        raise
    shielded(tear_down, reraise_interrupt=True)
    return _finish(result, collected, outcome, called_at, spec.request.timeout_s)


def _finish(result: BurstResult, collected: Collected, outcome: str, called_at: float,
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
    if all_done and (outcome in ("exited", "slow_exit", "delivered") or (outcome == "failed" and cause is None)):
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


def _crash_message(rank: int | None, exit_code: int | None, collected: Collected) -> str:
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
    collected = Collected()
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
