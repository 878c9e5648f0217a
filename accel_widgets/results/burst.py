"""What a burst measured: raw step and telemetry records, plus the statistics derived from them.

A ``BurstResult`` stores only raw data (every step of every rank, every telemetry sample, one summary
per rank); the headline numbers are computed from it, so a result loaded back from JSON gives exactly
the same numbers as the live one, and ranks merge by concatenation.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ..data.cache import CacheInfo
from ..data.streams import StreamReading
from ..knobs import CodePaths, Facts
from ..knobs.base import Part
from ..knobs.compiling import CompileReport
from ..knobs.config import Config
from ..metrics.energy import EnergyScope
from ..metrics.flops import peak_flops
from ..metrics.stats import Summary, summarize
from ..metrics.thresholds import THRESHOLDS

#: "diverged": the burst finished and has its numbers, but a loss went NaN/inf, so it did not train.
Status = Literal["ok", "diverged", "failed", "stopped", "timeout"]

#: NVML's utilisation is the share of the past sample period a kernel ran, that period 1/6 s to 1 s by the
#: product: the longest is assumed, so a reading kept for the window never reaches back into warm-up.
NVML_UTILISATION_PERIOD_S = 1.0


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step of one rank. Times in seconds; ``t`` is its end on the burst's clock."""

    rank: int
    step: int
    t: float
    data_s: float
    h2d_s: float
    compute_s: float
    total_s: float
    samples: int
    loss: float | None = None
    warmup: bool = False
    tokens: int | None = None  # real tokens (attention mask) this rank's step trained on, when known


#: Programs that draw web pages (as telemetry labels them): their load during a burst is usually a live view.
BROWSERS = frozenset({"chromium", "chrome", "google-chrome", "headless_shell", "firefox", "msedge", "brave", "opera",
                      "safari", "vivaldi"})

@dataclass(frozen=True)
class TelemetrySample:
    """Device (NVML) or host-process (psutil) reading on the burst's clock.

    ``util_pct`` is NVML's "a kernel was running" share for a GPU (None where the GPU does not report it:
    a MIG device), and the workers' CPU use as a share of the machine's cores for ``source="psutil"``: a
    busy signal, never an efficiency measure.
    ``host_util_pct`` is the whole machine's CPU use, every process included; ``workers_util_pct`` the burst's
    own processes' (ranks and loader workers), ``caller_util_pct`` the launching process's (the kernel: its
    event pump, this telemetry, a panel drawing the burst). What is left is load the burst did not cause,
    which makes its timings unreliable; once a second ``other_processes`` says whose it was (% of one core by
    program, e.g. ``{"chromium": 44.0, "jupyter-server": 10.0}``). Per-core use, I/O wait and the DataLoader
    workers' share tell "the loader is starved of cores" or "the disk is the limit".
    ``energy_j`` is the device's cumulative energy counter where it has one (NVML's total energy since the
    driver loaded; RAPL's packages since the sampler started), and ``energy_scope`` what the power and
    energy readings cover: "gpu" this GPU; "mig" a MIG instance, for which NVML's power is the whole GPU's,
    so no energy is derived from it; "cpu_package" RAPL's CPU packages, every process on them; None
    nothing (no counter readable, or a result stored before energy was measured).
    ``sm_active_pct``, ``sm_occupancy_pct``, ``tensor_active_pct`` and ``dram_bw_pct`` say how busy the chip was
    inside that time, where NVML has GPM metrics for it (Hopper and newer): each covers the interval since the
    device's previous sample. None elsewhere.
    """

    t: float
    source: Literal["nvml", "psutil"]
    util_pct: float | None
    mem_used_bytes: int
    device: str = ""
    mem_total_bytes: int | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    host_util_pct: float | None = None
    cpu_per_core_pct: list[float] | None = None
    iowait_pct: float | None = None
    loader_util_pct: float | None = None  # the ranks' DataLoader worker processes, % of the machine
    energy_j: float | None = None
    energy_scope: EnergyScope | None = None
    workers_util_pct: float | None = None  # the burst's ranks and loader workers, % of the machine
    caller_util_pct: float | None = None  # the process that launched the burst, % of the machine
    other_processes: dict[str, float] | None = None  # other programs' CPU since the last such reading, % of a core
    # NVML's GPM metrics (Hopper and newer) over the interval since the GPU's previous sample, in %: the share of SMs
    # busy, resident warps against the maximum, the tensor cores' busy share, DRAM bandwidth against its peak
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_bw_pct: float | None = None
    # Why NVML said the GPU's clocks were held below their maximum at this sample ("power cap", "thermal"...), the
    # reasons that slow a step; empty where none held them, None where not read
    clock_limits: tuple[str, ...] | None = None


