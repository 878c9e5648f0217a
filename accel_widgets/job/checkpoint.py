"""A job's checkpoints: everything training depends on, written atomically with ``torch.distributed.checkpoint``.

A checkpoint is a folder ``step_XXXXXXXX`` of one DCP save. It holds the model and the optimizer as
``torch.distributed.checkpoint.state_dict`` gives them (each rank writes its part: with DDP one copy, with sharded
parameters each rank its shard), and, as objects, the job's state every rank shares (the step, the GradScaler's,
the LR schedule's) and one entry per rank for what differs between ranks: where it is in its data and every
random generator it draws from (torch's CPU and CUDA ones, Python's ``random``, numpy's).

Atomic: every rank writes into a hidden temporary folder (``.step_XXXXXXXX.tmp``); after a barrier, rank 0 renames
it to its step's name. A job killed during a save leaves the checkpoints before it as they were and the partial one
under its hidden name, never picked; the next save removes such leftovers. The oldest beyond the ones kept are
hidden by a rename before they are deleted, so a kill in the middle of a deletion never leaves a half-deleted folder
under a step's name. On several machines the folder must be on storage they all see.

A resume starts from the newest checkpoint that can be read through (:meth:`Checkpoints.resume_point`): its
``.metadata`` is there and unpickles, every byte it points at is in its files, and the job's and every rank's
states load. A damaged one (overwritten, truncated, its metadata gone) is said with what is wrong, moved aside as
``step_XXXXXXXX.damaged`` (kept, never deleted) and the one before it is tried. DCP keeps no checksums: tensor bytes
overwritten in place, at their length, would load as they are.

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


class WrittenByOtherRanks(ValueError):
    """The checkpoint was written by another number of ranks than the job that resumes it runs."""


class NoUsableCheckpoint(RuntimeError):
    """``--resume`` found checkpoints and none of them can be read through: the job cannot carry on."""


class Checkpoints:
    """The checkpoints of one job in ``directory``, seen from rank ``rank`` (rank 0 renames, prunes and moves aside)."""

    def __init__(self, directory: str | Path, *, keep: int, rank: int) -> None:
        self.directory, self.keep, self.rank = Path(directory), keep, rank

    def steps(self) -> list[Path]:
        """Every folder under a step's name, oldest first: the checkpoints, and any damaged since it was written."""
        if not self.directory.is_dir():
            return []
        return sorted((path for path in self.directory.iterdir() if _STEP.fullmatch(path.name)),
                      key=lambda path: path.name)

    def complete(self) -> list[Path]:
        """The checkpoints that were written through (their ``.metadata`` is there), oldest first."""
        return [path for path in self.steps() if (path / _METADATA).is_file()]

    def newest(self) -> Path | None:
        complete = self.complete()
        return complete[-1] if complete else None

    def resume_point(self, ranks: int) -> tuple[Path | None, list[str]]:
        """The newest checkpoint a job of ``ranks`` ranks can resume from (None: none was written yet), and a note
        for each newer one that is damaged: what is wrong with it, and where it was moved aside. Every rank calls this
        together: rank 0 reads the checkpoints and moves the damaged ones, and the others take its answer.

        Raises :class:`NoUsableCheckpoint` when there are checkpoints and none can be read, and
        :class:`WrittenByOtherRanks` for one written by another number of ranks (no damage: the job was started
        differently).
        """
        answer: tuple[str | None, list[str], Exception | None] = (None, [], None)
        if self.rank == 0:
            try:
                answer = self._choose(ranks)
            except WrittenByOtherRanks as exc:
                answer = (None, [], exc)
        if _distributed():
            shared = [answer]
            dist.broadcast_object_list(shared, src=0)  # every rank resumes from the same one, or none does
            answer = shared[0]
        chosen, notes, failure = answer
        if failure is not None:
            raise failure
        return (self.directory / chosen if chosen is not None else None), notes

    def _choose(self, ranks: int) -> tuple[str | None, list[str], Exception | None]:
        """Rank 0's reading: the chosen folder's name, the notes, and the failure when none can be used."""
        notes, damaged = [], []
        for path in reversed(self.steps()):
            problem = damage(path, ranks)
            if problem is None:
                return path.name, notes, None
            aside = _move_aside(path)
            damaged.append(f"{path.name} ({problem})")
            notes.append(f"checkpoint {path.name} is damaged: {problem}; moved aside to {aside.name} (kept), "
                         "trying the one before it")
        if not damaged:
            return None, notes, None
        return None, notes, NoUsableCheckpoint(
            f"--resume: no usable checkpoint in {self.directory}: {'; '.join(damaged)}. Moved aside (*.damaged, "
            "kept); start without --resume to train from step 0")

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
            self._publish(temporary, final)
        _barrier()
        return final

    def _publish(self, temporary: Path, final: Path) -> None:
        """Rank 0: the written folder under its step's name, then the oldest beyond ``keep`` and the leftovers of
        saves that were killed removed. What is deleted is renamed to a hidden name first: a kill in between leaves a
        hidden folder, never a step's name on half a checkpoint."""
        if final.exists():  # a step written again replaces its older copy
            _delete(final)
        temporary.rename(final)
        for old in self.complete()[:-self.keep]:
            _delete(old)
        for leftover in self.directory.glob(".step_*"):
            if leftover != temporary:
                shutil.rmtree(leftover, ignore_errors=True)

    def read_states(self, path: Path, ranks: int) -> tuple[JobState, RankState]:
        """The job's and this rank's states in ``path``, read before training is built (the data position decides
        where the loader starts). Refuses a checkpoint written by a different number of ranks
        (:class:`WrittenByOtherRanks`): each rank's data position is its own share's."""
        job, states = _load_states(path, ranks, [self.rank], alone=not _distributed())
        return job, states[self.rank]

    def load_training(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the model's and the optimizer's states in ``path`` into ``model`` and ``optimizer`` (in place)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=path, no_dist=not _distributed())
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def damage(path: Path, ranks: int) -> str | None:
    """What makes the checkpoint in ``path`` unusable for a job of ``ranks`` ranks, or None when it can be read
    through: its ``.metadata`` is there and unpickles, every byte it points at is in the files, and the job's and
    every rank's states load. A checkpoint of another number of ranks raises :class:`WrittenByOtherRanks`, as
    resuming it would."""
    from torch.distributed.checkpoint import FileSystemReader

    if not (path / _METADATA).is_file():
        return f"its {_METADATA} is missing (the save was cut short, or the file was removed)"
    try:
        metadata = FileSystemReader(path).read_metadata()
    except Exception as exc:  # whatever unpickling garbage raises
        return f"its {_METADATA} cannot be read ({_short(exc)})"
    for name, needed in _bytes_needed(metadata).items():
        file = path / name
        size = file.stat().st_size if file.is_file() else None
        if size is None:
            return f"{name} is missing"
        if size < needed:
            return f"{name} is truncated ({size:,} of {needed:,} bytes)"
    try:
        _load_states(path, ranks, list(range(ranks)), alone=True)
    except WrittenByOtherRanks:
        raise
    except Exception as exc:  # whatever unpickling garbage raises
        return f"its job state cannot be read ({_short(exc)})"
    return None


