"""Every item's random draws keyed to the item: the same batches whichever process reads them, after any resume.

Random augmentation in ``__getitem__`` draws from the generators of the process that reads the item: torch's,
Python's ``random`` and NumPy's global ones. A DataLoader seeds each worker's generators from the worker's id and
a base seed drawn when the epoch's workers start, so an item's draws depend on which worker read it and on what
that worker read before: 0, 1 or 2 workers train on other draws, and a job resumed mid-epoch (whose workers start
afresh) draws differently from one never stopped.

Here the loader's sampler hands the dataset a key per item, ``(epoch, index, position)`` (:class:`KeyedOrder`: the
epoch, the sampler's index and where in the epoch's order it is read), and :class:`KeyedItems` sets torch's CPU
generator, Python's and NumPy's from ``(data seed, epoch, index, position)`` before it reads the item. The key
travels with the index through the loader's index queue, so it reaches a persistent worker as it reaches a fresh
one; an item read again (a sampler drawing with replacement, DistributedSampler's padding) is at another position
and draws anew. Its draws are then a function of the key alone: the batches are bit-identical with any number of
workers, with or without ``persistent_workers``, with any prefetching or pinning, and after a resume at any step
(the resumed epoch's order is redrawn and its first batches skipped: :mod:`.resume`). A ``collate_fn`` that draws
(mixup in the collate) draws right after the batch's last item, from generators that item's key set: keyed too.
In the rank's own process (no workers) the generators are noted before a batch's first read and put back once it
is collated (:class:`CollateKept`), so what the model draws (dropout) does not depend on what the items drew, and a
sampler that draws its order from torch's global generator (a ``DataLoader(shuffle=True)`` without a generator)
still advances it, as it does with workers.

The ecosystem's route is torchdata's ``StatefulDataLoader``: it checkpoints each worker's RNG state and position
and restores them into as many workers. It resumes exactly only with the same worker count (the state is per
worker), and it leaves the draws depending on the worker count, so a burst with 2 workers still trains
differently from one with 0: the correctness guard could not compare a data knob exactly, and a job exported
with another worker count would not equal its burst. Keys give both, with nothing to save beyond the epoch and
the batches taken, for 8-13 us per item on a shared 2-core host (``benchmarks/keyed_items.py``); the package does
not depend on torchdata.

It is how bursts, jobs and recipes read data, not a knob: turning keys off would buy back only their microseconds
and give up what they make true (a burst equals its job and its recipe with any worker count, a resume is exact,
the guard compares the data knobs exactly); a knob that a search must never pick and the guard must treat apart
would be all cost. Datasets known to draw nothing (a ``TensorDataset``, the data caches) skip the keys instead.

Streams (``IterableDataset``) have no index: :class:`KeyedStream` sets the generators before each item it pulls,
from ``(data seed, epoch, reader, position)``, where ``reader`` is the reader among those the stream splits itself
between (0 when the tool deals the stream out: every reader then reads every item, at the same position) and
``position`` counts the items that reader has pulled this epoch.

What stays non-exact, said plainly: draws from a generator the dataset holds itself (``np.random.default_rng()``,
a ``torch.Generator`` or a ``random.Random`` it keeps: :func:`map_randomness` finds two reads under one key that
differ, and the guard then needs its noise band); draws on a CUDA generator (items are read on the CPU); and a
stream that splits itself between its loader workers or ranks: its own split decides what each reader reads and
so which items form a batch, so it resumes exactly with the same readers but another worker count reads other
batches (the guard calls such runs not comparable).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, TensorDataset, get_worker_info

#: An item's key as the sampler hands it to the dataset: (epoch, the sampler's index, position in the epoch's order).
ItemKey = tuple[int, Any, int]


def item_seed(data_seed: int, epoch: int, index: Any, position: int) -> int:
    """The 64-bit seed an item's draws start from: a digest of its key, so neighbouring keys draw unrelated
    streams. ``repr`` spells the index, so any index a sampler yields (an int, a string, a tuple) has one."""
    digest = hashlib.blake2b(f"{data_seed}:{epoch}:{index!r}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def seed_generators(seed: int) -> None:
    """torch's CPU generator, Python's ``random`` and NumPy's global generator (``np.random.*``) set from ``seed``.

    torch's default CPU generator alone, not ``torch.manual_seed``, which reseeds every CUDA generator too: in the
    rank's own process those are the model's (dropout on the GPU).
    """
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed >> 32)  # the legacy global generator takes 32 bits: the half torch's seed starts with


#: The states of torch's CPU generator, Python's ``random`` and NumPy's global generator.
GeneratorStates = tuple[torch.Tensor, Any, Any]


def generator_states() -> GeneratorStates:
    return torch.random.get_rng_state(), random.getstate(), np.random.get_state()


def restore_generators(states: GeneratorStates) -> None:
    torch.random.set_rng_state(states[0])
    random.setstate(states[1])
    np.random.set_state(states[2])


@contextlib.contextmanager
def generators_kept(seed: int | None = None) -> Iterator[None]:
    """Every generator an augmentation draws from (torch's, Python's, NumPy's) put back as it was afterwards, and
    seeded with ``seed`` meanwhile when one is given: a probe of the data must not move what training draws."""
    states = generator_states()
    if seed is not None:
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        restore_generators(states)


class KeyedReading:
    """A dataset whose reads set the reading process's generators from each item's key. Read in a rank's own process
    (no loader workers), it notes the generators before a batch's first read (:meth:`note_generators`), and its
    loader's :class:`CollateKept` puts them back once the batch is collated."""

    _noted: GeneratorStates | None = None

    def note_generators(self) -> None:
        """The generators as they are, noted once per batch, in the rank's own process only (a loader worker draws
        nothing else)."""
        if self._noted is None and get_worker_info() is None:
            self._noted = generator_states()

    def put_back_generators(self) -> None:
        if self._noted is not None:
            restore_generators(self._noted)
            self._noted = None


class CollateKept:
    """``collate`` of a keyed dataset's batch, then the generators its reads moved put back (in a loader worker, where
    nothing was noted, nothing)."""

    def __init__(self, collate: Callable[[list[Any]], Any], reading: KeyedReading) -> None:
        self.collate, self.reading = collate, reading

    def __call__(self, items: list[Any]) -> Any:
        try:
            return self.collate(items)
        finally:
            self.reading.put_back_generators()


class FixedItems:
    """A dataset whose items are stored tensors that draw nothing (the data caches): read without keys, at no cost."""


def draws_nothing(dataset: Any) -> bool:
    """Whether ``dataset`` is known to draw nothing when read: a ``TensorDataset`` itself, or stored items. Any other
    dataset may augment, and is read by keys."""
    return type(dataset) is TensorDataset or isinstance(dataset, FixedItems)


class KeyedOrder(Sampler[Any]):
    """``order`` (a sampler, or a batch sampler when ``batched``) with each index handed on as its key
    ``(epoch, index, position)``; :meth:`set_epoch` sets the epoch of the next order (and hands it on, for a
    ``DistributedSampler``)."""

    def __init__(self, order: Sampler[Any], batched: bool = False) -> None:
        self.order, self.batched, self.epoch = order, batched, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        set_epoch = getattr(self.order, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.order)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch
        if self.batched:
            position = itertools.count()
            return ([(epoch, index, next(position)) for index in batch] for batch in self.order)
        return ((epoch, index, position) for position, index in enumerate(self.order))


class KeyedItems(Dataset, KeyedReading):
    """``dataset`` read by :class:`KeyedOrder`'s keys: the generators set from the item's key, then
    ``dataset[index]``. A dataset that reads a whole batch at once (``__getitems__``: Hugging Face datasets, and
    torch's ``Subset``, which ``random_split`` makes) reads it so, from its first item's key (unique in the epoch: no
    two items share a position): the batch's draws then follow one another, the same with any workers."""

    def __init__(self, dataset: Any, data_seed: int) -> None:
        self.dataset, self.data_seed = dataset, data_seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: ItemKey) -> Any:
        epoch, index, position = key
        seed_generators(item_seed(self.data_seed, epoch, index, position))
        return self.dataset[index]

    def __getitems__(self, keys: list[ItemKey]) -> list[Any]:
        self.note_generators()
        whole_batch = getattr(self.dataset, "__getitems__", None)
        if whole_batch is None:
            return [self[key] for key in keys]
        seed_generators(item_seed(self.data_seed, *keys[0]))
        return whole_batch([index for _, index, _ in keys])


