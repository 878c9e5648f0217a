"""What one rank of a burst does, from process start to its last event.

:func:`worker_main` is the entry point the launcher starts in every rank process: a single-process
burst is simply a burst of one rank, so DDP adds a process group and nothing else. The same
:func:`run_rank` also serves the explicit in-process fallback.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import math
import multiprocessing
import os
import platform
import select
import signal
import site
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import psutil
import torch
import torch.distributed as dist

from ..config import Config
from ..device import probe_device
from ..knobs import global_flags
from ..results import StepRecord
from ..workload import Workload
from .events import Emit, EventChannel, Phase, RankDone, RankFailed, StepBatch, WorkerEvent
from .streaming import stream_reading
from .training import TrainingLoop, build_loop, rank_summary

STEP_BATCH_S = 0.02  # step records leave at most this late: live plots stay live, fast steps stay cheap
HANG_FLUSH_S = 0.25  # ... and at most this late when the rank stops sending (blocked in a collective, a loader)
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class BurstSpec:
    """Everything a rank needs besides the workload; built by the launcher, plain and picklable."""

    config: Config
    environment: dict[str, str]  # the caller's, at launch: the forkserver's copy is as old as the server
    steps: int | None
    seconds: float | None
    warmup_steps: int
    clock_origin: float
    cache_dir: str
    threads_per_rank: int
    device_kind: str
    temp_dir: str
    owner_pid: int = 0
    owner_started: float = 0.0  # the owner's create time: a recycled pid is not the owner
    inductor_cache_dir: str = ""
    collective_timeout_s: float = 300.0
    profile_steps: int = 0
    profile_dir: str = ""
    sync_debug: bool = False


def worker_main(rank: int, payload: bytes, events: EventChannel, phases: Any) -> None:
    """Rank process entry point (started by ``torch.multiprocessing.start_processes``).

    The workload arrives cloudpickled so that classes defined in a notebook's ``__main__`` work.
    Anything the workload raises -- ``sys.exit`` and ``KeyboardInterrupt`` included -- is sent as an
    event carrying this rank's own traceback, then re-raised so torch's process context sees it too.
    """
    # Ctrl-C in a terminal or a Jupyter interrupt reaches the whole process group; the caller alone
    # decides to stop a burst, so a KeyboardInterrupt seen here can only come from user code.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_freed_memory()
    become_subreaper()
    spec: BurstSpec | None = None
    emit = _EndingStrays(_BatchedEmit(events.put))
    try:
        workload, spec = cloudpickle.loads(payload)
        _die_with_owner(spec.owner_pid, spec.owner_started)
        _use_environment(spec.environment)
        _use_rank_environment(rank, spec.config.ranks)
        _use_private_temp_dir(spec.temp_dir)
        _use_inductor_cache(spec.inductor_cache_dir)

        def set_phase(phase: Phase) -> None:
            if phase == Phase.FINISHING:
                emit.flush()  # every step record is in the pipe before the launcher can see "finishing"
            phases[rank] = int(phase)

        run_rank(rank, workload, spec, emit, set_phase=set_phase)
    except BaseException as exc:
        origin = spec.clock_origin if spec is not None else 0.0
        emit(RankFailed.from_exception(rank, time.perf_counter() - origin, exc))
        raise
    finally:
        emit.close()
        events.close()


_PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def become_subreaper() -> None:
    """Make this rank the parent of every orphan below it: a process the workload forks and abandons (a daemon's
    double fork) is then re-parented to the rank, not to init, so :func:`end_strays` and the owner's death can
    still find it and end it with the burst."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def end_strays(timeout_s: float = 2.0) -> list[str]:
    """SIGKILL every process below this rank that is not one of its DataLoader workers, reap it, and say so: one
    warning per process the workload started, naming its pid and command.

    Only the workload starts such processes (a fork in ``forward``, a helper a library launches), and nothing a
    burst starts may outlive it. Loader workers (this process's multiprocessing children) are left to their own
    shutdown, which also ends when the rank does; what *they* started is ended here too. torch's own helpers
    (inductor's compile workers, run from torch's directory) are ended without a warning: they are no mistake.
    """
    loader_workers = {child.pid for child in multiprocessing.active_children()}
    helpers = _torch_helpers()
    ended: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        strays = [p for p in _descendants() if p.pid not in loader_workers and p.pid not in ended]
        for stray in strays:
            ended[stray.pid] = _describe(stray)
            with contextlib.suppress(psutil.Error):
                stray.kill()
        if not strays and not _unreaped([*ended, *_zombie_children(loader_workers)]):
            break
        time.sleep(0.01)
    return [f"a process the workload started was still running when the rank finished and was killed (pid {pid}: "
            f"{command}): everything a burst starts ends with it" for pid, command in ended.items()
            if pid not in helpers]


