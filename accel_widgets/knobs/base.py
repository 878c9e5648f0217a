"""What every knob module is made of: the :class:`Knob` declaration, the registry, and :class:`Rule`.

A knob module (``data``, ``precision``, ...) declares its knobs and its rules with these and owns the
knobs' behaviour; :mod:`accel_widgets.knobs` joins them into one registry.
"""

from __future__ import annotations

import difflib
import math
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..inputs.blocks import BLOCK_MODULES_CODE, FIND_BLOCKS_CODE, block_stack_paths, find_blocks

if TYPE_CHECKING:
    from ..inputs.device import DeviceInfo
    from ..inputs.workload import Workload
    from .config import Config

#: A knob's group: the ``GROUP`` of the module that owns it (``"data"``, ``"precision"``, ...).
Group = str
DeviceKind = Literal["cpu", "cuda"]
#: A part of the training step a headspace burst can make free (:mod:`accel_widgets.knobs.parts` declares each): the
#: data (loader and copy), the gradients' communication between ranks, the host's per-step work.
Part = Literal["data", "communication", "host"]


class KnobValueError(ValueError):
    """A knob was given a value outside its declared choices or range; the message names the valid ones."""


@dataclass(frozen=True)
class CodePaths:
    """Which code paths a burst's step ran, recorded by the engine on rank 0's (unwrapped, uncompiled) model over
    one micro-batch: what a knob's effect needs in order to act at all.

    ``sdpa``: ``scaled_dot_product_attention`` was called (the one op ``sdpa_backend`` picks kernels for);
    ``convolution``: a convolution ran (what channels_last and cuDNN autotuning change); ``cuda``: the step ran on
    a CUDA device, so every batch is copied host-to-device (what pinned memory and non-blocking copies speed up).
    A knob names the paths it needs (:attr:`Knob.needs`); where one never ran, flipping the knob cannot change the
    step, so a search does not spend bursts on it.
    """

    sdpa: bool
    convolution: bool
    cuda: bool


#: What each code path is, as a sentence about a knob that needs it reads it.
CODE_PATH_TEXT: dict[str, str] = {
    "sdpa": "calls to scaled_dot_product_attention",
    "convolution": "convolutions",
    "cuda": "host-to-device copies on a CUDA device",
}
CodePath = Literal["sdpa", "convolution", "cuda"]


@dataclass(frozen=True)
class SearchContext:
    """What a search knows when it picks a knob's candidate values: the config it starts from, the workload and
    the machine."""

    config: Config
    workload: Workload
    device: DeviceInfo


@dataclass(frozen=True)
class Search:
    """How a search (:func:`accel_widgets.search.tuner.tune`) tries a knob, as its owner declares it.

    ``left_out``: why a search leaves the knob alone unless it is named (it changes what is trained, or never
    speeds a step up); "" for a knob worth searching. ``values``: the candidates, or a function of the
    :class:`SearchContext` giving them; None: the knob's choices, or both booleans. ``ordered``: the values have
    a direction (more workers, a deeper queue, a more aggressive compile), so a search walks away from the current
    value and stops going that way at the first that does not win; None: numeric knobs are ordered. ``rank``:
    where a value stands in that order when its own number does not say it (``sync_every=0`` syncs least).
    """

    left_out: str = ""
    values: tuple[Any, ...] | Callable[[SearchContext], tuple[Any, ...]] | None = None
    ordered: bool | None = None
    rank: Callable[[Any, SearchContext], float] | None = None


