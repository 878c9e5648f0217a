"""Rules over whole configs: which knob combinations cannot run here, and which run but make no sense.

Errors stop a burst before any process starts; warnings travel with the result so the user sees why
a knob did nothing (or made things slower) on this machine. Each rule names the knobs it involves,
so the panel can attach the message to the right controls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .config import Config
from .device import DeviceInfo
from .knobs import KNOBS


class ConfigError(ValueError):
    """The config cannot run on this device; the message says why and what to change."""


@dataclass(frozen=True)
class Rule:
    knobs: tuple[str, ...]
    severity: Literal["error", "warning"]
    applies: Callable[[Config, DeviceInfo], bool]
    message: Callable[[Config, DeviceInfo], str]


def _cuda_only_knobs_set(config: Config) -> list[str]:
    """CUDA-only knobs switched away from their default."""
    return [
        name
        for name, knob in KNOBS.items()
        if knob.applies_to == ("cuda",) and getattr(config, name) != knob.default
    ]


RULES: tuple[Rule, ...] = (
    Rule(
        ("parallel",), "error",
        lambda c, d: c.parallel == "dataparallel" and len(d.gpus) < 2,
        lambda c, d: f"parallel='dataparallel' needs at least 2 GPUs; this machine has {len(d.gpus)}. "
        "DataParallel is the legacy single-process option: prefer parallel='ddp'.",
    ),
    Rule(
        ("parallel", "world_size"), "error",
        lambda c, d: c.parallel == "ddp" and d.has_cuda and c.world_size > len(d.gpus),
        lambda c, d: f"world_size={c.world_size} needs one GPU per rank for NCCL; this machine has "
        f"{len(d.gpus)}. Use world_size <= {len(d.gpus)}.",
    ),
    Rule(
        ("parallel", "world_size"), "error",
        lambda c, d: c.parallel != "ddp" and c.world_size != 1,
        lambda c, d: f"world_size={c.world_size} only applies with parallel='ddp'; set parallel='ddp' "
        "or world_size=1.",
    ),
    Rule(
        ("parallel", "world_size"), "warning",
        lambda c, d: c.parallel == "ddp" and not d.has_cuda and c.world_size > d.cpu_count,
        lambda c, d: f"{c.world_size} CPU ranks on {d.cpu_count} cores: ranks will fight for cores and "
        "throughput will drop.",
    ),
    Rule(
        ("deterministic", "cudnn_benchmark"), "error",
        lambda c, d: c.deterministic and c.cudnn_benchmark,
        lambda c, d: "deterministic=True and cudnn_benchmark=True contradict each other: benchmark "
        "mode picks algorithms by timing, which is not reproducible. Choose one.",
    ),
    Rule(
        ("deterministic", "compile_mode"), "error",
        lambda c, d: c.deterministic and c.compile_mode in ("max-autotune", "max-autotune-no-cudagraphs"),
        lambda c, d: f"compile_mode={c.compile_mode!r} picks kernels by timing, which deterministic=True "
        "forbids. Use compile_mode='default' or turn deterministic off.",
    ),
    Rule(
        ("precision",), "warning",
        lambda c, d: c.precision == "fp16" and not d.has_cuda and not d.cpu_has_fp16_units,
        lambda c, d: f"precision='fp16' on this CPU ({d.cpu_name}) has no fp16 units: autocast emulates "
        "it, measured 11-130x slower than fp32 here. Use bf16.",
    ),
    Rule(
        ("precision",), "warning",
        lambda c, d: c.precision == "bf16" and not d.has_cuda and not d.cpu_has_bf16_units,
        lambda c, d: "precision='bf16' on a CPU without AVX512-BF16/AMX units is emulated and may be "
        "slower than fp32.",
    ),
    Rule(
        ("prefetch_factor", "persistent_workers", "num_workers"), "warning",
        lambda c, d: c.num_workers == 0
        and (c.persistent_workers or c.prefetch_factor != KNOBS["prefetch_factor"].default),
        lambda c, d: "prefetch_factor and persistent_workers only apply with num_workers > 0; they are "
        "ignored.",
    ),
    Rule(
        ("non_blocking", "pin_memory"), "warning",
        lambda c, d: d.has_cuda and c.non_blocking and not c.pin_memory,
        lambda c, d: "non_blocking=True without pin_memory=True: copies from pageable memory are staged "
        "synchronously anyway.",
    ),
    Rule(
        ("compile_mode",), "warning",
        lambda c, d: not d.has_cuda and c.compile_mode == "reduce-overhead",
        lambda c, d: "compile_mode='reduce-overhead' adds CUDA graphs; on CPU it is the same as 'default'.",
    ),
    Rule(
        ("compile_mode", "script_loss"), "warning",
        lambda c, d: c.compile_mode != "off" and c.script_loss,
        lambda c, d: "script_loss=True (TorchScript, legacy) inside a compiled model: torch.compile "
        "already fuses the loss; TorchScript adds nothing.",
    ),
    Rule(
        ("pin_memory", "non_blocking", "tf32", "cudnn_benchmark", "memory_fraction", "empty_cache"),
        "warning",
        lambda c, d: not d.has_cuda and bool(_cuda_only_knobs_set(c)),
        lambda c, d: f"{', '.join(_cuda_only_knobs_set(c))} only act on CUDA; on this CPU-only machine "
        "they change nothing.",
    ),
)


def check_config(config: Config, device: DeviceInfo) -> list[str]:
    """Raise :class:`ConfigError` if ``config`` cannot run on ``device``; return the warnings otherwise."""
    errors = [r.message(config, device) for r in RULES if r.severity == "error" and r.applies(config, device)]
    if errors:
        raise ConfigError(" ".join(errors))
    return [r.message(config, device) for r in RULES if r.severity == "warning" and r.applies(config, device)]


def knob_availability(name: str, device: DeviceInfo) -> tuple[bool, str]:
    """Whether a knob can do anything here, with the reason when it cannot (for disabling controls)."""
    knob = KNOBS[name]
    if device.kind not in knob.applies_to:
        return False, f"{name} only acts on {', '.join(knob.applies_to).upper()}; this machine is {device.kind}."
    return True, ""
