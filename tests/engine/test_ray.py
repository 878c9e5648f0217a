"""Bursts on a Ray cluster: two nodes of one CPU each on loopback (:mod:`tests.ray_cluster`, started once per session),
a DDP x 2 burst with one rank per node, and every way it can end leaving nothing on either node.

Skipped where Ray is not installed (``pip install 'accel-widgets[ray]'``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cloudpickle
import psutil
import pytest

from accel_widgets import (
    BurstOptions,
    BurstPhase,
    BurstRequestError,
    BurstTimeout,
    Config,
    RayCluster,
    StepRecord,
    WorkerCrashed,
    diagnose,
    run_burst,
    summary,
)
from accel_widgets.analysis.compare import straggler
from accel_widgets.engine.events import RankFailed
from accel_widgets.engine.held import HeldBurst
from accel_widgets.engine.ranks import Collected
from accel_widgets.views.timeline import timeline
from tests import conftest
from tests.devices import cpu_device
from tests.engine.test_ddp import listening_addresses
from tests.engine.test_telemetry import FakeNvml
from tests.ray_cluster import LEAN_NODE, burst_processes, cluster_processes, command_of, gone
from tests.workloads import tiny_workload

ray = pytest.importorskip("ray")

#: One pytest-xdist worker runs the tests on the cluster (``--dist loadgroup``): it starts the cluster once, not once
#: per worker, and early, its minute not left to the suite's end.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray-cluster")]

ROOT = Path(__file__).resolve().parents[2]
DDP = Config(parallel="ddp", world_size=2)
#: The rendezvous test's cluster timeout, set once the actors have started (each wait of the set-up gets the whole
#: RayCluster.timeout_s, and two actors need 11 s of it beside three CPU hogs here): the rendezvous waits it out.
RENDEZVOUS_TIMEOUT_S = 4


def _options(ray_cluster: Any, **settings: float | str) -> BurstOptions:
    return BurstOptions(device=cpu_device(), timeout_s=120, cluster=RayCluster(
        address=ray_cluster.address, placement="STRICT_SPREAD", **{"timeout_s": 90, **settings}))


def _processes_of(node: object) -> list[psutil.Process]:
    """The node's raylet and everything below it."""
    raylet = psutil.Process(node.all_processes[ray._private.ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)
    return [raylet, *raylet.children(recursive=True)]


def _each_thread(process: psutil.Process, change: Callable[[int], object]) -> None:
    """``change`` applied to every thread of ``process``: Linux keeps a CPU affinity and a nice value per thread, and a
    change to a process id reaches its first thread only."""
    for thread in process.threads():
        with contextlib.suppress(OSError):
            change(thread.id)


def _pin(node: object, cores: set[int]) -> None:
    """Every thread of the node's processes on ``cores``; threads and workers started later inherit them."""
    for process in _processes_of(node):
        with contextlib.suppress(psutil.Error):
            _each_thread(process, lambda tid: os.sched_setaffinity(tid, cores))


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (ip.ipv4_mapped or ip).is_loopback if isinstance(ip, ipaddress.IPv6Address) else ip.is_loopback


class _Slowed:
    """Once the ranks set up, ``node``'s rank shares core 1 with a CPU hog that has the higher priority, as a node busy
    with other work, and every other node has core 0 to itself; it runs ``alone``, as a user's cluster would.

    When: before, the node would start its actor beside the hog (90-100 s of a two-core machine); once the ranks step,
    the word reaches the driver a pump tick later, after a window of 60 one-millisecond steps had ended unslowed
    (1.08x). How much: beside hogs of its own priority a rank is woken first at every collective and reads 1.08-1.21x
    with one hog, 1.17-1.54x with two; a rank niced below one hog reads 2.2-3.1x at 5, 4.0-4.3x at 7 (18 s), 7.4-8.2x
    at 10 (23 s). Under a loaded suite other tests
    on both cores spread the hog's cost over both ranks (1.07x): hence ``alone``."""

    RANK_NICE = 7

    def __init__(self, node: object, others: list[object]) -> None:
        self.node, self.others = node, others
        self.hog: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.hog is not None:
            return
        self.hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(self.hog.pid, {1})
        _pin(self.node, {1})
        for other in self.others:
            _pin(other, {0})
        for rank in set(_processes_of(self.node)) & set(burst_processes()):
            with contextlib.suppress(psutil.Error):
                _each_thread(rank, lambda tid: os.setpriority(os.PRIO_PROCESS, tid, self.RANK_NICE))

    def end(self) -> None:
        if self.hog is not None:
            self.hog.kill()
            self.hog.wait()
        for each in (self.node, *self.others):
            _pin(each, set(range(psutil.cpu_count())))


@pytest.mark.skipif(psutil.cpu_count() < 2, reason="slowing one node needs a core of its own for it")
def test_ddp_ranks_on_two_nodes_train_as_locally_on_one_clock_and_name_the_straggler(ray_cluster, alone):
    """One rank per node; rank 0's losses equal the same burst's run locally; both nodes' telemetry on the driver's
    clock; the node sharing its core with a hog is named as the straggler; nothing listens beyond 127.0.0.1."""
    listening: list[set[str]] = []
    slow = next(iter(ray_cluster.worker_nodes))
    slowed = _Slowed(slow, [ray_cluster.head_node])

    servers: list[str] = []

    def on_event(event: object) -> None:
        if isinstance(event, BurstPhase) and event.phase == "setup":
            slowed.start()
        if isinstance(event, StepRecord) and not event.warmup and event.rank == 0 and not listening:
            processes = cluster_processes()
            listening.append(listening_addresses([psutil.Process(), *processes]))
            servers.extend(command_of(p) for p in processes if p.pid not in conftest.infrastructure_pids()
                           and "multiprocessing.forkserver" in command_of(p))

    try:
        with alone():
            result = run_burst(tiny_workload(), DDP, steps=60, on_event=on_event, options=_options(ray_cluster))
    finally:
        slowed.end()
    local = run_burst(tiny_workload(), DDP, steps=60, options=BurstOptions(device=cpu_device()))

    assert result.ok, result.error
    nodes = {summary.rank: summary.node for summary in result.ranks}
    assert len(set(nodes.values())) == 2 and set(nodes.values()) == {ray_cluster.head_node.node_id, slow.node_id}
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
    assert {s.device for s in result.telemetry} == {f"cpu on {node[:12]}" for node in nodes.values()}
    lines = [trace.meta["device"] for trace in timeline([result], ["on two nodes"]).data
             if trace.meta.get("kind") == "util"]
    assert sorted(lines) == sorted(f"cpu on {node[:12]}" for node in nodes.values())  # a line a node, not one zigzag


def test_stop_leaves_nothing_of_the_burst_on_either_node(ray_cluster):
    """Stopped once stepping, with the ranks at the priority a local rank has, not at the nice 15 of Ray's workers."""
    stop = threading.Event()
    niceness: list[int] = []

    def on_event(event: object) -> None:
        if isinstance(event, StepRecord) and not event.warmup and not stop.is_set():
            niceness.extend(os.getpriority(os.PRIO_PROCESS, rank.pid) for rank in burst_processes()
                            if command_of(rank).startswith("ray::RankActor"))
            stop.set()

    result = run_burst(tiny_workload(), DDP, steps=100_000, on_event=on_event, stop=stop, options=_options(ray_cluster))
    assert result.status == "stopped" and result.measured_steps()
    assert niceness == [0, 0], niceness
    assert not gone(burst_processes)


def test_a_rank_killed_ends_the_burst_named_and_leaves_nothing(ray_cluster):
    killed: list[int] = []

    def on_event(event: object) -> None:
        if isinstance(event, StepRecord) and not event.warmup and not killed:
            victim = next(p for p in burst_processes() if command_of(p).startswith("ray::RankActor"))
            killed.append(victim.pid)
            victim.send_signal(signal.SIGKILL)

    with pytest.raises(WorkerCrashed, match="was lost") as info:
        run_burst(tiny_workload(), DDP, steps=100_000, on_event=on_event, options=_options(ray_cluster))
    assert info.value.result.status == "failed" and killed
    assert not gone(burst_processes)


#: The burst's timeout in the frozen-rank test: a DDP collective gives up after half of it (10 s), and the freeze, that
#: wait and the 3 s to settle fit in it because it counts from when the ranks are seated: the set-up (5.5 s here
#: idle, 15 s and more in a loaded suite) has bounds of its own (at 36 s from the call a loaded suite once ran out of it
#: before the collective timed out).
FROZEN_BURST_TIMEOUT_S = 20


def test_a_rank_that_freezes_mid_burst_is_named_once_its_peers_collective_times_out(ray_cluster):
    """A rank's process stopped mid-burst (SIGSTOP), as a node that freezes or is cut off: no connection breaks, Ray
    calls nothing dead for a minute, and the other rank waits in its all-reduce until the collective timeout. The
    burst then names the silent rank and its node, not the rank that timed out, and leaves nothing behind."""
    frozen: list[psutil.Process] = []

    def on_event(event: object) -> None:
        if isinstance(event, StepRecord) and not event.warmup and not frozen:
            frozen.append(next(p for p in burst_processes() if command_of(p).startswith("ray::RankActor")))
            frozen[0].send_signal(signal.SIGSTOP)

    try:
        with pytest.raises(WorkerCrashed, match=r"rank (\d) on node (\w{12}) \(127.0.0.1\) stopped answering") as info:
            run_burst(tiny_workload(), DDP, steps=100_000, on_event=on_event, options=BurstOptions(
                device=cpu_device(), timeout_s=FROZEN_BURST_TIMEOUT_S, cluster=RayCluster(
                    address=ray_cluster.address, placement="STRICT_SPREAD", timeout_s=90)))
    finally:
        for process in frozen:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGCONT)
    node = next(node for node in (ray_cluster.head_node, *ray_cluster.worker_nodes)
                if frozen[0].pid in {p.pid for p in _processes_of(node)})
    assert f"on node {node.node_id[:12]} (127.0.0.1) stopped answering" in str(info.value)
    assert "waited past the process group's timeout" not in str(info.value).splitlines()[0]
    assert not gone(burst_processes)


