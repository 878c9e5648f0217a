"""What a rank tells the launcher while a burst runs: plain, picklable messages over one queue.

Step records stream as they complete (the caller draws them live); the other messages close a
rank's story: its losses (read late when ``sync_every`` defers them), its summary, or its failure.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..results import RankSummary, StepRecord

PEER_FAILURE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted")


@dataclass(frozen=True)
class RankLosses:
    """Every step's loss of one rank, sent at the end (losses are read on the host only at sync points)."""

    rank: int
    values: list[float]


@dataclass(frozen=True)
class RankDone:
    """A rank finished its burst: its own summary, the environment it ran in, the warnings it saw."""

    summary: RankSummary
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RankFailed:
    """A rank raised. ``t`` (burst clock) orders failures so the first one can be named as the cause."""

    rank: int
    t: float
    kind: str
    message: str
    traceback: str

    @classmethod
    def from_exception(cls, rank: int, t: float, exc: BaseException) -> RankFailed:
        """Call inside the ``except`` block: the traceback is the one being handled."""
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        message = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        oom = isinstance(exc, torch.OutOfMemoryError)
        if oom:
            message += " -- try a smaller batch_size with grad_accum_steps, or precision='bf16'"
        return cls(rank, t, "oom" if oom else "exception", message, traceback.format_exc())

    @property
    def peer_failure(self) -> bool:
        """The rank only noticed that another rank vanished: a symptom, never the root cause."""
        return any(marker in self.message + self.traceback for marker in PEER_FAILURE_MARKERS)


WorkerEvent = StepRecord | RankLosses | RankDone | RankFailed
Emit = Callable[[WorkerEvent], None]
