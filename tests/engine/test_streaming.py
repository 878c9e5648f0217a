"""Streaming datasets: bursts without __len__, each rank and loader worker reading its own share of the stream,
and webdataset pipelines split the webdataset way, warned about or refused with the fix."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, default_collate

from accel_widgets import Config, Workload, run_burst
from accel_widgets.engine.streaming import split_stream
from accel_widgets.engine.training import EpochIterator
from tests.devices import cpu_device
from tests.workloads import TinyNet, tensors

DDP = Config(parallel="ddp", world_size=2)


class Numbered(IterableDataset):
    """``n`` (features, label, number) items in order, as a stream: no __len__, no __getitem__."""

    def __init__(self, n: int = 2048) -> None:
        self.x, self.y = tensors(n)

    def __iter__(self) -> Any:
        return ((self.x[i], self.y[i], i) for i in range(len(self.x)))


class Recording:
    """A collate_fn that appends each batch's item numbers to a file named by the process that collated it
    (a loader worker, or the rank itself without workers), then hands the loop an (input, target) pair."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, items: list[tuple[Any, Any, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        with open(self.directory / f"{os.getpid()}.txt", "a") as file:
            file.write(" ".join(str(int(number)) for _, _, number in items) + "\n")
        inputs, targets = default_collate([(x, y) for x, y, _ in items])
        return inputs, targets


def read_by_reader(directory: Path) -> list[set[int]]:
    """The item numbers each process read, one set per process."""
    return [{int(n) for n in path.read_text().split()} for path in sorted(directory.glob("*.txt"))]


def assert_dealt_out(shares: list[set[int]], readers: int) -> None:
    """Exactly ``readers`` readers, each keeping one residue of the item numbers modulo ``readers``."""
    assert len(shares) == readers
    residues = [{n % readers for n in share} for share in shares]
    assert all(len(r) == 1 for r in residues), residues
    assert set().union(*residues) == set(range(readers))


def stream_workload(directory: Path, dataset: IterableDataset | None = None, **kwargs: Any) -> Workload:
    return Workload(model=TinyNet, dataset=dataset if dataset is not None else Numbered(), loss_fn=F.cross_entropy,
                    optimizer=partial(torch.optim.AdamW, lr=1e-2), batch_size=16, collate_fn=Recording(directory),
                    name="stream", **kwargs)


def assert_trains(result: Any) -> None:
    """Finished, and the loss fell: the last three steps' mean below the first three's (one batch is noisy)."""
    losses = result.losses()
    assert result.ok, result.error
    assert sum(losses[-3:]) < sum(losses[:3]), losses


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_trains_with_each_loader_worker_reading_its_own_items(workers: int, tmp_path: Path) -> None:
    result = run_burst(stream_workload(tmp_path), Config(num_workers=workers), steps=10, isolation="inprocess",
                       device=cpu_device())
    assert_trains(result)
    assert_dealt_out(read_by_reader(tmp_path), readers=max(1, workers))


def test_ddp_ranks_and_their_workers_read_disjoint_shares_of_a_stream(tmp_path: Path) -> None:
    result = run_burst(stream_workload(tmp_path), DDP.replace(num_workers=2), steps=6, device=cpu_device())
    assert result.ok and len(result.ranks) == 2, result.error
    assert_dealt_out(read_by_reader(tmp_path), readers=4)
    assert not any("webdataset" in w for w in result.warnings)


@pytest.mark.parametrize("bound", [{"steps": 12}, {"seconds": 0.5}], ids=["steps", "seconds"])
def test_a_short_stream_restarts_each_epoch(bound: dict[str, Any], tmp_path: Path) -> None:
    """64 items make 4 batches of 16: every burst here runs several epochs of a stream that has no length."""
    result = run_burst(stream_workload(tmp_path, Numbered(64)), Config(), isolation="inprocess",
                       device=cpu_device(), **bound)
    assert result.ok, result.error
    assert sum(1 for s in result.steps if not s.warmup) * 16 > 64
    assert read_by_reader(tmp_path) == [set(range(64))]


