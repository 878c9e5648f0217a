"""The project's GPU check: the first of the two runs a session makes when it is lent a GPU.

A lent GPU is scarce: one H200 for 15 minutes of device time, machine start-up included. This script is the
device plan's first run, ``run(command="PYTHONPATH=. PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py",
timeout_s=420)``; ``gpu_probes.py`` and ``gpu_modern.py`` share the second (benchmarks/README.md).
So the call is planned before anything runs. Every piece of work has the seconds it should take on an H200
(:data:`H200_SECONDS`, from the measurements it cites), the least time worth starting it with and a cap;
the work runs in the order of what the call must answer, each piece with the time the plan can spare it
after keeping the floors of the required work still to come, and what no longer fits is skipped with the
reason. ``--dry-run`` prints that plan on any machine for an H200 (a fake device of its size, the planned
seconds as the clock) and exits 0 only when it fits with both ladders' eager rungs and the LM's bf16 and
compile rungs; ``tests/benchmarks/test_gpu_check.py`` runs it in CI.

The call, in order:

1. fail fast: a one-rank, 5-step CUDA burst within 20 s. A broken start (the forkserver held CUDA when it
   forked the ranks, so every rank fails with "Cannot re-initialize CUDA in forked subprocess" or "CUDA error:
   initialization error") stops the call there, saying so;
2. the GPU-marked tests that no check covers: the memory-fraction OOM, the hidden-sync control, the
   batch-size search's OOM, bf16 + TF32 and empty_cache train, and DDP over NCCL last (pytest in its own
   process group; 45 s per test, bursts of at most 60 s);
3. checks on short eager bursts, one line each: timing consistency, peak memory, MFU in (0, 1], NVML
   telemetry labelled ``cuda:<ordinal>``, a profile with CUDA kernels, no host sync in the measured steps,
   fp16 + fused AdamW trains, channels_last trains a conv net;
4. the eager rungs of both ladders (image and LM at the reference runs' batch sizes): baseline, +loader and
   +bf16, printed next to the hand-measured H200 ratios (reported, not judged; a failing rung is a FAIL);
5. the compile work, each piece given at least ``COMPILE_FLOOR_S`` or skipped with the reason: LM +compile,
   image +compile, compile reduce-overhead trains, LM +rest, image +rest.

Exit status: 0 when nothing failed, 1 when something did (for ``--dry-run``: the plan does not fit), 2
without a GPU (unless ``--allow-cpu``: the plumbing on a CPU, where the GPU-only checks fail by design).

    python benchmarks/gpu_check.py [--dry-run] [--budget-s 460] [--seconds 3] [--workloads image,lm]

Writes ``$OUT/gpu_check.json`` (``benchmarks/results/gpu_check.json`` when ``$OUT`` is unset) at once and
after every piece of work, with the plan and its timeline (planned against spent seconds, per piece and
per phase), the host's memory and /dev/shm in its header, the test log next to it, the profiler trace when it is
small, ``environment.txt`` (nvidia-smi, pip list, /proc/meminfo, the CUDA/torch/NCCL variables) and ``dmon.txt``
(``nvidia-smi dmon -s pucm`` run beside the call; its utilisation and power are compared with the package's NVML
readings of every burst, in the JSON's ``dmon``).
"""

from __future__ import annotations

import argparse
import ast
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

if "--dry-run" in sys.argv:  # a plan launches nothing: no forkserver to start on import
    os.environ.setdefault("ACCEL_WIDGETS_PRESTART", "0")

import psutil
import torch
from _common import environment
from _device import Sidecars, compare_with_dmon, host_memory
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import accel_widgets as aw
from accel_widgets.analysis.usage import activity_text, mean_activity_pct, mean_utilisation_pct, mfu, mfu_basis
from accel_widgets.demos import DEMO_NAMES, DEMO_SIZES, SmallCNN, synthetic_images
from accel_widgets.inputs.device import GpuInfo
from accel_widgets.knobs.rules import check_config
from accel_widgets.search.ladder import Rung

ROOT = Path(__file__).resolve().parent.parent
Status = Literal["PASS", "FAIL", "SKIP", "INFO"]
Outcome = tuple[bool, str]
PhaseName = Literal["start", "fail fast", "gpu tests", "checks", "eager rungs", "compile"]

#: The device call's limit (``timeout_s`` in benchmarks/README.md) and what the plan keeps of it for the last
#: burst's teardown, the last JSON write and the interpreter's exit.
CALL_LIMIT_S, CALL_RESERVE_S = 420.0, 20.0
DEFAULT_BUDGET_S = CALL_LIMIT_S - CALL_RESERVE_S
FAIL_FAST_S = 20.0
TESTS_FLOOR_S, TESTS_CAP_S = 30.0, 120.0
GPU_TEST_TIMEOUT_S, GPU_TEST_BURST_TIMEOUT_S = 45.0, 60.0  # the most a GPU test, and a burst in it, may take
CHECK_STEPS = 50
CHECK_FLOOR_S, CHECK_CAP_S = 15.0, 60.0
RUNG_SETUP_S, RUNG_CAP_S = 15.0, 60.0  # an eager rung's floor is its measured seconds + setup
COMPILE_FLOOR_S, COMPILE_CAP_S = 100.0, 150.0  # a cold compile takes 25-60 s on these models
#: A Hopper's GPM: SM activity is a share of the time a kernel ran, so it cannot pass utilisation by more than the two
#: readings' different windows allow (NVML's utilisation averages up to 1 s, GPM the 0.2 s tick).
ACTIVITY_OVER_UTIL_PTS = 10.0
# Timing consistency: a step's parts must add up to its total, and rank 0's steps must tile its window.
STEP_SUM_TOLERANCE, WINDOW_TOLERANCE = 0.01, 0.02
MAX_SKIPPED_SHARE, MAX_SKIPPED_STEPS = 0.1, 5  # fp16: GradScaler skips allowed (the larger of the two)
TRACE_COPY_MAX_BYTES = 4 << 20
CUDA_REINIT = "Cannot re-initialize CUDA in forked subprocess"  # torch's words when the parent had a CUDA context
CUDA_INIT_ERROR = "CUDA error: initialization error"  # the driver's, when the parent ran cuInit without one