#: The conditions the diagnosis reads from a burst, for which a knob owner may know what to try next.
Symptom = Literal[
    "data_wait",  # the step waits on the loader
    "slow_copies",  # host-to-device copies take a visible share of the step
    "stream_rereads",  # every reader of a stream reads all of it and keeps its share
    "frozen_augmentation",  # a cache stored one draw of randomly augmented items
    "starved_loader",  # the step waits on data while the machine's cores are all busy
    "disk_bound",  # the CPUs wait on I/O
    "overhead_bound",  # short steps, the device idle between them
    "sync_bound",  # the device idles while the host waits for it
    "compute_bound",  # compute dominates the step
    "fp32_on_tensor_cores",  # fp32 math on a GPU with bf16/fp16 tensor cores
    "tensor_cores_idle",  # the GPU busy (utilisation) but its tensor cores mostly idle (NVML GPM)
    "memory_full",  # the peak is close to the device's memory
    "allocator_slack",  # the CUDA caching allocator reserved far more than it ever handed out (fragmentation)
    "memory_headroom",  # the peak leaves room
    "out_of_memory",  # the burst ran out of memory, or its process was killed for it
    "diverged",  # a loss went NaN/inf
    "communication_bound",  # the gradients' exchange between ranks takes a large share of the step
    "one_process_many_gpus",  # one process drives several GPUs
    "compile_does_not_pay",  # compiled steps are no faster than eager ones
    "graph_breaks",  # torch.compile broke the model's graph
    "recompiles",  # torch.compile compiled the model's code again (a guard failed: a new shape, a changed value)
]


@dataclass(frozen=True)
class Remedy:
    """What a knob owner advises for a symptom: the knob to try and what to do with it, in a clause that completes
    the diagnosis's sentence ("add DataLoader workers"), and the ``value`` it suggests where it names one (what the
    rules are asked about before the advice is given on a machine: bf16 where bf16 is emulated is no advice)."""

    knob: str
    text: str
    value: Any = None


@dataclass(frozen=True)
class Climb:
    """An owner's part of one rung of the classic ladder (:func:`accel_widgets.search.ladder.classic_ladder`).

    ``rung`` names the rung (the ladder's order is ``RUNGS``), ``why`` says what it buys, ``changes`` gives the
    knob values it sets on a machine for a workload (empty: this part is left out there), and ``title`` the
    rung's name from what it set, where that says more ("+bf16" rather than "+precision"). ``only_when``: the
    symptoms that call for this part (a rung that costs speed to save memory is climbed only where memory is the
    limit); empty: climbed wherever it sets something.
    """

    rung: str
    why: str
    changes: Callable[[DeviceInfo, Workload], dict[str, Any]]
    title: Callable[[dict[str, Any]], str] | None = None
    only_when: tuple[Symptom, ...] = ()


#: The classic ladder's rungs, in the order a tuning session climbs them: the data pipeline first, then the
#: arithmetic, then compile, then the small things (measured on one H200: a better loader gave 1.4x while fp32
#: compute dominated, 2.5x once bf16 had made compute cheap). "+memory" (where memory is the limit) comes after
#: half precision, which halves activations and may lift the limit by itself, and before compile, so the
#: compiled graph is the one with the recomputed blocks and the batch size that then fits.
RUNGS = ("+loader", "+precision", "+memory", "+compile", "+rest")


