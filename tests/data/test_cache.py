"""data_cache: cached items equal the original ones; memmap and shard caches are reused, shared, atomic and
self-healing; shards stream each rank and loader worker its own items."""

from __future__ import annotations

import os
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate

from accel_widgets import BurstOptions, Config, run_burst
from accel_widgets.data.cache import CacheInfo, cache_dataset, dataset_fingerprint
from accel_widgets.data.layout import DataCacheError

MODES = ("memory", "memmap")


class Images(Dataset):
    """Image-like float32 tensor, int64 label tensor, python int, python float and a uint8 numpy mask per item.

    ``calls`` counts ``__getitem__`` so tests can tell computing an item from reading a cached one.
    """

    def __init__(self, n: int = 24, seed: int = 0) -> None:
        self.n, self.seed, self.calls = n, seed, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int, float, np.ndarray]:
        self.calls += 1
        g = torch.Generator().manual_seed(self.seed * 100_003 + index)
        image = torch.rand(3, 8, 8, generator=g)
        label = torch.randint(0, 10, (), generator=g)
        mask = (torch.rand(8, generator=g) > 0.5).numpy().astype(np.uint8)
        return image, label, index, index / 3, mask


class Ragged(Images):
    """Item 5's image is narrower: the kind of dataset data_cache must refuse."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int, float, np.ndarray]:
        image, *rest = super().__getitem__(index)
        return (image[:, :, :7] if index == 5 else image, *rest)


class Nested(Dataset):
    """Dict inputs inside a tuple, as tokenizers produce, with bfloat16 and float8 fields numpy cannot hold."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple[dict[str, torch.Tensor], list[Any]]:
        values = torch.linspace(-3, 3, 4) * (index + 1)
        inputs = {"ids": torch.arange(4) + index, "weights": values.to(torch.bfloat16)}
        return inputs, [values.to(torch.float8_e4m3fn), index % 2 == 0]


class Failing(Images):
    """Raises part-way through materialisation, as a buggy user dataset would."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int, float, np.ndarray]:
        if index == 5:
            raise RuntimeError("boom at 5")
        return super().__getitem__(index)


class Rendezvous(Images):
    """Each builder waits at its last item until the other arrives, so both are mid-build at the same time."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__(n=8)
        self.barrier = barrier

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int, float, np.ndarray]:
        if index == self.n - 1:
            self.barrier.wait(timeout=30)
        return super().__getitem__(index)


def assert_same(actual: Any, expected: Any) -> None:
    """Same nesting, same container types, and bit-identical tensors of the same dtype."""
    assert type(actual) is type(expected)
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same(actual[key], expected[key])
    else:
        assert actual.dtype == expected.dtype
        assert torch.equal(actual.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8))


def assert_matches(cached: Dataset, original: Dataset) -> None:
    """Item for item, the cached dataset collates to exactly what the original collates to."""
    assert len(cached) == len(original)
    for index in range(len(original)):
        assert_same(default_collate([cached[index]]), default_collate([original[index]]))


def entries(directory: Path) -> list[str]:
    """What a cache directory holds, hidden temp dirs included."""
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("mode", MODES)
def test_cached_items_equal_the_original(mode: str, tmp_path: Path) -> None:
    cached, info = cache_dataset(Images(), mode, tmp_path)  # type: ignore[arg-type]
    assert_matches(cached, Images())
    assert (info.mode, info.items, info.reused) == (mode, 24, False)
    assert info.bytes == 24 * (3 * 8 * 8 * 4 + 8 + 8 + 8 + 8)
    assert (info.path is None) == (mode == "memory")


@pytest.mark.parametrize("mode", MODES)
def test_fields_become_tensors_with_the_dtypes_default_collate_gives(mode: str, tmp_path: Path) -> None:
    cached, _ = cache_dataset(Images(), mode, tmp_path)  # type: ignore[arg-type]
    image, label, index, third, mask = cached[4]
    assert [t.dtype for t in (image, label, index, third, mask)] == [
        torch.float32, torch.int64, torch.int64, torch.float64, torch.uint8,
    ]
    assert (index.item(), third.item(), image.shape, mask.shape) == (4, 4 / 3, (3, 8, 8), (8,))


def test_memmap_reuses_an_existing_cache_without_computing_items(tmp_path: Path) -> None:
    _, first = cache_dataset(Images(), "memmap", tmp_path)
    again = Images()
    cached, info = cache_dataset(again, "memmap", tmp_path)
    assert (info.reused, info.build_s, info.path, info.bytes) == (True, 0.0, first.path, first.bytes)
    assert first.build_s > 0.0 and not first.reused
    assert_matches(cached, Images())
    assert again.calls < len(again)  # a probe may read an item or two; the items are not computed again


