"""Whether a burst's numbers can rank a knob, and whose load it shared the machine with while it measured.

Read from the burst's records alone (its step times and the telemetry of its measured window), so a result loaded
from JSON is judged exactly as the live one. It sits beside the records because a comparison
(:mod:`.comparison`) leaves a window whose machine was too busy out of its blocks: the reading a face shows and the
one that decides a block are this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..metrics.thresholds import THRESHOLDS
from .burst import BurstResult, TelemetrySample

#: Programs that draw web pages (as telemetry labels them): their load during a burst is usually a live view.
BROWSERS = frozenset({"chromium", "chrome", "google-chrome", "headless_shell", "firefox", "msedge", "brave", "opera",
                      "safari", "vivaldi"})


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


def reliability(result: BurstResult) -> Reliability:
    """Whether ``result``'s numbers can rank a knob: a step spread or other load past the thresholds says no. A run
    without measured steps has nothing to judge and no reasons."""
    step = result.step_time
    if step is None:
        return Reliability()
    reasons = []
    if step.n >= THRESHOLDS.min_steps_for_spread and step.relative_iqr >= THRESHOLDS.unreliable_relative_iqr:
        reasons.append(f"step times spread {step.relative_iqr:.0%} of their median (IQR "
                       f"{step.iqr * 1e3:.3g} ms around {step.median * 1e3:.3g} ms)")
    other = other_load_pct(result) or 0.0
    if other >= THRESHOLDS.unreliable_other_load_pct:
        reasons.append(f"other load took {other:.0f}% of the machine ({load_attribution(result)})")
    return Reliability(tuple(reasons))


def other_load_pct(result: BurstResult) -> float | None:
    """The share of the machine (%) that processes outside the measurement took while it measured: other programs'
    and the caller's; None where neither was read."""
    foreign, caller = foreign_cpu_pct(result), caller_cpu_pct(result)
    if foreign is None and caller is None:
        return None
    return (foreign or 0.0) + (caller or 0.0)


def foreign_cpu_pct(result: BurstResult) -> float | None:
    """Mean CPU share (of the machine) that processes other than the burst's and its caller's used while it
    measured: what :func:`other_processes` names."""
    gaps = [t.host_util_pct - workers - (t.caller_util_pct or 0.0) for t in result.measured_telemetry()
            if t.host_util_pct is not None and (workers := _workers_pct(t)) is not None]
    return max(0.0, sum(gaps) / len(gaps)) if gaps else None


def caller_cpu_pct(result: BurstResult) -> float | None:
    """Mean CPU share (of the machine) of the process that launched the burst while it measured: the event pump and
    telemetry, and in a notebook whatever else the kernel did meanwhile (a panel drawing the burst)."""
    values = [t.caller_util_pct for t in result.measured_telemetry() if t.caller_util_pct is not None]
    return sum(values) / len(values) if values else None


def other_processes(result: BurstResult) -> list[tuple[str, float]]:
    """Who else used the CPU while the burst measured: each program's mean use in % of one core, largest first
    (``[("chromium", 44.0), ("jupyter-server", 10.0)]``). Programs are read once a second, each reading covering the
    second before it: a shorter window takes the reading after it; empty where there is none."""
    readings = [t.other_processes for t in result.measured_telemetry() if t.other_processes is not None]
    window = result.measured_window()
    if not readings and window is not None:  # a window under a second: the reading that covers its end
        later = [t for t in result.telemetry if t.other_processes is not None and t.t >= window[1]]
        readings = [min(later, key=lambda t: t.t).other_processes] if later else []
    totals: dict[str, float] = {}
    for reading in readings:
        for program, pct in reading.items():
            totals[program] = totals.get(program, 0.0) + pct
    return sorted(((program, pct / len(readings)) for program, pct in totals.items()), key=lambda item: -item[1])


def load_attribution(result: BurstResult) -> str:
    """Whose CPU the burst shared, in words: the programs above the notice level, then the caller."""
    named = [f"{program} {pct:.0f}%" for program, pct in other_processes(result)
             if pct >= THRESHOLDS.process_notice_core_pct]
    parts = [", ".join(named) + " of a core"] if named else []
    cores = result.environment.get("cpu_count") or 1
    caller = caller_cpu_pct(result)
    if caller is not None:
        parts.append(f"the calling process {caller * cores:.0f}% of a core")
    return "; ".join(parts) or "not attributed"


def _workers_pct(sample: TelemetrySample) -> float | None:
    """The burst's own processes' share of the machine (psutil samples stored before it had a field of its own
    carry it as their utilisation)."""
    if sample.workers_util_pct is not None:
        return sample.workers_util_pct
    return sample.util_pct if sample.source == "psutil" else None
