"""torch.compile: the mode the model is compiled with, what is compiled (the whole model, or each of its repeated
blocks), what compiling costs on the first step, and what the compiler did: its graphs, graph breaks and
recompiles."""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
import logging
import os
import re
import sysconfig
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..inputs.blocks import Blocks, find_blocks
from . import batch, overhead, system
from .base import (
    Climb,
    Code,
    Construct,
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
from .owner import ModelSite, Owner

if TYPE_CHECKING:
    from ..inputs.device import DeviceInfo
    from ..inputs.workload import Workload
    from .config import Config

#: Modes that capture CUDA graphs on a GPU (inductor's ``triton.cudagraphs``).
CUDA_GRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")
#: The ladder compiles block by block when the blocks hold at least this share of the model's parameters: below
#: it, most of the step would run eagerly between the compiled blocks.
BLOCKS_MIN_PARAMETER_SHARE = 0.5
#: Graph breaks and recompile reasons a report lists (the most frequent first); the counts cover them all.
LISTED = 5

GROUP = "compile"
TITLE = "torch.compile"

KNOBS = [
    Knob(
        "compile_mode", "compile", str, "off",
        short="compile",
        choices=("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        what="torch.compile the model with this mode (inductor backend).",
        why="Fuses elementwise kernels and removes Python overhead; reduce-overhead adds CUDA graphs.",
        when="Many small ops or launch-bound steps, and enough steps to repay the compile time.",
        search=Search(ordered=True),  # the choices go from off to the most aggressive
    ),
    Knob(
        "compile_scope", "compile", str, "model",
        short="compile scope",
        choices=("model", "blocks"),
        what="What compile_mode compiles: the whole model, or each of its repeated blocks in place (regional "
             "compilation; the code between the blocks runs eagerly).",
        why="Alike blocks (a transformer's layers) share one compiled graph, so compiling takes about one block's "
            "time instead of the whole model's; steps stay close to a whole-model compile's.",
        when="Deep models of repeated layers, where a cold compile costs minutes. The blocks are the largest "
             "nn.ModuleList/nn.Sequential of alike modules, or Workload(blocks='path.to.stack').",
        search=Search(left_out="it changes how long compiling takes, which a search's steady steps do not count "
                      "(the ladder's +compile rung chooses it)"),
    ),
]

RULES = [
    Rule(
        ("deterministic", "compile_mode"), "error",
        lambda c, d: system.deterministic(c) and c.compile_mode in ("max-autotune", "max-autotune-no-cudagraphs"),
        lambda c, d: f"compile_mode={c.compile_mode!r} picks kernels by timing, which deterministic=True "
        "forbids. Use compile_mode='default' or turn deterministic off.",
    ),
    Rule(
        ("compile_mode", "grad_accum_steps"), "error",
        lambda c, d: d.has_cuda and c.compile_mode in CUDA_GRAPH_COMPILE_MODES and batch.micro_batches(c) > 1,
        lambda c, d: f"compile_mode={c.compile_mode!r} replays CUDA graphs, which reuse their output memory: "
        f"with grad_accum_steps={batch.micro_batches(c)} training fails ('accessing tensor output of CUDAGraphs "
        "that has been overwritten') or accumulates wrong gradients (pytorch/pytorch#169545, #96693). Use "
        "compile_mode='max-autotune-no-cudagraphs' or 'default', or a bigger batch_size instead of "
        "accumulating.",
    ),
    Rule(
        ("compile_mode",), "warning",
        lambda c, d: not d.has_cuda and c.compile_mode == "reduce-overhead",
        lambda c, d: "compile_mode='reduce-overhead' adds CUDA graphs; on CPU it is the same as 'default'.",
    ),
    Rule(
        ("compile_mode", "script_loss"), "warning",
        lambda c, d: c.compile_mode != "off" and overhead.scripted_loss(c),
        lambda c, d: "script_loss=True (TorchScript, legacy) inside a compiled model: torch.compile "
        "already fuses the loss; TorchScript adds nothing.",
    ),
    Rule(
        ("compile_scope", "compile_mode"), "warning",
        lambda c, d: c.compile_scope == "blocks" and not compiled(c),
        lambda c, d: "compile_scope='blocks' chooses what compile_mode compiles, and compile_mode='off' compiles "
        "nothing: set a compile_mode.",
    ),
    Rule(
        ("compile_scope", "compile_mode"), "warning",
        lambda c, d: d.has_cuda and c.compile_scope == "blocks" and c.compile_mode in CUDA_GRAPH_COMPILE_MODES,
        lambda c, d: f"compile_mode={c.compile_mode!r} with compile_scope='blocks' records a CUDA graph per block "
        "(each block's parameters are static inputs at addresses of their own, so one compiled graph is recorded "
        "once per block, up to inductor's re-record limit of 128) and the code between the blocks launches its "
        "kernels one by one: fewer launches are saved than by one whole-model graph. Use compile_scope='model' "
        "where launch overhead is the limit.",
    ),
]


def _blocks_pay(device: DeviceInfo, workload: Workload) -> dict[str, Any]:
    """Compile block by block where the model's alike blocks hold most of its parameters
    (``BLOCKS_MIN_PARAMETER_SHARE``): the compile then costs about one block's, and the steps stay close to a
    whole-model compile's."""
    model = workload.model_outline()
    blocks = find_blocks(model, workload.blocks) if model is not None else None
    return {"compile_scope": "blocks"} if blocks is not None and blocks.parameter_share >= BLOCKS_MIN_PARAMETER_SHARE \
        else {}


LADDER = [
    Climb("+compile", "torch.compile fuses kernels and removes Python overhead",
          lambda device, workload: {"compile_mode": "default"}),
    Climb("+compile", "alike blocks compile once (regional compilation)", _blocks_pay),
]

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {
    "compute_bound": lambda c: Remedy("compile_mode", "try torch.compile to fuse kernels", "default")
    if not compiled(c) else None,
    "compile_does_not_pay": lambda c: Remedy("compile_mode", "leave it off for this model, or look for graph breaks "
                                             "and recompiles"),
    "graph_breaks": lambda c: Remedy("compile_mode", "fix that first: each break ends a graph and runs Python before "
                                     "the next, so the compiled model is no faster than its slowest piece (remove or "
                                     "move the call out of forward, or follow torch's explanation)"),
    "recompiles": lambda c: Remedy("compile_mode", "each recompile costs another compile: keep the shapes steady "
                                   "(pad batches to a few fixed lengths) or mark the changing dimension dynamic "
                                   "(torch._dynamo.mark_dynamic)"),
}


def _compile_call(config: Config) -> str:
    return "torch.compile(model)" if config.compile_mode == "default" else (
        f"torch.compile(model, mode={config.compile_mode!r})")


def _by_blocks(config: Config) -> bool:
    return compiled(config) and config.compile_scope == "blocks"


def _compile_line(slot: RecipeSlot, where: str = "") -> RecipeEntry:
    """The whole model compiled (compile_scope='blocks' writes its own lines instead)."""
    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        return [Code("compile_mode", slot, f"model = {_compile_call(config)}{where}")] if compiled(
            config) and not _by_blocks(config) else []

    return entry


def _hf_compile(config: Config, context: RecipeContext) -> list[RecipePart]:
    if not compiled(config):
        return []
    mode = [] if config.compile_mode == "default" else [Setting("compile_mode", "torch_compile_mode",
                                                                config.compile_mode)]
    return [Setting("compile_mode", "torch_compile", True), *mode]


def _stackless(context: RecipeContext) -> bool:
    """The workload's model is known and has no stack of alike blocks: the burst compiled the whole model."""
    workload = context.workload
    outline = workload.model_outline() if workload is not None else None
    return outline is not None and find_blocks(outline, workload.blocks) is None


_WHOLE = "the model has no stack of alike blocks: the whole model is compiled, as the burst did"


def _block_compile(slot: RecipeSlot, model: str, where: str = "", whole_slot: RecipeSlot | None = None) -> RecipeEntry:
    """Each block compiled in place (``module.compile()``, so wrappers and hooks around it stay), as
    :func:`compile_blocks` does: in the plain loop in the ``wrap`` slot, ahead of DDP's or FSDP's lines (torchtitan's
    order); a model without blocks compiled whole, where the whole model is (``whole_slot``, else ``slot``)."""

    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        if not _by_blocks(config):
            return []
        if _stackless(context):
            return [Code("compile_scope", whole_slot or slot, f"model = {_compile_call(config)}{where}", _WHOLE)]
        blocks, helper = blocks_code(context, model, one_stack=True)
        mode = "" if config.compile_mode == "default" else f"mode={config.compile_mode!r}"
        loop = f"for block in {blocks}:{where}\n    block.compile({mode})"
        return [*helper_parts("compile_scope", slot, helper), Code("compile_scope", slot, loop)]

    return entry


def _regional_plugin(config: Config, context: RecipeContext) -> list[RecipePart]:
    """Accelerate's regional compilation (``TorchDynamoPlugin(use_regional_compilation=True)``, accelerate 1.16's
    ``compile_regions``): each block of every nn.ModuleList of one class compiled, alike ones sharing a graph."""
    if not _by_blocks(config):
        return []
    why = ("Alike blocks share one compiled graph, so compiling takes about one block's time. Accelerate compiles "
           "the modules between the blocks too, each on its own (the burst ran them eagerly)")
    mode = [] if config.compile_mode == "default" else [Setting("compile_scope", "mode", config.compile_mode,
                                                                call="dynamo_plugin")]
    return [Setting("compile_scope", "dynamo_plugin", Construct("accelerate.utils", "TorchDynamoPlugin"), why=why),
            Setting("compile_scope", "backend", "inductor", call="dynamo_plugin"), *mode,
            Setting("compile_scope", "use_regional_compilation", True, call="dynamo_plugin")]


_HF_REGIONAL = 'os.environ["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "1"  # before the Trainer is built'
_HF_REGIONAL_WHY = ("The Trainer's TorchDynamoPlugin reads this when torch_compile is on: each block of every "
                    "nn.ModuleList of one class is compiled, alike ones sharing a graph (the modules between them "
                    "are compiled too, each on its own)")

#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "compile_mode": {
        "pytorch": _compile_line("compile"),
        "hf": _hf_compile,
        "lightning": _compile_line("code", "  # your LightningModule, before trainer.fit"),
        "accelerate": _compile_line("code", "  # before accelerator.prepare"),
    },
    "compile_scope": {
        "pytorch": _block_compile("wrap", "model", whole_slot="compile"),
        "hf": lambda config, context: [Code("compile_scope", "code", "import os"),
                                       Code("compile_scope", "code", _HF_REGIONAL, _HF_REGIONAL_WHY)]
        if _by_blocks(config) else [],
        "lightning": _block_compile("code", "model", "  # your LightningModule, before trainer.fit"),
        "accelerate": _regional_plugin,
    },
}


