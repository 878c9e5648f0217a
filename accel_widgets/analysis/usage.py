"""How a burst used the machine over its measured window, read from its records.

A :class:`~accel_widgets.results.burst.BurstResult` holds what the burst measured; what its records say about the
devices is read here, once, for every face: the table's cells, the diagnosis's findings and the summary all call
these functions, so they cannot disagree. The device's time (utilisation, and inside it what GPM saw the SMs and
tensor cores do), its model math against the GPUs' peaks (MFU), the memory the allocator held beyond the peak, the
host's CPUs (the loader's share, I/O wait), what reading the data cost, and the energy.

Each reading keeps to the measured window: setup, compile and warm-up would make every compiled run read idle.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

from ..metrics.energy import WindowEnergy, window_energy
from ..metrics.flops import peak_flops
from ..metrics.thresholds import THRESHOLDS
from ..results.burst import BurstResult, TelemetrySample

#: NVML's utilisation is the share of the past sample period a kernel ran, that period 1/6 s to 1 s by the
#: product: the longest is assumed, so a reading kept for the window never reaches back into warm-up.
NVML_UTILISATION_PERIOD_S = 1.0

#: NVML's GPM metrics a telemetry sample carries, each over the interval since its device's previous sample.
Activity = Literal["sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct"]
_ACTIVITY_NAMES: dict[Activity, str] = {"sm_active_pct": "SM active", "tensor_active_pct": "tensor cores active",
                                        "sm_occupancy_pct": "SM occupancy", "dram_bw_pct": "DRAM bandwidth"}


# -- the device's time ------------------------------------------------------------------------------------------------
def mean_utilisation_pct(result: BurstResult) -> float | None:
    """Mean device utilisation over the measured window (GPUs that do not report it left out); None when the window
    is too short to read NVML's trailing averages (:func:`utilisation_note` says so).

    GPU readings count from one averaging period into the window; the workers' CPU share (psutil) is a delta over
    the sampler's own tick, which the window already bounds."""
    if _utilisation_too_short(result):
        return None
    settled = [*_settled(result, NVML_UTILISATION_PERIOD_S, "nvml"), *_settled(result, 0.0, "psutil")]
    values = [t.util_pct for t in settled if t.util_pct is not None]
    return sum(values) / len(values) if values else None


def utilisation_note(result: BurstResult) -> str:
    """How :func:`mean_utilisation_pct` was read, or why it was not, then what GPM says of the chip inside that time
    (:func:`activity_text`): the table's hover, the diagnosis's and the summary's words."""
    window = result.measured_window()
    activity = f"; {text}" if (text := activity_text(result)) else ""
    if _utilisation_too_short(result) and window is not None:
        return (f"too short to read: NVML's utilisation averages the last {NVML_UTILISATION_PERIOD_S:g} s, and "
                f"the measured window is {window[1] - window[0]:.1f} s (measure at least "
                f"{THRESHOLDS.min_periods_per_window * NVML_UTILISATION_PERIOD_S:g} s){activity}")
    if mean_utilisation_pct(result) is None:
        return f"no utilisation readings in the measured window{activity}"
    if any(t.source == "nvml" for t in result.telemetry):
        return (f"NVML's readings taken at least {NVML_UTILISATION_PERIOD_S:g} s into the measured window "
                f"(each averages the time before it was read){activity}")
    return "the workers' CPU use as a share of the machine's cores (psutil)"


def mean_activity_pct(result: BurstResult, metric: Activity) -> float | None:
    """The mean of one GPM metric over the measured window, every GPU's readings together (``"sm_active_pct"``: the
    share of SMs busy, DCGM's "SM active"; ``"tensor_active_pct"``: low with high utilisation, the math runs off the
    tensor cores). Each reading covers the time since its device's previous sample, so it counts only when that
    whole interval lies in the window. None where the GPUs have no GPM (before Hopper, a MIG instance) or no interval
    fits the window."""
    window = result.measured_window()
    if window is None:
        return None
    devices: dict[str, list[TelemetrySample]] = {}
    for sample in result.telemetry:
        devices.setdefault(sample.device, []).append(sample)
    values = [value for samples in devices.values() for before, after in itertools.pairwise(samples)
              if (value := getattr(after, metric)) is not None and before.t >= window[0] and after.t <= window[1]]
    return sum(values) / len(values) if values else None


def activity_text(result: BurstResult) -> str:
    """``SM active 61%, tensor cores active 12%, SM occupancy 25%, DRAM bandwidth 35% (NVML GPM)``; "" without."""
    parts = [f"{name} {value:.0f}%" for metric, name in _ACTIVITY_NAMES.items()
             if (value := mean_activity_pct(result, metric)) is not None]
    return f"{', '.join(parts)} (NVML GPM)" if parts else ""


def _settled(result: BurstResult, period_s: float, source: str) -> list[TelemetrySample]:
    """The measured window's samples from ``source`` whose trailing average of ``period_s`` lies inside the window:
    read at least one period after it began (a reading averages the time before it was taken)."""
    window = result.measured_window()
    samples = [t for t in result.measured_telemetry() if t.source == source]
    return samples if window is None else [t for t in samples if t.t >= window[0] + period_s]


def _utilisation_too_short(result: BurstResult) -> bool:
    """A GPU reported utilisation, and the window is shorter than the threshold's number of NVML's periods."""
    nvml = any(t.source == "nvml" and t.util_pct is not None for t in result.measured_telemetry())
    window = result.measured_window()
    return nvml and window is not None and (
        window[1] - window[0] < THRESHOLDS.min_periods_per_window * NVML_UTILISATION_PERIOD_S)


