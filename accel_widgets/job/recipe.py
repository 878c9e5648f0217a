"""The winning settings in the user's own code: a plain PyTorch loop, ``TrainingArguments``, Lightning, Accelerate.

:func:`recipe` writes a config as code in one of four styles. Every knob's part comes from its owner
(:mod:`accel_widgets.knobs`: each owner's ``recipe`` says, per knob and style, the line, the keyword or that there is
no equivalent and what to do instead); this module only lays the parts out, each line with its knob's one-line why.
The plain PyTorch module is written as templates that read as the code they make, with named slots the parts fill.

``pytorch`` is a module with no accel_widgets import that defines ``train(model, dataset, loss_fn, make_optimizer,
steps, seed=0) -> list[float]``. It is seeded and stepped as a burst is -- the weights built under ``seed``, the data
order from its own generator, each item's random draws keyed to the item (a ``Dataset`` wrapper and a sampler:
:data:`~accel_widgets.data.keyed.KEYED_READING_CODE`), the step's autocast, scaling, accumulation and sync -- so its
losses are the burst's, with any number of loader workers: equal in fp32 on a CPU. The framework styles give the
keyword arguments of their object (``.kwargs``), the code around it (``.code``) and what they cannot say
(``.missing``). Lightning and Accelerate read through the same wrapper (the user builds their DataLoader, and both
hand its sampler the epoch); Hugging Face's Trainer builds its own sampler, so its code says what keying needs there.
"""

from __future__ import annotations

import importlib
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..data.keyed import KEYED_READING_CODE, KEYED_READING_IMPORTS
from ..inputs.workload import Workload
from ..knobs import KNOBS, OWNERS
from ..knobs.base import (
    RECIPE_SLOTS,
    STYLES,
    Code,
    Construct,
    Flag,
    NoEquivalent,
    RecipeContext,
    RecipePart,
    RecipeSlot,
    Setting,
    Style,
)
from ..knobs.config import Config
from ..results.burst import BurstResult

LINE_WIDTH = 120
_OBJECTS: dict[str, tuple[str, str, str]] = {  # style -> (import, the object's call, its name in the code)
    "hf": ("from transformers import TrainingArguments", "TrainingArguments", "args"),
    "lightning": ("import lightning", "lightning.Trainer", "trainer"),
    "accelerate": ("from accelerate import Accelerator", "Accelerator", "accelerator"),
}
_TITLES = {"pytorch": "Plain PyTorch", "hf": "Hugging Face TrainingArguments", "lightning": "Lightning Trainer",
           "accelerate": "Accelerate Accelerator"}


@dataclass(frozen=True)
class Recipe:
    """A config in one style: ``code`` to paste, :attr:`kwargs` for the style's object (empty for ``pytorch``), and
    ``missing``: each knob with no equivalent there, with what to do instead. ``settings``: the keywords the owners
    gave, what ``kwargs`` is built from."""

    style: Style
    code: str
    missing: dict[str, str] = field(default_factory=dict)
    settings: tuple[Setting, ...] = ()

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the style's object. A plugin or strategy among them is built here, importing the
        framework (which the code alone never needs)."""
        return {setting.name: _built(setting, self.settings) for setting in self.settings if not setting.call}


def _built(setting: Setting, settings: Sequence[Setting]) -> Any:
    """A keyword's value: a :class:`Construct` called, a dict filled, with the Settings addressed to it."""
    entries = {part.name: part.value for part in settings if part.call == setting.name}
    if isinstance(setting.value, Construct):
        return getattr(importlib.import_module(setting.value.module), setting.value.name)(**entries)
    if isinstance(setting.value, dict):
        return {**setting.value, **entries}
    return setting.value


def recipe(config: Config, workload: Workload | None = None, style: Style = "pytorch") -> Recipe:
    """``config`` as code of ``style`` ("pytorch", "hf", "lightning" or "accelerate"); ``workload`` gives the batch
    size when the config leaves it to the workload (and names the workload in the code)."""
    return _written(config, RecipeContext(workload), style, workload.name if workload is not None else None)


def recipe_of(result: BurstResult, style: Style = "pytorch") -> Recipe:
    """A finished run's settings as code: its config, with the batch size it trained (a result holds no workload)."""
    return _written(result.config, RecipeContext(batch_size=_trained_batch_size(result)), style, result.workload)


