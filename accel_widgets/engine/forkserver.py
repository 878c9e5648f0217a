"""The preloaded forkserver every burst's ranks are forked from, started as early as it can be.

Why a forkserver with torch preloaded (measured on a 2-core machine, see the project notes): a cold
``spawn`` interpreter reaches its first step ~2.6 s after launch because every burst re-imports
torch; plain ``fork`` from a kernel that has used OpenMP deadlocks, and after CUDA init it is unsafe.
A forkserver imports torch once, never runs OpenMP or CUDA itself, and forks each rank in ~10 ms
with a fresh CUDA state. ``torch._dynamo`` is preloaded too: every optimizer imports it on
construction (~1 s), so every burst needs it.

Importing the server's modules takes ~2.7 s here, longer than the first burst may wait. So importing
:mod:`accel_widgets` starts the server (stdlib only, before this process imports torch itself), and
the server imports in the background while the user builds a model and a dataset. The server exits
when its owner does. ``ACCEL_WIDGETS_PRESTART=0`` turns the early start off; bursts then start it.

Scripts and notebooks usually import torch first, though, and then a spawned server still needs its 2.7 s
while the first burst waits (2.6 s to the first step of 2 DDP ranks, against 1.5 s for Accelerate's
``notebook_launcher``, which forks the caller). Where this process already holds torch, the server is
therefore a fork of it, ready at once with every library the caller imported (transformers...), when that is
safe: no CUDA driver in the process, an OpenMP pool that still works in a child (a canary child runs a parallel op
first; after the caller's first parallel region libgomp's children hang), and a caller small enough
(``FORK_MAX_RSS_BYTES``) that the server's copy of its pages holds no real memory back. Otherwise it is spawned as
above. ``ACCEL_WIDGETS_SERVER=spawn`` always spawns.

"No CUDA driver" is read from the process's memory map, not from ``torch.cuda.is_initialized()``:
``torch.cuda.is_available()`` (which transformers and many libraries call when imported) runs ``cuInit`` through
the CUDA runtime without setting torch's flag, and every rank of a server forked after it fails with "CUDA error:
initialization error". ``cuInit`` needs the driver library, so a process with ``libcuda`` mapped is never forked.
A library that loads the driver without initialising it only costs the fork's head start. This package does not
set ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (``is_available()`` asking NVML, which keeps the driver out) for the
caller: it would change what ``is_available()`` means in the user's own process; a user may set it before their
first ``is_available()`` to keep the fast start (the README says so).

The forked server keeps the caller's libraries but none of the user's own modules (:mod:`.user_code`): those
travel with each burst by value, as the caller holds them then (:mod:`.payload`), and a rank that imports one by
name reads its file as it is at the burst, never the copy of the fork, stale after an edit or half-executed when
the fork happened inside the module's own ``import accel_widgets``.

The server does not run the caller's main script again in a rank, as multiprocessing does by default
(it re-imports ``__main__`` in every child so that functions pickled by reference can be found): a
rank needs nothing from it, since the workload travels by value, and a script that calls run_burst at
top level, with no ``if __name__ == "__main__":`` guard, would otherwise train again in every rank.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

# Read before this module imports it: the forkserver process imported it to run, and then imports this
# package as a preload, which must not start a server of its own.
_INSIDE_A_FORKSERVER = "multiprocessing.forkserver" in sys.modules

from multiprocessing import connection, forkserver, resource_tracker, spawn, util  # noqa: E402

from .user_code import user_modules  # noqa: E402

START_METHOD = "forkserver"
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch.optim", "cloudpickle", "numpy", "psutil",
                      "accel_widgets.engine.worker"]
MP_DIR_PREFIX = "accel-widgets-mp-"  # + the owner's pid: the next burst removes it if the owner was killed
#: The process name of every rank (+ its rank): what tells the server a child is a rank.
RANK_NAME_PREFIX = "accel-widgets-rank-"
_MAIN_SCRIPT_KEYS = ("init_main_from_path", "init_main_from_name")
_MAX_SOCKET_DIR = 80  # + "/listener-xxxxxxxx" stays within AF_UNIX's path limit
#: A caller larger than this is not forked into a server: the pages it frees later would stay held by the copy.
FORK_MAX_RSS_BYTES = 1 << 30
#: How long the canary child gets for one parallel op; a working OpenMP pool takes milliseconds.
CANARY_TIMEOUT_S = 2.0
SERVER_ENV = "ACCEL_WIDGETS_SERVER"  # "spawn": never fork the caller into the server
_DRIVER_LIBRARY = "libcuda.so"  # what cuInit runs in: mapped once anything initialised CUDA


def forkserver_context() -> Any:
    ctx = multiprocessing.get_context(START_METHOD)
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


def warm_up() -> None:
    """Start the preloaded forkserver now, if it is not running; returns at once (it imports on its own)."""
    _start_server(can_fork_server)


def _start_server(forkable: Callable[[], bool]) -> None:
    """A fork of this process as the server when none runs and ``forkable()`` says it is safe, else a spawned one."""
    forkserver_context()
    _own_multiprocessing_temp_dir()
    if not _server_running() and forkable():
        _fork_server()
    forkserver.ensure_running()


def server_pid() -> int | None:
    """The running server's process id (None before one was started)."""
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def _server_running() -> bool:
    pid = server_pid()
    if pid is None:
        return False
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    return False


