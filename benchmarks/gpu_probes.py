"""The device plan's second run opens with these probes: questions about the machine and torch that a burst cannot
answer from inside, each in a fresh Python process of its own with a timeout, so a hang or a crash costs one probe.

1. **is_available before import**: a notebook that ran ``torch.cuda.is_available()`` (or imported a library that
   does, as transformers does) before ``import accel_widgets`` has loaded the CUDA driver; the probe then runs a
   3-step burst. PASS: it trains; FAIL: how it failed (the engine must refuse or cope, never "initialization error").
2. **expandable segments**: ``PYTORCH_ALLOC_CONF=expandable_segments:True`` beside
   ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False``; the allocator's snapshot says which torch read. PASS:
   expandable (torch reads PYTORCH_ALLOC_CONF first, as knobs/memory.py writes it).
3. **reduce-overhead, the model's own loss**: a model that returns ``{"loss": ...}`` itself, compiled with CUDA graphs,
   its losses read every 4 steps. PASS: the burst trains and every step's loss is its own.
4. **bf16 matmul ceiling**: 8192 x 8192 x 8192 in bf16 on random data, 10 timed after 3 warm-ups (CUDA events): the
   TFLOP/s MFU is read against (the H200 datasheet's dense 989.4; 769-798 measured on these machines before).
5. **/dev/shm and RAM**: their sizes, 1 GiB written to and removed from /dev/shm, and MemTotal before and after 4 GiB
   of this process's memory is touched (the VM's RAM starts small and grows as it is used).

    python benchmarks/gpu_probes.py [--dry-run] [--budget-s 85] [--call-start EPOCH]

The run: ``T0=$(date +%s.%N); python3 benchmarks/gpu_probes.py --call-start $T0; python3 benchmarks/gpu_modern.py
--call-start $T0``, both counting one 280 s budget from ``T0`` (benchmarks/README.md gives the exact call).
``--dry-run`` plans the probes for an H200 with their planned seconds as the clock; ``tests/benchmarks/
test_gpu_probes.py`` runs it in CI. Writes ``$OUT/gpu_probes.json`` (``benchmarks/results/`` without ``$OUT``) at once
and after every probe, each with its status, numbers and the tail of its output.

The module imports nothing heavy at its top: a probe's process must import torch and the package in the order the
probe chooses.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CALL_LIMIT_S, CALL_RESERVE_S = 300.0, 20.0
#: The probes' share of the second run (gpu_modern.py has what is left of the 280 s).
DEFAULT_BUDGET_S = 85.0
ANSWER = "PROBE-ANSWER "  # the line a probe's process ends with: its answer as JSON
LOG_TAIL_CHARS = 3000
GiB = 2**30
MATMUL_N, MATMUL_WARMUP, MATMUL_TIMED = 8192, 3, 10
H200_BF16_DENSE_TFLOPS = 989.4

#: Seconds each probe should take on one H200 (``import torch`` 2.8 s there, the forkserver's first start 7.6 s, a
#: small model's cold compile with CUDA graphs 15-30 s) and the most it may take: planned, not yet measured.
H200_SECONDS: dict[str, tuple[float, float]] = {  # name -> (planned, cap)
    "start": (3.0, 0.0),
    "is_available before import": (15.0, 30.0),
    "expandable segments": (6.0, 15.0),
    "reduce-overhead own loss": (30.0, 45.0),
    "bf16 matmul ceiling": (8.0, 20.0),
    "shm and ram": (5.0, 15.0),
}


# -- the probes: each runs in a process of its own and returns its answer -----------------------------------------
def probe_is_available_first() -> dict[str, Any]:
    import torch

    available = torch.cuda.is_available()  # cuInit: the CUDA driver is loaded from here on
    import accel_widgets as aw

    try:
        result = aw.run_burst(aw.demo_workload("mlp", size="small"), aw.Config(), steps=3,
                              options=aw.BurstOptions(warmup_steps=1, timeout_s=25))
    except Exception as exc:
        return {"status": "FAIL", "message": f"{type(exc).__name__}: {_first_line(str(exc))}",
                "cuda_available": available}
    ok = result.ok and result.environment.get("device_kind") == ("cuda" if available else "cpu")
    return {"status": "PASS" if ok else "FAIL", "cuda_available": available,
            "message": f"3 steps on {result.environment.get('device_name')} after is_available() ran first"
            if result.ok else f"status {result.status}: {result.error.message if result.error else ''}"}


def probe_expandable_segments() -> dict[str, Any]:
    os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    import torch

    if not torch.cuda.is_available():
        return {"status": "SKIP", "message": "no CUDA GPU"}
    held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    segments = torch.cuda.memory_snapshot()
    expandable = sorted({bool(segment.get("is_expandable")) for segment in segments})
    del held
    ok = expandable == [True]
    return {"status": "PASS" if ok else "FAIL", "is_expandable": expandable, "segments": len(segments),
            "message": "with both variables set, torch read PYTORCH_ALLOC_CONF (segments expandable)" if ok else
            f"segments expandable: {expandable}: torch did not read PYTORCH_ALLOC_CONF first"}


def probe_reduce_overhead_own_loss() -> dict[str, Any]:
    import torch

    import accel_widgets as aw

    steps = 8
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(1024, 64, generator=generator), torch.randint(0, 8, (1024,), generator=generator)
    items = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    workload = aw.Workload(model=own_loss_model, dataset=items, batch_size=64, name="own-loss")
    try:
        result = aw.run_burst(workload, aw.Config(compile_mode="reduce-overhead", sync_every=4), steps=steps,
                              options=aw.BurstOptions(timeout_s=40))
    except Exception as exc:
        return {"status": "FAIL", "message": f"{type(exc).__name__}: {_first_line(str(exc))}"}
    losses = [loss for loss in result.losses() if loss is not None]
    measured = losses[-steps:]
    distinct = len(set(measured)) == len(measured) == steps
    ok = result.ok and distinct
    return {"status": "PASS" if ok else "FAIL", "losses": losses,
            "message": f"{len(measured)} measured losses read 4 steps apart, {len(set(measured))} distinct"
            + ("" if result.ok else f"; status {result.status}: {result.error.message if result.error else ''}")}


def own_loss_model() -> Any:
    """A Hugging Face model's shape of call in miniature: ``model(x=..., labels=...)`` returns ``{"loss": ...}``
    (defined here, not at the top: this module imports no torch before a probe chooses to)."""
    from torch import nn

    class OwnLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            return {"loss": nn.functional.cross_entropy(self.net(x), labels)}

    return OwnLoss()


def probe_matmul_ceiling() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"status": "SKIP", "message": "no CUDA GPU"}
    a, b = (torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(MATMUL_WARMUP):
        torch.mm(a, b)
    starts, ends = ([torch.cuda.Event(enable_timing=True) for _ in range(MATMUL_TIMED)] for _ in range(2))
    for start, end in zip(starts, ends, strict=True):
        start.record()
        torch.mm(a, b)
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends, strict=True))
    median = times[len(times) // 2]
    tflops = 2 * MATMUL_N**3 / median / 1e12
    return {"status": "INFO", "tflops": tflops, "median_s": median, "device": torch.cuda.get_device_name(),
            "message": f"bf16 {MATMUL_N}^3: {tflops:.0f} TFLOP/s median of {MATMUL_TIMED} "
            f"({tflops / H200_BF16_DENSE_TFLOPS:.0%} of the H200's dense {H200_BF16_DENSE_TFLOPS:g})"}


def probe_shm_and_ram() -> dict[str, Any]:
    host_memory = sibling("_device").host_memory
    before = host_memory()
    written, shm_error = 0.0, ""
    try:
        with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="gpu-probe-") as handle:
            started = time.perf_counter()
            block = b"\0" * (64 << 20)
            for _ in range(GiB // len(block)):
                handle.write(block)
            handle.flush()
            written = time.perf_counter() - started
    except OSError as exc:
        shm_error = f"{type(exc).__name__}: {exc}"
    held = bytearray(4 * GiB)  # zero-filled: every page touched
    after = host_memory()
    del held
    grew = (after["mem_total_bytes"] or 0) - (before["mem_total_bytes"] or 0)
    shm = before["shm_total_bytes"]
    text = (f"/dev/shm {shm / GiB:.1f} GiB" if shm else "/dev/shm unreadable") + (
        f", 1 GiB written in {written:.2f} s" if not shm_error else f", 1 GiB not written ({shm_error})")
    text += f"; MemTotal {(before['mem_total_bytes'] or 0) / GiB:.1f} GiB, {grew / GiB:+.1f} GiB after 4 GiB touched"
    return {"status": "FAIL" if shm_error else "INFO", "before": before, "after": after, "shm_write_s": written,
            "message": text}


#: The probes in the order they run (the answers a burst cannot give first).
PROBES: dict[str, Callable[[], dict[str, Any]]] = {
    "is_available before import": probe_is_available_first,
    "expandable segments": probe_expandable_segments,
    "reduce-overhead own loss": probe_reduce_overhead_own_loss,
    "bf16 matmul ceiling": probe_matmul_ceiling,
    "shm and ram": probe_shm_and_ram,
}


def sibling(name: str) -> Any:
    """A script beside this one (``gpu_check``, ``_device``), imported where it is used: the probes' processes must
    choose when torch and the package are imported, and gpu_check imports both."""
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(HERE))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(HERE))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def answer(name: str) -> int:
    """Run one probe in this process and print its answer as the last line."""
    try:
        found = PROBES[name]()
    except Exception as exc:  # the probe's own failure is its answer
        found = {"status": "FAIL", "message": f"{type(exc).__name__}: {_first_line(str(exc))}"}
    print(ANSWER + json.dumps(found, default=str), flush=True)
    return 0


# -- the run: each probe in a process of its own ---------------------------------------------------------------------
def read_answer(log: str) -> dict[str, Any] | None:
    """The answer a probe's process printed last, or None when it printed none (killed, crashed)."""
    lines = [line for line in log.splitlines() if line.startswith(ANSWER)]
    return json.loads(lines[-1][len(ANSWER):]) if lines else None


