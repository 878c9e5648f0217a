"""The classic tuning order as a cumulative ladder of configs: each rung keeps the previous rungs' knobs.

Order matters (measured on one H200): a better loader gave 1.4x while fp32 compute dominated, and
2.5x once bf16 had made compute cheap. So the ladder fixes the data pipeline first, then precision,
then compile, then the small things. Rungs that cannot help on this device are left out, not faked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from .config import Config
from .device import DeviceInfo, probe_device
from .engine.launcher import BurstError, run_burst
from .results import BurstResult
from .workload import Workload


@dataclass(frozen=True)
class Rung:
    """One step of the ladder: a short name, why it is there, and the cumulative config."""

    name: str
    why: str
    config: Config


def has_convolutions(workload: Workload) -> bool:
    """Whether channels_last can matter: only 4-D convolutional activations change layout."""
    model = workload.build_model()
    return any(isinstance(m, (nn.Conv2d, nn.BatchNorm2d)) for m in model.modules())


def _precision_for(device: DeviceInfo) -> str | None:
    """The half precision this hardware runs natively: bf16 on Ampere+ GPUs and bf16-capable CPUs; fp16
    (with GradScaler) on older GPUs (T4, V100), where bf16 is emulated; none on other CPUs."""
    if device.has_cuda:
        return "bf16" if device.gpu_has_bf16_units else "fp16"
    return "bf16" if device.cpu_has_bf16_units else None


def classic_ladder(workload: Workload, device: DeviceInfo | None = None, *, compile_mode: str | None = "default",
                   base: Config | None = None) -> list[Rung]:
    """baseline -> +loader -> +mixed precision -> +compile -> +the rest, for this workload on this device.

    ``compile_mode=None`` leaves compiling out of every rung (cold compiles cost tens of seconds).
    """
    device = device or probe_device()
    config = base or Config()
    rungs = [Rung("baseline", "the plain loop: no loader workers, fp32, eager", config)]

    loader: dict[str, Any] = {"num_workers": min(8, max(1, device.cpu_count)), "persistent_workers": True}
    if device.has_cuda:
        loader.update(pin_memory=True, non_blocking=True, prefetch_factor=4)
    config = config.replace(**loader)
    rungs.append(Rung("+loader", "load and augment batches in worker processes, ahead of the step", config))

    precision = _precision_for(device)
    if precision is not None:
        config = config.replace(precision=precision)
        rungs.append(Rung(f"+{precision}", "autocast matmuls/convs to half precision units", config))

    if compile_mode is not None:
        config = config.replace(compile_mode=compile_mode)
        rungs.append(Rung("+compile", "torch.compile fuses kernels and removes Python overhead", config))

    rest: dict[str, Any] = {"sync_every": 0, "optimizer_impl": "fused" if device.has_cuda else "foreach"}
    if has_convolutions(workload):
        rest["channels_last"] = True
    if device.has_cuda:
        rest.update(cudnn_benchmark=True, tf32=True)
    config = config.replace(**rest)
    rungs.append(Rung("+rest", "no per-step loss sync, multi-tensor optimizer, memory layout, cuDNN/TF32", config))
    return rungs


def run_ladder(
    workload: Workload,
    rungs: list[Rung] | None = None,
    *,
    on_result: Callable[[Rung, BurstResult], None] | None = None,
    **burst_kwargs: Any,
) -> list[BurstResult]:
    """Run each rung as a burst; a failing rung is kept as a failed result and the ladder goes on."""
    results = []
    for rung in rungs or classic_ladder(workload):
        try:
            result = run_burst(workload, rung.config, label=rung.name, **burst_kwargs)
        except BurstError as exc:
            result = exc.result
        results.append(result)
        if on_result is not None:
            on_result(rung, result)
    return results
