"""The project's GPU check: the one script a session runs when it is lent a GPU.

A lent GPU is scarce (a whole device session is 15 minutes, machine start-up included), so the script
runs under one overall budget (``--budget-s``) from which every piece of work takes its timeout, skips
(and records as skipped) what no longer fits, and rewrites its JSON after every burst and check: a run
cut short still leaves everything measured so far. From a cold compile cache it ends within ~6 minutes.

1. the GPU-marked tests (``pytest -m gpu``) in their own process group, killed as a group on timeout;
2. checks on short bursts, one line each (PASS/FAIL/SKIP and the numbers): timing consistency (each
   step's data + copy + compute is its total; rank 0's steps tile its measured window), peak memory
   within the device, MFU in (0, 1], NVML telemetry labelled ``cuda:<ordinal>``, no host sync in the
   measured steps (``sync_debug=True``: torch's sync-debug mode "error"), fp16 + fused AdamW trains,
   compile ``reduce-overhead`` trains, channels_last trains a conv net, a profiled burst captures CUDA
   kernels;
3. the classic ladder over the image and LM demos at GPU size (batch sizes of the reference runs),
   each rung a time-bounded burst, printed next to the hand-measured H200 ratios. The ratios are
   reported, not judged; a rung that fails with an error is a FAIL.

Exit status: 0 when nothing failed, 1 when a check or rung failed, 2 without a GPU (unless
``--allow-cpu``, a dry run of the plumbing on a CPU machine, where the GPU-only checks fail by design).

    python benchmarks/gpu_check.py [--budget-s 320] [--seconds 3] [--workloads image,lm] [--size gpu]

Writes ``$OUT/gpu_check.json`` (``benchmarks/results/gpu_check.json`` when ``$OUT`` is unset), the
test log next to it, and the profiler trace when it is small.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from _common import environment
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import accel_widgets as aw
from accel_widgets.demos import DEMO_NAMES, DEMO_SIZES, SmallCNN, synthetic_images

ROOT = Path(__file__).resolve().parent.parent
Status = Literal["PASS", "FAIL", "SKIP", "INFO"]
Outcome = tuple[bool, str]

# 6 minutes less the interpreter start and a cold `import torch` (~10 s) and the last burst's teardown.
DEFAULT_BUDGET_S = 320.0
# Each phase's share: a cap per piece of work, and the least time worth starting it with.
TESTS_CAP_S, TESTS_FLOOR_S, TESTS_KEEP_S = 150.0, 30.0, 150.0  # keep: left for the checks and ladders
CHECK_STEPS = 50
CHECK_CAP_S, CHECK_FLOOR_S = 120.0, 20.0
RUNG_CAP_S, RUNG_SETUP_S, RUNG_COMPILE_S = 150.0, 15.0, 45.0  # a rung's floor: seconds + setup (+ compile)
# Timing consistency: a step's parts must add up to its total, and rank 0's steps must tile its window.
STEP_SUM_TOLERANCE, WINDOW_TOLERANCE = 0.01, 0.02
MAX_SKIPPED_SHARE, MAX_SKIPPED_STEPS = 0.1, 5  # fp16: GradScaler skips allowed (the larger of the two)
TRACE_COPY_MAX_BYTES = 4 << 20

# Hand-measured on one H200 (torch 2.11), /work/shared/notes/gpu-reference-effects.md: ResNet-18 at 64 px
# batch 256, and a 124M GPT at sequence 1024 batch 16; each rung's speed-up over the baseline.
REFERENCE_BATCH = {"image": 256, "lm": 16}
REFERENCE_BASELINE = {"image": 1616.0, "lm": 50.0}  # samples/s
REFERENCE = {
    "image": {"baseline": 1.0, "+loader": 1.4, "+bf16": 4.1, "+compile": 7.3, "+rest": 10.3},
    "lm": {"baseline": 1.0, "+loader": 1.0, "+bf16": 4.8, "+compile": 6.3, "+rest": 7.2},
}


# -- budget -----------------------------------------------------------------------------------------
def allot(left_s: float, cap_s: float, floor_s: float, keep_s: float = 0.0) -> float | None:
    """The timeout for the next piece of work: its cap, cut to the time left after ``keep_s``.

    None (skip it) when less than ``floor_s`` would remain: a burst started without the time to reach its
    measured window only burns budget the next one could use.
    """
    timeout = min(cap_s, left_s - keep_s)
    return timeout if timeout >= floor_s else None


class Budget:
    """One deadline for the whole script; every burst and the test run take their timeouts from it."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s, self._clock = total_s, clock
        self._started = clock()

    def elapsed(self) -> float:
        return self._clock() - self._started

    def left(self) -> float:
        return self.total_s - self.elapsed()

    def allot(self, cap_s: float, floor_s: float, keep_s: float = 0.0) -> float | None:
        return allot(self.left(), cap_s, floor_s, keep_s)