class CompileError(RuntimeError):
    """torch.compile failed at the first step (that is where inductor errors surface)."""


class CompileScopeWarning(UserWarning):
    """compile_scope='blocks' found no repeated blocks, so the whole model was compiled."""


def compiled(config: Config) -> bool:
    return config.compile_mode != "off"


def held_loss(loss: torch.Tensor, config: Config) -> torch.Tensor:
    """The micro-batch's loss, detached, in memory of its own when the step holds it past the next forward.

    Under the CUDA-graph modes a compiled model's outputs live in the graph's static memory, which the next replay
    overwrites: a model that computes its own loss (a Hugging Face model given labels) returns the loss there, and a
    loss held for a later read (``sync_every`` other than 1) would read the last step's value, or raise "accessing
    tensor output of CUDAGraphs that has been overwritten by a subsequent run". A one-element copy costs nothing
    measurable; the other modes hold the detached tensor itself.
    """
    detached = loss.detach()
    return detached.clone() if config.compile_mode in CUDA_GRAPH_COMPILE_MODES else detached


def default_warmup_steps(config: Config) -> int:
    """Unmeasured steps before the window: one more when compiling (recompiles can follow the first)."""
    return 3 if compiled(config) else 2


def _mode(config: Config) -> str | None:
    return None if config.compile_mode == "default" else config.compile_mode


