"""Every item's random draws keyed to the item: the same batches with any loader workers, persistent or not, after a
resume at any batch, for map-style data and for streams the tool deals out; the recipe's copy of the helpers draws
as the package's does."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    TensorDataset,
    default_collate,
)

from accel_widgets.data.keyed import (
    KEYED_READING_CODE,
    KEYED_READING_IMPORTS,
    CollateKept,
    DataRandomness,
    KeyedItems,
    KeyedOrder,
    draws_nothing,
    item_seed,
    map_randomness,
)
from accel_widgets.data.resume import ResumableSampler
from accel_widgets.data.streams import split_stream
from accel_widgets.engine.training import EpochIterator

SEED = 7


class Drawing(Dataset):
    """24 items, each drawing from torch's, Python's and NumPy's generators: the three an augmentation uses."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), torch.rand(()).item(), random.random(), np.random.random()])


class DrawingBatches(Drawing):
    """Reads a batch at once, as Hugging Face datasets do (one draw for the batch)."""

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        noise = torch.rand(len(indices))
        return [torch.tensor([float(index), float(value)]) for index, value in zip(indices, noise, strict=True)]


class OwnGenerator(Drawing):
    """Draws from a generator it holds: no key reaches it."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), torch.rand((), generator=self.generator).item()])


def loader(dataset: Dataset, workers: int, persistent: bool = False, batch_size: int = 4,
           global_shuffle: bool = False) -> DataLoader:
    """As knobs/data.py builds one: a seeded shuffle (or, ``global_shuffle``, one that draws its seed from torch's
    global generator, as ``DataLoader(shuffle=True)`` does), keys, resumable, its own generator for the workers'
    seeds, the collate putting back what reading moved."""
    sampler = RandomSampler(dataset, generator=None if global_shuffle else torch.Generator().manual_seed(SEED))
    loader_generator = torch.Generator().manual_seed(SEED)
    generators = [loader_generator] + ([] if global_shuffle else [sampler.generator])
    keyed = KeyedItems(dataset, SEED)
    return DataLoader(keyed, batch_size=batch_size, drop_last=True, num_workers=workers,
                      sampler=ResumableSampler(KeyedOrder(sampler), generators, batch_size),
                      collate_fn=CollateKept(default_collate, keyed), generator=loader_generator,
                      persistent_workers=persistent and workers > 0,
                      multiprocessing_context="fork" if workers else None)


def batches(iterator: EpochIterator, count: int) -> list[torch.Tensor]:
    return [next(iterator) for _ in range(count)]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def uninterrupted() -> list[torch.Tensor]:
    """Three and a half epochs of 6 batches, read in this process."""
    return batches(EpochIterator(loader(Drawing(), 0)), 21)


@pytest.mark.parametrize(("workers", "persistent"), [(1, False), (2, False), (2, True), (8, True)])
def test_any_number_of_loader_workers_persistent_or_not_reads_the_same_batches(
        workers: int, persistent: bool, uninterrupted: list[torch.Tensor]) -> None:
    assert same(batches(EpochIterator(loader(Drawing(), workers, persistent)), 21), uninterrupted)


def test_a_shuffle_from_the_global_generator_still_draws_from_it_with_or_without_workers() -> None:
    """The sampler draws its order outside the items' reads, so it advances torch's global generator with no
    workers as with two: each epoch a new order, the same either way."""
    def epochs(workers: int) -> list[list[int]]:
        torch.manual_seed(3)
        read = batches(EpochIterator(loader(Drawing(), workers, global_shuffle=True)), 18)
        return [sorted(int(row[0]) for batch in read[epoch * 6:epoch * 6 + 3] for row in batch) for epoch in range(3)]

    orders = epochs(0)
    assert orders == epochs(2) and len({tuple(order) for order in orders}) == 3


def test_the_epochs_draw_anew_and_the_training_process_keeps_its_generators(uninterrupted: list[torch.Tensor]) -> None:
    """Reading in this process (no workers) leaves torch's, Python's and NumPy's generators where they were: the
    model draws as it would without data; and each epoch's items draw afresh (not the previous epoch's draws)."""
    by_item: dict[int, set[float]] = {}
    for batch in uninterrupted:
        for row in batch:
            by_item.setdefault(int(row[0]), set()).add(float(row[1]))
    assert all(len(draws) >= 3 for draws in by_item.values())  # 3+ epochs, as many draws

    before = torch.get_rng_state(), random.getstate(), np.random.get_state()
    batches(EpochIterator(loader(Drawing(), 0)), 8)
    after = torch.get_rng_state(), random.getstate(), np.random.get_state()
    assert torch.equal(after[0], before[0]) and after[1] == before[1]
    assert all(np.array_equal(a, b) for a, b in zip(after[2], before[2], strict=True))


@pytest.mark.parametrize("stop", [1, 5, 8, 15])  # inside epochs 0, 0, 1 and 2 (6 batches an epoch)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_at_any_batch_reads_what_the_uninterrupted_loader_read(
        stop: int, workers: int, uninterrupted: list[torch.Tensor]) -> None:
    first = EpochIterator(loader(Drawing(), workers, persistent=True))
    batches(first, stop)
    resumed = EpochIterator(loader(Drawing(), workers, persistent=True), resume_at=first.position())
    assert same(batches(resumed, 21 - stop), uninterrupted[stop:])


def test_a_dataset_that_reads_whole_batches_draws_from_each_batchs_first_key() -> None:
    reference = batches(EpochIterator(loader(DrawingBatches(), 0)), 12)
    assert same(batches(EpochIterator(loader(DrawingBatches(), 2)), 12), reference)
    assert len({float(batch[0, 1]) for batch in reference}) == 12  # a draw per batch


def test_keys_carry_the_epoch_and_where_in_the_order_an_index_is_read() -> None:
    order = KeyedOrder(DistributedSampler(range(8), num_replicas=2, rank=1, shuffle=True, seed=3))
    first = list(order)
    order.set_epoch(1)
    second = list(order)
    assert [key[0] for key in first] == [0] * 4 and [key[0] for key in second] == [1] * 4
    assert [key[2] for key in second] == [0, 1, 2, 3]
    assert [key[1] for key in first] != [key[1] for key in second]  # the epoch reached the DistributedSampler
    batched = KeyedOrder([[5, 5], [2, 7]], batched=True)  # type: ignore[arg-type]
    assert list(batched) == [[(0, 5, 0), (0, 5, 1)], [(0, 2, 2), (0, 7, 3)]]  # an index read twice draws twice


def test_what_the_probe_finds_the_items_draw() -> None:
    assert map_randomness(Drawing(), SEED) == DataRandomness(True, True)
    assert map_randomness(OwnGenerator(), SEED) == DataRandomness(True, False)
    assert map_randomness(TensorDataset(torch.arange(4.0)), SEED) == DataRandomness(False, True)

    class Unreadable(Drawing):
        def __getitem__(self, index: int) -> torch.Tensor:
            raise OSError("the file is gone")

    assert map_randomness(Unreadable(), SEED) == DataRandomness(None, None)
    assert draws_nothing(TensorDataset(torch.arange(4.0))) and not draws_nothing(Drawing())


def test_the_recipes_helpers_key_and_draw_as_the_package_does() -> None:
    """The code a recipe pastes (no accel_widgets in it) seeds from the same key and reads the same items, one by one
    and a batch at once; read in the training process it puts the generators back itself."""
    namespace: dict[str, Any] = {}
    exec(compile("\n".join([*KEYED_READING_IMPORTS, KEYED_READING_CODE]), "<recipe>", "exec"), namespace)
    assert "accel_widgets" not in KEYED_READING_CODE
    for key in [(0, 3, 0), (2, 17, 5), (1, "a", 4)]:
        assert namespace["item_seed"](SEED, *key) == item_seed(SEED, *key)
    for dataset in (Drawing(), DrawingBatches()):
        theirs = namespace["KeyedItems"](dataset, SEED)
        ours = KeyedItems(dataset, SEED)
        keys = list(namespace["KeyedOrder"](range(24)))[:6]
        assert keys == list(KeyedOrder(range(24)))[:6]  # type: ignore[arg-type]
        torch.manual_seed(1)
        expected = torch.rand(1)
        torch.manual_seed(1)
        assert same(theirs.__getitems__(keys), ours.__getitems__(keys))
        assert not torch.equal(torch.rand(1), expected)  # ours leaves that to the loop: the recipe's keeps them
        torch.manual_seed(1)
        theirs.__getitems__(keys)
        assert torch.equal(torch.rand(1), expected)


class Stream(IterableDataset):
    """A stream of 40 items that augments from torch's generator and does not split itself."""

    splits_itself = False

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (torch.tensor([float(i), torch.rand(()).item()]) for i in range(40))


