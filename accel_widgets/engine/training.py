"""The training step every burst runs, with each knob applied by the module that owns it.

This module runs inside a worker process (or, for the explicit in-process fallback, inside the
caller). Read :meth:`TrainingLoop._step` top to bottom: it is an ordinary PyTorch training step that
calls the knob owners (:mod:`accel_widgets.knobs`) at fixed points -- the batch's copy, the gradient
sync, autocast, backward, the optimizer step, zero_grad, the loss read -- each with its one-line why.
Timing is the engine's own: steps tile the window on the clock of whatever does the work.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader, IterableDataset

from ..data.cache import CacheInfo
from ..data.keyed import DataRandomness, map_randomness
from ..data.resume import DataPosition, ResumableSampler
from ..data.streams import StreamReading, stream_randomness
from ..inputs.workload import Workload, callable_name
from ..knobs import (
    CodePaths,
    attention,
    batch,
    compiling,
    data,
    memory,
    overhead,
    parallel,
    precision,
    prepare_model,
    system,
)
from ..knobs.base import Part
from ..knobs.compiling import CompileReport
from ..knobs.config import Config
from ..knobs.parts import ON_DEVICE_BATCHES
from ..knobs.plan import Plan
from ..metrics.flops import count_training_flops
from ..results.burst import OperatorTime, ProfileCapture, RankSummary, StepRecord
from .events import Emit, Phase, RankLosses
from .timing import Clock, CudaTimeline, HostTimeline, StepClock, StepTiming


class BatchFormatError(TypeError):
    """A collated batch is not an ``(input, target)`` pair."""


# -- building blocks ------------------------------------------------------------------------------
class EpochIterator:
    """Endless batches: a new epoch (and sampler epoch) whenever the loader is exhausted.

    A stream (``IterableDataset``) has no length: its epoch ends wherever the stream does, and a burst bound
    by steps or seconds starts it again. An epoch without a single batch would restart forever, so it is an
    error (map-style data is checked for a batch per rank when the loader is built; a stream can only be read).

    :meth:`position` says where it is between two steps, for a job's checkpoint; ``resume_at`` starts it there
    again (:mod:`accel_widgets.data.resume`): the epoch's order drawn as it was and the batches already taken
    skipped at the sampler, without reading them; a stream, which has no sampler, is read through them
    (``resumed`` says which was done). Items read by keys (:mod:`accel_widgets.data.keyed`) learn their epoch from
    the sampler, or the stream, each epoch.
    """

    def __init__(self, loader: DataLoader, resume_at: DataPosition | None = None) -> None:
        self._loader, self._epoch, self._taken = loader, 0, 0
        self._sampler = next((s for s in (loader.sampler, loader.batch_sampler) if isinstance(s, ResumableSampler)),
                             None)
        self.resumed = ""
        if resume_at is not None:
            self._epoch, self._taken = resume_at.epoch, resume_at.batches
            self._set_epoch()
            if self._sampler is not None and resume_at.start is not None:
                self._sampler.resume(resume_at.start, resume_at.batches)
                self.resumed = (f"epoch {resume_at.epoch}, its first {resume_at.batches} batches skipped at the "
                                "sampler (not read)")
        self._iterator = iter(loader)
        if resume_at is not None and not self.resumed:
            for _ in range(resume_at.batches):
                next(self._iterator)
            self.resumed = (f"epoch {resume_at.epoch}: a stream has no sampler to skip in, so its first "
                            f"{resume_at.batches} batches were read through")

    @property
    def loader(self) -> DataLoader:
        return self._loader

    def position(self) -> DataPosition:
        """Where the next batch comes from: this epoch, the batches taken in it, and how its order was drawn."""
        start = self._sampler.epoch_start if self._sampler is not None else None
        return DataPosition(self._epoch, self._taken, start)

    def _set_epoch(self) -> None:
        """The epoch handed to the sampler (a DistributedSampler draws each epoch's order from its seed and the
        epoch; keys carry it to the items) and to a stream that keys its items."""
        for reader in (self._sampler or self._loader.sampler, self._loader.dataset):
            set_epoch = getattr(reader, "set_epoch", None)
            if set_epoch is not None:
                set_epoch(self._epoch)

    def close(self) -> None:
        """End the loader's worker processes now, not whenever the iterator is collected: a held rank builds a new
        loader for its next window, and two sets of workers must never compete for the cores."""
        for iterator in (self._iterator, getattr(self._loader, "_iterator", None)):  # persistent workers: both
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()

    def __next__(self) -> Any:
        try:
            batch = next(self._iterator)
        except StopIteration:
            self._epoch, self._taken = self._epoch + 1, 0
            self._set_epoch()
            self._iterator = iter(self._loader)
            try:
                batch = next(self._iterator)
            except StopIteration:
                raise ValueError(
                    "the DataLoader yielded no batch in a whole epoch: this rank's share of the dataset (for a stream, "
                    f"each loader worker's share) holds fewer items than one batch of {self._loader.batch_size}, and "
                    "batches are kept full-sized. Use a smaller batch_size, fewer loader workers or more data"
                ) from None
        self._taken += 1
        return batch


@dataclass(frozen=True)
class OnDevice:
    """A batch already on the device, with the real tokens its host copy held: what a data-free burst trains on."""

    batch: Any
    tokens: int


class OnDeviceBatches:
    """The batches of a data-free headspace burst (:mod:`accel_widgets.knobs.parts`): the first
    ``ON_DEVICE_BATCHES`` the loader yields, copied to the device once and cycled, so the measured steps wait on no
    loader and copy nothing. The loader's workers are ended once those are read."""

    def __init__(self, batches: EpochIterator, copy: Callable[[Any], Any]) -> None:
        self._source = batches
        try:
            self._held = [OnDevice(copy(raw), real_tokens(raw) or 0)
                          for raw in (next(batches) for _ in range(ON_DEVICE_BATCHES))]
        finally:
            batches.close()
        self._next = 0

    @property
    def loader(self) -> DataLoader:
        return self._source.loader

    def position(self) -> DataPosition:
        return self._source.position()

    def close(self) -> None:
        """The loader's workers ended when the batches were read."""

    def __next__(self) -> OnDevice:
        held = self._held[self._next % len(self._held)]
        self._next += 1
        return held


