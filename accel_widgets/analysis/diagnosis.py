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

from ..knobs import KNOBS, Symptom, remedy
from ..knobs.config import Config
from ..knobs.data import readers_per_rank
from ..knobs.memory import allocator_not_in_effect
from ..metrics.thresholds import THRESHOLDS
from ..metrics.units import si
from ..results.burst import BROWSERS, BurstResult
from .guard import GuardVerdict, check_training, frozen_augmentation

Severity = Literal["warn", "info", "good"]

_ORDER: dict[Severity, int] = {"warn": 0, "info": 1, "good": 2}


@dataclass(frozen=True)
class Finding:
    """One reading: a short title, the numbers behind it, the knob worth trying next (if any), and the symptom it
    read (if it is one a knob owner remedies: what a ladder's rung or a search can be asked to address)."""

    severity: Severity
    title: str
    detail: str
    knob: str | None = None
    symptom: Symptom | None = None

    def __post_init__(self) -> None:
        if self.knob is not None:
            KNOBS[self.knob]  # a typo in a rule must fail loudly, not point the user at nothing


def diagnose(result: BurstResult, baseline: BurstResult | None = None, *,
             verdict: GuardVerdict | None = None) -> list[Finding]:
    """Findings for one burst, most urgent first (warnings, then notes, then what is already fine).

    With ``baseline`` (the run its speed-up is measured against: the plain fp32 run of the same workload)
    two more readings become possible: whether the speed-up changed training (the correctness guard) and
    when compiling pays for itself. ``verdict`` is ``check_training(result, baseline)`` when the caller has
    it already (the panel and the report show it in their tables), so the guard runs once per run.
    """
    findings = _outcome(result)
    if result.measured_steps():
        findings += _reliability(result)
        findings += _data(result)
        findings += _host(result)
        findings += _device(result)
        findings += _precision(result)
        findings += _memory(result)
        findings += _parallel(result)
        findings += _math(result)
        findings += _compiler(result)
        if baseline is not None and baseline is not result:
            findings += _against_baseline(result, baseline, verdict or check_training(result, baseline))
    findings += _engine_warnings(result)
    return sorted(findings, key=lambda f: _ORDER[f.severity])


def _engine_warnings(result: BurstResult) -> list[Finding]:
    """The engine's warnings; a cache that froze random augmentation gets its own finding and knob, since the
    speed it buys is the cache's trade (the guard marks such a run as changing training)."""
    frozen = [_advised("warn", "Cache froze augmentation", detail, "frozen_augmentation", result.config)
              for detail in frozen_augmentation(result)]
    return frozen + [Finding("warn", "Engine warning", warning) for warning in result.warnings]


def _advised(severity: Severity, title: str, head: str, symptom: Symptom, config: Config, tail: str = "") -> Finding:
    """A finding whose advice comes from the knob owner that remedies ``symptom`` (none: the numbers alone), and
    ``tail`` after the advice."""
    advice = remedy(symptom, config)
    if advice is None:
        return Finding(severity, title, f"{head}{tail}.", symptom=symptom)
    return Finding(severity, title, f"{head}: {advice.text}{tail}.", advice.knob, symptom)


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
    if result.status == "diverged":
        return [_diverged(result)]
    if error.kind in ("oom", "crash"):
        title = "Out of memory" if error.kind == "oom" else "Worker crashed"
        return [_advised("warn", title, first_line.rstrip("."), "out_of_memory", result.config)]
    if error.kind == "timeout":
        return [Finding("warn", "Timed out", first_line)]
    return [Finding("warn", "Burst failed", first_line)]


def _diverged(result: BurstResult) -> Finding:
    """The burst measured its speed, but the loss went NaN/inf: it trained nothing, so it is no speed-up.
    Reduced precision is the usual suspect when it is in use; in fp32 the cause (learning rate, data) is no knob."""
    head = (f"{'; '.join(result.nonfinite_losses())}: the throughput is measured, but a run that does not train is "
            "no speed-up. Check the learning rate and the data for NaN/inf")
    return _advised("warn", "Training diverged", head, "diverged", result.config)