def test_fingerprint_identifies_the_dataset_definition() -> None:
    dataset = Images(seed=1)
    assert dataset_fingerprint(dataset) == dataset_fingerprint(dataset)
    assert dataset_fingerprint(Images(seed=1)) == dataset_fingerprint(Images(seed=1))
    assert dataset_fingerprint(Images(seed=2)) != dataset_fingerprint(Images(seed=1))
    assert dataset_fingerprint(Images(n=23, seed=1)) != dataset_fingerprint(Images(seed=1))
    assert len(dataset_fingerprint(dataset)) == 64


def test_memmap_cache_feeds_dataloader_workers(tmp_path: Path) -> None:
    memmap, _ = cache_dataset(Images(), "memmap", tmp_path)
    memory, _ = cache_dataset(Images(), "memory")
    from_workers = list(DataLoader(memmap, batch_size=5, num_workers=2))
    in_process = list(DataLoader(memory, batch_size=5))
    assert len(from_workers) == len(in_process) == 5
    for got, want in zip(from_workers, in_process, strict=True):
        assert_same(got, want)


def test_memmap_dataset_pickles_as_a_path_not_its_data(tmp_path: Path) -> None:
    cached, info = cache_dataset(Images(n=256), "memmap", tmp_path)
    cached[0]  # opens the maps in this process
    payload = pickle.dumps(cached)
    assert len(payload) < info.bytes / 10
    assert_same(pickle.loads(payload)[7], cached[7])


@pytest.mark.parametrize("mode", MODES)
def test_variable_size_items_are_refused_naming_the_item(mode: str, tmp_path: Path) -> None:
    with pytest.raises(DataCacheError, match=r"fixed-shape items: item 5 field \[0\] is \(3, 8, 7\)"):
        cache_dataset(Ragged(), mode, tmp_path)  # type: ignore[arg-type]
    assert entries(tmp_path) == []


def test_unsupported_fields_are_refused_naming_the_item() -> None:
    with pytest.raises(DataCacheError, match=r"item 0 field \[1\]: str;"):
        cache_dataset([(torch.zeros(2), "label")], "memory")
    with pytest.raises(DataCacheError, match=r"item 1 field \(the whole item\): numpy object;"):
        cache_dataset([np.zeros(2), np.array([None, 1])], "memory")
    with pytest.raises(DataCacheError, match=r"item 0: dict field \[0\] has non-str keys"):
        cache_dataset([({1: torch.zeros(2)},)], "memory")


def test_a_failing_dataset_leaves_no_cache_behind(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom at 5"):
        cache_dataset(Failing(), "memmap", tmp_path)
    assert entries(tmp_path) == []


def _truncate_a_field(path: Path) -> None:
    file = path / "field0.npy"
    file.write_bytes(file.read_bytes()[:-100])


def _garble_meta(path: Path) -> None:
    (path / "meta.json").write_text("{not json")


def _drop_a_field(path: Path) -> None:
    (path / "field4.npy").unlink()


def _misdescribe_a_field(path: Path) -> None:
    meta = (path / "meta.json").read_text()
    (path / "meta.json").write_text(meta.replace('"float32"', '"int32"'))


@pytest.mark.parametrize("damage", [_truncate_a_field, _garble_meta, _drop_a_field, _misdescribe_a_field])
def test_a_damaged_cache_is_detected_and_rebuilt(damage: Any, tmp_path: Path) -> None:
    _, info = cache_dataset(Images(), "memmap", tmp_path)
    assert info.path is not None
    damage(Path(info.path))
    with pytest.warns(RuntimeWarning, match="is damaged"):
        cached, rebuilt = cache_dataset(Images(), "memmap", tmp_path)
    assert (rebuilt.reused, rebuilt.path) == (False, info.path)
    assert_matches(cached, Images())
    assert entries(tmp_path) == [info.fingerprint]


@pytest.mark.parametrize("kind", ["memmap", "shards"])
def test_concurrent_builders_both_end_with_one_correct_cache(tmp_path: Path, kind: str) -> None:
    barrier = threading.Barrier(2)

    def build(_: int) -> tuple[Dataset, CacheInfo]:
        return cache_dataset(Rendezvous(barrier), kind, tmp_path, fingerprint="race")

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(build, range(2)))
    assert [info.reused for _, info in results] == [False, False]  # both really built
    assert entries(tmp_path) == ["race" if kind == "memmap" else "race.shards"]
    for cached, info in results:
        if kind == "memmap":
            assert info.path == str(tmp_path / "race")
            assert_matches(cached, Images(n=8))
        else:
            assert sorted(by_number(streamed(cached), lambda item: item[2])) == list(range(8))


