"""What one rank of a burst does, from process start to its last event.

:func:`worker_main` is the entry point the launcher starts in every rank process: a single-process
burst is simply a burst of one rank, so DDP adds a process group and nothing else. The same
:func:`run_rank` also serves the explicit in-process fallback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import platform
import random
import signal
import site
import sys
import sysconfig
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from ..data.streams import stream_reading
from ..inputs.device import probe_device
from ..inputs.workload import Workload
from ..knobs import global_flags, memory
from ..knobs.compiling import CompileWatch
from ..knobs.plan import Plan
from ..results.burst import RankSummary, StepRecord
from .events import Emit, EventChannel, MeasureAgain, Phase, RankDone, RankFailed, StepBatch, WorkerEvent
from .group import Rendezvous, joined
from .process import (
    RankSeat,
    become_subreaper,
    die_with_owner,
    end_strays,
    keep_freed_memory,
    thread_busy_s,
    torch_threads,
    use_environment,
    use_inductor_cache,
    use_private_temp_dir,
    use_rank_environment,
)
from .request import BurstOptions, BurstRequest
from .stacks import dump_stacks_on_signal
from .training import TrainingLoop, build_loop, rank_summary

#: Step records leave a rank at most this late: each message costs the rank's training thread a pickling and a
#: write, so fast steps go ten a second in batches; the caller reads them every ``launcher.PUMP_TICK_S`` anyway.
STEP_BATCH_S = 0.1
HANG_FLUSH_S = 0.25  # ... and at most this late when the rank stops sending (blocked in a collective, a loader)


@dataclass(frozen=True)
class BurstSpec:
    """Everything a rank needs besides the workload; built by the launcher, plain and picklable.

    ``plan`` is the config resolved for the machine, ``request`` what the burst measures and records (its
    defaults taken). ``environment`` is the caller's at launch: the forkserver's copy is as old as the server.
    """

    plan: Plan
    request: BurstRequest
    environment: dict[str, str]
    clock_origin: float
    cache_dir: str
    temp_dir: str = ""
    owner_pid: int = 0
    owner_started: float = 0.0  # the owner's create time: a recycled pid is not the owner
    inductor_cache_dir: str = ""
    collective_timeout_s: float = 300.0


@dataclass(frozen=True)
class HeldWindows:
    """What a held rank needs to measure more windows after its first: the commands from the launcher, and the
    workload's bytes, unpickled afresh for each window so that it starts from the same untrained state."""

    commands: Any  # the read end of a multiprocessing pipe of MeasureAgain | None
    payload: bytes

    def __iter__(self) -> Iterator[MeasureAgain]:
        """The commands until the launcher says finish (None) or is gone (the pipe ends)."""
        while True:
            try:
                command = self.commands.recv()
            except (EOFError, OSError):
                return
            if command is None:
                return
            yield command


def worker_main(rank: int, payload: bytes, events: EventChannel, phases: Any, commands: Any = None) -> None:
    """Rank process entry point on the caller's machine (started by ``torch.multiprocessing.start_processes``): the
    rank's events go to the launcher's pipe, its phase to the array the launcher reads (:func:`rank_main`)."""

    def mark(phase: Phase) -> None:
        phases[rank] = int(phase)

    try:
        rank_main(rank, payload, events.put, mark, commands=commands)
    finally:
        events.close()


@dataclass(frozen=True)
class Seat:
    """A rank placed on a cluster node (:mod:`.cluster`), as its actor sets it up before the rank runs: where it sits in
    the group, the burst's clock origin on this node's clock (the driver's origin plus the node's measured offset),
    the store it meets its peers at, and the node's own temp dir and caches (the caller's paths are not on this node).
    """

    place: RankSeat
    clock_origin: float
    rendezvous: Rendezvous | None
    temp_dir: str
    cache_dir: str
    inductor_cache_dir: str

    def applied(self, spec: BurstSpec) -> BurstSpec:
        """``spec`` as this node runs it: the node's own environment with the burst's settings laid over it (its PATH,
        the GPUs Ray gave the rank), its clock, dirs and caches, and no owner to watch: Ray ends an actor whose
        owner is gone."""
        return dataclasses.replace(spec, environment={**os.environ, **spec.environment},
                                   clock_origin=self.clock_origin, temp_dir=self.temp_dir, cache_dir=self.cache_dir,
                                   inductor_cache_dir=self.inductor_cache_dir, owner_pid=0, owner_started=0.0)


