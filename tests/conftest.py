"""Shared fixtures. Every test is checked for leaks: processes, threads, sockets and temp files.

The preloaded forkserver and multiprocessing's resource tracker are session-long infrastructure
(started once, like a kernel's), so they are allowed, and so is what a shared fixture names as its own
(:data:`SHARED_INFRASTRUCTURE`: the Ray cluster's processes, :mod:`tests.ray_cluster`); anything they or the test
started must be gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# Under pytest-xdist two workers share the cores, and OpenMP threads that spin while they wait (libgomp's default,
# for latency) burn the cycles the other worker's bursts need: with sleeping waiters the notebook tests on two
# workers took 50 and 44 s instead of 80 and 76. Read by libgomp as torch loads it, here and in every process started
# from here; `-n 0` keeps stock PyTorch's setting.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import psutil
import pytest
import torch

from accel_widgets.engine.ranks import leftover_temp_files
from accel_widgets.results.history import HISTORY_ENV

#: The Ray cluster fixture (``ray_cluster``) for the modules that run on one.
pytest_plugins = ["tests.ray_cluster"]

LEAK_GRACE_S = 3.0

# A private temp dir for the whole session, set before anything starts a process: torch's error files and
# burst dirs then land here, and files other programs on the machine leave in /tmp cannot fail our leak checks.
_SESSION_TMP = tempfile.mkdtemp(prefix="accel-widgets-tests-")
os.environ["TMPDIR"] = _SESSION_TMP
tempfile.tempdir = _SESSION_TMP


# Removed at exit after multiprocessing's own finalizers (priority -100) have cleaned their pymp-* dirs in it.
multiprocessing.util.Finalize(None, shutil.rmtree, args=(_SESSION_TMP, True), exitpriority=-200)


def _machine_locks() -> tuple[int, int] | None:
    """Under pytest-xdist, two files every worker of this run locks (None in a plain run): the machine, held around each
    test, and the gate a test passes to start.

    Most tests only need to finish. A few read what a user would see of a burst (a browser drawing it live, the runs
    table's marks), which another worker's bursts on these two cores would change: while such a test runs its bursts
    (:func:`alone`) it holds the machine exclusively, and every other test holds it shared, so those bursts run with the
    machine to themselves while everything else runs in parallel. A test waiting for the machine holds the gate, so
    no other test starts meanwhile: it waits for the tests already running, not for a queue of others that keep a
    shared hold between them (with three workers that wait was measured at 196 s)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return None
    fds = []
    for name in ("machine", "gate"):
        path = Path(tempfile.gettempdir()).parent / f"accel-widgets-tests-{run}.{name}.lock"
        fds.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        multiprocessing.util.Finalize(None, path.unlink, kwargs={"missing_ok": True}, exitpriority=-300)
    return fds[0], fds[1]


_MACHINE_LOCKS = _machine_locks()


@contextlib.contextmanager
def _flocks(enter: list[tuple[str, int]], leave: list[tuple[str, int]]) -> Iterator[None]:
    """The block between two sequences of ``flock`` operations on the ``machine`` and ``gate`` locks; nothing outside
    pytest-xdist, where every test has the machine to itself."""
    if _MACHINE_LOCKS is None:
        yield
        return
    locks = dict(zip(("machine", "gate"), _MACHINE_LOCKS, strict=True))
    for name, operation in enter:
        fcntl.flock(locks[name], operation)
    try:
        yield
    finally:
        for name, operation in leave:
            fcntl.flock(locks[name], operation)


def machine_shared() -> contextlib.AbstractContextManager[None]:
    """The block shares the machine, once through the gate: every test's run, and the heavy start of a session fixture
    (a Ray cluster's daemons), which would otherwise run beside another test's time alone."""
    return _flocks(enter=[("gate", fcntl.LOCK_SH), ("machine", fcntl.LOCK_SH), ("gate", fcntl.LOCK_UN)],
                   leave=[("machine", fcntl.LOCK_UN)])


@pytest.fixture(autouse=True)
def machine_share() -> Iterator[None]:
    """Every test shares the machine (:func:`machine_shared`); :func:`alone` takes it whole for a part of one test."""
    with machine_shared():
        yield


#: The :func:`alone` fixture's value: ``with alone():``.
Alone = Callable[[], contextlib.AbstractContextManager[None]]


def machine_to_itself() -> contextlib.AbstractContextManager[None]:
    """The block runs with the machine to itself: the other workers finish the test they are in and wait (see
    :func:`_machine_locks`). Tests reach it through :func:`alone`; a module-scoped fixture that measures for several
    tests calls it directly, once for all of them. The caller's shared hold goes while it waits at the gate: a test in
    its own wait there holds the gate and needs every shared hold gone."""
    return _flocks(enter=[("machine", fcntl.LOCK_UN), ("gate", fcntl.LOCK_EX), ("machine", fcntl.LOCK_EX)],
                   leave=[("machine", fcntl.LOCK_SH), ("gate", fcntl.LOCK_UN)])


@pytest.fixture
def alone() -> Alone:
    """``with alone():`` the block runs with the machine to itself (:func:`machine_to_itself`). Only what a user would
    watch belongs in it: a server starting or a page laid out shares the machine as any test does."""
    return machine_to_itself


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir() -> Iterator[str]:
    """Keep memmap caches and compiled kernels of the test session out of the user's home."""
    path = tempfile.mkdtemp(prefix="accel-widgets-test-cache-")
    previous = os.environ.get("ACCEL_WIDGETS_CACHE")
    os.environ["ACCEL_WIDGETS_CACHE"] = path
    yield path
    if previous is None:
        os.environ.pop("ACCEL_WIDGETS_CACHE", None)
    else:
        os.environ["ACCEL_WIDGETS_CACHE"] = previous
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def private_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Nothing writes a run history into the working directory: a panel or a tuner opened with the default
    history records to this test's own file."""
    path = tmp_path / "default_history.sqlite"
    monkeypatch.setenv(HISTORY_ENV, str(path))
    return path


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in the main thread for this test, however the suite was started.

    A suite started in the background (``nohup pytest ... &``) inherits SIGINT as ignored, and then
    ``_thread.interrupt_main()``, which simulates Ctrl-C, does nothing: a test waiting for its
    KeyboardInterrupt would wait out its whole timeout. Python's own handler is installed for the test.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path, for a child's TMPDIR: multiprocessing puts AF_UNIX sockets there
    (the forkserver's, the DataLoader's resource sharer), and their paths must stay under ~108 bytes."""
    path = tempfile.mkdtemp(prefix="awt-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


#: What a shared fixture runs for its tests besides the session's infrastructure (a Ray cluster's own processes),
#: each a callable naming those processes now; a fixture adds its own while it runs and checks they are gone after.
SHARED_INFRASTRUCTURE: list[Callable[[], set[int]]] = []


def infrastructure_pids() -> set[int]:
    """The processes the leak check allows: the session's and those a shared fixture names."""
    pids = {pid for source in SHARED_INFRASTRUCTURE for pid in source()}
    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    for pid in (server, tracker):
        if pid:
            pids.add(pid)
    return pids


def _descendants() -> dict[int, str]:
    """Every live process below this one, except the allowed infrastructure processes themselves."""
    allowed = infrastructure_pids()
    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in allowed and child.status() != psutil.STATUS_ZOMBIE:
                found[child.pid] = " ".join(child.cmdline()[:4])
        except psutil.Error:
            continue
    return found


def _listening_ports() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN}