def run_probe(name: str, timeout_s: float, env: dict[str, str]) -> dict[str, Any]:
    """``name`` in ``python3 gpu_probes.py --probe NAME``, its whole process group killed at ``timeout_s``: its
    answer, with how long it took and the tail of what it printed."""
    run_in_group = sibling("gpu_check").run_in_group
    with tempfile.TemporaryDirectory(prefix="gpu-probe-") as scratch:
        log_path = Path(scratch) / "probe.log"
        started = time.monotonic()
        command = [sys.executable, str(Path(__file__).resolve()), "--probe", name]
        returncode, timed_out = run_in_group(command, log_path, timeout_s, cwd=ROOT, env=env)
        log = log_path.read_text(errors="replace")
    found = read_answer(log)
    if found is None:
        why = f"no answer within {timeout_s:.0f} s (killed)" if timed_out else f"exited {returncode} without an answer"
        found = {"status": "FAIL", "message": why}
    return {**found, "seconds": round(time.monotonic() - started, 1), "output_tail": log[-LOG_TAIL_CHARS:]}


def child_environment() -> dict[str, str]:
    """The probes' processes get this process's environment as it was started (a user's), without the switch this
    planner sets for itself, and with the package on their path."""
    env = dict(os.environ)
    if env.pop("_GPU_PROBES_SET_PRESTART", None):
        env.pop("ACCEL_WIDGETS_PRESTART", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def plan() -> list[Any]:
    work = sibling("gpu_check").Work
    return [work(name, "checks", H200_SECONDS[name][0], min(H200_SECONDS[name][0], H200_SECONDS[name][1]),
                 H200_SECONDS[name][1]) for name in PROBES]


def planned_total_s() -> float:
    """What the probes should take on an H200, start included: where gpu_modern.py's plan begins in the run."""
    return sum(planned for planned, _ in H200_SECONDS.values())


def dry_run(args: argparse.Namespace) -> int:
    check = sibling("gpu_check")
    Budget, PlannedClock, execute, plan_verdict = check.Budget, check.PlannedClock, check.execute, check.plan_verdict
    clock = PlannedClock(H200_SECONDS["start"][0])
    budget = Budget(args.budget_s, clock=clock, started=0.0)
    works = plan()

    def simulate(work: Any, timeout: float) -> str:
        clock.advance(min(work.planned_s, timeout))
        return "PLANNED" if work.planned_s <= timeout else "CUT"

    print(f"gpu_probes plan (dry run) for one H200: budget {args.budget_s:.0f} s of the second run's "
          f"{CALL_LIMIT_S - CALL_RESERVE_S:.0f} s, each probe in its own process")
    print(f"{'start s':>8} {'planned':>8} {'timeout':>8}  {'probe':<28} status")
    steps = execute(works, budget, simulate, on_step=lambda step: print(
        f"{step.start_s:>8.0f} {step.work.planned_s:>8.0f} "
        f"{'-' if step.timeout_s is None else f'{step.timeout_s:.0f}':>8}  {step.work.name:<28} "
        f"{step.status if step.status != 'SKIP' else step.why}"))
    skipped = [step.work.name for step in steps if step.status != "PLANNED"]
    code = plan_verdict(works, steps, [], budget, args.budget_s, CALL_LIMIT_S, H200_SECONDS["start"][0])
    return 1 if skipped else code


def output_path() -> Path:
    folder = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results"
    return folder / "gpu_probes.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="the probes' budget, counted from --call-start (default %(default)s s)")
    parser.add_argument("--call-start", type=float, default=None,
                        help="when the device call started (seconds since the epoch; default: this process's start)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan for an H200 and exit")
    parser.add_argument("--probe", choices=tuple(PROBES), help="run one probe in this process (how the run calls it)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe:
        return answer(args.probe)
    if "ACCEL_WIDGETS_PRESTART" not in os.environ:  # this planner runs no burst: no forkserver for it
        os.environ["ACCEL_WIDGETS_PRESTART"] = "0"
        os.environ["_GPU_PROBES_SET_PRESTART"] = "1"
    if args.dry_run:
        return dry_run(args)
    import psutil

    check = sibling("gpu_check")
    Budget, Report, execute = check.Budget, check.Report, check.execute
    started = args.call_start if args.call_start is not None else psutil.Process().create_time()
    budget = Budget(args.budget_s, started=started)
    report = Report(output_path(), {"benchmark": "gpu_probes", "started": dt.datetime.now(dt.timezone.utc).isoformat(
        timespec="seconds"), "budget_s": args.budget_s, "planned_s": H200_SECONDS}, budget)
    report.data["probes"] = {}
    report.save()
    env = child_environment()

    def run(work: Any, timeout: float) -> str:
        found = run_probe(work.name, timeout, env)
        report.data["probes"][work.name] = found
        report.check(work.name, found["status"], found.get("message", ""))
        return found["status"]

    execute(plan(), budget, run, on_step=report.step)
    report.save()
    print(f"{'FAIL' if report.failed else 'DONE'}  probes in {budget.elapsed():.0f} s; wrote {report.path}", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