_TORCH_DIR = os.path.join(os.path.dirname(torch.__file__), "")


def _torch_helpers() -> set[int]:
    """The processes torch started below this rank: a child that runs a file from torch's directory, and its own."""
    helpers: set[int] = set()
    for child in _descendants():
        with contextlib.suppress(psutil.Error):
            if child.ppid() == os.getpid() and any(arg.startswith(_TORCH_DIR) for arg in child.cmdline()):
                helpers.add(child.pid)
                helpers.update(grandchild.pid for grandchild in child.children(recursive=True))
    return helpers


def _descendants() -> list[psutil.Process]:
    """This process's live descendants (zombies have ended already: they only wait to be reaped)."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    return [child for child in children if _alive(child)]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _zombie_children(loader_workers: set[int]) -> list[int]:
    """This rank's children that have exited but were never reaped (the middle process of a daemon's double fork),
    loader workers aside: multiprocessing reaps those."""
    with contextlib.suppress(psutil.Error):
        return [child.pid for child in psutil.Process().children()
                if child.pid not in loader_workers and not _alive(child)]
    return []


def _unreaped(pids: list[int]) -> list[int]:
    """Reap those of ``pids`` that are this rank's children by now (a killed grandchild is re-parented here once its
    parent is gone); returns those still waiting: alive or unreaped, and ours."""
    waiting = []
    for pid in pids:
        with contextlib.suppress(ChildProcessError):  # reaped already, or not our child
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                waiting.append(pid)
    return waiting


def _describe(process: psutil.Process) -> str:
    """``python3 -c import time; time.sleep(...)``: a process's command line, shortened for a warning."""
    try:
        command = " ".join(process.cmdline()) or process.name()
    except psutil.Error:
        command = "?"
    return command if len(command) <= 80 else command[:77] + "..."


class _EndingStrays:
    """The rank's emit, ending the workload's stray processes just before the rank's last word (its result or its
    failure), so the warnings about them reach the result."""

    def __init__(self, emit: _BatchedEmit) -> None:
        self._emit = emit

    def __call__(self, event: WorkerEvent) -> None:
        if isinstance(event, (RankDone, RankFailed)):
            event = dataclasses.replace(event, warnings=[*event.warnings, *end_strays()])
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


# glibc's mallopt parameters (malloc.h) and the values its own dynamic thresholds converge to.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX: the highest glibc's dynamic threshold goes
_TRIM_THRESHOLD_BYTES = 2 * _MMAP_THRESHOLD_BYTES  # glibc moves the trim threshold to twice the mmap one


def keep_freed_memory() -> bool:
    """Let this rank's heap keep the memory each step frees and the next step allocates again.

    A training process that has run for a while reuses its freed activations: glibc's dynamic thresholds
    have risen, and its heap holds its working set. A rank is a fresh process, where glibc still returns
    every large freed block to the system and the next step faults it back in page by page: measured on
    the LM demo, 1,800-4,800 page faults per step against ~560 with this setting, and 5-10% fewer
    samples/s than the same loop in the caller's long-running process (this setting: on par). So the
    thresholds start where glibc's own heuristics end up: blocks under 32 MiB come from the heap, and it
    is trimmed once 64 MiB at its top are free (a trim threshold of 1 GiB measured the same). The rank's
    peak RSS moves by under 1% (330 -> 334 MiB on the LM demo): it is the same working set, kept
    instead of returned. DataLoader workers forked later inherit the setting, and an exported script sets
    it too, so a job trains as its burst measured. Never called in the caller's process (the in-process
    fallback): its heap is its own. False where the C library is not glibc.
    """
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES))