# Hand-measured on one H200 (torch 2.11), /work/shared/notes/gpu-reference-effects.md: ResNet-18 at 64 px
# batch 256, and a 124M GPT at sequence 1024 batch 16; each rung's speed-up over the baseline.
REFERENCE_BATCH = {"image": 256, "lm": 16}
REFERENCE_BASELINE = {"image": 1616.0, "lm": 50.0}  # samples/s
REFERENCE = {
    "image": {"baseline": 1.0, "+loader": 1.4, "+bf16": 4.1, "+compile": 7.3, "+rest": 10.3},
    "lm": {"baseline": 1.0, "+loader": 1.0, "+bf16": 4.8, "+compile": 6.3, "+rest": 7.2},
}

#: Seconds each piece of work should take on one H200 (torch 2.11, 16 cores): the plan's clock in --dry-run
#: and its "planned" column in a real call's timeline. From the shared notes (workers-and-ddp-facts.md,
#: gpu-reference-effects.md): ``import torch`` 2.8 s there; the forkserver's first start 7.6 s, then a rank
#: has its CUDA context at 0.27 s and its first step at 0.68 s; compiling ResNet-18 or GPT-124M took ~25 s,
#: and a cold compile 25-60 s (issue 19), so every compiled rung is planned with 60 s of compiling. A
#: rung measures 3 s after 2-3 warm-up steps, plus building its workload (20k images: ~1-3 s). A real
#: call's timeline holds what each piece spent: update these from it.
H200_SECONDS: dict[str, float] = {
    "start": 5.0,  # python, import torch and accel_widgets, building the plan (the ladders' models)
    "fail fast": 10.0,  # the forkserver's first start (7.6 s) and 5 steps of a small MLP
    "gpu tests": 50.0,  # pytest and its own forkserver (~10 s), 6 tests of 2-10 s, NCCL's start for DDP
    "check probe": 6.0, "check no host sync": 4.0, "check fp16+fused": 4.0, "check channels_last": 4.0,
    "image baseline": 10.0, "image +loader": 8.0, "image +bf16": 6.0,
    "lm baseline": 9.0, "lm +loader": 7.0, "lm +bf16": 6.0,
    "lm +compile": 70.0, "image +compile": 70.0,  # 60 s of cold compiling each
    "check reduce-overhead": 30.0,  # a small MLP compiled with CUDA graphs
    "lm +rest": 50.0,  # recompiles (fused AdamW, TF32, no per-step sync), partly from +compile's cache
    "image +rest": 70.0,  # recompiles for channels_last
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
    """One deadline for the whole call, counted from ``started`` on ``clock`` (by default: when this process
    started, so the interpreter's start and the imports count); every piece of work takes its timeout from it."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.time, started: float | None = None) -> None:
        self.total_s, self._clock = total_s, clock
        self._started = clock() if started is None else started

    def elapsed(self) -> float:
        return self._clock() - self._started

    def left(self) -> float:
        return self.total_s - self.elapsed()

    def allot(self, cap_s: float, floor_s: float, keep_s: float = 0.0) -> float | None:
        return allot(self.left(), cap_s, floor_s, keep_s)


class PlannedClock:
    """The dry run's clock: it stands still until a piece of work advances it by its planned seconds."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- the plan ---------------------------------------------------------------------------------------
@dataclass
class Work:
    """One piece of the call: when it is worth starting (``floor_s``), its longest run (``cap_s``) and what it
    should take on an H200 (``planned_s``). A ``required`` piece is what the call exists for: the floors of
    those still to come are kept back from every piece before them. ``action`` runs it with its timeout
    and returns its status; "STOP" ends the call."""

    name: str
    phase: PhaseName
    planned_s: float
    floor_s: float
    cap_s: float
    required: bool = False
    action: Callable[[float], str] = field(default=lambda timeout: "INFO", repr=False)


@dataclass
class Step:
    """What became of one piece of work: when it started, its timeout, what it spent, how it ended."""

    work: Work
    start_s: float
    timeout_s: float | None
    spent_s: float
    status: str
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"work": self.work.name, "phase": self.work.phase, "required": self.work.required,
                "start_s": round(self.start_s, 1), "planned_s": self.work.planned_s,
                "timeout_s": None if self.timeout_s is None else round(self.timeout_s, 1),
                "spent_s": round(self.spent_s, 1), "status": self.status, "why": self.why}


def execute(plan: list[Work], budget: Budget, run: Callable[[Work, float], str],
            on_step: Callable[[Step], None] = lambda step: None) -> list[Step]:
    """Run the plan in order: each piece gets its cap, cut to what the budget has left after the floors of
    the required pieces still to come (a required piece that cannot leave them gets what is left: the plan
    is in order of need); a piece that cannot get its floor is skipped, with the reason."""
    steps = []
    for index, work in enumerate(plan):
        later = [w for w in plan[index + 1:] if w.required]
        keep = sum(w.floor_s for w in later)
        start = budget.elapsed()
        timeout = budget.allot(work.cap_s, work.floor_s, keep)
        if timeout is None and work.required:
            timeout = budget.allot(work.cap_s, work.floor_s)
        if timeout is None:
            kept = f", keeping {keep:.0f} s for {len(later)} required after it" if keep else ""
            step = Step(work, start, None, 0.0, "SKIP",
                        f"skipped: needs {work.floor_s:.0f} s, {budget.left():.0f} s left{kept}")
        else:
            status = run(work, timeout)
            step = Step(work, start, timeout, budget.elapsed() - start, status)
        steps.append(step)
        on_step(step)
        if step.status == "STOP":
            break
    return steps


def phase_totals(steps: list[Step]) -> dict[str, dict[str, float]]:
    """Planned against spent seconds per phase."""
    totals: dict[str, dict[str, float]] = {}
    for step in steps:
        entry = totals.setdefault(step.work.phase, {"planned_s": 0.0, "spent_s": 0.0})
        entry["planned_s"] += step.work.planned_s if step.status != "SKIP" else 0.0
        entry["spent_s"] = round(entry["spent_s"] + step.spent_s, 1)
    return totals


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
    share, achieved = mfu(result), result.achieved_flops_per_s
    if share is None:
        why = "no FLOPs counted" if achieved is None else f"no peak known for {result.environment.get('device_name')!r}"
        return False, f"MFU unavailable ({why})"
    return 0 < share <= 1, f"MFU {share:.1%} ({achieved / 1e12:.1f} TFLOP/s model math; {mfu_basis(result)})"


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


