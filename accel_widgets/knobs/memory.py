"""Memory: activation checkpointing (recompute a block's activations in backward instead of keeping them) and the
CUDA caching allocator's expandable segments.

Both trade something for room. Checkpointing trades compute: each repeated block keeps only its input through the
forward and runs its forward again in backward ("blocks"), or keeps its matmul outputs and recomputes only the cheap
ops around them ("selective", PyTorch's selective activation checkpointing). Expandable segments trade nothing
measurable: the allocator maps memory into segments that grow instead of carving fixed blocks, so memory freed by
one shape can hold the next (fewer "reserved but unallocated" bytes, fewer fragmentation OOMs).

The repeated blocks are the model's (:func:`~accel_widgets.inputs.blocks.block_modules`, or the stack the workload
names); the parallel owner shards the same blocks under FSDP.
"""

from __future__ import annotations

import contextlib
import functools
import os
import textwrap
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from ..inputs.blocks import block_modules
from . import parallel
from .base import (
    Climb,
    Code,
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
    blocks_code,
    helper_parts,
)
from .owner import Owner

if TYPE_CHECKING:
    from ..inputs.workload import Workload
    from .config import Config

GROUP = "memory"
TITLE = "Memory"

KNOBS = [
    Knob(
        "activation_checkpointing", GROUP, str, "off", choices=("off", "blocks", "selective"),
        short="checkpointing",
        what="Recompute the activations of the model's repeated blocks (an nn.ModuleList or nn.Sequential of two "
        "or more modules of one class: a transformer's layers) in backward instead of keeping them: 'blocks' keeps "
        "each block's input only; 'selective' also keeps its matmul and attention outputs and recomputes the rest.",
        why="Activations, not weights, fill memory at large batch sizes; a block's forward run again costs about a "
        "third more compute for it ('blocks'), much less for 'selective', which recomputes only the cheap "
        "elementwise ops and norms.",
        when="Memory is the limit: the batch size you want does not fit, or a larger one would be faster. At the "
        "same batch size it only slows a step (the batch-size finder and the ladder's +memory rung use it where "
        "memory is the limit).",
        search=Search(left_out="at the same batch size it only adds recompute: it pays through the larger batch "
                      "it makes room for (find_batch_size tries it)"),
    ),
    Knob(
        "expandable_segments", GROUP, bool, False, applies_to=("cuda",),
        short="expandable",
        what="CUDA caching allocator with expandable segments (PYTORCH_ALLOC_CONF=expandable_segments:True, merged "
        "into whichever of it and PYTORCH_CUDA_ALLOC_CONF torch reads), set in each rank before it initialises CUDA; "
        "the rank reads back from the allocator whether its segments are expandable.",
        why="The default allocator carves fixed-size segments: memory freed by one tensor shape often cannot hold "
        "the next, so it reserves more than it allocates and can run out with free memory left in pieces. "
        "Expandable segments map more memory into the same segment as it grows.",
        when="Out-of-memory errors with memory reserved but unallocated, batch or sequence shapes that change, or "
        "peak reserved well above peak allocated (the result shows both). No effect on CPU.",
    ),
]


def _no_blocks(config: Config, model: nn.Module) -> str:
    """Why checkpointing cannot act on ``model``, naming the user's class and what would do."""
    return (f"activation_checkpointing={config.activation_checkpointing!r} recomputes the model's repeated blocks, "
            f"and Workload.model ({type(model).__name__}) has none: no nn.ModuleList or nn.Sequential holds two or "
            "more modules of one class with parameters. Hold the layers in an nn.ModuleList (as transformers do), "
            "or leave activation_checkpointing='off'")


RULES: list[Rule] = []

LADDER = [
    Climb("+memory", "activation checkpointing makes room for a larger batch where memory is the limit",
          lambda device, workload: {"activation_checkpointing": "blocks"} if _has_blocks(workload) else {},
          only_when=("memory_full", "out_of_memory")),
]

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {
    "allocator_slack": lambda c: Remedy("expandable_segments", "expandable segments let freed memory hold the next "
                                        "shapes", True) if not c.expandable_segments else None,
}