# -- can the numbers be trusted -------------------------------------------------------------------
def _reliability(result: BurstResult) -> list[Finding]:
    """Whether the numbers measured the knobs or the neighbours, and whose load it was."""
    step = result.step_time
    reliability = result.reliability
    if not reliability.reliable:
        return [Finding("warn", "Unreliable measurement", f"{reliability.text()}. {_load_advice(result)}Re-measure it "
                        "against its baseline (Re-measure in the panel, aw.remeasure: an interval and a verdict) "
                        "before ranking it.")]
    other = (result.foreign_cpu_pct or 0.0) + (result.caller_cpu_pct or 0.0)
    busy = other >= THRESHOLDS.other_load_notice_pct
    load = f"other load took ~{other:.0f}% of the machine ({result.load_attribution()})" if busy else ""
    if step is not None and step.noisy:
        if step.n < THRESHOLDS.min_steps_for_spread:
            detail = f"only {step.n} measured steps: run a longer burst before trusting the median."
        elif busy:
            detail = f"IQR is {step.relative_iqr:.0%} of the median step and {load}: {_load_advice(result)}"
        else:
            detail = (f"IQR is {step.relative_iqr:.0%} of the median step: re-run, the machine is probably busy "
                      "(on a few cores, one busy core stalls every intra-op thread).")
        return [Finding("warn", "Noisy step times", detail.strip())]
    if busy:
        return [Finding("info", "Machine busy", f"{load}: the steps look stable, but compare runs only when the "
                        "machine is quiet.")]
    return []


def _load_advice(result: BurstResult) -> str:
    """What to do about the largest load that was measured: a browser drawing live plots, the process that
    launched the burst, or another job."""
    cores = result.environment.get("cpu_count") or 1
    others = result.other_processes()
    browser = sum(pct for program, pct in others if program in BROWSERS)
    caller = (result.caller_cpu_pct or 0.0) * cores
    job, job_pct = next(((p, pct) for p, pct in others if p not in BROWSERS), ("", 0.0))
    largest = max(browser, caller, job_pct)
    if largest < THRESHOLDS.process_notice_core_pct:
        return ""
    if largest == browser:
        return (f"The browser used {browser:.0f}% of a core while the burst ran: a tab drawing live plots (this "
                "panel's or another's) competes with training; close or hide the other tabs. ")
    if largest == caller:
        return (f"The process that launched the burst used {caller:.0f}% of a core meanwhile (in a notebook: other "
                "cells or widgets working while it trained). ")
    return f"Another job shares the machine ({job} {job_pct:.0f}% of a core): re-run when it is quiet. "


# -- data pipeline ---------------------------------------------------------------------------------
def _data(result: BurstResult) -> list[Finding]:
    findings = []
    wait, h2d = result.data_wait_share, result.h2d_share
    if wait is not None and wait >= THRESHOLDS.data_wait_notice_share:
        severity: Severity = "warn" if wait >= THRESHOLDS.data_wait_bound_share else "info"
        title = "Data-bound" if severity == "warn" else "Some data wait"
        findings.append(_advised(severity, title, f"{wait:.0%} of the step waits on the data loader", "data_wait",
                                 result.config))
    if h2d is not None and h2d >= THRESHOLDS.h2d_max_share:
        findings.append(_advised("warn", "Host-to-device copies are slow", f"copies take {h2d:.0%} of the step (rule "
                                 "of thumb: < 10%)", "slow_copies", result.config))
    return findings + _stream_reads(result)


def _stream_reads(result: BurstResult) -> list[Finding]:
    """A stream the tool deals out item by item is read in full by every reader, which keeps only its share:
    decoding costs that many times over, and more loader workers can measure slower for it."""
    amplification, stream = result.read_amplification, result.stream
    if amplification is None or stream is None or amplification < THRESHOLDS.read_amplification_notice:
        return []
    readers = " x ".join(f"{count} {what}" for count, what in ((result.world_size, "ranks"),
                                                              (readers_per_rank(result.config), "loader workers"))
                         if count > 1)
    kept = sum(r.stream.items_kept for r in result.ranks if r.stream is not None)
    read = sum(r.stream.items_read for r in result.ranks if r.stream is not None)
    severity: Severity = "warn" if amplification >= THRESHOLDS.read_amplification_bound else "info"
    return [_advised(severity, f"Stream read {amplification:.1f}x per item",
                     f"each item was read {amplification:.1f} times for every time it was trained on ({read:,} items "
                     f"read, {kept:,} kept): the stream does not split itself, so each of its readers ({readers}) "
                     "reads all of it and keeps its share, and a decode-heavy stream gets slower with more workers",
                     "stream_rereads", result.config)]