def can_fork_server() -> bool:
    """Whether this process can be the server's image: torch is here already, no CUDA context and no CUDA driver
    loaded (``is_available()`` initialises the driver without torch's flag), a small enough heap, and an OpenMP pool
    that works in a forked child (asked of a canary child)."""
    torch = sys.modules.get("torch")
    if os.environ.get(SERVER_ENV) == "spawn" or sys.platform != "linux" or torch is None:
        return False
    if torch.cuda.is_initialized() or cuda_driver_loaded(_own_memory_map()) or _rss_bytes() > FORK_MAX_RSS_BYTES:
        return False
    return _parallel_op_runs_in_a_child(torch)


def cuda_driver_loaded(memory_map: list[str]) -> bool:
    """Whether a process's memory map (the lines of ``/proc/<pid>/maps``) holds the CUDA driver library
    (``libcuda.so.1``, ``libcuda.so.570.124.06``...; the runtime, ``libcudart``, is not the driver)."""
    for line in memory_map:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(_DRIVER_LIBRARY):
            return True
    return False


def _own_memory_map() -> list[str]:
    with open("/proc/self/maps") as fh:
        return fh.readlines()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _parallel_op_runs_in_a_child(torch: Any) -> bool:
    """Fork a child that runs one op on two intra-op threads: it ends in milliseconds, or hangs when this
    process has used its OpenMP pool (libgomp's threads are not re-created in a child), and is then killed."""
    pid = _fork_quietly()
    if pid == 0:
        try:
            torch.set_num_threads(2)
            torch.ones(1 << 20).exp_()  # large enough for at::parallel_for to use both threads
        finally:
            os._exit(0)
    deadline = time.monotonic() + CANARY_TIMEOUT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def _fork_quietly() -> int:
    """``os.fork()`` without Python 3.12's warning about forking a multi-threaded process: the children forked
    here never touch what the caller's other threads hold (their sockets, their locks); they run the
    forkserver loop, or one op, and leave with ``os._exit``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _fork_server() -> None:
    """Start multiprocessing's forkserver as a fork of this process, registered exactly as ``ensure_running``
    registers a spawned one (its socket, its alive pipe, its pid), so every later burst finds it running."""
    server = forkserver._forkserver
    with server._lock:
        resource_tracker.ensure_running()
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # the server exits when every holder of the write end is gone
            users = user_modules()  # read here, where the first burst finds the files' lookups done already
            try:
                pid = _fork_quietly()
                if pid == 0:
                    _serve(listener.fileno(), alive_r, users)
            finally:
                os.close(alive_r)
        server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid


def _serve(listener_fd: int, alive_r: int, users: list[str]) -> None:
    """The forked server: only its socket, its alive pipe and stdio stay open (the caller's write end of the
    pipe must not, or the server would outlive it), ranks are prepared as :func:`prepare_rank` says, the user's
    modules ``users`` are forgotten (the module's docstring says why: a rank that needs one by name imports it from
    its file as it is at the burst), and it leaves with ``os._exit``: the caller's atexit handlers and finalizers
    (its temp dirs) are the caller's."""
    try:
        keep = sorted({listener_fd, alive_r})
        os.closerange(3, keep[0])
        os.closerange(keep[0] + 1, keep[-1])
        os.closerange(keep[-1] + 1, os.sysconf("SC_OPEN_MAX"))
        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(number, signal.SIG_DFL)
        spawn.prepare = prepare_rank
        _forget_half_imported_modules()
        for name in users:
            sys.modules.pop(name, None)
        forkserver.main(listener_fd, alive_r, FORKSERVER_PRELOAD)
    finally:
        os._exit(0)