class KeyedStream(Iterable[Any]):
    """The items of ``stream`` pulled by one reader in one epoch, the generators set before each pull from
    ``(data seed, epoch, reader, position)`` (and before the stream starts, for what its ``__iter__`` draws), noted
    first by ``reading`` (put back by its collate, or here when the stream ends before a batch is full)."""

    def __init__(self, stream: Iterable[Any], data_seed: int, epoch: int, reader: int, reading: KeyedReading) -> None:
        self.stream, self.data_seed, self.epoch, self.reader, self.reading = stream, data_seed, epoch, reader, reading

    def __iter__(self) -> Iterator[Any]:
        self.reading.note_generators()
        seed_generators(item_seed(self.data_seed, self.epoch, self.reader, -1))
        items = iter(self.stream)
        for position in itertools.count():
            self.reading.note_generators()
            seed_generators(item_seed(self.data_seed, self.epoch, self.reader, position))
            try:
                item = next(items)
            except StopIteration:
                self.reading.put_back_generators()
                return
            yield item


@dataclass(frozen=True)
class DataRandomness:
    """What a rank's data draws: ``random``, two reads of an item differ (random augmentation); ``keyed``, two reads
    under one key agree, so its draws come from the generators keys set and the batches do not depend on the loader's
    workers (vacuously true for data that draws nothing). None: not known (a stream's declared split, an item that
    could not be read)."""

    random: bool | None
    keyed: bool | None


