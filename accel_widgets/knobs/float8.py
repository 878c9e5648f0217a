"""float8 training: torchao's ``convert_to_float8_training`` on the linear layers that gain from it.

Float8 matmuls run at twice the bf16 tensor-core rate on Ada and Hopper GPUs (compute capability 8.9 and newer), but
every converted layer pays for scaling and casting its inputs, weights and gradients each step: small layers lose
more to that than their matmuls gain. So only the layers torchao's per-shape rule says will gain are converted
(:func:`gains_from_float8`), and the casts are fused into the neighbouring kernels only under torch.compile, which is
why torchao's published speed-ups (+28% tokens/s over compile alone for Llama3-8B on 8 H100s in torchtitan) are all
compiled.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import nn

from . import compiling, parallel
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
)
from .owner import Owner

if TYPE_CHECKING:
    from ..inputs.device import DeviceInfo
    from ..inputs.workload import Workload
    from .config import Config

GROUP = "float8"
TITLE = "float8 training"

#: The compute capability from which a GPU has float8 tensor cores (Ada 8.9, Hopper 9.0, Blackwell 10.0): torchao's
#: ``is_sm_at_least_89``.
FLOAT8_CAPABILITY = (8, 9)
INSTALL = "pip install torchao"

KNOBS = [
    Knob(
        "float8", GROUP, str, "off", choices=("off", "tensorwise", "rowwise"), applies_to=("cuda",),
        what="float8 matmuls in the linear layers large enough to gain (torchao's convert_to_float8_training, "
        "with its per-shape rule): 'tensorwise' scales each tensor by one number (fastest), 'rowwise' each row "
        "(closer to bf16's accuracy).",
        why="Hopper and Ada tensor cores multiply float8 at twice the bf16 rate; large matmuls (both sides of a "
        "weight in the thousands) keep most of that after the scaling and casting each step adds.",
        when="Large linear layers (an LLM's MLP and attention projections) on an H100/H200/L40-class GPU, with "
        "torch.compile on and bf16 autocast. Needs torchao (pip install torchao).",
        search=Search(),
    ),
]


def _old_gpus(config: Config, device: DeviceInfo) -> list[str]:
    """The GPUs ``config`` trains on whose compute capability is known and below float8's, named with it."""
    return [f"{gpu.name} (compute capability {gpu.compute_capability[0]}.{gpu.compute_capability[1]})"
            for gpu in parallel.gpus_for(config, device)
            if gpu.compute_capability is not None and gpu.compute_capability < FLOAT8_CAPABILITY]


RULES = [
    Rule(
        ("float8",), "error",
        lambda c, d: c.float8 != "off" and not d.has_cuda,
        lambda c, d: f"float8={c.float8!r} needs a CUDA GPU with float8 tensor cores (compute capability 8.9 or "
        "newer: Ada, Hopper, Blackwell); this machine has no CUDA GPU. Leave float8='off'.",
    ),
    Rule(
        ("float8",), "error",
        lambda c, d: c.float8 != "off" and d.has_cuda and bool(_old_gpus(c, d)),
        lambda c, d: f"float8={c.float8!r} needs float8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, "
        f"Blackwell); {', '.join(_old_gpus(c, d))} has none. Use precision='bf16' there.",
    ),
    Rule(
        ("float8", "compile_mode"), "warning",
        lambda c, d: c.float8 != "off" and not compiling.compiled(c),
        lambda c, d: f"float8={c.float8!r} without torch.compile: each converted layer scales and casts its tensors "
        "in separate kernels every step, which costs more than the float8 matmul saves; torchao's speed-ups are "
        "measured compiled. Set compile_mode='default'.",
    ),
]

LADDER: list[Climb] = []

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {}


def gains_from_float8(out_features: int, in_features: int, recipe: str) -> bool:
    """Whether a linear layer of this shape runs faster in float8 under ``recipe``: torchao's per-shape rule.

    From torchao 0.18 (``torchao/float8/float8_linear_utils.py``, ``_auto_filter_for_tensorwise`` and
    ``_auto_filter_for_rowwise``, drawn from the performance tables in ``torchao/float8/README.md``, measured on
    H100s): both dimensions must be multiples of 16 (the float8 kernels' requirement); tensorwise skips layers with
    ``in <= 4096 and out <= 1024``; rowwise, slower to scale, needs ``out > 2048`` and ``in > 1024`` and skips
    ``out <= 4096 and in <= 2048``. The rule reads the weight alone: the tokens per step (the matmul's M) add to
    every layer's gain alike.
    """
    if out_features % 16 or in_features % 16:
        return False
    if recipe == "tensorwise":
        return not (in_features <= 4096 and out_features <= 1024)
    if out_features <= 2048 or in_features <= 1024:
        return False
    return not (out_features <= 4096 and in_features <= 2048)


def converts(config: Config) -> bool:
    return config.float8 != "off"