def _die_with_owner(owner_pid: int, owner_started: float) -> None:
    """End this rank and its DataLoader workers as soon as the process that launched the burst is gone.

    Ranks are children of the forkserver, not of the caller, so nothing else would stop them when a
    kernel is killed (SIGKILL, the OOM killer, a restart after its grace period): they would keep
    training and holding the GPU. A thread blocks on a pidfd of the owner (no polling) and kills the
    rank's family the moment it exits.
    """
    if not owner_pid:
        return
    try:
        owner = psutil.Process(owner_pid)
        alive = abs(owner.create_time() - owner_started) < 0.01 and owner.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        alive = False
    if not alive:
        _kill_own_family()
    threading.Thread(target=_watch_owner, args=(owner_pid,), name="accel-widgets-owner-watch", daemon=True).start()


def _watch_owner(owner_pid: int) -> None:
    try:
        fd = os.pidfd_open(owner_pid)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3, or not Linux): poll instead
        while psutil.pid_exists(owner_pid):
            time.sleep(0.25)
    else:
        select.select([fd], [], [])  # readable once the owner has exited
    _kill_own_family()


def _kill_own_family() -> None:
    """SIGKILL this rank's descendants (DataLoader workers), then this rank itself."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    os.kill(os.getpid(), signal.SIGKILL)


def _use_environment(environment: dict[str, str]) -> None:
    """Take the caller's environment as it is now (e.g. ``CUDA_VISIBLE_DEVICES`` set after import).

    Nothing has initialised CUDA or read these variables in this rank yet, so they all take effect.
    """
    os.environ.clear()
    os.environ.update(environment)


def _use_rank_environment(rank: int, world_size: int) -> None:
    """Tell code that reads its place from the environment, as torchrun sets it, which rank this is: a stream that
    splits itself (MosaicML's StreamingDataset reads RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE), a library's
    logging. One machine, one node: local = global. No MASTER_ADDR/MASTER_PORT: the ranks rendezvous in a private
    file (see :func:`_process_group`), and code that would open a TCP store from them must fail, not listen."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
                       "ROLE_WORLD_SIZE": str(world_size)})


def _use_private_temp_dir(path: str) -> None:
    """Send every temp file of this rank (DataLoader's pymp-*, inductor scratch) to the burst's own dir."""
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path


def _use_inductor_cache(path: str) -> None:
    """Compiled kernels go to the launcher's choice of cache, kept across bursts (a re-run compiles warm).

    Set, not ``setdefault``: the forkserver's preload of torch already wrote torch's shared default
    into the environment this rank inherited.
    """
    if path:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path


def run_rank(rank: int, workload: Workload, spec: BurstSpec, emit: Emit,
             should_stop: Callable[[], bool] = lambda: False,
             set_phase: Callable[[Phase], None] = lambda phase: None) -> None:
    """Build everything for one rank inside the config's global flags, train, and report."""
    setup_start = time.perf_counter()
    config = spec.config
    device = _device_for(spec.device_kind, rank)
    set_phase(Phase.SETUP)
    with (
        torch_threads(spec.threads_per_rank),
        global_flags(config),
        _process_group(spec, rank, device),
        _collected_warnings() as caught,
        # The in-process fallback runs in the caller: seeding must not change the caller's RNG streams.
        torch.random.fork_rng(devices=[device.index] if device.type == "cuda" else []),
    ):
        loop, raw = build_loop(workload, config, device, rank, config.ranks, cache_dir=spec.cache_dir, emit=emit,
                               clock_origin=spec.clock_origin, should_stop=should_stop, set_phase=set_phase)
        setup_s = time.perf_counter() - setup_start
        first_step_s, steady_s = loop.warm_up(spec.warmup_steps)
        steps, seconds = _window_bounds(spec, steady_s)
        window = loop.measure(steps, seconds, first_step_s, spec.sync_debug)
        set_phase(Phase.FINISHING)
        capture = _profile(loop, spec, rank)
        summary = rank_summary(rank, device, _device_name(device), window, setup_s, loop.scaler_skipped_steps(),
                               loop.flops_by_math(raw), capture, loop.code_paths(raw), loop.random_data,
                               stream_reading(loop.batches.loader.dataset))
    emit(RankDone(summary, _environment(device, spec, loop.model), sorted(set(caught))))


