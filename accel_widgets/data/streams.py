"""Streaming datasets: every DDP rank and DataLoader worker reads its own share of an ``IterableDataset``, once.

A map-style dataset is split by its sampler (``DistributedSampler`` across ranks; the loader hands each
worker its own indices). An ``IterableDataset`` has no sampler: every rank holds a copy, every loader
worker a copy of that, and each copy replays the whole stream unless something splits it. Unsplit, N
ranks train on the same items (DDP then averages N identical gradients: 1/N of the data for N times the
work) and N workers hand the loop every item N times. Split twice -- the stream splits itself by
``get_worker_info()`` and the tool splits its share again -- each reader skips most of its own items and
half the data (or more) is never trained on. So :func:`split_stream` decides, for each of the two dimensions
(ranks, a rank's loader workers), who splits the stream, and splits only what the stream leaves unsplit:

* a dataset that says so: ``splits_itself = True`` (it reads its rank and world size, e.g. from ``RANK`` and
  ``WORLD_SIZE``, which every rank's environment holds as under torchrun, and its loader worker from
  ``get_worker_info()``), ``"ranks"``, ``"workers"``, or ``False`` (it splits nothing: the tool deals it out);
* what a library's own objects say: a webdataset pipeline's stages (``nodesplitter=wds.split_by_node`` across
  ranks, ``workersplitter=wds.split_by_worker``, WebDataset's default, across loader workers, ``resampled=True``:
  every reader draws its own shards; its default node splitter ``single_node_only``, which raises under DDP, is
  refused before the first step, naming the fix); MosaicML's ``StreamingDataset`` splits both (build it in the
  rank: pass its factory as ``Workload(dataset=lambda: StreamingDataset(...))``, since it reads the rank when it
  is built); the ``data_cache="shards"`` stream is told its rank (:class:`SplitsItself`);
* for any other stream, a probe of its first items in the rank, before the loader starts: read as worker 0 and
  as worker 1 (under a stand-in ``get_worker_info()``), a stream that asks for ``num_workers`` and hands the two
  disjoint items splits itself across workers; read by every rank (gathered over the process group), disjoint
  shares mean it splits itself across ranks. Each read starts from the same seeds, so random augmentation
  drawn from torch's, Python's or numpy's generator reads the same twice; a stream whose reads differ anyway
  cannot be judged by its items, and the tool then splits it, saying so.

What the stream leaves to the tool is dealt out in whole batches: batch ``b`` of the stream (items ``b * B`` to
``b * B + B - 1``) goes to rank ``b mod R``, and the ``j``-th of a rank's batches to its loader worker ``j mod W``.
A rank's loader takes its workers' batches in turn, so every rank trains on its batches in the stream's order
whatever its number of workers. Each such reader still reads (and decodes) the whole stream and drops the rest,
the price of splitting a stream that cannot seek: the result counts it (items read and kept per rank,
:class:`~accel_widgets.data.streams.StreamReading`) and the diagnosis points to shards. Batches stay full-sized
as for map-style data (``drop_last``): each loader worker batches its own share.

Every reader pulls the stream's items through :class:`~accel_widgets.data.keyed.KeyedStream`: its generators set
from the item's position before each pull, so random augmentation in the stream draws the same whichever reader
keeps the item. A stream the tool deals out therefore gives the same batches with any number of loader workers,
and a resumed one (read through the batches already taken) the batches it would have given; a stream that splits
itself decides by itself what each reader reads, so only the same readers read the same batches.
"""

from __future__ import annotations

import copy
import mmap
import sys
import warnings
from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal

import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils import worker as torch_worker

from .keyed import UNKNOWN, DataRandomness, KeyedReading, KeyedStream, generators_kept, item_digest

#: The attribute a stream sets to say which readers it splits between on its own (see the module docstring).
SPLITS_ITSELF = "splits_itself"
#: Items the probe reads per reader: enough that two shares of a split stream show no common item, cheap enough
#: to read a few times before the loader starts.
PROBE_ITEMS = 8
_PROBE_SEED = 20_261_201


#: Who splits a stream between its readers along one dimension (the DDP ranks, or one rank's loader workers):
#: the stream itself, the tool (each reader reads every item and keeps its share), or nobody (one reader).
SplitBy = Literal["stream", "tool", "none"]


