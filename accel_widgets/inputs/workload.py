"""``Workload``: the user's model, data, loss and optimizer, as the engine needs them.

A workload is plain data that travels to worker processes by value (cloudpickle), so classes defined
in a notebook work. The engine builds a private copy of everything in the worker: the user's model
object is never touched by a burst.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, default_collate

from .blocks import find_blocks

ModelSource = nn.Module | Callable[[], nn.Module]
OptimizerFactory = Callable[[Any], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]
#: ``eval_fn(model, batch)``: the loss of an evaluation batch, or a dict of metrics (numbers or one-element tensors).
EvalFunction = Callable[[nn.Module, Any], Any]


def default_optimizer(params: Any) -> torch.optim.Optimizer:
    """AdamW at a conventional learning rate: what most training scripts start from."""
    return torch.optim.AdamW(params, lr=1e-3)


@dataclass
class Workload:
    """What to train, in the shapes people already have.

    ``dataset`` is map-style (``__getitem__`` + ``__len__``), a tuple of tensors, a streaming
    ``IterableDataset`` (a WebDataset pipeline too; each rank and loader worker reads its own share,
    once: a stream that splits itself says so with ``splits_itself``, see :mod:`~accel_widgets.data.streams`),
    a ``DataLoader`` the user already tuned (its dataset, sampler, collate_fn, batch size and
    worker_init_fn are kept; the data-loading knobs replace only workers, pinning, prefetching and
    persistence), or a zero-argument factory of any of these, called in each rank once the rank's
    distributed environment is set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``): for a
    dataset that reads its rank when it is built, as MosaicML's ``StreamingDataset`` does.

    The loss, in the first form that fits:
    - ``step(model, batch) -> loss``: the user's own code for what the loop cannot guess (it may return
      ``(loss, logs)`` or ``{"loss": loss, ...}`` too: the loop trains on the loss);
    - items that are ``(input, target)`` pairs: ``loss_fn(model(input), target)`` (a mapping input is
      passed as ``model(**input)``; the output may be a tensor, dict or dataclass);
    - items that are mappings (Hugging Face style): ``model(**batch)``, and the loss is
      ``loss_fn(output, batch)`` or, without a ``loss_fn``, the model's own ``output.loss``.
    ``max_grad_norm`` clips the gradients' total norm before each optimizer step (after unscaling them
    under fp16). ``tokens_per_sample`` makes results report tokens/s (language models); batches with an
    ``attention_mask`` count their real tokens instead. ``batch_size`` is this workload's natural batch,
    used when the config leaves ``batch_size`` at its default.

    For the real job (:mod:`accel_widgets.job`): ``scheduler(optimizer)`` builds the learning-rate schedule
    (``lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)``), stepped once per optimizer
    step in bursts and jobs alike, so a burst measures what the job runs; ``eval_dataset`` is evaluated every
    ``--eval-every`` steps of an exported job, with ``eval_fn(model, batch)`` (a loss or a dict of metrics;
    default: the training loss) under ``torch.no_grad()`` and ``model.eval()``.
    used when the config leaves ``batch_size`` at its default. ``blocks`` names the model's stack of repeated blocks
    (a dotted path to an ``nn.ModuleList`` or ``nn.Sequential``, e.g. ``"transformer.h"``) for what works per block
    (``compile_scope="blocks"``); None: the stack of two or more modules of one class with the most parameters,
    found in the model (:func:`~accel_widgets.inputs.blocks.find_blocks`).
    """

    model: ModelSource
    dataset: Dataset | Sequence[torch.Tensor]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    optimizer: OptimizerFactory = default_optimizer
    collate_fn: Callable[[list[Any]], Any] | None = None
    name: str = "workload"
    tokens_per_sample: int | None = None
    batch_size: int | None = None
    seed: int = 0
    #: Seeds the data order and augmentation (the loader's generator, the RNG items draw from); None: ``seed``.
    #: Apart from ``seed`` (the weights), so the guard can reseed the data alone and see what that moves.
    data_seed: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    step: Callable[[nn.Module, Any], torch.Tensor] | None = None
    max_grad_norm: float | None = None
    loader: DataLoader | None = None
    scheduler: SchedulerFactory | None = None
    eval_dataset: Dataset | Sequence[torch.Tensor] | None = None
    eval_fn: EvalFunction | None = None
    blocks: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.model, nn.Module) or callable(self.model)):
            raise TypeError(f"Workload.model must be an nn.Module or a zero-argument factory, got {self.model!r}")
        if not isinstance(self.model, nn.Module):
            _check_zero_argument_factory(self.model)
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise TypeError(f"Workload.loss_fn must be callable as loss_fn(output, target), got {self.loss_fn!r}")
        if self.step is not None and not callable(self.step):
            raise TypeError(f"Workload.step must be callable as step(model, batch) -> loss, got {self.step!r}")
        if self.max_grad_norm is not None and not (isinstance(self.max_grad_norm, (int, float))
                                                   and math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"Workload.max_grad_norm={self.max_grad_norm!r}: use a finite number > 0, or None")
        self._check_job_fields()
        self._check_blocks()
        if isinstance(self.dataset, DataLoader):
            self._take_loader(self.dataset)
        if not callable(self.optimizer):
            raise TypeError("Workload.optimizer must be a factory: optimizer(params) -> torch.optim.Optimizer")
        if self.dataset_is_factory:  # built in each rank: checked there, when it is built
            _check_zero_argument_factory(self.dataset, "dataset", "a built dataset")
            return
        self.dataset = _as_dataset(self.dataset, "Workload.dataset")
        self._check_items()

    def _check_job_fields(self) -> None:
        """The schedule and the evaluation are checked here, so a job fails before it starts, naming the field."""
        if self.scheduler is not None and not callable(self.scheduler):
            raise TypeError("Workload.scheduler must be a factory: scheduler(optimizer) -> an LR scheduler, e.g. "
                            "scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000); got "
                            f"{self.scheduler!r}")
        if self.eval_fn is not None and not callable(self.eval_fn):
            raise TypeError(f"Workload.eval_fn must be callable as eval_fn(model, batch) -> loss or a dict of metrics, "
                            f"got {self.eval_fn!r}")
        if self.eval_fn is not None and self.eval_dataset is None:
            raise ValueError(f"Workload.eval_fn={callable_name(self.eval_fn)} is given without an eval_dataset to "
                             "evaluate: pass eval_dataset=... too")
        if self.eval_dataset is None:
            return
        if isinstance(self.eval_dataset, DataLoader):
            self.eval_dataset = self.eval_dataset.dataset
        self.eval_dataset = _as_dataset(self.eval_dataset, "Workload.eval_dataset")
        if isinstance(self.eval_dataset, IterableDataset):
            raise TypeError("Workload.eval_dataset is a stream (an IterableDataset): an evaluation reads a fixed set "
                            "of items, split across ranks by index. Pass a map-style dataset (__getitem__ and "
                            "__len__) or a tuple of tensors")

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        """The learning-rate schedule for ``optimizer`` (None without one), checked: it is stepped once per optimizer
        step and checkpointed, so it must have ``step()``, ``state_dict()`` and ``load_state_dict()``."""
        if self.scheduler is None:
            return None
        scheduler = self.scheduler(optimizer)
        if not all(callable(getattr(scheduler, method, None)) for method in ("step", "state_dict", "load_state_dict")):
            raise TypeError(
                f"Workload.scheduler={callable_name(self.scheduler)} returned {type(scheduler).__name__}, not an LR "
                "scheduler: the factory must return the scheduler it builds for the optimizer it is given, e.g. "
                "scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)"
            )
        return scheduler
    def _check_blocks(self) -> None:
        """A ``blocks`` path is checked against a model instance now; a factory's model is checked where it is built."""
        if self.blocks is None:
            return
        if not isinstance(self.blocks, str) or not self.blocks.strip():
            raise TypeError(f"Workload.blocks must be the dotted path of the model's stack of blocks (e.g. "
                            f"'transformer.h'), or None to find it, got {self.blocks!r}")
        if isinstance(self.model, nn.Module):
            find_blocks(self.model, self.blocks)

    @property
    def dataset_is_factory(self) -> bool:
        """Whether ``dataset`` is a factory each rank calls (anything callable that is no dataset itself)."""
        return callable(self.dataset) and not isinstance(self.dataset, (Dataset, DataLoader, tuple, list))

    def build_dataset(self) -> Dataset:
        """The dataset a rank reads: ``dataset`` itself, or what its factory builds now, checked as a dataset given
        directly is (a DataLoader's own settings are not taken from a factory's product: only its dataset)."""
        if not self.dataset_is_factory:
            return self.dataset  # type: ignore[return-value]  # made a Dataset in __post_init__
        built = self.dataset()  # type: ignore[operator]
        if isinstance(built, DataLoader):
            built = built.dataset
        return _as_dataset(built, f"what Workload.dataset={callable_name(self.dataset)} returned")

    def _take_loader(self, loader: DataLoader) -> None:
        """A user's DataLoader: its dataset and collate_fn become the workload's, and the loader is kept
        so that its sampler, batch size and worker_init_fn are used too (the knobs replace the rest)."""
        self.loader, self.dataset = loader, loader.dataset
        if self.collate_fn is None and loader.collate_fn is not default_collate:
            self.collate_fn = loader.collate_fn
        if self.batch_size is None:
            self.batch_size = loader.batch_size

    def _check_items(self) -> None:
        """Read ``dataset[0]`` now, so an item the loop cannot use fails here and says what to write.

        A ``step`` or a ``collate_fn`` decides for itself what a batch is, and a streaming dataset has
        no item 0 to read without consuming it: those are checked by the first step in the worker.
        """
        if self.step is not None or self.collate_fn is not None or isinstance(self.dataset, IterableDataset):
            return
        item = self.dataset[0]
        if isinstance(item, Mapping):
            if self.loss_fn is None and not {"labels", "label"} & set(item):
                raise TypeError(
                    f"dataset items are dicts ({', '.join(map(str, item))}) and there is no loss_fn, so the model "
                    "must compute its own loss -- Hugging Face models do when the batch holds 'labels'. Add "
                    "'labels' to each item, or pass loss_fn=lambda output, batch: ..., or step=lambda model, "
                    "batch: ..."
                )
            return
        if isinstance(item, (tuple, list)) and len(item) == 2:
            if self.loss_fn is None:
                raise TypeError("dataset items are (input, target) pairs and there is no loss_fn: pass one, e.g. "
                                "loss_fn=torch.nn.functional.cross_entropy, or step=lambda model, batch: ...")
            return
        shape = f"a {type(item).__name__}" + (f" of {len(item)}" if isinstance(item, (tuple, list)) else "")
        raise TypeError(
            f"dataset[0] is {shape}: each item must be an (input, target) pair or a dict of tensors. Return "
            "(x, y) from __getitem__, or pass collate_fn=... that builds (inputs, targets), or step=lambda model, "
            "batch: loss"
        )

    def build_model(self) -> nn.Module:
        """A fresh model: the factory's product under the workload seed, or the instance as given.

        Workers call this on their own unpickled copy, so the instance returned here is private.
        """
        if isinstance(self.model, nn.Module):
            return self.model
        torch.manual_seed(self.seed)
        model = self.model()
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"Workload.model is a factory ({_name(self.model)}), so it is called to build the model, and it "
                f"returned {type(model).__name__}, not an nn.Module: make it return the model, or pass the model "
                "instance itself as Workload(model=...)"
            )
        return model

    def model_outline(self) -> nn.Module | None:
        """The model's structure, to read before any process starts (which layers, which repeated blocks), never
        trained: the instance as given, or the factory's model built on the meta device, where its weights take no
        memory. None when the factory cannot build there (it loads weights from a file, it moves itself to a
        device); the ranks then read the real model."""
        if isinstance(self.model, nn.Module):
            return self.model
        try:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):  # the caller's random state untouched
                model = self.model()
        except Exception:  # whatever the user's factory raises on the meta device, the real build will tell
            return None
        return model if isinstance(model, nn.Module) else None

    def build_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The optimizer the factory builds for ``params``, checked: a factory that returns nothing (a missing
        ``return``) would otherwise fail inside GradScaler at the first step, naming none of the user's code."""
        optimizer = self.optimizer(params)
        if not all(callable(getattr(optimizer, method, None)) for method in ("step", "zero_grad")) or not hasattr(
                optimizer, "param_groups"):
            raise TypeError(
                f"Workload.optimizer={callable_name(self.optimizer)} returned {type(optimizer).__name__}, not a "
                "torch.optim.Optimizer: the factory must return the optimizer it builds, e.g. "
                "optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)"
            )
        return optimizer


