"""Streaming datasets: bursts without __len__, each rank and loader worker reading its own share of the stream,
and webdataset pipelines split the webdataset way, warned about or refused with the fix."""

from __future__ import annotations

import os
import warnings
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from accel_widgets import BurstOptions, BurstResult, Config, Workload, run_burst
from accel_widgets.analysis.diagnosis import diagnose
from accel_widgets.analysis.guard import check_training
from accel_widgets.analysis.usage import read_amplification
from accel_widgets.data.keyed import DataRandomness
from accel_widgets.data.streams import StreamReading, StreamSplitWarning, split_stream
from accel_widgets.engine.training import EpochIterator
from tests.devices import cpu_device
from tests.workloads import FEATURES, TinyNet, tensors

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


BATCH = 16


def assert_dealt_out(shares: list[set[int]], readers: int) -> None:
    """Exactly ``readers`` readers, each keeping whole batches of the stream: one residue of the batch numbers
    (item number // the batch size) modulo ``readers``."""
    assert len(shares) == readers
    residues = [{n // BATCH % readers for n in share} for share in shares]
    assert all(len(r) == 1 for r in residues), residues
    assert set().union(*residues) == set(range(readers))


def stream_workload(directory: Path, dataset: IterableDataset | None = None, **kwargs: Any) -> Workload:
    return Workload(model=TinyNet, dataset=dataset if dataset is not None else Numbered(), loss_fn=F.cross_entropy,
                    optimizer=partial(torch.optim.AdamW, lr=1e-2), batch_size=BATCH, collate_fn=Recording(directory),
                    name="stream", **kwargs)


def assert_trains(result: Any) -> None:
    """Finished, and the loss fell: the last three steps' mean below the first three's (one batch is noisy)."""
    losses = result.losses()
    assert result.ok, result.error
    assert sum(losses[-3:]) < sum(losses[:3]), losses


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_trains_with_each_loader_worker_reading_its_own_items(workers: int, tmp_path: Path) -> None:
    result = run_burst(stream_workload(tmp_path), Config(num_workers=workers), steps=10,
                       options=BurstOptions(isolation="inprocess", device=cpu_device()))
    assert_trains(result)
    assert_dealt_out(read_by_reader(tmp_path), readers=max(1, workers))


def test_ddp_ranks_and_their_workers_read_disjoint_shares_of_a_stream(tmp_path: Path) -> None:
    result = run_burst(stream_workload(tmp_path), DDP.replace(num_workers=2), steps=6,
                       options=BurstOptions(device=cpu_device()))
    assert result.ok and len(result.ranks) == 2, result.error
    assert_dealt_out(read_by_reader(tmp_path), readers=4)
    assert not any("webdataset" in w for w in result.warnings)


@pytest.mark.parametrize("bound", [{"steps": 12}, {"seconds": 0.5}], ids=["steps", "seconds"])
def test_a_short_stream_restarts_each_epoch(bound: dict[str, Any], tmp_path: Path) -> None:
    """64 items make 4 batches of 16: every burst here runs several epochs of a stream that has no length."""
    result = run_burst(stream_workload(tmp_path, Numbered(64)), Config(), **bound,
                       options=BurstOptions(isolation="inprocess", device=cpu_device()))
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
    split = split_stream(dataset, 1, 2, workers=2)
    assert split.dataset is dataset
    assert split.reading() == StreamReading("stream", "stream", "library", 0, 0, readers=2)


def test_a_webdataset_without_a_worker_splitter_is_dealt_out_to_loader_workers(tmp_path: Path) -> None:
    dataset = pipeline(write_shards(tmp_path, shards=2, per_shard=4), workersplitter=None)
    read = DataLoader(split_stream(dataset, 0, 1, workers=2), batch_size=None, num_workers=2,
                      multiprocessing_context="fork")
    assert sorted(int(key) for _, _, key in read) == list(range(8))  # each item once, not once per worker


def test_a_webdataset_with_its_default_node_splitter_is_refused_under_ddp_naming_the_fix(tmp_path: Path) -> None:
    dataset = pipeline(write_shards(tmp_path, shards=2, per_shard=4))
    with pytest.raises(ValueError, match=r"nodesplitter=wds.split_by_node"):
        split_stream(dataset, 0, 2, workers=0)
    assert keys(split_stream(dataset, 0, 1, workers=0)) == list(range(8))  # one rank: nothing to split


def test_a_webdataset_without_a_node_splitter_is_split_per_rank_with_a_warning(tmp_path: Path) -> None:
    dataset = pipeline(write_shards(tmp_path, shards=2, per_shard=4), nodesplitter=None)
    with pytest.warns(RuntimeWarning, match="each of the 2 ranks reads every shard"):
        shares = [keys(split_stream(dataset, rank, 2, workers=0)) for rank in range(2)]
    assert shares == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_a_users_webdataset_trains_under_ddp_with_workers_each_reading_its_own_shards(tmp_path: Path) -> None:
    urls = write_shards(tmp_path, shards=8, per_shard=64)
    record = tmp_path / "read"
    record.mkdir()
    workload = stream_workload(record, pipeline(urls, nodesplitter=wds.split_by_node))
    result = run_burst(workload, DDP.replace(num_workers=2), steps=6, options=BurstOptions(device=cpu_device()))
    assert result.ok, result.error
    shares = read_by_reader(record)
    assert len(shares) == 4  # 2 ranks x 2 workers
    shards_read = [{n // 64 for n in share} for share in shares]  # whole shards, none read twice
    assert all(not a & b for i, a in enumerate(shards_read) for b in shards_read[i + 1:])


# -- streams that split themselves ---------------------------------------------------------------------
class DocsStream(IterableDataset):
    """Written as PyTorch's IterableDataset docs show: each loader worker yields every ``num_workers``-th item
    from its ``id``; the rank itself (no worker) yields them all."""

    def __init__(self, n: int = 256) -> None:
        self.x, self.y = tensors(n)

    def __iter__(self) -> Any:
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        return ((self.x[i], self.y[i], i) for i in range(start, len(self.x), step))


class DeclaredDocsStream(DocsStream):
    splits_itself = "workers"


class RankAwareStream(IterableDataset):
    """Splits itself as MosaicML's StreamingDataset does: its rank and world size read from the environment when it
    is built (RANK, WORLD_SIZE), its loader worker from get_worker_info() when iterated. Built in each rank through
    a factory, as such a dataset must be."""

    def __init__(self, n: int = 256) -> None:
        self.x, self.y = tensors(n)
        self.rank, self.world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    def __iter__(self) -> Any:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        reader, readers = self.rank * workers + worker, self.world_size * workers
        return ((self.x[i], self.y[i], i) for i in range(reader, len(self.x), readers))


def read_counts(directory: Path) -> Counter[int]:
    """How often each item number was trained on, over every process that collated batches."""
    return Counter(int(n) for path in directory.glob("*.txt") for n in path.read_text().split())


ONE_EPOCH = {  # measured steps that make exactly one epoch of 256 items in batches of 16 (2 warm-up steps first)
    "workers": (Config(num_workers=2), 256 // 16 - 2),
    "ddp+workers": (DDP.replace(num_workers=2), 256 // 16 // 2 - 2),
}


@pytest.mark.parametrize("setup", list(ONE_EPOCH), ids=list(ONE_EPOCH))
def test_a_stream_that_splits_itself_by_worker_trains_every_item_once_per_epoch(setup: str, tmp_path: Path) -> None:
    config, steps = ONE_EPOCH[setup]
    result = run_burst(stream_workload(tmp_path, DocsStream()), config, steps=steps,
                       options=BurstOptions(device=cpu_device()))
    assert result.ok, result.error
    assert read_counts(tmp_path) == Counter(range(256))  # each of the 256 items once (was: 128 of them, twice)
    assert result.stream.workers == "stream" and result.stream.known_from == "probe"
    assert result.stream.ranks == ("tool" if config.ranks > 1 else "none")
    assert read_amplification(result) == pytest.approx(config.ranks)  # the tool deals the ranks' items out
    (said,) = [w for w in result.warnings if w.startswith("StreamSplitWarning")]
    assert "splits itself between its DataLoader workers" in said and "DocsStream.splits_itself = 'workers'" in said


def test_a_stream_that_declares_its_split_is_not_probed_and_trains_every_item_once(tmp_path: Path) -> None:
    config, steps = ONE_EPOCH["ddp+workers"]
    result = run_burst(stream_workload(tmp_path, DeclaredDocsStream()), config, steps=steps,
                       options=BurstOptions(device=cpu_device()))
    assert result.ok, result.error
    assert read_counts(tmp_path) == Counter(range(256))
    assert result.stream == StreamReading("tool", "stream", "declared", result.stream.items_read,
                                          result.stream.items_kept, readers=2)
    assert not [w for w in result.warnings if "StreamSplitWarning" in w]


@pytest.mark.parametrize("setup", list(ONE_EPOCH), ids=list(ONE_EPOCH))
def test_a_stream_that_splits_itself_by_rank_and_worker_from_the_environment_trains_every_item_once(
        setup: str, tmp_path: Path) -> None:
    config, steps = ONE_EPOCH[setup]
    workload = stream_workload(tmp_path, partial(RankAwareStream, 256))  # a factory: built in each rank
    result = run_burst(workload, config, steps=steps, options=BurstOptions(device=cpu_device()))
    assert result.ok, result.error
    assert read_counts(tmp_path) == Counter(range(256))
    assert result.stream.workers == "stream"
    assert result.stream.ranks == ("stream" if config.ranks > 1 else "none")
    assert read_amplification(result) == 1.0


def test_a_plain_stream_under_ddp_with_workers_is_read_by_every_reader_and_the_diagnosis_says_so(
        tmp_path: Path) -> None:
    result = run_burst(stream_workload(tmp_path, Numbered(512)), DDP.replace(num_workers=2), steps=4,
                       options=BurstOptions(device=cpu_device()))
    assert result.ok, result.error
    assert result.stream == StreamReading("tool", "tool", "probe", result.stream.items_read, result.stream.items_kept,
                                          readers=2)
    # 2 ranks x 2 workers, each keeps 1 batch in 4 (a short burst: the readers behind the first read fewer batches)
    assert read_amplification(result) == pytest.approx(4.0, rel=0.1)
    (finding,) = [f for f in diagnose(result) if f.title.startswith("Stream read")]
    assert finding.knob == "data_cache" and "data_cache='shards'" in finding.detail
    assert f"each item was read {read_amplification(result):.1f} times" in finding.detail
    assert "splits_itself" in finding.detail
    assert read_amplification(BurstResult.from_json(result.to_json())) == read_amplification(result)


def test_a_declaration_the_tool_cannot_read_is_refused_naming_the_values() -> None:
    stream = DocsStream()
    stream.splits_itself = "shards"  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"DocsStream.splits_itself='shards': use True .* 'ranks', 'workers'"):
        split_stream(stream, 0, 1, workers=2)


class Augmented(IterableDataset):
    """A stream that does not split itself, with random augmentation drawn from torch's generator."""

    def __iter__(self) -> Any:
        x, y = tensors(64)
        return ((x[i] + torch.randn(FEATURES), y[i], i) for i in range(64))


class Unseeded(Augmented):
    """Random augmentation from a generator no seed reaches: two reads never agree."""

    def __iter__(self) -> Any:
        x, y = tensors(64)
        noise = np.random.default_rng()
        return ((x[i] + torch.from_numpy(noise.standard_normal(FEATURES)).float(), y[i], i) for i in range(64))


@pytest.mark.parametrize(("stream", "workers", "randomness"), [
    (DocsStream(), "stream", DataRandomness(False, True)), (Augmented(), "tool", DataRandomness(True, True)),
    (Unseeded(), "tool", DataRandomness(None, False)),
], ids=["splits itself", "augmented", "unseeded randomness"])
def test_the_probe_tells_a_split_from_augmentation_and_leaves_every_generator_as_it_was(
        stream: IterableDataset, workers: str, randomness: DataRandomness) -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split = split_stream(stream, 0, 1, workers=2)
    assert torch.equal(torch.rand(3), expected)  # the probe drew from seeded generators it put back
    assert split.reading().workers == workers and split.reading().known_from == "probe"
    assert split.split.randomness == randomness
    said = [str(w.message) for w in caught if w.category is StreamSplitWarning]
    assert len(said) == (workers == "stream"), said  # a split it left to the stream is said; dealing out is not


def test_an_augmented_stream_the_tool_deals_out_trains_the_same_with_any_workers_and_a_self_split_one_says_so(
        tmp_path: Path) -> None:
    """Items keyed by their position in the stream, batches dealt out whole: 0, 1 and 2 workers, persistent or not,
    train on the same batches over several epochs, and the guard passes them without a band. A stream that splits
    itself between its workers batches other items with each worker count: the guard does not compare those."""
    def burst(stream: IterableDataset, config: Config) -> BurstResult:
        result = run_burst(stream_workload(tmp_path, stream), config, steps=10,
                           options=BurstOptions(isolation="inprocess", device=cpu_device()))
        assert result.ok, result.error
        return result

    base = burst(Augmented(), Config())
    assert base.ranks[0].random_data and base.ranks[0].keyed_data
    for config in (Config(num_workers=1), Config(num_workers=2, persistent_workers=True)):
        run = burst(Augmented(), config)
        assert run.losses() == base.losses(), config
        assert check_training(run, base).status == "ok"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StreamSplitWarning)
        split = burst(DocsStream(), Config(num_workers=2))
    assert check_training(split, burst(DocsStream(), Config())).status == "not_comparable"


# -- MosaicML's StreamingDataset, for real where it imports -------------------------------------------------
def mosaicml_streaming() -> Any:
    """The ``streaming`` package, or a skip saying why it does not import here: it imports torchvision at the top,
    and PyPI's torchvision wheels are CUDA builds that fail to load next to a CPU-only torch (RuntimeError
    "operator torchvision::nms does not exist"), or are not installed at all."""
    try:
        import streaming
    except Exception as exc:
        pytest.skip(f"mosaicml-streaming does not import here ({type(exc).__name__}: {str(exc).splitlines()[0]})")
    return streaming


class RecordingSamples(Recording):
    """Recording for MosaicML's samples: dicts of the MDS columns."""

    def __call__(self, items: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return super().__call__([(torch.from_numpy(s["x"]), torch.tensor(s["y"]), s["number"]) for s in items])


@pytest.mark.parametrize("setup", list(ONE_EPOCH), ids=list(ONE_EPOCH))
def test_mosaicml_streaming_dataset_trains_every_sample_once_per_epoch(setup: str, tmp_path: Path) -> None:
    streaming = mosaicml_streaming()
    config, steps = ONE_EPOCH[setup]
    x, y = tensors(256)
    with streaming.MDSWriter(out=str(tmp_path / "mds"), columns={"x": "ndarray", "y": "int", "number": "int"}) as mds:
        for i in range(256):
            mds.write({"x": x[i].numpy(), "y": int(y[i]), "number": i})
    record = tmp_path / "read"
    record.mkdir()
    # Built in each rank (it reads RANK/WORLD_SIZE when built), from the local directory: no remote.
    factory = partial(streaming.StreamingDataset, local=str(tmp_path / "mds"), batch_size=16, shuffle=False)
    workload = Workload(model=TinyNet, dataset=factory, loss_fn=F.cross_entropy, batch_size=16,
                        collate_fn=RecordingSamples(record), name="mds")
    result = run_burst(workload, config, steps=steps, options=BurstOptions(device=cpu_device()))
    assert result.ok, result.error
    assert read_counts(record) == Counter(range(256))
    assert result.stream.known_from == "library" and result.stream.workers == "stream"
    assert result.stream.ranks == ("stream" if config.ranks > 1 else "none")
    assert read_amplification(result) == 1.0