def rank_main(rank: int, payload: bytes, put: Callable[[WorkerEvent], None], mark: Callable[[Phase], None], *,
              seat: Seat | None = None, commands: Any = None) -> None:
    """One rank from its payload to its last event, wherever its process runs: a process on the caller's machine
    (:func:`worker_main`), or a Ray actor on a cluster node given its ``seat`` (:mod:`.cluster`). ``put`` sends an
    event to the launcher, ``mark`` records the phase the rank entered.

    The workload arrives cloudpickled so that classes defined in a notebook's ``__main__`` work.
    Anything the workload raises -- ``sys.exit`` and ``KeyboardInterrupt`` included -- is sent as an
    event carrying this rank's own traceback, then re-raised so the process's owner sees it too.
    ``commands``, given for a held burst, is where the launcher's :class:`MeasureAgain` arrive once the first
    window is measured.
    """
    # Ctrl-C in a terminal or a Jupyter interrupt reaches the whole process group; the caller alone
    # decides to stop a burst, so a KeyboardInterrupt seen here can only come from user code.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_freed_memory()
    become_subreaper()
    spec: BurstSpec | None = None
    emit = _EndingStrays(_BatchedEmit(put))
    try:
        workload, spec = cloudpickle.loads(payload)
        spec = seat.applied(spec) if seat is not None else spec
        dump_stacks_on_signal(spec.temp_dir)  # a hang then says where it was (stacks.py)
        die_with_owner(spec.owner_pid, spec.owner_started)
        use_environment(spec.environment)
        use_rank_environment(seat.place if seat is not None else RankSeat.alone(rank, spec.plan.ranks))
        use_private_temp_dir(spec.temp_dir)
        use_inductor_cache(spec.inductor_cache_dir)

        def set_phase(phase: Phase) -> None:
            if phase == Phase.FINISHING:
                emit.flush()  # every step record is in the pipe before the launcher can see "finishing"
            mark(phase)

        held = HeldWindows(commands, payload) if commands is not None else None
        run_rank(rank, workload, spec, emit, set_phase=set_phase, held=held, seat=seat)
    except BaseException as exc:
        origin = spec.clock_origin if spec is not None else 0.0
        emit(RankFailed.from_exception(rank, time.perf_counter() - origin, exc))
        raise
    finally:
        emit.close()


class _EndingStrays:
    """The rank's emit, ending the workload's stray processes just before the rank's last word (its result or its
    failure), so the warnings about them reach the result."""

    def __init__(self, emit: _BatchedEmit) -> None:
        self._emit = emit

    def __call__(self, event: WorkerEvent) -> None:
        if isinstance(event, (RankDone, RankFailed)):
            # A held rank may compile again in a later window: torch's compile workers stay until it finishes.
            held = isinstance(event, RankDone) and event.held
            event = dataclasses.replace(event, warnings=[*event.warnings, *end_strays(keep_torch_helpers=held)])
        self._emit(event)

    def flush(self) -> None:
        self._emit.flush()

    def close(self) -> None:
        self._emit.close()


