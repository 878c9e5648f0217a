"""The training step every burst runs, with each knob applied where a hand-written loop would apply it.

This module runs inside a worker process (or, for the explicit in-process fallback, inside the
caller). Read :meth:`TrainingLoop._step` top to bottom: it is an ordinary PyTorch training step, and
every performance trick in it carries a one-line why.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import resource
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

from ..config import Config
from ..flops import count_training_flops
from ..results import OperatorTime, ProfileCapture, RankSummary, StepRecord
from ..workload import Workload
from .events import Emit, Phase, RankLosses

Clock = Callable[[], float]

DEFAULT_BATCH_SIZE = 64
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class CompileError(RuntimeError):
    """torch.compile failed at the first step (that is where inductor errors surface)."""


class BatchFormatError(TypeError):
    """A collated batch is not an ``(input, target)`` pair."""


# -- timing ---------------------------------------------------------------------------------------
@dataclass
class StepTiming:
    """One step on the timeline that does the work: ``data_s + h2d_s + compute_s == total_s`` exactly."""

    t: float
    data_s: float
    h2d_s: float
    total_s: float

    @property
    def compute_s(self) -> float:
        return max(0.0, self.total_s - self.data_s - self.h2d_s)


class Timeline(Protocol):
    """Markers on the clock of whatever runs the step's work (the host on a CPU, a CUDA stream on a GPU)."""

    def mark(self) -> Any:
        """A marker placed after everything issued so far; it is *reached* once all of that has run."""

    def reached(self, marker: Any) -> bool:
        """Whether the work before ``marker`` has run, asked without waiting for it."""

    def seconds_between(self, start: Any, end: Any) -> float: ...

    def synchronize(self) -> None:
        """Wait until every marker placed so far is reached."""


