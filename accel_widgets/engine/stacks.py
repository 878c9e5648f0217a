"""Where a stuck burst was: the Python stack of each stuck rank and loader worker, taken before teardown ends them.

A burst that times out or is stopped at a hang (a forward that sleeps or deadlocks, a loader worker stuck in
``__getitem__``, a rank waiting in a collective for a peer that never comes) used to say only what phase each rank
was in. Now every rank, and every process it forks (its DataLoader workers), writes the stack of each of its
threads to a file of its own when it gets :data:`STACK_SIGNAL` (:func:`dump_stacks_on_signal`), and the launcher
signals the processes of the ranks still running before it ends them (:func:`where_stuck`). The error then names
the innermost frame of the user's own code: "rank 0 was in models.py:12 in forward: time.sleep(60)".

Why ``faulthandler`` and not ``py-spy``: faulthandler is the standard library's, writes from C at once, even while
every thread is blocked in C code (a sleep, a lock, a gloo or NCCL wait) and whoever holds the GIL, and needs
nothing but a signal the process handles itself; py-spy is a separate binary that reads another process's memory
through ptrace, which containers often forbid. A real-time signal is used, which no library here handles. A process
is signalled only once its dump file exists, which it creates after registering the handler: a signal before it
would end the process (the default action). A process that cannot answer within :data:`STACK_WAIT_S` (stuck in the
kernel) is described by its phase alone.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import linecache
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Any

import psutil

from ..results.burst import StepRecord
from .user_code import libraries

STACK_SIGNAL = signal.SIGRTMIN + 3
STACKS_DIR = "stacks"  # in the burst's temp dir, one file per process id
#: How long the launcher waits for the dumps: a dump takes microseconds once the signal is delivered.
STACK_WAIT_S = 0.5
#: After a Stop, a rank that sent no step for this long is named with where it was (one that streams is not stuck).
STUCK_AFTER_S = 1.0
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)$')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")
_BY_VALUE = "<dynamic-code>"  # cloudpickle's file name for code of notebook cells and scripts sent by value
_LOADER_WORKER = ("torch/utils/data/_utils/worker.py", "_worker_loop")
_PROCESS_START = ("multiprocessing/process.py", "_bootstrap")  # where a rank's or loader worker's own frames begin


def dump_stacks_on_signal(temp_dir: str) -> None:
    """In a rank: write every thread's stack to ``<temp_dir>/stacks/<pid>`` on :data:`STACK_SIGNAL`; so does every
    process this one forks later (its DataLoader workers), each to its own file."""
    directory = os.path.join(temp_dir, STACKS_DIR)
    os.makedirs(directory, exist_ok=True)
    _register(directory)
    os.register_at_fork(after_in_child=functools.partial(_register, directory))


def _register(directory: str) -> None:
    """Register the dump, then make its file: its existence tells the launcher the signal is safe to send."""
    with contextlib.suppress(OSError):  # the burst's temp dir is gone: a process forked during teardown
        path = os.path.join(directory, str(os.getpid()))
        stream = open(path + ".part", "w")  # noqa: SIM115 -- faulthandler keeps it open for the process's life
        faulthandler.register(STACK_SIGNAL, file=stream, all_threads=True, chain=False)
        os.rename(path + ".part", path)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def text(self) -> str:
        """``models.py:12 in forward: time.sleep(60)``; code sent by value has no file: ``line 12 in forward``."""
        if self.file == _BY_VALUE:
            return f"line {self.line} in {self.function}"
        source = linecache.getline(self.file, self.line).strip()
        return f"{os.path.basename(self.file)}:{self.line} in {self.function}" + (f": {source}" if source else "")


def where_stuck(outcome: str, processes: list[Any], steps: list[StepRecord], doing: list[str], temp_dir: str,
                now: float) -> dict[int, str]:
    """"rank 0 was in models.py:12 in forward: time.sleep(60)" for each stuck rank, from the stacks of its process
    and of its children (a loader worker): every rank still running after a timeout or a failure, and after a Stop
    those that sent no step for :data:`STUCK_AFTER_S` (``steps`` so far, ``now`` on their clock). ``doing`` is
    what each rank's phase says it was doing, said where no frame of the user's code is on its stacks."""
    if outcome not in ("timeout", "failed", "stopped"):
        return {}
    last_step = {record.rank: record.t for record in steps}
    ranks = {rank: process.pid for rank, process in enumerate(processes)
             if process.pid is not None and process.exitcode is None
             and (outcome != "stopped" or now - last_step.get(rank, 0.0) >= STUCK_AFTER_S)}
    families = {rank: [pid, *_children(pid)] for rank, pid in ranks.items()}
    stacks = _take_stacks([pid for family in families.values() for pid in family],
                          os.path.join(temp_dir, STACKS_DIR))
    return {rank: _describe(rank, family, stacks, doing[rank] if rank < len(doing) else "still running")
            for rank, family in families.items()}


def _children(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    return []


def _take_stacks(pids: list[int], directory: str) -> dict[int, list[list[Frame]]]:
    """Signal every process that registered its dump and read what each wrote (a dump is complete once its file
    stops growing): its threads' frames, innermost first."""
    offsets = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            offsets[pid] = os.path.getsize(os.path.join(directory, str(pid)))
            os.kill(pid, STACK_SIGNAL)
    sizes, complete = dict(offsets), set()
    deadline = time.monotonic() + STACK_WAIT_S
    while offsets.keys() - complete and time.monotonic() < deadline:
        time.sleep(0.005)
        for pid in offsets.keys() - complete:
            with contextlib.suppress(OSError):
                size = os.path.getsize(os.path.join(directory, str(pid)))
                if size > offsets[pid] and size == sizes[pid]:
                    complete.add(pid)
                sizes[pid] = size
    return {pid: _threads(_read_from(os.path.join(directory, str(pid)), offsets[pid])) for pid in complete}