def compile_blocks(raw: nn.Module, config: Config, blocks_path: str | None) -> nn.Module:
    """Under ``compile_scope='blocks'``, compile each repeated block of ``raw`` in place, before anything wraps or
    shards it: torchtitan's order (checkpointing, then compile, then FSDP's ``fully_shard`` per block), so what
    compiles is the block's own code and FSDP's units are made of compiled blocks. A model without blocks is compiled
    whole, after wrapping, by :func:`compile_model`. Returns ``raw`` itself."""
    if _by_blocks(config) and (blocks := find_blocks(raw, blocks_path)) is not None:
        _compile_blocks(blocks, _mode(config))
    return raw


def compile_model(model: nn.Module, raw: nn.Module, config: Config, blocks_path: str | None) -> tuple[nn.Module, str]:
    """The model to call, and what was compiled in words ("" when nothing). ``model`` is ``raw`` as the step calls
    it (wrapped for DDP, say); ``blocks_path`` the workload's stack of blocks (None: found in ``raw``).

    Why: inductor fuses elementwise ops and strips Python overhead, paying a compile on step one. By blocks, each
    block is compiled in place (``module.compile()``, so wrappers and hooks around it stay as they were): alike
    blocks share one graph, compiled once. Blocks :func:`compile_blocks` compiled before the wrapping are left as
    they are.
    """
    if not compiled(config):
        return model, ""
    mode = _mode(config)
    if config.compile_scope == "blocks":
        blocks = find_blocks(raw, blocks_path)
        if blocks is not None:
            if not all(block._compiled_call_impl is not None for block in blocks.modules):
                _compile_blocks(blocks, mode)
            return model, f"{blocks.text()}, each compiled; the code between them eager"
        warnings.warn(f"compile_scope='blocks': {type(raw).__name__} has no stack of alike blocks (an nn.ModuleList or "
                      "nn.Sequential of two or more modules of one class and shape), so the whole model was compiled. "
                      "Name the stack with Workload(blocks='path.to.stack').", CompileScopeWarning, stacklevel=2)
        return torch.compile(model, mode=mode), "the whole model (no stack of alike blocks found)"
    return torch.compile(model, mode=mode), "the whole model"