@pytest.mark.parametrize("mode", MODES)
def test_nested_dicts_bfloat16_and_float8_round_trip_bit_exact(mode: str, tmp_path: Path) -> None:
    cached, _ = cache_dataset(Nested(), mode, tmp_path)  # type: ignore[arg-type]
    for index in range(len(Nested())):
        inputs, (values, flag) = Nested()[index]
        assert_same(cached[index], (inputs, [values, torch.tensor(flag)]))


def test_default_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_WIDGETS_CACHE", str(tmp_path))
    _, info = cache_dataset(Images(n=4), "memmap")
    assert info.path == str(tmp_path / "data" / info.fingerprint)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataCacheError, match="'memory', 'memmap' or 'shards'"):
        cache_dataset(Images(), "none", tmp_path)  # type: ignore[arg-type]
    with pytest.raises(DataCacheError, match="fingerprint must match"):
        cache_dataset(Images(), "memmap", tmp_path, fingerprint="../escape")
    with pytest.raises(DataCacheError, match="empty dataset"):
        cache_dataset([], "memory")
    with pytest.raises(DataCacheError, match="no values in item 0"):
        cache_dataset([(), ()], "memory")


def test_equal_tensor_datasets_share_a_fingerprint_whatever_their_memory_address():
    """torch pickles storages by address; the fingerprint must follow content, or caches never get reused."""
    first = TensorDataset(torch.arange(12.0).reshape(4, 3), torch.arange(4))
    second = TensorDataset(torch.arange(12.0).reshape(4, 3), torch.arange(4))
    changed = TensorDataset(torch.arange(12.0).reshape(4, 3) + 1, torch.arange(4))
    assert dataset_fingerprint(first) == dataset_fingerprint(second) != dataset_fingerprint(changed)


def test_a_memmap_cache_is_reused_by_the_next_burst(tmp_path):
    from tests.workloads import tiny_workload

    for _ in range(2):
        assert run_burst(tiny_workload(), Config(data_cache="memmap"), steps=2,
                         options=BurstOptions(cache_dir=str(tmp_path))).ok
    assert len([p for p in (tmp_path / "data").iterdir() if not p.name.startswith(".")]) == 1


# -- shards ----------------------------------------------------------------------------------------


def streamed(dataset: Any, rank: int = 0, world_size: int = 1, workers: int = 0) -> list[Any]:
    """Every item one rank's loader reads from a stream, unbatched (``batch_size=None``), in reading order."""
    from accel_widgets.data.streams import split_stream

    return list(DataLoader(split_stream(dataset, rank, world_size, workers), batch_size=None, num_workers=workers,
                           multiprocessing_context="fork" if workers else None))


def by_number(items: list[Any], number: Any) -> dict[int, Any]:
    """Streamed items keyed by the dataset index ``number(item)`` reads from each one."""
    keyed = {int(number(item)): item for item in items}
    assert len(keyed) == len(items), "an item was read twice"
    return keyed


