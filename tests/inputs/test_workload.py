"""``Workload`` checks what it can at creation, so a wrong model fails here rather than in a worker."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from accel_widgets import Workload
from tests.workloads import TinyNet, tensors


def make(model: object) -> Workload:
    return Workload(model=model, dataset=tensors(), loss_fn=F.cross_entropy)  # type: ignore[arg-type]


def test_a_class_that_needs_arguments_fails_at_once_naming_what_to_pass():
    with pytest.raises(TypeError) as info:
        make(nn.Linear)
    assert str(info.value) == (
        "Workload.model=Linear is not an nn.Module, so it is taken as a factory and called with no arguments, but "
        "it needs in_features, out_features. Pass a built model, e.g. model=Linear(...), or a zero-argument "
        "factory, e.g. model=lambda: Linear(...)")


def test_a_factory_function_with_a_required_argument_is_refused():
    def build(width: int) -> nn.Module:
        return nn.Linear(width, 4)

    with pytest.raises(TypeError, match=r"it needs width\. Pass a built model"):
        make(build)


@pytest.mark.parametrize("model", [TinyNet(), TinyNet, lambda: TinyNet(), functools.partial(nn.Linear, 16, 4)])
def test_zero_argument_factories_and_instances_are_accepted(model):
    assert isinstance(make(model).build_model(), nn.Module)


def test_a_factory_returning_something_else_says_what_it_returned():
    def build() -> object:
        return {"weights": 1}

    with pytest.raises(TypeError) as info:
        make(build).build_model()
    message = str(info.value)
    assert "Workload.model is a factory (test_a_factory_returning_something_else_says_what_it_returned.<locals>" \
           ".build), so it is called to build the model, and it returned dict, not an nn.Module" in message
    assert "pass the model instance itself as Workload(model=...)" in message


# -- a dataset factory: built in each rank -----------------------------------------------------------------
def test_a_dataset_factory_is_built_when_the_rank_asks_and_checked_as_a_dataset() -> None:
    workload = Workload(model=TinyNet, dataset=functools.partial(tensors, 64), loss_fn=F.cross_entropy)
    assert workload.dataset_is_factory
    assert len(workload.build_dataset()) == 64  # a tuple of tensors, made a TensorDataset as when given directly
    assert not Workload(model=TinyNet, dataset=tensors(64), loss_fn=F.cross_entropy).dataset_is_factory

    def nothing() -> None:
        return None

    with pytest.raises(TypeError, match=r"what Workload.dataset=.*nothing returned must be map-style"):
        Workload(model=TinyNet, dataset=nothing, loss_fn=F.cross_entropy).build_dataset()


def test_a_dataset_factory_that_needs_arguments_is_refused_at_once() -> None:
    def build(n: int) -> object:
        return tensors(n)

    with pytest.raises(TypeError, match=r"Workload.dataset=.*build is not a dataset, so it is taken as a factory .* "
                                        r"it needs n\. Pass a built dataset"):
        Workload(model=TinyNet, dataset=build, loss_fn=F.cross_entropy)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(tensors(8)[0])


def test_the_jobs_fields_are_checked_when_the_workload_is_made() -> None:
    """A schedule or an evaluation the job cannot use fails here, naming the field and what to pass."""
    base = {"model": TinyNet, "dataset": tensors(64), "loss_fn": F.cross_entropy}
    with pytest.raises(TypeError, match=r"Workload\.scheduler must be a factory: scheduler\(optimizer\)"):
        Workload(**base, scheduler=0.5)
    with pytest.raises(ValueError, match=r"eval_fn=.* is given without an eval_dataset"):
        Workload(**base, eval_fn=lambda model, batch: 0.0)
    with pytest.raises(TypeError, match="eval_dataset is a stream"):
        Workload(**base, eval_dataset=Stream())
    with pytest.raises(ValueError, match=r"Workload\.eval_dataset is empty"):
        Workload(**base, eval_dataset=tensors(0))
    no_scheduler = Workload(**base, scheduler=lambda optimizer: None)
    with pytest.raises(TypeError, match="returned NoneType, not an LR scheduler"):
        no_scheduler.build_scheduler(torch.optim.SGD(TinyNet().parameters(), lr=0.1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*tensors(8)), batch_size=4)
    assert isinstance(Workload(**base, eval_dataset=loader).eval_dataset, torch.utils.data.TensorDataset)
