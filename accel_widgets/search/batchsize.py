"""Batch-size finder: the largest batch that fits in memory, and samples/s at every batch size tried.

Each try is a short burst in worker processes, which is what makes trying sizes that do not fit safe:

- on a GPU a batch that does not fit raises ``torch.OutOfMemoryError`` in the rank, which dies; the caller
  gets a :class:`~accel_widgets.WorkerOutOfMemory` and goes on. An optional cap becomes the
  ``memory_fraction`` knob, so the allocator itself refuses beyond it (NVML's "used" would count other
  processes and the CUDA context);
- on a CPU nothing fails cleanly: the machine swaps, or the kernel's OOM killer picks a process, maybe the
  notebook. So the search stops at a memory cap on the burst's RSS, watched live from the burst's
  telemetry (5 Hz): over the cap, the burst is stopped at once, and a finished burst whose ranks' peak
  RSS passed the cap between two samples counts as over it too.

The search doubles from the start size until a size does not fit (or a limit: ``max_batch_size``, the
dataset's items per rank), halving instead when the start does not fit, then bisects between the last
size that fit and the first that did not, for a bounded number of tries. A larger batch is not always
faster, so the result reports the fastest size apart from the largest.

"Fits" keeps a margin: a size whose peak leaves less than ``margin`` of the memory (the cap, or the GPU's) free
counts as not fitting, because a real run meets what a short burst does not (a longer sequence, a fragmented
allocator, an evaluation pass). Where the model has repeated blocks, the first size that does not fit is tried
again with activation checkpointing, and grown from there: the tries say which setting each ran under. With a
``target_batch`` the finder measures the ways of reaching that global batch (micro-batch x accumulation x ranks)
with micro-batches that fit, and reports the fastest.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
from torch.utils.data import IterableDataset

from ..analysis.estimate import estimate
from ..analysis.usage import peak_reserved_bytes
from ..engine.launcher import Engine, run_burst
from ..inputs.device import DeviceInfo, probe_device
from ..inputs.workload import Workload
from ..knobs import KNOBS, KnobValueError, batch, memory, parallel, system
from ..knobs.config import Config
from ..knobs.plan import resolve
from ..knobs.rules import ConfigError, check_config
from ..metrics.thresholds import THRESHOLDS
from ..metrics.units import bytes_text
from ..results.batchsize import (
    MEMORY_FAILURES,
    BatchSizeSearch,
    BatchTry,
    Failure,
    Stage,
    TargetBatch,
    TargetTry,
)
from ..results.burst import BurstResult, TelemetrySample
from .bursts import Bursts

#: Without a cap on a CPU, the burst may use this share of the RAM available when the search starts: room
#: for the notebook and the rest of the machine, and far from the point where the OOM killer chooses.
DEFAULT_CPU_SHARE = 0.5
#: Measured steps per try: enough for a median step time, few enough that a search of ~10 tries is short.
DEFAULT_STEPS = 8
#: Bisection tries after the doubling: each halves the gap, so 4 end within 1/16 of the last doubling.
DEFAULT_REFINE_TRIES = 4
#: The share of the memory a size must leave free to count as fitting (the estimate's margin too).
DEFAULT_MARGIN = THRESHOLDS.fit_margin
#: Ways of reaching a target batch measured (the largest micro-batches that fit, each with its accumulation).
TARGET_CANDIDATES = 3
#: torch's CPU allocator raises a plain RuntimeError (not OutOfMemoryError) when malloc fails.
CPU_ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)


def find_batch_size(
    workload: Workload,
    config: Config | None = None,
    *,
    start: int | None = None,
    max_batch_size: int | None = None,
    memory_cap: int | float | str | None = None,
    margin: float = DEFAULT_MARGIN,
    target_batch: int | None = None,
    make_room: bool = True,
    steps: int = DEFAULT_STEPS,
    refine_tries: int = DEFAULT_REFINE_TRIES,
    device: DeviceInfo | None = None,
    engine: Engine = run_burst,
    on_try: Callable[[BatchTry], None] | None = None,
    stop: threading.Event | None = None,
) -> BatchSizeSearch:
    """Find the largest batch size of ``workload`` under ``config`` that fits, and samples/s at each size tried.

    The batch size is ``Config.batch_size``: samples per micro-batch of one process, so under DDP it is per
    rank (each of ``world_size`` ranks trains on that many; the result's ``batch_scope`` says so).
    ``start``: the first size tried (default: the largest the estimate on fake tensors says leaves the margin free,
    :func:`~accel_widgets.analysis.estimate.estimate`; where it cannot say, the config's batch size, else the
    workload's, else 1); the result says how far the estimate was from the answer.
    ``max_batch_size`` bounds the growth, as does the dataset (a size needs one full batch of items per rank).

    ``memory_cap``: bytes (``2 * 2**30``), a size text (``"2GiB"``, ``"1.5 GB"``), or a share in (0, 1] of the
    memory there is (a GPU's own memory; on a CPU, the RAM available when the search starts).
    On a CPU it caps the RSS of the burst's processes (ranks and their loader workers, summed); it defaults
    to ``DEFAULT_CPU_SHARE`` of the available RAM. On a GPU it sets the ``memory_fraction`` knob of every
    try (default: none, or the config's own ``memory_fraction``), and running out of device memory is the limit;
    the result's ``cap_bytes`` is then that fraction of CUDA's total, as the ranks read it.

    ``margin``: the share of that memory (the cap; on a GPU without one, its memory as CUDA reports it) a size must
    leave free to count as fitting (on a GPU judged on the allocator's reserved peak, what the device gave). The
    search brackets the largest such size (:attr:`BatchSizeSearch.largest_within_margin`); 0 brackets the largest
    that runs at all. ``make_room``: where the model has repeated blocks, the first size that did not fit is tried
    again with activation checkpointing, and grown from there (the tries under it say so). ``target_batch``: a
    global batch (samples per optimizer step over every rank) to reach as micro-batch x ``grad_accum_steps`` x
    ranks: the ``TARGET_CANDIDATES`` largest micro-batches that fit and divide it are measured with their
    accumulation, and the result's ``target`` names the fastest.

    Every try is a burst of ``steps`` measured steps through ``engine`` (called like ``run_burst`` with
    ``steps``, ``label``, ``on_event`` and ``stop``); ``refine_tries`` bisection tries follow the doubling
    (0: powers of two only). ``on_try`` gets each try as it finishes. Setting ``stop`` ends the running try
    and the search. A try that fails never raises: a size that does not fit is a result, and any other
    failure ends the search with the reason. A config that cannot run here raises before any burst, as does a
    workload whose own DataLoader has a batch sampler (its batches do not take the batch size), a margin outside
    [0, 1) and a target batch the ranks cannot share.
    """
    if start is not None and start < 1:
        raise ValueError(f"start={start}: use a whole number >= 1, or None for the config's or workload's batch size")
    _check_margin(margin)
    device = device or probe_device()
    config = resolve(config or Config(), device, workload).config  # refused here as a burst would refuse it
    _check_target(target_batch, config)
    _check_batchable(workload)
    config, cap, cap_note = _memory_cap(memory_cap, config, device)
    limit, limit_note = _limit(workload, config, max_batch_size)
    limits = _Limits(margin, None if device.has_cuda else cap, *_gpu_limit(config, device))
    estimated, estimate_note = (None, "a start was given") if start is not None else _estimated(
        workload, config, device, limits, margin)
    first = min(start or estimated or config.batch_size or workload.batch_size or 1, limit)
    bursts = Bursts(engine, steps=steps, stop=stop)
    search = _Search(workload, config, bursts, limits, on_try)
    search.grow(first, limit, limit_note)
    search.refine(refine_tries)
    tries, stopped = list(search.tries), search.stopped
    room = memory.room_maker(config, workload) if make_room and search.failed is not None else None
    if room is not None and not bursts.stopped():
        roomy = _Search(workload, room, bursts, limits, on_try, setting=room.label(config))
        roomy.grow(search.failed or first, limit, limit_note, shrink=False)
        roomy.refine(refine_tries)
        tries += roomy.tries
        stopped += f"; with {roomy.setting}: {roomy.stopped}"
    target = None
    if target_batch is not None:
        target = _reach(target_batch, tries, _Reach(workload, config, room, bursts, limits, device))
    if device.has_cuda:
        cap, cap_note = _enforced_cap(cap, cap_note, config, limits.cuda_total)
    return BatchSizeSearch(workload.name, config, device.name if device.has_cuda else f"CPU ({device.name})",
                           "cuda_allocator" if device.has_cuda else "rss", cap, cap_note, batch_scope(config),
                           tuple(tries), stopped, time.perf_counter() - search.started, margin, limits.memory(),
                           target, room if any(t.setting for t in tries) else None, estimated, estimate_note)


def _estimated(workload: Workload, config: Config, device: DeviceInfo, limits: _Limits,
               margin: float) -> tuple[int | None, str]:
    """The largest batch the estimate says leaves the margin of the search's memory free (its cap on a CPU, the GPU's
    memory on a GPU), or why there is none: a model the fake tensors cannot trace is searched from the config's size."""
    memory_bytes = limits.memory()
    if memory_bytes is None:
        return None, "the memory the batch must fit in is unknown"
    try:
        found = estimate(workload, config, device=device, margin=margin)
    except Exception as exc:  # an op fake tensors cannot run, a dataset that cannot give a sample: search without it
        text = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    largest = found.largest_within(memory_bytes, margin)
    return (largest, "") if largest is not None else (None, "the estimate says not even a batch of 1 fits")


def batch_scope(config: Config) -> str:
    """What ``Config.batch_size`` counts under ``config``: it is always one process's micro-batch."""
    micro = batch.micro_batches(config)
    accumulate = f"; {micro} micro-batches per optimizer step" if micro > 1 else ""
    ranks = parallel.ranks(config)
    if ranks > 1:
        return (f"per DDP rank: each of the {ranks} ranks trains on batch_size samples, "
                f"{ranks * micro} x batch_size per optimizer step{accumulate}")
    if parallel.single_process_multi_gpu(config):
        return f"per process: DataParallel splits each batch across the GPUs{accumulate}"
    return f"per micro-batch{accumulate}" if accumulate else "per step"


def parse_memory_size(text: str) -> int:
    """Bytes in ``"2GiB"``, ``"512 MiB"``, ``"1.5GB"`` or ``"1000000"`` (KiB/MiB/GiB/TiB: 1024s; kB/MB/GB/TB: 1000s)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"memory size {text!r} not understood: write e.g. '2GiB', '512 MiB', '1.5GB' or a byte count")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


# -- limits and the cap -----------------------------------------------------------------------------------
def _check_margin(margin: float) -> None:
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin < 1:
        raise ValueError(f"margin={margin!r}: use a share of the memory in [0, 1), e.g. 0.1 to leave 10% free")


def _check_target(target_batch: int | None, config: Config) -> None:
    """A target global batch is a whole number of samples the ranks share equally."""
    if target_batch is None:
        return
    ranks = parallel.ranks(config)
    if isinstance(target_batch, bool) or not isinstance(target_batch, int) or target_batch < 1:
        raise ValueError(f"target_batch={target_batch!r}: use a whole number of samples per optimizer step >= 1")
    if target_batch % ranks:
        raise ValueError(f"target_batch={target_batch:,} is no multiple of the {ranks} ranks: each rank trains on "
                         "an equal share of the global batch")


def _check_batchable(workload: Workload) -> None:
    """A user's DataLoader without a batch size batches through its batch sampler, which the knob cannot change."""
    loader = workload.loader
    if loader is not None and loader.batch_size is None:
        raise ValueError(f"your DataLoader batches with its batch_sampler ({type(loader.batch_sampler).__name__}), "
                         "so the batch size cannot be varied: pass its dataset and a per-sample sampler instead")


def _limit(workload: Workload, config: Config, max_batch_size: int | None) -> tuple[int, str]:
    """The largest size worth trying, and why it is the limit (one full batch per rank; the knob's range)."""
    knob_max = KNOBS["batch_size"].maximum or 1 << 20
    limits = [(knob_max, f"the batch_size knob's maximum ({knob_max:,})")]
    if max_batch_size is not None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size}: use a whole number >= 1, or None")
        limits.append((max_batch_size, f"max_batch_size={max_batch_size:,}"))
    # A stream has no length (it restarts when it ends), and a factory's dataset is built in the ranks.
    if not isinstance(workload.dataset, IterableDataset) and not workload.dataset_is_factory:
        items = len(workload.dataset)
        per_rank = items // config.ranks
        where = f" ({per_rank:,} per rank)" if config.ranks > 1 else ""
        limits.append((max(1, per_rank), f"the dataset's {items:,} items{where}"))
    return min(limits)


def _memory_cap(memory_cap: int | float | str | None, config: Config,
                device: DeviceInfo) -> tuple[Config, int | None, str]:
    """(the config every try runs, the cap in bytes, where the cap came from)."""
    if device.has_cuda:
        return _gpu_cap(memory_cap, config, device)
    available = psutil.virtual_memory().available
    if memory_cap is None:
        return config, int(available * DEFAULT_CPU_SHARE), (f"default: {DEFAULT_CPU_SHARE:.0%} of the "
                                                            f"{bytes_text(available)} RAM available at the start")
    cap, note = _cap_bytes(memory_cap, available, "the RAM available at the start")
    return config, cap, f"RSS of the burst's processes; {note}"


def _gpu_cap(memory_cap: int | float | str | None, config: Config,
             device: DeviceInfo) -> tuple[Config, int | None, str]:
    """On a GPU the cap is the ``memory_fraction`` knob: the allocator raises OOM past it.

    A share is the fraction itself, never a round trip through bytes: ``int(0.05 * memory) / memory`` falls
    just below 0.05, the knob's minimum, on any GPU whose size is not a multiple of 20 bytes (an H200's
    143,771 MiB). Bytes become the fraction of NVML's total (all the caller can read without CUDA); the
    cap the allocator enforces is that fraction of CUDA's total, which :func:`_enforced_cap` reads back.
    """
    memory = min(g.memory_bytes for g in parallel.gpus_for(config, device) or device.gpus)
    if memory_cap is None:
        share = system.memory_cap(config)
        if share is None:
            return config, None, "none: the GPU's memory is the limit"
        return config, int(share * memory), f"the config's memory_fraction={share:g}"
    cap, note = _cap_bytes(memory_cap, memory, "the GPU's memory")
    fraction = memory_cap if isinstance(memory_cap, float) else cap / memory
    try:
        capped = system.with_memory_cap(config, fraction)
    except KnobValueError as exc:
        raise ValueError(f"memory_cap={memory_cap!r} is {fraction:.2%} of the GPU's {bytes_text(memory)}: {exc}") \
            from None
    return capped, cap, f"{note}, as memory_fraction={fraction:.3g}"


def _gpu_limit(config: Config, device: DeviceInfo) -> tuple[float | None, int | None]:
    """(the share of a GPU the tries may use, NVML's memory of the smallest GPU they train on); (None, None) on a
    CPU."""
    if not device.has_cuda:
        return None, None
    return system.memory_cap(config), min(g.memory_bytes for g in parallel.gpus_for(config, device) or device.gpus)


def _enforced_cap(cap: int | None, note: str, config: Config, cuda_total: int | None) -> tuple[int | None, str]:
    """The cap as the allocator enforced it: ``torch.cuda.set_per_process_memory_fraction`` takes its share of
    CUDA's total (``cudaMemGetInfo``, read by the ranks), which is a little less than NVML's."""
    share = system.memory_cap(config)
    if cap is None or share is None or cuda_total is None:
        return cap, note
    enforced = int(share * cuda_total)
    return enforced, f"{note}; enforced on CUDA's total of {bytes_text(cuda_total)}"


def _cap_bytes(memory_cap: int | float | str, whole: int, whole_name: str) -> tuple[int, str]:
    if isinstance(memory_cap, bool) or not isinstance(memory_cap, int | float | str):
        raise TypeError(f"memory_cap={memory_cap!r}: use bytes (int), a size text ('2GiB') or a share in (0, 1]")
    if isinstance(memory_cap, str):
        return parse_memory_size(memory_cap), f"memory_cap={memory_cap!r}"
    if isinstance(memory_cap, float):
        if not 0 < memory_cap <= 1:
            raise ValueError(f"memory_cap={memory_cap!r}: a float is a share of {whole_name}, in (0, 1]; pass "
                             "bytes as an int or a size text ('2GiB')")
        return int(memory_cap * whole), f"{memory_cap:.0%} of {whole_name} ({bytes_text(whole)})"
    if memory_cap < 1:
        raise ValueError(f"memory_cap={memory_cap}: bytes must be >= 1")
    return memory_cap, f"memory_cap={bytes_text(memory_cap)}"


# -- the search ---------------------------------------------------------------------------------------------
@dataclass
class _Watch:
    """``on_event`` of one try: keeps the telemetry's memory peak, and stops the burst past the cap or when
    the caller's stop is set (the try's own stop event: the caller's must not be set by a cap). Telemetry
    arrives every ~0.1 s from launch to teardown, so the caller's stop is seen within that."""

    cap: int | None
    caller_stop: threading.Event | None
    stop: threading.Event = field(default_factory=threading.Event)
    peak: int = 0
    over_cap: bool = False

    def __call__(self, event: object) -> None:
        if isinstance(event, TelemetrySample) and event.source == "psutil":
            self.peak = max(self.peak, event.mem_used_bytes)
            if self.cap is not None and event.mem_used_bytes > self.cap:
                self.over_cap = True
                self.stop.set()
        if self.caller_stop is not None and self.caller_stop.is_set():
            self.stop.set()


@dataclass
class _Limits:
    """What a try is held to: on a CPU the RSS cap (a try past it is stopped live), on a GPU the share of its memory
    (``memory_fraction``), and everywhere the margin a size must leave free of that memory. ``cuda_total`` is CUDA's
    total memory as a finished try's rank read it (a little less than NVML's)."""

    margin: float
    cpu_cap: int | None
    gpu_share: float | None
    gpu_memory: int | None
    cuda_total: int | None = None

    def memory(self) -> int | None:
        """The memory the margin is a share of: the CPU cap, or the GPU's (CUDA's total once a rank read it) times
        its share; None where neither is known."""
        if self.cpu_cap is not None:
            return self.cpu_cap
        if self.gpu_memory is None:
            return None
        return int((self.gpu_share or 1.0) * (self.cuda_total or self.gpu_memory))

    def within_margin(self, peak: int | None) -> bool:
        """Whether a try that peaked at ``peak`` left the margin free (a peak not measured cannot say it did not)."""
        memory = self.memory()
        return memory is None or peak is None or peak <= memory * (1 - self.margin)

    def margin_text(self) -> str:
        return f" with {self.margin:.0%} of the memory left" if self.margin else ""


class _Search:
    """The tries so far, the bracket (largest size within the margin, smallest beyond it or failing) and why the
    search ended. ``setting`` names what ``config`` adds to the search's own config ("" for the config itself)."""

    def __init__(self, workload: Workload, config: Config, bursts: Bursts, limits: _Limits,
                 on_try: Callable[[BatchTry], None] | None, setting: str = "") -> None:
        self.workload, self.config, self.bursts, self.limits = workload, config, bursts, limits
        self.on_try, self.stop, self.setting = on_try, bursts.stop, setting
        self.tries: list[BatchTry] = []
        self.fit: int | None = None
        self.failed: int | None = None
        self.stopped = ""
        self.started = time.perf_counter()

    def grow(self, size: int, limit: int, limit_note: str, *, shrink: bool = True) -> None:
        """Double from ``size`` while it fits (halve while it does not, unless ``shrink`` is off) until a fit and a
        failure bracket the answer, or the limit or a batch of 1 ends it."""
        while self.fit is None or self.failed is None:
            stage: Stage = "shrink" if self.failed is not None else "grow"
            outcome = self.attempt(size, stage)
            if outcome is None:
                return
            if outcome.within_margin and self.failed is None and size >= limit:
                self.stopped = f"every size up to the limit fit: {limit_note}"
                return
            if not outcome.within_margin and (size == 1 or not shrink):
                self.stopped = (f"even a batch of 1 does not fit{self.limits.margin_text()}" if size == 1 else
                                f"{size:,} does not fit{self.limits.margin_text()} either")
                return
            size = min(size * 2, limit) if outcome.within_margin else size // 2
        self.stopped = f"{self.failed:,} does not fit{self.limits.margin_text()}"

    def refine(self, tries: int) -> None:
        """Bisect between the largest fit and the smallest failure, at most ``tries`` times."""
        for _ in range(tries):
            if self.fit is None or self.failed is None or self.failed - self.fit <= 1:
                return
            outcome = self.attempt((self.fit + self.failed) // 2, "refine")
            if outcome is None:
                return
            self.stopped = f"{self.failed:,} does not fit{self.limits.margin_text()}; {self.fit:,} does"

    def attempt(self, size: int, stage: Stage) -> BatchTry | None:
        """Try ``size`` and record it; None when the search has to end (stop, or a failure not about memory)."""
        if self.stop is not None and self.stop.is_set():
            self.stopped = "stopped: the stop event was set"
            return None
        outcome = _measure(self.workload, self.config.replace(batch_size=size), self.bursts, self.limits,
                           f"batch size {size}", stage)
        outcome = dataclasses.replace(outcome, setting=self.setting)
        self.record(outcome)
        if outcome.failure in ("error", "stopped"):
            self.stopped = ("stopped: the stop event was set" if outcome.failure == "stopped"
                            else f"batch size {size:,} failed for a reason other than memory: {outcome.why_not}")
            return None
        return outcome

    def record(self, outcome: BatchTry) -> None:
        self.tries.append(outcome)
        if outcome.within_margin:
            self.fit = max(self.fit or 0, outcome.batch_size)
        elif outcome.fits or outcome.failure in MEMORY_FAILURES:
            self.failed = min(self.failed or outcome.batch_size, outcome.batch_size)
        if self.on_try is not None:
            self.on_try(outcome)


def _measure(workload: Workload, config: Config, bursts: Bursts, limits: _Limits, label: str,
             stage: Stage) -> BatchTry:
    """One try of ``config``: its burst watched against the CPU cap, judged, and CUDA's total noted."""
    watch = _Watch(limits.cpu_cap, bursts.stop)
    result = bursts.run(workload, config, label=label, on_event=watch, stop=watch.stop)
    limits.cuda_total = result.environment.get("cuda_memory_bytes", limits.cuda_total)
    return _judge(config.batch_size or 0, stage, result, watch, limits)


@dataclass(frozen=True)
class _Reach:
    """What measuring the ways to a target batch needs: the search's config, the config that makes room (None:
    none), how bursts run, the limits and the machine (whose rules refuse some accumulations)."""

    workload: Workload
    config: Config
    room: Config | None
    bursts: Bursts
    limits: _Limits
    device: DeviceInfo


def _reach(target: int, tries: list[BatchTry], reach: _Reach) -> TargetBatch:
    """Measure the largest micro-batches that fit and divide the target's share per rank, each accumulated to the
    target; the config itself where the micro-batch fits without making room, the room config where it needs it."""
    ranks = parallel.ranks(reach.config)
    per_rank = target // ranks
    plain = max((t.batch_size for t in tries if t.within_margin and not t.setting), default=0)
    roomy = max((t.batch_size for t in tries if t.within_margin and t.setting), default=0)
    sizes = [m for m in _divisors(per_rank) if m <= max(plain, roomy)][:TARGET_CANDIDATES]
    if not sizes:
        return TargetBatch(target, ranks, note="no batch size fit")
    measured = []
    for size in sizes:
        base = reach.config if size <= plain or reach.room is None else reach.room
        measured.append(_target_try(size, per_rank // size, base, reach))
        if reach.bursts.stopped():
            break
    return TargetBatch(target, ranks, tuple(measured))


def _target_try(size: int, accumulation: int, base: Config, reach: _Reach) -> TargetTry:
    setting = base.label(reach.config) if base != reach.config else ""
    try:
        candidate = batch.with_accumulation(base.replace(batch_size=size), accumulation)
        check_config(candidate, reach.device)
    except (KnobValueError, ConfigError) as exc:
        return TargetTry(size, accumulation, setting, why_not=str(exc))
    outcome = _measure(reach.workload, candidate, reach.bursts, reach.limits,
                       f"target batch: {size} x {accumulation}", "refine")
    if not outcome.within_margin:
        why = outcome.why_not or f"over the margin: peak {bytes_text(outcome.peak_memory_bytes or 0)}"
        return TargetTry(size, accumulation, setting, why_not=why)
    return TargetTry(size, accumulation, setting, outcome.samples_per_s)


def _divisors(number: int) -> list[int]:
    """The divisors of ``number``, largest first."""
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return sorted({*small, *(number // d for d in small)}, reverse=True)


def _judge(size: int, stage: Stage, result: BurstResult, watch: _Watch, limits: _Limits) -> BatchTry:
    """It fit unless it was over the cap (live, or by its ranks' peak), stopped, or failed: out of memory (or killed,
    as the OOM killer does) does not fit; any other failure is the workload's error. A fit is within the margin
    when its peak (on a GPU the reserved one, what the device gave) left the margin free."""
    peak = _peak(result, watch)
    if watch.over_cap or (watch.cap is not None and peak is not None and peak > watch.cap):
        when = ", seen live: the burst was stopped" if result.status == "stopped" else ""
        # In MiB on both sides: a peak just over a 1 GiB cap would read "1.00 GiB > 1.00 GiB" in GiB.
        return BatchTry(size, False, stage, "memory_cap", f"over the memory cap: {(peak or 0) / 2**20:,.0f} MiB > "
                        f"{(watch.cap or 0) / 2**20:,.0f} MiB{when}", peak_memory_bytes=peak)
    if result.status == "stopped":
        return BatchTry(size, False, stage, "stopped", "stopped before the end of the try", peak_memory_bytes=peak)
    if result.status in ("failed", "timeout") and result.error is not None:
        message = result.error.message
        if result.error.kind == "oom" or CPU_ALLOCATOR_FAILURE in message:
            return BatchTry(size, False, stage, "oom", f"out of memory: {message}", peak_memory_bytes=peak)
        kind: Failure = "crash" if result.error.kind == "crash" else "error"
        return BatchTry(size, False, stage, kind, message, peak_memory_bytes=peak)
    step = result.step_time
    reserved = peak_reserved_bytes(result)
    return BatchTry(size, True, stage, samples_per_s=result.samples_per_s, peak_memory_bytes=peak,
                    step_median_s=step.median if step else None, step_iqr_s=step.iqr if step else None,
                    reserved_bytes=reserved, within_margin=limits.within_margin(reserved or peak))


def _peak(result: BurstResult, watch: _Watch) -> int | None:
    """Most memory seen: on a CPU the ranks' peak RSS summed (they run side by side) or the live telemetry's,
    whichever is larger; on a GPU the busiest rank's allocator peak."""
    if result.memory_kind == "cuda_allocator":
        return result.peak_memory_bytes
    ranks = sum(r.peak_memory_bytes for r in result.ranks)
    return max(ranks, watch.peak) or None
