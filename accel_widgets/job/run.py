"""The real job: a burst's own loop under ``torchrun``, for as long as asked, with checkpoints, resume, evaluation
and logs.

An exported script is the chosen config plus a call to :func:`train`. Every step is the code a burst runs
(:func:`~accel_widgets.engine.training.build_loop` and the knob owners): the same seed, weights, data order and
step, so the job's losses equal the burst's, loss for loss. What a job adds happens between steps, in the loop's
hooks (:class:`Job`), which a burst does not have: a log line every ``--log-every`` steps, an evaluation every
``--eval-every``, a checkpoint every ``--checkpoint-every`` steps or ``--checkpoint-minutes`` minutes, and a stop
when SIGTERM comes. ``--resume`` carries on from the newest checkpoint exactly: the steps after it have the losses
an uninterrupted job has.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from ..data.cache import cache_root
from ..engine.group import joined
from ..engine.process import keep_freed_memory, torch_threads
from ..engine.training import TrainingLoop, build_eval_loader, build_loop
from ..inputs.device import probe_device
from ..inputs.workload import Workload, load_workload
from ..knobs import global_flags, memory, parallel
from ..knobs.config import Config
from ..knobs.plan import Plan, resolve
from ..knobs.rules import ConfigError
from .checkpoint import Checkpoints, JobState, RankState, restore_rng, rng_states
from .log import JobLog
from .options import JobOptions
from .signals import StopRequest, stop_requested_by

#: A collective without a partner fails after this long: a job's ranks may wait on each other's data, evaluation
#: or checkpoint writes far longer than a burst's.
COLLECTIVE_TIMEOUT_S = 600.0


def train(workload_ref: str, config: Config, options: JobOptions | int) -> list[float]:
    """Train ``workload_ref`` under ``config`` in this (torchrun) process as ``options`` say (an int: that many
    steps and nothing else); returns the losses of the steps this process trained.

    Rank 0 logs (:mod:`~accel_widgets.job.log`); a SIGTERM ends the job at the next step boundary with a
    checkpoint, and the call returns normally, so the script exits 0. ``--resume`` carries on from the newest
    checkpoint that reads through, naming the damaged ones it moved aside; with checkpoints and none usable it
    raises :class:`~accel_widgets.job.checkpoint.NoUsableCheckpoint` (the exported script exits with its message).
    """
    options = options if isinstance(options, JobOptions) else JobOptions(steps=options)
    keep_freed_memory()  # as a burst's rank does, so the job's steps run as the burst measured them
    workload = load_workload(workload_ref)
    plan = _plan(config, workload)
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if plan.device.has_cuda else torch.device("cpu")
    with memory.allocator(plan.config, plan.device.kind):  # set before set_device initialises CUDA
        if device.type == "cuda":
            torch.cuda.set_device(device)
        checkpoints = (Checkpoints(options.checkpoint_dir, keep=options.keep_checkpoints, rank=rank)
                       if options.checkpoint_dir is not None else None)
        with (
            stop_requested_by(signal.SIGTERM) as stop,
            torch_threads(plan.threads_per_rank),
            global_flags(plan.config),
            joined(plan.group, rank, device, rendezvous=None, timeout_s=COLLECTIVE_TIMEOUT_S),
        ):
            return _run_job(workload, plan, device, rank, options, checkpoints, stop)


def _run_job(workload: Workload, plan: Plan, device: torch.device, rank: int, options: JobOptions,
             checkpoints: Checkpoints | None, stop: StopRequest) -> list[float]:
    """The job in its process group: resumed as asked, trained, its log closed; returns this process's losses. Its
    model, loop and loaders are freed when it returns, while the group is still there (:func:`joined` collects
    them before it leaves)."""
    newest, damaged = (checkpoints.resume_point(plan.ranks) if options.resume and checkpoints is not None
                       else (None, []))
    saved = checkpoints.read_states(newest, plan.ranks) if checkpoints is not None and newest is not None else None
    log = JobLog(rank, options.log_path, options.tensorboard, first_step=saved[0].step if saved else 0)
    for note in damaged:
        log.note(note)
    try:
        loop, raw = build_loop(workload, plan, device, rank, cache_dir=str(cache_root()), emit=log,
                               clock_origin=time.perf_counter(), resume_at=saved[1].data if saved else None)
        if checkpoints is not None and newest is not None and saved is not None:
            _resume(loop, raw, checkpoints, newest, *saved)
            log.note(f"resumed from {newest} at step {saved[0].step}; data: {loop.batches.resumed}")
        elif options.resume:
            log.note(f"--resume: no checkpoint in {options.checkpoint_dir} yet, starting at step 0")
        job = Job(loop, raw, workload, plan, options, checkpoints, log, stop, log.first_step,
                  build_eval_loader(workload, plan, device, rank))
        loop.hooks, loop.should_stop = job, job.stopping
        remaining = options.steps - job.step
        if remaining > 0:
            first_step_s, _ = loop.warm_up(1)
            loop.measure(remaining - 1, None, first_step_s)
        job.finish()
    finally:
        log.close()
    return log.losses


def _plan(config: Config, workload: Workload) -> Plan:
    """The config resolved for this machine and torchrun's group, refused as a burst would refuse it."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if not parallel.distributed(config) and world_size != 1:
        raise ConfigError(f"this script's config runs one process ({config.label()}): run it with torchrun "
                          f"--nproc-per-node 1, not {world_size} processes")
    plan = resolve(config, probe_device(), workload, world_size=world_size)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if plan.group is not None and local != parallel.ranks(config) and int(os.environ.get("RANK", 0)) == 0:
        print(f"note: the burst was measured with {parallel.ranks(config)} ranks; this machine runs {local}",
              flush=True)
    return plan


