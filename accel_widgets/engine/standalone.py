"""The training an exported script runs: a burst's own loop, under ``torchrun``, for as many steps as asked.

An exported script is the config the user chose plus a call to :func:`train`; everything else is the
code every burst runs (:func:`~accel_widgets.engine.training.build_loop` and the knob owners), so the
script trains exactly as the burst measured: same seed, weights, data order and step, loss for loss.
"""

from __future__ import annotations

import datetime
import json
import os
import time

import torch
import torch.distributed as dist

from ..config import Config
from ..device import usable_cpu_count
from ..knobs import global_flags, parallel
from ..results import StepRecord
from ..workload import load_workload
from .datacache import cache_root
from .events import RankLosses, WorkerEvent
from .training import build_loop
from .worker import keep_freed_memory, torch_threads

LOG_EVERY_S = 10.0


def train(workload_ref: str, config: Config, steps: int) -> list[float]:
    """Train ``steps`` optimizer steps of ``workload_ref`` under ``config`` in this torchrun process.

    Rank 0 prints progress about every ``LOG_EVERY_S`` seconds and, at the end, one JSON line
    ``{"losses": [...]}`` with every step's loss. Returns this rank's losses.
    """
    if steps < 1:
        raise ValueError(f"steps={steps}: train at least one step")
    keep_freed_memory()  # as a burst's rank does, so the job's steps run as the burst measured them
    workload = load_workload(workload_ref)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rank, world_size = _join_group(config, device)
    # As a burst does: the usable cores shared by the ranks on this machine.
    threads = max(1, usable_cpu_count() // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    log = _Log(rank, steps)
    try:
        with torch_threads(threads), global_flags(config):
            loop, _ = build_loop(workload, config, device, rank, world_size, cache_dir=str(cache_root()),
                                 emit=log, clock_origin=time.perf_counter())
            first_step_s, _ = loop.warm_up(1)
            loop.measure(steps - 1, None, first_step_s)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return log.losses


def _join_group(config: Config, device: torch.device) -> tuple[int, int]:
    """DDP ranks join torchrun's group (its env:// rendezvous); a one-process config must run alone."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if config.parallel != "ddp":
        if world_size != 1:
            raise ValueError(f"this script's config has parallel={config.parallel!r}: run it with one process "
                             f"(torchrun --nproc-per-node 1), not {world_size}")
        return 0, 1
    if world_size != parallel.ranks(config):
        print(f"note: the burst was measured with world_size={config.world_size}; this run has {world_size} ranks",
              flush=True)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=10),
                            device_id=device if device.type == "cuda" else None)
    return dist.get_rank(), dist.get_world_size()


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
