"""The forkserver starts when the package is imported by a user's process, once, and never recursively; it is a fork of
the caller only where that is safe; and its ranks run the user's modules as the caller holds them at the burst."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from accel_widgets.engine import forkserver
from tests.workloads import MODELS

ROOT = Path(__file__).resolve().parents[2]

COUNT_SERVERS = """
import psutil, torch
import accel_widgets as aw
x = torch.randn(64, 8)
# A burst's ranks come from the server once it has imported torch and this package: by then a server the
# package's import started inside it would be running too.
aw.run_burst(aw.Workload(model=torch.nn.Linear(8, 2), dataset=(x, x[:, :2].argmax(1)),
                         loss_fn=torch.nn.functional.cross_entropy, batch_size=32), steps=2)
servers = [p for p in psutil.Process().children(recursive=True)
           if "multiprocessing.forkserver" in " ".join(p.cmdline())]
print(len(servers))
"""


def test_importing_the_package_starts_exactly_one_forkserver(short_tmp):
    env = {**os.environ, "TMPDIR": str(short_tmp)}
    done = subprocess.run([sys.executable, "-c", COUNT_SERVERS], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"


def test_the_early_start_is_for_top_level_processes_only_and_never_fails_an_import(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(forkserver, "warm_up", lambda: calls.append(1))
    forkserver.prestart_on_import(package_imported=True)
    assert calls == [1]
    monkeypatch.setenv("ACCEL_WIDGETS_PRESTART", "0")
    forkserver.prestart_on_import(package_imported=True)
    monkeypatch.delenv("ACCEL_WIDGETS_PRESTART")
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # a multiprocessing worker
    forkserver.prestart_on_import(package_imported=True)
    assert calls == [1]
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)

    def broken() -> None:
        raise OSError("AF_UNIX path too long")

    monkeypatch.setattr(forkserver, "warm_up", broken)
    forkserver.prestart_on_import(package_imported=True)  # no exception: the first burst starts it and says why not


def test_a_server_that_must_be_spawned_starts_first_thing_a_fork_once_the_package_is_imported(monkeypatch):
    """A spawned server imports torch while the package does; a fork taken before the package's last line would hold
    a half-imported package (its ranks could not import its names, their threads would wait on its import)."""
    started: list[bool] = []
    monkeypatch.setattr(forkserver, "_start_server", lambda forkable: started.append(forkable()))
    monkeypatch.setattr(forkserver, "can_fork_server", lambda: True)
    forkserver.prestart_on_import(package_imported=False)
    assert started == []  # the fork waits for the end of the package's import
    forkserver.prestart_on_import(package_imported=True)
    assert started == [True]
    monkeypatch.setattr(forkserver, "can_fork_server", lambda: False)
    forkserver.prestart_on_import(package_imported=False)
    assert started == [True, False]  # spawned at once


HALF_IMPORTED = """
import threading, torch
import accel_widgets as aw
x = torch.randn(64, 8)
workload = aw.Workload(model=torch.nn.Linear(8, 2), dataset=(x, x[:, :2].argmax(1)),
                       loss_fn=torch.nn.functional.cross_entropy, batch_size=8)


def probe():
    # In a rank of a server forked from this process: the package is whole, and a thread may import it.
    done = []
    thread = threading.Thread(target=lambda: done.append(__import__("accel_widgets.results.burst")))
    thread.start()
    thread.join(5.0)
    from accel_widgets import Workload  # noqa: F401
    assert done, "a thread importing the package waited for an import that never ends"
    return torch.nn.Linear(8, 2)


result = aw.run_burst(aw.Workload(model=probe, dataset=workload.dataset, loss_fn=workload.loss_fn, batch_size=8),
                      steps=1, options=aw.BurstOptions(timeout_s=30))