def callable_name(obj: Any) -> str:
    """How a user's function is named in a message: its qualified name, with its module unless it was defined in the
    notebook or script itself (``__main__``); a ``functools.partial`` by the function it wraps."""
    if isinstance(obj, functools.partial):
        return f"functools.partial({callable_name(obj.func)}, ...)"
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    module = getattr(obj, "__module__", None)
    return name if module in (None, "__main__", "builtins") else f"{module}.{name}"


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def _as_dataset(dataset: Any, what: str) -> Dataset:
    """``dataset`` as the loader reads it (a tuple of tensors becomes a TensorDataset), or a TypeError/ValueError
    saying why it cannot be read, starting with ``what``."""
    if isinstance(dataset, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in dataset):
        dataset = TensorDataset(*dataset)
    # A stream (IterableDataset, e.g. a webdataset pipeline) has no length to check: an empty one is
    # reported by the first step, which finds no batch.
    if isinstance(dataset, IterableDataset):
        return dataset
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(f"{what} must be map-style (define __getitem__ and __len__), an IterableDataset, a tuple of "
                        f"tensors or a zero-argument factory of one; got {type(dataset).__name__}")
    if len(dataset) == 0:
        raise ValueError(f"{what} is empty: a burst needs at least one batch of data")
    return dataset


