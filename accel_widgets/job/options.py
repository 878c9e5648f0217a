"""What a job is asked to do besides its config: how long, when to log, evaluate and checkpoint, where to write.

:class:`JobOptions` is the one place the job's flags are declared: an exported script's ``argparse`` lines are
written from its fields (:func:`argparse_lines`), so the script, :func:`~accel_widgets.job.run.train` and the docs
name the same flags.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


def _flag(help_text: str) -> dict[str, str]:
    return {"help": help_text}


@dataclass(frozen=True)
class JobOptions:
    """A job's flags (``--steps``, ``--log-every``, ...), checked when made: a bad flag fails before anything trains.

    ``steps`` counts every optimizer step of the job, those a resumed job took before included. Checkpoints (the
    model, optimizer, GradScaler, LR schedule, data position and every RNG) go to ``checkpoint_dir`` every
    ``checkpoint_every`` steps and/or ``checkpoint_minutes`` minutes, at the end and when the job is told to stop
    (SIGTERM); the newest ``keep_checkpoints`` stay. ``log_file`` defaults to ``log.jsonl`` in ``checkpoint_dir``,
    else next to the script.
    """

    steps: int = field(default=1000, metadata=_flag("optimizer steps to train in all (a resumed job counts those "
                                                    "it took before)"))
    log_every: int = field(default=10, metadata=_flag("log a JSON line every K steps"))
    checkpoint_dir: str | None = field(default=None, metadata=_flag("where checkpoints go (step_XXXXXXXX folders)"))
    checkpoint_every: int | None = field(default=None, metadata=_flag("checkpoint every K steps"))
    checkpoint_minutes: float | None = field(default=None, metadata=_flag("checkpoint every M minutes"))
    keep_checkpoints: int = field(default=3, metadata=_flag("keep the newest K checkpoints"))
    resume: bool = field(default=False, metadata=_flag("carry on from the newest checkpoint in --checkpoint-dir "
                                                       "(start afresh when there is none)"))
    eval_every: int | None = field(default=None, metadata=_flag("evaluate the workload's eval_dataset every N steps"))
    log_file: str | None = field(default=None, metadata=_flag("the JSON lines log (default: log.jsonl in "
                                                              "--checkpoint-dir, else next to the script)"))
    tensorboard: str | None = field(default=None, metadata=_flag("also write TensorBoard scalars to this folder"))
    save_model: str | None = field(default=None, metadata=_flag("save the final model's state_dict here"))

    def __post_init__(self) -> None:
        for name in ("steps", "log_every", "keep_checkpoints"):
            _whole(name, getattr(self, name), optional=False)
        for name in ("checkpoint_every", "eval_every"):
            _whole(name, getattr(self, name), optional=True)
        minutes = self.checkpoint_minutes
        if minutes is not None and not (isinstance(minutes, (int, float)) and math.isfinite(minutes) and minutes > 0):
            raise ValueError(f"--checkpoint-minutes {minutes!r}: use a number of minutes > 0")
        if self.checkpoint_dir is None:
            asked = [flag for flag, value in (("--checkpoint-every", self.checkpoint_every),
                                              ("--checkpoint-minutes", self.checkpoint_minutes),
                                              ("--resume", self.resume or None)) if value is not None]
            if asked:
                raise ValueError(f"{' and '.join(asked)} need(s) --checkpoint-dir DIR: where the checkpoints go")

    @property
    def log_path(self) -> str:
        """Where the JSON lines go: ``--log-file``, else ``log.jsonl`` in the checkpoint folder, else next to the
        script (``train.py`` -> ``train.log.jsonl``)."""
        if self.log_file is not None:
            return self.log_file
        if self.checkpoint_dir is not None:
            return os.path.join(self.checkpoint_dir, "log.jsonl")
        return os.path.splitext(sys.argv[0] or "job")[0] + ".log.jsonl"


def _whole(name: str, value: Any, *, optional: bool) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--{name.replace('_', '-')} {value!r}: use a whole number >= 1")


def argparse_lines(indent: str = "    ") -> list[str]:
    """``parser.add_argument(...)`` for every field of :class:`JobOptions`: the flags of an exported script."""
    lines = []
    for option in fields(JobOptions):
        flag = "--" + option.name.replace("_", "-")
        help_text = option.metadata["help"]
        default = option.default if option.default is not MISSING else None
        if isinstance(default, bool):
            lines.append(f"{indent}parser.add_argument({flag!r}, action='store_true', help={help_text!r})")
            continue
        kind = {"int": "int", "float": "float"}.get(str(option.type).split(" ")[0], "str")
        lines.append(f"{indent}parser.add_argument({flag!r}, type={kind}, default={default!r}, help={help_text!r})")
    return lines