@dataclass(frozen=True)
class StreamReading:
    """How one rank read a stream (an ``IterableDataset``): who split it between its readers, how that was known,
    and what the reading cost.

    ``known_from``: "declared" (the dataset's ``splits_itself``), "library" (a webdataset pipeline's stages,
    MosaicML's StreamingDataset, the tool's own shards), "probe" (its first items read as two readers would),
    "unknown" (the probe could not tell: the tool split it) or "none" (one reader: nothing to split).
    ``items_read`` and ``items_kept`` count what this rank's readers took from the stream and kept as their share,
    over the whole burst (warm-up and prefetched batches included); their ratio is the read amplification.
    ``readers``: the rank's readers (its loader workers, or the rank itself).
    """

    ranks: SplitBy
    workers: SplitBy
    known_from: Literal["declared", "library", "probe", "unknown", "none"]
    items_read: int = 0
    items_kept: int = 0
    readers: int = 1


class StreamSplitWarning(UserWarning):
    """What the tool found out about how a stream splits itself, and what it did about it."""


class SplitsItself(IterableDataset):
    """A stream that reads only its own share once it knows the rank and world size it is built for."""

    @abstractmethod
    def for_rank(self, rank: int, world_size: int, counts: ReadCounts) -> IterableDataset:
        """A copy that reads rank ``rank``'s share, further split by loader worker when iterated in one, counting
        what each reader reads and keeps in ``counts``."""


def reader(rank: int, world_size: int) -> tuple[int, int]:
    """This process's index among everything reading the stream, and how many do: one reader per loader
    worker (the rank's own process when it has none), numbered ``rank * workers + worker``."""
    info = get_worker_info()
    workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
    return rank * workers + worker, world_size * workers


class ReadCounts:
    """Items each reader of one rank took from the stream and kept, in memory the rank's forked loader workers
    share with it (an anonymous shared mapping: each worker writes only its own two slots)."""

    def __init__(self, workers: int) -> None:
        self._memory = mmap.mmap(-1, 16 * max(1, workers))
        self._slots = memoryview(self._memory).cast("q")

    def deal(self, items: Iterator[Any], keep: Callable[[int], bool]) -> Iterator[Any]:
        """The items at the positions ``keep`` says, every item read and every item kept counted for this reader."""
        info = get_worker_info()
        read = 2 * (info.id if info is not None else 0)
        slots = self._slots
        for position, item in enumerate(items):
            slots[read] += 1
            if keep(position):
                slots[read + 1] += 1
                yield item

    @property
    def read(self) -> int:
        return sum(self._slots[0::2])

    @property
    def kept(self) -> int:
        return sum(self._slots[1::2])


@dataclass(frozen=True)
class _Split:
    """Whether the stream splits itself across ranks and across loader workers, and how that is known; what its
    probe found its items to draw (:class:`~accel_widgets.data.keyed.DataRandomness`, unknown when not probed)."""

    by_rank: bool
    by_worker: bool
    known_from: Literal["declared", "library", "probe", "unknown", "none"]
    randomness: DataRandomness = UNKNOWN