def check_activity(result: aw.BurstResult) -> tuple[Status, str]:
    """On Hopper and newer the telemetry carries NVML's GPM metrics beside utilisation: SM active and tensor active
    read, each in [0, 100], SM active no more than utilisation (both are shares of time; GPM's also of the SMs).
    SKIP before Hopper, where NVML has no GPM."""
    capability = str(result.environment.get("capability") or "")
    if not capability or float(capability) < 9.0:
        return "SKIP", f"no GPM before Hopper (compute capability {capability or 'unknown'})"
    util = mean_utilisation_pct(result)
    sm, tensor = mean_activity_pct(result, "sm_active_pct"), mean_activity_pct(result, "tensor_active_pct")
    if sm is None or tensor is None:
        return "FAIL", "no GPM readings from a Hopper GPU (nvmlGpmMetricsGet): SM and tensor activity unknown"
    text = f"utilisation {util if util is not None else float('nan'):.0f}%; {activity_text(result)}"
    in_range = all(0.0 <= value <= 100.0 for value in (sm, tensor))
    below = util is None or sm <= util + ACTIVITY_OVER_UTIL_PTS
    return ("PASS" if in_range and below else "FAIL"), text


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
    if result.config.parallel == "ddp":
        text += "; torch.distributed's syncs (NCCL) are not covered"
    return measured == steps, text


def check_profile(result: aw.BurstResult) -> Outcome:
    """The capture timed kernels on the device, and its trace file holds them."""
    capture = result.profile
    if capture is None:
        return False, "no profile captured"
    if capture.error:
        return False, f"profiling failed ({capture.error}); the burst's measurement was kept"
    device_ms = sum(op.self_device_ms for op in capture.top_operators)
    if not os.path.isfile(capture.trace_path):
        return False, f"trace file missing: {capture.trace_path}"
    kernels = count_kernel_events(capture.trace_path)
    size_mb = os.path.getsize(capture.trace_path) / 1e6
    text = (f"{capture.steps} steps, top operators {device_ms:.2f} ms device self time, trace {size_mb:.1f} MB "
            f"with {kernels} kernel events")
    return device_ms > 0 and kernels > 0, text


# -- the GPU-marked tests: their log --------------------------------------------------------------
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


def run_in_group(command: list[str], log_path: Path, timeout_s: float, cwd: Path = ROOT,
                 env: dict[str, str] | None = None) -> tuple[int, bool]:
    """Run ``command`` in its own session (with ``env``, else this process's environment), output to ``log_path``;
    ``(exit code, timed out)``.

    Its whole process group (pytest, its forkserver, the ranks and their loader workers) is killed at
    the end, so nothing it started can outlive it and hold the GPU while the ladders run.
    """
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=env)
        try:
            process.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return process.returncode, timed_out


# -- the GPU-marked tests: which, in what order, within what time -------------------------------------
GPU_MARK = "pytest.mark.gpu"
DDP_MARK = 'parallel="ddp"'
BURST_CALLS = ("run_burst", "find_batch_size")


def gpu_test_files(tests_dir: Path = ROOT / "tests") -> list[Path]:
    """The test files that hold GPU-marked tests, named so pytest collects those alone, the DDP ones last.

    Why not ``pytest -m gpu tests``: that imports every test module before deselecting, and a GPU
    machine's stock image lacks the panel's and the notebooks' packages (ipywidgets, plotly, nbformat,
    webdataset), so one collection error would stop every GPU test from running. DDP goes last: NCCL's
    start is the likeliest to hang, and a hang must not cost the tests that could still run.
    """
    files = [path for path in tests_dir.rglob("test_*.py") if GPU_MARK in path.read_text() and _gpu_tests(path)]
    return sorted(files, key=lambda path: (any(ddp for _, ddp, _ in _gpu_tests(path)), str(path)))


def _gpu_tests(path: Path) -> list[tuple[ast.FunctionDef, bool, list[ast.expr]]]:
    """The GPU-marked test functions of a file: each with whether it runs DDP, and its marks (its own and the
    module's ``pytestmark``)."""
    text = path.read_text()
    tree = ast.parse(text)
    module_marks = next((node.value for node in tree.body if isinstance(node, ast.Assign)
                         and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)), None)
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            marks = [*node.decorator_list, *_listed(module_marks)]
            if any(_is_mark(mark, "gpu") for mark in marks):
                found.append((node, DDP_MARK in (ast.get_source_segment(text, node) or ""), marks))
    return found


def audit_gpu_tests(files: list[Path]) -> list[str]:
    """What keeps the GPU tests from fitting the plan: a GPU test without a timeout of at most
    ``GPU_TEST_TIMEOUT_S`` (``pytest.mark.timeout``, on it or in ``pytestmark``), a burst in one without a
    ``timeout_s`` of at most ``GPU_TEST_BURST_TIMEOUT_S`` (``run_burst(..., options=BurstOptions(timeout_s=...))``;
    ``find_batch_size(..., engine=BurstEngine(BurstOptions(timeout_s=...)))``), a DDP test anywhere but
    last. Read from the files' syntax, so it holds on a machine that cannot run them."""
    problems, order = [], []
    for path in files:
        constants = _constants(ast.parse(path.read_text()))
        for node, ddp, marks in _gpu_tests(path):
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}::{node.name}"
            order.append((where, ddp))
            timeouts = [_number(mark.args[0], constants) for mark in marks
                        if _is_mark(mark, "timeout") and isinstance(mark, ast.Call) and mark.args]
            if not timeouts or timeouts[0] is None or timeouts[0] > GPU_TEST_TIMEOUT_S:
                problems.append(f"{where}: no pytest.mark.timeout of at most {GPU_TEST_TIMEOUT_S:g} s")
            problems += [f"{where}: {problem}" for problem in _burst_timeouts(node, constants)]
    ddp = [index for index, (_, is_ddp) in enumerate(order) if is_ddp]
    if ddp and ddp != list(range(len(order) - len(ddp), len(order))):
        problems.append(f"DDP tests must run last: {', '.join(order[i][0] for i in ddp)}")
    return problems