print(result.status)
"""


def test_the_ranks_of_a_forked_server_hold_the_whole_package(short_tmp):
    env = {**os.environ, "TMPDIR": str(short_tmp), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", HALF_IMPORTED], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "ok"


SERVER_KIND = """
import atexit, json, os, sys
import torch
{before}
import accel_widgets as aw
import psutil
from accel_widgets.engine import forkserver
atexit.register(lambda: open({marker!r}, "a").write("caller exit\\n"))
x = torch.randn(256, 8)
result = aw.run_burst(aw.Workload(model=torch.nn.Linear(8, 2), dataset=(x, x[:, :2].argmax(1)),
                                  loss_fn=torch.nn.functional.cross_entropy, batch_size=32),
                      aw.Config(parallel="ddp", world_size=2), steps=3)
server = psutil.Process(forkserver.server_pid()).cmdline()
print(json.dumps({{"forked": server == psutil.Process().cmdline(), "status": result.status}}))  # a fork: this cmdline
"""


def _server_kind(short_tmp, before: str = "", env: dict[str, str] | None = None) -> dict:
    marker = short_tmp / "atexit.log"
    code = SERVER_KIND.format(before=before, marker=str(marker))
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(short_tmp), **(env or {})},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "atexit": marker.read_text()}


def test_a_process_that_imported_torch_first_is_forked_into_the_server_and_only_it_runs_its_atexit(short_tmp):
    seen = _server_kind(short_tmp)
    assert seen["forked"] and seen["status"] == "ok"
    assert seen["atexit"] == "caller exit\n"  # the server and the ranks leave with os._exit: once, the caller's


@pytest.mark.slow
def test_a_process_whose_openmp_pool_ran_gets_a_spawned_server_not_a_hanging_fork(short_tmp):
    """After a parallel region libgomp's children hang at their next one: the canary sees it, the server is
    spawned, and the DDP burst trains."""
    seen = _server_kind(short_tmp, before="torch.set_num_threads(2); torch.ones(1 << 20).exp_()")
    assert not seen["forked"] and seen["status"] == "ok"


#: /proc/self/maps of a process on an H200 machine (torch 2.11, CUDA 13): the runtime is there once torch is
#: imported; the driver only once something ran cuInit (``torch.cuda.is_available()`` does).
MAPS_AFTER_IMPORT = [
    "55d0c6a5e000-55d0c6a8e000 r--p 00000000 103:02 2228300                   /usr/bin/python3.12\n",
    "7f2c4c800000-7f2c4c8a1000 r-xp 00000000 103:02 4853290                   "
    "/usr/local/lib/python3.12/dist-packages/nvidia/cu13/lib/libcudart.so.13\n",
    "7f2c4d000000-7f2c4d021000 rw-p 00000000 00:00 0 \n",
    "7ffd5a1f2000-7ffd5a213000 rw-p 00000000 00:00 0                          [stack]\n",
]
MAPS_AFTER_IS_AVAILABLE = [*MAPS_AFTER_IMPORT[:2],
                           "7f2c4a000000-7f2c4a3c5000 r--p 00000000 103:02 4849733                   "
                           "/usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06\n", *MAPS_AFTER_IMPORT[2:]]


@pytest.mark.slow
def test_a_cuda_context_the_cuda_driver_a_large_heap_or_the_opt_out_keep_the_spawned_server(monkeypatch, short_tmp):
    """``is_available()`` runs cuInit without setting torch's flag: the loaded driver alone refuses the fork (every
    rank of such a fork fails with "CUDA error: initialization error")."""
    import torch

    assert not forkserver.cuda_driver_loaded(MAPS_AFTER_IMPORT)
    assert forkserver.cuda_driver_loaded(MAPS_AFTER_IS_AVAILABLE)
    monkeypatch.setattr(forkserver, "_parallel_op_runs_in_a_child", lambda torch: True)  # the fork is safe but for:
    monkeypatch.setattr(forkserver, "_own_memory_map", lambda: MAPS_AFTER_IS_AVAILABLE)
    assert not forkserver.can_fork_server()
    monkeypatch.setattr(forkserver, "_own_memory_map", lambda: MAPS_AFTER_IMPORT)
    assert forkserver.can_fork_server()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not forkserver.can_fork_server()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(forkserver, "FORK_MAX_RSS_BYTES", 1 << 20)
    assert not forkserver.can_fork_server()
    seen = _server_kind(short_tmp, env={forkserver.SERVER_ENV: "spawn"})
    assert not seen["forked"] and seen["status"] == "ok"


DRIVER_LOADED = """
import ctypes, json, sys
import torch
from accel_widgets.engine import forkserver
before = forkserver.can_fork_server()
ctypes.CDLL(sys.argv[1])  # what cuInit leaves behind: the driver library mapped into the process
print(json.dumps([before, forkserver.can_fork_server()]))
"""


def test_a_process_that_loaded_the_cuda_driver_is_not_forked(short_tmp):
    """A real mapping, not a fake list: a shared library named as the driver is, loaded into a fresh process."""
    driver = short_tmp / "libcuda.so.1"
    shutil.copy(psutil._psutil_linux.__file__, driver)  # a small shared library this project always has
    env = {**os.environ, "TMPDIR": str(short_tmp), "ACCEL_WIDGETS_PRESTART": "0"}
    done = subprocess.run([sys.executable, "-c", DRIVER_LOADED, str(driver)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [True, False]


# -- the code a rank runs is the caller's, as it is at the burst -------------------------------------------------
#: Imports accel_widgets before it defines what the workload uses: the server is forked while it is half-executed.
HELPER = '''
import torch
import torch.nn.functional as F
import accel_widgets as aw


def loss(output, target):
    return F.mse_loss(output, target)
'''
#: Imported after accel_widgets, once the server was forked.
LATE = '''
import torch


def optimizer(params):
    return torch.optim.SGD(params, lr=0.0)
'''
SCRIPT = '''
import helper  # first: accel_widgets is imported inside it, before it defines loss()
import importlib, json, pathlib, sys
import psutil
import models
import accel_widgets as aw
from accel_widgets.engine import forkserver
import late


def workload():
    return aw.Workload(model=models.Net, dataset=models.Data(), loss_fn=helper.loss, optimizer=late.optimizer,
                       batch_size=4)


before = aw.run_burst(workload(), steps=1)
pathlib.Path("models.py").write_text(sys.argv[1])
importlib.reload(models)
single = aw.run_burst(workload(), steps=1)
ddp = aw.run_burst(workload(), aw.Config(parallel="ddp", world_size=2, num_workers=1), steps=1)
print(json.dumps({"forked": psutil.Process(forkserver.server_pid()).cmdline() == psutil.Process().cmdline(),
                  "before": before.losses(rank=0), "single": single.losses(rank=0),
                  "ddp": [ddp.losses(rank=rank) for rank in (0, 1)], "loader_workers": ddp.config.num_workers,
                  "warnings": single.warnings + ddp.warnings}))
'''


def test_ranks_train_the_modules_as_the_caller_holds_them_edited_half_imported_at_the_fork_or_imported_after(
        short_tmp):
    """models.py imported before accel_widgets, edited and reloaded; helper.py, which imports accel_widgets before
    defining its loss (the server was forked inside its import); late.py, imported after: one process, bursts of one
    rank, then DDP x 2 with a loader worker per rank, all train the current code."""
    for name, source in (("models", MODELS.format(output=1.0, target=0.0)), ("helper", HELPER), ("late", LATE)):
        (short_tmp / f"{name}.py").write_text(source)
    (short_tmp / "train.py").write_text(SCRIPT)
    env = {**os.environ, "TMPDIR": str(short_tmp), "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "train.py", MODELS.format(output=3.0, target=1.0)], cwd=short_tmp,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["forked"], "the server was spawned: the case of a fork taken inside helper's import did not happen"
    assert seen["before"] == [1.0] * 3  # 2 warm-up steps and 1 measured
    assert seen["single"] == [4.0] * 3 and seen["ddp"] == [[4.0] * 3, [4.0] * 3] and seen["loader_workers"] == 1
    assert not [w for w in seen["warnings"] if "travels to the ranks by name" in w]
