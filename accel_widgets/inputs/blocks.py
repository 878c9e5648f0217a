"""A model's repeated blocks: the transformer layers (or any stack of one module class) a model is made of.

What works per block -- compiling each block rather than the whole model, so identical blocks share one compiled
graph (PyTorch's regional compilation recipe, Accelerate's ``compile_regions``) -- needs to know which modules the
blocks are. Models say it in their structure: the blocks are the children of an ``nn.ModuleList`` or
``nn.Sequential`` that are all alike, one class of one shape (``GPT2Model.h``, ``BertEncoder.layer``,
``TinyGPT.blocks``).
Where a model holds several such stacks, compiling takes the one with the most parameters (:func:`find_blocks`), and
what wraps every block -- activation checkpointing, FSDP's units -- takes the outermost stacks of one class
(:func:`block_modules`: an encoder's and a decoder's layers). A workload names the stack with
``Workload(blocks="path.to.stack")``, and every knob then works on that one.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

#: The containers whose children can be a model's blocks.
STACKS = (nn.ModuleList, nn.Sequential)


class BlocksNotFound(ValueError):
    """The workload named a stack of blocks the model does not have; the message says which stacks it has."""


@dataclass(frozen=True)
class Blocks:
    """A stack of repeated blocks in a model: where it is (``path``, dotted from the model), the blocks' class and
    the blocks themselves, and their share of the model's parameters (what regional compilation leaves to eager
    code is the rest)."""

    path: str
    kind: str
    modules: tuple[nn.Module, ...]
    parameter_share: float

    @property
    def count(self) -> int:
        return len(self.modules)

    def text(self) -> str:
        """``"12 x GPT2Block at transformer.h (86% of the parameters)"``."""
        return (f"{self.count} x {self.kind} at {self.path or 'the model'} ({self.parameter_share:.0%} of the "
                "parameters)")


def find_blocks(model: nn.Module, path: str | None = None) -> Blocks | None:
    """The model's repeated blocks: the stack at ``path`` when given (its children, whatever they are), else the
    ``nn.ModuleList``/``nn.Sequential`` of two or more alike modules holding the most parameters; None
    when the model has no such stack. A ``path`` the model does not have raises :class:`BlocksNotFound`."""
    total = _parameters(model)
    if path is not None:
        return _stack_at(model, path, total)
    found = [(name, list(module.children())) for name, module in model.named_modules()
             if isinstance(module, STACKS) and _repeated(list(module.children()))]
    if not found:
        return None
    name, children = max(found, key=lambda item: (sum(_parameters(child) for child in item[1]), len(item[1])))
    return _blocks(name, children, total)


def block_modules(model: nn.Module, path: str | None = None) -> list[nn.Module]:
    """The blocks to wrap one by one (checkpointing, FSDP's units): the children of the stack at ``path`` when given,
    else the children of every outermost ``nn.ModuleList``/``nn.Sequential`` of two or more modules of one class,
    each with parameters (a block found is not searched for blocks of its own, so nothing is wrapped twice).

    Why this shape: it is how models hold a stack of identical layers (GPT-2's ``h``, Llama's ``layers``, BERT's
    ``encoder.layer``), and such layers are what checkpointing and FSDP want as their unit: each holds a similar
    share of the activations and of the parameters."""
    if path is not None:
        return list(_stack_at(model, path, _parameters(model)).modules)
    if _is_stack_of_one_class(model):
        return list(model.children())
    return [block for child in model.children() for block in block_modules(child)]


def _is_stack_of_one_class(module: nn.Module) -> bool:
    children = list(module.children())
    return (isinstance(module, STACKS) and len(children) >= 2 and len({type(child) for child in children}) == 1
            and all(any(True for _ in child.parameters()) for child in children))


def stacks_text(model: nn.Module) -> str:
    """The stacks of repeated blocks a model has, for a message: ``"'blocks' (2 x Block)"`` or ``"none"``."""
    found = [f"{name!r} ({len(children)} x {type(children[0]).__name__})" for name, module in model.named_modules()
             if isinstance(module, STACKS) and _repeated(children := list(module.children()))]
    return ", ".join(found) or "none"


def _stack_at(model: nn.Module, path: str, total: int) -> Blocks:
    try:
        stack = model.get_submodule(path)
    except AttributeError:
        raise BlocksNotFound(f"Workload.blocks={path!r}: {type(model).__name__} has no submodule {path!r}; its stacks "
                             f"of repeated blocks: {stacks_text(model)}") from None
    children = list(stack.children())
    if not children:
        raise BlocksNotFound(f"Workload.blocks={path!r} is a {type(stack).__name__} without child modules: name the "
                             f"ModuleList or Sequential that holds the blocks (the model has: {stacks_text(model)})")
    return _blocks(path, children, total)


def _blocks(path: str, children: list[nn.Module], total: int) -> Blocks:
    kinds = sorted({type(child).__name__ for child in children})
    share = sum(_parameters(child) for child in children) / total if total else 0.0
    return Blocks(path, "/".join(kinds), tuple(children), share)


def _repeated(children: list[nn.Module]) -> bool:
    """Two or more modules of one class and one structure (their reprs name every submodule and its shapes): blocks
    that differ (a CNN's stages of growing width, all ``nn.Sequential``) would each compile a graph of their own."""
    return len(children) >= 2 and len({(type(child), repr(child)) for child in children}) == 1


def _parameters(module: nn.Module) -> int:
    """Elements of the module's parameters, each counted once (a tied weight is one tensor)."""
    return sum(p.numel() for p in module.parameters())


def block_stack_paths(model: nn.Module, path: str | None = None) -> list[str]:
    """The dotted paths of the stacks :func:`block_modules` takes its blocks from (``["encoder.layer",
    "decoder.layer"]``): what a recipe names so its code reads the blocks from the user's model directly."""
    if path is not None:
        return [path]
    stacks = {id(module): name for name, module in model.named_modules() if _is_stack_of_one_class(module)}
    parents = {id(child): id(module) for module in model.modules() for child in module.children()}
    return list(dict.fromkeys(stacks[parents[id(block)]] for block in block_modules(model)))


#: :func:`find_blocks` as code with no accel_widgets import, for a recipe that cannot name the stack (the
#: tests run it against the function on the same models).
FIND_BLOCKS_CODE = '''def repeated_blocks(model):
    """The model's stack of repeated blocks: the nn.ModuleList or nn.Sequential of two or more alike modules (one
    class, one structure) holding the most parameters; [] when it has none."""
    stacks = [list(module.children()) for module in model.modules()
              if isinstance(module, (nn.ModuleList, nn.Sequential))]
    alike = [blocks for blocks in stacks if len(blocks) >= 2 and len({(type(b), repr(b)) for b in blocks}) == 1]
    return max(alike, key=lambda blocks: (sum(p.numel() for b in blocks for p in b.parameters()), len(blocks)),
               default=[])'''

#: :func:`block_modules` as code, likewise.
BLOCK_MODULES_CODE = '''def block_modules(model):
    """The blocks to wrap one by one: the children of every outermost nn.ModuleList or nn.Sequential of two or more
    modules of one class, each with parameters (a transformer's layers)."""
    children = list(model.children())
    if (isinstance(model, (nn.ModuleList, nn.Sequential)) and len(children) >= 2
            and len({type(child) for child in children}) == 1
            and all(any(True for _ in child.parameters()) for child in children)):
        return children
    return [block for child in children for block in block_modules(child)]'''
