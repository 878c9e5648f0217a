"""A burst whose ranks run on a Ray cluster: one non-detached actor per rank, placed by a placement group.

``run_burst(..., options=BurstOptions(cluster=RayCluster(...)))`` runs its ranks here (:class:`ClusterRanks`). Ray is an
optional dependency: this module is imported only for a cluster burst, so ``import accel_widgets`` never imports Ray.

Each rank is an actor in its own bundle of a placement group (its CPUs and GPUs) and runs the very code a local rank
runs (:func:`~accel_widgets.engine.worker.rank_main`) on the workload's bytes, which travel by value as they do to a
local rank; only what differs between machines is the seat's (:class:`~accel_widgets.engine.worker.Seat`): the
torchrun variables, the node's own environment, dirs and clock, and the store the ranks meet at. That store is a
``TCPStore`` on rank 0's node, listening on the node's own address at a port that node chose (a socket bound there,
handed to the store), never on every interface. Before any rank trains every other rank connects to it: an endpoint
a node cannot reach ends the burst with that named, instead of a rendezvous that waits out its timeout (and an
endpoint on loopback is refused outright when the ranks are on several machines).

Events stream back live through a Ray queue (an actor on the driver's node): step batches as a local rank sends them,
each phase change, and per node a telemetry sample five times a second (the sampler runs in the node's first rank:
the GPUs Ray gave that node's ranks through NVML, found by the UUIDs each actor saw, else the CPU and memory of its
ranks; each device named with its node). Every node's clock offset to the driver is measured before the burst (the
round trip with the least delay of a few) and applied on the node: steps and samples arrive on the driver's clock.

Nothing outlives the burst: teardown kills every actor and removes the placement group whatever happened (Stop, a
failure, an interrupt), and Ray itself ends the actors and the group of a driver that dies, since they are not
detached.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import cloudpickle
import ray
import torch.distributed as dist
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from ..data.cache import cache_root
from ..inputs.device import probe_device
from ..results.burst import BurstPhase, TelemetrySample
from .events import Phase, RankDone, WorkerEvent
from .group import Rendezvous
from .outcome import Unseated
from .process import RankSeat, inductor_cache_dir
from .ranks import BURST_DIR_PREFIX, PUMP_TICK_S, Collected, Event, remove_orphaned_burst_dirs
from .telemetry import TelemetrySampler
from .worker import BurstSpec, Seat, rank_main

#: Round trips to a node that its clock offset is measured from: the one with the least delay bounds the error best.
CLOCK_PROBES = 5
#: A rank's actor runs at the priority a torchrun rank or a local rank has, not at the nice 15 Ray gives its workers
#: (``worker_niceness``): beside any other work on its node, a niced rank measures a slower job than the exported one
#: runs. Ray's job supervisor is started the same way. Beside three CPU hogs on this host's two cores, two rank actors
#: started in 11 s at nice 0 and in 80-87 s at nice 15 (2.6 s vs 4.2 s on an idle host, the idle workers Ray
#: prestarts at nice 15 no longer reusable).
RANK_ENVIRONMENT = {"env_vars": {"RAY_worker_niceness": "0"}}
#: Once a rank has ended, how long its last events get to arrive through the queue before its end is judged.
LAST_EVENTS_S = 0.5
#: Once every failure so far is a lost peer (a broken connection, a collective that timed out), how long the ranks
#: still running get to end before the one that said nothing is named: Ray calls a lost node dead only when its health
#: checks give up (14 s here, 65 s for a node that froze), while its peers' connections to it broke within a second.
SETTLE_S = 3.0
#: How long teardown waits for killed actors to be gone before it returns.
TEARDOWN_GRACE_S = 5.0


@dataclass(frozen=True)
class Placed:
    """Where a rank's actor runs: its node (Ray's id), the node's address, the actor's process, and what NVML finds
    each GPU Ray gave it by (:attr:`~accel_widgets.inputs.device.GpuInfo.nvml_key`), in its CUDA ordinal order."""

    node: str
    address: str
    pid: int
    gpus: tuple[int | str, ...] = ()
    # Whose process ids ``pid`` is one of: the kernel's boot and the pid namespace. Ranks that share it share a
    # machine's cores (several Ray nodes on one host) and can watch each other's processes.
    pids_of: str = ""


@dataclass(frozen=True)
class PhaseEntered:
    """A cluster rank entered ``phase`` at ``t`` (the driver's clock): sent when its public name changes, so the live
    view hears of setup, stepping and finishing without a message per step."""

    rank: int
    t: float
    phase: Phase


class RankActor:
    """One rank's process on a cluster node: it says where it is and what time it is there, opens or joins the
    burst's rendezvous store, and runs the rank (:meth:`run`), as a local rank process does."""

    def __init__(self) -> None:
        self._store: dist.TCPStore | None = None
        self._listener: socket.socket | None = None

    def where(self) -> Placed:
        return Placed(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid(),
                      tuple(gpu.nvml_key for gpu in probe_device().gpus), _pids_of())

    def clock(self) -> float:
        return time.perf_counter()

    def open_store(self, world_size: int, timeout_s: float) -> tuple[str, int]:
        """Rank 0: the group's store on this node's address, at a port the node chooses; returns the endpoint."""
        address = ray.util.get_node_ip_address()
        self._listener = socket.create_server((address, 0))
        self._store = dist.TCPStore(address, self._listener.getsockname()[1], world_size, is_master=True,
                                    timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
                                    master_listen_fd=self._listener.fileno())
        return address, self._listener.getsockname()[1]

    def join_store(self, endpoint: tuple[str, int], world_size: int, timeout_s: float) -> None:
        """Every other rank: connect to rank 0's store now, so that an endpoint this node cannot reach is found
        before anything trains."""
        self._store = dist.TCPStore(endpoint[0], endpoint[1], world_size, is_master=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))

    def run(self, rank: int, payload: bytes, place: RankSeat, clock_origin: float, events: Queue,
            watched: list[int], gpus: list[tuple[int, int | str]]) -> None:
        """Run the rank as a local one runs (:func:`~accel_widgets.engine.worker.rank_main`), its events into
        ``events``; ``watched`` and ``gpus``: the rank processes on its machine and the node's GPUs this rank samples
        (the node's first rank samples them all, the others nothing). The rank's temp dir on this node goes with it."""
        node = ray.get_runtime_context().get_node_id()
        remove_orphaned_burst_dirs()  # those of this node's ranks that were killed before they could remove theirs
        temp_dir = tempfile.mkdtemp(prefix=f"{BURST_DIR_PREFIX}{os.getpid()}-")
        cache_dir = str(cache_root())
        # gloo's and NCCL's own sockets on this node's address, where its peers reach it
        rendezvous = Rendezvous(self._store, ray.util.get_node_ip_address()) if self._store is not None else None
        seat = Seat(place, clock_origin, rendezvous, temp_dir, cache_dir, inductor_cache_dir(cache_dir))
        sampler = _node_sampler(clock_origin, node, events, watched, gpus)
        try:
            rank_main(rank, payload, _sender(events), _PhaseMarks(rank, clock_origin, events), seat=seat)
        finally:
            if sampler is not None:
                sampler.stop()
            ray.get(events.actor.qsize.remote())  # every event this rank sent is in the queue before it returns
            shutil.rmtree(temp_dir, ignore_errors=True)


