"""Streaming datasets: every DDP rank and DataLoader worker reads its own share of an ``IterableDataset``.

A map-style dataset is split by its sampler (``DistributedSampler`` across ranks; the loader hands each
worker its own indices). An ``IterableDataset`` has no sampler: every rank holds a copy, every loader
worker a copy of that, and each copy replays the whole stream unless something splits it. Unsplit, N
ranks train on the same items (DDP then averages N identical gradients: 1/N of the data for N times the
work) and N workers hand the loop every item N times. So :func:`split_stream` makes sure each *reader*
(rank * workers + worker) gets its own share:

* a dataset that splits itself for a given rank (:class:`SplitsItself`, e.g. the ``data_cache="shards"``
  stream, which splits at the shard level) is told its rank;
* a webdataset pipeline splits itself where its stages say so: ``nodesplitter=wds.split_by_node`` across
  ranks, ``workersplitter=wds.split_by_worker`` (WebDataset's default) across loader workers, and
  ``resampled=True`` draws shards at random per reader. What it leaves unsplit the tool strides; a
  pipeline whose ranks would all read every shard is warned about, and WebDataset's default node splitter
  (``single_node_only``, which raises under DDP) is refused before the first step, naming the fix;
* any other stream is dealt out item by item: reader ``i`` of ``N`` keeps items ``i, i + N, ...``. Each
  reader still produces the whole stream and drops the rest, the price of splitting a stream that cannot
  seek. A stream that already splits itself by ``get_worker_info()`` is split again by this (its readers
  then skip items), so leave the splitting of a plain ``IterableDataset`` to the tool.

Batches stay full-sized as for map-style data (``drop_last``): each loader worker batches its own share.
"""

from __future__ import annotations

import sys
import warnings
from abc import abstractmethod
from collections.abc import Iterator
from itertools import islice
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info


class SplitsItself(IterableDataset):
    """A stream that reads only its own share once it knows the rank and world size it is built for."""

    @abstractmethod
    def for_rank(self, rank: int, world_size: int) -> IterableDataset:
        """A copy that reads rank ``rank``'s share, further split by loader worker when iterated in one."""


def reader(rank: int, world_size: int) -> tuple[int, int]:
    """This process's index among everything reading the stream, and how many do: one reader per loader
    worker (the rank's own process when it has none), numbered ``rank * workers + worker``."""
    info = get_worker_info()
    workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
    return rank * workers + worker, world_size * workers


class Strided(IterableDataset):
    """Every ``count``-th item of the wrapped stream from this reader's own index on, over the dimensions
    (ranks, loader workers) the stream does not already split itself."""

    def __init__(self, dataset: IterableDataset, rank: int, world_size: int, *, by_rank: bool,
                 by_worker: bool) -> None:
        self.dataset, self.rank, self.world_size = dataset, rank, world_size
        self.by_rank, self.by_worker = by_rank, by_worker

    def __iter__(self) -> Iterator[Any]:
        index, count = self._share()
        return islice(iter(self.dataset), index, None, count)

    def _share(self) -> tuple[int, int]:
        """(index, count) of this reader among those the tool splits between."""
        if self.by_rank and self.by_worker:
            return reader(self.rank, self.world_size)
        if self.by_rank:
            return self.rank, self.world_size
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)


def split_stream(dataset: IterableDataset, rank: int, world_size: int) -> IterableDataset:
    """``dataset`` as rank ``rank`` of ``world_size`` reads it: only its own share, per loader worker too."""
    if isinstance(dataset, SplitsItself):
        return dataset.for_rank(rank, world_size)
    by_rank, by_worker = _webdataset_splits(dataset, world_size)
    if by_rank and by_worker:
        return dataset
    return Strided(dataset, rank, world_size, by_rank=not by_rank, by_worker=not by_worker)


def _webdataset_splits(dataset: IterableDataset, world_size: int) -> tuple[bool, bool]:
    """Whether ``dataset`` splits itself across (ranks, loader workers): only a webdataset pipeline's
    stages can say so; any other stream splits across neither.

    Read from ``sys.modules``: a webdataset pipeline exists only where webdataset was imported, and
    importing it here for any other stream would cost every burst its import time.
    """
    wds = sys.modules.get("webdataset")
    if wds is None or not isinstance(dataset, wds.DataPipeline):
        return False, False
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
            RuntimeWarning, stacklevel=3,
        )
    return by_rank, wds.split_by_worker in stages