def _load_states(path: Path, ranks: int, which: list[int], *, alone: bool) -> tuple[JobState, dict[int, RankState]]:
    """The job's state in ``path`` and the states of the ranks ``which``; ``alone``: read by this process on its own
    (one process, or rank 0 checking a checkpoint), else by every rank together."""
    import torch.distributed.checkpoint as dcp

    state: dict[str, Any] = {"job": None}
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=path, no_dist=alone)
    job: JobState = state["job"]
    if job.ranks != ranks:
        raise WrittenByOtherRanks(f"checkpoint {path} was written by {job.ranks} rank(s) and this job runs {ranks}: "
                                  "each rank's data position is its own share's. Resume with the same number of "
                                  "ranks, or start a new --checkpoint-dir")
    entries: dict[str, Any] = {f"rank{rank}": None for rank in which}
    with _single_process_quiet():
        dcp.load(entries, checkpoint_id=path, no_dist=alone)
    return job, {rank: entries[f"rank{rank}"] for rank in which}


def _bytes_needed(metadata: Any) -> dict[str, int]:
    """Each data file the metadata points into, and the size it must have at least."""
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    return needed


def _short(exc: Exception) -> str:
    """The error's class and first line, its unprintable characters as ``?``: an unpickler's error on a damaged
    file quotes the file's bytes, which would reach the job's log raw."""
    text = str(exc).strip().splitlines()
    first = "".join(char if char.isprintable() else "?" for char in text[0][:160]) if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _move_aside(path: Path) -> Path:
    """``step_XXXXXXXX`` renamed to ``step_XXXXXXXX.damaged`` (``.damaged-2``... when that name is taken)."""
    aside = path.with_name(f"{path.name}.damaged")
    count = 1
    while aside.exists():
        count += 1
        aside = path.with_name(f"{path.name}.damaged-{count}")
    path.rename(aside)
    return aside


def _delete(path: Path) -> None:
    hidden = path.with_name(f".{path.name}.removing")
    path.rename(hidden)
    shutil.rmtree(hidden, ignore_errors=True)


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
