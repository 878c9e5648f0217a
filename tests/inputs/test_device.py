"""GPU discovery through a fake pynvml: CUDA_VISIBLE_DEVICES as CUDA reads it, MIG, compute capability."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from accel_widgets.inputs.device import DeviceInfo, GpuInfo, probe_device, worker_env
from accel_widgets.knobs import parallel
from accel_widgets.knobs.config import Config

GiB = 2**30
UUIDS = ("GPU-8f1c0a2e-0000-0000-0000-000000000000", "GPU-8f7d11b0-0000-0000-0000-000000000001",
         "GPU-3b2e9c41-0000-0000-0000-000000000002")


class FakeNVMLError(Exception):
    pass


class FakeNvml:
    """The slice of pynvml that discovery uses. Physical handles are ints (the NVML index); a MIG device's
    handle is ``(parent index, slot)``."""

    NVMLError = FakeNVMLError
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, names: tuple[str, ...], capabilities: tuple[tuple[int, int] | None, ...],
                 migs: dict[int, dict[int, str]] | None = None) -> None:
        self.names, self.capabilities, self.migs = names, capabilities, migs or {}
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.65"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int | tuple[int, int]) -> str:
        if isinstance(handle, tuple):
            return self.migs[handle[0]][handle[1]]
        return UUIDS[handle]

    def nvmlDeviceGetName(self, handle: int | tuple[int, int]) -> bytes:
        if isinstance(handle, tuple):
            return f"{self.names[handle[0]]} MIG 1g.18gb".encode()
        return self.names[handle].encode()

    def nvmlDeviceGetMemoryInfo(self, handle: int | tuple[int, int]) -> SimpleNamespace:
        return SimpleNamespace(total=18 * GiB if isinstance(handle, tuple) else (handle + 1) * 16 * GiB)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        assert isinstance(handle, int), "read from the physical GPU, never a MIG handle"
        capability = self.capabilities[handle]
        if capability is None:
            raise FakeNVMLError("Not Supported")
        return capability

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:
        if handle not in self.migs:
            raise FakeNVMLError("Not Supported")  # what a GPU without MIG answers
        return 1, 1

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, slot: int) -> tuple[int, int]:
        if slot not in self.migs[handle]:
            raise FakeNVMLError("Not Found")
        return handle, slot


@pytest.fixture
def three_gpus(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """An H200, a T4 and an A100 whose capability NVML cannot read, in PCI order."""
    nvml = FakeNvml(("NVIDIA H200", "Tesla T4", "NVIDIA A100"), ((9, 0), (7, 5), None))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return nvml


def probe() -> DeviceInfo:
    return probe_device.__wrapped__()  # uncached: each test sets its own environment


def visible(monkeypatch: pytest.MonkeyPatch, spec: str) -> list[tuple[int, int]]:
    """(CUDA ordinal, NVML index) of each GPU found with CUDA_VISIBLE_DEVICES=spec."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    return [(g.index, g.nvml_index) for g in probe().gpus]


def test_every_gpu_in_pci_order_with_uuid_memory_and_compute_capability(three_gpus: FakeNvml) -> None:
    device = probe()
    assert device.gpus == (
        GpuInfo(0, 0, "NVIDIA H200", 16 * GiB, UUIDS[0], (9, 0)),
        GpuInfo(1, 1, "Tesla T4", 32 * GiB, UUIDS[1], (7, 5)),
        GpuInfo(2, 2, "NVIDIA A100", 48 * GiB, UUIDS[2], None),
    )
    assert device.driver == "580.65" and three_gpus.shutdown_calls == 1
    assert [g.nvml_key for g in device.gpus] == list(UUIDS)


