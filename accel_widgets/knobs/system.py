"""System switches: cuDNN autotuning, determinism, channels_last, the GPU memory cap and cache release."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from .base import Climb, Knob, Remedy, Rule, Search, Symptom

if TYPE_CHECKING:
    from ..inputs.workload import Workload
    from .config import Config

_CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"

GROUP = "system"
TITLE = "System"

KNOBS = [
    Knob(
        "cudnn_benchmark", "system", bool, False, applies_to=("cuda",),
        what="torch.backends.cudnn.benchmark: time cuDNN's algorithms and keep the fastest.",
        why="The default heuristic pick is not always the fastest convolution algorithm.",
        when="Convolutional models with fixed input shapes. No effect on CPU.",
        needs=("convolution",),
    ),
    Knob(
        "deterministic", "system", bool, False,
        what="torch.use_deterministic_algorithms(True): bitwise-reproducible kernels.",
        why="Reproducibility for debugging; usually costs speed.",
        when="Debugging or auditing; turn off for speed.",
        search=Search(left_out="it only ever trades speed for reproducibility"),
    ),
    Knob(
        "channels_last", "system", bool, False,
        what="Store 4-D activations and weights as NHWC (channels_last memory format).",
        why="Tensor-core convolutions want NHWC; NCHW inputs pay transposes around every conv.",
        when="Convolutional models, especially with bf16/fp16 on GPUs.",
        needs=("convolution",),
    ),
    Knob(
        "memory_fraction", "system", float, None, minimum=0.05, maximum=1.0, allow_none=True,
        applies_to=("cuda",),
        what="Cap this process's share of GPU memory (torch.cuda.set_per_process_memory_fraction).",
        why="Simulates a smaller GPU or leaves room for other processes; OOMs show the real limit.",
        when="Testing whether a config fits a smaller device. No effect on CPU.",
        search=Search(left_out="a memory cap never speeds a step up"),
    ),
    Knob(
        "empty_cache", "system", bool, False, applies_to=("cuda",),
        what="Call torch.cuda.empty_cache() after warmup, before measuring.",
        why="Returns the allocator's cached, unused blocks to the driver: other processes on the GPU can "
        "use that memory (nvidia-smi shows less), and the next allocations pay cudaMalloc again. It "
        "does not lower the measured peak of allocated memory (that peak is reset after warm-up anyway).",
        when="Sharing the GPU with other processes. It never speeds training up; it can slow the first "
        "measured steps. No effect on CPU.",
        search=Search(left_out="it frees cached memory before measuring and never speeds a step up"),
    ),
]

RULES = [
    Rule(
        ("deterministic", "cudnn_benchmark"), "error",
        lambda c, d: c.deterministic and c.cudnn_benchmark,
        lambda c, d: "deterministic=True and cudnn_benchmark=True contradict each other: benchmark "
        "mode picks algorithms by timing, which is not reproducible. Choose one.",
    ),
]


def has_convolutions(workload: Workload) -> bool:
    """Whether channels_last can matter: only 4-D convolutional activations change layout."""
    model = workload.build_model()
    return any(isinstance(m, (nn.Conv2d, nn.BatchNorm2d)) for m in model.modules())


LADDER = [
    Climb("+rest", "memory layout, cuDNN autotuning",
          lambda device, workload: {**({"channels_last": True} if has_convolutions(workload) else {}),
                                    **({"cudnn_benchmark": True} if device.has_cuda else {})}),
]

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {
    "compute_bound": lambda c: Remedy("channels_last", "for convolutional models try channels_last")
    if not c.channels_last else None,
}


def deterministic(config: Config) -> bool:
    """Whether the run must be bitwise reproducible (kernels picked by timing are then out)."""
    return config.deterministic


def memory_cap(config: Config) -> float | None:
    """The share of the GPU's memory the run may use (None: all of it)."""
    return config.memory_fraction


def with_memory_cap(config: Config, share: float) -> Config:
    """``config`` capped at ``share`` of the GPU's memory."""
    return config.replace(memory_fraction=share)


@contextlib.contextmanager
def global_flags(config: Config) -> Iterator[None]:
    """cudnn.benchmark and deterministic algorithms for the duration; the previous values come back."""
    saved = (torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    try:
        # Why: benchmark mode times cuDNN algorithms once per shape and keeps the fastest.
        torch.backends.cudnn.benchmark = config.cudnn_benchmark
        if config.deterministic:
            # cuBLAS needs a fixed workspace to be deterministic; it must be set before its first use.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_DETERMINISTIC_WORKSPACE)
        torch.use_deterministic_algorithms(config.deterministic)
        yield
    finally:
        benchmark, deterministic, workspace = saved
        torch.backends.cudnn.benchmark = benchmark
        torch.use_deterministic_algorithms(deterministic)
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace


def cap_memory(config: Config, device: torch.device) -> None:
    """Why: a cap simulates a smaller GPU; out-of-memory errors then show the real limit."""
    if device.type == "cuda" and config.memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(config.memory_fraction, device)


def prepare_model(model: nn.Module, config: Config) -> nn.Module:
    """Why channels_last: tensor-core convolutions run in NHWC; NCHW weights pay a transpose around every conv."""
    return model.to(memory_format=torch.channels_last) if config.channels_last else model


def inputs_channels_last(config: Config) -> bool:
    """4-D float inputs are copied to the device in channels_last too, matching the weights."""
    return config.channels_last


def release_cached_memory(config: Config, device: torch.device) -> None:
    """After warm-up: return the allocator's cached blocks to the driver (other processes can use them)."""
    if device.type == "cuda" and config.empty_cache:
        torch.cuda.empty_cache()
