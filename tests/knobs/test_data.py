"""The loader's shared memory: the batches its workers hold in flight against a fake /dev/shm of a given size."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from accel_widgets import BurstOptions, Config, WorkerError, Workload, run_burst
from accel_widgets.knobs import data
from accel_widgets.knobs.data import SharedMemoryTooSmall, check_shared_memory, tensor_bytes
from tests.devices import cpu_device
from tests.workloads import TinyNet

MiB = 2**20
IMAGE_BYTES = 3 * 64 * 64 * 4  # one float32 RGB image at 64 px, as the image demo's loader yields it


class Images(Dataset):
    """Float32 images at 64 px and a label: the image ladder's items."""

    def __len__(self) -> int:
        return 1024

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(3, 64, 64), torch.tensor(index % 10)


class FakeStatvfs:
    """``os.statvfs`` of a tmpfs with ``free`` bytes available, in 4 KiB blocks."""

    def __init__(self, free: int) -> None:
        self.f_frsize, self.f_bavail = 4096, free // 4096
        self.asked: list[str] = []

    def __call__(self, path: str) -> FakeStatvfs:
        self.asked.append(path)
        return self


def shm(monkeypatch: pytest.MonkeyPatch, free: int) -> FakeStatvfs:
    fake = FakeStatvfs(free)
    monkeypatch.setattr(data.os, "statvfs", fake)
    return fake


LADDER_LOADER = Config(num_workers=8, prefetch_factor=4, batch_size=256)  # the image ladder's +loader rung
NEED = 8 * 4 * 256 * (IMAGE_BYTES + 8)  # ~403 MB: every worker's prefetched batches, labels included


def workload() -> Workload:
    return Workload(model=TinyNet, dataset=Images(), loss_fn=F.cross_entropy, batch_size=256, name="images")


def test_a_batch_is_one_item_collated_and_scaled():
    assert tensor_bytes((torch.zeros(2, 3), {"y": torch.zeros(4, dtype=torch.int64)}, "text")) == 2 * 3 * 4 + 4 * 8


def test_a_docker_sized_dev_shm_refuses_the_ladders_loader_before_its_workers_start(monkeypatch):
    fake = shm(monkeypatch, 64 * MiB)
    with pytest.raises(SharedMemoryTooSmall) as info:
        check_shared_memory(Images(), workload(), LADDER_LOADER, world_size=1)
    assert fake.asked == ["/dev/shm"]
    assert str(info.value).startswith(
        f"the DataLoader's workers hold ~{NEED / MiB:,.0f} MiB of batches in shared memory (8 workers x "
        "prefetch_factor 4 x 12.0 MiB), and /dev/shm has 64 MiB free: the workers would die of SIGBUS")
    assert "--shm-size" in str(info.value)


def test_ddp_ranks_share_the_machines_dev_shm(monkeypatch):
    shm(monkeypatch, NEED + MiB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one rank's batches fit: more than half of it, though
        with pytest.raises(UserWarning, match="more than 50% of it"):
            check_shared_memory(Images(), workload(), LADDER_LOADER, world_size=1)
    with pytest.raises(SharedMemoryTooSmall, match=r"\(2 ranks x 8 workers"):
        check_shared_memory(Images(), workload(), LADDER_LOADER, world_size=2)


def test_room_to_spare_or_no_workers_say_nothing(monkeypatch):
    fake = shm(monkeypatch, 8 * NEED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_shared_memory(Images(), workload(), LADDER_LOADER, world_size=1)
        check_shared_memory(Images(), workload(), Config(batch_size=256), world_size=1)
    assert len(fake.asked) == 1  # without workers nothing is looked at


def test_a_burst_whose_batches_do_not_fit_fails_with_the_numbers_and_nothing_left_running(monkeypatch):
    """In-process, so the fake /dev/shm is the one the rank reads; the check runs before any worker forks."""
    shm(monkeypatch, 64 * MiB)
    with pytest.raises(WorkerError, match=r"SharedMemoryTooSmall: the DataLoader's workers hold ~384 MiB"):  # 403 MB
        run_burst(workload(), LADDER_LOADER, steps=2, options=BurstOptions(isolation="inprocess", device=cpu_device()))



def test_an_item_that_cannot_be_collated_alone_is_left_to_the_loader(monkeypatch):
    fake = shm(monkeypatch, 1)

    def pairs_only(items):
        if len(items) < 2:
            raise ValueError("this collate_fn needs pairs")
        return items

    workload = Workload(model=TinyNet, dataset=Images(), loss_fn=F.cross_entropy, batch_size=256, name="images",
                        collate_fn=pairs_only)
    check_shared_memory(Images(), workload, LADDER_LOADER, world_size=1)
    assert fake.asked == ["/dev/shm"]