# -- checks: pure functions of a result -------------------------------------------------------------
def _breakdown_error(step: aw.StepRecord) -> float:
    """|data + h2d + compute - total| relative to the total (absolute when the total is zero)."""
    gap = abs(step.data_s + step.h2d_s + step.compute_s - step.total_s)
    return gap / step.total_s if step.total_s > 0 else gap


def check_step_breakdown(result: aw.BurstResult) -> Outcome:
    """Each measured step's parts add up to its total: a clamped (negative) compute share shows they do not."""
    steps = result.measured_steps()
    if not steps:
        return False, "no measured steps"
    worst = max(steps, key=_breakdown_error)
    error = _breakdown_error(worst)
    return error <= STEP_SUM_TOLERANCE, (f"{len(steps)} steps, worst |data+h2d+compute-total| {error:.2%} "
                                         f"(rank {worst.rank} step {worst.step})")


def _window_error(result: aw.BurstResult) -> float | None:
    """Rank 0's measured step totals over its measured window, less one; None without a window."""
    if not result.ranks or result.ranks[0].measured_s <= 0:
        return None
    return sum(s.total_s for s in result.measured_steps(rank=0)) / result.ranks[0].measured_s - 1


def check_window_tiling(result: aw.BurstResult) -> Outcome:
    """Rank 0's measured steps add up to its measured window: throughput and step times tell one story."""
    error = _window_error(result)
    if error is None:
        return False, "no measured window on rank 0"
    window = result.ranks[0].measured_s
    return abs(error) <= WINDOW_TOLERANCE, f"rank 0 steps {window * (1 + error):.3f} s vs window {window:.3f} s " \
                                           f"({error:+.2%})"


def check_timing(result: aw.BurstResult) -> Outcome:
    breakdown_ok, breakdown = check_step_breakdown(result)
    tiling_ok, tiling = check_window_tiling(result)
    return breakdown_ok and tiling_ok, f"{breakdown}; {tiling}"


def check_timing_over(results: dict[str, aw.BurstResult]) -> Outcome:
    """Timing consistency over several bursts: every one must hold; failing ones are named in full."""
    failing, compact = [], []
    for name, result in results.items():
        ok, message = check_timing(result)
        if not ok:
            failing.append(f"{name}: {message}")
        parts = max(map(_breakdown_error, result.measured_steps()), default=math.nan)
        window = _window_error(result)
        compact.append(f"{name} {parts:.2%}/" + (f"{window:+.2%}" if window is not None else "-"))
    summary = "worst step parts gap / steps-vs-window gap: " + ", ".join(compact)
    if failing:
        return False, f"{len(failing)} of {len(results)} bursts inconsistent: " + " | ".join(failing)
    return True, f"{len(results)} bursts consistent; {summary}"


def check_peak_memory(result: aw.BurstResult, device_total_bytes: int) -> Outcome:
    peak, kind = result.peak_memory_bytes, result.memory_kind
    if peak is None:
        return False, "no peak memory reported"
    text = f"{peak / 2**30:.2f} GiB of {device_total_bytes / 2**30:.1f} GiB ({kind})"
    return kind == "cuda_allocator" and 0 < peak <= device_total_bytes, text