class _BatchedEmit:
    """Sends step records a few at a time, at most ``STEP_BATCH_S`` after they happened; anything else at once.

    Each message costs this rank a pickling and a write, and the caller's pump the reading of it: on a
    2-core machine both are time taken from the rank's intra-op threads. So fast steps are sent in
    batches: a record goes at once when the last message left ``STEP_BATCH_S`` ago (the first step
    always does), else with the next one due. A flusher thread bounds the delay when the rank then
    blocks (in a collective, in the loader): the records of the steps before a hang must still reach
    the caller. Every put happens under one lock, so a rank's messages keep their order.
    """

    def __init__(self, put: Callable[[WorkerEvent], None]) -> None:
        self._put = put
        self._buffer: list[StepRecord] = []
        self._lock = threading.Lock()
        self._pending = threading.Event()
        self._closed = threading.Event()
        self._flusher: threading.Thread | None = None
        self._sent_at = -STEP_BATCH_S

    def __call__(self, event: WorkerEvent) -> None:
        if not isinstance(event, StepRecord):
            with self._lock:
                self._send_buffer()
                self._put(event)
            return
        with self._lock:
            self._buffer.append(event)
            if time.monotonic() - self._sent_at >= STEP_BATCH_S:
                self._send_buffer()
                return
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_forever, name="accel-widgets-events", daemon=True)
            self._flusher.start()
        self._pending.set()

    def flush(self) -> None:
        with self._lock:
            self._send_buffer()

    def close(self) -> None:
        """Send what is buffered and end the flusher thread (at once: it never sleeps through a close)."""
        self.flush()
        self._closed.set()
        self._pending.set()
        if self._flusher is not None:
            self._flusher.join()

    def _flush_forever(self) -> None:
        """Wake rarely (each wake-up preempts an intra-op thread): while the rank keeps sending, a few times
        a second; send only what the rank has not."""
        while True:
            self._pending.wait()
            if self._closed.wait(HANG_FLUSH_S):
                return
            with self._lock:
                if time.monotonic() - self._sent_at >= HANG_FLUSH_S:
                    self._pending.clear()
                    self._send_buffer()

    def _send_buffer(self) -> None:
        if self._buffer:
            records, self._buffer = tuple(self._buffer), []
            self._put(records[0] if len(records) == 1 else StepBatch(records))
            self._sent_at = time.monotonic()


def run_rank(rank: int, workload: Workload, spec: BurstSpec, emit: Emit,
             should_stop: Callable[[], bool] = lambda: False,
             set_phase: Callable[[Phase], None] = lambda phase: None, held: HeldWindows | None = None,
             seat: Seat | None = None) -> None:
    """Build everything for one rank inside the config's global flags, train, and report; with ``held``, stay and
    measure a window more at each of the launcher's commands. ``seat``: a cluster rank's place; its GPUs are the
    first its process sees (Ray makes only the rank's own visible), and it meets its peers at the seat's store."""
    setup_start = time.perf_counter()
    set_phase(Phase.SETUP)
    with memory.allocator(spec.plan.config, spec.plan.device.kind):  # before choosing the device initialises CUDA
        device = _device_for(spec.plan.device.kind, rank if seat is None else 0)
        _train_rank(rank, workload, spec, device, emit, setup_start, should_stop, set_phase, held,
                    _rendezvous(spec, seat))


def _rendezvous(spec: BurstSpec, seat: Seat | None) -> Rendezvous | None:
    """Where the rank meets its peers: a cluster seat's store, else a file of the burst's temp dir (None: no group)."""
    if spec.plan.group is None:
        return None
    if seat is not None:
        return seat.rendezvous
    return Rendezvous.in_file(os.path.join(spec.temp_dir, "rendezvous"), spec.plan.group.world_size)


@dataclass
class _Built:
    """The rank's training state: held in one place, so that a held rank drops it whole before building the next."""

    loop: TrainingLoop | None
    raw: torch.nn.Module | None


