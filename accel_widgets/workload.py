"""``Workload``: the user's model, data, loss and optimizer, as the engine needs them.

A workload is plain data that travels to worker processes by value (cloudpickle), so classes defined
in a notebook work. The engine builds a private copy of everything in the worker: the user's model
object is never touched by a burst.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

ModelSource = nn.Module | Callable[[], nn.Module]
OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


def default_optimizer(params: Any) -> torch.optim.Optimizer:
    """AdamW at a conventional learning rate: what most training scripts start from."""
    return torch.optim.AdamW(params, lr=1e-3)


@dataclass
class Workload:
    """What to train. ``dataset`` is map-style (``__getitem__`` + ``__len__``) or a tuple of tensors.

    ``loss_fn(output, target)`` receives the model's raw output (a tensor, dict or dataclass: the loss
    decides what to use). Items are ``(input, target)`` pairs. ``tokens_per_sample`` makes results
    report tokens/s as well (language models). ``batch_size`` is this workload's natural batch, used when
    the config leaves ``batch_size`` at its default.
    """

    model: ModelSource
    dataset: Dataset | Sequence[torch.Tensor]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    optimizer: OptimizerFactory = default_optimizer
    collate_fn: Callable[[list[Any]], Any] | None = None
    name: str = "workload"
    tokens_per_sample: int | None = None
    batch_size: int | None = None
    seed: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.model, nn.Module) or callable(self.model)):
            raise TypeError(f"Workload.model must be an nn.Module or a zero-argument factory, got {self.model!r}")
        if not isinstance(self.model, nn.Module):
            _check_zero_argument_factory(self.model)
        if not callable(self.loss_fn):
            raise TypeError(f"Workload.loss_fn must be callable as loss_fn(output, target), got {self.loss_fn!r}")
        if not callable(self.optimizer):
            raise TypeError("Workload.optimizer must be a factory: optimizer(params) -> torch.optim.Optimizer")
        if isinstance(self.dataset, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in self.dataset):
            self.dataset = TensorDataset(*self.dataset)
        if not (hasattr(self.dataset, "__getitem__") and hasattr(self.dataset, "__len__")):
            raise TypeError(
                "Workload.dataset must be map-style (define __getitem__ and __len__) or a tuple of tensors; "
                f"got {type(self.dataset).__name__}"
            )
        if len(self.dataset) == 0:
            raise ValueError("Workload.dataset is empty: a burst needs at least one batch of data")

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


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def _check_zero_argument_factory(factory: Callable[..., Any]) -> None:
    """A model that is not an nn.Module is a factory the worker calls with no arguments: check that now,
    so ``model=nn.Linear`` fails here, naming what to pass, instead of in the worker after a process started."""
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
        raise TypeError(
            f"Workload.model={name} is not an nn.Module, so it is taken as a factory and called with no "
            f"arguments, but it needs {', '.join(required)}. Pass a built model, e.g. model={name}(...), or a "
            f"zero-argument factory, e.g. model=lambda: {name}(...)"
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
