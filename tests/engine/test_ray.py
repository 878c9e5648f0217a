"""Bursts on a Ray cluster: two nodes of one CPU each on loopback (``ray.cluster_utils.Cluster``), shared by every test
of the module, a DDP x 2 burst with one rank per node, and every way it can end leaving nothing on either node.

Skipped where Ray is not installed (``pip install 'accel-widgets[ray]'``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from accel_widgets import (
    BurstOptions,
    BurstPhase,
    BurstRequestError,
    Config,
    RayCluster,
    StepRecord,
    WorkerCrashed,
    diagnose,
    run_burst,
    summary,
)
from accel_widgets.analysis.compare import straggler
from accel_widgets.engine.held import HeldBurst
from tests import conftest
from tests.devices import cpu_device
from tests.engine.test_ddp import listening_addresses
from tests.workloads import tiny_workload

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

#: One pytest-xdist worker runs the module (``--dist loadgroup``): it starts the cluster once, not once per worker,
#: and early, its minute not left to the suite's end.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray-cluster")]

ROOT = Path(__file__).resolve().parents[2]
DDP = Config(parallel="ddp", world_size=2)
#: The burst's own processes on a node: its ranks' actors and its event queue's (Ray names a process by its actor).
BURST_PROCESS_MARKS = ("ray::RankActor", "ray::_QueueActor")
GONE_WITHIN_S = 5.0
#: A node without the daemons a test does not use (the dashboard, the log monitor; on the head, the autoscaler's
#: monitor): each is a Python process importing Ray, 6-10 s of this machine's two cores at the cluster's start.
LEAN_NODE = {"include_dashboard": False, "include_log_monitor": False}


def _cluster_processes() -> list[psutil.Process]:
    """Every process the test session runs below itself: the cluster's daemons, its workers and the bursts' actors."""
    return psutil.Process().children(recursive=True)


def _command(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(process.cmdline())
    return ""


def _burst_processes() -> list[psutil.Process]:
    return [p for p in _cluster_processes() if _command(p).startswith(BURST_PROCESS_MARKS)]


def _infrastructure() -> set[int]:
    """The cluster's own processes (daemons, agents, idle workers), which the leak check allows during the module."""
    return {p.pid for p in _cluster_processes() if ((command := _command(p)).startswith("ray::") or "/ray/" in command)
            and not command.startswith(BURST_PROCESS_MARKS)}


