"""Data loading: batch size, DataLoader workers, pinned memory, prefetching and dataset caches.

Owns the loader a rank reads from (:func:`build_loader`), the dataset it wraps (:func:`prepare_dataset`)
and how batches reach the device (:func:`to_device`).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    default_collate,
)

from ..data.cache import CacheInfo, cache_dataset
from ..data.keyed import CollateKept, KeyedItems, KeyedOrder, KeyedReading, draws_nothing
from ..data.resume import ResumableSampler
from ..data.streams import split_stream
from . import parallel
from .base import (
    Climb,
    Code,
    Knob,
    RecipeContext,
    RecipeEntry,
    RecipePart,
    Remedy,
    Rule,
    Search,
    Setting,
    Style,
    Symptom,
    changed,
    no_equivalent,
    powers_of_two,
    setting,
)
from .owner import Owner

if TYPE_CHECKING:
    from ..inputs.workload import Workload
    from .config import Config

DEFAULT_BATCH_SIZE = 64
#: The knob whose value the step's activations grow with: the panel says whether the settings fit beside it.
SIZES_MEMORY = "batch_size"


class SharedMemoryTooSmall(RuntimeError):
    """The batches the loader's workers hold in flight would not fit in the free shared memory (/dev/shm)."""


SHARED_MEMORY = "/dev/shm"
#: Batches in flight above this share of the free shared memory leave too little for NCCL and the rest of the
#: machine (other processes, the next burst's workers): the burst is told so.
SHARED_MEMORY_WARN_SHARE = 0.5

GROUP = "data"
TITLE = "Data loading"