def _forget_half_imported_modules() -> None:
    """In the forked server: the modules whose import was running when the caller forked never finish it here.

    This package's own ``__init__`` had run its last line, the call that forked: it is complete, and marked so
    (importlib's ``_initializing`` flag), or every import of it from a thread other than the main one would wait
    for an import that never ends. Any other module still importing (one that imports ``accel_widgets`` before
    its own definitions) is half-executed: it is dropped, and a rank that needs it imports it from its file.
    """
    package = sys.modules[__name__.split(".")[0]]
    package.__spec__._initializing = False
    for name, module in list(sys.modules.items()):
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            del sys.modules[name]


def _own_multiprocessing_temp_dir() -> None:
    """Give multiprocessing's per-process temp dir (the server's socket lives there) a name we can clean.

    multiprocessing makes an anonymous ``pymp-*`` dir and deletes it at exit; a kernel that is killed
    leaves it behind forever. Named after this process, the next burst of any owner removes it once
    this process is gone. Done only where multiprocessing has not made its own dir yet (it reads
    ``current_process()._config["tempdir"]``, the one place it keeps that dir).
    """
    config = multiprocessing.current_process()._config
    if config.get("tempdir") is not None:
        return
    path = tempfile.mkdtemp(prefix=f"{MP_DIR_PREFIX}{os.getpid()}-")
    if len(path) > _MAX_SOCKET_DIR:  # the server's socket path must fit AF_UNIX's ~108 bytes
        os.rmdir(path)
        return
    config["tempdir"] = path
    util.Finalize(None, shutil.rmtree, args=(path, True), exitpriority=-100)  # as multiprocessing does


def prestart_on_import(*, package_imported: bool) -> None:
    """Start the server when the package is imported by a user's process (not by the server itself).

    The package's ``__init__`` calls this first thing, where a server that must be spawned starts at once (it
    imports torch while this process does too), and again once it has imported everything, where this process is
    forked into the server. A fork taken first thing would hold a half-imported ``accel_widgets``: in its ranks
    ``from accel_widgets import Workload`` (in a user module) fails, and a thread that imports any module of the
    package (the pickler of a rank's step records does) waits forever for that import to finish.
    """
    if os.environ.get("ACCEL_WIDGETS_PRESTART", "1") == "0" or _INSIDE_A_FORKSERVER:
        return
    if multiprocessing.parent_process() is not None or _in_a_ray_worker():
        return  # a worker of someone's multiprocessing (a spawned loader worker...) or of Ray: it launches no bursts
    try:
        if package_imported:
            warm_up()
        elif not can_fork_server():
            _start_server(lambda: False)
    except Exception:  # importing must never fail for this: the first burst starts it and reports why not
        return


def _in_a_ray_worker() -> bool:
    """Whether Ray started this process to run its tasks and actors (a cluster burst's rank is one): it imports this
    package to run a rank, and a server forked from it would copy Ray's threads and import torch again beside the
    rank. Were such a process to launch a burst itself, its first burst would start the server. Ray is never imported
    here: a process that has not imported it is no Ray worker."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().worker.mode == ray.WORKER_MODE


def prepare_rank(preparation_data: dict[str, Any]) -> None:
    """``multiprocessing.spawn.prepare`` for the server's children: a rank is prepared without the
    caller's main script (see the module's docstring); any other child exactly as multiprocessing would."""
    if str(preparation_data.get("name", "")).startswith(RANK_NAME_PREFIX):
        preparation_data = {k: v for k, v in preparation_data.items() if k not in _MAIN_SCRIPT_KEYS}
    _stock_prepare(preparation_data)


_stock_prepare = spawn.prepare
if _INSIDE_A_FORKSERVER:  # the server's own copy: it prepares each forked child with spawn.prepare
    spawn.prepare = prepare_rank
