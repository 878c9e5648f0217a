"""A plain-language reading of one burst: what limits its step, and which knob to try next.

One reading names one limiter: the largest share of the step (waiting for data, copying it, computing, and where a
headspace measured them or a GPU's utilisation shows them, exchanging gradients and the host's own work), the other
shares said as its context, so a run is never called data-bound and compute-bound at once. A knob is advised only
where its owner's advice can act here: on this machine (the owners' rules: bf16 where bf16 is emulated is no advice),
on a code path the step ran, and with room under the headspace ceiling of its part ("data loading costs at most 3%
here: the loader knobs cannot help"). Each finding quotes the number it read, so the user can judge it, and names at
most one knob from the registry, so the panel can point at the control. Pure functions over a ``BurstResult`` (and
the ceilings, when measured): no widgets, no engine, testable with synthetic results.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from ..inputs.device import DeviceInfo, GpuInfo, probe_device
from ..knobs import KNOBS, Part, Remedy, Symptom, remedy
from ..knobs.config import Config
from ..knobs.data import readers_per_rank
from ..knobs.memory import allocator_not_in_effect
from ..knobs.parts import FREE_PARTS
from ..metrics.thresholds import THRESHOLDS
from ..metrics.units import si
from ..results.burst import BurstResult
from ..results.headspace import Headspace
from ..results.reliability import (
    BROWSERS,
    caller_cpu_pct,
    load_attribution,
    other_load_pct,
    other_processes,
    reliability,
)
from .compare import changes, speedup, straggler
from .guard import GuardVerdict, check_training, frozen_augmentation
from .usage import (
    allocator_expandable,
    allocator_slack_share,
    energy,
    iowait_pct,
    loader_cpu_pct,
    mean_activity_pct,
    mean_utilisation_pct,
    mfu,
    mfu_basis,
    peak_reserved_bytes,
    read_amplification,
    utilisation_note,
)

Severity = Literal["warn", "info", "good"]

_ORDER: dict[Severity, int] = {"warn": 0, "info": 1, "good": 2}


#: The title of the findings that repeat the engine's warnings (``BurstResult.warnings``): a face that lists those
#: warnings on their own leaves these out.
ENGINE_WARNING = "Engine warning"


#: What can limit a step: the parts a headspace can free, the copy, and the computing itself.
Limit = Literal["data", "copy", "compute", "communication", "host"]


@dataclass(frozen=True)
class Finding:
    """One reading: a short title, the numbers behind it, the knob worth trying next (if any), the symptom it read
    (if it is one a knob owner remedies: what a ladder's rung or a search can be asked to address), and ``limit``:
    the part of the step it names as the run's limit (one finding of a reading at most)."""

    severity: Severity
    title: str
    detail: str
    knob: str | None = None
    symptom: Symptom | None = None
    limit: Limit | None = None

    def __post_init__(self) -> None:
        if self.knob is not None:
            KNOBS[self.knob]  # a typo in a rule must fail loudly, not point the user at nothing


@dataclass(frozen=True)
class _Here:
    """What advice is judged against: the run's config, the machine, the code paths its step ran and the parts whose
    headspace ceiling leaves nothing to win."""

    config: Config
    device: DeviceInfo
    result: BurstResult
    headspace: Headspace | None

    @property
    def closed(self) -> set[Part]:
        if self.headspace is None:
            return set()
        return {part for part in self.headspace.ceilings if self.headspace.closed(part) is not None}


def diagnose(result: BurstResult, baseline: BurstResult | None = None, *,
             verdict: GuardVerdict | None = None, device: DeviceInfo | None = None,
             headspace: Headspace | None = None) -> list[Finding]:
    """Findings for one burst, most urgent first (warnings, then notes, then what is already fine).

    With ``baseline`` (the run its speed-up is measured against: the plain fp32 run of the same workload)
    two more readings become possible: whether the speed-up changed training (the correctness guard) and
    when compiling pays for itself. ``verdict`` is ``check_training(result, baseline)`` when the caller has
    it already (the panel and the report show it in their tables), so the guard runs once per run. ``device``:
    the machine the advice is for (default: this one); ``headspace``: the run's config's ceilings
    (:func:`accel_widgets.headspace`), which size the limiter where they were measured and close the families with
    nothing to win.
    """
    here = _Here(result.config, device or _machine_of(result), result, headspace)
    findings = _outcome(result, here)
    if result.measured_steps():
        findings += _reliability(result)
        findings += _limiter(result, here)
        findings += _stream_reads(result, here)
        findings += _utilisation(result)
        findings += _tensor_cores(result, here)
        findings += _precision(result, here)
        findings += _memory(result, here)
        findings += _parallel(result, here)
        findings += _straggler(result)
        findings += _math(result)
        findings += _compiler(result, here)
        if baseline is not None and baseline is not result:
            findings += _against_baseline(result, baseline, verdict or check_training(result, baseline), here)
    findings += _engine_warnings(result, here)
    return sorted(findings, key=lambda f: _ORDER[f.severity])


def _machine_of(result: BurstResult) -> DeviceInfo:
    """The machine a reading advises for: this one, where the run's kind of device is here; else the run's own, as
    its environment describes it (a GPU run read on a laptop is advised for its GPU)."""
    here = probe_device()
    environment = result.environment
    ran_on_gpu = environment.get("device_kind") == "cuda" or _on_gpu(result)
    if ran_on_gpu == here.has_cuda:
        return here
    if not ran_on_gpu:
        return dataclasses.replace(here, gpus=(), driver=None)
    major, _, minor = str(environment.get("capability") or "").partition(".")
    capability = (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None
    name = str(environment.get("device_name") or "GPU")
    gpus = tuple(GpuInfo(i, i, name, int(environment.get("cuda_memory_bytes") or 0), compute_capability=capability)
                 for i in range(max(1, result.facts.gpus if result.facts is not None else 1)))
    return dataclasses.replace(here, gpus=gpus, driver="the run's")


def _engine_warnings(result: BurstResult, here: _Here) -> list[Finding]:
    """The engine's warnings; a cache that froze random augmentation gets its own finding and knob, since the
    speed it buys is the cache's trade (the guard marks such a run as changing training)."""
    frozen = [_advised("warn", "Cache froze augmentation", detail, "frozen_augmentation", here)
              for detail in frozen_augmentation(result)]
    return frozen + [Finding("warn", ENGINE_WARNING, warning) for warning in result.warnings]


def _advised(severity: Severity, title: str, head: str, symptom: Symptom, here: _Here, tail: str = "",
             limit: Limit | None = None) -> Finding:
    """A finding whose advice comes from the knob owner that remedies ``symptom`` and can act here (none: the
    numbers alone), and ``tail`` after the advice."""
    advice = _remedy(symptom, here)
    if advice is None:
        return Finding(severity, title, f"{head}{tail}.", symptom=symptom, limit=limit)
    return Finding(severity, title, f"{head}: {advice.text}{tail}.", advice.knob, symptom, limit)


def _remedy(symptom: Symptom, here: _Here) -> Remedy | None:
    return remedy(symptom, here.config, here.device, paths=here.result.code_paths, closed=here.closed)


# -- outcome --------------------------------------------------------------------------------------
def _outcome(result: BurstResult, here: _Here) -> list[Finding]:
    """Why a burst has no (or only partial) numbers, and what usually fixes it."""
    error = result.error
    if result.ok or error is None:
        return []
    first_line = error.message.strip().splitlines()[0] if error.message.strip() else error.kind
    if result.status == "stopped":
        steps = len(result.measured_steps())
        return [Finding("info", "Stopped early", f"{steps} measured steps before Stop; numbers cover those only.")]
    if result.status == "diverged":
        return [_diverged(result, here)]
    if error.kind in ("oom", "crash"):
        title = "Out of memory" if error.kind == "oom" else "Worker crashed"
        return [_advised("warn", title, first_line.rstrip("."), "out_of_memory", here)]
    if error.kind == "timeout":
        return [Finding("warn", "Timed out", first_line)]
    return [Finding("warn", "Burst failed", first_line)]


def _diverged(result: BurstResult, here: _Here) -> Finding:
    """The burst measured its speed, but the loss went NaN/inf: it trained nothing, so it is no speed-up.
    Reduced precision is the usual suspect when it is in use; in fp32 the cause (learning rate, data) is no knob."""
    head = (f"{'; '.join(result.nonfinite_losses())}: the throughput is measured, but a run that does not train is "
            "no speed-up. Check the learning rate and the data for NaN/inf")
    return _advised("warn", "Training diverged", head, "diverged", here)


# -- can the numbers be trusted -------------------------------------------------------------------
def _reliability(result: BurstResult) -> list[Finding]:
    """Whether the numbers measured the knobs or the neighbours, and whose load it was."""
    step = result.step_time
    trusted = reliability(result)
    if not trusted.reliable:
        return [Finding("warn", "Unreliable measurement", f"{trusted.text()}. {_load_advice(result)}Re-measure it "
                        "against its baseline (Re-measure in the panel, aw.remeasure: an interval and a verdict) "
                        "before ranking it.")]
    other = other_load_pct(result) or 0.0
    busy = other >= THRESHOLDS.other_load_notice_pct
    load = f"other load took ~{other:.0f}% of the machine ({load_attribution(result)})" if busy else ""
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
    others = other_processes(result)
    browser = sum(pct for program, pct in others if program in BROWSERS)
    caller = (caller_cpu_pct(result) or 0.0) * cores
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


# -- the limiter ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Share:
    """One part of the step and the share of it it took, with how that was read."""

    limit: Limit
    share: float
    how: str


def _shares(result: BurstResult, here: _Here) -> list[_Share]:
    """Where the step's time went, as shares that add up to one: the step clock's data wait and copy, a measured
    headspace ceiling's share where there is one (it counts what the clock cannot see, as loader workers taking the
    cores compute needs), a GPU's idle time as the host's, and compute the rest."""
    shares: dict[Limit, _Share] = {}
    wait, h2d = result.data_wait_share or 0.0, result.h2d_share or 0.0
    headspace = here.headspace
    data_freed = headspace.share_freed("data") if headspace is not None else None
    if data_freed is not None:
        shares["data"] = _Share("data", data_freed, _ceiling_how(headspace, "data"))
    else:
        shares["data"] = _Share("data", wait, "waits on the data loader")
        shares["copy"] = _Share("copy", h2d, "copies batches to the device")
    for part in ("communication", "host"):
        freed = headspace.share_freed(part) if headspace is not None else None
        if freed is not None:
            shares[part] = _Share(part, freed, _ceiling_how(headspace, part))
    util = mean_utilisation_pct(result)
    if "host" not in shares and _on_gpu(result) and util is not None and util < THRESHOLDS.util_ok_pct:
        shares["host"] = _Share("host", 1 - util / 100, f"the GPU idles (busy {util:.0f}% of the time)")
    rest = max(0.0, 1.0 - sum(s.share for s in shares.values()))
    shares["compute"] = _Share("compute", rest, "computes")
    return sorted(shares.values(), key=lambda s: -s.share)


def _ceiling_how(headspace: Headspace, part: Part) -> str:
    ceiling = headspace.ceilings[part]
    found = ceiling.comparison.interval if ceiling.comparison is not None else None
    said = f" ({found.ratio:.2f}× [{found.low:.2f}–{found.high:.2f}] with it free)" if found is not None and \
        found.bounded else ""
    return f"goes to {FREE_PARTS[part].costs}{said}"


def _on_gpu(result: BurstResult) -> bool:
    return any(t.source == "nvml" for t in result.telemetry)


#: Each limit's title and the symptom whose remedies address it.
_LIMITS: dict[Limit, tuple[str, Symptom]] = {
    "data": ("Data-bound", "data_wait"),
    "copy": ("Copy-bound", "slow_copies"),
    "compute": ("Compute-bound", "compute_bound"),
    "communication": ("Communication-bound", "communication_bound"),
    "host": ("Host-bound", "sync_bound"),
}


def _limiter(result: BurstResult, here: _Here) -> list[Finding]:
    """The one part that limits the step, the largest share, with the others as its context and the ceilings that
    bound or close the families of knobs."""
    shares = _shares(result, here)
    top = shares[0]
    context = [f"{s.limit} {s.share:.0%}" for s in shares[1:] if s.share >= THRESHOLDS.data_wait_notice_share]
    rest = f" (the rest: {', '.join(context)})" if context else ""
    head = f"{top.share:.0%} of the step {top.how}{rest}"
    closed = _closed_lines(here, top.limit)
    if top.limit == "compute":
        return [_compute_bound(head, here, closed)]
    title, symptom = _LIMITS[top.limit]
    if top.limit == "data":
        symptom, head = _data_symptom(result, here, head)
    elif top.limit == "host":
        symptom = "sync_bound" if _remedy("sync_bound", here) is not None else "overhead_bound"
    bound = _bound_line(here, top.limit)
    return [_advised("warn", title, head, symptom, here, f"{bound}{closed}", limit=top.limit)]


def _data_symptom(result: BurstResult, here: _Here, head: str) -> tuple[Symptom, str]:
    """Which data symptom the data limit reads as: the disk (I/O wait), a loader starved of cores (the machine busy
    while it waits), or the wait itself; with the numbers that told."""
    iowait = iowait_pct(result)
    if iowait is not None and iowait >= THRESHOLDS.iowait_notice_pct:
        return "disk_bound", f"{head}; the CPUs waited on I/O {iowait:.0f}% of the time"
    host = [t.host_util_pct for t in result.measured_telemetry() if t.host_util_pct is not None]
    busy = sum(host) / len(host) if host else None
    if busy is not None and busy >= THRESHOLDS.host_saturated_pct and _remedy("starved_loader", here) is not None:
        loader = loader_cpu_pct(result)
        share = f" (the loader workers used {loader:.0f}% of it)" if loader is not None else ""
        return "starved_loader", (f"{head}; the machine's CPU was {busy:.0f}% busy{share}: the loader is starved of "
                                  "cores")
    return "data_wait", head


def _bound_line(here: _Here, limit: Limit) -> str:
    """What the limit's ceiling lets its knobs win at most, where it was measured."""
    if here.headspace is None or limit not in FREE_PARTS:
        return ""
    ceiling = here.headspace.ceiling(limit)  # type: ignore[arg-type]
    most = ceiling.most if ceiling is not None else None
    return f"; {FREE_PARTS[limit].knobs} can win at most {most:.2f}× here" if most is not None and ceiling.room else ""


def _closed_lines(here: _Here, limit: Limit) -> str:
    """The ceilings that close a family, in a sentence each (not the limit's own: it is the limit)."""
    if here.headspace is None:
        return ""
    lines = [ceiling.closed_text for part, ceiling in here.headspace.ceilings.items() if part != limit]
    return "".join(f". {line[0].upper()}{line[1:]}" for line in lines if line)


def _compute_bound(head: str, here: _Here, closed: str) -> Finding:
    """Compute dominates: the remaining levers make the math itself cheaper."""
    advice = _remedy("compute_bound", here)
    if advice is None:
        return Finding("good", "Compute-bound", f"{head}: the classic knobs that act here are on; a bigger batch or "
                       f"device is next{closed}.", symptom="compute_bound", limit="compute")
    return Finding("good", "Compute-bound", f"{head}: {advice.text}{closed}.", advice.knob, "compute_bound", "compute")


def _stream_reads(result: BurstResult, here: _Here) -> list[Finding]:
    """A stream the tool deals out item by item is read in full by every reader, which keeps only its share:
    decoding costs that many times over, and more loader workers can measure slower for it."""
    amplification, stream = read_amplification(result), result.stream
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
                     "stream_rereads", here)]


