"""The forkserver starts when the package is imported by a user's process, once, and never recursively."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

from accel_widgets.engine import forkserver

COUNT_SERVERS = """
import time, psutil
import accel_widgets
time.sleep(6)  # the server imports torch and this package meanwhile: it must not start a server of its own
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
