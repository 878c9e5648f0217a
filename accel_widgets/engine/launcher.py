"""Launch a burst's rank processes, stream their events, and always clean up after them.

Ranks are forked from the preloaded forkserver (:mod:`.forkserver` says why) with torch's own
``start_processes``, so a failing rank's traceback and the teardown of its peers follow torch's
machinery; the workload travels cloudpickled, by value. Nothing a burst starts outlives it or its
caller: teardown survives repeated Ctrl-C, ranks die with the process that launched them, and the
temp dirs of callers that were killed are removed by the next burst.
"""

from __future__ import annotations

import copy
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import psutil
from torch import nn

from ..data.cache import cache_root
from ..inputs.device import DeviceInfo, probe_device, worker_env
from ..inputs.workload import Workload
from ..knobs.config import Config
from ..knobs.plan import resolve
from ..knobs.rules import ConfigError
from ..results.burst import BurstResult
from .events import RankFailed
from .forkserver import START_METHOD
from .outcome import Unseated, finish, oom_kill_count
from .payload import pickle_for_ranks
from .process import inductor_cache_dir
from .ranks import Collected, Event, RankGroup, shielded
from .request import BurstOptions, BurstRequest
from .worker import BurstSpec, run_rank

if TYPE_CHECKING:
    from .cluster import ClusterRanks

COLLECTIVE_TIMEOUT_SHARE = 0.5  # a DDP collective fails after this share of the burst's timeout

SYNC_DEBUG_DDP_NOTE = ("sync_debug covers the host-device syncs of torch's CUDA calls, not torch.distributed's: "
                       "NCCL collectives and DDP's gradient buckets are not checked, so a burst that passes says "
                       "nothing about them")


class WorkloadNotPicklable(TypeError):
    """The workload cannot travel to a worker process; raised before any process starts."""


class IsolationWarning(UserWarning):
    """The burst runs in the calling process and loses crash/OOM/hang isolation."""


def _prepare_profile_dir(path: str) -> str:
    """Traces outlive the burst (its temp dir is removed), so they go to a directory the user chose."""
    os.makedirs(path, exist_ok=True)
    return os.path.abspath(path)


def pickle_workload(workload: Workload, spec: BurstSpec) -> tuple[bytes, list[str]]:
    """Serialise by value, the user's modules' code as this process holds it now (:mod:`.payload`); returns the
    bytes and a note per user module that travels by name instead. On failure say what cannot travel and how to
    fix it."""
    try:
        return pickle_for_ranks((workload, spec))
    except Exception as exc:
        raise WorkloadNotPicklable(
            f"the workload cannot be sent to a worker process ({type(exc).__name__}: {exc}). Open files, locks, "
            "sockets, generators and live database handles cannot travel between processes: build them inside "
            "the Dataset/model lazily, or move the code into an importable module and pass a factory. As a last "
            "resort run_burst(..., options=BurstOptions(isolation='inprocess')) trains in this process without crash "
            "isolation."
        ) from exc


class Engine(Protocol):
    """What runs one burst for a search or the panel: :func:`run_burst`, a :class:`BurstEngine`, or a fake in a test.

    The drivers always pass the length, the event stream, Stop and the label, which change from burst to burst;
    ``options`` only where they set one (a headspace's freed part, the panel's profile, a timeout they were given),
    so an engine that fixes options of its own keeps them wherever nothing is added."""

    def __call__(self, workload: Workload, config: Config, *, steps: int | None, seconds: float | None,
                 on_event: Callable[[Event], None] | None, stop: threading.Event | None, label: str,
                 options: BurstOptions | None = None) -> BurstResult: ...


def added_options(options: BurstOptions | None) -> dict[str, BurstOptions]:
    """An engine call's ``options`` keyword where a driver adds options, and none where it adds nothing: a keyword
    given, even None, replaces the one a ``partial`` of the engine fixed."""
    return {"options": options} if options is not None else {}