def _trained_batch_size(result: BurstResult) -> int | None:
    """Samples per micro-batch on one rank, as the burst trained them: a step's samples over its micro-batches (None
    before a step, or without the owners' facts)."""
    first = next((s for s in result.steps if s.rank == 0), None)
    if first is None or result.facts is None:
        return None
    return first.samples // result.facts.micro_batches


def _written(config: Config, context: RecipeContext, style: Style, workload_name: str | None) -> Recipe:
    if style not in STYLES:
        raise ValueError(f"style={style!r}: use one of {', '.join(map(repr, STYLES))}")
    parts = [part for owner in OWNERS for knob in owner.knobs for part in owner.recipe[knob.name][style](config,
                                                                                                         context)]
    missing = {part.knob: part.instead for part in parts if isinstance(part, NoEquivalent)}
    title = _title(config, workload_name, style)
    if style == "pytorch":
        return Recipe(style, _pytorch(title, parts, missing), missing)
    settings = tuple(part for part in parts if isinstance(part, Setting))
    return Recipe(style, _framework(style, title, parts, missing), missing, settings)


def _title(config: Config, workload_name: str | None, style: Style) -> str:
    where = f" for workload {workload_name!r}" if workload_name is not None else ""
    return f"{_TITLES[style]} with the settings accel_widgets measured{where}: {config.label()}."


def _why(part: Code | Setting | Flag) -> str:
    """A part's one-line why: its own, else the first sentence of its knob's."""
    why = getattr(part, "why", "") or KNOBS[part.knob].why
    head, dot, _ = why.partition(". ")
    return head + ("." if dot and not head.endswith(".") else "")


def _knob_why(part: Code | Setting | Flag) -> str:
    """A part's why led by its knob: where lines of many knobs sit together."""
    return f"{part.knob}: {_why(part)}"


def _value_code(part: Setting) -> str:
    return part.code or repr(part.value)