# -- the device ------------------------------------------------------------------------------------
def _utilisation(result: BurstResult) -> list[Finding]:
    """The device's utilisation as context (the limiter reads what it means): a window too short for NVML's averages
    says so instead."""
    util = mean_utilisation_pct(result)
    what = "GPU" if _on_gpu(result) else "worker CPU"
    if util is not None and util >= THRESHOLDS.util_ok_pct:
        return [Finding("good", "Device kept busy", f"{what} at {util:.0f}% (rule of thumb: > 80%).")]
    if util is not None:
        return [Finding("info", "Utilisation below 80%", f"{what} at {util:.0f}%: the limiter above says where the "
                        "rest goes.")]
    note = utilisation_note(result)
    if note.startswith("too short"):
        return [Finding("info", "Utilisation not read", f"{note}.")]
    return []


def _tensor_cores(result: BurstResult, here: _Here) -> list[Finding]:
    """Utilisation says a kernel ran; GPM says whether the tensor cores did the work. A busy GPU whose tensor cores
    idle runs its math elsewhere: fp32 matmuls, or a step of elementwise and memory-bound kernels."""
    tensor, util = mean_activity_pct(result, "tensor_active_pct"), mean_utilisation_pct(result)
    if util is None or tensor is None or util < THRESHOLDS.util_ok_pct or tensor >= THRESHOLDS.tensor_active_low_pct:
        return []
    sm = mean_activity_pct(result, "sm_active_pct")
    sms = f", SMs active {sm:.0f}%" if sm is not None else ""
    head = f"utilisation {util:.0f}% but tensor cores active {tensor:.0f}%{sms} (NVML GPM)"
    if _remedy("tensor_cores_idle", here) is None:
        return [Finding("info", "Tensor cores mostly idle", f"{head}: the step's time goes to work off the tensor "
                        "cores (elementwise ops, memory traffic); the profile's top operators say which.",
                        symptom="tensor_cores_idle")]
    return [_advised("warn", "Tensor cores mostly idle", head, "tensor_cores_idle", here)]


