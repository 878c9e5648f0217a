"""What the machine can do, found out without initialising CUDA in the calling process.

The notebook kernel must stay CUDA-free so it can still launch DDP workers, so GPUs are counted
through NVML (``pynvml`` never creates a CUDA context) and CPU features through ``/proc/cpuinfo``.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU: ``index`` is its CUDA ordinal, ``nvml_index`` what NVML calls it."""

    index: int
    nvml_index: int
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class DeviceInfo:
    """Capabilities that decide which knobs apply here; plain data so tests can build fakes."""

    cpu_count: int
    cpu_name: str
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    gpus: tuple[GpuInfo, ...] = ()
    driver: str | None = None

    @property
    def has_cuda(self) -> bool:
        return bool(self.gpus)

    @property
    def kind(self) -> str:
        return "cuda" if self.has_cuda else "cpu"

    @property
    def cpu_has_fp16_units(self) -> bool:
        """Native fp16 arithmetic (AVX512-FP16 or AMX-FP16); without it CPU fp16 autocast is emulated."""
        return bool({"avx512_fp16", "amx_fp16"} & self.cpu_flags)

    @property
    def cpu_has_bf16_units(self) -> bool:
        return bool({"avx512_bf16", "amx_bf16"} & self.cpu_flags)

    @property
    def name(self) -> str:
        return self.gpus[0].name if self.gpus else self.cpu_name


def _read_cpuinfo() -> tuple[str, frozenset[str]]:
    name, flags = platform.processor() or "CPU", frozenset()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    name = value.strip()
                elif key == "flags":
                    flags = frozenset(value.split())
                if key == "flags" and name:
                    break
    except OSError:
        pass
    return name, flags


def _probe_gpus() -> tuple[tuple[GpuInfo, ...], str | None]:
    """GPUs visible to this process through NVML; none where NVML or the driver is absent."""
    try:
        import pynvml
    except ImportError:
        return (), None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return (), None
    try:
        visible = _visible_indices(pynvml.nvmlDeviceGetCount())
        gpus = []
        for order, index in enumerate(visible):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(GpuInfo(order, index, name.decode() if isinstance(name, bytes) else name, int(memory)))
        driver = pynvml.nvmlSystemGetDriverVersion()
        return tuple(gpus), driver.decode() if isinstance(driver, bytes) else driver
    finally:
        pynvml.nvmlShutdown()


def _visible_indices(count: int) -> list[int]:
    """Honour CUDA_VISIBLE_DEVICES given as integer indices (the common case)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    indices = []
    for token in visible.split(","):
        token = token.strip()
        if not token.isdigit():
            break
        if int(token) < count:
            indices.append(int(token))
    return indices


def usable_cpu_count() -> int:
    """Cores this process may run on (affinity and container limits included, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@functools.cache
def probe_device() -> DeviceInfo:
    """This machine's capabilities (cached: hardware does not change within a session)."""
    cpu_name, flags = _read_cpuinfo()
    gpus, driver = _probe_gpus()
    return DeviceInfo(
        cpu_count=usable_cpu_count(), cpu_name=cpu_name, cpu_flags=flags, gpus=gpus, driver=driver
    )