# -- model math against the peaks -------------------------------------------------------------------------------------
def mfu(result: BurstResult) -> float | None:
    """Model FLOPs utilisation: the share of the measured time the GPUs would need at their dense peak, each FLOP at
    the peak of the math it ran in (:func:`mfu_basis`), ``sum(flops_i / peak_i) / time`` over the GPUs in use (the
    parallel knob's account: every visible GPU for DataParallel); None on a CPU, on a GPU not in the peak table, or
    for math without a peak.

    A result stored before FLOPs were counted per op charges all of them the matmuls' math."""
    achieved = result.achieved_flops_per_s
    gpus = result.facts.gpus if result.facts is not None else 0
    if achieved is None or result.environment.get("device_kind") != "cuda" or not gpus:
        return None
    shares = _flop_shares(result)
    device = str(result.environment.get("device_name", ""))
    peaks = [peak_flops(device, key.partition(":")[2]) for key in shares]
    if not all(peaks):
        return None
    busy = sum(achieved * share / (peak or math.inf) for share, peak in zip(shares.values(), peaks, strict=True))
    return busy / gpus


def mfu_basis(result: BurstResult) -> str:
    """Which math MFU charged the FLOPs at: "FLOPs: 98% convs in tf32, 2% matmuls in fp32"; "" without FLOPs."""
    shares = sorted(_flop_shares(result).items(), key=lambda item: -item[1])
    parts = [f"{share:.0%} {'ops' if op == 'all' else op + 's'} in {math_}"
             for (op, _, math_), share in ((key.partition(":"), share) for key, share in shares)]
    return f"FLOPs: {', '.join(parts)}" if parts else ""


def _flop_shares(result: BurstResult) -> dict[str, float]:
    """Each ``"<op class>:<math>"``'s share of the achieved FLOP/s, over every rank's counts."""
    rates: dict[str, float] = {}
    for r in result.ranks:
        if not r.flops_per_sample or r.measured_s <= 0:
            continue
        split = r.flops_by_math or ({f"all:{result.facts.math}": r.flops_per_sample} if result.facts else {})
        for key, flops in split.items():
            rates[key] = rates.get(key, 0.0) + flops * r.measured_samples / r.measured_s
    total = sum(rates.values())
    return {key: rate / total for key, rate in rates.items()} if total > 0 else {}


# -- memory beyond the peak -------------------------------------------------------------------------------------------
def peak_reserved_bytes(result: BurstResult) -> int | None:
    """The CUDA caching allocator's reserved peak on the busiest rank (the memory the device really held for the
    burst); None on a CPU or for a result recorded before it was."""
    reserved = [r.peak_reserved_bytes for r in result.ranks if r.peak_reserved_bytes is not None]
    return max(reserved) if reserved and len(reserved) == len(result.ranks) else None


def allocator_slack_share(result: BurstResult) -> float | None:
    """The share of the reserved peak the allocator never handed out at once: ``1 - allocated / reserved`` (peaks of
    the same rank, the worst rank's). Reserved memory that was never allocated at the same time is held in blocks too
    small or too scattered for what came next (fragmentation); expandable segments shrink it. None off CUDA."""
    shares = [1 - r.peak_memory_bytes / r.peak_reserved_bytes for r in result.ranks if r.peak_reserved_bytes]
    return max(shares) if shares and len(shares) == len(result.ranks) else None


def allocator_expandable(result: BurstResult) -> bool | None:
    """Whether every rank's CUDA allocator had expandable segments, read from the allocator itself (what the
    expandable_segments knob asked for, or a setting of the user's own): False when any rank's were fixed, None where
    no rank could say."""
    read = [r.allocator_expandable for r in result.ranks if r.allocator_expandable is not None]
    return all(read) if read else None


def model_state_bytes(result: BurstResult) -> int | None:
    """Parameters, gradients and optimizer state the busiest rank held: what FSDP divides by the ranks (DDP keeps all
    of it on every rank). Counted from the tensors, so on a CPU it shows what RSS hides under the heap's caching. None
    for a result recorded before it was."""
    counted = [r.model_state_bytes for r in result.ranks if r.model_state_bytes is not None]
    return max(counted) if counted and len(counted) == len(result.ranks) else None


# -- the host and the data --------------------------------------------------------------------------------------------
def loader_cpu_pct(result: BurstResult) -> float | None:
    """Mean share of the machine's CPU used by DataLoader worker processes over the measured window."""
    values = [t.loader_util_pct for t in result.measured_telemetry() if t.loader_util_pct is not None]
    return sum(values) / len(values) if values else None


def iowait_pct(result: BurstResult) -> float | None:
    """Mean share of the machine's CPU time spent waiting on I/O over the measured window."""
    values = [t.iowait_pct for t in result.measured_telemetry() if t.iowait_pct is not None]
    return sum(values) / len(values) if values else None


def read_amplification(result: BurstResult) -> float | None:
    """Items read from the stream per item trained on, over every rank (1.0: each item read once; 4.0: each read by
    four readers, three of which dropped it). None for map-style data or before any item was kept."""
    readings = [r.stream for r in result.ranks if r.stream is not None]
    kept = sum(reading.items_kept for reading in readings)
    return sum(reading.items_read for reading in readings) / kept if kept else None


# -- energy -----------------------------------------------------------------------------------------------------------
def energy(result: BurstResult) -> WindowEnergy:
    """The energy the burst's devices used over its measured window, per sample trained in it, and what that covers
    or why there is none (:func:`~accel_widgets.metrics.energy.window_energy`)."""
    return window_energy(result.telemetry, result.measured_window(),
                         samples=sum(s.samples for s in result.measured_steps()),
                         capability=result.environment.get("capability"))