def test_the_one_rank_its_peers_lost_is_named_before_ray_says(monkeypatch):
    """Ray calls a node dead once its health checks give up (14 s here) while its rank's peers lost their connections
    to it within a second (or, with no reset sent, waited past the collective timeout): with Ray silent that long, the
    one rank that said nothing is named after ``SETTLE_S``. Two
    silent ranks cannot be told from one hung in a collective (none is named); an error of a rank's own ends the
    burst at once."""
    from accel_widgets.engine import cluster

    monkeypatch.setattr(cluster, "SETTLE_S", 0.3)
    monkeypatch.setattr(cluster.ray, "wait", lambda refs, num_returns, timeout: (time.sleep(timeout), ([], refs))[1])
    spec = SimpleNamespace(request=SimpleNamespace(options=BurstOptions(cluster=RayCluster())), plan=SimpleNamespace(
        ranks=3))
    broke = RankFailed(0, 1.0, "exception", "RuntimeError: [pair.cc:537] Read error [10.0.0.2]:48280: Connection "
                                            "reset by peer", "")

    def ended(pending: dict[str, int], first: RankFailed) -> tuple[dict[int, str], float]:
        ranks = cluster.ClusterRanks(spec)
        ranks.placed = [cluster.Placed(f"{r}" * 16, f"10.0.0.{r}", 100 + r) for r in range(3)]
        ranks.events = SimpleNamespace(qsize=lambda: 0)
        collected, began = Collected(errors=[first]), time.monotonic()
        ranks._name_the_vanished(pending, [1, None, None], collected, None)
        return collected.lost, time.monotonic() - began

    lost, waited = ended({"rank 2's run": 2}, broke)
    assert lost == {2: "rank 2 on node 222222222222 (10.0.0.2) was lost: the other ranks' connections to it broke and "
                       "it said nothing (its process or its node went away)"} and waited >= 0.3
    assert ended({"rank 1's run": 1, "rank 2's run": 2}, broke)[0] == {}
    lost, waited = ended({"rank 2's run": 2}, RankFailed(0, 1.0, "exception", "ValueError: bad batch", ""))
    assert lost == {} and waited < 0.1
    timed_out = RankFailed(0, 1.0, "exception", "RuntimeError: [unbound_buffer.cc:78] Timed out waiting 60000ms for "
                                                "recv operation to complete", "")
    assert ended({"rank 2's run": 2}, timed_out)[0] == {2: "rank 2 on node 222222222222 (10.0.0.2) stopped answering: "
                                                           "the other ranks waited for it past the collective timeout "
                                                           "and it said nothing (its process hangs, or its node froze "
                                                           "or was cut off from theirs)"}

