"""Python overhead: host syncs for the loss, the optimizer implementation, zero_grad, TorchScript.

Owns the optimizer a rank steps (:func:`build_optimizer`), the loss it calls (:func:`prepare_loss`),
how gradients are cleared and when the loss is read back to the host.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

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
    changed,
    no_equivalent,
)
from .owner import Owner

if TYPE_CHECKING:
    from ..inputs.workload import Workload
    from .config import Config

GROUP = "python"
TITLE = "Python overhead"

KNOBS = [
    Knob(
        "sync_every", "python", int, 1, minimum=0, maximum=1 << 20,
        short="sync every",
        part="host",
        what="Read the loss on the host every N steps (1 = every step, 0 = only at the end).",
        why="loss.item() blocks the host until the GPU finishes, so the GPU idles while Python catches up.",
        when="Launch-bound GPU steps; logging every step is the classic hidden sync. fp16 with a non-fused "
        "optimizer still syncs every step inside GradScaler; BurstOptions(sync_debug=True) names any sync left.",
        # 0 reads the loss only at the end: fewer syncs than any N
        search=Search(values=(1, 0), rank=lambda value, ctx: math.inf if value == 0 else value),
    ),
    Knob(
        "script_loss", "python", bool, False,
        short="scripted loss",
        what="Compile the loss function with TorchScript (legacy; torch.compile replaces it).",
        why="Historically fused small loss ops; kept to show how the legacy path compares.",
        when="Rarely now: TorchScript is deprecated in favour of torch.compile.",
    ),
    Knob(
        "optimizer_impl", "python", str, "default", choices=("default", "for-loop", "foreach", "fused"),
        short="optimizer",
        what="Optimizer implementation: per-parameter loop, multi-tensor foreach, or one fused kernel.",
        why="The for-loop launches kernels per parameter; foreach batches them; fused does it in one kernel.",
        when="Models with many parameter tensors and short steps.",
    ),
    Knob(
        "set_to_none", "python", bool, True,
        what="zero_grad(set_to_none=True): drop gradients instead of writing zeros.",
        why="Skips a memset per parameter and lets the next backward allocate fresh gradients.",
        when="Always, unless code reads .grad before backward.",
    ),
]

RULES: list[Rule] = []  # script_loss's conflict with compiling is the compile module's

LADDER = [
    Climb("+rest", "no per-step loss sync, multi-tensor optimizer",
          lambda device, workload: {"sync_every": 0, "optimizer_impl": "fused" if device.has_cuda else "foreach"}),
]

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {
    "sync_bound": lambda c: Remedy("sync_every", "the loss is read every step, and each read makes the host wait "
                                   "for the GPU", 0) if c.sync_every == 1 else None,
}

_IMPLEMENTATION_FLAGS = {"for-loop": {"foreach": False, "fused": False}, "foreach": {"foreach": True, "fused": False},
                         "fused": {"foreach": False, "fused": True}}


_KNOB = {knob.name: knob for knob in KNOBS}

#: Plain PyTorch: the optimizer rebuilt with another implementation, as :func:`build_optimizer` does.
_REBUILT = '''def rebuilt(optimizer, **implementation):
    """The same optimizer (class, hyperparameters, parameter groups) built with another implementation."""
    accepted = inspect.signature(type(optimizer)).parameters
    groups = [{k: v for k, v in group.items() if k == "params" or (k in accepted and k not in implementation)}
              for group in optimizer.param_groups]
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return type(optimizer)(groups, **{**defaults, **implementation})'''


def _loss_read(config: Config, context: RecipeContext) -> list[RecipePart]:
    """Plain PyTorch: when the losses of the steps so far are read to the host (the condition of an ``if``)."""
    every = config.sync_every
    condition = "True" if every == 1 else "False" if every == 0 else f"(step + 1) % {every} == 0"
    return [Code("sync_every", "read_loss", condition)]


def _implementation(config: Config, context: RecipeContext) -> list[RecipePart]:
    if config.optimizer_impl == "default":
        return []
    flags = ", ".join(f"{name}={value}" for name, value in _IMPLEMENTATION_FLAGS[config.optimizer_impl].items())
    return [Code("optimizer_impl", "imports", "import inspect"), Code("optimizer_impl", "helpers", _REBUILT),
            Code("optimizer_impl", "optimizer", f"optimizer = rebuilt(optimizer, {flags})")]


def _implementation_in_own_code(config: Config, context: RecipeContext) -> list[RecipePart]:
    if config.optimizer_impl == "default":
        return []
    flags = ", ".join(f"{name}={value}" for name, value in _IMPLEMENTATION_FLAGS[config.optimizer_impl].items())
    return [Code("optimizer_impl", "code", f"# build your optimizer with {flags}, e.g. "
                                           f"torch.optim.AdamW(model.parameters(), lr=1e-3, {flags})")]


def _hf_optimizer(config: Config, context: RecipeContext) -> list[RecipePart]:
    """The Trainer builds its own optimizer from ``optim``: AdamW's fused or multi-tensor one."""
    names = {"fused": "adamw_torch_fused", "foreach": "adamw_torch"}
    if config.optimizer_impl in names:
        return [Setting("optimizer_impl", "optim", names[config.optimizer_impl],
                        why="(for AdamW, the Trainer's own optimizer) " + _KNOB["optimizer_impl"].why)]
    return no_equivalent(_KNOB["optimizer_impl"], "the Trainer's AdamW has no for-loop option: subclass the Trainer "
                         "(create_optimizer) to build it with foreach=False")(config, context)


