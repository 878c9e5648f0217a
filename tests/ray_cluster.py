"""A Ray cluster of two nodes of one CPU each on loopback (``ray.cluster_utils.Cluster``), started once per test
session by the first test that asks for it (``ray_cluster``), and the processes of the tests that run on it.

Every test that uses it carries ``pytest.mark.xdist_group("ray-cluster")``: under ``--dist loadgroup`` they run in
one pytest-xdist worker, which starts the cluster once (13-28 s here), not once per worker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from tests import conftest

#: Give a test's processes this long to end before calling them left behind.
GONE_WITHIN_S = 5.0
#: What a test starts on the cluster, which must be gone when it ends (Ray names a process by its actor): a burst's
#: ranks and its event queue; a Ray Train run's controller, workers and helpers (the placement-group cleaner is a
#: detached actor that ends once the controller has).
BURST_PROCESS_MARKS = ("ray::RankActor", "ray::_QueueActor")
TRAIN_PROCESS_MARKS = ("ray::TrainController", "ray::RayTrainWorker", "ray::PlacementGroupCleaner",
                       "ray::PreemptionWatcher")
#: A node without the daemons a test does not use (the dashboard, the log monitor; on the head, the autoscaler's
#: monitor): each is a Python process importing Ray, 6-10 s of this machine's two cores at the cluster's start.
LEAN_NODE = {"include_dashboard": False, "include_log_monitor": False}


def cluster_processes() -> list[psutil.Process]:
    """Every process the test session runs below itself: the cluster's daemons, its workers and the bursts' actors."""
    return psutil.Process().children(recursive=True)


def command_of(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(process.cmdline())
    return ""


def burst_processes() -> list[psutil.Process]:
    return [p for p in cluster_processes() if command_of(p).startswith(BURST_PROCESS_MARKS)]


def train_processes() -> list[psutil.Process]:
    return [p for p in cluster_processes() if command_of(p).startswith(TRAIN_PROCESS_MARKS)]


def cluster_infrastructure() -> set[int]:
    """The cluster's own processes (daemons, agents, idle workers), which the leak check allows while it runs."""
    return {p.pid for p in cluster_processes() if ((command := command_of(p)).startswith("ray::") or "/ray/" in command)
            and not command.startswith(BURST_PROCESS_MARKS + TRAIN_PROCESS_MARKS)}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """Two nodes of one CPU each, everything on 127.0.0.1: Ray otherwise takes the machine's outward address for
    its own (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps it on loopback: read by each process of the cluster as it
    imports Ray, and by this one, which has, through the constant it was read into), and the leak check treats the
    cluster's own processes as infrastructure until it is shut down, then finds none of them left. Its files live in
    a short dir of /tmp (``RAY_TMPDIR``): a session's AF_UNIX sockets lie four levels below, and such a path must stay
    under 108 bytes, which the tests' own nested temp dir under pytest-xdist would not. Skipped where Ray is not
    installed (``pip install 'accel-widgets[ray]'``)."""
    ray = pytest.importorskip("ray")
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    constants = ray._private.ray_constants
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    outward, constants.ENABLE_RAY_CLUSTER = constants.ENABLE_RAY_CLUSTER, False
    root = tempfile.mkdtemp(prefix="awr-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = root
    with conftest.machine_shared():  # 13-28 s of daemons starting: never beside another test's time alone
        started = cluster_utils.Cluster(initialize_head=True, connect=False, head_node_args={
            "num_cpus": 1, "node_ip_address": "127.0.0.1", **LEAN_NODE, "no_monitor": True})
        started.add_node(num_cpus=1, node_ip_address="127.0.0.1", **LEAN_NODE)
        ray.init(address=started.address, log_to_driver=False)
    conftest.SHARED_INFRASTRUCTURE.append(cluster_infrastructure)
    try:
        yield started
    finally:
        conftest.SHARED_INFRASTRUCTURE.remove(cluster_infrastructure)
        ray.shutdown()
        started.shutdown()
        os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        os.environ.pop("RAY_TMPDIR", None)
        constants.ENABLE_RAY_CLUSTER = outward
        session = conftest.infrastructure_pids()  # the session's forkserver and resource tracker stay
        ours = [p for p in cluster_processes() if p.pid not in session]
        left = [command_of(p) for p in psutil.wait_procs(ours, timeout=GONE_WITHIN_S)[1]]
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"the cluster left processes behind: {left}"


def gone(processes: Callable[[], list[psutil.Process]]) -> list[str]:
    """Commands of ``processes()`` still running after ``GONE_WITHIN_S``."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [command_of(p) for p in left]


