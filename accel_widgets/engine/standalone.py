"""The training an exported script runs: a burst's own loop, under ``torchrun``, for as many steps as asked.

An exported script is the config the user chose plus a call to :func:`train`; everything else is the
code every burst runs (:func:`~accel_widgets.engine.training.build_loop` and the knob owners), so the
script trains exactly as the burst measured: same seed, weights, data order and step, loss for loss.
"""

from __future__ import annotations

import json
import os
import time

import torch

from ..data.cache import cache_root
from ..inputs.device import probe_device
from ..inputs.workload import Workload, load_workload
from ..knobs import global_flags, memory, parallel
from ..knobs.config import Config
from ..knobs.plan import Plan, resolve
from ..knobs.rules import ConfigError
from ..results.burst import StepRecord
from .events import RankLosses, WorkerEvent
from .group import joined
from .process import keep_freed_memory, torch_threads
from .training import build_loop

LOG_EVERY_S = 10.0
#: A collective without a partner fails after this long: a job's ranks may wait on each other's data or
#: checkpoint writes far longer than a burst's.
COLLECTIVE_TIMEOUT_S = 600.0


def train(workload_ref: str, config: Config, steps: int) -> list[float]:
    """Train ``steps`` optimizer steps of ``workload_ref`` under ``config`` in this torchrun process.

    Rank 0 prints progress about every ``LOG_EVERY_S`` seconds and, at the end, one JSON line
    ``{"losses": [...]}`` with every step's loss. Returns this rank's losses.
    """
    if steps < 1:
        raise ValueError(f"steps={steps}: train at least one step")
    keep_freed_memory()  # as a burst's rank does, so the job's steps run as the burst measured them
    workload = load_workload(workload_ref)
    plan = _plan(config, workload)
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if plan.device.has_cuda else torch.device("cpu")
    log = _Log(rank, steps)
    with memory.allocator(plan.config, plan.device.kind):  # before set_device initialises CUDA
        if device.type == "cuda":
            torch.cuda.set_device(device)
        with (
            torch_threads(plan.threads_per_rank),
            global_flags(plan.config),
            joined(plan.group, rank, device, rendezvous_file=None, timeout_s=COLLECTIVE_TIMEOUT_S),
        ):
            loop, _ = build_loop(workload, plan, device, rank, cache_dir=str(cache_root()), emit=log,
                                 clock_origin=time.perf_counter())
            first_step_s, _ = loop.warm_up(1)
            loop.measure(steps - 1, None, first_step_s)
    return log.losses


def _plan(config: Config, workload: Workload) -> Plan:
    """The config resolved for this machine and torchrun's group, refused as a burst would refuse it."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if not parallel.distributed(config) and world_size != 1:
        raise ConfigError(f"this script's config runs one process ({config.label()}): run it with torchrun "
                          f"--nproc-per-node 1, not {world_size} processes")
    plan = resolve(config, probe_device(), workload, world_size=world_size)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if plan.group is not None and local != parallel.ranks(config) and int(os.environ.get("RANK", 0)) == 0:
        print(f"note: the burst was measured with {parallel.ranks(config)} ranks; this machine runs {local}",
              flush=True)
    return plan


class _Log:
    """Receives the loop's events: progress on rank 0 now and then, every loss at the end."""

    def __init__(self, rank: int, steps: int) -> None:
        self.rank, self.steps, self.losses = rank, steps, []
        self._started = self._printed = time.perf_counter()
        self._samples = 0

    def __call__(self, event: WorkerEvent) -> None:
        if isinstance(event, StepRecord):
            self._samples += event.samples
            now = time.perf_counter()
            if self.rank == 0 and now - self._printed >= LOG_EVERY_S:
                self._printed = now
                print(f"step {event.step + 1}/{self.steps}: {event.total_s * 1e3:.1f} ms, "
                      f"{self._samples / (now - self._started):,.1f} samples/s on rank 0", flush=True)
        elif isinstance(event, RankLosses):
            self.losses = event.values
            if self.rank == 0:
                print(json.dumps({"losses": event.values}), flush=True)