class _Lines:
    """Code lines at an indent; a line gets its why as a trailing comment where it fits, else on the line above
    (once: the next line of the same why goes without it)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._last_why = ""

    def add(self, indent: int, code: str, why: str = "") -> None:
        pad = " " * indent
        rows = code.splitlines()
        if why and why != self._last_why:
            trailing = f"{pad}{rows[0]}  # {why}"
            if len(rows) == 1 and len(trailing) <= LINE_WIDTH:
                self.lines.append(trailing)
                self._last_why = why
                return
            self.lines += textwrap.wrap(why, LINE_WIDTH, initial_indent=f"{pad}# ", subsequent_indent=f"{pad}# ")
        self._last_why = why or self._last_why
        self.lines += [pad + row for row in rows]

    def add_blank(self) -> None:
        """An empty line, as a template has them (``add`` writes no line for empty code)."""
        self.lines.append("")

    def text(self) -> str:
        return "\n".join(self.lines)


def _of(parts: Sequence[RecipePart], slot: RecipeSlot) -> list[Code]:
    return [part for part in parts if isinstance(part, Code) and part.slot == slot]


def _unique(codes: list[Code]) -> list[Code]:
    """Each line once: owners may write the same helper (the model's blocks, found for checkpointing and FSDP)."""
    first: dict[str, Code] = {}
    for code in codes:
        first.setdefault(code.code, code)
    return list(first.values())


def _settings(parts: Sequence[RecipePart], call: str) -> list[Setting]:
    return [part for part in parts if isinstance(part, Setting) and part.call == call]


def _comment(text: str) -> str:
    return "\n".join(textwrap.wrap(text, LINE_WIDTH, initial_indent="# ", subsequent_indent="# "))


def _missing_lines(missing: dict[str, str]) -> list[str]:
    return [_comment(f"No equivalent here for {knob}: {instead}") for knob, instead in missing.items()]


_KEYED_WHY = "each item's random draws keyed to the item: the same batches with any num_workers"


# -- plain PyTorch -------------------------------------------------------------------------------------------------
# The plain module's code is written as templates: Python laid out as it is generated, each line at its indent under
# every block it is in (train's under "with backend_flags():"). A template's line is one of:
# - code, its why as a trailing comment (kept there where it fits, else written above); a comment line on its own is
#   the why of the line under it;
# - "{slot}": the slot's rows at the line's indent, none where no knob fills it; "{slot} or CODE": CODE there instead;
# - "with {slot}:": the slot's rows as the context managers of one with; where there are none, the line goes and
#   the block under it moves out by 4;
# - code with "{word}"s in it: a word the config picks (a loop variable's name).
# A slot is a RecipeSlot, the knobs' lines there, or a name of the fillers below the templates that lay out more than
# one slot's lines (the backward with its loss scale, the loss read); a name nothing fills is a KeyError at once.

_HELPERS = '''def to_device(batch, device):
    """Every tensor of a batch (a tensor, or a tuple, list or dict of them) on the device the step runs on."""
    if isinstance(batch, torch.Tensor):
        {to_device}
        return batch.to(device{to_kwargs})
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch


def compute_loss(model, batch, loss_fn):
    """The loss as a burst computes it: loss_fn(model(inputs), targets) for (inputs, targets) pairs; for a dict batch
    (Hugging Face style) model(**batch), then loss_fn(output, batch) or the model's own output.loss."""
    if isinstance(batch, dict):
        output = model(**batch)
        return loss_fn(output, batch) if loss_fn is not None else output.loss
    inputs, targets = batch
    output = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    return loss_fn(output, targets) if loss_fn is not None else output.loss'''

_BACKEND_FLAGS = '''@contextlib.contextmanager
def backend_flags():
    """torch's global switches as the burst ran, put back afterwards."""
    saved = [{flag_reads}]
    {set_flags}
    try:
        yield
    finally:
        {restore_flags}'''

_TRAIN = '''def train(model, dataset, loss_fn, make_optimizer, steps, seed=0, make_scheduler=None, max_grad_norm=None):
    """Train ``steps`` optimizer steps and return every step's loss.

    ``model`` is an nn.Module, or a zero-argument factory built under ``seed`` (as a burst builds it); ``dataset`` is
    map-style; ``make_optimizer(params)`` and ``make_scheduler(optimizer)`` are your Workload's optimizer and scheduler.
    """
    {setup}
    local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))  # a rank's own GPU
    device = local if torch.cuda.is_available() else torch.device("cpu")
    {device}
    with {backend_flags}:
        torch.manual_seed(seed)  # the weights' seed, as in a burst
        generator = torch.Generator().manual_seed(seed)  # the data order
        {sampler} or sampler = RandomSampler(dataset, generator=generator)  # a shuffle drawn from that generator
        loader = DataLoader(
            # each item's random draws keyed to the item: the same batches with any num_workers
            KeyedItems(dataset, seed), sampler=KeyedOrder(sampler),
            # the workers' base seeds, apart from the order (persistent workers draw them once)
            generator=torch.Generator().manual_seed(seed),
            drop_last=True,  # full batches only, as in a burst: shapes stay the same every step
            {loader_keywords}
        )
        if not isinstance(model, nn.Module):
            model = model()  # a factory is built under the seed, as a burst builds it
        model = model.to(device)
        {layout}
        {prepare}
        raw = model  # the module itself: what the optimizer steps
        {wrap}
        {compile}
        optimizer = make_optimizer(raw.parameters())
        {optimizer}
        scheduler = make_scheduler(optimizer) if make_scheduler is not None else None
        {scaler}
        {loss_fn}
        torch.manual_seed(seed)  # as in a burst: what draws randomly in this process draws from the data seed now
        losses, pending, batches, epoch = [], [], iter(loader), 0
        for {step_index} in range(steps):
            total = None
            for {micro_index} in range(ACCUMULATE):
                try:
                    batch = next(batches)
                except StopIteration:  # a new epoch
                    epoch += 1
                    loader.sampler.set_epoch(epoch)  # the items' keys follow it, a DistributedSampler too
                    batches = iter(loader)
                    batch = next(batches)
                batch = to_device(batch, device)
                {micro_batch}
                with {around_backward}:
                    with {forward_context}:
                        loss = compute_loss(model, batch, loss_fn)
                    {backward}
                total = loss.detach() if total is None else total + loss.detach()
            if max_grad_norm is not None:
                {unscale}
                torch.nn.utils.clip_grad_norm_(raw.parameters(), max_grad_norm)
            {step} or optimizer.step()
            if scheduler is not None:
                scheduler.step()  # once per optimizer step, never per micro-batch
            {zero_grad}
            {read_loss}
            {after_step}
        losses += [value.item() for value in pending]
    return losses'''


def _pytorch(title: str, parts: Sequence[RecipePart], missing: dict[str, str]) -> str:
    flags = [part for part in parts if isinstance(part, Flag)]
    launch = [f"Launch: {part.code}" for part in _of(parts, "doc")]
    doc = "\n".join(['"""' + "\n".join(textwrap.wrap(title, LINE_WIDTH - 3)), "",
                     "train(...) trains as the burst did (the same seeds, data order, item draws and step), so its "
                     "losses are the", "burst's, with any num_workers.", *launch, '"""'])
    imports = ["import os", *KEYED_READING_IMPORTS, "from torch import nn",
               "from torch.utils.data import DataLoader, RandomSampler", *(part.code for part in _of(parts, "imports"))]
    head = _Lines()
    for part in _of(parts, "constants"):
        head.add(0, part.code, _why(part))
    helpers = [KEYED_READING_CODE, *(part.code for part in _unique(_of(parts, "helpers"))), _helpers(parts)]
    if flags:
        helpers.append(_filled(_BACKEND_FLAGS, *_flag_fills(flags)))
    sections = [_sorted_imports(imports) + "\n\n" + head.text(), *helpers, _filled(_TRAIN, *_train_fills(parts, flags)),
                "\n".join(_missing_lines(missing))]
    return doc + "\n\n" + "\n\n\n".join(section for section in sections if section) + "\n"


class _Row(NamedTuple):
    """A line a template's slot is filled with: its code (one line or several), its why, its indent under the slot."""

    code: str
    why: str = ""
    indent: int = 0


_BLOCK = re.compile(r"with \{(\w+)\}:")
_SLOT = re.compile(r"\{(\w+)\}(?: or (.+))?")
_WORD = re.compile(r"\{(\w+)\}")


def _filled(template: str, rows: Mapping[str, Sequence[_Row]], words: Mapping[str, str]) -> str:
    """``template`` (laid out as the comment above the templates says) with its slots' ``rows`` and its ``words``:
    every line through one :class:`_Lines`, so a why goes where it fits and is said once for a run of lines."""
    lines, why = _Lines(), ""
    moved: list[tuple[int, int]] = []  # (indent of an open "with {slot}:", how far the lines under it move)
    for line in template.splitlines():
        text = line.lstrip()
        if not text:
            lines.add_blank()
            continue
        indent = len(line) - len(text)
        while moved and moved[-1][0] >= indent:  # the line is out of that block
            moved.pop()
        at = indent + sum(shift for _, shift in moved)
        code, _, trailing = text.partition("  # ")
        if code.startswith("# "):
            why = f"{why} {code[2:]}".lstrip()
            continue
        if block := _BLOCK.fullmatch(code):
            moved.append((indent, _with(lines, at, rows[block[1]])))
        elif slot := _SLOT.fullmatch(code):
            for row in rows[slot[1]] or ([_Row(slot[2], trailing)] if slot[2] else []):
                lines.add(at + row.indent, row.code, row.why)
        else:
            lines.add(at, _WORD.sub(lambda word: words[word[1]], code), trailing or why)
        why = ""
    return lines.text()


def _with(lines: _Lines, at: int, contexts: Sequence[_Row]) -> int:
    """One ``with`` of ``contexts`` (their lines in parentheses where there are several) at ``at``: how far the block
    under it moves, out by 4 where there are none."""
    if not contexts:
        return -4
    if len(contexts) == 1:
        lines.add(at, f"with {contexts[0].code}:", contexts[0].why)
        return 0
    lines.add(at, "with (")
    for context in contexts:
        lines.add(at + 4, f"{context.code},", context.why)
    lines.add(at, "):")
    return 0


def _helpers(parts: Sequence[RecipePart]) -> str:
    """to_device and compute_loss: the batch moved as the knobs say ("to_device" lines, the keywords of its .to)."""
    to_kwargs = "".join(f", {part.name}={_value_code(part)}" for part in _settings(parts, "to"))
    return _filled(_HELPERS, {"to_device": [_Row(part.code, _why(part)) for part in _of(parts, "to_device")]},
                   {"to_kwargs": to_kwargs})


def _flag_fills(flags: Sequence[Flag]) -> tuple[dict[str, list[_Row]], dict[str, str]]:
    """backend_flags' rows and words: each switch read, set to the config's value, and put back from what was read."""
    rows = {"set_flags": [_Row(flag.write.format(flag.value), _knob_why(flag)) for flag in flags],
            "restore_flags": [_Row(flag.write.format(f"saved[{index}]")) for index, flag in enumerate(flags)]}
    return rows, {"flag_reads": ", ".join(flag.read for flag in flags)}


def _train_fills(parts: Sequence[RecipePart],
                 flags: Sequence[Flag]) -> tuple[dict[str, list[_Row]], dict[str, str]]:
    """train's rows and words: every slot's Code lines with their knobs' whys, then the slots laid out from more than
    their own lines. A loop variable is named only where a knob's line reads it (else ``_``, as a linter wants)."""
    rows = {slot: [_Row(part.code, _knob_why(part)) for part in _of(parts, slot)] for slot in RECIPE_SLOTS}
    rows |= {"backend_flags": [_Row("backend_flags()")] if flags else [],
             "loader_keywords": [_Row(f"{setting.name}={_value_code(setting)},", _why(setting))
                                 for setting in _settings(parts, "DataLoader")],
             "backward": _backward(parts), "read_loss": _loss_read(parts)}
    read = _of(parts, "read_loss")[0].code
    uses_step = read not in ("True", "False") or bool(rows["after_step"])
    uses_micro = bool(rows["around_backward"] or rows["micro_batch"])
    return rows, {"step_index": "step" if uses_step else "_", "micro_index": "micro" if uses_micro else "_"}


def _backward(parts: Sequence[RecipePart]) -> list[_Row]:
    """The backward of the loss as the first "loss_scale" line scales it, by the first "backward" line where there is
    one (a format of the loss, as GradScaler's scale), the scale's why then said above."""
    scaled = next(iter(_of(parts, "loss_scale")), None)
    backward = next(iter(_of(parts, "backward")), None)
    if backward is None:
        return [_Row(f"({scaled.code}).backward()", _knob_why(scaled)) if scaled else _Row("loss.backward()")]
    scale = [_Row(f"# {_knob_why(scaled)}")] if scaled else []
    return [*scale, _Row(backward.code.format(scaled.code if scaled else "loss"), _knob_why(backward))]


def _loss_read(parts: Sequence[RecipePart]) -> list[_Row]:
    """The step's loss (the first "step_loss" line, else the micro-batches' total) kept, and read to the host when
    the first "read_loss" line's condition says: every step ("True"), every N, or at the end only ("False")."""
    read = _of(parts, "read_loss")[0]
    loss = next((part.code for part in _of(parts, "step_loss")), "total")
    if read.code == "True":
        return [_Row(f"losses.append(({loss}).item())", _knob_why(read))]
    kept = [_Row(f"pending.append({loss})", _knob_why(read))]
    if read.code == "False":
        return kept
    return [*kept, _Row(f"if {read.code}:"), _Row("losses += [value.item() for value in pending]", indent=4),
            _Row("pending.clear()", indent=4)]


#: The packages a recipe imports beside the standard library.
_THIRD_PARTY = ("numpy", "torch")


def _sorted_imports(imports: list[str]) -> str:
    """The imports as a linter sorts them: the standard library, then numpy and torch; the names of one module in one
    line."""
    modules: dict[str, set[str]] = {}
    plain: set[str] = set()
    for line in imports:
        if line.startswith("from "):
            module, _, names = line[len("from "):].partition(" import ")
            modules.setdefault(module, set()).update(name.strip() for name in names.split(","))
        else:
            plain.add(line)
    third_party = {line for line in plain if line.split()[1].partition(".")[0] in _THIRD_PARTY}
    standard = sorted(plain - third_party)
    third = sorted(third_party)
    third += [f"from {module} import {', '.join(sorted(names))}" for module, names in sorted(modules.items())]
    return "\n".join([*standard, "", *third])


# -- frameworks ------------------------------------------------------------------------------------------------------
def _framework(style: Style, title: str, parts: Sequence[RecipePart], missing: dict[str, str]) -> str:
    module, call, name = _OBJECTS[style]
    lines = _Lines()
    lines.add(0, f"# {title}")
    lines.add(0, module)
    keywords = _settings(parts, "")
    for construct in dict.fromkeys(s.value for s in keywords if isinstance(s.value, Construct)):
        lines.add(0, f"from {construct.module} import {construct.name}")
    loader = _settings(parts, "DataLoader")
    if loader:
        for line in _imports_of(KEYED_READING_IMPORTS, "from torch.utils.data import DataLoader, RandomSampler"):
            lines.add(0, line)
    codes = _unique(_of(parts, "code"))
    imports = [code for code in codes if code.code.startswith(("import ", "from "))]
    for code in imports:  # at the top, as a linter wants them
        lines.add(0, code.code)
    if loader:
        lines.add(0, f"\n\n{KEYED_READING_CODE}\n\n\n")  # two blank lines around the definitions
    for code in (code for code in codes if code not in imports):
        lines.add(0, code.code, _knob_why(code) if not code.code.startswith(("#", "def ")) else "")
    if loader:
        lines.add(0, "loader = DataLoader(")
        lines.add(4, "KeyedItems(dataset, seed=0),", _KEYED_WHY)
        lines.add(4, "sampler=KeyedOrder(RandomSampler(dataset, generator=torch.Generator().manual_seed(0))),")
        lines.add(4, "drop_last=True,")
        for setting in loader:
            lines.add(4, f"{setting.name}={_value_code(setting)},", _why(setting))
        lines.add(0, ")")
    lines.add(0, _comment(_EPOCH_NOTES[style]))
    lines.add(0, f"{name} = {call}(")
    if style == "hf":
        lines.add(4, 'output_dir="out",', "where the Trainer writes (yours)")
    for setting in keywords:
        _keyword(lines, setting, _settings(parts, setting.name))
    lines.add(0, ")")
    for line in _missing_lines(missing):
        lines.add(0, line)
    return lines.text() + "\n"


def _imports_of(*groups: str | Sequence[str]) -> list[str]:
    """The import lines of ``groups`` (a line, or a sequence of them), the names of one module merged in one line."""
    lines = [line for group in groups for line in ([group] if isinstance(group, str) else group)]
    return _sorted_imports(lines).replace("\n\n", "\n").splitlines()


#: How each framework hands the keyed sampler its epoch, or what keying needs there.
_EPOCH_NOTES: dict[Style, str] = {
    "lightning": "Lightning hands loader.sampler the epoch before each epoch (set_epoch), and the items' keys follow "
                 "it. Under DDP it swaps in its own DistributedSamplerWrapper and hands the epoch to that: pass "
                 "use_distributed_sampler=False and shard with KeyedOrder(DistributedSampler(dataset, seed=0)), built "
                 "in your LightningModule's train_dataloader(), where the process group exists.",
    "accelerate": "After accelerator.prepare(loader), call loader.set_epoch(epoch) before each epoch: Accelerate hands "
                  "it to this sampler, and the items' keys follow it.",
    "hf": "Each item's random draws keyed to the item, as a burst reads data, has no TrainingArguments setting: the "
          "Trainer builds its own sampler and DataLoader. For it, train on KeyedItems(dataset, seed) and subclass "
          "Trainer so that its (private) _get_train_sampler returns KeyedOrder(RandomSampler(...)): the Trainer hands "
          "that sampler the epoch. The plain PyTorch recipe holds both helpers.",
}


def _keyword(lines: _Lines, setting: Setting, entries: list[Setting]) -> None:
    """One keyword of the style's object; a plugin or a dict with its own keywords or entries, one a line."""
    why = _knob_why(setting)
    if isinstance(setting.value, Construct):
        opening, closing, entry = f"{setting.value.name}(", ")", "{}={},"
    elif isinstance(setting.value, dict):
        opening, closing, entry = "{", "}", "{!r}: {},"
        entries = [Setting(setting.knob, key, value) for key, value in setting.value.items()] + entries
    else:
        lines.add(4, f"{setting.name}={_value_code(setting)},", why)
        return
    lines.add(4, f"{setting.name}={opening}", why)
    for part in entries:  # an entry of the knob that made the object says no more than its why above
        own = part.why or part.knob != setting.knob
        lines.add(8, entry.format(part.name, _value_code(part)), _knob_why(part) if own else "")
    lines.add(4, f"{closing},")