def _compile_blocks(blocks: Blocks, mode: str | None) -> None:
    for block in blocks.modules:
        block.compile(mode=mode)


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Compiled code runs eagerly for the duration: the passes that read the model after the measured window
    (FLOP counting, recording its code paths) must neither trigger recompiles nor miss the ops inside a block
    compiled in place."""
    with torch.compiler.set_stance("force_eager"):
        yield


def first_step_error(exc: Exception, config: Config) -> CompileError | None:
    """The compiler's failure at the first step said in terms of the knob, or None if not the compiler's."""
    if not compiled(config) or not type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
        return None
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CompileError(
        f"torch.compile(mode={config.compile_mode!r}) failed at the first step: {type(exc).__name__}: "
        f"{first_line}. Run with compile_mode='off', or fix the graph break."
    )


# -- what the compiler did ---------------------------------------------------------------------------
#: The file name cloudpickle gives code it sends by value (classes defined in a notebook or in ``__main__``).
BY_VALUE_FILE = "<dynamic-code>"


@dataclass(frozen=True)
class GraphBreak:
    """One place torch.compile broke the graph: torch's name for why (``reason``), its one-line explanation and its
    first hint, the user's file, line and function it points at with that line's source where it can be read (code
    sent by value has neither file nor source), and how often compiling hit it in the burst."""

    reason: str
    explanation: str
    hint: str
    file: str
    line: int
    function: str
    code: str
    count: int

    def where(self) -> str:
        """``model.py:42 in forward``; ``line 42 in forward`` for code sent by value; "" where torch named none."""
        if not self.file:
            return ""
        function = f" in {self.function}" if self.function else ""
        if self.file == BY_VALUE_FILE:
            return f"line {self.line}{function}"
        return f"{os.path.basename(self.file)}:{self.line}{function}"

    def text(self) -> str:
        """``3x at model.py:42 in forward (`print(x.shape)`): Failed to trace builtin operator``."""
        at = f" at {self.where()}" if self.file else ""
        code = f" (`{self.code}`)" if self.code else ""
        return f"{self.count}x{at}{code}: {self.reason}"


@dataclass(frozen=True)
class Recompile:
    """Why compiled code was compiled again: the guard that failed as torch words it, in which function, how often."""

    reason: str
    function: str
    count: int

    def text(self) -> str:
        where = f" in {self.function}" if self.function else ""
        return f"{self.count}x{where}: {self.reason}"


@dataclass(frozen=True)
class CompileReport:
    """What torch.compile did in a burst: what it compiled (``scope``), the graphs it made, where it broke them (the
    most frequent ``LISTED`` breaks; ``graph_break_count`` counts every one), how often it compiled code again and
    why, and the seconds it spent compiling by its own account (every frame, forward and backward, recompiles
    included: the first step's excess over a steady step misses what later steps compile)."""

    scope: str
    graphs: int
    graph_break_count: int
    graph_breaks: tuple[GraphBreak, ...]
    recompiles: int
    recompile_reasons: tuple[Recompile, ...]
    compile_s: float

    def text(self) -> str:
        """``1 graph, no graph breaks, no recompiles; torch compiled for 27.4 s``."""
        graphs = f"{self.graphs} graph{'s' if self.graphs != 1 else ''}"
        breaks = f"{self.graph_break_count} graph break{'s' if self.graph_break_count != 1 else ''}" \
            if self.graph_break_count else "no graph breaks"
        recompiles = f"{self.recompiles} recompile{'s' if self.recompiles != 1 else ''}" if self.recompiles \
            else "no recompiles"
        return f"{graphs}, {breaks}, {recompiles}; torch compiled for {self.compile_s:.1f} s"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompileReport:
        return cls(**{**data, "graph_breaks": tuple(GraphBreak(**b) for b in data["graph_breaks"]),
                      "recompile_reasons": tuple(Recompile(**r) for r in data["recompile_reasons"])})

    @classmethod
    def merged(cls, reports: list[CompileReport]) -> CompileReport | None:
        """One report for the ranks: each compiles the same model, so a count is the worst rank's (a sum would count
        one break once per rank), the breaks and reasons those of every rank, and the time the slowest rank's."""
        if not reports:
            return None
        if len(reports) == 1:
            return reports[0]
        breaks: dict[tuple[str, str, int], GraphBreak] = {}
        for found in (b for report in reports for b in report.graph_breaks):
            key = (found.reason, found.file, found.line)
            if key not in breaks or breaks[key].count < found.count:
                breaks[key] = found
        reasons: dict[tuple[str, str], Recompile] = {}
        for found in (r for report in reports for r in report.recompile_reasons):
            key = (found.function, _shape_of_reason(found.reason))
            if key not in reasons or reasons[key].count < found.count:
                reasons[key] = found
        return cls(reports[0].scope, max(r.graphs for r in reports), max(r.graph_break_count for r in reports),
                   _most_frequent(breaks.values()), max(r.recompiles for r in reports),
                   _most_frequent(reasons.values()), max(r.compile_s for r in reports))


class CompileWatch:
    """What torch.compile does in this process while the watch is open, read from torch's own records.

    torch 2.13 has no public API for these, so this class is the one place that reads torch internals, each chosen
    for being what torch's own tools (``TORCH_LOGS``, tlparse) read:

    - the ``graph_breaks`` logging artifact (what ``TORCH_LOGS="graph_breaks"`` prints): one record per graph break,
      naming the user's file and line and torch's reason. Its loggers (found through ``torch._logging``'s registry)
      are set to DEBUG, with their records kept from torch's stderr handler, for the duration only;
    - ``torch._dynamo.utils.get_compilation_metrics()``: one entry per compiled frame and per backward compile, with
      its duration and, for a recompile, the guard that failed (the first line of what ``TORCH_LOGS="recompiles"``
      prints). Its ring buffer is widened for the duration, so a burst's early entries are not dropped;
    - ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``: the graphs handed to the backend.

    Counts are differences over the watch, so a process that compiled before (the in-process fallback) reports
    only this burst.
    """

    def __init__(self) -> None:
        self._records: list[logging.LogRecord] = []
        self._handler = _Keep(self._records)
        self._loggers: list[tuple[logging.Logger, int, bool]] = []
        self._metrics_before: list[Any] = []
        self._metrics: list[Any] = []
        self._graphs_before = 0
        self._graphs = 0
        self._limit: int | None = None

    def __enter__(self) -> CompileWatch:
        from torch._dynamo import utils as dynamo_utils
        from torch._logging._internal import log_registry

        self._graphs_before = dynamo_utils.counters["stats"]["unique_graphs"]
        self._metrics_before = dynamo_utils.get_compilation_metrics()
        self._limit = dynamo_utils._compilation_metrics.maxlen
        dynamo_utils.set_compilation_metrics_limit(1 << 20)
        for name in sorted(log_registry.get_artifact_log_qnames()):
            if name.endswith(".__graph_breaks"):
                logger = logging.getLogger(name)
                self._loggers.append((logger, logger.level, logger.propagate))
                logger.setLevel(logging.DEBUG)
                logger.propagate = False
                logger.addHandler(self._handler)
        return self

    def __exit__(self, *exc_info: object) -> None:
        from torch._dynamo import utils as dynamo_utils

        for logger, level, propagate in self._loggers:
            logger.removeHandler(self._handler)
            logger.setLevel(level)
            logger.propagate = propagate
        before = {id(entry) for entry in self._metrics_before}  # the entries are alive: their ids are theirs
        self._metrics = [entry for entry in dynamo_utils.get_compilation_metrics() if id(entry) not in before]
        self._graphs = dynamo_utils.counters["stats"]["unique_graphs"] - self._graphs_before
        dynamo_utils.set_compilation_metrics_limit(self._limit or dynamo_utils.DEFAULT_COMPILATION_METRICS_LIMIT)

    def report(self, scope: str) -> CompileReport:
        """What was compiled (``scope``, in words) and what the compiler did while the watch was open."""
        breaks = [found for found in map(_graph_break, self._records) if found is not None]
        recompiles = [(m.recompile_reason, _function(m)) for m in self._metrics if m.recompile_reason]
        seconds = sum(m.duration_us for m in self._metrics if m.duration_us) / 1e6
        return CompileReport(scope, self._graphs, len(breaks), _listed_breaks(breaks), len(recompiles),
                             _listed_recompiles(recompiles), seconds)


class _Keep(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self._records = records

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)


#: How torch words a graph break's record: "Graph break in user code at FILE:LINE\nGraph Break Reason: ..." (also
#: with "(user stack suppressed due to duplicate graph break)" before "in user code"); a frame that cannot resume
#: after its break is skipped whole, its record naming the user's code as a traceback does.
_AT_USER_CODE = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*)", re.S)
_SKIPPED = "torch.compile will skip tracing the frame"
_TRACEBACK_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')


