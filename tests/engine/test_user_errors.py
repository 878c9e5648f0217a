"""Errors name the user's code: an optimizer factory that returns nothing, an exception raised in a DataLoader
worker, a custom step that returns more than the loss. Real bursts, CPU only."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from accel_widgets import BurstEngine, BurstOptions, Config, WorkerError, Workload, run_burst
from accel_widgets.views.text import summary
from tests.devices import cpu_device
from tests.workloads import TinyNet, tensors, tiny_workload

INPROCESS = BurstEngine(BurstOptions(isolation="inprocess", device=cpu_device()))


def forgot_to_return(params: Any) -> None:
    torch.optim.AdamW(params, lr=1e-3)  # built, but not returned


def test_an_optimizer_factory_returning_none_is_named_at_the_first_step() -> None:
    with pytest.raises(WorkerError) as info:
        run_burst(tiny_workload(optimizer=forgot_to_return), Config(), steps=2,
                  options=BurstOptions(device=cpu_device()))
    assert info.value.result.error.message == (
        "TypeError: Workload.optimizer=tests.engine.test_user_errors.forgot_to_return returned NoneType, not a "
        "torch.optim.Optimizer: the factory must return the optimizer it builds, e.g. "
        "optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)")


class CorruptItem(Dataset):
    """512 (x, y) pairs, one of which cannot be decoded."""

    def __init__(self, corrupt: int = 37) -> None:
        self.x, self.y = tensors()
        self.corrupt = corrupt

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == self.corrupt:
            raise ValueError(f"item {index}: truncated record")
        return self.x[index], self.y[index]


def test_an_error_in_a_loader_worker_is_headed_by_the_users_exception() -> None:
    workload = Workload(model=TinyNet, dataset=CorruptItem(), loss_fn=F.cross_entropy, batch_size=32, name="corrupt")
    with pytest.raises(WorkerError) as info:
        run_burst(workload, Config(num_workers=2), steps=40, options=BurstOptions(device=cpu_device()))
    error = info.value.result.error
    assert re.fullmatch(r"ValueError: item 37: truncated record \(raised in DataLoader worker process [01]\)",
                        error.message), error.message
    assert "Caught ValueError in DataLoader worker process" in error.traceback  # torch's own account stays there
    assert str(info.value).startswith(f"rank 0 failed: {error.message}")


def plain_step(model: nn.Module, batch: Any) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def step_with_logs(model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
    logits = model(batch[0])
    return F.cross_entropy(logits, batch[1]), {"accuracy": (logits.argmax(1) == batch[1]).float().mean().item()}


def step_as_dict(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    logits = model(batch[0])
    return {"loss": F.cross_entropy(logits, batch[1]), "logits": logits}


@pytest.mark.parametrize("step", [step_with_logs, step_as_dict], ids=["(loss, logs)", "{'loss': ...}"])
def test_a_step_returning_the_loss_with_its_logs_trains_on_the_loss(step: Any) -> None:
    reference = INPROCESS(tiny_workload(step=plain_step), Config(), steps=5)
    result = INPROCESS(tiny_workload(step=step), Config(), steps=5)
    assert result.ok, summary(result)
    assert result.losses() == reference.losses()


def logits_only(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    return {"logits": model(batch[0])}


def per_sample_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")


@pytest.mark.parametrize(("step", "returned"), [
    (logits_only, "a dict with keys 'logits' (no 'loss' tensor)"),
    (per_sample_loss, "a tensor of shape (32,)"),
], ids=["no loss", "not reduced"])
def test_a_step_returning_no_usable_loss_says_what_to_return(step: Any, returned: str) -> None:
    with pytest.raises(WorkerError) as info:
        INPROCESS(tiny_workload(step=step), Config(), steps=2)
    assert info.value.result.error.message == (
        f"BatchFormatError: Workload.step=tests.engine.test_user_errors.{step.__name__} returned {returned}: return "
        "the loss as a one-element tensor (e.g. loss.mean()), a (loss, logs) tuple or a dict with a 'loss' tensor")