# -- the device ------------------------------------------------------------------------------------
def _device(result: BurstResult) -> list[Finding]:
    util = result.mean_utilisation_pct
    compute = result.compute_share
    step = result.step_time
    findings = []
    what = "GPU" if any(t.source == "nvml" for t in result.telemetry) else "worker CPU"
    if util is not None and util < THRESHOLDS.util_ok_pct:
        sync = remedy("sync_bound", result.config) if what == "GPU" else None
        if step is not None and step.median < THRESHOLDS.short_step_s and util < THRESHOLDS.low_util_pct:
            findings.append(_advised("warn", "Low utilisation, fast steps", f"{what} at {util:.0f}% with "
                                     f"{step.median * 1e3:.1f} ms steps: per-step overhead dominates",
                                     "overhead_bound", result.config))
        elif sync is not None:
            findings.append(Finding("warn", "Possibly sync-bound", f"GPU busy {util:.0f}% (rule of thumb: > 80%): "
                                    f"{sync.text}.", sync.knob))
        else:
            findings.append(Finding("info", "Utilisation below 80%",
                                    f"{what} at {util:.0f}%: look at the data wait and the step "
                                    "breakdown for where the rest goes."))
    elif util is not None:
        findings.append(Finding("good", "Device kept busy", f"{what} at {util:.0f}% (rule of thumb: > 80%)."))
    elif result.utilisation_note.startswith("too short"):
        findings.append(Finding("info", "Utilisation not read", f"{result.utilisation_note}."))
    findings += _tensor_cores(result, util)
    if compute is not None and compute >= THRESHOLDS.compute_ok_share:
        findings.append(_compute_bound(result, compute))
    return findings


def _tensor_cores(result: BurstResult, util: float | None) -> list[Finding]:
    """Utilisation says a kernel ran; GPM says whether the tensor cores did the work. A busy GPU whose tensor cores
    idle runs its math elsewhere: fp32 matmuls, or a step of elementwise and memory-bound kernels."""
    tensor = result.mean_tensor_active_pct
    if util is None or tensor is None or util < THRESHOLDS.util_ok_pct or tensor >= THRESHOLDS.tensor_active_low_pct:
        return []
    sm = result.mean_sm_active_pct
    sms = f", SMs active {sm:.0f}%" if sm is not None else ""
    head = f"utilisation {util:.0f}% but tensor cores active {tensor:.0f}%{sms} (NVML GPM)"
    if remedy("tensor_cores_idle", result.config) is None:
        return [Finding("info", "Tensor cores mostly idle", f"{head}: the step's time goes to work off the tensor "
                        "cores (elementwise ops, memory traffic); the profile's top operators say which.",
                        symptom="tensor_cores_idle")]
    return [_advised("warn", "Tensor cores mostly idle", head, "tensor_cores_idle", result.config)]


def _compute_bound(result: BurstResult, compute: float) -> Finding:
    """Compute dominates: the remaining levers make the math itself cheaper."""
    head = f"compute is {compute:.0%} of the step (rule of thumb: > 70%)"
    if remedy("compute_bound", result.config) is None:
        return Finding("good", "Compute-bound", f"{head}: the classic knobs are on; a bigger batch or device is next.")
    return _advised("good", "Compute-bound", head, "compute_bound", result.config)


# -- memory ----------------------------------------------------------------------------------------
def _memory(result: BurstResult) -> list[Finding]:
    peak = result.peak_memory_bytes
    totals = [t.mem_total_bytes for t in result.telemetry if t.mem_total_bytes]
    if peak is None or not totals:
        return []
    total = max(totals)
    share = peak / total
    numbers = f"peak {peak / 2**20:,.0f} MiB of {total / 2**20:,.0f} MiB ({share:.0%})"
    if share >= THRESHOLDS.memory_full_share:
        return [_advised("warn", "Memory nearly full", numbers, "memory_full", result.config), *_slack(result),
                *_allocator(result)]
    return [_advised("good", "Memory headroom", numbers, "memory_headroom", result.config), *_slack(result),
            *_allocator(result)]