def run_burst(
    workload: Workload,
    config: Config | None = None,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    on_event: Callable[[Event], None] | None = None,
    stop: threading.Event | None = None,
    label: str = "",
    options: BurstOptions | None = None,
) -> BurstResult:
    """Train ``workload`` under ``config`` for a short timed burst and return what was measured.

    Runs ``steps`` measured steps (default 40) or for ``seconds``, after ``options.warmup_steps`` unmeasured ones
    (default 2, or 3 when compiling). ``on_event`` receives every step record and telemetry sample
    live, on the calling thread, and a :class:`~accel_widgets.results.burst.BurstPhase` when a rank starts,
    sets up, steps or finishes (worker isolation), so a progress display can name a long first step.
    Setting ``stop`` ends the burst early (status "stopped"). ``label`` names the run in its result.

    The keywords are what changes from burst to burst; everything set once and rarely is one
    :class:`BurstOptions` value (the warm-up, the timeout, a profile, sync debugging, a headspace's freed part, the
    isolation, the cache dir, the device), so that callers and the search drivers hand it on whole.
    ``options.profile_steps`` > 0 records that many extra steady-state steps with torch.profiler after the
    measured window (rank 0) and writes the trace under ``options.profile_dir`` (``result.profile``).
    ``options.sync_debug`` runs the measured steps under torch's CUDA sync-debug mode "error": a hidden
    host-device sync (anything but the loss read ``sync_every`` asks for) fails the burst with the
    traceback of the line that synced; torch.distributed's own syncs (NCCL collectives, DDP's bucket
    and buffer traffic) are outside that mode, so under DDP it vouches for the rest of the step only (the
    result's warnings say so). ``options.freed`` trains a headspace variant of the config, one part of its step made
    free (``"data"``, ``"communication"``, ``"host"``: :mod:`accel_widgets.knobs.parts`; ``aw.headspace`` compares
    them with the config as it is).

    Raises :class:`BurstRequestError` (an unusable length: steps and seconds together too; the options refuse
    theirs when made) or :class:`ConfigError` (the config cannot run here) before starting anything, and a
    :class:`BurstError` subclass (with ``.result``) if the burst fails, times out or crashes; a loss
    that turns NaN/inf raises nothing and ends with status "diverged".
    """
    if not isinstance(options, BurstOptions | None):
        raise TypeError(f"options must be an accel_widgets.BurstOptions, got {type(options).__name__}: pass "
                        "BurstOptions(timeout_s=60), or BurstOptions(**settings) for a dict of them")
    request = BurstRequest(steps, seconds, options or BurstOptions())
    if not isinstance(config, Config | None):
        raise TypeError(f"config must be an accel_widgets.Config, got {type(config).__name__}: pass "
                        "Config(precision='bf16'), or Config(**knobs) for a dict of knob values")
    called_at = time.perf_counter()
    spec, result = prepare_burst(workload, config, request, called_at=called_at, label=label)
    if request.options.isolation == "inprocess":
        return _run_in_process(workload, spec, result, on_event, stop, called_at)
    return _run_in_workers(workload, spec, result, on_event, stop, called_at)


@dataclass(frozen=True)
class BurstEngine:
    """An :class:`Engine` for the searches and the panel: ``engine`` (:func:`run_burst`) with options of its own.

    ``functools.partial(run_burst, options=...)`` would lose them wherever a search adds options for a burst (a
    headspace's freed part, the panel's profile, a timeout): a call's keyword replaces a partial's. Here the added
    options are laid over these (:meth:`BurstOptions.over`), e.g. ``BurstEngine(BurstOptions(isolation="inprocess"))``
    for a workload that cannot be pickled, or ``BurstEngine(BurstOptions(cluster=...), engine)`` for any engine's
    bursts on a Ray cluster (the panel's "Run on"). Not :func:`run_burst` itself, so the comparison engine runs a
    fresh burst per window (held ranks stay on this machine: :class:`~accel_widgets.engine.held.HeldBurst`)."""

    options: BurstOptions
    engine: Engine = run_burst

    def __call__(self, workload: Workload, config: Config | None = None, *, steps: int | None = None,
                 seconds: float | None = None, on_event: Callable[[Event], None] | None = None,
                 stop: threading.Event | None = None, label: str = "",
                 options: BurstOptions | None = None) -> BurstResult:
        return self.engine(workload, config, steps=steps, seconds=seconds, on_event=on_event, stop=stop, label=label,
                           options=self.options if options is None else options.over(self.options))


def prepare_burst(workload: Workload, config: Config | None, request: BurstRequest, *, called_at: float,
                  label: str = "") -> tuple[BurstSpec, BurstResult]:
    """Resolve the config for this machine once and describe the burst: what its ranks are given (the spec, on the
    clock that starts at ``called_at``) and the result it will fill in. Raises :class:`ConfigError` for a config
    that cannot run here, before any process starts."""
    options = request.options
    plan = resolve(config or Config(), _planned_device(options), workload, freed=options.freed)
    if options.cluster is not None:  # a rank's threads are its bundle's CPUs, not a share of this machine's cores
        plan = replace(plan, threads_per_rank=max(1, int(options.cluster.cpus_per_rank)))
    request = request.resolved(plan.warmup_steps)
    cache_dir = options.cache_dir or str(cache_root())
    owner = psutil.Process()
    profile_dir = _prepare_profile_dir(options.profile_dir) if options.profile_steps else ""
    spec = BurstSpec(
        plan=plan, request=replace(request, options=replace(request.options, profile_dir=profile_dir)),
        # A cluster's rank keeps its node's own environment, with only the burst's settings laid over it (worker.Seat)
        environment={**os.environ, **worker_env()} if options.cluster is None else worker_env(),
        clock_origin=called_at, cache_dir=cache_dir,
        owner_pid=owner.pid, owner_started=owner.create_time(), inductor_cache_dir=inductor_cache_dir(cache_dir),
        collective_timeout_s=options.timeout_s * COLLECTIVE_TIMEOUT_SHARE,
    )
    notes = [SYNC_DEBUG_DDP_NOTE] if options.sync_debug and plan.group is not None else []
    result = BurstResult(workload=workload.name, config=plan.config, status="ok", world_size=plan.ranks,
                         warmup_steps=request.options.warmup_steps or 0, tokens_per_sample=workload.tokens_per_sample,
                         warnings=[*plan.warnings, *notes], label=label, facts=plan.facts, freed=plan.freed,
                         environment={"driver": plan.device.driver, "gpus": [g.name for g in plan.device.gpus],
                                      "start_method": _start_method(options)})
    return spec, result