def test_a_nodes_ranks_gpus_are_sampled_through_nvml_by_what_ray_gave_each_rank(monkeypatch):
    """The node's first rank samples every GPU of the node's ranks, by the UUID each actor saw under Ray's
    CUDA_VISIBLE_DEVICES, each named by its rank's local rank and its node (two nodes' ``cuda:0`` are two lines)."""
    from accel_widgets.engine import cluster

    node = "f00d" * 14
    mates = [cluster.Placed(node, "10.0.0.1", 11, ("GPU-c", "GPU-d")), cluster.Placed(node, "10.0.0.1", 12, ()),
             cluster.Placed(node, "10.0.0.1", 13, ("GPU-a",))]
    gpus = cluster.node_gpus(mates)
    assert gpus == [(0, "GPU-c"), (2, "GPU-a")]  # a rank's first GPU is the one it trains on; a CPU rank has none
    assert cluster.node_gpus([*mates, cluster.Placed(node, "10.0.0.1", 14, ("GPU-a",))]) == gpus  # half a GPU each
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(device_count=4, uuids=("GPU-a", "GPU-b", "GPU-c", "GPU-d")))
    sent: list[bytes] = []
    events = SimpleNamespace(actor=SimpleNamespace(put_nowait=SimpleNamespace(remote=sent.append)))
    sampler = cluster._node_sampler(time.perf_counter(), node, events, [os.getpid()], gpus)
    deadline = time.monotonic() + 10
    while len(sent) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    samples = [cloudpickle.loads(message) for message in sent]
    assert {s.source for s in samples} == {"nvml"} and {s.node for s in samples} == {node}
    memory = {s.device: s.mem_used_bytes for s in samples}
    assert memory == {"cuda:0 on f00df00df00d": 3 * 2**20, "cuda:2 on f00df00df00d": 1 * 2**20}  # handles 2 and 0


