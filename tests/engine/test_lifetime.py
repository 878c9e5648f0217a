"""Nothing a burst starts outlives or escapes its owner: killed callers, restarted kernels, repeated
Ctrl-C, user code that exits, stuck loaders. Each test attacks the engine from outside, as users do."""

from __future__ import annotations

import _thread
import contextlib
import glob
import json
import os
import queue
import stat
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from accel_widgets import (
    BurstOptions,
    BurstTimeout,
    Config,
    StepRecord,
    WorkerCrashed,
    WorkerError,
    Workload,
    run_burst,
)
from accel_widgets.engine import outcome
from accel_widgets.engine.events import Phase
from accel_widgets.engine.outcome import _crash_message
from accel_widgets.engine.process import inductor_cache_dir, running
from accel_widgets.engine.ranks import Collected, remove_orphaned_burst_dirs
from accel_widgets.views.text import summary
from tests.workloads import FailAt, ForksInForward, StuckItemDataset, tiny_workload

ROOT = Path(__file__).resolve().parents[2]
OWNER = """
import json, sys
import accel_widgets as aw
from tests.devices import cpu_device
from tests.workloads import tiny_workload

printed = []
def on_event(event):
    if isinstance(event, aw.StepRecord) and not printed:
        printed.append(1)
        print("STEP", flush=True)

aw.run_burst(tiny_workload(), aw.Config(**json.loads(sys.argv[1])), seconds=120, on_event=on_event,
             options=aw.BurstOptions(device=cpu_device()))  # 2 DDP ranks: gloo on the CPU, even where there are GPUs
"""


def _gone_within(processes: list[psutil.Process], seconds: float) -> float:
    """Seconds until every process has exited (fails the test past ``seconds``)."""
    started = time.perf_counter()
    while running(processes):
        assert time.perf_counter() - started < seconds, f"still running: {running(processes)}"
        time.sleep(0.02)
    return time.perf_counter() - started