@pytest.fixture(scope="module")
def cluster() -> Iterator[cluster_utils.Cluster]:
    """Two nodes of one CPU each, everything on 127.0.0.1: Ray otherwise takes the machine's outward address for
    its own (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps it on loopback: read by each process of the cluster as it
    imports Ray, and by this one, which has, through the constant it was read into), and the leak check treats the
    cluster's own processes as infrastructure until it is shut down, then finds none of them left. Its files live in
    a short dir of /tmp (``RAY_TMPDIR``): a session's AF_UNIX sockets lie four levels below, and such a path must stay
    under 108 bytes, which the tests' own nested temp dir under pytest-xdist would not."""
    constants = ray._private.ray_constants
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    outward, constants.ENABLE_RAY_CLUSTER = constants.ENABLE_RAY_CLUSTER, False
    root = tempfile.mkdtemp(prefix="awr-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = root
    started = cluster_utils.Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", **LEAN_NODE, "no_monitor": True})
    started.add_node(num_cpus=1, node_ip_address="127.0.0.1", **LEAN_NODE)
    ray.init(address=started.address, log_to_driver=False)
    conftest.MODULE_INFRASTRUCTURE.append(_infrastructure)
    try:
        yield started
    finally:
        conftest.MODULE_INFRASTRUCTURE.remove(_infrastructure)
        ray.shutdown()
        started.shutdown()
        os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        os.environ.pop("RAY_TMPDIR", None)
        constants.ENABLE_RAY_CLUSTER = outward
        session = conftest.infrastructure_pids()  # the session's forkserver and resource tracker stay
        ours = [p for p in _cluster_processes() if p.pid not in session]
        left = [_command(p) for p in psutil.wait_procs(ours, timeout=GONE_WITHIN_S)[1]]
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"the cluster left processes behind: {left}"


def _options(cluster: cluster_utils.Cluster, **settings: float | str) -> BurstOptions:
    return BurstOptions(device=cpu_device(), timeout_s=60, cluster=RayCluster(
        address=cluster.address, placement="STRICT_SPREAD", timeout_s=30, **settings))


def _raylet(node: object) -> psutil.Process:
    return psutil.Process(node.all_processes[ray._private.ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)


def _pin(node: object, cores: set[int]) -> None:
    """The node's raylet and everything below it on ``cores``; workers it starts later inherit them."""
    raylet = _raylet(node)
    for process in [raylet, *raylet.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            process.cpu_affinity(sorted(cores))


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (ip.ipv4_mapped or ip).is_loopback if isinstance(ip, ipaddress.IPv6Address) else ip.is_loopback


class _Slowed:
    """Once the ranks step, ``node`` shares core 1 with a CPU hog and every other node has core 0 to itself: started
    then, since a node pinned beside a hog would take most of the burst's time starting its actor."""

    def __init__(self, node: object, others: list[object]) -> None:
        self.node, self.others = node, others
        self.hog: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.hog is not None:
            return
        self.hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        psutil.Process(self.hog.pid).cpu_affinity([1])
        _pin(self.node, {1})
        for other in self.others:
            _pin(other, {0})

    def end(self) -> None:
        if self.hog is not None:
            self.hog.kill()
            self.hog.wait()
        for each in (self.node, *self.others):
            _pin(each, set(range(psutil.cpu_count())))


def _gone(processes: Callable[[], list[psutil.Process]]) -> list[str]:
    """Commands of ``processes()`` still running after ``GONE_WITHIN_S``."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [_command(p) for p in left]


@pytest.mark.skipif(psutil.cpu_count() < 2, reason="slowing one node needs a core of its own for it")
def test_ddp_ranks_on_two_nodes_train_as_locally_on_one_clock_and_name_the_straggler(cluster):
    """One rank per node; rank 0's losses equal the same burst's run locally; both nodes' telemetry on the driver's
    clock; the node sharing its core with a hog is named as the straggler; nothing listens beyond 127.0.0.1."""
    listening: list[set[str]] = []
    slow = next(iter(cluster.worker_nodes))
    slowed = _Slowed(slow, [cluster.head_node])

    servers: list[str] = []

    def on_event(event: object) -> None:
        if isinstance(event, BurstPhase) and event.phase == "step":
            slowed.start()
        if isinstance(event, StepRecord) and not event.warmup and event.rank == 0 and not listening:
            processes = _cluster_processes()
            listening.append(listening_addresses([psutil.Process(), *processes]))
            servers.extend(_command(p) for p in processes if p.pid not in conftest.infrastructure_pids()
                           and "multiprocessing.forkserver" in _command(p))

    try:
        result = run_burst(tiny_workload(), DDP, steps=60, on_event=on_event, options=_options(cluster))
    finally:
        slowed.end()
    local = run_burst(tiny_workload(), DDP, steps=60, options=BurstOptions(device=cpu_device()))

    assert result.ok, result.error
    nodes = {summary.rank: summary.node for summary in result.ranks}
    assert len(set(nodes.values())) == 2 and set(nodes.values()) == {cluster.head_node.node_id, slow.node_id}
    assert [s.loss for s in result.measured_steps(rank=0)] == [s.loss for s in local.measured_steps(rank=0)]
    window = (min(s.t - s.total_s for s in result.measured_steps()), max(s.t for s in result.measured_steps()))
    for node in nodes.values():
        times = [s.t for s in result.telemetry if s.node == node]
        assert times and all(0 < t < result.wall_s for t in times), (node, times, result.wall_s)
        assert any(window[0] - 0.25 <= t <= window[1] + 0.25 for t in times), (node, times, window)
    found = straggler(result)
    assert found is not None and found.node == slow.node_id and found.ratio > 1.25, found
    assert any(f.title == "Straggler" and f"rank {found.rank} on node {slow.node_id[:12]}" in f.detail
               for f in diagnose(result)), [f.detail for f in diagnose(result)]
    assert listening and all(_loopback(address) for address in listening[0]), listening
    assert not servers, f"a rank's actor started a burst forkserver of its own: {servers}"
    assert f"rank 0 on {nodes[0][:12]}, rank 1 on {nodes[1][:12]}" in summary(result)


def test_stop_leaves_nothing_of_the_burst_on_either_node(cluster):
    stop = threading.Event()

    def on_event(event: object) -> None:
        if isinstance(event, StepRecord) and not event.warmup:
            stop.set()

    result = run_burst(tiny_workload(), DDP, steps=100_000, on_event=on_event, stop=stop, options=_options(cluster))
    assert result.status == "stopped" and result.measured_steps()
    assert not _gone(_burst_processes)


def test_a_rank_killed_ends_the_burst_named_and_leaves_nothing(cluster):
    killed: list[int] = []

    def on_event(event: object) -> None:
        if isinstance(event, StepRecord) and not event.warmup and not killed:
            victim = next(p for p in _burst_processes() if _command(p).startswith("ray::RankActor"))
            killed.append(victim.pid)
            victim.send_signal(signal.SIGKILL)

    with pytest.raises(WorkerCrashed, match="was lost") as info:
        run_burst(tiny_workload(), DDP, steps=100_000, on_event=on_event, options=_options(cluster))
    assert info.value.result.status == "failed" and killed
    assert not _gone(_burst_processes)


DRIVER = textwrap.dedent("""
    import sys
    import ray
    from accel_widgets import BurstOptions, Config, RayCluster, StepRecord, run_burst
    from tests.devices import cpu_device
    from tests.workloads import tiny_workload

    ray.init(address=sys.argv[1], log_to_driver=False)

    def on_event(event):
        if isinstance(event, StepRecord) and not event.warmup:
            print("stepping", flush=True)

    run_burst(tiny_workload(), Config(parallel="ddp", world_size=2), steps=100_000, on_event=on_event,
              options=BurstOptions(device=cpu_device(), cluster=RayCluster(address=sys.argv[1],
                                                                           placement="STRICT_SPREAD")))
""")


def test_a_driver_killed_leaves_nothing_of_its_burst(cluster):
    """Ray ends the actors and the placement group of a driver that dies: they are not detached."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, cluster.address], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env={**os.environ, "ACCEL_WIDGETS_PRESTART": "0"})
    try:
        deadline, said = time.monotonic() + 45, ""
        while time.monotonic() < deadline and said not in ("stepping", "nothing more: it ended"):
            if select.select([driver.stdout], [], [], 0.5)[0]:
                said = driver.stdout.readline().strip() or "nothing more: it ended"
        assert said == "stepping", f"the driver's burst never stepped ({said or 'it said nothing'})"
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    finally:
        driver.kill()
        driver.wait()
        driver.stdout.close()
    assert not _gone(_burst_processes)
    placed = [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    assert not placed, placed


def test_a_cluster_is_checked_before_anything_starts():
    with pytest.raises(BurstRequestError, match="placement='BEST'"):
        RayCluster(placement="BEST")
    with pytest.raises(BurstRequestError, match="address='nowhere'"):
        RayCluster(address="nowhere")
    with pytest.raises(BurstRequestError, match="cpus_per_rank=0"):
        RayCluster(cpus_per_rank=0)
    with pytest.raises(BurstRequestError, match="isolation='inprocess'"):
        BurstOptions(isolation="inprocess", cluster=RayCluster())
    with pytest.raises(BurstRequestError, match="a held burst keeps its ranks on this machine"):
        HeldBurst(tiny_workload(), DDP, steps=1, options=BurstOptions(cluster=RayCluster()))