def _allocator(result: BurstResult) -> list[Finding]:
    """The allocator's own word on its segments against what the memory owner's knob asked for."""
    why = allocator_not_in_effect(result.config, result.allocator_expandable)
    return [] if why is None else [Finding("warn", "Expandable segments not in effect", f"{why.text}.", why.knob)]


def _slack(result: BurstResult) -> list[Finding]:
    """The CUDA caching allocator reserved much more than it ever had allocated at once: memory held in blocks the
    next tensors did not fit (fragmentation), which a real run can run out of memory on."""
    slack, reserved = result.allocator_slack_share, result.peak_reserved_bytes
    if slack is None or reserved is None or slack < THRESHOLDS.allocator_slack_notice_share:
        return []
    return [_advised("info", "Allocator holds unused memory", f"the allocator reserved {reserved / 2**20:,.0f} MiB and "
                     f"never had more than {(result.peak_memory_bytes or 0) / 2**20:,.0f} MiB of it allocated at once "
                     f"({slack:.0%} held unused)", "allocator_slack", result.config)]


# -- the host --------------------------------------------------------------------------------------
def _host(result: BurstResult) -> list[Finding]:
    """What top and iostat would say: a saturated machine starves the loader; I/O wait means the disk."""
    findings = []
    iowait = result.iowait_pct
    if iowait is not None and iowait >= THRESHOLDS.iowait_notice_pct:
        findings.append(_advised("warn", "Disk-bound", f"the CPUs waited on I/O {iowait:.0f}% of the time",
                                 "disk_bound", result.config))
    wait = result.data_wait_share
    host = [t.host_util_pct for t in result.measured_telemetry() if t.host_util_pct is not None]
    busy = sum(host) / len(host) if host else None
    starved = remedy("starved_loader", result.config)
    if (wait is not None and wait >= THRESHOLDS.data_wait_bound_share and starved is not None
            and busy is not None and busy >= THRESHOLDS.host_saturated_pct):
        loader = result.loader_cpu_pct
        share = f" (the loader workers used {loader:.0f}% of it)" if loader is not None else ""
        findings.append(Finding("warn", "Loader starved of cores", f"the machine's CPU was {busy:.0f}% busy{share} "
                                f"while the step waited on data: {starved.text}.", starved.knob))
    return findings


# -- precision, parallelism, model math ------------------------------------------------------------
def _precision(result: BurstResult) -> list[Finding]:
    env = result.environment
    capability = env.get("capability")
    if env.get("device_kind") != "cuda" or not capability or float(capability) < THRESHOLDS.tensor_core_capability:
        return []
    advice = remedy("fp32_on_tensor_cores", result.config)
    if advice is None:
        return []
    return [Finding("warn", "fp32 on a tensor-core GPU", f"this GPU (compute capability {capability}): "
                    f"{advice.text}.", advice.knob)]


def _parallel(result: BurstResult) -> list[Finding]:
    advice = remedy("one_process_many_gpus", result.config)
    return [] if advice is None else [Finding("warn", "DataParallel", f"{advice.text}.", advice.knob)]


def _math(result: BurstResult) -> list[Finding]:
    achieved, mfu = result.achieved_flops_per_s, result.mfu
    if achieved is None:
        return []
    if mfu is None:
        return [Finding("info", "Model math", f"{si(achieved, 'FLOP/s')} of matmul/conv work sustained.")]
    return [Finding("info", "Model FLOPs utilisation", f"{mfu:.1%} of the GPU's dense peak, each FLOP at the peak of "
                    f"its math ({result.mfu_basis}; {si(achieved, 'FLOP/s')}).")]


