"""The forkserver starts when the package is imported by a user's process, once, and never recursively."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

from accel_widgets.engine import forkserver

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
    forkserver.prestart_on_import()
    assert calls == [1]
    monkeypatch.setenv("ACCEL_WIDGETS_PRESTART", "0")
    forkserver.prestart_on_import()
    monkeypatch.delenv("ACCEL_WIDGETS_PRESTART")
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # a multiprocessing worker
    forkserver.prestart_on_import()
    assert calls == [1]
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)

    def broken() -> None:
        raise OSError("AF_UNIX path too long")

    monkeypatch.setattr(forkserver, "warm_up", broken)
    forkserver.prestart_on_import()  # no exception: the first burst starts the server and says why not


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
    import json

    return {**json.loads(done.stdout.strip().splitlines()[-1]), "atexit": marker.read_text()}


def test_a_process_that_imported_torch_first_is_forked_into_the_server_and_only_it_runs_its_atexit(short_tmp):
    seen = _server_kind(short_tmp)
    assert seen["forked"] and seen["status"] == "ok"
    assert seen["atexit"] == "caller exit\n"  # the server and the ranks leave with os._exit: once, the caller's


def test_a_process_whose_openmp_pool_ran_gets_a_spawned_server_not_a_hanging_fork(short_tmp):
    """After a parallel region libgomp's children hang at their next one: the canary sees it, the server is
    spawned, and the DDP burst trains."""
    seen = _server_kind(short_tmp, before="torch.set_num_threads(2); torch.ones(1 << 20).exp_()")
    assert not seen["forked"] and seen["status"] == "ok"


def test_a_cuda_context_a_large_heap_or_the_opt_out_keep_the_spawned_server(monkeypatch, short_tmp):
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not forkserver.can_fork_server()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(forkserver, "FORK_MAX_RSS_BYTES", 1 << 20)
    assert not forkserver.can_fork_server()
    seen = _server_kind(short_tmp, env={forkserver.SERVER_ENV: "spawn"})
    assert not seen["forked"] and seen["status"] == "ok"
