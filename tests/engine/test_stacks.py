"""A stuck burst says where: the user's innermost frame on the stuck rank's stacks, or its loader worker's."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import torch

from accel_widgets import Config, StepRecord, run_burst
from accel_widgets.engine import stacks
from tests.workloads import FailAt, tiny_workload

HERE = Path(__file__).resolve()
TORCH = os.path.dirname(torch.__file__)
PACKAGE = HERE.parents[2] / "accel_widgets"
MP = os.path.dirname(threading.__file__) + "/multiprocessing"

#: What faulthandler writes for a rank stuck in its model's forward: the flusher thread first, the main thread last,
#: whose bottom frames are the caller's, where the server was forked from it (a script at its import line).
RANK_DUMP = f'''Thread 0x00007feafb7fe6c0 (most recent call first):
  File "{PACKAGE}/engine/worker.py", line 195 in _flush_forever
  File "{os.path.dirname(threading.__file__)}/threading.py", line 982 in run

Current thread 0x00007feb26c6fb80 (most recent call first):
  File "{HERE}", line 7 in forward
  File "{TORCH}/nn/modules/module.py", line 1789 in _call_impl
  File "{PACKAGE}/engine/training.py", line 245 in call_model
  File "{PACKAGE}/engine/worker.py", line 108 in worker_main
  File "{MP}/process.py", line 108 in run
  File "{MP}/process.py", line 314 in _bootstrap
  File "{PACKAGE}/engine/forkserver.py", line 209 in _serve
  File "/home/me/train.py", line 2 in <module>
'''
LOADER_WORKER_DUMP = f'''Current thread 0x00007feb26c6fb80 (most recent call first):
  File "<dynamic-code>", line 12 in __getitem__
  File "{TORCH}/utils/data/_utils/fetch.py", line 52 in fetch
  File "{TORCH}/utils/data/_utils/worker.py", line 349 in _worker_loop
  File "{MP}/process.py", line 108 in run
  File "{MP}/process.py", line 314 in _bootstrap
  File "{PACKAGE}/engine/training.py", line 300 in build_loop
'''
COLLECTIVE_DUMP = f'''Current thread 0x00007feb26c6fb80 (most recent call first):
  File "{TORCH}/autograd/graph.py", line 829 in _engine_run_backward
  File "{PACKAGE}/engine/training.py", line 480 in _step
  File "{MP}/process.py", line 314 in _bootstrap
'''


def test_the_users_innermost_frame_is_named_with_its_source_line_never_the_callers_frames_of_the_fork():
    threads = stacks._threads(RANK_DUMP)
    assert [frame.function for frame in threads[0]] == ["forward", "_call_impl", "call_model", "worker_main", "run"]
    assert stacks._describe(0, [11], {11: threads}, "inside a training step") == (
        f"rank 0 was in test_stacks.py:7 in forward: {(HERE.read_text().splitlines()[6]).strip()}")


def test_a_rank_without_user_code_on_its_stacks_is_named_by_its_loader_worker_or_its_phase():
    found = {11: stacks._threads(COLLECTIVE_DUMP), 12: stacks._threads(LOADER_WORKER_DUMP)}
    assert stacks._describe(0, [11, 12], found, "waiting for its DataLoader") == (
        "rank 0 was waiting for its DataLoader: its DataLoader worker (pid 12) was in line 12 in __getitem__")
    assert stacks._describe(1, [11], found, "inside a training step") == (
        f"rank 1 was inside a training step, at graph.py:829 in _engine_run_backward: "
        f"{Path(TORCH, 'autograd', 'graph.py').read_text().splitlines()[828].strip()}")
    assert stacks._describe(2, [13], found, "starting") == "rank 2 was starting"  # it never answered


def test_a_stop_at_a_hang_names_the_line_a_stop_of_a_streaming_burst_does_not():
    stop = threading.Event()

    def on_event(event):
        if isinstance(event, StepRecord) and event.step == 3:
            threading.Timer(stacks.STUCK_AFTER_S + 0.5, stop.set).start()

    result = run_burst(tiny_workload(FailAt("hang", at_call=8)), Config(), steps=100, on_event=on_event, stop=stop)
    assert result.status == "stopped"
    assert result.error.message.startswith("stopped before the end of the burst (Stop or an interrupt); rank 0 was in "
                                           "workloads.py:")
    assert result.error.message.endswith("in forward: time.sleep(3600)")

    stop = threading.Event()
    started = time.perf_counter()

    def on_step(event):
        if isinstance(event, StepRecord) and event.step >= 3:
            stop.set()  # the rank streams steps: it is not stuck

    result = run_burst(tiny_workload(), Config(), seconds=30, on_event=on_step, stop=stop)
    assert result.error.message == "stopped before the end of the burst (Stop or an interrupt)"
    assert time.perf_counter() - started < 10