# -- memory ----------------------------------------------------------------------------------------
def _memory(result: BurstResult, here: _Here) -> list[Finding]:
    peak = result.peak_memory_bytes
    totals = [t.mem_total_bytes for t in result.telemetry if t.mem_total_bytes]
    if peak is None or not totals:
        return []
    total = max(totals)
    share = peak / total
    numbers = f"peak {peak / 2**20:,.0f} MiB of {total / 2**20:,.0f} MiB ({share:.0%})"
    if share >= THRESHOLDS.memory_full_share:
        return [_advised("warn", "Memory nearly full", numbers, "memory_full", here), *_slack(result, here),
                *_allocator(result)]
    return [_advised("good", "Memory headroom", numbers, "memory_headroom", here), *_slack(result, here),
            *_allocator(result)]


def _allocator(result: BurstResult) -> list[Finding]:
    """The allocator's own word on its segments against what the memory owner's knob asked for."""
    why = allocator_not_in_effect(result.config, allocator_expandable(result))
    return [] if why is None else [Finding("warn", "Expandable segments not in effect", f"{why.text}.", why.knob)]


def _slack(result: BurstResult, here: _Here) -> list[Finding]:
    """The CUDA caching allocator reserved much more than it ever had allocated at once: memory held in blocks the
    next tensors did not fit (fragmentation), which a real run can run out of memory on."""
    slack, reserved = allocator_slack_share(result), peak_reserved_bytes(result)
    if slack is None or reserved is None or slack < THRESHOLDS.allocator_slack_notice_share:
        return []
    return [_advised("info", "Allocator holds unused memory", f"the allocator reserved {reserved / 2**20:,.0f} MiB and "
                     f"never had more than {(result.peak_memory_bytes or 0) / 2**20:,.0f} MiB of it allocated at once "
                     f"({slack:.0%} held unused)", "allocator_slack", here)]