KNOBS = [
    Knob(
        "batch_size", "data", int, None, minimum=1, maximum=1 << 20, allow_none=True,
        short="batch",
        what="Samples per micro-batch handed to the model (None: the workload's own batch size).",
        why="Larger batches amortise per-step Python and kernel-launch overhead over more samples.",
        when="The step is short and memory has headroom; watch accuracy when changing it for real.",
        search=Search(
            left_out="the batch is a hyperparameter: it changes what is trained, not only how fast",
            values=lambda ctx: _around(resolve_batch_size(ctx.config, ctx.workload)),
            rank=lambda value, ctx: value if value is not None else resolve_batch_size(ctx.config, ctx.workload),
        ),
    ),
    Knob(
        "num_workers", "data", int, 0, minimum=0, maximum=64,
        short="workers",
        part="data",
        what="DataLoader worker processes that load and augment batches in parallel.",
        why="With 0 workers the training loop waits while every item is decoded/augmented on its thread.",
        when="Data wait is a visible share of the step (per-item CPU work: decoding, augmentation).",
        search=Search(values=lambda ctx: (0, *powers_of_two(ctx.device.cpu_count))),
    ),
    Knob(
        "pin_memory", "data", bool, False, applies_to=("cuda",),
        short="pin",
        part="data",
        what="Collate batches into page-locked host memory.",
        why="The GPU's DMA engine copies from pinned memory directly, faster and asynchronously.",
        when="Host-to-device copies are a visible share of the step. No effect without CUDA.",
        needs=("cuda",),
    ),
    Knob(
        "prefetch_factor", "data", int, 2, minimum=1, maximum=64,
        short="prefetch",
        part="data",
        what="Batches each DataLoader worker prepares ahead of the training loop.",
        why="A deeper queue absorbs jitter in per-batch loading time.",
        when="Loading time varies a lot between batches. Needs num_workers > 0.",
        search=Search(values=(2, 4)),
    ),
    Knob(
        "persistent_workers", "data", bool, False,
        short="persistent",
        part="data",
        what="Keep DataLoader workers alive between epochs.",
        why="Restarting workers every epoch re-forks processes and re-creates dataset state.",
        when="Epochs are short or dataset setup is expensive. Needs num_workers > 0.",
    ),
    Knob(
        "non_blocking", "data", bool, False, applies_to=("cuda",),
        short="non-blocking",
        part="data",
        what="Issue host-to-device copies with non_blocking=True.",
        why="From pinned memory the copy overlaps with compute instead of stalling the host.",
        when="Together with pin_memory on a GPU. No effect without CUDA.",
        needs=("cuda",),
    ),
    Knob(
        "data_cache", "data", str, "none", choices=("none", "memory", "memmap", "shards"),
        short="cache",
        part="data",
        what="Materialise the dataset once: in RAM, in a numpy.memmap file, or in WebDataset tar shards streamed "
        "back; the files are reused by later runs.",
        why="Per-item preprocessing is paid once instead of every epoch; memmap is shared by loader workers; "
        "shards show what a sharded streaming format does here (sequential reads, tar decoding in the loader, "
        "whole shards per rank and worker, an order shuffled once when written). "
        "The trade: the cache keeps one draw per item, so random augmentation is frozen and every epoch sees the "
        "same augmented items (the burst warns, and the guard marks the run as changing training).",
        when="Items are expensive to produce and deterministic (decoding, resizing, tokenising). With random "
        "augmentation, cache only the deterministic part and augment after, or leave it off. Try shards (needs "
        "the webdataset package) before converting a dataset to a sharded format, to measure what it costs here.",
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
    Rule(
        ("data_cache",), "error",
        lambda c, d: c.data_cache == "shards" and not webdataset_installed(),
        lambda c, d: "data_cache='shards' writes WebDataset tar shards and needs the webdataset package, which "
        "is not installed here: pip install 'accel-widgets[shards]' (or pip install webdataset).",
    ),
]


#: More loader workers (persistent across epochs), and on a GPU pinned memory, non-blocking copies and a deeper
#: queue: the data pipeline, fixed first.
LADDER = [
    Climb("+loader", "load and augment batches in worker processes, ahead of the step",
          lambda device, workload: {"num_workers": min(8, max(1, device.cpu_count)), "persistent_workers": True,
                                    **({"pin_memory": True, "non_blocking": True, "prefetch_factor": 4}
                                       if device.has_cuda else {})}),
]


def _data_wait(config: Config) -> Remedy:
    if config.num_workers == 0:
        return Remedy("num_workers", "every item is prepared on the training thread: add DataLoader workers", 2)
    if config.data_cache == "none":
        return Remedy("data_cache", f"even with {config.num_workers} workers: cache the prepared items (memory or "
                      "memmap) or prefetch deeper")
    return Remedy("prefetch_factor", f"with {config.num_workers} workers and a {config.data_cache} cache: prefetch "
                  "deeper, or the cores are simply too few for the loader and the model")


REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {
    "data_wait": _data_wait,
    "slow_copies": lambda c: Remedy("non_blocking" if c.pin_memory else "pin_memory", "pin host memory and copy "
                                    "with non_blocking so copies overlap compute", True),
    "stream_rereads": lambda c: Remedy("data_cache", "write the items as shards (data_cache='shards' streams whole "
                                       "shards per reader), or have the stream split itself (by get_worker_info() "
                                       "and the rank) and declare it with splits_itself"),
    "frozen_augmentation": lambda c: Remedy("data_cache", "cache only the deterministic part and augment after, or "
                                            "leave data_cache off"),
    "starved_loader": lambda c: Remedy("data_cache", "more workers cannot help; cache the prepared items instead",
                                       "memory") if c.num_workers > 0 and c.data_cache == "none" else None,
    "disk_bound": lambda c: Remedy("data_cache", "the data source is the limit; cache the prepared items"),
    "overhead_bound": lambda c: Remedy("batch_size", "a larger batch amortises it"),
    "memory_headroom": lambda c: Remedy("batch_size", "room for a larger batch"),
    "out_of_memory": lambda c: Remedy("batch_size", "lower batch_size, or keep the effective batch with "
                                      "grad_accum_steps"),
}


_KNOB = {knob.name: knob for knob in KNOBS}
_LOADER_STYLES: tuple[Style, ...] = ("pytorch", "lightning", "accelerate")  # the user builds the DataLoader


def _batch_size_entry(name: str, call: str) -> RecipeEntry:
    """The batch size, always written: a recipe without it would take the framework's default (HF: 8)."""

    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        size = context.batch_size or (resolve_batch_size(config, context.workload) if context.workload is not None
                                      else config.batch_size or DEFAULT_BATCH_SIZE)
        return [Setting("batch_size", name, size, call=call, why="samples per micro-batch on each rank")]

    return entry


def _with_workers(entry: RecipeEntry) -> RecipeEntry:
    """An entry that only means something with loader workers (DataLoader refuses it without)."""
    return lambda config, context: entry(config, context) if config.num_workers else []


def _loader(name: str, *, always: bool = False) -> dict[Style, RecipeEntry]:
    return {style: setting(_KNOB[name], name, call="DataLoader", always=always) for style in _LOADER_STYLES}


_CACHE_INSTEAD = ("prepare the items once yourself and train from the result (a TensorDataset of the prepared "
                  "tensors, numpy.memmap files, or WebDataset shards), so per-item work is not paid every epoch")

#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`): the DataLoader's keywords in plain PyTorch,
#: Lightning and Accelerate (the user builds the loader), TrainingArguments' ``dataloader_*`` for Hugging Face.
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "batch_size": {**{style: _batch_size_entry("batch_size", "DataLoader") for style in _LOADER_STYLES},
                   "hf": _batch_size_entry("per_device_train_batch_size", "")},
    "num_workers": {**_loader("num_workers"), "hf": setting(_KNOB["num_workers"], "dataloader_num_workers")},
    # The Trainer pins by default, plain PyTorch does not: said either way.
    "pin_memory": {**_loader("pin_memory"), "hf": setting(_KNOB["pin_memory"], "dataloader_pin_memory", always=True)},
    "prefetch_factor": {**{style: _with_workers(entry) for style, entry in _loader("prefetch_factor").items()},
                        "hf": _with_workers(setting(_KNOB["prefetch_factor"], "dataloader_prefetch_factor"))},
    "persistent_workers": {**{style: _with_workers(entry) for style, entry in _loader("persistent_workers").items()},
                           "hf": _with_workers(setting(_KNOB["persistent_workers"],
                                                       "dataloader_persistent_workers"))},
    "non_blocking": {
        "pytorch": setting(_KNOB["non_blocking"], "non_blocking", call="to"),
        "hf": setting(_KNOB["non_blocking"], "accelerator_config", lambda value: {"non_blocking": value}),
        "lightning": lambda config, context: [Code("non_blocking", "code", "# Lightning copies batches to a GPU with "
                                                   "non_blocking=True itself: nothing to set")]
        if changed(_KNOB["non_blocking"], config) else [],
        "accelerate": no_equivalent(_KNOB["non_blocking"], "pass dataloader_config=accelerate.DataLoaderConfiguration("
                                    "non_blocking=True) to Accelerator(...), with pin_memory=True in the DataLoader"),
    },
    "data_cache": {style: no_equivalent(_KNOB["data_cache"], _CACHE_INSTEAD) for style in _LOADER_STYLES}
    | {"hf": no_equivalent(_KNOB["data_cache"], "prepare the dataset once with datasets' map() (it caches the result "
                           "on disk) and set_format('torch'), rather than transforming items as they are read")},
}


