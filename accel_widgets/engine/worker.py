"""What one rank of a burst does, from process start to its last event.

:func:`worker_main` is the entry point the launcher starts in every rank process: a single-process
burst is simply a burst of one rank, so DDP adds a process group and nothing else. The same
:func:`run_rank` also serves the explicit in-process fallback.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from ..config import Config
from ..device import probe_device
from ..workload import Workload
from .datacache import cache_dataset
from .events import Emit, RankDone, RankFailed
from .flags import torch_flags, torch_threads
from .training import (
    CudaStepClock,
    EpochIterator,
    HostStepClock,
    TrainingLoop,
    build_loader,
    build_optimizer,
    prepare_loss,
    prepare_model,
    rank_summary,
)


@dataclass(frozen=True)
class BurstSpec:
    """Everything a rank needs besides the workload; built by the launcher, plain and picklable."""

    config: Config
    steps: int | None
    seconds: float | None
    warmup_steps: int
    clock_origin: float
    cache_dir: str
    threads_per_rank: int
    device_kind: str
    temp_dir: str
    master_port: int | None = None
    profile_steps: int = 0
    profile_dir: str = ""


def worker_main(rank: int, payload: bytes, events: Any) -> None:
    """Rank process entry point (started by ``torch.multiprocessing.start_processes``).

    The workload arrives cloudpickled so that classes defined in a notebook's ``__main__`` work.
    Exceptions are sent as an event carrying this rank's own traceback, then re-raised so torch's
    process context sees the failure too.
    """
    spec: BurstSpec | None = None
    try:
        workload, spec = cloudpickle.loads(payload)
        _use_private_temp_dir(spec.temp_dir)
        _use_inductor_cache(spec.cache_dir)
        run_rank(rank, workload, spec, events.put)
    except Exception as exc:
        origin = spec.clock_origin if spec is not None else 0.0
        events.put(RankFailed.from_exception(rank, time.perf_counter() - origin, exc))
        raise
    finally:
        events.close()
        events.join_thread()


def _use_private_temp_dir(path: str) -> None:
    """Send every temp file of this rank (DataLoader's pymp-*, inductor scratch) to the burst's own dir."""
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path




def run_rank(rank: int, workload: Workload, spec: BurstSpec, emit: Emit,
             should_stop: Callable[[], bool] = lambda: False) -> None:
    """Build everything for one rank inside the config's global flags, train, and report."""
    setup_start = time.perf_counter()
    config = spec.config
    device = _device_for(spec.device_kind, rank)
    with (
        torch_threads(spec.threads_per_rank),
        torch_flags(config),
        _process_group(spec, rank, device),
        _collected_warnings() as caught,
        # The in-process fallback runs in the caller: seeding must not change the caller's RNG streams.
        torch.random.fork_rng(devices=[device.index] if device.type == "cuda" else []),
    ):
        if device.type == "cuda" and config.memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(config.memory_fraction, device)
        torch.manual_seed(workload.seed)
        dataset = workload.dataset
        if config.data_cache != "none":
            dataset, _ = cache_dataset(dataset, config.data_cache, os.path.join(spec.cache_dir, "data"))
        loader = build_loader(dataset, workload, config, device, rank, config.ranks)
        model, raw = prepare_model(workload.build_model(), config, device, config.ranks)
        optimizer = build_optimizer(workload, list(raw.parameters()), config)
        step_clock = (CudaStepClock(time.perf_counter, spec.clock_origin, device) if device.type == "cuda"
                      else HostStepClock(time.perf_counter, spec.clock_origin))
        loop = TrainingLoop(model, optimizer, prepare_loss(workload, config), EpochIterator(loader), config,
                            device, rank, emit, step_clock, should_stop=should_stop)
        setup_s = time.perf_counter() - setup_start
        measured = loop.run(spec.warmup_steps, spec.steps, spec.seconds)
        capture = None
        if spec.profile_steps and rank == 0:
            trace = os.path.join(spec.profile_dir, f"trace-{os.getpid()}-{int(time.time())}.json")
            capture = loop.profile(spec.profile_steps, trace)
        summary = rank_summary(rank, device, measured, setup_s, _device_name(device), loop.scaler_skipped_steps(),
                               loop.flops_per_sample(raw), capture)
    emit(RankDone(summary, _environment(device, spec, model), sorted(set(caught))))


def _device_for(kind: str, rank: int) -> torch.device:
    if kind == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _use_inductor_cache(cache_dir: str) -> None:
    """Keep compiled kernels across bursts (a re-run pays a warm compile, as in a user's own re-runs)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache_dir, "inductor"))


@contextlib.contextmanager
def _process_group(spec: BurstSpec, rank: int, device: torch.device) -> Iterator[None]:
    """Join the burst's process group for DDP (NCCL on GPUs, gloo on CPU); nothing for one rank."""
    if spec.config.parallel != "ddp":
        yield
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{spec.master_port}", rank=rank,
                            world_size=spec.config.ranks, device_id=device if device.type == "cuda" else None)
    try:
        yield
        dist.barrier()  # leave together: a rank destroying its group while a peer still uses it can abort
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _collected_warnings() -> Iterator[list[str]]:
    """Record warnings the workload raises (e.g. deprecations) so they reach the result, once each."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            yield messages
        finally:
            messages.extend(f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return probe_device().cpu_name


def _wrapper_chain(model: torch.nn.Module) -> list[str]:
    """How the model ran, outermost first: e.g. OptimizedModule > DistributedDataParallel > Net."""
    chain = [type(model).__name__]
    while hasattr(model, "_orig_mod") or hasattr(model, "module"):
        model = getattr(model, "_orig_mod", None) or model.module
        chain.append(type(model).__name__)
    return chain


def _environment(device: torch.device, spec: BurstSpec, model: torch.nn.Module) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device_kind": device.type,
        "device_name": _device_name(device),
        "cpu_count": os.cpu_count(),
        "threads_per_rank": spec.threads_per_rank,
        "pid": os.getpid(),
        "model_wrappers": _wrapper_chain(model),
        "executable": sys.executable,
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return env