def _wait_for_line(process: subprocess.Popen, text: str, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        line = process.stdout.readline()
        if text in line:
            return
        assert line or process.poll() is None, f"the owner exited: {process.stderr.read()[-2000:]}"
    pytest.fail(f"no {text!r} within {timeout} s")


@pytest.mark.parametrize("knobs", [{"num_workers": 1}, {"parallel": "ddp", "world_size": 2}],
                         ids=["loader-workers", "ddp-2"])
def test_killing_the_owner_takes_every_burst_process_with_it(knobs, short_tmp, monkeypatch):
    tmp_path = short_tmp
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, json.dumps(knobs)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_line(owner, "STEP", timeout=90)
        family = psutil.Process(owner.pid).children(recursive=True)
        infrastructure = psutil.Process(owner.pid).children()  # the forkserver and the resource tracker
        ranks = [p for p in family if p not in infrastructure]  # forked from the server, and their children
        assert len(ranks) >= 2  # a rank and its loader worker, or two ranks
        owner.kill()  # what the OOM killer or a kernel restart past its grace period does
        assert _gone_within(ranks, 2.0) < 2.0
        _gone_within(family, 3.0)  # the forkserver and resource tracker go once no owner is left
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
        owner.stderr.close()
    left = glob.glob(str(tmp_path / f"accel-widgets-*-{owner.pid}-*"))
    assert left  # the killed owner could not clean up: the next burst of anyone does
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    assert sorted(remove_orphaned_burst_dirs()) == sorted(left)
    assert not glob.glob(str(tmp_path / "accel-widgets-*"))


OWNER_OF_A_FORKING_MODEL = """
import sys
import accel_widgets as aw
from tests.devices import cpu_device
from tests.workloads import ForksInForward, tiny_workload

printed = []
def on_event(event):
    if isinstance(event, aw.StepRecord) and not printed:
        printed.append(1)
        print("STEP", flush=True)

aw.run_burst(tiny_workload(ForksInForward(sys.argv[1])), aw.Config(), seconds=120, on_event=on_event,
             options=aw.BurstOptions(device=cpu_device()))
"""


def test_killing_the_owner_takes_the_processes_its_model_forked_with_it(short_tmp):
    pid_file = short_tmp / "pids"
    env = {**os.environ, "TMPDIR": str(short_tmp), "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen([sys.executable, "-c", OWNER_OF_A_FORKING_MODEL, str(pid_file)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_line(owner, "STEP", timeout=90)
        forked = [psutil.Process(pid) for pid in _forked_pids(pid_file)]  # a plain fork and a daemon
        owner.kill()
        assert _gone_within(forked, 3.0) < 3.0
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
        owner.stderr.close()


def test_restarting_a_real_kernel_mid_burst_leaves_nothing(short_tmp, monkeypatch):
    tmp_path = short_tmp
    from jupyter_client.manager import KernelManager

    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(ROOT), env=env)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        kernel = psutil.Process(manager.provisioner.process.pid)
        client.execute("import accel_widgets as aw\nfrom tests.workloads import tiny_workload\n"
                       "aw.run_burst(tiny_workload(), aw.Config(num_workers=1), seconds=120)")
        deadline, said = time.perf_counter() + 60, []
        while len(kernel.children(recursive=True)) < 4:  # forkserver, resource tracker, rank, loader worker
            assert time.perf_counter() < deadline, f"the burst did not start: {said}"
            with contextlib.suppress(queue.Empty):
                message = client.get_iopub_msg(timeout=0.1)
                if message["msg_type"] in ("error", "stream"):
                    said.append(message["content"])
        family = kernel.children(recursive=True)
        manager.restart_kernel(now=True)
        _gone_within([kernel, *family], 3.0)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    remove_orphaned_burst_dirs()
    assert not glob.glob(str(tmp_path / f"accel-widgets-*-{kernel.pid}-*"))


def test_a_second_ctrl_c_during_teardown_cannot_leave_a_rank_or_a_file_behind(ctrl_c: None) -> None:
    """The rank ignores SIGTERM, so teardown waits out its grace before SIGKILL: the second Ctrl-C lands there."""
    timers = [threading.Timer(1.5, _thread.interrupt_main), threading.Timer(1.75, _thread.interrupt_main)]
    for timer in timers:
        timer.start()
    started = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_burst(tiny_workload(FailAt("hang-ignoring-sigterm", at_call=3)), Config(), steps=100)
        time.sleep(0.5)  # a second interrupt held back during teardown must not escape later either
    finally:
        for timer in timers:
            timer.cancel()
            timer.join()
    assert time.perf_counter() - started < 1.5 + 2.0
    # The no_leaks fixture asserts that no process and no burst dir is left.


@pytest.mark.parametrize(("how", "error", "says"), [
    ("sys.exit(0)", WorkerError, "the workload called sys.exit(0) on rank 0"),
    ("sys.exit(3)", WorkerError, "the workload called sys.exit(3) on rank 0"),
    ("KeyboardInterrupt", WorkerError, "KeyboardInterrupt raised inside the workload on rank 0"),
    ("os._exit(0)", WorkerCrashed, "rank 0 exited (code 0) before finishing its burst"),
    ("os._exit(3)", WorkerCrashed, "rank 0 exited with code 3 without raising"),
])
def test_user_code_that_exits_is_the_workloads_failure(how, error, says):
    with pytest.raises(error) as info:
        run_burst(tiny_workload(FailAt(how, at_call=3)), Config(), steps=10)
    result = info.value.result
    assert says in str(info.value)
    assert result.status == "failed" and "stopped" not in str(info.value)
    assert "out-of-memory" not in str(info.value)
    if error is WorkerError:
        assert "in forward" in result.error.traceback and result.error.kind == "exit"


def _forked_pids(pid_file: Path) -> list[int]:
    deadline = time.perf_counter() + 5
    while not pid_file.exists() or len(pid_file.read_text().split()) < 2:
        assert time.perf_counter() < deadline, "the forward did not fork"
        time.sleep(0.01)
    return [int(pid) for pid in pid_file.read_text().split()]


def _assert_ended_and_named(pids: list[int], warnings: list[str]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"pid {pid} outlived the burst"
        said = [w for w in warnings if f"(pid {pid}: " in w]
        assert len(said) == 1 and said[0].startswith("a process the workload started was still running when the "
                                                     "rank finished and was killed"), warnings


@pytest.mark.parametrize("knobs", [{}, {"num_workers": 1}], ids=["no-workers", "loader-workers"])
def test_processes_forked_in_forward_die_with_the_burst_and_are_named(knobs, tmp_path):
    pid_file = tmp_path / "pids"
    result = run_burst(tiny_workload(ForksInForward(str(pid_file))), Config(**knobs), steps=3)
    assert result.ok, summary(result)
    _assert_ended_and_named(_forked_pids(pid_file), result.warnings)


def test_processes_forked_in_forward_die_with_a_failing_burst_and_are_named(tmp_path):
    pid_file = tmp_path / "pids"
    with pytest.raises(WorkerError, match="forked, then failed") as info:
        run_burst(tiny_workload(ForksInForward(str(pid_file), then_raise=True)), Config(), steps=3)
    _assert_ended_and_named(_forked_pids(pid_file), info.value.result.warnings)


def test_a_stuck_loader_worker_is_named_when_the_burst_times_out():
    workload = Workload(model=tiny_workload().model, dataset=StuckItemDataset(stuck_after=40),
                        loss_fn=tiny_workload().loss_fn, batch_size=32, name="stuck-loader")
    with pytest.raises(BurstTimeout, match=r"rank 0 was waiting for its DataLoader .*: its DataLoader worker \(pid "
                                           r"\d+\) was in workloads.py:\d+ in __getitem__: time.sleep\(3600\)"):
        run_burst(workload, Config(num_workers=1), steps=20, options=BurstOptions(timeout_s=3.0))


def test_stop_with_loader_workers_returns_at_once():
    """Loader workers that already exited are zombies until their rank reaps them: not worth waiting for."""
    latencies = []
    for _ in range(3):
        stop, pressed = threading.Event(), []

        def on_event(event, stop=stop, pressed=pressed):
            if isinstance(event, StepRecord) and event.step == 3 and not stop.is_set():
                stop.set()
                pressed.append(time.perf_counter())

        result = run_burst(tiny_workload(), Config(num_workers=2), steps=10_000, on_event=on_event, stop=stop)
        latencies.append(time.perf_counter() - pressed[0])
        assert result.status == "stopped"
    assert statistics.median(latencies) < 0.3, latencies


def test_sigkill_is_blamed_on_the_oom_killer_only_with_evidence(monkeypatch):
    collected = Collected(exit_codes=[-9], phases=[Phase.STEP], oom_kills_before=2)
    monkeypatch.setattr(outcome, "oom_kill_count", lambda: 2)
    assert "from outside the burst (no out-of-memory kill was recorded)" in _crash_message(0, -9, collected)
    monkeypatch.setattr(outcome, "oom_kill_count", lambda: 3)
    assert "out-of-memory killer" in _crash_message(0, -9, collected)
    monkeypatch.setattr(outcome, "oom_kill_count", lambda: None)
    assert "cannot be checked here" in _crash_message(0, -9, collected)
    assert "a crash in native code" in _crash_message(0, -11, collected)


def test_compiled_kernels_go_to_a_private_cache_unless_the_user_chose_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    path = inductor_cache_dir(str(tmp_path))
    assert path == str(tmp_path / "inductor")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    # What torch writes into the environment once anything compiled in this process is not a choice.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(),
                                                               "torchinductor_someone"))
    assert inductor_cache_dir(str(tmp_path)) == path
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert inductor_cache_dir(str(tmp_path)) == str(tmp_path / "mine")