def selected_layers(model: nn.Module, config: Config) -> tuple[list[str], list[str]]:
    """(the linear layers converted, those left in high precision), by name: ``"mlp.up (4096 -> 14336)"``."""
    chosen, left = [], []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            label = f"{name or 'the model'} ({module.in_features} -> {module.out_features})"
            wins = gains_from_float8(module.out_features, module.in_features, config.float8)
            (chosen if wins else left).append(label)
    return chosen, left


def model_notes(workload: Workload, config: Config) -> list[str]:
    """What float8 will convert of ``workload``'s model, said before any process starts; a ValueError naming the
    install line when torchao is absent. A factory's model is read on the meta device (no memory for weights)."""
    if not converts(config):
        return []
    if importlib.util.find_spec("torchao") is None:
        raise ValueError(f"float8={config.float8!r} trains through torchao, which is not installed here: {INSTALL}")
    outline = workload.model_outline()
    if outline is None:
        return []
    chosen, left = selected_layers(outline, config)
    model = type(outline).__name__
    if not chosen:
        return [f"float8={config.float8!r} converts no layer of Workload.model ({model}): each of its "
                f"{len(left)} linear layers is below torchao's size rule for {config.float8} scaling (or has a "
                "dimension that is no multiple of 16), so float8 changes nothing here"]
    kept = f"; left in high precision (too small to gain): {', '.join(left[:4])}" if left else ""
    more = f" and {len(left) - 4} more" if len(left) > 4 else ""
    return [f"float8={config.float8!r} converts {len(chosen)} of {len(chosen) + len(left)} linear layers of "
            f"Workload.model ({model}){kept}{more}"]


def convert(model: nn.Module, config: Config) -> nn.Module:
    """Swap the linear layers that gain (:func:`gains_from_float8`) for torchao's ``Float8Linear``, in place; before
    the model is wrapped (FSDP shards the converted layers) and compiled (which fuses their casts)."""
    if not converts(config):
        return model
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    recipe = config.float8

    def wanted(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and gains_from_float8(module.out_features, module.in_features, recipe)

    return convert_to_float8_training(model, module_filter_fn=wanted,
                                      config=Float8LinearConfig.from_recipe_name(recipe))


# -- recipes --------------------------------------------------------------------------------------------------------
_IMPORT = "from torchao.float8 import Float8LinearConfig, convert_to_float8_training"
_SHAPE_RULE = {
    "tensorwise": "return not (module.in_features <= 4096 and module.out_features <= 1024)",
    "rowwise": "return (module.out_features > 2048 and module.in_features > 1024\n"
               "        and not (module.out_features <= 4096 and module.in_features <= 2048))",
}


def _filter_code(recipe: str) -> str:
    """:func:`gains_from_float8` for ``recipe`` as a module filter torchao calls per layer (tested against it)."""
    return (f'''def gains_from_float8(module, fqn):
    """torchao's per-shape rule for {recipe} scaling: the linear layers whose float8 matmuls outrun the scaling and
    casting they add (both dimensions multiples of 16, as the float8 kernels need)."""
    if not isinstance(module, nn.Linear) or module.out_features % 16 or module.in_features % 16:
        return False
    {_SHAPE_RULE[recipe]}''')


def _convert_line(config: Config, where: str = "") -> str:
    return ("model = convert_to_float8_training(model, module_filter_fn=gains_from_float8,\n"
            f"                                   config=Float8LinearConfig.from_recipe_name({config.float8!r}))"
            f"{where}")


def _pytorch_recipe(config: Config, context: RecipeContext) -> list[RecipePart]:
    if not converts(config):
        return []
    return [Code("float8", "imports", _IMPORT), Code("float8", "helpers", _filter_code(config.float8)),
            Code("float8", "prepare", _convert_line(config), "the linear layers that gain become float8 ones "
                 "before anything wraps or compiles them (torchao's convert_to_float8_training)")]


def _framework_recipe(where: str) -> RecipeEntry:
    """The same conversion on the model before the framework takes it: none of the three has torchao's float8 with
    a per-shape filter among its settings (Accelerate's AORecipeKwargs comes with mixed_precision='fp8', the keyword
    that says the burst's autocast precision)."""

    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        if not converts(config):
            return []
        return [Code("float8", "code", _IMPORT), Code("float8", "code", "from torch import nn"),
                Code("float8", "code", _filter_code(config.float8)),
                Code("float8", "code", _convert_line(config, f"  # {where}"))]

    return entry


#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "float8": {
        "pytorch": _pytorch_recipe,
        "hf": _framework_recipe("before the Trainer is built"),
        "lightning": _framework_recipe("your LightningModule's __init__"),
        "accelerate": _framework_recipe("before accelerator.prepare"),
    },
}


OWNER = Owner(
    group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE,
    model_steps={"low-precision": lambda model, config, site: convert(model, config)},
    model_notes=model_notes,
)