def check_mfu(result: aw.BurstResult) -> Outcome:
    mfu, achieved = result.mfu, result.achieved_flops_per_s
    if mfu is None:
        why = "no FLOPs counted" if achieved is None else f"no peak known for {result.environment.get('device_name')!r}"
        return False, f"MFU unavailable ({why})"
    return 0 < mfu <= 1, f"MFU {mfu:.1%} ({achieved / 1e12:.1f} TFLOP/s model math, {result.config.precision})"


def check_telemetry(result: aw.BurstResult, devices: set[str]) -> Outcome:
    """NVML samples from exactly the burst's GPUs, labelled ``cuda:<ordinal>`` (never psutil on a GPU)."""
    samples = result.telemetry
    if not samples:
        return False, "no telemetry samples"
    sources = sorted({s.source for s in samples})
    labels = sorted({s.device for s in samples})
    ok = sources == ["nvml"] and set(labels) == devices
    return ok, f"{len(samples)} samples, source {','.join(sources)}, devices {','.join(labels)} (expected " \
               f"{','.join(sorted(devices))})"


def check_trains(result: aw.BurstResult) -> Outcome:
    """The loss falls (mean of the last quarter of steps under the first) and GradScaler rarely skips."""
    losses = [v for v in result.losses() if v is not None]
    if len(losses) < 4:
        return False, f"only {len(losses)} losses recorded"
    if not all(math.isfinite(v) for v in losses):
        return False, f"non-finite loss in {len(losses)} steps"
    quarter = max(1, len(losses) // 4)
    first, last = statistics.fmean(losses[:quarter]), statistics.fmean(losses[-quarter:])
    skipped = result.ranks[0].scaler_skipped_steps if result.ranks else None
    allowed = max(MAX_SKIPPED_STEPS, MAX_SKIPPED_SHARE * len(losses))
    skips_ok = skipped is None or skipped <= allowed
    skips = "" if skipped is None else f", scaler skipped {skipped} (allowed {allowed:g})"
    return last < first and skips_ok, f"loss {first:.4f} -> {last:.4f} over {len(losses)} steps{skips}"


def count_kernel_events(trace_path: str) -> int:
    """CUDA kernel events in a torch.profiler Chrome trace."""
    with open(trace_path) as fh:
        document = json.load(fh)
    events = document.get("traceEvents", []) if isinstance(document, dict) else document
    return sum(1 for e in events if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel")


def check_no_host_sync(result: aw.BurstResult, steps: int) -> Outcome:
    """A burst run with ``sync_debug=True`` finished every measured step: none of them synced the host.

    Under torch's sync-debug mode "error" a synchronising call inside a measured step raises, so a burst
    that fails instead never reaches this check (its failure carries the line that synced).
    """
    if result.environment.get("device_kind") != "cuda":
        return False, "not on CUDA: torch's sync-debug mode checks CUDA syncs only"
    measured = len(result.measured_steps(rank=0))
    text = f"{measured} of {steps} measured steps ran under sync-debug 'error' ({result.config.label()})"
    return measured == steps, text


def check_profile(result: aw.BurstResult) -> Outcome:
    """The capture timed kernels on the device, and its trace file holds them."""
    capture = result.profile
    if capture is None:
        return False, "no profile captured"
    device_ms = sum(op.self_device_ms for op in capture.top_operators)
    if not os.path.isfile(capture.trace_path):
        return False, f"trace file missing: {capture.trace_path}"
    kernels = count_kernel_events(capture.trace_path)
    size_mb = os.path.getsize(capture.trace_path) / 1e6
    text = (f"{capture.steps} steps, top operators {device_ms:.2f} ms device self time, trace {size_mb:.1f} MB "
            f"with {kernels} kernel events")
    return device_ms > 0 and kernels > 0, text


# -- the GPU-marked tests ---------------------------------------------------------------------------
_OUTCOME_LINE = re.compile(r"^(?P<id>\S.*?::.+?) (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)


def parse_pytest_outcomes(text: str) -> dict[str, str]:
    """Test id -> outcome from ``pytest -v`` output (read line by line, so a killed run still counts)."""
    return {m["id"]: m["outcome"] for m in _OUTCOME_LINE.finditer(text)}


def summarise_tests(outcomes: dict[str, str], returncode: int | None, timed_out: bool,
                    seconds: float) -> tuple[Status, str]:
    counts = Counter(outcomes.values())
    text = ", ".join(f"{n} {k.lower()}" for k, n in sorted(counts.items())) or "no test reported"
    bad = sorted(i for i, o in outcomes.items() if o in ("FAILED", "ERROR"))
    detail = f"{text} in {seconds:.0f} s" + (f"; failing: {', '.join(bad)}" if bad else "")
    if timed_out:
        return "FAIL", f"killed after {seconds:.0f} s; {detail}"
    if returncode != 0 or bad:
        return "FAIL", f"pytest exit {returncode}; {detail}"
    return ("PASS" if counts["PASSED"] else "SKIP"), detail


def run_in_group(command: list[str], log_path: Path, timeout_s: float, cwd: Path = ROOT) -> tuple[int, bool]:
    """Run ``command`` in its own session, output to ``log_path``; ``(exit code, timed out)``.

    Its whole process group (pytest, its forkserver, the ranks and their loader workers) is killed at
    the end, so nothing it started can outlive it and hold the GPU while the ladders run.
    """
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return process.returncode, timed_out


# -- bursts under the budget ------------------------------------------------------------------------
@dataclass
class BurstOutcome:
    """A burst run under the budget: its result (None when skipped) and how it ended."""

    result: aw.BurstResult | None
    status: Literal["ok", "failed", "skipped", "cut"]
    message: str = ""


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def run_budgeted(budget: Budget, workload: aw.Workload, config: aw.Config, *, floor_s: float, cap_s: float,
                 label: str, **burst_kwargs: Any) -> BurstOutcome:
    """A burst whose timeout is what the budget has left; a timeout caused by that cut is not a failure.

    Anything else that keeps the burst from a valid measurement -- a BurstError, a refused config, a
    diverged loss, an engine API that changed under the script -- is a failure with its first line.
    """
    timeout = budget.allot(cap_s, floor_s)
    if timeout is None:
        return BurstOutcome(None, "skipped", f"skipped: {budget.left():.0f} s of budget left, needs {floor_s:.0f} s")
    try:
        result = aw.run_burst(workload, config, label=label, timeout_s=timeout, **burst_kwargs)
    except aw.BurstTimeout as exc:
        if timeout < cap_s:
            return BurstOutcome(exc.result, "cut", f"cut by the budget after {timeout:.0f} s")
        return BurstOutcome(exc.result, "failed", first_line(str(exc)))
    except aw.BurstError as exc:
        return BurstOutcome(exc.result, "failed", first_line(str(exc)))
    except Exception as exc:
        return BurstOutcome(None, "failed", f"{type(exc).__name__}: {first_line(str(exc))}")
    if not result.ok:
        why = first_line(result.error.message) if result.error is not None else ""
        return BurstOutcome(result, "failed", f"status {result.status}: {why}")
    return BurstOutcome(result, "ok")


def verdict(outcome: BurstOutcome, check: Callable[[aw.BurstResult], Outcome]) -> tuple[Status, str]:
    """PASS/FAIL from ``check`` on a finished burst; SKIP when the budget left it out; FAIL when it failed."""
    if outcome.status in ("skipped", "cut"):
        return "SKIP", outcome.message
    if outcome.status == "failed" or outcome.result is None:
        return "FAIL", f"burst failed: {outcome.message}"
    ok, message = check(outcome.result)
    return ("PASS" if ok else "FAIL"), message


# -- the report -------------------------------------------------------------------------------------
class Report:
    """Everything measured so far, rewritten to disk after every burst and check."""

    def __init__(self, path: Path, header: dict[str, Any], budget: Budget) -> None:
        self.path, self.budget = path, budget
        self.data: dict[str, Any] = {**header, "checks": [], "ladders": {}, "bursts": {}}
        self.failed = self.passed = False

    def save(self) -> None:
        """Write atomically, so a run killed mid-write still leaves the previous complete file."""
        self.data["elapsed_s"] = round(self.budget.elapsed(), 1)
        self.data["failed"] = self.failed
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".json.partial")
        partial.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(partial, self.path)

    def line(self, status: Status, name: str, message: str) -> None:
        self.failed = self.failed or status == "FAIL"
        self.passed = self.passed or status == "PASS"
        print(f"{status:<4}  {name:<24} {message}", flush=True)

    def check(self, name: str, status: Status, message: str, **extra: Any) -> None:
        self.line(status, name, message)
        self.data["checks"].append({"name": name, "status": status, "message": message, **extra})
        self.save()

    def burst(self, key: str, outcome: BurstOutcome) -> None:
        self.data["bursts"][key] = {"status": outcome.status, "message": outcome.message,
                                    "result": outcome.result.to_dict() if outcome.result is not None else None}
        self.save()


# -- phase 1: the GPU-marked tests ------------------------------------------------------------------
GPU_MARK = "pytest.mark.gpu"


def gpu_test_files(tests_dir: Path = ROOT / "tests") -> list[Path]:
    """The test files that hold GPU-marked tests, named so pytest collects those alone.

    Why not ``pytest -m gpu tests``: that imports every test module before deselecting, and a GPU
    machine's stock image lacks the panel's and the notebooks' packages (ipywidgets, plotly, nbformat,
    webdataset), so one collection error would stop every GPU test from running.
    """
    return sorted(path for path in tests_dir.rglob("test_*.py") if GPU_MARK in path.read_text())


def run_test_phase(report: Report, budget: Budget, out_dir: Path) -> None:
    timeout = budget.allot(TESTS_CAP_S, TESTS_FLOOR_S, keep_s=TESTS_KEEP_S)
    if timeout is None:
        report.check("gpu tests", "SKIP", f"skipped: {budget.left():.0f} s of budget left")
        return
    log_path = out_dir / "gpu_tests.log"
    command = [sys.executable, "-m", "pytest", "-v", "-rfE", "-m", "gpu", "-p", "no:cacheprovider",
               *map(str, gpu_test_files())]
    started = time.monotonic()
    returncode, timed_out = run_in_group(command, log_path, timeout)
    seconds = time.monotonic() - started
    outcomes = parse_pytest_outcomes(log_path.read_text(errors="replace"))
    status, message = summarise_tests(outcomes, returncode, timed_out, seconds)
    report.check("gpu tests", status, message, returncode=returncode, timed_out=timed_out, outcomes=outcomes,
                 log=log_path.name)


# -- phase 2: checks on short bursts ----------------------------------------------------------------
def conv_workload() -> aw.Workload:
    """A small CNN on learnable synthetic images already in memory: the loss falls within a few dozen steps."""
    images, labels = synthetic_images(2048, 32, 10, seed=0)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255.0)
    return aw.Workload(model=functools.partial(SmallCNN, num_classes=10),
                       dataset=TensorDataset(x, torch.from_numpy(labels)), loss_fn=F.cross_entropy, batch_size=64,
                       name="check-conv")


def run_check_phase(report: Report, budget: Budget, device: aw.DeviceInfo, size: str) -> None:
    """Five bursts feed the checks; each check prints one line as soon as its burst is back."""
    mlp = aw.demo_workload("mlp", size=size)
    profile_dir = tempfile.mkdtemp(prefix="gpu-check-profile-")
    try:
        run = functools.partial(run_budgeted, budget, cap_s=CHECK_CAP_S, steps=CHECK_STEPS)
        bursts = {"probe": run(mlp, aw.Config(), floor_s=CHECK_FLOOR_S, label="probe", profile_steps=3,
                               profile_dir=profile_dir)}
        probe = bursts["probe"]
        report.burst("check/probe", probe)
        total = device.gpus[0].memory_bytes if device.gpus else 0
        report.check("peak memory", *verdict(probe, lambda r: check_peak_memory(r, total)))
        report.check("mfu", *verdict(probe, check_mfu))
        labels = {f"cuda:{g.index}" for g in device.gpus[:1]}
        report.check("telemetry", *verdict(probe, lambda r: check_telemetry(r, labels)))
        report.check("profile", *verdict(probe, check_profile), trace=copy_small_trace(probe, report.path.parent))
        # Pinned memory and non_blocking too: a blocking copy from pageable memory is itself a host sync.
        no_sync = aw.Config(sync_every=0, optimizer_impl="fused", pin_memory=True, non_blocking=True)
        bursts["no-sync"] = run(mlp, no_sync, floor_s=CHECK_FLOOR_S, label="no-sync", sync_debug=True)
        report.burst("check/no-sync", bursts["no-sync"])
        report.check("no host sync", *verdict(bursts["no-sync"], lambda r: check_no_host_sync(r, CHECK_STEPS)))
        for key, workload, config, floor in (
            ("fp16+fused", mlp, aw.Config(precision="fp16", optimizer_impl="fused"), CHECK_FLOOR_S),
            ("reduce-overhead", mlp, aw.Config(compile_mode="reduce-overhead"), CHECK_FLOOR_S + RUNG_COMPILE_S),
            ("channels_last", conv_workload(), aw.Config(channels_last=True), CHECK_FLOOR_S),
        ):
            bursts[key] = run(workload, config, floor_s=floor, label=key)
            report.burst(f"check/{key}", bursts[key])
            report.check(f"{key} trains", *verdict(bursts[key], check_trains))
        finished = {k: b.result for k, b in bursts.items() if b.status == "ok" and b.result is not None}
        if finished:
            ok, message = check_timing_over(finished)
            report.check("timing consistency", "PASS" if ok else "FAIL", message)
        else:
            report.check("timing consistency", "SKIP", "no check burst finished")
    finally:
        shutil.rmtree(profile_dir, ignore_errors=True)


def copy_small_trace(outcome: BurstOutcome, out_dir: Path) -> str | None:
    """Bring the profiler trace back only when it is small: device results travel under size limits."""
    capture = outcome.result.profile if outcome.result is not None else None
    if capture is None or not os.path.isfile(capture.trace_path):
        return None
    if os.path.getsize(capture.trace_path) > TRACE_COPY_MAX_BYTES:
        return None
    target = out_dir / "profile_trace.json"
    shutil.copyfile(capture.trace_path, target)
    return target.name


# -- phase 3: the ladders ---------------------------------------------------------------------------
def ladder_row(demo: str, rung: str, outcome: BurstOutcome, baseline_rate: float | None) -> dict[str, Any]:
    """One rung next to its reference: samples/s, speed-up over this run's baseline, the reference ratio."""
    result = outcome.result if outcome.status == "ok" else None
    rate = result.samples_per_s if result is not None else None
    speedup = rate / baseline_rate if rate and baseline_rate else None
    row: dict[str, Any] = {"rung": rung, "status": outcome.status, "message": outcome.message,
                           "samples_per_s": rate, "speedup": speedup, "reference": REFERENCE.get(demo, {}).get(rung)}
    if result is not None:
        row["timing_consistent"], row["timing"] = check_timing(result)
        row["compile_s"] = result.compile_s
    return row


def rung_status(row: dict[str, Any]) -> Status:
    return {"ok": "INFO", "failed": "FAIL"}.get(row["status"], "SKIP")


def rung_text(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return row["message"]
    rate = f"{row['samples_per_s']:,.1f} samples/s" if row["samples_per_s"] else "no throughput"
    speedup = f"{row['speedup']:.1f}x" if row["speedup"] else "-"
    reference = f"{row['reference']:.1f}x" if row["reference"] else "-"
    return f"{rate:>22}  {speedup:>6} (reference {reference})"


def side_by_side(rows: list[dict[str, Any]]) -> str:
    measured = " ".join(f"{r['speedup']:.1f}x" if r["speedup"] else "-" for r in rows)
    reference = " ".join(f"{r['reference']:.1f}x" if r["reference"] else "-" for r in rows)
    return f"{' '.join(r['rung'] for r in rows)}: measured {measured}, reference {reference}"


def run_ladder_phase(report: Report, budget: Budget, demo: str, size: str, seconds: float) -> None:
    if budget.left() < seconds + RUNG_SETUP_S:  # not even the baseline fits: do not build the workload
        report.check(f"{demo} ladder", "SKIP", f"skipped: {budget.left():.0f} s of budget left")
        return
    workload = aw.demo_workload(demo, size=size)
    wanted = REFERENCE_BATCH.get(demo) if size == "gpu" else None
    base = aw.Config(batch_size=wanted) if wanted and wanted != workload.batch_size else None
    batch = base.batch_size if base is not None else workload.batch_size
    entry = {"workload": workload.name, "batch_size": batch, "demo_batch_size": workload.batch_size,
             "seconds_per_rung": seconds, "reference_baseline_samples_per_s": REFERENCE_BASELINE.get(demo),
             "rungs": []}
    report.data["ladders"][demo] = entry
    baseline_rate: float | None = None
    for rung in aw.classic_ladder(workload, base=base):
        floor = seconds + RUNG_SETUP_S + (RUNG_COMPILE_S if rung.config.compile_mode != "off" else 0.0)
        outcome = run_budgeted(budget, workload, rung.config, floor_s=floor, cap_s=RUNG_CAP_S, seconds=seconds,
                               label=rung.name)
        if rung.name == "baseline" and outcome.status == "ok" and outcome.result is not None:
            baseline_rate = outcome.result.samples_per_s
        row = ladder_row(demo, rung.name, outcome, baseline_rate)
        entry["rungs"].append(row)
        report.line(rung_status(row), f"{demo} {rung.name}", rung_text(row))
        report.burst(f"ladder/{demo}/{rung.name}", outcome)
    reference = REFERENCE_BASELINE.get(demo)
    base_text = f"baseline {baseline_rate:,.0f} samples/s" if baseline_rate else "no baseline"
    ref_text = f" (reference {reference:,.0f})" if reference else ""
    report.line("INFO", f"{demo} ladder", f"{side_by_side(entry['rungs'])}; {base_text}{ref_text}, batch {batch}")


# -- main -------------------------------------------------------------------------------------------
def output_dir() -> Path:
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results"


def header(args: argparse.Namespace, device: aw.DeviceInfo) -> dict[str, Any]:
    return {
        "benchmark": "gpu_check",
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "device": {"name": device.name, "driver": device.driver,
                   "gpus": [{"index": g.index, "name": g.name, "memory_bytes": g.memory_bytes} for g in device.gpus]},
        "budget_s": args.budget_s, "size": args.size, "seconds_per_rung": args.seconds,
        "reference_batch_sizes": REFERENCE_BATCH,
    }


def demo_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in DEMO_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown demo(s) {', '.join(unknown)}; choose from {', '.join(DEMO_NAMES)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="overall budget; each burst's timeout is taken from what is left (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per ladder rung")
    parser.add_argument("--workloads", default="image,lm", type=demo_names,
                        help="demos to run the ladder on (default image,lm)")
    parser.add_argument("--size", default="gpu", choices=DEMO_SIZES)
    parser.add_argument("--skip-tests", action="store_true", help="leave out the GPU-marked tests")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a GPU: a dry run of the plumbing (GPU-only checks fail by design)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    budget = Budget(args.budget_s)
    device = aw.probe_device()
    report = Report(output_dir() / "gpu_check.json", header(args, device), budget)
    print(f"GPU check on {device.name} ({len(device.gpus)} GPU(s), driver {device.driver}); budget "
          f"{args.budget_s:.0f} s; writing {report.path}", flush=True)
    if not device.has_cuda and not args.allow_cpu:
        report.check("cuda", "FAIL", "no CUDA GPU visible through NVML (--allow-cpu runs a CPU dry run)")
        return 2
    phases: list[tuple[str, Callable[[], None]]] = []
    if not args.skip_tests:
        phases.append(("gpu tests", lambda: run_test_phase(report, budget, report.path.parent)))
    phases.append(("checks", lambda: run_check_phase(report, budget, device, args.size)))
    phases.extend((f"{demo} ladder", functools.partial(run_ladder_phase, report, budget, demo, args.size,
                                                        args.seconds)) for demo in args.workloads)
    for name, phase in phases:
        try:
            phase()
        except Exception as exc:  # a bug in one phase must not cost the results of the others
            report.check(name, "FAIL", f"{type(exc).__name__}: {first_line(str(exc))}",
                         traceback=traceback.format_exc()[-4000:])
    report.save()
    overall = "FAIL" if report.failed else "PASS" if report.passed else "SKIP"
    print(f"{overall}  overall in {budget.elapsed():.0f} s; wrote {report.path}", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