@dataclass(frozen=True)
class Knob:
    """One optimisation: its valid values and the text a user reads before flipping it. ``needs`` names the code
    paths (:class:`CodePaths`) its effect acts on: none for a knob that acts on every step; ``search`` how a search
    tries it. ``short``: what a label that must fit names it (:meth:`compact`): None for its own name, "" where its
    value names itself (``bf16``, ``ddp``). ``part``: the part of the step whose whole cost is the most this knob can
    remove (its headspace ceiling, :mod:`~accel_widgets.knobs.parts`): a loader knob cannot win more than a step
    with the data free; None where no one part bounds it."""

    name: str
    group: Group
    kind: type
    default: Any
    what: str
    why: str
    when: str
    applies_to: tuple[DeviceKind, ...] = ("cpu", "cuda")
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    allow_none: bool = False
    needs: tuple[CodePath, ...] = ()
    search: Search = Search()
    short: str | None = None
    part: Part | None = None

    def __post_init__(self) -> None:
        unknown = [path for path in self.needs if path not in CODE_PATH_TEXT]
        if unknown:
            raise ValueError(f"knob {self.name!r} needs unknown code path(s) {unknown}: use "
                             f"{', '.join(CODE_PATH_TEXT)}")

    def idle_on(self, paths: CodePaths) -> str:
        """Why this knob cannot act on a step that ran ``paths``, or "" when it can (it needs nothing that did not
        run)."""
        missing = [path for path in self.needs if not getattr(paths, path)]
        if not missing:
            return ""
        return (f"{self.name} acts on {' and '.join(CODE_PATH_TEXT[path] for path in self.needs)}, and the step "
                f"had no {' and no '.join(CODE_PATH_TEXT[path] for path in missing)} (recorded over one micro-batch "
                "of the starting burst)")

    def compact(self, value: Any) -> str:
        """The knob at ``value`` in a few characters, for a label that must fit in a table cell or a title: ``workers
        2``, ``pin`` (a switch on), ``no reshard`` (a switch off), or the value alone (``bf16``)."""
        name = self.name if self.short is None else self.short
        if self.kind is bool:
            return name if value else f"no {name}"
        return f"{name} {value}" if name else str(value)

    def valid_values_text(self) -> str:
        """Human-readable description of the valid values, used in every error message."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind is bool:
            return "True or False"

        def bound(value: float | None, unbounded: str) -> str:
            if value is None:
                return unbounded
            return str(int(value)) if self.kind is int else f"{value:g}"

        noun = "an integer" if self.kind is int else "a number"
        text = f"{noun} in [{bound(self.minimum, '-inf')}, {bound(self.maximum, 'inf')}]"
        return text + " or None" if self.allow_none else text

    def check(self, value: Any) -> Any:
        """Return ``value`` normalised to the knob's type, or raise :class:`KnobValueError`."""
        if value is None and self.allow_none:
            return None
        if self.choices is not None:
            if value in self.choices and type(value) is type(self.default):
                return value
            raise KnobValueError(f"{self.name}={value!r} is invalid: use {self.valid_values_text()}")
        if self.kind is bool:
            if isinstance(value, bool):
                return value
            raise KnobValueError(f"{self.name}={value!r} is invalid: use {self.valid_values_text()}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise KnobValueError(f"{self.name}={value!r} is invalid: use {self.valid_values_text()}")
        if not math.isfinite(value):  # NaN passes every range comparison, and int(inf) raises OverflowError
            raise KnobValueError(f"{self.name}={value!r} is not a finite number: use {self.valid_values_text()}")
        if self.kind is int and int(value) != value:
            raise KnobValueError(f"{self.name}={value!r} is invalid: use {self.valid_values_text()}")
        value = self.kind(value)
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            raise KnobValueError(f"{self.name}={value!r} is out of range: use {self.valid_values_text()}")
        return value

    def parse(self, text: str) -> Any:
        """Parse a command-line string (``--set name=text``) into a checked value."""
        stripped = text.strip()
        if self.allow_none and stripped.lower() in ("none", "null", ""):
            return None
        if self.kind is bool:
            lowered = stripped.lower()
            if lowered in ("1", "true", "yes", "on"):
                return self.check(True)
            if lowered in ("0", "false", "no", "off"):
                return self.check(False)
            raise KnobValueError(f"{self.name}={text!r} is invalid: use true or false")
        if self.kind is str:
            return self.check(stripped)
        try:
            number = float(stripped)
        except ValueError:
            raise KnobValueError(f"{self.name}={text!r} is invalid: use {self.valid_values_text()}") from None
        return self.check(int(number) if self.kind is int and number.is_integer() else number)


class KnobRegistry(Mapping[str, Knob]):
    """Ordered, read-only mapping of knob name to :class:`Knob`."""

    def __init__(self, knobs: list[Knob]) -> None:
        self._knobs = {k.name: k for k in knobs}
        if len(self._knobs) != len(knobs):
            raise ValueError("duplicate knob names in the registry")

    def __getitem__(self, name: str) -> Knob:
        try:
            return self._knobs[name]
        except KeyError:
            close = difflib.get_close_matches(str(name), self._knobs, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KnobValueError(f"unknown knob {name!r}{hint}: known knobs are {', '.join(self._knobs)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._knobs)

    def __len__(self) -> int:
        return len(self._knobs)

    def in_group(self, group: Group) -> list[Knob]:
        return [k for k in self._knobs.values() if k.group == group]

    def defaults(self) -> dict[str, Any]:
        return {name: k.default for name, k in self._knobs.items()}


@dataclass(frozen=True)
class Rule:
    """A combination of knob values (on a device) that cannot run ("error") or makes no sense ("warning").

    ``knobs`` names the knobs involved, so the panel can attach the message to the right controls.
    """

    knobs: tuple[str, ...]
    severity: Literal["error", "warning"]
    applies: Callable[[Config, DeviceInfo], bool]
    message: Callable[[Config, DeviceInfo], str]


@dataclass(frozen=True)
class Facts:
    """What the knob owners say about how a burst ran, so analysis never re-derives it from the config.

    ``math``: the arithmetic matmuls ran in ("fp32", "tf32", "bf16", "fp16"), which picks the guard's
    tolerance and the MFU's peak; ``compiled``: the first step paid a compile; ``gpus``: GPUs the burst
    kept busy (MFU's denominator); ``micro_batches``: micro-batches per optimizer step; ``sharded``: each rank
    held a shard of the parameters, gradients and optimizer state (FSDP), so its memory is compared per rank.
    """

    math: str
    compiled: bool
    gpus: int
    micro_batches: int
    sharded: bool = False


def powers_of_two(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit``: the candidate counts of workers or ranks a search tries."""
    return tuple(1 << i for i in range(max(1, limit).bit_length()))


# -- recipes: a config's settings in the user's own code ------------------------------------------------------------
#: The code a recipe is written for (:func:`accel_widgets.job.recipe.recipe`): a plain PyTorch loop, Hugging Face's
#: ``TrainingArguments``, a Lightning ``Trainer``, an Accelerate ``Accelerator``.
Style = Literal["pytorch", "hf", "lightning", "accelerate"]
STYLES: tuple[Style, ...] = ("pytorch", "hf", "lightning", "accelerate")


@dataclass(frozen=True)
class RecipeContext:
    """What a recipe knows besides the config: the workload it is for (None: the config alone), and the batch size a
    burst trained with, when a finished run is what the recipe is written from (a result holds no workload)."""

    workload: Workload | None = None
    batch_size: int | None = None


#: The places a recipe lays a :class:`Code` line out (:mod:`accel_widgets.job.recipe`): "code" in a framework's
#: code, the others in the plain-PyTorch module -- at its top ("imports", "constants", "helpers", the module's "doc",
#: the batch's "to_device"), at the head of ``train`` ("setup", "device", "sampler"), around the model ("layout",
#: "prepare", "wrap", "compile", "optimizer", "scaler", "loss_fn"), in each micro-batch ("micro_batch",
#: "around_backward", "forward_context", "loss_scale", "backward") and in each step ("unscale", "step", "zero_grad",
#: "step_loss", "read_loss", "after_step").
RecipeSlot = Literal[
    "code", "imports", "constants", "helpers", "doc", "to_device", "setup", "device", "sampler", "layout", "prepare",
    "wrap", "compile", "optimizer", "scaler", "loss_fn", "micro_batch", "around_backward", "forward_context",
    "loss_scale", "backward", "unscale", "step", "zero_grad", "step_loss", "read_loss", "after_step",
]
RECIPE_SLOTS: tuple[RecipeSlot, ...] = typing.get_args(RecipeSlot)


@dataclass(frozen=True)
class Code:
    """A line of code ``knob`` puts in a recipe: in the plain-PyTorch loop at ``slot`` (a place in the loop the
    recipe module lays out), or under a framework's object (``slot`` "code"). ``why`` defaults to the knob's.

    An unknown slot is refused at once: the recipe lays out only the slots it knows, so a misspelt one would drop the
    line in silence."""

    knob: str
    slot: RecipeSlot
    code: str
    why: str = ""

    def __post_init__(self) -> None:
        if self.slot not in RECIPE_SLOTS:
            raise ValueError(f"{self.knob}'s recipe line is in slot {self.slot!r}, which no recipe lays out: use one "
                             f"of {', '.join(RECIPE_SLOTS)}")


@dataclass(frozen=True)
class Setting:
    """A keyword argument ``knob`` sets: of the style's object (``TrainingArguments``, ``Trainer``, ``Accelerator``:
    ``call`` ""), or of a call the recipe writes out (``call`` "DataLoader", "to": a tensor's ``.to``). ``code`` is
    the value as code where ``repr(value)`` is not it."""

    knob: str
    name: str
    value: Any
    call: str = ""
    code: str = ""
    why: str = ""


@dataclass(frozen=True)
class Construct:
    """A keyword's value that is an object of the framework's own (a plugin, a strategy): ``name`` imported from
    ``module``, called with the Settings whose ``call`` is the keyword's name. It is written as code, and built only
    when a recipe's keywords are read, so writing a recipe needs no framework installed. A dict value collects such
    Settings too, as its entries."""

    module: str
    name: str


@dataclass(frozen=True)
class Flag:
    """A global torch switch ``knob`` sets around the loop, put back after: ``read`` is an expression of its current
    value, ``write`` a statement with ``{}`` where the value goes."""

    knob: str
    read: str
    write: str
    value: str


@dataclass(frozen=True)
class NoEquivalent:
    """``knob``'s value has no equivalent in the style: ``instead`` says what to do."""

    knob: str
    instead: str


RecipePart = Code | Setting | Flag | NoEquivalent
#: One knob's part of a recipe in one style, for a config (an empty list: nothing to write).
RecipeEntry = Callable[["Config", RecipeContext], list[RecipePart]]


def changed(knob: Knob, config: Config) -> bool:
    """Whether ``config`` sets ``knob`` off its default: what a recipe has to say something about."""
    return getattr(config, knob.name) != knob.default


def no_equivalent(knob: Knob, instead: str | Callable[[Config], str]) -> RecipeEntry:
    """The entry of a style with no equivalent of ``knob``: nothing at its default, else what to do instead."""

    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        if not changed(knob, config):
            return []
        return [NoEquivalent(knob.name, instead(config) if callable(instead) else instead)]

    return entry


def setting(knob: Knob, name: str, convert: Callable[[Any], Any] = lambda value: value, *, call: str = "",
            always: bool = False) -> RecipeEntry:
    """The entry of a style where ``knob`` is the keyword ``name`` (its value converted): written when the config
    changes it, or ``always`` (where the framework's default differs from plain PyTorch's)."""

    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        if not (always or changed(knob, config)):
            return []
        return [Setting(knob.name, name, convert(getattr(config, knob.name)), call=call)]

    return entry


def nothing(config: Config, context: RecipeContext) -> list[RecipePart]:
    """The entry of a style where the knob needs nothing written (the framework does it, or it is said elsewhere)."""
    return []


def blocks_code(context: RecipeContext, model: str, *, one_stack: bool) -> tuple[str, str]:
    """How a recipe's code reaches the model's repeated blocks: an expression that iterates them, and the helper
    function it calls ("" when it names the stack).

    ``one_stack``: the stack compiling takes (:func:`~accel_widgets.inputs.blocks.find_blocks`), else every block
    that checkpointing and FSDP wrap (:func:`~accel_widgets.inputs.blocks.block_modules`). Where the workload names
    its stack, or its model can be read on the meta device, the stack's path is written (``model.get_submodule(
    "transformer.h")``); else a helper that finds them as the burst did.
    """
    workload = context.workload
    outline = workload.model_outline() if workload is not None else None
    paths: list[str] = []
    if workload is not None and workload.blocks is not None:
        paths = [workload.blocks]
    elif outline is not None and one_stack:
        found = find_blocks(outline)
        paths = [found.path] if found is not None else []
    elif outline is not None:
        paths = block_stack_paths(outline)
    if not paths:
        helper = FIND_BLOCKS_CODE if one_stack else BLOCK_MODULES_CODE
        return f"{helper.split('(', 1)[0].removeprefix('def ')}({model})", helper
    stacks = [model if not path else f"{model}.get_submodule({path!r})" for path in paths]
    return (stacks[0] if len(stacks) == 1 else f"[{', '.join('*' + stack for stack in stacks)}]"), ""


def helper_parts(knob: str, slot: RecipeSlot, helper: str) -> list[RecipePart]:
    """The parts that define a helper function of :func:`blocks_code` (none for ""): in the plain-PyTorch module's
    ``helpers``, or in a framework's code (``slot`` "code") after the import it needs."""
    if not helper:
        return []
    if slot == "code":
        return [Code(knob, "code", "from torch import nn"), Code(knob, "code", helper)]
    return [Code(knob, "helpers", helper)]