_PR_SET_PDEATHSIG = 1  # prctl(2)


class DieWithRank:
    """``worker_init_fn`` of a rank's DataLoader workers: each dies with the rank, then runs the user's own.

    torch's workers poll ``os.getppid()`` against the parent they saw at start; a worker forked just as its
    rank was killed (a teardown SIGKILL) sees init as its parent from the start and waits for work forever,
    holding the caller's stdout. So the kernel is asked to SIGKILL the worker when its parent goes, and a
    worker whose rank is already gone exits at once.
    """

    def __init__(self, rank_pid: int, user_init: Callable[[int], None] | None) -> None:
        self.rank_pid, self.user_init = rank_pid, user_init

    def __call__(self, worker_id: int) -> None:
        if sys.platform == "linux":
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.rank_pid:
            os._exit(1)
        if self.user_init is not None:
            self.user_init(worker_id)


def split_batch(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    raise BatchFormatError(
        f"each dataset item must be an (input, target) pair or a dict of tensors; a collated batch was a "
        f"{type(batch).__name__}" + (f" of {len(batch)} elements" if isinstance(batch, (list, tuple)) else "")
        + ". Return (x, y) from __getitem__, pass a collate_fn that builds (inputs, targets), or a Workload step"
    )


def model_loss(output: Any) -> torch.Tensor:
    """The loss a model computed itself (Hugging Face models do when the batch holds labels)."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise BatchFormatError(
            f"the model returned a {type(output).__name__} without a loss, and the workload has no loss_fn: "
            "give the batch 'labels' (Hugging Face models then compute output.loss), or pass "
            "loss_fn=lambda output, batch: ..., or step=lambda model, batch: ..."
        )
    return loss


def step_loss(returned: Any, step: Callable[..., Any]) -> torch.Tensor:
    """The loss a workload's ``step`` returned, in the shapes training code returns it: the tensor, ``(loss,
    logs)``, ``{"loss": loss, ...}`` or an object with ``.loss`` (a Hugging Face output). Anything else fails
    at the first step, naming the step and what to return."""
    if isinstance(returned, torch.Tensor):
        loss: Any = returned
    elif isinstance(returned, (tuple, list)):
        loss = returned[0] if returned else None
    elif isinstance(returned, Mapping):
        loss = returned.get("loss")
    else:
        loss = getattr(returned, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    what = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
            else _shape_of(returned))
    raise BatchFormatError(
        f"Workload.step={callable_name(step)} returned {what}: return the loss as a one-element tensor (e.g. "
        "loss.mean()), a (loss, logs) tuple or a dict with a 'loss' tensor"
    )


def _shape_of(value: Any) -> str:
    """``a tuple of (Tensor, dict)``, ``a dict with keys 'logits'``, ``None``: what a step returned, in a message."""
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of ({', '.join(type(v).__name__ for v in value)})"
    if isinstance(value, Mapping):
        return f"a dict with keys {', '.join(map(repr, value)) or 'none'} (no 'loss' tensor)"
    return f"a {type(value).__name__}"


def eval_metrics(returned: Any, eval_fn: Callable[..., Any] | None) -> dict[str, float]:
    """An evaluation batch's metrics by name: a loss tensor is ``{"loss": ...}``, a dict keeps its names; every value
    a number or a one-element tensor. Anything else fails, naming ``eval_fn`` and what to return."""
    values = returned if isinstance(returned, Mapping) else {"loss": returned}
    metrics = {}
    for name, value in values.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number or (isinstance(value, torch.Tensor) and value.numel() == 1):
            metrics[str(name)] = float(value)
        else:
            who = f"Workload.eval_fn={callable_name(eval_fn)}" if eval_fn is not None else "the training loss"
            raise BatchFormatError(f"{who} gave {name!r} as {_shape_of(value)}: return a loss (a one-element tensor) "
                                   "or a dict of numbers or one-element tensors, e.g. {'loss': loss, 'accuracy': acc}")
    return metrics


def real_tokens(batch: Any) -> int | None:
    """Tokens that are not padding, from the batch's attention mask while it is still on the host."""
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if isinstance(mask, torch.Tensor) and mask.device.type == "cpu":
        return int(mask.sum())
    return None