class SplitStream(IterableDataset, KeyedReading):
    """The stream as one rank's readers read it: pulled by keys (:class:`~accel_widgets.data.keyed.KeyedStream`),
    dealt out in whole batches of ``batch_size`` across what it does not split itself, every item counted (read,
    and kept) for :meth:`reading`.

    The epoch a read keys its items by: the one :meth:`set_epoch` set (the rank's loop sets it before each epoch's
    loader starts, so fresh loader workers copy it), plus the reads this copy made since: a persistent loader
    worker holds the copy made when it started and reads one epoch after another.
    """

    def __init__(self, dataset: IterableDataset, rank: int, world_size: int, workers: int, split: _Split,
                 counts: ReadCounts, *, batch_size: int, data_seed: int, counted_by_stream: bool = False) -> None:
        self.dataset, self.rank, self.world_size, self.workers = dataset, rank, world_size, workers
        self.split, self.counts, self.counted_by_stream = split, counts, counted_by_stream
        self.batch_size, self.data_seed = batch_size, data_seed
        self.epoch, self._reads = 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._reads = epoch, 0

    def __iter__(self) -> Iterator[Any]:
        epoch, self._reads = self.epoch + self._reads, self._reads + 1
        items = iter(KeyedStream(self.dataset, self.data_seed, epoch, self._reader(), self))
        if self.counted_by_stream:
            return items
        return self.counts.deal(items, self._keeps())

    def _reader(self) -> int:
        """This reader among those the stream splits itself between (0 when the tool deals it all out: every reader
        then pulls every item, at the same position)."""
        info = get_worker_info()
        rank = self.rank if self.split.by_rank else 0
        worker, workers = (info.id, info.num_workers) if self.split.by_worker and info is not None else (0, 1)
        return rank * workers + worker

    def _keeps(self) -> Callable[[int], bool]:
        """Which positions of what this reader pulls it keeps: whole batches, batch ``b`` to rank ``b mod R`` and the
        ``j``-th of a rank's batches to its worker ``j mod W``, over the ranks and workers the tool deals to."""
        info = get_worker_info()
        rank, ranks = (0, 1) if self.split.by_rank else (self.rank, self.world_size)
        worker, workers = (0, 1) if self.split.by_worker or info is None else (info.id, info.num_workers)
        size = self.batch_size

        def keep(position: int) -> bool:
            batch = position // size
            return batch % ranks == rank and batch // ranks % workers == worker

        return keep

    def reading(self) -> StreamReading:
        """Who split the stream, how that was known, and what this rank's readers read and kept so far."""
        return StreamReading(self._who(self.split.by_rank, self.world_size),
                             self._who(self.split.by_worker, self.workers), self.split.known_from,
                             self.counts.read, self.counts.kept, max(1, self.workers))

    @staticmethod
    def _who(by_stream: bool, readers: int) -> SplitBy:
        return "none" if readers <= 1 else "stream" if by_stream else "tool"


def split_stream(dataset: IterableDataset, rank: int, world_size: int, workers: int, *, batch_size: int = 1,
                 data_seed: int = 0) -> SplitStream:
    """``dataset`` as rank ``rank`` of ``world_size`` reads it with ``workers`` loader workers: only its own
    share, each reader's once, counted, dealt out in whole batches of ``batch_size`` (1: item by item), its items
    keyed from ``data_seed``. The stream's own split is found as the module docstring says."""
    counts = ReadCounts(workers)
    if isinstance(dataset, SplitsItself):
        return SplitStream(dataset.for_rank(rank, world_size, counts), rank, world_size, workers,
                           _Split(True, True, "library"), counts, batch_size=batch_size, data_seed=data_seed,
                           counted_by_stream=True)
    split = _declared(dataset) or _library_split(dataset, world_size) or _probed(dataset, world_size, workers)
    _say_what_was_done(dataset, split, world_size, workers)
    return SplitStream(dataset, rank, world_size, workers, split, counts, batch_size=batch_size, data_seed=data_seed)


def stream_reading(dataset: Any) -> StreamReading | None:
    """How the loader's dataset was read, when it is a stream this module split; None for map-style data."""
    return dataset.reading() if isinstance(dataset, SplitStream) else None


def stream_randomness(dataset: Any) -> DataRandomness:
    """Whether the stream's items differ between reads from other seeds (random augmentation) and agree between two
    reads from the same ones (keyed), as its probe found; unknown when it was not probed (declared, a library's)."""
    return dataset.split.randomness if isinstance(dataset, SplitStream) else UNKNOWN


# -- what the stream says, or its library -------------------------------------------------------------------
def _declared(dataset: IterableDataset) -> _Split | None:
    """The split a dataset declares with ``splits_itself``; None when it declares none."""
    value = getattr(dataset, SPLITS_ITSELF, None)
    if value is None:
        return None
    if isinstance(value, bool):
        return _Split(value, value, "declared")
    parts = {value} if isinstance(value, str) else set(value) if isinstance(value, (tuple, list, set)) else {value}
    if not parts <= {"ranks", "workers"}:
        raise TypeError(
            f"{type(dataset).__name__}.{SPLITS_ITSELF}={value!r}: use True (it splits itself across DDP ranks and "
            "loader workers), 'ranks', 'workers', ('ranks', 'workers') or False (the tool splits it)")
    return _Split("ranks" in parts, "workers" in parts, "declared")


