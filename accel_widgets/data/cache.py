"""The ``data_cache`` knob: materialise a dataset once so later epochs and bursts read finished items.

Every item is computed exactly once, per-item preprocessing included, and stored field by field in one
array per field: in RAM (``"memory"``) or in ``.npy`` files opened with ``numpy.memmap`` (``"memmap"``),
which later runs with the same dataset reuse without calling its ``__getitem__`` at all and which loader
workers share through the page cache instead of each holding a copy.

Items are tensors, numpy arrays or python ``int``/``float``/``bool`` values, alone or nested in plain
tuples, lists and ``str``-keyed dicts; every item must have the same structure, shapes and dtypes.
Cached items come back with the same structure, but every field is a ``torch.Tensor``: numpy fields
keep their dtype, python ``int`` becomes an int64 scalar tensor, ``float`` float64 and ``bool`` bool,
exactly what ``default_collate`` makes of them, so collated batches are identical to uncached ones.
Random augmentation is frozen to the one draw made while caching: :func:`first_random_item` reads a couple of
items twice, and :class:`CacheInfo` says which item differed (the burst's result carries it, and the correctness
guard marks the run as changing training).

The memmap cache lives in ``<cache_dir>/<fingerprint>/`` (one ``fieldK.npy`` per field plus
``meta.json``). ``"shards"`` writes the items instead as WebDataset tar shards in
``<cache_dir>/<fingerprint>.shards/`` and streams them back (:mod:`.shards`; the optional webdataset
package), to show what a sharded streaming format does to the pipeline. Both on-disk caches are built in a
private temporary directory and renamed into place, so concurrent builders never see a half-written cache;
the check-and-rename runs under an ``flock`` on ``cache_dir`` (POSIX), so a damaged cache can be replaced
without racing a writer that is placing a good one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol, cast

import numpy as np
import torch
from numpy.lib.format import open_memmap
from torch.utils.data import Dataset, IterableDataset

from .fingerprint import FingerprintError, dataset_fingerprint
from .keyed import FixedItems
from .layout import DataCacheError, Layout, check_matches, layout_of, numpy_dtype, read_item

#: Bumped whenever the on-disk layout changes; caches of another version count as damaged and are rebuilt.
FORMAT_VERSION = 1

_META = "meta.json"
_FINGERPRINT_RE = re.compile(r"[0-9A-Za-z_-][0-9A-Za-z_.-]{0,127}")


@dataclass(frozen=True)
class CacheInfo:
    """What ``cache_dataset`` did: built or reused, how long it took, what it holds, and whether it froze random
    augmentation. ``build_s`` is 0.0 when an existing cache was reused.

    ``bytes`` is the item data held (tar headers and padding excluded) for ``memory`` and ``memmap``, and the
    shard files' size for ``shards``: what the format costs on disk is part of what it does. ``frozen_item`` is
    the first item whose two reads differed (random augmentation), None when the items read the same twice:
    every cache stores one draw per item, so every epoch then trains on the same augmented items.
    """

    mode: Literal["memory", "memmap", "shards"]
    fingerprint: str
    path: str | None
    items: int
    bytes: int
    build_s: float
    reused: bool
    frozen_item: int | None = None

    def frozen_text(self) -> str:
        """What freezing did and what to do instead ("" when nothing was frozen)."""
        if self.frozen_item is None:
            return ""
        return (f"data_cache={self.mode!r} froze random augmentation: item {self.frozen_item} differs between two "
                "reads (random transforms), and the cache keeps one draw per item, so every epoch trains on the "
                "same augmented items. Faster, but it changes training")

    def summary(self) -> str:
        """``memmap, reused (2,048 items, 24 MiB)`` or ``memory, built in 1.2 s (...)``."""
        done = "reused" if self.reused else f"built in {self.build_s:.1f} s"
        return f"{self.mode}, {done} ({self.items:,} items, {self.bytes / 2**20:,.1f} MiB)"


def cache_root() -> Path:
    """``$ACCEL_WIDGETS_CACHE``, else ``~/.cache/accel_widgets``: data caches and compiled kernels, shared by runs."""
    return Path(os.environ.get("ACCEL_WIDGETS_CACHE") or Path.home() / ".cache" / "accel_widgets")


def default_cache_dir() -> Path:
    """Where materialised datasets live: ``cache_root()/data``, outside the repo."""
    return cache_root() / "data"


def cache_dataset(
    dataset: Any,
    mode: Literal["memory", "memmap", "shards"],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    fingerprint: str | None = None,
) -> tuple[Dataset, CacheInfo]:
    """Materialise ``dataset`` once and return a dataset over the finished items, plus what was done.

    ``mode="memory"`` stacks the items in RAM (``cache_dir`` unused). ``mode="memmap"`` writes them under
    ``cache_dir/<fingerprint>/`` (default :func:`default_cache_dir`) or reuses that directory when a
    previous call already built it; a damaged directory is removed and rebuilt with a warning.
    ``mode="shards"`` does the same with WebDataset tar shards in ``cache_dir/<fingerprint>.shards/`` and
    returns a stream over them (an ``IterableDataset`` that splits itself per rank and loader worker).
    ``fingerprint`` overrides :func:`dataset_fingerprint` (needed for datasets that do not pickle).
    Raises DataCacheError for variable-size or unsupported items, naming the first offending item and field.
    """
    n = _length(dataset)
    fingerprint = _fingerprint(dataset) if fingerprint is None else _checked_fingerprint(fingerprint)
    frozen = first_random_item(dataset)  # every call, a reused cache too: each run trains on the frozen draws
    if mode == "memory":
        cached, info = _cache_memory(dataset, n, fingerprint)
    elif mode in _DISK_FORMATS:
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        cached, info = _cache_on_disk(dataset, n, fingerprint, root, _disk_format(mode))
    else:
        raise DataCacheError(
            f"data_cache mode must be 'memory', 'memmap' or 'shards' ('none' means: do not cache), got {mode!r}")
    return cached, dataclasses.replace(info, frozen_item=frozen)


def _fingerprint(dataset: Any) -> str:
    """:func:`~accel_widgets.data.fingerprint.dataset_fingerprint`, failing as the cache fails, with the way out."""
    try:
        return dataset_fingerprint(dataset)
    except FingerprintError as exc:
        raise DataCacheError(f"{exc}; pass fingerprint= explicitly") from exc


# -- randomness ----------------------------------------------------------------------------------------


def first_random_item(dataset: Any) -> int | None:
    """The first of two probed indices (the first and the middle item) whose two reads differ; None if both match.

    Cheap by design, four item reads: random transforms draw on every read, so two reads of any item
    differ, while a deterministic dataset returns equal values (NaN equal to NaN) with the same structure.
    """
    n = _length(dataset)
    for index in dict.fromkeys((0, n // 2)):
        first, second = read_item(dataset, index), read_item(dataset, index)
        if first[0] != second[0] or not all(
                path == other_path and _same_tensor(a, b) for (path, a), (other_path, b) in
                zip(first[1], second[1], strict=True)):
            return index
    return None


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and values, a NaN matching a NaN (a deterministic item may hold NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


# -- items ---------------------------------------------------------------------------------------------


def _length(dataset: Any) -> int:
    """``len(dataset)``, refusing datasets that cannot be indexed 0..len-1."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise DataCacheError(
            f"data_cache needs a map-style dataset (__getitem__ + __len__), got {type(dataset).__name__}: a "
            "stream is read as it comes, so set data_cache='none' for it"
        )
    try:
        n = len(dataset)
    except TypeError as exc:
        raise DataCacheError(f"data_cache needs a dataset with __len__; {type(dataset).__name__} has none") from exc
    if n == 0:
        raise DataCacheError("data_cache cannot cache an empty dataset")
    return n


