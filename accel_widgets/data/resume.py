"""Where a loader is in its data, so that a job stopped mid-epoch carries on with the very batch it would have read.

A DataLoader draws each epoch's order when the epoch starts: a shuffle from its generator (a sampler built without
one draws a seed from torch's global generator), a DistributedSampler's from its seed and epoch number, a user's
sampler from whatever it holds. :class:`ResumableSampler` wraps the sampler (or batch sampler) a loader reads and
notes the states of those generators as each epoch's order is drawn. A job's checkpoint keeps that
:class:`EpochStart` with the epoch number and the batches taken in it (:class:`DataPosition`); resumed from it, the
sampler draws the same order again and skips the batches already taken at the index level, so no item is read for
them, and the generators carry on from where the interrupted run had them after that draw.

Random augmentation resumes exactly too, in loader workers as in the rank's own process: each item's draws are
keyed to its (epoch, index, position) (:mod:`.keyed`), which a resumed epoch hands it again, whatever state a
resumed epoch's fresh workers start from. Only what :mod:`.keyed` says stays unkeyed draws differently (a generator
the dataset holds itself). A stream (``IterableDataset``) has no sampler: a resumed stream is read through the
batches already taken, its items keyed by their positions.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Sampler


@dataclass(frozen=True)
class EpochStart:
    """The states of the generators an epoch's order was drawn from, just before it was drawn: the sampler's own
    generators (the loader's, a user sampler's) and torch's global one."""

    generators: tuple[torch.Tensor, ...]
    global_rng: torch.Tensor


@dataclass(frozen=True)
class DataPosition:
    """Where a rank is in its data between two steps: ``epoch`` (0 first), ``batches`` taken in it, and how that
    epoch's order was drawn (None for a stream, whose order is the stream's own)."""

    epoch: int
    batches: int
    start: EpochStart | None


class ResumableSampler(Sampler[Any]):
    """``inner`` as it is, noting how each epoch's order is drawn; after :meth:`resume`, the next epoch is the one
    that position was in, its first batches skipped without reading them.

    ``per_batch``: how many of ``inner``'s elements make one batch (the batch size for a sampler of indices, 1 for a
    batch sampler). ``generators``: the generators ``inner`` and the loader draw an epoch's order from; torch's
    global generator is noted too, for samplers that seed themselves from it.
    """

    def __init__(self, inner: Sampler[Any], generators: Sequence[torch.Generator], per_batch: int) -> None:
        self.inner, self.generators, self.per_batch = inner, tuple(generators), per_batch
        self.epoch_start: EpochStart | None = None
        self._resume: tuple[EpochStart, int] | None = None

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """A DistributedSampler draws its order from its seed and the epoch number: handed on."""
        set_epoch = getattr(self.inner, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def resume(self, start: EpochStart, batches: int) -> None:
        """Make the next epoch this sampler starts the one that began at ``start``, ``batches`` batches in."""
        if len(start.generators) != len(self.generators):
            raise ValueError(f"the checkpoint's data position holds {len(start.generators)} generator states and this "
                             f"loader draws from {len(self.generators)}: it was written for another data pipeline")
        self._resume = (start, batches)

    def __iter__(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        if resume is None:
            start = EpochStart(tuple(g.get_state() for g in self.generators), torch.get_rng_state())
            skip = 0
        else:
            start, skip = resume[0], resume[1] * self.per_batch
            for generator, state in zip(self.generators, start.generators, strict=True):
                generator.set_state(state)
        self.epoch_start = start
        with _global_rng(start.global_rng if resume is not None else None):
            indices = iter(self.inner)
            first = list(itertools.islice(indices, 1))  # a sampler has drawn its order by its first element
        yield from itertools.islice(itertools.chain(first, indices), skip, None)


@contextlib.contextmanager
def _global_rng(state: torch.Tensor | None) -> Iterator[None]:
    """torch's global generator set to ``state`` for the duration and put back after (nothing for None): a resumed
    epoch's order is drawn as it was, and the stream the model draws from stays where the checkpoint put it."""
    if state is None:
        yield
        return
    saved = torch.get_rng_state()
    torch.set_rng_state(state)
    try:
        yield
    finally:
        torch.set_rng_state(saved)