# -- what the compiler did -------------------------------------------------------------------------
def _compiler(result: BurstResult) -> list[Finding]:
    """Graph breaks and recompiles in words: a compile that breaks the graph or compiles again every step reads as
    "compile does not help" when the model's code is what stops it."""
    report = result.compile_report
    if report is None:
        return []
    findings = []
    if report.graph_break_count:
        first = report.graph_breaks[0] if report.graph_breaks else None
        where = (f" at {first.where()}" if first is not None and first.file else "")
        code = f" (`{first.code}`)" if first is not None and first.code else ""
        why = f": {first.reason}" + (f" ({first.explanation})" if first.explanation else "") if first else ""
        hint = f" (torch's hint: {first.hint.rstrip('.')})" if first is not None and first.hint else ""
        others = (f"; {report.graph_break_count - first.count} more elsewhere (the summary lists them)"
                  if first is not None and report.graph_break_count > first.count else "")
        head = (f"compile broke the graph {first.count if first else report.graph_break_count}x{where}{code}{why}"
                f"{others}; the model ran as {report.graphs} graph{'s' if report.graphs != 1 else ''}")
        findings.append(_advised("warn", "Graph breaks", head, "graph_breaks", result.config, hint))
    if report.recompiles:
        steps = len({s.step for s in result.steps})
        every = " (on every step)" if steps > 1 and report.recompiles >= steps - 1 else ""
        first = report.recompile_reasons[0] if report.recompile_reasons else None
        because = f" because {first.reason}" + (f" in {first.function}" if first.function else "") if first else ""
        head = f"recompiled {report.recompiles}x in {steps} steps{every}{because}"
        findings.append(_advised("warn", "Recompiles", head, "recompiles", result.config))
    return findings


# -- against the baseline --------------------------------------------------------------------------
def _against_baseline(result: BurstResult, baseline: BurstResult, verdict: GuardVerdict) -> list[Finding]:
    return _guard(result, verdict) + _compile_payback(result, baseline) + _energy_saving(result, baseline)


def _guard(result: BurstResult, verdict: GuardVerdict) -> list[Finding]:
    if verdict.status == "cannot_tell":
        return [Finding("info", "Cannot tell whether training changed", "; ".join(verdict.reasons))]
    if verdict.status != "changes_training" or result.status == "diverged":  # the outcome finding says it already
        return []
    return [Finding("warn", "Faster but changes training", "; ".join(verdict.reasons))]


def _compile_payback(result: BurstResult, baseline: BurstResult) -> list[Finding]:
    """Compile time is paid once; the gain per step repays it after compile_s / gain steps."""
    compile_s, mine, theirs = result.compile_s, result.step_time, baseline.step_time
    if compile_s is None or mine is None or theirs is None:
        return []
    gain = theirs.median - mine.median
    if gain <= 0:
        return [_advised("warn", "Compile does not pay off here", f"steps are {mine.median * 1e3:.1f} ms compiled vs "
                         f"{theirs.median * 1e3:.1f} ms before, and compiling cost {compile_s:.1f} s",
                         "compile_does_not_pay", result.config)]
    payback = compile_s / gain
    measured = len(result.step_times())
    severity: Severity = "info" if payback > measured else "good"
    detail = (f"{compile_s:.1f} s of compiling is repaid after ~{payback:,.0f} steps ({gain * 1e3:.2f} ms saved "
              f"per step); this burst measured {measured}.")
    return [Finding(severity, "Compile payback", detail)]


def _energy_saving(result: BurstResult, baseline: BurstResult) -> list[Finding]:
    """Time and energy per sample against the baseline. A speed-up usually saves energy too, but not always
    in proportion: a knob that keeps the device busier draws more power while it saves time. Where either
    run's energy was not measured there is no finding (the table's hover says why)."""
    mine, theirs = result.joules_per_sample, baseline.joules_per_sample
    speedup = result.speedup_over(baseline)
    if mine is None or theirs is None or speedup is None:
        return []
    time_saved, energy_saved = 1 - 1 / speedup, 1 - mine / theirs
    changes = result.config.label(baseline.config)
    detail = (f"{changes}: {_change(time_saved)} time and {_change(energy_saved)} energy per sample than the "
              f"baseline ({theirs:.3g} → {mine:.3g} J/sample; {result.energy_note}).")
    severity: Severity = "good" if time_saved > 0 and energy_saved > 0 else "info"
    return [Finding(severity, "Energy per sample", detail)]


def _change(saved: float) -> str:
    """"23% less" or "5% more": a share of the baseline's."""
    return f"{saved:.0%} less" if saved >= 0 else f"{-saved:.0%} more"
