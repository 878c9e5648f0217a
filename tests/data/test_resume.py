"""A resumed epoch draws the order it had and skips the batches already taken, without reading them."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, RandomSampler

from accel_widgets.data.resume import DataPosition, ResumableSampler
from accel_widgets.engine.training import EpochIterator


class CountedReads(torch.utils.data.Dataset):
    """40 items that count how often they are read."""

    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        self.reads += 1
        return index


def loader_of(dataset: CountedReads, seed: int, own_generator: bool = True) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    inner = RandomSampler(dataset, generator=generator if own_generator else None)
    return DataLoader(dataset, batch_size=4, drop_last=True, generator=generator,
                      sampler=ResumableSampler(inner, [generator], 4))


def batches(iterator: EpochIterator, count: int) -> list[list[int]]:
    return [next(iterator).tolist() for _ in range(count)]


def test_a_resumed_loader_yields_the_batches_the_interrupted_one_would_have_and_reads_only_those() -> None:
    """Stopped 3 batches into the second epoch (10 batches an epoch): the resumed loader, built from another seed,
    carries on with the 4th batch and the third epoch's order; the skipped batches are never read."""
    original = EpochIterator(loader_of(CountedReads(), seed=0))
    batches(original, 13)
    position = original.position()
    assert (position.epoch, position.batches) == (1, 3)
    expected = batches(original, 12)

    dataset = CountedReads()
    resumed = EpochIterator(loader_of(dataset, seed=99), resume_at=position)
    assert batches(resumed, 12) == expected
    assert dataset.reads == 12 * 4
    assert "first 3 batches skipped at the sampler (not read)" in resumed.resumed


def test_a_sampler_seeded_by_the_global_generator_is_redrawn_and_leaves_that_generator_alone() -> None:
    """A RandomSampler without a generator draws its seed from torch's global one as the epoch starts: a resume
    draws with the state it had then, and the global stream (what the model draws from) is left as it was."""
    torch.manual_seed(5)
    original = EpochIterator(loader_of(CountedReads(), seed=0, own_generator=False))
    batches(original, 2)
    position = original.position()
    expected = batches(original, 8)

    torch.manual_seed(123)
    before = torch.get_rng_state()
    resumed = EpochIterator(loader_of(CountedReads(), seed=0, own_generator=False), resume_at=position)
    assert batches(resumed, 8) == expected
    assert torch.equal(torch.get_rng_state(), before)  # redrawing the resumed epoch's order drew nothing from it


def test_a_stream_is_read_through_the_batches_taken_and_says_so() -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(40))

    resumed = EpochIterator(DataLoader(Stream(), batch_size=4), resume_at=DataPosition(2, 3, None))
    assert next(resumed).tolist() == [12, 13, 14, 15]
    assert resumed.position() == DataPosition(2, 4, None)
    assert "first 3 batches were read through" in resumed.resumed
