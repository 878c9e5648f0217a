"""The winning settings in the user's own code: a plain PyTorch loop, ``TrainingArguments``, Lightning, Accelerate.

:func:`recipe` writes a config as code in one of four styles. Every knob's part comes from its owner
(:mod:`accel_widgets.knobs`: each owner's ``recipe`` says, per knob and style, the line, the keyword or that there is
no equivalent and what to do instead); this module only lays the parts out, each line with its knob's one-line why.

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
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..data.keyed import KEYED_READING_CODE, KEYED_READING_IMPORTS
from ..inputs.workload import Workload
from ..knobs import KNOBS, OWNERS
from ..knobs.base import (
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
_HELPERS = '''def to_device(batch, device):
    """Every tensor of a batch (a tensor, or a tuple, list or dict of them) on the device the step runs on."""
    if isinstance(batch, torch.Tensor):
{to_device}        return batch.to(device{to_kwargs})
    if isinstance(batch, dict):
        return {{key: to_device(value, device) for key, value in batch.items()}}
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

_TRAIN_DOC = '''    """Train ``steps`` optimizer steps and return every step's loss.

    ``model`` is an nn.Module, or a zero-argument factory built under ``seed`` (as a burst builds it); ``dataset`` is
    map-style; ``make_optimizer(params)`` and ``make_scheduler(optimizer)`` are your Workload's optimizer and scheduler.
    """'''


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
    to_device = _Lines()
    for part in _of(parts, "to_device"):
        to_device.add(8, part.code, _why(part))
    to_kwargs = "".join(f", {part.name}={_value_code(part)}" for part in _settings(parts, "to"))
    helpers = [KEYED_READING_CODE, *(part.code for part in _unique(_of(parts, "helpers")))]
    helpers.append(_HELPERS.format(to_device=to_device.text() + "\n" if to_device.lines else "", to_kwargs=to_kwargs))
    if flags:
        helpers.append(_flags_function(flags))
    body = _train_body(parts, indent=8 if flags else 4)
    train = ["def train(model, dataset, loss_fn, make_optimizer, steps, seed=0, make_scheduler=None, "
             "max_grad_norm=None):", _TRAIN_DOC, body]
    sections = [_sorted_imports(imports) + "\n\n" + head.text(), *helpers, "\n".join(train),
                "\n".join(_missing_lines(missing))]
    return doc + "\n\n" + "\n\n\n".join(section for section in sections if section) + "\n"


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


def _flags_function(flags: list[Flag]) -> str:
    lines = _Lines()
    lines.add(0, "@contextlib.contextmanager")
    lines.add(0, "def backend_flags():")
    lines.add(4, '"""torch\'s global switches as the burst ran, put back afterwards."""')
    lines.add(4, f"saved = [{', '.join(flag.read for flag in flags)}]")
    for flag in flags:
        lines.add(4, flag.write.format(flag.value), f"{flag.knob}: {_why(flag)}")
    lines.add(4, "try:")
    lines.add(8, "yield")
    lines.add(4, "finally:")
    for index, flag in enumerate(flags):
        lines.add(8, flag.write.format(f"saved[{index}]"))
    return lines.text()