def _has_blocks(workload: Workload) -> bool:
    outline = workload.model_outline()
    return outline is not None and bool(block_modules(outline, workload.blocks))


# -- activation checkpointing -------------------------------------------------------------------------------------
#: What selective checkpointing keeps: the outputs of matmuls and fused attention, the ops whose recompute costs
#: most per byte kept (torchtitan's "op" policy keeps the same kinds). Everything else in a block (norms, activations,
#: dropout, residual adds) is recomputed in backward.
_SAVED_OP_NAMES = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm",
                   "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
                   "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
_SAVED_OPS = tuple(getattr(torch.ops.aten, name).default for name in _SAVED_OP_NAMES)


def checkpointing(config: Config) -> bool:
    return config.activation_checkpointing != "off"


def with_checkpointing(config: Config) -> Config:
    """``config`` with each repeated block's activations recomputed: what makes room when the batch does not fit."""
    return config.replace(activation_checkpointing="blocks")


def room_maker(config: Config, workload: Workload) -> Config | None:
    """The config that saves memory for ``workload`` where ``config`` has not yet: activation checkpointing of its
    repeated blocks; None when it is on already or the model has no repeated blocks."""
    if checkpointing(config) or not _has_blocks(workload):
        return None
    return with_checkpointing(config)


def model_notes(workload: Workload, config: Config) -> list[str]:
    """Refuse, before any process starts, a checkpointing config whose model has no repeated blocks (ValueError).

    A factory's model is read on the meta device; one that cannot be built there is checked by the ranks."""
    if not checkpointing(config):
        return []
    outline = workload.model_outline()
    if outline is not None and not block_modules(outline, workload.blocks):
        raise ValueError(_no_blocks(config, outline))
    return []


def checkpoint_blocks(model: nn.Module, config: Config, blocks_path: str | None = None) -> nn.Module:
    """Run each repeated block's forward under ``torch.utils.checkpoint`` (non-reentrant), in place.

    The block's own ``forward`` is replaced on the instance, so its parameters keep their names (no wrapper module:
    state dicts, FSDP's units and optimizers see the model as it was) and ``nn.Module.__call__``'s hooks (FSDP's
    all-gather) still run around it. Non-reentrant: it works with autograd's hooks, keyword arguments and inputs
    that need no gradient, and recomputes only when backward reaches the block. The RNG state is replayed, so
    dropout draws the same masks and the losses are the same as without it.
    """
    if not checkpointing(config):
        return model
    blocks = block_modules(model, blocks_path)
    if not blocks:
        raise ValueError(_no_blocks(config, model))
    context = ({"context_fn": functools.partial(create_selective_checkpoint_contexts, list(_SAVED_OPS))}
               if config.activation_checkpointing == "selective" else {})
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False, **context)
    return model


def _checkpointed_forward(module: nn.Module) -> functools.partial | None:
    """The forward :func:`checkpoint_blocks` set on ``module``'s instance, or None."""
    forward = module.__dict__.get("forward")
    return forward if isinstance(forward, functools.partial) and forward.func is checkpoint else None


@contextlib.contextmanager
def forward_once(model: nn.Module) -> Iterator[None]:
    """Each checkpointed block runs its own forward, once, for the duration: the FLOPs MFU counts are the model's
    (PaLM's model FLOPs), not the forward checkpointing runs again in backward (hardware FLOPs), which would raise
    MFU by about a third for the same training done."""
    wrapped = [(module, forward) for module in model.modules() if (forward := _checkpointed_forward(module))]
    for module, forward in wrapped:
        module.forward = forward.args[0]
    try:
        yield
    finally:
        for module, forward in wrapped:
            module.forward = forward


