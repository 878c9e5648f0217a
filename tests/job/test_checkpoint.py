"""Checkpoints: written through or never picked, the newest K kept, and only resumed by as many ranks as wrote them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accel_widgets.data.resume import DataPosition
from accel_widgets.job.checkpoint import Checkpoints, JobState, RankState, restore_rng, rng_states
from tests.workloads import TinyNet


def save(checkpoints: Checkpoints, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    return checkpoints.save(step, model, optimizer, JobState(step, 1, None, None),
                            RankState(DataPosition(0, step, None), rng_states()))


def test_only_checkpoints_written_through_are_resumed_from_and_the_newest_k_are_kept(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    checkpoints = Checkpoints(tmp_path, keep=2, rank=0)
    for step in (3, 6, 9):
        save(checkpoints, step, model, optimizer)
    (tmp_path / ".step_00000012.tmp").mkdir()  # a save the job died in
    (tmp_path / "step_00000015").mkdir()  # a folder without DCP's metadata: never complete
    assert [path.name for path in checkpoints.complete()] == ["step_00000006", "step_00000009"]
    assert checkpoints.newest() == tmp_path / "step_00000009"

    fresh = TinyNet()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    job, mine = checkpoints.read_states(tmp_path / "step_00000009", ranks=1)
    checkpoints.load_training(tmp_path / "step_00000009", fresh, fresh_optimizer)
    assert job.step == 9 and mine.data == DataPosition(0, 9, None)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(),
                                                 strict=True))
    moments = [opt.state_dict()["state"][0]["exp_avg"] for opt in (fresh_optimizer, optimizer)]
    assert torch.equal(*moments)
    with pytest.raises(ValueError, match="written by 1 rank\\(s\\) and this job runs 2"):
        checkpoints.read_states(tmp_path / "step_00000009", ranks=2)


def test_every_generator_comes_back_where_it_was() -> None:
    import random

    import numpy as np

    states = rng_states()
    drawn = (torch.rand(3), random.random(), np.random.rand())
    torch.rand(7), random.random(), np.random.rand()
    restore_rng(states)
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (drawn[0].tolist(), *drawn[1:])