def test_a_stream_without_one_full_batch_is_an_error_not_an_endless_loop() -> None:
    batches = EpochIterator(DataLoader(Numbered(3), batch_size=8, drop_last=True))
    with pytest.raises(ValueError, match="no batch in a whole epoch"):
        next(batches)


def test_workload_takes_streams_and_still_refuses_what_is_neither_map_style_nor_a_stream() -> None:
    assert isinstance(Workload(model=TinyNet, dataset=Numbered(), loss_fn=F.cross_entropy).dataset, Numbered)
    with pytest.raises(TypeError, match="an IterableDataset"):
        Workload(model=TinyNet, dataset=object(), loss_fn=F.cross_entropy)  # type: ignore[arg-type]


# -- webdataset pipelines --------------------------------------------------------------------------


def write_shards(directory: Path, shards: int = 8, per_shard: int = 64) -> list[str]:
    """Synthetic WebDataset shards: features (npy), a class label (cls), numbered by key."""
    x, y = tensors(shards * per_shard)
    urls = []
    for shard in range(shards):
        url = str(directory / f"train-{shard:03d}.tar")
        with wds.TarWriter(url) as writer:
            for i in range(shard * per_shard, (shard + 1) * per_shard):
                writer.write({"__key__": f"{i:06d}", "x.npy": x[i].numpy(), "cls": int(y[i])})
        urls.append(url)
    return urls


def pipeline(urls: list[str], **kwargs: Any) -> wds.WebDataset:
    """The usual user pipeline: decode, then (input, target, key) tuples."""
    return wds.WebDataset(urls, shardshuffle=False, **kwargs).decode().to_tuple("x.npy", "cls", "__key__")


def keys(dataset: IterableDataset) -> list[int]:
    return [int(key) for _, _, key in dataset]


@pytest.mark.parametrize("splitting", [{"nodesplitter": wds.split_by_node}, {"resampled": True}],
                         ids=["split_by_node", "resampled"])
def test_a_webdataset_that_splits_itself_is_left_to_do_so(splitting: dict[str, Any], tmp_path: Path) -> None:
    dataset = pipeline(write_shards(tmp_path, shards=2, per_shard=4), **splitting)
    assert split_stream(dataset, 1, 2) is dataset


def test_a_webdataset_without_a_worker_splitter_is_dealt_out_to_loader_workers(tmp_path: Path) -> None:
    dataset = pipeline(write_shards(tmp_path, shards=2, per_shard=4), workersplitter=None)
    read = DataLoader(split_stream(dataset, 0, 1), batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert sorted(int(key) for _, _, key in read) == list(range(8))  # each item once, not once per worker


def test_a_webdataset_with_its_default_node_splitter_is_refused_under_ddp_naming_the_fix(tmp_path: Path) -> None:
    dataset = pipeline(write_shards(tmp_path, shards=2, per_shard=4))
    with pytest.raises(ValueError, match=r"nodesplitter=wds.split_by_node"):
        split_stream(dataset, 0, 2)
    assert keys(split_stream(dataset, 0, 1)) == list(range(8))  # one rank: nothing to split


def test_a_webdataset_without_a_node_splitter_is_split_per_rank_with_a_warning(tmp_path: Path) -> None:
    dataset = pipeline(write_shards(tmp_path, shards=2, per_shard=4), nodesplitter=None)
    with pytest.warns(RuntimeWarning, match="each of the 2 ranks reads every shard"):
        shares = [keys(split_stream(dataset, rank, 2)) for rank in range(2)]
    assert shares == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_a_users_webdataset_trains_under_ddp_with_workers_each_reading_its_own_shards(tmp_path: Path) -> None:
    urls = write_shards(tmp_path, shards=8, per_shard=64)
    record = tmp_path / "read"
    record.mkdir()
    workload = stream_workload(record, pipeline(urls, nodesplitter=wds.split_by_node))
    result = run_burst(workload, DDP.replace(num_workers=2), steps=6, device=cpu_device())
    assert result.ok, result.error
    shares = read_by_reader(record)
    assert len(shares) == 4  # 2 ranks x 2 workers
    shards_read = [{n // 64 for n in share} for share in shares]  # whole shards, none read twice
    assert all(not a & b for i, a in enumerate(shards_read) for b in shards_read[i + 1:])
