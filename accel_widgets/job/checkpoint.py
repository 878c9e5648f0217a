"""A job's checkpoints: everything training depends on, written atomically with ``torch.distributed.checkpoint``.

A checkpoint is a folder ``step_XXXXXXXX`` of one DCP save. It holds the model and the optimizer as
``torch.distributed.checkpoint.state_dict`` gives them (each rank writes its part: with DDP one copy, with sharded
parameters each rank its shard), and, as objects, the job's state every rank shares (the step, the GradScaler's,
the LR schedule's) and one entry per rank for what differs between ranks: where it is in its data and every
random generator it draws from (torch's CPU and CUDA ones, Python's ``random``, numpy's).

Atomic: every rank writes into a hidden temporary folder; after a barrier, rank 0 renames it to its step's name
and removes the oldest beyond the ones kept. Only a folder with DCP's ``.metadata`` under a step's name is ever
resumed from, so a checkpoint half written when the job died is never picked. On several machines the folder
must be on storage they all see.

``torch.distributed.checkpoint`` is imported when a checkpoint is written or read (it takes ~2 s to import): a job
without checkpoints starts without it.
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..data.resume import DataPosition

_STEP = re.compile(r"step_(\d{8})")
_METADATA = ".metadata"  # DCP writes it last, once every rank's data is down


@dataclass
class JobState:
    """What every rank of the job shares: the optimizer steps taken, the ranks, the GradScaler's state (None when
    it is off) and the LR schedule's (None without one)."""

    step: int
    ranks: int
    scaler: dict[str, Any] | None
    scheduler: dict[str, Any] | None


@dataclass
class RankState:
    """What one rank alone holds: its data position and its random generators' states."""

    data: DataPosition
    rng: dict[str, Any]


def rng_states() -> dict[str, Any]:
    """Every random generator training may draw from, as it is now."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def restore_rng(states: dict[str, Any]) -> None:
    """Put every generator back where :func:`rng_states` found it."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None:
        torch.cuda.set_rng_state_all(states["cuda"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])


class Checkpoints:
    """The checkpoints of one job in ``directory``, seen from rank ``rank`` (rank 0 renames and prunes)."""

    def __init__(self, directory: str | Path, *, keep: int, rank: int) -> None:
        self.directory, self.keep, self.rank = Path(directory), keep, rank

    def complete(self) -> list[Path]:
        """The checkpoints that were written through, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [path for path in self.directory.iterdir()
                 if _STEP.fullmatch(path.name) and (path / _METADATA).is_file()]
        return sorted(found, key=lambda path: path.name)

    def newest(self) -> Path | None:
        complete = self.complete()
        return complete[-1] if complete else None

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, job: JobState,
             rank_state: RankState) -> Path:
        """Write the checkpoint of ``step`` (every rank calls this together); returns its folder."""
        final = self.directory / f"step_{step:08d}"
        temporary = self.directory / f".{final.name}.tmp"
        if self.rank == 0:
            shutil.rmtree(temporary, ignore_errors=True)  # what a job killed while writing left
            temporary.mkdir(parents=True)
        _barrier()
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "job": job, f"rank{self.rank}": rank_state}
        with _single_process_quiet():
            dcp.save(state, checkpoint_id=temporary, no_dist=not _distributed())
        _barrier()
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)  # a step written again replaces its older copy
            temporary.rename(final)
            for old in self.complete()[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        _barrier()
        return final

    def read_states(self, path: Path, ranks: int) -> tuple[JobState, RankState]:
        """The job's and this rank's states in ``path``, read before training is built (the data position decides
        where the loader starts). Refuses a checkpoint written by a different number of ranks: each rank's data
        position is its own share's."""
        import torch.distributed.checkpoint as dcp

        state: dict[str, Any] = {"job": None}
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=path, no_dist=not _distributed())
        job: JobState = state["job"]
        if job.ranks != ranks:
            raise ValueError(f"checkpoint {path} was written by {job.ranks} rank(s) and this job runs {ranks}: each "
                             "rank's data position is its own share's. Resume with the same number of ranks, or "
                             "start a new --checkpoint-dir")
        mine: dict[str, Any] = {f"rank{self.rank}": None}
        with _single_process_quiet():
            dcp.load(mine, checkpoint_id=path, no_dist=not _distributed())
        return job, mine[f"rank{self.rank}"]

    def load_training(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the model's and the optimizer's states in ``path`` into ``model`` and ``optimizer`` (in place)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=path, no_dist=not _distributed())
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns that it "assumes the intent is to save in a single process" when there is no process group: here
    that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled, unavailable or uninitialized")
        yield