def _pids_of() -> str:
    """This process's kernel boot and pid namespace: two processes that give the same can read each other's pids."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _sender(events: Queue) -> Callable[[Any], None]:
    """How a rank sends an event: pickled here and put without waiting (calls from one process reach the queue in
    order). Bytes, so that the queue's actor never imports what they hold (torch, this package): it only keeps them."""
    return lambda event: events.actor.put_nowait.remote(cloudpickle.dumps(event))


class _PhaseMarks:
    """A cluster rank's phases, sent to the driver when their public name changes (data and step alternate every
    step and read the same there)."""

    def __init__(self, rank: int, clock_origin: float, events: Queue) -> None:
        self._rank, self._origin, self._events = rank, clock_origin, events
        self._last: str | None = None

    def __call__(self, phase: Phase) -> None:
        if phase.public_name != self._last:
            self._last = phase.public_name
            _sender(self._events)(PhaseEntered(self._rank, time.perf_counter() - self._origin, phase))


def _node_sampler(clock_origin: float, node: str, events: Queue, watched: list[int],
                  gpus: list[tuple[int, int | str]]) -> TelemetrySampler | None:
    """The node's telemetry, sampled in its first rank on the driver's clock: its ranks' GPUs through NVML, else the
    CPU and memory of the ranks on its machine (the burst's own load there, whichever Ray node runs them); each
    sample names its node, in its device's name too (two nodes' ``cuda:0`` are two devices). Its "caller" is the
    node's raylet, which started the ranks."""
    if not watched:
        return None
    send = _sender(events)
    sampler = TelemetrySampler(clock_origin=clock_origin, caller_pid=os.getppid(), gpus=gpus, on_sample=lambda sample:
                               send(replace(sample, node=node, device=f"{sample.device} on {node[:12]}")))
    for pid in watched:
        sampler.watch(pid)
    sampler.start()
    return sampler