def _burst_timeouts(test: ast.FunctionDef, constants: dict[str, float]) -> list[str]:
    problems = []
    for call in (node for node in ast.walk(test) if isinstance(node, ast.Call)):
        name = getattr(call.func, "id", getattr(call.func, "attr", ""))
        if name not in BURST_CALLS:
            continue
        keywords = {k.arg: k.value for k in call.keywords}
        options = keywords.get("options")
        if name == "find_batch_size":
            engine = keywords.get("engine")
            options = engine.args[0] if isinstance(engine, ast.Call) and _named(engine, "BurstEngine") else None
        limit = _keyword(options, "timeout_s") if isinstance(options, ast.Call) and _named(options, "BurstOptions") \
            else None
        seconds = _number(limit, constants) if limit is not None else None
        if seconds is None or seconds > GPU_TEST_BURST_TIMEOUT_S:
            problems.append(f"{name}(...) without a timeout_s of at most {GPU_TEST_BURST_TIMEOUT_S:g} s "
                            f"(line {call.lineno})")
    return problems


def _named(call: ast.Call, name: str) -> bool:
    """``name(...)`` or ``<module>.name(...)``."""
    return getattr(call.func, "id", getattr(call.func, "attr", "")) == name


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _constants(tree: ast.Module) -> dict[str, float]:
    """Module-level ``NAME = <number>`` assignments."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, int | float):
                    found[target.id] = float(node.value.value)
    return found


def _number(node: ast.expr, constants: dict[str, float]) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    return constants.get(node.id) if isinstance(node, ast.Name) else None


def _listed(node: ast.expr | None) -> list[ast.expr]:
    if node is None:
        return []
    return list(node.elts) if isinstance(node, ast.List | ast.Tuple) else [node]


def _is_mark(node: ast.expr, name: str) -> bool:
    """``pytest.mark.<name>`` or ``pytest.mark.<name>(...)``."""
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr == name and ast.unparse(target.value) == "pytest.mark"


# -- bursts under the plan --------------------------------------------------------------------------
@dataclass
class BurstOutcome:
    """A burst run under the plan: its result (None when it did not start) and how it ended."""

    result: aw.BurstResult | None
    status: Literal["ok", "failed", "skipped", "cut"]
    message: str = ""
    #: This machine's clock (time.time) when the burst was called, where its own clock starts within the checks
    #: before launch (tens of ms): what lines its readings up with nvidia-smi dmon's.
    wall_origin: float | None = None


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def run_budgeted(workload: aw.Workload, config: aw.Config, *, timeout_s: float, cap_s: float, label: str,
                 options: aw.BurstOptions | None = None, **length: Any) -> BurstOutcome:
    """A burst (``length``: its steps or seconds; ``options``: anything else it asks for) with the timeout the plan
    gave it; a timeout caused by the plan's cut (below the cap) is no failure.

    Anything else that keeps the burst from a valid measurement -- a BurstError, a refused config, a
    diverged loss, an engine API that changed under the script -- is a failure with its first line.
    """
    wall = time.time()
    try:
        result = aw.run_burst(workload, config, label=label, **length,
                              options=replace(options or aw.BurstOptions(), timeout_s=timeout_s))
    except aw.BurstTimeout as exc:
        if timeout_s < cap_s:
            return BurstOutcome(exc.result, "cut", f"cut by the plan after {timeout_s:.0f} s", wall)
        return BurstOutcome(exc.result, "failed", first_line(str(exc)), wall)
    except aw.BurstError as exc:
        return BurstOutcome(exc.result, "failed", first_line(str(exc)), wall)
    except Exception as exc:
        return BurstOutcome(None, "failed", f"{type(exc).__name__}: {first_line(str(exc))}", wall)
    if not result.ok:
        why = first_line(result.error.message) if result.error is not None else ""
        return BurstOutcome(result, "failed", f"status {result.status}: {why}", wall)
    return BurstOutcome(result, "ok", wall_origin=wall)


def verdict(outcome: BurstOutcome, check: Callable[[aw.BurstResult], Outcome]) -> tuple[Status, str]:
    """PASS/FAIL from ``check`` on a finished burst; SKIP when the plan left it out; FAIL when it failed."""
    if outcome.status in ("skipped", "cut"):
        return "SKIP", outcome.message
    if outcome.status == "failed" or outcome.result is None:
        return "FAIL", f"burst failed: {outcome.message}"
    ok, message = check(outcome.result)
    return ("PASS" if ok else "FAIL"), message


def graded_verdict(outcome: BurstOutcome, check: Callable[[aw.BurstResult], tuple[Status, str]]) -> tuple[Status, str]:
    """As :func:`verdict`, for a check that grades a finished burst itself (it may SKIP what the GPU cannot show)."""
    if outcome.status != "ok" or outcome.result is None:
        return verdict(outcome, lambda result: (False, ""))
    return check(outcome.result)


# -- the report -------------------------------------------------------------------------------------
class Report:
    """Everything measured so far, with the plan and its timeline, rewritten to disk after every change."""

    def __init__(self, path: Path, header: dict[str, Any], budget: Budget) -> None:
        self.path, self.budget = path, budget
        self.data: dict[str, Any] = {**header, "plan": [], "timeline": [], "phases": {}, "checks": [],
                                     "ladders": {}, "bursts": {}}
        self.steps: list[Step] = []
        self.outcomes: dict[str, BurstOutcome] = {}
        self.failed = self.passed = False

    def save(self) -> None:
        """Write atomically, so a run killed mid-write still leaves the previous complete file."""
        self.data["elapsed_s"] = round(self.budget.elapsed(), 1)
        self.data["failed"] = self.failed
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".json.partial")
        partial.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(partial, self.path)

    def plan(self, plan: list[Work]) -> None:
        self.data["plan"] = [{"work": w.name, "phase": w.phase, "planned_s": w.planned_s, "floor_s": w.floor_s,
                              "cap_s": w.cap_s, "required": w.required} for w in plan]
        self.save()

    def step(self, step: Step) -> None:
        """One piece of work done (or skipped): the timeline and the per-phase totals, then the file."""
        self.steps.append(step)
        if step.status == "SKIP" and step.why:
            # A required piece the budget could not hold fails the call: its answer is missing, not optional.
            self.line("FAIL" if step.work.required else "SKIP", step.work.name, step.why)
        self.data["timeline"] = [s.to_dict() for s in self.steps]
        self.data["phases"] = phase_totals(self.steps)
        self.save()

    def line(self, status: Status, name: str, message: str) -> None:
        self.failed = self.failed or status == "FAIL"
        self.passed = self.passed or status == "PASS"
        print(f"{status:<4}  {name:<24} {message}", flush=True)

    def check(self, name: str, status: Status, message: str, **extra: Any) -> None:
        self.line(status, name, message)
        self.data["checks"].append({"name": name, "status": status, "message": message, **extra})
        self.save()

    def burst(self, key: str, outcome: BurstOutcome) -> None:
        self.outcomes[key] = outcome
        self.data["bursts"][key] = {"status": outcome.status, "message": outcome.message,
                                    "wall_origin": outcome.wall_origin,
                                    "result": outcome.result.to_dict() if outcome.result is not None else None}
        self.save()

    def dmon(self, rows: list[Any], started: bool) -> None:
        """Each finished burst's NVML utilisation and energy beside nvidia-smi dmon's over the same seconds (in the
        JSON's ``dmon``), and one line saying how far apart they were."""
        if not started:
            self.check("dmon vs NVML", "SKIP", "nvidia-smi dmon did not run (no nvidia-smi here)")
            return
        compared = {key: found for key, outcome in self.outcomes.items()
                    if outcome.result is not None and outcome.wall_origin is not None
                    and (found := compare_with_dmon(outcome.result, outcome.wall_origin, rows)) is not None}
        self.data["dmon"] = compared
        gaps = [abs(c["util_gap_pts"]) for c in compared.values() if c["util_gap_pts"] is not None]
        ratios = [c["energy_ratio"] for c in compared.values() if c["energy_ratio"] is not None]
        if not compared:
            self.check("dmon vs NVML", "INFO", f"{len(rows)} dmon rows, none wholly inside a measured window")
            return
        util = f"utilisation gap at most {max(gaps):.0f} pts" if gaps else "no utilisation to compare"
        energy = (f"energy NVML/dmon {min(ratios):.2f}-{max(ratios):.2f}" if ratios else "no energy to compare")
        self.check("dmon vs NVML", "INFO", f"{len(compared)} bursts against {len(rows)} dmon rows: {util}; {energy}")


# -- the call's work --------------------------------------------------------------------------------
def conv_workload() -> aw.Workload:
    """A small CNN on learnable synthetic images already in memory: the loss falls within a few dozen steps."""
    images, labels = synthetic_images(2048, 32, 10, seed=0)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255.0)
    return aw.Workload(model=functools.partial(SmallCNN, num_classes=10),
                       dataset=TensorDataset(x, torch.from_numpy(labels)), loss_fn=F.cross_entropy, batch_size=64,
                       name="check-conv")


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
        row["mfu"], row["mfu_basis"] = mfu(result), mfu_basis(result)
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


