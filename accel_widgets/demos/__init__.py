"""Ready-made demo workloads: a data-bound image classifier, a causal language model and a tabular MLP.

Every dataset is generated from a seed (no downloads, no torchvision) with structure a model can learn, and
every class and function lives at module level so a :class:`~accel_widgets.inputs.workload.Workload` travels to
worker processes by reference under ``pickle`` and ``cloudpickle``. Models are zero-argument factories
(``functools.partial`` of a module-level class), so workers build them under the workload seed.

Sizes: ``"small"`` runs on a laptop CPU in seconds (tests, smoke runs); ``"gpu"`` is sized for one modern
accelerator (ResNet-18, GPT-2 small, a wide MLP).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ..inputs.workload import Workload
from .image import AugmentedImages, BasicBlock, ResNet, SmallCNN, image_workload, resnet18, synthetic_images
from .lm import Block, CausalSelfAttention, TinyGPT, TokenWindows, lm_loss, lm_workload, markov_tokens
from .mlp import MLP, mlp_workload, regression_data

__all__ = [
    "DEMO_NAMES",
    "DEMO_SIZES",
    "MLP",
    "AugmentedImages",
    "BasicBlock",
    "Block",
    "CausalSelfAttention",
    "ResNet",
    "SmallCNN",
    "TinyGPT",
    "TokenWindows",
    "demo_workload",
    "lm_loss",
    "markov_tokens",
    "regression_data",
    "resnet18",
    "synthetic_images",
]

DEMO_NAMES: tuple[str, ...] = ("image", "lm", "mlp")
DEMO_SIZES: tuple[str, ...] = ("small", "gpu")
DemoSize = Literal["small", "gpu"]


_BUILDERS: dict[str, Callable[[str, int | None, int], Workload]] = {
    "image": image_workload,
    "lm": lm_workload,
    "mlp": mlp_workload,
}


def demo_workload(name: str, size: DemoSize = "small", *, num_samples: int | None = None, seed: int = 0) -> Workload:
    """A ready-made :class:`Workload` by name (``DEMO_NAMES``) and size (``DEMO_SIZES``), fully determined by ``seed``.

    ``num_samples`` overrides the dataset length (images, token windows or rows), e.g. to keep a ``"gpu"``
    dataset tiny in tests.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown demo {name!r}; valid names: {', '.join(DEMO_NAMES)}")
    if size not in DEMO_SIZES:
        raise ValueError(f"unknown size {size!r}; valid sizes: {', '.join(DEMO_SIZES)}")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)):
        raise TypeError(f"num_samples must be an int or None, got {num_samples!r}")
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    return _BUILDERS[name](size, num_samples, int(seed))
