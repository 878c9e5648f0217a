"""Gradient accumulation: several micro-batches per optimizer step, the loss scaled by 1/k."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

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
    Style,
    Symptom,
    setting,
)
from .owner import Owner

if TYPE_CHECKING:
    from .config import Config

GROUP = "batch"
TITLE = "Batch"

KNOBS = [
    Knob(
        "grad_accum_steps", "batch", int, 1, minimum=1, maximum=1024,
        short="accum",
        what="Micro-batches accumulated per optimizer step (loss scaled by 1/k).",
        why="Reaches a large effective batch without its activation memory.",
        when="Memory, not speed, is the limit: accumulation saves memory, it does not save time.",
        search=Search(left_out="accumulation saves memory, not time", values=(1, 2, 4, 8)),
    ),
]

RULES: list[Rule] = []  # its one conflict (CUDA graphs) is the compile module's

LADDER: list[Climb] = []

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {
    "memory_full": lambda c: Remedy("grad_accum_steps", "the next step up in batch size will not fit; accumulate "
                                    "gradients instead"),
    "communication_bound": lambda c: Remedy("grad_accum_steps", "accumulate micro-batches so gradients are exchanged "
                                            "once per several (the effective batch grows with them)", 2)
    if c.grad_accum_steps == 1 else None,
}


def _accumulation(config: Config, context: RecipeContext) -> list[RecipePart]:
    """Plain PyTorch: the micro-batches per step, and the loss divided by their count when there are several."""
    parts: list[RecipePart] = [Code("grad_accum_steps", "constants", f"ACCUMULATE = {config.grad_accum_steps}",
                                    "micro-batches per optimizer step")]
    if config.grad_accum_steps > 1:
        parts += [Code("grad_accum_steps", "loss_scale", "loss / ACCUMULATE",
                       "the accumulated gradient is then that of one batch of ACCUMULATE x the size"),
                  Code("grad_accum_steps", "step_loss", "total / ACCUMULATE", "a step's loss: its micro-batches' mean")]
    return parts


#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "grad_accum_steps": {
        "pytorch": _accumulation,
        "hf": setting(KNOBS[0], "gradient_accumulation_steps"),
        "lightning": setting(KNOBS[0], "accumulate_grad_batches"),
        # Accelerate accumulates inside `with accelerator.accumulate(model):` around each micro-batch's step.
        "accelerate": setting(KNOBS[0], "gradient_accumulation_steps"),
    },
}


def micro_batches(config: Config) -> int:
    """Micro-batches per optimizer step."""
    return config.grad_accum_steps


def with_accumulation(config: Config, micro_batches: int) -> Config:
    """``config`` stepping the optimizer every ``micro_batches`` micro-batches."""
    return config.replace(grad_accum_steps=micro_batches)


def scale_for_accumulation(loss: torch.Tensor, config: Config) -> torch.Tensor:
    """Why /k: the accumulated gradient then equals that of one batch of k x the size.

    Without accumulation nothing is divided: a division by 1 would still cost a kernel and an autograd
    node on every step, and the plain loop a user compares with has neither.
    """
    return loss if config.grad_accum_steps == 1 else loss / config.grad_accum_steps


OWNER = Owner(
    group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE,
    facts=lambda config, device_kind, visible_gpus: {"micro_batches": micro_batches(config)},
)
