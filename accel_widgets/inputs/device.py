"""What the machine can do, found out without initialising CUDA in the calling process.

The notebook kernel must stay CUDA-free so it can still launch DDP workers, so GPUs are counted
through NVML (``pynvml`` never creates a CUDA context) and CPU features through ``/proc/cpuinfo``.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU (or MIG device) as the workers see it.

    ``index`` is its CUDA ordinal (``cuda:{index}`` in a worker, which runs with :func:`worker_env`);
    ``nvml_index`` is the physical GPU's NVML index (the parent's, for a MIG device); ``uuid`` names
    exactly this device to NVML, a MIG device included. ``compute_capability`` is the physical GPU's
    (major, minor), None where NVML could not say.
    """

    index: int
    nvml_index: int
    name: str
    memory_bytes: int
    uuid: str = ""
    compute_capability: tuple[int, int] | None = None

    @property
    def nvml_key(self) -> int | str:
        """What NVML finds this device by: its UUID (the only name a MIG device has), else its index."""
        return self.uuid or self.nvml_index

    @property
    def has_bf16_units(self) -> bool:
        """bf16 tensor cores came with Ampere (8.0); T4 and V100 emulate bf16. Unknown counts as present."""
        return self.compute_capability is None or self.compute_capability >= (8, 0)


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
    def gpu_has_bf16_units(self) -> bool:
        """Every GPU here runs bf16 natively (compute capability >= 8.0); where not, fp16 is the fast half."""
        return all(g.has_bf16_units for g in self.gpus)

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
        gpus = tuple(_gpu_info(pynvml, ordinal, device) for ordinal, device in enumerate(_visible_devices(pynvml)))
        return gpus, _text(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()


@dataclass(frozen=True)
class _NvmlDevice:
    """A device NVML can name: a physical GPU, or a MIG device with its parent GPU."""

    nvml_index: int  # the physical GPU's (the parent's, for a MIG device)
    handle: Any
    parent: Any  # the physical GPU's handle: the compute capability is read from it
    uuid: str


def _visible_devices(nvml: Any) -> list[_NvmlDevice]:
    """The devices CUDA shows this process's workers, in CUDA ordinal order, as CUDA itself reads
    CUDA_VISIBLE_DEVICES: integer indices (PCI bus order, which :func:`worker_env` gives the workers),
    ``GPU-`` UUIDs or unique prefixes of them, ``MIG-`` UUIDs; parsing stops at the first entry that names
    no device (or one already listed), keeping those before it, so ``-1`` or ``""`` hides every GPU.
    A GPU in MIG mode is seen as its first MIG device, and not at all without one.
    """
    gpus = [_physical(nvml, index) for index in range(nvml.nvmlDeviceGetCount())]
    migs = {gpu.nvml_index: found for gpu in gpus if (found := _mig_devices(nvml, gpu)) is not None}
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    tokens = [str(gpu.nvml_index) for gpu in gpus] if spec is None else spec.split(",")
    visible: list[_NvmlDevice] = []
    for token in tokens:
        device = _resolve(token.strip(), gpus, [mig for found in migs.values() for mig in found])
        if device is not None and device.handle is device.parent and device.nvml_index in migs:
            found = migs[device.nvml_index]
            device = found[0] if found else None
        if device is None or device in visible:
            break
        visible.append(device)
    return visible


def _physical(nvml: Any, index: int) -> _NvmlDevice:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    return _NvmlDevice(index, handle, handle, _text(nvml.nvmlDeviceGetUUID(handle)))


def _mig_devices(nvml: Any, gpu: _NvmlDevice) -> list[_NvmlDevice] | None:
    """The MIG devices of a GPU in MIG mode (maybe none yet), or None for a GPU not in MIG mode."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(gpu.handle)
    except nvml.NVMLError:  # NotSupported: a GPU without MIG
        return None
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return None
    found = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
        except nvml.NVMLError:  # NotFound: an empty slot
            continue
        found.append(_NvmlDevice(gpu.nvml_index, handle, gpu.handle, _text(nvml.nvmlDeviceGetUUID(handle))))
    return found


def _resolve(token: str, gpus: list[_NvmlDevice], migs: list[_NvmlDevice]) -> _NvmlDevice | None:
    """The device one CUDA_VISIBLE_DEVICES entry names, or None when it names none (unambiguously)."""
    if token.isdigit():
        return gpus[int(token)] if int(token) < len(gpus) else None
    prefix = token.lower()
    candidates = migs if prefix.startswith("mig-") else gpus if prefix.startswith("gpu-") else []
    matches = [d for d in candidates if d.uuid.lower().startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


def _gpu_info(nvml: Any, ordinal: int, device: _NvmlDevice) -> GpuInfo:
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(device.parent)
        capability: tuple[int, int] | None = (int(major), int(minor))
    except nvml.NVMLError:
        capability = None
    return GpuInfo(
        index=ordinal, nvml_index=device.nvml_index, name=_text(nvml.nvmlDeviceGetName(device.handle)),
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(device.handle).total), uuid=device.uuid,
        compute_capability=capability,
    )


def _text(value: str | bytes) -> str:
    """pynvml returns bytes on old releases and str on new ones."""
    return value.decode() if isinstance(value, bytes) else value


def worker_env() -> dict[str, str]:
    """Environment the burst's worker processes need before CUDA starts in them.

    CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER says otherwise; NVML and nvidia-smi number
    them by PCI bus. In PCI order, ``cuda:N`` in a worker is ``probe_device().gpus[N]``, the device whose
    name MFU uses and whose NVML readings telemetry labels ``cuda:N``. An explicit FASTEST_FIRST is
    overridden for the workers: integer CUDA_VISIBLE_DEVICES entries are read in PCI order here too.
    """
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


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