def shard_files(path: Path) -> dict[str, tuple[int, int]]:
    """Each shard's inode and modification time: a rewritten shard changes both."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(path.glob("*.tar"))}


def test_shards_stream_every_item_once_as_it_was(tmp_path: Path) -> None:
    stream, info = cache_dataset(Images(), "shards", tmp_path)
    items = by_number(streamed(stream), lambda item: item[2])
    assert sorted(items) == list(range(24))
    for index, item in items.items():
        assert_same(default_collate([item]), default_collate([Images()[index]]))
    assert (info.mode, info.items, info.reused) == ("shards", 24, False)
    assert info.path == str(tmp_path / f"{info.fingerprint}.shards")
    assert info.bytes == sum(p.stat().st_size for p in Path(info.path).glob("*.tar"))
    assert list(items) != sorted(items)  # written in one shuffled order: shards are read front to back


def test_shards_round_trip_nested_dicts_bfloat16_and_float8_bit_exact(tmp_path: Path) -> None:
    stream, _ = cache_dataset(Nested(), "shards", tmp_path)
    items = by_number(list(stream), lambda item: item[0]["ids"][0])  # straight from the stream: exact containers
    for index, item in items.items():
        inputs, (values, flag) = Nested()[index]
        assert_same(item, (inputs, [values, torch.tensor(flag)]))


def test_shards_are_reused_without_computing_items(tmp_path: Path) -> None:
    _, first = cache_dataset(Images(), "shards", tmp_path)
    assert first.path is not None
    written = shard_files(Path(first.path))
    again = Images()
    stream, info = cache_dataset(again, "shards", tmp_path)
    assert (info.reused, info.build_s, info.path, info.bytes) == (True, 0.0, first.path, first.bytes)
    assert again.calls < len(again)  # a probe may read an item or two; the items are not computed again
    assert shard_files(Path(first.path)) == written
    assert sorted(by_number(streamed(stream), lambda item: item[2])) == list(range(24))


@pytest.mark.parametrize("items", [24, 3], ids=["whole shards per reader", "fewer shards than readers"])
def test_shards_give_each_rank_and_loader_worker_its_own_items(items: int, tmp_path: Path) -> None:
    """2 ranks x 2 workers: 4 readers that together read every item exactly once."""
    stream, _ = cache_dataset(Images(n=items), "shards", tmp_path)
    read = [int(item[2]) for rank in range(2) for item in streamed(stream, rank, world_size=2, workers=2)]
    assert sorted(read) == list(range(items))


def test_ragged_or_failing_datasets_leave_no_shards_behind(tmp_path: Path) -> None:
    with pytest.raises(DataCacheError, match=r"fixed-shape items: item 5 field \[0\]"):
        cache_dataset(Ragged(), "shards", tmp_path)
    with pytest.raises(RuntimeError, match="boom at 5"):
        cache_dataset(Failing(), "shards", tmp_path)
    assert entries(tmp_path) == []


def _truncate_a_shard(path: Path) -> None:
    shard = next(path.glob("*.tar"))
    shard.write_bytes(shard.read_bytes()[:-700])


def _drop_a_shard(path: Path) -> None:
    next(path.glob("*.tar")).unlink()


def _misname_a_shard(path: Path) -> None:
    (path / "meta.json").write_text((path / "meta.json").read_text().replace("shard-000000.tar", "../x.tar"))


@pytest.mark.parametrize("damage", [_truncate_a_shard, _drop_a_shard, _garble_meta, _misname_a_shard])
def test_damaged_shards_are_detected_and_rebuilt(damage: Any, tmp_path: Path) -> None:
    _, info = cache_dataset(Images(), "shards", tmp_path)
    assert info.path is not None
    damage(Path(info.path))
    with pytest.warns(RuntimeWarning, match="is damaged"):
        stream, rebuilt = cache_dataset(Images(), "shards", tmp_path)
    assert (rebuilt.reused, rebuilt.path) == (False, info.path)
    assert sorted(by_number(streamed(stream), lambda item: item[2])) == list(range(24))
    assert entries(tmp_path) == [Path(info.path).name]


def test_memmap_and_shards_of_one_dataset_live_side_by_side(tmp_path: Path) -> None:
    _, memmap = cache_dataset(Images(), "memmap", tmp_path)
    _, shards = cache_dataset(Images(), "shards", tmp_path)
    assert memmap.fingerprint == shards.fingerprint
    assert entries(tmp_path) == [memmap.fingerprint, f"{shards.fingerprint}.shards"]


def test_without_webdataset_shards_are_refused_before_launch_and_marked_in_the_panel(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    import accel_widgets.data as data_layer
    from accel_widgets.knobs import KNOBS
    from accel_widgets.knobs.rules import ConfigError
    from accel_widgets.panel.controls import choice_notes
    from tests.devices import cpu_device
    from tests.workloads import tiny_workload

    monkeypatch.setitem(sys.modules, "webdataset", None)  # find_spec() says None, import raises
    monkeypatch.delitem(sys.modules, "accel_widgets.data.shards", raising=False)
    monkeypatch.delattr(data_layer, "shards", raising=False)
    with pytest.raises(ConfigError, match=r"needs the webdataset package.*accel-widgets\[shards\]"):
        run_burst(tiny_workload(), Config(data_cache="shards"), steps=2, options=BurstOptions(cache_dir=str(tmp_path)))
    note = choice_notes(KNOBS["data_cache"], cpu_device())["shards"]
    assert note.severity == "error" and "webdataset" in note.message
    with pytest.raises(DataCacheError, match="needs the webdataset package"):
        cache_dataset(Images(), "shards", tmp_path)
    assert entries(tmp_path) == []


def test_a_shards_cache_trains_with_workers_and_ddp_and_is_written_once(tmp_path: Path) -> None:
    """One cache for every burst: written by the first, reused (not rewritten) by the others, no temp files."""
    from functools import partial

    from tests.devices import cpu_device
    from tests.workloads import tiny_workload

    workload = tiny_workload(optimizer=partial(torch.optim.AdamW, lr=1e-2))
    root, written = tmp_path / "data", None
    for changes in ({}, {"num_workers": 2}, {"parallel": "ddp", "world_size": 2, "num_workers": 2}):
        result = run_burst(workload, Config(data_cache="shards", **changes), steps=10,
                           options=BurstOptions(cache_dir=str(tmp_path), device=cpu_device()))
        losses = result.losses()
        assert result.ok, result.error
        assert sum(losses[-3:]) < sum(losses[:3]), (changes, losses)
        [cache] = entries(root)  # no temp dirs left beside it
        written = written or shard_files(root / cache)
        assert shard_files(root / cache) == written