def _checked_fingerprint(fingerprint: str) -> str:
    """A fingerprint names a directory, so it must be a plain file name (no separators, no leading dot)."""
    if not _FINGERPRINT_RE.fullmatch(fingerprint):
        raise DataCacheError(f"fingerprint must match {_FINGERPRINT_RE.pattern}, got {fingerprint!r}")
    return fingerprint


def _store(storage: list[torch.Tensor], index: int, fields: list[tuple[str, torch.Tensor]]) -> None:
    """Copy one item's fields into row ``index`` of the per-field storage."""
    for out, (_, tensor) in zip(storage, fields, strict=True):
        out[index] = tensor


def _materialise(dataset: Any, n: int, layout: Layout, first: list[tuple[str, torch.Tensor]],
                 storage: list[torch.Tensor]) -> None:
    """Compute every item once, in index order, into ``storage`` (one preallocated tensor per field).

    Item 0 was already computed to size the storage, so it is stored, not computed again.
    """
    _store(storage, 0, first)
    for index in range(1, n):
        spec, fields = read_item(dataset, index)
        check_matches(layout, index, spec, fields)
        _store(storage, index, fields)


# -- memory --------------------------------------------------------------------------------------------


class _MemoryCache(Dataset, FixedItems):
    """Items served from one stacked tensor per field.

    Rows are cloned: a caller mutating an item in place cannot corrupt the cache, and a loader worker
    returning an unbatched item ships that row, not the whole backing tensor, to the main process.
    """

    def __init__(self, layout: Layout, storage: list[torch.Tensor]) -> None:
        self._layout = layout
        self._storage = storage

    def __len__(self) -> int:
        return len(self._storage[0])

    def __getitem__(self, index: int) -> Any:
        return self._layout.pack([t[index].clone() for t in self._storage])