def _library_split(dataset: IterableDataset, world_size: int) -> _Split | None:
    """How a known library's stream splits itself; None for any other stream.

    Read from ``sys.modules``: such a stream exists only where its library was imported, and importing one here
    for any other stream would cost every burst its import time.
    """
    streaming = sys.modules.get("streaming")
    if streaming is not None and isinstance(dataset, getattr(streaming, "StreamingDataset", ())):
        return _Split(True, True, "library")  # it partitions its samples by World.detect(): ranks and workers
    wds = sys.modules.get("webdataset")
    if wds is not None and isinstance(dataset, wds.DataPipeline):
        return _Split(*_webdataset_splits(dataset, wds, world_size), "library")
    return None


def _webdataset_splits(dataset: IterableDataset, wds: Any, world_size: int) -> tuple[bool, bool]:
    """Whether a webdataset pipeline splits itself across (ranks, loader workers), as its stages say."""
    stages = dataset.pipeline
    if any(isinstance(stage, wds.ResampledShards) for stage in stages):
        return True, True  # every reader draws its own random shards: nothing to split
    if world_size > 1 and wds.single_node_only in stages:
        raise ValueError(
            "this WebDataset refuses to run on more than one rank (its default nodesplitter, single_node_only, "
            f"raises under DDP): build it with WebDataset(urls, nodesplitter=wds.split_by_node, ...) so that each "
            f"of the {world_size} ranks reads its own shards"
        )
    by_rank = wds.split_by_node in stages
    if world_size > 1 and not by_rank:
        warnings.warn(
            f"this webdataset pipeline has no node splitter, so each of the {world_size} ranks reads every shard; "
            "the tool keeps every rank's own items (disjoint, as DDP needs), but every rank still loads all of "
            "them. Build it with WebDataset(urls, nodesplitter=wds.split_by_node, ...) to load 1/N per rank",
            RuntimeWarning, stacklevel=4,
        )
    return by_rank, wds.split_by_worker in stages


# -- the probe ---------------------------------------------------------------------------------------------
class _WatchedWorkerInfo(torch_worker.WorkerInfo):
    """``get_worker_info()``'s answer in a loader worker, noting which of its fields the stream reads."""

    __slots__ = ("reads",)

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        object.__setattr__(self, "reads", set())

    def __getattribute__(self, name: str) -> Any:
        if name in ("id", "num_workers"):
            object.__getattribute__(self, "reads").add(name)
        return object.__getattribute__(self, name)


@contextmanager
def _as_worker(info: torch_worker.WorkerInfo | None) -> Iterator[None]:
    """``get_worker_info()`` answers ``info`` for the duration, as in a loader worker (None: the rank itself)."""
    previous = torch_worker._worker_info
    torch_worker._worker_info = info
    try:
        yield
    finally:
        torch_worker._worker_info = previous


def _prefix(dataset: IterableDataset, worker: int | None, workers: int, seed: int) -> tuple[list[str] | None, set[str]]:
    """Digests of the first ``PROBE_ITEMS`` items one reader gets (None if reading raised), and which worker fields
    it read. A shallow copy is read: a stream that opens a file on first use must not hand the loader workers an
    open handle they would then share."""
    reader_copy = copy.copy(dataset)
    info = None
    if worker is not None:
        info = _WatchedWorkerInfo(id=worker, num_workers=workers, seed=seed + worker, dataset=reader_copy)
    with generators_kept(seed), _as_worker(info):
        try:
            digests = [item_digest(item) for item in islice(iter(reader_copy), PROBE_ITEMS)]
        except Exception:  # the real loader will raise it again, with the user's traceback
            digests = None
    return digests, set(info.reads) if info is not None else set()


