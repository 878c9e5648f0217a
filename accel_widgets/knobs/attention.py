"""Attention kernels: which backend ``scaled_dot_product_attention`` may use (flash, memory-efficient, ...).

A model that calls ``torch.nn.functional.scaled_dot_product_attention`` (nn.MultiheadAttention,
nn.Transformer*, Hugging Face models with ``attn_implementation="sdpa"``) gets whichever kernel
torch's dispatcher picks; pinning one shows what the pick costs or saves. Models without SDPA calls
are untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch.nn.attention import SDPBackend, sdpa_kernel

from . import precision
from .base import Climb, Code, Knob, RecipeContext, RecipeEntry, RecipePart, Remedy, Rule, Style, Symptom
from .owner import Owner

if TYPE_CHECKING:
    from .config import Config

GROUP = "attention"
TITLE = "Attention kernels"

_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
_CUDA_ONLY = ("efficient", "cudnn")
#: The CUDA kernels that take fp16/bf16 inputs only: given fp32 ones, a pinned backend has no kernel to run.
_HALF_ONLY_ON_CUDA = ("flash", "cudnn")

KNOBS = [
    Knob(
        "sdpa_backend", GROUP, str, "auto", choices=("auto", "flash", "efficient", "cudnn", "math"),
        short="sdpa",
        what="The kernel scaled_dot_product_attention runs: torch's pick (auto), or one backend pinned.",
        why="Flash and memory-efficient attention never build the seq x seq score matrix; the math backend "
        "does, in several kernels. torch's pick falls back silently when a kernel cannot take the inputs.",
        when="Transformer models that call scaled_dot_product_attention, with long sequences. 'math' is the "
        "reference to compare against; a pinned kernel that cannot take the inputs fails the burst, naming why.",
        needs=("sdpa",),
    ),
]

RULES = [
    Rule(
        ("sdpa_backend",), "error",
        lambda c, d: not d.has_cuda and c.sdpa_backend in _CUDA_ONLY,
        lambda c, d: f"sdpa_backend={c.sdpa_backend!r} is a CUDA kernel; on this CPU only 'auto', 'flash' "
        "or 'math' can run.",
    ),
    Rule(
        ("sdpa_backend", "precision"), "error",
        lambda c, d: d.has_cuda and c.sdpa_backend in _HALF_ONLY_ON_CUDA and not precision.autocasts_to_half(c),
        lambda c, d: f"sdpa_backend={c.sdpa_backend!r} on a GPU takes fp16/bf16 inputs only, and precision='fp32' "
        "gives scaled_dot_product_attention fp32 ones: the first step would fail with 'No available kernel'. Use "
        "precision='bf16' with it, or sdpa_backend='efficient' (which takes fp32) or 'auto'.",
    ),
]


LADDER: list[Climb] = []

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {}


_IMPORT = "from torch.nn.attention import SDPBackend, sdpa_kernel"


def _pinned(config: Config, context: RecipeContext) -> list[RecipePart]:
    """Plain PyTorch: the kernel pinned around the forward."""
    if config.sdpa_backend == "auto":
        return []
    return [Code("sdpa_backend", "imports", _IMPORT),
            Code("sdpa_backend", "forward_context", f"sdpa_kernel(SDPBackend.{_BACKENDS[config.sdpa_backend].name})")]


def _around_training(config: Config, context: RecipeContext) -> list[RecipePart]:
    """A framework: the kernel pinned around the whole training call (the forward runs in that thread)."""
    if config.sdpa_backend == "auto":
        return []
    return [Code("sdpa_backend", "code", _IMPORT),
            Code("sdpa_backend", "code", f"# wrap the training call: with sdpa_kernel(SDPBackend."
                                         f"{_BACKENDS[config.sdpa_backend].name}): trainer.train()")]


#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "sdpa_backend": {"pytorch": _pinned, "hf": _around_training, "lightning": _around_training,
                     "accelerate": _around_training},
}


def forward_context(config: Config) -> contextlib.AbstractContextManager[Any]:
    """Around the forward: restrict SDPA to the pinned backend (nothing to restrict for 'auto')."""
    if config.sdpa_backend == "auto":
        return contextlib.nullcontext()
    return sdpa_kernel(_BACKENDS[config.sdpa_backend])


OWNER = Owner(group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE)
