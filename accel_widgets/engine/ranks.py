"""A burst's rank processes from start to teardown: forked, pumped for their events, and always ended.

:class:`RankGroup` is one burst's processes and everything around them (its temp dir, the event pipe, the
telemetry sampler); :func:`collect` pumps their events to the caller until the ranks are done, or, for a held
burst (:mod:`.held`), until each has delivered the window it was asked for. The launcher turns what was collected
into a result (:func:`~accel_widgets.engine.launcher.run_burst`).
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import psutil
from torch.multiprocessing.spawn import ProcessContext, _wrap  # torch's rank wrapper: tracebacks to an error file

from ..results.burst import BurstPhase, RankSummary, StepRecord, TelemetrySample
from .events import EventChannel, MeasureAgain, Phase, RankDone, RankFailed, RankLosses, StepBatch, WorkerEvent
from .forkserver import MP_DIR_PREFIX, RANK_NAME_PREFIX, forkserver_context, warm_up
from .process import running
from .stacks import where_stuck
from .telemetry import TelemetrySampler
from .worker import BurstSpec, worker_main

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

Event = StepRecord | TelemetrySample | BurstPhase


@dataclass
class Collected:
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
    telemetry: list[TelemetrySample] = field(default_factory=list)  # the samples pumped while collecting
    # Ranks whose process was lost where no exit code can be read (a cluster's actor that died, a node lost): why,
    # as the cluster tells it
    lost: dict[int, str] = field(default_factory=dict)
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

    def crashed_ranks(self) -> list[tuple[int, int | None]]:
        """``(rank, exit code)`` of ranks that ended without finishing and without sending an error event.

        Exit code 0 counts: ranks ignore Ctrl-C, so a rank that exits cleanly before reporting its
        result was ended by the workload itself (``os._exit(0)``), never by an interrupt. A lost rank (:attr:`lost`)
        has no exit code to read (None).
        """
        reported = {e.rank for e in self.errors}
        return [(rank, code) for rank, code in enumerate(self.exit_codes)
                if (code is not None or rank in self.lost) and rank not in reported
                and (code != 0 or rank not in self.ranks)]

    def where_ranks_were(self, besides: int | None = None) -> str:
        """'rank 1 was waiting for its DataLoader ...' for every rank still running when the burst ended."""
        running = [rank for rank, code in enumerate(self.exit_codes)
                   if code is None and rank != besides and rank not in self.lost]
        parts = [self.where.get(rank) or f"rank {rank} was {self.phases[rank].describe()}" for rank in running
                 if rank < len(self.phases)]
        return "; ".join(parts)


def shielded(cleanup: Callable[[], None], *, reraise_interrupt: bool) -> None:
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


def start_ranks(payload: bytes, events: EventChannel, phases: Any, ranks: int, temp_dir: str,
                commands: list[Any] | None = None) -> ProcessContext:
    """Fork every rank from the preloaded server, the way ``torch.multiprocessing.start_processes`` does
    (its ``_wrap`` writes a rank's traceback to an error file, its ``ProcessContext`` holds the ranks), but
    with each process named as a rank: the server then does not run the caller's main script again in
    it (:func:`.forkserver.prepare_rank`), so a script may call run_burst at top level, with no main guard.
    The error files live in the burst's temp dir, which teardown removes. ``commands``: each rank's end of its
    pipe of held-window commands (a held burst)."""
    context = forkserver_context()
    processes, error_files = [], []
    try:
        for rank in range(ranks):
            error_file = os.path.join(temp_dir, f"rank-{rank}.error")
            args = (payload, events, phases) if commands is None else (payload, events, phases, commands[rank])
            process = context.Process(target=_wrap, name=f"{RANK_NAME_PREFIX}{rank}",
                                      args=(worker_main, rank, args, error_file))
            process.start()
            processes.append(process)
            error_files.append(error_file)
    except BaseException:
        for process in processes:
            process.kill()
            process.join()
        raise
    return ProcessContext(processes, error_files)


def collect(
    context: ProcessContext, events: EventChannel, watch: PhaseWatch, samples: queue.SimpleQueue[TelemetrySample],
    collected: Collected, on_event: Callable[[Event], None] | None, stop: threading.Event | None, deadline: float,
    *, until_delivered: bool = False,
) -> str:
    """Pump events to the caller until every rank is done; returns how the burst ended.

    Until the first step record arrives, each message wakes the pump (a progress line shows setup and
    the first step at once). From then on it sleeps ``PUMP_TICK_S`` at a time and reads what the ranks
    wrote meanwhile, so steps streaming in never wake it; a rank process that ends wakes it at once.
    ``until_delivered``: a held burst's window is done ("delivered") once every rank has sent its summary;
    its ranks stay.
    """
    codes: list[int | None] = [None] * len(context.processes)
    delivered_at: float | None = None
    while True:
        if collected.first_step_at is None:
            drain(events, collected, on_event, timeout=PUMP_TICK_S, watch=watch)
        else:
            # Only running ranks' sentinels: an ended rank's stays ready and would end every wait.
            running = [p.sentinel for p, code in zip(context.processes, codes, strict=True) if code is None]
            multiprocessing.connection.wait(running, timeout=PUMP_TICK_S)
            drain(events, collected, on_event, watch=watch)
        _pass_on(samples, collected, on_event)
        if stop is not None and stop.is_set():
            return "stopped"
        # Exit codes and phases are read at the first failure, before teardown blurs who died first.
        codes = [process.exitcode for process in context.processes]
        if _ended_unfinished(codes, collected):
            drain(events, collected, on_event, timeout=0.2, watch=watch)  # its last events may still be in the pipe
            if _ended_unfinished(codes, collected):
                collected.exit_codes, collected.phases = codes, watch.now()
                return "failed"
        if until_delivered and len(collected.ranks) == len(codes):
            _pass_on(samples, collected, on_event)
            collected.exit_codes = codes
            return "delivered"
        if all(code == 0 for code in codes):
            drain(events, collected, on_event, watch=watch)
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


def _pass_on(samples: queue.SimpleQueue[TelemetrySample], collected: Collected,
             on_event: Callable[[Event], None] | None) -> None:
    """The telemetry samples taken since the last tick: kept with what was collected, and handed on."""
    while not samples.empty():
        sample = samples.get()
        collected.telemetry.append(sample)
        if on_event is not None:
            on_event(sample)


def _ended_unfinished(codes: list[int | None], collected: Collected) -> bool:
    """A rank has ended without delivering its result (it failed, or something ended its process)."""
    return any(code is not None and (code != 0 or rank not in collected.ranks) for rank, code in enumerate(codes))


def drain(events: EventChannel, collected: Collected, on_event: Callable[[Event], None] | None,
           timeout: float = 0.0, watch: PhaseWatch | None = None) -> None:
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
    """What ``drain`` tells of phase changes when the caller passed no ``on_event``."""


class PhaseWatch:
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


def terminate(context: ProcessContext) -> None:
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
        alive = running(processes)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.005)




class RankGroup:
    """One burst's rank processes with everything around them: a private temp dir, the event pipe, the phases
    the ranks write, the telemetry sampler, and for a held burst a pipe of commands per rank.

    :meth:`start` forks the ranks from the preloaded server, :meth:`collect` pumps their events until they are
    done (or have delivered a held window), :meth:`tear_down` ends every process and removes the temp dir,
    whatever state the ranks are in. Samples are on the clock the spec starts at (``spec.clock_origin``).
    """

    def __init__(self, spec: BurstSpec, *, held: bool = False) -> None:
        warm_up()  # returns at once; the server imports torch while the caller pickles
        remove_orphaned_burst_dirs()
        self.temp_dir = tempfile.mkdtemp(prefix=f"{BURST_DIR_PREFIX}{os.getpid()}-")
        self.spec = replace(spec, temp_dir=self.temp_dir)
        self.held = held
        self._samples: queue.SimpleQueue[TelemetrySample] = queue.SimpleQueue()
        self.sampler = TelemetrySampler(clock_origin=spec.clock_origin, on_sample=self._samples.put,
                                        gpus=[(g.index, g.nvml_key) for g in spec.plan.gpus])
        mp_context = forkserver_context()
        self.events = EventChannel(mp_context)
        self._phases = mp_context.Array("b", spec.plan.ranks, lock=False)  # one Phase per rank, written by the rank
        self._watch = PhaseWatch(self._phases, spec.clock_origin)
        self._commands = [mp_context.Pipe(duplex=False) for _ in range(spec.plan.ranks)] if held else []
        self.context: ProcessContext | None = None
        self.ended = False

    def start(self, payload: bytes) -> None:
        """Fork the ranks and start sampling them."""
        readers = [reader for reader, _ in self._commands] or None
        self.context = start_ranks(payload, self.events, self._phases, self.spec.plan.ranks, self.temp_dir, readers)
        self.events.close_writer()
        for reader in readers or ():
            reader.close()  # the ranks hold theirs: a rank whose launcher is gone reads the end of its pipe
        for pid in self.context.pids():
            self.sampler.watch(pid)
        self.sampler.start()

    def collect(self, collected: Collected, on_event: Callable[[Event], None] | None, stop: threading.Event | None,
                deadline: float) -> str:
        """Pump the ranks' events into ``collected`` until they are done, or until each has delivered its window
        (a held burst); where a rank was stuck is read from its stacks before anything ends it."""
        assert self.context is not None, "start() the ranks first"
        outcome = collect(self.context, self.events, self._watch, self._samples, collected, on_event, stop,
                          deadline, until_delivered=self.held)
        collected.where = where_stuck(outcome, self.context.processes, collected.steps,
                                      [p.describe() for p in self._watch.now()], self.temp_dir,
                                      time.perf_counter() - self.spec.clock_origin)
        return outcome

    def measure_again(self, command: MeasureAgain) -> None:
        """Tell every held rank to measure one window more; the sampler samples while they do."""
        self.sampler.resume()
        for _, writer in self._commands:
            writer.send(command)

    def pause(self) -> None:
        """The held ranks wait for their next window: nothing is sampled meanwhile."""
        self.sampler.pause()

    def finish(self, grace_s: float) -> None:
        """Tell the held ranks to finish, and give them ``grace_s`` to exit on their own (loader workers joined,
        the process group left) before :meth:`tear_down` ends whatever is left."""
        for _, writer in self._commands:
            with contextlib.suppress(OSError):
                writer.send(None)
        if self.context is not None:
            deadline = time.monotonic() + grace_s
            for process in self.context.processes:
                process.join(max(0.0, deadline - time.monotonic()))

    def tear_down(self, collected: Collected) -> list[TelemetrySample]:
        """End every process of the burst, read what they sent last into ``collected``, remove the temp dir;
        returns every telemetry sample taken. Idempotent."""
        if self.ended:
            return self.sampler.samples
        self.ended = True
        samples = self.sampler.stop()
        if self.context is not None:
            terminate(self.context)
            drain(self.events, collected, None)
        for _, writer in self._commands:
            writer.close()
        self.events.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return samples


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
