"""Gradient accumulation: several micro-batches per optimizer step, the loss scaled by 1/k."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .base import Knob, Rule

if TYPE_CHECKING:
    from ..config import Config

GROUP = "batch"
TITLE = "Batch"

KNOBS = [
    Knob(
        "grad_accum_steps", "batch", int, 1, minimum=1, maximum=1024,
        what="Micro-batches accumulated per optimizer step (loss scaled by 1/k).",
        why="Reaches a large effective batch without its activation memory.",
        when="Memory, not speed, is the limit: accumulation saves memory, it does not save time.",
    ),
]

RULES: list[Rule] = []  # its one conflict (CUDA graphs) is the compile module's


def micro_batches(config: Config) -> int:
    """Micro-batches per optimizer step."""
    return config.grad_accum_steps


def scale_for_accumulation(loss: torch.Tensor, config: Config) -> torch.Tensor:
    """Why /k: the accumulated gradient then equals that of one batch of k x the size.

    Without accumulation nothing is divided: a division by 1 would still cost a kernel and an autograd
    node on every step, and the plain loop a user compares with has neither.
    """
    return loss if config.grad_accum_steps == 1 else loss / config.grad_accum_steps
