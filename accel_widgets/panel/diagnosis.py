"""A plain-language reading of one burst: where its time went and which knob to try next.

The rules are the classic rules of thumb for a healthy training step (device busy > 80% of the time,
memory < 90% of the device, host-to-device copies < 10% of the step, compute > 70% of it), plus what a
short burst on a shared machine can get wrong (noise, other processes). They are deliberately simple:
each finding quotes the number it read, so the user can judge it, and names at most one knob from
the registry, so the panel can point at the control. Pure functions over a ``BurstResult``: no
widgets, no engine, testable with synthetic results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..knobs import KNOBS
from ..results import BurstResult

Severity = Literal["warn", "info", "good"]

UTIL_OK_PCT = 80.0
MEMORY_HEADROOM_SHARE = 0.90
H2D_MAX_SHARE = 0.10
COMPUTE_OK_SHARE = 0.70
DATA_WAIT_NOTICE_SHARE = 0.05
DATA_WAIT_BOUND_SHARE = 0.10
FOREIGN_CPU_NOTICE_PCT = 10.0
SHORT_STEP_S = 0.010
LOW_UTIL_PCT = 50.0

_ORDER: dict[Severity, int] = {"warn": 0, "info": 1, "good": 2}


@dataclass(frozen=True)
class Finding:
    """One reading: a short title, the numbers behind it, and the knob worth trying next (if any)."""

    severity: Severity
    title: str
    detail: str
    knob: str | None = None

    def __post_init__(self) -> None:
        if self.knob is not None:
            KNOBS[self.knob]  # a typo in a rule must fail loudly, not point the user at nothing


def diagnose(result: BurstResult) -> list[Finding]:
    """Findings for one burst, most urgent first (warnings, then notes, then what is already fine)."""
    findings = _outcome(result)
    if result.measured_steps():
        findings += _reliability(result)
        findings += _data(result)
        findings += _device(result)
        findings += _memory(result)
    findings += [Finding("warn", "Engine warning", warning) for warning in result.warnings]
    return sorted(findings, key=lambda f: _ORDER[f.severity])


# -- outcome --------------------------------------------------------------------------------------
def _outcome(result: BurstResult) -> list[Finding]:
    """Why a burst has no (or only partial) numbers, and what usually fixes it."""
    error = result.error
    if result.ok or error is None:
        return []
    first_line = error.message.strip().splitlines()[0] if error.message.strip() else error.kind
    if result.status == "stopped":
        steps = len(result.measured_steps())
        return [Finding("info", "Stopped early", f"{steps} measured steps before Stop; numbers cover those only.")]
    if error.kind == "oom":
        return [Finding("warn", "Out of memory", f"{first_line} Lower batch_size, or keep the effective batch "
                        "with grad_accum_steps.", "batch_size")]
    if error.kind == "crash":
        return [Finding("warn", "Worker crashed", first_line, "batch_size")]
    if error.kind == "timeout":
        return [Finding("warn", "Timed out", first_line)]
    return [Finding("warn", "Burst failed", first_line)]


# -- can the numbers be trusted -------------------------------------------------------------------
def _reliability(result: BurstResult) -> list[Finding]:
    step = result.step_time
    foreign = result.foreign_cpu_pct
    busy = foreign is not None and foreign >= FOREIGN_CPU_NOTICE_PCT
    load = f"other processes used ~{foreign:.0f}% of the CPU during the burst" if busy else ""
    if step is not None and step.noisy:
        if step.n < 4:
            detail = f"only {step.n} measured steps: run a longer burst before trusting the median."
        elif busy:
            detail = f"IQR is {step.relative_iqr:.0%} of the median step and {load}: re-run when the machine is quiet."
        else:
            detail = (f"IQR is {step.relative_iqr:.0%} of the median step: re-run, the machine is probably busy "
                      "(on a few cores, one busy core stalls every intra-op thread).")
        return [Finding("warn", "Noisy step times", detail)]
    if busy:
        return [Finding("info", "Machine busy", f"{load}: the steps look stable, but compare runs only when the "
                        "machine is quiet.")]
    return []


# -- data pipeline ---------------------------------------------------------------------------------
def _data(result: BurstResult) -> list[Finding]:
    findings = []
    wait, h2d = result.data_wait_share, result.h2d_share
    if wait is not None and wait >= DATA_WAIT_NOTICE_SHARE:
        findings.append(_data_wait(result, wait))
    if h2d is not None and h2d >= H2D_MAX_SHARE:
        knob = "non_blocking" if result.config.pin_memory else "pin_memory"
        findings.append(Finding("warn", "Host-to-device copies are slow",
                                f"copies take {h2d:.0%} of the step (rule of thumb: < 10%): pin host memory and "
                                "copy with non_blocking so copies overlap compute.", knob))
    return findings


def _data_wait(result: BurstResult, wait: float) -> Finding:
    """Data wait: the loop sits idle while the loader produces the next batch."""
    config = result.config
    severity: Severity = "warn" if wait >= DATA_WAIT_BOUND_SHARE else "info"
    title = "Data-bound" if severity == "warn" else "Some data wait"
    head = f"{wait:.0%} of the step waits on the data loader"
    if config.num_workers == 0:
        return Finding(severity, title, f"{head}, and every item is prepared on the training thread: "
                       "add DataLoader workers.", "num_workers")
    if config.data_cache == "none":
        return Finding(severity, title, f"{head} even with {config.num_workers} workers: cache the prepared "
                       "items (memory or memmap) or prefetch deeper.", "data_cache")
    return Finding(severity, title, f"{head} with {config.num_workers} workers and a {config.data_cache} cache: "
                   "prefetch deeper, or the cores are simply too few for the loader and the model.",
                   "prefetch_factor")


# -- the device ------------------------------------------------------------------------------------
def _device(result: BurstResult) -> list[Finding]:
    util = result.mean_utilisation_pct
    compute = result.compute_share
    step = result.step_time
    findings = []
    what = "GPU" if any(t.source == "nvml" for t in result.telemetry) else "worker CPU"
    if util is not None and util < UTIL_OK_PCT:
        if step is not None and step.median < SHORT_STEP_S and util < LOW_UTIL_PCT:
            findings.append(Finding("warn", "Low utilisation, fast steps",
                                    f"{what} at {util:.0f}% with {step.median * 1e3:.1f} ms steps: per-step "
                                    "overhead dominates. A larger batch amortises it.", "batch_size"))
        elif result.config.sync_every == 1 and what == "GPU":
            findings.append(Finding("warn", "Possibly sync-bound",
                                    f"GPU busy {util:.0f}% (rule of thumb: > 80%) while the loss is read every "
                                    "step: each read makes the host wait for the GPU.", "sync_every"))
        else:
            findings.append(Finding("info", "Utilisation below 80%",
                                    f"{what} at {util:.0f}%: look at the data wait and the step "
                                    "breakdown for where the rest goes."))
    elif util is not None:
        findings.append(Finding("good", "Device kept busy", f"{what} at {util:.0f}% (rule of thumb: > 80%)."))
    if compute is not None and compute >= COMPUTE_OK_SHARE:
        findings.append(_compute_bound(result, compute))
    return findings


def _compute_bound(result: BurstResult, compute: float) -> Finding:
    """Compute dominates: the remaining levers make the math itself cheaper."""
    config = result.config
    head = f"compute is {compute:.0%} of the step (rule of thumb: > 70%)"
    if config.precision == "fp32":
        return Finding("good", "Compute-bound", f"{head}: try mixed precision (bf16).", "precision")
    if config.compile_mode == "off":
        return Finding("good", "Compute-bound", f"{head}: try torch.compile to fuse kernels.", "compile_mode")
    if not config.channels_last:
        return Finding("good", "Compute-bound", f"{head}: for convolutional models try channels_last.",
                       "channels_last")
    return Finding("good", "Compute-bound", f"{head}: the classic knobs are on; a bigger batch or device is next.")


# -- memory ----------------------------------------------------------------------------------------
def _memory(result: BurstResult) -> list[Finding]:
    peak = result.peak_memory_bytes
    totals = [t.mem_total_bytes for t in result.telemetry if t.mem_total_bytes]
    if peak is None or not totals:
        return []
    total = max(totals)
    share = peak / total
    numbers = f"peak {peak / 2**20:,.0f} MiB of {total / 2**20:,.0f} MiB ({share:.0%})"
    if share >= MEMORY_HEADROOM_SHARE:
        return [Finding("warn", "Memory nearly full", f"{numbers}: the next step up in batch size will not fit; "
                        "accumulate gradients instead.", "grad_accum_steps")]
    return [Finding("good", "Memory headroom", f"{numbers}: room for a larger batch.", "batch_size")]