def _read_from(path: str, offset: int) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as fh:
        fh.seek(offset)
        return fh.read()
    return ""


def _threads(text: str) -> list[list[Frame]]:
    """faulthandler's dump as one list of frames per thread, innermost first, the main thread (the one that trains,
    or a loader worker's loop) first. A forked process's main thread also shows the frames of the process it was
    forked from (the caller's, where the server was forked; the rank's loop, where a loader worker was): they
    begin at multiprocessing's ``_bootstrap``, where this process's own work starts, and are left out."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif threads and (match := _FRAME.match(line)):
            threads[-1].append(Frame(match["file"], int(match["line"]), match["function"]))
    starts = [next((i for i, frame in enumerate(thread) if frame.file.endswith(_PROCESS_START[0])
                    and frame.function == _PROCESS_START[1]), None) for thread in threads]
    own = [thread[:start] for thread, start in zip(threads, starts, strict=True) if start is not None]
    return own + [thread for thread, start in zip(threads, starts, strict=True) if start is None]


def _describe(rank: int, family: list[int], stacks: dict[int, list[list[Frame]]], doing: str) -> str:
    """Where the rank's own code was, else where its loader worker's was, else its phase and innermost frame."""
    own = stacks.get(family[0], [])
    frame = _user_frame(own)
    if frame is not None:
        return f"rank {rank} was in {frame.text()}"
    for pid in family[1:]:
        frame = _user_frame(stacks.get(pid, []))
        if frame is not None:
            who = "DataLoader worker" if _is_loader_worker(stacks[pid]) else "child process"
            return f"rank {rank} was {doing}: its {who} (pid {pid}) was in {frame.text()}"
    innermost = next((thread[0] for thread in own if thread), None)
    return f"rank {rank} was {doing}" + (f", at {innermost.text()}" if innermost is not None else "")


def _user_frame(threads: list[list[Frame]]) -> Frame | None:
    """The innermost frame of the user's own code on any thread: not the standard library's, a site-package's or
    this package's (code sent by value from a notebook or a script is the user's too)."""
    installed = libraries()
    for thread in threads:
        for frame in thread:
            if frame.file == _BY_VALUE:
                return frame
            if frame.file.startswith("<"):
                continue
            if not installed.hold(frame.file) and not os.path.realpath(frame.file).startswith(_PACKAGE_DIR):
                return frame
    return None


def _is_loader_worker(threads: list[list[Frame]]) -> bool:
    return any(frame.file.endswith(_LOADER_WORKER[0]) and frame.function == _LOADER_WORKER[1]
               for thread in threads for frame in thread)