def _logged_every(name: str) -> RecipeEntry:
    """A framework that reads the loss when it logs: logging every N steps is reading it every N."""
    return lambda config, context: [Setting("sync_every", name, config.sync_every)] if config.sync_every > 1 else []


#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "sync_every": {"pytorch": _loss_read, "hf": _logged_every("logging_steps"),
                   "lightning": _logged_every("log_every_n_steps"),
                   "accelerate": no_equivalent(_KNOB["sync_every"], lambda config: "in your loop, read loss.item() "
                                               + ("only at the end" if config.sync_every == 0 else
                                                  f"every {config.sync_every} steps, not every step"))},
    "script_loss": {"pytorch": lambda config, context: [Code("script_loss", "loss_fn", "loss_fn = torch.jit.script("
                                                              "loss_fn)")] if config.script_loss else [],
                    **{style: no_equivalent(_KNOB["script_loss"], "TorchScript is legacy: torch.compile the model "
                                            "instead") for style in ("hf", "lightning", "accelerate")}},
    "optimizer_impl": {"pytorch": _implementation, "hf": _hf_optimizer, "lightning": _implementation_in_own_code,
                       "accelerate": _implementation_in_own_code},
    "set_to_none": {
        "pytorch": lambda config, context: [Code("set_to_none", "zero_grad",
                                                 f"optimizer.zero_grad(set_to_none={config.set_to_none})")],
        "hf": no_equivalent(_KNOB["set_to_none"], "the Trainer zeroes gradients with set_to_none=True: subclass it "
                            "(training_step) to zero them in place"),
        "lightning": no_equivalent(_KNOB["set_to_none"], "override LightningModule.optimizer_zero_grad to call "
                                   "optimizer.zero_grad(set_to_none=False)"),
        "accelerate": lambda config, context: [Code("set_to_none", "code", "optimizer.zero_grad(set_to_none=False)  "
                                                    "# in your loop")] if changed(_KNOB["set_to_none"], config) else [],
    },
}


def build_optimizer(workload: Workload, params: list[nn.Parameter], config: Config) -> torch.optim.Optimizer:
    """The workload's optimizer, rebuilt with the requested implementation (for-loop / foreach / fused)."""
    optimizer = workload.build_optimizer(params)
    if config.optimizer_impl == "default":
        return optimizer
    flags = _IMPLEMENTATION_FLAGS[config.optimizer_impl]
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    missing = [name for name in flags if name not in accepted]
    if missing:
        raise ValueError(f"optimizer_impl={config.optimizer_impl!r}: {cls.__name__} has no {missing[0]!r} option")
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    # Per-group copies of the old flags would override the new defaults, so groups drop them.
    groups = [{k: v for k, v in g.items() if k == "params" or (k in accepted and k not in flags)}
              for g in optimizer.param_groups]
    return cls(groups, **{**defaults, **flags})


def prepare_loss(workload: Workload, config: Config) -> Callable[[Any, Any], torch.Tensor] | None:
    """The workload's loss function, or its TorchScript compilation (None: the model computes the loss)."""
    if not config.script_loss:
        return workload.loss_fn
    if workload.loss_fn is None:
        raise ValueError("script_loss=True compiles the workload's loss_fn, and this workload has none (the model "
                         "or its step computes the loss): turn script_loss off")
    # Legacy path, kept for comparison: TorchScript is deprecated in favour of torch.compile.
    try:
        return torch.jit.script(workload.loss_fn)
    except Exception as exc:
        raise ValueError(
            f"script_loss=True: the loss function cannot be compiled by TorchScript ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0]}). TorchScript is legacy; turn script_loss off."
        ) from exc


def zero_grad(optimizer: torch.optim.Optimizer, config: Config) -> None:
    """Why set_to_none: the next backward writes fresh gradients instead of adding into zeroed ones."""
    optimizer.zero_grad(set_to_none=config.set_to_none)


def frees_gradients(config: Config) -> bool:
    """Whether zero_grad frees the gradients between steps (``set_to_none``): otherwise they stay allocated, zeroed,
    through the next forward."""
    return config.set_to_none


def loss_read_due(unread_steps: int, config: Config, *, host_free: bool = False) -> bool:
    """Why sync_every: reading a loss (.item()) blocks the host until the device has run every queued kernel.
    ``host_free``: a host-free headspace burst reads none until its window ends, as ``sync_every=0`` would."""
    return not host_free and bool(config.sync_every) and unread_steps >= config.sync_every


def scripted_loss(config: Config) -> bool:
    """Whether the loss function runs as TorchScript (the legacy path)."""
    return config.script_loss


OWNER = Owner(group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE)