def loader_workers(config: Config) -> int:
    """DataLoader worker processes each rank starts (0: items are prepared on the training thread)."""
    return config.num_workers


def readers_per_rank(config: Config) -> int:
    """How many readers of a stream each rank has: its loader workers, or the rank itself."""
    return max(1, config.num_workers)


def reseeding_factors(config: Config) -> dict[str, Any]:
    """What of the data knobs decides how far reseeding the data moves the loss: a cache stores one draw of each
    item, so it freezes random augmentation (the correctness guard keys its noise bands by this)."""
    return {"data_cache": config.data_cache}


def _around(natural: int) -> tuple[int, ...]:
    """Batch sizes around the workload's own: half, itself, twice and four times."""
    return (max(1, natural // 2), natural, natural * 2, natural * 4)


def webdataset_installed() -> bool:
    """Whether webdataset can be imported, asked without importing it: the rules run on every edit in the
    panel, and importing webdataset (and its dependencies) there would slow every one of them."""
    return importlib.util.find_spec("webdataset") is not None


def resolve_batch_size(config: Config, workload: Workload) -> int:
    """Samples per micro-batch: the knob, else the workload's own, else a default."""
    return config.batch_size or workload.batch_size or DEFAULT_BATCH_SIZE


def data_seed(workload: Workload) -> int:
    """The seed of the data order and augmentation: ``Workload.data_seed``, else the weights' ``seed``."""
    return workload.seed if workload.data_seed is None else workload.data_seed


def prepare_dataset(dataset: Any, config: Config, cache_dir: str) -> tuple[Any, CacheInfo | None]:
    """The dataset the loader reads: the workload's own, or materialised once in RAM, a memmap file or tar
    shards (a stream over them, split per rank by :func:`build_loader` like any other stream); with what the
    cache did (None without one)."""
    if config.data_cache == "none":
        return dataset, None
    return cache_dataset(dataset, config.data_cache, os.path.join(cache_dir, "data"))


def build_loader(
    dataset: Dataset, workload: Workload, config: Config, device: torch.device, rank: int, world_size: int
) -> DataLoader:
    """The DataLoader with the data-loading knobs; the same seeded order in every burst, and each item's random
    draws keyed to the item (:mod:`~accel_widgets.data.keyed`), so the other knobs here change how fast batches
    come, never which: none of workers, persistence, prefetching and pinning changes a batch.

    A stream (``IterableDataset``) has no length to check and no sampler: each rank and loader worker reads
    its own share of it (:func:`~accel_widgets.data.streams.split_stream`), and an epoch ends where the
    stream does.
    """
    batch_size = resolve_batch_size(config, workload)
    if isinstance(dataset, IterableDataset):
        dataset, batching = _streaming(dataset, workload, batch_size, rank, world_size, config.num_workers)
    else:
        per_rank = len(dataset) // world_size
        if per_rank < batch_size:
            raise ValueError(
                f"the dataset has {len(dataset)} items ({per_rank} per rank), fewer than one batch of {batch_size}: "
                "use a smaller batch_size or a larger dataset"
            )
        keyed = not draws_nothing(dataset)  # stored tensors draw nothing: read as they are, at no cost
        batching = _batching(dataset, workload, batch_size, rank, world_size, keyed)
        dataset = KeyedItems(dataset, data_seed(workload)) if keyed else dataset
    user = workload.loader
    workers = config.num_workers
    collate = workload.collate_fn
    if isinstance(dataset, KeyedReading):  # read without workers, the rank's generators put back once collated
        collate = CollateKept(collate or default_collate, dataset)
    return DataLoader(
        dataset,
        **batching,
        num_workers=workers,
        collate_fn=collate,
        worker_init_fn=user.worker_init_fn if user is not None else None,
        # Why: pinned host memory lets the copy engine DMA batches to the GPU asynchronously.
        pin_memory=config.pin_memory and device.type == "cuda",
        prefetch_factor=config.prefetch_factor if workers else None,
        persistent_workers=config.persistent_workers if workers else False,
        # Explicit: notebook-defined datasets need fork (spawn cannot import __main__ classes), and
        # Python 3.14 changes the Linux default to forkserver.
        multiprocessing_context="fork" if workers else None,
    )


def build_eval_loader(dataset: Dataset, workload: Workload, config: Config, device: torch.device, rank: int,
                      world_size: int) -> DataLoader:
    """The evaluation set as one rank reads it: every ``world_size``-th item from ``rank``, in order, so the ranks
    share it without a duplicate; batches of the training's size (the last one short), loaded as the knobs say.

    Its own generator seeds the loader (its workers' seeds): evaluating never draws from the streams training
    draws from, so a job evaluated every N steps trains exactly as one that is not.
    """
    workers = config.num_workers
    return DataLoader(
        torch.utils.data.Subset(dataset, range(rank, len(dataset), world_size)),
        batch_size=resolve_batch_size(config, workload),
        num_workers=workers,
        collate_fn=workload.collate_fn,
        pin_memory=config.pin_memory and device.type == "cuda",
        prefetch_factor=config.prefetch_factor if workers else None,
        persistent_workers=config.persistent_workers if workers else False,
        multiprocessing_context="fork" if workers else None,
        generator=torch.Generator().manual_seed(data_seed(workload)),
    )


def check_shared_memory(dataset: Any, workload: Workload, config: Config, world_size: int) -> None:
    """Before a loader's workers start: refuse a burst whose batches in flight need more shared memory than
    /dev/shm has free, and warn when they need more than ``SHARED_MEMORY_WARN_SHARE`` of it.

    A loader worker hands each batch to its rank through shared memory, and holds ``prefetch_factor`` of
    them ahead, so every rank needs ``num_workers x prefetch_factor`` batches of it (a docker container's
    64 MB /dev/shm holds five batches of 256 RGB images at 64 px). Past the free space a worker dies of
    SIGBUS mid-burst. Switching torch's sharing strategy to "file_system" would not help: it puts the same
    bytes in /dev/shm, only under names (it helps a process that runs out of file descriptors). A batch's
    size is one item collated and scaled to the batch size; a stream is not read ahead of its loader, and
    an item that cannot be read or collated alone is left to the loader to report.
    """
    if config.num_workers == 0 or isinstance(dataset, IterableDataset):
        return
    try:
        stats = os.statvfs(SHARED_MEMORY)
    except OSError:  # no /dev/shm (not Linux): nothing to compare with
        return
    collate = workload.collate_fn or default_collate
    try:
        batch_bytes = tensor_bytes(collate([dataset[0]])) * resolve_batch_size(config, workload)
    except Exception:  # an estimate only: the loader itself reports what is wrong with the data, with context
        return
    need = world_size * config.num_workers * config.prefetch_factor * batch_bytes
    free = stats.f_bavail * stats.f_frsize
    ranks = f"{world_size} ranks x " if world_size > 1 else ""
    text = (f"the DataLoader's workers hold ~{need / 2**20:,.0f} MiB of batches in shared memory ({ranks}"
            f"{config.num_workers} workers x prefetch_factor {config.prefetch_factor} x {batch_bytes / 2**20:,.1f} "
            f"MiB), and {SHARED_MEMORY} has {free / 2**20:,.0f} MiB free")
    if need > free:
        raise SharedMemoryTooSmall(f"{text}: the workers would die of SIGBUS. Use fewer num_workers, a smaller "
                                   "prefetch_factor or batch_size, or give the machine more shared memory "
                                   "(docker run --shm-size=2g)")
    if need > SHARED_MEMORY_WARN_SHARE * free:
        warnings.warn(f"{text}: more than {SHARED_MEMORY_WARN_SHARE:.0%} of it, and NCCL and other processes use it "
                      "too", stacklevel=2)


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor and array in a (nested) batch."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    values = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, (list, tuple)) else ()
    return sum(tensor_bytes(value) for value in values)


def _streaming(dataset: IterableDataset, workload: Workload, batch_size: int, rank: int, world_size: int,
               workers: int) -> tuple[IterableDataset, dict[str, Any]]:
    """This rank's share of a stream, batched without a sampler (a sampler would index the stream), its items keyed
    from the data seed (:class:`~accel_widgets.data.keyed.KeyedStream`).

    Full batches as for map-style data: each loader worker batches its own share, dealt out in whole batches, and
    drops its last partial batch. The generator seeds the loader workers' own generators, which keyed items no
    longer draw from.
    """
    seed = data_seed(workload)
    batching = {"batch_size": batch_size, "drop_last": True, "generator": torch.Generator().manual_seed(seed)}
    return split_stream(dataset, rank, world_size, workers, batch_size=batch_size, data_seed=seed), batching


def _batching(dataset: Dataset, workload: Workload, batch_size: int, rank: int, world_size: int,
              keyed: bool) -> dict[str, Any]:
    """How items become batches: the user's own sampler or batch sampler when they gave a DataLoader (a
    sampler is sharded per DDP rank), else a shuffle seeded by the data seed; every batch full-sized, and each
    index handed on as its key when the items are ``keyed``.

    Why full batches (drop_last): equal batch shapes keep compiled graphs and cuDNN plans valid every step.
    Why two generators: the loader draws its workers' base seed from its own each time its workers start, every
    epoch for fresh workers and once for persistent ones; a shuffle drawn from that one would then depend on
    ``persistent_workers`` from the second epoch on.
    """
    seed = data_seed(workload)
    loader_generator = torch.Generator().manual_seed(seed)
    user = workload.loader
    if user is not None and _custom_batch_sampler(user):  # DDP refused before launch
        batches = user.batch_sampler
        order = KeyedOrder(batches, batched=True) if keyed else batches
        return {"batch_sampler": ResumableSampler(order, _generators(batches, loader_generator), 1),
                "generator": loader_generator}
    if user is not None and user.sampler is not None:
        sampler: Any = user.sampler if world_size == 1 else RankShard(user.sampler, rank, world_size)
    elif world_size > 1:
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    else:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    # Resumable: a job's checkpoint notes how each epoch's order was drawn (data/resume.py); a burst never resumes.
    resumable = ResumableSampler(KeyedOrder(sampler) if keyed else sampler, _generators(sampler, loader_generator),
                                 batch_size)
    return {"batch_size": batch_size, "sampler": resumable, "drop_last": True, "generator": loader_generator}


def _generators(sampler: Any, loader_generator: torch.Generator) -> list[torch.Generator]:
    """The generators an epoch's order is drawn from: the loader's (its workers' seeds, our shuffle) and a user
    sampler's own (under a RankShard, the sampler it shares out)."""
    own = getattr(sampler.sampler if isinstance(sampler, RankShard) else sampler, "generator", None)
    return [loader_generator] + ([own] if isinstance(own, torch.Generator) and own is not loader_generator else [])


def _custom_batch_sampler(loader: DataLoader) -> bool:
    return loader.batch_size is None and loader.batch_sampler is not None


class RankShard(Sampler[int]):
    """One DDP rank's share of a user's sampler: every ``world_size``-th index of its order, from ``rank``.

    Every rank draws the same order (the sampler's own generator, or the global RNG every rank seeds the
    same), so the shares are disjoint and cover the order, as DistributedSampler's do for a shuffle.
    """

    def __init__(self, sampler: Sampler[int], rank: int, world_size: int) -> None:
        self.sampler, self.rank, self.world_size = sampler, rank, world_size

    def __iter__(self) -> Iterator[int]:
        order = list(self.sampler)
        share = len(order) // self.world_size  # equal shares: ranks must take the same number of steps
        return iter(order[self.rank::self.world_size][:share])

    def __len__(self) -> int:
        return len(self.sampler) // self.world_size


def loader_notes(workload: Workload, config: Config) -> list[str]:
    """What the knobs replaced in a user's own DataLoader, said before the burst starts.

    Raises ValueError for what cannot be kept: a custom batch sampler under DDP has no per-rank split.
    """
    user = workload.loader
    if user is None:
        return []
    if _custom_batch_sampler(user) and parallel.distributed(config):
        raise ValueError(f"your DataLoader's batch_sampler ({type(user.batch_sampler).__name__}) cannot be split "
                         "across DDP ranks: pass its dataset and a per-sample sampler, or run one rank")
    theirs = {"num_workers": user.num_workers, "pin_memory": user.pin_memory,
              "prefetch_factor": user.prefetch_factor if user.num_workers else _PREFETCH_DEFAULT,
              "persistent_workers": user.persistent_workers}
    notes = [f"{name}={value!r}" for name, value in theirs.items() if value != getattr(config, name)]
    if config.batch_size is not None and user.batch_size not in (None, config.batch_size):
        notes.append(f"batch_size={user.batch_size}")
    if not notes:
        return []
    return [f"your DataLoader's {', '.join(notes)} replaced by the knobs (the burst measures the knobs' values; "
            "its dataset, sampler, collate_fn and worker_init_fn are kept)"]


def copy_batch(batch: Any, device: torch.device, config: Config, channels_last: bool) -> Any:
    """The batch on the device the step runs on, copied as the knobs say (``channels_last`` is the system
    owner's answer for the inputs).

    Why non_blocking: from pinned memory the copy overlaps compute instead of stalling the host.
    A CPU burst's batches are already where they train (loaders yield host tensors): they are passed
    as they are, without a per-tensor ``.to`` a hand-written CPU loop would not pay either.
    """
    if device.type == "cpu" and not channels_last:
        return batch
    return _moved(batch, device, config.non_blocking, channels_last)


def _moved(obj: Any, device: torch.device, non_blocking: bool, channels_last: bool) -> Any:
    """Every tensor of a (possibly nested) batch moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        if channels_last and obj.dim() == 4 and obj.is_floating_point():
            return obj.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        return {k: _moved(v, device, non_blocking, channels_last) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_moved(v, device, non_blocking, channels_last) for v in obj)
    return obj


OWNER = Owner(group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE)