# -- the allocator --------------------------------------------------------------------------------------------------
#: Where torch reads the CUDA allocator's settings, in the order it reads them: c10's ``AllocatorConfig`` (torch 2.9
#: on) parses ``PYTORCH_ALLOC_CONF`` when it is set and the deprecated ``PYTORCH_CUDA_ALLOC_CONF`` (with a warning)
#: only when it is not. So the setting joins the first one set, and goes into the first where neither is: written
#: into the other, it would be ignored without a word.
ALLOCATOR_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
_EXPANDABLE = "expandable_segments"


def allocator_settings_with_expandable_segments(settings: str | None) -> str:
    """``settings`` (``"max_split_size_mb:128,garbage_collection_threshold:0.8"``) with expandable segments on: the
    user's other settings are kept, a setting of the same key replaced."""
    kept = [part for part in (settings or "").split(",")
            if part.strip() and part.split(":", 1)[0].strip() != _EXPANDABLE]
    return ",".join([*kept, f"{_EXPANDABLE}:True"])


@contextlib.contextmanager
def allocator(config: Config, device_kind: str) -> Iterator[None]:
    """The CUDA allocator's settings this config asks for, in this process's environment, for the duration.

    Must be entered before the process initialises CUDA: the allocator reads its settings once, when it starts.
    A rank enters it before choosing its device; the in-process fallback runs in the caller, where CUDA may be up
    already, and then says (a warning) that the knob could not act. The environment is put back on exit, so the
    caller's (the in-process fallback) is as it was. Off, or on a CPU: nothing changes.
    """
    if device_kind != "cuda" or not config.expandable_segments:
        yield
        return
    if torch.cuda.is_initialized():
        warnings.warn("expandable_segments=True could not act: CUDA was initialised in this process before the burst "
                      "(isolation='inprocess'), and the allocator reads its settings when CUDA starts. Run with "
                      "isolation='process'", stacklevel=3)
    name = next((variable for variable in ALLOCATOR_VARIABLES if os.environ.get(variable)), ALLOCATOR_VARIABLES[0])
    saved = os.environ.get(name)
    os.environ[name] = allocator_settings_with_expandable_segments(saved)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def segments_expandable(devices: list[torch.device]) -> bool | None:
    """Whether the CUDA caching allocator's segments are expandable, as its snapshot says of each one: the knob's
    proof that it acted. The allocator reads its settings once, when CUDA starts, so a setting made too late or in a
    variable torch does not read leaves them fixed without a word. None on a CPU, or before any segment exists."""
    if devices[0].type != "cuda":
        return None
    used = {device.index for device in devices}
    found = [bool(segment.get("is_expandable")) for segment in torch.cuda.memory_snapshot()
             if segment.get("device") in used]
    return all(found) if found else None


def allocator_not_in_effect(config: Config, expandable: bool | None) -> Remedy | None:
    """Why a burst that asked for expandable segments ran without them (``expandable``: what its allocator said), as
    the knob and its words; None where the allocator did as the knob asked or could not say."""
    if not config.expandable_segments or expandable is not False:
        return None
    return Remedy("expandable_segments", "expandable_segments=True did not act: the CUDA allocator's segments were "
                  "fixed. The allocator reads its settings once, when CUDA starts, so CUDA was started in the rank "
                  "before the setting was made (an import that touches CUDA at the top of the workload's module), or a "
                  "setting of yours overrides it")


