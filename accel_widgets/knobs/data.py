"""Data loading: batch size, DataLoader workers, pinned memory, prefetching and dataset caches.

Owns the loader a rank reads from (:func:`build_loader`), the dataset it wraps (:func:`prepare_dataset`)
and how batches reach the device (:func:`to_device`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

from .base import Knob, Rule

if TYPE_CHECKING:
    from ..config import Config
    from ..workload import Workload

DEFAULT_BATCH_SIZE = 64

GROUP = "data"
TITLE = "Data loading"

KNOBS = [
    Knob(
        "batch_size", "data", int, None, minimum=1, maximum=1 << 20, allow_none=True,
        what="Samples per micro-batch handed to the model (None: the workload's own batch size).",
        why="Larger batches amortise per-step Python and kernel-launch overhead over more samples.",
        when="The step is short and memory has headroom; watch accuracy when changing it for real.",
    ),
    Knob(
        "num_workers", "data", int, 0, minimum=0, maximum=64,
        what="DataLoader worker processes that load and augment batches in parallel.",
        why="With 0 workers the training loop waits while every item is decoded/augmented on its thread.",
        when="Data wait is a visible share of the step (per-item CPU work: decoding, augmentation).",
    ),
    Knob(
        "pin_memory", "data", bool, False, applies_to=("cuda",),
        what="Collate batches into page-locked host memory.",
        why="The GPU's DMA engine copies from pinned memory directly, faster and asynchronously.",
        when="Host-to-device copies are a visible share of the step. No effect without CUDA.",
    ),
    Knob(
        "prefetch_factor", "data", int, 2, minimum=1, maximum=64,
        what="Batches each DataLoader worker prepares ahead of the training loop.",
        why="A deeper queue absorbs jitter in per-batch loading time.",
        when="Loading time varies a lot between batches. Needs num_workers > 0.",
    ),
    Knob(
        "persistent_workers", "data", bool, False,
        what="Keep DataLoader workers alive between epochs.",
        why="Restarting workers every epoch re-forks processes and re-creates dataset state.",
        when="Epochs are short or dataset setup is expensive. Needs num_workers > 0.",
    ),
    Knob(
        "non_blocking", "data", bool, False, applies_to=("cuda",),
        what="Issue host-to-device copies with non_blocking=True.",
        why="From pinned memory the copy overlaps with compute instead of stalling the host.",
        when="Together with pin_memory on a GPU. No effect without CUDA.",
    ),
    Knob(
        "data_cache", "data", str, "none", choices=("none", "memory", "memmap"),
        what="Materialise the dataset once: in RAM, or in a numpy.memmap file reused by later runs.",
        why="Per-item preprocessing is paid once instead of every epoch; memmap is shared by loader workers.",
        when="Items are expensive to produce and deterministic enough to cache (random augmentation is "
        "frozen to one draw per item).",
    ),
]

_PREFETCH_DEFAULT = next(k.default for k in KNOBS if k.name == "prefetch_factor")

RULES = [
    Rule(
        ("prefetch_factor", "persistent_workers", "num_workers"), "warning",
        lambda c, d: c.num_workers == 0 and (c.persistent_workers or c.prefetch_factor != _PREFETCH_DEFAULT),
        lambda c, d: "prefetch_factor and persistent_workers only apply with num_workers > 0; they are "
        "ignored.",
    ),
    Rule(
        ("non_blocking", "pin_memory"), "warning",
        lambda c, d: d.has_cuda and c.non_blocking and not c.pin_memory,
        lambda c, d: "non_blocking=True without pin_memory=True: copies from pageable memory are staged "
        "synchronously anyway.",
    ),
]


def resolve_batch_size(config: Config, workload: Workload) -> int:
    """Samples per micro-batch: the knob, else the workload's own, else a default."""
    return config.batch_size or workload.batch_size or DEFAULT_BATCH_SIZE


def prepare_dataset(dataset: Any, config: Config, cache_dir: str) -> Any:
    """The dataset the loader reads: the workload's own, or materialised once in RAM or a memmap file."""
    if config.data_cache == "none":
        return dataset
    from ..engine.datacache import cache_dataset

    cached, _ = cache_dataset(dataset, config.data_cache, os.path.join(cache_dir, "data"))
    return cached


def build_loader(
    dataset: Dataset, workload: Workload, config: Config, device: torch.device, rank: int, world_size: int
) -> DataLoader:
    """The DataLoader with the data-loading knobs; the same seeded order in every burst."""
    batch_size = resolve_batch_size(config, workload)
    per_rank = len(dataset) // world_size
    if per_rank < batch_size:
        raise ValueError(
            f"the dataset has {len(dataset)} items ({per_rank} per rank), fewer than one batch of {batch_size}: "
            "use a smaller batch_size or a larger dataset"
        )
    generator = torch.Generator().manual_seed(workload.seed)
    if world_size > 1:
        sampler: Any = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=workload.seed)
    else:
        sampler = RandomSampler(dataset, generator=generator)
    workers = config.num_workers
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=workload.collate_fn,
        # Why: pinned host memory lets the copy engine DMA batches to the GPU asynchronously.
        pin_memory=config.pin_memory and device.type == "cuda",
        # Why: equal batch shapes keep compiled graphs and cuDNN plans valid for every step.
        drop_last=True,
        prefetch_factor=config.prefetch_factor if workers else None,
        persistent_workers=config.persistent_workers if workers else False,
        generator=generator,
        # Explicit: notebook-defined datasets need fork (spawn cannot import __main__ classes), and
        # Python 3.14 changes the Linux default to forkserver.
        multiprocessing_context="fork" if workers else None,
    )


def to_device(obj: Any, device: torch.device, non_blocking: bool, channels_last: bool) -> Any:
    """Move every tensor of a (possibly nested) batch to the device.

    Why non_blocking: from pinned memory the copy overlaps compute instead of stalling the host.
    """
    if isinstance(obj, torch.Tensor):
        if channels_last and obj.dim() == 4 and obj.is_floating_point():
            return obj.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device, non_blocking, channels_last) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device, non_blocking, channels_last) for v in obj)
    return obj