def node_gpus(mates: list[Placed]) -> list[tuple[int, int | str]]:
    """The GPUs one node's ranks train on, as its telemetry samples them: each rank's first GPU (its ``cuda:0``, as Ray
    shows the actor only its own), numbered by the rank's local rank, as torchrun's ``LOCAL_RANK`` numbers its
    device (:class:`~accel_widgets.engine.telemetry.TelemetrySampler`'s ``gpus``). Ranks sharing a GPU (a fraction
    of one each) sample it once, under the first one's number."""
    first: dict[int | str, int] = {}
    for local_rank, placed in enumerate(mates):
        if placed.gpus:
            first.setdefault(placed.gpus[0], local_rank)
    return [(local_rank, gpu) for gpu, local_rank in first.items()]


class ClusterRanks:
    """One cluster burst's actors with everything around them: the placement group, the event queue, where each rank
    landed and each node's clock offset; the launcher drives it as it drives a local
    :class:`~accel_widgets.engine.ranks.RankGroup`. :meth:`start` seats the ranks, meets them at their store and starts
    them (raising :class:`Unseated` when it cannot), :meth:`collect` pumps their events, :meth:`tear_down` removes
    everything, whatever state it is in."""

    def __init__(self, spec: BurstSpec) -> None:
        cluster = spec.request.options.cluster
        assert cluster is not None, "a cluster burst's options name its cluster"
        self.spec, self.cluster, self.world_size = spec, cluster, spec.plan.ranks
        self.actors: list[Any] = []
        self.placed: list[Placed] = []
        self.runs: dict[Any, int] = {}
        self.group: PlacementGroup | None = None
        self.events: Queue | None = None
        self._phases = [Phase.STARTING] * self.world_size
        self._deadline = 0.0

    def start(self, payload: bytes) -> None:
        """Seat the ranks, meet them at rank 0's store (when they form a group), then start every rank on its node's
        clock."""
        self._place()
        endpoint = self._rendezvous() if self.world_size > 1 else None
        offsets = self._clock_offsets()
        nodes = list(dict.fromkeys(p.node for p in self.placed))
        for rank, (actor, placed) in enumerate(zip(self.actors, self.placed, strict=True)):
            mates = [r for r, p in enumerate(self.placed) if p.node == placed.node]
            place = RankSeat(rank, self.world_size, mates.index(rank), len(mates), nodes.index(placed.node), endpoint)
            sampler = mates[0] == rank
            watched = [self.placed[r].pid for r in self._sharing_cores(rank)] if sampler else []
            gpus = node_gpus([self.placed[r] for r in mates]) if sampler else []
            origin = self.spec.clock_origin + offsets[placed.node]
            self.runs[actor.run.remote(rank, payload, place, origin, self.events, watched, gpus)] = rank

    def _sharing_cores(self, rank: int) -> list[int]:
        """The ranks on ``rank``'s machine, its own included: its node's, and those of other Ray nodes on the same
        host (a cluster on one machine), whose CPU is the burst's own load there, not another program's."""
        here = self.placed[rank]
        if not here.pids_of:
            return [r for r, placed in enumerate(self.placed) if placed.node == here.node]
        return [r for r, placed in enumerate(self.placed) if placed.pids_of == here.pids_of]

    def _place(self) -> None:
        """Connect (once per driver), reserve one bundle per rank, start an actor in each and learn where it is."""
        self._restart_clock()
        if not ray.is_initialized():
            ray.init(address=self.cluster.address, log_to_driver=False)
        # The events' queue lives on the driver's own node, never beside a rank: a node lost takes its rank, not the
        # word of how the burst ended (a soft affinity put it on the newest node whatever its load).
        here = ray.get_runtime_context().get_node_id()
        # At the ranks' priority too: a niced queue on a busy node outlived its burst's teardown (ended by SIGTERM).
        self.events = Queue(actor_options={"num_cpus": 0, "runtime_env": RANK_ENVIRONMENT,
                                           "scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)})
        self.group = placement_group([self.cluster.bundle()] * self.world_size, strategy=self.cluster.placement)
        try:
            ray.get(self.group.ready(), timeout=self._left())
        except GetTimeoutError:
            raise Unseated(f"the cluster found no room for {self.world_size} bundles of {self.cluster.bundle()} "
                             f"({self.cluster.placement}) within {self.cluster.timeout_s:g} s",
                             timed_out=True) from None
        actor_class = ray.remote(RankActor)
        self._restart_clock()
        self.actors = [actor_class.options(
            num_cpus=self.cluster.cpus_per_rank, num_gpus=self.cluster.gpus_per_rank, max_restarts=0,
            runtime_env=RANK_ENVIRONMENT,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=rank),
        ).remote() for rank in range(self.world_size)]
        self.placed = self._get([actor.where.remote() for actor in self.actors], "its actor did not start")

    def _rendezvous(self) -> tuple[str, int]:
        """Open the store on rank 0's node and have every other rank connect to it, within the cluster's timeout."""
        self._restart_clock()
        endpoint = self._get([self.actors[0].open_store.remote(self.world_size, self.cluster.timeout_s)],
                             "it could not open the rendezvous store")[0]
        if _loopback(endpoint[0]) and any(not _loopback(p.address) for p in self.placed):
            raise Unseated(f"the rendezvous endpoint {endpoint[0]}:{endpoint[1]} is rank 0's loopback address, and "
                             "ranks run on other machines, which cannot reach it: start rank 0's node with an "
                             "address the others reach", timed_out=False)
        joins = [actor.join_store.remote(endpoint, self.world_size, self._left()) for actor in self.actors[1:]]
        for rank, join in enumerate(joins, start=1):
            placed = self.placed[rank]
            try:
                ray.get(join, timeout=self._left() + 1.0)
            except (RayTaskError, GetTimeoutError) as exc:
                raise Unseated(f"rank {rank} on node {placed.node[:12]} ({placed.address}) did not reach the "
                                 f"rendezvous store at {endpoint[0]}:{endpoint[1]} within {self.cluster.timeout_s:g} "
                                 f"s: every node must reach rank 0's node at that address ({_first_line(exc)})",
                                 timed_out=True) from None
        return endpoint

    def _clock_offsets(self) -> dict[str, float]:
        """Each node's clock minus the driver's, from the round trip with the least delay to its first rank."""
        offsets: dict[str, float] = {}
        for actor, placed in zip(self.actors, self.placed, strict=True):
            if placed.node in offsets:
                continue
            trips = []
            for _ in range(CLOCK_PROBES):
                sent = time.perf_counter()
                there = ray.get(actor.clock.remote(), timeout=self._left())
                back = time.perf_counter()
                trips.append((back - sent, there - (sent + back) / 2))
            offsets[placed.node] = min(trips)[1]
        return offsets

    def collect(self, collected: Collected, on_event: Callable[[Event], None] | None, stop: threading.Event | None,
                deadline: float) -> str:
        """Pump the ranks' events into ``collected`` until they are done; returns how the burst ended, as the local
        pump tells it (:func:`~accel_widgets.engine.ranks.collect`)."""
        codes: list[int | None] = [None] * self.world_size
        pending = dict(self.runs)
        while True:
            self._drain(collected, on_event)
            if stop is not None and stop.is_set():
                return self._ended_as("stopped", collected, codes)
            done, _ = ray.wait(list(pending), num_returns=1, timeout=PUMP_TICK_S) if pending else ([], [])
            for run in done:
                rank = pending.pop(run)
                codes[rank] = self._exit_code(rank, run, collected)
            if done:
                time.sleep(LAST_EVENTS_S if any(code != 0 for code in codes if code is not None) else 0.0)
                self._drain(collected, on_event)
            if any(rank in collected.lost or (code is not None and (code != 0 or rank not in collected.ranks))
                   for rank, code in enumerate(codes)):
                self._name_the_vanished(pending, codes, collected, on_event)
                return self._ended_as("failed", collected, codes)
            if all(code == 0 for code in codes):
                return self._ended_as("exited", collected, codes)
            if time.perf_counter() > deadline:
                return self._ended_as("timeout", collected, codes)

    def _name_the_vanished(self, pending: dict[Any, int], codes: list[int | None], collected: Collected,
                           on_event: Callable[[Event], None] | None) -> None:
        """When every rank that failed only lost a peer (its connection to it broke, or a collective waited for it past
        the timeout), the rank that went silent is the cause: the ranks still running get ``SETTLE_S`` to end or for
        Ray to name one lost, and else the one left that said nothing is named (two or more left cannot be told apart:
        the peers of a rank hung in a collective say nothing either). A node that froze or was cut off sends no reset:
        its peers' collectives time out long before Ray's health checks give up on it (about 65 s here)."""
        if collected.lost or not collected.errors or not all(e.peer_failure for e in collected.errors):
            return
        deadline = time.monotonic() + SETTLE_S
        while pending and not collected.lost and (left := deadline - time.monotonic()) > 0:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=left)
            for run in done:
                rank = pending.pop(run)
                codes[rank] = self._exit_code(rank, run, collected)
            self._drain(collected, on_event)
        reported = {e.rank for e in collected.errors}
        silent = [rank for rank in pending.values() if rank not in reported and rank not in collected.lost]
        if len(silent) == 1 and all(e.peer_failure for e in collected.errors):
            placed = self.placed[silent[0]]
            where = f"rank {silent[0]} on node {placed.node[:12]} ({placed.address})"
            collected.lost[silent[0]] = (
                f"{where} was lost: the other ranks' connections to it broke and it said nothing (its process or its "
                "node went away)" if any(e.connection_broke for e in collected.errors) else
                f"{where} stopped answering: the other ranks waited for it past the collective timeout and it said "
                "nothing (its process hangs, or its node froze or was cut off from theirs)")

    def _ended_as(self, outcome: str, collected: Collected, codes: list[int | None]) -> str:
        """The burst's outcome, with what is known of where each rank still running was: only the public name of its
        phase, which is all a cluster rank sends."""
        collected.exit_codes, collected.phases = codes, list(self._phases)
        for rank, phase in enumerate(self._phases):
            placed = self.placed[rank]
            collected.where[rank] = f"rank {rank} on node {placed.node[:12]} was {phase.describe_public()}"
        return outcome

    def _exit_code(self, rank: int, run: Any, collected: Collected) -> int | None:
        """0 for a rank that returned, 1 for one that raised (its failure came as an event); a lost one has none and
        is named in ``collected.lost`` with the cluster's word for why."""
        try:
            ray.get(run)
        except RayTaskError:
            return 1
        except RayActorError as exc:
            placed = self.placed[rank]
            collected.lost[rank] = (f"rank {rank} on node {placed.node[:12]} ({placed.address}) was lost: "
                                    f"{_first_line(exc)}")
            return None
        return 0

    def _drain(self, collected: Collected, on_event: Callable[[Event], None] | None) -> None:
        """Hand on everything the ranks sent since the last call: telemetry and phases to the caller, the rest into
        ``collected``, each rank's summary named by its node."""
        assert self.events is not None
        waiting = self.events.qsize()
        for event in self.events.get_nowait_batch(waiting) if waiting else []:
            self._handle(cloudpickle.loads(event), collected, on_event)

    def _handle(self, event: WorkerEvent | TelemetrySample | PhaseEntered, collected: Collected,
                on_event: Callable[[Event], None] | None) -> None:
        if isinstance(event, PhaseEntered):
            self._phases[event.rank] = event.phase
            if on_event is not None:
                on_event(BurstPhase(event.t, event.rank, event.phase.public_name))
        elif isinstance(event, TelemetrySample):
            collected.telemetry.append(event)
            if on_event is not None:
                on_event(event)
        else:
            if isinstance(event, RankDone):
                node = self.placed[event.summary.rank].node
                event = replace(event, summary=replace(event.summary, node=node))
            collected.handle(event, on_event, time.perf_counter())

    def tear_down(self, collected: Collected) -> list[TelemetrySample]:
        """Kill every actor, remove the placement group and the queue, and return the telemetry collected; waits
        until the killed ranks are gone (or ``TEARDOWN_GRACE_S``). Idempotent."""
        if self.events is not None and self.runs:
            with contextlib.suppress(Exception):
                self._drain(collected, None)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.runs:
            ray.wait(list(self.runs), num_returns=len(self.runs), timeout=TEARDOWN_GRACE_S)
        if self.group is not None:
            remove_placement_group(self.group)
        if self.events is not None:
            ray.kill(self.events.actor, no_restart=True)
        self.actors, self.runs, self.group, self.events = [], {}, None, None
        return collected.telemetry

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        """The values of one call per rank, within what is left of the cluster's timeout; a rank whose call fails or
        does not return in time ends the burst, named."""
        try:
            return ray.get(refs, timeout=self._left())
        except GetTimeoutError:
            raise Unseated(f"a rank was not ready within the cluster's timeout_s={self.cluster.timeout_s:g} s: "
                             f"{what}", timed_out=True) from None
        except (RayActorError, RayTaskError) as exc:
            raise Unseated(f"a rank failed before the burst: {what} ({_first_line(exc)})", timed_out=False) from None

    def _restart_clock(self) -> None:
        """Each wait of the set-up (the ranks' places, their actors' start, their rendezvous) gets the whole
        ``timeout_s``: a placement slowed by a busy cluster leaves the rendezvous its time, and a message's "within"
        says what happened."""
        self._deadline = time.monotonic() + self.cluster.timeout_s

    def _left(self) -> float:
        return max(0.1, self._deadline - time.monotonic())


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def _first_line(exc: BaseException) -> str:
    """An exception's first line of substance: Ray's errors carry a whole traceback after it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
