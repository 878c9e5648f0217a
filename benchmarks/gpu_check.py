"""The project's GPU check: one script, under 8 minutes on one GPU, run whenever a session has a GPU.

1. runs the GPU-marked tests (CUDA events, NVML telemetry, pin_memory, fp16 + GradScaler, memory cap);
2. runs the demo workloads at GPU size through the classic ladder baseline -> +loader -> +bf16 ->
   +compile -> +rest, each rung a time-bounded burst, and prints each ratio next to the hand-measured
   H200 reference (torch 2.11): image 1.0 1.4 4.1 7.3 10.3x, LM 1.0 1.0 4.8 6.3 7.2x;
3. writes everything as JSON (``$OUT/gpu_check.json`` when ``$OUT`` is set, else ``benchmarks/results/``).

    python benchmarks/gpu_check.py [--seconds 6] [--budget-s 420] [--workloads image,lm,mlp] [--size gpu]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REFERENCE = {"image": [1.0, 1.4, 4.1, 7.3, 10.3], "lm": [1.0, 1.0, 4.8, 6.3, 7.2]}
ROOT = Path(__file__).resolve().parent.parent


def run_gpu_tests(timeout_s: float) -> dict[str, Any]:
    """The marked GPU tests, in their own process so a CUDA failure cannot take this script down."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", str(ROOT / "tests")]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        tail, code = (done.stdout + done.stderr)[-4000:], done.returncode
    except subprocess.TimeoutExpired as exc:
        tail, code = f"timed out after {timeout_s:g} s\n{exc.stdout or ''}"[-4000:], -1
    print(tail[-1500:], flush=True)
    return {"returncode": code, "seconds": round(time.perf_counter() - started, 1), "output_tail": tail}


def run_ladders(names: list[str], size: str, seconds: float, budget_s: float) -> list[dict[str, Any]]:
    import accel_widgets as aw
    from accel_widgets.reporting import comparison_rows, format_table

    deadline = time.perf_counter() + budget_s
    results: list[aw.BurstResult] = []
    skipped: list[str] = []
    for name in names:
        workload = aw.demo_workload(name, size=size)
        for rung in aw.classic_ladder(workload):
            if time.perf_counter() > deadline:
                skipped.append(f"{workload.name} {rung.name}")
                continue
            try:
                result = aw.run_burst(workload, rung.config, seconds=seconds, label=rung.name, timeout_s=300)
            except aw.BurstError as exc:
                result = exc.result
            results.append(result)
            print(f"{workload.name:<10} {rung.name:<9} {result.samples_per_s or 0:12,.1f} samples/s "
                  f"{result.status}", flush=True)
    rows = comparison_rows(results)
    print("\n" + format_table(rows), flush=True)
    _print_against_reference(rows)
    if skipped:
        print(f"skipped (budget): {', '.join(skipped)}")
    return [r.to_dict() for r in results]


def _print_against_reference(rows: list[dict[str, Any]]) -> None:
    for name, reference in REFERENCE.items():
        measured = [r["speedup"] for r in rows if r["workload"].startswith(name)]
        if measured:
            pairs = ", ".join(f"{m or 0:.1f}x (ref {ref:.1f}x)" for m, ref in zip(measured, reference, strict=False))
            print(f"{name}: {pairs}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="image,lm,mlp")
    parser.add_argument("--size", default="gpu", choices=("small", "gpu"))
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per burst")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new bursts after this")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    import torch

    from accel_widgets import probe_device

    device = probe_device()
    print(f"GPU check on {device.name} ({len(device.gpus)} GPUs, driver {device.driver}), torch {torch.__version__}",
          flush=True)
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": device.name,
        "gpus": [g.name for g in device.gpus],
        "driver": device.driver,
        "cpu_count": device.cpu_count,
    }
    if not args.skip_tests:
        report["gpu_tests"] = run_gpu_tests(timeout_s=150)
    report["ladder"] = run_ladders(args.workloads.split(","), args.size, args.seconds, args.budget_s)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "gpu_check.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