def _cache_memory(dataset: Any, n: int, fingerprint: str) -> tuple[Dataset, CacheInfo]:
    """Materialise into RAM; nothing persists beyond the returned dataset."""
    start = time.perf_counter()
    spec, first = read_item(dataset, 0)
    layout = layout_of(spec, first)
    storage = [torch.empty((n, *f.shape), dtype=f.dtype) for f in layout.fields]
    _materialise(dataset, n, layout, first, storage)
    nbytes = sum(t.numel() * t.element_size() for t in storage)
    info = CacheInfo("memory", fingerprint, None, n, nbytes, time.perf_counter() - start, reused=False)
    return _MemoryCache(layout, storage), info


# -- memmap --------------------------------------------------------------------------------------------


class _MemmapCache(Dataset, FixedItems):
    """Items served from the ``.npy`` files of a finished cache directory.

    Pickles as its path and layout only; the memmaps open lazily on the first ``__getitem__`` in each
    process, so it travels to spawned loader workers (forked ones simply inherit open maps).
    """

    def __init__(self, path: Path, layout: Layout, n: int) -> None:
        self.path = path
        self._layout = layout
        self._n = n
        self._arrays: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> Any:
        if self._arrays is None:
            self._arrays = _open_memmaps(self.path, self._layout, self._n)
        rows = zip(self._arrays, self._layout.fields, strict=True)
        return self._layout.pack([_row_tensor(array[index], field.dtype) for array, field in rows])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None}

    @property
    def nbytes(self) -> int:
        """Bytes of item data on disk (file headers excluded)."""
        return sum(numpy_dtype(f.dtype).itemsize * self._n * int(np.prod(f.shape)) for f in self._layout.fields)


def _row_tensor(row: np.ndarray | np.generic, dtype: torch.dtype) -> torch.Tensor:
    """A private, writable tensor for one stored row.

    The copy is needed: a memmap row is a read-only view of the file, which torch cannot safely wrap (writes
    would fault), and a view would keep the whole mapping alive wherever the item travels.
    """
    return torch.from_numpy(np.array(row)).view(dtype)


def _field_file(path: Path, position: int) -> Path:
    """Fields are named by position: dict keys may not be valid file names."""
    return path / f"field{position}.npy"


def _open_memmaps(path: Path, layout: Layout, n: int) -> list[np.ndarray]:
    """Open every field file read-only, raising DataCacheError unless each has exactly the expected shape,
    dtype and size (a truncated or extended file is damage, never data)."""
    arrays = []
    for position, field in enumerate(layout.fields):
        file = _field_file(path, position)
        array = np.load(file, mmap_mode="r")
        expected = ((n, *field.shape), numpy_dtype(field.dtype))
        if (array.shape, array.dtype) != expected or array.offset + array.nbytes != file.stat().st_size:
            raise DataCacheError(f"{file} holds {array.shape} {array.dtype}, expected {expected[0]} {expected[1]}")
        arrays.append(array)
    return arrays


