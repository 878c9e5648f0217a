"""The preloaded forkserver every burst's ranks are forked from, started as early as it can be.

Why a forkserver with torch preloaded (measured on a 2-core machine, see the project notes): a cold
``spawn`` interpreter reaches its first step ~2.6 s after launch because every burst re-imports
torch; plain ``fork`` from a kernel that has used OpenMP deadlocks, and after CUDA init it is unsafe.
A forkserver imports torch once, never runs OpenMP or CUDA itself, and forks each rank in ~10 ms
with a fresh CUDA state. ``torch._dynamo`` is preloaded too: every optimizer imports it on
construction (~1 s), so every burst needs it.

Importing the server's modules takes ~2.7 s here, longer than the first burst may wait. So importing
:mod:`accel_widgets` starts the server (stdlib only, before this process imports torch itself), and
the server imports in the background while the user builds a model and a dataset. The server exits
when its owner does. ``ACCEL_WIDGETS_PRESTART=0`` turns the early start off; bursts then start it.

The server does not run the caller's main script again in a rank, as multiprocessing does by default
(it re-imports ``__main__`` in every child so that functions pickled by reference can be found): a
rank needs nothing from it, since the workload travels by value, and a script that calls run_burst at
top level, with no ``if __name__ == "__main__":`` guard, would otherwise train again in every rank.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile
from typing import Any

# Read before this module imports it: the forkserver process imported it to run, and then imports this
# package as a preload, which must not start a server of its own.
_INSIDE_A_FORKSERVER = "multiprocessing.forkserver" in sys.modules

from multiprocessing import forkserver, spawn, util  # noqa: E402

START_METHOD = "forkserver"
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch.optim", "cloudpickle", "numpy", "psutil",
                      "accel_widgets.engine.worker"]
MP_DIR_PREFIX = "accel-widgets-mp-"  # + the owner's pid: the next burst removes it if the owner was killed
#: The process name of every rank (+ its rank): what tells the server a child is a rank.
RANK_NAME_PREFIX = "accel-widgets-rank-"
_MAIN_SCRIPT_KEYS = ("init_main_from_path", "init_main_from_name")
_MAX_SOCKET_DIR = 80  # + "/listener-xxxxxxxx" stays within AF_UNIX's path limit


def forkserver_context() -> Any:
    ctx = multiprocessing.get_context(START_METHOD)
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


def warm_up() -> None:
    """Start the preloaded forkserver now, if it is not running; returns at once (it imports on its own)."""
    forkserver_context()
    _own_multiprocessing_temp_dir()
    forkserver.ensure_running()


def _own_multiprocessing_temp_dir() -> None:
    """Give multiprocessing's per-process temp dir (the server's socket lives there) a name we can clean.

    multiprocessing makes an anonymous ``pymp-*`` dir and deletes it at exit; a kernel that is killed
    leaves it behind forever. Named after this process, the next burst of any owner removes it once
    this process is gone. Done only where multiprocessing has not made its own dir yet (it reads
    ``current_process()._config["tempdir"]``, the one place it keeps that dir).
    """
    config = multiprocessing.current_process()._config
    if config.get("tempdir") is not None:
        return
    path = tempfile.mkdtemp(prefix=f"{MP_DIR_PREFIX}{os.getpid()}-")
    if len(path) > _MAX_SOCKET_DIR:  # the server's socket path must fit AF_UNIX's ~108 bytes
        os.rmdir(path)
        return
    config["tempdir"] = path
    util.Finalize(None, shutil.rmtree, args=(path, True), exitpriority=-100)  # as multiprocessing does


def prestart_on_import() -> None:
    """Start the server when the package is imported by a user's process (not by the server itself)."""
    if os.environ.get("ACCEL_WIDGETS_PRESTART", "1") == "0" or _INSIDE_A_FORKSERVER:
        return
    if multiprocessing.parent_process() is not None:
        return  # a worker of someone's multiprocessing (a spawned loader worker...): it launches no bursts
    try:
        warm_up()
    except Exception:  # importing must never fail for this: the first burst starts it and reports why not
        return


def prepare_rank(preparation_data: dict[str, Any]) -> None:
    """``multiprocessing.spawn.prepare`` for the server's children: a rank is prepared without the
    caller's main script (see the module's docstring); any other child exactly as multiprocessing would."""
    if str(preparation_data.get("name", "")).startswith(RANK_NAME_PREFIX):
        preparation_data = {k: v for k, v in preparation_data.items() if k not in _MAIN_SCRIPT_KEYS}
    _stock_prepare(preparation_data)


_stock_prepare = spawn.prepare
if _INSIDE_A_FORKSERVER:  # the server's own copy: it prepares each forked child with spawn.prepare
    spawn.prepare = prepare_rank