#: The check bursts: (workload, config, the options of its burst) by name. "mlp" is the MLP demo, "conv"
#: the small CNN; each check reads one of them.
NO_SYNC = aw.Config(sync_every=0, optimizer_impl="fused", pin_memory=True, non_blocking=True)
CHECK_BURSTS: dict[str, tuple[str, aw.Config, aw.BurstOptions]] = {
    "probe": ("mlp", aw.Config(), aw.BurstOptions(profile_steps=3)),
    # Pinned memory and non_blocking too: a blocking copy from pageable memory is itself a host sync.
    "no host sync": ("mlp", NO_SYNC, aw.BurstOptions(sync_debug=True)),
    "fp16+fused": ("mlp", aw.Config(precision="fp16", optimizer_impl="fused"), aw.BurstOptions()),
    "channels_last": ("conv", aw.Config(channels_last=True), aw.BurstOptions()),
    "reduce-overhead": ("mlp", aw.Config(compile_mode="reduce-overhead"), aw.BurstOptions()),
}
#: The order compile work runs in, most wanted first: the LM's compile is the ladder's largest bf16-era step.
COMPILE_ORDER = ("lm", "image")


def planned_seconds(name: str, compiles: bool) -> float:
    return H200_SECONDS.get(name, H200_SECONDS["lm +compile"] if compiles else H200_SECONDS["image +loader"])


def build_ladders(device: aw.DeviceInfo, demos: list[str], size: str) -> dict[str, list[Rung]]:
    """Each demo's classic ladder on ``device``, at the reference runs' batch size (GPU size). The rungs depend
    on the device and the model alone, so a few items of data stand in for the dataset here."""
    ladders = {}
    for demo in demos:
        workload = aw.demo_workload(demo, size=size, num_samples=64)
        wanted = REFERENCE_BATCH.get(demo) if size == "gpu" else None
        base = aw.Config(batch_size=wanted) if wanted and wanted != workload.batch_size else None
        ladders[demo] = aw.classic_ladder(workload, device, base=base)
    return ladders