# -- precision, parallelism, model math ------------------------------------------------------------
def _precision(result: BurstResult, here: _Here) -> list[Finding]:
    env = result.environment
    capability = env.get("capability")
    if env.get("device_kind") != "cuda" or not capability or float(capability) < THRESHOLDS.tensor_core_capability:
        return []
    advice = _remedy("fp32_on_tensor_cores", here)
    if advice is None:
        return []
    return [Finding("warn", "fp32 on a tensor-core GPU", f"this GPU (compute capability {capability}): "
                    f"{advice.text}.", advice.knob)]


def _parallel(result: BurstResult, here: _Here) -> list[Finding]:
    advice = _remedy("one_process_many_gpus", here)
    return [] if advice is None else [Finding("warn", "DataParallel", f"{advice.text}.", advice.knob)]


def _straggler(result: BurstResult) -> list[Finding]:
    """The rank that sets a group's pace, when its own work per step is well over the others': every other rank waits
    for it at each all-reduce, so the group trains at its pace."""
    found = straggler(result)
    if found is None or found.ratio < THRESHOLDS.straggler_ratio:
        return []
    where = f" on node {found.node[:12]}" if found.node else ""
    return [Finding("warn", "Straggler", f"rank {found.rank}{where} sets the pace: its own work took "
                    f"{found.busy_step_s * 1e3:.3g} ms a step, {found.ratio:.2f}× the other ranks' median "
                    f"({found.others_step_s * 1e3:.3g} ms), and they wait for it at every all-reduce (a slower or "
                    "busier machine, or another program on its cores).")]


