"""What a rank tells the launcher while a burst runs: plain, picklable messages over one queue.

Step records stream as they complete (the caller draws them live); the other messages close a
rank's story: its losses (read late when ``sync_every`` defers them), its summary, or its failure.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch

from ..results.burst import PhaseName, RankSummary, StepRecord

PEER_FAILURE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted")
COLLECTIVE_TIMEOUT_MARKERS = ("Timed out waiting", "Watchdog caught collective operation timeout")


class Phase(IntEnum):
    """What a rank is doing right now, kept in memory the launcher reads when a burst hangs or fails."""

    STARTING = 0  # the process exists; the burst's code has not run yet
    SETUP = 1
    DATA = 2
    STEP = 3
    FINISHING = 4

    @property
    def public_name(self) -> PhaseName:
        """The coarse phase callers see (``BurstPhase``): waiting for data is part of stepping, so a fast
        loop does not send two events per step."""
        return {Phase.STARTING: "starting", Phase.SETUP: "setup", Phase.DATA: "step", Phase.STEP: "step",
                Phase.FINISHING: "finishing"}[self]

    def describe_public(self) -> str:
        """What :attr:`public_name` alone tells of where the rank was (all a cluster rank reports): stepping covers
        waiting for a batch and the step itself."""
        if self.public_name == "step":
            return "stepping (waiting for a batch or inside a training step)"
        return self.describe()

    def describe(self) -> str:
        return {
            Phase.STARTING: "starting (the process had not reached the burst's code)",
            Phase.SETUP: "still setting up (building the model, loader or process group)",
            Phase.DATA: "waiting for its DataLoader (a loader worker is stuck or very slow)",
            Phase.STEP: "inside a training step (forward, backward, optimizer or a DDP collective)",
            Phase.FINISHING: "finishing (profiling, counting FLOPs or leaving the process group)",
        }[self]


@dataclass(frozen=True)
class StepBatch:
    """Step records sent together: one queue message per ~25 ms instead of one per (fast) step."""

    records: tuple[StepRecord, ...]


@dataclass(frozen=True)
class RankLosses:
    """Every step's loss of one rank, sent at the end (losses are read on the host only at sync points)."""

    rank: int
    values: list[float]


@dataclass(frozen=True)
class RankDone:
    """A rank finished a measured window: its own summary, the environment it ran in, the warnings it saw.

    ``window`` counts the windows of a held burst (0: the burst's own); ``held`` says the rank stays to measure
    another when told (:class:`MeasureAgain`) instead of exiting.
    """

    summary: RankSummary
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    window: int = 0
    held: bool = False


@dataclass(frozen=True)
class MeasureAgain:
    """The launcher's word to a held rank: build the training state afresh, warm it up and measure window
    ``window`` of ``steps`` steps, or fewer where ``seconds`` (a cap, one rank only) run out first. ``None`` in its
    place tells the rank to finish."""

    window: int
    steps: int
    warmup_steps: int
    seconds: float | None = None


@dataclass(frozen=True)
class RankFailed:
    """A rank raised. ``t`` (burst clock) orders failures so the first one can be named as the cause."""

    rank: int
    t: float
    kind: str
    message: str
    traceback: str
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_exception(cls, rank: int, t: float, exc: BaseException) -> RankFailed:
        """Call inside the ``except`` block: the traceback is the one being handled."""
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        message = _raised_elsewhere(text) or (f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
        kind = "exception"
        if isinstance(exc, torch.OutOfMemoryError):
            kind = "oom"
            message += " -- try a smaller batch_size with grad_accum_steps, or precision='bf16'"
        elif isinstance(exc, SystemExit):
            kind = "exit"
            message = f"the workload called sys.exit({exc.code!r}) on rank {rank}: a burst cannot end the process"
        elif isinstance(exc, KeyboardInterrupt):
            kind = "exit"
            message = (f"KeyboardInterrupt raised inside the workload on rank {rank} (ranks ignore Ctrl-C: only "
                       "the caller stops a burst, so this came from user code)")
        elif any(marker in text for marker in COLLECTIVE_TIMEOUT_MARKERS):
            message += (" -- a DDP collective waited past the process group's timeout: another rank is stuck "
                        "or ran a different number of steps")
        return cls(rank, t, kind, message, traceback.format_exc())

    @property
    def connection_broke(self) -> bool:
        """A peer's connection to this rank closed under it: that peer's process, or the machine it ran on, is gone."""
        return any(marker in self.message + self.traceback for marker in PEER_FAILURE_MARKERS)

    @property
    def peer_failure(self) -> bool:
        """The rank only noticed that another rank vanished or stalled: a symptom, never the root cause."""
        return self.connection_broke or any(marker in self.message + self.traceback
                                            for marker in COLLECTIVE_TIMEOUT_MARKERS)


#: How torch re-raises an exception from a DataLoader worker (or its pin-memory thread): "Caught ValueError in
#: DataLoader worker process 0.", then the original traceback, whose last lines are the user's own exception.
_RERAISED = re.compile(r"Caught \S+ (?P<where>.+?)\.\nOriginal Traceback \(most recent call last\):\n(?P<tb>.*)", re.S)


def _raised_elsewhere(text: str) -> str:
    """``ValueError: bad item 7 (raised in DataLoader worker process 0)`` for an exception torch re-raised from a
    loader worker: its own first line names the wrapper, while the user's exception is at the end of the original
    traceback. Empty for any other exception."""
    match = _RERAISED.match(text)
    if match is None:
        return ""
    lines = match.group("tb").rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith(" ")]  # "  File ...", then its source line
    original = lines[frames[-1] + 1:] if frames else lines
    headline = next((line for line in original if line.strip()), "")
    return f"{headline} (raised {match.group('where')})" if headline else ""


WorkerEvent = StepRecord | StepBatch | RankLosses | RankDone | RankFailed
Emit = Callable[[WorkerEvent], None]


class EventChannel:
    """The ranks' messages to the launcher: one pipe, written by the sending thread itself.

    A ``multiprocessing.Queue`` pickles and writes from a feeder thread that wakes on every message; on
    a 2-core machine each wake-up preempts one of the rank's two intra-op threads, and the whole step
    then waits at the next barrier. Here the rank's own thread writes, under a lock the ranks share so
    their messages never interleave; the launcher polls with a timeout. Picklable while processes are
    being started, like any multiprocessing pipe and lock.
    """

    def __init__(self, context: Any) -> None:
        self._reader, self._writer = context.Pipe(duplex=False)
        self._lock = context.Lock()

    def put(self, event: WorkerEvent) -> None:
        with self._lock:
            self._writer.send(event)

    def get(self, timeout: float) -> WorkerEvent | None:
        """The next message, waiting up to ``timeout`` seconds for one; None if none came."""
        return self._reader.recv() if self._reader.poll(timeout) else None

    def close_writer(self) -> None:
        """The launcher's copy of the write end: closed once the ranks hold theirs, so that a read
        after every rank is gone ends with EOFError instead of waiting forever."""
        self._writer.close()

    def close(self) -> None:
        self._reader.close()
        self._writer.close()