def _window_bounds(spec: BurstSpec, steady_step_s: float) -> tuple[int | None, float | None]:
    """The measured window's length: as asked, except that DDP ranks must all take the same steps.

    Ranks deciding "time is up" on their own clocks disagree by a step, and the extra step's
    all-reduce then waits forever for a partner. So rank 0 turns ``seconds`` into a step count from
    its last warm-up step and every rank takes that count.
    """
    if spec.seconds is None or not dist.is_initialized():
        return spec.steps, spec.seconds
    decided = [max(1, math.ceil(spec.seconds / max(steady_step_s, 1e-6)))]
    dist.broadcast_object_list(decided, src=0)
    return int(decided[0]), None


def _profile(loop: TrainingLoop, spec: BurstSpec, rank: int) -> Any:
    """Rank 0 records the profiled steps; DDP peers take the same steps so its collectives have partners."""
    if not spec.profile_steps:
        return None
    if rank != 0:
        loop.extra_steps(spec.profile_steps)
        return None
    trace = os.path.join(spec.profile_dir, f"trace-{os.getpid()}-{int(time.time())}.json")
    return loop.profile(spec.profile_steps, trace)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with ``count`` intra-op threads: ranks sharing cores must not oversubscribe them."""
    saved = torch.get_num_threads()
    torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _device_for(kind: str, rank: int) -> torch.device:
    if kind == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _loopback_interface() -> str | None:
    """The name of the interface that carries 127.0.0.1 (``lo`` on Linux)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == LOOPBACK for a in addresses):
            return name
    return None


@contextlib.contextmanager
def _process_group(spec: BurstSpec, rank: int, device: torch.device) -> Iterator[None]:
    """Join the burst's process group for DDP (NCCL on GPUs, gloo on CPU); nothing for one rank.

    Nothing of it is reachable from the network: the rendezvous is a file in the burst's private temp
    dir (a TCP store would listen on every interface, unauthenticated), and gloo's and NCCL's own
    sockets are pinned to the loopback interface. The group's timeout sits well below the burst's, so
    a collective without a partner fails with a message instead of hanging until the burst timeout.
    """
    if spec.config.parallel != "ddp":
        yield
        return
    interface = _loopback_interface()
    if interface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        os.environ["NCCL_SOCKET_IFNAME"] = interface
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.FileStore(os.path.join(spec.temp_dir, "rendezvous"), spec.config.ranks)
    dist.init_process_group(backend, store=store, rank=rank, world_size=spec.config.ranks,
                            timeout=datetime.timedelta(seconds=spec.collective_timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        yield
        dist.barrier()  # leave together: a rank destroying its group while a peer still uses it can abort
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _collected_warnings() -> Iterator[list[str]]:
    """Record the warnings that concern the user's code or config (e.g. a deprecated call in their model) so
    they reach the result, once each.

    Python attributes a warning to a file: the caller its ``stacklevel`` points at. One attributed to torch or
    another installed library is about that library's own calls (torch.compile's internal deprecations) and
    says nothing the user can act on, yet it was listed under every compiled run; it is dropped here, where
    its origin is still known exactly (the result keeps only text). accel_widgets' own warnings always pass.
    """
    messages: list[str] = []
    libraries = _library_dirs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            yield messages
        finally:
            messages.extend(f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught
                            if not _from_library(w, libraries))


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
        "threads_per_rank": spec.threads_per_rank,
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