def _math(result: BurstResult) -> list[Finding]:
    achieved, share = result.achieved_flops_per_s, mfu(result)
    if achieved is None:
        return []
    if share is None:
        return [Finding("info", "Model math", f"{si(achieved, 'FLOP/s')} of matmul/conv work sustained.")]
    return [Finding("info", "Model FLOPs utilisation", f"{share:.1%} of the GPU's dense peak, each FLOP at the peak of "
                    f"its math ({mfu_basis(result)}; {si(achieved, 'FLOP/s')}).")]


# -- what the compiler did -------------------------------------------------------------------------
def _compiler(result: BurstResult, here: _Here) -> list[Finding]:
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
        findings.append(_advised("warn", "Graph breaks", head, "graph_breaks", here, hint))
    if report.recompiles:
        steps = len({s.step for s in result.steps})
        every = " (on every step)" if steps > 1 and report.recompiles >= steps - 1 else ""
        first = report.recompile_reasons[0] if report.recompile_reasons else None
        because = f" because {first.reason}" + (f" in {first.function}" if first.function else "") if first else ""
        head = f"recompiled {report.recompiles}x in {steps} steps{every}{because}"
        findings.append(_advised("warn", "Recompiles", head, "recompiles", here))
    return findings


# -- against the baseline --------------------------------------------------------------------------
def _against_baseline(result: BurstResult, baseline: BurstResult, verdict: GuardVerdict,
                      here: _Here) -> list[Finding]:
    return _guard(result, verdict) + _compile_payback(result, baseline, here) + _energy_saving(result, baseline)


