"""torch.compile: the mode the model is compiled with, and what compiling costs on the first step."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import nn

from . import batch, overhead, system
from .base import (
    Climb,
    Code,
    Knob,
    RecipeContext,
    RecipeEntry,
    RecipePart,
    Remedy,
    Rule,
    Search,
    Setting,
    Style,
    Symptom,
)

if TYPE_CHECKING:
    from .config import Config

#: Modes that capture CUDA graphs on a GPU (inductor's ``triton.cudagraphs``).
CUDA_GRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")

GROUP = "compile"
TITLE = "torch.compile"

KNOBS = [
    Knob(
        "compile_mode", "compile", str, "off",
        choices=("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        what="torch.compile the model with this mode (inductor backend).",
        why="Fuses elementwise kernels and removes Python overhead; reduce-overhead adds CUDA graphs.",
        when="Many small ops or launch-bound steps, and enough steps to repay the compile time.",
        search=Search(ordered=True),  # the choices go from off to the most aggressive
    ),
]

RULES = [
    Rule(
        ("deterministic", "compile_mode"), "error",
        lambda c, d: system.deterministic(c) and c.compile_mode in ("max-autotune", "max-autotune-no-cudagraphs"),
        lambda c, d: f"compile_mode={c.compile_mode!r} picks kernels by timing, which deterministic=True "
        "forbids. Use compile_mode='default' or turn deterministic off.",
    ),
    Rule(
        ("compile_mode", "grad_accum_steps"), "error",
        lambda c, d: d.has_cuda and c.compile_mode in CUDA_GRAPH_COMPILE_MODES and batch.micro_batches(c) > 1,
        lambda c, d: f"compile_mode={c.compile_mode!r} replays CUDA graphs, which reuse their output memory: "
        f"with grad_accum_steps={batch.micro_batches(c)} training fails ('accessing tensor output of CUDAGraphs "
        "that has been overwritten') or accumulates wrong gradients (pytorch/pytorch#169545, #96693). Use "
        "compile_mode='max-autotune-no-cudagraphs' or 'default', or a bigger batch_size instead of "
        "accumulating.",
    ),
    Rule(
        ("compile_mode",), "warning",
        lambda c, d: not d.has_cuda and c.compile_mode == "reduce-overhead",
        lambda c, d: "compile_mode='reduce-overhead' adds CUDA graphs; on CPU it is the same as 'default'.",
    ),
    Rule(
        ("compile_mode", "script_loss"), "warning",
        lambda c, d: c.compile_mode != "off" and overhead.scripted_loss(c),
        lambda c, d: "script_loss=True (TorchScript, legacy) inside a compiled model: torch.compile "
        "already fuses the loss; TorchScript adds nothing.",
    ),
]


LADDER = [
    Climb("+compile", "torch.compile fuses kernels and removes Python overhead",
          lambda device, workload: {"compile_mode": "default"}),
]

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {
    "compute_bound": lambda c: Remedy("compile_mode", "try torch.compile to fuse kernels") if not compiled(c) else None,
    "compile_does_not_pay": lambda c: Remedy("compile_mode", "leave it off for this model, or look for graph breaks "
                                             "and recompiles"),
}


def _compile_call(config: Config) -> str:
    return "torch.compile(model)" if config.compile_mode == "default" else (
        f"torch.compile(model, mode={config.compile_mode!r})")


def _compile_line(slot: str, where: str = "") -> RecipeEntry:
    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        return [Code("compile_mode", slot, f"model = {_compile_call(config)}{where}")] if compiled(config) else []

    return entry


def _hf_compile(config: Config, context: RecipeContext) -> list[RecipePart]:
    if not compiled(config):
        return []
    mode = [] if config.compile_mode == "default" else [Setting("compile_mode", "torch_compile_mode",
                                                                config.compile_mode)]
    return [Setting("compile_mode", "torch_compile", True), *mode]


#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "compile_mode": {
        "pytorch": _compile_line("compile"),
        "hf": _hf_compile,
        "lightning": _compile_line("code", "  # your LightningModule, before trainer.fit"),
        "accelerate": _compile_line("code", "  # before accelerator.prepare"),
    },
}


class CompileError(RuntimeError):
    """torch.compile failed at the first step (that is where inductor errors surface)."""


def compiled(config: Config) -> bool:
    return config.compile_mode != "off"


def default_warmup_steps(config: Config) -> int:
    """Unmeasured steps before the window: one more when compiling (recompiles can follow the first)."""
    return 3 if compiled(config) else 2


def compile_model(model: nn.Module, config: Config) -> nn.Module:
    """Why: inductor fuses elementwise ops and strips Python overhead; pays a compile on step one."""
    if not compiled(config):
        return model
    import torch

    return torch.compile(model, mode=None if config.compile_mode == "default" else config.compile_mode)


def first_step_error(exc: Exception, config: Config) -> CompileError | None:
    """The compiler's failure at the first step said in terms of the knob, or None if not the compiler's."""
    if not compiled(config) or not type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
        return None
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CompileError(
        f"torch.compile(mode={config.compile_mode!r}) failed at the first step: {type(exc).__name__}: "
        f"{first_line}. Run with compile_mode='off', or fix the graph break."
    )