def _resume(loop: TrainingLoop, raw: nn.Module, checkpoints: Checkpoints, path: Path, job: JobState,
            mine: RankState) -> None:
    """The model, optimizer, GradScaler and LR schedule as ``path`` holds them, then every random generator: last,
    so nothing built after draws from them before the first step does."""
    checkpoints.load_training(path, raw, loop.optimizer)
    if (job.scheduler is None) != (loop.scheduler is None):
        raise ValueError(f"checkpoint {path} was written {'with' if job.scheduler is not None else 'without'} an LR "
                         f"schedule and the workload now has {'one' if loop.scheduler is not None else 'none'}: "
                         "resume the job it was written by, or start a new --checkpoint-dir")
    if loop.scheduler is not None:
        loop.scheduler.load_state_dict(job.scheduler)
    if job.scaler is not None:
        loop.mixed_precision.scaler.load_state_dict(job.scaler)
    restore_rng(mine.rng)


class Job:
    """The loop's hooks in a job (:class:`~accel_widgets.engine.training.StepHooks`): what happens between steps.

    After each step: the step counted; at a log step (every ``log_every``, and the last), an evaluation step or a
    checkpoint step, the ranks agree on whether to stop (a SIGTERM on any rank) and whether a checkpoint is overdue
    by the clock, in one all-reduce; with one process that is asked after every step. Then the evaluation, the log
    line and the checkpoint, as due. The steps are numbered from 1; a resumed job counts on from its checkpoint's.
    """

    def __init__(self, loop: TrainingLoop, raw: nn.Module, workload: Workload, plan: Plan, options: JobOptions,
                 checkpoints: Checkpoints | None, log: JobLog, stop: StopRequest, first_step: int,
                 eval_loader: DataLoader | None) -> None:
        self.loop, self.raw, self.workload, self.options = loop, raw, workload, options
        self.checkpoints, self.log, self.stop, self.eval_loader = checkpoints, log, stop, eval_loader
        self.ranks = plan.ranks
        self.step = first_step
        self.stopped_by = ""
        self._saved_step = first_step if first_step else None
        self._started = self._interval_start = time.perf_counter()
        self._last_checkpoint = time.monotonic()
        self._samples = self._tokens = 0
        self._paused_s = 0.0  # evaluation and checkpoints in this log interval: not training time

    def stopping(self) -> bool:
        """The loop's ``should_stop``: true once the ranks agreed to stop."""
        return bool(self.stopped_by)

    def after_step(self, samples: int, tokens: int | None) -> None:
        self.step += 1
        self._samples += samples
        self._tokens += tokens or 0
        options = self.options
        due_log = self.step % options.log_every == 0 or self.step == options.steps
        due_eval = bool(self.eval_loader is not None and options.eval_every and self.step % options.eval_every == 0)
        due_checkpoint = bool(self.checkpoints is not None and options.checkpoint_every
                              and self.step % options.checkpoint_every == 0)
        if not (self.ranks == 1 or due_log or due_eval or due_checkpoint):
            return  # every rank knows the step: no rank asks the others anything between these steps
        stop, overdue = self._agree()
        evaluation = self._evaluate() if due_eval else None
        if due_log or evaluation is not None:
            self._log_line(evaluation)
        if stop:
            self.stopped_by = stop
        if self.checkpoints is not None and (due_checkpoint or overdue or stop):
            self._checkpoint()

    def finish(self) -> None:
        """After the last step: the stop said, or the final checkpoint and the model saved."""
        if self.stopped_by:
            where = f"checkpoint {self._saved_path()}" if self.checkpoints is not None else "no --checkpoint-dir"
            self.log.note(f"stopped by {self.stopped_by} after step {self.step} ({where}): restart with --resume")
            return
        if self.checkpoints is not None and self._saved_step != self.step:
            self._checkpoint()
        if self.options.save_model is not None:
            self._save_model(self.options.save_model)

    def _agree(self) -> tuple[str, bool]:
        """Whether to stop (the signal's name, when any rank got one) and whether the clock calls for a checkpoint,
        the same answer on every rank."""
        minutes = self.options.checkpoint_minutes
        overdue = minutes is not None and time.monotonic() - self._last_checkpoint >= 60 * minutes
        if self.ranks == 1:
            return self.stop.received, overdue
        flags = torch.tensor([float(bool(self.stop.received)), float(overdue)], device=_collective_device())
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, overdue_anywhere = (bool(value) for value in flags.tolist())
        return (self.stop.received or "a signal on another rank") if stop else "", overdue_anywhere

    def _evaluate(self) -> dict[str, float]:
        """Every metric averaged over the whole evaluation set (each rank evaluates its share)."""
        began = time.perf_counter()
        assert self.eval_loader is not None
        totals, samples = self.loop.evaluate(self.raw, self.eval_loader, self.workload.eval_fn)
        shares: list[Any] = [(totals, samples)]
        if self.ranks > 1:
            shares = [None] * self.ranks
            dist.all_gather_object(shares, (totals, samples))
        count = sum(share[1] for share in shares)
        names = dict.fromkeys(name for share in shares for name in share[0])
        self._paused_s += time.perf_counter() - began
        return {name: sum(share[0].get(name, 0.0) for share in shares) / count for name in names} if count else {}

    def _log_line(self, evaluation: dict[str, float] | None) -> None:
        now = time.perf_counter()
        seconds = max(now - self._interval_start - self._paused_s, 1e-9)
        losses = self.loop.losses()
        record: dict[str, Any] = {"step": self.step, "loss": losses[-1] if losses else None,
                                  "lr": _learning_rate(self.loop.optimizer),
                                  "samples_per_s": round(self._samples * self.ranks / seconds, 3)}
        tokens = self._tokens or self._samples * (self.workload.tokens_per_sample or 0)  # real tokens, when counted
        if tokens:
            record["tokens_per_s"] = round(tokens * self.ranks / seconds, 3)
        record["elapsed_s"] = round(now - self._started, 3)
        if evaluation is not None:
            record["eval"] = evaluation
        self.log.line(record)
        self._interval_start, self._samples, self._tokens, self._paused_s = now, 0, 0, 0.0

    def _checkpoint(self) -> None:
        assert self.checkpoints is not None
        began = time.perf_counter()
        scaler = self.loop.mixed_precision.scaler
        job = JobState(self.step, self.ranks, scaler.state_dict() if scaler.is_enabled() else None,
                       self.loop.scheduler.state_dict() if self.loop.scheduler is not None else None)
        mine = RankState(self.loop.batches.position(), rng_states())
        path = self.checkpoints.save(self.step, self.raw, self.loop.optimizer, job, mine)
        self._saved_step, self._last_checkpoint = self.step, time.monotonic()
        seconds = time.perf_counter() - began
        self._paused_s += seconds
        self.log.note(f"checkpoint: step {self.step} -> {path} ({seconds:.2f} s)")

    def _saved_path(self) -> Path | None:
        return self.checkpoints.newest() if self.checkpoints is not None else None

    def _save_model(self, path: str) -> None:
        """The trained model's ``state_dict`` (the user's own module's keys: no DDP or compile wrapper), written by
        rank 0 to a temporary file and renamed, so ``path`` never holds half a model."""
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            torch.save(self.raw.state_dict(), temporary)
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        self.log.note(f"model saved: {target}")


def _learning_rate(optimizer: torch.optim.Optimizer) -> float:
    value = optimizer.param_groups[0]["lr"]
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _collective_device() -> torch.device:
    """Where a small tensor must be for the group's backend: the rank's GPU under NCCL, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
