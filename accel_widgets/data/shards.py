"""WebDataset tar shards, the on-disk format of ``data_cache="shards"``: written once, streamed back.

Why a sharded format: large datasets are stored as many tar files read front to back -- sequential
reads that network disks and object stores serve fast, no random access, each rank and loader worker
streaming whole shards of its own. Writing the user's own items that way lets a burst show what the
format does to their pipeline: tar parsing and per-item decoding in the loader, shard-level splitting
across readers, and a fixed order (shuffled once, when written) in place of a fresh shuffle per epoch.

One item is one tar sample: its key is the item's dataset index and each field is a member ``<key>.f<k>``
holding the field's raw bytes, decoded with the cache's layout (shape and dtype per field), so every
dtype, bfloat16 and float8 included, comes back bit-exact. Needs the optional ``webdataset`` package
(``pip install 'accel-widgets[shards]'``). The caching around the shards -- fingerprints, ``meta.json``,
the build-and-rename, damage checks -- is :mod:`.datacache`'s; this module only writes and reads them.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import webdataset as wds
from torch.utils.data import IterableDataset
from webdataset.tariterators import group_by_keys, tar_file_expander

from .streams import ReadCounts, SplitsItself, reader

if TYPE_CHECKING:
    from .layout import Field, Layout

#: Target size of one shard. Real datasets use 100 MB - 1 GB shards; a burst's datasets are smaller.
SHARD_BYTES = 64 << 20
#: At least this many shards (while there are as many items), so that ranks x loader workers can each
#: stream whole shards of their own instead of all reading every shard.
MIN_SHARDS = 16
SHARD_NAME = re.compile(r"shard-[0-9]{6}\.tar")


def shard_count(items: int, item_bytes: int) -> int:
    """How many shards ``items`` items of ``item_bytes`` bytes are written into: about SHARD_BYTES each,
    at least MIN_SHARDS, at most one per item."""
    return min(items, max(MIN_SHARDS, math.ceil(items * item_bytes / SHARD_BYTES)))


def write_shards(directory: Path, items: Iterable[tuple[int, list[torch.Tensor]]], n: int,
                 shards: int) -> list[dict[str, Any]]:
    """Write the ``n`` ``(index, fields)`` items, in the order given, into ``shards`` tar files of consecutive
    items (sizes differ by one item at most), each synced to disk before the next; returns each shard's
    name, item count and size, for meta.json."""
    items = iter(items)
    entries = []
    for shard in range(shards):
        count = (shard + 1) * n // shards - shard * n // shards
        name = f"shard-{shard:06d}.tar"
        with open(directory / name, "wb") as file:
            with wds.TarWriter(file, encoder=False) as writer:
                for index, fields in islice(items, count):
                    writer.write(_sample(index, fields))
            file.flush()
            os.fsync(file.fileno())
        entries.append({"name": name, "items": count, "bytes": (directory / name).stat().st_size})
    return entries


def _sample(index: int, fields: list[torch.Tensor]) -> dict[str, Any]:
    """One item as a tar sample: raw bytes per field, in the field's own dtype."""
    sample: dict[str, Any] = {"__key__": f"{index:010d}"}
    for position, tensor in enumerate(fields):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        sample[f"f{position}"] = flat.view(torch.uint8).numpy().tobytes()
    return sample


class ShardStream(SplitsItself):
    """The items of a finished shard directory, streamed; picklable as its path and layout.

    With at least as many shards as readers (ranks x loader workers), each reader streams whole shards
    of its own (shard ``k`` goes to reader ``k mod readers``), the webdataset way; with fewer, every
    reader streams all shards and keeps every ``readers``-th item, so the shares stay disjoint.
    """

    def __init__(self, path: Path, shards: list[str], layout: Layout, nbytes: int, rank: int = 0,
                 world_size: int = 1, counts: ReadCounts | None = None) -> None:
        self.path, self.shards, self.layout, self.nbytes = path, shards, layout, nbytes
        self.rank, self.world_size, self.counts = rank, world_size, counts

    def for_rank(self, rank: int, world_size: int, counts: ReadCounts) -> IterableDataset:
        return ShardStream(self.path, self.shards, self.layout, self.nbytes, rank, world_size, counts)

    def __iter__(self) -> Iterator[Any]:
        index, readers = reader(self.rank, self.world_size)
        whole_shards = len(self.shards) >= readers
        items = map(self._decode, _samples(self.path, self.shards[index::readers] if whole_shards else self.shards))
        if self.counts is None:
            return items if whole_shards else islice(items, index, None, readers)
        if whole_shards:
            return self.counts.deal(items, lambda position: True)
        return self.counts.deal(items, lambda position: position % readers == index)

    def _decode(self, sample: dict[str, Any]) -> Any:
        fields = self.layout.fields
        return self.layout.pack([_tensor(sample[f"f{k}"], field) for k, field in enumerate(fields)])


def _samples(path: Path, shards: list[str]) -> Iterator[dict[str, Any]]:
    """The tar samples of each shard in turn, read with webdataset's own tar iterators.

    The files are opened here rather than by ``wds.WebDataset``, whose opener leaves each one for the
    garbage collector: here a shard is closed once read, or when the stream is dropped mid-shard.
    """
    for name in shards:
        url = str(path / name)
        with open(url, "rb") as stream:
            yield from group_by_keys(tar_file_expander([{"url": url, "stream": stream}]))


def _tensor(data: bytes, field: Field) -> torch.Tensor:
    """A field back from its bytes: a private, writable tensor of the stored shape and dtype."""
    if not data:  # an empty field (a zero-size dimension); frombuffer refuses empty buffers
        return torch.empty(field.shape, dtype=field.dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(field.dtype).reshape(field.shape)