def test_a_nodes_sampler_counts_every_rank_on_its_machine_as_the_bursts_own_load():
    """Ray nodes on one host (this test cluster; containers of one machine) share its cores: each node's sampler
    watches every rank whose pids it can read, so the other node's rank is not "other load" that drops every block
    of a comparison (0 of 2 blocks counted on this cluster before, 2 of 2 after). Ranks on other machines, or in
    another pid namespace of this one, are never watched by pid."""
    from accel_widgets.engine import cluster

    ranks = cluster.ClusterRanks(SimpleNamespace(request=SimpleNamespace(options=BurstOptions(cluster=RayCluster())),
                                                 plan=SimpleNamespace(ranks=4)))
    ranks.placed = [cluster.Placed("a" * 56, "127.0.0.1", 10, pids_of="boot/1"),
                    cluster.Placed("b" * 56, "127.0.0.1", 11, pids_of="boot/1"),
                    cluster.Placed("c" * 56, "127.0.0.1", 12, pids_of="boot/2"),  # a container on the same host
                    cluster.Placed("d" * 56, "10.0.0.4", 13, pids_of="other-boot/1")]
    assert [ranks._sharing_cores(rank) for rank in range(4)] == [[0, 1], [0, 1], [2], [3]]
    ranks.placed = [cluster.Placed("a" * 56, "10.0.0.1", 10), cluster.Placed("a" * 56, "10.0.0.1", 11),
                    cluster.Placed("b" * 56, "10.0.0.2", 12)]  # where the kernel did not say: a node's own ranks
    assert [ranks._sharing_cores(rank) for rank in range(3)] == [[0, 1], [0, 1], [2]]