#: What a rank is doing, as the launcher sees it: it starts, sets up (model, loader, process group), then
#: steps (warm-up first, then the measured window; waiting for data counts as stepping), then finishes
#: (profiling, FLOP counting).
PhaseName = Literal["starting", "setup", "step", "finishing"]


@dataclass(frozen=True)
class BurstPhase:
    """Rank ``rank`` entered ``phase`` at ``t`` (the burst's clock): sent to ``on_event`` on each change,
    so a progress display can say "starting" or "compiling" before the first step record exists."""

    t: float
    rank: int
    phase: PhaseName


@dataclass(frozen=True)
class OperatorTime:
    """One operator's share of a profiled step (times summed over the profiled steps, in ms)."""

    name: str
    calls: int
    self_cpu_ms: float
    self_device_ms: float


@dataclass(frozen=True)
class ProfileCapture:
    """A torch.profiler capture of a few steady-state steps, taken after the measured window.

    ``error`` says why the capture failed (CUPTI, out of memory while profiling); it then has no trace
    and no operators, and the burst's measurement, taken before it, stands.
    """

    steps: int
    trace_path: str  # Chrome trace JSON: opens in Perfetto (ui.perfetto.dev) or chrome://tracing
    top_operators: list[OperatorTime]
    error: str = ""


@dataclass(frozen=True)
class RankSummary:
    """What one rank measured about itself over its steady-state window, and what it saw its workload do: the code
    paths its step ran (``code_paths``: what a knob needs to act), whether its data differs between reads of the same
    item (``random_data``: random augmentation; None where it was not checked) and agrees between two reads under one
    key (``keyed_data``: its draws come from the generators each item's key sets, so its batches do not depend on
    the loader's workers; :mod:`~accel_widgets.data.keyed`), how it read a stream (``stream``),
    what its data cache did (``cache``: built or reused, and whether it froze random augmentation) and what
    torch.compile did in its steps (``compile_report``: None where nothing was compiled, or before it was recorded).
    """

    rank: int
    measured_samples: int
    measured_s: float
    peak_memory_bytes: int
    memory_kind: Literal["cuda_allocator", "rss"]
    setup_s: float
    first_step_s: float
    device: str
    scaler_skipped_steps: int | None = None  # fp16: optimizer steps GradScaler skipped (inf/NaN grads)
    flops_per_sample: float | None = None  # training FLOPs (forward + backward) per sample
    profile: ProfileCapture | None = None
    measured_tokens: int | None = None  # real tokens over the window, when batches carry an attention mask
    # flops_per_sample split by "<op class>:<math>" ("conv:tf32", "matmul:fp32"): MFU's peak per FLOP
    flops_by_math: dict[str, float] | None = None
    code_paths: CodePaths | None = None
    random_data: bool | None = None
    stream: StreamReading | None = None
    cache: CacheInfo | None = None
    # CUDA only: the caching allocator's peak of reserved memory over the window (allocated or held for reuse)
    peak_reserved_bytes: int | None = None
    # parameters, a gradient per trainable one and the optimizer's state this rank held (its shards under FSDP)
    model_state_bytes: int | None = None
    compile_report: CompileReport | None = None
    # CUDA only: whether the caching allocator's segments were expandable, as its snapshot said (None: no CUDA, no
    # segment, or a result recorded before it was read)
    allocator_expandable: bool | None = None
    keyed_data: bool | None = None