class Call:
    """The pieces of work of one call, and what they share: the report, the device, the check bursts, the
    ladders' workloads and baselines."""

    def __init__(self, report: Report, device: aw.DeviceInfo, args: argparse.Namespace) -> None:
        self.report, self.device, self.args = report, device, args
        self.checks: dict[str, BurstOutcome] = {}
        self.baselines: dict[str, float | None] = {}
        self.workloads: dict[str, aw.Workload] = {}
        self.profile_dir = tempfile.mkdtemp(prefix="gpu-check-profile-")

    def plan(self, ladders: dict[str, list[Rung]]) -> list[Work]:
        """Fail fast, the GPU tests, the eager checks and rungs, then the compile work, most wanted first."""
        works = [Work("fail fast", "fail fast", H200_SECONDS["fail fast"], FAIL_FAST_S, FAIL_FAST_S, True,
                      self.fail_fast)]
        if not self.args.skip_tests:
            works.append(Work("gpu tests", "gpu tests", H200_SECONDS["gpu tests"], TESTS_FLOOR_S, TESTS_CAP_S,
                              action=self.gpu_tests))
        works += [Work(f"check {key}", "checks", H200_SECONDS[f"check {key}"], CHECK_FLOOR_S, CHECK_CAP_S,
                       action=functools.partial(self.check, key, CHECK_CAP_S))
                  for key in CHECK_BURSTS if key != "reduce-overhead"]
        floor = self.args.seconds + RUNG_SETUP_S
        for demo, rungs in ladders.items():
            works += [Work(f"{demo} {rung.name}", "eager rungs", planned_seconds(f"{demo} {rung.name}", False), floor,
                           RUNG_CAP_S, True, functools.partial(self.rung, demo, rung, RUNG_CAP_S))
                      for rung in rungs if rung.config.compile_mode == "off"]
        compiled = {demo: [rung for rung in rungs if rung.config.compile_mode != "off"]
                    for demo, rungs in ladders.items()}
        order = sorted(compiled, key=lambda demo: COMPILE_ORDER.index(demo) if demo in COMPILE_ORDER else 99)
        first, rest = [(d, compiled[d][:1]) for d in order], [(d, compiled[d][1:]) for d in order]
        works += self._compile_rungs(first, required={"lm"})
        works.append(Work("check reduce-overhead", "compile", H200_SECONDS["check reduce-overhead"], COMPILE_FLOOR_S,
                          COMPILE_CAP_S, action=functools.partial(self.check, "reduce-overhead", COMPILE_CAP_S)))
        works += self._compile_rungs(rest, required=set())
        return works

    def _compile_rungs(self, rungs: list[tuple[str, list[Rung]]], required: set[str]) -> list[Work]:
        return [Work(f"{demo} {rung.name}", "compile", planned_seconds(f"{demo} {rung.name}", True), COMPILE_FLOOR_S,
                     COMPILE_CAP_S, demo in required, functools.partial(self.rung, demo, rung, COMPILE_CAP_S))
                for demo, demo_rungs in rungs for rung in demo_rungs]

    def run(self, work: Work, timeout: float) -> str:
        """One piece of work; a bug in it must not cost the others."""
        try:
            return work.action(timeout)
        except Exception as exc:
            self.report.check(work.name, "FAIL", f"{type(exc).__name__}: {first_line(str(exc))}",
                              traceback=traceback.format_exc()[-4000:])
            return "FAIL"

    # -- the pieces ---------------------------------------------------------------------------------
    def fail_fast(self, timeout: float) -> str:
        """Five CUDA steps of one rank: if the ranks cannot start, nothing later can, so the call stops here."""
        outcome = run_budgeted(aw.demo_workload("mlp", size="small"), aw.Config(), timeout_s=timeout, cap_s=timeout,
                               label="fail fast", steps=5, options=aw.BurstOptions(warmup_steps=1))
        self.report.burst("fail fast", outcome)
        if outcome.status != "ok" or outcome.result is None:
            trace = outcome.result.error.traceback if outcome.result is not None and outcome.result.error else ""
            why = outcome.message
            if any(marker in why or marker in trace for marker in (CUDA_REINIT, CUDA_INIT_ERROR)):
                why = (f"{why} -- the forkserver initialised CUDA before it forked the ranks, so every burst "
                       "fails the same way: find what imports or calls CUDA at its preload, or what loaded the "
                       "CUDA driver (torch.cuda.is_available()) in the process it was forked from")
            self.report.check("fail fast", "FAIL", f"{why}; stopping: nothing later can run")
            return "STOP"
        result = outcome.result
        kind = result.environment.get("device_kind")
        if kind != "cuda" and not self.args.allow_cpu:
            self.report.check("fail fast", "FAIL", f"the burst trained on {kind}, not CUDA; stopping")
            return "STOP"
        cuda_free = not torch.cuda.is_initialized()
        status: Status = "PASS" if cuda_free else "FAIL"
        self.report.check("fail fast", status, f"5 steps on {result.environment.get('device_name')} in "
                          f"{result.wall_s:.1f} s (first step {result.first_step_s or 0:.2f} s); this process "
                          + ("stayed CUDA-free" if cuda_free else "initialised CUDA: it could no longer launch DDP"))
        return status

    def gpu_tests(self, timeout: float) -> str:
        log_path = self.report.path.parent / "gpu_tests.log"
        # One process, in file order (DDP last), whatever the project's addopts: the GPU machine has no pytest-xdist.
        command = [sys.executable, "-m", "pytest", "-v", "-rfE", "-m", "gpu", "-p", "no:cacheprovider",
                   "-o", "addopts=", *map(str, gpu_test_files())]
        started = time.monotonic()
        returncode, timed_out = run_in_group(command, log_path, timeout)
        seconds = time.monotonic() - started
        outcomes = parse_pytest_outcomes(log_path.read_text(errors="replace"))
        status, message = summarise_tests(outcomes, returncode, timed_out, seconds)
        self.report.check("gpu tests", status, message, returncode=returncode, timed_out=timed_out,
                          outcomes=outcomes, log=log_path.name)
        return status

    def check(self, key: str, cap_s: float, timeout: float) -> str:
        """One check burst and the checks that read it."""
        workload_name, config, options = CHECK_BURSTS[key]
        workload = conv_workload() if workload_name == "conv" else self.workload("mlp", self.args.size)
        if options.profile_steps:
            options = replace(options, profile_dir=self.profile_dir)
        outcome = run_budgeted(workload, config, timeout_s=timeout, cap_s=cap_s, label=key, steps=CHECK_STEPS,
                               options=options)
        self.checks[key] = outcome
        self.report.burst(f"check/{key}", outcome)
        verdicts = []
        if key == "probe":
            total = self.device.gpus[0].memory_bytes if self.device.gpus else 0
            labels = {f"cuda:{g.index}" for g in self.device.gpus[:1]}
            verdicts += [("peak memory", verdict(outcome, lambda r: check_peak_memory(r, total)), {}),
                         ("mfu", verdict(outcome, check_mfu), {}),
                         ("telemetry", verdict(outcome, lambda r: check_telemetry(r, labels)), {}),
                         ("gpm activity", graded_verdict(outcome, check_activity), {}),
                         ("profile", verdict(outcome, check_profile),
                          {"trace": copy_small_trace(outcome, self.report.path.parent)})]
        elif key == "no host sync":
            verdicts.append(("no host sync", verdict(outcome, lambda r: check_no_host_sync(r, CHECK_STEPS)), {}))
        else:
            verdicts.append((f"{key} trains", verdict(outcome, check_trains), {}))
        for name, (status, message), extra_fields in verdicts:
            self.report.check(name, status, message, **extra_fields)
        statuses = {status for _, (status, _), _ in verdicts}
        return "FAIL" if "FAIL" in statuses else "PASS" if "PASS" in statuses else "SKIP"

    def rung(self, demo: str, rung: Rung, cap_s: float, timeout: float) -> str:
        workload = self.workload(demo, self.args.size)
        entry = self.report.data["ladders"].setdefault(demo, {
            "workload": workload.name, "batch_size": rung.config.batch_size or workload.batch_size,
            "demo_batch_size": workload.batch_size, "seconds_per_rung": self.args.seconds,
            "reference_baseline_samples_per_s": REFERENCE_BASELINE.get(demo), "rungs": []})
        outcome = run_budgeted(workload, rung.config, timeout_s=timeout, cap_s=cap_s, seconds=self.args.seconds,
                               label=rung.name)
        if rung.name == "baseline" and outcome.status == "ok" and outcome.result is not None:
            self.baselines[demo] = outcome.result.samples_per_s
        row = ladder_row(demo, rung.name, outcome, self.baselines.get(demo))
        entry["rungs"].append(row)
        self.report.line(rung_status(row), f"{demo} {rung.name}", rung_text(row))
        self.report.burst(f"ladder/{demo}/{rung.name}", outcome)
        return rung_status(row)

    def workload(self, name: str, size: str) -> aw.Workload:
        if name not in self.workloads:
            self.workloads[name] = aw.demo_workload(name, size=size)
        return self.workloads[name]

    def finish(self) -> None:
        """What reads several pieces: timing over every finished check burst, each ladder side by side."""
        finished = {k: b.result for k, b in self.checks.items() if b.status == "ok" and b.result is not None}
        if finished:
            ok, message = check_timing_over(finished)
            self.report.check("timing consistency", "PASS" if ok else "FAIL", message)
        elif self.checks:
            self.report.check("timing consistency", "SKIP", "no check burst finished")
        for demo, entry in self.report.data["ladders"].items():
            rows = sorted(entry["rungs"], key=lambda r: list(REFERENCE.get(demo, {})).index(r["rung"])
                          if r["rung"] in REFERENCE.get(demo, {}) else 99)
            rate = self.baselines.get(demo)
            base = f"baseline {rate:,.0f} samples/s" if rate else "no baseline"
            reference = REFERENCE_BASELINE.get(demo)
            ref_text = f" (reference {reference:,.0f})" if reference else ""
            self.report.line("INFO", f"{demo} ladder", f"{side_by_side(rows)}; {base}{ref_text}, batch "
                             f"{entry['batch_size']}")
        shutil.rmtree(self.profile_dir, ignore_errors=True)