class HostTimeline:
    """The host's wall clock: on a CPU every op has finished before the next Python line runs."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def mark(self) -> float:
        return self._clock()

    def reached(self, marker: float) -> bool:
        return True

    def seconds_between(self, start: float, end: float) -> float:
        return end - start

    def synchronize(self) -> None:
        """Nothing is in flight on the host."""


class CudaTimeline:
    """CUDA events on the current stream, so measuring never adds a host-device sync.

    The host runs ahead of the GPU; events are read only once the GPU has passed them
    (``Event.query``), so a config that avoids syncs is measured without one.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def reached(self, marker: Any) -> bool:
        return bool(marker.query())

    def seconds_between(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize(self._device)


@dataclass
class _OpenStep:
    start: Any
    data: list[tuple[Any, Any]] = field(default_factory=list)
    copies: list[tuple[Any, Any]] = field(default_factory=list)
    end: Any = None


class StepClock:
    """Times steps on one timeline so that they tile the measured window and their parts add up.

    Each step starts where the previous one ended, so the steps' totals sum to the window and nothing
    the loop does between steps escapes measurement. A step's parts are intervals on the same timeline:
    *data* runs from a marker placed before asking the loader for a batch to one placed after it
    arrived. On a GPU that interval is the time the GPU sat idle because of the loader, not the host's
    wait: a host running ahead (``sync_every`` != 1) hides its data wait behind queued kernels, and
    then the GPU sees no stall. *h2d* brackets the copy the same way; compute is the rest.
    """

    def __init__(self, timeline: Timeline, clock: Clock, origin: float) -> None:
        self._timeline = timeline
        timeline.synchronize()
        self._reference = timeline.mark()
        timeline.synchronize()
        self._reference_t = clock() - origin
        self._previous_end: Any = None
        self._open: _OpenStep | None = None
        self._pending: deque[_OpenStep] = deque()

    def restart(self) -> None:
        """The next step starts at a fresh marker (after a pause that belongs to no step, e.g. a sync)."""
        self._previous_end = None

    def start_step(self) -> None:
        start = self._previous_end if self._previous_end is not None else self._timeline.mark()
        self._open = _OpenStep(start)

    @contextlib.contextmanager
    def waiting_for_data(self) -> Iterator[None]:
        with self._interval(self._require_open().data):
            yield

    @contextlib.contextmanager
    def copying(self) -> Iterator[None]:
        with self._interval(self._require_open().copies):
            yield

    def end_step(self) -> None:
        step = self._require_open()
        step.end = self._previous_end = self._timeline.mark()
        self._pending.append(step)
        self._open = None

    def synchronize(self) -> None:
        self._timeline.synchronize()

    def completed(self) -> list[StepTiming]:
        """Timings of the steps whose end the timeline has reached; never waits."""
        out = []
        while self._pending and self._timeline.reached(self._pending[0].end):
            out.append(self._resolve(self._pending.popleft()))
        return out

    def flush(self) -> list[StepTiming]:
        """Wait for every pending step and return its timing."""
        self._timeline.synchronize()
        return self.completed()

    @contextlib.contextmanager
    def _interval(self, into: list[tuple[Any, Any]]) -> Iterator[None]:
        begin = self._timeline.mark()
        yield
        into.append((begin, self._timeline.mark()))

    def _require_open(self) -> _OpenStep:
        if self._open is None:
            raise RuntimeError("start_step() must come first")
        return self._open

    def _resolve(self, step: _OpenStep) -> StepTiming:
        between = self._timeline.seconds_between
        data = sum(between(a, b) for a, b in step.data)
        h2d = sum(between(a, b) for a, b in step.copies)
        t = self._reference_t + between(self._reference, step.end)
        return StepTiming(t, data, h2d, between(step.start, step.end))


# -- building blocks ------------------------------------------------------------------------------
def resolve_batch_size(config: Config, workload: Workload) -> int:
    return config.batch_size or workload.batch_size or DEFAULT_BATCH_SIZE


def build_loader(
    dataset: Dataset, workload: Workload, config: Config, device: torch.device, rank: int, world_size: int
) -> DataLoader:
    """The DataLoader with the data-loading knobs; the same seeded order in every burst."""
    batch_size = resolve_batch_size(config, workload)
    per_rank = len(dataset) // world_size
    if per_rank < batch_size:
        raise ValueError(
            f"the dataset has {len(dataset)} items ({per_rank} per rank), fewer than one batch of {batch_size}: "
            "use a smaller batch_size or a larger dataset"
        )
    generator = torch.Generator().manual_seed(workload.seed)
    if world_size > 1:
        sampler: Any = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=workload.seed)
    else:
        sampler = RandomSampler(dataset, generator=generator)
    workers = config.num_workers
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=workload.collate_fn,
        # Why: pinned host memory lets the copy engine DMA batches to the GPU asynchronously.
        pin_memory=config.pin_memory and device.type == "cuda",
        # Why: equal batch shapes keep compiled graphs and cuDNN plans valid for every step.
        drop_last=True,
        prefetch_factor=config.prefetch_factor if workers else None,
        persistent_workers=config.persistent_workers if workers else False,
        generator=generator,
        # Explicit: notebook-defined datasets need fork (spawn cannot import __main__ classes), and
        # Python 3.14 changes the Linux default to forkserver.
        multiprocessing_context="fork" if workers else None,
    )