def _wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail the test if it leaves a process, thread, listening port or torch temp file behind."""
    threads_before = set(threading.enumerate())
    processes_before = set(_descendants())
    ports_before = _listening_ports()
    temp_before = set(leftover_temp_files(os.getpid()))
    yield
    _wait_until(lambda: not (set(_descendants()) - processes_before), LEAK_GRACE_S)
    extra_processes = {p: c for p, c in _descendants().items() if p not in processes_before}
    _wait_until(lambda: not [t for t in threading.enumerate() if t not in threads_before and t.is_alive()], 1.0)
    extra_threads = [t.name for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    extra_ports = _listening_ports() - ports_before
    extra_temp = set(leftover_temp_files(os.getpid())) - temp_before
    problems = []
    if extra_processes:
        for pid in extra_processes:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        problems.append(f"processes left running: {extra_processes}")
    if extra_threads:
        problems.append(f"threads left running: {extra_threads}")
    if extra_ports:
        problems.append(f"listening ports left open: {sorted(extra_ports)}")
    if extra_temp:
        problems.append(f"temp files left behind: {sorted(extra_temp)}")
    if problems:
        pytest.fail("leak check: " + "; ".join(problems))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the tests that take the machine to themselves (:func:`alone`) first, then the slow ones, so
    that its workers are not left waiting on one long test at the end, and an ``alone()`` at the start waits for no
    long test already running beside it (later, one waited 25 s behind a job test, the cores half idle); GPU tests run
    only where CUDA exists (the GPU check script runs them on a lent GPU, in one process, in file order)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        items.sort(key=lambda item: ("alone" not in getattr(item, "fixturenames", ()),
                                     item.get_closest_marker("slow") is None))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
