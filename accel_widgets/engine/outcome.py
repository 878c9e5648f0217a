"""What a burst's ranks sent and how they ended, turned into its result or the error that says why there is none.

Shared by the one-off burst (:func:`~accel_widgets.engine.launcher.run_burst`) and the held one
(:class:`~accel_widgets.engine.held.HeldBurst`): a rank that died is named with only what the evidence supports (a
signal, an exit code, the kernel's OOM killer only when its count rose during the burst).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from ..results.burst import BurstResult, ErrorInfo
from .events import Phase
from .ranks import EXIT_GRACE_S, Collected


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


class ClusterError(BurstError):
    """A cluster could not run the burst as asked: its ranks' rendezvous endpoint is one a node cannot reach, or its
    ranks are not where the burst needs them. Raised before any rank trains, with everything placed removed."""


class Unseated(Exception):
    """The ranks could not be seated where the burst runs (a cluster with no room for them, a rendezvous a node cannot
    reach or did not reach in time): raised by the rank group before any rank trains, and turned into the
    :class:`BurstError` that says so once teardown is done (:meth:`error`)."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out

    def error(self, result: BurstResult) -> BurstError:
        """The burst's error, ``result`` filled in: a :class:`BurstTimeout` for a wait that ran out, else a
        :class:`ClusterError`."""
        result.status = "timeout" if self.timed_out else "failed"
        result.error = ErrorInfo("timeout" if self.timed_out else "config", str(self))
        return (BurstTimeout if self.timed_out else ClusterError)(str(self), result)


def finish(result: BurstResult, collected: Collected, outcome: str, called_at: float,
           timeout_s: float) -> BurstResult:
    """Fill ``result`` in from what the ranks sent and how they ended (``outcome``, as the rank group's pump or the
    in-process run tells it) and return it, or raise the :class:`BurstError` subclass that says why there is no
    measurement. A NaN/inf loss is the model's outcome, not the engine's: it ends "diverged" and raises nothing."""
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
    if rank is not None and rank in collected.lost:
        return collected.lost[rank]
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