#: Nothing known about the data's draws.
UNKNOWN = DataRandomness(None, None)


def map_randomness(dataset: Any, data_seed: int) -> DataRandomness:
    """Whether a map-style dataset's items draw randomly, and from the generators a key sets: items 0 and ``n // 2``
    read by key, twice under one key and once under another's epoch, from a shallow copy (a dataset that opens a file
    on first use must not hand the loader workers the handle), every generator put back. Cheap by design, six item
    reads: an augmentation that draws on every read shows in one of them."""
    keyed = KeyedItems(copy.copy(dataset), data_seed)
    try:
        with generators_kept():
            digests = [[item_digest(keyed[(epoch, index, 0)]) for epoch in (0, 0, 1)]
                       for index in dict.fromkeys((0, len(dataset) // 2))]
    except Exception:  # an item that cannot be read alone: the loader reports it, with the user's traceback
        return UNKNOWN
    if any(first != again for first, again, _ in digests):
        return DataRandomness(True, False)
    return DataRandomness(any(first != other for first, _, other in digests), True)


def item_digest(item: Any) -> str:
    """A digest of an item's content: tensors and arrays by dtype, shape and bytes, containers by their parts."""
    digest = hashlib.sha1()
    _feed(digest, item)
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, np.ndarray):
        digest.update(f"A{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, Mapping):
        for key in sorted(value, key=repr):
            digest.update(f"K{key!r}".encode())
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"L{len(value)}".encode())
        for part in value:
            _feed(digest, part)
    elif isinstance(value, (bytes, bytearray)):
        digest.update(b"B" + bytes(value))
    else:
        digest.update(f"V{value!r}".encode())


#: What a recipe (:mod:`accel_widgets.job.recipe`) writes into the user's own code to read data as a burst does:
#: :func:`item_seed`, :func:`seed_generators`, :class:`KeyedOrder` and :class:`KeyedItems` with the same keys and
#: seeds, without accel_widgets. Its ``KeyedItems`` puts the generators back itself when read in the training process
#: (no loader workers), where a burst's loop does it around each batch: the same items and model draws, for the
#: default collate a recipe's loader uses.
KEYED_READING_CODE = '''def item_seed(data_seed, epoch, index, position):
    """The 64-bit seed an item's random draws start from: a digest of its key."""
    digest = hashlib.blake2b(f"{data_seed}:{epoch}:{index!r}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def seed_generators(seed):
    """torch's CPU generator, Python's random and NumPy's global generator set from seed."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed >> 32)


@contextlib.contextmanager
def generators_kept():
    """torch's, Python's and NumPy's generators put back afterwards."""
    states = torch.get_rng_state(), random.getstate(), numpy.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        numpy.random.set_state(states[2])


class KeyedOrder(Sampler):
    """A sampler's order with each index handed on as its key (epoch, index, position); set_epoch before each epoch
    (it hands the epoch on to a DistributedSampler)."""

    def __init__(self, order):
        self.order, self.epoch = order, 0

    def set_epoch(self, epoch):
        self.epoch = epoch
        if hasattr(self.order, "set_epoch"):
            self.order.set_epoch(epoch)

    def __len__(self):
        return len(self.order)

    def __iter__(self):
        epoch = self.epoch
        return ((epoch, index, position) for position, index in enumerate(self.order))


class KeyedItems(Dataset):
    """The dataset read by KeyedOrder's keys, each item's random draws (torch, random, NumPy) set from its key first:
    the same batches with any num_workers, persistent or not, and after a resume."""

    def __init__(self, dataset, seed):
        self.dataset, self.seed = dataset, seed

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        epoch, index, position = key
        seed_generators(item_seed(self.seed, epoch, index, position))
        return self.dataset[index]

    def __getitems__(self, keys):
        # Read in the training process (no workers), its generators are put back after: the model draws as it would.
        with generators_kept() if get_worker_info() is None else contextlib.nullcontext():
            if not hasattr(self.dataset, "__getitems__"):
                return [self[key] for key in keys]
            seed_generators(item_seed(self.seed, *keys[0]))  # a batch read at once draws from its first key
            return self.dataset.__getitems__([index for _, index, _ in keys])'''

#: The imports :data:`KEYED_READING_CODE` needs.
KEYED_READING_IMPORTS = ("import contextlib", "import hashlib", "import random", "import numpy", "import torch",
                         "from torch.utils.data import Dataset, Sampler, get_worker_info")