# -- before anything runs: what can be known without a GPU ------------------------------------------
def preflight(device: aw.DeviceInfo, ladders: dict[str, list[Rung]]) -> list[tuple[Status, str, str]]:
    """(status, name, message) of what the call's work needs and a CPU can check at the device's real sizes:
    every planned config is valid there; the GPU tests fit the plan (:func:`audit_gpu_tests`); the batch-size
    test's ``memory_cap=0.05`` becomes ``memory_fraction=0.05`` on this device's memory (it fell just below on
    an H200's 143,771 MiB, and the knob refused it)."""
    lines: list[tuple[Status, str, str]] = []
    configs = [rung.config for rungs in ladders.values() for rung in rungs] + [c for _, c, _ in CHECK_BURSTS.values()]
    refused = []
    for config in configs:
        try:
            check_config(config, device)
        except aw.ConfigError as exc:
            refused.append(f"{config.label()}: {first_line(str(exc))}")
    lines.append(("FAIL" if refused else "PASS", "configs",
                  "; ".join(refused) if refused else f"{len(configs)} planned configs valid on {device.name}"))
    problems = audit_gpu_tests(gpu_test_files())
    lines.append(("FAIL" if problems else "PASS", "gpu test limits", "; ".join(problems) if problems else (
        f"every GPU test has a timeout of at most {GPU_TEST_TIMEOUT_S:g} s, its bursts at most "
        f"{GPU_TEST_BURST_TIMEOUT_S:g} s, DDP last")))
    if device.gpus:
        lines.append(_batch_size_cap(device))
    return lines


def _batch_size_cap(device: aw.DeviceInfo) -> tuple[Status, str, str]:
    asked: list[aw.Config] = []

    def no_room(workload: aw.Workload, config: aw.Config, **kwargs: Any) -> aw.BurstResult:
        asked.append(config)
        raise aw.WorkerOutOfMemory("preflight: nothing runs", aw.BurstResult(workload.name, config, "failed"))

    memory = device.gpus[0].memory_bytes
    try:
        aw.find_batch_size(aw.demo_workload("mlp", size="small"), memory_cap=0.05, max_batch_size=1, device=device,
                           engine=no_room)
    except Exception as exc:
        return "FAIL", "batch-size cap", f"find_batch_size(memory_cap=0.05) on {memory / 2**20:,.0f} MiB: {exc}"
    fraction = asked[0].memory_fraction if asked else None
    return ("PASS" if fraction == 0.05 else "FAIL", "batch-size cap",
            f"find_batch_size(memory_cap=0.05) on {memory / 2**20:,.0f} MiB runs memory_fraction={fraction!r}")


# -- the dry run: the plan for an H200, on any machine ----------------------------------------------
H200_MIB = 143_771  # what NVML reports for one H200


def fake_h200() -> aw.DeviceInfo:
    gpu = GpuInfo(0, 0, "NVIDIA H200", H200_MIB * 2**20, "GPU-00000000-0000-0000-0000-000000000000", (9, 0))
    return aw.DeviceInfo(cpu_count=16, cpu_name="the H200 machine's 16 cores", gpus=(gpu,), driver="(dry run)")