def _graph_break(record: logging.LogRecord) -> tuple[str, str, str, str, int, str] | None:
    """(reason, explanation, hint, file, line, function) of one graph-break record; None for torch's other records on
    that artifact (a verbose restatement of a break it records again). The function is the user traceback's frame
    at that line, where the record has the traceback (torch leaves it out of a break it recorded before)."""
    message = record.getMessage()
    frames = _TRACEBACK_LINE.findall(message)
    match = _AT_USER_CODE.search(message)
    if match is not None:
        reason, explanation, hint = _reason(match["reason"])
        file, line = match["file"], match["line"]
        if _installed(file):  # a library the user's line called broke
            file, line = next(((at, number) for at, number, _ in reversed(frames) if not _installed(at)), (file, line))
        function = next((name for at, number, name in reversed(frames) if (at, number) == (file, line)), "")
        return reason, explanation, hint, file, int(line), function
    if _SKIPPED in message:
        file, line, function = frames[-1] if frames else ("", "0", "")
        error = record.exc_info[1] if record.exc_info else None
        reason, explanation, hint = _reason(str(error)) if error is not None else ("", "", "")
        return f"the whole frame runs eagerly: {reason}".rstrip(": "), explanation, hint, file, int(line), function
    return None


#: Where installed code lives (the standard library, site-packages): a graph break torch places there was reached
#: from a line of the user's, which is the line to name (Ray, once started, replaces ``print`` with its own function).
_INSTALLED = tuple(os.path.join(os.path.realpath(path), "") for path in {
    sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")})


def _installed(file: str) -> bool:
    return os.path.realpath(file).startswith(_INSTALLED)


def _reason(text: str) -> tuple[str, str, str]:
    """torch's short name for a break, its explanation and its first hint, from its message: the first line after
    any "Encountered graph break ..." preamble, and the text of its first "Explanation:" and "Hint:" lines."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("Encountered graph break")]

    def labelled(label: str) -> str:
        return next((line.removeprefix(label).strip() for line in lines if line.startswith(label)), "")

    return (lines[0] if lines else ""), labelled("Explanation:"), labelled("Hint:")


def _listed_breaks(breaks: list[tuple[str, str, str, str, int, str]]) -> tuple[GraphBreak, ...]:
    counted: dict[tuple[str, str, int], GraphBreak] = {}
    for reason, explanation, hint, file, line, function in breaks:
        key = (reason, file, line)
        known = counted.get(key)
        if known is None:
            counted[key] = GraphBreak(reason, explanation, hint, file, line, function,
                                      linecache.getline(file, line).strip() if file else "", 1)
        else:
            counted[key] = dataclasses.replace(known, function=known.function or function, count=known.count + 1)
    return _most_frequent(counted.values())


def _listed_recompiles(recompiles: list[tuple[str, str]]) -> tuple[Recompile, ...]:
    counted: dict[tuple[str, str], Recompile] = {}
    for raw, function in recompiles:
        reason = _guard(raw)
        key = (function, _shape_of_reason(reason))
        known = counted.get(key)
        counted[key] = dataclasses.replace(known, count=known.count + 1) if known is not None else Recompile(
            reason, function, 1)
    return _most_frequent(counted.values())


def _guard(raw: str) -> str:
    """The failed guard as one line: torch's "3/0: tensor 'x' size mismatch at index 1. expected 8, actual 12"
    without the compile id, its padding collapsed."""
    first = raw.strip().splitlines()[0] if raw.strip() else raw
    return " ".join(re.sub(r"^\d+/\d+: ", "", first).split())


def _shape_of_reason(reason: str) -> str:
    """A reason with its numbers blanked: "expected 8, actual 12" and "expected 12, actual 16" are one reason."""
    return re.sub(r"\d+(\.\d+)?", "#", reason)


def _function(metrics: Any) -> str:
    """``forward (model.py:40)``: the frame a compilation-metrics entry compiled (its first line)."""
    if not metrics.co_name:
        return ""
    if metrics.co_filename == BY_VALUE_FILE:
        return f"{metrics.co_name} (line {metrics.co_firstlineno})"
    return f"{metrics.co_name} ({os.path.basename(metrics.co_filename or '')}:{metrics.co_firstlineno})"


def _most_frequent(found: Any) -> tuple[Any, ...]:
    return tuple(sorted(found, key=lambda item: -item.count)[:LISTED])


def _compile_stage(model: nn.Module, config: Config, site: ModelSite) -> nn.Module:
    """The "compile" stage: :func:`compile_model` over the wrapped model, its blocks found in the unwrapped one; what
    it compiled is told on the site."""
    model, site.compiled = compile_model(model, site.unwrapped, config, site.blocks)
    return model


OWNER = Owner(
    group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE,
    model_steps={"compile-blocks": lambda model, config, site: compile_blocks(model, config, site.blocks),
                 "compile": _compile_stage},
    facts=lambda config, device_kind, visible_gpus: {"compiled": compiled(config)},
)