def _train_rank(rank: int, workload: Workload, spec: BurstSpec, device: torch.device, emit: Emit,
                setup_start: float, should_stop: Callable[[], bool], set_phase: Callable[[Phase], None],
                held: HeldWindows | None, rendezvous: Rendezvous | None) -> None:
    plan, request = spec.plan, spec.request
    with (
        torch_threads(plan.threads_per_rank),
        global_flags(plan.config),
        joined(plan.group, rank, device, rendezvous=rendezvous, timeout_s=spec.collective_timeout_s),
        _collected_warnings() as caught,
        # The in-process fallback runs in the caller: seeding must not change the caller's RNG streams.
        torch.random.fork_rng(devices=[device.index] if device.type == "cuda" else []),
    ):
        built = _Built(*build_loop(workload, plan, device, rank, cache_dir=spec.cache_dir, emit=emit,
                                   clock_origin=spec.clock_origin, should_stop=should_stop, set_phase=set_phase))
        loop, raw = built.loop, built.raw
        setup_s = time.perf_counter() - setup_start
        with _watching_compiles(loop) as watch:  # the steps the numbers come from: compiling happens in them
            first_step_s, steady_s = loop.warm_up(request.options.warmup_steps or 1)
            steps, seconds = _window_bounds(request, steady_s)
            busy_before = thread_busy_s()
            window = loop.measure(steps, seconds, first_step_s, request.options.sync_debug)
            busy_after = thread_busy_s()
        set_phase(Phase.FINISHING)
        capture = _profile(loop, request.options, rank)
        summary = rank_summary(rank, device, _device_name(device), window, setup_s, loop.scaler_skipped_steps(),
                               loop.flops_by_math(raw), capture, loop.code_paths(raw), loop.random_data,
                               stream_reading(loop.batches.loader.dataset), loop.cache,
                               watch.report(loop.compiled) if watch is not None else None)
        if busy_before is not None and busy_after is not None:
            summary = dataclasses.replace(summary, busy_s=busy_after - busy_before)
        environment = _environment(device, spec, loop.model)
        if held is not None:
            emit(RankDone(summary, environment, sorted(set(caught())), held=True))
            del loop, raw  # the state lives in ``built`` alone, which the next window replaces
            _measure_held(held, built, summary, rank, spec, device, emit, should_stop, set_phase)
            return
    emit(RankDone(summary, environment, sorted(set(caught()))))


#: A held rank's state is built after a spacer of up to this many bytes, of a random size (64-byte steps).
HEAP_SHIFT_BYTES = 1 << 20


def _measure_held(held: HeldWindows, built: _Built, first: RankSummary, rank: int, spec: BurstSpec,
                  device: torch.device, emit: Emit, should_stop: Callable[[], bool],
                  set_phase: Callable[[Phase], None]) -> None:
    """Measure a window at each command, each on training state built afresh, until told to finish.

    Why afresh: where a process's tensors land in memory (their alignment to cache sets and pages) is fixed for as
    long as they live, and it moves the step's speed. The same loop in two processes held for minutes ran a steady
    15-25% apart on this 2-core host (benchmarks/results/held_windows.json), while rebuilding its state between
    windows brought that down to the noise between windows. So each window unpickles the workload again, builds
    model, optimizer, data and loader as a burst does (same seed, same weights), behind a heap spacer of random
    size so the new state does not land exactly where the old one was freed, and warms up before it measures.
    torch.compile's caches live in the process: a rebuilt model of the same code is not compiled again.
    """
    shift = random.Random()
    for command in held:
        set_phase(Phase.SETUP)
        started = time.perf_counter()
        _drop(built)
        spacer = torch.empty(shift.randrange(0, HEAP_SHIFT_BYTES, 64) + 64, dtype=torch.uint8)
        workload, _ = cloudpickle.loads(held.payload)
        built.loop, built.raw = build_loop(workload, spec.plan, device, rank, cache_dir=spec.cache_dir, emit=emit,
                                           clock_origin=spec.clock_origin, should_stop=should_stop,
                                           set_phase=set_phase)
        loop = built.loop
        setup_s = time.perf_counter() - started
        first_step_s, _ = loop.warm_up(command.warmup_steps)
        # Ranks deciding "time is up" on their own clocks would disagree by a step: under DDP, steps alone.
        window = loop.measure(command.steps, None if dist.is_initialized() else command.seconds, first_step_s)
        set_phase(Phase.FINISHING)
        summary = rank_summary(rank, device, first.device, window, setup_s, loop.scaler_skipped_steps(),
                               first.flops_by_math, None, first.code_paths, loop.random_data, first.stream,
                               first.cache)
        emit(RankDone(summary, window=command.window, held=True))
        del loop, spacer
    _drop(built)
    end_strays()  # torch's compile workers, kept while more windows might compile, go with the rank


def _drop(built: _Built) -> None:
    """End the loader's workers and free the training state before anything new is allocated."""
    if built.loop is not None:
        built.loop.close()
    built.loop = built.raw = None
    gc.collect()