def dry_run(args: argparse.Namespace) -> int:
    """Plan the call for an H200 with the planned seconds as its clock; 0 when the plan fits, 1 when not."""
    device = fake_h200()
    ladders = build_ladders(device, args.workloads, args.size)
    clock = PlannedClock(H200_SECONDS["start"])
    budget = Budget(args.budget_s, clock=clock, started=0.0)
    with tempfile.TemporaryDirectory() as scratch:
        report = Report(Path(scratch) / "plan.json", {}, budget)
        call = Call(report, device, args)
        plan = call.plan(ladders)
        shutil.rmtree(call.profile_dir, ignore_errors=True)

    def simulate(work: Work, timeout: float) -> str:
        clock.advance(min(work.planned_s, timeout))
        return "PLANNED" if work.planned_s <= timeout else "CUT"

    print(f"GPU check plan (dry run) for {device.name}, {H200_MIB:,} MiB (NVML), 16 cores: budget "
          f"{args.budget_s:.0f} s of the call's {CALL_LIMIT_S:.0f} s, the clock the H200's planned seconds")
    print(f"{'start s':>8} {'planned':>8} {'timeout':>8}  {'work':<24} {'phase':<12} status")
    print(f"{0.0:>8.0f} {H200_SECONDS['start']:>8.0f} {'-':>8}  {'start-up':<24} {'start':<12} python, imports, plan")
    steps = execute(plan, budget, simulate, on_step=lambda step: print(
        f"{step.start_s:>8.0f} {step.work.planned_s:>8.0f} "
        f"{'-' if step.timeout_s is None else f'{step.timeout_s:.0f}':>8}  {step.work.name:<24} "
        f"{step.work.phase:<12} {step.status if step.status != 'SKIP' else step.why}"
        + (" (required)" if step.work.required else "")))
    return plan_verdict(plan, steps, preflight(device, ladders), budget, args.budget_s, CALL_LIMIT_S,
                        H200_SECONDS["start"])


def plan_verdict(plan: list[Work], steps: list[Step], checks: list[tuple[str, str, str]], budget: Budget,
                 budget_s: float, call_limit_s: float, start_s: float) -> int:
    """A dry run's end, for this call and the second GPU script alike: the preflight checks, the planned seconds
    per phase, where the plan ends, and whether it fits (0) or not (1, saying what does not)."""
    for status, name, message in checks:
        print(f"preflight {status:<4} {name}: {message}")
    end = budget.elapsed()
    missing = [s.work.name for s in steps if s.work.required and s.status != "PLANNED"]
    skipped = [s.work.name for s in steps if s.status == "SKIP"]
    fits = end <= budget_s <= call_limit_s and not missing and all(c[0] == "PASS" for c in checks)
    totals = ", ".join(f"{phase} {t['planned_s']:.0f} s" for phase, t in phase_totals(steps).items())
    print(f"planned per phase: start {start_s:.0f} s, {totals}")
    print(f"ends at {end:.0f} s of {budget_s:.0f} s ({budget_s - end:.0f} s to spare); skipped: "
          f"{', '.join(skipped) or 'nothing'}")
    required = ", ".join(w.name for w in plan if w.required)
    print(("FITS: every required piece runs: " + required) if fits else
          ("DOES NOT FIT: " + (f"required but not run in full: {', '.join(missing)}" if missing else
                               "a preflight check failed" if end <= budget_s else "over the budget")))
    return 0 if fits else 1


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
        "host": host_memory(),  # the VM's RAM starts small and grows: MemTotal at the start, /dev/shm's size
        "budget_s": args.budget_s, "call_limit_s": CALL_LIMIT_S, "size": args.size, "seconds_per_rung": args.seconds,
        "reference_batch_sizes": REFERENCE_BATCH, "planned_on": "H200_SECONDS (one H200, torch 2.11)",
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
                        help="the whole call's budget from process start (default: the device call's "
                             f"{CALL_LIMIT_S:.0f} s less {CALL_RESERVE_S:.0f} s, %(default)s)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per ladder rung")
    parser.add_argument("--workloads", default="image,lm", type=demo_names,
                        help="demos to run the ladder on (default image,lm)")
    parser.add_argument("--size", default="gpu", choices=DEMO_SIZES)
    parser.add_argument("--skip-tests", action="store_true", help="leave out the GPU-marked tests")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a GPU: a dry run of the plumbing (GPU-only checks fail by design)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan for one H200 (fakes of its size, its planned seconds as the clock) "
                             "and exit 0 only when it fits; runs nothing")
    parser.add_argument("--no-dmon", action="store_true", help="do not run nvidia-smi dmon beside the call")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    budget = Budget(args.budget_s, started=psutil.Process().create_time())
    device = aw.probe_device()
    report = Report(output_dir() / "gpu_check.json", header(args, device), budget)
    report.save()  # at once: a call cut short anywhere still leaves its file
    print(f"GPU check on {device.name} ({len(device.gpus)} GPU(s), driver {device.driver}); budget "
          f"{args.budget_s:.0f} s from process start; writing {report.path}", flush=True)
    if not device.has_cuda and not args.allow_cpu:
        report.check("cuda", "FAIL", "no CUDA GPU visible through NVML (--allow-cpu runs a CPU dry run)")
        return 2
    call = Call(report, device, args)
    ladders = build_ladders(device, args.workloads, args.size)
    plan = call.plan(ladders)
    report.plan(plan)
    report.step(Step(Work("start", "start", H200_SECONDS["start"], 0.0, 0.0), 0.0, None, budget.elapsed(), "INFO",
                     "python, imports, the plan"))
    for status, name, message in preflight(device, ladders):
        report.check(f"preflight {name}", status, message)
    with Sidecars(report.path.parent, dmon=not args.no_dmon) as sidecars:
        steps = execute(plan, budget, call.run, on_step=report.step)
        call.finish()
        report.dmon(sidecars.dmon_rows(), sidecars.dmon_started)
    report.save()
    stopped = steps and steps[-1].status == "STOP"
    overall = "FAIL" if report.failed else "PASS" if report.passed else "SKIP"
    print(f"{overall}  overall in {budget.elapsed():.0f} s" + (" (stopped after fail fast)" if stopped else "")
          + f"; wrote {report.path}", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