class EpochIterator:
    """Endless batches: a new epoch (and sampler epoch) whenever the loader is exhausted."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader, self._epoch = loader, 0
        self._iterator = iter(loader)

    def __next__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            self._epoch += 1
            if isinstance(self._loader.sampler, DistributedSampler):
                self._loader.sampler.set_epoch(self._epoch)
            self._iterator = iter(self._loader)
            return next(self._iterator)


def prepare_model(
    model: nn.Module, config: Config, device: torch.device, world_size: int
) -> tuple[nn.Module, nn.Module]:
    """Move, reformat, wrap and compile the model; returns ``(model to call, unwrapped model)``."""
    model = model.to(device)
    if config.channels_last:
        # Why: tensor-core convolutions run in NHWC; NCHW weights pay a transpose around every conv.
        model = model.to(memory_format=torch.channels_last)
    raw = model
    if config.parallel == "ddp":  # with one rank too: that measures what DDP itself costs
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    elif config.parallel == "dataparallel":
        # Legacy single-process data parallelism: one Python thread drives every GPU (DDP avoids that).
        model = nn.DataParallel(model)
    if config.compile_mode != "off":
        # Why: inductor fuses elementwise ops and strips Python overhead; pays a compile on step one.
        model = torch.compile(model, mode=None if config.compile_mode == "default" else config.compile_mode)
    return model, raw


def build_optimizer(workload: Workload, params: list[nn.Parameter], config: Config) -> torch.optim.Optimizer:
    """The workload's optimizer, rebuilt with the requested implementation (for-loop / foreach / fused)."""
    optimizer = workload.optimizer(params)
    if config.optimizer_impl == "default":
        return optimizer
    flags = {"for-loop": {"foreach": False, "fused": False}, "foreach": {"foreach": True, "fused": False},
             "fused": {"foreach": False, "fused": True}}[config.optimizer_impl]
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    missing = [name for name in flags if name not in accepted]
    if missing:
        raise ValueError(f"optimizer_impl={config.optimizer_impl!r}: {cls.__name__} has no {missing[0]!r} option")
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    # Per-group copies of the old flags would override the new defaults, so groups drop them.
    groups = [{k: v for k, v in g.items() if k == "params" or (k in accepted and k not in flags)}
              for g in optimizer.param_groups]
    return cls(groups, **{**defaults, **flags})


def prepare_loss(workload: Workload, config: Config) -> Callable[[Any, Any], torch.Tensor]:
    if not config.script_loss:
        return workload.loss_fn
    # Legacy path, kept for comparison: TorchScript is deprecated in favour of torch.compile.
    try:
        return torch.jit.script(workload.loss_fn)
    except Exception as exc:
        raise ValueError(
            f"script_loss=True: the loss function cannot be compiled by TorchScript ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0]}). TorchScript is legacy; turn script_loss off."
        ) from exc


def to_device(obj: Any, device: torch.device, non_blocking: bool, channels_last: bool) -> Any:
    """Move every tensor of a (possibly nested) batch to the device."""
    if isinstance(obj, torch.Tensor):
        if channels_last and obj.dim() == 4 and obj.is_floating_point():
            return obj.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device, non_blocking, channels_last) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device, non_blocking, channels_last) for v in obj)
    return obj


