"""A rank's side of the event stream: batching of fast steps, and nothing left behind when it stops."""

import os
import platform
import subprocess
import sys
import threading
import time

import pytest

from accel_widgets.engine.events import RankLosses, StepBatch
from accel_widgets.engine.worker import HANG_FLUSH_S, STEP_BATCH_S, _BatchedEmit
from accel_widgets.results.burst import StepRecord


def _record(step: int) -> StepRecord:
    return StepRecord(0, step, float(step), 0.0, 0.0, 0.001, 0.001, 8)


def _records(messages: list) -> list[StepRecord]:
    out = []
    for message in messages:
        if isinstance(message, StepBatch):
            out.extend(message.records)
        elif isinstance(message, StepRecord):
            out.append(message)
    return out


def test_fast_steps_leave_in_one_message_and_reach_the_caller_when_the_rank_then_stops_sending():
    sent: list = []
    emit = _BatchedEmit(sent.append)
    records = [_record(step) for step in range(50)]
    for record in records:  # 50 steps within far less than STEP_BATCH_S
        emit(record)
    assert sent == [records[0]]  # the first step goes at once; the rest wait for the next message due

    time.sleep(HANG_FLUSH_S + 0.2)  # the rank blocks (a collective, a stuck loader): the flusher sends them
    assert _records(sent) == records and len(sent) == 2
    emit.close()


def test_other_events_go_at_once_after_the_steps_before_them_and_close_ends_the_flusher():
    sent: list = []
    emit = _BatchedEmit(sent.append)
    for step in range(5):
        emit(_record(step))
    emit(RankLosses(0, [1.0] * 5))
    assert [type(m).__name__ for m in sent] == ["StepRecord", "StepBatch", "RankLosses"]
    assert [r.step for r in _records(sent[:2])] == [0, 1, 2, 3, 4]

    emit(_record(5))
    time.sleep(STEP_BATCH_S)
    emit(_record(6))  # due: goes with 5
    emit(_record(7))
    started = time.perf_counter()
    emit.close()  # sends 7 and stops the flusher without waiting out its sleep
    assert time.perf_counter() - started < HANG_FLUSH_S / 2
    assert [r.step for r in _records(sent)][-3:] == [5, 6, 7]
    assert not [t for t in threading.enumerate() if t.name == "accel-widgets-events"]


_CHURN = """
import ctypes, resource, sys
from accel_widgets.engine.worker import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
BLOCK = 10 << 20

def step():  # a step's activations: several large blocks written, then all freed together
    blocks = [libc.malloc(BLOCK) for _ in range(4)]
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)
    for block in blocks:
        libc.free(block)

for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_rank_keeps_the_memory_each_step_frees_instead_of_faulting_it_back_in():
    def faults_per_step(mode: str) -> float:
        done = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "ACCEL_WIDGETS_PRESTART": "0"})
        assert done.returncode == 0, done.stderr
        return float(done.stdout.split()[-1])

    stock, kept = faults_per_step("stock"), faults_per_step("keep")
    assert stock > 5_000  # a fresh process returns the 40 MiB to the system each step and faults it back in
    assert kept < stock / 20
