"""A stop asked by a signal: preemption and ``torchrun``'s elastic restarts end a job with SIGTERM.

The handler only notes the signal; the job acts on it at the next step boundary, where every rank agrees to stop
(:class:`~accel_widgets.job.run.Job`), writes a checkpoint and exits 0, so a restart with ``--resume`` carries on.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class StopRequest:
    """The name of the signal that asked the job to stop ("" while none has)."""

    def __init__(self) -> None:
        self.received = ""

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name


@contextlib.contextmanager
def stop_requested_by(*signals: signal.Signals) -> Iterator[StopRequest]:
    """Note ``signals`` instead of dying of them for the duration; the previous handlers come back after.

    Python runs signal handlers in the main thread only: a job trained from another thread keeps the default
    handlers (it dies of SIGTERM as any process does, and its newest checkpoint is where it resumes).
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {each: signal.signal(each, request.handle) for each in signals}
    try:
        yield request
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)