def _guard(result: BurstResult, verdict: GuardVerdict) -> list[Finding]:
    if verdict.status == "cannot_tell":
        return [Finding("info", "Cannot tell whether training changed", "; ".join(verdict.reasons))]
    if verdict.status != "changes_training" or result.status == "diverged":  # the outcome finding says it already
        return []
    return [Finding("warn", "Faster but changes training", "; ".join(verdict.reasons))]


def _compile_payback(result: BurstResult, baseline: BurstResult, here: _Here) -> list[Finding]:
    """Compile time is paid once; the gain per step repays it after compile_s / gain steps."""
    compile_s, mine, theirs = result.compile_s, result.step_time, baseline.step_time
    if compile_s is None or mine is None or theirs is None:
        return []
    gain = theirs.median - mine.median
    if gain <= 0:
        return [_advised("warn", "Compile does not pay off here", f"steps are {mine.median * 1e3:.1f} ms compiled vs "
                         f"{theirs.median * 1e3:.1f} ms before, and compiling cost {compile_s:.1f} s",
                         "compile_does_not_pay", here)]
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
    used = energy(result)
    mine, theirs = used.joules_per_sample, energy(baseline).joules_per_sample
    ratio = speedup(result, baseline)
    if mine is None or theirs is None or ratio is None:
        return []
    time_saved, energy_saved = 1 - 1 / ratio, 1 - mine / theirs
    detail = (f"{changes(result, baseline)}: {_change(time_saved)} time and {_change(energy_saved)} energy per "
              f"sample than the baseline ({theirs:.3g} → {mine:.3g} J/sample; {used.note}).")
    severity: Severity = "good" if time_saved > 0 and energy_saved > 0 else "info"
    return [Finding(severity, "Energy per sample", detail)]


def _change(saved: float) -> str:
    """"23% less" or "5% more": a share of the baseline's."""
    return f"{saved:.0%} less" if saved >= 0 else f"{-saved:.0%} more"