def _train_body(parts: Sequence[RecipePart], indent: int) -> str:
    lines, i = _Lines(), indent

    def code(slot: RecipeSlot, at: int) -> None:
        for part in _of(parts, slot):
            lines.add(at, part.code, f"{part.knob}: {_why(part)}")

    code("setup", 4)
    lines.add(4, 'local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))', "a rank's own GPU")
    lines.add(4, 'device = local if torch.cuda.is_available() else torch.device("cpu")')
    code("device", 4)
    if i > 4:
        lines.add(4, "with backend_flags():")
    lines.add(i, "torch.manual_seed(seed)", "the weights' seed, as in a burst")
    lines.add(i, "generator = torch.Generator().manual_seed(seed)", "the data order")
    samplers = _of(parts, "sampler")
    if samplers:
        code("sampler", i)
    else:
        lines.add(i, "sampler = RandomSampler(dataset, generator=generator)", "a shuffle drawn from that generator")
    lines.add(i, "loader = DataLoader(")
    lines.add(i + 4, "KeyedItems(dataset, seed), sampler=KeyedOrder(sampler),", _KEYED_WHY)
    lines.add(i + 4, "generator=torch.Generator().manual_seed(seed),",
              "the workers' base seeds, apart from the order (persistent workers draw them once)")
    lines.add(i + 4, "drop_last=True,", "full batches only, as in a burst: shapes stay the same every step")
    for setting in _settings(parts, "DataLoader"):
        lines.add(i + 4, f"{setting.name}={_value_code(setting)},", _why(setting))
    lines.add(i, ")")
    lines.add(i, "if not isinstance(model, nn.Module):")
    lines.add(i + 4, "model = model()", "a factory is built under the seed, as a burst builds it")
    lines.add(i, "model = model.to(device)")
    code("layout", i)
    code("prepare", i)
    lines.add(i, "raw = model", "the module itself: what the optimizer steps")
    code("wrap", i)
    code("compile", i)
    lines.add(i, "optimizer = make_optimizer(raw.parameters())")
    code("optimizer", i)
    lines.add(i, "scheduler = make_scheduler(optimizer) if make_scheduler is not None else None")
    code("scaler", i)
    code("loss_fn", i)
    lines.add(i, "torch.manual_seed(seed)", "as in a burst: what draws randomly in this process draws from the data "
                                            "seed now")
    around_backward = _of(parts, "around_backward")
    read = next(part for part in _of(parts, "read_loss"))
    uses_step = read.code not in ("True", "False") or bool(_of(parts, "after_step"))
    lines.add(i, "losses, pending, batches, epoch = [], [], iter(loader), 0")
    lines.add(i, f"for {'step' if uses_step else '_'} in range(steps):")
    lines.add(i + 4, "total = None")
    uses_micro = bool(around_backward or _of(parts, "micro_batch"))
    lines.add(i + 4, f"for {'micro' if uses_micro else '_'} in range(ACCUMULATE):")
    j = i + 8
    lines.add(j, "try:")
    lines.add(j + 4, "batch = next(batches)")
    lines.add(j, "except StopIteration:", "a new epoch")
    lines.add(j + 4, "epoch += 1")
    lines.add(j + 4, "loader.sampler.set_epoch(epoch)", "the items' keys follow it, a DistributedSampler too")
    lines.add(j + 4, "batches = iter(loader)")
    lines.add(j + 4, "batch = next(batches)")
    lines.add(j, "batch = to_device(batch, device)")
    code("micro_batch", j)
    for part in around_backward:
        lines.add(j, f"with {part.code}:", f"{part.knob}: {_why(part)}")
    k = j + 4 * len(around_backward)
    forward_context = _of(parts, "forward_context")
    if len(forward_context) == 1:
        lines.add(k, f"with {forward_context[0].code}:", f"{forward_context[0].knob}: {_why(forward_context[0])}")
    elif forward_context:
        lines.add(k, "with (")
        for part in forward_context:
            lines.add(k + 4, f"{part.code},", f"{part.knob}: {_why(part)}")
        lines.add(k, "):")
    lines.add(k + (4 if forward_context else 0), "loss = compute_loss(model, batch, loss_fn)")
    scaled = next((part for part in _of(parts, "loss_scale")), None)
    backward = next((part for part in _of(parts, "backward")), None)
    expression = f"({scaled.code})" if scaled is not None else "loss"
    why = f"{scaled.knob}: {_why(scaled)}" if scaled is not None else ""
    if backward is not None:
        if why:
            lines.add(k, f"# {why}")
        lines.add(k, backward.code.format(scaled.code if scaled is not None else "loss"),
                  f"{backward.knob}: {_why(backward)}")
    else:
        lines.add(k, f"{expression}.backward()", why)
    lines.add(j, "total = loss.detach() if total is None else total + loss.detach()")
    lines.add(i + 4, "if max_grad_norm is not None:")
    code("unscale", i + 8)
    lines.add(i + 8, "torch.nn.utils.clip_grad_norm_(raw.parameters(), max_grad_norm)")
    if _of(parts, "step"):
        code("step", i + 4)
    else:
        lines.add(i + 4, "optimizer.step()")
    lines.add(i + 4, "if scheduler is not None:")
    lines.add(i + 8, "scheduler.step()", "once per optimizer step, never per micro-batch")
    code("zero_grad", i + 4)
    step_loss = next((part.code for part in _of(parts, "step_loss")), "total")
    _loss_read(lines, i + 4, step_loss, read)
    code("after_step", i + 4)
    lines.add(i, "losses += [value.item() for value in pending]")
    lines.add(4, "return losses")
    return lines.text()


def _loss_read(lines: _Lines, at: int, step_loss: str, read: Code) -> None:
    """The step's loss kept, and read to the host when the owner's condition says: every step, every N, or at the
    end only."""
    why = f"{read.knob}: {_why(read)}"
    if read.code == "True":
        lines.add(at, f"losses.append(({step_loss}).item())", why)
        return
    lines.add(at, f"pending.append({step_loss})", why)
    if read.code != "False":
        lines.add(at, f"if {read.code}:")
        lines.add(at + 4, "losses += [value.item() for value in pending]")
        lines.add(at + 4, "pending.clear()")


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
        lines.add(0, code.code, f"{code.knob}: {_why(code)}" if not code.code.startswith(("#", "def ")) else "")
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
    why = f"{setting.knob}: {_why(setting)}"
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
        lines.add(8, entry.format(part.name, _value_code(part)), f"{part.knob}: {_why(part)}" if own else "")
    lines.add(4, f"{closing},")
