"""What a job says while it runs: a JSON line per log interval, TensorBoard scalars, notes, and every loss at the end.

Only rank 0 speaks. Each log line is one JSON object (``step``, ``loss``, ``lr``, ``samples_per_s``,
``tokens_per_s`` when batches count tokens, ``elapsed_s``, ``eval`` when the job evaluated at that step), printed
and appended to the log file, flushed at once so a job killed a second later has its log. Notes (resumed, a
checkpoint written, a stop) are plain text on stdout; the last line is ``{"losses": [...], "first_step": n}``,
every loss this process trained, the first of them the loss of step ``n + 1``.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

from ..engine.events import RankLosses, WorkerEvent


class JobLog:
    """Rank 0's voice (the other ranks' calls do nothing); also the loop's ``emit``, for the final losses."""

    def __init__(self, rank: int, path: str, tensorboard_dir: str | None, first_step: int = 0) -> None:
        self.rank, self.first_step, self.losses = rank, first_step, []
        self._file = self._writer = None
        if rank != 0:
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- open for the job's life, closed by close()
        if tensorboard_dir is None:
            return
        if importlib.util.find_spec("tensorboard") is None:
            self.note(f"--tensorboard {tensorboard_dir}: the tensorboard package is not installed (pip install "
                      "tensorboard); the JSON lines are written as usual")
            return
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(tensorboard_dir)

    def __call__(self, event: WorkerEvent) -> None:
        """The loop's events: at the end, every loss this process trained."""
        if isinstance(event, RankLosses):
            self.losses = list(event.values)

    def line(self, record: dict[str, Any]) -> None:
        """One log interval: printed, appended to the log file and, with TensorBoard, its numbers as scalars."""
        if self._file is None:
            return
        text = json.dumps(record)
        print(text, flush=True)
        self._file.write(text + "\n")
        self._file.flush()
        if self._writer is not None:
            step = int(record["step"])
            for name, value in _scalars(record):
                self._writer.add_scalar(name, value, step)
            self._writer.flush()

    def note(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def close(self) -> None:
        """The final line (every loss of this process), then the files closed."""
        if self.rank == 0:
            print(json.dumps({"losses": self.losses, "first_step": self.first_step}), flush=True)
        if self._writer is not None:
            self._writer.close()
        if self._file is not None:
            self._file.close()


def _scalars(record: dict[str, Any]) -> list[tuple[str, float]]:
    """TensorBoard's tags: ``train/loss``, ``train/lr``, ... and ``eval/<metric>``; unknown numbers left out."""
    found = [(f"train/{key}", record[key]) for key in ("loss", "lr", "samples_per_s", "tokens_per_s")
             if isinstance(record.get(key), (int, float))]
    found += [(f"eval/{name}", value) for name, value in (record.get("eval") or {}).items()]
    return [(name, float(value)) for name, value in found if math.isfinite(float(value))]