def test_ranks_the_cluster_has_no_room_for_end_the_burst_within_its_timeout(ray_cluster):
    """Three ranks, one per node, on two nodes: the wait for their places ends at the cluster's timeout, named."""
    began = time.monotonic()
    with pytest.raises(BurstTimeout, match="found no room for 3 bundles"):
        run_burst(tiny_workload(), Config(parallel="ddp", world_size=3), steps=5, options=BurstOptions(
            device=cpu_device(), cluster=RayCluster(address=ray_cluster.address, placement="STRICT_SPREAD",
                                                    timeout_s=2)))
    assert time.monotonic() - began < 10
    assert not [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    assert not gone(burst_processes)


def test_a_rendezvous_a_node_does_not_reach_in_time_ends_the_burst_naming_it(ray_cluster, monkeypatch):
    """Rank 1's node hangs once its rank is placed (its actor stopped, as a node that freezes): the rendezvous waits
    out the cluster's timeout (a short one, set once the actors have started), then ends the burst naming rank 1 and
    its node, and leaves nothing behind."""
    from accel_widgets.engine.cluster import ClusterRanks  # imports Ray, which this module skips without

    frozen: list[int] = []
    rendezvous = ClusterRanks._rendezvous

    def with_rank_1_frozen(ranks: ClusterRanks) -> tuple[str, int]:
        frozen.append(ranks.placed[1].pid)
        os.kill(frozen[0], signal.SIGSTOP)
        ranks.cluster = dataclasses.replace(ranks.cluster, timeout_s=RENDEZVOUS_TIMEOUT_S)
        return rendezvous(ranks)

    monkeypatch.setattr(ClusterRanks, "_rendezvous", with_rank_1_frozen)
    try:
        with pytest.raises(BurstTimeout, match=rf"rank 1 on node \w{{12}} \(127.0.0.1\) did not reach the "
                           rf"rendezvous store at \S+ within {RENDEZVOUS_TIMEOUT_S} s"):
            run_burst(tiny_workload(), DDP, steps=5, options=_options(ray_cluster))
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert frozen and not gone(burst_processes)

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


def test_a_driver_killed_leaves_nothing_of_its_burst(ray_cluster):
    """Ray ends the actors and the placement group of a driver that dies: they are not detached."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, ray_cluster.address], cwd=ROOT, stdout=subprocess.PIPE,
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
    assert not gone(burst_processes)
    placed = [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    assert not placed, placed


def test_a_node_lost_ends_the_burst_naming_it_and_leaves_nothing_on_the_others(ray_cluster):
    """A third node takes one of three ranks and goes away mid-burst (its raylet and workers SIGKILLed at once): the
    burst ends naming that rank and node within seconds, not when Ray's health checks call the node dead (14 s
    here), and nothing of it is left on the two nodes that stay."""
    doomed = ray_cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", **LEAN_NODE)
    lost: list[float] = []

    def on_event(event: object) -> None:
        if isinstance(event, StepRecord) and not event.warmup and not lost:
            lost.append(time.monotonic())
            ray_cluster.remove_node(doomed, allow_graceful=False)

    named = rf"rank \d on node {doomed.node_id[:12]} \(127.0.0.1\) was lost"
    try:
        with pytest.raises(WorkerCrashed, match=named) as info:
            run_burst(tiny_workload(), Config(parallel="ddp", world_size=3), steps=100_000, on_event=on_event,
                      options=_options(ray_cluster))
    finally:
        if not lost:
            ray_cluster.remove_node(doomed, allow_graceful=False)
    assert info.value.result.status == "failed"
    assert not gone(burst_processes)


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
