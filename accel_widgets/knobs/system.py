"""System switches: cuDNN autotuning, determinism, channels_last, the GPU memory cap and cache release."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from .base import (
    Climb,
    Code,
    Flag,
    Knob,
    RecipeContext,
    RecipeEntry,
    RecipePart,
    RecipeSlot,
    Remedy,
    Rule,
    Search,
    Setting,
    Style,
    Symptom,
    changed,
    no_equivalent,
)
from .owner import Owner

if TYPE_CHECKING:
    from ..inputs.workload import Workload
    from .config import Config

_CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"

GROUP = "system"
TITLE = "System"

KNOBS = [
    Knob(
        "cudnn_benchmark", "system", bool, False, applies_to=("cuda",),
        short="cudnn bench",
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
        short="channels-last",
        what="Store 4-D activations and weights as NHWC (channels_last memory format).",
        why="Tensor-core convolutions want NHWC; NCHW inputs pay transposes around every conv.",
        when="Convolutional models, especially with bf16/fp16 on GPUs.",
        needs=("convolution",),
    ),
    Knob(
        "memory_fraction", "system", float, None, minimum=0.05, maximum=1.0, allow_none=True,
        short="memory fraction",
        applies_to=("cuda",),
        what="Cap this process's share of GPU memory (torch.cuda.set_per_process_memory_fraction).",
        why="Simulates a smaller GPU or leaves room for other processes; OOMs show the real limit.",
        when="Testing whether a config fits a smaller device. No effect on CPU.",
        search=Search(left_out="a memory cap never speeds a step up"),
    ),
    Knob(
        "empty_cache", "system", bool, False, applies_to=("cuda",),
        short="empty cache",
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
    "compute_bound": lambda c: Remedy("channels_last", "for convolutional models try channels_last", True)
    if not c.channels_last else None,
}


_KNOB = {knob.name: knob for knob in KNOBS}
_BENCHMARK = "torch.backends.cudnn.benchmark"
_WORKSPACE = f'os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", "{_CUBLAS_DETERMINISTIC_WORKSPACE}")'
_CHANNELS_LAST = "model = model.to(memory_format=torch.channels_last)"


def _code(name: str, line: str | Callable[[Config], str], slot: RecipeSlot = "code") -> RecipeEntry:
    """An entry that writes one line when the config changes the knob."""
    return lambda config, context: [Code(name, slot, line(config) if callable(line) else line)] if changed(
        _KNOB[name], config) else []


def _flag(name: str, read: str, write: str) -> RecipeEntry:
    return lambda config, context: [Flag(name, read, write, repr(getattr(config, name)))] if changed(
        _KNOB[name], config) else []


def _deterministic(config: Config, context: RecipeContext) -> list[RecipePart]:
    if not config.deterministic:
        return []
    return [Code("deterministic", "imports", "import os"),
            Code("deterministic", "setup", _WORKSPACE, "cuBLAS is deterministic only with a fixed workspace"),
            Flag("deterministic", "torch.are_deterministic_algorithms_enabled()",
                 "torch.use_deterministic_algorithms({})", "True")]


def _memory_cap(config: Config) -> str:
    return f"torch.cuda.set_per_process_memory_fraction({config.memory_fraction})  # on a GPU"


def _channels_last(config: Config, context: RecipeContext) -> list[RecipePart]:
    if not config.channels_last:
        return []
    return [Code("channels_last", "layout", _CHANNELS_LAST),
            Code("channels_last", "to_device", "if batch.dim() == 4 and batch.is_floating_point():\n"
                                               "    batch = batch.contiguous(memory_format=torch.channels_last)",
                 "4-D float inputs in channels_last too, matching the weights")]


_EMPTY_CACHE = "torch.cuda.empty_cache()  # once, after the first steps"

#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "cudnn_benchmark": {
        "pytorch": _flag("cudnn_benchmark", _BENCHMARK, _BENCHMARK + " = {}"),
        "hf": no_equivalent(_KNOB["cudnn_benchmark"], f"set {_BENCHMARK} = True before trainer.train()"),
        "lightning": lambda config, context: [Setting("cudnn_benchmark", "benchmark", True)]
        if config.cudnn_benchmark else [],
        "accelerate": _code("cudnn_benchmark", f"{_BENCHMARK} = True"),
    },
    "deterministic": {
        "pytorch": _deterministic,
        "hf": lambda config, context: [Setting("deterministic", "full_determinism", True)]
        if config.deterministic else [],
        "lightning": lambda config, context: [Setting("deterministic", "deterministic", True)]
        if config.deterministic else [],
        "accelerate": _code("deterministic", "accelerate.utils.set_seed(seed, deterministic=True)"),
    },
    "channels_last": {
        "pytorch": _channels_last,
        "hf": no_equivalent(_KNOB["channels_last"], f"{_CHANNELS_LAST} before handing it to the Trainer (inputs "
                            "follow in each conv)"),
        "lightning": _code("channels_last", _CHANNELS_LAST + "  # in your LightningModule's __init__"),
        "accelerate": _code("channels_last", _CHANNELS_LAST + "  # before accelerator.prepare"),
    },
    "memory_fraction": {
        "pytorch": lambda config, context: [Code("memory_fraction", "device", "if device.type == \"cuda\":\n    "
                                                 f"torch.cuda.set_per_process_memory_fraction({config.memory_fraction}"
                                                 ", device)")] if changed(_KNOB["memory_fraction"], config) else [],
        "hf": no_equivalent(_KNOB["memory_fraction"], lambda config: f"call {_memory_cap(config)} before training"),
        "lightning": _code("memory_fraction", _memory_cap),
        "accelerate": _code("memory_fraction", _memory_cap),
    },
    "empty_cache": {
        "pytorch": _code("empty_cache", "if step == 1 and device.type == \"cuda\":\n    torch.cuda.empty_cache()",
                         "after_step"),
        "hf": no_equivalent(_KNOB["empty_cache"], "the Trainer's torch_empty_cache_steps empties the cache every N "
                            "steps; the burst did it once, after warm-up: call torch.cuda.empty_cache() in a "
                            "TrainerCallback's on_step_end at step 2"),
        "lightning": no_equivalent(_KNOB["empty_cache"], "call torch.cuda.empty_cache() once in on_train_batch_end "
                                   "after the first steps"),
        "accelerate": _code("empty_cache", _EMPTY_CACHE),
    },
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
    """Why channels_last: tensor-core convolutions run in NHWC; NCHW weights pay a transpose around every conv.

    Each 4- and 5-D parameter and buffer is given the layout in place, as ``model.to(memory_format=...)`` gives it to
    a real model (``param.data = ...``), so that the estimate's fake weights take it too: ``Module.to`` swaps a fake
    parameter for a new one instead, which torch refuses while the fake mode holds a weak reference to it."""
    if not config.channels_last:
        return model
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.dim() in (4, 5):
                tensor.data = tensor.data.to(memory_format=torch.channels_last)
    return model


def inputs_channels_last(config: Config) -> bool:
    """4-D float inputs are copied to the device in channels_last too, matching the weights."""
    return config.channels_last


def release_cached_memory(config: Config, device: torch.device) -> None:
    """After warm-up: return the allocator's cached blocks to the driver (other processes can use them)."""
    if device.type == "cuda" and config.empty_cache:
        torch.cuda.empty_cache()


OWNER = Owner(
    group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE,
    model_steps={"layout": lambda model, config, site: prepare_model(model, config)},
    global_flags=global_flags,
)