def _check_zero_argument_factory(factory: Callable[..., Any], field: str = "model",
                                 built: str = "a built model") -> None:
    """A model that is not an nn.Module (a dataset that is no dataset) is a factory the worker calls with no
    arguments: check that now, so ``model=nn.Linear`` fails here, naming what to pass, instead of in the worker
    after a process started."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins have no signature to read: the worker call will tell
        return
    try:
        signature.bind()
    except TypeError:
        required = [p.name for p in signature.parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        name = _name(factory)
        kind = "an nn.Module" if field == "model" else "a dataset"
        raise TypeError(
            f"Workload.{field}={name} is not {kind}, so it is taken as a factory and called with no "
            f"arguments, but it needs {', '.join(required)}. Pass {built}, e.g. {field}={name}(...), or a "
            f"zero-argument factory, e.g. {field}=lambda: {name}(...)"
        ) from None


class WorkloadReferenceError(ValueError):
    """A ``MODULE:FUNCTION`` workload reference names no module, no such function, or one that returns no Workload."""


def load_workload(reference: str) -> Workload:
    """Import ``module:function`` and call it; the function returns a Workload (or is one).

    The current directory is searched first, as ``python -m`` does, so a ``mywl.py`` next to the user works
    without installing it. Every way the reference can be wrong is a :class:`WorkloadReferenceError`.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise WorkloadReferenceError(f"workload {reference!r}: use MODULE:FUNCTION, e.g. mypkg.train:make_workload")
    module = _import_from_cwd(module_name, reference)
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise WorkloadReferenceError(f"workload {reference!r}: module {module_name!r} ({module.__file__}) has no "
                                     f"{attribute!r}") from None
    workload = target() if callable(target) and not isinstance(target, Workload) else target
    if not isinstance(workload, Workload):
        raise WorkloadReferenceError(f"workload {reference!r} must return an accel_widgets.Workload, got "
                                     f"{type(workload).__name__}")
    return workload


def _import_from_cwd(module_name: str, reference: str) -> ModuleType:
    """Import ``module_name`` with the current directory first on ``sys.path`` (it stays there, as under
    ``python -m``, so that worker processes started afterwards find the module too)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(f"{exc.name}.")):
            raise  # the module was found and one of its own imports failed: that error names the missing one
        raise WorkloadReferenceError(f"workload {reference!r}: no module named {exc.name!r} in the current "
                                     f"directory ({cwd}) or on the Python path") from None