def batch_length(obj: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(obj, torch.Tensor):
        return int(obj.shape[0]) if obj.dim() else 1
    values = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, (list, tuple)) else ()
    for value in values:
        return batch_length(value)
    raise BatchFormatError(f"cannot tell the batch size of a {type(obj).__name__}")


def call_model(model: nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, Mapping) else model(inputs)


def micro_batch_loss(model: nn.Module, batch: Any, loss_fn: Callable[[Any, Any], torch.Tensor] | None,
                     step_fn: Callable[[nn.Module, Any], Any] | None) -> torch.Tensor:
    """A micro-batch's loss, in the first form the workload gives (see :class:`~accel_widgets.Workload`): its
    ``step``, a dict batch's ``model(**batch)`` (the model's own loss, or ``loss_fn(output, batch)``), or
    ``loss_fn(model(inputs), targets)``."""
    if step_fn is not None:
        return step_loss(step_fn(model, batch), step_fn)
    if isinstance(batch, Mapping):
        output = model(**batch)
        return loss_fn(output, batch) if loss_fn is not None else model_loss(output)
    inputs, targets = split_batch(batch)
    if loss_fn is None:
        return model_loss(call_model(model, inputs))
    return loss_fn(call_model(model, inputs), targets)


def peak_memory_bytes(devices: list[torch.device]) -> int:
    """The allocator's peak on the busiest of the rank's GPUs (DataParallel's replicas included); on a CPU
    the process's peak RSS."""
    if devices[0].type == "cuda":
        return max(int(torch.cuda.max_memory_allocated(device)) for device in devices)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def peak_reserved_bytes(devices: list[torch.device]) -> int | None:
    """The CUDA caching allocator's peak of reserved memory (what it held from the driver, allocated or not) on the
    busiest of the rank's GPUs; None on a CPU, which has no such allocator."""
    if devices[0].type != "cuda":
        return None
    return max(int(torch.cuda.max_memory_reserved(device)) for device in devices)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard, else the tensor. No DTensor exists before its module is
    imported (FSDP imports it), so a rank that never sharded never pays that import: half a second of every start."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor.DTensor) else tensor


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of training state this rank holds: its parameters, a gradient for each trainable one (they all exist
    from backward to the optimizer step), and the optimizer's state (AdamW: two moments per parameter).

    Counted from the tensors themselves, each storage once; under FSDP a parameter is a DTensor and only this rank's
    shard counts, so the number is what sharding divides by the ranks. Unlike a process's RSS it holds no allocator
    caching and no heap fragmentation: on a CPU, where glibc keeps freed blocks, it is how FSDP's saving shows.
    """
    seen: dict[int, int] = {}

    def add(tensor: torch.Tensor) -> None:
        local = _local(tensor)
        seen[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()

    gradients = 0
    for parameter in model.parameters():
        add(parameter)
        if parameter.requires_grad:
            local = _local(parameter)
            gradients += local.numel() * local.element_size()
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:  # a step count is a scalar
                add(value)
    return sum(seen.values()) + gradients


# -- the loop -------------------------------------------------------------------------------------
class StepHooks(Protocol):
    """What a real job does at each step boundary (:mod:`accel_widgets.job`: count, log, evaluate, checkpoint,
    notice a stop). A burst has none: its steps run as they are measured."""

    def after_step(self, samples: int, tokens: int | None) -> None:
        """Called after each optimizer step with the samples it took (and the real tokens, when counted)."""


@dataclass(frozen=True)
class MeasuredWindow:
    """What the steady-state window measured on one rank, read before anything runs after it."""

    samples: int
    steps: int
    seconds: float
    first_step_s: float
    peak_memory_bytes: int
    tokens: int | None = None  # real (unpadded) tokens, when batches carry an attention mask
    peak_reserved_bytes: int | None = None  # CUDA only: the caching allocator's reserved peak
    model_state_bytes: int | None = None  # parameters, gradients and optimizer state this rank holds
    allocator_expandable: bool | None = None  # CUDA only: the allocator's segments expandable, read from it


@dataclass
class TrainingLoop:
    """Runs warmup plus measured steps of one rank and streams a record per step through ``emit``.

    ``set_phase`` tells the launcher what the rank is doing (waiting for data, in a step), so a burst
    that hangs can be reported as "stuck in the loader" rather than as a generic timeout.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    batches: EpochIterator | OnDeviceBatches
    config: Config
    device: torch.device
    rank: int
    emit: Emit
    step_clock: StepClock
    clock: Clock = time.perf_counter
    should_stop: Callable[[], bool] = lambda: False
    set_phase: Callable[[Phase], None] = lambda phase: None
    step_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None
    max_grad_norm: float | None = None
    random_data: DataRandomness | None = None  # whether items draw randomly, and from generators their keys set
    cache: CacheInfo | None = None  # what the data cache did, when the config caches the data
    scheduler: Any = None  # the workload's learning-rate schedule (torch.optim.lr_scheduler.LRScheduler), if any
    hooks: StepHooks | None = None  # a job's (None in a burst)
    compiled: str = ""  # what torch.compile compiled, in words ("" when nothing)
    freed: Part | None = None  # the part of the step a headspace burst makes free (knobs/parts.py), None: none
    mixed_precision: precision.MixedPrecision = field(init=False)
    _pending_losses: list[torch.Tensor] = field(init=False, default_factory=list)
    last_micro_batch: tuple[Any, Any] | None = field(init=False, default=None)
    _losses: list[float] = field(init=False, default_factory=list)
    _tokens: list[int | None] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.mixed_precision = precision.MixedPrecision(self.config, self.device)
        self._next_step = 0
        self._step_samples = 0  # samples of the latest step

    def close(self) -> None:
        """Release what outlives the loop's objects on its own: the loader's worker processes."""
        self.batches.close()

    def flops_by_math(self, raw_model: nn.Module) -> dict[str, float] | None:
        """Training FLOPs per sample by ``"<op class>:<math>"`` ("conv:tf32", "matmul:bf16"), counted on one
        extra micro-batch after measuring (None if uncountable)."""
        if self.last_micro_batch is None:
            return None
        batch = self.last_micro_batch
        try:
            # blocks compiled in place run as the counter sees them, with no recompile; checkpointed ones run once
            with compiling.eager(), memory.forward_once(raw_model):
                flops = count_training_flops(raw_model, lambda model: self._loss(model, batch),
                                             self.mixed_precision.autocast)
        except Exception as exc:  # an op the counter cannot trace must not fail a finished burst
            warnings.warn(f"FLOPs not counted ({type(exc).__name__}: {exc}); MFU unavailable", stacklevel=2)
            return None
        if not flops.total:
            return None
        samples = self._samples_in(batch)
        by_math: dict[str, float] = {}
        for (op_class, dtype), count in flops.by_op.items():
            key = f"{op_class}:{precision.op_math(self.config, self.device.type, op_class, dtype)}"
            by_math[key] = by_math.get(key, 0.0) + count / samples
        return by_math

    def code_paths(self, raw_model: nn.Module) -> CodePaths | None:
        """The code paths the step runs (what a knob needs to act), recorded over one more forward of the last
        micro-batch on the unwrapped, uncompiled model, after measuring; None when that forward fails.

        Training mode, autocast and the pinned attention backend as in the step, so the model takes the same
        branches (an inference fast path would skip scaled_dot_product_attention); nothing is backpropagated.
        """
        if self.last_micro_batch is None:
            return None
        batch = self.last_micro_batch
        try:
            with (compiling.eager(), self.mixed_precision.autocast(), attention.forward_context(self.config),
                  _CallRecorder() as calls):
                self._loss(raw_model, batch)
        except Exception as exc:  # an op the recorder cannot run must not fail a finished burst
            warnings.warn(f"code paths not recorded ({type(exc).__name__}: {exc}); the tuner tries every knob",
                          stacklevel=2)
            return None
        return CodePaths(sdpa="scaled_dot_product_attention" in calls.names,
                         convolution=bool(calls.names & _CONVOLUTIONS), cuda=self.device.type == "cuda")

    def _loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return micro_batch_loss(model, batch, self.loss_fn, self.step_fn)

    def _samples_in(self, batch: Any) -> int:
        if self.step_fn is None and not isinstance(batch, Mapping):
            return batch_length(split_batch(batch)[1])
        return batch_length(batch)

    def profile(self, steps: int, trace_path: str, top: int = 15) -> ProfileCapture:
        """Record ``steps`` more steady-state steps with torch.profiler; their timings are discarded.

        Runs after the measured window, so the profiler's overhead never reaches the burst's numbers, and its
        failure (CUPTI, out of memory while profiling) never takes them away: it comes back as the capture's
        ``error``, with a warning. Under DDP the peers take the profiled steps too, so the steps a profiler
        failure left untaken are taken without it; a profiled step that fails there is raised, since its
        collectives are half done and the peers wait in them.
        """
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        taken, in_step = 0, False
        try:
            with torch.profiler.profile(activities=activities) as profiler:
                for _ in range(steps):
                    in_step = True
                    self._step()
                    in_step, taken = False, taken + 1
                self.step_clock.flush()
            profiler.export_chrome_trace(trace_path)
            averages = sorted(profiler.key_averages(), reverse=True,
                              key=lambda e: e.self_device_time_total + e.self_cpu_time_total)
        except Exception as exc:
            distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
            if in_step and distributed:
                raise
            with contextlib.suppress(OSError):
                os.remove(trace_path)  # a partial trace would read as a capture
            if distributed:
                self.extra_steps(steps - taken)
            text = str(exc).strip()
            message = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
            warnings.warn(f"profiling failed ({message}): the burst's measurement is kept, without a trace",
                          stacklevel=2)
            return ProfileCapture(steps, "", [], error=message)
        operators = [OperatorTime(e.key, int(e.count), e.self_cpu_time_total / 1e3, e.self_device_time_total / 1e3)
                     for e in averages[:top]]
        return ProfileCapture(steps, trace_path, operators)

    def extra_steps(self, steps: int) -> None:
        """Train ``steps`` more steps that are not reported (DDP peers of a profiling rank run these)."""
        for _ in range(steps):
            self._step()
        self.step_clock.flush()

    def _step(self) -> int:
        """One optimizer step over ``grad_accum_steps`` micro-batches; returns the samples it consumed."""
        config, clock = self.config, self.step_clock
        clock.start_step()
        samples, tokens, step_loss = 0, 0, None
        micro_batches = batch.micro_batches(config)
        for micro in range(micro_batches):
            self._phase(Phase.DATA)
            with self._marked(clock.waiting_for_data):
                raw_batch = next(self.batches)
            self._phase(Phase.STEP)
            if isinstance(raw_batch, OnDevice):  # data free: on the device already, its tokens counted on the host
                moved, tokens = raw_batch.batch, tokens + raw_batch.tokens
            else:
                tokens += real_tokens(raw_batch) or 0  # counted on the host copy: no device sync
                with self._marked(clock.copying):
                    moved = data.copy_batch(raw_batch, self.device, config, system.inputs_channels_last(config))
            samples += self._samples_in(moved)
            self.last_micro_batch = moved
            with parallel.gradient_sync(self.model, last_micro_batch=micro == micro_batches - 1,
                                        communication_free=self.freed == "communication"):
                with self.mixed_precision.autocast(), attention.forward_context(config):
                    loss = self._loss(self.model, moved)
                self.mixed_precision.backward(batch.scale_for_accumulation(loss, config))
            detached = compiling.held_loss(loss, config)
            step_loss = detached if step_loss is None else step_loss + detached
        self.mixed_precision.optimizer_step(self.optimizer, self.max_grad_norm)
        if self.scheduler is not None:
            self.scheduler.step()  # once per optimizer step, never per micro-batch
        overhead.zero_grad(self.optimizer, config)
        self._tokens.append(tokens or None)
        self._pending_losses.append(step_loss if micro_batches == 1 else step_loss / micro_batches)
        if overhead.loss_read_due(len(self._pending_losses), config, host_free=self.freed == "host"):
            self._read_losses()
        clock.end_step()
        self._step_samples = samples
        if self.hooks is not None:
            self.hooks.after_step(samples, tokens or None)
        return samples

    def _phase(self, phase: Phase) -> None:
        """What the rank is doing, for a hang's report; a host-free burst says nothing per step (it is work the burst
        adds to the step)."""
        if self.freed != "host":
            self.set_phase(phase)

    def _marked(self, interval: Callable[[], contextlib.AbstractContextManager[None]]
                ) -> contextlib.AbstractContextManager[None]:
        """A part of the step (the data wait, the copy) on the step clock; a host-free burst marks only the step's ends
        (the markers are work the burst adds: on a GPU, events recorded)."""
        return contextlib.nullcontext() if self.freed == "host" else interval()

    def losses(self) -> list[float]:
        """Every step's loss so far, read back to the host now (a host sync on a GPU: a job's log asks at its
        interval, as a hand-written loop's ``loss.item()`` would)."""
        self._read_losses()
        return list(self._losses)

    def evaluate(self, model: nn.Module, loader: DataLoader,
                 eval_fn: Callable[[nn.Module, Any], Any] | None) -> tuple[dict[str, float], int]:
        """This rank's share of an evaluation: each metric summed over its batches weighted by their samples, and
        the samples (a job adds them up over the ranks).

        The batches reach the device as the step's do, under the step's autocast and attention kernel, without
        gradients and in ``model.eval()`` (dropout off, batch norm's running statistics used), and the model is put
        back in the mode it was in. ``eval_fn(model, batch)`` returns a loss or a dict of metrics; without one, the
        training loss is the metric.
        """
        config, was_training = self.config, model.training
        totals: dict[str, float] = {}
        samples = 0
        model.eval()
        try:
            with torch.no_grad(), self.mixed_precision.autocast(), attention.forward_context(config):
                for raw_batch in loader:
                    moved = data.copy_batch(raw_batch, self.device, config, system.inputs_channels_last(config))
                    count = self._samples_in(moved)
                    returned = eval_fn(model, moved) if eval_fn is not None else self._loss(model, moved)
                    for name, value in eval_metrics(returned, eval_fn).items():
                        totals[name] = totals.get(name, 0.0) + value * count
                    samples += count
        finally:
            model.train(was_training)
        return totals, samples

    def _read_losses(self) -> None:
        """The loop's one deliberate host sync (the sync-debug mode allows this one and no other)."""
        if self._pending_losses:
            # Lifts the sync-debug mode: this sync is the one the config asked for.
            with _cuda_sync_debug_mode(self.device, "default"):
                if len(self._pending_losses) == 1:  # sync_every=1: what a hand-written loop's .item() costs
                    self._losses.append(self._pending_losses[0].item())
                else:
                    self._losses.extend(torch.stack(self._pending_losses).float().tolist())
            self._pending_losses.clear()

    def _emit_completed(self, timings: list[StepTiming], warmup: bool, samples: int) -> None:
        for timing in timings:
            step = self._next_step
            loss = self._losses[step] if step < len(self._losses) else None
            record = StepRecord(self.rank, step, timing.t, timing.data_s, timing.h2d_s, timing.compute_s,
                                timing.total_s, samples, loss, warmup, self._tokens[step])
            self.emit(record)
            self._next_step += 1

    @contextlib.contextmanager
    def _reported_on_failure(self, *, warmup: bool) -> Iterator[None]:
        """A step that raises loses no record of the steps before it the timeline has reached: looked at
        once more without waiting (a sync could raise again, or hang on a broken device)."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self._emit_completed(self.step_clock.reached(), warmup, self._step_samples)
            raise

    def _first_step(self) -> int:
        try:
            return self._step()
        except Exception as exc:
            compile_error = compiling.first_step_error(exc, self.config)
            if compile_error is not None:
                raise compile_error from exc
            raise

    def scaler_skipped_steps(self) -> int | None:
        """Optimizer steps GradScaler skipped for inf/NaN gradients (fp16 only), read once after measuring."""
        return self.mixed_precision.skipped_steps(self._next_step)

    def warm_up(self, warmup_steps: int) -> tuple[float, float]:
        """Run the unmeasured steps; returns ``(first step seconds, last warm-up step seconds)``.

        Both are host times taken after a sync, so on a GPU they include the work the host had only
        queued: the first is what compiling and one-off setup cost, the second estimates a steady step.
        """
        start = self.clock()
        samples = self._first_step()
        self.step_clock.synchronize()
        first_step_s = last_s = self.clock() - start
        self._emit_completed(self.step_clock.completed(), True, samples)
        with self._reported_on_failure(warmup=True):
            for _ in range(max(0, warmup_steps - 1)):
                begin = self.clock()
                samples = self._step()
                self.step_clock.synchronize()
                last_s = self.clock() - begin
                self._emit_completed(self.step_clock.completed(), True, samples)
        self._emit_completed(self.step_clock.flush(), True, samples)
        system.release_cached_memory(self.config, self.device)
        if self.device.type == "cuda":
            # The peak then covers the steady-state window only, never compilation or warm-up.
            for device in parallel.devices_used(self.config, self.device):
                torch.cuda.reset_peak_memory_stats(device)
        return first_step_s, last_s

    def measure(self, steps: int | None, seconds: float | None, first_step_s: float,
                sync_debug: bool = False) -> MeasuredWindow:
        """Run the measured window: ``steps`` steps, or until ``seconds`` have passed on this rank's clock.

        With ``sync_debug`` on a GPU, any host-device sync inside a measured step other than the loss
        read the ``sync_every`` knob asks for raises, naming the line that synced.
        """
        measured_samples, measured_steps, samples = 0, 0, 0
        self.step_clock.restart()
        window_start = self.clock()
        with (
            _cuda_sync_debug_mode(self.device, "error" if sync_debug else None),
            self._reported_on_failure(warmup=False),
        ):
            while not self.should_stop():
                if steps is not None and measured_steps >= steps:
                    break
                if seconds is not None and self.clock() - window_start >= seconds:
                    break
                samples = self._step()
                measured_samples += samples
                measured_steps += 1
                self._emit_completed(self.step_clock.completed(), False, samples)
        self._read_losses()
        timings = self.step_clock.flush()
        # The window ends where the last measured step did, not after the loss read-back and the flush.
        last_end = self.step_clock.last_end
        window_s = last_end - window_start if measured_steps and last_end is not None else 0.0
        devices = parallel.devices_used(self.config, self.device)
        peak, reserved = peak_memory_bytes(devices), peak_reserved_bytes(devices)
        self._emit_completed(timings, False, samples)
        self.emit(RankLosses(self.rank, list(self._losses)))
        window_tokens = self._tokens[len(self._tokens) - measured_steps:] if measured_steps else []
        tokens = sum(t for t in window_tokens if t) if any(window_tokens) else None
        return MeasuredWindow(measured_samples, measured_steps, window_s, first_step_s, peak, tokens, reserved,
                              model_state_bytes(self.model, self.optimizer), memory.segments_expandable(devices))


_CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                           "convolution", "conv_tbc"})


class _CallRecorder(TorchFunctionMode):
    """Notes the name of every torch function called while it is active (then calls it unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def _cuda_sync_debug_mode(device: torch.device, mode: str | None) -> contextlib.AbstractContextManager[None]:
    """torch's CUDA sync-debug mode set to ``mode`` for the duration (None, or on a CPU: unchanged)."""
    if mode is None or device.type != "cuda":
        return contextlib.nullcontext()
    return _sync_debug_mode(mode)


@contextlib.contextmanager
def _sync_debug_mode(mode: str) -> Iterator[None]:
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def build_loop(
    workload: Workload, plan: Plan, device: torch.device, rank: int, *, cache_dir: str, emit: Emit,
    clock_origin: float, should_stop: Callable[[], bool] = lambda: False,
    set_phase: Callable[[Phase], None] = lambda phase: None, resume_at: DataPosition | None = None,
) -> tuple[TrainingLoop, nn.Module]:
    """Everything one rank trains with, built in the same order by a burst and by an exported script.

    Seeded first, so every burst and every run of the exported script starts from the same weights and
    reads the data in the same order. Items draw from keys of the data seed (:mod:`accel_widgets.data.keyed`);
    the rank is reseeded with the data seed once the model is built, so what else draws in it (dropout) follows
    the data seed too while the weights stay those of ``seed``: a workload reseeded in its data alone shows how
    far data randomness moves the loss (the guard's band).
    ``resume_at``: a job's data position from its checkpoint (the loader starts there). Returns the loop and the
    unwrapped model (for FLOP counting, a job's evaluation and its saved state).
    """
    config, world_size = plan.config, plan.ranks
    torch.manual_seed(workload.seed)
    system.cap_memory(config, device)
    dataset, cache = data.prepare_dataset(workload.build_dataset(), config, cache_dir)
    data.check_shared_memory(dataset, workload, config, world_size)
    loader = data.build_loader(dataset, workload, config, device, rank, world_size)
    loader.worker_init_fn = DieWithRank(os.getpid(), loader.worker_init_fn)
    model, raw, compiled = prepare_model(workload.build_model().to(device), config, device, workload.blocks)
    optimizer = overhead.build_optimizer(workload, list(raw.parameters()), config)
    scheduler = workload.build_scheduler(optimizer)
    torch.manual_seed(data.data_seed(workload))
    timeline = CudaTimeline(device) if device.type == "cuda" else HostTimeline(time.perf_counter)
    random_data = (stream_randomness(loader.dataset) if isinstance(dataset, IterableDataset)
                   else map_randomness(dataset, data.data_seed(workload)))
    batches: EpochIterator | OnDeviceBatches = EpochIterator(loader, resume_at)
    if plan.freed == "data":
        batches = OnDeviceBatches(batches, lambda raw_batch: data.copy_batch(raw_batch, device, config,
                                                                             system.inputs_channels_last(config)))
    loop = TrainingLoop(model, optimizer, overhead.prepare_loss(workload, config), batches, config,
                        device, rank, emit, StepClock(timeline, time.perf_counter, clock_origin),
                        should_stop=should_stop, set_phase=set_phase, step_fn=workload.step,
                        max_grad_norm=workload.max_grad_norm, random_data=random_data, cache=cache,
                        scheduler=scheduler, compiled=compiled, freed=plan.freed)
    return loop, raw


def rank_summary(
    rank: int, device: torch.device, device_name: str, window: MeasuredWindow, setup_s: float,
    scaler_skipped_steps: int | None = None, flops_by_math: dict[str, float] | None = None,
    profile: ProfileCapture | None = None, code_paths: CodePaths | None = None,
    random_data: DataRandomness | None = None,
    stream: StreamReading | None = None, cache: CacheInfo | None = None, compile_report: CompileReport | None = None,
) -> RankSummary:
    return RankSummary(
        rank=rank,
        measured_samples=window.samples,
        measured_tokens=window.tokens,
        measured_s=window.seconds,
        peak_memory_bytes=window.peak_memory_bytes,
        peak_reserved_bytes=window.peak_reserved_bytes,
        model_state_bytes=window.model_state_bytes,
        allocator_expandable=window.allocator_expandable,
        memory_kind="cuda_allocator" if device.type == "cuda" else "rss",
        setup_s=setup_s,
        first_step_s=window.first_step_s,
        device=device_name,
        scaler_skipped_steps=scaler_skipped_steps,
        flops_per_sample=sum(flops_by_math.values()) if flops_by_math else None,
        flops_by_math=flops_by_math,
        profile=profile,
        code_paths=code_paths,
        random_data=random_data.random if random_data is not None else None,
        keyed_data=random_data.keyed if random_data is not None else None,
        stream=stream,
        cache=cache,
        compile_report=compile_report,
    )


def build_eval_loader(workload: Workload, plan: Plan, device: torch.device, rank: int) -> DataLoader | None:
    """This rank's share of the workload's evaluation set (None without one), its loader workers dying with the
    rank as the training loader's do."""
    if workload.eval_dataset is None:
        return None
    loader = data.build_eval_loader(workload.eval_dataset, workload, plan.config, device, rank, plan.ranks)
    loader.worker_init_fn = DieWithRank(os.getpid(), None)
    return loader