class _OnDisk(Protocol):
    """What an on-disk cache's dataset tells :class:`CacheInfo`: where it lives and what it holds."""

    path: Path

    @property
    def nbytes(self) -> int: ...


@dataclass(frozen=True)
class _DiskFormat:
    """One on-disk cache mode: its directory's name, how items are written into it, how a finished one opens.

    ``write(dataset, n, layout, first, tmp)`` stores every item in ``tmp``, synced to disk, and returns what
    ``meta.json`` must hold besides the layout; ``open(path, meta, layout, n)`` returns the dataset over a
    finished directory, raising OSError/ValueError/KeyError/TypeError on anything damaged.
    """

    mode: Literal["memmap", "shards"]
    suffix: str
    write: Callable[[Any, int, Layout, list[tuple[str, torch.Tensor]], Path], dict[str, Any]]
    open: Callable[[Path, dict[str, Any], Layout, int], _OnDisk]


def _load_cache(path: Path, fingerprint: str, n: int, disk: _DiskFormat) -> _OnDisk | None:
    """The finished cache at ``path``; None if there is none. A damaged one is removed with a warning.

    Call under ``_dir_lock``: removal must not race another process placing a good cache at ``path``.
    """
    if not path.exists():
        return None
    try:
        meta = json.loads((path / _META).read_text())
        if (meta["format"], meta["fingerprint"], meta["len"]) != (FORMAT_VERSION, fingerprint, n):
            raise DataCacheError("meta.json is for another format version, length or fingerprint")
        cached = disk.open(path, meta, Layout.from_json(meta), n)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        warnings.warn(f"data cache {path} is damaged ({exc}); rebuilding it", RuntimeWarning, stacklevel=4)
        shutil.rmtree(path)
        return None
    return cached


@contextlib.contextmanager
def _dir_lock(directory: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``directory`` for check-and-replace of a cache dir.

    Held only for those short steps, never while items are computed; the kernel drops it if the holder dies.
    """
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_cache(dataset: Any, n: int, fingerprint: str, tmp: Path, disk: _DiskFormat) -> None:
    """Materialise into ``tmp`` in the format's files, synced to disk, then ``meta.json`` last.

    Syncing before the rename means a crash can never leave a placed directory with unwritten data.
    """
    spec, first = read_item(dataset, 0)
    layout = layout_of(spec, first)
    extra = disk.write(dataset, n, layout, first, tmp)
    meta = {"format": FORMAT_VERSION, "fingerprint": fingerprint, "len": n, **layout.to_json(), **extra}
    with open(tmp / _META, "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _build_and_place(dataset: Any, n: int, fingerprint: str, root: Path, disk: _DiskFormat) -> _OnDisk:
    """Build in a private temp dir, then rename it into place unless a concurrent builder got there first,
    in which case theirs is used and ours discarded. The temp dir never outlives this call."""
    final = root / f"{fingerprint}{disk.suffix}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        _write_cache(dataset, n, fingerprint, tmp, disk)
        with _dir_lock(root):
            cached = _load_cache(final, fingerprint, n, disk)
            if cached is None:
                os.rename(tmp, final)
                cached = _load_cache(final, fingerprint, n, disk)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if cached is None:
        raise DataCacheError(f"data cache {final} failed its own check right after being written")
    return cached


def _cache_on_disk(dataset: Any, n: int, fingerprint: str, root: Path, disk: _DiskFormat) -> tuple[Dataset, CacheInfo]:
    """Reuse the format's directory for ``fingerprint`` under ``root`` if it is complete, else build it."""
    root.mkdir(parents=True, exist_ok=True)
    with _dir_lock(root):
        cached = _load_cache(root / f"{fingerprint}{disk.suffix}", fingerprint, n, disk)
    start, reused = time.perf_counter(), cached is not None
    if cached is None:
        cached = _build_and_place(dataset, n, fingerprint, root, disk)
    build_s = 0.0 if reused else time.perf_counter() - start
    info = CacheInfo(disk.mode, fingerprint, str(cached.path), n, cached.nbytes, build_s, reused=reused)
    return cast(Dataset, cached), info


def _write_memmap(dataset: Any, n: int, layout: Layout, first: list[tuple[str, torch.Tensor]],
                  tmp: Path) -> dict[str, Any]:
    """One ``.npy`` file per field, every item a row, flushed to disk."""
    arrays = [
        open_memmap(_field_file(tmp, k), mode="w+", dtype=numpy_dtype(f.dtype), shape=(n, *f.shape))
        for k, f in enumerate(layout.fields)
    ]
    storage = [torch.from_numpy(a).view(f.dtype) for a, f in zip(arrays, layout.fields, strict=True)]
    _materialise(dataset, n, layout, first, storage)
    for array in arrays:
        array.flush()
    return {}


def _open_memmap(path: Path, meta: dict[str, Any], layout: Layout, n: int) -> _MemmapCache:
    """The memmap dataset, once every field file has checked out."""
    _open_memmaps(path, layout, n)
    return _MemmapCache(path, layout, n)


# -- shards --------------------------------------------------------------------------------------------

#: Seeds the one shuffle of the items as they are written: the cache is keyed by the dataset alone, so its
#: order cannot depend on the workload's seed.
_SHARD_ORDER_SEED = 0


def _shards_module() -> ModuleType:
    """:mod:`.shards`, imported on first use: it needs webdataset, an optional extra."""
    try:
        from . import shards
    except ModuleNotFoundError as exc:
        if exc.name != "webdataset":
            raise
        raise DataCacheError(
            "data_cache='shards' writes WebDataset tar shards and needs the webdataset package: "
            "pip install 'accel-widgets[shards]' (or pip install webdataset)"
        ) from exc
    return shards


def _write_shards(dataset: Any, n: int, layout: Layout, first: list[tuple[str, torch.Tensor]],
                  tmp: Path) -> dict[str, Any]:
    """The items as tar shards, in one seeded shuffled order; the shard list goes into ``meta.json``.

    Why shuffle once: shards are read front to back, so a dataset stored in class order would otherwise
    give one-class batches, the reason sharded datasets are shuffled before they are written.
    """
    shards = _shards_module()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(_SHARD_ORDER_SEED)).tolist()
    item_bytes = sum(f.dtype.itemsize * math.prod(f.shape) for f in layout.fields)
    count = shards.shard_count(n, item_bytes)
    return {"shards": shards.write_shards(tmp, _items_in(dataset, order, layout, first), n, count)}