def _probed(dataset: IterableDataset, world_size: int, workers: int) -> _Split:
    """How the stream splits itself, read off its first items (see the module docstring), as the loader's own
    readers read it: loader worker 0 (and 1) when there are workers, else the rank itself."""
    lead = 0 if workers > 1 else None
    first, asked = _prefix(dataset, lead, workers, _PROBE_SEED)
    again, _ = _prefix(dataset, lead, workers, _PROBE_SEED)
    deterministic = first is not None and first == again
    random_data = _prefix(dataset, lead, workers, _PROBE_SEED + 1)[0] != first if deterministic else None
    decided: list[tuple[bool, bool]] = []  # (splits itself, could be told) per dimension with several readers
    if workers > 1:
        second, asked_too = _prefix(dataset, 1, workers, _PROBE_SEED)
        decided.append(_splits_by_worker(first, second, "num_workers" in asked | asked_too, deterministic))
    by_worker = bool(decided and decided[0][0])
    if world_size > 1:
        decided.append(_splits_by_rank(first, deterministic))
    by_rank = world_size > 1 and decided[-1][0]
    randomness = DataRandomness(random_data, deterministic if first is not None else None)
    if not decided:
        return _Split(False, False, "none", randomness)
    return _Split(by_rank, by_worker, "probe" if all(known for _, known in decided) else "unknown", randomness)


def _splits_by_worker(first: list[str] | None, second: list[str] | None, asked: bool,
                      deterministic: bool) -> tuple[bool, bool]:
    """(whether the stream splits itself across loader workers, whether that could be told).

    It does when it asks ``get_worker_info()`` for ``num_workers`` (nothing but a split needs it) and workers 0 and 1
    get disjoint items; a stream whose items differ between two reads anyway is judged by the question alone.
    """
    if first is None or second is None:
        return asked, False
    if not deterministic:
        return asked, True
    return asked and not set(first) & set(second), True


def _splits_by_rank(own: list[str] | None, deterministic: bool) -> tuple[bool, bool]:
    """(whether the stream splits itself across DDP ranks, whether that could be told), from every rank's first items
    gathered over the process group: disjoint shares split, equal ones do not, anything else cannot be told."""
    if not dist.is_initialized():
        return False, False
    shares: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shares, (own, deterministic))
    if not all(items is not None and same for items, same in shares):
        return False, False
    prefixes = [items for items, _ in shares]
    if all(items == prefixes[0] for items in prefixes):
        return False, True
    seen: set[str] = set()
    for items in prefixes:
        if seen & set(items):
            return False, False
        seen.update(items)
    return True, True


# -- what the result says ----------------------------------------------------------------------------------
def _say_what_was_done(dataset: IterableDataset, split: _Split, world_size: int, workers: int) -> None:
    """Warn when the tool found (or could not find) a split the dataset did not declare: never split twice, or not
    at all, silently."""
    if split.known_from not in ("probe", "unknown"):
        return
    name = type(dataset).__name__
    itself = [what for what, by_stream, readers in (("the DDP ranks", split.by_rank, world_size),
                                                    ("its DataLoader workers", split.by_worker, workers))
              if by_stream and readers > 1]
    dealt = [what for what, by_stream, readers in ((f"the {world_size} DDP ranks", split.by_rank, world_size),
                                                   (f"the {workers} loader workers", split.by_worker, workers))
             if not by_stream and readers > 1]
    declare = _declaration(split)
    if split.known_from == "unknown":
        warnings.warn(
            f"could not tell whether this stream ({name}) splits itself: two reads of its first items differ even "
            f"from the same seeds, or it raised when read as one reader, so the tool deals its items out between "
            f"{' and '.join(dealt) or 'its readers'}. If it splits itself, say so with {name}.{SPLITS_ITSELF} = "
            f"{declare!r} (or its readers skip their own items); if not, with {SPLITS_ITSELF} = False",
            StreamSplitWarning, stacklevel=4)
        return
    if not itself:
        return
    then = f"; the tool deals its items out between {' and '.join(dealt)}" if dealt else ""
    warnings.warn(
        f"this stream ({name}) splits itself between {' and '.join(itself)} (its readers' first items are disjoint"
        f"{', and it asks get_worker_info() for num_workers' if split.by_worker and workers > 1 else ''}), so the "
        f"tool left that split to it instead of splitting its share again{then}. {name}.{SPLITS_ITSELF} = "
        f"{declare!r} says so without this probe", StreamSplitWarning, stacklevel=4)


def _declaration(split: _Split) -> bool | str:
    """The ``splits_itself`` value that declares ``split`` (both dimensions when it is not known)."""
    if split.known_from == "unknown" or (split.by_rank and split.by_worker):
        return True
    return "ranks" if split.by_rank else "workers" if split.by_worker else False