def _planned_device(options: BurstOptions) -> DeviceInfo:
    """The machine a burst's config is resolved for: ``options.device``, else this one; for a cluster whose ranks get
    no GPUs, its GPUs hidden (their ranks train on CPUs, with gloo). Ranks given GPUs are planned for a machine that
    has them: this one may have none, and then ``options.device`` must describe a node's."""
    device = options.device or probe_device()
    if options.cluster is None:
        return device
    if not options.cluster.gpus_per_rank:
        return replace(device, gpus=(), driver=None)
    if not device.gpus:
        raise ConfigError("gpus_per_rank > 0 plans the burst for GPUs, and this machine has none: pass "
                          "BurstOptions(device=...) describing a node's GPUs")
    return device


def _start_method(options: BurstOptions) -> str:
    if options.cluster is not None:
        return "ray actor"
    return START_METHOD if options.isolation == "process" else "inprocess"


def _run_in_workers(
    workload: Workload, spec: BurstSpec, result: BurstResult, on_event: Callable[[Event], None] | None,
    stop: threading.Event | None, called_at: float,
) -> BurstResult:
    ranks = _rank_group(spec)
    collected = Collected(oom_kills_before=oom_kill_count())

    def tear_down() -> None:
        result.telemetry = ranks.tear_down(collected)

    try:
        payload, notes = pickle_workload(workload, ranks.spec)
        result.warnings.extend(notes)
        ranks.start(payload)
        outcome = ranks.collect(collected, on_event, stop, _deadline(spec, called_at))
    except Unseated as refused:
        shielded(tear_down, reraise_interrupt=False)
        raise refused.error(result) from None
    except BaseException:
        shielded(tear_down, reraise_interrupt=False)
        raise
    shielded(tear_down, reraise_interrupt=True)
    return finish(result, collected, outcome, called_at, spec.request.options.timeout_s)


def _deadline(spec: BurstSpec, called_at: float) -> float:
    """When the burst's own ``timeout_s`` runs out, called once its ranks have started: it counts from the call for
    ranks on this machine, and from now for a cluster's, whose set-up waits are each bounded by ``RayCluster.timeout_s``
    (a slow placement must not eat the time the training, and its collectives' share of it, were given)."""
    began = called_at if spec.request.options.cluster is None else time.perf_counter()
    return began + spec.request.options.timeout_s


def _rank_group(spec: BurstSpec) -> RankGroup | ClusterRanks:
    """The ranks' processes: forked on this machine, or Ray actors on the cluster the options name."""
    if spec.request.options.cluster is None:
        return RankGroup(spec)
    from .cluster import ClusterRanks  # Ray is an optional dependency: imported for a cluster burst alone

    return ClusterRanks(spec)


def _run_in_process(
    workload: Workload, spec: BurstSpec, result: BurstResult, on_event: Callable[[Event], None] | None,
    stop: threading.Event | None, called_at: float,
) -> BurstResult:
    """The explicit fallback for workloads that cannot be pickled: same loop, no isolation."""
    if spec.plan.group is not None:
        raise ConfigError("isolation='inprocess' runs in the caller: DDP and FSDP ranks need isolation='process'")
    warnings.warn(
        "a burst with isolation='inprocess' trains in this process: a crash or out-of-memory takes this kernel down, "
        "a hang cannot be timed out, and on a GPU this process initialises CUDA (DDP can then no longer be "
        "launched from it). Numbers are comparable; safety is not.",
        IsolationWarning,
        stacklevel=3,
    )
    collected = Collected()
    private = _with_private_model(workload)
    try:
        run_rank(0, private, spec, lambda event: collected.handle(event, on_event, time.perf_counter()),
                 should_stop=stop.is_set if stop is not None else lambda: False)
        outcome = "exited"
    except Exception as exc:
        collected.errors.append(RankFailed.from_exception(0, time.perf_counter() - called_at, exc))
        outcome = "failed"
    if outcome == "exited" and stop is not None and stop.is_set():
        outcome = "stopped"
    return finish(result, collected, outcome, called_at, 0.0)


def _with_private_model(workload: Workload) -> Workload:
    """The user's model must never be trained in place; the dataset is only read, so it is shared."""
    if not isinstance(workload.model, nn.Module):
        return workload
    try:
        model = copy.deepcopy(workload.model)
    except Exception as exc:
        raise WorkloadNotPicklable(
            f"isolation='inprocess' needs a private copy of the model, and copy.deepcopy failed ({exc}). "
            "Pass a zero-argument model factory instead of an instance."
        ) from exc
    return replace(workload, model=model)