def test_integer_entries_are_pci_indices_and_their_order_is_the_cuda_order(
    three_gpus: FakeNvml, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert visible(monkeypatch, "2,0") == [(0, 2), (1, 0)]
    assert visible(monkeypatch, " 1 ") == [(0, 1)]


def test_uuids_and_unique_uuid_prefixes_name_gpus(three_gpus: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    assert visible(monkeypatch, f"{UUIDS[2]},{UUIDS[0]}") == [(0, 2), (1, 0)]
    assert visible(monkeypatch, "GPU-3b,gpu-8F1") == [(0, 2), (1, 0)]  # prefixes, any case
    assert visible(monkeypatch, "GPU-3b,GPU-8f") == [(0, 2)]  # GPU-8f fits two GPUs: CUDA stops there


def test_parsing_stops_at_the_first_entry_that_names_no_gpu(
    three_gpus: FakeNvml, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert visible(monkeypatch, "1,-1,0") == [(0, 1)]
    assert visible(monkeypatch, "0,7,1") == [(0, 0)]  # out of range
    assert visible(monkeypatch, "0,0,1") == [(0, 0)]  # listed twice
    assert visible(monkeypatch, "GPU-ffff") == []
    assert visible(monkeypatch, "") == []
    assert visible(monkeypatch, "-1") == []


def test_mig_devices_are_found_by_uuid_with_their_parent_and_its_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    mig = {0: {1: "MIG-aa11-first", 4: "MIG-bb22-second"}}
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(("NVIDIA H100", "NVIDIA L4"), ((9, 0), (8, 9)), mig))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-bb22-second,1")
    assert probe().gpus == (
        GpuInfo(0, 0, "NVIDIA H100 MIG 1g.18gb", 18 * GiB, "MIG-bb22-second", (9, 0)),
        GpuInfo(1, 1, "NVIDIA L4", 32 * GiB, UUIDS[1], (8, 9)),
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "mig-aa")  # a unique prefix works too
    assert [g.uuid for g in probe().gpus] == ["MIG-aa11-first"]


def test_a_gpu_in_mig_mode_is_seen_as_its_first_mig_device(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(("NVIDIA H100", "NVIDIA H100"), ((9, 0), (9, 0)), {0: {2: "MIG-cc33", 5: "MIG-dd44"}, 1: {}})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [(g.index, g.nvml_index, g.uuid) for g in probe().gpus] == [(0, 0, "MIG-cc33")]  # GPU 1: no MIG device
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", UUIDS[0])
    assert [g.uuid for g in probe().gpus] == ["MIG-cc33"]


def test_without_nvml_there_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    device = probe()
    assert (device.gpus, device.driver, device.kind) == ((), None, "cpu")


def test_bf16_units_follow_compute_capability() -> None:
    h200 = GpuInfo(0, 0, "NVIDIA H200", 1, compute_capability=(9, 0))
    a100 = GpuInfo(0, 0, "NVIDIA A100", 1, compute_capability=(8, 0))
    t4 = GpuInfo(1, 1, "Tesla T4", 1, compute_capability=(7, 5))
    unknown = GpuInfo(0, 0, "GPU", 1)
    assert (h200.has_bf16_units, a100.has_bf16_units, t4.has_bf16_units, unknown.has_bf16_units) == (
        True, True, False, True)
    assert DeviceInfo(1, "cpu", gpus=(h200, a100)).gpu_has_bf16_units
    assert not DeviceInfo(1, "cpu", gpus=(h200, t4)).gpu_has_bf16_units


def test_gpus_for_a_config() -> None:
    gpus = tuple(GpuInfo(i, 3 - i, f"G{i}", 1) for i in range(4))
    device = DeviceInfo(cpu_count=8, cpu_name="cpu", gpus=gpus)
    assert parallel.gpus_for(Config(), device) == gpus[:1]
    assert parallel.gpus_for(Config(parallel="ddp", world_size=2), device) == gpus[:2]
    assert parallel.gpus_for(Config(parallel="dataparallel"), device) == gpus  # one process drives every GPU
    assert parallel.gpus_for(Config(parallel="ddp", world_size=2), DeviceInfo(cpu_count=8, cpu_name="cpu")) == ()


def test_workers_number_gpus_in_pci_order_like_nvml() -> None:
    assert worker_env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