def _items_in(dataset: Any, order: list[int], layout: Layout,
              first: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """Each item's fields, computed once in ``order`` and checked against item 0 (which is not recomputed)."""
    for index in order:
        if index == 0:
            yield 0, [tensor for _, tensor in first]
            continue
        spec, fields = read_item(dataset, index)
        check_matches(layout, index, spec, fields)
        yield index, [tensor for _, tensor in fields]


def _open_shards(path: Path, meta: dict[str, Any], layout: Layout, n: int) -> _OnDisk:
    """The shard stream, once every shard meta.json lists is there with its recorded size.

    Sizes, not contents, are checked: reading every shard would cost what the cache saves, and a shard cut
    short by a crash or a full disk has the wrong size.
    """
    shards = _shards_module()
    entries = meta["shards"]
    if sum(int(entry["items"]) for entry in entries) != n:
        raise ValueError("meta.json's shards do not hold len items")
    for entry in entries:
        name = entry["name"]
        if not shards.SHARD_NAME.fullmatch(name):
            raise ValueError(f"meta.json names a shard {name!r}")
        size = (path / name).stat().st_size
        if size != entry["bytes"]:
            raise ValueError(f"{name} is {size} bytes, meta.json says {entry['bytes']}")
    nbytes = sum(int(entry["bytes"]) for entry in entries)
    return cast(_OnDisk, shards.ShardStream(path, [entry["name"] for entry in entries], layout, nbytes))


_DISK_FORMATS = {
    "memmap": _DiskFormat("memmap", "", _write_memmap, _open_memmap),
    "shards": _DiskFormat("shards", ".shards", _write_shards, _open_shards),
}


def _disk_format(mode: str) -> _DiskFormat:
    """The on-disk format of ``mode``. The shards one needs webdataset: it is imported here, before any cache
    directory is read, so that a missing package is reported as such and never taken for a damaged cache."""
    if mode == "shards":
        _shards_module()
    return _DISK_FORMATS[mode]