def split_batch(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    raise BatchFormatError(
        f"each dataset item must be an (input, target) pair; a collated batch was a {type(batch).__name__}"
        + (f" of {len(batch)} elements" if isinstance(batch, (list, tuple)) else "")
    )


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


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# -- the loop -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MeasuredWindow:
    """What the steady-state window measured on one rank, read before anything runs after it."""

    samples: int
    steps: int
    seconds: float
    first_step_s: float
    peak_memory_bytes: int


@dataclass
class TrainingLoop:
    """Runs warmup plus measured steps of one rank and streams a record per step through ``emit``.

    ``set_phase`` tells the launcher what the rank is doing (waiting for data, in a step), so a burst
    that hangs can be reported as "stuck in the loader" rather than as a generic timeout.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor]
    batches: EpochIterator
    config: Config
    device: torch.device
    rank: int
    emit: Emit
    step_clock: StepClock
    clock: Clock = time.perf_counter
    should_stop: Callable[[], bool] = lambda: False
    set_phase: Callable[[Phase], None] = lambda phase: None
    scaler: torch.amp.GradScaler = field(init=False)
    _pending_losses: list[torch.Tensor] = field(init=False, default_factory=list)
    last_micro_batch: tuple[Any, Any] | None = field(init=False, default=None)
    _losses: list[float] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        # Why: fp16 has a narrow exponent range; scaling the loss keeps small gradients from flushing to 0.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.config.precision == "fp16")
        self._initial_scale = self.scaler.get_scale()  # before first use: no tensor yet, so no sync
        self._next_step = 0

    def flops_per_sample(self, raw_model: nn.Module) -> float | None:
        """Training FLOPs per sample, counted on one extra micro-batch after measuring (None if uncountable)."""
        if self.last_micro_batch is None:
            return None
        inputs, targets = self.last_micro_batch
        try:
            flops = count_training_flops(raw_model, inputs, targets, self.loss_fn, call_model, self._autocast)
        except Exception as exc:  # an op the counter cannot trace must not fail a finished burst
            warnings.warn(f"FLOPs not counted ({type(exc).__name__}: {exc}); MFU unavailable", stacklevel=2)
            return None
        return flops / batch_length(targets) if flops else None

    def profile(self, steps: int, trace_path: str, top: int = 15) -> ProfileCapture:
        """Record ``steps`` more steady-state steps with torch.profiler; their timings are discarded.

        Runs after the measured window, so the profiler's overhead never reaches the burst's numbers.
        """
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profiler:
            self.extra_steps(steps)
        profiler.export_chrome_trace(trace_path)
        averages = sorted(profiler.key_averages(), reverse=True,
                          key=lambda e: e.self_device_time_total + e.self_cpu_time_total)
        operators = [OperatorTime(e.key, int(e.count), e.self_cpu_time_total / 1e3, e.self_device_time_total / 1e3)
                     for e in averages[:top]]
        return ProfileCapture(steps, trace_path, operators)

    def extra_steps(self, steps: int) -> None:
        """Train ``steps`` more steps that are not reported (DDP peers of a profiling rank run these)."""
        for _ in range(steps):
            self._step()
        self.step_clock.flush()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = _AUTOCAST_DTYPES.get(self.config.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _step(self) -> int:
        """One optimizer step over ``grad_accum_steps`` micro-batches; returns the samples it consumed."""
        config, clock = self.config, self.step_clock
        clock.start_step()
        samples, step_loss = 0, None
        accum = config.grad_accum_steps
        for micro in range(accum):
            self.set_phase(Phase.DATA)
            with clock.waiting_for_data():
                batch = next(self.batches)
            self.set_phase(Phase.STEP)
            with clock.copying():
                # Why non_blocking: from pinned memory the copy overlaps compute instead of stalling the host.
                inputs, targets = split_batch(to_device(batch, self.device, config.non_blocking, config.channels_last))
            samples += batch_length(targets)
            self.last_micro_batch = (inputs, targets)
            # Why no_sync: DDP all-reduces gradients only on the micro-batch that steps the optimizer.
            last = micro == accum - 1
            skip_sync = not last and hasattr(self.model, "no_sync")
            with self.model.no_sync() if skip_sync else contextlib.nullcontext():
                with self._autocast():
                    loss = self.loss_fn(call_model(self.model, inputs), targets)
                # Why /accum: the accumulated gradient then equals that of one batch of accum x the size.
                self.scaler.scale(loss / accum).backward()
            detached = loss.detach()
            step_loss = detached if step_loss is None else step_loss + detached
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # Why set_to_none: the next backward writes fresh gradients instead of adding into zeroed ones.
        self.optimizer.zero_grad(set_to_none=config.set_to_none)
        self._pending_losses.append(step_loss / accum)
        # Why sync_every: .item() blocks the host until the device has finished every queued kernel.
        if config.sync_every and len(self._pending_losses) >= config.sync_every:
            self._read_losses()
        clock.end_step()
        return samples

    def _read_losses(self) -> None:
        """The loop's one deliberate host sync (the sync-debug mode allows this one and no other)."""
        if self._pending_losses:
            # Lifts the sync-debug mode: this sync is the one the config asked for.
            with _cuda_sync_debug_mode(self.device, "default"):
                self._losses.extend(torch.stack(self._pending_losses).float().tolist())
            self._pending_losses.clear()

    def _emit_completed(self, timings: list[StepTiming], warmup: bool, samples: int) -> None:
        for timing in timings:
            step = self._next_step
            loss = self._losses[step] if step < len(self._losses) else None
            record = StepRecord(self.rank, step, timing.t, timing.data_s, timing.h2d_s, timing.compute_s,
                                timing.total_s, samples, loss, warmup)
            self.emit(record)
            self._next_step += 1

    def _first_step(self) -> int:
        try:
            return self._step()
        except Exception as exc:
            from_compiler = type(exc).__module__.startswith(("torch._dynamo", "torch._inductor"))
            if self.config.compile_mode != "off" and from_compiler:
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise CompileError(
                    f"torch.compile(mode={self.config.compile_mode!r}) failed at the first step: "
                    f"{type(exc).__name__}: {first_line}. Run with compile_mode='off', or fix the graph break."
                ) from exc
            raise

    def scaler_skipped_steps(self) -> int | None:
        """Optimizer steps GradScaler skipped for inf/NaN gradients (fp16 only), read once after measuring.

        Within a burst shorter than the scaler's growth interval the scale only changes by halving on a
        skipped step, so log2(initial / final) counts the skips exactly without a per-step host sync.
        """
        if not self.scaler.is_enabled():
            return None
        scale = self.scaler.get_scale()
        if scale == 0.0:  # float32 underflow after ~166 consecutive skips: every step was skipped
            return self._next_step
        growths = self._next_step // self.scaler.get_growth_interval()
        halvings = math.log2(self._initial_scale / scale)
        return max(0, round(halvings) + growths)

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
        for _ in range(max(0, warmup_steps - 1)):
            begin = self.clock()
            samples = self._step()
            self.step_clock.synchronize()
            last_s = self.clock() - begin
            self._emit_completed(self.step_clock.completed(), True, samples)
        self._emit_completed(self.step_clock.flush(), True, samples)
        if self.device.type == "cuda":
            if self.config.empty_cache:
                # Return warm-up's cached blocks to the driver (other processes can use them).
                torch.cuda.empty_cache()
            # The peak then covers the steady-state window only, never compilation or warm-up.
            torch.cuda.reset_peak_memory_stats(self.device)
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
        with _cuda_sync_debug_mode(self.device, "error" if sync_debug else None):
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
        window_s = self.clock() - window_start
        peak = peak_memory_bytes(self.device)
        self._emit_completed(timings, False, samples)
        self.emit(RankLosses(self.rank, list(self._losses)))
        return MeasuredWindow(measured_samples, measured_steps, window_s, first_step_s, peak)


@contextlib.contextmanager
def _cuda_sync_debug_mode(device: torch.device, mode: str | None) -> Iterator[None]:
    """torch's CUDA sync-debug mode set to ``mode`` for the duration (None, or on a CPU: unchanged)."""
    if mode is None or device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def rank_summary(
    rank: int, device: torch.device, device_name: str, window: MeasuredWindow, setup_s: float,
    scaler_skipped_steps: int | None = None, flops_per_sample: float | None = None,
    profile: ProfileCapture | None = None,
) -> RankSummary:
    return RankSummary(
        rank=rank,
        measured_samples=window.samples,
        measured_s=window.seconds,
        peak_memory_bytes=window.peak_memory_bytes,
        memory_kind="cuda_allocator" if device.type == "cuda" else "rss",
        setup_s=setup_s,
        first_step_s=window.first_step_s,
        device=device_name,
        scaler_skipped_steps=scaler_skipped_steps,
        flops_per_sample=flops_per_sample,
        profile=profile,
    )
