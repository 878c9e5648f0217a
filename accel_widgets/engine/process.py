"""A rank's life as a process: what it inherits and sets up before training, and how it ends with its owner.

Every process a burst starts dies with the process that launched it (:func:`die_with_owner`), and so does
everything the workload starts below a rank (:func:`become_subreaper`, :func:`end_strays`). A rank takes the
caller's environment as it is at launch, a private temp dir and its compile cache, and keeps its heap the way a
long-running process does (:func:`keep_freed_memory`).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import platform
import select
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import psutil
import torch

_PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def become_subreaper() -> None:
    """Make this rank the parent of every orphan below it: a process the workload forks and abandons (a daemon's
    double fork) is then re-parented to the rank, not to init, so :func:`end_strays` and the owner's death can
    still find it and end it with the burst."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def end_strays(timeout_s: float = 2.0, *, keep_torch_helpers: bool = False) -> list[str]:
    """SIGKILL every process below this rank that is not one of its DataLoader workers, reap it, and say so: one
    warning per process the workload started, naming its pid and command.

    Only the workload starts such processes (a fork in ``forward``, a helper a library launches), and nothing a
    burst starts may outlive it. Loader workers (this process's multiprocessing children) are left to their own
    shutdown, which also ends when the rank does; what *they* started is ended here too. torch's own helpers
    (inductor's compile workers, run from torch's directory) are ended without a warning: they are no mistake, and
    with ``keep_torch_helpers`` (a held rank that may compile again) they are left running.
    """
    loader_workers = {child.pid for child in multiprocessing.active_children()}
    helpers = _torch_helpers()
    kept = loader_workers | helpers if keep_torch_helpers else loader_workers
    ended: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        strays = [p for p in _descendants() if p.pid not in kept and p.pid not in ended]
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
    return running(children)


def running(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` still running: a zombie has ended (it only waits to be reaped), and a process that is
    gone or no longer readable is not one of ours any more."""
    return [process for process in processes if _running(process)]


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _zombie_children(loader_workers: set[int]) -> list[int]:
    """This rank's children that have exited but were never reaped (the middle process of a daemon's double fork),
    loader workers aside: multiprocessing reaps those."""
    with contextlib.suppress(psutil.Error):
        return [child.pid for child in psutil.Process().children()
                if child.pid not in loader_workers and not _running(child)]
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


def die_with_owner(owner_pid: int, owner_started: float) -> None:
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


def use_environment(environment: dict[str, str]) -> None:
    """Take the caller's environment as it is now (e.g. ``CUDA_VISIBLE_DEVICES`` set after import).

    Nothing has initialised CUDA or read these variables in this rank yet, so they all take effect.
    """
    os.environ.clear()
    os.environ.update(environment)


@dataclass(frozen=True)
class RankSeat:
    """Where a rank sits in its group, as torchrun numbers it: its rank among all, its rank and count on its own
    machine, its machine's number, and where the group meets (``master``: the rendezvous store's address and port).

    On the caller's machine (:meth:`alone`) local = global and there is no ``master``: the ranks meet in a private
    file. A cluster's ranks (:mod:`.cluster`) sit on several machines and meet at a store on rank 0's."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int = 0
    master: tuple[str, int] | None = None

    @classmethod
    def alone(cls, rank: int, world_size: int) -> RankSeat:
        """A rank of a burst whose ranks all run on the caller's machine."""
        return cls(rank, world_size, rank, world_size)


def use_rank_environment(seat: RankSeat) -> None:
    """Tell code that reads its place from the environment, as torchrun sets it, which rank this is: a stream that
    splits itself (MosaicML's StreamingDataset reads RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE), a library's
    logging. MASTER_ADDR/MASTER_PORT only where the group meets at a TCP store (a cluster): a burst on one machine
    rendezvouses in a private file (:mod:`.group`), and code that would open a TCP store from them must fail, not
    listen."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    if seat.master is not None:
        os.environ.update({"MASTER_ADDR": seat.master[0], "MASTER_PORT": str(seat.master[1])})
    os.environ.update({"RANK": str(seat.rank), "WORLD_SIZE": str(seat.world_size), "LOCAL_RANK": str(seat.local_rank),
                       "LOCAL_WORLD_SIZE": str(seat.local_world_size), "GROUP_RANK": str(seat.node_rank),
                       "ROLE_RANK": str(seat.rank), "ROLE_WORLD_SIZE": str(seat.world_size)})


def thread_busy_s() -> float | None:
    """Seconds the calling thread has run on a core or waited in the run queue for one, since it started (Linux's
    schedstat); None where the kernel does not say.

    What is left of a window's wall time is the time the thread slept: blocked in a collective waiting for its peers,
    or on its data. So a rank's busy time over a window is its own pace, which its wall time under DDP is not (every
    rank's step ends at the same all-reduce). Time spent waiting for a core counts as busy: a rank starved by another
    program on its core is the slow one."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            running_ns, waiting_ns, _ = fh.read().split()
    except (OSError, ValueError):
        return None
    return (int(running_ns) + int(waiting_ns)) / 1e9


def use_private_temp_dir(path: str) -> None:
    """Send every temp file of this rank (DataLoader's pymp-*, inductor scratch) to the burst's own dir."""
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path


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


def use_inductor_cache(path: str) -> None:
    """Compiled kernels go to the launcher's choice of cache, kept across bursts (a re-run compiles warm).

    Set, not ``setdefault``: the forkserver's preload of torch already wrote torch's shared default
    into the environment this rank inherited.
    """
    if path:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with ``count`` intra-op threads: ranks sharing cores must not oversubscribe them."""
    saved = torch.get_num_threads()
    torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        torch.set_num_threads(saved)