# -- recipes --------------------------------------------------------------------------------------------------------
def _checkpoint_lines(config: Config, context: RecipeContext, slot: RecipeSlot, where: str = "") -> list[RecipePart]:
    """:func:`checkpoint_blocks` as code: each block's forward replaced on the instance, in the loop's ``prepare``
    slot or a framework's code; the selective policy's ops as a constant."""
    blocks, helper = blocks_code(context, "model", one_stack=False)
    selective = config.activation_checkpointing == "selective"
    names = "checkpoint, create_selective_checkpoint_contexts" if selective else "checkpoint"
    imports = ["import functools", f"from torch.utils.checkpoint import {names}"]
    names_code = textwrap.fill(", ".join(f'"{name}"' for name in _SAVED_OP_NAMES), 112, initial_indent="    ",
                               subsequent_indent="    ")
    constant = f"SAVED_OPS = [getattr(torch.ops.aten, name).default for name in (\n{names_code},\n)]"
    context_fn = (",\n                                      context_fn=functools.partial("
                  "create_selective_checkpoint_contexts, SAVED_OPS)") if selective else ""
    loop = (f"for block in {blocks}:{where}\n    block.forward = functools.partial(checkpoint, block.forward, "
            f"use_reentrant=False{context_fn})")
    why = ("selective: the outputs of matmuls and attention are kept, the cheap ops around them recomputed"
           if selective else "")
    if slot == "code":
        return [*(Code("activation_checkpointing", "code", line) for line in ["import torch", *imports]),
                *([Code("activation_checkpointing", "code", constant, why)] if selective else []),
                *helper_parts("activation_checkpointing", "code", helper), Code("activation_checkpointing", "code",
                                                                                  loop)]
    return [*(Code("activation_checkpointing", "imports", line) for line in imports),
            *([Code("activation_checkpointing", "constants", constant, why)] if selective else []),
            *helper_parts("activation_checkpointing", "helpers", helper),
            Code("activation_checkpointing", "prepare", loop)]


def _pytorch_checkpointing(config: Config, context: RecipeContext) -> list[RecipePart]:
    return _checkpoint_lines(config, context, "prepare") if checkpointing(config) else []


def _framework_checkpointing(where: str, plugin: str, keyword: str) -> RecipeEntry:
    """Whole blocks recomputed: the framework's own switch where it has one (``keyword`` of the style's object, or
    of its FSDP plugin or config ``plugin`` under FSDP, which recomputes inside FSDP's gathers); else, and for the
    selective policy no framework offers, the burst's lines on the model before the framework takes it."""

    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        if not checkpointing(config):
            return []
        if config.activation_checkpointing == "blocks" and plugin and parallel.sharded(config):
            return [Setting("activation_checkpointing", "activation_checkpointing", True, call=plugin)]
        if config.activation_checkpointing == "blocks" and keyword:
            return [Setting("activation_checkpointing", keyword, True)]
        return _checkpoint_lines(config, context, "code", f"  # {where}")

    return entry


def _allocator_code() -> str:
    """:func:`allocator` as code: expandable segments added to the settings the environment has."""
    first, *_ = ALLOCATOR_VARIABLES
    return (f"alloc = next((name for name in {ALLOCATOR_VARIABLES!r} if os.environ.get(name)),\n"
            f"             {first!r})\n"
            "kept = [part for part in os.environ.get(alloc, \"\").split(\",\")\n"
            f"        if part.strip() and part.split(\":\", 1)[0].strip() != {_EXPANDABLE!r}]\n"
            f"os.environ[alloc] = \",\".join([*kept, \"{_EXPANDABLE}:True\"])")


_ALLOCATOR_WHY = ("Set before anything initialises CUDA (the allocator reads its settings once): freed memory of one "
                  "shape can then hold the next")


def _allocator_entry(slot: RecipeSlot) -> RecipeEntry:
    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        if not config.expandable_segments:
            return []
        top = [Code("expandable_segments", "code", "import os"),
               Code("expandable_segments", "code", "# at the top of your script, before anything touches CUDA")]
        return [*(top if slot == "code" else []), Code("expandable_segments", slot, _allocator_code(), _ALLOCATOR_WHY)]

    return entry


#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "activation_checkpointing": {
        "pytorch": _pytorch_checkpointing,
        "hf": _framework_checkpointing("before the Trainer is built", "fsdp_config", "activation_checkpointing"),
        "lightning": _framework_checkpointing("your LightningModule's __init__", "", ""),
        "accelerate": _framework_checkpointing("before accelerator.prepare", "fsdp_plugin", ""),
    },
    "expandable_segments": {style: _allocator_entry("setup" if style == "pytorch" else "code")
                            for style in ("pytorch", "hf", "lightning", "accelerate")},
}


OWNER = Owner(
    group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE,
    model_steps={"recompute": lambda model, config, site: checkpoint_blocks(model, config, site.blocks)},
    model_notes=model_notes,
)