def stream_loader(workers: int, persistent: bool = False) -> DataLoader:
    dataset = split_stream(Stream(), 0, 1, workers, batch_size=4, data_seed=SEED)
    return DataLoader(dataset, batch_size=4, drop_last=True, num_workers=workers,
                      persistent_workers=persistent and workers > 0, generator=torch.Generator().manual_seed(SEED),
                      multiprocessing_context="fork" if workers else None)


@pytest.fixture(scope="module")
def stream_reference() -> list[torch.Tensor]:
    return batches(EpochIterator(stream_loader(0)), 25)  # two and a half epochs of 10 batches


@pytest.mark.parametrize(("workers", "persistent"), [(1, False), (2, False), (4, True)])
def test_a_stream_the_tool_deals_out_reads_the_same_batches_with_any_workers(
        workers: int, persistent: bool, stream_reference: list[torch.Tensor]) -> None:
    assert same(batches(EpochIterator(stream_loader(workers, persistent)), 25), stream_reference)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_stream_is_read_through_to_the_batches_it_would_have_given(
        workers: int, stream_reference: list[torch.Tensor]) -> None:
    first = EpochIterator(stream_loader(workers, persistent=True))
    batches(first, 13)
    resumed = EpochIterator(stream_loader(workers, persistent=True), resume_at=first.position())
    assert same(batches(resumed, 12), stream_reference[13:])
    assert {float(row[1]) for row in stream_reference[3]} != {float(row[1]) for row in stream_reference[13]}