@contextlib.contextmanager
def _watching_compiles(loop: TrainingLoop) -> Iterator[CompileWatch | None]:
    """What torch.compile does in the loop's steps, when it compiles anything (None: nothing to watch)."""
    if not loop.compiled:
        yield None
        return
    with CompileWatch() as watch:
        yield watch


def _window_bounds(request: BurstRequest, steady_step_s: float) -> tuple[int | None, float | None]:
    """The measured window's length: as asked, except that DDP ranks must all take the same steps.

    Ranks deciding "time is up" on their own clocks disagree by a step, and the extra step's
    all-reduce then waits forever for a partner. So rank 0 turns ``seconds`` into a step count from
    its last warm-up step and every rank takes that count.
    """
    if request.seconds is None or not dist.is_initialized():
        return request.steps, request.seconds
    decided = [max(1, math.ceil(request.seconds / max(steady_step_s, 1e-6)))]
    dist.broadcast_object_list(decided, src=0)
    return int(decided[0]), None


def _profile(loop: TrainingLoop, options: BurstOptions, rank: int) -> Any:
    """Rank 0 records the profiled steps; DDP peers take the same steps so its collectives have partners."""
    if not options.profile_steps:
        return None
    if rank != 0:
        loop.extra_steps(options.profile_steps)
        return None
    trace = os.path.join(options.profile_dir, f"trace-{os.getpid()}-{int(time.time())}.json")
    return loop.profile(options.profile_steps, trace)


def _device_for(kind: str, rank: int) -> torch.device:
    if kind == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


@contextlib.contextmanager
def _collected_warnings() -> Iterator[Callable[[], list[str]]]:
    """Record the warnings that concern the user's code or config (e.g. a deprecated call in their model) so
    they reach the result, once each: the callable it gives says those recorded so far.

    Python attributes a warning to a file: the caller its ``stacklevel`` points at. One attributed to torch or
    another installed library is about that library's own calls (torch.compile's internal deprecations) and
    says nothing the user can act on; it is dropped here, where its origin is still known exactly (the result
    keeps only text). accel_widgets' own warnings always pass.
    """
    libraries = _library_dirs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        yield lambda: [f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught
                       if not _from_library(w, libraries)]


_PACKAGE = __name__.split(".")[0]
_PACKAGE_DIR = os.path.join(os.path.realpath(os.path.dirname(os.path.dirname(__file__))), "")


def _library_dirs() -> tuple[str, ...]:
    """Where installed code lives: the standard library, every site-packages, and torch's own directory (a
    source build of torch may sit outside site-packages)."""
    paths = sysconfig.get_paths()
    dirs = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.update(site.getsitepackages())
    dirs.update((site.getusersitepackages(), os.path.dirname(torch.__file__)))
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


def _from_library(caught: warnings.WarningMessage, libraries: tuple[str, ...]) -> bool:
    """Whether the warning was raised from library code ("<frozen ...>" is the import system's) and is not
    one of accel_widgets' own, which may live in site-packages too."""
    if caught.category.__module__.split(".")[0] == _PACKAGE:
        return False
    if caught.filename.startswith("<frozen "):
        return True
    path = os.path.realpath(caught.filename)
    return path.startswith(libraries) and not path.startswith(_PACKAGE_DIR)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return probe_device().cpu_name


def _wrapper_chain(model: torch.nn.Module) -> list[str]:
    """How the model ran, outermost first: e.g. OptimizedModule > DistributedDataParallel > Net."""
    chain = [type(model).__name__]
    while hasattr(model, "_orig_mod") or hasattr(model, "module"):
        model = getattr(model, "_orig_mod", None) or model.module
        chain.append(type(model).__name__)
    return chain


def _environment(device: torch.device, spec: BurstSpec, model: torch.nn.Module) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device_kind": device.type,
        "device_name": _device_name(device),
        "cpu_count": os.cpu_count(),
        "threads_per_rank": spec.plan.threads_per_rank,
        "pid": os.getpid(),
        "model_wrappers": _wrapper_chain(model),
        "executable": sys.executable,
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        # What memory_fraction is a share of (cudaMemGetInfo's total; NVML's total is a little larger).
        env["cuda_memory_bytes"] = int(torch.cuda.mem_get_info(device)[1])
    return env
