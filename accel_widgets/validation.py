"""Rules over whole configs: which knob combinations cannot run here, and which run but make no sense.

Errors stop a burst before any process starts; warnings travel with the result so the user sees why
a knob did nothing (or made things slower) on this machine. Each rule names the knobs it involves,
so the panel can attach the message to the right controls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .config import Config
from .device import DeviceInfo
from .knobs import KNOBS


class ConfigError(ValueError):
    """The config cannot run on this device; the message says why and what to change."""


class BurstRequestError(ValueError):
    """``run_burst``'s length, warm-up, timeout or profiling argument is not a usable number; raised before any
    process starts, because a NaN length or timeout would otherwise run into the timeout and read as a hang."""


def check_burst_request(steps: object, seconds: object, warmup_steps: object, timeout_s: object,
                        profile_steps: object) -> None:
    """Raise :class:`BurstRequestError` unless every burst argument is a number the engine can act on.

    ``steps`` is an int >= 1 and ``seconds`` a finite number > 0 (each may be None: ``run_burst`` picks the
    default length); ``warmup_steps`` (None: the engine's default) an int >= 1, since the first step always
    pays one-off costs; ``timeout_s`` a finite number > 0; ``profile_steps`` an int >= 0. Bools are refused
    as counts, and so are floats: ``steps=2.5`` would otherwise run 3 steps.
    """
    problems = [
        problem
        for problem in (
            _count_problem("steps", steps, 1, optional=True),
            _duration_problem("seconds", seconds, optional=True),
            _count_problem("warmup_steps", warmup_steps, 1, optional=True,
                           why=": the first step always pays one-off costs"),
            _duration_problem("timeout_s", timeout_s, optional=False),
            _count_problem("profile_steps", profile_steps, 0, optional=False),
        )
        if problem
    ]
    if problems:
        raise BurstRequestError("; ".join(problems))


def _count_problem(name: str, value: object, minimum: int, *, optional: bool, why: str = "") -> str:
    """What is wrong with a step count, or "" when it is an int >= ``minimum`` (or None where allowed)."""
    if value is None and optional:
        return ""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return f"{name}={value!r} is invalid: use an integer, {name} >= {minimum}{why}"
    return ""


def _duration_problem(name: str, value: object, *, optional: bool) -> str:
    """What is wrong with a duration in seconds, or "" when it is a finite number > 0 (or None where allowed)."""
    if value is None and optional:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return f"{name}={value!r} is invalid: use a finite number of seconds, {name} > 0"
    return ""


@dataclass(frozen=True)
class Rule:
    knobs: tuple[str, ...]
    severity: Literal["error", "warning"]
    applies: Callable[[Config, DeviceInfo], bool]
    message: Callable[[Config, DeviceInfo], str]


#: torch.compile modes that capture CUDA graphs on a GPU (inductor's ``triton.cudagraphs``).
CUDA_GRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")


def _gpu_without_bf16(device: DeviceInfo) -> str:
    """The first GPU here without bf16 units, named with its compute capability."""
    gpu = next(g for g in device.gpus if not g.has_bf16_units)
    major, minor = gpu.compute_capability or (0, 0)
    return f"{gpu.name} (compute capability {major}.{minor})"


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
        ("compile_mode", "grad_accum_steps"), "error",
        lambda c, d: d.has_cuda and c.compile_mode in CUDA_GRAPH_COMPILE_MODES and c.grad_accum_steps > 1,
        lambda c, d: f"compile_mode={c.compile_mode!r} replays CUDA graphs, which reuse their output memory: "
        f"with grad_accum_steps={c.grad_accum_steps} training fails ('accessing tensor output of CUDAGraphs "
        "that has been overwritten') or accumulates wrong gradients (pytorch/pytorch#169545, #96693). Use "
        "compile_mode='max-autotune-no-cudagraphs' or 'default', or a bigger batch_size instead of "
        "accumulating.",
    ),
    Rule(
        ("precision",), "warning",
        lambda c, d: c.precision == "fp16" and not d.has_cuda and not d.cpu_has_fp16_units,
        lambda c, d: f"precision='fp16' on this CPU ({d.cpu_name}) has no fp16 units: autocast emulates "
        "it, measured 11-130x slower than fp32 here. Use bf16.",
    ),
    Rule(
        ("precision",), "warning",
        lambda c, d: c.precision == "bf16" and d.has_cuda and not d.gpu_has_bf16_units,
        lambda c, d: f"precision='bf16' on {_gpu_without_bf16(d)}: GPUs before Ampere (compute capability 8.0) "
        "have no bf16 tensor cores, so bf16 is slow, emulated. Use precision='fp16' (with GradScaler).",
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
