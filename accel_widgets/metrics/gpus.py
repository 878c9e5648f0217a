"""Named GPUs a memory and speed estimate can be asked about from any machine: memory, bandwidth and compute
capability, the dense peaks coming from :data:`~accel_widgets.metrics.flops.PEAK_TFLOPS` (one table of peaks).

Memory is what NVML reports for the card (``nvidia-smi``'s total, MiB), which is what a burst on it would see;
bandwidth is the vendor's peak HBM/GDDR figure. A roofline built on these is a *lower bound* on a step's time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .flops import peak_flops

MIB = 2**20


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: ``name`` as NVML reports it, the ``aliases`` a person types, its memory, peak memory bandwidth
    and compute capability; :meth:`peak` is its dense peak FLOP/s for a math ("fp32", "tf32", "bf16", "fp16",
    "fp8") from the one table of peaks (None where it has none)."""

    name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    bandwidth_bytes_per_s: float
    compute_capability: tuple[int, int]

    def peak(self, math_mode: str) -> float | None:
        return peak_flops(self.name, math_mode)


GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("NVIDIA H100 80GB HBM3", ("H100 80GB", "H100 SXM", "H100"), 81_559 * MIB, 3.35e12, (9, 0)),
    GpuSpec("NVIDIA H100 PCIe", ("H100 PCIe",), 81_559 * MIB, 2.0e12, (9, 0)),
    GpuSpec("NVIDIA H200", ("H200", "H200 SXM"), 143_771 * MIB, 4.8e12, (9, 0)),
    GpuSpec("NVIDIA A100-SXM4-40GB", ("A100 40GB", "A100-40GB"), 40_960 * MIB, 1.555e12, (8, 0)),
    GpuSpec("NVIDIA A100-SXM4-80GB", ("A100 80GB", "A100-80GB", "A100"), 81_920 * MIB, 2.039e12, (8, 0)),
    GpuSpec("NVIDIA L4", ("L4",), 23_034 * MIB, 3.0e11, (8, 9)),
    GpuSpec("NVIDIA GeForce RTX 4090", ("RTX 4090", "4090"), 24_564 * MIB, 1.008e12, (8, 9)),
)


def _key(text: str) -> str:
    return re.sub(r"[\s_-]+", " ", text.strip().lower().removeprefix("nvidia "))


def gpu_spec(name: str) -> GpuSpec:
    """The spec of a GPU named as a person types it ("H100 80GB", "a100 40gb", "RTX 4090") or as NVML reports it;
    ValueError naming the known ones otherwise."""
    wanted = _key(name)
    for spec in GPU_SPECS:
        if wanted in {_key(spec.name), *map(_key, spec.aliases)}:
            return spec
    known = ", ".join(spec.aliases[0] for spec in GPU_SPECS)
    raise ValueError(f"no spec for a GPU named {name!r}: the named GPUs are {known}")


def spec_of_device(nvml_name: str) -> GpuSpec | None:
    """The spec of a GPU this machine has, by the name NVML gives it (None for a GPU not in the table)."""
    wanted = _key(nvml_name)
    return next((spec for spec in GPU_SPECS if _key(spec.name) == wanted), None)