@dataclass(frozen=True)
class Reliability:
    """Whether a run's numbers can rank a knob. Step times that spread past half their median, or a machine
    shared with other load past a quarter of its CPU (:mod:`~accel_widgets.metrics.thresholds`), measure the neighbours
    as much as the knob: such a run is marked, kept out of rankings and offered a re-measure against its baseline.
    ``reasons`` say why, with the numbers; none means reliable."""

    reasons: tuple[str, ...] = ()

    @property
    def reliable(self) -> bool:
        return not self.reasons

    def text(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True)
class ErrorInfo:
    """Why a burst did not finish: the root-cause rank, its message and its own traceback."""

    kind: Literal["exception", "oom", "exit", "crash", "timeout", "stopped", "config", "diverged"]
    message: str
    rank: int | None = None
    traceback: str = ""


@dataclass
class BurstResult:
    """Everything one burst measured. Numbers are properties derived from the raw records."""

    workload: str
    config: Config
    status: Status
    world_size: int = 1
    warmup_steps: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    telemetry: list[TelemetrySample] = field(default_factory=list)
    ranks: list[RankSummary] = field(default_factory=list)
    tokens_per_sample: int | None = None
    time_to_first_step_s: float | None = None
    wall_s: float = 0.0
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: ErrorInfo | None = None
    label: str = ""
    facts: Facts | None = None  # how the knob owners said the burst runs (None: it never got that far)
    freed: Part | None = None  # the part of the step this headspace burst made free (None: the config as it is)

    # -- derived numbers ------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        """Finished with finite losses: a valid measurement. A "diverged" run keeps its numbers but is not ok,
        because a loop that no longer trains is no speed-up (no baseline, no tuner pick, CLI exit code 1)."""
        return self.status == "ok"

    def measured_steps(self, rank: int | None = None) -> list[StepRecord]:
        return [s for s in self.steps if not s.warmup and (rank is None or s.rank == rank)]

    @property
    def batch_size(self) -> int | None:
        """Samples per micro-batch on one rank, as the burst trained them: a step's samples over its micro-batches
        (None before a step, or without the owners' facts)."""
        first = next((s for s in self.steps if s.rank == 0), None)
        if first is None or self.facts is None:
            return None
        return first.samples // self.facts.micro_batches

    @property
    def samples_per_s(self) -> float | None:
        """Steady-state throughput summed over ranks (each rank: its samples over its own window)."""
        rates = [r.measured_samples / r.measured_s for r in self.ranks if r.measured_s > 0]
        return sum(rates) if rates and len(rates) == len(self.ranks) else None

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second summed over ranks: the real tokens counted from attention masks when every
        rank has them, else samples/s times the workload's ``tokens_per_sample``."""
        counted = [r.measured_tokens / r.measured_s for r in self.ranks if r.measured_tokens and r.measured_s > 0]
        if counted and len(counted) == len(self.ranks):
            return sum(counted)
        rate = self.samples_per_s
        return rate * self.tokens_per_sample if rate is not None and self.tokens_per_sample else None

    def step_times(self) -> list[float]:
        """Per-step time of the group: the slowest rank's time at each measured step."""
        slowest: dict[int, float] = {}
        for s in self.measured_steps():
            slowest[s.step] = max(slowest.get(s.step, 0.0), s.total_s)
        return [slowest[k] for k in sorted(slowest)]

    @property
    def step_time(self) -> Summary | None:
        times = self.step_times()
        return summarize(times) if times else None

    def _share(self, attribute: str) -> float | None:
        measured = self.measured_steps()
        total = sum(s.total_s for s in measured)
        return sum(getattr(s, attribute) for s in measured) / total if total > 0 else None

    @property
    def data_wait_share(self) -> float | None:
        """Share of measured step time spent blocked on the data loader."""
        return self._share("data_s")

    @property
    def h2d_share(self) -> float | None:
        """Share of measured step time spent copying batches to the device."""
        return self._share("h2d_s")

    @property
    def compute_share(self) -> float | None:
        return self._share("compute_s")

    @property
    def peak_memory_bytes(self) -> int | None:
        return max((r.peak_memory_bytes for r in self.ranks), default=None)

    @property
    def memory_kind(self) -> str | None:
        return self.ranks[0].memory_kind if self.ranks else None

    @property
    def peak_reserved_bytes(self) -> int | None:
        """The CUDA caching allocator's reserved peak on the busiest rank (the memory the device really held for the
        burst); None on a CPU or for a result recorded before it was."""
        reserved = [r.peak_reserved_bytes for r in self.ranks if r.peak_reserved_bytes is not None]
        return max(reserved) if reserved and len(reserved) == len(self.ranks) else None

    @property
    def model_state_bytes(self) -> int | None:
        """Parameters, gradients and optimizer state the busiest rank held: what FSDP divides by the ranks (DDP keeps
        all of it on every rank). Counted from the tensors, so on a CPU it shows what RSS hides under the heap's
        caching. None for a result recorded before it was."""
        counted = [r.model_state_bytes for r in self.ranks if r.model_state_bytes is not None]
        return max(counted) if counted and len(counted) == len(self.ranks) else None

    @property
    def allocator_expandable(self) -> bool | None:
        """Whether every rank's CUDA allocator had expandable segments, read from the allocator itself (what the
        expandable_segments knob asked for, or a setting of the user's own): False when any rank's were fixed, None
        where no rank could say."""
        read = [r.allocator_expandable for r in self.ranks if r.allocator_expandable is not None]
        return all(read) if read else None

    @property
    def allocator_slack_share(self) -> float | None:
        """The share of the reserved peak the allocator never handed out at once: ``1 - allocated / reserved`` (peaks
        of the same rank). Reserved memory that was never allocated at the same time is held in blocks too small or
        too scattered for what came next (fragmentation); expandable segments shrink it. None off CUDA."""
        shares = [1 - r.peak_memory_bytes / r.peak_reserved_bytes for r in self.ranks if r.peak_reserved_bytes]
        return max(shares) if shares and len(shares) == len(self.ranks) else None

    @property
    def first_step_s(self) -> float | None:
        return max((r.first_step_s for r in self.ranks), default=None)

    @property
    def compile_s(self) -> float | None:
        """Extra time of the first step over a steady step: what compiling cost (compiled runs only)."""
        if self.facts is None or not self.facts.compiled or self.first_step_s is None or self.step_time is None:
            return None
        return max(0.0, self.first_step_s - self.step_time.median)

    @property
    def compile_report(self) -> CompileReport | None:
        """What torch.compile did, over the ranks (:meth:`CompileReport.merged`); None where nothing was compiled."""
        return CompileReport.merged([r.compile_report for r in self.ranks if r.compile_report is not None])

    def losses(self, rank: int = 0) -> list[float | None]:
        return [s.loss for s in self.steps if s.rank == rank]

    def nonfinite_losses(self) -> list[str]:
        """One line per rank whose loss went NaN/inf: the first such step, and how many steps followed suit."""
        lines = []
        for rank in sorted({s.rank for s in self.steps}):
            losses = [(s.step, s.loss) for s in self.steps if s.rank == rank and s.loss is not None]
            bad = [(step, loss) for step, loss in losses if not math.isfinite(loss)]
            if bad:
                where = f" on rank {rank}" if self.world_size > 1 else ""
                first_step, first_loss = bad[0]
                lines.append(f"loss is {_spell(first_loss)} from step {first_step}{where} "
                             f"({len(bad)} of {len(losses)} steps not finite)")
        return lines

    def divergence(self) -> ErrorInfo | None:
        """Why a finished burst did not train (status "diverged"), or None while every loss is finite."""
        lines = self.nonfinite_losses()
        if not lines:
            return None
        first_bad = min((s for s in self.steps if s.loss is not None and not math.isfinite(s.loss)),
                        key=lambda s: (s.step, s.rank))
        message = (f"{'; '.join(lines)}: training diverged. The throughput was measured, but a run that does not "
                   "train is no valid speed-up: check the learning rate, the precision (fp16 overflows past "
                   "65504) and the data for NaN/inf.")
        return ErrorInfo("diverged", message, first_bad.rank if self.world_size > 1 else None)

    def measured_window(self) -> tuple[float, float] | None:
        """The steady-state window on the burst clock, over all ranks: from the start of the first measured
        step (its end ``t`` less its ``total_s``) to the end of the last; None without a measured step."""
        measured = self.measured_steps()
        if not measured:
            return None
        return min(s.t - s.total_s for s in measured), max(s.t for s in measured)

    def measured_telemetry(self) -> list[TelemetrySample]:
        """The telemetry taken while the measured steps ran. Setup, compile and warm-up are left out: a
        25 s compile would otherwise make every compiled run read "low utilisation". All of it when the
        burst has no measured step (it failed early), since that is all there is to read."""
        window = self.measured_window()
        if window is None:
            return list(self.telemetry)
        start, end = window
        return [t for t in self.telemetry if start <= t.t <= end]

    def settled_telemetry(self, period_s: float, source: str = "nvml") -> list[TelemetrySample]:
        """The measured window's samples from ``source`` whose trailing average of ``period_s`` lies inside the
        window: read at least one period after it began (a reading averages the time before it was taken)."""
        window = self.measured_window()
        samples = [t for t in self.measured_telemetry() if t.source == source]
        return samples if window is None else [t for t in samples if t.t >= window[0] + period_s]

    def too_short_for(self, period_s: float) -> bool:
        """Whether the measured window is shorter than the threshold's number of averaging periods."""
        window = self.measured_window()
        return window is not None and window[1] - window[0] < THRESHOLDS.min_periods_per_window * period_s

    @property
    def mean_utilisation_pct(self) -> float | None:
        """Mean device utilisation over the measured window (GPUs that do not report it left out); None when
        the window is too short to read NVML's trailing averages (:attr:`utilisation_note` says so).

        GPU readings count from one averaging period into the window; the workers' CPU share (psutil) is
        a delta over the sampler's own tick, which the window already bounds."""
        if self._utilisation_too_short():
            return None
        gpus = self.settled_telemetry(NVML_UTILISATION_PERIOD_S)
        values = [t.util_pct for t in [*gpus, *self.settled_telemetry(0.0, "psutil")] if t.util_pct is not None]
        return sum(values) / len(values) if values else None

    @property
    def utilisation_note(self) -> str:
        """How :attr:`mean_utilisation_pct` was read, or why it was not, then what GPM says of the chip inside that
        time (:meth:`activity_text`): the table's hover and the summary's line."""
        window = self.measured_window()
        activity = f"; {text}" if (text := self.activity_text()) else ""
        if self._utilisation_too_short() and window is not None:
            return (f"too short to read: NVML's utilisation averages the last {NVML_UTILISATION_PERIOD_S:g} s, and "
                    f"the measured window is {window[1] - window[0]:.1f} s (measure at least "
                    f"{THRESHOLDS.min_periods_per_window * NVML_UTILISATION_PERIOD_S:g} s){activity}")
        if self.mean_utilisation_pct is None:
            return f"no utilisation readings in the measured window{activity}"
        if any(t.source == "nvml" for t in self.telemetry):
            return (f"NVML's readings taken at least {NVML_UTILISATION_PERIOD_S:g} s into the measured window "
                    f"(each averages the time before it was read){activity}")
        return "the workers' CPU use as a share of the machine's cores (psutil)"

    def mean_activity_pct(self, field: str) -> float | None:
        """The mean of one GPM metric (``"sm_active_pct"``, ``"sm_occupancy_pct"``, ``"tensor_active_pct"``,
        ``"dram_bw_pct"``) over the measured window, every GPU's readings together: each reading covers the time
        since its device's previous sample, so a reading counts only when that whole interval lies in the window.
        None where the GPUs have no GPM (before Hopper, a MIG instance) or no interval fits the window."""
        window = self.measured_window()
        if window is None:
            return None
        values = [value for samples in _by_device(self.telemetry).values()
                  for before, after in itertools.pairwise(samples)
                  if (value := getattr(after, field)) is not None and before.t >= window[0] and after.t <= window[1]]
        return sum(values) / len(values) if values else None

    @property
    def mean_sm_active_pct(self) -> float | None:
        """The share of the GPUs' SMs busy over the measured window (GPM; DCGM's "SM active")."""
        return self.mean_activity_pct("sm_active_pct")

    @property
    def mean_tensor_active_pct(self) -> float | None:
        """The share of the measured window the tensor cores were busy (GPM): low with high utilisation, the math
        runs off them (fp32, or elementwise work)."""
        return self.mean_activity_pct("tensor_active_pct")

    def activity_text(self) -> str:
        """``SM active 61%, tensor cores active 12%, SM occupancy 25%, DRAM bandwidth 35% (NVML GPM)``; "" without."""
        named = (("SM active", "sm_active_pct"), ("tensor cores active", "tensor_active_pct"),
                 ("SM occupancy", "sm_occupancy_pct"), ("DRAM bandwidth", "dram_bw_pct"))
        parts = [f"{name} {value:.0f}%" for name, field in named
                 if (value := self.mean_activity_pct(field)) is not None]
        return f"{', '.join(parts)} (NVML GPM)" if parts else ""

    def _utilisation_too_short(self) -> bool:
        nvml = any(t.source == "nvml" and t.util_pct is not None for t in self.measured_telemetry())
        return nvml and self.too_short_for(NVML_UTILISATION_PERIOD_S)

    @property
    def profile(self) -> ProfileCapture | None:
        """Rank 0's profiler capture, when the burst was run with ``profile_steps``."""
        return self.ranks[0].profile if self.ranks else None

    @property
    def achieved_flops_per_s(self) -> float | None:
        """Model FLOP/s actually sustained, summed over ranks (forward + backward matmuls/convs)."""
        rates = [r.flops_per_sample * r.measured_samples / r.measured_s for r in self.ranks
                 if r.flops_per_sample and r.measured_s > 0]
        return sum(rates) if rates and len(rates) == len(self.ranks) else None

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: the share of the measured time the GPUs would need at their dense peak,
        each FLOP at the peak of the math it ran in (:attr:`mfu_basis`), ``sum(flops_i / peak_i) / time``
        over the GPUs in use; None on a CPU, on a GPU not in the peak table, or for math without a peak.

        A result stored before FLOPs were counted per op charges all of them the matmuls' math."""
        achieved = self.achieved_flops_per_s
        if achieved is None or self.environment.get("device_kind") != "cuda":
            return None
        shares = self._flop_shares()
        device = str(self.environment.get("device_name", ""))
        peaks = [peak_flops(device, key.partition(":")[2]) for key in shares]
        if not all(peaks):
            return None
        busy = sum(achieved * share / (peak or math.inf) for share, peak in zip(shares.values(), peaks, strict=True))
        return busy / self.gpus_used if self.gpus_used else None

    @property
    def mfu_basis(self) -> str:
        """Which math MFU charged the FLOPs at: "FLOPs: 98% convs in tf32, 2% matmuls in fp32"; "" without FLOPs."""
        shares = sorted(self._flop_shares().items(), key=lambda item: -item[1])
        parts = [f"{share:.0%} {'ops' if op == 'all' else op + 's'} in {math_}"
                 for (op, _, math_), share in ((key.partition(":"), share) for key, share in shares)]
        return f"FLOPs: {', '.join(parts)}" if parts else ""

    def _flop_shares(self) -> dict[str, float]:
        """Each ``"<op class>:<math>"``'s share of the achieved FLOP/s, over every rank's counts."""
        rates: dict[str, float] = {}
        for r in self.ranks:
            if not r.flops_per_sample or r.measured_s <= 0:
                continue
            split = r.flops_by_math or ({f"all:{self.facts.math}": r.flops_per_sample} if self.facts else {})
            for key, flops in split.items():
                rates[key] = rates.get(key, 0.0) + flops * r.measured_samples / r.measured_s
        total = sum(rates.values())
        return {key: rate / total for key, rate in rates.items()} if total > 0 else {}

    @property
    def gpus_used(self) -> int:
        """GPUs the burst trained on (the parallel knob's account: every visible GPU for DataParallel)."""
        return self.facts.gpus if self.facts is not None else 0

    @property
    def code_paths(self) -> CodePaths | None:
        """The code paths the step ran, as rank 0 recorded them (None: not recorded, e.g. a result from before)."""
        return self.ranks[0].code_paths if self.ranks else None

    @property
    def random_data(self) -> bool | None:
        """Whether two reads of the same item differ (random augmentation), as rank 0 found; None: not checked."""
        return self.ranks[0].random_data if self.ranks else None

    @property
    def keyed_data(self) -> bool | None:
        """Whether two reads of an item under one key agree (its draws keyed to the item, so the batches do not
        depend on the loader's workers), as rank 0 found; None: not checked (a result from before keys)."""
        return self.ranks[0].keyed_data if self.ranks else None

    @property
    def stream(self) -> StreamReading | None:
        """How rank 0 read its stream (None: the data is map-style, or the result predates the record)."""
        return self.ranks[0].stream if self.ranks else None

    @property
    def cache(self) -> CacheInfo | None:
        """What rank 0's data cache did (None: the config caches nothing)."""
        return self.ranks[0].cache if self.ranks else None

    @property
    def read_amplification(self) -> float | None:
        """Items read from the stream per item trained on, over every rank (1.0: each item read once; 4.0: each
        read by four readers, three of which dropped it). None for map-style data or before any item was kept."""
        readings = [r.stream for r in self.ranks if r.stream is not None]
        kept = sum(reading.items_kept for reading in readings)
        return sum(reading.items_read for reading in readings) / kept if kept else None

    @property
    def loader_cpu_pct(self) -> float | None:
        """Mean share of the machine's CPU used by DataLoader worker processes over the measured window."""
        values = [t.loader_util_pct for t in self.measured_telemetry() if t.loader_util_pct is not None]
        return sum(values) / len(values) if values else None

    @property
    def iowait_pct(self) -> float | None:
        """Mean share of the machine's CPU time spent waiting on I/O over the measured window."""
        values = [t.iowait_pct for t in self.measured_telemetry() if t.iowait_pct is not None]
        return sum(values) / len(values) if values else None

    @property
    def foreign_cpu_pct(self) -> float | None:
        """Mean CPU share (of the machine) that processes other than the burst's and its caller's used while it
        measured: what :meth:`other_processes` names."""
        gaps = [t.host_util_pct - workers - (t.caller_util_pct or 0.0) for t in self.measured_telemetry()
                if t.host_util_pct is not None and (workers := _workers_pct(t)) is not None]
        return max(0.0, sum(gaps) / len(gaps)) if gaps else None

    @property
    def caller_cpu_pct(self) -> float | None:
        """Mean CPU share (of the machine) of the process that launched the burst while it measured: the event
        pump and telemetry, and in a notebook whatever else the kernel did meanwhile (a panel drawing the burst)."""
        values = [t.caller_util_pct for t in self.measured_telemetry() if t.caller_util_pct is not None]
        return sum(values) / len(values) if values else None

    def other_processes(self) -> list[tuple[str, float]]:
        """Who else used the CPU while the burst measured: each program's mean use in % of one core, largest
        first (``[("chromium", 44.0), ("jupyter-server", 10.0)]``). Programs are read once a second, each reading
        covering the second before it: a shorter window takes the reading after it; empty where there is none."""
        readings = [t.other_processes for t in self.measured_telemetry() if t.other_processes is not None]
        window = self.measured_window()
        if not readings and window is not None:  # a window under a second: the reading that covers its end
            later = [t for t in self.telemetry if t.other_processes is not None and t.t >= window[1]]
            readings = [min(later, key=lambda t: t.t).other_processes] if later else []
        totals: dict[str, float] = {}
        for reading in readings:
            for program, pct in reading.items():
                totals[program] = totals.get(program, 0.0) + pct
        return sorted(((program, pct / len(readings)) for program, pct in totals.items()), key=lambda item: -item[1])

    @property
    def reliability(self) -> Reliability:
        """Whether this run's numbers can rank a knob (:class:`Reliability`): a step spread or other load past
        the thresholds says no. A run without measured steps has nothing to judge and no reasons."""
        step = self.step_time
        reasons = []
        if step is not None and step.n >= THRESHOLDS.min_steps_for_spread and (
                step.relative_iqr >= THRESHOLDS.unreliable_relative_iqr):
            reasons.append(f"step times spread {step.relative_iqr:.0%} of their median (IQR "
                           f"{step.iqr * 1e3:.3g} ms around {step.median * 1e3:.3g} ms)")
        other = (self.foreign_cpu_pct or 0.0) + (self.caller_cpu_pct or 0.0)
        if step is not None and other >= THRESHOLDS.unreliable_other_load_pct:
            reasons.append(f"other load took {other:.0f}% of the machine ({self.load_attribution()})")
        return Reliability(tuple(reasons))

    def load_attribution(self) -> str:
        """Whose CPU the burst shared, in words: the programs above the notice level, then the caller."""
        named = [f"{program} {pct:.0f}%" for program, pct in self.other_processes()
                 if pct >= THRESHOLDS.process_notice_core_pct]
        parts = [", ".join(named) + " of a core"] if named else []
        cores = self.environment.get("cpu_count") or 1
        if self.caller_cpu_pct is not None:
            parts.append(f"the calling process {self.caller_cpu_pct * cores:.0f}% of a core")
        return "; ".join(parts) or "not attributed"

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["config"] = self.config.to_dict()
        return _json_safe(data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BurstResult:
        data = dict(data)
        data["config"] = Config.from_dict(data["config"])
        data["steps"] = [StepRecord(**{**s, "loss": _float_or_none(s.get("loss"))}) for s in data.get("steps", [])]
        data["telemetry"] = [TelemetrySample(**t) for t in data.get("telemetry", [])]
        data["ranks"] = [_rank_from_dict(r) for r in data.get("ranks", [])]
        data["error"] = ErrorInfo(**data["error"]) if data.get("error") else None
        data["facts"] = Facts(**data["facts"]) if data.get("facts") else None
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> BurstResult:
        return cls.from_dict(json.loads(text))


def _json_safe(value: Any) -> Any:
    """Spell NaN/inf (a diverged loss) as strings: strict JSON (and the browser) has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _rank_from_dict(data: dict[str, Any]) -> RankSummary:
    profile = data.get("profile")
    if profile is not None:
        operators = [OperatorTime(**o) for o in profile["top_operators"]]
        data = {**data, "profile": ProfileCapture(profile["steps"], profile["trace_path"], operators,
                                                  profile.get("error", ""))}
    if data.get("code_paths") is not None:
        data = {**data, "code_paths": CodePaths(**data["code_paths"])}
    if data.get("stream") is not None:
        data = {**data, "stream": StreamReading(**data["stream"])}
    if data.get("cache") is not None:
        data = {**data, "cache": CacheInfo(**data["cache"])}
    if data.get("compile_report") is not None:
        data = {**data, "compile_report": CompileReport.from_dict(data["compile_report"])}
    return RankSummary(**data)


def _workers_pct(sample: TelemetrySample) -> float | None:
    """The burst's own processes' share of the machine (psutil samples stored before it had a field of its own
    carry it as their utilisation)."""
    if sample.workers_util_pct is not None:
        return sample.workers_util_pct
    return sample.util_pct if sample.source == "psutil" else None


def _by_device(samples: list[TelemetrySample]) -> dict[str, list[TelemetrySample]]:
    groups: dict[str, list[TelemetrySample]] = {}
    for sample in samples:
        groups.setdefault(sample.device, []).append(sample)
    return groups


def _spell(value: float) -> str:
    return "NaN" if math.isnan(value) else "inf" if value > 0 else "-inf"


def _float_or_none(value: Any) -> float | None:
    """Inverse of :func:`_json_safe` for losses: "nan"/"inf" strings back to floats."""
    return None if value is None else float(value)
