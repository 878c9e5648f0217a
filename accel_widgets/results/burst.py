"""What a burst measured: raw step and telemetry records, plus the outcomes derived from them.

A ``BurstResult`` stores only raw data (every step of every rank, every telemetry sample, one summary
per rank); its headline outcomes (throughput, step time, where the step went, peak memory, compile time, model
FLOP/s, whether it trained) are computed from it, so a result loaded back from JSON gives exactly the same numbers
as the live one, and ranks merge by concatenation. Every other reading is a function of a result, in the layer that
needs it: whether it can rank a knob (:mod:`.reliability`), how it used the machine
(:mod:`accel_widgets.analysis.usage`), how it compares (:mod:`accel_widgets.analysis.compare`), how it reads in
words (:mod:`accel_widgets.views.text`).
"""

from __future__ import annotations

import dataclasses
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
from ..metrics.stats import Summary, summarize

#: "diverged": the burst finished and has its numbers, but a loss went NaN/inf, so it did not train.
Status = Literal["ok", "diverged", "failed", "stopped", "timeout"]


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
    # What was read ("cuda:0", "cpu"), with its node on a cluster ("cuda:0 on 80c10889f6b4"): every reading of one
    # device, and only its, carries one name, which each reading of the telemetry (a line, an energy) groups by
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
    # The cluster node this reading is of (a Ray node id); "" on the caller's own machine
    node: str = ""


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
    # The cluster node the rank ran on (a Ray node id); "" on the caller's own machine
    node: str = ""
    # The time the rank's stepping thread ran or waited for a core over the window (Linux schedstat), not the time it
    # slept waiting for its peers in a collective or for data: under DDP the rank with the most sets everyone's pace
    busy_s: float | None = None


@dataclass(frozen=True)
class ErrorInfo:
    """Why a burst did not finish: the root-cause rank, its message and its own traceback."""

    kind: Literal["exception", "oom", "exit", "crash", "timeout", "stopped", "config", "diverged"]
    message: str
    rank: int | None = None
    traceback: str = ""


@dataclass
class BurstResult:
    """Everything one burst measured, and its headline outcomes as properties derived from the raw records; every
    other reading of it is a function elsewhere (the module's docstring says where)."""

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

    @property
    def data_wait_share(self) -> float | None:
        """Share of measured step time spent blocked on the data loader."""
        return _share(self.measured_steps(), "data_s")

    @property
    def h2d_share(self) -> float | None:
        """Share of measured step time spent copying batches to the device."""
        return _share(self.measured_steps(), "h2d_s")

    @property
    def compute_share(self) -> float | None:
        return _share(self.measured_steps(), "compute_s")

    @property
    def peak_memory_bytes(self) -> int | None:
        return max((r.peak_memory_bytes for r in self.ranks), default=None)

    @property
    def memory_kind(self) -> str | None:
        return self.ranks[0].memory_kind if self.ranks else None

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
    def code_paths(self) -> CodePaths | None:
        """The code paths the step ran, as rank 0 recorded them (None: not recorded, e.g. a result from before)."""
        return self.ranks[0].code_paths if self.ranks else None

    @property
    def stream(self) -> StreamReading | None:
        """How rank 0 read its stream (None: the data is map-style, or the result predates the record)."""
        return self.ranks[0].stream if self.ranks else None

    @property
    def cache(self) -> CacheInfo | None:
        """What rank 0's data cache did (None: the config caches nothing)."""
        return self.ranks[0].cache if self.ranks else None

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


def _share(steps: list[StepRecord], part: str) -> float | None:
    """The share of ``steps``' time that went to ``part`` (a step record's ``data_s``, ``h2d_s`` or ``compute_s``)."""
    total = sum(s.total_s for s in steps)
    return sum(getattr(s, part) for s in steps) / total if total > 0 else None


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


def _spell(value: float) -> str:
    return "NaN" if math.isnan(value) else "inf" if value > 0 else "-inf"


def _float_or_none(value: Any) -> float | None:
    """Inverse of :func:`_json_safe` for losses: "nan"/"inf" strings back to floats."""
    return None if value is None else float(value)
